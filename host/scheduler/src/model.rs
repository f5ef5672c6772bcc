//! The durable side of the scheduler: `tasks` (per task: the enabled override, the execution
//! running now, the last execution's summary) and `task_executions` (one document per run).
//!
//! The task document is also the fleet-wide lock for the one-run-at-a-time rule: starting an
//! execution reads it and writes it in the same transaction as the new execution, so two nodes
//! starting the same task concurrently cannot both succeed.

use capstan_core::refusal::{Refusal, Result};
use capstan_store::{CollectionSpec, Document, Store, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The collection of task records ([`TaskRecord`]), keyed by task id.
pub const TASKS: &str = "tasks";
/// The collection of executions ([`Execution`]), keyed by execution id, indexed by task and
/// by status.
pub const EXECUTIONS: &str = "task_executions";

/// Declare the scheduler's collections and their indexes.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(CollectionSpec::new(TASKS)).await?;
    store.declare(CollectionSpec::new(EXECUTIONS).index("by_task", &["taskId"]).index("by_status", &["status"])).await
}

/// Where an execution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Status {
    /// Still going.
    Running,
    /// Ended without error.
    Succeeded,
    /// Ended with an error, a crash or a timeout; `error` says which.
    Failed,
    /// Stopped because someone asked to cancel it.
    Cancelled,
    /// Its node stopped being live, or it ran far past its deadline: nobody will finish it.
    Abandoned,
}

impl Status {
    /// The status as the API writes it, e.g. `running`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Abandoned => "abandoned",
        }
    }
}

/// What started an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Trigger {
    /// Its cron schedule fell due.
    Schedule,
    /// A user ran it by hand (`tasks.trigger`).
    Manual,
}

/// Why an execution failed or was abandoned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExecutionError {
    /// A stable code: the task's own refusal code, or `task-timed-out`, `task-panicked` or
    /// `task-abandoned`.
    pub code: String,
    /// What went wrong, for a person to read.
    pub message: String,
}

/// One run of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Execution {
    /// The execution id; ids sort newest first.
    pub id: String,
    /// The task it is a run of.
    pub task_id: String,
    /// What started it.
    pub trigger: Trigger,
    /// The user who triggered a manual run.
    pub triggered_by: Option<String>,
    /// Where it stands.
    pub status: Status,
    /// Milliseconds since the Unix epoch.
    pub started_at: u64,
    /// When it ended (milliseconds since the Unix epoch); absent while it runs.
    pub ended_at: Option<u64>,
    /// How long it ran, in milliseconds; absent while it runs.
    pub duration_ms: Option<u64>,
    /// The node that runs (or ran) it.
    pub node_id: String,
    /// When the run is stopped if still going (milliseconds since the Unix epoch).
    pub deadline_at: u64,
    /// Why it failed or was abandoned.
    pub error: Option<ExecutionError>,
    /// The newest log lines (at most 50 lines and 8 KiB).
    pub log: Vec<String>,
    /// How many older lines were dropped from the log.
    #[serde(default)]
    pub log_dropped: u64,
    /// When someone asked to cancel it (milliseconds since the Unix epoch), if anyone did.
    pub cancel_requested_at: Option<u64>,
    /// The user who asked to cancel it, if anyone did.
    pub cancel_requested_by: Option<String>,
}

impl Execution {
    /// The summary of this execution that its task keeps.
    pub fn summary(&self) -> Summary {
        Summary {
            id: self.id.clone(),
            trigger: self.trigger,
            status: self.status,
            started_at: self.started_at,
            ended_at: self.ended_at,
            duration_ms: self.duration_ms,
        }
    }
}

/// The last execution of a task, kept on the task (it outlives the execution's cleanup).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// The execution id.
    pub id: String,
    /// What started it.
    pub trigger: Trigger,
    /// How it ended.
    pub status: Status,
    /// When it started (milliseconds since the Unix epoch).
    pub started_at: u64,
    /// When it ended (milliseconds since the Unix epoch).
    pub ended_at: Option<u64>,
    /// How long it ran, in milliseconds.
    pub duration_ms: Option<u64>,
}

