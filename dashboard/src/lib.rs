//! The operator dashboard: server-rendered HTML at `/` (overview), `/fleet` (the fleet's
//! nodes, administrators only), `/clusters`, `/services` (with organizations, where each
//! service runs: [`runtime`], its replicas' logs: [`logs`], and its runtime events:
//! [`history`]) and `/settings` (the inventory, through the same methods as the API, updated
//! live from the event outbox),
//! `/plugins` (installed plugins and their lifecycle, administrators only), `/tasks` (the
//! scheduler's tasks and their executions, through the `tasks.*` methods), `/secrets` (each
//! service's secrets and each organization's SecretSets, write-only: values are sealed in the
//! browser), `/p/<pluginId>/…` (the pages plugins contribute, [`plugin_pages`]: the App
//! Store's among them), `/login` and
//! `/logout`, from the templates in this crate's `templates/` (minijinja, autoescaped,
//! embedded in the binary at compile time), with the static assets of [`assets`] (`static/`)
//! and the vendored htmx for partial updates. No Node build step. It acts only through the
//! server's registered methods; [`pages`] hands its routes to the server's router.
//!
//! A browser session is the JWT of a human login, kept only in the `capstan_session` cookie
//! (HttpOnly, SameSite=Strict, Secure under an https public origin). Every request checks it
//! again with [`crate::auth::Auth::authenticate`], so a logout or a credential change ends it
//! at once. A form post whose `Origin` is neither the public origin nor the request's own
//! host is refused. Every response carries a strict Content-Security-Policy: no inline
//! script or style, nothing loaded from elsewhere, no framing.

mod access;
mod api_docs;
pub mod assets;
mod audit;
mod authorize;
mod clusters;
mod fleet;
mod forms;
mod history;
mod live;
mod logs;
mod nodes;
mod people;
mod plugin_pages;
mod plugins;
mod runtime;
mod secrets;
mod services;
mod settings;
mod tasks;

// The server's areas, under the names the views use.
use capstan_server::{api, auth, inventory, refusal, state};

use crate::auth::{Auth, Identity};
use crate::refusal::Refusal;
use crate::state::AppState;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRef, FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use capstan_core::clock::now_ms;
use capstan_core::text::SecretString;
use capstan_rpc::Registry;
use capstan_server::plugins::faces::NAV_ICONS;
use capstan_server::plugins::host::PluginHost;
use capstan_server::system::{StatusReport, System, status_report};
use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, UndefinedBehavior, context};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, UNIX_EPOCH};
use zeroize::Zeroize;

/// The cookie that carries the session JWT.
pub const SESSION_COOKIE: &str = "capstan_session";
/// What every failed login shows, whatever was wrong.
pub const DENIAL: &str = "Login failed: check the username and password.";
/// The policy on every dashboard response (the server's, shared with its jump landing page).
pub use capstan_server::page_headers::CONTENT_SECURITY_POLICY;
/// The largest form body the dashboard reads (bundle uploads have their own limit).
const FORM_LIMIT: usize = 16 * 1024;

/// The dashboard's routes, to be merged into the API router (which owns the fallback).
/// The dashboard as the server serves it: its routes, and its "not found" page for a browser.
pub fn pages() -> api::Pages {
    api::Pages {
        routes: router(),
        not_found: |headers, path| wants_html(headers, path).then(not_found_page),
        socket_bearer: page_session_bearer,
        jump: api::nodes::JumpPages {
            landing: |cluster, command, dev| Some(render(StatusCode::OK, "jump_landing.html", context! { cluster, command, dev })),
            refused: |status, title, message| Some(message_page(status, title, message)),
        },
    }
}

/// What the pages reach of the host: authentication (the session cookie), the registered
/// methods every page acts through, the plugins loaded here (their pages, the rail's entries)
/// and the public origin (the cookie's `Secure`, the same-origin check). Pages take this part
/// (`State<Host>`), never the whole host state; the few that need more take that part beside it.
#[derive(Clone)]
pub(crate) struct Host {
    auth: Arc<Auth>,
    methods: Arc<Registry>,
    plugins: Arc<PluginHost>,
    public_origin: String,
}

impl FromRef<AppState> for Host {
    fn from_ref(state: &AppState) -> Host {
        Host {
            auth: state.auth.clone(),
            methods: state.methods.clone(),
            plugins: state.plugins.clone(),
            public_origin: state.public_origin.clone(),
        }
    }
}

/// The session JWT a page's WebSocket upgrade of `/api/v1/socket` carries in its cookie, so
/// the page's live updates ([`live`]) open an authenticated socket session while the JWT stays
/// HttpOnly (never in a page or a script). Only from this host's own pages (served at
/// `public_origin`), judged as a form post is ([`same_origin`]: a browser's `Sec-Fetch-Site`,
/// else `Origin`): another site's page cannot open a session with a visitor's cookie. Anything
/// else finds none, and the socket judges the offer as it would without one.
fn page_session_bearer(public_origin: &str, headers: &HeaderMap) -> Option<String> {
    let token = session_token(headers)?;
    same_origin(public_origin, headers).then(|| token.to_string())
}

