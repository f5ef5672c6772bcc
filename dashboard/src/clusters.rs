//! The Clusters view at `/clusters`: the clusters with their runtime phase and labels,
//! created, edited, moved between runtime phases and deleted through forms. Everything goes
//! through the `clusters.*` methods as the logged-in person (administrators only, like the
//! API: anyone else sees the method's `forbidden`).
//!
//! Creating a cluster answers a page with its machine user's token, shown this once (the page
//! is never cached and the token is in no URL). The detail page never shows it: Capstan keeps
//! only its hash. An edit states the revision the page read, a phase move the generation; a
//! stale one shows the method's `conflict`. A deletion is confirmed by typing the cluster's
//! name on a page of its own.
//!
//! The detail page's Relays panel shows the cluster's relay: `off` until an administrator
//! enables it (`clusters.enableRelay` / `clusters.disableRelay`, forms stating the revision the
//! page read), `enabled, awaiting relay registration` until a relay registers, and then the
//! registration `relays.list` answers (node, address, version, since when) with whether a
//! socket carries it now (`live`) or not (`socket gone`); beside it the credential's generation
//! (`relays.getCredential`) and the CLI command that exports the bearer. A host that does not
//! serve `relays.list` yet (`method-unknown`) shows no registration.
//!
//! The list and the detail panels re-fetch themselves when a `cluster.*` or `relay.*` event
//! commits or a `relay.*` push arrives (see [`super::live`]).

use super::forms::{
    ErrorView, Flash, FormData, PAGE, Pair, Signed, call, call_if_served, encode, format_pairs, number, pairs_of, parse_pairs, post,
    query_of, redirect, shown_name, status_of, str_of, u64_of, when,
};
use super::{live, nav, render, user_view};
use crate::Host;
use crate::Viewer;
use crate::refusal::{Refusal, Result};
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const AREAS: &[&str] = &["cluster", "relay", super::runtime::AREA];
/// Every runtime phase, in the order a cluster moves through them.
const PHASES: &[(&str, &str)] = &[
    ("swarm", "the Swarm-era runtime owns the cluster"),
    ("draining", "every service is stopped; volumes stay"),
    ("switching", "nodes join the new runtime network while nothing runs"),
    ("pallet", "the node runtime alone owns the cluster"),
];

// ---------------------------------------------------------------------------------------
// Views

#[derive(Serialize)]
struct RowView {
    id: String,
    href: String,
    name: String,
    description: String,
    labels: Vec<Pair>,
    phase: Option<String>,
    phase_class: &'static str,
    /// Why the phase could not be read.
    phase_error: Option<String>,
    created_at: String,
    created_iso: String,
}

fn phase_class(phase: &str) -> &'static str {
    match phase {
        "pallet" => "state-live",
        "draining" | "switching" => "state-draining",
        "swarm" => "state-info",
        _ => "state-never",
    }
}

#[derive(Serialize)]
struct ClusterView {
    id: String,
    href: String,
    name: String,
    description: String,
    labels: Vec<Pair>,
    machine_user_id: String,
    revision: u64,
    /// Whether an administrator enabled its relay, and the origin Capstan minted for it.
    relay_enabled: bool,
    relay_origin: Option<String>,
    created_at: String,
    created_iso: String,
    updated_at: String,
    updated_iso: String,
    /// The panels the plugins loaded here add to a cluster's page (on its detail only).
    panels: Vec<super::plugin_pages::PanelView>,
}

fn cluster_view(value: &Value) -> ClusterView {
    let id = str_of(value, "id").to_string();
    let (created_at, created_iso) = when(u64_of(value, "createdAt"));
    let (updated_at, updated_iso) = when(u64_of(value, "updatedAt"));
    ClusterView {
        href: format!("/clusters/{}", encode(&id)),
        id,
        name: str_of(value, "name").into(),
        description: str_of(value, "description").into(),
        labels: pairs_of(value.get("labels")),
        machine_user_id: str_of(value, "machineUserId").into(),
        revision: u64_of(value, "revision"),
        relay_enabled: value.pointer("/relay/enabled").and_then(Value::as_bool).unwrap_or(false),
        relay_origin: value.pointer("/relay/origin").and_then(Value::as_str).map(str::to_string),
        created_at,
        created_iso,
        updated_at,
        updated_iso,
        panels: Vec::new(),
    }
}

