//! The host side of the WIT imports, one file per interface. Each interface is reached through
//! a provider built once from the plugin's approved grant ([`Grant::build`]): an interface the
//! grant does not name has no provider, and a call of it is refused `capability-denied`
//! (logged). Nothing a plugin passes can trap the host. A plugin sees only its own collections
//! (`p_<id>__<name>`) and its own blob prefix (`plugins/<id>/`).

mod agents;
mod blobs;
mod budget;
mod events;
mod gateway;
mod http;
mod inventory;
mod log;
mod runtime;
mod secrets;
mod settings;
mod sign;
mod storage;
mod store;
mod transfers;

pub use agents::{
    AGENT_DEADLINE_MARGIN, AgentDispatch, AgentReply, AgentRequest, MAX_AGENT_REPLY_BYTES, MAX_AGENT_REQUEST_BYTES, MAX_AGENT_TIMEOUT,
    NotConnected,
};
pub use blobs::{BlobReaderState, BlobWriterState, MAX_PLUGIN_BLOB_BYTES, blob_prefix};
use budget::CallBudget;
pub use budget::{MAX_HOST_CALLS, MAX_METHOD_OUTPUT};
pub use capstan_core::net::refused_range;
pub use gateway::{
    GATEWAY_DEADLINE_MARGIN, GatewayDispatch, GatewayReply, GatewayRequest, GatewayResponse, MAX_GATEWAY_PATH_BYTES,
    MAX_GATEWAY_REPLY_BYTES, MAX_GATEWAY_REQUEST_BYTES, MAX_GATEWAY_TIMEOUT, NotEnrolled,
};
pub use http::{PluginHttp, origin_of};
pub use settings::{DeclaredSetting, effective as effective_settings};
pub use sign::PLUGIN_KEYS;
pub use storage::{BindingKind, NoStorage, Provisioned, StorageBinding, StorageDispatch};
pub use store::{collection_name, validate_plugin_collection};

use crate::blobs::Blobs;
use crate::keyring::Keyring;
use crate::manifest::Capability;
use crate::platform::Platform;
use crate::refusal::Refusal;
use crate::runtime::capstan::plugin::types;
use crate::store::{CollectionSpec, Store};
use capstan_core::text::truncate;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

type WitResult<T> = std::result::Result<T, types::Refusal>;

/// Largest document (or JSON body) a plugin may pass.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// What the imports reach: shared by every call of every plugin.
pub struct Services {
    /// The document store behind plugins' collections and event cursors.
    pub store: Store,
    /// The blob storage behind plugins' blob prefixes.
    pub blobs: Blobs,
    /// The keyring plugins' signing keys are sealed under.
    pub keyring: Arc<Keyring>,
    /// This node's id.
    pub node_id: String,
    /// Plugins' outbound HTTP (`http.fetch`).
    pub http: PluginHttp,
    /// The inventory, settings and organization roles, as the server answers them.
    pub platform: Arc<dyn Platform>,
    /// Declared collections per plugin id (the names the plugin uses).
    pub collections: RwLock<HashMap<String, BTreeSet<String>>>,
    /// How far ahead of the system clock plugins see the wall clock, in milliseconds: always 0
    /// on a serving host; the in-process test host moves it to show a plugin time passing.
    clock_ahead_ms: AtomicU64,
    /// How `agents.call` reaches a cluster's relay: [`NotConnected`] until the server installs
    /// its own ([`Services::set_agent_dispatch`]).
    agent_dispatch: RwLock<Arc<dyn AgentDispatch>>,
    /// How `gateway.request` reaches the external gateway under Capstan's enrolled credential:
    /// [`NotEnrolled`] until the server installs its own ([`Services::set_gateway_dispatch`]).
    gateway_dispatch: RwLock<Arc<dyn GatewayDispatch>>,
    /// How `storage` reaches the providers of nodes' storage endpoints: [`NoStorage`] until the
    /// server installs its own ([`Services::set_storage_dispatch`]).
    storage_dispatch: RwLock<Arc<dyn StorageDispatch>>,
    /// The origin transfer tickets' URLs start with: none until the server sets it
    /// ([`Services::set_public_origin`]); `transfers` refuses `transfers-unavailable` before.
    public_origin: RwLock<Option<String>>,
}