/// Every dashboard route: the pages, their forms and live updates, and the static assets.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(overview))
        .route("/overview/status", get(status_panel))
        .route("/fleet", get(fleet::page))
        .route("/fleet/panel", get(fleet::panel))
        .route("/fleet/rebalance", post(fleet::rebalance))
        .route("/clusters", get(clusters::page))
        .route("/clusters/panel", get(clusters::panel))
        .route("/clusters/create", post(clusters::create))
        .route("/clusters/{id}", get(clusters::detail))
        .route("/clusters/{id}/panel", get(clusters::detail_panel))
        .route("/clusters/{id}/update", post(clusters::update))
        .route("/clusters/{id}/phase", post(clusters::set_phase))
        .route("/clusters/{id}/relay/panel", get(clusters::relay_panel))
        .route("/clusters/{id}/relay/enable", post(clusters::enable_relay))
        .route("/clusters/{id}/relay/disable", post(clusters::disable_relay))
        .route("/clusters/{id}/delete", get(clusters::confirm).post(clusters::delete))
        .route("/services", get(services::page))
        .route("/services/panel", get(services::panel))
        .route("/services/create", post(services::create))
        .route("/services/{id}", get(services::detail))
        .route("/services/{id}/panel", get(services::detail_panel))
        .route("/services/{id}/update", post(services::update))
        .route("/services/{id}/delete", get(services::confirm).post(services::delete))
        .route("/services/{id}/logs", get(logs::page))
        .route("/services/{id}/logs/{assignment}/after", get(logs::after))
        .route("/services/{id}/events", get(history::page))
        .route("/services/{id}/events/panel", get(history::panel))
        .route("/services/{id}/runtime/panel", get(runtime::service_panel))
        .route("/services/{id}/runtime/run", post(runtime::run))
        .route("/services/{id}/runtime/hold", post(runtime::hold))
        .route("/clusters/{id}/runtime/panel", get(runtime::cluster_panel))
        .route("/nodes/{id}/runtime/panel", get(runtime::node_panel))
        .route("/clusters/{id}/nodes", get(nodes::page))
        .route("/clusters/{id}/nodes/panel", get(nodes::panel))
        .route("/clusters/{id}/nodes/jump", post(nodes::jump))
        .route("/nodes/{id}", get(nodes::detail))
        .route("/nodes/{id}/hostname", post(nodes::set_hostname))
        .route("/nodes/{id}/hostname/reset", post(nodes::reset_hostname))
        .route("/nodes/{id}/rotate", post(nodes::rotate))
        .route("/nodes/{id}/{action}", get(nodes::confirm).post(nodes::confirmed))
        .route("/organizations/create", post(services::create_organization))
        .route("/secrets", get(secrets::page))
        .route("/secrets/services/{id}", get(secrets::service))
        .route("/secrets/services/{id}/panel", get(secrets::service_panel))
        // a sealed 64 KiB value is larger than a form: these two routes read more
        .route("/secrets/services/{id}/create", post(secrets::create).layer(DefaultBodyLimit::max(secrets::SEALED_FORM_LIMIT)))
        .route(
            "/secrets/{id}/rotate",
            get(secrets::rotate_page).post(secrets::rotate).layer(DefaultBodyLimit::max(secrets::SEALED_FORM_LIMIT)),
        )
        .route("/secrets/services/{id}/attach", post(secrets::attach))
        .route("/secrets/services/{id}/detach", post(secrets::detach))
        .route("/secrets/sets/create", post(secrets::create_set))
        .route("/secrets/sets/{id}", get(secrets::set))
        .route("/secrets/sets/{id}/panel", get(secrets::set_panel))
        .route("/secrets/sets/{id}/create", post(secrets::create_member).layer(DefaultBodyLimit::max(secrets::SEALED_FORM_LIMIT)))
        .route("/secrets/sets/{id}/update", post(secrets::update_set))
        .route("/secrets/sets/{id}/retire", get(secrets::confirm_retire).post(secrets::retire))
        .route("/secrets/{id}/revoke", get(secrets::revoke_page).post(secrets::revoke))
        // `/<pluginId>` is a plugin's first page (the App Store's view was `/appstore`)
        .route("/{plugin}", axum::routing::any(plugin_pages::shortcut))
        .route("/p/{plugin}", get(plugin_pages::index))
        // a form reads what the API would take for its method: the handler holds it to that
        .route("/p/{plugin}/-/call/{method}", post(plugin_pages::call).layer(DefaultBodyLimit::disable()))
        .route("/p/{plugin}/{*path}", get(plugin_pages::page))
        .route("/settings", get(settings::page))
        .route("/settings/panel", get(settings::panel))
        .route("/settings/update", post(settings::update))
        .route("/settings/gateway/bootstrap", post(settings::bootstrap_gateway))
        .route("/tasks", get(tasks::page))
        .route("/tasks/panel", get(tasks::panel))
        .route("/tasks/{id}", get(tasks::detail))
        .route("/tasks/{id}/panel", get(tasks::detail_panel))
        .route("/tasks/{id}/run", post(tasks::run))
        .route("/tasks/{id}/disable", get(tasks::confirm_disable).post(tasks::disable))
        .route("/tasks/{id}/enable", post(tasks::enable))
        .route("/tasks/{id}/cancel", post(tasks::cancel))
        .route("/live/wait", get(live::wait))
        .route("/plugins", get(plugins::page))
        // a bundle may be up to 64 MiB: this route alone reads more than a form
        .route("/plugins/inspect", post(plugins::inspect).layer(DefaultBodyLimit::max(plugins::UPLOAD_LIMIT)))
        .route("/plugins/install", post(plugins::install))
        .route("/plugins/upgrade", post(plugins::upgrade))
        .route("/plugins/discard", post(plugins::discard))
        .route("/plugins/rollback", post(plugins::rollback))
        .route("/plugins/disable", post(plugins::disable))
        .route("/plugins/enable", post(plugins::enable))
        .route("/plugins/rebind", post(plugins::rebind))
        .route("/login", get(login_page).post(login))
        .route("/login/oidc", get(login_oidc))
        .route(OIDC_FINISH, get(login_oidc_finish))
        .route("/logout", post(logout))
        .route("/static/{hash}/{*path}", get(assets::serve))
        .merge(people::routes())
        .merge(audit::routes())
        .merge(authorize::routes())
        .merge(access::routes())
        .merge(api_docs::routes())
        .layer(DefaultBodyLimit::max(FORM_LIMIT))
        .layer(middleware::from_fn(security_headers))
}

