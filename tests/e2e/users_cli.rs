//! `capstan users …`, `capstan publishers …` and the offline `capstan admin reset-password`, end
//! to end: the real binary as a client of `capstan serve --dev`, and (for the offline reset) on
//! the dev host's own store and keyring. A person created, listed, disabled (login refused),
//! enabled, given a generated password (their session ends, the old password stops working) and
//! their sessions revoked; refusals by name; publishers added, listed with their names and
//! removed; a lost administrator password recovered without the server, never a password in the
//! server's output.

use crate::support::{Capstan, Exited, TEST_ADMIN, capstan, cli, dev_command, json_of, run_to_exit, succeeded, with_test_admin};
use serde_json::{Value, json};
use std::path::Path;

/// The `password: …` line a reset or a creation prints.
fn printed_password(stdout: &str) -> String {
    stdout.lines().find_map(|l| l.strip_prefix("password: ")).unwrap_or_else(|| panic!("a password line in:\n{stdout}")).to_string()
}

fn whoami(server: &Capstan, token: &str) -> u16 {
    server.call_as(token, "auth.whoami", &json!({})).status
}

fn login_status(server: &Capstan, username: &str, password: &str) -> u16 {
    server.call("auth.login", &json!({ "username": username, "password": password }).to_string()).status
}

#[test]
fn people_are_managed_from_the_cli_and_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let run = |args: &[&str]| cli(&server, &admin, &config, args);

    let created = run(&["users", "create", "pat"]);
    let first = printed_password(succeeded(&created));
    let listed = run(&["users", "list"]);
    let row = succeeded(&listed).lines().find(|l| l.starts_with("pat ")).unwrap_or_else(|| panic!("pat listed:\n{}", listed.stdout));
    assert!(row.contains(" no ") && !row.contains(" yes "), "pat: not an administrator, not disabled: {row}");
    let people = json_of(&run(&["users", "list", "--json"]));
    let pat = people["users"].as_array().unwrap().iter().find(|p| p["username"] == "pat").cloned().unwrap();
    let pat_id = pat["userId"].as_str().unwrap();

    // disabled: the session ends and a login is refused like any wrong password
    let session = server.login("pat", &first);
    let disabled = run(&["users", "disable", "pat"]);
    assert!(succeeded(&disabled).contains("disabled pat"), "{}", disabled.stdout);
    assert_eq!(whoami(&server, &session), 401);
    assert_eq!(login_status(&server, "pat", &first), 401);
    // named by id as well as by username
    assert!(succeeded(&run(&["users", "enable", pat_id])).contains("enabled pat"));
    let session = server.login("pat", &first);

    // a generated password, once; the old password and the session end
    let reset = run(&["users", "reset-password", "pat"]);
    let second = printed_password(succeeded(&reset));
    assert_ne!(first, second);
    assert_eq!(whoami(&server, &session), 401);
    assert_eq!(login_status(&server, "pat", &first), 401);
    let session = server.login("pat", &second);
    let revoked = json_of(&run(&["users", "revoke-sessions", "pat", "--yes", "--json"]));
    assert_eq!((revoked["username"].as_str(), revoked["sessionsRevoked"].as_u64()), (Some("pat"), Some(1)));
    assert_eq!(whoami(&server, &session), 401);
    assert_eq!(login_status(&server, "pat", &second), 200, "revoking sessions keeps the password");

    run(&["users", "disable", "nobody"]).assert_refused(1, "user-not-found");
    run(&["users", "disable", TEST_ADMIN.0]).assert_refused(1, "user-is-self");
    // a person who is not an administrator is forbidden
    let pat_token = server.login("pat", &second);
    cli(&server, &pat_token, &config, &["users", "list"]).assert_refused(1, "forbidden");
    let refusal = json_of_refusal(&cli(&server, &pat_token, &config, &["users", "list", "--json"]));
    assert_eq!(refusal["error"]["code"], "forbidden");

    // publishers: added under a name, listed with it, removed by it
    let key = dir.path().join("publisher.key");
    let keygen = run_to_exit({
        let mut cmd = capstan();
        cmd.args(["plugin", "keygen", "--out"]).arg(&key);
        cmd
    });
    let public_key = succeeded(&keygen).trim().to_string();
    assert!(succeeded(&run(&["publishers", "add", &public_key, "--name", "Acme Plugins"])).contains("Acme Plugins"));
    let listed = run(&["publishers", "list"]);
    let row = succeeded(&listed).lines().find(|l| l.starts_with("Acme Plugins")).unwrap_or_else(|| panic!("{}", listed.stdout));
    assert!(row.contains(&public_key) && row.contains("admin at "), "{row}");
    assert!(succeeded(&run(&["publishers", "remove", "Acme Plugins", "--yes"])).contains("no longer trusting"));
    run(&["publishers", "remove", "Acme Plugins", "--yes"]).assert_refused(1, "publisher-not-found");
    run(&["publishers", "add", "not-a-key", "--name", "x"]).assert_refused(1, "publisher-key-invalid");

    let output = format!("{}{}", server.stdout(), server.stderr());
    assert!(!output.contains(&first) && !output.contains(&second), "no generated password in the server's output");
}

