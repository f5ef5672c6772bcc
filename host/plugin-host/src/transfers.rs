//! Transfers: one blob of a plugin's prefix moved over HTTP by whoever the plugin hands a ticket
//! to (a cluster's agent), through the host to the blob store, never through the plugin.
//!
//! A plugin mints a ticket with the `transfers` import (WIT 0.2.1): an upload ticket lets one
//! `PUT /api/v1/transfers/<id>` create a key with at most a stated number of bytes, a download
//! ticket lets one `GET` read a key. A ticket is a record in [`TICKETS`] — the full key, the
//! direction, the limit, the expiry and the SHA-256 of its token (the token itself is shown to
//! the plugin once and kept nowhere) — and is good once: [`redeem`] marks it used with a
//! compare-and-swap before a byte moves, so two requests presenting one ticket cannot both go
//! on, and an upload cut off midway cannot be resumed with it. Every node of a fleet redeems
//! any node's tickets (they live in the store). Tickets past their expiry are swept.

use crate::refusal::{Refusal, Result};
use crate::store::{CollectionSpec, Store};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// The collection of tickets.
pub const TICKETS: &str = "transfer_tickets";
/// Where tickets are presented (axum's path syntax).
pub const PATH: &str = "/api/v1/transfers/{id}";
/// The longest a ticket may live.
pub const MAX_TTL: Duration = Duration::from_secs(60 * 60);
/// The shortest a ticket may live.
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The most one upload may carry.
pub const MAX_UPLOAD_BYTES: u64 = 16 << 30;
/// How long a ticket record outlives its expiry before it is swept (so "expired" and "used"
/// stay distinguishable for a while).
const KEEP_AFTER_EXPIRY: Duration = Duration::from_secs(60 * 60);

/// Which way the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Direction {
    /// `PUT`: the holder writes a new object.
    Upload,
    /// `GET`: the holder reads an object.
    Download,
}

/// A ticket as stored: never its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ticket {
    /// The plugin that minted it.
    pub plugin: String,
    /// The full key in the blob store (`plugins/<id>/…`).
    pub key: String,
    /// Which way the bytes go.
    pub direction: Direction,
    /// The most an upload may carry (0 for a download).
    pub max_bytes: u64,
    /// Milliseconds since the epoch.
    pub expires_at_ms: u64,
    /// Lowercase hex SHA-256 of the token.
    pub token_sha256: String,
    /// Set when it was presented (milliseconds since the epoch).
    pub used_at_ms: Option<u64>,
}

/// A freshly minted ticket: its id and token, shown once.
#[derive(Debug, Clone)]
pub struct Minted {
    /// The record's id (`trn_<32 hex>`), the last segment of the URL.
    pub id: String,
    /// The bearer token the holder presents.
    pub token: String,
    /// When it expires, in milliseconds since the epoch.
    pub expires_at_ms: u64,
}

/// Declare the ticket collection.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(CollectionSpec::new(TICKETS)).await
}

/// The system clock in milliseconds since the epoch (tickets expire by the host's clock, not
/// the one plugins see).
pub use capstan_core::clock::now_ms;

fn invalid(message: String) -> Refusal {
    Refusal::new("invalid-request", message)
}

