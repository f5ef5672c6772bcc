//! A cluster relay's credential (`relays.*`): the bearer a cluster's relay authenticates with,
//! one generation at a time.
//!
//! The bearer is the system secret `CAPSTAN_CLUSTER_RELAY_AUTHORIZATION` owned by
//! `system:cluster-relay:<clusterId>` under the management scope
//! `system:cluster-relay:<clusterId>`: a version of it is written, sealed under the keyring like
//! every other secret, in the same transaction that advances the credential's generation, so a
//! generation Capstan accepts is always one whose bearer it holds. The credential record keeps
//! only the SHA-256 of each bearer it issued; answers carry `{id, generation, digest}` and never
//! the bearer. Rotation has no overlap: from its commit, the previous generation's bearer is
//! refused `relay-credential-generation-stale` by [`verify`], which the relay's registration on
//! the socket calls. The one way the bearer leaves is `relays.exportAuthorization`, which
//! `capstan keyring export-relay-authorization` calls to write it to a private file; every
//! export leaves a receipt (who, which credential and generation, when — never the bearer).

use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::emit;
use capstan_rpc::{Access, Call, Registry, receipts};
use capstan_secrets::envelope;
use capstan_secrets::methods::{Context, Owner, SECRETS, Secret, State, VERSIONS, Version, material_context, parse_secret};
use capstan_store::{CollectionSpec, Store, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// One credential record per cluster, keyed by the cluster's id.
pub const CREDENTIALS: &str = "cluster_relay_credentials";
/// One receipt per answered export.
pub const EXPORTS: &str = "cluster_relay_authorization_exports";
/// The system secret's key.
pub const SECRET_KEY: &str = "CAPSTAN_CLUSTER_RELAY_AUTHORIZATION";
/// Bytes of randomness in a bearer (written as 43 base64url characters).
const BEARER_BYTES: usize = 32;

/// Declare the credential and export-receipt collections.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(CollectionSpec::new(CREDENTIALS)).await?;
    store.declare(CollectionSpec::new(EXPORTS).index("by_cluster", &["clusterId"])).await?;
    crate::registrations::declare(store).await
}

/// The system id owning a cluster's relay bearer, which is also its management scope's tail.
pub fn system_id(cluster_id: &str) -> String {
    format!("cluster-relay:{cluster_id}")
}

/// The management scope of a cluster's relay bearer.
pub fn scope(cluster_id: &str) -> String {
    format!("system:{}", system_id(cluster_id))
}

/// A generation's bearer, by hash only.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Issued {
    generation: u64,
    sha256: String,
}

/// The stored credential of one cluster's relay.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    cluster_id: String,
    id: String,
    generation: u64,
    /// SHA-256 (hex) of the current generation's bearer.
    sha256: String,
    /// The secret holding the bearer, and the version this generation wrote.
    secret_id: String,
    version_id: String,
    created_at: u64,
    updated_at: u64,
    updated_by: String,
    /// The hashes of the earlier generations, so a stale bearer is told apart from a wrong one.
    #[serde(default)]
    previous: Vec<Issued>,
}

/// A relay credential as every answer carries it: never the bearer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialRef {
    /// The credential's id (stable across generations).
    pub id: String,
    /// Starts at 1; each rotation advances it by one.
    pub generation: u64,
    /// SHA-256 (hex) over the cluster, the id and the generation — a reference a later
    /// citation must match, never derived from the bearer.
    pub digest: String,
}

impl Record {
    fn reference(&self) -> CredentialRef {
        let digest = reference_digest(b"capstan-cluster-relay-credential-v1", &self.cluster_id, &self.id, self.generation);
        CredentialRef { id: self.id.clone(), generation: self.generation, digest }
    }
}

/// Every bearer hash a stored credential record issued, with its generation (unreadable records
/// yield none).
pub(crate) fn issued_hashes(record: &serde_json::Value) -> Vec<(u64, String)> {
    let Ok(record) = serde_json::from_value::<Record>(record.clone()) else { return Vec::new() };
    let mut issued: Vec<(u64, String)> = record.previous.into_iter().map(|i| (i.generation, i.sha256)).collect();
    issued.push((record.generation, record.sha256));
    issued
}

