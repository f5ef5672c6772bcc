//! `capstan plugin new <name>`: scaffold a plugin crate that builds, signs and installs out of
//! the box (`capstan plugin build <dir> --key <file>`).

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
    /// The capstan-sdk crate directory (default: the SDK of the source tree this capstan was
    /// built from, when it is still there)
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
    let target = scaffold(&args.dir, &args.name, &sdk)?;
    let files = files(&args.name, &sdk)?.into_iter().map(|(name, _)| name).collect::<Vec<_>>();
    if args.json {
        println!(
            "{}",
            json!({ "ok": true, "id": args.name, "dir": target.display().to_string(), "sdk": sdk.display().to_string(), "files": files })
        );
        return Ok(());
    }
    let dir = target.display();
    let id = &args.name;
    println!("created {dir}: the Capstan plugin {id} (SDK at {})", sdk.display());
    println!();
    println!("next steps:");
    println!("  a signing key, once (it prints the public key hosts trust):");
    println!("    capstan plugin keygen --out ~/capstan-publisher.pem");
    println!("  build and sign (writes {dir}/{id}-0.1.0.capstan-plugin):");
    println!("    capstan plugin build {dir} --key ~/capstan-publisher.pem");
    println!("  on a host, after `capstan login`: trust the key once, then install:");
    println!("    capstan plugin trust <public key> --name <your name>");
    println!("    capstan plugin install {dir}/{id}-0.1.0.capstan-plugin --approve all-requested");
    Ok(())
}

/// The SDK directory: `--sdk`, else the one this binary was built beside; canonical.
fn find_sdk(given: Option<&Path>) -> Result<PathBuf> {
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
            Ok(dir)
        }
        None => fs::canonicalize(BUILT_SDK).ok().filter(|d| is_sdk(d)).ok_or_else(|| {
            Refusal::new(
                "sdk-not-found",
                "this capstan was built away from the source tree it can point plugins at; name the capstan-sdk crate directory \
                 (sdk/ in Capstan's source) with --sdk <path>",
            )
        }),
    }
}

