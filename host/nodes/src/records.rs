//! The node records (`cluster_nodes`), their liveness as every read derives it, the cluster's
//! node snapshot, and the administrator's `nodes.list`, `nodes.get`, `nodes.retire`,
//! `nodes.getDeletionImpact` and `nodes.delete`.

use super::{CLUSTER_NODE_SNAPSHOTS, CLUSTER_NODES, Context, NODE_CREDENTIALS, emit, freshness_ms, is_node_id, node_missing};
use crate::credentials::{self, Credential};
use capstan_core::clock::Clock;
use capstan_core::refusal::{Refusal, Result};
use capstan_core::wire::heartbeat::Report;
use capstan_inventory::{Entity, Listing, check_revision, page_limit, parse, to_value};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::{Store, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, json};

/// A node of a cluster.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// The cluster it belongs to.
    pub cluster_id: String,
    /// The operator's short name for it (the `<name>` of `worker-<name>`).
    pub name: String,
    /// The hostname it carries: the one it enrolled with, then the one its last report states.
    pub hostname: String,
    /// The hostname Capstan wants it to carry; `null` while Capstan holds none (generation 0).
    pub hostname_intent: Option<HostnameIntent>,
    /// `active`, or `retired` (kept as a record, its credential revoked).
    pub state: NodeState,
    /// When it enrolled (milliseconds since the epoch).
    pub enrolled_at: u64,
    /// When it was retired (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_at: Option<u64>,
    /// When its last report was accepted (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_report_at: Option<u64>,
    /// What its last accepted report said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<Report>,
    /// The generation of its credential.
    pub credential_generation: u64,
}

/// A node's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NodeState {
    /// Enrolled; it may report.
    Active,
    /// Retired: its credential is revoked; it can be deleted.
    Retired,
}

/// The hostname Capstan wants a node to carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostnameIntent {
    /// The node's short name the default scheme (`worker-<name>`) builds on.
    pub name: String,
    /// The hostname wanted.
    pub hostname: String,
    /// Advances with every change of intent; 0 means none.
    pub generation: u64,
    /// When it was asked for (milliseconds since the epoch).
    pub requested_at: u64,
    /// Who asked for it (a user id).
    pub requested_by: String,
}

/// How a node's liveness reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Liveness {
    /// Its last accepted report is younger than `nodeObservationFreshnessMs`.
    Live,
    /// Its last accepted report is older.
    Offline,
    /// It never reported.
    NeverReported,
}

/// A node as every read answers it: the record, and its liveness derived now.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// The stored node.
    #[serde(flatten)]
    pub node: Entity<Node>,
    /// Whether its last accepted report is younger than `nodeObservationFreshnessMs`.
    pub live: bool,
    /// `live`, `offline` or `never-reported`.
    pub liveness: Liveness,
    /// Where other machines reach its published ports: the address its agent advertises
    /// (`--advertise-address`), else its only reported address; absent when it reported several
    /// and advertises none (an ingress then cannot send it traffic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::IpAddr>,
    /// The X25519 recipient its agent proved, which secret material is sealed to (`nodes.get`
    /// only; absent before the first proof).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipient: Option<super::recipients::Recipient>,
    /// Where its hostname intent stands, judged once here for every reader (the CLI, the
    /// dashboard, the API); absent without an intent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intent_status: Option<IntentStatus>,
}

/// Where a node's hostname intent stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IntentStatus {
    /// `pending` (not carried yet), `applied` or `failed` (the agent tried and said why).
    pub state: IntentState,
    /// Why the agent's apply failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Where a hostname intent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum IntentState {
    /// The node does not carry it yet.
    Pending,
    /// The node carries it.
    Applied,
    /// The agent's apply of this generation failed.
    Failed,
}

