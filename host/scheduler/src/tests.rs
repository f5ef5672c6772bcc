use super::*;
use capstan_store::sqlite::SqliteStore;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Fixture {
    _dir: tempfile::TempDir,
    scheduler: Arc<Scheduler>,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
    let scheduler = Scheduler::new(store, "node-a".into(), None, None).await.unwrap();
    Fixture { _dir: dir, scheduler }
}

/// Never ends by itself; logs a line first.
fn long_task(id: &str) -> HostTask {
    HostTask::new(id, "Long", "0 0 1 1 *", |log| async move {
        log.line("started");
        std::future::pending::<()>().await;
        Ok(())
    })
}

async fn execution(s: &Scheduler, id: &str) -> Execution {
    model::read_execution(s.store(), id).await.unwrap().expect("the execution exists")
}

/// Poll until the execution is no longer running (generous deadline; this is no timing test).
async fn ended(s: &Scheduler, id: &str) -> Execution {
    for _ in 0..400 {
        let e = execution(s, id).await;
        if e.status != Status::Running && !s.runs_here(id) {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("execution {id} still running: {:?}", execution(s, id).await);
}

#[tokio::test]
async fn host_tasks_are_registered_by_rule() {
    let f = fixture().await;
    let s = &f.scheduler;
    let ok = || HostTask::new("host.x", "X", "*/5 * * * *", |_| async { Ok(()) });
    s.register(ok()).unwrap();
    assert_eq!(s.register(ok()).unwrap_err().code, "task-exists");
    let mut bad = ok();
    bad.id = "x".into();
    assert_eq!(s.register(bad).unwrap_err().code, "task-id-invalid");
    let mut bad = ok();
    bad.id = "host.Upper".into();
    assert_eq!(s.register(bad).unwrap_err().code, "task-id-invalid");
    let mut bad = ok();
    bad.id = "host.y".into();
    bad.cron = "every minute".into();
    assert_eq!(s.register(bad).unwrap_err().code, "task-cron-invalid");
    let ids: Vec<String> = s.definitions().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, vec!["host.cleanup", "host.x"]);
    assert_eq!(s.workloads().iter().map(|w| (w.id.as_str(), w.replicas)).collect::<Vec<_>>(), vec![("host.cleanup", 1), ("host.x", 1)]);
    assert_eq!(s.definition("host.nope").err().unwrap().code, "task-not-found");
}

#[tokio::test]
async fn a_manual_run_records_its_outcome_log_and_duration() {
    let f = fixture().await;
    let s = &f.scheduler;
    s.register(HostTask::new("host.ok", "Ok", "0 0 1 1 *", |log| async move {
        log.line("did the thing");
        Ok(())
    }))
    .unwrap();
    s.register(HostTask::new("host.broken", "Broken", "0 0 1 1 *", |_| async { Err(Refusal::new("thing-broken", "it broke")) })).unwrap();

    let started = s.trigger("host.ok", "user-1").await.unwrap();
    assert_eq!((started.status, started.trigger, started.triggered_by.as_deref()), (Status::Running, Trigger::Manual, Some("user-1")));
    let done = ended(s, &started.id).await;
    assert_eq!(done.status, Status::Succeeded);
    assert_eq!(done.log, vec!["did the thing"]);
    assert_eq!(done.duration_ms, Some(done.ended_at.unwrap() - done.started_at));
    assert_eq!(done.node_id, "node-a");
    let record = model::read_task(s.store(), "host.ok").await.unwrap().unwrap();
    assert_eq!(record.running, None);
    assert_eq!(record.last_execution.unwrap().status, Status::Succeeded);

    let failed = ended(s, &s.trigger("host.broken", "user-1").await.unwrap().id).await;
    assert_eq!(failed.status, Status::Failed);
    assert_eq!(failed.error.unwrap(), ExecutionError { code: "thing-broken".into(), message: "it broke".into() });

    // newest first
    s.trigger("host.ok", "user-2").await.unwrap();
    let (page, _) = model::list_executions(s.store(), "host.ok", None, 10).await.unwrap();
    assert_eq!(page.len(), 2);
    assert_eq!(page[1].id, started.id);
    assert!(page[0].started_at >= page[1].started_at);
    let (first, next) = model::list_executions(s.store(), "host.ok", None, 1).await.unwrap();
    let (second, _) = model::list_executions(s.store(), "host.ok", next.as_deref(), 1).await.unwrap();
    assert_eq!((first[0].id.as_str(), second[0].id.as_str()), (page[0].id.as_str(), page[1].id.as_str()));
}

#[tokio::test]
async fn one_execution_at_a_time_and_a_disabled_task_never_runs() {
    let f = fixture().await;
    let s = &f.scheduler;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    s.register(long_task("host.long")).unwrap();
    s.register(HostTask::new("host.minutely", "Every minute", "* * * * *", move |_| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }))
    .unwrap();

    let first = s.trigger("host.long", "u").await.unwrap();
    let refused = s.trigger("host.long", "u").await.unwrap_err();
    assert_eq!(refused.code, "task-running");
    assert_eq!(refused.data.as_deref().unwrap()["executionId"], first.id.as_str());
    assert_eq!(refused.http_status(), 409);
    // the durable rule holds for any node, not just this process
    let elsewhere = model::Start {
        task_id: "host.long",
        enabled_by_default: true,
        trigger: Trigger::Schedule,
        triggered_by: None,
        node_id: "node-b",
        now: now_ms(),
        max_duration_ms: 1000,
    };
    assert_eq!(model::start(s.store(), &elsewhere).await.unwrap_err().code, "task-running");

    // disabled: refused by hand, skipped on schedule
    s.set_enabled("host.minutely", false, "u").await.unwrap();
    assert_eq!(s.trigger("host.minutely", "u").await.unwrap_err().code, "task-disabled");
    *s.checked_at.lock().unwrap() = now_ms() - 61_000;
    s.tick().await;
    let (executions, _) = model::list_executions(s.store(), "host.minutely", None, 10).await.unwrap();
    assert!(executions.is_empty(), "a disabled task does not run on schedule");

    // enabled again: the next due minute runs it, once
    s.set_enabled("host.minutely", true, "u").await.unwrap();
    *s.checked_at.lock().unwrap() = now_ms() - 61_000;
    s.tick().await;
    let (executions, _) = model::list_executions(s.store(), "host.minutely", None, 10).await.unwrap();
    assert_eq!(executions.len(), 1);
    assert_eq!(executions[0].trigger, Trigger::Schedule);
    assert_eq!(ended(s, &executions[0].id).await.status, Status::Succeeded);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(s.set_enabled("host.nope", true, "u").await.unwrap_err().code, "task-not-found");
}

