//! Test support: start the real `capstan` binary, talk to it over HTTP, and prepare or inspect
//! its SQLite store through the library.

use capstan::store::{CollectionSpec, Document, Store};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a start may take before the test gives up.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to exit (after a refusal or SIGTERM).
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait for an expected log line.
pub const LOG_TIMEOUT: Duration = Duration::from_secs(10);

/// The prefix of the one stdout line announcing the bound address.
const SERVING: &str = "Capstan serving on http://";

/// A `capstan` command with no inherited `CAPSTAN_*` variables, so the machine's environment
/// cannot leak into a test.
pub fn capstan() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_capstan"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("CAPSTAN_") {
            cmd.env_remove(&key);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// `capstan serve --dev --data-dir DIR --listen 127.0.0.1:0`.
pub fn dev_command(data_dir: &Path) -> Command {
    let mut cmd = capstan();
    cmd.arg("serve").arg("--dev").arg("--data-dir").arg(data_dir).args(["--listen", "127.0.0.1:0"]);
    cmd
}

/// The administrator [`with_test_admin`] bootstraps: username and password.
pub const TEST_ADMIN: (&str, &str) = ("admin", "e2e-administrator-password-7Qx");

/// Bootstrap [`TEST_ADMIN`] through `CAPSTAN_ADMIN_ACCOUNT`.
pub fn with_test_admin(mut cmd: Command) -> Command {
    cmd.env("CAPSTAN_ADMIN_ACCOUNT", format!("{}:{}", TEST_ADMIN.0, TEST_ADMIN.1));
    cmd
}

/// `capstan` as a client of `server`: its origin in `CAPSTAN_URL`, `token` in `CAPSTAN_TOKEN`,
/// the client's configuration kept under `config` (`XDG_CONFIG_HOME`).
pub fn client(server: &Capstan, token: &str, config: &Path) -> Command {
    let mut cmd = capstan();
    cmd.env("CAPSTAN_URL", server.url("")).env("CAPSTAN_TOKEN", token).env("XDG_CONFIG_HOME", config);
    cmd
}

/// `capstan ARGS` as a [`client`] of `server`, run to its exit.
pub fn cli(server: &Capstan, token: &str, config: &Path, args: &[&str]) -> Exited {
    let mut cmd = client(server, token, config);
    cmd.args(args);
    run_to_exit(cmd)
}

/// A command that ended with success: its standard output.
pub fn succeeded(exited: &Exited) -> &str {
    assert!(exited.status.success(), "expected success\nstdout:\n{}\nstderr:\n{}", exited.stdout, exited.stderr);
    &exited.stdout
}

/// A `--json` command that ended with success: the one line of JSON it printed.
pub fn json_of(exited: &Exited) -> Value {
    serde_json::from_str(succeeded(exited).trim()).unwrap_or_else(|e| panic!("--json prints one line of JSON ({e}): {}", exited.stdout))
}

/// SHA-256 of `text`, lowercase hex (as the agent and the host hash a token's hex form).
pub fn sha256_hex(text: &str) -> String {
    let output = Command::new("sha256sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().and_then(|mut child| {
        child.stdin.take().unwrap().write_all(text.as_bytes())?;
        child.wait_with_output()
    });
    String::from_utf8(output.expect("sha256sum runs").stdout).unwrap().split_whitespace().next().unwrap().to_string()
}

/// A full production-style configuration under `dir`: SQLite store, file blobs, keyring path,
/// a public origin. The listen address is not included.
pub struct ProdConfig {
    pub public_origin: String,
    pub keyring_path: PathBuf,
    pub database: PathBuf,
    pub blobs: PathBuf,
    pub state_dir: PathBuf,
}

impl ProdConfig {
    /// Paths under `dir`; the keyring is generated with `capstan keyring generate`.
    pub fn under(dir: &Path) -> Self {
        let prod = ProdConfig {
            public_origin: "https://capstan.e2e.example".into(),
            keyring_path: dir.join("keyring.json"),
            database: dir.join("store").join("capstan.sqlite"),
            blobs: dir.join("blobs"),
            state_dir: dir.join("state"),
        };
        let mut cmd = capstan();
        cmd.args(["keyring", "generate", "--out"]).arg(&prod.keyring_path);
        let generated = run_to_exit(cmd);
        assert!(generated.status.success(), "capstan keyring generate should succeed: {generated:?}");
        prod
    }

