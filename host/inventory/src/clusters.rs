//! Clusters, the machine user each is minted with, and its runtime phase (`clusters.*`).
//!
//! The phase lives in a record of its own (`cluster_runtimes`) because a cluster update merges
//! caller data and no caller may move a phase with it; every phase write advances a generation
//! so a caller states which reading it acted on.

use super::Context;
use super::{
    CLUSTER_IDENTITIES, CLUSTER_NODES, CLUSTER_RUNTIMES, CLUSTERS, Entity, Listing, PageInput, check_revision, emit, not_found, parse,
    require, to_value, validate,
};
use capstan_auth as auth;
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::Tx;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// A cluster of nodes, with the machine user its agents authenticate as.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    /// 1–63 of a-z 0-9 -, starting with a letter; unique.
    pub name: String,
    /// The machine user minted with the cluster; its agents authenticate as it. Capstan owns
    /// this pointer: no update changes it.
    pub machine_user_id: String,
    /// Free text of at most 1024 bytes (no control characters but line breaks and tabs); empty
    /// when none was given.
    #[serde(default)]
    pub description: String,
    /// Labels by key: at most 64; keys 1–63 of A-Z a-z 0-9 - _ . /, values at most 256 bytes
    /// without control characters.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// When it was created (milliseconds since the epoch).
    pub created_at: u64,
    /// When its name, description or labels last changed (milliseconds since the epoch).
    pub updated_at: u64,
    /// Its relay: off until an administrator enables it (`clusters.enableRelay`); Capstan
    /// mints the origin, and no update writes it.
    #[serde(default)]
    pub relay: Relay,
    /// The records managers keep on it, by plugin id (`inventory.set-facet`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facets: crate::facets::Facets,
}

/// A cluster's relay as Capstan minted it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Relay {
    /// Whether an administrator enabled the relay.
    pub enabled: bool,
    /// `https://relay.<cluster id as a DNS label>.<clusterRelayZone>:8443` while enabled.
    pub origin: Option<String>,
}

/// The origin a cluster's relay is reached under: `https://relay.<label>.<zone>:8443`, the
/// label being the cluster id with its `_` written `-` (a host name holds no `_`). The port is
/// named because the relay binds its own TLS listener there.
pub fn relay_origin(cluster_id: &str, zone: &str) -> Result<String> {
    let label = cluster_id.replace('_', "-").to_ascii_lowercase();
    let host = format!("relay.{label}.{zone}");
    if !super::settings::is_zone(&host) {
        return Err(Refusal::new("relay-origin-invalid", format!("no relay origin can be minted for the cluster {cluster_id}"))
            .with_data(json!({ "clusterId": cluster_id })));
    }
    Ok(format!("https://{host}:8443"))
}

/// Accepts a key whatever it holds, `null` included, so its presence alone is judged.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// Which runtime owns a cluster's workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// The Swarm-era runtime owns it.
    Swarm,
    /// Every service is stopped; volumes stay.
    Draining,
    /// Nodes join the new runtime network while nothing runs.
    Switching,
    /// The node runtime alone owns it (every new cluster starts here).
    Pallet,
}

/// A cluster's runtime phase, kept in a record of its own.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Runtime {
    /// Which runtime owns the cluster's workloads.
    pub phase: Phase,
    /// Advances on every phase write.
    pub generation: u64,
    /// When the phase was last written (milliseconds since the epoch).
    pub updated_at: u64,
    /// The user id of whoever last wrote the phase.
    pub updated_by: String,
}

/// Input of `clusters.create`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateInput {
    /// 1–63 of a-z 0-9 -, starting with a letter; unique.
    pub name: String,
    /// Free text of at most 1024 bytes (no control characters but line breaks and tabs).
    pub description: Option<String>,
    /// Labels by key: at most 64; keys 1–63 of A-Z a-z 0-9 - _ . /, values at most 256 bytes
    /// without control characters.
    pub labels: Option<BTreeMap<String, String>>,
}

/// Input of `clusters.update`; absent fields stay as stored.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpdateInput {
    /// The cluster's id.
    pub id: String,
    /// The revision the caller read; any other current revision is refused `conflict`.
    pub expected_revision: u64,
    /// A new name: 1–63 of a-z 0-9 -, starting with a letter; unique.
    pub name: Option<String>,
    /// A new description: at most 1024 bytes (no control characters but line breaks and tabs).
    pub description: Option<String>,
    /// Replaces the labels whole.
    pub labels: Option<BTreeMap<String, String>>,
    /// Accepted only when it echoes the stored pointer; it is never written.
    pub machine_user_id: Option<String>,
    /// Never accepted here: use `clusters.setRuntimePhase`.
    #[schemars(skip)]
    pub phase: Option<Value>,
    /// Never accepted here, not even as an echo: use `clusters.enableRelay` / `clusters.disableRelay`.
    #[schemars(skip)]
    #[serde(default, deserialize_with = "present")]
    pub relay: Option<Value>,
}

