//! The SDK's test harness stands in for the runtime: a plugin granted `runtime:read` reads the
//! replicas a test seeded (`TestHost::set_service_replicas`), an empty list for a service that
//! runs nowhere, and is refused `capability-denied` without the grant.

use capstan_sdk::runtime::{Intent, Replica};
use capstan_sdk::testing::TestHost;
use serde_json::json;

fn replica(cluster: &str, node: &str, index: u32, phase: &str, ready: bool) -> Replica {
    Replica {
        cluster_id: cluster.into(),
        node_id: node.into(),
        slot: format!("{node}.{index}"),
        assignment_id: format!("asg_{node}_{index}"),
        intent: Intent::Run,
        phase: phase.into(),
        ready,
        image_digest: ready.then(|| "sha256:abc".to_string()),
    }
}

#[test]
fn the_harness_answers_the_replicas_a_test_seeded() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let dir = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{dir}/capstan-plugin.toml")).unwrap();
    let granted = manifest.replacen(r#"requested = ["store", "log"]"#, r#"requested = ["store", "log", "runtime:read"]"#, 1);
    assert_ne!(granted, manifest, "the manifest requests store and log");
    let host = TestHost::build_with_manifest(dir, &granted);

    // nothing seeded: this host runs no services, and knows none
    let missing = host.call("replicas", json!({ "serviceId": "svc_web" })).unwrap_err();
    assert_eq!(missing.code(), "service-not-found");

    // seeded: answered by cluster then slot, whether or not the service exists here
    host.set_service_replicas("svc_web", vec![replica("c2", "n3", 0, "pulling", false), replica("c1", "n1", 0, "running", true)]);
    let read = host.call("replicas", json!({ "serviceId": "svc_web" })).unwrap();
    assert_eq!(
        read["replicas"],
        json!([
            { "clusterId": "c1", "nodeId": "n1", "slot": "n1.0", "assignmentId": "asg_n1_0", "intent": "run",
              "phase": "running", "ready": true, "imageDigest": "sha256:abc" },
            { "clusterId": "c2", "nodeId": "n3", "slot": "n3.0", "assignmentId": "asg_n3_0", "intent": "run",
              "phase": "pulling", "ready": false, "imageDigest": null },
        ]),
        "{read}"
    );
    host.set_service_replicas("svc_idle", vec![]);
    assert_eq!(host.call("replicas", json!({ "serviceId": "svc_idle" })).unwrap()["replicas"], json!([]));

    // not granted: refused by name
    let ungranted = TestHost::build(dir);
    ungranted.set_service_replicas("svc_web", vec![replica("c1", "n1", 0, "running", true)]);
    let refused = ungranted.call("replicas", json!({ "serviceId": "svc_web" })).unwrap_err();
    assert_eq!(refused.code(), "capability-denied");
}
