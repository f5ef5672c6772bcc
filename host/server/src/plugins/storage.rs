//! How plugins' `storage` (contract 0.3.6) reaches the providers of nodes' storage endpoints:
//! through `capstan-storage`, which holds the providers' admin credentials and publishes each
//! binding's credentials as the service's secrets. The plugin host has checked the grant and
//! whom the call acts as.

use capstan_core::refusal::Result;
use capstan_plugin_host::platform::async_trait;
use capstan_plugin_host::{Provisioned, StorageBinding, StorageDispatch};
use capstan_rpc::Identity;
use capstan_storage::bindings;
use serde_json::Value;

/// The dispatcher the server installs ([`capstan_plugin_host::host::PluginHost::set_storage_dispatch`]).
pub struct StorageCalls(pub capstan_storage::Context);

#[async_trait]
impl StorageDispatch for StorageCalls {
    async fn node_endpoints(&self, node_id: &str) -> Result<Value> {
        capstan_storage::endpoints::endpoints_view(self.0.store(), node_id).await
    }

    async fn provision(&self, actor: &Identity, _plugin: &str, binding: &StorageBinding) -> Result<Provisioned> {
        bindings::provision(&self.0, actor, binding).await
    }

    async fn revoke(&self, actor: &Identity, _plugin: &str, binding: &StorageBinding) -> Result<()> {
        bindings::revoke(&self.0, actor, binding).await
    }

    async fn destroy(&self, actor: &Identity, _plugin: &str, binding: &StorageBinding) -> Result<()> {
        bindings::destroy(&self.0, actor, binding).await
    }
}
