//! `fleet.*` API methods.

use super::runtime::Assignments;
use super::{lease, listing, read_freeze, read_nodes};
use capstan_core::refusal::Refusal;
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::Deserialize;

/// The parameters of a method that takes none (unknown fields are refused).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// The same facts as `capstan fleet nodes --json`.
#[derive(serde::Serialize, JsonSchema)]
#[serde(transparent)]
pub struct ListingJson(#[schemars(with = "serde_json::Value")] listing::Listing);

/// Where the coordinator placed the fleet's background work, and under which fence.
#[derive(serde::Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rebalanced {
    /// The node that decided (the coordinator lease's holder).
    pub decided_by: String,
    /// The coordinator lease's fence the placements were decided under.
    pub fence: u64,
    /// When they were decided, in milliseconds since the Unix epoch.
    pub decided_at: u64,
    /// Workload id → the nodes it runs on.
    pub placements: std::collections::BTreeMap<String, Vec<String>>,
}

/// What the fleet's methods reach: the blobs the fleet coordinates through, the liveness
/// window, and this process's place in the fleet (absent in a test host that takes no part).
#[derive(Clone)]
pub struct Context {
    /// The bucket the fleet coordinates through.
    pub blobs: capstan_blobs::Blobs,
    /// The fleet's timing, against which liveness is judged.
    pub timing: super::Timing,
    /// This process's fleet runtime; `None` when it takes no part in a fleet.
    pub fleet: Option<std::sync::Arc<super::runtime::Fleet>>,
}

/// Register the admin-only `fleet.rebalance` (coordinator-only) and `fleet.listNodes` methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "fleet.rebalance",
            "Decide where background work runs now, on the coordinator (any node forwards it there)",
            Access::Admin,
            |cx: Context, _: Call, _: Empty| async move {
                let fleet =
                    cx.fleet.ok_or_else(|| Refusal::new("coordinator-unavailable", "this process takes no part in a fleet").retryable())?;
                let Assignments { fence, decided_at, placements, .. } = fleet.rebalance().await?;
                Ok(Rebalanced { decided_by: fleet.node.identity.id.clone(), fence, decided_at, placements })
            },
        )
        .coordinator_only();

    registry.add(
        "fleet.listNodes",
        "The fleet's nodes, versions, coordinator and freeze, judged on one clock",
        Access::Admin,
        |cx: Context, _: Call, _: Empty| async move {
            let blobs = &cx.blobs;
            let nodes = read_nodes(blobs).await?;
            let listing = listing::build(
                capstan_core::clock::now_ms(),
                &cx.timing,
                &nodes,
                read_freeze(blobs).await?,
                lease::read_lease(blobs).await?,
            );
            Ok(ListingJson(listing))
        },
    );
}