    pub fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CAPSTAN_PUBLIC_ORIGIN", self.public_origin.clone()),
            ("CAPSTAN_KEYRING_PATH", self.keyring_path.display().to_string()),
            ("CAPSTAN_DATABASE_URL", format!("sqlite:{}", self.database.display())),
            ("CAPSTAN_BLOB_URL", format!("file:{}", self.blobs.display())),
            ("CAPSTAN_STATE_DIR", self.state_dir.display().to_string()),
        ]
    }

    /// `capstan serve --listen 127.0.0.1:0` with every required variable in the environment.
    pub fn command(&self) -> Command {
        let mut cmd = capstan();
        cmd.args(["serve", "--listen", "127.0.0.1:0"]);
        for (key, value) in self.vars() {
            cmd.env(key, value);
        }
        cmd
    }
}

type Shared = Arc<Mutex<String>>;

fn text_of(shared: &Shared) -> String {
    shared.lock().expect("output buffer lock").clone()
}

/// Copy a child's output into `buffer` line by line; send each line to `lines` too.
fn pump(stream: impl Read + Send + 'static, buffer: Shared, lines: Option<mpsc::Sender<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut raw = Vec::new();
        loop {
            raw.clear();
            match reader.read_until(b'\n', &mut raw) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&raw).into_owned();
                    buffer.lock().expect("output buffer lock").push_str(&line);
                    if let Some(tx) = &lines {
                        let _ = tx.send(line);
                    }
                }
            }
        }
    })
}

