//! `capstan plugin dev [DIR] [--watch]`: the plugin author's loop against a development host.
//!
//! One command from a crate to a running manager: it builds the crate, signs the bundle with the
//! author's own dev key (created on first use), trusts that key on the host, and installs the
//! plugin or upgrades it; with `--watch` it does it again on every change under DIR. Each build
//! is given a development version above the manifest's (`0.1.0` → `0.1.1-dev.N`, N one more than
//! the host has seen), so an upgrade never needs a hand-edited version, and a real release of the
//! next version still sorts above every dev build.
//!
//! It refuses `dev-host-required` unless the host says it runs with `serve --dev` (the `dev`
//! field `system.getVersion` answers administrators), before it creates a key, trusts anything or
//! builds: on any other host, trust a key and install with `plugin trust` and `plugin install`.
//!
//! The host is `--url` (else `CAPSTAN_URL`, else `http://127.0.0.1:8080`); the session is the one
//! every client command uses (`CAPSTAN_TOKEN`, else the token `capstan login` stored for that
//! URL). On a terminal, a missing or ended session, or one too old to trust a key
//! (`admin-not-fresh`), is renewed by asking for the password as `capstan login` does.
//!
//! The dev key is `$XDG_CONFIG_HOME/capstan/dev-publisher.pem` (else
//! `~/.config/capstan/dev-publisher.pem`), beside the stored sessions: a PKCS#8 PEM file written
//! mode 0600 in a directory only you can write, and read under the private-file rules (a key
//! others can read, or one in a directory others can write, is refused, never used).

use super::client::{self, Client, Connection, Credentials, DEFAULT_URL, credentials_path, print_json, text};
use super::plugin::{compile, read_manifest, write_atomically};
use crate::plugins::bundle::{self, PublisherKey};
use crate::plugins::manifest::{ALL_REQUESTED, MANIFEST_FILE, Manifest};
use crate::refusal::{Refusal, Result};
use ed25519_dalek::SigningKey;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fs::{self, DirBuilder};
use std::io::IsTerminal;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The dev key's file name, beside the stored sessions.
pub const DEV_KEY_FILE: &str = "dev-publisher.pem";
/// How often `--watch` looks at the crate's files.
const POLL: Duration = Duration::from_millis(400);
/// How long the files must stay unchanged before a rebuild (an editor writes in several steps).
const SETTLE: Duration = Duration::from_millis(300);
/// Where in the crate the last dev bundle is kept (beside cargo's own output, which the
/// scaffold's .gitignore leaves out).
const BUNDLE_DIR: &str = "target/capstan-dev";

#[derive(clap::Args)]
pub struct DevArgs {
    /// The plugin crate directory (with capstan-plugin.toml and Cargo.toml)
    #[arg(value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// Keep watching DIR: rebuild and upgrade on every change, until interrupted (Ctrl-C)
    #[arg(long)]
    watch: bool,
    /// Sign with this private key file instead of your dev key
    /// ($XDG_CONFIG_HOME/capstan/dev-publisher.pem, created on first use)
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    #[command(flatten)]
    connection: Connection,
    /// Print one line of JSON per build instead of text
    #[arg(long)]
    json: bool,
}

pub fn run(args: &DevArgs) -> (Result<()>, bool) {
    (dev(args), args.json)
}

