//! `capstan-catalog sign | verify`: the App Store catalog publisher's tool (feature `cli`). It
//! runs offline: it never starts a host or talks to one. The format is this crate's (its
//! README and docs/appstore.md); an operator carries what `sign` writes to a host with
//! `capstan call appstore.importCatalog --set-file envelope=FILE`, or serves it from a catalog
//! source.
//!
//! Output is for people by default and one line of JSON with `--json`. A refusal prints
//! `capstan-catalog: refused (<code>): …` on standard error (with `--json`,
//! `{"ok":false,"error":{…}}` on standard output) and exits 1; a usage mistake exits 2.

use capstan_catalog::definitions::{self, DefinitionError};
use capstan_catalog::{
    App, AppVersion, Catalog, CatalogError, MAX_ENVELOPE_BYTES, Protocol, PublisherKey, Snapshot, Verified, check_succession, sign, verify,
};
use capstan_core::refusal::{Refusal, Result};
use capstan_field_rules::service::{self, PortRule};
use capstan_field_rules::validate;
use capstan_publisher_key::files::read_key_file;
use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit status of a refusal (a usage mistake is clap's 2).
const EXIT_REFUSED: u8 = 1;

#[derive(Parser)]
#[command(
    name = "capstan-catalog",
    version,
    about = "Sign and verify App Store catalogs: the catalog publisher's offline tool",
    long_about = "Sign and verify App Store catalogs: the catalog publisher's offline tool.\n\n\
        A catalog is a signed envelope (docs/appstore.md) listing apps, every version each was \
        published with and each version's service template. `sign` makes one from a directory of \
        app definitions with a key `capstan plugin keygen` wrote; `verify` checks one as a host \
        would. Neither starts or talks to a host: a host trusts the signing key in its \
        appstore.trustedCatalogKeys setting, fetches the catalog from appstore.catalogSources or is \
        handed it with `capstan call appstore.importCatalog --set-file envelope=FILE`.",
    after_long_help = "Examples:\n  \
        capstan plugin keygen --out catalog-key.pem     # once; prints the public key hosts trust\n  \
        capstan-catalog sign --apps ./apps --key catalog-key.pem --revision 8\n  \
        capstan-catalog verify catalog-8.json --trust capstan-ed25519:… --previous catalog-7.json"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sign a catalog from a directory of app definitions (one `<app id>.toml` per app).
    ///
    /// Every definition is checked against the catalog's rules and every template against the
    /// inventory's service rules (the ones an install would meet), each mistake named by its
    /// file and field (`app-definition-invalid`). The private key is the PKCS#8 PEM file
    /// `capstan plugin keygen` wrote (`input-permissions`, `key-file-invalid`, …). The envelope
    /// is written to a new file (default `catalog-<REVISION>.json`), never replacing one
    /// (`output-exists`: a revision is published once). Prints the output, the revision, the
    /// digest and the signing key.
    #[command(alias = "sign-catalog")]
    Sign {
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
    /// Refuses by name: `catalog-unreadable`, `catalog-malformed`,
    /// `catalog-contract-unsupported`, `catalog-digest-mismatch`, `catalog-signature-invalid`,
    /// `catalog-key-untrusted`. With --previous, also checks that the catalog may succeed that
    /// one (verified with the same keys): `catalog-revision-not-newer`,
    /// `catalog-version-removed`, `catalog-version-rewritten`, `catalog-version-reinstated`.
    #[command(alias = "verify-catalog")]
    Verify {
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
}

fn main() -> ExitCode {
    let (result, json) = match Cli::parse().command {
        Command::Sign { apps, key, revision, output, json } => (sign_catalog(&apps, &key, revision, output.as_deref(), json), json),
        Command::Verify { file, trust, previous, json } => (verify_catalog(&file, &trust, previous.as_deref(), json), json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(refusal) if json => {
            println!("{}", json!({ "ok": false, "error": refusal }));
            ExitCode::from(EXIT_REFUSED)
        }
        Err(refusal) => {
            eprintln!("capstan-catalog: refused ({}): {}", refusal.code, refusal.message);
            if let Some(detail) = &refusal.detail {
                eprintln!("  detail: {detail}");
            }
            ExitCode::from(EXIT_REFUSED)
        }
    }
}

/// A catalog refusal as the tool's refusal: the same code, message and data.
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
    let key = read_key_file(key_path)?;
    let envelope = sign(&catalog, revision, &key).map_err(|e| refusal(&e))?;
    let text = envelope.to_json();
    let signer = PublisherKey::from(&key);
    // what a reader will do with it, before anyone does
    let verified = verify(text.as_bytes(), std::slice::from_ref(&signer)).map_err(|e| refusal(&e))?;
    let default_output = PathBuf::from(format!("catalog-{revision}.json"));
    let output = output.unwrap_or(&default_output);
    capstan_core::private_file::write_new_public(output, format!("{text}\n").as_bytes())?;
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

/// The inventory's rules for the service an install makes of `version` (`services.create`
/// with the app's id as the service's name and the version's snapshot as its template), in the
/// order the inventory checks them; field names are the service's.
fn check_install(app: &App, version: &AppVersion) -> Result<()> {
    let t = &version.template;
    validate::name("name", &app.id)?;
    validate::image(&t.image)?;
    let ports: Vec<PortRule> =
        t.ports.iter().map(|p| PortRule { port: p.port, udp: p.protocol == Protocol::Udp, public_port: p.public_port }).collect();
    service::ports(&ports)?;
    service::environment(&t.environment)?;
    service::volumes(&t.volumes.iter().map(|v| (v.name.as_str(), v.mount_path.as_str())).collect::<Vec<_>>())?;
    service::template(&Snapshot::of(app, version, 1).to_value())
}

/// Check every template as `services.create` would check the service an install makes of it,
/// naming the file and the field.
fn check_templates(dir: &Path, catalog: &Catalog) -> Result<()> {
    for app in &catalog.apps {
        let file = dir.join(format!("{}.{}", app.id, definitions::DEFINITION_EXTENSION));
        for (i, version) in app.versions.iter().enumerate() {
            let field =
                |inner: &str| format!("versions[{i}].template{}", if inner.is_empty() { String::new() } else { format!(".{inner}") });
            if let Err(rule) = check_install(app, version) {
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
    let trusted = trust.iter().map(|t| t.trim().parse::<PublisherKey>().map_err(Refusal::from)).collect::<Result<Vec<_>>>()?;
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
        print!("{}", table(&["APP", "NAME", "NEWEST", "VERSIONS"], &rows));
    }
    Ok(())
}

/// `rows` under `header` for people: columns padded to their widest cell, the last one left as
/// it is; one line each.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: String = cells.zip(&widths).map(|(cell, width)| format!("{cell:<width$}  ")).collect();
        format!("{}\n", padded.trim_end())
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_catalog::{Port, Template, Volume};
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
                    platform_oidc: None,
                },
            }],
        }
    }

    #[test]
    fn templates_meet_the_inventory_s_service_rules() {
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

        let mut udp_and_tcp = ok.clone();
        let template = &mut udp_and_tcp.apps[0].versions[0].template;
        template.ports = vec![
            Port { port: 53, protocol: Protocol::Udp, public_port: None },
            Port { port: 53, protocol: Protocol::Tcp, public_port: None },
        ];
        check_templates(dir, &udp_and_tcp).unwrap();
        udp_and_tcp.apps[0].versions[0].template.ports[1].protocol = Protocol::Udp;
        let err = check_templates(dir, &udp_and_tcp).unwrap_err();
        assert_eq!(err.data.as_deref().unwrap()["rule"], "port-duplicate");

        let mut shared_volume = ok.clone();
        let volume = Volume { name: "logs".into(), mount_path: "/var/lib/wiki".into() };
        shared_volume.apps[0].versions[0].template.volumes.push(volume);
        let err = check_templates(dir, &shared_volume).unwrap_err();
        assert_eq!(err.data.as_deref().unwrap()["field"], "versions[0].template.volumes");
    }

    #[test]
    fn tables_pad_every_column_but_the_last() {
        let rows = vec![vec!["wiki".to_string(), "1.0.0, 1.1.0".to_string()], vec!["a".to_string(), "2".to_string()]];
        assert_eq!(table(&["APP", "VERSIONS"], &rows), "APP   VERSIONS\nwiki  1.0.0, 1.1.0\na     2\n");
    }
}
