//! Retention's keep rules and limits on fixtures in a real SQLite store and blob directory.

use super::*;
use crate::manifests::{self, OCI_INDEX, OCI_MANIFEST};
use crate::names::{Digest, Reference};
use crate::storage::{self, ManifestRecord, Storage};
use capstan_blobs::Blobs;
use capstan_blobs::local::LocalBlobs;
use capstan_core::clock::now_ms;
use capstan_store::Store;
use serde_json::{Value, json};
use std::collections::HashMap;

// spans in milliseconds, as the moments they are added to
const DAY: u64 = 24 * 3600 * 1000;
const SERVED: u64 = 2 * 3600 * 1000;

struct Fixture {
    storage: Storage,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
    capstan_inventory::declare(&store).await.unwrap();
    crate::declare(&store).await.unwrap();
    let blobs = Blobs::new(LocalBlobs::open(dir.path().join("blobs").to_str().unwrap()).await.unwrap());
    Fixture { storage: Storage { store, blobs }, _dir: dir }
}

const SERVICE_ID: &str = "svc_0123456789abcdef0123456789abcdef";
const REPO: &str = "workloads/web-0123456789ab";

async fn service(storage: &Storage, pushed: Option<&str>) {
    service_with(storage, pushed, None).await
}

/// The fixture's service, with its newest push and the release it runs.
async fn service_with(storage: &Storage, pushed: Option<&str>, release: Option<(&str, &str)>) {
    let mut data =
        json!({ "name": "web", "organizationId": "org_1", "image": "x", "scale": 1, "state": "active", "createdAt": 1, "updatedAt": 1 });
    if let Some(digest) = pushed {
        data["registryPush"] = json!({ "tag": "gone", "digest": digest, "pushedAt": 1 });
    }
    if let Some((operation, digest)) = release {
        data["release"] = json!({ "operationId": operation, "tag": "t", "digest": digest, "promotedAt": 1 });
    }
    storage
        .store
        .transact(|tx| {
            let data = data.clone();
            async move { tx.insert(capstan_inventory::SERVICES, SERVICE_ID, data).await }
        })
        .await
        .unwrap();
}

async fn blob(storage: &Storage, repo: &str, bytes: &[u8]) -> String {
    let key = Storage::part_key(&uuid::Uuid::new_v4().simple().to_string(), 0);
    let part = storage.write_part(&key, Box::pin(std::io::Cursor::new(bytes.to_vec()))).await.unwrap();
    let digest = Digest::from_hex(&part.sha256);
    storage.commit_blob(repo, &digest, &part).await.unwrap();
    digest.to_string()
}

fn descriptor(media_type: &str, digest: &str) -> Value {
    json!({ "mediaType": media_type, "digest": digest, "size": 1 })
}

async fn manifest(storage: &Storage, repo: &str, body: Value, tag: Option<&str>) -> Result<String, String> {
    let bytes = serde_json::to_vec(&body).unwrap();
    let judged = manifests::judge(&bytes, None).unwrap();
    let digest = manifests::digest_of(&bytes).to_string();
    let record = ManifestRecord {
        repository: repo.into(),
        digest: digest.clone(),
        media_type: judged.media_type,
        size: bytes.len() as u64,
        subject: judged.subject,
        artifact_type: judged.artifact_type,
        annotations: judged.annotations,
        references: judged.references,
        created_at: now_ms(),
        used_at: now_ms(),
    };
    storage.put_manifest(record, bytes, tag, &storage::Pusher::default()).await.unwrap().map(|()| digest).map_err(|e| match e {
        storage::PutRefused::BlobUnknown(d) => d,
        other => panic!("{other:?}"),
    })
}

