//! The boot-time check every backend runs: conditional writes must really be honoured.
//!
//! Written against [`BlobBackend`] only, so the local directory and S3 backends share it.

use super::{BlobBackend, BlobMeta, BlobReader, PutMode};
use capstan_core::refusal::{Refusal, Result};
use std::fmt;

/// Check that a backend is reachable and honours conditional writes, using a throwaway key
/// `capstan-probe/<random>`. Written against the trait, so any backend can use it.
pub(crate) async fn probe_conditional_writes<B: BlobBackend + ?Sized>(backend: &B) -> Result<()> {
    let key = format!("capstan-probe/{:032x}", rand::random::<u128>());
    let outcome = probe_steps(backend, &key).await;
    let cleanup = backend.delete(&key).await;
    outcome?;
    match cleanup {
        Ok(true) => Ok(()),
        Ok(false) => Err(capability_missing("delete", "deleting the probe object reported it absent")),
        Err(e) => Err(e),
    }
}

async fn probe_steps<B: BlobBackend + ?Sized>(backend: &B, key: &str) -> Result<()> {
    let body = |bytes: &'static [u8]| -> BlobReader { Box::pin(bytes) };
    let first = backend.put(key, body(b"capstan probe 1"), PutMode::Overwrite).await?;
    match backend.head(key).await? {
        Some(meta) if meta.etag == first.etag && meta.size == first.size => {}
        other => {
            return Err(capability_missing("read-after-write", format!("head after put returned {other:?}")));
        }
    }
    expect_refused(backend.put(key, body(b"capstan probe x"), PutMode::CreateOnly).await, "exists", "create-only")?;
    let second = match backend.put(key, body(b"capstan probe 2"), PutMode::IfMatch(first.etag.clone())).await {
        Ok(meta) => meta,
        Err(e) if e.is("blobs-unavailable") => return Err(e),
        Err(e) => {
            return Err(capability_missing("if-match", format!("if-match with the current etag was refused: {e}")));
        }
    };
    if second.etag == first.etag {
        return Err(capability_missing("etag-changes-on-write", "a write kept the previous etag"));
    }
    expect_refused(backend.put(key, body(b"capstan probe y"), PutMode::IfMatch(first.etag)).await, "conflict", "if-match")
}

fn expect_refused(outcome: Result<BlobMeta>, code: &str, capability: &str) -> Result<()> {
    match outcome {
        Err(e) if e.is(code) => Ok(()),
        Err(e) if e.is("blobs-unavailable") => Err(e),
        Err(e) => Err(capability_missing(capability, format!("expected `{code}`, got {e}"))),
        Ok(meta) => Err(capability_missing(capability, format!("expected `{code}`, the write succeeded: {meta:?}"))),
    }
}

fn capability_missing(capability: &str, detail: impl fmt::Display) -> Refusal {
    Refusal::new("blob-capability-missing", format!("the blob store does not honour {capability} writes"))
        .with_data(serde_json::json!({ "capability": capability }))
        .detail(detail)
}
