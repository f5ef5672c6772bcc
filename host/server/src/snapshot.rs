//! Snapshots of Capstan itself: a consistent copy of every collection of the store (the host's
//! and the plugins') and of the blobs Capstan needs back (the plugins' own prefixes, the stored
//! plugin bundles, the identity claims), in one streaming file with a manifest.
//!
//! The file (`*.capstan-snapshot`) is a first line `capstan-snapshot 1`, then JSON lines:
//! `{"kind":"collection","name":…}` followed by one `{"kind":"document","id":…,"revision":…,
//! "data":…}` line per document; `{"kind":"blob","key":…,"size":N}` followed by exactly N raw
//! bytes and a newline; then the manifest (`{"kind":"manifest",…}`: data version, migration
//! ledgers, counts, the SHA-256 of every part) and `{"kind":"end","manifestSha256":…}`. A
//! collection part's hash covers its document lines, a blob's its bytes. Nothing is held in
//! memory beyond one page of documents or one chunk of a blob.
//!
//! The documents are read in one read-only transaction (one snapshot of the database); the blobs
//! are copied right after. Sealed material stays sealed: the keyring is never in a snapshot,
//! and a snapshot is useless without it.
//!
//! A restore ([`restore`]) is an offline operation into an empty store: it checks every hash
//! and the data version against this build's migration floor before it writes anything, writes
//! the migration ledgers last, and works across backends (SQLite to MongoDB).

use crate::blobs::{BlobReader, Blobs, PutMode};
use crate::migrate::{Chain, LEDGER_COLLECTION};
use crate::refusal::{Refusal, Result};
use crate::store::{Document, MAX_DOCUMENT_BYTES, Store};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt, BufReader};

/// The version of the file format this build writes and reads.
pub const FORMAT: u32 = 1;
/// The first line of every snapshot file.
const MAGIC: &str = "capstan-snapshot 1";
/// Where snapshots written to the bucket live (reserved: never copied into a snapshot).
pub const BUCKET_PREFIX: &str = "_capstan/snapshots/";
/// The file name ending of a snapshot.
pub const SUFFIX: &str = ".capstan-snapshot";
/// The blob prefixes a snapshot copies: the plugins' own data, the stored plugin bundles and
/// the identity claims. Fleet records, uploads in flight and snapshots are not copied.
pub const BLOB_PREFIXES: &[&str] = &["plugins/", "_capstan/plugins/", crate::fleet::IDENTITIES_PREFIX];
/// Collections a snapshot leaves out: workload log payloads not yet written to the bucket (the
/// logs are not data a restore brings back; their rows then read as gaps, docs/runtime.md), and
/// which fleet node holds each node's runtime session (a fleet record: sessions end with it).
pub const COLLECTIONS_LEFT_OUT: &[&str] = &[capstan_runtime::logs::LOG_INLINE, capstan_runtime::RUNTIME_NODE_SESSIONS];
/// What every snapshot says of the keyring.
pub const KEYRING_NOTICE: &str = "The keyring is not in this snapshot. Secret values, the host's signing key and \
    every other sealed value stay sealed under the keyring's KEKs: the snapshot restores a working Capstan only \
    with the keyring the host ran with. Keep that keyring safe, apart from the snapshot.";
/// Documents read per page, and written per restore transaction.
const PAGE: usize = 200;
/// Most bytes of document lines one restore transaction writes.
const BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Longest line a snapshot may hold: one document at the store's limit, with room for its id.
const MAX_LINE: u64 = MAX_DOCUMENT_BYTES as u64 + 64 * 1024;
/// Chunk size for blob bytes.
const CHUNK: usize = 64 * 1024;

