//! `relays.register` and `relays.list`: the relay methods that need this node's sockets.

use super::Relays;
use crate::registrations::{self, Accepted, Listed, RegisterInput};
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
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

/// Input of `relays.ping`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PingInput {
    /// The cluster whose relay is asked.
    pub cluster_id: String,
}

/// Answer of `relays.ping`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pinged {
    /// The cluster.
    pub cluster_id: String,
    /// The fleet node whose socket carries the relay.
    pub fleet_node: String,
    /// What the relay answered to `agent.ping`.
    pub reply: serde_json::Value,
    /// How long the round trip took, in milliseconds.
    pub elapsed_ms: u64,
}

/// How long `relays.ping` waits for the relay.
const PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn ping(relays: Arc<Relays>, _: Call, input: PingInput) -> Result<Pinged> {
    let started = std::time::Instant::now();
    let elected = relays.elect(&input.cluster_id).await?;
    let reply = relays.call(&input.cluster_id, "agent.ping", serde_json::json!({}), PING_TIMEOUT).await?;
    let elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(Pinged { cluster_id: input.cluster_id, fleet_node: elected.fleet_node_id, reply, elapsed_ms })
}

/// Over HTTP: a registration belongs to a socket, so there is none to make.
async fn register_over_http(_: Arc<Relays>, _: Call, _: RegisterInput) -> Result<Accepted> {
    Err(Refusal::new("socket-required", "relays.register is called over a relay's /api/v1/socket session (docs/relays.md)"))
}

/// Register the relay methods that need this node's sockets.
pub fn register(registry: &mut Registry, relays: Arc<Relays>) {
    let mut registry = registry.with(relays);
    registry
        .add(
            "relays.register",
            "A relay session registers as its cluster's relay (over /api/v1/socket only; the cluster is the one its bearer names)",
            Access::Authenticated,
            register_over_http,
        )
        .refuses(&["socket-required"]);
    registry
        .add(
            "relays.ping",
            "Ask a cluster's relay agent.ping through the election, wherever in the fleet it is connected (a check for operators)",
            Access::Admin,
            ping,
        )
        .refuses(&[
            "relay-not-connected",
            "relay-ambiguous",
            "relay-timeout",
            "relay-elsewhere",
            "agent-request-too-large",
            "relay-reply-malformed",
        ])
        .passes_on("the relay's agent")
        .read_only();
    registry
        .add("relays.list", "Cluster relay registrations with whether a socket carries each right now (live)", Access::Admin, list)
        .read_only();
}
