//! The fleet end to end: several `capstan serve` processes sharing one SQLite database, one blob
//! directory and one keyring (each with its own state directory, on loopback port 0), watched
//! through `capstan fleet nodes` and the bucket's objects.

use crate::support::*;
use capstan::config::{BLOB_URL, HEARTBEAT_MS, LEASE_TTL_MS, LIVENESS_WINDOW_MS, NETWORK, NODE_LABELS, NODE_REFRESH_MS, STATE_DIR};
use capstan::fleet::lease::LEASE_KEY;
use capstan::fleet::runtime::ASSIGNMENTS_KEY;
use capstan_core::clock::now_ms;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a fleet fact (a registration, a lease moving, a node going stale) may take.
const SETTLE: Duration = Duration::from_secs(15);

/// Several nodes' shared configuration under one temporary directory.
pub struct Fleet {
    dir: tempfile::TempDir,
    prod: ProdConfig,
    window_ms: u64,
    timing: Vec<(&'static str, String)>,
}

impl Fleet {
    fn new(heartbeat_ms: u64, refresh_ms: u64, window_ms: u64, lease_ttl_ms: u64) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let prod = ProdConfig::under(dir.path());
        let timing = vec![
            (HEARTBEAT_MS, heartbeat_ms.to_string()),
            (NODE_REFRESH_MS, refresh_ms.to_string()),
            (LIVENESS_WINDOW_MS, window_ms.to_string()),
            (LEASE_TTL_MS, lease_ttl_ms.to_string()),
        ];
        Fleet { dir, prod, window_ms, timing }
    }

    /// Beats and re-reads every 200 ms; gone after 1.5 s; the lease renewed every 500 ms.
    pub fn fast() -> Fleet {
        Fleet::new(200, 200, 1500, 1500)
    }

    fn state_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join(format!("state-{node}"))
    }

    /// `capstan serve` (no listen address yet) with the shared configuration and timing, and
    /// the state directory `state-<node>`.
    fn serve(&self, node: &str) -> Command {
        let mut cmd = capstan();
        cmd.arg("serve").current_dir(self.dir.path());
        for (key, value) in self.prod.vars() {
            cmd.env(key, value);
        }
        cmd.env(STATE_DIR, self.state_dir(node));
        for (key, value) in &self.timing {
            cmd.env(key, value);
        }
        cmd
    }

    pub fn serve_on_loopback(&self, node: &str) -> Command {
        let mut cmd = self.serve(node);
        cmd.args(["--listen", "127.0.0.1:0"]);
        cmd
    }

    pub fn start(&self, node: &str) -> Capstan {
        Capstan::start(self.serve_on_loopback(node))
    }

    /// Three nodes, started one after the other.
    fn start_three(&self) -> Vec<Capstan> {
        ["a", "b", "c"].iter().map(|n| self.start(n)).collect()
    }

    /// `capstan <args> --from-storage` reading the shared bucket, judging liveness by the
    /// fleet's window.
    fn cli(&self, args: &[&str]) -> Exited {
        let mut cmd = capstan();
        cmd.args(args)
            .arg("--from-storage")
            .current_dir(self.dir.path())
            .env(BLOB_URL, format!("file:{}", self.prod.blobs.display()))
            .env(LIVENESS_WINDOW_MS, self.window_ms.to_string());
        run_to_exit(cmd)
    }

    /// `capstan fleet nodes --json`.
    pub fn listing(&self) -> Value {
        let out = self.cli(&["fleet", "nodes", "--json"]);
        assert!(out.status.success(), "capstan fleet nodes --json should succeed: {out:?}");
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("fleet nodes --json should print JSON ({e}): {out:?}"))
    }

    /// `capstan fleet nodes` for people.
    fn listing_text(&self) -> String {
        let out = self.cli(&["fleet", "nodes"]);
        assert!(out.status.success(), "capstan fleet nodes should succeed: {out:?}");
        out.stdout
    }

    pub fn object(&self, key: &str) -> Option<Value> {
        read_blob_json(&self.prod.blobs, key)
    }

    fn node_record(&self, id: &str) -> Value {
        self.object(&format!("_capstan/nodes/{id}.json")).unwrap_or_else(|| panic!("the bucket should hold the record of node {id}"))
    }

    pub fn lease(&self) -> Option<Value> {
        self.object(LEASE_KEY)
    }
}

/// Stop with SIGTERM once the server has answered a request. Until the server loop runs, its
/// SIGTERM handler is not installed and a SIGTERM kills the process outright (see the ignored
/// `sigterm_right_after_the_serving_line_drains`).
pub fn stop_when_serving(node: Capstan) -> Exited {
    node.get("/healthz").expect_json(200);
    let exited = node.stop();
    assert!(exited.status.success(), "SIGTERM should stop the node cleanly: {:?}; stderr:\n{}", exited.status, exited.stderr);
    exited
}

/// The listing's row for node `id`.
fn row<'a>(listing: &'a Value, id: &str) -> Option<&'a Value> {
    listing["nodes"].as_array().expect("nodes is an array").iter().find(|r| r["nodeId"] == id)
}

pub fn coordinators(listing: &Value) -> Vec<String> {
    listing["nodes"]
        .as_array()
        .expect("nodes is an array")
        .iter()
        .filter(|r| r["coordinator"] == true)
        .map(|r| r["nodeId"].as_str().unwrap().to_string())
        .collect()
}

/// Wait until the listing shows `ids` all live and exactly one of them holding the lease.
pub fn wait_all_live(fleet: &Fleet, ids: &[String]) -> Value {
    eventually("every node live with one coordinator", SETTLE, || {
        let listing = fleet.listing();
        let all_live = ids.iter().all(|id| row(&listing, id).is_some_and(|r| r["state"] == "live"));
        let holders = coordinators(&listing);
        if listing["total"] == ids.len() && listing["live"] == ids.len() && all_live && holders.len() == 1 && ids.contains(&holders[0]) {
            Ok(listing)
        } else {
            Err(listing.to_string())
        }
    })
}

fn ids(nodes: &[Capstan]) -> Vec<String> {
    nodes.iter().map(Capstan::node_id).collect()
}

pub fn fence(lease: &Value) -> u64 {
    lease["fence"].as_u64().unwrap_or_else(|| panic!("a lease should carry a numeric fence: {lease}"))
}

