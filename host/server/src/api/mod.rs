//! The HTTP API: typed methods at `POST /api/v1/<method>`, their listing at
//! `GET /api/v1/methods`, and the probes `GET /healthz` and `GET /status`; the router that
//! serves them beside the socket, `/mcp`, the nodes' and the registry's routes and the pages.
//!
//! Every answer carries an `x-request-id` header; the same id is on every log line of the
//! request. Every error is the envelope `{"error":{"code","message","retryable","data"?}}`.
//! Each handler takes the parts of the host it needs (`State<Part>`, see `crate::state`).

mod carried;
pub(crate) mod follow;
pub mod mcp;
pub mod nodes;
pub mod openapi;
pub mod socket;
pub mod transfers;
pub mod uploads;

use crate::auth::Auth;
use crate::bearer::bearer_token;
use crate::bodies;
use crate::fleet::forward;
use crate::refusal::Refusal;
use crate::relays::Relays;
use crate::state::{AppState, BodyLimit, PublicOrigin};
use crate::system::{self, System};
use axum::body::Body;
use axum::extract::{ConnectInfo, FromRef, Path, Request, State};
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

/// The id of the current request (an extension set by the request-id middleware).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

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
    /// The jump pages for a browser in the dashboard's look: the landing page and the
    /// refusals (an expired code is a page, not JSON). `None` answers: the host's plain ones.
    pub jump: nodes::JumpPages,
}

/// Finds the bearer a page session carries in a request's headers ([`Pages::socket_bearer`]).
/// It is given the host's public origin (the pages' own origin) and the request's headers.
pub type SocketBearer = fn(&str, &HeaderMap) -> Option<String>;

impl Pages {
    /// No pages: the API alone.
    pub fn none() -> Pages {
        Pages { routes: Router::new(), not_found: |_, _| None, socket_bearer: |_, _| None, jump: nodes::JumpPages::plain() }
    }
}

