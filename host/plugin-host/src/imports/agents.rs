//! `agents`: no agent transport is connected to this host yet, so every call is refused
//! `agent-not-connected` (retryable) once the grant allows it.

use super::{CallData, RetryableWit, WitResult, refusal};
use crate::manifest::Capability;
use crate::runtime::capstan::plugin::agents;
use capstan_core::text::truncate;
use serde_json::json;

/// The `agents` provider.
#[derive(Clone)]
pub(super) struct Agents;

impl agents::Host for CallData {
    async fn call(&mut self, cluster_id: String, _method: String, _body: String) -> WitResult<String> {
        self.granted(&self.grant.agents, Capability::Agents)?;
        Err(refusal(
            "agent-not-connected",
            format!("no agent of cluster {:?} is connected", truncate(&cluster_id, 64)),
            json!({ "clusterId": truncate(&cluster_id, 64) }),
        )
        .retryable_wit())
    }
}
