//! What the registry keeps, and where.
//!
//! Bytes live in the blob store: a layer where its upload wrote it (`registry/data/<upload>-<n>`,
//! so a finished single-part upload is never copied), a manifest under
//! `registry/manifests/<digest>`. The document store holds the facts: one record per digest
//! (`registry_blobs`: where its bytes are), which repository holds which layer
//! (`registry_links`) and which manifest (`registry_manifests`, with its subject and what it
//! references), tags (`registry_tags`) and unfinished uploads (`registry_uploads`). A repository
//! reaches a blob only through its own link or manifest, so knowing a digest reads nothing.

use crate::errors::OciError;
use crate::names::Digest;
use capstan_blobs::digest::{DigestReader, Digesting};
use capstan_blobs::{BlobReader, Blobs, PutMode};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result as StoreResult};
use capstan_store::{CollectionSpec, Document, Store, Tx};
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// Where each digest's bytes are (id = digest).
pub const BLOBS: &str = "registry_blobs";
/// Layers a repository holds (id = `<repository>@<digest>`).
pub const LINKS: &str = "registry_links";
/// Manifests a repository holds (id = `<repository>@<digest>`).
pub const MANIFESTS: &str = "registry_manifests";
/// Tags (id = `<repository>:<tag>`).
pub const TAGS: &str = "registry_tags";
/// Unfinished uploads (id = the upload's uuid).
pub const UPLOADS: &str = "registry_uploads";

/// The registry's collections.
pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(BLOBS),
        CollectionSpec::new(LINKS).index("by_repository", &["repository"]).index("by_digest", &["digest"]),
        CollectionSpec::new(MANIFESTS).index("by_repository", &["repository"]).index("by_subject", &["repository", "subject"]),
        CollectionSpec::new(TAGS).index("by_repository", &["repository"]).index("by_digest", &["repository", "digest"]),
        CollectionSpec::new(UPLOADS),
    ]
}

/// Where one digest's bytes are.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlobRecord {
    /// The blob store key.
    pub key: String,
    /// Bytes.
    pub size: u64,
    /// When it was stored (milliseconds since the epoch).
    pub created_at: u64,
    /// When a request last used it (found it, mounted it, pushed a manifest naming it), at most
    /// [`USE_RECORDED_EVERY`] stale: retention keeps it for a day after.
    #[serde(default)]
    pub used_at: u64,
}

/// A manifest a repository holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestRecord {
    /// The repository.
    pub repository: String,
    /// Its digest.
    pub digest: String,
    /// Its media type, as pushed.
    pub media_type: String,
    /// Bytes.
    pub size: u64,
    /// The manifest it refers to (`subject`), for the referrers API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Its artifact type (`artifactType`, else its config's media type).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// Its annotations, for the referrers API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Value>,
    /// The blobs and manifests it references.
    pub references: Vec<String>,
    /// When it was first pushed to this repository (milliseconds since the epoch).
    pub created_at: u64,
    /// When a request last used it (pushed or pulled it, pushed an index naming it).
    #[serde(default)]
    pub used_at: u64,
}

/// A tag.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TagRecord {
    /// The repository.
    pub repository: String,
    /// The tag.
    pub tag: String,
    /// The manifest it names.
    pub digest: String,
    /// When it last moved (milliseconds since the epoch).
    pub updated_at: u64,
}

/// One stored part of an upload.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// The blob store key.
    pub key: String,
    /// Bytes.
    pub size: u64,
    /// Its SHA-256, hex.
    pub sha256: String,
}

/// An unfinished upload.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UploadRecord {
    /// The repository it goes to.
    pub repository: String,
    /// Who started it.
    pub user_id: String,
    /// Its parts, in order.
    pub parts: Vec<Part>,
    /// Bytes so far.
    pub size: u64,
    /// When it started (milliseconds since the epoch).
    pub created_at: u64,
    /// When a part last arrived (milliseconds since the epoch).
    pub updated_at: u64,
}

/// A read records its use only when the last record is older than this (a pull writes at most
/// once an hour per object); a push always records it. Milliseconds, as the moments it spans.
pub const USE_RECORDED_EVERY: u64 = 3600 * 1000;

