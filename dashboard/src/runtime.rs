//! Where services run (docs/runtime.md). A service's page carries a **Runtime** card — per
//! cluster the verdict in words ("Running on 2 of 2 replicas", "Waiting: node offline",
//! "Refused: the digest of the image's tag is not known yet"; an image named by tag says the
//! digest it runs as, or why that is not known), the spec, the replica slots (node, phase,
//! ready, digest, restarts, last cause, and folded under each its history: [`super::history`])
//! and a "Stop (hold)" or "Resume" button — and the "Run on cluster" form. A cluster's page and
//! a node's page list the slots there (administrators only, as `runtime.getClusterAssignments`
//! is; nothing is shown to anyone else).
//!
//! Everything goes through `runtime.getServiceStatus`, `runtime.getServiceEvents`,
//! `runtime.getServiceSpec`, `runtime.setServiceSpec` and `runtime.getClusterAssignments` as the
//! signed-in person. A write reads the spec it replaces and states that revision (none: a first
//! spec), so a person never sees or types one; a change between that read and the write is
//! refused `conflict`.
//!
//! The card and the sections re-fetch themselves on `capstan-changed`: their pages watch the
//! `runtime` area, whose events (`runtime.spec-set`, `runtime.slot-changed`,
//! `runtime.verdict-changed`, `runtime.observed`, `runtime.receipt`) name the service as their
//! subject. `events.watch` answers per area, not per subject, so a page also refreshes on
//! another service's runtime event; what it shows is always its own.

use super::forms::{ErrorView, FormData, call, encode, number, post, redirect, status_of, str_of, u64_of, when};
use super::history::History;
use crate::Host;
use crate::Viewer;
use crate::refusal::{Refusal, Result};
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use capstan_core::text::named_ids;
use minijinja::context;
use minijinja::value::Serde;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// The area of the runtime's events, which the pages showing it watch.
pub(super) const AREA: &str = "runtime";
/// The most slots a cluster's or a node's section lists (the method's largest page).
const LISTED: usize = 256;
/// The most clusters, nodes and services read for their names.
const NAMES: usize = 200;
/// The longest last cause a table shows.
const CAUSE_SHOWN: usize = 300;

// ---------------------------------------------------------------------------------------
// Words

/// A verdict in words, and the pill class it is shown with. `ready` and `running` count the
/// replicas the slots run (intent `run`) and those of them ready.
pub(super) fn verdict_words(verdict: &Value, held: bool, ready: usize, running: usize) -> (String, &'static str) {
    let replicas = |n: usize| if n == 1 { "replica" } else { "replicas" };
    let reason = verdict["reason"].as_str().unwrap_or_default();
    match verdict["state"].as_str() {
        None => ("Waiting for the runtime to decide: it looks every few seconds".into(), "state-info"),
        Some("converged") if held => ("Held: nothing runs, the spec is kept".into(), "state-draining"),
        Some("converged") if running == 0 => ("Converged: no replica is asked for".into(), "state-live"),
        Some("converged") => (format!("Running on {ready} of {running} {}", replicas(running)), "state-live"),
        Some("converging") if held => ("Stopping: the replicas are being stopped and removed".into(), "state-info"),
        Some("converging") => (format!("Converging: {ready} of {running} {} ready", replicas(running)), "state-info"),
        Some("waiting") => {
            let why = match reason {
                "node-offline" => "node offline".to_string(),
                "failure-backoff" => "a failed replica is replaced once its backoff has passed".into(),
                "restart-never" => "a replica failed, and its restart policy is never".into(),
                "replacement-in-flight" => "another replica is being replaced first".into(),
                "cluster-not-running" => "the cluster's runtime phase runs nothing now".into(),
                other => other.replace('-', " "),
            };
            (format!("Waiting: {why}"), "state-stale")
        }
        Some("refused") => {
            let why = match reason {
                "image-plan-missing" => "the digest of the image's tag is not known yet".to_string(),
                "no-eligible-node" => "the cluster has no active node to place it on".into(),
                "cluster-runtime-missing" => "Capstan holds no runtime phase for the cluster".into(),
                "cluster-runtime-phase-refused" => "the cluster is in phase swarm, whose placement is not Capstan's".into(),
                other => other.replace('-', " "),
            };
            (format!("Refused: {why}"), "state-never")
        }
        Some(other) => (other.to_string(), "state-info"),
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A spec in words: `every active node, 1 replica per node, restart on-failure, no health
/// check`, pinned nodes by name where known.
pub(super) fn spec_words(spec: &Value, node_names: &BTreeMap<String, String>) -> String {
    let placement = match spec["placement"]["nodes"].is_array() {
        true => {
            let shown = named_ids(&spec["placement"]["nodes"], node_names);
            format!("{} {}", if shown.len() == 1 { "node" } else { "nodes" }, shown.join(", "))
        }
        false => "every active node".to_string(),
    };
    let health = &spec["health"];
    let health = match health["kind"].as_str() {
        Some("tcp") => format!("tcp check on port {}", health["port"]),
        Some("http") => format!("http check of {} on port {}", health["path"].as_str().unwrap_or("/"), health["port"]),
        _ => "no health check".to_string(),
    };
    let held = named_ids(&spec["heldNodes"], node_names);
    let held = if held.is_empty() { String::new() } else { format!("; stopped on {} (held)", held.join(", ")) };
    format!(
        "{placement}, {} per node, restart {}, {health}{held}",
        plural(spec["replicasPerNode"].as_u64().unwrap_or(0), "replica", "replicas"),
        str_of(spec, "restart")
    )
}

fn short_digest(digest: &str) -> String {
    digest.strip_prefix("sha256:").unwrap_or(digest).chars().take(12).collect()
}

fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let shown: String = flat.chars().take(max).collect();
    if shown.len() < flat.len() { format!("{shown}…") } else { shown }
}

fn phase_class(phase: &str, ready: bool) -> &'static str {
    match phase {
        "running" if ready => "pill-ok",
        "unhealthy" | "exited" | "failed" => "pill-error",
        "stopped" | "removed" => "pill-warn",
        _ => "pill-info",
    }
}

