//! Snapshots of Capstan itself (docs/backups.md): a dev host with data in every area (people,
//! a secret, services, the App Store's collections and blobs) is snapshotted to a file while it
//! serves and into its bucket; the file restores into an empty store — SQLite always, the
//! MongoDB stand-in named by `CAPSTAN_TEST_MONGODB_URL` when set — refusing a second restore;
//! a production `capstan serve` started there with the same keyring logs the administrator in,
//! reads the secret's metadata and shows the App Store's catalog. A damaged file is refused by
//! name, naming the part, before anything is written.

use crate::appstore::wait_for_appstore;
use crate::mongo::{fresh_database, mongo_url};
use crate::support::{Capstan, TEST_ADMIN, capstan, dev_command, eventually, run_to_exit, with_test_admin};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The snapshotted dev host: what its snapshot holds, for every restore to find again.
struct Source {
    _dir: tempfile::TempDir,
    file: PathBuf,
    keyring: PathBuf,
    secret_id: String,
    person: String,
    apps: Vec<String>,
    documents: u64,
}

/// The App Store's apps, sorted.
fn apps(server: &Capstan, admin: &str) -> Vec<String> {
    let listed = server.call_as(admin, "appstore.listApps", &json!({})).expect_json(200);
    let mut apps: Vec<String> = listed["apps"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_string()).collect();
    apps.sort();
    apps
}

fn json_of(exited: &crate::support::Exited, what: &str) -> Value {
    assert!(exited.status.success(), "{what} should succeed: {exited:?}");
    serde_json::from_str(exited.stdout.trim()).unwrap_or_else(|e| panic!("{what} prints JSON ({e}): {}", exited.stdout))
}

/// Built once for the tests of this file: `serve --dev --demo`, a person and a generated
/// secret, then `snapshot create --to FILE` while it serves and `--to-bucket` through the API.
fn source() -> &'static Source {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let data = dir.path().join("data");
        let mut cmd = with_test_admin(dev_command(&data));
        cmd.arg("--demo");
        let server = Capstan::start(cmd);
        let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
        wait_for_appstore(&server, &admin);
        let apps = eventually("the demo catalog installed", Duration::from_secs(240), || {
            let apps = apps(&server, &admin);
            if apps.len() == 6 { Ok(apps) } else { Err(format!("{apps:?}")) }
        });
        server.wait_for_stderr("demo installed");
        let ok = |method: &str, body: Value| server.call_as(&admin, method, &body).expect_json(200);
        let person = "snapshot-olga".to_string();
        ok("admin.createUser", json!({ "username": person }));
        let org =
            ok("organizations.list", json!({}))["items"].as_array().unwrap().iter().find(|o| o["name"] == "demo").unwrap()["id"].clone();
        let services = ok("services.list", json!({ "organizationId": org }));
        let website = services["items"].as_array().unwrap().iter().find(|s| s["name"] == "website").unwrap()["id"].clone();
        let secret = ok(
            "secrets.create",
            json!({ "owner": { "kind": "service", "serviceId": website }, "key": "SNAPSHOT_KEY",
                    "value": { "generate": { "length": 32, "alphabet": "hex" } } }),
        );
        let secret_id = secret["id"].as_str().unwrap().to_string();

        // to a file, offline, while the host serves
        let file = dir.path().join("capstan.capstan-snapshot");
        let mut cmd = capstan();
        cmd.args(["snapshot", "create", "--dev", "--data-dir"]).arg(&data).arg("--to").arg(&file).arg("--json");
        let created = json_of(&run_to_exit(cmd), "snapshot create --to FILE");
        assert_eq!(created["file"], file.display().to_string(), "{created}");
        assert_eq!(created["keyringIncluded"], false, "{created}");
        assert!(created["keyringNotice"].as_str().unwrap().contains("keyring"), "{created}");
        assert_eq!(created["bytes"].as_u64(), Some(std::fs::metadata(&file).unwrap().len()));
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        let documents = created["documents"].as_u64().unwrap();
        assert!(documents > 10 && created["blobs"].as_u64().unwrap() >= 1, "{created}");
        let mut again = capstan();
        again.args(["snapshot", "create", "--dev", "--data-dir"]).arg(&data).arg("--to").arg(&file);
        run_to_exit(again).assert_refused(1, "exists");

        // into the bucket, by the host
        let mut cmd = capstan();
        cmd.args(["snapshot", "create", "--to-bucket", "--json", "--url", &server.url("")]).env("CAPSTAN_TOKEN", &admin);
        let in_bucket = json_of(&run_to_exit(cmd), "snapshot create --to-bucket");
        let key = in_bucket["key"].as_str().unwrap();
        assert!(key.starts_with("_capstan/snapshots/") && key.ends_with(".capstan-snapshot"), "{in_bucket}");
        // the local blob store keeps an object's bytes as they are, in objects/<key>~
        let stored = data.join("blobs").join("objects").join(format!("{key}~"));
        assert_eq!(std::fs::metadata(&stored).map(|m| m.len()).ok(), in_bucket["bytes"].as_u64(), "{}", stored.display());
        let mut cmd = capstan();
        cmd.args(["snapshot", "verify", "--json"]).arg(&stored);
        let verified = json_of(&run_to_exit(cmd), "snapshot verify");
        assert_eq!(verified["manifest"]["keyringIncluded"], false, "{verified}");
        assert!(!verified.to_string().contains("keyring.json"), "the keyring's file is not in the manifest");
        drop(server);

        // no key of the keyring is in the file
        let keyring = data.join("keyring.json");
        let keyring_text = std::fs::read_to_string(&keyring).unwrap();
        let snapshot = std::fs::read(&file).unwrap();
        let keyring_json: Value = serde_json::from_str(&keyring_text).unwrap();
        let mut strings = Vec::new();
        collect_strings(&keyring_json, &mut strings);
        for secret in strings.iter().filter(|s| s.len() >= 32) {
            assert!(!snapshot.windows(secret.len()).any(|w| w == secret.as_bytes()), "a keyring value is in the snapshot");
        }
        Source { _dir: dir, file, keyring, secret_id, person, apps, documents }
    })
}

