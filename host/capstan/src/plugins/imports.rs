//! The host side of the WIT imports. Every function checks the plugin's grant first and
//! answers `capability-denied` (logged) outside it; nothing a plugin passes can trap the host.
//! A plugin sees only its own collections (`p_<id>__<name>`) and its own blob prefix
//! (`plugins/<id>/`).

use super::manifest::Capability;
use super::runtime::capstan::plugin::{agents, blobs, events, http, inventory, log, secrets, sign, store, types};
use crate::blobs::{Blobs, PutMode};
use crate::keyring::Keyring;
use crate::keyring::seal::{Context as SealContext, Sealed};
use crate::refusal::Refusal;
use crate::store::{CollectionSpec, Store};
use base64::Engine as _;
use capstan_core::text::truncate;
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

type WitResult<T> = std::result::Result<T, types::Refusal>;

/// Largest document a plugin may write.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// Largest blob a plugin may write through one writer.
pub const MAX_PLUGIN_BLOB_BYTES: usize = 64 << 20;
/// Largest chunk one `read` returns.
const MAX_CHUNK: u32 = 1 << 20;
/// Largest HTTP response body a plugin receives.
const MAX_HTTP_BODY: usize = 16 << 20;

/// What the imports reach: shared by every call of every plugin.
pub struct Services {
    pub store: Store,
    pub blobs: Blobs,
    pub keyring: Arc<Keyring>,
    pub node_id: String,
    /// Plugins' outbound HTTP (`http.fetch`): see [`plugin_http_client`].
    pub http: reqwest::Client,
    /// Declared collections per plugin id (the names the plugin uses).
    pub collections: RwLock<HashMap<String, BTreeSet<String>>>,
    /// How far ahead of the system clock plugins see the wall clock, in milliseconds: always 0
    /// on a serving host; the in-process test host moves it to show a plugin time passing.
    clock_ahead_ms: AtomicU64,
}

/// The client plugins' outbound HTTP goes through: no redirects followed, TLS verified against
/// the platform's roots and `extra_roots` (`CAPSTAN_PLUGIN_HTTP_CA_FILE`, for a private CA).
pub fn plugin_http_client(extra_roots: &[reqwest::Certificate]) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("capstan/", env!("CARGO_PKG_VERSION")))
        .tls_certs_merge(extra_roots.iter().cloned())
        .build()
}

impl Services {
    /// Services whose outbound HTTP trusts the platform's roots only.
    pub fn new(store: Store, blobs: Blobs, keyring: Arc<Keyring>, node_id: String) -> Arc<Self> {
        let http = plugin_http_client(&[]).expect("an HTTP client with default TLS roots");
        Self::with_http(store, blobs, keyring, node_id, http)
    }

    /// Services whose outbound HTTP goes through `http` (from [`plugin_http_client`]).
    pub fn with_http(store: Store, blobs: Blobs, keyring: Arc<Keyring>, node_id: String, http: reqwest::Client) -> Arc<Self> {
        Arc::new(Services { store, blobs, keyring, node_id, http, collections: Default::default(), clock_ahead_ms: AtomicU64::new(0) })
    }

    /// Move the wall clock plugins see `by` ahead (the host's own clock is untouched). For the
    /// in-process test host only.
    pub fn advance_plugin_clock(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let _ = self.clock_ahead_ms.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |ahead| Some(ahead.saturating_add(by)));
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

/// The store collection behind a plugin's collection.
pub fn collection_name(plugin: &str, name: &str) -> String {
    format!("p_{}__{}", plugin.replace('-', "_"), name)
}

/// Plugin collection names: `[a-z][a-z0-9]{0,19}` (no `_`, so the host name splits uniquely).
pub fn validate_plugin_collection(name: &str) -> crate::refusal::Result<()> {
    let ok = (1..=20).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Refusal::new("invalid-collection", format!("plugin collection {name:?} must match [a-z][a-z0-9]{{0,19}}")))
    }
}

/// The blob prefix of a plugin.
pub fn blob_prefix(plugin: &str) -> String {
    format!("plugins/{plugin}/")
}

