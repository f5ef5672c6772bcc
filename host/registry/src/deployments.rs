//! Deployment operations, the registry's part: a deployer reserves one exact release tag of its
//! service's repository (`deployments.reserve`), pushes its image there — the only push that tag
//! takes — and the operation records the digest it pushed (`deployments.getStatus`).
//!
//! A reservation claims `<repository>:<tag>` for good: the claim outlives the operation, so a
//! version once reserved is never reserved again (`version-collision`). A tag the registry
//! already holds cannot be reserved (`release-tag-occupied`): an operation learns its image
//! only from its own manifest PUT. `deployments.promote` pins the service to the pushed digest
//! (fenced by the service's revision, the rollout generation); `deployments.getPreflight` says
//! what stands in the way of a reserve, a promotion or a route promotion.
//!
//! An operation may reserve routes (hostnames, claimed against other services'). After the
//! promotion, `deployments.promoteRoute` publishes them on the service, checks each over HTTPS
//! (`route_check`), and declares them promoted — or withdraws what it published and records
//! why (`route-failed`); `deployments.retry` runs the check again.

use crate::Registry;
use crate::names::{is_tag, service_repository};
use crate::route_check::{Diagnostic, Evidence, Route};
use crate::storage::{TAGS, tag_id};
use capstan_auth::Identity;
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::access::has_grant;
use capstan_inventory::grants::DEPLOYERS;
use capstan_rpc::receipts;
use capstan_rpc::{Access, Call, Registry as Methods};
use capstan_store::{CollectionSpec, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;

/// Deployment operations (id `dop_…`).
pub const OPERATIONS: &str = "deployment_operations";
/// Release tags reserved, for good (id `<repository>:<tag>`).
pub const CLAIMS: &str = "deployment_claims";
/// Hostnames reserved for a service's deployments (id: the hostname).
pub const ROUTE_CLAIMS: &str = "deployment_route_claims";

/// The collections of deployment operations.
pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(OPERATIONS).index("by_service", &["serviceId"]),
        CollectionSpec::new(CLAIMS),
        CollectionSpec::new(ROUTE_CLAIMS),
    ]
}

/// Most routes one operation reserves.
pub const MAX_ROUTES: usize = 8;

/// How long a route check may stand unfinished before `deployments.retry` takes it as
/// interrupted (the host stopped during it), in milliseconds.
pub const ROUTE_PENDING_STALE_MS: u64 = 120 * 1000;

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Reserved: waiting for the deployer's push of the release tag.
    AwaitingImage,
    /// The release tag was pushed; its digest is recorded.
    ImagePushed,
    /// The service was pinned to the pushed digest.
    Promoted,
    /// Its routes are published on the service and being checked.
    RoutePending,
    /// Its routes passed their check: the service answers on them.
    RoutePromoted,
    /// A route failed its check; what was published was withdrawn (`deployments.retry`).
    RouteFailed,
    /// Cleaned up: it takes no push; its claim on the tag stays.
    CleanedUp,
}

impl State {
    /// Whether the service was pinned to the operation's release (whatever its routes did).
    pub fn promoted(self) -> bool {
        matches!(self, State::Promoted | State::RoutePending | State::RoutePromoted | State::RouteFailed)
    }

    /// Whether the operation still waits for its image or its promotion.
    pub fn unfinished(self) -> bool {
        matches!(self, State::AwaitingImage | State::ImagePushed)
    }
}

/// A deployment operation.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// The service it deploys.
    pub service_id: String,
    /// The service's repository.
    pub repository: String,
    /// The exact release tag it reserved.
    pub tag: String,
    /// The deployer that reserved it: the only one whose push it takes.
    pub actor_user_id: String,
    /// Where it stands.
    pub state: State,
    /// The root digest its push recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The media type of that root (an image manifest or an index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// When it was reserved (milliseconds since the epoch).
    pub created_at: u64,
    /// When it last changed (milliseconds since the epoch).
    pub updated_at: u64,
    /// When it was promoted (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_at: Option<u64>,
    /// The service revision its promotion wrote: the rollout generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_generation: Option<u64>,
    /// The image the service ran before the promotion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_image: Option<String>,
    /// The routes it reserved, promoted after its image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// The hostnames its route promotion added to the service's domains (withdrawn again when
    /// a check fails).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes_published: Vec<String>,
    /// When a rollback last pinned this release again (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back_at: Option<u64>,
    /// What each route's passed check saw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route_evidence: Vec<Evidence>,
    /// Why the last route check failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_diagnostic: Option<Diagnostic>,
}

/// An operation as the methods answer it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationView {
    /// Its id.
    pub id: String,
    /// Its revision: what a fenced change states.
    pub revision: u64,
    /// The operation.
    #[serde(flatten)]
    pub operation: Operation,
    /// `<host>/<repository>:<tag>`: where the deployer pushes.
    pub reference: String,
    /// Whether this answers a `mutationId` sent before.
    #[serde(default)]
    pub replayed: bool,
    /// Once promoted: where its release stands on each cluster the service's runtime specs
    /// target (`deployments.getStatus`, `deployments.list`, `deployments.rollback`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::Rollout>,
}

