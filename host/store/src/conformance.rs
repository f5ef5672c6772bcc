//! The store conformance suite, written against the [`Store`] API only, so every backend
//! (SQLite, MongoDB) runs the same checks. Collection names carry a random suffix so the suite
//! can share a database with other runs. A failed check panics with what was expected.

use super::{CollectionSpec, Document, Store};
use capstan_core::refusal::{Refusal, Result};
use serde_json::json;

fn unique_name(base: &str) -> String {
    format!("{base}_{:08x}", rand::random::<u32>())
}

fn code(result: Result<impl std::fmt::Debug>) -> String {
    match result {
        Ok(v) => panic!("expected a refusal, got Ok({v:?})"),
        Err(e) => e.code.to_string(),
    }
}

/// Run every check of this suite that needs one store (all but [`two_stores_share_state`]) against `store`.
pub async fn run_all(store: &Store) {
    crud_and_revisions(store).await;
    rollback_on_refusal(store).await;
    unique_indexes(store).await;
    find_and_scan_paging(store).await;
    validation(store).await;
    concurrent_compare_and_swap(store).await;
    populated_collections(store).await;
    read_many_and_watched_writes(store).await;
    copy_and_restore_keep_revisions(store).await;
}

/// What a snapshot of Capstan stands on: `read_everything` reads every populated collection
/// without declaring it, and `restore_documents` writes documents at their own revisions into a
/// collection this process never declared (created bare), then refuses the same id again.
pub async fn copy_and_restore_keep_revisions(store: &Store) {
    let source = unique_name("conf_copy");
    store.declare(CollectionSpec::new(&source)).await.unwrap();
    let s = source.as_str();
    store
        .transact(|tx| async move {
            tx.insert(s, "a", json!({"v": 1})).await?;
            tx.replace(s, "a", 1, json!({"v": 2})).await?;
            tx.insert(s, "b", json!({"v": 3})).await
        })
        .await
        .unwrap();
    let mut copy = store.read_everything().await.unwrap();
    assert!(copy.collections().contains(&source), "{:?}", copy.collections());
    let page = copy.scan(s, None, 1).await.unwrap();
    assert_eq!(page.documents.len(), 1);
    let rest = copy.scan(s, page.next_cursor.as_deref(), 10).await.unwrap();
    assert_eq!(rest.next_cursor, None);
    copy.finish().await.unwrap();
    let documents: Vec<Document> = page.documents.into_iter().chain(rest.documents).collect();
    assert_eq!(documents.iter().map(|d| (d.id.as_str(), d.revision)).collect::<Vec<_>>(), vec![("a", 2), ("b", 1)]);

    let target = unique_name("conf_restored");
    store.restore_documents(&target, &documents).await.unwrap();
    assert_eq!(code(store.restore_documents(&target, &documents[..1]).await), "exists");
    store.declare(CollectionSpec::new(&target)).await.unwrap();
    let t = target.as_str();
    let a = store.transact(|tx| async move { tx.require(t, "a").await }).await.unwrap();
    assert_eq!((a.revision, &a.data), (2, &json!({"v": 2})), "the revision it had, not 1");
    let next = store.transact(|tx| async move { tx.replace(t, "a", 2, json!({"v": 4})).await }).await.unwrap();
    assert_eq!(next.revision, 3, "writes go on from the restored revision");
}

