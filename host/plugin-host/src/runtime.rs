//! The sandbox: wasmtime with the component model, async, the pooling allocator and
//! copy-on-write memory images. A plugin version is compiled once (and cached on disk by
//! component digest and engine configuration), pre-instantiated once, and every call runs in a
//! fresh instance with its own memory limit and deadline. Whatever a plugin does, the host
//! answers a named refusal: `plugin-deadline-exceeded`, `plugin-resource-exhausted`,
//! `plugin-failed`, `plugin-output-invalid`, `plugin-busy`.

use super::imports::{Acting, CallData, Grant, MAX_METHOD_OUTPUT};
use super::manifest::{Capability, InstanceReuse, Manifest};
use crate::refusal::{Refusal, Result};
use capstan_core::text::truncate;
use capstan_rpc::Identity;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline};

/// The host side of the current `capstan:plugin` world, generated from `wit/0.3.6` (whose names
/// a 0.3.0 to 0.3.5 component's resolve to: a patch only adds). Earlier versions run through their
/// adapters (`contract_0_2`, `contract_0_1`).
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        world: "manager",
        path: "../../wit/0.3.6",
        imports: { default: async },
        exports: { default: async },
        with: {
            "capstan:plugin/blobs.blob-reader": crate::imports::BlobReaderState,
            "capstan:plugin/blobs.blob-writer": crate::imports::BlobWriterState,
        },
    });
}

pub use bindings::{Manager, ManagerPre, capstan, exports};

pub use self::capstan::plugin::types::{CallContext, Caller, CallerKind};
pub use self::exports::capstan::plugin::guest as wit_guest;
/// A refusal as a plugin returns it over WIT, before the host checks and converts it.
pub type WitRefusal = self::capstan::plugin::types::Refusal;

/// Deadline of a method call, an event delivery, a describe.
pub const METHOD_DEADLINE: Duration = Duration::from_secs(6);
/// Deadline of a reconcile pass, a scheduled task, a migration.
pub const PASS_DEADLINE: Duration = Duration::from_secs(30);
/// How often the engine's epoch advances; deadlines are checked at this granularity.
const TICK: Duration = Duration::from_millis(5);
/// The most memory any plugin may ask for (its manifest's `memory-mib` is capped here).
pub const MAX_MEMORY_BYTES: usize = 1 << 30;
/// Bytes of a plugin's stdout/stderr kept per call for the log.
const STDIO_CAPTURE: usize = 64 * 1024;

/// The one wasmtime engine of the host, its on-disk artifact cache and its epoch ticker.
pub struct Runtime {
    engine: Engine,
    cache_dir: Option<PathBuf>,
    engine_key: String,
    linker: Linker<CallData>,
}

