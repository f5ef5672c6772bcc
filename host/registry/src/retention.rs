//! Registry retention: what nothing reaches any more leaves the registry's storage.
//!
//! One pass judges every repository from a listing of the whole registry, then deletes, each
//! deletion in its own short transaction that judges its record again:
//!
//! - **releases** (deployment operations that recorded a pushed digest): kept when it is the one
//!   its service runs (`release`), its operation is not finished (awaiting or pushed, not
//!   promoted), it is among its service's [`Limits::keep_promoted`] newest promoted besides the
//!   current one, it was reserved or promoted less than [`Limits::release_age`] ago, another kept
//!   release has the same digest, or its service is being deleted. Every other release is
//!   pruned, oldest first, at most [`Limits::max_releases`] a pass: its tag (when it still names
//!   its digest), then its row, in one transaction. Its claim on the tag stays, so the version is
//!   never reserved again.
//! - **manifests**: kept when a tag names one, a kept release names it, its service's newest push
//!   (`registryPush`) names it, or it was pushed or used less than [`Limits::grace`] ago — together with everything a
//!   kept manifest references in its repository and the manifests whose subject it is
//!   (signatures, attestations). Every manifest of a repository that maps to no service is kept
//!   (and the repository named in the summary) — except a deleted service's: its deletion
//!   retires its repository ([`retire_service_repository`]), and the next pass deletes the
//!   repository's tags, then its manifests, whatever their age; its blobs go by the rule below.
//! - **blobs** (layers, configs, manifests' bytes): deleted when no manifest left references
//!   one and it was written and last used more than the grace ago — and only when every
//!   deletable manifest is gone, nothing failed, and this process has served for
//!   [`Limits::uptime_for_blobs`] (a client may have found a blob before a restart and push the
//!   manifest naming it after).
//!
//! - **orphaned objects**: an object under `registry/` that no blob record and no unfinished
//!   upload names (a push that stopped between writing its bytes and recording them) is noted
//!   when a pass first finds it and deleted by a pass at least [`Limits::grace`] later, if it is
//!   still unnamed then — under the same conditions as blobs.
//!
//! Nothing is locked. Every push marks the records it stands on used in its own transaction
//! (`storage::touch`), and each deletion re-reads its record and deletes it at the revision it
//! judged, so a push that lands during a pass either made the record young (kept) or conflicts
//! with the deletion (retried, then kept). A manifest PUT naming a blob already collected is
//! refused `MANIFEST_BLOB_UNKNOWN`, and the client pushes the blob again.
//!
//! At most [`Limits::max_deletions`] objects go per pass; a pass that stops early, or where a
//! step failed, leaves `workRemains` set and the next pass (an hour later, not a day) finishes:
//! nothing depends on what an earlier pass did.

use crate::deployments::{OPERATIONS, Operation};
use crate::names::service_repository;
use crate::storage::{BLOBS, BlobRecord, LINKS, MANIFESTS, ManifestRecord, Storage, TAGS, TagRecord};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::services::{Service, ServiceState};
use capstan_store::{CollectionSpec, Document, Tx};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

/// Retention's own record (id [`STATE`]): when the last pass ran and whether it left work.
pub const RETENTION: &str = "registry_retention";
/// The one document of [`RETENTION`].
pub const STATE: &str = "state";
/// The document of [`RETENTION`] that notes orphaned objects: `{since: {key: firstSeenAt}}`.
pub const ORPHANS: &str = "orphans";
/// Most orphaned objects noted at once (the rest are noted by a later pass).
const MAX_ORPHANS_NOTED: usize = 10_000;
/// Repositories of deleted services, to be emptied (id: the repository).
pub const RETIRED: &str = "registry_retired_repositories";

/// Retention's collections.
pub fn collections() -> Vec<CollectionSpec> {
    vec![CollectionSpec::new(RETENTION), CollectionSpec::new(RETIRED)]
}

/// Retire the repository of service `service_id`, inside the transaction that deletes the
/// service (while its row is still there): the next pass empties it. A host without the
/// registry's collections retires nothing.
pub async fn retire_service_repository(tx: &Tx, service_id: &str) -> Result<()> {
    if !tx.is_declared(RETIRED) {
        return Ok(());
    }
    let Some(doc) = tx.get(capstan_inventory::SERVICES, service_id).await? else { return Ok(()) };
    let service: Service = parse(&doc)?;
    let repository = service_repository(&service.name, service_id);
    let held = tx.get(RETIRED, &repository).await?.map(|d| d.revision);
    let record = json!({ "serviceId": service_id, "retiredAt": capstan_core::clock::now_ms() });
    tx.put(RETIRED, &repository, held, record).await.map(drop)
}

