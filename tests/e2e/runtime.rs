//! Services run, end to end: `capstan serve --dev` on the host and a cluster of two nodes, each
//! in a network namespace of its own with its own container engine (Podman's Docker-compatible
//! service) and its own `capstan-agent run`. Images built here (busybox httpd, FROM scratch) are
//! pushed into Capstan's registry with skopeo by a deployer and promoted; the runtime runs them:
//! the container answers HTTP on both nodes; a new image rolls one slot at a time (some node
//! answers throughout); a second service scales 1 → 2 per node and back; `kill -9` of an agent
//! mid-rollout leaves no duplicate once it is back; an engine restart that stopped the containers
//! is followed by the replicas running again; a node whose agent stopped is reported and
//! its slot waits; deleting the services leaves no container. The second node's runtime session
//! rides the cluster's relay (`capstan-agent relay --nodes-listen` on the first node), which
//! carries it on its own socket to Capstan.
//!
//! Each node reaches Capstan at http://127.0.0.1:PORT as on one machine: a forwarder inside its
//! namespace carries that address to the host's end of its link, where another carries it to
//! Capstan (tests/peers/forward). Needs root, iproute2, nsenter, podman, runc, buildah, skopeo
//! and busybox-static; without them the test skips, saying why, unless
//! CAPSTAN_TEST_REQUIRE_ENGINE is set (`.ci/run` sets it), when it fails.

use crate::nodes::agent_binary;
use crate::support::{Capstan, TEST_ADMIN, dev_command, eventually, ok, with_test_admin};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What a service's deployer is granted here.
const DEPLOYER_CAPABILITIES: [&str; 4] = ["deployment:reserve", "deployment:promote", "deployment:status", "registry:push"];

/// How long a step that needs pulls, starts and probes may take on a loaded CI machine.
pub(crate) const CONVERGE: Duration = Duration::from_secs(180);

/// Why the test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if !rustix_is_root() {
        return Some("network namespaces need root".into());
    }
    for tool in ["ip", "nsenter", "podman", "buildah", "skopeo", "python3", "curl"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("{tool} is not on PATH (.ci/engine.sh installs podman, runc, buildah and busybox-static)"));
        }
    }
    if !Path::new("/bin/busybox").is_file() {
        return Some("/bin/busybox is missing (apt-get install busybox-static)".into());
    }
    None
}

fn rustix_is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Skip (saying why), or fail when the engine tests are mandatory.
pub(crate) fn skipped() -> bool {
    let Some(why) = missing() else { return false };
    assert!(std::env::var_os("CAPSTAN_TEST_REQUIRE_ENGINE").is_none(), "the runtime test cannot run: {why}");
    eprintln!("skipped: {why}");
    true
}

pub(crate) fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A /24 of 10.231.0.0/16 for one node's link that no interface of this host holds: a run killed
/// midway leaves its namespaces and links behind, and a second link in the same /24 takes the
/// node's packets elsewhere (its agent then waits for answers that never come). Namespaces of
/// other runs with nothing left running in them are removed first; the lock keeps tests starting
/// at once off each other's subnets.
fn free_subnet() -> u32 {
    static TAKEN: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());
    let mut taken = TAKEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let ours = format!("capstan-rt-{}-", std::process::id() % 10_000);
    for line in run("ip", &["netns", "list"]).lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let idle = Command::new("ip").args(["netns", "pids", name]).output().is_ok_and(|o| o.status.success() && o.stdout.is_empty());
        if name.starts_with("capstan-rt-") && !name.starts_with(&ours) && idle {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
    let held = run("ip", &["-o", "-4", "addr", "show"]);
    let subnet = (100..250)
        .find(|s| !taken.contains(s) && !held.contains(&format!(" 10.231.{s}.")))
        .expect("a free /24 in 10.231.100.0–10.231.249.255 for a node's link");
    taken.push(subnet);
    subnet
}

/// A network namespace `netns` joined to this host by the veth pair `veth`/`peer` on a free /24:
/// answers this host's address on the link and the namespace's (a stale namespace of the same
/// name goes first).
pub(crate) fn linked_namespace(netns: &str, veth: &str, peer: &str) -> (String, String) {
    let _ = Command::new("ip").args(["netns", "del", netns]).output();
    let subnet = free_subnet();
    let (host_ip, node_ip) = (format!("10.231.{subnet}.1"), format!("10.231.{subnet}.2"));
    run("ip", &["netns", "add", netns]);
    run("ip", &["link", "add", veth, "type", "veth", "peer", "name", peer]);
    run("ip", &["link", "set", peer, "netns", netns]);
    run("ip", &["addr", "add", &format!("{host_ip}/24"), "dev", veth]);
    run("ip", &["link", "set", veth, "up"]);
    run("ip", &["netns", "exec", netns, "ip", "addr", "add", &format!("{node_ip}/24"), "dev", peer]);
    run("ip", &["netns", "exec", netns, "ip", "link", "set", peer, "up"]);
    run("ip", &["netns", "exec", netns, "ip", "link", "set", "lo", "up"]);
    (host_ip, node_ip)
}

/// `program`, inside the network namespace `netns` when one is named (`ip netns exec`).
pub(crate) fn in_netns(netns: Option<&str>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match netns {
        Some(ns) => {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns]).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

pub(crate) fn forwarder(netns: Option<&str>, listen: &str, target: &str) -> Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/peers/forward/forward.py");
    let mut cmd = in_netns(netns, "python3");
    cmd.arg(&script).args([listen, target]).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = cmd.spawn().expect("starting the forwarder");
    // it prints one line once it listens
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    assert!(line.starts_with("forwarding"), "the forwarder {listen} -> {target} did not start: {line:?}");
    child
}

/// A CGI script answering `NAME <sha256>` for each secret the container got as a variable and
/// `file:NAME <sha256>` for each file under /run/secrets.
const DIGESTS_CGI: &str = r#"#!/bin/busybox sh
echo "Content-Type: text/plain"
echo
printf 'node %s\n' "${CAPSTAN_CLUSTER_NODE_ID-}"
printf 'origin %s\n' "${CAPSTAN_CLUSTER_RELAY_ORIGIN-}"
for name in DB_PASSWORD SHARED_TOKEN SMTP_PASSWORD; do
  eval "value=\${$name-}"
  printf '%s %s\n' "$name" "$(printf '%s' "$value" | /bin/busybox sha256sum | /bin/busybox cut -d' ' -f1)"
done
for file in /run/secrets/*; do
  [ -f "$file" ] && printf '%s %s\n' "file:${file##*/}" "$(/bin/busybox sha256sum < "$file" | /bin/busybox cut -d' ' -f1)"
done
"#;

/// A CGI script answering `NAME=value` for each variable a binding delivers (a test image's
/// own credentials, shown to the test that checks them).
const BINDING_ENV_CGI: &str = r#"#!/bin/busybox sh
echo "Content-Type: text/plain"
echo
for name in DATABASE_URL S3_ENDPOINT S3_BUCKET S3_ACCESS_KEY_ID S3_SECRET_ACCESS_KEY S3_REGION; do
  eval "value=\${$name-}"
  printf '%s=%s\n' "$name" "$value"
done
"#;

/// A CGI script submitting one message over SMTP (`AUTH PLAIN`) with the `SMTP_*` the container
/// was given, as `MAIL FROM:<QUERY_STRING>`; it answers the server's replies (busybox has no
/// sendmail applet here, so the dialogue is paced by hand through `nc`).
const MAIL_CGI: &str = r#"#!/bin/busybox sh
echo "Content-Type: text/plain"
echo
auth="$(printf '\000%s\000%s' "$SMTP_USER" "$SMTP_PASSWORD" | /bin/busybox base64 | /bin/busybox tr -d '\n')"
{
  /bin/busybox sleep 0.5; printf 'EHLO replica\r\n'
  /bin/busybox sleep 0.5; printf 'AUTH PLAIN %s\r\n' "$auth"
  /bin/busybox sleep 0.5; printf 'MAIL FROM:<%s>\r\n' "$QUERY_STRING"
  /bin/busybox sleep 0.5; printf 'RCPT TO:<someone@elsewhere.example>\r\n'
  /bin/busybox sleep 0.5; printf 'DATA\r\n'
  /bin/busybox sleep 0.5; printf 'Subject: from a replica\r\n\r\nsent with the SMTP_* Capstan delivered\r\n.\r\n'
  /bin/busybox sleep 0.5; printf 'QUIT\r\n'
} | /bin/busybox timeout 20 /bin/busybox nc "$SMTP_HOST" "$SMTP_PORT" 2>&1
"#;

