//! How plugins' `storage` (contract 0.3.6) reaches the providers of nodes' storage endpoints:
//! through `capstan-storage`, which holds the providers' admin credentials and publishes each
//! binding's credentials as the service's secrets. The plugin host has checked the grant and
//! whom the call acts as.

use capstan_plugin_host::platform::async_trait;
use capstan_plugin_host::{BindingKind, Provisioned, StorageBinding, StorageDispatch};
use capstan_rpc::Identity;
use capstan_storage::bindings::{self, Binding, Kind};
use serde_json::Value;

/// The dispatcher the server installs ([`capstan_plugin_host::host::PluginHost::set_storage_dispatch`]).
pub struct StorageCalls(pub capstan_storage::Context);

fn binding(b: &StorageBinding) -> Binding {
    Binding {
        binding_id: b.binding_id.clone(),
        service_id: b.service_id.clone(),
        node_id: b.node_id.clone(),
        kind: match b.kind {
            BindingKind::Database => Kind::Database,
            BindingKind::ObjectStorage => Kind::ObjectStorage,
        },
        engine: b.engine.clone(),
    }
}

#[async_trait]
impl StorageDispatch for StorageCalls {
    async fn node_endpoints(&self, node_id: &str) -> capstan_core::refusal::Result<Value> {
        capstan_storage::endpoints::endpoints_view(self.0.store(), node_id).await
    }

    async fn provision(&self, actor: &Identity, _plugin: &str, b: &StorageBinding) -> capstan_core::refusal::Result<Provisioned> {
        let done = bindings::provision(&self.0, actor, &binding(b)).await?;
        Ok(Provisioned { endpoint: done.endpoint, name: done.name, secret_keys: done.secret_keys })
    }

    async fn revoke(&self, actor: &Identity, _plugin: &str, b: &StorageBinding) -> capstan_core::refusal::Result<()> {
        bindings::revoke(&self.0, actor, &binding(b)).await
    }

    async fn destroy(&self, actor: &Identity, _plugin: &str, b: &StorageBinding) -> capstan_core::refusal::Result<()> {
        bindings::destroy(&self.0, actor, &binding(b)).await
    }
}