#[test]
fn three_nodes_register_and_are_live_with_one_coordinator() {
    let fleet = Fleet::fast();
    let nodes = fleet.start_three();
    let ids = ids(&nodes);
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "three state directories give three node ids: {ids:?}");

    let listing = wait_all_live(&fleet, &ids);
    assert_eq!(listing["total"], 3, "{listing}");
    assert_eq!(listing["live"], 3, "{listing}");
    let holder = coordinators(&listing).remove(0);
    assert_eq!(listing["coordinator"]["holder"], holder.as_str(), "the coordinator row is the lease's holder: {listing}");
    assert_eq!(listing["freeze"], Value::Null, "{listing}");
    assert_eq!(listing["versions"]["capstan"], json!([[env!("CARGO_PKG_VERSION"), 3]]), "{listing}");
    for ((node, id), dir) in nodes.iter().zip(&ids).zip(["a", "b", "c"]) {
        let r = row(&listing, id).unwrap();
        assert_eq!(r["answering"], true, "{r}");
        assert_eq!(r["address"], node.addr.as_str(), "a loopback bind is dialled as bound: {r}");
        assert!(r["heartbeatAgeMs"].as_u64().is_some_and(|age| age <= fleet.window_ms), "{r}");
        let record = fleet.node_record(id);
        assert_eq!(record["nodeId"], id.as_str(), "{record}");
        assert_eq!(record["drainingAt"], Value::Null, "{record}");
        assert_eq!(record["network"], Value::Null, "a loopback node states no network: {record}");
        assert_eq!(record["versions"]["capstan"], env!("CARGO_PKG_VERSION"), "{record}");
        let identity = fleet
            .object(&format!("_capstan/identities/{id}.json"))
            .unwrap_or_else(|| panic!("node {id} should have claimed its id in the bucket"));
        assert_eq!(identity["publicKey"], record["publicKey"], "the claim binds the id to the record's key");
        assert_eq!(identity["kind"], "node", "{identity}");
        let path = fleet.state_dir(dir).join("node.json");
        let file: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(file["publicKey"], record["publicKey"], "the state file and the record name the same key");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "node.json should be private, is {mode:o}");
    }

    let text = eventually("the human listing with three live nodes", SETTLE, || {
        let text = fleet.listing_text();
        if text.starts_with("fleet: 3 nodes, 3 live\n") { Ok(text) } else { Err(text) }
    });
    assert!(text.lines().any(|l| l.starts_with(&format!("{holder} *"))), "the holder is starred; got:\n{text}");
    assert!(text.contains("* holds the coordinator lease"), "{text}");
    for id in &ids {
        assert!(text.lines().any(|l| l.starts_with(id.as_str()) && l.contains(" live ")), "a live row for {id}; got:\n{text}");
    }
}

#[test]
fn killing_the_coordinator_moves_the_lease_under_a_higher_fence_and_leaves_it_stale() {
    let fleet = Fleet::fast();
    let mut nodes = fleet.start_three();
    let ids = ids(&nodes);
    wait_all_live(&fleet, &ids);
    let before = fleet.lease().expect("a lease once a coordinator is listed");
    let old_holder = before["holder"].as_str().unwrap().to_string();
    let old_fence = fence(&before);
    // the old holder has decided placements under its fence
    eventually("the first holder decides placements", SETTLE, || match fleet.object(ASSIGNMENTS_KEY) {
        Some(a) if a["fence"] == old_fence => Ok(()),
        other => Err(format!("{other:?}")),
    });

    let index = ids.iter().position(|id| *id == old_holder).expect("the holder is one of the three");
    let victim = nodes.remove(index);
    let killed = victim.kill_hard();
    assert_eq!(killed.status.signal(), Some(9), "the coordinator was killed by SIGKILL: {:?}", killed.status);
    assert!(!killed.stderr.contains("draining"), "a killed node says nothing on the way out; stderr:\n{}", killed.stderr);
    let survivors: Vec<String> = ids.iter().filter(|id| **id != old_holder).cloned().collect();

    let after = eventually("a surviving node takes the lease", SETTLE, || match fleet.lease() {
        Some(l) if l["holder"] != old_holder.as_str() => Ok(l),
        other => Err(format!("{other:?}")),
    });
    let new_holder = after["holder"].as_str().unwrap().to_string();
    assert!(survivors.contains(&new_holder), "the lease went to a survivor, not to {new_holder}: {after}");
    assert!(fence(&after) > old_fence, "taking the lease raises the fence strictly: {before} then {after}");

    let listing = eventually("the killed coordinator listed as stale", SETTLE, || {
        let listing = fleet.listing();
        match row(&listing, &old_holder) {
            Some(r) if r["state"] == "stale" && listing["live"] == 2 => Ok(listing),
            _ => Err(listing.to_string()),
        }
    });
    let dead = row(&listing, &old_holder).unwrap();
    assert_eq!(dead["answering"], false, "{dead}");
    assert_eq!(dead["coordinator"], false, "{dead}");
    assert!(dead["heartbeatAgeMs"].as_u64().is_some_and(|age| age > fleet.window_ms), "{dead}");
    assert_eq!(listing["total"], 3, "a dead node's record stays: {listing}");
    assert_eq!(fleet.node_record(&old_holder)["drainingAt"], Value::Null, "nothing announced the death");
    for id in &survivors {
        assert_eq!(row(&listing, id).unwrap()["state"], "live", "{listing}");
    }
    assert_eq!(coordinators(&listing), vec![new_holder.clone()], "{listing}");

    // The new holder re-decides placements under its own fence (it compares against nothing),
    // and once the dead node is out of its view, nothing is placed there.
    let assignments = eventually("placements re-decided under the new fence without the dead node", SETTLE, || {
        let lease = fleet.lease().unwrap();
        let assignments = fleet.object(ASSIGNMENTS_KEY).unwrap();
        let placed: Vec<&Value> = assignments["placements"].as_object().unwrap().values().flat_map(|v| v.as_array().unwrap()).collect();
        if assignments["fence"] == lease["fence"] && fence(&lease) > old_fence && !placed.iter().any(|n| **n == old_holder.as_str()) {
            Ok(assignments)
        } else {
            Err(format!("lease {lease}\nassignments {assignments}"))
        }
    });
    let reaper = &assignments["placements"]["host.reap-expired-sessions"];
    assert_eq!(reaper.as_array().map(Vec::len), Some(1), "the host task is placed once: {assignments}");
    assert!(survivors.iter().any(|id| reaper[0] == id.as_str()), "the host task is placed on a survivor: {assignments}");
}

