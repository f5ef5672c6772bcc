//! Issue 6's "done when", as a plugin author and an operator would do it, through the real
//! binary only: `capstan plugin new`, keygen, build (signed), a `serve --dev` trusting the key,
//! `capstan login`, install with the capabilities approved, a call to the plugin's method, an
//! upgrade under steady load with no failed request, a rollback, and tampered bundles refused by
//! name while the host keeps serving.
//!
//! Building the plugin needs the wasm32-wasip2 target (rustup). Without it the test prints why
//! and passes, unless `CAPSTAN_TEST_REQUIRE_PLUGINS=1` (set by `.ci/run`) makes it mandatory.
//! The plugin's build goes to `$CARGO_TARGET_DIR/e2e-plugins`, so later runs are fast.

use crate::support::{Capstan, Exited, capstan, dev_command};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const REQUIRE: &str = "CAPSTAN_TEST_REQUIRE_PLUGINS";
/// A plugin build (the first compiles the SDK's dependencies for wasm32-wasip2).
pub const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// A client command (an install or upgrade compiles the component on the server).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Threads calling the plugin during the upgrade.
const LOAD_THREADS: usize = 4;

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the test `name` builds plugins with `capstan plugin build`: a directory of its own
/// under `$CARGO_TARGET_DIR/e2e-plugins`, kept between runs so later builds are fast. Tests
/// running at once must not share one: cargo puts a crate's artifact at one path per target
/// dir, so two scaffolds named alike would take each other's component.
pub fn plugin_target(name: &str) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace().join("target")).join("e2e-plugins").join(name)
}

/// Whether wasm32-wasip2 is installed for the workspace's toolchain; `false` (after saying why)
/// when the test should be skipped.
pub fn wasm_target_available() -> bool {
    let listed = Command::new("rustup").args(["target", "list", "--installed"]).current_dir(workspace()).output();
    let why = match listed {
        Err(e) => format!("rustup is not available ({e}), so the wasm32-wasip2 target cannot be checked"),
        Ok(out) if !out.status.success() => format!("`rustup target list --installed` failed: {}", String::from_utf8_lossy(&out.stderr)),
        Ok(out) if String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == "wasm32-wasip2") => return true,
        Ok(_) => "the wasm32-wasip2 target is not installed (rustup target add wasm32-wasip2)".to_string(),
    };
    assert!(std::env::var(REQUIRE).as_deref() != Ok("1"), "{REQUIRE}=1 but {why}");
    eprintln!("skipped: {why}");
    false
}

