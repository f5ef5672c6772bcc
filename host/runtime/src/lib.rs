//! The runtime: what makes services run (docs/runtime.md). Runtime specs per (service,
//! cluster) ([`spec`]), replica slots and their assignments ([`slots`]), the pure slot
//! transition ([`transition`]), the assignment producer ([`producer`]), node runtime sessions
//! that carry assignments to the agents and their reports back ([`sessions`]), the views
//! operators read ([`views`]), the workloads' logs ([`logs`]), the evidence of a release's
//! rollout ([`rollout`]) and the digests images named by tag run as ([`images`]).
//!
//! The producer runs on one fleet node at a time (the placed workload [`PRODUCER_WORKLOAD`]);
//! each fleet node delivers to the node sessions its own sockets carry.

pub mod gates;
pub mod history;
pub mod images;
pub mod logs;
pub mod producer;
pub mod rollout;
pub mod sessions;
pub mod slots;
pub mod spec;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod transition;
pub mod views;

use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::Dependents;
use capstan_rpc::{Access, Call, Registry};
use capstan_store::{CollectionSpec, Store};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// Runtime specs, one per (service, cluster): id `<serviceId>@<clusterId>`.
pub const RUNTIME_SPECS: &str = "runtime_specs";
/// Replica slots: id `<serviceId>@<nodeId>.<index>`.
pub const RUNTIME_SLOTS: &str = "runtime_slots";
/// Verdicts per (service, cluster), written only when they change.
pub const RUNTIME_STATUS: &str = "runtime_status";
/// Where each node's runtime session was last registered: id `<nodeId>`, the fleet node whose
/// process holds it (so a call to the node made on another fleet node is carried there).
pub const RUNTIME_NODE_SESSIONS: &str = "runtime_node_sessions";
/// The runtime's hold on a service it runs (its deletion waits for the replicas' removal).
pub const HOLDER: &str = "host:runtime";
/// The fleet workload the producer runs as.
pub const PRODUCER_WORKLOAD: &str = "host.runtime-producer";
/// The producer's pass runs at least this often, woken sooner by what it follows.
pub const PASS_EVERY: Duration = Duration::from_secs(5);
/// Expired pull credentials are swept this often (by the producer's node).
pub const SWEEP_EVERY: Duration = Duration::from_secs(600);
/// Delivery runs at least this often, woken sooner by admissions and acknowledgements.
pub const DELIVER_EVERY: Duration = Duration::from_secs(2);
/// Log payloads due are written into the bucket this often (by the producer's node).
pub const LOG_DRAIN_EVERY: Duration = Duration::from_secs(10);

/// The runtime's collections.
pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(RUNTIME_SPECS).index("by_service", &["serviceId"]).index("by_cluster", &["clusterId"]),
        CollectionSpec::new(RUNTIME_SLOTS)
            .index("by_service", &["serviceId"])
            .index("by_node", &["nodeId"])
            .index("by_cluster", &["clusterId"])
            .unique("by_assignment", &["assignmentId"]),
        CollectionSpec::new(RUNTIME_STATUS).index("by_service", &["serviceId"]),
        CollectionSpec::new(RUNTIME_NODE_SESSIONS),
        CollectionSpec::new(images::RUNTIME_IMAGE_PLANS),
    ]
    .into_iter()
    .chain(logs::collections())
    .chain([history::collection(), gates::collection()])
    .collect()
}

/// Declare the runtime's collections.
pub async fn declare(store: &Store) -> Result<()> {
    for spec in collections() {
        store.declare(spec).await?;
    }
    Ok(())
}

/// A spec's (and its verdict's) id.
pub fn spec_id(service_id: &str, cluster_id: &str) -> String {
    format!("{service_id}@{cluster_id}")
}

