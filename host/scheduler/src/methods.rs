//! `tasks.*` API methods (administrators only).

use super::model::{self, Execution, Summary};
use super::{Definition, Kind, Scheduler, cron, task_not_found};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;

/// Executions `tasks.get` shows.
const RECENT: usize = 5;
/// Executions per `tasks.listExecutions` page: default and most.
const PAGE_DEFAULT: usize = 20;
const PAGE_MAX: usize = 50;

/// No parameters.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// Names a task.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRef {
    /// The task id, e.g. `host.cleanup` or `plugin.<pluginId>.<schedule>`.
    pub id: String,
}

/// Names an execution.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionRef {
    /// The execution id.
    pub id: String,
}

/// The execution to stop.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CancelInput {
    /// The id of a running execution.
    pub execution_id: String,
}

/// A task to enable or disable.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetEnabledInput {
    /// The task id.
    pub id: String,
    /// `true` to let it run; `false` to keep it from running, on schedule or by hand.
    pub enabled: bool,
}

/// A page of a task's executions to fetch.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListExecutionsInput {
    /// The task id; a task no longer defined (its plugin uninstalled) still shows the history
    /// it left.
    pub task_id: String,
    /// `nextCursor` of the previous page.
    pub cursor: Option<String>,
    /// At most 50 (default 20).
    pub limit: Option<usize>,
}

/// A task as the API shows it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskView {
    /// The task id, e.g. `host.cleanup` or `plugin.<pluginId>.<schedule>`.
    pub id: String,
    /// `host` (registered by the host) or `plugin` (declared by a loaded plugin).
    pub kind: Kind,
    /// The id of the plugin that declares it; absent for host tasks.
    pub plugin: Option<String>,
    /// A short name for the task.
    pub title: String,
    /// What it does (may be empty).
    pub description: String,
    /// Five fields, UTC.
    pub cron: String,
    /// Whether it runs: an administrator's choice, else its default.
    pub enabled: bool,
    /// Whether it runs while no administrator has enabled or disabled it.
    pub enabled_by_default: bool,
    /// The next scheduled run (milliseconds since the Unix epoch); none while disabled.
    pub next_run_at: Option<u64>,
    /// The execution running now, if any.
    pub running_execution_id: Option<String>,
    /// The latest-started execution that has ended, if any.
    pub last_execution: Option<Summary>,
}

/// Every task defined now.
#[derive(Debug, Serialize, JsonSchema)]
pub struct TaskList {
    /// The tasks, ordered by id.
    pub tasks: Vec<TaskView>,
}

/// A task with its newest executions.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskDetail {
    /// The task.
    #[serde(flatten)]
    pub task: TaskView,
    /// The newest executions, newest first.
    pub recent_executions: Vec<Execution>,
}

/// A page of a task's executions.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionPage {
    /// Newest first.
    pub executions: Vec<Execution>,
    /// Pass as `cursor` to fetch the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// A task as the API shows it, given its durable record, at `now` (milliseconds since the
/// Unix epoch).
pub fn view(definition: &Definition, record: Option<&model::TaskRecord>, now: u64) -> TaskView {
    let enabled = Scheduler::enabled(definition, record);
    TaskView {
        id: definition.id.clone(),
        kind: definition.kind,
        plugin: definition.plugin.clone(),
        title: definition.title.clone(),
        description: definition.description.clone(),
        cron: definition.cron.clone(),
        enabled,
        enabled_by_default: definition.enabled_by_default,
        next_run_at: if enabled { cron::next_after(&definition.cron, now) } else { None },
        running_execution_id: record.and_then(|r| r.running.clone()),
        last_execution: record.and_then(|r| r.last_execution.clone()),
    }
}

async fn list(scheduler: Arc<Scheduler>, _: Call, _: Empty) -> Result<TaskList> {
    let now = now_ms();
    let mut tasks = Vec::new();
    for definition in scheduler.definitions() {
        let record = model::read_task(scheduler.store(), &definition.id).await?;
        tasks.push(view(&definition, record.as_ref(), now));
    }
    Ok(TaskList { tasks })
}

