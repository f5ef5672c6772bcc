//! What a promoted release does on the runtime. The runtime answers, per cluster the service's
//! runtime specs target, whether its replicas run exactly the release's digest ([`Rollouts`]);
//! `deployments.getStatus` reports it, and route promotion waits for every cluster healthy
//! (`rollout-not-healthy`, with the shortfall).

use capstan_core::refusal::{Refusal, Result};
use capstan_store::Tx;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Where a rollout (or one of its clusters) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RolloutState {
    /// Some replica is admitted or starting, none failed.
    Starting,
    /// Every replica the spec wants runs the release's digest and is ready.
    Healthy,
    /// A replica of the release failed (its container exited, or runs another digest).
    Failed,
    /// A replica of the release was stopped.
    Unhealthy,
    /// The service runs another release now (rollouts only).
    Superseded,
    /// No runtime spec places the service: nothing of Capstan's runtime runs it, and its routes
    /// are judged by their HTTPS check alone (rollouts only).
    Unplaced,
}

/// One replica the rollout still waits for, or that failed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Shortfall {
    /// The slot (`<nodeId>.<index>`).
    pub slot: String,
    /// Its node.
    pub node_id: String,
    /// Where it stands.
    pub state: RolloutState,
    /// Why, in words: `not-admitted`, `runs-another-release`, `pending`, `pulling`,
    /// `starting`, `not-ready`, `stopped`, `digest-mismatch`, or the node's phase and cause.
    pub reason: String,
}

/// One target cluster of a rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRollout {
    /// The cluster.
    pub cluster_id: String,
    /// Where it stands: `starting`, `healthy`, `failed` or `unhealthy`.
    pub state: RolloutState,
    /// The replicas its spec wants (placed nodes × replicas per node).
    pub wanted: u32,
    /// Those running the release's digest, ready.
    pub healthy: u32,
    /// Why the spec places no replica, when it places none (`spec-held`, `no-eligible-node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Every wanted replica that is not healthy.
    pub shortfall: Vec<Shortfall>,
}

impl ClusterRollout {
    /// The cluster's state from its wanted replicas' states: a failed one fails it, a stopped
    /// one makes it unhealthy, all healthy (and at least one) is healthy, else starting.
    pub fn judge(cluster_id: &str, wanted: u32, shortfall: Vec<Shortfall>, reason: Option<String>) -> ClusterRollout {
        let has = |state| shortfall.iter().any(|s| s.state == state);
        let state = if has(RolloutState::Failed) {
            RolloutState::Failed
        } else if has(RolloutState::Unhealthy) {
            RolloutState::Unhealthy
        } else if shortfall.is_empty() && wanted > 0 {
            RolloutState::Healthy
        } else {
            RolloutState::Starting
        };
        let healthy = wanted.saturating_sub(shortfall.len() as u32);
        ClusterRollout { cluster_id: cluster_id.into(), state, wanted, healthy, reason, shortfall }
    }
}

/// A promoted operation's rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// The worst of its clusters (failed, unhealthy, starting, healthy), or `superseded`, or
    /// `unplaced`.
    pub state: RolloutState,
    /// One per cluster the service's runtime specs target.
    pub clusters: Vec<ClusterRollout>,
}

impl Rollout {
    /// The rollout of its clusters: the worst state among them, `unplaced` when there are none.
    pub fn of(clusters: Vec<ClusterRollout>) -> Rollout {
        let worst = [RolloutState::Failed, RolloutState::Unhealthy, RolloutState::Starting]
            .into_iter()
            .find(|state| clusters.iter().any(|c| c.state == *state));
        let state = match worst {
            Some(state) => state,
            None if clusters.is_empty() => RolloutState::Unplaced,
            None => RolloutState::Healthy,
        };
        Rollout { state, clusters }
    }

    /// Whether routes may be promoted on it: every cluster healthy, or nothing placed.
    pub fn routable(&self) -> bool {
        matches!(self.state, RolloutState::Healthy | RolloutState::Unplaced)
    }
}

/// The runtime's evidence of a release, read inside the caller's transaction (the server
/// supplies the runtime's; the registry knows no runtime).
#[async_trait::async_trait]
pub trait Rollouts: Send + Sync {
    /// Per cluster the service's runtime specs target, its replicas against `digest`.
    async fn clusters(&self, tx: &Tx, service_id: &str, digest: &str) -> Result<Vec<ClusterRollout>>;
}

