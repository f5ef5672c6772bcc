//! `fleet.*` API methods.

use super::runtime::{Assignments, Fleet};
use super::{Freeze, freeze, lease, listing, read_freeze, read_nodes, unfreeze};
use capstan_core::refusal::Refusal;
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::Deserialize;
use std::sync::Arc;

/// How long `fleet.listNodes` waits for the bucket before it answers `blobs-unavailable`.
pub const LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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

/// What `fleet.freeze` takes: why deploys stop (the caller is recorded as who).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FreezeParams {
    /// Why, 1 to 500 bytes; shown to everyone who lists the fleet or is refused `deploy-frozen`.
    pub reason: String,
}

/// The freeze `fleet.freeze` put in place.
#[derive(serde::Serialize, JsonSchema)]
#[serde(transparent)]
pub struct FreezeJson(#[schemars(with = "serde_json::Value")] Freeze);

/// What `fleet.unfreeze` did.
#[derive(serde::Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unfrozen {
    /// `false` when no freeze was standing.
    pub lifted: bool,
}

/// Register the `fleet.*` methods, answered from this node's place in the fleet.
pub fn register(registry: &mut Registry, fleet: Arc<Fleet>) {
    let mut registry = registry.with(fleet);
    registry
        .add(
            "fleet.rebalance",
            "Decide where background work runs now, on the coordinator (any node forwards it there)",
            Access::Admin,
            |fleet: Arc<Fleet>, _: Call, _: Empty| async move {
                let Assignments { fence, decided_at, placements, .. } = fleet.rebalance().await?;
                Ok(Rebalanced { decided_by: fleet.node.identity.id.clone(), fence, decided_at, placements })
            },
        )
        .refuses(&["fence-stale", "blobs-unavailable", "fleet-record-invalid"])
        .coordinator_only();

    registry
        .add(
            "fleet.freeze",
            "Freeze deploys: plugin installs and upgrades are refused deploy-frozen until it is lifted",
            Access::Admin,
            |fleet: Arc<Fleet>, call: Call, params: FreezeParams| async move {
                let by = call.identity()?.username.clone();
                Ok(FreezeJson(freeze(&fleet.node.blobs, &by, &params.reason).await?))
            },
        )
        .refuses(&["deploy-frozen", "blobs-unavailable"]);
    registry
        .add("fleet.unfreeze", "Lift the deploy freeze", Access::Admin, |fleet: Arc<Fleet>, _: Call, _: Empty| async move {
            Ok(Unfrozen { lifted: unfreeze(&fleet.node.blobs).await? })
        })
        .refuses(&["blobs-unavailable"]);

    registry
        .add(
            "fleet.listNodes",
            "The fleet's nodes, versions, coordinator and freeze, judged on one clock",
            Access::Admin,
            |fleet: Arc<Fleet>, _: Call, _: Empty| async move {
                let blobs = &fleet.node.blobs;
                let read = async { tokio::try_join!(read_nodes(blobs), read_freeze(blobs), lease::read_lease(blobs)) };
                let (nodes, freeze, lease) = tokio::time::timeout(LIST_TIMEOUT, read)
                    .await
                    .map_err(|_| Refusal::new("blobs-unavailable", "the blob storage did not answer in time").retryable())??;
                Ok(ListingJson(listing::build(capstan_core::clock::now_ms(), &fleet.node.timing, &nodes, freeze, lease)))
            },
        )
        .refuses(&["blobs-unavailable", "fleet-record-invalid"])
        .read_only();
}