/// Record that `id` was used `now`: always when `force`, else only when its last record is
/// older than [`USE_RECORDED_EVERY`]. A write here is what makes retention, deciding about
/// the same record in its own transaction, see the use or meet a conflict.
pub async fn touch(tx: &Tx, collection: &str, id: &str, now: u64, force: bool) -> StoreResult<bool> {
    let Some(doc) = tx.get(collection, id).await? else { return Ok(false) };
    let used = doc.data["usedAt"].as_u64().unwrap_or(0).max(doc.data["createdAt"].as_u64().unwrap_or(0));
    if force || used + USE_RECORDED_EVERY <= now {
        let mut data = doc.data.clone();
        data["usedAt"] = json!(now);
        tx.replace(collection, id, doc.revision, data).await?;
    }
    Ok(true)
}

/// How long an upload may sit untouched before it is removed (milliseconds).
pub const UPLOAD_IDLE_MS: u64 = 24 * 3600 * 1000;

/// Who pushes a manifest, as the reserved tags judge it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pusher<'a> {
    /// The caller (`None`: the host itself, as in retention's tests).
    pub identity: Option<&'a capstan_auth::Identity>,
    /// A deployer: its tags go only to its own deployment operations.
    pub deployer: bool,
}

/// Why a manifest PUT was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutRefused {
    /// A blob or manifest it references is not in the repository.
    BlobUnknown(String),
    /// A deployment operation (named) holds the tag.
    Reserved(String),
    /// A deployer's tag push with no operation of its own holding the tag.
    OperationRequired,
}

/// `<repository>@<digest>`.
pub fn member_id(repository: &str, digest: &str) -> String {
    format!("{repository}@{digest}")
}

/// `<repository>:<tag>`.
pub fn tag_id(repository: &str, tag: &str) -> String {
    format!("{repository}:{tag}")
}

fn parse<T: DeserializeOwned>(doc: &Document) -> StoreResult<T> {
    serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("registry record {} is malformed: {e}", doc.id)))
}

fn value<T: Serialize>(record: &T) -> StoreResult<Value> {
    serde_json::to_value(record).map_err(Refusal::internal)
}

fn unavailable(e: impl std::fmt::Display) -> Refusal {
    Refusal::new("blobs-unavailable", "reading or writing the registry's storage failed").retryable().detail(e)
}

/// The registry's storage: the document store and the blob store.
#[derive(Clone)]
pub struct Storage {
    /// Facts.
    pub store: Store,
    /// Bytes.
    pub blobs: Blobs,
}

impl Storage {
    /// Stream `body` into a new object at `key`, counting and hashing it.
    pub async fn write_part(&self, key: &str, body: BlobReader) -> StoreResult<Part> {
        let digest = Arc::new(Mutex::new(Digesting::default()));
        let meta = self.blobs.put(key, Box::pin(DigestReader::new(body, digest.clone())), PutMode::CreateOnly).await?;
        let taken = std::mem::take(&mut *digest.lock().map_err(|_| Refusal::internal("digest lock"))?).finish();
        Ok(Part { key: key.to_string(), size: meta.size, sha256: taken.sha256 })
    }

    /// Remove objects that hold nothing any record names (best effort: a leftover is only
    /// wasted space, swept with its upload).
    pub async fn discard(&self, keys: &[String]) {
        for key in keys {
            if let Err(e) = self.blobs.delete(key).await {
                tracing::warn!(key, code = %e.code, "an unused registry object was not removed: {}", e.message);
            }
        }
    }

    /// Record a read's use of `id` when its last recorded use (`used_at`) is an hour old (best
    /// effort: a failure costs only retention's grace for it).
    pub async fn note_use(&self, collection: &str, id: &str, used_at: u64) {
        let now = now_ms();
        if used_at + USE_RECORDED_EVERY > now {
            return;
        }
        let touched = self.store.transact(|tx| async move { touch(&tx, collection, id, now, false).await }).await;
        if let Err(e) = touched {
            tracing::debug!(id, code = %e.code, "a registry read's use was not recorded: {}", e.message);
        }
    }

