//! `/api/v1/socket` against a real listener on 127.0.0.1, with a real WebSocket client
//! (tokio-tungstenite): the offer and its refusals, calls answered as HTTP answers them, the
//! bounds (frames, calls in flight, a slow reader, a silent peer) and pushes.

use crate::api::{Pages, Registry, router};
use crate::listener::TrustedProxies;
use crate::sessions::{Kind, Limits, Target};
use crate::state::{AppState, test_state};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

pub(super) type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub(super) const PASSWORD: &str = "a-long-enough-admin-password";
/// How long a test waits for something that should happen at once (liveness, not speed).
const PATIENCE: Duration = Duration::from_secs(20);

pub(super) struct Server {
    pub(super) _dir: tempfile::TempDir,
    pub(super) state: AppState,
    pub(super) addr: SocketAddr,
    pub(super) token: String,
}

/// A host with an administrator, serving on 127.0.0.1; `adjust` may change its limits or methods.
pub(super) async fn serve(adjust: impl FnOnce(&mut AppState)) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let mut state = test_state(dir.path()).await;
    crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
    let token = state.auth.login("admin", PASSWORD, None).await.unwrap().token;
    adjust(&mut state);
    let addr = listen(router(state.clone(), Pages::none())).await;
    Server { _dir: dir, state, addr, token }
}

/// Serve `app` on a real listener on 127.0.0.1 (the default bounds); its address.
pub(super) async fn listen(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bounds = crate::listener::Bounds::new(64, crate::bodies::DEFAULT_INFLIGHT_BODY_BYTES);
    tokio::spawn(crate::listener::serve(listener, app, bounds, TrustedProxies::default(), std::future::pending::<()>()));
    addr
}

pub(super) fn limits(adjust: impl FnOnce(&mut Limits)) -> impl FnOnce(&mut AppState) {
    move |state: &mut AppState| {
        let mut limits = state.sockets.limits().clone();
        adjust(&mut limits);
        state.sockets = Arc::new(crate::sessions::Hub::new(limits));
    }
}

pub(super) async fn connect(addr: SocketAddr, bearer: Option<&str>) -> Ws {
    let mut request = format!("ws://{addr}/api/v1/socket").into_client_request().unwrap();
    if let Some(bearer) = bearer {
        request.headers_mut().insert("authorization", format!("Bearer {bearer}").parse().unwrap());
    }
    tokio_tungstenite::connect_async(request).await.unwrap().0
}

pub(super) async fn send(ws: &mut Ws, frame: Value) {
    ws.send(Message::text(frame.to_string())).await.unwrap();
}

