//! The platform inventory every manager reads and the operator edits: organizations and
//! their memberships, clusters (with their machine user and runtime phase), services,
//! deployment grants and the public settings document.
//!
//! Every write states the revision it read and commits its domain event to the outbox
//! (`crate::events`) in the same transaction, so a consumer never sees a change without its
//! event or an event without its change. Who may do what is decided in [`access`] alone.

pub mod access;
pub mod clusters;
pub mod grants;
pub mod organizations;
pub mod services;
pub mod settings;
pub mod validate;

#[cfg(test)]
pub(crate) mod tests;

use crate::refusal::{Refusal, Result};
use crate::store::{CollectionSpec, Document, Store, Tx};
use capstan_rpc::Registry;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const ORGANIZATIONS: &str = "organizations";
pub const MEMBERS: &str = "organization_members";
pub const CLUSTERS: &str = "clusters";
pub const CLUSTER_RUNTIMES: &str = "cluster_runtimes";
/// Which machine user was minted with which cluster: the only user a cluster deletion removes.
pub const CLUSTER_IDENTITIES: &str = "cluster_identities";
/// Nodes enrolled into clusters (written by enrollment; read here to guard cluster deletion).
pub const CLUSTER_NODES: &str = "cluster_nodes";
pub const SERVICES: &str = "services";
/// What a manager still owns of a service; a deleting service is finished once none is left.
pub const SERVICE_HOLDS: &str = "service_holds";
pub const SERVICE_GRANTS: &str = "service_grants";
pub const SETTINGS: &str = "settings";

/// Largest page a list method answers.
pub const MAX_PAGE: usize = 200;
const DEFAULT_PAGE: usize = 50;

pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(ORGANIZATIONS).unique("by_name", &["name"]),
        CollectionSpec::new(MEMBERS).index("by_user", &["userId"]).index("by_organization", &["organizationId"]),
        CollectionSpec::new(CLUSTERS).unique("by_name", &["name"]),
        CollectionSpec::new(CLUSTER_RUNTIMES),
        CollectionSpec::new(CLUSTER_IDENTITIES).unique("by_user", &["userId"]),
        CollectionSpec::new(CLUSTER_NODES).index("by_cluster", &["clusterId"]),
        CollectionSpec::new(SERVICES)
            .unique("by_organization_name", &["organizationId", "name"])
            .index("by_organization", &["organizationId"])
            .index("by_state", &["state"]),
        CollectionSpec::new(SERVICE_HOLDS).index("by_service", &["serviceId"]),
        CollectionSpec::new(SERVICE_GRANTS).index("by_service", &["serviceId"]).index("by_user", &["userId"]),
        CollectionSpec::new(SETTINGS),
        CollectionSpec::new(grants::DEPLOYERS),
    ]
}

/// Declare the inventory's collections (and the outbox its writes append to).
pub async fn declare(store: &Store) -> Result<()> {
    crate::events::declare(store).await?;
    for spec in collections() {
        store.declare(spec).await?;
    }
    Ok(())
}

/// What the inventory's methods reach: the store, and the blobs where new user ids are claimed.
#[derive(Clone)]
pub struct Context {
    pub store: Store,
    pub blobs: crate::blobs::Blobs,
}

pub fn register(registry: &mut Registry, cx: Context) {
    organizations::register(registry, cx.clone());
    clusters::register(registry, cx.clone());
    services::register(registry, cx.clone());
    grants::register(registry, cx.clone());
    settings::register(registry, cx);
}

/// An inventory document as the API answers it: its id, revision and fields.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Entity<T> {
    pub id: String,
    pub revision: u64,
    #[serde(flatten)]
    pub data: T,
}

/// One page of a list.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Listing<T> {
    pub items: Vec<T>,
    /// Pass back as `cursor` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The paging part of a list request.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PageInput {
    pub cursor: Option<String>,
    /// At most 200 (default 50).
    pub limit: Option<usize>,
}

impl PageInput {
    pub fn limit(&self) -> usize {
        page_limit(self.limit)
    }
}

/// The page size a list answers for a requested `limit`.
pub fn page_limit(limit: Option<usize>) -> usize {
    limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE)
}

/// A request naming one entity by id.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ById {
    pub id: String,
}

pub fn parse<T: DeserializeOwned>(doc: &Document) -> Result<Entity<T>> {
    let data = serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("stored {} is malformed: {e}", doc.id)))?;
    Ok(Entity { id: doc.id.clone(), revision: doc.revision, data })
}

pub fn to_value<T: Serialize>(value: &T) -> Result<Value> {
    serde_json::to_value(value).map_err(Refusal::internal)
}

/// `<kind>-not-found` (HTTP 404) naming what was asked for.
pub fn not_found(kind: &str, id: &str) -> Refusal {
    let shown: String = id.chars().take(100).collect();
    Refusal::new(format!("{kind}-not-found"), format!("there is no {kind} {shown:?}")).with_data(serde_json::json!({ "id": shown }))
}

/// Read one entity or refuse `<kind>-not-found`. Ids that cannot be stored cannot exist either.
pub async fn require<T: DeserializeOwned>(tx: &Tx, collection: &str, kind: &str, id: &str) -> Result<Entity<T>> {
    if crate::store::validate_id(id).is_err() {
        return Err(not_found(kind, id));
    }
    match tx.get(collection, id).await? {
        Some(doc) => parse(&doc),
        None => Err(not_found(kind, id)),
    }
}

/// The revision check every write makes: `conflict` (HTTP 409) naming both revisions.
pub fn check_revision(kind: &str, id: &str, expected: u64, actual: u64) -> Result<()> {
    if expected == actual {
        return Ok(());
    }
    Err(Refusal::new("conflict", format!("the {kind} {id} is at revision {actual}, not {expected}: read it again"))
        .with_data(serde_json::json!({ "id": id, "expectedRevision": expected, "revision": actual })))
}

/// Append this change's event in the writing transaction.
pub async fn emit(tx: &Tx, kind: &str, subject: &str, data: Value) -> Result<()> {
    crate::events::append(tx, kind, subject, data, "host").await.map(drop)
}