/// Judge `node`'s intent: the agent's report of this generation's apply when it made one, else
/// whether a report since the intent was asked states its hostname.
pub fn intent_status(node: &Node) -> Option<IntentStatus> {
    use capstan_core::wire::heartbeat::ApplyOutcome;
    let intent = node.hostname_intent.as_ref().filter(|i| i.generation > 0)?;
    let apply = node
        .report
        .as_ref()
        .and_then(|r| r.host_apply.as_ref())
        .filter(|a| a.generation == intent.generation && a.hostname == intent.hostname);
    let (state, reason) = match apply {
        Some(a) if a.outcome == ApplyOutcome::Failed => (IntentState::Failed, a.reason.clone()),
        Some(_) => (IntentState::Applied, None),
        None if node.hostname == intent.hostname && node.last_report_at >= Some(intent.requested_at) => (IntentState::Applied, None),
        None => (IntentState::Pending, None),
    };
    Some(IntentStatus { state, reason })
}

/// Judge a stored node's liveness at `now` (milliseconds) with `freshness` (milliseconds).
pub fn view(node: Entity<Node>, now: u64, freshness: u64) -> NodeView {
    let liveness = match node.data.last_report_at {
        None => Liveness::NeverReported,
        Some(at) if now.saturating_sub(at) < freshness => Liveness::Live,
        Some(_) => Liveness::Offline,
    };
    let address = node.data.report.as_ref().and_then(|r| match (r.advertised_address, r.addresses.as_slice()) {
        (Some(advertised), _) => Some(advertised),
        (None, [only]) => Some(*only),
        (None, _) => None,
    });
    let intent_status = intent_status(&node.data);
    NodeView { node, live: liveness == Liveness::Live, liveness, address, recipient: None, intent_status }
}

/// Read a node or refuse `node-missing`.
pub async fn require_node(tx: &Tx, id: &str) -> Result<Entity<Node>> {
    if !is_node_id(id) {
        return Err(node_missing(id));
    }
    match tx.get(CLUSTER_NODES, id).await? {
        Some(doc) => parse(&doc),
        None => Err(node_missing(id)),
    }
}

/// Write `node` (or its removal, `None`) into its cluster's public node snapshot in `tx`: the
/// one document every node write of a cluster touches, so two writes in one cluster serialize.
pub async fn snapshot(tx: &Tx, cluster_id: &str, node_id: &str, node: Option<&Node>) -> Result<()> {
    let current = tx.get(CLUSTER_NODE_SNAPSHOTS, cluster_id).await?;
    let mut nodes = current.as_ref().and_then(|d| d.data.get("nodes")).and_then(|n| n.as_object()).cloned().unwrap_or_else(Map::new);
    match node {
        Some(node) => {
            nodes.insert(
                node_id.to_string(),
                json!({
                    "name": node.name,
                    "hostname": node.hostname,
                    "intendedHostname": node.hostname_intent.as_ref().map(|i| i.hostname.clone()),
                    "state": node.state,
                    "lastReportAt": node.last_report_at,
                }),
            );
        }
        None => {
            nodes.remove(node_id);
        }
    }
    let data = json!({ "clusterId": cluster_id, "nodes": nodes });
    match current {
        Some(doc) if nodes.is_empty() => tx.delete(CLUSTER_NODE_SNAPSHOTS, cluster_id, doc.revision).await,
        Some(doc) => tx.replace(CLUSTER_NODE_SNAPSHOTS, cluster_id, doc.revision, data).await.map(drop),
        None if nodes.is_empty() => Ok(()),
        None => tx.insert(CLUSTER_NODE_SNAPSHOTS, cluster_id, data).await.map(drop),
    }
}

/// Replace the node `id` (read at `revision`) with `node`, and its cluster's snapshot.
pub(crate) async fn write_node(tx: &Tx, id: &str, revision: u64, node: &Node) -> Result<Entity<Node>> {
    let doc = tx.replace(CLUSTER_NODES, id, revision, to_value(node)?).await?;
    snapshot(tx, &node.cluster_id, id, Some(node)).await?;
    parse(&doc)
}

