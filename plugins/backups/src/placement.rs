//! Where a backup runs: the service it is of, the cluster whose agents take it and the nodes
//! whose volumes it holds. A service the runtime runs has its volumes where its replica slots
//! stand (`runtime.service-replicas`) — an every-node service on each of its nodes, one part
//! per node; one it does not run is backed up from the node named, or its cluster's only node.

use crate::records::Database;
use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::runtime::{self, Intent, Replica};
use capstan_sdk::{Refusal, Result, Value, json};
use serde::Deserialize;
use std::collections::BTreeSet;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ServiceView {
    pub(crate) name: String,
    pub(crate) organization_id: String,
    #[serde(default)]
    pub(crate) volumes: Vec<VolumeView>,
    #[serde(default)]
    pub(crate) database: Option<Database>,
    #[serde(default)]
    pub(crate) state: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct VolumeView {
    pub(crate) name: String,
}

/// The service `id` of `organization`, in use; `service-not-found` otherwise (a service of
/// another organization reads the same).
pub(crate) fn service_of(organization: &str, id: &str) -> Result<ServiceView> {
    match inventory::get::<ServiceView>(EntityKind::Service, id)? {
        Some(e) if e.data.organization_id == organization && e.data.state.as_deref() != Some("deleting") => Ok(e.data),
        _ => Err(Refusal::new("service-not-found", format!("no service {id} in use in this organization"))),
    }
}

/// Every service in use that declares volumes (what a backup can take), in the inventory's
/// order.
pub(crate) fn services_with_volumes() -> Result<Vec<capstan_sdk::inventory::Entity<ServiceView>>> {
    let mut found = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = inventory::list::<ServiceView>(EntityKind::Service, cursor.as_deref(), 500)?;
        found.extend(page.entities.into_iter().filter(|s| !s.data.volumes.is_empty() && s.data.state.as_deref() != Some("deleting")));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(found),
        }
    }
}

