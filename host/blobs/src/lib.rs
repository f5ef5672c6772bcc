//! Object storage: one API, two backends (a local directory embedded; S3 in production).
//!
//! Conditional puts (create-only, if-match) are what the fleet lease stands on, so every
//! backend must honour them, also between processes sharing the same storage.

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
pub mod digest;
pub mod local;
mod measured;
mod probe;
#[cfg(feature = "s3")]
pub mod s3;
mod settings;

pub use settings::{S3_ACCESS_KEY, S3_ENDPOINT, S3_FORCE_PATH_STYLE, S3_REGION, S3_SECRET_KEY, S3Settings};

use async_trait::async_trait;
use capstan_core::refusal::{Refusal, Result};
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::AsyncRead;

/// A byte stream going into or coming out of the blob store.
pub type BlobReader = Pin<Box<dyn AsyncRead + Send + Unpin>>;

/// How a put treats an existing object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutMode {
    /// Replace whatever is there.
    Overwrite,
    /// Only if no object exists under the key; otherwise `exists`.
    CreateOnly,
    /// Only if the current object has this etag; otherwise `conflict` (also when absent).
    IfMatch(String),
}

/// What the store knows about one object, without its content.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlobMeta {
    /// The object's key (without the S3 backend's prefix).
    pub key: String,
    /// The content's length, in bytes.
    pub size: u64,
    /// Changes whenever the content changes (the local backend changes it on every write; S3's
    /// is the content's MD5, so rewriting identical bytes may keep it — harmless for
    /// compare-and-swap, which only needs "the content I read is still there").
    pub etag: String,
}

/// One page of a listing, in key byte order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlobPage {
    /// The objects on this page, at most the requested (capped) limit.
    pub items: Vec<BlobMeta>,
    /// Pass back as `cursor` to continue after the last item; `None` when the listing is done.
    pub next_cursor: Option<String>,
}

/// Largest page a listing returns, whatever the caller asks for.
pub const MAX_LIST_LIMIT: usize = 1000;

/// A place objects live (a local directory or an S3 bucket), behind [`Blobs`].
#[async_trait]
pub trait BlobBackend: Send + Sync {
    /// A short description for status output, e.g. `file:/var/lib/capstan/blobs`.
    fn describe(&self) -> String;
    /// Store the whole stream under `key` atomically: readers see the old object or the new one.
    async fn put(&self, key: &str, body: BlobReader, mode: PutMode) -> Result<BlobMeta>;
    /// Stream an object; `Ok(None)` when absent.
    async fn get(&self, key: &str) -> Result<Option<(BlobMeta, BlobReader)>>;
    /// An object's metadata without its content; `Ok(None)` when absent.
    async fn head(&self, key: &str) -> Result<Option<BlobMeta>>;
    /// Keys starting with `prefix`, in byte order, after `cursor`, at most `limit` (capped).
    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<BlobPage>;
    /// Remove an object; `Ok(false)` when it was already absent.
    async fn delete(&self, key: &str) -> Result<bool>;
    /// Prove the backend is reachable and honours conditional writes.
    async fn probe(&self) -> Result<()>;
}

/// The blob store handle the host passes around.
#[derive(Clone)]
pub struct Blobs(Arc<dyn BlobBackend>);

impl Blobs {
    /// A handle on `backend`, its operations measured (see [`measured`]).
    pub fn new(backend: impl BlobBackend + 'static) -> Self {
        Blobs(Arc::new(measured::Measured(backend)))
    }

    /// Open the backend a `CAPSTAN_BLOB_URL` names (`s3` is used for `s3://` URLs).
    pub async fn open(url: &str, s3: &S3Settings) -> Result<Self> {
        if let Some(dir) = url.strip_prefix("file:") {
            if dir.is_empty() {
                return Err(Refusal::new("config-invalid", "CAPSTAN_BLOB_URL file: needs a directory, e.g. file:/var/lib/capstan/blobs"));
            }
            return Ok(Blobs::new(local::LocalBlobs::open(dir).await?));
        }
        if url.starts_with("s3://") {
            #[cfg(feature = "s3")]
            return Ok(Blobs::new(s3::S3Blobs::open(url, s3)?));
            #[cfg(not(feature = "s3"))]
            return Err(Refusal::new(
                "blobs-backend-unavailable",
                "this build of Capstan has no S3 backend (the blobs crate's s3 feature)",
            )
            .with_data(serde_json::json!({ "scheme": "s3", "settings": s3.endpoint.is_some() })));
        }
        Err(Refusal::new("config-invalid", format!("CAPSTAN_BLOB_URL must start with file: or s3:// (got {:?})", scheme_of(url))))
    }