/// Input of `nodes.list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListInput {
    /// Only this cluster's nodes.
    pub cluster_id: Option<String>,
    /// The `nextCursor` of the previous page.
    pub cursor: Option<String>,
    /// At most 200 (default 50).
    pub limit: Option<usize>,
}

/// A request naming one node.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ById {
    /// The node's id.
    pub id: String,
}

/// Input of `nodes.retire` and `nodes.delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevisionInput {
    /// The node's id.
    pub id: String,
    /// The node revision the caller read; any other is refused `conflict`.
    pub expected_revision: u64,
}

/// What deleting a node would take, and what stands in the way.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeletionImpact {
    /// The node's id.
    pub id: String,
    /// Whether it is retired.
    pub retired: bool,
    /// Why it cannot be deleted yet (`{code, message}`); empty when it can.
    pub blockers: Vec<Blocker>,
}

/// One reason a deletion is refused.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Blocker {
    /// The refusal a deletion would answer.
    pub code: String,
    /// What to do about it.
    pub message: String,
}

/// Answer of `nodes.delete`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    /// The deleted node's id.
    pub id: String,
    /// Always true.
    pub deleted: bool,
}

/// A page of nodes as `nodes.list` answers it (of one cluster with `cluster_id`), each with its
/// liveness judged at `clock`'s now; nothing when the store does not hold nodes.
pub async fn read_page(
    store: &Store,
    clock: &Clock,
    cluster_id: Option<&str>,
    cursor: Option<&str>,
    limit: Option<usize>,
) -> Result<Listing<NodeView>> {
    let limit = page_limit(limit);
    let now = clock.now_ms();
    store
        .transact(|tx| async move {
            if !tx.is_declared(CLUSTER_NODES) {
                return Ok(Listing { items: vec![], next_cursor: None });
            }
            let freshness = freshness_in(&tx).await?;
            let page = match cluster_id {
                Some(cluster) => tx.find(CLUSTER_NODES, "by_cluster", &[json!(cluster)], cursor, limit).await?,
                None => tx.scan(CLUSTER_NODES, cursor, limit).await?,
            };
            let items = page.documents.iter().map(|d| parse(d).map(|n| view(n, now, freshness))).collect::<Result<_>>()?;
            Ok(Listing { items, next_cursor: page.next_cursor })
        })
        .await
}

/// One node as `nodes.get` answers it, its liveness judged at `clock`'s now; `None` when there
/// is none (an id that cannot name a node names none).
pub async fn read(store: &Store, clock: &Clock, id: &str) -> Result<Option<NodeView>> {
    if !is_node_id(id) {
        return Ok(None);
    }
    let now = clock.now_ms();
    store
        .transact(|tx| async move {
            if !tx.is_declared(CLUSTER_NODES) {
                return Ok(None);
            }
            let Some(doc) = tx.get(CLUSTER_NODES, id).await? else { return Ok(None) };
            let mut node = view(parse(&doc)?, now, freshness_in(&tx).await?);
            node.recipient = super::recipients::current(&tx, id).await?;
            Ok(Some(node))
        })
        .await
}

/// The freshness setting, or the default where the store keeps no settings.
async fn freshness_in(tx: &Tx) -> Result<u64> {
    if tx.is_declared(capstan_inventory::SETTINGS) { freshness_ms(tx).await } else { Ok(super::DEFAULT_FRESHNESS_MS) }
}

async fn list(cx: Context, _: Call, input: ListInput) -> Result<Listing<NodeView>> {
    read_page(&cx.store, &cx.clock, input.cluster_id.as_deref(), input.cursor.as_deref(), input.limit).await
}

async fn get(cx: Context, _: Call, input: ById) -> Result<NodeView> {
    read(&cx.store, &cx.clock, &input.id).await?.ok_or_else(|| node_missing(&input.id))
}