// ---------------------------------------------------------------------------------------
// Templates

const TEMPLATES: &[(&str, &str)] = &[
    ("layout.html", include_str!("../templates/layout.html")),
    ("app.html", include_str!("../templates/app.html")),
    ("icons.html", include_str!("../templates/icons.html")),
    ("entity_panels.html", include_str!("../templates/entity_panels.html")),
    ("login.html", include_str!("../templates/login.html")),
    ("login_continue.html", include_str!("../templates/login_continue.html")),
    ("authorize.html", include_str!("../templates/authorize.html")),
    ("access.html", include_str!("../templates/access.html")),
    ("overview.html", include_str!("../templates/overview.html")),
    ("status.html", include_str!("../templates/status.html")),
    ("fleet.html", include_str!("../templates/fleet.html")),
    ("fleet_panel.html", include_str!("../templates/fleet_panel.html")),
    ("plugins.html", include_str!("../templates/plugins.html")),
    ("plugins_list.html", include_str!("../templates/plugins_list.html")),
    ("plugins_approve.html", include_str!("../templates/plugins_approve.html")),
    ("plugins_flash.html", include_str!("../templates/plugins_flash.html")),
    ("message.html", include_str!("../templates/message.html")),
    ("jump_landing.html", include_str!("../templates/jump_landing.html")),
    ("flash.html", include_str!("../templates/flash.html")),
    ("live.html", include_str!("../templates/live.html")),
    ("confirm_delete.html", include_str!("../templates/confirm_delete.html")),
    ("clusters.html", include_str!("../templates/clusters.html")),
    ("clusters_panel.html", include_str!("../templates/clusters_panel.html")),
    ("cluster.html", include_str!("../templates/cluster.html")),
    ("cluster_panel.html", include_str!("../templates/cluster_panel.html")),
    ("cluster_relay.html", include_str!("../templates/cluster_relay.html")),
    ("cluster_created.html", include_str!("../templates/cluster_created.html")),
    ("service_fields.html", include_str!("../templates/service_fields.html")),
    ("services.html", include_str!("../templates/services.html")),
    ("services_panel.html", include_str!("../templates/services_panel.html")),
    ("service.html", include_str!("../templates/service.html")),
    ("service_panel.html", include_str!("../templates/service_panel.html")),
    ("service_runtime.html", include_str!("../templates/service_runtime.html")),
    ("service_run.html", include_str!("../templates/service_run.html")),
    ("service_logs.html", include_str!("../templates/service_logs.html")),
    ("service_events.html", include_str!("../templates/service_events.html")),
    ("service_events_panel.html", include_str!("../templates/service_events_panel.html")),
    ("runtime_history.html", include_str!("../templates/runtime_history.html")),
    ("runtime_cells.html", include_str!("../templates/runtime_cells.html")),
    ("runtime_slots.html", include_str!("../templates/runtime_slots.html")),
    ("settings.html", include_str!("../templates/settings.html")),
    ("settings_panel.html", include_str!("../templates/settings_panel.html")),
    ("tasks.html", include_str!("../templates/tasks.html")),
    ("tasks_panel.html", include_str!("../templates/tasks_panel.html")),
    ("task.html", include_str!("../templates/task.html")),
    ("task_panel.html", include_str!("../templates/task_panel.html")),
    ("task_disable.html", include_str!("../templates/task_disable.html")),
    ("secrets.html", include_str!("../templates/secrets.html")),
    ("secrets_value.html", include_str!("../templates/secrets_value.html")),
    ("secrets_list.html", include_str!("../templates/secrets_list.html")),
    ("secrets_facts.html", include_str!("../templates/secrets_facts.html")),
    ("secrets_service.html", include_str!("../templates/secrets_service.html")),
    ("secrets_rotate.html", include_str!("../templates/secrets_rotate.html")),
    ("secrets_revoke.html", include_str!("../templates/secrets_revoke.html")),
    ("secrets_set.html", include_str!("../templates/secrets_set.html")),
    ("secrets_set_retire.html", include_str!("../templates/secrets_set_retire.html")),
    ("plugin_page.html", include_str!("../templates/plugin_page.html")),
    ("nodes.html", include_str!("../templates/nodes.html")),
    ("nodes_panel.html", include_str!("../templates/nodes_panel.html")),
    ("node.html", include_str!("../templates/node.html")),
    ("node_jump.html", include_str!("../templates/node_jump.html")),
    ("node_confirm.html", include_str!("../templates/node_confirm.html")),
    ("plugin_form.html", include_str!("../templates/plugin_form.html")),
    ("users.html", include_str!("../templates/users.html")),
    ("organizations.html", include_str!("../templates/organizations.html")),
    ("organization.html", include_str!("../templates/organization.html")),
    ("publishers.html", include_str!("../templates/publishers.html")),
    ("audit.html", include_str!("../templates/audit.html")),
    ("api_docs.html", include_str!("../templates/api_docs.html")),
];

