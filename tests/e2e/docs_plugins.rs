//! docs/plugins.md's walkthrough, run as written against a real `serve --dev` host.
//!
//! Between `<!-- walkthrough -->` and `<!-- /walkthrough -->`:
//! - a ```` ```console ```` block is commands (`$ ` lines) each followed by lines its output must
//!   show. Each command runs with `bash -c` in the walkthrough's current directory (`cd DIR`
//!   moves it), with this build's `capstan` first on the PATH, `CAPSTAN_URL` naming the host this
//!   test started, a private `XDG_CONFIG_HOME`, and a plugin build cache of its own
//!   (`CARGO_TARGET_DIR`, see `plugin_target`). It must exit 0, or 1 when a shown line is a refusal
//!   (`capstan: refused (…)`).
//! - an expected line must appear within a line of the command's output (standard output, then
//!   standard error), both trimmed; `…` stands for any text, and `http://127.0.0.1:8080` for the
//!   test host's URL.
//! - a block whose info string holds `retry` shows work the host does in the background (events,
//!   reconcile passes): each of its commands is run again until its output shows the lines, for
//!   at most two minutes.
//! - a block whose info string holds `file=PATH` is that file's whole text: it is written to
//!   PATH, relative to the current directory, when the walkthrough reaches it.
//! - other blocks (`sh`, `rust`, …) are for reading only.
//!
//! `capstan login` reads the password the host printed from standard input (`--password-stdin`
//! is added), as a person types it at the prompt.
//!
//! The walkthrough builds a plugin for wasm32-wasip2; without the target the test says why and
//! passes, unless `CAPSTAN_TEST_REQUIRE_PLUGINS=1` (set by `.ci/run`).

use super::plugins::{BUILD_TIMEOUT, plugin_target, run, wasm_target_available, workspace};
use super::support::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const START: &str = "<!-- walkthrough -->";
const END: &str = "<!-- /walkthrough -->";
/// The URL the walkthrough shows; the test host's replaces it.
const DOC_URL: &str = "http://127.0.0.1:8080";
/// How long a `retry` block's command may take to show its lines.
const RETRY_FOR: Duration = Duration::from_secs(120);

/// One step of the walkthrough.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// `$ command`, the lines its output must show, and whether to retry until it does.
    Run { command: String, expect: Vec<String>, retry: bool, line: usize },
    /// A file's whole text.
    Write { path: String, text: String, line: usize },
}

/// The steps of the walkthrough section of `markdown`.
pub fn steps(markdown: &str) -> Vec<Step> {
    let start = markdown.find(START).expect("docs/plugins.md marks its walkthrough with <!-- walkthrough -->");
    let end = markdown.find(END).expect("and ends it with <!-- /walkthrough -->");
    let first_line = markdown[..start].lines().count();
    let mut steps = Vec::new();
    let mut lines = markdown[start..end].lines().enumerate().map(|(i, l)| (first_line + i + 1, l));
    while let Some((_, line)) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else { continue };
        let words: Vec<&str> = info.split_whitespace().collect();
        let mut body = Vec::new();
        for (number, line) in lines.by_ref() {
            if line.trim_start().starts_with("```") {
                break;
            }
            body.push((number, line));
        }
        if let Some(path) = words.iter().find_map(|w| w.strip_prefix("file=")) {
            let text = body.iter().map(|(_, l)| format!("{l}\n")).collect();
            steps.push(Step::Write { path: path.to_string(), text, line: body.first().map_or(0, |(n, _)| *n) });
            continue;
        }
        if words.first() != Some(&"console") {
            continue;
        }
        let retry = words.contains(&"retry");
        for (number, line) in body {
            if let Some(command) = line.strip_prefix("$ ") {
                steps.push(Step::Run { command: command.to_string(), expect: vec![], retry, line: number });
            } else if let Some(Step::Run { expect, .. }) = steps.last_mut()
                && !line.trim().is_empty()
            {
                expect.push(line.trim().to_string());
            }
        }
    }
    steps
}

/// Whether `actual` shows `expected`: its parts between `…` in order.
pub fn shows(actual: &str, expected: &str) -> bool {
    let mut rest = actual.trim();
    for (i, part) in expected.split('…').enumerate() {
        if part.is_empty() {
            continue;
        }
        match rest.find(part) {
            // the first part may start anywhere only when the line starts with `…`
            Some(at) if i > 0 || at == 0 || expected.starts_with('…') => rest = &rest[at + part.len()..],
            _ => return false,
        }
    }
    expected.ends_with('…') || rest.is_empty() || expected.is_empty()
}

/// The expected lines `output` does not show (each within one line of it).
fn missing<'a>(output: &str, expect: &'a [String], url: &str) -> Vec<&'a String> {
    expect.iter().filter(|e| !output.lines().any(|line| shows(line, &e.replace(DOC_URL, url)))).collect()
}

