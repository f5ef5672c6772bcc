//! The Plugins view at `/plugins` (administrators only, like the `plugins.*` API methods): the
//! installed plugins with version, publisher, status and grants, and the lifecycle as forms.
//!
//! Installing or upgrading takes two steps. The bundle is uploaded (multipart, up to 64 MiB)
//! to `POST /plugins/inspect`, which parses it and keeps it as an upload exactly as the API's
//! upload endpoint does (nothing is kept when it does not parse), then shows what it requests
//! with a checkbox per capability. Confirming posts the upload id and the ticked capabilities
//! to `POST /plugins/install` or `POST /plugins/upgrade`; the host approves only exactly the
//! requested set and refuses `capabilities-not-approved` otherwise. Rolling back, disabling and
//! enabling are one form post each.
//!
//! Every post is checked like the login form (a foreign `Origin` is refused) and needs an
//! administrator's session. A success answers `303` to `/plugins?done=<what>&id=<plugin>`
//! (the page then says what happened); a refusal is shown on the page with its code.

use super::forms::call;
use super::{current_identity, message_page, nav, refuse_cross_origin, render, rfc3339, to_login, unavailable, user_view, utc};
use crate::Host;
use crate::Viewer;
use crate::refusal::{Refusal, Result};
use axum::Form;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use capstan_server::blobs::Blobs;
use capstan_server::plugins::bundle::{Inspection, MAX_BUNDLE_BYTES, PublisherKey};
use capstan_server::plugins::methods::{PluginList, PluginView, PublisherList, UploadView};
use capstan_server::plugins::uploads::{Spool, too_large};
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// Room for the multipart framing and the small fields around a bundle of the largest size.
const MULTIPART_SLACK: usize = 64 * 1024;
/// The body limit of `POST /plugins/inspect`.
pub(super) const UPLOAD_LIMIT: usize = MAX_BUNDLE_BYTES + MULTIPART_SLACK;
/// The longest value a small form field (`intent`, `plugin`) may have.
const FIELD_LIMIT: usize = 256;

// ---------------------------------------------------------------------------------------
// Views

#[derive(Serialize)]
struct ErrorView {
    code: String,
    message: String,
}

/// What a post did, or why it did not: the page's banner.
#[derive(Serialize)]
struct Flash {
    ok: bool,
    /// The refusal's code (refusals only).
    code: Option<String>,
    title: String,
    message: String,
}

impl Flash {
    fn done(title: impl Into<String>, message: impl Into<String>) -> Flash {
        Flash { ok: true, code: None, title: title.into(), message: message.into() }
    }

    fn refused(title: &str, refusal: &Refusal, after: &str) -> Flash {
        let mut message = refusal.message.trim_end_matches('.').to_string();
        message.push('.');
        if !after.is_empty() {
            message = format!("{message} {after}");
        }
        Flash { ok: false, code: Some(refusal.code.to_string()), title: format!("{title} ({})", refusal.code), message }
    }
}

#[derive(Serialize)]
struct PublisherView {
    first_party: bool,
    /// The key's fingerprint (16 hex digits), or the text as recorded when it does not parse.
    short: String,
    /// The whole key text (or `first-party`).
    key: String,
    /// The name it was trusted under, when added through the API; `configured` for keys from
    /// the configuration.
    name: Option<String>,
}

#[derive(Serialize)]
struct RowView {
    id: String,
    name: String,
    version: String,
    previous_version: Option<String>,
    /// `running`, `disabled` or `failed`.
    status: String,
    /// The pill class for the status.
    status_class: &'static str,
    enabled: bool,
    error: Option<ErrorView>,
    grants: Vec<String>,
    publisher: PublisherView,
    installed_at: String,
    installed_iso: String,
    installed_by: String,
    digest: String,
    methods: usize,
}

#[derive(Serialize)]
struct CapabilityRow {
    name: String,
    checked: bool,
    /// Not among the installed version's grants (upgrades only).
    new: bool,
}

