//! Commands the first-party plugins add to the `capstan` command line, through the real binary
//! against a `serve --dev --demo` host: `capstan apps list`, `capstan apps install gitea --org
//! demo`, `capstan backups create files` and `capstan backups list`, `capstan ingress status`,
//! each resolving names through the CLI's resolver and printing a table (or `-o json|yaml`); a
//! command's `--help` and its mistakes read like the host's own; a word no command knows lists
//! what the plugins add. None of it is a host change: the commands are data in the bundles.

use crate::support::{Capstan, TEST_ADMIN, cli, dev_command, eventually, json_of, ok, succeeded, with_test_admin};
use serde_json::{Value, json};
use std::time::Duration;

/// Wait until the demo is installed (the App Store catalog active).
fn demo_host(dir: &std::path::Path) -> (Capstan, String) {
    let mut cmd = with_test_admin(dev_command(&dir.join("data")));
    cmd.arg("--demo");
    let server = Capstan::start(cmd);
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    eventually("the demo installed", Duration::from_secs(180), || {
        if server.stderr().contains("demo installed") { Ok(()) } else { Err("not yet".into()) }
    });
    (server, admin)
}

/// A node enrolled into `cluster` by hand (as an agent would), so a backup has a node to run on.
fn enroll_node(server: &Capstan, admin: &str, cluster: &str) -> String {
    let code = ok(server, admin, "nodes.createJumpCommand", json!({ "clusterId": cluster, "nodeName": "files-1" }))["code"]
        .as_str()
        .unwrap()
        .to_string();
    let body = json!({ "protocol": "capstan-agent/1", "code": code, "hostname": "files-1",
        "tokenSha256": crate::support::sha256_hex(&"e1".repeat(32)), "agentVersion": "0.1.0" });
    let enrolled = server.request("POST", "/agent/v1/enroll", &[("content-type", "application/json")], Some(body.to_string().as_bytes()));
    enrolled.expect_json(200)["nodeId"].as_str().unwrap().to_string()
}

/// The line of a table that mentions `needle`.
fn line_with<'a>(table: &'a str, needle: &str) -> &'a str {
    table.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("a line with {needle:?} in:\n{table}"))
}

