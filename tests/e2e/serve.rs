//! Starting, restarting and stopping a server: dev mode and production-style configuration.

use crate::support::{Capstan, ProdConfig, capstan, eventually, insert_doc, read_doc, read_ledger, with_test_admin};
use capstan::config::{BLOB_URL, DATA_DIR, DATABASE_URL, KEYRING_PATH, PUBLIC_ORIGIN};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;

fn target_version() -> String {
    capstan::migrate::host_chain().target().to_string()
}

/// `/status` is 200 and ready with the host's migrations done; returns the report.
fn assert_ready(server: &Capstan) -> Value {
    let status = server.get("/status").expect_json(200);
    assert_eq!(status["ready"], true, "/status should be ready: {status}");
    assert_eq!(status["store"]["ok"], true, "the store should answer: {status}");
    assert_eq!(status["blobs"]["ok"], true, "the blobs should answer: {status}");
    assert_eq!(status["migrations"]["done"], true, "migrations should be done: {status}");
    assert_eq!(status["migrations"]["chain"], "capstan", "{status}");
    assert_eq!(status["migrations"]["dataVersion"], target_version(), "the data should sit at the host target: {status}");
    status
}

/// The value printed for `var` on its `  VAR = value  (dev default)` line, if any.
fn dev_default<'a>(stdout: &'a str, var: &str) -> Option<&'a str> {
    stdout.lines().find_map(|line| line.strip_prefix(&format!("  {var} = "))?.strip_suffix("  (dev default)"))
}

#[test]
fn dev_mode_on_a_fresh_data_dir_serves_ready_and_reports_its_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Capstan::dev(&data);

    let status = assert_ready(&server);
    // where the store and the blobs are is told to administrators only
    assert!(status["store"].get("backend").is_none() && status["blobs"].get("backend").is_none(), "{status}");
    let anonymous = server.call("system.getStatus", "{}").expect_json(200);
    assert!(anonymous["store"].get("backend").is_none(), "{anonymous}");
    let admin = server.login("admin", &server.printed_admin_password().expect("the dev administrator's password"));
    let bearer = format!("Bearer {admin}");
    let detailed = server.request("GET", "/status", &[("authorization", &bearer)], None).expect_json(200);
    let store = detailed["store"]["backend"].as_str().unwrap_or_default();
    assert!(store.starts_with("sqlite:") && store.ends_with("capstan.sqlite"), "{detailed}");
    let by_method = server.call_as(&admin, "system.getStatus", &json!({})).expect_json(200);
    assert!(by_method["blobs"]["backend"].as_str().unwrap_or_default().starts_with("file:"), "{by_method}");
    // a token that does not authenticate leaves a public answer public, and is no error
    let stale = server.request("GET", "/status", &[("authorization", "Bearer stale")], None).expect_json(200);
    assert!(stale["store"].get("backend").is_none(), "{stale}");
    // the embedded App Store is reported while it loads and once it is loaded
    let plugins = eventually("the first-party plugins loaded", std::time::Duration::from_secs(60), || {
        let status = server.get("/status").json();
        let plugins = status["plugins"].clone();
        if plugins["loaded"].as_u64() >= Some(1) && plugins["loading"] == 0 { Ok(plugins) } else { Err(status.to_string()) }
    });
    assert_eq!(plugins["failed"], 0, "{plugins}");
    let health = server.get("/healthz").expect_json(200);
    assert_eq!(health, json!({"status": "ok"}), "/healthz body");

    assert!(data.join("capstan.sqlite").is_file(), "dev mode should create {}", data.join("capstan.sqlite").display());
    assert!(data.join("blobs").is_dir(), "dev mode should create {}", data.join("blobs").display());
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the data directory should be private (0700), is {mode:o}");
    let keyring = data.join("keyring.json");
    let mode =
        std::fs::metadata(&keyring).unwrap_or_else(|e| panic!("dev mode should generate {}: {e}", keyring.display())).permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the generated keyring should be private (0600), is {:o}", mode & 0o777);

    let stdout = server.stdout();
    let expected = [
        (KEYRING_PATH, data.join("keyring.json").display().to_string()),
        (DATABASE_URL, format!("sqlite:{}", data.join("capstan.sqlite").display())),
        (BLOB_URL, format!("file:{}", data.join("blobs").display())),
    ];
    for (var, value) in &expected {
        assert_eq!(
            dev_default(&stdout, var),
            Some(value.as_str()),
            "stdout should name the dev default {var} = {value}; stdout:\n{stdout}"
        );
    }
    let origin = dev_default(&stdout, PUBLIC_ORIGIN)
        .unwrap_or_else(|| panic!("stdout should name the dev default {PUBLIC_ORIGIN}; stdout:\n{stdout}"));
    assert!(origin.starts_with("http://127.0.0.1:"), "the dev public origin should be the listen address, got {origin}");
    assert_eq!(dev_default(&stdout, DATA_DIR), None, "--data-dir was given, so {DATA_DIR} is not a default; stdout:\n{stdout}");
    assert_eq!(stdout.matches("Capstan serving on ").count(), 1, "exactly one serving line; stdout:\n{stdout}");
    assert!(stdout.contains("generated a new keyring"), "generating the dev keyring should be announced; stdout:\n{stdout}");

    let stderr = server.wait_for_stderr("empty database stamped");
    assert!(!stderr.contains("refused"), "a clean start logs no refusal; stderr:\n{stderr}");
}

