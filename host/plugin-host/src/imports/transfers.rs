//! `transfers` (0.2.1): tickets for moving a blob of the plugin's own prefix over HTTP through
//! the host ([`crate::transfers`]), and the digest a plugin checks an object against. Gated by
//! the `blobs` capability: a ticket reaches nothing the plugin could not read or write itself.

use super::{CallData, RetryableWit, WitResult, refusal, to_wit};
use crate::manifest::Capability;
use crate::runtime::capstan::plugin::transfers;
use crate::transfers::{Direction, PATH};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::time::Duration;
use tokio::io::AsyncReadExt;

impl CallData {
    /// The plugin's blob prefix and the full key of `key` in it.
    fn transfer_key(&self, key: &str) -> WitResult<(super::blobs::Prefix, String)> {
        let prefix = self.granted(&self.grant.blobs, Capability::Blobs)?;
        let full = prefix.key(key)?;
        Ok((prefix, full))
    }

    async fn ticket(&mut self, key: String, direction: Direction, max_bytes: u64, ttl_ms: u32) -> WitResult<transfers::Ticket> {
        let (prefix, full) = self.transfer_key(&key)?;
        let Some(origin) = prefix.services.public_origin() else {
            return Err(refusal("transfers-unavailable", "this host has no public origin to hand out in a ticket".into(), json!({})));
        };
        let now_ms = crate::transfers::now_ms();
        let ttl = Duration::from_millis(u64::from(ttl_ms));
        let minted = crate::transfers::mint(&prefix.services.store, self.plugin(), &full, direction, max_bytes, ttl, now_ms)
            .await
            .map_err(to_wit)?;
        tracing::debug!(plugin = %self.plugin(), request_id = %self.request_id, ticket = %minted.id, ?direction, "transfer ticket minted");
        Ok(transfers::Ticket {
            url: format!("{}{}", origin.trim_end_matches('/'), PATH.replace("{id}", &minted.id)),
            token: minted.token,
            expires_at_ms: minted.expires_at_ms,
        })
    }
}

impl transfers::Host for CallData {
    async fn upload(&mut self, key: String, max_bytes: u64, ttl_ms: u32) -> WitResult<transfers::Ticket> {
        self.ticket(key, Direction::Upload, max_bytes, ttl_ms).await
    }

    async fn download(&mut self, key: String, ttl_ms: u32) -> WitResult<transfers::Ticket> {
        self.ticket(key, Direction::Download, 0, ttl_ms).await
    }

    async fn digest(&mut self, key: String) -> WitResult<Option<transfers::ObjectDigest>> {
        let (prefix, full) = self.transfer_key(&key)?;
        let Some((meta, mut reader)) = prefix.blobs.get(&full).await.map_err(to_wit)? else {
            return Ok(None);
        };
        let unavailable = |e: std::io::Error| refusal("blobs-unavailable", format!("reading the blob failed: {e}"), json!({}));
        let (mut hasher, mut size, mut buf) = (Sha256::new(), 0u64, vec![0u8; 256 << 10]);
        loop {
            let n = reader.read(&mut buf).await.map_err(unavailable)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            size += n as u64;
        }
        if size != meta.size {
            // replaced while it was read: the caller asks again
            return Err(refusal("blobs-unavailable", "the object changed while it was read".into(), json!({})).retryable_wit());
        }
        Ok(Some(transfers::ObjectDigest { key, size, sha256: hex::encode(hasher.finalize()) }))
    }
}