/// Input of `deployments.reserve`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReserveInput {
    /// The service to deploy.
    pub service_id: String,
    /// The exact release tag to push (not `latest`): a new version.
    pub tag: String,
    /// The idempotency key: the same request again answers the same operation.
    pub mutation_id: String,
    /// Hostnames the release will answer on, promoted after it (`deployments.promoteRoute`): at
    /// most 8, none another service reserved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
}

/// Input naming one operation.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OperationInput {
    /// The operation's id.
    pub operation_id: String,
}

/// Input of `deployments.promote`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PromoteInput {
    /// The operation whose pushed image to promote.
    pub operation_id: String,
    /// The operation's revision read.
    pub expected_revision: u64,
    /// The service's revision read: the rollout fence (a service that moved on is `conflict`).
    pub expected_service_revision: u64,
}

/// Input of `deployments.promoteRoute` and `deployments.retry`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteStepInput {
    /// The operation whose routes to promote.
    pub operation_id: String,
    /// The operation's revision read: a moved operation is `conflict`.
    pub expected_revision: u64,
}

/// Which step a preflight judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// `deployments.reserve` (needs `serviceId` and `tag`).
    Reserve,
    /// `deployments.promote` (needs `operationId`).
    Promote,
    /// `deployments.promoteRoute` (needs `operationId`); the HTTPS check itself is not run.
    Route,
}

/// Input of `deployments.getPreflight`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PreflightInput {
    /// The step to judge.
    pub phase: Phase,
    /// Reserve: the service.
    pub service_id: Option<String>,
    /// Reserve: the release tag.
    pub tag: Option<String>,
    /// Promote and route: the operation.
    pub operation_id: Option<String>,
}

/// One thing in a step's way.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    /// The refusal the step would answer.
    pub code: String,
    /// What a person reads.
    pub message: String,
}

/// Answer of `deployments.getPreflight`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preflight {
    /// The step judged.
    pub phase: Phase,
    /// Whether nothing stands in its way now.
    pub ready: bool,
    /// What does.
    pub blockers: Vec<Blocker>,
}

/// How long a preflight may take before it answers `deployment-preflight-unavailable`.
pub const PREFLIGHT_BUDGET: std::time::Duration = std::time::Duration::from_secs(25);

/// Input of `deployments.cleanup`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CleanupInput {
    /// The operation's id.
    pub operation_id: String,
    /// The revision read: a moved operation is `conflict`.
    pub expected_revision: u64,
}

fn not_found(id: &str) -> Refusal {
    Refusal::new("deployment-operation-not-found", "no such deployment operation")
        .with_data(json!({ "operationId": capstan_core::text::truncate(id, 80) }))
}

fn parse<T: serde::de::DeserializeOwned>(doc: &capstan_store::Document) -> Result<T> {
    serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("{}: {e}", doc.id)))
}

/// Refuse anyone but a deployment machine user (`deployment-identity-required`).
async fn require_deployer(tx: &Tx, identity: &Identity) -> Result<()> {
    let deployer = identity.kind == "machine"
        && capstan_store::validate_id(&identity.user_id).is_ok()
        && tx.get(DEPLOYERS, &identity.user_id).await?.is_some();
    if deployer {
        Ok(())
    } else {
        Err(Refusal::new("deployment-identity-required", "only a deployment machine user reserves a deployment"))
    }
}

