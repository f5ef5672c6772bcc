//! What an operator runs Capstan with, through the real binary: `GET /metrics` behind its token,
//! moving as a scenario's calls do; the OpenAPI 3.1 document of every listed method, valid per
//! the OpenAPI Initiative's schema; and the shell completion scripts.

use crate::support::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// A scrape token, as `CAPSTAN_METRICS_TOKEN` (at least 24 characters).
pub(crate) const SCRAPE_TOKEN: &str = "e2e-scrape-token-0123456789abcdef";

/// The official JSON Schema of OpenAPI 3.1 documents (`https://spec.openapis.org/oas/3.1/schema/2022-10-07`,
/// Apache-2.0, the OpenAPI Initiative), as the `openapi-spec-validator` 0.9.0 package ships it.
const OAS_31_SCHEMA: &str = include_str!("data/openapi-3.1-schema.json");

/// One sample line of the Prometheus text format: the metric's name, its labels, its value.
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) value: f64,
}

/// The samples of a scrape (comment lines skipped).
pub(crate) fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample line is `series value`: {line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("a sample's value is a number: {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').unwrap_or_else(|| panic!("labels end with }}: {line:?}")))),
            None => (series, BTreeMap::new()),
        };
        out.push(Sample { name: name.to_string(), labels, value });
    }
    out
}

/// `k="v",k2="v2"` (values with `\"`, `\\` and `\n` escapes).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            return labels;
        }
        assert_eq!(chars.next(), Some('"'), "a label value is quoted in {text:?}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.push(match chars.next() {
                    Some('n') => '\n',
                    Some(other) => other,
                    None => break,
                }),
                '"' => break,
                other => value.push(other),
            }
        }
        labels.insert(key.trim_start_matches(',').to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
}

/// The sum of `name`'s samples whose labels include `labels` (0 when there is none).
pub(crate) fn total(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
        .map(|s| s.value)
        .sum()
}

pub(crate) fn scrape(server: &Capstan) -> (String, Vec<Sample>) {
    let bearer = format!("Bearer {SCRAPE_TOKEN}");
    let reply = server.request("GET", "/metrics", &[("authorization", &bearer)], None);
    assert_eq!(reply.status, 200, "{}: {}", reply.what, reply.body);
    assert!(reply.content_type.as_deref().unwrap_or_default().starts_with("text/plain"), "{:?}", reply.content_type);
    let parsed = samples(&reply.body);
    (reply.body, parsed)
}

