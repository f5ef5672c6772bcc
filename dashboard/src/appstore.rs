//! The App Store view at `/appstore`: the catalog's status (the active revision and its signer,
//! or why none is active; the sources and the loader's last and next attempt), a "Refresh now"
//! button and an "Import catalog" form (administrators), the apps the catalog offers, and an
//! organization's services with newer versions offered. An app's page (`/appstore/apps/{id}`)
//! shows its versions (withdrawn ones marked, with the publisher's reason), the chosen
//! version's template, and the install form; an upgrade is previewed on a page of its own
//! (`/appstore/upgrade?service=…`) and confirmed there.
//!
//! Everything the view shows or does goes through the App Store plugin's methods
//! (`appstore.getCatalogStatus`, `refreshCatalog`, `importCatalog`, `listApps`,
//! `getAppConfig`, `install`, `listUpgradeable`, `getUpgradePreview`, `upgrade`) as the
//! logged-in person, dispatched exactly as `POST /api/v1/appstore.<method>` is: the host checks
//! the role each method declares and validates the body, so owners, members and administrators
//! may do here exactly what the API lets them. The only host methods read are
//! `organizations.list` (the pickers) and `services.get` (the revision an upgrade states).
//!
//! A plugin that is not serving (not installed yet: first-party plugins are installed in the
//! background at start; failed to load; disabled) is a page that says so with the refusal's
//! code, never a 500; so is a catalog that is unavailable. Every plugin refusal is shown by its
//! code (`#flash.banner-error[data-code]` after a post, `data-code` on the section's banner).

use super::forms::{
    ErrorView, Flash, FormData, Signed, call, call_plugin, encode, format_ports, format_volumes, number, pairs_of, parse_list, post,
    query_of, redirect, shown_name, status_of, str_of, strings_of, u64_of, when,
};
use super::services::organizations;
use super::{nav, now_secs, render, time_left, user_view};
use crate::api::{AppState, RequestId};
use crate::auth::Identity;
use crate::refusal::{Refusal, Result};
use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The plugin whose methods this view calls.
const PLUGIN: &str = "appstore";
/// The body limit of `POST /appstore/import`: the largest envelope the format allows
/// (8 MiB), form-encoded, with room to spare (every other dashboard form is held to 16 KiB).
pub(super) const IMPORT_FORM_LIMIT: usize = capstan_catalog::MAX_ENVELOPE_BYTES / 2 * 3;
/// A refused envelope is put back in the form only up to this size.
const KEPT_ENVELOPE: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------
// Calls

/// One request of the view: the person asking and the request id the plugin's log lines carry.
struct Asker {
    state: AppState,
    identity: Identity,
    request_id: String,
}

impl Asker {
    fn new(state: &AppState, identity: Identity, request_id: String) -> Asker {
        Asker { state: state.clone(), identity, request_id }
    }

    /// `appstore.<method>`, as the API dispatches it.
    async fn plugin(&self, method: &str, body: Value) -> Result<Value> {
        call_plugin(&self.state, &self.identity, &self.request_id, PLUGIN, method, body).await
    }

    /// A registered host method.
    async fn host(&self, method: &str, body: Value) -> Result<Value> {
        call(&self.state, &self.identity, method, body).await
    }
}

fn request_id(extension: Option<Extension<RequestId>>) -> String {
    extension.map(|Extension(id)| id.0).unwrap_or_default()
}

