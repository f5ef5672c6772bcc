//! `capstan services run | stop | status`: where a service runs (docs/runtime.md), clients of
//! `runtime.getServiceSpec`, `runtime.setServiceSpec` and `runtime.getServiceStatus`.
//!
//! `run` and `stop` read the spec of (service, cluster) first and write against the revision
//! they read — `null` when there is none (`spec-not-found`) — so a person never types a
//! revision, and a change between the read and the write is still refused `conflict`. `run`
//! states the whole spec: a flag left out takes its default (every active node, 1 replica per
//! node, restart on-failure, no health check), not what was stored; what it replaced is
//! printed. `stop` keeps the spec as stored and sets `hold`.
//!
//! Clusters and nodes are named by name or id. Their names are looked up with `clusters.list`
//! and `nodes.list`, which only administrators may call: anyone else gives ids (`cluster_…`,
//! `node_…`), and `status` shows ids where it cannot show names.

use super::client::{Client, Common, print_json, table, text, utc};
use super::resolve::{self, Candidate, Kind, Names};
use crate::refusal::{Refusal, Result};
use capstan_core::clock::now_ms;
use capstan_core::text::named_ids;
use clap::ValueEnum;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How often `status --watch` reads the status again.
const WATCH_EVERY: Duration = Duration::from_secs(2);
/// The longest cause a status table shows (the JSON answer has it whole).
const CAUSE_SHOWN: usize = 120;

// ---- arguments ----

/// What becomes of a replica that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RestartArg {
    /// Replaced after its backoff (10 s, doubling, at most 10 min)
    OnFailure,
    /// Kept failed until the spec or the image changes
    Never,
}

impl RestartArg {
    fn as_str(self) -> &'static str {
        match self {
            RestartArg::OnFailure => "on-failure",
            RestartArg::Never => "never",
        }
    }
}

/// A replica's health check as `--health` reads it: `none`, `tcp:PORT` or `http:PORT/PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthArg {
    /// No probe: a running container is ready.
    None,
    /// A TCP connection to the port.
    Tcp(u16),
    /// An HTTP GET of the path on the port.
    Http(u16, String),
}

impl HealthArg {
    /// The spec's `health` object (interval and threshold left to their defaults).
    fn to_json(&self) -> Value {
        match self {
            HealthArg::None => json!({ "kind": "none" }),
            HealthArg::Tcp(port) => json!({ "kind": "tcp", "port": port }),
            HealthArg::Http(port, path) => json!({ "kind": "http", "port": port, "path": path }),
        }
    }
}

const HEALTH_FORMS: &str = "none, tcp:PORT or http:PORT[/PATH] (e.g. tcp:5432, http:8080/healthz)";

/// `--health`: `none`, `tcp:PORT` or `http:PORT[/PATH]` (the path defaults to `/`). Only the
/// shape is judged here; the method judges the rest (a port the service declares:
/// `health-port-undeclared`).
pub fn parse_health(text: &str) -> std::result::Result<HealthArg, String> {
    let text = text.trim();
    let port = |digits: &str| -> std::result::Result<u16, String> {
        match digits.parse::<u16>() {
            Ok(port) if port > 0 => Ok(port),
            _ => Err(format!("{:?} is not a port (1–65535); write {HEALTH_FORMS}", digits.chars().take(20).collect::<String>())),
        }
    };
    if text == "none" {
        return Ok(HealthArg::None);
    }
    if let Some(rest) = text.strip_prefix("tcp:") {
        if rest.contains('/') {
            return Err(format!("a tcp check names a port only (tcp:PORT, e.g. tcp:5432), not a path; write {HEALTH_FORMS}"));
        }
        return port(rest).map(HealthArg::Tcp);
    }
    if let Some(rest) = text.strip_prefix("http:") {
        let (digits, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        let port = port(digits)?;
        if path.len() > 256 || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("the path of an http check is at most 256 bytes, without spaces or control characters".into());
        }
        return Ok(HealthArg::Http(port, path.to_string()));
    }
    Err(format!("{:?} is not a health check; write {HEALTH_FORMS}", text.chars().take(40).collect::<String>()))
}