#[test]
fn sigterm_marks_the_node_draining_at_once_and_it_exits_cleanly() {
    // a long window: the drained node must still be heard from when it is listed, even when
    // a loaded machine makes it take a while to finish its in-flight work and stop
    let fleet = Fleet::new(200, 200, 60_000, 1500);
    let mut nodes = fleet.start_three();
    let ids = ids(&nodes);
    let listing = wait_all_live(&fleet, &ids);
    let holder = coordinators(&listing).remove(0);
    let lease = fleet.lease().unwrap();
    let index = ids.iter().position(|id| *id != holder).unwrap();
    let leaving_id = ids[index].clone();

    let before = now_ms();
    let exited = stop_when_serving(nodes.remove(index));
    assert!(exited.stderr.contains("draining: marked as leaving"), "draining is logged; stderr:\n{}", exited.stderr);
    assert!(exited.stderr.contains("stopped"), "{}", exited.stderr);

    let record = fleet.node_record(&leaving_id);
    let draining_at = record["drainingAt"].as_u64().unwrap_or_else(|| panic!("the record should carry drainingAt: {record}"));
    assert!(draining_at >= before, "drainingAt is the time of the SIGTERM: {draining_at} < {before}");
    assert!(record["heartbeatAt"].as_u64().is_some(), "{record}");

    let listing = fleet.listing();
    let r = row(&listing, &leaving_id).unwrap();
    assert_eq!(r["state"], "draining", "{listing}");
    assert_eq!(r["answering"], true, "heard from within the window: {listing}");
    assert_eq!(listing["live"], 2, "{listing}");
    assert_eq!(listing["total"], 3, "{listing}");
    assert_eq!(coordinators(&listing), vec![holder.clone()], "a non-coordinator leaving does not move the lease: {listing}");
    let now = fleet.lease().unwrap();
    assert_eq!((&now["holder"], &now["fence"]), (&lease["holder"], &lease["fence"]), "the lease stays put");
    let text = fleet.listing_text();
    assert!(text.starts_with("fleet: 3 nodes, 2 live\n"), "{text}");
    assert!(text.lines().any(|l| l.starts_with(leaving_id.as_str()) && l.contains(" draining ")), "{text}");
}

#[test]
fn a_corrupted_node_file_refuses_the_start_and_is_kept() {
    let fleet = Fleet::fast();
    let state = fleet.state_dir("a");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let file = state.join("node.json");
    let garbage = b"{\"version\":1,\"nodeId\":\"a\",\"privateKey\":\"AAAA\",\"publicKey\":\"AAAA\"}".to_vec();
    std::fs::write(&file, &garbage).unwrap();

    for pin in [None, Some("other")] {
        let mut cmd = fleet.serve_on_loopback("a");
        if let Some(id) = pin {
            cmd.args(["--node-id", id]);
        }
        let exited = run_to_exit(cmd);
        let stderr = exited.assert_refused(1, "invalid-input");
        assert!(stderr.contains("node.json"), "the refusal names the file; stderr:\n{stderr}");
        assert_eq!(std::fs::read(&file).unwrap(), garbage, "an unreadable identity is never replaced (pin {pin:?})");
    }
    assert!(!fleet.prod.blobs.exists(), "a refused identity opens no bucket");
}

#[test]
fn a_different_pinned_id_on_an_existing_state_dir_gets_a_new_key_pair() {
    let fleet = Fleet::fast();
    let read_file = || -> Value { serde_json::from_slice(&std::fs::read(fleet.state_dir("a").join("node.json")).unwrap()).unwrap() };

    let first = fleet.start("a");
    let first_id = first.node_id();
    assert!(first_id.starts_with("node-"), "an unpinned first boot gets a generated id: {first_id}");
    stop_when_serving(first);
    let old = read_file();
    assert_eq!(old["nodeId"], first_id.as_str(), "{old}");

    let mut cmd = fleet.serve_on_loopback("a");
    cmd.args(["--node-id", "other"]);
    let pinned = Capstan::start(cmd);
    assert_eq!(pinned.node_id(), "other");
    pinned.wait_for_stderr("pinned node id differs from the stored one");
    let new = read_file();
    assert_eq!(new["nodeId"], "other", "{new}");
    assert_ne!(new["publicKey"], old["publicKey"], "a new id gets a new key pair");
    assert_eq!(fleet.node_record("other")["publicKey"], new["publicKey"], "the record carries the new key");
    assert_eq!(fleet.object("_capstan/identities/other.json").unwrap()["publicKey"], new["publicKey"]);
    assert_eq!(fleet.node_record(&first_id)["publicKey"], old["publicKey"], "the old record is left as it was");
    stop_when_serving(pinned);

    // the replaced identity is the one kept from now on
    let again = fleet.start("a");
    assert_eq!(again.node_id(), "other", "an unpinned restart keeps the replaced identity");
    assert_eq!(read_file(), new, "and does not touch node.json");
}

#[test]
fn labels_come_from_the_flag_else_the_environment_else_the_file_wholesale() {
    let fleet = Fleet::fast();
    let config = fleet.dir.path().join("node.toml");
    std::fs::write(&config, "[node]\nlabels = { region = \"eu\" }\n").unwrap();

    let mut from_file = fleet.serve_on_loopback("a");
    from_file.arg("--config").arg(&config);
    let mut from_env = fleet.serve_on_loopback("b");
    from_env.arg("--config").arg(&config).env(NODE_LABELS, "tier=slow");
    let mut from_flags = fleet.serve_on_loopback("c");
    from_flags.arg("--config").arg(&config).env(NODE_LABELS, "tier=slow").args(["--node-labels", "tier=fast", "--node-labels", "zone=a"]);

    let nodes: Vec<Capstan> = [from_file, from_env, from_flags].into_iter().map(Capstan::start).collect();
    let ids = ids(&nodes);
    let expected = [json!({"region": "eu"}), json!({"tier": "slow"}), json!({"tier": "fast", "zone": "a"})];
    let listing = wait_all_live(&fleet, &ids);
    for (id, labels) in ids.iter().zip(&expected) {
        assert_eq!(&fleet.node_record(id)["labels"], labels, "labels in the record of {id}");
        assert_eq!(&row(&listing, id).unwrap()["labels"], labels, "labels in the listing of {id}: {listing}");
    }
    let text = fleet.listing_text();
    assert!(text.lines().any(|l| l.starts_with(ids[2].as_str()) && l.ends_with("tier=fast,zone=a")), "{text}");
}