/// SHA-256 (hex) over a purpose, a cluster, a record id and a generation: the digest a
/// reference to one generation of a relay record carries (never derived from a secret).
pub(crate) fn reference_digest(purpose: &[u8], cluster_id: &str, id: &str, generation: u64) -> String {
    let mut h = Sha256::new();
    for part in [purpose, cluster_id.as_bytes(), id.as_bytes()] {
        h.update(part);
        h.update(b"\0");
    }
    h.update(generation.to_string().as_bytes());
    hex::encode(h.finalize())
}

/// What `relays.mutateCredential` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    /// Mint generation 1 when the cluster has no credential; otherwise answer the current one.
    Ensure,
    /// Replace the bearer with a new generation; `expectedGeneration` must be the current one.
    Rotate,
}

/// Input of `relays.mutateCredential`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MutateInput {
    /// The cluster whose relay credential changes.
    pub cluster_id: String,
    /// `ensure` or `rotate`.
    pub action: Action,
    /// `rotate`: the exact current generation (never a minimum). `ensure`: when given, the
    /// existing credential must be at it; null or absent to mint.
    pub expected_generation: Option<u64>,
    /// Repeating the same request with this id answers the first answer again, changing nothing;
    /// the same id over another request is refused `conflict`.
    pub mutation_id: String,
}

/// Answer of `relays.mutateCredential` and `relays.getCredential`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialView {
    /// The cluster.
    pub cluster_id: String,
    /// The credential's id.
    pub id: String,
    /// Its current generation.
    pub generation: u64,
    /// Its reference digest (never derived from the bearer).
    pub digest: String,
    /// When the current generation was issued (milliseconds since the epoch).
    pub updated_at: u64,
    /// True when this answer is a `mutationId` replay.
    #[serde(default)]
    pub replayed: bool,
}

fn view(record: &Record) -> CredentialView {
    let reference = record.reference();
    CredentialView {
        cluster_id: record.cluster_id.clone(),
        id: reference.id,
        generation: reference.generation,
        digest: reference.digest,
        updated_at: record.updated_at,
        replayed: false,
    }
}

/// Input naming one cluster.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterRef {
    /// The cluster's id.
    pub cluster_id: String,
}

/// Answer of `relays.getCredential`: metadata only.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialState {
    /// The cluster.
    pub cluster_id: String,
    /// The credential; null while none was minted.
    pub credential: Option<CredentialView>,
}

/// Input of `relays.exportAuthorization`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExportInput {
    /// The cluster whose relay bearer is exported.
    pub cluster_id: String,
    /// The generation the operator means to hand over; another current generation is refused
    /// `relay-credential-generation-mismatch`.
    pub expected_generation: u64,
}

/// Answer of `relays.exportAuthorization`: the bearer, for the CLI to write to a private file.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Exported {
    /// The cluster.
    pub cluster_id: String,
    /// The credential exported.
    pub credential: CredentialRef,
    /// The bearer itself (UTF-8, base64url).
    pub authorization: String,
    /// The export's receipt.
    pub receipt_id: String,
}

impl std::fmt::Debug for Exported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exported").field("cluster_id", &self.cluster_id).field("credential", &self.credential).finish_non_exhaustive()
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Equality whose time depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

fn new_bearer() -> Zeroizing<Vec<u8>> {
    use base64::Engine;
    let raw: Zeroizing<[u8; BEARER_BYTES]> = Zeroizing::new(rand::random());
    Zeroizing::new(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw.as_slice()).into_bytes())
}

fn absent(cluster_id: &str) -> Refusal {
    Refusal::new("relay-credential-absent", format!("the cluster {cluster_id} has no relay credential: ensure one first"))
        .with_data(json!({ "clusterId": cluster_id }))
}

