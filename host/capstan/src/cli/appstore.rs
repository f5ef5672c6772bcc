//! `capstan appstore sign-catalog | verify-catalog`: the catalog publisher's offline commands.
//! They never start the host or talk to it. The format is `capstan-catalog`'s (its README and
//! docs/appstore.md).
//!
//! `capstan appstore status | refresh | import | apps | app | install | upgradeable | upgrade`:
//! clients of the embedded App Store plugin's methods (`appstore.*`) on a running host. With
//! `--json` each prints the API's answer exactly (one line); refusals print
//! `{"ok":false,"error":{…}}` and exit 1.

use super::client::{Client, Connection, finish, print_json, print_table, text, utc};
use crate::inventory::services::{CreateInput, check_create_fields};
use crate::plugins::bundle;
use crate::refusal::{Refusal, Result};
use capstan_catalog::definitions::{self, DefinitionError};
use capstan_catalog::{Catalog, CatalogError, MAX_ENVELOPE_BYTES, PublisherKey, Snapshot, Verified, check_succession, sign, verify};
use clap::Subcommand;
use serde_json::{Value, json};
use std::fs::{self, OpenOptions};
use std::io::{BufRead, ErrorKind, IsTerminal, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum AppstoreCommand {
    /// Sign a catalog from a directory of app definitions (one `<app id>.toml` per app).
    ///
    /// Every definition is checked against the catalog's rules and every template against the
    /// inventory's service rules (the ones an install would meet), each mistake named by its
    /// file and field (`app-definition-invalid`). The private key is the PKCS#8 PEM file
    /// `capstan plugin keygen` wrote (`input-permissions`, `key-file-invalid`, …). The envelope
    /// is written to a new file (default `catalog-<REVISION>.json`), never replacing one
    /// (`output-exists`: a revision is published once). Prints the output, the revision, the
    /// digest and the signing key.
    SignCatalog {
        /// The directory of app definitions
        #[arg(long, value_name = "DIR")]
        apps: PathBuf,
        /// The private key file `capstan plugin keygen` wrote
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The catalog's revision: greater than every revision published before (1 to 2^53-1)
        #[arg(long, value_name = "N")]
        revision: u64,
        /// Where to write the envelope (must not exist) [default: catalog-<REVISION>.json]
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Verify a catalog envelope against trusted keys and show what it holds.
    ///
    /// Refuses by name: `catalog-malformed`, `catalog-contract-unsupported`,
    /// `catalog-digest-mismatch`, `catalog-signature-invalid`, `catalog-key-untrusted`. With
    /// --previous, also checks that the catalog may succeed that one (verified with the same
    /// keys): `catalog-revision-not-newer`, `catalog-version-removed`,
    /// `catalog-version-rewritten`, `catalog-version-reinstated`.
    VerifyCatalog {
        /// The envelope file
        file: PathBuf,
        /// A trusted catalog key (`capstan-ed25519:…`); repeat for more
        #[arg(long = "trust", value_name = "PUBLIC_KEY", required = true)]
        trust: Vec<String>,
        /// The catalog it should succeed (the one hosts have now)
        #[arg(long, value_name = "FILE")]
        previous: Option<PathBuf>,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Show the catalog's status on a running host (`appstore.getCatalogStatus`).
    ///
    /// The active catalog's revision, signer, digest and where it came from (a source URL or
    /// `import`) — or why none is active, by its cause (`catalog-not-loaded`,
    /// `catalog-key-untrusted`, …); the sources asked, the loader's last attempt with its
    /// outcome and each source's error, its last success and when the next attempt is due.
    Status(Common),
    /// Ask the catalog sources now, in order, and show the status after
    /// (`appstore.refreshCatalog`; administrators).
    ///
    /// A source that fails is recorded with its code (`catalog-source-failed`, `http-failed`,
    /// `http-tls-failed`, or the catalog's own refusal) and the active catalog stays.
    Refresh(Common),
    /// Activate a signed catalog envelope carried to a host that reaches no source
    /// (`appstore.importCatalog`; administrators).
    ///
    /// FILE is what `capstan appstore sign-catalog` wrote, or `-` for standard input. A file
    /// that cannot be read is refused `catalog-unreadable`, one over 8 MiB `catalog-malformed`,
    /// before anything is sent. The host verifies it against the keys it trusts and the catalog
    /// it has (`catalog-key-untrusted`, `catalog-revision-not-newer`, …) and answers
    /// `activated`, `unchanged` (it is the active one) or `superseded` (a greater revision is
    /// active); the status follows.
    Import {
        /// The envelope file, or `-` for standard input
        file: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// List the apps the active catalog offers (`appstore.listApps`): id, name, the version a
    /// new install gets, every offered version, and withdrawn ones with the publisher's reason.
    ///
    /// While no catalog is active the list is empty and the cause is shown.
    Apps(Common),
    /// Show one app version: its template (image, ports, volumes, environment, capabilities),
    /// release notes and withdrawal (`appstore.getAppConfig`).
    ///
    /// Refuses `appstore-app-not-found`, `appstore-version-not-found` and, while no catalog is
    /// active, `appstore-catalog-unavailable` with its cause.
    App {
        /// The app's id, e.g. wiki
        app_id: String,
        /// The version [default: the one a new install gets]
        #[arg(long, value_name = "VERSION")]
        version: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Install an app version as a new service in an organization (`appstore.install`; its
    /// owners and administrators).
    ///
    /// The service gets the version's template and its snapshot. Refuses
    /// `appstore-version-withdrawn`, `appstore-capability-unsupported`, and the inventory's own
    /// (`exists`, `name-invalid`, `domain-invalid`, …).
    Install {
        /// The app's id, e.g. wiki
        app_id: String,
        /// The organization the service belongs to (`org_…`)
        #[arg(long, value_name = "ID")]
        organization: String,
        /// The new service's name (1–63 of a-z 0-9 -, starting with a letter; unique in the organization)
        #[arg(long)]
        name: String,
        /// The version to install [default: the newest offered]
        #[arg(long, value_name = "VERSION")]
        version: Option<String>,
        /// A domain the service answers on; repeat for more
        #[arg(long = "domain", value_name = "DOMAIN")]
        domains: Vec<String>,
        /// How many instances to run
        #[arg(long, value_name = "N")]
        scale: Option<u32>,
        #[command(flatten)]
        common: Common,
    },
    /// List services installed from the catalog that have a newer version offered
    /// (`appstore.listUpgradeable`).
    ///
    /// Without --organization every organization you can see is asked (with --json:
    /// `{"organizations":[{"id","name","upgradeable":[…]}]}`, each list the API's answer).
    Upgradeable {
        /// Only this organization (`org_…`); --json then prints the API's answer exactly
        #[arg(long, value_name = "ID")]
        organization: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Upgrade a service installed from the catalog to a newer version of its app
    /// (`appstore.upgrade`; its owners and administrators).
    ///
    /// Shows the preview first (`appstore.getUpgradePreview`: image, environment keys added,
    /// removed and changed, ports, volumes, release notes), then asks on a terminal. Without a
    /// terminal it upgrades only with --yes and is otherwise refused `confirmation-required`;
    /// a "no" is refused `confirmation-declined`. The write states the service revision read
    /// before the preview, so a change in between is refused `conflict`. Other refusals:
    /// `appstore-up-to-date`, `version-not-newer`, `appstore-service-not-from-catalog`, …
    Upgrade {
        /// The service (`svc_…`)
        service_id: String,
        /// The version to upgrade to [default: the newest offered]
        #[arg(long, value_name = "VERSION")]
        version: Option<String>,
        /// The service revision you read [default: the current one, read before the preview]
        #[arg(long, value_name = "N")]
        expected_revision: Option<u64>,
        /// The service's organization [default: read from the service]
        #[arg(long, value_name = "ID")]
        organization: Option<String>,
        /// Upgrade without asking (needed when standard input is not a terminal)
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        common: Common,
    },
}

/// Where the host is, and how to print.
#[derive(clap::Args)]
pub struct Common {
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer exactly, as one line of JSON
    #[arg(long)]
    json: bool,
}

pub fn run(command: AppstoreCommand) -> ExitCode {
    let (result, json) = match command {
        AppstoreCommand::SignCatalog { apps, key, revision, output, json } => {
            (sign_catalog(&apps, &key, revision, output.as_deref(), json), json)
        }
        AppstoreCommand::VerifyCatalog { file, trust, previous, json } => (verify_catalog(&file, &trust, previous.as_deref(), json), json),
        AppstoreCommand::Status(common) => (status(&common), common.json),
        AppstoreCommand::Refresh(common) => (refresh(&common), common.json),
        AppstoreCommand::Import { file, common } => (import(&file, &common), common.json),
        AppstoreCommand::Apps(common) => (list_apps(&common), common.json),
        AppstoreCommand::App { app_id, version, common } => (app_config(&app_id, version.as_deref(), &common), common.json),
        AppstoreCommand::Install { app_id, organization, name, version, domains, scale, common } => {
            let install = Install { app_id, organization, name, version, domains, scale };
            (install_app(&install, &common), common.json)
        }
        AppstoreCommand::Upgradeable { organization, common } => (upgradeable(organization.as_deref(), &common), common.json),
        AppstoreCommand::Upgrade { service_id, version, expected_revision, organization, yes, common } => {
            let upgrade = Upgrade { service_id, version, expected_revision, organization, yes };
            (upgrade_service(&upgrade, &common), common.json)
        }
    };
    finish(result, json)
}

/// A catalog refusal as the CLI's refusal: the same code, message and data.
fn refusal(e: &CatalogError) -> Refusal {
    Refusal::new(e.code(), e.to_string()).with_data(e.data())
}

fn definition_refusal(e: &DefinitionError) -> Refusal {
    Refusal::new(e.code(), e.to_string()).with_data(e.data())
}

fn display(path: &Path) -> String {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string()
}

fn sign_catalog(apps: &Path, key_path: &Path, revision: u64, output: Option<&Path>, json: bool) -> Result<()> {
    let catalog = definitions::read_dir(apps).map_err(|e| definition_refusal(&e))?;
    check_templates(apps, &catalog)?;
    let key = bundle::read_key_file(key_path)?;
    let envelope = sign(&catalog, revision, &key).map_err(|e| refusal(&e))?;
    let text = envelope.to_json();
    let signer = PublisherKey::from(&key);
    // what a reader will do with it, before anyone does
    let verified = verify(text.as_bytes(), std::slice::from_ref(&signer)).map_err(|e| refusal(&e))?;
    let default_output = PathBuf::from(format!("catalog-{revision}.json"));
    let output = output.unwrap_or(&default_output);
    write_new_public(output, format!("{text}\n").as_bytes())?;
    let (versions, withdrawn) = count_versions(&catalog);
    if json {
        println!(
            "{}",
            json!({
                "ok": true,
                "output": display(output),
                "revision": verified.revision(),
                "digest": verified.digest_hex(),
                "publicKey": signer.to_string(),
                "fingerprint": signer.fingerprint(),
                "apps": catalog.apps.len(),
                "versions": versions,
                "withdrawn": withdrawn,
            })
        );
    } else {
        println!("signed {}", display(output));
        println!("  revision: {}", verified.revision());
        println!("  digest:   {}", verified.digest_hex());
        println!("  signer:   {signer} ({})", signer.fingerprint());
        println!("  apps:     {} ({versions} versions, {withdrawn} withdrawn)", catalog.apps.len());
    }
    Ok(())
}

fn count_versions(catalog: &Catalog) -> (usize, usize) {
    let versions = catalog.apps.iter().map(|a| a.versions.len()).sum();
    let withdrawn = catalog.apps.iter().flat_map(|a| &a.versions).filter(|v| v.is_withdrawn()).count();
    (versions, withdrawn)
}

/// Check every template as `services.create` would check the service an install makes of it
/// (with the app id as the service's name and the template's snapshot), naming the file and
/// the field.
fn check_templates(dir: &Path, catalog: &Catalog) -> Result<()> {
    for app in &catalog.apps {
        let file = dir.join(format!("{}.{}", app.id, definitions::DEFINITION_EXTENSION));
        for (i, version) in app.versions.iter().enumerate() {
            let field =
                |inner: &str| format!("versions[{i}].template{}", if inner.is_empty() { String::new() } else { format!(".{inner}") });
            let t = &version.template;
            let body = json!({
                "name": app.id,
                "organizationId": "-",
                "image": t.image,
                "ports": t.ports,
                "environment": t.environment,
                "volumes": t.volumes,
                "template": Snapshot::of(app, version, 1).to_value(),
            });
            let input: CreateInput = serde_json::from_value(body)
                .map_err(|e| Refusal::internal(format!("a catalog template does not fit services.create's shape: {e}")))?;
            if let Err(rule) = check_create_fields(&input) {
                let inner = rule.data.as_ref().and_then(|d| d["field"].as_str()).unwrap_or_default();
                // the snapshot is the whole template; the service's name is the app's id
                let field = match inner {
                    "template" => field(""),
                    "name" => "id".to_string(),
                    inner => field(inner),
                };
                let said = rule.message.strip_prefix(&format!("{inner}: ")).unwrap_or(&rule.message);
                let message = format!("{}: {field}: {said} (as the inventory checks it: {})", file.display(), rule.code);
                return Err(Refusal::new("app-definition-invalid", message).with_data(json!({
                    "file": file.display().to_string(),
                    "field": field,
                    "rule": rule.code,
                })));
            }
        }
    }
    Ok(())
}

/// Write `bytes` to the new file `output` (mode 0644): a same-directory temporary file
/// hard-linked into place, so the output is whole or absent and an existing one is never
/// replaced.
fn write_new_public(output: &Path, bytes: &[u8]) -> Result<()> {
    let output = std::path::absolute(output).map_err(|e| write_failed(output, &e))?;
    let exists = || {
        Refusal::new("output-exists", format!("{} already exists; it is never replaced", output.display()))
            .with_data(json!({ "path": output.display().to_string() }))
    };
    if fs::symlink_metadata(&output).is_ok() {
        return Err(exists());
    }
    let dir = output.parent().unwrap_or(Path::new("/"));
    let name = output.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.tmp-{:016x}", rand::random::<u64>()));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)
            .map_err(|e| write_failed(&output, &e))?;
        file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| write_failed(&output, &e))?;
        fs::hard_link(&temp, &output)
            .map_err(|e| if e.kind() == ErrorKind::AlreadyExists { exists() } else { write_failed(&output, &e) })?;
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    let _ = fs::remove_file(&temp);
    result
}

fn write_failed(path: &Path, e: &std::io::Error) -> Refusal {
    Refusal::new("catalog-write-failed", format!("writing {} failed: {}", path.display(), e.kind()))
        .with_data(json!({ "path": path.display().to_string() }))
}

/// Read an envelope file, refusing one larger than the envelope limit before reading it.
fn read_envelope(path: &Path) -> Result<Vec<u8>> {
    let unreadable = |why: String| {
        Refusal::new("catalog-unreadable", format!("cannot read the catalog {}: {why}", path.display()))
            .with_data(json!({ "path": path.display().to_string() }))
    };
    let file = fs::File::open(path).map_err(|e| unreadable(e.kind().to_string()))?;
    let meta = file.metadata().map_err(|e| unreadable(e.kind().to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    let too_large =
        || refusal(&CatalogError::Malformed { reason: format!("the envelope is larger than {MAX_ENVELOPE_BYTES} bytes (8 MiB)") });
    if meta.len() > MAX_ENVELOPE_BYTES as u64 {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_ENVELOPE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|e| unreadable(e.kind().to_string()))?;
    if bytes.len() > MAX_ENVELOPE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

fn verify_catalog(path: &Path, trust: &[String], previous: Option<&Path>, json: bool) -> Result<()> {
    let trusted =
        trust.iter().map(|t| t.trim().parse::<PublisherKey>().map_err(crate::plugins::bundle::key_refusal)).collect::<Result<Vec<_>>>()?;
    let verified = verify(&read_envelope(path)?, &trusted).map_err(|e| refusal(&e))?;
    let active = match previous {
        None => None,
        Some(previous) => Some(verify(&read_envelope(previous)?, &trusted).map_err(|e| {
            let r = refusal(&e);
            Refusal { message: format!("the previous catalog {}: {}", previous.display(), r.message), ..r }
        })?),
    };
    check_succession(active.as_ref(), &verified).map_err(|e| refusal(&e))?;
    let signer = verified.signer();
    if json {
        println!(
            "{}",
            json!({
                "ok": true,
                "revision": verified.revision(),
                "contract": verified.contract(),
                "digest": verified.digest_hex(),
                "publicKey": signer.to_string(),
                "fingerprint": signer.fingerprint(),
                "succeeds": active.as_ref().map(|a| json!({ "revision": a.revision(), "digest": a.digest_hex() })),
                "apps": apps_json(&verified),
            })
        );
        return Ok(());
    }
    println!(
        "verified: revision {} (contract {}), signed by {signer} ({})",
        verified.revision(),
        verified.contract(),
        signer.fingerprint()
    );
    println!("  digest: {}", verified.digest_hex());
    if let Some(active) = &active {
        println!("  succeeds revision {} ({})", active.revision(), active.digest_hex());
    }
    let rows: Vec<Vec<String>> = verified
        .apps()
        .iter()
        .map(|app| {
            let newest = app.newest().map_or("-".to_string(), |v| v.version.to_string());
            let mut versions: Vec<_> = app.versions.iter().collect();
            versions.sort_by(|a, b| a.version.cmp(&b.version));
            let versions = versions
                .iter()
                .map(|v| if v.is_withdrawn() { format!("{} (withdrawn)", v.version) } else { v.version.to_string() })
                .collect::<Vec<_>>()
                .join(", ");
            vec![app.id.clone(), app.name.clone(), newest, versions]
        })
        .collect();
    if rows.is_empty() {
        println!("no apps");
    } else {
        print_table(&["APP", "NAME", "NEWEST", "VERSIONS"], &rows);
    }
    Ok(())
}

fn apps_json(verified: &Verified) -> Value {
    verified
        .apps()
        .iter()
        .map(|app| {
            json!({
                "id": app.id,
                "name": app.name,
                "newest": app.newest().map(|v| v.version.to_string()),
                "versions": app.versions.iter().map(|v| json!({
                    "version": v.version.to_string(),
                    "withdrawn": v.is_withdrawn(),
                    "image": v.template.image,
                    "templateDigest": v.template.digest_hex(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

// ---- the App Store on a running host ----

/// The status for people: the active catalog or why there is none, the sources, the loader.
fn print_status(s: &Value) {
    let active = &s["active"];
    if s["available"] == true && active.is_object() {
        println!(
            "catalog:      revision {} ({} apps), active since {}",
            active["revision"],
            active["apps"],
            utc(active["activatedAt"].as_u64())
        );
        println!("signer:       {}", text(active, "signer"));
        println!("digest:       {}", text(active, "digest"));
        println!("source:       {}", text(active, "source"));
    } else {
        println!("catalog:      none active");
        let why = &s["unavailable"];
        println!("unavailable:  {}: {}", text(why, "code"), text(why, "message"));
    }
    let sources: Vec<&str> = s["sources"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if sources.is_empty() {
        println!("sources:      none (setting appStoreCatalogSources); import a catalog with `capstan appstore import`");
    } else {
        println!("sources:      {}", sources.join(", "));
    }
    let loader = &s["loader"];
    match loader["lastAttemptAt"].as_u64() {
        Some(at) => println!("last attempt: {} ({})", utc(Some(at)), loader["lastOutcome"].as_str().unwrap_or("?")),
        None => println!("last attempt: never"),
    }
    println!("last success: {}", loader["lastSuccessAt"].as_u64().map_or_else(|| "never".to_string(), |at| utc(Some(at))));
    match loader["nextAttemptAt"].as_u64() {
        Some(at) => println!("next attempt: {}", utc(Some(at))),
        None => println!("next attempt: at the next reconcile pass (within a minute)"),
    }
    if let Some(failures) = loader["consecutiveFailures"].as_u64().filter(|n| *n > 0) {
        println!("failures:     {failures} in a row");
    }
    for e in loader["errors"].as_array().into_iter().flatten() {
        let cause = e["cause"].as_str().map(|c| format!(" (cause {c})")).unwrap_or_default();
        println!("error:        {}: {}{cause}: {}", text(e, "source"), text(e, "code"), text(e, "message"));
    }
}

fn status(common: &Common) -> Result<()> {
    let answer = Client::new(&common.connection)?.call("appstore.getCatalogStatus", &json!({}))?;
    if common.json {
        print_json(&answer);
    } else {
        print_status(&answer);
    }
    Ok(())
}

fn refresh(common: &Common) -> Result<()> {
    let answer = Client::new(&common.connection)?.call("appstore.refreshCatalog", &json!({}))?;
    if common.json {
        print_json(&answer);
    } else {
        println!("asked the catalog sources: {}", answer["loader"]["lastOutcome"].as_str().unwrap_or("?"));
        print_status(&answer);
    }
    Ok(())
}

/// The envelope to import, as text: the file (refused before anything is sent when it cannot
/// be read or is larger than an envelope may be), or standard input for `-`.
fn read_import(file: &Path) -> Result<String> {
    let (bytes, name) = if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin().lock().take(MAX_ENVELOPE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|e| {
            Refusal::new("catalog-unreadable", format!("cannot read the catalog from standard input: {}", e.kind()))
                .with_data(json!({ "path": "-" }))
        })?;
        if bytes.len() > MAX_ENVELOPE_BYTES {
            return Err(refusal(&CatalogError::Malformed {
                reason: format!("the envelope on standard input is larger than {MAX_ENVELOPE_BYTES} bytes (8 MiB)"),
            }));
        }
        (bytes, "standard input".to_string())
    } else {
        let bytes = read_envelope(file).map_err(|r| {
            if r.is("catalog-malformed") { Refusal { message: format!("{}: {}", file.display(), r.message), ..r } } else { r }
        })?;
        (bytes, file.display().to_string())
    };
    String::from_utf8(bytes).map_err(|_| refusal(&CatalogError::Malformed { reason: format!("{name} is not UTF-8 text") }))
}

fn import(file: &Path, common: &Common) -> Result<()> {
    let envelope = read_import(file)?;
    let answer = Client::new(&common.connection)?.call("appstore.importCatalog", &json!({ "envelope": envelope }))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let revision = &answer["revision"];
    match answer["outcome"].as_str() {
        Some("activated") => println!("activated catalog revision {revision}"),
        Some("unchanged") => println!("catalog revision {revision} is active already; nothing changed"),
        Some("superseded") => println!(
            "catalog revision {revision} was not activated: revision {} is active, a greater one",
            answer["status"]["active"]["revision"]
        ),
        other => println!("catalog revision {revision}: {}", other.unwrap_or("?")),
    }
    print_status(&answer["status"]);
    Ok(())
}

fn strings(value: &Value) -> Vec<&str> {
    value.as_array().into_iter().flatten().filter_map(Value::as_str).collect()
}

/// `-` for an empty list, else the items joined by `sep`.
fn joined(items: &[String], sep: &str) -> String {
    if items.is_empty() { "-".into() } else { items.join(sep) }
}

fn list_apps(common: &Common) -> Result<()> {
    let answer = Client::new(&common.connection)?.call("appstore.listApps", &json!({}))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let status = &answer["status"];
    if status["available"] != true {
        let why = &status["unavailable"];
        println!("no catalog is active ({}): {}", text(why, "code"), text(why, "message"));
        return Ok(());
    }
    let apps = answer["apps"].as_array().map(Vec::as_slice).unwrap_or_default();
    if apps.is_empty() {
        println!("catalog revision {} offers no apps", status["active"]["revision"]);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = apps
        .iter()
        .map(|app| {
            let offered: Vec<String> = strings(&app["versions"]).into_iter().map(String::from).collect();
            let withdrawn: Vec<String> = app["withdrawn"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|w| format!("{} ({})", text(w, "version"), text(w, "reason")))
                .collect();
            vec![
                text(app, "id").into(),
                text(app, "name").into(),
                text(app, "newestVersion").into(),
                joined(&offered, ", "),
                joined(&withdrawn, "; "),
            ]
        })
        .collect();
    println!("catalog revision {}", status["active"]["revision"]);
    print_table(&["APP", "NAME", "NEWEST", "OFFERED", "WITHDRAWN"], &rows);
    Ok(())
}

/// A template's ports for people: `8080/http`, with `:443` when published on another port.
fn ports_text(template: &Value) -> Vec<String> {
    template["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let public = p["publicPort"].as_u64().map(|n| format!(":{n}")).unwrap_or_default();
            format!("{}/{}{public}", p["port"], text(p, "protocol"))
        })
        .collect()
}

fn app_config(app_id: &str, version: Option<&str>, common: &Common) -> Result<()> {
    let mut body = json!({ "appId": app_id });
    if let Some(version) = version {
        body["version"] = json!(version);
    }
    let c = Client::new(&common.connection)?.call("appstore.getAppConfig", &body)?;
    if common.json {
        print_json(&c);
        return Ok(());
    }
    let t = &c["template"];
    println!("app:          {} ({})", text(&c, "appId"), text(&c, "name"));
    match c["withdrawn"].as_str() {
        Some(reason) => println!("version:      {} (withdrawn: {reason})", text(&c, "version")),
        None => println!("version:      {}", text(&c, "version")),
    }
    println!("catalog:      revision {}", c["catalogRevision"]);
    println!("template:     {}", text(&c, "templateDigest"));
    println!("image:        {}", text(t, "image"));
    println!("ports:        {}", joined(&ports_text(t), ", "));
    let volumes: Vec<String> =
        t["volumes"].as_array().into_iter().flatten().map(|v| format!("{} at {}", text(v, "name"), text(v, "mountPath"))).collect();
    println!("volumes:      {}", joined(&volumes, ", "));
    let capabilities: Vec<String> = strings(&t["capabilities"]).into_iter().map(String::from).collect();
    println!("capabilities: {}", joined(&capabilities, ", "));
    match t["environment"].as_object().filter(|e| !e.is_empty()) {
        Some(environment) => {
            println!("environment:");
            for (key, value) in environment {
                println!("  {key}={}", value.as_str().unwrap_or_default());
            }
        }
        None => println!("environment:  -"),
    }
    if let Some(notes) = c["notes"].as_str().filter(|n| !n.is_empty()) {
        println!("notes:        {notes}");
    }
    Ok(())
}

struct Install {
    app_id: String,
    organization: String,
    name: String,
    version: Option<String>,
    domains: Vec<String>,
    scale: Option<u32>,
}

fn install_app(install: &Install, common: &Common) -> Result<()> {
    let mut body = json!({ "organizationId": install.organization, "appId": install.app_id, "name": install.name });
    if let Some(version) = &install.version {
        body["version"] = json!(version);
    }
    if !install.domains.is_empty() {
        body["domains"] = json!(install.domains);
    }
    if let Some(scale) = install.scale {
        body["scale"] = json!(scale);
    }
    let answer = Client::new(&common.connection)?.call("appstore.install", &body)?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    println!(
        "installed {} {} as service {} ({}), revision {}",
        text(&answer, "appId"),
        text(&answer, "version"),
        install.name,
        text(&answer, "id"),
        answer["revision"]
    );
    println!("  see it with: capstan services get {}", text(&answer, "id"));
    Ok(())
}

/// The upgradeable rows of one `listUpgradeable` answer, led by `organization` when given.
fn upgradeable_rows(answer: &Value, organization: Option<&str>) -> Vec<Vec<String>> {
    answer
        .as_array()
        .into_iter()
        .flatten()
        .map(|u| {
            let available: Vec<String> = strings(&u["available"]).into_iter().map(String::from).collect();
            let mut row = vec![
                text(u, "serviceId").to_string(),
                text(u, "name").to_string(),
                text(u, "appId").to_string(),
                text(u, "currentVersion").to_string(),
                joined(&available, ", "),
            ];
            if let Some(organization) = organization {
                row.insert(0, organization.to_string());
            }
            row
        })
        .collect()
}

fn upgradeable(organization: Option<&str>, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    const HEADER: [&str; 5] = ["SERVICE", "NAME", "APP", "CURRENT", "AVAILABLE"];
    if let Some(organization) = organization {
        let answer = client.call("appstore.listUpgradeable", &json!({ "organizationId": organization }))?;
        if common.json {
            print_json(&answer);
            return Ok(());
        }
        let rows = upgradeable_rows(&answer, None);
        if rows.is_empty() {
            println!("no service of {organization} installed from the catalog has a newer version offered");
        } else {
            print_table(&HEADER, &rows);
        }
        return Ok(());
    }
    // every organization the caller can see, page by page
    let mut organizations = Vec::new();
    let mut cursor = Value::Null;
    loop {
        let page = client.call("organizations.list", &json!({ "cursor": cursor, "limit": 200 }))?;
        for o in super::client::items(&page) {
            let id = text(o, "id").to_string();
            let answer = client.call("appstore.listUpgradeable", &json!({ "organizationId": id }))?;
            organizations.push(json!({ "id": id, "name": o["name"], "upgradeable": answer }));
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = json!(next),
            None => break,
        }
    }
    if common.json {
        print_json(&json!({ "organizations": organizations }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = organizations.iter().flat_map(|o| upgradeable_rows(&o["upgradeable"], Some(text(o, "id")))).collect();
    if rows.is_empty() {
        println!("no service installed from the catalog has a newer version offered");
    } else {
        let mut header = vec!["ORGANIZATION"];
        header.extend(HEADER);
        print_table(&header, &rows);
    }
    Ok(())
}

struct Upgrade {
    service_id: String,
    version: Option<String>,
    expected_revision: Option<u64>,
    organization: Option<String>,
    yes: bool,
}

/// An upgrade preview for people.
fn write_preview(out: &mut dyn Write, p: &Value) -> std::io::Result<()> {
    writeln!(out, "upgrade {} ({}) from {} to {}", text(p, "serviceId"), text(p, "appId"), text(p, "from"), text(p, "to"))?;
    let (from, to) = (text(&p["image"], "from"), text(&p["image"], "to"));
    if from == to {
        writeln!(out, "  image:       {to} (unchanged)")?;
    } else {
        writeln!(out, "  image:       {from} -> {to}")?;
    }
    let keys = |field: &str| strings(&p[field]).join(", ");
    let mut environment = Vec::new();
    for (field, what) in [("environmentAdded", "added"), ("environmentRemoved", "removed"), ("environmentChanged", "changed")] {
        let keys = keys(field);
        if !keys.is_empty() {
            environment.push(format!("{what} {keys}"));
        }
    }
    if environment.is_empty() {
        writeln!(out, "  environment: no template key changes (keys you added stay)")?;
    } else {
        writeln!(out, "  environment: {} (keys you added stay)", environment.join("; "))?;
    }
    let changed = |field: &str| if p[field] == true { "changed" } else { "unchanged" };
    writeln!(out, "  ports:       {}", changed("portsChanged"))?;
    writeln!(out, "  volumes:     {}", changed("volumesChanged"))?;
    let notes = strings(&p["notes"]);
    if !notes.is_empty() {
        writeln!(out, "  release notes:")?;
        for note in notes {
            writeln!(out, "    {note}")?;
        }
    }
    Ok(())
}

/// Go ahead with `what` only when confirmed: with --yes, or with `y`/`yes` answered on a
/// terminal. Without a terminal it is refused `confirmation-required` rather than done
/// unasked; any other answer is refused `confirmation-declined`.
fn confirm(yes: bool, terminal: bool, what: &str, input: &mut dyn BufRead) -> Result<()> {
    if yes {
        return Ok(());
    }
    if !terminal {
        return Err(Refusal::new(
            "confirmation-required",
            format!("standard input is not a terminal, so nobody can confirm: {what}; read the preview and run again with --yes"),
        ));
    }
    eprint!("{what}? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    input
        .take(1024)
        .read_line(&mut line)
        .map_err(|e| Refusal::new("input-unreadable", format!("reading the answer failed: {}", e.kind())))?;
    if !std::io::stderr().is_terminal() {
        // the terminal echoed the answer elsewhere: end the question's line here
        eprintln!();
    }
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Refusal::new("confirmation-declined", format!("not done: {what} (the answer was not yes)"))),
    }
}

fn upgrade_service(upgrade: &Upgrade, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let service_ref = json!({ "id": upgrade.service_id });
    // the revision is read before the preview: a change after it is refused `conflict`
    let (organization, revision) = match &upgrade.organization {
        Some(organization) => {
            (organization.clone(), client.expected_or_current(upgrade.expected_revision, "services.get", &service_ref, "revision")?)
        }
        None => {
            let service = client.call("services.get", &service_ref)?;
            let organization = service["organizationId"].as_str().map(String::from).ok_or_else(|| {
                Refusal::new("response-invalid", "the answer of services.get holds no organizationId")
                    .with_data(json!({ "method": "services.get", "field": "organizationId" }))
            })?;
            let revision = match upgrade.expected_revision {
                Some(given) => given,
                None => service["revision"].as_u64().ok_or_else(|| {
                    Refusal::new("response-invalid", "the answer of services.get holds no revision")
                        .with_data(json!({ "method": "services.get", "field": "revision" }))
                })?,
            };
            (organization, revision)
        }
    };
    let mut body = json!({ "organizationId": organization, "serviceId": upgrade.service_id });
    if let Some(version) = &upgrade.version {
        body["version"] = json!(version);
    }
    let preview = client.call("appstore.getUpgradePreview", &body)?;
    // with --json, standard output carries only the answer: the preview goes to standard error
    let shown = if common.json { write_preview(&mut std::io::stderr(), &preview) } else { write_preview(&mut std::io::stdout(), &preview) };
    shown.map_err(|e| Refusal::new("output-failed", format!("printing the preview failed: {}", e.kind())))?;
    let what = format!("upgrade {} to {}", upgrade.service_id, text(&preview, "to"));
    let stdin = std::io::stdin();
    confirm(upgrade.yes, stdin.is_terminal(), &what, &mut stdin.lock())?;
    // exactly the version previewed, even if the catalog moved on meanwhile
    if let Some(to) = preview["to"].as_str() {
        body["version"] = json!(to);
    }
    body["expectedRevision"] = json!(revision);
    let answer = client.call("appstore.upgrade", &body)?;
    if common.json {
        print_json(&answer);
    } else {
        println!(
            "upgraded {} from {} to {}, revision {}",
            text(&answer, "id"),
            text(&answer, "from"),
            text(&answer, "to"),
            answer["revision"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_catalog::{App, AppVersion, Port, Protocol, Template, Volume};
    use std::collections::BTreeMap;

    fn app(env: &[(&str, &str)]) -> App {
        App {
            id: "wiki".into(),
            name: "Wiki".into(),
            description: String::new(),
            homepage: None,
            categories: vec![],
            versions: vec![AppVersion {
                version: "1.0.0".parse().unwrap(),
                notes: String::new(),
                withdrawn: None,
                template: Template {
                    image: "registry.example.com/wiki:1.0.0".into(),
                    ports: vec![Port { port: 8080, protocol: Protocol::Http, public_port: Some(80) }],
                    environment: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
                    volumes: vec![Volume { name: "data".into(), mount_path: "/var/lib/wiki".into() }],
                    capabilities: vec!["mail".into()],
                },
            }],
        }
    }

    #[test]
    fn an_upgrade_goes_ahead_only_when_confirmed() {
        let answer = |yes: bool, terminal: bool, typed: &[u8]| confirm(yes, terminal, "upgrade svc_1 to 1.1.0", &mut &typed[..]);
        answer(true, false, b"").unwrap();
        answer(true, true, b"n\n").unwrap();
        let refused = answer(false, false, b"y\n").unwrap_err();
        assert_eq!(refused.code, "confirmation-required");
        assert!(refused.message.contains("--yes"), "{}", refused.message);
        answer(false, true, b"y\n").unwrap();
        answer(false, true, b" YES \n").unwrap();
        for typed in [&b"\n"[..], b"", b"n\n", b"yess\n", &[b'y'; 5000]] {
            assert_eq!(answer(false, true, typed).unwrap_err().code, "confirmation-declined");
        }
    }

    #[test]
    fn a_preview_reads_for_people() {
        let preview = json!({
            "serviceId": "svc_1", "appId": "wiki", "from": "1.0.0", "to": "1.1.0",
            "image": { "from": "r/wiki:1.0.0", "to": "r/wiki:1.1.0" },
            "environmentAdded": ["A", "B"], "environmentRemoved": [], "environmentChanged": ["C"],
            "portsChanged": true, "volumesChanged": false, "notes": ["1.1.0: faster"],
        });
        let mut out = Vec::new();
        write_preview(&mut out, &preview).unwrap();
        let out = String::from_utf8(out).unwrap();
        for shown in [
            "upgrade svc_1 (wiki) from 1.0.0 to 1.1.0",
            "r/wiki:1.0.0 -> r/wiki:1.1.0",
            "added A, B; changed C",
            "ports:       changed",
            "volumes:     unchanged",
            "1.1.0: faster",
        ] {
            assert!(out.contains(shown), "{shown:?} in {out}");
        }
        // an answer missing fields still prints, with `-` for what is absent
        let mut out = Vec::new();
        write_preview(&mut out, &json!({})).unwrap();
        assert!(String::from_utf8(out).unwrap().starts_with("upgrade - (-) from - to -"));
    }

    #[test]
    fn templates_fit_services_create_and_meet_its_rules() {
        let dir = Path::new("/defs");
        let ok = Catalog { apps: vec![app(&[("LOG_LEVEL", "info")])] };
        check_templates(dir, &ok).unwrap();

        let secret = Catalog { apps: vec![app(&[("DB_PASSWORD", "hunter2")])] };
        let err = check_templates(dir, &secret).unwrap_err();
        assert_eq!(err.code, "app-definition-invalid");
        let data = err.data.as_deref().unwrap();
        assert_eq!(
            (data["file"].as_str(), data["field"].as_str(), data["rule"].as_str()),
            (Some("/defs/wiki.toml"), Some("versions[0].template.environment.DB_PASSWORD"), Some("environment-value-is-secret"))
        );
        assert!(!err.message.contains("hunter2"), "{}", err.message);

        let mut bad_image = ok.clone();
        bad_image.apps[0].versions[0].template.image = "Registry/App".into();
        let err = check_templates(dir, &bad_image).unwrap_err();
        assert_eq!(err.data.as_deref().unwrap()["field"], "versions[0].template.image");
        assert!(err.message.starts_with("/defs/wiki.toml: versions[0].template.image: "), "{}", err.message);

        let mut bad_port = ok.clone();
        bad_port.apps[0].versions[0].template.ports[0].port = 0;
        let err = check_templates(dir, &bad_port).unwrap_err();
        assert_eq!(err.data.as_deref().unwrap()["field"], "versions[0].template.ports[0]");
        assert!(err.message.starts_with("/defs/wiki.toml: versions[0].template.ports[0]: ports are 1–65535"), "{}", err.message);
    }
}
