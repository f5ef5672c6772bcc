//! The nodes area through the assembled host: `nodes.*` through the registry, and the jump
//! pages and the agent's wire through the router, in process.

use crate::api::{Call, Pages, router};
use crate::auth::Identity;
use crate::nodes::{self, sha256_hex};
use crate::refusal::Refusal;
use crate::state::{AppState, test_state_at, test_state_on};
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use serde_json::{Value, json};
use std::time::Duration;
use tower::ServiceExt;

const PASSWORD: &str = "a-long-enough-admin-password";
const PROTOCOL: &str = "capstan-agent/1";

struct World {
    _dir: tempfile::TempDir,
    state: AppState,
    admin: Identity,
    cluster: String,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
    fn code(&self) -> String {
        self.json()["error"]["code"].as_str().unwrap_or_default().to_string()
    }
}

/// A fresh 32-byte token (64 lowercase hex characters), as an agent draws it.
fn new_token() -> String {
    rand::random::<[u8; 32]>().iter().map(|b| format!("{b:02x}")).collect()
}

impl World {
    async fn at(origin: &str, dev: bool) -> World {
        let dir = tempfile::tempdir().unwrap();
        let state = test_state_at(dir.path(), origin, dev).await;
        World::with(dir, state).await
    }

    /// A world whose store is a fresh database at the MongoDB `url`.
    async fn on_mongodb(url: &str) -> World {
        let dir = tempfile::tempdir().unwrap();
        let database = format!("capstan_nodes_{:016x}", rand::random::<u64>());
        let mongo = crate::store::mongo::MongoStore::open(url, Some(&database)).await.unwrap();
        let store = crate::store::Store::new(mongo, crate::store::DEFAULT_BUDGET);
        let state = test_state_on(dir.path(), store, "https://capstan.example", false).await;
        World::with(dir, state).await
    }

    async fn with(dir: tempfile::TempDir, state: AppState) -> World {
        crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
        let answer = state.auth.login("admin", PASSWORD, None).await.unwrap();
        let admin = state.auth.authenticate(&answer.token).await.unwrap();
        let mut world = World { _dir: dir, state, admin, cluster: String::new() };
        world.cluster = world.ok("clusters.create", json!({"name": "prod"})).await["cluster"]["id"].as_str().unwrap().to_string();
        world
    }

    async fn new() -> World {
        World::at("https://capstan.example", false).await
    }

    async fn call(&self, method: &str, body: Value) -> Result<Value, Refusal> {
        let m = self.state.methods.get(method).unwrap_or_else(|| panic!("{method} is registered"));
        m.call(Call::by(&self.admin), body).await
    }

    async fn ok(&self, method: &str, body: Value) -> Value {
        self.call(method, body.clone()).await.unwrap_or_else(|e| panic!("{method} {body}: {e}"))
    }

    async fn refused(&self, method: &str, body: Value, code: &str) -> Refusal {
        let err = self.call(method, body.clone()).await.expect_err(&format!("{method} {body} should be refused {code}"));
        assert_eq!(err.code, code, "{method} {body}: {err}");
        err
    }

    async fn send(&self, request: Request<Body>) -> Reply {
        let response = router(self.state.clone(), Pages::none()).oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap().to_vec();
        Reply { status, headers, body }
    }

    async fn get(&self, path: &str, accept: Option<&str>) -> Reply {
        let mut request = Request::get(path);
        if let Some(accept) = accept {
            request = request.header(header::ACCEPT, accept);
        }
        self.send(request.body(Body::empty()).unwrap()).await
    }

    async fn post(&self, path: &str, body: impl Into<Body>, bearer: Option<&str>) -> Reply {
        let mut request = Request::post(path).header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        self.send(request.body(body.into()).unwrap()).await
    }

    async fn agent(&self, route: &str, body: Value, bearer: Option<&str>) -> Reply {
        self.post(&format!("/agent/v1/{route}"), body.to_string(), bearer).await
    }

    async fn jump(&self, body: Value) -> Value {
        self.ok("nodes.createJumpCommand", body).await
    }

    async fn code(&self) -> String {
        self.jump(json!({"clusterId": self.cluster})).await["code"].as_str().unwrap().to_string()
    }

    /// Enroll a machine called `hostname`: its node id and token.
    async fn enroll(&self, hostname: &str) -> (String, String) {
        let code = self.code().await;
        let token = new_token();
        let reply = self.agent("enroll", enroll_body(&code, hostname, &token), None).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        (reply.json()["nodeId"].as_str().unwrap().to_string(), token)
    }

    async fn node(&self, id: &str) -> Value {
        self.ok("nodes.get", json!({"id": id})).await
    }

    async fn beat(&self, node: &str, token: &str) -> Reply {
        self.agent(
            "heartbeat",
            json!({"protocol": PROTOCOL, "nodeId": node, "report": report(&self.node(node).await["hostname"])}),
            Some(token),
        )
        .await
    }
}

fn enroll_body(code: &str, hostname: &str, token: &str) -> Value {
    json!({"protocol": PROTOCOL, "code": code, "hostname": hostname, "tokenSha256": sha256_hex(token.as_bytes()), "agentVersion": "0.1.0"})
}

fn report(hostname: &Value) -> Value {
    json!({
        "hostname": hostname, "os": "Debian GNU/Linux 13", "kernel": "6.12.0", "arch": "x86_64", "cpus": 4,
        "memoryBytes": 8_000_000_000u64, "diskBytes": 100_000_000_000u64, "diskFreeBytes": 50_000_000_000u64,
        "agentVersion": "0.1.0", "uptimeSeconds": 1000, "addresses": ["192.0.2.10", "2001:db8::1"],
    })
}

