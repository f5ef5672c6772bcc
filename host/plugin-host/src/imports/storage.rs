//! `storage` (capability `storage`, contract 0.3.6 on): a service's databases and buckets on its
//! node's storage endpoint. The plugin names the binding; the [`StorageDispatch`] the server
//! installs ([`Services::set_storage_dispatch`]) provisions it with the provider's admin
//! credential and publishes the binding's credentials as the service's secrets — the plugin
//! sees neither. Changes act as the caller of the current method, or outside a call as the
//! plugin itself; an anonymous caller lends no authority.

use super::{CallData, Services, WitResult, to_wit};
use crate::manifest::Capability;
use crate::refusal::{Refusal, Result};
use crate::runtime::capstan::plugin::storage;
use capstan_rpc::Identity;
use serde_json::Value;
use std::sync::Arc;

pub use capstan_core::bindings::{BindingKind, Provisioned, StorageBinding};

/// How the `storage` import reaches the providers; the server installs its own with
/// [`Services::set_storage_dispatch`]. No credential may appear in a refusal or a log line.
#[async_trait::async_trait]
pub trait StorageDispatch: Send + Sync + 'static {
    /// The node's storage endpoints, value-free.
    async fn node_endpoints(&self, node_id: &str) -> Result<Value>;
    /// Make the binding true, its credentials the service's secrets, as `actor`.
    async fn provision(&self, actor: &Identity, plugin: &str, binding: &StorageBinding) -> Result<Provisioned>;
    /// Its credentials stop working at once; the data stays.
    async fn revoke(&self, actor: &Identity, plugin: &str, binding: &StorageBinding) -> Result<()>;
    /// Its data goes (revoked first).
    async fn destroy(&self, actor: &Identity, plugin: &str, binding: &StorageBinding) -> Result<()>;
}

/// The dispatcher of a host that provides no storage (the SDK's harness until a test installs
/// one): every call is refused `storage-unavailable`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoStorage;

fn unavailable() -> Refusal {
    Refusal::new("storage-unavailable", "this host provisions no storage bindings")
}

#[async_trait::async_trait]
impl StorageDispatch for NoStorage {
    async fn node_endpoints(&self, _node_id: &str) -> Result<Value> {
        Err(unavailable())
    }
    async fn provision(&self, _: &Identity, _: &str, _: &StorageBinding) -> Result<Provisioned> {
        Err(unavailable())
    }
    async fn revoke(&self, _: &Identity, _: &str, _: &StorageBinding) -> Result<()> {
        Err(unavailable())
    }
    async fn destroy(&self, _: &Identity, _: &str, _: &StorageBinding) -> Result<()> {
        Err(unavailable())
    }
}

/// The `storage` provider.
#[derive(Clone)]
pub(super) struct Storage {
    services: Arc<Services>,
    plugin: String,
}

impl Storage {
    pub(super) fn new(services: &Arc<Services>, plugin: &str) -> Self {
        Storage { services: services.clone(), plugin: plugin.to_string() }
    }
}

fn binding(b: storage::Binding) -> StorageBinding {
    StorageBinding {
        binding_id: b.binding_id,
        service_id: b.service_id,
        node_id: b.node_id,
        kind: match b.kind {
            storage::Kind::Database => BindingKind::Database,
            storage::Kind::ObjectStorage => BindingKind::ObjectStorage,
        },
        engine: b.engine,
    }
}

impl CallData {
    /// The provider and whom a change acts as, for a change (`read-only-method` in a read).
    fn storage_change(&self) -> WitResult<(Storage, Identity)> {
        self.changing()?;
        let provider = self.granted(&self.grant.storage, Capability::Storage)?;
        let actor = match &self.acting {
            super::Acting::Caller(identity) => identity.clone(),
            super::Acting::Plugin => provider.services.platform.plugin_identity(&provider.plugin),
            super::Acting::Anonymous => {
                return Err(to_wit(Refusal::new("unauthenticated", "an anonymous call of a public method cannot change storage")));
            }
        };
        Ok((provider, actor))
    }
}

impl storage::Host for CallData {
    async fn node_endpoints(&mut self, node_id: String) -> WitResult<String> {
        let provider = self.granted(&self.grant.storage, Capability::Storage)?;
        let dispatch = provider.services.storage_dispatch();
        dispatch.node_endpoints(&node_id).await.map(|v| v.to_string()).map_err(to_wit)
    }

    async fn provision(&mut self, b: storage::Binding) -> WitResult<storage::Provisioned> {
        let (provider, actor) = self.storage_change()?;
        let dispatch = provider.services.storage_dispatch();
        let done = dispatch.provision(&actor, &provider.plugin, &binding(b)).await.map_err(to_wit)?;
        Ok(storage::Provisioned { endpoint: done.endpoint, name: done.name, secret_keys: done.secret_keys })
    }

    async fn revoke(&mut self, b: storage::Binding) -> WitResult<()> {
        let (provider, actor) = self.storage_change()?;
        let dispatch = provider.services.storage_dispatch();
        dispatch.revoke(&actor, &provider.plugin, &binding(b)).await.map_err(to_wit)
    }

    async fn destroy(&mut self, b: storage::Binding) -> WitResult<()> {
        let (provider, actor) = self.storage_change()?;
        let dispatch = provider.services.storage_dispatch();
        dispatch.destroy(&actor, &provider.plugin, &binding(b)).await.map_err(to_wit)
    }
}