// ---------------------------------------------------------------------------------------
// Views

/// One replica slot as the tables show it.
#[derive(Debug, Serialize)]
pub(super) struct SlotRow {
    /// `<nodeId>.<index>`.
    slot: String,
    index: String,
    node_id: String,
    /// The node's name, else its id.
    node: String,
    /// The node's page (administrators).
    node_href: Option<String>,
    service_id: String,
    /// The service's name, else its id (the cluster's and node's sections).
    service: String,
    service_href: String,
    /// `run`, `stop` or `remove`.
    intent: String,
    phase: String,
    phase_class: &'static str,
    ready: bool,
    digest: String,
    digest_full: String,
    restarts: u64,
    cause: Option<String>,
    /// Its events, newest first (the service's Runtime card only, when they could be read).
    history: Option<History>,
}

/// Names by id, for what the tables show (ids stand in for what cannot be read).
#[derive(Default)]
struct Names {
    nodes: BTreeMap<String, String>,
    services: BTreeMap<String, String>,
    admin: bool,
}

impl Names {
    fn node(&self, id: &str) -> String {
        self.nodes.get(id).cloned().unwrap_or_else(|| id.to_string())
    }

    fn service(&self, id: &str) -> String {
        self.services.get(id).cloned().unwrap_or_else(|| id.to_string())
    }
}

/// What a slot's row is made of, from either view of it.
struct Facts<'a> {
    slot: &'a str,
    node_id: &'a str,
    service_id: &'a str,
    intent: &'a str,
    phase: &'a str,
    ready: bool,
    digest: Option<&'a str>,
    restarts: u64,
    cause: Option<&'a str>,
}

fn slot_row(f: Facts<'_>, names: &Names) -> SlotRow {
    SlotRow {
        slot: f.slot.to_string(),
        index: f.slot.rsplit_once('.').map_or(f.slot, |(_, index)| index).to_string(),
        node_id: f.node_id.to_string(),
        node: names.node(f.node_id),
        node_href: names.admin.then(|| format!("/nodes/{}", encode(f.node_id))),
        service_id: f.service_id.to_string(),
        service: names.service(f.service_id),
        service_href: format!("/services/{}", encode(f.service_id)),
        intent: f.intent.to_string(),
        phase: f.phase.to_string(),
        phase_class: phase_class(f.phase, f.ready),
        ready: f.ready,
        digest: f.digest.map(short_digest).unwrap_or_default(),
        digest_full: f.digest.unwrap_or_default().to_string(),
        restarts: f.restarts,
        cause: f.cause.filter(|c| !c.trim().is_empty()).map(|c| one_line(c, CAUSE_SHOWN)),
        history: None,
    }
}

/// A slot of `runtime.getServiceStatus` (its `SlotView`).
fn status_slot(slot: &Value, service_id: &str, names: &Names) -> SlotRow {
    let facts = Facts {
        slot: str_of(slot, "slot"),
        node_id: str_of(slot, "nodeId"),
        service_id,
        intent: str_of(slot, "intent"),
        phase: str_of(slot, "phase"),
        ready: slot["ready"] == true,
        digest: slot["imageDigest"].as_str(),
        restarts: u64_of(slot, "restarts"),
        cause: slot["cause"].as_str(),
    };
    slot_row(facts, names)
}

