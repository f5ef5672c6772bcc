//! Runtime specs (`runtime.setServiceSpec`, `runtime.getServiceSpec`,
//! `runtime.deleteServiceSpec`): what runs of a service on one cluster, one document per
//! (service, cluster), written whole with a compare-and-swap (docs/runtime.md).

use super::{Context, RUNTIME_SLOTS, RUNTIME_SPECS, RUNTIME_STATUS, spec_id};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::access::ServiceNeed;
use capstan_inventory::clusters::{Phase, Runtime};
use capstan_inventory::services::{self, Service};
use capstan_inventory::{CLUSTER_NODES, CLUSTER_RUNTIMES, Entity, emit, parse, to_value};
use capstan_nodes::records::{Node, NodeState};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::Tx;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Most replicas a spec places on one node.
pub const MAX_REPLICAS_PER_NODE: u32 = 16;
/// Most nodes a spec pins.
pub const MAX_PINNED_NODES: usize = 256;

/// Where a spec places its replicas: every active node of the cluster, or the pinned ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Placement {
    /// Every active node of the cluster.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub every_node: bool,
    /// These nodes of the cluster: sorted, without duplicates, at most 256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<String>>,
}

/// What becomes of a replica that failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Restart {
    /// Replaced after its backoff (`min(10 s · 2^n, 10 min)`).
    #[default]
    OnFailure,
    /// Kept failed until the spec or the image changes.
    Never,
}

/// How a replica's readiness is probed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum HealthKind {
    /// No probe: a running container is ready.
    #[default]
    None,
    /// A TCP connection to the port.
    Tcp,
    /// An HTTP GET of the path on the port, answered 2xx or 3xx.
    Http,
}

/// A replica's health check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Health {
    /// `none`, `tcp` or `http`.
    pub kind: HealthKind,
    /// The port probed: one the service declares (tcp and http).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The path an http probe asks for: starts with `/`, at most 256 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Between probes, in milliseconds: 1,000–300,000 (default 5,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// Failing probes in a row that make a replica unhealthy: 1–10 (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<u32>,
}

/// A stored runtime spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The service it runs.
    pub service_id: String,
    /// The cluster it runs on.
    pub cluster_id: String,
    /// The service's organization (who may read and write the spec).
    pub organization_id: String,
    /// Where its replicas go.
    pub placement: Placement,
    /// Replicas on each placed node.
    pub replicas_per_node: u32,
    /// `true` stops every replica and keeps the spec.
    pub hold: bool,
    /// Nodes whose replicas stop while the others run (a restore there, a node's maintenance):
    /// sorted, no duplicates.
    #[serde(default)]
    pub held_nodes: Vec<String>,
    /// What becomes of a failed replica.
    pub restart: Restart,
    /// How readiness is probed (defaults filled in).
    pub health: Health,
    /// How the service's secrets reach its replicas.
    #[serde(default)]
    pub secrets: SecretsUse,
    /// When it was written (milliseconds since the epoch).
    pub updated_at: u64,
    /// Who wrote it (a user id).
    pub updated_by: String,
}

/// Input of `runtime.setServiceSpec`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SetInput {
    /// The service.
    pub service_id: String,
    /// The cluster it runs on.
    pub cluster_id: String,
    /// The revision read; `null` when the caller read no spec for this cluster.
    pub expected_revision: Option<u64>,
    /// Where its replicas go: `{"everyNode": true}` or `{"nodes": [...]}`.
    pub placement: Placement,
    /// Replicas on each placed node: 0–16.
    pub replicas_per_node: u32,
    /// `true` stops every replica and keeps the spec (default false).
    #[serde(default)]
    pub hold: bool,
    /// Nodes whose replicas stop while the others run, sorted, without duplicates; absent keeps
    /// what the spec holds (so a writer that does not know of them releases none), `[]` none.
    #[serde(default)]
    pub held_nodes: Option<Vec<String>>,
    /// `on-failure` (default) or `never`.
    #[serde(default)]
    pub restart: Restart,
    /// The health check (default none).
    #[serde(default)]
    pub health: Health,
    /// How the service's secrets reach its replicas (default: the `production` secrets, each as an
    /// environment variable).
    #[serde(default)]
    pub secrets: SecretsUse,
}