impl Services {
    /// Services whose outbound HTTP trusts the platform's roots only and reaches no internal
    /// address.
    pub fn new(store: Store, blobs: Blobs, keyring: Arc<Keyring>, node_id: String, platform: Arc<dyn Platform>) -> Arc<Self> {
        let http = PluginHttp::new(&[], &[]).expect("an HTTP client with default TLS roots");
        Self::with_http(store, blobs, keyring, node_id, platform, http)
    }

    /// Services whose outbound HTTP goes through `http`.
    pub fn with_http(
        store: Store,
        blobs: Blobs,
        keyring: Arc<Keyring>,
        node_id: String,
        platform: Arc<dyn Platform>,
        http: PluginHttp,
    ) -> Arc<Self> {
        Arc::new(Services {
            store,
            blobs,
            keyring,
            node_id,
            http,
            platform,
            collections: Default::default(),
            clock_ahead_ms: AtomicU64::new(0),
            agent_dispatch: RwLock::new(Arc::new(NotConnected)),
            gateway_dispatch: RwLock::new(Arc::new(NotEnrolled)),
            storage_dispatch: RwLock::new(Arc::new(NoStorage)),
            public_origin: RwLock::new(None),
        })
    }

    /// Set the origin agents reach this host at (`CAPSTAN_PUBLIC_ORIGIN`), which transfer
    /// tickets' URLs start with.
    pub fn set_public_origin(&self, origin: &str) {
        *self.public_origin.write().expect("public origin lock") = Some(origin.trim_end_matches('/').to_string());
    }

    /// The origin transfer tickets' URLs start with, once set.
    pub(crate) fn public_origin(&self) -> Option<String> {
        self.public_origin.read().expect("public origin lock").clone()
    }

    /// Install how plugins' `agents.call` reaches a cluster's relay (the server does, at start).
    /// It replaces the one before; calls already waiting on that one finish with it.
    pub fn set_agent_dispatch(&self, dispatch: Arc<dyn AgentDispatch>) {
        *self.agent_dispatch.write().expect("agent dispatch lock") = dispatch;
    }

    /// The dispatcher `agents.call` uses now.
    pub(crate) fn agent_dispatch(&self) -> Arc<dyn AgentDispatch> {
        self.agent_dispatch.read().expect("agent dispatch lock").clone()
    }

    /// Install how plugins' `gateway.request` reaches the external gateway with Capstan's
    /// enrolled credential (the server does, at start). It replaces the one before; requests
    /// already waiting on that one finish with it.
    pub fn set_gateway_dispatch(&self, dispatch: Arc<dyn GatewayDispatch>) {
        *self.gateway_dispatch.write().expect("gateway dispatch lock") = dispatch;
    }

    /// The dispatcher `gateway.request` uses now.
    pub(crate) fn gateway_dispatch(&self) -> Arc<dyn GatewayDispatch> {
        self.gateway_dispatch.read().expect("gateway dispatch lock").clone()
    }

    /// Install how plugins' `storage` reaches the providers (the server does, at start).
    pub fn set_storage_dispatch(&self, dispatch: Arc<dyn StorageDispatch>) {
        *self.storage_dispatch.write().expect("storage dispatch lock") = dispatch;
    }

    /// The dispatcher `storage` uses now.
    pub(crate) fn storage_dispatch(&self) -> Arc<dyn StorageDispatch> {
        self.storage_dispatch.read().expect("storage dispatch lock").clone()
    }

    /// Move the wall clock plugins see `by` ahead (the host's own clock is untouched). For the
    /// in-process test host only.
    pub fn advance_plugin_clock(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let _ = self.clock_ahead_ms.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |ahead| Some(ahead.saturating_add(by)));
    }

    /// How far ahead of the system clock plugins see the wall clock.
    pub(crate) fn clock_ahead(&self) -> Duration {
        Duration::from_millis(self.clock_ahead_ms.load(Ordering::SeqCst))
    }

    /// The wall clock plugins see now, in milliseconds since the epoch.
    pub fn plugin_clock_ms(&self) -> u64 {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        u64::try_from(now.as_millis()).unwrap_or(u64::MAX).saturating_add(self.clock_ahead_ms.load(Ordering::SeqCst))
    }

    /// Declare a plugin's collections (created if missing) and remember them for its calls.
    pub async fn declare_collections(&self, plugin: &str, specs: &[CollectionSpec]) -> crate::refusal::Result<()> {
        let mut names = BTreeSet::new();
        for spec in specs {
            validate_plugin_collection(&spec.name)?;
            let mut host = spec.clone();
            host.name = collection_name(plugin, &spec.name);
            self.store.declare(host).await?;
            names.insert(spec.name.clone());
        }
        self.collections.write().expect("collections lock").insert(plugin.to_string(), names);
        Ok(())
    }
}