/// The approval step of an install or an upgrade.
#[derive(Serialize)]
struct ApprovalView {
    upload: String,
    upgrade: bool,
    id: String,
    name: String,
    version: String,
    description: String,
    wit: String,
    /// The manifest's publisher display name (not verified).
    manifest_publisher: Option<String>,
    signer: Option<PublisherView>,
    digest: String,
    size: String,
    installed_version: Option<String>,
    capabilities: Vec<CapabilityRow>,
    /// Memory per instance, instances, and the ceiling the operator approves.
    limits: String,
    /// Signed by a trusted publisher (or first-party): only then is approving offered, since
    /// the host refuses any other bundle.
    trusted: bool,
}

/// `5.5 MiB`, `12.0 KiB`, `812 bytes`.
fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} bytes"),
    }
}

/// Call the `plugins.*` method `name` as `identity` and read its answer as `T`.
async fn call_as<T: serde::de::DeserializeOwned>(state: &Host, identity: &Viewer, name: &str, body: serde_json::Value) -> Result<T> {
    let answer = call(state, identity, name, body).await?;
    serde_json::from_value(answer).map_err(|e| Refusal::internal(format!("{name} answered an unexpected shape: {e}")))
}

/// The trusted publishers' names by fingerprint (`configured` for keys from configuration).
async fn publisher_names(state: &Host, identity: &Viewer) -> HashMap<String, String> {
    match call_as::<PublisherList>(state, identity, "plugins.listTrustedPublishers", serde_json::json!({})).await {
        Ok(list) => {
            let configured =
                list.configured.iter().filter_map(|k| k.parse::<PublisherKey>().ok()).map(|k| (k.fingerprint(), "configured".to_string()));
            configured.chain(list.added.into_iter().map(|p| (p.fingerprint, p.name))).collect()
        }
        // the names are a courtesy: the list still shows the fingerprints
        Err(refusal) => {
            tracing::warn!(code = %refusal.code, "the plugins view could not read the trusted publishers: {}", refusal.message);
            HashMap::new()
        }
    }
}

fn publisher_view(text: &str, names: &HashMap<String, String>) -> PublisherView {
    if text == "first-party" {
        return PublisherView { first_party: true, short: text.into(), key: text.into(), name: None };
    }
    match text.parse::<PublisherKey>() {
        Ok(key) => {
            let short = key.fingerprint();
            PublisherView { first_party: false, name: names.get(&short).cloned(), short, key: text.into() }
        }
        Err(_) => PublisherView { first_party: false, short: text.chars().take(24).collect(), key: text.into(), name: None },
    }
}

fn row_view(view: PluginView, names: &HashMap<String, String>) -> RowView {
    let status_class = match view.status.as_str() {
        "running" => "state-live",
        "disabled" => "state-never",
        _ => "state-stale",
    };
    let error = match (view.status.as_str(), view.last_error) {
        ("failed", Some(e)) => Some(ErrorView { code: e.code, message: e.message }),
        ("failed", None) => Some(ErrorView { code: "not-loaded".into(), message: "not loaded on this node yet".into() }),
        _ => None,
    };
    let installed = view.installed_at;
    RowView {
        publisher: publisher_view(&view.publisher, names),
        enabled: view.status != "disabled",
        status_class,
        error,
        installed_at: utc(installed),
        installed_iso: rfc3339(installed),
        installed_by: view.installed_by,
        digest: view.digest.chars().take(16).collect(),
        methods: view.methods.len(),
        id: view.id,
        name: view.name,
        version: view.version,
        previous_version: view.previous_version,
        status: view.status,
        grants: view.grants,
    }
}

/// The installed plugins as the table shows them.
async fn rows(state: &Host, identity: &Viewer) -> Result<Vec<RowView>> {
    let list: PluginList = call_as(state, identity, "plugins.list", serde_json::json!({})).await?;
    let names = publisher_names(state, identity).await;
    Ok(list.plugins.into_iter().map(|view| row_view(view, &names)).collect())
}

