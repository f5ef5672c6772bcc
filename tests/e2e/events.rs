//! Inventory events reach a subscribed plugin in commit order, once each, across a restart;
//! and a service a plugin holds is deleted in two phases: marked `deleting`, then finished
//! once the plugin released it on `service.deleting`.
//!
//! The subscriber is the workspace's example plugin (it subscribes to `service.*`, holds every
//! service it hears of and releases it on `service.deleting`), built, signed and installed
//! through the CLI exactly as an operator would.

use super::plugins::{BUILD_TIMEOUT, COMMAND_TIMEOUT, assert_ok, run, wasm_target_available, workspace};
use super::support::*;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

/// How long event delivery may take to show (the plugin work loop runs every few seconds).
const DELIVERY: Duration = Duration::from_secs(60);

/// The example's event log: (sequence, kind, subject) in arrival order.
fn event_log(server: &Capstan, token: &str) -> Result<Vec<(u64, String, String)>, String> {
    let reply = server.call_as(token, "example.eventLog", &json!({}));
    if reply.status != 200 {
        return Err(format!("HTTP {}: {}", reply.status, reply.body));
    }
    let body = reply.json();
    let events = body["events"].as_array().ok_or_else(|| format!("no events in {body}"))?;
    Ok(events
        .iter()
        .map(|e| (e["sequence"].as_u64().unwrap_or(0), e["kind"].as_str().unwrap_or("").into(), e["subject"].as_str().unwrap_or("").into()))
        .collect())
}

/// Wait until the log holds exactly `expected` (kind, subject) pairs, and check the sequences
/// only ever increase (committed order, no duplicate).
fn wait_for_log(server: &Capstan, token: &str, expected: &[(String, String)]) -> Vec<(u64, String, String)> {
    eventually("the example plugin's event log", DELIVERY, || {
        let log = event_log(server, token)?;
        let seen: Vec<(String, String)> = log.iter().map(|(_, k, s)| (k.clone(), s.clone())).collect();
        if seen.as_slice() != expected {
            return Err(format!("have {seen:?}\nwant {expected:?}"));
        }
        Ok(log)
    })
}

fn create_service(server: &Capstan, token: &str, org: &str, name: &str) -> Value {
    server.call_as(token, "services.create", &json!({"name": name, "organizationId": org, "image": "nginx:1.27"})).expect_json(200)
}

#[test]
fn inventory_events_reach_a_plugin_in_commit_order_once_each_across_a_restart() {
    if !wasm_target_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
    let config_home = root.join("config");
    let plugin_target = crate::plugins::plugin_target("events");
    let cli = |args: &[&str], input: &[u8], timeout: Duration| {
        let mut cmd = capstan();
        cmd.args(args).env("XDG_CONFIG_HOME", &config_home).env("CARGO_TARGET_DIR", &plugin_target).current_dir(workspace());
        run(cmd, input, timeout)
    };
    let key = root.join("key.pem");
    let keygen = cli(&["plugin", "keygen", "--out", key.to_str().unwrap()], b"", COMMAND_TIMEOUT);
    assert_ok("capstan plugin keygen", &keygen);
    let example = workspace().join("plugins/example");
    let args = ["plugin", "build", example.to_str().unwrap(), "--key", key.to_str().unwrap(), "--out-dir", root.to_str().unwrap()];
    let built = cli(&args, b"", BUILD_TIMEOUT);
    assert_ok("capstan plugin build plugins/example", &built);
    let bundle = built.stdout.trim().lines().last().unwrap_or_default().to_string();
    assert_eq!(PathBuf::from(&bundle), root.join("example-0.1.0.capstan-plugin"), "the bundle goes to --out-dir");

    let data = root.join("data");
    let start = || {
        let mut serve = dev_command(&data);
        serve.env("CAPSTAN_TRUSTED_PUBLISHERS", keygen.stdout.trim());
        Capstan::start(serve)
    };
    let server = start();
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let url = server.url("");
    let login =
        cli(&["login", "--url", &url, "--username", "admin", "--password-stdin"], format!("{password}\n").as_bytes(), COMMAND_TIMEOUT);
    assert_ok("capstan login", &login);
    let installed = cli(&["plugin", "install", &bundle, "--approve", "all-requested", "--url", &url], b"", COMMAND_TIMEOUT);
    assert_ok("capstan plugin install", &installed);
    let token = server.login("admin", &password);

    // ---- changes commit, events arrive in that order ----
    let org = server.call_as(&token, "organizations.create", &json!({"name": "acme"})).expect_json(200);
    let org = org["id"].as_str().unwrap().to_string();
    let web = create_service(&server, &token, &org, "web");
    let api = create_service(&server, &token, &org, "api");
    let (web_id, api_id) = (web["id"].as_str().unwrap().to_string(), api["id"].as_str().unwrap().to_string());
    server.call_as(&token, "services.update", &json!({"id": web_id, "expectedRevision": web["revision"], "scale": 2})).expect_json(200);
    let mut expected: Vec<(String, String)> = vec![
        ("service.created".into(), web_id.clone()),
        ("service.created".into(), api_id.clone()),
        ("service.updated".into(), web_id.clone()),
    ];
    wait_for_log(&server, &token, &expected);

    // ---- two-phase deletion: the plugin holds the service until it saw service.deleting ----
    let current = server.call_as(&token, "services.get", &json!({"id": api_id})).expect_json(200);
    assert_eq!(current["holds"], json!(["plugin:example"]), "the plugin holds what it heard of: {current}");
    let deleting =
        server.call_as(&token, "services.delete", &json!({"id": api_id, "expectedRevision": current["revision"]})).expect_json(200);
    assert_eq!((deleting["state"].as_str(), deleting["waitingFor"].clone()), (Some("deleting"), json!(["plugin:example"])), "{deleting}");
    let refused = server.call_as(
        &token,
        "services.update",
        &json!({"id": api_id, "expectedRevision": current["revision"].as_u64().unwrap() + 1, "scale": 3}),
    );
    refused.expect_error(400, "service-deleting");
    eventually("the released service is deleted", DELIVERY, || {
        let reply = server.call_as(&token, "services.get", &json!({"id": api_id}));
        if reply.status == 404 { Ok(()) } else { Err(format!("HTTP {}: {}", reply.status, reply.body)) }
    });
    expected.push(("service.deleting".into(), api_id.clone()));
    expected.push(("service.deleted".into(), api_id.clone()));
    let before_restart = wait_for_log(&server, &token, &expected);

    // ---- a restart resumes from the plugin's cursor: nothing again, nothing lost ----
    let exited = server.stop();
    assert!(exited.status.success(), "SIGTERM stops capstan cleanly; stderr:\n{}", exited.stderr);
    let server = start();
    let token = server.login("admin", &password);
    let db = create_service(&server, &token, &org, "db");
    let db_id = db["id"].as_str().unwrap().to_string();
    expected.push(("service.created".into(), db_id.clone()));
    let after_restart = wait_for_log(&server, &token, &expected);
    assert_eq!(&after_restart[..before_restart.len()], before_restart.as_slice(), "the log before the restart stays as it was");
    let sequences: Vec<u64> = after_restart.iter().map(|(s, _, _)| *s).collect();
    assert!(sequences.windows(2).all(|w| w[0] < w[1]), "each event once, in commit order: {sequences:?}");

    // ---- the plugin's faces, with no host change: its setting, its pages, capstan call ----
    plugin_faces(&server, &token, &password, &cli);
    let exited = server.stop();
    assert!(exited.status.success(), "stderr:\n{}", exited.stderr);
}

