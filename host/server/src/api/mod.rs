//! The HTTP API: typed methods at `POST /api/v1/<method>`, their listing at
//! `GET /api/v1/methods`, and the probes `GET /healthz` and `GET /status`.
//!
//! Every answer carries an `x-request-id` header; the same id is on every log line of the
//! request. Every error is the envelope `{"error":{"code","message","retryable","data"?}}`.

pub mod mcp;
pub mod nodes;
pub mod openapi;
pub mod socket;
pub mod system;
pub mod transfers;
pub mod uploads;

use crate::auth::Auth;
use crate::blobs::Blobs;
use crate::fleet::forward;
use crate::keyring::Keyring;
use crate::migrate::Chain;
use crate::refusal::Refusal;
use crate::store::Store;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// The registry's module, under the name callers used before it became its own crate.
pub use capstan_rpc as methods;
use capstan_rpc::door::Forwarded;
pub use capstan_rpc::{Access, Call, Registry, receipts};
use capstan_rpc::{Caller, Invocation, Invoked};

/// What every HTTP handler can reach. Methods reach only the context their area registered
/// them with (see [`AppState::build`]).
#[derive(Clone)]
pub struct AppState {
    /// The document store (SQLite or MongoDB).
    pub store: Store,
    /// The object storage (a local directory or an S3 bucket).
    pub blobs: Blobs,
    /// The keyring: the KEKs that seal secrets and the ingress recipient.
    pub keyring: Arc<Keyring>,
    /// Authentication: turns a bearer token into the caller's identity.
    pub auth: Arc<Auth>,
    /// The host's migration chain, which `/status` judges readiness against.
    pub chain: Arc<Chain>,
    /// Every API method, the host's and loaded plugins', resolved by name on each call.
    pub methods: Arc<Registry>,
    /// Largest API request body accepted, in bytes (`CAPSTAN_MAX_BODY_BYTES`).
    pub max_body_bytes: usize,
    /// The externally reachable origin of this Capstan, without a trailing slash.
    pub public_origin: String,
    /// The plugin host: the plugins loaded on this node.
    pub plugins: Arc<crate::plugins::host::PluginHost>,
    /// The scheduler running host and plugin tasks.
    pub scheduler: Arc<crate::scheduler::Scheduler>,
    /// This node's place in the fleet (a test host's is registered in its own bucket).
    pub fleet: Arc<crate::fleet::runtime::Fleet>,
    /// The nodes area: what the `/jump` and `/agent/v1` routes reach (its clock is the one the
    /// `nodes.*` methods read).
    pub nodes: crate::nodes::Context,
    /// The open `/api/v1/socket` sessions, and how host code pushes to them.
    pub sockets: Arc<socket::Hub>,
    /// The cluster relays this node holds, and the election that reaches any relay of the fleet.
    pub relays: Arc<crate::relays::Relays>,
    /// What `GET /metrics` serves, and to whom.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The OCI registry under `/v2`.
    pub registry: Arc<capstan_registry::Registry>,
    /// Capstan's enrollment at the external gateway.
    pub gateway: capstan_gateway::Context,
}

/// The id of the current request (an extension set by the request-id middleware).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Everything the host state is made of, assembled by `serve` (or a test) before the state.
pub struct Parts {
    /// The opened document store.
    pub store: Store,
    /// The opened object storage.
    pub blobs: Blobs,
    /// The loaded keyring.
    pub keyring: Arc<Keyring>,
    /// Authentication over the store and keyring.
    pub auth: Arc<Auth>,
    /// The host's migration chain (shared once the state is built).
    pub chain: Chain,
    /// Largest API request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// The externally reachable origin of this Capstan.
    pub public_origin: String,
    /// Dev mode (`serve --dev`): a jump script may be rendered for an `http` origin.
    pub dev: bool,
    /// The started plugin host; its methods join the registry.
    pub plugins: Arc<crate::plugins::host::PluginHost>,
    /// The started scheduler, with the host's tasks registered.
    pub scheduler: Arc<crate::scheduler::Scheduler>,
    /// This node's place in the fleet.
    pub fleet: Arc<crate::fleet::runtime::Fleet>,
    /// The token `GET /metrics` answers to (`CAPSTAN_METRICS_TOKEN`); `None`: it is off.
    pub metrics_token: Option<capstan_core::text::SecretString>,
    /// How deployments' routes are checked (`CAPSTAN_ROUTE_CHECK_*`).
    pub route_check: capstan_registry::route_check::RouteCheck,
}

