//! `capstan fleet nodes | freeze | unfreeze` read and write the bucket directly, so no node has
//! to be up; `capstan fleet rebalance` asks the coordinator through any node's API;
//! `capstan wg init` prepares the WireGuard transport.

use super::client::{Client, Connection, finish, print_json, print_table};
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

/// Where the bucket is: the same configuration `serve` reads.
#[derive(clap::Args)]
pub struct BucketArgs {
    /// Read the dev-mode bucket under --data-dir
    #[arg(long)]
    dev: bool,
    /// --dev only: the data dir [env: CAPSTAN_DATA_DIR] [default: ./capstan-data]
    #[arg(long, value_name = "DIR", requires = "dev")]
    data_dir: Option<PathBuf>,
    /// The TOML configuration file [env: CAPSTAN_CONFIG]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum FleetCommand {
    /// List the nodes: totals, versions per binary, one row per node judged on one clock.
    Nodes {
        #[command(flatten)]
        bucket: BucketArgs,
        /// Print exact JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Freeze deploys (plugin installs and upgrades are refused `deploy-frozen`).
    Freeze {
        #[command(flatten)]
        bucket: BucketArgs,
        /// Why; shown to everyone who lists the fleet or is refused
        #[arg(long)]
        reason: String,
        /// Who is freezing [default: $USER]
        #[arg(long)]
        by: Option<String>,
    },
    /// Lift the deploy freeze.
    Unfreeze {
        #[command(flatten)]
        bucket: BucketArgs,
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

/// The bucket `serve` would use, and the liveness window it judges nodes by.
async fn open_bucket(args: &BucketArgs) -> Result<(Blobs, Timing)> {
    let flags = Flags { dev: args.dev, data_dir: args.data_dir.clone(), config_file: args.config.clone(), ..Flags::default() };
    let env = std::env::vars().filter(|(k, _)| k.starts_with("CAPSTAN_")).collect();
    let bucket = config::resolve_blobs(&flags, &env)?;
    let timing = Timing { liveness_window: bucket.liveness_window, ..Timing::default() };
    Ok((Blobs::open(&bucket.url, &bucket.s3).await?, timing))
}

pub fn run(command: FleetCommand) -> ExitCode {
    if let FleetCommand::Rebalance { connection, json } = &command {
        return finish(rebalance(connection, *json), *json);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return refuse(&Refusal::internal(e), 1),
    };
    // what the bucket answers is printed after the network work, outside `without_sigpipe`
    let result: Result<String> = super::without_sigpipe(|| {
        runtime.block_on(async {
            match command {
                FleetCommand::Nodes { bucket, json } => {
                    let (blobs, timing) = open_bucket(&bucket).await?;
                    let nodes = fleet::read_nodes(&blobs).await?;
                    let freeze = fleet::read_freeze(&blobs).await?;
                    let lease = lease::read_lease(&blobs).await?;
                    let listing = listing::build(capstan_core::clock::now_ms(), &timing, &nodes, freeze, lease);
                    if json {
                        Ok(format!("{}\n", serde_json::to_string(&listing).map_err(Refusal::internal)?))
                    } else {
                        Ok(listing::render(&listing))
                    }
                }
                FleetCommand::Freeze { bucket, reason, by } => {
                    let (blobs, _) = open_bucket(&bucket).await?;
                    let by = by.or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "unknown".into());
                    let freeze = fleet::freeze(&blobs, &by, &reason).await?;
                    Ok(format!("deploys frozen by {} : {}\n", freeze.by, freeze.reason))
                }
                // answered above, through the API
                FleetCommand::Rebalance { .. } => Ok(String::new()),
                FleetCommand::Unfreeze { bucket } => {
                    let (blobs, _) = open_bucket(&bucket).await?;
                    Ok(if fleet::unfreeze(&blobs).await? { "deploy freeze lifted\n" } else { "no deploy freeze was standing\n" }
                        .to_string())
                }
            }
        })
    });
    match result {
        Ok(printed) => {
            print!("{printed}");
            ExitCode::SUCCESS
        }
        Err(e) => refuse(&e, 1),
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