fn approval_view(
    upload: String,
    upgrade: bool,
    inspection: Inspection,
    installed: Option<(String, Vec<String>)>,
    checked: &BTreeSet<String>,
    names: &HashMap<String, String>,
) -> ApprovalView {
    let granted: BTreeSet<String> = installed.as_ref().map(|(_, grants)| grants.iter().cloned().collect()).unwrap_or_default();
    let capabilities = inspection
        .capabilities
        .iter()
        .map(|c| {
            let name = c.to_string();
            CapabilityRow { checked: checked.contains(&name), new: upgrade && !granted.contains(&name), name }
        })
        .collect();
    let signer = inspection.signed_by.as_deref().map(|key| publisher_view(key, names));
    ApprovalView {
        upload,
        upgrade,
        trusted: signer.as_ref().is_some_and(|s| s.first_party || s.name.is_some()),
        signer,
        size: size(inspection.component_bytes),
        installed_version: installed.map(|(version, _)| version),
        id: inspection.id,
        name: inspection.name,
        version: inspection.version,
        description: inspection.description,
        wit: inspection.wit,
        manifest_publisher: inspection.publisher,
        digest: inspection.digest,
        capabilities,
        limits: inspection.limits.summary(),
    }
}

// ---------------------------------------------------------------------------------------
// Responses

fn forbidden() -> Response {
    message_page(
        StatusCode::FORBIDDEN,
        "Administrators only",
        "The plugins view is for administrators. Ask one to show you, or to make you one.",
    )
}

/// The administrator the request's session stands for, or the answer to give instead.
async fn admin(state: &Host, headers: &HeaderMap) -> std::result::Result<Viewer, Response> {
    match current_identity(state, headers).await {
        Ok(Some(identity)) if identity.is_human_admin() => Ok(identity),
        Ok(Some(_)) => Err(forbidden()),
        Ok(None) => Err(to_login(state, headers)),
        Err(refusal) => Err(unavailable(refusal)),
    }
}