fn dev(args: &DevArgs) -> Result<()> {
    let dir = std::path::absolute(&args.dir)
        .map_err(|e| Refusal::new("build-failed", format!("cannot resolve {}: {}", args.dir.display(), e.kind())))?;
    // a crate that is not a plugin is refused before the host is asked anything
    read_manifest(&dir)?;
    let mut session = Session::open(&args.connection)?;
    let whoami = session.call("auth.whoami", &json!({}))?;
    if !(whoami["admin"] == true && whoami["kind"] == "human") {
        return Err(Refusal::new(
            "admin-required",
            format!(
                "plugin dev trusts a key and installs plugins, which administrators do; {} is not one: log in as an administrator (`capstan login --url {}`)",
                text(&whoami, "username"),
                session.client.url()
            ),
        ));
    }
    require_dev_host(&session.call("system.getVersion", &json!({}))?, session.client.url())?;

    let key = match &args.key {
        Some(path) => {
            let signing = bundle::read_key_file(path)?;
            DevKey { public: PublisherKey::from(&signing), signing, path: path.clone(), created: false }
        }
        None => DevKey::load_or_create(&dev_key_path()?)?,
    };
    if key.created {
        eprintln!("created your dev key {} (mode 0600): {} ({})", key.path.display(), key.public, key.public.fingerprint());
    }
    if ensure_trusted(&mut session, &key)? {
        eprintln!(
            "trusted your dev key on {} as {:?} (a dev host: plugin dev trusts nothing elsewhere)",
            session.client.url(),
            dev_key_name()
        );
    }
    if !args.watch {
        return round(&mut session, &dir, &key, args.json);
    }
    let mut seen = snapshot(&dir);
    if let Err(refusal) = round(&mut session, &dir, &key, args.json) {
        report(&refusal, args.json);
    }
    loop {
        eprintln!("watching {} for changes (Ctrl-C to stop)", dir.display());
        let changed = wait_for_change(&dir, &mut seen);
        eprintln!("changed: {}", changed.display());
        if let Err(refusal) = round(&mut session, &dir, &key, args.json) {
            report(&refusal, args.json);
        }
    }
}

/// A refusal in `--watch` mode: said, and the watch goes on.
fn report(refusal: &Refusal, json: bool) {
    if json {
        print_json(&json!({ "ok": false, "error": refusal }));
    } else {
        let _ = super::refuse(refusal, 1);
    }
}

/// Refuse `dev-host-required` unless `version` (what `system.getVersion` answered an
/// administrator) says the host runs with `serve --dev`.
pub fn require_dev_host(version: &Value, url: &str) -> Result<()> {
    let why = match version["dev"].as_bool() {
        Some(true) => return Ok(()),
        Some(false) => format!("{url} was not started with `serve --dev`"),
        None => {
            format!("{url} does not say it runs with `serve --dev` (it tells administrators; a Capstan older than `plugin dev` never does)")
        }
    };
    Err(Refusal::new(
        "dev-host-required",
        format!(
            "{why}. plugin dev trusts your own dev key and installs whatever you build, so it works on a dev host only; \
             on this host, build with `capstan plugin build --key FILE`, trust that key with `capstan plugin trust` and \
             install with `capstan plugin install`"
        ),
    )
    .with_data(json!({ "url": url, "dev": version.get("dev") })))
}

// ---- the session ----

/// A client with an administrator's session, renewed on a terminal when it ends.
struct Session {
    connection: Connection,
    client: Client,
}

impl Session {
    fn open(connection: &Connection) -> Result<Session> {
        let mut session = Session { connection: connection.clone(), client: Client::new(connection)? };
        if !session.client.has_token() {
            let url = session.client.url().to_string();
            let missing = Refusal::new(
                "unauthenticated",
                format!(
                    "not logged in to {url}: run `capstan login --url {url}` as an administrator (or set {}), then plugin dev again",
                    client::TOKEN_ENV
                ),
            );
            session.log_in_again(missing)?;
        }
        Ok(session)
    }

    /// Whether a new login can be asked for here: on a terminal, with no CAPSTAN_TOKEN to
    /// override what it would store.
    fn can_ask(&self) -> bool {
        std::io::stdin().is_terminal() && !self.client.token_from_env()
    }

    /// Ask for the password as `capstan login` does and keep the new session; `why` when that
    /// cannot be done here.
    fn log_in_again(&mut self, why: Refusal) -> Result<()> {
        if !self.can_ask() {
            return Err(why);
        }
        eprintln!("{}", why.message);
        eprintln!("log in to {} as an administrator:", self.client.url());
        let mut credentials = Credentials::load(&credentials_path()?)?;
        let (username, password) = client::ask_on_terminal(&self.client, None)?;
        client::log_in(&self.client, &mut credentials, &username, &password)?;
        self.client = Client::new(&self.connection)?;
        Ok(())
    }