/// The cluster a backup runs through: the one named, or the only one there is.
fn resolve_cluster(named: Option<&str>) -> Result<String> {
    if let Some(id) = named {
        return match inventory::get::<Value>(EntityKind::Cluster, id)? {
            Some(e) => Ok(e.id),
            None => Err(Refusal::new("cluster-not-found", format!("no cluster {id}"))),
        };
    }
    let clusters = inventory::list::<Value>(EntityKind::Cluster, None, 2)?;
    match clusters.entities.as_slice() {
        [only] if clusters.next_cursor.is_none() => Ok(only.id.clone()),
        [] => Err(Refusal::new("cluster-required", "there is no cluster: a backup is taken by a cluster's agent")),
        _ => Err(Refusal::new("cluster-required", "Capstan manages more than one cluster: name the service's in clusterId")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeView {
    cluster_id: String,
    #[serde(default)]
    state: Option<String>,
}

/// The cluster and nodes a backup of `service_id` takes: the node named (an enrolled node of
/// the cluster named, or of the only cluster); else every node its replica slots stand on (an
/// every-node service has volumes on each: one part per node); else — a service the runtime
/// does not run — the cluster's only node.
pub(crate) fn placement(service_id: &str, cluster: Option<&str>, node: Option<&str>) -> Result<(String, Vec<String>)> {
    if node.is_none()
        && let Some(placed) = slot_nodes(&runtime::service_replicas(service_id)?, cluster)?
    {
        return Ok(placed);
    }
    let cluster = resolve_cluster(cluster)?;
    let node = resolve_node(&cluster, node)?;
    Ok((cluster, vec![node]))
}

/// Where a restore into `service_id` lands: a backup of several nodes, each part on its own
/// node; one of a single node, the one node the service's replicas stand on now (its data
/// follows it there), else the backup's own (cluster, node).
pub(crate) fn restore_placement(service_id: &str, backup: (&str, &[String])) -> Result<(String, Vec<String>)> {
    let (cluster, nodes) = backup;
    if nodes.len() > 1 {
        return Ok((cluster.to_string(), nodes.to_vec()));
    }
    match slot_nodes(&runtime::service_replicas(service_id)?, None) {
        Ok(Some((cluster, nodes))) if nodes.len() == 1 => Ok((cluster, nodes)),
        _ => Ok((cluster.to_string(), nodes.to_vec())),
    }
}

/// The cluster and nodes (sorted) the service's current slots stand on (on `cluster`, when
/// named): `None` when it has none there; `cluster-required`, listing them, when they stand on
/// several clusters and none is named.
fn slot_nodes(replicas: &[Replica], cluster: Option<&str>) -> Result<Option<(String, Vec<String>)>> {
    let placed: BTreeSet<(&str, &str)> = replicas
        .iter()
        .filter(|r| r.intent != Intent::Remove && cluster.is_none_or(|c| c == r.cluster_id))
        .map(|r| (r.cluster_id.as_str(), r.node_id.as_str()))
        .collect();
    let clusters: BTreeSet<&str> = placed.iter().map(|(c, _)| *c).collect();
    match clusters.len() {
        0 => Ok(None),
        1 => {
            let cluster = clusters.into_iter().next().unwrap_or_default().to_string();
            Ok(Some((cluster, placed.into_iter().map(|(_, n)| n.to_string()).collect())))
        }
        n => Err(Refusal::new(
            "cluster-required",
            format!("the service's replicas run on {n} clusters, each with volumes of its own: name the one to back up in clusterId"),
        )
        .with_data(json!({ "clusters": clusters }))),
    }
}

/// The node whose volumes are backed up: the one named, which must be an enrolled node of the
/// cluster (`node-unresolved`), or the cluster's only node (`backup-node-required`).
fn resolve_node(cluster: &str, named: Option<&str>) -> Result<String> {
    let usable = |n: &NodeView| n.cluster_id == cluster && n.state.as_deref() != Some("retired");
    if let Some(id) = named {
        return match inventory::get::<NodeView>(EntityKind::Node, id)? {
            Some(e) if usable(&e.data) => Ok(e.id),
            _ => Err(Refusal::new("node-unresolved", format!("{id} is no enrolled node of cluster {cluster}"))
                .with_data(json!({ "nodeId": id }))),
        };
    }
    let mut nodes = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = inventory::list::<NodeView>(EntityKind::Node, cursor.as_deref(), 500)?;
        nodes.extend(page.entities.into_iter().filter(|e| usable(&e.data)).map(|e| e.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    match nodes.as_slice() {
        [only] => Ok(only.clone()),
        _ => Err(Refusal::new(
            "backup-node-required",
            format!("cluster {cluster} has {} nodes: name the one whose volumes to back up in nodeId", nodes.len()),
        )
        .with_data(json!({ "nodes": nodes.len() }))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(cluster: &str, node: &str, index: u32, intent: Intent) -> Replica {
        Replica {
            cluster_id: cluster.into(),
            node_id: node.into(),
            slot: format!("{node}.{index}"),
            assignment_id: format!("asg_{node}_{index}"),
            intent,
            phase: "running".into(),
            ready: true,
            image_digest: None,
        }
    }

    #[test]
    fn the_volumes_are_where_the_slots_stand() {
        // two replicas on one node: that node
        let one = [replica("c1", "node_a", 0, Intent::Run), replica("c1", "node_a", 1, Intent::Run)];
        assert_eq!(slot_nodes(&one, None).unwrap(), Some(("c1".into(), vec!["node_a".into()])));
        // a slot being removed holds nothing to back up
        let moving = [replica("c1", "node_a", 0, Intent::Run), replica("c1", "node_b", 0, Intent::Remove)];
        assert_eq!(slot_nodes(&moving, None).unwrap(), Some(("c1".into(), vec!["node_a".into()])));
        // none: the caller falls back to the node named or the cluster's only one
        assert_eq!(slot_nodes(&[], None).unwrap(), None);
        assert_eq!(slot_nodes(&one, Some("c2")).unwrap(), None);
    }

    #[test]
    fn an_every_node_service_is_backed_up_on_each_of_its_nodes_of_one_cluster() {
        let every = [replica("c1", "node_b", 0, Intent::Run), replica("c1", "node_a", 0, Intent::Stop)];
        assert_eq!(slot_nodes(&every, None).unwrap(), Some(("c1".into(), vec!["node_a".into(), "node_b".into()])), "sorted");
        // on two clusters: the one named, else refused by name listing them
        let spread = [replica("c1", "node_a", 0, Intent::Run), replica("c2", "node_b", 0, Intent::Run)];
        assert_eq!(slot_nodes(&spread, Some("c2")).unwrap(), Some(("c2".into(), vec!["node_b".into()])));
        let refused = slot_nodes(&spread, None).unwrap_err();
        assert_eq!(refused.code(), "cluster-required");
    }
}
