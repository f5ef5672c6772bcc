//! The scheduler: cron tasks with execution history, manual triggers, cancellation and
//! enable/disable.
//!
//! A task is defined in code — a host task registered with [`Scheduler::register`] (id
//! `host.<name>`), or a schedule a loaded plugin declares (id `plugin.<pluginId>.<schedule>`).
//! What is durable is in [`model`]: per task the administrator's enabled override and the last
//! execution; per execution its trigger, status, times, node, error and a bounded log tail.
//!
//! On schedule a task runs only on the node the coordinator placed its workload on (the task
//! id for host tasks, `plugin.<id>` for plugin tasks); by hand it runs on the node that took the
//! request. Either way at most one execution of a task runs at a time across the fleet (the
//! task document is the lock), and a disabled task does not run at all. Every node ticks once a
//! second: it starts what fell due, acts on cancel requests for the executions it runs, and now
//! and then marks `abandoned` what nobody will finish (its node is gone, or it is long past its
//! deadline), so nothing stays `running` forever.

pub mod cleanup;
pub mod cron;
pub mod log;
pub mod methods;
pub mod model;
#[cfg(test)]
mod tests;

use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_fleet::placement::Workload;
use capstan_fleet::runtime::Fleet;
use capstan_store::Store;
use futures::FutureExt;
use futures::future::{AbortHandle, Abortable, BoxFuture};
pub use log::TaskLog;
pub use model::{Execution, ExecutionError, Status, Trigger};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often a node considers its schedules and the executions it runs: cancel requests are
/// acted on within about this long (cron's finest unit is a minute, so it is ample for those).
pub const TICK: Duration = Duration::from_secs(1);
/// How often a node looks for executions nobody will finish.
pub const ABANDON_EVERY: Duration = Duration::from_secs(30);
/// How far past its deadline an execution on another node must be before it is abandoned
/// (that node stops it at the deadline itself and needs a moment to record it).
pub const ABANDON_GRACE: Duration = Duration::from_secs(60);
/// The longest a host task runs unless it says otherwise.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(3600);
/// Past a plugin task's deadline (where its sandbox stops it), the room left to record that.
pub const PLUGIN_DEADLINE_GRACE: Duration = Duration::from_secs(30);

/// Run a plugin's scheduled task once; answers the summary it logs.
pub type PluginRun = Arc<dyn Fn() -> BoxFuture<'static, Result<String>> + Send + Sync>;

/// A schedule a loaded plugin declares, as the scheduler runs it.
#[derive(Clone)]
pub struct PluginSchedule {
    /// The plugin's id.
    pub plugin: String,
    /// The schedule's name within the plugin.
    pub name: String,
    /// What it does, in a line (may be empty).
    pub summary: String,
    /// When it runs (cron, 5 fields, UTC).
    pub cron: String,
    /// The placement workload the plugin's background work belongs to.
    pub workload: String,
    /// Where the sandbox stops a run.
    pub deadline: Duration,
    /// One run.
    pub run: PluginRun,
}

/// The plugins as the scheduler sees them: the schedules the loaded ones declare, and which are
/// installed (only an installed plugin's event cursor holds events back). The plugin host
/// implements it; the scheduler knows nothing else of plugins.
#[async_trait::async_trait]
pub trait PluginTasks: Send + Sync {
    /// Every schedule of every plugin loaded here.
    fn schedules(&self) -> Vec<PluginSchedule>;
    /// The ids of the installed plugins.
    async fn installed(&self) -> Result<std::collections::BTreeSet<String>>;
}

