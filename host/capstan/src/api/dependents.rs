//! What other areas keep on the inventory's entities, as the inventory consults it inside its
//! own transactions: the secrets of a service and an organization's SecretSets, and the plugin
//! registry that says whether a holder of a service is still installed.

use crate::inventory::Dependents;
use crate::refusal::{Refusal, Result};
use crate::store::Tx;

/// The host's answer to [`Dependents`]: the secrets and plugin areas, assembled here so the
/// inventory depends on neither.
pub struct HostDependents;

#[async_trait::async_trait]
impl Dependents for HostDependents {
    async fn organization_blocker(&self, tx: &Tx, organization_id: &str, name: &str) -> Result<Option<Refusal>> {
        Ok(crate::secrets::sets::has_active(tx, organization_id).await?.then(|| {
            Refusal::new("organization-has-secret-sets", format!("the organization {name} still has active SecretSets: retire them first"))
        }))
    }

    async fn service_removed(&self, tx: &Tx, service_id: &str) -> Result<()> {
        // its own secrets are revoked and its SecretSet attachments go (the sets stay)
        crate::secrets::methods::forget_service(tx, service_id).await
    }

    async fn holder_present(&self, tx: &Tx, holder: &str) -> Result<bool> {
        use crate::plugins::host::PLUGINS;
        match holder.strip_prefix("plugin:") {
            Some(plugin) => Ok(tx.is_declared(PLUGINS) && tx.get(PLUGINS, plugin).await?.is_some()),
            None => Ok(true),
        }
    }
}