/// Input of `clusters.enableRelay` and `clusters.disableRelay`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RelayInput {
    /// The cluster's id.
    pub id: String,
    /// The revision the caller read; any other current revision is refused `conflict`.
    pub expected_revision: u64,
}

/// Input of `clusters.delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeleteInput {
    /// The cluster's id.
    pub id: String,
    /// The revision the caller read; any other current revision is refused `conflict`.
    pub expected_revision: u64,
}

/// Input of `clusters.setRuntimePhase`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SetPhaseInput {
    /// The cluster's id.
    pub id: String,
    /// The phase to move to.
    pub phase: Phase,
    /// The generation the caller read (`clusters.getRuntime`).
    pub expected_generation: u64,
}

/// The machine user minted with a new cluster.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MintedUser {
    /// The machine user's id.
    pub user_id: String,
    /// The machine user's username: `cluster-<cluster name>`.
    pub username: String,
    /// Shown this once; Capstan keeps only its SHA-256.
    pub token: String,
}

/// Answer of `clusters.create`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    /// The new cluster.
    pub cluster: Entity<Cluster>,
    /// Its runtime phase: `pallet`, generation 1.
    pub runtime: RuntimeView,
    /// Its machine user, with the token shown this once.
    pub machine_user: MintedUser,
}

/// A cluster's runtime phase as the `clusters.*` methods answer it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeView {
    /// The cluster's id.
    pub cluster_id: String,
    /// The phase, its generation and who wrote it last.
    #[serde(flatten)]
    pub runtime: Runtime,
}

/// Answer of `clusters.delete`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    /// The deleted cluster's id.
    pub id: String,
    /// Always true: the cluster, its machine user and its runtime phase are gone.
    pub deleted: bool,
    /// The machine user removed with it.
    pub machine_user_id: String,
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<()> {
    if labels.len() > 64 {
        return Err(Refusal::new("labels-invalid", "at most 64 labels").with_data(json!({ "field": "labels" })));
    }
    for (key, value) in labels {
        let key_ok = !key.is_empty() && key.len() <= 63 && key.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
        if !key_ok || value.len() > 256 || value.chars().any(char::is_control) {
            return Err(Refusal::new("labels-invalid", "label keys are 1–63 of A-Z a-z 0-9 - _ . /; values at most 256 printable bytes")
                .with_data(json!({ "field": "labels" })));
        }
    }
    Ok(())
}

fn check_description(description: &str) -> Result<()> {
    if description.len() > 1024 || description.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t')) {
        return Err(invalid_field(
            "description",
            "a description is at most 1024 bytes of text (no control characters but line breaks and tabs)",
        ));
    }
    Ok(())
}

fn invalid_field(field: &str, message: &str) -> Refusal {
    Refusal::invalid_request(message).with_data(json!({ "field": field }))
}

/// Read a cluster or refuse `cluster-not-found`.
pub async fn require_cluster(tx: &Tx, id: &str) -> Result<Entity<Cluster>> {
    require(tx, CLUSTERS, "cluster", id).await
}

async fn require_runtime(tx: &Tx, id: &str) -> Result<Entity<Runtime>> {
    match tx.get(CLUSTER_RUNTIMES, id).await? {
        Some(doc) => parse(&doc),
        // never assume who owns a cluster Capstan stated no phase for
        None => Err(Refusal::new("cluster-runtime-missing", format!("the cluster {id} has no runtime phase on record"))),
    }
}

async fn name_taken(tx: &Tx, name: &str) -> Result<bool> {
    Ok(!tx.find(CLUSTERS, "by_name", &[json!(name)], None, 1).await?.documents.is_empty())
}