/// What a host task runs: a future given the execution's log.
pub type TaskFn = Arc<dyn Fn(TaskLog) -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// Background work the host registers with [`Scheduler::register`].
///
/// ```ignore
/// scheduler.register(
///     HostTask::new("host.finalize-deleted-services", "Finalize deleted services", "*/5 * * * *", move |log| {
///         let store = store.clone();
///         async move {
///             let n = finalize(&store).await?;
///             log.line(format!("finalized {n} services"));
///             Ok(())
///         }
///     })
///     .description("Deletes services whose managers all released them."),
/// )?;
/// ```
#[derive(Clone)]
pub struct HostTask {
    /// `host.<name>`: lowercase letters, digits, `-` and `.`.
    pub id: String,
    /// A short name shown in task lists (required).
    pub title: String,
    /// What it does, in a sentence or two (may be empty).
    pub description: String,
    /// Five fields, UTC.
    pub cron: String,
    /// Whether it runs while no administrator has enabled or disabled it.
    pub enabled_by_default: bool,
    /// A run still going after this is stopped and recorded `failed` (`task-timed-out`).
    pub max_duration: Duration,
    /// What one run does.
    pub run: TaskFn,
}

impl HostTask {
    /// A task enabled by default, with no description and [`DEFAULT_MAX_DURATION`].
    pub fn new<F, Fut>(id: &str, title: &str, cron: &str, run: F) -> HostTask
    where
        F: Fn(TaskLog) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        HostTask {
            id: id.into(),
            title: title.into(),
            description: String::new(),
            cron: cron.into(),
            enabled_by_default: true,
            max_duration: DEFAULT_MAX_DURATION,
            run: Arc::new(move |log| Box::pin(run(log))),
        }
    }

    /// Set the description shown with the task.
    pub fn description(mut self, text: &str) -> Self {
        self.description = text.into();
        self
    }

    /// Runs only once an administrator enables it.
    pub fn disabled_by_default(mut self) -> Self {
        self.enabled_by_default = false;
        self
    }

    /// Set how long a run may last before it is stopped and recorded `failed`.
    pub fn max_duration(mut self, max: Duration) -> Self {
        self.max_duration = max;
        self
    }
}

/// Where a task is defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    /// Registered by the host itself; its id is `host.<name>`.
    Host,
    /// Declared by a loaded plugin; its id is `plugin.<pluginId>.<schedule>`.
    Plugin,
}

/// A task as defined now (host code or a loaded plugin's descriptor).
#[derive(Clone)]
pub struct Definition {
    /// The task id: `host.<name>` or `plugin.<pluginId>.<schedule>`.
    pub id: String,
    /// Whether the host or a plugin defines it.
    pub kind: Kind,
    /// The id of the plugin that declares it; `None` for host tasks.
    pub plugin: Option<String>,
    /// A short name shown in task lists.
    pub title: String,
    /// What it does (may be empty).
    pub description: String,
    /// When it runs (cron, 5 fields, UTC).
    pub cron: String,
    /// Whether it runs while no administrator has enabled or disabled it.
    pub enabled_by_default: bool,
    /// The workload whose placement decides where it runs on schedule.
    pub workload: String,
    /// How long a run may last before it is stopped (for a plugin task, its sandbox deadline
    /// plus [`PLUGIN_DEADLINE_GRACE`]).
    pub max_duration: Duration,
    run: Run,
}

#[derive(Clone)]
enum Run {
    Host(TaskFn),
    Plugin(PluginRun),
}

impl Definition {
    fn future(&self, log: TaskLog) -> BoxFuture<'static, Result<()>> {
        match &self.run {
            Run::Host(run) => run(log),
            Run::Plugin(run) => {
                let run = run.clone();
                Box::pin(async move {
                    let summary = run().await?;
                    if !summary.trim().is_empty() {
                        log.line(summary);
                    }
                    Ok(())
                })
            }
        }
    }
}

/// The `task-not-found` refusal for `id` (cut to 200 bytes).
pub fn task_not_found(id: &str) -> Refusal {
    let id = capstan_core::text::truncate(id, 200);
    Refusal::new("task-not-found", format!("there is no task {id:?}; tasks.list names them")).with_data(json!({ "taskId": id }))
}

