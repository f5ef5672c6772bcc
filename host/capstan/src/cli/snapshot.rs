//! `capstan snapshot`: snapshots of Capstan itself (docs/backups.md, "Snapshots of Capstan").
//!
//! `create --to-bucket` asks a running host (`system.createSnapshot`, administrators) to write
//! one into its blob store under `_capstan/snapshots/`. `create --to FILE` and `restore FILE`
//! are offline, like `capstan admin reset-password`: they open the store and blobs `serve`
//! would open (the same --dev/--data-dir, --config or CAPSTAN_* variables) and never talk to a
//! server. A copy to a file reads the documents in one read-only transaction, so it is
//! consistent while the host serves; a restore writes only into an empty store and blob store,
//! which no host may be serving. `verify FILE` checks a file without touching any store.

use super::client::{Common, finish, print_json};
use super::progress::Progress;
use crate::blobs::Blobs;
use crate::config::{self, Flags};
use crate::refusal::{Refusal, Result};
use crate::store::{Store, StoreOptions};
use capstan_server::snapshot::{self, Manifest, Part};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot Capstan: every collection (the host's and the plugins') and the plugins'
    /// blobs, with a manifest of hashes. The keyring is never in it: keep the keyring apart.
    ///
    /// --to FILE: offline, from the store and blobs this machine's configuration names (the
    /// host may keep serving; the documents are read in one transaction). --to-bucket: the
    /// running host at --url writes it into its blob store under _capstan/snapshots/
    /// (system.createSnapshot, administrators).
    Create(CreateArgs),
    /// Restore a snapshot file into an empty store and blob store (the ones the configuration
    /// names; no host may be serving on them), after checking every hash and the data version.
    /// Works across backends: a dev host's SQLite snapshot restores into MongoDB. Start
    /// `capstan serve` on it afterwards with the keyring the snapshot was taken under.
    Restore(RestoreArgs),
    /// Check a snapshot file (every hash, its format) and print its manifest; touches no store.
    Verify {
        /// The snapshot file
        file: PathBuf,
        /// Print the manifest as one line of JSON
        #[arg(long)]
        json: bool,
    },
}

