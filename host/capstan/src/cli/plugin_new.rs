//! `capstan plugin new <name>`: scaffold a plugin crate that builds, tests, signs and installs
//! out of the box (`capstan plugin dev` on a dev host; `capstan plugin build <dir> --key <file>`
//! for a release).
//!
//! The crate depends on `capstan-sdk` by version, as a crate published on crates.io would be.
//! The SDK is not published yet, so when the SDK's source tree is at hand (`--sdk`, or the one
//! this `capstan` was built from) a `[patch.crates-io]` entry points that dependency at it (by a
//! relative path when the new crate lies inside that source tree, else an absolute one), and the
//! tree's `Cargo.lock` is copied in: the crate then builds with exactly the dependency versions
//! the SDK is built and tested with, from the local cargo cache, offline. Without a source tree
//! the crate carries the version dependency alone, and `plugin new` says how to add the patch.

use crate::plugins::manifest::{self, CURRENT_WIT, MANIFEST_FILE, Manifest};
use crate::refusal::{Refusal, Result};
use serde_json::json;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where this workspace's SDK was when `capstan` was built (used when it is still there).
const BUILT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sdk");
/// The requirements the scaffold puts on serde and schemars: the workspace's own.
const SERDE_REQUIREMENT: &str = r#"{ version = "1", features = ["derive"] }"#;
const SCHEMARS_REQUIREMENT: &str = r#""1""#;

#[derive(clap::Args)]
pub struct NewArgs {
    /// The plugin id (3 to 40 of a-z 0-9 -, starting with a letter): also the directory name
    name: String,
    /// The directory to create the crate in
    #[arg(long, value_name = "PARENT", default_value = ".")]
    dir: PathBuf,
    /// The capstan-sdk crate directory the new crate's `[patch.crates-io]` points at (default:
    /// the SDK of the source tree this capstan was built from, when it is still there; else no
    /// patch is written)
    #[arg(long, value_name = "PATH")]
    sdk: Option<PathBuf>,
    /// Print exact JSON instead of text
    #[arg(long)]
    json: bool,
}

pub fn run(args: &NewArgs) -> (Result<()>, bool) {
    (new(args), args.json)
}

fn new(args: &NewArgs) -> Result<()> {
    manifest::check_plugin_id(&args.name)?;
    let sdk = find_sdk(args.sdk.as_deref())?;
    let target = scaffold(&args.dir, &args.name, sdk.as_deref())?;
    let files = files(&args.name, &target, sdk.as_deref())?.into_iter().map(|(name, _)| name).collect::<Vec<_>>();
    if args.json {
        let sdk = sdk.as_ref().map(|s| s.display().to_string());
        println!("{}", json!({ "ok": true, "id": args.name, "dir": target.display().to_string(), "sdk": sdk, "files": files }));
        return Ok(());
    }
    let dir = target.display();
    let id = &args.name;
    match &sdk {
        Some(sdk) => println!("created {dir}: the Capstan plugin {id} (capstan-sdk from {})", sdk.display()),
        None => {
            println!("created {dir}: the Capstan plugin {id}");
            eprintln!(
                "note: capstan-sdk is not on crates.io yet and this capstan was built away from Capstan's source tree: add \
                 `[patch.crates-io] capstan-sdk = {{ path = \"<Capstan's source>/sdk\" }}` to {dir}/Cargo.toml (or run plugin new \
                 with --sdk <path>) before building"
            );
        }
    }
    let here = std::env::current_dir().ok().and_then(|d| fs::canonicalize(d).ok());
    let cd = if here.as_deref() == target.parent() { id.to_string() } else { dir.to_string() };
    println!();
    println!("next steps, against a host started with `capstan serve --dev` (after `capstan login`):");
    println!("  cd {cd}");
    println!("  capstan plugin dev            # build, sign with your dev key, install; --watch upgrades on every change");
    println!("  cargo test                    # tests/harness.rs: the plugin on an in-process host");
    println!("to release it to other hosts, sign with a publisher key of your own:");
    println!("  capstan plugin keygen --out ~/capstan-publisher.pem");
    println!("  capstan plugin build {cd} --key ~/capstan-publisher.pem");
    Ok(())
}