/// The manifest: what a snapshot holds and how to check it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The file format ([`FORMAT`]).
    pub format: u32,
    /// When the copy was taken, in milliseconds since the Unix epoch.
    pub created_at: u64,
    /// The Capstan version that wrote it.
    pub capstan_version: String,
    /// The host's data version (its migration ledger `capstan`); `None` for a store Capstan never started on.
    pub data_version: Option<String>,
    /// Every migration ledger (the host's and each plugin's) with its data version.
    pub ledgers: Vec<LedgerSummary>,
    /// Documents in all collections.
    pub documents: u64,
    /// Blobs copied.
    pub blobs: u64,
    /// Bytes of the blobs copied.
    pub blob_bytes: u64,
    /// Whether the keyring is in the snapshot: always `false`.
    pub keyring_included: bool,
    /// What restoring needs besides the file ([`KEYRING_NOTICE`]).
    pub keyring_notice: String,
    /// Every part in file order, each with its SHA-256.
    pub parts: Vec<Part>,
}

/// One migration ledger in a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerSummary {
    /// The chain (`capstan` for the host, else a plugin's).
    pub chain: String,
    /// The data version its ledger records.
    pub data_version: Option<String>,
}

/// One part of a snapshot: a collection or a blob.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// `collection` or `blob`.
    pub kind: String,
    /// The collection's name or the blob's key.
    pub name: String,
    /// Documents in a collection part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<u64>,
    /// Bytes the part's hash covers.
    pub bytes: u64,
    /// SHA-256 (hex) of the part's document lines or of the blob's bytes.
    pub sha256: String,
}

impl Part {
    /// How refusals name the part: `collection:<name>` or `blob:<key>`.
    pub fn label(&self) -> String {
        format!("{}:{}", self.kind, self.name)
    }
}

/// What writing a snapshot produced.
#[derive(Debug, Clone)]
pub struct Written {
    /// Its manifest.
    pub manifest: Manifest,
    /// The file's length in bytes.
    pub bytes: u64,
    /// The SHA-256 (hex) of the whole file.
    pub sha256: String,
}

/// One line of the file, as read back.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
enum Record {
    Collection {
        name: String,
    },
    Document {
        id: String,
        revision: u64,
        data: Value,
    },
    Blob {
        key: String,
        size: u64,
    },
    Manifest(Manifest),
    End {
        #[serde(rename = "manifestSha256")]
        manifest_sha256: String,
    },
}

#[derive(Serialize)]
struct DocumentLine<'a> {
    kind: &'static str,
    id: &'a str,
    revision: u64,
    data: &'a Value,
}

#[derive(Serialize)]
struct ManifestLine<'a> {
    kind: &'static str,
    #[serde(flatten)]
    manifest: &'a Manifest,
}

/// `snapshot-corrupt`, naming the part that does not verify.
pub fn corrupt(part: &str, why: impl std::fmt::Display) -> Refusal {
    Refusal::new("snapshot-corrupt", format!("the snapshot does not verify at {part}: {why}")).with_data(json!({ "part": part }))
}

fn write_failed(e: std::io::Error) -> Refusal {
    Refusal::new("snapshot-write-failed", "writing the snapshot failed").retryable().detail(e)
}

fn read_failed(e: std::io::Error) -> Refusal {
    Refusal::new("snapshot-unreadable", "reading the snapshot file failed").detail(e)
}

fn line_of(value: &impl Serialize) -> Result<Vec<u8>> {
    let mut line = serde_json::to_vec(value).map_err(Refusal::internal)?;
    line.push(b'\n');
    Ok(line)
}

/// The output and the hash and length of everything written to it.
struct Out<'a, W> {
    w: &'a mut W,
    file: Sha256,
    bytes: u64,
}

impl<W: AsyncWrite + Unpin + Send> Out<'_, W> {
    async fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.w.write_all(bytes).await.map_err(write_failed)?;
        self.file.update(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }
}