async fn count(state: &AppState, collection: &str) -> usize {
    state.store.transact(|tx| async move { Ok(tx.scan(collection, None, 200).await?.documents.len()) }).await.unwrap()
}

#[tokio::test]
async fn jump_commands_show_the_code_once_and_keep_only_its_hash() {
    let w = World::new().await;
    let before = capstan_core::clock::now_ms();
    let created = w.jump(json!({"clusterId": w.cluster, "nodeName": "gras", "setHostname": true})).await;
    let code = created["code"].as_str().unwrap();
    assert!(code.len() == 16 && code.chars().all(|c| c.is_ascii_alphanumeric()), "{code}");
    assert_eq!(created["url"], format!("https://capstan.example/jump/{code}"));
    assert_eq!(created["scriptUrl"], format!("https://capstan.example/jump/{code}/setup.sh"));
    assert_eq!(created["command"], format!("curl -fsSL 'https://capstan.example/jump/{code}' | sudo bash"));
    let expires = created["expiresAt"].as_u64().unwrap();
    assert!(expires >= before + 30 * 60_000 && expires <= capstan_core::clock::now_ms() + 30 * 60_000, "default 30 minutes");

    // stored as its SHA-256 alone
    let code_owned = code.to_string();
    let stored = w.state.store.transact(|tx| async move { Ok(tx.scan(nodes::NODE_JUMP_CODES, None, 10).await?.documents) }).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].id, sha256_hex(code_owned.as_bytes()));
    assert!(!stored[0].data.to_string().contains(&code_owned));
    let events = crate::events::read_after(&w.state.store, 0, 100).await.unwrap();
    assert!(events.iter().all(|e| !e.data.to_string().contains(&code_owned)));

    for ttl in [0, 1441] {
        let err = w.refused("nodes.createJumpCommand", json!({"clusterId": w.cluster, "ttlMinutes": ttl}), "invalid-request").await;
        assert_eq!(err.data.unwrap()["field"], "ttlMinutes");
    }
    let day = w.jump(json!({"clusterId": w.cluster, "ttlMinutes": 1440})).await;
    assert!(day["expiresAt"].as_u64().unwrap() >= before + 1440 * 60_000);
    w.refused("nodes.createJumpCommand", json!({"clusterId": "cluster_nope"}), "cluster-not-found").await;
    w.refused("nodes.createJumpCommand", json!({"clusterId": w.cluster, "nodeName": "Bad_Name"}), "name-invalid").await;
    // an unused code renaming a machine worker-gras holds that hostname; a name alone holds none
    w.refused("nodes.createJumpCommand", json!({"clusterId": w.cluster, "nodeName": "gras", "setHostname": true}), "hostname-in-use").await;
    w.jump(json!({"clusterId": w.cluster, "nodeName": "gras"})).await;
    let err = w.refused("nodes.createJumpCommand", json!({"clusterId": w.cluster, "setHostname": true}), "invalid-request").await;
    assert_eq!(err.data.unwrap()["field"], "setHostname");

    // an http origin carries no script, except in dev mode
    let plain = World::at("http://capstan.test", false).await;
    plain.refused("nodes.createJumpCommand", json!({"clusterId": plain.cluster}), "public-origin-not-https").await;
    let dev = World::at("http://127.0.0.1:8080", true).await;
    let code = dev.code().await;
    let script = dev.get(&format!("/jump/{code}/setup.sh"), None).await;
    assert_eq!(script.status, StatusCode::OK);
    assert!(script.text().contains("# DEV MODE"));
    let page = dev.get(&format!("/jump/{code}"), Some("text/html")).await;
    assert!(page.text().contains("Dev host:"), "{}", page.text());
}