/// How a service's secrets reach its replicas (docs/runtime.md, "Secret material"): which
/// environment's secrets, and which of them as files under `/run/secrets` rather than
/// environment variables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretsUse {
    /// The secrets' environment (default `production`).
    #[serde(default = "production")]
    pub environment: String,
    /// Keys delivered as files `/run/secrets/<KEY>` (mode 0400, on a tmpfs), sorted; every other
    /// key is an environment variable.
    #[serde(default)]
    pub files: Vec<String>,
}

fn production() -> String {
    "production".into()
}

impl Default for SecretsUse {
    fn default() -> SecretsUse {
        SecretsUse { environment: production(), files: Vec::new() }
    }
}

/// At most this many keys are delivered as files.
const MAX_SECRET_FILES: usize = 64;

/// `secrets` checked: a valid environment name, files as sorted unique keys.
fn normalize_secrets(secrets: &SecretsUse) -> Result<SecretsUse> {
    let invalid = |message: String| Refusal::invalid_request(message).with_data(json!({ "field": "secrets" }));
    capstan_inventory::validate::name("environment", &secrets.environment)
        .map_err(|_| invalid("secrets.environment is an environment name: 1 to 63 of a-z 0-9 -, starting with a letter".into()))?;
    if secrets.files.len() > MAX_SECRET_FILES {
        return Err(invalid(format!("at most {MAX_SECRET_FILES} secrets are delivered as files")));
    }
    let mut files = secrets.files.clone();
    for key in &files {
        let valid = !key.is_empty()
            && key.len() <= 128
            && !key.starts_with(|c: char| c.is_ascii_digit())
            && key.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err(invalid(format!("{:?} is not a secret key ([A-Z_][A-Z0-9_]*)", capstan_core::text::truncate(key, 100))));
        }
    }
    files.sort();
    files.dedup();
    Ok(SecretsUse { environment: secrets.environment.clone(), files })
}

/// Input of `runtime.getServiceSpec`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GetInput {
    /// The service.
    pub service_id: String,
    /// One cluster; every cluster the service has a spec for when absent.
    #[serde(default)]
    pub cluster_id: Option<String>,
}

/// Answer of `runtime.getServiceSpec`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Specs {
    /// The specs, in cluster order.
    pub items: Vec<Entity<Spec>>,
}

/// Input of `runtime.deleteServiceSpec`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeleteInput {
    /// The service.
    pub service_id: String,
    /// The cluster.
    pub cluster_id: String,
    /// The revision read.
    pub expected_revision: u64,
}

/// Answer of `runtime.deleteServiceSpec`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    /// The spec's id (`<serviceId>@<clusterId>`).
    pub id: String,
}

/// The health check with its defaults filled in, or the refusal naming what is wrong.
pub fn normalize_health(health: &Health, service: &Service) -> Result<Health> {
    let invalid = |message: &str| Refusal::invalid_request(message.to_string()).with_data(json!({ "field": "health" }));
    match health.kind {
        HealthKind::None => {
            if health.port.is_some() || health.path.is_some() {
                return Err(invalid("a health check of kind none names no port or path"));
            }
            return Ok(Health { kind: HealthKind::None, port: None, path: None, interval_ms: None, threshold: None });
        }
        HealthKind::Tcp if health.path.is_some() => return Err(invalid("a tcp health check names no path")),
        _ => {}
    }
    let Some(port) = health.port else { return Err(invalid("a tcp or http health check names the port it probes")) };
    if !service.ports.iter().any(|p| p.port == port) {
        let declared: Vec<u16> = service.ports.iter().map(|p| p.port).collect();
        return Err(Refusal::new("health-port-undeclared", format!("the service declares no port {port}; its ports: {declared:?}"))
            .with_data(json!({ "port": port, "declared": declared })));
    }
    let path = match health.kind {
        HealthKind::Http => {
            let path = health.path.clone().unwrap_or_else(|| "/".into());
            if !path.starts_with('/') || path.len() > 256 || path.chars().any(|c| c.is_control() || c == ' ') {
                return Err(invalid("an http health check's path starts with / and is at most 256 bytes without spaces"));
            }
            Some(path)
        }
        _ => None,
    };
    let interval_ms = health.interval_ms.unwrap_or(5_000);
    if !(1_000..=300_000).contains(&interval_ms) {
        return Err(invalid("intervalMs is 1000–300000"));
    }
    let threshold = health.threshold.unwrap_or(3);
    if !(1..=10).contains(&threshold) {
        return Err(invalid("threshold is 1–10"));
    }
    Ok(Health { kind: health.kind, port: Some(port), path, interval_ms: Some(interval_ms), threshold: Some(threshold) })
}