/// The status a refusal is answered with (a bundle that is too large is `413`: its body was
/// not read to the end).
fn status_of(refusal: &Refusal) -> StatusCode {
    StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

fn log_refusal(action: &str, refusal: &Refusal) {
    if refusal.http_status() >= 500 {
        tracing::error!(action, code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "a plugin action failed: {}", refusal.message);
    } else {
        tracing::info!(action, code = %refusal.code, "a plugin action was refused: {}", refusal.message);
    }
}

/// What the page's banner says.
enum Banner<'a> {
    None,
    Flash(Flash),
    /// What `?done=…&id=…` reports (it names the version, so it is made from the list).
    Done(&'a DoneQuery),
}

/// The page: the list (or why it could not be read), the install form, and a banner.
async fn list_page(state: &Host, identity: &Viewer, status: StatusCode, banner: Banner<'_>) -> Response {
    let (plugins, error) = match rows(state, identity).await {
        Ok(rows) => (Some(rows), None),
        Err(refusal) => {
            log_refusal("list", &refusal);
            (None, Some(ErrorView { code: refusal.code.to_string(), message: refusal.message.clone() }))
        }
    };
    let flash = match banner {
        Banner::None => None,
        Banner::Flash(flash) => Some(flash),
        Banner::Done(query) => done_flash(query, plugins.as_deref()),
    };
    let ctx = context! {
        page => "Plugins",
        nav => Serde(nav(state, "plugins")),
        user => Serde(user_view(identity)),
        plugins => Serde(plugins),
        error => Serde(error),
        flash => Serde(flash),
    };
    render(status, "plugins.html", ctx)
}

/// The page with a refusal in its banner, answered with the refusal's status.
async fn refused_page(state: &Host, identity: &Viewer, action: &str, title: &str, refusal: Refusal, after: &str) -> Response {
    log_refusal(action, &refusal);
    let status = status_of(&refusal);
    let mut response = list_page(state, identity, status, Banner::Flash(Flash::refused(title, &refusal, after))).await;
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        // the rest of the body is not read: this connection ends here
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The approval step for a kept upload; after a refusal, with it in the banner and its status.
async fn approval_page(
    state: &Host,
    identity: &Viewer,
    upload: String,
    upgrade: bool,
    inspection: Inspection,
    checked: &BTreeSet<String>,
    refused: Option<(StatusCode, Flash)>,
) -> Response {
    let installed = match call_as::<PluginView>(state, identity, "plugins.get", serde_json::json!({ "id": inspection.id })).await {
        Ok(view) => Some((view.version, view.grants)),
        Err(refusal) if refusal.code.ends_with("not-found") => None,
        Err(refusal) => {
            log_refusal("approve", &refusal);
            None
        }
    };
    let names = publisher_names(state, identity).await;
    let approval = approval_view(upload, upgrade, inspection, installed, checked, &names);
    let (status, flash) = match refused {
        Some((status, flash)) => (status, Some(flash)),
        None => (StatusCode::OK, None),
    };
    let title = if upgrade { "Approve the upgrade" } else { "Approve the install" };
    let ctx = context! {
        page => title,
        nav => Serde(nav(state, "plugins")),
        user => Serde(user_view(identity)),
        approval => Serde(approval),
        flash => Serde(flash),
    };
    render(status, "plugins_approve.html", ctx)
}

/// `%`-encode everything but ASCII letters, digits, `-` and `_`, for a query value.
fn query_value(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// `303` to the page, which then says what was done to which plugin.
fn done(what: &str, id: &str) -> Response {
    let location = format!("/plugins?done={what}&id={}", query_value(id));
    match HeaderValue::from_str(&location) {
        Ok(location) => (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response(),
        Err(_) => (StatusCode::SEE_OTHER, [(header::LOCATION, HeaderValue::from_static("/plugins"))]).into_response(),
    }
}

// ---------------------------------------------------------------------------------------
// GET /plugins

#[derive(Deserialize)]
struct DoneQuery {
    done: Option<String>,
    id: Option<String>,
}

/// The banner for `?done=<what>&id=<plugin>`, naming the version the plugin is at now.
fn done_flash(query: &DoneQuery, rows: Option<&[RowView]>) -> Option<Flash> {
    let what = query.done.as_deref()?;
    if what == "discarded" {
        return Some(Flash::done("Upload discarded", "The uploaded bundle was not installed and is no longer kept."));
    }
    let id: String = query.id.as_deref()?.chars().take(64).collect();
    let row = rows.and_then(|rows| rows.iter().find(|r| r.id == id));
    let at = row.map(|r| format!(" {}", r.version)).unwrap_or_default();
    let failed = row.is_some_and(|r| r.status == "failed");
    let (title, message) = match what {
        "installed" => ("Plugin installed", format!("{id}{at} is installed with the capabilities you approved.")),
        "upgraded" => ("Plugin upgraded", format!("{id} is upgraded{}; calls now go to the new version.", at.replacen(' ', " to ", 1))),
        "rolled-back" => ("Plugin rolled back", format!("{id} is back at the previous version{at}.")),
        "disabled" => ("Plugin disabled", format!("{id} no longer serves calls; its data stays.")),
        "enabled" if failed => ("Plugin enabled", format!("{id} is enabled but did not load on this node: its status says why.")),
        "enabled" => ("Plugin enabled", format!("{id} serves calls again.")),
        "rebound" => ("Publisher re-bound", format!("{id}'s next upgrade may be signed by the publisher key you named (once).")),
        _ => return None,
    };
    Some(Flash::done(title, message))
}

/// `GET /plugins`: the installed plugins and the install form.
pub(super) async fn page(State(state): State<Host>, headers: HeaderMap, uri: Uri) -> Response {
    let identity = match admin(&state, &headers).await {
        Ok(identity) => identity,
        Err(response) => return response,
    };
    let query = Query::<DoneQuery>::try_from_uri(&uri).map(|q| q.0).unwrap_or(DoneQuery { done: None, id: None });
    let banner = if query.done.is_some() { Banner::Done(&query) } else { Banner::None };
    list_page(&state, &identity, StatusCode::OK, banner).await
}

// ---------------------------------------------------------------------------------------
// POST /plugins/inspect

#[derive(Default)]
struct UploadForm {
    upgrade: bool,
    /// The plugin an Upgrade button was for.
    plugin: Option<String>,
    /// The bundle file, spooled to a temporary file as it arrived.
    bundle: Option<Spool>,
    file_name: String,
}

fn unreadable(error: &axum::extract::multipart::MultipartError) -> Refusal {
    if error.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large();
    }
    if capstan_server::bodies::is_body_timeout(error) {
        return capstan_server::bodies::body_timeout_refusal();
    }
    Refusal::invalid_request("the upload could not be read; choose the bundle file and send the form again").detail(error)
}

async fn small_field(mut field: axum::extract::multipart::Field<'_>) -> Result<String> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(|e| unreadable(&e))? {
        if bytes.len() + chunk.len() > FIELD_LIMIT {
            return Err(Refusal::invalid_request("a field of the upload form is too long"));
        }
        bytes.extend_from_slice(&chunk);
    }
    String::from_utf8(bytes).map_err(|_| Refusal::invalid_request("a field of the upload form is not text"))
}

/// The upload form: `bundle` (the file), and from an Upgrade button `intent=upgrade` and
/// `plugin=<id>`. Other fields are skipped.
async fn read_upload_form(request: Request, state: &Host) -> Result<UploadForm> {
    let mut multipart = Multipart::from_request(request, state).await.map_err(|rejection| {
        Refusal::new("unsupported-media-type", "the bundle is sent as a multipart/form-data upload").detail(rejection.body_text())
    })?;
    let mut form = UploadForm::default();
    while let Some(mut field) = multipart.next_field().await.map_err(|e| unreadable(&e))? {
        match field.name().unwrap_or_default() {
            "bundle" => {
                form.file_name = field.file_name().unwrap_or_default().chars().take(200).collect();
                let mut spool = Spool::new()?;
                while let Some(chunk) = field.chunk().await.map_err(|e| unreadable(&e))? {
                    spool.push(&chunk).await?;
                }
                form.bundle = Some(spool);
            }
            "intent" => form.upgrade = small_field(field).await?.trim() == "upgrade",
            "plugin" => form.plugin = Some(small_field(field).await?.trim().to_string()).filter(|p| !p.is_empty()),
            _ => {}
        }
    }
    Ok(form)
}

/// `POST /plugins/inspect` (multipart): keep the uploaded bundle and show what it requests
/// for approval. A bundle that does not parse is refused by name and nothing is kept.
pub(super) async fn inspect(State(state): State<Host>, State(blobs): State<Blobs>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if let Some(refused) = refuse_cross_origin(&state, &parts.headers) {
        return refused;
    }
    let identity = match admin(&state, &parts.headers).await {
        Ok(identity) => identity,
        Err(response) => return response,
    };
    let title = "The bundle was not accepted";
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > UPLOAD_LIMIT as u64) {
        return refused_page(&state, &identity, "inspect", title, too_large(), "").await;
    }
    let form = match read_upload_form(Request::from_parts(parts, body), &state).await {
        Ok(form) => form,
        Err(refusal) => return refused_page(&state, &identity, "inspect", title, refusal, "").await,
    };
    let spool = match form.bundle {
        Some(spool) if !(spool.is_empty() && form.file_name.is_empty()) => spool,
        _ => {
            let refusal = Refusal::invalid_request("choose a bundle file (.capstan-plugin) to upload");
            return refused_page(&state, &identity, "inspect", title, refusal, "").await;
        }
    };
    let (upload, inspection) = match spool.keep(&blobs, &identity.username).await {
        Ok(kept) => kept,
        Err(refusal) => return refused_page(&state, &identity, "inspect", title, refusal, "Nothing was kept.").await,
    };
    // what the button asked for and what the bundle is must agree; otherwise nothing is kept
    let mismatch = match (form.upgrade, &form.plugin) {
        (true, Some(plugin)) if *plugin != inspection.id => Some(
            Refusal::new("bundle-plugin-mismatch", format!("this bundle is plugin {:?}, not {plugin:?}", inspection.id))
                .with_data(serde_json::json!({ "expected": plugin, "bundle": inspection.id })),
        ),
        (true, None) => Some(Refusal::invalid_request("an upgrade names the plugin it upgrades")),
        _ => None,
    };
    if let Some(refusal) = mismatch {
        discard_upload(&state, &identity, &upload).await;
        return refused_page(&state, &identity, "inspect", title, refusal, "Nothing was kept.").await;
    }
    approval_page(&state, &identity, upload, form.upgrade, inspection, &BTreeSet::new(), None).await
}

/// Drop a kept upload through `plugins.discardUpload` (best effort: a refusal is logged).
async fn discard_upload(state: &Host, identity: &Viewer, upload: &str) {
    let _ = call(state, identity, "plugins.discardUpload", serde_json::json!({ "upload": upload })).await;
}

// ---------------------------------------------------------------------------------------
// POST /plugins/install, /plugins/upgrade

/// The form body as pairs (repeated `approve` fields included), or the page that refuses it.
async fn read_pairs(
    state: &Host,
    identity: &Viewer,
    action: &str,
    request: Request,
) -> std::result::Result<Vec<(String, String)>, Response> {
    match Form::<Vec<(String, String)>>::from_request(request, state).await {
        Ok(Form(pairs)) => Ok(pairs),
        Err(rejection) => {
            let refusal = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Refusal::new("request-too-large", "the form is larger than the dashboard reads")
            } else {
                Refusal::invalid_request("the form could not be read; reload the page and try again")
            };
            Err(refused_page(state, identity, action, "Nothing was changed", refusal, "").await)
        }
    }
}

