//! `transfers` (0.2.1): tickets for moving a blob of the plugin's own prefix over HTTP through
//! the host ([`crate::transfers`]), and the digest a plugin checks an object against. Gated by
//! the `blobs` capability: a ticket reaches nothing the plugin could not read or write itself.
//! `replicate` (0.2.2) and `recover` (0.3.3) also need the `http` grant of the target's origin: they reach out, with
//! the blobs' S3 client (the `s3` feature; a host built without it, like the SDK's test harness,
//! refuses it `transfers-unavailable`).

use super::{CallData, RetryableWit, WitResult, refusal, to_wit};
use crate::blobs::digest::read_digest;
#[cfg(feature = "s3")]
use crate::blobs::s3::{S3Blobs, S3Target};
use crate::manifest::Capability;
use crate::runtime::capstan::plugin::transfers;
use crate::transfers::{Direction, PATH};
#[cfg(feature = "s3")]
use capstan_core::text::SecretString;
use serde_json::json;
use std::time::Duration;

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
        self.changing()?;
        self.ticket(key, Direction::Upload, max_bytes, ttl_ms).await
    }

    async fn download(&mut self, key: String, ttl_ms: u32) -> WitResult<transfers::Ticket> {
        self.ticket(key, Direction::Download, 0, ttl_ms).await
    }

    async fn digest(&mut self, key: String) -> WitResult<Option<transfers::ObjectDigest>> {
        let (prefix, full) = self.transfer_key(&key)?;
        let Some((meta, reader)) = prefix.blobs.get(&full).await.map_err(to_wit)? else {
            return Ok(None);
        };
        let read = read_digest(reader).await.map_err(to_wit)?;
        if read.size != meta.size {
            // replaced while it was read: the caller asks again
            return Err(refusal("blobs-unavailable", "the object changed while it was read".into(), json!({})).retryable_wit());
        }
        Ok(Some(transfers::ObjectDigest { key, size: read.size, sha256: read.sha256 }))
    }

    #[cfg(not(feature = "s3"))]
    async fn replicate(&mut self, key: String, _target: transfers::S3Target) -> WitResult<transfers::ObjectDigest> {
        self.changing()?;
        self.transfer_key(&key)?;
        Err(refusal(
            "transfers-unavailable",
            "this host is built without S3 (capstan-plugin-host's `s3` feature): it replicates to no S3 target".into(),
            json!({}),
        ))
    }

    #[cfg(not(feature = "s3"))]
    async fn recover(&mut self, key: String, _target: transfers::S3Target) -> WitResult<Option<transfers::ObjectDigest>> {
        self.changing()?;
        self.transfer_key(&key)?;
        Err(refusal(
            "transfers-unavailable",
            "this host is built without S3 (capstan-plugin-host's `s3` feature): it recovers from no S3 target".into(),
            json!({}),
        ))
    }

    #[cfg(feature = "s3")]
    async fn recover(&mut self, key: String, target: transfers::S3Target) -> WitResult<Option<transfers::ObjectDigest>> {
        self.changing()?;
        let (prefix, full) = self.transfer_key(&key)?;
        let bucket = target.bucket.clone();
        let (opened, origin) = self.open_target(target).await?;
        let Some(copy) = opened.recover(&key, &prefix.blobs, &full).await.map_err(to_wit)? else {
            return Ok(None);
        };
        tracing::info!(plugin = %self.plugin(), request_id = %self.request_id, %origin, %bucket, size = copy.size, "object recovered from an S3 target");
        Ok(Some(transfers::ObjectDigest { key, size: copy.size, sha256: copy.sha256 }))
    }

    #[cfg(feature = "s3")]
    async fn replicate(&mut self, key: String, target: transfers::S3Target) -> WitResult<transfers::ObjectDigest> {
        self.changing()?;
        let (prefix, full) = self.transfer_key(&key)?;
        let bucket = target.bucket.clone();
        let (opened, origin) = self.open_target(target).await?;
        let copied = opened.replicate(&prefix.blobs, &full, &key).await.map_err(to_wit)?;
        let Some(copy) = copied else {
            return Err(refusal("not-found", format!("there is no object {key} to replicate"), json!({ "key": key })));
        };
        tracing::info!(plugin = %self.plugin(), request_id = %self.request_id, %origin, %bucket, size = copy.size, "object replicated to an S3 target");
        Ok(transfers::ObjectDigest { key, size: copy.size, sha256: copy.sha256 })
    }
}

impl CallData {
    /// The external S3 `target`, opened through the plugin's `http` grant of its origin (its
    /// addresses checked as `http.fetch` checks them); and that origin, for the log.
    #[cfg(feature = "s3")]
    async fn open_target(&mut self, target: transfers::S3Target) -> WitResult<(S3Blobs, String)> {
        let endpoint = target.endpoint.trim();
        let url = reqwest::Url::parse(endpoint).map_err(|_| {
            refusal(
                "s3-target-invalid",
                "the S3 target's endpoint must be an http(s)://host[:port] URL".into(),
                json!({ "field": "endpoint" }),
            )
        })?;
        let (outbound, origin) = self.outbound_to(&url).await?;
        let opened = S3Blobs::open_target(
            &S3Target {
                endpoint: endpoint.to_string(),
                region: target.region,
                bucket: target.bucket,
                prefix: target.prefix,
                access_key_id: target.access_key_id,
                secret_access_key: SecretString::new(target.secret_access_key),
            },
            outbound.reach(),
        )
        .map_err(to_wit)?;
        Ok((opened, origin.to_string()))
    }
}
