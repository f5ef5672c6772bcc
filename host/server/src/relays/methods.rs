//! `relays.register` and `relays.list`: the relay methods that need this node's sockets.

use super::Relays;
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
use capstan_secrets::relay_registrations::{self as registrations, Accepted, Listed, RegisterInput};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Input of `relays.list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListInput {
    /// Only these clusters (at most 100); every cluster whose relay ever registered when absent.
    #[serde(default)]
    pub cluster_ids: Option<Vec<String>>,
}

/// Answer of `relays.list`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Listing {
    /// One item per cluster whose relay registered.
    pub items: Vec<Listed>,
}

async fn list(relays: Arc<Relays>, _: Call, input: ListInput) -> Result<Listing> {
    if input.cluster_ids.as_ref().is_some_and(|ids| ids.len() > 100) {
        return Err(Refusal::invalid_request("clusterIds names at most 100 clusters"));
    }
    Ok(Listing { items: registrations::list(&relays.store, input.cluster_ids.as_deref()).await? })
}

/// Over HTTP: a registration belongs to a socket, so there is none to make.
async fn register_over_http(_: Arc<Relays>, _: Call, _: RegisterInput) -> Result<Accepted> {
    Err(Refusal::new("socket-required", "relays.register is called over a relay's /api/v1/socket session (docs/relays.md)"))
}

/// Register the relay methods that need this node's sockets.
pub fn register(registry: &mut Registry, relays: Arc<Relays>) {
    let mut registry = registry.with(relays);
    registry.add(
        "relays.register",
        "A relay session registers as its cluster's relay (over /api/v1/socket only; the cluster is the one its bearer names)",
        Access::Authenticated,
        register_over_http,
    );
    registry.add("relays.list", "Cluster relay registrations with whether a socket carries each right now (live)", Access::Admin, list);
}