    /// `method` with `body`; on a terminal, a session that ended or is too old for the method is
    /// renewed once and the call made again.
    fn call(&mut self, method: &str, body: &Value) -> Result<Value> {
        match self.client.call(method, body) {
            Err(refusal) if (refusal.is("unauthenticated") || refusal.is("admin-not-fresh")) && self.can_ask() => {
                self.log_in_again(refusal)?;
                self.client.call(method, body)
            }
            Err(mut refusal) if refusal.is("admin-not-fresh") => {
                let url = self.client.url();
                refusal.message = format!("{} (run `capstan login --url {url}` and plugin dev again)", refusal.message);
                Err(refusal)
            }
            other => other,
        }
    }
}

// ---- the dev key ----

/// `$XDG_CONFIG_HOME/capstan/dev-publisher.pem`, else `~/.config/capstan/dev-publisher.pem`.
pub fn dev_key_path() -> Result<PathBuf> {
    Ok(credentials_path()?.with_file_name(DEV_KEY_FILE))
}

/// The key `plugin dev` signs with.
pub struct DevKey {
    pub signing: SigningKey,
    pub public: PublisherKey,
    pub path: PathBuf,
    /// Whether this run created it.
    pub created: bool,
}

impl DevKey {
    /// The key at `path`, created on first use: a new file, mode 0600, in a directory only you
    /// can write (created mode 0700 when missing; `output-directory-not-private` when another
    /// may write it). An existing key is read under the private-file rules: one others can read
    /// is refused (`input-permissions`), never used.
    pub fn load_or_create(path: &Path) -> Result<DevKey> {
        let loaded = |signing: SigningKey, created: bool| DevKey {
            public: PublisherKey::from(&signing),
            signing,
            path: path.to_path_buf(),
            created,
        };
        match bundle::read_key_file(path) {
            Ok(signing) => return Ok(loaded(signing, false)),
            Err(refusal) if refusal.is("input-missing") => {}
            Err(refusal) => return Err(refusal),
        }
        if let Some(dir) = path.parent() {
            DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| {
                Refusal::new("output-directory-missing", format!("creating {} failed: {}", dir.display(), e.kind()))
                    .with_data(json!({ "path": dir.display().to_string() }))
            })?;
        }
        let signing = bundle::generate_key();
        match bundle::write_key_file(path, &signing) {
            Ok(_) => Ok(loaded(signing, true)),
            // another plugin dev made it meanwhile: use that one
            Err(refusal) if refusal.is("output-exists") => Ok(loaded(bundle::read_key_file(path)?, false)),
            Err(refusal) => Err(refusal),
        }
    }
}

/// What the host lists the dev key as: whose, on which machine.
fn dev_key_name() -> String {
    let user =
        ["USER", "LOGNAME"].iter().find_map(|v| std::env::var(v).ok().filter(|u| !u.trim().is_empty())).unwrap_or_else(|| "someone".into());
    let host = fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty());
    let name = match host {
        Some(host) => format!("dev key of {user}@{host}"),
        None => format!("dev key of {user}"),
    };
    name.chars().filter(|c| !c.is_control()).take(100).collect()
}

/// Trust `key` on the host unless it is already (by configuration or added); whether it was
/// added now.
fn ensure_trusted(session: &mut Session, key: &DevKey) -> Result<bool> {
    let listed = session.call("plugins.listTrustedPublishers", &json!({}))?;
    let public = key.public.to_string();
    let added = listed["added"].as_array().is_some_and(|a| a.iter().any(|p| p["publicKey"] == public.as_str()));
    let configured = listed["configured"].as_array().is_some_and(|c| c.iter().any(|k| k == public.as_str()));
    if added || configured {
        return Ok(false);
    }
    session.call("plugins.addTrustedPublisher", &json!({ "publicKey": public, "name": dev_key_name() }))?;
    Ok(true)
}

// ---- one build ----

