//! The catalog publisher's path through the real binary: `capstan plugin keygen`, `capstan
//! appstore sign-catalog` from a directory of app definitions, `verify-catalog` with the right
//! key, another key, tampered files and against the catalog it should succeed — each refusal by
//! its code.

use crate::support::{Exited, capstan, run_to_exit};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const WIKI: &str = r#"
id = "wiki"
name = "Wiki"
description = "A small wiki."

[[versions]]
version = "1.0.0"
[versions.template]
image = "registry.example.com/wiki:1.0.0"
ports = [{ port = 8080, protocol = "http" }]
volumes = [{ name = "data", mountPath = "/var/lib/wiki" }]

[[versions]]
version = "1.1.0"
[versions.template]
image = "registry.example.com/wiki:1.1.0"
ports = [{ port = 8080, protocol = "http" }]
volumes = [{ name = "data", mountPath = "/var/lib/wiki" }]
capabilities = ["mail"]
[versions.template.environment]
LOG_LEVEL = "info"
"#;

const CHAT: &str = r#"
id = "chat"
name = "Chat"

[[versions]]
version = "2.0.0"
[versions.template]
image = "ghcr.io/acme/chat:2.0.0"
ports = [{ port = 5222, protocol = "tcp", publicPort = 5222 }]
"#;

fn cli(args: &[&str]) -> Exited {
    let mut cmd = capstan();
    cmd.args(args);
    run_to_exit(cmd)
}

