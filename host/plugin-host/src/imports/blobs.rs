//! `blobs`: the plugin's own prefix of the blob store (`plugins/<id>/`), read as a stream and
//! written through a bounded writer.

use super::{CallData, Services, WitResult, refusal, to_wit};
use crate::blobs::{Blobs, PutMode};
use crate::manifest::Capability;
use crate::runtime::capstan::plugin::{blobs, types};
use serde_json::json;
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use wasmtime::component::Resource;

/// Largest blob a plugin may write through one writer.
pub const MAX_PLUGIN_BLOB_BYTES: usize = 64 << 20;
/// Largest chunk one `read` returns.
const MAX_CHUNK: u32 = 1 << 20;

/// The blob prefix of a plugin.
pub fn blob_prefix(plugin: &str) -> String {
    format!("plugins/{plugin}/")
}

/// The `blobs` provider: the blob store under the plugin's prefix.
#[derive(Clone)]
pub(super) struct Prefix {
    pub(super) blobs: Blobs,
    prefix: String,
    /// What `transfers` reaches besides the blobs: the store its tickets live in, the origin.
    pub(super) services: Arc<Services>,
}

impl Prefix {
    pub(super) fn new(services: &Arc<Services>, plugin: &str) -> Self {
        Prefix { blobs: services.blobs.clone(), prefix: blob_prefix(plugin), services: services.clone() }
    }

    /// The full key of the plugin's `key`, validated.
    pub(super) fn key(&self, key: &str) -> WitResult<String> {
        let full = format!("{}{key}", self.prefix);
        crate::blobs::validate_key(&full).map_err(to_wit)?;
        Ok(full)
    }

    fn info(&self, meta: crate::blobs::BlobMeta) -> blobs::BlobInfo {
        blobs::BlobInfo { key: meta.key.strip_prefix(&self.prefix).unwrap_or(&meta.key).to_string(), size: meta.size, etag: meta.etag }
    }
}

impl CallData {
    fn blobs(&self) -> WitResult<Prefix> {
        self.granted(&self.grant.blobs, Capability::Blobs)
    }
}

/// A blob being read by a plugin.
pub struct BlobReaderState(crate::blobs::BlobReader);

/// A blob being written by a plugin: buffered up to the limit, stored on `finish`. A writer
/// whose key was refused (or whose plugin holds no `blobs` grant) has no target, and says so
/// at `write`/`finish`, which can answer a refusal.
pub struct BlobWriterState {
    target: Option<(Prefix, String)>,
    mode: PutMode,
    buffer: Vec<u8>,
    finished: bool,
}

fn table_error(e: wasmtime::component::ResourceTableError) -> types::Refusal {
    refusal("invalid-request", format!("unknown blob handle: {e}"), json!({}))
}

impl BlobWriterState {
    fn writable(&mut self) -> WitResult<&mut Self> {
        if self.target.is_none() {
            return Err(refusal("invalid-key", "the blob key was refused (or blobs were not granted)".into(), json!({})));
        }
        if self.finished {
            return Err(refusal("invalid-request", "the blob writer was already finished".into(), json!({})));
        }
        Ok(self)
    }
}

impl blobs::HostBlobReader for CallData {
    async fn read(&mut self, reader: Resource<BlobReaderState>, max: u32) -> WitResult<Vec<u8>> {
        self.budget.call()?;
        let state = self.table.get_mut(&reader).map_err(table_error)?;
        let mut buf = vec![0u8; max.clamp(1, MAX_CHUNK) as usize];
        let n =
            state.0.read(&mut buf).await.map_err(|e| refusal("blobs-unavailable", format!("reading the blob failed: {e}"), json!({})))?;
        buf.truncate(n);
        Ok(buf)
    }

    async fn drop(&mut self, reader: Resource<BlobReaderState>) -> wasmtime::Result<()> {
        self.table.delete(reader)?;
        Ok(())
    }
}

