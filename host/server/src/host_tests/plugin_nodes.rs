//! The nodes of clusters as a plugin reads them: the `inventory` import's `node` entities,
//! answered through the assembled host's platform (`capstan-links` over `capstan-nodes`), with
//! their liveness, exactly as `nodes.get` and `nodes.list` answer them and never a credential;
//! `fleet-node` reads the fleet's Capstan processes; without `inventory:read` nothing is read.

use crate::api::{Call, Pages, router};
use crate::auth::Identity;
use crate::nodes::sha256_hex;
use crate::plugins::imports::{CallData, Grant, Services};
use crate::plugins::manifest::Capability;
use crate::plugins::runtime::capstan::plugin::inventory::{self, EntityKind, Host as _};
use crate::state::{AppState, test_state_at};
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
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

impl World {
    async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let state = test_state_at(dir.path(), "https://capstan.example", false).await;
        crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
        let answer = state.auth.login("admin", PASSWORD, None).await.unwrap();
        let admin = state.auth.authenticate(&answer.token).await.unwrap();
        let mut world = World { _dir: dir, state, admin, cluster: String::new() };
        world.cluster = world.ok("clusters.create", json!({"name": "prod"})).await["cluster"]["id"].as_str().unwrap().to_string();
        world
    }

    async fn ok(&self, method: &str, body: Value) -> Value {
        let m = self.state.methods.get(method).unwrap_or_else(|| panic!("{method} is registered"));
        m.call(Call::by(&self.admin), body.clone()).await.unwrap_or_else(|e| panic!("{method} {body}: {e}"))
    }

    async fn agent(&self, route: &str, body: Value, bearer: Option<&str>) -> (StatusCode, Value) {
        let mut request = Request::post(format!("/agent/v1/{route}")).header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response =
            router(self.state.clone(), Pages::none()).oneshot(request.body(Body::from(body.to_string())).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// Enroll a machine called `hostname`: its node id and token.
    async fn enroll(&self, hostname: &str) -> (String, String) {
        let code = self.ok("nodes.createJumpCommand", json!({"clusterId": self.cluster})).await["code"].as_str().unwrap().to_string();
        let token: String = rand::random::<[u8; 32]>().iter().map(|b| format!("{b:02x}")).collect();
        let body = json!({"protocol": PROTOCOL, "code": code, "hostname": hostname,
            "tokenSha256": sha256_hex(token.as_bytes()), "agentVersion": "0.1.0"});
        let (status, answer) = self.agent("enroll", body, None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        (answer["nodeId"].as_str().unwrap().to_string(), token)
    }

    async fn beat(&self, node: &str, hostname: &str, token: &str) {
        let report = json!({
            "hostname": hostname, "os": "Debian GNU/Linux 13", "kernel": "6.12.0", "arch": "x86_64", "cpus": 4,
            "memoryBytes": 8_000_000_000u64, "diskBytes": 100_000_000_000u64, "diskFreeBytes": 50_000_000_000u64,
            "agentVersion": "0.1.0", "uptimeSeconds": 1000, "addresses": ["192.0.2.10"],
        });
        let (status, answer) = self.agent("heartbeat", json!({"protocol": PROTOCOL, "nodeId": node, "report": report}), Some(token)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }

    /// The state of one plugin call granted `grants`, over the host's real platform.
    fn call_data(&self, grants: &[Capability]) -> CallData {
        let platform = capstan_links::InventoryPlatform::new(
            self.state.store.clone(),
            self.state.keyring.clone(),
            Arc::new(capstan_links::HostDependents),
        );
        let services =
            Services::new(self.state.store.clone(), self.state.blobs.clone(), self.state.keyring.clone(), "test-node".into(), platform);
        let grants: BTreeSet<Capability> = grants.iter().cloned().collect();
        let grant = Grant::build(&services, "probe", &grants);
        CallData::new(Arc::new(grant), "req-nodes".into(), Duration::ZERO, 64 << 20, 4096)
    }
}

fn data(entity: &inventory::Entity) -> Value {
    serde_json::from_str(&entity.data).unwrap()
}

#[tokio::test]
async fn a_plugin_reads_the_nodes_of_clusters_with_their_liveness_as_nodes_get_answers_them() {
    let w = World::new().await;
    let (live, token) = w.enroll("web-1").await;
    w.beat(&live, "web-1", &token).await;
    let (quiet, quiet_token) = w.enroll("db-1").await;
    let mut cx = w.call_data(&[Capability::InventoryRead]);

    // one node: the entity is what nodes.get answers, liveness included
    let entity = cx.get(EntityKind::Node, live.clone()).await.unwrap().expect("the node is there");
    assert_eq!(entity.kind, EntityKind::Node);
    assert_eq!(entity.id, live);
    let got = w.ok("nodes.get", json!({"id": live})).await;
    assert_eq!(data(&entity), got, "the entity's data is nodes.get's answer");
    assert_eq!(entity.revision, got["revision"].as_u64().unwrap());
    assert_eq!((data(&entity)["live"].clone(), data(&entity)["liveness"].clone()), (json!(true), json!("live")));
    assert_eq!(data(&entity)["report"]["hostname"], "web-1");

    let never = cx.get(EntityKind::Node, quiet.clone()).await.unwrap().expect("the node is there");
    assert_eq!((data(&never)["live"].clone(), data(&never)["liveness"].clone()), (json!(false), json!("never-reported")));

    // never a credential: no token, no hash of it, no credential record's members
    for entity in [&entity, &never] {
        for (secret, what) in [(&token, "token"), (&quiet_token, "token")] {
            assert!(!entity.data.contains(secret.as_str()), "a node {what} in {}", entity.data);
            assert!(!entity.data.contains(&sha256_hex(secret.as_bytes())), "a token hash in {}", entity.data);
        }
        for member in ["tokenSha256", "sessionEpoch", "mutations"] {
            assert!(!entity.data.contains(member), "{member} in {}", entity.data);
        }
    }

    // an unknown id, and one that cannot name a node, are no entity (not a refusal)
    assert!(cx.get(EntityKind::Node, "node_nope".into()).await.unwrap().is_none());
    assert!(cx.get(EntityKind::Node, "no such/node".into()).await.unwrap().is_none());
    assert!(cx.get(EntityKind::Node, String::new()).await.unwrap().is_none());

    // the list, a page at a time, in id order, each entity as nodes.list answers it
    let listed = w.ok("nodes.list", json!({})).await;
    let first = cx.list(EntityKind::Node, None, 1).await.unwrap();
    assert_eq!(first.entities.len(), 1);
    let cursor = first.next_cursor.clone().expect("a second page");
    let second = cx.list(EntityKind::Node, Some(cursor), 1).await.unwrap();
    assert_eq!(second.entities.len(), 1);
    let read: Vec<Value> = first.entities.iter().chain(&second.entities).map(data).collect();
    assert_eq!(Value::Array(read), listed["items"], "the pages hold what nodes.list answers");
    let all = cx.list(EntityKind::Node, None, 100).await.unwrap();
    assert!(all.next_cursor.is_none() && all.entities.iter().all(|e| e.kind == EntityKind::Node), "{:?}", all.next_cursor);

    // a retired node reads retired, its credential revoked and still not shown
    let revision = got["revision"].as_u64().unwrap();
    w.ok("nodes.retire", json!({"id": live, "expectedRevision": revision})).await;
    let retired = cx.get(EntityKind::Node, live.clone()).await.unwrap().unwrap();
    assert_eq!(data(&retired)["state"], "retired");
    assert!(!retired.data.contains(&sha256_hex(token.as_bytes())));

    // the fleet's Capstan processes are another kind, never mixed with the nodes of clusters
    let fleet = cx.list(EntityKind::FleetNode, None, 100).await.unwrap();
    assert!(fleet.entities.iter().all(|e| e.kind == EntityKind::FleetNode && e.id != live && e.id != quiet));
    assert!(cx.get(EntityKind::FleetNode, live.clone()).await.unwrap().is_none());

    // without inventory:read a plugin reads no node
    let mut ungranted = w.call_data(&[Capability::Log]);
    let refused = ungranted.get(EntityKind::Node, quiet.clone()).await.expect_err("no grant, no read");
    assert_eq!(refused.code, "capability-denied", "{refused:?}");
    let refused = ungranted.list(EntityKind::Node, None, 10).await.expect_err("no grant, no read");
    assert_eq!(refused.code, "capability-denied", "{refused:?}");
}