/// What a pass may do.
#[derive(Debug, Clone)]
pub struct Limits {
    /// How long a manifest or blob is kept after it was written or last used (milliseconds).
    pub grace: u64,
    /// How long this process must have served before blobs are collected (milliseconds).
    pub uptime_for_blobs: u64,
    /// Most objects deleted in one pass.
    pub max_deletions: usize,
    /// A release younger than this is kept (milliseconds).
    pub release_age: u64,
    /// How many promoted releases besides the current one a service keeps (its rollback targets).
    pub keep_promoted: usize,
    /// Most releases pruned in one pass.
    pub max_releases: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            grace: 24 * HOUR,
            uptime_for_blobs: HOUR,
            max_deletions: 20_000,
            release_age: 7 * 24 * HOUR,
            keep_promoted: 3,
            max_releases: 200,
        }
    }
}

/// An hour in milliseconds: every span here is in the unit of the moments it is added to.
const HOUR: u64 = 3600 * 1000;

/// How often a pass runs (milliseconds): daily, or hourly while the last one left work.
pub const EVERY: u64 = 24 * HOUR;
/// See [`EVERY`].
pub const RETRY_EVERY: u64 = HOUR;
/// The first pass after a start waits this long (milliseconds).
pub const FIRST_PASS_AFTER: u64 = 180 * 1000;

/// What one pass did: its summary line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Repositories judged.
    pub repositories: usize,
    /// Releases pruned (their tags and rows).
    pub releases_pruned: usize,
    /// The most releases one service recorded within the release age (no service named: it
    /// tells whether the age rule needs a count cap).
    pub most_recent_releases: usize,
    /// Manifests deleted, and their bytes.
    pub manifests_deleted: usize,
    /// See above.
    pub manifest_bytes: u64,
    /// Orphaned objects deleted (bytes no record named).
    pub orphans_deleted: usize,
    /// Blobs deleted (layers, configs, manifests' bytes), and their bytes.
    pub blobs_deleted: usize,
    /// See above.
    pub blob_bytes: u64,
    /// Why blobs were not collected this pass, if they were not.
    pub blobs_skipped: Option<String>,
    /// Repositories that map to no service: kept whole.
    pub unmapped: Vec<String>,
    /// Repositories of deleted services emptied this pass.
    pub retired: usize,
    /// Deletions that failed (each is tried again by the next pass).
    pub failures: usize,
    /// Whether the next pass should come in an hour rather than a day.
    pub work_remains: bool,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "registry retention: {} repositories judged; {} releases pruned (at most {} of one service within the release age); {} manifests deleted ({} bytes); {} blobs deleted ({} bytes)",
            self.repositories,
            self.releases_pruned,
            self.most_recent_releases,
            self.manifests_deleted,
            self.manifest_bytes,
            self.blobs_deleted,
            self.blob_bytes
        )?;
        if self.orphans_deleted > 0 {
            write!(f, "; {} orphaned objects deleted", self.orphans_deleted)?;
        }
        if let Some(why) = &self.blobs_skipped {
            write!(f, "; blobs not collected: {why}")?;
        }
        if self.retired > 0 {
            write!(f, "; {} repositories of deleted services emptied", self.retired)?;
        }
        if !self.unmapped.is_empty() {
            let shown: Vec<&str> = self.unmapped.iter().take(20).map(String::as_str).collect();
            write!(f, "; {} repositories map to no service and are kept: {}", self.unmapped.len(), shown.join(", "))?;
            if self.unmapped.len() > shown.len() {
                write!(f, ", …")?;
            }
        }
        write!(f, "; {} failures; work remains: {}", self.failures, if self.work_remains { "yes" } else { "no" })
    }
}

fn parse<T: serde::de::DeserializeOwned>(doc: &Document) -> Result<T> {
    serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("registry record {} is malformed: {e}", doc.id)))
}

fn last_use(created_at: u64, used_at: u64) -> u64 {
    created_at.max(used_at)
}