/// A linear-memory limit that remembers it was hit, so a failed call can say why.
pub struct MemoryLimiter {
    limit: usize,
    pub exhausted: bool,
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.exhausted = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// The state of one call's instance.
pub struct CallData {
    services: Arc<Services>,
    plugin: String,
    request_id: String,
    grants: Arc<BTreeSet<Capability>>,
    /// `describe` runs before anything is granted: every import is refused.
    describing: bool,
    wasi: WasiCtx,
    table: ResourceTable,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    pub limiter: MemoryLimiter,
    /// The caller a method call acts for; `None` outside a method call.
    pub acting: Option<crate::auth::Identity>,
}

impl CallData {
    pub fn new(
        services: Arc<Services>,
        plugin: String,
        request_id: String,
        grants: Arc<BTreeSet<Capability>>,
        memory_limit: usize,
        describing: bool,
        stdio_capture: usize,
    ) -> Self {
        let stdout = MemoryOutputPipe::new(stdio_capture);
        let stderr = MemoryOutputPipe::new(stdio_capture);
        // No filesystem, environment, arguments or network: only clocks, random and stdio.
        let mut wasi = WasiCtx::builder();
        wasi.stdout(stdout.clone()).stderr(stderr.clone()).allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
        let ahead = services.clock_ahead_ms.load(Ordering::SeqCst);
        if ahead > 0 {
            wasi.wall_clock(AheadClock(Duration::from_millis(ahead)));
        }
        let wasi = wasi.build();
        CallData {
            services,
            plugin,
            request_id,
            grants,
            describing,
            wasi,
            table: ResourceTable::new(),
            stdout,
            stderr,
            limiter: MemoryLimiter { limit: memory_limit, exhausted: false },
            acting: None,
        }
    }

    /// Who an inventory write acts as: the caller of the current method, or else the plugin
    /// itself with the authority the operator approved for it.
    fn actor(&self) -> crate::auth::Identity {
        self.acting.clone().unwrap_or_else(|| crate::inventory::access::plugin_identity(&self.plugin))
    }

    /// Log what the plugin printed, a line per log record, under its id.
    pub fn flush_stdio(&self, plugin: &str, request_id: &str) {
        for (stream, pipe) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let bytes = pipe.contents();
            for line in String::from_utf8_lossy(&bytes).lines().filter(|l| !l.trim().is_empty()) {
                tracing::info!(plugin = %plugin, request_id = %request_id, stream, "{}", truncate(line, 2000));
            }
        }
    }

    /// Refuse unless `capability` was granted.
    fn require(&self, capability: &Capability) -> WitResult<()> {
        if !self.describing && self.grants.contains(capability) {
            return Ok(());
        }
        tracing::warn!(plugin = %self.plugin, request_id = %self.request_id, capability = %capability,
            "plugin called an import it was not granted");
        let message = if self.describing {
            "describe must not use host imports".to_string()
        } else {
            format!("plugin {} was not granted {capability}", self.plugin)
        };
        Err(refusal("capability-denied", message, json!({ "capability": capability.to_string() })))
    }

    /// Outbound HTTP to `origin`: granted by name (`http:<origin>`), or because a setting the
    /// plugin was granted (`http-setting:<key>`) lists a URL of that origin right now.
    async fn require_http(&mut self, origin: &str) -> WitResult<()> {
        let by_name = Capability::Http(origin.to_string());
        if self.describing || self.grants.contains(&by_name) {
            return self.require(&by_name);
        }
        let keys: Vec<String> =
            self.grants.iter().filter_map(|g| if let Capability::HttpSetting(key) = g { Some(key.clone()) } else { None }).collect();
        for key in keys {
            let listed = crate::inventory::settings::urls(&self.services.store, &key).await.map_err(to_wit)?;
            if listed.iter().filter_map(|u| reqwest::Url::parse(u).ok()).any(|u| origin_of(&u).as_deref() == Some(origin)) {
                return Ok(());
            }
        }
        self.require(&by_name)
    }

    fn collection(&self, name: &str) -> WitResult<String> {
        self.require(&Capability::Store)?;
        let declared = self.services.collections.read().expect("collections lock").get(&self.plugin).is_some_and(|c| c.contains(name));
        if !declared {
            return Err(refusal(
                "collection-undeclared",
                format!("collection {name:?} is not among those the plugin's describe declares"),
                json!({ "collection": truncate(name, 64) }),
            ));
        }
        Ok(collection_name(&self.plugin, name))
    }

    fn blob_key(&self, key: &str) -> WitResult<String> {
        self.require(&Capability::Blobs)?;
        let full = format!("{}{key}", blob_prefix(&self.plugin));
        crate::blobs::validate_key(&full).map_err(to_wit)?;
        Ok(full)
    }
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

impl types::Host for CallData {}

fn wit_document(d: crate::store::Document) -> store::Document {
    store::Document { id: d.id, revision: d.revision, data: d.data.to_string() }
}

fn wit_page(p: crate::store::Page) -> store::Page {
    store::Page { documents: p.documents.into_iter().map(wit_document).collect(), next_cursor: p.next_cursor }
}

impl store::Host for CallData {
    async fn get(&mut self, collection: String, id: String) -> WitResult<Option<store::Document>> {
        let name = self.collection(&collection)?;
        let doc = self.services.store.transact(|tx| {
            let (name, id) = (name.clone(), id.clone());
            async move { tx.get(&name, &id).await }
        });
        doc.await.map(|d| d.map(wit_document)).map_err(to_wit)
    }