#[derive(Serialize)]
struct RuntimeView {
    phase: String,
    phase_class: &'static str,
    generation: u64,
    updated_at: String,
    updated_iso: String,
    updated_by: String,
}

fn runtime_view(value: &Value) -> RuntimeView {
    let phase = str_of(value, "phase").to_string();
    let (updated_at, updated_iso) = when(u64_of(value, "updatedAt"));
    RuntimeView {
        phase_class: phase_class(&phase),
        phase,
        generation: u64_of(value, "generation"),
        updated_at,
        updated_iso,
        updated_by: str_of(value, "updatedBy").into(),
    }
}

/// The relay as the Relays panel shows it.
#[derive(Serialize)]
struct RelayView {
    /// `off`, `awaiting` (enabled, nothing registered) or `registered`.
    state: &'static str,
    /// The line the panel shows: `off`, `enabled, awaiting relay registration`, or
    /// `registered · <address>:<port> · <version> · since <accepted>`.
    summary: String,
    enabled: bool,
    origin: Option<String>,
    /// Whether a socket carries the registration now (registered only).
    live: Option<bool>,
    /// How many sockets carry it (registered only).
    live_sessions: Option<u64>,
    node_id: Option<String>,
    node_href: Option<String>,
    accepted_iso: Option<String>,
    /// The registration's generation (registered only).
    registration_generation: Option<u64>,
    /// Why the registration could not be read (`forbidden`, …), shown in place of it.
    registration_error: Option<ErrorView>,
    /// The relay credential's current generation; `None` while none was minted.
    credential_generation: Option<u64>,
    credential_error: Option<ErrorView>,
    /// The command that hands the bearer to the relay's operator.
    export_command: String,
    /// The cluster revision the enable and disable forms state.
    expected_revision: u64,
    /// Where the panel re-fetches itself, and where its forms post.
    panel_href: String,
    action: String,
}

/// `10.0.0.5:8443`, `[fd00::1]:8443`, the address alone without a port, `None` without one.
fn listen_address(item: &Value) -> Option<String> {
    let address = item.get("listenAddress").and_then(Value::as_str).filter(|a| !a.is_empty())?;
    let address: String = address.chars().take(64).collect();
    Some(match item.get("listenPort").and_then(Value::as_u64) {
        Some(port) if address.contains(':') => format!("[{address}]:{port}"),
        Some(port) => format!("{address}:{port}"),
        None => address,
    })
}

/// The panel's view of `cluster`'s relay from its `relays.list` item (`Ok(None)`: none
/// registered, or a host without `relays.list`) and its credential.
fn relay_view(cluster: &ClusterView, registration: &Result<Option<Value>>, credential: &Result<Option<Value>>) -> RelayView {
    let href = format!("/clusters/{}", encode(&cluster.id));
    let mut view = RelayView {
        state: "off",
        summary: "off".into(),
        enabled: cluster.relay_enabled,
        origin: cluster.relay_origin.clone(),
        live: None,
        live_sessions: None,
        node_id: None,
        node_href: None,
        accepted_iso: None,
        registration_generation: None,
        registration_error: None,
        credential_generation: None,
        credential_error: None,
        export_command: format!("capstan keyring export-relay-authorization --cluster {} --out FILE", cluster.id),
        expected_revision: cluster.revision,
        panel_href: format!("{href}/relay/panel"),
        action: format!("{href}/relay"),
    };
    match credential {
        Ok(answer) => {
            view.credential_generation = answer.as_ref().and_then(|a| a.pointer("/credential/generation")).and_then(Value::as_u64)
        }
        Err(refusal) => view.credential_error = Some(ErrorView::from(refusal)),
    }
    if !cluster.relay_enabled {
        return view;
    }
    view.state = "awaiting";
    view.summary = "enabled, awaiting relay registration".into();
    let item = match registration {
        Ok(Some(item)) => item,
        Ok(None) => return view,
        Err(refusal) => {
            view.registration_error = Some(ErrorView::from(refusal));
            return view;
        }
    };
    let accepted = u64_of(item, "acceptedAt");
    let (accepted_at, accepted_iso) = when(accepted);
    let version: String = str_of(item, "version").chars().take(64).collect();
    let mut parts = vec!["registered".to_string()];
    parts.extend(listen_address(item));
    parts.push(version);
    parts.push(format!("since {accepted_at}"));
    let node_id = str_of(item, "nodeId").to_string();
    view.state = "registered";
    view.summary = parts.join(" · ");
    view.live = Some(item.get("live").and_then(Value::as_bool).unwrap_or(false));
    view.live_sessions = item.get("liveSessions").and_then(Value::as_u64);
    view.node_href = (!node_id.is_empty()).then(|| format!("/nodes/{}", encode(&node_id)));
    view.node_id = (!node_id.is_empty()).then_some(node_id);
    view.accepted_iso = Some(accepted_iso);
    view.registration_generation = item.pointer("/acceptedRegistration/generation").and_then(Value::as_u64);
    view
}