/// No runtime: every service is unplaced (the registry's own tests).
pub struct NoRuntime;

#[async_trait::async_trait]
impl Rollouts for NoRuntime {
    async fn clusters(&self, _: &Tx, _: &str, _: &str) -> Result<Vec<ClusterRollout>> {
        Ok(Vec::new())
    }
}

/// The rollout of operation `id` of `service_id`, once promoted (`digest`: the release it
/// promoted, `None` before): `superseded` once the service runs another release.
pub async fn rollout_of(rollouts: &dyn Rollouts, tx: &Tx, id: &str, service_id: &str, digest: Option<&str>) -> Result<Option<Rollout>> {
    let Some(digest) = digest else { return Ok(None) };
    let current = match tx.get(capstan_inventory::SERVICES, service_id).await? {
        Some(doc) => doc.data["release"]["operationId"].as_str() == Some(id),
        None => false,
    };
    if !current {
        return Ok(Some(Rollout { state: RolloutState::Superseded, clusters: Vec::new() }));
    }
    Ok(Some(Rollout::of(rollouts.clusters(tx, service_id, digest).await?)))
}

/// `rollout-not-healthy`, with the shortfall, unless `rollout` lets routes be promoted.
pub fn require_routable(rollout: Option<&Rollout>) -> Result<()> {
    match rollout {
        Some(r) if !r.routable() => {
            let short: usize = r.clusters.iter().map(|c| c.wanted.saturating_sub(c.healthy) as usize).sum();
            Err(Refusal::new(
                "rollout-not-healthy",
                format!(
                    "the release's rollout is {}: {short} replica(s) do not run its digest ready yet; routes are promoted once every replica does",
                    serde_json::to_value(r.state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
                ),
            )
            .retryable()
            .with_data(json!({ "rollout": r })))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short(state: RolloutState) -> Shortfall {
        Shortfall { slot: "node_b.0".into(), node_id: "node_b".into(), state, reason: "pulling".into() }
    }

    #[test]
    fn a_rollout_is_its_worst_cluster_and_only_healthy_or_unplaced_take_routes() {
        let healthy = ClusterRollout::judge("cluster_a", 2, vec![], None);
        let starting = ClusterRollout::judge("cluster_b", 2, vec![short(RolloutState::Starting)], None);
        let failed = ClusterRollout::judge("cluster_c", 1, vec![short(RolloutState::Failed), short(RolloutState::Unhealthy)], None);
        assert_eq!((healthy.state, healthy.healthy), (RolloutState::Healthy, 2));
        assert_eq!((starting.state, starting.healthy), (RolloutState::Starting, 1));
        assert_eq!(failed.state, RolloutState::Failed, "a failed replica outweighs a stopped one");
        // a spec that wants nothing is never healthy
        assert_eq!(ClusterRollout::judge("cluster_d", 0, vec![], Some("spec-held".into())).state, RolloutState::Starting);

        assert!(Rollout::of(vec![healthy.clone()]).routable());
        assert!(Rollout::of(vec![]).routable(), "unplaced: judged by the route check alone");
        assert_eq!(Rollout::of(vec![]).state, RolloutState::Unplaced);
        let mixed = Rollout::of(vec![healthy.clone(), starting.clone()]);
        assert_eq!((mixed.state, mixed.routable()), (RolloutState::Starting, false));
        assert_eq!(Rollout::of(vec![healthy, starting, failed]).state, RolloutState::Failed);
    }

    #[test]
    fn routes_are_refused_with_the_shortfall_while_the_rollout_is_not_healthy() {
        let starting = Rollout::of(vec![ClusterRollout::judge("cluster_b", 2, vec![short(RolloutState::Starting)], None)]);
        let refused = require_routable(Some(&starting)).unwrap_err();
        assert_eq!(refused.code, "rollout-not-healthy");
        assert!(refused.message.contains("starting") && refused.message.contains("1 replica(s)"), "{}", refused.message);
        assert_eq!(refused.data.as_ref().unwrap()["rollout"]["clusters"][0]["shortfall"][0]["reason"], "pulling");
        assert!(require_routable(None).is_ok(), "an operation not promoted is judged by its state");
        let superseded = Rollout { state: RolloutState::Superseded, clusters: vec![] };
        assert!(require_routable(Some(&superseded)).is_err());
    }
}