/// What the `talker` image runs: a known sequence on stdout and stderr, a burst of 50,000
/// lines, then a numbered tick every 0.2 s for as long as it runs.
const TALKER: &str = r#"#!/bin/busybox sh
i=1
while [ $i -le 20 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done
/bin/busybox seq 1 50000 | /bin/busybox sed 's/^/burst /'
n=1
while true; do echo "tick $n"; n=$((n+1)); /bin/busybox sleep 0.2; done
"#;

/// Images built once: busybox httpd serving a page that names the image (or, named `talker`,
/// writing [`TALKER`]'s lines).
pub(crate) struct Images {
    dir: PathBuf,
}

impl Images {
    pub(crate) fn build(dir: &Path, names: &[&str]) -> Images {
        let storage = ["--storage-driver", "vfs", "--root"];
        for name in names {
            let context = dir.join(format!("context-{name}"));
            std::fs::create_dir_all(context.join("rootfs/bin")).unwrap();
            std::fs::create_dir_all(context.join("rootfs/www")).unwrap();
            std::fs::copy("/bin/busybox", context.join("rootfs/bin/busybox")).unwrap();
            std::fs::write(context.join("rootfs/www/index.html"), format!("{name}\n")).unwrap();
            // /cgi-bin/digests answers the SHA-256 of the secrets the container got, never a value
            std::fs::create_dir_all(context.join("rootfs/www/cgi-bin")).unwrap();
            let script = context.join("rootfs/www/cgi-bin/digests");
            std::fs::write(&script, DIGESTS_CGI).unwrap();
            run("chmod", &["755", &script.display().to_string()]);
            // /cgi-bin/binding-env answers what the service's bindings delivered, so the test
            // connects with exactly what the workload holds (tests/e2e/bindings.rs)
            let binding_env = context.join("rootfs/www/cgi-bin/binding-env");
            std::fs::write(&binding_env, BINDING_ENV_CGI).unwrap();
            run("chmod", &["755", &binding_env.display().to_string()]);
            let mail = context.join("rootfs/www/cgi-bin/mail");
            std::fs::write(&mail, MAIL_CGI).unwrap();
            run("chmod", &["755", &mail.display().to_string()]);
            // the talker writes to its log (tests/e2e/runtime_logs.rs), the crash exits at once;
            // the others serve pages
            let entrypoint = match *name {
                "talker" => {
                    std::fs::write(context.join("rootfs/talk.sh"), TALKER).unwrap();
                    r#"["/bin/busybox", "sh", "/talk.sh"]"#
                }
                "crash" => r#"["/bin/busybox", "false"]"#,
                // stands in for the demo's Uptime Kuma (tests/e2e/appstore_demo.rs): its port
                "kuma" => r#"["/bin/busybox", "httpd", "-f", "-p", "3001", "-h", "/www"]"#,
                _ => r#"["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]"#,
            };
            std::fs::write(context.join("Containerfile"), format!("FROM scratch\nCOPY rootfs/ /\nENTRYPOINT {entrypoint}\n")).unwrap();
            let root = dir.join("build-root");
            let runroot = dir.join("build-run");
            let mut args: Vec<String> = storage.iter().map(|s| s.to_string()).collect();
            args.extend([root.display().to_string(), "--runroot".into(), runroot.display().to_string()]);
            let mut bud = args.clone();
            bud.extend(["bud".into(), "--quiet".into(), "-t".into(), format!("localhost/page:{name}"), context.display().to_string()]);
            run("buildah", &bud.iter().map(String::as_str).collect::<Vec<_>>());
            let mut push = args;
            push.extend([
                "push".into(),
                "--quiet".into(),
                format!("localhost/page:{name}"),
                format!("oci-archive:{}", dir.join(format!("{name}.tar")).display()),
            ]);
            run("buildah", &push.iter().map(String::as_str).collect::<Vec<_>>());
        }
        Images { dir: dir.to_path_buf() }
    }

    pub(crate) fn archive(&self, name: &str) -> String {
        format!("oci-archive:{}", self.dir.join(format!("{name}.tar")).display())
    }
}

/// A node: its namespace and link, its engine, the forwarders, its agent.
pub(crate) struct Node {
    pub(crate) netns: String,
    veth: String,
    node_ip: String,
    dir: PathBuf,
    engine: Child,
    pub(crate) forwarders: Vec<Child>,
    agent: Option<Child>,
    node_id: String,
    pub(crate) host_ip: String,
    /// The relay this node runs (`capstan-agent relay`), if it does.
    relay: Option<Child>,
    /// The relay its runtime session rides, if not Capstan's socket.
    relay_url: Option<String>,
}

impl Node {
    pub(crate) fn start(dir: &Path, index: u32, capstan_port: u16) -> Node {
        let tag = std::process::id() % 10_000;
        let (netns, veth, peer) = (format!("capstan-rt-{tag}-{index}"), format!("crt{tag}n{index}"), format!("crt{tag}p{index}"));
        let (host_ip, node_ip) = linked_namespace(&netns, &veth, &peer);
        let dir = dir.join(format!("node-{index}"));
        let engine = spawn_engine(Some(&netns), &dir, &format!("[[registry]]\nlocation = \"127.0.0.1:{capstan_port}\"\ninsecure = true\n"));
        let address = format!("127.0.0.1:{capstan_port}");
        let forwarders = vec![
            forwarder(None, &format!("{host_ip}:{capstan_port}"), &address),
            forwarder(Some(&netns), &address, &format!("{host_ip}:{capstan_port}")),
        ];
        let node = Node {
            netns,
            veth,
            node_ip,
            dir,
            engine,
            forwarders,
            agent: None,
            node_id: String::new(),
            host_ip,
            relay: None,
            relay_url: None,
        };
        eventually("the node's engine answers", Duration::from_secs(60), || {
            node.engine_get("/v1.41/version").map(drop).ok_or_else(|| "not yet".to_string())
        });
        node
    }

    pub(crate) fn state_dir(&self) -> PathBuf {
        self.dir.join("agent-state")
    }

    pub(crate) fn enroll(&mut self, code: &str, port: u16) {
        let state = self.state_dir();
        std::fs::create_dir_all(&state).unwrap();
        run("chmod", &["700", &state.display().to_string()]);
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(agent_binary())
            .arg("--state-dir")
            .arg(&state)
            .args(["enroll", &format!("http://127.0.0.1:{port}"), "--hostname", &self.netns])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), format!("{code}\n").as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            // what the host's links looked like, for a node that never reached Capstan
            let links = run("ip", &["-o", "-4", "addr", "show"]);
            let links: Vec<&str> = links.lines().filter(|l| l.contains(" 10.231.")).collect();
            panic!(
                "enrolling {} over {}: {text}\n{}\nthe host's node links:\n{}\nnamespaces:\n{}",
                self.netns,
                self.host_ip,
                String::from_utf8_lossy(&out.stderr),
                links.join("\n"),
                run("ip", &["netns", "list"])
            );
        }
        self.node_id = text.split_whitespace().skip_while(|w| *w != "node").nth(1).unwrap().to_string();
    }

    pub(crate) fn start_agent(&mut self) {
        let child = self
            .agent_command("agent.log", "capstan_agent=debug,warn")
            .args(["run", "--interval", "1s", "--hostname-file"])
            .arg(self.dir.join("hostname"))
            .arg("--engine")
            .arg(format!("unix://{}", self.dir.join("engine.sock").display()))
            .arg("--volumes-dir")
            .arg(self.volumes_dir())
            .args(self.relay_url.iter().flat_map(|url| ["--relay", url.as_str()]))
            .arg("--secrets-dir")
            .arg(self.secrets_dir())
            // its engine's bridge gives the namespace a second address: say which one is reached
            .args(["--advertise-address", &self.node_ip])
            .spawn()
            .unwrap();
        self.agent = Some(child);
    }

    /// `capstan-agent --state-dir <this node's>` inside its namespace, logging at `filter` to
    /// `log` (appended) in its directory.
    fn agent_command(&self, log: &str, filter: &str) -> Command {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(log)).unwrap();
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.netns])
            .arg(agent_binary())
            .arg("--state-dir")
            .arg(self.state_dir())
            .env("CAPSTAN_AGENT_LOG", filter)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        command
    }

    /// Run the cluster's relay here under `authorization`, carrying node sessions on this node's
    /// address, port 8444.
    fn start_relay(&mut self, authorization: &str) {
        let file = self.dir.join("relay-authorization");
        std::fs::write(&file, authorization).unwrap();
        run("chmod", &["600", &file.display().to_string()]);
        self.spawn_relay(&[]);
    }

    fn spawn_relay(&mut self, extra: &[&str]) {
        let child = self
            .agent_command("relay.log", "capstan_agent=info,warn")
            .arg("relay")
            .arg("--authorization-file")
            .arg(self.dir.join("relay-authorization"))
            .args(["--nodes-listen", &format!("{}:8444", self.node_ip)])
            // backups read the volumes where this node's agent keeps them
            .arg("--volumes-dir")
            .arg(self.volumes_dir())
            .args(extra)
            .spawn()
            .unwrap();
        self.relay = Some(child);
    }

    /// Run this node's relay again with the cluster ingress (`--ingress-listen` on its address,
    /// port 18443) authenticated by `bearer`; where the ingress answers.
    pub(crate) fn start_ingress(&mut self, bearer: &str) -> String {
        let file = self.dir.join("ingress-bearer");
        std::fs::write(&file, bearer).unwrap();
        run("chmod", &["600", &file.display().to_string()]);
        if let Some(mut relay) = self.relay.take() {
            let _ = relay.kill();
            let _ = relay.wait();
        }
        let listen = format!("{}:18443", self.node_ip);
        self.spawn_relay(&["--ingress-listen", &listen, "--ingress-bearer-file", &file.display().to_string()]);
        listen
    }

    /// Route the other nodes' links through the host, as machines on one network reach each
    /// other (an ingress on one node sends traffic to the replicas on the others).
    pub(crate) fn route_to_other_nodes(&self) {
        run("ip", &["netns", "exec", &self.netns, "ip", "route", "replace", "10.231.0.0/16", "via", &self.host_ip]);
    }

    /// Where the node's agent keeps services' volumes (DIR/<serviceId>/<name>).
    pub(crate) fn volumes_dir(&self) -> PathBuf {
        self.dir.join("volumes")
    }

    pub(crate) fn address(&self) -> &str {
        &self.node_ip
    }

    pub(crate) fn id(&self) -> &str {
        &self.node_id
    }

    /// This node's runtime session rides `relay`'s: reached at 127.0.0.1:8444 inside this
    /// namespace, carried through the host to the relay node's address.
    fn carried_by(&mut self, relay: &Node) {
        self.forwarders.push(forwarder(None, &format!("{}:8444", self.host_ip), &format!("{}:8444", relay.node_ip)));
        self.forwarders.push(forwarder(Some(&self.netns), "127.0.0.1:8444", &format!("{}:8444", self.host_ip)));
        self.relay_url = Some("ws://127.0.0.1:8444/".into());
    }

    pub(crate) fn relay_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("relay.log")).unwrap_or_default()
    }

    /// Restart the engine, and stop every container behind the agent's back meanwhile (as an
    /// engine restart without live restore does).
    fn restart_engine(&mut self) {
        let _ = self.engine.kill();
        let _ = self.engine.wait();
        let _ = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg("podman")
            .args(engine_storage(&self.dir))
            .args(["stop", "--all", "--time", "0"])
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .output();
        std::thread::sleep(Duration::from_secs(2));
        let registries = std::fs::read_to_string(self.dir.join("registries.conf")).unwrap();
        self.engine = spawn_engine(Some(&self.netns), &self.dir, &registries);
        eventually("the node's engine answers again", Duration::from_secs(60), || {
            self.engine_get("/v1.41/version").map(drop).ok_or_else(|| "not yet".to_string())
        });
    }

    /// SIGKILL (`kill -9`) or SIGTERM the agent.
    pub(crate) fn stop_agent(&mut self, hard: bool) {
        if let Some(mut agent) = self.agent.take() {
            let signal = if hard { "-KILL" } else { "-TERM" };
            // `ip netns exec` execs the agent: the child's pid is the agent's
            run("kill", &[signal, &agent.id().to_string()]);
            let _ = agent.wait();
        }
    }

    fn engine_get(&self, path: &str) -> Option<Value> {
        let socket = self.dir.join("engine.sock");
        let out = Command::new("curl")
            .args(["-fsS", "--max-time", "5", "--unix-socket"])
            .arg(&socket)
            .arg(format!("http://engine{path}"))
            .output()
            .ok()?;
        out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
    }

    /// The containers of `service_id` on this node's engine, every state.
    pub(crate) fn containers(&self, service_id: &str) -> Vec<Value> {
        let filter = format!("{{\"label\":[\"capstan.service={service_id}\"]}}");
        let path = format!("/v1.41/containers/json?all=true&filters={}", url_encode(&filter));
        self.engine_get(&path).and_then(|v| v.as_array().cloned()).unwrap_or_default()
    }

    /// What the node's published port 18080 answers, if anything.
    fn page(&self) -> Option<String> {
        self.fetch("/", 2)
    }

    /// What the node's published port 18080 answers at `path` within `seconds`, if anything.
    pub(crate) fn fetch(&self, path: &str, seconds: u32) -> Option<String> {
        self.fetch_at(18080, path, seconds)
    }

    /// What the node's published `port` answers at `path` within `seconds`, if anything.
    pub(crate) fn fetch_at(&self, port: u16, path: &str, seconds: u32) -> Option<String> {
        let (url, time) = (format!("http://{}:{port}{path}", self.node_ip), seconds.to_string());
        let out = Command::new("curl").args(["-fsS", "--max-time", &time, &url]).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Where this node's agent keeps secret files (on /dev/shm, a tmpfs).
    fn secrets_dir(&self) -> PathBuf {
        PathBuf::from(format!("/dev/shm/{}", self.netns))
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }
}