#[test]
fn metrics_answer_only_to_the_scrape_token_and_move_as_the_calls_do() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = with_test_admin(dev_command(&dir.path().join("data")));
    cmd.env("CAPSTAN_METRICS_TOKEN", SCRAPE_TOKEN);
    let server = Capstan::start(cmd);

    // refused without the token, or with another one: the uniform denial
    server.get("/metrics").expect_error(401, "unauthenticated");
    server
        .request("GET", "/metrics", &[("authorization", "Bearer e2e-scrape-token-0123456789abcdeX")], None)
        .expect_error(401, "unauthenticated");
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    server.request("GET", "/metrics", &[("authorization", &format!("Bearer {admin}"))], None).expect_error(401, "unauthenticated");
    crate::appstore::wait_for_appstore(&server, &admin);

    let whoami = [("route", "/api/v1/{method}"), ("method", "auth.whoami"), ("status", "200")];
    let unknown = [("route", "/api/v1/{method}"), ("method", "unknown"), ("status", "404")];
    let login = [("method", "auth.login"), ("status", "200")];
    let appstore = [("plugin", "appstore"), ("kind", "method"), ("outcome", "ok")];
    let (_, before) = scrape(&server);

    for _ in 0..3 {
        server.call_as(&admin, "auth.whoami", &json!({})).expect_json(200);
    }
    server.call_as(&admin, "nothing.here", &json!({})).expect_error(404, "method-unknown");
    server.call_as(&admin, "secretish.value12345", &json!({})).expect_error(404, "method-unknown");
    let again = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    server.call_as(&again, "appstore.getCatalogStatus", &json!({})).expect_json(200);
    let run = server.call_as(&admin, "tasks.trigger", &json!({ "id": "host.reap-expired-sessions" })).expect_json(200);
    let run = run["id"].as_str().unwrap().to_string();
    eventually("the task run ends", std::time::Duration::from_secs(30), || {
        let execution = server.call_as(&admin, "tasks.getExecution", &json!({ "id": run })).expect_json(200);
        if execution["status"] == "running" { Err(execution.to_string()) } else { Ok(()) }
    });
    let (text, after) = scrape(&server);

    let moved = |name: &str, labels: &[(&str, &str)]| total(&after, name, labels) - total(&before, name, labels);
    assert_eq!(moved("capstan_http_requests_total", &whoami), 3.0, "{text}");
    assert_eq!(moved("capstan_http_request_duration_seconds_count", &whoami[..2]), 3.0, "{text}");
    assert_eq!(moved("capstan_http_requests_total", &unknown), 2.0, "unknown methods collapse to one label: {text}");
    assert_eq!(moved("capstan_http_requests_total", &login), 1.0, "{text}");
    assert!(moved("capstan_plugin_calls_total", &appstore) >= 1.0, "{text}");
    assert!(moved("capstan_plugin_call_duration_seconds_count", &[("plugin", "appstore"), ("kind", "method")]) >= 1.0, "{text}");
    let committed = |access: &str| moved("capstan_store_transactions_total", &[("outcome", "committed"), ("access", access)]);
    assert!(committed("write") >= 1.0, "a login writes a session: {text}");
    assert!(committed("read") >= 1.0, "the calls read: {text}");
    assert!(total(&after, "capstan_store_transaction_duration_seconds_count", &[]) > 0.0, "{text}");
    let reaped = [("task", "host.reap-expired-sessions"), ("status", "succeeded")];
    assert_eq!(moved("capstan_scheduler_runs_total", &reaped), 1.0, "{text}");
    // the scrape before counts as a request too, under its route
    assert!(moved("capstan_http_requests_total", &[("route", "/metrics"), ("status", "200")]) >= 1.0, "{text}");

    // the gauges read at scrape time
    for kind in ["dashboard", "cli", "relay", "agent"] {
        assert!(
            after.iter().any(|s| s.name == "capstan_socket_sessions" && s.labels.get("kind").map(String::as_str) == Some(kind)),
            "{text}"
        );
    }
    for gauge in ["capstan_relay_sessions", "capstan_fleet_live_nodes", "capstan_fleet_lease_holder", "capstan_outbox_head_sequence"] {
        assert!(after.iter().any(|s| s.name == gauge), "{gauge} missing: {text}");
    }
    assert!(total(&after, "capstan_plugins_loaded", &[]) >= 1.0, "the App Store at least: {text}");
    let app = [("plugin", "appstore")];
    assert_eq!(total(&after, "capstan_plugin_instances_busy", &app), 0.0, "no call runs while scraping: {text}");
    assert!(total(&after, "capstan_plugin_instances_max", &app) >= 1.0, "{text}");
    assert!(total(&after, "capstan_plugin_instance_memory_limit_bytes", &app) >= 1048576.0, "{text}");
    // each call's instance grew its memory to some size, counted in byte buckets
    assert!(moved("capstan_plugin_instance_memory_bytes_count", &app) >= 1.0, "{text}");
    assert!(total(&after, "capstan_plugin_instance_memory_bytes_sum", &app) > 0.0, "{text}");
    assert!(after.iter().any(|s| s.name == "capstan_plugin_instance_memory_bytes_bucket" && s.labels["le"] == "1048576"), "{text}");
    // blob operations: the App Store's catalog and the fleet's records are read and written
    assert!(total(&after, "capstan_blob_operations_total", &[]) >= 1.0, "{text}");
    assert!(
        after
            .iter()
            .filter(|s| s.name == "capstan_blob_operations_total")
            .all(|s| ["put", "get", "head", "list", "delete", "probe"].contains(&s.labels["op"].as_str())
                && ["ok", "absent", "exists", "conflict", "failed"].contains(&s.labels["outcome"].as_str())),
        "{text}"
    );
    assert!(total(&after, "capstan_blob_operation_duration_seconds_count", &[("op", "get")]) >= 1.0, "{text}");
    let holder = total(&after, "capstan_fleet_lease_holder", &[]);
    assert!(holder == 0.0 || holder == 1.0, "{text}");
    assert!(total(&after, "capstan_outbox_head_sequence", &[]) >= 1.0, "installing the App Store wrote events: {text}");
    assert!(after.iter().any(|s| s.name == "capstan_outbox_consumer_lag" && s.labels["consumer"] == "plugin:appstore"), "{text}");

    // never a secret or a value a client chose
    for secret in [SCRAPE_TOKEN, TEST_ADMIN.1, admin.as_str(), again.as_str(), "secretish", "nothing.here"] {
        assert!(!text.contains(secret), "the exposition shows {secret:?}");
    }
    let methods: Vec<String> = server.listed_methods().iter().map(|m| m["name"].as_str().unwrap().to_string()).collect();
    for sample in after.iter().filter(|s| s.name.starts_with("capstan_http_request")) {
        let method = &sample.labels["method"];
        assert!(method.is_empty() || method == "unknown" || methods.contains(method), "{method} is no listed method");
    }
    drop(server);

    // without the setting, /metrics is off
    let off = Capstan::start(dev_command(&dir.path().join("data-off")));
    off.get("/metrics").expect_error(404, "metrics-disabled");
    off.request("GET", "/metrics", &[("authorization", &format!("Bearer {SCRAPE_TOKEN}"))], None).expect_error(404, "metrics-disabled");
}

