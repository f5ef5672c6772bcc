//! Tests of the migration runner against a SQLite store: stamping, floors, locks and resumed steps.

use super::*;
use crate::{DEFAULT_BUDGET, sqlite::SqliteStore};
use std::sync::atomic::{AtomicUsize, Ordering};

async fn store(dir: &tempfile::TempDir) -> Store {
    let store = Store::new(SqliteStore::open(dir.path().join("db.sqlite")).unwrap(), DEFAULT_BUDGET);
    store.declare(CollectionSpec::new("things")).await.unwrap();
    store.declare(CollectionSpec::new("progress")).await.unwrap();
    store
}

fn opts(owner: &str) -> LockOptions {
    LockOptions { owner: owner.into(), ttl: Duration::from_secs(60), wait: Duration::from_millis(300) }
}

/// A step that tags every document of `things` with `step`, one document per transaction,
/// recording each tagged id, and that can be told to fail after `fail_after` documents.
fn tagging_step(name: &str, from: &str, to: &str, fail_after: Arc<AtomicUsize>, writes: Arc<AtomicUsize>) -> Step {
    let tag = name.to_string();
    Step::new(name, from, to, move |ctx: StepContext| {
        let tag = tag.clone();
        let fail_after = fail_after.clone();
        let writes = writes.clone();
        async move {
            let mut cursor: Option<String> = None;
            loop {
                let page = ctx
                    .store
                    .transact(|tx| {
                        let c = cursor.clone();
                        async move { tx.scan("things", c.as_deref(), 1).await }
                    })
                    .await?;
                let Some(doc) = page.documents.into_iter().next() else { return Ok(()) };
                cursor = Some(doc.id.clone());
                if doc.data.get(&tag).is_some() {
                    continue; // done by an earlier, interrupted run
                }
                if fail_after.load(Ordering::SeqCst) == 0 {
                    return Err(Refusal::new("test-interrupted", "simulated crash"));
                }
                fail_after.fetch_sub(1, Ordering::SeqCst);
                let mut data = doc.data.clone();
                data[&tag] = json!(true);
                ctx.store
                    .transact(|tx| {
                        let d = data.clone();
                        let id = doc.id.clone();
                        async move { tx.replace("things", &id, doc.revision, d).await }
                    })
                    .await?;
                writes.fetch_add(1, Ordering::SeqCst);
                ctx.renew_lock().await?;
            }
        }
    })
}

fn chain_with(steps: Vec<Step>) -> Chain {
    Chain::new("test", "1.0.0", steps)
}

fn counters() -> (Arc<AtomicUsize>, Arc<AtomicUsize>) {
    (Arc::new(AtomicUsize::new(usize::MAX)), Arc::new(AtomicUsize::new(0)))
}

async fn seed(store: &Store, n: usize) {
    store
        .transact(|tx| async move {
            for i in 0..n {
                tx.insert("things", &format!("t{i}"), json!({"i": i})).await?;
            }
            Ok(())
        })
        .await
        .unwrap();
}

async fn set_ledger(store: &Store, ledger: &Ledger) {
    declare(store).await.unwrap();
    let data = serde_json::to_value(ledger).unwrap();
    store
        .transact(|tx| {
            let data = data.clone();
            async move {
                match tx.get(LEDGER_COLLECTION, "test").await? {
                    None => tx.insert(LEDGER_COLLECTION, "test", data).await,
                    Some(d) => tx.replace(LEDGER_COLLECTION, "test", d.revision, data).await,
                }
            }
        })
        .await
        .unwrap();
}

fn ledger_at(version: &str) -> Ledger {
    Ledger { data_version: version.into(), lock: None, running: None, history: vec![] }
}

#[tokio::test]
async fn empty_database_is_stamped_at_the_target_without_running_steps() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    let (fail, writes) = counters();
    let chain = chain_with(vec![tagging_step("a", "1.0.0", "1.1.0", fail, writes.clone())]);
    let outcome = run(&store, &chain, &opts("p1")).await.unwrap();
    assert!(outcome.stamped);
    assert_eq!(outcome.to, "1.1.0");
    assert_eq!(writes.load(Ordering::SeqCst), 0);
    let (ledger, _) = read_ledger(&store, "test").await.unwrap().unwrap();
    assert_eq!(ledger.data_version, "1.1.0");
    assert!(ledger.lock.is_none());

    // a second start has nothing to do and writes nothing
    let before = store.transact(|tx| async move { tx.require(LEDGER_COLLECTION, "test").await }).await.unwrap().revision;
    let again = run(&store, &chain, &opts("p2")).await.unwrap();
    assert!(again.applied.is_empty() && !again.stamped);
    let after = store.transact(|tx| async move { tx.require(LEDGER_COLLECTION, "test").await }).await.unwrap().revision;
    assert_eq!(before, after);
}