/// Mint a ticket for `plugin` over the full key `key` (validated by the caller), valid for
/// `ttl` from `now_ms`.
pub async fn mint(
    store: &Store,
    plugin: &str,
    key: &str,
    direction: Direction,
    max_bytes: u64,
    ttl: Duration,
    now_ms: u64,
) -> Result<Minted> {
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
        return Err(invalid(format!("a ticket lives {} s to {} s", MIN_TTL.as_secs(), MAX_TTL.as_secs())));
    }
    if direction == Direction::Upload && !(1..=MAX_UPLOAD_BYTES).contains(&max_bytes) {
        return Err(
            invalid(format!("an upload's max-bytes is 1 to {MAX_UPLOAD_BYTES} (16 GiB)")).with_data(json!({ "limit": MAX_UPLOAD_BYTES }))
        );
    }
    let id = capstan_core::ids::new_id("trn");
    let token = format!("ctt_{}", hex::encode(rand::random::<[u8; 32]>()));
    let expires_at_ms = now_ms.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
    let ticket = Ticket {
        plugin: plugin.to_string(),
        key: key.to_string(),
        direction,
        max_bytes: if direction == Direction::Upload { max_bytes } else { 0 },
        expires_at_ms,
        token_sha256: token_hash(&token),
        used_at_ms: None,
    };
    let data = serde_json::to_value(&ticket).map_err(Refusal::internal)?;
    store
        .transact(|tx| {
            let (id, data) = (id.clone(), data.clone());
            async move { tx.insert(TICKETS, &id, data).await.map(|_| ()) }
        })
        .await?;
    Ok(Minted { id, token, expires_at_ms })
}

fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// `transfer-ticket-invalid`: one answer for an unknown id, a wrong token and a ticket of the
/// other direction, so nobody without the token learns anything of a ticket.
pub fn ticket_invalid() -> Refusal {
    Refusal::new("transfer-ticket-invalid", "the transfer ticket is not valid for this request")
}

/// Take the ticket `id` for one transfer in `direction`, presented with `token`: it is marked
/// used before this returns, so it serves exactly one request. Refused
/// `transfer-ticket-invalid`, then (only for the right token) `transfer-ticket-expired` or
/// `transfer-ticket-used`.
pub async fn redeem(store: &Store, id: &str, token: &str, direction: Direction, now_ms: u64) -> Result<Ticket> {
    if crate::store::validate_id(id).is_err() || !id.starts_with("trn_") {
        return Err(ticket_invalid());
    }
    let presented = token_hash(token);
    // one transaction: of two requests presenting the ticket at once, one commits "used"
    store
        .transact(|tx| {
            let presented = presented.clone();
            async move {
                let Some(doc) = tx.get(TICKETS, id).await? else {
                    return Err(ticket_invalid());
                };
                let mut ticket: Ticket = serde_json::from_value(doc.data).map_err(Refusal::internal)?;
                if !constant_time_eq(presented.as_bytes(), ticket.token_sha256.as_bytes()) || ticket.direction != direction {
                    return Err(ticket_invalid());
                }
                if ticket.used_at_ms.is_some() {
                    return Err(ticket_used());
                }
                if now_ms >= ticket.expires_at_ms {
                    return Err(Refusal::new("transfer-ticket-expired", "this transfer ticket expired; ask for a new one")
                        .with_data(json!({ "expiredAtMs": ticket.expires_at_ms })));
                }
                ticket.used_at_ms = Some(now_ms);
                tx.replace(TICKETS, id, doc.revision, serde_json::to_value(&ticket).map_err(Refusal::internal)?).await?;
                Ok(ticket)
            }
        })
        .await
        // another request committed it first
        .map_err(|e| if e.is("conflict") { ticket_used() } else { e })
}