#[test]
fn a_short_scrape_token_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = dev_command(&dir.path().join("data"));
    cmd.env("CAPSTAN_METRICS_TOKEN", "short-token");
    let exited = run_to_exit(cmd);
    let said = exited.assert_refused(2, "config-invalid");
    assert!(said.contains("CAPSTAN_METRICS_TOKEN") && !said.contains("short-token"), "{said}");
}

/// Every `$ref` of `doc` that points into it resolves.
fn dangling_references(doc: &Value) -> Vec<String> {
    fn walk(value: &Value, doc: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(fields) => {
                for (key, child) in fields {
                    match child {
                        Value::String(target) if key == "$ref" => {
                            let pointer = target.strip_prefix('#').unwrap_or("<not local>");
                            if doc.pointer(pointer).is_none() {
                                out.push(target.clone());
                            }
                        }
                        _ => walk(child, doc, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(item, doc, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(doc, doc, &mut out);
    out
}

#[test]
fn the_openapi_document_is_valid_and_lists_every_method() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    crate::appstore::wait_for_appstore(&server, &admin);
    crate::support::eventually("the ingress manager running", std::time::Duration::from_secs(180), || {
        let reply = server.call_as(&admin, "plugins.get", &json!({ "id": "ingress" }));
        if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
    });

    let listed = server.listed_methods();
    let doc = server.get("/api/v1/openapi.json").expect_json(200);

    // valid per the OpenAPI Initiative's schema of 3.1 documents
    let schema: Value = serde_json::from_str(OAS_31_SCHEMA).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the OpenAPI 3.1 schema compiles");
    let errors: Vec<String> = validator.iter_errors(&doc).take(20).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "the document breaks the OpenAPI 3.1 schema: {errors:#?}");
    // (the schema does judge: a document without its info, or with an answer that is no
    // response object, is refused)
    let mut broken = doc.clone();
    broken.as_object_mut().unwrap().remove("info");
    assert!(!validator.is_valid(&broken));
    let mut broken = doc.clone();
    broken["paths"]["/api/v1/auth.whoami"]["post"]["responses"]["200"] = json!("fine");
    assert!(!validator.is_valid(&broken));
    // and read by an OpenAPI 3.1 library
    let parsed = oas3::from_json(doc.to_string()).expect("oas3 reads the document");
    assert_eq!(parsed.openapi, "3.1.0");
    assert_eq!(dangling_references(&doc), Vec::<String>::new(), "every reference resolves in the document");

    // every method of /api/v1/methods is one operation, with its own schemas
    let paths = doc["paths"].as_object().unwrap();
    assert_eq!(paths.len(), listed.len(), "one path per listed method");
    assert!(listed.iter().any(|m| m["plugin"] == "appstore"), "plugin methods are listed");
    for method in &listed {
        let name = method["name"].as_str().unwrap();
        let operation = &doc["paths"][format!("/api/v1/{name}")]["post"];
        assert_eq!(operation["operationId"], name, "{name}");
        assert_eq!(operation["summary"], method["summary"], "{name}");
        assert_eq!(operation["x-capstan-access"], method["access"], "{name}");
        let input = &doc["components"]["schemas"][format!("{name}.input")];
        let output = &doc["components"]["schemas"][format!("{name}.output")];
        assert_eq!(input["properties"], rebased_like(&method["input"]["properties"], &format!("{name}.input")), "{name}");
        assert_eq!(input.get("required"), method["input"].get("required"), "{name}");
        assert_eq!(output.get("type"), method["output"].get("type"), "{name}");
        assert_eq!(operation["requestBody"]["content"]["application/json"]["schema"]["$ref"], format!("#/components/schemas/{name}.input"));
        assert_eq!(
            operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            format!("#/components/schemas/{name}.output")
        );
        assert_eq!(
            operation["responses"]["default"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ErrorEnvelope"
        );
        let security = operation["security"].as_array().unwrap();
        if method["access"] == "public" {
            assert!(security.contains(&json!({})), "{name}: a public method needs no token");
        } else {
            assert_eq!(security, &vec![json!({ "bearer": [] })], "{name}");
            assert!(operation["responses"]["401"].is_object(), "{name}");
        }
        if let Some(plugin) = method.get("plugin") {
            assert_eq!(&operation["x-capstan-plugin"], plugin, "{name}");
        }
        // each schema is itself a JSON Schema (2020-12) that compiles in the document
        for part in ["input", "output"] {
            let mut standalone = doc.clone();
            standalone["$ref"] = json!(format!("#/components/schemas/{name}.{part}"));
            jsonschema::validator_for(&standalone).unwrap_or_else(|e| panic!("{name}.{part}: {e}"));
        }
    }
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");

    // a request the document describes is answered as it says: a refusal is the envelope
    let error = server.call("auth.whoami", "{}").expect_error(401, "unauthenticated");
    let envelope = doc["components"]["schemas"]["ErrorEnvelope"].clone();
    let envelope = jsonschema::validator_for(&envelope).unwrap();
    assert!(envelope.is_valid(&json!({ "error": error })));

    // each method's refusal codes, under the status each answers and in x-capstan-refusals:
    // a host method's own (declared where it is registered), a plugin's as the host answers them
    for method in &listed {
        let name = method["name"].as_str().unwrap();
        let operation = &doc["paths"][format!("/api/v1/{name}")]["post"];
        let codes: Vec<&str> = operation["x-capstan-refusals"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        let under: Vec<String> = operation["responses"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(status, _)| *status != "200" && *status != "default")
            .flat_map(|(_, response)| refusals_named(response))
            .collect();
        let mut sorted = under.clone();
        sorted.sort();
        assert_eq!(sorted, codes, "{name}: every listed code under exactly one status");
        assert!(codes.contains(&"invalid-request"), "{name}");
    }
    let listed_under = |method: &str, status: &str| refusals_named(&doc["paths"][format!("/api/v1/{method}")]["post"]["responses"][status]);
    for (method, status, code) in [
        ("organizations.create", "409", "exists"),
        ("services.create", "409", "exists"),
        ("services.create", "404", "organization-not-found"),
        ("services.create", "400", "environment-value-is-secret"),
        ("services.update", "409", "conflict"),
        ("organizations.get", "404", "organization-not-found"),
        ("nodes.get", "404", "node-missing"),
        ("tasks.trigger", "409", "task-running"),
        ("admin.mutateHumanCredential", "409", "mutation-reused"),
        ("auth.login", "429", "rate-limited"),
        ("relays.ping", "503", "relay-not-connected"),
        ("appstore.getCatalogStatus", "409", "plugin-disabled"),
        // a code the plugin declares, under the status it declares
        ("ingress.exportBearer", "409", "ingress-not-designated"),
    ] {
        assert!(listed_under(method, status).iter().any(|c| c == code), "{method} lists {code} under {status}");
    }
    assert!(listed_under("organizations.get", "409").is_empty(), "a method lists no code it cannot answer");
    assert!(listed_under("auth.login", "401").iter().any(|c| c == "unauthenticated"), "a public method that refuses a login says so");
    let appstore = &doc["paths"]["/api/v1/appstore.getCatalogStatus"]["post"];
    assert!(appstore["responses"]["default"]["description"].as_str().unwrap().contains("without declaring them"), "{appstore}");
    // and the API answers a refusal with the status the document lists its code under
    let org = server.call_as(&admin, "organizations.create", &json!({ "name": "openapi-docs" })).expect_json(200);
    let again = server.call_as(&admin, "organizations.create", &json!({ "name": "openapi-docs" })).expect_error(409, "exists");
    assert_eq!(again["code"], "exists");
    server.call_as(&admin, "organizations.get", &json!({ "id": "org_missing" })).expect_error(404, "organization-not-found");
    assert!(org["id"].is_string());
}

/// The refusal codes a response's description names (`` `code` ``, …).
fn refusals_named(response: &Value) -> Vec<String> {
    response["description"].as_str().unwrap_or_default().split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// What the document makes of a method's schema part: local references moved into its component.
fn rebased_like(value: &Value, component: &str) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| match v {
                    Value::String(t) if k == "$ref" && t.starts_with('#') => {
                        (k.clone(), json!(format!("#/components/schemas/{component}{}", &t[1..])))
                    }
                    _ => (k.clone(), rebased_like(v, component)),
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| rebased_like(v, component)).collect()),
        other => other.clone(),
    }
}

#[test]
fn completions_are_generated_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let mut cmd = capstan();
        cmd.args(["completions", shell]);
        let exited = run_to_exit(cmd);
        assert!(exited.status.success(), "capstan completions {shell}: {exited:?}");
        assert!(exited.stdout.len() > 200 && exited.stdout.contains("capstan"), "{shell}: {}", exited.stdout);
        // the commands and their flags are in it
        assert!(exited.stdout.contains("serve") && exited.stdout.contains("completions"), "{shell}");
    }
    let mut cmd = capstan();
    cmd.args(["completions", "tcsh"]);
    let exited = run_to_exit(cmd);
    assert_eq!(exited.status.code(), Some(2), "an unknown shell is a usage error: {exited:?}");
}

/// The documented exit statuses: 0 done, 1 refused, 2 usage or configuration, 3 host unreachable
/// (a script may retry only that one), for people and with --json alike.
#[test]
fn exit_statuses_tell_refused_usage_and_unreachable_apart() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let token = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    // a port nothing listens on: bound, then released
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let run = |url: &str, args: &[&str]| {
        let mut cmd = capstan();
        cmd.args(args).env("CAPSTAN_URL", url).env("CAPSTAN_TOKEN", &token).env("XDG_CONFIG_HOME", dir.path());
        run_to_exit(cmd)
    };
    let here = server.url("");
    let nowhere = format!("http://{closed}");
    assert!(run(&here, &["organizations", "list"]).status.success());
    run(&here, &["organizations", "get", "no-such-organization"]).assert_refused(1, "organization-not-found");
    assert_eq!(run(&here, &["organizations", "frobnicate"]).status.code(), Some(2), "an unknown command is a usage mistake");
    run("ftp://example", &["organizations", "list"]).assert_refused(2, "url-invalid");
    run(&nowhere, &["organizations", "list"]).assert_refused(3, "host-unreachable");
    let json = run(&nowhere, &["organizations", "list", "--json"]);
    assert_eq!(json.status.code(), Some(3), "{json:?}");
    let answer: Value = serde_json::from_str(json.stdout.trim()).unwrap();
    assert_eq!(answer["error"]["code"], "host-unreachable", "{answer}");
}

/// Progress is drawn on a terminal only: `secrets rewrap` under a pseudo-terminal (`script`)
/// shows its spinner and clears it; in a pipe neither stream carries a trace of it.
#[test]
fn progress_is_drawn_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let token = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let rewrap = |cmd: &mut std::process::Command| {
        cmd.env("CAPSTAN_URL", server.url("")).env("CAPSTAN_TOKEN", &token).env("XDG_CONFIG_HOME", dir.path());
    };
    let mut piped = capstan();
    piped.args(["secrets", "rewrap"]);
    rewrap(&mut piped);
    let piped = run_to_exit(piped);
    assert!(piped.status.success(), "{piped:?}");
    assert!(piped.stdout.contains("done: ") && !piped.stdout.contains("re-wrapping"), "{piped:?}");
    assert!(!piped.stderr.contains('\r') && !piped.stderr.contains('\u{1b}') && !piped.stderr.contains("re-wrapping"), "{piped:?}");

    let line = format!("'{}' secrets rewrap", env!("CARGO_BIN_EXE_capstan"));
    let mut tty = std::process::Command::new("script");
    tty.args(["-qec", &line, "/dev/null"]);
    rewrap(&mut tty);
    let tty = run_to_exit(tty);
    assert!(tty.status.success(), "{tty:?}");
    assert!(tty.stdout.contains("re-wrapping the first chunk") && tty.stdout.contains("\r\u{1b}[2K"), "drawn, then cleared: {tty:?}");
    assert!(tty.stdout.contains("done: "), "{tty:?}");
}

