//! The audit log through the real binary: a scenario of mutations (an organization and a
//! service created, a refused settings change and a refused login carrying a planted password,
//! a plugin method, a call over the socket, a person created) and reads, then `audit.list`
//! holds exactly the mutations — newest first, with who, the ids, the outcome and the request
//! id, never a body value — pages, filters, refuses anyone but an administrator, and
//! `capstan audit list` shows the same.

use crate::support::*;
use serde_json::{Value, json};

/// A password planted in bodies: it must appear in no audit answer.
const PLANTED: &str = "planted-Secret-7d1e0c";

/// What a record says, for comparing with the scenario: method, outcome, actor's name, plugin,
/// targets (sorted), request id.
type Seen = (String, String, Option<String>, Option<String>, Vec<String>, String);

fn seen(record: &Value) -> Seen {
    let text = |v: &Value| v.as_str().map(str::to_string);
    let mut targets: Vec<String> = record["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    targets.sort();
    (
        text(&record["method"]).unwrap(),
        text(&record["outcome"]).unwrap(),
        text(&record["actor"]["username"]),
        text(&record["plugin"]),
        targets,
        text(&record["requestId"]).unwrap_or_default(),
    )
}

/// Every record matching `filters`, page by page (`limit` per page).
fn all_pages(server: &Capstan, admin: &str, filters: Value, limit: u64) -> Vec<Value> {
    let (mut records, mut cursor) = (Vec::new(), None::<String>);
    for _ in 0..100 {
        let mut body = filters.clone();
        body["limit"] = json!(limit);
        if let Some(cursor) = &cursor {
            body["cursor"] = json!(cursor);
        }
        let page = server.call_as(admin, "audit.list", &body).expect_json(200);
        let got = page["records"].as_array().unwrap();
        assert!(got.len() as u64 <= limit, "a page holds at most its limit: {page}");
        records.extend(got.iter().cloned());
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return records,
        }
    }
    panic!("audit.list never ended its pages")
}