/// Register the `deployments.*` methods.
pub fn register(methods: &mut Methods, registry: Arc<Registry>) {
    let mut methods = methods.with(registry);
    methods
        .add(
            "deployments.reserve",
            "Reserve one exact release tag of a service's repository for a deployment: only this operation's push takes it (deployers granted deployment:reserve)",
            Access::Authenticated,
            reserve,
        )
        .refuses(&[
            "deployment-identity-required",
            "service-not-found",
            "service-deleting",
            "release-tag-invalid",
            "release-tag-occupied",
            "version-collision",
            "route-invalid",
            "route-unavailable",
            "deploy-on-push-enabled",
            "mutation-reused",
        ]);
    methods
        .add(
            "deployments.promote",
            "Pin the service to the digest the operation's push recorded, fenced by the service's revision (deployers granted deployment:promote)",
            Access::Authenticated,
            promote,
        )
        .refuses(&[
            "deployment-identity-required",
            "deployment-operation-not-found",
            "deployment-image-missing",
            "deployment-state-invalid",
            "deploy-on-push-enabled",
            "conflict",
            "service-deleting",
            "service-not-found",
        ]);
    let route_refusals = [
        "deployment-identity-required",
        "deployment-operation-not-found",
        "deployment-state-invalid",
        "deployment-superseded",
        "deployment-route-check-failed",
        "conflict",
        "service-not-found",
        "service-deleting",
        "too-many-items",
        "relay-name-reserved",
        "rollout-not-healthy",
    ];
    methods
        .add(
            "deployments.promoteRoute",
            "Publish a promoted operation's routes on its service and check each over HTTPS (SNI, certificate validated, no redirect, the readiness status); a failed check withdraws them again (deployers granted deployment:promote)",
            Access::Authenticated,
            promote_route,
        )
        .refuses(&route_refusals);
    methods
        .add(
            "deployments.retry",
            "Run a failed (or interrupted) route promotion again, revision-fenced (deployers granted deployment:promote)",
            Access::Authenticated,
            retry,
        )
        .refuses(&route_refusals);
    methods
        .add(
            "deployments.getPreflight",
            "What stands in the way of a reserve, a promotion or a route promotion now, without doing it (answered within 25 s)",
            Access::Authenticated,
            preflight,
        )
        .refuses(&["deployment-preflight-unavailable"])
        .read_only();
    methods
        .add(
            "deployments.getStatus",
            "A deployment operation: where it stands, the digest its push recorded and, once promoted, its rollout on each cluster the service's runtime specs target (its deployer, deployers granted deployment:status, members, administrators)",
            Access::Authenticated,
            get_status,
        )
        .refuses(&["deployment-operation-not-found"])
        .read_only();
    methods
        .add(
            "deployments.cleanup",
            "End a deployment operation that has not been promoted: it takes no push any more; its claim on the tag stays (its deployer, administrators; revision-fenced)",
            Access::Authenticated,
            cleanup,
        )
        .refuses(&["deployment-operation-not-found", "deployment-state-invalid", "conflict"]);
}

pub(crate) fn view(registry: &Registry, id: &str, revision: u64, operation: Operation, replayed: bool) -> OperationView {
    let reference = format!("{}/{}:{}", registry.host(), operation.repository, operation.tag);
    OperationView { id: id.into(), revision, operation, reference, replayed, rollout: None }
}

async fn reserve(registry: Arc<Registry>, call: Call, input: ReserveInput) -> Result<OperationView> {
    let identity = call.identity()?.clone();
    receipts::check_mutation_id(&input.mutation_id)?;
    if !is_tag(&input.tag) || input.tag == "latest" {
        return Err(Refusal::new(
            "release-tag-invalid",
            "a release tag is 1 to 128 of A-Z a-z 0-9 _ . - (not starting with . or -), never latest",
        )
        .with_data(json!({ "field": "tag" })));
    }
    check_routes(&input.routes)?;
    let (registry_ref, identity_ref, input_ref, keys) = (&*registry, &identity, &input, registry.auth.receipt_keys());
    let answer = registry
        .storage
        .store
        .transact(|tx| async move {
            require_deployer(&tx, identity_ref).await?;
            if let Some(mut answer) =
                receipts::replay::<OperationView>(&tx, keys, &identity_ref.user_id, Some(&input_ref.mutation_id), input_ref).await?
            {
                answer.replayed = true;
                return Ok(answer);
            }
            let (service, granted) = deployable(&tx, identity_ref, &input_ref.service_id, "deployment:reserve").await?;
            if !granted {
                return Err(Refusal::new("forbidden", "this needs a deployer granted deployment:reserve on the service"));
            }
            refuse_deploy_on_push(&service)?;
            let repository = service_repository(&service.data.name, &service.id);
            let claim = tag_id(&repository, &input_ref.tag);
            if let Some(held) = tx.get(CLAIMS, &claim).await? {
                return Err(Refusal::new("version-collision", "this release tag was reserved before: reserve a new version")
                    .with_data(json!({ "tag": input_ref.tag, "operationId": held.data["operationId"] })));
            }
            if let Some(tag) = tx.get(TAGS, &claim).await? {
                return Err(Refusal::new("release-tag-occupied", "the registry already holds this tag: reserve a new version")
                    .with_data(json!({ "tag": input_ref.tag, "digest": tag.data["digest"] })));
            }
            let route_claims = claim_routes(&tx, &service.id, &input_ref.routes).await?;
            let at = now_ms();
            let operation = Operation {
                service_id: service.id.clone(),
                repository: repository.clone(),
                tag: input_ref.tag.clone(),
                actor_user_id: identity_ref.user_id.clone(),
                state: State::AwaitingImage,
                digest: None,
                media_type: None,
                created_at: at,
                updated_at: at,
                promoted_at: None,
                rollout_generation: None,
                previous_image: None,
                routes: input_ref.routes.clone(),
                routes_published: Vec::new(),
                rolled_back_at: None,
                route_evidence: Vec::new(),
                route_diagnostic: None,
            };
            let id = capstan_core::ids::new_id("dop");
            let doc = tx.insert(OPERATIONS, &id, serde_json::to_value(&operation).map_err(Refusal::internal)?).await?;
            for (hostname, held) in route_claims {
                let claim = json!({ "operationId": id, "serviceId": service.id, "createdAt": at });
                tx.put(ROUTE_CLAIMS, &hostname, held, claim).await?;
            }
            tx.insert(CLAIMS, &claim, json!({ "operationId": id, "serviceId": service.id, "createdAt": at })).await?;
            let answer = view(registry_ref, &id, doc.revision, operation, false);
            receipts::record(&tx, keys, &identity_ref.user_id, Some(&input_ref.mutation_id), input_ref, &answer).await?;
            Ok(answer)
        })
        .await?;
    if !answer.replayed {
        tracing::info!(operation = %answer.id, service = %answer.operation.service_id, tag = %answer.operation.tag, "deployment reserved");
    }
    Ok(answer)
}