    /// The blob `digest` as `repository` holds it (a layer it links or a manifest it holds).
    pub async fn blob_in(&self, repository: &str, digest: &Digest) -> StoreResult<Option<BlobRecord>> {
        let member = member_id(repository, digest.as_str());
        let found = self.store.read_many(&[(LINKS, &member), (MANIFESTS, &member), (BLOBS, digest.as_str())]).await?;
        match found.as_slice() {
            [link, manifest, Some(blob)] if link.is_some() || manifest.is_some() => Ok(Some(parse(blob)?)),
            _ => Ok(None),
        }
    }

    /// Open a blob's bytes from `offset` (skipping what comes before).
    pub async fn open(&self, record: &BlobRecord, offset: u64) -> StoreResult<Option<BlobReader>> {
        use tokio::io::AsyncReadExt;
        let Some((_, mut reader)) = self.blobs.get(&record.key).await? else { return Ok(None) };
        if offset > 0 {
            tokio::io::copy(&mut (&mut reader).take(offset), &mut tokio::io::sink()).await.map_err(unavailable)?;
        }
        Ok(Some(reader))
    }

    /// Record that `repository` holds the blob `digest` stored at `part` (or already stored
    /// elsewhere under that digest). Answers the keys that hold nothing now.
    pub async fn commit_blob(&self, repository: &str, digest: &Digest, part: &Part) -> StoreResult<Vec<String>> {
        let record = BlobRecord { key: part.key.clone(), size: part.size, created_at: now_ms(), used_at: now_ms() };
        let record = value(&record)?;
        let link = json!({ "repository": repository, "digest": digest.as_str(), "createdAt": now_ms() });
        let unused = self
            .store
            .transact(|tx| {
                let (record, link) = (record.clone(), link.clone());
                async move {
                    let unused = match tx.get(BLOBS, digest.as_str()).await? {
                        Some(existing) if parse::<BlobRecord>(&existing)?.key != part.key => {
                            // the stored copy serves: marked used, so retention cannot take it now
                            touch(&tx, BLOBS, digest.as_str(), now_ms(), true).await?;
                            vec![part.key.clone()]
                        }
                        Some(_) => vec![],
                        None => {
                            tx.insert(BLOBS, digest.as_str(), record).await?;
                            vec![]
                        }
                    };
                    link_in(&tx, repository, digest, link).await?;
                    Ok(unused)
                }
            })
            .await?;
        Ok(unused)
    }

    /// Link the blob `digest` from `from` into `to`, when `from` holds it.
    pub async fn mount(&self, from: &str, to: &str, digest: &Digest) -> StoreResult<bool> {
        let link = json!({ "repository": to, "digest": digest.as_str(), "createdAt": now_ms() });
        self.store
            .transact(|tx| {
                let link = link.clone();
                async move {
                    let member = member_id(from, digest.as_str());
                    let held = tx.get(LINKS, &member).await?.is_some() || tx.get(MANIFESTS, &member).await?.is_some();
                    if !held || !touch(&tx, BLOBS, digest.as_str(), now_ms(), true).await? {
                        return Ok(false);
                    }
                    link_in(&tx, to, digest, link).await?;
                    Ok(true)
                }
            })
            .await
    }

    /// Remove `repository`'s link to a layer; `false` when it held none.
    pub async fn unlink(&self, repository: &str, digest: &Digest) -> StoreResult<bool> {
        self.delete_present(LINKS, &member_id(repository, digest.as_str())).await
    }

    /// Delete the document `id` of `collection` if it is there; whether it was.
    pub async fn delete_present(&self, collection: &str, id: &str) -> StoreResult<bool> {
        self.store
            .transact(|tx| async move {
                let Some(doc) = tx.get(collection, id).await? else { return Ok(false) };
                tx.delete(collection, id, doc.revision).await?;
                Ok(true)
            })
            .await
    }