/// The SDK directory: `--sdk` (refused `sdk-not-found` when it is not the SDK), else the one
/// this binary was built beside when it is still there; canonical. `None`: no source tree.
fn find_sdk(given: Option<&Path>) -> Result<Option<PathBuf>> {
    let is_sdk = |dir: &Path| {
        fs::read_to_string(dir.join("Cargo.toml"))
            .ok()
            .and_then(|text| text.parse::<toml::Table>().ok())
            .is_some_and(|t| t.get("package").and_then(|p| p.get("name")).and_then(|n| n.as_str()) == Some("capstan-sdk"))
    };
    match given {
        Some(path) => {
            let dir = if path.file_name().is_some_and(|n| n == "Cargo.toml") { path.parent().unwrap_or(path) } else { path };
            let dir = fs::canonicalize(dir).ok().filter(|d| is_sdk(d)).ok_or_else(|| {
                Refusal::new(
                    "sdk-not-found",
                    format!("--sdk {} is not the capstan-sdk crate directory (the sdk/ directory of Capstan's source)", path.display()),
                )
                .with_data(json!({ "path": path.display().to_string() }))
            })?;
            Ok(Some(dir))
        }
        None => Ok(fs::canonicalize(BUILT_SDK).ok().filter(|d| is_sdk(d))),
    }
}

/// The requirement the scaffold puts on capstan-sdk: this Capstan's version, as Cargo's caret
/// reads it (`0.1.0` → `"0.1"`, `1.2.0` → `"1"`).
fn sdk_requirement() -> String {
    let mut parts = env!("CARGO_PKG_VERSION").split('.');
    match (parts.next(), parts.next()) {
        (Some("0"), Some(minor)) => format!("0.{minor}"),
        (Some(major), _) => major.to_string(),
        _ => env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// How the new crate at `target` names `sdk`: relative when both lie in the SDK's source tree
/// (so the tree can move), else absolute.
fn sdk_path_from(target: &Path, sdk: &Path) -> PathBuf {
    let Some(root) = sdk.parent() else { return sdk.to_path_buf() };
    match (target.strip_prefix(root), sdk.strip_prefix(root)) {
        (Ok(below), Ok(sdk_below)) => {
            let mut relative: PathBuf = below.components().map(|_| "..").collect();
            relative.push(sdk_below);
            relative
        }
        _ => sdk.to_path_buf(),
    }
}

/// Create `<parent>/<id>/` with the crate's files; the created directory (absolute).
fn scaffold(parent: &Path, id: &str, sdk: Option<&Path>) -> Result<PathBuf> {
    manifest::check_plugin_id(id)?;
    let parent = std::path::absolute(parent)
        .map_err(|e| Refusal::new("output-directory-missing", format!("cannot resolve {}: {}", parent.display(), e.kind())))?;
    if !parent.is_dir() {
        return Err(Refusal::new("output-directory-missing", format!("{} is not a directory", parent.display()))
            .with_data(json!({ "path": parent.display().to_string() })));
    }
    let target = fs::canonicalize(&parent).unwrap_or(parent).join(id);
    let files = files(id, &target, sdk)?;
    fs::create_dir(&target).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => {
            Refusal::new("output-exists", format!("{} already exists; pick another name or --dir", target.display()))
                .with_data(json!({ "path": target.display().to_string() }))
        }
        _ => write_failed(&target, &e),
    })?;
    let written = (|| {
        for (name, content) in &files {
            let path = target.join(name);
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir).map_err(|e| write_failed(dir, &e))?;
            }
            let mut file = OpenOptions::new().write(true).create_new(true).open(&path).map_err(|e| write_failed(&path, &e))?;
            file.write_all(content.as_bytes()).map_err(|e| write_failed(&path, &e))?;
        }
        Ok(())
    })();
    if let Err(refusal) = written {
        // leave nothing half made behind (the directory is ours: it did not exist)
        let _ = fs::remove_dir_all(&target);
        return Err(refusal);
    }
    Ok(target)
}

fn write_failed(path: &Path, e: &std::io::Error) -> Refusal {
    Refusal::new("scaffold-write-failed", format!("writing {} failed: {}", path.display(), e.kind()))
        .with_data(json!({ "path": path.display().to_string() }))
}

