//! The ingress manager: one designated ingress per cluster, its bearer, its registration
//! through the cluster's relay, and the revisioned route table it serves.
//!
//! - `ingress.designate` names a service of the fleet the cluster's ingress (compare-and-swap
//!   on the service's revision and the current designation's generation) and keeps its bearer,
//!   the service's secret `CAPSTAN_CLUSTER_INGRESS_BEARER` in the management scope
//!   `cluster-ingress:<clusterId>`, so it reaches the ingress through the service's resolved
//!   manifest. The bearer is ensured before the designation commits (the WIT joins no secret
//!   write to a store batch): a retried designation finds the same bearer.
//! - Every service with domains whose replicas run on a designated cluster is routed through its
//!   ingress, to the nodes where a replica is ready (`runtime.service-replicas`, each node's
//!   `address`, the port its http port is published at); the table follows the replicas as the
//!   runtime reports them (`runtime.observed`). `ingress.attachService` routes a service run
//!   outside Capstan's runtime, at an address it states, and names the hostnames of a service
//!   that are not public.
//! - The reconcile pass computes each designated cluster's table ([`table::compute`]), issues
//!   it under the next revision, withdrawals first ([`table::next_step`]), and pushes it to the
//!   cluster's relay (`ingress.applyRouteTable`); the relay's answer records what it applied.
//! - `ingress.register` is called by the ingress through the cluster's relay; every refusal
//!   carries `retryAfterMs`. The registration states where the gateway reaches the ingress.
//! - After the tables, the same pass brings the external gateway's routes to them
//!   ([`gateway_routes::sync`]): each table's hostnames forwarded to its cluster's ingress.

mod gateway_routes;
mod table;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::now_ms;
use capstan_sdk::store::{self, Batch, Doc};
use capstan_sdk::{
    CallerKind, CollectionSpec, Context, Descriptor, Event, JsonSchema, Manager, Page, ReconcileOutcome, ReconcileTrigger, Refusal, Result,
    Role, Value, json,
};
use capstan_sdk::{agents, log, runtime, secrets, settings};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use table::{Ingress as IngressFacts, Omitted, Route};

const DESIGNATIONS: &str = "designations";
const MUTATIONS: &str = "mutations";
const ATTACHMENTS: &str = "attachments";
const TABLES: &str = "tables";
/// The secret a designated ingress authenticates its registration with.
const BEARER_KEY: &str = "CAPSTAN_CLUSTER_INGRESS_BEARER";
/// The designated service's secret holding the cluster's relay origin: it reaches the replicas
/// by the secrets path, as the bearer does (their node's id each node's agent sets).
const ORIGIN_KEY: &str = "CAPSTAN_CLUSTER_RELAY_ORIGIN";
/// While the route sources cannot be read for less than this, the table issued last stands.
const GRACE_MS: u64 = 180_000;

struct IngressManager;

impl Manager for IngressManager {
    fn describe() -> Descriptor {
        Descriptor::new()
            .refusal("designation-present", 409, "The cluster already has an ingress designation: withdraw it first")
            .refusal(
                "cluster-ingress-environment-conflict",
                409,
                "The service's own environment sets a name the cluster's ingress delivers",
            )
            .refusal("ingress-not-designated", 409, "The cluster holds no ingress designation")
            .method("designate", "Designate a service the cluster's ingress and keep its bearer.", Role::Admin, designate)
            .method("getDesignation", "A cluster's ingress designation and registration (never the bearer).", Role::Admin, get_designation)
            .read_only()
            .method(
                "exportBearer",
                "The designated ingress's bearer, to hand to the ingress (every export is recorded as a reveal).",
                Role::Admin,
                export_bearer,
            )
            .method("attachService", "Route a service's domains through the cluster's ingress.", Role::Admin, attach_service)
            .method("detachService", "Stop routing a service through its cluster's ingress.", Role::Admin, detach_service)
            .method("listAttachments", "The services routed through a cluster's ingress, paged.", Role::Admin, list_attachments)
            .read_only()
            .method("register", "The designated ingress registers through its cluster's relay.", Role::Authenticated, register)
            .method(
                "getRouteTable",
                "A cluster's current route table ({table: null} until the first).",
                Role::Authenticated,
                get_route_table,
            )
            .read_only()
            .method(
                "getEnvironment",
                "What a replica of the cluster's ingress runs with on a node: the relay origin and node id, and its bearer's secret.",
                Role::Authenticated,
                get_environment,
            )
            .read_only()
            .method("overview", "Every designated cluster: its ingress, registration and table.", Role::Admin, overview)
            .read_only()
            .setting::<Vec<table::Prefix>>(
                "forwardSourceAddresses",
                "The address prefixes the gateway's forwarded connections arrive from: a non-public hostname is served to these alone",
                Some(Vec::new()),
            )
            // /p/ingress: the designated clusters, their tables and what was left out
            .nav("Ingress", "globe")
            .page(Page::new("", "Ingress", "overview").template("overview").form("designate").form("attachService").form("detachService"))
            .collection(DESIGNATIONS)
            .collection(MUTATIONS)
            .collection(CollectionSpec::new(ATTACHMENTS).index("by_cluster", &["clusterId"]))
            .collection(TABLES)
            .collection(gateway_routes::PUBLISHED)
            .subscribe("service.updated")
            .subscribe("service.deleting")
            .subscribe("service.deleted")
            // a replica became ready or stopped being so: its routes follow at once
            .subscribe("runtime.observed")
            .reconcile_every(Duration::from_secs(10))
    }

    /// A service changed: the event's delivery already hints the reconcile loop.
    fn on_event(_ctx: &Context, _event: Event) -> Result<()> {
        Ok(())
    }

    fn reconcile(_ctx: &Context, _trigger: ReconcileTrigger) -> Result<ReconcileOutcome> {
        let mut issued = 0;
        let mut failures = Vec::new();
        for designation in designations()? {
            if let Err(refusal) = follow_origin(&designation) {
                failures.push(format!("{} relay origin: {}", designation.id, refusal.code()));
            }
            match converge(&designation.data) {
                Ok(n) => issued += n,
                Err(refusal) => failures.push(format!("{}: {}", designation.id, refusal.code())),
            }
        }
        let mut summary = format!("{issued} tables issued");
        match sync_gateway() {
            Ok(routed) => summary.push_str(&format!("; {routed} routes at the gateway")),
            Err(refusal) => failures.push(format!("gateway routes: {}", refusal.code())),
        }
        if !failures.is_empty() {
            summary.push_str(&format!("; failed: {}", failures.join(", ")));
        }
        Ok(ReconcileOutcome::done(summary))
    }
}