impl Runtime {
    /// An engine with the pooling allocator; `cache_dir` (node-local, private) keeps compiled
    /// components so a restart does not compile again.
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Arc<Self>> {
        let engine = match Engine::new(&config(true)) {
            Ok(engine) => engine,
            Err(e) => {
                // A host whose address space is capped cannot reserve the pool; run on-demand.
                tracing::warn!(error = %e, "pooling allocator unavailable, plugins use on-demand allocation");
                Engine::new(&config(false)).map_err(|e| Refusal::internal(format!("wasmtime engine: {e}")))?
            }
        };
        let engine_key = engine_key(&engine);
        if let Some(dir) = &cache_dir {
            create_private_dir(dir)?;
        }
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| Refusal::internal(format!("linking WASI: {e}")))?;
        Manager::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |data: &mut CallData| data)
            .map_err(|e| Refusal::internal(format!("linking the capstan imports: {e}")))?;
        crate::contract_0_2::add_to_linker(&mut linker)
            .map_err(|e| Refusal::internal(format!("linking the capstan:plugin@0.2 imports: {e}")))?;
        crate::contract_0_1::Manager::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |data: &mut CallData| data)
            .map_err(|e| Refusal::internal(format!("linking the capstan:plugin@0.1.0 imports: {e}")))?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("capstan-plugin-epoch".into())
            .spawn(move || {
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(TICK);
                }
            })
            .map_err(Refusal::internal)?;
        Ok(Arc::new(Runtime { engine, cache_dir, engine_key, linker }))
    }

    /// Compile (or load from the cache) and pre-instantiate a component that targets the
    /// contract `wit` (`capstan:plugin@<version>`, a version this host serves, as its manifest
    /// states); a component that does not export that world is `wit-version-mismatch`.
    pub fn prepare(&self, component_bytes: &[u8], wit: &str) -> Result<Prepared> {
        let digest = hex::encode(Sha256::digest(component_bytes));
        let started = Instant::now();
        let (component, cached) = self.compile(component_bytes, &digest)?;
        if !cached {
            release_freed_memory();
        }
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            Refusal::new("plugin-imports-unsupported", format!("the component imports something this host does not provide: {e}"))
        })?;
        let mismatch = |e: wasmtime::Error| {
            Refusal::new("wit-version-mismatch", format!("the manifest names {wit}, but the component does not export that world: {e}"))
                .with_data(json!({ "wit": wit }))
        };
        let pre = match crate::manifest::served_wit(wit)? {
            crate::manifest::WIT_0_1 => Pre::V0_1(crate::contract_0_1::ManagerPre::new(pre).map_err(mismatch)?),
            crate::manifest::WIT_0_2 => Pre::V0_2(crate::contract_0_2::ManagerPre::new(pre).map_err(mismatch)?),
            _ => Pre::Current(ManagerPre::new(pre).map_err(mismatch)?),
        };
        tracing::debug!(digest = %digest, cached, ms = started.elapsed().as_millis() as u64, "plugin component ready");
        Ok(Prepared { pre, digest, cached })
    }

    fn compile(&self, bytes: &[u8], digest: &str) -> Result<(Component, bool)> {
        let path = self.cache_dir.as_ref().map(|dir| dir.join(format!("{digest}-{}.cwasm", self.engine_key)));
        if let Some(path) = path.as_ref().filter(|p| p.exists())
            && trusted_artifact(path)
        {
            // SAFETY: the file is one this host wrote into its private cache directory from a
            // component it verified; the name binds it to the component digest and the engine.
            match unsafe { load_compiled(&self.engine, path) } {
                Ok(component) => return Ok((component, true)),
                Err(e) => tracing::warn!(error = %e, path = %path.display(), "discarding an unreadable compiled plugin"),
            }
        }
        let compiled = self.compiling_engine().precompile_component(bytes).map_err(|e| {
            Refusal::new("bundle-malformed", format!("plugin.wasm is not a valid component: {e}"))
                .with_data(json!({"entry": "plugin.wasm"}))
        })?;
        if let Some(path) = &path {
            match capstan_core::private_file::replace_atomically(path, &compiled, 0o600) {
                // mapped from the file, as a restart loads it: only the code that runs is resident
                // SAFETY: this host wrote the file from the bytes compiled just now.
                Ok(()) => match unsafe { load_compiled(&self.engine, path) } {
                    Ok(component) => return Ok((component, false)),
                    Err(e) => tracing::warn!(error = %e, "could not load a compiled plugin just cached"),
                },
                Err(e) => tracing::warn!(error = %e, "could not cache a compiled plugin"),
            }
        }
        // SAFETY: the bytes were produced by an engine compatible with this one just now.
        let component = unsafe { Component::deserialize(&self.engine, &compiled) }.map_err(Refusal::internal)?;
        Ok((component, false))
    }

    /// An engine to compile with, dropped once the compile is done: Cranelift keeps its
    /// compilation contexts (tens of MB after one component) for the life of the engine that
    /// compiled, so compiling on the serving engine kept the host ~45 MB larger than one started
    /// from the compiled cache. Its artifacts are those of the serving engine (same code
    /// settings, checked by their compatibility hash); where it cannot be had, the serving
    /// engine compiles.
    fn compiling_engine(&self) -> Engine {
        let mut settings = config(false);
        settings.memory_reservation(MAX_MEMORY_BYTES as u64);
        match Engine::new(&settings) {
            Ok(engine) if engine_key(&engine) == self.engine_key => engine,
            _ => self.engine.clone(),
        }
    }

    /// The wasmtime version plugins run on (kept equal to Cargo.lock's by a test).
    pub fn engine_version() -> &'static str {
        capstan_core::build::PLUGIN_ENGINE
    }
}

fn config(pooling: bool) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.memory_init_cow(true);
    config.cranelift_opt_level(wasmtime::OptLevel::Speed);
    // CAPSTAN_PLUGIN_PERF_MAP=1: name plugins' compiled functions in /tmp/perf-<pid>.map, so
    // `perf report` shows a plugin's own functions instead of bare addresses (docs/plugins.md)
    if perf_map() {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(1000);
        pool.total_core_instances(4000);
        pool.total_memories(2000);
        pool.total_tables(4000);
        pool.max_memory_size(MAX_MEMORY_BYTES);
        pool.max_core_instances_per_component(32);
        pool.max_memories_per_component(8);
        pool.max_tables_per_component(32);
        keep_dirtied_pages_resident(&mut pool, PoolingAllocationConfig::is_pagemap_scan_available());
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        // Reserve only what a plugin may use, so 2000 memories fit a modest address space.
        config.memory_reservation(MAX_MEMORY_BYTES as u64);
    }
    config
}

/// Bytes of a released linear memory slot reset in place and kept resident (when the kernel
/// has `PAGEMAP_SCAN`); beyond them a slot's dirtied pages are given back with `madvise`.
const MEMORY_KEEP_RESIDENT: usize = 2 << 20;
/// Bytes of a released table slot reset in place and kept resident.
const TABLE_KEEP_RESIDENT: usize = 64 << 10;
/// Idle slots the pool keeps warm (affine to the module that last used them); wasmtime's
/// default is 100.
const WARM_SLOTS: u32 = 32;

/// Keep the pages a call dirtied resident when its slot is released, so the next call on the
/// slot takes no page faults to map them back (a fresh instance per call otherwise faults in
/// every page it touches: stack, data, heap).
///
/// With `PAGEMAP_SCAN` (Linux 6.7 and later) wasmtime asks the kernel which pages of the slot
/// were written and copies back only those from the image (or zeroes them), up to
/// `MEMORY_KEEP_RESIDENT`; the RSS this keeps is the pages calls actually touch in the pool's
/// warm slots. Without it (older kernels, other systems), wasmtime would `memset` the lowest
/// `MEMORY_KEEP_RESIDENT` bytes of every memory on every release, touched or not, which costs
/// more than the faults it saves: there, linear memories are reset with `madvise` as before and
/// only tables (small, and reset in a few µs) are kept resident.
///
/// Bound: a released slot stays warm for its module; at most `WARM_SLOTS` idle slots are kept
/// beyond those in use, so the pages kept are at most (`WARM_SLOTS` + calls in flight) ×
/// (`MEMORY_KEEP_RESIDENT` + `TABLE_KEEP_RESIDENT`), and in practice the few pages a call
/// touches (the example plugin's `greet` took 7.9 page faults per call before this).
fn keep_dirtied_pages_resident(pool: &mut PoolingAllocationConfig, pagemap_scan: bool) {
    pool.max_unused_warm_slots(WARM_SLOTS);
    pool.table_keep_resident(TABLE_KEEP_RESIDENT);
    if pagemap_scan {
        pool.pagemap_scan(wasmtime::Enabled::Yes);
        pool.linear_memory_keep_resident(MEMORY_KEEP_RESIDENT);
    } else {
        pool.pagemap_scan(wasmtime::Enabled::No);
    }
}

