//! Where the host's areas meet without depending on each other. Each area declares what it
//! needs of the others as a trait; the answers live here, so the areas' crates stay apart:
//!
//! - [`HostDependents`]: what the secrets and plugin areas keep on the inventory's entities
//!   (the inventory's [`Dependents`]).
//! - [`InventoryPlatform`]: the inventory, settings and organization roles as plugins reach them
//!   (the plugin host's [`Platform`]).

use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::Dependents;
use capstan_inventory::access::{self, Authority, OrgRole};
use capstan_plugin_host::platform::Platform;
use capstan_rpc::{Identity, OrganizationAuthority};
use capstan_store::{Document, Store, Tx};
use serde_json::Value;
use std::sync::Arc;

/// The host's answer to [`Dependents`]: the secrets and plugin areas, consulted by the
/// inventory inside its own transactions.
pub struct HostDependents;

#[async_trait::async_trait]
impl Dependents for HostDependents {
    async fn organization_blocker(&self, tx: &Tx, organization_id: &str, name: &str) -> Result<Option<Refusal>> {
        Ok(capstan_secrets::sets::has_active(tx, organization_id).await?.then(|| {
            Refusal::new("organization-has-secret-sets", format!("the organization {name} still has active SecretSets: retire them first"))
        }))
    }

    async fn service_removed(&self, tx: &Tx, service_id: &str) -> Result<()> {
        // its own secrets are revoked and its SecretSet attachments go (the sets stay)
        capstan_secrets::methods::forget_service(tx, service_id).await
    }

    async fn holder_present(&self, tx: &Tx, holder: &str) -> Result<bool> {
        use capstan_plugin_host::host::PLUGINS;
        match holder.strip_prefix("plugin:") {
            Some(plugin) => Ok(tx.is_declared(PLUGINS) && tx.get(PLUGINS, plugin).await?.is_some()),
            None => Ok(true),
        }
    }
}

/// The inventory as the plugin host reaches it.
pub struct InventoryPlatform {
    store: Store,
    dependents: Arc<dyn Dependents>,
}

impl InventoryPlatform {
    /// Over `store`, releasing holds with `dependents` consulted.
    pub fn new(store: Store, dependents: Arc<dyn Dependents>) -> Arc<Self> {
        Arc::new(InventoryPlatform { store, dependents })
    }
}

fn document(entity: capstan_inventory::Entity<capstan_inventory::services::Service>) -> Result<Document> {
    Ok(Document { id: entity.id, revision: entity.revision, data: capstan_inventory::to_value(&entity.data)? })
}

#[async_trait::async_trait]
impl OrganizationAuthority for InventoryPlatform {
    async fn require(&self, identity: &Identity, organization: &str, need: OrgRole) -> Result<Option<OrgRole>> {
        Authority(self.store.clone()).require(identity, organization, need).await
    }
}

#[async_trait::async_trait]
impl Platform for InventoryPlatform {
    fn setting_lists_urls(&self, key: &str) -> bool {
        capstan_inventory::settings::lists_urls(key)
    }

    async fn setting_urls(&self, key: &str) -> Result<Vec<String>> {
        capstan_inventory::settings::urls(&self.store, key).await
    }

    fn plugin_identity(&self, plugin: &str) -> Identity {
        access::plugin_identity(plugin)
    }

    async fn create_service(&self, actor: &Identity, body: Value) -> Result<Document> {
        document(capstan_inventory::services::create(&self.store, actor, capstan_rpc::decode(body)?).await?)
    }

    async fn update_service(&self, actor: &Identity, body: Value) -> Result<Document> {
        document(capstan_inventory::services::update(&self.store, actor, capstan_rpc::decode(body)?).await?)
    }

    async fn hold_service(&self, service_id: &str, holder: &str) -> Result<()> {
        capstan_inventory::services::hold(&self.store, service_id, holder).await
    }

    async fn release_service(&self, service_id: &str, holder: &str) -> Result<()> {
        capstan_inventory::services::release(&self.store, &*self.dependents, service_id, holder).await
    }
}