/// How a process ended.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Exited {
    /// Assert the process was refused with `code` and exit status `status`; returns stderr.
    pub fn assert_refused(&self, status: i32, code: &str) -> &str {
        assert_eq!(
            self.status.code(),
            Some(status),
            "expected exit status {status} (refusal {code}), got {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        let line = format!("capstan: refused ({code}): ");
        assert!(
            self.stderr.lines().any(|l| l.starts_with(&line)),
            "expected a stderr line starting {line:?}\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        assert!(!self.stdout.contains(SERVING), "a refused start must not serve; stdout:\n{}", self.stdout);
        &self.stderr
    }
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait().expect("polling the capstan process") {
            Some(status) => return Some(status),
            None if Instant::now() >= deadline => return None,
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Run a command that is expected to end by itself (a refusal, `--help`), with a timeout.
pub fn run_to_exit(mut cmd: Command) -> Exited {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawning capstan");
    let (stdout, stderr) = (Shared::default(), Shared::default());
    let readers = [
        pump(child.stdout.take().expect("piped stdout"), stdout.clone(), None),
        pump(child.stderr.take().expect("piped stderr"), stderr.clone(), None),
    ];
    let Some(status) = wait_with_timeout(&mut child, EXIT_TIMEOUT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "capstan was expected to exit by itself within {EXIT_TIMEOUT:?} but kept running\nstdout:\n{}\nstderr:\n{}",
            text_of(&stdout),
            text_of(&stderr)
        );
    };
    for reader in readers {
        reader.join().expect("output reader");
    }
    Exited { status, stdout: text_of(&stdout), stderr: text_of(&stderr) }
}

/// A running `capstan serve`; killed when dropped.
pub struct Capstan {
    child: Child,
    /// `127.0.0.1:PORT` as announced on stdout.
    pub addr: String,
    stdout: Shared,
    stderr: Shared,
    readers: Vec<JoinHandle<()>>,
    agent: ureq::Agent,
}

impl Capstan {
    /// Start a dev server on a fresh port with its data under `data_dir`.
    pub fn dev(data_dir: &Path) -> Capstan {
        Capstan::start(dev_command(data_dir))
    }

    /// Spawn `cmd` (a `capstan serve` binding port 0) and wait for its "serving on" line.
    pub fn start(mut cmd: Command) -> Capstan {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawning capstan");
        let (stdout, stderr) = (Shared::default(), Shared::default());
        let (tx, lines) = mpsc::channel();
        let readers = vec![
            pump(child.stdout.take().expect("piped stdout"), stdout.clone(), Some(tx)),
            pump(child.stderr.take().expect("piped stderr"), stderr.clone(), None),
        ];
        let deadline = Instant::now() + START_TIMEOUT;
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(SERVING) {
                        let named = rest.split_whitespace().next().unwrap_or_default();
                        let mut addr: std::net::SocketAddr =
                            named.parse().unwrap_or_else(|_| panic!("the serving line should name <ip>:<port>, got {line:?}"));
                        assert_ne!(addr.port(), 0, "the serving line names the bound port: {line:?}");
                        // a wildcard bind is reached on loopback
                        if addr.ip().is_unspecified() {
                            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                        }
                        break addr.to_string();
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed before the line: the process is ending
                    let status = wait_with_timeout(&mut child, EXIT_TIMEOUT);
                    if status.is_none() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    for reader in readers {
                        let _ = reader.join();
                    }
                    panic!(
                        "capstan exited ({status:?}) before announcing its address\nstdout:\n{}\nstderr:\n{}",
                        text_of(&stdout),
                        text_of(&stderr)
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "capstan did not announce its address within {START_TIMEOUT:?}\nstdout:\n{}\nstderr:\n{}",
                        text_of(&stdout),
                        text_of(&stderr)
                    );
                }
            }
        };
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            // with `Expect: 100-continue`, wait for the server's verdict before sending a body
            .timeout_await_100(Some(Duration::from_secs(30)))
            // a fresh connection per request: the server may close a connection after answering
            // without reading the body, and ureq does not retry on a stale pooled one
            .max_idle_connections(0)
            .build();
        Capstan { child, addr, stdout, stderr, readers, agent: config.into() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn stdout(&self) -> String {
        text_of(&self.stdout)
    }

    pub fn stderr(&self) -> String {
        text_of(&self.stderr)
    }

    /// Wait until stderr contains `needle`; returns stderr at that point.
    pub fn wait_for_stderr(&self, needle: &str) -> String {
        let deadline = Instant::now() + LOG_TIMEOUT;
        loop {
            let text = self.stderr();
            if text.contains(needle) {
                return text;
            }
            assert!(Instant::now() < deadline, "expected the server log to contain {needle:?} within {LOG_TIMEOUT:?}; stderr:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Send any request.
    pub fn send(&self, request: ureq::http::Request<impl ureq::AsSendBody>) -> Reply {
        let what = format!("{} {}", request.method(), request.uri());
        let mut response = self
            .agent
            .run(request)
            .unwrap_or_else(|e| panic!("{what} should get an HTTP answer, got the transport error {e}; server stderr:\n{}", self.stderr()));
        let header = |name: &str| response.headers().get(name).map(|v| v.to_str().expect("ascii header").to_string());
        let request_id = header("x-request-id");
        let content_type = header("content-type");
        let body = response.body_mut().read_to_string().unwrap_or_else(|e| panic!("{what}: reading the answer failed: {e}"));
        Reply { what, status: response.status().as_u16(), request_id, content_type, body }
    }

    /// `method path` with optional headers and body bytes (sent with a content-length).
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Reply {
        let mut builder = ureq::http::Request::builder().method(method).uri(self.url(path));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        match body {
            Some(bytes) => self.send(builder.body(bytes.to_vec()).expect("a valid request")),
            None => self.send(builder.body(()).expect("a valid request")),
        }
    }

    pub fn get(&self, path: &str) -> Reply {
        self.request("GET", path, &[], None)
    }

    /// `POST /api/v1/<method>` with a JSON body.
    /// Poll `GET /status` as a readiness probe would, until it answers 200 (at most 30 s), and
    /// return its body. For servers on a shared peer, where one read may be slow under load.
    pub fn ready_status(&self) -> Value {
        eventually("/status answering 200", Duration::from_secs(30), || {
            let reply = self.get("/status");
            if reply.status == 200 { Ok(reply.json()) } else { Err(format!("HTTP {}: {}", reply.status, reply.body)) }
        })
    }

    pub fn call(&self, method: &str, body: &str) -> Reply {
        self.request("POST", &format!("/api/v1/{method}"), &[("content-type", "application/json")], Some(body.as_bytes()))
    }

    /// `POST /api/v1/<method>` with a JSON body as the holder of `token`.
    pub fn call_as(&self, token: &str, method: &str, body: &Value) -> Reply {
        let bearer = format!("Bearer {token}");
        let headers = [("content-type", "application/json"), ("authorization", bearer.as_str())];
        self.request("POST", &format!("/api/v1/{method}"), &headers, Some(body.to_string().as_bytes()))
    }

    /// Log in over HTTP; the session token.
    pub fn login(&self, username: &str, password: &str) -> String {
        let answer =
            self.call("auth.login", &serde_json::json!({ "username": username, "password": password }).to_string()).expect_json(200);
        answer["token"].as_str().expect("a login answers a token").to_string()
    }

    /// `GET /status` as an administrator once it answers 200: the report with where the store
    /// and the blobs are (an anonymous one leaves them out). The server was started with
    /// [`with_test_admin`].
    pub fn admin_status(&self) -> Value {
        self.ready_status();
        let token = self.login(TEST_ADMIN.0, TEST_ADMIN.1);
        self.request("GET", "/status", &[("authorization", &format!("Bearer {token}"))], None).expect_json(200)
    }

    /// Write `request` (a whole HTTP/1.1 request) on a fresh connection and parse the answer.
    /// Write errors are ignored: the server may answer and close before reading everything,
    /// and the answer is still readable after that.
    pub fn raw(&self, request: &[u8]) -> Reply {
        let what = String::from_utf8_lossy(request.split(|b| *b == b'\r').next().unwrap_or_default()).into_owned();
        let mut stream = TcpStream::connect(&self.addr).unwrap_or_else(|e| panic!("{what}: connecting to {}: {e}", self.addr));
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = stream.write_all(request);
        let mut answer = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let complete = |answer: &[u8]| parse_answer(answer).is_some_and(|a| a.body.len() >= a.length);
        while !complete(&answer) {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break, // a reset after the answer arrived
            }
        }
        let Some(RawAnswer { status, headers, body, length }) = parse_answer(&answer) else {
            panic!("{what}: expected an HTTP answer, got {:?}; server stderr:\n{}", String::from_utf8_lossy(&answer), self.stderr());
        };
        assert!(body.len() >= length, "{what}: the answer was cut short: {:?}", String::from_utf8_lossy(&answer));
        let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        Reply {
            what,
            status,
            request_id: header("x-request-id"),
            content_type: header("content-type"),
            body: String::from_utf8_lossy(&body[..length]).into_owned(),
        }
    }

    /// Stop with SIGTERM and wait for the exit; returns the full output.
    pub fn stop(mut self) -> Exited {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("running kill -TERM");
        assert!(sent.success(), "kill -TERM {pid} failed: {sent:?}");
        let Some(status) = wait_with_timeout(&mut self.child, EXIT_TIMEOUT) else {
            panic!("capstan did not exit within {EXIT_TIMEOUT:?} of SIGTERM; stderr:\n{}", self.stderr());
        };
        for reader in std::mem::take(&mut self.readers) {
            reader.join().expect("output reader");
        }
        Exited { status, stdout: self.stdout(), stderr: self.stderr() }
    }
}

impl Drop for Capstan {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // The refusal codes each host method declares (the OpenAPI document's) stay true: the
        // server, a debug build, logs UNDECLARED_REFUSAL when a method answers another one. It
        // is printed here, and with CAPSTAN_TEST_STRICT_REFUSALS=1 the test that made it
        // answer fails. (What the log pump has read by now: the line was written when the
        // method answered.)
        if !std::thread::panicking() {
            let stderr = self.stderr();
            let undeclared: Vec<&str> = stderr.lines().filter(|l| l.contains(capstan::api::methods::UNDECLARED_REFUSAL)).collect();
            for line in &undeclared {
                eprintln!("undeclared refusal: {line}");
            }
            let strict = std::env::var_os("CAPSTAN_TEST_STRICT_REFUSALS").is_some_and(|v| v == "1");
            assert!(
                !strict || undeclared.is_empty(),
                "a host method answered a refusal code missing from its `.refuses(…)` (or at another status than \
                 the OpenAPI document shows): declare it where the method is registered\n{}",
                undeclared.join("\n")
            );
        }
    }
}

/// An HTTP answer read off a socket, once its head is complete.
struct RawAnswer<'a> {
    status: u16,
    /// Lower-cased names.
    headers: Vec<(String, String)>,
    /// The body bytes read so far.
    body: &'a [u8],
    /// The declared content-length.
    length: usize,
}

fn parse_answer(answer: &[u8]) -> Option<RawAnswer<'_>> {
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    let length = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    Some(RawAnswer { status, headers, body: &answer[end + 4..], length })
}

/// A whole `POST path` request with a chunked JSON body (no content-length).
pub fn chunked_post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut out =
        format!("POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
            .into_bytes();
    for chunk in body.chunks(1000) {
        out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// A whole `POST path` request with a JSON body and its content-length.
pub fn sized_post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut out =
        format!("POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len())
            .into_bytes();
    out.extend_from_slice(body);
    out
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Reply {
    /// `METHOD url`, for messages.
    pub what: String,
    pub status: u16,
    pub request_id: Option<String>,
    pub content_type: Option<String>,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{}: expected a JSON body, got {e} for {:?}", self.what, self.body))
    }

    /// Assert a 2xx-or-other `status` with a JSON body; returns the body.
    pub fn expect_json(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}: expected HTTP {status}, got {} with body {}", self.what, self.status, self.body);
        assert!(self.request_id.is_some(), "{}: every answer should carry x-request-id", self.what);
        let kind = self.content_type.as_deref().unwrap_or_default();
        assert!(kind.starts_with("application/json"), "{}: expected a JSON content type, got {kind:?}", self.what);
        self.json()
    }

    /// Assert the error envelope with `status` and `code`; returns the `error` object.
    pub fn expect_error(&self, status: u16, code: &str) -> Value {
        let body = self.expect_json(status);
        let error = check_envelope(&self.what, &body);
        assert_eq!(error["code"], code, "{}: expected error code {code}, got body {}", self.what, self.body);
        error
    }
}

/// `POST /api/v1/<method>` with `body` as the holder of `token`, answered 200: the JSON body.
pub fn ok(server: &Capstan, token: &str, method: &str, body: Value) -> Value {
    server.call_as(token, method, &body).expect_json(200)
}

/// The HTTP statuses [`refused`] takes a refusal to come with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusing {
    /// A client error (4xx).
    ClientError,
    /// A client error, or 503 for one worth retrying.
    ClientErrorOr503,
    /// Any error status (400 and up), for a refusal whose status the test does not pin.
    AnyError,
}

impl Refusing {
    fn admits(self, status: u16) -> bool {
        match self {
            Refusing::ClientError => (400..500).contains(&status),
            Refusing::ClientErrorOr503 => (400..500).contains(&status) || status == 503,
            Refusing::AnyError => status >= 400,
        }
    }
}

/// Assert `reply` is the refusal `code`, at a status `statuses` admits, in the error envelope;
/// returns the `error` object.
pub fn refused(reply: &Reply, statuses: Refusing, code: &str) -> Value {
    assert!(
        statuses.admits(reply.status),
        "{}: expected the refusal {code} ({statuses:?}), got HTTP {} {}",
        reply.what,
        reply.status,
        reply.body
    );
    let error = check_envelope(&reply.what, &reply.json());
    assert_eq!(error["code"], code, "{}: HTTP {} {}", reply.what, reply.status, reply.body);
    error
}

/// Lower-case ASCII letters and digits in words joined by single dashes.
pub fn is_kebab_case(code: &str) -> bool {
    !code.is_empty() && code.split('-').all(|word| !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
}

/// Check `{"error":{"code","message","retryable","data"?}}` exactly; returns the error object.
pub fn check_envelope(what: &str, body: &Value) -> Value {
    envelope_error(body).unwrap_or_else(|problem| panic!("{what}: {problem}"))
}

/// The error object of `{"error":{"code","message","retryable","data"?}}`, or what is wrong
/// with the envelope (for a test that gathers every problem before failing).
pub fn envelope_error(body: &Value) -> Result<Value, String> {
    let top = body.as_object().ok_or_else(|| format!("an error body should be an object, got {body}"))?;
    if top.keys().ne(["error"].iter()) {
        return Err(format!("an error body should hold only `error`, got {body}"));
    }
    let error = top["error"].as_object().ok_or_else(|| format!("`error` should be an object, got {body}"))?;
    if let Some(key) = error.keys().find(|k| !["code", "message", "retryable", "data"].contains(&k.as_str())) {
        return Err(format!("unexpected key {key:?} in error {body}"));
    }
    let code = error.get("code").and_then(Value::as_str).ok_or_else(|| format!("error.code should be a string in {body}"))?;
    if !is_kebab_case(code) {
        return Err(format!("error code {code:?} should be kebab-case"));
    }
    let message = error.get("message").and_then(Value::as_str).ok_or_else(|| format!("error.message should be a string in {body}"))?;
    if message.trim().is_empty() {
        return Err(format!("error.message should not be empty in {body}"));
    }
    if !error.get("retryable").is_some_and(Value::is_boolean) {
        return Err(format!("error.retryable should be a boolean in {body}"));
    }
    Ok(Value::Object(error.clone()))
}

/// Run `work` on the SQLite store at `db` (ledger collection declared, plus `collections`),
/// with the store dropped before this returns.
pub fn with_store<T, F, Fut>(db: &Path, collections: &[&str], work: F) -> T
where
    F: FnOnce(Store) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    runtime.block_on(async {
        let url = format!("sqlite:{}", db.display());
        let store = Store::open(&url, &capstan::store::StoreOptions::default()).await.unwrap_or_else(|e| panic!("opening {url}: {e}"));
        capstan::migrate::declare(&store).await.expect("declaring the ledger collection");
        for name in collections {
            store.declare(CollectionSpec::new(name)).await.unwrap_or_else(|e| panic!("declaring {name}: {e}"));
        }
        work(store).await
    })
}

pub fn insert_doc(db: &Path, collection: &str, id: &str, data: Value) -> Document {
    with_store(db, &[collection], |store| async move {
        store
            .transact(|tx| {
                let data = data.clone();
                async move { tx.insert(collection, id, data).await }
            })
            .await
            .unwrap_or_else(|e| panic!("inserting {collection}/{id}: {e}"))
    })
}

pub fn read_doc(db: &Path, collection: &str, id: &str) -> Option<Document> {
    with_store(db, &[collection], |store| async move {
        store.transact(|tx| async move { tx.get(collection, id).await }).await.unwrap_or_else(|e| panic!("reading {collection}/{id}: {e}"))
    })
}

/// The host chain's ledger document.
pub fn read_ledger(db: &Path) -> Option<Document> {
    read_doc(db, capstan::migrate::LEDGER_COLLECTION, "capstan")
}

impl Capstan {
    /// The administrator password a first `serve --dev` start printed on stdout, if any.
    pub fn printed_admin_password(&self) -> Option<String> {
        self.stdout().lines().find_map(|l| l.trim().strip_prefix("password:").map(|p| p.trim().to_string())).filter(|p| !p.is_empty())
    }
}

/// A loopback TCP port that was free a moment ago (for a peer that needs its port up front).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
    listener.local_addr().expect("the bound address").port()
}