/// The service a deployment step of `identity` names, and whether `identity` holds `capability`
/// on it. A caller that neither holds it nor may read the service is refused `service-not-found`
/// exactly as for a service that does not exist, before anything of the service is judged: its
/// existence, its deletion, its switches and its tags stay unseen by a stranger.
pub(crate) async fn deployable(
    tx: &Tx,
    identity: &Identity,
    service_id: &str,
    capability: &str,
) -> Result<(capstan_inventory::Entity<capstan_inventory::services::Service>, bool)> {
    use capstan_inventory::access::ServiceNeed;
    use capstan_inventory::services::{refuse_if_deleting, require_service, visible_service};
    let service = require_service(tx, service_id).await?;
    let granted = has_grant(tx, &service.id, &identity.user_id, capability).await?;
    if !granted {
        // one that may read the service learns nothing here; anyone else meets a missing one
        visible_service(tx, identity, service_id, ServiceNeed::Read).await?;
    }
    refuse_if_deleting(&service)?;
    Ok((service, granted))
}

/// The operation, if `identity` may see it (else `deployment-operation-not-found`, as if absent).
async fn visible(tx: &Tx, identity: &Identity, id: &str) -> Result<(Operation, u64)> {
    if capstan_store::validate_id(id).is_err() {
        return Err(not_found(id));
    }
    let doc = tx.get(OPERATIONS, id).await?.ok_or_else(|| not_found(id))?;
    let operation: Operation = parse(&doc)?;
    if operation.actor_user_id == identity.user_id {
        return Ok((operation, doc.revision));
    }
    let readable = match capstan_inventory::services::visible_service(
        tx,
        identity,
        &operation.service_id,
        capstan_inventory::access::ServiceNeed::Read,
    )
    .await
    {
        Ok(_) => true,
        Err(e) if e.is("service-not-found") || e.is("forbidden") => false,
        Err(e) => return Err(e),
    };
    if readable { Ok((operation, doc.revision)) } else { Err(not_found(id)) }
}

async fn get_status(registry: Arc<Registry>, call: Call, input: OperationInput) -> Result<OperationView> {
    let identity = call.identity()?;
    let id = input.operation_id.as_str();
    let registry_ref = &*registry;
    registry
        .storage
        .store
        .transact(|tx| async move {
            let (operation, revision) = visible(&tx, identity, id).await?;
            let rollout = rollout_of(registry_ref, &tx, id, &operation).await?;
            let mut answer = view(registry_ref, id, revision, operation, false);
            answer.rollout = rollout;
            Ok(answer)
        })
        .await
}

async fn cleanup(registry: Arc<Registry>, call: Call, input: CleanupInput) -> Result<OperationView> {
    let identity = call.identity()?;
    let (id, expected) = (input.operation_id.as_str(), input.expected_revision);
    let (operation, revision) = registry
        .storage
        .store
        .transact(|tx| async move {
            let (mut operation, revision) = visible(&tx, identity, id).await?;
            if operation.actor_user_id != identity.user_id && !identity.is_human_admin() {
                return Err(Refusal::new("forbidden", "only the operation's deployer or an administrator cleans it up"));
            }
            if revision != expected {
                return Err(capstan_store::conflict(OPERATIONS, id, expected, revision));
            }
            if operation.state == State::CleanedUp {
                return Ok((operation, revision));
            }
            if operation.state.promoted() {
                return Err(Refusal::new("deployment-state-invalid", "a promoted release is the service's: nothing of it is cleaned up")
                    .with_data(json!({ "state": operation.state })));
            }
            release_route_claims(&tx, id, &operation.routes).await?;
            operation.state = State::CleanedUp;
            operation.updated_at = now_ms();
            let doc = tx.replace(OPERATIONS, id, revision, serde_json::to_value(&operation).map_err(Refusal::internal)?).await?;
            Ok((operation, doc.revision))
        })
        .await?;
    tracing::info!(operation = %id, "deployment cleaned up");
    Ok(view(&registry, id, revision, operation, false))
}

/// The rollout of operation `id`, once promoted (the runtime's evidence of its digest).
pub(crate) async fn rollout_of(registry: &Registry, tx: &Tx, id: &str, operation: &Operation) -> Result<Option<crate::rollout::Rollout>> {
    let digest = operation.digest.as_deref().filter(|_| operation.state.promoted());
    crate::rollout::rollout_of(registry.rollouts.as_ref(), tx, id, &operation.service_id, digest).await
}

