//! Where a backup runs: the service it is of, the cluster whose agent takes it and the node
//! whose volumes it holds.

use crate::records::Database;
use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::{Refusal, Result, Value, json};
use serde::Deserialize;

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

/// The cluster a backup runs through: the one named, or the only one there is.
pub(crate) fn resolve_cluster(named: Option<&str>) -> Result<String> {
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

/// The node whose volumes are backed up: the one named, which must be an enrolled node of the
/// cluster (`node-unresolved`), or the cluster's only node (`backup-node-required`).
pub(crate) fn resolve_node(cluster: &str, named: Option<&str>) -> Result<String> {
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