/// `tasks/<taskId>`: what is durable about a task besides its definition (which is code).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRecord {
    /// An administrator's choice; absent means the definition's default.
    pub enabled: Option<bool>,
    /// The user who last set `enabled`.
    pub enabled_changed_by: Option<String>,
    /// When `enabled` last changed (milliseconds since the Unix epoch).
    pub enabled_changed_at: Option<u64>,
    /// The execution running now, if any.
    pub running: Option<String>,
    /// The latest-started execution that has ended, if any.
    pub last_execution: Option<Summary>,
}

fn parse<T: serde::de::DeserializeOwned>(doc: &Document) -> Result<T> {
    serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("{} is not readable: {e}", doc.id)))
}

fn to_value<T: Serialize>(value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value).map_err(Refusal::internal)
}

/// An execution id that sorts newest first (inverted start time, then randomness), so a
/// task's executions page newest first in plain id order.
pub fn new_execution_id(started_at: u64) -> String {
    format!("{:016x}-{:08x}", u64::MAX - started_at, rand::random::<u32>())
}

/// A task's record read in `tx`, with its revision (`None` with a default record when nothing
/// is stored for the task yet).
pub async fn task_record(tx: &Tx, id: &str) -> Result<(Option<u64>, TaskRecord)> {
    match tx.get(TASKS, id).await? {
        Some(doc) => Ok((Some(doc.revision), parse(&doc)?)),
        None => Ok((None, TaskRecord::default())),
    }
}

/// A task's record; `None` when nothing is stored for the task yet.
pub async fn read_task(store: &Store, id: &str) -> Result<Option<TaskRecord>> {
    let doc = store.transact(|tx| async move { tx.get(TASKS, id).await }).await?;
    doc.as_ref().map(parse).transpose()
}

/// One execution; `None` when there is none with that id. Refuses `execution-not-found` for an
/// id the store cannot hold.
pub async fn read_execution(store: &Store, id: &str) -> Result<Option<Execution>> {
    capstan_store::validate_id(id).map_err(|_| execution_not_found(id))?;
    let doc = store.transact(|tx| async move { tx.get(EXECUTIONS, id).await }).await?;
    doc.as_ref().map(parse).transpose()
}

/// The `execution-not-found` refusal for `id` (cut to 100 bytes).
pub fn execution_not_found(id: &str) -> Refusal {
    Refusal::new("execution-not-found", format!("there is no task execution {:?}", capstan_core::text::truncate(id, 100)))
        .with_data(json!({ "executionId": capstan_core::text::truncate(id, 100) }))
}

/// What a new execution starts as.
pub struct Start<'a> {
    /// The task to run.
    pub task_id: &'a str,
    /// Whether the task runs while no administrator has enabled or disabled it.
    pub enabled_by_default: bool,
    /// What starts it.
    pub trigger: Trigger,
    /// The user who runs it by hand; `None` on schedule.
    pub triggered_by: Option<&'a str>,
    /// The node that runs it.
    pub node_id: &'a str,
    /// The start time (milliseconds since the Unix epoch).
    pub now: u64,
    /// How long it may run, in milliseconds; its deadline is `now` plus this.
    pub max_duration_ms: u64,
}

/// Record a new running execution, refusing `task-disabled` and `task-running` (one run at a
/// time across the fleet).
pub async fn start(store: &Store, start: &Start<'_>) -> Result<Execution> {
    let execution = Execution {
        id: new_execution_id(start.now),
        task_id: start.task_id.to_string(),
        trigger: start.trigger,
        triggered_by: start.triggered_by.map(str::to_string),
        status: Status::Running,
        started_at: start.now,
        ended_at: None,
        duration_ms: None,
        node_id: start.node_id.to_string(),
        deadline_at: start.now.saturating_add(start.max_duration_ms),
        error: None,
        log: Vec::new(),
        log_dropped: 0,
        cancel_requested_at: None,
        cancel_requested_by: None,
    };
    let attempt = || {
        store.transact(|tx| {
            let execution = execution.clone();
            async move {
                let (revision, mut record) = task_record(&tx, start.task_id).await?;
                if !record.enabled.unwrap_or(start.enabled_by_default) {
                    return Err(Refusal::new("task-disabled", format!("task {} is disabled; enable it to run it", start.task_id))
                        .with_data(json!({ "taskId": start.task_id })));
                }
                if let Some(running) = &record.running
                    && let Some(doc) = tx.get(EXECUTIONS, running).await?
                    && parse::<Execution>(&doc)?.status == Status::Running
                {
                    return Err(Refusal::new(
                        "task-running",
                        format!("task {} is already running (execution {running}); cancel it or wait", start.task_id),
                    )
                    .with_data(json!({ "taskId": start.task_id, "executionId": running })));
                }
                record.running = Some(execution.id.clone());
                tx.insert(EXECUTIONS, &execution.id, to_value(&execution)?).await?;
                tx.put(TASKS, start.task_id, revision, to_value(&record)?).await?;
                Ok(execution)
            }
        })
    };
    match attempt().await {
        // another node created the task record at the same moment: read it and decide again
        Err(e) if e.is("exists") => attempt().await,
        other => other,
    }
}

