//! Pull credentials: what a node's agent hands its container engine to pull one service's image
//! for one assignment (one attempt to run a replica on a node), never a person's password.
//!
//! [`issue`] mints a credential for one repository and one holder (the assignment's id), valid
//! for at most [`MAX_TTL`]: the username `capstan-pull.<credential id>` names it without
//! revealing anything, the password is a random secret (`capstan_pull_…`) of which only the
//! SHA-256 is stored, in [`PULL_CREDENTIALS`]. The engine sends both to `GET /v2/token` as HTTP
//! Basic ([`exchange`] verifies them: the record present, the digest equal in constant time, not
//! expired); the answer's bearer is the secret itself, recognised by its prefix where `/v2` turns
//! a bearer into a caller ([`bearer_grant`]), and checked against the store on every request, so
//! [`revoke`] (the assignment ended) and expiry end it at once. What it grants is a [`Grant`]:
//! `GET`/`HEAD` of manifests and blobs in its one repository, nothing else. [`sweep`] drops the
//! records whose expiry passed.
//!
//! Nothing here logs or answers a secret: log lines name the credential id and the repository.

use crate::access::Action;
use capstan_core::refusal::{Refusal, Result};
use capstan_store::{CollectionSpec, Document, Store};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// The pull credentials (id = the credential's id, `pcr_…`): only the SHA-256 of each secret.
pub const PULL_CREDENTIALS: &str = "registry_pull_credentials";
/// The longest a pull credential lives.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// What every pull credential's username starts with; the credential's id follows.
pub const USERNAME_PREFIX: &str = "capstan-pull.";
/// What every pull credential's secret (its password, and the bearer `/v2/token` answers)
/// starts with.
pub const SECRET_PREFIX: &str = "capstan_pull_";
/// The prefix of a credential's id.
const ID_PREFIX: &str = "pcr";
/// Longest holder (an assignment's id) taken.
const MAX_HOLDER: usize = 128;

/// The collections of pull credentials.
pub fn collections() -> Vec<CollectionSpec> {
    vec![CollectionSpec::new(PULL_CREDENTIALS).index("by_holder", &["holder"]).unique("by_secret_hash", &["secretHash"])]
}

/// A stored pull credential: never its secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// The one repository it pulls from.
    repository: String,
    /// Whom it was issued for (an assignment's id).
    holder: String,
    /// SHA-256 (hex) of the secret.
    secret_hash: String,
    /// When it was issued (milliseconds since the epoch).
    issued_at: u64,
    /// When it stops being accepted (milliseconds since the epoch): accepted while now is before it.
    expires_at: u64,
}

/// A pull credential's secret: its `Debug` never prints it, and its bytes are overwritten when
/// it is dropped. Read it with [`PullSecret::expose`], only to hand it on.
pub struct PullSecret(String);

impl PullSecret {
    /// The secret, to hand to the container engine.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for PullSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PullSecret([redacted])")
    }
}

impl Drop for PullSecret {
    fn drop(&mut self) {
        let mut bytes = std::mem::take(&mut self.0).into_bytes();
        bytes.fill(0);
        // the zeroes are read, so the writes are not optimised away
        std::hint::black_box(&bytes);
    }
}

/// What the agent hands its engine (the engine sends it to `/v2/token` as HTTP Basic).
#[derive(Debug)]
pub struct PullCredential {
    /// `capstan-pull.<credential id>`: names the credential, reveals nothing.
    pub username: String,
    /// The secret (`capstan_pull_…`); `Debug` never prints it.
    pub password: PullSecret,
    /// When it stops being accepted (milliseconds since the epoch).
    pub expires_at: u64,
}

impl PullCredential {
    /// The credential's id (`pcr_…`), what log lines name.
    pub fn id(&self) -> &str {
        credential_id(&self.username).unwrap_or_default()
    }
}

/// What a verified pull credential allows: `GET`/`HEAD` of manifests and blobs in its one
/// repository, until it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The credential's id.
    pub credential_id: String,
    /// The one repository it pulls from.
    pub repository: String,
    /// When it stops being accepted (milliseconds since the epoch).
    pub expires_at: u64,
}

impl Grant {
    /// Whether `action` in `repository` is this grant's: a pull of its own repository only.
    /// (Which pulls — manifests and blobs, not tags or referrers — the routes judge.)
    pub fn allows(&self, repository: &str, action: Action) -> bool {
        action == Action::Pull && repository == self.repository
    }
}