/// The version a dev build of `base` (the manifest's) gets: above it (`0.1.0` → `0.1.1-dev.N`,
/// `0.2.0-beta.1` → `0.2.0-beta.1.dev.N`) and above every dev build of it in `seen` (the
/// versions the host has), so each is an upgrade.
pub fn dev_version(base: &semver::Version, seen: &[&str]) -> Result<semver::Version> {
    let (core, prefix) = if base.pre.is_empty() {
        (semver::Version::new(base.major, base.minor, base.patch + 1), "dev".to_string())
    } else {
        (semver::Version::new(base.major, base.minor, base.patch), format!("{}.dev", base.pre))
    };
    let numbered = format!("{prefix}.");
    let last = seen
        .iter()
        .filter_map(|v| semver::Version::parse(v).ok())
        .filter(|v| (v.major, v.minor, v.patch) == (core.major, core.minor, core.patch))
        .filter_map(|v| v.pre.as_str().strip_prefix(&numbered).and_then(|n| n.parse::<u64>().ok()))
        .max()
        .unwrap_or(0);
    let pre = semver::Prerelease::new(&format!("{prefix}.{}", last + 1)).map_err(Refusal::internal)?;
    Ok(semver::Version { pre, ..core })
}

/// `manifest_text` with `version` in place of the manifest's own.
pub fn with_version(manifest_text: &str, version: &semver::Version) -> Result<String> {
    let mut table: toml::Table =
        manifest_text.parse().map_err(|e| Refusal::new("manifest-invalid", format!("{MANIFEST_FILE} is not TOML: {e}")))?;
    let plugin = table
        .get_mut("plugin")
        .and_then(toml::Value::as_table_mut)
        .ok_or_else(|| Refusal::new("manifest-invalid", format!("{MANIFEST_FILE} has no [plugin] table")))?;
    let original = plugin.insert("version".into(), toml::Value::String(version.to_string()));
    let original = original.as_ref().and_then(toml::Value::as_str).unwrap_or("?");
    let body = toml::to_string(&table).map_err(Refusal::internal)?;
    let text = format!("# built by `capstan plugin dev` from {MANIFEST_FILE} version {original}\n{body}");
    Manifest::parse(&text)?;
    Ok(text)
}