/// Run `capstan` with arguments, standard input and a timeout.
type Cli<'a> = dyn Fn(&[&str], &[u8], Duration) -> Exited + 'a;

/// The example plugin's setting, its templated and generated pages and a form, as an operator
/// meets them in the dashboard and the CLI.
fn plugin_faces(server: &Capstan, token: &str, password: &str, cli: &Cli<'_>) {
    let cookie = format!("capstan_session={token}");
    let page = |path: &str| server.request("GET", path, &[("cookie", &cookie), ("accept", "text/html")], None);
    let first = page("/p/example");
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(first.body.contains(r#"data-templated="true""#), "the bundle's template renders it: {}", first.body);
    assert!(first.body.contains(r#"<h2 id="example-welcome">Notes kept by the example plugin.</h2>"#), "{}", first.body);
    assert!(first.body.contains(r#"id="form-putNote""#), "its form: {}", first.body);
    assert!(first.body.contains(r#"href="&#x2f;p&#x2f;example&#x2f;notes""#), "the navigation lists its pages: {}", first.body);

    // a form posts to the plugin's method; a refusal comes back by name with what was typed
    let post = |fields: &str| {
        let headers =
            [("cookie", cookie.as_str()), ("sec-fetch-site", "same-origin"), ("content-type", "application/x-www-form-urlencoded")];
        server.request("POST", "/p/example/-/call/putNote", &headers, Some(fields.as_bytes()))
    };
    let refused = post("_page=&id=n-1&text=again&expectedRevision=7");
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(refused.body.contains(r#"id="flash" data-code="conflict""#) && refused.body.contains(r#"value="again""#), "{}", refused.body);
    let written = post("_page=notes&id=n-1&text=from+the+dashboard");
    assert!([200, 303].contains(&written.status), "{}", written.body);
    let notes = page("/p/example/notes");
    assert!(
        notes.body.contains(r#"data-templated="false""#) && notes.body.contains("<table class=\"table plugin-table\">"),
        "{}",
        notes.body
    );
    assert!(notes.body.contains("from the dashboard"), "the generated table shows the note: {}", notes.body);
    assert_eq!(page("/p/example/nothing").status, 404);
    assert_eq!(page("/p/nobody").status, 404);

    // its setting: refused by name off its schema, read back by the plugin when set
    let url = server.url("");
    let login =
        cli(&["login", "--url", &url, "--username", "admin", "--password-stdin"], format!("{password}\n").as_bytes(), COMMAND_TIMEOUT);
    assert_ok("capstan login", &login);
    let bad = cli(&["settings", "set", "example.welcome=", "--url", &url], b"", COMMAND_TIMEOUT);
    assert!(!bad.status.success() && bad.stderr.contains("setting-invalid"), "{}", bad.stderr);
    let set = cli(&["settings", "set", "example.welcome=Welcome, operators", "--url", &url], b"", COMMAND_TIMEOUT);
    assert_ok("capstan settings set example.welcome", &set);
    assert!(page("/p/example").body.contains(">Welcome, operators</h2>"));
    let called = cli(&["call", "example.overview", "--json", "--url", &url], b"", COMMAND_TIMEOUT);
    assert_ok("capstan call example.overview", &called);
    let overview: Value = serde_json::from_str(&called.stdout).unwrap();
    assert_eq!((overview["welcome"].as_str(), overview["notes"].as_u64()), (Some("Welcome, operators"), Some(1)));
    let help = cli(&["call", "example.putNote", "--help", "--url", &url], b"", COMMAND_TIMEOUT);
    assert_ok("capstan call example.putNote --help", &help);
    assert!(help.stdout.contains("expectedRevision"), "{}", help.stdout);
}
