//! What a build of one crate links, as `cargo tree` resolves it for that crate alone (`cargo
//! metadata` unifies features across the whole workspace, so it cannot say this):
//!
//! - the SDK's test harness (`capstan-sdk --features testing`) is what its Cargo.toml says —
//!   the plugin host and an embedded store, no HTTP server, MongoDB or S3. A plugin author's
//!   `cargo test` builds it in the plugin's own target directory (the plugin walkthrough's test
//!   does so on every CI run), so each of those is paid in minutes and gigabytes there;
//! - the server keeps what the harness leaves out: S3 in the blobs and the plugin host's
//!   replication, MongoDB, the registry's retirement of a removed service's repository.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each package `cargo tree` resolves for `package` with `features` (normal dependencies, this
/// platform), with the features it is built with.
fn resolved(package: &str, features: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(["tree", "--offline", "-p", package, "-e", "normal", "--prefix", "none", "--format", "{p}|{f}"]);
    if !features.is_empty() {
        command.args(["--features", &features.join(",")]);
    }
    let output = command.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).output().expect("cargo runs");
    assert!(output.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&output.stderr));
    let mut packages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let (package, features) = line.split_once('|').unwrap_or((line, ""));
        let name = package.split_whitespace().next().unwrap_or_default().to_string();
        let features = features.trim_end_matches(" (*)").split(',').filter(|f| !f.is_empty()).map(str::to_string);
        packages.entry(name).or_default().extend(features);
    }
    packages
}

#[test]
fn the_sdk_test_harness_links_no_http_server_mongodb_or_s3() {
    let harness = resolved("capstan-sdk", &["testing"]);
    for expected in ["capstan-plugin-host", "capstan-store", "capstan-links", "wasmtime"] {
        assert!(harness.contains_key(expected), "the harness resolves {expected}: {:?}", harness.keys());
    }
    let heavy: Vec<&String> = harness
        .keys()
        .filter(|name| ["axum", "aws-sdk-s3", "aws-config", "mongodb", "capstan-registry", "capstan-server"].contains(&name.as_str()))
        .collect();
    assert!(heavy.is_empty(), "capstan-sdk --features testing pulls in {heavy:?}");
    // hyper comes with reqwest, the plugins' outbound HTTP client: as a client only
    if let Some(hyper) = harness.get("hyper") {
        assert!(!hyper.contains("server"), "the harness builds hyper's server: {hyper:?}");
    }
    assert!(!harness.get("capstan-store").is_some_and(|f| f.contains("mongodb")), "the harness's store: {:?}", harness["capstan-store"]);
    assert!(!harness.get("capstan-blobs").is_some_and(|f| f.contains("s3")), "the harness's blobs: {:?}", harness.get("capstan-blobs"));
}

#[test]
fn the_server_keeps_s3_mongodb_and_the_registry() {
    let server = resolved("capstan-server", &[]);
    for (package, feature) in
        [("capstan-blobs", "s3"), ("capstan-plugin-host", "s3"), ("capstan-store", "mongodb"), ("capstan-links", "registry")]
    {
        let features = server.get(package).unwrap_or_else(|| panic!("the server resolves {package}"));
        assert!(features.contains(feature), "the server builds {package} with {feature}: {features:?}");
    }
    for expected in ["aws-sdk-s3", "mongodb", "axum", "capstan-registry"] {
        assert!(server.contains_key(expected), "the server resolves {expected}");
    }
}
