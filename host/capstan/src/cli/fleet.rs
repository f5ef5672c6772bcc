//! `capstan fleet nodes | freeze | unfreeze | rebalance` ask any node's API; the first three also
//! read and write the bucket directly with `--from-storage`, for a fleet none of whose nodes is up;
//! `capstan wg init` prepares the WireGuard transport.

use super::client::{Client, Connection, finish, print_json, print_table, text};
use super::refuse;
use crate::blobs::Blobs;
use crate::config::{self, Flags};
use crate::fleet::{self, Timing, WIREGUARD_FILE, lease, listing};
use crate::refusal::{Refusal, Result};
use base64::Engine;
use capstan_core::private_file;
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

/// Where `fleet nodes | freeze | unfreeze` get the fleet: a node's API by default; the bucket
/// itself with `--from-storage`, for a fleet none of whose nodes answers.
#[derive(clap::Args)]
pub struct Source {
    #[command(flatten)]
    connection: Connection,
    /// Read and write the fleet's bucket directly instead of asking a node (for a fleet whose
    /// nodes are all down); the bucket is found from the same configuration `serve` reads
    #[arg(long)]
    from_storage: bool,
    /// --from-storage: read the dev-mode bucket under --data-dir
    #[arg(long, requires = "from_storage")]
    dev: bool,
    /// --from-storage --dev: the data dir [env: CAPSTAN_DATA_DIR] [default: ./capstan-data]
    #[arg(long, value_name = "DIR", requires = "dev")]
    data_dir: Option<PathBuf>,
    /// --from-storage: the TOML configuration file [env: CAPSTAN_CONFIG]
    #[arg(long, value_name = "FILE", requires = "from_storage")]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum FleetCommand {
    /// List the nodes: totals, versions per binary, one row per node judged on one clock.
    Nodes {
        #[command(flatten)]
        source: Source,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Freeze deploys (plugin installs and upgrades are refused `deploy-frozen`).
    Freeze {
        #[command(flatten)]
        source: Source,
        /// Why; shown to everyone who lists the fleet or is refused
        #[arg(long)]
        reason: String,
        /// --from-storage: who is freezing [default: $USER]; through a node it is the logged-in user
        #[arg(long, requires = "from_storage")]
        by: Option<String>,
    },
    /// Lift the deploy freeze.
    Unfreeze {
        #[command(flatten)]
        source: Source,
    },
    /// Decide now where background work runs (any node forwards this to the coordinator)
    /// and print the placements.
    Rebalance {
        #[command(flatten)]
        connection: Connection,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
}

fn rebalance(connection: &Connection, json: bool) -> Result<()> {
    let answer = Client::new(connection)?.call("fleet.rebalance", &serde_json::json!({}))?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let by = answer["decidedBy"].as_str().unwrap_or("?");
    println!("placements decided by {by} under fence {}", answer["fence"]);
    let rows: Vec<Vec<String>> = answer["placements"]
        .as_object()
        .map(|placements| {
            placements
                .iter()
                .map(|(work, nodes)| {
                    let nodes: Vec<&str> = nodes.as_array().map(|n| n.iter().filter_map(|n| n.as_str()).collect()).unwrap_or_default();
                    vec![work.clone(), if nodes.is_empty() { "(no eligible node)".into() } else { nodes.join(", ") }]
                })
                .collect()
        })
        .unwrap_or_default();
    print_table(&["WORK", "NODES"], &rows);
    Ok(())
}

#[derive(Subcommand)]
pub enum WgCommand {
    /// Create this node's WireGuard key pair (X25519) in its state directory, mode 0600.
    Init {
        /// The node's state directory [env: CAPSTAN_STATE_DIR]
        #[arg(long, value_name = "DIR", env = "CAPSTAN_STATE_DIR")]
        state_dir: PathBuf,
    },
}

/// The bucket `serve` would use, and the liveness window it judges nodes by. A local bucket
/// directory that is not there is refused rather than created: reading is all this is for.
async fn open_bucket(source: &Source) -> Result<(Blobs, Timing)> {
    let flags = Flags { dev: source.dev, data_dir: source.data_dir.clone(), config_file: source.config.clone(), ..Flags::default() };
    let env = std::env::vars().filter(|(k, _)| k.starts_with("CAPSTAN_")).collect();
    let bucket = config::resolve_blobs(&flags, &env)?;
    if let Some(dir) = bucket.url.strip_prefix("file:")
        && !std::path::Path::new(dir).is_dir()
    {
        return Err(Refusal::new("fleet-not-found", format!("no bucket directory at {dir}: no fleet has run with this configuration"))
            .with_data(serde_json::json!({ "bucket": bucket.url })));
    }
    let timing = Timing { liveness_window: bucket.liveness_window, ..Timing::default() };
    Ok((Blobs::open(&bucket.url, &bucket.s3).await?, timing))
}

/// The bucket's node records, refused `fleet-not-found` when it holds none: a wrong path or
/// bucket must not read as an empty fleet.
async fn fleet_nodes(blobs: &Blobs) -> Result<Vec<fleet::NodeRecord>> {
    let nodes = fleet::read_nodes(blobs).await?;
    if nodes.is_empty() {
        return Err(Refusal::new("fleet-not-found", "this bucket holds no node record: no fleet has run with this configuration"));
    }
    Ok(nodes)
}

pub fn run(command: FleetCommand) -> ExitCode {
    match command {
        FleetCommand::Rebalance { connection, json } => finish(rebalance(&connection, json), json),
        FleetCommand::Nodes { source, json } if !source.from_storage => finish(nodes(&source.connection, json), json),
        FleetCommand::Freeze { source, reason, .. } if !source.from_storage => finish(freeze(&source.connection, &reason), false),
        FleetCommand::Unfreeze { source } if !source.from_storage => finish(unfreeze(&source.connection), false),
        command => from_storage(command),
    }
}

/// `fleet nodes` through a node's API (`fleet.listNodes`).
fn nodes(connection: &Connection, json: bool) -> Result<()> {
    let answer = Client::new(connection)?.call("fleet.listNodes", &serde_json::json!({}))?;
    if json {
        print_json(&answer);
        return Ok(());
    }
    let listing: listing::Listing = serde_json::from_value(answer).map_err(Refusal::internal)?;
    print!("{}", listing::render(&listing));
    Ok(())
}

fn freeze(connection: &Connection, reason: &str) -> Result<()> {
    let freeze = Client::new(connection)?.call("fleet.freeze", &serde_json::json!({ "reason": reason }))?;
    println!("deploys frozen by {} : {}", text(&freeze, "by"), text(&freeze, "reason"));
    Ok(())
}

fn unfreeze(connection: &Connection) -> Result<()> {
    let answer = Client::new(connection)?.call("fleet.unfreeze", &serde_json::json!({}))?;
    println!("{}", if answer["lifted"] == true { "deploy freeze lifted" } else { "no deploy freeze was standing" });
    Ok(())
}

/// `fleet nodes | freeze | unfreeze --from-storage`: the bucket itself, no node needed.
fn from_storage(command: FleetCommand) -> ExitCode {
    let json = matches!(command, FleetCommand::Nodes { json: true, .. });
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return refuse(&Refusal::internal(e), 1),
    };
    // what the bucket answers is printed after the network work, outside `without_sigpipe`
    let result: Result<String> = super::without_sigpipe(|| {
        runtime.block_on(async {
            match command {
                FleetCommand::Nodes { source, json } => {
                    let (blobs, timing) = open_bucket(&source).await?;
                    let nodes = fleet_nodes(&blobs).await?;
                    let freeze = fleet::read_freeze(&blobs).await?;
                    let lease = lease::read_lease(&blobs).await?;
                    let listing = listing::build(capstan_core::clock::now_ms(), &timing, &nodes, freeze, lease);
                    if json {
                        Ok(super::output::render(&serde_json::to_value(&listing).map_err(Refusal::internal)?))
                    } else {
                        Ok(listing::render(&listing))
                    }
                }
                FleetCommand::Freeze { source, reason, by } => {
                    let (blobs, _) = open_bucket(&source).await?;
                    fleet_nodes(&blobs).await?;
                    let by = by.or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "unknown".into());
                    let freeze = fleet::freeze(&blobs, &by, &reason).await?;
                    Ok(format!("deploys frozen by {} : {}\n", freeze.by, freeze.reason))
                }
                FleetCommand::Unfreeze { source } => {
                    let (blobs, _) = open_bucket(&source).await?;
                    fleet_nodes(&blobs).await?;
                    Ok(if fleet::unfreeze(&blobs).await? { "deploy freeze lifted\n" } else { "no deploy freeze was standing\n" }
                        .to_string())
                }
                // answered through the API by `run`
                FleetCommand::Rebalance { .. } => Ok(String::new()),
            }
        })
    });
    match result {
        Ok(printed) => {
            print!("{printed}");
            ExitCode::SUCCESS
        }
        Err(e) => finish(Err(e), json),
    }
}

pub fn run_wg(command: WgCommand) -> ExitCode {
    let WgCommand::Init { state_dir } = command;
    // the state directory may not exist before the node's first start
    if let Err(e) = std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700).create(&state_dir) {
        return refuse(&Refusal::new("state-dir-unusable", format!("cannot create {}: {}", state_dir.display(), e.kind())), 1);
    }
    let secret = x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>());
    let public = base64::engine::general_purpose::STANDARD.encode(x25519_dalek::PublicKey::from(&secret).as_bytes());
    let file = serde_json::json!({
        "privateKey": base64::engine::general_purpose::STANDARD.encode(secret.to_bytes()),
        "publicKey": public,
    });
    let bytes = zeroize::Zeroizing::new(serde_json::to_vec_pretty(&file).expect("json"));
    match private_file::write_new(&state_dir.join(WIREGUARD_FILE), &bytes) {
        Ok(()) => {
            println!("wrote the WireGuard key pair; public key: {public}");
            ExitCode::SUCCESS
        }
        Err(e) => refuse(&e, 1),
    }
}
