//! Heartbeats: an authenticated node's report of its host, accepted in one transaction that
//! writes its liveness, the report and its cluster's node snapshot under the credential
//! generation authentication read (a rotation or revocation that raced it: `conflict`, nothing
//! written). An accepted report stands for `nodeObservationFreshnessMs`.

use super::{Context, freshness_ms, invalid};
use crate::credentials::{Authenticated, fence};
use crate::records::{NodeState, require_node, write_node};
use capstan_core::refusal::Result;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// The most addresses a report lists.
pub const MAX_ADDRESSES: usize = 64;
/// The longest text member of a report (bytes).
pub const MAX_TEXT: usize = 256;

/// What a node reports of its host. Every member is required but `hostApply`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Report {
    /// The hostname the host carries now.
    pub hostname: String,
    /// The operating system (`/etc/os-release` PRETTY_NAME, say).
    pub os: String,
    /// The kernel release.
    pub kernel: String,
    /// The machine architecture (`x86_64`, `aarch64`).
    pub arch: String,
    /// Logical CPUs.
    pub cpus: u32,
    /// Memory, in bytes.
    pub memory_bytes: u64,
    /// The root filesystem's size, in bytes.
    pub disk_bytes: u64,
    /// Its free space, in bytes.
    pub disk_free_bytes: u64,
    /// The agent's version.
    pub agent_version: String,
    /// Seconds since the host booted.
    pub uptime_seconds: u64,
    /// The host's IP addresses (at most 64).
    pub addresses: Vec<IpAddr>,
    /// The outcome of the agent's last hostname apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_apply: Option<HostApply>,
}

/// The outcome of the agent's last hostname apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostApply {
    /// The intent generation it applied.
    pub generation: u64,
    /// The hostname it applied.
    pub hostname: String,
    /// `applied` or `failed`.
    pub outcome: ApplyOutcome,
    /// Why it failed (at most 256 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a hostname apply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ApplyOutcome {
    /// The host carries the hostname.
    Applied,
    /// It could not be applied (`reason` says why).
    Failed,
}

fn text(field: &str, value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_TEXT || value.chars().any(char::is_control) {
        return Err(invalid(field, format!("{field} is 1–{MAX_TEXT} bytes of text without control characters")));
    }
    Ok(())
}

impl Report {
    /// Judge the members serde does not: lengths, text, the address count.
    pub fn check(&self) -> Result<()> {
        text("report.hostname", &self.hostname)?;
        text("report.os", &self.os)?;
        text("report.kernel", &self.kernel)?;
        text("report.arch", &self.arch)?;
        text("report.agentVersion", &self.agent_version)?;
        if self.addresses.len() > MAX_ADDRESSES {
            return Err(invalid("report.addresses", format!("a report lists at most {MAX_ADDRESSES} addresses")));
        }
        if self.disk_free_bytes > self.disk_bytes {
            return Err(invalid("report.diskFreeBytes", "diskFreeBytes is at most diskBytes"));
        }
        if let Some(apply) = &self.host_apply {
            text("report.hostApply.hostname", &apply.hostname)?;
            if let Some(reason) = &apply.reason {
                text("report.hostApply.reason", reason)?;
            }
        }
        Ok(())
    }
}

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
