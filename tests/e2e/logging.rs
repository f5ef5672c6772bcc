//! `--log-format json`: every log line is one JSON object, and request lines carry the id.

use crate::support::{Capstan, dev_command};
use serde_json::Value;

/// True when `value` holds the string `needle` anywhere (as a whole string value).
fn holds(value: &Value, needle: &str) -> bool {
    match value {
        Value::String(s) => s == needle,
        Value::Array(items) => items.iter().any(|v| holds(v, needle)),
        Value::Object(map) => map.values().any(|v| holds(v, needle)),
        _ => false,
    }
}

#[test]
fn json_logs_are_one_object_per_line_with_request_ids() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = dev_command(&dir.path().join("data"));
    cmd.args(["--log-format", "json"]);
    // every request's access line, the successful ones' (debug) too
    cmd.env("CAPSTAN_LOG", "info,capstan::access=debug");
    let server = Capstan::start(cmd);

    let ok = server.request(
        "POST",
        "/api/v1/system.getStatus",
        &[("content-type", "application/json"), ("x-request-id", "json-ok-1")],
        Some(b"{}"),
    );
    ok.expect_json(200);
    let refused =
        server.request("POST", "/api/v1/system.nope", &[("content-type", "application/json"), ("x-request-id", "json-err-2")], Some(b"{}"));
    refused.expect_error(404, "method-unknown");
    let generated = server.get("/healthz").request_id.expect("x-request-id on /healthz");
    for id in ["json-ok-1", "json-err-2", generated.as_str()] {
        server.wait_for_stderr(id);
    }

    let exited = server.stop();
    assert!(exited.status.success(), "SIGTERM should stop capstan cleanly; stderr:\n{}", exited.stderr);
    let mut lines = Vec::new();
    for line in exited.stderr.lines().filter(|l| !l.trim().is_empty()) {
        let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("every log line should be JSON ({e}), got {line:?}"));
        assert!(value.is_object(), "every log line should be a JSON object, got {line}");
        lines.push(value);
    }
    assert!(lines.iter().any(|l| l.to_string().contains("stamped")), "the start should be logged as JSON; stderr:\n{}", exited.stderr);

    for id in ["json-ok-1", "json-err-2", generated.as_str()] {
        let request_lines: Vec<&Value> = lines.iter().filter(|l| l.to_string().contains(id)).collect();
        assert!(!request_lines.is_empty(), "some log line should carry the request id {id}; stderr:\n{}", exited.stderr);
        for line in &request_lines {
            assert!(holds(line, id), "the request id {id} should be a field value of the line, got {line}");
        }
        assert!(
            request_lines.iter().any(|l| l.to_string().contains("request done")),
            "the request-done line of {id} should carry its id; lines: {request_lines:?}"
        );
    }
    let refused_line = lines.iter().find(|l| l.to_string().contains("request refused")).expect("a request refused line");
    assert!(holds(refused_line, "json-err-2"), "the refusal line should carry its request id: {refused_line}");
    assert!(holds(refused_line, "method-unknown"), "the refusal line should carry the code: {refused_line}");
}

#[test]
fn by_default_only_refused_failed_or_slow_requests_have_an_access_line() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(dev_command(&dir.path().join("data")));
    let ok = server.request(
        "POST",
        "/api/v1/system.getStatus",
        &[("content-type", "application/json"), ("x-request-id", "quiet-ok-1")],
        Some(b"{}"),
    );
    ok.expect_json(200);
    let refused =
        server.request("POST", "/api/v1/system.nope", &[("content-type", "application/json"), ("x-request-id", "loud-err-2")], Some(b"{}"));
    refused.expect_error(404, "method-unknown");
    // the refused request's lines come after the successful one's would have
    let log = server.wait_for_stderr("loud-err-2");
    let exited = server.stop();
    let log = format!("{log}{}", exited.stderr);
    assert!(
        log.lines().any(|l| l.contains("loud-err-2") && l.contains("request done")),
        "a refused request keeps its access line at info; stderr:\n{log}"
    );
    assert!(!log.contains("quiet-ok-1"), "a request that went well logs nothing at info; stderr:\n{log}");
}