/// The cluster's runtime phase, refused by name when the cluster holds none or runs another
/// runtime.
pub async fn serving_phase(tx: &Tx, cluster_id: &str) -> Result<Phase> {
    let Some(doc) = tx.get(CLUSTER_RUNTIMES, cluster_id).await? else {
        return Err(Refusal::new("cluster-runtime-missing", format!("Capstan holds no runtime phase for the cluster {cluster_id}"))
            .with_data(json!({ "clusterId": cluster_id })));
    };
    let runtime: Entity<Runtime> = parse(&doc)?;
    if runtime.data.phase == Phase::Swarm {
        return Err(Refusal::new("cluster-runtime-phase-refused", "the cluster is in phase swarm: its placement is not Capstan's")
            .with_data(json!({ "clusterId": cluster_id, "phase": "swarm" })));
    }
    Ok(runtime.data.phase)
}

fn node_not_in_cluster(node_id: &str, cluster_id: &str) -> Refusal {
    let shown = capstan_core::text::truncate(node_id, 100);
    Refusal::new("node-not-in-cluster", format!("{shown} is not an active node of the cluster {cluster_id}"))
        .with_data(json!({ "nodeId": shown, "clusterId": cluster_id }))
}

/// The node `node_id` names, if it is a well-formed id of one.
async fn node(tx: &Tx, node_id: &str) -> Result<Option<Entity<Node>>> {
    let found = match capstan_store::validate_id(node_id) {
        Ok(()) => tx.get(CLUSTER_NODES, node_id).await?,
        Err(_) => None,
    };
    found.as_ref().map(parse).transpose()
}

async fn check_placement(tx: &Tx, placement: &Placement, cluster_id: &str) -> Result<()> {
    match (placement.every_node, &placement.nodes) {
        (true, None) => Ok(()),
        (false, Some(nodes)) => {
            if nodes.is_empty() || nodes.len() > MAX_PINNED_NODES {
                return Err(Refusal::invalid_request("placement.nodes names 1–256 nodes").with_data(json!({ "field": "placement.nodes" })));
            }
            if nodes.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Refusal::invalid_request("placement.nodes is sorted, without duplicates")
                    .with_data(json!({ "field": "placement.nodes" })));
            }
            for node_id in nodes {
                match node(tx, node_id).await? {
                    Some(node) if node.data.cluster_id == cluster_id && node.data.state == NodeState::Active => {}
                    _ => return Err(node_not_in_cluster(node_id, cluster_id)),
                }
            }
            Ok(())
        }
        _ => Err(Refusal::invalid_request("placement is {\"everyNode\": true} or {\"nodes\": [...]}, one of the two")
            .with_data(json!({ "field": "placement" }))),
    }
}

/// Held nodes name nodes of the cluster (in any state: one retired since stays harmless), sorted,
/// without duplicates.
async fn check_held_nodes(tx: &Tx, nodes: &[String], cluster_id: &str) -> Result<()> {
    let field = json!({ "field": "heldNodes" });
    if nodes.len() > MAX_PINNED_NODES {
        return Err(Refusal::invalid_request("heldNodes names at most 256 nodes").with_data(field));
    }
    if nodes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Refusal::invalid_request("heldNodes is sorted, without duplicates").with_data(field));
    }
    for node_id in nodes {
        if node(tx, node_id).await?.is_none_or(|n| n.data.cluster_id != cluster_id) {
            let shown = capstan_core::text::truncate(node_id, 100);
            return Err(Refusal::new("node-not-in-cluster", format!("{shown} is not a node of the cluster {cluster_id}"))
                .with_data(json!({ "nodeId": shown, "clusterId": cluster_id, "field": "heldNodes" })));
        }
    }
    Ok(())
}

async fn set(cx: Context, call: Call, input: SetInput) -> Result<Entity<Spec>> {
    let written = write(&cx.store, call.identity()?, input).await?;
    cx.wake();
    Ok(written)
}

