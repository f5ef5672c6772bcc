//! The kill -9 suite (issue 15, "Hardening"): a node killed with SIGKILL in the middle of a
//! migration, a plugin upgrade, a secrets rewrap, a catalog activation, a lease handover and a
//! two-phase service delete; restarted on the same data, it finds the state entirely before or
//! entirely after the operation, never between, and the work resumes.
//!
//! Each scenario arms a crash point (`capstan_core::crash`: `CAPSTAN_CRASH_AT=<point>` makes a
//! debug build kill itself with SIGKILL when it reaches the point) placed between the halves of
//! the operation, sees the process die there, restarts without it, and checks the invariant it
//! names. The rewrap is also killed from outside at a few moments (timing-based, as a real
//! `kill -9` lands).

use crate::fleet::stop_when_serving;
use crate::support::*;
use capstan_core::crash::{CRASH_AT, CRASH_LINE};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long resumed work may take to finish after the restart.
const RESUME: Duration = Duration::from_secs(30);

/// `cmd` armed to kill itself at crash point `point`.
fn armed(mut cmd: Command, point: &str) -> Command {
    cmd.env(CRASH_AT, point);
    cmd
}

/// Wait until `server` reports reaching crash point `point` and is dead by SIGKILL.
fn crashed_at(server: Capstan, point: &str) -> Exited {
    server.wait_for_stderr(&format!("{CRASH_LINE}{point}"));
    // it killed itself; this reaps it (a SIGKILL to a dead process changes nothing)
    let exited = server.kill_hard();
    assert_eq!(exited.status.signal(), Some(9), "the process should die by SIGKILL at {point}: {:?}", exited.status);
    exited
}

