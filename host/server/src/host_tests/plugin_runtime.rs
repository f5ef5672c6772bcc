//! The `runtime` import as a plugin meets it. `service-replicas` (contract 0.3.1): where a
//! service's replicas run, answered through the assembled host's platform (`capstan-links` over
//! the runtime's slots) with the phase and readiness `runtime.getServiceStatus` states
//! (`pending` before the node said anything, `stopped` and `removed` once it reported them, ready
//! only while meant to run); without `runtime:read` nothing is read. `set-service-spec` (0.3.2):
//! a spec set as the acting identity, as `runtime.setServiceSpec` judges it; without
//! `runtime:write`, anonymously or from a read-only method nothing is written.

use crate::api::Call;
use crate::auth::Identity;
use crate::plugins::imports::{CallData, Grant, Services};
use crate::plugins::manifest::Capability;
use crate::plugins::runtime::capstan::plugin::runtime::{Host as _, Intent, Replica};
use crate::runtime::slots::{Slot, slot_id, slot_name};
use crate::runtime::transition::Intent as SlotIntent;
use crate::state::{AppState, test_state};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

const PASSWORD: &str = "a-long-enough-admin-password";

struct World {
    _dir: tempfile::TempDir,
    state: AppState,
    admin: Identity,
}

impl World {
    async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let state = test_state(dir.path()).await;
        crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
        let answer = state.auth.login("admin", PASSWORD, None).await.unwrap();
        let admin = state.auth.authenticate(&answer.token).await.unwrap();
        World { _dir: dir, state, admin }
    }

    async fn ok(&self, method: &str, body: Value) -> Value {
        let m = self.state.methods.get(method).unwrap_or_else(|| panic!("{method} is registered"));
        m.call(Call::by(&self.admin), body.clone()).await.unwrap_or_else(|e| panic!("{method} {body}: {e}"))
    }

    /// A new service of a new organization; its id.
    async fn service(&self, name: &str) -> String {
        let org = self.ok("organizations.create", json!({ "name": format!("{name}-org") })).await;
        let service = json!({ "organizationId": org["id"], "name": name, "image": "nginx:1" });
        self.ok("services.create", service).await["id"].as_str().unwrap().to_string()
    }

    /// Write a replica slot as the runtime keeps it, directly.
    async fn seed(&self, slot: Slot) {
        let id = slot_id(&slot.service_id, &slot.slot);
        let data = serde_json::to_value(&slot).unwrap();
        self.state
            .store
            .transact(|tx| {
                let (id, data) = (id.clone(), data.clone());
                async move { tx.insert(crate::runtime::RUNTIME_SLOTS, &id, data).await }
            })
            .await
            .unwrap();
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
        CallData::new(Arc::new(grant), "req-runtime".into(), Duration::ZERO, 64 << 20, 4096)
    }
}

/// A slot of `service` on `node` of `cluster`, its assignment at `intent`, with what the node
/// last said (`phase`, ready or not) if it said anything.
pub(super) fn slot(service: &str, cluster: &str, node: &str, index: u32, intent: SlotIntent, observed: Option<(&str, bool)>) -> Slot {
    let name = slot_name(node, index);
    let mut slot = capstan_runtime::testing::running_slot(service, &name, &format!("asg_{}", name.replace('.', "_")), 1, 1);
    slot.cluster_id = cluster.into();
    slot.node_id = node.into();
    slot.assignment.intent = intent;
    slot.assignment.work.image = "capstan.test/workloads/web@sha256:00".into();
    slot.assignment.work.environment = [("PASSWORD".to_string(), "never-shown".to_string())].into();
    slot.assignment.observation = observed.map(|(phase, ready)| capstan_runtime::testing::observed(phase, ready, Some("sha256:abc"), 2));
    slot
}

/// What the import answers of a replica, as comparable text: cluster, slot, node, intent,
/// phase, ready, digest.
fn shown(r: &Replica) -> (String, String, String, Intent, String, bool, Option<String>) {
    (r.cluster_id.clone(), r.slot.clone(), r.node_id.clone(), r.intent, r.phase.clone(), r.ready, r.image_digest.clone())
}

