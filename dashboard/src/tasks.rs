//! The Tasks view at `/tasks`: every scheduled task (host and plugin) with its schedule, whether
//! it is enabled, its next run and its last execution; run by hand, disabled (after a
//! confirmation page) and enabled again. `/tasks/{id}` shows the definition and the executions,
//! newest first and paged, each with its trigger, node, error and log tail, and cancels a
//! running one. Everything goes through the `tasks.*` methods as the logged-in person
//! (administrators only, like the API: anyone else sees the method's `forbidden`).
//!
//! The scheduler writes no outbox events, so these pages cannot follow [`super::live`].
//! Instead a panel showing a running execution re-fetches itself every 2 s, and only then: the
//! `hx-trigger="every 2s"` is rendered only while something runs, so the first answer in
//! which nothing runs carries no trigger and the refreshing stops by itself.

use super::forms::{ErrorView, Flash, PAGE, Signed, call, encode, post, query_of, redirect, status_of, str_of, u64_of, when};
use super::{nav, render, rfc3339, time_left, user_view};
use crate::Host;
use crate::Viewer;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Executions per page of a task's history (the method's most is 50).
const EXECUTIONS: usize = 20;
const _: () = assert!(EXECUTIONS <= PAGE);

// ---------------------------------------------------------------------------------------
// Values

/// `2025-01-31 13:45:07 UTC` and its RFC 3339 form, from milliseconds since the epoch.
fn at_ms(ms: u64) -> (String, String) {
    let iso = rfc3339(ms);
    let shown = match (iso.get(..10), iso.get(11..19)) {
        (Some(date), Some(time)) => format!("{date} {time} UTC"),
        _ => iso.clone(),
    };
    (shown, iso)
}

/// `350 ms`, `1.2 s`, `42 s`, `3 min 5 s`, `2 h 10 min`.
pub(super) fn duration(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        1000..10_000 => format!("{}.{} s", ms / 1000, (ms % 1000) / 100),
        10_000..120_000 => format!("{} s", ms / 1000),
        120_000..7_200_000 => format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, (ms % 3_600_000) / 60_000),
    }
}

/// The pill class of an execution status.
fn status_class(status: &str) -> &'static str {
    match status {
        "succeeded" => "state-live",
        "running" => "state-info",
        "cancelled" => "state-draining",
        "failed" | "abandoned" => "state-stale",
        _ => "state-never",
    }
}

/// A task id from a link (`?task=`), shown in a banner only when it reads as one: lowercase
/// letters, digits, `.`, `-` and `_`, so a crafted link cannot put words on the page.
fn shown_task(id: Option<&str>) -> Option<String> {
    id.filter(|id| {
        !id.is_empty() && id.len() <= 200 && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    })
    .map(str::to_string)
}

// ---------------------------------------------------------------------------------------
// Views

#[derive(Serialize)]
struct LastView {
    id: String,
    status: String,
    status_class: &'static str,
    trigger: String,
    started_at: String,
    started_iso: String,
    duration: Option<String>,
}

#[derive(Serialize)]
struct TaskView {
    id: String,
    href: String,
    title: String,
    description: String,
    kind: String,
    plugin: Option<String>,
    cron: String,
    enabled: bool,
    enabled_by_default: bool,
    next_run: Option<String>,
    next_run_iso: Option<String>,
    next_run_in: Option<String>,
    running: Option<String>,
    last: Option<LastView>,
}

fn task_view(value: &Value) -> TaskView {
    let id = str_of(value, "id").to_string();
    let next = value.get("nextRunAt").and_then(Value::as_u64);
    let last = value.get("lastExecution").filter(|l| l.is_object()).map(|l| {
        let status = str_of(l, "status").to_string();
        let (started_at, started_iso) = at_ms(u64_of(l, "startedAt"));
        LastView {
            id: str_of(l, "id").into(),
            status_class: status_class(&status),
            status,
            trigger: str_of(l, "trigger").into(),
            started_at,
            started_iso,
            duration: l.get("durationMs").and_then(Value::as_u64).map(duration),
        }
    });
    TaskView {
        href: format!("/tasks/{}", encode(&id)),
        id,
        title: str_of(value, "title").into(),
        description: str_of(value, "description").into(),
        kind: str_of(value, "kind").into(),
        plugin: value.get("plugin").and_then(Value::as_str).map(str::to_string),
        cron: str_of(value, "cron").into(),
        enabled: value.get("enabled").and_then(Value::as_bool).unwrap_or(false),
        enabled_by_default: value.get("enabledByDefault").and_then(Value::as_bool).unwrap_or(true),
        next_run: next.map(|ms| when(ms).0),
        next_run_iso: next.map(|ms| when(ms).1),
        next_run_in: next.map(time_left),
        running: value.get("runningExecutionId").and_then(Value::as_str).map(str::to_string),
        last,
    }
}

