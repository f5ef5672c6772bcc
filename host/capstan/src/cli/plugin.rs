//! `capstan plugin keygen | sign | verify | inspect | build`: the plugin author's offline
//! commands. They never start the host or talk to it. `new` scaffolds a plugin crate
//! (`plugin_new`), `dev` runs the author's loop against a dev host (`plugin_dev`); the
//! operator's commands are clients of a running host (`plugin_online`).

use super::client::print_json;
use super::{plugin_dev, plugin_new, plugin_online};
use crate::plugins::bundle::{self, Bundle, MAX_BUNDLE_BYTES, PublisherKey};
use crate::plugins::manifest::{MANIFEST_FILE, Manifest};
use crate::refusal::{Refusal, Result};
use clap::Subcommand;
use serde_json::{Value, json};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Scaffold a plugin crate in `<dir>/<name>/` that builds, tests and signs out of the box.
    ///
    /// Writes Cargo.toml (its own workspace; a cdylib depending on capstan-sdk by version, with
    /// a `[patch.crates-io]` pointing it at the SDK's source tree when one is at hand: --sdk, or
    /// the tree this capstan was built from), that tree's Cargo.lock, capstan-plugin.toml (id =
    /// NAME, version 0.1.0, capabilities store and log), src/lib.rs (one method, `hello`),
    /// tests/harness.rs (the SDK's test host), .gitignore and README.md. Refuses
    /// `plugin-id-invalid`, `output-exists` and, for an --sdk that is not the SDK, `sdk-not-found`.
    New(plugin_new::NewArgs),
    /// Build, sign with your dev key, trust it and install or upgrade, on a dev host: the
    /// author's loop (`--watch`: again on every change).
    ///
    /// Run in the crate `plugin new` made (or name it). The host (--url, else CAPSTAN_URL, else
    /// http://127.0.0.1:8080) must run `serve --dev`, else it is refused `dev-host-required`
    /// before anything is created, trusted or built; the session is CAPSTAN_TOKEN's or the one
    /// `capstan login` stored for that URL, an administrator's (on a terminal, asked for when
    /// missing or ended). The dev key, $XDG_CONFIG_HOME/capstan/dev-publisher.pem (else
    /// ~/.config/capstan/dev-publisher.pem), is created on first use (mode 0600; a key others
    /// can read is refused) and trusted on that host once. Each build is numbered above the
    /// manifest's version (0.1.0 → 0.1.1-dev.1, -dev.2, …), installed or upgraded with every
    /// capability it requests approved, and the plugin's API URL and a sample `capstan call`
    /// are printed. The bundle is kept in DIR/target/capstan-dev/.
    Dev(plugin_dev::DevArgs),
    /// Create a publisher signing key (Ed25519) and print its public key.
    ///
    /// The private key is written as PKCS#8 PEM to a new file, mode 0600, through a same-directory
    /// temporary file hard-linked into place. Standard output is exactly the public key line
    /// (`capstan-ed25519:…`), the text operators trust with `plugins.addTrustedPublisher`.
    /// An existing output (a symbolic link included) is refused `output-exists`; a directory
    /// writable by group or others `output-directory-not-private`.
    Keygen {
        /// Where to write the private key (must not exist)
        #[arg(id = "out", long = "out", value_name = "FILE")]
        output: PathBuf,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Sign a bundle in place with a publisher key, replacing any earlier signature.
    ///
    /// The signature covers the bundle's canonical digest (id, version, manifest and component
    /// SHA-256). The file is rewritten through a temporary file renamed into place. Refuses a
    /// malformed bundle by its code (`bundle-malformed`, `bundle-too-large`, `manifest-invalid`,
    /// …) and a key file that is not private (`input-permissions`, …) or not a key
    /// (`key-file-invalid`).
    Sign {
        /// The bundle file (`<id>-<version>.capstan-plugin`)
        bundle: PathBuf,
        /// The private key file `capstan plugin keygen` wrote
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Check a bundle's structure and signature, and with --trust the signer's trust.
    ///
    /// Refuses `bundle-malformed`, `bundle-too-large`, `bundle-signature-invalid` (unsigned, or
    /// changed after signing) and, when --trust keys are given and none is the signer,
    /// `publisher-untrusted`. Without --trust any valid signature passes (and a note says the
    /// publisher was not checked).
    Verify {
        /// The bundle file
        bundle: PathBuf,
        /// A trusted publisher key (`capstan-ed25519:…`); repeat for more
        #[arg(long = "trust", value_name = "PUBLIC_KEY")]
        trust: Vec<String>,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Show a bundle: manifest, requested capabilities, limits, digests and signer.
    ///
    /// Refuses a malformed bundle by its code. The signer's signature is checked and shown as
    /// valid or invalid; trust is `verify --trust`'s question.
    Inspect {
        /// The bundle file
        bundle: PathBuf,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Build a plugin crate for wasm32-wasip2 and pack it as `<id>-<version>.capstan-plugin`.
    ///
    /// Reads and validates DIR/capstan-plugin.toml first (refusing `manifest-missing`,
    /// `manifest-invalid`, `plugin-id-invalid`, `capability-unknown`, `wit-version-unsupported`
    /// before anything is built), runs `cargo build --release --target wasm32-wasip2` on
    /// DIR/Cargo.toml (its progress goes to standard error; CARGO_TARGET_DIR is respected), packs
    /// the crate's cdylib component with the manifest, signs it with --key if given, writes the
    /// bundle into DIR (or --out-dir) atomically and prints its absolute path. Refuses `build-failed` when cargo
    /// fails and `artifact-missing` when the crate produced no cdylib `.wasm`.
    Build {
        /// The plugin crate directory
        #[arg(value_name = "DIR", default_value = ".")]
        dir: PathBuf,
        /// Sign the bundle with this private key file
        #[arg(long, value_name = "FILE")]
        key: Option<PathBuf>,
        /// Write the bundle into this directory instead of DIR (for CI and read-only sources)
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    #[command(flatten)]
    Online(plugin_online::OnlineCommand),
}

pub fn run(command: PluginCommand) -> ExitCode {
    let (result, json) = match command {
        PluginCommand::Keygen { output, json } => (keygen(&output, json), json),
        PluginCommand::Sign { bundle, key, json } => (sign(&bundle, &key, json), json),
        PluginCommand::Verify { bundle, trust, json } => (verify(&bundle, &trust, json), json),
        PluginCommand::Inspect { bundle, json } => (inspect(&bundle, json), json),
        PluginCommand::Build { dir, key, out_dir, json } => (build(&dir, key.as_deref(), out_dir.as_deref(), json), json),
        PluginCommand::New(args) => plugin_new::run(&args),
        PluginCommand::Dev(args) => plugin_dev::run(&args),
        PluginCommand::Online(command) => plugin_online::run(command),
    };
    super::client::finish(result, json)
}

fn display(path: &Path) -> String {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string()
}

fn keygen(output: &Path, json: bool) -> Result<()> {
    let key = bundle::generate_key();
    let public = bundle::write_key_file(output, &key)?;
    if json {
        print_json(&json!({ "ok": true, "publicKey": public.to_string(), "fingerprint": public.fingerprint(), "output": display(output) }));
    } else {
        eprintln!("wrote a new publisher key to {} (mode 0600); fingerprint {}", display(output), public.fingerprint());
        println!("{public}");
    }
    Ok(())
}

fn sign(path: &Path, key_path: &Path, json: bool) -> Result<()> {
    let bytes = bundle::read_bundle_file(path)?;
    let mut parsed = Bundle::parse(&bytes)?;
    let key = bundle::read_key_file(key_path)?;
    let previous = parsed.signature.as_ref().map(|s| s.publisher.clone());
    parsed.sign(&key);
    let mode = fs::metadata(path).map(|m| m.permissions().mode() & 0o777).unwrap_or(0o644);
    write_atomically(path, &parsed.to_bytes(), mode)?;
    let signer = PublisherKey::from(&key);
    if json {
        print_json(&json!({
            "ok": true,
            "bundle": display(path),
            "digest": parsed.digest_hex(),
            "publicKey": signer.to_string(),
            "fingerprint": signer.fingerprint(),
            "replaced": previous.map(|p| p.to_string()),
        }));
    } else {
        println!("signed {} ({} {})", display(path), parsed.manifest.id, parsed.manifest.version);
        println!("  digest: {}", parsed.digest_hex());
        println!("  signer: {signer} ({})", signer.fingerprint());
        if let Some(previous) = previous.filter(|p| *p != signer) {
            println!("  replaced the signature by {previous} ({})", previous.fingerprint());
        }
    }
    Ok(())
}

fn verify(path: &Path, trust: &[String], json: bool) -> Result<()> {
    let trusted =
        trust.iter().map(|t| t.parse::<PublisherKey>().map_err(crate::plugins::bundle::key_refusal)).collect::<Result<Vec<_>>>()?;
    let parsed = Bundle::parse(&bundle::read_bundle_file(path)?)?;
    let signer = if trusted.is_empty() { parsed.verify_signature()?.publisher.clone() } else { parsed.verify(&trusted)? };
    let m = &parsed.manifest;
    if json {
        print_json(&json!({
            "ok": true,
            "id": m.id,
            "version": m.version.to_string(),
            "digest": parsed.digest_hex(),
            "publicKey": signer.to_string(),
            "fingerprint": signer.fingerprint(),
            "trustChecked": !trusted.is_empty(),
        }));
    } else {
        println!("verified: {} {} signed by {signer} ({})", m.id, m.version, signer.fingerprint());
        if trusted.is_empty() {
            eprintln!("note: no --trust key was given, so the signature is valid but the publisher was not checked");
        }
    }
    Ok(())
}

fn inspect(path: &Path, json: bool) -> Result<()> {
    let parsed = Bundle::parse(&bundle::read_bundle_file(path)?)?;
    let inspection = parsed.inspect();
    let signature_valid = parsed.signature.as_ref().map(|_| parsed.verify_signature().is_ok());
    if json {
        print_json(&json!({ "ok": true, "bundle": inspection, "signatureValid": signature_valid }));
        return Ok(());
    }
    let i = &inspection;
    println!("plugin:        {} {} ({})", i.id, i.version, i.name);
    if !i.description.is_empty() {
        println!("description:   {}", i.description.replace('\n', "\n               "));
    }
    if let Some(publisher) = &i.publisher {
        println!("publisher:     {publisher} (as the manifest names it; the signer below is what counts)");
    }
    println!("wit:           {}", i.wit);
    if i.capabilities.is_empty() {
        println!("capabilities:  none");
    } else {
        println!("capabilities:");
        for capability in &i.capabilities {
            println!("  - {capability}");
        }
    }
    println!("limits:        {}", i.limits.summary());
    println!("component:     {} bytes, sha256 {}", i.component_bytes, i.component_sha256);
    println!("manifest:      sha256 {}", i.manifest_sha256);
    println!("digest:        {}", i.digest);
    match (&i.signed_by, &i.fingerprint, signature_valid) {
        (Some(key), Some(fingerprint), Some(valid)) => {
            let state = if valid { "signature valid" } else { "SIGNATURE INVALID: changed after signing" };
            println!("signed by:     {key} ({fingerprint}); {state}");
        }
        _ => println!("signed by:     nobody (unsigned)"),
    }
    Ok(())
}

fn build(dir: &Path, key_path: Option<&Path>, out_dir: Option<&Path>, json: bool) -> Result<()> {
    let dir = std::path::absolute(dir).map_err(|e| Refusal::new("build-failed", format!("cannot resolve {}: {e}", dir.display())))?;
    let (manifest_text, manifest) = read_manifest(&dir)?;
    // read the key before a long build, so a bad key fails fast
    let key = key_path.map(bundle::read_key_file).transpose()?;
    let mut built = compile(&dir, manifest_text)?;
    if let Some(key) = &key {
        built.sign(key);
    }
    let output = out_dir.map_or_else(|| Ok(dir.clone()), std::path::absolute).map_err(Refusal::internal)?.join(built.file_name());
    write_atomically(&output, &built.to_bytes(), 0o644)?;
    if json {
        print_json(&json!({ "ok": true, "output": output.display().to_string(), "bundle": built.inspect() }));
    } else {
        match &built.signature {
            Some(s) => eprintln!("built {} {}, signed by {} ({})", manifest.id, manifest.version, s.publisher, s.publisher.fingerprint()),
            None => eprintln!("built {} {} (unsigned; sign it with `capstan plugin sign`)", manifest.id, manifest.version),
        }
        println!("{}", output.display());
    }
    Ok(())
}

/// `DIR/capstan-plugin.toml`: its text and the manifest it parses to, checked before anything is
/// built (`manifest-missing`, `manifest-invalid`, `wit-version-unsupported`, …).
pub(super) fn read_manifest(dir: &Path) -> Result<(String, Manifest)> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let manifest_text = fs::read_to_string(&manifest_path).map_err(|e| {
        Refusal::new("manifest-missing", format!("cannot read {}: {}", manifest_path.display(), e.kind()))
            .with_data(json!({ "path": manifest_path.display().to_string() }))
    })?;
    let manifest = Manifest::parse(&manifest_text)?;
    manifest.check_wit_supported()?;
    Ok((manifest_text, manifest))
}

/// Build the crate in `dir` (absolute) for wasm32-wasip2 and pack its component with
/// `manifest_text` and the crate's page templates: an unsigned bundle.
pub(super) fn compile(dir: &Path, manifest_text: String) -> Result<Bundle> {
    let cargo_toml = dir.join("Cargo.toml");
    if !cargo_toml.is_file() {
        return Err(Refusal::new("build-failed", format!("{} has no Cargo.toml: a plugin is a Rust crate", dir.display()))
            .with_data(json!({ "path": cargo_toml.display().to_string() })));
    }
    let wasm = cargo_build(&cargo_toml)?;
    let component = fs::read(&wasm).map_err(|e| {
        Refusal::new("artifact-missing", format!("cannot read the built component {}: {}", wasm.display(), e.kind()))
            .with_data(json!({ "path": wasm.display().to_string() }))
    })?;
    if component.len() > MAX_BUNDLE_BYTES {
        return Err(Refusal::new(
            "bundle-too-large",
            format!("the component is {} bytes; a bundle may be at most {MAX_BUNDLE_BYTES} bytes", component.len()),
        ));
    }
    Bundle::new(manifest_text, component)?.with_pages(bundle::read_page_templates(dir)?)
}

/// Run cargo for wasm32-wasip2 and return the crate's cdylib `.wasm`.
fn cargo_build(cargo_toml: &Path) -> Result<PathBuf> {
    let mut child = Command::new("cargo")
        .args(["build", "--release", "--target", "wasm32-wasip2", "--message-format=json-render-diagnostics", "--manifest-path"])
        .arg(cargo_toml)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| Refusal::new("build-failed", format!("could not run cargo: {e}")))?;
    let mut artifacts = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Ok(message) = serde_json::from_str::<Value>(&line)
                && let Some(artifact) = cdylib_wasm(&message)
            {
                artifacts.push(artifact);
            }
        }
    }
    let status = child.wait().map_err(|e| Refusal::new("build-failed", format!("waiting for cargo failed: {e}")))?;
    if !status.success() {
        return Err(Refusal::new(
            "build-failed",
            format!(
                "cargo build failed ({status}); its errors are above (a missing target installs with \
                 `rustup target add wasm32-wasip2`)"
            ),
        )
        .with_data(json!({ "exitCode": status.code() })));
    }
    pick_artifact(cargo_toml, artifacts)
}