#[tokio::test]
async fn the_jump_routes_serve_the_script_and_one_uniform_404() {
    let logs = super::plugins::captured_logs();
    let w = World::new().await;
    let created = w.jump(json!({"clusterId": w.cluster, "nodeName": "gras", "setHostname": true})).await;
    let code = created["code"].as_str().unwrap();

    let script = w.get(&format!("/jump/{code}"), Some("*/*")).await;
    assert_eq!(script.status, StatusCode::OK);
    assert_eq!(script.headers[header::CONTENT_TYPE], "text/x-shellscript; charset=utf-8");
    assert_eq!(script.headers[header::CACHE_CONTROL], "no-store");
    let text = script.text();
    assert!(text.contains("\nset -euo pipefail\n"));
    let step: Vec<&str> = text.lines().skip_while(|l| *l != "# -- enroll --").skip(1).take_while(|l| *l != "# -- end enroll --").collect();
    assert_eq!(step, vec![format!("printf '%s\\n' '{code}' | capstan-agent enroll 'https://capstan.example'")]);
    assert_eq!(text.matches(code).count(), 1, "the code is only ever piped to stdin");
    assert!(text.contains("hostnamectl set-hostname 'worker-gras'"));
    assert!(text.contains("https://capstan.example/agent/v1/binary/"));
    assert!(text.contains("if [ ! -d /run/systemd/system ]; then"), "without systemd the script says how to run the agent");
    assert_eq!(w.get(&format!("/jump/{code}/setup.sh"), Some("text/html")).await.text(), text, "setup.sh is always the script");
    // the request log names the route, never the code (a bearer secret until it is used)
    let logged = String::from_utf8_lossy(&logs.lock().unwrap()).to_string();
    assert!(logged.contains(&format!("/jump/{}…/setup.sh", &code[..2])), "the jump requests are logged");
    assert!(!logged.contains(code), "a jump code never reaches the log");

    let page = w.get(&format!("/jump/{code}"), Some("text/html,application/xhtml+xml")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.headers[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/html"));
    assert!(page.text().contains("Join the cluster prod") && !page.text().contains("Dev host"));
    // the dashboard's page headers, with the referrer withheld altogether (the URL is the code)
    for (name, value) in crate::page_headers::HEADERS {
        let expected = if name == header::REFERRER_POLICY { "no-referrer" } else { value };
        assert_eq!(page.headers.get(&name).and_then(|v| v.to_str().ok()), Some(expected), "the landing page's {name}");
    }
    assert_eq!(page.headers[header::CACHE_CONTROL], "no-store");

    // unknown, malformed, expired and used codes: one answer
    let unknown = w.get("/jump/AAAAAAAAAAAAAAAA", None).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.code(), "jump-code-invalid");
    assert_eq!(unknown.headers[header::CACHE_CONTROL], "no-store");
    let same = |reply: Reply| {
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
        assert_eq!(reply.body, unknown.body, "{}", reply.text());
    };
    same(w.get("/jump/short", None).await);
    same(w.get("/jump/AAAAAAAAAAAAAAAA/setup.sh", Some("text/html")).await);
    let (_, _) = w.enroll("node-a").await; // uses a fresh code of its own
    let used = w.code().await;
    assert_eq!(w.agent("enroll", enroll_body(&used, "node-b", &new_token()), None).await.status, StatusCode::OK);
    same(w.get(&format!("/jump/{used}"), None).await);
    same(w.get(&format!("/jump/{used}/setup.sh"), None).await);
    w.state.nodes.clock.advance(Duration::from_secs(31 * 60));
    same(w.get(&format!("/jump/{code}"), Some("text/html")).await);
    same(w.agent("enroll", enroll_body(code, "node-c", &new_token()), None).await);
}

/// `GET <path>` of the agent binary from `state`, with `range` if any; the response unread.
async fn binary(state: &AppState, path: &str, range: Option<&str>) -> axum::response::Response {
    let mut request = Request::get(path);
    if let Some(range) = range {
        request = request.header(header::RANGE, range);
    }
    router(state.clone(), Pages::none()).oneshot(request.body(Body::empty()).unwrap()).await.unwrap()
}

fn header_of<'a>(response: &'a axum::response::Response, name: &str) -> &'a str {
    response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_else(|| panic!("a {name} header: {response:?}"))
}