/// `CAPSTAN_PLUGIN_PERF_MAP=1`: name compiled plugin code for `perf` (docs/plugins.md).
fn perf_map() -> bool {
    std::env::var_os("CAPSTAN_PLUGIN_PERF_MAP").is_some_and(|v| v == "1")
}

/// Load a compiled component from the cache. Mapped from the file, so only the code that runs
/// is resident — except with the perf map on: `perf` names code mapped from a file by that
/// file, never by the map, so the code is read into anonymous memory instead.
///
/// # Safety
/// `path` holds an artifact this host compiled for an engine of `engine`'s key.
unsafe fn load_compiled(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    if perf_map() {
        let bytes = std::fs::read(path)?;
        // SAFETY: as the caller promises for the file.
        return unsafe { Component::deserialize(engine, &bytes) };
    }
    // SAFETY: as the caller promises.
    unsafe { Component::deserialize_file(engine, path) }
}

/// What tells artifacts of `engine` apart: compiled code is loaded only by an engine whose key
/// it was compiled under (the cache file's name carries it).
fn engine_key(engine: &Engine) -> String {
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
    format!("{:016x}", std::hash::Hasher::finish(&hasher))
}

/// Hand the heap memory a Cranelift compile freed back to the kernel. glibc's allocator keeps
/// freed pages for reuse (in the arenas of the threads that compiled); trimming after a compile
/// (rare: once per plugin version and engine) gives them back. Other allocators return memory
/// by themselves.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Create the compiled-plugin cache (mode 0700), or check an existing one: compiled code is
/// loaded from it without further checks, so it must be a real directory owned by this user
/// that group and others cannot write, else `state-dir-unusable`.
fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let unusable = |why: String| Refusal::new("state-dir-unusable", format!("the plugin cache {} {why}", dir.display()));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| unusable(format!("cannot be created: {e}")))?;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| unusable(format!("cannot be read: {e}")))?;
    if !meta.is_dir() {
        return Err(unusable("is not a directory (symbolic links are refused)".into()));
    }
    if !capstan_core::private_file::owned_unshared(&meta) {
        return Err(unusable("must be owned by the user Capstan runs as and not writable by group or others (chmod 700 it)".into()));
    }
    Ok(())
}

/// Whether a cached compiled plugin may be loaded: a regular file (not a link) this user owns
/// and nobody else can write. One that is not is compiled again and replaced.
fn trusted_artifact(path: &Path) -> bool {
    let trusted = std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file() && capstan_core::private_file::owned_unshared(&meta));
    if !trusted {
        tracing::warn!(path = %path.display(), "not loading a compiled plugin that is a link or that others could have written");
    }
    trusted
}

/// A compiled, pre-instantiated component.
#[derive(Clone)]
pub struct Prepared {
    pre: Pre,
    /// SHA-256 of the component bytes as lowercase hex; names the cached artifact.
    pub digest: String,
    /// Whether the compiled artifact came from the cache.
    pub cached: bool,
}

/// A component pre-instantiated with the bindings of the contract version it targets.
#[derive(Clone)]
enum Pre {
    Current(ManagerPre<CallData>),
    V0_2(crate::contract_0_2::ManagerPre<CallData>),
    V0_1(crate::contract_0_1::ManagerPre<CallData>),
}

impl Pre {
    fn engine(&self) -> &Engine {
        match self {
            Pre::Current(pre) => pre.engine(),
            Pre::V0_2(pre) => pre.engine(),
            Pre::V0_1(pre) => pre.engine(),
        }
    }

    async fn instantiate(&self, store: &mut Store<CallData>) -> wasmtime::Result<Live> {
        Ok(match self {
            Pre::Current(pre) => Live::Current(pre.instantiate_async(store).await?),
            Pre::V0_2(pre) => Live::V0_2(pre.instantiate_async(store).await?),
            Pre::V0_1(pre) => Live::V0_1(pre.instantiate_async(store).await?),
        })
    }
}

/// An instance of a plugin in its store.
enum Live {
    Current(Manager),
    V0_2(crate::contract_0_2::Manager),
    V0_1(crate::contract_0_1::Manager),
}

impl Live {
    fn exports(&self) -> Exports<'_> {
        match self {
            Live::Current(instance) => Exports::Current(instance.capstan_plugin_guest()),
            Live::V0_2(instance) => Exports::V0_2(crate::contract_0_2::Exports(instance.capstan_plugin_guest())),
            Live::V0_1(instance) => Exports::V0_1(crate::contract_0_1::Exports(instance.capstan_plugin_guest())),
        }
    }
}

/// An instance kept after a read-only call (`limits.reuse-instances = "reads"`), for the next
/// read-only call of the same caller.
struct Kept {
    caller: Caller,
    store: Store<CallData>,
    live: Live,
    /// The clock offset its WASI context was built with (a changed offset needs a new one).
    clock_ahead: Duration,
    idle_since: Instant,
    calls: u32,
}

