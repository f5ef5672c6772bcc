//! The runtime end to end on a real listener: a spec written, the producer's pass admitting
//! slots, a node's runtime session over the socket (offered with its node credential) pushed
//! its assignment with a pull credential and acknowledging it, its observation making the
//! target converge, a steady pass writing nothing, and the refusals a node's report gets.

use super::socket::{PASSWORD, Server, Ws, call, listen, next, open, send};
use crate::api::{Pages, router};
use crate::nodes::sha256_hex;
use serde_json::{Value, json};
use std::net::SocketAddr;

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const NONCE: &str = "8c6f0d2e-4b1a-4c3e-9f7a-2d5b6c7e8f90";

/// A host with an administrator on 127.0.0.1, its public origin https (machines enroll only so).
async fn serve() -> Server {
    serve_with(|_| {}).await
}

/// [`serve`], its state adjusted first.
async fn serve_with(adjust: impl FnOnce(&mut crate::state::AppState)) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let mut state = crate::state::test_state_at(dir.path(), "https://capstan.test", false).await;
    adjust(&mut state);
    crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
    let token = state.auth.login("admin", PASSWORD, None).await.unwrap().token;
    let addr = listen(router(state.clone(), Pages::none())).await;
    Server { _dir: dir, state, addr, token }
}

async fn http(addr: SocketAddr, method: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(format!("http://{addr}{method}")).header("content-type", "application/json");
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let reply = request.body(body.to_string()).send().await.unwrap();
    let status = reply.status().as_u16();
    (status, serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap_or(Value::Null))
}

async fn admin(server: &Server, method: &str, body: Value) -> Value {
    let (status, answer) = http(server.addr, &format!("/api/v1/{method}"), Some(&server.token), body.clone()).await;
    assert_eq!(status, 200, "{method} {body}: {answer}");
    answer
}

/// The workloads repository of the service named `web` with id `service`.
fn repository(service: &str) -> String {
    format!("workloads/web-{}", &service["svc_".len().."svc_".len() + 12])
}

/// An organization, a cluster, a service pinned by digest in this host's registry, and one
/// enrolled node: (service, cluster, node, node token).
async fn world(server: &Server) -> (String, String, String, String) {
    let org = admin(server, "organizations.create", json!({ "name": "acme" })).await["id"].as_str().unwrap().to_string();
    let cluster = admin(server, "clusters.create", json!({ "name": "edge" })).await["cluster"]["id"].as_str().unwrap().to_string();
    let created = admin(
        server,
        "services.create",
        json!({ "organizationId": org, "name": "web", "image": "nginx:1", "ports": [{ "port": 8080, "protocol": "http" }] }),
    )
    .await;
    let service = created["id"].as_str().unwrap().to_string();
    // pinned in the service's own repository (one of another organization's is not run)
    let image = format!("capstan.test/{}@{DIGEST}", repository(&service));
    admin(server, "services.update", json!({ "id": service, "expectedRevision": created["revision"], "image": image })).await;
    let code = admin(server, "nodes.createJumpCommand", json!({ "clusterId": cluster })).await["code"].as_str().unwrap().to_string();
    let token = hex::encode(rand::random::<[u8; 32]>());
    let body = json!({ "protocol": "capstan-agent/1", "code": code, "hostname": "edge-1", "tokenSha256": sha256_hex(token.as_bytes()), "agentVersion": "0.1.0" });
    let (status, enrolled) = http(server.addr, "/agent/v1/enroll", None, body).await;
    assert_eq!(status, 200, "{enrolled}");
    (service, cluster, enrolled["nodeId"].as_str().unwrap().to_string(), token)
}

/// A node's socket: offered as `agent` with its node id and token.
async fn node_socket(addr: SocketAddr, node: &str, token: &str) -> (Ws, Value) {
    let mut ws = super::socket::connect(addr, None).await;
    send(&mut ws, json!({ "type": "offer", "kind": "agent", "protocols": ["capstan-socket/1"], "node": node, "token": token })).await;
    let welcome = next(&mut ws).await;
    (ws, welcome)
}

/// The upgrade of a node's own socket: its token as the bearer, its id beside it (`node`).
async fn node_upgrade(addr: SocketAddr, token: &str, node: Option<&str>) -> Result<Ws, String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{addr}/api/v1/socket").into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    if let Some(node) = node {
        request.headers_mut().insert(capstan_core::wire::NODE_HEADER, node.parse().unwrap());
    }
    tokio_tungstenite::connect_async(request).await.map(|(ws, _)| ws).map_err(|e| e.to_string())
}

/// The world's service on every node, its node's session registered and pushed the run:
/// (service, the node's socket, the push).
async fn pushed_a_run(server: &Server) -> (String, Ws, Value) {
    let (service, cluster, node, token) = world(server).await;
    admin(
        server,
        "runtime.setServiceSpec",
        json!({ "serviceId": service, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true }, "replicasPerNode": 1 }),
    )
    .await;
    pass(server).await;
    let (mut ws, _) = node_socket(server.addr, &node, &token).await;
    call(&mut ws, 1, "runtime.registerSession", json!({ "nodeId": node, "nonce": NONCE })).await;
    deliver(server).await;
    let push = next(&mut ws).await;
    (service, ws, push)
}

async fn pass(server: &Server) -> crate::runtime::producer::PassReport {
    crate::runtime::producer::pass(&server.state.runtime).await.unwrap()
}

/// One delivery pass (the loops `serve` runs are not running here); how many pushes it sent.
async fn deliver(server: &Server) -> usize {
    crate::runtime::sessions::deliver(&server.state.runtime).await.unwrap()
}

