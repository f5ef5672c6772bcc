//! The nodes area's HTTP face (`docs/nodes.md`): the jump pages (`GET /jump/<code>`,
//! `GET /jump/<code>/setup.sh`), the agent binary (`GET /agent/v1/binary/<platform>`) and the
//! agent's wire (`POST /agent/v1/enroll|heartbeat|host|rotate`). Each agent route reads at most
//! its declared size within 10 s; what the body says is judged in `capstan_nodes::agent`.

use super::ApiError;
use crate::bearer::bearer_token;
use crate::nodes::{Context, agent, jump};
use crate::refusal::Refusal;
use crate::state::AppState;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};
use tower_http::services::ServeFile;

/// How long an agent route waits for its body.
pub const AGENT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The platforms a jump script asks the agent binary for.
pub const PLATFORMS: &[&str] = &["linux-x86_64", "linux-aarch64"];

/// What a browser's jump page looks like in the dashboard's look ([`super::Pages::jump`]); a
/// `None` answer falls back to the host's plain page.
#[derive(Clone, Copy)]
pub struct JumpPages {
    /// The landing page: the cluster's name, the command, and the origin when it is a dev host's
    /// plain http one.
    pub landing: fn(&str, &str, Option<&str>) -> Option<Response>,
    /// A refusal as a page: status, title, message.
    pub refused: fn(StatusCode, &str, &str) -> Option<Response>,
}

impl JumpPages {
    /// The host's plain pages.
    pub fn plain() -> JumpPages {
        JumpPages { landing: |_, _, _| None, refused: |_, _, _| None }
    }
}

/// The routes, merged into the server's router.
pub fn routes(pages: JumpPages) -> Router<AppState> {
    Router::new()
        .route(
            "/jump/{code}",
            get(move |State(nodes): State<Context>, Path(code): Path<String>, headers: HeaderMap| async move {
                render(&nodes, &code, wants_html(&headers).then_some(pages)).await
            }),
        )
        .route("/jump/{code}/setup.sh", get(jump_script))
        .route("/agent/v1/binary/{platform}", get(agent_binary))
        .route("/agent/v1/enroll", post(enroll))
        .route("/agent/v1/heartbeat", post(heartbeat))
        .route("/agent/v1/host", post(host))
        .route("/agent/v1/rotate", post(rotate))
}

fn no_store(mut response: Response) -> Response {
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn refused(refusal: Refusal) -> Response {
    no_store(ApiError(refusal).into_response())
}

fn wants_html(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|accept| accept.contains("text/html"))
}

/// The script, or for a browser (`page`) the landing page; a refusal as JSON, or as a page.
async fn render(nodes: &Context, code: &str, page: Option<JumpPages>) -> Response {
    let usable = match jump::check_origin(nodes) {
        Ok(()) => jump::usable(nodes, code).await.map_err(|r| if r.is("jump-code-invalid") { jump::invalid_code() } else { r }),
        Err(refusal) => Err(refusal),
    };
    let mut response = match (usable, page) {
        (Err(refusal), None) => return refused(refusal),
        (Err(refusal), Some(pages)) => {
            let status = ApiError(refusal.clone()).into_response().status();
            let title = if refusal.is("jump-code-invalid") { "This jump command no longer works" } else { "No jump command here" };
            let message = format!("{} ({}). Create a new one on the cluster's Nodes page.", refusal.message, refusal.code);
            (pages.refused)(status, title, &message).unwrap_or_else(|| refused(refusal))
        }
        (Ok(usable), None) => {
            let script = jump::script(nodes, code, &usable);
            (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("text/x-shellscript; charset=utf-8"))], script)
                .into_response()
        }
        (Ok(usable), Some(pages)) => {
            let dev = jump::dev_host(nodes).then_some(nodes.public_origin.as_str());
            (pages.landing)(&usable.cluster_name, &jump::command(&nodes.public_origin, code), dev).unwrap_or_else(|| {
                let page = jump::landing_page(nodes, code, &usable);
                (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"))], page).into_response()
            })
        }
    };
    if page.is_some() {
        crate::page_headers::apply(response.headers_mut());
    }
    // stricter than the dashboard's same-origin: this page's URL is the code itself
    response.headers_mut().insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    no_store(response)
}