    /// Every document of `collection`, read page by page (each page its own transaction).
    pub async fn scan_all(&self, collection: &str) -> StoreResult<Vec<Document>> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .store
                .transact(|tx| {
                    let cursor = cursor.clone();
                    async move { tx.scan(collection, cursor.as_deref(), 500).await }
                })
                .await?;
            all.extend(page.documents);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// Store a manifest's bytes and record it in `repository` (and under `tag`), once every
    /// blob and manifest it references is there and the tag is `pusher`'s to push (a deployment
    /// operation's reserved tag takes only its own deployer's push, which records its digest).
    pub async fn put_manifest(
        &self,
        record: ManifestRecord,
        bytes: Vec<u8>,
        tag: Option<&str>,
        pusher: &Pusher<'_>,
    ) -> StoreResult<Result<(), PutRefused>> {
        let key = format!("registry/manifests/{}", record.digest);
        let size = bytes.len() as u64;
        self.blobs.put_bytes(&key, bytes, PutMode::Overwrite).await?;
        let blob = value(&BlobRecord { key: key.clone(), size, created_at: now_ms(), used_at: now_ms() })?;
        let data = value(&record)?;
        let tag_data = tag.map(|tag| TagRecord {
            repository: record.repository.clone(),
            tag: tag.into(),
            digest: record.digest.clone(),
            updated_at: now_ms(),
        });
        let tag_data = tag_data.as_ref().map(value).transpose()?;
        let record = &record;
        self.store
            .transact(|tx| {
                let (blob, data, tag_data) = (blob.clone(), data.clone(), tag_data.clone());
                async move {
                    // every record this manifest stands on is marked used in this transaction, so
                    // retention deciding about one of them now conflicts with it and keeps it
                    let now = now_ms();
                    for reference in &record.references {
                        let member = member_id(&record.repository, reference);
                        let link = tx.get(LINKS, &member).await?.is_some();
                        let held = link || touch(&tx, MANIFESTS, &member, now, true).await?;
                        if !held || !touch(&tx, BLOBS, reference, now, true).await? {
                            return Ok(Err(PutRefused::BlobUnknown(reference.clone())));
                        }
                    }
                    let binding = match pusher.identity {
                        Some(identity) => crate::deployments::binding(&tx, &record.repository, tag, identity).await?,
                        None => crate::deployments::Binding::Free,
                    };
                    match &binding {
                        crate::deployments::Binding::Reserved(operation) => return Ok(Err(PutRefused::Reserved(operation.clone()))),
                        crate::deployments::Binding::Free if pusher.deployer && tag.is_some() => {
                            return Ok(Err(PutRefused::OperationRequired));
                        }
                        _ => {}
                    }
                    if !touch(&tx, BLOBS, &record.digest, now, true).await? {
                        tx.insert(BLOBS, &record.digest, blob).await?;
                    }
                    let member = member_id(&record.repository, &record.digest);
                    if !touch(&tx, MANIFESTS, &member, now, true).await? {
                        tx.insert(MANIFESTS, &member, data).await?;
                    }
                    if let (Some(tag), Some(tag_data)) = (tag, tag_data) {
                        let id = tag_id(&record.repository, tag);
                        let current = tx.get(TAGS, &id).await?;
                        let unchanged = current.as_ref().is_some_and(|d| d.data["digest"] == record.digest.as_str());
                        if !unchanged {
                            tx.put(TAGS, &id, current.map(|d| d.revision), tag_data).await?;
                        }
                    }
                    if let crate::deployments::Binding::Own(operation) = &binding {
                        crate::deployments::record_image(&tx, operation, &record.digest, &record.media_type).await?;
                    }
                    Ok(Ok(()))
                }
            })
            .await
    }

