//! Heartbeats: an authenticated node's report of its host, accepted in one transaction that
//! writes its liveness, the report and its cluster's node snapshot under the credential
//! generation authentication read (a rotation or revocation that raced it: `conflict`, nothing
//! written). An accepted report stands for `nodeObservationFreshnessMs`. The report is the agent
//! wire's shared body, [`capstan_core::wire::heartbeat::Report`], judged by its `check`.

use super::{Context, freshness_ms};
use crate::credentials::{Authenticated, fence};
use crate::records::{NodeState, require_node, write_node};
use capstan_core::refusal::Result;
use capstan_core::wire::heartbeat::Report;
use schemars::JsonSchema;
use serde::Serialize;

/// The receipt of an accepted heartbeat (no secret in it).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    /// Always true.
    pub accepted: bool,
    /// The node.
    pub node_id: String,
    /// The credential generation it was accepted under.
    pub credential_generation: u64,
    /// When (milliseconds since the epoch).
    pub accepted_at: u64,
    /// How long it stands (milliseconds).
    pub fresh_for_ms: u64,
}

/// Accept `report` from the node `who` authenticated, in one transaction.
pub async fn accept(cx: &Context, who: &Authenticated, report: &Report) -> Result<Accepted> {
    report.check()?;
    let now = cx.clock.now_ms();
    cx.store
        .transact(|tx| async move {
            let credential = fence(&tx, who).await?;
            let node = require_node(&tx, &who.node_id).await.map_err(|_| crate::credentials::unauthorized())?;
            if node.data.state == NodeState::Retired {
                return Err(crate::credentials::unauthorized());
            }
            let mut next = node.data.clone();
            next.last_report_at = Some(now);
            next.hostname = report.hostname.to_ascii_lowercase();
            next.report = Some(report.clone());
            next.credential_generation = credential.generation;
            write_node(&tx, &who.node_id, node.revision, &next).await?;
            Ok(Accepted {
                accepted: true,
                node_id: who.node_id.clone(),
                credential_generation: credential.generation,
                accepted_at: now,
                fresh_for_ms: freshness_ms(&tx).await?,
            })
        })
        .await
}