fn field<'a>(pairs: &'a [(String, String)], name: &str) -> &'a str {
    pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.trim()).unwrap_or_default()
}

/// Run an approved install or upgrade of a kept upload. On success the upload is dropped; on
/// `capabilities-not-approved` or a refusal worth retrying the approval step is shown again
/// (the upload is kept); on any other refusal the upload is dropped and the list says why.
async fn confirm(state: Host, request: Request, upgrade: bool) -> Response {
    let (parts, body) = request.into_parts();
    if let Some(refused) = refuse_cross_origin(&state, &parts.headers) {
        return refused;
    }
    let identity = match admin(&state, &parts.headers).await {
        Ok(identity) => identity,
        Err(response) => return response,
    };
    let (action, title) = if upgrade { ("upgrade", "The plugin was not upgraded") } else { ("install", "The plugin was not installed") };
    let pairs = match read_pairs(&state, &identity, action, Request::from_parts(parts, body)).await {
        Ok(pairs) => pairs,
        Err(response) => return response,
    };
    let upload = field(&pairs, "upload").to_string();
    let approved: Vec<String> = pairs.iter().filter(|(k, _)| k == "approve").map(|(_, v)| v.trim().to_string()).collect();
    let method = if upgrade { "plugins.upgrade" } else { "plugins.install" };
    match call_as::<PluginView>(&state, &identity, method, serde_json::json!({ "upload": upload, "approve": approved })).await {
        Ok(view) => done(if upgrade { "upgraded" } else { "installed" }, &view.id),
        // the method keeps the upload for another try
        Err(refusal) if refusal.is("capabilities-not-approved") || refusal.retryable => {
            let kept = call_as::<UploadView>(&state, &identity, "plugins.inspectUpload", serde_json::json!({ "upload": upload })).await;
            let inspection = match kept {
                Ok(kept) => kept.bundle,
                Err(e) => return refused_page(&state, &identity, action, title, e, "").await,
            };
            let checked: BTreeSet<String> = approved.into_iter().collect();
            let flash = Flash::refused(title, &refusal, "Nothing was changed; the upload is kept for another try.");
            approval_page(&state, &identity, upload, upgrade, inspection, &checked, Some((status_of(&refusal), flash))).await
        }
        Err(refusal) if refusal.is("upload-not-found") || refusal.is("invalid-request") => {
            refused_page(&state, &identity, action, title, refusal, "").await
        }
        Err(refusal) => {
            refused_page(
                &state,
                &identity,
                action,
                title,
                refusal,
                "The upload was discarded; upload the bundle again once the cause is fixed.",
            )
            .await
        }
    }
}