/// `POST <url>/api/v1/<method>` as the holder of `token`: the status and body, or the transport
/// error (the server died before answering). Unlike [`Capstan::call_as`], a dead server is an
/// answer here.
fn post(url: &str, token: &str, method: &str, body: &Value) -> Result<(u16, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .max_idle_connections(0)
        .build()
        .into();
    let mut answer = agent
        .post(format!("{url}/api/v1/{method}"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .send(body.to_string())
        .map_err(|e| e.to_string())?;
    Ok((answer.status().as_u16(), answer.body_mut().read_to_string().unwrap_or_default()))
}

/// Call `method` on a server armed to die inside it: the connection ends without an answer.
fn call_dying(server: &Capstan, token: &str, method: &str, body: &Value) {
    if let Ok((status, body)) = post(&server.url(""), token, method, body) {
        panic!("{method} should die without answering, got HTTP {status}: {body}");
    }
}

/// A dev server on `data` with the test administrator, armed at `point` if any, and its token.
fn dev(data: &Path, point: Option<&str>) -> (Capstan, String) {
    let cmd = with_test_admin(dev_command(data));
    let server = Capstan::start(match point {
        Some(point) => armed(cmd, point),
        None => cmd,
    });
    let token = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    (server, token)
}

/// The outbox's events of `kind` about `subject`, read from the store.
fn events_of(db: &Path, kind: &str, subject: &str) -> usize {
    with_store(db, &[], |store| async move {
        capstan::events::declare(&store).await.unwrap();
        let all = capstan::events::read_after(&store, 0, 10_000).await.unwrap();
        all.iter().filter(|e| e.kind == kind && e.subject == subject).count()
    })
}

/// Two-phase delete: killed after the mark (`service-delete:marked`), then inside the
/// finalizer's transaction (`service-delete:finalizing`). After each restart the service is
/// whole and `deleting`, its secret untouched; the finalizer task then finishes it.
#[test]
fn a_service_delete_killed_between_or_inside_its_phases_is_finished_by_the_finalizer() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let db = data.join("capstan.sqlite");

    let (server, token) = dev(&data, Some("service-delete:marked"));
    // the periodic finalizer stays off until the end: run at a minute's turn right after a
    // restart, it would reach the crash point before the test does
    let finalizer = json!({ "id": "host.finalize-deleted-services", "enabled": false });
    ok(&server, &token, "tasks.setEnabled", finalizer);
    let org = ok(&server, &token, "organizations.create", json!({ "name": "acme" }));
    let service = ok(&server, &token, "services.create", json!({ "name": "web", "organizationId": org["id"], "image": "nginx" }));
    let id = service["id"].as_str().unwrap().to_string();
    let owner = json!({ "kind": "service", "serviceId": id });
    let generate = json!({ "generate": { "length": 16, "alphabet": "hex" } });
    let secret = ok(&server, &token, "secrets.create", json!({ "owner": owner, "key": "DB_PASSWORD", "value": generate }));
    call_dying(&server, &token, "services.delete", &json!({ "id": id, "expectedRevision": service["revision"] }));
    crashed_at(server, "service-delete:marked");

    // phase one is durable and whole: marked, its event written with it, nothing finalized
    let (server, token) = dev(&data, Some("service-delete:finalizing"));
    let marked = ok(&server, &token, "services.get", json!({ "id": id }));
    assert_eq!(marked["state"], "deleting", "after the mark, the service is deleting: {marked}");
    assert_eq!(events_of(&db, "service.deleting", &id), 1, "the mark and its event commit together");
    assert_eq!(ok(&server, &token, "secrets.get", json!({ "id": secret["id"] }))["state"], "active", "nothing is finalized yet");
    let update = json!({ "id": id, "expectedRevision": marked["revision"], "image": "nginx:2" });
    server.call_as(&token, "services.update", &update).expect_error(400, "service-deleting");
    // asking again runs the finalizer in the request; killed inside its transaction
    call_dying(&server, &token, "services.delete", &json!({ "id": id, "expectedRevision": marked["revision"] }));
    crashed_at(server, "service-delete:finalizing");

    // the half-written finalizer transaction left nothing: still deleting, its secret active
    let (server, token) = dev(&data, None);
    let still = ok(&server, &token, "services.get", json!({ "id": id }));
    assert_eq!(
        (still["state"].as_str(), &still["revision"]),
        (Some("deleting"), &marked["revision"]),
        "a killed finalizer commits nothing: {still}"
    );
    assert_eq!(ok(&server, &token, "secrets.get", json!({ "id": secret["id"] }))["state"], "active", "a killed finalizer revokes nothing");
    assert_eq!(events_of(&db, "service.deleted", &id), 0, "no deleted event without the deletion");

    // the work resumes: the periodic finalizer (run now rather than at the next minute) ends it
    ok(&server, &token, "tasks.setEnabled", json!({ "id": "host.finalize-deleted-services", "enabled": true }));
    let run = ok(&server, &token, "tasks.trigger", json!({ "id": "host.finalize-deleted-services" }));
    let ended = eventually("the finalizer run ending", RESUME, || {
        let e = ok(&server, &token, "tasks.getExecution", json!({ "id": run["id"] }));
        if e["status"] == "running" { Err(e.to_string()) } else { Ok(e) }
    });
    assert_eq!(ended["status"], "succeeded", "{ended}");
    server.call_as(&token, "services.get", &json!({ "id": id })).expect_error(404, "service-not-found");
    assert_eq!(ok(&server, &token, "secrets.get", json!({ "id": secret["id"] }))["state"], "revoked", "its secret goes with it");
    assert_eq!(events_of(&db, "service.deleted", &id), 1, "deleted once");
}

/// Lease handover: the coordinator drains and gives the lease up; the node taking it is killed
/// right after its conditional write (`lease:taken`). The bucket names the dead node under the
/// next fence (the take is one object, whole); restarted, it takes the lease again under a
/// higher fence and places under it. Throughout, no fence ever had two holders and the fence
/// never went back.
#[test]
fn a_node_killed_as_it_takes_the_lease_over_leaves_one_holder_per_fence() {
    use crate::fleet::{Fleet, coordinators, fence, wait_all_live};
    use capstan::fleet::runtime::ASSIGNMENTS_KEY;
    use std::sync::atomic::{AtomicBool, Ordering};

    let fleet = Fleet::fast();
    let a = fleet.start("a");
    let a_id = a.node_id();
    wait_all_live(&fleet, std::slice::from_ref(&a_id));
    let first = fence(&fleet.lease().expect("the only node holds the lease"));

    // every (fence, holder) the bucket shows while the lease changes hands
    let stop = AtomicBool::new(false);
    let seen = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut seen: BTreeMap<u64, Vec<String>> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(lease) = fleet.lease() {
                    let holders = seen.entry(fence(&lease)).or_default();
                    let holder = lease["holder"].as_str().unwrap().to_string();
                    if !holders.contains(&holder) {
                        holders.push(holder);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        });

        // a failing assertion below must end the watcher too, or the scope would wait for it forever
        let _stop_watching = crate::support::StopOnDrop(&stop);
        let b = Capstan::start(armed(fleet.serve_on_loopback("b"), "lease:taken"));
        let b_id = b.node_id();
        stop_when_serving(a); // draining gives the lease up: b takes it, and dies
        crashed_at(b, "lease:taken");
        let taken = fleet.lease().unwrap();
        assert_eq!(
            (taken["holder"].as_str(), fence(&taken)),
            (Some(b_id.as_str()), first + 1),
            "the take is whole: the dead node holds the next fence"
        );

        // restarted (same state directory, same id), it takes the lease again at once, higher
        let b = fleet.start("b");
        let retaken = eventually("the restarted node holding the lease again", RESUME, || match fleet.lease() {
            Some(l) if l["holder"] == b_id.as_str() && fence(&l) > first + 1 => Ok(l),
            other => Err(format!("{other:?}")),
        });
        let a = fleet.start("a");
        let listing = wait_all_live(&fleet, &[a_id.clone(), b_id.clone()]);
        assert_eq!(coordinators(&listing), vec![b_id.clone()], "one coordinator: {listing}");
        eventually("placements decided under the new fence", RESUME, || match fleet.object(ASSIGNMENTS_KEY) {
            Some(p) if p["fence"] == retaken["fence"] => Ok(()),
            other => Err(format!("{other:?}")),
        });
        stop.store(true, Ordering::Relaxed);
        drop((a, b));
        watcher.join().unwrap()
    });
    for (fence, holders) in &seen {
        assert_eq!(holders.len(), 1, "no fence has two holders: fence {fence} was held by {holders:?} (all seen: {seen:?})");
    }
    assert!(seen.contains_key(&first) && seen.keys().any(|f| *f > first + 1), "the watch saw the lease move: {seen:?}");
}

