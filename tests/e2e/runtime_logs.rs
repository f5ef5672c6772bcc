//! Workload logs end to end, on the runtime setup of `runtime.rs` (a node in its own network
//! namespace with its own Podman engine and `capstan-agent run`): a container writes a known
//! sequence on stdout and stderr, a burst of 50,000 lines and then a numbered tick every 0.2 s.
//! Every line is read back in order through the API and through `capstan services logs`, none
//! twice; `-f` shows new lines (how long after the container wrote them is measured and
//! printed, not asserted); the agent is killed (`kill -9`) and restarted mid-stream, and Capstan
//! is restarted while the agent holds batches it could not send: no tick is lost or doubled,
//! and any loss is stated with counts. The payloads end up as segments in Capstan's bucket; the
//! service deleted, its capture ends with a final batch, and once the released attempt is a
//! month old (its record rewritten while Capstan is stopped) the sweep task removes its
//! segments and payloads.

use crate::runtime::{CONVERGE, Images, Node, World, skipped};
use crate::support::{Capstan, capstan, eventually, with_test_admin};
use serde_json::{Value, json};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every line of one attempt, read page by page: (stream, line) in order, and the losses stated.
fn read_all(w: &World, service: &str, assignment: &str) -> (Vec<(String, String)>, Vec<Value>) {
    let (mut lines, mut losses) = (Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    loop {
        let mut body = json!({ "serviceId": service, "assignmentId": assignment, "limit": 1000 });
        if let Some(c) = &cursor {
            body["cursor"] = json!(c);
        }
        let page = w.ok("runtime.getLogs", body);
        for record in page["records"].as_array().unwrap() {
            match record["kind"].as_str() {
                Some("batch") => {
                    for e in record["entries"].as_array().unwrap() {
                        lines.push((e["stream"].as_str().unwrap().to_string(), e["line"].as_str().unwrap().to_string()));
                    }
                    if record.get("lost").is_some_and(|l| l.is_object()) {
                        losses.push(record["lost"].clone());
                    }
                }
                _ => losses.push(record.clone()),
            }
        }
        cursor = page["nextCursor"].as_str().map(str::to_string);
        if page["end"] == true {
            return (lines, losses);
        }
    }
}

/// The numbers of the lines starting `prefix ` in order.
fn numbers(lines: &[(String, String)], prefix: &str) -> Vec<u64> {
    lines.iter().filter_map(|(_, l)| l.strip_prefix(prefix).and_then(|n| n.strip_prefix(' ')).and_then(|n| n.parse().ok())).collect()
}

/// `1..=n` in order, each once.
fn contiguous(got: &[u64]) -> bool {
    got.iter().enumerate().all(|(i, n)| *n == i as u64 + 1)
}

/// The talker's one attempt.
fn attempt_of(w: &World, service: &str) -> String {
    let attempts = w.ok("runtime.getLogAttempts", json!({ "serviceId": service }));
    attempts["items"][0]["assignmentId"].as_str().unwrap_or_default().to_string()
}

/// Wait until the attempt's ticks reach `at_least`; answers every line and the losses.
fn ticks_reach(w: &World, service: &str, at_least: u64) -> (Vec<(String, String)>, Vec<Value>) {
    eventually(&format!("tick {at_least} is kept"), CONVERGE, || {
        let assignment = attempt_of(w, service);
        if assignment.is_empty() {
            return Err("no attempt yet".into());
        }
        let (lines, losses) = read_all(w, service, &assignment);
        let ticks = numbers(&lines, "tick");
        if ticks.last().is_some_and(|n| *n >= at_least) { Ok((lines, losses)) } else { Err(format!("{} ticks", ticks.len())) }
    })
}

/// No tick lost or doubled (or, if some were lost, the loss stated with a count).
fn every_tick_once(lines: &[(String, String)], losses: &[Value], when: &str) {
    let ticks = numbers(lines, "tick");
    if !losses.is_empty() {
        eprintln!("{when}: losses stated: {losses:?}");
    }
    let mut sorted = ticks.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), ticks.len(), "{when}: a tick arrived twice");
    assert!(contiguous(&ticks) || !losses.is_empty(), "{when}: ticks missing with no loss stated: {:?}", &ticks[..ticks.len().min(50)]);
}

fn serve_on(data: &Path, port: u16) -> Capstan {
    let mut cmd = with_test_admin(capstan());
    cmd.args(["serve", "--dev", "--data-dir"]).arg(data).args(["--listen", &format!("127.0.0.1:{port}")]);
    Capstan::start(cmd)
}

