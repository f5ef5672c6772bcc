//! Plugin calls against native calls over HTTP, side by side (issue 21): a load driver, run by
//! hand, never a timed test.
//!
//! It starts the release `capstan serve --dev` on loopback, installs the example plugin (built
//! for wasm32-wasip2 and signed with a key generated for the run), and then, interleaved round
//! by round so drift hits every target alike:
//!
//! - throughput with `CAPSTAN_BENCH_CONNECTIONS` keep-alive connections (16) for
//!   `CAPSTAN_BENCH_SECONDS` (3) per target and round: the authenticated native
//!   `auth.whoami`, the example plugin's authenticated `greet`, the public `system.getVersion`;
//! - latency with one request in flight, `CAPSTAN_BENCH_CALLS` (2,000) calls per target and round
//!   on a connection of its own (after 200 to warm up), the targets taking turns call by call,
//!   p50 and p99;
//!
//! over `CAPSTAN_BENCH_ROUNDS` rounds (5), then a live upgrade to 0.2.0 and a rollback while
//! the plugin is under the same load, counting every answer that is not 200.
//!
//! ```sh
//! export CARGO_TARGET_DIR=/var/tmp/capstan-target
//! cargo build --release -p capstan
//! cargo bench -p capstan-server --bench http_load
//! ```
//!
//! `CAPSTAN_BENCH_HOLD=example.greet` loads one target alone for `CAPSTAN_BENCH_SECONDS` and
//! prints the server's pid, for a profiler. `CAPSTAN_BIN` names another binary (default `$CARGO_TARGET_DIR/release/capstan`). The
//! driver shares the machine with the server: on 2 cores its threads take some of the CPU the
//! server would otherwise have, for every target alike.

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const ADMIN: (&str, &str) = ("bench", "bench-administrator-password-21");

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn target_dir() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace.join("target"))
}

fn build_example() -> Vec<u8> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = target_dir().join("wasm-plugins");
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(&workspace)
        .args(["build", "--release", "--target", "wasm32-wasip2", "-p", "capstan-plugin-example", "--target-dir"])
        .arg(&target)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the example plugin failed");
    std::fs::read(target.join("wasm32-wasip2/release/capstan_plugin_example.wasm")).expect("the example component")
}

/// The example plugin at `version`, unsigned.
fn example_bundle(component: &[u8], version: &str) -> capstan_server::plugins::bundle::Bundle {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plugins/example");
    let manifest = std::fs::read_to_string(dir.join("capstan-plugin.toml")).unwrap();
    let manifest = manifest.replacen("version = \"0.1.0\"", &format!("version = \"{version}\""), 1);
    let pages = capstan_server::plugins::bundle::read_page_templates(&dir).unwrap();
    capstan_server::plugins::bundle::Bundle::new(manifest, component.to_vec()).unwrap().with_pages(pages).unwrap()
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: &str) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn { stream, buf: Vec::with_capacity(16 * 1024) })
    }

    /// Send one request, read its whole answer: (status, body).
    fn send(&mut self, request: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        self.stream.write_all(request)?;
        self.buf.clear();
        let mut chunk = [0u8; 16 * 1024];
        let head_end = loop {
            if let Some(at) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).map_err(std::io::Error::other)?.to_string();
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| std::io::Error::other("no status"))?;
        let mut length = None;
        for line in head.lines() {
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse::<usize>().ok();
            }
            if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                return Err(std::io::Error::other("chunked answers are not read by this driver"));
            }
        }
        let length = length.ok_or_else(|| std::io::Error::other("an answer without content-length"))?;
        while self.buf.len() < head_end + length {
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
        Ok((status, self.buf[head_end..head_end + length].to_vec()))
    }
}