/// Write a service's spec on a cluster as `identity` (`runtime.setServiceSpec`, and a plugin's
/// `runtime.set-service-spec`); the producer picks it up on its next pass.
pub async fn write(store: &capstan_store::Store, identity: &capstan_rpc::Identity, input: SetInput) -> Result<Entity<Spec>> {
    let identity = identity.clone();
    store
        .transact(|tx| {
            let (identity, input) = (identity.clone(), &input);
            async move {
                let service = services::visible_service(&tx, &identity, &input.service_id, ServiceNeed::Write).await?;
                services::refuse_if_deleting(&service)?;
                capstan_inventory::clusters::require_cluster(&tx, &input.cluster_id).await?;
                serving_phase(&tx, &input.cluster_id).await?;
                check_placement(&tx, &input.placement, &input.cluster_id).await?;
                if input.replicas_per_node > MAX_REPLICAS_PER_NODE {
                    return Err(Refusal::new("replica-limit", format!("at most {MAX_REPLICAS_PER_NODE} replicas per node"))
                        .with_data(json!({ "limit": MAX_REPLICAS_PER_NODE })));
                }
                if input.replicas_per_node > 1 && !service.data.volumes.is_empty() {
                    return Err(Refusal::new(
                        "replica-limit",
                        "a service with volumes runs one replica per node: its volumes are one directory on the node",
                    )
                    .with_data(json!({ "limit": 1 })));
                }
                if input.replicas_per_node > 1 && service.data.ports.iter().any(|p| p.public_port.is_some()) {
                    return Err(Refusal::new(
                        "replica-limit",
                        "a service publishing a port on its node runs one replica per node: two would ask for the same port",
                    )
                    .with_data(json!({ "limit": 1 })));
                }
                let health = normalize_health(&input.health, &service.data)?;
                let secrets = normalize_secrets(&input.secrets)?;
                let id = spec_id(&service.id, &input.cluster_id);
                let stored = tx.get(RUNTIME_SPECS, &id).await?;
                let actual = stored.as_ref().map(|d| d.revision);
                if actual != input.expected_revision {
                    return Err(Refusal::new(
                        "conflict",
                        format!(
                            "the spec of {} on {} is at revision {:?}, not {:?}: read it again",
                            service.id, input.cluster_id, actual, input.expected_revision
                        ),
                    )
                    .with_data(json!({ "id": id, "expectedRevision": input.expected_revision, "revision": actual })));
                }
                let held_nodes = match &input.held_nodes {
                    Some(nodes) => {
                        check_held_nodes(&tx, nodes, &input.cluster_id).await?;
                        nodes.clone()
                    }
                    None => stored.as_ref().map(parse::<Spec>).transpose()?.map(|s| s.data.held_nodes).unwrap_or_default(),
                };
                let spec = Spec {
                    service_id: service.id.clone(),
                    cluster_id: input.cluster_id.clone(),
                    organization_id: service.data.organization_id.clone(),
                    placement: input.placement.clone(),
                    replicas_per_node: input.replicas_per_node,
                    hold: input.hold,
                    held_nodes,
                    restart: input.restart,
                    health,
                    secrets,
                    updated_at: now_ms(),
                    updated_by: identity.user_id.clone(),
                };
                let doc = tx.put(RUNTIME_SPECS, &id, actual, to_value(&spec)?).await?;
                // the service's deletion waits until its replicas are removed
                services::hold_in(&tx, &service.id, super::HOLDER).await?;
                emit(&tx, "runtime.spec-set", &service.id, json!({ "clusterId": spec.cluster_id, "revision": doc.revision })).await?;
                Ok(Entity { id: doc.id, revision: doc.revision, data: spec })
            }
        })
        .await
}

/// Every spec of a service, in cluster order.
pub async fn of_service(tx: &Tx, service_id: &str) -> Result<Vec<Entity<Spec>>> {
    let docs = tx.find_all(RUNTIME_SPECS, "by_service", &[json!(service_id)]).await?;
    let mut specs: Vec<Entity<Spec>> = docs.iter().map(parse).collect::<Result<_>>()?;
    specs.sort_by(|a, b| a.data.cluster_id.cmp(&b.data.cluster_id));
    Ok(specs)
}