/// `POST /plugins/install` (`upload`, `approve`…): install an inspected upload.
pub(super) async fn install(State(state): State<Host>, request: Request) -> Response {
    confirm(state, request, false).await
}

/// `POST /plugins/upgrade` (`upload`, `approve`…): upgrade to an inspected upload.
pub(super) async fn upgrade(State(state): State<Host>, request: Request) -> Response {
    confirm(state, request, true).await
}

/// `POST /plugins/discard` (`upload`): drop an upload that will not be installed.
pub(super) async fn discard(State(state): State<Host>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if let Some(refused) = refuse_cross_origin(&state, &parts.headers) {
        return refused;
    }
    let identity = match admin(&state, &parts.headers).await {
        Ok(identity) => identity,
        Err(response) => return response,
    };
    let pairs = match read_pairs(&state, &identity, "discard", Request::from_parts(parts, body)).await {
        Ok(pairs) => pairs,
        Err(response) => return response,
    };
    let upload = field(&pairs, "upload");
    match call(&state, &identity, "plugins.discardUpload", serde_json::json!({ "upload": upload })).await {
        Ok(_) => done("discarded", ""),
        Err(refusal) => refused_page(&state, &identity, "discard", "Nothing was discarded", refusal, "").await,
    }
}

// ---------------------------------------------------------------------------------------
// POST /plugins/rollback, /plugins/disable, /plugins/enable