#[tokio::test]
async fn a_plugin_granted_runtime_read_reads_where_a_service_runs_and_whether_it_is_ready() {
    let w = World::new().await;
    let web = w.service("web").await;
    let other = w.service("other").await;

    // the runtime's slots, written as it keeps them: two clusters, every phase a slot goes through
    w.seed(slot(&web, "cluster_b", "node_b", 0, SlotIntent::Run, Some(("unhealthy", false)))).await;
    w.seed(slot(&web, "cluster_a", "node_a2", 0, SlotIntent::Run, None)).await;
    w.seed(slot(&web, "cluster_a", "node_a1", 1, SlotIntent::Run, Some(("running", true)))).await;
    w.seed(slot(&web, "cluster_a", "node_a1", 0, SlotIntent::Run, Some(("running", true)))).await;
    let mut stopped = slot(&web, "cluster_a", "node_a3", 0, SlotIntent::Stop, Some(("running", true)));
    stopped.assignment.stopped_at = Some(3);
    w.seed(stopped).await;
    let mut removed = slot(&web, "cluster_a", "node_a4", 0, SlotIntent::Remove, Some(("running", true)));
    (removed.assignment.stopped_at, removed.assignment.removed_at) = (Some(3), Some(4));
    w.seed(removed).await;
    w.seed(slot(&other, "cluster_a", "node_a1", 2, SlotIntent::Run, Some(("running", true)))).await;

    let mut cx = w.call_data(&[Capability::RuntimeRead]);
    let replicas = cx.service_replicas(web.clone()).await.unwrap();
    let digest = Some("sha256:abc".to_string());
    let expected = vec![
        ("cluster_a", "node_a1.0", "node_a1", Intent::Run, "running", true, digest.clone()),
        ("cluster_a", "node_a1.1", "node_a1", Intent::Run, "running", true, digest.clone()),
        ("cluster_a", "node_a2.0", "node_a2", Intent::Run, "pending", false, None),
        // stopped or removed: never ready, whatever the node said before
        ("cluster_a", "node_a3.0", "node_a3", Intent::Stop, "stopped", false, digest.clone()),
        ("cluster_a", "node_a4.0", "node_a4", Intent::Remove, "removed", false, digest.clone()),
        ("cluster_b", "node_b.0", "node_b", Intent::Run, "unhealthy", false, digest.clone()),
    ];
    let expected: Vec<_> =
        expected.into_iter().map(|(c, s, n, i, p, r, d)| (c.to_string(), s.to_string(), n.to_string(), i, p.to_string(), r, d)).collect();
    assert_eq!(replicas.iter().map(shown).collect::<Vec<_>>(), expected, "by cluster then slot, this service's only");
    assert_eq!(replicas[0].assignment_id, "asg_node_a1_0");

    // what a replica runs with never crosses
    assert!(!format!("{replicas:?}").contains("never-shown"));

    // a service that runs nowhere is an empty list; one that does not exist is refused by name
    let idle = w.service("idle").await;
    assert!(cx.service_replicas(idle).await.unwrap().is_empty());
    for missing in ["svc_nope", "", "no such/service"] {
        let refused = cx.service_replicas(missing.into()).await.expect_err("no such service");
        assert_eq!(refused.code, "service-not-found", "{missing:?}: {refused:?}");
    }

    // without runtime:read nothing is read, inventory:read or not
    let mut ungranted = w.call_data(&[Capability::InventoryRead, Capability::Log]);
    let refused = ungranted.service_replicas(web.clone()).await.expect_err("no grant, no read");
    assert_eq!(refused.code, "capability-denied", "{refused:?}");
    let data: Value = serde_json::from_str(refused.data.as_deref().unwrap()).unwrap();
    assert_eq!(data["capability"], "runtime:read");
}