impl AppState {
    /// The host state, with every area's methods registered with the context it needs.
    pub fn build(parts: Parts) -> Self {
        let Parts {
            store,
            blobs,
            keyring,
            auth,
            chain,
            max_body_bytes,
            public_origin,
            dev,
            plugins,
            scheduler,
            fleet,
            metrics_token,
            route_check,
        } = parts;
        let chain = Arc::new(chain);
        let mut registry = Registry::default();
        system::register(
            &mut registry,
            system::System { store: store.clone(), blobs: blobs.clone(), chain: chain.clone(), plugins: plugins.clone(), dev },
        );
        crate::auth::methods::register(
            &mut registry,
            crate::auth::methods::Context { auth: auth.clone(), store: store.clone(), blobs: blobs.clone() },
        );
        crate::fleet::methods::register(&mut registry, fleet.clone());
        crate::snapshot::register(&mut registry, crate::snapshot::Context { store: store.clone(), blobs: blobs.clone() });
        crate::events::methods::register(&mut registry, store.clone());
        crate::plugins::methods::register(&mut registry, crate::plugins::methods::Context { host: plugins.clone(), blobs: blobs.clone() });
        crate::scheduler::methods::register(&mut registry, scheduler.clone());
        registry.add_source(plugins.clone());
        crate::inventory::register(
            &mut registry,
            crate::inventory::Context {
                store: store.clone(),
                blobs: blobs.clone(),
                dependents: Arc::new(capstan_links::HostDependents),
                receipts: auth.receipt_keys().clone(),
            },
        );
        let secrets = crate::secrets::methods::Context { store: store.clone(), keyring: keyring.clone() };
        crate::secrets::methods::register(&mut registry, secrets.clone());
        let gateway = capstan_gateway::Context::new(secrets.clone());
        capstan_gateway::register(&mut registry, gateway.clone());
        let nodes = crate::nodes::Context::new(store.clone(), public_origin.clone(), dev);
        crate::nodes::register(&mut registry, nodes.clone());
        let sockets = Arc::new(socket::Hub::new(socket::Limits::for_bodies(max_body_bytes)));
        let peers = crate::relays::forward::Peers::new(fleet.clone());
        let relays = crate::relays::Relays::new(store.clone(), sockets.clone(), fleet.node.identity.id.clone(), peers);
        crate::relays::register(&mut registry, secrets.clone(), relays.clone());
        let oci = capstan_registry::Registry::new(store.clone(), blobs.clone(), auth.clone(), &public_origin, route_check);
        capstan_registry::methods::register(&mut registry, oci.clone());
        capstan_registry::deployments::register(&mut registry, oci.clone());
        capstan_rpc::audit::register(&mut registry, capstan_rpc::audit::AuditLog::new(store.clone()));
        registry.set_audit(capstan_rpc::audit::AuditLog::new(store.clone()));
        registry.set_authenticator(auth.clone());
        registry.set_coordination(fleet.clone());
        plugins.set_agent_dispatch(Arc::new(crate::plugins::agents::AgentCalls(relays.clone())));
        plugins.set_gateway_dispatch(Arc::new(crate::plugins::gateway::GatewayCalls(gateway.clone())));
        plugins.set_public_origin(&public_origin);
        AppState {
            store,
            blobs,
            keyring,
            auth,
            chain,
            methods: Arc::new(registry),
            max_body_bytes,
            public_origin,
            plugins,
            scheduler,
            fleet,
            nodes,
            sockets,
            relays,
            metrics: crate::metrics::Metrics::new(metrics_token.as_ref()),
            registry: oci,
            gateway,
        }
    }
}