/// Insert, get, require, replace, put and delete refuse `exists`, `not-found` and `conflict` where
/// due, every write advances the revision, and a transaction reads its own writes.
pub async fn crud_and_revisions(store: &Store) {
    let c = unique_name("conf_crud");
    store.declare(CollectionSpec::new(&c)).await.unwrap();
    let c = c.as_str();

    let doc = store.transact(|tx| async move { tx.insert(c, "a", json!({"v": 1})).await }).await.unwrap();
    assert_eq!((doc.id.as_str(), doc.revision, &doc.data), ("a", 1, &json!({"v": 1})));

    let again = store.transact(|tx| async move { tx.insert(c, "a", json!({"v": 9})).await }).await;
    assert_eq!(code(again), "exists");

    let got = store.transact(|tx| async move { tx.get(c, "a").await }).await.unwrap().expect("inserted document");
    assert_eq!(got, doc);
    assert!(store.transact(|tx| async move { tx.get(c, "missing").await }).await.unwrap().is_none());
    assert_eq!(code(store.transact(|tx| async move { tx.require(c, "missing").await }).await), "not-found");

    let replaced = store.transact(|tx| async move { tx.replace(c, "a", 1, json!({"v": 2})).await }).await.unwrap();
    assert_eq!(replaced.revision, 2, "every write advances the revision");
    let stale = store.transact(|tx| async move { tx.replace(c, "a", 1, json!({"v": 3})).await }).await;
    let err = stale.unwrap_err();
    assert_eq!(err.code, "conflict");
    assert_eq!(err.data.as_ref().unwrap()["revision"], 2, "conflict states the current revision");
    assert_eq!(code(store.transact(|tx| async move { tx.replace(c, "nope", 1, json!({})).await }).await), "not-found");

    // put: None means "I read none"
    assert_eq!(code(store.transact(|tx| async move { tx.put(c, "a", None, json!({})).await }).await), "exists");
    let put = store.transact(|tx| async move { tx.put(c, "a", Some(2), json!({"v": 4})).await }).await.unwrap();
    assert_eq!(put.revision, 3);

    assert_eq!(code(store.transact(|tx| async move { tx.delete(c, "a", 2).await }).await), "conflict");
    store.transact(|tx| async move { tx.delete(c, "a", 3).await }).await.unwrap();
    assert!(store.transact(|tx| async move { tx.get(c, "a").await }).await.unwrap().is_none());
    assert_eq!(code(store.transact(|tx| async move { tx.delete(c, "a", 3).await }).await), "not-found");

    // a deleted id can be inserted again and starts over
    let reborn = store.transact(|tx| async move { tx.insert(c, "a", json!({"v": 5})).await }).await.unwrap();
    assert_eq!(reborn.revision, 1);

    // reads inside a transaction see its own writes
    let seen = store
        .transact(|tx| async move {
            tx.insert(c, "b", json!({"v": 1})).await?;
            tx.replace(c, "b", 1, json!({"v": 2})).await?;
            tx.require(c, "b").await
        })
        .await
        .unwrap();
    assert_eq!((seen.revision, &seen.data), (2, &json!({"v": 2})));
}

/// A refusal inside `transact`, the closure's own or a refused write, rolls back every write
/// the transaction made.
pub async fn rollback_on_refusal(store: &Store) {
    let c = unique_name("conf_rollback");
    store.declare(CollectionSpec::new(&c)).await.unwrap();
    let c = c.as_str();
    store.transact(|tx| async move { tx.insert(c, "kept", json!({"v": 1})).await }).await.unwrap();

    let result: Result<()> = store
        .transact(|tx| async move {
            tx.insert(c, "half", json!({})).await?;
            tx.replace(c, "kept", 1, json!({"v": 2})).await?;
            Err(Refusal::new("test-abort", "abort after two writes"))
        })
        .await;
    assert_eq!(code(result), "test-abort");
    assert!(store.transact(|tx| async move { tx.get(c, "half").await }).await.unwrap().is_none(), "insert rolled back");
    let kept = store.transact(|tx| async move { tx.require(c, "kept").await }).await.unwrap();
    assert_eq!(kept.revision, 1, "replace rolled back");

    // a refused write inside a transaction does not commit the others either
    let result = store
        .transact(|tx| async move {
            tx.insert(c, "other", json!({})).await?;
            tx.insert(c, "kept", json!({})).await
        })
        .await;
    assert_eq!(code(result), "exists");
    assert!(store.transact(|tx| async move { tx.get(c, "other").await }).await.unwrap().is_none());
}