impl Capstan {
    /// The node id announced on the serving line (`… as node ID`).
    pub fn node_id(&self) -> String {
        let stdout = self.stdout();
        stdout
            .lines()
            .find(|l| l.starts_with(SERVING))
            .and_then(|l| l.rsplit_once(" as node "))
            .map(|(_, id)| id.trim().to_string())
            .unwrap_or_else(|| panic!("the serving line should end with `as node ID`; stdout:\n{stdout}"))
    }

    /// Send SIGTERM without waiting for the exit (`stop` waits).
    pub fn terminate(&self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("running kill -TERM");
        assert!(sent.success(), "kill -TERM {pid} failed: {sent:?}");
    }

    /// Stop with SIGKILL (nothing runs on the way out) and wait for the exit; returns the
    /// output up to the kill.
    pub fn kill_hard(mut self) -> Exited {
        self.child.kill().expect("sending SIGKILL to capstan");
        let status = self.child.wait().expect("waiting for the killed capstan");
        for reader in std::mem::take(&mut self.readers) {
            reader.join().expect("output reader");
        }
        Exited { status, stdout: self.stdout(), stderr: self.stderr() }
    }
}

/// Poll `check` every 50 ms until it returns `Ok`, for at most `timeout`; on timeout, panic
/// with `what` and the last `Err` (the last thing observed).
pub fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(last) if Instant::now() >= deadline => panic!("{what}: not within {timeout:?}; last observed:\n{last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The object stored under `key` in a `file:<dir>` blob directory, as JSON (`None` if absent).
pub fn read_blob_json(blobs: &Path, key: &str) -> Option<Value> {
    let path = blobs.join("objects").join(format!("{key}~"));
    match std::fs::read(&path) {
        Ok(bytes) => Some(serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{} should hold JSON: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("reading {}: {e}", path.display()),
    }
}

impl Capstan {
    /// `POST /api/v1/<method>` with `body` as it is (any bytes), as the holder of `token` or
    /// anonymously.
    pub fn call_bytes(&self, token: Option<&str>, method: &str, body: &[u8]) -> Reply {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("content-type", "application/json")];
        headers.extend(bearer.as_deref().map(|b| ("authorization", b)));
        self.request("POST", &format!("/api/v1/{method}"), &headers, Some(body))
    }

    /// `GET /api/v1/methods` once this node's plugins have loaded (the first-party ones load in
    /// the background after the start): every method, the host's and the plugins'.
    pub fn listed_methods(&self) -> Vec<Value> {
        eventually("the plugins loaded", Duration::from_secs(120), || {
            let status = self.get("/status").json();
            let plugins = &status["plugins"];
            if plugins["loading"] == 0 && plugins["loaded"].as_u64() >= Some(1) { Ok(()) } else { Err(status.to_string()) }
        });
        let listing = self.get("/api/v1/methods").expect_json(200);
        listing["methods"].as_array().unwrap_or_else(|| panic!("`methods` should be an array: {listing}")).clone()
    }
}

/// Every kind of caller the API tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Administrator,
    /// An owner of [`Identities::organization_id`].
    Owner,
    /// A member of it.
    Member,
    /// A person with no membership anywhere.
    Stranger,
    /// The machine user of [`Identities::cluster_id`].
    ClusterMachine,
    /// A deployer granted `deployment:status` on [`Identities::service_id`].
    Deployer,
    Anonymous,
}

