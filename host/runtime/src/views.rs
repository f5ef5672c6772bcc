//! What operators read of the runtime, from stored rows only: `runtime.getServiceStatus`,
//! `runtime.getServiceAssignments`, `runtime.getClusterAssignments`.

use super::producer::{Status, Verdict};
use super::slots::{self, Slot};
use super::spec::{self, Spec};
use super::{Context, RUNTIME_SLOTS, RUNTIME_STATUS};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::access::ServiceNeed;
use capstan_inventory::services;
use capstan_inventory::{Entity, parse};
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Largest page of `runtime.getClusterAssignments`.
pub const MAX_CLUSTER_PAGE: usize = 256;

/// Input naming a service.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceInput {
    /// The service.
    pub service_id: String,
}

/// One replica slot as an operator reads it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlotView {
    /// `<nodeId>.<index>`.
    pub slot: String,
    /// The node it stands on.
    pub node_id: String,
    /// The current assignment.
    pub assignment_id: String,
    /// `run`, `stop` or `remove`.
    pub intent: String,
    /// What the node last said: `pulling`, `starting`, `running`, `unhealthy`, `exited`,
    /// `failed`; `pending` before it said anything; `stopped`/`removed` once it did that.
    pub phase: String,
    /// Whether it is ready.
    pub ready: bool,
    /// The image digest the node runs.
    pub image_digest: Option<String>,
    /// Attempts Capstan made in this slot beyond the first (its restarts).
    pub restarts: u32,
    /// The node's last words on why it was not running.
    pub cause: Option<String>,
}

impl SlotView {
    fn of(slot: &Slot) -> SlotView {
        let a = &slot.assignment;
        let observed = a.observation.as_ref();
        SlotView {
            slot: slot.slot.clone(),
            node_id: slot.node_id.clone(),
            assignment_id: slot.assignment_id.clone(),
            intent: serde_json::to_value(a.intent).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
            phase: slot.phase(),
            ready: slot.ready(),
            image_digest: slot.image_digest(),
            restarts: slot.attempts.saturating_sub(1),
            cause: observed.and_then(|o| o.cause.clone()).or_else(|| slot.last_cause.clone()),
        }
    }
}

/// One (service, cluster) target as an operator reads it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetView {
    /// The cluster.
    pub cluster_id: String,
    /// The spec's revision.
    pub spec_revision: u64,
    /// The spec.
    pub spec: Spec,
    /// The verdict; absent until the producer decided the target.
    pub verdict: Option<Verdict>,
    /// Since when the verdict holds (milliseconds).
    pub since: Option<u64>,
    /// Its slots, by name.
    pub slots: Vec<SlotView>,
}

/// Answer of `runtime.getServiceStatus`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    /// The service.
    pub service_id: String,
    /// One per cluster the service has a spec for.
    pub targets: Vec<TargetView>,
}

async fn status(cx: Context, call: Call, input: ServiceInput) -> Result<ServiceStatus> {
    let identity = call.identity()?.clone();
    cx.store
        .transact(|tx| {
            let (identity, input) = (identity.clone(), &input);
            async move {
                let service = services::visible_service(&tx, &identity, &input.service_id, ServiceNeed::Read).await?;
                let mut targets = Vec::new();
                for spec in spec::of_service(&tx, &service.id).await? {
                    let status: Option<Entity<Status>> = tx.get(RUNTIME_STATUS, &spec.id).await?.as_ref().map(parse).transpose()?;
                    let mut slots = slots::of_service_in(&tx, &service.id, &spec.data.cluster_id).await?;
                    slots.sort_by(|a, b| a.data.slot.cmp(&b.data.slot));
                    targets.push(TargetView {
                        cluster_id: spec.data.cluster_id.clone(),
                        spec_revision: spec.revision,
                        verdict: status.as_ref().map(|s| s.data.verdict.clone()),
                        since: status.as_ref().map(|s| s.data.since),
                        spec: spec.data,
                        slots: slots.iter().map(|s| SlotView::of(&s.data)).collect(),
                    });
                }
                Ok(ServiceStatus { service_id: service.id, targets })
            }
        })
        .await
}

/// Answer of the assignment views.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assignments {
    /// The slots with their assignments, as stored.
    pub items: Vec<Entity<Slot>>,
    /// Pass back as `cursor` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

async fn service_assignments(cx: Context, call: Call, input: ServiceInput) -> Result<Assignments> {
    let identity = call.identity()?.clone();
    cx.store
        .transact(|tx| {
            let (identity, input) = (identity.clone(), &input);
            async move {
                let service = services::visible_service(&tx, &identity, &input.service_id, ServiceNeed::Read).await?;
                let docs = tx.find_all(RUNTIME_SLOTS, "by_service", &[json!(service.id)]).await?;
                Ok(Assignments { items: docs.iter().map(parse).collect::<Result<_>>()?, next_cursor: None })
            }
        })
        .await
}

/// Input of `runtime.getClusterAssignments`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterInput {
    /// The cluster.
    pub cluster_id: String,
    /// Only this node's slots.
    #[serde(default)]
    pub node_id: Option<String>,
    /// Where to continue: the `nextCursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
    /// At most 256 (default 100).
    #[serde(default)]
    pub limit: Option<usize>,
}

async fn cluster_assignments(cx: Context, _: Call, input: ClusterInput) -> Result<Assignments> {
    let limit = input.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_CLUSTER_PAGE {
        return Err(Refusal::invalid_request(format!("limit is 1–{MAX_CLUSTER_PAGE}")).with_data(json!({ "field": "limit" })));
    }
    cx.store
        .transact(|tx| {
            let input = &input;
            async move {
                capstan_inventory::clusters::require_cluster(&tx, &input.cluster_id).await?;
                let (index, key) = match &input.node_id {
                    Some(node) => ("by_node", json!(node)),
                    None => ("by_cluster", json!(input.cluster_id)),
                };
                let page = tx.find(RUNTIME_SLOTS, index, &[key], input.cursor.as_deref(), limit).await?;
                let mut items: Vec<Entity<Slot>> = page.documents.iter().map(parse).collect::<Result<_>>()?;
                items.retain(|s| s.data.cluster_id == input.cluster_id);
                Ok(Assignments { items, next_cursor: page.next_cursor })
            }
        })
        .await
}

/// Register the views.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "runtime.getServiceStatus",
            "Where a service runs: per cluster, the verdict and every replica slot (node, phase, ready, digest, restarts, last cause) (member)",
            Access::Member,
            status,
        )
        .refuses(&["service-not-found"])
        .read_only();
    registry
        .add(
            "runtime.getServiceAssignments",
            "A service's replica slots and their assignments, as stored (member)",
            Access::Member,
            service_assignments,
        )
        .refuses(&["service-not-found"])
        .read_only();
    registry
        .add(
            "runtime.getClusterAssignments",
            "A cluster's replica slots and their assignments, paged, optionally of one node (administrator)",
            Access::Admin,
            cluster_assignments,
        )
        .refuses(&["cluster-not-found"])
        .read_only();
}