#[test]
fn the_walkthrough_parses_and_matches_as_its_rules_say() {
    let markdown = "intro\n```console\n$ not run\n```\n<!-- walkthrough -->\ntext\n```sh\nread only\n```\n\
                    ```console\n$ capstan plugin new hello\ncreated …/hello: the Capstan plugin hello\n\n$ cd hello\n```\n\
                    ```rust file=src/lib.rs\nfn main() {}\n```\n```console retry\n$ capstan call hello.status\n  \"services\": 1\n```\n\
                    <!-- /walkthrough -->\n```console\n$ after\n```\n";
    let steps = steps(markdown);
    assert_eq!(
        steps,
        vec![
            Step::Run {
                command: "capstan plugin new hello".into(),
                expect: vec!["created …/hello: the Capstan plugin hello".into()],
                retry: false,
                line: 11
            },
            Step::Run { command: "cd hello".into(), expect: vec![], retry: false, line: 14 },
            Step::Write { path: "src/lib.rs".into(), text: "fn main() {}\n".into(), line: 17 },
            Step::Run { command: "capstan call hello.status".into(), expect: vec!["\"services\": 1".into()], retry: true, line: 20 },
        ]
    );
    assert!(shows(
        "created /tmp/x/hello: the Capstan plugin hello (capstan-sdk from /w/sdk)",
        "created …/hello: the Capstan plugin hello…"
    ));
    assert!(!shows(
        "created /tmp/x/hello: the Capstan plugin hello (capstan-sdk from /w/sdk)",
        "created …/hello: the Capstan plugin hello"
    ));
    assert!(shows("  \"message\": \"Hello, Ada!\"", "\"message\": \"Hello, Ada!\""));
    assert!(shows(
        "upgraded hello from 0.1.1-dev.1 to 0.1.1-dev.2 on http://x: running",
        "upgraded hello from … to 0.1.1-dev.2 on http://x: running"
    ));
    assert!(!shows("installed hello", "upgraded hello"));
    assert!(shows("anything at all", "…"));
    assert!(shows("capstan call hello.hello --set name=example --url http://h", "capstan call hello.hello --set name=example…"));
}

#[test]
fn the_plugin_walkthrough_runs_as_documented() {
    if !wasm_target_available() {
        return;
    }
    let markdown = std::fs::read_to_string(workspace().join("docs/plugins.md")).unwrap();
    let steps = steps(&markdown);
    assert!(steps.len() > 20, "the walkthrough has its steps: {steps:?}");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
    let server = Capstan::start(dev_command(&root.join("data")));
    let url = server.url("");
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let work = root.join("work");
    std::fs::create_dir(&work).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_capstan")).parent().unwrap().to_path_buf();
    let path =
        std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()))).unwrap();

    let mut cwd: PathBuf = work.clone();
    for step in &steps {
        let (command, expect, retry, line) = match step {
            Step::Write { path, text, line } => {
                let file = cwd.join(path);
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                std::fs::write(&file, text).unwrap_or_else(|e| panic!("docs/plugins.md:{line}: writing {}: {e}", file.display()));
                continue;
            }
            Step::Run { command, expect, retry, line } => (command, expect, *retry, *line),
        };
        if let Some(dir) = command.strip_prefix("cd ") {
            cwd = cwd.join(dir.trim());
            assert!(cwd.is_dir(), "docs/plugins.md:{line}: `{command}`: {} is not a directory", cwd.display());
            continue;
        }
        let (command, input) = if command.starts_with("capstan login") {
            (format!("{command} --password-stdin"), format!("{password}\n"))
        } else {
            (command.clone(), String::new())
        };
        let refusal = expect.iter().any(|e| e.starts_with("capstan: refused ("));
        let deadline = Instant::now() + if retry { RETRY_FOR } else { Duration::ZERO };
        loop {
            let mut cmd = Command::new("bash");
            cmd.args(["-c", &command]).current_dir(&cwd);
            // nothing of the machine's Capstan environment, as `support::capstan` does
            for (key, _) in std::env::vars_os() {
                if key.to_string_lossy().starts_with("CAPSTAN_") {
                    cmd.env_remove(&key);
                }
            }
            cmd.env("PATH", &path)
                .env("CAPSTAN_URL", &url)
                .env("XDG_CONFIG_HOME", root.join("config"))
                .env("CARGO_TARGET_DIR", plugin_target("docs-walkthrough"));
            let exited = run(cmd, input.as_bytes(), BUILD_TIMEOUT);
            let output = format!("{}{}", exited.stdout, exited.stderr);
            let status_ok = if refusal { exited.status.code() == Some(1) } else { exited.status.success() };
            let not_shown = missing(&output, expect, &url);
            if status_ok && not_shown.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                panic!(
                    "docs/plugins.md:{line}: `{command}` (in {}) exited {:?} and does not show {not_shown:?}\n--- its output:\n{output}",
                    cwd.display(),
                    exited.status
                );
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let exited = server.stop();
    assert!(exited.status.success(), "the host stops cleanly; stderr:\n{}", exited.stderr);
}
