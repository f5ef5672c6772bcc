//! A restore stops the service's replicas around it — on the nodes it restores onto, and only
//! there: before the agent swaps the volumes, those nodes are added to the service's runtime
//! spec's `heldNodes` on the restore's cluster (`runtime.set-service-spec`), and the restore
//! waits — across passes — until no replica of the service on them runs; the replicas on the
//! cluster's other nodes keep serving. Once applied (or failed), the restore takes its nodes out
//! of `heldNodes` again, so the replicas start on the restored data.
//!
//! A node an operator held already (the whole spec, or the node) stays held: the restore only
//! waits for its replicas, and leaves it held after. A service without a spec on the cluster
//! runs outside Capstan's runtime: nothing is stopped.

use crate::records::Held;
use capstan_sdk::runtime::{self, Intent};
use capstan_sdk::{Result, Value, json};

/// The fields of a stored spec that `runtime.setServiceSpec` takes back.
const SPEC_FIELDS: [&str; 7] = ["placement", "replicasPerNode", "hold", "heldNodes", "restart", "health", "secrets"];

/// Hold `nodes` of the service's spec on `cluster_id` for a restore: `None` when it has no spec
/// there.
pub(crate) fn hold(service_id: &str, cluster_id: &str, nodes: &[&str]) -> Result<Option<Held>> {
    let Some(spec) = runtime::service_specs(service_id)?.into_iter().find(|s| s.data["clusterId"] == cluster_id) else {
        return Ok(None);
    };
    let already = held_nodes(&spec.data);
    let ours: Vec<String> = match spec.data["hold"] == true {
        true => Vec::new(),
        false => nodes.iter().filter(|n| !already.iter().any(|h| h == *n)).map(|n| n.to_string()).collect(),
    };
    if ours.is_empty() {
        return Ok(Some(Held { cluster_id: cluster_id.to_string(), spec_revision: spec.revision, ours: false, nodes: Vec::new() }));
    }
    let mut all = already;
    all.extend(ours.iter().cloned());
    all.sort();
    let written = runtime::set_service_spec(&body(service_id, cluster_id, spec.revision, &spec.data, &all))?;
    Ok(Some(Held { cluster_id: cluster_id.to_string(), spec_revision: written.revision, ours: true, nodes: ours }))
}

/// The nodes a stored spec holds.
fn held_nodes(spec: &Value) -> Vec<String> {
    spec["heldNodes"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

/// Whether no replica of the service on `nodes` runs: each there is meant to stop or be
/// removed and its node said it did.
pub(crate) fn stopped_on(service_id: &str, nodes: &[&str]) -> Result<bool> {
    Ok(runtime::service_replicas(service_id)?
        .iter()
        .filter(|r| nodes.contains(&r.node_id.as_str()))
        .all(|r| r.intent != Intent::Run && matches!(r.phase.as_str(), "stopped" | "removed")))
}

/// Release a restore's hold: its nodes leave the spec's `heldNodes` (whatever else was written
/// since stays); nodes the operator held stay held. Answers whether it was released.
pub(crate) fn release(service_id: &str, held: &Held) -> Result<bool> {
    if !held.ours {
        return Ok(false);
    }
    let Some(spec) = runtime::service_specs(service_id)?.into_iter().find(|s| s.data["clusterId"] == held.cluster_id.as_str()) else {
        return Ok(false);
    };
    let body = if held.nodes.is_empty() {
        // a hold of the whole spec, taken before restores held only their nodes: released
        // only as the restore left it (the operator's word wins)
        if spec.revision != held.spec_revision || spec.data["hold"] != true {
            capstan_sdk::warn!(
                "the runtime spec of {service_id} on {} changed during its restore; its hold is left as it stands",
                held.cluster_id
            );
            return Ok(false);
        }
        let mut body = body(service_id, &held.cluster_id, spec.revision, &spec.data, &held_nodes(&spec.data));
        body["hold"] = json!(false);
        body
    } else {
        let rest: Vec<String> = held_nodes(&spec.data).into_iter().filter(|n| !held.nodes.contains(n)).collect();
        body(service_id, &held.cluster_id, spec.revision, &spec.data, &rest)
    };
    // a `conflict` (written in between) is tried again by the next pass, on the spec read anew
    runtime::set_service_spec(&body).map(|_| true)
}

/// `runtime.setServiceSpec`'s input: the stored spec's fields, at `revision`, holding
/// `held_nodes`.
fn body(service_id: &str, cluster_id: &str, revision: u64, spec: &Value, held_nodes: &[String]) -> Value {
    let mut body = json!({ "serviceId": service_id, "clusterId": cluster_id, "expectedRevision": revision });
    for field in SPEC_FIELDS {
        if let Some(value) = spec.get(field).filter(|v| !v.is_null()) {
            body[field] = value.clone();
        }
    }
    body["heldNodes"] = json!(held_nodes);
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_carries_the_spec_back_with_the_held_nodes_changed_and_nothing_it_does_not_take() {
        let stored = json!({ "serviceId": "svc_1", "clusterId": "cl_1", "organizationId": "org_1", "placement": { "everyNode": true },
                             "replicasPerNode": 1, "hold": false, "heldNodes": ["node_z"], "restart": "on-failure",
                             "health": { "kind": "none" }, "updatedAt": 5, "updatedBy": "user_1" });
        let held = body("svc_1", "cl_1", 3, &stored, &["node_a".into(), "node_z".into()]);
        assert_eq!(
            held,
            json!({ "serviceId": "svc_1", "clusterId": "cl_1", "expectedRevision": 3, "placement": { "everyNode": true },
                    "replicasPerNode": 1, "hold": false, "heldNodes": ["node_a", "node_z"], "restart": "on-failure",
                    "health": { "kind": "none" } })
        );
        assert_eq!(held_nodes(&stored), vec!["node_z".to_string()]);
        assert_eq!(body("svc_1", "cl_1", 4, &stored, &[])["heldNodes"], json!([]));
    }
}
