//! The platform inventory every manager reads and the operator edits: organizations and
//! their memberships, clusters (with their machine user and runtime phase), services,
//! deployment grants and the public settings document.
//!
//! Every write states the revision it read and commits its domain event to the outbox
//! (`capstan_events`) in the same transaction, so a consumer never sees a change without its
//! event or an event without its change. Who may do what is decided in [`access`] alone.

pub mod access;
pub mod clusters;
pub mod facets;
pub mod grants;
pub mod organizations;
pub mod services;
pub mod settings;

/// The field rules every write here applies (`capstan-field-rules`, shared with the catalog
/// publisher's tool).
pub use capstan_field_rules::validate;

use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::Registry;
use capstan_store::{CollectionSpec, Document, Store, Tx};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// Organizations.
pub const ORGANIZATIONS: &str = "organizations";
/// Organization memberships, one per organization and user (id `<organization>~<user>`).
pub const MEMBERS: &str = "organization_members";
/// Clusters.
pub const CLUSTERS: &str = "clusters";
/// Each cluster's runtime phase and generation, keyed by cluster id.
pub const CLUSTER_RUNTIMES: &str = "cluster_runtimes";
/// Which machine user was minted with which cluster: the only user a cluster deletion removes.
pub const CLUSTER_IDENTITIES: &str = "cluster_identities";
/// Nodes enrolled into clusters (written by enrollment; read here to guard cluster deletion).
pub const CLUSTER_NODES: &str = "cluster_nodes";
/// Services.
pub const SERVICES: &str = "services";
/// What a manager still owns of a service; a deleting service is finished once none is left.
pub const SERVICE_HOLDS: &str = "service_holds";
/// Deployers' grants on services, one per service and user (id `<service>~<user>`).
pub const SERVICE_GRANTS: &str = "service_grants";
/// The settings document ([`settings::PUBLIC`]).
pub const SETTINGS: &str = "settings";

/// Largest page a list method answers.
pub const MAX_PAGE: usize = 200;
const DEFAULT_PAGE: usize = 50;

/// Every collection the inventory keeps, with its indexes.
pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(ORGANIZATIONS)
            .unique("by_name", &["name"])
            .index("by_identity_provider_organization", &["identityProviderOrganization"]),
        CollectionSpec::new(MEMBERS).index("by_user", &["userId"]).index("by_organization", &["organizationId"]),
        CollectionSpec::new(CLUSTERS).unique("by_name", &["name"]),
        CollectionSpec::new(CLUSTER_RUNTIMES),
        CollectionSpec::new(CLUSTER_IDENTITIES).unique("by_user", &["userId"]),
        CollectionSpec::new(CLUSTER_NODES).index("by_cluster", &["clusterId"]),
        CollectionSpec::new(SERVICES)
            .unique("by_organization_name", &["organizationId", "name"])
            // the registry finds a repository's service by name (`workloads/<name>-<id prefix>`)
            .index("by_name", &["name"])
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
    capstan_events::declare(store).await?;
    for spec in collections() {
        store.declare(spec).await?;
    }
    Ok(())
}

/// What the inventory's methods reach: the store, the blobs where new user ids are claimed, and
/// what other areas keep on inventory entities.
#[derive(Clone)]
pub struct Context {
    /// The store every inventory read and write goes through.
    pub store: Store,
    /// Where a newly minted machine user's id is claimed.
    pub blobs: capstan_blobs::Blobs,
    /// What other areas keep on inventory entities, consulted inside inventory transactions.
    pub dependents: Arc<dyn Dependents>,
    /// The keys mutation receipts (`mutationId` replays) are digested with.
    pub receipts: capstan_rpc::receipts::ReceiptKeys,
}

