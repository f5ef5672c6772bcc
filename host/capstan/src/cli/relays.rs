//! `capstan relays`: a cluster's relay in the operator's words — enable it (the origin minted,
//! the credential ensured, the next steps printed), export its bearer, list the relays that
//! registered, rotate the credential, disable it. Each reads the revision or generation it
//! writes against and draws its own mutation id; clusters are named by name or id
//! (docs/relays.md).

use super::client::{Client, Common, new_mutation_id, print_json, print_table, text, utc};
use super::confirm;
use super::resolve;
use crate::refusal::{Refusal, Result};
use clap::Subcommand;
use serde_json::{Value, json};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum RelaysCommand {
    /// Enable a cluster's relay: mint its origin from the setting clusterRelayZone, ensure its
    /// credential, and print what to run next (the export, then `capstan-agent relay` on one of
    /// the cluster's nodes). Running it again changes nothing and prints the same.
    ///
    /// Refuses `relay-zone-unset` (set it first: capstan settings set
    /// clusterRelayZone=relays.example.com), `cluster-not-found`, `conflict` (the cluster
    /// changed while this ran: run it again).
    Enable {
        /// The cluster (its name or id)
        cluster: String,
        #[command(flatten)]
        common: Common,
    },
    /// Write the relay's bearer to a private file, as `capstan keyring
    /// export-relay-authorization` does (mode 0600, never over an existing file unless --force).
    Export {
        /// The cluster (its name or id)
        cluster: String,
        #[command(flatten)]
        to: super::keyring::ExportTo,
        #[command(flatten)]
        common: Common,
    },
    /// The relays that registered: cluster, node, listen address, version, generation, whether a
    /// socket carries it now (`relays.list`).
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Replace the relay's bearer with a new generation (the current one read first); the relay
    /// is refused `relay-credential-generation-stale` until it runs with the new export.
    Rotate {
        /// The cluster (its name or id)
        cluster: String,
        #[command(flatten)]
        common: Common,
    },
    /// Disable a cluster's relay: its origin is removed (asks first on a terminal; --yes
    /// otherwise).
    Disable {
        /// The cluster (its name or id)
        cluster: String,
        #[command(flatten)]
        confirm: confirm::Confirm,
        #[command(flatten)]
        common: Common,
    },
}

/// Run `capstan relays …`.
pub fn run(command: RelaysCommand) -> ExitCode {
    let (result, json) = match command {
        RelaysCommand::Enable { cluster, common } => (enable(&cluster, &common), common.json),
        RelaysCommand::Export { cluster, to, common } => {
            let stdout = to.stdout;
            let exported = Client::new(&common.connection).and_then(|client| resolve::cluster(&client, &cluster)).and_then(|cluster| {
                let export = super::keyring::Export { cluster, to, json: common.json };
                super::keyring::export_relay_authorization(&common.connection, &export)
            });
            (exported, common.json && !stdout)
        }
        RelaysCommand::List { common } => (list(&common), common.json),
        RelaysCommand::Rotate { cluster, common } => (rotate(&cluster, &common), common.json),
        RelaysCommand::Disable { cluster, confirm, common } => (disable(&cluster, &confirm, &common), common.json),
    };
    super::client::finish(result, json)
}

/// The cluster `given` names, as `clusters.get` answers it.
fn cluster_of(client: &Client, given: &str) -> Result<Value> {
    let id = resolve::cluster(client, given)?;
    client.call("clusters.get", &json!({ "id": id }))
}

