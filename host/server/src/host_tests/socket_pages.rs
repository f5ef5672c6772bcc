//! The `/api/v1/socket` upgrade and the pages' session ([`Pages::socket_bearer`]): a browser's
//! WebSocket cannot set `Authorization`, so the pages may name the bearer their own session
//! carries (the dashboard's HttpOnly cookie); the upgrade then goes on as if the request had
//! stated it. Tested with a stand-in hook reading a test header, against a real listener.

use crate::api::{Pages, router};
use crate::state::test_state;
use axum::http::HeaderMap;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const PASSWORD: &str = "a-long-enough-admin-password";
const PATIENCE: Duration = Duration::from_secs(20);

/// The stand-in for the dashboard's cookie: the `x-test-session` header.
fn test_session(_public_origin: &str, headers: &HeaderMap) -> Option<String> {
    headers.get("x-test-session").and_then(|v| v.to_str().ok()).map(str::to_string)
}

async fn serve() -> (tempfile::TempDir, SocketAddr, String) {
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path()).await;
    crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
    let token = state.auth.login("admin", PASSWORD, None).await.unwrap().token;
    let pages = Pages { socket_bearer: test_session, ..Pages::none() };
    let addr = super::socket::listen(router(state, pages)).await;
    (dir, addr, token)
}

/// Upgrade with `headers`, offer a dashboard session without a token; the first frame back.
async fn offer(addr: SocketAddr, headers: &[(&'static str, &str)]) -> (Ws, Value) {
    let mut request = format!("ws://{addr}/api/v1/socket").into_client_request().unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(*name, value.parse().unwrap());
    }
    let mut ws = tokio_tungstenite::connect_async(request).await.unwrap().0;
    let offer = json!({ "type": "offer", "kind": "dashboard", "protocols": ["capstan-socket/1"] });
    ws.send(Message::text(offer.to_string())).await.unwrap();
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.expect("a frame in time").expect("a frame").unwrap() {
            Message::Text(text) => return (ws, serde_json::from_str(text.as_str()).unwrap()),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_pages_session_is_the_upgrades_bearer_when_it_states_none() {
    let (_dir, addr, token) = serve().await;
    // the pages' session authenticates the session, and its calls
    let (mut ws, welcome) = offer(addr, &[("x-test-session", &token)]).await;
    assert_eq!((welcome["type"].as_str(), welcome["identity"]["username"].as_str()), (Some("welcome"), Some("admin")), "{welcome}");
    let call = json!({ "type": "call", "id": 1, "method": "events.head", "body": {} });
    ws.send(Message::text(call.to_string())).await.unwrap();
    let answer = loop {
        if let Message::Text(text) = ws.next().await.unwrap().unwrap() {
            break serde_json::from_str::<Value>(text.as_str()).unwrap();
        }
    };
    assert_eq!((answer["type"].as_str(), answer["result"]["head"].is_u64()), (Some("result"), true), "{answer}");

    // none: an anonymous session, as before
    let (_ws, welcome) = offer(addr, &[]).await;
    assert_eq!((welcome["type"].as_str(), welcome["identity"].is_null()), (Some("welcome"), true), "{welcome}");

    // an Authorization the request states wins: the pages' bearer is not looked at
    let bearer = format!("Bearer {token}");
    let (_ws, welcome) = offer(addr, &[("x-test-session", "not-a-jwt"), ("authorization", &bearer)]).await;
    assert_eq!(welcome["identity"]["username"], "admin", "{welcome}");

    // a pages' bearer that does not authenticate is refused as any header bearer is
    let (_ws, refused) = offer(addr, &[("x-test-session", "not-a-jwt")]).await;
    assert_eq!((refused["type"].as_str(), refused["error"]["code"].as_str()), (Some("error"), Some("unauthenticated")), "{refused}");
}
