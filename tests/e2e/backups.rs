//! The backups manager end to end, with real processes only: `capstan serve --dev` (the backups
//! plugin embedded and installed first-party), the real `capstan-agent` enrolled with a jump code
//! and run as `capstan-agent relay --volumes-dir DIR`, and the HTTP API.
//!
//! One scenario, in order: a service's volume of real files (nested, binary, a symlink) is backed
//! up through the cluster's agent, the archive reaching the blob store over a transfer ticket
//! (exact length and SHA-256 recorded, and what the blob store holds is that); the files change
//! and the restore brings them back byte for byte; one byte flipped in the stored archive makes
//! the next restore refuse by name (`backup-corrupt`), change nothing and mark the backup
//! corrupt; keep-last prunes to exactly the newest backups, records first, objects after.
//! Then, against an S3 server that checks credentials (moto with IAM authentication, set up by
//! .ci/peers.sh), the external target: replication fails closed by name without the credentials'
//! secret and with a wrong one, writing nothing there; with the right one every object lands
//! exact (read back with the S3 API and hashed here) and the manifest last, while a backup whose
//! archive changed in the blob store is refused `backup-corrupt`, marked corrupt, and not copied.

use crate::nodes::{agent_binary, machine_hostname_is_a_label};
use crate::relays::{RelayProcess, wait_listed};
use crate::support::{Capstan, EXIT_TIMEOUT, Refusing, TEST_ADMIN, capstan, eventually, free_port, ok, refused, with_test_admin};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a backup or restore may take to finish: the reconcile loop wakes within about a
/// second of the request, and a loaded CI machine is slow.
const DONE: Duration = Duration::from_secs(120);
const ZONE: &str = "backups.e2e.example";