    /// The manifest `reference` names in `repository`, with where its bytes are.
    pub async fn manifest(
        &self,
        repository: &str,
        reference: &crate::names::Reference,
    ) -> StoreResult<Option<(ManifestRecord, BlobRecord)>> {
        let digest = match reference {
            crate::names::Reference::Digest(d) => d.as_str().to_string(),
            crate::names::Reference::Tag(tag) => match self.store.read_many(&[(TAGS, &tag_id(repository, tag))]).await?.pop().flatten() {
                Some(doc) => parse::<TagRecord>(&doc)?.digest,
                None => return Ok(None),
            },
        };
        let found = self.store.read_many(&[(MANIFESTS, &member_id(repository, &digest)), (BLOBS, &digest)]).await?;
        match found.as_slice() {
            [Some(manifest), Some(blob)] => Ok(Some((parse(manifest)?, parse(blob)?))),
            _ => Ok(None),
        }
    }

    /// Read a manifest's bytes (manifests are small: at most [`crate::manifests::MAX_MANIFEST`]).
    pub async fn manifest_bytes(&self, blob: &BlobRecord) -> StoreResult<Option<Vec<u8>>> {
        Ok(self.blobs.get_bytes(&blob.key).await?.map(|(_, bytes)| bytes))
    }

    /// Delete a manifest from `repository` with every tag naming it; `false` when absent.
    pub async fn delete_manifest(&self, repository: &str, digest: &Digest) -> StoreResult<bool> {
        self.store
            .transact(|tx| async move {
                let member = member_id(repository, digest.as_str());
                let Some(doc) = tx.get(MANIFESTS, &member).await? else { return Ok(false) };
                for tag in tx.find_all(TAGS, "by_digest", &[json!(repository), json!(digest.as_str())]).await? {
                    tx.delete(TAGS, &tag.id, tag.revision).await?;
                }
                tx.delete(MANIFESTS, &member, doc.revision).await?;
                Ok(true)
            })
            .await
    }

    /// Delete a tag; `false` when absent.
    pub async fn delete_tag(&self, repository: &str, tag: &str) -> StoreResult<bool> {
        self.delete_present(TAGS, &tag_id(repository, tag)).await
    }

    /// Up to `limit` tags of `repository` after `last`, in order, and whether more remain;
    /// `None` when the repository holds nothing at all.
    pub async fn tags(&self, repository: &str, last: Option<&str>, limit: usize) -> StoreResult<Option<(Vec<String>, bool)>> {
        let cursor = last.map(|t| tag_id(repository, t));
        self.store
            .transact(|tx| {
                let cursor = cursor.clone();
                async move {
                    let page = tx.find(TAGS, "by_repository", &[json!(repository)], cursor.as_deref(), limit).await?;
                    if page.documents.is_empty()
                        && cursor.is_none()
                        && tx.find(MANIFESTS, "by_repository", &[json!(repository)], None, 1).await?.documents.is_empty()
                    {
                        return Ok(None);
                    }
                    let tags = page.documents.iter().map(|d| parse::<TagRecord>(d).map(|t| t.tag)).collect::<StoreResult<Vec<_>>>()?;
                    Ok(Some((tags, page.next_cursor.is_some())))
                }
            })
            .await
    }

    /// The manifests of `repository` whose subject is `digest`.
    pub async fn referrers(&self, repository: &str, digest: &Digest) -> StoreResult<Vec<ManifestRecord>> {
        self.store
            .transact(|tx| async move {
                let docs = tx.find_all(MANIFESTS, "by_subject", &[json!(repository), json!(digest.as_str())]).await?;
                docs.iter().map(parse).collect()
            })
            .await
    }

