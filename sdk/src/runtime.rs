//! Where services run (docs/runtime.md), read-only (contract 0.3.1). Capability `runtime:read`.
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
//! # Ok(()) }
//! ```
//!
//! Every service is visible, as [`crate::inventory::get`] reads them; refused
//! `service-not-found` for one that does not exist, `capability-denied` without
//! `runtime:read`. A method declared read-only may call it.

use crate::Result;
use crate::bindings::capstan::plugin::runtime as wit;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