/// From one cargo JSON message: `(manifest_path, wasm file)` of a cdylib artifact.
fn cdylib_wasm(message: &Value) -> Option<(PathBuf, PathBuf)> {
    if message["reason"] != "compiler-artifact" {
        return None;
    }
    let kinds = message["target"]["kind"].as_array()?;
    if !kinds.iter().any(|k| k == "cdylib") {
        return None;
    }
    let wasm = message["filenames"].as_array()?.iter().filter_map(Value::as_str).find(|f| f.ends_with(".wasm"))?;
    Some((PathBuf::from(message["manifest_path"].as_str().unwrap_or_default()), PathBuf::from(wasm)))
}

/// The artifact of the crate at `cargo_toml`; when only one cdylib was built, that one.
fn pick_artifact(cargo_toml: &Path, artifacts: Vec<(PathBuf, PathBuf)>) -> Result<PathBuf> {
    let wanted = fs::canonicalize(cargo_toml).unwrap_or_else(|_| cargo_toml.to_path_buf());
    let same = |p: &Path| fs::canonicalize(p).map(|p| p == wanted).unwrap_or(false) || p == wanted;
    if let Some((_, wasm)) = artifacts.iter().find(|(manifest, _)| same(manifest)) {
        return Ok(wasm.clone());
    }
    let missing = || {
        Refusal::new(
            "artifact-missing",
            format!(
                "cargo built no cdylib .wasm for {}; the plugin crate needs `[lib] crate-type = [\"cdylib\"]` in its Cargo.toml",
                cargo_toml.display()
            ),
        )
    };
    match artifacts.len() {
        1 => artifacts.into_iter().next().map(|(_, wasm)| wasm).ok_or_else(missing),
        _ => Err(missing()),
    }
}