fn collect_strings(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::String(s) => into.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| collect_strings(v, into)),
        Value::Object(members) => members.values().for_each(|v| collect_strings(v, into)),
        _ => {}
    }
}

/// The variables of a production host on `database` (plus `extra`), blobs and state under `dir`,
/// with the source's keyring.
fn production(dir: &Path, database: &str, extra: &[(&str, String)]) -> Vec<(String, String)> {
    let mut vars = vec![
        ("CAPSTAN_PUBLIC_ORIGIN".to_string(), "http://127.0.0.1".to_string()),
        ("CAPSTAN_KEYRING_PATH".into(), source().keyring.display().to_string()),
        ("CAPSTAN_DATABASE_URL".into(), database.to_string()),
        ("CAPSTAN_BLOB_URL".into(), format!("file:{}", dir.join("blobs").display())),
        ("CAPSTAN_STATE_DIR".into(), dir.join("state").display().to_string()),
    ];
    vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    vars
}

/// Restore the source's file with `vars`, refuse a second restore, start `capstan serve` there
/// and find the administrator, the person, the secret's metadata and the App Store's catalog.
fn restore_and_serve(vars: &[(String, String)]) {
    let source = source();
    let restore = |output: &[&str]| {
        let mut cmd = capstan();
        cmd.args(["snapshot", "restore"]).args(output).arg(&source.file).envs(vars.iter().map(|(k, v)| (k, v)));
        run_to_exit(cmd)
    };
    let restored = json_of(&restore(&["--json"]), "snapshot restore");
    assert_eq!(restored["restored"]["documents"].as_u64(), Some(source.documents), "{restored}");
    assert_eq!(restored["restored"]["manifest"]["keyringIncluded"], false, "{restored}");
    let stderr = restore(&[]).assert_refused(1, "restore-target-not-empty").to_string();
    assert!(stderr.contains("empty"), "{stderr}");

    let mut cmd = capstan();
    cmd.args(["serve", "--listen", "127.0.0.1:0"]).envs(vars.iter().map(|(k, v)| (k, v)));
    let server = Capstan::start(cmd);
    let status = server.admin_status();
    assert_eq!(status["migrations"]["done"], true, "{status}");
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let ok = |method: &str, body: Value| server.call_as(&admin, method, &body).expect_json(200);
    let users = ok("users.list", json!({}));
    assert!(users.to_string().contains(&source.person), "{users}");
    let secret = ok("secrets.get", json!({ "id": source.secret_id }));
    assert_eq!(secret["key"], "SNAPSHOT_KEY", "{secret}");
    wait_for_appstore(&server, &admin);
    let catalog = ok("appstore.listApps", json!({}));
    let mut listed: Vec<String> = catalog["apps"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_string()).collect();
    listed.sort();
    assert_eq!(listed, source.apps);
    assert_eq!(catalog["status"]["active"]["source"], "demo", "{catalog}");
    assert!(!server.stderr().contains("stamped"), "the restored ledger is found, not stamped anew");
}

#[test]
fn a_dev_hosts_snapshot_restores_into_an_empty_sqlite_store_and_serves_there() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite:{}", dir.path().join("store").join("capstan.sqlite").display());
    restore_and_serve(&production(dir.path(), &database, &[]));
}

#[test]
fn a_dev_hosts_snapshot_restores_into_mongodb_and_serves_there() {
    let Some(url) = mongo_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    restore_and_serve(&production(dir.path(), &url, &[("CAPSTAN_DATABASE_NAME", fresh_database())]));
}

#[test]
fn a_damaged_snapshot_is_refused_naming_the_part_and_nothing_is_restored() {
    let source = source();
    let dir = tempfile::tempdir().unwrap();
    let damaged = dir.path().join("damaged.capstan-snapshot");
    let mut bytes = std::fs::read(&source.file).unwrap();
    let needle = b"snapshot-olga";
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("the person is in the snapshot");
    bytes[at] ^= 0x20;
    std::fs::write(&damaged, bytes).unwrap();
    let database = format!("sqlite:{}", dir.path().join("store").join("capstan.sqlite").display());
    let mut cmd = capstan();
    cmd.args(["snapshot", "restore", "--json"]).arg(&damaged).envs(production(dir.path(), &database, &[]));
    let exited = run_to_exit(cmd);
    assert_eq!(exited.status.code(), Some(1), "{exited:?}");
    let answer: Value = serde_json::from_str(exited.stdout.trim()).unwrap();
    assert_eq!(answer["error"]["code"], "snapshot-corrupt", "{answer}");
    assert!(answer["error"]["data"]["part"].as_str().unwrap().starts_with("collection:"), "{answer}");
    assert!(!dir.path().join("blobs").join("plugins").exists(), "no blob restored");
    let mut cmd = capstan();
    cmd.args(["snapshot", "verify"]).arg(&damaged);
    run_to_exit(cmd).assert_refused(1, "snapshot-corrupt");
}