/// Every secret version in the dev store under `data`, by id: the KEK its data key is wrapped
/// by and its plaintext, opened with the data directory's keyring. A version that does not open
/// fails the test, naming it.
fn open_every_version(data: &Path) -> BTreeMap<String, (String, Vec<u8>)> {
    use capstan::secrets::envelope;
    use capstan::secrets::methods::{SECRETS, Secret, VERSIONS, Version, declare, material_context};
    let keyring = capstan::keyring::Keyring::load(&data.join("keyring.json")).unwrap();
    with_store(&data.join("capstan.sqlite"), &[], |store| async move {
        declare(&store).await.unwrap();
        let mut out = BTreeMap::new();
        let mut cursor: Option<String> = None;
        loop {
            let after = cursor.as_deref();
            let page = store.transact(|tx| async move { tx.scan(VERSIONS, after, 500).await }).await.unwrap();
            for doc in page.documents {
                let version: Version = serde_json::from_value(doc.data).unwrap();
                let secret_id = version.secret_id.as_str();
                let secret = store.transact(|tx| async move { tx.require(SECRETS, secret_id).await }).await.unwrap();
                let secret: Secret = serde_json::from_value(secret.data).unwrap();
                let context = material_context(&version.secret_id, &doc.id, &secret);
                let plaintext = envelope::open(&keyring, &context, &version.envelope)
                    .unwrap_or_else(|e| panic!("every version stays readable: {} does not open: {e}", doc.id));
                out.insert(doc.id, (version.envelope.kek_id, plaintext.to_vec()));
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return out,
            }
        }
    })
}

/// How many versions each KEK wraps.
fn by_kek(versions: &BTreeMap<String, (String, Vec<u8>)>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (kek, _) in versions.values() {
        *counts.entry(kek.clone()).or_default() += 1;
    }
    counts
}