async fn get(cx: Context, call: Call, input: GetInput) -> Result<Specs> {
    let identity = call.identity()?.clone();
    cx.store
        .transact(|tx| {
            let (identity, input) = (identity.clone(), &input);
            async move {
                let service = services::visible_service(&tx, &identity, &input.service_id, ServiceNeed::Read).await?;
                let mut items = of_service(&tx, &service.id).await?;
                if let Some(cluster) = &input.cluster_id {
                    items.retain(|s| &s.data.cluster_id == cluster);
                    if items.is_empty() {
                        return Err(spec_not_found(&service.id, cluster));
                    }
                }
                Ok(Specs { items })
            }
        })
        .await
}

/// `spec-not-found`, naming the cluster as asked (cut to 100 characters: it is the caller's text).
fn spec_not_found(service_id: &str, cluster_id: &str) -> Refusal {
    let shown = capstan_core::text::truncate(cluster_id, 100);
    Refusal::new("spec-not-found", format!("the service has no runtime spec for the cluster {shown:?}"))
        .with_data(json!({ "serviceId": service_id, "clusterId": shown }))
}

async fn delete(cx: Context, call: Call, input: DeleteInput) -> Result<Deleted> {
    let identity = call.identity()?.clone();
    cx.store
        .transact(|tx| {
            let (identity, input) = (identity.clone(), &input);
            async move {
                let service = services::visible_service(&tx, &identity, &input.service_id, ServiceNeed::Write).await?;
                let id = spec_id(&service.id, &input.cluster_id);
                let stored = match capstan_store::validate_id(&id) {
                    Ok(()) => tx.get(RUNTIME_SPECS, &id).await?,
                    Err(_) => None,
                };
                let Some(doc) = stored else { return Err(spec_not_found(&service.id, &input.cluster_id)) };
                capstan_inventory::check_revision("runtime spec", &id, input.expected_revision, doc.revision)?;
                let spec: Entity<Spec> = parse(&doc)?;
                if !spec.data.hold {
                    return Err(Refusal::new(
                        "spec-not-held",
                        "hold the spec first (hold: true): its replicas stop, then it can be deleted",
                    )
                    .with_data(json!({ "id": id })));
                }
                // the pair's slots, counted from their documents (the slots read the spec's types)
                let by_service = tx.find_all(RUNTIME_SLOTS, "by_service", &[json!(service.id)]).await?;
                let slots: Vec<_> = by_service.iter().filter(|d| d.data["clusterId"] == input.cluster_id.as_str()).collect();
                if !slots.is_empty() {
                    return Err(Refusal::new(
                        "slots-not-settled",
                        format!("{} replica slot(s) of this spec are not removed yet; delete again once they are", slots.len()),
                    )
                    .with_data(json!({ "id": id, "slots": slots.len() })));
                }
                tx.delete(RUNTIME_SPECS, &id, doc.revision).await?;
                if let Some(status) = tx.get(RUNTIME_STATUS, &id).await? {
                    tx.delete(RUNTIME_STATUS, &id, status.revision).await?;
                }
                emit(&tx, "runtime.spec-deleted", &service.id, json!({ "clusterId": input.cluster_id })).await?;
                Ok(Deleted { id })
            }
        })
        .await
}

/// Whether a service still has slots anywhere (its deletion waits for them).
pub async fn has_slots(tx: &Tx, service_id: &str) -> Result<bool> {
    Ok(!tx.find(RUNTIME_SLOTS, "by_service", &[json!(service_id)], None, 1).await?.documents.is_empty())
}

/// Register the spec methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "runtime.setServiceSpec",
            "Write what runs of a service on one cluster: placement, replicas per node, hold, restart policy, health check (owner)",
            Access::Owner,
            set,
        )
        .refuses(&[
            "service-not-found",
            "service-deleting",
            "cluster-not-found",
            "cluster-runtime-missing",
            "cluster-runtime-phase-refused",
            "node-not-in-cluster",
            "replica-limit",
            "health-port-undeclared",
            "conflict",
        ]);
    registry
        .add("runtime.getServiceSpec", "A service's runtime specs, or the one of a cluster (member)", Access::Member, get)
        .refuses(&["service-not-found", "spec-not-found"])
        .read_only();
    registry
        .add("runtime.deleteServiceSpec", "Remove a held runtime spec whose replicas are all removed (owner)", Access::Owner, delete)
        .refuses(&["service-not-found", "spec-not-found", "conflict", "spec-not-held", "slots-not-settled"]);
}
