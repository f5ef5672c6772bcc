//! Blobs of the plugin's own prefix moved over HTTP by whoever the plugin hands a ticket to —
//! a cluster's agent, given one in an [`crate::agents::call`] body — through the host to the
//! blob store, so large data never passes through the plugin (capability `blobs`; contract
//! 0.2.1). A ticket is good for one request before it expires; treat its token as a credential.
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
