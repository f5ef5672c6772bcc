//! What plugins reach of the platform model beyond their own collections and blobs: the
//! inventory's services and settings, organization roles, the secrets of the scopes a plugin
//! was granted, and where services' replicas run. The server implements [`Platform`] over the
//! inventory, the secrets and the runtime, so this crate depends on no domain crate for it.

use crate::refusal::Result;
use crate::store::{Document, Page};
use capstan_rpc::{Identity, OrganizationAuthority};
use serde_json::Value;

/// What an implementation of [`Platform`] (an `async_trait`) is written with, so one outside
/// the host (the SDK's test harness) needs no dependency of its own for it.
pub use async_trait::async_trait;
/// How a secret's value passes through [`Platform::put_secret`] and [`Platform::reveal_secret`].
pub use zeroize::Zeroizing;

/// Who a secret belongs to, as a plugin names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretOwner {
    /// A service, by id.
    Service(String),
    /// An organization, by id (its secrets live in SecretSets; a plugin does not create them).
    Organization(String),
    /// One of the host's integrations, by system id.
    System(String),
}

/// A secret as a plugin sees it: metadata, never a value.
#[derive(Debug, Clone)]
pub struct SecretMeta {
    /// The secret's id.
    pub id: String,
    /// Who it belongs to.
    pub owner: SecretOwner,
    /// Its key.
    pub key: String,
    /// Its management scope.
    pub management_scope: String,
    /// The id of its active version.
    pub active_version: String,
    /// `active` or `revoked`.
    pub state: String,
    /// When it was created (ms since the epoch).
    pub created_at_ms: u64,
    /// When it last took a new version (ms since the epoch), if it has more than one.
    pub rotated_at_ms: Option<u64>,
}

/// What a replica slot's current assignment asks of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaIntent {
    /// Run the service there.
    Run,
    /// Stop it.
    Stop,
    /// Remove its container.
    Remove,
}

/// A replica slot of a service as a plugin reads it (`runtime.service-replicas`): where it
/// stands and what its node last said of it; never what it runs with (environment, pull
/// credentials).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// The cluster.
    pub cluster_id: String,
    /// The node it stands on.
    pub node_id: String,
    /// `<nodeId>.<index>`.
    pub slot: String,
    /// The current assignment (`asg_…`).
    pub assignment_id: String,
    /// What the assignment asks of the node.
    pub intent: ReplicaIntent,
    /// The node's words (`pulling`, `starting`, `running`, `unhealthy`, `exited`, `failed`),
    /// `pending` before it said anything, `stopped`/`removed` once it reported doing so.
    pub phase: String,
    /// Observed ready, and meant to run.
    pub ready: bool,
    /// The image digest the node said it runs.
    pub image_digest: Option<String>,
}

/// The platform as the WIT imports and method dispatch reach it.
#[async_trait::async_trait]
pub trait Platform: OrganizationAuthority {
    /// Whether the host setting `key` lists URLs: such a setting, or one of the plugin's own
    /// that does, may be named in an `http-setting:<key>` grant.
    fn setting_lists_urls(&self, key: &str) -> bool;

    /// The URLs the setting `key` (a host setting, or `<pluginId>.<key>`) names now; `None`
    /// when it is unset.
    async fn setting_urls(&self, key: &str) -> Result<Option<Vec<String>>>;

    /// The identity a plugin acts with outside any caller's request (events, reconcile, tasks):
    /// the authority the operator approved for it at install.
    fn plugin_identity(&self, plugin: &str) -> Identity;

    /// A node of a cluster as `nodes.get` answers it — the record with `live` and `liveness`,
    /// never its credential — if there is one.
    async fn node(&self, id: &str) -> Result<Option<Document>>;

    /// Nodes of every cluster in id order, as `nodes.list` answers them: at most `limit`
    /// after `cursor`.
    async fn nodes(&self, cursor: Option<&str>, limit: usize) -> Result<Page>;

    /// Every replica slot of the service `service_id`, ordered by cluster then slot; empty when
    /// it runs nowhere (or the host runs no services). `service-not-found` when there is no such
    /// service.
    async fn service_replicas(&self, service_id: &str) -> Result<Vec<Replica>>;

