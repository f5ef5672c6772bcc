//! Issue 19's author loop through the real binary: `capstan plugin new hello`, `cd hello`,
//! `capstan plugin dev` against a `serve --dev` host — installed, then a change and `plugin dev`
//! again is an upgrade, and `plugin dev --watch` upgrades by itself when a file changes — and a
//! host not started with `--dev` refused by name before anything is trusted, created or built.
//!
//! Building the plugin needs the wasm32-wasip2 target (rustup); without it the loop test prints
//! why and passes, unless `CAPSTAN_TEST_REQUIRE_PLUGINS=1` (set by `.ci/run`). Builds go to
//! `$CARGO_TARGET_DIR/e2e-plugins/plugin-dev`, a build cache of its own (see `plugin_target`).

use super::plugins::{BUILD_TIMEOUT, COMMAND_TIMEOUT, assert_ok, plugin_target, run, wasm_target_available};
use super::support::*;
use serde_json::{Value, json};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A private temporary directory with the author's config home and work directory.
struct Author {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    config_home: PathBuf,
}

impl Author {
    fn new() -> Author {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        let config_home = root.join("config");
        Author { _tmp: tmp, root, config_home }
    }

    /// `capstan ARGS` in `dir`, as this author (their config home, the shared plugin build cache).
    fn command(&self, dir: &Path, args: &[&str]) -> Command {
        let mut cmd = capstan();
        cmd.args(args).current_dir(dir).env("XDG_CONFIG_HOME", &self.config_home).env("CARGO_TARGET_DIR", plugin_target("plugin-dev"));
        cmd
    }

    fn run(&self, dir: &Path, args: &[&str], input: &[u8], timeout: Duration) -> Exited {
        run(self.command(dir, args), input, timeout)
    }

    fn login(&self, url: &str, username: &str, password: &str) {
        let args = ["login", "--url", url, "--username", username, "--password-stdin"];
        assert_ok("capstan login", &self.run(&self.root, &args, format!("{password}\n").as_bytes(), COMMAND_TIMEOUT));
    }

    fn dev_key(&self) -> PathBuf {
        self.config_home.join("capstan").join("dev-publisher.pem")
    }
}

/// `hello.hello {name}` through `capstan call --json`: the message.
fn hello(author: &Author, url: &str, name: &str) -> String {
    let called =
        author.run(&author.root, &["call", "hello.hello", "--set", &format!("name={name}"), "--url", url, "--json"], b"", COMMAND_TIMEOUT);
    assert_ok("capstan call hello.hello", &called);
    let answer: Value = serde_json::from_str(&called.stdout).unwrap_or_else(|e| panic!("--json prints JSON ({e}): {}", called.stdout));
    answer["message"].as_str().unwrap_or_else(|| panic!("a message: {answer}")).to_string()
}

fn replace_in(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} holds {from:?}:\n{text}", path.display());
    std::fs::write(path, text.replace(from, to)).unwrap();
}

fn trusted_keys(server: &Capstan, token: &str) -> Vec<String> {
    let listed = server.call_as(token, "plugins.listTrustedPublishers", &json!({})).expect_json(200);
    listed["added"].as_array().unwrap().iter().filter_map(|p| p["publicKey"].as_str().map(str::to_string)).collect()
}

