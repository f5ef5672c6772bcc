//! The Services view at `/services`: an organization's services (picked from the
//! organizations the person may see), created, edited and deleted through forms, and
//! organizations created (administrators). Everything goes through the `organizations.*`
//! and `services.*` methods as the logged-in person, so owners, members and administrators
//! see and may do exactly what the API lets them.
//!
//! Ports, domains, environment, volumes and mail addresses are typed one per line
//! (`443:8080/http`, `KEY=value`, `data:/var/lib/app`); the method judges every value. An
//! edit states the revision the page read (a stale one shows `conflict`). A deletion is
//! confirmed by typing the service's name; a service that managers still hold stays
//! `deleting`, and its page says which holds it waits for.
//!
//! A service's page also carries where it runs: the Runtime card and the "Run on cluster"
//! form ([`super::runtime`]).
//!
//! The list and the detail facts re-fetch themselves when a `service.*` or
//! `organization.*` event commits, the Runtime card when a `runtime.*` one does (see
//! [`super::live`]).

use super::forms::{
    ErrorView, Flash, FormData, PAGE, Pair, Signed, call, encode, format_pairs, format_ports, format_volumes, number, pairs_of, parse_list,
    parse_pairs, parse_ports, parse_volumes, post, query_of, redirect, shown_name, status_of, str_of, strings_of, u64_of, when,
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
use serde_json::{Map, Value, json};

const AREAS: &[&str] = &["service", "organization", super::runtime::AREA];
/// The most organizations the picker offers.
const ORGANIZATIONS: usize = 200;

// ---------------------------------------------------------------------------------------
// Views

#[derive(Serialize, Clone)]
pub(super) struct OrgOption {
    pub id: String,
    pub name: String,
    pub selected: bool,
}

#[derive(Serialize)]
struct ServiceView {
    id: String,
    href: String,
    name: String,
    organization_id: String,
    image: String,
    scale: u64,
    ports: Vec<String>,
    domains: Vec<String>,
    environment: Vec<Pair>,
    volumes: Vec<String>,
    /// The database it keeps in a volume, `volume/path (engine)`.
    database: Option<String>,
    mail_addresses: Vec<String>,
    /// The panels the plugins loaded here add to a service's page.
    panels: Vec<super::plugin_pages::PanelView>,
    state: String,
    deleting: bool,
    deleting_at: Option<String>,
    holds: Vec<String>,
    revision: u64,
    created_at: String,
    created_iso: String,
    updated_at: String,
    updated_iso: String,
}

fn service_view(value: &Value) -> ServiceView {
    let id = str_of(value, "id").to_string();
    let (created_at, created_iso) = when(u64_of(value, "createdAt"));
    let (updated_at, updated_iso) = when(u64_of(value, "updatedAt"));
    let state = str_of(value, "state").to_string();
    ServiceView {
        href: format!("/services/{}", encode(&id)),
        id,
        name: str_of(value, "name").into(),
        organization_id: str_of(value, "organizationId").into(),
        image: str_of(value, "image").into(),
        scale: u64_of(value, "scale"),
        ports: format_ports(value.get("ports")),
        domains: strings_of(value.get("domains")),
        environment: pairs_of(value.get("environment")),
        volumes: format_volumes(value.get("volumes")),
        database: value
            .get("database")
            .filter(|db| db.is_object())
            .map(|db| format!("{}/{} ({})", str_of(db, "volume"), str_of(db, "path"), str_of(db, "engine"))),
        mail_addresses: strings_of(value.get("mailAddresses")),
        panels: Vec::new(),
        deleting: state == "deleting",
        deleting_at: value.get("deletingAt").and_then(Value::as_u64).map(|at| when(at).0),
        state,
        holds: strings_of(value.get("holds")),
        revision: u64_of(value, "revision"),
        created_at,
        created_iso,
        updated_at,
        updated_iso,
    }
}

/// What the create and edit forms show: what was read, or what the operator typed.
#[derive(Serialize, Default)]
pub(super) struct FormView {
    name: String,
    image: String,
    scale: String,
    ports: String,
    domains: String,
    environment: String,
    volumes: String,
    mail_addresses: String,
    expected_revision: String,
}

fn clip(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

impl FormView {
    fn typed(form: &FormData) -> FormView {
        FormView {
            name: clip(form.raw("name"), 200),
            image: clip(form.raw("image"), 600),
            scale: clip(form.raw("scale"), 40),
            ports: clip(form.raw("ports"), 4000),
            domains: clip(form.raw("domains"), 8000),
            environment: clip(form.raw("environment"), 12_000),
            volumes: clip(form.raw("volumes"), 8000),
            mail_addresses: clip(form.raw("mailAddresses"), 8000),
            expected_revision: clip(form.text("expectedRevision"), 40),
        }
    }

    fn of(service: &ServiceView) -> FormView {
        let lines = |items: &[String]| items.iter().map(|i| format!("{i}\n")).collect::<String>();
        FormView {
            name: service.name.clone(),
            image: service.image.clone(),
            scale: service.scale.to_string(),
            ports: lines(&service.ports),
            domains: lines(&service.domains),
            environment: format_pairs(&service.environment),
            volumes: lines(&service.volumes),
            mail_addresses: lines(&service.mail_addresses),
            expected_revision: service.revision.to_string(),
        }
    }
}

/// The fields a create or an update sends, from the form; `scale` only when one was typed
/// (left empty: the default on create, unchanged on update).
fn fields(form: &FormData) -> Result<Map<String, Value>> {
    let mut body = Map::new();
    body.insert("name".into(), json!(form.text("name")));
    body.insert("image".into(), json!(form.text("image")));
    if !form.text("scale").is_empty() {
        body.insert("scale".into(), number(form.text("scale")));
    }
    body.insert("ports".into(), Value::from(parse_ports("ports", form.raw("ports"))?));
    body.insert("domains".into(), Value::from(parse_list(form.raw("domains"))));
    body.insert("environment".into(), Value::from(parse_pairs("environment", form.raw("environment"), "KEY=value, one per line")?));
    body.insert("volumes".into(), Value::from(parse_volumes("volumes", form.raw("volumes"))?));
    body.insert("mailAddresses".into(), Value::from(parse_list(form.raw("mailAddresses"))));
    Ok(body)
}

// ---------------------------------------------------------------------------------------
// Reading

/// The organizations the person may see, the chosen one marked (the asked one, else the
/// first), or why they could not be read.
pub(super) async fn organizations(
    state: &Host,
    identity: &Viewer,
    asked: Option<&str>,
) -> std::result::Result<(Vec<OrgOption>, Option<OrgOption>), Refusal> {
    let listing = call(state, identity, "organizations.list", json!({ "limit": ORGANIZATIONS })).await?;
    let mut options: Vec<OrgOption> = listing["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| OrgOption { id: str_of(o, "id").into(), name: str_of(o, "name").into(), selected: false })
        .collect();
    options.sort_by(|a, b| a.name.cmp(&b.name));
    let chosen = match asked.filter(|a| !a.is_empty()) {
        Some(asked) => options.iter().position(|o| o.id == asked).map(Ok).unwrap_or(Err(asked.to_string())),
        None => options.first().map(|_| Ok(0)).unwrap_or(Err(String::new())),
    };
    let selected = match chosen {
        Ok(i) => {
            options[i].selected = true;
            Some(options[i].clone())
        }
        // an organization not on the list (a member who was removed, a stale link): the
        // services method says why it cannot be listed
        Err(asked) if !asked.is_empty() => Some(OrgOption { name: asked.clone(), id: asked, selected: true }),
        Err(_) => None,
    };
    Ok((options, selected))
}

#[derive(Serialize)]
struct RowView {
    id: String,
    href: String,
    name: String,
    image: String,
    scale: u64,
    ports: Vec<String>,
    domains: Vec<String>,
    state: String,
    created_at: String,
    created_iso: String,
}

/// The list panel's context: one page of the organization's services, or the refusal.
async fn list_context(state: &Host, identity: &Viewer, org: Option<&OrgOption>, cursor: Option<&str>) -> minijinja::Value {
    let Some(org) = org else {
        return context! { services => Serde(None::<Vec<RowView>>), error => Serde(None::<ErrorView>), org => Serde(None::<OrgOption>), here => "" };
    };
    let mut here = format!("?org={}", encode(&org.id));
    let mut body = json!({ "organizationId": org.id, "limit": PAGE });
    if let Some(cursor) = cursor {
        body["cursor"] = json!(cursor);
        here.push_str(&format!("&cursor={}", encode(cursor)));
    }
    match call(state, identity, "services.list", body).await {
        Ok(listing) => {
            let mut rows: Vec<RowView> = listing["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|item| {
                    let s = service_view(item);
                    RowView {
                        id: s.id,
                        href: s.href,
                        name: s.name,
                        image: s.image,
                        scale: s.scale,
                        ports: s.ports,
                        domains: s.domains,
                        state: s.state,
                        created_at: s.created_at,
                        created_iso: s.created_iso,
                    }
                })
                .collect();
            rows.sort_by(|a, b| a.name.cmp(&b.name));
            let next = listing["nextCursor"].as_str().map(|c| format!("/services?org={}&cursor={}", encode(&org.id), encode(c)));
            context! { services => Serde(Some(rows)), error => Serde(None::<ErrorView>), org => Serde(Some(org)), next, here }
        }
        Err(refusal) => {
            context! { services => Serde(None::<Vec<RowView>>), error => Serde(Some(ErrorView::from(&refusal))), org => Serde(Some(org)), here }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The list page

#[derive(Deserialize, Default)]
pub(super) struct ListQuery {
    org: Option<String>,
    cursor: Option<String>,
    done: Option<String>,
    name: Option<String>,
}

fn done_flash(query: &ListQuery) -> Option<Flash> {
    let name = shown_name(query.name.as_deref());
    let named = |what: &str, done: &str| match &name {
        Some(name) => format!("{what} {name} {done}"),
        None => format!("{what} {done}"),
    };
    match query.done.as_deref()? {
        "deleted" => Some(Flash::done(named("Service", "deleted"), "Nothing held it any more, so it is gone, with its deployment grants.")),
        "organization-created" => Some(Flash::done(
            named("Organization", "created"),
            "Create its first service below; an owner or an administrator gives people roles in it (organizations.setMember).",
        )),
        _ => None,
    }
}

/// What the list page shows besides the list: the banner and both forms as typed.
#[derive(Default)]
struct Extras {
    flash: Option<Flash>,
    service_form: FormView,
    organization_name: String,
}

async fn list_page(
    state: &Host,
    identity: &Viewer,
    status: StatusCode,
    org: Option<&str>,
    cursor: Option<&str>,
    extras: Extras,
) -> Response {
    let head = live::head(state, identity).await;
    let (options, selected, orgs_error) = match organizations(state, identity, org).await {
        Ok((options, selected)) => (options, selected, None),
        Err(refusal) => (Vec::new(), None, Some(ErrorView::from(&refusal))),
    };
    let ctx = context! {
        page => "Services",
        nav => Serde(nav(state, "services")),
        user => Serde(user_view(identity)),
        flash => Serde(extras.flash),
        organizations => Serde(options),
        organizations_error => Serde(orgs_error),
        service_form => Serde(extras.service_form),
        organization_name => extras.organization_name,
        ..context! { ..live::element(head, AREAS), ..list_context(state, identity, selected.as_ref(), cursor).await }
    };
    render(status, "services.html", ctx)
}

/// `GET /services?org=<id>`: the organization picker, its services, the forms.
pub(super) async fn page(State(state): State<Host>, Signed(identity): Signed, uri: Uri) -> Response {
    let query = query_of(&uri).unwrap_or_default();
    let extras = Extras { flash: done_flash(&query), ..Extras::default() };
    list_page(&state, &identity, StatusCode::OK, query.org.as_deref(), query.cursor.as_deref(), extras).await
}

/// `GET /services/panel?org=<id>`: the list alone, for htmx.
pub(super) async fn panel(State(state): State<Host>, Signed(identity): Signed, uri: Uri) -> Response {
    let query: ListQuery = query_of(&uri).unwrap_or_default();
    let selected = match organizations(&state, &identity, query.org.as_deref()).await {
        Ok((_, selected)) => selected,
        Err(refusal) => {
            let ctx = context! { services => Serde(None::<Vec<RowView>>), error => Serde(Some(ErrorView::from(&refusal))), org => Serde(None::<OrgOption>), here => "" };
            return render(StatusCode::OK, "services_panel.html", ctx);
        }
    };
    render(StatusCode::OK, "services_panel.html", list_context(&state, &identity, selected.as_ref(), query.cursor.as_deref()).await)
}

/// `POST /organizations/create` (`name`).
pub(super) async fn create_organization(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    match call(&state, &identity, "organizations.create", json!({ "name": form.text("name") })).await {
        Ok(created) => {
            let (id, name) = (str_of(&created, "id"), str_of(&created, "name"));
            redirect(&format!("/services?org={}&done=organization-created&name={}", encode(id), encode(name)))
        }
        Err(refusal) => {
            let flash = Flash::refused("The organization was not created", &refusal, "Nothing was created.");
            let extras = Extras { flash: Some(flash), organization_name: clip(form.raw("name"), 200), ..Extras::default() };
            list_page(&state, &identity, status_of(&refusal), None, None, extras).await
        }
    }
}

/// `POST /services/create` (`organizationId` and the service's fields).
pub(super) async fn create(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let org = form.text("organizationId").to_string();
    let result = match fields(&form) {
        Ok(mut body) => {
            body.insert("organizationId".into(), json!(org));
            call(&state, &identity, "services.create", Value::Object(body)).await
        }
        Err(refusal) => Err(refusal),
    };
    match result {
        Ok(created) => redirect(&format!("/services/{}?done=created", encode(str_of(&created, "id")))),
        Err(refusal) => {
            let flash = Flash::refused("The service was not created", &refusal, "Nothing was created; your entries are kept below.");
            let extras = Extras { flash: Some(flash), service_form: FormView::typed(&form), ..Extras::default() };
            list_page(&state, &identity, status_of(&refusal), Some(&org), None, extras).await
        }
    }
}

// ---------------------------------------------------------------------------------------
// The detail page

async fn read_service(state: &Host, identity: &Viewer, id: &str) -> Result<(ServiceView, String)> {
    let answer = call(state, identity, "services.get", json!({ "id": id })).await?;
    let mut service = service_view(&answer);
    service.panels = super::plugin_pages::entity_panels(state, identity, "service", &answer);
    // the organization's name is a courtesy: its id stands in when it cannot be read
    let organization = match call(state, identity, "organizations.get", json!({ "id": service.organization_id })).await {
        Ok(org) => str_of(&org, "name").to_string(),
        Err(_) => service.organization_id.clone(),
    };
    Ok((service, organization))
}

fn facts_context(id: &str, read: &Result<(ServiceView, String)>) -> minijinja::Value {
    let panel_href = format!("/services/{}/panel", encode(id));
    match read {
        Ok((service, organization)) => context! {
            service => Serde(Some(service)),
            organization => organization,
            organization_href => format!("/services?org={}", encode(&service.organization_id)),
            error => Serde(None::<ErrorView>),
            panel_href,
        },
        Err(refusal) => context! { service => Serde(None::<ServiceView>), error => Serde(Some(ErrorView::from(refusal))), panel_href },
    }
}

/// The detail page: the facts, the Runtime card and its "Run on cluster" form (as typed, after
/// a refusal: `run_typed`), the edit form (as typed: `typed`), the way to delete.
pub(super) async fn detail_page(
    state: &Host,
    identity: &Viewer,
    id: &str,
    status: StatusCode,
    flash: Option<Flash>,
    typed: Option<FormView>,
    run_typed: Option<super::runtime::RunForm>,
) -> Response {
    let head = live::head(state, identity).await;
    let read = read_service(state, identity, id).await;
    let runtime = match &read {
        Ok(_) => super::runtime::service_context(state, identity, id, run_typed).await,
        Err(_) => context! {},
    };
    let (form, name) = match &read {
        Ok((service, _)) => (Some(typed.unwrap_or_else(|| FormView::of(service))), service.name.clone()),
        Err(_) => (None, String::new()),
    };
    let status = match (&read, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let ctx = context! {
        page => if name.is_empty() { "Service".to_string() } else { format!("Service {name}") },
        nav => Serde(nav(state, "services")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        form => Serde(form),
        action => format!("/services/{}", encode(id)),
        delete_href => format!("/services/{}/delete", encode(id)),
        ..context! { ..live::element(head, AREAS), ..facts_context(id, &read), ..runtime }
    };
    render(status, "service.html", ctx)
}

#[derive(Deserialize)]
pub(super) struct DetailQuery {
    done: Option<String>,
}

/// `GET /services/{id}`.
pub(super) async fn detail(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let flash = match query_of::<DetailQuery>(&uri).and_then(|q| q.done).as_deref() {
        Some("created") => Some(Flash::done("Service created", "It is stored in its organization; managers pick it up from here.")),
        Some("updated") => Some(Flash::done("Service updated", "The new definition is stored.")),
        Some("deleting") => Some(Flash::done(
            "Deletion requested",
            "The service is marked deleting and takes no new work. It is removed once every manager holding it has cleaned up.",
        )),
        Some("runtime-run") => Some(Flash::done(
            "Runtime spec written",
            "The runtime places the replicas within a few seconds; the Runtime card follows them as the nodes report.",
        )),
        Some("runtime-held") => Some(Flash::done(
            "Stopped (held)",
            "Every replica on that cluster stops and is removed; the spec is kept, and Resume runs it again.",
        )),
        Some("runtime-resumed") => Some(Flash::done("Resumed", "The spec is no longer held: the runtime places its replicas again.")),
        _ => None,
    };
    detail_page(&state, &identity, &id, StatusCode::OK, flash, None, None).await
}

/// `GET /services/{id}/panel`: the facts alone, for htmx.
pub(super) async fn detail_panel(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>) -> Response {
    let read = read_service(&state, &identity, &id).await;
    render(StatusCode::OK, "service_panel.html", facts_context(&id, &read))
}

/// `POST /services/{id}/update` (`expectedRevision` and the service's fields).
pub(super) async fn update(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let result = match fields(&form) {
        Ok(mut body) => {
            body.insert("id".into(), json!(id));
            body.insert("expectedRevision".into(), number(form.text("expectedRevision")));
            call(&state, &identity, "services.update", Value::Object(body)).await
        }
        Err(refusal) => Err(refusal),
    };
    match result {
        Ok(_) => redirect(&format!("/services/{}?done=updated", encode(&id))),
        Err(refusal) => {
            let mut typed = FormView::typed(&form);
            let after = if refusal.is("conflict") {
                if let Some(revision) = refusal.data.as_ref().and_then(|d| d.get("revision")).and_then(Value::as_u64) {
                    typed.expected_revision = revision.to_string();
                }
                "Someone changed it since this page read it: the details show it as stored now. Your edits are still in the form; send them again to replace it."
            } else {
                "Nothing was changed; your entries are kept below."
            };
            let flash = Flash::refused("The service was not changed", &refusal, after);
            detail_page(&state, &identity, &id, status_of(&refusal), Some(flash), Some(typed), None).await
        }
    }
}

// ---------------------------------------------------------------------------------------
// Deletion

async fn confirm_page(
    state: &Host,
    identity: &Viewer,
    id: &str,
    status: StatusCode,
    flash: Option<Flash>,
    typed: &str,
    revision: Option<String>,
) -> Response {
    let read = call(state, identity, "services.get", json!({ "id": id })).await;
    let (service, error) = match &read {
        Ok(value) => (Some(service_view(value)), None),
        Err(refusal) => (None, Some(ErrorView::from(refusal))),
    };
    let status = match (&read, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let confirm = service.as_ref().map(|s| {
        let mut consequences = vec![
            "It is marked deleting at once and takes no new work.".to_string(),
            "Managers that own something of it clean up first; it is removed when the last one lets go.".to_string(),
            "Its deployment grants go with it.".to_string(),
        ];
        if s.deleting {
            consequences.insert(0, "It is already being deleted: confirming again only checks whether it can be finished now.".into());
        }
        context! {
            kind => "service",
            name => s.name.clone(),
            action => format!("/services/{}/delete", encode(id)),
            cancel => s.href.clone(),
            expected_revision => revision.clone().unwrap_or_else(|| s.revision.to_string()),
            typed => clip(typed, 200),
            consequences,
        }
    });
    let back = service.as_ref().map(|s| format!("/services?org={}", encode(&s.organization_id))).unwrap_or_else(|| "/services".into());
    let ctx = context! {
        page => service.as_ref().map(|s| format!("Delete service {}", s.name)).unwrap_or_else(|| "Delete service".into()),
        nav => Serde(nav(state, "services")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(error),
        back,
        confirm,
    };
    render(status, "confirm_delete.html", ctx)
}

/// `GET /services/{id}/delete`: the confirmation step.
pub(super) async fn confirm(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>) -> Response {
    confirm_page(&state, &identity, &id, StatusCode::OK, None, "", None).await
}

/// `POST /services/{id}/delete` (`expectedRevision`, `confirm`: the service's name).
pub(super) async fn delete(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let title = "The service was not deleted";
    let typed = form.text("confirm");
    let revision = Some(clip(form.text("expectedRevision"), 40));
    let current = match call(&state, &identity, "services.get", json!({ "id": id })).await {
        Ok(current) => current,
        Err(refusal) => {
            let flash = Flash::refused(title, &refusal, "");
            return confirm_page(&state, &identity, &id, status_of(&refusal), Some(flash), typed, revision).await;
        }
    };
    let (name, org) = (str_of(&current, "name").to_string(), str_of(&current, "organizationId").to_string());
    if typed != name {
        let refusal = Refusal::new("confirmation-mismatch", format!("type the service's name, {name}, to confirm its deletion"))
            .with_data(json!({ "field": "confirm" }));
        let flash = Flash::refused(title, &refusal, "Nothing was deleted.");
        return confirm_page(&state, &identity, &id, StatusCode::BAD_REQUEST, Some(flash), typed, revision).await;
    }
    let body = json!({ "id": id, "expectedRevision": number(form.text("expectedRevision")) });
    match call(&state, &identity, "services.delete", body).await {
        Ok(answer) if str_of(&answer, "state") == "deleted" => {
            redirect(&format!("/services?org={}&done=deleted&name={}", encode(&org), encode(&name)))
        }
        Ok(_) => redirect(&format!("/services/{}?done=deleting", encode(&id))),
        Err(refusal) => {
            let after = if refusal.is("conflict") {
                "It changed since this page read it: review it and confirm again."
            } else {
                "Nothing was deleted."
            };
            let flash = Flash::refused(title, &refusal, after);
            let revision = if refusal.is("conflict") { None } else { revision };
            confirm_page(&state, &identity, &id, status_of(&refusal), Some(flash), typed, revision).await
        }
    }
}