#[tokio::test]
async fn a_spec_runs_on_its_node_through_the_session_and_a_steady_fleet_writes_nothing() {
    let server = serve().await;
    let (service, cluster, node, token) = world(&server).await;
    // a wrong token or a token without its node is refused at the offer
    let (mut bad, refused) = node_socket(server.addr, &node, &"0".repeat(64)).await;
    assert_eq!(refused["error"]["code"], "unauthenticated", "{refused}");
    assert_eq!(super::socket::closed_with(&mut bad).await.map(|c| c.0), Some(4003));

    let spec = admin(
        &server,
        "runtime.setServiceSpec",
        json!({ "serviceId": service, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true },
                "replicasPerNode": 1, "health": { "kind": "http", "port": 8080, "path": "/" } }),
    )
    .await;
    assert_eq!(spec["revision"], 1, "{spec}");
    assert_eq!(spec["health"]["intervalMs"], 5000, "defaults are stored: {spec}");
    // the service states where it runs, and its deletion now waits for the runtime
    let got = admin(&server, "services.get", json!({ "id": service })).await;
    assert_eq!(got["runtime"][0]["clusterId"], cluster.as_str(), "{got}");
    assert_eq!(got["holds"], json!(["host:runtime"]), "{got}");

    let first = pass(&server).await;
    assert_eq!(first.writes, 2, "one slot admitted and the verdict written: {first:?}");
    let status = admin(&server, "runtime.getServiceStatus", json!({ "serviceId": service })).await;
    let target = &status["targets"][0];
    assert_eq!(target["verdict"], json!({ "state": "waiting", "reason": "node-offline" }), "the node never reported: {status}");
    assert_eq!(target["slots"][0]["slot"], format!("{node}.0"));
    assert_eq!(target["slots"][0]["phase"], "pending");

    // the node's runtime session: registered, then pushed its assignment
    let (mut ws, welcome) = node_socket(server.addr, &node, &token).await;
    assert_eq!(welcome["node"]["nodeId"], node.as_str(), "{welcome}");
    let early = call(&mut ws, 1, "runtime.reportReceipt", json!({ "assignmentId": "asg_x", "generation": 2 })).await;
    assert_eq!(early["error"]["data"]["reason"], "session-unknown", "{early}");
    let registered = call(&mut ws, 2, "runtime.registerSession", json!({ "nodeId": node, "nonce": NONCE, "agentVersion": "0.1.0" })).await;
    assert_eq!(registered["result"]["clusterId"], cluster.as_str(), "{registered}");
    let epoch = registered["result"]["sessionEpoch"].clone();
    let replay = call(&mut ws, 3, "runtime.registerSession", json!({ "nodeId": node, "nonce": NONCE })).await;
    assert_eq!(replay["result"]["sessionEpoch"], epoch, "the same nonce on the same socket is a replay");
    assert_eq!(deliver(&server).await, 1);
    assert_eq!(deliver(&server).await, 0, "a push in flight is not pushed again");
    let request = next(&mut ws).await;
    assert_eq!((request["type"].as_str(), request["method"].as_str()), (Some("request"), Some("runtime.assign")), "{request}");
    let body = &request["body"];
    assert_eq!((body["intent"].as_str(), body["generation"].as_u64()), (Some("run"), Some(1)), "{body}");
    assert_eq!(body["work"]["image"], format!("capstan.test/{}@{DIGEST}", repository(&service)));
    assert_eq!(body["pull"]["server"], "capstan.test");
    assert!(body["pull"]["username"].as_str().unwrap().starts_with("capstan-pull."), "{body}");
    let assignment = body["assignmentId"].as_str().unwrap().to_string();
    // the pull credential is the registry's, for that repository and assignment only
    let password = body["pull"]["password"].as_str().unwrap();
    let stored =
        server.state.store.transact(|tx| async move { tx.scan(capstan_registry::pulls::PULL_CREDENTIALS, None, 10).await }).await.unwrap();
    assert_eq!(stored.documents.len(), 1);
    assert_eq!(stored.documents[0].data["holder"], assignment.as_str());
    assert!(!stored.documents[0].data.to_string().contains(password), "only the secret's hash is stored");
    send(&mut ws, json!({ "type": "reply", "id": request["id"], "result": { "accepted": true } })).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(deliver(&server).await, 0, "an acknowledged revision is not pushed again to this session");

    // what the node says of it
    let observe = |id: u64, phase: &str, ready: bool| {
        json!({ "type": "call", "id": id, "method": "runtime.reportObservation",
                "body": { "assignmentId": assignment, "generation": 1, "phase": phase, "ready": ready, "imageDigest": DIGEST, "restartCount": 0, "observedAt": 1 } })
    };
    send(&mut ws, observe(4, "running", true)).await;
    let answer = next(&mut ws).await;
    assert_eq!(answer["result"], json!({ "accepted": true, "changed": true }), "{answer}");
    send(&mut ws, observe(5, "running", true)).await;
    assert_eq!(next(&mut ws).await["result"]["changed"], false, "the same observation writes nothing");

    // the node is live once it beats; the target converges, and steady passes write nothing
    let beat = json!({ "protocol": "capstan-agent/1", "nodeId": node, "report": {
        "hostname": "edge-1", "os": "Debian GNU/Linux 13", "kernel": "6.12.0", "arch": "x86_64", "cpus": 2, "memoryBytes": 1u64 << 30,
        "diskBytes": 1u64 << 34, "diskFreeBytes": 1u64 << 33, "agentVersion": "0.1.0", "uptimeSeconds": 10, "addresses": ["192.0.2.10"] } });
    let (status, answer) = http(server.addr, "/agent/v1/heartbeat", Some(&token), beat).await;
    assert_eq!(status, 200, "{answer}");
    pass(&server).await;
    let status = admin(&server, "runtime.getServiceStatus", json!({ "serviceId": service })).await;
    assert_eq!(status["targets"][0]["verdict"], json!({ "state": "converged" }), "{status}");
    assert_eq!(status["targets"][0]["slots"][0]["imageDigest"], DIGEST);
    for _ in 0..3 {
        let steady = pass(&server).await;
        assert_eq!((steady.targets, steady.writes), (1, 0), "a steady pass writes nothing: {steady:?}");
    }

    // reports the node has no business making are refused by name
    let foreign = call(&mut ws, 6, "runtime.reportReceipt", json!({ "assignmentId": "asg_nosuch", "generation": 2 })).await;
    assert_eq!(foreign["error"]["code"], "runtime-session-report-refused");
    assert_eq!(foreign["error"]["data"]["reason"], "assignment-unknown", "an orphan's container is the agent's to remove");
    let early = call(&mut ws, 7, "runtime.reportReceipt", json!({ "assignmentId": assignment, "generation": 2 })).await;
    assert_eq!(early["error"]["data"]["reason"], "not-current", "{early}");
    let other = call(&mut ws, 8, "services.list", json!({})).await;
    assert_eq!(other["error"]["code"], "forbidden", "a node's session calls only its runtime methods: {other}");
    let (_, over_http) = http(server.addr, "/api/v1/runtime.registerSession", Some(&server.token), json!({})).await;
    assert_eq!(over_http["error"]["code"], "socket-required", "{over_http}");

    // a hold stops the slot; the node's receipts walk it to its release, and the pull
    // credential is revoked with the stop
    let held = admin(
        &server,
        "runtime.setServiceSpec",
        json!({ "serviceId": service, "clusterId": cluster, "expectedRevision": 1, "placement": { "everyNode": true }, "replicasPerNode": 1, "hold": true }),
    )
    .await;
    assert_eq!(held["revision"], 2);
    pass(&server).await;
    deliver(&server).await;
    let stop = next(&mut ws).await;
    assert_eq!(
        (stop["body"]["intent"].as_str(), stop["body"]["assignmentId"].as_str()),
        (Some("stop"), Some(assignment.as_str())),
        "{stop}"
    );
    assert!(stop["body"].get("pull").is_none(), "a stop carries no credential");
    send(&mut ws, json!({ "type": "reply", "id": stop["id"], "result": { "accepted": true } })).await;
    let stored =
        server.state.store.transact(|tx| async move { tx.scan(capstan_registry::pulls::PULL_CREDENTIALS, None, 10).await }).await.unwrap();
    assert!(stored.documents.is_empty(), "revoked with the stop");
    let receipt = call(&mut ws, 9, "runtime.reportReceipt", json!({ "assignmentId": assignment, "generation": 2 })).await;
    assert_eq!(receipt["result"]["changed"], true, "{receipt}");
    pass(&server).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    deliver(&server).await;
    let remove = next(&mut ws).await;
    assert_eq!(remove["body"]["intent"], "remove", "{remove}");
    send(&mut ws, json!({ "type": "reply", "id": remove["id"], "result": { "accepted": true } })).await;
    call(&mut ws, 10, "runtime.reportReceipt", json!({ "assignmentId": assignment, "generation": 3 })).await;
    pass(&server).await;
    let status = admin(&server, "runtime.getServiceStatus", json!({ "serviceId": service })).await;
    assert_eq!(status["targets"][0]["slots"], json!([]), "the settled slot is released: {status}");
    assert_eq!(status["targets"][0]["verdict"], json!({ "state": "converged" }), "{status}");

    // what happened, in order and in words
    let events = admin(&server, "runtime.getServiceEvents", json!({ "serviceId": service })).await;
    let kinds: Vec<&str> = events["items"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    let wanted = ["scheduled", "ready", "stopping", "stopped", "removing", "removed", "released"];
    let mut seen = kinds.iter().filter(|k| wanted.contains(k));
    assert!(wanted.iter().all(|w| seen.any(|k| k == w)), "in order: {kinds:?}");
    assert!(events["items"][0]["words"].as_str().unwrap().starts_with("scheduled on node"), "{events}");
    let after = admin(&server, "runtime.getServiceEvents", json!({ "serviceId": service, "after": events["nextCursor"] })).await;
    assert_eq!(after["items"], json!([]), "nothing after the newest");
    let (status, refused) =
        http(server.addr, "/api/v1/runtime.getServiceEvents", Some(&server.token), json!({ "serviceId": service, "after": "svc_other.1" }))
            .await;
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("cursor-invalid")));

    // deleting the held spec; then the service's deletion is no longer held by the runtime
    admin(&server, "runtime.deleteServiceSpec", json!({ "serviceId": service, "clusterId": cluster, "expectedRevision": 2 })).await;
    drop(ws);
}