/// An execution running in this process.
struct Local {
    abort: AbortHandle,
    log: TaskLog,
    /// The log version last written to the store.
    flushed: u64,
}

/// The scheduler of one node: the tasks defined here, the executions this process runs, and
/// the tick that starts, cancels and abandons them.
pub struct Scheduler {
    store: Store,
    node_id: String,
    fleet: Option<Arc<Fleet>>,
    plugins: Option<Arc<dyn PluginTasks>>,
    host_tasks: RwLock<BTreeMap<String, HostTask>>,
    local: Mutex<HashMap<String, Local>>,
    /// When this process began: an execution recorded on this node before then was cut off
    /// by a restart.
    booted_at: u64,
    /// Schedules due after this were not yet considered.
    checked_at: Mutex<u64>,
    last_abandon_pass: Mutex<u64>,
}

impl Scheduler {
    /// The scheduler of this node, with the built-in `host.cleanup` registered. Without a
    /// fleet every task is placed here; without plugins there are only host tasks.
    pub async fn new(store: Store, node_id: String, fleet: Option<Arc<Fleet>>, plugins: Option<Arc<dyn PluginTasks>>) -> Result<Arc<Self>> {
        model::declare(&store).await?;
        capstan_events::declare(&store).await?;
        let now = now_ms();
        let scheduler = Arc::new(Scheduler {
            store: store.clone(),
            node_id,
            fleet,
            plugins: plugins.clone(),
            host_tasks: Default::default(),
            local: Default::default(),
            booted_at: now,
            checked_at: Mutex::new(now),
            last_abandon_pass: Mutex::new(0),
        });
        scheduler.register(cleanup::task(store, plugins))?;
        Ok(scheduler)
    }