fn not_retired(id: &str) -> Refusal {
    Refusal::new("node-not-retired", format!("the node {id} is not retired: retire it (nodes.retire) before deleting it"))
        .with_data(json!({ "id": id }))
}

async fn retire(cx: Context, call: Call, input: RevisionInput) -> Result<NodeView> {
    let by = call.identity()?.user_id.clone();
    let (input, by) = (&input, &by);
    let now = cx.clock.now_ms();
    let retired = cx
        .store
        .transact(|tx| async move {
            let node = require_node(&tx, &input.id).await?;
            check_revision("node", &input.id, input.expected_revision, node.revision)?;
            if node.data.state == NodeState::Retired {
                return Err(Refusal::new("node-retired", format!("the node {} is already retired", input.id)));
            }
            // its credential goes with it, in the same transaction: nothing it sends counts after
            let generation = match tx.get(NODE_CREDENTIALS, &input.id).await? {
                Some(doc) => {
                    let credential: Entity<Credential> = parse(&doc)?;
                    credentials::revoke_in(&tx, &input.id, credential, now, None).await?.generation
                }
                None => node.data.credential_generation,
            };
            let mut next = node.data.clone();
            next.state = NodeState::Retired;
            next.retired_at = Some(now);
            next.credential_generation = generation;
            let written = write_node(&tx, &input.id, node.revision, &next).await?;
            emit(&tx, "node.retired", &input.id, json!({ "id": input.id, "clusterId": next.cluster_id, "by": by })).await?;
            Ok(view(written, now, freshness_ms(&tx).await?))
        })
        .await?;
    tracing::info!(node = %input.id, "node retired; its credential is revoked");
    Ok(retired)
}

async fn deletion_impact(cx: Context, _: Call, input: ById) -> Result<DeletionImpact> {
    let id = input.id.as_str();
    cx.store
        .transact(|tx| async move {
            let node = require_node(&tx, id).await?;
            let retired = node.data.state == NodeState::Retired;
            let blockers = if retired {
                vec![]
            } else {
                let refusal = not_retired(id);
                vec![Blocker { code: refusal.code.to_string(), message: refusal.message }]
            };
            Ok(DeletionImpact { id: id.to_string(), retired, blockers })
        })
        .await
}

async fn delete(cx: Context, _: Call, input: RevisionInput) -> Result<Deleted> {
    let input = &input;
    let deleted = cx
        .store
        .transact(|tx| async move {
            let node = require_node(&tx, &input.id).await?;
            check_revision("node", &input.id, input.expected_revision, node.revision)?;
            if node.data.state != NodeState::Retired {
                return Err(not_retired(&input.id));
            }
            if let Some(credential) = tx.get(NODE_CREDENTIALS, &input.id).await? {
                tx.delete(NODE_CREDENTIALS, &input.id, credential.revision).await?;
            }
            tx.delete(CLUSTER_NODES, &input.id, node.revision).await?;
            if tx.is_declared(super::recipients::NODE_RECIPIENTS)
                && let Some(recipient) = tx.get(super::recipients::NODE_RECIPIENTS, &input.id).await?
            {
                tx.delete(super::recipients::NODE_RECIPIENTS, &input.id, recipient.revision).await?;
            }
            snapshot(&tx, &node.data.cluster_id, &input.id, None).await?;
            emit(&tx, "node.deleted", &input.id, json!({ "id": input.id, "clusterId": node.data.cluster_id })).await?;
            Ok(Deleted { id: input.id.clone(), deleted: true })
        })
        .await?;
    tracing::info!(node = %deleted.id, "node deleted");
    Ok(deleted)
}