static TEMPLATE_ENV: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    // printing a missing value is an error, not an empty string
    env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
    env.add_global("version", env!("CARGO_PKG_VERSION"));
    // asset URLs are ours (`/static/<hex>/<known path>`): emitted as they are
    env.add_function("asset", |path: &str| {
        assets::url(path)
            .map(minijinja::Value::from_safe_string)
            .ok_or_else(|| minijinja::Error::new(ErrorKind::InvalidOperation, format!("no embedded asset {path:?}")))
    });
    for (name, source) in TEMPLATES {
        if let Err(e) = env.add_template(name, source) {
            // a page using it then fails to render (500) and says so in the log
            tracing::error!(template = name, error = %e, "a dashboard template does not compile");
        }
    }
    env
});

/// Render template `name` (autoescaped: its name ends in `.html`).
fn render(status: StatusCode, name: &str, ctx: minijinja::Value) -> Response {
    match TEMPLATE_ENV.get_template(name).and_then(|t| t.render(ctx)) {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!(template = name, error = %e, "a dashboard page failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "This page could not be rendered; the server log has the details.\n",
            )
                .into_response()
        }
    }
}

/// A standalone page with a title and a message (refusals, errors, not found).
fn message_page(status: StatusCode, title: &str, message: &str) -> Response {
    render(status, "message.html", context! { title, message, code => status.as_u16() })
}

// ---------------------------------------------------------------------------------------
// Headers, cookies, origins

async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    apply_security_headers(&mut response);
    response
}

/// The headers every dashboard response carries (every page's); HTML is never cached.
fn apply_security_headers(response: &mut Response) {
    capstan_server::page_headers::apply(response.headers_mut());
}

/// Whether an unmatched request should get the HTML "not found" page rather than the API's
/// JSON envelope: a browser (it asks for `text/html`) outside `/api`.
pub fn wants_html(headers: &HeaderMap, path: &str) -> bool {
    let api = path == "/api" || path.starts_with("/api/");
    !api && headers.get_all(header::ACCEPT).iter().any(|v| v.to_str().is_ok_and(|v| v.contains("text/html")))
}

/// The HTML "not found" page, with the dashboard's headers.
pub fn not_found_page() -> Response {
    let mut response = message_page(StatusCode::NOT_FOUND, "Page not found", "There is no page at this address.");
    apply_security_headers(&mut response);
    response
}

/// The session token from the `Cookie` headers, if any.
fn session_token(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, SESSION_COOKIE)
}

/// The value of the cookie `wanted`, when the request carries a non-empty one.
fn cookie<'h>(headers: &'h HeaderMap, wanted: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == wanted)
        .map(|(_, value)| value.trim().trim_matches('"'))
        .filter(|value| !value.is_empty())
}

fn cookie_attributes(max_age: u64, secure: bool) -> String {
    format!("HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{}", if secure { "; Secure" } else { "" })
}

fn is_https(state: &Host) -> bool {
    state.public_origin.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}