/// What the runtime reaches.
#[derive(Clone)]
pub struct Context {
    /// The store.
    pub store: Store,
    /// What hangs on services (the runtime's hold is released through the inventory with it).
    pub dependents: Arc<dyn Dependents>,
    /// The nodes area (node credentials judged on every report).
    pub nodes: capstan_nodes::Context,
    /// Capstan's registry host, `host[:port]` of the public origin: images there are pulled with
    /// a per-assignment credential.
    pub registry_host: String,
    /// The node sessions this process carries.
    pub sessions: Arc<sessions::NodeSessions>,
    /// The fleet node this process is, once placed ([`Context::place`]): recorded with each node
    /// session it registers.
    pub here: Arc<std::sync::OnceLock<String>>,
    /// The server's sockets, where pushes go.
    pub frames: Arc<dyn capstan_relays::Sessions>,
    /// Wakes the producer.
    pub producer_wake: Arc<Notify>,
    /// Wakes delivery.
    pub delivery_wake: Arc<Notify>,
    /// The keyring: secret material is opened under it to be sealed to a node's recipient.
    pub keyring: Arc<capstan_keyring::Keyring>,
    /// Where each issuance of secret material is recorded.
    pub audit: capstan_rpc::audit::AuditLog,
    /// Capstan's bucket: workload log segments.
    pub blobs: capstan_blobs::Blobs,
    /// The logs' state in this process.
    pub logs: Arc<logs::LogState>,
    /// Asks registries what an image's tag names (image plans).
    pub images: Arc<images::Resolver>,
}

impl Context {
    /// The context for `store`, delivering through `frames`, sealing secret material opened
    /// under `keyring`, keeping log segments in `blobs`.
    pub fn new(
        store: Store,
        dependents: Arc<dyn Dependents>,
        nodes: capstan_nodes::Context,
        frames: Arc<dyn capstan_relays::Sessions>,
        keyring: Arc<capstan_keyring::Keyring>,
        blobs: capstan_blobs::Blobs,
    ) -> Context {
        let registry_host = registry_host(&nodes.public_origin);
        Context {
            images: Arc::new(images::Resolver::new(Vec::new(), &registry_host)),
            audit: capstan_rpc::audit::AuditLog::new(store.clone()),
            keyring,
            blobs,
            logs: Arc::default(),
            store,
            dependents,
            nodes,
            registry_host,
            sessions: Arc::default(),
            here: Arc::default(),
            frames,
            producer_wake: Arc::new(Notify::new()),
            delivery_wake: Arc::new(Notify::new()),
        }
    }

    /// Ask registries through `mirrors` for what a tag names (`CAPSTAN_IMAGE_MIRRORS`).
    pub fn with_image_mirrors(mut self, mirrors: Vec<images::Mirror>) -> Context {
        self.images = Arc::new(images::Resolver::new(mirrors, &self.registry_host));
        self
    }

    /// This process is the fleet node `fleet_node_id`: the node sessions it registers are
    /// recorded as held here (set once, at assembly).
    pub fn place(&self, fleet_node_id: &str) {
        let _ = self.here.set(fleet_node_id.to_string());
    }

    /// Ask the producer for a pass soon.
    pub fn wake(&self) {
        self.producer_wake.notify_one();
    }
}

/// A node's report refused: `runtime-session-report-refused` with the reason word (the
/// sessions' and the logs' refusals alike).
pub fn report_refused(reason: &str, message: impl Into<String>) -> Refusal {
    Refusal::new("runtime-session-report-refused", message).with_data(serde_json::json!({ "reason": reason }))
}