/// The manifests one pass would delete, by repository, and the repositories that map to no
/// service (judged from one listing).
#[derive(Debug, Default)]
pub struct Judgement {
    /// Repositories seen.
    pub repositories: usize,
    /// `(repository, digest)` of every manifest nothing keeps.
    pub doomed: Vec<(String, String)>,
    /// Operation ids of the releases to prune, oldest first (at most the limit).
    pub releases: Vec<String>,
    /// See [`Summary::most_recent_releases`].
    pub most_recent_releases: usize,
    /// Whether more releases were prunable than one pass prunes.
    pub releases_left: bool,
    /// Repositories that map to no service.
    pub unmapped: Vec<String>,
    /// Repositories of deleted services, with the ids of their tags and the digests of their
    /// manifests: all of it goes.
    pub retired: BTreeMap<String, (Vec<String>, Vec<String>)>,
}

/// Judge every repository as it is now.
pub async fn judge(storage: &Storage, now: u64, limits: &Limits) -> Result<Judgement> {
    let mut services: HashMap<String, Option<String>> = HashMap::new();
    let mut by_id: HashMap<String, Service> = HashMap::new();
    for doc in storage.scan_all(capstan_inventory::SERVICES).await? {
        let service: Service = parse(&doc)?;
        let pushed = service.registry_push.as_ref().filter(|_| service.state == ServiceState::Active).map(|p| p.digest.clone());
        services.insert(service_repository(&service.name, &doc.id), pushed);
        by_id.insert(doc.id, service);
    }
    let (kept_releases, mut doomed_releases, most_recent) = judge_releases(storage, &by_id, now, limits).await?;
    let releases_left = doomed_releases.len() > limits.max_releases;
    doomed_releases.truncate(limits.max_releases);
    let mut manifests: BTreeMap<String, Vec<ManifestRecord>> = BTreeMap::new();
    for doc in storage.scan_all(MANIFESTS).await? {
        let record: ManifestRecord = parse(&doc)?;
        manifests.entry(record.repository.clone()).or_default().push(record);
    }
    let mut retired: BTreeMap<String, (Vec<String>, Vec<String>)> =
        storage.scan_all(RETIRED).await?.into_iter().map(|d| (d.id, Default::default())).collect();
    let mut tagged: HashMap<String, HashSet<String>> = HashMap::new();
    for doc in storage.scan_all(TAGS).await? {
        let tag: TagRecord = parse(&doc)?;
        if let Some((tags, _)) = retired.get_mut(&tag.repository) {
            tags.push(doc.id);
            continue;
        }
        tagged.entry(tag.repository).or_default().insert(tag.digest);
    }
    let mut judgement = Judgement {
        repositories: manifests.len(),
        releases: doomed_releases,
        most_recent_releases: most_recent,
        releases_left,
        ..Judgement::default()
    };
    for (repository, records) in manifests {
        if let Some((_, doomed)) = retired.get_mut(&repository) {
            doomed.extend(records.into_iter().map(|m| m.digest));
            continue;
        }
        let Some(pushed) = services.get(&repository) else {
            judgement.unmapped.push(repository);
            continue;
        };
        let mut kept: HashSet<&str> = records
            .iter()
            .filter(|m| last_use(m.created_at, m.used_at) + limits.grace > now)
            .map(|m| m.digest.as_str())
            .chain(tagged.get(&repository).into_iter().flatten().map(String::as_str))
            .chain(pushed.as_deref())
            .chain(kept_releases.get(&repository).into_iter().flatten().map(String::as_str))
            .collect();
        // what a kept manifest references, and what refers to a kept one, until nothing changes
        loop {
            let before = kept.len();
            for m in &records {
                if kept.contains(m.digest.as_str()) {
                    kept.extend(m.references.iter().map(String::as_str));
                } else if m.subject.as_deref().is_some_and(|s| kept.contains(s)) {
                    kept.insert(m.digest.as_str());
                }
            }
            if kept.len() == before {
                break;
            }
        }
        judgement
            .doomed
            .extend(records.iter().filter(|m| !kept.contains(m.digest.as_str())).map(|m| (repository.clone(), m.digest.clone())));
    }
    judgement.retired = retired;
    Ok(judgement)
}