/// Idle instances one plugin version keeps, at most (the least recently used goes first).
const KEPT_INSTANCES: usize = 8;
/// An idle kept instance older than this is dropped instead of reused.
const KEPT_IDLE: Duration = Duration::from_secs(30);
/// Calls one kept instance serves before it is dropped (its heap never shrinks).
const KEPT_CALLS: u32 = 10_000;

/// The instances a sandbox keeps for reuse, by caller.
#[derive(Default)]
struct KeptInstances(std::sync::Mutex<Vec<Kept>>);

impl KeptInstances {
    /// An idle instance kept for `caller` with the clock offset `clock_ahead`; the expired are
    /// dropped on the way.
    fn take(&self, caller: &Caller, clock_ahead: Duration) -> Option<Kept> {
        let (found, expired) = {
            let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let expired: Vec<Kept> = kept.extract_if(.., |k| k.idle_since.elapsed() >= KEPT_IDLE || k.clock_ahead != clock_ahead).collect();
            let found = kept.iter().rposition(|k| same_caller(&k.caller, caller)).map(|i| kept.remove(i));
            (found, expired)
        };
        drop(expired); // a store's drop resets its slots: outside the lock
        found
    }

    /// Keep `instance` idle; beyond [`KEPT_INSTANCES`] the least recently used is dropped.
    fn put(&self, instance: Kept) {
        let evicted = {
            let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
            kept.push(instance);
            (kept.len() > KEPT_INSTANCES).then(|| kept.remove(0))
        };
        drop(evicted);
    }
}

/// Whether a call of `caller` may be served by a kept instance: an authenticated human or
/// machine (never an anonymous or host call).
fn reusable_for(caller: &Caller) -> bool {
    matches!(caller.kind, CallerKind::Human | CallerKind::Machine) && !caller.id.is_empty()
}

/// One caller for a kept instance: the same user, of the same kind, with the same roles.
fn same_caller(a: &Caller, b: &Caller) -> bool {
    a.kind == b.kind && a.id == b.id && a.roles == b.roles
}

/// An instance's exports, answering in the current contract's shapes whatever version the
/// plugin targets.
pub(crate) enum Exports<'a> {
    /// A plugin of the current contract.
    Current(&'a wit_guest::Guest),
    /// A `capstan:plugin@0.2.x` plugin, through its adapter.
    V0_2(crate::contract_0_2::Exports<'a>),
    /// A `capstan:plugin@0.1.0` plugin, through its adapter.
    V0_1(crate::contract_0_1::Exports<'a>),
}

type Answer<T> = wasmtime::Result<std::result::Result<T, WitRefusal>>;

impl Exports<'_> {
    async fn call_describe(&self, store: &mut Store<CallData>) -> wasmtime::Result<wit_guest::Descriptor> {
        match self {
            Exports::Current(guest) => guest.call_describe(store).await,
            Exports::V0_2(guest) => guest.describe(store).await,
            Exports::V0_1(guest) => guest.describe(store).await,
        }
    }

    #[allow(clippy::ptr_arg)] // the bindings take `&String`
    async fn call_handle(&self, store: &mut Store<CallData>, ctx: &CallContext, method: &String, body: &String) -> Answer<String> {
        match self {
            Exports::Current(guest) => guest.call_handle(store, ctx, method, body).await,
            Exports::V0_2(guest) => guest.handle(store, ctx, method, body).await,
            Exports::V0_1(guest) => guest.handle(store, ctx, method, body).await,
        }
    }

    async fn call_on_event(&self, store: &mut Store<CallData>, ctx: &CallContext, event: &wit_guest::Event) -> Answer<()> {
        match self {
            Exports::Current(guest) => guest.call_on_event(store, ctx, event).await,
            Exports::V0_2(guest) => guest.on_event(store, ctx, event).await,
            Exports::V0_1(guest) => guest.on_event(store, ctx, event).await,
        }
    }

    async fn call_reconcile(
        &self,
        store: &mut Store<CallData>,
        ctx: &CallContext,
        trigger: &wit_guest::ReconcileTrigger,
    ) -> Answer<wit_guest::ReconcileOutcome> {
        match self {
            Exports::Current(guest) => guest.call_reconcile(store, ctx, trigger).await,
            Exports::V0_2(guest) => guest.reconcile(store, ctx, trigger).await,
            Exports::V0_1(guest) => guest.reconcile(store, ctx, trigger).await,
        }
    }

    async fn call_run_task(&self, store: &mut Store<CallData>, ctx: &CallContext, name: &str) -> Answer<String> {
        match self {
            Exports::Current(guest) => guest.call_run_task(store, ctx, name).await,
            Exports::V0_2(guest) => guest.run_task(store, ctx, name).await,
            Exports::V0_1(guest) => guest.run_task(store, ctx, name).await,
        }
    }

    async fn call_migrate(&self, store: &mut Store<CallData>, ctx: &CallContext, from: Option<&str>, to: &str) -> Answer<()> {
        match self {
            Exports::Current(guest) => guest.call_migrate(store, ctx, from, to).await,
            Exports::V0_2(guest) => guest.migrate(store, ctx, from, to).await,
            Exports::V0_1(guest) => guest.migrate(store, ctx, from, to).await,
        }
    }
}

/// One plugin version ready to run: its component, its grants and its limits.
pub struct Sandbox {
    /// The plugin id.
    pub id: String,
    /// The plugin version, from its manifest.
    pub version: String,
    /// The capabilities the operator approved for this version.
    pub grants: Arc<BTreeSet<Capability>>,
    /// The imports the grants open, built once.
    grant: Arc<Grant>,
    /// No imports: what `describe` runs with.
    describe_grant: Arc<Grant>,
    prepared: Prepared,
    memory_limit: usize,
    /// How many instances may run at once (the manifest's concurrency).
    concurrency: usize,
    slots: Arc<tokio::sync::Semaphore>,
    services: Arc<super::imports::Services>,
    /// `limits.reuse-instances`, and the instances kept for it.
    reuse: InstanceReuse,
    kept: KeptInstances,
    metrics: CallMetrics,
    /// The HTTP status of each refusal code the plugin declared (set once it described itself).
    refusal_statuses: std::sync::OnceLock<std::collections::BTreeMap<String, u16>>,
}

/// What kind of call, for its deadline and its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// `describe`, at load: every import refused, with the method deadline.
    Describe,
    /// An API method (`handle`), with the method deadline.
    Method,
    /// An API method declared read-only: as [`CallKind::Method`], with every import that
    /// changes something refused.
    Read,
    /// One event delivered to `on-event`, with the method deadline.
    Event,
    /// A reconcile pass, with the pass deadline.
    Reconcile,
    /// A scheduled task (`run-task`), with the pass deadline.
    Task,
    /// A data migration at install or upgrade, with the pass deadline.
    Migrate,
}