/// A `capstan serve` bound to a wildcard address (which `Capstan::start` does not accept).
struct Wildcard {
    child: Child,
    port: u16,
}

impl Wildcard {
    fn start(mut cmd: Command) -> Wildcard {
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawning capstan");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        let port = loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("Capstan serving on http://0.0.0.0:") {
                        break rest.split_whitespace().next().unwrap().parse().expect("a port");
                    }
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("capstan did not announce a wildcard bind ({e})");
                }
            }
        };
        Wildcard { child, port }
    }

    fn stop(mut self) -> std::process::ExitStatus {
        let sent = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(sent.success());
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "capstan did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Wildcard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn reaching_beyond_loopback_needs_a_stated_network_and_wireguard_needs_its_key() {
    let fleet = Fleet::fast();

    let mut wild = fleet.serve("lan");
    wild.args(["--listen", "0.0.0.0:0"]);
    let refused = run_to_exit(wild);
    let stderr = refused.assert_refused(2, "invalid-input");
    let line = stderr.lines().find(|l| l.starts_with("capstan: refused")).unwrap();
    assert!(line.contains("listen"), "the refusal names the field: {line}");
    assert!(!fleet.state_dir("lan").exists(), "a configuration refusal writes nothing");

    let mut lan = fleet.serve("lan");
    lan.args(["--listen", "0.0.0.0:0", "--network", "lan"]);
    let server = Wildcard::start(lan);
    assert_eq!(http_status(&format!("127.0.0.1:{}", server.port), "/healthz"), 200, "a wildcard bind answers on loopback");
    let id = read_node_id(&fleet.state_dir("lan"));
    let record = fleet.node_record(&id);
    assert_eq!(record["network"], "lan", "{record}");
    assert_eq!(record["addresses"], json!({"internal": "127.0.0.1", "apiPort": server.port}), "a wildcard bind is dialled on 127.0.0.1");
    assert!(server.stop().success());

    let mut wg = fleet.serve_on_loopback("wg");
    wg.args(["--network", "wireguard"]);
    run_to_exit(wg).assert_refused(1, "wireguard-key-missing");
    let wg_init = || {
        let mut cmd = capstan();
        cmd.args(["wg", "init", "--state-dir"]).arg(fleet.state_dir("wg"));
        run_to_exit(cmd)
    };
    let init = wg_init();
    assert!(init.status.success(), "capstan wg init should succeed: {init:?}");
    assert!(init.stdout.contains("public key: "), "{init:?}");
    let key_file = fleet.state_dir("wg").join("wireguard.json");
    assert_eq!(std::fs::metadata(&key_file).unwrap().mode() & 0o777, 0o600, "the WireGuard key is private");
    let key = std::fs::read(&key_file).unwrap();
    wg_init().assert_refused(1, "output-exists");
    assert_eq!(std::fs::read(&key_file).unwrap(), key, "a second wg init never replaces the key");

    let mut wg = fleet.serve_on_loopback("wg");
    wg.env(NETWORK, "wireguard");
    let server = Capstan::start(wg);
    assert_eq!(fleet.node_record(&server.node_id())["network"], "wireguard");
    stop_when_serving(server);
}

/// `GET path` on a fresh connection; the answer's status.
fn http_status(addr: &str, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("GET {path}: not an HTTP answer: {answer:?}"))
}

fn read_node_id(state_dir: &Path) -> String {
    let file: Value = serde_json::from_slice(&std::fs::read(state_dir.join("node.json")).unwrap()).unwrap();
    file["nodeId"].as_str().unwrap().to_string()
}

#[test]
fn a_deploy_freeze_is_listed_refuses_a_second_freeze_and_lifts() {
    let fleet = Fleet::fast();
    let node = fleet.start("a");
    wait_all_live(&fleet, &[node.node_id()]);

    let frozen = fleet.cli(&["fleet", "freeze", "--reason", "release week", "--by", "alice"]);
    assert!(frozen.status.success(), "{frozen:?}");
    let text = fleet.listing_text();
    let line = text
        .lines()
        .find(|l| l.starts_with("deploys frozen since "))
        .unwrap_or_else(|| panic!("the listing should show the freeze; got:\n{text}"));
    let since = line.strip_prefix("deploys frozen since ").unwrap().strip_suffix(" by alice: release week");
    let since = since.unwrap_or_else(|| panic!("the freeze line names who and why: {line:?}"));
    assert!(since.len() == 20 && since.ends_with('Z') && since.as_bytes()[10] == b'T', "an RFC 3339 time in seconds: {since:?}");
    assert_eq!(text.lines().nth(1), Some(line), "the freeze comes right after the totals:\n{text}");
    let freeze = fleet.listing()["freeze"].clone();
    assert_eq!((&freeze["by"], &freeze["reason"]), (&json!("alice"), &json!("release week")), "{freeze}");

    let again = fleet.cli(&["fleet", "freeze", "--reason", "another", "--by", "bob"]);
    again.assert_refused(1, "deploy-frozen");
    assert_eq!(fleet.listing()["freeze"], freeze, "the standing freeze is unchanged");

    let lifted = fleet.cli(&["fleet", "unfreeze"]);
    assert!(lifted.status.success() && lifted.stdout.contains("deploy freeze lifted"), "{lifted:?}");
    assert_eq!(fleet.listing()["freeze"], Value::Null);
    assert!(!fleet.listing_text().contains("deploys frozen"));
    let idle = fleet.cli(&["fleet", "unfreeze"]);
    assert!(idle.status.success() && idle.stdout.contains("no deploy freeze was standing"), "{idle:?}");

    let mut by_user = capstan();
    by_user
        .args(["fleet", "freeze", "--reason", "audit", "--from-storage"])
        .env(BLOB_URL, format!("file:{}", fleet.prod.blobs.display()))
        .env("USER", "carol");
    assert!(run_to_exit(by_user).status.success());
    assert_eq!(fleet.listing()["freeze"]["by"], "carol", "--by defaults to $USER");
}