/// Register `nodes.list`, `nodes.get`, `nodes.retire`, `nodes.getDeletionImpact`, `nodes.delete`.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry.add("nodes.list", "Nodes, paged (of one cluster with clusterId), each with its liveness", Access::Admin, list).read_only();
    registry
        .add("nodes.get", "One node with its liveness, last report and hostname intent", Access::Admin, get)
        .refuses(&["node-missing"])
        .read_only();
    registry
        .add(
            "nodes.retire",
            "Retire a node with the revision read: its credential is revoked, it is kept as a record",
            Access::Admin,
            retire,
        )
        .refuses(&["node-missing", "conflict", "node-retired"]);
    registry
        .add("nodes.getDeletionImpact", "Whether a node can be deleted, and what stands in the way", Access::Admin, deletion_impact)
        .refuses(&["node-missing"])
        .read_only();
    registry.add("nodes.delete", "Delete a retired node with the revision read, and its credential", Access::Admin, delete).refuses(&[
        "node-missing",
        "conflict",
        "node-not-retired",
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(last: Option<u64>) -> Entity<Node> {
        Entity {
            id: "node_1".into(),
            revision: 1,
            data: Node {
                cluster_id: "c".into(),
                name: "a".into(),
                hostname: "a".into(),
                hostname_intent: None,
                state: NodeState::Active,
                enrolled_at: 0,
                retired_at: None,
                last_report_at: last,
                report: None,
                credential_generation: 1,
            },
        }
    }

    #[test]
    fn an_intent_is_judged_pending_applied_or_failed_once_for_every_reader() {
        let with = |hostname: &str, last: Option<u64>, apply: Option<serde_json::Value>| {
            let mut n = node(last).data;
            n.hostname = hostname.into();
            n.hostname_intent = Some(HostnameIntent {
                name: "web".into(),
                hostname: "web-1".into(),
                generation: 2,
                requested_at: 100,
                requested_by: "u".into(),
            });
            n.report = apply.map(|a| {
                serde_json::from_value(json!({ "hostname": hostname, "os": "Debian", "kernel": "6", "arch": "x86_64", "cpus": 1,
                    "memoryBytes": 1, "diskBytes": 1, "diskFreeBytes": 1, "agentVersion": "0.1.0", "uptimeSeconds": 1, "addresses": [],
                    "hostApply": a }))
                .unwrap()
            });
            intent_status(&n).map(|s| (s.state, s.reason))
        };
        let applied = json!({ "generation": 2, "hostname": "web-1", "outcome": "applied" });
        assert_eq!(with("web-1", Some(200), Some(applied)), Some((IntentState::Applied, None)));
        let failed = json!({ "generation": 2, "hostname": "web-1", "outcome": "failed", "reason": "no root" });
        assert_eq!(with("a", Some(200), Some(failed)), Some((IntentState::Failed, Some("no root".into()))));
        let older = json!({ "generation": 1, "hostname": "a", "outcome": "applied" });
        assert_eq!(with("a", Some(200), Some(older)), Some((IntentState::Pending, None)));
        // the hostname it carries already, reported after the intent was asked for; not before
        assert_eq!(with("web-1", Some(200), None), Some((IntentState::Applied, None)));
        assert_eq!(with("web-1", None, None), Some((IntentState::Pending, None)));
        assert_eq!(intent_status(&node(None).data), None, "no intent, no status");
    }

    #[test]
    fn liveness_is_derived_from_the_last_report() {
        assert_eq!(view(node(None), 1_000_000, 180_000).liveness, Liveness::NeverReported);
        let live = view(node(Some(1_000_000)), 1_179_999, 180_000);
        assert!(live.live && live.liveness == Liveness::Live);
        let offline = view(node(Some(1_000_000)), 1_180_000, 180_000);
        assert!(!offline.live && offline.liveness == Liveness::Offline);
        let json = serde_json::to_value(view(node(None), 0, 1)).unwrap();
        assert_eq!(json["liveness"], "never-reported");
        assert_eq!(json["hostnameIntent"], serde_json::Value::Null);
        assert_eq!(json["id"], "node_1");
    }
}