async fn read_record(tx: &Tx, cluster_id: &str) -> Result<Option<(u64, Record)>> {
    if capstan_store::validate_id(cluster_id).is_err() {
        return Ok(None);
    }
    match tx.get(CREDENTIALS, cluster_id).await? {
        Some(doc) => {
            let record: Record =
                serde_json::from_value(doc.data).map_err(|e| Refusal::internal(format!("stored relay credential: {e}")))?;
            Ok(Some((doc.revision, record)))
        }
        None => Ok(None),
    }
}

/// Write `bearer` as the next version of the cluster's relay secret (creating it for the first
/// generation), sealed under the keyring, in `tx`. The secret and version ids written.
async fn deliver(
    cx: &Context,
    tx: &Tx,
    cluster_id: &str,
    actor: &str,
    bearer: &[u8],
    current: Option<&Record>,
) -> Result<(String, String)> {
    let owner = Owner::System { system_id: system_id(cluster_id) };
    let owner_ref = owner.reference();
    let found = tx.find(SECRETS, "by_owner_key", &[json!(owner_ref), json!(SECRET_KEY), json!("production")], None, 1).await?;
    let existing = found.documents.into_iter().next();
    let at = now_ms();
    let version_id = capstan_core::ids::new_id("ver");
    let (secret_id, secret, revision) = match (existing, current) {
        (None, None) => {
            let secret = Secret {
                owner,
                owner_ref,
                organization_id: String::new(),
                key: SECRET_KEY.into(),
                environment: "production".into(),
                management_scope: Some(scope(cluster_id)),
                state: State::Active,
                current_version_id: version_id.clone(),
                versions: 1,
                created_at: at,
                updated_at: at,
                revoked_at: None,
                generated: None,
            };
            (capstan_core::ids::new_id("sec"), secret, None)
        }
        (Some(doc), Some(record)) if doc.id == record.secret_id => {
            let mut secret = parse_secret(&doc)?;
            // a rotation names the exact version the credential delivered
            if secret.current_version_id != record.version_id || secret.state != State::Active {
                return Err(Refusal::new(
                    "relay-authorization-ambiguous",
                    "the relay's secret moved outside its credential: it is not rotated over",
                )
                .with_data(json!({ "clusterId": cluster_id, "secretId": doc.id })));
            }
            secret.versions += 1;
            secret.current_version_id = version_id.clone();
            secret.updated_at = at;
            (doc.id, secret, Some(doc.revision))
        }
        (Some(doc), _) => {
            // a mint requires the secret to be absent; a rotation its own secret
            return Err(Refusal::new("relay-authorization-ambiguous", "a relay secret exists that no credential of this cluster names")
                .with_data(json!({ "clusterId": cluster_id, "secretId": doc.id })));
        }
        (None, Some(_)) => {
            return Err(Refusal::new("relay-authorization-missing", "the relay credential's secret is gone")
                .with_data(json!({ "clusterId": cluster_id })));
        }
    };
    let sealed = envelope::seal(&cx.keyring, &material_context(&secret_id, &version_id, &secret), bearer)?;
    let version = Version {
        secret_id: secret_id.clone(),
        number: secret.versions,
        source: "generated".into(),
        created_at: at,
        created_by: actor.into(),
        envelope: sealed,
    };
    tx.insert(VERSIONS, &version_id, serde_json::to_value(&version).map_err(Refusal::internal)?).await?;
    let data = serde_json::to_value(&secret).map_err(Refusal::internal)?;
    let event = json!({ "id": secret_id, "owner": secret.owner_ref, "key": secret.key, "environment": secret.environment, "versionId": version_id, "state": secret.state });
    match revision {
        None => {
            tx.insert(SECRETS, &secret_id, data).await?;
            emit(tx, "secret.created", &secret_id, event).await?;
        }
        Some(revision) => {
            tx.replace(SECRETS, &secret_id, revision, data).await?;
            emit(tx, "secret.rotated", &secret_id, event).await?;
        }
    }
    Ok((secret_id, version_id))
}