/// `GET /jump/<code>/setup.sh`: always the script.
async fn jump_script(State(nodes): State<Context>, Path(code): Path<String>) -> Response {
    render(&nodes, &code, None).await
}

fn binary_unavailable(platform: &str) -> Refusal {
    let shown: String = platform.chars().take(32).collect();
    Refusal::new(
        "agent-binary-unavailable",
        format!(
            "this Capstan serves no capstan-agent for {shown:?}: build it beside capstan (cargo build --release -p capstan-agent) \
             or set CAPSTAN_AGENT_BINARY"
        ),
    )
    .with_data(serde_json::json!({ "platform": shown, "platforms": PLATFORMS }))
}

/// The platform this host's own build runs on (the `capstan-agent` beside it is built for it).
pub fn own_platform() -> String {
    format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH)
}

/// The read buffer the agent binary streams through: what one download holds in memory at most.
pub const BINARY_CHUNK: usize = 64 * 1024;

/// `GET /agent/v1/binary/<platform>`: the `capstan-agent` file found next to this executable
/// (or at `CAPSTAN_AGENT_BINARY`), for the platform it is built for. Streamed from disk through
/// [`BINARY_CHUNK`] (it is tens of MiB and needs no login), with `Range` answered 206 (one range;
/// anything else 416), and the whole file's SHA-256 in [`jump::BINARY_SHA256_HEADER`] on every
/// answer, so the script (and a client resuming with `Range`) can check what it got.
async fn agent_binary(State(nodes): State<Context>, Path(platform): Path<String>, request: Request) -> Response {
    let Some(path) = nodes.agent_binary.clone().filter(|_| PLATFORMS.contains(&platform.as_str()) && platform == own_platform()) else {
        return refused(binary_unavailable(&platform));
    };
    let sha256 = match binary_sha256(&path).await {
        Ok(sha256) => sha256,
        Err(refusal) => {
            let why = refusal.detail.as_deref().unwrap_or(refusal.message.as_str());
            tracing::warn!(path = %path.display(), error = %why, "the agent binary cannot be read");
            return refused(binary_unavailable(&platform));
        }
    };
    // only the method and the range reach the file server: the answer is no-store, so no
    // conditional request (and no 304 or 412 without a refusal code) is served
    let mut file_request = axum::http::Request::new(Body::empty());
    *file_request.method_mut() = request.method().clone();
    if let Some(range) = request.headers().get(header::RANGE) {
        file_request.headers_mut().insert(header::RANGE, range.clone());
    }
    let served = match ServeFile::new(&path).with_buf_chunk_size(BINARY_CHUNK).try_call(file_request).await {
        Ok(served) => served,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the agent binary cannot be read");
            return refused(binary_unavailable(&platform));
        }
    };
    let mut response = match served.status() {
        StatusCode::OK | StatusCode::PARTIAL_CONTENT => served.map(Body::new),
        StatusCode::RANGE_NOT_SATISFIABLE => {
            let mut answer = refused(range_not_satisfiable());
            if let Some(range) = served.headers().get(header::CONTENT_RANGE) {
                answer.headers_mut().insert(header::CONTENT_RANGE, range.clone());
            }
            answer
        }
        // gone between the digest and the open
        _ => return refused(binary_unavailable(&platform)),
    };
    let success = response.status().is_success();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if success {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    }
    if let Ok(value) = HeaderValue::from_str(&sha256) {
        headers.insert(jump::BINARY_SHA256_HEADER, value);
    }
    response
}