#[test]
fn plugin_new_then_plugin_dev_installs_upgrades_and_watches_on_a_dev_host() {
    if !wasm_target_available() {
        return;
    }
    let author = Author::new();
    let server = Capstan::start(dev_command(&author.root.join("data")));
    let url = server.url("");
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let token = server.login("admin", &password);

    // the host says it is a dev host, to its administrators only
    let version = server.call_as(&token, "system.getVersion", &json!({})).expect_json(200);
    assert_eq!(version["dev"], true, "{version}");
    let anonymous = server.call("system.getVersion", "{}").expect_json(200);
    assert!(anonymous.get("dev").is_none(), "nobody else is told: {anonymous}");

    // ---- 1. capstan plugin new hello; cd hello ----
    let created = author.run(&author.root, &["plugin", "new", "hello"], b"", COMMAND_TIMEOUT);
    assert_ok("capstan plugin new hello", &created);
    for step in ["cd hello", "capstan plugin dev", "cargo test"] {
        assert!(created.stdout.contains(step), "new names the next step {step:?}:\n{}", created.stdout);
    }
    let crate_dir = author.root.join("hello");
    for file in ["Cargo.toml", "Cargo.lock", "capstan-plugin.toml", "src/lib.rs", "tests/harness.rs", "README.md"] {
        assert!(crate_dir.join(file).is_file(), "the scaffold has {file}");
    }

    // ---- 2. capstan plugin dev: key, trust, build, install ----
    author.login(&url, "admin", &password);
    assert!(!author.dev_key().exists());
    let first = author.run(&crate_dir, &["plugin", "dev", "--url", &url], b"", BUILD_TIMEOUT);
    assert_ok("capstan plugin dev (first)", &first);
    assert!(first.stderr.contains("created your dev key"), "{}", first.stderr);
    assert!(first.stderr.contains(&format!("trusted your dev key on {url}")), "{}", first.stderr);
    assert!(first.stdout.contains(&format!("installed hello 0.1.1-dev.1 on {url}: running")), "{}", first.stdout);
    assert!(first.stdout.contains(&format!("api:     POST {url}/api/v1/hello.hello")), "{}", first.stdout);
    assert!(first.stdout.contains(&format!("try:     capstan call hello.hello --set name=example --url {url}")), "{}", first.stdout);
    let key_mode = std::fs::metadata(author.dev_key()).unwrap().permissions().mode() & 0o777;
    assert_eq!(key_mode, 0o600, "the dev key is private");
    assert_eq!(trusted_keys(&server, &token).len(), 1, "the dev key is trusted there");
    assert_eq!(hello(&author, &url, "Ada"), "Hello, Ada!");

    // ---- 3. a change, plugin dev again: an upgrade, with nothing trusted again ----
    replace_in(&crate_dir.join("src/lib.rs"), "\"Hello, {}!\"", "\"Howdy, {}!\"");
    let second = author.run(&crate_dir, &["plugin", "dev", "--url", &url], b"", BUILD_TIMEOUT);
    assert_ok("capstan plugin dev (second)", &second);
    assert!(!second.stderr.contains("created your dev key") && !second.stderr.contains("trusted"), "{}", second.stderr);
    assert!(second.stdout.contains("upgraded hello from 0.1.1-dev.1 to 0.1.1-dev.2"), "{}", second.stdout);
    assert_eq!(hello(&author, &url, "Ada"), "Howdy, Ada!");
    assert_eq!(trusted_keys(&server, &token).len(), 1);
    let plugin = server.call_as(&token, "plugins.get", &json!({ "id": "hello" })).expect_json(200);
    assert_eq!((plugin["version"].as_str(), plugin["previousVersion"].as_str()), (Some("0.1.1-dev.2"), Some("0.1.1-dev.1")), "{plugin}");

    // ---- 4. --watch: a saved change is built and upgraded by itself ----
    let mut cmd = author.command(&crate_dir, &["plugin", "dev", "--watch", "--url", &url]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut watcher = Watcher::spawn(cmd);
    watcher.wait_for_all(&["upgraded hello from 0.1.1-dev.2 to 0.1.1-dev.3", "watching"], BUILD_TIMEOUT);
    replace_in(&crate_dir.join("src/lib.rs"), "\"Howdy, {}!\"", "\"Hi there, {}!\"");
    watcher.wait_for("upgraded hello from 0.1.1-dev.3 to 0.1.1-dev.4", BUILD_TIMEOUT);
    assert_eq!(hello(&author, &url, "Ada"), "Hi there, Ada!");
    // a change that does not build: said, and the watch goes on
    replace_in(&crate_dir.join("src/lib.rs"), "\"Hi there, {}!\"", "\"Hi there, {}!\" +");
    watcher.wait_for("capstan: refused (build-failed)", BUILD_TIMEOUT);
    replace_in(&crate_dir.join("src/lib.rs"), "\"Hi there, {}!\" +", "\"Hello again, {}!\"");
    watcher.wait_for("upgraded hello from 0.1.1-dev.4 to 0.1.1-dev.5", BUILD_TIMEOUT);
    assert_eq!(hello(&author, &url, "Ada"), "Hello again, Ada!");
    let output = watcher.stop();
    assert!(!output.contains(&token) && !output.contains(&password), "no secret printed");
}

/// A `plugin dev --watch` running in the background, its output kept.
struct Watcher {
    child: std::process::Child,
    output: Arc<Mutex<String>>,
}

impl Watcher {
    fn spawn(mut cmd: Command) -> Watcher {
        let mut child = cmd.spawn().expect("spawning capstan plugin dev --watch");
        let output = keep_stderr(&mut child);
        let mut stdout = child.stdout.take().expect("piped stdout");
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Watcher { child, output }
    }

    /// Wait until the output shows `needle` (after what was waited for before), then consume
    /// the output up to it.
    fn wait_for(&mut self, needle: &str, timeout: Duration) {
        self.wait_for_all(&[needle], timeout);
    }

    /// Wait until the output shows every one of `needles`, in any order (stdout and stderr
    /// arrive on two pipes, so lines of the two may be kept in either order), then consume the
    /// output up to the last of them.
    fn wait_for_all(&mut self, needles: &[&str], timeout: Duration) {
        let child = &mut self.child;
        let output = self.output.clone();
        eventually(&format!("plugin dev --watch printing {needles:?}"), timeout, || {
            let mut text = output.lock().unwrap();
            let found: Option<Vec<usize>> = needles.iter().map(|n| text.find(n).map(|at| at + n.len())).collect();
            if let Some(end) = found.and_then(|ends| ends.into_iter().max()) {
                text.drain(..end);
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("plugin dev --watch ended ({status}) before {needles:?}:\n{text}");
            }
            Err(text.clone())
        });
    }

    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.output.lock().unwrap().clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn plugin_dev_refuses_a_host_not_started_with_dev_before_trusting_or_building_anything() {
    let author = Author::new();
    let prod = ProdConfig::under(&author.root);
    let server = Capstan::start(with_test_admin(prod.command()));
    let url = server.url("");
    let (admin, password) = TEST_ADMIN;
    let token = server.login(admin, password);
    let version = server.call_as(&token, "system.getVersion", &json!({})).expect_json(200);
    assert_eq!(version["dev"], false, "an administrator is told it is not a dev host: {version}");

    let created = author.run(&author.root, &["plugin", "new", "hello"], b"", COMMAND_TIMEOUT);
    assert_ok("capstan plugin new hello", &created);
    let crate_dir = author.root.join("hello");

    // not logged in, and no terminal to ask on: refused, saying how to log in
    let anonymous = author.run(&crate_dir, &["plugin", "dev", "--url", &url], b"", COMMAND_TIMEOUT);
    assert_eq!(anonymous.status.code(), Some(1), "{anonymous:?}");
    assert!(anonymous.stderr.contains("capstan: refused (unauthenticated)"), "{}", anonymous.stderr);
    assert!(anonymous.stderr.contains(&format!("capstan login --url {url}")), "{}", anonymous.stderr);

    // an administrator's session, on a host without --dev: refused by name
    author.login(&url, admin, password);
    for args in [vec!["plugin", "dev", "--url", &url], vec!["plugin", "dev", "--watch", "--url", &url]] {
        let refused = author.run(&crate_dir, &args, b"", COMMAND_TIMEOUT);
        assert_eq!(refused.status.code(), Some(1), "{refused:?}");
        assert!(refused.stderr.contains("capstan: refused (dev-host-required)"), "{}", refused.stderr);
        assert!(refused.stderr.contains("was not started with `serve --dev`"), "{}", refused.stderr);
        assert!(refused.stderr.contains("capstan plugin trust"), "it says what to do instead: {}", refused.stderr);
    }
    let json = author.run(&crate_dir, &["plugin", "dev", "--url", &url, "--json"], b"", COMMAND_TIMEOUT);
    let answer: Value = serde_json::from_str(&json.stdout).unwrap_or_else(|e| panic!("--json prints JSON ({e}): {}", json.stdout));
    assert_eq!(answer["error"]["code"], "dev-host-required", "{answer}");

    // nothing was created, trusted, built or installed
    assert!(!author.dev_key().exists(), "no dev key was created");
    assert!(trusted_keys(&server, &token).is_empty(), "no key was trusted");
    assert!(!crate_dir.join("target").exists(), "nothing was built");
    let plugins = server.call_as(&token, "plugins.list", &json!({})).expect_json(200);
    assert!(plugins["plugins"].as_array().unwrap().iter().all(|p| p["id"] != "hello"), "{plugins}");

    // a person who is not an administrator is refused before the host is asked what it is
    let created = server.call_as(&token, "admin.createUser", &json!({ "username": "dana" })).expect_json(200);
    author.login(&url, "dana", created["password"].as_str().unwrap());
    let refused = author.run(&crate_dir, &["plugin", "dev", "--url", &url], b"", COMMAND_TIMEOUT);
    assert!(refused.stderr.contains("capstan: refused (admin-required)"), "{}", refused.stderr);
}