/// Write a snapshot of `store` and `blobs` to `out` (flushed, not shut down), telling
/// `progress` of each part as it is done.
pub async fn write<W: AsyncWrite + Unpin + Send>(
    store: &Store,
    blobs: &Blobs,
    out: &mut W,
    progress: &(dyn Fn(&Part) + Send + Sync),
) -> Result<Written> {
    let mut out = Out { w: out, file: Sha256::new(), bytes: 0 };
    out.put(format!("{MAGIC}\n").as_bytes()).await?;
    let created_at = capstan_core::clock::now_ms();
    let mut parts = Vec::new();
    let mut ledgers = Vec::new();
    let (mut documents, mut blob_count, mut blob_bytes) = (0u64, 0u64, 0u64);

    let mut copy = store.read_everything().await?;
    let collections = copy.collections().to_vec();
    for collection in collections.into_iter().filter(|c| !COLLECTIONS_LEFT_OUT.contains(&c.as_str())) {
        out.put(&line_of(&json!({ "kind": "collection", "name": collection }))?).await?;
        let (mut hash, mut count, mut bytes) = (Sha256::new(), 0u64, 0u64);
        let mut cursor: Option<String> = None;
        loop {
            let page = copy.scan(&collection, cursor.as_deref(), PAGE).await?;
            for document in &page.documents {
                let line =
                    line_of(&DocumentLine { kind: "document", id: &document.id, revision: document.revision, data: &document.data })?;
                hash.update(&line);
                out.put(&line).await?;
                count += 1;
                bytes += line.len() as u64;
                if collection == LEDGER_COLLECTION {
                    let data_version = document.data.get("dataVersion").and_then(Value::as_str).map(str::to_string);
                    ledgers.push(LedgerSummary { chain: document.id.clone(), data_version });
                }
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        documents += count;
        let part =
            Part { kind: "collection".into(), name: collection, documents: Some(count), bytes, sha256: hex::encode(hash.finalize()) };
        progress(&part);
        parts.push(part);
    }
    copy.finish().await?;

    let mut buffer = vec![0u8; CHUNK];
    for prefix in BLOB_PREFIXES {
        let mut cursor: Option<String> = None;
        loop {
            let page = blobs.list(prefix, cursor.as_deref(), crate::blobs::MAX_LIST_LIMIT).await?;
            for item in &page.items {
                // deleted since the listing: not part of the copy
                let Some((meta, mut reader)) = blobs.get(&item.key).await? else { continue };
                out.put(&line_of(&json!({ "kind": "blob", "key": &meta.key, "size": meta.size }))?).await?;
                let mut hash = Sha256::new();
                let mut copied = 0u64;
                loop {
                    let n = reader.read(&mut buffer).await.map_err(|e| {
                        Refusal::new("blobs-unavailable", format!("reading the blob {} failed", meta.key)).retryable().detail(e)
                    })?;
                    if n == 0 {
                        break;
                    }
                    copied += n as u64;
                    if copied > meta.size {
                        break;
                    }
                    hash.update(&buffer[..n]);
                    out.put(&buffer[..n]).await?;
                }
                if copied != meta.size {
                    return Err(Refusal::new(
                        "snapshot-source-changed",
                        format!("the blob {} changed while it was copied; take the snapshot again", meta.key),
                    )
                    .retryable());
                }
                out.put(b"\n").await?;
                blob_count += 1;
                blob_bytes += meta.size;
                let part = Part {
                    kind: "blob".into(),
                    name: meta.key.clone(),
                    documents: None,
                    bytes: meta.size,
                    sha256: hex::encode(hash.finalize()),
                };
                progress(&part);
                parts.push(part);
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
    }

    let data_version = ledgers.iter().find(|l| l.chain == crate::migrate::host_chain().name).and_then(|l| l.data_version.clone());
    let manifest = Manifest {
        format: FORMAT,
        created_at,
        capstan_version: env!("CARGO_PKG_VERSION").into(),
        data_version,
        ledgers,
        documents,
        blobs: blob_count,
        blob_bytes,
        keyring_included: false,
        keyring_notice: KEYRING_NOTICE.into(),
        parts,
    };
    let manifest_line = line_of(&ManifestLine { kind: "manifest", manifest: &manifest })?;
    out.put(&manifest_line).await?;
    out.put(&line_of(&json!({ "kind": "end", "manifestSha256": hex::encode(Sha256::digest(&manifest_line)) }))?).await?;
    out.w.flush().await.map_err(write_failed)?;
    Ok(Written { manifest, bytes: out.bytes, sha256: hex::encode(out.file.finalize()) })
}

/// Write a snapshot to a new file at `path` (mode 0600; an existing file is refused `exists`),
/// removed again when the snapshot cannot be completed.
pub async fn write_file(store: &Store, blobs: &Blobs, path: &Path, progress: &(dyn Fn(&Part) + Send + Sync)) -> Result<Written> {
    let file = tokio::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Refusal::new("exists", format!("{} already exists; name a new file", path.display()))
        } else {
            Refusal::new("snapshot-write-failed", format!("cannot create {}: {}", path.display(), e.kind()))
        }
    })?;
    let mut out = tokio::io::BufWriter::with_capacity(256 * 1024, file);
    let written = async {
        let written = write(store, blobs, &mut out, progress).await?;
        out.get_mut().sync_all().await.map_err(write_failed)?;
        Ok(written)
    }
    .await;
    if written.is_err() {
        let _ = tokio::fs::remove_file(path).await;
    }
    written
}

/// The bucket key of a snapshot taken at `now_ms`: `_capstan/snapshots/capstan-<UTC time>-<random>.capstan-snapshot`,
/// so keys sort oldest first.
pub fn bucket_key(now_ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(now_ms);
    let stamp: String = humantime::format_rfc3339_seconds(at).to_string().chars().filter(|c| *c != ':').collect();
    format!("{BUCKET_PREFIX}capstan-{stamp}-{:08x}{SUFFIX}", rand::random::<u32>())
}

/// A reader over the pipe the snapshot is written into, that fails instead of ending when the
/// writer stopped before the snapshot was complete: a half snapshot is never stored.
struct Completed {
    inner: tokio::io::DuplexStream,
    complete: Arc<AtomicBool>,
}

impl AsyncRead for Completed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled
            && buf.filled().len() == before
            && !self.complete.load(Ordering::SeqCst)
        {
            return std::task::Poll::Ready(Err(std::io::Error::other("the snapshot was not completed")));
        }
        polled
    }
}

