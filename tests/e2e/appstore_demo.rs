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

    // ---- the first --dev --demo start, with no engine answering: nothing starts, and it says why ----
    let mut cmd = dev_command(&data);
    cmd.arg("--demo")
        .env("CAPSTAN_DEV_ENGINE", format!("unix://{}", tmp.path().join("no-engine.sock").display()))
        .env("CAPSTAN_AGENT_BINARY", crate::nodes::agent_binary());
    let server = Capstan::start(cmd);
    let said = server.wait_for_stderr("the demo runs no node of its own");
    assert!(said.contains("no container engine answers at unix://"), "{said}");
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

/// What a test started beside the dev host: stopped, and the engine's containers removed, however
/// the test ends.
struct Peers {
    children: Vec<std::process::Child>,
    engine_dir: std::path::PathBuf,
}

impl Drop for Peers {
    fn drop(&mut self) {
        crate::runtime::remove_containers(None, &self.engine_dir);
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `curl -fsS` of `url` (with `extra` arguments first); its body, or why not.
fn curl(extra: &[&str], url: &str) -> Result<String, String> {
    let out =
        std::process::Command::new("curl").args(["-fsS", "--max-time", "5"]).args(extra).arg(url).output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Where a container engine answers, `--demo` runs a node of its own and the demo's Uptime Kuma
/// starts on it: its catalog image names a tag, which the runtime resolves to the digest its
/// registry answers, and the node pulls that digest. No registry outside is reachable here, so a
/// local distribution registry stands in for Docker Hub (`CAPSTAN_IMAGE_MIRRORS` for Capstan,
/// a registries.conf mirror for the engine) holding a small image under Uptime Kuma's name that
/// answers on its port (busybox httpd on 3001); everything else is what a newcomer runs.
#[test]
fn serve_dev_demo_starts_its_app_on_a_node_of_its_own_where_an_engine_answers() {
    if crate::runtime::skipped() {
        return;
    }
    let registry_binary = std::path::Path::new("/usr/bin/docker-registry");
    if !registry_binary.is_file() {
        assert!(
            std::env::var_os("CAPSTAN_TEST_REQUIRE_ENGINE").is_none(),
            "the demo node test cannot run: /usr/bin/docker-registry is missing (apt-get install docker-registry)"
        );
        eprintln!("skipped: /usr/bin/docker-registry is missing (apt-get install docker-registry)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let engine_dir = tmp.path().join("engine");
    let mut peers = Peers { children: Vec::new(), engine_dir: engine_dir.clone() };

    // ---- a registry standing in for Docker Hub, holding the stand-in under the demo's name ----
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = tmp.path().join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            tmp.path().join("registry").display()
        ),
    )
    .unwrap();
    let registry_log = std::fs::File::create(tmp.path().join("registry.log")).unwrap();
    peers.children.push(
        std::process::Command::new(registry_binary)
            .arg("serve")
            .arg(&config)
            .stdout(registry_log.try_clone().unwrap())
            .stderr(registry_log)
            .spawn()
            .unwrap(),
    );
    eventually("the registry answers", Duration::from_secs(30), || curl(&[], &format!("http://127.0.0.1:{port}/v2/")));
    let images = crate::runtime::Images::build(tmp.path(), &["kuma"]);
    let reference = format!("docker://127.0.0.1:{port}/louislam/uptime-kuma:1.23.16");
    crate::runtime::run("skopeo", &["copy", "--quiet", "--dest-tls-verify=false", &images.archive("kuma"), &reference]);
    let digest =
        crate::runtime::run("skopeo", &["inspect", "--tls-verify=false", "--format", "{{.Digest}}", &reference]).trim().to_string();
    assert!(digest.starts_with("sha256:"), "{digest}");

    // ---- an engine on this machine whose Docker Hub is that registry ----
    let registries = format!(
        "[[registry]]\nprefix = \"docker.io\"\nlocation = \"docker.io\"\n[[registry.mirror]]\nlocation = \"127.0.0.1:{port}\"\ninsecure = true\n"
    );
    peers.children.push(crate::runtime::spawn_engine(None, &engine_dir, &registries));
    let socket = engine_dir.join("engine.sock");
    eventually("the engine answers", Duration::from_secs(60), || {
        curl(&["--unix-socket", &socket.display().to_string()], "http://engine/v1.41/version")
    });

    // ---- the newcomer's start: the host runs its node and the demo's app starts there ----
    let data = tmp.path().join("data");
    let mut cmd = dev_command(&data);
    cmd.args(["--demo", "--engine", &format!("unix://{}", socket.display())])
        .env("CAPSTAN_IMAGE_MIRRORS", format!("docker.io=http://127.0.0.1:{port}"))
        .env("CAPSTAN_AGENT_BINARY", crate::nodes::agent_binary());
    let server = Capstan::start(cmd);
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let admin = server.login("admin", &password);
    server.wait_for_stderr("the demo's node runs on this machine");
    wait_for_appstore(&server, &admin);
    let page = eventually("the demo's Uptime Kuma answers on this machine", crate::runtime::CONVERGE * 2, || {
        curl(&[], "http://127.0.0.1:3001/").map_err(|e| {
            let log = std::fs::read_to_string(data.join("demo-node/agent.log")).unwrap_or_default();
            let tail: String = log.lines().rev().take(15).collect::<Vec<_>>().join("\n");
            format!("{e}\nthe agent's last lines (newest first):\n{tail}")
        })
    });
    assert_eq!(page, "kuma\n");
    // the start said what it started, by the App Store demo's own answer
    server.wait_for_stderr("the demo's status start on this machine's node");
    let ok = |method: &str, body: Value| server.call_as(&admin, method, &body).expect_json(200);
    let org = ok("organizations.list", json!({}))["items"].as_array().unwrap().iter().find(|o| o["name"] == "demo").unwrap()["id"].clone();
    let services = ok("services.list", json!({ "organizationId": org }));
    let status_service = services["items"].as_array().unwrap().iter().find(|s| s["name"] == "status").unwrap().clone();
    assert_eq!(status_service["image"], "docker.io/louislam/uptime-kuma:1.23.16", "the service keeps the catalog's tag");
    let status = eventually("the demo app's target converged", crate::runtime::CONVERGE, || {
        let status = ok("runtime.getServiceStatus", json!({ "serviceId": status_service["id"] }));
        if status["targets"][0]["verdict"]["state"] == "converged" { Ok(status) } else { Err(status.to_string()) }
    });
    // the tag ran as the digest its registry answered, and the node says it runs exactly that
    assert_eq!(status["imagePlan"]["digest"], digest.as_str(), "{status}");
    assert_eq!(status["imagePlan"]["image"], "docker.io/louislam/uptime-kuma:1.23.16", "{status}");
    assert_eq!(status["targets"][0]["slots"][0]["imageDigest"], digest.as_str(), "{status}");
    let nodes = ok("nodes.list", json!({}));
    assert!(nodes["items"].as_array().unwrap().iter().any(|n| n["name"] == "capstan-dev" && n["live"] == true), "{nodes}");
    // the other demo services are installed, not started
    for name in ["git", "cache"] {
        let id = services["items"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap()["id"].clone();
        assert_eq!(ok("runtime.getServiceStatus", json!({ "serviceId": id }))["targets"], json!([]), "{name}");
    }
    drop(server);
    drop(peers);
}