fn request_id_of(request: &Request) -> String {
    request.extensions().get::<RequestId>().map(|id| id.0.clone()).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// Views

/// A time as the pages show it.
#[derive(Serialize)]
struct When {
    at: String,
    iso: String,
}

/// A time in milliseconds since the epoch (the plugin's clock).
fn when_ms(ms: Option<u64>) -> Option<When> {
    ms.map(|ms| {
        let (at, iso) = when(ms / 1000);
        When { at, iso }
    })
}

#[derive(Serialize)]
struct ActiveView {
    revision: u64,
    digest: String,
    digest_short: String,
    signer: String,
    apps: u64,
    activated: Option<When>,
    /// A source URL, or `import`.
    source: String,
    imported: bool,
}

#[derive(Serialize)]
struct SourceErrorView {
    source: String,
    code: String,
    message: String,
    /// What the refusal names as its cause, when it names one (a TLS failure's reason).
    cause: Option<String>,
}

#[derive(Serialize)]
struct LoaderView {
    last_attempt: Option<When>,
    last_success: Option<When>,
    last_outcome: Option<String>,
    consecutive_failures: u64,
    next_attempt: Option<When>,
    /// `in 14 min`, or `due now` once the time has come.
    next_in: Option<String>,
    errors: Vec<SourceErrorView>,
}

/// `appstore.getCatalogStatus` as the page shows it.
#[derive(Serialize)]
struct CatalogView {
    available: bool,
    active: Option<ActiveView>,
    /// Why no catalog is active (its code and message), when none is.
    unavailable: Option<ErrorView>,
    sources: Vec<String>,
    loader: LoaderView,
}

fn catalog_view(status: &Value) -> CatalogView {
    let active = status.get("active").filter(|a| a.is_object()).map(|a| {
        let digest = str_of(a, "digest").to_string();
        let source = str_of(a, "source").to_string();
        ActiveView {
            revision: u64_of(a, "revision"),
            digest_short: digest.chars().take(16).collect(),
            digest,
            signer: str_of(a, "signer").into(),
            apps: u64_of(a, "apps"),
            activated: when_ms(a.get("activatedAt").and_then(Value::as_u64)),
            imported: source == "import",
            source,
        }
    });
    let unavailable = status
        .get("unavailable")
        .filter(|u| u.is_object())
        .map(|u| ErrorView { code: str_of(u, "code").into(), message: str_of(u, "message").trim_end_matches('.').into() });
    let loader = status.get("loader").cloned().unwrap_or(Value::Null);
    let ms = |key: &str| loader.get(key).and_then(Value::as_u64);
    let next_in = ms("nextAttemptAt").map(|at| {
        let secs = at / 1000;
        if secs <= now_secs() { "due now".to_string() } else { time_left(secs) }
    });
    let errors = loader
        .get("errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| SourceErrorView {
            source: str_of(e, "source").into(),
            code: str_of(e, "code").into(),
            message: str_of(e, "message").into(),
            cause: e.get("cause").and_then(Value::as_str).map(str::to_string),
        })
        .collect();
    CatalogView {
        available: status.get("available").and_then(Value::as_bool).unwrap_or(false) && active.is_some(),
        active,
        unavailable,
        sources: strings_of(status.get("sources")),
        loader: LoaderView {
            last_attempt: when_ms(ms("lastAttemptAt")),
            last_success: when_ms(ms("lastSuccessAt")),
            last_outcome: loader.get("lastOutcome").and_then(Value::as_str).map(str::to_string),
            consecutive_failures: u64_of(&loader, "consecutiveFailures"),
            next_attempt: when_ms(ms("nextAttemptAt")),
            next_in,
            errors,
        },
    }
}

fn app_href(app_id: &str, org: Option<&str>) -> String {
    match org.filter(|o| !o.is_empty()) {
        Some(org) => format!("/appstore/apps/{}?org={}", encode(app_id), encode(org)),
        None => format!("/appstore/apps/{}", encode(app_id)),
    }
}

/// An app as `appstore.listApps` lists it.
#[derive(Serialize, Clone)]
struct AppRow {
    id: String,
    href: String,
    name: String,
    description: String,
    categories: Vec<String>,
    /// What a new install gets (`None` when every version is withdrawn).
    newest_version: Option<String>,
    /// Offered versions, newest first.
    versions: Vec<String>,
    withdrawn: Vec<WithdrawnView>,
}

#[derive(Serialize, Clone)]
struct WithdrawnView {
    version: String,
    reason: String,
}

fn app_rows(listing: &Value, org: Option<&str>) -> Vec<AppRow> {
    let mut rows: Vec<AppRow> = listing["apps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|app| {
            let id = str_of(app, "id").to_string();
            AppRow {
                href: app_href(&id, org),
                name: str_of(app, "name").into(),
                description: str_of(app, "description").into(),
                categories: strings_of(app.get("categories")),
                newest_version: app.get("newestVersion").and_then(Value::as_str).map(str::to_string),
                versions: strings_of(app.get("versions")),
                withdrawn: app
                    .get("withdrawn")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|w| WithdrawnView { version: str_of(w, "version").into(), reason: str_of(w, "reason").into() })
                    .collect(),
                id,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.to_lowercase().cmp(&b.name.to_lowercase()).then_with(|| a.id.cmp(&b.id)));
    rows
}

/// A service `appstore.listUpgradeable` lists.
#[derive(Serialize)]
struct UpgradeRow {
    service_id: String,
    name: String,
    app_id: String,
    current_version: String,
    /// Offered versions greater than the current one, oldest first.
    available: Vec<String>,
    newest: String,
    preview_href: String,
    service_href: String,
    app_href: String,
}