fn engine_storage(dir: &Path) -> Vec<String> {
    vec![
        "--storage-driver".into(),
        "vfs".into(),
        "--root".into(),
        dir.join("root").display().to_string(),
        "--runroot".into(),
        dir.join("run").display().to_string(),
        "--tmpdir".into(),
        dir.join("tmp").display().to_string(),
    ]
}

/// The node's engine service (its Docker-compatible API on `<dir>/engine.sock`).
/// Start an engine keeping its storage, configuration and socket (`engine.sock`) in `dir`, with
/// `registries` as its registries.conf: in the namespace `netns`, or on this host's network.
pub(crate) fn spawn_engine(netns: Option<&str>, dir: &Path, registries: &str) -> Child {
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let nofile = run("sh", &["-c", "ulimit -Hn"]).trim().replace("unlimited", "1048576");
    std::fs::write(
        dir.join("containers.conf"),
        format!(
            "[containers]\ndefault_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc=32768:32768\"]\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\nlock_type = \"file\"\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("registries.conf"), registries).unwrap();
    let socket = dir.join("engine.sock");
    let _ = std::fs::remove_file(&socket);
    // nsenter, not `ip netns exec`: the latter remounts /sys and hides the cgroup mounts runc needs
    let mut command = Command::new("nsenter");
    match netns {
        Some(netns) => command.arg(format!("--net=/run/netns/{netns}")),
        None => command.arg("--"),
    };
    command
        .arg("podman")
        .args(engine_storage(dir))
        .args(["system", "service", "--time=0", &format!("unix://{}", socket.display())])
        .env("CONTAINERS_CONF", dir.join("containers.conf"))
        .env("CONTAINERS_REGISTRIES_CONF", dir.join("registries.conf"))
        .stdout(Stdio::null())
        .stderr(std::fs::OpenOptions::new().create(true).append(true).open(dir.join("engine.log")).unwrap())
        .spawn()
        .expect("starting podman system service")
}

/// Remove every container the engine of `dir` holds (what a test left running).
pub(crate) fn remove_containers(netns: Option<&str>, dir: &Path) {
    let mut command = Command::new("nsenter");
    match netns {
        Some(netns) => command.arg(format!("--net=/run/netns/{netns}")),
        None => command.arg("--"),
    };
    let _ = command
        .arg("podman")
        .args(engine_storage(dir))
        .args(["rm", "--all", "--force", "--time", "0"])
        .env("CONTAINERS_CONF", dir.join("containers.conf"))
        .output();
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_agent(true);
        if let Some(mut relay) = self.relay.take() {
            let _ = relay.kill();
            let _ = relay.wait();
        }
        // what a failed test left running goes, then the engine, the namespace and the link
        remove_containers(Some(&self.netns), &self.dir);
        let _ = self.engine.kill();
        let _ = self.engine.wait();
        for forwarder in &mut self.forwarders {
            let _ = forwarder.kill();
            let _ = forwarder.wait();
        }
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let prefix = self.dir.display().to_string();
        let mut ours: Vec<&str> = mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|m| m.starts_with(&prefix)).collect();
        ours.sort_by(|a, b| b.cmp(a));
        for mount in ours {
            let _ = Command::new("umount").args(["-l", mount]).output();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).output();
        let _ = Command::new("ip").args(["link", "del", &self.veth]).output();
        let _ = std::fs::remove_dir_all(self.secrets_dir());
    }
}