impl AppState {
    /// What readiness is judged on.
    pub fn system(&self) -> system::System {
        system::System {
            store: self.store.clone(),
            blobs: self.blobs.clone(),
            chain: self.chain.clone(),
            plugins: self.plugins.clone(),
            dev: self.nodes.dev,
        }
    }
}

#[cfg(test)]
impl AppState {
    /// The same host with another keyring (as `capstan keyring rotate` and a restart give).
    pub fn with_keyring(self, keyring: Arc<Keyring>) -> AppState {
        let AppState { store, blobs, auth, chain, max_body_bytes, public_origin, plugins, scheduler, fleet, nodes, registry, .. } = self;
        let route_check = registry.route_check.clone();
        let chain = Arc::try_unwrap(chain).unwrap_or_else(|shared| (*shared).clone());
        let dev = nodes.dev;
        let metrics_token = None;
        AppState::build(Parts {
            store,
            blobs,
            keyring,
            auth,
            chain,
            max_body_bytes,
            public_origin,
            dev,
            plugins,
            scheduler,
            fleet,
            metrics_token,
            route_check,
        })
    }
}

/// A complete host state on an embedded store in `dir`, for tests (here and, through the
/// `testing` feature, the dashboard's).
#[cfg(any(test, feature = "testing"))]
pub async fn test_state(dir: &std::path::Path) -> AppState {
    test_state_at(dir, "http://capstan.test", false).await
}

/// [`test_state`] with another public origin, in dev mode or not.
#[cfg(any(test, feature = "testing"))]
pub async fn test_state_at(dir: &std::path::Path, public_origin: &str, dev: bool) -> AppState {
    let store = Store::new(crate::store::sqlite::SqliteStore::open(dir.join("capstan.sqlite")).unwrap(), crate::store::DEFAULT_BUDGET);
    test_state_on(dir, store, public_origin, dev).await
}

/// [`test_state_at`] on the given store (a MongoDB one, say); the rest is kept in `dir`.
#[cfg(any(test, feature = "testing"))]
pub async fn test_state_on(dir: &std::path::Path, store: Store, public_origin: &str, dev: bool) -> AppState {
    let blobs = Blobs::new(crate::blobs::local::LocalBlobs::open(dir.join("blobs").to_str().unwrap()).await.unwrap());
    let keyring = Arc::new(Keyring::generate(None, None).unwrap());
    let auth = Auth::new(store.clone(), &keyring, "http://capstan.test").await.unwrap();
    crate::inventory::declare(&store).await.unwrap();
    crate::secrets::methods::declare(&store).await.unwrap();
    crate::relays::declare(&store).await.unwrap();
    crate::nodes::declare(&store).await.unwrap();
    capstan_registry::declare(&store).await.unwrap();
    capstan_rpc::audit::declare(&store).await.unwrap();
    capstan_gateway::declare(&store).await.unwrap();
    let platform = capstan_links::InventoryPlatform::new(store.clone(), keyring.clone(), Arc::new(capstan_links::HostDependents));
    // plugins may reach 127.0.0.0/8 (the tests' servers), and no other internal address
    let http = crate::plugins::imports::PluginHttp::new(&[], &["127.0.0.0/8".parse().unwrap()]).unwrap();
    let services =
        crate::plugins::imports::Services::with_http(store.clone(), blobs.clone(), keyring.clone(), "test-node".into(), platform, http);
    let runtime = crate::plugins::runtime::Runtime::new(Some(dir.join("plugin-cache"))).unwrap();
    let first_party = crate::plugins::first_party::bundles().unwrap();
    let plugins = crate::plugins::host::PluginHost::new(runtime, services, vec![], first_party).await.unwrap();
    let scheduler = crate::scheduler::Scheduler::new(store.clone(), "test-node".into(), None, Some(plugins.clone())).await.unwrap();
    // a node identity of its own; it neither registers in the bucket nor runs the fleet's loops,
    // so the bucket holds only what a test puts there and no coordinator lease is taken
    let (identity, _) = crate::fleet::identity::NodeIdentity::load_or_create(&dir.join("state"), Some("test-node")).unwrap();
    let fleet = crate::fleet::runtime::Fleet::new(Arc::new(crate::fleet::Node::new(blobs.clone(), identity, Default::default(), None)));
    AppState::build(Parts {
        store,
        blobs,
        keyring,
        auth,
        chain: crate::migrate::host_chain(),
        max_body_bytes: 1 << 20,
        public_origin: public_origin.into(),
        dev,
        plugins,
        scheduler,
        fleet,
        metrics_token: None,
        route_check: Default::default(),
    })
}

