//! `GET /metrics`: the Prometheus text exposition of this node, through the `metrics` facade
//! (every host crate records with `metrics::counter!` and friends) and the
//! `metrics-exporter-prometheus` recorder installed here once per process.
//!
//! **Exposure.** The endpoint is on the API listener but closed by default: it answers only
//! when `CAPSTAN_METRICS_TOKEN` is set, and then only to `Authorization: Bearer <that token>`.
//! A scraper keeps a static token file (Prometheus' `authorization.credentials_file`); an
//! administrator's JWT would expire and need fresh logins. Without the setting the path
//! answers `metrics-disabled` (404); a missing or wrong token the uniform `unauthenticated`
//! (401), so nothing can be probed.
//!
//! **Labels.** Every label value comes from a bounded set the host controls: HTTP requests carry
//! the route template, the API method's name (a registered method; anything else is `unknown`)
//! and the status; plugin calls the installed plugin's id, the call kind and the outcome; never
//! a path a client chose, a user, a token or a body value.

use crate::bearer::bearer_token;
use crate::fleet::runtime::Fleet;
use crate::plugins::host::PluginHost;
use crate::refusal::Refusal;
use crate::relays::Relays;
use crate::sessions::Hub;
use crate::store::Store;
use axum::Json;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use capstan_core::text::SecretString;
use capstan_rpc::Registry;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// The shortest `CAPSTAN_METRICS_TOKEN` accepted: a scrape token is a bearer secret.
pub const MIN_TOKEN_CHARS: usize = 24;

/// Latency buckets, in seconds, for every duration histogram (1 ms … 30 s).
const BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Buckets, in bytes, for the memory a plugin call's instance grew to (1 MiB … 1 GiB).
const MEMORY_BUCKETS: &[f64] =
    &[1048576.0, 4194304.0, 16777216.0, 33554432.0, 67108864.0, 134217728.0, 268435456.0, 536870912.0, 1073741824.0];

/// The label a call of a method that is not registered is counted under.
pub const UNKNOWN_METHOD: &str = "unknown";

/// What `/metrics` serves and who may read it.
pub struct Metrics {
    handle: PrometheusHandle,
    /// SHA-256 of the scrape token; `None`: the endpoint is off.
    token: Option<[u8; 32]>,
}

impl Metrics {
    /// The exposition of this process, readable with `token` (`None`: `/metrics` is off).
    pub fn new(token: Option<&SecretString>) -> Arc<Metrics> {
        Arc::new(Metrics { handle: recorder(), token: token.map(|t| Sha256::digest(t.expose().as_bytes()).into()) })
    }

    /// Whether `bearer` is the scrape token (compared as digests, in constant time).
    fn admits(&self, bearer: Option<&str>) -> bool {
        let (Some(expected), Some(bearer)) = (self.token, bearer) else { return false };
        let given: [u8; 32] = Sha256::digest(bearer.as_bytes()).into();
        expected.iter().zip(given.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// The process's Prometheus recorder, installed as the global one on first use. Should another
/// recorder already be installed (a test harness), the handle still renders this one, empty.
fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let memory = metrics_exporter_prometheus::Matcher::Full("capstan_plugin_instance_memory_bytes".into());
            let recorder = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .and_then(|builder| builder.set_buckets_for_metric(memory, MEMORY_BUCKETS))
                .expect("the buckets are not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is installed; /metrics shows only what this one records");
            }
            describe();
            handle
        })
        .clone()
}

