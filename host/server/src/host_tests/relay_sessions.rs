//! A relay's session on a real listener with a real WebSocket client: the bearer as the offer's
//! token, `relays.register` and its refusals, the config pushed first and on change, rotation
//! closing the session, the election (`relay-not-connected`, `relay-ambiguous`), requests and
//! replies, a relay on one fleet node reached from another, and cluster deletion.

use super::socket::{Server, Ws, call, closed_with, connect, next, open, send, serve};
use crate::api::{Pages, router};
use crate::relays::registrations as relay_registrations;
use crate::state::AppState;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A host with a relay zone, one cluster with its relay enabled, a node of it, and the relay's
/// bearer exported.
struct World {
    server: Server,
    cluster: String,
    node: String,
    bearer: String,
}

async fn admin(server: &Server, method: &str, body: Value) -> Value {
    let (status, answer) = http(server.addr, method, Some(&server.token), body.clone()).await;
    assert_eq!(status, 200, "{method} {body}: {answer}");
    answer
}

async fn http(addr: SocketAddr, method: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(format!("http://{addr}/api/v1/{method}")).header("content-type", "application/json");
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let reply = request.body(body.to_string()).send().await.unwrap();
    let status = reply.status().as_u16();
    (status, serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap())
}

/// A node record of `cluster` as enrollment writes it (only what the relay path reads).
async fn add_node(state: &AppState, cluster: &str, name: &str) -> String {
    let id = capstan_core::ids::new_id("node");
    let doc = json!({ "clusterId": cluster, "name": name, "hostname": name, "state": "active" });
    let id_ref = id.as_str();
    let doc = &doc;
    state
        .store
        .transact(|tx| async move { tx.insert(crate::inventory::CLUSTER_NODES, id_ref, doc.clone()).await.map(drop) })
        .await
        .unwrap();
    id
}

async fn new_cluster(server: &Server, name: &str, enabled: bool) -> String {
    let cluster = admin(server, "clusters.create", json!({ "name": name })).await["cluster"].clone();
    let id = cluster["id"].as_str().unwrap().to_string();
    if enabled {
        admin(server, "clusters.enableRelay", json!({ "id": id, "expectedRevision": cluster["revision"] })).await;
    }
    id
}

async fn export(server: &Server, cluster: &str, generation: u64) -> String {
    let exported = admin(server, "relays.exportAuthorization", json!({ "clusterId": cluster, "expectedGeneration": generation })).await;
    exported["authorization"].as_str().unwrap().to_string()
}

impl World {
    async fn new() -> World {
        World::on(serve(|_| {}).await).await
    }

    async fn on(server: Server) -> World {
        let revision = admin(&server, "settings.get", json!({})).await["revision"].clone();
        admin(&server, "settings.update", json!({ "expectedRevision": revision, "set": { "clusterRelayZone": "relays.example.com" } }))
            .await;
        let cluster = new_cluster(&server, "edge", true).await;
        admin(&server, "relays.mutateCredential", json!({ "clusterId": cluster, "action": "ensure", "mutationId": "mint-1" })).await;
        let bearer = export(&server, &cluster, 1).await;
        let node = add_node(&server.state, &cluster, "edge-1").await;
        World { server, cluster, node, bearer }
    }

    /// A relay session under `bearer`, registered with sequence 1; its config push and answer.
    async fn relay(&self, bearer: &str) -> (Ws, Value, Value) {
        let (mut ws, welcome) = open(self.server.addr, "relay", Some(bearer)).await;
        assert_eq!(welcome["relay"]["clusterId"], self.cluster.as_str(), "{welcome}");
        let (pushed, answer) = register(&mut ws, 1, &self.node).await;
        assert_eq!(answer["type"], "result", "{answer}");
        (ws, pushed, answer["result"].clone())
    }

    async fn list(&self) -> Value {
        admin(&self.server, "relays.list", json!({ "clusterIds": [self.cluster] })).await["items"][0].clone()
    }
}