/// What the server serves beside the API: the dashboard's routes, and its answer to a
/// browser asking for a path that does not exist (`None` leaves the error envelope).
#[derive(Clone)]
pub struct Pages {
    /// The routes, merged with the API's.
    pub routes: Router<AppState>,
    /// The page for an unknown path, when the request wants one (a browser outside `/api`).
    pub not_found: fn(&HeaderMap, &str) -> Option<Response>,
    /// The bearer JWT a browser's page session carries in the upgrade of `/api/v1/socket`
    /// (the dashboard's HttpOnly session cookie, from its own pages only), `None` when there is
    /// none. A browser's WebSocket cannot set `Authorization`, and page scripts cannot read an
    /// HttpOnly cookie; this lets the dashboard's pages open an authenticated session without
    /// handing the JWT to script. See [`page_bearer`].
    pub socket_bearer: SocketBearer,
}

/// Finds the bearer a page session carries in a request's headers ([`Pages::socket_bearer`]).
pub type SocketBearer = fn(&AppState, &HeaderMap) -> Option<String>;

impl Pages {
    /// No pages: the API alone.
    pub fn none() -> Pages {
        Pages { routes: Router::new(), not_found: |_, _| None, socket_bearer: |_, _| None }
    }
}

/// Before the `/api/v1/socket` upgrade: when the request carries no `Authorization` header
/// and the pages find a session bearer in it ([`Pages::socket_bearer`]), hand that bearer to
/// the upgrade as `Authorization: Bearer`. The socket then judges it exactly as any header
/// bearer (checked at the offer and on every call; an offer's `token` still wins), so the
/// socket itself knows nothing of cookies. A request that states its own `Authorization` is
/// left as it is.
async fn page_bearer(State((state, find)): State<(AppState, SocketBearer)>, mut request: Request, next: Next) -> Response {
    if !request.headers().contains_key(header::AUTHORIZATION)
        && let Some(bearer) = find(&state, request.headers())
        && let Ok(value) = HeaderValue::from_str(&format!("Bearer {bearer}"))
    {
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    next.run(request).await
}

/// The whole HTTP surface: the probes, the API, and `pages`.
pub fn router(state: AppState, pages: Pages) -> Router {
    let page_not_found = pages.not_found;
    let bearer = middleware::from_fn_with_state((state.clone(), pages.socket_bearer), page_bearer);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/status", get(status))
        .route("/api/v1/methods", get(list_methods))
        .route("/api/v1/openapi.json", get(openapi_document))
        .route("/metrics", get(crate::metrics::scrape))
        .route("/api/v1/socket", get(socket::upgrade).route_layer(bearer))
        .route("/api/v1/{method}", post(call_method).fallback(method_not_allowed))
        .route("/api/v1/uploads/plugin-bundle", post(uploads::plugin_bundle).fallback(method_not_allowed))
        .route(crate::plugins::transfers::PATH, put(transfers::upload).get(transfers::download).fallback(method_not_allowed))
        .route(crate::relays::forward::PATH, post(relay_call).fallback(method_not_allowed))
        .merge(mcp::routes(&state))
        .merge(nodes::routes())
        .merge(capstan_registry::routes(state.registry.clone()))
        .merge(pages.routes)
        .method_not_allowed_fallback(wrong_http_method)
        .fallback(move |headers: HeaderMap, uri: axum::http::Uri| async move { not_found(page_not_found, headers, uri) })
        .layer(middleware::from_fn(crate::listener::body_deadline))
        .layer(middleware::from_fn_with_state(state.clone(), crate::metrics::track))
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

/// An error as the client sees it.
pub struct ApiError(pub Refusal);

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        ApiError(r)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let refusal = self.0;
        let status = StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        log_refusal(&refusal);
        let mut response = (status, Json(json!({ "error": refusal }))).into_response();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // the rest of the body is not read: tell the client this connection ends here
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Log a refusal as the API answers it: a server error with its detail, anything else briefly.
pub(crate) fn log_refusal(refusal: &Refusal) {
    if StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR).is_server_error() {
        tracing::error!(code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "request failed: {}", refusal.message);
    } else {
        tracing::info!(code = %refusal.code, "request refused: {}", refusal.message);
    }
}

const REQUEST_ID: &str = forward::REQUEST_ID;

/// The target of the per-request access line: `CAPSTAN_LOG=info,capstan::access=debug` logs
/// every request, where the default logs only those refused, failed or slow.
pub const ACCESS_LOG: &str = "capstan::access";
/// A request at least this long is logged at info however it ended.
const SLOW_REQUEST: std::time::Duration = std::time::Duration::from_secs(1);

/// Give each request an id (a well-formed incoming one is kept, so a load balancer's id
/// threads through), run it inside a span carrying the id, and stamp the id on the answer.
async fn request_id(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    request.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!("request", id = %id, method = %request.method(), path = %logged_path(request.uri().path()));
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    let (status, elapsed) = (response.status(), started.elapsed());
    span.in_scope(|| {
        // the access line: a request that went well is a debug line (as Nomad and Consul log
        // theirs), since formatting and writing a line per call was a visible share of a fast
        // call's cost; a refused, failed or slow one stays at info. `/metrics` counts them all.
        let elapsed_ms = elapsed.as_millis() as u64;
        if status.as_u16() < 400 && elapsed < SLOW_REQUEST {
            tracing::debug!(target: ACCESS_LOG, status = status.as_u16(), elapsed_ms, "request done")
        } else {
            tracing::info!(target: ACCESS_LOG, status = status.as_u16(), elapsed_ms, "request done")
        }
    });
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response
}

/// A request path as the log shows it: a jump code in `/jump/<code>` is a bearer secret, so
/// only its first two characters are kept (enough to tell two requests apart).
fn logged_path(path: &str) -> std::borrow::Cow<'_, str> {
    match path.strip_prefix("/jump/") {
        Some(rest) => {
            let (code, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let kept: String = code.chars().take(2).collect();
            format!("/jump/{kept}…{tail}").into()
        }
        None => path.into(),
    }
}

async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /status`: readiness for anyone (a probe needs no token); an administrator's bearer
/// token adds where the store and the blobs are.
async fn status(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let identity = optional_identity(&state, &headers).await;
    let report = system::status_report(&state.system(), system::sees_details(identity.as_ref())).await;
    let code = if report.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(report)).into_response()
}

async fn list_methods(State(state): State<AppState>) -> Json<Value> {
    Json(state.methods.describe())
}

/// `GET /api/v1/openapi.json`: the methods of [`list_methods`] as an OpenAPI 3.1 document,
/// built per request so loaded plugins show as they come and go.
async fn openapi_document(State(state): State<AppState>) -> Json<Value> {
    Json(openapi::document(&state.methods.list(), &state.public_origin))
}

async fn call_method(State(state): State<AppState>, Path(name): Path<String>, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let source = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    // Read the body before judging anything else: a refusal that leaves a body unread makes
    // the server drop the connection, which a client reusing connections would trip over.
    let bytes = read_body(headers, body, state.max_body_bytes).await?;
    let request_id = parts.extensions.get::<RequestId>().map(|r| r.0.clone()).unwrap_or_default();
    let decode = |bytes: &[u8]| json_body(headers, bytes);
    let invocation = Invocation {
        method: &name,
        caller: Caller::Bearer(bearer_token(headers)),
        source,
        request_id: &request_id,
        forwarded: headers.contains_key(forward::FORWARDED_BY),
        body: capstan_rpc::Body::Raw { bytes: &bytes, decode: &decode },
    };
    let (mut response, answered_by) = match state.methods.invoke(invocation).await? {
        Invoked::Here { answer, answered_by } => (Json(answer).into_response(), answered_by),
        Invoked::There(Forwarded { status, answered_by, body }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            ((status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response(), answered_by)
        }
    };
    if let Some(node) = answered_by.and_then(|n| HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert(forward::ANSWERED_BY, node);
    }
    Ok(response)
}

/// A request body as JSON (an empty body is `{}`); other content types are refused.
fn json_body(headers: &HeaderMap, bytes: &[u8]) -> Result<Value, Refusal> {
    if let Some(kind) = headers.get(header::CONTENT_TYPE) {
        let kind = kind.to_str().unwrap_or("");
        if !kind.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/json") {
            return Err(Refusal::new("unsupported-media-type", "request bodies are JSON: send Content-Type: application/json"));
        }
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(bytes).map_err(|e| Refusal::invalid_request(format!("the body is not valid JSON: {e}")))
}

/// Who a request's bearer token stands for, where an answer needs none: without a token, or
/// with one that does not authenticate, the caller is anonymous.
async fn optional_identity(state: &AppState, headers: &HeaderMap) -> Option<crate::auth::Identity> {
    state.auth.authenticate(bearer_token(headers)?).await.ok()
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

/// How much of an oversized body is read and dropped before it is refused. A client still writing
/// it when the refusal comes would meet a connection reset (or SIGPIPE) instead of the named
/// refusal; beyond this bound the connection is simply closed.
const DRAINED_BODY_MAX: u64 = 16 * 1024 * 1024;

/// Read and drop a body frame by frame (the listener's body timeout still bounds the time).
async fn drain(mut body: Body) {
    use http_body_util::BodyExt;
    while let Some(Ok(_)) = body.frame().await {}
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, Refusal> {
    let too_large = || {
        Refusal::new("request-too-large", format!("request bodies are limited to {limit} bytes")).with_data(json!({ "limitBytes": limit }))
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared.filter(|n| *n > limit as u64) {
        if declared <= DRAINED_BODY_MAX {
            drain(body).await;
        }
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if crate::listener::is_body_timeout(&e) {
            return crate::listener::body_timeout_refusal();
        }
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            source = err.source();
        }
        Refusal::invalid_request("the request body could not be read").detail(e)
    })
}

/// `POST /fleet/v1/relay-call`: a call another fleet node carried here for a relay this node
/// holds (`capstan_relays::forward`), answered `{result}` or with the error envelope.
async fn relay_call(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Result<Json<Value>, ApiError> {
    use crate::relays::forward::{AT, FROM, MAX_BODY, NONCE, SIGNATURE, Signed};
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| Refusal::new("request-too-large", format!("a carried relay call is at most {MAX_BODY} bytes")))?;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let signed = Signed { from: header(FROM), at: header(AT), nonce: header(NONCE), signature: header(SIGNATURE) };
    let result = state.relays.carried(signed, &bytes).await?;
    Ok(Json(json!({ "result": result })))
}

async fn method_not_allowed() -> ApiError {
    Refusal::new("method-not-allowed", "API methods are called with POST").into()
}

async fn wrong_http_method() -> ApiError {
    Refusal::new("method-not-allowed", "this path does not accept that HTTP method; probes and listings are read with GET").into()
}

/// Unknown paths: the error envelope, except where the pages answer (the dashboard's "not
/// found" page for a browser outside `/api`).
fn not_found(page: fn(&HeaderMap, &str) -> Option<Response>, headers: HeaderMap, uri: axum::http::Uri) -> Response {
    if let Some(page) = page(&headers, uri.path()) {
        return page;
    }
    ApiError(Refusal::new("not-found", "no such path; the API lives under /api/v1/")).into_response()
}
