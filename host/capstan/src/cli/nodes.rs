//! `capstan nodes list | get | jump | credential | rotate | revoke | set-hostname |
//! reset-hostname | retire | impact | delete | storage | set-database | set-object-storage`: clients of the `nodes.*` API methods of a running
//! host (administrators; docs/nodes.md).
//!
//! With `--json` each prints the API's answer exactly (one line); a refusal prints
//! `{"ok":false,"error":{…}}` on standard output and exits 1. Without it, output is for people
//! and a refusal is one `capstan: refused (<code>): <message>` line on standard error, exit 1.
//!
//! The jump code is the one secret shown here: `jump` prints it once, inside the command, and
//! Capstan keeps only its SHA-256. A node's token never reaches the CLI (the API answers
//! credential metadata only), and `rotate` takes the SHA-256 of material the agent drew.
//!
//! `set-database` and `set-object-storage` read the provider's admin password or secret key
//! from standard input (or `--prompt`) and seal it to the server's ingress recipient for this
//! node; it is never printed.
//!
//! Revoking, retiring and deleting ask for confirmation on a terminal; when standard input is
//! not a terminal they are refused `confirmation-required` unless `--yes` says so, before
//! anything is sent.

use super::client::{Client, finish, items, new_mutation_id, print_json, print_table, text, utc};
use super::confirm::{Confirm, ask, can_confirm};
use super::resolve::{self, Names};
use crate::refusal::Result;
use capstan_core::clock::now_ms;
use clap::Subcommand;
use serde_json::{Map, Value, json};
use std::process::ExitCode;

pub use super::client::Common;

#[derive(clap::Args)]
pub struct ExpectedRevision {
    /// The node revision you read (`capstan nodes get`). Without it the CLI reads the current
    /// revision first and writes against that; a change in between is still refused `conflict`
    #[arg(long, value_name = "N")]
    expected_revision: Option<u64>,
}

