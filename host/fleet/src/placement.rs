//! Placement: which live nodes run a piece of background work, by rendezvous hashing over the
//! nodes whose labels match the work's selector. The same inputs always give the same answer,
//! so a pass whose inputs have not moved (same fingerprint) can be skipped.

use super::NodeRecord;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// A piece of background work to place: a host task now, plugin reconcile loops and schedules
/// once the plugin runtime lands (this is the one place they plug into).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// The workload's id; placements are keyed by it.
    pub id: String,
    /// How many nodes should run it (fewer when fewer are eligible).
    pub replicas: usize,
    /// Every pair must be among a node's labels.
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
}

fn score(workload: &str, node: &str) -> u64 {
    let digest = Sha256::new().chain_update(workload.as_bytes()).chain_update([0u8]).chain_update(node.as_bytes()).finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Assign each workload to up to `replicas` of the eligible nodes (highest score first).
pub fn place(workloads: &[Workload], live: &[NodeRecord]) -> BTreeMap<String, Vec<String>> {
    workloads
        .iter()
        .map(|w| {
            let mut eligible: Vec<&NodeRecord> =
                live.iter().filter(|n| w.selector.iter().all(|(k, v)| n.labels.get(k) == Some(v))).collect();
            eligible.sort_by_key(|n| std::cmp::Reverse((score(&w.id, &n.node_id), n.node_id.clone())));
            (w.id.clone(), eligible.into_iter().take(w.replicas).map(|n| n.node_id.clone()).collect())
        })
        .collect()
}

/// A digest of everything placement decides from: the workloads and the live nodes' ids and
/// labels. Equal fingerprints give equal placements.
pub fn fingerprint(workloads: &[Workload], live: &[NodeRecord]) -> String {
    let mut nodes: Vec<(&str, &BTreeMap<String, String>)> = live.iter().map(|n| (n.node_id.as_str(), &n.labels)).collect();
    nodes.sort();
    let canonical = serde_json::to_vec(&(workloads, nodes)).expect("serializable");
    hex::encode(Sha256::digest(canonical))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Addresses, NodeRecord};

    fn node(id: &str, labels: &[(&str, &str)]) -> NodeRecord {
        NodeRecord {
            node_id: id.into(),
            public_key: String::new(),
            addresses: Addresses { internal: "127.0.0.1".into(), api_port: 1 },
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            versions: None,
            serves: vec![],
            network: None,
            booted_at: 0,
            heartbeat_at: Some(0),
            draining_at: None,
            signature: None,
        }
    }

    fn work(id: &str, replicas: usize, selector: &[(&str, &str)]) -> Workload {
        Workload { id: id.into(), replicas, selector: selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    #[test]
    fn placement_is_deterministic_respects_selectors_and_replicas() {
        let nodes = vec![node("a", &[("tier", "fast")]), node("b", &[]), node("c", &[("tier", "fast")])];
        let works = vec![work("w1", 2, &[]), work("w2", 1, &[("tier", "fast")]), work("w3", 5, &[("tier", "slow")])];
        let placed = place(&works, &nodes);
        assert_eq!(placed["w1"].len(), 2);
        assert!(["a", "c"].contains(&placed["w2"][0].as_str()));
        assert!(placed["w3"].is_empty(), "no eligible node");
        let mut shuffled = nodes.clone();
        shuffled.reverse();
        assert_eq!(place(&works, &shuffled), placed, "order of the inputs does not matter");
        assert_eq!(fingerprint(&works, &shuffled), fingerprint(&works, &nodes));
    }

    #[test]
    fn losing_a_node_moves_only_its_work() {
        let nodes: Vec<NodeRecord> = (0..5).map(|i| node(&format!("n{i}"), &[])).collect();
        let works: Vec<Workload> = (0..50).map(|i| work(&format!("w{i}"), 1, &[])).collect();
        let before = place(&works, &nodes);
        let gone = before["w0"][0].clone();
        let remaining: Vec<NodeRecord> = nodes.iter().filter(|n| n.node_id != gone).cloned().collect();
        let after = place(&works, &remaining);
        for (w, owners) in &before {
            if owners[0] != gone {
                assert_eq!(&after[w], owners, "{w} stays where it was");
            }
        }
        assert_ne!(fingerprint(&works, &nodes), fingerprint(&works, &remaining));
    }
}