async fn create(cx: Context, call: Call, input: CreateInput) -> Result<Created> {
    let identity = call.identity()?.clone();
    validate::name("name", &input.name)?;
    let labels = input.labels.clone().unwrap_or_default();
    check_labels(&labels)?;
    let description = input.description.clone().unwrap_or_default();
    check_description(&description)?;
    let id = capstan_core::ids::new_id("cluster");
    let username = format!("cluster-{}", input.name);
    let at = now_ms();
    let runtime = Runtime { phase: Phase::Pallet, generation: 1, updated_at: at, updated_by: identity.user_id.clone() };
    let (id_ref, runtime_ref, name, labels, description) = (&id, &runtime, &input.name, &labels, &description);
    // the cluster, its machine user and its phase: one transaction
    let (minted, doc) = capstan_auth::methods::mint_machine_user(&cx.store, &cx.blobs, &username, None, |tx, user_id| {
        Box::pin(async move {
            if name_taken(&tx, name).await? {
                return Err(Refusal::new("exists", format!("a cluster named {name} exists")).with_data(json!({ "field": "name" })));
            }
            let cluster = Cluster {
                name: name.clone(),
                machine_user_id: user_id.clone(),
                description: description.clone(),
                labels: labels.clone(),
                created_at: at,
                updated_at: at,
                relay: Relay::default(),
                facets: Default::default(),
            };
            tx.insert(CLUSTER_IDENTITIES, id_ref, json!({ "userId": user_id })).await?;
            tx.insert(CLUSTER_RUNTIMES, id_ref, to_value(runtime_ref)?).await?;
            let doc = tx.insert(CLUSTERS, id_ref, to_value(&cluster)?).await?;
            emit(&tx, "cluster.created", id_ref, json!({ "id": id_ref, "name": name, "phase": runtime_ref.phase })).await?;
            Ok(doc)
        })
    })
    .await?;
    tracing::info!(cluster = %id, name = %input.name, machine_user = %username, "cluster created");
    Ok(Created {
        cluster: parse(&doc)?,
        runtime: RuntimeView { cluster_id: id, runtime },
        machine_user: MintedUser { user_id: minted.user_id, username: minted.username, token: minted.token },
    })
}

async fn list(cx: Context, _: Call, input: PageInput) -> Result<Listing<Entity<Cluster>>> {
    let limit = input.limit();
    let cursor = input.cursor.as_deref();
    cx.store
        .transact(|tx| async move {
            let page = tx.scan(CLUSTERS, cursor, limit).await?;
            Ok(Listing { items: page.documents.iter().map(parse).collect::<Result<_>>()?, next_cursor: page.next_cursor })
        })
        .await
}

async fn get(cx: Context, _: Call, input: super::ById) -> Result<Entity<Cluster>> {
    let id = input.id.as_str();
    cx.store.transact(|tx| async move { require_cluster(&tx, id).await }).await
}

async fn update(cx: Context, _: Call, input: UpdateInput) -> Result<Entity<Cluster>> {
    if input.relay.is_some() {
        return Err(Refusal::new(
            "cluster-relay-not-writable",
            "a cluster update never carries its relay: use clusters.enableRelay or clusters.disableRelay",
        )
        .with_data(json!({ "field": "relay" })));
    }
    if input.phase.is_some() {
        return Err(Refusal::new("cluster-phase-not-writable", "a cluster update never moves its phase: use clusters.setRuntimePhase")
            .with_data(json!({ "field": "phase" })));
    }
    if let Some(name) = &input.name {
        validate::name("name", name)?;
    }
    if let Some(labels) = &input.labels {
        check_labels(labels)?;
    }
    if let Some(description) = &input.description {
        check_description(description)?;
    }
    let input = &input;
    cx.store
        .transact(|tx| async move {
            let current = require_cluster(&tx, &input.id).await?;
            check_revision("cluster", &input.id, input.expected_revision, current.revision)?;
            if let Some(pointer) = &input.machine_user_id
                && *pointer != current.data.machine_user_id
            {
                return Err(Refusal::new(
                    "cluster-user-immutable",
                    "the cluster's machine user is Capstan's to set; an update may only echo it",
                )
                .with_data(json!({ "field": "machineUserId" })));
            }
            let mut next = current.data.clone();
            if let Some(name) = &input.name
                && *name != next.name
            {
                if name_taken(&tx, name).await? {
                    return Err(Refusal::new("exists", format!("a cluster named {name} exists")).with_data(json!({ "field": "name" })));
                }
                next.name = name.clone();
            }
            if let Some(description) = &input.description {
                next.description = description.clone();
            }
            if let Some(labels) = &input.labels {
                next.labels = labels.clone();
            }
            if to_value(&next)? == to_value(&current.data)? {
                return Ok(current);
            }
            next.updated_at = now_ms();
            let doc = tx.replace(CLUSTERS, &input.id, current.revision, to_value(&next)?).await?;
            emit(&tx, "cluster.updated", &input.id, json!({ "id": input.id, "name": next.name })).await?;
            parse(&doc)
        })
        .await
}