/// A `303 See Other` to `location`.
fn see_other(location: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// Add a `Set-Cookie` that removes the session cookie.
fn clear_session_cookie(response: &mut Response, secure: bool) {
    let value = format!("{SESSION_COOKIE}=; {}", cookie_attributes(0, secure));
    if let Ok(value) = HeaderValue::from_str(&value) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
}

/// Whether a form post comes from this host's own pages: a browser's `Sec-Fetch-Site` says
/// `same-origin` (it cannot be set by a page, and holds whatever name the host was opened by),
/// or, from a browser that does not send it, `Origin` is exactly the configured public origin.
/// A post with neither, or with an `Origin` that only matches the `Host` it was sent to (which
/// a client chooses), is refused.
fn same_origin(public_origin: &str, headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return site.as_bytes().eq_ignore_ascii_case(b"same-origin");
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else { return false };
    origin.trim().eq_ignore_ascii_case(public_origin.trim_end_matches('/'))
}

/// The 403 page for a form post that does not come from this host's pages, `None` when the
/// post may go on.
fn refuse_cross_origin(state: &Host, headers: &HeaderMap) -> Option<Response> {
    if same_origin(&state.public_origin, headers) {
        return None;
    }
    let shown = |name: &str| -> String {
        headers.get(name).map(|v| String::from_utf8_lossy(v.as_bytes()).chars().take(100).collect()).unwrap_or_default()
    };
    tracing::info!(origin = ?shown("origin"), fetch_site = ?shown("sec-fetch-site"), "cross-origin form post refused");
    Some(message_page(
        StatusCode::FORBIDDEN,
        "Request refused",
        "This form was not sent from Capstan's own pages, so Capstan did not act on it. Open Capstan at its own address and try again.",
    ))
}

/// The page for a refusal that is not about the caller (the store is down, an internal
/// failure): logged like an API error, shown without detail.
fn unavailable(refusal: Refusal) -> Response {
    let status = StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status.is_server_error() {
        tracing::error!(code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "dashboard request failed: {}", refusal.message);
    } else {
        tracing::info!(code = %refusal.code, "dashboard request refused: {}", refusal.message);
    }
    let message = format!("Capstan could not answer this request ({}): {}. Try again shortly.", refusal.code, refusal.message);
    message_page(status, "Capstan cannot answer right now", &message)
}

// ---------------------------------------------------------------------------------------
// Sessions

/// The person a page acts for: who they are, and the session token they came with, which a
/// call forwarded to the coordinator carries there (it is never shown or logged).
#[derive(Clone)]
pub(crate) struct Viewer {
    identity: Identity,
    bearer: SecretString,
}

impl Viewer {
    /// The session token, for a call through the registry's door.
    pub(crate) fn bearer(&self) -> &str {
        self.bearer.expose()
    }
}

impl std::ops::Deref for Viewer {
    type Target = Identity;
    fn deref(&self) -> &Identity {
        &self.identity
    }
}

/// The human session the request's cookie stands for; `None` without a cookie or with one
/// that no longer authenticates. Other failures (the store is down) are errors.
async fn current_identity(state: &Host, headers: &HeaderMap) -> Result<Option<Viewer>, Refusal> {
    let Some(token) = session_token(headers) else { return Ok(None) };
    match state.auth.authenticate(token).await {
        Ok(identity) if identity.kind == "human" => Ok(Some(Viewer { identity, bearer: SecretString::new(token.to_string()) })),
        Ok(_) => Ok(None),
        Err(e) if e.is("unauthenticated") => Ok(None),
        Err(e) => Err(e),
    }
}

/// Off to the login page; a cookie that no longer works is removed on the way.
fn to_login(state: &Host, headers: &HeaderMap) -> Response {
    let mut response = see_other("/login");
    if session_token(headers).is_some() {
        clear_session_cookie(&mut response, is_https(state));
    }
    response
}

/// The last moment the formatter takes (9999-12-31 23:59:59.999 UTC), in milliseconds.
const LAST_MS: u64 = 253_402_300_799_999;

/// `2025-01-31 13:45 UTC` (milliseconds since the epoch, as every moment the API answers;
/// clamped to what the formatter takes).
fn utc(ms: u64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(ms.min(LAST_MS));
    let text = humantime::format_rfc3339_seconds(at).to_string();
    match (text.get(..10), text.get(11..16)) {
        (Some(date), Some(time)) => format!("{date} {time} UTC"),
        _ => text,
    }
}

/// The RFC 3339 form of a moment (milliseconds since the epoch), to the second.
fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms.min(LAST_MS))).to_string()
}

/// `in 11 h 59 min` until a moment (milliseconds since the epoch).
fn time_left(until: u64) -> String {
    let left = until.saturating_sub(now_ms()) / 1000;
    let (hours, minutes) = (left / 3600, (left % 3600) / 60);
    match (hours, minutes) {
        (0, 0) => "in less than a minute".into(),
        (0, m) => format!("in {m} min"),
        (h, m) => format!("in {h} h {m} min"),
    }
}

// ---------------------------------------------------------------------------------------
// Views

/// One entry of the navigation rail.
#[derive(Serialize)]
struct NavItem {
    label: String,
    icon: &'static str,
    /// The rail's group: Platform, Workloads, Managers (the plugins' pages), Administration.
    group: &'static str,
    /// A plugin's page below its section's entry (indented).
    sub: bool,
    /// `None`: nothing to open, shown disabled.
    href: Option<String>,
    active: bool,
    /// Shown to administrators only: anyone else would be answered 403 there.
    admin_only: bool,
}

/// The host's sections of the rail.
const SECTIONS: &[(&str, &str, &str, &str)] = &[
    ("Overview", "overview", "/", PLATFORM),
    ("Fleet", "fleet", "/fleet", PLATFORM),
    ("Clusters", "clusters", "/clusters", PLATFORM),
    ("Services", "services", "/services", WORKLOADS),
    ("Organizations", "organizations", "/organizations", WORKLOADS),
    ("Secrets", "secrets", "/secrets", WORKLOADS),
    ("Plugins", "plugins", "/plugins", ADMINISTRATION),
    ("Tasks", "tasks", "/tasks", ADMINISTRATION),
    ("Users", "users", "/users", ADMINISTRATION),
    ("Publishers", "publishers", "/publishers", ADMINISTRATION),
    ("Audit", "audit", "/audit", ADMINISTRATION),
    ("Settings", "settings", "/settings", ADMINISTRATION),
    ("API", "api", "/docs/api", ADMINISTRATION),
];

/// The rail's groups, in order.
const PLATFORM: &str = "Platform";
const WORKLOADS: &str = "Workloads";
const MANAGERS: &str = "Managers";
const ADMINISTRATION: &str = "Administration";

/// The sections only administrators may open.
const ADMIN_ONLY: &[&str] = &["fleet", "clusters", "secrets", "plugins", "tasks", "users", "publishers", "audit", "settings"];