#[derive(Serialize)]
struct ExecutionView {
    id: String,
    status: String,
    status_class: &'static str,
    running: bool,
    trigger: String,
    triggered_by: Option<String>,
    /// Triggered by the person looking.
    by_you: bool,
    started_at: String,
    started_iso: String,
    ended_at: Option<String>,
    ended_iso: Option<String>,
    /// The end's time of day when it ended the day it started, else the whole date.
    ended_short: Option<String>,
    /// How long it took, or (running) how long it has run so far.
    duration: String,
    node_id: String,
    error_code: Option<String>,
    error_message: Option<String>,
    log: String,
    log_lines: usize,
    log_dropped: u64,
    cancel_requested: bool,
}

fn execution_view(value: &Value, now_ms: u64, me: &str) -> ExecutionView {
    let status = str_of(value, "status").to_string();
    let started = u64_of(value, "startedAt");
    let (started_at, started_iso) = at_ms(started);
    let ended = value.get("endedAt").and_then(Value::as_u64).map(at_ms);
    let running = status == "running";
    let duration = match value.get("durationMs").and_then(Value::as_u64) {
        Some(ms) => duration(ms),
        None if running => format!("{} so far", self::duration(now_ms.saturating_sub(started))),
        None => "unknown".into(),
    };
    let log: Vec<&str> = value.get("log").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let error = value.get("error").filter(|e| e.is_object());
    let triggered_by = value.get("triggeredBy").and_then(Value::as_str).map(str::to_string);
    let ended_short = ended.as_ref().map(|(shown, _)| match (shown.get(..10), shown.get(11..)) {
        (Some(day), Some(time)) if started_at.starts_with(day) => time.to_string(),
        _ => shown.clone(),
    });
    ExecutionView {
        id: str_of(value, "id").into(),
        status_class: status_class(&status),
        running,
        status,
        trigger: str_of(value, "trigger").into(),
        by_you: triggered_by.as_deref() == Some(me),
        triggered_by,
        started_at,
        started_iso,
        ended_at: ended.as_ref().map(|e| e.0.clone()),
        ended_iso: ended.map(|e| e.1),
        ended_short,
        duration,
        node_id: str_of(value, "nodeId").into(),
        error_code: error.map(|e| str_of(e, "code").to_string()),
        error_message: error.map(|e| str_of(e, "message").trim_end_matches('.').to_string()),
        log_lines: log.len(),
        log: log.join("\n"),
        log_dropped: u64_of(value, "logDropped"),
        cancel_requested: value.get("cancelRequestedAt").and_then(Value::as_u64).is_some(),
    }
}

// ---------------------------------------------------------------------------------------
// Reading

/// The list panel's context: every task, or the refusal; `refreshing` while one runs.
async fn list_context(state: &Host, identity: &Viewer) -> minijinja::Value {
    match call(state, identity, "tasks.list", json!({})).await {
        Ok(listing) => {
            let tasks: Vec<TaskView> = listing["tasks"].as_array().into_iter().flatten().map(task_view).collect();
            let refreshing = tasks.iter().any(|t| t.running.is_some());
            context! { tasks => Serde(Some(tasks)), error => Serde(None::<ErrorView>), refreshing }
        }
        Err(refusal) => {
            context! { tasks => Serde(None::<Vec<TaskView>>), error => Serde(Some(ErrorView::from(&refusal))), refreshing => false }
        }
    }
}