/// Create `<parent>/<id>/` with the crate's files; the created directory (absolute).
fn scaffold(parent: &Path, id: &str, sdk: &Path) -> Result<PathBuf> {
    manifest::check_plugin_id(id)?;
    let parent = std::path::absolute(parent)
        .map_err(|e| Refusal::new("output-directory-missing", format!("cannot resolve {}: {}", parent.display(), e.kind())))?;
    if !parent.is_dir() {
        return Err(Refusal::new("output-directory-missing", format!("{} is not a directory", parent.display()))
            .with_data(json!({ "path": parent.display().to_string() })));
    }
    let files = files(id, sdk)?;
    let target = parent.join(id);
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

/// The scaffold's files: relative path and content.
fn files(id: &str, sdk: &Path) -> Result<Vec<(&'static str, String)>> {
    let sdk_text = sdk.to_str().ok_or_else(|| {
        Refusal::new("sdk-not-found", format!("the SDK path {} is not UTF-8, so Cargo.toml cannot name it", sdk.display()))
    })?;
    let sdk_toml = toml::Value::String(sdk_text.to_string()).to_string();
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
# A WebAssembly component: `capstan plugin build` runs cargo for wasm32-wasip2.
crate-type = ["cdylib"]

[dependencies]
capstan-sdk = {{ path = {sdk_toml} }}
schemars = {SCHEMARS_REQUIREMENT}
serde = {SERDE_REQUIREMENT}
"#
    );
    let manifest = format!(
        r#"[plugin]
id = "{id}"
name = "{name}"
# Raise it for every upgrade: the host installs only a higher version over an installed one.
version = "0.1.0"
wit = "{CURRENT_WIT}"
description = "The {name} manager."

[capabilities]
# What the plugin may ask the host for; the operator approves exactly this set at install.
requested = ["store", "log"]
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
        Descriptor::new().method("hello", "Say hello to someone.", Role::Authenticated, hello)
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
    let gitignore = "target/\n*.capstan-plugin\n".to_string();
    let readme = format!(
        r#"# {name}

A Capstan plugin: `src/lib.rs` is the manager, `{MANIFEST_FILE}` its manifest (id, version, capabilities).

    capstan plugin keygen --out ~/capstan-publisher.pem   # once: prints the public key hosts trust
    capstan plugin build . --key ~/capstan-publisher.pem     # writes {id}-<version>.capstan-plugin here
    capstan plugin sign {id}-0.1.0.capstan-plugin --key ~/capstan-publisher.pem   # (re)sign a built bundle
    capstan plugin trust <public key> --name <you>           # on the host, once (after capstan login)
    capstan plugin install {id}-0.1.0.capstan-plugin --approve all-requested
    curl -H "authorization: Bearer $TOKEN" -H 'content-type: application/json' -d '{{"name":"you"}}' http://127.0.0.1:8080/api/v1/{id}.hello
"#
    );
    // the scaffold must always be valid for this host
    Manifest::parse(&manifest)?;
    Ok(vec![("Cargo.toml", cargo), (MANIFEST_FILE, manifest), ("src/lib.rs", lib), (".gitignore", gitignore), ("README.md", readme)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdk() -> PathBuf {
        find_sdk(None).expect("the workspace SDK is found from the build")
    }

    #[test]
    fn scaffolds_a_crate_the_host_accepts() {
        let parent = tempfile::tempdir().unwrap();
        let dir = scaffold(parent.path(), "hello-world", &sdk()).unwrap();
        assert_eq!(dir, parent.path().join("hello-world"));

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
        let sdk_path = cargo["dependencies"]["capstan-sdk"]["path"].as_str().unwrap();
        assert_eq!(Path::new(sdk_path), sdk());
        assert!(Path::new(sdk_path).is_absolute());

        // serde and schemars as the workspace has them
        let workspace: toml::Table = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml")).unwrap().parse().unwrap();
        for dep in ["serde", "schemars"] {
            assert_eq!(cargo["dependencies"][dep], workspace["workspace"]["dependencies"][dep], "{dep}");
        }

        let lib = fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("capstan_sdk::manager!(Plugin);"), "{lib}");
        assert!(lib.contains(r#".method("hello", "#), "{lib}");
        assert!(lib.contains("message: String"), "{lib}");
        assert_eq!(fs::read_to_string(dir.join(".gitignore")).unwrap(), "target/\n*.capstan-plugin\n");
        let readme = fs::read_to_string(dir.join("README.md")).unwrap();
        assert_eq!(readme.lines().count(), 10, "{readme}");
        for step in ["keygen", "build", "sign", "install"] {
            assert!(readme.contains(&format!("capstan plugin {step}")), "README shows {step}");
        }
        assert!(!dir.join("rust-toolchain.toml").exists());
    }

    #[test]
    fn refuses_an_existing_directory_a_bad_id_and_a_wrong_sdk() {
        let parent = tempfile::tempdir().unwrap();
        fs::create_dir(parent.path().join("taken")).unwrap();
        fs::write(parent.path().join("taken/keep"), b"mine").unwrap();
        assert_eq!(scaffold(parent.path(), "taken", &sdk()).unwrap_err().code, "output-exists");
        assert_eq!(fs::read(parent.path().join("taken/keep")).unwrap(), b"mine", "nothing touched");

        for bad in ["Hello", "x", "9lives", "bad_name"] {
            assert_eq!(scaffold(parent.path(), bad, &sdk()).unwrap_err().code, "plugin-id-invalid", "{bad}");
        }
        assert_eq!(scaffold(parent.path(), "auth", &sdk()).unwrap_err().code, "plugin-id-reserved");
        assert_eq!(scaffold(&parent.path().join("missing"), "hello", &sdk()).unwrap_err().code, "output-directory-missing");

        let refused = find_sdk(Some(parent.path())).unwrap_err();
        assert_eq!(refused.code, "sdk-not-found");
        assert!(refused.message.contains("--sdk"), "{}", refused.message);
        assert_eq!(find_sdk(Some(&sdk().join("Cargo.toml"))).unwrap(), sdk(), "the SDK's Cargo.toml names it too");
    }
}