/// The credential id a pull username names, if it is one's (`capstan-pull.pcr_<32 hex>`).
pub fn credential_id(username: &str) -> Option<&str> {
    let id = username.strip_prefix(USERNAME_PREFIX)?;
    let hex = id.strip_prefix(ID_PREFIX)?.strip_prefix('_')?;
    (hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(id)
}

/// Whether `secret` has the form of a pull credential's secret (its prefix): where `/v2` and
/// `/v2/token` tell it from a session or a machine token.
pub fn is_pull_secret(secret: &str) -> bool {
    secret.starts_with(SECRET_PREFIX)
}

/// Whether `secret` is shaped as [`issue`] mints them (the prefix and 64 lowercase hex digits):
/// anything else is denied without a look in the store.
fn well_formed(secret: &str) -> bool {
    secret.strip_prefix(SECRET_PREFIX).is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

fn sha256(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Equality whose time depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// A new secret: 244 bits from the cryptographic random source v4 UUIDs are drawn from (two of
/// them, as `capstan_core::ids` draws ids), as 64 hex digits after the prefix.
fn new_secret() -> PullSecret {
    PullSecret(format!("{SECRET_PREFIX}{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple()))
}

fn parse(doc: &Document) -> Result<Record> {
    serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("stored pull credential {} is malformed: {e}", doc.id)))
}

/// Issue a credential for pulling `repository` (as the registry names a service's repository)
/// for `holder` (an assignment's id), valid for `ttl`: 1 second to [`MAX_TTL`]
/// (`pull-credential-ttl-invalid` otherwise). Only the SHA-256 of its secret is stored.
pub async fn issue(store: &Store, repository: &str, holder: &str, ttl: Duration) -> Result<PullCredential> {
    let mut issued = issue_many(store, &[(repository, holder)], ttl).await?;
    issued.pop().ok_or_else(|| Refusal::internal("no pull credential was issued"))
}

/// Issue one credential per `(repository, holder)`, in order, in one transaction: a delivery
/// pass pushing many assignments writes their credentials together rather than one
/// transaction each. Refused whole when any pair is.
pub async fn issue_many(store: &Store, wanted: &[(&str, &str)], ttl: Duration) -> Result<Vec<PullCredential>> {
    if ttl.as_secs() == 0 || ttl > MAX_TTL {
        return Err(Refusal::new("pull-credential-ttl-invalid", "a pull credential lives from 1 second to 1 hour")
            .with_data(json!({ "ttlSecs": ttl.as_secs(), "maxSecs": MAX_TTL.as_secs() })));
    }
    let issued_at = capstan_core::clock::now_ms();
    let mut minted = Vec::with_capacity(wanted.len());
    for (repository, holder) in wanted {
        if crate::names::check_name(repository).is_err() {
            return Err(Refusal::new("registry-name-invalid", "a pull credential names a valid repository")
                .with_data(json!({ "repository": crate::text(repository) })));
        }
        if holder.is_empty() || holder.len() > MAX_HOLDER || !holder.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Refusal::new("pull-credential-holder-invalid", "a pull credential's holder is 1 to 128 visible ASCII characters")
                .with_data(json!({ "holder": crate::text(holder) })));
        }
        let secret = new_secret();
        let record = Record {
            repository: repository.to_string(),
            holder: holder.to_string(),
            secret_hash: hex::encode(sha256(secret.expose())),
            issued_at,
            expires_at: issued_at + capstan_core::clock::millis(ttl),
        };
        minted.push((capstan_core::ids::new_id(ID_PREFIX), secret, record));
    }
    let rows = minted
        .iter()
        .map(|(id, _, record)| Ok((id.as_str(), serde_json::to_value(record).map_err(Refusal::internal)?)))
        .collect::<Result<Vec<_>>>()?;
    let rows = &rows;
    store
        .transact(|tx| async move {
            for (id, data) in rows {
                tx.insert(PULL_CREDENTIALS, id, data.clone()).await?;
            }
            Ok(())
        })
        .await?;
    Ok(minted
        .into_iter()
        .map(|(id, secret, record)| {
            tracing::info!(credential = %id, repository = %record.repository, expires_at = record.expires_at, "pull credential issued");
            PullCredential { username: format!("{USERNAME_PREFIX}{id}"), password: secret, expires_at: record.expires_at }
        })
        .collect())
}

/// Revoke every credential issued for `holder` (an assignment that ended): from the commit, its
/// credentials and the bearers answered for them are refused.
pub async fn revoke(store: &Store, holder: &str) -> Result<()> {
    let revoked = store
        .transact(|tx| async move {
            let found = tx.find_all(PULL_CREDENTIALS, "by_holder", &[json!(holder)]).await?;
            let mut revoked = Vec::with_capacity(found.len());
            for doc in found {
                tx.delete(PULL_CREDENTIALS, &doc.id, doc.revision).await?;
                revoked.push((doc.id.clone(), parse(&doc).map(|r| r.repository).unwrap_or_default()));
            }
            Ok(revoked)
        })
        .await?;
    for (id, repository) in revoked {
        tracing::info!(credential = %id, repository = %repository, "pull credential revoked");
    }
    Ok(())
}

/// Drop the records whose expiry is `now` (milliseconds since the epoch) or earlier (a periodic
/// sweep); how many went. One changed or deleted meanwhile is left to the next sweep.
pub async fn sweep(store: &Store, now: u64) -> Result<usize> {
    let mut swept = 0;
    let mut cursor: Option<String> = None;
    loop {
        let c = cursor.clone();
        let page = store
            .transact(|tx| {
                let c = c.clone();
                async move { tx.scan(PULL_CREDENTIALS, c.as_deref(), 500).await }
            })
            .await?;
        let expired = |data: &Value| data.get("expiresAt").and_then(Value::as_u64).is_none_or(|at| at <= now);
        for doc in page.documents.iter().filter(|doc| expired(&doc.data)) {
            let (id, revision) = (doc.id.as_str(), doc.revision);
            match store.transact(|tx| async move { tx.delete(PULL_CREDENTIALS, id, revision).await }).await {
                Ok(()) => swept += 1,
                Err(e) if e.is("conflict") || e.is("not-found") => {}
                Err(e) => return Err(e),
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if swept > 0 {
        tracing::info!(swept, "expired pull credentials removed");
    }
    Ok(swept)
}

fn grant(id: &str, record: Record) -> Grant {
    Grant { credential_id: id.to_string(), repository: record.repository, expires_at: record.expires_at }
}

/// Verify a pull credential's username and password as `/v2/token` receives them: the record
/// the username names present, the password's SHA-256 equal to the stored one (compared in
/// constant time), its expiry after `now`. Any failure is the uniform denial
/// (`unauthenticated`).
pub async fn exchange(store: &Store, username: &str, password: &str, now: u64) -> Result<Grant> {
    let Some(id) = credential_id(username).filter(|_| well_formed(password)) else { return Err(capstan_auth::denied()) };
    let presented = sha256(password);
    let found = store.read_many(&[(PULL_CREDENTIALS, id)]).await?.into_iter().next().flatten();
    let record = found.as_ref().map(parse).transpose()?;
    let matches = record.as_ref().is_some_and(|r| hex::decode(&r.secret_hash).is_ok_and(|stored| constant_time_eq(&stored, &presented)));
    match record {
        Some(record) if matches && record.expires_at > now => Ok(grant(id, record)),
        _ => Err(capstan_auth::denied()),
    }
}

/// The grant a bearer stands for when it is a pull credential's secret (what `/v2/token`
/// answered it): its record present (found by the secret's SHA-256), its expiry after `now`.
/// Any failure is the uniform denial (`unauthenticated`).
pub async fn bearer_grant(store: &Store, bearer: &str, now: u64) -> Result<Grant> {
    if !well_formed(bearer) {
        return Err(capstan_auth::denied());
    }
    let hash = hex::encode(sha256(bearer));
    let hash_ref = hash.as_str();
    let found = store
        .transact(|tx| async move { Ok(tx.find(PULL_CREDENTIALS, "by_secret_hash", &[json!(hash_ref)], None, 1).await?.documents) })
        .await?;
    let Some(doc) = found.first() else { return Err(capstan_auth::denied()) };
    let record = parse(doc)?;
    if record.expires_at <= now || !constant_time_eq(record.secret_hash.as_bytes(), hash.as_bytes()) {
        return Err(capstan_auth::denied());
    }
    Ok(grant(&doc.id, record))
}

#[cfg(test)]
pub(crate) mod tests;