#[test]
fn the_audit_log_holds_exactly_the_mutations_of_a_scenario_and_no_body_value() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let mut expected: Vec<Seen> = Vec::new();
    let record = |method: &str, outcome: &str, actor: Option<&str>, targets: &[&str], reply: &Reply| -> Seen {
        let mut targets: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
        targets.sort();
        (method.into(), outcome.into(), actor.map(str::to_string), None, targets, reply.request_id.clone().unwrap())
    };

    // a login is a mutation (a session); its caller is anonymous until it answers
    let login = server.call("auth.login", &json!({ "username": TEST_ADMIN.0, "password": TEST_ADMIN.1 }).to_string());
    let answer = login.expect_json(200);
    let admin = answer["token"].as_str().unwrap().to_string();
    let admin_id = answer["userId"].as_str().unwrap().to_string();
    expected.push(record("auth.login", "ok", None, &[&admin_id], &login));

    let created = server.call_as(&admin, "organizations.create", &json!({ "name": "audit-org" }));
    let org = created.expect_json(200)["id"].as_str().unwrap().to_string();
    expected.push(record("organizations.create", "ok", Some("admin"), &[&org], &created));

    let service = json!({ "name": "audit-web", "organizationId": org, "image": "nginx:1.27" });
    let created = server.call_as(&admin, "services.create", &service);
    let svc = created.expect_json(200)["id"].as_str().unwrap().to_string();
    expected.push(record("services.create", "ok", Some("admin"), &[&org, &svc], &created));

    // reads are not recorded
    server.call_as(&admin, "organizations.list", &json!({})).expect_json(200);
    server.call_as(&admin, "services.get", &json!({ "id": svc })).expect_json(200);
    server.call_as(&admin, "settings.get", &json!({})).expect_json(200);

    // refused mutations, each carrying the planted password
    let refused = server.call_as(&admin, "settings.update", &json!({ "expectedRevision": 0, "set": { "smtpPassword": PLANTED } }));
    refused.expect_error(400, "setting-is-secret");
    expected.push(record("settings.update", "setting-is-secret", Some("admin"), &[], &refused));
    let refused = server.call("auth.login", &json!({ "username": "admin", "password": PLANTED }).to_string());
    assert_eq!(refused.status, 401, "{}", refused.body);
    expected.push(record("auth.login", "unauthenticated", None, &[], &refused));
    // an unknown field is refused before the method runs: recorded, the value not kept
    let refused = server.call_as(&admin, "organizations.create", &json!({ "name": "x", "note": PLANTED }));
    refused.expect_error(400, "invalid-request");
    expected.push(record("organizations.create", "invalid-request", Some("admin"), &[], &refused));

    // a plugin method: recorded unless its plugin declares it a read (the App Store declares its
    // reads: getCatalogStatus leaves no record, refreshCatalog does)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while server.call_as(&admin, "plugins.get", &json!({ "id": "appstore" })).json()["status"] != "running" {
        assert!(std::time::Instant::now() < deadline, "the App Store was not installed within 180 s");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    server.call_as(&admin, "appstore.getCatalogStatus", &json!({})).expect_json(200);
    let called = server.call_as(&admin, "appstore.refreshCatalog", &json!({}));
    let outcome = if called.status == 200 { "ok".to_string() } else { called.json()["error"]["code"].as_str().unwrap_or("?").to_string() };
    let mut plugin_call = record("appstore.refreshCatalog", &outcome, Some("admin"), &[], &called);
    plugin_call.3 = Some("appstore".into());
    expected.push(plugin_call);

    // over the socket: the same dispatcher, the same record (with the frame's request id)
    let (mut ws, _) = crate::socket::open(&server, "cli", Some(&admin));
    let answer = crate::socket::call(&mut ws, 1, "organizations.create", json!({ "name": "socket-org" }));
    let socket_org = answer["result"]["id"].as_str().unwrap_or_else(|| panic!("{answer}")).to_string();
    let request_id = answer["requestId"].as_str().unwrap().to_string();
    expected.push(("organizations.create".into(), "ok".into(), Some("admin".into()), None, vec![socket_org], request_id));
    drop(ws);

    // a person who is no administrator
    let made = server.call_as(&admin, "admin.createUser", &json!({ "username": "auditee" }));
    let person = made.expect_json(200);
    let (person_id, password) = (person["userId"].as_str().unwrap().to_string(), person["password"].as_str().unwrap().to_string());
    expected.push(record("admin.createUser", "ok", Some("admin"), &[&person_id], &made));
    let login = server.call("auth.login", &json!({ "username": "auditee", "password": password }).to_string());
    let auditee = login.expect_json(200)["token"].as_str().unwrap().to_string();
    // a login names who logged in (the host's answer, not the caller's body)
    expected.push(record("auth.login", "ok", None, &[&person_id], &login));
    // denied the log, and the denial of a read is no record
    server.call_as(&auditee, "audit.list", &json!({})).expect_error(403, "forbidden");
    let refused = server.call_as(&auditee, "organizations.create", &json!({ "name": "not-mine" }));
    refused.expect_error(403, "forbidden");
    expected.push(record("organizations.create", "forbidden", Some("auditee"), &[], &refused));
    server.call("audit.list", "{}").expect_error(401, "unauthenticated");

    // the log: exactly the scenario's mutations, newest first
    expected.reverse();
    let first = server.call_as(&admin, "audit.list", &json!({})).expect_json(200);
    let records = first["records"].as_array().unwrap().clone();
    assert!(first["nextCursor"].is_null(), "{first}");
    let got: Vec<Seen> = records.iter().map(seen).collect();
    assert_eq!(got, expected, "the audit log:\n{first:#}");
    for r in &records {
        assert!(r["at"].as_u64().unwrap() > 1_700_000_000_000, "{r}");
        assert_eq!(r["source"], "127.0.0.1", "{r}");
        let kind = if r["actor"]["username"].is_null() { "anonymous" } else { "human" };
        assert_eq!(r["actor"]["kind"], kind, "{r}");
    }
    let admin_id = server.call_as(&admin, "auth.whoami", &json!({})).expect_json(200)["userId"].clone();
    for r in records.iter().filter(|r| r["actor"]["username"] == "admin") {
        assert_eq!(r["actor"]["userId"], admin_id, "{r}");
    }
    // no body value: neither the planted password nor a name the scenario typed
    let answer = first.to_string();
    for value in [PLANTED, "audit-org", "audit-web", "socket-org", "nginx", "smtpPassword", "not-mine"] {
        assert!(!answer.contains(value), "{value:?} is in the audit answer: {answer}");
    }

    // pages of two hold the same records, in the same order
    assert_eq!(all_pages(&server, &admin, json!({}), 2), records);

    // filters
    let methods = |filters: Value| -> Vec<String> {
        all_pages(&server, &admin, filters, 50).iter().map(|r| r["method"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(methods(json!({ "method": "organizations.create" })).len(), 4);
    assert_eq!(methods(json!({ "outcome": "refused" })).len(), 4);
    assert_eq!(methods(json!({ "outcome": "setting-is-secret" })), ["settings.update"]);
    assert_eq!(methods(json!({ "actor": "auditee" })), ["organizations.create"]);
    assert_eq!(methods(json!({ "actor": person_id })), ["organizations.create"]);
    assert_eq!(methods(json!({ "target": org })), ["services.create", "organizations.create"]);
    assert_eq!(methods(json!({ "method": "organizations.create", "outcome": "ok" })).len(), 2);
    let newest = records[0]["at"].as_u64().unwrap();
    assert!(methods(json!({ "since": newest + 60_000 })).is_empty());
    assert_eq!(methods(json!({ "until": records.last().unwrap()["at"].as_u64().unwrap() - 1 })), Vec::<String>::new());
    server.call_as(&admin, "audit.list", &json!({ "limit": 0 })).expect_error(400, "invalid-request");
    server.call_as(&admin, "audit.list", &json!({ "cursor": "not a cursor" })).expect_error(400, "invalid-request");

    // the CLI shows the same
    let cli = |args: &[&str]| {
        let mut cmd = capstan();
        cmd.args(args).env("CAPSTAN_URL", server.url("")).env("CAPSTAN_TOKEN", &admin).env("XDG_CONFIG_HOME", dir.path().join("config"));
        let exited = run_to_exit(cmd);
        assert!(exited.status.success(), "capstan {args:?}:\n{}\n{}", exited.stdout, exited.stderr);
        exited
    };
    let listed: Value = serde_json::from_str(cli(&["audit", "list", "--json"]).stdout.trim()).unwrap();
    assert_eq!(listed["records"].as_array().unwrap().iter().map(seen).collect::<Vec<_>>(), expected);
    let table = cli(&["audit", "list", "--method", "services.create"]).stdout;
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{table}");
    assert!(rows[0].contains("services.create") && rows[0].contains("admin (human)") && rows[0].contains(&svc), "{table}");
    let paged = cli(&["audit", "list", "--outcome", "ok", "--limit", "1"]);
    assert!(paged.stderr.contains("--cursor"), "the next page is named: {}", paged.stderr);

    let log = server.stop().stderr;
    assert!(!log.contains(PLANTED), "the planted password is in the server's log");
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
}

/// The same log on MongoDB (the stand-in named by `CAPSTAN_TEST_MONGODB_URL`): records in time
/// order, newest first, filtered and paged as on SQLite. Skipped, saying so, without it.
#[test]
fn the_audit_log_is_kept_and_paged_on_mongodb_too() {
    let Some(url) = crate::mongo::mongo_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let prod = ProdConfig::under(dir.path());
    let command = crate::mongo::mongo_command(&prod, dir.path(), &url, &crate::mongo::fresh_database());
    let server = Capstan::start(with_test_admin(command));
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let org = server.call_as(&admin, "organizations.create", &json!({ "name": "mongo-audit" })).expect_json(200)["id"].clone();
    server.call_as(&admin, "organizations.create", &json!({ "name": "mongo-audit", "note": PLANTED })).expect_error(400, "invalid-request");
    server.call_as(&admin, "organizations.list", &json!({})).expect_json(200);

    let records = all_pages(&server, &admin, json!({}), 1);
    let got: Vec<(&str, &str)> = records.iter().map(|r| (r["method"].as_str().unwrap(), r["outcome"].as_str().unwrap())).collect();
    assert_eq!(got, [("organizations.create", "invalid-request"), ("organizations.create", "ok"), ("auth.login", "ok")]);
    assert_eq!(records[1]["targets"], json!([org]));
    let filtered = all_pages(&server, &admin, json!({ "method": "organizations.create", "outcome": "ok" }), 50);
    assert_eq!(filtered, records[1..2]);
    assert!(!serde_json::to_string(&records).unwrap().contains(PLANTED));
    let exited = server.stop();
    assert!(!exited.stderr.contains(PLANTED) && !exited.stderr.contains("panicked"), "{}", exited.stderr);
}
