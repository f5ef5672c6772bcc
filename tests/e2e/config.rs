//! Configuration refusals and `--help`: what `capstan serve` says before it opens anything.

use crate::support::{capstan, run_to_exit};
use capstan::config::{BLOB_URL, DATABASE_URL, KEYRING_PATH, PUBLIC_ORIGIN, STATE_DIR, VARS};

/// The four of the host skeleton, and the node's state directory the fleet added.
const REQUIRED: [&str; 5] = [PUBLIC_ORIGIN, KEYRING_PATH, DATABASE_URL, BLOB_URL, STATE_DIR];

fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

#[test]
fn serve_without_dev_or_variables_is_refused_naming_all_four_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = capstan();
    cmd.arg("serve").current_dir(dir.path());
    let exited = run_to_exit(cmd);
    let stderr = exited.assert_refused(2, "config-missing");
    for var in REQUIRED {
        assert!(stderr.contains(var), "the refusal should name {var}; stderr:\n{stderr}");
    }
    assert_eq!(entries(dir.path()), Vec::<String>::new(), "a refused start must not write to the current directory");
}

#[test]
fn serve_missing_some_variables_names_exactly_those() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = capstan();
    cmd.arg("serve")
        .current_dir(dir.path())
        .env(KEYRING_PATH, dir.path().join("keyring.json"))
        .env(BLOB_URL, format!("file:{}", dir.path().join("blobs").display()));
    let exited = run_to_exit(cmd);
    let stderr = exited.assert_refused(2, "config-missing");
    for var in [PUBLIC_ORIGIN, DATABASE_URL, STATE_DIR] {
        assert!(stderr.contains(var), "the refusal should name the missing {var}; stderr:\n{stderr}");
    }
    for var in [KEYRING_PATH, BLOB_URL] {
        assert!(!stderr.contains(var), "the refusal should not name {var}, which was set; stderr:\n{stderr}");
    }
    assert_eq!(entries(dir.path()), Vec::<String>::new(), "a refused start must not create the blob directory or anything else");
}

#[test]
fn an_unknown_config_file_key_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("capstan.toml");
    std::fs::write(&file, "databse_url = \"sqlite:/nowhere\"\n").unwrap();
    let mut cmd = capstan();
    cmd.arg("serve").arg("--config").arg(&file).current_dir(dir.path());
    let exited = run_to_exit(cmd);
    let stderr = exited.assert_refused(2, "config-invalid");
    assert!(stderr.contains("databse_url"), "the refusal should name the unknown key; stderr:\n{stderr}");
}

#[test]
fn data_dir_without_dev_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = capstan();
    cmd.args(["serve", "--data-dir"]).arg(dir.path().join("data")).current_dir(dir.path());
    let exited = run_to_exit(cmd);
    assert_eq!(exited.status.code(), Some(2), "--data-dir requires --dev; got {:?}, stderr:\n{}", exited.status, exited.stderr);
    assert!(exited.stderr.contains("--dev"), "the usage error should mention --dev; stderr:\n{}", exited.stderr);
    assert!(!dir.path().join("data").exists(), "nothing is created on a usage error");
}

/// Collapse every run of whitespace into one space, so help text wrapped to the terminal width
/// still matches.
fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The variables section of `serve --help`: each `  CAPSTAN_X` heading with the text under it.
fn var_sections(help: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let heading = line.strip_prefix("  ").filter(|rest| rest.starts_with("CAPSTAN_") && !rest.contains(' '));
        match (heading, sections.last_mut()) {
            (Some(var), _) => sections.push((var.to_string(), String::new())),
            (None, Some((_, body))) if line.starts_with("    ") => body.push_str(&format!("{line}\n")),
            _ => {}
        }
    }
    sections.into_iter().map(|(var, body)| (var, squash(&body))).collect()
}

#[test]
fn serve_help_lists_every_variable_with_its_default() {
    let mut cmd = capstan();
    cmd.args(["serve", "--help"]);
    let exited = run_to_exit(cmd);
    assert!(exited.status.success(), "serve --help should exit 0, got {:?}; stderr:\n{}", exited.status, exited.stderr);
    let sections = var_sections(&exited.stdout);
    for var in VARS {
        let Some((_, body)) = sections.iter().find(|(name, _)| name == var.env) else {
            panic!("serve --help should have a section for {}; stdout:\n{}", var.env, exited.stdout);
        };
        let default = format!("default: {}]", squash(var.default));
        assert!(body.contains(&default), "serve --help should give {} the default {default:?}; its section says {body:?}", var.env);
    }
}