/// `hello-world` → `Hello World`.
fn display_name(id: &str) -> String {
    id.split('-')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The packages the SDK's test host compiles components with: optimized in test builds too, as
/// the workspace has them (an unoptimized Cranelift takes tens of seconds per component).
const OPTIMIZED_IN_TESTS: [&str; 8] = [
    "cranelift-codegen",
    "cranelift-frontend",
    "cranelift-bforest",
    "cranelift-entity",
    "regalloc2",
    "wasmparser",
    "wasmtime-internal-cranelift",
    "wasmtime-environ",
];

/// The scaffold's files: relative path and content, for the crate at `target`.
fn files(id: &str, target: &Path, sdk: Option<&Path>) -> Result<Vec<(&'static str, String)>> {
    let requirement = sdk_requirement();
    let patch = match sdk {
        Some(sdk) => {
            let path = sdk_path_from(target, sdk);
            let text = path.to_str().ok_or_else(|| {
                Refusal::new("sdk-not-found", format!("the SDK path {} is not UTF-8, so Cargo.toml cannot name it", sdk.display()))
            })?;
            let path_toml = toml::Value::String(text.to_string()).to_string();
            format!(
                r#"
# capstan-sdk is not on crates.io yet: Capstan's source tree stands in for it. Point the path
# at another checkout (its sdk/ directory) if this one moves; drop this once it is published.
[patch.crates-io]
capstan-sdk = {{ path = {path_toml} }}
"#
            )
        }
        None => String::new(),
    };
    let profiles: String = OPTIMIZED_IN_TESTS.iter().map(|p| format!("[profile.dev.package.{p}]\nopt-level = 3\n")).collect();
    let name = display_name(id);
    let cargo = format!(
        r#"[package]
name = "capstan-plugin-{id}"
# The version operators see is the one in {MANIFEST_FILE}.
version = "0.1.0"
edition = "2024"
publish = false

# Its own workspace, so the crate builds wherever it lives.
[workspace]

[lib]
# A WebAssembly component: `capstan plugin build` and `capstan plugin dev` run cargo for wasm32-wasip2.
crate-type = ["cdylib"]

[dependencies]
capstan-sdk = "{requirement}"
schemars = {SCHEMARS_REQUIREMENT}
serde = {SERDE_REQUIREMENT}

[dev-dependencies]
# `cargo test`: the SDK's test host builds the plugin and runs it on an in-process Capstan
capstan-sdk = {{ version = "{requirement}", features = ["testing"] }}
serde_json = "1"
{patch}
# The test host compiles the plugin's component with Cranelift: optimized, so a test takes
# seconds rather than tens of them.
{profiles}"#
    );
    let manifest = format!(
        r#"[plugin]
id = "{id}"
name = "{name}"
# Raise it for every upgrade: the host installs only a higher version over an installed one.
# (`capstan plugin dev` numbers its builds above it by itself: 0.1.1-dev.1, 0.1.1-dev.2, ...)
version = "0.1.0"
wit = "{CURRENT_WIT}"
description = "The {name} manager."

[capabilities]
# What the plugin may ask the host for; the operator approves exactly this set at install.
requested = ["store", "log"]

# A command of the `capstan` CLI, as data: `capstan {id} hello Ada` calls {id}.hello and prints
# the answer's columns (docs/plugins.md, "Commands").
[[commands]]
name = "{id} hello"
about = "Say hello to someone"
method = "hello"
columns = ["message"]
args = [{{ name = "name", field = "name", positional = true, required = true, help = "Who to greet" }}]
"#
    );
    let lib = format!(
        r#"//! The {name} manager: a Capstan plugin. Each method is served at
//! `POST /api/v1/{id}.<method>`; the host checks the caller's role and validates the body against
//! the schema generated from the input type before the plugin runs.

use capstan_sdk::{{Context, Descriptor, JsonSchema, Manager, Result, Role}};
use serde::{{Deserialize, Serialize}};

struct Plugin;

impl Manager for Plugin {{
    fn describe() -> Descriptor {{
        // read_only: it changes nothing, so its calls stay out of the audit log
        Descriptor::new().method("hello", "Say hello to someone.", Role::Authenticated, hello).read_only()
    }}
}}

capstan_sdk::manager!(Plugin);

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Hello {{
    /// Who to greet.
    #[schemars(length(min = 1, max = 200))]
    name: String,
}}

#[derive(Serialize, JsonSchema)]
struct Greeting {{
    message: String,
}}

fn hello(_ctx: &Context, input: Hello) -> Result<Greeting> {{
    capstan_sdk::info!("saying hello to {{}}", input.name);
    Ok(Greeting {{ message: format!("Hello, {{}}!", input.name) }})
}}
"#
    );
    let harness = r#"//! The plugin built for wasm32-wasip2 and run on an in-process Capstan host
//! (`capstan_sdk::testing`), every capability its manifest requests approved: calls go through
//! the same role check and schema validation as the API.

use capstan_sdk::testing::TestHost;
use serde_json::json;

#[test]
fn hello_greets_by_name() {
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    let answer = host.call("hello", json!({ "name": "Ada" })).unwrap();
    assert_eq!(answer["message"], "Hello, Ada!");

    // the host checks the body against the input schema before the plugin runs
    let refused = host.call("hello", json!({ "name": "" })).unwrap_err();
    assert_eq!(refused.code(), "invalid-request");
}
"#
    .to_string();
    let gitignore = "target/\n*.capstan-plugin\n".to_string();
    let readme = format!(
        r#"# {name}

A Capstan plugin: `src/lib.rs` is the manager, `{MANIFEST_FILE}` its manifest (id, version,
capabilities), `tests/harness.rs` its test. Building it needs the `wasm32-wasip2` target
(`rustup target add wasm32-wasip2`).

## Develop

Against a host started with `capstan serve --dev`, logged in as its administrator
(`capstan login --username admin`):

```sh
capstan plugin dev            # build, sign with your dev key, trust it there, install or upgrade
capstan plugin dev --watch    # again on every change, until Ctrl-C
capstan call {id}.hello --set name=you
```

`plugin dev` works on a dev host only (`dev-host-required` elsewhere). It finds the host in
`--url`, else `CAPSTAN_URL`, else `http://127.0.0.1:8080`, and signs with your dev key
(`~/.config/capstan/dev-publisher.pem`, created on first use). Each build is numbered above the
manifest's version (0.1.1-dev.1, 0.1.1-dev.2, ...), so every one is an upgrade.

## Test

```sh
cargo test                    # the plugin on an in-process host (capstan_sdk::testing)
```

## Release

Sign with a publisher key of your own; each host trusts it once:

```sh
capstan plugin keygen --out ~/capstan-publisher.pem   # once: prints the public key hosts trust
capstan plugin build . --key ~/capstan-publisher.pem     # writes {id}-<version>.capstan-plugin here
capstan plugin trust <public key> --name <you>           # on the host, once (after capstan login)
capstan plugin install {id}-0.1.0.capstan-plugin --approve all-requested
capstan plugin upgrade {id}-0.2.0.capstan-plugin --approve all-requested   # after raising the version
```

Capstan's docs/plugins.md walks through settings, pages, secrets, events, reconcile and tasks.
"#
    );
    // the scaffold must always be valid for this host
    Manifest::parse(&manifest)?;
    let mut files = vec![
        ("Cargo.toml", cargo),
        (MANIFEST_FILE, manifest),
        ("src/lib.rs", lib),
        ("tests/harness.rs", harness),
        (".gitignore", gitignore),
        ("README.md", readme),
    ];
    // the dependency versions the SDK is built and tested with, for an offline first build
    if let Some(lock) = sdk.and_then(|sdk| sdk.parent()).and_then(|root| fs::read_to_string(root.join("Cargo.lock")).ok()) {
        files.push(("Cargo.lock", lock));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdk() -> PathBuf {
        find_sdk(None).unwrap().expect("the workspace SDK is found from the build")
    }

    #[test]
    fn scaffolds_a_crate_the_host_accepts() {
        let parent = tempfile::tempdir().unwrap();
        let dir = scaffold(parent.path(), "hello-world", Some(&sdk())).unwrap();
        assert_eq!(dir, fs::canonicalize(parent.path()).unwrap().join("hello-world"));

        let manifest = Manifest::parse(&fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
        assert_eq!(manifest.id, "hello-world");
        assert_eq!(manifest.name, "Hello World");
        assert_eq!(manifest.version.to_string(), "0.1.0");
        assert_eq!(manifest.wit, CURRENT_WIT);
        manifest.check_wit_supported().unwrap();
        assert_eq!(manifest.requested_set().into_iter().collect::<Vec<_>>(), vec!["log", "store"]);

        let cargo: toml::Table = fs::read_to_string(dir.join("Cargo.toml")).unwrap().parse().unwrap();
        assert!(cargo.get("workspace").is_some_and(toml::Value::is_table), "its own [workspace]");
        assert_eq!(cargo["lib"]["crate-type"], toml::Value::Array(vec!["cdylib".into()]));
        assert_eq!(cargo["package"]["edition"].as_str(), Some("2024"));
        // the SDK by version, as a published crate; outside the source tree, patched to it by an
        // absolute path
        assert_eq!(cargo["dependencies"]["capstan-sdk"].as_str(), Some("0.1"));
        assert_eq!(cargo["dev-dependencies"]["capstan-sdk"]["version"].as_str(), Some("0.1"));
        assert_eq!(cargo["dev-dependencies"]["capstan-sdk"]["features"], toml::Value::Array(vec!["testing".into()]));
        let sdk_path = cargo["patch"]["crates-io"]["capstan-sdk"]["path"].as_str().unwrap();
        assert_eq!(Path::new(sdk_path), sdk());
        // the test host's compiler optimized, as the workspace has it
        let workspace: toml::Table = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml")).unwrap().parse().unwrap();
        for package in OPTIMIZED_IN_TESTS {
            assert_eq!(cargo["profile"]["dev"]["package"][package], workspace["profile"]["dev"]["package"][package], "{package}");
        }
        // serde and schemars as the workspace has them
        for dep in ["serde", "schemars"] {
            assert_eq!(cargo["dependencies"][dep], workspace["workspace"]["dependencies"][dep], "{dep}");
        }
        // the SDK's own lock file, for an offline first build
        let lock = fs::read_to_string(dir.join("Cargo.lock")).unwrap();
        assert_eq!(lock, fs::read_to_string(sdk().parent().unwrap().join("Cargo.lock")).unwrap());

        let lib = fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("capstan_sdk::manager!(Plugin);"), "{lib}");
        assert!(lib.contains(r#".method("hello", "#), "{lib}");
        assert!(lib.contains("message: String"), "{lib}");
        let harness = fs::read_to_string(dir.join("tests/harness.rs")).unwrap();
        assert!(harness.contains("TestHost::build(env!(\"CARGO_MANIFEST_DIR\"))"), "{harness}");
        assert!(harness.contains(r#"host.call("hello", "#), "{harness}");
        assert_eq!(fs::read_to_string(dir.join(".gitignore")).unwrap(), "target/\n*.capstan-plugin\n");
        let readme = fs::read_to_string(dir.join("README.md")).unwrap();
        for step in ["capstan plugin dev", "capstan plugin dev --watch", "cargo test", "capstan plugin keygen", "capstan plugin build"] {
            assert!(readme.contains(step), "README shows {step}:\n{readme}");
        }
        assert!(readme.contains("capstan call hello-world.hello"), "{readme}");
        assert!(!dir.join("rust-toolchain.toml").exists());
    }

    #[test]
    fn inside_the_source_tree_the_patch_is_relative_and_without_one_there_is_none() {
        let sdk = sdk();
        let root = sdk.parent().unwrap();
        assert_eq!(sdk_path_from(&root.join("plugins/mine"), &sdk), Path::new("../../sdk"));
        assert_eq!(sdk_path_from(&root.join("mine"), &sdk), Path::new("../sdk"));
        assert_eq!(sdk_path_from(Path::new("/elsewhere/mine"), &sdk), sdk);

        let parent = tempfile::tempdir().unwrap();
        let dir = scaffold(parent.path(), "hello", None).unwrap();
        let cargo: toml::Table = fs::read_to_string(dir.join("Cargo.toml")).unwrap().parse().unwrap();
        assert_eq!(cargo["dependencies"]["capstan-sdk"].as_str(), Some("0.1"));
        assert!(cargo.get("patch").is_none(), "no source tree, no patch: {cargo:?}");
        assert!(!dir.join("Cargo.lock").exists());
        assert_eq!(sdk_requirement(), "0.1");
    }

    #[test]
    fn refuses_an_existing_directory_a_bad_id_and_a_wrong_sdk() {
        let parent = tempfile::tempdir().unwrap();
        let sdk = sdk();
        let sdk = Some(sdk.as_path());
        fs::create_dir(parent.path().join("taken")).unwrap();
        fs::write(parent.path().join("taken/keep"), b"mine").unwrap();
        assert_eq!(scaffold(parent.path(), "taken", sdk).unwrap_err().code, "output-exists");
        assert_eq!(fs::read(parent.path().join("taken/keep")).unwrap(), b"mine", "nothing touched");

        for bad in ["Hello", "x", "9lives", "bad_name"] {
            assert_eq!(scaffold(parent.path(), bad, sdk).unwrap_err().code, "plugin-id-invalid", "{bad}");
        }
        assert_eq!(scaffold(parent.path(), "auth", sdk).unwrap_err().code, "plugin-id-reserved");
        assert_eq!(scaffold(&parent.path().join("missing"), "hello", sdk).unwrap_err().code, "output-directory-missing");

        let refused = find_sdk(Some(parent.path())).unwrap_err();
        assert_eq!(refused.code, "sdk-not-found");
        assert!(refused.message.contains("--sdk"), "{}", refused.message);
        assert_eq!(find_sdk(Some(&self::sdk().join("Cargo.toml"))).unwrap().unwrap(), self::sdk(), "the SDK's Cargo.toml names it too");
    }
}