    async fn find(
        &mut self,
        collection: String,
        index: String,
        key: Vec<String>,
        cursor: Option<String>,
        limit: u32,
    ) -> WitResult<store::Page> {
        let name = self.collection(&collection)?;
        let key: Vec<Value> = key
            .iter()
            .map(|k| serde_json::from_str(k).map_err(|e| refusal("invalid-request", format!("index key is not JSON: {e}"), json!({}))))
            .collect::<WitResult<_>>()?;
        let page = self.services.store.transact(|tx| {
            let (name, index, key, cursor) = (name.clone(), index.clone(), key.clone(), cursor.clone());
            async move { tx.find(&name, &index, &key, cursor.as_deref(), limit as usize).await }
        });
        page.await.map(wit_page).map_err(to_wit)
    }

    async fn scan(&mut self, collection: String, cursor: Option<String>, limit: u32) -> WitResult<store::Page> {
        let name = self.collection(&collection)?;
        let page = self.services.store.transact(|tx| {
            let (name, cursor) = (name.clone(), cursor.clone());
            async move { tx.scan(&name, cursor.as_deref(), limit as usize).await }
        });
        page.await.map(wit_page).map_err(to_wit)
    }

    async fn commit(&mut self, expectations: Vec<store::Expectation>, writes: Vec<store::Write>) -> WitResult<Vec<store::Document>> {
        enum Op {
            Insert(Value),
            Replace(u64, Value),
            Delete(u64),
        }
        let mut checks = Vec::with_capacity(expectations.len());
        for e in expectations {
            checks.push((self.collection(&e.collection)?, e.id, e.revision));
        }
        let mut ops = Vec::with_capacity(writes.len());
        for w in writes {
            let name = self.collection(&w.collection)?;
            let op = match w.op {
                store::WriteOp::Insert(data) => Op::Insert(parse_object(&data, "document data")?),
                store::WriteOp::Replace(r) => Op::Replace(r.expected_revision, parse_object(&r.data, "document data")?),
                store::WriteOp::Delete(revision) => Op::Delete(revision),
            };
            ops.push((name, w.id, op));
        }
        let (checks, ops) = (Arc::new(checks), Arc::new(ops));
        let written = self.services.store.transact(|tx| {
            let (checks, ops) = (checks.clone(), ops.clone());
            async move {
                for (name, id, expected) in checks.iter() {
                    let actual = tx.get(name, id).await?.map(|d| d.revision);
                    if actual != *expected {
                        return Err(Refusal::new("conflict", format!("document {id:?} is no longer at the expected revision"))
                            .with_data(json!({ "id": id, "expected": expected, "actual": actual })));
                    }
                }
                let mut out = Vec::with_capacity(ops.len());
                for (name, id, op) in ops.iter() {
                    out.push(match op {
                        Op::Insert(data) => tx.insert(name, id, data.clone()).await?,
                        Op::Replace(revision, data) => tx.replace(name, id, *revision, data.clone()).await?,
                        Op::Delete(revision) => {
                            tx.delete(name, id, *revision).await?;
                            crate::store::Document { id: id.clone(), revision: *revision, data: json!({}) }
                        }
                    });
                }
                Ok(out)
            }
        });
        written.await.map(|docs| docs.into_iter().map(wit_document).collect()).map_err(to_wit)
    }
}

impl inventory::Host for CallData {
    async fn get(&mut self, kind: inventory::EntityKind, id: String) -> WitResult<Option<inventory::Entity>> {
        self.require(&Capability::InventoryRead)?;
        if kind == inventory::EntityKind::Node {
            let nodes = crate::fleet::read_nodes(&self.services.blobs).await.map_err(to_wit)?;
            return Ok(nodes.into_iter().find(|n| n.node_id == id).map(node_entity));
        }
        let collection = inventory_collection(kind);
        let doc = self.services.store.transact(|tx| {
            let id = id.clone();
            async move { if tx.is_declared(collection) { tx.get(collection, &id).await } else { Ok(None) } }
        });
        Ok(doc.await.map_err(to_wit)?.map(|d| entity(kind, d)))
    }