/// `capstan services run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The service's name or id (`svc_…`)
    pub service: String,
    /// The cluster to run it on: its name or id (`cluster_…`)
    #[arg(long, value_name = "NAME|ID")]
    pub cluster: String,
    /// Run a replica set on every active node of the cluster (the default without --node)
    #[arg(long, conflicts_with = "nodes")]
    pub every_node: bool,
    /// Run on this node of the cluster only: its name, hostname or id (`node_…`); repeat for more
    #[arg(long = "node", value_name = "NAME|ID")]
    pub nodes: Vec<String>,
    /// Replicas on each placed node, 0–16 (a service with volumes runs at most 1 per node)
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub replicas: u32,
    /// Write the spec held: its replicas stop and the spec is kept (as `stop` does)
    #[arg(long)]
    pub hold: bool,
    /// What becomes of a replica that failed
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = RestartArg::OnFailure)]
    pub restart: RestartArg,
    /// How a replica's readiness is probed: none, tcp:PORT or http:PORT/PATH, on a port the
    /// service declares; ready after one passing probe, unhealthy after 3 failing in a row
    #[arg(long, value_name = "CHECK", default_value = "none", value_parser = parse_health)]
    pub health: HealthArg,
    /// Which environment's secrets the replicas get
    #[arg(long, value_name = "ENV", default_value = "production")]
    pub secrets_environment: String,
    /// Deliver this secret as the file /run/secrets/KEY (mode 0400, on a tmpfs) rather than an
    /// environment variable; repeat for more
    #[arg(long = "secret-file", value_name = "KEY")]
    pub secret_files: Vec<String>,
    /// The organization (name or id) to look the service's name up in
    #[arg(long, visible_alias = "org", value_name = "NAME|ID")]
    pub organization: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

/// `capstan services stop`.
#[derive(clap::Args)]
pub struct StopArgs {
    /// The service's name or id (`svc_…`)
    pub service: String,
    /// The cluster to stop it on: its name or id (`cluster_…`)
    #[arg(long, value_name = "NAME|ID")]
    pub cluster: String,
    /// The organization (name or id) to look the service's name up in
    #[arg(long, visible_alias = "org", value_name = "NAME|ID")]
    pub organization: Option<String>,
    #[command(flatten)]
    pub common: Common,
}

/// `capstan services status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// The service's name or id (`svc_…`)
    pub service: String,
    /// The organization (name or id) to look the service's name up in
    #[arg(long, visible_alias = "org", value_name = "NAME|ID")]
    pub organization: Option<String>,
    /// Read the status again every 2 seconds until interrupted (ctrl-c)
    #[arg(long)]
    pub watch: bool,
    #[command(flatten)]
    pub common: Common,
}

// ---- names ----

fn shorten(text: &str) -> String {
    let shown: String = text.chars().take(100).collect();
    if shown.len() < text.len() { format!("{shown}…") } else { shown }
}

/// A cluster's id from its name or id; a name asked by someone who may not list clusters is
/// refused naming what to give instead.
fn cluster_id(client: &Client, given: &str) -> Result<String> {
    resolve::cluster(client, given).map_err(|refusal| {
        if refusal.is("forbidden") {
            Refusal::new(
                "forbidden",
                format!(
                    "only administrators may list clusters, so the cluster {:?} cannot be looked up by name: give its id (cluster_…)",
                    shorten(given)
                ),
            )
            .with_data(json!({ "looked": shorten(given), "kind": "cluster" }))
        } else {
            refusal
        }
    })
}

/// The nodes of `cluster` that are not retired, as candidates for a name (their name and
/// hostname); `None` for a caller who may not list nodes.
fn node_candidates(client: &Client, cluster: &str) -> Result<Option<Vec<Candidate>>> {
    match resolve::list_all(client, "nodes.list", json!({ "clusterId": cluster }), "items") {
        Ok(nodes) => Ok(Some(
            nodes
                .iter()
                .filter(|n| n["state"] != "retired")
                .filter_map(|n| {
                    let id = n["id"].as_str()?.to_string();
                    let (name, hostname) = (text(n, "name").to_string(), text(n, "hostname").to_string());
                    Some(Candidate { shown: format!("node {name} ({hostname}, {id})"), names: vec![name, hostname], id })
                })
                .collect(),
        )),
        Err(refusal) if refusal.is("forbidden") => Ok(None),
        Err(refusal) => Err(refusal),
    }
}

/// The ids of the nodes `given` names in `cluster` (sorted, without duplicates, as a spec
/// states them), and the names of the nodes known, for what is printed.
fn resolve_nodes(client: &Client, given: &[String], cluster: &str, cluster_shown: &str) -> Result<(Vec<String>, BTreeMap<String, String>)> {
    let all_ids = given.iter().all(|g| Kind::Node.is_id(g));
    let candidates = match node_candidates(client, cluster) {
        Ok(candidates) => candidates,
        // names are a courtesy when every node is given by id: the method judges the ids
        Err(_) if all_ids => None,
        Err(refusal) => return Err(refusal),
    };
    let mut ids = BTreeSet::new();
    for text in given {
        let id = match &candidates {
            _ if Kind::Node.is_id(text) => text.clone(),
            Some(candidates) => resolve::pick(Kind::Node, text, &format!("in cluster {cluster_shown}"), candidates)?,
            None => {
                return Err(Refusal::new(
                    "forbidden",
                    format!(
                        "only administrators may list nodes, so the node {:?} cannot be looked up by name: give its id (node_…)",
                        shorten(text)
                    ),
                )
                .with_data(json!({ "looked": shorten(text), "kind": "node" })));
            }
        };
        ids.insert(id);
    }
    let names = candidates.unwrap_or_default().into_iter().filter_map(|c| Some((c.id, c.names.into_iter().next()?))).collect();
    Ok((ids.into_iter().collect(), names))
}

