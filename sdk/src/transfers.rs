//! Blobs of the plugin's own prefix moved over HTTP by whoever the plugin hands a ticket to —
//! a cluster's agent, given one in an [`crate::agents::call`] body — through the host to the
//! blob store, so large data never passes through the plugin (capability `blobs`; contract
//! 0.2.1). A ticket is good for one request before it expires; treat its token as a credential.
//! [`replicate`] (contract 0.2.2) has the host copy an object to an S3 bucket outside Capstan.
//!
//! ```no_run
//! use capstan_sdk::{agents, json, transfers};
//!
//! # fn demo() -> capstan_sdk::Result<()> {
//! let ticket = transfers::upload("backups/b1/volumes.tar.gz", 1 << 30, 60_000)?;
//! let sent: capstan_sdk::Value = agents::call("cls_1", "backups.archive", &json!({ "upload": ticket }))?;
//! // trust the object only once the host's own reading of it matches what the agent sent
//! let stored = transfers::digest("backups/b1/volumes.tar.gz")?;
//! # Ok(()) }
//! ```

use crate::Result;
use crate::bindings::capstan::plugin::transfers as wit;
use serde::{Deserialize, Serialize};

/// What the holder presents: `PUT` (upload) or `GET` (download) `url` with the header
/// `authorization: Bearer <token>`. Serializes as `{url, token, expiresAtMs}`.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Ticket {
    /// `<origin>/api/v1/transfers/<id>`.
    pub url: String,
    /// The bearer token: a credential.
    pub token: String,
    /// Milliseconds since the epoch.
    pub expires_at_ms: u64,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("url", &self.url).field("token", &"<redacted>").field("expires_at_ms", &self.expires_at_ms).finish()
    }
}

/// An object's exact length and SHA-256 as the blob store holds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Digest {
    /// Relative to the plugin's prefix.
    pub key: String,
    /// In bytes.
    pub size: u64,
    /// 64 lowercase hex digits.
    pub sha256: String,
}

fn ticket(t: wit::Ticket) -> Ticket {
    Ticket { url: t.url, token: t.token, expires_at_ms: t.expires_at_ms }
}

/// A ticket for one `PUT` that creates `key` with at most `max_bytes` (up to 16 GiB); the
/// host answers `201 {key, size, sha256}`. An upload cut off or past the limit
/// (`transfer-too-large`) stores nothing; an existing key is refused `exists`. `ttl_ms`:
/// 1 s to 1 h.
pub fn upload(key: &str, max_bytes: u64, ttl_ms: u32) -> Result<Ticket> {
    Ok(ticket(wit::upload(key, max_bytes, ttl_ms)?))
}

/// A ticket for one `GET` of `key`. `ttl_ms`: 1 s to 1 h.
pub fn download(key: &str, ttl_ms: u32) -> Result<Ticket> {
    Ok(ticket(wit::download(key, ttl_ms)?))
}

/// The exact length and SHA-256 of `key`, read in full by the host now; `None` when absent.
pub fn digest(key: &str) -> Result<Option<Digest>> {
    Ok(wit::digest(key)?.map(|d| Digest { key: d.key, size: d.size, sha256: d.sha256 }))
}

/// An S3 bucket outside Capstan, addressed path-style. `Debug` leaves the secret out.
#[derive(Clone)]
pub struct S3Target {
    /// `http(s)://host[:port]`: an origin the plugin's `http` grant allows (`http:<origin>`, or
    /// listed by the setting an `http-setting:<key>` grant names).
    pub endpoint: String,
    /// The bucket's region, e.g. `us-east-1`.
    pub region: String,
    /// The bucket.
    pub bucket: String,
    /// Objects go under `<prefix>/`; empty for none.
    pub prefix: String,
    /// A key allowed to put, get and delete objects in the bucket, read from a secret
    /// ([`crate::secrets::reveal`]); never store or log it.
    pub access_key_id: String,
    /// Its secret.
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Target")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Have the host copy `key` to `<prefix>/<key>` at `target` and read the copy back there: its
/// length and SHA-256 as the far side holds it (compare them with what you expect). The bytes
/// never pass through the plugin. A copy that does not read back as sent is deleted there
/// (`s3-target-mismatch`); refused `s3-target-invalid`, `s3-target-credentials-rejected`,
/// `s3-target-bucket-missing`, `s3-target-unavailable` (retryable), `http-address-refused`,
/// `not-found` (no such object here), `capability-denied` (the endpoint's origin is not granted).
pub fn replicate(key: &str, target: &S3Target) -> Result<Digest> {
    let d = wit::replicate(key, &target.to_wit())?;
    Ok(Digest { key: d.key, size: d.size, sha256: d.sha256 })
}

/// Have the host copy `<prefix>/<key>` at `target` back into the plugin's prefix as `key`
/// (contract 0.3.3): the length and SHA-256 of what it wrote, `None` when the target holds no
/// such object. An object at `key` is replaced, and nothing is judged for you: compare the
/// digest with your record of the object before you trust it (and delete the copy when it
/// differs). Refused as [`replicate`] is.
pub fn recover(key: &str, target: &S3Target) -> Result<Option<Digest>> {
    Ok(wit::recover(key, &target.to_wit())?.map(|d| Digest { key: d.key, size: d.size, sha256: d.sha256 }))
}

impl S3Target {
    fn to_wit(&self) -> wit::S3Target {
        wit::S3Target {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            bucket: self.bucket.clone(),
            prefix: self.prefix.clone(),
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
        }
    }
}