    async fn list(&mut self, kind: inventory::EntityKind, cursor: Option<String>, limit: u32) -> WitResult<inventory::EntityPage> {
        self.require(&Capability::InventoryRead)?;
        if kind == inventory::EntityKind::Node {
            let nodes = crate::fleet::read_nodes(&self.services.blobs).await.map_err(to_wit)?;
            let after: Vec<_> = nodes.into_iter().filter(|n| cursor.as_deref().is_none_or(|c| n.node_id.as_str() > c)).collect();
            let limit = (limit as usize).clamp(1, 500);
            let next_cursor = (after.len() > limit).then(|| after[limit - 1].node_id.clone());
            return Ok(inventory::EntityPage { entities: after.into_iter().take(limit).map(node_entity).collect(), next_cursor });
        }
        let collection = inventory_collection(kind);
        let page = self.services.store.transact(|tx| {
            let cursor = cursor.clone();
            async move {
                if tx.is_declared(collection) {
                    tx.scan(collection, cursor.as_deref(), limit as usize).await
                } else {
                    Ok(crate::store::Page { documents: vec![], next_cursor: None })
                }
            }
        });
        let page = page.await.map_err(to_wit)?;
        Ok(inventory::EntityPage { entities: page.documents.into_iter().map(|d| entity(kind, d)).collect(), next_cursor: page.next_cursor })
    }

    async fn settings(&mut self) -> WitResult<inventory::Entity> {
        self.require(&Capability::InventoryRead)?;
        let doc = self
            .services
            .store
            .transact(|tx| async move { if tx.is_declared("settings") { tx.get("settings", "public").await } else { Ok(None) } });
        let doc = doc.await.map_err(to_wit)?;
        Ok(match doc {
            Some(d) => entity(inventory::EntityKind::Organization, d),
            None => inventory::Entity { kind: inventory::EntityKind::Organization, id: "public".into(), revision: 0, data: "{}".into() },
        })
    }

    async fn create_service(&mut self, body: String) -> WitResult<inventory::Entity> {
        self.require(&Capability::InventoryWriteServices)?;
        let input = crate::api::methods::decode(parse_object(&body, "the service")?).map_err(to_wit)?;
        let created = crate::inventory::services::create(&self.services.store, &self.actor(), input).await.map_err(to_wit)?;
        service_entity(created)
    }

    async fn update_service(&mut self, body: String) -> WitResult<inventory::Entity> {
        self.require(&Capability::InventoryWriteServices)?;
        let input = crate::api::methods::decode(parse_object(&body, "the service")?).map_err(to_wit)?;
        let updated = crate::inventory::services::update(&self.services.store, &self.actor(), input).await.map_err(to_wit)?;
        service_entity(updated)
    }

    async fn hold_service(&mut self, service_id: String) -> WitResult<()> {
        self.require(&Capability::InventoryWriteServices)?;
        crate::inventory::services::hold(&self.services.store, &service_id, &format!("plugin:{}", self.plugin)).await.map_err(to_wit)
    }

    async fn release_service(&mut self, service_id: String) -> WitResult<()> {
        self.require(&Capability::InventoryWriteServices)?;
        crate::inventory::services::release(
            &self.services.store,
            &crate::api::dependents::HostDependents,
            &service_id,
            &format!("plugin:{}", self.plugin),
        )
        .await
        .map_err(to_wit)
    }
}

fn service_entity(service: crate::inventory::Entity<crate::inventory::services::Service>) -> WitResult<inventory::Entity> {
    let data = serde_json::to_string(&service.data).map_err(|e| to_wit(Refusal::internal(e)))?;
    Ok(inventory::Entity { kind: inventory::EntityKind::Service, id: service.id, revision: service.revision, data })
}

fn inventory_collection(kind: inventory::EntityKind) -> &'static str {
    match kind {
        inventory::EntityKind::Organization => "organizations",
        inventory::EntityKind::Cluster => "clusters",
        inventory::EntityKind::Service => "services",
        inventory::EntityKind::Node => "nodes",
    }
}

fn entity(kind: inventory::EntityKind, d: crate::store::Document) -> inventory::Entity {
    inventory::Entity { kind, id: d.id, revision: d.revision, data: d.data.to_string() }
}

fn node_entity(n: crate::fleet::NodeRecord) -> inventory::Entity {
    let data = serde_json::to_string(&n).unwrap_or_else(|_| "{}".into());
    inventory::Entity { kind: inventory::EntityKind::Node, id: n.node_id, revision: 0, data }
}

impl secrets::Host for CallData {
    async fn ensure(&mut self, scope: String, _: secrets::Owner, _: String, _: secrets::Generate) -> WitResult<secrets::SecretInfo> {
        self.require(&Capability::Secrets(scope))?;
        Err(secrets_unavailable())
    }

