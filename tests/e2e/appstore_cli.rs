//! The App Store from the command line, through the real binary against a real dev host: every
//! `appstore.*` method through `capstan call` (the host carries no App Store command). The
//! status before any catalog (the cause shown); `importCatalog` with `--set-file` refusing a
//! missing, an oversized and a bad envelope by name and activating a signed one (from a file and
//! from standard input); `listApps`, `getAppConfig`, `install`, `listUpgradeable` once revision 2
//! is imported (a table); `getUpgradePreview`, then `upgrade` stating the revision read, refused
//! `conflict` on a stale one — and every `--json` variant one line of JSON, exactly the answer.

use crate::appstore::{envelope, wait_for_appstore};
use crate::support::*;
use capstan_catalog::{PublisherKey, SigningKey};
use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `capstan call` as an administrator: `CAPSTAN_URL` and `CAPSTAN_TOKEN` set, its own config
/// directory.
struct Cli {
    config: PathBuf,
    url: String,
    token: String,
}

impl Cli {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = capstan();
        cmd.arg("call").args(args).env("XDG_CONFIG_HOME", &self.config).env("CAPSTAN_URL", &self.url).env("CAPSTAN_TOKEN", &self.token);
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

    /// Success; what it printed for people.
    fn text(&self, args: &[&str]) -> String {
        let exited = self.run(args);
        assert!(exited.status.success(), "capstan call {}: {exited:?}", args.join(" "));
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
        let exited = self.run(args);
        exited.assert_refused(1, code);
        exited
    }
}

fn parse_json(args: &[&str], exited: &Exited, success: bool) -> Value {
    assert_eq!(exited.status.success(), success, "capstan call {}: {exited:?}", args.join(" "));
    assert_eq!(exited.stdout.lines().count(), 1, "--json prints one line: {exited:?}");
    serde_json::from_str(&exited.stdout)
        .unwrap_or_else(|e| panic!("capstan call {} printed no JSON ({e}): {}", args.join(" "), exited.stdout))
}

fn contains_all(what: &str, text: &str, shown: &[&str]) {
    for s in shown {
        assert!(text.contains(s), "{what} shows {s:?}:\n{text}");
    }
}

/// A catalog of `wiki` at `versions`, signed by `key` at `revision`, written where a publisher
/// would write it.
fn wiki_catalog(root: &Path, revision: u64, versions: &[&str], key: &SigningKey) -> PathBuf {
    let path = root.join(format!("catalog-{revision}.json"));
    fs::write(&path, format!("{}\n", envelope(versions, revision, key))).unwrap();
    path
}