capstan_sdk::manager!(IngressManager);

// ---- records ----

/// A cluster's ingress designation (`designations/<clusterId>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Designation {
    cluster_id: String,
    service_id: String,
    /// Advances with every designation of the cluster; a registration is judged against it.
    generation: u64,
    /// The service revision the designation was made against.
    service_revision: u64,
    /// The nodes the ingress may register from (empty: any node of the cluster).
    node_ids: Vec<String>,
    /// The bearer's secret (metadata only).
    bearer_secret_id: String,
    /// The SHA-256 of the bearer this generation issued (hex): what a registration is judged
    /// against, since the relay's session may not read the service's secrets.
    bearer_digest: String,
    designated_at: u64,
    designated_by: String,
    /// The ingress's accepted registration under this generation, if any.
    registration: Option<Registration>,
    /// The relay origin published as the service's `CAPSTAN_CLUSTER_RELAY_ORIGIN` (metadata:
    /// the secret's id and the value it holds, which is no secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    relay_origin: Option<PublishedOrigin>,
}

/// The relay origin as last published to the designated service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct PublishedOrigin {
    secret_id: String,
    origin: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Registration {
    node_id: String,
    version: String,
    relay_version: String,
    route_source_allow_list: bool,
    /// Where the external gateway reaches the ingress, as it stated (none: its hostnames are not
    /// routed at the gateway).
    #[serde(default)]
    advertised_target: Option<gateway_routes::Target>,
    accepted_at: u64,
}

/// A service routed through a cluster's ingress by hand (`attachments/<serviceId>`): at an
/// address outside Capstan's runtime, or at its replicas with hostnames that are not public.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Attachment {
    cluster_id: String,
    service_id: String,
    /// Where a workload run outside Capstan's runtime answers; absent, the service's replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    address: Option<String>,
    #[serde(default)]
    private_hostnames: Vec<String>,
}

/// A cluster's issued route table (`tables/<clusterId>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct TableRecord {
    table: Option<Table>,
    /// What the last computation left out.
    omitted: Vec<Omitted>,
    /// The revision the relay last said it applied.
    applied_revision: u64,
    /// When the route sources were last read whole (ms).
    computed_at: u64,
    /// Why the last pass could not read them, if it could not.
    failure: Option<String>,
    /// The table's hostnames at the external gateway.
    #[serde(default)]
    gateway: gateway_routes::GatewayState,
}

/// A complete, revisioned route table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Table {
    cluster_id: String,
    revision: u64,
    routes: Vec<Route>,
    issued_at: u64,
}

/// A recorded mutation (`mutations/<mutationId>`): the request and what it answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mutation {
    request: Value,
    result: Value,
}

// ---- designate ----

