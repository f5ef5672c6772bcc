//! Nodes end to end, with real processes: a dev server, and the real `capstan-agent` (built
//! here) enrolling through exactly the enrollment step of the script the server renders, then
//! beating, applying its hostname intent to a file, rotating its credential while it beats,
//! refused once revoked, and offline once stopped. No root: the agent's state directory and
//! hostname file live in the test's temporary directory.

use crate::support::{Capstan, EXIT_TIMEOUT, TEST_ADMIN, capstan, eventually, free_port, ok, run_to_exit, sha256_hex, with_test_admin};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long the agent's beats take to show (a beat per second; a loaded CI machine).
const SEEN: Duration = Duration::from_secs(30);
/// The freshness window the test sets (the setting's floor is a second).
const FRESHNESS_MS: u64 = 3000;

/// The `capstan-agent` binary, built once for the whole run (another package's binary is out
/// of CARGO_BIN_EXE's reach).
pub(crate) fn agent_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace.join("target"));
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(&workspace)
            .args(["build", "-p", "capstan-agent", "--bin", "capstan-agent", "--target-dir"])
            .arg(&target)
            .status()
            .expect("running cargo");
        assert!(status.success(), "building capstan-agent: {status:?}");
        let binary = target.join("debug/capstan-agent");
        assert!(binary.is_file(), "{} was built", binary.display());
        binary
    })
}

/// A `capstan-agent` command with its state under `state_dir` and no inherited agent settings.
fn agent(state_dir: &Path) -> Command {
    agent_in(None, state_dir)
}

/// [`agent`], inside the network namespace `netns` when one is named.
fn agent_in(netns: Option<&str>, state_dir: &Path) -> Command {
    let mut cmd = crate::runtime::in_netns(netns, agent_binary());
    cmd.env_remove("CAPSTAN_AGENT_HOSTNAME_FILE").env_remove("CAPSTAN_AGENT_LOG").env("CAPSTAN_AGENT_STATE_DIR", state_dir);
    cmd.stdin(Stdio::null());
    cmd
}

/// Run exactly the enrollment step of `script` (the lines between its markers) under bash, as
/// the script would, with the agent found on PATH and its state under `state_dir`.
fn run_enroll_step(script: &str, state_dir: &Path) -> crate::support::Exited {
    run_enroll_step_in(None, script, state_dir)
}

/// [`run_enroll_step`], inside the network namespace `netns` when one is named.
fn run_enroll_step_in(netns: Option<&str>, script: &str, state_dir: &Path) -> crate::support::Exited {
    let begin = script.find("# -- enroll --").expect("the script marks its enrollment step");
    let end = script.find("# -- end enroll --").expect("the script marks the end of its enrollment step");
    let step = &script[begin..end];
    assert!(step.contains("| capstan-agent enroll "), "the step pipes the code to capstan-agent enroll: {step}");
    let bin_dir = agent_binary().parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = crate::runtime::in_netns(netns, "bash");
    cmd.arg("-c")
        .arg(format!("set -euo pipefail\n{step}"))
        .env("PATH", path)
        .env("CAPSTAN_AGENT_STATE_DIR", state_dir)
        .env_remove("CAPSTAN_AGENT_HOSTNAME_FILE")
        .stdin(Stdio::null());
    run_to_exit(cmd)
}

/// A running `capstan-agent run`, its stderr kept; killed when dropped.
struct RunningAgent {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl RunningAgent {
    fn start(state_dir: &Path, hostname_file: &Path) -> RunningAgent {
        RunningAgent::start_in(None, state_dir, hostname_file, &[])
    }

