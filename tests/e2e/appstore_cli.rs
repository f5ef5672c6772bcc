//! The App Store from the command line, through the real binary against a real dev host: `capstan
//! appstore status` before any catalog (the cause shown), `import` refusing a missing, an
//! oversized and a bad file by name and activating a catalog `sign-catalog` wrote (from a file
//! and from standard input), `apps`, `app`, `install`, `upgradeable` once revision 2 is imported,
//! `upgrade` refused without `--yes` on a non-terminal standard input (and declined on a
//! terminal), done with it, refused `conflict` on a stale revision — and every `--json` variant
//! one line of JSON.

use crate::support::*;
use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const WIKI_1: &str = r#"
id = "wiki"
name = "Wiki"
description = "A small wiki."

[[versions]]
version = "1.0.0"
notes = "first release"
[versions.template]
image = "registry.example.com/wiki:1.0.0"
ports = [{ port = 8080, protocol = "http" }]
volumes = [{ name = "data", mountPath = "/var/lib/wiki" }]
[versions.template.environment]
WIKI_VERSION = "1.0.0"
"#;

const WIKI_2_EXTRA: &str = r#"
[[versions]]
version = "1.1.0"
notes = "search is faster"
[versions.template]
image = "registry.example.com/wiki:1.1.0"
ports = [{ port = 8080, protocol = "http" }]
volumes = [{ name = "data", mountPath = "/var/lib/wiki" }]
[versions.template.environment]
WIKI_VERSION = "1.1.0"
WIKI_SEARCH = "on"
"#;

/// The App Store plugin once it is installed and loaded (the first start compiles it in the
/// background).
fn wait_for_appstore(server: &Capstan, admin: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let reply = server.call_as(admin, "plugins.get", &json!({ "id": "appstore" }));
        if reply.status == 200 && reply.json()["status"] == "running" {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the App Store was not installed within 120 s: {}", reply.body);
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The CLI as an administrator: `CAPSTAN_URL` and `CAPSTAN_TOKEN` set, its own config directory.
struct Cli {
    config: PathBuf,
    url: String,
    token: String,
}

impl Cli {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = capstan();
        cmd.args(args).env("XDG_CONFIG_HOME", &self.config).env("CAPSTAN_URL", &self.url).env("CAPSTAN_TOKEN", &self.token);
        cmd
    }

    fn run(&self, args: &[&str]) -> Exited {
        run_to_exit(self.command(args))
    }

    fn run_with_stdin(&self, args: &[&str], stdin: &Path) -> Exited {
        let mut cmd = self.command(args);
        cmd.stdin(fs::File::open(stdin).unwrap());
        run_to_exit(cmd)
    }

    fn text(&self, args: &[&str]) -> String {
        let exited = self.run(args);
        assert!(exited.status.success(), "capstan {}: {exited:?}", args.join(" "));
        exited.stdout
    }

    /// `--json` appended: success and exactly one line of JSON.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        parse_json(&all, &self.run(&all), true)
    }

    /// Exit 1 and `capstan: refused (<code>): …` on standard error.
    fn refused(&self, args: &[&str], code: &str) -> Exited {
        refused(args, self.run(args), code)
    }
}

fn parse_json(args: &[&str], exited: &Exited, success: bool) -> Value {
    assert_eq!(exited.status.success(), success, "capstan {}: {exited:?}", args.join(" "));
    assert_eq!(exited.stdout.lines().count(), 1, "--json prints one line: {exited:?}");
    serde_json::from_str(&exited.stdout).unwrap_or_else(|e| panic!("capstan {} printed no JSON ({e}): {}", args.join(" "), exited.stdout))
}

fn refused(args: &[&str], exited: Exited, code: &str) -> Exited {
    assert_eq!(exited.status.code(), Some(1), "capstan {} should be refused {code}: {exited:?}", args.join(" "));
    let line = format!("capstan: refused ({code}): ");
    assert!(exited.stderr.lines().any(|l| l.starts_with(&line)), "capstan {}: expected {line:?} on stderr: {exited:?}", args.join(" "));
    exited
}

fn contains_all(what: &str, text: &str, shown: &[&str]) {
    for s in shown {
        assert!(text.contains(s), "{what} shows {s:?}:\n{text}");
    }
}