/// A call's outcomes as `/metrics` labels.
const OUTCOMES: [&str; 6] = ["ok", "refused", "deadline", "exhausted", "trap", "busy"];

/// The `/metrics` handles of one plugin version's calls, each registered on its first use (the
/// registry's lookup by labels is otherwise paid on every call).
#[derive(Default)]
struct CallMetrics {
    calls: [[std::sync::OnceLock<metrics::Counter>; OUTCOMES.len()]; CallKind::LABELS],
    durations: [std::sync::OnceLock<metrics::Histogram>; CallKind::LABELS],
    memory: std::sync::OnceLock<metrics::Histogram>,
}

impl CallKind {
    /// How many labels kinds have.
    const LABELS: usize = 6;

    /// The position of the kind's label, for [`CallMetrics`].
    fn index(self) -> usize {
        match self {
            CallKind::Describe => 0,
            CallKind::Method | CallKind::Read => 1,
            CallKind::Event => 2,
            CallKind::Reconcile => 3,
            CallKind::Task => 4,
            CallKind::Migrate => 5,
        }
    }

    /// The kind as a `/metrics` label.
    pub fn label(self) -> &'static str {
        match self {
            CallKind::Describe => "describe",
            CallKind::Method | CallKind::Read => "method",
            CallKind::Event => "event",
            CallKind::Reconcile => "reconcile",
            CallKind::Task => "task",
            CallKind::Migrate => "migrate",
        }
    }

    fn deadline(self) -> Duration {
        match self {
            CallKind::Describe | CallKind::Method | CallKind::Read | CallKind::Event => METHOD_DEADLINE,
            CallKind::Reconcile | CallKind::Task | CallKind::Migrate => PASS_DEADLINE,
        }
    }
}

impl Sandbox {
    /// A sandbox for `manifest`'s plugin with the approved `grants`, its memory limit (capped at
    /// [`MAX_MEMORY_BYTES`]) and its concurrency from the manifest's limits.
    pub fn new(manifest: &Manifest, grants: BTreeSet<Capability>, prepared: Prepared, services: Arc<super::imports::Services>) -> Self {
        let memory_limit = (manifest.limits.memory_mib as usize).saturating_mul(1 << 20).min(MAX_MEMORY_BYTES);
        Sandbox {
            id: manifest.id.clone(),
            version: manifest.version.to_string(),
            grant: Arc::new(Grant::build(&services, &manifest.id, &grants)),
            describe_grant: Arc::new(Grant::none(&services, &manifest.id)),
            grants: Arc::new(grants),
            prepared,
            memory_limit,
            concurrency: manifest.limits.concurrency.max(1) as usize,
            slots: Arc::new(tokio::sync::Semaphore::new(manifest.limits.concurrency.max(1) as usize)),
            services,
            reuse: manifest.limits.reuse_instances,
            kept: KeptInstances::default(),
            metrics: CallMetrics::default(),
            refusal_statuses: Default::default(),
        }
    }

    /// Tell the `settings` import what `describe` declared.
    pub fn declare_settings(&self, settings: &[crate::faces::SettingDecl]) {
        let declared = settings.iter().map(|s| crate::imports::DeclaredSetting { key: s.key.clone(), default: s.default.clone() });
        self.grant.declare_settings(declared.collect());
    }

    /// Record the HTTP status of each refusal code the plugin declared (once; later calls keep
    /// the first): its refusals carry it to the API's answer.
    pub fn declare_refusals(&self, refusals: &[crate::faces::RefusalDecl]) {
        let _ = self.refusal_statuses.set(refusals.iter().map(|r| (r.code.clone(), r.status)).collect());
    }

    /// SHA-256 of the plugin's component bytes as lowercase hex.
    pub fn digest(&self) -> &str {
        &self.prepared.digest
    }