async fn get(scheduler: Arc<Scheduler>, _: Call, input: TaskRef) -> Result<TaskDetail> {
    let definition = scheduler.definition(&input.id)?;
    let record = model::read_task(scheduler.store(), &definition.id).await?;
    let (recent_executions, _) = model::list_executions(scheduler.store(), &definition.id, None, RECENT).await?;
    Ok(TaskDetail { task: view(&definition, record.as_ref(), now_ms()), recent_executions })
}

async fn list_executions(scheduler: Arc<Scheduler>, _: Call, input: ListExecutionsInput) -> Result<ExecutionPage> {
    let limit = input.limit.unwrap_or(PAGE_DEFAULT);
    if !(1..=PAGE_MAX).contains(&limit) {
        return Err(Refusal::invalid_request(format!("limit is 1 to {PAGE_MAX}")).with_data(json!({ "field": "limit" })));
    }
    if input.cursor.as_ref().is_some_and(|c| capstan_store::validate_id(c).is_err()) {
        return Err(Refusal::invalid_request("cursor is not one a page answered").with_data(json!({ "field": "cursor" })));
    }
    // a task defined no more (its plugin uninstalled) still shows the history it left
    if scheduler.definition(&input.task_id).is_err()
        && (capstan_store::validate_id(&input.task_id).is_err() || model::read_task(scheduler.store(), &input.task_id).await?.is_none())
    {
        return Err(task_not_found(&input.task_id));
    }
    let (executions, next_cursor) = model::list_executions(scheduler.store(), &input.task_id, input.cursor.as_deref(), limit).await?;
    Ok(ExecutionPage { executions, next_cursor })
}

async fn get_execution(scheduler: Arc<Scheduler>, _: Call, input: ExecutionRef) -> Result<Execution> {
    model::read_execution(scheduler.store(), &input.id).await?.ok_or_else(|| model::execution_not_found(&input.id))
}

async fn trigger(scheduler: Arc<Scheduler>, call: Call, input: TaskRef) -> Result<Execution> {
    let user = call.identity()?.user_id.clone();
    scheduler.trigger(&input.id, &user).await
}

async fn cancel(scheduler: Arc<Scheduler>, call: Call, input: CancelInput) -> Result<Execution> {
    let user = call.identity()?.user_id.clone();
    scheduler.cancel(&input.execution_id, &user).await
}

async fn set_enabled(scheduler: Arc<Scheduler>, call: Call, input: SetEnabledInput) -> Result<TaskView> {
    let user = call.identity()?.user_id.clone();
    let record = scheduler.set_enabled(&input.id, input.enabled, &user).await?;
    Ok(view(&scheduler.definition(&input.id)?, Some(&record), now_ms()))
}

/// Register the `tasks.*` methods, for administrators only.
pub fn register(registry: &mut Registry, scheduler: Arc<Scheduler>) {
    let mut registry = registry.with(scheduler);
    registry.add("tasks.list", "Every task: schedule, enabled, next run, last execution", Access::Admin, list).read_only();
    registry.add("tasks.get", "One task with its newest executions", Access::Admin, get).refuses(&["task-not-found"]).read_only();
    registry
        .add("tasks.listExecutions", "A task's executions, newest first, paged by cursor", Access::Admin, list_executions)
        .refuses(&["task-not-found"])
        .read_only();
    registry
        .add("tasks.getExecution", "One execution: status, times, node, error and log tail", Access::Admin, get_execution)
        .refuses(&["execution-not-found"])
        .read_only();
    registry
        .add(
            "tasks.trigger",
            "Run an enabled task now on this node; answers the running execution (refuses task-running, task-disabled)",
            Access::Admin,
            trigger,
        )
        .refuses(&["task-not-found", "task-disabled", "task-running"]);
    registry
        .add(
            "tasks.cancel",
            "Ask a running execution to stop; it ends cancelled within about a second (refuses execution-not-running)",
            Access::Admin,
            cancel,
        )
        .refuses(&["execution-not-found", "execution-not-running"]);
    registry
        .add(
            "tasks.setEnabled",
            "Enable or disable a task; a disabled task runs neither on schedule nor by hand",
            Access::Admin,
            set_enabled,
        )
        .refuses(&["task-not-found"]);
}