#[tokio::test]
async fn spec_writes_are_refused_by_name() {
    let server = serve().await;
    let (service, cluster, node, _) = world(&server).await;
    let refused = |body: Value, code: &'static str| {
        let server = &server;
        async move {
            let (status, answer) = http(server.addr, "/api/v1/runtime.setServiceSpec", Some(&server.token), body.clone()).await;
            assert_eq!(answer["error"]["code"], code, "{body}: {status} {answer}");
        }
    };
    let base = json!({ "serviceId": service, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true }, "replicasPerNode": 1 });
    let with = |patch: Value| {
        let mut body = base.clone();
        body.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
        body
    };
    refused(with(json!({ "clusterId": "cluster_nosuch" })), "cluster-not-found").await;
    refused(with(json!({ "serviceId": "svc_nosuch" })), "service-not-found").await;
    refused(with(json!({ "placement": { "nodes": ["node_nosuch"] } })), "node-not-in-cluster").await;
    refused(with(json!({ "placement": { "nodes": [node.clone(), node.clone()] } })), "invalid-request").await;
    refused(with(json!({ "placement": { "everyNode": true, "nodes": [node.clone()] } })), "invalid-request").await;
    refused(with(json!({ "replicasPerNode": 17 })), "replica-limit").await;
    refused(with(json!({ "health": { "kind": "tcp", "port": 9999 } })), "health-port-undeclared").await;
    refused(with(json!({ "health": { "kind": "http", "port": 8080, "path": "no-slash" } })), "invalid-request").await;
    refused(with(json!({ "expectedRevision": 3 })), "conflict").await;
    refused(with(json!({ "surprise": true })), "invalid-request").await;
    refused(with(json!({ "heldNodes": ["node_nosuch"] })), "node-not-in-cluster").await;
    refused(with(json!({ "heldNodes": [node.clone(), node.clone()] })), "invalid-request").await;
    refused(with(json!({ "heldNodes": "all" })), "invalid-request").await;
    // held nodes: kept by a write that does not name them, released by one naming none
    let held =
        admin(&server, "runtime.setServiceSpec", with(json!({ "placement": { "nodes": [node.clone()] }, "heldNodes": [node.clone()] })))
            .await;
    assert_eq!(held["heldNodes"], json!([node.clone()]), "{held}");
    let kept =
        admin(&server, "runtime.setServiceSpec", with(json!({ "expectedRevision": 1, "placement": { "nodes": [node.clone()] } }))).await;
    assert_eq!((kept["revision"].as_u64(), &kept["heldNodes"]), (Some(2), &json!([node.clone()])), "{kept}");
    let released =
        admin(&server, "runtime.setServiceSpec", with(json!({ "expectedRevision": 2, "placement": { "nodes": [node] }, "heldNodes": [] })))
            .await;
    assert_eq!(released["heldNodes"], json!([]), "{released}");
    refused(base.clone(), "conflict").await;
    let (_, answer) = http(
        server.addr,
        "/api/v1/runtime.deleteServiceSpec",
        Some(&server.token),
        json!({ "serviceId": service, "clusterId": cluster, "expectedRevision": 3 }),
    )
    .await;
    assert_eq!(answer["error"]["code"], "spec-not-held", "{answer}");
}

/// Enroll one more node into `cluster`: (node, token).
async fn enroll(server: &Server, cluster: &str, hostname: &str) -> (String, String) {
    let code = admin(server, "nodes.createJumpCommand", json!({ "clusterId": cluster })).await["code"].as_str().unwrap().to_string();
    let token = hex::encode(rand::random::<[u8; 32]>());
    let body = json!({ "protocol": "capstan-agent/1", "code": code, "hostname": hostname, "tokenSha256": sha256_hex(token.as_bytes()), "agentVersion": "0.1.0" });
    let (status, enrolled) = http(server.addr, "/agent/v1/enroll", None, body).await;
    assert_eq!(status, 200, "{enrolled}");
    (enrolled["nodeId"].as_str().unwrap().to_string(), token)
}