/// Write a snapshot into the blob store under [`BUCKET_PREFIX`], streamed (never whole in
/// memory), created only once it is complete.
pub async fn write_to_bucket(store: &Store, blobs: &Blobs) -> Result<(String, Written)> {
    let key = bucket_key(capstan_core::clock::now_ms());
    let (mut writer, reader) = tokio::io::duplex(256 * 1024);
    let complete = Arc::new(AtomicBool::new(false));
    let body: BlobReader = Box::pin(Completed { inner: reader, complete: complete.clone() });
    let writing = async {
        let written = write(store, blobs, &mut writer, &|_: &Part| {}).await;
        if written.is_ok() {
            complete.store(true, Ordering::SeqCst);
        }
        let _ = writer.shutdown().await;
        drop(writer);
        written
    };
    let (written, stored) = tokio::join!(writing, blobs.put(&key, body, PutMode::CreateOnly));
    // the bucket's refusal first: a writer whose reader went away only says the pipe broke
    let meta = match (stored, written) {
        (Err(refused), _) => return Err(refused),
        (Ok(_), Err(refused)) => {
            let _ = blobs.delete(&key).await;
            return Err(refused);
        }
        (Ok(meta), Ok(written)) => (meta, written),
    };
    let (meta, written) = meta;
    if meta.size != written.bytes {
        let _ = blobs.delete(&key).await;
        return Err(
            Refusal::new("snapshot-write-failed", format!("the bucket stored {} of {} bytes", meta.size, written.bytes)).retryable()
        );
    }
    Ok((key, written))
}

/// The snapshots in the bucket, oldest first.
pub async fn list_bucket(blobs: &Blobs) -> Result<Vec<crate::blobs::BlobMeta>> {
    let mut found = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = blobs.list(BUCKET_PREFIX, cursor.as_deref(), crate::blobs::MAX_LIST_LIMIT).await?;
        found.extend(page.items.into_iter().filter(|m| m.key.ends_with(SUFFIX)));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(found),
        }
    }
}