/// Send `relays.register`; the config push that comes first (Null when refused) and the answer.
async fn register(ws: &mut Ws, sequence: u64, node: &str) -> (Value, Value) {
    let body = json!({ "nodeId": node, "sequence": sequence, "version": "0.1.0-test", "listenAddress": "10.0.0.5", "listenPort": 8443 });
    send(ws, json!({ "type": "call", "id": sequence, "method": "relays.register", "body": body })).await;
    let first = next(ws).await;
    if first["type"] == "push" {
        return (first, next(ws).await);
    }
    (Value::Null, first)
}

/// Answer the next request frame with `reply` (merged with its id); the request.
async fn answer_request(ws: &mut Ws, reply: Value) -> Value {
    let request = next(ws).await;
    assert_eq!(request["type"], "request", "{request}");
    let mut frame = reply;
    frame["type"] = json!("reply");
    frame["id"] = request["id"].clone();
    send(ws, frame).await;
    request
}

async fn eventually_live(world: &World, live: bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let item = world.list().await;
        if item["live"] == live {
            return item;
        }
        assert!(tokio::time::Instant::now() < deadline, "live never became {live}: {item}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_relay_registers_gets_its_config_first_and_is_listed_live() {
    let w = World::new().await;
    // an administrator's dashboard hears when a relay comes and goes
    let (mut watcher, _) = open(w.server.addr, "dashboard", Some(&w.server.token)).await;
    let (mut ws, welcome) = open(w.server.addr, "relay", Some(&w.bearer)).await;
    assert_eq!(welcome["identity"]["kind"], "machine", "the cluster's machine user: {welcome}");
    assert_eq!(welcome["relay"]["credential"]["generation"], 1, "{welcome}");
    let (pushed, answer) = register(&mut ws, 1, &w.node).await;
    assert_eq!((pushed["topic"].as_str(), pushed["body"]["clusterId"].as_str()), (Some("relay.config"), Some(w.cluster.as_str())));
    let config = &pushed["body"]["config"];
    assert_eq!(config["cluster"]["relay"]["enabled"], true, "{config}");
    assert_eq!(config["nodes"][0]["id"], w.node.as_str(), "{config}");
    assert_eq!(config["settings"]["clusterRelayZone"], "relays.example.com");
    assert_eq!(pushed["body"]["digest"].as_str().unwrap().len(), 64);
    let result = &answer["result"];
    assert!(result["origin"].as_str().unwrap().starts_with("https://relay.cluster-"), "{answer}");
    assert_eq!((result["credential"]["generation"].as_u64(), result["acceptedRegistration"]["generation"].as_u64()), (Some(1), Some(1)));

    let heard = next(&mut watcher).await;
    assert_eq!((heard["topic"].as_str(), heard["body"]["clusterId"].as_str()), (Some("relay.sessionChanged"), Some(w.cluster.as_str())));
    let item = w.list().await;
    assert_eq!((item["live"].as_bool(), item["liveSessions"].as_u64()), (Some(true), Some(1)), "{item}");
    assert_eq!((item["nodeId"].as_str(), item["listenPort"].as_u64()), (Some(w.node.as_str()), Some(8443)), "{item}");
    assert_eq!(item["listenAddress"], "10.0.0.5");

    // the sequence strictly advances within the socket
    let (_, stale) = register(&mut ws, 1, &w.node).await;
    assert_eq!((stale["error"]["code"].as_str(), stale["error"]["data"]["lastSequence"].as_u64()), (Some("relay-sequence-stale"), Some(1)));
    let (_, again) = register(&mut ws, 2, &w.node).await;
    assert_eq!(again["result"]["acceptedRegistration"]["generation"], 2, "the record is replaced whole: {again}");
    assert_eq!(again["result"]["acceptedRegistration"]["id"], result["acceptedRegistration"]["id"]);

    // only a relay session registers
    let (status, over_http) =
        http(w.server.addr, "relays.register", Some(&w.server.token), json!({ "nodeId": w.node, "sequence": 1, "version": "1" })).await;
    assert_eq!((status, over_http["error"]["code"].as_str()), (400, Some("socket-required")), "{over_http}");
    let (mut dashboard, _) = open(w.server.addr, "dashboard", Some(&w.server.token)).await;
    let refused = call(&mut dashboard, 1, "relays.register", json!({ "nodeId": w.node, "sequence": 1, "version": "1" })).await;
    assert_eq!(refused["error"]["code"], "relay-identity-unverified", "{refused}");

    // the relay's other calls run as its cluster's machine user
    let whoami = call(&mut ws, 9, "auth.whoami", json!({})).await;
    assert_eq!(whoami["result"]["userId"], welcome["identity"]["userId"], "{whoami}");

    // a closed socket is no longer live; its registration stays
    drop(ws);
    let item = eventually_live(&w, false).await;
    let heard = loop {
        let frame = next(&mut watcher).await;
        if frame["type"] == "push" {
            break frame;
        }
    };
    assert_eq!(heard["topic"], "relay.sessionChanged", "{heard}");
    assert_eq!(item["acceptedRegistration"]["generation"], 2, "{item}");
}

#[tokio::test]
async fn a_relay_connects_while_strangers_hold_every_slot_of_theirs() {
    let w = World::on(serve(super::socket::limits(|l| l.max_stranger_sessions = 1)).await).await;
    let _stranger = connect(w.server.addr, None).await;
    let refused = tokio_tungstenite::connect_async(format!("ws://{}/api/v1/socket", w.server.addr)).await;
    assert!(refused.is_err(), "the strangers' one slot is taken");
    // the relay's bearer on the upgrade takes a machine's slot, which strangers cannot hold
    let mut ws = connect(w.server.addr, Some(&w.bearer)).await;
    send(&mut ws, json!({ "type": "offer", "kind": "relay", "protocols": ["capstan-socket/1"], "token": w.bearer })).await;
    let welcome = next(&mut ws).await;
    assert_eq!(
        (welcome["type"].as_str(), welcome["relay"]["clusterId"].as_str()),
        (Some("welcome"), Some(w.cluster.as_str())),
        "{welcome}"
    );
}

#[tokio::test]
async fn registrations_and_offers_are_refused_by_name_and_consume_nothing() {
    let w = World::new().await;
    for (token, code, close) in [("not-a-bearer", "unauthenticated", 4003), ("", "offer-invalid", 4000)] {
        let mut ws = connect(w.server.addr, None).await;
        send(&mut ws, json!({ "type": "offer", "kind": "relay", "protocols": ["capstan-socket/1"], "token": token })).await;
        let refusal = next(&mut ws).await;
        assert_eq!(refusal["error"]["code"], code, "{refusal}");
        assert_eq!(closed_with(&mut ws).await.map(|c| c.0), Some(close));
    }
    let (mut ws, _) = open(w.server.addr, "relay", Some(&w.bearer)).await;
    let (_, unknown) = register(&mut ws, 1, "node_nosuchnode").await;
    assert_eq!(unknown["error"]["code"], "relay-node-unknown", "{unknown}");
    let other = new_cluster(&w.server, "other", true).await;
    let foreign = add_node(&w.server.state, &other, "other-1").await;
    let (_, refused) = register(&mut ws, 1, &foreign).await;
    assert_eq!(refused["error"]["code"], "relay-node-foreign", "{refused}");
    let (_, malformed) = register(&mut ws, 0, &w.node).await;
    assert_eq!(malformed["error"]["code"], "invalid-request", "{malformed}");
    let revision = admin(&w.server, "clusters.get", json!({ "id": w.cluster })).await["revision"].clone();
    admin(&w.server, "clusters.disableRelay", json!({ "id": w.cluster, "expectedRevision": revision })).await;
    let (_, disabled) = register(&mut ws, 1, &w.node).await;
    assert_eq!(disabled["error"]["code"], "relay-cluster-not-enabled", "{disabled}");
    // nothing was consumed: the very same sequence is accepted once the cause is gone
    let revision = admin(&w.server, "clusters.get", json!({ "id": w.cluster })).await["revision"].clone();
    admin(&w.server, "clusters.enableRelay", json!({ "id": w.cluster, "expectedRevision": revision })).await;
    let (_, accepted) = register(&mut ws, 1, &w.node).await;
    assert_eq!(accepted["result"]["sequence"], 1, "{accepted}");
}

#[tokio::test]
async fn a_rotation_closes_the_relay_and_its_old_bearer_is_refused_until_it_takes_the_new_one() {
    let w = World::new().await;
    let (mut ws, _, _) = w.relay(&w.bearer).await;
    admin(
        &w.server,
        "relays.mutateCredential",
        json!({ "clusterId": w.cluster, "action": "rotate", "expectedGeneration": 1, "mutationId": "rotate-1" }),
    )
    .await;
    // the next frame is judged under the credential as it is now
    send(&mut ws, json!({ "type": "call", "id": 2, "method": "auth.whoami" })).await;
    let refused = next(&mut ws).await;
    assert_eq!(refused["error"]["code"], "relay-credential-generation-stale", "{refused}");
    assert_eq!(closed_with(&mut ws).await, Some((4011, "relay-credential-generation-stale".into())));
    // and the old bearer opens nothing
    let mut old = connect(w.server.addr, None).await;
    send(&mut old, json!({ "type": "offer", "kind": "relay", "protocols": ["capstan-socket/1"], "token": w.bearer })).await;
    let refused = next(&mut old).await;
    assert_eq!(
        (refused["error"]["code"].as_str(), refused["error"]["data"]["generation"].as_u64()),
        (Some("relay-credential-generation-stale"), Some(2))
    );
    assert_eq!(closed_with(&mut old).await.map(|c| c.0), Some(4011));
    let fresh = export(&w.server, &w.cluster, 2).await;
    let (_, _, accepted) = w.relay(&fresh).await;
    assert_eq!(accepted["credential"]["generation"], 2, "{accepted}");
}

#[tokio::test]
async fn calls_reach_the_one_elected_relay_and_its_refusals_come_back_by_name() {
    let w = World::new().await;
    let relays = w.server.state.relays.clone();
    let ping = |timeout: u64| {
        let (relays, cluster) = (relays.clone(), w.cluster.clone());
        tokio::spawn(async move { relays.call(&cluster, "agent.ping", json!({"n": 1}), Duration::from_millis(timeout)).await })
    };
    let none = ping(2000).await.unwrap().unwrap_err();
    assert_eq!((none.code.as_ref(), none.retryable), ("relay-not-connected", true));
    assert_eq!(none.data.as_ref().unwrap()["retryAfterMs"], 5000);

    let (mut ws, _, _) = w.relay(&w.bearer).await;
    let pending = ping(10_000);
    let request = answer_request(&mut ws, json!({ "result": { "pong": true } })).await;
    assert_eq!((request["method"].as_str(), request["body"]["n"].as_u64()), (Some("agent.ping"), Some(1)), "{request}");
    assert!(request["deadlineMs"].as_u64().unwrap() <= 10_000, "{request}");
    assert_eq!(pending.await.unwrap().unwrap(), json!({ "pong": true }));

    let pending = ping(10_000);
    answer_request(
        &mut ws,
        json!({ "error": { "code": "agent-method-unknown", "message": "no", "retryable": false, "data": { "methods": ["agent.ping"] } } }),
    )
    .await;
    let refused = pending.await.unwrap().unwrap_err();
    assert_eq!(refused.code, "agent-method-unknown");

    let pending = ping(300);
    let _unanswered = next(&mut ws).await;
    assert_eq!(pending.await.unwrap().unwrap_err().code, "relay-timeout");

    // a second live relay of the same cluster: never a silent choice
    let (mut second, _, _) = w.relay(&w.bearer).await;
    assert_eq!(ping(2000).await.unwrap().unwrap_err().code, "relay-ambiguous");
    assert_eq!(w.list().await["liveSessions"], 2);

    // the cluster is not deleted while a relay carries it
    let node = w.node.as_str();
    let store = &w.server.state.store;
    store.transact(|tx| async move { tx.delete(crate::inventory::CLUSTER_NODES, node, 1).await }).await.unwrap();
    let revision = admin(&w.server, "clusters.get", json!({ "id": w.cluster })).await["revision"].clone();
    let (status, refused) =
        http(w.server.addr, "clusters.delete", Some(&w.server.token), json!({ "id": w.cluster, "expectedRevision": revision })).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (409, Some("cluster-relay-live")), "{refused}");
    second.close(None).await.unwrap();
    ws.close(None).await.unwrap();
    eventually_live(&w, false).await;
    admin(&w.server, "clusters.delete", json!({ "id": w.cluster, "expectedRevision": revision })).await;
    // what only the cluster held of its relay went with it
    for collection in [relay_registrations::REGISTRATIONS, crate::relays::credentials::CREDENTIALS] {
        let left = store.transact(|tx| async move { Ok(tx.scan(collection, None, 10).await?.documents.len()) }).await.unwrap();
        assert_eq!(left, 0, "{collection} keeps nothing of the deleted cluster");
    }
    assert!(relay_registrations::identify(store, w.bearer.as_bytes()).await.is_err(), "the deleted cluster's bearer authenticates nothing");
}