#[derive(Subcommand)]
pub enum NodesCommand {
    /// Nodes, paged: live state, hostname, hostname intent (pending or applied) and how long
    /// ago each last reported (`nodes.list`).
    ///
    /// A node is live while its last accepted report is younger than the setting
    /// nodeObservationFreshnessMs (default 3 minutes), else offline (or never-reported).
    List {
        /// Only this cluster's nodes (its name or id)
        #[arg(long, value_name = "NAME|ID")]
        cluster: Option<String>,
        /// Continue a listing after this cursor (a page that has more prints its next cursor)
        #[arg(long, value_name = "CURSOR")]
        cursor: Option<String>,
        /// At most this many nodes (1–200; default 50)
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        #[command(flatten)]
        common: Common,
    },
    /// One node: liveness, last report with the host's facts, hostname intent, credential
    /// generation, revision (`nodes.get`). Refuses `node-missing` for an id that names none.
    Get {
        /// The node's id (`node_…`)
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Create a jump command: the one line to run on a new machine to make it a node of the
    /// cluster (`nodes.createJumpCommand`).
    ///
    /// Prints the command and when its code expires. The code is inside the command and is
    /// shown this once: Capstan keeps only its SHA-256, and it works once. Refuses
    /// `cluster-not-found`, `name-invalid`, `hostname-in-use` (with --set-hostname: a node of
    /// the cluster carries or is meant to carry worker-<name>), `invalid-request` for a ttl
    /// outside 1–1440, and `public-origin-not-https` when Capstan's public origin is not https
    /// (outside dev mode; a dev host's command tells the agent so with --dev-host).
    Jump {
        /// The cluster the machine joins (its name or id)
        #[arg(long, value_name = "NAME|ID")]
        cluster: String,
        /// The node's name in Capstan (1–48 of a-z 0-9 -). Without it the node is named after
        /// the machine's hostname
        #[arg(long, value_name = "N")]
        name: Option<String>,
        /// Also rename the machine worker-<name> (hostnamectl, in the script). Without it the
        /// machine keeps its own hostname
        #[arg(long, requires = "name")]
        set_hostname: bool,
        /// Minutes the code stays usable (1–1440) [default: 30]
        #[arg(long, value_name = "M")]
        ttl_minutes: Option<u64>,
        #[command(flatten)]
        common: Common,
    },
    /// A node credential's metadata: generation, session epoch, state, when it was rotated
    /// or revoked (`nodes.getCredential`). Never the token or its hash.
    Credential {
        /// The node's id
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Make new token material the node's credential, by its SHA-256
    /// (`nodes.rotateCredential`).
    ///
    /// The material is drawn on the machine (`capstan-agent rotate` does all of this itself);
    /// the token never passes through here. The mutation id is generated unless given: the
    /// same id with the same request replays the recorded answer and changes nothing, so a
    /// rotation whose answer was lost is finished by running it again with the id printed.
    /// Refuses `conflict` (a stale generation), `credential-revoked`, `mutation-reused`, and
    /// `invalid-request` (not 64 lowercase hex characters, or the current token).
    Rotate {
        /// The node's id
        id: String,
        /// SHA-256 of the new 32-byte token, 64 lowercase hex characters
        #[arg(long, value_name = "H")]
        token_sha256: String,
        /// The credential generation you read (`capstan nodes credential`)
        #[arg(long, value_name = "G")]
        expected_generation: u64,
        /// Replay-safe id of this rotation (1–128 of A-Z a-z 0-9 - _ . :) [default: generated]
        #[arg(long, value_name = "ID")]
        mutation_id: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Revoke a node's credential for good: every beat it sends from now on is refused
    /// `node-unauthorized` (`nodes.revokeCredential`). The node record stays.
    ///
    /// Asks for confirmation on a terminal; refused `confirmation-required` without --yes when
    /// standard input is not a terminal. Refuses `credential-revoked` when it already is, and
    /// `conflict` for a stale --expected-generation.
    Revoke {
        /// The node's id
        id: String,
        /// The credential generation you read. Without it the CLI reads the current one first
        #[arg(long, value_name = "G")]
        expected_generation: Option<u64>,
        /// Replay-safe id of this revocation [default: generated]
        #[arg(long, value_name = "ID")]
        mutation_id: Option<String>,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
    /// Ask the node to carry a hostname (`nodes.setHostname`); its agent applies it and
    /// reports it on its next beat (the intent reads pending until then).
    ///
    /// Refuses `hostname-invalid` (not one lowercase DNS label), `hostname-in-use` (another
    /// node of the cluster carries or is meant to carry it), `hostname-unchanged`,
    /// `node-retired` and `conflict` (a stale generation).
    SetHostname {
        /// The node's id
        id: String,
        /// The hostname: 1–63 of a-z 0-9 -, not starting or ending with -
        hostname: String,
        /// The hostname intent's generation you read (`capstan nodes get`; 0 without an intent)
        #[arg(long, value_name = "G")]
        expected_generation: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Ask the node to carry the default hostname worker-<name> (`nodes.resetHostname`).
    ///
    /// Refuses as set-hostname does, and `name-invalid` for a name outside 1–48 of a-z 0-9 -.
    ResetHostname {
        /// The node's id
        id: String,
        /// The hostname intent's generation you read (`capstan nodes get`; 0 without an intent)
        #[arg(long, value_name = "G")]
        expected_generation: u64,
        /// The name for worker-<name> [default: the name of the current intent, else the
        /// node's name]
        #[arg(long, value_name = "N")]
        name: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Retire a node: its credential is revoked in the same step and it is kept as a record
    /// (`nodes.retire`); its hostname is free for another node.
    ///
    /// Asks for confirmation on a terminal; refused `confirmation-required` without --yes when
    /// standard input is not a terminal. Refuses `node-retired` when it already is.
    Retire {
        /// The node's id
        id: String,
        #[command(flatten)]
        expected: ExpectedRevision,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
    /// Whether a node can be deleted now, and what stands in the way (`nodes.getDeletionImpact`).
    Impact {
        /// The node's id
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// The storage endpoints a node states (`nodes.getStorageEndpoint`): its PostgreSQL server
    /// and admin role, never the password (docs/bindings.md).
    Storage {
        /// The node's id
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// State the node's PostgreSQL server, where database bindings of services on it are made
    /// (`nodes.setStorageEndpoint`; docs/bindings.md).
    ///
    /// The admin role needs CREATEROLE and CREATEDB (not superuser). Its password is read from
    /// standard input (`capstan nodes set-database node_… --host 10.0.0.5 --user capstan_admin <
    /// password-file`), or typed with --prompt; it is sealed for this node, checked against the
    /// server before anything is kept (`database-admin-rejected`, `database-endpoint-unreachable`)
    /// and never printed. --keep-password keeps the one held for the same user; --clear removes
    /// the endpoint.
    SetDatabase {
        /// The node's id
        id: String,
        /// Where workloads on the node (and Capstan) reach the server: an IP literal or a DNS name
        #[arg(long, required_unless_present = "clear")]
        host: Option<String>,
        /// The server's port
        #[arg(long, default_value_t = 5432)]
        port: u16,
        /// The admin role
        #[arg(long, required_unless_present = "clear")]
        user: Option<String>,
        /// Keep the password held for this user instead of reading a new one
        #[arg(long, conflicts_with = "clear")]
        keep_password: bool,
        /// Remove the node's database endpoint (bindings placed there then wait)
        #[arg(long, conflicts_with_all = ["host", "user"])]
        clear: bool,
        #[command(flatten)]
        input: super::secrets::ValueInput,
        #[command(flatten)]
        common: Common,
    },
    /// State the node's S3 endpoint, where object-storage bindings of services on it are made
    /// (`nodes.setStorageEndpoint`; docs/bindings.md).
    ///
    /// The admin key pair needs S3 and IAM rights (a bucket, a user and a key pair limited to
    /// the bucket per binding); its secret key is read from standard input (or typed with
    /// --prompt), sealed for this node, checked against the endpoint before anything is kept
    /// (`objectstorage-admin-rejected`, `objectstorage-users-unsupported`) and never printed.
    SetObjectStorage {
        /// The node's id
        id: String,
        /// The origin workloads on the node (and Capstan) reach it at: http(s)://host[:port]
        #[arg(long, required_unless_present = "clear")]
        endpoint: Option<String>,
        /// Its region
        #[arg(long, default_value = "us-east-1")]
        region: String,
        /// The admin key pair's id
        #[arg(long, required_unless_present = "clear")]
        access_key_id: Option<String>,
        /// Keep the secret key held for this key id instead of reading a new one
        #[arg(long, conflicts_with = "clear")]
        keep_secret: bool,
        /// Remove the node's S3 endpoint (bindings placed there then wait)
        #[arg(long, conflicts_with_all = ["endpoint", "access_key_id"])]
        clear: bool,
        #[command(flatten)]
        input: super::secrets::ValueInput,
        #[command(flatten)]
        common: Common,
    },
    /// Delete a retired node and its credential (`nodes.delete`); a cluster can be deleted
    /// once none of its nodes is left.
    ///
    /// Asks for confirmation on a terminal; refused `confirmation-required` without --yes when
    /// standard input is not a terminal. Refuses `node-not-retired` until it is retired.
    Delete {
        /// The node's id
        id: String,
        #[command(flatten)]
        expected: ExpectedRevision,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
}

pub fn run(command: NodesCommand) -> ExitCode {
    let (result, json) = match command {
        NodesCommand::List { cluster, cursor, limit, common } => (list(cluster, cursor, limit, &common), common.json),
        NodesCommand::Get { id, common } => (get(&id, &common), common.json),
        NodesCommand::Jump { cluster, name, set_hostname, ttl_minutes, common } => {
            (jump(&cluster, name, set_hostname, ttl_minutes, &common), common.json)
        }
        NodesCommand::Credential { id, common } => (credential(&id, &common), common.json),
        NodesCommand::Rotate { id, token_sha256, expected_generation, mutation_id, common } => {
            (rotate(&id, &token_sha256, expected_generation, mutation_id, &common), common.json)
        }
        NodesCommand::Revoke { id, expected_generation, mutation_id, confirm, common } => {
            (revoke(&id, expected_generation, mutation_id, &confirm, &common), common.json)
        }
        NodesCommand::SetHostname { id, hostname, expected_generation, common } => {
            (set_hostname(&id, &hostname, expected_generation, &common), common.json)
        }
        NodesCommand::ResetHostname { id, expected_generation, name, common } => {
            (reset_hostname(&id, expected_generation, name, &common), common.json)
        }
        NodesCommand::Retire { id, expected, confirm, common } => (retire(&id, &expected, &confirm, &common), common.json),
        NodesCommand::Impact { id, common } => (impact(&id, &common), common.json),
        NodesCommand::Delete { id, expected, confirm, common } => (delete(&id, &expected, &confirm, &common), common.json),
        NodesCommand::Storage { id, common } => (storage(&id, &common), common.json),
        NodesCommand::SetDatabase { id, host, port, user, keep_password, clear, input, common } => {
            // clap requires --host and --user unless --clear
            let database = match (clear, host, user) {
                (false, Some(host), Some(user)) => Some(DatabaseArgs { host, port, user, keep_password }),
                _ => None,
            };
            (set_database(&id, database, &input, &common), common.json)
        }
        NodesCommand::SetObjectStorage { id, endpoint, region, access_key_id, keep_secret, clear, input, common } => {
            // clap requires --endpoint and --access-key-id unless --clear
            let stated = match (clear, endpoint, access_key_id) {
                (false, Some(endpoint), Some(key)) => {
                    Some((json!({ "endpoint": endpoint, "region": region, "accessKeyId": key }), keep_secret))
                }
                _ => None,
            };
            (set_endpoint(&id, "objectStorage", "sealedSecretAccessKey", "the admin secret key", stated, &input, &common), common.json)
        }
    };
    finish(result, json)
}

// ---- reading a node for people ----

fn number(value: &Value, key: &str) -> String {
    value[key].as_u64().map_or_else(|| "?".into(), |n| n.to_string())
}

/// How long ago `at` (milliseconds since the epoch) was, seen from `now`: `12s ago`,
/// `5m ago`, `3h ago`, `2d ago`; `never` without one.
fn age(at: Option<u64>, now: u64) -> String {
    let Some(at) = at else { return "never".into() };
    let seconds = now.saturating_sub(at) / 1000;
    match seconds {
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86_400 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}

/// Where a node's hostname intent stands, as the host judged it (`intentStatus`): `-` without
/// one, else `pending`, `applied` or `failed`.
fn intent_state(node: &Value) -> &str {
    node["intentStatus"]["state"].as_str().unwrap_or("-")
}

/// The intent column: `worker-a (pending, gen 2)`, or `-`.
fn intent_text(node: &Value) -> String {
    match intent_state(node) {
        "-" => "-".into(),
        state => format!("{} ({state}, gen {})", text(&node["hostnameIntent"], "hostname"), number(&node["hostnameIntent"], "generation")),
    }
}

/// `live`, `offline`, `never-reported`; `retired` for a retired node.
fn liveness(node: &Value) -> &str {
    if node["state"] == "retired" { "retired" } else { text(node, "liveness") }
}

fn list(cluster: Option<String>, cursor: Option<String>, limit: Option<usize>, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let mut body = Map::new();
    if let Some(cluster) = &cluster {
        body.insert("clusterId".into(), json!(resolve::cluster(&client, cluster)?));
    }
    if let Some(cursor) = cursor {
        body.insert("cursor".into(), json!(cursor));
    }
    if let Some(limit) = limit {
        body.insert("limit".into(), json!(limit));
    }
    let answer = client.call("nodes.list", &Value::Object(body))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let clusters = Names::clusters(&client);
    let now = now_ms();
    let rows: Vec<Vec<String>> = items(&answer)
        .iter()
        .map(|n| {
            vec![
                text(n, "id").into(),
                clusters.show(text(n, "clusterId")),
                text(n, "name").into(),
                text(n, "hostname").into(),
                liveness(n).into(),
                age(n["lastReportAt"].as_u64(), now),
                intent_text(n),
            ]
        })
        .collect();
    if rows.is_empty() {
        match &cluster {
            Some(cluster) => println!("no nodes in {cluster}; add one with: capstan nodes jump --cluster {cluster}"),
            None => println!("no nodes; add one with: capstan nodes jump --cluster CLUSTER"),
        }
    } else {
        print_table(&["ID", "CLUSTER", "NAME", "HOSTNAME", "STATE", "LAST REPORT", "HOSTNAME INTENT"], &rows);
    }
    if let Some(cursor) = answer["nextCursor"].as_str() {
        println!("more: --cursor {cursor}");
    }
    Ok(())
}

fn bytes(value: &Value) -> String {
    let Some(n) = value.as_u64() else { return "?".into() };
    const GIB: u64 = 1 << 30;
    if n >= GIB { format!("{:.1} GiB", n as f64 / GIB as f64) } else { format!("{} MiB", n >> 20) }
}

fn print_node(n: &Value, clusters: &Names) {
    let now = now_ms();
    println!("node:        {} ({})", text(n, "name"), text(n, "id"));
    let cluster = text(n, "clusterId");
    match clusters.show(cluster) {
        name if name != cluster => println!("cluster:     {name} ({cluster})"),
        _ => println!("cluster:     {cluster}"),
    }
    println!("hostname:    {}", text(n, "hostname"));
    println!("state:       {} ({})", text(n, "state"), liveness(n));
    match n["lastReportAt"].as_u64() {
        Some(at) => println!("last report: {} ({})", utc(Some(at)), age(Some(at), now)),
        None => println!("last report: never"),
    }
    let intent = &n["hostnameIntent"];
    if intent.is_object() {
        println!(
            "intent:      {} ({}, generation {}, asked {} by {})",
            text(intent, "hostname"),
            intent_state(n),
            number(intent, "generation"),
            utc(intent["requestedAt"].as_u64()),
            text(intent, "requestedBy")
        );
    } else {
        println!("intent:      none (generation 0)");
    }
    println!("credential:  generation {}", number(n, "credentialGeneration"));
    println!("enrolled:    {}", utc(n["enrolledAt"].as_u64()));
    if let Some(at) = n["retiredAt"].as_u64() {
        println!("retired:     {}", utc(Some(at)));
    }
    println!("revision:    {}", number(n, "revision"));
    let report = &n["report"];
    if report.is_object() {
        println!("reported:");
        println!("  os:        {} (kernel {}, {})", text(report, "os"), text(report, "kernel"), text(report, "arch"));
        println!(
            "  cpus:      {}, memory {}, disk {} ({} free)",
            number(report, "cpus"),
            bytes(&report["memoryBytes"]),
            bytes(&report["diskBytes"]),
            bytes(&report["diskFreeBytes"])
        );
        println!("  agent:     {}, up {}s", text(report, "agentVersion"), number(report, "uptimeSeconds"));
        let addresses: Vec<&str> = report["addresses"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        println!("  addresses: {}", if addresses.is_empty() { "-".to_string() } else { addresses.join(", ") });
        // where a cluster's ingress and the mail gateway send this node's replicas traffic
        let reached = match (n["address"].as_str(), report["advertisedAddress"].is_string()) {
            (Some(address), true) => format!("{address} (advertised)"),
            (Some(address), false) => format!("{address} (its only address)"),
            (None, _) => "- (several addresses and none advertised: capstan-agent run --advertise-address IP)".to_string(),
        };
        println!("  reached:   {reached}");
        let apply = &report["hostApply"];
        if apply.is_object() {
            let reason = apply["reason"].as_str().map(|r| format!(": {r}")).unwrap_or_default();
            println!(
                "  applied:   {} {} (generation {}){reason}",
                text(apply, "outcome"),
                text(apply, "hostname"),
                number(apply, "generation")
            );
        }
    }
}

fn get(id: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let n = client.call("nodes.get", &json!({ "id": id }))?;
    if common.json {
        print_json(&n);
    } else {
        print_node(&n, &Names::clusters(&client));
    }
    Ok(())
}

// ---- storage endpoints ----

fn print_storage(answer: &Value) {
    match answer.get("database") {
        Some(db) => println!(
            "database: {} at {}:{} as {}",
            text(db, "engine"),
            text(db, "host"),
            db["port"].as_u64().unwrap_or(0),
            text(db, "user")
        ),
        None => println!("database: none stated (database bindings placed on this node wait)"),
    }
    match answer.get("objectStorage") {
        Some(o) => println!("object storage: {} ({}) as {}", text(o, "endpoint"), text(o, "region"), text(o, "accessKeyId")),
        None => println!("object storage: none stated (object-storage bindings placed on this node wait)"),
    }
}

fn storage(id: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let answer = client.call("nodes.getStorageEndpoint", &json!({ "nodeId": id }))?;
    if common.json {
        print_json(&answer);
    } else {
        print_storage(&answer);
    }
    Ok(())
}

struct DatabaseArgs {
    host: String,
    port: u16,
    user: String,
    keep_password: bool,
}

fn set_database(id: &str, database: Option<DatabaseArgs>, input: &super::secrets::ValueInput, common: &Common) -> Result<()> {
    let stated =
        database.map(|db| (json!({ "engine": "postgresql", "host": db.host, "port": db.port, "user": db.user }), db.keep_password));
    set_endpoint(id, "database", "sealedPassword", "the admin password", stated, input, common)
}

/// `nodes.setStorageEndpoint` for one of the node's endpoints (`field`): `stated` (and whether
/// to keep the credential held), or `None` to clear it; the credential read from `input` and
/// sealed for this node as `sealed_field`.
fn set_endpoint(
    id: &str,
    field: &str,
    sealed_field: &str,
    what: &str,
    stated: Option<(Value, bool)>,
    input: &super::secrets::ValueInput,
    common: &Common,
) -> Result<()> {
    // the credential is read (and refused when empty or oversized) before anything is sent
    let credential = match &stated {
        Some((_, false)) => Some(super::secrets::read_input(input, what)?),
        _ => None,
    };
    let client = Client::new(&common.connection)?;
    let held = client.call("nodes.getStorageEndpoint", &json!({ "nodeId": id }))?;
    let endpoint = match stated {
        None => Value::Null,
        Some((mut body, _)) => {
            if let Some(credential) = credential {
                let (recipient_id, public) = super::secrets::recipient(&client)?;
                let target = crate::secrets::ingress::target("nodes.setStorageEndpoint", id, field);
                let sealed = crate::secrets::ingress::seal_to(&recipient_id, &public, &target, &credential);
                body[sealed_field] = serde_json::to_value(sealed).map_err(crate::refusal::Refusal::internal)?;
            }
            body
        }
    };
    let answer =
        client.call("nodes.setStorageEndpoint", &json!({ "nodeId": id, "expectedRevision": held["revision"], field: endpoint }))?;
    if common.json {
        print_json(&answer);
    } else {
        print_storage(&answer);
    }
    Ok(())
}

// ---- jump codes ----

fn jump(cluster: &str, name: Option<String>, set_hostname: bool, ttl_minutes: Option<u64>, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let mut body = Map::new();
    body.insert("clusterId".into(), json!(resolve::cluster(&client, cluster)?));
    if let Some(name) = name {
        body.insert("nodeName".into(), json!(name));
    }
    if set_hostname {
        body.insert("setHostname".into(), json!(true));
    }
    if let Some(ttl) = ttl_minutes {
        body.insert("ttlMinutes".into(), json!(ttl));
    }
    let answer = client.call("nodes.createJumpCommand", &Value::Object(body))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let expires = answer["expiresAt"].as_u64();
    let left = expires.map(|at| at.saturating_sub(now_ms()) / 60_000).map(|m| format!(" (in {m} min)")).unwrap_or_default();
    println!("Run this on the new machine, as a user who may use sudo:");
    println!();
    println!("  {}", text(&answer, "command"));
    println!();
    println!("It works once, until {}{left}.", utc(expires));
    println!("The code in it is shown this once: Capstan keeps only its SHA-256.");
    Ok(())
}

// ---- credentials ----

fn print_credential(c: &Value) {
    println!("node:          {}", text(c, "nodeId"));
    println!("state:         {}", text(c, "state"));
    println!("generation:    {}", number(c, "generation"));
    println!("session epoch: {}", number(c, "sessionEpoch"));
    println!("rotated:       {}", utc(c["rotatedAt"].as_u64()));
    if let Some(at) = c["revokedAt"].as_u64() {
        println!("revoked:       {}", utc(Some(at)));
    }
}

fn credential(id: &str, common: &Common) -> Result<()> {
    let c = Client::new(&common.connection)?.call("nodes.getCredential", &json!({ "nodeId": id }))?;
    if common.json {
        print_json(&c);
    } else {
        print_credential(&c);
    }
    Ok(())
}

/// `call`, saying on standard error how to finish it safely when its answer may have been
/// lost (the server may have done it): run it again with the same mutation id.
fn call_replayable(client: &Client, method: &str, body: &Value, mutation_id: &str, again: &str) -> Result<Value> {
    client.call(method, body).inspect_err(|refusal| {
        if refusal.is("host-timeout") || refusal.is("host-unreachable") || refusal.retryable {
            eprintln!("capstan: the answer may be lost; finish it with: {again} --mutation-id {mutation_id}");
        }
    })
}

fn rotate(id: &str, token_sha256: &str, expected_generation: u64, mutation_id: Option<String>, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let mutation_id = mutation_id.unwrap_or_else(new_mutation_id);
    let body = json!({
        "nodeId": id,
        "tokenSha256": token_sha256,
        "expectedGeneration": expected_generation,
        "mutationId": mutation_id,
    });
    let again = format!("capstan nodes rotate {id} --token-sha256 <the same SHA-256> --expected-generation {expected_generation}");
    let c = call_replayable(&client, "nodes.rotateCredential", &body, &mutation_id, &again)?;
    if common.json {
        print_json(&c);
        return Ok(());
    }
    println!(
        "rotated the credential of {}: generation {}, session epoch {}",
        text(&c, "nodeId"),
        number(&c, "generation"),
        number(&c, "sessionEpoch")
    );
    println!("  mutation id {mutation_id} (the same request with it again replays this answer)");
    Ok(())
}

/// `name (hostname, id)` of a node, for a question.
fn describe(client: &Client, id: &str) -> Result<String> {
    let n = client.call("nodes.get", &json!({ "id": id }))?;
    Ok(format!("{} ({}, {}, {})", text(&n, "name"), text(&n, "hostname"), text(&n, "id"), liveness(&n)))
}

fn revoke(id: &str, expected_generation: Option<u64>, mutation_id: Option<String>, yes: &Confirm, common: &Common) -> Result<()> {
    can_confirm(yes)?;
    let client = Client::new(&common.connection)?;
    ask(yes, || Ok(format!("Revoke the credential of node {} for good? Every beat it sends will be refused.", describe(&client, id)?)))?;
    let generation = client.expected_or_current(expected_generation, "nodes.getCredential", &json!({ "nodeId": id }), "generation")?;
    let mutation_id = mutation_id.unwrap_or_else(new_mutation_id);
    let body = json!({ "nodeId": id, "expectedGeneration": generation, "mutationId": mutation_id });
    let again = format!("capstan nodes revoke {id} --yes --expected-generation {generation}");
    let c = call_replayable(&client, "nodes.revokeCredential", &body, &mutation_id, &again)?;
    if common.json {
        print_json(&c);
        return Ok(());
    }
    println!(
        "revoked the credential of {} (generation {}); its beats are refused from now on",
        text(&c, "nodeId"),
        number(&c, "generation")
    );
    println!("  retire it (capstan nodes retire {id}) to free its hostname, or enroll the machine again with a new jump code");
    Ok(())
}

// ---- hostname intents ----

fn print_intent_written(n: &Value) {
    let intent = &n["hostnameIntent"];
    println!(
        "node {} is to carry {} (intent generation {}); its agent applies it and reports it on its next beat",
        text(n, "id"),
        text(intent, "hostname"),
        number(intent, "generation")
    );
}

fn set_hostname(id: &str, hostname: &str, expected_generation: u64, common: &Common) -> Result<()> {
    let body = json!({ "nodeId": id, "expectedGeneration": expected_generation, "hostname": hostname });
    let n = Client::new(&common.connection)?.call("nodes.setHostname", &body)?;
    if common.json {
        print_json(&n);
    } else {
        print_intent_written(&n);
    }
    Ok(())
}

fn reset_hostname(id: &str, expected_generation: u64, name: Option<String>, common: &Common) -> Result<()> {
    let mut body = json!({ "nodeId": id, "expectedGeneration": expected_generation });
    if let Some(name) = name {
        body["name"] = json!(name);
    }
    let n = Client::new(&common.connection)?.call("nodes.resetHostname", &body)?;
    if common.json {
        print_json(&n);
    } else {
        print_intent_written(&n);
    }
    Ok(())
}

// ---- retirement ----

fn retire(id: &str, expected: &ExpectedRevision, yes: &Confirm, common: &Common) -> Result<()> {
    can_confirm(yes)?;
    let client = Client::new(&common.connection)?;
    ask(yes, || {
        Ok(format!("Retire node {}? Its credential is revoked and it stops counting as a machine of the cluster.", describe(&client, id)?))
    })?;
    let revision = client.expected_or_current(expected.expected_revision, "nodes.get", &json!({ "id": id }), "revision")?;
    let n = client.call("nodes.retire", &json!({ "id": id, "expectedRevision": revision }))?;
    if common.json {
        print_json(&n);
        return Ok(());
    }
    println!(
        "retired node {} ({}); its credential is revoked (generation {}) and its hostname is free",
        text(&n, "id"),
        text(&n, "hostname"),
        number(&n, "credentialGeneration")
    );
    println!("  delete the record with: capstan nodes delete {}", text(&n, "id"));
    Ok(())
}

fn impact(id: &str, common: &Common) -> Result<()> {
    let answer = Client::new(&common.connection)?.call("nodes.getDeletionImpact", &json!({ "id": id }))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let blockers = answer["blockers"].as_array().map(Vec::as_slice).unwrap_or_default();
    println!("node:    {}", text(&answer, "id"));
    println!("retired: {}", if answer["retired"] == true { "yes" } else { "no" });
    if blockers.is_empty() {
        println!("it can be deleted: capstan nodes delete {}", text(&answer, "id"));
    } else {
        println!("deleting it is refused:");
        for blocker in blockers {
            println!("  {}: {}", text(blocker, "code"), text(blocker, "message"));
        }
    }
    Ok(())
}

fn delete(id: &str, expected: &ExpectedRevision, yes: &Confirm, common: &Common) -> Result<()> {
    can_confirm(yes)?;
    let client = Client::new(&common.connection)?;
    ask(yes, || Ok(format!("Delete node {} and its credential for good?", describe(&client, id)?)))?;
    let revision = client.expected_or_current(expected.expected_revision, "nodes.get", &json!({ "id": id }), "revision")?;
    let answer = client.call("nodes.delete", &json!({ "id": id, "expectedRevision": revision }))?;
    if common.json {
        print_json(&answer);
    } else {
        println!("deleted node {} and its credential", text(&answer, "id"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_for_people() {
        assert_eq!(age(None, 5), "never");
        assert_eq!(age(Some(1_000), 13_500), "12s ago");
        assert_eq!(age(Some(0), 5 * 60_000), "5m ago");
        assert_eq!(age(Some(0), 3 * 3_600_000 + 1), "3h ago");
        assert_eq!(age(Some(0), 2 * 86_400_000), "2d ago");
        assert_eq!(age(Some(10_000), 5_000), "0s ago", "a clock behind the server's reads as now");
    }

    #[test]
    fn an_intent_reads_as_the_host_judged_it() {
        let intent = json!({ "hostname": "web-1", "generation": 2, "requestedAt": 100, "requestedBy": "u" });
        assert_eq!(intent_text(&json!({ "hostname": "a", "hostnameIntent": null })), "-");
        let pending = json!({ "hostname": "a", "hostnameIntent": intent, "intentStatus": { "state": "pending" } });
        assert_eq!(intent_text(&pending), "web-1 (pending, gen 2)");
        let failed = json!({ "hostname": "a", "hostnameIntent": intent, "intentStatus": { "state": "failed", "reason": "no root" } });
        assert_eq!(intent_state(&failed), "failed");
    }

    #[test]
    fn mutation_ids_are_what_the_server_accepts() {
        let id = new_mutation_id();
        assert_eq!(id.len(), 36);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert_ne!(id, new_mutation_id());
    }
}