/// Secrets rewrap after a KEK rotation, killed from outside at a few moments (timing-based) and
/// then at a crash point after the seventh version it moved (`secrets-rewrap:version-rewrapped#7`).
/// After every kill each version is whole under one KEK or the other, opens to the same value,
/// and the rewrap asked again finishes what is left.
#[test]
fn a_rewrap_killed_anywhere_leaves_every_version_whole_and_finishes_when_asked_again() {
    const SECRETS: usize = 150;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let data = dir.path().join("data");

    let (server, token) = dev(&data, None);
    let org = ok(&server, &token, "organizations.create", json!({ "name": "acme" }));
    let generate = json!({ "generate": { "length": 24, "alphabet": "hex" } });
    // four writers, each on its own service (one service's manifest is one document)
    std::thread::scope(|scope| {
        for part in 0..4 {
            let service = json!({ "name": format!("web-{part}"), "organizationId": org["id"], "image": "nginx" });
            let owner = json!({ "kind": "service", "serviceId": ok(&server, &token, "services.create", service)["id"] });
            let (server, token, generate) = (&server, &token, &generate);
            scope.spawn(move || {
                for n in (part..SECRETS).step_by(4) {
                    let body = json!({ "owner": owner, "key": format!("KEY_{n}"), "value": generate });
                    let created = ok(server, token, "secrets.create", body);
                    if n % 10 == 0 {
                        let rotate = json!({ "id": created["id"], "expectedVersionId": created["currentVersionId"], "value": generate });
                        ok(server, token, "secrets.rotate", rotate);
                    }
                }
            });
        }
    });
    stop_when_serving(server);
    let values = open_every_version(&data);
    let total = values.len();
    assert_eq!(total, SECRETS + SECRETS / 10);
    let old_kek = values.values().next().unwrap().0.clone();

    let mut rotate = capstan();
    rotate.args(["keyring", "rotate", "--kek-id", "kek-crash-second", "--keyring"]).arg(data.join("keyring.json"));
    assert!(run_to_exit(rotate).status.success(), "capstan keyring rotate");

    // after each kill: every version opens to its value, under exactly one of the two KEKs
    let check = |when: &str| -> usize {
        let now = open_every_version(&data);
        assert_eq!(now.len(), total, "{when}: no version lost or added");
        for (id, (kek, plaintext)) in &now {
            assert_eq!(plaintext, &values[id].1, "{when}: version {id} opens to the value it had");
            assert!(*kek == old_kek || kek == "kek-crash-second", "{when}: version {id} under an unknown KEK {kek}");
        }
        by_kek(&now).get("kek-crash-second").copied().unwrap_or(0)
    };

    // ---- killed at a crash point after the seventh version it moved ----
    let (server, token) = dev(&data, Some("secrets-rewrap:version-rewrapped#7"));
    call_dying(&server, &token, "secrets.rewrap", &json!({ "limit": 500 }));
    crashed_at(server, "secrets-rewrap:version-rewrapped#7");
    let mut moved = check("killed after the seventh version moved");
    assert_eq!(moved, 7, "exactly the versions moved before the kill are under the new KEK");

    // ---- killed from outside while the rewrap runs, at a few moments ----
    for offset in [10, 40, 90] {
        let (server, token) = dev(&data, None);
        let url = server.url("");
        let request = std::thread::spawn(move || post(&url, &token, "secrets.rewrap", &json!({ "limit": 500 })));
        std::thread::sleep(Duration::from_millis(offset));
        assert_eq!(server.kill_hard().status.signal(), Some(9));
        if let Ok(answer) = request.join().unwrap() {
            eprintln!("the rewrap answered before the kill {offset} ms in: {answer:?}");
        }
        let now = check(&format!("killed {offset} ms into a rewrap"));
        assert!(now >= moved, "a rewrap never moves a version back ({moved} then {now})");
        eprintln!("kill -9 {offset} ms into a rewrap: {now} of {total} versions under the new KEK");
        moved = now;
    }

    // ---- asked again, page by page, it finishes what is left ----
    let (server, token) = dev(&data, None);
    let (mut rewrapped, mut cursor) = (0, Value::Null);
    loop {
        let page = ok(&server, &token, "secrets.rewrap", json!({ "limit": 50, "cursor": cursor }));
        rewrapped += page["rewrapped"].as_u64().unwrap() as usize;
        cursor = page["nextCursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!(rewrapped, total - moved, "the rewrap asked again moves exactly what the kills left");
    assert_eq!(check("after the rewrap finished"), total, "every version is under the new KEK");
}

/// Catalog activation: the envelope's chunks are stored, then the pointer moves, then services
/// naming a version of the new catalog adopt its snapshot. Killed before the pointer's commit
/// (`plugin-commit:p_appstore__catalog#2`, the second activation), the last-known-good catalog
/// is still active and verifies; killed after it (`plugin-committed:p_appstore__catalog`), the
/// new one is active and the snapshot is adopted by the first reconcile pass after the restart,
/// nobody asking.
#[test]
fn a_catalog_activation_killed_before_or_after_its_pointer_moves_is_before_or_after_and_adopts() {
    use crate::appstore::{envelope, wait_for_appstore};
    use capstan_catalog::{PublisherKey, SigningKey};

    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let data = dir.path().join("data");
    let publisher = SigningKey::from_bytes(&[42; 32]);
    let status = |server: &Capstan, token: &str| ok(server, token, "appstore.getCatalogStatus", json!({}));

    let (server, token) = dev(&data, Some("plugin-commit:p_appstore__catalog#2"));
    wait_for_appstore(&server, &token);
    let settings = ok(&server, &token, "settings.get", json!({}));
    let trust = json!({ "appstore.trustedCatalogKeys": [PublisherKey::from(&publisher).to_string()] });
    ok(&server, &token, "settings.update", json!({ "expectedRevision": settings["revision"], "set": trust }));
    let first = ok(&server, &token, "appstore.importCatalog", json!({ "envelope": envelope(&["1.0.0"], 1, &publisher) }));
    assert_eq!(first["outcome"], "activated");
    // a service naming a version only the second catalog offers: adopted when that one is active
    let org = ok(&server, &token, "organizations.create", json!({ "name": "acme" }));
    let named = json!({ "name": "wiki", "organizationId": org["id"], "image": "registry.example.com/wiki:1.1.0", "template": { "appId": "wiki", "version": "1.1.0" } });
    let service = ok(&server, &token, "services.create", named)["id"].clone();
    let second = envelope(&["1.0.0", "1.1.0"], 2, &publisher);
    call_dying(&server, &token, "appstore.importCatalog", &json!({ "envelope": second }));
    crashed_at(server, "plugin-commit:p_appstore__catalog#2");

    // before: the first catalog, still verifying; the second's stored chunks are no catalog
    let (server, token) = dev(&data, Some("plugin-committed:p_appstore__catalog"));
    wait_for_appstore(&server, &token);
    let before = status(&server, &token);
    assert_eq!(
        (before["available"].as_bool(), before["active"]["revision"].as_u64()),
        (Some(true), Some(1)),
        "killed before its pointer moved, the last-known-good catalog stays active: {before}"
    );
    let unadopted = ok(&server, &token, "services.get", json!({ "id": service }));
    assert!(unadopted["template"].get("templateDigest").is_none(), "nothing adopted from a catalog never active: {unadopted}");
    call_dying(&server, &token, "appstore.importCatalog", &json!({ "envelope": second }));
    crashed_at(server, "plugin-committed:p_appstore__catalog");

    // after: the second catalog, and the adoption the kill cut off happens by itself
    let (server, token) = dev(&data, None);
    wait_for_appstore(&server, &token);
    let after = status(&server, &token);
    assert_eq!(after["active"]["revision"].as_u64(), Some(2), "killed after its pointer moved, the new catalog is active: {after}");
    let adopted = eventually("the reconcile pass after the restart adopting the snapshot", RESUME, || {
        let got = ok(&server, &token, "services.get", json!({ "id": service }));
        if got["template"]["templateDigest"].is_string() { Ok(got) } else { Err(got.to_string()) }
    });
    assert_eq!(adopted["template"]["version"], "1.1.0", "{adopted}");
    let again = ok(&server, &token, "appstore.importCatalog", json!({ "envelope": second }));
    assert_eq!(again["outcome"], "unchanged", "the activation is complete: {again}");
}

/// The example plugin's component, built for wasm32-wasip2 into the directory the host's plugin
/// tests use (so a built one is reused); `None` when the target is missing (the reason printed,
/// unless `CAPSTAN_TEST_REQUIRE_PLUGINS=1` makes that a failure).
pub(crate) fn example_component() -> Option<Vec<u8>> {
    use crate::plugins::{wasm_target_available, workspace};
    if !wasm_target_available() {
        return None;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
        .join("wasm-plugins");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace())
        .args(["build", "--release", "--target", "wasm32-wasip2", "-p", "capstan-plugin-example", "--target-dir"])
        .arg(&target)
        .status()
        .expect("running cargo");
    assert!(status.success(), "building the example plugin: {status:?}");
    Some(std::fs::read(target.join("wasm32-wasip2/release/capstan_plugin_example.wasm")).unwrap())
}

/// The example plugin at `version`, signed by `key`.
pub(crate) fn example_bundle(component: &[u8], version: &str, key: &capstan_catalog::SigningKey) -> Vec<u8> {
    let manifest = std::fs::read_to_string(crate::plugins::workspace().join("plugins/example/capstan-plugin.toml")).unwrap();
    assert!(manifest.contains("version = \"0.1.0\""), "{manifest}");
    let manifest = manifest.replacen("version = \"0.1.0\"", &format!("version = \"{version}\""), 1);
    let pages = capstan::plugins::bundle::read_page_templates(&crate::plugins::workspace().join("plugins/example")).unwrap();
    let mut bundle = capstan::plugins::bundle::Bundle::new(manifest, component.to_vec()).unwrap().with_pages(pages).unwrap();
    bundle.sign(key);
    bundle.to_bytes()
}

/// Upload a bundle; the upload id `plugins.install` / `plugins.upgrade` name.
fn upload(server: &Capstan, token: &str, bundle: &[u8]) -> Value {
    let bearer = format!("Bearer {token}");
    server.request("POST", "/api/v1/uploads/plugin-bundle", &[("authorization", &bearer)], Some(bundle)).expect_json(200)["upload"].clone()
}

/// The example plugin's record of the data migrations it ran, read from the store.
fn example_migrations(db: &Path) -> Value {
    read_doc(db, "p_example__meta", "migrations").map(|d| d.data["migrations"].clone()).unwrap_or(Value::Null)
}

/// Plugin upgrade: killed after the new version's data migration ran and its bundle was stored,
/// before the registry names it (`plugin-upgrade:before-record`). The restart loads the old
/// version, whole (the registry untouched, its data there, serving); the upgrade asked again
/// migrates again (steps are idempotent) and swaps.
#[test]
fn a_plugin_upgrade_killed_before_its_record_keeps_the_old_version_serving_and_completes_when_asked_again() {
    let Some(component) = example_component() else { return };
    let key = capstan::plugins::bundle::generate_key();
    let publisher = capstan::plugins::bundle::PublisherKey::from(&key).to_string();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let db = data.join("capstan.sqlite");
    let start = |point: Option<&str>| {
        let mut cmd = with_test_admin(dev_command(&data));
        cmd.env("CAPSTAN_TRUSTED_PUBLISHERS", &publisher);
        let server = Capstan::start(match point {
            Some(point) => armed(cmd, point),
            None => cmd,
        });
        let token = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
        (server, token)
    };
    let all = json!(["all-requested"]);

    let (server, token) = start(Some("plugin-upgrade:before-record"));
    let v1 = upload(&server, &token, &example_bundle(&component, "0.1.0", &key));
    ok(&server, &token, "plugins.install", json!({ "upload": v1, "approve": all }));
    ok(&server, &token, "example.putNote", json!({ "id": "n1", "text": "kept" }));
    let v2 = upload(&server, &token, &example_bundle(&component, "0.2.0", &key));
    call_dying(&server, &token, "plugins.upgrade", &json!({ "upload": v2, "approve": all }));
    crashed_at(server, "plugin-upgrade:before-record");
    assert_eq!(
        example_migrations(&db),
        json!([{ "from": null, "to": "0.1.0" }, { "from": "0.1.0", "to": "0.2.0" }]),
        "the kill came after the new version's data migration"
    );

    // before: the registry names 0.1.0 with nothing to roll back to, and 0.1.0 serves
    let (server, token) = start(None);
    let plugin = ok(&server, &token, "plugins.get", json!({ "id": "example" }));
    assert_eq!(
        (plugin["version"].as_str(), plugin["status"].as_str(), &plugin["previousVersion"]),
        (Some("0.1.0"), Some("running"), &Value::Null),
        "the old version stays installed and loaded: {plugin}"
    );
    assert_eq!(ok(&server, &token, "example.greet", json!({ "name": "Ada" }))["version"], "0.1.0");
    assert_eq!(ok(&server, &token, "example.getNote", json!({ "id": "n1" }))["text"], "kept");

    // asked again, the upgrade completes: migrated (again: idempotent steps), recorded, swapped
    let v2 = upload(&server, &token, &example_bundle(&component, "0.2.0", &key));
    let upgraded = ok(&server, &token, "plugins.upgrade", json!({ "upload": v2, "approve": all }));
    assert_eq!((upgraded["version"].as_str(), upgraded["previousVersion"].as_str()), (Some("0.2.0"), Some("0.1.0")), "{upgraded}");
    assert_eq!(ok(&server, &token, "example.greet", json!({ "name": "Ada" }))["version"], "0.2.0");
    assert_eq!(ok(&server, &token, "example.getNote", json!({ "id": "n1" }))["text"], "kept");
    assert_eq!(
        example_migrations(&db).as_array().map(|m| m.iter().filter(|s| s["to"] == "0.2.0").count()),
        Some(2),
        "the interrupted upgrade's migration ran again when it was asked again"
    );
    drop(server);
    let (server, token) = start(None);
    let plugin = ok(&server, &token, "plugins.get", json!({ "id": "example" }));
    assert_eq!((plugin["version"].as_str(), plugin["status"].as_str()), (Some("0.2.0"), Some("running")), "{plugin}");
}

/// Where [`migration_child_process`] migrates: the SQLite file, set only for the child.
const CHILD_DB: &str = "CAPSTAN_CRASH_MIGRATION_DB";
/// The collection the test chain fills and then stamps.
const ITEMS: &str = "crash_items";
const ITEM_COUNT: usize = 200;
const ITEM_BATCH: usize = 20;

/// A two-step chain over [`ITEMS`]: `fill` inserts the items a batch per transaction (crash
/// point `migrate-test:batch-written` after each), `stamp` marks each one. Both idempotent, as
/// every step must be.
fn test_chain() -> capstan::migrate::Chain {
    use capstan::migrate::{Chain, Step};
    let fill = Step::new("fill", "1.0.0", "1.1.0", |ctx| async move {
        for batch in 0..ITEM_COUNT / ITEM_BATCH {
            ctx.store
                .transact(|tx| async move {
                    for n in batch * ITEM_BATCH..(batch + 1) * ITEM_BATCH {
                        let id = format!("item-{n:04}");
                        if tx.get(ITEMS, &id).await?.is_none() {
                            tx.insert(ITEMS, &id, json!({ "n": n })).await?;
                        }
                    }
                    Ok(())
                })
                .await?;
            capstan_core::crash_point("migrate-test:batch-written");
        }
        Ok(())
    });
    let stamp = Step::new("stamp", "1.1.0", "1.2.0", |ctx| async move {
        let mut cursor: Option<String> = None;
        loop {
            let after = cursor.as_deref();
            let page = ctx.store.transact(|tx| async move { tx.scan(ITEMS, after, 50).await }).await?;
            for doc in page.documents.iter().filter(|d| d.data.get("stamped").is_none()) {
                let mut data = doc.data.clone();
                data["stamped"] = json!(true);
                let data = &data;
                ctx.store.transact(|tx| async move { tx.replace(ITEMS, &doc.id, doc.revision, data.clone()).await.map(drop) }).await?;
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(()),
            }
        }
    });
    let mut chain = Chain::new("crash-test", "1.0.0", vec![fill, stamp]);
    chain.data_collections = Some(vec![ITEMS.into()]);
    chain
}

/// Not a test of its own: [`a_migration_killed_inside_and_after_a_step_resumes_to_a_ledger_matching_the_data`]
/// runs it in a child process (this test binary again) to migrate [`test_chain`] on
/// `$CAPSTAN_CRASH_MIGRATION_DB`, so the migration can be killed for real. Without that
/// variable it does nothing.
#[test]
#[ignore = "a child process of a_migration_killed_inside_and_after_a_step_resumes_to_a_ledger_matching_the_data"]
fn migration_child_process() {
    let Some(db) = std::env::var_os(CHILD_DB) else { return };
    let lock = capstan::migrate::LockOptions {
        ttl: MIGRATION_LOCK_TTL,
        wait: Duration::from_secs(20),
        ..capstan::migrate::LockOptions::for_this_process()
    };
    let outcome = with_store(Path::new(&db), &[ITEMS], |store| async move { capstan::migrate::run(&store, &test_chain(), &lock).await });
    let outcome = outcome.unwrap_or_else(|e| panic!("the migration refused: {e}"));
    println!("migrated: {}", serde_json::to_string(&outcome).unwrap());
}

/// How long the child's migration lock lives unless renewed: a restart after a kill waits this
/// long for the dead process's lock.
const MIGRATION_LOCK_TTL: Duration = Duration::from_millis(1500);

/// Run [`migration_child_process`] on `db`, armed at `point` if any.
fn migrate_in_child(db: &Path, point: Option<&str>) -> Exited {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "crash::migration_child_process", "--ignored", "--nocapture", "--test-threads=1"]).env(CHILD_DB, db);
    match point {
        Some(point) => cmd.env(CRASH_AT, point),
        None => cmd.env_remove(CRASH_AT),
    };
    run_to_exit(cmd)
}