/// A slot of `runtime.getClusterAssignments` (a stored slot with its assignment), read as
/// `runtime.getServiceStatus` reads it.
fn assignment_slot(item: &Value, names: &Names) -> SlotRow {
    let assignment = &item["assignment"];
    let observed = assignment["observation"].as_object().map(|_| &assignment["observation"]);
    let intent = str_of(assignment, "intent");
    let phase = if !assignment["removedAt"].is_null() {
        "removed"
    } else if !assignment["stoppedAt"].is_null() {
        "stopped"
    } else {
        observed.map_or("pending", |o| str_of(o, "phase"))
    };
    let facts = Facts {
        slot: str_of(item, "slot"),
        node_id: str_of(item, "nodeId"),
        service_id: str_of(item, "serviceId"),
        intent,
        phase,
        ready: observed.is_some_and(|o| o["ready"] == true) && intent == "run",
        digest: observed.and_then(|o| o["imageDigest"].as_str()),
        restarts: u64_of(item, "attempts").saturating_sub(1),
        cause: observed.and_then(|o| o["cause"].as_str()).or(item["lastCause"].as_str()),
    };
    slot_row(facts, names)
}

/// One cluster of a service's Runtime card.
#[derive(Debug, Serialize)]
pub(super) struct TargetView {
    cluster_id: String,
    cluster: String,
    cluster_href: Option<String>,
    held: bool,
    /// The verdict's state, `""` before the runtime decided one.
    state: String,
    reason: String,
    words: String,
    class: &'static str,
    since: Option<(String, String)>,
    spec: String,
    slots: Vec<SlotRow>,
}

fn target_view(target: &Value, service_id: &str, clusters: &BTreeMap<String, String>, names: &Names) -> TargetView {
    let cluster_id = str_of(target, "clusterId").to_string();
    let slots: Vec<SlotRow> = target["slots"].as_array().into_iter().flatten().map(|s| status_slot(s, service_id, names)).collect();
    let running = slots.iter().filter(|s| s.intent == "run").count();
    let ready = slots.iter().filter(|s| s.ready).count();
    let held = target["spec"]["hold"] == true;
    let (words, class) = verdict_words(&target["verdict"], held, ready, running);
    TargetView {
        cluster: clusters.get(&cluster_id).cloned().unwrap_or_else(|| cluster_id.clone()),
        cluster_href: names.admin.then(|| format!("/clusters/{}", encode(&cluster_id))),
        cluster_id,
        held,
        state: str_of(&target["verdict"], "state").to_string(),
        reason: str_of(&target["verdict"], "reason").to_string(),
        words,
        class,
        since: target["since"].as_u64().map(when),
        spec: spec_words(&target["spec"], &names.nodes),
        slots,
    }
}

// ---------------------------------------------------------------------------------------
// Reading