    /// Add a host task. Refuses `task-id-invalid`, `task-cron-invalid` and `task-exists`.
    pub fn register(&self, task: HostTask) -> Result<()> {
        let name = task.id.strip_prefix("host.").unwrap_or_default();
        if name.is_empty()
            || task.id.len() > 128
            || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return Err(Refusal::new("task-id-invalid", format!("host task id {:?} must be host.<name> in lowercase", task.id)));
        }
        if task.title.trim().is_empty() {
            return Err(Refusal::new("task-title-missing", format!("host task {} needs a title", task.id)));
        }
        cron::parse(&task.cron)?;
        let mut tasks = self.host_tasks.write().expect("host tasks");
        if tasks.contains_key(&task.id) {
            return Err(Refusal::new("task-exists", format!("host task {} is registered already", task.id)));
        }
        tasks.insert(task.id.clone(), task);
        Ok(())
    }

    /// The host tasks' workloads, for the coordinator to place (one node each).
    pub fn workloads(&self) -> Vec<Workload> {
        let tasks = self.host_tasks.read().expect("host tasks");
        tasks.keys().map(|id| Workload { id: id.clone(), replicas: 1, selector: Default::default() }).collect()
    }

    /// Every task defined now, by id.
    pub fn definitions(&self) -> Vec<Definition> {
        let mut all: Vec<Definition> = self
            .host_tasks
            .read()
            .expect("host tasks")
            .values()
            .map(|t| Definition {
                id: t.id.clone(),
                kind: Kind::Host,
                plugin: None,
                title: t.title.clone(),
                description: t.description.clone(),
                cron: t.cron.clone(),
                enabled_by_default: t.enabled_by_default,
                workload: t.id.clone(),
                max_duration: t.max_duration,
                run: Run::Host(t.run.clone()),
            })
            .collect();
        for schedule in self.plugins.iter().flat_map(|p| p.schedules()) {
            let PluginSchedule { plugin, name, summary, cron, workload, deadline, run } = schedule;
            all.push(Definition {
                id: format!("plugin.{plugin}.{name}"),
                kind: Kind::Plugin,
                title: if summary.trim().is_empty() { name.clone() } else { summary },
                description: format!("The scheduled task {name:?} of the plugin {plugin}."),
                plugin: Some(plugin),
                cron,
                enabled_by_default: true,
                workload,
                max_duration: deadline + PLUGIN_DEADLINE_GRACE,
                run: Run::Plugin(run),
            });
        }
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// One task's definition; `task-not-found` when no host code or loaded plugin defines it.
    pub fn definition(&self, id: &str) -> Result<Definition> {
        self.definitions().into_iter().find(|d| d.id == id).ok_or_else(|| task_not_found(id))
    }

    /// The store that holds tasks and executions.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Run a task now on this node, as `user`; answers the running execution at once.
    pub async fn trigger(self: &Arc<Self>, id: &str, user: &str) -> Result<Execution> {
        let definition = self.definition(id)?;
        let execution = self.start(&definition, Trigger::Manual, Some(user)).await?;
        tracing::info!(task = %id, execution = %execution.id, by = %user, "task triggered by hand");
        Ok(execution)
    }

    /// Ask for a running execution to stop. Its node aborts it within about a [`TICK`]
    /// (at once when it runs here) and records it `cancelled`.
    pub async fn cancel(&self, execution_id: &str, user: &str) -> Result<Execution> {
        let execution = model::request_cancel(&self.store, execution_id, user, now_ms()).await?;
        if let Some(local) = self.local.lock().expect("local executions").get(execution_id) {
            local.log.line(format!("cancel requested by {user}"));
            local.abort.abort();
        }
        tracing::info!(task = %execution.task_id, execution = %execution_id, by = %user, "task execution cancel requested");
        Ok(execution)
    }

    /// Enable or disable a task as `user` (an administrator's override of its default);
    /// refuses `task-not-found` for a task nobody defines. Answers the task's record.
    pub async fn set_enabled(&self, id: &str, enabled: bool, user: &str) -> Result<model::TaskRecord> {
        self.definition(id)?;
        let record = model::set_enabled(&self.store, id, enabled, user, now_ms()).await?;
        tracing::info!(task = %id, enabled, by = %user, "task {}", if enabled { "enabled" } else { "disabled" });
        Ok(record)
    }

    /// Whether `definition` is enabled given its durable record.
    pub fn enabled(definition: &Definition, record: Option<&model::TaskRecord>) -> bool {
        record.and_then(|r| r.enabled).unwrap_or(definition.enabled_by_default)
    }

    /// Record a new execution and run it here in the background.
    async fn start(self: &Arc<Self>, definition: &Definition, trigger: Trigger, by: Option<&str>) -> Result<Execution> {
        let start = model::Start {
            task_id: &definition.id,
            enabled_by_default: definition.enabled_by_default,
            trigger,
            triggered_by: by,
            node_id: &self.node_id,
            now: now_ms(),
            max_duration_ms: definition.max_duration.as_millis() as u64,
        };
        let execution = model::start(&self.store, &start).await?;
        self.launch(definition, &execution);
        Ok(execution)
    }

    fn launch(self: &Arc<Self>, definition: &Definition, execution: &Execution) {
        let log = TaskLog::new();
        let (abort, registration) = AbortHandle::new_pair();
        self.local.lock().expect("local executions").insert(execution.id.clone(), Local { abort, log: log.clone(), flushed: 0 });
        // a run cannot outlast the deadline recorded with it, whatever the clock did meanwhile
        let max = Duration::from_millis(execution.deadline_at.saturating_sub(execution.started_at));
        let future = std::panic::AssertUnwindSafe(definition.future(log.clone())).catch_unwind();
        let (me, id, task) = (self.clone(), execution.id.clone(), definition.id.clone());
        tokio::spawn(async move {
            let began = std::time::Instant::now();
            let outcome = tokio::time::timeout(max, Abortable::new(future, registration)).await;
            let error = |code: &str, message: String| Some(ExecutionError { code: code.into(), message });
            let (status, error) = match outcome {
                Ok(Ok(Ok(Ok(())))) => (Status::Succeeded, None),
                Ok(Ok(Ok(Err(refusal)))) => {
                    log.line(format!("refused ({}): {}", refusal.code, refusal.message));
                    (Status::Failed, error(&refusal.code, refusal.message))
                }
                Ok(Ok(Err(_panic))) => {
                    (Status::Failed, error("task-panicked", "the task stopped unexpectedly; the server log has more".into()))
                }
                Ok(Err(_aborted)) => (Status::Cancelled, None),
                Err(_elapsed) => (Status::Failed, error("task-timed-out", format!("the task did not finish within {} s", max.as_secs()))),
            };
            // `/metrics`: runs on this node by task (a registered task's id: a bounded set) and status
            metrics::counter!("capstan_scheduler_runs_total", "task" => task.clone(), "status" => status.as_str()).increment(1);
            metrics::histogram!("capstan_scheduler_run_duration_seconds", "task" => task.clone()).record(began.elapsed().as_secs_f64());
            if status == Status::Failed && error.as_ref().is_some_and(|e| e.code == "task-panicked") {
                tracing::error!(task = %task, execution = %id, "task panicked");
            }
            me.record_end(&id, &task, status, error, &log).await;
            me.local.lock().expect("local executions").remove(&id);
        });
    }

    /// Write how a local run ended, retrying transient store trouble for a while; if it never
    /// lands, the abandonment pass ends the execution later.
    async fn record_end(&self, id: &str, task: &str, status: Status, error: Option<ExecutionError>, log: &TaskLog) {
        for attempt in 0..5u32 {
            match model::finish(&self.store, id, status, error.clone(), Some(log.snapshot()), now_ms()).await {
                Ok(Some(done)) => {
                    tracing::info!(task = %task, execution = %id, status = status.as_str(), duration_ms = done.duration_ms.unwrap_or(0),
                        error = error.as_ref().map(|e| e.code.as_str()).unwrap_or(""), "task execution ended");
                    return;
                }
                Ok(None) => return, // ended meanwhile (abandoned by another node)
                Err(e) => {
                    tracing::warn!(task = %task, execution = %id, code = %e.code, attempt, "task execution end not recorded: {}", e.message);
                    tokio::time::sleep(Duration::from_secs(1 << attempt)).await;
                }
            }
        }
    }

    /// Whether this process runs `execution_id` now.
    pub fn runs_here(&self, execution_id: &str) -> bool {
        self.local.lock().expect("local executions").contains_key(execution_id)
    }

    /// Start the tick loop; it stops when `stop` turns true.
    pub fn spawn(self: &Arc<Self>, stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let me = self.clone();
        capstan_fleet::runtime::every(TICK, stop, move || {
            let me = me.clone();
            async move { me.tick().await }
        })
    }

    /// One pass: start what fell due, act on cancel requests, now and then abandon the stale.
    pub async fn tick(self: &Arc<Self>) {
        let now = now_ms();
        let since = std::mem::replace(&mut *self.checked_at.lock().expect("checked at"), now);
        if now > since {
            self.run_due(since, now).await;
        }
        if let Err(e) = self.watch_local().await {
            tracing::warn!(code = %e.code, "running task executions not checked: {}", e.message);
        }
        let abandon = {
            let mut last = self.last_abandon_pass.lock().expect("abandon pass");
            let due = now.saturating_sub(*last) >= ABANDON_EVERY.as_millis() as u64;
            if due {
                *last = now;
            }
            due
        };
        if abandon && let Err(e) = self.abandon_stale(now).await {
            tracing::warn!(code = %e.code, "stale task executions not checked: {}", e.message);
        }
    }

    /// Start every task due in `(since, now]` whose workload is placed here.
    async fn run_due(self: &Arc<Self>, since: u64, now: u64) {
        for definition in self.definitions() {
            if !cron::due_between(&definition.cron, since, now) {
                continue;
            }
            if let Some(fleet) = &self.fleet
                && !fleet.assigned_here(&definition.workload).await
            {
                continue;
            }
            match self.start(&definition, Trigger::Schedule, None).await {
                Ok(execution) => tracing::debug!(task = %definition.id, execution = %execution.id, "scheduled task started"),
                Err(e) if e.is("task-disabled") => tracing::debug!(task = %definition.id, "scheduled run skipped: disabled"),
                Err(e) if e.is("task-running") => tracing::info!(task = %definition.id, "scheduled run skipped: the previous run goes on"),
                Err(e) => tracing::warn!(task = %definition.id, code = %e.code, "scheduled task not started: {}", e.message),
            }
        }
    }

    /// For the executions running here: abort those asked to stop (or ended elsewhere), and
    /// write log tails that changed.
    async fn watch_local(&self) -> Result<()> {
        let ids: Vec<String> = self.local.lock().expect("local executions").keys().cloned().collect();
        if ids.is_empty() {
            return Ok(());
        }
        let durable: HashMap<String, Execution> =
            model::read_executions(&self.store, &ids).await?.into_iter().map(|e| (e.id.clone(), e)).collect();
        let mut flush = Vec::new();
        {
            let local = self.local.lock().expect("local executions");
            for id in &ids {
                let Some(run) = local.get(id) else { continue };
                match durable.get(id) {
                    Some(e) if e.status == Status::Running && e.cancel_requested_at.is_none() => {
                        if run.log.version() != run.flushed {
                            flush.push((id.clone(), run.log.clone()));
                        }
                    }
                    Some(e) => {
                        if let Some(by) = &e.cancel_requested_by {
                            run.log.line(format!("cancel requested by {by}"));
                        }
                        run.abort.abort();
                    }
                    None => run.abort.abort(),
                }
            }
        }
        for (id, log) in flush {
            let version = log.version();
            let (lines, dropped) = log.snapshot();
            model::write_log(&self.store, &id, lines, dropped).await?;
            if let Some(run) = self.local.lock().expect("local executions").get_mut(&id) {
                run.flushed = version;
            }
        }
        Ok(())
    }

    /// Mark `abandoned` the running executions nobody will finish: cut off by a restart of this
    /// node, on a node that stopped being live, or far past their deadline.
    pub async fn abandon_stale(&self, now: u64) -> Result<usize> {
        let running = model::running(&self.store, capstan_store::MAX_PAGE).await?;
        let view = self.fleet.as_ref().map(|f| (f.view(), f.node.timing));
        let mut abandoned = 0;
        for execution in running {
            if self.runs_here(&execution.id) {
                continue; // this process stops its own runs at their deadline
            }
            let reason = if execution.node_id == self.node_id {
                (execution.started_at < self.booted_at).then(|| "its node restarted while it ran".to_string())
            } else if let Some((nodes, timing)) = &view
                && !nodes.is_empty()
                && now.saturating_sub(execution.started_at) > timing.liveness_window.as_millis() as u64
                && !nodes.iter().any(|n| n.node_id == execution.node_id && n.live(now, timing))
            {
                Some(format!("its node {} stopped being live", execution.node_id))
            } else {
                None
            };
            let reason = reason.or_else(|| {
                (now > execution.deadline_at.saturating_add(ABANDON_GRACE.as_millis() as u64))
                    .then(|| "it ran far past its deadline".into())
            });
            let Some(reason) = reason else { continue };
            let error = ExecutionError { code: "task-abandoned".into(), message: format!("abandoned: {reason}") };
            if model::finish(&self.store, &execution.id, Status::Abandoned, Some(error), None, now).await?.is_some() {
                tracing::warn!(task = %execution.task_id, execution = %execution.id, node = %execution.node_id, "task execution abandoned: {reason}");
                abandoned += 1;
            }
        }
        Ok(abandoned)
    }
}