    /// The plugin's descriptor. Imports are refused during `describe`.
    pub async fn describe(&self) -> Result<wit_guest::Descriptor> {
        let ctx = self.context("describe", host_caller(), CallKind::Describe);
        self.run(CallKind::Describe, &ctx, |guest, store| Box::pin(async move { guest.call_describe(store).await.map(Ok) })).await
    }

    /// Serve one method for `identity` (the authenticated caller, whose authority the plugin's
    /// inventory writes act with; `None` for an anonymous caller of a public method, whose call
    /// writes nothing); the body (JSON text) already passed the method's schema.
    pub async fn handle(
        &self,
        request_id: &str,
        caller: Caller,
        identity: Option<Identity>,
        method: &str,
        read_only: bool,
        body: String,
    ) -> Result<capstan_rpc::Answer> {
        let kind = if read_only { CallKind::Read } else { CallKind::Method };
        let ctx = self.context(request_id, caller, kind);
        let method = method.to_string();
        let method_name = method.clone();
        let acting = identity.map_or(Acting::Anonymous, Acting::Caller);
        let out = self
            .run_as(acting, kind, &ctx, |guest, store| {
                let ctx = ctx.clone();
                Box::pin(async move { guest.call_handle(store, &ctx, &method, &body).await })
            })
            .await?;
        if out.len() > MAX_METHOD_OUTPUT {
            tracing::warn!(plugin = %self.id, method = %method_name, bytes = out.len(), "plugin method answered more than the host passes on");
            return Err(Refusal::new(
                "resource-exhausted",
                format!("plugin {} answered {} bytes; a method answers at most {MAX_METHOD_OUTPUT}", self.id, out.len()),
            )
            .with_data(json!({ "plugin": self.id, "budget": "method-output", "limit": MAX_METHOD_OUTPUT })));
        }
        // checked to be one JSON value, then passed on as the plugin wrote it
        capstan_rpc::Answer::text(out).map_err(|e| self.output_invalid(format!("the method answered invalid JSON: {e}")))
    }

    /// Deliver one event to the plugin's `on-event`, as the host; a refusal means redeliver later.
    pub async fn on_event(&self, event: &wit_guest::Event) -> Result<()> {
        let ctx = self.context(&format!("event-{}", event.sequence), host_caller(), CallKind::Event);
        self.run(CallKind::Event, &ctx, |guest, store| {
            let (ctx, event) = (ctx.clone(), event.clone());
            Box::pin(async move { guest.call_on_event(store, &ctx, &event).await })
        })
        .await
    }

    /// Run one reconcile pass, woken by `trigger` (the period or hints), as the host.
    pub async fn reconcile(&self, trigger: &wit_guest::ReconcileTrigger) -> Result<wit_guest::ReconcileOutcome> {
        let ctx = self.context(&format!("reconcile-{}", uuid::Uuid::new_v4().simple()), host_caller(), CallKind::Reconcile);
        self.run(CallKind::Reconcile, &ctx, |guest, store| {
            let (ctx, trigger) = (ctx.clone(), trigger.clone());
            Box::pin(async move { guest.call_reconcile(store, &ctx, &trigger).await })
        })
        .await
    }

    /// Run the scheduled task `name`, as the host; the text it returns is the execution's outcome.
    pub async fn run_task(&self, name: &str) -> Result<String> {
        let ctx = self.context(&format!("task-{}", uuid::Uuid::new_v4().simple()), host_caller(), CallKind::Task);
        let name = name.to_string();
        self.run(CallKind::Task, &ctx, |guest, store| {
            let ctx = ctx.clone();
            Box::pin(async move { guest.call_run_task(store, &ctx, &name).await })
        })
        .await
    }

    /// Bring the plugin's data from version `from` (none: a fresh install) to `to`, as the host.
    pub async fn migrate(&self, from: Option<&str>, to: &str) -> Result<()> {
        let ctx = self.context(&format!("migrate-{}", uuid::Uuid::new_v4().simple()), host_caller(), CallKind::Migrate);
        let (from, to) = (from.map(str::to_string), to.to_string());
        self.run(CallKind::Migrate, &ctx, |guest, store| {
            let ctx = ctx.clone();
            Box::pin(async move { guest.call_migrate(store, &ctx, from.as_deref(), &to).await })
        })
        .await
    }

    fn context(&self, request_id: &str, caller: Caller, kind: CallKind) -> CallContext {
        // in the plugin's clock (a test host may run it ahead), as `remaining()` reads it
        let deadline = std::time::SystemTime::now() + self.services.clock_ahead() + kind.deadline();
        CallContext {
            request_id: request_id.to_string(),
            caller,
            node_id: self.services.node_id.clone(),
            plugin_version: self.version.clone(),
            deadline_ms: deadline.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
        }
    }

    fn output_invalid(&self, message: String) -> Refusal {
        tracing::warn!(plugin = %self.id, version = %self.version, "{message}");
        Refusal::new("plugin-output-invalid", format!("plugin {} answered something that is not valid: {message}", self.id))
            .with_data(json!({ "plugin": self.id }))
    }