/// `relays.mutateCredential`.
pub async fn mutate(cx: Context, call: Call, input: MutateInput) -> Result<CredentialView> {
    let receipt_keys = &capstan_auth::receipt_keys(&cx.keyring);
    let identity = call.identity()?.clone();
    receipts::check_mutation_id(&input.mutation_id)?;
    let bearer = new_bearer();
    let (cx_ref, input, actor, bearer) = (&cx, &input, identity.user_id.as_str(), &bearer);
    let answer = cx
        .store
        .transact(|tx| async move {
            let mutation = Some(input.mutation_id.as_str());
            let request = ("relays.mutateCredential", input);
            if let Some(mut answer) = receipts::replay::<CredentialView>(&tx, receipt_keys, actor, mutation, &request).await? {
                answer.replayed = true;
                return Ok(answer);
            }
            capstan_inventory::clusters::require_cluster(&tx, &input.cluster_id).await?;
            let current = read_record(&tx, &input.cluster_id).await?;
            let generation_refusal = |generation: u64| {
                Refusal::new(
                    "relay-credential-generation-mismatch",
                    format!("the relay credential is at generation {generation}, not {:?}: read it again", input.expected_generation),
                )
                .with_data(json!({ "clusterId": input.cluster_id, "generation": generation }))
            };
            let at = now_ms();
            let record = match (input.action, current) {
                (Action::Ensure, Some((_, record))) => {
                    if input.expected_generation.is_some_and(|g| g != record.generation) {
                        return Err(generation_refusal(record.generation));
                    }
                    record
                }
                (Action::Ensure, None) => {
                    if input.expected_generation.is_some_and(|g| g != 0) {
                        return Err(absent(&input.cluster_id));
                    }
                    let (secret_id, version_id) = deliver(cx_ref, &tx, &input.cluster_id, actor, bearer, None).await?;
                    let record = Record {
                        cluster_id: input.cluster_id.clone(),
                        id: capstan_core::ids::new_id("rcr"),
                        generation: 1,
                        sha256: sha256_hex(bearer),
                        secret_id,
                        version_id,
                        created_at: at,
                        updated_at: at,
                        updated_by: actor.into(),
                        previous: Vec::new(),
                    };
                    tx.insert(CREDENTIALS, &input.cluster_id, serde_json::to_value(&record).map_err(Refusal::internal)?).await?;
                    crate::registrations::record_bearer(&tx, &input.cluster_id, 1, bearer).await?;
                    emit(
                        &tx,
                        "relay.credentialIssued",
                        &input.cluster_id,
                        json!({ "clusterId": input.cluster_id, "credential": record.reference() }),
                    )
                    .await?;
                    record
                }
                (Action::Rotate, None) => return Err(absent(&input.cluster_id)),
                (Action::Rotate, Some((revision, record))) => {
                    if input.expected_generation != Some(record.generation) {
                        return Err(generation_refusal(record.generation));
                    }
                    let (secret_id, version_id) = deliver(cx_ref, &tx, &input.cluster_id, actor, bearer, Some(&record)).await?;
                    let mut next = record.clone();
                    next.previous.push(Issued { generation: record.generation, sha256: record.sha256.clone() });
                    next.generation += 1;
                    next.sha256 = sha256_hex(bearer);
                    (next.secret_id, next.version_id) = (secret_id, version_id);
                    (next.updated_at, next.updated_by) = (at, actor.into());
                    tx.replace(CREDENTIALS, &input.cluster_id, revision, serde_json::to_value(&next).map_err(Refusal::internal)?).await?;
                    crate::registrations::record_bearer(&tx, &input.cluster_id, next.generation, bearer).await?;
                    emit(
                        &tx,
                        "relay.credentialRotated",
                        &input.cluster_id,
                        json!({ "clusterId": input.cluster_id, "credential": next.reference() }),
                    )
                    .await?;
                    next
                }
            };
            let answer = view(&record);
            receipts::record(&tx, receipt_keys, actor, mutation, &request, &answer).await?;
            Ok(answer)
        })
        .await?;
    tracing::info!(cluster = %answer.cluster_id, generation = answer.generation, replayed = answer.replayed, "relay credential mutated");
    Ok(answer)
}