#[test]
fn an_operator_drives_the_app_store_with_capstan_call() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::set_permissions(root, fs::Permissions::from_mode(0o700)).unwrap();
    let server = Capstan::dev(&root.join("data"));
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let admin = server.login("admin", &password);
    let ok = |method: &str, body: Value| server.call_as(&admin, method, &body).expect_json(200);
    wait_for_appstore(&server, &admin);
    let cli = Cli { config: root.join("config"), url: format!("http://{}", server.addr), token: admin.clone() };

    // every method says what it takes, from the plugin's own schemas
    for (method, access, fields) in [
        ("appstore.getCatalogStatus", "(authenticated)", &[][..]),
        ("appstore.refreshCatalog", "(admin)", &[]),
        ("appstore.importCatalog", "(admin)", &["envelope", "required"]),
        ("appstore.listApps", "(authenticated)", &[]),
        ("appstore.getAppConfig", "(authenticated)", &["appId", "version"]),
        ("appstore.install", "(owner)", &["organizationId", "appId", "name", "domains", "scale"]),
        ("appstore.listUpgradeable", "(member)", &["organizationId"]),
        ("appstore.getUpgradePreview", "(member)", &["serviceId", "version"]),
        ("appstore.upgrade", "(owner)", &["serviceId", "expectedRevision"]),
    ] {
        let help = cli.text(&[method, "--help"]);
        assert!(help.starts_with(&format!("{method}  {access}")), "{method} --help:\n{help}");
        contains_all(&format!("{method} --help"), &help, fields);
    }

    // ---- before any catalog: the cause is shown ----
    let status = cli.text(&["appstore.getCatalogStatus"]);
    contains_all("status without a catalog", &status, &["\"available\": false", "\"code\": \"catalog-not-loaded\"", "\"sources\": []"]);
    let status = cli.json(&["appstore.getCatalogStatus"]);
    assert_eq!(status, ok("appstore.getCatalogStatus", json!({})), "--json prints the answer exactly");
    assert_eq!((status["available"].as_bool(), status["unavailable"]["code"].as_str()), (Some(false), Some("catalog-not-loaded")));
    let apps = cli.json(&["appstore.listApps"]);
    assert_eq!((apps["apps"].clone(), apps["status"]["unavailable"]["code"].as_str()), (json!([]), Some("catalog-not-loaded")));
    cli.refused(&["appstore.getAppConfig", "--set", "appId=wiki"], "appstore-catalog-unavailable");
    let args = ["appstore.getAppConfig", "--set", "appId=wiki", "--json"];
    let refusal = parse_json(&args, &cli.run(&args), false);
    assert_eq!(
        (refusal["error"]["code"].as_str(), refusal["error"]["retryable"].as_bool(), refusal["error"]["data"]["cause"].as_str()),
        (Some("appstore-catalog-unavailable"), Some(true), Some("catalog-not-loaded"))
    );
    let refresh = cli.text(&["appstore.refreshCatalog"]);
    contains_all("refresh without sources", &refresh, &["\"lastOutcome\": \"no-sources\"", "\"available\": false"]);
    assert_eq!(cli.json(&["appstore.refreshCatalog"])["loader"]["lastOutcome"], "no-sources");

    // ---- signed catalogs, revisions 1 and 2, by a key the host trusts ----
    let publisher = SigningKey::from_bytes(&[42; 32]);
    let public = PublisherKey::from(&publisher).to_string();
    let settings = ok("settings.get", json!({}));
    ok("settings.update", json!({ "expectedRevision": settings["revision"], "set": { "appstore.trustedCatalogKeys": [public] } }));
    let first = wiki_catalog(root, 1, &["1.0.0"], &publisher);
    let second = wiki_catalog(root, 2, &["1.0.0", "1.1.0"], &publisher);

    // ---- import: bad files refused by name, before or by the host ----
    let import = |file: &Path| format!("envelope={}", p(file));
    let missing = root.join("no-such-catalog.json");
    let exited = cli.refused(&["appstore.importCatalog", "--set-file", &import(&missing)], "body-unreadable");
    assert!(exited.stderr.contains(p(&missing)), "the refusal names the file: {}", exited.stderr);
    let oversized = root.join("oversized.json");
    fs::write(&oversized, vec![b' '; 2 * 1024 * 1024]).unwrap();
    cli.refused(&["appstore.importCatalog", "--set-file", &import(&oversized)], "request-too-large");
    let garbage = root.join("garbage.json");
    fs::write(&garbage, "this is not an envelope").unwrap();
    cli.refused(&["appstore.importCatalog", "--set-file", &import(&garbage)], "catalog-malformed");
    let args = ["appstore.importCatalog", "--set-file", &import(&garbage), "--json"];
    let refusal = parse_json(&args, &cli.run(&args), false);
    assert_eq!((refusal["ok"].as_bool(), refusal["error"]["code"].as_str()), (Some(false), Some("catalog-malformed")));
    let mut tampered: Value = serde_json::from_str(&fs::read_to_string(&first).unwrap()).unwrap();
    tampered["revision"] = json!(5);
    let tampered_file = root.join("tampered.json");
    fs::write(&tampered_file, tampered.to_string()).unwrap();
    cli.refused(&["appstore.importCatalog", "--set-file", &import(&tampered_file)], "catalog-signature-invalid");
    // the envelope itself as the body is not what the method takes
    cli.refused(&["appstore.importCatalog", "-f", p(&first)], "invalid-request");
    assert_eq!(cli.json(&["appstore.getCatalogStatus"])["available"], false, "nothing refused was activated");

    // ---- import revision 1, then again from standard input ----
    let imported = cli.text(&["appstore.importCatalog", "--set-file", &import(&first)]);
    contains_all("import", &imported, &["\"outcome\": \"activated\"", "\"revision\": 1", &public, "\"source\": \"import\""]);
    let args = ["appstore.importCatalog", "--set-file", "envelope=-", "--json"];
    let again = parse_json(&args, &cli.run_with_stdin(&args, &first), true);
    assert_eq!((again["outcome"].as_str(), again["revision"].as_u64()), (Some("unchanged"), Some(1)));
    let status = cli.json(&["appstore.getCatalogStatus"]);
    assert_eq!(
        (status["available"].as_bool(), status["active"]["revision"].as_u64(), status["active"]["signer"].as_str()),
        (Some(true), Some(1), Some(public.as_str()))
    );

    // ---- apps and one app ----
    let apps = cli.text(&["appstore.listApps"]);
    contains_all("apps", &apps, &["\"id\": \"wiki\"", "\"name\": \"Wiki\"", "\"newestVersion\": \"1.0.0\""]);
    let apps = cli.json(&["appstore.listApps"]);
    assert_eq!(apps, ok("appstore.listApps", json!({})));
    assert_eq!((apps["apps"][0]["id"].as_str(), apps["apps"][0]["newestVersion"].as_str()), (Some("wiki"), Some("1.0.0")));
    let app = cli.text(&["appstore.getAppConfig", "--set", "appId=wiki"]);
    contains_all(
        "app",
        &app,
        &["\"appId\": \"wiki\"", "\"version\": \"1.0.0\"", "registry.example.com/wiki:1.0.0", "/var/lib/wiki", "WIKI_VERSION"],
    );
    let config = cli.json(&["appstore.getAppConfig", "--set", "appId=wiki", "--set", "version=1.0.0"]);
    assert_eq!((config["version"].as_str(), config["catalogRevision"].as_u64()), (Some("1.0.0"), Some(1)));
    cli.refused(&["appstore.getAppConfig", "--set", "appId=wiki", "--set", "version=9.9.9"], "appstore-version-not-found");
    cli.refused(&["appstore.getAppConfig", "--set", "appId=nope"], "appstore-app-not-found");

    // ---- install ----
    let org = ok("organizations.create", json!({ "name": "acme" }));
    let org_id = org["id"].as_str().unwrap();
    let organization = format!("organizationId={org_id}");
    let installed = cli.text(&["appstore.install", "--set", &organization, "--set", "appId=wiki", "--set", "name=team-wiki"]);
    contains_all("install", &installed, &["\"id\": \"svc_", "\"appId\": \"wiki\"", "\"version\": \"1.0.0\""]);
    let team = ok("services.list", json!({ "organizationId": org_id }));
    let team_id = team["items"][0]["id"].as_str().unwrap().to_string();
    let install = |name: &str, more: &[&str]| {
        let name = format!("name={name}");
        let mut args = vec!["appstore.install", "--set", &organization, "--set", "appId=wiki", "--set", &name];
        args.extend(more);
        cli.json(&args)["id"].as_str().unwrap().to_string()
    };
    let other_id = install("other-wiki", &["--set", "version=1.0.0", "--set", "scale=2", "--set", "domains=[\"wiki.example.com\"]"]);
    let other = ok("services.get", json!({ "id": other_id }));
    assert_eq!((other["scale"].clone(), other["domains"].clone()), (json!(2), json!(["wiki.example.com"])));
    let stale_id = install("stale-wiki", &[]);
    cli.refused(&["appstore.install", "--set", &organization, "--set", "appId=wiki", "--set", "name=team-wiki"], "exists");

    // ---- upgradeable: nothing at revision 1, every service at revision 2, as a table ----
    assert_eq!(cli.text(&["appstore.listUpgradeable", "--set", &organization]).trim(), "(none)");
    assert_eq!(cli.json(&["appstore.listUpgradeable", "--set", &organization]), json!([]));
    assert_eq!(cli.json(&["appstore.importCatalog", "--set-file", &import(&second)])["outcome"], "activated");
    let upgradeable = cli.text(&["appstore.listUpgradeable", "--set", &organization]);
    let header = upgradeable.lines().next().unwrap_or_default();
    assert!(header.starts_with("NAME") && header.contains("SERVICEID") && header.contains("CURRENTVERSION"), "a table: {upgradeable}");
    assert_eq!(upgradeable.lines().count(), 4, "a header and three services: {upgradeable}");
    contains_all("upgradeable", &upgradeable, &[&team_id, "team-wiki", "wiki", "1.0.0"]);
    let upgradeable = cli.json(&["appstore.listUpgradeable", "--set", &organization]);
    assert_eq!(upgradeable.as_array().unwrap().len(), 3, "{upgradeable}");
    assert!(upgradeable.as_array().unwrap().iter().all(|u| u["available"] == json!(["1.1.0"])), "{upgradeable}");

    // ---- upgrade: the preview, then the upgrade stating the revision read before it ----
    let service = format!("serviceId={team_id}");
    let read = ok("services.get", json!({ "id": team_id }))["revision"].as_u64().unwrap();
    let preview = cli.text(&["appstore.getUpgradePreview", "--set", &organization, "--set", &service]);
    contains_all(
        "the preview",
        &preview,
        &["\"from\": \"1.0.0\"", "\"to\": \"1.1.0\"", "registry.example.com/wiki:1.1.0", "\"environmentChanged\": [\n    \"WIKI_VERSION\""],
    );
    let preview = cli.json(&["appstore.getUpgradePreview", "--set", &organization, "--set", &service]);
    assert_eq!((preview["environmentAdded"].clone(), preview["environmentChanged"].clone()), (json!([]), json!(["WIKI_VERSION"])));
    assert_eq!(ok("services.get", json!({ "id": team_id }))["image"], "registry.example.com/wiki:1.0.0", "a preview changes nothing");
    let expected = format!("expectedRevision={read}");
    let upgrade = ["appstore.upgrade", "--set", &organization, "--set", &service, "--set", "version=1.1.0", "--set", &expected];
    let upgraded = cli.json(&upgrade);
    assert_eq!((upgraded["id"].as_str(), upgraded["to"].as_str()), (Some(team_id.as_str()), Some("1.1.0")), "{upgraded}");
    let service = ok("services.get", json!({ "id": team_id }));
    assert_eq!(
        (service["image"].as_str(), service["environment"]["WIKI_VERSION"].as_str(), service["template"]["version"].as_str()),
        (Some("registry.example.com/wiki:1.1.0"), Some("1.1.0"), Some("1.1.0"))
    );
    let upgrade = |id: &str| {
        let revision = ok("services.get", json!({ "id": id }))["revision"].clone();
        let (service, expected) = (format!("serviceId={id}"), format!("expectedRevision={revision}"));
        cli.run(&["appstore.upgrade", "--set", &organization, "--set", &service, "--set", &expected])
    };
    upgrade(&team_id).assert_refused(1, "appstore-up-to-date");
    // without a version: the newest offered
    let upgraded = upgrade(&other_id);
    assert!(upgraded.status.success(), "{upgraded:?}");
    contains_all("upgrade to the newest", &upgraded.stdout, &["\"from\": \"1.0.0\"", "\"to\": \"1.1.0\""]);
    // an upgrade states the revision it read
    let stale_service = format!("serviceId={stale_id}");
    cli.refused(&["appstore.upgrade", "--set", &organization, "--set", &stale_service], "invalid-request");

    // a stated revision that is no longer current is refused `conflict`
    let before = ok("services.get", json!({ "id": stale_id }));
    ok("services.update", json!({ "id": stale_id, "expectedRevision": before["revision"], "scale": 3 }));
    let stale = [format!("serviceId={stale_id}"), format!("expectedRevision={}", before["revision"])];
    cli.refused(&["appstore.upgrade", "--set", &organization, "--set", &stale[0], "--set", &stale[1]], "conflict");
    assert_eq!(ok("services.get", json!({ "id": stale_id }))["image"], "registry.example.com/wiki:1.0.0");
}