    async fn rotate(&mut self, scope: String, _: String) -> WitResult<secrets::SecretInfo> {
        self.require(&Capability::Secrets(scope))?;
        Err(secrets_unavailable())
    }

    async fn revoke(&mut self, scope: String, _: String) -> WitResult<secrets::SecretInfo> {
        self.require(&Capability::Secrets(scope))?;
        Err(secrets_unavailable())
    }

    async fn list(&mut self, scope: String) -> WitResult<Vec<secrets::SecretInfo>> {
        self.require(&Capability::Secrets(scope))?;
        Err(secrets_unavailable())
    }

    async fn reveal(&mut self, scope: String, _: String) -> WitResult<Vec<u8>> {
        self.require(&Capability::SecretsReveal(scope))?;
        Err(secrets_unavailable())
    }
}

/// Secrets arrive with the secrets subsystem; until then they are refused by name.
fn secrets_unavailable() -> types::Refusal {
    refusal("secrets-unavailable", "this host does not manage secrets yet".into(), json!({}))
}

/// A blob being read by a plugin.
pub struct BlobReaderState(crate::blobs::BlobReader);

/// A blob being written by a plugin: buffered up to the limit, stored on `finish`.
pub struct BlobWriterState {
    key: String,
    mode: PutMode,
    buffer: Vec<u8>,
    finished: bool,
}

fn blob_info(meta: crate::blobs::BlobMeta, prefix: &str) -> blobs::BlobInfo {
    blobs::BlobInfo { key: meta.key.strip_prefix(prefix).unwrap_or(&meta.key).to_string(), size: meta.size, etag: meta.etag }
}

fn table_error(e: wasmtime::component::ResourceTableError) -> types::Refusal {
    refusal("invalid-request", format!("unknown blob handle: {e}"), json!({}))
}

impl blobs::HostBlobReader for CallData {
    async fn read(&mut self, reader: Resource<BlobReaderState>, max: u32) -> WitResult<Vec<u8>> {
        let state = self.table.get_mut(&reader).map_err(table_error)?;
        let mut buf = vec![0u8; max.clamp(1, MAX_CHUNK) as usize];
        let n =
            state.0.read(&mut buf).await.map_err(|e| refusal("blobs-unavailable", format!("reading the blob failed: {e}"), json!({})))?;
        buf.truncate(n);
        Ok(buf)
    }

    async fn drop(&mut self, reader: Resource<BlobReaderState>) -> wasmtime::Result<()> {
        self.table.delete(reader)?;
        Ok(())
    }
}

impl blobs::HostBlobWriter for CallData {
    async fn new(&mut self, key: String, mode: blobs::PutMode) -> Resource<BlobWriterState> {
        // A key refused here is reported by `write`/`finish`, which can answer a refusal.
        let key = self.blob_key(&key).unwrap_or_default();
        let mode = match mode {
            blobs::PutMode::Overwrite => PutMode::Overwrite,
            blobs::PutMode::CreateOnly => PutMode::CreateOnly,
            blobs::PutMode::IfMatch(etag) => PutMode::IfMatch(etag),
        };
        let state = BlobWriterState { key, mode, buffer: Vec::new(), finished: false };
        self.table.push(state).expect("resource table has room")
    }

    async fn write(&mut self, writer: Resource<BlobWriterState>, chunk: Vec<u8>) -> WitResult<()> {
        let state = self.table.get_mut(&writer).map_err(table_error)?;
        if state.key.is_empty() {
            return Err(refusal("invalid-key", "the blob key was refused (or blobs were not granted)".into(), json!({})));
        }
        if state.finished {
            return Err(refusal("invalid-request", "the blob writer was already finished".into(), json!({})));
        }
        if state.buffer.len() + chunk.len() > MAX_PLUGIN_BLOB_BYTES {
            return Err(refusal("blob-too-large", format!("a plugin blob is at most {MAX_PLUGIN_BLOB_BYTES} bytes"), json!({})));
        }
        state.buffer.extend_from_slice(&chunk);
        Ok(())
    }

    async fn finish(&mut self, writer: Resource<BlobWriterState>) -> WitResult<blobs::BlobInfo> {
        let prefix = blob_prefix(&self.plugin);
        let state = self.table.get_mut(&writer).map_err(table_error)?;
        if state.key.is_empty() {
            return Err(refusal("invalid-key", "the blob key was refused (or blobs were not granted)".into(), json!({})));
        }
        if state.finished {
            return Err(refusal("invalid-request", "the blob writer was already finished".into(), json!({})));
        }
        state.finished = true;
        let (key, mode, bytes) = (state.key.clone(), state.mode.clone(), std::mem::take(&mut state.buffer));
        let meta = self.services.blobs.put_bytes(&key, bytes, mode).await.map_err(to_wit)?;
        Ok(blob_info(meta, &prefix))
    }

