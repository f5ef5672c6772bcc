//! Starts against a database whose migration ledger this build cannot carry forward.

use crate::support::{ProdConfig, insert_doc, read_ledger, run_to_exit};
use capstan::store::Document;
use serde_json::json;

/// A production config under a fresh temp dir whose store holds a ledger at `version`.
fn database_at(version: &str) -> (tempfile::TempDir, ProdConfig, Document) {
    let dir = tempfile::tempdir().unwrap();
    let prod = ProdConfig::under(dir.path());
    std::fs::create_dir_all(prod.database.parent().unwrap()).unwrap();
    let ledger = json!({"dataVersion": version, "lock": null, "running": null, "history": []});
    let doc = insert_doc(&prod.database, capstan::migrate::LEDGER_COLLECTION, "capstan", ledger);
    (dir, prod, doc)
}

fn refused_start(version: &str, code: &str) {
    let (_dir, prod, before) = database_at(version);
    let exited = run_to_exit(prod.command());
    let stderr = exited.assert_refused(1, code);
    assert!(stderr.contains(version), "the refusal should name the data version {version}; stderr:\n{stderr}");
    let after = read_ledger(&prod.database);
    assert_eq!(after.as_ref(), Some(&before), "a refused start must leave the ledger untouched (revision and data)");
}

#[test]
fn a_data_version_ahead_of_this_build_is_refused() {
    refused_start("99.0.0", "data-version-ahead");
}

#[test]
fn a_ledger_below_the_oldest_supported_version_is_refused_untouched() {
    let floor = capstan::migrate::host_chain().oldest_supported;
    assert_eq!(floor.to_string(), "0.1.0", "this test assumes the host floor is 0.1.0; pick a version below the new floor");
    refused_start("0.0.1", "ledger-below-oldest-supported-version");
}

#[test]
fn a_ledger_that_is_not_semver_is_refused() {
    refused_start("not-a-version", "ledger-invalid");
}