fn upgrade_href(service_id: &str, version: Option<&str>) -> String {
    let mut href = format!("/appstore/upgrade?service={}", encode(service_id));
    if let Some(version) = version.filter(|v| !v.is_empty()) {
        href.push_str(&format!("&version={}", encode(version)));
    }
    href
}

fn upgrade_rows(listing: &Value, org: &str) -> Vec<UpgradeRow> {
    let mut rows: Vec<UpgradeRow> = listing
        .as_array()
        .into_iter()
        .flatten()
        .map(|row| {
            let service_id = str_of(row, "serviceId").to_string();
            let app_id = str_of(row, "appId").to_string();
            let available = strings_of(row.get("available"));
            let newest = available.last().cloned().unwrap_or_default();
            UpgradeRow {
                preview_href: upgrade_href(&service_id, Some(&newest)),
                service_href: format!("/services/{}", encode(&service_id)),
                app_href: app_href(&app_id, Some(org)),
                name: str_of(row, "name").into(),
                current_version: str_of(row, "currentVersion").into(),
                service_id,
                app_id,
                available,
                newest,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// A version as a link would carry it: only what a semantic version may be.
fn shown_version(version: Option<&str>) -> Option<String> {
    version
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b".+-".contains(&b)))
        .map(str::to_string)
}

/// A refusal code as a link would carry it: kebab-case only.
fn shown_code(code: Option<&str>) -> Option<String> {
    code.filter(|c| !c.is_empty() && c.len() <= 64 && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        .map(str::to_string)
}

fn clip(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

// ---------------------------------------------------------------------------------------
// The index page

#[derive(Deserialize, Default)]
pub(super) struct IndexQuery {
    org: Option<String>,
    done: Option<String>,
    outcome: Option<String>,
    revision: Option<String>,
    code: Option<String>,
    name: Option<String>,
    version: Option<String>,
}

/// What `?done=…` reports. Every value from the link is checked for its shape before it is
/// shown, so a crafted link cannot put other words on the page.
fn done_flash(query: &IndexQuery) -> Option<Flash> {
    let revision = query.revision.as_deref().and_then(|r| r.parse::<u64>().ok());
    let revision_text = revision.map(|r| format!(" {r}")).unwrap_or_default();
    match (query.done.as_deref()?, query.outcome.as_deref()) {
        ("imported", Some("activated")) => Some(Flash::done(
            format!("Catalog revision{revision_text} activated"),
            "Its apps are offered below; services that name one of its versions get their snapshot.",
        )),
        ("imported", Some("unchanged")) => {
            Some(Flash::done(format!("Catalog revision{revision_text} is already active"), "Nothing was changed."))
        }
        ("imported", Some("superseded")) => Some(Flash::done(
            "A newer catalog is active already",
            "Another node stored a greater revision meanwhile; that one stays active.",
        )),
        ("refreshed", Some("activated")) => Some(Flash::done(
            format!("Catalog refreshed: revision{revision_text} activated"),
            "A source answered a newer catalog; its apps are offered below.",
        )),
        ("refreshed", Some("unchanged" | "superseded")) => Some(Flash::done(
            "Catalog refreshed: nothing newer",
            format!("A source answered; the active catalog (revision{revision_text}) stays."),
        )),
        ("refreshed", Some("no-sources")) => Some(Flash::done(
            "No catalog sources to ask",
            "List https URLs in the setting appstore.catalogSources, or import a signed catalog below.",
        )),
        ("refreshed", Some("failed")) => {
            let code = shown_code(query.code.as_deref()).unwrap_or_else(|| "catalog-source-failed".into());
            let refusal = Refusal::new(code, "no catalog source answered a catalog that may be used");
            Some(Flash::refused(
                "The catalog was not refreshed",
                &refusal,
                "The active catalog stays; each source's error is listed under Catalog sources.",
            ))
        }
        ("upgraded", _) => {
            let name = shown_name(query.name.as_deref());
            let version = shown_version(query.version.as_deref());
            let title = match (&name, &version) {
                (Some(name), Some(version)) => format!("Service {name} upgraded to {version}"),
                (Some(name), None) => format!("Service {name} upgraded"),
                _ => "Service upgraded".to_string(),
            };
            Some(Flash::done(title, "Its new template and snapshot are stored; managers roll it out from here."))
        }
        _ => None,
    }
}

/// What the index page shows besides what it reads: the banner and the import form as typed.
#[derive(Default)]
struct Extras {
    flash: Option<Flash>,
    envelope: String,
}

async fn index_page(asker: &Asker, status: StatusCode, org: Option<&str>, extras: Extras) -> Response {
    let (catalog, unavailable) = match asker.plugin("getCatalogStatus", json!({})).await {
        Ok(status) => (Some(catalog_view(&status)), None),
        Err(refusal) => (None, Some(ErrorView::from(&refusal))),
    };
    let (options, selected, orgs_error) = match organizations(&asker.state, &asker.identity, org).await {
        Ok((options, selected)) => (options, selected, None),
        Err(refusal) => (Vec::new(), None, Some(ErrorView::from(&refusal))),
    };
    let org_id = selected.as_ref().map(|o| o.id.clone());
    let (apps, apps_error) = match &catalog {
        Some(_) => match asker.plugin("listApps", json!({})).await {
            Ok(listing) => (Some(app_rows(&listing, org_id.as_deref())), None),
            Err(refusal) => (None, Some(ErrorView::from(&refusal))),
        },
        None => (None, None),
    };
    // nothing is offered while no catalog is active: the catalog's banner says why
    let (upgradeable, upgradeable_error) = match (&catalog, &selected) {
        (Some(catalog), Some(org)) if catalog.available => {
            match asker.plugin("listUpgradeable", json!({ "organizationId": org.id })).await {
                Ok(listing) => (Some(upgrade_rows(&listing, &org.id)), None),
                Err(refusal) => (None, Some(ErrorView::from(&refusal))),
            }
        }
        _ => (None, None),
    };
    let ctx = context! {
        page => "App Store",
        nav => Serde(nav(&asker.state, "apps")),
        user => Serde(user_view(&asker.identity)),
        flash => Serde(extras.flash),
        unavailable => Serde(unavailable),
        catalog => Serde(catalog),
        apps => Serde(apps),
        apps_error => Serde(apps_error),
        organizations => Serde(options),
        organizations_error => Serde(orgs_error),
        org => Serde(selected),
        upgradeable => Serde(upgradeable),
        upgradeable_error => Serde(upgradeable_error),
        envelope => extras.envelope,
    };
    render(status, "appstore.html", ctx)
}

/// `GET /appstore?org=<id>`: the catalog, the apps, the organization's upgradeable services.
pub(super) async fn page(State(state): State<AppState>, Signed(identity): Signed, id: Option<Extension<RequestId>>, uri: Uri) -> Response {
    let query: IndexQuery = query_of(&uri).unwrap_or_default();
    let extras = Extras { flash: done_flash(&query), ..Extras::default() };
    index_page(&Asker::new(&state, identity, request_id(id)), StatusCode::OK, query.org.as_deref(), extras).await
}

/// Where a post on the index page goes back to.
fn index_href(org: &str) -> String {
    if org.is_empty() { "/appstore?".to_string() } else { format!("/appstore?org={}&", encode(org)) }
}

/// `POST /appstore/refresh` (`org`): ask the catalog sources now (`appstore.refreshCatalog`).
pub(super) async fn refresh(State(state): State<AppState>, request: Request) -> Response {
    let id = request_id_of(&request);
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let asker = Asker::new(&state, identity, id);
    let org = form.text("org").to_string();
    match asker.plugin("refreshCatalog", json!({})).await {
        Ok(status) => {
            let loader = &status["loader"];
            let outcome = loader["lastOutcome"].as_str().unwrap_or("failed");
            let mut location = format!("{}done=refreshed&outcome={}", index_href(&org), encode(outcome));
            if let Some(revision) = status["active"]["revision"].as_u64() {
                location.push_str(&format!("&revision={revision}"));
            }
            if let Some(code) = loader["errors"][0]["code"].as_str() {
                location.push_str(&format!("&code={}", encode(code)));
            }
            redirect(&location)
        }
        Err(refusal) => {
            let flash = Flash::refused("The catalog was not refreshed", &refusal, "The active catalog stays.");
            index_page(&asker, status_of(&refusal), Some(&org), Extras { flash: Some(flash), ..Extras::default() }).await
        }
    }
}

/// `POST /appstore/import` (`envelope`, `org`): activate an operator-carried signed catalog
/// (`appstore.importCatalog`). A refusal names the catalog's own code; the active one stays.
pub(super) async fn import(State(state): State<AppState>, request: Request) -> Response {
    let id = request_id_of(&request);
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let asker = Asker::new(&state, identity, id);
    let org = form.text("org").to_string();
    let envelope = form.text("envelope");
    let result = if envelope.is_empty() {
        Err(Refusal::invalid_request("paste the signed catalog envelope (what capstan appstore sign-catalog wrote)")
            .with_data(json!({ "field": "envelope" })))
    } else {
        asker.plugin("importCatalog", json!({ "envelope": envelope })).await
    };
    match result {
        Ok(imported) => {
            let outcome = imported["outcome"].as_str().unwrap_or("activated");
            let revision = imported["status"]["active"]["revision"].as_u64().or_else(|| imported["revision"].as_u64()).unwrap_or(0);
            redirect(&format!("{}done=imported&outcome={}&revision={revision}", index_href(&org), encode(outcome)))
        }
        Err(refusal) => {
            let flash = Flash::refused("The catalog was not imported", &refusal, "Nothing was changed; the active catalog stays.");
            let envelope = if envelope.len() <= KEPT_ENVELOPE { envelope.to_string() } else { String::new() };
            index_page(&asker, status_of(&refusal), Some(&org), Extras { flash: Some(flash), envelope }).await
        }
    }
}

// ---------------------------------------------------------------------------------------
// An app's page and its install form

#[derive(Serialize)]
struct VersionRow {
    version: String,
    href: String,
    selected: bool,
    /// What a new install gets.
    newest: bool,
    withdrawn: Option<String>,
}

/// Every version of an app, offered and withdrawn, newest first.
fn version_rows(app: &AppRow, selected: &str, org: Option<&str>) -> Vec<VersionRow> {
    let mut all: Vec<(String, Option<String>)> = app.versions.iter().map(|v| (v.clone(), None)).collect();
    all.extend(app.withdrawn.iter().map(|w| (w.version.clone(), Some(w.reason.clone()))));
    let key = |v: &str| semver::Version::parse(v).ok();
    all.sort_by(|(a, _), (b, _)| match (key(a), key(b)) {
        (Some(a), Some(b)) => b.cmp(&a),
        _ => b.cmp(a),
    });
    all.dedup_by(|a, b| a.0 == b.0);
    all.into_iter()
        .map(|(version, withdrawn)| {
            let mut href = app_href(&app.id, org);
            href.push_str(if href.contains('?') { "&" } else { "?" });
            href.push_str(&format!("version={}", encode(&version)));
            VersionRow {
                selected: version == selected,
                newest: app.newest_version.as_deref() == Some(version.as_str()),
                href,
                withdrawn,
                version,
            }
        })
        .collect()
}

/// `appstore.getAppConfig` as the page shows it.
#[derive(Serialize)]
struct ConfigView {
    version: String,
    notes: String,
    withdrawn: Option<String>,
    image: String,
    ports: Vec<String>,
    environment: Vec<super::forms::Pair>,
    volumes: Vec<String>,
    capabilities: Vec<String>,
    template_digest: String,
    catalog_revision: u64,
}

fn config_view(config: &Value) -> ConfigView {
    let template = config.get("template").cloned().unwrap_or(Value::Null);
    ConfigView {
        version: str_of(config, "version").into(),
        notes: str_of(config, "notes").into(),
        withdrawn: config.get("withdrawn").and_then(Value::as_str).map(str::to_string),
        image: str_of(&template, "image").into(),
        ports: format_ports(template.get("ports")),
        environment: pairs_of(template.get("environment")),
        volumes: format_volumes(template.get("volumes")),
        capabilities: strings_of(template.get("capabilities")),
        template_digest: str_of(config, "templateDigest").into(),
        catalog_revision: u64_of(config, "catalogRevision"),
    }
}

/// The install form as typed (after a refusal).
#[derive(Serialize, Default)]
struct InstallForm {
    name: String,
    version: String,
    domains: String,
    scale: String,
}

impl InstallForm {
    fn typed(form: &FormData) -> InstallForm {
        InstallForm {
            name: clip(form.raw("name"), 200),
            version: clip(form.text("version"), 64),
            domains: clip(form.raw("domains"), 8000),
            scale: clip(form.text("scale"), 40),
        }
    }
}

#[derive(Deserialize, Default)]
pub(super) struct AppQuery {
    org: Option<String>,
    version: Option<String>,
    done: Option<String>,
    name: Option<String>,
    service: Option<String>,
}

/// What the app page shows besides what it reads.
#[derive(Default)]
struct AppExtras {
    flash: Option<Flash>,
    typed: Option<InstallForm>,
    /// The service an install just created (`/services/<id>`).
    installed_href: Option<String>,
}

async fn app_page(
    asker: &Asker,
    app_id: &str,
    status: StatusCode,
    org: Option<&str>,
    version: Option<&str>,
    extras: AppExtras,
) -> Response {
    let mut body = json!({ "appId": app_id });
    if let Some(version) = version.filter(|v| !v.is_empty()) {
        body["version"] = json!(version);
    }
    let config = asker.plugin("getAppConfig", body).await;
    let listing = asker.plugin("listApps", json!({})).await;
    let (options, selected_org, orgs_error) = match organizations(&asker.state, &asker.identity, org).await {
        Ok((options, selected)) => (options, selected, None),
        Err(refusal) => (Vec::new(), None, Some(ErrorView::from(&refusal))),
    };
    let org_id = selected_org.as_ref().map(|o| o.id.clone());
    let app = listing.as_ref().ok().and_then(|l| app_rows(l, org_id.as_deref()).into_iter().find(|a| a.id == app_id));
    let config = config.map(|c| config_view(&c));
    let versions = match (&app, &config) {
        (Some(app), Ok(config)) => version_rows(app, &config.version, org_id.as_deref()),
        (Some(app), Err(_)) => version_rows(app, "", org_id.as_deref()),
        _ => Vec::new(),
    };
    let error = config.as_ref().err().or(listing.as_ref().err()).map(ErrorView::from);
    let status = match (&config, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let form = extras.typed.unwrap_or_else(|| InstallForm {
        version: config.as_ref().ok().map(|c| c.version.clone()).unwrap_or_default(),
        ..InstallForm::default()
    });
    let name = app.as_ref().map(|a| a.name.clone()).unwrap_or_else(|| app_id.chars().take(63).collect());
    let back = match &org_id {
        Some(org) => format!("/appstore?org={}", encode(org)),
        None => "/appstore".to_string(),
    };
    let ctx = context! {
        page => format!("App {name}"),
        nav => Serde(nav(&asker.state, "apps")),
        user => Serde(user_view(&asker.identity)),
        flash => Serde(extras.flash),
        installed_href => extras.installed_href,
        app => Serde(app),
        app_id,
        config => Serde(config.ok()),
        error => Serde(error),
        versions => Serde(versions),
        organizations => Serde(options),
        organizations_error => Serde(orgs_error),
        org => Serde(selected_org),
        form => Serde(form),
        action => format!("/appstore/apps/{}/install", encode(app_id)),
        back,
    };
    render(status, "appstore_app.html", ctx)
}

/// `GET /appstore/apps/{id}?org=&version=`: the app, its versions, the install form.
pub(super) async fn app(
    State(state): State<AppState>,
    Signed(identity): Signed,
    Path(app_id): Path<String>,
    id: Option<Extension<RequestId>>,
    uri: Uri,
) -> Response {
    let query: AppQuery = query_of(&uri).unwrap_or_default();
    let asker = Asker::new(&state, identity, request_id(id));
    let mut extras = AppExtras::default();
    if query.done.as_deref() == Some("installed") {
        let service = shown_name(query.name.as_deref());
        let title = match &service {
            Some(service) => format!("App {} installed as {service}", shown_name(Some(&app_id)).unwrap_or_else(|| "it".into())),
            None => "App installed".to_string(),
        };
        extras.flash = Some(Flash::done(
            title,
            "It is a service in its organization now, carrying the version's snapshot; the App Store offers it upgrades from here.",
        ));
        extras.installed_href = query.service.as_deref().filter(|s| !s.is_empty()).map(|s| format!("/services/{}", encode(s)));
    }
    let version = if query.done.is_some() { None } else { query.version.as_deref() };
    app_page(&asker, &app_id, StatusCode::OK, query.org.as_deref(), version, extras).await
}

/// `POST /appstore/apps/{id}/install` (`organizationId`, `name`, `version`, `domains`,
/// `scale`): `appstore.install`; on success back to the app page, which names the service.
pub(super) async fn install(State(state): State<AppState>, Path(app_id): Path<String>, request: Request) -> Response {
    let id = request_id_of(&request);
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let asker = Asker::new(&state, identity, id);
    let org = form.text("organizationId").to_string();
    let name = form.text("name").to_string();
    let mut body = json!({ "organizationId": org, "appId": app_id, "name": name });
    if !form.text("version").is_empty() {
        body["version"] = json!(form.text("version"));
    }
    let domains = parse_list(form.raw("domains"));
    if !domains.is_empty() {
        body["domains"] = Value::from(domains);
    }
    if !form.text("scale").is_empty() {
        body["scale"] = number(form.text("scale"));
    }
    match asker.plugin("install", body).await {
        Ok(installed) => {
            let service = str_of(&installed, "id");
            redirect(&format!(
                "/appstore/apps/{}?org={}&done=installed&name={}&service={}",
                encode(&app_id),
                encode(&org),
                encode(&name),
                encode(service)
            ))
        }
        Err(refusal) => {
            let flash = Flash::refused("The app was not installed", &refusal, "Nothing was created; your entries are kept below.");
            let typed = InstallForm::typed(&form);
            let version = (!typed.version.is_empty()).then(|| typed.version.clone());
            let extras = AppExtras { flash: Some(flash), typed: Some(typed), installed_href: None };
            app_page(&asker, &app_id, status_of(&refusal), Some(&org), version.as_deref(), extras).await
        }
    }
}

// ---------------------------------------------------------------------------------------
// Upgrades: preview, then confirm

/// `appstore.getUpgradePreview` as the page shows it.
#[derive(Serialize)]
struct PreviewView {
    app_id: String,
    from: String,
    to: String,
    image_from: String,
    image_to: String,
    image_changed: bool,
    environment_added: Vec<String>,
    environment_removed: Vec<String>,
    environment_changed: Vec<String>,
    ports_changed: bool,
    volumes_changed: bool,
    notes: Vec<String>,
}

fn preview_view(preview: &Value) -> PreviewView {
    let image = preview.get("image").cloned().unwrap_or(Value::Null);
    let (image_from, image_to) = (str_of(&image, "from").to_string(), str_of(&image, "to").to_string());
    PreviewView {
        app_id: str_of(preview, "appId").into(),
        from: str_of(preview, "from").into(),
        to: str_of(preview, "to").into(),
        image_changed: image_from != image_to,
        image_from,
        image_to,
        environment_added: strings_of(preview.get("environmentAdded")),
        environment_removed: strings_of(preview.get("environmentRemoved")),
        environment_changed: strings_of(preview.get("environmentChanged")),
        ports_changed: preview.get("portsChanged").and_then(Value::as_bool).unwrap_or(false),
        volumes_changed: preview.get("volumesChanged").and_then(Value::as_bool).unwrap_or(false),
        notes: strings_of(preview.get("notes")),
    }
}

/// The service an upgrade is for, as `services.get` reads it.
#[derive(Serialize)]
struct ServiceView {
    id: String,
    name: String,
    organization_id: String,
    image: String,
    revision: u64,
    href: String,
}

#[derive(Serialize)]
struct TargetLink {
    version: String,
    href: String,
    selected: bool,
}

#[derive(Deserialize, Default)]
pub(super) struct UpgradeQuery {
    service: Option<String>,
    version: Option<String>,
}

async fn upgrade_page(asker: &Asker, service_id: &str, version: Option<&str>, status: StatusCode, flash: Option<Flash>) -> Response {
    let read = asker.host("services.get", json!({ "id": service_id })).await;
    let service = read.as_ref().ok().map(|s| ServiceView {
        id: str_of(s, "id").into(),
        name: str_of(s, "name").into(),
        organization_id: str_of(s, "organizationId").into(),
        image: str_of(s, "image").into(),
        revision: u64_of(s, "revision"),
        href: format!("/services/{}", encode(str_of(s, "id"))),
    });
    let (preview, targets) = match &service {
        Some(service) => {
            let mut body = json!({ "organizationId": service.organization_id, "serviceId": service.id });
            if let Some(version) = version.filter(|v| !v.is_empty()) {
                body["version"] = json!(version);
            }
            let preview = asker.plugin("getUpgradePreview", body).await.map(|p| preview_view(&p));
            // the other versions it may go to (a courtesy: the preview stands without them)
            let to = preview.as_ref().map(|p| p.to.clone()).unwrap_or_default();
            let targets: Vec<TargetLink> = match asker.plugin("listUpgradeable", json!({ "organizationId": service.organization_id })).await
            {
                Ok(listing) => upgrade_rows(&listing, &service.organization_id)
                    .into_iter()
                    .find(|row| row.service_id == service.id)
                    .map(|row| {
                        row.available
                            .iter()
                            .map(|v| TargetLink { selected: *v == to, href: upgrade_href(&service.id, Some(v)), version: v.clone() })
                            .collect()
                    })
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            };
            (Some(preview), targets)
        }
        None => (None, Vec::new()),
    };
    let error = match (&read, &preview) {
        (Err(refusal), _) | (_, Some(Err(refusal))) => Some(ErrorView::from(refusal)),
        _ => None,
    };
    let status = match (&read, &preview, status) {
        (Err(refusal), _, StatusCode::OK) | (_, Some(Err(refusal)), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let preview = preview.and_then(|p| p.ok());
    let back = match &service {
        Some(service) => format!("/appstore?org={}", encode(&service.organization_id)),
        None => "/appstore".to_string(),
    };
    let page = match &service {
        Some(service) => format!("Upgrade {}", service.name),
        None => "Upgrade".to_string(),
    };
    let ctx = context! {
        page,
        nav => Serde(nav(&asker.state, "apps")),
        user => Serde(user_view(&asker.identity)),
        flash => Serde(flash),
        error => Serde(error),
        service => Serde(service),
        preview => Serde(preview),
        targets => Serde(targets),
        back,
    };
    render(status, "appstore_upgrade.html", ctx)
}

/// `GET /appstore/upgrade?service=<id>&version=`: what upgrading the service changes, and the
/// button that does it.
pub(super) async fn upgrade_preview(
    State(state): State<AppState>,
    Signed(identity): Signed,
    id: Option<Extension<RequestId>>,
    uri: Uri,
) -> Response {
    let query: UpgradeQuery = query_of(&uri).unwrap_or_default();
    let asker = Asker::new(&state, identity, request_id(id));
    let service = query.service.unwrap_or_default();
    upgrade_page(&asker, &service, query.version.as_deref(), StatusCode::OK, None).await
}

/// `POST /appstore/upgrade` (`organizationId`, `serviceId`, `version`, `expectedRevision`):
/// `appstore.upgrade` against the service revision the preview read.
pub(super) async fn upgrade(State(state): State<AppState>, request: Request) -> Response {
    let id = request_id_of(&request);
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let asker = Asker::new(&state, identity, id);
    let (org, service_id, version) =
        (form.text("organizationId").to_string(), form.text("serviceId").to_string(), form.text("version").to_string());
    let mut body = json!({ "organizationId": org, "serviceId": service_id, "expectedRevision": number(form.text("expectedRevision")) });
    if !version.is_empty() {
        body["version"] = json!(version);
    }
    match asker.plugin("upgrade", body).await {
        Ok(upgraded) => {
            // the name is a courtesy for the banner
            let name = match asker.host("services.get", json!({ "id": service_id })).await {
                Ok(service) => str_of(&service, "name").to_string(),
                Err(_) => String::new(),
            };
            redirect(&format!("{}done=upgraded&name={}&version={}", index_href(&org), encode(&name), encode(str_of(&upgraded, "to"))))
        }
        Err(refusal) => {
            let after = if refusal.is("conflict") {
                "The service changed since the preview read it: the preview below is read again; review it and confirm again."
            } else {
                "Nothing was changed."
            };
            let flash = Flash::refused("The service was not upgraded", &refusal, after);
            upgrade_page(&asker, &service_id, Some(&version), status_of(&refusal), Some(flash)).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_values_are_shown_only_in_their_shape() {
        assert_eq!(shown_version(Some("1.2.3-rc.1+build.5")).as_deref(), Some("1.2.3-rc.1+build.5"));
        assert_eq!(shown_version(Some("1.0 <b>")), None);
        assert_eq!(shown_code(Some("catalog-key-untrusted")).as_deref(), Some("catalog-key-untrusted"));
        assert_eq!(shown_code(Some("Catalog Key")), None);
        let query =
            IndexQuery { done: Some("refreshed".into()), outcome: Some("failed".into()), code: Some("<x>".into()), ..Default::default() };
        let flash = done_flash(&query).unwrap();
        assert_eq!((flash.ok, flash.code.as_deref()), (false, Some("catalog-source-failed")));
        let query = IndexQuery {
            done: Some("imported".into()),
            outcome: Some("activated".into()),
            revision: Some("7".into()),
            ..Default::default()
        };
        assert_eq!(done_flash(&query).unwrap().title, "Catalog revision 7 activated");
    }

    #[test]
    fn versions_are_listed_newest_first_with_withdrawn_ones_marked() {
        let listing = json!({ "apps": [{
            "id": "wiki", "name": "Wiki", "description": "", "categories": [], "newestVersion": "1.10.0",
            "versions": ["1.10.0", "1.2.0"], "withdrawn": [{ "version": "1.9.0", "reason": "data loss" }]
        }]});
        let app = app_rows(&listing, Some("org_1")).remove(0);
        let rows = version_rows(&app, "1.2.0", Some("org_1"));
        let shown: Vec<(&str, bool, bool, Option<&str>)> =
            rows.iter().map(|r| (r.version.as_str(), r.selected, r.newest, r.withdrawn.as_deref())).collect();
        assert_eq!(shown, [("1.10.0", false, true, None), ("1.9.0", false, false, Some("data loss")), ("1.2.0", true, false, None)]);
        assert_eq!(rows[0].href, "/appstore/apps/wiki?org=org_1&version=1.10.0");
    }
}