/// Keep the newest `keep_last` snapshots in the bucket (at least one), deleting the oldest
/// first; answers the keys deleted.
pub async fn prune_bucket(blobs: &Blobs, keep_last: usize) -> Result<Vec<String>> {
    let keep_last = keep_last.max(1);
    let found = list_bucket(blobs).await?;
    let excess = found.len().saturating_sub(keep_last);
    let mut deleted = Vec::new();
    for meta in found.into_iter().take(excess) {
        blobs.delete(&meta.key).await?;
        deleted.push(meta.key);
    }
    Ok(deleted)
}

/// Read one line of at most [`MAX_LINE`] bytes; `None` at the end of the file.
async fn next_line<R: AsyncBufRead + Unpin>(reader: &mut R, line: &mut Vec<u8>, part: &str) -> Result<Option<()>> {
    line.clear();
    let n = (&mut *reader).take(MAX_LINE).read_until(b'\n', line).await.map_err(read_failed)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(corrupt(part, "a line is cut short or longer than any document"));
    }
    Ok(Some(()))
}

/// A part being read: its label, hash, documents and bytes.
struct Reading {
    part: Part,
    hash: Sha256,
}

impl Reading {
    fn new(kind: &str, name: &str) -> Self {
        Reading {
            part: Part {
                kind: kind.into(),
                name: name.into(),
                documents: (kind == "collection").then_some(0),
                bytes: 0,
                sha256: String::new(),
            },
            hash: Sha256::new(),
        }
    }

    fn done(mut self) -> Part {
        self.part.sha256 = hex::encode(self.hash.finalize());
        self.part
    }
}