#[tokio::test]
async fn changes_push_the_clusters_config_to_its_relay() {
    let w = World::new().await;
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let _loops = w.server.state.relays.spawn(stopped).await.unwrap();
    let (mut ws, first, _) = w.relay(&w.bearer).await;
    let revision = admin(&w.server, "clusters.get", json!({ "id": w.cluster })).await["revision"].clone();
    admin(&w.server, "clusters.update", json!({ "id": w.cluster, "expectedRevision": revision, "description": "moved racks" })).await;
    let pushed = next(&mut ws).await;
    assert_eq!(pushed["topic"], "relay.config", "{pushed}");
    assert_ne!(pushed["body"]["digest"], first["body"]["digest"]);
    assert!(pushed["body"]["config"]["cluster"]["revision"].as_u64() > revision.as_u64(), "{pushed}");
    let revision = pushed["body"]["config"]["cluster"]["revision"].clone();
    admin(&w.server, "clusters.disableRelay", json!({ "id": w.cluster, "expectedRevision": revision })).await;
    let pushed = next(&mut ws).await;
    assert_eq!(pushed["body"]["config"]["cluster"]["relay"]["enabled"], false, "{pushed}");
}

/// Serve `state` on 127.0.0.1.
async fn listen(state: AppState) -> SocketAddr {
    super::socket::listen(router(state, Pages::none())).await
}