#[test]
fn restart_keeps_the_data_and_does_not_restamp() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let db = data.join("capstan.sqlite");

    let first = Capstan::dev(&data);
    assert_ready(&first);
    let exited = first.stop();
    assert!(exited.status.success(), "SIGTERM should stop capstan cleanly, got {:?}; stderr:\n{}", exited.status, exited.stderr);
    assert!(exited.stderr.contains("empty database stamped"), "the first start stamps the empty database; stderr:\n{}", exited.stderr);
    assert!(exited.stderr.contains("stopped"), "a graceful stop is logged; stderr:\n{}", exited.stderr);

    let ledger = read_ledger(&db).expect("the first start should write the ledger");
    assert_eq!(ledger.data["dataVersion"], target_version(), "ledger after the first start: {:?}", ledger);
    assert_eq!(ledger.data["lock"], Value::Null, "no lock should be left behind: {:?}", ledger);
    assert_eq!(ledger.data["running"], Value::Null, "no step should be left running: {:?}", ledger);
    let note = insert_doc(&db, "notes", "n1", json!({"text": "kept across restarts"}));
    let keyring = std::fs::read(data.join("keyring.json")).expect("the first start should generate the dev keyring");

    let second = Capstan::dev(&data);
    let status = assert_ready(&second);
    assert_eq!(status["migrations"]["history"], json!([]), "nothing was migrated: {status}");
    let exited = second.stop();
    assert!(exited.status.success(), "SIGTERM should stop capstan cleanly, got {:?}; stderr:\n{}", exited.status, exited.stderr);
    assert!(!exited.stderr.contains("stamped"), "the second start must not stamp again; stderr:\n{}", exited.stderr);
    assert!(!exited.stdout.contains("generated a new keyring"), "the second start must reuse the keyring; stdout:\n{}", exited.stdout);
    assert!(std::fs::read(data.join("keyring.json")).unwrap() == keyring, "the dev keyring must not change across restarts");

    assert_eq!(read_ledger(&db).as_ref(), Some(&ledger), "the ledger (revision and data) should be unchanged by a restart");
    assert_eq!(read_doc(&db, "notes", "n1").as_ref(), Some(&note), "the note written between starts should survive");
}

fn assert_production_start(server: &Capstan, prod: &ProdConfig) {
    assert_ready(server);
    let stdout = server.stdout();
    assert!(!stdout.contains("dev default") && !stdout.contains("dev mode"), "a production start invents nothing; stdout:\n{stdout}");
    let origin = format!("(public origin {})", prod.public_origin);
    assert!(stdout.contains(&origin), "the serving line should name the configured origin {origin}; stdout:\n{stdout}");
    assert!(prod.database.is_file(), "the configured database {} should exist", prod.database.display());
    assert!(prod.blobs.is_dir(), "the configured blob directory {} should exist", prod.blobs.display());
    let status = server.admin_status();
    assert_eq!(status["store"]["backend"], format!("sqlite:{}", prod.database.display()), "{status}");
    assert_eq!(status["blobs"]["backend"], format!("file:{}", prod.blobs.display()), "{status}");
}

#[test]
fn production_configuration_from_the_environment_serves() {
    let dir = tempfile::tempdir().unwrap();
    let prod = ProdConfig::under(dir.path());
    let mut cmd = with_test_admin(prod.command());
    cmd.current_dir(dir.path());
    let server = Capstan::start(cmd);
    assert_production_start(&server, &prod);
    assert!(!dir.path().join("capstan-data").exists(), "a production start must not create the dev data dir");
}

#[test]
fn production_configuration_from_a_config_file_serves() {
    let dir = tempfile::tempdir().unwrap();
    let prod = ProdConfig::under(dir.path());
    let file = dir.path().join("capstan.toml");
    let text = format!(
        "public_origin = {:?}\nkeyring_path = {:?}\ndatabase_url = {:?}\nblob_url = {:?}\nstate_dir = {:?}\nlisten = \"127.0.0.1:0\"\n",
        prod.public_origin,
        prod.keyring_path.display().to_string(),
        format!("sqlite:{}", prod.database.display()),
        format!("file:{}", prod.blobs.display()),
        prod.state_dir.display().to_string(),
    );
    std::fs::write(&file, text).unwrap();
    let mut cmd = with_test_admin(capstan());
    cmd.arg("serve").arg("--config").arg(&file).current_dir(dir.path());
    let server = Capstan::start(cmd);
    assert_production_start(&server, &prod);
}

#[test]
fn a_populated_database_without_a_ledger_is_taken_at_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let prod = ProdConfig::under(dir.path());
    std::fs::create_dir_all(prod.database.parent().unwrap()).unwrap();
    insert_doc(&prod.database, "notes", "n1", json!({"text": "written before any ledger"}));
    assert!(read_ledger(&prod.database).is_none(), "precondition: no ledger");

    let server = Capstan::start(prod.command());
    assert_ready(&server);
    let exited = server.stop();
    assert!(exited.status.success(), "SIGTERM should stop capstan cleanly; stderr:\n{}", exited.stderr);
    assert!(!exited.stderr.contains("stamped"), "a populated database is not stamped as empty; stderr:\n{}", exited.stderr);

    let ledger = read_ledger(&prod.database).expect("the start should write a ledger");
    // taken at the floor, then carried to the target by the chain's steps
    assert_eq!(ledger.data["dataVersion"], capstan::migrate::host_chain().target().to_string(), "{:?}", ledger);
    assert_eq!(ledger.data["lock"], Value::Null, "the migration lock should be released: {:?}", ledger);
    assert!(read_doc(&prod.database, "notes", "n1").is_some(), "the existing data is kept");
}