/// Refuse a service on the legacy deploy-on-push switch: an immutable deployment needs it off
/// (`deploy-on-push-enabled`), or a push of the tag it runs would replace the release.
pub(crate) fn refuse_deploy_on_push(service: &capstan_inventory::Entity<capstan_inventory::services::Service>) -> Result<()> {
    if service.data.deploy_on_push {
        return Err(Refusal::new(
            "deploy-on-push-enabled",
            "the service deploys on push (the legacy switch): set deployOnPush to false before deploying it by operation",
        )
        .with_data(json!({ "serviceId": service.id })));
    }
    Ok(())
}

/// Refuse routes that are not hostnames with a readiness path and a 2xx status (`route-invalid`).
fn check_routes(routes: &[Route]) -> Result<()> {
    let invalid = |field: String, why: String| Refusal::new("route-invalid", why).with_data(json!({ "field": field }));
    if routes.len() > MAX_ROUTES {
        return Err(invalid("routes".into(), format!("an operation reserves at most {MAX_ROUTES} routes")));
    }
    for (i, route) in routes.iter().enumerate() {
        let field = |name: &str| format!("routes[{i}].{name}");
        capstan_field_rules::validate::domain(&field("hostname"), &route.hostname).map_err(|e| invalid(field("hostname"), e.message))?;
        if route.hostname.starts_with("*.") {
            return Err(invalid(field("hostname"), "a route names one hostname, not a wildcard: it is checked over HTTPS".into()));
        }
        if routes[..i].iter().any(|r| r.hostname == route.hostname) {
            return Err(invalid(field("hostname"), "a hostname is listed twice".into()));
        }
        let path = &route.readiness_path;
        if !path.starts_with('/') || path.len() > 256 || path.contains('#') || !path.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                field("readinessPath"),
                "a readiness path starts with /, is at most 256 visible ASCII characters, no #".into(),
            ));
        }
        if !(200..=299).contains(&route.expected_status) {
            return Err(invalid(field("expectedStatus"), "the readiness status is 200–299".into()));
        }
    }
    Ok(())
}

/// Judge `routes` for `service_id`: a hostname another live service reserved is
/// `route-unavailable`. Answers each hostname with the revision of the claim it replaces.
async fn claim_routes(tx: &Tx, service_id: &str, routes: &[Route]) -> Result<Vec<(String, Option<u64>)>> {
    let mut claims = Vec::new();
    for route in routes {
        let held = tx.get(ROUTE_CLAIMS, &route.hostname).await?;
        if let Some(claim) = &held {
            let holder = claim.data["serviceId"].as_str().unwrap_or_default();
            // a claim of a deleted service holds nothing
            let live = match capstan_inventory::services::require_active(tx, holder).await {
                Ok(_) => true,
                Err(e) if e.is("service-not-found") || e.is("service-deleting") => false,
                Err(e) => return Err(e),
            };
            if holder != service_id && live {
                return Err(Refusal::new("route-unavailable", format!("{} is reserved by another service", route.hostname))
                    .with_data(json!({ "hostname": route.hostname, "serviceId": holder })));
            }
        }
        claims.push((route.hostname.clone(), held.map(|c| c.revision)));
    }
    Ok(claims)
}

/// Let go of the route claims operation `id` holds (it ends unpromoted).
async fn release_route_claims(tx: &Tx, id: &str, routes: &[Route]) -> Result<()> {
    for route in routes {
        if let Some(claim) = tx.get(ROUTE_CLAIMS, &route.hostname).await?
            && claim.data["operationId"] == id
        {
            tx.delete(ROUTE_CLAIMS, &route.hostname, claim.revision).await?;
        }
    }
    Ok(())
}

/// Why `operation` cannot take a route step now (`retry`: the retry of a failed or interrupted
/// one), as the refusal it would answer.
fn route_step_refusal(operation: &Operation, id: &str, current: Option<&str>, retry: bool) -> Option<Refusal> {
    let stale = operation.state == State::RoutePending && operation.updated_at + ROUTE_PENDING_STALE_MS <= now_ms();
    let (allowed, why) = if retry {
        (operation.state == State::RouteFailed || stale, "only a failed (or interrupted) route promotion is retried")
    } else {
        (operation.state == State::Promoted, "routes are promoted once, after the release is: a failed one is retried (deployments.retry)")
    };
    if !allowed {
        return Some(Refusal::new("deployment-state-invalid", why).with_data(json!({ "state": operation.state })));
    }
    if operation.routes.is_empty() {
        return Some(
            Refusal::new("deployment-state-invalid", "this operation reserved no routes").with_data(json!({ "state": operation.state })),
        );
    }
    if current != Some(id) {
        return Some(
            Refusal::new("deployment-superseded", "the service runs another release now: this operation's routes are not promoted")
                .with_data(json!({ "currentOperationId": current })),
        );
    }
    None
}