    async fn drop(&mut self, writer: Resource<BlobWriterState>) -> wasmtime::Result<()> {
        self.table.delete(writer)?;
        Ok(())
    }
}

impl blobs::Host for CallData {
    async fn open(&mut self, key: String) -> WitResult<Option<(blobs::BlobInfo, Resource<BlobReaderState>)>> {
        let full = self.blob_key(&key)?;
        let Some((meta, reader)) = self.services.blobs.get(&full).await.map_err(to_wit)? else {
            return Ok(None);
        };
        let handle = self.table.push(BlobReaderState(reader)).map_err(table_error)?;
        Ok(Some((blob_info(meta, &blob_prefix(&self.plugin)), handle)))
    }

    async fn head(&mut self, key: String) -> WitResult<Option<blobs::BlobInfo>> {
        let full = self.blob_key(&key)?;
        let meta = self.services.blobs.head(&full).await.map_err(to_wit)?;
        Ok(meta.map(|m| blob_info(m, &blob_prefix(&self.plugin))))
    }

    async fn list(&mut self, prefix: String, cursor: Option<String>, limit: u32) -> WitResult<blobs::BlobPage> {
        self.require(&Capability::Blobs)?;
        let own = blob_prefix(&self.plugin);
        let full_prefix = format!("{own}{prefix}");
        let full_cursor = cursor.map(|c| format!("{own}{c}"));
        let page = self.services.blobs.list(&full_prefix, full_cursor.as_deref(), (limit as usize).clamp(1, 1000)).await.map_err(to_wit)?;
        Ok(blobs::BlobPage {
            items: page.items.into_iter().map(|m| blob_info(m, &own)).collect(),
            next_cursor: page.next_cursor.map(|c| c.strip_prefix(&own).unwrap_or(&c).to_string()),
        })
    }

    async fn delete(&mut self, key: String) -> WitResult<bool> {
        let full = self.blob_key(&key)?;
        self.services.blobs.delete(&full).await.map_err(to_wit)
    }
}

/// `scheme://host[:port]` of a URL, the port only when it is not the scheme's default.
pub fn origin_of(url: &reqwest::Url) -> Option<String> {
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{}://{}:{port}", url.scheme(), host.to_ascii_lowercase()),
        None => format!("{}://{}", url.scheme(), host.to_ascii_lowercase()),
    })
}

impl http::Host for CallData {
    async fn fetch(&mut self, request: http::Request) -> WitResult<http::Response> {
        let url =
            reqwest::Url::parse(&request.url).map_err(|e| refusal("invalid-request", format!("not an absolute URL: {e}"), json!({})))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refusal("invalid-request", "only http and https URLs can be fetched".into(), json!({})));
        }
        let origin = origin_of(&url).ok_or_else(|| refusal("invalid-request", "the URL has no host".into(), json!({})))?;
        self.require_http(&origin).await?;
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .ok()
            .filter(|m| ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"].contains(&m.as_str()))
            .ok_or_else(|| refusal("invalid-request", format!("HTTP method {:?} is not allowed", request.method), json!({})))?;
        let timeout = std::time::Duration::from_millis(request.timeout_ms.unwrap_or(5_000).min(30_000) as u64);
        let mut builder = self.services.http.request(method, url).timeout(timeout);
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        if let Some(body) = request.body {
            builder = builder.body(body);
        }
        let response = builder.send().await.map_err(|e| send_refusal(&e, &origin))?;
        let status = response.status().as_u16();
        let headers =
            response.headers().iter().filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string()))).collect();
        let mut body = Vec::new();
        let mut stream = response;
        while let Some(chunk) = stream.chunk().await.map_err(|e| {
            refusal("http-failed", format!("reading the response from {origin} failed: {}", without_url(&e)), json!({})).retryable_wit()
        })? {
            if body.len() + chunk.len() > MAX_HTTP_BODY {
                return Err(refusal("http-body-too-large", format!("the response is larger than {MAX_HTTP_BODY} bytes"), json!({})));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(http::Response { status, headers, body })
    }
}