/// The digests kept releases name, by repository; the operation ids of the releases to prune,
/// oldest first; the most releases one service recorded within the release age.
async fn judge_releases(
    storage: &Storage,
    services: &HashMap<String, Service>,
    now: u64,
    limits: &Limits,
) -> Result<(HashMap<String, HashSet<String>>, Vec<String>, usize)> {
    let mut by_service: BTreeMap<String, Vec<(String, Operation)>> = BTreeMap::new();
    for doc in storage.scan_all(OPERATIONS).await? {
        let operation: Operation = parse(&doc)?;
        if operation.digest.is_some() {
            by_service.entry(operation.service_id.clone()).or_default().push((doc.id, operation));
        }
    }
    let mut kept: HashMap<String, HashSet<String>> = HashMap::new();
    let mut doomed: Vec<(u64, String, String, String)> = Vec::new();
    let mut most_recent = 0;
    for (service_id, mut releases) in by_service {
        let service = services.get(&service_id);
        let current = service.and_then(|s| s.release.as_ref()).map(|r| r.operation_id.clone());
        let deleting = service.is_some_and(|s| s.state != ServiceState::Active);
        let at = |o: &Operation| o.promoted_at.unwrap_or(0).max(o.created_at);
        most_recent = most_recent.max(releases.iter().filter(|(_, o)| at(o) + limits.release_age > now).count());
        // newest promoted first: the rollback targets
        releases.sort_by_key(|(_, o)| std::cmp::Reverse(o.promoted_at.unwrap_or(0)));
        let mut promoted_kept = 0;
        let mut keep_ids = HashSet::new();
        for (id, o) in &releases {
            let is_current = current.as_deref() == Some(id.as_str());
            let unfinished = o.state.unfinished();
            let rollback = o.state.promoted() && !is_current && promoted_kept < limits.keep_promoted;
            if rollback {
                promoted_kept += 1;
            }
            if is_current || unfinished || rollback || deleting || at(o) + limits.release_age > now {
                keep_ids.insert(id.clone());
            }
        }
        let kept_digests: HashSet<String> =
            releases.iter().filter(|(id, _)| keep_ids.contains(id)).filter_map(|(_, o)| o.digest.clone()).collect();
        for (id, o) in releases {
            let digest = o.digest.clone().unwrap_or_default();
            if keep_ids.contains(&id) || kept_digests.contains(&digest) {
                kept.entry(o.repository.clone()).or_default().insert(digest);
            } else {
                doomed.push((at(&o), id, o.repository, digest));
            }
        }
    }
    doomed.sort();
    Ok((kept, doomed.into_iter().map(|(_, id, _, _)| id).collect(), most_recent))
}

/// Prune one release judged again in this transaction: its tag (when it still names the
/// release's digest), then its row. Its claim on the tag stays.
async fn prune_release(tx: &Tx, operation_id: &str) -> Result<bool> {
    let Some(doc) = tx.get(OPERATIONS, operation_id).await? else { return Ok(false) };
    let operation: Operation = parse(&doc)?;
    if operation.state.unfinished() {
        return Ok(false);
    }
    if let Some(service) = tx.get(capstan_inventory::SERVICES, &operation.service_id).await?
        && service.data["release"]["operationId"] == operation_id
    {
        return Ok(false);
    }
    let tag = crate::storage::tag_id(&operation.repository, &operation.tag);
    if let Some(tag_doc) = tx.get(TAGS, &tag).await?
        && tag_doc.data["digest"].as_str() == operation.digest.as_deref()
    {
        tx.delete(TAGS, &tag, tag_doc.revision).await?;
    }
    tx.delete(OPERATIONS, operation_id, doc.revision).await?;
    Ok(true)
}

/// Delete one manifest if, judged again in this transaction, nothing keeps it: its bytes.
async fn delete_manifest(tx: &Tx, repository: &str, digest: &str, now: u64, grace: u64) -> Result<Option<u64>> {
    let id = crate::storage::member_id(repository, digest);
    let Some(doc) = tx.get(MANIFESTS, &id).await? else { return Ok(None) };
    let record: ManifestRecord = parse(&doc)?;
    if last_use(record.created_at, record.used_at) + grace > now
        || !tx.find(TAGS, "by_digest", &[json!(repository), json!(digest)], None, 1).await?.documents.is_empty()
    {
        return Ok(None);
    }
    tx.delete(MANIFESTS, &id, doc.revision).await?;
    Ok(Some(record.size))
}

/// Delete one blob record (and every repository's link to it) if, judged again, it is still
/// old: its record.
async fn delete_blob(tx: &Tx, digest: &str, now: u64, grace: u64) -> Result<Option<BlobRecord>> {
    let Some(doc) = tx.get(BLOBS, digest).await? else { return Ok(None) };
    let record: BlobRecord = parse(&doc)?;
    if last_use(record.created_at, record.used_at) + grace > now {
        return Ok(None);
    }
    for link in tx.find_all(LINKS, "by_digest", &[json!(digest)]).await? {
        tx.delete(LINKS, &link.id, link.revision).await?;
    }
    tx.delete(BLOBS, digest, doc.revision).await?;
    Ok(Some(record))
}

