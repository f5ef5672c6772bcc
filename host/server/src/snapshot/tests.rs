use super::*;
use crate::blobs::local::LocalBlobs;
use crate::store::{CollectionSpec, DEFAULT_BUDGET, sqlite::SqliteStore};

struct Host {
    store: Store,
    blobs: Blobs,
}

async fn host(dir: &Path, name: &str) -> Host {
    let store = Store::new(SqliteStore::open(dir.join(format!("{name}.sqlite"))).unwrap(), DEFAULT_BUDGET);
    let blobs = Blobs::new(LocalBlobs::open(dir.join(format!("{name}-blobs")).to_str().unwrap()).await.unwrap());
    Host { store, blobs }
}

/// A source with a migrated ledger, documents at several revisions in two collections, and
/// blobs under every copied prefix and one that is not copied.
async fn populated(dir: &Path) -> Host {
    let source = host(dir, "source").await;
    let store = &source.store;
    crate::migrate::run(store, &crate::migrate::host_chain(), &crate::migrate::LockOptions::for_this_process()).await.unwrap();
    store.declare(CollectionSpec::new("users").unique("by_name", &["name"])).await.unwrap();
    store.declare(CollectionSpec::new("plugin_appstore_apps")).await.unwrap();
    store
        .transact(|tx| async move {
            tx.insert("users", "u1", json!({"name": "ada", "sealed": "c2VhbGVk"})).await?;
            tx.replace("users", "u1", 1, json!({"name": "ada", "sealed": "c2VhbGVkMg"})).await?;
            tx.insert("users", "u2", json!({"name": "grace"})).await?;
            for i in 0..(PAGE + 3) {
                tx.insert("plugin_appstore_apps", &format!("app-{i:04}"), json!({"n": i})).await?;
            }
            Ok(())
        })
        .await
        .unwrap();
    // workload logs are not copied: neither payloads waiting in the store nor segments
    store.declare(CollectionSpec::new(capstan_runtime::logs::LOG_INLINE)).await.unwrap();
    store
        .transact(|tx| async move {
            tx.insert(capstan_runtime::logs::LOG_INLINE, "asg_1.000.0000000001", json!({"payload": "a log line"})).await?;
            Ok(())
        })
        .await
        .unwrap();
    let put = |key: &str, bytes: Vec<u8>| {
        let blobs = source.blobs.clone();
        let key = key.to_string();
        async move { blobs.put_bytes(&key, bytes, PutMode::Overwrite).await.unwrap() }
    };
    put("plugins/appstore/catalog.json", b"{\"apps\":[]}".to_vec()).await;
    put("plugins/appstore/big.bin", (0..200_000u32).map(|i| (i % 251) as u8).collect()).await;
    put("_capstan/plugins/appstore/1.0.0-abc.capstan-plugin", b"bundle".to_vec()).await;
    put("_capstan/identities/user-1", b"{}".to_vec()).await;
    put("_capstan/nodes/n1.json", b"{}".to_vec()).await;
    put("runtime-logs/svc_1/asg_1/0123456789abcdef/1-1.jsonl", b"{}\n".to_vec()).await;
    source
}