#[tokio::test]
async fn a_plugin_granted_runtime_write_sets_a_spec_as_its_caller_would_and_nothing_else_does() {
    use crate::plugins::imports::Acting;
    let w = World::new().await;
    let web = w.service("web").await;
    let cluster = w.ok("clusters.create", json!({ "name": "edge" })).await["cluster"]["id"].as_str().unwrap().to_string();
    let body = json!({ "serviceId": web, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true },
                       "replicasPerNode": 1, "health": { "kind": "none" } });

    // as the caller: judged and stored as runtime.setServiceSpec would, which reads it back
    let mut cx = w.call_data(&[Capability::RuntimeWrite]);
    cx.acting = Acting::Caller(w.admin.clone());
    let set: Value = serde_json::from_str(&cx.set_service_spec(body.to_string()).await.unwrap()).unwrap();
    assert_eq!((set["revision"].as_u64(), &set["data"]["placement"]), (Some(1), &json!({ "everyNode": true })), "{set}");
    let read = w.ok("runtime.getServiceSpec", json!({ "serviceId": web, "clusterId": cluster })).await;
    assert_eq!(read["items"][0]["revision"], set["revision"]);
    assert_eq!(read["items"][0]["id"], set["id"]);
    // and a plugin granted runtime:read reads it back as the method shows it
    let mut reader = w.call_data(&[Capability::RuntimeRead]);
    let specs = reader.service_specs(web.clone()).await.unwrap();
    let specs: Vec<Value> = specs.iter().map(|s| serde_json::from_str(s).unwrap()).collect();
    assert_eq!(specs.len(), 1, "{specs:?}");
    assert_eq!((&specs[0]["id"], &specs[0]["revision"]), (&set["id"], &set["revision"]));
    for field in ["clusterId", "placement", "replicasPerNode", "hold", "restart", "health", "secrets"] {
        assert_eq!(specs[0]["data"][field], read["items"][0][field], "{field}");
    }
    let idle = w.service("idle").await;
    assert!(reader.service_specs(idle.clone()).await.unwrap().is_empty(), "a service meant to run nowhere");
    assert_eq!(reader.service_specs("svc_nope".into()).await.expect_err("no such service").code, "service-not-found");
    // and where a release of it stands, as the deployment path judges one: the cluster has no
    // node yet, so nothing is wanted and the release is starting there
    let digest = format!("sha256:{}", "a".repeat(64));
    let rollout: Value = serde_json::from_str(&reader.service_rollout(web.clone(), digest.clone()).await.unwrap()).unwrap();
    assert_eq!(
        (&rollout["state"], &rollout["clusters"][0]["clusterId"], &rollout["clusters"][0]["wanted"], &rollout["clusters"][0]["reason"]),
        (&json!("starting"), &json!(cluster), &json!(0), &json!("no-eligible-node")),
        "{rollout}"
    );
    let idle: Value = serde_json::from_str(&reader.service_rollout(idle, digest.clone()).await.unwrap()).unwrap();
    assert_eq!(idle, json!({ "state": "unplaced", "clusters": [] }), "a service no spec places");
    for (service, release, code) in [
        ("svc_nope", digest.as_str(), "service-not-found"),
        (web.as_str(), "sha256:short", "invalid-request"),
        (web.as_str(), "latest", "invalid-request"),
    ] {
        let refused = reader.service_rollout(service.into(), release.into()).await.expect_err("refused");
        assert_eq!(refused.code, code, "{service} {release}: {refused:?}");
    }
    let refused = w.call_data(&[Capability::RuntimeWrite]).service_rollout(web.clone(), digest).await.expect_err("no runtime:read");
    assert_eq!(refused.code, "capability-denied");
    // what a plugin read it writes back as it was, changing one field (a restore's hold)
    let mut held = specs[0]["data"].clone();
    let body_back = json!({ "serviceId": web, "clusterId": cluster, "expectedRevision": specs[0]["revision"],
        "placement": held["placement"].take(), "replicasPerNode": held["replicasPerNode"].take(), "hold": true,
        "restart": held["restart"].take(), "health": held["health"].take(), "secrets": held["secrets"].take() });
    let rewritten: Value = serde_json::from_str(&cx.set_service_spec(body_back.to_string()).await.unwrap()).unwrap();
    assert_eq!((rewritten["revision"].as_u64(), &rewritten["data"]["hold"]), (Some(2), &json!(true)));
    let mut back = json!({ "serviceId": web, "clusterId": cluster, "expectedRevision": 2, "placement": { "everyNode": true },
                           "replicasPerNode": 1, "hold": false, "health": { "kind": "none" } });
    cx.set_service_spec(back.to_string()).await.unwrap();
    back["expectedRevision"] = json!(null);
    // fenced by the revision read, refused as the method refuses
    let stale = cx.set_service_spec(back.to_string()).await.expect_err("a spec is there now");
    assert_eq!(stale.code, "conflict", "{stale:?}");
    let mut elsewhere = body.clone();
    elsewhere["clusterId"] = json!("cluster_nope");
    assert_eq!(cx.set_service_spec(elsewhere.to_string()).await.expect_err("no such cluster").code, "cluster-not-found");
    assert_eq!(cx.set_service_spec("[1]".into()).await.expect_err("not an object").code, "invalid-request");

    // nobody to act as, a read-only method, no grant: nothing is written
    cx.acting = Acting::Anonymous;
    assert_eq!(cx.set_service_spec(body.to_string()).await.expect_err("anonymous").code, "unauthenticated");
    let mut read_only = w.call_data(&[Capability::RuntimeWrite]);
    read_only.acting = Acting::Caller(w.admin.clone());
    read_only.read_only = true;
    assert_eq!(read_only.set_service_spec(body.to_string()).await.expect_err("a read").code, "read-only-method");
    let mut ungranted = w.call_data(&[Capability::RuntimeRead, Capability::InventoryWriteServices]);
    ungranted.acting = Acting::Caller(w.admin.clone());
    let refused = ungranted.set_service_spec(body.to_string()).await.expect_err("no grant, no write");
    assert_eq!(refused.code, "capability-denied", "{refused:?}");
    let data: Value = serde_json::from_str(refused.data.as_deref().unwrap()).unwrap();
    assert_eq!(data["capability"], "runtime:write");
    let read = w.ok("runtime.getServiceSpec", json!({ "serviceId": web, "clusterId": cluster })).await;
    assert_eq!(read["items"][0]["revision"], 3, "nothing refused was written");
}