/// `{id: name}` of a listing's items (`items`), or nothing when it cannot be read.
async fn names_of(state: &Host, identity: &Viewer, method: &str, body: Value) -> BTreeMap<String, String> {
    match call(state, identity, method, body).await {
        Ok(listing) => listing["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| Some((i["id"].as_str()?.to_string(), i["name"].as_str()?.to_string())))
            .collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// The clusters an administrator may pick, by id (nobody else may list them).
async fn cluster_names(state: &Host, identity: &Viewer) -> BTreeMap<String, String> {
    if !identity.admin {
        return BTreeMap::new();
    }
    names_of(state, identity, "clusters.list", json!({ "limit": NAMES })).await
}

/// The nodes an administrator may pick, in `cluster` or every cluster: id, name, hostname,
/// cluster; nothing for anyone else.
async fn nodes_of(state: &Host, identity: &Viewer, cluster: Option<&str>) -> Vec<Value> {
    if !identity.admin {
        return Vec::new();
    }
    let mut body = json!({ "limit": NAMES });
    if let Some(cluster) = cluster {
        body["clusterId"] = json!(cluster);
    }
    match call(state, identity, "nodes.list", body).await {
        Ok(listing) => listing["items"].as_array().cloned().unwrap_or_default().into_iter().filter(|n| n["state"] != "retired").collect(),
        Err(_) => Vec::new(),
    }
}

fn node_names(nodes: &[Value]) -> BTreeMap<String, String> {
    nodes.iter().filter_map(|n| Some((n["id"].as_str()?.to_string(), n["name"].as_str()?.to_string()))).collect()
}

/// The names of every node an administrator may list, by id; nothing for anyone else.
pub(super) async fn node_names_for(state: &Host, identity: &Viewer) -> BTreeMap<String, String> {
    node_names(&nodes_of(state, identity, None).await)
}

/// The spec a service has on a cluster, `None` when it has none.
async fn read_spec(state: &Host, identity: &Viewer, service: &str, cluster: &str) -> Result<Option<Value>> {
    match call(state, identity, "runtime.getServiceSpec", json!({ "serviceId": service, "clusterId": cluster })).await {
        Ok(answer) => Ok(answer["items"].as_array().and_then(|items| items.first()).cloned()),
        Err(refusal) if refusal.is("spec-not-found") => Ok(None),
        Err(refusal) => Err(refusal),
    }
}

// ---------------------------------------------------------------------------------------
// A service's Runtime card

/// What the card shows: each cluster the service has a spec on, or why it cannot be read, each
/// slot with its history (or why the events cannot be read); with the status's targets and
/// the clusters' names, for the form.
async fn card_context(state: &Host, identity: &Viewer, service_id: &str) -> (minijinja::Value, Vec<Value>, BTreeMap<String, String>) {
    let panel_href = format!("/services/{}/runtime/panel", encode(service_id));
    let action = format!("/services/{}/runtime", encode(service_id));
    let events_href = format!("/services/{}/events", encode(service_id));
    let status = match call(state, identity, "runtime.getServiceStatus", json!({ "serviceId": service_id })).await {
        Ok(status) => status,
        Err(refusal) => {
            let ctx = context! { runtime => Serde(None::<Vec<TargetView>>), runtime_error => Serde(Some(ErrorView::from(&refusal))), runtime_panel_href => panel_href, runtime_action => action, runtime_events_href => events_href };
            return (ctx, Vec::new(), cluster_names(state, identity).await);
        }
    };
    let targets = status["targets"].as_array().cloned().unwrap_or_default();
    let clusters = cluster_names(state, identity).await;
    let mut names = Names { admin: identity.admin, ..Names::default() };
    for target in &targets {
        let nodes = nodes_of(state, identity, Some(str_of(target, "clusterId"))).await;
        names.nodes.extend(node_names(&nodes));
    }
    let mut views: Vec<TargetView> = targets.iter().map(|t| target_view(t, service_id, &clusters, &names)).collect();
    // the slots' histories: one read of every event the service keeps
    let events_error = if views.iter().all(|v| v.slots.is_empty()) {
        None
    } else {
        match super::history::read(state, identity, service_id).await {
            Ok(rows) => {
                let mut histories = super::history::by_slot(rows, &events_href);
                for slot in views.iter_mut().flat_map(|v| v.slots.iter_mut()) {
                    slot.history = histories.remove(&slot.slot);
                }
                None
            }
            Err(refusal) => Some(ErrorView::from(&refusal)),
        }
    };
    let ctx = context! {
        runtime => Serde(Some(views)),
        runtime_image => Serde(image_plan_words(&status["imagePlan"])),
        runtime_error => Serde(None::<ErrorView>),
        runtime_events_error => Serde(events_error),
        runtime_panel_href => panel_href,
        runtime_action => action,
        runtime_events_href => events_href,
    };
    (ctx, targets, clusters)
}

/// What the card says of an image named by tag: the digest it runs as, or why that is not
/// known yet (none for an image pinned by digest).
#[derive(Debug, Serialize, PartialEq)]
struct ImageWords {
    words: String,
    resolved: bool,
}

fn image_plan_words(plan: &Value) -> Option<ImageWords> {
    let image = plan["image"].as_str()?;
    Some(match (plan["digest"].as_str(), plan["error"].as_str()) {
        (Some(digest), _) => ImageWords { words: format!("The tag {image} runs as {digest}."), resolved: true },
        (None, error) => ImageWords {
            words: format!("The digest of {image} is not known yet: {}.", error.unwrap_or("not asked yet").trim_end_matches('.')),
            resolved: false,
        },
    })
}

/// The "Run on cluster" form as shown: what was typed, else the spec of the service's first
/// cluster, else the defaults.
#[derive(Debug, Serialize, Clone)]
pub(super) struct RunForm {
    cluster: String,
    /// `every` or `nodes`.
    placement: String,
    nodes: Vec<String>,
    /// Node ids (or names) typed, one per line (for those who cannot list nodes).
    node_text: String,
    replicas: String,
    restart: String,
    health_kind: String,
    health_port: String,
    health_path: String,
}

impl Default for RunForm {
    fn default() -> RunForm {
        RunForm {
            cluster: String::new(),
            placement: "every".into(),
            nodes: Vec::new(),
            node_text: String::new(),
            replicas: "1".into(),
            restart: "on-failure".into(),
            health_kind: "none".into(),
            health_port: String::new(),
            health_path: String::new(),
        }
    }
}

fn clip(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

impl RunForm {
    pub(super) fn typed(form: &FormData) -> RunForm {
        RunForm {
            cluster: clip(form.text("cluster"), 200),
            placement: if form.text("placement") == "nodes" { "nodes".into() } else { "every".into() },
            nodes: form.0.iter().filter(|(k, _)| k == "node").map(|(_, v)| clip(v.trim(), 100)).take(256).collect(),
            node_text: clip(form.raw("nodeText"), 8000),
            replicas: clip(form.text("replicasPerNode"), 20),
            restart: clip(form.text("restart"), 20),
            health_kind: clip(form.text("healthKind"), 10),
            health_port: clip(form.text("healthPort"), 20),
            health_path: clip(form.text("healthPath"), 300),
        }
    }

    fn of_spec(spec: &Value) -> RunForm {
        let pinned: Vec<String> =
            spec["placement"]["nodes"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect();
        let health = &spec["health"];
        RunForm {
            cluster: str_of(spec, "clusterId").to_string(),
            placement: if pinned.is_empty() { "every".into() } else { "nodes".into() },
            node_text: pinned.iter().map(|n| format!("{n}\n")).collect(),
            nodes: pinned,
            replicas: u64_of(spec, "replicasPerNode").to_string(),
            restart: str_of(spec, "restart").to_string(),
            health_kind: health["kind"].as_str().unwrap_or("none").to_string(),
            health_port: health["port"].as_u64().map(|p| p.to_string()).unwrap_or_default(),
            health_path: health["path"].as_str().unwrap_or_default().to_string(),
        }
    }
}

#[derive(Serialize)]
struct ClusterOption {
    id: String,
    name: String,
    selected: bool,
}

#[derive(Serialize)]
struct NodeOption {
    id: String,
    name: String,
    hostname: String,
    cluster: String,
    checked: bool,
}

/// The Runtime card and the "Run on cluster" form of a service's page.
pub(super) async fn service_context(state: &Host, identity: &Viewer, service_id: &str, typed: Option<RunForm>) -> minijinja::Value {
    let (card, targets, clusters) = card_context(state, identity, service_id).await;
    let form = typed.unwrap_or_else(|| targets.first().map(|t| RunForm::of_spec(&t["spec"])).unwrap_or_default());
    let mut cluster_options: Vec<ClusterOption> =
        clusters.iter().map(|(id, name)| ClusterOption { id: id.clone(), name: name.clone(), selected: *id == form.cluster }).collect();
    cluster_options.sort_by(|a, b| a.name.cmp(&b.name));
    let nodes = nodes_of(state, identity, None).await;
    let mut node_options: Vec<NodeOption> = nodes
        .iter()
        .map(|n| {
            let id = str_of(n, "id").to_string();
            NodeOption {
                checked: form.nodes.contains(&id),
                cluster: clusters.get(str_of(n, "clusterId")).cloned().unwrap_or_else(|| str_of(n, "clusterId").to_string()),
                name: str_of(n, "name").to_string(),
                hostname: str_of(n, "hostname").to_string(),
                id,
            }
        })
        .collect();
    node_options.sort_by(|a, b| (&a.cluster, &a.name).cmp(&(&b.cluster, &b.name)));
    // those who cannot list clusters pick among the clusters the service has a spec on, or type an id
    let known: Vec<String> = targets.iter().map(|t| str_of(t, "clusterId").to_string()).collect();
    context! {
        run_form => Serde(form),
        run_clusters => Serde(cluster_options),
        run_nodes => Serde(node_options),
        run_known_clusters => known,
        ..card
    }
}

/// `GET /services/{id}/runtime/panel`: the Runtime card alone, for htmx.
pub(super) async fn service_panel(
    State(state): State<Host>,
    super::forms::Signed(identity): super::forms::Signed,
    Path(id): Path<String>,
) -> Response {
    let (ctx, _, _) = card_context(&state, &identity, &id).await;
    super::render(StatusCode::OK, "service_runtime.html", ctx)
}

/// The cluster a form names: an id as it is; a name looked up among the clusters an
/// administrator may list; anything else as typed, for the method to refuse by name.
async fn cluster_of(state: &Host, identity: &Viewer, typed: &str) -> String {
    if typed.starts_with("cluster_") {
        return typed.to_string();
    }
    cluster_names(state, identity).await.into_iter().find(|(_, name)| name == typed).map(|(id, _)| id).unwrap_or_else(|| typed.to_string())
}

/// The nodes a form names (checked, or typed one per line), sorted and without duplicates as a
/// spec states them; a typed name is looked up among the cluster's nodes an administrator may
/// list, anything else goes to the method as typed.
async fn nodes_named(state: &Host, identity: &Viewer, form: &RunForm, cluster: &str) -> Vec<String> {
    let typed: Vec<&str> = form.node_text.split(|c: char| c == ',' || c.is_whitespace()).filter(|t| !t.is_empty()).collect();
    let known = if typed.iter().any(|t| !t.starts_with("node_")) { nodes_of(state, identity, Some(cluster)).await } else { Vec::new() };
    let mut ids: BTreeSet<String> = form.nodes.iter().filter(|n| !n.is_empty()).cloned().collect();
    for text in typed {
        let found = known.iter().find(|n| str_of(n, "name") == text || str_of(n, "hostname") == text).map(|n| str_of(n, "id").to_string());
        ids.insert(found.unwrap_or_else(|| text.to_string()));
    }
    ids.into_iter().collect()
}

/// The spec's health check from the form (the method judges it).
fn health_of(form: &RunForm) -> Value {
    let port = |text: &str| if text.is_empty() { Value::Null } else { number(text) };
    match form.health_kind.as_str() {
        "tcp" => json!({ "kind": "tcp", "port": port(&form.health_port) }),
        "http" => {
            let path = if form.health_path.is_empty() { "/".to_string() } else { form.health_path.clone() };
            json!({ "kind": "http", "port": port(&form.health_port), "path": path })
        }
        _ => json!({ "kind": "none" }),
    }
}

/// Write the spec the form states for the service on its cluster, against the revision read now.
async fn write_run(state: &Host, identity: &Viewer, service_id: &str, form: &RunForm) -> Result<Value> {
    if form.cluster.is_empty() {
        return Err(Refusal::invalid_request("choose the cluster to run the service on").with_data(json!({ "field": "clusterId" })));
    }
    let cluster = cluster_of(state, identity, &form.cluster).await;
    let placement = if form.placement == "nodes" {
        let nodes = nodes_named(state, identity, form, &cluster).await;
        if nodes.is_empty() {
            return Err(Refusal::invalid_request("choose at least one node, or run it on every node")
                .with_data(json!({ "field": "placement.nodes" })));
        }
        json!({ "nodes": nodes })
    } else {
        json!({ "everyNode": true })
    };
    let replicas = if form.replicas.is_empty() { json!(1) } else { number(&form.replicas) };
    let restart = if form.restart.is_empty() { "on-failure" } else { form.restart.as_str() };
    let current = read_spec(state, identity, service_id, &cluster).await?;
    let mut body = json!({
        "serviceId": service_id,
        "clusterId": cluster,
        "expectedRevision": current.as_ref().and_then(|s| s["revision"].as_u64()),
        "placement": placement,
        "replicasPerNode": replicas,
        "hold": false,
        "restart": restart,
        "health": health_of(form),
    });
    // the form does not state how secrets are delivered: what the spec holds stays
    if let Some(secrets) = current.as_ref().map(|s| s["secrets"].clone()).filter(Value::is_object) {
        body["secrets"] = secrets;
    }
    call(state, identity, "runtime.setServiceSpec", body).await
}

/// `POST /services/{id}/runtime/run`: the "Run on cluster" form (`cluster`, `placement`,
/// `node`…, `nodeText`, `replicasPerNode`, `restart`, `healthKind`, `healthPort`, `healthPath`).
pub(super) async fn run(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let typed = RunForm::typed(&form);
    match write_run(&state, &identity, &id, &typed).await {
        Ok(_) => redirect(&format!("/services/{}?done=runtime-run", encode(&id))),
        Err(refusal) => {
            let after = if refusal.is("conflict") {
                "Someone wrote this cluster's spec meanwhile: the card shows it as stored now. Send the form again to replace it."
            } else {
                "Nothing was written; your entries are kept below."
            };
            let flash = super::forms::Flash::refused("The service was not run", &refusal, after);
            super::services::detail_page(&state, &identity, &id, status_of(&refusal), Some(flash), None, Some(typed)).await
        }
    }
}

/// `POST /services/{id}/runtime/hold` (`clusterId`, `hold`: `true` stops every replica and keeps
/// the spec, `false` runs it again): the spec as stored, written back with that hold.
pub(super) async fn hold(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let hold = form.text("hold") != "false";
    let cluster = form.text("clusterId").to_string();
    let done = if hold { "runtime-held" } else { "runtime-resumed" };
    let written = async {
        let Some(spec) = read_spec(&state, &identity, &id, &cluster).await? else {
            return Err(Refusal::new("spec-not-found", format!("the service has no runtime spec for the cluster {}", clip(&cluster, 100)))
                .with_data(json!({ "serviceId": id, "clusterId": clip(&cluster, 100) })));
        };
        if spec["hold"] == hold {
            return Ok(spec);
        }
        let body = json!({
            "serviceId": id,
            "clusterId": cluster,
            "expectedRevision": spec["revision"],
            "placement": spec["placement"],
            "replicasPerNode": spec["replicasPerNode"],
            "hold": hold,
            "restart": spec["restart"],
            "health": spec["health"],
            "secrets": spec["secrets"],
        });
        call(&state, &identity, "runtime.setServiceSpec", body).await
    };
    match written.await {
        Ok(_) => redirect(&format!("/services/{}?done={done}", encode(&id))),
        Err(refusal) => {
            let title = if hold { "The service was not stopped" } else { "The service was not resumed" };
            let flash = super::forms::Flash::refused(title, &refusal, "Nothing was changed.");
            super::services::detail_page(&state, &identity, &id, status_of(&refusal), Some(flash), None, None).await
        }
    }
}

// ---------------------------------------------------------------------------------------
// A cluster's and a node's slots

/// The Runtime section of a cluster's page (`node`: `None`) or a node's page: the slots there,
/// for administrators; nothing (`runtime_slots` absent) for anyone else.
pub(super) async fn slots_context(state: &Host, identity: &Viewer, cluster: &str, node: Option<&str>) -> minijinja::Value {
    let panel_href = match node {
        Some(node) => format!("/nodes/{}/runtime/panel", encode(node)),
        None => format!("/clusters/{}/runtime/panel", encode(cluster)),
    };
    if !identity.admin {
        return context! { runtime_slots => Serde(None::<Vec<SlotRow>>), runtime_error => Serde(None::<ErrorView>), runtime_shown => false, runtime_panel_href => panel_href };
    }
    let mut body = json!({ "clusterId": cluster, "limit": LISTED });
    if let Some(node) = node {
        body["nodeId"] = json!(node);
    }
    let page = match call(state, identity, "runtime.getClusterAssignments", body).await {
        Ok(page) => page,
        Err(refusal) => {
            return context! { runtime_slots => Serde(None::<Vec<SlotRow>>), runtime_error => Serde(Some(ErrorView::from(&refusal))), runtime_shown => true, runtime_panel_href => panel_href, runtime_on_node => node.is_some() };
        }
    };
    let items = page["items"].as_array().cloned().unwrap_or_default();
    let names = Names {
        nodes: node_names(&nodes_of(state, identity, Some(cluster)).await),
        services: if items.is_empty() {
            BTreeMap::new()
        } else {
            names_of(state, identity, "services.list", json!({ "limit": NAMES })).await
        },
        admin: true,
    };
    let mut rows: Vec<SlotRow> = items.iter().map(|item| assignment_slot(item, &names)).collect();
    rows.sort_by(|a, b| (&a.service, &a.node, &a.slot).cmp(&(&b.service, &b.node, &b.slot)));
    let more = page.get("nextCursor").is_some_and(|c| !c.is_null());
    context! {
        runtime_slots => Serde(Some(rows)),
        runtime_error => Serde(None::<ErrorView>),
        runtime_shown => true,
        runtime_more => more,
        runtime_on_node => node.is_some(),
        runtime_panel_href => panel_href,
    }
}

/// `GET /clusters/{id}/runtime/panel`: a cluster's slots alone, for htmx.
pub(super) async fn cluster_panel(
    State(state): State<Host>,
    super::forms::Signed(identity): super::forms::Signed,
    Path(id): Path<String>,
) -> Response {
    super::render(StatusCode::OK, "runtime_slots.html", slots_context(&state, &identity, &id, None).await)
}

/// `GET /nodes/{id}/runtime/panel`: a node's slots alone, for htmx.
pub(super) async fn node_panel(
    State(state): State<Host>,
    super::forms::Signed(identity): super::forms::Signed,
    Path(id): Path<String>,
) -> Response {
    if !identity.admin {
        return super::render(StatusCode::OK, "runtime_slots.html", slots_context(&state, &identity, "", Some(&id)).await);
    }
    let cluster = match call(&state, &identity, "nodes.get", json!({ "id": id })).await {
        Ok(node) => str_of(&node, "clusterId").to_string(),
        Err(refusal) => {
            let ctx = context! { runtime_slots => Serde(None::<Vec<SlotRow>>), runtime_error => Serde(Some(ErrorView::from(&refusal))), runtime_shown => true, runtime_on_node => true, runtime_panel_href => format!("/nodes/{}/runtime/panel", encode(&id)) };
            return super::render(StatusCode::OK, "runtime_slots.html", ctx);
        }
    };
    super::render(StatusCode::OK, "runtime_slots.html", slots_context(&state, &identity, &cluster, Some(&id)).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_plan_says_its_digest_or_why_it_is_not_known() {
        assert_eq!(image_plan_words(&Value::Null), None, "a pinned image has no plan");
        let resolved = image_plan_words(&json!({ "image": "nginx:1.27", "digest": "sha256:ab12" })).unwrap();
        assert_eq!(resolved, ImageWords { words: "The tag nginx:1.27 runs as sha256:ab12.".into(), resolved: true });
        let failed = image_plan_words(&json!({ "image": "nginx:1.27", "error": "asking docker.io for nginx:1.27: timed out." })).unwrap();
        assert_eq!(failed.words, "The digest of nginx:1.27 is not known yet: asking docker.io for nginx:1.27: timed out.");
        assert!(!failed.resolved);
    }

    #[test]
    fn verdicts_read_in_words() {
        let words = |verdict: Value, held: bool, ready: usize, running: usize| verdict_words(&verdict, held, ready, running).0;
        assert_eq!(words(json!({ "state": "converged" }), false, 2, 2), "Running on 2 of 2 replicas");
        assert_eq!(words(json!({ "state": "converged" }), false, 1, 1), "Running on 1 of 1 replica");
        assert_eq!(words(json!({ "state": "converged" }), true, 0, 0), "Held: nothing runs, the spec is kept");
        assert_eq!(words(json!({ "state": "converging" }), false, 1, 2), "Converging: 1 of 2 replicas ready");
        assert_eq!(words(json!({ "state": "waiting", "reason": "node-offline" }), false, 0, 1), "Waiting: node offline");
        assert_eq!(
            words(json!({ "state": "refused", "reason": "image-plan-missing" }), false, 0, 0),
            "Refused: the digest of the image's tag is not known yet"
        );
        assert_eq!(
            words(json!({ "state": "refused", "reason": "no-eligible-node" }), false, 0, 0),
            "Refused: the cluster has no active node to place it on"
        );
        assert_eq!(words(json!({ "state": "refused", "reason": "something-new" }), false, 0, 0), "Refused: something new");
        assert!(words(Value::Null, false, 0, 0).starts_with("Waiting for the runtime to decide"));
        assert_eq!(verdict_words(&json!({ "state": "refused", "reason": "x" }), false, 0, 0).1, "state-never");
    }

    #[test]
    fn specs_read_in_words() {
        let spec = json!({ "placement": { "nodes": ["node_a", "node_b"] }, "replicasPerNode": 2, "restart": "never",
                           "health": { "kind": "http", "port": 8080, "path": "/up" } });
        let names: BTreeMap<String, String> = [("node_a".to_string(), "alpha".to_string())].into();
        assert_eq!(spec_words(&spec, &names), "nodes alpha, node_b, 2 replicas per node, restart never, http check of /up on port 8080");
        let spec =
            json!({ "placement": { "everyNode": true }, "replicasPerNode": 1, "restart": "on-failure", "health": { "kind": "none" } });
        assert_eq!(spec_words(&spec, &BTreeMap::new()), "every active node, 1 replica per node, restart on-failure, no health check");
    }

    #[test]
    fn a_stored_slot_reads_as_the_status_reads_it() {
        let names = Names { admin: true, ..Names::default() };
        let item = json!({
            "id": "svc_1@node_a.0", "revision": 4, "serviceId": "svc_1", "clusterId": "cluster_1", "nodeId": "node_a", "slot": "node_a.1",
            "assignmentId": "asg_1", "attempts": 3, "failures": 2, "lastCause": "exited with status 1",
            "assignment": { "intent": "run", "observation": { "phase": "running", "ready": true, "imageDigest": "sha256:0123456789abcdef", "observedAt": 1, "acceptedAt": 1 } },
        });
        let row = assignment_slot(&item, &names);
        assert_eq!(
            (row.index.as_str(), row.phase.as_str(), row.ready, row.digest.as_str(), row.restarts),
            ("1", "running", true, "0123456789ab", 2)
        );
        assert_eq!(
            (row.cause.as_deref(), row.node_href.as_deref(), row.phase_class),
            (Some("exited with status 1"), Some("/nodes/node_a"), "pill-ok")
        );
        let stopped = json!({ "slot": "node_a.0", "nodeId": "node_a", "serviceId": "svc_1", "attempts": 1,
                              "assignment": { "intent": "stop", "stoppedAt": 5, "observation": { "phase": "running", "ready": true } } });
        let row = assignment_slot(&stopped, &names);
        assert_eq!((row.phase.as_str(), row.ready, row.restarts, row.digest.as_str()), ("stopped", false, 0, ""));
        let pending =
            json!({ "slot": "node_a.0", "nodeId": "node_a", "serviceId": "svc_1", "attempts": 1, "assignment": { "intent": "run" } });
        assert_eq!(assignment_slot(&pending, &names).phase, "pending");
    }

    #[test]
    fn the_run_form_reads_back_a_spec_and_states_a_health_check() {
        let spec = json!({ "clusterId": "cluster_1", "placement": { "nodes": ["node_a"] }, "replicasPerNode": 2, "restart": "never",
                           "health": { "kind": "tcp", "port": 5432 } });
        let form = RunForm::of_spec(&spec);
        assert_eq!(
            (form.cluster.as_str(), form.placement.as_str(), form.nodes.clone(), form.replicas.as_str()),
            ("cluster_1", "nodes", vec!["node_a".to_string()], "2")
        );
        assert_eq!(health_of(&form), json!({ "kind": "tcp", "port": 5432 }));
        let http = RunForm { health_kind: "http".into(), health_port: "8080".into(), ..RunForm::default() };
        assert_eq!(health_of(&http), json!({ "kind": "http", "port": 8080, "path": "/" }));
        let no_port = RunForm { health_kind: "tcp".into(), ..RunForm::default() };
        assert_eq!(health_of(&no_port), json!({ "kind": "tcp", "port": null }), "the method names the missing port");
        assert_eq!(health_of(&RunForm::default()), json!({ "kind": "none" }));
    }
}
