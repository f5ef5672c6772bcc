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
use std::time::Duration;

/// How long an agent route waits for its body.
pub const AGENT_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The platforms a jump script asks the agent binary for.
pub const PLATFORMS: &[&str] = &["linux-x86_64", "linux-aarch64"];

/// The routes, merged into the server's router.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/jump/{code}", get(jump_page))
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

async fn render(nodes: &Context, code: &str, html: bool) -> Response {
    if let Err(refusal) = jump::check_origin(nodes) {
        return refused(refusal);
    }
    let usable = match jump::usable(nodes, code).await {
        Ok(usable) => usable,
        Err(refusal) if refusal.is("jump-code-invalid") => return refused(jump::invalid_code()),
        Err(refusal) => return refused(refusal),
    };
    let (kind, body) = if html {
        ("text/html; charset=utf-8", jump::landing_page(nodes, code, &usable))
    } else {
        ("text/x-shellscript; charset=utf-8", jump::script(nodes, code, &usable))
    };
    let mut response = (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static(kind))], body).into_response();
    response.headers_mut().insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    no_store(response)
}

/// `GET /jump/<code>`: a browser's landing page, anything else's script.
async fn jump_page(State(nodes): State<Context>, Path(code): Path<String>, headers: HeaderMap) -> Response {
    render(&nodes, &code, wants_html(&headers)).await
}

/// `GET /jump/<code>/setup.sh`: always the script.
async fn jump_script(State(nodes): State<Context>, Path(code): Path<String>) -> Response {
    render(&nodes, &code, false).await
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

/// `GET /agent/v1/binary/<platform>`: the `capstan-agent` file found next to this executable
/// (or at `CAPSTAN_AGENT_BINARY`), for the platform it is built for.
async fn agent_binary(State(nodes): State<Context>, Path(platform): Path<String>) -> Response {
    let Some(path) = nodes.agent_binary.clone().filter(|_| PLATFORMS.contains(&platform.as_str()) && platform == own_platform()) else {
        return refused(binary_unavailable(&platform));
    };
    match tokio::fs::read(&path).await {
        Ok(bytes) => {
            let headers = [
                (header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream")),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            ];
            (StatusCode::OK, headers, Body::from(bytes)).into_response()
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the agent binary cannot be read");
            refused(binary_unavailable(&platform))
        }
    }
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
