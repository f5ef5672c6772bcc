//! `secrets`: the secrets of the scopes the grant names (`secrets:<scope>`, which covers
//! `<scope>` and every `<scope>:<more>` — `secrets:mail` covers `mail:<serviceId>`), through
//! the server's [`Platform`]: ensure, put (0.2.3), rotate, revoke and list; `reveal` only with
//! `secrets-reveal:<scope>`, recorded by the host. A scope outside the grant is
//! `capability-denied`. Writes act as the caller of the current method, or outside a method
//! call as the plugin itself; an anonymous caller lends no authority (`unauthenticated`).
//! Values never reach a log line or a refusal.

use super::{CallData, WitResult, to_wit};
use crate::manifest::Capability;
use crate::platform::{Platform, SecretMeta, SecretOwner};
use crate::refusal::Refusal;
use crate::runtime::capstan::plugin::secrets;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The `secrets` provider: the scopes granted (`secrets:<scope>`) and those granted for
/// reveal (`secrets-reveal:<scope>`).
pub(super) struct Scopes {
    scopes: BTreeSet<String>,
    reveal: BTreeSet<String>,
    platform: Arc<dyn Platform>,
}

impl Scopes {
    pub(super) fn new(services: &Arc<super::Services>, grants: &BTreeSet<Capability>) -> Self {
        let mut scopes = Scopes { scopes: BTreeSet::new(), reveal: BTreeSet::new(), platform: services.platform.clone() };
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

/// Whether `scope` is inside one of `granted`: a granted scope covers itself and every scope
/// under it (`secrets:mail` covers `mail:<serviceId>`).
fn covers(granted: &BTreeSet<String>, scope: &str) -> bool {
    granted.iter().any(|g| scope == g || scope.strip_prefix(g.as_str()).is_some_and(|rest| rest.starts_with(':')))
}

impl CallData {
    /// The platform, once `scope` is granted (for reveal, when `reveal`), and whom the call acts
    /// as.
    fn scope(&self, scope: &str, reveal: bool) -> WitResult<(Arc<dyn Platform>, capstan_rpc::Identity)> {
        let granted = if reveal { &self.grant.secrets.reveal } else { &self.grant.secrets.scopes };
        let provider = covers(granted, scope).then_some(());
        // a refusal names the capability that would cover it: the scope before its first `:`
        let root = scope.split(':').next().unwrap_or_default().to_string();
        let capability = if reveal { Capability::SecretsReveal(root) } else { Capability::Secrets(root) };
        self.granted(&provider, capability)?;
        let valid = scope.len() <= 160
            && scope.split(':').all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
        if !valid {
            return Err(to_wit(Refusal::invalid_request(
                "a secrets scope is a granted scope, then optionally `:` and parts of A-Z a-z 0-9 - _ . (at most 160 bytes)",
            )));
        }
        let platform = self.grant.secrets.platform.clone();
        let actor = match &self.acting {
            super::Acting::Caller(identity) => identity.clone(),
            super::Acting::Plugin => platform.plugin_identity(self.plugin()),
            super::Acting::Anonymous => {
                return Err(to_wit(Refusal::new("unauthenticated", "an anonymous call of a public method cannot reach secrets")));
            }
        };
        Ok((platform, actor))
    }
}

fn owner_of(owner: secrets::Owner) -> SecretOwner {
    match owner {
        secrets::Owner::Service(id) => SecretOwner::Service(id),
        secrets::Owner::Organization(id) => SecretOwner::Organization(id),
        secrets::Owner::System(id) => SecretOwner::System(id),
    }
}

fn info(meta: SecretMeta) -> secrets::SecretInfo {
    secrets::SecretInfo {
        id: meta.id,
        owner: match meta.owner {
            SecretOwner::Service(id) => secrets::Owner::Service(id),
            SecretOwner::Organization(id) => secrets::Owner::Organization(id),
            SecretOwner::System(id) => secrets::Owner::System(id),
        },
        key: meta.key,
        management_scope: meta.management_scope,
        active_version: meta.active_version,
        state: meta.state,
        created_at_ms: meta.created_at_ms,
        rotated_at_ms: meta.rotated_at_ms,
    }
}

impl secrets::Host for CallData {
    async fn ensure(
        &mut self,
        scope: String,
        owner: secrets::Owner,
        key: String,
        generate: secrets::Generate,
    ) -> WitResult<secrets::SecretInfo> {
        self.changing()?;
        let (platform, actor) = self.scope(&scope, false)?;
        let meta = platform.ensure_secret(&actor, &scope, owner_of(owner), &key, generate.length, &generate.alphabet).await;
        meta.map(info).map_err(to_wit)
    }

    async fn put(&mut self, scope: String, owner: secrets::Owner, key: String, value: Vec<u8>) -> WitResult<secrets::SecretInfo> {
        self.changing()?;
        let value = zeroize::Zeroizing::new(value);
        let (platform, actor) = self.scope(&scope, false)?;
        platform.put_secret(&actor, &scope, owner_of(owner), &key, value).await.map(info).map_err(to_wit)
    }

    async fn rotate(&mut self, scope: String, secret_id: String) -> WitResult<secrets::SecretInfo> {
        self.changing()?;
        let (platform, actor) = self.scope(&scope, false)?;
        platform.rotate_secret(&actor, &scope, &secret_id).await.map(info).map_err(to_wit)
    }

    async fn revoke(&mut self, scope: String, secret_id: String) -> WitResult<secrets::SecretInfo> {
        self.changing()?;
        let (platform, actor) = self.scope(&scope, false)?;
        platform.revoke_secret(&actor, &scope, &secret_id).await.map(info).map_err(to_wit)
    }

    async fn list(&mut self, scope: String) -> WitResult<Vec<secrets::SecretInfo>> {
        let (platform, _) = self.scope(&scope, false)?;
        let listed = platform.list_secrets(&scope).await.map_err(to_wit)?;
        Ok(listed.into_iter().map(info).collect())
    }

    async fn reveal(&mut self, scope: String, secret_id: String) -> WitResult<Vec<u8>> {
        let (platform, actor) = self.scope(&scope, true)?;
        let value = platform.reveal_secret(&actor, self.plugin(), &scope, &secret_id).await.map_err(to_wit)?;
        Ok(value.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_granted_scope_covers_itself_and_the_scopes_under_it_only() {
        let granted: BTreeSet<String> = ["mail".to_string()].into();
        assert!(covers(&granted, "mail"));
        assert!(covers(&granted, "mail:svc-1"));
        assert!(covers(&granted, "mail:svc-1:dkim"));
        assert!(!covers(&granted, "mailer"), "a longer name is another scope");
        assert!(!covers(&granted, "backups:mail"));
        assert!(!covers(&BTreeSet::new(), "mail"));
    }
}