/// `capstan fleet nodes | freeze | unfreeze` ask a node's API by default (the freeze recorded as
/// the logged-in user); `--from-storage` reads the same facts from the bucket, and refuses a
/// path that holds no fleet instead of creating it or answering "0 nodes".
#[test]
fn fleet_commands_go_through_the_api_and_read_storage_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Capstan::start(with_test_admin(dev_command(&data)));
    let token = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let cli = |args: &[&str]| {
        let mut cmd = capstan();
        cmd.arg("fleet").args(args).env("CAPSTAN_URL", server.url("")).env("CAPSTAN_TOKEN", &token).env("XDG_CONFIG_HOME", dir.path());
        run_to_exit(cmd)
    };
    let json = |exited: Exited| -> Value {
        assert!(exited.status.success(), "{exited:?}");
        serde_json::from_str(exited.stdout.trim()).unwrap_or_else(|e| panic!("one line of JSON ({e}): {exited:?}"))
    };

    let listing = json(cli(&["nodes", "--json"]));
    assert_eq!((listing["total"].clone(), listing["nodes"][0]["nodeId"].clone()), (json!(1), json!(server.node_id())), "{listing}");
    assert_eq!(listing["nodes"][0]["state"], "live", "{listing}");

    let frozen = cli(&["freeze", "--reason", "release week"]);
    assert!(frozen.status.success() && frozen.stdout.contains("deploys frozen by admin : release week"), "{frozen:?}");
    cli(&["freeze", "--reason", "again"]).assert_refused(1, "deploy-frozen");
    assert_eq!(cli(&["freeze", "--reason", "x", "--by", "mallory"]).status.code(), Some(2), "--by names someone only offline");
    let text = cli(&["nodes"]);
    assert!(text.status.success() && text.stdout.contains(" by admin: release week"), "{text:?}");

    // the same facts from the bucket, with no node asked
    let mut stored = capstan();
    stored.args(["fleet", "nodes", "--json", "--from-storage", "--dev", "--data-dir"]).arg(&data);
    let stored = json(run_to_exit(stored));
    assert_eq!((stored["total"].clone(), stored["freeze"]["by"].clone()), (json!(1), json!("admin")), "{stored}");

    let lifted = cli(&["unfreeze"]);
    assert!(lifted.status.success() && lifted.stdout.contains("deploy freeze lifted"), "{lifted:?}");
    assert_eq!(json(cli(&["nodes", "--json"]))["freeze"], Value::Null);

    // a path that holds no fleet: refused by name, nothing created
    let nowhere = dir.path().join("no-such-data");
    let mut cmd = capstan();
    cmd.args(["fleet", "nodes", "--from-storage", "--dev", "--data-dir"]).arg(&nowhere);
    run_to_exit(cmd).assert_refused(1, "fleet-not-found");
    assert!(!nowhere.exists(), "reading a fleet must not create {}", nowhere.display());
    let empty = dir.path().join("empty-bucket");
    std::fs::create_dir(&empty).unwrap();
    let mut cmd = capstan();
    cmd.args(["fleet", "unfreeze", "--from-storage"]).env(BLOB_URL, format!("file:{}", empty.display()));
    run_to_exit(cmd).assert_refused(1, "fleet-not-found");
    // a --from-storage option without the flag is a usage mistake
    let mut cmd = capstan();
    cmd.args(["fleet", "nodes", "--dev"]);
    assert_eq!(run_to_exit(cmd).status.code(), Some(2));
}

/// Draining gives the lease up (its expiry set to now) so that another node need not wait out
/// the TTL. The draining node must not take it back while it finishes requests in flight. One
/// node alone, so that no other node can take the released lease first.
#[test]
fn a_draining_coordinator_does_not_take_the_lease_back() {
    use std::io::{Read, Write};
    let fleet = Fleet::fast();
    let node = fleet.start("a");
    let id = node.node_id();
    wait_all_live(&fleet, std::slice::from_ref(&id));
    let held = fleet.lease().unwrap();
    node.get("/healthz").expect_json(200);

    // a request whose body is still coming keeps the draining node up
    let mut slow = std::net::TcpStream::connect(&node.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(slow, "POST /api/v1/auth.whoami HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{", node.addr).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    node.terminate();
    eventually("the node marked draining", SETTLE, || match fleet.node_record(&id)["drainingAt"].as_u64() {
        Some(at) => Ok(at),
        None => Err(fleet.node_record(&id).to_string()),
    });
    // several coordinator periods (TTL / 3) pass while the request is still in flight
    std::thread::sleep(Duration::from_millis(2000));
    let lease = fleet.lease().unwrap();
    let now = now_ms();
    let expires = lease["expiresAt"].as_u64().unwrap();
    slow.write_all(b"}").unwrap();
    let mut answer = String::new();
    let _ = slow.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 "), "the request in flight is answered: {answer:?}");
    let exited = node.stop();
    assert!(exited.status.success(), "{:?}; stderr:\n{}", exited.status, exited.stderr);
    assert!(
        expires <= now,
        "a draining node should leave the lease released, but holds it until {expires} (now {now}): {held} became {lease}; stderr:\n{}",
        exited.stderr
    );
}

/// `capstan fleet nodes --config FILE` judges liveness by the file's window, as `serve` does.
#[test]
fn fleet_nodes_judges_by_the_window_in_the_config_file() {
    let fleet = Fleet::fast();
    let node = fleet.start("a");
    let id = node.node_id();
    wait_all_live(&fleet, std::slice::from_ref(&id));
    node.kill_hard();
    let file = fleet.dir.path().join("capstan.toml");
    let text = format!("blob_url = {:?}\nliveness_window_ms = {}\n", format!("file:{}", fleet.prod.blobs.display()), fleet.window_ms);
    std::fs::write(&file, text).unwrap();
    std::thread::sleep(Duration::from_millis(fleet.window_ms + 500));
    let mut cmd = capstan();
    cmd.args(["fleet", "nodes", "--json", "--from-storage", "--config"]).arg(&file);
    let out = run_to_exit(cmd);
    assert!(out.status.success(), "{out:?}");
    let listing: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(row(&listing, &id).unwrap()["state"], "stale", "judged by the file's {}ms window: {listing}", fleet.window_ms);
}

/// A SIGTERM right after the serving line should drain and exit 0 like any other. It does not:
/// the SIGTERM handler is only installed once the server loop first polls its shutdown future,
/// after the line is printed, so a SIGTERM in between kills the process (status: signal 15)
/// without marking it draining.
#[test]
fn sigterm_right_after_the_serving_line_drains() {
    let fleet = Fleet::fast();
    for round in 0..20 {
        let node = fleet.start("a");
        let id = node.node_id();
        let exited = node.stop();
        assert!(exited.status.success(), "round {round}: SIGTERM right after the serving line ended the process with {:?}", exited.status);
        assert!(fleet.node_record(&id)["drainingAt"].is_u64(), "round {round}: the node should be marked draining");
    }
}

/// Every object file under `objects/` with its (inode, mtime ns, size).
fn snapshot(dir: &Path, key: &str, out: &mut BTreeMap<String, (u64, i128, u64)>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            snapshot(&entry.path(), &format!("{key}{name}/"), out);
        } else if let Some(object) = name.strip_suffix('~') {
            let mtime = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
            out.insert(format!("{key}{object}"), (meta.ino(), mtime, meta.size()));
        }
    }
}