/// Check a snapshot file end to end: its first line, every part's hash and count against the
/// manifest, the manifest's own hash, nothing after the end. Answers the manifest; refuses
/// `snapshot-corrupt` naming the first part that does not verify.
pub async fn verify(path: &Path) -> Result<Manifest> {
    let file = open(path).await?;
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let mut line = Vec::new();
    if next_line(&mut reader, &mut line, "header").await?.is_none() || line != format!("{MAGIC}\n").as_bytes() {
        let newer = line.starts_with(b"capstan-snapshot ");
        if newer {
            return Err(Refusal::new(
                "snapshot-version-unsupported",
                format!("this snapshot's format ({}) is not one this build reads ({MAGIC})", String::from_utf8_lossy(&line).trim()),
            ));
        }
        return Err(corrupt("header", "this is not a Capstan snapshot"));
    }
    let mut seen: Vec<Part> = Vec::new();
    let mut current: Option<Reading> = None;
    let mut buffer = vec![0u8; CHUNK];
    let manifest = loop {
        let label = current.as_ref().map(|c| c.part.label()).unwrap_or_else(|| "manifest".into());
        if next_line(&mut reader, &mut line, &label).await?.is_none() {
            return Err(corrupt("manifest", "the snapshot ends before its manifest"));
        }
        let record: Record = serde_json::from_slice(&line).map_err(|e| corrupt(&label, e))?;
        match record {
            Record::Document { .. } => {
                let Some(reading) = current.as_mut().filter(|c| c.part.kind == "collection") else {
                    return Err(corrupt(&label, "a document outside any collection"));
                };
                reading.hash.update(&line);
                reading.part.bytes += line.len() as u64;
                *reading.part.documents.get_or_insert(0) += 1;
            }
            Record::Collection { name } => {
                seen.extend(current.take().map(Reading::done));
                if crate::store::validate_collection(&name).is_err() {
                    return Err(corrupt(&format!("collection:{name}"), "not a collection name"));
                }
                current = Some(Reading::new("collection", &name));
            }
            Record::Blob { key, size } => {
                seen.extend(current.take().map(Reading::done));
                if !BLOB_PREFIXES.iter().any(|p| key.starts_with(p)) || crate::blobs::validate_key(&key).is_err() {
                    return Err(corrupt(&format!("blob:{key}"), "a blob outside the prefixes a snapshot copies"));
                }
                let mut reading = Reading::new("blob", &key);
                let label = reading.part.label();
                let mut left = size;
                while left > 0 {
                    let want = left.min(CHUNK as u64) as usize;
                    let n = reader.read(&mut buffer[..want]).await.map_err(read_failed)?;
                    if n == 0 {
                        return Err(corrupt(&label, "the file ends inside the blob"));
                    }
                    reading.hash.update(&buffer[..n]);
                    left -= n as u64;
                }
                reading.part.bytes = size;
                let mut newline = [0u8; 1];
                if reader.read(&mut newline).await.map_err(read_failed)? != 1 || newline[0] != b'\n' {
                    return Err(corrupt(&label, "the blob's bytes do not end where its size says"));
                }
                seen.push(reading.done());
            }
            Record::Manifest(manifest) => {
                seen.extend(current.take().map(Reading::done));
                let manifest_hash = hex::encode(Sha256::digest(&line));
                if next_line(&mut reader, &mut line, "manifest").await?.is_none() {
                    return Err(corrupt("manifest", "the snapshot ends after its manifest, without its end line"));
                }
                match serde_json::from_slice::<Record>(&line) {
                    Ok(Record::End { manifest_sha256 }) if manifest_sha256 == manifest_hash => {}
                    _ => return Err(corrupt("manifest", "the manifest's hash does not match")),
                }
                let mut rest = [0u8; 1];
                if reader.read(&mut rest).await.map_err(read_failed)? != 0 {
                    return Err(corrupt("manifest", "bytes follow the end of the snapshot"));
                }
                break manifest;
            }
            Record::End { .. } => return Err(corrupt("manifest", "the end line comes before the manifest")),
        }
    };
    if manifest.format != FORMAT {
        return Err(Refusal::new("snapshot-version-unsupported", format!("snapshot format {} is not {FORMAT}", manifest.format))
            .with_data(json!({ "format": manifest.format })));
    }
    for (index, listed) in manifest.parts.iter().enumerate() {
        match seen.get(index) {
            Some(found) if found == listed => {}
            Some(_) | None => return Err(corrupt(&listed.label(), "its content does not match the manifest's hash or count")),
        }
    }
    if let Some(extra) = seen.get(manifest.parts.len()) {
        return Err(corrupt(&extra.label(), "a part the manifest does not list"));
    }
    Ok(manifest)
}

async fn open(path: &Path) -> Result<tokio::fs::File> {
    tokio::fs::File::open(path).await.map_err(|e| {
        Refusal::new("snapshot-unreadable", format!("cannot open {}: {}", path.display(), e.kind()))
            .with_data(json!({ "path": path.display().to_string() }))
    })
}

/// Refuse `snapshot-version-unsupported` unless the snapshot's host data version lies between
/// `chain`'s floor and its target: this build migrates it forward on its first start.
pub fn check_version(manifest: &Manifest, chain: &Chain) -> Result<()> {
    let unsupported = |why: String| {
        Refusal::new("snapshot-version-unsupported", why).with_data(json!({
            "dataVersion": manifest.data_version,
            "oldestSupported": chain.oldest_supported.to_string(),
            "target": chain.target().to_string(),
        }))
    };
    let Some(version) = &manifest.data_version else {
        return Err(unsupported("the snapshot holds no host migration ledger: it is not a copy of a Capstan that ran".into()));
    };
    let Ok(parsed) = semver::Version::parse(version) else {
        return Err(unsupported(format!("the snapshot's data version {version:?} is not a version")));
    };
    if parsed < chain.oldest_supported {
        return Err(unsupported(format!(
            "the snapshot's data version {version} is older than this build's floor {}: restore it with an older Capstan, start that once, and snapshot again",
            chain.oldest_supported
        )));
    }
    if parsed > chain.target() {
        return Err(unsupported(format!(
            "the snapshot's data version {version} is newer than this build migrates to ({}): restore it with that Capstan or newer",
            chain.target()
        )));
    }
    Ok(())
}