/// The test's Capstan, its administrator and a deployer of the service.
pub(crate) struct World {
    pub(crate) server: Capstan,
    pub(crate) admin: String,
    pub(crate) port: u16,
    pub(crate) images: Images,
}

impl World {
    /// `capstan serve --dev` on `data` with the test administrator logged in, and `images`.
    pub(crate) fn start(data: &Path, images: Images) -> World {
        let server = Capstan::start(with_test_admin(dev_command(data)));
        let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
        let port: u16 = server.addr.rsplit(':').next().unwrap().parse().unwrap();
        World { server, admin, port, images }
    }

    pub(crate) fn ok(&self, method: &str, body: Value) -> Value {
        ok(&self.server, &self.admin, method, body)
    }

    /// `method` with the body `body` makes of the service's revision as read, read again and
    /// sent again while it answers `conflict`: the managers write their records on the service
    /// (the mail manager's inbound target follows its ready replicas), as they would under an
    /// operator's hands.
    pub(crate) fn at_revision(&self, method: &str, service: &str, body: impl Fn(&Value) -> Value) -> Value {
        eventually(&format!("{method} at the service's revision"), CONVERGE, || {
            let current = self.ok("services.get", json!({ "id": service }));
            let reply = self.server.call_as(&self.admin, method, &body(&current["revision"]));
            match reply.status {
                200 => Ok(reply.json()),
                409 if reply.json()["error"]["code"] == "conflict" => Err(reply.body.clone()),
                status => panic!("{method}: HTTP {status}: {}", reply.body),
            }
        })
    }

    pub(crate) fn status(&self, service: &str) -> Value {
        self.ok("runtime.getServiceStatus", json!({ "serviceId": service }))["targets"][0].clone()
    }

    /// Push `image` to the service's repository as a release `tag` through a deployment
    /// operation, and promote it: the service then runs its digest.
    /// A service `name` of `org` publishing port 8080 as 18080 on its node, and a deployer
    /// granted to release it: (service id, (deployer username, token), the deployer as created).
    pub(crate) fn published_service(&self, org: &str, name: &str) -> (String, (String, String), Value) {
        let body = json!({ "organizationId": org, "name": name, "image": "nginx:1.27",
                           "ports": [{ "port": 8080, "protocol": "http", "publicPort": 18080 }] });
        let service = self.ok("services.create", body)["id"].as_str().unwrap().to_string();
        let created = self.ok("deployers.create", json!({ "username": format!("ci-{name}") }));
        self.ok("deployers.grant", json!({ "serviceId": service, "userId": created["userId"], "capabilities": DEPLOYER_CAPABILITIES }));
        let deployer = (created["username"].as_str().unwrap().to_string(), created["token"].as_str().unwrap().to_string());
        (service, deployer, created)
    }