/// Build, sign, install or upgrade, and say where the plugin answers.
fn round(session: &mut Session, dir: &Path, key: &DevKey, json: bool) -> Result<()> {
    let (manifest_text, manifest) = read_manifest(dir)?;
    let id = manifest.id.clone();
    let listed = session.call("plugins.list", &json!({}))?;
    let installed = listed["plugins"].as_array().and_then(|all| all.iter().find(|p| p["id"] == id.as_str())).cloned();
    let seen: Vec<&str> = installed.iter().flat_map(|p| [p["version"].as_str(), p["previousVersion"].as_str()]).flatten().collect();
    let version = dev_version(&manifest.version, &seen)?;
    let mut built = compile(dir, with_version(&manifest_text, &version)?)?;
    built.sign(&key.signing);
    let bytes = built.to_bytes();
    let output = dir.join(BUNDLE_DIR).join(format!("{id}-dev.{}", bundle::BUNDLE_EXTENSION));
    if let Some(parent) = output.parent() {
        fs::create_dir_all(parent).map_err(|e| {
            Refusal::new("bundle-write-failed", format!("creating {} failed: {}", parent.display(), e.kind()))
                .with_data(json!({ "path": parent.display().to_string() }))
        })?;
    }
    write_atomically(&output, &bytes, 0o644)?;
    eprintln!("built {id} {version}, signed by your dev key ({}): {}", key.public.fingerprint(), output.display());

    let uploaded = session.client.upload_bundle(bytes)?;
    let upload = uploaded["upload"].as_str().ok_or_else(|| Refusal::new("response-invalid", "the upload answer names no upload id"))?;
    let (method, action) = if installed.is_some() { ("plugins.upgrade", "upgraded") } else { ("plugins.install", "installed") };
    let answer = session.call(method, &json!({ "upload": upload, "approve": [ALL_REQUESTED] })).map_err(|mut refusal| {
        if refusal.is("version-not-newer") {
            refusal.message =
                format!("{} (a dev build is numbered above {MANIFEST_FILE}'s version: raise it above the installed one)", refusal.message);
        }
        refusal
    })?;
    let url = session.client.url().to_string();
    let methods = session.client.get("/api/v1/methods").map(|l| l["methods"].as_array().cloned().unwrap_or_default()).unwrap_or_default();
    let served: Vec<Value> = methods.into_iter().filter(|m| m["name"].as_str().is_some_and(|n| n.starts_with(&format!("{id}.")))).collect();
    // `--url` in the sample only when this shell would not reach the host without it
    let implied = std::env::var("CAPSTAN_URL").ok().and_then(|u| client::normalize_url(&u).ok()).unwrap_or_else(|| DEFAULT_URL.into());
    let sample = served.first().map(|m| sample_call(m, &url, &implied));
    let pages = answer["pages"].as_array().is_some_and(|p| !p.is_empty());
    if json {
        print_json(
            &json!({ "ok": true, "action": action, "url": url, "bundle": output.display().to_string(), "plugin": answer, "call": sample }),
        );
        return Ok(());
    }
    let (version, status) = (text(&answer, "version"), text(&answer, "status"));
    match (action, installed.as_ref().and_then(|p| p["version"].as_str())) {
        ("upgraded", Some(previous)) => println!("upgraded {id} from {previous} to {version} on {url}: {status}"),
        _ => println!("installed {id} {version} on {url}: {status}"),
    }
    let names: Vec<&str> = answer["methods"].as_array().map(|m| m.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    println!("  methods: {}", if names.is_empty() { "none".to_string() } else { names.join(", ") });
    let grants: Vec<&str> = answer["grants"].as_array().map(|g| g.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    println!(
        "  grants:  {} (all it requests: a dev host approves them for you)",
        if grants.is_empty() { "none".to_string() } else { grants.join(", ") }
    );
    if let Some(first) = served.first().and_then(|m| m["name"].as_str()) {
        println!("  api:     POST {url}/api/v1/{first}");
    }
    if let Some(sample) = sample {
        println!("  try:     {sample}");
    }
    if pages {
        println!("  pages:   {url}/p/{id}");
    }
    if let Some(error) = answer["lastError"].as_object() {
        let code = error.get("code").and_then(Value::as_str).unwrap_or("?");
        println!("  last error: {code}: {}", error.get("message").and_then(Value::as_str).unwrap_or(""));
    }
    Ok(())
}

/// A `capstan call` of a listed method (`GET /api/v1/methods`' entry) that its input schema
/// accepts: each required field set to a sample of its type, and `--url` unless the host is
/// the one a plain client command reaches (`implied`: CAPSTAN_URL, else the default).
pub fn sample_call(entry: &Value, url: &str, implied: &str) -> String {
    let name = entry["name"].as_str().unwrap_or("?");
    let mut call = format!("capstan call {name}");
    let schema = &entry["input"];
    let required = schema["required"].as_array().cloned().unwrap_or_default();
    for field in required.iter().filter_map(Value::as_str) {
        let sample = match schema["properties"][field]["type"].as_str() {
            Some("string") => "example",
            Some("integer" | "number") => "1",
            Some("boolean") => "true",
            Some("array") => "[]",
            _ => "{}",
        };
        call.push_str(&format!(" --set {field}={sample}"));
    }
    if url != implied {
        call.push_str(&format!(" --url {url}"));
    }
    call
}

// ---- watching ----

/// What `--watch` compares: each file under the crate with its modification time and size.
type Snapshot = BTreeMap<PathBuf, (SystemTime, u64)>;

/// Whether `--watch` looks at an entry: not cargo's output, version control, hidden files
/// (editors' swap files), backups, bundles, or Cargo.lock (which a build itself writes).
fn watched(name: &str) -> bool {
    !(name == "target"
        || name == "Cargo.lock"
        || name.starts_with('.')
        || name.ends_with('~')
        || name.ends_with(&format!(".{}", bundle::BUNDLE_EXTENSION)))
}

fn snapshot(dir: &Path) -> Snapshot {
    let mut files = Snapshot::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        let Ok(entries) = fs::read_dir(&next) else { continue };
        for entry in entries.flatten() {
            if !watched(&entry.file_name().to_string_lossy()) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                files.insert(entry.path(), (meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len()));
            }
        }
    }
    files
}

/// The first path that differs between two snapshots.
fn first_change(before: &Snapshot, after: &Snapshot) -> Option<PathBuf> {
    let changed = after.iter().find(|(path, stamp)| before.get(*path) != Some(stamp)).map(|(path, _)| path.clone());
    changed.or_else(|| before.keys().find(|path| !after.contains_key(*path)).cloned())
}