/// The test chain's ledger and the items as stored: (ledger, item count, stamped count).
fn migration_state(db: &Path) -> (capstan::migrate::Ledger, usize, usize) {
    let ledger = read_doc(db, capstan::migrate::LEDGER_COLLECTION, "crash-test").expect("the test chain's ledger");
    let ledger: capstan::migrate::Ledger = serde_json::from_value(ledger.data).unwrap();
    let items = with_store(db, &[ITEMS], |store| async move {
        store.transact(|tx| async move { tx.scan(ITEMS, None, capstan::store::MAX_PAGE).await }).await.unwrap().documents
    });
    let stamped = items.iter().filter(|d| d.data["stamped"] == true).count();
    (ledger, items.len(), stamped)
}

/// A migration (the store's chain machinery, in a process of its own) killed inside its first
/// step (`migrate-test:batch-written#3`), then after the step's work and before the ledger
/// records it (`migrate:step-done`). After each kill the ledger never claims a step it did not
/// finish: it stays at the version before, naming the step `running`, under the dead process's
/// lock. The next start waits for that lock to expire, runs the step again (idempotently) and
/// goes on; the end is a ledger at the target, each step once in its history, matching the data.
#[test]
fn a_migration_killed_inside_and_after_a_step_resumes_to_a_ledger_matching_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("capstan.sqlite");
    // data at the chain's floor
    insert_doc(
        &db,
        capstan::migrate::LEDGER_COLLECTION,
        "crash-test",
        json!({ "dataVersion": "1.0.0", "lock": null, "running": null, "history": [] }),
    );
    let killed = |point: &str| {
        let exited = migrate_in_child(&db, Some(point));
        assert_eq!(exited.status.signal(), Some(9), "the migration should die by SIGKILL at {point}: {exited:?}");
        assert!(exited.stderr.contains(&format!("{CRASH_LINE}{point}")), "killed at {point}: {}", exited.stderr);
        migration_state(&db)
    };

    let (ledger, items, _) = killed("migrate-test:batch-written#3");
    assert_eq!(
        (ledger.data_version.as_str(), ledger.running.as_deref(), ledger.history.len()),
        ("1.0.0", Some("fill"), 0),
        "killed inside a step, the ledger stays before it, naming it running: {ledger:?}"
    );
    assert!(ledger.lock.is_some(), "the dead process's lock is left to expire: {ledger:?}");
    assert_eq!(items, 3 * ITEM_BATCH, "what the step committed before the kill stays");

    let (ledger, items, stamped) = killed("migrate:step-done");
    assert_eq!(
        (ledger.data_version.as_str(), ledger.running.as_deref(), ledger.history.len()),
        ("1.0.0", Some("fill"), 0),
        "killed after a step's work, the ledger still does not claim it: {ledger:?}"
    );
    assert_eq!((items, stamped), (ITEM_COUNT, 0), "the step ran again to its end, adding only what was missing");

    let finished = migrate_in_child(&db, None);
    assert!(finished.status.success(), "the migration resumes and finishes: {finished:?}");
    assert!(
        finished.stdout.contains(r#""applied":["fill","stamp"]"#),
        "the interrupted step ran again, then the next: {}",
        finished.stdout
    );
    let (ledger, items, stamped) = migration_state(&db);
    let steps: Vec<&str> = ledger.history.iter().map(|e| e.step.as_str()).collect();
    assert_eq!(
        (ledger.data_version.as_str(), ledger.running.as_deref(), ledger.lock.is_none(), steps),
        ("1.2.0", None, true, vec!["fill", "stamp"]),
        "the ledger ends at the target, each step once, unlocked: {ledger:?}"
    );
    assert_eq!((items, stamped), (ITEM_COUNT, ITEM_COUNT), "the data matches the ledger");
}

