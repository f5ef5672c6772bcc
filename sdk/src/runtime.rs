//! Where services run (docs/runtime.md): read (contract 0.3.1, capability `runtime:read`; a
//! release's rollout, [`service_rollout`], 0.3.4), and a service's spec set (contract 0.3.2,
//! capability `runtime:write`, [`set_service_spec`]).
//!
//! A service runs on a cluster through replica slots `<nodeId>.<index>` on the cluster's nodes;
//! a slot never moves node. Each slot holds one assignment at a time (one attempt to run the
//! service there) that walks [`Intent::Run`] → [`Intent::Stop`] → [`Intent::Remove`], and its
//! node reports what became of it. A manager reads this instead of nodes stated by hand:
//!
//! ```no_run
//! use capstan_sdk::runtime;
//!
//! # fn demo() -> capstan_sdk::Result<()> {
//! // the nodes a route should send traffic to: the service's ready replicas
//! let mut nodes: Vec<String> =
//!     runtime::service_replicas("svc_web")?.into_iter().filter(|r| r.ready).map(|r| r.node_id).collect();
//! nodes.dedup();
//! // …and the addresses they are reached at (also needs `inventory:read`)
//! let mut addresses = runtime::NodeAddresses::default();
//! if let Some(reach) = runtime::reach("svc_web", Some("cluster_a"), &mut addresses)? {
//!     println!("ready at {:?}; no address stated by {:?}", reach.ready, reach.unaddressed);
//! }
//! # Ok(()) }
//! ```
//!
//! Every service is visible, as [`crate::inventory::get`] reads them; refused
//! `service-not-found` for one that does not exist, `capability-denied` without
//! `runtime:read`. A method declared read-only may call it.

use crate::Result;
use crate::bindings::capstan::plugin::runtime as wit;
use crate::inventory::{self, EntityKind};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a slot's current assignment asks of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Intent {
    /// Run the service there.
    Run,
    /// Stop it (the attempt drifted from what is desired, is no longer desired, or failed).
    Stop,
    /// Remove its container once stopped.
    Remove,
}

/// One replica slot of a service and what its node last said of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Replica {
    /// The cluster the slot belongs to.
    pub cluster_id: String,
    /// The node it stands on, for good.
    pub node_id: String,
    /// `<nodeId>.<index>`.
    pub slot: String,
    /// The slot's current assignment (`asg_…`); a new attempt takes a new id.
    pub assignment_id: String,
    /// What the assignment asks of the node.
    pub intent: Intent,
    /// The node's words: `pulling`, `starting`, `running`, `unhealthy`, `exited`, `failed`;
    /// `pending` before the node said anything of this assignment; `stopped` and `removed` once
    /// it reported doing so. A later host may add words: treat an unknown one as not running.
    pub phase: String,
    /// Its health check passes (a running container without one is ready) and it is meant to
    /// run. Only a ready replica should be sent traffic.
    pub ready: bool,
    /// The image digest (`sha256:…`) the node said the container runs, once it said so.
    pub image_digest: Option<String>,
}

impl From<wit::Replica> for Replica {
    fn from(r: wit::Replica) -> Self {
        Replica {
            cluster_id: r.cluster_id,
            node_id: r.node_id,
            slot: r.slot,
            assignment_id: r.assignment_id,
            intent: match r.intent {
                wit::Intent::Run => Intent::Run,
                wit::Intent::Stop => Intent::Stop,
                wit::Intent::Remove => Intent::Remove,
            },
            phase: r.phase,
            ready: r.ready,
            image_digest: r.image_digest,
        }
    }
}

/// Every replica slot of the service, on every cluster it runs on, ordered by cluster then
/// slot; empty when it runs nowhere.
pub fn service_replicas(service_id: &str) -> Result<Vec<Replica>> {
    Ok(wit::service_replicas(service_id)?.into_iter().map(Replica::from).collect())
}

/// The service's runtime specs, one per cluster it is meant to run on, ordered by cluster:
/// each with its id, revision and the spec's fields (`clusterId`, `placement`,
/// `replicasPerNode`, `hold`, `restart`, `health`, `secrets`, …) as `runtime.getServiceSpec`
/// shows them. Capability `runtime:read` (contract 0.3.2).
pub fn service_specs(service_id: &str) -> Result<Vec<crate::store::Doc<serde_json::Value>>> {
    wit::service_specs(service_id)?.iter().map(|text| spec_doc(text)).collect()
}

fn spec_doc(text: &str) -> Result<crate::store::Doc<serde_json::Value>> {
    let answer: serde_json::Value =
        serde_json::from_str(text).map_err(|e| crate::Refusal::internal(format!("the host answered a spec that is not JSON: {e}")))?;
    Ok(crate::store::Doc {
        id: answer["id"].as_str().unwrap_or_default().to_string(),
        revision: answer["revision"].as_u64().unwrap_or_default(),
        data: answer["data"].clone(),
    })
}