/// The next frame the relay is sent about `node` (frames about other nodes are not expected).
async fn for_node(ws: &mut Ws, node: &str) -> Value {
    let frame = next(ws).await;
    assert_eq!(frame["node"], node, "{frame}");
    frame
}

#[tokio::test]
async fn a_relay_carries_its_clusters_node_sessions_each_judged_by_its_own_credential() {
    let server = serve().await;
    let (service, cluster, node_a, token_a) = world(&server).await;
    let (node_b, token_b) = enroll(&server, &cluster, "edge-2").await;
    let other = admin(&server, "clusters.create", json!({ "name": "far" })).await["cluster"]["id"].as_str().unwrap().to_string();
    let (foreign, foreign_token) = enroll(&server, &other, "far-1").await;
    // the cluster's relay: a zone, the relay enabled, its bearer exported
    let revision = admin(&server, "settings.get", json!({})).await["revision"].clone();
    admin(&server, "settings.update", json!({ "expectedRevision": revision, "set": { "clusterRelayZone": "relays.example.com" } })).await;
    let got = admin(&server, "clusters.get", json!({ "id": cluster })).await;
    admin(&server, "clusters.enableRelay", json!({ "id": cluster, "expectedRevision": got["revision"] })).await;
    admin(&server, "relays.mutateCredential", json!({ "clusterId": cluster, "action": "ensure", "mutationId": "mint-1" })).await;
    let exported = admin(&server, "relays.exportAuthorization", json!({ "clusterId": cluster, "expectedGeneration": 1 })).await;
    let bearer = exported["authorization"].as_str().unwrap();
    let (mut relay, welcome) = super::socket::open(server.addr, "relay", Some(bearer)).await;
    assert_eq!(welcome["limits"]["outboundQueue"], crate::sessions::RELAY_OUTBOUND_QUEUE, "{welcome}");

    // the relay is a carrier, not an authority: a wrong token, or a node of another cluster, is refused
    send(&mut relay, json!({ "type": "node-open", "node": node_a, "token": "0".repeat(64) })).await;
    assert_eq!(for_node(&mut relay, &node_a).await["error"]["code"], "unauthenticated");
    send(&mut relay, json!({ "type": "node-open", "node": foreign, "token": foreign_token })).await;
    let refused = for_node(&mut relay, &foreign).await;
    assert_eq!((refused["type"].as_str(), refused["error"]["code"].as_str()), (Some("node-refused"), Some("relay-node-foreign")));
    for (node, token) in [(&node_a, &token_a), (&node_b, &token_b)] {
        send(&mut relay, json!({ "type": "node-open", "node": node, "token": token })).await;
        assert_eq!(for_node(&mut relay, node).await["type"], "node-opened");
    }
    // a node's frame before its open, or of a node never opened, closes that node's link only
    send(&mut relay, json!({ "type": "node", "node": foreign, "frame": { "type": "call", "id": 1, "method": "runtime.registerSession" } }))
        .await;
    let closed = for_node(&mut relay, &foreign).await;
    assert_eq!((closed["type"].as_str(), closed["error"]["data"]["reason"].as_str()), (Some("node-close"), Some("session-unknown")));

    // each node registers its own session over the one socket
    let carried = |node: &str, id: u64, method: &str, body: Value| json!({ "type": "node", "node": node, "frame": { "type": "call", "id": id, "method": method, "body": body } });
    for (n, node) in [&node_a, &node_b].into_iter().enumerate() {
        let nonce = format!("8c6f0d2e-4b1a-4c3e-9f7a-2d5b6c7e8f9{n}");
        send(&mut relay, carried(node, 1, "runtime.registerSession", json!({ "nodeId": node, "nonce": nonce }))).await;
        let answer = for_node(&mut relay, node).await;
        assert_eq!(answer["frame"]["result"]["clusterId"], cluster.as_str(), "{answer}");
    }
    // a carried node may not name another node, nor call anything but its runtime methods
    send(&mut relay, carried(&node_a, 2, "runtime.registerSession", json!({ "nodeId": node_b, "nonce": NONCE }))).await;
    assert_eq!(for_node(&mut relay, &node_a).await["frame"]["error"]["data"]["reason"], "request-invalid");
    send(&mut relay, carried(&node_a, 3, "services.list", json!({}))).await;
    assert_eq!(for_node(&mut relay, &node_a).await["frame"]["error"]["code"], "forbidden");
    assert_eq!(server.state.runtime.sessions.count(), 2);

    // one replica on each node: each push reaches its own node through the relay
    admin(
        &server,
        "runtime.setServiceSpec",
        json!({ "serviceId": service, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true }, "replicasPerNode": 1 }),
    )
    .await;
    pass(&server).await;
    assert_eq!(deliver(&server).await, 2);
    let mut pushed = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let frame = next(&mut relay).await;
        assert_eq!(frame["type"], "node", "{frame}");
        let request = &frame["frame"];
        assert_eq!(request["method"], "runtime.assign", "{frame}");
        let node = frame["node"].as_str().unwrap().to_string();
        assert_eq!(request["body"]["slot"], format!("{node}.0"), "a node is pushed its own slot only: {frame}");
        send(
            &mut relay,
            json!({ "type": "node", "node": node, "frame": { "type": "reply", "id": request["id"], "result": { "accepted": true } } }),
        )
        .await;
        pushed.insert(node, request["body"]["assignmentId"].as_str().unwrap().to_string());
    }
    assert_eq!(pushed.len(), 2, "both nodes were pushed: {pushed:?}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(deliver(&server).await, 0, "acknowledged through the relay");
    // a carried node's report lands on its own slot
    let observation = json!({ "assignmentId": pushed[&node_b], "generation": 1, "phase": "running", "ready": true, "observedAt": 1 });
    send(&mut relay, carried(&node_b, 4, "runtime.reportObservation", observation)).await;
    assert_eq!(for_node(&mut relay, &node_b).await["frame"]["result"]["changed"], true);
    let stolen = json!({ "assignmentId": pushed[&node_b], "generation": 1, "phase": "exited", "ready": false, "observedAt": 2 });
    send(&mut relay, carried(&node_a, 5, "runtime.reportObservation", stolen)).await;
    assert_eq!(for_node(&mut relay, &node_a).await["frame"]["error"]["data"]["reason"], "assignment-unknown", "not node A's slot");

    // one node leaving the relay leaves the other's session alone; the relay leaving ends both
    send(&mut relay, json!({ "type": "node-close", "node": node_a })).await;
    send(
        &mut relay,
        carried(
            &node_b,
            6,
            "runtime.reportObservation",
            json!({ "assignmentId": pushed[&node_b], "generation": 1, "phase": "running", "ready": true, "observedAt": 3 }),
        ),
    )
    .await;
    assert_eq!(for_node(&mut relay, &node_b).await["frame"]["result"]["accepted"], true);
    assert_eq!(server.state.runtime.sessions.nodes(), vec![node_b.clone()]);
    // the node reaches Capstan directly meanwhile: a session of its own socket, the carried one untouched
    let (mut direct, _) = node_socket(server.addr, &node_a, &token_a).await;
    let registered = call(&mut direct, 1, "runtime.registerSession", json!({ "nodeId": node_a, "nonce": NONCE })).await;
    assert!(registered["result"]["sessionEpoch"].is_u64(), "{registered}");
    assert_eq!(server.state.runtime.sessions.count(), 2);
    drop(relay);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.state.runtime.sessions.nodes() != vec![node_a.clone()] {
        assert!(tokio::time::Instant::now() < deadline, "the relay's sessions ended with it: {:?}", server.state.runtime.sessions.nodes());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_node_proves_the_key_it_drew_and_each_proof_is_a_new_generation() {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let server = serve().await;
    let (_service, _cluster, node, token) = world(&server).await;
    let (mut ws, _) = node_socket(server.addr, &node, &token).await;
    let early = call(&mut ws, 1, "runtime.enrollRecipient", json!({ "publicKey": b64.encode([9u8; 32]) })).await;
    assert_eq!(early["error"]["data"]["reason"], "session-unknown", "{early}");
    call(&mut ws, 2, "runtime.registerSession", json!({ "nodeId": node, "nonce": NONCE })).await;

    let secret = x25519_dalek::StaticSecret::from([5u8; 32]);
    let public = b64.encode(x25519_dalek::PublicKey::from(&secret).as_bytes());
    let short = call(&mut ws, 3, "runtime.enrollRecipient", json!({ "publicKey": b64.encode([1u8; 31]) })).await;
    assert_eq!(short["error"]["data"]["reason"], "request-invalid", "{short}");
    let weak = call(&mut ws, 30, "runtime.enrollRecipient", json!({ "publicKey": b64.encode([0u8; 32]) })).await;
    assert_eq!(weak["error"]["data"]["reason"], "request-invalid", "a low-order point opens for anyone: {weak}");
    // a wrong answer is refused, and the challenge is spent
    let enrolled = call(&mut ws, 4, "runtime.enrollRecipient", json!({ "publicKey": public })).await;
    let challenge_id = enrolled["result"]["challengeId"].as_str().unwrap().to_string();
    let wrong = call(&mut ws, 5, "runtime.proveRecipient", json!({ "challengeId": challenge_id, "answer": b64.encode([0u8; 32]) })).await;
    assert_eq!(wrong["error"]["data"]["reason"], "recipient-proof-invalid", "{wrong}");
    let spent = call(&mut ws, 6, "runtime.proveRecipient", json!({ "challengeId": challenge_id, "answer": b64.encode([0u8; 32]) })).await;
    assert_eq!(spent["error"]["data"]["reason"], "recipient-challenge-unknown", "{spent}");
    let got = admin(&server, "nodes.get", json!({ "id": node })).await;
    assert!(got.get("recipient").is_none(), "nothing proven yet: {got}");

    // only the private key's holder opens the challenge; its answer makes generation 1
    let prove = |ws_id: u64, enrolled: &Value, key: &x25519_dalek::StaticSecret| {
        let id = enrolled["result"]["challengeId"].as_str().unwrap().to_string();
        let sealed: capstan_core::sealed::SealedInput = serde_json::from_value(enrolled["result"]["challenge"].clone()).unwrap();
        let target = crate::runtime::sessions::challenge_target(&node, &id);
        let answer = capstan_core::sealed::open_as(key, &target, &sealed).map(|a| b64.encode(a.as_slice()));
        (ws_id, id, answer)
    };
    let enrolled = call(&mut ws, 7, "runtime.enrollRecipient", json!({ "publicKey": public })).await;
    let (_, id, answer) = prove(8, &enrolled, &x25519_dalek::StaticSecret::from([6u8; 32]));
    assert!(answer.is_err(), "another key does not open the challenge");
    let (_, _, answer) = prove(8, &enrolled, &secret);
    let proven = call(&mut ws, 8, "runtime.proveRecipient", json!({ "challengeId": id, "answer": answer.unwrap() })).await;
    assert_eq!(proven["result"]["generation"], 1, "{proven}");
    let got = admin(&server, "nodes.get", json!({ "id": node })).await;
    assert_eq!(got["recipient"]["generation"], 1, "{got}");
    assert_eq!(got["recipient"]["publicKey"], public.as_str());
    assert!(got["recipient"]["enrolledAt"].as_u64().unwrap() > 0);
    assert!(got["recipient"].get("nonce").is_none(), "the agent process is not shown: {got}");

    // a restarted agent (a new session, a new key) proves generation 2
    drop(ws);
    let (mut ws, _) = node_socket(server.addr, &node, &token).await;
    call(&mut ws, 1, "runtime.registerSession", json!({ "nodeId": node, "nonce": "0b7e5a1c-2d3f-4a5b-8c6d-7e8f9a0b1c2d" })).await;
    let again = x25519_dalek::StaticSecret::from([11u8; 32]);
    let public = b64.encode(x25519_dalek::PublicKey::from(&again).as_bytes());
    let enrolled = call(&mut ws, 2, "runtime.enrollRecipient", json!({ "publicKey": public })).await;
    let (_, id, answer) = prove(3, &enrolled, &again);
    let proven = call(&mut ws, 3, "runtime.proveRecipient", json!({ "challengeId": id, "answer": answer.unwrap() })).await;
    assert_eq!(proven["result"]["generation"], 2, "{proven}");
    assert_eq!(admin(&server, "nodes.get", json!({ "id": node })).await["recipient"]["publicKey"], public.as_str());
}

/// Prove `secret`'s key on the session `ws` of `node` (calls `id` and `id + 1`): its generation.
async fn prove_key(ws: &mut Ws, id: u64, node: &str, secret: &x25519_dalek::StaticSecret) -> u64 {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let public = b64.encode(x25519_dalek::PublicKey::from(secret).as_bytes());
    let enrolled = call(ws, id, "runtime.enrollRecipient", json!({ "publicKey": public })).await;
    let challenge_id = enrolled["result"]["challengeId"].as_str().unwrap().to_string();
    let sealed: capstan_core::sealed::SealedInput = serde_json::from_value(enrolled["result"]["challenge"].clone()).unwrap();
    let target = crate::runtime::sessions::challenge_target(node, &challenge_id);
    let answer = b64.encode(capstan_core::sealed::open_as(secret, &target, &sealed).unwrap().as_slice());
    let proven = call(ws, id + 1, "runtime.proveRecipient", json!({ "challengeId": challenge_id, "answer": answer })).await;
    proven["result"]["generation"].as_u64().unwrap()
}

#[tokio::test]
async fn secret_material_reaches_the_node_sealed_to_its_proven_key_only() {
    const PLANTED: &str = "planted-runtime-secret-3f9a";
    let server = serve().await;
    let (service, cluster, node, token) = world(&server).await;
    let state = &server.state;
    let owner_ref = format!("service:{service}");
    let sealed = capstan_core::sealed::seal_to(
        state.keyring.ingress_id(),
        state.keyring.ingress_public_key(),
        &capstan_core::sealed::target("secrets.create", &owner_ref, "DB_PASSWORD"),
        PLANTED.as_bytes(),
    );
    let owner = json!({ "kind": "service", "serviceId": service });
    admin(&server, "secrets.create", json!({ "owner": owner, "key": "DB_PASSWORD", "value": { "sealed": sealed } })).await;
    admin(
        &server,
        "secrets.create",
        json!({ "owner": owner, "key": "TLS_KEY", "value": { "generate": { "length": 32, "alphabet": "hex" } } }),
    )
    .await;
    let spec = admin(
        &server,
        "runtime.setServiceSpec",
        json!({ "serviceId": service, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true },
                "replicasPerNode": 1, "secrets": { "files": ["TLS_KEY", "NOT_THERE"] } }),
    )
    .await;
    assert_eq!(spec["secrets"], json!({ "environment": "production", "files": ["NOT_THERE", "TLS_KEY"] }), "{spec}");
    pass(&server).await;
    let assignments = admin(&server, "runtime.getServiceAssignments", json!({ "serviceId": service })).await;
    let text = assignments.to_string();
    assert!(text.contains("DB_PASSWORD") && !text.contains(PLANTED), "pinned by name and version, never by value: {text}");

    // before the agent process proves its key, nothing is sealed to it
    let (mut ws, _) = node_socket(server.addr, &node, &token).await;
    call(&mut ws, 1, "runtime.registerSession", json!({ "nodeId": node, "nonce": NONCE })).await;
    assert_eq!(deliver(&server).await, 1);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let key = x25519_dalek::StaticSecret::from([21u8; 32]);
    let generation = prove_key(&mut ws, 2, &node, &key).await;
    assert_eq!(generation, 1);
    // the push refused for want of a recipient is pushed again, sealed to the proven key
    let mut request = Value::Null;
    for _ in 0..20 {
        deliver(&server).await;
        if let Ok(Ok(frame)) = tokio::time::timeout(std::time::Duration::from_millis(300), async { Ok::<_, ()>(next(&mut ws).await) }).await
        {
            request = frame;
            break;
        }
    }
    assert_eq!(request["method"], "runtime.assign", "{request}");
    let body = &request["body"];
    assert!(!request.to_string().contains(PLANTED), "the push carries sealed values only");
    let secrets = &body["secrets"];
    assert_eq!((secrets["recipientGeneration"].as_u64(), secrets["files"].clone()), (Some(1), json!(["TLS_KEY"])), "{secrets}");
    let manifest = secrets["manifest"].as_u64().unwrap();
    let (assignment, slot) = (body["assignmentId"].as_str().unwrap(), body["slot"].as_str().unwrap());
    let open = |name: &str, with: &x25519_dalek::StaticSecret, assignment: &str| {
        let sealed: capstan_core::sealed::SealedInput = serde_json::from_value(secrets["values"][name].clone()).unwrap();
        let target = crate::runtime::sessions::material_target(assignment, &service, slot, manifest, name);
        capstan_core::sealed::open_as(with, &target, &sealed).map(|v| v.to_vec())
    };
    assert_eq!(open("DB_PASSWORD", &key, assignment).unwrap(), PLANTED.as_bytes());
    assert_eq!(open("TLS_KEY", &key, assignment).unwrap().len(), 32);
    assert!(open("DB_PASSWORD", &x25519_dalek::StaticSecret::from([22u8; 32]), assignment).is_err(), "another key");
    assert!(open("DB_PASSWORD", &key, "asg_another").is_err(), "another assignment");
    let sealed: capstan_core::sealed::SealedInput = serde_json::from_value(secrets["values"]["DB_PASSWORD"].clone()).unwrap();
    for (slot, revision) in [(slot, manifest + 1), ("node_x.0", manifest)] {
        let elsewhere = crate::runtime::sessions::material_target(assignment, &service, slot, revision, "DB_PASSWORD");
        assert!(capstan_core::sealed::open_as(&key, &elsewhere, &sealed).is_err(), "another manifest revision or slot");
    }

    // the issuance is audited, value-free; no plaintext in the store's file
    let audit = admin(&server, "audit.list", json!({ "method": "runtime.issueMaterial" })).await;
    let record = &audit["records"][0];
    assert_eq!(record["actor"], json!({ "userId": node, "kind": "node" }), "{audit}");
    let targets = record["targets"].to_string();
    assert!(targets.contains(&service) && targets.contains(assignment) && targets.contains("recipient:1"), "{targets}");
    assert!(targets.contains(&format!("manifest:{manifest}")), "{targets}");

    // the preview names what the replica was handed, never a value; received once it reported
    let preview = admin(&server, "secrets.preview", json!({ "serviceId": service })).await;
    let replica = &preview["replicas"][0];
    assert_eq!(preview["manifestNumber"].as_u64(), Some(manifest), "{preview}");
    assert_eq!((replica["variables"].clone(), replica["files"].clone()), (json!(["DB_PASSWORD"]), json!(["TLS_KEY"])), "{preview}");
    assert_eq!((replica["manifest"].as_u64(), replica["received"].as_bool()), (Some(manifest), Some(false)), "{preview}");
    assert!(!preview.to_string().contains(PLANTED));
    let observed = json!({ "assignmentId": assignment, "generation": 1, "phase": "running", "ready": true, "observedAt": 1 });
    call(&mut ws, 10, "runtime.reportObservation", observed).await;
    let preview = admin(&server, "secrets.preview", json!({ "serviceId": service })).await;
    assert_eq!(preview["replicas"][0]["received"], true, "{preview}");
    for entry in std::fs::read_dir(server._dir.path()).unwrap().flatten() {
        if entry.path().is_file() {
            let bytes = std::fs::read(entry.path()).unwrap();
            assert!(!bytes.windows(PLANTED.len()).any(|w| w == PLANTED.as_bytes()), "{} holds the plaintext", entry.path().display());
        }
    }
}

#[tokio::test]
async fn a_nodes_log_batches_are_read_back_in_order_from_the_store_and_from_their_segment() {
    let server = serve().await;
    let (service, mut ws, push) = pushed_a_run(&server).await;
    assert_eq!(push["body"].get("logsFrom"), None, "nothing kept yet: a capture starts at the log's beginning");
    let assignment = push["body"]["assignmentId"].as_str().unwrap().to_string();
    let capture = "00112233445566ff";
    let entry = |ts: &str, stream: &str, line: &str| json!({ "ts": ts, "stream": stream, "line": line });
    let report = |sequence: u64, entries: Value, last: bool| json!({ "assignmentId": assignment, "captureId": capture, "sequence": sequence, "entries": entries, "final": last });
    let first = report(
        1,
        json!([entry("2026-12-06T10:00:00.1Z", "stdout", "starting"), entry("2026-12-06T10:00:00.2Z", "stderr", "warning: x")]),
        false,
    );
    assert_eq!(call(&mut ws, 2, "runtime.reportLogs", first.clone()).await["result"], json!({ "accepted": true, "replay": false }));
    assert_eq!(call(&mut ws, 3, "runtime.reportLogs", first).await["result"]["replay"], true);

    // a reader waiting for new lines is answered when they come
    let reader = {
        let (addr, token, service, assignment) = (server.addr, server.token.clone(), service.clone(), assignment.clone());
        tokio::spawn(async move {
            let body = json!({ "serviceId": service, "assignmentId": assignment, "cursor": "0.1", "waitMs": 10000 });
            http(addr, "/api/v1/runtime.getLogs", Some(&token), body).await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let lost = json!({ "entries": 2, "reason": "engine-error" });
    let mut third = report(3, json!([entry("2026-12-06T10:00:01Z", "stdout", "ready")]), false);
    third["lost"] = lost.clone();
    call(&mut ws, 4, "runtime.reportLogs", third).await;
    let (status, waited) = reader.await.unwrap();
    assert_eq!(status, 200, "{waited}");
    let kinds: Vec<&str> = waited["records"].as_array().unwrap().iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["gap", "batch"], "number 2 never came: {waited}");
    assert_eq!(waited["records"][1]["lost"], lost);
    call(&mut ws, 5, "runtime.reportLogs", report(4, json!([]), true)).await;

    let attempts = admin(&server, "runtime.getLogAttempts", json!({ "serviceId": service })).await;
    let item = &attempts["items"][0];
    assert_eq!((item["assignmentId"].as_str(), item["expiresAt"].clone()), (Some(assignment.as_str()), Value::Null), "{attempts}");
    assert_eq!((item["kept"]["entries"].as_u64(), item["captures"][0]["missing"].as_u64()), (Some(3), Some(1)), "{attempts}");
    let read = || admin(&server, "runtime.getLogs", json!({ "serviceId": service, "assignmentId": assignment }));
    let before = read().await;
    let lines: Vec<&str> = before["records"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["entries"].as_array().into_iter().flatten())
        .map(|e| e["line"].as_str().unwrap())
        .collect();
    assert_eq!(lines, ["starting", "warning: x", "ready"]);
    assert_eq!((before["end"].as_bool(), before["nextCursor"].as_str()), (Some(true), Some("0.4")));

    // the ended capture's payloads go into the bucket; the same records read back from there
    let drained = crate::runtime::logs::segments::drain(&server.state.runtime).await.unwrap();
    assert_eq!(drained.segments, 1);
    let listed = server.state.blobs.list(crate::runtime::logs::BUCKET_PREFIX, None, 10).await.unwrap();
    assert_eq!(listed.items[0].key, format!("runtime-logs/{service}/{assignment}/{capture}/1-4.jsonl"));
    assert_eq!(read().await, before);

    // the next push of the run says where a new capture starts
    let resumed = crate::runtime::logs::resume_of_store(&server.state.store, &assignment).await.unwrap();
    assert_eq!(resumed, Some(crate::runtime::logs::Resume { ts: "2026-12-06T10:00:01Z".into(), skip: 1 }));

    // refusals by name
    let (status, refused) =
        http(server.addr, "/api/v1/runtime.getLogs", Some(&server.token), json!({ "serviceId": service, "assignmentId": "asg_none" }))
            .await;
    assert_eq!((status, refused["error"]["code"].as_str()), (404, Some("attempt-not-found")), "{refused}");
    for (body, code) in [
        (json!({ "serviceId": service, "assignmentId": assignment, "cursor": "x" }), "cursor-invalid"),
        (json!({ "serviceId": service, "assignmentId": assignment, "cursor": "9.1" }), "cursor-invalid"),
        (json!({ "serviceId": service, "assignmentId": assignment, "limit": 0 }), "limit-invalid"),
    ] {
        let (status, refused) = http(server.addr, "/api/v1/runtime.getLogs", Some(&server.token), body).await;
        assert_eq!((status, refused["error"]["code"].as_str()), (400, Some(code)), "{refused}");
    }
}

#[tokio::test]
async fn a_node_connects_while_strangers_hold_every_slot_of_theirs() {
    let server = serve_with(super::socket::limits(|l| l.max_stranger_sessions = 1)).await;
    let (_, _, node, token) = world(&server).await;
    let _stranger = super::socket::connect(server.addr, None).await;
    assert!(
        node_upgrade(server.addr, &"0".repeat(64), Some(&node)).await.is_err(),
        "a wrong token is a stranger's, whose one slot is taken"
    );
    assert!(node_upgrade(server.addr, &token, None).await.is_err(), "a node token without its node id is a stranger's");
    // the node's token with its id on the upgrade takes a machine's slot, which strangers cannot hold
    let mut ws = node_upgrade(server.addr, &token, Some(&node)).await.expect("a machine's slot");
    send(&mut ws, json!({ "type": "offer", "kind": "agent", "protocols": ["capstan-socket/1"], "node": node, "token": token })).await;
    let welcome = next(&mut ws).await;
    assert_eq!((welcome["type"].as_str(), welcome["node"]["nodeId"].as_str()), (Some("welcome"), Some(node.as_str())), "{welcome}");
}

#[tokio::test]
async fn a_socket_session_follows_an_attempts_lines_as_they_come_until_it_unfollows() {
    let server = serve().await;
    let (service, mut node_ws, push) = pushed_a_run(&server).await;
    let assignment = push["body"]["assignmentId"].as_str().unwrap().to_string();
    let report = |sequence: u64, line: &str| {
        let entries = json!([{ "ts": format!("2026-12-07T10:00:0{sequence}Z"), "stream": "stdout", "line": line }]);
        json!({ "assignmentId": assignment, "captureId": "00112233445566ff", "sequence": sequence, "entries": entries, "final": false })
    };
    call(&mut node_ws, 2, "runtime.reportLogs", report(1, "one")).await;

    // the first page is the answer; each new page is pushed as it is kept
    let (mut ws, _) = open(server.addr, "cli", Some(&server.token)).await;
    let body = json!({ "serviceId": service, "assignmentId": assignment });
    let followed = call(&mut ws, 1, "runtime.followLogs", body.clone()).await;
    let follow_id = followed["result"]["followId"].as_str().unwrap().to_string();
    assert_eq!(followed["result"]["page"]["records"][0]["entries"][0]["line"], "one", "{followed}");
    call(&mut node_ws, 3, "runtime.reportLogs", report(2, "two")).await;
    let pushed = next(&mut ws).await;
    assert_eq!((pushed["type"].as_str(), pushed["topic"].as_str()), (Some("push"), Some("runtime.logs")), "{pushed}");
    assert_eq!(pushed["body"]["followId"], follow_id.as_str());
    let lines: Vec<&str> =
        pushed["body"]["page"]["records"][0]["entries"].as_array().unwrap().iter().map(|e| e["line"].as_str().unwrap()).collect();
    assert_eq!(lines, ["two"], "only what came after the answer's page: {pushed}");

    // unfollowed, nothing more arrives; an unknown follow is refused by name
    let stopped = call(&mut ws, 2, "runtime.unfollowLogs", json!({ "followId": follow_id })).await;
    assert_eq!(stopped["result"]["stopped"], true, "{stopped}");
    call(&mut node_ws, 4, "runtime.reportLogs", report(3, "three")).await;
    let again = call(&mut ws, 3, "runtime.unfollowLogs", json!({ "followId": follow_id })).await;
    assert_eq!(again["error"]["code"], "follow-not-found", "the next frame is the answer, no push: {again}");

    // refused as runtime.getLogs refuses; a session holds a bounded number of follows
    let missing = call(&mut ws, 4, "runtime.followLogs", json!({ "serviceId": service, "assignmentId": "asg_none" })).await;
    assert_eq!(missing["error"]["code"], "attempt-not-found", "{missing}");
    for id in 0..super::super::api::follow::MAX_FOLLOWS as u64 {
        assert!(call(&mut ws, 10 + id, "runtime.followLogs", body.clone()).await["result"]["followId"].is_string());
    }
    let over = call(&mut ws, 99, "runtime.followLogs", body.clone()).await;
    assert_eq!(over["error"]["code"], "too-many-follows", "{over}");
    // over HTTP a follow has no session to push to
    let (status, refused) = http(server.addr, "/api/v1/runtime.followLogs", Some(&server.token), body).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (400, Some("socket-required")), "{refused}");
}

#[tokio::test]
async fn a_call_reaches_a_nodes_agent_over_its_runtime_session_and_its_answer_or_refusal_comes_back() {
    let server = serve().await;
    let (_, _, node, token) = world(&server).await;
    let runtime = server.state.runtime.clone();
    let timeout = std::time::Duration::from_secs(5);
    let call_node = |method: &'static str, body: Value| {
        let (runtime, node) = (runtime.clone(), node.clone());
        tokio::spawn(async move { crate::runtime::sessions::call_node(&runtime, &node, method, body, timeout).await })
    };
    // no session yet: refused by name, retryable
    let refused = call_node("agent.ping", json!({})).await.unwrap().unwrap_err();
    assert_eq!((refused.code.as_ref(), refused.retryable), ("node-not-connected", true));

    let (mut ws, _) = node_socket(server.addr, &node, &token).await;
    call(&mut ws, 1, "runtime.registerSession", json!({ "nodeId": node, "nonce": NONCE })).await;
    let asked = call_node("backups.archive", json!({ "serviceId": "svc_1" }));
    let request = next(&mut ws).await;
    assert_eq!((request["type"].as_str(), request["method"].as_str()), (Some("request"), Some("backups.archive")), "{request}");
    assert_eq!(request["body"], json!({ "serviceId": "svc_1" }));
    send(&mut ws, json!({ "type": "reply", "id": request["id"], "result": { "size": 7 } })).await;
    assert_eq!(asked.await.unwrap().unwrap(), json!({ "size": 7 }));

    // the agent's refusal comes back as it gave it
    let asked = call_node("backups.archive", json!({}));
    let request = next(&mut ws).await;
    let error = json!({ "code": "volume-missing", "message": "no volume data", "retryable": false, "data": { "volume": "data" } });
    send(&mut ws, json!({ "type": "reply", "id": request["id"], "error": error })).await;
    let refused = asked.await.unwrap().unwrap_err();
    assert_eq!((refused.code.as_ref(), refused.data.as_deref()), ("volume-missing", Some(&json!({ "volume": "data" }))));

    // a node whose socket closed is not connected again
    drop(ws);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let refused = call_node("agent.ping", json!({})).await.unwrap().unwrap_err();
    assert_eq!(refused.code.as_ref(), "node-not-connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_call_made_on_another_fleet_node_is_carried_to_the_one_holding_the_session() {
    use capstan_plugin_host::{AgentDispatch, AgentRequest};
    use std::sync::Arc;
    let server = serve().await;
    let (_, _, node, token) = world(&server).await;
    // fleet node A serves the node's session; B shares A's store and bucket, with node sessions
    // of its own
    let dir = tempfile::tempdir().unwrap();
    let b = super::relay_sessions::second_fleet_node(&server, dir.path(), |b| {
        b.runtime = capstan_runtime::Context::new(
            b.store.clone(),
            Arc::new(capstan_links::HostDependents),
            b.runtime.nodes.clone(),
            b.sockets.clone(),
            b.keyring.clone(),
            b.blobs.clone(),
        );
        b.runtime.place("node-b");
    })
    .await;

    let (mut ws, _) = node_socket(server.addr, &node, &token).await;
    call(&mut ws, 1, "runtime.registerSession", json!({ "nodeId": node, "nonce": NONCE })).await;
    let calls = crate::plugins::agents::AgentCalls { relays: b.relays.clone(), runtime: b.runtime.clone() };
    let ask = |node: &str| AgentRequest {
        plugin_id: "backups".into(),
        cluster_id: String::new(),
        node_id: Some(node.into()),
        method: "agent.ping".into(),
        body: json!({ "from": "b" }),
        timeout: std::time::Duration::from_secs(10),
    };
    let pending = tokio::spawn(calls.call(ask(&node)));
    let request = next(&mut ws).await;
    assert_eq!((request["method"].as_str(), &request["body"]), (Some("agent.ping"), &json!({ "from": "b" })), "{request}");
    send(&mut ws, json!({ "type": "reply", "id": request["id"], "result": { "pong": true } })).await;
    assert_eq!(pending.await.unwrap().unwrap(), json!({ "pong": true }), "answered through fleet node A");
    // a node whose session nobody recorded is not connected, on either fleet node
    let refused = calls.call(ask("node_0123456789abcdef0123456789abcdef")).await.unwrap_err();
    assert_eq!((refused.code.as_ref(), refused.retryable), ("node-not-connected", true));
}