/// Run `cmd` with a pseudo-terminal as standard input (so `isatty(0)` holds), `typed` already
/// waiting there as the answer.
fn run_on_terminal(mut cmd: Command, typed: &[u8]) -> Exited {
    use std::io::Write;
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors into the given integers; the name, termios
    // and winsize pointers may be null.
    let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(rc, 0, "openpty failed");
    // SAFETY: both descriptors were just opened by openpty and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut writer = fs::File::from(master);
    writer.write_all(typed).unwrap();
    cmd.stdin(Stdio::from(slave));
    let exited = run_to_exit(cmd);
    drop(writer);
    exited
}

#[test]
fn an_operator_drives_the_app_store_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::set_permissions(root, fs::Permissions::from_mode(0o700)).unwrap();
    let server = Capstan::dev(&root.join("data"));
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let admin = server.login("admin", &password);
    let ok = |method: &str, body: Value| server.call_as(&admin, method, &body).expect_json(200);
    wait_for_appstore(&server, &admin);
    let cli = Cli { config: root.join("config"), url: format!("http://{}", server.addr), token: admin.clone() };

    // every command says what it does
    for (command, says) in [
        ("status", "appstore.getCatalogStatus"),
        ("refresh", "appstore.refreshCatalog"),
        ("import", "appstore.importCatalog"),
        ("apps", "appstore.listApps"),
        ("app", "appstore.getAppConfig"),
        ("install", "appstore.install"),
        ("upgradeable", "appstore.listUpgradeable"),
        ("upgrade", "appstore.getUpgradePreview"),
    ] {
        let help = cli.text(&["appstore", command, "--help"]);
        contains_all(&format!("capstan appstore {command} --help"), &help, &[says, "--json", "--url"]);
    }

    // ---- before any catalog: the cause is shown ----
    let status = cli.text(&["appstore", "status"]);
    contains_all("status without a catalog", &status, &["none active", "unavailable:  catalog-not-loaded: ", "sources:      none"]);
    let status = cli.json(&["appstore", "status"]);
    assert_eq!((status["available"].as_bool(), status["unavailable"]["code"].as_str()), (Some(false), Some("catalog-not-loaded")));
    contains_all("apps without a catalog", &cli.text(&["appstore", "apps"]), &["no catalog is active (catalog-not-loaded)"]);
    cli.refused(&["appstore", "app", "wiki"], "appstore-catalog-unavailable");
    let refresh = cli.text(&["appstore", "refresh"]);
    contains_all("refresh without sources", &refresh, &["asked the catalog sources: no-sources", "none active"]);
    assert_eq!(cli.json(&["appstore", "refresh"])["loader"]["lastOutcome"], "no-sources");

    // ---- signed catalogs, revisions 1 and 2, by a key the host trusts ----
    let key = root.join("catalog.pem");
    let keygen = run_to_exit({
        let mut cmd = capstan();
        cmd.args(["plugin", "keygen", "--output", p(&key)]);
        cmd
    });
    assert!(keygen.status.success(), "capstan plugin keygen: {keygen:?}");
    let public = keygen.stdout.trim().to_string();
    let settings = ok("settings.get", json!({}));
    ok("settings.update", json!({ "expectedRevision": settings["revision"], "set": { "appStoreTrustedCatalogKeys": [public] } }));
    let sign = |revision: u64, definition: &str| {
        let apps = root.join(format!("apps-{revision}"));
        fs::create_dir(&apps).unwrap();
        fs::write(apps.join("wiki.toml"), definition).unwrap();
        let output = root.join(format!("catalog-{revision}.json"));
        let mut cmd = capstan();
        let revision = revision.to_string();
        cmd.args(["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", &revision, "--output", p(&output)]);
        let signed = run_to_exit(cmd);
        assert!(signed.status.success(), "sign-catalog: {signed:?}");
        output
    };
    let first = sign(1, WIKI_1);
    let second = sign(2, &format!("{WIKI_1}{WIKI_2_EXTRA}"));

    // ---- import: bad files refused by name, before or by the host ----
    let missing = root.join("no-such-catalog.json");
    let exited = cli.refused(&["appstore", "import", p(&missing)], "catalog-unreadable");
    assert!(exited.stderr.contains(p(&missing)), "the refusal names the file: {}", exited.stderr);
    let oversized = root.join("oversized.json");
    fs::write(&oversized, vec![b' '; capstan_catalog::MAX_ENVELOPE_BYTES + 1]).unwrap();
    let exited = cli.refused(&["appstore", "import", p(&oversized)], "catalog-malformed");
    assert!(exited.stderr.contains(p(&oversized)), "the refusal names the file: {}", exited.stderr);
    let garbage = root.join("garbage.json");
    fs::write(&garbage, "this is not an envelope").unwrap();
    cli.refused(&["appstore", "import", p(&garbage)], "catalog-malformed");
    let args = ["appstore", "import", p(&garbage), "--json"];
    let refusal = parse_json(&args, &cli.run(&args), false);
    assert_eq!((refusal["ok"].as_bool(), refusal["error"]["code"].as_str()), (Some(false), Some("catalog-malformed")));
    let mut tampered: Value = serde_json::from_str(&fs::read_to_string(&first).unwrap()).unwrap();
    tampered["revision"] = json!(5);
    let tampered_file = root.join("tampered.json");
    fs::write(&tampered_file, tampered.to_string()).unwrap();
    cli.refused(&["appstore", "import", p(&tampered_file)], "catalog-signature-invalid");
    contains_all("status after refusals", &cli.text(&["appstore", "status"]), &["none active"]);

    // ---- import revision 1, then again from standard input ----
    let imported = cli.text(&["appstore", "import", p(&first)]);
    contains_all("import", &imported, &["activated catalog revision 1", "revision 1 (1 apps)", &public, "source:       import"]);
    let args = ["appstore", "import", "-", "--json"];
    let again = parse_json(&args, &cli.run_with_stdin(&args, &first), true);
    assert_eq!((again["outcome"].as_str(), again["revision"].as_u64()), (Some("unchanged"), Some(1)));
    let status = cli.json(&["appstore", "status"]);
    assert_eq!((status["available"].as_bool(), status["active"]["revision"].as_u64()), (Some(true), Some(1)));
    contains_all("status", &cli.text(&["appstore", "status"]), &["revision 1", &public, "import"]);

    // ---- apps and one app ----
    let apps = cli.text(&["appstore", "apps"]);
    contains_all("apps", &apps, &["APP", "NEWEST", "OFFERED", "WITHDRAWN", "wiki", "Wiki", "1.0.0"]);
    let apps = cli.json(&["appstore", "apps"]);
    assert_eq!((apps["apps"][0]["id"].as_str(), apps["apps"][0]["newestVersion"].as_str()), (Some("wiki"), Some("1.0.0")));
    let app = cli.text(&["appstore", "app", "wiki"]);
    contains_all(
        "app",
        &app,
        &[
            "wiki (Wiki)",
            "1.0.0",
            "registry.example.com/wiki:1.0.0",
            "8080/http",
            "data at /var/lib/wiki",
            "WIKI_VERSION=1.0.0",
            "first release",
        ],
    );
    let config = cli.json(&["appstore", "app", "wiki", "--version", "1.0.0"]);
    assert_eq!((config["version"].as_str(), config["catalogRevision"].as_u64()), (Some("1.0.0"), Some(1)));
    cli.refused(&["appstore", "app", "wiki", "--version", "9.9.9"], "appstore-version-not-found");
    cli.refused(&["appstore", "app", "nope"], "appstore-app-not-found");

    // ---- install ----
    let org = ok("organizations.create", json!({ "name": "acme" }));
    let org_id = org["id"].as_str().unwrap();
    let installed = cli.text(&["appstore", "install", "wiki", "--organization", org_id, "--name", "team-wiki"]);
    contains_all("install", &installed, &["installed wiki 1.0.0 as service team-wiki (svc_"]);
    let team = ok("services.list", json!({ "organizationId": org_id }));
    let team_id = team["items"][0]["id"].as_str().unwrap().to_string();
    let other =
        cli.json(&["appstore", "install", "wiki", "--organization", org_id, "--name", "other-wiki", "--version", "1.0.0", "--scale", "2"]);
    let other_id = other["id"].as_str().unwrap().to_string();
    assert_eq!(ok("services.get", json!({ "id": other_id }))["scale"], 2);
    let stale = cli.json(&["appstore", "install", "wiki", "--organization", org_id, "--name", "stale-wiki"]);
    let stale_id = stale["id"].as_str().unwrap().to_string();
    cli.refused(&["appstore", "install", "wiki", "--organization", org_id, "--name", "team-wiki"], "exists");

    // ---- upgradeable: nothing at revision 1, every service at revision 2 ----
    let none = cli.text(&["appstore", "upgradeable", "--organization", org_id]);
    contains_all("upgradeable at revision 1", &none, &["no service of", "has a newer version offered"]);
    assert_eq!(cli.json(&["appstore", "upgradeable", "--organization", org_id]), json!([]));
    assert_eq!(cli.json(&["appstore", "import", p(&second)])["outcome"], "activated");
    let upgradeable = cli.text(&["appstore", "upgradeable", "--organization", org_id]);
    contains_all("upgradeable", &upgradeable, &["SERVICE", "AVAILABLE", &team_id, "team-wiki", "1.0.0", "1.1.0"]);
    let upgradeable = cli.json(&["appstore", "upgradeable", "--organization", org_id]);
    assert_eq!(upgradeable.as_array().unwrap().len(), 3, "{upgradeable}");
    let everywhere = cli.json(&["appstore", "upgradeable"]);
    assert_eq!(everywhere["organizations"][0]["id"].as_str(), Some(org_id), "{everywhere}");
    assert_eq!(everywhere["organizations"][0]["upgradeable"], upgradeable);
    contains_all("upgradeable everywhere", &cli.text(&["appstore", "upgradeable"]), &["ORGANIZATION", org_id, &team_id]);

    // ---- upgrade: the preview first; without --yes on a non-terminal stdin, refused ----
    let exited = cli.refused(&["appstore", "upgrade", &team_id], "confirmation-required");
    contains_all(
        "the preview before the refusal",
        &exited.stdout,
        &[
            &format!("upgrade {team_id} (wiki) from 1.0.0 to 1.1.0"),
            "registry.example.com/wiki:1.0.0 -> registry.example.com/wiki:1.1.0",
            "added WIKI_SEARCH; changed WIKI_VERSION",
            "1.1.0: search is faster",
        ],
    );
    let args = ["appstore", "upgrade", &team_id, "--json"];
    let refusal = parse_json(&args, &cli.run(&args), false);
    assert_eq!(refusal["error"]["code"], "confirmation-required");
    // a "no" typed on a terminal is no upgrade either
    let declined = run_on_terminal(cli.command(&["appstore", "upgrade", &team_id]), b"n\n");
    let declined = refused(&["appstore", "upgrade"], declined, "confirmation-declined");
    assert!(declined.stderr.contains("? [y/N]"), "asked on the terminal: {declined:?}");
    assert_eq!(ok("services.get", json!({ "id": team_id }))["image"], "registry.example.com/wiki:1.0.0", "nothing was upgraded");

    // with --yes: done, against the revision read before the preview
    let upgraded = cli.text(&["appstore", "upgrade", &team_id, "--yes"]);
    contains_all("upgrade --yes", &upgraded, &["from 1.0.0 to 1.1.0", &format!("upgraded {team_id} from 1.0.0 to 1.1.0")]);
    let service = ok("services.get", json!({ "id": team_id }));
    assert_eq!(
        (service["image"].as_str(), service["environment"]["WIKI_SEARCH"].as_str(), service["template"]["version"].as_str()),
        (Some("registry.example.com/wiki:1.1.0"), Some("on"), Some("1.1.0"))
    );
    cli.refused(&["appstore", "upgrade", &team_id, "--yes"], "appstore-up-to-date");

    // --json: standard output holds the answer alone, the preview goes to standard error
    let args = ["appstore", "upgrade", &other_id, "--yes", "--version", "1.1.0", "--organization", org_id, "--json"];
    let exited = cli.run(&args);
    let answer = parse_json(&args, &exited, true);
    assert_eq!((answer["id"].as_str(), answer["to"].as_str()), (Some(other_id.as_str()), Some("1.1.0")));
    assert!(exited.stderr.contains("from 1.0.0 to 1.1.0"), "{exited:?}");

    // a stated revision that is no longer current is refused `conflict`
    let before = ok("services.get", json!({ "id": stale_id }));
    let read = before["revision"].as_u64().unwrap().to_string();
    ok("services.update", json!({ "id": stale_id, "expectedRevision": before["revision"], "scale": 3 }));
    cli.refused(&["appstore", "upgrade", &stale_id, "--yes", "--expected-revision", &read], "conflict");
    assert_eq!(ok("services.get", json!({ "id": stale_id }))["image"], "registry.example.com/wiki:1.0.0");
}