/// The detail panel's context: the task and one page of its executions (or why not);
/// `refreshing` while an execution of it runs. Also the task, or the status its refusal
/// answers with.
async fn detail_context(
    state: &Host,
    identity: &Viewer,
    id: &str,
    cursor: Option<&str>,
) -> (minijinja::Value, std::result::Result<TaskView, StatusCode>) {
    let here = cursor.map(|c| format!("?cursor={}", encode(c))).unwrap_or_default();
    let panel_href = format!("/tasks/{}/panel{here}", encode(id));
    let base = format!("/tasks/{}", encode(id));
    let task = match call(state, identity, "tasks.get", json!({ "id": id })).await {
        Ok(task) => task_view(&task),
        Err(refusal) => {
            let ctx = context! { task => Serde(None::<TaskView>), error => Serde(Some(ErrorView::from(&refusal))), refreshing => false, panel_href };
            return (ctx, Err(status_of(&refusal)));
        }
    };
    let mut body = json!({ "taskId": id, "limit": EXECUTIONS });
    if let Some(cursor) = cursor {
        body["cursor"] = json!(cursor);
    }
    let (executions, executions_error, next) = match call(state, identity, "tasks.listExecutions", body).await {
        Ok(page) => {
            let now = capstan_core::clock::now_ms();
            let executions: Vec<ExecutionView> =
                page["executions"].as_array().into_iter().flatten().map(|e| execution_view(e, now, &identity.user_id)).collect();
            let next = page["nextCursor"].as_str().map(|c| format!("{base}?cursor={}", encode(c)));
            (Some(executions), None, next)
        }
        Err(refusal) => (None, Some(ErrorView::from(&refusal)), None),
    };
    let refreshing = task.running.is_some() || executions.iter().flatten().any(|e| e.running);
    let ctx = context! {
        task => Serde(Some(&task)),
        error => Serde(None::<ErrorView>),
        executions => Serde(executions),
        executions_error => Serde(executions_error),
        next,
        newest => cursor.map(|_| base.clone()),
        refreshing,
        panel_href,
    };
    (ctx, Ok(task))
}

// ---------------------------------------------------------------------------------------
// The list page

#[derive(Deserialize, Default)]
pub(super) struct ListQuery {
    done: Option<String>,
    task: Option<String>,
}

/// The banner of a finished action, named after the task when the link names one.
fn done_flash(done: Option<&str>, task: Option<&str>) -> Option<Flash> {
    let named = |what: &str| match task {
        Some(task) => format!("Task {task} {what}"),
        None => format!("Task {what}"),
    };
    match done? {
        "disabled" => {
            Some(Flash::done(named("disabled"), "It no longer runs on schedule, and Run now is refused until it is enabled again."))
        }
        "enabled" => Some(Flash::done(named("enabled"), "It runs on its schedule again, and can be run by hand.")),
        "started" => {
            Some(Flash::done(named("started"), "It runs on this node now; the executions below update every 2 seconds until it ends."))
        }
        "cancel-requested" => {
            Some(Flash::done("Cancellation requested", "The node running it stops it within about a second and records it cancelled."))
        }
        _ => None,
    }
}

