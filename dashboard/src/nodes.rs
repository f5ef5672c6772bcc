//! A cluster's nodes (`/clusters/{id}/nodes`): each node's liveness, last report and hostname
//! intent, refreshed every few seconds, and the form that creates a jump command (the one-line
//! command a new machine runs, shown once, with a copy button). A node's page (`/nodes/{id}`)
//! shows its report and credential and offers what an administrator does to it: change or reset
//! its hostname intent, activate rotated token material, and — each confirmed on a page of its
//! own — revoke its credential, retire it, delete it once retired — and lists the replica
//! slots on it ([`super::runtime`]), refreshed when a `runtime.*` event commits.
//!
//! Everything goes through the `nodes.*` methods as the signed-in person (administrators only:
//! anyone else sees the method's `forbidden`).

use super::fleet::ago;
use super::forms::{ErrorView, Flash, Signed, call, encode, number, post, query_of, redirect, status_of, str_of, u64_of};
use super::{nav, now_ms, render, user_view};
use crate::Host;
use crate::Viewer;
use crate::refusal::Refusal;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Nodes listed on a cluster's page (the rest are counted).
const LISTED: u64 = 200;

// ---------------------------------------------------------------------------------------
// Views

/// A node as the pages show it.
#[derive(Serialize)]
struct NodeRow {
    id: String,
    href: String,
    name: String,
    hostname: String,
    /// `live`, `offline`, `never-reported`.
    liveness: String,
    retired: bool,
    /// `3 min ago`, or none before the first report.
    reported: Option<String>,
    /// The intent's hostname while the node does not carry it yet.
    pending: Option<String>,
    /// Why the node's last apply of the intent failed, when it did.
    apply_failed: Option<String>,
    agent_version: String,
    os: String,
    revision: u64,
    intent_generation: u64,
    intent_name: String,
}

fn node_row(node: &Value) -> NodeRow {
    let id = str_of(node, "id").to_string();
    let report = node.get("report").cloned().unwrap_or(Value::Null);
    let intent = node.get("hostnameIntent").cloned().unwrap_or(Value::Null);
    let hostname = str_of(node, "hostname").to_string();
    // where the intent stands is the host's judgement (`intentStatus`), as the CLI reads it
    let status = &node["intentStatus"];
    let wanted = str_of(&intent, "hostname");
    let apply_failed = (str_of(status, "state") == "failed").then(|| str_of(status, "reason").to_string());
    let now_ms = now_ms();
    NodeRow {
        href: format!("/nodes/{}", encode(&id)),
        name: str_of(node, "name").into(),
        liveness: str_of(node, "liveness").into(),
        retired: str_of(node, "state") == "retired",
        reported: node.get("lastReportAt").and_then(Value::as_u64).map(|at| ago(now_ms.saturating_sub(at))),
        pending: (str_of(status, "state") != "applied" && !wanted.is_empty()).then(|| wanted.to_string()),
        apply_failed,
        agent_version: str_of(&report, "agentVersion").into(),
        os: str_of(&report, "os").into(),
        revision: u64_of(node, "revision"),
        intent_generation: u64_of(&intent, "generation"),
        intent_name: str_of(&intent, "name").to_string(),
        hostname,
        id,
    }
}

/// What a node's report says, as facts.
#[derive(Serialize)]
struct Fact {
    label: &'static str,
    value: String,
}

fn bytes(n: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    format!("{:.1} GiB", n as f64 / GIB)
}