impl Kind {
    pub const ALL: [Kind; 7] =
        [Kind::Administrator, Kind::Owner, Kind::Member, Kind::Stranger, Kind::ClusterMachine, Kind::Deployer, Kind::Anonymous];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Administrator => "administrator",
            Kind::Owner => "owner",
            Kind::Member => "member",
            Kind::Stranger => "stranger",
            Kind::ClusterMachine => "cluster machine",
            Kind::Deployer => "deployer",
            Kind::Anonymous => "anonymous",
        }
    }
}

/// One organization with a service, a cluster, and a session of every [`Kind`], made over the
/// API by the administrator of a server started [`with_test_admin`].
pub struct Identities {
    pub organization_id: String,
    pub service_id: String,
    pub cluster_id: String,
    pub member_id: String,
    pub member_password: String,
    pub deployer_id: String,
    /// The deployer's machine token (what `auth.exchangeToken` takes).
    pub deployer_token: String,
    /// A session token per kind, in [`Kind::ALL`] order; none for [`Kind::Anonymous`].
    tokens: Vec<Option<String>>,
}

impl Identities {
    pub fn create(server: &Capstan) -> Identities {
        let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
        let ok = |method: &str, body: Value| server.call_as(&admin, method, &body).expect_json(200);
        let id = |value: &Value| value.as_str().unwrap_or_else(|| panic!("an id, got {value}")).to_string();
        let person = |username: &str| {
            let created = ok("admin.createUser", serde_json::json!({ "username": username }));
            let password = id(&created["password"]);
            (id(&created["userId"]), server.login(username, &password), password)
        };
        let exchange = |token: &str| {
            let answer = server.call("auth.exchangeToken", &serde_json::json!({ "token": token }).to_string()).expect_json(200);
            id(&answer["token"])
        };

        let organization_id = id(&ok("organizations.create", serde_json::json!({ "name": "fixture" }))["id"]);
        let (owner_id, owner, _) = person("owner");
        let (member_id, member, member_password) = person("member");
        let (_, stranger, _) = person("stranger");
        for (user, role) in [(&owner_id, "owner"), (&member_id, "member")] {
            ok("organizations.setMember", serde_json::json!({ "organizationId": organization_id, "userId": user, "role": role }));
        }
        let cluster = ok("clusters.create", serde_json::json!({ "name": "fixture" }));
        let machine = exchange(&id(&cluster["machineUser"]["token"]));
        let service = serde_json::json!({ "name": "web", "organizationId": organization_id, "image": "nginx:1.27" });
        let service_id = id(&ok("services.create", service)["id"]);
        let deployer = ok("deployers.create", serde_json::json!({ "username": "deployer" }));
        let (deployer_id, deployer_token) = (id(&deployer["userId"]), id(&deployer["token"]));
        let grant = serde_json::json!({ "serviceId": service_id, "userId": deployer_id, "capabilities": ["deployment:status"] });
        ok("deployers.grant", grant);
        let deployer = exchange(&deployer_token);
        Identities {
            organization_id,
            service_id,
            cluster_id: id(&cluster["cluster"]["id"]),
            member_id,
            member_password,
            deployer_id,
            deployer_token,
            tokens: vec![Some(admin), Some(owner), Some(member), Some(stranger), Some(machine), Some(deployer), None],
        }
    }

