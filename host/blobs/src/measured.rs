//! Every backend behind [`crate::Blobs`] is wrapped here, so each operation is counted once, by
//! the same code, whichever backend runs it: `capstan_blob_operations_total{op, outcome}` and
//! `capstan_blob_operation_duration_seconds{op}`. Labels come from fixed sets: never a key.

use crate::{BlobBackend, BlobMeta, BlobPage, BlobReader, PutMode};
use async_trait::async_trait;
use capstan_core::refusal::Result;
use std::time::Instant;

/// A backend whose operations are measured.
pub(crate) struct Measured<B>(pub(crate) B);

/// The outcome label of a finished operation: `ok`, `absent` (nothing under the key), `exists`
/// and `conflict` (a conditional write that lost), or `failed`.
fn outcome<T>(result: &Result<T>, absent: impl FnOnce(&T) -> bool) -> &'static str {
    match result {
        Ok(value) if absent(value) => "absent",
        Ok(_) => "ok",
        Err(e) if e.is("exists") => "exists",
        Err(e) if e.is("conflict") => "conflict",
        Err(_) => "failed",
    }
}

fn record(op: &'static str, started: Instant, outcome: &'static str) {
    metrics::counter!("capstan_blob_operations_total", "op" => op, "outcome" => outcome).increment(1);
    metrics::histogram!("capstan_blob_operation_duration_seconds", "op" => op).record(started.elapsed().as_secs_f64());
}

#[async_trait]
impl<B: BlobBackend> BlobBackend for Measured<B> {
    fn describe(&self) -> String {
        self.0.describe()
    }

    async fn put(&self, key: &str, body: BlobReader, mode: PutMode) -> Result<BlobMeta> {
        let started = Instant::now();
        let result = self.0.put(key, body, mode).await;
        record("put", started, outcome(&result, |_| false));
        result
    }

    async fn get(&self, key: &str) -> Result<Option<(BlobMeta, BlobReader)>> {
        // the time to the first byte: the body streams on after this returns
        let started = Instant::now();
        let result = self.0.get(key).await;
        record("get", started, outcome(&result, Option::is_none));
        result
    }

    async fn head(&self, key: &str) -> Result<Option<BlobMeta>> {
        let started = Instant::now();
        let result = self.0.head(key).await;
        record("head", started, outcome(&result, Option::is_none));
        result
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<BlobPage> {
        let started = Instant::now();
        let result = self.0.list(prefix, cursor, limit).await;
        record("list", started, outcome(&result, |_| false));
        result
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let started = Instant::now();
        let result = self.0.delete(key).await;
        record("delete", started, outcome(&result, |deleted| !deleted));
        result
    }

    async fn probe(&self) -> Result<()> {
        let started = Instant::now();
        let result = self.0.probe().await;
        record("probe", started, outcome(&result, |_| false));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_core::refusal::Refusal;

    #[test]
    fn outcomes_are_named_from_a_fixed_set() {
        assert_eq!(outcome(&Ok(Some(1)), Option::is_none), "ok");
        assert_eq!(outcome::<Option<u8>>(&Ok(None), Option::is_none), "absent");
        assert_eq!(outcome::<()>(&Err(Refusal::new("exists", "x")), |_| false), "exists");
        assert_eq!(outcome::<()>(&Err(Refusal::new("conflict", "x")), |_| false), "conflict");
        assert_eq!(outcome::<()>(&Err(Refusal::new("blobs-unavailable", "x")), |_| false), "failed");
    }
}