/// What the create and edit forms show: what was read, or what the operator typed.
#[derive(Serialize, Default)]
struct FormView {
    name: String,
    description: String,
    labels: String,
    expected_revision: String,
}

impl FormView {
    fn typed(form: &FormData) -> FormView {
        FormView {
            name: form.raw("name").chars().take(200).collect(),
            description: form.raw("description").chars().take(2000).collect(),
            labels: form.raw("labels").chars().take(8000).collect(),
            expected_revision: form.text("expectedRevision").chars().take(40).collect(),
        }
    }

    fn of(cluster: &ClusterView) -> FormView {
        FormView {
            name: cluster.name.clone(),
            description: cluster.description.clone(),
            labels: format_pairs(&cluster.labels),
            expected_revision: cluster.revision.to_string(),
        }
    }
}

#[derive(Serialize)]
struct PhaseOption {
    value: &'static str,
    summary: &'static str,
    selected: bool,
}

fn phase_options(selected: &str) -> Vec<PhaseOption> {
    PHASES.iter().map(|&(value, summary)| PhaseOption { value, summary, selected: value == selected }).collect()
}

// ---------------------------------------------------------------------------------------
// Reading

/// The list panel's context: one page of clusters with their phases, or the refusal.
async fn list_context(state: &Host, identity: &Viewer, cursor: Option<&str>) -> minijinja::Value {
    let mut body = json!({ "limit": PAGE });
    if let Some(cursor) = cursor {
        body["cursor"] = json!(cursor);
    }
    let here = cursor.map(|c| format!("?cursor={}", encode(c))).unwrap_or_default();
    let listing = match call(state, identity, "clusters.list", body).await {
        Ok(listing) => listing,
        Err(refusal) => return context! { clusters => Serde(None::<Vec<RowView>>), error => Serde(Some(ErrorView::from(&refusal))), here },
    };
    let mut rows = Vec::new();
    for item in listing["items"].as_array().into_iter().flatten() {
        let cluster = cluster_view(item);
        let (phase, phase_error) = match call(state, identity, "clusters.getRuntime", json!({ "id": cluster.id })).await {
            Ok(runtime) => (Some(str_of(&runtime, "phase").to_string()), None),
            Err(refusal) => (None, Some(refusal.code.to_string())),
        };
        rows.push(RowView {
            phase_class: phase.as_deref().map_or("state-never", phase_class),
            phase,
            phase_error,
            id: cluster.id,
            href: cluster.href,
            name: cluster.name,
            description: cluster.description,
            labels: cluster.labels,
            created_at: cluster.created_at,
            created_iso: cluster.created_iso,
        });
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    let next = listing["nextCursor"].as_str().map(|c| format!("/clusters?cursor={}", encode(c)));
    context! { clusters => Serde(Some(rows)), error => Serde(None::<ErrorView>), next, here }
}

/// One cluster and its runtime, as the detail shows them.
async fn read_cluster(state: &Host, identity: &Viewer, id: &str) -> Result<(ClusterView, std::result::Result<RuntimeView, ErrorView>)> {
    let answer = call(state, identity, "clusters.get", json!({ "id": id })).await?;
    let mut cluster = cluster_view(&answer);
    cluster.panels = super::plugin_pages::entity_panels(state, identity, "cluster", &answer);
    let runtime = match call(state, identity, "clusters.getRuntime", json!({ "id": id })).await {
        Ok(runtime) => Ok(runtime_view(&runtime)),
        Err(refusal) => Err(ErrorView::from(&refusal)),
    };
    Ok((cluster, runtime))
}

/// The Relays panel's context for `cluster` (`None`: the cluster cannot be shown, and
/// neither is the panel): its registration from `relays.list` and its credential.
async fn relay_context(state: &Host, identity: &Viewer, cluster: Option<&ClusterView>) -> minijinja::Value {
    let Some(cluster) = cluster else { return context! { relay => Serde(None::<RelayView>) } };
    let registration = call_if_served(state, identity, "relays.list", json!({ "clusterIds": [cluster.id] })).await.map(|answer| {
        answer.and_then(|answer| {
            answer["items"].as_array().and_then(|items| items.iter().find(|item| str_of(item, "clusterId") == cluster.id).cloned())
        })
    });
    let credential = call_if_served(state, identity, "relays.getCredential", json!({ "clusterId": cluster.id })).await;
    context! { relay => Serde(Some(relay_view(cluster, &registration, &credential))) }
}

/// The facts panel's context (the cluster, or why it cannot be shown).
fn facts_context(id: &str, read: &Result<(ClusterView, std::result::Result<RuntimeView, ErrorView>)>) -> minijinja::Value {
    let panel_href = format!("/clusters/{}/panel", encode(id));
    match read {
        Ok((cluster, runtime)) => {
            let (runtime, runtime_error) = match runtime {
                Ok(runtime) => (Some(runtime), None),
                Err(error) => (None, Some(error)),
            };
            context! { cluster => Serde(Some(cluster)), runtime => Serde(runtime), runtime_error => Serde(runtime_error), error => Serde(None::<ErrorView>), panel_href }
        }
        Err(refusal) => context! { cluster => Serde(None::<ClusterView>), error => Serde(Some(ErrorView::from(refusal))), panel_href },
    }
}

// ---------------------------------------------------------------------------------------
// Pages

#[derive(Deserialize)]
pub(super) struct ListQuery {
    cursor: Option<String>,
    done: Option<String>,
    name: Option<String>,
}

fn done_flash(query: &ListQuery) -> Option<Flash> {
    let name = shown_name(query.name.as_deref()).unwrap_or_else(|| "The cluster".into());
    match query.done.as_deref()? {
        "deleted" => Some(Flash::done(
            format!("Cluster {name} deleted"),
            "Its machine user and runtime phase were removed with it; its agents can no longer authenticate.",
        )),
        _ => None,
    }
}

async fn list_page(
    state: &Host,
    identity: &Viewer,
    status: StatusCode,
    cursor: Option<&str>,
    flash: Option<Flash>,
    form: FormView,
) -> Response {
    let head = live::head(state, identity).await;
    let ctx = context! {
        page => "Clusters",
        nav => Serde(nav(state, "clusters")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        form => Serde(form),
        ..context! { ..live::element(head, AREAS), ..list_context(state, identity, cursor).await }
    };
    render(status, "clusters.html", ctx)
}

/// `GET /clusters`: the list and the create form.
pub(super) async fn page(State(state): State<Host>, Signed(identity): Signed, uri: Uri) -> Response {
    let query = query_of(&uri).unwrap_or(ListQuery { cursor: None, done: None, name: None });
    list_page(&state, &identity, StatusCode::OK, query.cursor.as_deref(), done_flash(&query), FormView::default()).await
}

/// `GET /clusters/panel`: the list alone, for htmx to swap in place.
pub(super) async fn panel(State(state): State<Host>, Signed(identity): Signed, uri: Uri) -> Response {
    let cursor = query_of::<ListQuery>(&uri).and_then(|q| q.cursor);
    render(StatusCode::OK, "clusters_panel.html", list_context(&state, &identity, cursor.as_deref()).await)
}

/// `POST /clusters/create` (`name`, `description`, `labels`): the answer page shows the
/// machine user's token once; a refusal shows the list again with the form as typed.
pub(super) async fn create(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let title = "The cluster was not created";
    let refused = |refusal: Refusal| Flash::refused(title, &refusal, "Nothing was created.");
    let labels = match parse_pairs("labels", form.raw("labels"), "KEY=value, one per line") {
        Ok(labels) => labels,
        Err(refusal) => {
            return list_page(&state, &identity, status_of(&refusal), None, Some(refused(refusal)), FormView::typed(&form)).await;
        }
    };
    let body = json!({ "name": form.text("name"), "description": form.raw("description").trim_end(), "labels": labels });
    match call(&state, &identity, "clusters.create", body).await {
        Ok(created) => {
            let cluster = cluster_view(&created["cluster"]);
            let runtime = runtime_view(&created["runtime"]);
            let machine = &created["machineUser"];
            let ctx = context! {
                page => format!("Cluster {} created", cluster.name),
                nav => Serde(nav(&state, "clusters")),
                user => Serde(user_view(&identity)),
                cluster => Serde(cluster),
                runtime => Serde(runtime),
                machine_user => context! {
                    user_id => str_of(machine, "userId"),
                    username => str_of(machine, "username"),
                    token => str_of(machine, "token"),
                },
            };
            render(StatusCode::OK, "cluster_created.html", ctx)
        }
        Err(refusal) => list_page(&state, &identity, status_of(&refusal), None, Some(refused(refusal)), FormView::typed(&form)).await,
    }
}

#[derive(Deserialize)]
pub(super) struct DetailQuery {
    done: Option<String>,
}

/// The detail page: facts, the edit and phase forms, the way to delete.
async fn detail_page(
    state: &Host,
    identity: &Viewer,
    id: &str,
    status: StatusCode,
    flash: Option<Flash>,
    typed: Option<FormView>,
    typed_phase: Option<(String, String)>,
) -> Response {
    let head = live::head(state, identity).await;
    let read = read_cluster(state, identity, id).await;
    let (form, phase_form, name) = match &read {
        Ok((cluster, runtime)) => {
            let form = typed.unwrap_or_else(|| FormView::of(cluster));
            let (phase, generation) = match (typed_phase, runtime) {
                (Some(typed), _) => typed,
                (None, Ok(runtime)) => (runtime.phase.clone(), runtime.generation.to_string()),
                (None, Err(_)) => (String::new(), String::new()),
            };
            let phase_form = context! { options => Serde(phase_options(&phase)), expected_generation => generation };
            (Some(form), Some(phase_form), cluster.name.clone())
        }
        Err(_) => (None, None, String::new()),
    };
    let status = match (&read, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let relay = relay_context(state, identity, read.as_ref().ok().map(|(cluster, _)| cluster)).await;
    let runtime = match &read {
        Ok(_) => super::runtime::slots_context(state, identity, id, None).await,
        Err(_) => context! {},
    };
    let ctx = context! {
        page => if name.is_empty() { "Cluster".to_string() } else { format!("Cluster {name}") },
        nav => Serde(nav(state, "clusters")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        form => Serde(form),
        phase_form,
        delete_href => format!("/clusters/{}/delete", encode(id)),
        action => format!("/clusters/{}", encode(id)),
        ..context! { ..live::element(head, AREAS), ..context! { ..relay, ..facts_context(id, &read), ..runtime } }
    };
    render(status, "cluster.html", ctx)
}

/// `GET /clusters/{id}`.
pub(super) async fn detail(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let flash = match query_of::<DetailQuery>(&uri).and_then(|q| q.done).as_deref() {
        Some("updated") => Some(Flash::done("Cluster updated", "The new name, description and labels are stored.")),
        Some("phase") => Some(Flash::done("Runtime phase set", "The cluster's runtime phase moved; its generation advanced.")),
        Some("relay-enabled") => Some(Flash::done(
            "Relay enabled",
            "Capstan minted the relay's origin. Export its authorization with the command in the Relays panel and start the relay.",
        )),
        Some("relay-disabled") => Some(Flash::done("Relay disabled", "The cluster's relay origin was removed.")),
        _ => None,
    };
    detail_page(&state, &identity, &id, StatusCode::OK, flash, None, None).await
}

/// `GET /clusters/{id}/panel`: the facts alone, for htmx.
pub(super) async fn detail_panel(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>) -> Response {
    let read = read_cluster(&state, &identity, &id).await;
    render(StatusCode::OK, "cluster_panel.html", facts_context(&id, &read))
}

/// `POST /clusters/{id}/update` (`expectedRevision`, `name`, `description`, `labels`).
pub(super) async fn update(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let title = "The cluster was not changed";
    let body = parse_pairs("labels", form.raw("labels"), "KEY=value, one per line").map(|labels| {
        json!({
            "id": id,
            "expectedRevision": number(form.text("expectedRevision")),
            "name": form.text("name"),
            "description": form.raw("description").trim_end(),
            "labels": labels,
        })
    });
    let result = match body {
        Ok(body) => call(&state, &identity, "clusters.update", body).await,
        Err(refusal) => Err(refusal),
    };
    match result {
        Ok(_) => redirect(&format!("/clusters/{}?done=updated", encode(&id))),
        Err(refusal) => {
            let mut typed = FormView::typed(&form);
            let after = if refusal.is("conflict") {
                // the form keeps what was typed, now against the revision stored: sending it
                // again replaces what the other change did, knowingly
                if let Some(revision) = refusal.data.as_ref().and_then(|d| d.get("revision")).and_then(Value::as_u64) {
                    typed.expected_revision = revision.to_string();
                }
                "Someone changed it since this page read it: the details show it as stored now. Your edits are still in the form; send them again to replace it."
            } else {
                "Nothing was changed."
            };
            let flash = Flash::refused(title, &refusal, after);
            detail_page(&state, &identity, &id, status_of(&refusal), Some(flash), Some(typed), None).await
        }
    }
}

/// `POST /clusters/{id}/phase` (`phase`, `expectedGeneration`).
pub(super) async fn set_phase(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let body = json!({ "id": id, "phase": form.text("phase"), "expectedGeneration": number(form.text("expectedGeneration")) });
    match call(&state, &identity, "clusters.setRuntimePhase", body).await {
        Ok(_) => redirect(&format!("/clusters/{}?done=phase", encode(&id))),
        Err(refusal) => {
            let after = if refusal.is("conflict") {
                "The phase moved since this page read it: check the phase shown now and choose again."
            } else {
                "The phase did not move."
            };
            let flash = Flash::refused("The runtime phase was not set", &refusal, after);
            // after a conflict the form offers the generation stored now; else what was sent
            let generation = match refusal.data.as_ref().and_then(|d| d.get("generation")).and_then(Value::as_u64) {
                Some(generation) if refusal.is("conflict") => generation.to_string(),
                _ => form.text("expectedGeneration").chars().take(40).collect(),
            };
            let typed_phase = (form.text("phase").chars().take(40).collect(), generation);
            detail_page(&state, &identity, &id, status_of(&refusal), Some(flash), None, Some(typed_phase)).await
        }
    }
}

/// `GET /clusters/{id}/relay/panel`: the Relays panel alone, for htmx.
pub(super) async fn relay_panel(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>) -> Response {
    let cluster = call(&state, &identity, "clusters.get", json!({ "id": id })).await.map(|value| cluster_view(&value));
    let ctx = match &cluster {
        Ok(cluster) => relay_context(&state, &identity, Some(cluster)).await,
        Err(refusal) => context! {
            relay => Serde(None::<RelayView>),
            relay_error => Serde(Some(ErrorView::from(refusal))),
            relay_panel_href => format!("/clusters/{}/relay/panel", encode(&id)),
        },
    };
    render(StatusCode::OK, "cluster_relay.html", ctx)
}

/// `POST /clusters/{id}/relay/enable` (`expectedRevision`).
pub(super) async fn enable_relay(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    switch_relay(state, id, request, true).await
}

/// `POST /clusters/{id}/relay/disable` (`expectedRevision`).
pub(super) async fn disable_relay(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    switch_relay(state, id, request, false).await
}

/// `clusters.enableRelay` or `clusters.disableRelay` with the revision the page read; a
/// refusal is the detail page again with the refusal's code in its banner.
async fn switch_relay(state: Host, id: String, request: Request, enable: bool) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let (method, done, title) = if enable {
        ("clusters.enableRelay", "relay-enabled", "The relay was not enabled")
    } else {
        ("clusters.disableRelay", "relay-disabled", "The relay was not disabled")
    };
    let body = json!({ "id": id, "expectedRevision": number(form.text("expectedRevision")) });
    match call(&state, &identity, method, body).await {
        Ok(_) => redirect(&format!("/clusters/{}?done={done}", encode(&id))),
        Err(refusal) => {
            let after = if refusal.is("conflict") {
                "The cluster changed since this page read it: check the relay shown now and try again."
            } else if refusal.is("relay-zone-unset") {
                "Set clusterRelayZone on the Settings page first, then enable the relay."
            } else {
                "Nothing was changed."
            };
            let flash = Flash::refused(title, &refusal, after);
            detail_page(&state, &identity, &id, status_of(&refusal), Some(flash), None, None).await
        }
    }
}

// ---------------------------------------------------------------------------------------
// Deletion

/// The confirmation page: what goes with the cluster, and its name to type.
async fn confirm_page(
    state: &Host,
    identity: &Viewer,
    id: &str,
    status: StatusCode,
    flash: Option<Flash>,
    typed: &str,
    revision: Option<String>,
) -> Response {
    let read = call(state, identity, "clusters.get", json!({ "id": id })).await;
    let (cluster, error) = match &read {
        Ok(value) => (Some(cluster_view(value)), None),
        Err(refusal) => (None, Some(ErrorView::from(refusal))),
    };
    let status = match (&read, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let confirm = cluster.as_ref().map(|c| {
        context! {
            kind => "cluster",
            name => c.name.clone(),
            action => format!("/clusters/{}/delete", encode(id)),
            cancel => c.href.clone(),
            expected_revision => revision.clone().unwrap_or_else(|| c.revision.to_string()),
            typed => typed.chars().take(200).collect::<String>(),
            consequences => vec![
                format!("Its machine user {} is deleted, and every session of it ends: the cluster's agents can no longer authenticate.", c.machine_user_id),
                "Its runtime phase record goes with it.".to_string(),
                "Capstan refuses while nodes still belong to it (cluster-has-nodes).".to_string(),
            ],
        }
    });
    let ctx = context! {
        page => cluster.as_ref().map(|c| format!("Delete cluster {}", c.name)).unwrap_or_else(|| "Delete cluster".into()),
        nav => Serde(nav(state, "clusters")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(error),
        back => "/clusters",
        confirm,
    };
    render(status, "confirm_delete.html", ctx)
}

/// `GET /clusters/{id}/delete`: the confirmation step.
pub(super) async fn confirm(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>) -> Response {
    confirm_page(&state, &identity, &id, StatusCode::OK, None, "", None).await
}

/// `POST /clusters/{id}/delete` (`expectedRevision`, `confirm`: the cluster's name).
pub(super) async fn delete(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let title = "The cluster was not deleted";
    let typed = form.text("confirm");
    let revision = Some(form.text("expectedRevision").chars().take(40).collect());
    let current = match call(&state, &identity, "clusters.get", json!({ "id": id })).await {
        Ok(current) => current,
        Err(refusal) => {
            let flash = Flash::refused(title, &refusal, "");
            return confirm_page(&state, &identity, &id, status_of(&refusal), Some(flash), typed, revision).await;
        }
    };
    let name = str_of(&current, "name").to_string();
    if typed != name {
        let refusal = Refusal::new("confirmation-mismatch", format!("type the cluster's name, {name}, to confirm its deletion"))
            .with_data(json!({ "field": "confirm" }));
        let flash = Flash::refused(title, &refusal, "Nothing was deleted.");
        return confirm_page(&state, &identity, &id, StatusCode::BAD_REQUEST, Some(flash), typed, revision).await;
    }
    let body = json!({ "id": id, "expectedRevision": number(form.text("expectedRevision")) });
    match call(&state, &identity, "clusters.delete", body).await {
        Ok(_) => redirect(&format!("/clusters?done=deleted&name={}", encode(&name))),
        Err(refusal) => {
            let after = if refusal.is("conflict") {
                "It changed since this page read it: review it and confirm again."
            } else {
                "Nothing was deleted."
            };
            let flash = Flash::refused(title, &refusal, after);
            // a fresh confirmation reads the revision stored now
            let revision = if refusal.is("conflict") { None } else { revision };
            confirm_page(&state, &identity, &id, status_of(&refusal), Some(flash), typed, revision).await
        }
    }
}