#[tokio::test]
async fn populated_database_without_ledger_starts_at_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    seed(&store, 3).await;
    let (fail, writes) = counters();
    let chain = chain_with(vec![
        tagging_step("a", "1.0.0", "1.1.0", fail.clone(), writes.clone()),
        tagging_step("b", "1.1.0", "2.0.0", fail, writes.clone()),
    ]);
    let outcome = run(&store, &chain, &opts("p1")).await.unwrap();
    assert_eq!(outcome.from, None);
    assert_eq!(outcome.applied, vec!["a", "b"]);
    assert_eq!(writes.load(Ordering::SeqCst), 6);
    let (ledger, _) = read_ledger(&store, "test").await.unwrap().unwrap();
    assert_eq!(ledger.data_version, "2.0.0");
    assert_eq!(ledger.history.iter().map(|h| h.step.as_str()).collect::<Vec<_>>(), vec!["a", "b"]);
    assert!(ledger.lock.is_none() && ledger.running.is_none());
}

#[tokio::test]
async fn only_outstanding_steps_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    seed(&store, 2).await;
    set_ledger(&store, &ledger_at("1.1.0")).await;
    let (fail, writes) = counters();
    let chain = chain_with(vec![
        tagging_step("a", "1.0.0", "1.1.0", fail.clone(), writes.clone()),
        tagging_step("b", "1.1.0", "2.0.0", fail, writes.clone()),
    ]);
    let outcome = run(&store, &chain, &opts("p1")).await.unwrap();
    assert_eq!(outcome.applied, vec!["b"]);
    let doc = store.transact(|tx| async move { tx.require("things", "t0").await }).await.unwrap();
    assert!(doc.data.get("a").is_none(), "an applied step is never replayed");
    assert_eq!(doc.data["b"], true);
}

#[tokio::test]
async fn ledger_below_the_floor_is_refused_before_the_lock_or_any_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    seed(&store, 1).await;
    set_ledger(&store, &ledger_at("0.9.0")).await;
    let before = store.transact(|tx| async move { tx.require(LEDGER_COLLECTION, "test").await }).await.unwrap();
    let (fail, writes) = counters();
    let chain = chain_with(vec![tagging_step("a", "1.0.0", "1.1.0", fail, writes.clone())]);
    let err = run(&store, &chain, &opts("p1")).await.unwrap_err();
    assert_eq!(err.code, "ledger-below-oldest-supported-version");
    assert_eq!(err.data.as_ref().unwrap()["oldestSupported"], "1.0.0");
    let after = store.transact(|tx| async move { tx.require(LEDGER_COLLECTION, "test").await }).await.unwrap();
    assert_eq!(before, after, "nothing written, no lock taken");
    assert_eq!(writes.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn ledger_ahead_of_this_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    set_ledger(&store, &ledger_at("3.0.0")).await;
    let (fail, writes) = counters();
    let chain = chain_with(vec![tagging_step("a", "1.0.0", "1.1.0", fail, writes)]);
    let err = run(&store, &chain, &opts("p1")).await.unwrap_err();
    assert_eq!(err.code, "data-version-ahead");
    let (ledger, _) = read_ledger(&store, "test").await.unwrap().unwrap();
    assert_eq!(ledger, ledger_at("3.0.0"));
}

#[tokio::test]
async fn an_unreadable_ledger_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    set_ledger(&store, &ledger_at("not-a-version")).await;
    let chain = chain_with(vec![]);
    assert_eq!(run(&store, &chain, &opts("p1")).await.unwrap_err().code, "ledger-invalid");
}