    /// The backend behind this handle.
    pub fn backend(&self) -> &dyn BlobBackend {
        &*self.0
    }

    /// Store `bytes` under `key` as one object, as `mode` allows.
    pub async fn put_bytes(&self, key: &str, bytes: Vec<u8>, mode: PutMode) -> Result<BlobMeta> {
        self.0.put(key, Box::pin(std::io::Cursor::new(bytes)), mode).await
    }

    /// Read a whole object into memory (for small records); `Ok(None)` when absent.
    pub async fn get_bytes(&self, key: &str) -> Result<Option<(BlobMeta, Vec<u8>)>> {
        use tokio::io::AsyncReadExt;
        let Some((meta, mut reader)) = self.0.get(key).await? else {
            return Ok(None);
        };
        let mut buf = Vec::with_capacity(meta.size as usize);
        reader.read_to_end(&mut buf).await.map_err(|e| Refusal::new("blobs-unavailable", "reading a blob failed").retryable().detail(e))?;
        Ok(Some((meta, buf)))
    }
}

impl std::ops::Deref for Blobs {
    type Target = dyn BlobBackend;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// Only the scheme of a URL, so an error never echoes credentials embedded in it.
pub(crate) fn scheme_of(url: &str) -> &str {
    url.split_once(':').map(|(s, _)| s).unwrap_or("")
}

/// Largest key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// Keys are `/`-separated segments of `[A-Za-z0-9._:@+=,!-]`; no empty, `.`/`..` or hidden
/// (leading `.`) segment, no leading `/`. The same rule holds on every backend so a key that
/// works on S3 also works in a local directory.
pub fn validate_key(key: &str) -> Result<()> {
    let refuse = |why: &str| {
        Err(Refusal::new("invalid-key", format!("blob key refused: {why}"))
            .with_data(serde_json::json!({ "key": capstan_core::text::truncate(key, 120) })))
    };
    if key.is_empty() {
        return refuse("empty key");
    }
    if key.len() > MAX_KEY_BYTES {
        return refuse("longer than 1024 bytes");
    }
    if key.starts_with('/') {
        return refuse("absolute path");
    }
    for segment in key.split('/') {
        if segment.is_empty() {
            return refuse("empty segment");
        }
        if segment == "." || segment == ".." {
            return refuse("`.` or `..` segment");
        }
        if segment.starts_with('.') {
            return refuse("segment starts with `.`");
        }
        if segment.len() > 200 {
            return refuse("segment longer than 200 bytes");
        }
        if let Some(c) = segment.chars().find(|c| !(c.is_ascii_alphanumeric() || "._:@+=,!-".contains(*c))) {
            return refuse(&format!("character {c:?} is not allowed"));
        }
    }
    Ok(())
}

/// Check a listing's arguments (same on every backend); returns the limit, capped.
pub fn validate_listing(prefix: &str, cursor: Option<&str>, limit: usize) -> Result<usize> {
    validate_prefix(prefix)?;
    if let Some(cursor) = cursor {
        validate_key(cursor)?;
    }
    if limit == 0 {
        return Err(Refusal::invalid_request("a blob listing needs a limit of at least 1"));
    }
    Ok(limit.min(MAX_LIST_LIMIT))
}

/// Prefixes follow the key rules, except that they may be empty or end with `/`.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    let trimmed = prefix.strip_suffix('/').unwrap_or(prefix);
    if trimmed.is_empty() {
        return if prefix.is_empty() { Ok(()) } else { validate_key(prefix) };
    }
    validate_key(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        for ok in ["a", "a/b/c", "_capstan/nodes/n1.json", "sha256:abc", "x=1,y@2+!"] {
            validate_key(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["", "/abs", "a//b", "a/", "../x", "a/../b", "a/./b", ".hidden", "a\\b", "a b", "ä", "a\0b"] {
            assert!(validate_key(bad).unwrap_err().is("invalid-key"), "{bad:?}");
        }
        assert!(validate_key(&"a".repeat(1025)).is_err());
    }

    #[test]
    fn prefixes_may_be_empty_or_end_with_slash() {
        validate_prefix("").unwrap();
        validate_prefix("_capstan/").unwrap();
        validate_prefix("_capstan/no").unwrap();
        assert!(validate_prefix("/").is_err());
        assert!(validate_prefix("../").is_err());
    }
}
