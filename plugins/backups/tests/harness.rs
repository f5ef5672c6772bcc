//! The backups manager built for wasm32-wasip2 and run on an in-process host
//! (`capstan_sdk::testing`): a node's archive that takes longer than one ask is asked for again
//! on later passes (the backup `pending` with `archiving` meanwhile, never failed for taking
//! long), and a node that stays away fails its backup with the node's refusal after an hour.

use capstan_sdk::runtime::{Intent, Replica};
use capstan_sdk::testing::{AgentDispatch, AgentReply, AgentRequest, HostRefusal, TestHost};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Answers each request with the next of `answers` (the last one again when they run out),
/// recording what it was asked.
struct Agents {
    asked: Mutex<Vec<AgentRequest>>,
    answers: Mutex<Vec<Result<Value, HostRefusal>>>,
}

impl Agents {
    fn answering(answers: Vec<Result<Value, HostRefusal>>) -> Arc<Agents> {
        Arc::new(Agents { asked: Mutex::default(), answers: Mutex::new(answers) })
    }

    fn asked(&self) -> Vec<AgentRequest> {
        self.asked.lock().unwrap().clone()
    }
}

impl AgentDispatch for Agents {
    fn call(&self, request: AgentRequest) -> AgentReply {
        self.asked.lock().unwrap().push(request);
        let mut answers = self.answers.lock().unwrap();
        let answer = if answers.len() > 1 { answers.remove(0) } else { answers[0].clone() };
        Box::pin(async move { answer })
    }
}

/// The manager on a host where the service `notes` (one volume) runs on `node_a`: the host,
/// the organization and the service.
fn host() -> (TestHost, String, String) {
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    host.set_public_origin("http://127.0.0.1:8080");
    let org = host.create_organization("acme");
    let service = host.create_service(
        &org,
        json!({ "name": "notes", "image": "registry.example.com/notes:1", "volumes": [{ "name": "data", "mountPath": "/data" }] }),
    );
    let replica = Replica {
        cluster_id: "cluster_a".into(),
        node_id: "node_a".into(),
        slot: "node_a.0".into(),
        assignment_id: "asg_1".into(),
        intent: Intent::Run,
        phase: "running".into(),
        ready: true,
        image_digest: None,
    };
    host.set_service_replicas(&service, vec![replica]);
    (host, org, service)
}

fn backup(host: &TestHost) -> Value {
    let backups = host.documents("backups");
    assert_eq!(backups.len(), 1, "{backups:?}");
    backups[0].clone()
}

#[test]
fn an_archive_longer_than_one_ask_is_asked_for_again_on_later_passes() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let (host, org, service) = host();
    let agents = Agents::answering(vec![
        Ok(json!({ "running": true, "backupId": "b", "elapsedMs": 8000 })),
        Err(HostRefusal::new("volume-missing", "no volume data of the service on this node")),
    ]);
    host.set_agent_dispatch(agents.clone());
    host.call("create", json!({ "organizationId": org, "serviceId": service })).unwrap();
    host.reconcile(&[]).unwrap();
    let waiting = backup(&host);
    assert_eq!(waiting["state"], "pending", "still being made on the node: {waiting}");
    assert_eq!(waiting["archiving"]["nodeId"], "node_a", "{waiting}");
    let asked = agents.asked();
    assert_eq!((asked[0].node_id.as_deref(), asked[0].method.as_str()), (Some("node_a"), "backups.archive"));
    assert!(asked[0].body["waitMs"].as_u64().is_some_and(|w| w > 0), "{:?}", asked[0].body);

    // not asked again before its time; then asked, and its answer ends the backup
    host.reconcile(&[]).unwrap();
    assert_eq!(agents.asked().len(), 1, "asked again too soon");
    host.advance_clock(Duration::from_secs(3));
    host.reconcile(&[]).unwrap();
    assert_eq!(agents.asked().len(), 2);
    let failed = backup(&host);
    assert_eq!((failed["state"].as_str(), failed["reason"]["code"].as_str()), (Some("failed"), Some("volume-missing")), "{failed}");
}

#[test]
fn a_node_that_stays_away_fails_its_backup_with_the_nodes_refusal_after_an_hour() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let (host, org, service) = host();
    // the node has no runtime session; the cluster's relay runs on another node
    let away = HostRefusal::new("node-not-connected", "node node_a has no runtime session").retryable();
    let foreign = HostRefusal::new("backup-node-foreign", "this relay runs on node_b");
    let agents = Agents::answering(vec![Err(away.clone()), Err(foreign.clone()), Err(away), Err(foreign)]);
    host.set_agent_dispatch(agents.clone());
    host.call("create", json!({ "organizationId": org, "serviceId": service })).unwrap();
    host.reconcile(&[]).unwrap();
    let waiting = backup(&host);
    assert_eq!(waiting["state"], "pending", "{waiting}");
    assert_eq!(waiting["archiving"]["unreachable"]["code"], "node-not-connected", "why, in the node's words: {waiting}");
    let asked = agents.asked();
    assert_eq!((asked[1].node_id.as_deref(), asked[1].cluster_id.as_str()), (None, "cluster_a"), "then the cluster's relay");

    host.advance_clock(Duration::from_secs(3601));
    host.reconcile(&[]).unwrap();
    let failed = backup(&host);
    assert_eq!((failed["state"].as_str(), failed["reason"]["code"].as_str()), (Some("failed"), Some("node-not-connected")), "{failed}");
}