/// The imports one plugin version may use, built once from its approved grant: an interface
/// whose capability the grant does not name has no provider here, so no call reaches it.
pub struct Grant {
    plugin: String,
    /// `describe` runs before anything is granted: it gets [`Grant::none`].
    describing: bool,
    store: Option<store::Collections>,
    blobs: Option<blobs::Prefix>,
    inventory: Option<inventory::Reader>,
    services: Option<inventory::ServiceWriter>,
    facets: inventory::FacetWriter,
    secrets: secrets::Scopes,
    settings: settings::OwnSettings,
    http: Option<http::Outbound>,
    events: Option<events::Publisher>,
    sign: Option<sign::Signer>,
    log: Option<log::Logger>,
    agents: Option<agents::Agents>,
    gateway: Option<gateway::Gateway>,
    runtime: Option<runtime::Reader>,
    runtime_write: Option<inventory::ServiceWriter>,
    storage: Option<storage::Storage>,
}

impl Grant {
    /// The providers `grants` name, for `plugin`.
    pub fn build(services: &Arc<Services>, plugin: &str, grants: &BTreeSet<Capability>) -> Grant {
        let has = |c: &Capability| grants.contains(c);
        Grant {
            plugin: plugin.to_string(),
            describing: false,
            store: has(&Capability::Store).then(|| store::Collections::new(services, plugin)),
            blobs: has(&Capability::Blobs).then(|| blobs::Prefix::new(services, plugin)),
            inventory: has(&Capability::InventoryRead).then(|| inventory::Reader::new(services)),
            services: has(&Capability::InventoryWriteServices).then(|| inventory::ServiceWriter::new(services, plugin)),
            facets: inventory::FacetWriter::new(services, plugin),
            secrets: secrets::Scopes::new(services, grants),
            settings: settings::OwnSettings { store: services.store.clone(), declared: Default::default() },
            http: http::Outbound::new(services, grants),
            events: has(&Capability::EventsPublish).then(|| events::Publisher::new(services, plugin)),
            sign: has(&Capability::Sign).then(|| sign::Signer::new(services, plugin)),
            log: has(&Capability::Log).then_some(log::Logger),
            agents: has(&Capability::Agents).then(|| agents::Agents::new(services, plugin)),
            gateway: gateway::Gateway::new(services, plugin, grants),
            runtime: has(&Capability::RuntimeRead).then(|| runtime::Reader::new(services)),
            runtime_write: has(&Capability::RuntimeWrite).then(|| inventory::ServiceWriter::new(services, plugin)),
            storage: has(&Capability::Storage).then(|| storage::Storage::new(services, plugin)),
        }
    }

    /// Record what the plugin's `describe` declared of its settings (once; later calls keep the
    /// first).
    pub fn declare_settings(&self, declared: Vec<DeclaredSetting>) {
        let _ = self.settings.declared.set(declared);
    }

    /// No imports at all: what `describe` runs with.
    pub fn none(services: &Arc<Services>, plugin: &str) -> Grant {
        Grant { describing: true, ..Grant::build(services, plugin, &BTreeSet::new()) }
    }
}

/// A linear-memory limit for all of an instance's memories together (a component may hold
/// several core modules, each with its own), which remembers it was hit so a failed call can
/// say why.
pub struct MemoryLimiter {
    limit: usize,
    /// The bytes every memory of the instance has been allowed to grow to, together.
    total: usize,
    /// Set once the plugin tried to grow memory past the limit.
    pub exhausted: bool,
}

impl MemoryLimiter {
    /// A limit of `limit` bytes across every linear memory.
    pub fn new(limit: usize) -> Self {
        MemoryLimiter { limit, total: 0, exhausted: false }
    }