    /// The session token of `kind` (`None` for [`Kind::Anonymous`]).
    pub fn token(&self, kind: Kind) -> Option<&str> {
        let index = Kind::ALL.iter().position(|k| *k == kind).expect("every kind is in Kind::ALL");
        self.tokens[index].as_deref()
    }

    /// Call `method` with `body` as `kind`.
    pub fn call(&self, server: &Capstan, kind: Kind, method: &str, body: &[u8]) -> Reply {
        server.call_bytes(self.token(kind), method, body)
    }
}

/// Sets its flag when dropped, also while a panic unwinds: the threads of a `thread::scope`
/// that loop until the flag is set then end, so a failing assertion fails the test instead of
/// leaving the scope waiting for them forever.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Run a command whose standard input is a terminal (a pseudo-terminal this test holds), with
/// `typed` already typed on it, to the end: what a person at a terminal sees (standard output
/// and standard error stay pipes, so the prompt is read from standard error).
pub fn run_on_terminal(mut cmd: Command, typed: &str) -> Exited {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two new descriptors into the integers it is given; the name,
    // termios and window size are left to their defaults (null).
    let opened = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut terminal = std::fs::File::from(master);
    // canonical mode keeps the line until the command reads it
    terminal.write_all(typed.as_bytes()).expect("typing on the terminal");
    cmd.stdin(Stdio::from(slave));
    let exited = run_to_exit(cmd);
    drop(terminal);
    exited
}

