//! A service's databases and buckets on its node's storage endpoint (docs/bindings.md;
//! contract 0.3.6, capability `storage`). The host provisions a binding with the provider's
//! admin credential and publishes the binding's own credentials as the service's secrets
//! (`DATABASE_URL` and `PG*` for PostgreSQL; `S3_*` for object storage); the plugin sees
//! neither, only what a binding is and the names of its secrets.
//!
//! ```no_run
//! use capstan_sdk::storage::{self, Binding, Kind};
//!
//! # fn demo() -> capstan_sdk::Result<()> {
//! let binding = Binding {
//!     binding_id: "bnd_7c1e".into(),
//!     service_id: "svc_web".into(),
//!     node_id: "node_a".into(),
//!     kind: Kind::Database,
//!     engine: "postgresql".into(),
//! };
//! let done = storage::provision(&binding)?; // idempotent: call it again after a crash
//! assert!(done.secret_keys.contains(&"DATABASE_URL".to_string()));
//! storage::revoke(&binding)?; // its credentials stop working at once
//! storage::destroy(&binding)?; // and its data goes
//! # Ok(()) }
//! ```

use crate::Result;
use crate::bindings::capstan::plugin::storage as wit;

/// What a binding gives a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A PostgreSQL role and a database of the same name, owned by it.
    Database,
    /// A bucket of the node's S3 endpoint and a key pair limited to it.
    ObjectStorage,
}

/// One binding: the provider's names derive from its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// 1–40 characters of a-z, 0-9 and `_`, starting with a letter.
    pub binding_id: String,
    /// The service whose secrets receive its credentials.
    pub service_id: String,
    /// The node whose storage endpoint provides it.
    pub node_id: String,
    /// What it gives.
    pub kind: Kind,
    /// `postgresql` or `s3`.
    pub engine: String,
}

/// A provisioned binding, value-free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provisioned {
    /// Where the workload reaches it (`host:port`, an S3 origin).
    pub endpoint: String,
    /// The database (= its role) or the bucket.
    pub name: String,
    /// The service's secrets holding its credentials, by key.
    pub secret_keys: Vec<String>,
}

fn to_wit(b: &Binding) -> wit::Binding {
    wit::Binding {
        binding_id: b.binding_id.clone(),
        service_id: b.service_id.clone(),
        node_id: b.node_id.clone(),
        kind: match b.kind {
            Kind::Database => wit::Kind::Database,
            Kind::ObjectStorage => wit::Kind::ObjectStorage,
        },
        engine: b.engine.clone(),
    }
}

/// The storage endpoints node `node_id` states, value-free: `{nodeId, clusterId, revision?,
/// database?: {engine, host, port, user}, objectStorage?: {endpoint, region}}`.
pub fn node_endpoints(node_id: &str) -> Result<serde_json::Value> {
    let text = wit::node_endpoints(node_id)?;
    serde_json::from_str(&text).map_err(|e| crate::Refusal::internal(format!("the host answered endpoints that do not read: {e}")))
}

/// Make the binding true and its credentials the service's secrets; idempotent and resumable.
/// Refused `database-endpoint-missing`, `objectstorage-endpoint-missing`,
/// `binding-engine-unsupported`, `binding-environment-conflict`, the provider's own
/// (`database-endpoint-unreachable`, retryable, …); not from a read-only method.
pub fn provision(binding: &Binding) -> Result<Provisioned> {
    let done = wit::provision(&to_wit(binding))?;
    Ok(Provisioned { endpoint: done.endpoint, name: done.name, secret_keys: done.secret_keys })
}

/// The binding's credentials stop working at once (its secrets revoked, the provider's login
/// disabled, its sessions ended); its data stays. Idempotent.
pub fn revoke(binding: &Binding) -> Result<()> {
    Ok(wit::revoke(&to_wit(binding))?)
}

/// The binding's data goes (revoked first). Idempotent.
pub fn destroy(binding: &Binding) -> Result<()> {
    Ok(wit::destroy(&to_wit(binding))?)
}
