//! `capstan call` against a running host: every listed method reachable by name, host and
//! plugin alike, with help from the host's own schemas.

use crate::support::*;
use serde_json::Value;
use std::process::{Command, Stdio};

#[test]
fn any_listed_method_is_called_by_name_with_help_from_its_schema() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let token = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let config = dir.path().join("config");
    let run = |args: &[&str]| cli(&server, &token, &config, &[&["call"], args].concat());
    let ok = |args: &[&str]| {
        let exited = run(args);
        assert!(exited.status.success(), "capstan call {}: {exited:?}", args.join(" "));
        exited.stdout
    };

    // the listing is the host's: its methods and the App Store's, once that plugin is loaded
    // the embedded App Store installs in the background: its methods are listed once it runs
    crate::appstore::wait_for_appstore(&server, &token);
    let listed = ok(&["--list"]);
    assert!(listed.contains("appstore.listApps"), "{listed}");
    assert!(listed.starts_with("METHOD") && listed.contains("services.create") && listed.contains("owner"), "{listed}");
    let methods: Value = serde_json::from_str(ok(&["--list", "--json"]).trim()).unwrap();
    assert!(methods.as_array().unwrap().iter().any(|m| m["name"] == "auth.whoami"), "{methods}");

    // help comes from the input schema
    let help = ok(&["services.create", "--help"]);
    assert!(help.starts_with("services.create  (owner)"), "{help}");
    assert!(help.contains("organizationId") && help.contains("required"), "{help}");

    // a body from --set, from an argument and from standard input; exact JSON with --json
    let made: Value = serde_json::from_str(ok(&["organizations.create", "--set", "name=acme", "--json"]).trim()).unwrap();
    assert_eq!(made["name"], "acme");
    let org = made["id"].as_str().unwrap().to_string();
    let mut piped = capstan();
    piped.args(["call", "services.create", "-f", "-", "--json"]);
    piped.env("XDG_CONFIG_HOME", &config).env("CAPSTAN_URL", server.url("")).env("CAPSTAN_TOKEN", &token);
    let body = format!(r#"{{"organizationId":"{org}","name":"web","image":"nginx:1"}}"#);
    let mut child = piped.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = ok(&["services.list", &format!(r#"{{"organizationId":"{org}"}}"#)]);
    assert!(table.lines().next().unwrap().starts_with("ID") && table.contains("web"), "a list prints as a table: {table}");
    assert!(ok(&["appstore.listApps"]).contains("\"apps\""), "a plugin's method, no CLI change");

    // refusals by name, with the code first; nothing half-done
    run(&["services.lst"]).assert_refused(1, "method-unknown");
    assert!(run(&["services.lst"]).stderr.contains("services.list"), "the area's methods are named");
    run(&["organizations.create", "{nope"]).assert_refused(1, "body-invalid");
    run(&["organizations.create", "--set", "novalue"]).assert_refused(1, "set-invalid");
    run(&["organizations.get", "--set", "id=org_missing"]).assert_refused(1, "organization-not-found");
    let refused = run(&["organizations.create", "--set", "name=acme", "--json"]);
    let answer: Value = serde_json::from_str(refused.stdout.trim()).unwrap();
    assert_eq!(answer["ok"], false, "{answer}");

    // a reader that goes away early ends the command quietly (SIGPIPE), never a panic
    let mut head = Command::new("sh");
    let line = format!("'{}' call --list | head -1", env!("CARGO_BIN_EXE_capstan"));
    head.args(["-c", &line]).env("XDG_CONFIG_HOME", &config).env("CAPSTAN_URL", server.url("")).env("CAPSTAN_TOKEN", &token);
    let out = run_to_exit(head);
    assert!(out.stdout.starts_with("METHOD") && !out.stderr.contains("panicked"), "{out:?}");
}
