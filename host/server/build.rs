//! Builds the first-party plugins for `wasm32-wasip2` and embeds them in the host.
//!
//! Which ones: `[package.metadata.capstan] first-party-plugins` in this crate's Cargo.toml,
//! each the name of a directory under `plugins/` holding a plugin crate and its
//! `capstan-plugin.toml`. Each is built (release, without debug info: a smaller component
//! compiles faster at every first start) by a nested cargo into its own target directory,
//! `$CARGO_TARGET_DIR/wasm-first-party/<source tree>`, and `$OUT_DIR/first_party.rs` is
//! written, holding every plugin's manifest text and component bytes for `plugins::first_party`.
//! One directory per source tree: two clones sharing a `CARGO_TARGET_DIR` would otherwise
//! overwrite each other's component, and cargo, finding its own unit fresh, would not write
//! it back.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir.join("../..").canonicalize().expect("the host crate lives two levels under the workspace root");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");
    let names = first_party_names(&manifest_dir.join("Cargo.toml"));
    let mut entries = Vec::new();
    if !names.is_empty() {
        // what the plugins build on outside their own folders: the SDK, the WIT, the host's
        // publisher keys (the App Store's catalog stands on them), what the mail managers share,
        // the workspace's manifests
        for watched in ["sdk", "wit", "host/publisher-key", "plugins/smtp", "Cargo.lock", "Cargo.toml"] {
            println!("cargo:rerun-if-changed={}", workspace.join(watched).display());
        }
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"))
            .join("wasm-first-party")
            .join(tree_name(&workspace));
        let packages: Vec<(String, PathBuf)> = names
            .iter()
            .map(|name| {
                let dir = workspace.join("plugins").join(name);
                println!("cargo:rerun-if-changed={}", dir.display());
                (package_name(&dir.join("Cargo.toml")), dir)
            })
            .collect();
        build(&workspace, &target_dir, &packages);
        for (package, dir) in &packages {
            let built = target_dir.join("wasm32-wasip2/release").join(format!("{}.wasm", package.replace('-', "_")));
            // a copy of our own, so a later build of the shared directory cannot change what is embedded
            let embedded = out_dir.join(format!("{package}.wasm"));
            std::fs::copy(&built, &embedded).unwrap_or_else(|e| panic!("cannot copy {}: {e}", built.display()));
            entries.push((dir.join("capstan-plugin.toml"), embedded, page_templates(dir)));
        }
    }
    let mut code = String::from("/// A page template: its entry name (`pages/<name>.html`) and text.\n");
    code.push_str("pub type PageTemplate = (&'static str, &'static str);\n");
    code.push_str("/// Every first-party plugin: its `capstan-plugin.toml` text, its component and its page templates.\n");
    code.push_str("pub static EMBEDDED: &[(&str, &[u8], &[PageTemplate])] = &[\n");
    for (manifest, component, pages) in &entries {
        let pages: String =
            pages.iter().map(|(name, path)| format!("({name:?}, include_str!({:?})), ", path.display().to_string())).collect();
        code.push_str(&format!(
            "    (include_str!({:?}), include_bytes!({:?}), &[{pages}]),\n",
            manifest.display().to_string(),
            component.display().to_string()
        ));
    }
    code.push_str("];\n");
    std::fs::write(out_dir.join("first_party.rs"), code).expect("OUT_DIR is writable");
}

/// The files of a plugin's `pages/` directory, as `(pages/<file name>, path)` in name order
/// (the bundle checks each when the host starts).
fn page_templates(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut pages: Vec<(String, PathBuf)> = match std::fs::read_dir(dir.join("pages")) {
        Ok(entries) => entries.filter_map(|e| e.ok()).map(|e| (format!("pages/{}", e.file_name().to_string_lossy()), e.path())).collect(),
        Err(_) => Vec::new(),
    };
    pages.sort();
    pages
}

/// `[package.metadata.capstan] first-party-plugins` of the host crate.
fn first_party_names(cargo_toml: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(cargo_toml).expect("the host's Cargo.toml is readable");
    let manifest: toml::Table = text.parse().expect("the host's Cargo.toml is TOML");
    let list =
        manifest.get("package").and_then(|p| p.get("metadata")).and_then(|m| m.get("capstan")).and_then(|c| c.get("first-party-plugins"));
    match list.and_then(toml::Value::as_array) {
        Some(items) => items.iter().map(|v| v.as_str().expect("first-party-plugins lists directory names").to_string()).collect(),
        None => Vec::new(),
    }
}

fn package_name(cargo_toml: &Path) -> String {
    let text = std::fs::read_to_string(cargo_toml).unwrap_or_else(|e| panic!("first-party plugin {}: {e}", cargo_toml.display()));
    let manifest: toml::Table = text.parse().unwrap_or_else(|e| panic!("{}: {e}", cargo_toml.display()));
    manifest["package"]["name"].as_str().expect("a package name").to_string()
}

/// A short stable name for the source tree at `workspace` (FNV-1a of its path).
fn tree_name(workspace: &Path) -> String {
    let hash = workspace
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
    format!("{hash:016x}")
}

/// Install the wasm32-wasip2 standard library when this toolchain lacks it. rustup adds the
/// targets rust-toolchain.toml lists only when it installs the toolchain itself; on a machine
/// whose toolchain was already there, the README's first command would otherwise stop here.
fn ensure_wasm_target() {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(rustc).args(["--print", "sysroot"]).output().ok().filter(|o| o.status.success());
    let Some(sysroot) = sysroot.map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())) else { return };
    if sysroot.join("lib/rustlib/wasm32-wasip2").is_dir() {
        return;
    }
    let mut rustup = Command::new("rustup");
    rustup.args(["target", "add", "wasm32-wasip2"]);
    if let Some(toolchain) = std::env::var_os("RUSTUP_TOOLCHAIN") {
        rustup.arg("--toolchain").arg(toolchain);
    }
    println!("cargo:warning=installing the wasm32-wasip2 target (rustup target add wasm32-wasip2) to build the first-party plugins");
    // a failure is reported by the build that follows, with the command to run by hand
    let _ = rustup.status();
}

/// One nested `cargo build` for every first-party plugin, with none of the outer build's
/// compiler settings (clippy's wrapper, host rustflags, a target override) leaking in.
fn build(workspace: &Path, target_dir: &Path, packages: &[(String, PathBuf)]) {
    ensure_wasm_target();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(workspace).args(["build", "--release", "--target", "wasm32-wasip2"]).arg("--target-dir").arg(target_dir);
    for (package, _) in packages {
        command.args(["-p", package]);
    }
    command.env("CARGO_PROFILE_RELEASE_DEBUG", "false").env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    for leaked in
        ["RUSTC_WORKSPACE_WRAPPER", "RUSTC_WRAPPER", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_BUILD_TARGET", "CARGO_TARGET_DIR"]
    {
        command.env_remove(leaked);
    }
    let status = command.status().unwrap_or_else(|e| panic!("cannot run cargo to build the first-party plugins: {e}"));
    assert!(
        status.success(),
        "building the first-party plugins for wasm32-wasip2 failed ({status}); its errors are above. \
         The target installs with `rustup target add wasm32-wasip2` (rust-toolchain.toml lists it)."
    );
}