/// Run `cmd` to its end with `input` on standard input, within `timeout`.
pub fn run(mut cmd: Command, input: &[u8], timeout: Duration) -> Exited {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawning capstan");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let reader = |mut stream: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = stream.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        })
    };
    let stdout = reader(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = reader(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("polling capstan") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not end within {timeout:?}; stderr:\n{}", stderr.join().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = writer.join();
    Exited { status, stdout: stdout.join().expect("stdout reader"), stderr: stderr.join().expect("stderr reader") }
}

pub fn assert_ok(what: &str, exited: &Exited) {
    assert!(
        exited.status.success(),
        "{what} should succeed, got {:?}\nstdout:\n{}\nstderr:\n{}",
        exited.status,
        exited.stdout,
        exited.stderr
    );
}

/// Assert a refusal (exit 1) whose output names one of `codes`.
fn assert_refused_with(what: &str, exited: &Exited, codes: &[&str]) {
    assert_eq!(
        exited.status.code(),
        Some(1),
        "{what} should be refused, got {:?}\nstdout:\n{}\nstderr:\n{}",
        exited.status,
        exited.stdout,
        exited.stderr
    );
    let output = format!("{}{}", exited.stdout, exited.stderr);
    assert!(codes.iter().any(|c| output.contains(c)), "{what}: expected one of {codes:?} in the output:\n{output}");
}

/// Flip one byte in the middle of a bundle; the tampered copy's path.
fn tamper(bundle: &Path, dir: &Path) -> PathBuf {
    let mut bytes = std::fs::read(bundle).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    let out = dir.join(format!("tampered-{}", bundle.file_name().unwrap().to_string_lossy()));
    std::fs::write(&out, bytes).unwrap();
    out
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        // a fresh connection per request, so no stale pooled connection can fail a call
        .max_idle_connections(0)
        .build()
        .into()
}

/// `POST /api/v1/hello.hello {name}` as the operator: the message, or what went wrong.
fn hello(agent: &ureq::Agent, url: &str, token: &str, name: &str) -> Result<String, String> {
    let mut response = agent
        .post(format!("{url}/api/v1/hello.hello"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .send(json!({ "name": name }).to_string())
        .map_err(|e| format!("transport error: {e}"))?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().map_err(|e| format!("reading the answer: {e}"))?;
    if status != 200 {
        return Err(format!("HTTP {status}: {body}"));
    }
    let value: Value = serde_json::from_str(&body).map_err(|e| format!("not JSON ({e}): {body}"))?;
    value["message"].as_str().map(str::to_string).ok_or_else(|| format!("no message in {body}"))
}

#[test]
fn an_author_builds_a_plugin_and_an_operator_installs_upgrades_under_load_and_rolls_it_back() {
    if !wasm_target_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
    let config_home = root.join("config");
    let key = root.join("key.pem");
    let plugin_target = plugin_target("author-and-operator");
    // every command's output, to check no secret ever shows
    let mut outputs = String::new();
    let cli = |args: &[&str], input: &[u8], timeout: Duration, outputs: &mut String| {
        let mut cmd = capstan();
        cmd.args(args).env("XDG_CONFIG_HOME", &config_home).env("CARGO_TARGET_DIR", &plugin_target);
        // build with the workspace's pinned toolchain, which lists the wasm32-wasip2 target
        cmd.current_dir(workspace());
        let exited = run(cmd, input, timeout);
        outputs.push_str(&exited.stdout);
        outputs.push_str(&exited.stderr);
        exited
    };
    let path = |p: &Path| p.display().to_string();

    // ---- 1. the author: scaffold, key, signed build ----
    let created = cli(&["plugin", "new", "hello", "--dir", &path(root)], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_ok("capstan plugin new hello", &created);
    let crate_dir = root.join("hello");
    assert!(crate_dir.join("capstan-plugin.toml").is_file() && crate_dir.join("src/lib.rs").is_file(), "{}", created.stdout);
    assert!(created.stdout.contains("capstan plugin build"), "new prints the next steps:\n{}", created.stdout);

    let keygen = cli(&["plugin", "keygen", "--out", &path(&key)], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_ok("capstan plugin keygen", &keygen);
    let public_key = keygen.stdout.trim().to_string();
    assert!(public_key.starts_with("capstan-ed25519:"), "keygen prints the public key: {public_key:?}");

    let build = |outputs: &mut String| {
        let built = cli(&["plugin", "build", &path(&crate_dir), "--key", &path(&key)], b"", BUILD_TIMEOUT, outputs);
        assert_ok("capstan plugin build", &built);
        PathBuf::from(built.stdout.trim().lines().last().unwrap_or_default())
    };
    let bundle_v1 = build(&mut outputs);
    assert_eq!(bundle_v1, crate_dir.join("hello-0.1.0.capstan-plugin"));
    assert!(bundle_v1.is_file());

    // ---- 2. the operator: a host trusting the key, a login ----
    let mut serve = dev_command(&root.join("data"));
    serve.env("CAPSTAN_TRUSTED_PUBLISHERS", &public_key);
    let server = Capstan::start(serve);
    let url = server.url("");
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");

    let login = cli(
        &["login", "--url", &url, "--username", "admin", "--password-stdin"],
        format!("{password}\n").as_bytes(),
        COMMAND_TIMEOUT,
        &mut outputs,
    );
    assert_ok("capstan login", &login);
    assert!(login.stdout.contains(&format!("logged in to {url} as admin")), "{}", login.stdout);
    let credentials = config_home.join("capstan").join("credentials.json");
    assert_eq!(std::fs::metadata(&credentials).unwrap().permissions().mode() & 0o777, 0o600, "the credentials file is private");
    let stored: Value = serde_json::from_slice(&std::fs::read(&credentials).unwrap()).unwrap();
    let token = stored[&url].as_str().unwrap_or_else(|| panic!("a token stored for {url}: {stored}")).to_string();

    // without --approve: refused, naming what the bundle requests
    let unapproved = cli(&["plugin", "install", &path(&bundle_v1), "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_refused_with("install without --approve", &unapproved, &["approval-required"]);
    assert!(unapproved.stderr.contains("log, store"), "the refusal lists the requested set:\n{}", unapproved.stderr);

    // a bundle with one byte changed, on a host that has nothing installed: refused by name
    let tampered_v1 = tamper(&bundle_v1, root);
    let refused =
        cli(&["plugin", "install", &path(&tampered_v1), "--approve", "all-requested", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_refused_with("installing a tampered bundle", &refused, &["bundle-signature-invalid", "bundle-malformed"]);

    // ---- 3. install, call ----
    let installed =
        cli(&["plugin", "install", &path(&bundle_v1), "--approve", "all-requested", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_ok("capstan plugin install", &installed);
    assert!(installed.stdout.contains("installed hello 0.1.0: running"), "{}", installed.stdout);
    let requests = installed.stderr.lines().find(|l| l.starts_with("requests:")).unwrap_or_default();
    assert!(requests.contains("store") && requests.contains("log"), "install shows what the bundle requests:\n{}", installed.stderr);
    let agent = agent();
    let v1 = "Hello, e2e!";
    assert_eq!(hello(&agent, &url, &token, "e2e").as_deref(), Ok(v1));

    // ---- 4. a new version, upgraded under steady load ----
    let manifest_path = crate_dir.join("capstan-plugin.toml");
    let manifest = std::fs::read_to_string(&manifest_path).unwrap();
    assert!(manifest.contains("version = \"0.1.0\""), "{manifest}");
    std::fs::write(&manifest_path, manifest.replacen("version = \"0.1.0\"", "version = \"0.2.0\"", 1)).unwrap();
    let lib_path = crate_dir.join("src/lib.rs");
    let lib = std::fs::read_to_string(&lib_path).unwrap();
    assert!(lib.contains("\"Hello, {}!\""), "{lib}");
    std::fs::write(&lib_path, lib.replace("\"Hello, {}!\"", "\"Hello again, {}! (0.2.0)\"")).unwrap();
    let bundle_v2 = build(&mut outputs);
    assert_eq!(bundle_v2, crate_dir.join("hello-0.2.0.capstan-plugin"));
    let v2 = "Hello again, e2e! (0.2.0)";

    let stop = AtomicBool::new(false);
    let (upgraded, upgraded_at, answers) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..LOAD_THREADS)
            .map(|_| {
                scope.spawn(|| {
                    let agent = self::agent();
                    let mut answers = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        answers.push((started, hello(&agent, &url, &token, "e2e")));
                    }
                    answers
                })
            })
            .collect();
        let _stop_workers = crate::support::StopOnDrop(&stop);
        std::thread::sleep(Duration::from_millis(500));
        let upgraded =
            cli(&["plugin", "upgrade", &path(&bundle_v2), "--approve", "all-requested", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
        let upgraded_at = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        let answers: Vec<(Instant, Result<String, String>)> = workers.into_iter().flat_map(|w| w.join().expect("a load thread")).collect();
        (upgraded, upgraded_at, answers)
    });
    assert_ok("capstan plugin upgrade (under load)", &upgraded);
    assert!(upgraded.stdout.contains("upgraded hello from 0.1.0 to 0.2.0"), "{}", upgraded.stdout);
    let failures: Vec<&String> = answers.iter().filter_map(|(_, a)| a.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} calls failed during the upgrade, e.g. {:?}",
        failures.len(),
        answers.len(),
        &failures[..failures.len().min(5)]
    );
    let before = answers.iter().filter(|(_, a)| a.as_deref() == Ok(v1)).count();
    let after: Vec<&Result<String, String>> = answers.iter().filter(|(started, _)| *started > upgraded_at).map(|(_, a)| a).collect();
    assert!(before > 0, "the load ran before the upgrade ({} calls)", answers.len());
    assert!(!after.is_empty(), "the load ran after the upgrade ({} calls)", answers.len());
    assert!(after.iter().all(|a| a.as_deref() == Ok(v2)), "calls after the upgrade are answered by 0.2.0: {after:?}");
    assert!(answers.iter().all(|(_, a)| a.as_deref() == Ok(v1) || a.as_deref() == Ok(v2)), "every answer is from one version or the other");
    eprintln!("upgrade under load: {} calls, {before} answered by 0.1.0, {} after the upgrade, none failed", answers.len(), after.len());

    // ---- 5. roll back ----
    let rolled = cli(&["plugin", "rollback", "hello", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_ok("capstan plugin rollback", &rolled);
    assert!(rolled.stdout.contains("rolled hello back to 0.1.0"), "{}", rolled.stdout);
    assert_eq!(hello(&agent, &url, &token, "e2e").as_deref(), Ok(v1), "0.1.0 answers again");
    let listed = cli(&["plugin", "list", "--json", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_ok("capstan plugin list --json", &listed);
    let list: Value = serde_json::from_str(&listed.stdout).unwrap_or_else(|e| panic!("list --json prints JSON ({e}):\n{}", listed.stdout));
    let plugins = list["plugins"].as_array().unwrap_or_else(|| panic!("{list}"));
    // beside the author's plugin, only first-party ones (installed in the background at start)
    assert!(plugins.iter().all(|p| p["id"] == "hello" || p["publisher"] == "first-party"), "{list}");
    let hello_entry = plugins.iter().find(|p| p["id"] == "hello").unwrap();
    assert_eq!((hello_entry["version"].as_str(), hello_entry["status"].as_str()), (Some("0.1.0"), Some("running")), "{list}");
    let mut grants: Vec<&str> = hello_entry["grants"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    grants.sort_unstable();
    assert_eq!(grants, ["log", "store"], "{list}");
    let text = cli(&["plugin", "list", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_ok("capstan plugin list", &text);
    assert!(text.stdout.lines().any(|l| l.starts_with("hello ") && l.contains("0.1.0") && l.contains("running")), "{}", text.stdout);

    // ---- 6. tampered bundles refused; the host keeps serving ----
    let tampered_v2 = tamper(&bundle_v2, root);
    let refused =
        cli(&["plugin", "upgrade", &path(&tampered_v2), "--approve", "all-requested", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_refused_with("upgrading to a tampered bundle", &refused, &["bundle-signature-invalid", "bundle-malformed"]);
    let refused =
        cli(&["plugin", "install", &path(&tampered_v1), "--approve", "all-requested", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_eq!(refused.status.code(), Some(1), "installing a tampered bundle again is refused:\n{}", refused.stderr);
    assert_eq!(hello(&agent, &url, &token, "e2e").as_deref(), Ok(v1), "the host keeps serving hello.hello");

    // ---- 7. an upgrade comes from the plugin's publisher: re-binding needs a trusted key ----
    let other_key = root.join("other.pem");
    let other = cli(&["plugin", "keygen", "--out", &path(&other_key)], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_ok("capstan plugin keygen (a second key)", &other);
    let rebind = ["plugin", "rebind", "hello", "--publisher", other.stdout.trim(), "--url", &url];
    assert_refused_with("re-binding to an untrusted key", &cli(&rebind, b"", COMMAND_TIMEOUT, &mut outputs), &["publisher-untrusted"]);
    let rebind = ["plugin", "rebind", "hello", "--publisher", &public_key, "--url", &url];
    let rebound = cli(&rebind, b"", COMMAND_TIMEOUT, &mut outputs);
    assert_ok("capstan plugin rebind", &rebound);
    assert!(rebound.stdout.contains("the next upgrade of hello may be signed by capstan-ed25519:"), "{}", rebound.stdout);

    // ---- logout: the session ends and its token is forgotten ----
    let logout = cli(&["logout", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_ok("capstan logout", &logout);
    let stored: Value = serde_json::from_slice(&std::fs::read(&credentials).unwrap()).unwrap();
    assert!(stored.get(&url).is_none(), "logout forgets the token: {stored}");
    assert!(hello(&agent, &url, &token, "e2e").is_err_and(|e| e.starts_with("HTTP 401")), "the ended session is refused");
    let after_logout = cli(&["plugin", "list", "--url", &url], b"", COMMAND_TIMEOUT, &mut outputs);
    assert_refused_with("plugin list after logout", &after_logout, &["unauthenticated"]);
    assert!(after_logout.stderr.contains("capstan login"), "the refusal says how to log in:\n{}", after_logout.stderr);

    assert!(!outputs.contains(&token), "no command printed the session token");
    assert!(!outputs.contains(&password), "no command printed the password");
    assert!(!server.stderr().contains(&token), "the server log never shows the token");
}