async fn everything(store: &Store) -> Vec<(String, Document)> {
    let mut all = Vec::new();
    let mut copy = store.read_everything().await.unwrap();
    for collection in copy.collections().to_vec() {
        let mut cursor = None;
        loop {
            let page = copy.scan(&collection, cursor.as_deref(), 1000).await.unwrap();
            all.extend(page.documents.into_iter().map(|d| (collection.clone(), d)));
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
    }
    copy.finish().await.unwrap();
    all
}

async fn blob_keys(blobs: &Blobs) -> Vec<String> {
    blobs.list("", None, 1000).await.unwrap().items.into_iter().map(|m| m.key).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_every_document_at_its_revision_and_every_copied_blob() {
    let dir = tempfile::tempdir().unwrap();
    let source = populated(dir.path()).await;
    let file = dir.path().join("one.capstan-snapshot");
    let told = std::sync::Mutex::new(Vec::new());
    let written = write_file(&source.store, &source.blobs, &file, &|p: &Part| told.lock().unwrap().push(p.label())).await.unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(written.bytes, std::fs::metadata(&file).unwrap().len());
    assert_eq!(written.sha256, hex::encode(Sha256::digest(std::fs::read(&file).unwrap())));
    let manifest = &written.manifest;
    assert_eq!(manifest.data_version.as_deref(), Some(crate::migrate::host_chain().target().to_string().as_str()));
    assert_eq!(manifest.documents, 1 + 2 + PAGE as u64 + 3);
    assert_eq!(manifest.blobs, 4, "the fleet's node record and log segments are not copied: {:?}", manifest.parts);
    assert!(!manifest.keyring_included && manifest.keyring_notice.contains("keyring"));
    assert_eq!(told.into_inner().unwrap(), manifest.parts.iter().map(Part::label).collect::<Vec<_>>());
    assert_eq!(verify(&file).await.unwrap(), *manifest);

    let target = host(dir.path(), "target").await;
    let restored = restore(&file, &target.store, &target.blobs, &crate::migrate::host_chain(), &|_: &Part| {}).await.unwrap();
    assert_eq!((restored.documents, restored.blobs), (manifest.documents, 4));
    let mut kept = everything(&source.store).await;
    kept.retain(|(collection, _)| collection != capstan_runtime::logs::LOG_INLINE);
    assert_eq!(everything(&target.store).await, kept, "same documents, same revisions, no log payloads");
    let mut copied = blob_keys(&source.blobs).await;
    copied.retain(|k| !k.starts_with("_capstan/nodes/") && !k.starts_with("runtime-logs/"));
    assert_eq!(blob_keys(&target.blobs).await, copied);
    for key in &copied {
        assert_eq!(target.blobs.get_bytes(key).await.unwrap().unwrap().1, source.blobs.get_bytes(key).await.unwrap().unwrap().1, "{key}");
    }
    // the host declares its indexes over the restored data when it starts
    target.store.declare(CollectionSpec::new("users").unique("by_name", &["name"])).await.unwrap();
    let found = target.store.transact(|tx| async move { tx.find("users", "by_name", &[json!("grace")], None, 10).await }).await.unwrap();
    assert_eq!(found.documents.len(), 1);
    let outcome =
        crate::migrate::run(&target.store, &crate::migrate::host_chain(), &crate::migrate::LockOptions::for_this_process()).await.unwrap();
    assert!(!outcome.stamped, "the restored ledger is found, not stamped anew");

    // a second restore into the same target is refused before anything is written
    let again = restore(&file, &target.store, &target.blobs, &crate::migrate::host_chain(), &|_: &Part| {}).await.unwrap_err();
    assert!(again.is("restore-target-not-empty"), "{again}");
    // and so is a target whose blobs alone hold data
    let blobs_only = host(dir.path(), "blobs-only").await;
    blobs_only.blobs.put_bytes("plugins/x/y", b"z".to_vec(), PutMode::Overwrite).await.unwrap();
    let err = restore(&file, &blobs_only.store, &blobs_only.blobs, &crate::migrate::host_chain(), &|_: &Part| {}).await.unwrap_err();
    assert!(err.is("restore-target-not-empty"), "{err}");
    assert!(blobs_only.store.populated_collections().await.unwrap().is_empty(), "nothing written");
}

/// Flip one byte at the first occurrence of `needle` (plus `offset`) in the file.
fn flip(file: &Path, needle: &[u8], offset: usize) {
    let mut bytes = std::fs::read(file).unwrap();
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("needle in the snapshot") + offset;
    bytes[at] ^= 0x01;
    std::fs::write(file, bytes).unwrap();
}

/// One way of damaging a snapshot file.
type Damage = Box<dyn Fn(&Path)>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_refused_naming_the_part_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let source = populated(dir.path()).await;
    let original = dir.path().join("good.capstan-snapshot");
    write_file(&source.store, &source.blobs, &original, &|_: &Part| {}).await.unwrap();
    let cases: Vec<(&str, Damage, &str)> = vec![
        ("a document's value", Box::new(|f: &Path| flip(f, b"grace", 1)), "collection:users"),
        ("a document's JSON", Box::new(|f: &Path| flip(f, b"\"name\":\"grace\"", 0)), "collection:users"),
        ("a blob's bytes", Box::new(|f: &Path| flip(f, b"bundle", 2)), "blob:_capstan/plugins/appstore/1.0.0-abc.capstan-plugin"),
        ("the manifest", Box::new(|f: &Path| flip(f, b"\"capstanVersion\"", 3)), "manifest"),
        (
            "a truncated file",
            Box::new(|f: &Path| {
                let bytes = std::fs::read(f).unwrap();
                std::fs::write(f, &bytes[..bytes.len() / 2]).unwrap();
            }),
            "",
        ),
        (
            "a byte after the end",
            Box::new(|f: &Path| {
                let mut bytes = std::fs::read(f).unwrap();
                bytes.push(b'x');
                std::fs::write(f, bytes).unwrap();
            }),
            "manifest",
        ),
    ];
    for (what, damage, part) in cases {
        let file = dir.path().join("damaged.capstan-snapshot");
        std::fs::copy(&original, &file).unwrap();
        damage(&file);
        let target = host(dir.path(), &format!("target-{}", what.replace(' ', "-").replace('\'', ""))).await;
        let err = restore(&file, &target.store, &target.blobs, &crate::migrate::host_chain(), &|_: &Part| {}).await.unwrap_err();
        assert!(err.is("snapshot-corrupt"), "{what}: {err}");
        if !part.is_empty() {
            assert_eq!(err.data.as_ref().unwrap()["part"], part, "{what}: {err}");
        }
        assert!(target.store.populated_collections().await.unwrap().is_empty(), "{what}: nothing written");
        assert!(blob_keys(&target.blobs).await.is_empty(), "{what}: no blob written");
    }
    let not_a_snapshot = dir.path().join("notes.txt");
    std::fs::write(&not_a_snapshot, b"hello\n").unwrap();
    assert_eq!(verify(&not_a_snapshot).await.unwrap_err().data.unwrap()["part"], "header");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_version_outside_this_builds_range_is_refused() {
    let chain = crate::migrate::host_chain();
    let mut manifest = Manifest {
        format: FORMAT,
        created_at: 0,
        capstan_version: "0".into(),
        data_version: Some(chain.target().to_string()),
        ledgers: vec![],
        documents: 0,
        blobs: 0,
        blob_bytes: 0,
        keyring_included: false,
        keyring_notice: KEYRING_NOTICE.into(),
        parts: vec![],
    };
    check_version(&manifest, &chain).unwrap();
    for version in [Some("999.0.0"), Some("0.0.1"), Some("soon"), None] {
        manifest.data_version = version.map(str::to_string);
        let err = check_version(&manifest, &chain).unwrap_err();
        assert!(err.is("snapshot-version-unsupported"), "{version:?}: {err}");
        assert_eq!(err.data.unwrap()["oldestSupported"], chain.oldest_supported.to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_in_the_bucket_are_complete_and_pruned_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let source = populated(dir.path()).await;
    let mut keys = Vec::new();
    for _ in 0..3 {
        let (key, written) = write_to_bucket(&source.store, &source.blobs).await.unwrap();
        assert!(key.starts_with(BUCKET_PREFIX) && key.ends_with(SUFFIX), "{key}");
        let (meta, bytes) = source.blobs.get_bytes(&key).await.unwrap().unwrap();
        assert_eq!((meta.size, hex::encode(Sha256::digest(&bytes))), (written.bytes, written.sha256));
        keys.push(key);
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    // snapshots in the bucket are never copied into the next one
    let last = source.blobs.get_bytes(&keys[2]).await.unwrap().unwrap().1;
    assert!(!last.windows(BUCKET_PREFIX.len()).any(|w| w == BUCKET_PREFIX.as_bytes()));
    let file = dir.path().join("from-bucket.capstan-snapshot");
    std::fs::write(&file, &last).unwrap();
    verify(&file).await.unwrap();

    let deleted = prune_bucket(&source.blobs, 2).await.unwrap();
    assert_eq!(deleted, vec![keys[0].clone()], "the oldest goes first");
    let left: Vec<String> = list_bucket(&source.blobs).await.unwrap().into_iter().map(|m| m.key).collect();
    assert_eq!(left, keys[1..].to_vec());
    assert_eq!(prune_bucket(&source.blobs, 0).await.unwrap(), vec![keys[1].clone()], "keep-last never goes below one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_cut_short_is_never_stored_in_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let source = host(dir.path(), "source").await;
    let (mut writer, reader) = tokio::io::duplex(64);
    let complete = Arc::new(AtomicBool::new(false));
    let body: BlobReader = Box::pin(Completed { inner: reader, complete });
    let put = source.blobs.put("_capstan/snapshots/cut.capstan-snapshot", body, PutMode::CreateOnly);
    let writing = async {
        writer.write_all(b"capstan-snapshot 1\n").await.unwrap();
        drop(writer);
    };
    let (_, stored) = tokio::join!(writing, put);
    assert!(stored.is_err(), "an unfinished snapshot is not stored");
    assert!(list_bucket(&source.blobs).await.unwrap().is_empty());
}