/// A database binding killed between "role ready" and "secrets published"
/// (`storage-provision:role-ready`): after the restart the manager's pass provisions it again,
/// and there is one role at the server and one set of the service's secrets — not a second
/// role, not a secret for a password the role does not hold.
#[test]
fn a_database_binding_killed_between_its_role_and_its_secrets_resumes_to_one_role_and_one_secret() {
    let Some(((admin_user, admin_password, pg_port), bin)) = crate::bindings::postgres() else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (server, token) = dev(&data, None);
    let org = ok(&server, &token, "organizations.create", json!({ "name": "acme" }))["id"].as_str().unwrap().to_string();
    let cluster = ok(&server, &token, "clusters.create", json!({ "name": "edge" }))["cluster"]["id"].as_str().unwrap().to_string();
    // a node enrolled as an agent does it (no agent needs to run: provisioning is the host's)
    let code = ok(&server, &token, "nodes.createJumpCommand", json!({ "clusterId": cluster }))["code"].as_str().unwrap().to_string();
    let enroll = json!({ "protocol": "capstan-agent/1", "code": code, "hostname": "db-node", "tokenSha256": sha256_hex("node-token"),
        "agentVersion": env!("CARGO_PKG_VERSION") });
    let node = server
        .request("POST", "/agent/v1/enroll", &[("content-type", "application/json")], Some(enroll.to_string().as_bytes()))
        .expect_json(200)["nodeId"]
        .as_str()
        .unwrap()
        .to_string();
    let service = ok(&server, &token, "services.create", json!({ "name": "ledger", "organizationId": org, "image": "nginx:1.27" }));
    let service = service["id"].as_str().unwrap().to_string();
    let spec = json!({ "serviceId": service, "clusterId": cluster, "expectedRevision": null,
                       "placement": { "everyNode": false, "nodes": [node] }, "replicasPerNode": 1 });
    ok(&server, &token, "runtime.setServiceSpec", spec);
    let recipient = ok(&server, &token, "secrets.getIngressRecipient", json!({}));
    let sealed =
        crate::secrets::seal(&recipient, "nodes.setStorageEndpoint", &node, "database", admin_password.as_bytes())["sealed"].clone();
    let endpoint = json!({ "nodeId": node, "expectedRevision": null,
        "database": { "engine": "postgresql", "host": "127.0.0.1", "port": pg_port, "user": admin_user, "sealedPassword": sealed } });
    ok(&server, &token, "nodes.setStorageEndpoint", endpoint);
    server.stop();

    // killed once the role and its database exist, before any secret
    let (server, token) = dev(&data, Some("storage-provision:role-ready"));
    eventually("the bindings plugin running", RESUME, || {
        let reply = server.call_as(&token, "plugins.get", &json!({ "id": "bindings" }));
        if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
    });
    let create = json!({ "organizationId": org, "serviceId": service, "kind": "database", "engine": "postgresql", "name": "main" });
    call_dying(&server, &token, "bindings.create", &create);
    crashed_at(server, "storage-provision:role-ready");

    // restarted: the pass provisions it again, to one role and one set of secrets
    let (server, token) = dev(&data, None);
    let ready = eventually("the binding is ready after the restart", RESUME, || {
        let reply = server.call_as(&token, "bindings.list", &json!({ "organizationId": org, "serviceId": service }));
        let listed = reply.json();
        match listed["bindings"].as_array().map(Vec::as_slice) {
            Some([b]) if b["state"] == "ready" => Ok(b.clone()),
            _ => Err(listed.to_string()),
        }
    });
    let role = ready["resource"].as_str().unwrap();
    let admin_url = format!("postgres://{admin_user}:{admin_password}@127.0.0.1:{pg_port}/postgres");
    let count = |sql: String| {
        let out = Command::new(bin.join("psql")).args([admin_url.as_str(), "-X", "-A", "-t", "-c", &sql]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(count(format!("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'capstan\\_%' AND rolname = '{role}'")), "1");
    assert_eq!(count(format!("SELECT count(*) FROM pg_database WHERE datname = '{role}'")), "1");
    let listed = ok(&server, &token, "secrets.list", json!({ "owner": { "kind": "service", "serviceId": service }, "limit": 200 }));
    let active: Vec<&str> =
        listed["items"].as_array().unwrap().iter().filter(|s| s["state"] == "active").filter_map(|s| s["key"].as_str()).collect();
    let mut sorted = active;
    sorted.sort_unstable();
    assert_eq!(sorted, ["DATABASE_URL", "PGDATABASE", "PGHOST", "PGPASSWORD", "PGPORT", "PGUSER"], "one secret per name: {listed}");
    ok(&server, &token, "bindings.delete", json!({ "organizationId": org, "bindingId": ready["id"], "data": "drop" }));
    assert_eq!(count(format!("SELECT count(*) FROM pg_roles WHERE rolname = '{role}'")), "0");
}
