//! `capstan fleet nodes`: the fleet as the bucket records it, judged against one clock.

use super::lease::LeaseRecord;
use super::{Freeze, NodeRecord, Timing};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The fleet at one moment, as `capstan fleet nodes` and `fleet.listNodes` report it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    /// The one clock every row is judged against (ms since the Unix epoch).
    pub now: u64,
    /// How many node records there are.
    pub total: usize,
    /// How many nodes are live (answering and not draining).
    pub live: usize,
    /// The deploy freeze that stands, if any.
    pub freeze: Option<Freeze>,
    /// The coordinator lease as recorded, expired or not.
    pub coordinator: Option<LeaseRecord>,
    /// Per binary: version → node count, newest first (`unreported` last).
    pub versions: BTreeMap<String, Vec<(String, usize)>>,
    /// One row per node, ordered by node id.
    pub nodes: Vec<Row>,
}

/// One node in a [`Listing`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The node's id.
    pub node_id: String,
    /// live, draining, stale or never (no heartbeat recorded)
    pub state: String,
    /// Heard from within the liveness window, draining or not.
    pub answering: bool,
    /// Milliseconds since its last heartbeat; `None` when none is recorded.
    pub heartbeat_age_ms: Option<u64>,
    /// `<internal address>:<API port>`, where other nodes dial it.
    pub address: String,
    /// The node's labels.
    pub labels: BTreeMap<String, String>,
    /// The Capstan version it booted as, when reported.
    pub capstan: Option<String>,
    /// Whether it holds the coordinator lease (an unexpired one).
    pub coordinator: bool,
}

fn version_key(v: &str) -> (Option<semver::Version>, String) {
    (semver::Version::parse(v).ok(), v.to_string())
}

/// Build the listing: every node's state judged at `now` (milliseconds since the Unix epoch),
/// the version counts, the freeze and the coordinator.
pub fn build(now: u64, timing: &Timing, nodes: &[NodeRecord], freeze: Option<Freeze>, lease: Option<LeaseRecord>) -> Listing {
    let holder = lease.as_ref().filter(|l| l.expires_at > now).map(|l| l.holder.clone());
    let mut rows: Vec<Row> = nodes
        .iter()
        .map(|n| {
            let state = if n.heartbeat_at.is_none() {
                "never"
            } else if n.live(now, timing) {
                "live"
            } else if n.draining_at.is_some() {
                "draining"
            } else {
                "stale"
            };
            Row {
                node_id: n.node_id.clone(),
                state: state.into(),
                answering: n.answering(now, timing),
                heartbeat_age_ms: n.heartbeat_at.map(|at| now.saturating_sub(at)),
                address: format!("{}:{}", n.addresses.internal, n.addresses.api_port),
                labels: n.labels.clone(),
                capstan: n.versions.as_ref().map(|v| v.capstan.clone()),
                coordinator: holder.as_deref() == Some(n.node_id.as_str()),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.node_id.cmp(&b.node_id));

    let mut versions = BTreeMap::new();
    type Reader = fn(&NodeRecord) -> Option<String>;
    let binaries: [(&str, Reader); 3] = [
        ("capstan", |n| n.versions.as_ref().map(|v| v.capstan.clone())),
        ("wit", |n| n.versions.as_ref().map(|v| v.wit_world.clone())),
        ("wasmtime", |n| n.versions.as_ref().and_then(|v| v.wasmtime.clone())),
    ];
    for (binary, read) in binaries {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut unreported = 0;
        for n in nodes {
            match read(n) {
                Some(v) => *counts.entry(v).or_default() += 1,
                None => unreported += 1,
            }
        }
        let mut list: Vec<(String, usize)> = counts.into_iter().collect();
        list.sort_by_key(|entry| std::cmp::Reverse(version_key(&entry.0)));
        if unreported > 0 {
            list.push(("unreported".into(), unreported));
        }
        versions.insert(binary.to_string(), list);
    }
    Listing {
        now,
        total: nodes.len(),
        live: rows.iter().filter(|r| r.state == "live").count(),
        freeze,
        coordinator: lease,
        versions,
        nodes: rows,
    }
}

fn age(ms: u64) -> String {
    match ms / 1000 {
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s => format!("{}h ago", s / 3600),
    }
}

fn timestamp(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
}

/// The listing for people.
pub fn render(listing: &Listing) -> String {
    let mut out = format!("fleet: {} node{}, {} live\n", listing.total, if listing.total == 1 { "" } else { "s" }, listing.live);
    if let Some(f) = &listing.freeze {
        out.push_str(&format!("deploys frozen since {} by {}: {}\n", timestamp(f.since), f.by, f.reason));
    }
    for (binary, counts) in &listing.versions {
        if counts.is_empty() {
            continue;
        }
        let parts: Vec<String> = counts.iter().map(|(v, n)| format!("{v} on {n}")).collect();
        out.push_str(&format!("{binary}: {}\n", parts.join(", ")));
    }
    if listing.nodes.is_empty() {
        out.push_str("no node has registered in this bucket\n");
        return out;
    }
    out.push_str(&format!("{:<24} {:<9} {:<12} {:<22} {:<8} {}\n", "NODE", "STATE", "HEARTBEAT", "ADDRESS", "VERSION", "LABELS"));
    for r in &listing.nodes {
        let labels: Vec<String> = r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let name = if r.coordinator { format!("{} *", r.node_id) } else { r.node_id.clone() };
        out.push_str(&format!(
            "{:<24} {:<9} {:<12} {:<22} {:<8} {}\n",
            name,
            r.state,
            r.heartbeat_age_ms.map(age).unwrap_or_else(|| "-".into()),
            r.address,
            r.capstan.as_deref().unwrap_or("?"),
            labels.join(",")
        ));
    }
    if listing.nodes.iter().any(|r| r.coordinator) {
        out.push_str("* holds the coordinator lease\n");
    }
    out
}