/// The next text frame, as JSON (pings and pongs skipped).
pub(super) async fn next(ws: &mut Ws) -> Value {
    loop {
        let message = tokio::time::timeout(PATIENCE, ws.next()).await.expect("a frame in time").expect("the session is open").unwrap();
        match message {
            Message::Text(text) => return serde_json::from_str(text.as_str()).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// The close code the session ends with (reading past any frames still on the way); `None`
/// when the connection ended without a close frame.
pub(super) async fn closed_with(ws: &mut Ws) -> Option<(u16, String)> {
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.expect("the session ends in time") {
            Some(Ok(Message::Close(frame))) => return frame.map(|f| (u16::from(f.code), f.reason.as_str().to_string())),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return None,
        }
    }
}

/// Open a session of `kind` (with `token` in the offer); its welcome.
pub(super) async fn open(addr: SocketAddr, kind: &str, token: Option<&str>) -> (Ws, Value) {
    let mut ws = connect(addr, None).await;
    let mut offer = json!({ "type": "offer", "kind": kind, "protocols": ["capstan-socket/1"] });
    if let Some(token) = token {
        offer["token"] = json!(token);
    }
    send(&mut ws, offer).await;
    let welcome = next(&mut ws).await;
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    (ws, welcome)
}

pub(super) async fn call(ws: &mut Ws, id: u64, method: &str, body: Value) -> Value {
    send(ws, json!({ "type": "call", "id": id, "method": method, "body": body })).await;
    let answer = next(ws).await;
    assert_eq!(answer["id"], id, "{answer}");
    answer
}

/// `POST /api/v1/<method>` on the same host: its status and JSON body.
async fn http(addr: SocketAddr, method: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .post(format!("http://{addr}/api/v1/{method}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let reply = request.send().await.unwrap();
    let status = reply.status().as_u16();
    (status, serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap())
}

pub(super) async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what} did not happen in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_offer_is_welcomed_and_calls_answer_exactly_as_http_does() {
    let s = serve(|_| {}).await;
    // anonymous: public methods only, and every other one refused as HTTP refuses it
    let (mut anonymous, welcome) = open(s.addr, "dashboard", None).await;
    assert_eq!(welcome["protocol"], "capstan-socket/1");
    assert_eq!(welcome["kind"], "dashboard");
    assert!(welcome["identity"].is_null() && welcome["sessionId"].as_str().unwrap().starts_with("socket"), "{welcome}");
    assert_eq!(welcome["limits"]["maxInFlight"], 16);
    let refused = call(&mut anonymous, 1, "clusters.list", json!({})).await;
    let (status, over_http) = http(s.addr, "clusters.list", None, json!({})).await;
    assert_eq!((status, refused["type"].as_str()), (401, Some("error")));
    assert_eq!(refused["error"], over_http["error"], "the same refusal, field for field");
    assert_eq!(refused["error"]["code"], "unauthenticated");
    assert_eq!(refused["requestId"].as_str().unwrap().len(), 32);
    // a public method serves an anonymous session: a wrong password is refused as on HTTP
    let login = call(&mut anonymous, 2, "auth.login", json!({ "username": "admin", "password": "wrong-password-here" })).await;
    let (_, over_http) = http(s.addr, "auth.login", None, json!({ "username": "admin", "password": "wrong-password-here" })).await;
    assert_eq!(login["error"], over_http["error"]);

    // the token in the offer
    let (mut admin, welcome) = open(s.addr, "cli", Some(&s.token)).await;
    assert_eq!(welcome["identity"]["username"], "admin");
    assert_eq!(welcome["identity"]["admin"], true);
    let created = call(&mut admin, 1, "clusters.create", json!({ "name": "prod" })).await;
    assert_eq!(created["type"], "result", "{created}");
    let listed = call(&mut admin, 2, "clusters.list", json!({})).await;
    let (status, over_http) = http(s.addr, "clusters.list", Some(&s.token), json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(listed["result"], over_http, "the same answer");
    assert_eq!(listed["result"]["items"][0]["id"], created["result"]["cluster"]["id"]);
    // body validation, unknown methods: the same refusals
    for (method, body) in [
        ("clusters.create", json!({ "name": "x", "bogus": 1 })),
        ("clusters.create", json!([1, 2])),
        ("nothing.here", json!({})),
        ("clusters.create", json!({ "name": "prod" })),
    ] {
        let refused = call(&mut admin, 3, method, body.clone()).await;
        let (status, over_http) = http(s.addr, method, Some(&s.token), body).await;
        assert!(status >= 400, "{over_http}");
        assert_eq!(refused["type"], "error");
        assert_eq!(refused["error"], over_http["error"], "{method}");
    }
    // a missing body is `{}`, as an empty HTTP body is
    let whoami = {
        send(&mut admin, json!({ "type": "call", "id": "w", "method": "auth.whoami" })).await;
        next(&mut admin).await
    };
    assert_eq!(whoami["result"]["username"], "admin", "{whoami}");

    // the token in the upgrade's Authorization header
    let mut by_header = connect(s.addr, Some(&s.token)).await;
    send(&mut by_header, json!({ "type": "offer", "kind": "agent", "protocols": ["capstan-socket/2", "capstan-socket/1"] })).await;
    let welcome = next(&mut by_header).await;
    assert_eq!((welcome["protocol"].as_str(), welcome["identity"]["username"].as_str()), (Some("capstan-socket/1"), Some("admin")));

    // a session's calls stop authenticating with its token: refused as HTTP refuses them
    let out = call(&mut admin, 4, "auth.logout", json!({})).await;
    assert_eq!(out["type"], "result", "{out}");
    let refused = call(&mut admin, 5, "clusters.list", json!({})).await;
    let (_, over_http) = http(s.addr, "clusters.list", Some(&s.token), json!({})).await;
    assert_eq!(refused["error"], over_http["error"]);
    assert_eq!(refused["error"]["code"], "unauthenticated");
}

#[tokio::test]
async fn offers_are_refused_by_name_and_the_session_closed() {
    let s = serve(|_| {}).await;
    let cases = [
        (json!({ "type": "offer", "kind": "cli", "protocols": ["capstan-socket/9"] }), "protocol-unsupported", 4001),
        (json!({ "type": "offer", "kind": "toaster", "protocols": ["capstan-socket/1"] }), "session-kind-unknown", 4002),
        (json!({ "type": "offer", "kind": "relay", "protocols": ["capstan-socket/1"] }), "unauthenticated", 4003),
        (json!({ "type": "offer", "kind": "cli", "protocols": ["capstan-socket/1"], "token": "not-a-jwt" }), "unauthenticated", 4003),
        (json!({ "type": "call", "id": 1, "method": "auth.whoami" }), "offer-invalid", 4000),
        (json!({ "type": "offer", "kind": "cli", "protocols": ["capstan-socket/1"], "extra": 1 }), "offer-invalid", 4000),
    ];
    for (offer, code, close) in cases {
        let mut ws = connect(s.addr, None).await;
        send(&mut ws, offer.clone()).await;
        let refused = next(&mut ws).await;
        assert_eq!((refused["type"].as_str(), refused["id"].clone()), (Some("error"), Value::Null), "{refused}");
        assert_eq!(refused["error"]["code"], code, "{offer}");
        assert_eq!(closed_with(&mut ws).await, Some((close, code.to_string())), "{offer}");
        if code == "protocol-unsupported" {
            assert_eq!(refused["error"]["data"]["spoken"], json!(["capstan-socket/1"]));
            assert_eq!(refused["error"]["data"]["offered"], json!(["capstan-socket/9"]));
        }
    }
    // GET without the handshake: the error envelope
    let reply = reqwest::get(format!("http://{}/api/v1/socket", s.addr)).await.unwrap();
    let body: Value = serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "upgrade-required");
    assert!(s.state.sockets.is_empty(), "a refused offer opens no session");
}

#[tokio::test]
async fn frames_are_bounded_and_a_malformed_or_stale_frame_is_refused_by_name() {
    let s = serve(limits(|l| l.max_frame_bytes = 4096)).await;
    let (mut ws, welcome) = open(s.addr, "cli", Some(&s.token)).await;
    assert_eq!(welcome["limits"]["maxFrameBytes"], 4096);
    let refusals: [(Message, &str, Value); 6] = [
        (Message::text("not json"), "frame-malformed", Value::Null),
        (Message::binary(vec![1u8, 2, 3]), "frame-malformed", Value::Null),
        (Message::text(json!({ "type": "offer", "id": 7, "kind": "cli", "protocols": [] }).to_string()), "frame-unexpected", json!(7)),
        (Message::text(json!({ "type": "result", "id": "r", "result": {} }).to_string()), "frame-unexpected", json!("r")),
        (Message::text(json!({ "type": "call", "id": 8 }).to_string()), "frame-malformed", json!(8)),
        (Message::text(json!({ "type": "call", "id": 9, "method": "auth.whoami", "extra": 1 }).to_string()), "frame-malformed", json!(9)),
    ];
    for (frame, code, id) in refusals {
        ws.send(frame).await.unwrap();
        let refused = next(&mut ws).await;
        assert_eq!((refused["type"].as_str(), refused["error"]["code"].as_str(), &refused["id"]), (Some("error"), Some(code), &id));
    }
    // the session still works
    assert_eq!(call(&mut ws, 10, "auth.whoami", json!({})).await["result"]["username"], "admin");
    // a frame over the limit: refused by name, closed with 1009
    let big = json!({ "type": "call", "id": 11, "method": "auth.whoami", "body": { "pad": "x".repeat(8192) } });
    send(&mut ws, big).await;
    let refused = next(&mut ws).await;
    assert_eq!(refused["error"]["code"], "frame-too-large", "{refused}");
    assert_eq!(refused["error"]["data"]["limitBytes"], 4096);
    assert_eq!(closed_with(&mut ws).await, Some((1009, "frame-too-large".into())));
    // an oversized first frame too
    let mut ws = connect(s.addr, None).await;
    ws.send(Message::text("x".repeat(8192))).await.unwrap();
    assert_eq!(next(&mut ws).await["error"]["code"], "frame-too-large");
    assert_eq!(closed_with(&mut ws).await, Some((1009, "frame-too-large".into())));
}

#[tokio::test]
async fn a_session_runs_a_bounded_number_of_calls_at_once() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let s = serve(move |state| {
        let mut registry = Registry::default();
        registry.add("test.hold", "waits for the test", crate::api::Access::Public, move |_, _: Value| {
            let gate = held.clone();
            async move {
                gate.acquire().await.unwrap().forget();
                Ok(json!("released"))
            }
        });
        registry.add("test.echo", "answers at once", crate::api::Access::Public, |_, body: Value| async move { Ok(body) });
        state.methods = Arc::new(registry);
        limits(|l| l.max_in_flight = 2)(state);
    })
    .await;
    let (mut ws, _) = open(s.addr, "dashboard", None).await;
    for id in [1, 2, 3] {
        send(&mut ws, json!({ "type": "call", "id": id, "method": "test.hold" })).await;
    }
    let refused = next(&mut ws).await;
    assert_eq!((refused["id"].clone(), refused["error"]["code"].as_str()), (json!(3), Some("too-many-requests-in-flight")), "{refused}");
    assert_eq!((refused["error"]["retryable"].as_bool(), refused["error"]["data"]["limit"].as_u64()), (Some(true), Some(2)));
    // an id still running is not reused
    send(&mut ws, json!({ "type": "call", "id": 1, "method": "test.echo" })).await;
    assert_eq!(next(&mut ws).await["error"]["code"], "call-id-in-use");
    gate.add_permits(2);
    let answered = [next(&mut ws).await, next(&mut ws).await];
    let mut ids: Vec<u64> = answered.iter().map(|a| a["id"].as_u64().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, [1, 2]);
    for a in &answered {
        assert_eq!(a["result"], "released", "{a}");
    }
    // room again, and the ids free
    assert_eq!(call(&mut ws, 1, "test.echo", json!({ "n": 1 })).await["result"], json!({ "n": 1 }));
}

#[tokio::test]
async fn a_slow_reader_is_dropped_while_another_session_keeps_working_and_receives_pushes() {
    let s = serve(limits(|l| l.outbound_queue = 4)).await;
    let (mut slow, welcome) = open(s.addr, "agent", Some(&s.token)).await;
    let slow_id = welcome["sessionId"].as_str().unwrap().to_string();
    let (mut reader, welcome) = open(s.addr, "cli", Some(&s.token)).await;
    let reader_id = welcome["sessionId"].as_str().unwrap().to_string();
    // the slow session reads nothing while pushes pile up for it: once its queue is full it is
    // dropped, never buffered for
    let body = json!({ "pad": "p".repeat(64 * 1024) });
    let mut dropped = false;
    for _ in 0..10_000 {
        let delivery = s.state.sockets.push(Target::Session(&slow_id), "test.flood", &body);
        if delivery.dropped == 1 {
            dropped = true;
            break;
        }
        assert_eq!(delivery.queued, 1);
    }
    assert!(dropped, "a full queue drops the session");
    wait_until("the slow session closes", || !s.state.sockets.is_open(&slow_id)).await;
    // the other session is untouched: it calls, and receives pushes addressed to it by kind,
    // by user and by session
    assert!(s.state.sockets.is_open(&reader_id));
    assert_eq!(call(&mut reader, 1, "auth.whoami", json!({})).await["result"]["username"], "admin");
    let delivery = s.state.sockets.push(Target::Kind(Kind::Cli), "test.topic", &json!({ "n": 1 }));
    assert_eq!((delivery.queued, delivery.dropped), (1, 0));
    assert_eq!(next(&mut reader).await, json!({ "type": "push", "topic": "test.topic", "body": { "n": 1 } }));
    let admin = s.state.auth.authenticate(&s.token).await.unwrap();
    assert_eq!(s.state.sockets.push(Target::User(&admin.user_id), "test.user", &json!(2)).queued, 1);
    assert_eq!(next(&mut reader).await["topic"], "test.user");
    assert_eq!(s.state.sockets.push(Target::Session(&reader_id), "test.session", &json!(3)).queued, 1);
    assert_eq!(next(&mut reader).await["body"], 3);
    assert_eq!(s.state.sockets.push(Target::Kind(Kind::Relay), "test.none", &json!(4)).queued, 0);
    // the dropped peer, reading at last, finds its session ended (with 4008 when the close
    // frame got through the full buffers)
    if let Some((code, reason)) = closed_with(&mut slow).await {
        assert_eq!((code, reason.as_str()), (4008, "slow-reader"));
    }
}

#[tokio::test]
async fn a_silent_peer_is_closed_and_a_live_one_is_kept() {
    let s = serve(limits(|l| {
        l.ping_interval = Duration::from_millis(50);
        l.silence_timeout = Duration::from_millis(600);
    }))
    .await;
    let (mut silent, welcome) = open(s.addr, "agent", Some(&s.token)).await;
    let silent_id = welcome["sessionId"].as_str().unwrap().to_string();
    let (live, welcome) = open(s.addr, "dashboard", None).await;
    let live_id = welcome["sessionId"].as_str().unwrap().to_string();
    // the live peer reads all the time, so its client answers every ping
    let (mut live_sink, mut live_stream) = live.split();
    let (frames_tx, mut frames) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = live_stream.next().await {
            if let Message::Text(text) = message {
                let _ = frames_tx.send(serde_json::from_str::<Value>(text.as_str()).unwrap());
            }
        }
    });
    // the silent one reads nothing, so it answers no ping: closed
    wait_until("the silent session closes", || !s.state.sockets.is_open(&silent_id)).await;
    assert_eq!(closed_with(&mut silent).await, Some((4009, "ping-timeout".into())));
    assert!(s.state.sockets.is_open(&live_id), "a peer that answers pings stays");
    live_sink.send(Message::text(json!({ "type": "call", "id": 1, "method": "auth.whoami" }).to_string())).await.unwrap();
    let answer = tokio::time::timeout(PATIENCE, frames.recv()).await.unwrap().unwrap();
    assert_eq!((answer["id"].clone(), answer["error"]["code"].as_str()), (json!(1), Some("unauthenticated")));
}

