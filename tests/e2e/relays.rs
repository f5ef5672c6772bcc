//! Cluster relays end to end, with real processes only: `capstan serve --dev`, the real
//! `capstan-agent` (enrolled with a jump code, then run as `capstan-agent relay`), the CLI's
//! `keyring export-relay-authorization` and the HTTP API, with the example plugin (installed
//! through the API) reaching the relay by `agents.call`.
//!
//! One scenario, in order: nothing connected is refused `relay-not-connected`; the relay
//! registers (live in `relays.list`, its configuration kept private in the state directory and
//! shown by `capstan-agent status`) and answers `example.pingAgent`; a cluster change is pushed;
//! a Capstan restart is followed by the relay on its own; a rotation closes it and the re-exported
//! bearer (the same file, `--force`) brings it back without a restart; a second relay of the
//! same cluster makes the election refuse `relay-ambiguous` until it stops; and the cluster
//! cannot be deleted while its relay is connected.
//!
//! Building the example plugin needs the wasm32-wasip2 target: without it the test prints why
//! and passes (unless `CAPSTAN_TEST_REQUIRE_PLUGINS=1`), as plugins.rs does.

use crate::nodes::{agent_binary, machine_hostname_is_a_label};
use crate::support::{
    Capstan, EXIT_TIMEOUT, Refusing, Reply, TEST_ADMIN, capstan, client, eventually, free_port, ok, refused, run_to_exit, with_test_admin,
};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long anything the relay does may take to show: its backoff after a lost session grows
/// (1 s doubling), and a loaded CI machine is slow.
const SEEN: Duration = Duration::from_secs(90);
/// The zone the test sets.
const ZONE: &str = "relays.e2e.example";

/// `capstan-agent --state-dir DIR` with no inherited agent settings.
pub(crate) fn agent(state_dir: &Path) -> Command {
    let mut cmd = Command::new(agent_binary());
    for key in ["CAPSTAN_AGENT_STATE_DIR", "CAPSTAN_AGENT_HOSTNAME_FILE", "CAPSTAN_AGENT_LOG", "CAPSTAN_RELAY_AUTHORIZATION_FILE"] {
        cmd.env_remove(key);
    }
    cmd.arg("--state-dir").arg(state_dir);
    cmd.stdin(Stdio::null());
    cmd
}

/// A running `capstan-agent relay`, its log kept; killed when dropped, so a failing test leaves
/// nothing running.
pub(crate) struct RelayProcess {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl RelayProcess {
    pub(crate) fn start(state_dir: &Path, authorization: &Path, listen: &str) -> RelayProcess {
        Self::start_with(state_dir, authorization, listen, &[])
    }

    /// [`RelayProcess::start`] with `extra` arguments after `relay`'s own.
    pub(crate) fn start_with(state_dir: &Path, authorization: &Path, listen: &str, extra: &[&std::ffi::OsStr]) -> RelayProcess {
        let mut cmd = agent(state_dir);
        cmd.arg("relay").arg("--authorization-file").arg(authorization).args(["--listen", listen]).args(extra);
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawning capstan-agent relay");
        let log = crate::support::keep_stderr(&mut child);
        RelayProcess { child, log }
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Still running (not exited with a refusal at its start).
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("capstan-agent relay exited ({status:?}); log:\n{}", self.log());
        }
    }

    /// SIGTERM, then the exit status and the whole log.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "capstan-agent relay did not stop on SIGTERM; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = eventually("the relay's log drained", Duration::from_secs(5), || {
            let log = self.log();
            if log.contains("stopping (SIGTERM)") { Ok(log) } else { Err(log) }
        });
        (status, log)
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `capstan keyring export-relay-authorization --cluster ID --out FILE --json [extra]`: the
/// CLI's report.
pub(crate) fn export(server: &Capstan, token: &str, config_home: &Path, cluster_id: &str, output: &Path, extra: &[&str]) -> Value {
    let mut cmd = client(server, token, config_home);
    cmd.args(["keyring", "export-relay-authorization", "--cluster", cluster_id, "--out"]).arg(output).arg("--json").args(extra);
    let exited = run_to_exit(cmd);
    assert!(exited.status.success(), "the export should succeed\nstdout:\n{}\nstderr:\n{}", exited.stdout, exited.stderr);
    serde_json::from_str(exited.stdout.trim()).unwrap_or_else(|e| panic!("export --json prints JSON ({e}): {}", exited.stdout))
}