/// Keep what `child` writes to its piped stderr, read on a thread of its own, so a long-running
/// child never blocks on a full pipe and a test can show its log.
pub fn keep_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let kept = Arc::new(Mutex::new(String::new()));
    let mut pipe = child.stderr.take().expect("the child's stderr is piped");
    let sink = kept.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    kept
}

/// What an [`HttpsTarget`] answers every request: a status, headers and a body.
#[derive(Debug, Clone)]
pub struct TargetReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl TargetReply {
    pub fn new(status: u16, body: &str) -> TargetReply {
        TargetReply { status, headers: Vec::new(), body: body.into() }
    }
}

/// A request an [`HttpsTarget`] was sent: the SNI name of its TLS connection and its head.
#[derive(Debug, Clone)]
pub struct TargetRequest {
    pub sni: Option<String>,
    pub head: String,
}

/// A loopback HTTPS server whose certificate (for `names`) a private CA made here issued,
/// answering [`TargetReply`] (changeable) to every request and keeping what it was sent.
pub struct HttpsTarget {
    pub addr: std::net::SocketAddr,
    /// The private CA's certificate, PEM.
    pub ca_pem: String,
    pub reply: Arc<Mutex<TargetReply>>,
    pub seen: Arc<Mutex<Vec<TargetRequest>>>,
}