#[test]
fn plugins_add_commands_that_resolve_names_and_print_like_the_host_s_own() {
    let dir = tempfile::tempdir().unwrap();
    let (server, admin) = demo_host(dir.path());
    let config = dir.path().join("config");
    let run = |args: &[&str]| cli(&server, &admin, &config, args);

    // ---- discovery: --help says plugins add commands; a word nothing knows lists them ----
    let help = succeeded(&run(&["--help"])).to_string();
    assert!(help.contains("Running plugins add commands of their own"), "{help}");
    let unknown = run(&["backupz", "create"]);
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    assert!(unknown.stderr.contains("capstan: no command `backupz create`"), "{}", unknown.stderr);
    for listed in ["capstan apps install", "capstan backups create", "capstan ingress designate"] {
        assert!(unknown.stderr.contains(listed), "the plugins' commands are listed: {}", unknown.stderr);
    }
    let listing = ok(&server, &admin, "plugins.listCommands", json!({}));
    let install = listing["commands"].as_array().unwrap().iter().find(|c| c["name"] == "apps install").unwrap();
    assert_eq!((install["plugin"].as_str(), install["method"].as_str()), (Some("appstore"), Some("appstore.install")), "{install}");

    // ---- a command's --help and its mistakes, as clap words them for the host's commands ----
    let install_help = succeeded(&run(&["apps", "install", "--help"])).to_string();
    for part in ["Install an app of the catalog", "<APP>", "--org <NAME|ID>", "--cluster <NAME|ID>", "Added by the plugin appstore"] {
        assert!(install_help.contains(part), "{part}: {install_help}");
    }
    let missing = run(&["apps", "install", "gitea"]);
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert!(missing.stderr.contains("--org <NAME|ID>"), "the missing option is named: {}", missing.stderr);
    let nowhere = run(&["apps", "install", "gitea", "--org", "no-such-org"]);
    assert_eq!(nowhere.status.code(), Some(1), "{nowhere:?}");
    assert!(nowhere.stderr.contains("capstan: refused (organization-not-found)"), "{}", nowhere.stderr);

    // ---- apps: the catalog as a table, an install by names, its answer as JSON ----
    let apps = succeeded(&run(&["apps", "list"])).to_string();
    assert!(apps.starts_with("ID ") && apps.contains("NEWEST VERSION"), "{apps}");
    assert!(line_with(&apps, "gitea").contains("Gitea"), "{apps}");
    let installed =
        succeeded(&run(&["apps", "install", "gitea", "--org", "demo", "--name", "forge", "--env", "DOMAIN=git.demo.example"])).to_string();
    assert!(installed.starts_with("ID ") && line_with(&installed, "forge").contains("gitea"), "{installed}");
    let org = ok(&server, &admin, "organizations.list", json!({}))["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "demo")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let services = ok(&server, &admin, "services.list", json!({ "organizationId": org }));
    let forge = services["items"].as_array().unwrap().iter().find(|s| s["name"] == "forge").unwrap_or_else(|| panic!("{services}"));
    assert_eq!(forge["environment"]["DOMAIN"], "git.demo.example", "--env goes over the version's environment");
    // the name defaults to the app's id; -o json prints the API's answer exactly
    let answer = json_of(&run(&["apps", "install", "redis", "--org", "demo", "-o", "json"]));
    assert_eq!((answer["name"].as_str(), answer["appId"].as_str()), (Some("redis"), Some("redis")), "{answer}");

    // ---- an upgrade and its rollback by the service's name, its revision read for the person ----
    let upgraded = json_of(&run(&["apps", "upgrade", "cache", "-o", "json"]));
    assert_eq!((upgraded["from"].as_str(), upgraded["to"].as_str()), (Some("7.2.6"), Some("7.4.1")), "{upgraded}");
    let status = succeeded(&run(&["apps", "status", "cache"])).to_string();
    assert!(status.contains("UPGRADE ROLLOUT STATE") && status.contains("UPGRADE ROLLBACK TO"), "{status}");
    let row = line_with(&status, "cache");
    assert!(row.contains("7.4.1") && row.contains("7.2.6"), "the version it runs and the one a rollback returns to: {status}");
    let back = json_of(&run(&["apps", "rollback", "cache", "-o", "json"]));
    assert_eq!((back["state"].as_str(), back["to"].as_str()), (Some("rolled-back"), Some("7.2.6")), "{back}");
    let again = run(&["apps", "rollback", "cache"]);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(again.stderr.contains("capstan: refused (appstore-rollback-unavailable)"), "{}", again.stderr);

    // ---- backups: a service named alone brings its organization ----
    let cluster =
        ok(&server, &admin, "clusters.list", json!({}))["items"].as_array().unwrap().iter().find(|c| c["name"] == "demo-cluster").unwrap()
            ["id"]
            .as_str()
            .unwrap()
            .to_string();
    let node = enroll_node(&server, &admin, &cluster);
    ok(
        &server,
        &admin,
        "services.create",
        json!({ "organizationId": org, "name": "files", "image": "docker.io/library/busybox:1.36", "volumes": [{ "name": "data", "mountPath": "/data" }] }),
    );
    let created = succeeded(&run(&["backups", "create", "files"])).to_string();
    let row = line_with(&created, "files");
    assert!(created.starts_with("ID ") && created.contains("SERVICE NAME") && row.contains(&node), "{created}");
    let listed = succeeded(&run(&["backups", "list", "files", "--limit", "5"])).to_string();
    assert_eq!(listed.lines().filter(|l| l.contains("files")).count(), 1, "{listed}");
    let yaml = succeeded(&run(&["backups", "list", "files", "-o", "yaml"])).to_string();
    assert!(yaml.contains("backups:") && yaml.contains("serviceName: files"), "{yaml}");
    let refused = run(&["backups", "create", "website"]);
    assert!(refused.stderr.contains("capstan: refused (service-has-no-volumes)"), "{}", refused.stderr);

    // ---- ingress: a read by the cluster's name ----
    let status = succeeded(&run(&["ingress", "status", "demo-cluster"])).to_string();
    assert!(line_with(&status, &cluster).contains('-'), "no designation yet: {status}");

    // a plugin's command is audited as the call it makes, under the caller's name
    let audited = ok(&server, &admin, "audit.list", json!({ "method": "appstore.install", "limit": 10 }));
    let records: Vec<&Value> = audited["records"].as_array().unwrap().iter().collect();
    assert_eq!(records.len(), 2, "{audited}");
    assert!(records.iter().all(|r| r["actor"]["username"] == TEST_ADMIN.0), "{audited}");
}