/// Where the offline commands (`snapshot`, `admin reset-password`) find the store, blobs and
/// keyring: as `serve` would.
#[derive(Args)]
pub struct Local {
    /// The host is a dev host (`capstan serve --dev`): its store, blobs and keyring are under --data-dir
    #[arg(long)]
    dev: bool,
    /// --dev only: where the embedded data lives [env: CAPSTAN_DATA_DIR] [default: ./capstan-data]
    #[arg(long, value_name = "DIR", requires = "dev")]
    data_dir: Option<PathBuf>,
    /// A TOML file with the host's variables (keys lower-case, without CAPSTAN_) [env: CAPSTAN_CONFIG]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Args)]
#[group(id = "destination", required = true, multiple = false, args = ["to", "to_bucket"])]
pub struct CreateArgs {
    /// Write a new file (mode 0600; an existing file is refused), offline
    #[arg(long, value_name = "FILE")]
    to: Option<PathBuf>,
    /// Have the running host at --url write it into its blob store under _capstan/snapshots/
    /// (the host's own store and blobs: --dev, --data-dir and --config do not apply)
    #[arg(long, conflicts_with_all = ["dev", "data_dir", "config"])]
    to_bucket: bool,
    #[command(flatten)]
    local: Local,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
pub struct RestoreArgs {
    /// The snapshot file
    file: PathBuf,
    #[command(flatten)]
    local: Local,
    /// Print the answer as one line of JSON
    #[arg(long)]
    json: bool,
}

pub fn run(command: SnapshotCommand) -> ExitCode {
    match command {
        SnapshotCommand::Create(args) => {
            let json = args.common.json;
            finish(create(args), json)
        }
        SnapshotCommand::Restore(args) => {
            let json = args.json;
            finish(offline(|| restore(args)), json)
        }
        SnapshotCommand::Verify { file, json } => finish(offline(|| verify(&file, json)), json),
    }
}

fn offline<T, F: std::future::Future<Output = Result<T>>>(work: impl FnOnce() -> F) -> Result<T> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(Refusal::internal)?;
    super::without_sigpipe(|| runtime.block_on(work()))
}

fn create(args: CreateArgs) -> Result<()> {
    let json = args.common.json;
    let answer = match &args.to {
        None => {
            let client = super::client::Client::new(&args.common.connection)?;
            let progress = Progress::spinner("the host is writing a snapshot into its bucket");
            let answer = client.call("system.createSnapshot", &json!({}))?;
            drop(progress);
            answer
        }
        Some(path) => offline(|| async {
            let (store, blobs) = open(&args.local, Purpose::Create).await?;
            let progress = Progress::spinner("copying the store");
            let told = |part: &Part| progress.set_message(format!("copied {}", part.label()));
            let written = snapshot::write_file(&store, &blobs, path, &told).await?;
            drop(progress);
            let created = snapshot::Created::new(path.display().to_string(), written);
            serde_json::to_value(created).map_err(Refusal::internal)
        })
        .map(|mut value| {
            // a file has a path, not a bucket key
            if let Some(members) = value.as_object_mut()
                && let Some(path) = members.remove("key")
            {
                members.insert("file".into(), path);
            }
            value
        })?,
    };
    if json {
        print_json(&answer);
        return Ok(());
    }
    let place = answer["key"].as_str().map(|k| format!("the bucket at {k}")).or_else(|| answer["file"].as_str().map(str::to_string));
    println!("snapshot written to {}", place.unwrap_or_default());
    println!(
        "  {} bytes, sha256 {}; {} collections, {} documents, {} blobs; data version {}",
        answer["bytes"],
        answer["sha256"].as_str().unwrap_or("-"),
        answer["collections"],
        answer["documents"],
        answer["blobs"],
        answer["dataVersion"].as_str().unwrap_or("-")
    );
    println!("{}", answer["keyringNotice"].as_str().unwrap_or(snapshot::KEYRING_NOTICE));
    Ok(())
}

#[derive(PartialEq)]
enum Purpose {
    Create,
    Restore,
}

impl Local {
    /// The flags `serve` would be started with.
    pub fn flags(&self) -> Flags {
        Flags { dev: self.dev, data_dir: self.data_dir.clone(), config_file: self.config.clone(), ..Flags::default() }
    }
}

/// The store and blobs `serve` would open with the same flags and environment, and the keyring
/// path it would read (checked to exist for a restore, never created).
async fn open(local: &Local, purpose: Purpose) -> Result<(Store, Blobs)> {
    let flags = local.flags();
    let env = std::env::vars().filter(|(k, _)| k.starts_with("CAPSTAN_")).collect();
    let config = config::resolve(&flags, &env)?;
    if purpose == Purpose::Create {
        if let Some(dir) = &config.data_dir
            && !dir.is_dir()
        {
            return Err(Refusal::new("store-not-found", format!("no dev host's data is at {}", dir.display())));
        }
        // opening a SQLite store creates its file: a path that holds none is refused first
        if let Some(file) = config.database_url.strip_prefix("sqlite:")
            && !file.is_empty()
            && !Path::new(file).exists()
        {
            return Err(Refusal::new("store-not-found", format!("no store is at {file}: has this host started?")));
        }
    }
    let options = StoreOptions { database_name: config.database_name.clone(), budget: config.request_budget };
    let store = Store::open(&config.database_url, &options).await?;
    store.ping().await?;
    let blobs = Blobs::open(&config.blob_url, &config.s3).await?;
    Ok((store, blobs))
}

async fn restore(args: RestoreArgs) -> Result<()> {
    let (store, blobs) = open(&args.local, Purpose::Restore).await?;
    let progress = Progress::spinner("checking every part of the snapshot");
    let told = |part: &Part| progress.set_message(format!("restored {}", part.label()));
    let restored = snapshot::restore(&args.file, &store, &blobs, &crate::migrate::host_chain(), &told).await?;
    drop(progress);
    if args.json {
        print_json(&json!({ "ok": true, "restored": restored, "store": store.describe(), "blobs": blobs.describe() }));
        return Ok(());
    }
    println!(
        "restored {} collections, {} documents and {} blobs into {} and {}",
        restored.collections,
        restored.documents,
        restored.blobs,
        store.describe(),
        blobs.describe()
    );
    println!(
        "data version {}; start `capstan serve` on them with the keyring this snapshot was taken under.",
        data_version(&restored.manifest)
    );
    println!("{}", restored.manifest.keyring_notice);
    Ok(())
}

fn data_version(manifest: &Manifest) -> &str {
    manifest.data_version.as_deref().unwrap_or("-")
}

async fn verify(file: &Path, json: bool) -> Result<()> {
    let manifest = snapshot::verify(file).await?;
    if json {
        let value: Value = serde_json::to_value(&manifest).map_err(Refusal::internal)?;
        print_json(&json!({ "ok": true, "manifest": value }));
        return Ok(());
    }
    let collections = manifest.parts.iter().filter(|p| p.kind == "collection").count();
    println!("{}: a complete snapshot, every part verified", file.display());
    println!(
        "  taken {} by Capstan {}; data version {}",
        super::client::utc(Some(manifest.created_at)),
        manifest.capstan_version,
        data_version(&manifest)
    );
    println!("  {collections} collections, {} documents, {} blobs ({} bytes)", manifest.documents, manifest.blobs, manifest.blob_bytes);
    for ledger in &manifest.ledgers {
        println!("  ledger {}: data version {}", ledger.chain, ledger.data_version.as_deref().unwrap_or("-"));
    }
    println!("{}", manifest.keyring_notice);
    Ok(())
}