fn ticket_used() -> Refusal {
    Refusal::new("transfer-ticket-used", "this transfer ticket was already presented; ask for a new one")
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Delete tickets that expired more than an hour before `now_ms`; answers how many went.
pub async fn sweep(store: &Store, now_ms: u64) -> usize {
    let keep_ms = u64::try_from(KEEP_AFTER_EXPIRY.as_millis()).unwrap_or(u64::MAX);
    let expired = store
        .transact(|tx| async move {
            let mut expired = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let page = tx.scan(TICKETS, cursor.as_deref(), 500).await?;
                for doc in page.documents {
                    if now_ms >= doc.data["expiresAtMs"].as_u64().unwrap_or(0).saturating_add(keep_ms) {
                        expired.push((doc.id, doc.revision));
                    }
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => return Ok(expired),
                }
            }
        })
        .await;
    let expired = match expired {
        Ok(expired) => expired,
        Err(e) => {
            tracing::warn!(code = %e.code, "transfer tickets not swept: {}", e.message);
            return 0;
        }
    };
    let mut swept = 0;
    for (id, revision) in expired {
        let deleted = store.transact(|tx| {
            let id = id.clone();
            async move { tx.delete(TICKETS, &id, revision).await }
        });
        if deleted.await.is_ok() {
            swept += 1;
        }
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let backend = crate::store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap();
        let store = Store::new(backend, crate::store::DEFAULT_BUDGET);
        declare(&store).await.unwrap();
        (store, dir)
    }

    async fn read(store: &Store, id: &str) -> Option<crate::store::Document> {
        let id = id.to_string();
        store
            .transact(|tx| {
                let id = id.clone();
                async move { tx.get(TICKETS, &id).await }
            })
            .await
            .unwrap()
    }

    const NOW: u64 = 1_700_000_000_000;
    const MINUTE: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_ticket_serves_one_request_with_its_own_token_and_direction() {
        let (store, _dir) = store().await;
        let minted = mint(&store, "backups", "plugins/backups/a", Direction::Upload, 10, MINUTE, NOW).await.unwrap();
        assert!(minted.id.starts_with("trn_") && minted.token.starts_with("ctt_"));
        let stored = read(&store, &minted.id).await.unwrap();
        assert!(!stored.data.to_string().contains(&minted.token), "only the token's hash is kept");

        let code = |r: Result<Ticket>| r.unwrap_err().code;
        assert_eq!(code(redeem(&store, &minted.id, "ctt_wrong", Direction::Upload, NOW).await), "transfer-ticket-invalid");
        assert_eq!(code(redeem(&store, &minted.id, &minted.token, Direction::Download, NOW).await), "transfer-ticket-invalid");
        assert_eq!(code(redeem(&store, "trn_nope", &minted.token, Direction::Upload, NOW).await), "transfer-ticket-invalid");
        assert_eq!(code(redeem(&store, "../x", &minted.token, Direction::Upload, NOW).await), "transfer-ticket-invalid");

        let ticket = redeem(&store, &minted.id, &minted.token, Direction::Upload, NOW + 1).await.unwrap();
        assert_eq!((ticket.key.as_str(), ticket.max_bytes, ticket.plugin.as_str()), ("plugins/backups/a", 10, "backups"));
        assert_eq!(code(redeem(&store, &minted.id, &minted.token, Direction::Upload, NOW + 2).await), "transfer-ticket-used");
    }

    #[tokio::test]
    async fn an_expired_ticket_is_refused_and_swept_later() {
        let (store, _dir) = store().await;
        let minted = mint(&store, "backups", "plugins/backups/a", Direction::Download, 0, MINUTE, NOW).await.unwrap();
        let after = NOW + 60_000;
        let refused = redeem(&store, &minted.id, &minted.token, Direction::Download, after).await.unwrap_err();
        assert_eq!(refused.code, "transfer-ticket-expired");
        assert_eq!(sweep(&store, after).await, 0, "kept a while after expiry");
        assert_eq!(sweep(&store, after + KEEP_AFTER_EXPIRY.as_millis() as u64).await, 1);
        assert!(read(&store, &minted.id).await.is_none());
    }

    #[tokio::test]
    async fn limits_are_checked_when_minting() {
        let (store, _dir) = store().await;
        let code = |r: Result<Minted>| r.unwrap_err().code;
        assert_eq!(code(mint(&store, "p", "plugins/p/a", Direction::Upload, 0, MINUTE, NOW).await), "invalid-request");
        assert_eq!(code(mint(&store, "p", "plugins/p/a", Direction::Upload, MAX_UPLOAD_BYTES + 1, MINUTE, NOW).await), "invalid-request");
        assert_eq!(code(mint(&store, "p", "plugins/p/a", Direction::Upload, 1, MAX_TTL + MINUTE, NOW).await), "invalid-request");
        assert_eq!(code(mint(&store, "p", "plugins/p/a", Direction::Upload, 1, Duration::from_millis(10), NOW).await), "invalid-request");
    }
}
