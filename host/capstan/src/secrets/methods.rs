//! The `secrets.*` API: secrets owned by a service, an organization or the system, each a
//! chain of immutable versions sealed in envelopes. Every answer is metadata; a value enters
//! generated on the server or sealed to the ingress recipient, and never leaves.

use super::envelope::{self, Envelope, MaterialContext};
use super::ingress::{self, SealedInput};
use crate::inventory::{Listing, emit, not_found};
use crate::keyring::Keyring;
use crate::refusal::{Refusal, Result};
use crate::store::{CollectionSpec, Store, Tx};
use capstan_core::clock::now_secs;
use capstan_rpc::receipts;
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;
use zeroize::Zeroizing;

pub const SECRETS: &str = "secrets";
pub const VERSIONS: &str = "secret_versions";
/// What the material of every version is sealed for.
const PURPOSE: &str = "secret-material";
/// The largest value Capstan keeps, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

pub async fn declare(store: &Store) -> Result<()> {
    store
        .declare(CollectionSpec::new(SECRETS).unique("by_owner_key", &["ownerRef", "key", "environment"]).index("by_owner", &["ownerRef"]))
        .await?;
    store.declare(CollectionSpec::new(VERSIONS).index("by_secret", &["secretId"])).await?;
    super::sets::declare(store).await?;
    super::manifests::declare(store).await
}

/// Who a secret belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum Owner {
    #[serde(rename_all = "camelCase")]
    Service { service_id: String },
    /// An organization's shared secret: a member of one of its SecretSets.
    #[serde(rename_all = "camelCase")]
    Organization { organization_id: String, secret_set_id: String },
    /// The host's own integrations (gateway tokens, backup target credentials).
    #[serde(rename_all = "camelCase")]
    System { system_id: String },
}

impl Owner {
    /// `service:<id>`, `organization:<id>/secretSet:<id>` or `system:<id>`: how owners are
    /// indexed and what sealed values are bound to.
    pub fn reference(&self) -> String {
        match self {
            Owner::Service { service_id } => format!("service:{service_id}"),
            Owner::Organization { organization_id, secret_set_id } => format!("organization:{organization_id}/secretSet:{secret_set_id}"),
            Owner::System { system_id } => format!("system:{system_id}"),
        }
    }
}

/// How the host generates a value.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Generate {
    /// 16–512 characters.
    pub length: usize,
    /// `alphanumeric`, `hex`, `base64url` or `printable`.
    pub alphabet: String,
}