/// Fleet node B beside `a` (registered on the fleet's private network, as `a` is then): A's
/// store and bucket, an identity (under `dir`), socket sessions and relays of its own, `adjust`ed
/// before it serves.
pub(super) async fn second_fleet_node(a: &super::socket::Server, dir: &std::path::Path, adjust: impl FnOnce(&mut AppState)) -> AppState {
    let lan = |port| crate::fleet::Addresses { internal: "127.0.0.1".into(), api_port: port };
    a.state.fleet.node.register(lan(a.addr.port()), Default::default(), vec!["api".into()]).await.unwrap();
    let mut b = a.state.clone();
    b.sockets = Arc::new(crate::sessions::Hub::new(a.state.sockets.limits().clone()));
    let (identity, _) = crate::fleet::identity::NodeIdentity::load_or_create(&dir.join("b"), Some("node-b")).unwrap();
    let node = Arc::new(crate::fleet::Node::new(a.state.blobs.clone(), identity, Default::default(), Some("lan".into())));
    b.fleet = crate::fleet::runtime::Fleet::new(node.clone());
    let peers = crate::relays::forward::Peers::new(b.fleet.clone());
    b.relays = crate::relays::Relays::new(b.store.clone(), b.sockets.clone(), "node-b".into(), peers);
    adjust(&mut b);
    let b_addr = listen(b.clone()).await;
    node.register(lan(b_addr.port()), Default::default(), vec!["api".into()]).await.unwrap();
    b
}