/// The HELP lines.
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!("capstan_http_requests_total", "HTTP requests answered, by route template, API method and status");
    describe_counter!(
        capstan_rpc::door::CALLS_METRIC,
        "Method calls through the one door (HTTP, socket, dashboard, MCP, demo), by method and outcome (answered, forwarded, refused)"
    );
    describe_histogram!("capstan_http_request_duration_seconds", Unit::Seconds, "HTTP request latency, by route template and API method");
    describe_counter!("capstan_plugin_calls_total", "Plugin calls, by plugin, kind (method, event, reconcile, task, …) and outcome");
    describe_histogram!("capstan_plugin_call_duration_seconds", Unit::Seconds, "Plugin call latency once an instance is had");
    describe_counter!(
        "capstan_store_transactions_total",
        "Store transactions finished, by outcome (committed, conflict, busy, refused) and access (read, write)"
    );
    describe_counter!("capstan_store_transaction_retries_total", "Store transactions restarted after transient contention");
    describe_histogram!("capstan_store_transaction_duration_seconds", Unit::Seconds, "Store transaction time, retries included");
    describe_counter!("capstan_scheduler_runs_total", "Task executions run on this node, by task and how they ended");
    describe_histogram!("capstan_scheduler_run_duration_seconds", Unit::Seconds, "Task execution time, by task");
    describe_gauge!("capstan_socket_sessions", "Open /api/v1/socket sessions on this node, by kind");
    describe_gauge!("capstan_relay_sessions", "Cluster relay sessions this node holds");
    describe_gauge!(
        "capstan_fleet_live_nodes",
        "Fleet nodes heard from within the liveness window and not draining, as this node last read"
    );
    describe_gauge!("capstan_fleet_lease_holder", "1 while this node holds the coordinator lease, else 0");
    describe_gauge!("capstan_fleet_fence", "The fence this node holds the coordinator lease under (0: not the holder)");
    describe_gauge!("capstan_outbox_head_sequence", "The newest event sequence in the outbox");
    describe_gauge!("capstan_outbox_consumer_lag", "Events in the outbox after what each loaded plugin's consumer handled");
    describe_gauge!("capstan_plugins_loaded", "Plugins loaded on this node");
    describe_gauge!("capstan_plugin_instances_busy", "Instances of each loaded plugin running a call now");
    describe_gauge!("capstan_plugin_instances_max", "Instances each loaded plugin may run at once (its approved concurrency)");
    describe_gauge!("capstan_plugin_instance_memory_limit_bytes", Unit::Bytes, "The memory one instance of each plugin may grow to");
    describe_histogram!("capstan_plugin_instance_memory_bytes", Unit::Bytes, "The linear memory each plugin call's instance grew to");
    describe_counter!(
        "capstan_blob_operations_total",
        "Blob storage operations, by operation and outcome (ok, absent, exists, conflict, failed)"
    );
    describe_histogram!(
        "capstan_blob_operation_duration_seconds",
        Unit::Seconds,
        "Blob storage operation latency (a get: to its first byte)"
    );
}

/// What a scrape reads: the exposition and who may read it, and the parts of the host whose
/// gauges are set at scrape time (the socket sessions, the relays held, the fleet, the loaded
/// plugins, the outbox in the store).
#[derive(Clone)]
pub struct Scrape {
    /// The exposition, and the scrape token.
    pub metrics: Arc<Metrics>,
    /// The open socket sessions, counted by kind.
    pub sockets: Arc<Hub>,
    /// The relay sessions this node holds.
    pub relays: Arc<Relays>,
    /// This node's view of the fleet and the coordinator lease.
    pub fleet: Arc<Fleet>,
    /// The plugins loaded here and their instances.
    pub plugins: Arc<PluginHost>,
    /// The outbox's head and its consumers' cursors.
    pub store: Store,
}

/// Count one HTTP request: its route template (the API's `/api/v1/{method}` by the method's
/// name in `methods`, `unknown` for one that is not registered), its status and its time.
pub async fn track(State(methods): State<Arc<Registry>>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string());
    let method = match route.as_deref() {
        Some("/api/v1/{method}") => {
            let name = request.uri().path().trim_start_matches("/api/v1/");
            Some(if methods.get(name).is_some() { name.to_string() } else { UNKNOWN_METHOD.to_string() })
        }
        _ => None,
    };
    let started = Instant::now();
    let response = next.run(request).await;
    let route = route.unwrap_or_else(|| "unmatched".into());
    let method = method.unwrap_or_default();
    let status = response.status().as_u16().to_string();
    metrics::histogram!("capstan_http_request_duration_seconds", "route" => route.clone(), "method" => method.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("capstan_http_requests_total", "route" => route, "method" => method, "status" => status).increment(1);
    response
}