/// `relays.getCredential`.
async fn get(cx: Context, _: Call, input: ClusterRef) -> Result<CredentialState> {
    let id = input.cluster_id.as_str();
    cx.store
        .transact(|tx| async move {
            capstan_inventory::clusters::require_cluster(&tx, id).await?;
            let credential = read_record(&tx, id).await?.map(|(_, record)| view(&record));
            Ok(CredentialState { cluster_id: id.into(), credential })
        })
        .await
}

/// What [`verify`] accepted: the credential and generation the presented bearer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The cluster.
    pub cluster_id: String,
    /// The credential at the generation the bearer was issued for.
    pub credential: CredentialRef,
}

/// Judge a bearer a relay presents for `cluster_id`: the current generation's bearer is
/// accepted; an earlier generation's is `relay-credential-generation-stale` (rotation has no
/// overlap); anything else is `relay-credential-invalid`, and a cluster without a credential
/// `relay-credential-absent`. Compared in constant time over SHA-256 digests; the refusals
/// never carry the bearer.
pub async fn verify_in(tx: &Tx, cluster_id: &str, presented: &[u8]) -> Result<Verified> {
    let Some((_, record)) = read_record(tx, cluster_id).await? else { return Err(absent(cluster_id)) };
    let presented = Sha256::digest(presented);
    let matches = |stored: &str| hex::decode(stored).is_ok_and(|stored| constant_time_eq(&stored, &presented));
    if matches(&record.sha256) {
        return Ok(Verified { cluster_id: cluster_id.into(), credential: record.reference() });
    }
    // every earlier hash is compared, so the time says nothing about which one matched
    let stale = record.previous.iter().fold(false, |found, issued| matches(&issued.sha256) | found);
    if stale {
        return Err(Refusal::new(
            "relay-credential-generation-stale",
            format!("this relay credential was replaced: the cluster's relay credential is at generation {}", record.generation),
        )
        .with_data(json!({ "clusterId": cluster_id, "generation": record.generation })));
    }
    Err(Refusal::new("relay-credential-invalid", "the presented relay credential is not this cluster's")
        .with_data(json!({ "clusterId": cluster_id })))
}

/// [`verify_in`] in a transaction of its own.
pub async fn verify(store: &Store, cluster_id: &str, presented: &[u8]) -> Result<Verified> {
    store.transact(|tx| async move { verify_in(&tx, cluster_id, presented).await }).await
}

/// The deleted cluster's credential record goes, and the secret holding its bearer is revoked
/// (in the deleting transaction; docs/relays.md).
pub(crate) async fn credential_removed(tx: &Tx, cluster_id: &str) -> Result<()> {
    if let Some((revision, _)) = read_record(tx, cluster_id).await? {
        tx.delete(CREDENTIALS, cluster_id, revision).await?;
    }
    capstan_secrets::methods::revoke_owned(tx, &Owner::System { system_id: system_id(cluster_id) }).await
}