async fn promote_route(registry: Arc<Registry>, call: Call, input: RouteStepInput) -> Result<OperationView> {
    route_step(&registry, call.identity()?, &input, false).await
}

async fn retry(registry: Arc<Registry>, call: Call, input: RouteStepInput) -> Result<OperationView> {
    route_step(&registry, call.identity()?, &input, true).await
}

/// Publish the operation's routes on its service, check each, then declare them promoted or
/// withdraw what was published. The checks run between two short transactions.
async fn route_step(registry: &Registry, identity: &Identity, input: &RouteStepInput, retry: bool) -> Result<OperationView> {
    let id = input.operation_id.as_str();
    let store = &registry.storage.store;
    let (operation, revision) = store
        .transact(|tx| async move {
            require_deployer(&tx, identity).await?;
            let (mut operation, revision) = visible(&tx, identity, id).await?;
            if !has_grant(&tx, &operation.service_id, &identity.user_id, "deployment:promote").await? {
                return Err(Refusal::new("forbidden", "this needs a deployer granted deployment:promote on the service"));
            }
            if revision != input.expected_revision {
                return Err(capstan_store::conflict(OPERATIONS, id, input.expected_revision, revision));
            }
            let service = capstan_inventory::services::require_active(&tx, &operation.service_id).await?;
            let current = service.data.release.as_ref().map(|r| r.operation_id.as_str());
            if let Some(refusal) = route_step_refusal(&operation, id, current, retry) {
                return Err(refusal);
            }
            crate::rollout::require_routable(rollout_of(registry, &tx, id, &operation).await?.as_ref())?;
            let hostnames: Vec<String> = operation.routes.iter().map(|r| r.hostname.clone()).collect();
            for added in capstan_inventory::services::publish_domains(&tx, &operation.service_id, &hostnames).await? {
                if !operation.routes_published.contains(&added) {
                    operation.routes_published.push(added);
                }
            }
            operation.state = State::RoutePending;
            operation.route_diagnostic = None;
            operation.updated_at = now_ms();
            let doc = tx.replace(OPERATIONS, id, revision, serde_json::to_value(&operation).map_err(Refusal::internal)?).await?;
            Ok((operation, doc.revision))
        })
        .await?;
    let mut evidence = Vec::new();
    let mut failure = None;
    for route in &operation.routes {
        match registry.route_check.check(route).await {
            Ok(seen) => evidence.push(seen),
            Err(diagnostic) => {
                failure = Some(diagnostic);
                break;
            }
        }
    }
    let (evidence, failure) = (&evidence, &failure);
    let (operation, revision) = store
        .transact(|tx| async move {
            let doc = tx.require(OPERATIONS, id).await?;
            if doc.revision != revision {
                return Err(capstan_store::conflict(OPERATIONS, id, revision, doc.revision));
            }
            let mut operation: Operation = parse(&doc)?;
            match failure {
                None => {
                    operation.state = State::RoutePromoted;
                    operation.route_evidence = evidence.clone();
                }
                Some(diagnostic) => {
                    capstan_inventory::services::withdraw_domains(&tx, &operation.service_id, &operation.routes_published).await?;
                    operation.state = State::RouteFailed;
                    operation.route_diagnostic = Some(diagnostic.clone());
                }
            }
            operation.routes_published.clear();
            operation.updated_at = now_ms();
            let doc = tx.replace(OPERATIONS, id, revision, serde_json::to_value(&operation).map_err(Refusal::internal)?).await?;
            Ok((operation, doc.revision))
        })
        .await?;
    if let Some(d) = failure {
        tracing::warn!(operation = %id, hostname = %d.hostname, stage = ?d.stage, code = %d.code, "a deployment's route failed its check; it was withdrawn");
        return Err(Refusal::new(
            "deployment-route-check-failed",
            format!("{} failed its check at the {:?} stage ({}): {}; the previous routes stand", d.hostname, d.stage, d.code, d.message),
        )
        .retryable()
        .with_data(json!({ "operationId": id, "revision": revision, "diagnostic": d })));
    }
    tracing::info!(operation = %id, service = %operation.service_id, routes = operation.routes.len(), "deployment routes promoted");
    Ok(view(registry, id, revision, operation, false))
}

