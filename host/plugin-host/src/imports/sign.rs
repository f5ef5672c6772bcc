//! `sign`: Ed25519 signatures with the plugin's own named keys, created on first use and kept
//! sealed under the keyring.

use super::{CallData, Services, WitResult, refusal, to_wit};
use crate::keyring::Keyring;
use crate::keyring::seal::{Context as SealContext, Sealed};
use crate::manifest::Capability;
use crate::refusal::Refusal;
use crate::runtime::capstan::plugin::sign;
use crate::store::Store;
use base64::Engine as _;
use serde_json::json;
use std::sync::Arc;

/// The collection of plugins' sealed signing keys (`<plugin>/<name>`).
pub const PLUGIN_KEYS: &str = "plugin_keys";

/// The stored form of a plugin's signing key.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredKey {
    public_key: String,
    sealed: Sealed,
}

/// The `sign` provider: the plugin's keys.
#[derive(Clone)]
pub(super) struct Signer {
    store: Store,
    keyring: Arc<Keyring>,
    plugin: String,
}

impl Signer {
    pub(super) fn new(services: &Arc<Services>, plugin: &str) -> Self {
        Signer { store: services.store.clone(), keyring: services.keyring.clone(), plugin: plugin.to_string() }
    }

    /// The plugin's signing key `name`, created (and sealed under the keyring) on first use.
    async fn key(&self, name: &str) -> WitResult<ed25519_dalek::SigningKey> {
        let valid = (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(refusal("invalid-request", "a key name is 1 to 64 of [A-Za-z0-9_-]".into(), json!({})));
        }
        let id = format!("{}/{name}", self.plugin);
        let context = SealContext::new("plugin-signing-key").with("plugin", &self.plugin).with("key", name);
        // Two first uses at once: one insert wins, the other reads what it wrote.
        for _ in 0..2 {
            let loaded = self.store.transact(|tx| {
                let (id, context, keyring) = (id.clone(), context.clone(), self.keyring.clone());
                async move {
                    if let Some(doc) = tx.get(PLUGIN_KEYS, &id).await? {
                        let stored: StoredKey = serde_json::from_value(doc.data).map_err(Refusal::internal)?;
                        let secret = keyring.open(&context, &stored.sealed)?;
                        let bytes: [u8; 32] =
                            secret.as_slice().try_into().map_err(|_| Refusal::internal("stored signing key is not 32 bytes"))?;
                        return Ok(ed25519_dalek::SigningKey::from_bytes(&bytes));
                    }
                    let key = ed25519_dalek::SigningKey::from_bytes(&rand::random());
                    let stored = StoredKey {
                        public_key: base64::engine::general_purpose::STANDARD.encode(key.verifying_key().as_bytes()),
                        sealed: keyring.seal(&context, key.as_bytes())?,
                    };
                    tx.insert(PLUGIN_KEYS, &id, serde_json::to_value(stored).map_err(Refusal::internal)?).await?;
                    Ok(key)
                }
            });
            match loaded.await {
                Err(e) if e.is("exists") => continue,
                other => return other.map_err(to_wit),
            }
        }
        Err(to_wit(Refusal::internal("a plugin signing key was neither readable nor creatable")))
    }
}

impl sign::Host for CallData {
    async fn sign(&mut self, key_name: String, message: Vec<u8>) -> WitResult<Vec<u8>> {
        use ed25519_dalek::Signer as _;
        let key = self.granted(&self.grant.sign, Capability::Sign)?.key(&key_name).await?;
        Ok(key.sign(&message).to_bytes().to_vec())
    }

    async fn public_key(&mut self, key_name: String) -> WitResult<Vec<u8>> {
        let key = self.granted(&self.grant.sign, Capability::Sign)?.key(&key_name).await?;
        Ok(key.verifying_key().as_bytes().to_vec())
    }
}