    /// Run one call in a fresh instance: wait for a slot, instantiate, call with the deadline,
    /// classify whatever happened, log what the plugin printed.
    async fn run<R, F>(&self, kind: CallKind, ctx: &CallContext, call: F) -> Result<R>
    where
        F: for<'a> FnOnce(&'a Exports<'a>, &'a mut Store<CallData>) -> futures::future::BoxFuture<'a, Answer<R>>,
    {
        self.run_as(Acting::Plugin, kind, ctx, call).await
    }

    async fn run_as<R, F>(&self, acting: Acting, kind: CallKind, ctx: &CallContext, call: F) -> Result<R>
    where
        F: for<'a> FnOnce(&'a Exports<'a>, &'a mut Store<CallData>) -> futures::future::BoxFuture<'a, Answer<R>>,
    {
        let deadline = kind.deadline();
        let _slot = match tokio::time::timeout(deadline, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            _ => {
                self.count_call(kind, "busy", None);
                return Err(Refusal::new("plugin-busy", format!("plugin {} has no free instance; try again", self.id))
                    .retryable()
                    .with_data(json!({ "plugin": self.id })));
            }
        };
        // the call's own time starts once it has an instance: waiting for one is bounded above
        let started = Instant::now();
        let clock_ahead = self.services.clock_ahead();
        let reuse =
            matches!((self.reuse, kind, &acting), (InstanceReuse::Reads, CallKind::Read, Acting::Caller(_))) && reusable_for(&ctx.caller);
        let kept = if reuse { self.kept.take(&ctx.caller, clock_ahead) } else { None };
        // the caller a kept instance is for: the one it was kept for (the same), or this call's
        let (mut store, live, calls, kept_for) = match kept {
            Some(kept) => (kept.store, Some(kept.live), kept.calls, Some(kept.caller)),
            None => {
                let grant = if kind == CallKind::Describe { self.describe_grant.clone() } else { self.grant.clone() };
                let data = CallData::new(grant, String::new(), clock_ahead, self.memory_limit, STDIO_CAPTURE);
                let mut store = Store::new(self.prepared.pre.engine(), data);
                store.limiter(|data| &mut data.limiter);
                (store, None, 0, None)
            }
        };
        let data = store.data_mut();
        data.begin_call(ctx.request_id.clone());
        data.acting = acting;
        data.read_only = kind == CallKind::Read;
        data.deadline = Some(started + deadline);
        let stop_at = started + deadline;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= stop_at {
                Ok(UpdateDeadline::Interrupt)
            } else {
                // Yield so one busy plugin never holds an executor thread.
                Ok(UpdateDeadline::Yield(1))
            }
        });
        let outcome = tokio::time::timeout(deadline + Duration::from_millis(250), async {
            let live = match live {
                Some(live) => live,
                None => self.prepared.pre.instantiate(&mut store).await?,
            };
            let answer = call(&live.exports(), &mut store).await;
            wasmtime::Result::Ok((live, answer))
        })
        .await;
        // the deadline or a trap (instantiating or calling) ends the instance here; the memory
        // limit and printing (stdio is captured per call) end it below
        let (outcome, live) = match outcome {
            Err(elapsed) => (Err(elapsed), None),
            Ok(Err(trap)) => (Ok(Err(trap)), None),
            Ok(Ok((live, answer))) => {
                let keep = answer.is_ok();
                (Ok(answer), keep.then_some(live))
            }
        };
        let data = store.data_mut();
        let printed = data.flush_stdio();
        let exhausted = data.limiter.exhausted;
        self.metrics
            .memory
            .get_or_init(|| metrics::histogram!("capstan_plugin_instance_memory_bytes", "plugin" => self.id.clone()))
            .record(data.limiter.grown() as f64);
        let elapsed = started.elapsed();
        let (result, counted) = match outcome {
            Err(_) => (Err(self.deadline_exceeded(kind, deadline)), "deadline"),
            Ok(Err(trap)) => {
                let refusal = self.classify_trap(kind, trap, exhausted, deadline);
                let counted = match refusal.code.as_ref() {
                    "plugin-deadline-exceeded" => "deadline",
                    "resource-exhausted" => "exhausted",
                    _ => "trap",
                };
                (Err(refusal), counted)
            }
            Ok(Ok(Err(refusal))) => (Err(self.plugin_refusal(refusal)), "refused"),
            Ok(Ok(Ok(value))) => (Ok(value), "ok"),
        };
        self.count_call(kind, counted, Some(elapsed));
        tracing::debug!(plugin = %self.id, kind = ?kind, request_id = %ctx.request_id, ms = elapsed.as_millis() as u64,
            ok = result.is_ok(), "plugin call");
        if let Some(live) = live.filter(|_| reuse && !exhausted && !printed && calls + 1 < KEPT_CALLS) {
            let caller = kept_for.unwrap_or_else(|| ctx.caller.clone());
            self.kept.put(Kept { caller, store, live, clock_ahead, idle_since: Instant::now(), calls: calls + 1 });
        }
        result
    }

    /// Instances running a call now, out of the manifest's concurrency (for `/metrics`).
    pub fn instances_in_use(&self) -> (usize, usize) {
        (self.concurrency.saturating_sub(self.slots.available_permits()), self.concurrency)
    }

    /// The memory one instance may grow to, in bytes.
    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// Count one call for `/metrics` by plugin (an installed plugin's id: a bounded set), kind
    /// and outcome (`ok`, `refused`, `deadline`, `exhausted`, `trap`, `busy`), with its time.
    fn count_call(&self, kind: CallKind, outcome: &'static str, elapsed: Option<Duration>) {
        let (k, label) = (kind.index(), kind.label());
        match OUTCOMES.iter().position(|known| *known == outcome) {
            Some(o) => self.metrics.calls[k][o]
                .get_or_init(
                    || metrics::counter!("capstan_plugin_calls_total", "plugin" => self.id.clone(), "kind" => label, "outcome" => outcome),
                )
                .increment(1),
            // an outcome missing from OUTCOMES is still counted under its own label, uncached
            None => metrics::counter!("capstan_plugin_calls_total", "plugin" => self.id.clone(), "kind" => label, "outcome" => outcome)
                .increment(1),
        }
        if let Some(elapsed) = elapsed {
            self.metrics.durations[k]
                .get_or_init(|| metrics::histogram!("capstan_plugin_call_duration_seconds", "plugin" => self.id.clone(), "kind" => label))
                .record(elapsed.as_secs_f64());
        }
    }

    fn deadline_exceeded(&self, kind: CallKind, deadline: Duration) -> Refusal {
        tracing::warn!(plugin = %self.id, kind = ?kind, "plugin call stopped at its deadline");
        Refusal::new("plugin-deadline-exceeded", format!("plugin {} did not finish within {} s", self.id, deadline.as_secs()))
            .with_data(json!({ "plugin": self.id, "deadlineMs": deadline.as_millis() as u64 }))
    }

    fn classify_trap(&self, kind: CallKind, trap: wasmtime::Error, exhausted: bool, deadline: Duration) -> Refusal {
        if trap.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt) {
            return self.deadline_exceeded(kind, deadline);
        }
        if exhausted {
            tracing::warn!(plugin = %self.id, kind = ?kind, "plugin call stopped at its memory limit");
            return Refusal::new(
                "plugin-resource-exhausted",
                format!("plugin {} needed more than its {} MiB of memory", self.id, self.memory_limit >> 20),
            )
            .with_data(json!({ "plugin": self.id, "memoryLimitBytes": self.memory_limit }));
        }
        let reason = trap.downcast_ref::<wasmtime::Trap>().map(|t| t.to_string()).unwrap_or_else(|| format!("{trap:#}"));
        tracing::warn!(plugin = %self.id, kind = ?kind, reason = %reason, "plugin call failed");
        Refusal::new("plugin-failed", format!("plugin {} failed: {}", self.id, first_line(&reason))).with_data(json!({ "plugin": self.id }))
    }

    /// A refusal the plugin returned, passed on when it is well formed.
    fn plugin_refusal(&self, refusal: WitRefusal) -> Refusal {
        if !valid_code(&refusal.code) {
            return self.output_invalid(format!("refusal code {:?} is not kebab-case", first_line(&refusal.code)));
        }
        let status = self.refusal_statuses.get().and_then(|declared| declared.get(&refusal.code).copied());
        let mut out = Refusal::new(refusal.code, truncate(&refusal.message, 1000));
        out.status = status;
        if refusal.retryable {
            out = out.retryable();
        }
        if let Some(data) = refusal.data {
            match serde_json::from_str::<Value>(&data) {
                Ok(data @ Value::Object(_)) => out = out.with_data(data),
                _ => return self.output_invalid("refusal data is not a JSON object".into()),
            }
        }
        out
    }
}

