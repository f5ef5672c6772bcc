//! Rollout evidence: per cluster a service's runtime specs target, whether the replicas its
//! spec wants run exactly a release's digest — the one their assignment was admitted with and
//! the one their node observed — ready (the registry's `deployments.*` read it through
//! [`Evidence`]). A run of another release never vouches for this one.

use crate::producer::{ClusterView, read_cluster};
use crate::slots::{self, Slot};
use crate::spec::{self, Spec};
use crate::transition::Intent;
use capstan_core::refusal::Result;
use capstan_inventory::Entity;
use capstan_registry::rollout::{ClusterRollout, RolloutState, Rollouts, Shortfall};
use capstan_store::Tx;
use std::collections::BTreeMap;

/// The runtime's answer to the registry's [`Rollouts`].
pub struct Evidence;

#[async_trait::async_trait]
impl Rollouts for Evidence {
    async fn clusters(&self, tx: &Tx, service_id: &str, digest: &str) -> Result<Vec<ClusterRollout>> {
        if !tx.is_declared(crate::RUNTIME_SPECS) {
            return Ok(Vec::new());
        }
        let mut clusters = Vec::new();
        for spec in spec::of_service(tx, service_id).await? {
            let cluster = read_cluster(tx, &spec.data.cluster_id).await?;
            let slots = slots::of_service_in(tx, service_id, &spec.data.cluster_id).await?;
            clusters.push(evaluate(&spec.data, &cluster, &slots, digest));
        }
        Ok(clusters)
    }
}

/// The digest an image reference pins (`…@sha256:…`).
fn pinned_digest(image: &str) -> Option<&str> {
    image.rsplit_once('@').map(|(_, digest)| digest)
}

/// Judge one cluster: every slot the spec wants (its placed active nodes × replicas per node)
/// against `digest`.
pub fn evaluate(spec: &Spec, cluster: &ClusterView, slots: &[Entity<Slot>], digest: &str) -> ClusterRollout {
    let wanted = crate::producer::wanted_slots(spec, cluster);
    let reason = match () {
        _ if spec.hold => Some("spec-held".to_string()),
        // every placed node held (a restore on each): nothing is meant to run meanwhile
        _ if wanted.is_empty() && !spec.held_nodes.is_empty() => Some("spec-held".to_string()),
        _ if wanted.is_empty() => Some("no-eligible-node".to_string()),
        _ => cluster.phase.as_ref().err().cloned(),
    };
    let by_name: BTreeMap<&str, &Slot> = slots.iter().map(|s| (s.data.slot.as_str(), &s.data)).collect();
    let shortfall = wanted
        .iter()
        .filter_map(|(name, node_id)| {
            let (state, why) = match by_name.get(name.as_str()) {
                None => (RolloutState::Starting, "not-admitted".to_string()),
                Some(slot) => judge_slot(slot, digest)?,
            };
            Some(Shortfall { slot: name.clone(), node_id: node_id.clone(), state, reason: why })
        })
        .collect();
    ClusterRollout::judge(&spec.cluster_id, wanted.len() as u32, shortfall, reason)
}