impl HttpsTarget {
    pub fn start(names: &[&str], reply: TargetReply) -> HttpsTarget {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "Capstan e2e private CA");
        ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap()).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let leaf = rcgen::CertificateParams::new(names).unwrap().signed_by(&leaf_key, &*ca).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone(), ca.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
            )
            .unwrap();
        let config = Arc::new(config);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let reply = Arc::new(Mutex::new(reply));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (answer, record) = (reply.clone(), seen.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
                let Ok(connection) = rustls::ServerConnection::new(config.clone()) else { continue };
                let mut tls = rustls::StreamOwned::new(connection, stream);
                // the request head; a client that refuses the certificate ends the handshake here
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 64 * 1024 {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                if !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    continue;
                }
                let sni = tls.conn.server_name().map(str::to_string);
                record.lock().unwrap().push(TargetRequest { sni, head: String::from_utf8_lossy(&request).into_owned() });
                let TargetReply { status, headers, body } = answer.lock().unwrap().clone();
                let mut head = format!("HTTP/1.1 {status} Answer\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
                for (name, value) in headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                let _ = write!(tls, "{head}\r\n{body}");
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        HttpsTarget { addr, ca_pem: ca.pem(), reply, seen }
    }

    /// Answer `reply` from now on.
    pub fn answer(&self, reply: TargetReply) {
        *self.reply.lock().unwrap() = reply;
    }
}