#[test]
fn a_containers_lines_are_kept_in_order_once_across_an_agent_kill_and_a_capstan_restart() {
    if skipped() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let images = Images::build(dir.path(), &["talker"]);
    let data = dir.path().join("data");
    let w = World::start(&data, images);
    let org = w.ok("organizations.create", json!({ "name": "acme" }))["id"].as_str().unwrap().to_string();
    let cluster = w.ok("clusters.create", json!({ "name": "talkers" }))["cluster"]["id"].as_str().unwrap().to_string();
    let (talker, deployer, _) = w.published_service(&org, "talker");
    w.release(&talker, &deployer, "1.0.0", "talker");
    let mut node = Node::start(dir.path(), 4, w.port);
    let code = w.ok("nodes.createJumpCommand", json!({ "clusterId": cluster }))["code"].as_str().unwrap().to_string();
    node.enroll(&code, w.port);
    node.start_agent();
    w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": talker, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true }, "replicasPerNode": 1 }),
    );
    w.converged(&talker, "the talker runs", |t| t["slots"].as_array().is_some_and(|s| s.len() == 1));

    // ---- every line, in order, once: through the API ----
    let started = Instant::now();
    let (lines, losses) = ticks_reach(&w, &talker, 5);
    eprintln!("50,000 burst lines and the first ticks kept {:.1} s after the replica ran", started.elapsed().as_secs_f64());
    let stream_of =
        |prefix: &str| -> Vec<&str> { lines.iter().filter(|(_, l)| l.starts_with(prefix)).map(|(s, _)| s.as_str()).collect::<Vec<_>>() };
    assert!(contiguous(&numbers(&lines, "out")) && numbers(&lines, "out").len() == 20, "stdout sequence");
    assert!(contiguous(&numbers(&lines, "err")) && numbers(&lines, "err").len() == 20, "stderr sequence");
    assert!(stream_of("out ").iter().all(|s| *s == "stdout") && stream_of("err ").iter().all(|s| *s == "stderr"));
    let burst = numbers(&lines, "burst");
    let odd: Vec<&String> =
        lines.iter().map(|(_, l)| l).filter(|l| !["out ", "err ", "burst ", "tick "].iter().any(|p| l.starts_with(p))).take(5).collect();
    assert_eq!(burst.len(), 50_000, "every burst line kept once; losses {losses:?}; lines of no sequence: {odd:?}");
    assert!(contiguous(&burst), "the burst in order");
    every_tick_once(&lines, &losses, "first read");
    let assignment = attempt_of(&w, &talker);

    // ---- the same through the CLI, and a closed pipe ends it quietly ----
    let config = dir.path().join("cli");
    let mut cmd = crate::support::client(&w.server, &w.admin, &config);
    cmd.args(["services", "logs", "talker", "--org", "acme", "--json"]);
    let printed = crate::support::run_to_exit(cmd);
    let cli_lines: Vec<(String, String)> = crate::support::succeeded(&printed)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["stream"] != "notice")
        .map(|v| (v["stream"].as_str().unwrap().to_string(), v["line"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(numbers(&cli_lines, "burst").len(), 50_000, "the CLI prints every line");
    assert!(contiguous(&numbers(&cli_lines, "burst")) && contiguous(&numbers(&cli_lines, "out")));
    let mut cmd = crate::support::client(&w.server, &w.admin, &config);
    let capstan_bin = cmd.get_program().to_os_string();
    let envs: Vec<(std::ffi::OsString, std::ffi::OsString)> =
        cmd.get_envs().filter_map(|(k, v)| v.map(|v| (k.to_os_string(), v.to_os_string()))).collect();
    cmd = Command::new("sh");
    cmd.arg("-c").arg(format!("{} services logs talker --org acme | head -3", capstan_bin.to_string_lossy())).envs(envs.clone());
    let headed = cmd.output().unwrap();
    assert!(headed.status.success(), "{headed:?}");
    assert_eq!(String::from_utf8_lossy(&headed.stdout).lines().count(), 3);
    assert!(!String::from_utf8_lossy(&headed.stderr).contains("panicked"), "{headed:?}");

    // ---- -f: new lines as they come (measured, not asserted) ----
    let mut follow = Command::new(&capstan_bin);
    follow.args(["services", "logs", "talker", "--org", "acme", "-f", "--json", "--tail", "1"]).envs(envs);
    let mut child = follow.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut delays = Vec::new();
    let mut line = String::new();
    while delays.len() < 10 {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
        let written = chrono::DateTime::parse_from_rfc3339(v["ts"].as_str().unwrap_or_default());
        if let (Ok(written), true) = (written, v["line"].as_str().is_some_and(|l| l.starts_with("tick"))) {
            delays.push((chrono::Utc::now() - written.with_timezone(&chrono::Utc)).num_milliseconds());
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    delays.sort();
    eprintln!(
        "capstan services logs -f: a tick shows {} ms (median), {} ms (slowest of 10) after the container wrote it",
        delays[delays.len() / 2],
        delays[delays.len() - 1]
    );

    // ---- the agent killed mid-stream and started again: nothing doubled, nothing lost unsaid ----
    let before = numbers(&read_all(&w, &talker, &assignment).0, "tick").last().copied().unwrap_or(0);
    node.stop_agent(true);
    std::thread::sleep(Duration::from_secs(2));
    node.start_agent();
    let (lines, losses) = ticks_reach(&w, &talker, before + 25);
    every_tick_once(&lines, &losses, "after the agent's kill");
    assert_eq!(attempt_of(&w, &talker), assignment, "the same attempt: the container ran on");
    let attempts = w.ok("runtime.getLogAttempts", json!({ "serviceId": talker }));
    assert!(attempts["items"][0]["captures"].as_array().unwrap().len() >= 2, "a capture per agent process: {attempts}");

    // ---- Capstan restarted while the agent holds batches it cannot send ----
    let before = numbers(&lines, "tick").last().copied().unwrap_or(0);
    let World { server, admin, port, images } = w;
    server.stop();
    // the container goes on writing; the agent holds what it reads until Capstan is back
    std::thread::sleep(Duration::from_secs(3));
    let w = World { server: serve_on(&data, port), admin, port, images };
    let (lines, losses) = ticks_reach(&w, &talker, before + 30);
    every_tick_once(&lines, &losses, "after Capstan's restart");

    // ---- the payloads are written into the bucket; the lines read the same from there ----
    eventually("segments written into the bucket", CONVERGE, || {
        let dir = data.join("blobs").join("objects").join("runtime-logs");
        let found = walk(&dir);
        if found.is_empty() { Err(format!("nothing under {}", dir.display())) } else { Ok(found) }
    });
    // the sweep, run now as the operator would: the held attempt keeps its lines
    let run = w.ok("tasks.trigger", json!({ "id": "host.sweep-workload-logs" }));
    let ended = eventually("the sweep's run ending", CONVERGE, || {
        let e = w.ok("tasks.getExecution", json!({ "id": run["id"] }));
        if e["status"] == "running" { Err(e.to_string()) } else { Ok(e) }
    });
    assert_eq!(ended["status"], "succeeded", "{ended}");
    let (lines, losses) = read_all(&w, &talker, &assignment);
    assert_eq!(numbers(&lines, "burst").len(), 50_000, "kept by the sweep");
    every_tick_once(&lines, &losses, "after the sweep");

    // ---- what happened, in words ----
    let events = w.ok("runtime.getServiceEvents", json!({ "serviceId": talker }));
    let kinds: Vec<&str> = events["items"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.starts_with(&["scheduled"]) && kinds.contains(&"ready"), "{kinds:?}");

    // ---- deleted, the replica's capture ends with a final batch and its payloads go into the
    // bucket; a month on, the sweep lets the released attempt go and its segments with it ----
    let current = w.ok("services.get", json!({ "id": talker }));
    w.ok("services.delete", json!({ "id": talker, "expectedRevision": current["revision"] }));
    eventually("the service is gone", CONVERGE, || {
        let reply = w.server.call_as(&w.admin, "services.get", &json!({ "id": talker }));
        if reply.status == 404 { Ok(()) } else { Err(format!("{}", reply.status)) }
    });
    let segments = data.join("blobs").join("objects").join("runtime-logs").join(&talker);
    let db = data.join("capstan.sqlite");
    let inline_left = || {
        crate::support::with_store(&db, &["runtime_log_inline"], |store| async move {
            store.transact(|tx| async move { tx.scan("runtime_log_inline", None, 10).await }).await.unwrap().documents.len()
        })
    };
    // a capture that ended wrote its segment at once; the one the killed agent left open waits
    // its five minutes: both are kept until the retention lets the attempt go
    assert!(!walk(&segments).is_empty(), "the segments of the deleted service are kept for the retention");
    let World { server, admin, port, images } = w;
    server.stop();
    let month_ago = capstan_core::clock::now_ms() - 31 * 24 * 60 * 60 * 1000;
    crate::support::with_store(&db, &["runtime_log_attempts"], |store| {
        let assignment = assignment.clone();
        async move {
            store
                .transact(|tx| {
                    let assignment = assignment.clone();
                    async move {
                        let doc = tx.get("runtime_log_attempts", &assignment).await?.expect("the attempt's record");
                        let mut data = doc.data.clone();
                        for field in ["issuedAt", "lastBatchAt", "releasedAt"] {
                            data[field] = json!(month_ago);
                        }
                        tx.replace("runtime_log_attempts", &assignment, doc.revision, data).await
                    }
                })
                .await
                .unwrap();
        }
    });
    let w = World { server: serve_on(&data, port), admin, port, images };
    let run = w.ok("tasks.trigger", json!({ "id": "host.sweep-workload-logs" }));
    let ended = eventually("the sweep's run ending", CONVERGE, || {
        let e = w.ok("tasks.getExecution", json!({ "id": run["id"] }));
        if e["status"] == "running" { Err(e.to_string()) } else { Ok(e) }
    });
    assert_eq!(ended["status"], "succeeded", "{ended}");
    assert!(walk(&segments).is_empty(), "the expired attempt's segments are gone: {:?}", walk(&segments));
    let World { server, .. } = w;
    server.stop();
    assert_eq!(inline_left(), 0, "and its payloads not yet written with them");
    drop(node);
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { found.extend(walk(&path)) } else { found.push(path) }
    }
    found
}