fn report_facts(report: &Value) -> Vec<Fact> {
    if !report.is_object() {
        return Vec::new();
    }
    let text = |key: &str| str_of(report, key).to_string();
    let addresses: Vec<&str> = report["addresses"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    vec![
        Fact { label: "Operating system", value: text("os") },
        Fact { label: "Kernel", value: format!("{} ({})", text("kernel"), text("arch")) },
        Fact { label: "CPUs", value: u64_of(report, "cpus").to_string() },
        Fact { label: "Memory", value: bytes(u64_of(report, "memoryBytes")) },
        Fact { label: "Disk", value: format!("{} free of {}", bytes(u64_of(report, "diskFreeBytes")), bytes(u64_of(report, "diskBytes"))) },
        Fact { label: "Addresses", value: if addresses.is_empty() { "none reported".into() } else { addresses.join(", ") } },
        Fact { label: "Up for", value: ago(u64_of(report, "uptimeSeconds") * 1000).trim_end_matches(" ago").to_string() },
        Fact { label: "Agent", value: text("agentVersion") },
    ]
}

/// The cluster a page is about: its id and name (the id when it cannot be read).
async fn cluster_name(state: &Host, identity: &Viewer, cluster_id: &str) -> std::result::Result<String, Refusal> {
    call(state, identity, "clusters.get", json!({ "id": cluster_id })).await.map(|c| str_of(&c, "name").to_string())
}

// ---------------------------------------------------------------------------------------
// A cluster's nodes

/// The jump form as typed (after a refusal).
#[derive(Serialize, Default)]
struct JumpForm {
    node_name: String,
    set_hostname: bool,
    ttl_minutes: String,
}

async fn list_context(state: &Host, identity: &Viewer, cluster_id: &str) -> minijinja::Value {
    let listing = call(state, identity, "nodes.list", json!({ "clusterId": cluster_id, "limit": LISTED })).await;
    let (rows, error, more) = match &listing {
        Ok(page) => {
            let rows: Vec<NodeRow> = page["items"].as_array().into_iter().flatten().map(node_row).collect();
            (rows, None, page.get("nextCursor").is_some_and(|c| !c.is_null()))
        }
        Err(refusal) => (Vec::new(), Some(ErrorView::from(refusal)), false),
    };
    let live = rows.iter().filter(|r| r.liveness == "live").count();
    context! {
        nodes => Serde(rows),
        live,
        more,
        nodes_error => Serde(error),
        panel_href => format!("/clusters/{}/nodes/panel", encode(cluster_id)),
    }
}

async fn nodes_page(
    state: &Host,
    identity: &Viewer,
    cluster_id: &str,
    status: StatusCode,
    flash: Option<Flash>,
    typed: JumpForm,
) -> Response {
    let name = cluster_name(state, identity, cluster_id).await;
    let status = match (&name, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let shown = name.clone().unwrap_or_else(|_| cluster_id.chars().take(64).collect());
    let ctx = context! {
        page => format!("Nodes of {shown}"),
        nav => Serde(nav(state, "clusters")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        cluster => context! { id => cluster_id, name => shown, href => format!("/clusters/{}", encode(cluster_id)) },
        cluster_error => Serde(name.as_ref().err().map(ErrorView::from)),
        form => Serde(typed),
        action => format!("/clusters/{}/nodes/jump", encode(cluster_id)),
        ..list_context(state, identity, cluster_id).await
    };
    render(status, "nodes.html", ctx)
}

#[derive(Deserialize)]
pub(super) struct DoneQuery {
    done: Option<String>,
}

/// `GET /clusters/{id}/nodes`.
pub(super) async fn page(State(state): State<Host>, Signed(identity): Signed, Path(cluster_id): Path<String>, uri: Uri) -> Response {
    let flash = match query_of::<DoneQuery>(&uri).and_then(|q| q.done).as_deref() {
        Some("deleted") => Some(Flash::done("Node deleted", "Its record is gone; its hostname is free in the cluster.")),
        _ => None,
    };
    nodes_page(&state, &identity, &cluster_id, StatusCode::OK, flash, JumpForm::default()).await
}

/// `GET /clusters/{id}/nodes/panel`: the node table alone, for htmx (every few seconds).
pub(super) async fn panel(State(state): State<Host>, Signed(identity): Signed, Path(cluster_id): Path<String>) -> Response {
    render(StatusCode::OK, "nodes_panel.html", list_context(&state, &identity, &cluster_id).await)
}

/// `POST /clusters/{id}/nodes/jump` (`nodeName`, `ttlMinutes`): `nodes.createJumpCommand`; the
/// command is shown on the answer page once, never again.
pub(super) async fn jump(State(state): State<Host>, Path(cluster_id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let mut body = json!({ "clusterId": cluster_id });
    if !form.text("nodeName").is_empty() {
        body["nodeName"] = json!(form.text("nodeName"));
    }
    if form.text("setHostname") == "true" {
        body["setHostname"] = json!(true);
    }
    if !form.text("ttlMinutes").is_empty() {
        body["ttlMinutes"] = number(form.text("ttlMinutes"));
    }
    match call(&state, &identity, "nodes.createJumpCommand", body).await {
        Ok(jump) => {
            let expires = jump["expiresAt"].as_u64().unwrap_or_default();
            let name = cluster_name(&state, &identity, &cluster_id).await.unwrap_or_else(|_| cluster_id.clone());
            let ctx = context! {
                page => "Add a node",
                nav => Serde(nav(&state, "clusters")),
                user => Serde(user_view(&identity)),
                cluster => context! { id => &cluster_id, name, href => format!("/clusters/{}/nodes", encode(&cluster_id)) },
                command => str_of(&jump, "command"),
                url => str_of(&jump, "url"),
                expires => super::utc(expires),
                expires_in => super::time_left(expires),
                node_name => form.text("nodeName"),
                renames => form.text("setHostname") == "true",
            };
            render(StatusCode::OK, "node_jump.html", ctx)
        }
        Err(refusal) => {
            let flash = Flash::refused("No jump command was created", &refusal, "Your entries are kept below.");
            let typed = JumpForm {
                node_name: form.text("nodeName").chars().take(100).collect(),
                set_hostname: form.text("setHostname") == "true",
                ttl_minutes: form.text("ttlMinutes").chars().take(20).collect(),
            };
            nodes_page(&state, &identity, &cluster_id, status_of(&refusal), Some(flash), typed).await
        }
    }
}

// ---------------------------------------------------------------------------------------
// One node

/// What a node's page watches: its slots' runtime events.
const AREAS: &[&str] = &[super::runtime::AREA];

async fn node_page(state: &Host, identity: &Viewer, id: &str, status: StatusCode, flash: Option<Flash>) -> Response {
    let head = super::live::head(state, identity).await;
    let read = call(state, identity, "nodes.get", json!({ "id": id })).await;
    let credential = call(state, identity, "nodes.getCredential", json!({ "nodeId": id })).await;
    // where the node's database bindings are made: never a credential (docs/bindings.md)
    let storage = call(state, identity, "nodes.getStorageEndpoint", json!({ "nodeId": id })).await.ok();
    let status = match (&read, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let node = read.as_ref().ok();
    let cluster_id = node.map(|n| str_of(n, "clusterId").to_string()).unwrap_or_default();
    let cluster = match node {
        Some(_) => cluster_name(state, identity, &cluster_id).await.unwrap_or_else(|_| cluster_id.clone()),
        None => String::new(),
    };
    let credential_view = credential.as_ref().ok().map(|c| {
        let rotated = u64_of(c, "rotatedAt");
        context! {
            generation => u64_of(c, "generation"),
            state => str_of(c, "state"),
            rotated => super::utc(rotated),
            revoked => c.get("revokedAt").and_then(Value::as_u64).map(super::utc),
        }
    });
    let row = node.map(node_row);
    let title = row.as_ref().map(|r| format!("Node {}", r.hostname)).unwrap_or_else(|| "Node".into());
    let runtime = match node {
        Some(_) => super::runtime::slots_context(state, identity, &cluster_id, Some(id)).await,
        None => context! {},
    };
    let ctx = context! {
        page => title,
        nav => Serde(nav(state, "clusters")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(read.as_ref().err().map(ErrorView::from)),
        node => Serde(row),
        facts => Serde(node.map(|n| report_facts(&n["report"])).unwrap_or_default()),
        enrolled => node.map(|n| super::utc(u64_of(n, "enrolledAt"))),
        credential => credential_view,
        recipient => node.and_then(|n| n.get("recipient")).map(|r| context! {
            generation => u64_of(r, "generation"),
            enrolled => super::utc(u64_of(r, "enrolledAt")),
            key => str_of(r, "publicKey").chars().take(12).collect::<String>(),
        }),
        credential_error => Serde(credential.as_ref().err().map(ErrorView::from)),
        storage => storage.as_ref().map(|s| context! {
            database => s.get("database").map(|d| context! {
                engine => str_of(d, "engine"),
                host => str_of(d, "host"),
                port => u64_of(d, "port"),
                user => str_of(d, "user"),
            }),
            object_storage => s.get("objectStorage").map(|o| context! {
                endpoint => str_of(o, "endpoint"),
                region => str_of(o, "region"),
                key => str_of(o, "accessKeyId"),
            }),
        }),
        cluster => context! { id => &cluster_id, name => cluster, href => format!("/clusters/{}/nodes", encode(&cluster_id)) },
        action => format!("/nodes/{}", encode(id)),
        ..context! { ..super::live::element(head, AREAS), ..runtime }
    };
    render(status, "node.html", ctx)
}

/// `GET /nodes/{id}`.
pub(super) async fn detail(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let flash = match query_of::<DoneQuery>(&uri).and_then(|q| q.done).as_deref() {
        Some("hostname") => Some(Flash::done(
            "Hostname intent stored",
            "The node's agent fetches it with its next beats, applies it and reports it; until then it shows as pending.",
        )),
        Some("rotated") => Some(Flash::done("Credential rotated", "The new token material is active; the replaced token is refused.")),
        Some("revoked") => Some(Flash::done("Credential revoked", "The node's beats are refused from now on.")),
        Some("retired") => Some(Flash::done("Node retired", "Its credential is revoked; it is kept as a record until you delete it.")),
        _ => None,
    };
    node_page(&state, &identity, &id, StatusCode::OK, flash).await
}

/// Call `method` with `body` for node `id` from a form: to the node's page with `done` on
/// success, or the page again with the refusal.
async fn act(state: &Host, identity: &Viewer, id: &str, method: &str, body: Value, done: &str, refused: &str) -> Response {
    match call(state, identity, method, body).await {
        Ok(_) => redirect(&format!("/nodes/{}?done={done}", encode(id))),
        Err(refusal) => {
            let flash = Flash::refused(refused, &refusal, "Nothing was changed.");
            node_page(state, identity, id, status_of(&refusal), Some(flash)).await
        }
    }
}

/// `POST /nodes/{id}/hostname` (`expectedGeneration`, `hostname`): `nodes.setHostname`.
pub(super) async fn set_hostname(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let body = json!({ "nodeId": id, "expectedGeneration": number(form.text("expectedGeneration")), "hostname": form.text("hostname") });
    act(&state, &identity, &id, "nodes.setHostname", body, "hostname", "The hostname was not changed").await
}

/// `POST /nodes/{id}/hostname/reset` (`expectedGeneration`, `name`): `nodes.resetHostname`.
pub(super) async fn reset_hostname(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let mut body = json!({ "nodeId": id, "expectedGeneration": number(form.text("expectedGeneration")) });
    if !form.text("name").is_empty() {
        body["name"] = json!(form.text("name"));
    }
    act(&state, &identity, &id, "nodes.resetHostname", body, "hostname", "The hostname was not reset").await
}

/// `POST /nodes/{id}/rotate` (`expectedGeneration`, `tokenSha256`): `nodes.rotateCredential`
/// with a fresh mutation id.
pub(super) async fn rotate(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let body = json!({
        "nodeId": id,
        "expectedGeneration": number(form.text("expectedGeneration")),
        "tokenSha256": form.text("tokenSha256"),
        "mutationId": capstan_core::ids::new_id("mut"),
    });
    act(&state, &identity, &id, "nodes.rotateCredential", body, "rotated", "The credential was not rotated").await
}

// ---------------------------------------------------------------------------------------
// Confirmed actions: revoke, retire, delete

/// What each confirmed action does.
#[derive(Clone, Copy)]
enum Confirmed {
    Revoke,
    Retire,
    Delete,
}

impl Confirmed {
    fn of(action: &str) -> Option<Confirmed> {
        match action {
            "revoke" => Some(Confirmed::Revoke),
            "retire" => Some(Confirmed::Retire),
            "delete" => Some(Confirmed::Delete),
            _ => None,
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Confirmed::Revoke => "revoke",
            Confirmed::Retire => "retire",
            Confirmed::Delete => "delete",
        }
    }

    fn title(self, hostname: &str) -> String {
        match self {
            Confirmed::Revoke => format!("Revoke the credential of {hostname}?"),
            Confirmed::Retire => format!("Retire {hostname}?"),
            Confirmed::Delete => format!("Delete {hostname}?"),
        }
    }

    fn consequences(self) -> &'static [&'static str] {
        match self {
            Confirmed::Revoke => &[
                "Its credential is revoked for good: every beat and every request of its agent is refused node-unauthorized.",
                "The node stays a node of the cluster; it reads offline once its last report is older than the freshness window.",
                "It cannot be undone: to bring the machine back, retire the node and enroll the machine again with a new jump command.",
            ],
            Confirmed::Retire => &[
                "Its credential is revoked: its agent is refused from now on.",
                "The node is kept as a record, its hostname free for another node of the cluster.",
                "A retired node can then be deleted.",
            ],
            Confirmed::Delete => {
                &["The node's record and its credential are deleted.", "The cluster can be deleted once none of its nodes is left."]
            }
        }
    }
}

/// `GET /nodes/{id}/{action}` (`revoke`, `retire`, `delete`): what it does, and the button.
pub(super) async fn confirm(State(state): State<Host>, Signed(identity): Signed, Path((id, action)): Path<(String, String)>) -> Response {
    let Some(confirmed) = Confirmed::of(&action) else { return super::not_found_page() };
    confirm_page(&state, &identity, &id, confirmed, StatusCode::OK, None).await
}

async fn confirm_page(
    state: &Host,
    identity: &Viewer,
    id: &str,
    confirmed: Confirmed,
    status: StatusCode,
    flash: Option<Flash>,
) -> Response {
    let read = call(state, identity, "nodes.get", json!({ "id": id })).await;
    let credential = match confirmed {
        Confirmed::Revoke => call(state, identity, "nodes.getCredential", json!({ "nodeId": id })).await.ok(),
        _ => None,
    };
    let status = match (&read, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let confirm = read.as_ref().ok().map(|node| {
        let row = node_row(node);
        context! {
            title => confirmed.title(&row.hostname),
            consequences => Serde(confirmed.consequences()),
            action => format!("/nodes/{}/{}", encode(id), confirmed.verb()),
            verb => confirmed.verb(),
            expected_revision => row.revision,
            expected_generation => credential.as_ref().map(|c| u64_of(c, "generation")),
            cancel => row.href.clone(),
        }
    });
    let ctx = context! {
        page => "Confirm",
        nav => Serde(nav(state, "clusters")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(read.as_ref().err().map(ErrorView::from)),
        confirm,
        back => format!("/nodes/{}", encode(id)),
    };
    render(status, "node_confirm.html", ctx)
}

/// `POST /nodes/{id}/{action}`: the confirmed action, against the revision (or credential
/// generation) the confirmation page read.
pub(super) async fn confirmed(State(state): State<Host>, Path((id, action)): Path<(String, String)>, request: Request) -> Response {
    let Some(confirmed) = Confirmed::of(&action) else { return super::not_found_page() };
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    // the node's cluster, for where a deletion goes back to
    let cluster_id = match call(&state, &identity, "nodes.get", json!({ "id": id })).await {
        Ok(node) => str_of(&node, "clusterId").to_string(),
        Err(_) => String::new(),
    };
    let (method, body) = match confirmed {
        Confirmed::Revoke => (
            "nodes.revokeCredential",
            json!({
                "nodeId": id,
                "expectedGeneration": number(form.text("expectedGeneration")),
                "mutationId": capstan_core::ids::new_id("mut"),
            }),
        ),
        Confirmed::Retire => ("nodes.retire", json!({ "id": id, "expectedRevision": number(form.text("expectedRevision")) })),
        Confirmed::Delete => ("nodes.delete", json!({ "id": id, "expectedRevision": number(form.text("expectedRevision")) })),
    };
    match call(&state, &identity, method, body).await {
        Ok(_) => match confirmed {
            Confirmed::Delete => redirect(&format!("/clusters/{}/nodes?done=deleted", encode(&cluster_id))),
            Confirmed::Revoke => redirect(&format!("/nodes/{}?done=revoked", encode(&id))),
            Confirmed::Retire => redirect(&format!("/nodes/{}?done=retired", encode(&id))),
        },
        Err(refusal) => {
            let after = if refusal.is("conflict") {
                "The node changed since this page read it: review it and confirm again."
            } else {
                "Nothing was changed."
            };
            let flash = Flash::refused(&format!("The node was not {}d", confirmed.verb().trim_end_matches('e')), &refusal, after);
            confirm_page(&state, &identity, &id, confirmed, status_of(&refusal), Some(flash)).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_row_says_whether_its_hostname_intent_is_pending_or_failed() {
        let node = json!({
            "id": "node_1", "revision": 3, "name": "a", "hostname": "old", "liveness": "live", "state": "active",
            "hostnameIntent": { "name": "a", "hostname": "worker-a", "generation": 2 },
            "report": { "agentVersion": "0.1.0", "os": "Debian 12", "hostApply": { "generation": 2, "outcome": "failed", "reason": "denied" } },
            "intentStatus": { "state": "failed", "reason": "denied" }
        });
        let row = node_row(&node);
        assert_eq!((row.pending.as_deref(), row.apply_failed.as_deref()), (Some("worker-a"), Some("denied")));
        assert_eq!((row.intent_generation, row.revision, row.href.as_str()), (2, 3, "/nodes/node_1"));
        let applied = json!({ "id": "n", "hostname": "worker-a", "hostnameIntent": { "hostname": "worker-a", "generation": 2 },
            "intentStatus": { "state": "applied" } });
        assert_eq!(node_row(&applied).pending, None);
        assert!(report_facts(&Value::Null).is_empty());
        assert_eq!(bytes(3 << 30), "3.0 GiB");
    }
}