/// Set a service's runtime spec on a cluster: `body` is `runtime.setServiceSpec`'s input
/// (`serviceId`, `clusterId`, `expectedRevision` — `null` for a first spec —, `placement`,
/// `replicasPerNode`, `restart`, `health`, `secrets`, `hold`), judged as that method judges it
/// for the caller (the plugin's own authority outside a call). Answers the spec stored with its
/// id and revision. Capability `runtime:write` (contract 0.3.2); not from a read-only method.
pub fn set_service_spec(body: &serde_json::Value) -> Result<crate::store::Doc<serde_json::Value>> {
    spec_doc(&wit::set_service_spec(&body.to_string())?)
}

/// Where one release of a service stands on the runtime (contract 0.3.4): the worst state of
/// its clusters.
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
    /// No runtime spec places the service.
    Unplaced,
    /// A word a later host added: not healthy.
    #[serde(other)]
    Other,
}

/// One replica a release still waits for, or that failed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Shortfall {
    /// `<nodeId>.<index>`.
    pub slot: String,
    /// Its node.
    pub node_id: String,
    /// Where it stands.
    pub state: RolloutState,
    /// Why, in words (`not-admitted`, `runs-another-release`, `pulling`, `not-ready`, …).
    pub reason: String,
}

/// One cluster of a release's rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRollout {
    /// The cluster.
    pub cluster_id: String,
    /// Where it stands there.
    pub state: RolloutState,
    /// The replicas its spec wants.
    pub wanted: u32,
    /// Those running the release's digest, ready.
    pub healthy: u32,
    /// Why the spec places no replica, when it places none (`spec-held`, `no-eligible-node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Every wanted replica that is not healthy.
    #[serde(default)]
    pub shortfall: Vec<Shortfall>,
}

/// Where one release of a service stands on the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// The worst of its clusters, or `unplaced`.
    pub state: RolloutState,
    /// One per cluster the service's runtime specs target.
    pub clusters: Vec<ClusterRollout>,
}

/// Where the release `digest` (`sha256:…`) of the service stands, judged as the deployment path
/// judges a promoted release: a replica counts only when it runs exactly that digest, ready.
/// Capability `runtime:read` (contract 0.3.4); refused `invalid-request` for a malformed digest.
pub fn service_rollout(service_id: &str, digest: &str) -> Result<Rollout> {
    let text = wit::service_rollout(service_id, digest)?;
    serde_json::from_str(&text).map_err(|e| crate::Refusal::internal(format!("the host answered a rollout that does not read: {e}")))
}

/// The digest (`sha256:…`) the service's image runs as: the one it pins, else the one the
/// runtime resolved its tag to; `None` while that tag is not resolved (yet). Capability
/// `runtime:read` (contract 0.3.5).
pub fn service_image_digest(service_id: &str) -> Result<Option<String>> {
    Ok(wit::service_image_digest(service_id)?)
}

/// Hold the service's replicas from starting while `waiting` names why (a kebab-case code such
/// as `bindings-pending`); `None` lifts this plugin's gate. While a gate waits, every target of
/// the service waits with that reason and decides nothing: no replica starts, none running
/// stops. Capability `runtime:write` (contract 0.3.6); not from a read-only method.
pub fn set_service_gate(service_id: &str, waiting: Option<&str>) -> Result<()> {
    Ok(wit::set_service_gate(service_id, waiting)?)
}

/// Where a service's ready replicas are reached from other machines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    /// The addresses of the nodes where a replica is ready (their `nodes.get` `address`), sorted,
    /// each once.
    pub ready: Vec<String>,
    /// The nodes where a replica is ready that state no address (several addresses, none
    /// advertised with `capstan-agent run --advertise-address`), sorted.
    pub unaddressed: Vec<String>,
}

/// Node addresses as one pass read them: each node read once.
#[derive(Debug, Default)]
pub struct NodeAddresses(BTreeMap<String, Option<String>>);

impl NodeAddresses {
    /// Where `node_id`'s published ports are reached (`nodes.get`'s `address`), if it states it.
    pub fn of(&mut self, node_id: &str) -> Result<Option<String>> {
        if let Some(address) = self.0.get(node_id) {
            return Ok(address.clone());
        }
        let node = inventory::get::<serde_json::Value>(EntityKind::Node, node_id)?;
        let address = node.and_then(|n| n.data["address"].as_str().map(str::to_string));
        self.0.insert(node_id.to_string(), address.clone());
        Ok(address)
    }
}

/// Where the ready replicas of `service_id` on `cluster_id` (on every cluster: `None`) are
/// reached; `None` when it has no replica there (it runs outside Capstan's runtime, or
/// elsewhere). Needs `runtime:read` and `inventory:read`.
pub fn reach(service_id: &str, cluster_id: Option<&str>, addresses: &mut NodeAddresses) -> Result<Option<Reach>> {
    let replicas: Vec<Replica> =
        service_replicas(service_id)?.into_iter().filter(|r| cluster_id.is_none_or(|c| r.cluster_id == c)).collect();
    if replicas.is_empty() {
        return Ok(None);
    }
    let mut reach = Reach::default();
    for replica in replicas.iter().filter(|r| r.ready) {
        match addresses.of(&replica.node_id)? {
            Some(address) => reach.ready.push(address),
            None => reach.unaddressed.push(replica.node_id.clone()),
        }
    }
    for list in [&mut reach.ready, &mut reach.unaddressed] {
        list.sort();
        list.dedup();
    }
    Ok(Some(reach))
}