/// The rail with `active` marked, in groups: the host's sections, and after Secrets, under
/// Managers, what the plugins loaded here add (`active` is `p:<pluginId>/<path>` on their
/// pages): a plugin that declares a navigation section is listed under its own name and icon,
/// opening its first listed page, with every other page it lists indented below; a plugin
/// without one lists each page as an entry of its own.
fn nav(state: &Host, active: &str) -> Vec<NavItem> {
    let mut items: Vec<NavItem> = SECTIONS
        .iter()
        .map(|&(label, icon, href, group)| NavItem {
            label: label.into(),
            icon,
            group,
            sub: false,
            href: Some(href.to_string()),
            active: icon == active,
            admin_only: ADMIN_ONLY.contains(&icon),
        })
        .collect();
    let at = items.iter().position(|i| i.icon == "secrets").map_or(items.len(), |i| i + 1);
    let mut pages: Vec<NavItem> = Vec::new();
    for plugin in state.plugins.loaded() {
        let id = &plugin.manifest.id;
        let href = |path: &str| if path.is_empty() { format!("/p/{id}") } else { format!("/p/{id}/{path}") };
        let mut listed = plugin.described.pages.iter().filter(|p| p.navigation);
        let mut sectioned = false;
        if let Some(section) = &plugin.described.faces.nav
            && let Some(first) = listed.next()
        {
            sectioned = true;
            pages.push(NavItem {
                label: section.title.clone(),
                icon: NAV_ICONS.iter().find(|i| **i == section.icon).copied().unwrap_or("box"),
                group: MANAGERS,
                sub: false,
                href: Some(href(&first.path)),
                active: active == format!("p:{id}/{}", first.path),
                admin_only: false,
            });
        }
        pages.extend(listed.map(|p| NavItem {
            label: p.title.clone(),
            icon: "plugins",
            group: MANAGERS,
            sub: sectioned,
            href: Some(href(&p.path)),
            active: active == format!("p:{id}/{}", p.path),
            admin_only: false,
        }));
    }
    items.splice(at..at, pages);
    items
}

#[derive(Serialize)]
struct UserView {
    username: String,
    initial: String,
    admin: bool,
    role: &'static str,
    logged_in_at: String,
    logged_in_iso: String,
    expires_at: String,
    expires_iso: String,
    expires_in: String,
}

fn user_view(identity: &Identity) -> UserView {
    UserView {
        username: identity.username.clone(),
        initial: identity.username.chars().next().map(|c| c.to_ascii_uppercase().to_string()).unwrap_or_default(),
        admin: identity.admin,
        role: if identity.admin { "Administrator" } else { "Operator" },
        logged_in_at: utc(identity.authenticated_at),
        logged_in_iso: rfc3339(identity.authenticated_at),
        expires_at: utc(identity.expires_at),
        expires_iso: rfc3339(identity.expires_at),
        expires_in: time_left(identity.expires_at),
    }
}

#[derive(Serialize)]
struct HistoryRow {
    step: String,
    from: String,
    to: String,
    finished: String,
}

/// The readiness report as the status panel shows it.
fn status_context(report: &StatusReport) -> minijinja::Value {
    let history: Vec<HistoryRow> = report
        .migrations
        .history
        .iter()
        .rev()
        .take(10)
        .map(|h| HistoryRow { step: h.step.clone(), from: h.from.clone(), to: h.to.clone(), finished: utc(h.finished_at) })
        .collect();
    let now = now_ms();
    context! {
        status => Serde(report),
        history => Serde(history),
        checked_at => utc(now),
        checked_iso => rfc3339(now),
    }
}

// ---------------------------------------------------------------------------------------
// Pages

/// `GET /`: who you are, the readiness report, the version.
async fn overview(State(state): State<Host>, State(system): State<System>, headers: HeaderMap) -> Response {
    let identity = match current_identity(&state, &headers).await {
        Ok(Some(identity)) => identity,
        Ok(None) => return to_login(&state, &headers),
        Err(refusal) => return unavailable(refusal),
    };
    let report = status_report(&system, identity.is_human_admin()).await;
    let ctx = context! {
        page => "Overview",
        nav => Serde(nav(&state, "overview")),
        user => Serde(user_view(&identity)),
        data_target => system.chain.target().to_string(),
        ..status_context(&report)
    };
    render(StatusCode::OK, "overview.html", ctx)
}

/// `GET /overview/status`: the status panel alone, for htmx to refresh in place.
async fn status_panel(State(state): State<Host>, State(system): State<System>, headers: HeaderMap) -> Response {
    match current_identity(&state, &headers).await {
        Ok(Some(identity)) => {
            render(StatusCode::OK, "status.html", status_context(&status_report(&system, identity.is_human_admin()).await))
        }
        // htmx follows HX-Redirect with a full page load; a plain request gets the redirect
        Ok(None) if headers.contains_key("hx-request") => (StatusCode::UNAUTHORIZED, [("hx-redirect", "/login")]).into_response(),
        Ok(None) => to_login(&state, &headers),
        Err(refusal) => unavailable(refusal),
    }
}

/// The login form, with an error and the username typed so far (never the password), and the
/// "Sign in with …" button when an identity provider is configured.
async fn login_form(state: &Host, status: StatusCode, error: Option<&str>, username: &str) -> Response {
    login_form_to(state, status, error, username, None).await
}