    /// `capstan deploy` (as `deployer`) of a release whose container exits at once: the CLI
    /// ends `rollout-failed` naming the failed replica, its routes are refused
    /// `rollout-not-healthy`, some node answers `v3` throughout; `capstan deploy --rollback
    /// 3.0.0` brings both replicas back to `v3` (digest `v3`), healthy.
    fn deploy_fails_then_rolls_back(&self, dir: &Path, service: &str, deployer: &(String, String), nodes: &[Node], v3: &str) {
        let w = self;
        let config = dir.join("deployer-config");
        let status = |id: &str| w.ok("deployments.getStatus", json!({ "operationId": id }));
        let listed = w.ok("deployments.list", json!({ "serviceId": service }));
        let current = &listed["items"][0];
        assert_eq!((current["tag"].as_str(), current["current"].as_bool()), (Some("3.0.0"), Some(true)), "{listed}");
        assert_eq!(current["rollout"]["state"], "healthy", "{listed}");
        assert_eq!(
            (current["rollout"]["clusters"][0]["wanted"].as_u64(), current["rollout"]["clusters"][0]["healthy"].as_u64()),
            (Some(2), Some(2))
        );

        let archive = w.images.archive("crash");
        let mut cmd = crate::support::client(&w.server, &deployer.1, &config);
        cmd.args(["deploy", service, "--tag", "4.0.0", "--image", &archive, "--route", "crash.example.com/", "--timeout", "3m", "--json"]);
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // some node answers v3 throughout: the rollout replaces one slot at a time
        while child.try_wait().unwrap().is_none() {
            let pages: Vec<Option<String>> = nodes.iter().map(Node::page).collect();
            assert!(pages.contains(&Some("v3".into())), "no node answered v3 during the failing rollout: {pages:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
        let out = child.wait_with_output().unwrap();
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(!out.status.success(), "a release that exits must fail its deploy: {printed}");
        let refused: Value = serde_json::from_str(printed.trim()).unwrap_or_else(|e| panic!("{e}: {printed}"));
        assert_eq!(refused["error"]["code"], "rollout-failed", "{refused}");
        let operation = refused["error"]["data"]["operationId"].as_str().unwrap().to_string();
        let failed = &refused["error"]["data"]["rollout"];
        assert_eq!(failed["state"], "failed", "{failed}");
        let short = failed["clusters"][0]["shortfall"].as_array().unwrap();
        assert!(short.iter().any(|s| s["state"] == "failed" && s["reason"].as_str().is_some_and(|r| r.starts_with("exited"))), "{failed}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains(&deployer.1), "the token never shows");

        // its routes wait for a healthy rollout
        let session = w.server.call("auth.exchangeToken", &json!({ "token": deployer.1 }).to_string()).expect_json(200);
        let machine = session["token"].as_str().unwrap().to_string();
        let op = status(&operation);
        let body = json!({ "operationId": operation, "expectedRevision": op["revision"] });
        let refusal = w.server.call_as(&machine, "deployments.promoteRoute", &body).expect_error(409, "rollout-not-healthy");
        assert_eq!(refusal["data"]["rollout"]["state"], "failed", "{refusal}");
        let preflight =
            w.server.call_as(&machine, "deployments.getPreflight", &json!({ "phase": "route", "operationId": operation })).expect_json(200);
        assert!(preflight["blockers"].as_array().unwrap().iter().any(|b| b["code"] == "rollout-not-healthy"), "{preflight}");

        // rolled back to the kept v3 by its tag: every replica runs v3's digest, healthy
        let exited = crate::support::cli(&w.server, &deployer.1, &config, &["deploy", service, "--rollback", "3.0.0", "--timeout", "3m"]);
        assert!(exited.status.success(), "{}\n{}", exited.stdout, exited.stderr);
        assert!(exited.stdout.contains("runs 3.0.0"), "{}", exited.stdout);
        w.converged(service, "web runs v3 again everywhere", |t| {
            t["slots"].as_array().unwrap().iter().all(|s| s["ready"] == true && s["imageDigest"] == v3)
        });
        for node in nodes {
            assert_eq!(node.page().as_deref(), Some("v3"), "{} answers v3 after the rollback", node.netns);
        }
        let listed = w.ok("deployments.list", json!({ "serviceId": service }));
        let by_tag = |tag: &str| listed["items"].as_array().unwrap().iter().find(|i| i["tag"] == tag).cloned().unwrap();
        assert_eq!(by_tag("3.0.0")["current"], true, "{listed}");
        assert_eq!(by_tag("3.0.0")["rollout"]["state"], "healthy", "{listed}");
        assert!(by_tag("3.0.0")["rolledBackAt"].is_u64(), "{listed}");
        assert_eq!(
            (by_tag("4.0.0")["current"].as_bool(), by_tag("4.0.0")["rollbackTarget"].as_bool()),
            (Some(false), Some(true)),
            "{listed}"
        );
        assert_eq!(status(&operation)["rollout"]["state"], "superseded");
        // the release it runs is no rollback target; a tag it never ran is refused by name
        let current = w.ok("services.get", json!({ "id": service }));
        for (release, code) in [("3.0.0", "release-current"), ("9.9.9", "release-not-kept")] {
            let body = json!({ "serviceId": service, "release": release, "expectedServiceRevision": current["revision"] });
            w.server.call_as(&machine, "deployments.rollback", &body).expect_error(409, code);
        }
    }

    pub(crate) fn release(&self, service: &str, deployer: &(String, String), tag: &str, image: &str) -> String {
        let session = self.server.call("auth.exchangeToken", &json!({ "token": deployer.1 }).to_string()).expect_json(200);
        let machine = session["token"].as_str().unwrap().to_string();
        let reserve = json!({ "serviceId": service, "tag": tag, "mutationId": format!("release-{service}-{tag}") });
        let operation = self.server.call_as(&machine, "deployments.reserve", &reserve).expect_json(200);
        let reference = operation["reference"].as_str().unwrap().to_string();
        let creds = format!("{}:{}", deployer.0, deployer.1);
        run(
            "skopeo",
            &[
                "--insecure-policy",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                "--dest-creds",
                &creds,
                &self.images.archive(image),
                &format!("docker://{reference}"),
            ],
        );
        let status = self.server.call_as(&machine, "deployments.getStatus", &json!({ "operationId": operation["id"] })).expect_json(200);
        assert_eq!(status["state"], "image-pushed", "{status}");
        let current = self.ok("services.get", json!({ "id": service }));
        let promote = json!({ "operationId": operation["id"], "expectedRevision": status["revision"], "expectedServiceRevision": current["revision"] });
        let promoted = self.server.call_as(&machine, "deployments.promote", &promote).expect_json(200);
        assert_eq!(promoted["state"], "promoted", "{promoted}");
        status["digest"].as_str().unwrap().to_string()
    }

    /// Two nodes of `cluster`, numbered `first` and `first + 1` (tests running at once use
    /// other numbers: runtime 0–3, runtime_logs 4, runtime_ingress 6–7), each its own namespace, engine and agent, enrolled and live; the first
    /// runs the cluster's relay and the second's runtime session rides it.
    pub(crate) fn two_nodes(&self, dir: &Path, cluster: &str, first: u32) -> Vec<Node> {
        let w = self;
        let mut nodes: Vec<Node> = (first..first + 2).map(|i| Node::start(dir, i, w.port)).collect();
        for node in &mut nodes {
            let code = w.ok("nodes.createJumpCommand", json!({ "clusterId": cluster }))["code"].as_str().unwrap().to_string();
            node.enroll(&code, w.port);
        }
        let settings = w.ok("settings.get", json!({}));
        w.ok("settings.update", json!({ "expectedRevision": settings["revision"], "set": { "clusterRelayZone": "relays.example.com" } }));
        let got = w.ok("clusters.get", json!({ "id": cluster }));
        w.ok("clusters.enableRelay", json!({ "id": cluster, "expectedRevision": got["revision"] }));
        w.ok("relays.mutateCredential", json!({ "clusterId": cluster, "action": "ensure", "mutationId": "e2e-relay" }));
        let exported = w.ok("relays.exportAuthorization", json!({ "clusterId": cluster, "expectedGeneration": 1 }));
        nodes[0].start_relay(exported["authorization"].as_str().unwrap());
        eventually("the relay is live", CONVERGE, || {
            let listed = w.ok("relays.list", json!({ "clusterIds": [cluster] }));
            if listed["items"][0]["live"] == true { Ok(()) } else { Err(format!("{listed}\n{}", nodes[0].relay_log())) }
        });
        let (first, second) = nodes.split_at_mut(1);
        second[0].carried_by(&first[0]);
        for node in &mut nodes {
            node.start_agent();
        }
        for node in &nodes {
            eventually("the node is live", CONVERGE, || {
                let got = w.ok("nodes.get", json!({ "id": node.node_id }));
                if got["live"] == true { Ok(()) } else { Err(got.to_string()) }
            });
        }
        nodes
    }

    /// The service's target once its verdict reads converged, every slot it shows is running
    /// and ready (the verdict is written after the step that admits a slot, so for a moment a new
    /// slot shows beside the earlier verdict), and `check` holds.
    pub(crate) fn converged(&self, service: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        eventually(what, CONVERGE, || {
            let target = self.status(service);
            let slots_ready = target["slots"].as_array().is_some_and(|s| s.iter().all(|s| s["phase"] == "running" && s["ready"] == true));
            if target["verdict"]["state"] == "converged" && slots_ready && check(&target) { Ok(target) } else { Err(target.to_string()) }
        })
    }
}

#[test]
fn services_run_on_two_nodes_roll_one_slot_at_a_time_survive_an_agent_killed_and_leave_nothing_behind() {
    if skipped() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let images = Images::build(dir.path(), &["v1", "v2", "v3", "crash"]);
    let w = World::start(&dir.path().join("data"), images);
    // a node stops counting as live 3 s after its last beat
    let settings = w.ok("settings.get", json!({}));
    w.ok("settings.update", json!({ "expectedRevision": settings["revision"], "set": { "nodeObservationFreshnessMs": 3000 } }));

    let org = w.ok("organizations.create", json!({ "name": "acme" }))["id"].as_str().unwrap().to_string();
    let cluster = w.ok("clusters.create", json!({ "name": "edge" }))["cluster"]["id"].as_str().unwrap().to_string();
    let (web, deployer, created) = w.published_service(&org, "web");
    let v1 = w.release(&web, &deployer, "1.0.0", "v1");

    // ---- two nodes, each its own namespace, engine and agent; the second rides the relay ----
    let mut nodes = w.two_nodes(dir.path(), &cluster, 0);

    // ---- the spec: every node, one replica, an HTTP health check ----
    let started = Instant::now();
    let spec = w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": web, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true },
                "replicasPerNode": 1, "health": { "kind": "http", "port": 8080, "path": "/", "intervalMs": 1000, "threshold": 2 } }),
    );
    let target = w.converged(&web, "web runs on both nodes", |t| t["slots"].as_array().is_some_and(|s| s.len() == 2));
    eprintln!("runtime.setServiceSpec to two ready containers (first pulls included): {:.1} s", started.elapsed().as_secs_f64());
    for slot in target["slots"].as_array().unwrap() {
        assert_eq!((slot["phase"].as_str(), slot["ready"].as_bool()), (Some("running"), Some(true)), "{target}");
        assert_eq!(slot["imageDigest"], v1.as_str(), "{target}");
    }
    for node in &nodes {
        assert_eq!(node.page().as_deref(), Some("v1"), "{} answers on its own address", node.netns);
        assert_eq!(node.containers(&web).len(), 1);
    }
    let relay_log = nodes[0].relay_log();
    assert!(
        relay_log.lines().any(|l| l.contains("carrying a node's runtime session") && l.contains(&nodes[1].node_id)),
        "the second node's session rides the relay:\n{relay_log}"
    );