fn ok(what: &str, exited: &Exited) {
    assert!(
        exited.status.success(),
        "{what} should succeed, got {:?}\nstdout:\n{}\nstderr:\n{}",
        exited.status,
        exited.stdout,
        exited.stderr
    );
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn keygen(path: &Path) -> String {
    let exited = cli(&["plugin", "keygen", "--output", p(path)]);
    ok("capstan plugin keygen", &exited);
    let key = exited.stdout.trim().to_string();
    assert!(key.starts_with("capstan-ed25519:"), "{key}");
    key
}

/// `path` with `from` replaced by `to` (once), written to `out`.
fn edited(path: &Path, out: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from:?} not in {text}");
    fs::write(out, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn a_publisher_signs_a_catalog_and_a_reader_verifies_it_or_refuses_it_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    fs::set_permissions(root, fs::Permissions::from_mode(0o700)).unwrap();
    let (key, other_key) = (root.join("catalog.pem"), root.join("other.pem"));
    let public = keygen(&key);
    let other = keygen(&other_key);
    let apps = root.join("apps");
    fs::create_dir(&apps).unwrap();
    fs::write(apps.join("wiki.toml"), WIKI).unwrap();
    fs::write(apps.join("chat.toml"), CHAT).unwrap();
    fs::write(apps.join("README.md"), "not a definition").unwrap();

    // ---- sign ----
    let first = root.join("catalog-1.json");
    let signed = cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "1", "--output", p(&first)]);
    ok("sign-catalog", &signed);
    let envelope: Value = serde_json::from_str(&fs::read_to_string(&first).unwrap()).unwrap();
    let digest = envelope["digest"].as_str().unwrap();
    for printed in [p(&first), "revision: 1", digest, public.as_str(), "2 (3 versions, 0 withdrawn)"] {
        assert!(signed.stdout.contains(printed), "sign-catalog prints {printed:?}:\n{}", signed.stdout);
    }
    assert_eq!((envelope["format"].as_str(), envelope["contract"].as_u64()), (Some("capstan-catalog"), Some(1)));
    assert_eq!(envelope["publicKey"].as_str(), Some(public.as_str()));
    assert_eq!(fs::metadata(&first).unwrap().permissions().mode() & 0o777, 0o644, "a catalog is public");

    // a revision is published once: the output is never replaced
    let again = cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "1", "--output", p(&first)]);
    again.assert_refused(1, "output-exists");

    // ---- verify ----
    let verified = cli(&["appstore", "verify-catalog", p(&first), "--trust", &other, "--trust", &public]);
    ok("verify-catalog with the signing key trusted", &verified);
    for shown in ["revision 1", digest, public.as_str(), "wiki", "Wiki", "1.1.0", "chat", "2.0.0"] {
        assert!(verified.stdout.contains(shown), "verify-catalog shows {shown:?}:\n{}", verified.stdout);
    }
    let as_json = cli(&["appstore", "verify-catalog", p(&first), "--trust", &public, "--json"]);
    ok("verify-catalog --json", &as_json);
    let answer: Value = serde_json::from_str(&as_json.stdout).unwrap();
    assert_eq!((answer["ok"].as_bool(), answer["revision"].as_u64(), answer["digest"].as_str()), (Some(true), Some(1), Some(digest)));
    let ids: Vec<_> = answer["apps"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["chat", "wiki"], "apps in file-name order");
    assert_eq!(answer["apps"][1]["newest"], "1.1.0");

    cli(&["appstore", "verify-catalog", p(&first), "--trust", &other]).assert_refused(1, "catalog-key-untrusted");
    let refused = cli(&["appstore", "verify-catalog", p(&first), "--trust", &other, "--json"]);
    let answer: Value = serde_json::from_str(&refused.stdout).unwrap();
    assert_eq!((answer["ok"].as_bool(), answer["error"]["code"].as_str()), (Some(false), Some("catalog-key-untrusted")));
    assert_eq!(answer["error"]["data"]["publicKey"].as_str(), Some(public.as_str()));

    // ---- tampered copies, each refused by name ----
    let tampered = root.join("tampered.json");
    edited(&first, &tampered, "\"revision\":1,", "\"revision\":2,");
    cli(&["appstore", "verify-catalog", p(&tampered), "--trust", &public]).assert_refused(1, "catalog-signature-invalid");
    let payload = envelope["payload"].as_str().unwrap();
    let flipped = if payload.starts_with('e') { payload.replacen('e', "f", 1) } else { format!("e{}", &payload[1..]) };
    edited(&first, &tampered, payload, &flipped);
    cli(&["appstore", "verify-catalog", p(&tampered), "--trust", &public]).assert_refused(1, "catalog-digest-mismatch");
    edited(&first, &tampered, "\"contract\":1,", "\"contract\":2,");
    cli(&["appstore", "verify-catalog", p(&tampered), "--trust", &public]).assert_refused(1, "catalog-contract-unsupported");
    let text = fs::read_to_string(&first).unwrap();
    fs::write(&tampered, &text[..text.len() / 2]).unwrap();
    cli(&["appstore", "verify-catalog", p(&tampered), "--trust", &public]).assert_refused(1, "catalog-malformed");
    cli(&["appstore", "verify-catalog", p(&first), "--trust", "capstan-ed25519:nope"]).assert_refused(1, "publisher-key-invalid");
    cli(&["appstore", "verify-catalog", p(&root.join("missing.json")), "--trust", &public]).assert_refused(1, "catalog-unreadable");

    // ---- succession: removing a published version is refused, withdrawing it is not ----
    let second = root.join("catalog-2.json");
    let without = WIKI.replacen(
        "version = \"1.0.0\"\n[versions.template]\nimage = \"registry.example.com/wiki:1.0.0\"",
        "version = \"1.2.0\"\n[versions.template]\nimage = \"registry.example.com/wiki:1.2.0\"",
        1,
    );
    fs::write(apps.join("wiki.toml"), &without).unwrap();
    ok(
        "sign revision 2",
        &cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "2", "--output", p(&second)]),
    );
    let refused = cli(&["appstore", "verify-catalog", p(&second), "--trust", &public, "--previous", p(&first)]);
    let stderr = refused.assert_refused(1, "catalog-version-removed");
    assert!(stderr.contains("wiki 1.0.0"), "the refusal names the app and version:\n{stderr}");

    let third = root.join("catalog-3.json");
    let withdrawn = WIKI.replacen("version = \"1.0.0\"\n", "version = \"1.0.0\"\nwithdrawn = { reason = \"data loss; use 1.1.0\" }\n", 1);
    fs::write(apps.join("wiki.toml"), &withdrawn).unwrap();
    let signed = cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "3", "--output", p(&third)]);
    ok("sign revision 3", &signed);
    assert!(signed.stdout.contains("1 withdrawn"), "{}", signed.stdout);
    let succeeded = cli(&["appstore", "verify-catalog", p(&third), "--trust", &public, "--previous", p(&first)]);
    ok("verify-catalog --previous", &succeeded);
    assert!(succeeded.stdout.contains("succeeds revision 1") && succeeded.stdout.contains("1.0.0 (withdrawn)"), "{}", succeeded.stdout);
    cli(&["appstore", "verify-catalog", p(&first), "--trust", &public, "--previous", p(&third)])
        .assert_refused(1, "catalog-revision-not-newer");
    let rewritten = root.join("catalog-4.json");
    fs::write(apps.join("wiki.toml"), withdrawn.replace("wiki:1.1.0", "wiki:1.1.1")).unwrap();
    ok(
        "sign revision 4",
        &cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "4", "--output", p(&rewritten)]),
    );
    cli(&["appstore", "verify-catalog", p(&rewritten), "--trust", &public, "--previous", p(&third)])
        .assert_refused(1, "catalog-version-rewritten");
    fs::write(apps.join("wiki.toml"), WIKI).unwrap();
    let reinstated = root.join("catalog-5.json");
    ok(
        "sign revision 5",
        &cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "5", "--output", p(&reinstated)]),
    );
    cli(&["appstore", "verify-catalog", p(&reinstated), "--trust", &public, "--previous", p(&third)])
        .assert_refused(1, "catalog-version-reinstated");

    // ---- a definition an install would refuse is refused at signing, naming file and field ----
    fs::write(apps.join("wiki.toml"), WIKI.replace("LOG_LEVEL = \"info\"", "DB_PASSWORD = \"hunter2\"")).unwrap();
    let refused =
        cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "6", "--output", p(&root.join("c6.json"))]);
    let stderr = refused.assert_refused(1, "app-definition-invalid");
    assert!(stderr.contains("wiki.toml") && stderr.contains("versions[1].template.environment.DB_PASSWORD"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "the value is never echoed:\n{stderr}");
    fs::write(apps.join("wiki.toml"), WIKI.replace("protocol = \"http\"", "protocol = \"sctp\"")).unwrap();
    let refused =
        cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "6", "--output", p(&root.join("c6.json"))]);
    let stderr = refused.assert_refused(1, "app-definition-invalid");
    assert!(stderr.contains("wiki.toml") && stderr.contains("sctp"), "{stderr}");
    assert!(!root.join("c6.json").exists(), "nothing is written for a refused catalog");
    // a key file that is not private is refused by the key reader
    fs::write(apps.join("wiki.toml"), WIKI).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let refused =
        cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "6", "--output", p(&root.join("c6.json"))]);
    refused.assert_refused(1, "input-permissions");
}