/// `host[:port]` of an origin (`https://capstan.example.com` → `capstan.example.com`).
pub fn registry_host(origin: &str) -> String {
    let rest = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// Over HTTP: a runtime session belongs to a node's socket.
async fn over_http(_: Context, _: Call, _: serde_json::Map<String, Value>) -> Result<Value> {
    Err(Refusal::new("socket-required", "a node's runtime methods are called over its /api/v1/socket session (docs/runtime.md)"))
}

/// Register every `runtime.*` method.
pub fn register(registry: &mut Registry, cx: Context) {
    spec::register(registry, cx.clone());
    views::register(registry, cx.clone());
    logs::reads::register(registry, cx.clone());
    history::register(registry, cx.clone());
    let mut scoped = registry.with(cx);
    for (method, summary) in [
        ("runtime.registerSession", "A node's agent registers its runtime session (over its /api/v1/socket session only)"),
        (
            "runtime.enrollRecipient",
            "A node offers the X25519 key it drew for this process and is sealed a challenge (runtime session only)",
        ),
        ("runtime.proveRecipient", "A node answers its recipient challenge: the key becomes its next recipient (runtime session only)"),
        ("runtime.reportObservation", "A node reports what it observes of an assignment (over its runtime session only)"),
        ("runtime.reportReceipt", "A node reports an assignment stopped or removed (over its runtime session only)"),
        ("runtime.reportLogs", "A node reports a batch of an assignment's log lines (over its runtime session only)"),
    ] {
        scoped.add(method, summary, Access::Authenticated, over_http).refuses(&["socket-required", "runtime-session-report-refused"]);
    }
}

/// Start the producer (where the fleet places it: `here` answers) and this node's delivery.
pub fn spawn<F, Fut>(cx: Context, here: F, stop: watch::Receiver<bool>) -> Vec<tokio::task::JoinHandle<()>>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    // a service written here (a new image, a deletion) is acted on at once, not at the next tick
    let wake = cx.producer_wake.clone();
    cx.store.watch_writes(&[capstan_inventory::SERVICES], Arc::new(move |_, _| wake.notify_one()));
    let producer = {
        let (cx, mut stop) = (cx.clone(), stop.clone());
        tokio::spawn(async move {
            let mut last_sweep = std::time::Instant::now();
            let mut last_drain = std::time::Instant::now();
            loop {
                if here().await {
                    if last_drain.elapsed() >= LOG_DRAIN_EVERY {
                        last_drain = std::time::Instant::now();
                        match logs::segments::drain(&cx).await {
                            Ok(drained) if drained.segments > 0 => tracing::debug!(?drained, "log segments written"),
                            Ok(_) => {}
                            Err(refusal) => tracing::warn!(code = %refusal.code, "writing log segments failed: {}", refusal.message),
                        }
                    }

                    match producer::pass(&cx).await {
                        Ok(report) if report.writes > 0 => tracing::debug!(?report, "runtime pass"),
                        Ok(_) => {}
                        Err(refusal) => tracing::warn!(code = %refusal.code, "runtime pass failed: {}", refusal.message),
                    }
                    // expired pull credentials go (they are refused from their expiry on)
                    if last_sweep.elapsed() >= SWEEP_EVERY {
                        last_sweep = std::time::Instant::now();
                        if let Err(refusal) = capstan_registry::pulls::sweep(&cx.store, capstan_core::clock::now_ms()).await {
                            tracing::warn!(code = %refusal.code, "sweeping expired pull credentials failed: {}", refusal.message);
                        }
                    }
                }
                tokio::select! {
                    _ = cx.producer_wake.notified() => {}
                    _ = tokio::time::sleep(PASS_EVERY) => {}
                    _ = stop.changed() => return,
                }
            }
        })
    };
    let delivery = {
        let mut stop = stop;
        tokio::spawn(async move {
            let mut passes: u64 = 0;
            loop {
                if cx.sessions.count() > 0 {
                    if let Err(refusal) = sessions::deliver(&cx).await {
                        tracing::warn!(code = %refusal.code, "runtime delivery failed: {}", refusal.message);
                    }
                    passes += 1;
                    if passes.is_multiple_of(30) {
                        let _ = sessions::forget_retired(&cx).await;
                    }
                }
                tokio::select! {
                    _ = cx.delivery_wake.notified() => {}
                    _ = tokio::time::sleep(DELIVER_EVERY) => {}
                    _ = stop.changed() => return,
                }
            }
        })
    };
    vec![producer, delivery]
}