#[tokio::test]
async fn a_live_lock_held_elsewhere_times_out_and_an_expired_one_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    seed(&store, 1).await;
    let mut ledger = ledger_at("1.0.0");
    ledger.lock = Some(LedgerLock { owner: "dead-process".into(), expires_at: now_ms() + 60_000 });
    set_ledger(&store, &ledger).await;
    let (fail, writes) = counters();
    let chain = chain_with(vec![tagging_step("a", "1.0.0", "1.1.0", fail, writes.clone())]);

    let err = run(&store, &chain, &opts("p1")).await.unwrap_err();
    assert_eq!(err.code, "lock-timeout");
    assert_eq!(err.data.as_ref().unwrap()["holder"], "dead-process");
    assert_eq!(writes.load(Ordering::SeqCst), 0);

    ledger.lock = Some(LedgerLock { owner: "dead-process".into(), expires_at: now_ms() - 1 });
    set_ledger(&store, &ledger).await;
    let outcome = run(&store, &chain, &opts("p1")).await.unwrap();
    assert_eq!(outcome.applied, vec!["a"]);
}

#[tokio::test]
async fn an_interrupted_step_finishes_on_the_next_start_without_redoing_work() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    seed(&store, 5).await;
    let fail = Arc::new(AtomicUsize::new(2));
    let writes = Arc::new(AtomicUsize::new(0));
    let chain = chain_with(vec![tagging_step("a", "1.0.0", "1.1.0", fail.clone(), writes.clone())]);

    let err = run(&store, &chain, &opts("p1")).await.unwrap_err();
    assert_eq!(err.code, "test-interrupted", "the step's own refusal is reported");
    assert_eq!(err.data.as_ref().unwrap()["step"], "a");
    let (ledger, _) = read_ledger(&store, "test").await.unwrap().unwrap();
    assert_eq!(ledger.data_version, "1.0.0");
    assert_eq!(ledger.running.as_deref(), Some("a"));
    assert!(ledger.lock.is_none(), "a refused run releases the lock");

    fail.store(usize::MAX, Ordering::SeqCst);
    let outcome = run(&store, &chain, &opts("p2")).await.unwrap();
    assert_eq!(outcome.applied, vec!["a"]);
    assert_eq!(writes.load(Ordering::SeqCst), 5, "each document written exactly once across both starts");
    let page = store.transact(|tx| async move { tx.scan("things", None, 10).await }).await.unwrap();
    assert!(page.documents.iter().all(|d| d.data["a"] == true && d.revision == 2));
}

#[tokio::test]
async fn a_process_that_died_holding_the_lock_resumes_after_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    seed(&store, 2).await;
    // a crash mid-step: running recorded, lock left behind but expired
    let mut ledger = ledger_at("1.0.0");
    ledger.running = Some("a".into());
    ledger.lock = Some(LedgerLock { owner: "crashed".into(), expires_at: now_ms() - 1 });
    set_ledger(&store, &ledger).await;
    let (fail, writes) = counters();
    let chain = chain_with(vec![tagging_step("a", "1.0.0", "1.1.0", fail, writes)]);
    let outcome = run(&store, &chain, &opts("p1")).await.unwrap();
    assert_eq!(outcome.applied, vec!["a"]);
    assert_eq!(outcome.from.as_deref(), Some("1.0.0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_migrate_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir).await;
    seed(&store, 4).await;
    let (fail, writes) = counters();
    let chain = chain_with(vec![tagging_step("a", "1.0.0", "1.1.0", fail, writes.clone())]);
    let mut tasks = Vec::new();
    for i in 0..3 {
        let store = store.clone();
        let chain = chain.clone();
        tasks.push(tokio::spawn(async move {
            let mut o = opts(&format!("p{i}"));
            o.wait = Duration::from_secs(20);
            run(&store, &chain, &o).await
        }));
    }
    let mut applied = 0;
    for t in tasks {
        applied += t.await.unwrap().unwrap().applied.len();
    }
    assert_eq!(applied, 1, "exactly one process ran the step");
    assert_eq!(writes.load(Ordering::SeqCst), 4);
}

#[test]
#[should_panic(expected = "must start at")]
fn a_chain_with_a_gap_is_a_programming_error() {
    let noop = |_ctx: StepContext| async { Ok(()) };
    Chain::new("gap", "1.0.0", vec![Step::new("a", "1.0.0", "1.1.0", noop), Step::new("b", "1.2.0", "1.3.0", noop)]);
}