#[tokio::test]
async fn the_agent_binary_is_streamed_from_disk_with_its_sha256_and_served_by_range() {
    use crate::api::nodes::{BINARY_CHUNK, PLATFORMS, own_platform};
    use crate::nodes::jump::BINARY_SHA256_HEADER;
    use http_body_util::BodyExt;

    let w = World::new().await;
    let missing = w.get("/agent/v1/binary/linux-x86_64", None).await;
    assert_eq!((missing.status, missing.code().as_str()), (StatusCode::NOT_FOUND, "agent-binary-unavailable"));
    let mut state = w.state.clone();
    let file = w._dir.path().join("capstan-agent");
    // several read buffers long, no two alike
    let content: Vec<u8> = (0..BINARY_CHUNK * 5 + 123).map(|i| (i % 251) as u8 ^ (i / 4096) as u8).collect();
    std::fs::write(&file, &content).unwrap();
    state.nodes.agent_binary = Some(file.clone());
    assert_eq!(binary(&state, "/agent/v1/binary/windows-x86_64", None).await.status(), StatusCode::NOT_FOUND);
    let own = own_platform();
    if !PLATFORMS.contains(&own.as_str()) {
        return; // this host builds no agent a jump script asks for
    }
    let path = format!("/agent/v1/binary/{own}");
    let digest = sha256_hex(&content);

    // the whole file: its length and digest up front, the bytes in frames of one buffer at most
    let whole = binary(&state, &path, None).await;
    assert_eq!(whole.status(), StatusCode::OK);
    assert_eq!(header_of(&whole, "content-length"), content.len().to_string());
    assert_eq!(header_of(&whole, BINARY_SHA256_HEADER), digest);
    assert_eq!(header_of(&whole, "content-type"), "application/octet-stream");
    assert_eq!(header_of(&whole, "cache-control"), "no-store");
    assert_eq!(header_of(&whole, "accept-ranges"), "bytes");
    let mut body = whole.into_body();
    let (mut frames, mut received) = (0, Vec::new());
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        assert!(data.len() <= BINARY_CHUNK, "a frame of {} bytes: the file was not streamed through the buffer", data.len());
        frames += 1;
        received.extend_from_slice(&data);
    }
    assert!(received == content, "the served bytes are the file's");
    assert!(frames > 5, "{frames} frames for {} bytes", content.len());

    // one range: exactly those bytes, with the whole file's digest
    let part = binary(&state, &path, Some("bytes=100000-200000")).await;
    assert_eq!(part.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(header_of(&part, "content-range"), format!("bytes 100000-200000/{}", content.len()));
    assert_eq!(header_of(&part, "content-length"), "100001");
    assert_eq!(header_of(&part, BINARY_SHA256_HEADER), digest);
    assert!(axum::body::to_bytes(part.into_body(), usize::MAX).await.unwrap() == content[100000..=200000]);
    let tail = binary(&state, &path, Some("bytes=-10")).await;
    assert_eq!(tail.status(), StatusCode::PARTIAL_CONTENT);
    assert!(axum::body::to_bytes(tail.into_body(), usize::MAX).await.unwrap() == content[content.len() - 10..]);

    // a range the file does not have, or several: 416 by name, with the size
    for range in [format!("bytes={}-", content.len()), "bytes=0-1,5-6".into(), "bytes=z-".into()] {
        let refused = binary(&state, &path, Some(&range)).await;
        assert_eq!(refused.status(), StatusCode::RANGE_NOT_SATISFIABLE, "{range}");
        assert_eq!(header_of(&refused, "content-range"), format!("bytes */{}", content.len()));
        let answer: Value = serde_json::from_slice(&axum::body::to_bytes(refused.into_body(), 4096).await.unwrap()).unwrap();
        assert_eq!(answer["error"]["code"], "range-not-satisfiable", "{range}: {answer}");
    }

    // the digest is taken once per size and modification time: the same size and time keep it
    // (not read again per request), a replaced file is read again
    let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
    let mut same_size = content.clone();
    same_size[0] ^= 0xff;
    std::fs::write(&file, &same_size).unwrap();
    std::fs::File::options().write(true).open(&file).unwrap().set_modified(modified).unwrap();
    assert_eq!(header_of(&binary(&state, &path, None).await, BINARY_SHA256_HEADER), digest, "remembered, not read again");
    std::fs::File::options().write(true).open(&file).unwrap().set_modified(modified + Duration::from_secs(1)).unwrap();
    assert_eq!(header_of(&binary(&state, &path, None).await, BINARY_SHA256_HEADER), sha256_hex(&same_size), "replaced: read again");
    std::fs::write(&file, b"\x7fELF agent").unwrap();
    let small = binary(&state, &path, None).await;
    assert_eq!(header_of(&small, BINARY_SHA256_HEADER), sha256_hex(b"\x7fELF agent"));
    assert_eq!(axum::body::to_bytes(small.into_body(), 1024).await.unwrap().as_ref(), b"\x7fELF agent");

    // gone: the one refusal of a missing binary
    std::fs::remove_file(&file).unwrap();
    let gone = binary(&state, &path, None).await;
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn enrollment_is_one_transaction_and_an_exact_replay_creates_nothing() {
    let w = World::new().await;
    let code = w.code().await;
    let token = new_token();
    let body = enroll_body(&code, "Node-A", &token);
    let first = w.agent("enroll", body.clone(), None).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_eq!(first.headers[header::CACHE_CONTROL], "no-store");
    let answer = first.json();
    assert_eq!(answer["protocol"], PROTOCOL);
    assert_eq!(answer["hostname"], "node-a", "lowercased");
    assert_eq!(answer["clusterId"], w.cluster.as_str());
    assert_eq!(answer["credentialGeneration"], 1);
    let id = answer["nodeId"].as_str().unwrap();
    assert!(id.starts_with("node_") && id.len() == 37);
    assert!(!first.text().contains(&token) && !first.text().contains(&code));

    // the same request again: the recorded answer, no second node
    let again = w.agent("enroll", body, None).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.json(), answer);
    assert_eq!(count(&w.state, nodes::CLUSTER_NODES).await, 1);
    assert_eq!(count(&w.state, nodes::NODE_CREDENTIALS).await, 1);
    // any other use of the used code
    let other = w.agent("enroll", enroll_body(&code, "node-a", &new_token()), None).await;
    assert_eq!((other.status, other.code().as_str()), (StatusCode::NOT_FOUND, "jump-code-invalid"));

    let node = w.node(id).await;
    assert_eq!(node["name"], "node-a");
    assert_eq!(node["state"], "active");
    assert_eq!(node["hostnameIntent"], Value::Null);
    assert_eq!((node["live"].as_bool(), node["liveness"].as_str()), (Some(false), Some("never-reported")));
    let credential = w.ok("nodes.getCredential", json!({"nodeId": id})).await;
    assert_eq!(
        credential,
        json!({"nodeId": id, "generation": 1, "sessionEpoch": 1, "state": "active", "rotatedAt": credential["rotatedAt"], "revokedAt": null})
    );
    let stored = w.state.store.transact(|tx| async move { tx.get(nodes::NODE_CREDENTIALS, id).await }).await.unwrap().unwrap();
    assert_eq!(stored.data["tokenSha256"], sha256_hex(token.as_bytes()));
    assert!(!stored.data.to_string().contains(&token));
    let kinds: Vec<String> = crate::events::read_after(&w.state.store, 0, 100).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds.iter().filter(|k| *k == "node.enrolled").count(), 1);

    // hostnames: one label, not another node's
    let bad = w.agent("enroll", enroll_body(&w.code().await, "a.b", &new_token()), None).await;
    assert_eq!((bad.status, bad.code().as_str()), (StatusCode::BAD_REQUEST, "hostname-invalid"));
    let taken = w.agent("enroll", enroll_body(&w.code().await, "NODE-A", &new_token()), None).await;
    assert_eq!((taken.status, taken.code().as_str()), (StatusCode::CONFLICT, "hostname-in-use"));
    // a code renaming the machine records worker-<name>, whatever the machine said
    let named =
        w.jump(json!({"clusterId": w.cluster, "nodeName": "gras", "setHostname": true})).await["code"].as_str().unwrap().to_string();
    let reply = w.agent("enroll", enroll_body(&named, "localhost", &new_token()), None).await;
    assert_eq!(reply.json()["hostname"], "worker-gras");
    assert_eq!(w.node(reply.json()["nodeId"].as_str().unwrap()).await["name"], "gras");
    // a name alone is the node's name; the machine keeps its hostname
    let named = w.jump(json!({"clusterId": w.cluster, "nodeName": "lab-1"})).await["code"].as_str().unwrap().to_string();
    let reply = w.agent("enroll", enroll_body(&named, "bench-7", &new_token()), None).await;
    assert_eq!(reply.json()["hostname"], "bench-7");
    assert_eq!(w.node(reply.json()["nodeId"].as_str().unwrap()).await["name"], "lab-1");
    // a bad body names its member; an unknown protocol is refused by name
    let code = w.code().await;
    let mut missing = enroll_body(&code, "node-z", &new_token());
    missing.as_object_mut().unwrap().remove("agentVersion");
    let reply = w.agent("enroll", missing, None).await;
    assert_eq!((reply.status, reply.code().as_str()), (StatusCode::BAD_REQUEST, "invalid-request"));
    let mut short = enroll_body(&code, "node-z", &new_token());
    short["tokenSha256"] = json!("abc");
    assert_eq!(w.agent("enroll", short, None).await.json()["error"]["data"]["field"], "tokenSha256");
    let mut old = enroll_body(&code, "node-z", &new_token());
    old["protocol"] = json!("capstan-agent/0");
    let reply = w.agent("enroll", old, None).await;
    assert_eq!((reply.status, reply.code().as_str()), (StatusCode::UNPROCESSABLE_ENTITY, "protocol-unsupported"));
    assert_eq!(count(&w.state, nodes::CLUSTER_NODES).await, 3, "nothing refused wrote a node");
    // the code refused for a bad body still works
    assert_eq!(w.agent("enroll", enroll_body(&code, "node-z", &new_token()), None).await.status, StatusCode::OK);
}

