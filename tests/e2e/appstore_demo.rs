//! `capstan serve --dev --demo`: a newcomer's host with an organization, a cluster, a few
//! services and an App Store holding a catalog of real self-hosted apps, signed by a key of that
//! host; a second start adds nothing; `--demo` without `--dev` is refused by name.

use crate::appstore::wait_for_appstore;
use crate::support::{Capstan, dev_command, eventually, run_to_exit};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

/// Organizations named `demo`, the demo organization's services (names, sorted) and the App Store's apps (ids, sorted).
fn demo_state(server: &Capstan, admin: &str) -> (usize, Vec<String>, Vec<String>, Value) {
    let ok = |method: &str, body: Value| server.call_as(admin, method, &body).expect_json(200);
    let orgs = ok("organizations.list", json!({}));
    let demo: Vec<&Value> = orgs["items"].as_array().unwrap().iter().filter(|o| o["name"] == "demo").collect();
    let org_id = demo.first().map(|o| o["id"].clone()).unwrap_or(Value::Null);
    let mut services: Vec<String> = ok("services.list", json!({ "organizationId": org_id }))["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    services.sort();
    let listed = ok("appstore.listApps", json!({}));
    let mut apps: Vec<String> = listed["apps"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_string()).collect();
    apps.sort();
    (demo.len(), services, apps, listed["status"].clone())
}

#[test]
fn serve_dev_demo_installs_an_app_store_with_apps_once_and_demo_alone_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = tmp.path().join("data");

    // ---- --demo without --dev: refused by name before anything is opened ----
    let mut cmd = crate::support::capstan();
    cmd.args(["serve", "--demo", "--listen", "127.0.0.1:0"]).current_dir(tmp.path());
    let exited = run_to_exit(cmd);
    let stderr = exited.assert_refused(2, "demo-requires-dev");
    assert!(stderr.contains("--dev"), "{stderr}");

    // ---- the first --dev --demo start ----
    let mut cmd = dev_command(&data);
    cmd.arg("--demo");
    let server = Capstan::start(cmd);
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let admin = server.login("admin", &password);
    wait_for_appstore(&server, &admin);
    let (orgs, services, apps, status) = eventually("the demo installed", Duration::from_secs(240), || {
        let state = demo_state(&server, &admin);
        if state.1.len() == 4 && state.2.len() == 6 { Ok(state) } else { Err(format!("{state:?}")) }
    });
    assert_eq!(orgs, 1);
    assert_eq!(services, ["cache", "git", "status", "website"]);
    assert_eq!(apps, ["gitea", "plausible", "postgresql", "redis", "uptime-kuma", "vaultwarden"]);
    assert_eq!((status["active"]["source"].as_str(), status["active"]["revision"].as_u64()), (Some("demo"), Some(1)), "{status}");
    // the demo's signer is this host's own: no operator-trusted key names it
    let settings = server.call_as(&admin, "settings.get", &json!({})).expect_json(200);
    assert!(!settings.to_string().contains(status["active"]["signer"].as_str().unwrap()), "{settings}");
    let clusters = server.call_as(&admin, "clusters.list", &json!({})).expect_json(200);
    assert!(clusters["items"].as_array().unwrap().iter().any(|c| c["name"] == "demo-cluster"), "{clusters}");
    // installed from the catalog at older versions: the upgrades have something to show
    let org_id = server.call_as(&admin, "organizations.list", &json!({})).expect_json(200)["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "demo")
        .unwrap()["id"]
        .clone();
    let upgradeable = server.call_as(&admin, "appstore.listUpgradeable", &json!({ "organizationId": org_id })).expect_json(200);
    let mut names: Vec<&str> = upgradeable.as_array().unwrap().iter().map(|u| u["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["cache", "git"], "{upgradeable}");
    server.wait_for_stderr("demo installed");
    // the demo's writes went through the API's door: audited under the installer's name, as an
    // administrator's calls over HTTP are
    let mut audited: Vec<Value> = Vec::new();
    let mut cursor = Value::Null;
    loop {
        let page =
            server.call_as(&admin, "audit.list", &json!({ "actor": "demo-installer", "limit": 200, "cursor": cursor })).expect_json(200);
        audited.extend(page["records"].as_array().unwrap().iter().cloned());
        cursor = page["nextCursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    let methods: std::collections::BTreeSet<&str> = audited.iter().map(|r| r["method"].as_str().unwrap()).collect();
    for method in ["organizations.create", "clusters.create", "services.create", "appstore.installDemo"] {
        assert!(methods.contains(method), "{method} is audited: {audited:?}");
    }
    // reads leave nothing: the demo's listing of the apps (and this test's) is not in the log
    let reads = server.call_as(&admin, "audit.list", &json!({ "method": "appstore.listApps" })).expect_json(200);
    assert_eq!(reads["records"], json!([]), "{reads}");
    let organization = audited.iter().find(|r| r["method"] == "organizations.create").unwrap();
    assert_eq!(organization["outcome"], "ok", "{organization}");
    assert!(organization["targets"].as_array().unwrap().contains(&org_id), "{organization}");
    drop(server);

    // ---- a second start with --demo adds nothing ----
    let mut cmd = dev_command(&data);
    cmd.arg("--demo");
    let server = Capstan::start(cmd);
    let admin = server.login("admin", &password);
    eventually("the demo run again", Duration::from_secs(180), || {
        if server.stderr().contains("demo installed") { Ok(()) } else { Err("not yet".into()) }
    });
    let (orgs, services, apps, status) = demo_state(&server, &admin);
    assert_eq!((orgs, services.len(), apps.len()), (1, 4, 6), "{services:?} {apps:?}");
    assert_eq!(status["active"]["revision"].as_u64(), Some(1));
    let clusters = server.call_as(&admin, "clusters.list", &json!({})).expect_json(200);
    assert_eq!(clusters["items"].as_array().unwrap().iter().filter(|c| c["name"] == "demo-cluster").count(), 1, "{clusters}");
    drop(server);

    // ---- without the flag nothing is installed, and what was stays ----
    let server = Capstan::dev(&data);
    let admin = server.login("admin", &password);
    assert_eq!(demo_state(&server, &admin).2.len(), 6);
    assert!(!server.stderr().contains("demo installed"));
}