fn enable(given: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let mut cluster = cluster_of(&client, given)?;
    let id = text(&cluster, "id").to_string();
    if cluster["relay"]["enabled"] != true {
        cluster = client
            .call("clusters.enableRelay", &json!({ "id": id, "expectedRevision": cluster["revision"] }))
            .map_err(|refusal| match refusal.code.as_ref() {
                "relay-zone-unset" => Refusal::new(
                    "relay-zone-unset",
                    "no relay zone is set: set the DNS zone relays are reached under first (capstan settings set clusterRelayZone=relays.example.com), then run this again",
                ),
                _ => refusal,
            })?;
    }
    let credential = client.call(
        "relays.mutateCredential",
        &json!({ "clusterId": id, "action": "ensure", "expectedGeneration": null, "mutationId": new_mutation_id() }),
    )?;
    if common.json {
        print_json(&json!({ "clusterId": id, "relay": cluster["relay"], "credential": credential }));
        return Ok(());
    }
    let name = text(&cluster, "name");
    println!("relay of {name} ({id}) enabled");
    println!("  origin:     {}", text(&cluster["relay"], "origin"));
    println!("  credential: generation {}", credential["generation"]);
    println!();
    println!("Next, hand its bearer to the relay, on one of the cluster's enrolled nodes:");
    println!("  install -d -m 0700 ~/relay-export");
    println!("  capstan relays export {name} --out ~/relay-export/relay-authorization");
    println!("  # carry it to the node (scp -p), then there, as the agent's user:");
    println!("  capstan-agent relay --authorization-file /path/to/relay-authorization");
    Ok(())
}

fn list(common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let answer = client.call("relays.list", &json!({}))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let names = resolve::Names::clusters(&client);
    let items = super::client::items(&answer);
    if items.is_empty() {
        println!("No relay registered yet: `capstan relays enable CLUSTER` says how to start one.");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|r| {
            let listen = match (r["listenAddress"].as_str(), r["listenPort"].as_u64()) {
                (Some(address), Some(port)) => format!("{address}:{port}"),
                _ => "-".into(),
            };
            vec![
                names.show(text(r, "clusterId")),
                text(r, "nodeId").to_string(),
                listen,
                text(r, "version").to_string(),
                r["credential"]["generation"].as_u64().map_or("-".into(), |g| g.to_string()),
                if r["live"] == true { "live".into() } else { "socket gone".into() },
                utc(r["acceptedAt"].as_u64()),
            ]
        })
        .collect();
    print_table(&["CLUSTER", "NODE", "LISTEN", "VERSION", "GENERATION", "STATE", "SINCE"], &rows);
    Ok(())
}

fn rotate(given: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let id = resolve::cluster(&client, given)?;
    let current = client.call("relays.getCredential", &json!({ "clusterId": id }))?;
    let generation = current["credential"]["generation"].as_u64().ok_or_else(|| {
        Refusal::new(
            "relay-credential-absent",
            format!("the cluster {given} has no relay credential: capstan relays enable {given} ensures one"),
        )
    })?;
    let rotated = client.call(
        "relays.mutateCredential",
        &json!({ "clusterId": id, "action": "rotate", "expectedGeneration": generation, "mutationId": new_mutation_id() }),
    )?;
    if common.json {
        print_json(&rotated);
        return Ok(());
    }
    println!("relay credential of {given} rotated: generation {generation} → {}", rotated["generation"]);
    println!(
        "  export the new bearer (capstan relays export {given} --out FILE) and replace the relay's file; it reads it again by itself"
    );
    Ok(())
}

fn disable(given: &str, confirm: &confirm::Confirm, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let cluster = cluster_of(&client, given)?;
    let id = text(&cluster, "id").to_string();
    if cluster["relay"]["enabled"] != true {
        if common.json {
            print_json(&cluster);
        } else {
            println!("the relay of {given} is off already");
        }
        return Ok(());
    }
    confirm::ask(confirm, || {
        Ok(format!("Disable the relay of {given} ({id})? What runs through it stops, the node sessions it carries included."))
    })?;
    let answer = client.call("clusters.disableRelay", &json!({ "id": id, "expectedRevision": cluster["revision"] }))?;
    if common.json {
        print_json(&answer);
    } else {
        println!("relay of {given} disabled");
    }
    Ok(())
}