    /// The bytes the instance's memories were allowed to grow to, together (its peak: linear
    /// memory never shrinks).
    pub fn grown(&self) -> usize {
        self.total
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let total = self.total.saturating_sub(current).saturating_add(desired);
        if total > self.limit {
            self.exhausted = true;
            return Ok(false);
        }
        self.total = total;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// The state of one call's instance.
pub struct CallData {
    grant: Arc<Grant>,
    request_id: String,
    wasi: WasiCtx,
    table: ResourceTable,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    /// The instance's memory limit, which says afterwards whether it was hit.
    pub limiter: MemoryLimiter,
    /// What the host may do and hold for this call.
    budget: CallBudget,
    /// Whose authority the call's inventory writes carry.
    pub acting: Acting,
    /// When the runtime stops the call (`None`: not known), which bounds the time an import
    /// may wait on the plugin's behalf (`agents.call`, `gateway.request`).
    pub deadline: Option<Instant>,
    /// A method declared read-only is running: every import that changes something is
    /// refused (`read-only-method`), so the declaration that keeps it out of the audit log holds.
    pub read_only: bool,
}

/// Whose authority a plugin call's inventory writes carry.
#[derive(Debug, Clone)]
pub enum Acting {
    /// The plugin's own, as the operator approved it: its background work (events, reconcile
    /// passes, tasks).
    Plugin,
    /// The authenticated caller of the current method.
    Caller(capstan_rpc::Identity),
    /// Nobody: an anonymous call of a public method, which writes nothing (`unauthenticated`).
    Anonymous,
}

impl CallData {
    /// The state for one call: WASI with only clocks, random and captured stdio, and memory
    /// capped at `memory_limit` bytes.
    pub fn new(grant: Arc<Grant>, request_id: String, clock_ahead: Duration, memory_limit: usize, stdio_capture: usize) -> Self {
        let stdout = MemoryOutputPipe::new(stdio_capture);
        let stderr = MemoryOutputPipe::new(stdio_capture);
        // No filesystem, environment, arguments or network: only clocks, random and stdio.
        let mut wasi = WasiCtx::builder();
        wasi.stdout(stdout.clone()).stderr(stderr.clone()).allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
        if !clock_ahead.is_zero() {
            wasi.wall_clock(AheadClock(clock_ahead));
        }
        let wasi = wasi.build();
        CallData {
            grant,
            request_id,
            wasi,
            table: ResourceTable::new(),
            stdout,
            stderr,
            limiter: MemoryLimiter::new(memory_limit),
            budget: CallBudget::new(memory_limit),
            acting: Acting::Plugin,
            deadline: None,
            read_only: false,
        }
    }

    fn plugin(&self) -> &str {
        &self.grant.plugin
    }

    /// Start a call on this state: `request_id` on its log lines, the host-call budget afresh.
    pub fn begin_call(&mut self, request_id: String) {
        self.request_id = request_id;
        self.budget.renew();
    }

    /// Log what the plugin printed, a line per log record, under its id; whether it printed
    /// anything (the capture is per call, so an instance that printed is not kept for another).
    pub fn flush_stdio(&self) -> bool {
        let (plugin, request_id) = (self.plugin(), &self.request_id);
        let mut printed = false;
        for (stream, pipe) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let bytes = pipe.contents();
            printed |= !bytes.is_empty();
            for line in String::from_utf8_lossy(&bytes).lines().filter(|l| !l.trim().is_empty()) {
                let line = capstan_core::text::escape_control(&truncate(line, 2000)).into_owned();
                tracing::info!(plugin = %plugin, request_id = %request_id, stream, "{line}");
            }
        }
        printed
    }

    /// The provider `provider` (a field of the grant), or `capability-denied` naming
    /// `capability`, logged: the plugin called an import it was not granted. Every import but
    /// the blob handles' goes through here first, so this counts the host call.
    fn granted<P: Clone>(&self, provider: &Option<P>, capability: Capability) -> WitResult<P> {
        self.budget.call()?;
        match provider {
            Some(p) if !self.grant.describing => Ok(p.clone()),
            _ => Err(self.denied(&capability)),
        }
    }

    /// `read-only-method` when the running method is declared a read: called first by every
    /// import that changes something.
    fn changing(&self) -> WitResult<()> {
        if !self.read_only {
            return Ok(());
        }
        Err(read_only_refusal(self.plugin(), &self.request_id))
    }

    /// `capability-denied` for `capability`, logged.
    fn denied(&self, capability: &Capability) -> types::Refusal {
        tracing::warn!(plugin = %self.plugin(), request_id = %self.request_id, capability = %capability,
            "plugin called an import it was not granted");
        let message = if self.grant.describing {
            "describe must not use host imports".to_string()
        } else {
            format!("plugin {} was not granted {capability}", self.plugin())
        };
        refusal("capability-denied", message, json!({ "capability": capability.to_string() }))
    }
}

/// `read-only-method`, logged: a method declared read-only called an import that changes
/// something.
fn read_only_refusal(plugin: &str, request_id: &str) -> types::Refusal {
    tracing::warn!(plugin = %plugin, request_id = %request_id, "a read-only method tried to change something");
    refusal(
        "read-only-method",
        format!(
            "plugin {plugin}: a method declared read-only changes nothing (store, secrets, services, events, blobs, agents, gateway requests and HTTP other than GET)"
        ),
        json!({}),
    )
}

/// The time a request on the plugin's behalf may take: what is left before `deadline` (`None`:
/// no end known) less `margin`, at most `cap`; `None` when nothing is left.
fn timeout_within(deadline: Option<Instant>, now: Instant, margin: Duration, cap: Duration) -> Option<Duration> {
    let left = match deadline {
        Some(deadline) => deadline.checked_duration_since(now)?.checked_sub(margin)?,
        None => cap,
    };
    (!left.is_zero()).then(|| left.min(cap))
}

/// The system wall clock, a fixed time ahead (see [`Services::advance_plugin_clock`]).
struct AheadClock(Duration);

impl wasmtime_wasi::HostWallClock for AheadClock {
    fn resolution(&self) -> Duration {
        wasmtime_wasi::clocks::WallClock::new().resolution()
    }

