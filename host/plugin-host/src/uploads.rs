//! Uploaded bundles waiting for `plugins.install` / `plugins.upgrade`.
//!
//! A bundle (up to 64 MiB) is too large for a JSON body, so it travels once as raw bytes to
//! `POST /api/v1/uploads/plugin-bundle` or the dashboard's upload form. Both authorize the
//! caller from the headers first, then spool the body to a temporary file ([`Spool`]) with the
//! limit enforced while it arrives, so no request holds a bundle in memory while it trickles in
//! and an anonymous one never gets that far. A parsed bundle is kept in blobs under
//! `_capstan/uploads/<id>` for [`UPLOAD_TTL`]; the id carries its creation time, so an
//! abandoned upload is swept ([`sweep`]) without any other record.

use super::bundle::{Bundle, Inspection, MAX_BUNDLE_BYTES};
use crate::blobs::{Blobs, PutMode};
use crate::refusal::{Refusal, Result};
use serde_json::json;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

/// Where kept uploads live in blobs: `_capstan/uploads/<32 hex>`.
pub const UPLOADS: &str = "_capstan/uploads/";

/// How long a kept upload waits for its install or upgrade before it is swept.
pub const UPLOAD_TTL: Duration = Duration::from_secs(60 * 60);

/// Bundles parsed at once on this node: parsing holds a bundle in memory, so concurrent
/// uploads (administrators only) queue here rather than add up.
static PARSING: Semaphore = Semaphore::const_new(2);

/// `bundle-too-large`, with the limit.
pub fn too_large() -> Refusal {
    Refusal::new("bundle-too-large", format!("a bundle is at most {MAX_BUNDLE_BYTES} bytes (64 MiB)"))
        .with_data(json!({ "limit": MAX_BUNDLE_BYTES }))
}

fn spool_failed(e: std::io::Error) -> Refusal {
    Refusal::new("upload-spool-failed", "the upload could not be written to a temporary file; try again").retryable().detail(e)
}

/// A bundle being received: its bytes go to a private temporary file (mode 0600, removed when
/// the spool is dropped, so an upload cut off midway leaves nothing behind).
pub struct Spool {
    file: tokio::fs::File,
    path: tempfile::TempPath,
    len: usize,
}

impl Spool {
    /// A new, empty spool in the system's temporary directory.
    pub fn new() -> Result<Spool> {
        let (file, path) = tempfile::Builder::new().prefix("capstan-upload-").tempfile().map_err(spool_failed)?.into_parts();
        Ok(Spool { file: tokio::fs::File::from_std(file), path, len: 0 })
    }

    /// Refuse a declared length over the limit before reading any of the body.
    pub fn check_declared(length: Option<u64>) -> Result<()> {
        match length {
            Some(n) if n > MAX_BUNDLE_BYTES as u64 => Err(too_large()),
            _ => Ok(()),
        }
    }

    /// Append a chunk; past [`MAX_BUNDLE_BYTES`] the upload is refused `bundle-too-large`.
    pub async fn push(&mut self, chunk: &[u8]) -> Result<()> {
        if self.len + chunk.len() > MAX_BUNDLE_BYTES {
            return Err(too_large());
        }
        self.file.write_all(chunk).await.map_err(spool_failed)?;
        self.len += chunk.len();
        Ok(())
    }

    /// Bytes received so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was received.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Parse the received bundle and keep it (see [`keep`]).
    pub async fn keep(mut self, blobs: &Blobs, by: &str) -> Result<(String, Inspection)> {
        self.file.flush().await.map_err(spool_failed)?;
        let _parsing = PARSING.acquire().await.map_err(|_| Refusal::new("not-ready", "the host is stopping").retryable())?;
        let bytes = tokio::fs::read(&self.path).await.map_err(spool_failed)?;
        drop(self);
        keep(blobs, bytes, by).await
    }
}

/// Keep a bundle for a following install or upgrade: parse it (what does not parse is refused
/// by name and nothing is kept), store it under `_capstan/uploads/<id>`, and answer the upload
/// id and what the bundle requests. Nothing is verified against trust here. Expired uploads
/// are swept first.
pub async fn keep(blobs: &Blobs, bytes: Vec<u8>, by: &str) -> Result<(String, Inspection)> {
    let bundle = Bundle::parse(&bytes)?;
    sweep(blobs, SystemTime::now()).await;
    let upload = new_id(SystemTime::now());
    blobs.put_bytes(&format!("{UPLOADS}{upload}"), bytes, PutMode::CreateOnly).await?;
    tracing::info!(upload = %upload, plugin = %bundle.manifest.id, version = %bundle.manifest.version, by, "plugin bundle uploaded");
    Ok((upload, bundle.inspect()))
}

fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// An upload id: 10 hex digits of its creation time in seconds, then 22 random ones.
fn new_id(at: SystemTime) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{:010x}{}", unix_seconds(at) & 0xff_ffff_ffff, &random[..22])
}

/// Whether the upload `id` is past [`UPLOAD_TTL`] at `now` (an id from the future, which this
/// host never mints, counts as expired too).
fn expired(id: &str, now: SystemTime) -> bool {
    let Some(created) = id.get(..10).and_then(|t| u64::from_str_radix(t, 16).ok()) else {
        return true;
    };
    let now = unix_seconds(now);
    created > now + 60 || now.saturating_sub(created) > UPLOAD_TTL.as_secs()
}

/// Where a kept upload lives, once its id is known to be one.
pub fn key(upload: &str) -> Result<String> {
    let valid = upload.len() == 32 && upload.chars().all(|c| c.is_ascii_hexdigit());
    if !valid {
        return Err(Refusal::invalid_request("upload ids are the 32 hex digits the upload answered").with_data(json!({"field": "upload"})));
    }
    Ok(format!("{UPLOADS}{upload}"))
}

/// The bytes of a kept upload; an expired one is `upload-not-found` like a missing one.
pub async fn take(blobs: &Blobs, upload: &str) -> Result<Vec<u8>> {
    let not_found = || {
        Refusal::new(
            "upload-not-found",
            format!("no such upload (uploads are kept {} minutes); upload the bundle again", UPLOAD_TTL.as_secs() / 60),
        )
        .with_data(json!({ "upload": upload }))
    };
    let key = key(upload)?;
    if expired(upload, SystemTime::now()) {
        return Err(not_found());
    }
    let (_, bytes) = blobs.get_bytes(&key).await?.ok_or_else(not_found)?;
    Ok(bytes)
}

/// Drop a kept upload; whether it was there.
pub async fn forget(blobs: &Blobs, upload: &str) -> Result<bool> {
    blobs.delete(&key(upload)?).await
}

/// Delete the uploads past [`UPLOAD_TTL`] at `now` (best effort: a failure is logged and the
/// next sweep tries again). How many went.
pub async fn sweep(blobs: &Blobs, now: SystemTime) -> usize {
    let mut swept = 0;
    let mut cursor: Option<String> = None;
    loop {
        let page = match blobs.list(UPLOADS, cursor.as_deref(), 1000).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(code = %e.code, "expired uploads not swept: {}", e.message);
                return swept;
            }
        };
        for item in &page.items {
            let id = item.key.strip_prefix(UPLOADS).unwrap_or_default();
            if expired(id, now) && blobs.delete(&item.key).await.unwrap_or(false) {
                swept += 1;
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if swept > 0 {
        tracing::info!(swept, "expired plugin bundle uploads deleted");
    }
    swept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_age() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let id = new_id(t0);
        assert_eq!(id.len(), 32);
        assert!(key(&id).is_ok());
        assert!(!expired(&id, t0));
        assert!(!expired(&id, t0 + UPLOAD_TTL));
        assert!(expired(&id, t0 + UPLOAD_TTL + Duration::from_secs(1)));
        assert!(expired(&id, t0 - Duration::from_secs(3600)), "an id from the future is not kept");
        assert!(expired("zz", t0));
    }

    #[tokio::test]
    async fn sweep_deletes_only_expired_uploads() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::open(&format!("file:{}", dir.path().display()), &Default::default()).await.unwrap();
        let now = SystemTime::now();
        let old = new_id(now - UPLOAD_TTL - Duration::from_secs(5));
        let fresh = new_id(now);
        for id in [&old, &fresh] {
            blobs.put_bytes(&key(id).unwrap(), b"x".to_vec(), PutMode::CreateOnly).await.unwrap();
        }
        assert_eq!(sweep(&blobs, now).await, 1);
        assert!(blobs.head(&key(&old).unwrap()).await.unwrap().is_none());
        assert!(blobs.head(&key(&fresh).unwrap()).await.unwrap().is_some());
        assert!(take(&blobs, &old).await.unwrap_err().is("upload-not-found"));
        assert_eq!(take(&blobs, &fresh).await.unwrap(), b"x");
    }

    #[tokio::test]
    async fn a_spool_refuses_past_the_limit_and_leaves_no_file() {
        let mut spool = Spool::new().unwrap();
        let path = spool.path.to_path_buf();
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..64 {
            spool.push(&chunk).await.unwrap();
        }
        assert!(spool.push(b"x").await.unwrap_err().is("bundle-too-large"));
        assert!(Spool::check_declared(Some(MAX_BUNDLE_BYTES as u64 + 1)).unwrap_err().is("bundle-too-large"));
        assert!(path.exists());
        drop(spool);
        assert!(!path.exists(), "a dropped spool removes its file");
    }
}