/// Empty a deleted service's repository: its tags, then its manifests (no grace: nothing may
/// use them any more), then — when these are all of it (`whole`) — the mark, each in a short
/// transaction. Answers the manifests deleted and their bytes.
async fn empty_retired(
    storage: &Storage,
    repository: &str,
    tags: &[String],
    digests: &[String],
    whole: bool,
    now: u64,
) -> Result<(usize, u64)> {
    for id in tags {
        storage.delete_present(TAGS, id).await?;
    }
    let (mut manifests, mut bytes) = (0, 0);
    for digest in digests {
        let digest = digest.as_str();
        if let Some(size) = storage.store.transact(|tx| async move { delete_manifest(&tx, repository, digest, now, 0).await }).await? {
            manifests += 1;
            bytes += size;
        }
    }
    if whole {
        storage.delete_present(RETIRED, repository).await?;
        tracing::info!(repository, manifests, "registry retention emptied a deleted service's repository");
    }
    Ok((manifests, bytes))
}

/// Delete what `judgement` dooms, then (when allowed) every blob nothing left references.
pub async fn sweep(storage: &Storage, judgement: Judgement, now: u64, uptime: u64, limits: &Limits) -> Result<Summary> {
    let mut summary = Summary {
        repositories: judgement.repositories,
        unmapped: judgement.unmapped,
        most_recent_releases: judgement.most_recent_releases,
        ..Summary::default()
    };
    for id in &judgement.releases {
        let id = id.as_str();
        match storage.store.transact(|tx| async move { prune_release(&tx, id).await }).await {
            Ok(true) => summary.releases_pruned += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(operation = id, code = %e.code, "registry retention could not prune a release: {}", e.message);
                summary.failures += 1;
            }
        }
    }
    let mut budget = limits.max_deletions;
    let mut manifests_done = true;
    for (repository, (tags, digests)) in &judgement.retired {
        // as much as the budget allows; the mark stays until the whole repository went
        let take_tags = tags.len().min(budget);
        let take_digests = digests.len().min(budget - take_tags);
        let whole = take_tags == tags.len() && take_digests == digests.len();
        budget -= take_tags + take_digests;
        match empty_retired(storage, repository, &tags[..take_tags], &digests[..take_digests], whole, now).await {
            Ok((manifests, bytes)) => {
                summary.manifests_deleted += manifests;
                summary.manifest_bytes += bytes;
                summary.retired += usize::from(whole);
            }
            Err(e) => {
                tracing::warn!(repository, code = %e.code, "registry retention could not empty a deleted service's repository: {}", e.message);
                summary.failures += 1;
            }
        }
        if !whole {
            manifests_done = false;
            break;
        }
    }
    for (repository, digest) in &judgement.doomed {
        if budget == 0 {
            manifests_done = false;
            break;
        }
        let (repository, digest) = (repository.as_str(), digest.as_str());
        match storage.store.transact(|tx| async move { delete_manifest(&tx, repository, digest, now, limits.grace).await }).await {
            Ok(Some(bytes)) => {
                summary.manifests_deleted += 1;
                summary.manifest_bytes += bytes;
                budget -= 1;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(repository, digest, code = %e.code, "registry retention could not delete a manifest: {}", e.message);
                summary.failures += 1;
            }
        }
    }
    summary.blobs_skipped = if !manifests_done {
        Some("the pass reached its deletion limit".into())
    } else if summary.failures > 0 {
        Some("a deletion failed".into())
    } else if uptime < limits.uptime_for_blobs {
        Some(format!("this process has served for less than {} seconds", limits.uptime_for_blobs / 1000))
    } else {
        None
    };
    if summary.blobs_skipped.is_none() {
        let mut referenced: HashSet<String> = HashSet::new();
        for doc in storage.scan_all(MANIFESTS).await? {
            let record: ManifestRecord = parse(&doc)?;
            referenced.extend(record.references);
            referenced.insert(record.digest);
        }
        let candidates: BTreeSet<String> =
            storage.scan_all(BLOBS).await?.into_iter().map(|d| d.id).filter(|d| !referenced.contains(d)).collect();
        for digest in &candidates {
            if budget == 0 {
                summary.blobs_skipped = Some("the pass reached its deletion limit".into());
                break;
            }
            let digest = digest.as_str();
            match storage.store.transact(|tx| async move { delete_blob(&tx, digest, now, limits.grace).await }).await {
                Ok(Some(record)) => {
                    storage.discard(std::slice::from_ref(&record.key)).await;
                    summary.blobs_deleted += 1;
                    summary.blob_bytes += record.size;
                    budget -= 1;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(digest, code = %e.code, "registry retention could not delete a blob: {}", e.message);
                    summary.failures += 1;
                }
            }
        }
    }
    if summary.blobs_skipped.is_none() {
        match sweep_orphans(storage, now, limits.grace, &mut budget).await {
            Ok(deleted) => summary.orphans_deleted = deleted,
            Err(e) => {
                tracing::warn!(code = %e.code, "registry retention could not sweep orphaned objects: {}", e.message);
                summary.failures += 1;
            }
        }
    }
    summary.work_remains = summary.failures > 0
        || !manifests_done
        || judgement.releases_left
        || summary.releases_pruned > 0
        || summary.blobs_skipped.as_deref().is_some_and(|w| w.contains("limit"));
    Ok(summary)
}