    fn now(&self) -> Duration {
        wasmtime_wasi::clocks::WallClock::new().now().saturating_add(self.0)
    }
}

impl WasiView for CallData {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl types::Host for CallData {}

fn refusal(code: &str, message: String, data: Value) -> types::Refusal {
    types::Refusal { code: code.into(), message, retryable: false, data: Some(data.to_string()) }
}

/// A host refusal as the plugin sees it; internal details stay in the host log.
pub fn to_wit(r: Refusal) -> types::Refusal {
    if r.code == "internal" {
        tracing::error!(refusal = %r, "host error during a plugin import");
    }
    types::Refusal { code: r.code.to_string(), message: r.message.clone(), retryable: r.retryable, data: r.data.map(|d| d.to_string()) }
}

/// A JSON object the plugin passed, bounded.
fn parse_object(text: &str, what: &str) -> WitResult<Value> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(refusal("document-too-large", format!("{what} exceeds {MAX_DOCUMENT_BYTES} bytes"), json!({})));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(refusal("invalid-request", format!("{what} must be a JSON object"), json!({}))),
        Err(e) => Err(refusal("invalid-request", format!("{what} is not valid JSON: {e}"), json!({}))),
    }
}

trait RetryableWit {
    fn retryable_wit(self) -> Self;
}

impl RetryableWit for types::Refusal {
    fn retryable_wit(mut self) -> Self {
        self.retryable = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_limit_counts_every_memory_of_an_instance_together() {
        use wasmtime::ResourceLimiter;
        let mib = 1 << 20;
        let mut limiter = MemoryLimiter::new(100 * mib);
        // two memories, each well under the limit alone
        assert!(limiter.memory_growing(0, 60 * mib, None).unwrap());
        assert!(!limiter.memory_growing(0, 60 * mib, None).unwrap(), "the second would take the total past the limit");
        assert!(limiter.exhausted);
        // growing the first within what is left is fine; its own old size is not counted twice
        assert!(limiter.memory_growing(60 * mib, 100 * mib, None).unwrap());
        assert!(!limiter.memory_growing(0, 1, None).unwrap());
    }

    #[test]
    fn a_plugin_clock_moved_ahead_stays_ahead() {
        let ahead = AheadClock(Duration::from_secs(3600));
        let system = wasmtime_wasi::clocks::WallClock::new();
        use wasmtime_wasi::HostWallClock;
        let gap = ahead.now().saturating_sub(system.now());
        assert!(gap >= Duration::from_secs(3599) && gap <= Duration::from_secs(3600), "{gap:?}");
    }
}