/// Wait until a file under `dir` changes and then stays unchanged for a moment; `seen` becomes
/// the new state. The changed path.
fn wait_for_change(dir: &Path, seen: &mut Snapshot) -> PathBuf {
    loop {
        std::thread::sleep(POLL);
        let now = snapshot(dir);
        let Some(changed) = first_change(seen, &now) else { continue };
        let mut settled = now;
        loop {
            std::thread::sleep(SETTLE);
            let again = snapshot(dir);
            if again == settled {
                break;
            }
            settled = again;
        }
        *seen = settled;
        return changed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_dev_key_is_created_once_privately_and_a_readable_one_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let path = home.path().join("config").join("capstan").join(DEV_KEY_FILE);
        let first = DevKey::load_or_create(&path).unwrap();
        assert!(first.created);
        assert_eq!(mode(&path), 0o600, "the key is private");
        assert_eq!(mode(path.parent().unwrap()), 0o700, "in a directory only its owner may use");
        let again = DevKey::load_or_create(&path).unwrap();
        assert!(!again.created, "used, not made again");
        assert_eq!(again.public, first.public);
        assert_eq!(again.signing.to_bytes(), first.signing.to_bytes());

        // a key others can read is refused, not used, and never replaced
        for loose in [0o640, 0o644, 0o604] {
            fs::set_permissions(&path, fs::Permissions::from_mode(loose)).unwrap();
            assert_eq!(DevKey::load_or_create(&path).err().map(|r| r.code.to_string()).as_deref(), Some("input-permissions"), "{loose:o}");
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(DevKey::load_or_create(&path).unwrap().public, first.public, "the same key after all");

        // something that is not a key is refused by name
        let other = home.path().join("config").join("capstan").join("not-a-key.pem");
        capstan_core::private_file::write_new(&other, b"hello").unwrap();
        assert_eq!(DevKey::load_or_create(&other).err().unwrap().code, "key-file-invalid");

        // a first key is not written where others may write
        let shared = home.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        let refused = DevKey::load_or_create(&shared.join(DEV_KEY_FILE)).err().unwrap();
        assert_eq!(refused.code, "output-directory-not-private");
        assert!(!shared.join(DEV_KEY_FILE).exists());
    }

    #[test]
    fn the_dev_key_lives_beside_the_sessions() {
        let path = dev_key_path().unwrap();
        assert_eq!(path.file_name().unwrap(), DEV_KEY_FILE);
        assert_eq!(path.parent(), credentials_path().unwrap().parent());
    }

    #[test]
    fn only_a_host_that_says_it_is_a_dev_host_is_one() {
        let url = "http://127.0.0.1:8080";
        require_dev_host(&json!({ "version": "0.1.0", "dev": true }), url).unwrap();
        for (answer, why) in [
            (json!({ "version": "0.1.0", "dev": false }), "was not started with `serve --dev`"),
            (json!({ "version": "0.1.0" }), "does not say"),
            (json!({ "version": "0.1.0", "dev": "yes" }), "does not say"),
        ] {
            let refused = require_dev_host(&answer, url).unwrap_err();
            assert_eq!(refused.code, "dev-host-required", "{answer}");
            assert!(refused.message.contains(why), "{}", refused.message);
            assert!(refused.message.contains("capstan plugin trust"), "says what to do instead: {}", refused.message);
            assert_eq!(refused.data.as_deref().unwrap()["url"], url);
        }
    }

    #[test]
    fn dev_builds_are_numbered_above_the_manifest_and_every_earlier_one() {
        let v = |s: &str| semver::Version::parse(s).unwrap();
        let next = |base: &str, seen: &[&str]| dev_version(&v(base), seen).unwrap().to_string();
        assert_eq!(next("0.1.0", &[]), "0.1.1-dev.1");
        assert_eq!(next("0.1.0", &["0.1.1-dev.1"]), "0.1.1-dev.2");
        assert_eq!(next("0.1.0", &["0.1.1-dev.9", "0.1.1-dev.10"]), "0.1.1-dev.11", "numbers, not text");
        // a release installed before: the first dev build is above it
        assert_eq!(next("0.1.0", &["0.1.0"]), "0.1.1-dev.1");
        assert!(v("0.1.1-dev.1") > v("0.1.0"));
        // the next release sorts above every dev build of it
        assert!(v("0.1.1") > v(&next("0.1.0", &["0.1.1-dev.41"])));
        // another version's dev builds do not count
        assert_eq!(next("0.2.0", &["0.1.1-dev.5", "nonsense"]), "0.2.1-dev.1");
        // a pre-release manifest: numbered within it
        assert_eq!(next("0.3.0-beta.1", &[]), "0.3.0-beta.1.dev.1");
        assert_eq!(next("0.3.0-beta.1", &["0.3.0-beta.1.dev.2"]), "0.3.0-beta.1.dev.3");
        assert!(v("0.3.0-beta.1.dev.1") > v("0.3.0-beta.1") && v("0.3.0-beta.1.dev.1") < v("0.3.0"));
    }

    #[test]
    fn the_bundled_manifest_carries_the_dev_version() {
        let text = "[plugin]\nid = \"hello\"\nname = \"Hello\"\n# raise it\nversion = \"0.1.0\"\nwit = \"capstan:plugin@0.2.0\"\n\n\
                    [capabilities]\nrequested = [\"store\", \"log\"]\n";
        let dev = with_version(text, &semver::Version::parse("0.1.1-dev.3").unwrap()).unwrap();
        let manifest = Manifest::parse(&dev).unwrap();
        assert_eq!(manifest.version.to_string(), "0.1.1-dev.3");
        assert_eq!((manifest.id.as_str(), manifest.wit.as_str()), ("hello", "capstan:plugin@0.2.0"));
        assert_eq!(manifest.requested_set().into_iter().collect::<Vec<_>>(), ["log", "store"]);
        assert!(dev.starts_with("# built by `capstan plugin dev` from capstan-plugin.toml version 0.1.0\n"), "{dev}");
        assert_eq!(with_version("[capabilities]\n", &semver::Version::new(1, 0, 0)).unwrap_err().code, "manifest-invalid");
    }

    #[test]
    fn the_sample_call_sets_each_required_field() {
        let entry = json!({
            "name": "hello.hello",
            "input": {
                "type": "object",
                "properties": { "name": { "type": "string" }, "times": { "type": "integer" }, "loud": { "type": "boolean" } },
                "required": ["name", "times"],
            },
        });
        assert_eq!(sample_call(&entry, DEFAULT_URL, DEFAULT_URL), "capstan call hello.hello --set name=example --set times=1");
        let status = json!({ "name": "hello.status", "input": { "type": "object" } });
        let other = "http://127.0.0.1:9999";
        assert_eq!(sample_call(&status, other, DEFAULT_URL), "capstan call hello.status --url http://127.0.0.1:9999");
        assert_eq!(sample_call(&status, other, other), "capstan call hello.status", "CAPSTAN_URL names it already");
    }

    #[test]
    fn watching_sees_sources_not_build_output() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("src")).unwrap();
        fs::create_dir_all(root.join("target/release")).unwrap();
        fs::write(root.join("src/lib.rs"), "// one").unwrap();
        fs::write(root.join("capstan-plugin.toml"), "x").unwrap();
        let before = snapshot(root);
        assert_eq!(before.len(), 2, "{before:?}");
        for ignored in ["target/release/out.wasm", "Cargo.lock", ".lib.rs.swp", "src/lib.rs~", "hello-0.1.0.capstan-plugin"] {
            fs::write(root.join(ignored), "x").unwrap();
        }
        assert_eq!(first_change(&before, &snapshot(root)), None);
        fs::write(root.join("src/lib.rs"), "// two, longer").unwrap();
        assert_eq!(first_change(&before, &snapshot(root)), Some(root.join("src/lib.rs")));
        fs::create_dir(root.join("pages")).unwrap();
        fs::write(root.join("pages/overview.html"), "<p>").unwrap();
        let after = snapshot(root);
        assert!(after.contains_key(&root.join("pages/overview.html")));
        fs::remove_file(root.join("capstan-plugin.toml")).unwrap();
        assert_eq!(first_change(&after, &snapshot(root)), Some(root.join("capstan-plugin.toml")), "a removed file is a change");
    }
}
