//! The heartbeat's `report`: what a node's agent states of its host on every beat, and what the
//! host stores as the node's last report. Serde judges the shape (every member required but
//! `hostApply`, unknown members refused); [`Report::check`] judges what serde does not.

use crate::refusal::{Refusal, Result};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// The most addresses a report lists.
pub const MAX_ADDRESSES: usize = 64;
/// The longest text member of a report (bytes).
pub const MAX_TEXT: usize = 256;

/// What a node reports of its host. Every member is required but `hostApply`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
    /// The address the node's published ports are reached at, as its operator stated it
    /// (`capstan-agent run --advertise-address`); absent, the node's only address serves when it
    /// has exactly one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertised_address: Option<IpAddr>,
    /// The outcome of the agent's last hostname apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_apply: Option<HostApply>,
}

/// The outcome of the agent's last hostname apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ApplyOutcome {
    /// The host carries the hostname.
    Applied,
    /// It could not be applied (`reason` says why).
    Failed,
}

fn text(field: &str, value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_TEXT || value.chars().any(char::is_control) {
        return Err(Refusal::invalid_field(field, format!("{field} is 1–{MAX_TEXT} bytes of text without control characters")));
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
            return Err(Refusal::invalid_field("report.addresses", format!("a report lists at most {MAX_ADDRESSES} addresses")));
        }
        if self.disk_free_bytes > self.disk_bytes {
            return Err(Refusal::invalid_field("report.diskFreeBytes", "diskFreeBytes is at most diskBytes"));
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> serde_json::Value {
        json!({
            "hostname": "web-1", "os": "Debian GNU/Linux 13 (trixie)", "kernel": "6.12.0", "arch": "x86_64",
            "cpus": 4, "memoryBytes": 1, "diskBytes": 2, "diskFreeBytes": 1, "agentVersion": "0.1.0",
            "uptimeSeconds": 3, "addresses": ["10.0.0.5", "fd00::5"],
            "hostApply": {"generation": 3, "hostname": "db-1", "outcome": "failed", "reason": "no"},
        })
    }

    #[test]
    fn a_report_reads_back_as_it_was_written_and_refuses_unknown_members() {
        let report: Report = serde_json::from_value(sample()).unwrap();
        assert_eq!(report.host_apply.as_ref().map(|a| a.outcome), Some(ApplyOutcome::Failed));
        assert_eq!(serde_json::to_value(&report).unwrap(), sample());
        report.check().unwrap();
        let mut extra = sample();
        extra["swapBytes"] = json!(0);
        assert!(serde_json::from_value::<Report>(extra).is_err());
        let mut outcome = sample();
        outcome["hostApply"]["outcome"] = json!("pending");
        assert!(serde_json::from_value::<Report>(outcome).is_err());
    }

    #[test]
    fn the_check_names_the_member_it_refuses() {
        let report: Report = serde_json::from_value(sample()).unwrap();
        let field = |report: Report| report.check().unwrap_err().data.map(|d| d["field"].clone());
        assert_eq!(field(Report { kernel: "x\n".into(), ..report.clone() }), Some(json!("report.kernel")));
        assert_eq!(field(Report { os: "o".repeat(MAX_TEXT + 1), ..report.clone() }), Some(json!("report.os")));
        let addresses = vec![IpAddr::from([10, 0, 0, 1]); MAX_ADDRESSES + 1];
        assert_eq!(field(Report { addresses, ..report.clone() }), Some(json!("report.addresses")));
        assert_eq!(field(Report { disk_free_bytes: 3, ..report.clone() }), Some(json!("report.diskFreeBytes")));
        let apply = HostApply { reason: Some(String::new()), ..report.host_apply.clone().unwrap() };
        assert_eq!(field(Report { host_apply: Some(apply), ..report }), Some(json!("report.hostApply.reason")));
    }
}