/// Refuse `restore-target-not-empty` when `store` holds any document or `blobs` any object
/// under the prefixes a snapshot restores.
pub async fn check_empty(store: &Store, blobs: &Blobs) -> Result<()> {
    let populated = store.populated_collections().await?;
    if !populated.is_empty() {
        return Err(Refusal::new(
            "restore-target-not-empty",
            format!(
                "the store {} already holds data ({} collections); restore only into an empty store",
                store.describe(),
                populated.len()
            ),
        )
        .with_data(json!({ "collections": populated.iter().take(10).collect::<Vec<_>>() })));
    }
    for prefix in BLOB_PREFIXES {
        if !blobs.list(prefix, None, 1).await?.items.is_empty() {
            return Err(Refusal::new(
                "restore-target-not-empty",
                format!("the blob store {} already holds objects under {prefix}; restore only into an empty one", blobs.describe()),
            )
            .with_data(json!({ "blobPrefix": prefix })));
        }
    }
    Ok(())
}

/// What a restore wrote.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Restored {
    /// The snapshot's manifest.
    pub manifest: Manifest,
    /// Collections written.
    pub collections: u64,
    /// Documents written.
    pub documents: u64,
    /// Blobs written.
    pub blobs: u64,
}

/// Restore the snapshot at `path` into `store` and `blobs`, both empty: verify the whole file
/// and its data version against `chain` first, then write every collection (the migration
/// ledgers last, so a restore cut short never looks like a finished store) and every blob.
pub async fn restore(
    path: &Path,
    store: &Store,
    blobs: &Blobs,
    chain: &Chain,
    progress: &(dyn Fn(&Part) + Send + Sync),
) -> Result<Restored> {
    let manifest = verify(path).await?;
    check_version(&manifest, chain)?;
    check_empty(store, blobs).await?;

    let mut reader = BufReader::with_capacity(256 * 1024, open(path).await?);
    let mut position: u64 = 0;
    let mut line = Vec::new();
    let mut consumed = next_line(&mut reader, &mut line, "header").await?.map(|_| line.len() as u64).unwrap_or(0);
    position += consumed;
    let (mut collections, mut documents, mut blob_count) = (0u64, 0u64, 0u64);
    let mut batch: Vec<Document> = Vec::new();
    let mut batch_bytes = 0usize;
    let mut ledgers: Vec<Document> = Vec::new();
    let mut current: Option<String> = None;
    let mut parts = manifest.parts.iter();

    async fn flush(store: &Store, collection: &Option<String>, batch: &mut Vec<Document>, bytes: &mut usize) -> Result<()> {
        if let (Some(collection), false) = (collection, batch.is_empty()) {
            store.restore_documents(collection, batch).await?;
        }
        batch.clear();
        *bytes = 0;
        Ok(())
    }

    loop {
        let label = current.as_ref().map(|c| format!("collection:{c}")).unwrap_or_else(|| "manifest".into());
        if next_line(&mut reader, &mut line, &label).await?.is_none() {
            return Err(corrupt("manifest", "the snapshot changed while it was restored"));
        }
        consumed = line.len() as u64;
        position += consumed;
        let record: Record = serde_json::from_slice(&line).map_err(|e| corrupt(&label, e))?;
        match record {
            Record::Document { id, revision, data } => {
                let document = Document { id, revision, data };
                if current.as_deref() == Some(LEDGER_COLLECTION) {
                    ledgers.push(document);
                    continue;
                }
                batch_bytes += line.len();
                batch.push(document);
                documents += 1;
                if batch.len() >= PAGE || batch_bytes >= BATCH_BYTES {
                    flush(store, &current, &mut batch, &mut batch_bytes).await?;
                }
            }
            Record::Collection { name } => {
                flush(store, &current, &mut batch, &mut batch_bytes).await?;
                if let Some(done) = current.take().and_then(|_| parts.next()) {
                    progress(done);
                }
                collections += 1;
                current = Some(name);
            }
            Record::Blob { key, size } => {
                flush(store, &current, &mut batch, &mut batch_bytes).await?;
                if let Some(done) = current.take().and_then(|_| parts.next()) {
                    progress(done);
                }
                let mut file = open(path).await?;
                file.seek(std::io::SeekFrom::Start(position)).await.map_err(read_failed)?;
                let body: BlobReader = Box::pin(file.take(size));
                let stored = blobs.put(&key, body, PutMode::CreateOnly).await?;
                if stored.size != size {
                    return Err(corrupt(&format!("blob:{key}"), "the snapshot changed while it was restored"));
                }
                reader.seek(std::io::SeekFrom::Current(size as i64 + 1)).await.map_err(read_failed)?;
                position += size + 1;
                blob_count += 1;
                if let Some(done) = parts.next() {
                    progress(done);
                }
            }
            Record::Manifest(_) | Record::End { .. } => {
                flush(store, &current, &mut batch, &mut batch_bytes).await?;
                if let Some(done) = current.take().and_then(|_| parts.next()) {
                    progress(done);
                }
                break;
            }
        }
    }
    // the ledgers last: a store holding them is a finished restore
    for chunk in ledgers.chunks(PAGE) {
        store.restore_documents(LEDGER_COLLECTION, chunk).await?;
    }
    documents += ledgers.len() as u64;
    Ok(Restored { manifest, collections, documents, blobs: blob_count })
}

