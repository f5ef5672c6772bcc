//! Hostname intents: the hostname Capstan wants a node to carry (`hostnameIntent`), set by an
//! administrator (`nodes.setHostname`, `nodes.resetHostname` to `worker-<name>`) and fetched by
//! the agent (`/agent/v1/host`), which reports what it applied on its next beat. One hostname
//! is never given to two nodes of a cluster: the check and the write share a transaction, and
//! every node write of a cluster writes its snapshot, so two changes in a cluster serialize.

use super::{CLUSTER_NODES, Context, NODE_JUMP_CODES, check_hostname, check_name, emit, propose_name, worker_hostname};
use crate::jump::{JumpCode, in_use};
use crate::records::{HostnameIntent, Node, NodeState, NodeView, require_node, view, write_node};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::{Entity, parse};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::Tx;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Whether another node of `cluster_id` (not `except_node`, not retired) carries or is meant to
/// carry `hostname`, or a usable code of the cluster (not `except_code`, a code's hash) names it.
pub async fn hostname_in_use(
    tx: &Tx,
    cluster_id: &str,
    hostname: &str,
    except_node: Option<&str>,
    except_code: Option<&str>,
    now: u64,
) -> Result<bool> {
    for doc in tx.find_all(CLUSTER_NODES, "by_cluster", &[json!(cluster_id)]).await? {
        if Some(doc.id.as_str()) == except_node {
            continue;
        }
        let node: Entity<Node> = parse(&doc)?;
        if node.data.state == NodeState::Retired {
            continue;
        }
        if node.data.hostname == hostname || node.data.hostname_intent.as_ref().is_some_and(|i| i.hostname == hostname) {
            return Ok(true);
        }
    }
    for doc in tx.find_all(NODE_JUMP_CODES, "by_cluster", &[json!(cluster_id)]).await? {
        if Some(doc.id.as_str()) == except_code {
            continue;
        }
        let code: Entity<JumpCode> = parse(&doc)?;
        if code.data.usable(now) && code.data.hostname().as_deref() == Some(hostname) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Input of `nodes.setHostname`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SetInput {
    /// The node's id.
    pub node_id: String,
    /// The generation of the intent read (0 without one); any other is refused `conflict`.
    pub expected_generation: u64,
    /// One lowercase DNS label.
    pub hostname: String,
}

/// Input of `nodes.resetHostname`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResetInput {
    /// The node's id.
    pub node_id: String,
    /// The generation of the intent read (0 without one); any other is refused `conflict`.
    pub expected_generation: u64,
    /// The name for `worker-<name>` (1–48 of a-z 0-9 -); the node's name when absent.
    pub name: Option<String>,
}

/// The hostname the agent should carry, as `/agent/v1/host` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesiredHost {
    /// The intent's hostname; null while Capstan holds no intent (leave the hostname alone).
    pub hostname: Option<String>,
    /// The intent's generation (0 without one).
    pub generation: u64,
}

/// The node's desired host.
pub async fn desired(cx: &Context, node_id: &str) -> Result<DesiredHost> {
    cx.store
        .transact(|tx| async move {
            let node = require_node(&tx, node_id).await?;
            Ok(match node.data.hostname_intent {
                Some(intent) => DesiredHost { hostname: Some(intent.hostname), generation: intent.generation },
                None => DesiredHost { hostname: None, generation: 0 },
            })
        })
        .await
}

/// Give `node_id` the intent that `target` picks from the node as read (`(hostname, name)`),
/// in one transaction with every check.
async fn change<F>(cx: &Context, by: &str, node_id: &str, expected: u64, target: F) -> Result<NodeView>
where
    F: Fn(&Node) -> (String, String) + Send + Sync,
{
    let now = cx.clock.now_ms();
    let target = &target;
    let changed = cx
        .store
        .transact(|tx| async move {
            let node = require_node(&tx, node_id).await?;
            if node.data.state == NodeState::Retired {
                return Err(Refusal::new("node-retired", format!("the node {node_id} is retired")));
            }
            let current = node.data.hostname_intent.as_ref().map_or(0, |i| i.generation);
            if current != expected {
                return Err(Refusal::new(
                    "conflict",
                    format!("the hostname intent of node {node_id} is at generation {current}, not {expected}: read it again"),
                )
                .with_data(json!({ "nodeId": node_id, "expectedGeneration": expected, "generation": current })));
            }
            let (hostname, name) = target(&node.data);
            let wanted_now = node.data.hostname_intent.as_ref().map_or(node.data.hostname.as_str(), |i| i.hostname.as_str());
            if wanted_now == hostname {
                return Err(Refusal::new("hostname-unchanged", format!("the node {node_id} is already meant to carry {hostname}"))
                    .with_data(json!({ "hostname": hostname })));
            }
            if hostname_in_use(&tx, &node.data.cluster_id, &hostname, Some(node_id), None, now).await? {
                return Err(in_use(&hostname, "hostname"));
            }
            let mut next = node.data.clone();
            let generation = current + 1;
            next.hostname_intent =
                Some(HostnameIntent { name, hostname: hostname.clone(), generation, requested_at: now, requested_by: by.into() });
            let written = write_node(&tx, node_id, node.revision, &next).await?;
            emit(
                &tx,
                "node.hostnameIntentChanged",
                node_id,
                json!({ "id": node_id, "clusterId": next.cluster_id, "hostname": hostname, "generation": generation }),
            )
            .await?;
            Ok(view(written, now, crate::freshness_ms(&tx).await?))
        })
        .await?;
    let intent = changed.node.data.hostname_intent.as_ref().map(|i| (i.hostname.as_str(), i.generation)).unwrap_or_default();
    tracing::info!(node = %node_id, hostname = %intent.0, generation = intent.1, "node hostname intent set");
    Ok(changed)
}

async fn set(cx: Context, call: Call, input: SetInput) -> Result<NodeView> {
    let by = call.identity()?.user_id.clone();
    check_hostname("hostname", &input.hostname)?;
    let hostname = input.hostname.clone();
    // the node keeps the name of its intent; a node without one takes the name the hostname proposes
    change(&cx, &by, &input.node_id, input.expected_generation, move |node| {
        let name = node.hostname_intent.as_ref().map_or_else(|| propose_name(&hostname), |i| i.name.clone());
        (hostname.clone(), name)
    })
    .await
}

async fn reset(cx: Context, call: Call, input: ResetInput) -> Result<NodeView> {
    let by = call.identity()?.user_id.clone();
    if let Some(name) = &input.name {
        check_name("name", name)?;
    }
    let stated = input.name.clone();
    change(&cx, &by, &input.node_id, input.expected_generation, move |node| {
        let name = stated.clone().or_else(|| node.hostname_intent.as_ref().map(|i| i.name.clone())).unwrap_or_else(|| node.name.clone());
        (worker_hostname(&name), name)
    })
    .await
}

/// Register `nodes.setHostname` and `nodes.resetHostname`.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "nodes.setHostname",
            "Set the hostname a node should carry, with the intent generation read; its agent applies it",
            Access::Admin,
            set,
        )
        .refuses(&["hostname-invalid", "node-missing", "node-retired", "conflict", "hostname-unchanged", "hostname-in-use"]);
    registry
        .add(
            "nodes.resetHostname",
            "Set a node's hostname intent back to worker-<name> (the stated name, else the node's), with the generation read",
            Access::Admin,
            reset,
        )
        .refuses(&["name-invalid", "node-missing", "node-retired", "conflict", "hostname-unchanged", "hostname-in-use"]);
}