#[tokio::test]
async fn a_relay_on_one_fleet_node_is_reached_from_a_call_landing_on_another() {
    // node A holds the relay; node B shares A's store and bucket and has an identity of its own
    let w = World::new().await;
    let dir = tempfile::tempdir().unwrap();
    let b = second_fleet_node(&w.server, dir.path(), |_| {}).await;

    let (mut ws, _, _) = w.relay(&w.bearer).await;
    let (relays, cluster) = (b.relays.clone(), w.cluster.clone());
    let pending = tokio::spawn(async move { relays.call(&cluster, "agent.describe", json!({}), Duration::from_secs(10)).await });
    let request = answer_request(&mut ws, json!({ "result": { "nodeId": w.node } })).await;
    assert_eq!(request["method"], "agent.describe");
    assert_eq!(pending.await.unwrap().unwrap(), json!({ "nodeId": w.node }), "answered through node A");

    // a carried call is believed only when signed by a fleet node, fresh and never replayed
    let body =
        json!({ "clusterId": w.cluster, "sessionId": "socket_x", "method": "agent.ping", "body": {}, "deadlineMs": 1000 }).to_string();
    let unsigned = reqwest::Client::new().post(format!("http://{}/fleet/v1/relay-call", w.server.addr)).body(body).send().await.unwrap();
    assert_eq!(unsigned.status().as_u16(), 401);
    let refused: Value = serde_json::from_slice(&unsigned.bytes().await.unwrap()).unwrap();
    assert_eq!(refused["error"]["code"], "fleet-request-unverified", "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_agents_call_reaches_the_relay_and_its_refusals_come_back_by_name() {
    let w = World::new().await;
    if !super::plugins::install_example(&w.server.state).await {
        return;
    }
    let (addr, token, body) = (w.server.addr, w.server.token.clone(), json!({ "clusterId": w.cluster }));
    let ping = move || {
        let (token, body) = (token.clone(), body.clone());
        async move { http(addr, "example.pingAgent", Some(&token), body).await }
    };
    let (status, none) = ping().await;
    assert_eq!((status, none["error"]["code"].as_str()), (503, Some("relay-not-connected")), "{none}");
    assert_eq!(none["error"]["data"]["retryAfterMs"], 5000, "{none}");

    let (mut ws, _, _) = w.relay(&w.bearer).await;
    let pending = tokio::spawn(ping());
    let request = answer_request(&mut ws, json!({ "result": { "pong": true, "nodeId": w.node } })).await;
    assert_eq!(request["method"], "agent.ping", "{request}");
    assert!(request["deadlineMs"].as_u64().unwrap() <= 30_000, "inside the plugin call's deadline: {request}");
    let (status, answer) = pending.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({ "clusterId": w.cluster, "reply": { "pong": true, "nodeId": w.node } }));

    let pending = tokio::spawn(ping());
    answer_request(&mut ws, json!({ "error": { "code": "agent-busy", "message": "later", "retryable": true } })).await;
    let (_, refused) = pending.await.unwrap();
    assert_eq!((refused["error"]["code"].as_str(), refused["error"]["retryable"].as_bool()), (Some("agent-busy"), Some(true)), "{refused}");
}

#[tokio::test]
async fn bearers_issued_before_their_index_are_indexed_at_start() {
    let w = World::new().await;
    let store = &w.server.state.store;
    store
        .transact(|tx| async move {
            for doc in tx.scan(relay_registrations::BEARERS, None, 100).await?.documents {
                tx.delete(relay_registrations::BEARERS, &doc.id, doc.revision).await?;
            }
            Ok(())
        })
        .await
        .unwrap();
    assert!(relay_registrations::identify(store, w.bearer.as_bytes()).await.is_err(), "no index, no cluster");
    crate::relays::declare(store).await.unwrap();
    assert_eq!(relay_registrations::identify(store, w.bearer.as_bytes()).await.unwrap().cluster_id, w.cluster);
}
