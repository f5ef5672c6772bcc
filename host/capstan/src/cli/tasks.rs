//! `capstan tasks list | get | trigger | cancel | enable | disable | executions | execution`:
//! clients of the `tasks.*` API of a running host.
//!
//! With `--json` each prints the API's answer exactly (one line); refusals print
//! `{"ok":false,"error":{…}}` and exit 1.

use super::client::{Client, Connection, finish, print_json, print_table, text, utc};
use super::resolve;
use crate::refusal::Result;
use clap::Subcommand;
use serde_json::{Value, json};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Subcommand)]
pub enum TasksCommand {
    /// Every task: id, enabled, schedule (cron, UTC), next run, last execution (`tasks.list`).
    ///
    /// Host tasks are named `host.<name>`; tasks a plugin declares `plugin.<pluginId>.<name>`.
    List(ListArgs),
    /// One task: what it does, its schedule, next run and newest executions (`tasks.get`).
    Get(IdArgs),
    /// Run an enabled task now, on the node that takes the request (`tasks.trigger`).
    ///
    /// Prints the new execution's id at once; the run goes on in the background (see
    /// `capstan tasks execution <id>`), or with --wait until it ends. Refuses `task-disabled`,
    /// `task-running` (one run at a time; the refusal names the running execution) and
    /// `task-not-found`.
    Trigger(TriggerArgs),
    /// Ask a running execution to stop (`tasks.cancel`); it ends `cancelled` within about a
    /// second. Refuses `execution-not-running` for one that already ended.
    Cancel(ExecutionArgs),
    /// Let a task run again, on schedule and by hand (`tasks.setEnabled`).
    Enable(IdArgs),
    /// Stop a task from running, on schedule and by hand (`tasks.setEnabled`). A run in
    /// progress goes on; cancel it to stop it.
    Disable(IdArgs),
    /// A task's executions, newest first (`tasks.listExecutions`).
    Executions(ExecutionsArgs),
    /// One execution: status, trigger, times, node, error and its log tail (`tasks.getExecution`).
    Execution(ExecutionArgs),
}