/// Replace `path` with `bytes` atomically.
pub(super) fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let path = std::path::absolute(path).map_err(|e| write_failed(path, &e))?;
    capstan_core::private_file::replace_atomically(&path, bytes, mode).map_err(|e| write_failed(&path, &e))
}

fn write_failed(path: &Path, e: &std::io::Error) -> Refusal {
    Refusal::new("bundle-write-failed", format!("writing {} failed: {}", path.display(), e.kind()))
        .with_data(json!({ "path": path.display().to_string() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cdylib_wasm_in_cargo_messages() {
        let lib = json!({
            "reason": "compiler-artifact",
            "manifest_path": "/x/dep/Cargo.toml",
            "target": { "kind": ["lib"] },
            "filenames": ["/t/libdep.rlib"],
        });
        let plugin = json!({
            "reason": "compiler-artifact",
            "manifest_path": "/x/plugin/Cargo.toml",
            "target": { "kind": ["cdylib", "rlib"] },
            "filenames": ["/t/wasm32-wasip2/release/example.wasm", "/t/libexample.rlib"],
        });
        assert_eq!(cdylib_wasm(&lib), None);
        assert_eq!(cdylib_wasm(&json!({ "reason": "build-finished", "success": true })), None);
        let found = cdylib_wasm(&plugin).unwrap();
        assert_eq!(found.1, PathBuf::from("/t/wasm32-wasip2/release/example.wasm"));

        let wanted = Path::new("/x/plugin/Cargo.toml");
        assert_eq!(pick_artifact(wanted, vec![found.clone()]).unwrap(), found.1);
        let other = (PathBuf::from("/x/other/Cargo.toml"), PathBuf::from("/t/other.wasm"));
        assert_eq!(pick_artifact(wanted, vec![other.clone(), found.clone()]).unwrap(), found.1);
        assert_eq!(pick_artifact(wanted, vec![other.clone()]).unwrap(), other.1, "the only cdylib built");
        let err = pick_artifact(wanted, vec![]).unwrap_err();
        assert_eq!(err.code, "artifact-missing");
        assert!(err.message.contains("crate-type = [\"cdylib\"]"), "{}", err.message);
        let two = vec![other.clone(), (PathBuf::from("/x/third/Cargo.toml"), PathBuf::from("/t/third.wasm"))];
        assert_eq!(pick_artifact(wanted, two).unwrap_err().code, "artifact-missing");
    }

    #[test]
    fn writes_atomically_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.capstan-plugin");
        write_atomically(&path, b"one", 0o644).unwrap();
        write_atomically(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
        assert_eq!(write_atomically(&dir.path().join("no/such"), b"x", 0o644).unwrap_err().code, "bundle-write-failed");
    }
}
