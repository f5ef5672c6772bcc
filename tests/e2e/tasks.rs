//! The scheduler end to end: tasks listed, `host.cleanup` run by hand and recorded with a
//! duration, disabled and refused, the refusals by name, and the CLI as an API client.

use crate::support::*;
use serde_json::{Value, json};
use std::time::Duration;

/// How long a run by hand may take to be recorded as ended (generous: a loaded CI machine).
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

fn admin_token(server: &Capstan) -> String {
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let answer = server.call("auth.login", &json!({ "username": "admin", "password": password }).to_string()).expect_json(200);
    answer["token"].as_str().expect("a session token").to_string()
}

/// Poll `tasks.getExecution` until the execution is no longer running.
fn ended(server: &Capstan, token: &str, id: &str) -> Value {
    eventually(&format!("execution {id} ending"), RUN_TIMEOUT, || {
        let e = server.call_as(token, "tasks.getExecution", &json!({ "id": id })).expect_json(200);
        if e["status"] == "running" { Err(e.to_string()) } else { Ok(e) }
    })
}

#[test]
fn tasks_run_by_hand_are_recorded_can_be_disabled_and_the_cli_drives_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::dev(dir.path());
    let token = admin_token(&server);

    // the methods are listed with their schemas, and they are for administrators
    let listing = server.get("/api/v1/methods").expect_json(200);
    let methods = listing["methods"].as_array().unwrap();
    for name in
        ["tasks.list", "tasks.get", "tasks.listExecutions", "tasks.getExecution", "tasks.trigger", "tasks.cancel", "tasks.setEnabled"]
    {
        let m = methods.iter().find(|m| m["name"] == name).unwrap_or_else(|| panic!("{name} is listed"));
        assert_eq!(m["access"], "admin", "{name}");
        assert!(m["input"].is_object() && m["output"].is_object(), "{name} has schemas");
    }
    server.call("tasks.list", "{}").expect_error(401, "unauthenticated");

    // the host's tasks
    let tasks = server.call_as(&token, "tasks.list", &json!({})).expect_json(200);
    let ids: Vec<&str> = tasks["tasks"].as_array().unwrap().iter().filter_map(|t| t["id"].as_str()).collect();
    assert!(ids.contains(&"host.cleanup") && ids.contains(&"host.reap-expired-sessions"), "{ids:?}");
    let cleanup = tasks["tasks"].as_array().unwrap().iter().find(|t| t["id"] == "host.cleanup").unwrap();
    assert_eq!((cleanup["kind"].as_str(), cleanup["enabled"].as_bool()), (Some("host"), Some(true)));
    assert!(cleanup["nextRunAt"].as_u64().is_some(), "{cleanup}");

    // run by hand: answered at once, then recorded as succeeded with a duration and its log
    let started = server.call_as(&token, "tasks.trigger", &json!({ "id": "host.cleanup" })).expect_json(200);
    assert_eq!(started["trigger"], "manual");
    let id = started["id"].as_str().unwrap().to_string();
    let done = ended(&server, &token, &id);
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(done["durationMs"].as_u64().is_some(), "{done}");
    assert!(done["log"].as_array().is_some_and(|l| !l.is_empty()), "{done}");
    let detail = server.call_as(&token, "tasks.get", &json!({ "id": "host.cleanup" })).expect_json(200);
    assert_eq!(detail["lastExecution"]["id"], id.as_str());
    assert_eq!(detail["recentExecutions"][0]["id"], id.as_str());
    let page = server.call_as(&token, "tasks.listExecutions", &json!({ "taskId": "host.cleanup", "limit": 1 })).expect_json(200);
    assert_eq!(page["executions"][0]["id"], id.as_str());

    // refusals by name
    server.call_as(&token, "tasks.cancel", &json!({ "executionId": id })).expect_error(409, "execution-not-running");
    server.call_as(&token, "tasks.cancel", &json!({ "executionId": "nope" })).expect_error(404, "execution-not-found");
    server.call_as(&token, "tasks.get", &json!({ "id": "host.nope" })).expect_error(404, "task-not-found");
    server.call_as(&token, "tasks.trigger", &json!({ "id": "host.nope" })).expect_error(404, "task-not-found");
    let strict = server.call_as(&token, "tasks.trigger", &json!({ "id": "host.cleanup", "extra": 1 })).expect_error(400, "invalid-request");
    assert_eq!(strict["data"]["field"], "extra");

    // disabled: refused by hand, and listed without a next run
    let disabled = server.call_as(&token, "tasks.setEnabled", &json!({ "id": "host.cleanup", "enabled": false })).expect_json(200);
    assert_eq!((disabled["enabled"].as_bool(), disabled["nextRunAt"].is_null()), (Some(false), true));
    server.call_as(&token, "tasks.trigger", &json!({ "id": "host.cleanup" })).expect_error(409, "task-disabled");

    // the CLI, as a client of the same API
    let config = dir.path().join("config");
    let listed = cli(&server, &token, &config, &["tasks", "list", "--json"]);
    assert!(listed.status.success(), "{listed:?}");
    let listed: Value = serde_json::from_str(listed.stdout.trim()).expect("exact JSON");
    let cleanup = listed["tasks"].as_array().unwrap().iter().find(|t| t["id"] == "host.cleanup").unwrap();
    assert_eq!(cleanup["enabled"], false);

    let refused = cli(&server, &token, &config, &["tasks", "trigger", "host.cleanup", "--json"]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let refused: Value = serde_json::from_str(refused.stdout.trim()).expect("exact JSON");
    assert_eq!((refused["ok"].as_bool(), refused["error"]["code"].as_str()), (Some(false), Some("task-disabled")));

    let enabled = cli(&server, &token, &config, &["tasks", "enable", "host.cleanup"]);
    assert!(enabled.status.success() && enabled.stdout.contains("enabled host.cleanup"), "{enabled:?}");
    let waited = cli(&server, &token, &config, &["tasks", "trigger", "host.cleanup", "--wait", "--json"]);
    assert!(waited.status.success(), "{waited:?}");
    let waited: Value = serde_json::from_str(waited.stdout.trim()).expect("exact JSON");
    assert_eq!(waited["status"], "succeeded");

    let triggered = cli(&server, &token, &config, &["tasks", "trigger", "host.reap-expired-sessions"]);
    assert!(triggered.status.success() && triggered.stdout.starts_with("started "), "{triggered:?}");
    let table = cli(&server, &token, &config, &["tasks", "list"]);
    assert!(table.status.success(), "{table:?}");
    assert!(table.stdout.starts_with("ID") && table.stdout.contains("host.reap-expired-sessions"), "{}", table.stdout);
    let history = cli(&server, &token, &config, &["tasks", "executions", "host.cleanup"]);
    assert!(history.status.success() && history.stdout.contains("succeeded"), "{history:?}");
    let help = run_to_exit({
        let mut cmd = capstan();
        cmd.args(["tasks", "trigger", "--help"]);
        cmd
    });
    assert!(help.status.success() && help.stdout.contains("task-running"), "{help:?}");
}