    // ---- `capstan deploy` of a new image rolls one slot at a time: some node answers
    // throughout, and the command returns once both replicas run the new digest ----
    let mut cmd = crate::support::client(&w.server, &deployer.1, &dir.path().join("deployer-config"));
    let archive = w.images.archive("v2");
    cmd.args(["deploy", &web, "--tag", "2.0.0", "--image", &archive, "--timeout", "3m", "--json"]);
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut seen_mixed = false;
    while child.try_wait().unwrap().is_none() {
        let pages: Vec<Option<String>> = nodes.iter().map(Node::page).collect();
        assert!(pages.iter().any(Option::is_some), "no node answered during the rollout: {pages:?}");
        seen_mixed |= pages.contains(&Some("v1".into())) && pages.contains(&Some("v2".into()));
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let deployed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "capstan deploy of v2: {deployed}\n{}", String::from_utf8_lossy(&out.stderr));
    let deployed: Value = serde_json::from_str(deployed.trim()).unwrap();
    let v2 = deployed["digest"].as_str().unwrap().to_string();
    assert_eq!((deployed["state"].as_str(), deployed["rollout"]["state"].as_str()), (Some("promoted"), Some("healthy")), "{deployed}");
    // done means done: both replicas answer v2 the moment the command returns
    for node in &nodes {
        assert_eq!(node.page().as_deref(), Some("v2"), "{} answers v2 once capstan deploy returned", node.netns);
    }
    let target =
        w.converged(&web, "web runs v2 everywhere", |t| t["slots"].as_array().unwrap().iter().all(|s| s["imageDigest"] == v2.as_str()));
    assert!(target["slots"].as_array().unwrap().iter().all(|s| s["restarts"] == 1), "each slot was replaced once: {target}");
    eprintln!("rolled v1 -> v2 one slot at a time (both versions answered at once: {seen_mixed})");

    // ---- kill -9 of an agent mid-rollout leaves no duplicate ----
    let v3 = w.release(&web, &deployer, "3.0.0", "v3");
    eventually("the rollout to v3 began", CONVERGE, || {
        let target = w.status(&web);
        if target["verdict"]["state"] != "converged" { Ok(()) } else { Err(target.to_string()) }
    });
    nodes[0].stop_agent(true);
    std::thread::sleep(Duration::from_secs(2));
    nodes[0].start_agent();
    w.converged(&web, "web runs v3 everywhere", |t| t["slots"].as_array().unwrap().iter().all(|s| s["imageDigest"] == v3.as_str()));
    for node in &nodes {
        let containers = node.containers(&web);
        assert_eq!(containers.len(), 1, "one container per node after the kill, no duplicate, no orphan: {containers:?}\n{}", node.log());
        assert_eq!(node.page().as_deref(), Some("v3"));
    }

    // ---- an engine restart that took the containers with it: the runtime brings them back ----
    nodes[0].restart_engine();
    eventually("the stopped replica is reported", CONVERGE, || {
        let target = w.status(&web);
        if target["verdict"]["state"] != "converged" { Ok(()) } else { Err(target.to_string()) }
    });
    w.converged(&web, "web runs again after the engine restart", |t| {
        t["slots"].as_array().unwrap().iter().all(|s| s["ready"] == true && s["imageDigest"] == v3.as_str())
    });
    assert_eq!(nodes[0].page().as_deref(), Some("v3"), "the node answers again after its engine restarted");
    assert_eq!(nodes[0].containers(&web).len(), 1, "{}", nodes[0].log());

    // ---- the rollout is the release's evidence: one that exits fails, and is rolled back ----
    w.deploy_fails_then_rolls_back(dir.path(), &web, &deployer, &nodes, &v3);

    // ---- a second service scales 1 -> 2 per node and back (no published port) ----
    let api = w.ok(
        "services.create",
        json!({ "organizationId": org, "name": "api", "image": "nginx:1.27", "ports": [{ "port": 8080, "protocol": "tcp" }] }),
    )["id"]
        .as_str()
        .unwrap()
        .to_string();
    w.ok("deployers.grant", json!({ "serviceId": api, "userId": created["userId"], "capabilities": DEPLOYER_CAPABILITIES }));
    w.release(&api, &deployer, "1.0.0", "v1");
    let api_spec = |revision: Value, replicas: u32| {
        w.ok(
            "runtime.setServiceSpec",
            json!({ "serviceId": api, "clusterId": cluster, "expectedRevision": revision, "placement": { "everyNode": true },
                    "replicasPerNode": replicas, "health": { "kind": "tcp", "port": 8080, "intervalMs": 1000 } }),
        )
    };
    let written = api_spec(Value::Null, 1);
    w.converged(&api, "api runs once per node", |t| t["slots"].as_array().unwrap().len() == 2);
    let written = api_spec(written["revision"].clone(), 2);
    w.converged(&api, "api runs twice per node", |t| t["slots"].as_array().unwrap().len() == 4);
    for node in &nodes {
        let containers = node.containers(&api);
        assert_eq!(containers.len(), 2, "{}: {containers:?}\n{}\n{}", node.netns, w.status(&api), node.log());
    }
    api_spec(written["revision"].clone(), 1);
    w.converged(&api, "api runs once per node again", |t| t["slots"].as_array().unwrap().len() == 2);
    for node in &nodes {
        eventually("the extra replica is removed", CONVERGE, || {
            let n = node.containers(&api).len();
            if n == 1 { Ok(()) } else { Err(format!("{n} containers")) }
        });
    }