#[derive(Clone, Copy)]
enum Lifecycle {
    Rollback,
    Disable,
    Enable,
    Rebind,
}

async fn lifecycle(state: Host, request: Request, op: Lifecycle) -> Response {
    let (parts, body) = request.into_parts();
    if let Some(refused) = refuse_cross_origin(&state, &parts.headers) {
        return refused;
    }
    let identity = match admin(&state, &parts.headers).await {
        Ok(identity) => identity,
        Err(response) => return response,
    };
    let (action, title, what) = match op {
        Lifecycle::Rollback => ("rollback", "The plugin was not rolled back", "rolled-back"),
        Lifecycle::Disable => ("disable", "The plugin was not disabled", "disabled"),
        Lifecycle::Enable => ("enable", "The plugin was not enabled", "enabled"),
        Lifecycle::Rebind => ("rebind", "The publisher was not re-bound", "rebound"),
    };
    let pairs = match read_pairs(&state, &identity, action, Request::from_parts(parts, body)).await {
        Ok(pairs) => pairs,
        Err(response) => return response,
    };
    let method = match op {
        Lifecycle::Rollback => "plugins.rollback",
        Lifecycle::Disable => "plugins.disable",
        Lifecycle::Enable => "plugins.enable",
        Lifecycle::Rebind => "plugins.rebindPublisher",
    };
    let body = match op {
        Lifecycle::Rebind => serde_json::json!({ "id": field(&pairs, "id"), "publicKey": field(&pairs, "publicKey").trim() }),
        _ => serde_json::json!({ "id": field(&pairs, "id") }),
    };
    match call_as::<PluginView>(&state, &identity, method, body).await {
        Ok(view) => done(what, &view.id),
        Err(refusal) => refused_page(&state, &identity, action, title, refusal, "").await,
    }
}

/// `POST /plugins/rollback` (`id`): back to the version before the last upgrade.
pub(super) async fn rollback(State(state): State<Host>, request: Request) -> Response {
    lifecycle(state, request, Lifecycle::Rollback).await
}

/// `POST /plugins/disable` (`id`): stop serving a plugin; its data stays.
pub(super) async fn disable(State(state): State<Host>, request: Request) -> Response {
    lifecycle(state, request, Lifecycle::Disable).await
}

/// `POST /plugins/rebind` (`id`, `publicKey`): let another trusted publisher sign the plugin's
/// next upgrade (`plugins.rebindPublisher`, which asks for a fresh login).
pub(super) async fn rebind(State(state): State<Host>, request: Request) -> Response {
    lifecycle(state, request, Lifecycle::Rebind).await
}

/// `POST /plugins/enable` (`id`): serve a disabled plugin again.
pub(super) async fn enable(State(state): State<Host>, request: Request) -> Response {
    lifecycle(state, request, Lifecycle::Enable).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_query_values_read_right() {
        assert_eq!(size(812), "812 bytes");
        assert_eq!(size(12 * 1024), "12.0 KiB");
        assert_eq!(size(5_754_420), "5.5 MiB");
        assert_eq!(query_value("example"), "example");
        assert_eq!(query_value("a b&c"), "a%20b%26c");
    }

    #[test]
    fn publishers_show_a_fingerprint_and_a_name() {
        let key = PublisherKey::from(&capstan_server::plugins::bundle::generate_key());
        let names: HashMap<String, String> = [(key.fingerprint(), "Tests".to_string())].into();
        let view = publisher_view(&key.to_string(), &names);
        assert_eq!((view.short.len(), view.name.as_deref(), view.first_party), (16, Some("Tests"), false));
        assert!(publisher_view("first-party", &names).first_party);
        assert_eq!(publisher_view("garbage", &names).short, "garbage");
    }
}
