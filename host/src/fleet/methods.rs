//! `fleet.*` API methods.

use super::runtime::Assignments;
use super::{lease, listing, read_freeze, read_nodes};
use crate::api::methods::{Access, Call, Registry};
use crate::refusal::Refusal;
use schemars::JsonSchema;
use serde::Deserialize;

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
    pub fence: u64,
    pub decided_at: u64,
    /// Workload id → the nodes it runs on.
    pub placements: std::collections::BTreeMap<String, Vec<String>>,
}

pub fn register(registry: &mut Registry) {
    registry
        .add(
            "fleet.rebalance",
            "Decide where background work runs now, on the coordinator (any node forwards it there)",
            Access::Admin,
            |call: Call, _: Empty| async move {
                let fleet = call
                    .state
                    .fleet
                    .clone()
                    .ok_or_else(|| Refusal::new("coordinator-unavailable", "this process takes no part in a fleet").retryable())?;
                let Assignments { fence, decided_at, placements, .. } = fleet.rebalance().await?;
                Ok(Rebalanced { decided_by: fleet.node.identity.id.clone(), fence, decided_at, placements })
            },
        )
        .coordinator_only();

    registry.add(
        "fleet.listNodes",
        "The fleet's nodes, versions, coordinator and freeze, judged on one clock",
        Access::Admin,
        |call: Call, _: Empty| async move {
            let blobs = &call.state.blobs;
            let nodes = read_nodes(blobs).await?;
            let listing = listing::build(
                super::now_ms(),
                &call.state.fleet_timing,
                &nodes,
                read_freeze(blobs).await?,
                lease::read_lease(blobs).await?,
            );
            Ok(ListingJson(listing))
        },
    );
}