    // ---- a deploy-on-push service runs what is pushed to the tag its image names ----
    let pushed = w.ok(
        "services.create",
        json!({ "organizationId": org, "name": "pushed", "image": "nginx:1.27", "ports": [{ "port": 8080, "protocol": "tcp" }] }),
    );
    let pushed_id = pushed["id"].as_str().unwrap().to_string();
    let tagged = format!("127.0.0.1:{}/workloads/pushed-{}:latest", w.port, &pushed_id["svc_".len().."svc_".len() + 12]);
    let update = json!({ "id": pushed_id, "expectedRevision": pushed["revision"], "image": tagged, "deployOnPush": true });
    w.ok("services.update", update);
    let admin_creds = format!("{}:{}", TEST_ADMIN.0, TEST_ADMIN.1);
    let source = w.images.archive("v1");
    let destination = format!("docker://{tagged}");
    let push = ["--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false", "--dest-creds", &admin_creds, &source, &destination];
    run("skopeo", &push);
    let pinned = w.ok("services.get", json!({ "id": pushed_id }))["image"].as_str().unwrap().to_string();
    assert!(pinned.starts_with(&format!("{tagged}@sha256:")), "the push pinned the tag's digest: {pinned}");
    w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": pushed_id, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true },
                "replicasPerNode": 1, "health": { "kind": "tcp", "port": 8080, "intervalMs": 1000 } }),
    );
    let digest = pinned.rsplit_once('@').unwrap().1.to_string();
    w.converged(&pushed_id, "the pushed image runs on both nodes", |t| {
        t["slots"].as_array().is_some_and(|s| s.len() == 2 && s.iter().all(|s| s["ready"] == true && s["imageDigest"] == digest.as_str()))
    });

    // ---- a node whose agent stopped is reported, and its slot waits ----
    nodes[1].stop_agent(false);
    eventually("the stopped node reads offline", CONVERGE, || {
        let got = w.ok("nodes.get", json!({ "id": nodes[1].node_id }));
        if got["live"] == false { Ok(()) } else { Err(got.to_string()) }
    });
    w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": web, "clusterId": cluster, "expectedRevision": spec["revision"], "placement": { "everyNode": true },
                "replicasPerNode": 1, "health": { "kind": "tcp", "port": 8080, "intervalMs": 1000 } }),
    );
    eventually("web waits for the offline node", CONVERGE, || {
        let target = w.status(&web);
        if target["verdict"] == json!({ "state": "waiting", "reason": "node-offline" }) { Ok(()) } else { Err(target.to_string()) }
    });
    nodes[1].start_agent();
    w.converged(&web, "web converges once the node is back", |t| t["slots"].as_array().unwrap().iter().all(|s| s["ready"] == true));

    // ---- deleting the services leaves no container ----
    for service in [&web, &api, &pushed_id] {
        let current = w.ok("services.get", json!({ "id": service }));
        w.ok("services.delete", json!({ "id": service, "expectedRevision": current["revision"] }));
    }
    for service in [&web, &api, &pushed_id] {
        eventually("the service is gone", CONVERGE, || {
            let reply = w.server.call_as(&w.admin, "services.get", &json!({ "id": service }));
            if reply.status == 404 { Ok(()) } else { Err(format!("{}", reply.status)) }
        });
    }
    for node in &nodes {
        let left = [&web, &api, &pushed_id].iter().map(|s| node.containers(s).len()).sum::<usize>();
        assert_eq!(left, 0, "{} keeps containers", node.netns);
    }
    drop(nodes);
}

/// Every file under `dir` (recursively) holding any of `planted`: (path, which).
fn planted_in(dir: &Path, planted: &[&str]) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_dir() {
            found.extend(planted_in(&path, planted));
        } else if kind.is_file() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            for value in planted {
                if bytes.windows(value.len()).any(|w| w == value.as_bytes()) {
                    found.push((path.clone(), value.to_string()));
                }
            }
        }
    }
    found
}