#[tokio::test]
async fn sessions_are_bounded_per_host() {
    let s = serve(limits(|l| l.max_sessions = 1)).await;
    let (first, _) = open(s.addr, "cli", Some(&s.token)).await;
    // the people's one slot is taken: an upgrade with a person's bearer is refused by name
    let mut request = format!("ws://{}/api/v1/socket", s.addr).into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {}", s.token).parse().unwrap());
    let refused = tokio_tungstenite::connect_async(request).await.unwrap_err();
    let tokio_tungstenite::tungstenite::Error::Http(response) = refused else { panic!("an HTTP refusal, got {refused:?}") };
    assert_eq!(response.status().as_u16(), 503);
    let body: Value = serde_json::from_slice(response.body().as_deref().unwrap()).unwrap();
    assert_eq!((body["error"]["code"].as_str(), body["error"]["data"]["pool"].as_str()), (Some("too-many-sessions"), Some("person")));
    // and a stranger whose offer names a person is closed by name: that pool is full
    let mut moving = connect(s.addr, None).await;
    send(&mut moving, json!({ "type": "offer", "kind": "cli", "protocols": ["capstan-socket/1"], "token": s.token })).await;
    assert_eq!(closed_with(&mut moving).await, Some((1013, "too-many-sessions".into())));
    // a session that ends gives its slot back
    drop(first);
    wait_until("the first session ends", || s.state.sockets.is_empty()).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut request = format!("ws://{}/api/v1/socket", s.addr).into_client_request().unwrap();
        request.headers_mut().insert("authorization", format!("Bearer {}", s.token).parse().unwrap());
        if let Ok((mut ws, _)) = tokio_tungstenite::connect_async(request).await {
            send(&mut ws, json!({ "type": "offer", "kind": "cli", "protocols": ["capstan-socket/1"] })).await;
            assert_eq!(next(&mut ws).await["type"], "welcome");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the slot came back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The refusal of an upgrade, read from its HTTP answer.
async fn refused_upgrade(addr: SocketAddr) -> (u16, Value) {
    let refused = tokio_tungstenite::connect_async(format!("ws://{addr}/api/v1/socket")).await.unwrap_err();
    let tokio_tungstenite::tungstenite::Error::Http(response) = refused else { panic!("an HTTP refusal, got {refused:?}") };
    (response.status().as_u16(), serde_json::from_slice(response.body().as_deref().unwrap()).unwrap())
}

#[tokio::test]
async fn strangers_have_a_small_pool_of_their_own_and_an_offer_deadline() {
    let s = serve(limits(|l| {
        l.max_stranger_sessions = 2;
        l.offer_timeout = Duration::from_millis(800);
    }))
    .await;
    // two strangers upgrade and send nothing: their pool is full
    let mut silent = connect(s.addr, None).await;
    let (_anonymous, _) = open(s.addr, "cli", None).await;
    let (status, body) = refused_upgrade(s.addr).await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("too-many-sessions")), "{body}");
    assert_eq!(body["error"]["data"]["pool"], "stranger", "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
    // a person whose bearer rides on the upgrade is not kept out by them
    let mut person = connect(s.addr, Some(&s.token)).await;
    send(&mut person, json!({ "type": "offer", "kind": "cli", "protocols": ["capstan-socket/1"] })).await;
    assert_eq!(next(&mut person).await["type"], "welcome");
    // nor is one whose token comes only in the offer, once a stranger's slot is free: the
    // session moves to the people's pool and gives the stranger's slot back
    assert_eq!(closed_with(&mut silent).await, Some((4004, "offer-timeout".into())), "no offer within the deadline closes it");
    let mut offered = upgrade_eventually(s.addr).await;
    send(&mut offered, json!({ "type": "offer", "kind": "cli", "protocols": ["capstan-socket/1"], "token": s.token })).await;
    assert_eq!(next(&mut offered).await["identity"]["username"], "admin");
    let mut another_stranger = upgrade_eventually(s.addr).await;
    send(&mut another_stranger, json!({ "type": "offer", "kind": "dashboard", "protocols": ["capstan-socket/1"] })).await;
    assert_eq!(next(&mut another_stranger).await["type"], "welcome");
}

/// An upgrade without a bearer, retried while a slot is on its way back (a session gives its
/// slot back just after its close frame is sent).
async fn upgrade_eventually(addr: SocketAddr) -> Ws {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok((ws, _)) = tokio_tungstenite::connect_async(format!("ws://{addr}/api/v1/socket")).await {
            return ws;
        }
        assert!(tokio::time::Instant::now() < deadline, "a stranger's slot came back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_stopping_host_closes_its_sessions_going_away() {
    let s = serve(|_| {}).await;
    let (mut ws, _) = open(s.addr, "cli", Some(&s.token)).await;
    s.state.sockets.close_all().await;
    assert!(s.state.sockets.is_empty(), "close_all returns once every session sent its close frame");
    assert_eq!(closed_with(&mut ws).await, Some((1001, "going-away".into())));
}
