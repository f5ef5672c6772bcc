//! The HTTP API as a client sees it: typed methods, strict bodies, the error envelope, request
//! ids and the method listing.

use crate::support::{Capstan, check_envelope, chunked_post, dev_command, sized_post};
use serde_json::{Value, json};

fn dev() -> (tempfile::TempDir, Capstan) {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::dev(&dir.path().join("data"));
    (dir, server)
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[test]
fn get_status_method_reports_ready() {
    let (_dir, server) = dev();
    let status = server.call("system.getStatus", "{}").expect_json(200);
    assert_eq!(status["ready"], true, "system.getStatus should be ready: {status}");
    assert_eq!(status["migrations"]["done"], true, "{status}");

    // an empty body counts as {}, and a charset parameter on the content type is fine
    let reply = server.request("POST", "/api/v1/system.getStatus", &[("content-type", "application/json; charset=utf-8")], Some(b""));
    assert_eq!(reply.expect_json(200)["ready"], true, "an empty body with a charset should be accepted");
    // no content type at all is taken as JSON
    let reply = server.request("POST", "/api/v1/system.getStatus", &[], Some(b"{}"));
    assert_eq!(reply.expect_json(200)["ready"], true, "a body without content type should be accepted");

    let version = server.call("system.getVersion", "{}").expect_json(200);
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"), "{version}");
    assert_eq!(version["dataVersionTarget"], capstan::migrate::host_chain().target().to_string(), "{version}");
}

#[test]
fn unknown_fields_and_wrong_types_are_refused_naming_the_field() {
    let (_dir, server) = dev();
    let reply = server.call("system.getStatus", r#"{"bogus":1}"#);
    let error = reply.expect_error(400, "invalid-request");
    assert_eq!(error["retryable"], false, "{error}");
    assert_eq!(error["data"], json!({"field": "bogus"}), "the unknown field should be named: {error}");
    assert!(error["message"].as_str().unwrap().contains("bogus"), "the message should name the field: {error}");

    let error = server.call("migrations.getStatus", r#"{"chain": 5}"#).expect_error(400, "invalid-request");
    assert_eq!(error["data"]["field"], "chain", "the mistyped field should be named: {error}");

    let error = server.call("system.getVersion", r#"{"chain": "capstan"}"#).expect_error(400, "invalid-request");
    assert_eq!(error["data"]["field"], "chain", "system.getVersion takes no parameters: {error}");
}

#[test]
fn malformed_bodies_are_invalid_requests() {
    let (_dir, server) = dev();
    for body in ["{", "{\"chain\":", "not json", "[]", "5", "null"] {
        server.call("migrations.getStatus", body).expect_error(400, "invalid-request");
    }
}

/// A body of `size` bytes that would be valid JSON if it were accepted.
fn big_body(size: usize) -> Vec<u8> {
    let mut body = b"{\"chain\":\"".to_vec();
    body.resize(size - 2, b'a');
    body.extend_from_slice(b"\"}");
    body
}

const EXPECT_100: (&str, &str) = ("expect", "100-continue");
const PATH: &str = "/api/v1/migrations.getStatus";

/// `raw` (a request as `sized_post` or `chunked_post` writes it) with `authorization`.
fn authorized(raw: Vec<u8>, authorization: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(&raw).into_owned();
    text.replacen("host: 127.0.0.1\r\n", &format!("host: 127.0.0.1\r\nauthorization: {authorization}\r\n"), 1).into_bytes()
}

/// Refuse an oversized body three ways: declared with `Expect: 100-continue` (the body is never
/// sent), declared and sent anyway, and chunked without a declared length. `authorization` is
/// the caller's header (an empty one: nobody).
fn assert_too_large(server: &Capstan, authorization: &str, size: usize, limit: usize) {
    let body = big_body(size);
    let auth: &[(&str, &str)] = if authorization.is_empty() { &[] } else { &[("authorization", authorization)] };
    let headers: Vec<(&str, &str)> = [JSON, EXPECT_100].into_iter().chain(auth.iter().copied()).collect();
    let error = server.request("POST", PATH, &headers, Some(&body)).expect_error(413, "request-too-large");
    assert_eq!(error["data"]["limitBytes"], limit, "{error}");
    let raw = |request: Vec<u8>| if authorization.is_empty() { request } else { authorized(request, authorization) };
    let error = server.raw(&raw(sized_post(PATH, &body))).expect_error(413, "request-too-large");
    assert_eq!(error["data"]["limitBytes"], limit, "{error}");
    let error = server.raw(&raw(chunked_post(PATH, &body))).expect_error(413, "request-too-large");
    assert_eq!(error["data"]["limitBytes"], limit, "{error}");
}

/// An administrator's `Authorization` header on the dev host `server`.
fn admin_bearer(server: &Capstan) -> String {
    format!("Bearer {}", server.login("admin", &server.printed_admin_password().expect("the dev admin password")))
}

#[test]
fn bodies_over_the_default_limit_are_refused() {
    let (_dir, server) = dev();
    let limit: usize = 1024 * 1024;
    let default = capstan::config::VARS.iter().find(|v| v.env == capstan::config::MAX_BODY_BYTES).unwrap().default;
    assert_eq!(default, limit.to_string(), "the documented default limit");
    let bearer = admin_bearer(&server);

    assert_too_large(&server, &bearer, limit + 1, limit);
    // exactly at the limit the body is read (and then judged on its content: no such chain)
    server.request("POST", PATH, &[JSON, ("authorization", &bearer)], Some(&big_body(limit))).expect_error(404, "not-found");
    server.raw(&authorized(chunked_post(PATH, &big_body(limit)), &bearer)).expect_error(404, "not-found");
    // nobody (a public method without a token) may send a few KiB, however the body comes
    assert_too_large(&server, "", 8 * 1024 + 1, 8 * 1024);
    assert_too_large(&server, "Bearer not-a-token", 8 * 1024 + 1, 8 * 1024);
    server.raw(&chunked_post(PATH, &big_body(8 * 1024))).expect_error(404, "not-found");
}

#[test]
fn nothing_is_read_for_an_unknown_method_or_a_caller_who_may_not_call_it() {
    let (_dir, server) = dev();
    // 50 MiB declared and never sent: the answer comes from the head alone (a host that read
    // the body first would still be waiting for it)
    let head = |path: &str, auth: &str| {
        format!("POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\n\r\n", 50 << 20)
            .into_bytes()
    };
    server.raw(&head("/api/v1/nosuch.method", "")).expect_error(404, "method-unknown");
    server.raw(&head("/api/v1/organizations.list", "")).expect_error(401, "unauthenticated");
    server.raw(&head("/api/v1/organizations.list", "authorization: Bearer not-a-token\r\n")).expect_error(401, "unauthenticated");
    // a relay call carried between fleet nodes is judged by its signed headers first
    server.raw(&head("/fleet/v1/relay-call", "")).expect_error(401, "fleet-request-unverified");
}

/// The head of a bundle upload that declares `length` bytes of body and sends none of it.
fn upload_head(authorization: Option<&str>, length: usize) -> Vec<u8> {
    let auth = authorization.map(|a| format!("authorization: {a}\r\n")).unwrap_or_default();
    format!("POST /api/v1/uploads/plugin-bundle HTTP/1.1\r\nhost: 127.0.0.1\r\n{auth}content-length: {length}\r\n\r\n").into_bytes()
}

#[test]
fn a_bundle_upload_is_authorized_before_its_body_is_read() {
    let (_dir, server) = dev();
    // 60 MiB declared and never sent: the answer comes from the head alone (a host that read
    // the body first would still be waiting for it)
    server.raw(&upload_head(None, 60 << 20)).expect_error(401, "unauthenticated");
    server.raw(&upload_head(Some("Bearer not-a-token"), 60 << 20)).expect_error(401, "unauthenticated");
    let admin = server.login("admin", &server.printed_admin_password().expect("the dev admin password"));
    // an administrator's body over the limit is refused from its declared length, and one
    // streamed without a length once the limit is crossed
    let bearer = format!("Bearer {admin}");
    let declared = server.raw(&upload_head(Some(&bearer), (64 << 20) + 1)).expect_error(413, "bundle-too-large");
    assert_eq!(declared["data"]["limit"], 64 << 20, "{declared}");
    let mut chunked = format!(
        "POST /api/v1/uploads/plugin-bundle HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: {bearer}\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..65 {
        chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        chunked.extend_from_slice(&chunk);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    server.raw(&chunked).expect_error(413, "bundle-too-large");
    // a small body that is no bundle is refused by name, and nothing was kept
    let junk = server.request("POST", "/api/v1/uploads/plugin-bundle", &[("authorization", &bearer)], Some(b"not a tar"));
    junk.expect_error(400, "bundle-malformed");
}

#[test]
fn a_configured_body_limit_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = dev_command(&dir.path().join("data"));
    cmd.env(capstan::config::MAX_BODY_BYTES, "2048");
    let server = Capstan::start(cmd);

    let bearer = admin_bearer(&server);
    assert_too_large(&server, &bearer, 4096, 2048);
    assert_too_large(&server, &bearer, 2049, 2048);
    // under the limit is still fine
    server.request("POST", PATH, &[JSON, ("authorization", &bearer)], Some(&big_body(2048))).expect_error(404, "not-found");
    server.raw(&authorized(chunked_post(PATH, &big_body(2000)), &bearer)).expect_error(404, "not-found");
    assert_eq!(server.call("system.getStatus", "{}").expect_json(200)["ready"], true);
}

#[test]
fn unknown_methods_paths_and_verbs_are_refused() {
    let (_dir, server) = dev();
    let error = server.call("system.nope", "{}").expect_error(404, "method-unknown");
    assert_eq!(error["data"]["method"], "system.nope", "{error}");

    server.get("/api/v1/system.getStatus").expect_error(405, "method-not-allowed");
    server.request("PUT", "/api/v1/system.getStatus", &[JSON], Some(b"{}")).expect_error(405, "method-not-allowed");
    server.get("/nowhere").expect_error(404, "not-found");
    server.request("DELETE", "/nowhere", &[], None).expect_error(404, "not-found");
    server.request("POST", "/api/v1/", &[JSON], Some(b"{}")).expect_error(404, "not-found");
    server.request("POST", "/api/v2/system.getStatus", &[JSON], Some(b"{}")).expect_error(404, "not-found");
}

#[test]
fn non_json_content_types_are_refused() {
    let (_dir, server) = dev();
    for kind in ["text/plain", "application/x-www-form-urlencoded", "application/jsonx"] {
        server
            .request("POST", "/api/v1/system.getStatus", &[("content-type", kind)], Some(b"{}"))
            .expect_error(415, "unsupported-media-type");
    }
}

#[test]
fn other_chains_are_not_found_and_the_host_chain_is_reported() {
    let (_dir, server) = dev();
    let error = server.call("migrations.getStatus", r#"{"chain":"other"}"#).expect_error(404, "not-found");
    assert!(error["message"].as_str().unwrap().contains("other"), "the message should name the chain: {error}");

    let chain = capstan::migrate::host_chain();
    for body in ["{}", r#"{"chain":"capstan"}"#, r#"{"chain":null}"#] {
        let state = server.call("migrations.getStatus", body).expect_json(200);
        assert_eq!(state["chain"], "capstan", "{body}: {state}");
        assert_eq!(state["done"], true, "{body}: {state}");
        assert_eq!(state["target"], chain.target().to_string(), "{body}: {state}");
        assert_eq!(state["oldestSupported"], chain.oldest_supported.to_string(), "{body}: {state}");
        assert_eq!(state["dataVersion"], chain.target().to_string(), "{body}: {state}");
    }
}

fn is_generated_id(id: &str) -> bool {
    id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit())
}

#[test]
fn every_answer_carries_a_request_id_that_reaches_the_log() {
    let dir = tempfile::tempdir().unwrap();
    // a request that went well has its access line at debug
    let mut cmd = dev_command(&dir.path().join("data"));
    cmd.env("CAPSTAN_LOG", "info,capstan::access=debug");
    let server = Capstan::start(cmd);
    let replies = [
        server.get("/healthz"),
        server.get("/status"),
        server.get("/api/v1/methods"),
        server.call("system.getStatus", "{}"),
        server.call("system.getStatus", "{"),
        server.call("system.nope", "{}"),
        server.get("/nowhere"),
    ];
    let mut seen = std::collections::HashSet::new();
    for reply in &replies {
        let id = reply.request_id.as_deref().unwrap_or_else(|| panic!("{}: no x-request-id header", reply.what));
        assert!(is_generated_id(id), "{}: a generated request id should be 32 hex digits, got {id:?}", reply.what);
        assert!(seen.insert(id.to_string()), "{}: request ids should be unique, {id} repeated", reply.what);
    }

    // a well-formed incoming id is kept, on success and on error
    let reply = server.request("POST", "/api/v1/system.getStatus", &[JSON, ("x-request-id", "abc-123")], Some(b"{}"));
    reply.expect_json(200);
    assert_eq!(reply.request_id.as_deref(), Some("abc-123"), "a well-formed incoming id should be echoed");
    let reply = server.request("POST", "/api/v1/system.nope", &[JSON, ("x-request-id", "e2e_err-42")], Some(b"{}"));
    reply.expect_error(404, "method-unknown");
    assert_eq!(reply.request_id.as_deref(), Some("e2e_err-42"), "an incoming id should be echoed on errors too");

    // a malformed or oversized one is replaced
    let long = "a".repeat(65);
    for bad in ["has space", "semi;colon", long.as_str()] {
        let reply = server.request("GET", "/healthz", &[("x-request-id", bad)], None);
        let id = reply.request_id.as_deref().unwrap_or_default();
        assert!(is_generated_id(id), "the malformed incoming id {bad:?} should be replaced by a generated one, got {id:?}");
    }

    // the ids reach the server log
    server.wait_for_stderr("abc-123");
    server.wait_for_stderr("e2e_err-42");
    let generated = replies[3].request_id.clone().unwrap();
    let log = server.wait_for_stderr(&generated);
    let line = log.lines().find(|l| l.contains(&generated)).unwrap();
    assert!(line.contains("request done") || line.contains("request refused"), "the id should be on the request's log line, got {line:?}");
    assert!(!log.contains("has space"), "a refused incoming id should not be logged; stderr:\n{log}");
}

#[test]
fn the_method_listing_describes_every_method_with_schemas() {
    let (_dir, server) = dev();
    let listing = server.get("/api/v1/methods").expect_json(200);
    let methods = listing["methods"].as_array().unwrap_or_else(|| panic!("`methods` should be an array: {listing}"));
    let find = |name: &str| -> &Value {
        methods.iter().find(|m| m["name"] == name).unwrap_or_else(|| panic!("the listing should include {name}: {listing}"))
    };
    for name in ["system.getStatus", "system.getVersion", "migrations.getStatus"] {
        let method = find(name);
        assert!(method["summary"].as_str().is_some_and(|s| !s.is_empty()), "{name} should have a summary: {method}");
        for side in ["input", "output"] {
            let schema = &method[side];
            assert_eq!(schema["type"], "object", "{name} {side} should be an object schema: {schema}");
            assert!(
                schema["$schema"].as_str().is_some_and(|s| s.contains("json-schema.org")),
                "{name} {side} should be a JSON Schema: {schema}"
            );
        }
        assert_eq!(method["input"]["additionalProperties"], false, "{name} input should refuse unknown fields: {method}");
    }
    let output = &find("system.getStatus")["output"];
    assert!(output["properties"]["ready"].is_object(), "system.getStatus output should describe `ready`: {output}");
    let input = &find("migrations.getStatus")["input"];
    assert!(input["properties"]["chain"].is_object(), "migrations.getStatus input should describe `chain`: {input}");
    for method in methods {
        let name = method["name"].as_str().unwrap_or_default();
        let (area, verb) = name.split_once('.').unwrap_or_else(|| panic!("method name {name:?} should be <area>.<verb>"));
        assert!(!area.is_empty() && !verb.is_empty(), "method name {name:?} should be <area>.<verb>");
    }
}

#[test]
fn every_api_error_uses_the_envelope() {
    let (_dir, server) = dev();
    let replies = [
        server.call("system.getStatus", r#"{"bogus":1}"#),
        server.call("system.getStatus", "{"),
        server.call("system.nope", "{}"),
        server.call("migrations.getStatus", r#"{"chain":"other"}"#),
        server.get("/api/v1/system.getStatus"),
        server.get("/nowhere"),
        server.request("POST", "/api/v1/system.getStatus", &[("content-type", "text/plain")], Some(b"{}")),
        server.request("POST", "/api/v1/system.getStatus", &[JSON, EXPECT_100], Some(&vec![b' '; 1024 * 1024 + 1])),
    ];
    for reply in &replies {
        assert!(reply.status >= 400, "{}: expected an error, got {} {}", reply.what, reply.status, reply.body);
        let body = reply.expect_json(reply.status);
        let error = check_envelope(&reply.what, &body);
        if let Some(data) = error.get("data") {
            assert!(data.is_object(), "{}: error.data should be an object when present: {body}", reply.what);
        }
    }
}

/// A wrong verb on a GET-only route answers the error envelope like every other error.
#[test]
fn wrong_verbs_on_get_routes_use_the_envelope() {
    let (_dir, server) = dev();
    for path in ["/healthz", "/status", "/api/v1/methods"] {
        let reply = server.request("POST", path, &[JSON], Some(b"{}"));
        reply.expect_error(405, "method-not-allowed");
    }
}

/// Read until the server closes the connection or `within` passes; what arrived, and whether
/// the server closed it.
fn read_until_closed(stream: &mut std::net::TcpStream, within: std::time::Duration) -> (String, bool) {
    use std::io::Read;
    stream.set_read_timeout(Some(within)).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&answer).into_owned(), true),
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (String::from_utf8_lossy(&answer).into_owned(), true),
            Err(_) => return (String::from_utf8_lossy(&answer).into_owned(), false),
        }
    }
}

#[test]
fn slow_clients_are_cut_off_and_cannot_hold_every_connection() {
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = dev_command(&dir.path().join("data"));
    cmd.env("CAPSTAN_MAX_CONNECTIONS", "3");
    let server = Capstan::start(cmd);
    let addr = server.addr.clone();
    // (the host's own first-party installation may hold a connection for a moment: none here,
    // it runs in-process)

    // a head that never completes, and a body that stalls after its first bytes
    let stalled_head = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let mut stream = TcpStream::connect(&addr).unwrap();
            stream.write_all(b"POST /api/v1/system.getStatus HTTP/1.1\r\nhost: 127.0.0.1\r\n").unwrap();
            read_until_closed(&mut stream, Duration::from_secs(90))
        }
    });
    let stalled_body = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let mut stream = TcpStream::connect(&addr).unwrap();
            let head = "POST /api/v1/system.getStatus HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{";
            stream.write_all(head.as_bytes()).unwrap();
            read_until_closed(&mut stream, Duration::from_secs(90))
        }
    });
    std::thread::sleep(Duration::from_millis(500));

    // with both slow clients and one idle connection holding the three slots, a new client
    // waits (it is not refused), and is served as soon as a slot frees
    let idle = TcpStream::connect(&addr).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut waiting = TcpStream::connect(&addr).unwrap();
    waiting.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").unwrap();
    let (early, closed) = read_until_closed(&mut waiting, Duration::from_secs(2));
    assert!(early.is_empty() && !closed, "a client beyond the cap waits for a slot: {early:?}");
    drop(idle);
    let (answer, _) = read_until_closed(&mut waiting, Duration::from_secs(30));
    assert!(answer.starts_with("HTTP/1.1 200"), "served once a slot freed: {answer:?}");

    let (head_answer, head_closed) = stalled_head.join().unwrap();
    assert!(head_closed, "a head that never completes is closed by the server: {head_answer:?}");
    let (body_answer, _) = stalled_body.join().unwrap();
    assert!(body_answer.starts_with("HTTP/1.1 408"), "{body_answer:?}");
    assert!(body_answer.contains("\"request-timeout\""), "{body_answer:?}");
    // and the host serves on
    assert_eq!(server.get("/healthz").status, 200);
}