/// `capstan-agent status --json`.
fn agent_status(state_dir: &Path) -> Value {
    let exited = run_to_exit({
        let mut cmd = agent(state_dir);
        cmd.args(["status", "--json"]);
        cmd
    });
    assert!(exited.status.success(), "capstan-agent status --json: {exited:?}");
    serde_json::from_str(&exited.stdout).unwrap_or_else(|e| panic!("status --json prints JSON ({e}): {}", exited.stdout))
}

/// The relay configuration kept in the state directory, once there is one.
fn kept_config(state_dir: &Path) -> Result<Value, String> {
    let path = state_dir.join("relay-config.json");
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{} holds no JSON: {e}", path.display()))
}

/// A cluster of `server` under `zone` with its relay enabled, a relay credential exported to a
/// private file, and a node enrolled with a jump code (the relay is not started).
pub(crate) struct EnrolledCluster {
    pub(crate) cluster_id: String,
    pub(crate) state_dir: PathBuf,
    pub(crate) authorization: PathBuf,
}

pub(crate) fn enrolled_cluster(server: &Capstan, admin: &str, root: &Path, origin: &str, zone: &str) -> EnrolledCluster {
    enrolled_cluster_named(server, admin, root, origin, zone, "edge")
}

/// [`enrolled_cluster`] with the cluster named `name` (a second one beside it, say); `root`
/// holds its export and state directories.
pub(crate) fn enrolled_cluster_named(server: &Capstan, admin: &str, root: &Path, origin: &str, zone: &str, name: &str) -> EnrolledCluster {
    let settings = ok(server, admin, "settings.get", json!({}));
    if settings["settings"]["clusterRelayZone"] != zone {
        ok(server, admin, "settings.update", json!({ "expectedRevision": settings["revision"], "set": { "clusterRelayZone": zone } }));
    }
    let cluster_id = ok(server, admin, "clusters.create", json!({ "name": name }))["cluster"]["id"].as_str().unwrap().to_string();
    let cluster = ok(server, admin, "clusters.get", json!({ "id": cluster_id }));
    ok(server, admin, "clusters.enableRelay", json!({ "id": cluster_id, "expectedRevision": cluster["revision"] }));
    ok(
        server,
        admin,
        "relays.mutateCredential",
        json!({ "clusterId": cluster_id, "action": "ensure", "mutationId": format!("e2e-enrolled-{cluster_id}") }),
    );
    let export_dir = root.join("relay-export");
    std::fs::create_dir(&export_dir).unwrap();
    std::fs::set_permissions(&export_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let authorization = export_dir.join("relay-authorization");
    export(server, admin, &root.join("config"), &cluster_id, &authorization, &[]);
    let state_dir = root.join("agent-state");
    enroll_node(server, admin, &cluster_id, origin, &state_dir, None);
    EnrolledCluster { cluster_id, state_dir, authorization }
}

/// Enroll a node into `cluster_id` with a jump code and the real agent, its state in
/// `state_dir`, under `hostname` (this machine's when `None`); its node id.
pub(crate) fn enroll_node(
    server: &Capstan,
    admin: &str,
    cluster_id: &str,
    origin: &str,
    state_dir: &Path,
    hostname: Option<&str>,
) -> String {
    let jump = ok(server, admin, "nodes.createJumpCommand", json!({ "clusterId": cluster_id }));
    let mut enroll = agent(state_dir);
    enroll.args(["enroll", origin]);
    if let Some(hostname) = hostname {
        enroll.args(["--hostname", hostname]);
    }
    let enrolled = crate::plugins::run(enroll, format!("{}\n", jump["code"].as_str().unwrap()).as_bytes(), EXIT_TIMEOUT);
    assert!(enrolled.status.success(), "capstan-agent enroll:\nstdout:\n{}\nstderr:\n{}", enrolled.stdout, enrolled.stderr);
    let credential: Value = serde_json::from_slice(&std::fs::read(state_dir.join("credential.json")).unwrap()).unwrap();
    credential["nodeId"].as_str().unwrap().to_string()
}

/// `relays.list {clusterIds: [cluster]}`'s one item, if any.
fn listed(server: &Capstan, token: &str, cluster_id: &str) -> Option<Value> {
    let listing = ok(server, token, "relays.list", json!({ "clusterIds": [cluster_id] }));
    let items = listing["items"].as_array().unwrap_or_else(|| panic!("relays.list answers items: {listing}"));
    assert!(items.len() <= 1, "one item per cluster: {listing}");
    items.first().cloned()
}

/// Wait until `relays.list` shows the cluster's relay with `live` and `sessions` live sockets.
pub(crate) fn wait_listed(server: &Capstan, token: &str, cluster_id: &str, live: bool, sessions: u64, relay: &[&RelayProcess]) -> Value {
    let what = format!("relays.list showing live: {live} with {sessions} live session(s)");
    eventually(&what, SEEN, || match listed(server, token, cluster_id) {
        Some(item) if item["live"] == live && item["liveSessions"] == sessions => Ok(item),
        other => Err(format!("{other:?}\nrelay log:\n{}", relay.iter().map(|r| r.log()).collect::<Vec<_>>().join("\n---\n"))),
    })
}

/// `example.pingAgent {clusterId}`.
fn ping(server: &Capstan, token: &str, cluster_id: &str) -> Reply {
    server.call_as(token, "example.pingAgent", &json!({ "clusterId": cluster_id }))
}

/// Assert a pong from the relay running as `node_id`.
fn assert_pong(reply: &Reply, cluster_id: &str, node_id: &str) {
    let answer = reply.expect_json(200);
    assert_eq!(answer["clusterId"], cluster_id, "{answer}");
    let pong = &answer["reply"];
    assert_eq!((&pong["pong"], &pong["nodeId"]), (&json!(true), &json!(node_id)), "{answer}");
    assert!(pong["at"].as_u64().is_some_and(|at| at > 1_700_000_000_000), "the relay's clock in ms: {answer}");
    assert_eq!(pong.as_object().map(|o| o.len()), Some(3), "{{pong, nodeId, at}}: {answer}");
}

/// Assert `relay-not-connected`: 503, retryable, with `retryAfterMs`.
fn assert_not_connected(reply: &Reply, cluster_id: &str) {
    let error = reply.expect_error(503, "relay-not-connected");
    assert_eq!(error["retryable"], true, "{error}");
    assert_eq!(error["data"]["retryAfterMs"], 5000, "{error}");
    assert_eq!(error["data"]["clusterId"], cluster_id, "{error}");
}

/// Upload a bundle and install it with every requested capability granted: the plugin record.
fn install(server: &Capstan, token: &str, bundle: &[u8]) -> Value {
    let bearer = format!("Bearer {token}");
    let uploaded = server.request("POST", "/api/v1/uploads/plugin-bundle", &[("authorization", &bearer)], Some(bundle)).expect_json(200);
    let installed = ok(server, token, "plugins.install", json!({ "upload": uploaded["upload"], "approve": ["all-requested"] }));
    assert_eq!(installed["id"], "example", "{installed}");
    eventually("the example plugin running", Duration::from_secs(180), || {
        let plugin = ok(server, token, "plugins.get", json!({ "id": "example" }));
        if plugin["status"] == "running" { Ok(plugin) } else { Err(plugin.to_string()) }
    })
}

#[test]
fn a_real_relay_registers_keeps_its_config_answers_plugins_follows_restarts_and_rotations_and_is_never_one_of_two() {
    if !machine_hostname_is_a_label() {
        eprintln!("skipped: this machine's short hostname is not one DNS label, which capstan-agent refuses to offer at enrollment");
        return;
    }
    let Some(component) = crate::crash::example_component() else { return };
    let key = capstan::plugins::bundle::generate_key();
    let publisher = capstan::plugins::bundle::PublisherKey::from(&key).to_string();
    let bundle = crate::crash::example_bundle(&component, "0.1.0", &key);

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let agent_bin = agent_binary().to_path_buf();
    // a fixed port, so Capstan restarts where the relay's enrollment names it
    let port = free_port();
    let origin = format!("http://127.0.0.1:{port}");
    let serve = || {
        let mut cmd = with_test_admin(capstan());
        cmd.args(["serve", "--dev", "--data-dir"]).arg(root.join("data")).args(["--listen", &format!("127.0.0.1:{port}")]);
        cmd.env("CAPSTAN_TRUSTED_PUBLISHERS", &publisher).env("CAPSTAN_AGENT_BINARY", &agent_bin);
        cmd
    };
    let server = Capstan::start(serve());
    server.ready_status();
    let mut admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);

    // ---- 1. setup: the example plugin, the zone, a cluster with its relay enabled ----
    let plugin = install(&server, &admin, &bundle);
    let grants: Vec<&str> = plugin["grants"].as_array().map(|g| g.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    assert!(grants.contains(&"agents"), "the example plugin requests agents and was granted it: {plugin}");

    let settings = ok(&server, &admin, "settings.get", json!({}));
    ok(&server, &admin, "settings.update", json!({ "expectedRevision": settings["revision"], "set": { "clusterRelayZone": ZONE } }));
    let created = ok(&server, &admin, "clusters.create", json!({ "name": "edge" }));
    let cluster_id = created["cluster"]["id"].as_str().unwrap().to_string();
    let quiet = ok(&server, &admin, "clusters.create", json!({ "name": "quiet" }));
    let quiet_id = quiet["cluster"]["id"].as_str().unwrap().to_string();
    let cluster = ok(&server, &admin, "clusters.get", json!({ "id": cluster_id }));
    let enabled = ok(&server, &admin, "clusters.enableRelay", json!({ "id": cluster_id, "expectedRevision": cluster["revision"] }));
    let relay_origin = format!("https://relay.{}.{ZONE}:8443", cluster_id.replace('_', "-"));
    assert_eq!(enabled["relay"], json!({ "enabled": true, "origin": relay_origin }), "{enabled}");

    let minted =
        ok(&server, &admin, "relays.mutateCredential", json!({ "clusterId": cluster_id, "action": "ensure", "mutationId": "e2e-mint" }));
    assert_eq!(minted["generation"], 1, "{minted}");
    let config_home = root.join("config");
    let export_dir = root.join("relay-export");
    std::fs::create_dir(&export_dir).unwrap();
    std::fs::set_permissions(&export_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let authorization = export_dir.join("relay-authorization");
    let report = export(&server, &admin, &config_home, &cluster_id, &authorization, &[]);
    assert_eq!((&report["clusterId"], &report["generation"]), (&json!(cluster_id), &json!(1)), "{report}");
    let first_bearer = std::fs::read_to_string(&authorization).unwrap();
    assert_eq!(first_bearer.len(), 43);
    assert_eq!(std::fs::metadata(&authorization).unwrap().permissions().mode() & 0o777, 0o600);

    // the node the relay runs on, enrolled with a jump code by the real agent
    let jump = ok(&server, &admin, "nodes.createJumpCommand", json!({ "clusterId": cluster_id }));
    let code = jump["code"].as_str().unwrap().to_string();
    let state_dir = root.join("agent-state");
    let enrolled = crate::plugins::run(
        {
            let mut cmd = agent(&state_dir);
            cmd.args(["enroll", &origin]);
            cmd
        },
        format!("{code}\n").as_bytes(),
        EXIT_TIMEOUT,
    );
    assert!(enrolled.status.success(), "capstan-agent enroll:\nstdout:\n{}\nstderr:\n{}", enrolled.stdout, enrolled.stderr);
    let credential: Value = serde_json::from_slice(&std::fs::read(state_dir.join("credential.json")).unwrap()).unwrap();
    let node_id = credential["nodeId"].as_str().unwrap().to_string();
    assert_eq!(credential["clusterId"], cluster_id.as_str());

    // ---- 3 (before the relay): nothing connected ----
    assert_not_connected(&ping(&server, &admin, &cluster_id), &cluster_id);
    assert!(listed(&server, &admin, &cluster_id).is_none(), "no relay ever registered");

    // ---- 2. the relay: registered, live, its configuration kept privately ----
    let mut relay = RelayProcess::start(&state_dir, &authorization, "10.0.0.5:8443");
    let item = wait_listed(&server, &admin, &cluster_id, true, 1, &[&relay]);
    relay.assert_running();
    assert_eq!(
        (&item["nodeId"], &item["listenAddress"], &item["listenPort"], &item["version"]),
        (&json!(node_id), &json!("10.0.0.5"), &json!(8443), &json!(env!("CARGO_PKG_VERSION"))),
        "{item}"
    );
    assert_eq!(item["credential"]["generation"], 1, "{item}");
    assert_eq!(item["sequence"], 1, "a relay counts from 1 on a new socket: {item}");
    let kept = eventually("the relay keeping the pushed configuration", SEEN, || kept_config(&state_dir));
    let config_path = state_dir.join("relay-config.json");
    assert_eq!(std::fs::metadata(&config_path).unwrap().permissions().mode() & 0o777, 0o600, "the kept configuration is private");
    let config = &kept["config"];
    assert_eq!(config["cluster"]["id"], cluster_id.as_str(), "{kept}");
    assert_eq!(config["cluster"]["relay"], json!({ "enabled": true, "origin": relay_origin }), "{kept}");
    assert_eq!(config["settings"]["clusterRelayZone"], ZONE, "{kept}");
    assert!(config["nodes"].as_array().is_some_and(|nodes| nodes.iter().any(|n| n["id"] == node_id.as_str())), "{kept}");
    let first_digest = kept["digest"].as_str().unwrap().to_string();
    assert_eq!(first_digest.len(), 64, "{kept}");
    let status = agent_status(&state_dir);
    assert_eq!(status["relayConfig"]["digest"], first_digest.as_str(), "{status}");
    assert_eq!(status["relayConfig"]["receivedAtMs"], kept["receivedAt"], "{status}");

    // ---- 3. the example plugin reaches it; a cluster without a relay is still refused ----
    assert_pong(&ping(&server, &admin, &cluster_id), &cluster_id, &node_id);
    assert_not_connected(&ping(&server, &admin, &quiet_id), &quiet_id);

    // ---- 4. a change of the cluster is pushed ----
    let cluster = ok(&server, &admin, "clusters.get", json!({ "id": cluster_id }));
    let updated = ok(
        &server,
        &admin,
        "clusters.update",
        json!({ "id": cluster_id, "expectedRevision": cluster["revision"], "description": "pushed to the relay" }),
    );
    let pushed = eventually("the changed configuration kept by the relay", SEEN, || {
        let kept = kept_config(&state_dir)?;
        if kept["digest"] != first_digest.as_str() && kept["config"]["cluster"]["revision"] == updated["revision"] {
            Ok(kept)
        } else {
            Err(format!("{kept}\nrelay log:\n{}", relay.log()))
        }
    });
    let second_digest = pushed["digest"].as_str().unwrap().to_string();
    assert_eq!(agent_status(&state_dir)["relayConfig"]["digest"], second_digest.as_str());

    // ---- 5. Capstan restarts: the relay comes back by itself ----
    let stopped = server.stop();
    assert!(stopped.status.success(), "SIGTERM stops Capstan cleanly: {:?}\n{}", stopped.status, stopped.stderr);
    eventually("the relay told the host is going away (1001)", SEEN, || {
        let log = relay.log();
        if log.contains("the host is going away (1001)") { Ok(()) } else { Err(log) }
    });
    let server = Capstan::start(serve());
    server.ready_status();
    admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let item = wait_listed(&server, &admin, &cluster_id, true, 1, &[&relay]);
    relay.assert_running();
    assert_eq!((&item["nodeId"], &item["sequence"]), (&json!(node_id), &json!(1)), "registered again from 1 on a new socket: {item}");
    // the plugins load in the background after a start
    let pong = eventually("example.pingAgent answering after the restart", SEEN, || {
        let reply = ping(&server, &admin, &cluster_id);
        if reply.status == 200 { Ok(reply) } else { Err(format!("HTTP {}: {}", reply.status, reply.body)) }
    });
    assert_pong(&pong, &cluster_id, &node_id);

    // ---- 6. rotation: the session is closed, the same process takes the re-exported bearer ----
    let rotated = ok(
        &server,
        &admin,
        "relays.mutateCredential",
        json!({ "clusterId": cluster_id, "action": "rotate", "expectedGeneration": 1, "mutationId": "e2e-rotate" }),
    );
    assert_eq!(rotated["generation"], 2, "{rotated}");
    wait_listed(&server, &admin, &cluster_id, false, 0, &[&relay]);
    assert_not_connected(&ping(&server, &admin, &cluster_id), &cluster_id);
    eventually("the relay saying its bearer was refused", SEEN, || {
        let log = relay.log();
        if log.contains("relay-credential-generation-stale") { Ok(()) } else { Err(log) }
    });
    relay.assert_running();
    let report = export(&server, &admin, &config_home, &cluster_id, &authorization, &["--force"]);
    assert_eq!(report["generation"], 2, "{report}");
    let second_bearer = std::fs::read_to_string(&authorization).unwrap();
    assert_ne!(second_bearer, first_bearer);
    let item = wait_listed(&server, &admin, &cluster_id, true, 1, &[&relay]);
    relay.assert_running();
    assert_eq!(item["credential"]["generation"], 2, "registered under the new generation: {item}");
    assert_pong(&ping(&server, &admin, &cluster_id), &cluster_id, &node_id);

    // ---- 7. two relays of one cluster: never a silent choice ----
    // a copy of the enrolled node's state (the same node), its own configuration file
    let second_state = root.join("agent-state-2");
    let copied = Command::new("cp").arg("-a").arg(&state_dir).arg(&second_state).status().unwrap();
    assert!(copied.success(), "cp -a the state directory: {copied:?}");
    std::fs::remove_file(second_state.join("relay-config.json")).unwrap();
    let second = RelayProcess::start(&second_state, &authorization, "10.0.0.6:8443");
    let item = wait_listed(&server, &admin, &cluster_id, true, 2, &[&relay, &second]);
    assert_eq!(item["listenAddress"], "10.0.0.6", "the latest registration is the record: {item}");
    let ambiguous = refused(&ping(&server, &admin, &cluster_id), Refusing::AnyError, "relay-ambiguous");
    assert_eq!(ambiguous["data"]["sessions"], 2, "{ambiguous}");
    eventually("the second relay keeping its configuration", SEEN, || kept_config(&second_state));
    let (exit, second_log) = second.stop();
    assert!(exit.success(), "SIGTERM stops the second relay cleanly: {exit:?}\n{second_log}");
    wait_listed(&server, &admin, &cluster_id, true, 1, &[&relay]);
    assert_pong(&ping(&server, &admin, &cluster_id), &cluster_id, &node_id);

    // ---- 8. a cluster whose relay is connected is not deleted ----
    let cluster = ok(&server, &admin, "clusters.get", json!({ "id": cluster_id }));
    server
        .call_as(&admin, "clusters.delete", &json!({ "id": cluster_id, "expectedRevision": cluster["revision"] }))
        .expect_error(409, "cluster-relay-live");
    assert_eq!(ok(&server, &admin, "clusters.get", json!({ "id": cluster_id }))["id"], cluster_id.as_str(), "still there");
    assert_pong(&ping(&server, &admin, &cluster_id), &cluster_id, &node_id);

    // ---- the end: the relay stops on SIGTERM; no bearer in any log ----
    let (exit, log) = relay.stop();
    assert!(exit.success(), "SIGTERM stops the relay cleanly: {exit:?}\n{log}");
    wait_listed(&server, &admin, &cluster_id, false, 0, &[]);
    assert_not_connected(&ping(&server, &admin, &cluster_id), &cluster_id);
    let logs = [
        ("the relay's log", log),
        ("the second relay's log", second_log),
        ("the first Capstan's log", stopped.stderr),
        ("the second Capstan's log", server.stderr()),
    ];
    for (what, text) in logs {
        for bearer in [&first_bearer, &second_bearer] {
            assert!(!text.contains(bearer.as_str()), "{what} shows a relay bearer");
        }
    }
}

/// Two fleet nodes sharing one store, bucket and keyring: the relay holds its socket on node A,
/// and `relays.ping` landing on node B is carried to A (signed by B's key) and answered by the
/// relay; once the relay stops, both nodes refuse `relay-not-connected`.
#[test]
fn a_relay_connected_to_fleet_node_a_answers_a_call_landing_on_node_b() {
    if !machine_hostname_is_a_label() {
        eprintln!("skipped: this machine's short hostname is not one DNS label, which capstan-agent refuses to offer at enrollment");
        return;
    }
    let fleet = crate::fleet::Fleet::fast();
    let a = Capstan::start(with_test_admin(fleet.serve_on_loopback("a")));
    let b = Capstan::start(with_test_admin(fleet.serve_on_loopback("b")));
    a.ready_status();
    b.ready_status();
    let admin = a.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let root = tempfile::tempdir().unwrap();

    let settings = ok(&a, &admin, "settings.get", json!({}));
    ok(&a, &admin, "settings.update", json!({ "expectedRevision": settings["revision"], "set": { "clusterRelayZone": ZONE } }));
    let created = ok(&a, &admin, "clusters.create", json!({ "name": "edge" }));
    let cluster_id = created["cluster"]["id"].as_str().unwrap().to_string();
    ok(&a, &admin, "clusters.enableRelay", json!({ "id": cluster_id, "expectedRevision": created["cluster"]["revision"] }));
    ok(&a, &admin, "relays.mutateCredential", json!({ "clusterId": cluster_id, "action": "ensure", "mutationId": "fleet-mint" }));
    let export_dir = root.path().join("relay-export");
    std::fs::create_dir(&export_dir).unwrap();
    std::fs::set_permissions(&export_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let authorization = export_dir.join("relay-authorization");
    export(&a, &admin, &root.path().join("config"), &cluster_id, &authorization, &[]);

    // the relay's node enrolls with node A, whose socket it then holds
    let jump = ok(&a, &admin, "nodes.createJumpCommand", json!({ "clusterId": cluster_id }));
    let state_dir = root.path().join("agent-state");
    let enrolled = crate::plugins::run(
        {
            let mut cmd = agent(&state_dir);
            cmd.args(["enroll", &a.url("")]);
            cmd
        },
        format!("{}\n", jump["code"].as_str().unwrap()).as_bytes(),
        EXIT_TIMEOUT,
    );
    assert!(enrolled.status.success(), "capstan-agent enroll:\nstdout:\n{}\nstderr:\n{}", enrolled.stdout, enrolled.stderr);
    let relay = RelayProcess::start(&state_dir, &authorization, "10.0.0.7:8443");
    wait_listed(&b, &admin, &cluster_id, true, 1, &[&relay]);

    for (landing, name) in [(&b, "B"), (&a, "A")] {
        let pinged = ok(landing, &admin, "relays.ping", json!({ "clusterId": cluster_id }));
        assert_eq!(pinged["fleetNode"], a.node_id().as_str(), "the relay's socket is on node A (asked on {name}): {pinged}");
        assert_eq!(pinged["reply"]["pong"], true, "the relay answered through node A (asked on {name}): {pinged}");
    }

    let (status, _) = relay.stop();
    assert!(status.success(), "the relay stops cleanly on SIGTERM: {status:?}");
    for landing in [&a, &b] {
        let reply = eventually("relay-not-connected once the relay stopped", SEEN, || {
            let reply = landing.call_as(&admin, "relays.ping", &json!({ "clusterId": cluster_id }));
            if reply.status == 503 { Ok(reply) } else { Err(reply.body.clone()) }
        });
        refused(&reply, Refusing::AnyError, "relay-not-connected");
    }
}