async fn image(storage: &Storage, repo: &str, layers: &[&str], tag: Option<&str>, extra: Value) -> String {
    let config = blob(storage, repo, format!("config {layers:?} {extra}").as_bytes()).await;
    let layers: Vec<Value> = layers.iter().map(|l| descriptor("application/vnd.oci.image.layer.v1.tar+gzip", l)).collect();
    let mut body = json!({ "schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descriptor("application/vnd.oci.image.config.v1+json", &config), "layers": layers });
    if let Value::Object(extra) = extra {
        body.as_object_mut().unwrap().extend(extra);
    }
    manifest(storage, repo, body, tag).await.unwrap()
}

/// Make every record look written and used `ms` ago.
async fn age_everything(storage: &Storage, ms: u64) {
    let then = now_ms() - ms;
    for collection in [storage::BLOBS, storage::MANIFESTS] {
        storage
            .store
            .transact(|tx| async move {
                for doc in tx.scan(collection, None, 1000).await?.documents {
                    let mut data = doc.data.clone();
                    data["createdAt"] = json!(then);
                    data["usedAt"] = json!(then);
                    tx.replace(collection, &doc.id, doc.revision, data).await?;
                }
                Ok(())
            })
            .await
            .unwrap();
    }
}

async fn has_manifest(storage: &Storage, repo: &str, digest: &str) -> bool {
    storage.manifest(repo, &Reference::Digest(Digest::parse(digest).unwrap())).await.unwrap().is_some()
}

async fn has_blob(storage: &Storage, repo: &str, digest: &str) -> bool {
    let Some(record) = storage.blob_in(repo, &Digest::parse(digest).unwrap()).await.unwrap() else { return false };
    storage.blobs.head(&record.key).await.unwrap().is_some()
}

#[tokio::test]
async fn every_keep_rule_holds_and_the_rest_goes() {
    let f = fixture().await;
    let s = &f.storage;
    let shared = blob(s, REPO, b"shared layer").await;
    let only_old = blob(s, REPO, b"layer only the old manifest has").await;
    let loose = blob(s, REPO, b"a layer no manifest names").await;
    let tagged = image(s, REPO, &[&shared], Some("v1"), json!({})).await;
    let pushed = image(s, REPO, &[&shared], None, json!({ "annotations": { "n": "pushed" } })).await;
    let young = image(s, REPO, &[&shared], None, json!({ "annotations": { "n": "young" } })).await;
    let child = image(s, REPO, &[&shared], None, json!({ "annotations": { "n": "child" } })).await;
    let index = manifest(
        s,
        REPO,
        json!({ "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [descriptor(OCI_MANIFEST, &child)] }),
        Some("multi"),
    )
    .await
    .unwrap();
    let signature = image(
        s,
        REPO,
        &[&shared],
        None,
        json!({ "subject": descriptor(OCI_MANIFEST, &tagged), "artifactType": "application/example.sig" }),
    )
    .await;
    let old = image(s, REPO, &[&shared, &only_old], None, json!({ "annotations": { "n": "old" } })).await;
    let unmapped_layer = blob(s, "tools/ci", b"an administrator's own image").await;
    let unmapped = image(s, "tools/ci", &[&unmapped_layer], None, json!({})).await;
    service(s, Some(&pushed)).await;
    age_everything(s, 2 * DAY).await;
    s.store
        .transact(|tx| {
            let id = storage::member_id(REPO, &young);
            async move { storage::touch(&tx, storage::MANIFESTS, &id, now_ms(), true).await }
        })
        .await
        .unwrap();

    let summary = pass(s, now_ms(), SERVED, &Limits::default()).await.unwrap();
    for (what, digest) in
        [("tagged", &tagged), ("pushed", &pushed), ("young", &young), ("index", &index), ("child", &child), ("signature", &signature)]
    {
        assert!(has_manifest(s, REPO, digest).await, "the {what} manifest is kept");
    }
    assert!(!has_manifest(s, REPO, &old).await, "the old untagged manifest goes");
    assert!(has_blob(s, REPO, &shared).await, "a layer kept manifests name stays");
    assert!(!has_blob(s, REPO, &only_old).await, "a layer only a deleted manifest named goes");
    assert!(!has_blob(s, REPO, &loose).await, "an old layer no manifest names goes");
    assert!(
        has_manifest(s, "tools/ci", &unmapped).await && has_blob(s, "tools/ci", &unmapped_layer).await,
        "an unmapped repository is kept whole"
    );
    assert_eq!(summary.unmapped, vec!["tools/ci".to_string()]);
    assert_eq!(summary.manifests_deleted, 1);
    // the old manifest's bytes, its config, its own layer and the loose layer
    assert_eq!(summary.blobs_deleted, 4, "{summary}");
    assert!(!summary.work_remains && summary.failures == 0, "{summary}");
    assert!(!due(s, now_ms()).await.unwrap(), "the next pass is a day away");
    assert!(due(s, now_ms() + EVERY).await.unwrap());
    let line = summary.to_string();
    assert!(line.contains("1 manifests deleted") && line.contains("tools/ci") && line.contains("work remains: no"), "{line}");

    // nothing left to do: a second pass deletes nothing
    let again = pass(s, now_ms(), SERVED, &Limits::default()).await.unwrap();
    assert_eq!((again.manifests_deleted, again.blobs_deleted), (0, 0));
}

#[tokio::test]
async fn young_things_and_a_fresh_process_keep_their_blobs() {
    let f = fixture().await;
    let s = &f.storage;
    service(s, None).await;
    let layer = blob(s, REPO, b"layer").await;
    let m = image(s, REPO, &[&layer], None, json!({})).await;
    // everything is new: nothing goes
    let summary = pass(s, now_ms(), SERVED, &Limits::default()).await.unwrap();
    assert_eq!((summary.manifests_deleted, summary.blobs_deleted), (0, 0));
    age_everything(s, 2 * DAY).await;
    // a process that has served less than an hour deletes manifests but no blob
    let summary = pass(s, now_ms(), 60_000, &Limits::default()).await.unwrap();
    assert!(!has_manifest(s, REPO, &m).await);
    assert_eq!(summary.blobs_deleted, 0);
    assert!(summary.blobs_skipped.as_deref().unwrap().contains("less than"), "{summary}");
    let summary = pass(s, now_ms(), SERVED, &Limits::default()).await.unwrap();
    assert!(summary.blobs_deleted >= 2 && !has_blob(s, REPO, &layer).await, "{summary}");
}

#[tokio::test]
async fn a_pass_stops_at_its_deletion_limit_and_the_next_one_finishes() {
    let f = fixture().await;
    let s = &f.storage;
    service(s, None).await;
    let layer = blob(s, REPO, b"layer").await;
    let first = image(s, REPO, &[&layer], None, json!({ "annotations": { "n": "1" } })).await;
    let second = image(s, REPO, &[&layer], None, json!({ "annotations": { "n": "2" } })).await;
    age_everything(s, 2 * DAY).await;
    let limits = Limits { max_deletions: 1, ..Limits::default() };
    let summary = pass(s, now_ms(), SERVED, &limits).await.unwrap();
    assert_eq!(summary.manifests_deleted, 1);
    assert!(summary.work_remains && summary.blobs_skipped.is_some(), "{summary}");
    assert!(!due(s, now_ms()).await.unwrap() && due(s, now_ms() + RETRY_EVERY).await.unwrap(), "work left: the next pass comes in an hour");
    assert!(has_manifest(s, REPO, &first).await != has_manifest(s, REPO, &second).await);
    let mut passes = 0;
    while has_blob(s, REPO, &layer).await {
        pass(s, now_ms(), SERVED, &limits).await.unwrap();
        passes += 1;
        assert!(passes < 10, "the passes finish");
    }
    assert!(!has_manifest(s, REPO, &first).await && !has_manifest(s, REPO, &second).await);
}

#[tokio::test]
async fn a_push_during_a_pass_loses_nothing() {
    let f = fixture().await;
    let s = &f.storage;
    service(s, None).await;
    let layer = blob(s, REPO, b"old layer").await;
    let old = image(s, REPO, &[&layer], None, json!({})).await;
    age_everything(s, 2 * DAY).await;
    let judgement = judge(s, now_ms(), &Limits::default()).await.unwrap();
    assert_eq!(judgement.doomed.len(), 1, "the old manifest is judged deletable");
    // meanwhile: a client tags the old manifest, and pushes a new one naming the old layer
    let bytes = s.manifest(REPO, &Reference::Digest(Digest::parse(&old).unwrap())).await.unwrap().unwrap();
    let body = s.manifest_bytes(&bytes.1).await.unwrap().unwrap();
    assert_eq!(manifest(s, REPO, serde_json::from_slice(&body).unwrap(), Some("rescued")).await.unwrap(), old);
    let fresh = image(s, REPO, &[&layer], Some("fresh"), json!({ "annotations": { "n": "fresh" } })).await;
    let summary = sweep(s, judgement, now_ms(), SERVED, &Limits::default()).await.unwrap();
    assert_eq!(summary.manifests_deleted, 0, "{summary}");
    assert!(has_manifest(s, REPO, &old).await && has_manifest(s, REPO, &fresh).await);
    assert!(has_blob(s, REPO, &layer).await, "the layer both name survives");
}

#[tokio::test]
async fn a_manifest_naming_a_collected_blob_is_refused_so_the_client_pushes_it_again() {
    let f = fixture().await;
    let s = &f.storage;
    service(s, None).await;
    let layer = blob(s, REPO, b"soon gone").await;
    age_everything(s, 2 * DAY).await;
    pass(s, now_ms(), SERVED, &Limits::default()).await.unwrap();
    let config = blob(s, REPO, b"config").await;
    let body = json!({ "schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descriptor("application/vnd.oci.image.config.v1+json", &config), "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer)] });
    assert_eq!(manifest(s, REPO, body.clone(), Some("v1")).await.unwrap_err(), layer);
    assert_eq!(blob(s, REPO, b"soon gone").await, layer);
    manifest(s, REPO, body, Some("v1")).await.unwrap();
}

/// A deployment operation `id` in `state` that pushed `digest` under `tag`, reserved and
/// promoted `days_ago`.
async fn release(storage: &Storage, id: &str, tag: &str, digest: &str, state: crate::deployments::State, days_ago: u64) {
    let at = now_ms() - days_ago * DAY;
    let operation = crate::deployments::Operation {
        service_id: SERVICE_ID.into(),
        repository: REPO.into(),
        tag: tag.into(),
        actor_user_id: "machine_ci".into(),
        state,
        digest: Some(digest.into()),
        media_type: Some(OCI_MANIFEST.into()),
        created_at: at,
        updated_at: at,
        promoted_at: state.promoted().then_some(at),
        rollout_generation: None,
        previous_image: None,
        routes: Vec::new(),
        routes_published: Vec::new(),
        rolled_back_at: None,
        route_evidence: Vec::new(),
        route_diagnostic: None,
    };
    let data = serde_json::to_value(&operation).unwrap();
    storage
        .store
        .transact(|tx| {
            let data = data.clone();
            async move { tx.insert(crate::deployments::OPERATIONS, id, data).await }
        })
        .await
        .unwrap();
}

async fn has_release(storage: &Storage, id: &str) -> bool {
    storage.store.read_many(&[(crate::deployments::OPERATIONS, id)]).await.unwrap()[0].is_some()
}

async fn has_tag(storage: &Storage, tag: &str) -> bool {
    storage.store.read_many(&[(storage::TAGS, &storage::tag_id(REPO, tag))]).await.unwrap()[0].is_some()
}

#[tokio::test]
async fn releases_keep_the_current_the_unfinished_the_rollback_targets_and_the_young() {
    use crate::deployments::State::{CleanedUp, ImagePushed, Promoted};
    let f = fixture().await;
    let s = &f.storage;
    let layer = blob(s, REPO, b"shared").await;
    let mut digests = HashMap::new();
    for tag in ["current", "p1", "p2", "p3", "p4", "p5", "waiting", "young"] {
        digests.insert(tag, image(s, REPO, &[&layer], Some(tag), json!({ "annotations": { "tag": tag } })).await);
    }
    service_with(s, None, Some(("op_current", &digests["current"]))).await;
    release(s, "op_current", "current", &digests["current"], Promoted, 40).await;
    for (i, tag) in ["p1", "p2", "p3", "p4", "p5"].iter().enumerate() {
        release(s, &format!("op_{tag}"), tag, &digests[tag], Promoted, 30 - i as u64).await;
    }
    release(s, "op_waiting", "waiting", &digests["waiting"], ImagePushed, 30).await;
    release(s, "op_young", "young", &digests["young"], CleanedUp, 2).await;
    age_everything(s, 2 * DAY).await;

    let limits = Limits { max_releases: 1, ..Limits::default() };
    let first = pass(s, now_ms(), SERVED, &limits).await.unwrap();
    assert_eq!(first.releases_pruned, 1, "{first}");
    assert!(!has_release(s, "op_p1").await && !has_tag(s, "p1").await, "the oldest goes first, its tag with it");
    assert!(has_release(s, "op_p2").await && first.work_remains, "one per pass at this limit, and work remains: {first}");
    assert_eq!(first.most_recent_releases, 1, "only the young one is within the release age: {first}");

    let second = pass(s, now_ms(), SERVED, &Limits::default()).await.unwrap();
    assert_eq!(second.releases_pruned, 1, "{second}");
    assert!(!has_release(s, "op_p2").await && !has_tag(s, "p2").await);
    assert!(!has_manifest(s, REPO, &digests["p1"]).await, "the manifest of a pruned release goes once nothing reaches it");
    for id in ["op_current", "op_p3", "op_p4", "op_p5", "op_waiting", "op_young"] {
        assert!(has_release(s, id).await, "{id} is kept");
    }
    for tag in ["current", "p3", "p4", "p5", "waiting", "young"] {
        assert!(has_tag(s, tag).await && has_manifest(s, REPO, &digests[tag]).await, "{tag} is kept");
    }
    let third = pass(s, now_ms(), SERVED, &Limits::default()).await.unwrap();
    assert_eq!(third.releases_pruned, 0, "{third}");
    assert!(!has_manifest(s, REPO, &digests["p2"]).await);
    assert!(has_blob(s, REPO, &layer).await, "the layer kept releases share stays");
}

#[tokio::test]
async fn an_upload_untouched_for_a_day_is_removed_with_its_parts() {
    let f = fixture().await;
    let s = &f.storage;
    let id = s.start_upload(REPO, "user_1").await.unwrap();
    let (record, revision) = s.upload(REPO, &id).await.unwrap().unwrap();
    let key = Storage::part_key(&id, 0);
    let part = s.write_part(&key, Box::pin(std::io::Cursor::new(b"half a layer".to_vec()))).await.unwrap();
    s.add_part(&id, record, revision, part).await.unwrap().unwrap();
    assert_eq!(s.expire_uploads(now_ms()).await.unwrap(), 0, "a fresh upload stays");
    assert_eq!(s.expire_uploads(now_ms() + storage::UPLOAD_IDLE_MS).await.unwrap(), 1);
    assert!(s.upload(REPO, &id).await.unwrap().is_none());
    assert!(s.blobs.head(&key).await.unwrap().is_none(), "its part is gone");
}

#[tokio::test]
async fn a_deleted_service_s_repository_is_emptied_by_the_next_pass_and_its_blobs_follow_after_the_grace() {
    let f = fixture().await;
    let s = &f.storage;
    service(s, None).await;
    let layer = blob(s, REPO, b"the deleted service's layer").await;
    let tagged = image(s, REPO, &[&layer], Some("stable"), json!({})).await;
    let untagged = image(s, REPO, &[&layer], None, json!({ "n": 2 })).await;
    // another repository's young, untagged manifest is not touched
    let other_repo = "workloads/api-fedcba987654";
    let other_layer = blob(s, other_repo, b"another service's layer").await;
    let other = image(s, other_repo, &[&other_layer], None, json!({})).await;
    // the service's deletion retires its repository (in its own transaction, while the row is there)
    s.store
        .transact(|tx| async move {
            super::retire_service_repository(&tx, SERVICE_ID).await?;
            let doc = tx.require(capstan_inventory::SERVICES, SERVICE_ID).await?;
            tx.delete(capstan_inventory::SERVICES, SERVICE_ID, doc.revision).await
        })
        .await
        .unwrap();
    // a repository mark is all retirement writes; a host without the registry retires nothing
    let summary = pass(s, now_ms(), SERVED, &Limits::default()).await.unwrap();
    assert_eq!((summary.retired, summary.manifests_deleted), (1, 2), "{summary}");
    assert!(summary.to_string().contains("1 repositories of deleted services emptied"), "{summary}");
    assert!(!has_tag(s, "stable").await);
    assert!(!has_manifest(s, REPO, &tagged).await && !has_manifest(s, REPO, &untagged).await);
    assert!(has_manifest(s, other_repo, &other).await, "another repository keeps its young manifest");
    assert!(has_blob(s, REPO, &layer).await, "blobs keep their grace");
    assert!(s.store.read_many(&[(super::RETIRED, REPO)]).await.unwrap()[0].is_none(), "the mark goes with the repository");
    assert!(!summary.unmapped.contains(&REPO.to_string()), "{summary}");
    // an administrator's later push to the name is an unmapped repository's, kept
    let later = image(s, REPO, &[&layer], Some("again"), json!({ "n": 3 })).await;
    age_everything(s, 2 * DAY).await;
    let summary = pass(s, now_ms(), SERVED, &Limits::default()).await.unwrap();
    assert!(has_manifest(s, REPO, &later).await && summary.unmapped.contains(&REPO.to_string()), "{summary}");
}

#[tokio::test]
async fn a_retired_repository_larger_than_the_pass_s_limit_is_emptied_over_passes() {
    let f = fixture().await;
    let s = &f.storage;
    service(s, None).await;
    let layer = blob(s, REPO, b"layer").await;
    for n in 0..3 {
        image(s, REPO, &[&layer], Some(&format!("t{n}")), json!({ "n": n })).await;
    }
    s.store.transact(|tx| async move { super::retire_service_repository(&tx, SERVICE_ID).await }).await.unwrap();
    let limits = Limits { max_deletions: 4, ..Limits::default() };
    let first = pass(s, now_ms(), SERVED, &limits).await.unwrap();
    assert_eq!((first.retired, first.work_remains), (0, true), "{first}");
    assert!(s.store.read_many(&[(super::RETIRED, REPO)]).await.unwrap()[0].is_some(), "the mark stays until all of it went");
    let second = pass(s, now_ms(), SERVED, &limits).await.unwrap();
    assert_eq!(second.retired, 1, "{second}");
    assert_eq!(first.manifests_deleted + second.manifests_deleted, 3);
}

#[tokio::test]
async fn an_object_no_record_names_is_noted_then_deleted_a_grace_later() {
    let f = fixture().await;
    let s = &f.storage;
    let layer = blob(s, REPO, b"a named layer").await;
    image(s, REPO, &[&layer], Some("kept"), json!({})).await;
    // a push that stopped after writing its bytes, and an upload still under way
    let orphan = Storage::part_key("stopped", 0);
    s.blobs.put_bytes(&orphan, b"nobody recorded me".to_vec(), capstan_blobs::PutMode::Overwrite).await.unwrap();
    let upload = s.start_upload(REPO, "user_1").await.unwrap();
    let writing = Storage::part_key(&upload, 0);
    s.blobs.put_bytes(&writing, b"arriving".to_vec(), capstan_blobs::PutMode::Overwrite).await.unwrap();
    let exists = |key: String| async move { s.blobs.get_bytes(&key).await.unwrap().is_some() };

    let now = now_ms();
    let first = pass(s, now, SERVED, &Limits::default()).await.unwrap();
    assert_eq!(first.orphans_deleted, 0, "first noted: {first}");
    assert!(exists(orphan.clone()).await);
    // a grace later the orphan goes, and nothing a record or an upload names does
    let later = pass(s, now + 2 * DAY, SERVED, &Limits::default()).await.unwrap();
    assert_eq!(later.orphans_deleted, 1, "{later}");
    assert!(later.to_string().contains("1 orphaned objects deleted"), "{later}");
    assert!(!exists(orphan).await);
    assert!(exists(writing).await, "an unfinished upload's part is named by the upload");
    assert!(has_blob(s, REPO, &layer).await, "a recorded blob stays");
}
