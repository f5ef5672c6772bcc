//! `deployments.rollback` pins a kept release again through the promotion's path, and
//! `deployments.list` lists a service's operations with where each stands.

use crate::Registry;
use crate::deployments::{CLAIMS, OPERATIONS, Operation, OperationView, deployable, refuse_deploy_on_push, rollout_of, view};
use crate::names::{is_tag, service_repository};
use crate::storage::{MANIFESTS, member_id, tag_id};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry as Methods};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;

/// Register `deployments.rollback` and `deployments.list`.
pub fn register(methods: &mut Methods, registry: Arc<Registry>) {
    let mut methods = methods.with(registry);
    methods
        .add(
            "deployments.rollback",
            "Roll a service back to a kept release (one it ran before that retention kept): its operation is pinned again with a new rollout generation and rolls out as a promotion does, its routes as they stand (deployers granted deployment:promote, administrators; fenced by the service's revision)",
            Access::Authenticated,
            rollback,
        )
        .refuses(&["release-not-kept", "release-current", "deploy-on-push-enabled", "conflict", "service-not-found", "service-deleting"]);
    methods
        .add(
            "deployments.list",
            "A service's deployment operations, newest first: each one's state, tag and digest, which one the service runs (with its rollout per cluster) and which are rollback targets (deployers granted deployment:status, members, administrators)",
            Access::Authenticated,
            list,
        )
        .refuses(&["service-not-found", "service-deleting"])
        .read_only();
}

/// Input of `deployments.rollback`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RollbackInput {
    /// The service to roll back.
    pub service_id: String,
    /// The release tag of a kept release (one the service ran before and retention kept).
    pub release: String,
    /// The service's revision read: the rollout fence (a service that moved on is `conflict`).
    pub expected_service_revision: u64,
}

/// Pin the service to a kept release again: its operation becomes the current one, with a new
/// rollout generation, and rolls out as a promotion does.
async fn rollback(registry: Arc<Registry>, call: Call, input: RollbackInput) -> Result<OperationView> {
    let identity = call.identity()?;
    let (input_ref, host, registry_ref) = (&input, registry.host().to_string(), &*registry);
    let host = host.as_str();
    let answer = registry
        .storage
        .store
        .transact(|tx| async move {
            let (service, granted) = deployable(&tx, identity, &input_ref.service_id, "deployment:promote").await?;
            if !granted && !identity.is_human_admin() {
                return Err(Refusal::new("forbidden", "a rollback needs a deployer granted deployment:promote, or an administrator"));
            }
            refuse_deploy_on_push(&service)?;
            let repository = service_repository(&service.data.name, &service.id);
            let not_kept = || {
                Refusal::new(
                    "release-not-kept",
                    "the service keeps no such release to roll back to: `deployments.list` names the kept ones",
                )
                .with_data(json!({ "release": capstan_core::text::truncate(&input_ref.release, 128) }))
            };
            let claim = match is_tag(&input_ref.release) {
                true => tx.get(CLAIMS, &tag_id(&repository, &input_ref.release)).await?,
                false => None,
            };
            let id = claim.and_then(|c| c.data["operationId"].as_str().map(str::to_string)).ok_or_else(not_kept)?;
            let doc = tx.get(OPERATIONS, &id).await?.ok_or_else(not_kept)?;
            let mut operation: Operation = serde_json::from_value(doc.data.clone()).map_err(Refusal::internal)?;
            let digest = operation.digest.clone().filter(|_| operation.state.promoted()).ok_or_else(not_kept)?;
            if operation.service_id != service.id || tx.get(MANIFESTS, &member_id(&repository, &digest)).await?.is_none() {
                return Err(not_kept());
            }
            if service.data.release.as_ref().is_some_and(|r| r.operation_id == id) {
                return Err(Refusal::new("release-current", "the service runs this release already")
                    .with_data(json!({ "operationId": id, "release": operation.tag })));
            }
            let at = now_ms();
            let release = capstan_inventory::services::ServiceRelease {
                operation_id: id.clone(),
                tag: operation.tag.clone(),
                digest: digest.clone(),
                promoted_at: at,
            };
            let image = format!("{host}/{repository}@{digest}");
            let pinned =
                capstan_inventory::services::pin_release(&tx, &service.id, input_ref.expected_service_revision, &image, release).await?;
            operation.promoted_at = Some(at);
            operation.rollout_generation = Some(pinned.revision);
            operation.previous_image = Some(service.data.image.clone());
            operation.rolled_back_at = Some(at);
            operation.updated_at = at;
            let doc = tx.replace(OPERATIONS, &id, doc.revision, serde_json::to_value(&operation).map_err(Refusal::internal)?).await?;
            let rollout = rollout_of(registry_ref, &tx, &id, &operation).await?;
            let mut answer = view(registry_ref, &id, doc.revision, operation, false);
            answer.rollout = rollout;
            Ok(answer)
        })
        .await?;
    tracing::info!(operation = %answer.id, service = %answer.operation.service_id, tag = %answer.operation.tag, "deployment rolled back");
    Ok(answer)
}

/// Input of `deployments.list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListInput {
    /// The service.
    pub service_id: String,
    /// How many, newest first (default 20, at most 100).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One operation in `deployments.list`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    /// The operation.
    #[serde(flatten)]
    pub operation: OperationView,
    /// Whether the service runs its release now.
    pub current: bool,
    /// Whether `deployments.rollback` can pin it again (promoted before, not current, its
    /// image still kept).
    pub rollback_target: bool,
}

/// Answer of `deployments.list`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    /// Newest first.
    pub items: Vec<Listed>,
    /// How many operations the service has in all.
    pub total: usize,
}

/// A service's deployment operations, newest first, each with where it stands; the current
/// one carries its rollout.
async fn list(registry: Arc<Registry>, call: Call, input: ListInput) -> Result<Listing> {
    let identity = call.identity()?;
    let limit = input.limit.unwrap_or(20).clamp(1, 100);
    let (input_ref, registry_ref) = (&input, &*registry);
    registry
        .storage
        .store
        .transact(|tx| async move {
            let (service, _) = deployable(&tx, identity, &input_ref.service_id, "deployment:status").await?;
            let repository = service_repository(&service.data.name, &service.id);
            let current = service.data.release.as_ref().map(|r| r.operation_id.clone());
            let mut docs = tx.find_all(OPERATIONS, "by_service", &[json!(service.id)]).await?;
            let total = docs.len();
            let mut operations = Vec::with_capacity(docs.len());
            for doc in docs.drain(..) {
                let operation: Operation = serde_json::from_value(doc.data.clone()).map_err(Refusal::internal)?;
                operations.push((doc.id, doc.revision, operation));
            }
            operations.sort_by_key(|(_, _, o)| std::cmp::Reverse((o.promoted_at.unwrap_or(0).max(o.created_at), o.created_at)));
            let mut items = Vec::new();
            for (id, revision, operation) in operations.into_iter().take(limit) {
                let is_current = current.as_deref() == Some(id.as_str());
                let kept = match operation.digest.as_deref() {
                    Some(digest) if operation.state.promoted() && !is_current => {
                        tx.get(MANIFESTS, &member_id(&repository, digest)).await?.is_some()
                    }
                    _ => false,
                };
                let rollout = if is_current { rollout_of(registry_ref, &tx, &id, &operation).await? } else { None };
                let mut view = view(registry_ref, &id, revision, operation, false);
                view.rollout = rollout;
                items.push(Listed { operation: view, current: is_current, rollback_target: kept });
            }
            Ok(Listing { items, total })
        })
        .await
}