/// Unique indexes (single and compound, over dotted paths) refuse `exists` naming the index,
/// skip documents lacking the fields, and free a value once it moves away.
pub async fn unique_indexes(store: &Store) {
    let c = unique_name("conf_unique");
    store.declare(CollectionSpec::new(&c).unique("by_email", &["email"]).unique("by_org_name", &["org", "profile.name"])).await.unwrap();
    let c = c.as_str();
    store
        .transact(|tx| async move { tx.insert(c, "u1", json!({"email": "a@x", "org": "o1", "profile": {"name": "n"}})).await })
        .await
        .unwrap();

    let dup = store.transact(|tx| async move { tx.insert(c, "u2", json!({"email": "a@x"})).await }).await.unwrap_err();
    assert_eq!(dup.code, "exists");
    assert_eq!(dup.data.as_ref().unwrap()["index"], "by_email", "the refusal names the index");

    let dup2 = store.transact(|tx| async move { tx.insert(c, "u3", json!({"org": "o1", "profile": {"name": "n"}})).await }).await;
    assert_eq!(code(dup2), "exists");
    // same name in another organization is fine; documents without the fields are not indexed
    store.transact(|tx| async move { tx.insert(c, "u4", json!({"org": "o2", "profile": {"name": "n"}})).await }).await.unwrap();
    store.transact(|tx| async move { tx.insert(c, "u5", json!({"other": 1})).await }).await.unwrap();
    store.transact(|tx| async move { tx.insert(c, "u6", json!({"other": 2})).await }).await.unwrap();

    // a replace onto a taken value is refused; moving the value away frees it
    let onto = store.transact(|tx| async move { tx.replace(c, "u5", 1, json!({"email": "a@x"})).await }).await;
    assert_eq!(code(onto), "exists");
    store.transact(|tx| async move { tx.replace(c, "u1", 1, json!({"email": "b@x"})).await }).await.unwrap();
    store.transact(|tx| async move { tx.replace(c, "u5", 1, json!({"email": "a@x"})).await }).await.unwrap();
    let found = store.transact(|tx| async move { tx.find(c, "by_email", &[json!("a@x")], None, 10).await }).await.unwrap();
    assert_eq!(found.documents.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), vec!["u5"]);
}