async fn promote(registry: Arc<Registry>, call: Call, input: PromoteInput) -> Result<OperationView> {
    let identity = call.identity()?;
    let (input_ref, host) = (&input, registry.host().to_string());
    let host = host.as_str();
    let (operation, revision) = registry
        .storage
        .store
        .transact(|tx| async move {
            require_deployer(&tx, identity).await?;
            let id = input_ref.operation_id.as_str();
            let (mut operation, revision) = visible(&tx, identity, id).await?;
            if !has_grant(&tx, &operation.service_id, &identity.user_id, "deployment:promote").await? {
                return Err(Refusal::new("forbidden", "this needs a deployer granted deployment:promote on the service"));
            }
            if revision != input_ref.expected_revision {
                return Err(capstan_store::conflict(OPERATIONS, id, input_ref.expected_revision, revision));
            }
            let digest = match (operation.state, &operation.digest) {
                (State::ImagePushed, Some(digest)) => digest.clone(),
                (State::AwaitingImage, _) => {
                    return Err(Refusal::new("deployment-image-missing", "the operation's release tag has not been pushed yet"));
                }
                (state, _) => {
                    return Err(Refusal::new("deployment-state-invalid", "only an operation whose image was pushed is promoted")
                        .with_data(json!({ "state": state })));
                }
            };
            let at = now_ms();
            let release = capstan_inventory::services::ServiceRelease {
                operation_id: id.into(),
                tag: operation.tag.clone(),
                digest: digest.clone(),
                promoted_at: at,
            };
            let before = capstan_inventory::services::require_service(&tx, &operation.service_id).await?;
            refuse_deploy_on_push(&before)?;
            let image = format!("{host}/{}@{digest}", operation.repository);
            let pinned =
                capstan_inventory::services::pin_release(&tx, &operation.service_id, input_ref.expected_service_revision, &image, release)
                    .await?;
            operation.state = State::Promoted;
            operation.promoted_at = Some(at);
            operation.rollout_generation = Some(pinned.revision);
            operation.previous_image = Some(before.data.image);
            operation.updated_at = at;
            let doc = tx.replace(OPERATIONS, id, revision, serde_json::to_value(&operation).map_err(Refusal::internal)?).await?;
            Ok((operation, doc.revision))
        })
        .await?;
    tracing::info!(operation = %input.operation_id, service = %operation.service_id, digest = operation.digest.as_deref().unwrap_or(""), "deployment promoted");
    Ok(view(&registry, &input.operation_id, revision, operation, false))
}

async fn preflight(registry: Arc<Registry>, call: Call, input: PreflightInput) -> Result<Preflight> {
    let identity = call.identity()?;
    let started = std::time::Instant::now();
    let judged = tokio::time::timeout(PREFLIGHT_BUDGET, judge_preflight(&registry, identity, &input)).await;
    let elapsed = started.elapsed();
    if elapsed > std::time::Duration::from_secs(5) {
        tracing::warn!(phase = ?input.phase, elapsed_ms = elapsed.as_millis() as u64, "a deployment preflight was slow");
    }
    let blockers = judged.map_err(|_| {
        Refusal::new("deployment-preflight-unavailable", "the preflight did not finish within 25 seconds: ask again").retryable()
    })??;
    Ok(Preflight { phase: input.phase, ready: blockers.is_empty(), blockers })
}