fn range_not_satisfiable() -> Refusal {
    Refusal::new(
        "range-not-satisfiable",
        "the Range asks for bytes this file does not have, or for more than one range: ask for one range within Content-Range's size",
    )
}

/// A served file's digest, remembered by path for the size and modification time it was taken at.
struct Digested {
    size: u64,
    modified: SystemTime,
    sha256: String,
}

/// Digests of the files this process serves; one entry per path (a replaced file's replaces it).
static DIGESTS: LazyLock<tokio::sync::Mutex<HashMap<PathBuf, Digested>>> = LazyLock::new(Default::default);

/// The SHA-256 (lowercase hex) of the file at `path`, read once per size and modification time:
/// a request costs a `stat`, a replaced binary is read again.
async fn binary_sha256(path: &std::path::Path) -> Result<String, Refusal> {
    let unreadable = |e: std::io::Error| Refusal::new("agent-binary-unavailable", "the agent binary cannot be read").detail(e);
    let meta = tokio::fs::metadata(path).await.map_err(unreadable)?;
    let modified = meta.modified().map_err(unreadable)?;
    // held while the file is read: a burst of first downloads waits for one read, not one each
    let mut digests = DIGESTS.lock().await;
    if let Some(known) = digests.get(path).filter(|d| d.size == meta.len() && d.modified == modified) {
        return Ok(known.sha256.clone());
    }
    let file = tokio::fs::File::open(path).await.map_err(unreadable)?;
    let read = crate::blobs::digest::read_digest(Box::pin(file)).await?;
    if read.size != meta.len() {
        // written to while it was read: nothing is remembered, the next request reads it again
        return Err(Refusal::new("agent-binary-unavailable", "the agent binary changed while it was read").retryable());
    }
    digests.insert(path.to_path_buf(), Digested { size: read.size, modified, sha256: read.sha256.clone() });
    Ok(read.sha256)
}

/// Read at most `limit` bytes within [`AGENT_READ_TIMEOUT`].
async fn bounded(request: Request, limit: usize) -> Result<(HeaderMap, crate::bodies::Buffered), Refusal> {
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(AGENT_READ_TIMEOUT, crate::bodies::read(&parts, body, limit)).await;
    let bytes = read.map_err(|_| {
        Refusal::new("request-timeout", format!("the request body did not arrive within {} s", AGENT_READ_TIMEOUT.as_secs()))
    })??;
    Ok((parts.headers, bytes))
}

fn answered(result: Result<serde_json::Value, Refusal>) -> Response {
    match result {
        Ok(value) => no_store(axum::Json(value).into_response()),
        Err(refusal) => refused(refusal),
    }
}

async fn enroll(State(nodes): State<Context>, request: Request) -> Response {
    let (_, bytes) = match bounded(request, agent::ENROLL_LIMIT).await {
        Ok(read) => read,
        Err(refusal) => return refused(refusal),
    };
    answered(agent::enroll(&nodes, &bytes).await)
}

async fn heartbeat(State(nodes): State<Context>, request: Request) -> Response {
    let (headers, bytes) = match bounded(request, agent::HEARTBEAT_LIMIT).await {
        Ok(read) => read,
        Err(refusal) => return refused(refusal),
    };
    answered(agent::heartbeat(&nodes, &bytes, bearer_token(&headers)).await)
}

async fn host(State(nodes): State<Context>, request: Request) -> Response {
    let (headers, bytes) = match bounded(request, agent::HOST_LIMIT).await {
        Ok(read) => read,
        Err(refusal) => return refused(refusal),
    };
    answered(agent::host(&nodes, &bytes, bearer_token(&headers)).await)
}

async fn rotate(State(nodes): State<Context>, request: Request) -> Response {
    let (headers, bytes) = match bounded(request, agent::ROTATE_LIMIT).await {
        Ok(read) => read,
        Err(refusal) => return refused(refusal),
    };
    answered(agent::rotate(&nodes, &bytes, bearer_token(&headers)).await)
}
