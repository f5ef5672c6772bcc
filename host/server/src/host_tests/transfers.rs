//! `PUT`/`GET /api/v1/transfers/<id>` through the router, in process: a ticket minted as the
//! `transfers` import mints it, presented as an agent presents it.

use crate::api::{Pages, router};
use crate::plugins::transfers::{self, Direction};
use crate::state::{AppState, test_state};
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::time::Duration;
use tower::ServiceExt;

const KEY: &str = "plugins/backups/backups/b1/volumes.tar.gz";

struct Reply {
    status: StatusCode,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    fn code(&self) -> String {
        self.json()["error"]["code"].as_str().unwrap_or_default().to_string()
    }
}

async fn send(state: &AppState, request: Request<Body>) -> Reply {
    let response = router(state.clone(), Pages::none()).oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap().to_vec();
    Reply { status, body }
}

async fn ticket(state: &AppState, direction: Direction, max_bytes: u64) -> transfers::Minted {
    let minted = transfers::mint(&state.store, "backups", KEY, direction, max_bytes, Duration::from_secs(60), transfers::now_ms()).await;
    minted.unwrap()
}

fn put(id: &str, token: &str, body: Vec<u8>) -> Request<Body> {
    Request::put(format!("/api/v1/transfers/{id}")).header(header::AUTHORIZATION, format!("Bearer {token}")).body(Body::from(body)).unwrap()
}

fn get(id: &str, token: &str) -> Request<Body> {
    Request::get(format!("/api/v1/transfers/{id}")).header(header::AUTHORIZATION, format!("Bearer {token}")).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn an_upload_ticket_creates_its_key_once_and_a_download_ticket_reads_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path()).await;
    let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();

    let up = ticket(&state, Direction::Upload, 1 << 20).await;
    let wrong = send(&state, put(&up.id, "ctt_wrong", bytes.clone())).await;
    assert_eq!((wrong.status, wrong.code()), (StatusCode::FORBIDDEN, "transfer-ticket-invalid".to_string()));
    assert!(!String::from_utf8_lossy(&wrong.body).contains(&up.token));
    let missing = send(&state, Request::put(format!("/api/v1/transfers/{}", up.id)).body(Body::from("x")).unwrap()).await;
    assert_eq!(missing.code(), "transfer-ticket-invalid", "no bearer: the same answer");

    // a wrong token does not use the ticket up
    let stored = send(&state, put(&up.id, &up.token, bytes.clone())).await;
    assert_eq!(stored.status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&stored.body));
    let answer = stored.json();
    assert_eq!(answer["key"], "backups/b1/volumes.tar.gz", "relative to the plugin's prefix: {answer}");
    assert_eq!(answer["size"], bytes.len() as u64);
    assert_eq!(answer["sha256"], hex::encode(Sha256::digest(&bytes)));
    assert_eq!(state.blobs.get_bytes(KEY).await.unwrap().unwrap().1, bytes);

    let again = send(&state, put(&up.id, &up.token, b"other".to_vec())).await;
    assert_eq!((again.status, again.code()), (StatusCode::FORBIDDEN, "transfer-ticket-used".to_string()));
    let as_download = send(&state, get(&up.id, &up.token)).await;
    assert_eq!(as_download.code(), "transfer-ticket-invalid", "an upload ticket reads nothing");

    // an existing key is not overwritten
    let second = ticket(&state, Direction::Upload, 1 << 20).await;
    let exists = send(&state, put(&second.id, &second.token, b"replacement".to_vec())).await;
    assert_eq!((exists.status, exists.code()), (StatusCode::CONFLICT, "exists".to_string()));
    assert_eq!(state.blobs.get_bytes(KEY).await.unwrap().unwrap().1, bytes);

    let down = ticket(&state, Direction::Download, 0).await;
    let read = send(&state, get(&down.id, &down.token)).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.body, bytes);
    assert_eq!(send(&state, get(&down.id, &down.token)).await.code(), "transfer-ticket-used");
}

#[tokio::test]
async fn an_upload_past_its_limit_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = test_state(dir.path()).await;
    let up = ticket(&state, Direction::Upload, 1000).await;
    let declared = send(&state, put(&up.id, &up.token, vec![7; 1001])).await;
    assert_eq!((declared.status, declared.code()), (StatusCode::PAYLOAD_TOO_LARGE, "transfer-too-large".to_string()));
    assert!(state.blobs.head(KEY).await.unwrap().is_none());

    // without a content-length, the limit holds as the body streams
    let streamed = ticket(&state, Direction::Upload, 1000).await;
    let chunks = futures::stream::iter((0..4).map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![1u8; 400]))));
    let request = Request::put(format!("/api/v1/transfers/{}", streamed.id))
        .header(header::AUTHORIZATION, format!("Bearer {}", streamed.token))
        .body(Body::from_stream(chunks))
        .unwrap();
    let refused = send(&state, request).await;
    assert_eq!((refused.status, refused.code()), (StatusCode::PAYLOAD_TOO_LARGE, "transfer-too-large".to_string()));
    assert!(state.blobs.head(KEY).await.unwrap().is_none(), "nothing of it is stored");

    let down = ticket(&state, Direction::Download, 0).await;
    let gone = send(&state, get(&down.id, &down.token)).await;
    assert_eq!((gone.status, gone.code()), (StatusCode::NOT_FOUND, "transfer-object-missing".to_string()));
}
