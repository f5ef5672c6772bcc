//! What operators read of the runtime, from stored rows only: `runtime.getServiceStatus`,
//! `runtime.getServiceAssignments`, `runtime.getClusterAssignments`, and `secrets.preview`
//! (the secret names each replica was handed).

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
    /// The digest the service's image tag runs as (absent for an image pinned by digest, and
    /// before the runtime first planned it): `{image, digest?, resolvedAt?, error?, retryAt}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_plan: Option<crate::images::ImagePlan>,
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
                let image_plan = match crate::images::is_pinned(&service.data.image) {
                    true => None,
                    false => tx
                        .get(crate::images::RUNTIME_IMAGE_PLANS, &service.id)
                        .await?
                        .as_ref()
                        .map(parse::<crate::images::ImagePlan>)
                        .transpose()?
                        .map(|e| e.data)
                        .filter(|p| p.image == service.data.image),
                };
                Ok(ServiceStatus { service_id: service.id, targets, image_plan })
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

/// What one replica was handed of its service's secrets: names, never values.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSecrets {
    /// The cluster.
    pub cluster_id: String,
    /// `<nodeId>.<index>`.
    pub slot: String,
    /// The node it stands on.
    pub node_id: String,
    /// The assignment the material was sealed for.
    pub assignment_id: String,
    /// The replica's phase, as in `runtime.getServiceStatus`.
    pub phase: String,
    /// The resolved manifest its values were pinned from.
    pub manifest: u64,
    /// The secrets environment of the manifest.
    pub environment: String,
    /// The names it gets as environment variables.
    pub variables: Vec<String>,
    /// The names it gets as files under `/run/secrets`.
    pub files: Vec<String>,
    /// The node has reported on this assignment, so its agent opened the material.
    pub received: bool,
}

/// Answer of `secrets.preview`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretsPreview {
    /// The service.
    pub service_id: String,
    /// The newest published manifest (0 before the first): a replica at an older one is
    /// replaced, one slot at a time.
    pub manifest_number: u64,
    /// Every replica running with secrets, by cluster and slot.
    pub replicas: Vec<ReplicaSecrets>,
}

impl ReplicaSecrets {
    fn of(slot: &Slot) -> Option<ReplicaSecrets> {
        let a = &slot.assignment;
        let secrets = a.work.secrets.as_ref().filter(|_| a.intent == crate::transition::Intent::Run)?;
        let variables = secrets.keys.keys().filter(|k| !secrets.files.contains(k)).cloned().collect();
        Some(ReplicaSecrets {
            cluster_id: slot.cluster_id.clone(),
            slot: slot.slot.clone(),
            node_id: slot.node_id.clone(),
            assignment_id: slot.assignment_id.clone(),
            phase: slot.phase(),
            manifest: secrets.manifest,
            environment: secrets.environment.clone(),
            variables,
            files: secrets.files.iter().filter(|f| secrets.keys.contains_key(*f)).cloned().collect(),
            received: a.observation.is_some(),
        })
    }
}

async fn secrets_preview(cx: Context, _: Call, input: ServiceInput) -> Result<SecretsPreview> {
    cx.store
        .transact(|tx| {
            let input = &input;
            async move {
                let service = services::require_service(&tx, &input.service_id).await?;
                let docs = tx.find_all(RUNTIME_SLOTS, "by_service", &[json!(service.id)]).await?;
                let mut held: Vec<Slot> = docs.iter().map(|d| parse::<Slot>(d).map(|e| e.data)).collect::<Result<_>>()?;
                held.sort_by(|a, b| (&a.cluster_id, &a.slot).cmp(&(&b.cluster_id, &b.slot)));
                Ok(SecretsPreview {
                    manifest_number: capstan_secrets::manifests::head(&tx, &service.id).await?,
                    replicas: held.iter().filter_map(ReplicaSecrets::of).collect(),
                    service_id: service.id,
                })
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
    registry
        .add(
            "secrets.preview",
            "Which secret names (never values) each replica of a service was handed, at which manifest revision (administrator)",
            Access::Admin,
            secrets_preview,
        )
        .refuses(&["service-not-found"])
        .read_only();
}