/// Before the `/api/v1/socket` upgrade: when the request carries no `Authorization` header
/// and the pages find a session bearer in it ([`Pages::socket_bearer`]), hand that bearer to
/// the upgrade as `Authorization: Bearer`. The socket then judges it exactly as any header
/// bearer (checked at the offer and on every call; an offer's `token` still wins), so the
/// socket itself knows nothing of cookies. A request that states its own `Authorization` is
/// left as it is.
async fn page_bearer(State((origin, find)): State<(PublicOrigin, SocketBearer)>, mut request: Request, next: Next) -> Response {
    if !request.headers().contains_key(header::AUTHORIZATION)
        && let Some(bearer) = find(&origin.0, request.headers())
        && let Ok(value) = HeaderValue::from_str(&format!("Bearer {bearer}"))
    {
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    next.run(request).await
}

/// The whole HTTP surface: the probes, the API, and `pages`.
pub fn router(state: AppState, pages: Pages) -> Router {
    let page_not_found = pages.not_found;
    let bearer = middleware::from_fn_with_state((PublicOrigin::from_ref(&state), pages.socket_bearer), page_bearer);
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
        .merge(mcp::routes(state.methods.clone(), state.auth.clone(), state.max_body_bytes))
        .merge(nodes::routes(pages.jump))
        .merge(capstan_federation::routes::routes(state.federation.clone()))
        .merge(state.hosted_oidc.as_ref().map(|oidc| oidc.router()).unwrap_or_default())
        .merge(capstan_registry::routes(state.registry.clone()))
        .merge(pages.routes)
        .method_not_allowed_fallback(wrong_http_method)
        .fallback(move |headers: HeaderMap, uri: axum::http::Uri| async move { not_found(page_not_found, headers, uri) })
        .layer(middleware::from_fn(crate::bodies::body_deadline))
        .layer(middleware::from_fn_with_state(state.methods.clone(), crate::metrics::track))
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
        if status == StatusCode::PAYLOAD_TOO_LARGE || refusal.is("server-busy") {
            // the rest of the body is not read: tell the client this connection ends here
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Log a refusal as the API answers it: a failure of the host's own (500) as an error with its
/// detail, one a caller can bring about at will (a relay that is not connected, a busy host) as a
/// warning, anything else briefly.
pub(crate) fn log_refusal(refusal: &Refusal) {
    let status = StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::error!(code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "request failed: {}", refusal.message);
    } else if status.is_server_error() {
        tracing::warn!(code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "request failed: {}", refusal.message);
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
async fn status(State(auth): State<Arc<Auth>>, State(system): State<System>, headers: HeaderMap) -> Response {
    let identity = optional_identity(&auth, &headers).await;
    let report = system::status_report(&system, system::sees_details(identity.as_ref())).await;
    let code = if report.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(report)).into_response()
}

async fn list_methods(State(methods): State<Arc<Registry>>) -> Json<Value> {
    Json(methods.describe())
}

/// `GET /api/v1/openapi.json`: the methods of [`list_methods`] as an OpenAPI 3.1 document,
/// built per request so loaded plugins show as they come and go.
async fn openapi_document(State(methods): State<Arc<Registry>>, State(PublicOrigin(origin)): State<PublicOrigin>) -> Json<Value> {
    Json(openapi::document(&methods.list(), &origin))
}

async fn call_method(
    State(methods): State<Arc<Registry>>,
    State(BodyLimit(limit)): State<BodyLimit>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let source = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let bearer = bearer_token(headers);
    // who is calling, before a byte of the body is read: an unknown method or a caller who may
    // not call it is refused without the host buffering anything, and nobody (a public method
    // without a token) may send only a few KiB
    let admitted = match methods.admit(&name, bearer).await {
        Ok(admitted) => admitted,
        Err(refusal) => return Ok(refused_unread(&parts, body, refusal).await),
    };
    let limit = if admitted.is_anonymous() { limit.min(bodies::ANONYMOUS_BODY_BYTES) } else { limit };
    let bytes = bodies::read(&parts, body, limit).await?;
    let request_id = parts.extensions.get::<RequestId>().map(|r| r.0.clone()).unwrap_or_default();
    let decode = |bytes: &[u8]| json_body(headers, bytes);
    let invocation = Invocation {
        method: &name,
        caller: Caller::Admitted(admitted, bearer),
        source,
        request_id: &request_id,
        forwarded: headers.contains_key(forward::FORWARDED_BY),
        body: capstan_rpc::Body::Raw { bytes: &bytes, decode: &decode },
    };
    let (mut response, answered_by) = match methods.invoke(invocation).await? {
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

/// The answer to a request refused before its body was read: the refusal, on a connection that
/// closes unless the body was small enough to drop ([`bodies::refused_unread`]).
pub(crate) async fn refused_unread(parts: &axum::http::request::Parts, body: Body, refusal: Refusal) -> Response {
    let close = bodies::refused_unread(parts, body).await;
    let mut response = ApiError(refusal).into_response();
    if close {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
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
async fn optional_identity(auth: &Auth, headers: &HeaderMap) -> Option<crate::auth::Identity> {
    auth.authenticate(bearer_token(headers)?).await.ok()
}

/// `POST /fleet/v1/relay-call`: a call another fleet node carried here for a relay this node
/// holds (`capstan_relays::forward`), answered `{result}` or with the error envelope. Its signed
/// headers are judged before its body is read.
async fn relay_call(State(relays): State<Arc<Relays>>, request: Request) -> Result<Response, ApiError> {
    use crate::relays::forward::{AT, BODY_SHA256, FROM, MAX_BODY, NONCE, SIGNATURE, Signed};
    let (parts, body) = request.into_parts();
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let signed =
        Signed { from: header(FROM), at: header(AT), nonce: header(NONCE), signature: header(SIGNATURE), body_sha256: header(BODY_SHA256) };
    if let Err(refusal) = relays.admit_carried(&signed).await {
        return Ok(refused_unread(&parts, body, refusal).await);
    }
    let bytes = bodies::read(&parts, body, MAX_BODY).await?;
    let result = relays.carried(signed, &bytes).await?;
    Ok(Json(json!({ "result": result })).into_response())
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