/// Where a new version's value comes from: generated here, or sealed by the client to the
/// ingress recipient for this very request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Value {
    Generate(Generate),
    Sealed(SealedInput),
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateInput {
    pub owner: Owner,
    /// An environment variable name: `[A-Z_][A-Z0-9_]*`.
    pub key: String,
    /// Which environment it is for (default `production`).
    pub environment: Option<String>,
    /// The manager that owns it, e.g. `mail:<serviceId>`; writes from any other scope are refused.
    pub management_scope: Option<String>,
    pub value: Value,
    /// Repeating the same request with this id answers the first answer again, changing nothing.
    pub mutation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RotateInput {
    pub id: String,
    /// The version the caller read; a newer one means someone else rotated (`conflict`).
    pub expected_version_id: String,
    pub management_scope: Option<String>,
    pub value: Value,
    /// Repeating the same request with this id answers the first answer again, changing nothing.
    pub mutation_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevokeInput {
    pub id: String,
    pub management_scope: Option<String>,
    /// Repeating the same request with this id answers the first answer again.
    pub mutation_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceRef {
    pub service_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListInput {
    /// Only this owner's secrets.
    pub owner: Option<Owner>,
    pub cursor: Option<String>,
    /// At most 200 (default 50).
    pub limit: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum State {
    Active,
    Revoked,
}

/// A secret's metadata — all any answer ever carries.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    pub owner: Owner,
    pub owner_ref: String,
    /// The owning organization ("" for system secrets).
    pub organization_id: String,
    pub key: String,
    pub environment: String,
    pub management_scope: Option<String>,
    pub state: State,
    pub current_version_id: String,
    pub versions: u64,
    pub created_at: u64,
    pub updated_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<u64>,
}

/// A version as stored: its envelope stays in the store, never in an answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    pub secret_id: String,
    pub number: u64,
    /// `generated` or `sealed`.
    pub source: String,
    pub created_at: u64,
    pub created_by: String,
    pub envelope: Envelope,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionView {
    pub id: String,
    pub number: u64,
    pub source: String,
    pub created_at: u64,
    pub created_by: String,
    /// The KEK its data key is wrapped by.
    pub kek_id: String,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretView {
    pub id: String,
    pub revision: u64,
    #[serde(flatten)]
    pub secret: Secret,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretDetail {
    #[serde(flatten)]
    pub secret: SecretView,
    pub version_history: Vec<VersionView>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Recipient {
    pub recipient_id: String,
    /// X25519 public key, base64.
    pub public_key: String,
    pub profile: &'static str,
}

fn check_key(key: &str) -> Result<()> {
    crate::inventory::validate::env_key("key", key)
}

fn check_environment(environment: &str) -> Result<()> {
    crate::inventory::validate::name("environment", environment)
}

/// The organization an owner lives in, checking the owner exists.
async fn owner_organization(tx: &Tx, owner: &Owner) -> Result<String> {
    match owner {
        Owner::Service { service_id } => Ok(crate::inventory::services::require_active(tx, service_id).await?.data.organization_id),
        Owner::Organization { organization_id, secret_set_id } => {
            super::sets::require_usable(tx, secret_set_id, organization_id).await?;
            Ok(organization_id.clone())
        }
        Owner::System { system_id } => {
            let ok = !system_id.is_empty()
                && system_id.len() <= 128
                && system_id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c));
            if !ok {
                return Err(
                    Refusal::invalid_request("a systemId is 1–128 of A-Z a-z 0-9 - _ . :").with_data(json!({ "field": "owner.systemId" }))
                );
            }
            Ok(String::new())
        }
    }
}

const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const HEX: &[u8] = b"0123456789abcdef";
const BASE64URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const PRINTABLE: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&()*+,-./:;<=>?@[]^_{|}~";

/// A value of `length` characters drawn uniformly from the alphabet.
fn generate(spec: &Generate) -> Result<Zeroizing<Vec<u8>>> {
    let alphabet = match spec.alphabet.as_str() {
        "alphanumeric" => ALPHANUMERIC,
        "hex" => HEX,
        "base64url" => BASE64URL,
        "printable" => PRINTABLE,
        _ => {
            return Err(Refusal::invalid_request("alphabet is one of alphanumeric, hex, base64url, printable")
                .with_data(json!({ "field": "value.generate.alphabet" })));
        }
    };
    if !(16..=512).contains(&spec.length) {
        return Err(
            Refusal::invalid_request("a generated value is 16–512 characters").with_data(json!({ "field": "value.generate.length" }))
        );
    }
    let mut out = Zeroizing::new(Vec::with_capacity(spec.length));
    // rejection sampling keeps every character equally likely
    let limit = 256 - (256 % alphabet.len());
    while out.len() < spec.length {
        let byte = rand::random::<u8>() as usize;
        if byte < limit {
            out.push(alphabet[byte % alphabet.len()]);
        }
    }
    Ok(out)
}

/// The plaintext of a new version and where it came from. A sealed value opens only for
/// `target`; an empty or oversized one is refused by name.
fn material(keyring: &crate::keyring::Keyring, value: &Value, target: &str) -> Result<(Zeroizing<Vec<u8>>, &'static str)> {
    let (plaintext, source) = match value {
        Value::Generate(spec) => (generate(spec)?, "generated"),
        Value::Sealed(sealed) => (ingress::open(keyring, target, sealed)?, "sealed"),
    };
    if plaintext.is_empty() {
        return Err(Refusal::new("input-empty", "the value is empty"));
    }
    if plaintext.len() > MAX_VALUE_BYTES {
        return Err(Refusal::new("input-oversized", format!("a value is at most {MAX_VALUE_BYTES} bytes"))
            .with_data(json!({ "limitBytes": MAX_VALUE_BYTES })));
    }
    Ok((plaintext, source))
}

/// What a version's material is sealed for.
pub(super) fn material_context(secret_id: &str, version_id: &str, secret: &Secret) -> MaterialContext {
    MaterialContext {
        purpose: PURPOSE.into(),
        secret_id: secret_id.into(),
        version_id: version_id.into(),
        owner: secret.owner_ref.clone(),
        organization: secret.organization_id.clone(),
        key: secret.key.clone(),
        environment: secret.environment.clone(),
    }
}

fn check_scope(secret: &Secret, scope: &Option<String>) -> Result<()> {
    if secret.management_scope != *scope {
        return Err(Refusal::new("management-scope-mismatch", "this secret is managed from another scope; only its manager may change it")
            .with_data(json!({ "managementScope": secret.management_scope })));
    }
    Ok(())
}

pub(super) fn view(id: &str, revision: u64, secret: Secret) -> SecretView {
    SecretView { id: id.into(), revision, secret }
}

pub(super) fn parse_secret(doc: &crate::store::Document) -> Result<Secret> {
    serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("stored secret {} is malformed: {e}", doc.id)))
}

async fn require_secret(tx: &Tx, id: &str) -> Result<(crate::store::Document, Secret)> {
    if crate::store::validate_id(id).is_err() {
        return Err(not_found("secret", id));
    }
    let doc = tx.get(SECRETS, id).await?.ok_or_else(|| not_found("secret", id))?;
    let secret = parse_secret(&doc)?;
    Ok((doc, secret))
}

/// A secret changed: publish the next resolved manifest of every service it reaches — its own
/// service, or each service its SecretSet is attached to — in the same transaction.
async fn publish_manifest(tx: &Tx, secret: &Secret) -> Result<()> {
    let services = match &secret.owner {
        Owner::Service { service_id } => vec![service_id.clone()],
        Owner::Organization { secret_set_id, .. } => super::sets::attached_services(tx, secret_set_id).await?,
        Owner::System { .. } => Vec::new(),
    };
    for service_id in services {
        super::manifests::publish(tx, &service_id).await?;
    }
    Ok(())
}

/// A service is gone: its own secrets are revoked (their versions stay as history) and its
/// attachments and secrets revision removed, in the caller's transaction.
pub async fn forget_service(tx: &Tx, service_id: &str) -> Result<()> {
    let owner = Owner::Service { service_id: service_id.into() }.reference();
    for doc in tx.find_all(SECRETS, "by_owner", &[json!(owner)]).await? {
        let mut secret = parse_secret(&doc)?;
        if secret.state == State::Active {
            let at = now_secs();
            (secret.state, secret.revoked_at, secret.updated_at) = (State::Revoked, Some(at), at);
            tx.replace(SECRETS, &doc.id, doc.revision, serde_json::to_value(&secret).map_err(Refusal::internal)?).await?;
            emit(tx, "secret.revoked", &doc.id, event_data(&doc.id, &secret)).await?;
        }
    }
    super::sets::forget_service(tx, service_id).await
}

/// Every change's event: ids, owner and key — never a value.
fn event_data(id: &str, secret: &Secret) -> serde_json::Value {
    json!({ "id": id, "owner": secret.owner_ref, "key": secret.key, "environment": secret.environment, "versionId": secret.current_version_id, "state": secret.state })
}

async fn create(cx: Context, call: Call, input: CreateInput) -> Result<SecretView> {
    let identity = call.identity()?.clone();
    check_key(&input.key)?;
    let environment = input.environment.clone().unwrap_or_else(|| "production".into());
    check_environment(&environment)?;
    let owner_ref = input.owner.reference();
    let target = ingress::target("secrets.create", &owner_ref, &input.key);
    let (plaintext, source) = material(&cx.keyring, &input.value, &target)?;
    let (secret_id, version_id) = (capstan_core::ids::new_id("sec"), capstan_core::ids::new_id("ver"));
    let keyring = cx.keyring.clone();
    let (input, environment, identity, plaintext) = (&input, &environment, &identity, &plaintext);
    let (secret_ref, version_ref) = (&secret_id, &version_id);
    let answer = cx
        .store
        .transact(|tx| {
            let keyring = keyring.clone();
            async move {
                let mutation = input.mutation_id.as_deref();
                if let Some(answer) = receipts::replay(&tx, &identity.user_id, mutation, &("secrets.create", input)).await? {
                    return Ok(answer);
                }
                let organization_id = owner_organization(&tx, &input.owner).await?;
                let at = now_secs();
                let secret = Secret {
                    owner: input.owner.clone(),
                    owner_ref: input.owner.reference(),
                    organization_id,
                    key: input.key.clone(),
                    environment: environment.clone(),
                    management_scope: input.management_scope.clone(),
                    state: State::Active,
                    current_version_id: version_ref.clone(),
                    versions: 1,
                    created_at: at,
                    updated_at: at,
                    revoked_at: None,
                };
                let taken = tx
                    .find(SECRETS, "by_owner_key", &[json!(secret.owner_ref), json!(secret.key), json!(secret.environment)], None, 1)
                    .await?;
                if !taken.documents.is_empty() {
                    return Err(Refusal::new(
                        "exists",
                        format!("{} already has a secret {} for {}: rotate it", secret.owner_ref, secret.key, secret.environment),
                    )
                    .with_data(json!({ "id": taken.documents[0].id })));
                }
                let sealed = envelope::seal(&keyring, &material_context(secret_ref, version_ref, &secret), plaintext)?;
                let version = Version {
                    secret_id: secret_ref.clone(),
                    number: 1,
                    source: source.into(),
                    created_at: at,
                    created_by: identity.user_id.clone(),
                    envelope: sealed,
                };
                tx.insert(VERSIONS, version_ref, serde_json::to_value(&version).map_err(Refusal::internal)?).await?;
                let doc = tx.insert(SECRETS, secret_ref, serde_json::to_value(&secret).map_err(Refusal::internal)?).await?;
                emit(&tx, "secret.created", secret_ref, event_data(secret_ref, &secret)).await?;
                publish_manifest(&tx, &secret).await?;
                let answer = view(secret_ref, doc.revision, secret);
                receipts::record(&tx, &identity.user_id, mutation, &("secrets.create", input), &answer).await?;
                Ok(answer)
            }
        })
        .await?;
    tracing::info!(secret = %answer.id, owner = %answer.secret.owner_ref, key = %answer.secret.key, source, "secret created");
    Ok(answer)
}

async fn rotate(cx: Context, call: Call, input: RotateInput) -> Result<SecretView> {
    let identity = call.identity()?.clone();
    // the target needs the owner and key, read before the value is opened
    let id = input.id.as_str();
    let (_, current) = cx.store.transact(|tx| async move { require_secret(&tx, id).await }).await?;
    let target = ingress::target("secrets.rotate", &current.owner_ref, &current.key);
    let (plaintext, source) = material(&cx.keyring, &input.value, &target)?;
    let version_id = capstan_core::ids::new_id("ver");
    let keyring = cx.keyring.clone();
    let (input, identity, plaintext, version_ref) = (&input, &identity, &plaintext, &version_id);
    let answer = cx
        .store
        .transact(|tx| {
            let keyring = keyring.clone();
            async move {
                let mutation = input.mutation_id.as_deref();
                if let Some(answer) = receipts::replay(&tx, &identity.user_id, mutation, &("secrets.rotate", input)).await? {
                    return Ok(answer);
                }
                let (doc, mut secret) = require_secret(&tx, &input.id).await?;
                check_scope(&secret, &input.management_scope)?;
                // a deleting service's or a retired SecretSet's secret takes no new version
                owner_organization(&tx, &secret.owner).await?;
                if secret.state == State::Revoked {
                    return Err(Refusal::new("secret-revoked", "a revoked secret takes no new version; create a new one"));
                }
                if secret.current_version_id != input.expected_version_id {
                    return Err(Refusal::new("conflict", "the secret has a newer version than the one stated: read it again")
                        .with_data(json!({ "currentVersionId": secret.current_version_id })));
                }
                let at = now_secs();
                secret.versions += 1;
                secret.current_version_id = version_ref.clone();
                secret.updated_at = at;
                let sealed = envelope::seal(&keyring, &material_context(&input.id, version_ref, &secret), plaintext)?;
                let version = Version {
                    secret_id: input.id.clone(),
                    number: secret.versions,
                    source: source.into(),
                    created_at: at,
                    created_by: identity.user_id.clone(),
                    envelope: sealed,
                };
                tx.insert(VERSIONS, version_ref, serde_json::to_value(&version).map_err(Refusal::internal)?).await?;
                let doc = tx.replace(SECRETS, &input.id, doc.revision, serde_json::to_value(&secret).map_err(Refusal::internal)?).await?;
                emit(&tx, "secret.rotated", &input.id, event_data(&input.id, &secret)).await?;
                publish_manifest(&tx, &secret).await?;
                let answer = view(&input.id, doc.revision, secret);
                receipts::record(&tx, &identity.user_id, mutation, &("secrets.rotate", input), &answer).await?;
                Ok(answer)
            }
        })
        .await?;
    tracing::info!(secret = %input.id, version = answer.secret.versions, source, "secret rotated");
    Ok(answer)
}

async fn revoke(cx: Context, call: Call, input: RevokeInput) -> Result<SecretView> {
    let actor = call.identity()?.user_id.clone();
    let (input, actor) = (&input, actor.as_str());
    let answer = cx
        .store
        .transact(|tx| async move {
            let mutation = input.mutation_id.as_deref();
            if let Some(answer) = receipts::replay(&tx, actor, mutation, &("secrets.revoke", input)).await? {
                return Ok(answer);
            }
            let (doc, mut secret) = require_secret(&tx, &input.id).await?;
            check_scope(&secret, &input.management_scope)?;
            if secret.state == State::Revoked {
                return Ok(view(&input.id, doc.revision, secret));
            }
            secret.state = State::Revoked;
            secret.revoked_at = Some(now_secs());
            secret.updated_at = now_secs();
            let doc = tx.replace(SECRETS, &input.id, doc.revision, serde_json::to_value(&secret).map_err(Refusal::internal)?).await?;
            emit(&tx, "secret.revoked", &input.id, event_data(&input.id, &secret)).await?;
            publish_manifest(&tx, &secret).await?;
            let answer = view(&input.id, doc.revision, secret);
            receipts::record(&tx, actor, mutation, &("secrets.revoke", input), &answer).await?;
            Ok(answer)
        })
        .await?;
    tracing::info!(secret = %input.id, "secret revoked");
    Ok(answer)
}

async fn list(cx: Context, _: Call, input: ListInput) -> Result<Listing<SecretView>> {
    let limit = crate::inventory::page_limit(input.limit);
    let input = &input;
    cx.store
        .transact(|tx| async move {
            let cursor = input.cursor.as_deref();
            let page = match &input.owner {
                Some(owner) => tx.find(SECRETS, "by_owner", &[json!(owner.reference())], cursor, limit).await?,
                None => tx.scan(SECRETS, cursor, limit).await?,
            };
            let items = page.documents.iter().map(|d| Ok(view(&d.id, d.revision, parse_secret(d)?))).collect::<Result<_>>()?;
            Ok(Listing { items, next_cursor: page.next_cursor })
        })
        .await
}

async fn get(cx: Context, _: Call, input: crate::inventory::ById) -> Result<SecretDetail> {
    let id = input.id.as_str();
    cx.store
        .transact(|tx| async move {
            let (doc, secret) = require_secret(&tx, id).await?;
            let versions = tx.find(VERSIONS, "by_secret", &[json!(id)], None, crate::store::MAX_PAGE).await?;
            let mut history = Vec::new();
            for v in &versions.documents {
                let version: Version = serde_json::from_value(v.data.clone()).map_err(Refusal::internal)?;
                history.push(VersionView {
                    id: v.id.clone(),
                    number: version.number,
                    source: version.source,
                    created_at: version.created_at,
                    created_by: version.created_by,
                    kek_id: version.envelope.kek_id,
                });
            }
            history.sort_by_key(|v| std::cmp::Reverse(v.number));
            Ok(SecretDetail { secret: view(id, doc.revision, secret), version_history: history })
        })
        .await
}

async fn recipient(cx: Context, _: Call, _: crate::api::system::Empty) -> Result<Recipient> {
    use base64::Engine;
    let keyring = &cx.keyring;
    Ok(Recipient {
        recipient_id: keyring.ingress_id().into(),
        public_key: base64::engine::general_purpose::STANDARD.encode(keyring.ingress_public_key().as_bytes()),
        profile: ingress::PROFILE,
    })
}

/// The plaintext of a secret's current version, for the host's own use (delivery to agents,
/// system integrations). Never reachable from any API answer.
pub async fn open_current(store: &Store, keyring: &crate::keyring::Keyring, id: &str) -> Result<Zeroizing<Vec<u8>>> {
    let (secret, version_id, version) = store
        .transact(|tx| async move {
            let (_, secret) = require_secret(&tx, id).await?;
            let doc = tx.require(VERSIONS, &secret.current_version_id).await?;
            let version: Version = serde_json::from_value(doc.data).map_err(Refusal::internal)?;
            Ok((secret.clone(), secret.current_version_id.clone(), version))
        })
        .await?;
    envelope::open(keyring, &material_context(id, &version_id, &secret), &version.envelope)
}

/// The most versions one `secrets.rewrap` call re-wraps.
pub const MAX_REWRAP_PAGE: usize = 500;
const DEFAULT_REWRAP_PAGE: usize = 100;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RewrapInput {
    /// Continue after this version id (the `nextCursor` of the previous call).
    pub cursor: Option<String>,
    /// At most 500 versions per call (default 100).
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RewrapAnswer {
    /// Versions whose data key this call re-wrapped under the active KEK.
    pub rewrapped: u64,
    /// Versions already under the active KEK (nothing written).
    pub already_current: u64,
    /// The KEK every version of this page is now wrapped by.
    pub active_kek_id: String,
    /// Pass back as `cursor` to continue; `null` when every version has been seen.
    pub next_cursor: Option<String>,
}

/// Re-wrap one version's data key under the active KEK, in its own transaction, writing
/// against the revision read there. Whether it was written; the material is never decrypted.
async fn rewrap_version(store: &Store, keyring: &crate::keyring::Keyring, version_id: &str) -> Result<bool> {
    store
        .transact(|tx| async move {
            let Some(doc) = tx.get(VERSIONS, version_id).await? else { return Ok(false) };
            let mut version: Version = serde_json::from_value(doc.data.clone()).map_err(Refusal::internal)?;
            if version.envelope.kek_id == keyring.active_kek_id() {
                return Ok(false);
            }
            let (_, secret) = require_secret(&tx, &version.secret_id).await?;
            let context = material_context(&version.secret_id, version_id, &secret);
            let Some(moved) = envelope::rewrap(keyring, &context, &version.envelope).map_err(|mut refusal| {
                // name the version that cannot move, so the operator can find it
                let mut data = refusal.data.take().map(|d| *d).unwrap_or_else(|| json!({}));
                if let Some(map) = data.as_object_mut() {
                    map.insert("versionId".into(), json!(version_id));
                    map.insert("secretId".into(), json!(version.secret_id));
                }
                refusal.with_data(data)
            })?
            else {
                return Ok(false);
            };
            version.envelope = moved;
            tx.replace(VERSIONS, version_id, doc.revision, serde_json::to_value(&version).map_err(Refusal::internal)?).await?;
            Ok(true)
        })
        .await
}

/// `secrets.rewrap`: one page of versions (in id order after `cursor`), each re-wrapped under
/// the active KEK in its own transaction. Resumable: call again with `nextCursor` until null.
async fn rewrap(cx: Context, _: Call, input: RewrapInput) -> Result<RewrapAnswer> {
    let limit = input.limit.unwrap_or(DEFAULT_REWRAP_PAGE);
    if !(1..=MAX_REWRAP_PAGE).contains(&limit) {
        return Err(Refusal::invalid_request(format!("limit is 1–{MAX_REWRAP_PAGE}")).with_data(json!({ "field": "limit" })));
    }
    let cursor = input.cursor.as_deref();
    let page = cx.store.transact(|tx| async move { tx.scan(VERSIONS, cursor, limit).await }).await?;
    let keyring = &cx.keyring;
    let (mut rewrapped, mut already_current) = (0u64, 0u64);
    for doc in &page.documents {
        if rewrap_version(&cx.store, keyring, &doc.id).await? {
            rewrapped += 1;
        } else {
            already_current += 1;
        }
    }
    tracing::info!(rewrapped, already_current, kek = %keyring.active_kek_id(), more = page.next_cursor.is_some(), "secret versions re-wrapped");
    Ok(RewrapAnswer { rewrapped, already_current, active_kek_id: keyring.active_kek_id().into(), next_cursor: page.next_cursor })
}

/// What the secrets' methods reach: the store and the keyring.
#[derive(Clone)]
pub struct Context {
    pub store: Store,
    pub keyring: Arc<Keyring>,
}

pub fn register(registry: &mut Registry, cx: Context) {
    super::sets::register(registry, cx.clone());
    let mut registry = registry.with(cx);
    registry.add(
        "secrets.getIngressRecipient",
        "The X25519 public key and id values are sealed to before they are sent",
        Access::Authenticated,
        recipient,
    );
    registry.add(
        "secrets.create",
        "Create a secret with its first version, generated here or sealed to the ingress recipient; answers metadata only",
        Access::Admin,
        create,
    );
    registry.add(
        "secrets.rotate",
        "Add a new immutable version (generated or sealed) to a secret, stating the version read",
        Access::Admin,
        rotate,
    );
    registry.add("secrets.revoke", "Revoke a secret; its versions stay as history", Access::Admin, revoke);
    registry.add(
        "secrets.getManifest",
        "A service's newest resolved manifest: which secret version each key resolves to (value-free)",
        Access::Admin,
        |cx: Context, _: Call, input: ServiceRef| async move { super::manifests::current(&cx.store, &input.service_id).await },
    );
    registry.add("secrets.list", "Secrets' metadata, all or one owner's, paged", Access::Admin, list);
    registry.add("secrets.get", "One secret's metadata and version history (never a value)", Access::Admin, get);
    registry.add(
        "secrets.rewrap",
        "Re-wrap up to `limit` versions' data keys under the active KEK (never decrypting the material); resumable by cursor",
        Access::Admin,
        rewrap,
    );
}

#[cfg(test)]
mod rewrap_tests {
    use super::*;
    use crate::api::{Call, test_state};
    use serde_json::Value;
    use std::sync::Arc;

    const PLANTED: &str = "hunter2-planted-rewrap-value";

    async fn call(state: &crate::api::AppState, admin: &crate::auth::Identity, method: &str, body: Value) -> Result<Value> {
        let m = state.methods.get(method).unwrap();
        let result = m.call(Call::by(admin), body).await;
        let shown = match &result {
            Ok(v) => v.to_string(),
            Err(e) => format!("{} {} {:?} {:?}", e.code, e.message, e.data, e.detail),
        };
        assert!(!shown.contains(PLANTED), "{method} showed the value: {shown}");
        result
    }

    async fn all_versions(store: &Store) -> Vec<(String, Version)> {
        store
            .transact(|tx| async move { tx.scan(VERSIONS, None, 1000).await })
            .await
            .unwrap()
            .documents
            .into_iter()
            .map(|d| (d.id, serde_json::from_value(d.data).unwrap()))
            .collect()
    }

    #[tokio::test]
    async fn rewrap_moves_every_version_to_the_new_kek_in_resumable_pages_and_all_still_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = test_state(dir.path()).await;
        crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", "a-long-enough-admin-password").await.unwrap();
        let answer = state.auth.login("admin", "a-long-enough-admin-password", None).await.unwrap();
        let admin = state.auth.authenticate(&answer.token).await.unwrap();
        let org = call(&state, &admin, "organizations.create", json!({"name": "acme"})).await.unwrap();
        let svc =
            call(&state, &admin, "services.create", json!({"name": "web", "organizationId": org["id"], "image": "nginx"})).await.unwrap();
        let owner_ref = format!("service:{}", svc["id"].as_str().unwrap());
        let sealed = ingress::seal_to(
            state.keyring.ingress_id(),
            state.keyring.ingress_public_key(),
            &ingress::target("secrets.create", &owner_ref, "DB_PASSWORD"),
            PLANTED.as_bytes(),
        );
        let owner = json!({"kind": "service", "serviceId": svc["id"]});
        let db = call(&state, &admin, "secrets.create", json!({"owner": owner, "key": "DB_PASSWORD", "value": {"sealed": sealed}}))
            .await
            .unwrap();
        let generate = json!({"generate": {"length": 24, "alphabet": "hex"}});
        let api = call(&state, &admin, "secrets.create", json!({"owner": owner, "key": "API_TOKEN", "value": generate})).await.unwrap();
        call(&state, &admin, "secrets.rotate", json!({"id": api["id"], "expectedVersionId": api["currentVersionId"], "value": generate}))
            .await
            .unwrap();
        let system = json!({"kind": "system", "systemId": "gateway"});
        let gateway =
            call(&state, &admin, "secrets.create", json!({"owner": system, "key": "GATEWAY_TOKEN", "value": generate})).await.unwrap();
        call(&state, &admin, "secrets.revoke", json!({"id": gateway["id"]})).await.unwrap();
        let old_kek = state.keyring.active_kek_id().to_string();
        let before = all_versions(&state.store).await;
        assert_eq!(before.len(), 4);
        assert!(before.iter().all(|(_, v)| v.envelope.kek_id == old_kek));

        // nothing to move while the sealing KEK is the active one
        let idle = call(&state, &admin, "secrets.rewrap", json!({})).await.unwrap();
        assert_eq!(idle, json!({"rewrapped": 0, "alreadyCurrent": 4, "activeKekId": old_kek, "nextCursor": null}));

        // the keyring rotates (as `capstan keyring rotate` and a restart do)
        let rotated = Arc::new(state.keyring.with_new_active_kek(Some("kek-rotated")).unwrap());
        state = state.with_keyring(rotated);
        assert_eq!(&**open_current(&state.store, &state.keyring, db["id"].as_str().unwrap()).await.unwrap(), PLANTED.as_bytes());

        // pages of 3: resumable by cursor until it is null
        let (mut cursor, mut rewrapped, mut pages) = (Value::Null, 0, 0);
        loop {
            let page = call(&state, &admin, "secrets.rewrap", json!({"cursor": cursor, "limit": 3})).await.unwrap();
            assert_eq!(page["activeKekId"], "kek-rotated");
            rewrapped += page["rewrapped"].as_u64().unwrap();
            pages += 1;
            cursor = page["nextCursor"].clone();
            if cursor.is_null() {
                break;
            }
        }
        assert_eq!((rewrapped, pages), (4, 2));

        let after = all_versions(&state.store).await;
        for ((id, old), (_, new)) in before.iter().zip(&after) {
            assert_eq!(new.envelope.kek_id, "kek-rotated", "{id}");
            assert_eq!(new.envelope.ciphertext, old.envelope.ciphertext, "the material itself is not touched");
            let doc = state.store.transact(|tx| async move { require_secret(&tx, &new.secret_id).await }).await.unwrap().1;
            let opened = envelope::open(&state.keyring, &material_context(&new.secret_id, id, &doc), &new.envelope).unwrap();
            let was = envelope::open(&state.keyring, &material_context(&old.secret_id, id, &doc), &old.envelope).unwrap();
            assert_eq!(opened, was, "{id} still opens to the same value");
        }
        assert_eq!(&**open_current(&state.store, &state.keyring, db["id"].as_str().unwrap()).await.unwrap(), PLANTED.as_bytes());
        let detail = call(&state, &admin, "secrets.get", json!({"id": api["id"]})).await.unwrap();
        assert!(detail["versionHistory"].as_array().unwrap().iter().all(|v| v["kekId"] == "kek-rotated"), "{detail}");

        // a second pass finds everything current and writes nothing
        let again = call(&state, &admin, "secrets.rewrap", json!({"limit": 500})).await.unwrap();
        assert_eq!((again["rewrapped"].as_u64(), again["alreadyCurrent"].as_u64()), (Some(0), Some(4)));
        for limit in [0, 501] {
            let err = call(&state, &admin, "secrets.rewrap", json!({"limit": limit})).await.unwrap_err();
            assert_eq!(err.code, "invalid-request");
        }
        let err = call(&state, &admin, "secrets.rewrap", json!({"extra": PLANTED})).await.unwrap_err();
        assert_eq!(err.code, "invalid-request");
    }
}