async fn judge_preflight(registry: &Registry, identity: &Identity, input: &PreflightInput) -> Result<Vec<Blocker>> {
    let blocker = |e: Refusal| Blocker { code: e.code.to_string(), message: e.message };
    let missing = |field: &str| Refusal::invalid_request(format!("this phase needs {field}")).with_data(json!({ "field": field }));
    registry
        .storage
        .store
        .transact(|tx| async move {
            let mut blockers = Vec::new();
            if let Err(e) = require_deployer(&tx, identity).await {
                blockers.push(blocker(e));
            }
            match input.phase {
                Phase::Reserve => {
                    let service_id = input.service_id.as_deref().ok_or_else(|| missing("serviceId"))?;
                    let tag = input.tag.as_deref().ok_or_else(|| missing("tag"))?;
                    if !is_tag(tag) || tag == "latest" {
                        blockers.push(Blocker {
                            code: "release-tag-invalid".into(),
                            message: "a release tag is a tag other than latest".into(),
                        });
                    }
                    match deployable(&tx, identity, service_id, "deployment:reserve").await {
                        Err(e) if e.is("service-not-found") || e.is("service-deleting") => blockers.push(blocker(e)),
                        Err(e) => return Err(e),
                        Ok((service, granted)) => {
                            if !granted {
                                blockers.push(Blocker {
                                    code: "forbidden".into(),
                                    message: "this needs a deployer granted deployment:reserve".into(),
                                });
                            }
                            if let Err(e) = refuse_deploy_on_push(&service) {
                                blockers.push(blocker(e));
                            }
                            let claim = tag_id(&service_repository(&service.data.name, &service.id), tag);
                            // reserved before, or already in the registry: either way, a new version is needed
                            if is_tag(tag) && (tx.get(CLAIMS, &claim).await?.is_some() || tx.get(TAGS, &claim).await?.is_some()) {
                                blockers.push(Blocker {
                                    code: "version-collision".into(),
                                    message: "this release tag is taken: reserve a new version".into(),
                                });
                            }
                        }
                    }
                }
                Phase::Promote => {
                    let id = input.operation_id.as_deref().ok_or_else(|| missing("operationId"))?;
                    match visible(&tx, identity, id).await {
                        Err(e) if e.is("deployment-operation-not-found") => blockers.push(blocker(e)),
                        Err(e) => return Err(e),
                        Ok((operation, _)) => {
                            if !has_grant(&tx, &operation.service_id, &identity.user_id, "deployment:promote").await? {
                                blockers.push(Blocker {
                                    code: "forbidden".into(),
                                    message: "this needs a deployer granted deployment:promote".into(),
                                });
                            }
                            match operation.state {
                                State::ImagePushed => {}
                                State::AwaitingImage => blockers.push(Blocker {
                                    code: "deployment-image-missing".into(),
                                    message: "the release tag has not been pushed yet".into(),
                                }),
                                _ => blockers.push(Blocker {
                                    code: "deployment-state-invalid".into(),
                                    message: "only an operation whose image was pushed is promoted".into(),
                                }),
                            }
                            match capstan_inventory::services::require_active(&tx, &operation.service_id).await {
                                Err(e) => blockers.push(blocker(e)),
                                Ok(service) => {
                                    if let Err(e) = refuse_deploy_on_push(&service) {
                                        blockers.push(blocker(e));
                                    }
                                }
                            }
                        }
                    }
                }
                Phase::Route => {
                    let id = input.operation_id.as_deref().ok_or_else(|| missing("operationId"))?;
                    match visible(&tx, identity, id).await {
                        Err(e) if e.is("deployment-operation-not-found") => blockers.push(blocker(e)),
                        Err(e) => return Err(e),
                        Ok((operation, _)) => {
                            if !has_grant(&tx, &operation.service_id, &identity.user_id, "deployment:promote").await? {
                                blockers.push(Blocker {
                                    code: "forbidden".into(),
                                    message: "this needs a deployer granted deployment:promote".into(),
                                });
                            }
                            match capstan_inventory::services::require_active(&tx, &operation.service_id).await {
                                Err(e) if e.is("service-not-found") || e.is("service-deleting") => blockers.push(blocker(e)),
                                Err(e) => return Err(e),
                                Ok(service) => {
                                    let current = service.data.release.as_ref().map(|r| r.operation_id.as_str());
                                    let retry = operation.state == State::RouteFailed;
                                    if let Some(refusal) = route_step_refusal(&operation, id, current, retry) {
                                        blockers.push(blocker(refusal));
                                    }
                                    let rollout = rollout_of(registry, &tx, id, &operation).await?;
                                    if let Err(refusal) = crate::rollout::require_routable(rollout.as_ref()) {
                                        blockers.push(blocker(refusal));
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Ok(blockers)
        })
        .await
}

/// What a manifest PUT meets in `repository`: which operation (if any) holds the tag, and
/// whether `identity` has an operation waiting for its image in the repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// Nothing reserved concerns this push.
    Free,
    /// The caller's own operation waits for exactly this tag: the push records its digest.
    Own(String),
    /// Another operation holds the tag (`release-tag-reserved`).
    Reserved(String),
}

/// Judge a manifest PUT of `tag` (or by digest) in `repository` by `identity`, inside the PUT's
/// transaction.
pub async fn binding(tx: &Tx, repository: &str, tag: Option<&str>, identity: &Identity) -> Result<Binding> {
    let Some(tag) = tag else { return Ok(Binding::Free) };
    let Some(claim) = tx.get(CLAIMS, &tag_id(repository, tag)).await? else { return Ok(Binding::Free) };
    let operation_id = claim.data["operationId"].as_str().unwrap_or_default().to_string();
    let Some(doc) = tx.get(OPERATIONS, &operation_id).await? else { return Ok(Binding::Reserved(operation_id)) };
    let operation: Operation = parse(&doc)?;
    if operation.actor_user_id == identity.user_id && operation.state == State::AwaitingImage {
        Ok(Binding::Own(operation_id))
    } else {
        Ok(Binding::Reserved(operation_id))
    }
}

/// Whether `identity` has an operation in `repository` waiting for its image (so its pushes of
/// the image's parts — blobs, child manifests by digest — are taken).
pub async fn awaiting_image(store: &capstan_store::Store, repository: &str, service_id: &str, identity: &Identity) -> Result<bool> {
    store
        .transact(|tx| async move {
            for doc in tx.find_all(OPERATIONS, "by_service", &[json!(service_id)]).await? {
                let operation: Operation = parse(&doc)?;
                if operation.repository == repository
                    && operation.actor_user_id == identity.user_id
                    && operation.state == State::AwaitingImage
                {
                    return Ok(true);
                }
            }
            Ok(false)
        })
        .await
}

/// Record the pushed root on the caller's operation (in the PUT's transaction).
pub async fn record_image(tx: &Tx, operation_id: &str, digest: &str, media_type: &str) -> Result<()> {
    let doc = tx.require(OPERATIONS, operation_id).await?;
    let mut operation: Operation = parse(&doc)?;
    operation.state = State::ImagePushed;
    operation.digest = Some(digest.into());
    operation.media_type = Some(media_type.into());
    operation.updated_at = now_ms();
    tx.replace(OPERATIONS, operation_id, doc.revision, serde_json::to_value(&operation).map_err(Refusal::internal)?).await.map(drop)
}