fn json_of_refusal(exited: &Exited) -> Value {
    assert_eq!(exited.status.code(), Some(1), "stdout:\n{}\nstderr:\n{}", exited.stdout, exited.stderr);
    serde_json::from_str(exited.stdout.trim()).expect("one line of JSON")
}

/// `capstan admin reset-password --dev --data-dir DATA ARGS`.
fn offline_reset(data: &Path, args: &[&str]) -> Exited {
    let mut cmd = capstan();
    cmd.args(["admin", "reset-password", "--dev", "--data-dir"]).arg(data).args(args);
    run_to_exit(cmd)
}

#[test]
fn a_lost_administrator_password_is_reset_offline_with_the_store_and_the_keyring() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Capstan::start(with_test_admin(dev_command(&data)));
    let session = server.login(TEST_ADMIN.0, TEST_ADMIN.1);

    // while the host runs: it shares the store, and the sessions end at once
    let reset = offline_reset(&data, &["--username", TEST_ADMIN.0]);
    let password = printed_password(succeeded(&reset));
    assert!(reset.stdout.contains("1 session(s) ended"), "{}", reset.stdout);
    assert_eq!(whoami(&server, &session), 401);
    assert_eq!(login_status(&server, TEST_ADMIN.0, TEST_ADMIN.1), 401);
    let fresh = server.login(TEST_ADMIN.0, &password);
    assert_eq!(whoami(&server, &fresh), 200);

    let as_json = offline_reset(&data, &["--username", TEST_ADMIN.0, "--json"]);
    let answer = json_of(&as_json);
    assert_eq!((answer["ok"].as_bool(), answer["reset"]["username"].as_str()), (Some(true), Some(TEST_ADMIN.0)));
    assert!(answer["reset"]["password"].as_str().is_some_and(|p| p.len() >= 20 && p != password));

    offline_reset(&data, &["--username", "nobody"]).assert_refused(1, "user-not-found");
    // nothing invented: no store, or a keyring that is not the host's
    offline_reset(&dir.path().join("elsewhere"), &["--username", TEST_ADMIN.0]).assert_refused(1, "store-not-found");
    let server_output = format!("{}{}", server.stdout(), server.stderr());
    assert!(!server_output.contains(&password), "the password is printed by the command only");
    drop(server);

    let other = dir.path().join("other");
    Capstan::start(dev_command(&other)).stop();
    std::fs::copy(data.join("keyring.json"), other.join("keyring.json")).unwrap();
    let wrong = offline_reset(&other, &["--username", TEST_ADMIN.0]);
    assert_eq!(wrong.status.code(), Some(1), "{}\n{}", wrong.stdout, wrong.stderr);
    assert!(!wrong.stdout.contains("password:"), "{}", wrong.stdout);
    assert!(
        ["kek-unavailable", "material-not-readable"].iter().any(|code| wrong.stderr.contains(&format!("refused ({code})"))),
        "another host's keyring is refused by name: {}",
        wrong.stderr
    );
}
