//! A restore stops the service's replicas around it: before the agent swaps the volumes, the
//! service's runtime spec on the restore's cluster is put on hold (`runtime.set-service-spec`,
//! the spec as read with `hold: true`), and the restore waits — across passes — until no
//! replica of the service on its node runs; once applied (or failed), the hold is released, so
//! the replicas start again on the restored data.
//!
//! A spec an operator held already stays held (the restore only waits for its replicas); a spec
//! changed since the restore held it is left as it stands (the operator's word wins). A service
//! without a spec on the cluster runs outside Capstan's runtime: nothing is stopped.

use crate::records::Held;
use capstan_sdk::runtime::{self, Intent};
use capstan_sdk::{Result, Value, json};

/// The fields of a stored spec that `runtime.setServiceSpec` takes back.
const SPEC_FIELDS: [&str; 6] = ["placement", "replicasPerNode", "hold", "restart", "health", "secrets"];

/// Put the service's spec on `cluster_id` on hold for a restore: `None` when it has none there.
pub(crate) fn hold(service_id: &str, cluster_id: &str) -> Result<Option<Held>> {
    let Some(spec) = runtime::service_specs(service_id)?.into_iter().find(|s| s.data["clusterId"] == cluster_id) else {
        return Ok(None);
    };
    if spec.data["hold"] == true {
        return Ok(Some(Held { cluster_id: cluster_id.to_string(), spec_revision: spec.revision, ours: false }));
    }
    let written = runtime::set_service_spec(&body(service_id, cluster_id, spec.revision, &spec.data, true))?;
    Ok(Some(Held { cluster_id: cluster_id.to_string(), spec_revision: written.revision, ours: true }))
}

/// Whether no replica of the service on `nodes` runs: each there is meant to stop or be
/// removed and its node said it did.
pub(crate) fn stopped_on(service_id: &str, nodes: &[&str]) -> Result<bool> {
    Ok(runtime::service_replicas(service_id)?
        .iter()
        .filter(|r| nodes.contains(&r.node_id.as_str()))
        .all(|r| r.intent != Intent::Run && matches!(r.phase.as_str(), "stopped" | "removed")))
}

/// Release a restore's hold: the spec as the restore left it is set running again; one held by
/// the operator, or changed since, is left as it stands. Answers whether it was released.
pub(crate) fn release(service_id: &str, held: &Held) -> Result<bool> {
    if !held.ours {
        return Ok(false);
    }
    let Some(spec) = runtime::service_specs(service_id)?.into_iter().find(|s| s.data["clusterId"] == held.cluster_id.as_str()) else {
        return Ok(false);
    };
    if spec.revision != held.spec_revision || spec.data["hold"] != true {
        capstan_sdk::warn!(
            "the runtime spec of {service_id} on {} changed during its restore; its hold is left as it stands",
            held.cluster_id
        );
        return Ok(false);
    }
    match runtime::set_service_spec(&body(service_id, &held.cluster_id, spec.revision, &spec.data, false)) {
        Ok(_) => Ok(true),
        // changed in between: the operator's word wins
        Err(r) if r.is("conflict") => Ok(false),
        Err(r) => Err(r),
    }
}

/// `runtime.setServiceSpec`'s input: the stored spec's fields, at `revision`, held or not.
fn body(service_id: &str, cluster_id: &str, revision: u64, spec: &Value, hold: bool) -> Value {
    let mut body = json!({ "serviceId": service_id, "clusterId": cluster_id, "expectedRevision": revision });
    for field in SPEC_FIELDS {
        if let Some(value) = spec.get(field).filter(|v| !v.is_null()) {
            body[field] = value.clone();
        }
    }
    body["hold"] = json!(hold);
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_carries_the_spec_back_with_the_hold_changed_and_nothing_it_does_not_take() {
        let stored = json!({ "serviceId": "svc_1", "clusterId": "cl_1", "organizationId": "org_1", "placement": { "nodes": ["node_a"] },
                             "replicasPerNode": 1, "hold": false, "restart": "on-failure", "health": { "kind": "none" },
                             "updatedAt": 5, "updatedBy": "user_1" });
        let held = body("svc_1", "cl_1", 3, &stored, true);
        assert_eq!(
            held,
            json!({ "serviceId": "svc_1", "clusterId": "cl_1", "expectedRevision": 3, "placement": { "nodes": ["node_a"] },
                    "replicasPerNode": 1, "hold": true, "restart": "on-failure", "health": { "kind": "none" } })
        );
        assert_eq!(body("svc_1", "cl_1", 4, &stored, false)["hold"], false);
    }
}