    fn start_in(netns: Option<&str>, state_dir: &Path, hostname_file: &Path, more: &[&str]) -> RunningAgent {
        let mut cmd = agent_in(netns, state_dir);
        cmd.args(["run", "--interval", "1s"])
            .args(more)
            .arg("--hostname-file")
            .arg(hostname_file)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawning capstan-agent run");
        let stderr = crate::support::keep_stderr(&mut child);
        RunningAgent { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
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
            assert!(Instant::now() < deadline, "capstan-agent did not stop on SIGTERM; log:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        };
        std::thread::sleep(Duration::from_millis(100)); // the reader drains the pipe
        (status, self.stderr())
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Whether this machine's short hostname is one DNS label (the agent offers it at enrollment).
pub(crate) fn machine_hostname_is_a_label() -> bool {
    let output = Command::new("hostname").arg("-s").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_ascii_lowercase());
    output.is_ok_and(|h| {
        !h.is_empty()
            && h.len() <= 63
            && h.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !h.starts_with('-')
            && !h.ends_with('-')
    })
}

#[test]
fn a_machine_enrolls_with_the_served_script_beats_follows_its_hostname_rotates_and_is_refused_once_revoked() {
    if !machine_hostname_is_a_label() {
        eprintln!("skipped: this machine's short hostname is not one DNS label, which the agent refuses to offer");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let agent_bin = agent_binary().to_path_buf();
    // a fixed port, so the server can be restarted where the agent knows it
    let port = free_port();
    let serve = || {
        let mut cmd = with_test_admin(capstan());
        cmd.args(["serve", "--dev", "--data-dir"]).arg(dir.path().join("data")).args(["--listen", &format!("127.0.0.1:{port}")]);
        cmd.env("CAPSTAN_AGENT_BINARY", &agent_bin);
        cmd
    };
    let server = Capstan::start(serve());
    server.ready_status();
    let mut admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);

    // a short freshness window, through the setting
    ok(&server, &admin, "settings.update", json!({ "expectedRevision": 0, "set": { "nodeObservationFreshnessMs": FRESHNESS_MS } }));
    let cluster = ok(&server, &admin, "clusters.create", json!({ "name": "e2e-nodes" }));
    let cluster_id = cluster["cluster"]["id"].as_str().unwrap().to_string();

    // ---- the jump command and its script ----
    let jump = ok(&server, &admin, "nodes.createJumpCommand", json!({ "clusterId": cluster_id }));
    let code = jump["code"].as_str().unwrap().to_string();
    assert_eq!(code.len(), 16, "{jump}");
    let origin = format!("http://{}", server.addr);
    assert_eq!(jump["command"], format!("curl -fsSL '{origin}/jump/{code}' | sudo bash"), "{jump}");
    let script_path = jump["scriptUrl"].as_str().unwrap().strip_prefix(&origin).expect("the script URL is on this origin").to_string();
    let script = server.get(&script_path);
    assert_eq!(script.status, 200, "{}", script.body);
    assert!(script.content_type.as_deref().unwrap_or_default().starts_with("text/x-shellscript"), "{script:?}");
    assert!(script.body.contains("set -euo pipefail"), "{}", script.body);
    // the script installs the binary this host serves
    let downloaded = dir.path().join("downloaded-agent");
    let fetched = Command::new("curl")
        .args(["-fsS", "-o"])
        .arg(&downloaded)
        .arg(server.url(&format!("/agent/v1/binary/linux-{}", std::env::consts::ARCH)))
        .status()
        .expect("curl runs");
    assert!(fetched.success(), "the host serves the agent it was given: {fetched:?}");
    assert!(std::fs::read(&downloaded).unwrap() == std::fs::read(&agent_bin).unwrap(), "the served agent is the given file");

    // ---- enrollment: exactly the script's step, with the real agent ----
    let state_dir = dir.path().join("agent-state");
    let enrolled = run_enroll_step(&script.body, &state_dir);
    assert!(enrolled.status.success(), "the enrollment step succeeds:\nstdout:\n{}\nstderr:\n{}", enrolled.stdout, enrolled.stderr);
    assert!(enrolled.stdout.starts_with("enrolled: node "), "{}", enrolled.stdout);
    let credential_path = state_dir.join("credential.json");
    assert_eq!(std::fs::metadata(&state_dir).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(&credential_path).unwrap().permissions().mode() & 0o777, 0o600);
    let credential = read_json(&credential_path);
    let node_id = credential["nodeId"].as_str().unwrap().to_string();
    let first_token = credential["token"].as_str().unwrap().to_string();
    assert_eq!(credential["clusterId"], cluster_id.as_str());
    assert_eq!(credential["origin"], origin.as_str());
    let mut tokens = vec![first_token.clone()];
    let never_shows = |what: &str, text: &str, tokens: &[String]| {
        for token in tokens {
            assert!(!text.contains(token.as_str()), "{what} shows the node token:\n{text}");
        }
    };
    never_shows("the enrollment's output", &format!("{}{}", enrolled.stdout, enrolled.stderr), &tokens);

    // a replay of the same request (its answer lost) answers the same node and creates none
    let hostname = ok(&server, &admin, "nodes.get", json!({ "id": node_id }))["hostname"].as_str().unwrap().to_string();
    let replay = json!({ "protocol": "capstan-agent/1", "code": code, "hostname": hostname, "tokenSha256": sha256_hex(&first_token),
        "agentVersion": env!("CARGO_PKG_VERSION") });
    let replayed = server
        .request("POST", "/agent/v1/enroll", &[("content-type", "application/json")], Some(replay.to_string().as_bytes()))
        .expect_json(200);
    assert_eq!(replayed["nodeId"], node_id.as_str(), "{replayed}");
    let listed = ok(&server, &admin, "nodes.list", json!({ "clusterId": cluster_id }));
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "a replay creates no second node: {listed}");

    // the used code: refused by name, to the agent and to a browser alike
    let again = run_enroll_step(&script.body, &dir.path().join("second-state"));
    assert!(!again.status.success(), "a used code enrolls nothing: {}", again.stdout);
    assert!(again.stderr.contains("error: jump-code-invalid: "), "{}", again.stderr);
    assert_eq!(server.get(&format!("/jump/{code}")).status, 404);
    assert_eq!(ok(&server, &admin, "nodes.list", json!({ "clusterId": cluster_id }))["items"].as_array().unwrap().len(), 1);
    let enrolled_again = run_to_exit({
        let mut cmd = agent(&state_dir);
        cmd.args(["enroll", &origin]);
        cmd
    });
    assert!(enrolled_again.stderr.contains("error: already-enrolled: "), "{}", enrolled_again.stderr);

    // ---- run: live, with real host facts ----
    let hostname_file = dir.path().join("hostname");
    let running = RunningAgent::start(&state_dir, &hostname_file);
    let node = eventually("the node live", SEEN, || {
        let node = ok(&server, &admin, "nodes.get", json!({ "id": node_id }));
        if node["live"] == true { Ok(node) } else { Err(node.to_string()) }
    });
    assert_eq!(node["liveness"], "live");
    let report = &node["report"];
    assert!(report["cpus"].as_u64().unwrap() >= 1, "{report}");
    assert!(report["memoryBytes"].as_u64().unwrap() > 0 && report["diskBytes"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["arch"], std::env::consts::ARCH, "{report}");
    assert!(!report["os"].as_str().unwrap().is_empty() && !report["kernel"].as_str().unwrap().is_empty(), "{report}");
    // the host answers the beat before the agent records its outcome in its state file
    let status = eventually("the agent's status names the accepted beat", SEEN, || {
        let status = run_to_exit({
            let mut cmd = agent(&state_dir);
            cmd.args(["status", "--json"]);
            cmd
        });
        let status: Value = serde_json::from_str(&status.stdout).unwrap_or_else(|_| panic!("status --json: {status:?}"));
        if status["lastBeat"]["outcome"] == "accepted" { Ok(status) } else { Err(status.to_string()) }
    });
    assert_eq!(status["nodeId"].as_str(), Some(node_id.as_str()), "{status}");

    // ---- the hostname intent: applied to the file, confirmed by the next report ----
    let intent = ok(&server, &admin, "nodes.setHostname", json!({ "nodeId": node_id, "expectedGeneration": 0, "hostname": "e2e-renamed" }));
    let generation = intent["hostnameIntent"]["generation"].as_u64().unwrap();
    let confirmed = eventually("the intent applied and reported", SEEN, || {
        let written = std::fs::read_to_string(&hostname_file).unwrap_or_default();
        let node = ok(&server, &admin, "nodes.get", json!({ "id": node_id }));
        let apply = &node["report"]["hostApply"];
        if written == "e2e-renamed\n" && apply["generation"] == generation && apply["outcome"] == "applied" {
            Ok(node)
        } else {
            Err(format!("file {written:?}; node {node}"))
        }
    });
    assert_eq!(confirmed["report"]["hostApply"]["hostname"], "e2e-renamed");
    assert_eq!(confirmed["report"]["hostname"], "e2e-renamed", "the report carries the hostname applied");

    // ---- a Capstan restart: the agent backs off, says so once, and beats again ----
    server.stop();
    eventually("the agent noticing Capstan is gone", SEEN, || {
        let log = running.stderr();
        if log.contains("Capstan cannot be reached") { Ok(()) } else { Err(log) }
    });
    let server = Capstan::start(serve());
    server.ready_status();
    admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    eventually("beats accepted again after the restart", SEEN, || {
        let log = running.stderr();
        if log.contains("beats accepted again") { Ok(()) } else { Err(log) }
    });
    assert_eq!(running.stderr().matches("Capstan cannot be reached").count(), 1, "said once, not every failed beat");
    assert_eq!(ok(&server, &admin, "nodes.get", json!({ "id": node_id }))["live"], true);

    // ---- rotation while beats continue ----
    let rotated = run_to_exit({
        let mut cmd = agent(&state_dir);
        cmd.arg("rotate");
        cmd
    });
    assert!(rotated.status.success(), "rotate: {rotated:?}");
    let second_token = read_json(&credential_path)["token"].as_str().unwrap().to_string();
    assert_ne!(second_token, first_token);
    tokens.push(second_token);
    never_shows("rotate's output", &format!("{}{}", rotated.stdout, rotated.stderr), &tokens);
    let credential_meta = ok(&server, &admin, "nodes.getCredential", json!({ "nodeId": node_id }));
    assert_eq!((credential_meta["generation"].as_u64(), credential_meta["state"].as_str()), (Some(2), Some("active")), "{credential_meta}");
    let rotated_at = capstan_now_ms();
    eventually("beats accepted under the new credential", SEEN, || {
        let node = ok(&server, &admin, "nodes.get", json!({ "id": node_id }));
        let fresh = node["lastReportAt"].as_u64().unwrap_or(0) > rotated_at;
        if fresh && node["credentialGeneration"] == 2 && node["live"] == true { Ok(()) } else { Err(node.to_string()) }
    });
    assert!(!running.stderr().contains("node-unauthorized"), "no beat was refused across the rotation:\n{}", running.stderr());

    // ---- revocation: beats refused by name ----
    ok(&server, &admin, "nodes.revokeCredential", json!({ "nodeId": node_id, "expectedGeneration": 2, "mutationId": "e2e-revoke-1" }));
    eventually("the agent saying its credential was refused", SEEN, || {
        let log = running.stderr();
        if log.contains("node-unauthorized") { Ok(()) } else { Err(log) }
    });
    let status = run_to_exit({
        let mut cmd = agent(&state_dir);
        cmd.args(["status", "--json"]);
        cmd
    });
    let status: Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(
        (status["lastBeat"]["outcome"].as_str(), status["lastBeat"]["code"].as_str()),
        (Some("unauthorized"), Some("node-unauthorized"))
    );

    // ---- stopped: offline once the freshness window passes ----
    let (exit, log) = running.stop();
    assert!(exit.success(), "SIGTERM stops the agent cleanly: {exit:?}\n{log}");
    assert!(log.contains("stopping (SIGTERM)"), "{log}");
    assert_eq!(log.matches("node-unauthorized").count(), 1, "the refusal is said once, not every beat:\n{log}");
    never_shows("the agent's log", &log, &tokens);
    let offline = eventually("the node offline", Duration::from_millis(FRESHNESS_MS) + SEEN, || {
        let node = ok(&server, &admin, "nodes.get", json!({ "id": node_id }));
        if node["live"] == false { Ok(node) } else { Err(node.to_string()) }
    });
    assert_eq!(offline["liveness"], "offline", "{offline}");
    never_shows("the server's log", &server.stderr(), &tokens);
}

/// Milliseconds since the epoch (the host's clock is this machine's).
fn capstan_now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A second machine on the LAN: a network namespace joined to this host by a veth link, this
/// host at `host_ip`, the machine at `node_ip`. Removed when dropped.
struct LanMachine {
    netns: String,
    veth: String,
    host_ip: String,
}

impl LanMachine {
    fn start() -> LanMachine {
        let tag = std::process::id() % 10_000;
        // named as the runtime test's namespaces, so a run killed midway is cleaned by the next
        let (netns, veth, peer) = (format!("capstan-rt-{tag}-lan"), format!("crt{tag}lan"), format!("crt{tag}lp"));
        let (host_ip, _) = crate::runtime::linked_namespace(&netns, &veth, &peer);
        LanMachine { netns, veth, host_ip }
    }

    /// `program ARGS` on the machine, run to its exit.
    fn exec(&self, program: &str, args: &[&str]) -> crate::support::Exited {
        let mut cmd = crate::runtime::in_netns(Some(&self.netns), program);
        cmd.args(args).stdin(Stdio::null());
        run_to_exit(cmd)
    }
}

impl Drop for LanMachine {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.veth]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).output();
    }
}

#[test]
fn a_dev_host_on_the_lan_enrolls_a_second_machine_over_plain_http_saying_so() {
    if crate::runtime::skipped() {
        return;
    }
    if !machine_hostname_is_a_label() {
        eprintln!("skipped: this machine's short hostname is not one DNS label, which the agent refuses to offer");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lan = LanMachine::start();
    // as the operator would: every address, a LAN origin
    let port = free_port();
    let origin = format!("http://{}:{port}", lan.host_ip);
    let mut cmd = with_test_admin(capstan());
    cmd.args(["serve", "--dev", "--data-dir"]).arg(dir.path().join("data"));
    cmd.args(["--listen", &format!("0.0.0.0:{port}"), "--network", "lan", "--public-origin", &origin]);
    cmd.env("CAPSTAN_AGENT_BINARY", agent_binary());
    let server = Capstan::start(cmd);
    server.ready_status();
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let cluster = ok(&server, &admin, "clusters.create", json!({ "name": "lan-lab" }))["cluster"]["id"].as_str().unwrap().to_string();

    // a node name without --set-hostname: the node is named, the machine is not renamed
    let jump = ok(&server, &admin, "nodes.createJumpCommand", json!({ "clusterId": cluster, "nodeName": "lan-1" }));
    let code = jump["code"].as_str().unwrap().to_string();
    assert_eq!(jump["command"], format!("curl -fsSL '{origin}/jump/{code}' | sudo bash"), "{jump}");

    // the second machine fetches the script and the landing page over the LAN origin
    let fetched = lan.exec("curl", &["-fsS", &format!("{origin}/jump/{code}/setup.sh")]);
    assert!(fetched.status.success(), "the machine reaches the dev host over the LAN: {}", fetched.stderr);
    let script = fetched.stdout;
    assert!(script.contains(&format!("# DEV MODE: Capstan runs `serve --dev` and this script talks to it over plain http ({origin})")));
    assert!(script.contains(&format!("| capstan-agent enroll --dev-host '{origin}'")), "{script}");
    assert!(!script.contains("hostnamectl"), "no hostname was asked for, so the machine keeps its own:\n{script}");
    let page = lan.exec("curl", &["-fsS", "-H", "accept: text/html", &format!("{origin}/jump/{code}")]);
    assert!(page.stdout.contains("Dev host:") && page.stdout.contains("--dev-host"), "{}", page.stdout);

    // without the jump command's word, the agent refuses plain http beyond loopback, spending nothing
    let state_dir = dir.path().join("agent-state");
    let refused = run_to_exit({
        let mut cmd = agent_in(Some(&lan.netns), &state_dir);
        cmd.args(["enroll", &origin]);
        cmd
    });
    assert!(refused.stderr.contains("error: origin-not-https: "), "{}", refused.stderr);

    // a state directory made open by hand, still empty, is narrowed rather than refused
    std::fs::create_dir(&state_dir).unwrap();
    std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let enrolled = run_enroll_step_in(Some(&lan.netns), &script, &state_dir);
    assert!(enrolled.status.success(), "the enrollment step succeeds:\nstdout:\n{}\nstderr:\n{}", enrolled.stdout, enrolled.stderr);
    assert!(enrolled.stderr.contains(&format!("capstan-agent: DEV HOST: {origin} is a Capstan dev host")), "{}", enrolled.stderr);
    assert_eq!(std::fs::metadata(&state_dir).unwrap().permissions().mode() & 0o777, 0o700);
    let credential = read_json(&state_dir.join("credential.json"));
    assert_eq!((credential["origin"].as_str(), credential["devHost"].as_bool()), (Some(origin.as_str()), Some(true)));
    let node_id = credential["nodeId"].as_str().unwrap().to_string();
    let machine =
        Command::new("hostname").arg("-s").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_ascii_lowercase()).unwrap();
    let node = ok(&server, &admin, "nodes.get", json!({ "id": node_id }));
    assert_eq!((node["name"].as_str(), node["hostname"].as_str()), (Some("lan-1"), Some(machine.as_str())), "{node}");

    // it runs from the LAN, saying at start that it talks to a dev host, and goes live
    let running = RunningAgent::start_in(Some(&lan.netns), &state_dir, &dir.path().join("hostname"), &["--no-workloads"]);
    eventually("the LAN machine live", SEEN, || {
        let node = ok(&server, &admin, "nodes.get", json!({ "id": node_id }));
        if node["live"] == true { Ok(()) } else { Err(format!("{node}\n{}", running.stderr())) }
    });
    assert!(running.stderr().contains("DEV HOST"), "{}", running.stderr());
    let status = run_to_exit({
        let mut cmd = agent(&state_dir);
        cmd.arg("status");
        cmd
    });
    assert!(status.stdout.contains(&format!("{origin} (dev host, plain http)")), "{}", status.stdout);
    assert!(!std::fs::exists(dir.path().join("hostname")).unwrap(), "nothing renamed the machine");
    let (exit, _) = running.stop();
    assert!(exit.success());
}