/// `GET /metrics`: the exposition, for the scrape token's bearer only.
pub async fn scrape(State(state): State<Scrape>, headers: HeaderMap) -> Response {
    let metrics = state.metrics.clone();
    if metrics.token.is_none() {
        let refusal = Refusal::new(
            "metrics-disabled",
            "GET /metrics is served only when CAPSTAN_METRICS_TOKEN is set, to Authorization: Bearer <that token>",
        );
        return (StatusCode::NOT_FOUND, Json(json!({ "error": refusal }))).into_response();
    }
    if !metrics.admits(bearer_token(&headers)) {
        let mut response = (StatusCode::UNAUTHORIZED, Json(json!({ "error": capstan_rpc::denied() }))).into_response();
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    refresh(&state).await;
    let body = metrics.handle.render();
    ([(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"))], body).into_response()
}

/// Set the gauges read from the host's state at scrape time.
async fn refresh(state: &Scrape) {
    for (kind, open) in state.sockets.open_by_kind() {
        metrics::gauge!("capstan_socket_sessions", "kind" => kind).set(open as f64);
    }
    metrics::gauge!("capstan_relay_sessions").set(state.relays.held_count() as f64);
    let fleet = &state.fleet;
    let now = capstan_core::clock::now_ms();
    let live = fleet.view().iter().filter(|n| n.live(now, &fleet.node.timing)).count();
    metrics::gauge!("capstan_fleet_live_nodes").set(live as f64);
    let fence = fleet.coordinator.fence();
    metrics::gauge!("capstan_fleet_lease_holder").set(if fence.is_some() { 1.0 } else { 0.0 });
    metrics::gauge!("capstan_fleet_fence").set(fence.unwrap_or(0) as f64);
    let loaded = state.plugins.loaded();
    metrics::gauge!("capstan_plugins_loaded").set(loaded.len() as f64);
    for active in &loaded {
        let (busy, concurrency) = active.sandbox.instances_in_use();
        let plugin = active.manifest.id.clone();
        metrics::gauge!("capstan_plugin_instances_busy", "plugin" => plugin.clone()).set(busy as f64);
        metrics::gauge!("capstan_plugin_instances_max", "plugin" => plugin.clone()).set(concurrency as f64);
        metrics::gauge!("capstan_plugin_instance_memory_limit_bytes", "plugin" => plugin).set(active.sandbox.memory_limit() as f64);
    }
    // the outbox: one short read each, skipped (the gauge keeps its last value) when the store
    // does not answer, so a scrape never fails on it
    let Ok(head) = crate::events::head(&state.store).await else { return };
    metrics::gauge!("capstan_outbox_head_sequence").set(head as f64);
    for active in loaded {
        let id = active.manifest.id.clone();
        if let Ok(cursor) = crate::events::cursor(&state.store, &format!("plugin:{id}")).await {
            metrics::gauge!("capstan_outbox_consumer_lag", "consumer" => format!("plugin:{id}")).set(head.saturating_sub(cursor) as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_scrape_token_is_admitted() {
        let token = SecretString::new("a-scrape-token-of-enough-length".into());
        let metrics = Metrics::new(Some(&token));
        assert!(metrics.admits(Some("a-scrape-token-of-enough-length")));
        assert!(!metrics.admits(Some("a-scrape-token-of-enough-lengtH")));
        assert!(!metrics.admits(None));
        let off = Metrics::new(None);
        assert!(!off.admits(Some("anything")) && !off.admits(None));
    }
}