fn sha256_text(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

#[test]
fn secrets_reach_the_container_sealed_rotate_one_replica_at_a_time_and_leave_no_plaintext_behind() {
    if skipped() || !crate::mail::gateway_available() {
        return;
    }
    const DB: &str = "planted-db-password-7c1e";
    const DB_ROTATED: &str = "planted-db-password-rotated-9d2f";
    const SHARED: &str = "planted-shared-token-4b8a";
    const TLS: &str = "planted-tls-key-material-e3a0";
    let dir = tempfile::tempdir().unwrap();
    let images = Images::build(dir.path(), &["vault"]);
    let data = dir.path().join("data");
    let w = World::start(&data, images);
    let org = w.ok("organizations.create", json!({ "name": "acme" }))["id"].as_str().unwrap().to_string();
    let cluster = w.ok("clusters.create", json!({ "name": "vaults" }))["cluster"]["id"].as_str().unwrap().to_string();
    let (vault, deployer, _) = w.published_service(&org, "vault");
    w.release(&vault, &deployer, "1.0.0", "vault");

    // the secrets, set as an operator does (sealed on the client, from standard input)
    let config = dir.path().join("cli");
    let set = |args: &[&str], value: &str| {
        let file = dir.path().join("value");
        std::fs::write(&file, value).unwrap();
        let mut cmd = crate::support::client(&w.server, &w.admin, &config);
        cmd.args(args).arg("--json").stdin(std::fs::File::open(&file).unwrap());
        let exited = crate::support::run_to_exit(cmd);
        std::fs::remove_file(&file).unwrap();
        crate::support::json_of(&exited)
    };
    set(&["secrets", "set", "--service", &vault, "DB_PASSWORD"], DB);
    set(&["secrets", "set", "--service", &vault, "TLS_KEY"], TLS);
    let secret_set =
        w.ok("secrets.createSecretSet", json!({ "organizationId": org, "name": "shared" }))["id"].as_str().unwrap().to_string();
    set(&["secrets", "set", "--secret-set", &secret_set, "SHARED_TOKEN"], SHARED);
    let configuration = w.ok("secrets.getServiceConfiguration", json!({ "serviceId": vault }));
    w.ok(
        "secrets.attachSecretSet",
        json!({ "serviceId": vault, "secretSetId": secret_set, "expectedSecretsRevision": configuration["secretsRevision"] }),
    );

    // ---- the two nodes (the second carried by the first's relay), each agent proving a key ----
    let mut nodes = w.two_nodes(dir.path(), &cluster, 2);
    for node in &nodes {
        let enrolled = eventually("the node proves its recipient", CONVERGE, || {
            let got = w.ok("nodes.get", json!({ "id": node.node_id }));
            if got["recipient"]["generation"] == 1 { Ok(got) } else { Err(got.to_string()) }
        });
        assert_eq!(enrolled["recipient"]["publicKey"].as_str().map(str::len), Some(44), "{enrolled}");
    }

    // ---- a mail address bound by the mail manager: its SMTP_* are the service's secrets ----
    // the test gateway's submission listener is on the host's loopback; the first node's replica
    // reaches it at the host's end of that node's link
    let (http, smtp) = (crate::support::free_port(), crate::support::free_port());
    let gateway = crate::mail::Gateway::start(http, smtp, &dir.path().join("gateway-state.json"));
    let node = &mut nodes[0];
    node.forwarders.push(forwarder(None, &format!("{}:{smtp}", node.host_ip), &format!("127.0.0.1:{smtp}")));
    eventually("the mail plugin running", CONVERGE, || {
        let reply = w.server.call_as(&w.admin, "plugins.get", &json!({ "id": "mail" }));
        if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
    });
    let settings = w.ok("settings.get", json!({}));
    let mail_settings = json!({ "mail.submissionHost": nodes[0].host_ip, "mail.submissionPort": smtp, "mail.submissionTls": "none" });
    w.ok("settings.update", json!({ "expectedRevision": settings["revision"], "set": mail_settings }));
    let gateway_url = format!("http://127.0.0.1:{http}");
    crate::mail::enroll_at_gateway(&w.server, &w.admin, &gateway_url, "capstan-runtime-e2e", &dir.path().join("gateway-cli"));
    crate::mail::update_service(&w.server, &w.admin, &vault, json!({ "mailAddresses": ["vault@acme.example"] }));
    eventually("the mail manager published SMTP_* for the service", CONVERGE, || {
        let keys = crate::mail::manifest_keys(&w.server, &w.admin, &vault);
        if keys.iter().any(|k| k == "SMTP_PASSWORD") { Ok(()) } else { Err(format!("{keys:?}")) }
    });
    let mail = w.ok("mail.getServiceMail", json!({ "organizationId": org, "serviceId": vault }));
    let smtp_user = mail["addresses"][0]["username"].as_str().unwrap().to_string();
    let credential = format!("capstan.{vault}.VAULT_ACME_EXAMPLE");
    let smtp_password = gateway.get(&format!("/test/passwords/{credential}")).1["password"].as_str().unwrap().to_string();

    // the cluster's ingress: the relay origin reaches its replicas by the secrets path
    eventually("the ingress plugin running", CONVERGE, || {
        let reply = w.server.call_as(&w.admin, "plugins.get", &json!({ "id": "ingress" }));
        if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
    });
    w.at_revision("ingress.designate", &vault, |revision| {
        json!({ "clusterId": cluster, "serviceId": vault, "expectedRevision": revision, "mutationId": format!("e2e-ingress-{revision}") })
    });
    let relay_origin = w.ok("clusters.get", json!({ "id": cluster }))["relay"]["origin"].as_str().unwrap().to_string();
    w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": vault, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true },
                "replicasPerNode": 1, "health": { "kind": "http", "port": 8080, "path": "/", "intervalMs": 1000 },
                "secrets": { "files": ["TLS_KEY"] } }),
    );
    w.converged(&vault, "vault runs with its secrets on both nodes", |t| t["slots"].as_array().is_some_and(|s| s.len() == 2));
    // the digests a replica answers: DB_PASSWORD's is `expect_db`'s, and TLS_KEY's file is there
    // while `tls` (not revoked)
    let digests_with = |node: &Node, expect_db: &str, tls: bool| {
        eventually("the container answers its secrets' digests", CONVERGE, || {
            let page = node.fetch("/cgi-bin/digests", 2).unwrap_or_default();
            // every replica knows its node; the ingress's knows its cluster's relay
            let want = [
                format!("node {}", node.node_id),
                format!("origin {relay_origin}"),
                format!("DB_PASSWORD {}", sha256_text(expect_db)),
                format!("SHARED_TOKEN {}", sha256_text(SHARED)),
                format!("SMTP_PASSWORD {}", sha256_text(&smtp_password)),
            ];
            let file = page.lines().any(|l| l == format!("file:TLS_KEY {}", sha256_text(TLS)));
            if want.iter().all(|line| page.lines().any(|l| l == line)) && file == tls { Ok(page) } else { Err(page) }
        })
    };
    let digests = |node: &Node, expect_db: &str| digests_with(node, expect_db, true);
    for node in &nodes {
        let page = digests(node, DB);
        assert!(!page.contains("file:DB_PASSWORD") && !page.contains("file:SHARED_TOKEN"), "only TLS_KEY is a file: {page}");
    }

    // ---- the preview and the service's secrets page name what each replica was handed ----
    let preview = w.ok("secrets.preview", json!({ "serviceId": vault }));
    assert_eq!(preview["replicas"].as_array().map(Vec::len), Some(2), "{preview}");
    for replica in preview["replicas"].as_array().unwrap() {
        let variables: Vec<&str> = replica["variables"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert!(["DB_PASSWORD", "SHARED_TOKEN", "SMTP_PASSWORD"].iter().all(|n| variables.contains(n)), "{preview}");
        let handed = (&replica["files"], &replica["received"], &replica["manifest"]);
        assert_eq!(handed, (&json!(["TLS_KEY"]), &json!(true), &preview["manifestNumber"]), "{preview}");
    }
    let replica = &preview["replicas"][1];
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let html = agent
        .get(w.server.url(&format!("/secrets/services/{vault}")))
        .header("cookie", format!("capstan_session={}", w.admin))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(html.contains(&format!("data-replica=\"{}\"", replica["slot"].as_str().unwrap())), "the page lists the replica");
    assert!(!html.contains(DB) && !html.contains(&smtp_password), "the page shows names only");

    // ---- the replica sends real mail through the gateway with the credentials it was given ----
    let dialogue = nodes[0].fetch("/cgi-bin/mail?vault@acme.example", 30).unwrap_or_default();
    let messages = gateway.get("/test/messages").1;
    let sent = messages["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
    assert_eq!(
        (sent["username"].as_str(), sent["mailFrom"].as_str()),
        (Some(smtp_user.as_str()), Some("vault@acme.example")),
        "{dialogue}\n{messages}"
    );
    assert!(!dialogue.contains(&smtp_password), "the SMTP dialogue answered the password");

    // ---- a rotation replaces the replicas, one at a time; the new value reaches each ----
    set(&["secrets", "set", "--service", &vault, "DB_PASSWORD"], DB_ROTATED);
    for node in &nodes {
        digests(node, DB_ROTATED);
    }
    let rotated = |t: &Value| t["slots"].as_array().is_some_and(|s| s.len() == 2 && s.iter().all(|s| s["restarts"] == 1));
    w.converged(&vault, "vault runs the rotated secret on both nodes", rotated);

    // ---- a revoked secret disappears from the next replicas ----
    let listed = w.ok("secrets.list", json!({ "owner": { "kind": "service", "serviceId": vault }, "limit": 200 }));
    let tls = listed["items"].as_array().unwrap().iter().find(|s| s["key"] == "TLS_KEY").expect("TLS_KEY listed")["id"].clone();
    w.ok("secrets.revoke", json!({ "id": tls }));
    for node in &nodes {
        digests_with(node, DB_ROTATED, false);
    }
    let revoked = |t: &Value| t["slots"].as_array().is_some_and(|s| s.len() == 2 && s.iter().all(|s| s["restarts"] == 2));
    w.converged(&vault, "vault runs without the revoked secret", revoked);
    let preview = w.ok("secrets.preview", json!({ "serviceId": vault }));
    assert!(preview["replicas"].as_array().unwrap().iter().all(|r| r["files"] == json!([])), "{preview}");

    // ---- an agent (the relay-carried one) restarted with its memory gone proves a new key ----
    let node = &mut nodes[1];
    node.stop_agent(true);
    node.start_agent();
    eventually("the restarted agent proves a new recipient", CONVERGE, || {
        let got = w.ok("nodes.get", json!({ "id": node.node_id }));
        if got["recipient"]["generation"] == 2 { Ok(()) } else { Err(got.to_string()) }
    });
    eventually("its assignment is sealed to the new key", CONVERGE, || {
        let records = w.ok("audit.list", json!({ "method": "runtime.issueMaterial" }));
        let to_new = records["records"].as_array().unwrap().iter().any(|r| {
            let targets = r["targets"].to_string();
            targets.contains(&format!("\"{}\"", node.node_id)) && targets.contains("recipient:2")
        });
        if to_new { Ok(()) } else { Err(records.to_string()) }
    });
    digests_with(node, DB_ROTATED, false);
    assert_eq!(node.containers(&vault).len(), 1, "adopted, not doubled");

    // ---- deleting the service leaves no container and no secret file ----
    w.at_revision("services.delete", &vault, |revision| json!({ "id": vault, "expectedRevision": revision }));
    eventually("the service is gone", CONVERGE, || {
        let reply = w.server.call_as(&w.admin, "services.get", &json!({ "id": vault }));
        if reply.status == 404 { Ok(()) } else { Err(format!("{}", reply.status)) }
    });
    for node in &nodes {
        eventually("no container of the service is left", CONVERGE, || {
            let left = node.containers(&vault);
            if left.is_empty() { Ok(()) } else { Err(format!("{left:?}")) }
        });
        let left: Vec<_> = std::fs::read_dir(node.secrets_dir()).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        assert!(left.is_empty(), "secret files outlived their containers: {left:?}");
    }

    // ---- no planted value anywhere Capstan, the agents or the relay write ----
    let planted = [DB, DB_ROTATED, SHARED, TLS, smtp_password.as_str()];
    let mut found = planted_in(&data, &planted);
    let server_log = format!("{}{}", w.server.stdout(), w.server.stderr());
    for node in &nodes {
        found.extend(planted_in(&node.state_dir(), &planted));
        found.extend(planted_in(&node.dir.join("volumes"), &planted));
        let logs = format!("{}{}", node.log(), node.relay_log());
        for value in planted {
            assert!(!logs.contains(value), "an agent or the relay logged a secret value");
        }
    }
    for value in planted {
        assert!(!server_log.contains(value), "Capstan logged a secret value");
    }
    assert!(found.is_empty(), "plaintext found: {found:?}");
    drop(nodes);
}
