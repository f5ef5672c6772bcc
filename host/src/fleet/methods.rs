//! `fleet.*` API methods.

use super::{lease, listing, read_freeze, read_nodes};
use crate::api::methods::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// The same facts as `capstan fleet nodes --json`.
#[derive(serde::Serialize, JsonSchema)]
#[serde(transparent)]
pub struct ListingJson(#[schemars(with = "serde_json::Value")] listing::Listing);

pub fn register(registry: &mut Registry) {
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