/// `--output json|yaml|table` (`-o`) on every command that prints an answer: json is exactly
/// what `--json` prints, yaml the same answer as a YAML document; a command with no answer to
/// format, or table with --json, is a usage mistake.
#[test]
fn output_formats_print_the_same_answer() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let token = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    server.call_as(&token, "organizations.create", &json!({ "name": "acme" })).expect_json(200);
    let run = |args: &[&str]| {
        let mut cmd = capstan();
        cmd.args(args).env("CAPSTAN_URL", server.url("")).env("CAPSTAN_TOKEN", &token).env("XDG_CONFIG_HOME", dir.path());
        let exited = run_to_exit(cmd);
        assert!(exited.status.success(), "{args:?}: {exited:?}");
        exited.stdout
    };
    let json: Value = serde_json::from_str(run(&["organizations", "list", "--json"]).trim()).unwrap();
    assert_eq!(json["items"][0]["name"], "acme", "{json}");
    assert_eq!(serde_json::from_str::<Value>(run(&["organizations", "list", "--output", "json"]).trim()).unwrap(), json);
    let yaml = run(&["-o", "yaml", "organizations", "list"]);
    assert!(yaml.contains("name: acme") && !yaml.trim_start().starts_with('{'), "{yaml}");
    assert_eq!(serde_yaml_ng::from_str::<Value>(&yaml).unwrap(), json, "{yaml}");
    let table = run(&["organizations", "list", "-o", "table"]);
    assert!(table.contains("acme") && !table.contains('{'), "{table}");
    // a refusal with yaml is the same envelope as with --json
    let mut missing = capstan();
    missing.args(["organizations", "get", "nope", "-o", "yaml"]).env("CAPSTAN_URL", server.url("")).env("CAPSTAN_TOKEN", &token);
    let missing = run_to_exit(missing);
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    let refusal: Value = serde_yaml_ng::from_str(&missing.stdout).unwrap();
    assert_eq!((refusal["ok"].clone(), refusal["error"]["code"].clone()), (json!(false), json!("organization-not-found")));
    for args in [&["completions", "bash", "-o", "json"][..], &["organizations", "list", "-o", "table", "--json"]] {
        let mut cmd = capstan();
        cmd.args(args);
        assert_eq!(run_to_exit(cmd).status.code(), Some(2), "{args:?} is a usage mistake");
    }
}