fn prefix_of(key: &str) -> &'static str {
    if key.starts_with("_capstan/nodes/") {
        "nodes"
    } else if key == LEASE_KEY {
        "lease"
    } else if key == ASSIGNMENTS_KEY {
        "assignments"
    } else {
        "other"
    }
}

/// A measurement, not a speed test: run with
/// `cargo test -p capstan --test e2e fleet::idle_fleet_writes -- --ignored --nocapture`.
/// Three idle nodes (heartbeat 1 s, lease TTL 3 s so renewal every 1 s); the blob directory is
/// polled every 50 ms for 20 s and every change of an object file's (inode, mtime, size) counts
/// as one write. Expected: one heartbeat per node and one lease renewal per second, nothing else.
#[test]
#[ignore = "a 30 s measurement; see docs/benchmarks.md"]
fn idle_fleet_writes() {
    const BEAT_MS: u64 = 1000;
    const TTL_MS: u64 = 3000;
    const MEASURE: Duration = Duration::from_secs(20);
    let fleet = Fleet::new(BEAT_MS, BEAT_MS, TTL_MS, TTL_MS);
    let nodes = fleet.start_three();
    let ids = ids(&nodes);
    wait_all_live(&fleet, &ids);
    // let the start settle: the embedded App Store installed in the background (its bundle
    // written once) and placed with the host's tasks, every node in every view
    eventually("placements settled on three live nodes", Duration::from_secs(120), || {
        let lease = fleet.lease().unwrap();
        match fleet.object(ASSIGNMENTS_KEY) {
            Some(a)
                if a["fence"] == lease["fence"]
                    && a["placements"].as_object().is_some_and(|p| p.keys().any(|k| k.contains("appstore"))) =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    std::thread::sleep(Duration::from_millis(2 * BEAT_MS));

    let objects = fleet.prod.blobs.join("objects");
    let fence_before = fence(&fleet.lease().unwrap());
    let mut seen = BTreeMap::new();
    snapshot(&objects, "", &mut seen);
    let mut writes: BTreeMap<&str, u64> = ["nodes", "lease", "assignments", "other"].iter().map(|p| (*p, 0)).collect();
    let mut changed_keys: BTreeMap<String, u64> = BTreeMap::new();
    let start = Instant::now();
    while start.elapsed() < MEASURE {
        std::thread::sleep(Duration::from_millis(50));
        let mut now = BTreeMap::new();
        snapshot(&objects, "", &mut now);
        for (key, stamp) in &now {
            if seen.get(key) != Some(stamp) {
                *writes.get_mut(prefix_of(key)).unwrap() += 1;
                *changed_keys.entry(key.clone()).or_default() += 1;
            }
        }
        for key in seen.keys().filter(|k| !now.contains_key(*k)) {
            *writes.get_mut(prefix_of(key)).unwrap() += 1;
            *changed_keys.entry(format!("{key} (deleted)")).or_default() += 1;
        }
        seen = now;
    }
    let seconds = start.elapsed().as_secs_f64();
    let fence_after = fence(&fleet.lease().unwrap());
    let total: u64 = writes.values().sum();
    let per_minute = |n: u64| n as f64 * 60.0 / seconds;
    // at the defaults every period is 30× longer: heartbeat 30 s, renewal every 90 s / 3
    let scale = BEAT_MS as f64 / 30_000.0;
    println!("idle fleet of 3, heartbeat {BEAT_MS} ms, lease TTL {TTL_MS} ms, measured {seconds:.1} s:");
    for (prefix, n) in &writes {
        println!("  {prefix:<12} {n:>4} writes  {:>7.1}/min  → {:>5.2}/min at the defaults", per_minute(*n), per_minute(*n) * scale);
    }
    println!(
        "  {:<12} {total:>4} writes  {:>7.1}/min  → {:>5.2}/min at the defaults",
        "total",
        per_minute(total),
        per_minute(total) * scale
    );
    println!("  per key: {changed_keys:?}");
    println!("  lease fence {fence_before} → {fence_after}");

    let periods = seconds * 1000.0 / BEAT_MS as f64;
    let near = |n: u64, expected: f64| (n as f64 - expected).abs() <= expected * 0.2 + 2.0;
    assert!(near(writes["nodes"], 3.0 * periods), "about one heartbeat per node per period: {writes:?}");
    assert!(near(writes["lease"], periods), "about one lease renewal per period: {writes:?}");
    assert_eq!(writes["assignments"], 0, "no placement writes while nothing moves: {changed_keys:?}");
    assert_eq!(writes["other"], 0, "nothing else is written: {changed_keys:?}");
    assert_eq!(fence_before, fence_after, "the lease is renewed, never re-taken, while the holder lives");
}

/// A measurement, not a speed test: run with
/// `cargo test -p capstan --test e2e fleet::idle_fleet_operations -- --ignored --nocapture`.
/// Idle nodes on one SQLite database and one blob directory, each serving `/metrics`: every
/// node is scraped once the start has settled and again after the window, and the store
/// transactions (read, write) and blob operations (get, put, list, head, delete) between the
/// two scrapes are printed per node and for the fleet, per minute.
///
/// The fleet's loops (heartbeat, refresh, coordinator tick) run at `CAPSTAN_IDLE_FLEET_BEAT_MS`
/// (default 1000: 30 times the defaults' 30 s; lease TTL and liveness window three beats), so
/// the blob figures are also printed scaled by beat / 30 s; the store's loops keep their fixed
/// periods and are not scaled. `CAPSTAN_IDLE_FLEET_NODES` (default 3) and
/// `CAPSTAN_IDLE_FLEET_WINDOW_S` (default 60) change the fleet's size and the window. The
/// second scrape's own store reads (the outbox gauges) are measured by a third scrape right
/// after it and taken off.
#[test]
#[ignore = "a measurement of a minute or more; see docs/benchmarks.md"]
fn idle_fleet_operations() {
    use crate::operating::{Sample, samples, total};
    const SCRAPE_TOKEN: &str = "e2e-idle-fleet-scrape-token-0123456789";
    let setting = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let beat_ms = setting("CAPSTAN_IDLE_FLEET_BEAT_MS", 1000);
    let count = setting("CAPSTAN_IDLE_FLEET_NODES", 3) as usize;
    let window = Duration::from_secs(setting("CAPSTAN_IDLE_FLEET_WINDOW_S", 60));
    let mut fleet = Fleet::new(beat_ms, beat_ms, 3 * beat_ms, 3 * beat_ms);
    fleet.timing.push(("CAPSTAN_METRICS_TOKEN", SCRAPE_TOKEN.to_string()));
    let nodes: Vec<Capstan> = (0..count).map(|i| fleet.start(&format!("n{i}"))).collect();
    let ids = ids(&nodes);
    eventually("every node live with one coordinator", Duration::from_secs(60) + Duration::from_millis(4 * beat_ms), || {
        let listing = fleet.listing();
        if listing["live"] == ids.len() && coordinators(&listing).len() == 1 { Ok(()) } else { Err(listing.to_string()) }
    });
    // the start settled: the embedded App Store installed and placed with the host's tasks
    eventually("placements settled on live nodes", Duration::from_secs(180) + Duration::from_millis(4 * beat_ms), || {
        let lease = fleet.lease().unwrap();
        match fleet.object(ASSIGNMENTS_KEY) {
            Some(a)
                if a["fence"] == lease["fence"]
                    && a["placements"].as_object().is_some_and(|p| p.keys().any(|k| k.contains("appstore"))) =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    std::thread::sleep(Duration::from_millis(2 * beat_ms).max(Duration::from_secs(5)));

    let bearer = format!("Bearer {SCRAPE_TOKEN}");
    let scrape = |node: &Capstan| -> Vec<Sample> {
        let reply = node.request("GET", "/metrics", &[("authorization", &bearer)], None);
        assert_eq!(reply.status, 200, "{}: {}", reply.what, reply.body);
        samples(&reply.body)
    };
    let fence_before = fence(&fleet.lease().unwrap());
    let before: Vec<Vec<Sample>> = nodes.iter().map(scrape).collect();
    let start = Instant::now();
    std::thread::sleep(window);
    let after: Vec<Vec<Sample>> = nodes.iter().map(scrape).collect();
    let seconds = start.elapsed().as_secs_f64();
    let again: Vec<Vec<Sample>> = nodes.iter().map(scrape).collect();
    let fence_after = fence(&fleet.lease().unwrap());

    const TXN: &str = "capstan_store_transactions_total";
    const BLOB: &str = "capstan_blob_operations_total";
    let columns: [(&str, &str, &str); 7] = [
        ("store read", TXN, "read"),
        ("store write", TXN, "write"),
        ("blob get", BLOB, "get"),
        ("blob put", BLOB, "put"),
        ("blob list", BLOB, "list"),
        ("blob head", BLOB, "head"),
        ("blob delete", BLOB, "delete"),
    ];
    let count_of = |samples: &[Sample], (_, name, value): (&str, &str, &str)| {
        let label = if name == TXN { "access" } else { "op" };
        total(samples, name, &[(label, value)])
    };
    let per_minute = |n: f64| n * 60.0 / seconds;
    let scale = beat_ms as f64 / 30_000.0;
    println!("idle fleet of {count}, heartbeat and refresh {beat_ms} ms, lease TTL {} ms, measured {seconds:.1} s:", 3 * beat_ms);
    let mut fleet_totals = [0.0f64; 7];
    for (i, node) in nodes.iter().enumerate() {
        let mut line = format!("  node {} ({}):", i, node.node_id());
        for (c, column) in columns.iter().enumerate() {
            let moved = count_of(&after[i], *column) - count_of(&before[i], *column);
            // what the second scrape itself read, as the third one shows
            let own = count_of(&again[i], *column) - count_of(&after[i], *column);
            let moved = if column.1 == TXN && column.2 == "read" { moved - own } else { moved };
            fleet_totals[c] += moved;
            line.push_str(&format!("  {} {moved} ({:.1}/min)", column.0, per_minute(moved)));
            if column.1 == TXN && column.2 == "read" {
                line.push_str(&format!(" [scrape's own reads taken off: {own}]"));
            }
        }
        println!("{line}");
    }
    println!("  fleet, per minute at the test timings → at the default timings (blob ops × {scale:.4}; store ops not scaled):");
    for (c, column) in columns.iter().enumerate() {
        let raw = per_minute(fleet_totals[c]);
        let at_defaults = if column.1 == BLOB { raw * scale } else { raw };
        println!("    {:<12} {:>6} in {seconds:.1} s  {raw:>9.1}/min  → {at_defaults:>8.2}/min", column.0, fleet_totals[c]);
    }
    let outcomes: Vec<String> = after
        .iter()
        .flat_map(|s| s.iter())
        .filter(|s| s.name == TXN && s.labels.get("outcome").map(String::as_str) != Some("committed") && s.value > 0.0)
        .map(|s| format!("{:?} {}", s.labels, s.value))
        .collect();
    println!("  transactions not committed since start: {outcomes:?}");
    println!("  lease fence {fence_before} → {fence_after}");
    assert_eq!(fence_before, fence_after, "the lease is renewed, never re-taken, while the holder lives");
}

#[test]
fn a_coordinator_only_request_to_any_node_is_answered_by_the_holder() {
    const PASSWORD: &str = "a-long-enough-admin-password";
    let mut fleet = Fleet::fast();
    fleet.timing.push(("CAPSTAN_ADMIN_ACCOUNT", format!("root:{PASSWORD}")));
    let mut nodes = fleet.start_three();
    let ids = ids(&nodes);
    let listing = wait_all_live(&fleet, &ids);
    assert_eq!(coordinators(&listing).len(), 1, "one coordinator: {listing}");
    let token = nodes[0].login("root", PASSWORD);

    // every node answers with the holder's decision, stamped with the lease's fence
    let listed: Value = nodes[0].get("/api/v1/methods").expect_json(200);
    let method = listed["methods"].as_array().unwrap().iter().find(|m| m["name"] == "fleet.rebalance").expect("fleet.rebalance is listed");
    assert_eq!(method["coordinatorOnly"], true, "{method}");
    for node in &nodes {
        let answer = node.call_as(&token, "fleet.rebalance", &json!({})).expect_json(200);
        // decided by whoever held the lease under the fence the answer names: the holder, unless
        // a loaded machine let the short test lease lapse and another node took it meanwhile
        let lease = fleet.lease().unwrap();
        if answer["fence"] == lease["fence"] {
            assert_eq!(answer["decidedBy"], lease["holder"], "node {} forwards to the holder: {answer} {lease}", node.node_id());
        } else {
            assert!(answer["fence"].as_u64() < lease["fence"].as_u64(), "the answer's fence is one the lease had: {answer} {lease}");
        }
        let placements = answer["placements"].as_object().expect("placements by workload");
        assert!(!placements.is_empty(), "the host's tasks are placed: {answer}");
        for (work, on) in placements {
            let on = on.as_array().unwrap();
            assert!(!on.is_empty() && on.iter().all(|n| ids.iter().any(|id| n == id)), "{work} runs on live nodes: {answer}");
        }
        let stored = fleet.object(ASSIGNMENTS_KEY).expect("the decision is in the bucket");
        assert_eq!(stored["placements"], answer["placements"], "{stored}");
        assert_eq!(stored["fence"], answer["fence"], "{stored}");
    }

    // the CLI asks any node; the answer is the holder's (read again: see above)
    let holder = fleet.lease().unwrap()["holder"].as_str().unwrap().to_string();
    let other = nodes.iter().position(|n| n.node_id() != holder).unwrap();
    let cli = |json: bool| {
        let mut cmd = capstan();
        cmd.args(["fleet", "rebalance"]).env("XDG_CONFIG_HOME", fleet.dir.path().join("cli-config"));
        cmd.env("CAPSTAN_URL", nodes[other].url("")).env("CAPSTAN_TOKEN", &token);
        if json {
            cmd.arg("--json");
        }
        let out = run_to_exit(cmd);
        assert!(out.status.success(), "capstan fleet rebalance: {out:?}");
        out.stdout
    };
    let answer: Value = serde_json::from_str(cli(true).trim()).expect("--json prints JSON");
    assert_eq!(answer["decidedBy"], holder.as_str(), "{answer}");
    let text = cli(false);
    assert!(text.starts_with(&format!("placements decided by {holder} under fence ")), "{text}");
    assert!(text.contains("WORK") && text.contains("NODES"), "{text}");

    // the dashboard's "Rebalance now" on that node goes through the same door: forwarded to the
    // holder with the session's token, the holder's decision shown
    let cookie = format!("capstan_session={token}");
    let form = [("cookie", cookie.as_str()), ("sec-fetch-site", "same-origin"), ("content-type", "application/x-www-form-urlencoded")];
    let page = nodes[other].request("POST", "/fleet/rebalance", &form, Some(b""));
    assert_eq!(page.status, 200, "{}", page.body);
    let shown = page.body.split("placed by ").nth(1).expect("the page names who decided").split('.').next().unwrap().to_string();
    let (decided_by, shown_fence) = shown.split_once(" under fence ").expect("and under which fence");
    let lease = fleet.lease().unwrap();
    if shown_fence.parse::<u64>().unwrap() == fence(&lease) {
        assert_eq!(decided_by, lease["holder"].as_str().unwrap(), "the dashboard's call is forwarded to the holder: {shown}");
    }
    assert_ne!(decided_by, nodes[other].node_id(), "decided by the holder, not the node the page was asked of: {shown}");

    // the holder's refusals come back as they are; a caller without credentials is refused
    // where it called
    nodes[other].call_as(&token, "fleet.rebalance", &json!({"now": true})).expect_error(400, "invalid-request");
    nodes[other].call("fleet.rebalance", "{}").expect_error(401, "unauthenticated");
    // a request that was already forwarded once is not forwarded again
    let bearer = format!("Bearer {token}");
    let headers = [("content-type", "application/json"), ("authorization", bearer.as_str()), ("x-capstan-forwarded-by", "elsewhere")];
    let refused =
        nodes[other].request("POST", "/api/v1/fleet.rebalance", &headers, Some(b"{}")).expect_error(503, "coordinator-unavailable");
    assert_eq!(refused["retryable"], true, "{refused}");

    // the holder dies: requests are refused as retryable until the lease has moved, then
    // answered by the new holder under a higher fence, and once the dead node's window has
    // passed nothing is placed on it
    let old_fence = fence(&fleet.lease().unwrap());
    let at = nodes.iter().position(|n| n.node_id() == holder).unwrap();
    nodes.remove(at).kill_hard();
    let asked = &nodes[0];
    let answer = eventually("a new holder answering", SETTLE, || {
        let reply = asked.call_as(&token, "fleet.rebalance", &json!({}));
        match reply.status {
            200 if !reply.body.contains(&holder) => Ok(reply.json()),
            200 => Err(reply.body),
            503 => {
                let body = reply.json();
                assert_eq!(body["error"]["code"], "coordinator-unavailable", "{body}");
                assert_eq!(body["error"]["retryable"], true, "{body}");
                Err(body.to_string())
            }
            other => panic!("HTTP {other} while the lease moves: {}", reply.body),
        }
    });
    assert_ne!(answer["decidedBy"], holder.as_str(), "{answer}");
    assert!(answer["fence"].as_u64().unwrap() > old_fence, "{answer}");
}