/// Why a request was not answered, as the plugin is told: `http-timeout`, `http-tls-failed`
/// (the TLS cause named in `data.cause`, e.g. `certificate-unknown-issuer`) or `http-failed`.
fn send_refusal(e: &reqwest::Error, origin: &str) -> types::Refusal {
    if e.is_timeout() {
        return refusal("http-timeout", format!("fetching {origin} failed: {}", without_url(e)), json!({ "origin": origin }))
            .retryable_wit();
    }
    if let Some(tls) = tls_error(e) {
        let cause = tls_cause(tls);
        let hint = if cause == "certificate-unknown-issuer" {
            "; its issuer is not among the roots trusted here (a private CA is added with CAPSTAN_PLUGIN_HTTP_CA_FILE)"
        } else {
            ""
        };
        let refused = refusal(
            "http-tls-failed",
            format!("fetching {origin} failed: TLS {cause}: {tls}{hint}"),
            json!({ "origin": origin, "cause": cause }),
        );
        // a certificate this host refuses stays refused until someone changes it or the trust
        return if cause.starts_with("certificate-") { refused } else { refused.retryable_wit() };
    }
    refusal("http-failed", format!("fetching {origin} failed: {}", without_url(e)), json!({ "origin": origin })).retryable_wit()
}

/// The TLS error somewhere in `e`'s chain of causes. (An `io::Error` wrapping one hides it from
/// `source()`, so it is opened by hand.)
fn tls_error<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    let mut next = Some(e);
    for _ in 0..16 {
        let current = next?;
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = current.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            next = Some(inner);
            continue;
        }
        next = current.source();
    }
    None
}

/// A stable kebab-case name for a TLS failure.
fn tls_cause(e: &rustls::Error) -> &'static str {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "certificate-unknown-issuer",
            C::Expired | C::ExpiredContext { .. } => "certificate-expired",
            C::NotValidYet | C::NotValidYetContext { .. } => "certificate-not-yet-valid",
            C::NotValidForName | C::NotValidForNameContext { .. } => "certificate-name-mismatch",
            C::Revoked => "certificate-revoked",
            C::BadSignature => "certificate-bad-signature",
            _ => "certificate-invalid",
        },
        rustls::Error::AlertReceived(_) => "alert-received",
        rustls::Error::NoCertificatesPresented => "certificate-missing",
        _ => "handshake-failed",
    }
}

/// A reqwest error without its URL (a query string may carry a token).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "<url>");
    }
    text
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

impl agents::Host for CallData {
    async fn call(&mut self, cluster_id: String, _method: String, _body: String) -> WitResult<String> {
        self.require(&Capability::Agents)?;
        // No agent transport is connected to this host yet.
        Err(refusal(
            "agent-not-connected",
            format!("no agent of cluster {:?} is connected", truncate(&cluster_id, 64)),
            json!({ "clusterId": truncate(&cluster_id, 64) }),
        )
        .retryable_wit())
    }
}

impl events::Host for CallData {
    async fn publish(&mut self, kind: String, subject: String, data: String) -> WitResult<()> {
        self.require(&Capability::EventsPublish)?;
        let own = format!("{}.", self.plugin);
        if !kind.starts_with(&own) || kind.len() > 128 || !kind[own.len()..].chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(refusal(
                "invalid-request",
                format!("event kinds of this plugin are {own}<name> (letters and digits)"),
                json!({ "kind": truncate(&kind, 128) }),
            ));
        }
        if subject.is_empty() || subject.len() > 256 {
            return Err(refusal("invalid-request", "an event subject is 1 to 256 bytes".into(), json!({})));
        }
        let data = parse_object(&data, "event data")?;
        let source = format!("plugin:{}", self.plugin);
        let appended = self.services.store.transact(|tx| {
            let (kind, subject, data, source) = (kind.clone(), subject.clone(), data.clone(), source.clone());
            async move { crate::events::append(&tx, &kind, &subject, data, &source).await }
        });
        appended.await.map(drop).map_err(to_wit)
    }
}

/// The stored form of a plugin's signing key.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredKey {
    public_key: String,
    sealed: Sealed,
}

pub const PLUGIN_KEYS: &str = "plugin_keys";