/// What other areas (secrets, the plugin registry) keep on the inventory's entities. The
/// inventory consults it inside its own transactions, so a deletion and what hangs on the
/// deleted entity commit together; the server supplies it, and the inventory knows no area
/// above it.
#[async_trait::async_trait]
pub trait Dependents: Send + Sync {
    /// Why the organization `organization_id` (named `name`) cannot be deleted yet, if something
    /// another area keeps still needs it (active SecretSets, say).
    async fn organization_blocker(&self, tx: &Tx, organization_id: &str, name: &str) -> Result<Option<Refusal>>;
    /// The service `service_id` is removed for good: drop what hangs on it (its secrets are
    /// revoked, its SecretSet attachments go) in the same transaction.
    async fn service_removed(&self, tx: &Tx, service_id: &str) -> Result<()>;
    /// Whether `holder` (`plugin:<id>`, `host:<name>`) can still act on its hold of a service:
    /// a plugin only while it is installed, so an uninstalled one never blocks a deletion.
    async fn holder_present(&self, tx: &Tx, holder: &str) -> Result<bool>;
    /// Why the cluster `cluster_id` (named `name`) cannot be deleted yet (a live relay).
    async fn cluster_blocker(&self, _tx: &Tx, _cluster_id: &str, _name: &str) -> Result<Option<Refusal>> {
        Ok(None)
    }
    /// The cluster `cluster_id` is deleted: drop what hangs on it (its relay's credential,
    /// registration and secret) in the same transaction.
    async fn cluster_removed(&self, _tx: &Tx, _cluster_id: &str) -> Result<()> {
        Ok(())
    }
    /// Where the service runs: its runtime specs, one per cluster (the runtime's), read in `tx`.
    async fn service_runtime(&self, _tx: &Tx, _service_id: &str) -> Result<Vec<Value>> {
        Ok(Vec::new())
    }
    /// The settings the installed plugins declare (their current versions), read in `tx`.
    async fn plugin_settings(&self, tx: &Tx) -> Result<Vec<PluginSetting>>;
    /// Refuse `value` for the plugin setting `setting` by name (`setting-invalid`,
    /// `setting-is-secret`) unless it matches what the plugin declared.
    fn check_plugin_setting(&self, setting: &PluginSetting, value: &Value) -> Result<()>;
    /// The facet the installed plugin `plugin` declares on `kind` entities, read in `tx`.
    async fn plugin_facet(&self, _tx: &Tx, _plugin: &str, _kind: &str) -> Result<Option<PluginFacet>> {
        Ok(None)
    }
    /// Refuse `value` as `plugin`'s facet of the entity `id` (`facet-invalid`, naming where and
    /// never the value) unless it matches what the plugin declared.
    fn check_plugin_facet(&self, _plugin: &str, _id: &str, _facet: &PluginFacet, _value: &Value) -> Result<()> {
        Err(Refusal::internal("no facet is judged here"))
    }
}

/// A facet an installed plugin declares: the record it keeps on every entity of a kind.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginFacet {
    /// `organization`, `cluster` or `service`.
    pub kind: String,
    /// What the record says.
    pub summary: String,
    /// The JSON Schema its value must match.
    pub schema: Value,
}

/// A setting an installed plugin declares, stored in the settings document as
/// `<plugin>.<key>`.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSetting {
    /// The plugin's id.
    pub plugin: String,
    /// The key within the plugin.
    pub key: String,
    /// What it is for.
    pub summary: String,
    /// The JSON Schema its value must match.
    pub schema: Value,
    /// Its value while none is set.
    pub default: Option<Value>,
}

impl PluginSetting {
    /// Its key in the settings document and the API: `<plugin>.<key>`.
    pub fn full_key(&self) -> String {
        format!("{}.{}", self.plugin, self.key)
    }
}

/// Register every inventory method (`organizations.*`, `clusters.*`, `services.*`,
/// `deployers.*`, `settings.*`).
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
    /// The entity's id.
    pub id: String,
    /// The stored revision; a write sends it back as `expectedRevision`.
    pub revision: u64,
    /// The entity's fields.
    #[serde(flatten)]
    pub data: T,
}

/// One page of a list.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Listing<T> {
    /// The items on this page.
    pub items: Vec<T>,
    /// Pass back as `cursor` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The paging part of a list request.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PageInput {
    /// Where to continue: the `nextCursor` of the previous page; absent for the first page.
    pub cursor: Option<String>,
    /// At most 200 (default 50).
    pub limit: Option<usize>,
}

impl PageInput {
    /// The page size to answer: `limit` clamped to 1–200, 50 when absent.
    pub fn limit(&self) -> usize {
        page_limit(self.limit)
    }
}

/// The page size a list answers for a requested `limit`.
pub fn page_limit(limit: Option<usize>) -> usize {
    limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE)
}

/// No parameters.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// A request naming one entity by id.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ById {
    /// The entity's id.
    pub id: String,
}

/// Read a stored document as an [`Entity`]; a document that does not parse is an internal error.
pub fn parse<T: DeserializeOwned>(doc: &Document) -> Result<Entity<T>> {
    let data = serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("stored {} is malformed: {e}", doc.id)))?;
    Ok(Entity { id: doc.id.clone(), revision: doc.revision, data })
}

/// Turn a value into the JSON the store keeps; a failure is an internal error.
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
    if capstan_store::validate_id(id).is_err() {
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
    capstan_events::append(tx, kind, subject, data, "host").await.map(drop)
}