/// Every entry under `dir`: a file's bytes, a symlink's target (`-> target`), a directory (`/`).
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            let name = path.strip_prefix(root).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                out.insert(name, format!("-> {}", std::fs::read_link(&path).unwrap().display()).into_bytes());
            } else if meta.is_dir() {
                out.insert(format!("{name}/"), Vec::new());
                walk(root, &path, out);
            } else {
                out.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The state of a backup or restore once it is no longer pending or running.
fn settled(server: &Capstan, token: &str, method: &str, body: Value) -> Value {
    eventually(&format!("{method} {body} settling"), DONE, || {
        let record = ok(server, token, method, body.clone());
        match record["state"].as_str() {
            Some("pending" | "stopping" | "running") => Err(record.to_string()),
            _ => Ok(record),
        }
    })
}

/// The stored object of a backup, as the local blob backend keeps it.
fn object_file(data: &Path, key: &str) -> PathBuf {
    data.join("blobs/objects/plugins/backups").join(format!("{key}~"))
}

/// A dev host with the backups plugin running, a cluster whose relay runs on an enrolled node
/// (`capstan-agent relay --volumes-dir`), and the service `db` of the organization `acme` with
/// the volume `data` (its directory created, empty).
struct World {
    dir: tempfile::TempDir,
    port: u16,
    server: Capstan,
    admin: String,
    relay: RelayProcess,
    data: PathBuf,
    org_id: String,
    service_id: String,
    volume: PathBuf,
}

/// `capstan serve --dev` on `data` at `port` (armed to crash at `crash_at`).
fn serve(data: &Path, port: u16, crash_at: Option<&str>) -> Capstan {
    let mut cmd = with_test_admin(capstan());
    cmd.args(["serve", "--dev", "--data-dir"]).arg(data).args(["--listen", &format!("127.0.0.1:{port}")]);
    cmd.env("CAPSTAN_AGENT_BINARY", agent_binary());
    // the external target is an S3 server on loopback
    cmd.env("CAPSTAN_PLUGIN_HTTP_ALLOW", "127.0.0.0/8");
    if let Some(point) = crash_at {
        cmd.env(capstan_core::crash::CRASH_AT, point);
    }
    Capstan::start(cmd)
}

impl World {
    fn new(crash_at: Option<&str>) -> World {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let port = free_port();
        let origin = format!("http://127.0.0.1:{port}");
        let data = root.join("data");
        let server = serve(&data, port, crash_at);
        server.ready_status();
        let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
        eventually("the backups plugin running", Duration::from_secs(180), || {
            // installed in the background once the host serves: not there at first
            let reply = server.call_as(&admin, "plugins.get", &json!({ "id": "backups" }));
            if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
        });

        // ---- a cluster with its relay on an enrolled node, and a service with a volume ----
        let enrolled = crate::relays::enrolled_cluster(&server, &admin, root, &origin, ZONE);
        let (cluster_id, state_dir, authorization) = (enrolled.cluster_id, enrolled.state_dir, enrolled.authorization);
        let volumes_dir = root.join("volumes");
        let relay =
            RelayProcess::start_with(&state_dir, &authorization, "10.0.0.5:8443", &["--volumes-dir".as_ref(), volumes_dir.as_os_str()]);
        wait_listed(&server, &admin, &cluster_id, true, 1, &[&relay]);

        let org = ok(&server, &admin, "organizations.create", json!({ "name": "acme" }));
        let org_id = org["id"].as_str().unwrap().to_string();
        let service = ok(
            &server,
            &admin,
            "services.create",
            json!({ "organizationId": org_id, "name": "db", "image": "registry.example.com/db:1", "volumes": [{ "name": "data", "mountPath": "/var/lib/db" }] }),
        );
        let service_id = service["id"].as_str().unwrap().to_string();
        let volume = volumes_dir.join(&service_id).join("data");
        std::fs::create_dir_all(&volume).unwrap();
        World { dir, port, server, admin, relay, data, org_id, service_id, volume }
    }
}

#[test]
fn a_service_volume_is_backed_up_by_its_agent_restored_byte_for_byte_refused_when_corrupt_and_pruned_to_keep_last() {
    if !machine_hostname_is_a_label() {
        eprintln!("skipped: this machine's short hostname is not one DNS label, which capstan-agent refuses to offer at enrollment");
        return;
    }
    let World { dir, server, admin, relay, data, org_id, service_id, volume, .. } = World::new(None);
    let root = dir.path();
    std::fs::create_dir_all(volume.join("nested/deeper")).unwrap();
    std::fs::write(volume.join("a.txt"), "the first text\n").unwrap();
    let binary: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(volume.join("nested/deeper/b.bin"), &binary).unwrap();
    std::os::unix::fs::symlink("a.txt", volume.join("link")).unwrap();
    // the service keeps a SQLite database in its volume, its newest rows still in the write-ahead log
    let service = ok(&server, &admin, "services.get", json!({ "id": service_id }));
    let database = json!({ "engine": "sqlite", "volume": "data", "path": "db/app.sqlite" });
    let update = json!({ "id": service_id, "expectedRevision": service["revision"], "database": database });
    assert_eq!(ok(&server, &admin, "services.update", update)["database"], database);
    let cookie = format!("capstan_session={admin}");
    let page = server.request("GET", &format!("/services/{service_id}"), &[("cookie", &cookie), ("accept", "text/html")], None);
    assert!(
        page.body.contains(r#"<dd id="service-database-value"><span class="mono">data&#x2f;db&#x2f;app.sqlite (sqlite)</span>"#),
        "{}",
        page.body
    );
    std::fs::create_dir_all(volume.join("db")).unwrap();
    let live = rusqlite::Connection::open(volume.join("db/app.sqlite")).unwrap();
    live.pragma_update(None, "journal_mode", "WAL").unwrap();
    live.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    live.execute_batch("CREATE TABLE notes(body TEXT); INSERT INTO notes VALUES ('taken by the backup');").unwrap();
    assert!(std::fs::metadata(volume.join("db/app.sqlite-wal")).unwrap().len() > 0, "the row sits in the log");
    // the volume's files beside the database, which comes back as its closure
    let files =
        |volume: &Path| -> BTreeMap<String, Vec<u8>> { tree(volume).into_iter().filter(|(name, _)| !name.starts_with("db/")).collect() };
    let notes = |volume: &Path| -> Vec<String> {
        let db = rusqlite::Connection::open(volume.join("db/app.sqlite")).unwrap();
        let mut query = db.prepare("SELECT body FROM notes ORDER BY rowid").unwrap();
        query.query_map([], |row| row.get(0)).unwrap().map(Result::unwrap).collect()
    };
    let original = files(&volume);

    // ---- a service with no volumes has nothing to back up; a node that is not there is named ----
    let plain = ok(
        &server,
        &admin,
        "services.create",
        json!({ "organizationId": org_id, "name": "plain", "image": "registry.example.com/plain:1" }),
    );
    refused(
        &server.call_as(&admin, "backups.create", &json!({ "organizationId": org_id, "serviceId": plain["id"] })),
        Refusing::ClientError,
        "service-has-no-volumes",
    );
    let unresolved =
        server.call_as(&admin, "backups.create", &json!({ "organizationId": org_id, "serviceId": service_id, "nodeId": "node_missing" }));
    refused(&unresolved, Refusing::ClientError, "node-unresolved");

    // ---- the backup: through the agent into the blob store, verified ----
    let created = ok(&server, &admin, "backups.create", json!({ "organizationId": org_id, "serviceId": service_id }));
    assert_eq!(created["state"], "pending", "{created}");
    let backup_id = created["id"].as_str().unwrap().to_string();
    let backup = settled(&server, &admin, "backups.get", json!({ "organizationId": org_id, "backupId": backup_id }));
    assert_eq!(backup["state"], "complete", "{backup}\nrelay log:\n{}", relay.log());
    let object = &backup["objects"][0];
    let stored = std::fs::read(object_file(&data, object["key"].as_str().unwrap())).unwrap();
    assert_eq!(object["size"], stored.len() as u64, "the exact length of what the blob store holds: {backup}");
    assert_eq!(object["sha256"], hex::encode(Sha256::digest(&stored)), "{backup}");
    // the database's closure, an object of its own: a whole database holding the logged row
    let closure = &backup["objects"][1];
    assert_eq!((object["kind"].as_str(), closure["kind"].as_str()), (Some("volumes"), Some("database")), "{backup}");
    let closure_file = object_file(&data, closure["key"].as_str().unwrap());
    let closure_bytes = std::fs::read(&closure_file).unwrap();
    assert_eq!(closure["sha256"], hex::encode(Sha256::digest(&closure_bytes)), "{backup}");
    let copy = rusqlite::Connection::open_with_flags(&closure_file, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let held: String = copy.query_row("SELECT group_concat(body) FROM notes", [], |row| row.get(0)).unwrap();
    assert_eq!(held, "taken by the backup", "the closure holds the row that was only in the log");
    drop(copy);
    assert_eq!(backup["size"], object["size"].as_u64().unwrap() + closure["size"].as_u64().unwrap());
    live.execute("INSERT INTO notes VALUES ('written after the backup')", []).unwrap();
    drop(live);

    // ---- change the files, restore, and everything is as it was ----
    std::fs::write(volume.join("a.txt"), "changed\n").unwrap();
    std::fs::remove_file(volume.join("nested/deeper/b.bin")).unwrap();
    std::fs::write(volume.join("new.txt"), "added after the backup").unwrap();
    assert_ne!(tree(&volume), original);
    // the restore, as an operator asks for it in the dashboard: confirmed on its own page
    let restore_id = restore_from_the_dashboard(&server, &admin, &org_id, &backup_id, &backup);
    let restore = settled(&server, &admin, "backups.getRestore", json!({ "organizationId": org_id, "restoreId": restore_id }));
    assert_eq!(restore["state"], "complete", "{restore}\nrelay log:\n{}", relay.log());
    assert_eq!(files(&volume), original, "the volume is byte for byte what was backed up");
    assert_eq!(notes(&volume), ["taken by the backup"], "the database is its closure, the logged row in it");
    assert!(!volume.join("db/app.sqlite-wal").exists(), "no log of the replaced database stays beside it");

    // ---- one byte flipped in the stored archive: the restore refuses and changes nothing ----
    let object_path = object_file(&data, object["key"].as_str().unwrap());
    let mut flipped = stored.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    std::fs::write(&object_path, &flipped).unwrap();
    std::fs::write(volume.join("a.txt"), "after the corruption\n").unwrap();
    let before = tree(&volume);
    let doubted = ok(&server, &admin, "backups.restore", json!({ "organizationId": org_id, "backupId": backup_id }));
    let doubted = settled(&server, &admin, "backups.getRestore", json!({ "organizationId": org_id, "restoreId": doubted["id"] }));
    assert_eq!((doubted["state"].as_str(), doubted["reason"]["code"].as_str()), (Some("failed"), Some("backup-corrupt")), "{doubted}");
    assert_eq!(tree(&volume), before, "a restore in doubt keeps what is there");
    let corrupt = ok(&server, &admin, "backups.get", json!({ "organizationId": org_id, "backupId": backup_id }));
    assert_eq!(corrupt["state"], "corrupt", "{corrupt}");
    refused(
        &server.call_as(&admin, "backups.restore", &json!({ "organizationId": org_id, "backupId": backup_id })),
        Refusing::ClientError,
        "backup-not-complete",
    );

    // ---- keep-last: the newest two complete backups stay, everything older goes ----
    let settings = ok(&server, &admin, "settings.get", json!({}));
    refused(
        &server.call_as(
            &admin,
            "settings.update",
            &json!({ "expectedRevision": settings["revision"], "set": { "backups.backupKeepLast": 0 } }),
        ),
        Refusing::ClientError,
        "setting-invalid",
    );
    ok(&server, &admin, "settings.update", json!({ "expectedRevision": settings["revision"], "set": { "backups.backupKeepLast": 2 } }));
    let mut newest = Vec::new();
    for _ in 0..3 {
        let created = ok(&server, &admin, "backups.create", json!({ "organizationId": org_id, "serviceId": service_id }));
        let done = settled(&server, &admin, "backups.get", json!({ "organizationId": org_id, "backupId": created["id"] }));
        assert_eq!(done["state"], "complete", "{done}");
        newest.push(created["id"].as_str().unwrap().to_string());
    }
    // pruning is a pass of its own after the third completes: wait for it
    eventually("keep-last pruning the oldest", DONE, || {
        let listed = ok(&server, &admin, "backups.list", json!({ "organizationId": org_id, "serviceId": service_id }));
        let ids: Vec<&str> = listed["backups"].as_array().unwrap().iter().map(|b| b["id"].as_str().unwrap()).collect();
        if ids == [newest[2].as_str(), newest[1].as_str()] { Ok(()) } else { Err(format!("the newest two, newest first: {listed}")) }
    });
    let kept: Vec<String> = tree(&data.join("blobs/objects/plugins/backups"))
        .into_keys()
        .filter_map(|name| name.strip_suffix('~').map(str::to_string))
        .collect();
    let mut expected: Vec<String> =
        newest[1..].iter().flat_map(|id| [format!("backups/{id}/database.sqlite"), format!("backups/{id}/volumes.tar.gz")]).collect();
    expected.sort();
    assert_eq!(kept, expected, "only the kept backups' objects remain");

    match AuthS3::from_env() {
        Some(s3) => external_target(&server, &admin, &root.join("cli-config"), (&data, &volume), &org_id, [&newest[1], &newest[2]], &s3),
        None => eprintln!(
            "external target part skipped: CAPSTAN_TEST_S3_AUTH_ENDPOINT/_BUCKET/_ACCESS_KEY/_SECRET_KEY are not set \
             (an S3 server that checks credentials; .ci/peers.sh starts moto with IAM authentication)"
        ),
    }
    drop(relay);
}

/// A kill -9 of Capstan while the agent's archive is on its way into the blob store (the crash
/// point `transfer-upload:midway`, 64 KiB into the upload) leaves no `complete` record: after the
/// restart the backup is still `running`; once it is stale (3 minutes after it started) a pass
/// fails it `interrupted` and deletes whatever was stored of it. Then `backupCron` set to every minute takes a complete
/// backup (`trigger: schedule`), and keep-last prunes the failed one, older than it.
#[test]
fn a_backup_cut_by_a_kill_9_of_capstan_is_never_complete_and_is_cleaned_up() {
    if !machine_hostname_is_a_label() {
        eprintln!("skipped: this machine's short hostname is not one DNS label, which capstan-agent refuses to offer at enrollment");
        return;
    }
    let point = "transfer-upload:midway";
    let World { dir: _dir, port, server, admin, relay, data, org_id, service_id, volume } = World::new(Some(point));
    // 4 MiB that gzip cannot shrink: the archive is still arriving at the crash point
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise: Vec<u8> = (0..4usize << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(volume.join("noise.bin"), &noise).unwrap();
    let created = ok(&server, &admin, "backups.create", json!({ "organizationId": org_id, "serviceId": service_id }));
    let backup_id = created["id"].as_str().unwrap().to_string();
    let crash_line = format!("{}{point}", capstan_core::crash::CRASH_LINE);
    eventually("Capstan killed in the middle of the upload", DONE, || {
        if server.stderr().contains(&crash_line) { Ok(()) } else { Err(format!("relay log:\n{}", relay.log())) }
    });
    let exited = server.kill_hard();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&exited.status), Some(9), "{:?}", exited.status);

    let server = serve(&data, port, None);
    server.ready_status();
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let get = json!({ "organizationId": org_id, "backupId": backup_id });
    let cut = eventually("the backups plugin answering again", Duration::from_secs(180), || {
        let reply = server.call_as(&admin, "backups.get", &get);
        if reply.status == 200 { Ok(reply.json()) } else { Err(reply.body.clone()) }
    });
    assert_eq!(cut["state"], "running", "the cut backup is not complete: {cut}");
    // what arrived of the archive is at most a temporary file of the blob store (removed by an
    // open once an hour old), never an object
    assert!(!object_file(&data, &format!("backups/{backup_id}/volumes.tar.gz")).exists(), "the cut upload is no object");
    let failed = eventually("the cut backup failed as interrupted", Duration::from_secs(300), || {
        let backup = ok(&server, &admin, "backups.get", get.clone());
        if backup["state"] == "running" { Err(backup.to_string()) } else { Ok(backup) }
    });
    assert_eq!((failed["state"].as_str(), failed["reason"]["code"].as_str()), (Some("failed"), Some("interrupted")), "{failed}");
    assert!(!object_file(&data, &format!("backups/{backup_id}/volumes.tar.gz")).exists(), "nothing of it is kept");
    assert_eq!(failed["objects"], json!([]), "{failed}");

    // ---- the schedule: every minute, a complete backup of the service, and the failed one older
    // than the oldest complete kept is pruned with it ----
    let settings = ok(&server, &admin, "settings.get", json!({}));
    ok(
        &server,
        &admin,
        "settings.update",
        json!({ "expectedRevision": settings["revision"], "set": { "backups.backupCron": "* * * * *" } }),
    );
    let scheduled = eventually("a scheduled backup complete", Duration::from_secs(200), || {
        let listed = ok(&server, &admin, "backups.list", json!({ "organizationId": org_id, "serviceId": service_id }));
        let done = listed["backups"].as_array().unwrap().iter().find(|b| b["trigger"] == "schedule" && b["state"] == "complete").cloned();
        done.ok_or_else(|| listed.to_string())
    });
    assert_eq!(scheduled["requestedBy"], "schedule", "{scheduled}");
    let overview = ok(&server, &admin, "backups.overview", json!({}));
    assert_eq!(overview["lastRun"]["by"], "schedule", "{overview}");
    assert!(overview["nextDueMs"].as_u64().unwrap() > overview["lastRun"]["atMs"].as_u64().unwrap(), "{overview}");
    let pruned = server.call_as(&admin, "backups.get", &get);
    refused(&pruned, Refusing::ClientError, "backup-not-found");
    let settings = ok(&server, &admin, "settings.get", json!({}));
    ok(&server, &admin, "settings.update", json!({ "expectedRevision": settings["revision"], "unset": ["backups.backupCron"] }));
    drop(relay);
}

/// The backups page shows the service's complete backup (state, size, age, a restore link); the
/// restore page says what is replaced and asks for confirmation; its form asks for the restore.
/// The restore's id.
fn restore_from_the_dashboard(server: &Capstan, admin: &str, org_id: &str, backup_id: &str, backup: &Value) -> String {
    let cookie = format!("capstan_session={admin}");
    let page = |path: &str| server.request("GET", path, &[("cookie", &cookie), ("accept", "text/html")], None);
    let overview = page("/p/backups");
    assert_eq!(overview.status, 200, "{}", overview.body);
    let html = &overview.body;
    assert!(html.contains(r#"data-templated="true""#) && html.contains(r#"data-service="db""#), "{html}");
    let row = format!(r#"data-backup="{backup_id}" data-state="complete" data-size="{}""#, backup["size"]);
    assert!(html.contains(&row), "the backup's row with its state and size: {html}");
    assert!(html.contains(r#"<td data-age>"#) && html.contains(&format!(r#"data-restore="{backup_id}""#)), "{html}");
    assert!(html.contains(r#"id="schedule-cron""#) && html.contains("off: set backups.backupCron"), "the schedule, off: {html}");

    let members = page(&format!("/p/backups/organization?organizationId={org_id}"));
    assert_eq!(members.status, 200, "{}", members.body);
    assert!(members.body.contains(r#"id="organization-backups""#), "the organization's page: {}", members.body);
    assert!(members.body.contains(&format!(r#"data-backup="{backup_id}" data-state="complete""#)), "{}", members.body);
    let path = format!("/p/backups/restore?organizationId={org_id}&backupId={backup_id}");
    let confirm = page(&path);
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    assert!(confirm.body.contains(r#"id="restore-consequence""#) && confirm.body.contains(r#"id="restore-form""#), "{}", confirm.body);
    assert!(confirm.body.contains("are replaced by the backup"), "it says what a restore replaces: {}", confirm.body);
    assert!(confirm.body.contains(r#"<span class="mono">data/db&#x2f;app.sqlite</span> (sqlite)"#), "and the database: {}", confirm.body);
    let missing = page("/p/backups/restore");
    assert!(missing.status == 200 && missing.body.contains(r#"id="restore-missing""#), "{}", missing.body);

    let headers = [("cookie", cookie.as_str()), ("sec-fetch-site", "same-origin"), ("content-type", "application/x-www-form-urlencoded")];
    let fields = format!(
        "_page=restore&_return=organizationId%3D{org_id}%26backupId%3D{backup_id}&organizationId={org_id}&backupId={backup_id}&_confirm=yes"
    );
    let posted = server.request("POST", "/p/backups/-/call/restore", &headers, Some(fields.as_bytes()));
    assert!([200, 303].contains(&posted.status), "{}", posted.body);
    let restores = ok(server, admin, "backups.overview", json!({}))["restores"].clone();
    let newest = &restores[0];
    assert_eq!(newest["backupId"], backup_id, "the form asked for a restore of this backup: {restores}");
    newest["id"].as_str().unwrap().to_string()
}

/// An S3 server that checks credentials, with a bucket and a key pair it knows.
struct AuthS3 {
    endpoint: String,
    bucket: String,
    access_key: String,
    secret_key: String,
}

impl AuthS3 {
    fn from_env() -> Option<AuthS3> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        Some(AuthS3 {
            endpoint: var("CAPSTAN_TEST_S3_AUTH_ENDPOINT")?,
            bucket: var("CAPSTAN_TEST_S3_AUTH_BUCKET")?,
            access_key: var("CAPSTAN_TEST_S3_AUTH_ACCESS_KEY")?,
            secret_key: var("CAPSTAN_TEST_S3_AUTH_SECRET_KEY")?,
        })
    }

    /// The objects under these keys that exist there, with their content. (Listing is not used:
    /// the moto server checking credentials refuses the SDK's signed ListObjectsV2.)
    fn objects(&self, keys: &[String]) -> BTreeMap<String, Vec<u8>> {
        use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new(&self.access_key, &self.secret_key, None, None, "e2e"))
            .endpoint_url(&self.endpoint)
            .force_path_style(true)
            .build();
        let client = aws_sdk_s3::Client::from_conf(config);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
        runtime.block_on(async {
            let mut out = BTreeMap::new();
            for key in keys {
                match client.get_object().bucket(&self.bucket).key(key).send().await {
                    Ok(object) => drop(out.insert(key.clone(), object.body.collect().await.expect("its body").into_bytes().to_vec())),
                    Err(e) if e.as_service_error().is_some_and(|e| e.is_no_such_key()) => {}
                    Err(e) => panic!("reading {key} from the target: {e:?}"),
                }
            }
            out
        })
    }
}

/// Replication to the external target: fails closed without credentials and with wrong ones,
/// then lands every object exact, and the manifest.
fn external_target(
    server: &Capstan,
    admin: &str,
    config: &Path,
    (data, volume): (&Path, &Path),
    org_id: &str,
    [older, backup_id]: [&str; 2],
    s3: &AuthS3,
) {
    let prefix = format!("e2e-{:08x}", rand::random::<u32>());
    let settings = ok(server, admin, "settings.get", json!({}));
    let set = json!({
        "backups.backupTargetEndpoint": s3.endpoint,
        "backups.backupTargetBucket": s3.bucket,
        "backups.backupTargetPrefix": prefix,
    });
    ok(server, admin, "settings.update", json!({ "expectedRevision": settings["revision"], "set": set }));
    let get = json!({ "organizationId": org_id, "backupId": backup_id });
    // a new target queues every complete backup for it; no credentials: failed by name
    let replica = |expected: &str| {
        eventually(&format!("the replica of {backup_id} {expected}"), DONE, || {
            let backup = ok(server, admin, "backups.get", get.clone());
            if backup["replicaState"] == expected { Ok(backup) } else { Err(backup.to_string()) }
        })
    };
    let failed = replica("failed");
    assert_eq!(failed["replica"]["reason"]["code"], "backup-target-credentials-missing", "{failed}");

    let set_secret = |value: &str| {
        let mut cmd = capstan();
        cmd.args(["secrets", "set-system", "BACKUP_TARGET_CREDENTIALS", "--system-id", "backups", "--scope", "backups:target"])
            .env("CAPSTAN_URL", server.url(""))
            .env("CAPSTAN_TOKEN", admin)
            .env("XDG_CONFIG_HOME", config);
        let exited = crate::plugins::run(cmd, value.as_bytes(), EXIT_TIMEOUT);
        assert!(exited.status.success(), "capstan secrets set-system: {exited:?}");
        assert!(!exited.stdout.contains(&s3.secret_key) && !exited.stderr.contains(&s3.secret_key));
    };
    set_secret(&format!("{}:not-the-secret", s3.access_key));
    let queued = ok(server, admin, "backups.replicate", get.clone());
    assert_eq!(queued["replicaState"], "pending", "{queued}");
    let rejected = replica("failed");
    assert_eq!(rejected["replica"]["reason"]["code"], "backup-target-credentials-rejected", "{rejected}");
    let archive_key = format!("{prefix}/backups/{backup_id}/volumes.tar.gz");
    let manifest_key = format!("{prefix}/backups/{backup_id}/manifest.json");
    let keys = [archive_key.clone(), manifest_key.clone()];
    assert!(s3.objects(&keys).is_empty(), "nothing is written with refused credentials");

    set_secret(&format!("{}:{}", s3.access_key, s3.secret_key));
    // the older backup's archive changes in the blob store: it must not go out
    let older_get = json!({ "organizationId": org_id, "backupId": older });
    let older_record = ok(server, admin, "backups.get", older_get.clone());
    let older_path = object_file(data, older_record["objects"][0]["key"].as_str().unwrap());
    let mut bytes = std::fs::read(&older_path).unwrap();
    bytes[0] ^= 0x01;
    std::fs::write(&older_path, &bytes).unwrap();
    for id in [older, backup_id] {
        // both were queued for the new target; ask again now rather than after the delay
        ok(server, admin, "backups.replicate", json!({ "organizationId": org_id, "backupId": id }));
    }
    let done = replica("complete");
    assert!(!done.to_string().contains(&s3.secret_key), "{done}");
    let there = s3.objects(&keys);
    let object = &done["objects"][0];
    assert_eq!(format!("{prefix}/{}", object["key"].as_str().unwrap()), archive_key);
    let copy = &there[&archive_key];
    assert_eq!(
        (copy.len() as u64, hex::encode(Sha256::digest(copy))),
        (object["size"].as_u64().unwrap(), object["sha256"].as_str().unwrap().to_string())
    );
    let manifest: Value = serde_json::from_slice(&there[&manifest_key]).unwrap();
    assert_eq!((manifest["id"].as_str(), &manifest["backup"]["objects"]), (Some(backup_id), &done["objects"]), "{manifest}");
    // the manifest lives only on the far side: here the record is the manifest
    assert_eq!(done["replica"]["target"], format!("{}/{}/{prefix}", s3.endpoint, s3.bucket), "{done}");
    let refused_copy = eventually("the changed backup refused", DONE, || {
        let backup = ok(server, admin, "backups.get", older_get.clone());
        if backup["replicaState"] == "failed" && backup["replica"]["reason"]["code"] == "backup-corrupt" {
            Ok(backup)
        } else {
            Err(backup.to_string())
        }
    });
    assert_eq!(refused_copy["state"], "corrupt", "a changed archive marks the backup corrupt: {refused_copy}");
    let older_keys = [format!("{prefix}/backups/{older}/volumes.tar.gz"), format!("{prefix}/backups/{older}/manifest.json")];
    assert!(s3.objects(&older_keys).is_empty(), "nothing of a corrupt backup goes out");

    // ---- Capstan's own copy gone: a restore brings every object back from the target, checks
    // it against the record, and restores from it ----
    // the files beside the database (which the restore puts back as its closure)
    let files = |volume: &Path| -> BTreeMap<String, Vec<u8>> { tree(volume).into_iter().filter(|(k, _)| !k.starts_with("db/")).collect() };
    let backed_up = files(volume);
    std::fs::write(volume.join("a.txt"), "after the copy went out\n").unwrap();
    let objects = done["objects"].as_array().unwrap();
    for object in objects {
        std::fs::remove_file(object_file(data, object["key"].as_str().unwrap())).unwrap();
    }
    let restore = ok(server, admin, "backups.restore", get.clone());
    let restore = settled(server, admin, "backups.getRestore", json!({ "organizationId": org_id, "restoreId": restore["id"] }));
    assert_eq!(restore["state"], "complete", "{restore}");
    assert_eq!(files(volume), backed_up, "restored byte for byte from the external target's copy");
    for object in objects {
        let back = std::fs::read(object_file(data, object["key"].as_str().unwrap())).unwrap();
        assert_eq!(hex::encode(Sha256::digest(&back)), object["sha256"].as_str().unwrap(), "the object is Capstan's again, as recorded");
    }
    assert_eq!(ok(server, admin, "backups.get", get.clone())["state"], "complete");
}