capstan_sdk::shaped_text!(MutationId, r"^[A-Za-z0-9._:\-]{1,128}$", "1–128 of A-Z a-z 0-9 - _ . :");

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DesignateInput {
    cluster_id: String,
    service_id: String,
    /// The service's revision as the caller read it.
    expected_revision: u64,
    /// The current designation's generation as the caller read it: required to replace one
    /// (absent: the cluster must hold none).
    #[serde(default)]
    expected_generation: Option<u64>,
    /// The nodes the ingress may register from (absent or empty: any node of the cluster).
    #[serde(default)]
    node_ids: Vec<String>,
    mutation_id: MutationId,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct DesignateOutput {
    designation: Designation,
    /// True when the answer is the recorded one of an earlier identical request.
    replayed: bool,
}

fn designate(ctx: &Context, input: DesignateInput) -> Result<DesignateOutput> {
    let request = serde_json::to_value(&input).map_err(|e| Refusal::internal(e.to_string()))?;
    if let Some(replayed) = replay(&input.mutation_id.0, &request)? {
        return Ok(replayed);
    }
    let cluster = require_cluster(&input.cluster_id)?;
    let service = inventory::get::<Value>(EntityKind::Service, &input.service_id)?
        .ok_or_else(|| Refusal::new("service-not-found", format!("no service {}", input.service_id)))?;
    if service.data["state"] != "active" {
        return Err(Refusal::new("service-deleting", format!("service {} is being deleted", input.service_id)));
    }
    if service.revision != input.expected_revision {
        return Err(Refusal::conflict(format!(
            "service {} is at revision {}, not {}",
            input.service_id, service.revision, input.expected_revision
        ))
        .with_data(json!({"field": "expectedRevision", "current": service.revision})));
    }
    for node_id in &input.node_ids {
        require_node_of(node_id, &input.cluster_id)?;
    }
    relay_origin(&cluster)?;
    environment_conflict(&input.service_id, &service.data)?;
    let current = store::get::<Designation>(DESIGNATIONS, &input.cluster_id)?;
    match (&current, input.expected_generation) {
        (Some(held), None) => {
            return Err(Refusal::new(
                "designation-present",
                format!(
                    "cluster {} already has an ingress ({}); state expectedGeneration {} to replace it",
                    input.cluster_id, held.data.service_id, held.data.generation
                ),
            )
            .with_data(json!({"serviceId": held.data.service_id, "generation": held.data.generation})));
        }
        (Some(held), Some(expected)) if held.data.generation != expected => {
            return Err(Refusal::conflict(format!("the designation is at generation {}, not {expected}", held.data.generation))
                .with_data(json!({"field": "expectedGeneration", "current": held.data.generation})));
        }
        (None, Some(expected)) if expected != 0 => {
            return Err(Refusal::conflict(format!("cluster {} holds no designation (generation 0), not {expected}", input.cluster_id))
                .with_data(json!({"field": "expectedGeneration", "current": 0})));
        }
        _ => {}
    }
    let scope = bearer_scope(&input.cluster_id);
    let same_service = current.as_ref().is_some_and(|held| held.data.service_id == input.service_id);
    let bearer = if same_service {
        // designating the same service again rotates its bearer under the new generation
        let held = current.as_ref().map(|d| d.data.bearer_secret_id.clone()).unwrap_or_default();
        match secrets::rotate(&scope, &held) {
            Ok(info) => info,
            Err(r) if r.is("secret-revoked") || r.is("not-found") || r.is("secret-not-found") => recover_bearer(&scope, &input.service_id)?,
            Err(r) => return Err(r),
        }
    } else {
        recover_bearer(&scope, &input.service_id)?
    };
    let value = secrets::reveal(&scope, &bearer.id)?;
    let bearer_digest = sha256_hex(&value);
    let origin = relay_origin(&cluster)?;
    let published = publish_origin(&scope, &input.service_id, &origin)?;
    let designation = Designation {
        cluster_id: input.cluster_id.clone(),
        service_id: input.service_id.clone(),
        generation: current.as_ref().map_or(1, |d| d.data.generation + 1),
        service_revision: service.revision,
        node_ids: input.node_ids.clone(),
        bearer_secret_id: bearer.id.clone(),
        bearer_digest,
        designated_at: now_ms(),
        designated_by: ctx.caller().id().to_string(),
        registration: None,
        relay_origin: Some(published),
    };
    let result = DesignateOutput { designation: designation.clone(), replayed: false };
    let result_value = serde_json::to_value(&result).map_err(|e| Refusal::internal(e.to_string()))?;
    let batch = Batch::new().put(DESIGNATIONS, &input.cluster_id, current.as_ref().map(|d| d.revision), &designation).insert(
        MUTATIONS,
        &input.mutation_id.0,
        &Mutation { request, result: result_value },
    );
    match batch.commit() {
        Ok(_) => {}
        Err(r) if r.is("exists") => {
            // the same mutation id committed meanwhile: answer as a replay would
            let request = serde_json::to_value(&input).map_err(|e| Refusal::internal(e.to_string()))?;
            return replay(&input.mutation_id.0, &request)?.ok_or(r);
        }
        Err(r) => return Err(r),
    }
    // a move revokes the previous service's bearer and origin; one already revoked is not
    // revoked again
    if let Some(held) = current.filter(|held| held.data.service_id != input.service_id) {
        let origin = held.data.relay_origin.as_ref().map(|o| o.secret_id.as_str());
        for secret_id in std::iter::once(held.data.bearer_secret_id.as_str()).chain(origin) {
            if let Err(refusal) = secrets::revoke(&scope, secret_id)
                && !refusal.is("secret-revoked")
            {
                warn(
                    "revoking the previous ingress's secret failed",
                    &[("clusterId", &input.cluster_id), ("serviceId", &held.data.service_id), ("code", refusal.code())],
                );
            }
        }
    }
    Ok(result)
}

/// Publish `origin` as the service's `CAPSTAN_CLUSTER_RELAY_ORIGIN` in `scope` (a new version
/// when it differs; a revoked one active again).
fn publish_origin(scope: &str, service_id: &str, origin: &str) -> Result<PublishedOrigin> {
    let info = secrets::put(scope, &secrets::Owner::Service(service_id.to_string()), ORIGIN_KEY, origin.as_bytes())?;
    Ok(PublishedOrigin { secret_id: info.id, origin: origin.to_string() })
}

/// A cluster whose relay origin moved publishes the new one to its designated ingress (whose
/// replicas are then replaced with it, one at a time).
fn follow_origin(designation: &Doc<Designation>) -> Result<()> {
    let Some(cluster) = inventory::get::<Value>(EntityKind::Cluster, &designation.data.cluster_id)? else { return Ok(()) };
    let Ok(origin) = relay_origin(&cluster) else { return Ok(()) };
    if designation.data.relay_origin.as_ref().is_some_and(|p| p.origin == origin) {
        return Ok(());
    }
    let published = publish_origin(&bearer_scope(&designation.data.cluster_id), &designation.data.service_id, &origin)?;
    let mut next = designation.data.clone();
    next.relay_origin = Some(published);
    match Batch::new().replace(DESIGNATIONS, &designation.id, designation.revision, &next).commit() {
        Ok(_) => Ok(()),
        // a designation that moved meanwhile is followed by the next pass
        Err(r) if r.is("conflict") || r.is("not-found") => Ok(()),
        Err(r) => Err(r),
    }
}

/// The bearer of `service_id` in `scope`: the active one, or a fresh one; a revoked one is
/// recovered with a fresh version (the revoked version stays revoked).
fn recover_bearer(scope: &str, service_id: &str) -> Result<secrets::SecretInfo> {
    let owner = secrets::Owner::Service(service_id.to_string());
    match secrets::ensure(scope, &owner, BEARER_KEY, &secrets::Generate::base64url(43)) {
        Err(r) if r.is("secret-revoked") => {
            let value: [u8; 32] = rand::random();
            secrets::put(scope, &owner, BEARER_KEY, URL_SAFE_NO_PAD.encode(value).as_bytes())
        }
        other => other,
    }
}

/// The recorded answer of `mutation_id`, when it was used for exactly `request`.
fn replay(mutation_id: &str, request: &Value) -> Result<Option<DesignateOutput>> {
    let Some(recorded) = store::get::<Mutation>(MUTATIONS, mutation_id)? else { return Ok(None) };
    if recorded.data.request != *request {
        return Err(Refusal::new("mutation-reused", format!("mutation id {mutation_id} was used for another request"))
            .with_data(json!({"field": "mutationId"})));
    }
    let mut answer: DesignateOutput =
        serde_json::from_value(recorded.data.result).map_err(|e| Refusal::internal(format!("a recorded mutation is unreadable: {e}")))?;
    answer.replayed = true;
    Ok(Some(answer))
}

// ---- reads ----

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClusterInput {
    cluster_id: String,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct DesignationOutput {
    cluster_id: String,
    designation: Option<Designation>,
}

fn get_designation(_ctx: &Context, input: ClusterInput) -> Result<DesignationOutput> {
    let designation = store::get::<Designation>(DESIGNATIONS, &input.cluster_id)?.map(|d| d.data);
    if designation.is_none() {
        require_cluster(&input.cluster_id)?;
    }
    Ok(DesignationOutput { cluster_id: input.cluster_id, designation })
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct RouteTableOutput {
    cluster_id: String,
    table: Option<Table>,
    omitted: Vec<Omitted>,
    applied_revision: u64,
}

/// The names a designated ingress's replicas run with; the service's own environment may set none.
const ENVIRONMENT_NAMES: [&str; 3] = [BEARER_KEY, ORIGIN_KEY, "CAPSTAN_CLUSTER_NODE_ID"];

/// The cluster's relay origin, or `cluster-relay-missing`.
fn relay_origin(cluster: &inventory::Entity<Value>) -> Result<String> {
    match (cluster.data["relay"]["enabled"].as_bool(), cluster.data["relay"]["origin"].as_str()) {
        (Some(true), Some(origin)) if !origin.is_empty() => Ok(origin.to_string()),
        _ => Err(Refusal::new(
            "cluster-relay-missing",
            format!("cluster {} has no relay; an administrator enables it with clusters.enableRelay", cluster.id),
        )
        .with_data(json!({"clusterId": cluster.id}))),
    }
}

/// `cluster-ingress-environment-conflict` when the service's own environment sets a name the
/// ingress environment adds.
fn environment_conflict(service_id: &str, service: &Value) -> Result<()> {
    let set: Vec<&str> = ENVIRONMENT_NAMES.iter().copied().filter(|name| service["environment"].get(*name).is_some()).collect();
    if set.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        "cluster-ingress-environment-conflict",
        format!("service {service_id} sets {} in its own environment; the cluster ingress's environment provides it", set.join(", ")),
    )
    .with_data(json!({"serviceId": service_id, "names": set})))
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EnvironmentInput {
    cluster_id: String,
    /// The node the replica runs on.
    node_id: String,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct EnvironmentOutput {
    cluster_id: String,
    service_id: String,
    generation: u64,
    /// Added to the replica's environment.
    environment: std::collections::BTreeMap<String, String>,
    /// The secrets of the service's manifest the replica needs (by key; never a value).
    secrets: Vec<String>,
}

/// The environment a replica of the designated ingress runs with on `node_id`: it follows from
/// the designation existing; a relay origin that moves changes it.
fn get_environment(ctx: &Context, input: EnvironmentInput) -> Result<EnvironmentOutput> {
    let cluster = readable_cluster(ctx, &input.cluster_id)?;
    let held = store::get::<Designation>(DESIGNATIONS, &input.cluster_id)?
        .ok_or_else(|| Refusal::new("ingress-not-designated", format!("cluster {} holds no ingress designation", input.cluster_id)))?;
    require_node_of(&input.node_id, &input.cluster_id)?;
    let origin = relay_origin(&cluster)?;
    if let Some(service) = inventory::get::<Value>(EntityKind::Service, &held.data.service_id)? {
        environment_conflict(&held.data.service_id, &service.data)?;
    }
    let environment =
        [(ORIGIN_KEY, origin), ("CAPSTAN_CLUSTER_NODE_ID", input.node_id)].into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    Ok(EnvironmentOutput {
        cluster_id: input.cluster_id,
        service_id: held.data.service_id,
        generation: held.data.generation,
        environment,
        secrets: vec![BEARER_KEY.to_string(), ORIGIN_KEY.to_string()],
    })
}

/// The table as last issued. A machine may read only its own cluster's (a relay session acts
/// as its cluster's machine user).
fn get_route_table(ctx: &Context, input: ClusterInput) -> Result<RouteTableOutput> {
    readable_cluster(ctx, &input.cluster_id)?;
    let record = store::get::<TableRecord>(TABLES, &input.cluster_id)?.map(|d| d.data);
    Ok(match record {
        Some(r) => {
            RouteTableOutput { cluster_id: input.cluster_id, table: r.table, omitted: r.omitted, applied_revision: r.applied_revision }
        }
        None => RouteTableOutput { cluster_id: input.cluster_id, table: None, omitted: Vec::new(), applied_revision: 0 },
    })
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct OverviewItem {
    cluster_id: String,
    /// The cluster's name (none when the cluster is gone).
    cluster_name: Option<String>,
    service_id: String,
    /// `<service> in <organization>` (none when the service is gone).
    service_name: Option<String>,
    /// The services routed through it, with their names (the first 100).
    attached: Vec<AttachedView>,
    generation: u64,
    registered: Option<String>,
    revision: Option<u64>,
    applied_revision: u64,
    routes: usize,
    omitted: Vec<Omitted>,
    failure: Option<String>,
    /// Where the gateway reaches the ingress (`host:port`), as its registration stated.
    advertised: Option<String>,
    /// Hostnames the gateway confirmed it routes to the ingress.
    gateway_routed: usize,
    /// Hostnames the gateway does not route: `hostname: code`.
    gateway_refused: Vec<String>,
    /// Why nothing of the cluster is routed at the gateway, or why the last pass stopped.
    gateway_failure: Option<String>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct OverviewOutput {
    clusters: Vec<OverviewItem>,
    /// Every cluster, with its relay and designation, for the page's pickers.
    choices: Vec<ClusterChoice>,
    /// The services in use, by organization then name, with their revisions (what may be
    /// designated or attached).
    services: Vec<ServiceChoice>,
    /// A mutation id for the forms of this rendering: a form sent twice (a double click, a
    /// reload) is one designation.
    form_id: String,
}

/// An attached service as the page shows it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct AttachedView {
    service_id: String,
    service_name: Option<String>,
    /// Where a workload outside Capstan's runtime answers; none: its replicas.
    address: Option<String>,
}

/// A cluster and what may be designated its ingress (names for people, ids and revisions for
/// the form).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ClusterChoice {
    cluster_id: String,
    cluster_name: String,
    /// Whether its relay is enabled (an ingress registers through it; none is designated
    /// without).
    relay: bool,
    /// The designated service and the designation's generation, when there is one.
    designated: Option<String>,
    generation: Option<u64>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ServiceChoice {
    id: String,
    name: String,
    organization_name: String,
    revision: u64,
}

/// The services in use, by organization then name, each with its revision.
fn service_choices() -> Result<Vec<ServiceChoice>> {
    let organizations: std::collections::BTreeMap<String, String> = inventory::list_all::<Value>(EntityKind::Organization)?
        .into_iter()
        .map(|o| (o.id, o.data["name"].as_str().unwrap_or_default().to_string()))
        .collect();
    let mut services: Vec<ServiceChoice> = inventory::list_all::<Value>(EntityKind::Service)?
        .into_iter()
        .filter(|s| s.data["state"] != "deleting")
        .map(|s| ServiceChoice {
            name: s.data["name"].as_str().unwrap_or_default().to_string(),
            organization_name: s.data["organizationId"].as_str().and_then(|o| organizations.get(o)).cloned().unwrap_or_default(),
            revision: s.revision,
            id: s.id,
        })
        .collect();
    services.sort_by(|a, b| (&a.organization_name, &a.name).cmp(&(&b.organization_name, &b.name)));
    Ok(services)
}

/// The clusters by name, with their relay and designation.
fn cluster_choices(designations: &[Doc<Designation>]) -> Result<Vec<ClusterChoice>> {
    let mut clusters: Vec<ClusterChoice> = inventory::list_all::<Value>(EntityKind::Cluster)?
        .into_iter()
        .map(|c| {
            let designation = designations.iter().find(|d| d.data.cluster_id == c.id);
            ClusterChoice {
                cluster_name: c.data["name"].as_str().unwrap_or_default().to_string(),
                relay: relay_origin(&c).is_ok(),
                designated: designation.map(|d| d.data.service_id.clone()),
                generation: designation.map(|d| d.data.generation),
                cluster_id: c.id,
            }
        })
        .collect();
    clusters.sort_by(|a, b| a.cluster_name.cmp(&b.cluster_name));
    Ok(clusters)
}

fn overview(_ctx: &Context, _input: capstan_sdk::Empty) -> Result<OverviewOutput> {
    let mut clusters = Vec::new();
    let designated = designations()?;
    let (choices, services) = (cluster_choices(&designated)?, service_choices()?);
    let name_of =
        |id: &str| -> Option<String> { services.iter().find(|s| s.id == id).map(|s| format!("{} in {}", s.name, s.organization_name)) };
    for d in designated {
        let record = store::get::<TableRecord>(TABLES, &d.id)?.map(|r| r.data);
        let registration = d.data.registration.as_ref();
        let gateway = record.as_ref().map(|r| r.gateway.clone()).unwrap_or_default();
        let attached = store::find::<Attachment>(ATTACHMENTS, "by_cluster", &[json!(d.data.cluster_id)], None, 100)?
            .documents
            .into_iter()
            .map(|a| AttachedView { service_name: name_of(&a.data.service_id), service_id: a.data.service_id, address: a.data.address })
            .collect();
        clusters.push(OverviewItem {
            attached,
            cluster_name: choices.iter().find(|c| c.cluster_id == d.data.cluster_id).map(|c| c.cluster_name.clone()),
            service_name: name_of(&d.data.service_id),
            cluster_id: d.data.cluster_id.clone(),
            service_id: d.data.service_id.clone(),
            generation: d.data.generation,
            registered: registration.map(|r| format!("{} · {} · relay {}", r.node_id, r.version, r.relay_version)),
            revision: record.as_ref().and_then(|r| r.table.as_ref().map(|t| t.revision)),
            applied_revision: record.as_ref().map_or(0, |r| r.applied_revision),
            routes: record.as_ref().and_then(|r| r.table.as_ref().map(|t| t.routes.len())).unwrap_or(0),
            omitted: record.as_ref().map(|r| r.omitted.clone()).unwrap_or_default(),
            advertised: registration.and_then(|r| r.advertised_target.as_ref()).map(gateway_routes::Target::to_string),
            gateway_routed: gateway.routed,
            gateway_refused: gateway.refused.iter().map(|r| format!("{}: {}", r.hostname, r.code)).collect(),
            gateway_failure: gateway.failure,
            failure: record.and_then(|r| r.failure),
        });
    }
    Ok(OverviewOutput { clusters, choices, services, form_id: format!("page-{}", now_ms()) })
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ExportedBearer {
    cluster_id: String,
    service_id: String,
    generation: u64,
    /// A credential: hand it to the ingress alone (a private file), never store or log it.
    bearer: String,
}

fn export_bearer(_ctx: &Context, input: ClusterInput) -> Result<ExportedBearer> {
    let held = store::get::<Designation>(DESIGNATIONS, &input.cluster_id)?
        .ok_or_else(|| Refusal::new("ingress-not-designated", format!("cluster {} holds no ingress designation", input.cluster_id)))?;
    let value = secrets::reveal(&bearer_scope(&input.cluster_id), &held.data.bearer_secret_id)?;
    let bearer = String::from_utf8(value).map_err(|_| Refusal::internal("the bearer is not text"))?;
    Ok(ExportedBearer { cluster_id: input.cluster_id, service_id: held.data.service_id, generation: held.data.generation, bearer })
}

// ---- attachments ----

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AttachInput {
    cluster_id: String,
    service_id: String,
    /// An address outside Capstan's runtime the service answers on (an IP address or a host
    /// name); omit it for a service whose replicas Capstan runs on the cluster.
    #[serde(default)]
    address: Option<String>,
    /// Hostnames of the service that are not public (served to the forwarding sources alone).
    #[serde(default)]
    private_hostnames: Vec<String>,
}

fn attach_service(_ctx: &Context, input: AttachInput) -> Result<Attachment> {
    require_cluster(&input.cluster_id)?;
    let service = inventory::get::<table::Service>(EntityKind::Service, &input.service_id)?
        .ok_or_else(|| Refusal::new("service-not-found", format!("no service {}", input.service_id)))?;
    if input.address.as_deref().is_some_and(|a| !is_address(a)) {
        return Err(Refusal::invalid_request("address must be an IP address or a host name").with_data(json!({"field": "address"})));
    }
    if let Some(h) = input.private_hostnames.iter().find(|h| !service.data.domains.contains(h)) {
        return Err(Refusal::invalid_request(format!("{h} is not a domain of service {}", input.service_id))
            .with_data(json!({"field": "privateHostnames"})));
    }
    let attachment = Attachment {
        cluster_id: input.cluster_id,
        service_id: input.service_id.clone(),
        address: input.address,
        private_hostnames: input.private_hostnames,
    };
    let stored = attachment.clone();
    store::update_with_retry::<Attachment, _>(ATTACHMENTS, &input.service_id, move |_| Ok(Some(stored.clone())), 5)?;
    Ok(attachment)
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ListAttachmentsInput {
    cluster_id: String,
    /// Where to continue: the `nextCursor` of the previous page.
    #[serde(default)]
    cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Attachments {
    items: Vec<Attachment>,
    next_cursor: Option<String>,
}

/// A deleted service's attachment is dropped by the next reconcile pass, so it leaves this list.
fn list_attachments(_ctx: &Context, input: ListAttachmentsInput) -> Result<Attachments> {
    require_cluster(&input.cluster_id)?;
    let page = store::find::<Attachment>(ATTACHMENTS, "by_cluster", &[json!(input.cluster_id)], input.cursor.as_deref(), 100)?;
    Ok(Attachments { items: page.documents.into_iter().map(|d| d.data).collect(), next_cursor: page.next_cursor })
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceInput {
    service_id: String,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Detached {
    service_id: String,
    detached: bool,
}

fn detach_service(_ctx: &Context, input: ServiceInput) -> Result<Detached> {
    let was = store::get::<Attachment>(ATTACHMENTS, &input.service_id)?.is_some();
    store::update_with_retry::<Attachment, _>(ATTACHMENTS, &input.service_id, |_| Ok(None), 5)?;
    Ok(Detached { service_id: input.service_id, detached: was })
}

// ---- registration ----

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Capabilities {
    /// The ingress enforces a route's `sourceAllowList`.
    #[serde(default)]
    route_source_allow_list: bool,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RegisterInput {
    cluster_id: String,
    /// The node the ingress runs on.
    node_id: String,
    /// The cluster's ingress bearer (never echoed).
    bearer: String,
    /// The ingress's version.
    version: String,
    /// The release of the relay it registers through.
    relay_version: String,
    #[serde(default)]
    capabilities: Capabilities,
    /// Where the external gateway reaches the ingress (absent: its hostnames are not routed at
    /// the gateway).
    #[serde(default)]
    advertised_target: Option<gateway_routes::Target>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Registered {
    cluster_id: String,
    service_id: String,
    generation: u64,
    node_id: String,
    accepted_at: u64,
}

/// A registration refusal: its code, and how long the ingress waits before it tries again.
fn refused(code: &str, message: String) -> Refusal {
    let retry_after_ms: u64 = match code {
        "not-ready" | "relay-not-connected" | "assignment-not-running" => 5_000,
        "conflict" => 1_000,
        _ => 60_000,
    };
    let refusal = Refusal::new(code, message).with_data(json!({"retryAfterMs": retry_after_ms}));
    if retry_after_ms < 60_000 { refusal.retryable() } else { refusal }
}

fn register(ctx: &Context, input: RegisterInput) -> Result<Registered> {
    if input.bearer.is_empty() || input.bearer.len() > 1024 || !input.bearer.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(refused("registration-invalid", "the bearer must be 1–1024 visible ASCII characters".into()));
    }
    if input.version.is_empty() || input.version.len() > 64 || table::parse_version(&input.relay_version).is_none() {
        return Err(refused("registration-invalid", "version must be 1–64 characters and relayVersion major.minor.patch".into()));
    }
    if let Some(target) = &input.advertised_target
        && (target.port == 0 || !is_address(&target.host))
    {
        return Err(refused("registration-invalid", "advertisedTarget must be an IP address or DNS name and a port 1–65535".into()));
    }
    let cluster = match inventory::get::<Value>(EntityKind::Cluster, &input.cluster_id) {
        Ok(Some(cluster)) => cluster,
        Ok(None) => return Err(refused("registration-invalid", format!("no cluster {}", input.cluster_id))),
        Err(r) => return Err(refused("not-ready", format!("the cluster cannot be read now ({})", r.code()))),
    };
    // the relay session acts as its cluster's machine user
    if ctx.caller().kind() != CallerKind::Machine || cluster.data["machineUserId"].as_str() != Some(ctx.caller().id()) {
        return Err(refused("relay-not-connected", "the caller is not this cluster's relay".into()));
    }
    match agents::call::<Value>(&input.cluster_id, "agent.ping", &json!({})) {
        Ok(pong) if pong["nodeId"].as_str() == Some(input.node_id.as_str()) => {}
        Ok(pong) => {
            return Err(refused(
                "relay-not-connected",
                format!("the cluster's elected relay runs on {}, not on {}", pong["nodeId"].as_str().unwrap_or("?"), input.node_id),
            ));
        }
        Err(r) => return Err(refused("relay-not-connected", format!("the cluster's relay cannot be reached: {}", r.code()))),
    }
    let held = match store::get::<Designation>(DESIGNATIONS, &input.cluster_id) {
        Ok(Some(held)) => held,
        Ok(None) => return Err(refused("ingress-not-designated", format!("cluster {} holds no ingress designation", input.cluster_id))),
        Err(r) => {
            warn("the designation cannot be read", &[("clusterId", &input.cluster_id), ("code", r.code())]);
            return Err(refused("not-ready", "the designation cannot be read now".into()));
        }
    };
    let node_ok = match inventory::get::<Value>(EntityKind::Node, &input.node_id) {
        Ok(Some(node)) => node.data["clusterId"].as_str() == Some(input.cluster_id.as_str()),
        Ok(None) => false,
        Err(_) => return Err(refused("not-ready", "the node cannot be read now".into())),
    };
    if !node_ok || (!held.data.node_ids.is_empty() && !held.data.node_ids.contains(&input.node_id)) {
        return Err(refused("node-mismatch", format!("node {} is not a node the cluster's ingress may register from", input.node_id)));
    }
    running_on(&held.data.service_id, &input.cluster_id, &input.node_id)?;
    if !constant_time_eq(sha256_hex(input.bearer.as_bytes()).as_bytes(), held.data.bearer_digest.as_bytes()) {
        return Err(refused("bearer-refused", "the bearer is not the cluster ingress's current bearer".into()));
    }
    let accepted_at = now_ms();
    let mut next = held.data.clone();
    next.registration = Some(Registration {
        node_id: input.node_id.clone(),
        version: input.version,
        relay_version: input.relay_version,
        route_source_allow_list: input.capabilities.route_source_allow_list,
        advertised_target: input.advertised_target,
        accepted_at,
    });
    match Batch::new().replace(DESIGNATIONS, &input.cluster_id, held.revision, &next).commit() {
        Ok(_) => {}
        Err(r) if r.is("conflict") || r.is("not-found") => {
            return Err(refused("conflict", "the designation moved while the registration was judged".into()));
        }
        Err(r) => return Err(refused("not-ready", format!("recording the registration failed ({})", r.code()))),
    }
    Ok(Registered {
        cluster_id: input.cluster_id,
        service_id: next.service_id,
        generation: next.generation,
        node_id: input.node_id,
        accepted_at,
    })
}

/// Whether the designated ingress runs on `node_id`, or refused `assignment-not-running`: one
/// Capstan runs (its service has replicas on the cluster) has a running replica there; one run
/// outside the runtime (the reference ingress in the relay, its service without replicas on
/// the cluster) has an active service with a scale above 0.
fn running_on(service_id: &str, cluster_id: &str, node_id: &str) -> Result<()> {
    let not_running = |why: String| Err(refused("assignment-not-running", why));
    let service = match inventory::get::<Value>(EntityKind::Service, service_id) {
        Ok(Some(s)) => s,
        Ok(None) => return not_running(format!("the designated service {service_id} is gone")),
        Err(_) => return Err(refused("not-ready", "the designated service cannot be read now".into())),
    };
    let replicas = match runtime::service_replicas(service_id) {
        Ok(replicas) => replicas.into_iter().filter(|r| r.cluster_id == cluster_id).collect::<Vec<_>>(),
        Err(_) => return Err(refused("not-ready", "the designated service's replicas cannot be read now".into())),
    };
    if service.data["state"] != "active" {
        return not_running(format!("the designated service {service_id} is being deleted"));
    }
    if replicas.is_empty() {
        if service.data["scale"].as_u64().unwrap_or(0) == 0 {
            return not_running(format!("the designated service {service_id} is scaled to 0"));
        }
        return Ok(());
    }
    if replicas.iter().any(|r| r.node_id == node_id && r.intent == runtime::Intent::Run && r.phase == "running") {
        return Ok(());
    }
    not_running(format!("no replica of the designated service {service_id} runs on node {node_id}"))
}

// ---- the route table ----

/// Bring one designated cluster's table to what its sources say; answers how many tables were
/// issued.
fn converge(designation: &Designation) -> Result<u32> {
    let cluster_id = &designation.cluster_id;
    let held = store::get::<TableRecord>(TABLES, cluster_id)?;
    let mut record = held.as_ref().map(|d| d.data.clone()).unwrap_or(TableRecord {
        table: None,
        omitted: Vec::new(),
        applied_revision: 0,
        computed_at: 0,
        failure: None,
        gateway: Default::default(),
    });
    let now = now_ms();
    let desired = match sources(cluster_id) {
        Ok(sources) => {
            let facts = IngressFacts {
                enforces_allow_lists: designation.registration.as_ref().is_some_and(|r| r.route_source_allow_list),
                relay_version: designation.registration.as_ref().map(|r| r.relay_version.clone()),
            };
            let forward: Settings = settings::get()?;
            let (forward, unreadable): (Vec<String>, Vec<String>) =
                forward.forward_source_addresses.into_iter().map(|p| p.0).partition(|p| table::is_prefix(p));
            if !unreadable.is_empty() {
                // the setting's pattern lets through what only parsing refuses (a /33, say)
                warn("forwardSourceAddresses holds prefixes that are not addresses; left out", &[("prefixes", &unreadable.join(","))]);
            }
            let (routes, omitted) = table::compute(&sources, &forward, &facts);
            for o in omitted.iter().filter(|o| !record.omitted.contains(o)) {
                warn("a route was left out", &[("clusterId", cluster_id), ("hostname", &o.hostname), ("code", &o.code)]);
            }
            record.omitted = omitted;
            record.computed_at = now;
            record.failure = None;
            routes
        }
        Err(refusal) => {
            // unreadable sources keep the table issued last within the grace, then withdraw it all
            record.failure = Some(format!("the route sources cannot be read: {}", refusal.message()));
            warn("the route sources cannot be read", &[("clusterId", cluster_id), ("code", refusal.code())]);
            if record.table.is_none() || now.saturating_sub(record.computed_at) < GRACE_MS {
                save(cluster_id, held.as_ref().map(|d| d.revision), &record)?;
                return Ok(0);
            }
            Vec::new()
        }
    };
    let mut issued = 0;
    let mut revision = held.as_ref().map(|d| d.revision);
    loop {
        let current = record.table.as_ref().map(|t| t.routes.clone()).unwrap_or_default();
        let step = table::next_step(&current, &desired);
        let unchanged = record.table.is_some() && step == current;
        if !unchanged {
            let next_revision = record.table.as_ref().map_or(1, |t| t.revision + 1);
            record.table =
                Some(Table { cluster_id: cluster_id.clone(), revision: next_revision, routes: step.clone(), issued_at: now_ms() });
            issued += 1;
        }
        revision = Some(save(cluster_id, revision, &record)?);
        let Some(table) = record.table.clone() else { break };
        // pushed again while the ingress has not registered under this designation: the push
        // names the generation, which tells the ingress to register again
        if table.revision > record.applied_revision || designation.registration.is_none() {
            let mut push = serde_json::to_value(&table).map_err(|e| Refusal::internal(e.to_string()))?;
            push["designationGeneration"] = json!(designation.generation);
            match agents::call::<Value>(cluster_id, "ingress.applyRouteTable", &push) {
                Ok(answer) => {
                    record.applied_revision = answer["appliedRevision"].as_u64().unwrap_or(record.applied_revision);
                    revision = Some(save(cluster_id, revision, &record)?);
                }
                // no relay: it reads the complete table when it registers; the additions need
                // not wait for a withdrawal nobody holds
                Err(r) if r.is("relay-not-connected") || r.is("agent-not-connected") || r.is("agent-method-unknown") => {}
                Err(r) => {
                    warn("pushing the route table failed", &[("clusterId", cluster_id), ("code", r.code())]);
                    break;
                }
            }
        }
        if step == desired {
            break;
        }
        // a withdrawal went first; the addition follows once the relay applied it (or holds none)
        if record.applied_revision < table.revision && record.applied_revision != 0 {
            break;
        }
    }
    Ok(issued)
}

/// Bring the gateway's routes to every designated cluster's issued table and record each
/// cluster's state with its table (written only when it changed); answers the routes confirmed.
fn sync_gateway() -> Result<usize> {
    let mut clusters = Vec::new();
    for d in designations()? {
        let record = store::get::<TableRecord>(TABLES, &d.id)?;
        clusters.push(gateway_routes::Cluster {
            cluster_id: d.id.clone(),
            target: d.data.registration.as_ref().and_then(|r| r.advertised_target.clone()),
            routes: record.and_then(|r| r.data.table).map(|t| t.routes).unwrap_or_default(),
        });
    }
    let states = gateway_routes::sync(&clusters)?;
    let mut routed = 0;
    for (cluster_id, state) in states {
        routed += state.routed;
        let Some(held) = store::get::<TableRecord>(TABLES, &cluster_id)? else { continue };
        if held.data.gateway == state {
            continue;
        }
        if state.failure.is_some() && state.failure != held.data.gateway.failure {
            warn("the gateway's routes are not synced", &[("clusterId", &cluster_id), ("failure", state.failure.as_deref().unwrap_or(""))]);
        }
        for r in state.refused.iter().filter(|r| !held.data.gateway.refused.contains(r)) {
            warn("the gateway does not route a hostname", &[("clusterId", &cluster_id), ("hostname", &r.hostname), ("code", &r.code)]);
        }
        let mut record = held.data;
        record.gateway = state;
        save(&cluster_id, Some(held.revision), &record)?;
    }
    Ok(routed)
}

fn save(cluster_id: &str, revision: Option<u64>, record: &TableRecord) -> Result<u64> {
    let written = Batch::new().put(TABLES, cluster_id, revision, record).commit()?;
    Ok(written.last().map_or(0, |d| d.revision))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Settings {
    #[serde(default)]
    forward_source_addresses: Vec<table::Prefix>,
}

/// Every service routed through `cluster_id` with what the table needs: those with domains
/// whose replicas run on the cluster, and those attached to it. Attachments of services that
/// are gone are dropped.
fn sources(cluster_id: &str) -> Result<Vec<table::Source>> {
    let mut attached: BTreeMap<String, Doc<Attachment>> = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store::find::<Attachment>(ATTACHMENTS, "by_cluster", &[json!(cluster_id)], cursor.as_deref(), 500)?;
        attached.extend(page.documents.into_iter().map(|d| (d.data.service_id.clone(), d)));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut addresses = runtime::NodeAddresses::default();
    let mut out = Vec::new();
    for service in inventory::list_all::<table::Service>(EntityKind::Service)? {
        let attachment = attached.remove(&service.id).map(|d| d.data);
        if attachment.is_none() && service.data.domains.is_empty() {
            continue;
        }
        let reach = match attachment.as_ref().and_then(|a| a.address.clone()) {
            Some(address) => table::Reach::External(address),
            None => match runtime::reach(&service.id, Some(cluster_id), &mut addresses)? {
                Some(reach) => table::Reach::Replicas(reach),
                // attached, and no replica on the cluster (yet): a route with nothing to send to
                None if attachment.is_some() => table::Reach::Replicas(runtime::Reach::default()),
                None => continue,
            },
        };
        out.push(table::Source {
            service_id: service.id,
            service: service.data,
            reach,
            private_hostnames: attachment.map(|a| a.private_hostnames.into_iter().collect()).unwrap_or_default(),
        });
    }
    // what is left was attached to a service that is gone
    for (_, doc) in attached {
        let _ = Batch::new().delete(ATTACHMENTS, &doc.id, doc.revision).commit();
    }
    Ok(out)
}

// ---- helpers ----

fn designations() -> Result<Vec<Doc<Designation>>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store::scan::<Designation>(DESIGNATIONS, cursor.as_deref(), 500)?;
        out.extend(page.documents);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(out),
        }
    }
}

fn require_cluster(cluster_id: &str) -> Result<inventory::Entity<Value>> {
    inventory::get::<Value>(EntityKind::Cluster, cluster_id)?
        .ok_or_else(|| Refusal::new("cluster-not-found", format!("no cluster {cluster_id}")).with_data(json!({"field": "clusterId"})))
}

/// The cluster, for an administrator or the cluster's own machine user (its relay session);
/// anyone else is `forbidden` whether or not it exists.
fn readable_cluster(ctx: &Context, cluster_id: &str) -> Result<inventory::Entity<Value>> {
    let cluster = inventory::get::<Value>(EntityKind::Cluster, cluster_id)?;
    let own = cluster.as_ref().is_some_and(|c| c.data["machineUserId"].as_str() == Some(ctx.caller().id()));
    if !ctx.caller().has_role("admin") && !own {
        return Err(Refusal::new("forbidden", "only administrators and the cluster's own machine user read this"));
    }
    cluster.ok_or_else(|| Refusal::new("cluster-not-found", format!("no cluster {cluster_id}")).with_data(json!({"field": "clusterId"})))
}

fn require_node_of(node_id: &str, cluster_id: &str) -> Result<()> {
    match inventory::get::<Value>(EntityKind::Node, node_id)? {
        Some(node) if node.data["clusterId"].as_str() == Some(cluster_id) => Ok(()),
        _ => Err(Refusal::new("node-mismatch", format!("{node_id} is not a node of cluster {cluster_id}"))
            .with_data(json!({"field": "nodeIds"}))),
    }
}

fn bearer_scope(cluster_id: &str) -> String {
    format!("cluster-ingress:{cluster_id}")
}

fn is_address(text: &str) -> bool {
    text.parse::<std::net::IpAddr>().is_ok()
        || (!text.is_empty()
            && text.len() <= 253
            && text.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            }))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn warn(message: &str, fields: &[(&str, &str)]) {
    log::log(log::Level::Warn, message, fields);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_refusals_carry_their_retry_delays() {
        for (code, ms, retryable) in [
            ("not-ready", 5_000, true),
            ("relay-not-connected", 5_000, true),
            ("assignment-not-running", 5_000, true),
            ("conflict", 1_000, true),
            ("registration-invalid", 60_000, false),
            ("ingress-not-designated", 60_000, false),
            ("node-mismatch", 60_000, false),
            ("bearer-refused", 60_000, false),
        ] {
            let r = refused(code, "m".into());
            assert_eq!((r.code(), r.data().unwrap()["retryAfterMs"].as_u64(), r.is_retryable()), (code, Some(ms), retryable));
        }
    }

    #[test]
    fn a_recovered_bearer_is_43_base64url_characters() {
        let bearer = URL_SAFE_NO_PAD.encode([7u8; 32]);
        assert_eq!(bearer.len(), 43);
        assert!(bearer.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    }

    #[test]
    fn addresses_and_bearers_compare_as_expected() {
        assert!(is_address("10.0.0.7") && is_address("::1") && is_address("web.internal"));
        assert!(!is_address("") && !is_address("a..b") && !is_address("-a.b") && !is_address("a b"));
        assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"abc", b"ab"));
    }
}
