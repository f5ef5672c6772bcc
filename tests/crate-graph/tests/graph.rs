//! Holds the workspace to the crate graph of `capstan_crate_graph::ALLOWED` (and, for
//! dev-dependencies, `TEST_ONLY`), as `cargo metadata` reports it.

use capstan_crate_graph::{allowed, edge_allowed, find_cycle};
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::Command;

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        // at the root, so the default members are the workspace's (a member's directory narrows them)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

/// Every dependency between two workspace crates: (from, to, kind).
fn workspace_edges(metadata: &Value) -> (BTreeSet<String>, Vec<(String, String, String)>) {
    let packages = metadata["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages.iter().map(|p| p["name"].as_str().expect("a name").to_string()).collect();
    let mut edges = Vec::new();
    for package in packages {
        let from = package["name"].as_str().expect("a name");
        for dep in package["dependencies"].as_array().expect("dependencies") {
            let to = dep["name"].as_str().expect("a dependency name");
            // a crate naming itself (to turn on its own features in its tests) is no edge
            if names.contains(to) && to != from {
                let kind = dep["kind"].as_str().unwrap_or("normal").to_string();
                edges.push((from.to_string(), to.to_string(), kind));
            }
        }
    }
    (names, edges)
}

#[test]
fn every_dependency_between_workspace_crates_is_one_the_graph_allows() {
    let (names, edges) = workspace_edges(&metadata());
    assert!(names.contains("capstan-core") && names.contains("capstan"), "the workspace was read: {names:?}");
    let unplaced: Vec<&String> = names.iter().filter(|n| allowed(n).is_none()).collect();
    assert!(unplaced.is_empty(), "workspace crates the graph does not place (add them to ALLOWED and ARCHITECTURE.md): {unplaced:?}");
    let refused: Vec<String> = edges
        .iter()
        .filter(|(from, to, kind)| !edge_allowed(from, to, kind))
        .map(|(from, to, kind)| format!("{from} -> {to} ({kind})"))
        .collect();
    assert!(refused.is_empty(), "dependencies the crate graph does not allow:\n  {}", refused.join("\n  "));
    let pairs: Vec<(String, String)> = edges.into_iter().map(|(from, to, _)| (from, to)).collect();
    assert_eq!(find_cycle(&pairs), None, "workspace crates depend on each other in a circle");
}

/// `cargo run --release -- serve --dev`, the README's first command, needs exactly one binary
/// among the workspace's default members: `capstan`. Another crate's tool (`capstan-catalog`)
/// stays a member, tested by `cargo test --workspace`, but not a default member.
#[test]
fn the_default_members_build_one_binary_so_cargo_run_starts_capstan() {
    let metadata = metadata();
    let defaults: BTreeSet<&str> = metadata["workspace_default_members"]
        .as_array()
        .expect("cargo reports the default members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let binaries: Vec<String> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| defaults.contains(id)))
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k.as_str() == Some("bin"))))
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(binaries, ["capstan"], "binaries among the default members");
}
