//! A storage binding as the host names it between the plugin host's `storage` import and the
//! providers that make it (`capstan-storage`; docs/bindings.md): pure, so both sides speak the
//! same words without depending on each other.

/// What a binding gives a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindingKind {
    /// A PostgreSQL role and a database of the same name, owned by it.
    Database,
    /// A bucket and a key pair limited to it.
    ObjectStorage,
}

/// One binding, as a manager names it: the provider's names derive from its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageBinding {
    /// 1–40 of a-z, 0-9 and `_`, starting with a letter.
    pub binding_id: String,
    /// The service whose secrets receive its credentials.
    pub service_id: String,
    /// The node whose storage endpoint provides it.
    pub node_id: String,
    /// What it gives.
    pub kind: BindingKind,
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