/// What `system.createSnapshot` reaches: the store and the blobs.
#[derive(Clone)]
pub struct Context {
    /// The store copied.
    pub store: Store,
    /// The blobs copied, and where the snapshot is written.
    pub blobs: Blobs,
}

/// No parameters.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// The answer of `system.createSnapshot`: where the snapshot is and what it holds.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    /// The blob key under `_capstan/snapshots/`.
    pub key: String,
    /// The file's length in bytes.
    pub bytes: u64,
    /// The SHA-256 (hex) of the whole file.
    pub sha256: String,
    /// When the copy was taken, in milliseconds since the Unix epoch.
    pub created_at: u64,
    /// The host's data version in the copy.
    pub data_version: Option<String>,
    /// Collections copied.
    pub collections: u64,
    /// Documents copied.
    pub documents: u64,
    /// Blobs copied.
    pub blobs: u64,
    /// Bytes of the blobs copied.
    pub blob_bytes: u64,
    /// Always `false`: the keyring is never in a snapshot.
    pub keyring_included: bool,
    /// What restoring it needs besides the file.
    pub keyring_notice: String,
}

impl Created {
    /// The answer for a snapshot written under `key`.
    pub fn new(key: String, written: Written) -> Created {
        let manifest = written.manifest;
        Created {
            key,
            bytes: written.bytes,
            sha256: written.sha256,
            created_at: manifest.created_at,
            data_version: manifest.data_version,
            collections: manifest.parts.iter().filter(|p| p.kind == "collection").count() as u64,
            documents: manifest.documents,
            blobs: manifest.blobs,
            blob_bytes: manifest.blob_bytes,
            keyring_included: manifest.keyring_included,
            keyring_notice: manifest.keyring_notice,
        }
    }
}

/// Register `system.createSnapshot` (administrators).
pub fn register(registry: &mut capstan_rpc::Registry, context: Context) {
    registry.with(context).add(
        "system.createSnapshot",
        "Snapshot Capstan itself into the blob store under _capstan/snapshots/: every collection and the plugins' blobs, with a manifest; the keyring is never in it (administrators)",
        capstan_rpc::Access::Admin,
        |cx: Context, _: capstan_rpc::Call, _: Empty| async move {
            let (key, written) = write_to_bucket(&cx.store, &cx.blobs).await?;
            tracing::info!(%key, bytes = written.bytes, documents = written.manifest.documents, "snapshot written to the bucket");
            Ok(Created::new(key, written))
        },
    );
}

#[cfg(test)]
mod tests;