/// End a running execution with `status`; `None` when it had already ended (a first terminal
/// status is never overwritten).
pub async fn finish(
    store: &Store,
    id: &str,
    status: Status,
    error: Option<ExecutionError>,
    log: Option<(Vec<String>, u64)>,
    now: u64,
) -> Result<Option<Execution>> {
    store
        .transact(|tx| {
            let (error, log) = (error.clone(), log.clone());
            async move {
                let Some(doc) = tx.get(EXECUTIONS, id).await? else { return Ok(None) };
                let mut execution: Execution = parse(&doc)?;
                if execution.status != Status::Running {
                    return Ok(None);
                }
                let ended = now.max(execution.started_at);
                execution.status = status;
                execution.ended_at = Some(ended);
                execution.duration_ms = Some(ended - execution.started_at);
                execution.error = error;
                if let Some((lines, dropped)) = log {
                    execution.log = lines;
                    execution.log_dropped = dropped;
                }
                tx.replace(EXECUTIONS, id, doc.revision, to_value(&execution)?).await?;
                let (revision, mut record) = task_record(&tx, &execution.task_id).await?;
                if record.running.as_deref() == Some(id) {
                    record.running = None;
                }
                if record.last_execution.as_ref().is_none_or(|last| last.started_at <= execution.started_at) {
                    record.last_execution = Some(execution.summary());
                }
                tx.put(TASKS, &execution.task_id, revision, to_value(&record)?).await?;
                Ok(Some(execution))
            }
        })
        .await
}

/// Write the current log tail of a running execution (nothing once it ended).
pub async fn write_log(store: &Store, id: &str, lines: Vec<String>, dropped: u64) -> Result<()> {
    store
        .transact(|tx| {
            let lines = lines.clone();
            async move {
                let Some(doc) = tx.get(EXECUTIONS, id).await? else { return Ok(()) };
                let mut execution: Execution = parse(&doc)?;
                if execution.status != Status::Running {
                    return Ok(());
                }
                execution.log = lines;
                execution.log_dropped = dropped;
                tx.replace(EXECUTIONS, id, doc.revision, to_value(&execution)?).await.map(drop)
            }
        })
        .await
}

/// Record a request to cancel a running execution; its node acts on it. Refuses
/// `execution-not-found` and `execution-not-running`.
pub async fn request_cancel(store: &Store, id: &str, by: &str, now: u64) -> Result<Execution> {
    capstan_store::validate_id(id).map_err(|_| execution_not_found(id))?;
    store
        .transact(|tx| async move {
            let doc = tx.get(EXECUTIONS, id).await?.ok_or_else(|| execution_not_found(id))?;
            let mut execution: Execution = parse(&doc)?;
            if execution.status != Status::Running {
                return Err(Refusal::new(
                    "execution-not-running",
                    format!("execution {id} already ended ({}); there is nothing to cancel", execution.status.as_str()),
                )
                .with_data(json!({ "executionId": id, "status": execution.status })));
            }
            if execution.cancel_requested_at.is_none() {
                execution.cancel_requested_at = Some(now);
                execution.cancel_requested_by = Some(by.to_string());
                tx.replace(EXECUTIONS, id, doc.revision, to_value(&execution)?).await?;
            }
            Ok(execution)
        })
        .await
}