#[tokio::test]
async fn heartbeats_are_judged_in_order_and_make_a_node_live_until_the_window_passes() {
    let w = World::new().await;
    let (id, token) = w.enroll("node-a").await;
    let good = json!({"protocol": PROTOCOL, "nodeId": id, "report": report(&json!("node-a"))});

    // oversize, before anything else (a bad token too)
    let big = json!({"protocol": PROTOCOL, "nodeId": id, "report": {"os": "x".repeat(17 * 1024)}});
    let reply = w.agent("heartbeat", big, Some("nope")).await;
    assert_eq!((reply.status, reply.code().as_str()), (StatusCode::PAYLOAD_TOO_LARGE, "request-too-large"));
    // an unknown protocol, before the token
    let mut offer = good.clone();
    offer["protocol"] = json!("capstan-agent/9");
    let reply = w.agent("heartbeat", offer, Some("nope")).await;
    assert_eq!((reply.status, reply.code().as_str()), (StatusCode::UNPROCESSABLE_ENTITY, "protocol-unsupported"));
    assert_eq!(reply.json()["error"]["data"]["served"], json!([PROTOCOL]));
    // a bad token (or none, or an unknown node), before the body
    let bad_body = json!({"protocol": PROTOCOL, "nodeId": id, "report": {"cpus": "many"}});
    for (node, bearer) in [(id.as_str(), Some(token.replace(|_| true, "0"))), (id.as_str(), None), ("node_unknown", Some(token.clone()))] {
        let reply =
            w.agent("heartbeat", json!({"protocol": PROTOCOL, "nodeId": node, "report": {"cpus": "many"}}), bearer.as_deref()).await;
        assert_eq!((reply.status, reply.code().as_str()), (StatusCode::UNAUTHORIZED, "node-unauthorized"));
        assert!(!reply.text().contains(&token));
    }
    // a bad body names the member, and nothing is written
    let before = w.node(&id).await;
    let reply = w.agent("heartbeat", bad_body, Some(&token)).await;
    assert_eq!((reply.status, reply.code().as_str()), (StatusCode::BAD_REQUEST, "invalid-request"));
    assert_eq!(reply.json()["error"]["data"]["field"], "report.cpus");
    let mut many = good.clone();
    many["report"]["addresses"] = json!(vec!["192.0.2.1"; 65]);
    assert_eq!(w.agent("heartbeat", many, Some(&token)).await.json()["error"]["data"]["field"], "report.addresses");
    let mut unknown = good.clone();
    unknown["report"]["docker"] = json!(true);
    assert_eq!(w.agent("heartbeat", unknown, Some(&token)).await.json()["error"]["data"]["field"], "report.docker");
    assert_eq!(w.node(&id).await, before, "refused beats write nothing");

    // accepted: a secret-free receipt, and the node reads live
    let reply = w.agent("heartbeat", good.clone(), Some(&token)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let receipt = reply.json();
    assert_eq!(receipt["protocol"], PROTOCOL);
    assert_eq!(receipt["accepted"], true);
    assert_eq!(receipt["nodeId"], id.as_str());
    assert_eq!(receipt["credentialGeneration"], 1);
    assert_eq!(receipt["freshForMs"], 180_000);
    assert!(!reply.text().contains(&token));
    let node = w.node(&id).await;
    assert_eq!((node["live"].as_bool(), node["liveness"].as_str()), (Some(true), Some("live")));
    assert_eq!(node["lastReportAt"], receipt["acceptedAt"]);
    assert_eq!(node["report"]["addresses"], json!(["192.0.2.10", "2001:db8::1"]));
    assert!(node.get("address").is_none(), "two addresses and none advertised: no address to send traffic to");
    let mut advertised = good.clone();
    advertised["report"]["advertisedAddress"] = json!("2001:db8::1");
    let reply = w.agent("heartbeat", advertised, Some(&token)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(w.node(&id).await["address"], "2001:db8::1", "the advertised address");
    let mut one = good.clone();
    one["report"]["addresses"] = json!(["192.0.2.10"]);
    let receipt = w.agent("heartbeat", one, Some(&token)).await.json();
    assert_eq!(w.node(&id).await["address"], "192.0.2.10", "the only address");
    let cluster = w.cluster.as_str();
    let snapshot = w.state.store.transact(|tx| async move { tx.get(nodes::CLUSTER_NODE_SNAPSHOTS, cluster).await }).await.unwrap().unwrap();
    assert_eq!(snapshot.data["nodes"][&id]["lastReportAt"], receipt["acceptedAt"]);

    // past the window it reads offline; the record keeps what the report said
    w.state.nodes.clock.advance(Duration::from_millis(180_001));
    let node = w.node(&id).await;
    assert_eq!((node["live"].as_bool(), node["liveness"].as_str()), (Some(false), Some("offline")));
    assert_eq!(node["report"]["os"], "Debian GNU/Linux 13");
    let listed = w.ok("nodes.list", json!({"clusterId": w.cluster})).await;
    assert_eq!(listed["items"][0]["liveness"], "offline");
    // a longer window, set as a setting, stands for longer
    let revision = w.ok("settings.get", json!({})).await["revision"].clone();
    w.ok("settings.update", json!({"expectedRevision": revision, "set": {"nodeObservationFreshnessMs": 600_000}})).await;
    assert_eq!(w.node(&id).await["live"], true);
    w.refused(
        "settings.update",
        json!({"expectedRevision": revision.as_u64().unwrap() + 1, "set": {"nodeObservationFreshnessMs": 5}}),
        "setting-invalid",
    )
    .await;
    // the next accepted report reads live again
    w.state.nodes.clock.advance(Duration::from_secs(3600));
    assert_eq!(w.node(&id).await["live"], false);
    assert_eq!(w.agent("heartbeat", good, Some(&token)).await.json()["freshForMs"], 600_000);
    assert_eq!(w.node(&id).await["live"], true);
}

#[tokio::test]
async fn rotation_needs_the_exact_generation_and_replays_its_mutation() {
    let w = World::new().await;
    let (id, old) = w.enroll("node-a").await;
    let new = new_token();
    let rotate = |generation: u64, token: &str, mutation: &str| json!({"nodeId": id, "tokenSha256": sha256_hex(token.as_bytes()), "expectedGeneration": generation, "mutationId": mutation});
    let err = w.refused("nodes.rotateCredential", rotate(2, &new, "m-1"), "conflict").await;
    assert_eq!(err.data.unwrap()["generation"], 1);
    w.refused("nodes.rotateCredential", rotate(1, &old, "m-1"), "invalid-request").await;
    let mut bad = rotate(1, &new, "m-1");
    bad["tokenSha256"] = json!("XYZ");
    w.refused("nodes.rotateCredential", bad, "invalid-request").await;
    w.refused("nodes.rotateCredential", rotate(1, &new, "bad id!"), "invalid-request").await;
    let mut missing = rotate(1, &new, "m-1");
    missing["nodeId"] = json!("node_nope");
    w.refused("nodes.rotateCredential", missing, "node-missing").await;

    let answer = w.ok("nodes.rotateCredential", rotate(1, &new, "m-1")).await;
    assert_eq!(
        (answer["generation"].as_u64(), answer["sessionEpoch"].as_u64(), answer["state"].as_str()),
        (Some(2), Some(2), Some("active"))
    );
    assert!(!answer.to_string().contains(&sha256_hex(new.as_bytes())), "metadata only");
    // the exact replay: the recorded answer, nothing changes
    assert_eq!(w.ok("nodes.rotateCredential", rotate(1, &new, "m-1")).await, answer);
    assert_eq!(w.ok("nodes.getCredential", json!({"nodeId": id})).await["generation"], 2);
    w.refused("nodes.rotateCredential", rotate(1, &new_token(), "m-1"), "mutation-reused").await;
    assert_eq!(w.node(&id).await["credentialGeneration"], 2);

    // the replaced token authenticates nothing; the new one does
    assert_eq!(w.beat(&id, &old).await.status, StatusCode::UNAUTHORIZED);
    let beat = w.beat(&id, &new).await;
    assert_eq!((beat.status, beat.json()["credentialGeneration"].as_u64()), (StatusCode::OK, Some(2)));

    // the agent rotates with its current bearer; an exact replay answers even with the token it replaced
    let third = new_token();
    let request = json!({"protocol": PROTOCOL, "nodeId": id, "tokenSha256": sha256_hex(third.as_bytes()), "expectedGeneration": 2, "mutationId": "agent-1"});
    let reply = w.agent("rotate", request.clone(), Some(&new)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let rotated = reply.json();
    assert_eq!((rotated["protocol"].as_str(), rotated["generation"].as_u64()), (Some(PROTOCOL), Some(3)));
    let replayed = w.agent("rotate", request.clone(), Some(&new)).await;
    assert_eq!((replayed.status, replayed.json()), (StatusCode::OK, rotated.clone()));
    assert_eq!(w.agent("rotate", request.clone(), Some(&third)).await.json(), rotated);
    assert_eq!(w.ok("nodes.getCredential", json!({"nodeId": id})).await["generation"], 3);
    assert_eq!(w.beat(&id, &new).await.status, StatusCode::UNAUTHORIZED, "a replay never reactivates replaced authority");
    let mut other = request.clone();
    other["expectedGeneration"] = json!(3);
    let reply = w.agent("rotate", other, Some(&new)).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "the replaced token only replays");
    let stale = json!({"protocol": PROTOCOL, "nodeId": id, "tokenSha256": sha256_hex(new_token().as_bytes()), "expectedGeneration": 2, "mutationId": "agent-2"});
    let reply = w.agent("rotate", stale, Some(&third)).await;
    assert_eq!((reply.status, reply.code().as_str()), (StatusCode::CONFLICT, "conflict"));
    assert_eq!(w.beat(&id, &third).await.status, StatusCode::OK);
}

#[tokio::test]
async fn revocation_stops_beats_by_name_and_replays() {
    let w = World::new().await;
    let (id, token) = w.enroll("node-a").await;
    assert_eq!(w.beat(&id, &token).await.status, StatusCode::OK);
    w.refused("nodes.revokeCredential", json!({"nodeId": id, "expectedGeneration": 3, "mutationId": "r-1"}), "conflict").await;
    let revoked = w.ok("nodes.revokeCredential", json!({"nodeId": id, "expectedGeneration": 1, "mutationId": "r-1"})).await;
    assert_eq!((revoked["state"].as_str(), revoked["generation"].as_u64()), (Some("revoked"), Some(2)));
    assert!(revoked["revokedAt"].is_u64());
    assert_eq!(w.ok("nodes.revokeCredential", json!({"nodeId": id, "expectedGeneration": 1, "mutationId": "r-1"})).await, revoked);
    w.refused("nodes.revokeCredential", json!({"nodeId": id, "expectedGeneration": 2, "mutationId": "r-2"}), "credential-revoked").await;
    w.refused(
        "nodes.rotateCredential",
        json!({"nodeId": id, "tokenSha256": sha256_hex(b"x"), "expectedGeneration": 2, "mutationId": "r-3"}),
        "credential-revoked",
    )
    .await;
    let beat = w.beat(&id, &token).await;
    assert_eq!((beat.status, beat.code().as_str()), (StatusCode::UNAUTHORIZED, "node-unauthorized"));
    let host = w.agent("host", json!({"protocol": PROTOCOL, "nodeId": id}), Some(&token)).await;
    assert_eq!((host.status, host.code().as_str()), (StatusCode::UNAUTHORIZED, "node-unauthorized"));
    assert_eq!(host.headers[header::CACHE_CONTROL], "no-store");
}

#[tokio::test]
async fn hostname_intents_are_set_reset_refused_and_fetched_by_the_agent() {
    let w = World::new().await;
    let (id, token) = w.enroll("node-a").await;
    let (other, _) = w.enroll("worker-b").await;
    let host = || w.agent("host", json!({"protocol": PROTOCOL, "nodeId": id}), Some(&token));
    let desired = host().await;
    assert_eq!(desired.status, StatusCode::OK);
    assert_eq!(desired.json(), json!({"protocol": PROTOCOL, "hostname": null, "generation": 0}));

    let set = |generation: u64, hostname: &str| json!({"nodeId": id, "expectedGeneration": generation, "hostname": hostname});
    w.refused("nodes.setHostname", set(0, "Bad.Name"), "hostname-invalid").await;
    w.refused("nodes.setHostname", set(0, "node-a"), "hostname-unchanged").await;
    w.refused("nodes.setHostname", set(0, "worker-b"), "hostname-in-use").await;
    w.refused("nodes.setHostname", set(1, "web-1"), "conflict").await;
    w.refused("nodes.setHostname", json!({"nodeId": "node_nope", "expectedGeneration": 0, "hostname": "web-1"}), "node-missing").await;
    let node = w.ok("nodes.setHostname", set(0, "web-1")).await;
    let intent = &node["hostnameIntent"];
    assert_eq!(
        (intent["hostname"].as_str(), intent["generation"].as_u64(), intent["name"].as_str()),
        (Some("web-1"), Some(1), Some("web-1"))
    );
    assert_eq!(intent["requestedBy"], w.admin.user_id.as_str());
    assert_eq!(host().await.json(), json!({"protocol": PROTOCOL, "hostname": "web-1", "generation": 1}));
    w.refused("nodes.setHostname", set(1, "web-1"), "hostname-unchanged").await;
    // another node may not be meant to carry it either
    w.refused("nodes.setHostname", json!({"nodeId": other, "expectedGeneration": 0, "hostname": "web-1"}), "hostname-in-use").await;

    // the reset: worker-<the intent's name>, or a stated name
    let reset = w.ok("nodes.resetHostname", json!({"nodeId": id, "expectedGeneration": 1})).await;
    assert_eq!(
        (reset["hostnameIntent"]["hostname"].as_str(), reset["hostnameIntent"]["generation"].as_u64()),
        (Some("worker-web-1"), Some(2))
    );
    w.refused("nodes.resetHostname", json!({"nodeId": id, "expectedGeneration": 2, "name": "Nope!"}), "name-invalid").await;
    w.refused("nodes.resetHostname", json!({"nodeId": id, "expectedGeneration": 2, "name": "b"}), "hostname-in-use").await;
    let named = w.ok("nodes.resetHostname", json!({"nodeId": id, "expectedGeneration": 2, "name": "gras"})).await;
    assert_eq!(
        (named["hostnameIntent"]["hostname"].as_str(), named["hostnameIntent"]["name"].as_str()),
        (Some("worker-gras"), Some("gras"))
    );
    assert_eq!(host().await.json()["hostname"], "worker-gras");

    // the agent reports what it applied on its next beat
    let mut beat = report(&json!("worker-gras"));
    beat["hostApply"] = json!({"generation": 3, "hostname": "worker-gras", "outcome": "applied"});
    let reply = w.agent("heartbeat", json!({"protocol": PROTOCOL, "nodeId": id, "report": beat}), Some(&token)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let node = w.node(&id).await;
    assert_eq!(node["hostname"], "worker-gras");
    assert_eq!(node["report"]["hostApply"]["outcome"], "applied");
    // the host route is judged like the heartbeat
    let reply = w.agent("host", json!({"protocol": PROTOCOL, "nodeId": id, "extra": 1}), Some(&token)).await;
    assert_eq!((reply.status, reply.code().as_str()), (StatusCode::BAD_REQUEST, "invalid-request"));
    let reply = w.post("/agent/v1/host", "x".repeat(1025), Some(&token)).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn retirement_revokes_and_only_retired_nodes_are_deleted() {
    let w = World::new().await;
    let (id, token) = w.enroll("node-a").await;
    let impact = w.ok("nodes.getDeletionImpact", json!({"id": id})).await;
    assert_eq!(impact["retired"], false);
    assert_eq!(impact["blockers"][0]["code"], "node-not-retired");
    let revision = w.node(&id).await["revision"].as_u64().unwrap();
    w.refused("nodes.delete", json!({"id": id, "expectedRevision": revision}), "node-not-retired").await;
    let cluster_revision = w.ok("clusters.get", json!({"id": w.cluster})).await["revision"].clone();
    w.refused("clusters.delete", json!({"id": w.cluster, "expectedRevision": cluster_revision}), "cluster-has-nodes").await;

    w.refused("nodes.retire", json!({"id": id, "expectedRevision": revision + 5}), "conflict").await;
    let retired = w.ok("nodes.retire", json!({"id": id, "expectedRevision": revision})).await;
    assert_eq!(retired["state"], "retired");
    assert!(retired["retiredAt"].is_u64());
    assert_eq!(w.ok("nodes.getCredential", json!({"nodeId": id})).await["state"], "revoked");
    assert_eq!(w.beat(&id, &token).await.status, StatusCode::UNAUTHORIZED);
    let revision = retired["revision"].as_u64().unwrap();
    w.refused("nodes.retire", json!({"id": id, "expectedRevision": revision}), "node-retired").await;
    w.refused("nodes.setHostname", json!({"nodeId": id, "expectedGeneration": 0, "hostname": "web-1"}), "node-retired").await;
    // a retired node's hostname is free again
    let (_, _) = w.enroll("node-a").await;
    assert_eq!(w.ok("nodes.getDeletionImpact", json!({"id": id})).await, json!({"id": id, "retired": true, "blockers": []}));
    w.refused("clusters.delete", json!({"id": w.cluster, "expectedRevision": cluster_revision}), "cluster-has-nodes").await;

    w.refused("nodes.delete", json!({"id": id, "expectedRevision": revision + 1}), "conflict").await;
    assert_eq!(w.ok("nodes.delete", json!({"id": id, "expectedRevision": revision})).await, json!({"id": id, "deleted": true}));
    w.refused("nodes.get", json!({"id": id}), "node-missing").await;
    w.refused("nodes.getCredential", json!({"nodeId": id}), "node-missing").await;
    let kinds: Vec<String> = crate::events::read_after(&w.state.store, 0, 100).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert!(kinds.contains(&"node.retired".to_string()) && kinds.contains(&"node.deleted".to_string()), "{kinds:?}");

    // the last node gone, the cluster goes
    let listed = w.ok("nodes.list", json!({"clusterId": w.cluster})).await;
    let last = listed["items"][0].clone();
    let retired = w.ok("nodes.retire", json!({"id": last["id"], "expectedRevision": last["revision"]})).await;
    w.ok("nodes.delete", json!({"id": last["id"], "expectedRevision": retired["revision"]})).await;
    w.ok("clusters.delete", json!({"id": w.cluster, "expectedRevision": cluster_revision})).await;
}

/// The nodes area's transactions on MongoDB (the wire server named by
/// `CAPSTAN_TEST_MONGODB_URL`, one call at a time: the stand-in isolates no concurrent
/// transactions, docs/compatibility.md): enrollment and its replay, beats under the credential
/// generation, rotation, revocation, hostname intents, retirement and deletion commit there as
/// they do on SQLite.
#[tokio::test]
async fn on_mongodb_enrollment_beats_rotation_revocation_and_retirement_commit() {
    let Ok(url) = std::env::var("CAPSTAN_TEST_MONGODB_URL") else {
        eprintln!("skipped: CAPSTAN_TEST_MONGODB_URL is not set (a MongoDB wire server such as nx-27017; .ci/peers.sh starts one)");
        return;
    };
    let w = World::on_mongodb(url.trim()).await;
    let code = w.code().await;
    let token = new_token();
    let body = enroll_body(&code, "node-m", &token);
    let first = w.agent("enroll", body.clone(), None).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let replay = w.agent("enroll", body, None).await;
    assert_eq!(replay.json(), first.json(), "an exact replay answers the recorded answer");
    assert_eq!(w.ok("nodes.list", json!({"clusterId": w.cluster})).await["items"].as_array().unwrap().len(), 1);
    let id = first.json()["nodeId"].as_str().unwrap().to_string();

    assert_eq!(w.beat(&id, &token).await.status, StatusCode::OK);
    assert_eq!(w.node(&id).await["liveness"], "live");
    let set = w.ok("nodes.setHostname", json!({"nodeId": id, "expectedGeneration": 0, "hostname": "renamed"})).await;
    assert_eq!(set["hostnameIntent"]["generation"], 1, "{set}");

    let rotated_token = new_token();
    let rotate =
        json!({"nodeId": id, "tokenSha256": sha256_hex(rotated_token.as_bytes()), "expectedGeneration": 1, "mutationId": "mut_m1"});
    let rotated = w.ok("nodes.rotateCredential", rotate.clone()).await;
    assert_eq!(rotated["generation"], 2);
    assert_eq!(w.ok("nodes.rotateCredential", rotate).await, rotated, "the mutation replays");
    assert_eq!(w.beat(&id, &token).await.status, StatusCode::UNAUTHORIZED, "the replaced token is refused");
    assert_eq!(w.beat(&id, &rotated_token).await.status, StatusCode::OK);

    let revoked = w.ok("nodes.revokeCredential", json!({"nodeId": id, "expectedGeneration": 2, "mutationId": "mut_m2"})).await;
    assert_eq!(revoked["state"], "revoked");
    assert_eq!(w.beat(&id, &rotated_token).await.status, StatusCode::UNAUTHORIZED);

    let node = w.node(&id).await;
    let retired = w.ok("nodes.retire", json!({"id": id, "expectedRevision": node["revision"]})).await;
    assert_eq!(retired["state"], "retired");
    w.ok("nodes.delete", json!({"id": id, "expectedRevision": retired["revision"]})).await;
    w.refused("nodes.get", json!({"id": id}), "node-missing").await;
}
