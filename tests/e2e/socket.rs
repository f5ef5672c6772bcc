//! `/api/v1/socket` on the real `capstan serve --dev`: a session's calls answer as HTTP's do,
//! an unknown protocol is refused by name, and a stopping host closes its sessions
//! `going-away` (docs/socket.md; the bounds are host tests, host_tests/socket.rs).

use crate::support::{Capstan, TEST_ADMIN, dev_command, eventually, with_test_admin};
use serde_json::{Value, json};
use std::net::TcpStream;
use std::time::Duration;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

pub(crate) type Ws = WebSocket<MaybeTlsStream<TcpStream>>;

fn connect(server: &Capstan) -> Ws {
    let (ws, _) = tungstenite::connect(format!("ws://{}/api/v1/socket", server.addr)).expect("the socket upgrades");
    if let MaybeTlsStream::Plain(stream) = ws.get_ref() {
        // a frame that does not come fails the test rather than hanging it
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    }
    ws
}

fn send(ws: &mut Ws, frame: Value) {
    ws.send(Message::text(frame.to_string())).unwrap();
}

fn next(ws: &mut Ws) -> Value {
    loop {
        match ws.read().expect("a frame") {
            Message::Text(text) => return serde_json::from_str(text.as_str()).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

fn close_code(ws: &mut Ws) -> Option<(u16, String)> {
    loop {
        match ws.read() {
            Ok(Message::Close(frame)) => return frame.map(|f| (u16::from(f.code), f.reason.as_str().to_string())),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

pub(crate) fn open(server: &Capstan, kind: &str, token: Option<&str>) -> (Ws, Value) {
    let mut ws = connect(server);
    let mut offer = json!({ "type": "offer", "kind": kind, "protocols": ["capstan-socket/1"] });
    if let Some(token) = token {
        offer["token"] = json!(token);
    }
    send(&mut ws, offer);
    let welcome = next(&mut ws);
    assert_eq!(welcome["type"], "welcome", "{welcome}");
    (ws, welcome)
}

pub(crate) fn call(ws: &mut Ws, id: u64, method: &str, body: Value) -> Value {
    send(ws, json!({ "type": "call", "id": id, "method": method, "body": body }));
    let answer = next(ws);
    assert_eq!(answer["id"], id, "{answer}");
    answer
}

#[test]
fn the_socket_answers_as_http_refuses_by_name_and_closes_going_away_when_the_host_stops() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(dir.path())));
    let token = server.login(TEST_ADMIN.0, TEST_ADMIN.1);

    // an administrator's session: the same answers as HTTP
    let (mut admin, welcome) = open(&server, "cli", Some(&token));
    assert_eq!((welcome["protocol"].as_str(), welcome["identity"]["username"].as_str()), (Some("capstan-socket/1"), Some("admin")));
    let created = call(&mut admin, 1, "clusters.create", json!({ "name": "prod" }));
    assert_eq!(created["type"], "result");
    let listed = call(&mut admin, 2, "clusters.list", json!({}));
    assert_eq!(listed["result"], server.call_as(&token, "clusters.list", &json!({})).expect_json(200));
    // a plugin's method (first-party ingress): its answer's text inside the frame, as over HTTP
    let table = json!({ "clusterId": created["result"]["cluster"]["id"] });
    let mut id = 3;
    let read = eventually("the first-party ingress plugin answers over the socket", Duration::from_secs(60), || {
        id += 1;
        let read = call(&mut admin, id, "ingress.getRouteTable", table.clone());
        if read["error"]["code"] == "plugin-not-loaded" { Err(read.to_string()) } else { Ok(read) }
    });
    assert_eq!((read["type"].as_str(), &read["result"]["table"]), (Some("result"), &Value::Null), "{read}");
    assert_eq!(read["result"]["clusterId"], table["clusterId"], "{read}");
    assert_eq!(read["result"], server.call_as(&token, "ingress.getRouteTable", &table).expect_json(200));
    let refused = call(&mut admin, 3, "clusters.create", json!({ "name": "prod", "extra": 1 }));
    let over_http = server.call_as(&token, "clusters.create", &json!({ "name": "prod", "extra": 1 })).expect_error(400, "invalid-request");
    assert_eq!(refused["error"], over_http);

    // an anonymous session: an administrator's method refused as a request without a token is
    let (mut anonymous, welcome) = open(&server, "dashboard", None);
    assert!(welcome["identity"].is_null());
    let refused = call(&mut anonymous, 1, "clusters.list", json!({}));
    let over_http = server.call("clusters.list", "{}").expect_error(401, "unauthenticated");
    assert_eq!(refused["error"], over_http);

    // an unknown protocol: refused by name, listing what the host speaks, and closed
    let mut ws = connect(&server);
    send(&mut ws, json!({ "type": "offer", "kind": "relay", "protocols": ["capstan-socket/0"], "token": token }));
    let refused = next(&mut ws);
    assert_eq!(refused["error"]["code"], "protocol-unsupported", "{refused}");
    assert_eq!(refused["error"]["data"]["spoken"], json!(["capstan-socket/1"]));
    assert_eq!(close_code(&mut ws), Some((4001, "protocol-unsupported".into())));

    // the host stops: its open sessions are told to go away
    let exited = server.stop();
    assert!(exited.status.success(), "{}", exited.stderr);
    assert_eq!(close_code(&mut admin), Some((1001, "going-away".into())));
    assert_eq!(close_code(&mut anonymous), Some((1001, "going-away".into())));
}
