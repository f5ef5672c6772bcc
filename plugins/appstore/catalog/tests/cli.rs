//! The catalog publisher's path through the real `capstan-catalog` binary: `sign` from a
//! directory of app definitions with a key file as `capstan plugin keygen` writes it, `verify`
//! with the right key, another key, tampered files and against the catalog it should succeed —
//! each refusal by its code and exit status, with `--json` one line of JSON.

use capstan_publisher_key::files::{generate_key, write_key_file};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

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

/// How `capstan-catalog ARGS` ended.
struct Exited {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Exited {
    fn ok(&self, what: &str) -> &str {
        assert_eq!(self.code, Some(0), "{what} should succeed\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        &self.stdout
    }

    /// Exit 1 and `capstan-catalog: refused (<code>): …` on standard error; answers standard error.
    fn refused(&self, code: &str) -> &str {
        assert_eq!(self.code, Some(1), "expected refusal {code}\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        let line = format!("capstan-catalog: refused ({code}): ");
        assert!(self.stderr.lines().any(|l| l.starts_with(&line)), "expected a line starting {line:?}:\n{}", self.stderr);
        &self.stderr
    }

    /// Exactly one line of JSON on standard output.
    fn json(&self) -> Value {
        assert_eq!(self.stdout.lines().count(), 1, "--json prints one line: {}", self.stdout);
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("no JSON ({e}): {}", self.stdout))
    }
}

fn cli(args: &[&str]) -> Exited {
    let Output { status, stdout, stderr } = Command::new(env!("CARGO_BIN_EXE_capstan-catalog")).args(args).output().unwrap();
    Exited { code: status.code(), stdout: String::from_utf8(stdout).unwrap(), stderr: String::from_utf8(stderr).unwrap() }
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A key file as `capstan plugin keygen --out PATH` writes it; answers the public key.
fn keygen(path: &Path) -> String {
    write_key_file(path, &generate_key()).unwrap().to_string()
}

/// `path` with `from` replaced by `to` (once), written to `out`.
fn edited(path: &Path, out: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from:?} not in {text}");
    fs::write(out, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn every_command_says_what_it_does() {
    let help = cli(&["--help"]);
    for shown in ["sign", "verify", "offline", "appstore.trustedCatalogKeys", "appstore.importCatalog", "--set-file"] {
        assert!(help.ok("--help").contains(shown), "--help shows {shown:?}:\n{}", help.stdout);
    }
    let sign = cli(&["sign", "--help"]);
    for shown in ["--apps", "--key", "--revision", "--output", "--json", "app-definition-invalid", "output-exists"] {
        assert!(sign.ok("sign --help").contains(shown), "sign --help shows {shown:?}:\n{}", sign.stdout);
    }
    let verify = cli(&["verify", "--help"]);
    for shown in ["--trust", "--previous", "--json", "catalog-key-untrusted", "catalog-version-removed"] {
        assert!(verify.ok("verify --help").contains(shown), "verify --help shows {shown:?}:\n{}", verify.stdout);
    }
    // a usage mistake is clap's: exit 2, naming what is missing
    let missing = cli(&["verify", "catalog.json"]);
    assert_eq!(missing.code, Some(2), "{}", missing.stderr);
    assert!(missing.stderr.contains("--trust"), "{}", missing.stderr);
    assert_eq!(cli(&["publish"]).code, Some(2));
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
    let sign =
        |revision: &str, output: &Path| cli(&["sign", "--apps", p(&apps), "--key", p(&key), "--revision", revision, "--output", p(output)]);

    // ---- sign ----
    let first = root.join("catalog-1.json");
    let signed = sign("1", &first);
    let printed = signed.ok("sign").to_string();
    let envelope: Value = serde_json::from_str(&fs::read_to_string(&first).unwrap()).unwrap();
    let digest = envelope["digest"].as_str().unwrap();
    for shown in [p(&first), "revision: 1", digest, public.as_str(), "2 (3 versions, 0 withdrawn)"] {
        assert!(printed.contains(shown), "sign prints {shown:?}:\n{printed}");
    }
    assert_eq!((envelope["format"].as_str(), envelope["contract"].as_u64()), (Some("capstan-catalog"), Some(1)));
    assert_eq!(envelope["publicKey"].as_str(), Some(public.as_str()));
    assert_eq!(fs::metadata(&first).unwrap().permissions().mode() & 0o777, 0o644, "a catalog is public");

    // a revision is published once: the output is never replaced
    sign("1", &first).refused("output-exists");
    // the default output is catalog-<revision>.json in the current directory; --json says so
    let run_in_root = Command::new(env!("CARGO_BIN_EXE_capstan-catalog"))
        .args(["sign", "--apps", p(&apps), "--key", p(&key), "--revision", "9", "--json"])
        .current_dir(root)
        .output()
        .unwrap();
    assert!(run_in_root.status.success(), "{}", String::from_utf8_lossy(&run_in_root.stderr));
    let answer: Value = serde_json::from_slice(&run_in_root.stdout).unwrap();
    let default_output = root.canonicalize().unwrap().join("catalog-9.json");
    assert_eq!(
        (answer["ok"].as_bool(), answer["output"].as_str(), answer["revision"].as_u64(), answer["apps"].as_u64()),
        (Some(true), default_output.to_str(), Some(9), Some(2))
    );
    assert_eq!((answer["versions"].as_u64(), answer["withdrawn"].as_u64()), (Some(3), Some(0)));
    assert_eq!(answer["publicKey"].as_str(), Some(public.as_str()));
    assert!(default_output.is_file());

    // ---- verify ----
    let verified = cli(&["verify", p(&first), "--trust", &other, "--trust", &public]);
    for shown in ["revision 1", digest, public.as_str(), "APP", "wiki", "Wiki", "1.0.0, 1.1.0", "chat", "2.0.0"] {
        assert!(verified.ok("verify with the signing key trusted").contains(shown), "verify shows {shown:?}:\n{}", verified.stdout);
    }
    let answer = cli(&["verify", p(&first), "--trust", &public, "--json"]).json();
    assert_eq!((answer["ok"].as_bool(), answer["revision"].as_u64(), answer["digest"].as_str()), (Some(true), Some(1), Some(digest)));
    let ids: Vec<_> = answer["apps"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["chat", "wiki"], "apps in file-name order");
    assert_eq!(answer["apps"][1]["newest"], "1.1.0");
    assert_eq!(answer["succeeds"], Value::Null);

    cli(&["verify", p(&first), "--trust", &other]).refused("catalog-key-untrusted");
    let refused = cli(&["verify", p(&first), "--trust", &other, "--json"]);
    assert_eq!(refused.code, Some(1));
    let answer = refused.json();
    assert_eq!((answer["ok"].as_bool(), answer["error"]["code"].as_str()), (Some(false), Some("catalog-key-untrusted")));
    assert_eq!(answer["error"]["data"]["publicKey"].as_str(), Some(public.as_str()));

    // ---- tampered copies, each refused by name ----
    let tampered = root.join("tampered.json");
    edited(&first, &tampered, "\"revision\":1,", "\"revision\":2,");
    cli(&["verify", p(&tampered), "--trust", &public]).refused("catalog-signature-invalid");
    let payload = envelope["payload"].as_str().unwrap();
    let flipped = if payload.starts_with('e') { payload.replacen('e', "f", 1) } else { format!("e{}", &payload[1..]) };
    edited(&first, &tampered, payload, &flipped);
    cli(&["verify", p(&tampered), "--trust", &public]).refused("catalog-digest-mismatch");
    edited(&first, &tampered, "\"contract\":1,", "\"contract\":2,");
    cli(&["verify", p(&tampered), "--trust", &public]).refused("catalog-contract-unsupported");
    let text = fs::read_to_string(&first).unwrap();
    fs::write(&tampered, &text[..text.len() / 2]).unwrap();
    cli(&["verify", p(&tampered), "--trust", &public]).refused("catalog-malformed");
    fs::write(&tampered, vec![b' '; capstan_catalog::MAX_ENVELOPE_BYTES + 1]).unwrap();
    cli(&["verify", p(&tampered), "--trust", &public]).refused("catalog-malformed");
    cli(&["verify", p(&first), "--trust", "capstan-ed25519:nope"]).refused("publisher-key-invalid");
    let missing = root.join("missing.json");
    assert!(cli(&["verify", p(&missing), "--trust", &public]).refused("catalog-unreadable").contains(p(&missing)));
    cli(&["verify", p(root), "--trust", &public]).refused("catalog-unreadable");

    // ---- succession: removing a published version is refused, withdrawing it is not ----
    let second = root.join("catalog-2.json");
    let without = WIKI.replacen(
        "version = \"1.0.0\"\n[versions.template]\nimage = \"registry.example.com/wiki:1.0.0\"",
        "version = \"1.2.0\"\n[versions.template]\nimage = \"registry.example.com/wiki:1.2.0\"",
        1,
    );
    fs::write(apps.join("wiki.toml"), &without).unwrap();
    sign("2", &second).ok("sign revision 2");
    let refused = cli(&["verify", p(&second), "--trust", &public, "--previous", p(&first)]);
    assert!(refused.refused("catalog-version-removed").contains("wiki 1.0.0"), "the refusal names the app and version");

    let third = root.join("catalog-3.json");
    let withdrawn = WIKI.replacen("version = \"1.0.0\"\n", "version = \"1.0.0\"\nwithdrawn = { reason = \"data loss; use 1.1.0\" }\n", 1);
    fs::write(apps.join("wiki.toml"), &withdrawn).unwrap();
    assert!(sign("3", &third).ok("sign revision 3").contains("1 withdrawn"));
    let succeeded = cli(&["verify", p(&third), "--trust", &public, "--previous", p(&first)]);
    let shown = succeeded.ok("verify --previous");
    assert!(shown.contains("succeeds revision 1") && shown.contains("1.0.0 (withdrawn)"), "{shown}");
    let answer = cli(&["verify", p(&third), "--trust", &public, "--previous", p(&first), "--json"]).json();
    assert_eq!(answer["succeeds"]["revision"].as_u64(), Some(1));
    cli(&["verify", p(&first), "--trust", &public, "--previous", p(&third)]).refused("catalog-revision-not-newer");
    let refused = cli(&["verify", p(&third), "--trust", &other, "--previous", p(&first)]);
    refused.refused("catalog-key-untrusted");
    let rewritten = root.join("catalog-4.json");
    fs::write(apps.join("wiki.toml"), withdrawn.replace("wiki:1.1.0", "wiki:1.1.1")).unwrap();
    sign("4", &rewritten).ok("sign revision 4");
    cli(&["verify", p(&rewritten), "--trust", &public, "--previous", p(&third)]).refused("catalog-version-rewritten");
    fs::write(apps.join("wiki.toml"), WIKI).unwrap();
    let reinstated = root.join("catalog-5.json");
    sign("5", &reinstated).ok("sign revision 5");
    cli(&["verify", p(&reinstated), "--trust", &public, "--previous", p(&third)]).refused("catalog-version-reinstated");

    // ---- a definition an install would refuse is refused at signing, naming file and field ----
    let sixth = root.join("c6.json");
    fs::write(apps.join("wiki.toml"), WIKI.replace("LOG_LEVEL = \"info\"", "DB_PASSWORD = \"hunter2\"")).unwrap();
    let refused = sign("6", &sixth);
    let stderr = refused.refused("app-definition-invalid");
    assert!(stderr.contains("wiki.toml") && stderr.contains("versions[1].template.environment.DB_PASSWORD"), "{stderr}");
    assert!(stderr.contains("environment-value-is-secret") && !stderr.contains("hunter2"), "the rule, never the value:\n{stderr}");
    let args = ["sign", "--apps", p(&apps), "--key", p(&key), "--revision", "6", "--output", p(&sixth), "--json"];
    let answer = cli(&args).json();
    assert_eq!(
        (answer["error"]["code"].as_str(), answer["error"]["data"]["rule"].as_str()),
        (Some("app-definition-invalid"), Some("environment-value-is-secret"))
    );
    fs::write(apps.join("wiki.toml"), WIKI.replace("image = \"registry.example.com/wiki:1.1.0\"", "image = \"Registry/Wiki\"")).unwrap();
    assert!(sign("6", &sixth).refused("app-definition-invalid").contains("versions[1].template.image"));
    fs::write(apps.join("wiki.toml"), WIKI.replace("protocol = \"http\"", "protocol = \"sctp\"")).unwrap();
    let refused = sign("6", &sixth);
    let stderr = refused.refused("app-definition-invalid");
    assert!(stderr.contains("wiki.toml") && stderr.contains("sctp"), "{stderr}");
    cli(&["sign", "--apps", p(&root.join("no-apps")), "--key", p(&key), "--revision", "6", "--output", p(&sixth)])
        .refused("app-definitions-unreadable");
    assert!(!sixth.exists(), "nothing is written for a refused catalog");
    // a key file that is not private, or not a key, is refused by the key reader
    fs::write(apps.join("wiki.toml"), WIKI).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    sign("6", &sixth).refused("input-permissions");
    let not_a_key = root.join("not-a-key.pem");
    fs::write(&not_a_key, "not a key").unwrap();
    fs::set_permissions(&not_a_key, fs::Permissions::from_mode(0o600)).unwrap();
    cli(&["sign", "--apps", p(&apps), "--key", p(&not_a_key), "--revision", "6", "--output", p(&sixth)]).refused("key-file-invalid");
    assert!(!sixth.exists(), "nothing is written for a refused catalog");
}