// ---- reading and describing a spec ----

/// The stored spec of (service, cluster), `None` when there is none.
fn current_spec(client: &Client, service: &str, cluster: &str) -> Result<Option<Value>> {
    match client.call("runtime.getServiceSpec", &json!({ "serviceId": service, "clusterId": cluster })) {
        Ok(answer) => Ok(answer["items"].as_array().and_then(|items| items.first()).cloned()),
        Err(refusal) if refusal.is("spec-not-found") => Ok(None),
        Err(refusal) => Err(refusal),
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A spec for people: `every active node, 1 replica per node, restart on-failure, no health
/// check`; pinned nodes by name where known.
pub fn spec_text(spec: &Value, node_names: &BTreeMap<String, String>) -> String {
    let placement = match spec["placement"]["nodes"].is_array() {
        true => {
            let shown = named_ids(&spec["placement"]["nodes"], node_names);
            format!("{} {}", if shown.len() == 1 { "node" } else { "nodes" }, shown.join(", "))
        }
        false => "every active node".to_string(),
    };
    let replicas = plural(spec["replicasPerNode"].as_u64().unwrap_or(0), "replica", "replicas");
    let health = &spec["health"];
    let health = match health["kind"].as_str() {
        Some("tcp") => format!("health tcp:{}", health["port"]),
        Some("http") => format!("health http:{}{}", health["port"], health["path"].as_str().unwrap_or("/")),
        _ => "no health check".to_string(),
    };
    let held_nodes = named_ids(&spec["heldNodes"], node_names);
    let held = match (spec["hold"] == true, held_nodes.is_empty()) {
        (true, _) => "held: nothing runs; ".to_string(),
        (false, false) => format!("held on {}; ", held_nodes.join(", ")),
        (false, true) => String::new(),
    };
    let files: Vec<&str> = spec["secrets"]["files"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let environment = spec["secrets"]["environment"].as_str().unwrap_or("production");
    let secrets = match (environment, files.is_empty()) {
        ("production", true) => String::new(),
        (environment, true) => format!(", {environment} secrets"),
        (environment, false) => format!(", {environment} secrets ({} as files)", files.join(", ")),
    };
    format!("{held}{placement}, {replicas} per node, restart {}, {health}{secrets}", text(spec, "restart"))
}

// ---- run ----

pub fn run(args: &RunArgs) -> Result<()> {
    let client = Client::new(&args.common.connection)?;
    let service = resolve::service(&client, &args.service, args.organization.as_deref())?;
    let cluster = cluster_id(&client, &args.cluster)?;
    let cluster_shown = resolve::shown(&args.cluster, &cluster);
    let (nodes, node_names) =
        if args.nodes.is_empty() { (Vec::new(), BTreeMap::new()) } else { resolve_nodes(&client, &args.nodes, &cluster, &cluster_shown)? };
    let previous = current_spec(&client, &service, &cluster)?;
    let placement = if nodes.is_empty() { json!({ "everyNode": true }) } else { json!({ "nodes": nodes }) };
    let body = json!({
        "serviceId": service,
        "clusterId": cluster,
        "expectedRevision": previous.as_ref().and_then(|p| p["revision"].as_u64()),
        "placement": placement,
        "replicasPerNode": args.replicas,
        "hold": args.hold,
        "restart": args.restart.as_str(),
        "health": args.health.to_json(),
        "secrets": { "environment": args.secrets_environment, "files": args.secret_files },
    });
    let written = client.call("runtime.setServiceSpec", &body)?;
    if args.common.json {
        print_json(&written);
        return Ok(());
    }
    let service_shown = resolve::shown(&args.service, &service);
    let now = spec_text(&written, &node_names);
    let revision = written["revision"].as_u64().unwrap_or(0);
    if written["hold"] == true {
        println!("{service_shown} is held on {cluster_shown}: its replicas stop, the spec is kept (spec revision {revision})");
    } else {
        println!("{service_shown} runs on {cluster_shown}: {now} (spec revision {revision})");
    }
    if let Some(previous) = &previous {
        let before = spec_text(previous, &node_names);
        if before != now {
            println!("  it was: {before}");
        }
    }
    println!("  follow it: capstan services status {}", args.service);
    Ok(())
}

/// The `capstan services run` that states `spec` again, held no more: only the flags whose
/// value is not their default.
pub fn run_command(service: &str, cluster: &str, spec: &Value) -> String {
    let mut command = format!("capstan services run {service} --cluster {cluster}");
    for node in spec["placement"]["nodes"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        command.push_str(&format!(" --node {node}"));
    }
    match spec["replicasPerNode"].as_u64() {
        Some(1) | None => {}
        Some(replicas) => command.push_str(&format!(" --replicas {replicas}")),
    }
    if spec["restart"] == "never" {
        command.push_str(" --restart never");
    }
    let health = &spec["health"];
    match health["kind"].as_str() {
        Some("tcp") => command.push_str(&format!(" --health tcp:{}", health["port"])),
        Some("http") => command.push_str(&format!(" --health http:{}{}", health["port"], health["path"].as_str().unwrap_or("/"))),
        _ => {}
    }
    let secrets = &spec["secrets"];
    if let Some(environment) = secrets["environment"].as_str().filter(|e| *e != "production") {
        command.push_str(&format!(" --secrets-environment {environment}"));
    }
    for file in secrets["files"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        command.push_str(&format!(" --secret-file {file}"));
    }
    command
}

// ---- stop ----

pub fn stop(args: &StopArgs) -> Result<()> {
    let client = Client::new(&args.common.connection)?;
    let service = resolve::service(&client, &args.service, args.organization.as_deref())?;
    let cluster = cluster_id(&client, &args.cluster)?;
    let (service_shown, cluster_shown) = (resolve::shown(&args.service, &service), resolve::shown(&args.cluster, &cluster));
    let Some(spec) = current_spec(&client, &service, &cluster)? else {
        return Err(Refusal::new(
            "spec-not-found",
            format!("{service_shown} has no runtime spec on {cluster_shown}: nothing runs there to stop"),
        )
        .with_data(json!({ "serviceId": service, "clusterId": cluster })));
    };
    let revision = spec["revision"].as_u64().unwrap_or(0);
    if spec["hold"] == true {
        if args.common.json {
            print_json(&spec);
        } else {
            println!("{service_shown} is already held on {cluster_shown}; nothing changed (spec revision {revision})");
            println!("  run it again: {}", run_command(&args.service, &args.cluster, &spec));
        }
        return Ok(());
    }
    let body = json!({
        "serviceId": service,
        "clusterId": cluster,
        "expectedRevision": revision,
        "placement": spec["placement"],
        "replicasPerNode": spec["replicasPerNode"],
        "hold": true,
        "restart": spec["restart"],
        "health": spec["health"],
        "secrets": spec["secrets"],
    });
    let written = client.call("runtime.setServiceSpec", &body)?;
    if args.common.json {
        print_json(&written);
        return Ok(());
    }
    println!(
        "{service_shown} is held on {cluster_shown}: its replicas stop, the spec is kept (spec revision {})",
        written["revision"].as_u64().unwrap_or(0)
    );
    println!("  run it again: {}", run_command(&args.service, &args.cluster, &written));
    Ok(())
}

// ---- status ----

/// Node names by cluster, read once per cluster (`nodes.list`, administrators) and again
/// only when a slot names a node not seen before.
#[derive(Default)]
struct NodeNames {
    by_cluster: BTreeMap<String, BTreeMap<String, String>>,
    /// `nodes.list` was refused: ids from now on.
    refused: bool,
}

impl NodeNames {
    fn learn(&mut self, client: &Client, answer: &Value) {
        for target in answer["targets"].as_array().into_iter().flatten() {
            let cluster = text(target, "clusterId").to_string();
            let known = self.by_cluster.get(&cluster);
            let unknown =
                target["slots"].as_array().into_iter().flatten().any(|s| known.is_none_or(|k| !k.contains_key(text(s, "nodeId"))));
            if self.refused || (known.is_some() && !unknown) {
                continue;
            }
            match node_candidates(client, &cluster) {
                Ok(Some(nodes)) => {
                    let names = nodes.into_iter().filter_map(|c| Some((c.id, c.names.into_iter().next()?))).collect();
                    self.by_cluster.insert(cluster, names);
                }
                Ok(None) => self.refused = true,
                // a courtesy: ids stand in
                Err(_) => {
                    self.by_cluster.entry(cluster).or_default();
                }
            }
        }
    }

    fn show(&self, cluster: &str, node: &str) -> String {
        self.by_cluster.get(cluster).and_then(|names| names.get(node)).cloned().unwrap_or_else(|| node.to_string())
    }
}

/// A verdict for people: `converged`, `converging`, `waiting (node-offline)`,
/// `refused (image-plan-missing)`.
pub fn verdict_text(verdict: &Value) -> String {
    match (verdict["state"].as_str(), verdict["reason"].as_str()) {
        (Some(state), Some(reason)) => format!("{state} ({reason})"),
        (Some(state), None) => state.to_string(),
        _ => "not decided yet (the runtime decides every few seconds)".to_string(),
    }
}

/// The first 12 hex digits of an image digest (`sha256:` dropped).
fn short_digest(digest: Option<&str>) -> String {
    match digest {
        Some(digest) => digest.strip_prefix("sha256:").unwrap_or(digest).chars().take(12).collect(),
        None => "-".into(),
    }
}

fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let shown: String = flat.chars().take(max).collect();
    if shown.len() < flat.len() { format!("{shown}…") } else { shown }
}

/// `runtime.getServiceStatus`'s answer for people: per cluster the spec, the verdict and the
/// slots' table.
pub fn status_text(
    answer: &Value,
    service: &str,
    cluster_name: &dyn Fn(&str) -> String,
    node_name: &dyn Fn(&str, &str) -> String,
) -> String {
    let targets = answer["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
    if targets.is_empty() {
        return format!(
            "{service} runs on no cluster: it has no runtime spec. Run it with: capstan services run {service} --cluster CLUSTER\n"
        );
    }
    let mut out = String::new();
    let plan = &answer["imagePlan"];
    match (plan["digest"].as_str(), plan["error"].as_str()) {
        (Some(digest), _) => out.push_str(&format!("image {} runs as {}\n", text(plan, "image"), short_digest(Some(digest)))),
        (None, Some(error)) => out.push_str(&format!(
            "image {}: its digest is not known yet, tried again at {}: {}\n",
            text(plan, "image"),
            utc(plan["retryAt"].as_u64()),
            one_line(error, CAUSE_SHOWN)
        )),
        (None, None) => {}
    }
    for (i, target) in targets.iter().enumerate() {
        if i > 0 || !out.is_empty() {
            out.push('\n');
        }
        let cluster = text(target, "clusterId");
        match cluster_name(cluster) {
            name if name != cluster => out.push_str(&format!("cluster {name} ({cluster})\n")),
            _ => out.push_str(&format!("cluster {cluster}\n")),
        }
        let spec = &target["spec"];
        let names = BTreeMap::new();
        let spec_shown = spec_text(spec, &names);
        let pinned: Vec<String> = spec["placement"]["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|id| node_name(cluster, id))
            .collect();
        let spec_shown = if pinned.is_empty() {
            spec_shown
        } else {
            let mut with_names = spec.clone();
            with_names["placement"]["nodes"] = json!(pinned);
            spec_text(&with_names, &names)
        };
        out.push_str(&format!("  spec:    {spec_shown} (revision {})\n", target["specRevision"].as_u64().unwrap_or(0)));
        let since = target["since"].as_u64().map(|at| format!(" since {}", utc(Some(at)))).unwrap_or_default();
        out.push_str(&format!("  verdict: {}{since}\n", verdict_text(&target["verdict"])));
        let slots = target["slots"].as_array().map(Vec::as_slice).unwrap_or_default();
        if slots.is_empty() {
            out.push_str("  no replica slots\n");
            continue;
        }
        let rows: Vec<Vec<String>> = slots
            .iter()
            .map(|s| {
                let slot = text(s, "slot");
                let index = slot.rsplit_once('.').map_or(slot, |(_, index)| index);
                let phase = text(s, "phase");
                let intent = text(s, "intent");
                let phase = if intent == "run" || matches!(phase, "stopped" | "removed") {
                    phase.to_string()
                } else {
                    format!("{phase} (to {intent})")
                };
                vec![
                    index.to_string(),
                    node_name(cluster, text(s, "nodeId")),
                    phase,
                    if s["ready"] == true { "yes" } else { "no" }.to_string(),
                    short_digest(s["imageDigest"].as_str()),
                    s["restarts"].as_u64().unwrap_or(0).to_string(),
                    s["cause"].as_str().map(|c| one_line(c, CAUSE_SHOWN)).unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        out.push_str(&table(&["SLOT", "NODE", "PHASE", "READY", "DIGEST", "RESTARTS", "CAUSE"], &rows));
    }
    out
}

pub fn status(args: &StatusArgs) -> Result<()> {
    let client = Client::new(&args.common.connection)?;
    let service = resolve::service(&client, &args.service, args.organization.as_deref())?;
    let shown = resolve::shown(&args.service, &service);
    let clusters = if args.common.json { Names::default() } else { Names::clusters(&client) };
    let mut nodes = NodeNames::default();
    let once = |nodes: &mut NodeNames| -> Result<()> {
        let answer = client.call("runtime.getServiceStatus", &json!({ "serviceId": service }))?;
        if args.common.json {
            print_json(&answer);
        } else {
            nodes.learn(&client, &answer);
            print!("{}", status_text(&answer, &shown, &|c| clusters.show(c), &|c, n| nodes.show(c, n)));
        }
        Ok(())
    };
    if !args.watch {
        return once(&mut nodes);
    }
    loop {
        if !args.common.json {
            println!("--- {} (every {} s; ctrl-c ends) ---", utc(Some(now_ms())), WATCH_EVERY.as_secs());
        }
        match once(&mut nodes) {
            Ok(()) => {}
            // a host restarting, a store busy: say so and read again
            Err(refusal) if refusal.retryable => eprintln!("capstan: not read this time ({}): {}", refusal.code, refusal.message),
            Err(refusal) => return Err(refusal),
        }
        std::thread::sleep(WATCH_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    #[test]
    fn health_checks_read_as_the_spec_takes_them() {
        assert_eq!(parse_health("none").unwrap(), HealthArg::None);
        assert_eq!(parse_health("tcp:5432").unwrap(), HealthArg::Tcp(5432));
        assert_eq!(parse_health("http:8080").unwrap(), HealthArg::Http(8080, "/".into()));
        assert_eq!(parse_health("http:8080/healthz?full=1").unwrap(), HealthArg::Http(8080, "/healthz?full=1".into()));
        assert_eq!(parse_health("http:80/").unwrap().to_json(), json!({ "kind": "http", "port": 80, "path": "/" }));
        assert_eq!(parse_health("tcp:22").unwrap().to_json(), json!({ "kind": "tcp", "port": 22 }));
        assert_eq!(parse_health("none").unwrap().to_json(), json!({ "kind": "none" }));
        for (bad, says) in [
            ("", "is not a health check"),
            ("udp:53", "is not a health check"),
            ("tcp", "is not a health check"),
            ("tcp:", "is not a port"),
            ("tcp:0", "is not a port"),
            ("tcp:70000", "is not a port"),
            ("tcp:abc", "is not a port"),
            ("tcp:80/x", "names a port only"),
            ("http:/healthz", "is not a port"),
            ("http:8080/a b", "without spaces"),
        ] {
            let error = parse_health(bad).unwrap_err();
            assert!(error.contains(says), "{bad:?}: {error}");
            assert!(says != "is not a health check" || error.contains("tcp:PORT"), "{bad:?} names the forms: {error}");
        }
        assert!(parse_health(&format!("http:80/{}", "a".repeat(300))).unwrap_err().contains("256 bytes"));
    }

    fn parsed(args: &[&str]) -> std::result::Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("capstan").chain(args.iter().copied()))
    }

    fn run_args(args: &[&str]) -> RunArgs {
        match parsed(args).unwrap_or_else(|e| panic!("{args:?}: {e}")).command {
            crate::cli::Command::Services(super::super::inventory::ServicesCommand::Run(run)) => run,
            _ => panic!("{args:?} is not services run"),
        }
    }

    #[test]
    fn run_reads_its_defaults_and_its_flags() {
        let run = run_args(&["services", "run", "web", "--cluster", "eu-1"]);
        assert_eq!((run.service.as_str(), run.cluster.as_str(), run.every_node, run.nodes.len()), ("web", "eu-1", false, 0));
        assert_eq!((run.replicas, run.hold, run.restart, run.health.clone()), (1, false, RestartArg::OnFailure, HealthArg::None));
        let run = run_args(&[
            "services",
            "run",
            "web",
            "--cluster",
            "eu-1",
            "--node",
            "alpha",
            "--node",
            "node_x",
            "--replicas",
            "2",
            "--hold",
            "--restart",
            "never",
            "--health",
            "http:8080/up",
            "--org",
            "acme",
            "--json",
        ]);
        assert_eq!(run.nodes, ["alpha", "node_x"]);
        assert_eq!((run.replicas, run.hold, run.restart), (2, true, RestartArg::Never));
        assert_eq!((run.health, run.organization.as_deref(), run.common.json), (HealthArg::Http(8080, "/up".into()), Some("acme"), true));
        assert_eq!(run_args(&["services", "run", "web", "--cluster", "c", "--organization", "acme"]).organization.as_deref(), Some("acme"));
        assert!(run_args(&["services", "run", "web", "--cluster", "c", "--every-node"]).every_node);

        let kind = |args: &[&str]| parsed(args).err().map(|e| e.kind());
        use clap::error::ErrorKind;
        assert_eq!(kind(&["services", "run", "web"]), Some(ErrorKind::MissingRequiredArgument), "--cluster is required");
        assert_eq!(kind(&["services", "run", "web", "--cluster", "c", "--every-node", "--node", "a"]), Some(ErrorKind::ArgumentConflict));
        assert_eq!(kind(&["services", "run", "web", "--cluster", "c", "--restart", "always"]), Some(ErrorKind::InvalidValue));
        assert_eq!(kind(&["services", "run", "web", "--cluster", "c", "--replicas", "-1"]), Some(ErrorKind::UnknownArgument));
        assert_eq!(kind(&["services", "run", "web", "--cluster", "c", "--replicas", "many"]), Some(ErrorKind::ValueValidation));
        let bad = parsed(&["services", "run", "web", "--cluster", "c", "--health", "http:eighty"]).err().unwrap();
        assert_eq!(bad.kind(), ErrorKind::ValueValidation);
        assert!(bad.to_string().contains("--health") && bad.to_string().contains("is not a port"), "{bad}");
    }

    #[test]
    fn stop_and_status_read_their_flags() {
        match parsed(&["services", "stop", "web", "--cluster", "eu-1", "--org", "acme"]).unwrap().command {
            crate::cli::Command::Services(super::super::inventory::ServicesCommand::Stop(stop)) => {
                assert_eq!((stop.service.as_str(), stop.cluster.as_str(), stop.organization.as_deref()), ("web", "eu-1", Some("acme")));
            }
            _ => panic!("not services stop"),
        }
        assert!(parsed(&["services", "stop", "web"]).is_err(), "stop names its cluster");
        match parsed(&["services", "status", "web", "--watch", "-o", "yaml"]).unwrap().command {
            crate::cli::Command::Services(super::super::inventory::ServicesCommand::Status(status)) => {
                assert!(status.watch && status.organization.is_none());
            }
            _ => panic!("not services status"),
        }
    }

    #[test]
    fn help_names_an_example() {
        for verb in ["run", "stop", "status"] {
            let error = parsed(&["services", verb, "--help"]).err().unwrap();
            let help = error.to_string();
            assert!(help.contains(&format!("capstan services {verb} web")), "{verb}: {help}");
        }
    }

    #[test]
    fn held_nodes_are_said_by_name_before_the_rest_of_the_spec() {
        let names = BTreeMap::from([("node_b".to_string(), "worker-b".to_string())]);
        let spec = json!({ "placement": { "everyNode": true }, "replicasPerNode": 1, "hold": false, "heldNodes": ["node_b"],
                           "restart": "on-failure", "health": { "kind": "none" } });
        assert_eq!(
            spec_text(&spec, &names),
            "held on worker-b; every active node, 1 replica per node, restart on-failure, no health check"
        );
        let whole = json!({ "placement": { "everyNode": true }, "replicasPerNode": 1, "hold": true, "heldNodes": ["node_b"],
                            "restart": "on-failure", "health": { "kind": "none" } });
        assert!(spec_text(&whole, &names).starts_with("held: nothing runs; "), "a whole hold says so alone");
    }

    #[test]
    fn a_held_spec_is_run_again_by_the_command_that_states_it() {
        let every = json!({ "placement": { "everyNode": true }, "replicasPerNode": 1, "hold": true, "restart": "on-failure",
                            "health": { "kind": "none" } });
        assert_eq!(run_command("web", "eu-1", &every), "capstan services run web --cluster eu-1");
        let pinned = json!({ "placement": { "nodes": ["node_a", "node_b"] }, "replicasPerNode": 2, "hold": true, "restart": "never",
                             "health": { "kind": "http", "port": 8080, "path": "/up", "intervalMs": 5000, "threshold": 3 } });
        assert_eq!(
            run_command("web", "eu-1", &pinned),
            "capstan services run web --cluster eu-1 --node node_a --node node_b --replicas 2 --restart never --health http:8080/up"
        );
        let tcp = json!({ "placement": { "everyNode": true }, "replicasPerNode": 0, "health": { "kind": "tcp", "port": 5432 } });
        assert_eq!(run_command("db", "c", &tcp), "capstan services run db --cluster c --replicas 0 --health tcp:5432");
    }

    #[test]
    fn a_status_reads_per_cluster_with_its_verdict_and_slots() {
        let digest = format!("sha256:{}", "ab12".repeat(16));
        let answer = json!({
            "serviceId": "svc_1",
            "targets": [
                {
                    "clusterId": "cluster_a", "specRevision": 2, "since": 1_700_000_000_000u64,
                    "spec": { "placement": { "nodes": ["node_a", "node_b"] }, "replicasPerNode": 1, "hold": false, "restart": "on-failure",
                              "health": { "kind": "http", "port": 8080, "path": "/up", "intervalMs": 5000, "threshold": 3 } },
                    "verdict": { "state": "waiting", "reason": "node-offline" },
                    "slots": [
                        { "slot": "node_a.0", "nodeId": "node_a", "assignmentId": "asg_1", "intent": "run", "phase": "running", "ready": true,
                          "imageDigest": digest, "restarts": 0, "cause": null },
                        { "slot": "node_b.0", "nodeId": "node_b", "assignmentId": "asg_2", "intent": "stop", "phase": "exited", "ready": false,
                          "imageDigest": null, "restarts": 3, "cause": "exited with status 1:\nout of memory" },
                    ],
                },
                {
                    "clusterId": "cluster_b", "specRevision": 1, "since": null,
                    "spec": { "placement": { "everyNode": true }, "replicasPerNode": 2, "hold": true, "restart": "never", "health": { "kind": "none" } },
                    "verdict": null,
                    "slots": [],
                },
            ],
        });
        let clusters = |c: &str| if c == "cluster_a" { "eu-1".to_string() } else { c.to_string() };
        let nodes = |_: &str, n: &str| if n == "node_a" { "alpha".to_string() } else { n.to_string() };
        let text = status_text(&answer, "web", &clusters, &nodes);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "cluster eu-1 (cluster_a)");
        assert_eq!(lines[1], "  spec:    nodes alpha, node_b, 1 replica per node, restart on-failure, health http:8080/up (revision 2)");
        assert_eq!(lines[2], "  verdict: waiting (node-offline) since 2023-11-14 22:13:20 UTC");
        assert!(lines[3].starts_with("SLOT") && lines[3].contains("DIGEST") && lines[3].ends_with("CAUSE"), "{text}");
        assert!(
            lines[4].starts_with("0 ") && lines[4].contains("alpha") && lines[4].contains(" running ") && lines[4].contains(" yes "),
            "{text}"
        );
        assert!(lines[4].contains(" ab12ab12ab12 ") && !lines[4].contains("ab12ab12ab12a"), "12 hex digits: {text}");
        assert!(
            lines[5].contains("node_b")
                && lines[5].contains("exited (to stop)")
                && lines[5].contains(" 3 ")
                && lines[5].ends_with(" exited with status 1: out of memory"),
            "{text}"
        );
        assert_eq!(lines[6], "");
        assert_eq!(lines[7], "cluster cluster_b");
        assert_eq!(
            lines[8],
            "  spec:    held: nothing runs; every active node, 2 replicas per node, restart never, no health check (revision 1)"
        );
        assert_eq!(lines[9], "  verdict: not decided yet (the runtime decides every few seconds)");
        assert_eq!(lines[10], "  no replica slots");

        // an image named by tag: the digest it runs as, or why that is not known yet
        let mut tagged = answer.clone();
        tagged["imagePlan"] = json!({ "image": "nginx:1.27", "digest": format!("sha256:{}", "ab".repeat(32)) });
        let shown = status_text(&tagged, "web", &clusters, &nodes);
        assert!(shown.starts_with("image nginx:1.27 runs as abababababab\n\ncluster "), "{shown}");
        tagged["imagePlan"] = json!({ "image": "nginx:1.27", "error": "asking docker.io: timed out", "retryAt": 0 });
        let shown = status_text(&tagged, "web", &clusters, &nodes);
        assert!(shown.starts_with("image nginx:1.27: its digest is not known yet, tried again at 1970-01-01"), "{shown}");
        assert!(shown.lines().next().unwrap().ends_with(": asking docker.io: timed out"), "{shown}");

        let nowhere = status_text(&json!({ "serviceId": "svc_1", "targets": [] }), "web", &clusters, &nodes);
        assert!(nowhere.contains("runs on no cluster") && nowhere.contains("capstan services run web --cluster CLUSTER"), "{nowhere}");
        assert_eq!(verdict_text(&json!({ "state": "refused", "reason": "image-plan-missing" })), "refused (image-plan-missing)");
        assert_eq!(verdict_text(&json!({ "state": "converged" })), "converged");
        assert_eq!(short_digest(Some("sha256:0123456789abcdef")), "0123456789ab");
        assert_eq!(one_line(&"x".repeat(200), 10), format!("{}…", "x".repeat(10)));
    }
}