/// Note the objects under `registry/` nothing names, and delete those a pass at least `grace`
/// ago noted already: how many went.
async fn sweep_orphans(storage: &Storage, now: u64, grace: u64, budget: &mut usize) -> Result<usize> {
    use crate::storage::UPLOADS;
    let mut named: HashSet<String> = HashSet::new();
    for doc in storage.scan_all(BLOBS).await? {
        named.insert(parse::<BlobRecord>(&doc)?.key);
    }
    // an unfinished upload's parts, and the ones being written, start with its id
    let uploads: Vec<String> = storage.scan_all(UPLOADS).await?.into_iter().map(|d| format!("registry/data/{}-", d.id)).collect();
    let mut unnamed = Vec::new();
    let mut cursor = None;
    loop {
        let page = storage.blobs.backend().list("registry/", cursor.as_deref(), capstan_blobs::MAX_LIST_LIMIT).await?;
        unnamed.extend(
            page.items
                .into_iter()
                .map(|item| item.key)
                .filter(|key| !named.contains(key) && !uploads.iter().any(|prefix| key.starts_with(prefix.as_str()))),
        );
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let noted = storage.store.read_many(&[(RETENTION, ORPHANS)]).await?.pop().flatten();
    let since: BTreeMap<String, u64> =
        noted.as_ref().and_then(|d| serde_json::from_value(d.data["since"].clone()).ok()).unwrap_or_default();
    let mut still = BTreeMap::new();
    let mut deleted = 0;
    for key in unnamed {
        match since.get(&key) {
            Some(&first) if first + grace <= now && *budget > 0 => {
                storage.discard(std::slice::from_ref(&key)).await;
                *budget -= 1;
                deleted += 1;
            }
            Some(&first) => {
                still.insert(key, first);
            }
            None if still.len() < MAX_ORPHANS_NOTED => {
                still.insert(key, now);
            }
            None => {}
        }
    }
    let record = json!({ "since": still });
    storage
        .store
        .transact(|tx| {
            let record = record.clone();
            async move {
                let current = tx.get(RETENTION, ORPHANS).await?;
                tx.put(RETENTION, ORPHANS, current.map(|d| d.revision), record).await.map(drop)
            }
        })
        .await?;
    Ok(deleted)
}

/// One pass: judge, sweep, and record when it ran and whether work remains.
pub async fn pass(storage: &Storage, now: u64, uptime: u64, limits: &Limits) -> Result<Summary> {
    let judgement = judge(storage, now, limits).await?;
    let summary = sweep(storage, judgement, now, uptime, limits).await?;
    let state = json!({ "lastPassAt": now, "workRemains": summary.work_remains });
    storage
        .store
        .transact(|tx| {
            let state = state.clone();
            async move {
                let current = tx.get(RETENTION, STATE).await?;
                tx.put(RETENTION, STATE, current.map(|d| d.revision), state).await.map(|_| ())
            }
        })
        .await?;
    Ok(summary)
}

/// Whether a pass is due `now`: a day after the last, or an hour after one that left work.
pub async fn due(storage: &Storage, now: u64) -> Result<bool> {
    let state = storage.store.read_many(&[(RETENTION, STATE)]).await?.pop().flatten();
    Ok(match state {
        None => true,
        Some(doc) => {
            let last = doc.data["lastPassAt"].as_u64().unwrap_or(0);
            let every = if doc.data["workRemains"].as_bool().unwrap_or(false) { RETRY_EVERY } else { EVERY };
            last + every <= now
        }
    })
}

#[cfg(test)]
mod tests;