/// Set the enabled override of a task.
pub async fn set_enabled(store: &Store, task_id: &str, enabled: bool, by: &str, now: u64) -> Result<TaskRecord> {
    store
        .transact(|tx| async move {
            let (revision, mut record) = task_record(&tx, task_id).await?;
            if record.enabled == Some(enabled) {
                return Ok(record);
            }
            record.enabled = Some(enabled);
            record.enabled_changed_by = Some(by.to_string());
            record.enabled_changed_at = Some(now);
            tx.put(TASKS, task_id, revision, to_value(&record)?).await?;
            Ok(record)
        })
        .await
}

/// A page of a task's executions, newest first.
pub async fn list_executions(store: &Store, task_id: &str, cursor: Option<&str>, limit: usize) -> Result<(Vec<Execution>, Option<String>)> {
    let page = store.transact(|tx| async move { tx.find(EXECUTIONS, "by_task", &[json!(task_id)], cursor, limit).await }).await?;
    let executions = page.documents.iter().map(parse).collect::<Result<Vec<Execution>>>()?;
    Ok((executions, page.next_cursor))
}

/// Up to `limit` executions recorded as running, anywhere in the fleet.
pub async fn running(store: &Store, limit: usize) -> Result<Vec<Execution>> {
    let page = store.transact(|tx| async move { tx.find(EXECUTIONS, "by_status", &[json!("running")], None, limit).await }).await?;
    page.documents.iter().map(parse).collect()
}

/// Read several executions in one transaction (absent ones are left out).
pub async fn read_executions(store: &Store, ids: &[String]) -> Result<Vec<Execution>> {
    store
        .transact(|tx| async move {
            let mut out = Vec::new();
            for id in ids {
                if let Some(doc) = tx.get(EXECUTIONS, id).await? {
                    out.push(parse(&doc)?);
                }
            }
            Ok(out)
        })
        .await
}

/// Bounds of execution history. Kept: 30 days is long enough to compare a month of runs, and
/// 100 per task keeps a task that runs every minute from filling the store.
pub const EXECUTION_MAX_AGE_MS: u64 = 30 * 24 * 3600 * 1000;
/// Executions kept per task, newest first; older ended ones are deleted.
pub const EXECUTIONS_KEPT_PER_TASK: usize = 100;
/// Documents read (and at most deleted) per transaction, so no cleanup transaction grows large.
pub const CLEANUP_BATCH: usize = 200;
/// Batches per pass; what remains waits for the next pass.
pub const CLEANUP_MAX_BATCHES: usize = 100;

/// Delete ended executions older than [`EXECUTION_MAX_AGE_MS`] or beyond the newest
/// [`EXECUTIONS_KEPT_PER_TASK`] of their task. Running executions are never deleted. Answers
/// how many were deleted.
pub async fn trim_executions(store: &Store, now: u64) -> Result<u64> {
    let mut seen: std::collections::HashMap<String, usize> = Default::default();
    let (mut cursor, mut deleted) = (None::<String>, 0u64);
    for _ in 0..CLEANUP_MAX_BATCHES {
        let (next, counts, removed) = store
            .transact(|tx| {
                let (cursor, mut counts) = (cursor.clone(), seen.clone());
                async move {
                    // ids sort newest first, so counting in id order counts each task's newest first
                    let page = tx.scan(EXECUTIONS, cursor.as_deref(), CLEANUP_BATCH).await?;
                    let mut removed = 0u64;
                    for doc in &page.documents {
                        let Ok(execution) = parse::<Execution>(doc) else { continue };
                        let count = counts.entry(execution.task_id.clone()).or_default();
                        *count += 1;
                        let old = execution.started_at.saturating_add(EXECUTION_MAX_AGE_MS) <= now;
                        if execution.status != Status::Running && (old || *count > EXECUTIONS_KEPT_PER_TASK) {
                            tx.delete(EXECUTIONS, &doc.id, doc.revision).await?;
                            removed += 1;
                        }
                    }
                    Ok((page.next_cursor, counts, removed))
                }
            })
            .await?;
        seen = counts;
        deleted += removed;
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    Ok(deleted)
}