/// The plugin's signing key `name`, created (and sealed under the keyring) on first use.
async fn signing_key(services: Arc<Services>, plugin: String, name: String) -> WitResult<ed25519_dalek::SigningKey> {
    {
        let valid = (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(refusal("invalid-request", "a key name is 1 to 64 of [A-Za-z0-9_-]".into(), json!({})));
        }
        let id = format!("{plugin}/{name}");
        let context = SealContext::new("plugin-signing-key").with("plugin", &plugin).with("key", &name);
        let keyring = services.keyring.clone();
        let loaded = services.store.transact(|tx| {
            let (id, context, keyring) = (id.clone(), context.clone(), keyring.clone());
            async move {
                if let Some(doc) = tx.get(PLUGIN_KEYS, &id).await? {
                    let stored: StoredKey = serde_json::from_value(doc.data).map_err(Refusal::internal)?;
                    let secret = keyring.open(&context, &stored.sealed)?;
                    let bytes: [u8; 32] =
                        secret.as_slice().try_into().map_err(|_| Refusal::internal("stored signing key is not 32 bytes"))?;
                    return Ok(ed25519_dalek::SigningKey::from_bytes(&bytes));
                }
                let key = ed25519_dalek::SigningKey::from_bytes(&rand::random());
                let stored = StoredKey {
                    public_key: base64::engine::general_purpose::STANDARD.encode(key.verifying_key().as_bytes()),
                    sealed: keyring.seal(&context, key.as_bytes())?,
                };
                tx.insert(PLUGIN_KEYS, &id, serde_json::to_value(stored).map_err(Refusal::internal)?).await?;
                Ok(key)
            }
        });
        // Two first uses at once: one insert wins, the other reads what it wrote.
        match loaded.await {
            Err(e) if e.is("exists") => Box::pin(signing_key(services, plugin, name)).await,
            other => other.map_err(to_wit),
        }
    }
}

impl sign::Host for CallData {
    async fn sign(&mut self, key_name: String, message: Vec<u8>) -> WitResult<Vec<u8>> {
        use ed25519_dalek::Signer;
        self.require(&Capability::Sign)?;
        let key = signing_key(self.services.clone(), self.plugin.clone(), key_name).await?;
        Ok(key.sign(&message).to_bytes().to_vec())
    }

    async fn public_key(&mut self, key_name: String) -> WitResult<Vec<u8>> {
        self.require(&Capability::Sign)?;
        let key = signing_key(self.services.clone(), self.plugin.clone(), key_name).await?;
        Ok(key.verifying_key().as_bytes().to_vec())
    }
}

impl log::Host for CallData {
    async fn log(&mut self, level: log::Level, message: String, fields: Vec<(String, String)>) {
        if self.require(&Capability::Log).is_err() {
            return;
        }
        let message = truncate(&message, 4000);
        let fields: String =
            fields.iter().take(16).map(|(k, v)| format!(" {}={:?}", truncate(k, 64), truncate(v, 512))).collect::<Vec<_>>().join("");
        let (plugin, request_id) = (&self.plugin, &self.request_id);
        match level {
            log::Level::Trace => tracing::trace!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
            log::Level::Debug => tracing::debug!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
            log::Level::Info => tracing::info!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
            log::Level::Warn => tracing::warn!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
            log::Level::Error => tracing::error!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_collections_cannot_collide() {
        assert_eq!(collection_name("a-b", "c"), "p_a_b__c");
        assert_eq!(collection_name("a", "bc"), "p_a__bc");
        assert!(validate_plugin_collection("notes").is_ok());
        assert!(validate_plugin_collection("b_c").is_err());
        assert!(validate_plugin_collection("Notes").is_err());
        assert!(validate_plugin_collection("").is_err());
        assert!(validate_plugin_collection(&"n".repeat(21)).is_err());
        assert!(crate::store::validate_collection(&collection_name(&"a".repeat(40), &"n".repeat(20))).is_ok());
    }

    #[test]
    fn tls_failures_are_found_behind_io_errors_and_named() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let unknown = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = Outer(std::io::Error::new(std::io::ErrorKind::InvalidData, unknown));
        let found = tls_error(&wrapped).expect("the rustls error inside the io::Error");
        assert_eq!(tls_cause(found), "certificate-unknown-issuer");
        let plain = Outer(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"));
        assert!(tls_error(&plain).is_none());
        assert_eq!(tls_cause(&rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)), "certificate-expired");
        assert_eq!(tls_cause(&rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)), "certificate-name-mismatch");
        assert_eq!(tls_cause(&rustls::Error::DecryptError), "handshake-failed");
    }

    #[test]
    fn a_plugin_clock_moved_ahead_stays_ahead() {
        let ahead = AheadClock(Duration::from_secs(3600));
        let system = wasmtime_wasi::clocks::WallClock::new();
        use wasmtime_wasi::HostWallClock;
        let gap = ahead.now().saturating_sub(system.now());
        assert!(gap >= Duration::from_secs(3599) && gap <= Duration::from_secs(3600), "{gap:?}");
    }

    #[test]
    fn origins_drop_default_ports_and_paths() {
        let origin = |u: &str| origin_of(&reqwest::Url::parse(u).unwrap()).unwrap();
        assert_eq!(origin("https://Catalog.Example.com/path?q=1"), "https://catalog.example.com");
        assert_eq!(origin("https://example.com:443/"), "https://example.com");
        assert_eq!(origin("http://127.0.0.1:8080/x"), "http://127.0.0.1:8080");
    }
}