/// Where one wanted slot stands against `digest`; `None` when it runs it, ready.
fn judge_slot(slot: &Slot, digest: &str) -> Option<(RolloutState, String)> {
    let a = &slot.assignment;
    if pinned_digest(&a.work.image) != Some(digest) {
        return Some((RolloutState::Starting, "runs-another-release".into()));
    }
    if a.intent != Intent::Run || a.stopped_at.is_some() {
        return Some((RolloutState::Unhealthy, "stopped".into()));
    }
    let Some(observed) = &a.observation else { return Some((RolloutState::Starting, "pending".into())) };
    if observed.image_digest.as_deref().is_some_and(|d| d != digest) {
        return Some((RolloutState::Failed, "digest-mismatch".into()));
    }
    if observed.failed() {
        let why = match &observed.cause {
            Some(cause) => format!("{}: {cause}", observed.phase),
            None => observed.phase.clone(),
        };
        return Some((RolloutState::Failed, why));
    }
    match (observed.ready, observed.image_digest.as_deref()) {
        (true, Some(_)) => None,
        (true, None) => Some((RolloutState::Starting, "digest-unobserved".into())),
        (false, _) if observed.phase == "running" => Some((RolloutState::Starting, "not-ready".into())),
        (false, _) => Some((RolloutState::Starting, observed.phase.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::Observation;
    use crate::spec::Placement;
    use capstan_inventory::clusters::Phase;
    use capstan_nodes::records::Node;
    use serde_json::json;

    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    const D3: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";

    fn node(id: &str) -> (Entity<Node>, bool) {
        let data: Node = serde_json::from_value(json!({
            "clusterId": "cl_1", "name": id, "hostname": id, "hostnameIntent": null, "state": "active", "enrolledAt": 0, "credentialGeneration": 1
        }))
        .unwrap();
        (Entity { id: id.into(), revision: 1, data }, true)
    }

    fn spec(replicas: u32, hold: bool) -> Spec {
        crate::testing::spec(Placement { every_node: true, nodes: None }, replicas, hold)
    }

    fn slot(node: &str, digest: &str, intent: Intent, observed: Option<(&str, bool, Option<&str>)>) -> Entity<Slot> {
        let mut data = crate::testing::running_slot("svc_1", &crate::slots::slot_name(node, 0), &format!("asg_{node}"), 1, 1);
        data.node_id = node.into();
        data.assignment.work.image = format!("reg.example/workloads/web@{digest}");
        data.assignment.intent = intent;
        data.assignment.observation = observed.map(|(phase, ready, seen)| Observation {
            cause: (phase == "exited").then(|| "exit code 1".to_string()),
            ..crate::testing::observed(phase, ready, seen, 1)
        });
        Entity { id: format!("svc_1@{node}.0"), revision: 1, data }
    }

    fn cluster() -> ClusterView {
        ClusterView::new(Ok(Phase::Pallet), vec![node("nd_a"), node("nd_b")])
    }

    #[test]
    fn a_cluster_is_healthy_only_when_every_wanted_replica_runs_the_digest_ready() {
        let both = [
            slot("nd_a", D2, Intent::Run, Some(("running", true, Some(D2)))),
            slot("nd_b", D2, Intent::Run, Some(("running", true, Some(D2)))),
        ];
        let judged = evaluate(&spec(1, false), &cluster(), &both, D2);
        assert_eq!((judged.state, judged.wanted, judged.healthy), (RolloutState::Healthy, 2, 2), "{judged:?}");

        // one still runs the earlier release: starting, and it is named
        let mixed = [
            slot("nd_a", D2, Intent::Run, Some(("running", true, Some(D2)))),
            slot("nd_b", D3, Intent::Run, Some(("running", true, Some(D3)))),
        ];
        let judged = evaluate(&spec(1, false), &cluster(), &mixed, D2);
        assert_eq!((judged.state, judged.healthy), (RolloutState::Starting, 1));
        assert_eq!(judged.shortfall[0].reason, "runs-another-release");
        assert_eq!(judged.shortfall[0].node_id, "nd_b");

        // a second replica per node that was never admitted
        let judged = evaluate(&spec(2, false), &cluster(), &both, D2);
        assert_eq!((judged.state, judged.wanted, judged.healthy), (RolloutState::Starting, 4, 2));
        assert!(judged.shortfall.iter().all(|s| s.reason == "not-admitted"));
    }

    #[test]
    fn an_exited_replica_fails_the_cluster_a_stopped_one_makes_it_unhealthy_and_another_digest_is_a_mismatch() {
        let exited = [slot("nd_a", D3, Intent::Run, Some(("exited", false, Some(D3)))), slot("nd_b", D3, Intent::Run, None)];
        let judged = evaluate(&spec(1, false), &cluster(), &exited, D3);
        assert_eq!(judged.state, RolloutState::Failed);
        assert_eq!(judged.shortfall[0].reason, "exited: exit code 1");
        assert_eq!(judged.shortfall[1].reason, "pending");

        let stopped = [
            slot("nd_a", D2, Intent::Stop, Some(("running", true, Some(D2)))),
            slot("nd_b", D2, Intent::Run, Some(("running", true, Some(D2)))),
        ];
        assert_eq!(evaluate(&spec(1, false), &cluster(), &stopped, D2).state, RolloutState::Unhealthy);

        let mismatch = [
            slot("nd_a", D2, Intent::Run, Some(("running", true, Some(D3)))),
            slot("nd_b", D2, Intent::Run, Some(("running", true, Some(D2)))),
        ];
        let judged = evaluate(&spec(1, false), &cluster(), &mismatch, D2);
        assert_eq!((judged.state, judged.shortfall[0].reason.as_str()), (RolloutState::Failed, "digest-mismatch"));
    }

    #[test]
    fn a_held_spec_wants_nothing_and_is_never_healthy() {
        let judged = evaluate(&spec(1, true), &cluster(), &[], D2);
        assert_eq!((judged.state, judged.wanted, judged.reason.as_deref()), (RolloutState::Starting, 0, Some("spec-held")));
    }
}