/// `relays.exportAuthorization`: the bearer of the exact expected generation, read from the
/// version the credential delivered and proved against the hash it issued, after a receipt is
/// written. Nothing here logs the bearer.
async fn export(cx: Context, call: Call, input: ExportInput) -> Result<Exported> {
    let actor = call.identity()?.user_id.clone();
    let (input, actor_ref) = (&input, actor.as_str());
    let (record, secret, version) = cx
        .store
        .transact(|tx| async move {
            capstan_inventory::clusters::require_cluster(&tx, &input.cluster_id).await?;
            let Some((_, record)) = read_record(&tx, &input.cluster_id).await? else { return Err(absent(&input.cluster_id)) };
            if record.generation != input.expected_generation {
                return Err(Refusal::new(
                    "relay-credential-generation-mismatch",
                    format!("the relay credential is at generation {}, not {}", record.generation, input.expected_generation),
                )
                .with_data(json!({ "clusterId": input.cluster_id, "generation": record.generation })));
            }
            let missing = || {
                Refusal::new("relay-authorization-missing", "the version this relay credential delivered is gone")
                    .with_data(json!({ "clusterId": input.cluster_id }))
            };
            let doc = tx.get(SECRETS, &record.secret_id).await?.ok_or_else(missing)?;
            let secret = parse_secret(&doc)?;
            if secret.state != State::Active || secret.current_version_id != record.version_id {
                return Err(Refusal::new("relay-authorization-ambiguous", "the relay's secret moved outside its credential")
                    .with_data(json!({ "clusterId": input.cluster_id })));
            }
            let version = tx.get(VERSIONS, &record.version_id).await?.ok_or_else(missing)?;
            let version: Version = serde_json::from_value(version.data).map_err(Refusal::internal)?;
            Ok((record, secret, version))
        })
        .await?;
    let bearer = envelope::open(&cx.keyring, &material_context(&record.secret_id, &record.version_id, &secret), &version.envelope)?;
    if !constant_time_eq(&Sha256::digest(&*bearer), &hex::decode(&record.sha256).unwrap_or_default()) {
        return Err(Refusal::new("relay-authorization-ambiguous", "the delivered version is not the bearer this generation issued")
            .with_data(json!({ "clusterId": input.cluster_id })));
    }
    let authorization = String::from_utf8(bearer.to_vec()).map_err(|_| Refusal::internal("a relay bearer is not UTF-8"))?;
    let receipt_id = capstan_core::ids::new_id("rex");
    let reference = record.reference();
    let (receipt_ref, reference_ref) = (&receipt_id, &reference);
    cx.store
        .transact(|tx| async move {
            // fenced: the credential must still be at the exported generation when the receipt commits
            match read_record(&tx, &input.cluster_id).await? {
                Some((_, now)) if now.generation == reference_ref.generation => {}
                _ => {
                    return Err(Refusal::new("relay-credential-generation-mismatch", "the relay credential moved during the export")
                        .with_data(json!({ "clusterId": input.cluster_id })));
                }
            }
            let receipt = json!({ "clusterId": input.cluster_id, "credential": reference_ref, "exportedBy": actor_ref, "at": now_ms() });
            tx.insert(EXPORTS, receipt_ref, receipt).await?;
            emit(
                &tx,
                "relay.authorizationExported",
                &input.cluster_id,
                json!({ "clusterId": input.cluster_id, "credential": reference_ref, "receiptId": receipt_ref }),
            )
            .await
        })
        .await?;
    tracing::info!(cluster = %input.cluster_id, generation = reference.generation, receipt = %receipt_id, "relay authorization exported");
    Ok(Exported { cluster_id: input.cluster_id.clone(), credential: reference, authorization, receipt_id })
}

/// Register the `relays.*` credential methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry.add(
        "relays.mutateCredential",
        "Ensure (mint generation 1) or rotate (exact expectedGeneration, no overlap) a cluster relay's credential; answers {id, generation, digest}, never the bearer",
        Access::Admin,
        mutate,
    ).refuses(&["mutation-reused", "cluster-not-found", "relay-credential-generation-mismatch", "relay-credential-absent", "relay-authorization-ambiguous", "relay-authorization-missing"]);
    registry
        .add(
            "relays.getCredential",
            "A cluster relay credential's metadata (never the bearer); null while none was minted",
            Access::Admin,
            get,
        )
        .refuses(&["cluster-not-found"])
        .read_only();
    registry.add(
        "relays.exportAuthorization",
        "The relay bearer of the exact expected generation, for `capstan keyring export-relay-authorization` to write to a private file; every export leaves a receipt",
        Access::Admin,
        export,
    ).refuses(&["cluster-not-found", "relay-credential-absent", "relay-credential-generation-mismatch", "relay-authorization-missing", "relay-authorization-ambiguous", "material-not-readable", "kek-unavailable"]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_whole_slices() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn bearers_are_43_base64url_characters_and_distinct() {
        let (a, b) = (new_bearer(), new_bearer());
        assert_eq!(a.len(), 43);
        assert!(a.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'));
        assert_ne!(*a, *b);
    }
}
