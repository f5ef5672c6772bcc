//! Resolved manifests: for each service, an immutable, numbered statement of which secret
//! version every key resolves to. Every secret change of a service publishes the next one in
//! the same transaction — unless it resolves exactly as the last one did, so a replayed change
//! publishes nothing new. Agents receive a manifest's material sealed to their own X25519 key.

use super::envelope;
use super::ingress::{self, SealedInput};
use super::methods::{Owner, SECRETS, Secret, State, VERSIONS, Version, material_context};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::emit;
use capstan_keyring::Keyring;
use capstan_store::{CollectionSpec, Store, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;

/// The published manifests (id `<serviceId>~<number>`, the number zero-padded to 10 digits).
pub const MANIFESTS: &str = "secret_manifests";
/// The number of each service's newest manifest (id = service id).
pub const HEADS: &str = "secret_manifest_heads";

/// Declare the manifest and head collections in the store.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(CollectionSpec::new(MANIFESTS)).await?;
    store.declare(CollectionSpec::new(HEADS)).await
}

/// Where a key resolves from: the service's own secret, or a SecretSet attached to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Source {
    /// The service's own secret.
    Service,
    /// A SecretSet attached to the service.
    #[serde(rename_all = "camelCase")]
    SecretSet {
        /// The SecretSet's id.
        secret_set_id: String,
    },
}

/// Which secret version one key resolves to, and from where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resolved {
    /// The secret the key resolves to.
    pub secret_id: String,
    /// The secret's version the key resolves to: its current one at resolution.
    pub version_id: String,
    /// Where the secret comes from.
    pub from: Source,
}

/// A service's resolved manifest: an immutable, numbered, value-free statement of which secret
/// version every key resolves to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The service it resolves for.
    pub service_id: String,
    /// 1, 2, …: one more on every change of what resolves.
    pub number: u64,
    /// environment → key → secret version. Value-free.
    pub entries: BTreeMap<String, BTreeMap<String, Resolved>>,
    /// When it was published (milliseconds since the epoch).
    pub published_at: u64,
}

/// A key more than one source provides: which one wins and which are shadowed.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    /// The environment the key is in.
    pub environment: String,
    /// The key provided more than once.
    pub key: String,
    /// The source the key resolves from: the first to provide it.
    pub resolved_from: Source,
    /// The later sources whose secret for this key is ignored, in resolution order.
    pub shadowed: Vec<Source>,
}

/// What a service's secrets resolve to now, and every key provided twice.
pub struct Resolution {
    /// environment → key → the secret version it resolves to. Value-free.
    pub entries: BTreeMap<String, BTreeMap<String, Resolved>>,
    /// Every key more than one source provides, ordered by environment and key.
    pub conflicts: Vec<Conflict>,
}

fn manifest_id(service_id: &str, number: u64) -> String {
    format!("{service_id}~{number:010}")
}

/// Every active secret of one owner.
async fn active_secrets(tx: &Tx, owner_ref: &str) -> Result<Vec<(String, Secret)>> {
    let mut found = Vec::new();
    for doc in tx.find_all(SECRETS, "by_owner", &[json!(owner_ref)]).await? {
        let secret: Secret = serde_json::from_value(doc.data).map_err(Refusal::internal)?;
        if secret.state == State::Active {
            found.push((doc.id, secret));
        }
    }
    Ok(found)
}

/// Resolve a service's secrets: its own secrets first, then each attached SecretSet in the
/// order it was attached; the first source to provide a key wins, later ones are shadowed.
pub async fn resolution(tx: &Tx, service_id: &str) -> Result<Resolution> {
    let mut sources = vec![(Source::Service, Owner::Service { service_id: service_id.into() }.reference())];
    for attachment in super::sets::attachments(tx, service_id).await? {
        let owner = Owner::Organization { organization_id: attachment.organization_id, secret_set_id: attachment.secret_set_id.clone() };
        sources.push((Source::SecretSet { secret_set_id: attachment.secret_set_id }, owner.reference()));
    }
    let mut entries: BTreeMap<String, BTreeMap<String, Resolved>> = BTreeMap::new();
    let mut conflicts: BTreeMap<(String, String), Conflict> = BTreeMap::new();
    for (source, owner_ref) in sources {
        for (secret_id, secret) in active_secrets(tx, &owner_ref).await? {
            let keys = entries.entry(secret.environment.clone()).or_default();
            match keys.get(&secret.key) {
                None => {
                    let resolved = Resolved { secret_id, version_id: secret.current_version_id, from: source.clone() };
                    keys.insert(secret.key, resolved);
                }
                Some(winner) => {
                    let conflict = conflicts.entry((secret.environment.clone(), secret.key.clone())).or_insert_with(|| Conflict {
                        environment: secret.environment,
                        key: secret.key,
                        resolved_from: winner.from.clone(),
                        shadowed: Vec::new(),
                    });
                    conflict.shadowed.push(source.clone());
                }
            }
        }
    }
    Ok(Resolution { entries, conflicts: conflicts.into_values().collect() })
}

/// The number of the service's newest manifest (0 before the first).
pub async fn head(tx: &Tx, service_id: &str) -> Result<u64> {
    Ok(tx.get(HEADS, service_id).await?.and_then(|h| h.data["number"].as_u64()).unwrap_or(0))
}