#[derive(clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct IdArgs {
    /// The task: its id (host.cleanup), the last part of it (cleanup) or its title
    id: String,
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct TriggerArgs {
    /// The task: its id (host.cleanup), the last part of it (cleanup) or its title
    id: String,
    /// Wait until the run ends and show how; exit 1 unless it succeeded
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON (with --wait: the ended execution)
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ExecutionArgs {
    /// The execution id (`tasks trigger` and `tasks executions` print it)
    execution_id: String,
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ExecutionsArgs {
    /// The task: its id (host.cleanup), the last part of it (cleanup) or its title
    id: String,
    /// How many executions (1 to 50)
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Continue after this page (the `next page:` value a previous call printed)
    #[arg(long, value_name = "CURSOR")]
    cursor: Option<String>,
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

/// How often `trigger --wait` asks how the run is going.
const WAIT_POLL: Duration = Duration::from_millis(500);

pub fn run(command: TasksCommand) -> ExitCode {
    let (result, json) = match command {
        TasksCommand::List(args) => (list(&args), args.json),
        TasksCommand::Get(args) => (get(&args), args.json),
        TasksCommand::Trigger(args) => (trigger(&args), args.json),
        TasksCommand::Cancel(args) => (cancel(&args), args.json),
        TasksCommand::Enable(args) => (set_enabled(&args, true), args.json),
        TasksCommand::Disable(args) => (set_enabled(&args, false), args.json),
        TasksCommand::Executions(args) => (executions(&args), args.json),
        TasksCommand::Execution(args) => (execution(&args), args.json),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(refusal) => finish(Err(refusal), json),
    }
}

/// A duration in milliseconds, for people.
fn duration(ms: Option<u64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 1000 => format!("{ms} ms"),
        Some(ms) if ms < 60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        Some(ms) => format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

fn last_run(task: &Value) -> String {
    if let Some(id) = task["runningExecutionId"].as_str() {
        return format!("running ({id})");
    }
    match task["lastExecution"].as_object() {
        Some(last) => format!(
            "{} {} ({})",
            last.get("status").and_then(Value::as_str).unwrap_or("?"),
            utc(last.get("startedAt").and_then(Value::as_u64)),
            duration(last.get("durationMs").and_then(Value::as_u64))
        ),
        None => "never".into(),
    }
}

fn next_run(task: &Value) -> String {
    match task["nextRunAt"].as_u64() {
        Some(at) => utc(Some(at)),
        None if task["enabled"] == false => "disabled".into(),
        None => "-".into(),
    }
}

fn list(args: &ListArgs) -> Result<bool> {
    let answer = Client::new(&args.connection)?.call("tasks.list", &json!({}))?;
    if args.json {
        print_json(&answer);
        return Ok(true);
    }
    let tasks = answer["tasks"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                text(t, "id").to_string(),
                if t["enabled"] == true { "yes".into() } else { "no".into() },
                text(t, "cron").to_string(),
                next_run(t),
                last_run(t),
                text(t, "title").to_string(),
            ]
        })
        .collect();
    print_table(&["ID", "ENABLED", "SCHEDULE (UTC)", "NEXT RUN", "LAST RUN", "TITLE"], &rows);
    Ok(true)
}

fn execution_rows(executions: &[Value]) -> Vec<Vec<String>> {
    executions
        .iter()
        .map(|e| {
            vec![
                text(e, "id").to_string(),
                text(e, "status").to_string(),
                text(e, "trigger").to_string(),
                utc(e["startedAt"].as_u64()),
                duration(e["durationMs"].as_u64()),
                text(e, "nodeId").to_string(),
                e["error"]["code"].as_str().unwrap_or("").to_string(),
            ]
        })
        .collect()
}

const EXECUTION_HEADER: [&str; 7] = ["EXECUTION", "STATUS", "TRIGGER", "STARTED", "DURATION", "NODE", "ERROR"];

fn get(args: &IdArgs) -> Result<bool> {
    let client = Client::new(&args.connection)?;
    let t = client.call("tasks.get", &json!({ "id": resolve::task(&client, &args.id)? }))?;
    if args.json {
        print_json(&t);
        return Ok(true);
    }
    println!("task:      {} ({})", text(&t, "id"), text(&t, "title"));
    if let Some(description) = t["description"].as_str().filter(|d| !d.is_empty()) {
        println!("           {description}");
    }
    match t["plugin"].as_str() {
        Some(plugin) => println!("kind:      plugin task of {plugin}"),
        None => println!("kind:      host task"),
    }
    let default = if t["enabledByDefault"] == true { "enabled" } else { "disabled" };
    println!("enabled:   {} (by default {default})", if t["enabled"] == true { "yes" } else { "no" });
    println!("schedule:  {} (cron, UTC)", text(&t, "cron"));
    println!("next run:  {}", next_run(&t));
    println!("last run:  {}", last_run(&t));
    let recent = t["recentExecutions"].as_array().cloned().unwrap_or_default();
    if !recent.is_empty() {
        println!();
        print_table(&EXECUTION_HEADER, &execution_rows(&recent));
    }
    Ok(true)
}

fn print_execution(e: &Value) {
    println!("execution: {}", text(e, "id"));
    println!("task:      {}", text(e, "taskId"));
    println!("status:    {}", text(e, "status"));
    match e["triggeredBy"].as_str() {
        Some(by) => println!("trigger:   {} by {by}", text(e, "trigger")),
        None => println!("trigger:   {}", text(e, "trigger")),
    }
    println!("node:      {}", text(e, "nodeId"));
    println!("started:   {}", utc(e["startedAt"].as_u64()));
    if let Some(ended) = e["endedAt"].as_u64() {
        println!("ended:     {} ({})", utc(Some(ended)), duration(e["durationMs"].as_u64()));
    }
    if let Some(at) = e["cancelRequestedAt"].as_u64() {
        println!("cancel:    requested by {} at {}", text(e, "cancelRequestedBy"), utc(Some(at)));
    }
    if let Some(code) = e["error"]["code"].as_str() {
        println!("error:     {code}: {}", e["error"]["message"].as_str().unwrap_or(""));
    }
    let log = e["log"].as_array().cloned().unwrap_or_default();
    if !log.is_empty() {
        match e["logDropped"].as_u64().unwrap_or(0) {
            0 => println!("log:"),
            dropped => println!("log ({dropped} older lines dropped):"),
        }
        for line in log {
            println!("  {}", line.as_str().unwrap_or(""));
        }
    }
}

fn trigger(args: &TriggerArgs) -> Result<bool> {
    let client = Client::new(&args.connection)?;
    let mut e = client.call("tasks.trigger", &json!({ "id": resolve::task(&client, &args.id)? }))?;
    if !args.wait {
        if args.json {
            print_json(&e);
        } else {
            println!("started {} of {} on node {}", text(&e, "id"), text(&e, "taskId"), text(&e, "nodeId"));
            println!("  follow it with: capstan tasks execution {}", text(&e, "id"));
        }
        return Ok(true);
    }
    if !args.json {
        eprintln!("started {} of {}; waiting for it to end (Ctrl-C stops waiting, not the run)", text(&e, "id"), text(&e, "taskId"));
    }
    let id = text(&e, "id").to_string();
    while e["status"] == "running" {
        std::thread::sleep(WAIT_POLL);
        e = client.call("tasks.getExecution", &json!({ "id": id }))?;
    }
    if args.json {
        print_json(&e);
    } else {
        print_execution(&e);
    }
    Ok(e["status"] == "succeeded")
}

fn cancel(args: &ExecutionArgs) -> Result<bool> {
    let e = Client::new(&args.connection)?.call("tasks.cancel", &json!({ "executionId": args.execution_id }))?;
    if args.json {
        print_json(&e);
    } else {
        println!("asked {} of {} to stop; it ends cancelled within about a second", text(&e, "id"), text(&e, "taskId"));
    }
    Ok(true)
}

fn set_enabled(args: &IdArgs, enabled: bool) -> Result<bool> {
    let client = Client::new(&args.connection)?;
    let t = client.call("tasks.setEnabled", &json!({ "id": resolve::task(&client, &args.id)?, "enabled": enabled }))?;
    if args.json {
        print_json(&t);
    } else if enabled {
        println!("enabled {}; next run {}", text(&t, "id"), next_run(&t));
    } else {
        println!("disabled {}; it runs neither on schedule nor by hand until enabled", text(&t, "id"));
    }
    Ok(true)
}

fn executions(args: &ExecutionsArgs) -> Result<bool> {
    let client = Client::new(&args.connection)?;
    let id = resolve::task(&client, &args.id)?;
    let mut body = json!({ "taskId": id, "limit": args.limit });
    if let Some(cursor) = &args.cursor {
        body["cursor"] = json!(cursor);
    }
    let page = client.call("tasks.listExecutions", &body)?;
    if args.json {
        print_json(&page);
        return Ok(true);
    }
    let executions = page["executions"].as_array().cloned().unwrap_or_default();
    if executions.is_empty() {
        println!("{id} has no executions recorded");
        return Ok(true);
    }
    print_table(&EXECUTION_HEADER, &execution_rows(&executions));
    if let Some(next) = page["nextCursor"].as_str() {
        println!("next page: capstan tasks executions {id} --cursor {next}");
    }
    Ok(true)
}

fn execution(args: &ExecutionArgs) -> Result<bool> {
    let e = Client::new(&args.connection)?.call("tasks.getExecution", &json!({ "id": args.execution_id }))?;
    if args.json {
        print_json(&e);
    } else {
        print_execution(&e);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_runs_read_for_people() {
        assert_eq!(duration(Some(850)), "850 ms");
        assert_eq!(duration(Some(12_345)), "12.3 s");
        assert_eq!(duration(Some(303_000)), "5 min 3 s");
        assert_eq!(duration(None), "-");
        assert_eq!(last_run(&json!({ "runningExecutionId": "e1" })), "running (e1)");
        assert_eq!(last_run(&json!({})), "never");
        assert_eq!(
            last_run(&json!({ "lastExecution": { "status": "succeeded", "startedAt": 0, "durationMs": 5 } })),
            "succeeded 1970-01-01 00:00:00 UTC (5 ms)"
        );
        assert_eq!(next_run(&json!({ "enabled": false, "nextRunAt": null })), "disabled");
    }
}