    /// Start an upload into `repository`.
    pub async fn start_upload(&self, repository: &str, user_id: &str) -> StoreResult<String> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let at = now_ms();
        let record = value(&UploadRecord {
            repository: repository.into(),
            user_id: user_id.into(),
            parts: vec![],
            size: 0,
            created_at: at,
            updated_at: at,
        })?;
        self.store
            .transact(|tx| {
                let (id, record) = (id.clone(), record.clone());
                async move { tx.insert(UPLOADS, &id, record).await }
            })
            .await?;
        Ok(id)
    }

    /// An upload of `repository` and its revision.
    pub async fn upload(&self, repository: &str, id: &str) -> StoreResult<Option<(UploadRecord, u64)>> {
        if uuid::Uuid::try_parse(id).is_err() {
            return Ok(None);
        }
        let Some(doc) = self.store.read_many(&[(UPLOADS, id)]).await?.pop().flatten() else { return Ok(None) };
        let record: UploadRecord = parse(&doc)?;
        Ok((record.repository == repository).then_some((record, doc.revision)))
    }

    /// The key an upload's next part goes to.
    pub fn part_key(id: &str, index: usize) -> String {
        format!("registry/data/{id}-{index}")
    }

    /// Record `part` as the upload's next part, if nothing else changed it since `revision`.
    pub async fn add_part(&self, id: &str, mut record: UploadRecord, revision: u64, part: Part) -> StoreResult<Result<UploadRecord, ()>> {
        record.size += part.size;
        record.updated_at = now_ms();
        record.parts.push(part);
        let data = value(&record)?;
        let saved = self
            .store
            .transact(|tx| {
                let data = data.clone();
                async move { tx.replace(UPLOADS, id, revision, data).await }
            })
            .await;
        match saved {
            Ok(_) => Ok(Ok(record)),
            Err(e) if e.is("conflict") || e.is("not-found") => Ok(Err(())),
            Err(e) => Err(e),
        }
    }

    /// The upload's bytes as one part: its only part, or its parts joined into a new object.
    pub async fn joined(&self, id: &str, parts: &[Part]) -> StoreResult<Part> {
        match parts {
            [only] => Ok(only.clone()),
            _ => {
                let blobs = self.blobs.clone();
                let stream = futures::stream::iter(parts.to_vec())
                    .then(move |part| {
                        let blobs = blobs.clone();
                        async move {
                            match blobs.get(&part.key).await {
                                Ok(Some((_, reader))) => Ok(tokio_util::io::ReaderStream::new(reader)),
                                Ok(None) => Err(std::io::Error::other(format!("upload part {} is gone", part.key))),
                                Err(e) => Err(std::io::Error::other(e.message)),
                            }
                        }
                    })
                    .try_flatten()
                    .boxed();
                self.write_part(&format!("registry/data/{id}-joined"), Box::pin(tokio_util::io::StreamReader::new(stream))).await
            }
        }
    }

    /// Forget an upload: its record, then its parts except `keep`.
    pub async fn end_upload(&self, id: &str, parts: &[Part], keep: Option<&str>) -> StoreResult<()> {
        self.store
            .transact(|tx| async move {
                if let Some(doc) = tx.get(UPLOADS, id).await? {
                    tx.delete(UPLOADS, id, doc.revision).await?;
                }
                Ok(())
            })
            .await?;
        let unused: Vec<String> = parts.iter().map(|p| p.key.clone()).filter(|k| Some(k.as_str()) != keep).collect();
        self.discard(&unused).await;
        Ok(())
    }

    /// Remove uploads untouched for [`UPLOAD_IDLE_MS`] before `now` (milliseconds since the epoch): how many.
    pub async fn expire_uploads(&self, now: u64) -> StoreResult<usize> {
        let mut expired = Vec::new();
        for doc in self.scan_all(UPLOADS).await? {
            let record: UploadRecord = parse(&doc)?;
            if record.updated_at + UPLOAD_IDLE_MS <= now {
                expired.push((doc.id, record));
            }
        }
        for (id, record) in &expired {
            self.end_upload(id, &record.parts, None).await?;
            // a part being written when the record was read has no entry yet: its key is known
            self.discard(&[Self::part_key(id, record.parts.len()), format!("registry/data/{id}-joined")]).await;
        }
        Ok(expired.len())
    }
}

async fn link_in(tx: &Tx, repository: &str, digest: &Digest, link: Value) -> StoreResult<()> {
    let member = member_id(repository, digest.as_str());
    if tx.get(LINKS, &member).await?.is_none() {
        tx.insert(LINKS, &member, link).await?;
    }
    Ok(())
}

/// A missing object behind a record is the store being inconsistent with the bucket.
pub fn missing_bytes(digest: &str) -> OciError {
    OciError::from(Refusal::new("registry-object-missing", "the registry's record names bytes its storage no longer holds").retryable())
        .with_data(json!({ "digest": digest }))
}