async fn delete(cx: Context, _: Call, input: DeleteInput) -> Result<Deleted> {
    let (input, dependents) = (&input, &*cx.dependents);
    let deleted = cx
        .store
        .transact(|tx| async move {
            let cluster = require_cluster(&tx, &input.id).await?;
            check_revision("cluster", &input.id, input.expected_revision, cluster.revision)?;
            if let Some(refusal) = dependents.cluster_blocker(&tx, &input.id, &cluster.data.name).await? {
                return Err(refusal);
            }
            let nodes = tx.find(CLUSTER_NODES, "by_cluster", &[json!(input.id)], None, 1).await?;
            if !nodes.documents.is_empty() {
                return Err(Refusal::new(
                    "cluster-has-nodes",
                    format!("nodes still belong to the cluster {}: retire and delete them first", cluster.data.name),
                ));
            }
            // only the user minted with this cluster is removed; anything else refuses the whole deletion
            let pointer = &cluster.data.machine_user_id;
            let minted = tx.get(CLUSTER_IDENTITIES, &input.id).await?.and_then(|d| d.data["userId"].as_str().map(str::to_string));
            let user = tx.get(auth::USERS, pointer).await?;
            let is_minted_machine =
                minted.as_deref() == Some(pointer.as_str()) && user.as_ref().is_some_and(|u| u.data["kind"] == "machine");
            if !is_minted_machine {
                return Err(Refusal::new(
                    "cluster-user-not-machine",
                    format!(
                        "the cluster {} names a user that is not the machine user minted with it; nothing was deleted",
                        cluster.data.name
                    ),
                ));
            }
            auth::revoke_sessions(&tx, pointer).await?;
            if let Some(user) = user {
                tx.delete(auth::USERS, pointer, user.revision).await?;
            }
            if let Some(credential) = tx.get(auth::CREDENTIALS, pointer).await? {
                tx.delete(auth::CREDENTIALS, pointer, credential.revision).await?;
            }
            delete_if_present(&tx, CLUSTER_IDENTITIES, &input.id).await?;
            delete_if_present(&tx, CLUSTER_RUNTIMES, &input.id).await?;
            dependents.cluster_removed(&tx, &input.id).await?;
            tx.delete(CLUSTERS, &input.id, cluster.revision).await?;
            emit(&tx, "cluster.deleted", &input.id, json!({ "id": input.id, "name": cluster.data.name })).await?;
            Ok(Deleted { id: input.id.clone(), deleted: true, machine_user_id: pointer.clone() })
        })
        .await?;
    tracing::info!(cluster = %deleted.id, machine_user = %deleted.machine_user_id, "cluster deleted");
    Ok(deleted)
}

async fn delete_if_present(tx: &Tx, collection: &str, id: &str) -> Result<()> {
    if let Some(doc) = tx.get(collection, id).await? {
        tx.delete(collection, id, doc.revision).await?;
    }
    Ok(())
}

async fn get_runtime(cx: Context, _: Call, input: super::ById) -> Result<RuntimeView> {
    let id = input.id.as_str();
    cx.store
        .transact(|tx| async move {
            require_cluster(&tx, id).await?;
            let runtime = require_runtime(&tx, id).await?;
            Ok(RuntimeView { cluster_id: id.into(), runtime: runtime.data })
        })
        .await
}

async fn set_phase(cx: Context, call: Call, input: SetPhaseInput) -> Result<RuntimeView> {
    let identity = call.identity()?.clone();
    let (identity, input) = (&identity, &input);
    let view = cx
        .store
        .transact(|tx| async move {
            require_cluster(&tx, &input.id).await?;
            let current = require_runtime(&tx, &input.id).await?;
            if current.data.generation != input.expected_generation {
                return Err(Refusal::new(
                    "conflict",
                    format!(
                        "the cluster runtime is at generation {}, not {}: read it again",
                        current.data.generation, input.expected_generation
                    ),
                )
                .with_data(json!({ "generation": current.data.generation, "phase": current.data.phase })));
            }
            if current.data.phase == input.phase {
                return Ok(RuntimeView { cluster_id: input.id.clone(), runtime: current.data });
            }
            let next = Runtime {
                phase: input.phase,
                generation: current.data.generation + 1,
                updated_at: now_ms(),
                updated_by: identity.user_id.clone(),
            };
            tx.replace(CLUSTER_RUNTIMES, &input.id, current.revision, to_value(&next)?).await?;
            emit(
                &tx,
                "cluster.runtimePhaseChanged",
                &input.id,
                json!({ "id": input.id, "from": current.data.phase, "phase": next.phase, "generation": next.generation }),
            )
            .await?;
            Ok(RuntimeView { cluster_id: input.id.clone(), runtime: next })
        })
        .await?;
    tracing::info!(cluster = %view.cluster_id, phase = ?view.runtime.phase, generation = view.runtime.generation, "cluster runtime phase set");
    Ok(view)
}