async fn list_page(state: &Host, identity: &Viewer, status: StatusCode, flash: Option<Flash>) -> Response {
    let ctx = context! {
        page => "Tasks",
        nav => Serde(nav(state, "tasks")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        ..list_context(state, identity).await
    };
    render(status, "tasks.html", ctx)
}

/// `GET /tasks`: every task, with its actions.
pub(super) async fn page(State(state): State<Host>, Signed(identity): Signed, uri: Uri) -> Response {
    let query: ListQuery = query_of(&uri).unwrap_or_default();
    let flash = done_flash(query.done.as_deref(), shown_task(query.task.as_deref()).as_deref());
    list_page(&state, &identity, StatusCode::OK, flash).await
}

/// `GET /tasks/panel`: the list alone, for htmx (asked for only while a task runs).
pub(super) async fn panel(State(state): State<Host>, Signed(identity): Signed) -> Response {
    render(StatusCode::OK, "tasks_panel.html", list_context(&state, &identity).await)
}

// ---------------------------------------------------------------------------------------
// The detail page

#[derive(Deserialize, Default)]
pub(super) struct DetailQuery {
    cursor: Option<String>,
    done: Option<String>,
}

async fn detail_page(
    state: &Host,
    identity: &Viewer,
    id: &str,
    cursor: Option<&str>,
    status: StatusCode,
    flash: Option<Flash>,
) -> Response {
    let (panel, task) = detail_context(state, identity, id, cursor).await;
    // the page of a task that cannot be read answers like the method did
    let status = match (&task, status) {
        (Err(refused), StatusCode::OK) => *refused,
        _ => status,
    };
    let task = task.ok();
    let ctx = context! {
        page => task.as_ref().map(|t| format!("Task {}", t.id)).unwrap_or_else(|| "Task".into()),
        nav => Serde(nav(state, "tasks")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        ..panel
    };
    render(status, "task.html", ctx)
}

/// `GET /tasks/{id}?cursor=`: the definition, its executions, its actions.
pub(super) async fn detail(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let query: DetailQuery = query_of(&uri).unwrap_or_default();
    let flash = done_flash(query.done.as_deref(), None);
    detail_page(&state, &identity, &id, query.cursor.as_deref(), StatusCode::OK, flash).await
}

/// `GET /tasks/{id}/panel?cursor=`: the task and its executions alone, for htmx (asked for
/// only while one of them runs).
pub(super) async fn detail_panel(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let query: DetailQuery = query_of(&uri).unwrap_or_default();
    render(StatusCode::OK, "task_panel.html", detail_context(&state, &identity, &id, query.cursor.as_deref()).await.0)
}

// ---------------------------------------------------------------------------------------
// Actions

/// Where a refused action is shown again: the page its form was on (`from`).
async fn refused_page(state: &Host, identity: &Viewer, id: &str, from: &str, status: StatusCode, flash: Flash) -> Response {
    if from == "list" {
        list_page(state, identity, status, Some(flash)).await
    } else {
        detail_page(state, identity, id, None, status, Some(flash)).await
    }
}

/// Where a finished action goes: back to the page its form was on, with its banner.
fn done_location(id: &str, from: &str, done: &str) -> String {
    if from == "list" { format!("/tasks?done={done}&task={}", encode(id)) } else { format!("/tasks/{}?done={done}", encode(id)) }
}

/// `POST /tasks/{id}/run` (`from`): run the task now; its page then shows the execution.
pub(super) async fn run(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    match call(&state, &identity, "tasks.trigger", json!({ "id": id })).await {
        Ok(_) => redirect(&format!("/tasks/{}?done=started", encode(&id))),
        Err(refusal) => {
            let after = match refusal.code.as_ref() {
                "task-disabled" => "Enable it first to run it.",
                "task-running" => "Wait for the running execution to end, or cancel it on the task's page.",
                _ => "Nothing was started.",
            };
            let flash = Flash::refused(&format!("Task {} was not started", shown_task(Some(&id)).unwrap_or_default()), &refusal, after);
            refused_page(&state, &identity, &id, form.text("from"), status_of(&refusal), flash).await
        }
    }
}

/// `GET /tasks/{id}/disable`: the confirmation step.
pub(super) async fn confirm_disable(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    #[derive(Deserialize, Default)]
    struct Query {
        from: Option<String>,
    }
    let from = query_of::<Query>(&uri).unwrap_or_default().from.filter(|f| f == "list").unwrap_or_else(|| "task".into());
    confirm_page(&state, &identity, &id, &from, StatusCode::OK, None).await
}

async fn confirm_page(state: &Host, identity: &Viewer, id: &str, from: &str, status: StatusCode, flash: Option<Flash>) -> Response {
    let read = call(state, identity, "tasks.get", json!({ "id": id })).await;
    let (task, error, status) = match &read {
        Ok(value) => (Some(task_view(value)), None, status),
        Err(refusal) => (None, Some(ErrorView::from(refusal)), if status == StatusCode::OK { status_of(refusal) } else { status }),
    };
    let back = if from == "list" { "/tasks".to_string() } else { format!("/tasks/{}", encode(id)) };
    let confirm = task.as_ref().map(|t| {
        let mut consequences = vec![
            match &t.next_run {
                Some(next) => format!("It no longer runs on its schedule ({}, UTC); its next run would have been {next}.", t.cron),
                None => format!("It no longer runs on its schedule ({}, UTC).", t.cron),
            },
            "Run now is refused (task-disabled) until it is enabled again.".to_string(),
            "Its history stays, and enabling it later resumes the schedule; missed runs are not caught up.".to_string(),
        ];
        if let Some(running) = &t.running {
            consequences.push(format!(
                "The execution running now ({running}) is not stopped by this: cancel it on the task's page if it should stop."
            ));
        }
        context! { id => t.id.clone(), title => t.title.clone(), action => format!("/tasks/{}/disable", encode(id)), from, consequences }
    });
    let ctx = context! {
        page => task.as_ref().map(|t| format!("Disable task {}", t.id)).unwrap_or_else(|| "Disable task".into()),
        nav => Serde(nav(state, "tasks")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(error),
        back,
        confirm,
    };
    render(status, "task_disable.html", ctx)
}

/// `POST /tasks/{id}/disable` (`from`): disable the task (after its confirmation page).
pub(super) async fn disable(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    set_enabled(state, id, request, false).await
}

/// `POST /tasks/{id}/enable` (`from`).
pub(super) async fn enable(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    set_enabled(state, id, request, true).await
}

async fn set_enabled(state: Host, id: String, request: Request, enabled: bool) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let from = form.text("from");
    match call(&state, &identity, "tasks.setEnabled", json!({ "id": id, "enabled": enabled })).await {
        Ok(_) => redirect(&done_location(&id, from, if enabled { "enabled" } else { "disabled" })),
        Err(refusal) if enabled => {
            let flash = Flash::refused("The task was not enabled", &refusal, "Nothing was changed.");
            refused_page(&state, &identity, &id, from, status_of(&refusal), flash).await
        }
        Err(refusal) => {
            let flash = Flash::refused("The task was not disabled", &refusal, "Nothing was changed.");
            confirm_page(&state, &identity, &id, from, status_of(&refusal), Some(flash)).await
        }
    }
}

/// `POST /tasks/{id}/cancel` (`executionId`): ask a running execution to stop.
pub(super) async fn cancel(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    match call(&state, &identity, "tasks.cancel", json!({ "executionId": form.text("executionId") })).await {
        Ok(_) => redirect(&format!("/tasks/{}?done=cancel-requested", encode(&id))),
        Err(refusal) => {
            let after = if refusal.is("execution-not-running") { "It ended before the request arrived." } else { "Nothing was changed." };
            let flash = Flash::refused("The execution was not cancelled", &refusal, after);
            detail_page(&state, &identity, &id, None, status_of(&refusal), Some(flash)).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_ids_read_plainly() {
        assert_eq!(duration(0), "0 ms");
        assert_eq!(duration(999), "999 ms");
        assert_eq!(duration(1_250), "1.2 s");
        assert_eq!(duration(42_000), "42 s");
        assert_eq!(duration(185_000), "3 min 5 s");
        assert_eq!(duration(7_800_000), "2 h 10 min");
        assert_eq!(at_ms(1_700_000_007_000).0, "2023-11-14 22:13:27 UTC");
        assert_eq!(shown_task(Some("host.cleanup")).as_deref(), Some("host.cleanup"));
        assert_eq!(shown_task(Some("plugin.mail.rotate-keys")).as_deref(), Some("plugin.mail.rotate-keys"));
        assert_eq!(shown_task(Some("Pay now")), None);
        assert_eq!(shown_task(Some("")), None);
        assert_eq!(status_class("failed"), "state-stale");
        let run = json!({"id": "e1", "status": "succeeded", "trigger": "manual", "triggeredBy": "user_1", "startedAt": 1_700_000_000_000u64,
            "endedAt": 1_700_000_001_500u64, "durationMs": 1_500, "nodeId": "n1", "log": ["a", "b"], "logDropped": 3});
        let view = execution_view(&run, 0, "user_1");
        assert_eq!((view.ended_short.as_deref(), view.duration.as_str(), view.by_you), (Some("22:13:21 UTC"), "1.5 s", true));
        assert_eq!((view.log.as_str(), view.log_lines, view.log_dropped), ("a\nb", 2, 3));
        let running = json!({"id": "e2", "status": "running", "trigger": "schedule", "startedAt": 1_000, "nodeId": "n1", "log": []});
        let view = execution_view(&running, 43_000, "user_1");
        assert_eq!((view.running, view.duration.as_str(), view.ended_short, view.by_you), (true, "42 s so far", None, false));
    }
}
