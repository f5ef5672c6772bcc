//! `secrets`: refused by name (`secrets-unavailable`) inside the scopes the grant names, and
//! `capability-denied` outside them. The secrets subsystem backs this import in a later step.

use super::{CallData, WitResult, refusal};
use crate::manifest::Capability;
use crate::runtime::capstan::plugin::{secrets, types};
use serde_json::json;
use std::collections::BTreeSet;

/// The `secrets` provider: the scopes granted (`secrets:<scope>`) and those granted for
/// reveal (`secrets-reveal:<scope>`).
pub(super) struct Scopes {
    scopes: BTreeSet<String>,
    reveal: BTreeSet<String>,
}

impl Scopes {
    pub(super) fn new(grants: &BTreeSet<Capability>) -> Self {
        let mut scopes = Scopes { scopes: BTreeSet::new(), reveal: BTreeSet::new() };
        for grant in grants {
            match grant {
                Capability::Secrets(scope) => drop(scopes.scopes.insert(scope.clone())),
                Capability::SecretsReveal(scope) => drop(scopes.reveal.insert(scope.clone())),
                _ => {}
            }
        }
        scopes
    }
}

impl CallData {
    /// Refuse unless `scope` was granted (for reveal, when `reveal`).
    fn scope(&self, scope: String, reveal: bool) -> WitResult<()> {
        let granted = if reveal { &self.grant.secrets.reveal } else { &self.grant.secrets.scopes };
        let provider = granted.contains(&scope).then_some(());
        let capability = if reveal { Capability::SecretsReveal(scope) } else { Capability::Secrets(scope) };
        self.granted(&provider, capability)
    }
}

impl secrets::Host for CallData {
    async fn ensure(&mut self, scope: String, _: secrets::Owner, _: String, _: secrets::Generate) -> WitResult<secrets::SecretInfo> {
        self.scope(scope, false)?;
        Err(secrets_unavailable())
    }

    async fn rotate(&mut self, scope: String, _: String) -> WitResult<secrets::SecretInfo> {
        self.scope(scope, false)?;
        Err(secrets_unavailable())
    }

    async fn revoke(&mut self, scope: String, _: String) -> WitResult<secrets::SecretInfo> {
        self.scope(scope, false)?;
        Err(secrets_unavailable())
    }

    async fn list(&mut self, scope: String) -> WitResult<Vec<secrets::SecretInfo>> {
        self.scope(scope, false)?;
        Err(secrets_unavailable())
    }

    async fn reveal(&mut self, scope: String, _: String) -> WitResult<Vec<u8>> {
        self.scope(scope, true)?;
        Err(secrets_unavailable())
    }
}

/// Not yet backed by the secrets subsystem: refused by name.
fn secrets_unavailable() -> types::Refusal {
    refusal("secrets-unavailable", "this host does not manage secrets yet".into(), json!({}))
}