/// Enable or disable a cluster's relay at the revision the caller read.
async fn set_relay(cx: &Context, input: &RelayInput, enable: bool) -> Result<Entity<Cluster>> {
    let entity = cx
        .store
        .transact(|tx| async move {
            let current = require_cluster(&tx, &input.id).await?;
            check_revision("cluster", &input.id, input.expected_revision, current.revision)?;
            let relay = if enable {
                let Some(zone) = super::settings::relay_zone(&tx).await? else {
                    return Err(Refusal::new(
                        "relay-zone-unset",
                        format!("no relay origin can be minted: set the {} setting first", super::settings::CLUSTER_RELAY_ZONE),
                    )
                    .with_data(json!({ "setting": super::settings::CLUSTER_RELAY_ZONE })));
                };
                Relay { enabled: true, origin: Some(relay_origin(&input.id, &zone)?) }
            } else {
                Relay::default()
            };
            if relay == current.data.relay {
                return Ok(current);
            }
            let mut next = current.data.clone();
            next.relay = relay;
            next.updated_at = now_ms();
            let doc = tx.replace(CLUSTERS, &input.id, current.revision, to_value(&next)?).await?;
            let (kind, data) = match &next.relay.origin {
                Some(origin) => ("cluster.relayEnabled", json!({ "id": input.id, "origin": origin })),
                None => ("cluster.relayDisabled", json!({ "id": input.id })),
            };
            emit(&tx, kind, &input.id, data).await?;
            parse(&doc)
        })
        .await?;
    tracing::info!(cluster = %entity.id, enabled = entity.data.relay.enabled, "cluster relay set");
    Ok(entity)
}

async fn enable_relay(cx: Context, _: Call, input: RelayInput) -> Result<Entity<Cluster>> {
    set_relay(&cx, &input, true).await
}

async fn disable_relay(cx: Context, _: Call, input: RelayInput) -> Result<Entity<Cluster>> {
    set_relay(&cx, &input, false).await
}

/// A cluster id that must exist, for other inventory writes that reference one.
pub async fn require_exists(tx: &Tx, id: &str) -> Result<()> {
    if tx.get(CLUSTERS, id).await?.is_none() {
        return Err(not_found("cluster", id));
    }
    Ok(())
}

/// Register the `clusters.*` methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "clusters.create",
            "Create a cluster with its machine user (token shown once) and runtime phase pallet, in one transaction",
            Access::Admin,
            create,
        )
        .refuses(&["name-invalid", "labels-invalid", "exists", "blobs-unavailable", "identity-claimed"]);
    registry.add("clusters.list", "Clusters, paged", Access::Admin, list).read_only();
    registry
        .add("clusters.get", "One cluster (never its machine user's token)", Access::Admin, get)
        .refuses(&["cluster-not-found"])
        .read_only();
    registry
        .add(
            "clusters.update",
            "Change a cluster's name, description or labels with its expected revision; the machine user and phase never move here",
            Access::Admin,
            update,
        )
        .refuses(&[
            "cluster-relay-not-writable",
            "cluster-phase-not-writable",
            "name-invalid",
            "labels-invalid",
            "cluster-not-found",
            "conflict",
            "cluster-user-immutable",
            "exists",
        ]);
    registry
        .add("clusters.delete", "Delete a cluster with its machine user and phase; refused while nodes belong to it", Access::Admin, delete)
        .refuses(&["cluster-not-found", "conflict", "cluster-relay-live", "cluster-has-nodes", "cluster-user-not-machine"]);
    registry
        .add(
            "clusters.enableRelay",
            "Enable a cluster's relay with its expected revision; the origin is minted from the clusterRelayZone setting",
            Access::Admin,
            enable_relay,
        )
        .refuses(&["cluster-not-found", "conflict", "relay-zone-unset", "relay-origin-invalid"]);
    registry
        .add("clusters.disableRelay", "Disable a cluster's relay with its expected revision", Access::Admin, disable_relay)
        .refuses(&["cluster-not-found", "conflict"]);
    registry
        .add("clusters.getRuntime", "A cluster's runtime phase and generation", Access::Admin, get_runtime)
        .refuses(&["cluster-not-found", "cluster-runtime-missing"])
        .read_only();
    registry
        .add(
            "clusters.setRuntimePhase",
            "Move a cluster's runtime phase (swarm, draining, switching, pallet) with the generation the caller read",
            Access::Admin,
            set_phase,
        )
        .refuses(&["cluster-not-found", "cluster-runtime-missing", "conflict"]);
}