/// The caller of host-initiated calls (reconcile, events, tasks, migrations).
pub fn host_caller() -> Caller {
    Caller { kind: CallerKind::Host, id: "capstan".into(), roles: vec!["host".into()] }
}

pub use capstan_core::refusal::valid_code;

fn first_line(s: &str) -> String {
    truncate(s.lines().next().unwrap_or(""), 300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_compile_on_an_engine_of_their_own_whose_code_the_serving_engine_loads() {
        let runtime = Runtime::new(None).unwrap();
        let compiling = runtime.compiling_engine();
        assert!(!Engine::same(&compiling, &runtime.engine), "the compile's memory goes with an engine dropped after it");
        assert_eq!(engine_key(&compiling), runtime.engine_key);
        // the smallest component: its artifact loads on the serving engine
        let compiled = compiling.precompile_component(b"(component)").unwrap();
        // SAFETY: compiled just now by an engine of the same key.
        unsafe { Component::deserialize(&runtime.engine, &compiled) }.unwrap();
    }

    #[test]
    fn the_compiled_plugin_cache_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let shared = root.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(create_private_dir(&shared).unwrap_err().code, "state-dir-unusable");
        let linked = root.path().join("linked");
        std::os::unix::fs::symlink(root.path(), &linked).unwrap();
        assert_eq!(create_private_dir(&linked).unwrap_err().code, "state-dir-unusable");
        let fresh = root.path().join("fresh").join("cache");
        create_private_dir(&fresh).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o700);

        let artifact = fresh.join("a.cwasm");
        std::fs::write(&artifact, b"x").unwrap();
        std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(trusted_artifact(&artifact));
        std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!trusted_artifact(&artifact), "others could have written it");
        let link = fresh.join("b.cwasm");
        std::os::unix::fs::symlink(&artifact, &link).unwrap();
        assert!(!trusted_artifact(&link), "a link is not followed");
    }

    #[test]
    fn refusal_codes_are_kebab_case() {
        assert!(valid_code("conflict"));
        assert!(valid_code("mail-domain-unverified"));
        assert!(valid_code("http2-failed"));
        assert!(!valid_code(""));
        assert!(!valid_code("Conflict"));
        assert!(!valid_code("a--b"));
        assert!(!valid_code("-a"));
        assert!(!valid_code("a_b"));
    }

    #[test]
    fn the_reported_engine_version_is_the_locked_one() {
        let lock = include_str!("../../../Cargo.lock");
        let entry = format!("name = \"wasmtime\"\nversion = \"{}\"", Runtime::engine_version());
        assert!(lock.contains(&entry), "update capstan_core::build::PLUGIN_ENGINE to the version in Cargo.lock");
    }
}