#[tokio::test]
async fn a_plugin_reads_the_digest_a_service_image_runs_as_pinned_or_resolved_for_that_very_image() {
    use capstan_runtime::images::{ImagePlan, RUNTIME_IMAGE_PLANS};
    let w = World::new().await;
    let web = w.service("web").await;
    let mut reader = w.call_data(&[Capability::RuntimeRead]);
    assert_eq!(reader.service_image_digest(web.clone()).await.unwrap(), None, "nginx:1, not resolved yet");
    // the runtime resolved the tag: its plan answers, while it is the service's image
    let digest = format!("sha256:{}", "b".repeat(64));
    let plan = |image: &str| ImagePlan {
        service_id: web.clone(),
        image: image.into(),
        digest: Some(digest.clone()),
        resolved_at: Some(1),
        error: None,
        failures: 0,
        retry_at: 0,
    };
    let put = |plan: ImagePlan| {
        let (store, id, data) = (w.state.store.clone(), web.clone(), serde_json::to_value(plan).unwrap());
        async move {
            store
                .transact(|tx| {
                    let (id, data) = (id.clone(), data.clone());
                    async move {
                        let revision = tx.get(RUNTIME_IMAGE_PLANS, &id).await?.map(|d| d.revision);
                        tx.put(RUNTIME_IMAGE_PLANS, &id, revision, data).await
                    }
                })
                .await
                .unwrap();
        }
    };
    put(plan("nginx:1")).await;
    assert_eq!(reader.service_image_digest(web.clone()).await.unwrap(), Some(digest.clone()));
    put(plan("nginx:0.9")).await;
    assert_eq!(reader.service_image_digest(web.clone()).await.unwrap(), None, "a plan of another image answers nothing");
    // a pinned image names its own digest
    let pinned = format!("sha256:{}", "c".repeat(64));
    let current = w.ok("services.get", json!({ "id": web })).await;
    w.ok("services.update", json!({ "id": web, "expectedRevision": current["revision"], "image": format!("nginx@{pinned}") })).await;
    assert_eq!(reader.service_image_digest(web.clone()).await.unwrap(), Some(pinned));
    assert_eq!(reader.service_image_digest("svc_nope".into()).await.expect_err("none").code, "service-not-found");
    let refused = w.call_data(&[Capability::RuntimeWrite]).service_image_digest(web).await.expect_err("no runtime:read");
    assert_eq!(refused.code, "capability-denied");
}