/// `find` and `scan` page in id order through the cursor without repeats or gaps, match values
/// by type, cap the limit, and refuse bad limits and keys as `invalid-request`.
pub async fn find_and_scan_paging(store: &Store) {
    let c = unique_name("conf_find");
    store.declare(CollectionSpec::new(&c).index("by_kind", &["kind"]).index("by_size", &["size"])).await.unwrap();
    let c = c.as_str();
    store
        .transact(|tx| async move {
            for i in 0..7 {
                let kind = if i % 2 == 0 { "even" } else { "odd" };
                tx.insert(c, &format!("d{i}"), json!({"kind": kind, "size": i})).await?;
            }
            tx.insert(c, "x", json!({"kind": 7})).await
        })
        .await
        .unwrap();

    // find pages in id order, through the cursor, without repeats or gaps
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let cur = cursor.clone();
        let page = store
            .transact(|tx| {
                let cur = cur.clone();
                async move { tx.find(c, "by_kind", &[json!("even")], cur.as_deref(), 3).await }
            })
            .await
            .unwrap();
        assert!(page.documents.len() <= 3);
        ids.extend(page.documents.iter().map(|d| d.id.clone()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(ids, vec!["d0", "d2", "d4", "d6"]);

    // values match by type: the string "7" is not the number 7
    let by_number = store.transact(|tx| async move { tx.find(c, "by_kind", &[json!(7)], None, 10).await }).await.unwrap();
    assert_eq!(by_number.documents.len(), 1);
    let by_string = store.transact(|tx| async move { tx.find(c, "by_kind", &[json!("7")], None, 10).await }).await.unwrap();
    assert!(by_string.documents.is_empty());
    let sized = store.transact(|tx| async move { tx.find(c, "by_size", &[json!(3)], None, 10).await }).await.unwrap();
    assert_eq!(sized.documents[0].id, "d3");

    let first = store.transact(|tx| async move { tx.scan(c, None, 5).await }).await.unwrap();
    assert_eq!(first.documents.len(), 5);
    let next = first.next_cursor.clone().expect("more to scan");
    let rest = store
        .transact(|tx| {
            let next = next.clone();
            async move { tx.scan(c, Some(&next), 5).await }
        })
        .await
        .unwrap();
    assert_eq!(rest.documents.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), vec!["d5", "d6", "x"]);
    assert!(rest.next_cursor.is_none());

    // limits are bounded and validated
    assert_eq!(code(store.transact(|tx| async move { tx.scan(c, None, 0).await }).await), "invalid-request");
    let capped = store.transact(|tx| async move { tx.scan(c, None, 1_000_000).await }).await.unwrap();
    assert_eq!(capped.documents.len(), 8);
    assert_eq!(
        code(store.transact(|tx| async move { tx.find(c, "by_kind", &[json!("a"), json!("b")], None, 1).await }).await),
        "invalid-request"
    );
    assert_eq!(code(store.transact(|tx| async move { tx.find(c, "by_kind", &[json!(null)], None, 1).await }).await), "invalid-request");
}

/// Non-object data, bad ids, oversized documents, bad collection names and bad index definitions
/// are refused by name.
pub async fn validation(store: &Store) {
    let c = unique_name("conf_valid");
    store.declare(CollectionSpec::new(&c)).await.unwrap();
    let c = c.as_str();
    assert_eq!(code(store.transact(|tx| async move { tx.insert(c, "a", json!([1, 2])).await }).await), "invalid-document");
    assert_eq!(code(store.transact(|tx| async move { tx.insert(c, "", json!({})).await }).await), "invalid-id");
    assert_eq!(code(store.transact(|tx| async move { tx.insert(c, "a\nb", json!({})).await }).await), "invalid-id");
    let huge = json!({"blob": "x".repeat(super::MAX_DOCUMENT_BYTES)});
    assert_eq!(
        code(
            store
                .transact(|tx| {
                    let huge = huge.clone();
                    async move { tx.insert(c, "big", huge).await }
                })
                .await
        ),
        "document-too-large"
    );
    assert_eq!(code(store.declare(CollectionSpec::new("Bad-Name")).await), "invalid-collection");
    assert_eq!(code(store.declare(CollectionSpec::new("ok").index("by x", &["x"])).await), "invalid-index");
    assert_eq!(code(store.declare(CollectionSpec::new("ok").index("by_x", &["x..y"])).await), "invalid-index");
}

/// Many writers race a compare-and-swap on one document: each increment lands exactly once,
/// through transient retries, and no update is lost.
pub async fn concurrent_compare_and_swap(store: &Store) {
    let c = unique_name("conf_race");
    store.declare(CollectionSpec::new(&c)).await.unwrap();
    store
        .transact(|tx| {
            let c = c.clone();
            async move { tx.insert(&c, "counter", json!({"n": 0})).await }
        })
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                store
                    .transact(|tx| {
                        let c = c.clone();
                        async move {
                            let doc = tx.require(&c, "counter").await?;
                            let n = doc.data["n"].as_u64().unwrap();
                            tx.replace(&c, "counter", doc.revision, json!({"n": n + 1})).await
                        }
                    })
                    .await
                    .expect("increment commits within the budget");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let doc = store
        .transact(|tx| {
            let c = c.clone();
            async move { tx.require(&c, "counter").await }
        })
        .await
        .unwrap();
    assert_eq!(doc.data["n"], 40, "no increment lost");
    assert_eq!(doc.revision, 41);
}

/// A declared collection counts as populated only once it holds a document.
pub async fn populated_collections(store: &Store) {
    let c = unique_name("conf_pop");
    store.declare(CollectionSpec::new(&c)).await.unwrap();
    assert!(!store.populated_collections().await.unwrap().contains(&c), "a declared empty collection is not populated");
    store
        .transact(|tx| {
            let c = c.clone();
            async move { tx.insert(&c, "a", json!({})).await }
        })
        .await
        .unwrap();
    assert!(store.populated_collections().await.unwrap().contains(&c));
}

/// Two store handles on the same database (as two processes would be) see each other's
/// commits, and a compare-and-swap made through one is a conflict through the other.
pub async fn two_stores_share_state(a: &Store, b: &Store) {
    let c = unique_name("conf_shared");
    a.declare(CollectionSpec::new(&c)).await.unwrap();
    b.declare(CollectionSpec::new(&c)).await.unwrap();
    let c = c.as_str();
    a.transact(|tx| async move { tx.insert(c, "k", json!({"by": "a"})).await }).await.unwrap();
    let seen = b.transact(|tx| async move { tx.require(c, "k").await }).await.unwrap();
    assert_eq!(seen.data["by"], "a");
    b.transact(|tx| async move { tx.replace(c, "k", 1, json!({"by": "b"})).await }).await.unwrap();
    assert_eq!(code(a.transact(|tx| async move { tx.replace(c, "k", 1, json!({"by": "a"})).await }).await), "conflict");
    assert_eq!(code(a.transact(|tx| async move { tx.insert(c, "k", json!({})).await }).await), "exists");
}

/// `read_many` answers each named document (or `None`) from one snapshot and refuses an
/// undeclared collection; a watcher hears every write to its collections once the transaction
/// has ended, whether it committed or rolled back, and nothing of other collections.
pub async fn read_many_and_watched_writes(store: &Store) {
    let (c, other) = (unique_name("conf_many"), unique_name("conf_unwatched"));
    store.declare(CollectionSpec::new(&c)).await.unwrap();
    store.declare(CollectionSpec::new(&other)).await.unwrap();
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let sink = heard.clone();
    store.watch_writes(
        &[c.as_str()],
        std::sync::Arc::new(move |collection: &str, id: &str| {
            sink.lock().unwrap().push((collection.to_string(), id.to_string()));
        }),
    );
    let (c, other) = (c.as_str(), other.as_str());
    let heard_now = || std::mem::take(&mut *heard.lock().unwrap());

    store
        .transact(|tx| async move {
            tx.insert(c, "a", json!({"v": 1})).await?;
            tx.insert(c, "b", json!({"v": 2})).await?;
            tx.insert(other, "x", json!({})).await
        })
        .await
        .unwrap();
    assert_eq!(heard_now(), vec![(c.to_string(), "a".to_string()), (c.to_string(), "b".to_string())], "only the watched writes");

    let found = store.read_many(&[(c, "b"), (c, "missing"), (other, "x"), (c, "a")]).await.unwrap();
    let revisions: Vec<Option<(String, u64)>> = found.iter().map(|d| d.as_ref().map(|d| (d.id.clone(), d.revision))).collect();
    assert_eq!(revisions, vec![Some(("b".into(), 1)), None, Some(("x".into(), 1)), Some(("a".into(), 1))]);
    assert_eq!(found[0].as_ref().unwrap().data, json!({"v": 2}));
    assert_eq!(code(store.read_many(&[(c, "a"), ("conf_never_declared", "a")]).await), "internal");
    assert_eq!(code(store.read_many(&[(c, "")]).await), "invalid-id");

    // a rolled-back write is heard too (after the rollback): a cache drops what it may have held
    let refused = store
        .transact(|tx| async move {
            tx.replace(c, "a", 1, json!({"v": 3})).await?;
            Err::<(), _>(Refusal::new("conflict", "changed my mind"))
        })
        .await;
    assert_eq!(code(refused), "conflict");
    assert_eq!(heard_now(), vec![(c.to_string(), "a".to_string())]);
    store
        .transact(|tx| async move {
            let doc = tx.require(c, "a").await?;
            tx.delete(c, "a", doc.revision).await
        })
        .await
        .unwrap();
    assert_eq!(heard_now(), vec![(c.to_string(), "a".to_string())]);
    assert!(store.read_many(&[(c, "a")]).await.unwrap()[0].is_none(), "read_many sees the committed deletion");
}