    /// The runtime specs of the service `service_id`, by cluster (`runtime.getServiceSpec`'s
    /// items); empty where the host runs no services. `service-not-found` when there is none.
    async fn service_specs(&self, service_id: &str) -> Result<Vec<Document>>;

    /// Where the release `digest` (`sha256:…`) of `service_id` stands on the runtime, as
    /// `deployments.getStatus` judges a promoted release (`{state, clusters}`); `unplaced` where
    /// no spec places it or the host runs no services. `service-not-found` when there is none;
    /// `invalid-request` for a digest that is not `sha256:` and 64 lowercase hex digits.
    async fn service_rollout(&self, service_id: &str, digest: &str) -> Result<Value>;

    /// The digest (`sha256:…`) `service_id`'s image runs as: the one it pins, else the one the
    /// runtime resolved its tag to; `None` while a tag is unresolved (always, for a tag, where
    /// the host runs no services). `service-not-found` when there is none.
    async fn service_image_digest(&self, service_id: &str) -> Result<Option<String>>;

    /// Set a service's runtime spec from `body` (the `runtime.setServiceSpec` input) as
    /// `actor`; the spec as stored. `runtime-unavailable` on a host that runs no services.
    async fn set_service_spec(&self, actor: &Identity, body: Value) -> Result<Document>;

    /// Set (`Some(reason)`) or lift (`None`) `plugin`'s gate on the service's replicas
    /// (docs/runtime.md, "Gates"). Refused `service-not-found`, `invalid-request`.
    async fn set_service_gate(&self, plugin: &str, service_id: &str, waiting: Option<&str>) -> Result<()>;

    /// Create a service from `body` (the `services.create` input) as `actor`.
    async fn create_service(&self, actor: &Identity, body: Value) -> Result<Document>;

    /// Update a service from `body` (the `services.update` input) as `actor`.
    async fn update_service(&self, actor: &Identity, body: Value) -> Result<Document>;

    /// Write (`Some`) or remove (`None`) `plugin`'s facet of the `kind` entity `id`
    /// (`organization`, `cluster`, `service`), judged by the facet the plugin declared; with
    /// `expected_revision`, an entity at another revision is `conflict`.
    async fn set_facet(&self, kind: &str, id: &str, plugin: &str, value: Option<Value>, expected_revision: Option<u64>)
    -> Result<Document>;

    /// Record `holder` as a manager holding the service (its deletion waits for the release).
    async fn hold_service(&self, service_id: &str, holder: &str) -> Result<()>;

    /// Release `holder`'s hold; a service marked for deletion goes once nobody holds it.
    async fn release_service(&self, service_id: &str, holder: &str) -> Result<()>;

    /// The secret of `owner` and `key` in `scope`, created with a value generated as `length`
    /// characters of `alphabet` when there is none, as `actor`.
    async fn ensure_secret(
        &self,
        actor: &Identity,
        scope: &str,
        owner: SecretOwner,
        key: &str,
        length: u32,
        alphabet: &str,
    ) -> Result<SecretMeta>;

    /// The secret of `owner` and `key` in `scope` holding `value` (created, a new version, or
    /// unchanged when it already holds it), as `actor`.
    async fn put_secret(
        &self,
        actor: &Identity,
        scope: &str,
        owner: SecretOwner,
        key: &str,
        value: Zeroizing<Vec<u8>>,
    ) -> Result<SecretMeta>;

    /// A new, generated version of `scope`'s secret `id`, as `actor`.
    async fn rotate_secret(&self, actor: &Identity, scope: &str, id: &str) -> Result<SecretMeta>;

    /// Revoke `scope`'s secret `id`, as `actor`.
    async fn revoke_secret(&self, actor: &Identity, scope: &str, id: &str) -> Result<SecretMeta>;

    /// The secrets of `scope`.
    async fn list_secrets(&self, scope: &str) -> Result<Vec<SecretMeta>>;

    /// The active value of `scope`'s secret `id`, read by `plugin` acting as `actor` (recorded).
    async fn reveal_secret(&self, actor: &Identity, plugin: &str, scope: &str, id: &str) -> Result<Zeroizing<Vec<u8>>>;
}