/// [`login_form`] that goes on to `next` (a page a sign-in was asked for, [`next_page`]).
async fn login_form_to(state: &Host, status: StatusCode, error: Option<&str>, username: &str, next: Option<&str>) -> Response {
    let username: String = username.chars().take(100).collect();
    let oidc = identity_provider(state).await;
    let oidc_href = match next {
        Some(next) => format!("/login/oidc?next={}", next.replace('/', "%2F")),
        None => "/login/oidc".to_string(),
    };
    render(status, "login.html", context! { error, username, oidc, oidc_href, next })
}

/// Where a login may go on to besides the overview: a hosted app's sign-in page waiting for
/// this person (`/authorize/<request id>`); anything else is ignored (no open redirect).
fn next_page(text: &str) -> Option<&str> {
    let id = text.strip_prefix("/authorize/")?;
    (!id.is_empty() && id.len() <= 200 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')).then_some(text)
}

#[derive(Deserialize)]
struct NextQuery {
    next: Option<String>,
}

/// The name of the identity provider people sign in through here (`federation.getStatus`).
async fn identity_provider(state: &Host) -> Option<String> {
    let invocation = capstan_rpc::Invocation {
        method: "federation.getStatus",
        caller: capstan_rpc::Caller::Bearer(None),
        source: None,
        request_id: "",
        forwarded: false,
        body: capstan_rpc::Body::Value(serde_json::json!({})),
    };
    let status = state.methods.invoke(invocation).await.and_then(capstan_rpc::Invoked::into_value).ok()?;
    if status["enabled"] != true {
        return None;
    }
    status["displayName"].as_str().map(str::to_string)
}

/// `GET /login[?next=/authorize/…]`: the form; a browser that is already logged in goes on.
async fn login_page(
    State(state): State<Host>,
    headers: HeaderMap,
    axum::extract::Query(query): axum::extract::Query<NextQuery>,
) -> Response {
    let next = query.next.as_deref().and_then(next_page);
    match current_identity(&state, &headers).await {
        Ok(Some(_)) => forms::redirect(next.unwrap_or("/")),
        _ => login_form_to(&state, StatusCode::OK, None, "", next).await,
    }
}

/// The cookie that keeps the verifier of an identity-provider sign-in while the browser is away.
const OIDC_VERIFIER_COOKIE: &str = "capstan_oidc_verifier";
/// Where an identity-provider sign-in comes back to.
const OIDC_FINISH: &str = "/login/oidc/finish";

/// `GET /login/oidc`: off to the identity provider. The browser keeps a fresh verifier in a
/// cookie only this path reads (Lax: it must come back on the provider's redirect); the
/// login carries its challenge, so a handoff code seen by anyone else is worth nothing.
async fn login_oidc(State(state): State<Host>, axum::extract::Query(query): axum::extract::Query<NextQuery>) -> Response {
    use base64::Engine;
    let verifier = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
    let challenge = capstan_server::federation::login::challenge_of(&verifier);
    let finish = match query.next.as_deref().and_then(next_page) {
        Some(next) => format!("{OIDC_FINISH}?next={}", next.replace('/', "%2F")),
        None => OIDC_FINISH.to_string(),
    };
    let finish: String = url::form_urlencoded::byte_serialize(finish.as_bytes()).collect();
    let location = format!("/auth/oidc/start?challenge={challenge}&returnTo={finish}");
    let secure = if is_https(&state) { "; Secure" } else { "" };
    let cookie = format!("{OIDC_VERIFIER_COOKIE}={verifier}; HttpOnly; SameSite=Lax; Path=/login/oidc; Max-Age=600{secure}");
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

#[derive(Deserialize)]
struct OidcFinish {
    handoff: Option<String>,
    next: Option<String>,
}

/// `GET /login/oidc/finish?handoff=…`: the handoff and this browser's verifier for a session
/// (`federation.completeLogin`, through the one door), then on to the overview.
async fn login_oidc_finish(
    State(state): State<Host>,
    headers: HeaderMap,
    axum::extract::Query(query): axum::extract::Query<OidcFinish>,
) -> Response {
    let verifier = cookie(&headers, OIDC_VERIFIER_COOKIE).unwrap_or_default();
    let body = serde_json::json!({ "handoff": query.handoff.unwrap_or_default(), "verifier": verifier });
    let invocation = capstan_rpc::Invocation {
        method: "federation.completeLogin",
        caller: capstan_rpc::Caller::Bearer(None),
        source: None,
        request_id: "",
        forwarded: false,
        body: capstan_rpc::Body::Value(body),
    };
    let result = state.methods.invoke(invocation).await.and_then(capstan_rpc::Invoked::into_value).and_then(|answer| {
        let token = answer["token"].as_str().map(str::to_string);
        token.zip(answer["expiresAt"].as_u64()).ok_or_else(|| Refusal::internal("federation.completeLogin answered no token and expiry"))
    });
    let secure = is_https(&state);
    let mut response = match result {
        Ok((token, expires_at)) => {
            let token = zeroize::Zeroizing::new(token);
            let max_age = expires_at.saturating_sub(now_ms()) / 1000;
            let Ok(cookie) = HeaderValue::from_str(&format!("{SESSION_COOKIE}={}; {}", token.as_str(), cookie_attributes(max_age, secure)))
            else {
                return unavailable(Refusal::internal("the session token is not a valid cookie value"));
            };
            // a page of this site moves on: the session cookie (SameSite=Strict) is not sent on a
            // redirect chain that began at the identity provider's site
            let next = query.next.as_deref().and_then(next_page).unwrap_or("/");
            let mut response = render(StatusCode::OK, "login_continue.html", context! { next });
            response.headers_mut().insert(header::SET_COOKIE, cookie);
            response
        }
        Err(refusal) => {
            let message = format!("Signing in through the identity provider failed ({}): {}", refusal.code, refusal.message);
            let status = StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
            login_form(&state, status, Some(&message), "").await
        }
    };
    if let Ok(clear) = HeaderValue::from_str(&format!("{OIDC_VERIFIER_COOKIE}=; HttpOnly; SameSite=Lax; Path=/login/oidc; Max-Age=0")) {
        response.headers_mut().append(header::SET_COOKIE, clear);
    }
    response.headers_mut().insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    username: String,
    #[serde(default)]
    next: String,
    #[serde(default)]
    password: String,
}

/// `POST /login` (form-encoded): on success the session cookie and a 303 to `/`.
async fn login(State(state): State<Host>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if let Some(refused) = refuse_cross_origin(&state, &parts.headers) {
        return refused;
    }
    let source = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let form = match Form::<LoginForm>::from_request(Request::from_parts(parts, body), &state).await {
        Ok(Form(form)) => form,
        Err(rejection) => {
            tracing::info!(status = rejection.status().as_u16(), "an unreadable login form was refused");
            let status =
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE { StatusCode::PAYLOAD_TOO_LARGE } else { StatusCode::BAD_REQUEST };
            return login_form(&state, status, Some("The login form could not be read. Reload the page and try again."), "").await;
        }
    };
    let LoginForm { username, mut password, next } = form;
    let next = next_page(&next);
    let username = username.trim();
    // through the one door, as `auth.login` over the API: recorded in the audit log alike
    let body = serde_json::json!({ "username": username, "password": password.as_str() });
    password.zeroize();
    let invocation = capstan_rpc::Invocation {
        method: "auth.login",
        caller: capstan_rpc::Caller::Bearer(None),
        source,
        request_id: "",
        forwarded: false,
        body: capstan_rpc::Body::Value(body),
    };
    let result = state.methods.invoke(invocation).await.and_then(capstan_rpc::Invoked::into_value).and_then(|answer| {
        let token = answer["token"].as_str().map(str::to_string);
        let expires_at = answer["expiresAt"].as_u64();
        token.zip(expires_at).ok_or_else(|| Refusal::internal("auth.login answered no token and expiry"))
    });
    match result {
        Ok((token, expires_at)) => {
            let token = zeroize::Zeroizing::new(token);
            // a cookie's Max-Age counts seconds
            let max_age = expires_at.saturating_sub(now_ms()) / 1000;
            let cookie = format!("{SESSION_COOKIE}={}; {}", token.as_str(), cookie_attributes(max_age, is_https(&state)));
            let Ok(cookie) = HeaderValue::from_str(&cookie) else {
                return unavailable(Refusal::internal("the session token is not a valid cookie value"));
            };
            let mut response = forms::redirect(next.unwrap_or("/"));
            response.headers_mut().insert(header::SET_COOKIE, cookie);
            response
        }
        Err(refusal) if refusal.is("unauthenticated") => {
            login_form_to(&state, StatusCode::UNAUTHORIZED, Some(DENIAL), username, next).await
        }
        Err(refusal) if refusal.is("rate-limited") => {
            let wait_ms = refusal.data.as_ref().and_then(|d| d.get("retryAfterMs")).and_then(|v| v.as_u64()).unwrap_or(1000);
            let seconds = wait_ms.div_ceil(1000).max(1);
            let unit = if seconds == 1 { "second" } else { "seconds" };
            let message = format!("Too many failed logins. Wait {seconds} {unit} before trying again.");
            let mut response = login_form(&state, StatusCode::TOO_MANY_REQUESTS, Some(&message), username).await;
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            response
        }
        Err(refusal) => {
            let status = StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            if status.is_server_error() {
                tracing::error!(code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "login failed: {}", refusal.message);
            }
            let message = format!("Capstan could not log you in right now ({}). Try again shortly.", refusal.code);
            login_form(&state, status, Some(&message), username).await
        }
    }
}

/// `POST /logout`: end the session, remove the cookie, back to the login page.
async fn logout(State(state): State<Host>, headers: HeaderMap) -> Response {
    if let Some(refused) = refuse_cross_origin(&state, &headers) {
        return refused;
    }
    match current_identity(&state, &headers).await {
        Ok(Some(viewer)) => {
            // through the one door, as `auth.logout` over the API: recorded in the audit log alike
            let invocation =
                capstan_rpc::Invocation::verified("auth.logout", &viewer.identity, Some(viewer.bearer.expose()), serde_json::json!({}));
            if let Err(refusal) = state.methods.invoke(invocation).await {
                return unavailable(refusal);
            }
        }
        Ok(None) => {}
        Err(refusal) => return unavailable(refusal),
    }
    let mut response = see_other("/login");
    clear_session_cookie(&mut response, is_https(&state));
    response
}

#[cfg(test)]
mod tests;