/// Publish the service's next manifest in the caller's transaction if what resolves changed.
/// Answers the number published, or `None` when nothing changed.
pub async fn publish(tx: &Tx, service_id: &str) -> Result<Option<u64>> {
    let entries = resolution(tx, service_id).await?.entries;
    let head = tx.get(HEADS, service_id).await?;
    let last = head.as_ref().and_then(|h| h.data["number"].as_u64()).unwrap_or(0);
    if last > 0
        && let Some(doc) = tx.get(MANIFESTS, &manifest_id(service_id, last)).await?
        && doc.data["entries"] == serde_json::to_value(&entries).map_err(Refusal::internal)?
    {
        return Ok(None);
    }
    let number = last + 1;
    let manifest = Manifest { service_id: service_id.into(), number, entries, published_at: capstan_core::clock::now_ms() };
    tx.insert(MANIFESTS, &manifest_id(service_id, number), serde_json::to_value(&manifest).map_err(Refusal::internal)?).await?;
    tx.put(HEADS, service_id, head.map(|h| h.revision), json!({ "number": number })).await?;
    emit(tx, "secret.manifestPublished", service_id, json!({ "serviceId": service_id, "number": number })).await?;
    Ok(Some(number))
}

/// The service's manifest `number`, if it was published.
pub async fn read(tx: &Tx, service_id: &str, number: u64) -> Result<Option<Manifest>> {
    match tx.get(MANIFESTS, &manifest_id(service_id, number)).await? {
        Some(doc) => serde_json::from_value(doc.data).map(Some).map_err(Refusal::internal),
        None => Ok(None),
    }
}

/// The plaintext of one secret version, to seal it for its recipient at once (wiped when
/// dropped): refused `secret-manifest-not-accepted` when the secret is no longer active (a
/// replica admitted before a rotation still gets the version it pinned, until it is replaced).
pub async fn open_pinned(store: &Store, keyring: &Keyring, secret_id: &str, version_id: &str) -> Result<zeroize::Zeroizing<Vec<u8>>> {
    let (secret, version) = store
        .transact(|tx| async move {
            let stale = || {
                Refusal::new("secret-manifest-not-accepted", "a secret the assignment pinned is no longer active")
                    .with_data(json!({ "secretId": secret_id }))
            };
            let secret: Secret = match tx.get(SECRETS, secret_id).await? {
                Some(doc) => serde_json::from_value(doc.data).map_err(Refusal::internal)?,
                None => return Err(stale()),
            };
            if secret.state != State::Active {
                return Err(stale());
            }
            let version: Version = serde_json::from_value(tx.require(VERSIONS, version_id).await?.data).map_err(Refusal::internal)?;
            Ok((secret, version))
        })
        .await?;
    envelope::open(keyring, &material_context(secret_id, version_id, &secret), &version.envelope)
}

/// The service's newest manifest, if it ever had one.
pub async fn current(store: &Store, service_id: &str) -> Result<Option<Manifest>> {
    store
        .transact(|tx| async move {
            let Some(head) = tx.get(HEADS, service_id).await? else { return Ok(None) };
            let number = head.data["number"].as_u64().unwrap_or(0);
            let doc = tx.require(MANIFESTS, &manifest_id(service_id, number)).await?;
            serde_json::from_value(doc.data).map(Some).map_err(Refusal::internal)
        })
        .await
}

/// A manifest's material sealed to one agent: each value opens only with the agent's private
/// key and only for this manifest number and key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SealedManifest {
    /// The service the manifest resolves for.
    pub service_id: String,
    /// The manifest's number.
    pub number: u64,
    /// The agent the values are sealed to; each sealed value names it as its recipient id.
    pub agent_id: String,
    /// environment → key → sealed value.
    pub values: BTreeMap<String, BTreeMap<String, SealedInput>>,
}

/// What each sealed value is bound to, for the agent to open it with.
pub fn agent_target(service_id: &str, number: u64, environment: &str, key: &str) -> String {
    ingress::target("secrets.manifest", &format!("service:{service_id}#{number}"), &format!("{environment}/{key}"))
}

/// Seal `manifest`'s material to an agent's enrolled X25519 key. Plaintext lives only inside
/// this call and is wiped as each value is sealed.
pub async fn seal_for_agent(
    store: &Store,
    keyring: &Keyring,
    manifest: &Manifest,
    agent_id: &str,
    agent_key: &x25519_dalek::PublicKey,
) -> Result<SealedManifest> {
    let mut values: BTreeMap<String, BTreeMap<String, SealedInput>> = BTreeMap::new();
    for (environment, keys) in &manifest.entries {
        for (key, resolved) in keys {
            let (secret, version) = store
                .transact(|tx| async move {
                    let secret: Secret =
                        serde_json::from_value(tx.require(SECRETS, &resolved.secret_id).await?.data).map_err(Refusal::internal)?;
                    let version: Version =
                        serde_json::from_value(tx.require(VERSIONS, &resolved.version_id).await?.data).map_err(Refusal::internal)?;
                    Ok((secret, version))
                })
                .await?;
            let plaintext =
                envelope::open(keyring, &material_context(&resolved.secret_id, &resolved.version_id, &secret), &version.envelope)?;
            let target = agent_target(&manifest.service_id, manifest.number, environment, key);
            values.entry(environment.clone()).or_default().insert(key.clone(), ingress::seal_to(agent_id, agent_key, &target, &plaintext));
        }
    }
    Ok(SealedManifest { service_id: manifest.service_id.clone(), number: manifest.number, agent_id: agent_id.into(), values })
}