impl blobs::HostBlobWriter for CallData {
    async fn new(&mut self, key: String, mode: blobs::PutMode) -> Resource<BlobWriterState> {
        let target = self.blobs().and_then(|p| p.key(&key).map(|full| (p, full))).ok();
        let mode = match mode {
            blobs::PutMode::Overwrite => PutMode::Overwrite,
            blobs::PutMode::CreateOnly => PutMode::CreateOnly,
            blobs::PutMode::IfMatch(etag) => PutMode::IfMatch(etag),
        };
        let state = BlobWriterState { target, mode, buffer: Vec::new(), finished: false };
        self.table.push(state).expect("resource table has room")
    }

    async fn write(&mut self, writer: Resource<BlobWriterState>, chunk: Vec<u8>) -> WitResult<()> {
        self.budget.call()?;
        let state = self.table.get_mut(&writer).map_err(table_error)?.writable()?;
        if state.buffer.len() + chunk.len() > MAX_PLUGIN_BLOB_BYTES {
            return Err(refusal("blob-too-large", format!("a plugin blob is at most {MAX_PLUGIN_BLOB_BYTES} bytes"), json!({})));
        }
        // every open writer's buffer counts, so many writers cannot hold more than one could
        self.budget.hold(chunk.len(), "a blob writer's buffer")?;
        let state = self.table.get_mut(&writer).map_err(table_error)?;
        state.buffer.extend_from_slice(&chunk);
        Ok(())
    }

    async fn finish(&mut self, writer: Resource<BlobWriterState>) -> WitResult<blobs::BlobInfo> {
        self.changing()?;
        self.budget.call()?;
        let state = self.table.get_mut(&writer).map_err(table_error)?.writable()?;
        state.finished = true;
        let (prefix, key) = state.target.clone().expect("a writable writer has a target");
        let (mode, bytes) = (state.mode.clone(), std::mem::take(&mut state.buffer));
        let held = bytes.len();
        let stored = prefix.blobs.put_bytes(&key, bytes, mode).await;
        self.budget.release(held);
        Ok(prefix.info(stored.map_err(to_wit)?))
    }

    async fn drop(&mut self, writer: Resource<BlobWriterState>) -> wasmtime::Result<()> {
        let state = self.table.delete(writer)?;
        self.budget.release(state.buffer.len());
        Ok(())
    }
}

impl blobs::Host for CallData {
    async fn open(&mut self, key: String) -> WitResult<Option<(blobs::BlobInfo, Resource<BlobReaderState>)>> {
        let p = self.blobs()?;
        let Some((meta, reader)) = p.blobs.get(&p.key(&key)?).await.map_err(to_wit)? else {
            return Ok(None);
        };
        let handle = self.table.push(BlobReaderState(reader)).map_err(table_error)?;
        Ok(Some((p.info(meta), handle)))
    }

    async fn head(&mut self, key: String) -> WitResult<Option<blobs::BlobInfo>> {
        let p = self.blobs()?;
        let meta = p.blobs.head(&p.key(&key)?).await.map_err(to_wit)?;
        Ok(meta.map(|m| p.info(m)))
    }

    async fn list(&mut self, prefix: String, cursor: Option<String>, limit: u32) -> WitResult<blobs::BlobPage> {
        let p = self.blobs()?;
        let full_prefix = format!("{}{prefix}", p.prefix);
        let full_cursor = cursor.map(|c| format!("{}{c}", p.prefix));
        let page = p.blobs.list(&full_prefix, full_cursor.as_deref(), (limit as usize).clamp(1, 1000)).await.map_err(to_wit)?;
        Ok(blobs::BlobPage {
            items: page.items.into_iter().map(|m| p.info(m)).collect(),
            next_cursor: page.next_cursor.map(|c| c.strip_prefix(&p.prefix).unwrap_or(&c).to_string()),
        })
    }

    async fn delete(&mut self, key: String) -> WitResult<bool> {
        self.changing()?;
        let p = self.blobs()?;
        p.blobs.delete(&p.key(&key)?).await.map_err(to_wit)
    }
}