#[tokio::test]
async fn cancelling_stops_a_run_here_or_on_the_next_tick() {
    let f = fixture().await;
    let s = &f.scheduler;
    s.register(long_task("host.long")).unwrap();

    // asked through this node: aborted at once
    let run = s.trigger("host.long", "u").await.unwrap();
    let asked = s.cancel(&run.id, "admin-1").await.unwrap();
    assert_eq!(asked.cancel_requested_by.as_deref(), Some("admin-1"));
    let done = ended(s, &run.id).await;
    assert_eq!(done.status, Status::Cancelled);
    assert!(done.log.contains(&"cancel requested by admin-1".to_string()), "{:?}", done.log);
    assert_eq!(s.cancel(&run.id, "admin-1").await.unwrap_err().code, "execution-not-running");
    assert_eq!(s.cancel("no-such-execution", "admin-1").await.unwrap_err().code, "execution-not-found");

    // asked through another node (only the durable request): the tick acts on it
    let run = s.trigger("host.long", "u").await.unwrap();
    // while it runs, ticks write its log as it grows
    for _ in 0..400 {
        s.tick().await;
        if execution(s, &run.id).await.log == vec!["started"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(execution(s, &run.id).await.log, vec!["started"]);
    model::request_cancel(s.store(), &run.id, "admin-2", now_ms()).await.unwrap();
    s.tick().await;
    let done = ended(s, &run.id).await;
    assert_eq!(done.status, Status::Cancelled);
    assert_eq!(done.log, vec!["started", "cancel requested by admin-2"]);
    // the task can run again
    let again = s.trigger("host.long", "u").await.unwrap();
    s.cancel(&again.id, "u").await.unwrap();
    ended(s, &again.id).await;
}

#[tokio::test]
async fn a_run_past_its_deadline_fails_and_a_stale_one_is_abandoned() {
    let f = fixture().await;
    let s = &f.scheduler;
    s.register(long_task("host.slow").max_duration(Duration::from_millis(50))).unwrap();
    let timed_out = ended(s, &s.trigger("host.slow", "u").await.unwrap().id).await;
    assert_eq!((timed_out.status, timed_out.error.unwrap().code.as_str()), (Status::Failed, "task-timed-out"));

    // on another node, far past its deadline
    let start = |node: &'static str, now: u64| model::Start {
        task_id: "host.cleanup",
        enabled_by_default: true,
        trigger: Trigger::Schedule,
        triggered_by: None,
        node_id: node,
        now,
        max_duration_ms: 1000,
    };
    let now = now_ms();
    let remote = model::start(s.store(), &start("node-b", now)).await.unwrap();
    assert_eq!(s.abandon_stale(now + 1000).await.unwrap(), 0, "within its deadline it is left alone");
    let later = now + 1000 + ABANDON_GRACE.as_millis() as u64 + 1;
    assert_eq!(s.abandon_stale(later).await.unwrap(), 1);
    let abandoned = execution(s, &remote.id).await;
    assert_eq!((abandoned.status, abandoned.error.unwrap().code.as_str()), (Status::Abandoned, "task-abandoned"));
    assert_eq!(abandoned.ended_at, Some(later));

    // on this node, from before this process started (a restart cut it off)
    let cut_off = model::start(s.store(), &start("node-a", s.booted_at - 10)).await.unwrap();
    assert_eq!(s.abandon_stale(now_ms()).await.unwrap(), 1);
    assert_eq!(execution(s, &cut_off.id).await.status, Status::Abandoned);
    let record = model::read_task(s.store(), "host.cleanup").await.unwrap().unwrap();
    assert_eq!(record.running, None, "the task may run again");
    // a late end from the node that ran it does not overwrite the first verdict
    assert!(model::finish(s.store(), &cut_off.id, Status::Succeeded, None, None, now_ms()).await.unwrap().is_none());
}

#[tokio::test]
async fn cleanup_keeps_recent_history_and_trims_the_outbox() {
    let f = fixture().await;
    let s = &f.scheduler;
    let store = s.store().clone();
    let now = now_ms();
    let day = 24 * 3600 * 1000;
    // 105 recent runs of one task, 3 old runs of another, one old run still going
    let put = |task: &'static str, started_at: u64, status: Status| {
        let store = store.clone();
        async move {
            let mut e = model::start(
                &store,
                &model::Start {
                    task_id: task,
                    enabled_by_default: true,
                    trigger: Trigger::Schedule,
                    triggered_by: None,
                    node_id: "node-a",
                    now: started_at,
                    max_duration_ms: 1000,
                },
            )
            .await
            .unwrap();
            if status != Status::Running {
                e = model::finish(&store, &e.id, status, None, None, started_at + 5).await.unwrap().unwrap();
            }
            e
        }
    };
    for i in 0..105 {
        put("host.busy", now - 1000 * (105 - i), Status::Succeeded).await;
    }
    for i in 0..3 {
        put("host.rare", now - 40 * day - i, Status::Failed).await;
    }
    let still_running = put("host.stuck", now - 40 * day, Status::Running).await;
    for i in 0..3 {
        store
            .transact(|tx| async move { capstan_events::append(&tx, "test.happened", "s", json!({ "i": i }), "host").await })
            .await
            .unwrap();
    }
    capstan_events::advance(&store, "plugin:uninstalled", 1).await.unwrap();

    let log = TaskLog::new();
    // an hour after the last event was written, however long writing the fixture took
    let later = now_ms() + capstan_events::DELIVERED_RETENTION_MS;
    cleanup::run(&store, None, &log, later).await.unwrap();
    let (busy, _) = model::list_executions(&store, "host.busy", None, 200).await.unwrap();
    assert_eq!(busy.len(), model::EXECUTIONS_KEPT_PER_TASK);
    assert_eq!(busy.last().unwrap().started_at, now - 100_000, "the oldest five went");
    assert!(model::list_executions(&store, "host.rare", None, 10).await.unwrap().0.is_empty());
    assert_eq!(execution(s, &still_running.id).await.status, Status::Running, "a running execution is never deleted");
    // without a plugin host every cursor counts, so plugin:uninstalled (at 1) holds 2 and 3 back
    assert_eq!(capstan_events::read_after(&store, 0, 10).await.unwrap().len(), 2);
    assert_eq!(log.snapshot().0, vec!["removed 8 old task executions", "removed 1 delivered events"]);
}