fn request(path: &str, token: Option<&str>, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n", body.len());
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

fn call(addr: &str, token: Option<&str>, method: &str, body: &Value) -> Value {
    let mut conn = Conn::open(addr).expect("connect");
    let (status, answer) =
        conn.send(&request(&format!("/api/v1/{method}"), token, "application/json", body.to_string().as_bytes())).expect("answer");
    let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    assert_eq!(status, 200, "{method}: {answer}");
    answer
}

fn upload(addr: &str, token: &str, bundle: &[u8]) -> Value {
    let mut conn = Conn::open(addr).expect("connect");
    let (status, answer) =
        conn.send(&request("/api/v1/uploads/plugin-bundle", Some(token), "application/octet-stream", bundle)).expect("answer");
    let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    assert_eq!(status, 200, "upload: {answer}");
    answer["upload"].clone()
}

/// The server under test; killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(binary: &Path, data: &Path, publisher: &str) -> Server {
    let port: u16 = env_or("CAPSTAN_BENCH_PORT", 18121);
    let addr = format!("127.0.0.1:{port}");
    let log = std::fs::File::create(data.with_extension("log")).unwrap();
    let child = Command::new(binary)
        .args(["serve", "--dev", "--data-dir"])
        .arg(data)
        .args(["--listen", &addr])
        .env("CAPSTAN_ADMIN_ACCOUNT", format!("{}:{}", ADMIN.0, ADMIN.1))
        .env("CAPSTAN_TRUSTED_PUBLISHERS", publisher)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e} (cargo build --release -p capstan first)", binary.display()));
    let server = Server { child, addr };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = Conn::open(&server.addr)
            .and_then(|mut c| c.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
            .is_ok_and(|(status, _)| status == 200);
        if ready {
            return server;
        }
        assert!(Instant::now() < deadline, "the server did not answer /healthz; see {}", data.with_extension("log").display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait (at most 5 minutes) until process `pid` used under 5 % of a core over a second.
fn wait_idle(pid: u32) {
    // utime + stime, in clock ticks (100 per second on Linux)
    let ticks = || -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
    };
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(300) {
        let Some(before) = ticks() else { return };
        std::thread::sleep(Duration::from_secs(1));
        let Some(after) = ticks() else { return };
        if after - before < 5 {
            println!("server idle after {:.0} s", started.elapsed().as_secs_f64());
            return;
        }
    }
    println!("the server did not go idle within 5 minutes; measuring anyway");
}

struct Target {
    name: &'static str,
    request: Arc<Vec<u8>>,
}

/// Answers per second with `connections` connections for `duration`: (ok per second, not ok).
fn throughput(addr: &str, target: &Target, connections: usize, duration: Duration) -> (f64, u64) {
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..connections)
        .map(|_| {
            let (ok, failed, stop, request, addr) = (ok.clone(), failed.clone(), stop.clone(), target.request.clone(), addr.to_string());
            std::thread::spawn(move || {
                let mut conn = Conn::open(&addr).expect("connect");
                while !stop.load(Ordering::Relaxed) {
                    match conn.send(&request) {
                        Ok((200, _)) => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(_) => failed.fetch_add(1, Ordering::Relaxed),
                        Err(_) => {
                            conn = Conn::open(&addr).expect("reconnect");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    let started = Instant::now();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    (ok.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(), failed.load(Ordering::Relaxed))
}

/// p50 and p99 of `calls` sequential calls on one connection, in µs.
/// p50 and p99 in µs of each target, one request in flight at a time, each target on its own
/// connection: the targets take turns call by call, so a drift in the machine's speed (another
/// VM, the CPU's clock) weighs on all of them alike instead of on whichever ran during it.
fn latencies(addr: &str, targets: &[Target], calls: usize) -> Vec<(f64, f64)> {
    let mut conns: Vec<Conn> = targets.iter().map(|_| Conn::open(addr).expect("connect")).collect();
    let mut samples: Vec<Vec<Duration>> = targets.iter().map(|_| Vec::with_capacity(calls)).collect();
    for round in 0..calls + 200 {
        for (i, target) in targets.iter().enumerate() {
            let started = Instant::now();
            let (status, _) = conns[i].send(&target.request).unwrap();
            let took = started.elapsed();
            assert_eq!(status, 200, "{}", target.name);
            // the first 200 of each only warm the connection up
            if round >= 200 {
                samples[i].push(took);
            }
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort();
            let at = |p: f64| s[((s.len() as f64 * p) as usize).min(s.len() - 1)].as_secs_f64() * 1e6;
            (at(0.50), at(0.99))
        })
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` only builds this.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let connections: usize = env_or("CAPSTAN_BENCH_CONNECTIONS", 16);
    let seconds: f64 = env_or("CAPSTAN_BENCH_SECONDS", 3.0);
    let rounds: usize = env_or("CAPSTAN_BENCH_ROUNDS", 5);
    let calls: usize = env_or("CAPSTAN_BENCH_CALLS", 2000);
    let binary = std::env::var_os("CAPSTAN_BIN").map(PathBuf::from).unwrap_or_else(|| target_dir().join("release/capstan"));

    let component = build_example();
    let key = capstan_server::plugins::bundle::generate_key();
    let publisher = capstan_server::plugins::bundle::PublisherKey::from(&key).to_string();
    let signed = |version: &str| {
        let mut bundle = example_bundle(&component, version);
        bundle.sign(&key);
        bundle.to_bytes()
    };
    let dir = tempfile::tempdir().unwrap();
    let server = start(&binary, &dir.path().join("data"), &publisher);
    let addr = server.addr.clone();
    let login = call(&addr, None, "auth.login", &json!({ "username": ADMIN.0, "password": ADMIN.1 }));
    let token = login["token"].as_str().unwrap().to_string();
    let all = json!(["all-requested"]);
    let v1 = upload(&addr, &token, &signed("0.1.0"));
    call(&addr, Some(&token), "plugins.install", &json!({ "upload": v1, "approve": all }));
    assert_eq!(call(&addr, Some(&token), "example.greet", &json!({ "name": "Ada" }))["greeting"], "Hello, Ada!");
    // a fresh data directory compiles the first-party plugins in the background at start:
    // measure only once the server is idle, or the first rounds share the CPU with Cranelift
    wait_idle(server.child.id());

    let target = |name: &'static str, token: Option<&str>, body: &Value| Target {
        name,
        request: Arc::new(request(&format!("/api/v1/{name}"), token, "application/json", body.to_string().as_bytes())),
    };
    let targets = [
        target("auth.whoami", Some(&token), &json!({})),
        target("example.greet", Some(&token), &json!({ "name": "Ada" })),
        target("system.getVersion", None, &json!({})),
    ];
    println!(
        "capstan {} · {} cores · {connections} connections × {seconds} s per target and round · {rounds} rounds · {calls} calls per latency sample",
        binary.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // warm every path (slots, caches, connections)
    for t in &targets {
        throughput(&addr, t, connections, Duration::from_millis(500));
    }
    // CAPSTAN_BENCH_HOLD=<target>: that target alone for CAPSTAN_BENCH_SECONDS, to profile the
    // server (its pid is printed: `perf record -g -p <pid>`), then stop
    if let Ok(name) = std::env::var("CAPSTAN_BENCH_HOLD") {
        let t = targets.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("CAPSTAN_BENCH_HOLD={name} names no target"));
        println!("server pid {}: {name} alone for {seconds} s", server.child.id());
        let (r, failed) = throughput(&addr, t, connections, Duration::from_secs_f64(seconds));
        println!("{name}: {r:.0} req/s, {failed} not 200");
        return;
    }
    let mut rps: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    let mut p50: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    let mut p99: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    let mut ratios = Vec::new();
    let mut overheads = Vec::new();
    for round in 0..rounds {
        for (i, t) in targets.iter().enumerate() {
            let (r, failed) = throughput(&addr, t, connections, Duration::from_secs_f64(seconds));
            assert_eq!(failed, 0, "{} answered non-200 under load", t.name);
            rps[i].push(r);
        }
        for (i, (a, b)) in latencies(&addr, &targets, calls).into_iter().enumerate() {
            p50[i].push(a);
            p99[i].push(b);
        }
        let ratio = rps[1][round] / rps[0][round];
        let overhead = p50[1][round] - p50[0][round];
        ratios.push(ratio);
        overheads.push(overhead);
        println!(
            "round {}: req/s whoami {:.0} greet {:.0} getVersion {:.0} (greet/whoami {:.2}) · p50 µs whoami {:.1} greet {:.1} getVersion {:.1} (greet − whoami {:.1})",
            round + 1,
            rps[0][round],
            rps[1][round],
            rps[2][round],
            ratio,
            p50[0][round],
            p50[1][round],
            p50[2][round],
            overhead
        );
    }
    println!();
    println!("| target | req/s ({connections} conns, median of {rounds}) | p50 µs (1 conn) | p99 µs (1 conn) |");
    println!("|---|---:|---:|---:|");
    for (i, t) in targets.iter().enumerate() {
        println!("| `{}` | {:.0} | {:.1} | {:.1} |", t.name, median(rps[i].clone()), median(p50[i].clone()), median(p99[i].clone()));
    }
    println!();
    println!("plugin/native throughput (greet/whoami, median of the rounds' ratios): {:.2}", median(ratios));
    println!("plugin p50 overhead over native (greet − whoami, median of the rounds): {:.1} µs", median(overheads));
    println!(
        "authenticated native vs public (whoami/getVersion): p50 {:.2}×, throughput {:.2}×",
        median(p50[0].clone()) / median(p50[2].clone()),
        median(rps[2].clone()) / median(rps[0].clone())
    );

    // live upgrade and rollback under load: every answer counted
    let v2 = upload(&addr, &token, &signed("0.2.0"));
    let (ok, failed, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let versions = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<String, u64>::new()));
    let load: Vec<_> = (0..connections)
        .map(|_| {
            let (ok, failed, stop, versions) = (ok.clone(), failed.clone(), stop.clone(), versions.clone());
            let (request, addr) = (targets[1].request.clone(), addr.clone());
            std::thread::spawn(move || {
                let mut conn = Conn::open(&addr).expect("connect");
                while !stop.load(Ordering::Relaxed) {
                    match conn.send(&request) {
                        Ok((200, body)) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                            let version =
                                serde_json::from_slice::<Value>(&body).ok().and_then(|v| v["version"].as_str().map(str::to_string));
                            *versions.lock().unwrap().entry(version.unwrap_or_default()).or_default() += 1;
                        }
                        Ok(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            conn = Conn::open(&addr).expect("reconnect");
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let upgrade_started = Instant::now();
    call(&addr, Some(&token), "plugins.upgrade", &json!({ "upload": v2, "approve": all }));
    let upgrade = upgrade_started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let rollback_started = Instant::now();
    call(&addr, Some(&token), "plugins.rollback", &json!({ "id": "example" }));
    let rollback = rollback_started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    println!(
        "upgrade 0.1.0 → 0.2.0 ({} ms) and rollback ({} ms) under load: {} answered 200, {} failed; versions answered: {:?}",
        upgrade.as_millis(),
        rollback.as_millis(),
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        versions.lock().unwrap()
    );
    drop(server);
}
