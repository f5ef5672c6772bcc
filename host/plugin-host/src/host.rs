//! The installed plugins: the registry in the store (collection `plugins`), bundles in blobs
//! (`_capstan/plugins/<id>/…`), and the versions loaded on this node. Lifecycle operations
//! (install, upgrade, rollback, disable, enable, uninstall) verify, migrate, record, then swap
//! the loaded version atomically: a call holds the version it started on until it ends.

use super::bundle::{Bundle, PublisherKey};
use super::imports::{Services, blob_prefix, collection_name};
use super::manifest::{Capability, Manifest, check_approval, check_plugin_id};
use super::platform::Platform;
use super::runtime::{Caller, Runtime, Sandbox, wit_guest};
use crate::blobs::PutMode;
use crate::refusal::{Refusal, Result};
use crate::store::{CollectionSpec, Store};
use capstan_core::text::truncate;
use capstan_rpc::{Call, Method, MethodSource, RawHandler};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::str::FromStr;
use std::sync::{Arc, RwLock};

/// The store collection of the registry: one [`Record`] per installed plugin, keyed by id.
pub const PLUGINS: &str = "plugins";
/// The store collection of the publisher keys trusted through the API, keyed by fingerprint.
pub const TRUSTED_PUBLISHERS: &str = "trusted_publishers";

/// Who may call a plugin method, as its descriptor declares: the registry's one access type.
pub use capstan_rpc::Access;

/// The input-schema annotation by which a plugin declares a method a read
/// (`capstan_sdk::Descriptor::read_only`).
pub const READ_ONLY: &str = "x-capstan-read-only";

/// One method a plugin serves, with its compiled input schema.
pub struct MethodEntry {
    /// What the method does, as the descriptor states it.
    pub summary: String,
    /// Who may call it; enforced before the plugin runs.
    pub role: Access,
    /// JSON Schema the request body must match; checked before the plugin runs.
    pub input_schema: Value,
    /// JSON Schema of the answer, as the plugin declares it (published, not checked).
    pub output_schema: Value,
    /// Declared a read (`"x-capstan-read-only": true` in its input schema): not audited, and
    /// every import that changes something refused while it runs.
    pub read_only: bool,
    validator: jsonschema::Validator,
}

/// A plugin's descriptor, checked and in host form.
pub struct Described {
    /// The methods it serves, by verb (the name after `<plugin>.`).
    pub methods: BTreeMap<String, Arc<MethodEntry>>,
    /// The collections it declares, under the names the plugin uses, indexes checked.
    pub collections: Vec<CollectionSpec>,
    /// The event kinds delivered to its `on-event` (patterns such as `appstore.*`).
    pub subscriptions: Vec<String>,
    /// Its scheduled tasks; every cron expression parses.
    pub schedules: Vec<wit_guest::Schedule>,
    /// Time between reconcile passes (at least a second); none: no reconcile loop.
    pub reconcile_period: Option<std::time::Duration>,
    /// Its background work as a fleet workload `plugin.<id>`: replicas (1 to 64) and node selector.
    pub placement: crate::fleet::placement::Workload,
    /// The settings it declares.
    pub settings: Vec<crate::faces::SettingDecl>,
    /// The dashboard pages it contributes.
    pub pages: Vec<crate::faces::PageDecl>,
    /// The records it keeps on entities, their panels, its navigation section and its
    /// refusal codes (its settings and pages are the fields above).
    pub faces: crate::faces::Faces,
}

impl Described {
    fn from_wit(plugin: &str, mut d: wit_guest::Descriptor) -> Result<Described> {
        let declared = crate::faces::Declared::of(&mut d);
        let invalid = |m: String| Refusal::new("plugin-descriptor-invalid", format!("plugin {plugin}: {m}"));
        let mut methods = BTreeMap::new();
        for m in d.methods {
            if !capstan_rpc::valid_method_name(&format!("x.{}", m.name)) {
                return Err(invalid(format!("method name {:?} must be a camelCase verb", m.name)));
            }
            let role: Access = m.role.parse()?;
            let input_schema: Value =
                serde_json::from_str(&m.input_schema).map_err(|e| invalid(format!("{}: input schema: {e}", m.name)))?;
            let output_schema: Value =
                serde_json::from_str(&m.output_schema).map_err(|e| invalid(format!("{}: output schema: {e}", m.name)))?;
            if m.input_schema.len() > MAX_SCHEMA_BYTES {
                return Err(invalid(format!("{}: the input schema is larger than {MAX_SCHEMA_BYTES} bytes", m.name)));
            }
            let validator = input_validator(&input_schema).map_err(|e| invalid(format!("{}: input schema: {e}", m.name)))?;
            let read_only = input_schema.get(READ_ONLY) == Some(&Value::Bool(true));
            let entry = Arc::new(MethodEntry { summary: m.summary, role, input_schema, output_schema, read_only, validator });
            if methods.insert(m.name.clone(), entry).is_some() {
                return Err(invalid(format!("method {:?} is declared twice", m.name)));
            }
        }
        let mut collections = Vec::new();
        for c in d.collections {
            super::imports::validate_plugin_collection(&c.name)?;
            let mut spec = CollectionSpec::new(&c.name);
            for index in c.indexes {
                let fields: Vec<&str> = index.fields.iter().map(String::as_str).collect();
                spec = if index.unique { spec.unique(&index.name, &fields) } else { spec.index(&index.name, &fields) };
            }
            let mut check = spec.clone();
            check.name = collection_name(plugin, &c.name);
            check.validate()?;
            collections.push(spec);
        }
        for s in &d.schedules {
            croner::Cron::from_str(&s.cron).map_err(|e| invalid(format!("schedule {:?}: cron {:?}: {e}", s.name, s.cron)))?;
        }
        let period = d.reconcile_period_ms.map(|ms| std::time::Duration::from_millis(ms.max(1000)));
        let placement = crate::fleet::placement::Workload {
            id: format!("plugin.{plugin}"),
            replicas: d.placement.replicas.clamp(1, 64) as usize,
            selector: d.placement.selector.into_iter().collect(),
        };
        let verbs: Vec<&str> = methods.keys().map(String::as_str).collect();
        let (settings, pages, faces) = crate::faces::from_wit(plugin, declared, &verbs)?;
        Ok(Described {
            faces,
            methods,
            collections,
            subscriptions: d.subscriptions,
            schedules: d.schedules,
            reconcile_period: period,
            placement,
            settings,
            pages,
        })
    }
}

/// The setting key an `http-setting:<key>` capability names.
fn http_setting(capability: &Capability) -> Option<&String> {
    match capability {
        Capability::HttpSetting(key) => Some(key),
        _ => None,
    }
}

/// A plugin version loaded on this node.
pub struct Active {
    /// The manifest of the bundle it was loaded from.
    pub manifest: Manifest,
    /// The compiled component with its approved grants, which runs every call.
    pub sandbox: Arc<Sandbox>,
    /// What its `describe` declared, checked.
    pub described: Described,
    /// Its methods as registry entries, by verb: swapped in and out with the version.
    pub methods: BTreeMap<String, Arc<Method>>,
    /// Who vouches for it: the trusted publisher key text, or `first-party`.
    pub publisher: String,
    /// The registry revision this was loaded from.
    pub revision: u64,
    /// Its bundle's page templates, by entry name (`pages/<name>.html`).
    pub templates: BTreeMap<String, String>,
}

/// One installed version as the registry records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstalledVersion {
    /// The plugin's semver version, from its manifest.
    pub version: String,
    /// The blob key of the stored bundle: `_capstan/plugins/<id>/<version>-<digest>.capstan-plugin`.
    pub bundle_key: String,
    /// The bundle's canonical digest as lowercase hex; a reload checks the stored bundle against it.
    pub digest: String,
    /// The publisher key text, or `first-party`.
    pub publisher: String,
    /// The capabilities approved for it, as text (`store`, `inventory:read`, …).
    pub grants: Vec<String>,
    /// When it was installed, in milliseconds since the Unix epoch.
    pub installed_at: u64,
    /// Who installed it: a username, or `capstan` for a first-party plugin.
    pub installed_by: String,
    /// The contract it targets, from its manifest (`capstan:plugin@0.2.4`).
    #[serde(default = "wit_0_1")]
    pub wit: String,
    /// The settings it declares (what `settings.update` accepts as `<id>.<key>`).
    #[serde(default)]
    pub settings: Vec<crate::faces::SettingDecl>,
    /// The dashboard pages it contributes.
    #[serde(default)]
    pub pages: Vec<crate::faces::PageDecl>,
    /// Its facets, panels, navigation section and refusal codes (contract 0.3.0 on).
    #[serde(flatten)]
    pub faces: crate::faces::Faces,
}

/// What a version recorded before contracts were recorded targets.
fn wit_0_1() -> String {
    crate::manifest::WIT_0_1.to_string()
}

/// Why an installed plugin is not loaded on this node: the refusal that stopped it, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastError {
    /// The refusal's code.
    pub code: String,
    /// The refusal's message.
    pub message: String,
    /// When it happened, in milliseconds since the Unix epoch.
    pub at: u64,
}

/// A registry record: `plugins/<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The plugin id, also the document id.
    pub id: String,
    /// Its display name, from the current version's manifest.
    pub name: String,
    /// Whether nodes load it and serve its methods; a disabled plugin stays installed.
    pub enabled: bool,
    /// The version in use.
    pub current: InstalledVersion,
    /// The version before the last upgrade, which a rollback returns to; none after a rollback.
    pub previous: Option<InstalledVersion>,
    /// Another publisher key an administrator allowed to sign the next upgrade
    /// (`plugins.rebindPublisher`); an upgrade is otherwise signed by the current publisher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebound_publisher: Option<String>,
}

/// How many of the plugins this node should serve are loaded, failed to load, or still loading
/// (see [`PluginHost::readiness`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Readiness {
    /// Loaded and serving their methods.
    pub loaded: u32,
    /// Still loading: their methods answer `plugin-not-loaded` (retryable) meanwhile.
    pub loading: u32,
    /// Their last load failed: their methods answer `plugin-unavailable` with the cause.
    pub failed: u32,
}

/// A trusted publisher key added through the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustedPublisher {
    /// The public key in its text form, as [`PublisherKey`] displays it.
    pub public_key: String,
    /// The name it was trusted under (1 to 100 printable characters).
    pub name: String,
    /// The key's fingerprint (16 hex characters), also the document id.
    pub fingerprint: String,
    /// Who added it.
    pub added_by: String,
    /// When it was added, in milliseconds since the Unix epoch.
    pub added_at: u64,
}

/// The plugins of this node.
pub struct PluginHost {
    /// The wasmtime engine plugins are compiled and run on.
    pub runtime: Arc<Runtime>,
    /// What plugins' imports reach (store, blobs, keyring, platform), shared by every plugin.
    pub services: Arc<Services>,
    /// Keys trusted by configuration (cannot be removed through the API).
    configured_publishers: Vec<PublisherKey>,
    /// The first-party bundles this binary embeds.
    first_party: Vec<Bundle>,
    active: RwLock<HashMap<String, Arc<Active>>>,
    /// Why an installed plugin is not loaded here, by id.
    load_errors: RwLock<HashMap<String, LastError>>,
    /// One lifecycle operation at a time on this node; the registry CAS orders nodes.
    lifecycle: tokio::sync::Mutex<()>,
}

fn bundle_key(id: &str, version: &str, digest: &str) -> String {
    format!("_capstan/plugins/{id}/{version}-{}.capstan-plugin", &digest[..16])
}

impl PluginHost {
    /// Install how plugins' `agents.call` reaches a cluster's relay (the server does, at start;
    /// until then every call is refused `agent-not-connected`, retryable). The same as
    /// [`Services::set_agent_dispatch`] on [`PluginHost::services`].
    pub fn set_agent_dispatch(&self, dispatch: Arc<dyn crate::imports::AgentDispatch>) {
        self.services.set_agent_dispatch(dispatch);
    }

    /// Install how plugins' `gateway.request` reaches the external gateway with Capstan's
    /// enrolled credential (the server does, at start; until then every request is refused
    /// `gateway-not-enrolled`). The same as [`Services::set_gateway_dispatch`] on
    /// [`PluginHost::services`].
    pub fn set_gateway_dispatch(&self, dispatch: Arc<dyn crate::imports::GatewayDispatch>) {
        self.services.set_gateway_dispatch(dispatch);
    }

    /// Install how plugins' `storage` reaches the providers of nodes' storage endpoints (the
    /// server does, at start; until then every call is refused `storage-unavailable`).
    pub fn set_storage_dispatch(&self, dispatch: Arc<dyn crate::imports::StorageDispatch>) {
        self.services.set_storage_dispatch(dispatch);
    }

    /// Set the origin transfer tickets' URLs start with (`CAPSTAN_PUBLIC_ORIGIN`).
    pub fn set_public_origin(&self, origin: &str) {
        self.services.set_public_origin(origin);
    }

    /// A host whose first-party plugins are `first_party` (the bundles the binary embeds, or a
    /// test's).
    pub async fn new(
        runtime: Arc<Runtime>,
        services: Arc<Services>,
        configured_publishers: Vec<PublisherKey>,
        first_party: Vec<Bundle>,
    ) -> Result<Arc<Self>> {
        services.store.declare(CollectionSpec::new(PLUGINS)).await?;
        services.store.declare(CollectionSpec::new(TRUSTED_PUBLISHERS)).await?;
        services.store.declare(CollectionSpec::new(super::imports::PLUGIN_KEYS)).await?;
        crate::transfers::declare(&services.store).await?;
        crate::events::declare(&services.store).await?;
        Ok(Arc::new(PluginHost {
            runtime,
            services,
            configured_publishers,
            first_party,
            active: Default::default(),
            load_errors: Default::default(),
            lifecycle: Default::default(),
        }))
    }

    fn store(&self) -> &Store {
        &self.services.store
    }

    /// The loaded version of a plugin.
    pub fn get(&self, id: &str) -> Option<Arc<Active>> {
        self.active.read().expect("plugins lock").get(id).cloned()
    }

    /// Every plugin version loaded on this node, in id order.
    pub fn loaded(&self) -> Vec<Arc<Active>> {
        let mut all: Vec<_> = self.active.read().expect("plugins lock").values().cloned().collect();
        all.sort_by(|a, b| a.manifest.id.cmp(&b.manifest.id));
        all
    }

    fn swap_in(&self, active: Arc<Active>) {
        let id = active.manifest.id.clone();
        self.load_errors.write().expect("plugins lock").remove(&id);
        self.active.write().expect("plugins lock").insert(id, active);
    }

    fn unload(&self, id: &str) {
        self.active.write().expect("plugins lock").remove(id);
    }

    /// Every trusted key: configuration first, then those added through the API.
    pub async fn trusted_keys(&self) -> Result<Vec<PublisherKey>> {
        let mut keys = self.configured_publishers.clone();
        for p in self.trusted_publishers().await? {
            keys.push(p.public_key.parse().map_err(super::bundle::key_refusal)?);
        }
        Ok(keys)
    }

    /// The publisher keys added through the API (not those trusted by configuration).
    pub async fn trusted_publishers(&self) -> Result<Vec<TrustedPublisher>> {
        scan_all(self.store(), TRUSTED_PUBLISHERS)
            .await?
            .into_iter()
            .map(|doc| serde_json::from_value(doc.data).map_err(Refusal::internal))
            .collect()
    }

    /// The publisher keys trusted by configuration, which the API cannot remove.
    pub fn configured_publishers(&self) -> &[PublisherKey] {
        &self.configured_publishers
    }

    /// Trust a publisher key under `name`, recorded as added by `by`; refuses
    /// `publisher-exists` when the API already trusts it.
    pub async fn add_trusted_publisher(&self, key: &str, name: &str, by: &str) -> Result<TrustedPublisher> {
        let key: PublisherKey = key.trim().parse().map_err(super::bundle::key_refusal)?;
        let name = name.trim();
        if name.is_empty() || name.len() > 100 || name.chars().any(char::is_control) {
            return Err(Refusal::invalid_request("a publisher name is 1 to 100 printable characters").with_data(json!({"field": "name"})));
        }
        let publisher = TrustedPublisher {
            public_key: key.to_string(),
            name: name.to_string(),
            fingerprint: key.fingerprint(),
            added_by: by.to_string(),
            added_at: capstan_core::clock::now_ms(),
        };
        let value = serde_json::to_value(&publisher).map_err(Refusal::internal)?;
        let id = publisher.fingerprint.clone();
        self.store()
            .transact(|tx| {
                let (id, value) = (id.clone(), value.clone());
                async move { tx.insert(TRUSTED_PUBLISHERS, &id, value).await }
            })
            .await
            .map_err(|e| {
                if e.is("exists") {
                    Refusal::new("publisher-exists", "this publisher key is already trusted").with_data(json!({"fingerprint": id}))
                } else {
                    e
                }
            })?;
        Ok(publisher)
    }

    /// Remove a key added through the API. Loaded plugins it signed keep running until they
    /// are next loaded (a restart), when they no longer verify and say so.
    pub async fn remove_trusted_publisher(&self, key: &str) -> Result<bool> {
        let key: PublisherKey = key.trim().parse().map_err(super::bundle::key_refusal)?;
        if self.configured_publishers.contains(&key) {
            return Err(Refusal::new(
                "publisher-configured",
                "this key is trusted by configuration (CAPSTAN_TRUSTED_PUBLISHERS); remove it there",
            ));
        }
        let id = key.fingerprint();
        self.store()
            .transact(|tx| {
                let id = id.clone();
                async move {
                    match tx.get(TRUSTED_PUBLISHERS, &id).await? {
                        Some(doc) => tx.delete(TRUSTED_PUBLISHERS, &id, doc.revision).await.map(|()| true),
                        None => Ok(false),
                    }
                }
            })
            .await
    }

    /// A plugin's registry record with its revision; none when it is not installed.
    pub async fn record(&self, id: &str) -> Result<Option<(Record, u64)>> {
        let id = id.to_string();
        let doc = self
            .store()
            .transact(|tx| {
                let id = id.clone();
                async move { tx.get(PLUGINS, &id).await }
            })
            .await?;
        doc.map(|d| serde_json::from_value(d.data).map(|r| (r, d.revision)).map_err(Refusal::internal)).transpose()
    }

    /// Every installed plugin's registry record with its revision, in id order.
    pub async fn records(&self) -> Result<Vec<(Record, u64)>> {
        scan_all(self.store(), PLUGINS)
            .await?
            .into_iter()
            .map(|doc| serde_json::from_value(doc.data).map(|r| (r, doc.revision)).map_err(Refusal::internal))
            .collect()
    }

    /// Whether `id` names a plugin of this host: loaded here, installed, or embedded first-party
    /// (installed in the background at start).
    pub async fn knows(&self, id: &str) -> bool {
        self.get(id).is_some() || self.first_party.iter().any(|b| b.manifest.id == id) || self.record(id).await.is_ok_and(|r| r.is_some())
    }

    /// How far this node is with loading its plugins: every enabled installed plugin and every
    /// embedded first-party one not installed yet (that happens in the background at start) is
    /// loaded, failed to load, or still loading.
    pub async fn readiness(&self) -> Result<Readiness> {
        let records = self.records().await?;
        let installed: BTreeSet<&str> = records.iter().map(|(r, _)| r.id.as_str()).collect();
        let mut expected: BTreeSet<String> = records.iter().filter(|(r, _)| r.enabled).map(|(r, _)| r.id.clone()).collect();
        expected.extend(self.first_party.iter().map(|b| b.manifest.id.clone()).filter(|id| !installed.contains(id.as_str())));
        let mut readiness = Readiness::default();
        for id in expected {
            if self.get(&id).is_some() {
                readiness.loaded += 1;
            } else if self.load_error(&id).is_some() {
                readiness.failed += 1;
            } else {
                readiness.loading += 1;
            }
        }
        Ok(readiness)
    }

    /// Why an installed plugin is not loaded on this node, if its last load failed.
    pub fn load_error(&self, id: &str) -> Option<LastError> {
        self.load_errors.read().expect("plugins lock").get(id).cloned()
    }

    fn note_load_error(&self, id: &str, e: &Refusal) {
        tracing::warn!(plugin = %id, refusal = %e, "plugin not loaded");
        let error = LastError { code: e.code.to_string(), message: e.message.clone(), at: capstan_core::clock::now_ms() };
        self.load_errors.write().expect("plugins lock").insert(id.to_string(), error);
    }

    /// Who vouches for a bundle: `first-party` for an unsigned bundle byte for byte one this
    /// binary embeds, else the trusted publisher whose signature verifies.
    async fn trust(&self, bundle: &Bundle) -> Result<String> {
        let digest = bundle.digest_hex();
        if bundle.signature.is_none() && self.first_party.iter().any(|b| b.manifest.id == bundle.manifest.id && b.digest_hex() == digest) {
            return Ok(crate::first_party::PUBLISHER.into());
        }
        Ok(bundle.verify(&self.trusted_keys().await?)?.to_string())
    }

    /// Verify a bundle and prepare it to run: signature and trust, WIT version, approval,
    /// compilation, descriptor. Nothing is recorded.
    async fn prepare(&self, bundle: &Bundle, approved: &[String], revision: u64) -> Result<Active> {
        let publisher = self.trust(bundle).await?;
        self.prepare_verified(bundle, approved, publisher, revision).await
    }

    async fn prepare_verified(&self, bundle: &Bundle, approved: &[String], publisher: String, revision: u64) -> Result<Active> {
        let manifest = bundle.manifest.clone();
        manifest.check_wit_supported()?;
        let host_settings = |key: &&String| !key.contains('.');
        for key in manifest.capabilities.iter().filter_map(http_setting).filter(host_settings) {
            if !self.services.platform.setting_lists_urls(key) {
                return Err(super::manifest::not_a_url_setting(key));
            }
        }
        let grants = check_approval(&manifest.capability_set(), approved)?;
        let runtime = self.runtime.clone();
        let (component, wit) = (bundle.component.clone(), manifest.wit.clone());
        // Compiling is CPU-heavy; keep it off the async workers.
        let prepared = tokio::task::spawn_blocking(move || runtime.prepare(&component, &wit)).await.map_err(Refusal::internal)??;
        let sandbox = Arc::new(Sandbox::new(&manifest, grants, prepared, self.services.clone()));
        let described = Described::from_wit(&manifest.id, sandbox.describe().await?)?;
        let verbs: Vec<&str> = described.methods.keys().map(String::as_str).collect();
        crate::commands::check_methods(&manifest.id, &manifest.commands, &verbs)?;
        sandbox.declare_settings(&described.settings);
        sandbox.declare_refusals(&described.faces.refusals);
        // `http-setting:<id>.<key>`: one of its own settings, declared as URLs
        for key in manifest.capabilities.iter().filter_map(http_setting).filter(|key| !host_settings(key)) {
            let own = key.strip_prefix(&format!("{}.", manifest.id));
            if !own.is_some_and(|own| described.settings.iter().any(|s| s.key == own && s.lists_urls())) {
                return Err(super::manifest::not_a_url_setting(key));
            }
        }
        let methods = described
            .methods
            .iter()
            .map(|(verb, entry)| {
                (verb.clone(), registry_entry(&manifest.id, verb, entry, &sandbox, &self.services.platform, &described.faces.refusals))
            })
            .collect();
        for page in &described.pages {
            if let Some(template) = page.template.as_ref().filter(|t| !bundle.pages.contains_key(*t)) {
                return Err(Refusal::new(
                    "plugin-descriptor-invalid",
                    format!("plugin {}: page {:?} names the template {template}, which the bundle does not carry", manifest.id, page.path),
                ));
            }
        }
        if let Some(panel) = described.faces.panels.iter().find(|p| !bundle.pages.contains_key(&p.template)) {
            return Err(Refusal::new(
                "plugin-descriptor-invalid",
                format!(
                    "plugin {}: the panel {:?} names the template {}, which the bundle does not carry",
                    manifest.id, panel.title, panel.template
                ),
            ));
        }
        Ok(Active { manifest, sandbox, described, methods, publisher, revision, templates: bundle.pages.clone() })
    }

    /// Read and verify a stored bundle again, then prepare it.
    async fn load_stored(&self, id: &str, version: &InstalledVersion, revision: u64) -> Result<Active> {
        let (_, bytes) = self.services.blobs.get_bytes(&version.bundle_key).await?.ok_or_else(|| {
            Refusal::new("bundle-missing", format!("the stored bundle of {id} {} is gone from the bucket", version.version))
        })?;
        let bundle = Bundle::parse(&bytes)?;
        if bundle.manifest.id != id || bundle.digest_hex() != version.digest {
            return Err(Refusal::new("bundle-mismatch", format!("the stored bundle of {id} is not the one that was installed")));
        }
        self.prepare(&bundle, &version.grants, revision).await
    }

    /// Make the loaded versions match the registry: load what is enabled and changed, unload
    /// what is gone or disabled. A plugin that no longer verifies is not loaded and says why.
    pub async fn sync(&self) -> Result<()> {
        let records = self.records().await?;
        let mut seen = BTreeSet::new();
        for (record, revision) in records {
            seen.insert(record.id.clone());
            if !record.enabled {
                self.unload(&record.id);
                continue;
            }
            if self.get(&record.id).is_some_and(|a| a.revision == revision) {
                continue;
            }
            match self.load_stored(&record.id, &record.current, revision).await {
                Ok(active) => {
                    if let Err(e) = self.services.declare_collections(&record.id, &active.described.collections).await {
                        self.note_load_error(&record.id, &e);
                        continue;
                    }
                    tracing::info!(plugin = %record.id, version = %record.current.version, "plugin loaded");
                    self.swap_in(Arc::new(active));
                }
                Err(e) => {
                    self.unload(&record.id);
                    self.note_load_error(&record.id, &e);
                }
            }
        }
        let stale: Vec<String> = self.active.read().expect("plugins lock").keys().filter(|id| !seen.contains(*id)).cloned().collect();
        for id in stale {
            self.unload(&id);
        }
        Ok(())
    }

    /// Install the first-party plugins this binary embeds, or upgrade them to the embedded
    /// version. Never stops a start: a failure is logged and noted as the plugin's load error.
    /// A plugin of the same id from another publisher, or one an operator disabled, is left
    /// as it is.
    pub async fn install_first_party(&self) -> Result<()> {
        let all_requested = ["all-requested".to_string()];
        for bundle in &self.first_party {
            let id = bundle.manifest.id.as_str();
            let outcome = match self.record(id).await? {
                None => self.install(&bundle.to_bytes(), &all_requested, crate::first_party::INSTALLER).await.map(|_| "installed"),
                Some((record, _)) if record.current.publisher != crate::first_party::PUBLISHER => {
                    tracing::warn!(plugin = %id, publisher = %record.current.publisher, "a plugin from another publisher holds a first-party id; the embedded one is not installed");
                    continue;
                }
                Some((record, _)) => {
                    let installed: semver::Version = record.current.version.parse().map_err(Refusal::internal)?;
                    if bundle.manifest.version <= installed {
                        continue;
                    }
                    if !record.enabled {
                        tracing::info!(plugin = %id, installed = %installed, embedded = %bundle.manifest.version, "first-party plugin disabled; not upgraded");
                        continue;
                    }
                    self.upgrade(&bundle.to_bytes(), &all_requested, crate::first_party::INSTALLER).await.map(|_| "upgraded")
                }
            };
            match outcome {
                Ok(done) => tracing::info!(plugin = %id, version = %bundle.manifest.version, "first-party plugin {done}"),
                // another node of the fleet did it first
                Err(e) if e.is("plugin-exists") || e.is("version-not-newer") || e.is("conflict") => {}
                Err(e) => self.note_load_error(id, &e),
            }
        }
        Ok(())
    }

    /// Install a new plugin from a bundle.
    pub async fn install(&self, bytes: &[u8], approved: &[String], by: &str) -> Result<Record> {
        let _guard = self.lifecycle.lock().await;
        crate::fleet::refuse_if_frozen(&self.services.blobs).await?;
        let bundle = Bundle::parse(bytes)?;
        let id = bundle.manifest.id.clone();
        // the signature first: a changed byte always reads as such
        let publisher = self.trust(&bundle).await?;
        // a first-party id is this binary's to fill: another publisher's plugin under it could
        // pass for the embedded one
        if publisher != crate::first_party::PUBLISHER && self.first_party.iter().any(|b| b.manifest.id == id) {
            return Err(Refusal::new("plugin-id-reserved", format!("plugin id {id:?} belongs to a first-party plugin of this host"))
                .with_data(json!({ "id": id })));
        }
        if self.record(&id).await?.is_some() {
            return Err(
                Refusal::new("plugin-exists", format!("plugin {id} is installed; use plugins.upgrade")).with_data(json!({"id": id}))
            );
        }
        let active = self.prepare_verified(&bundle, approved, publisher, 0).await?;
        self.services.declare_collections(&id, &active.described.collections).await?;
        active.sandbox.migrate(None, &active.sandbox.version).await?;
        let version = self.store_bundle(&bundle, &active, by).await?;
        let record = Record {
            id: id.clone(),
            name: bundle.manifest.name.clone(),
            enabled: true,
            current: version,
            previous: None,
            rebound_publisher: None,
        };
        let value = serde_json::to_value(&record).map_err(Refusal::internal)?;
        let doc = self
            .store()
            .transact(|tx| {
                let (id, value, record) = (id.clone(), value.clone(), record.clone());
                async move {
                    let doc = tx.insert(PLUGINS, &id, value).await?;
                    crate::events::append(&tx, "plugin.installed", &id, json!({ "id": id, "version": record.current.version }), "host")
                        .await?;
                    Ok(doc)
                }
            })
            .await
            .map_err(|e| if e.is("exists") { Refusal::new("plugin-exists", format!("plugin {id} was installed meanwhile")) } else { e })?;
        self.swap_in(Arc::new(Active { revision: doc.revision, ..active }));
        tracing::info!(plugin = %id, version = %record.current.version, by, "plugin installed");
        Ok(record)
    }

    async fn store_bundle(&self, bundle: &Bundle, active: &Active, by: &str) -> Result<InstalledVersion> {
        let digest = bundle.digest_hex();
        let key = bundle_key(&bundle.manifest.id, &bundle.manifest.version.to_string(), &digest);
        match self.services.blobs.put_bytes(&key, bundle.to_bytes(), PutMode::CreateOnly).await {
            Ok(_) => {}
            Err(e) if e.is("exists") => {} // the same digest: the same bytes
            Err(e) => return Err(e),
        }
        Ok(InstalledVersion {
            version: bundle.manifest.version.to_string(),
            bundle_key: key,
            digest,
            publisher: active.publisher.clone(),
            grants: active.sandbox.grants.iter().map(Capability::to_string).collect(),
            installed_at: capstan_core::clock::now_ms(),
            installed_by: by.to_string(),
            wit: bundle.manifest.wit.clone(),
            settings: active.described.settings.clone(),
            pages: active.described.pages.clone(),
            faces: active.described.faces.clone(),
        })
    }

    /// Upgrade to a higher version: verify, approve, migrate, record, swap.
    pub async fn upgrade(&self, bytes: &[u8], approved: &[String], by: &str) -> Result<Record> {
        let _guard = self.lifecycle.lock().await;
        crate::fleet::refuse_if_frozen(&self.services.blobs).await?;
        let bundle = Bundle::parse(bytes)?;
        let id = bundle.manifest.id.clone();
        let publisher = self.trust(&bundle).await?;
        let (record, revision) = self.record(&id).await?.ok_or_else(|| not_installed(&id))?;
        // an upgrade comes from whoever the plugin was installed from, or from the key an
        // administrator re-bound it to: trusting a second publisher lets it sign its own
        // plugins, not take over another's
        if publisher != record.current.publisher && record.rebound_publisher.as_deref() != Some(publisher.as_str()) {
            return Err(Refusal::new(
                "publisher-mismatch",
                format!(
                    "{id} was installed from publisher {}; an upgrade must be signed by the same key (an administrator may re-bind it with plugins.rebindPublisher)",
                    record.current.publisher
                ),
            )
            .with_data(json!({ "installed": record.current.publisher, "offered": publisher })));
        }
        let current: semver::Version = record.current.version.parse().map_err(Refusal::internal)?;
        if bundle.manifest.version <= current {
            return Err(Refusal::new(
                "version-not-newer",
                format!("{id} {} is installed; an upgrade must be a higher version than {}", current, bundle.manifest.version),
            )
            .with_data(json!({ "installed": current.to_string(), "offered": bundle.manifest.version.to_string() })));
        }
        let active = self.prepare_verified(&bundle, approved, publisher, 0).await?;
        self.services.declare_collections(&id, &active.described.collections).await?;
        active.sandbox.migrate(Some(&record.current.version), &active.sandbox.version).await?;
        let version = self.store_bundle(&bundle, &active, by).await?;
        let next = Record {
            previous: Some(record.current.clone()),
            current: version,
            name: bundle.manifest.name.clone(),
            rebound_publisher: None,
            ..record
        };
        // Crash point `plugin-upgrade:before-record`: the new version's data migration ran and
        // its bundle is stored, the registry still names the old version, which a restart
        // loads; the upgrade asked again migrates (idempotently) and swaps.
        capstan_core::crash_point("plugin-upgrade:before-record");
        let doc = self.replace_record(&next, revision, "plugin.upgraded").await?;
        // a disabled plugin is upgraded on record only; enabling it loads the new version
        if next.enabled {
            self.swap_in(Arc::new(Active { revision: doc, ..active }));
        }
        tracing::info!(plugin = %id, from = %current, to = %next.current.version, by, "plugin upgraded");
        Ok(next)
    }

    async fn replace_record(&self, record: &Record, revision: u64, event: &str) -> Result<u64> {
        let value = serde_json::to_value(record).map_err(Refusal::internal)?;
        let (id, version, event) = (record.id.clone(), record.current.version.clone(), event.to_string());
        let doc = self
            .store()
            .transact(|tx| {
                let (id, value, version, event) = (id.clone(), value.clone(), version.clone(), event.clone());
                async move {
                    let doc = tx.replace(PLUGINS, &id, revision, value).await?;
                    crate::events::append(&tx, &event, &id, json!({ "id": id, "version": version }), "host").await?;
                    Ok(doc)
                }
            })
            .await?;
        Ok(doc.revision)
    }

    /// Let the next upgrade of `id` be signed by `publisher` (a trusted key's text), where it
    /// must otherwise be signed by the key the current version came from. Refused
    /// `publisher-untrusted` for a key not trusted now.
    pub async fn rebind_publisher(&self, id: &str, publisher: &str, by: &str) -> Result<Record> {
        let _guard = self.lifecycle.lock().await;
        let key: PublisherKey = publisher.parse().map_err(super::bundle::key_refusal)?;
        if !self.trusted_keys().await?.contains(&key) {
            return Err(Refusal::new("publisher-untrusted", "only a trusted publisher key can sign a plugin's upgrades")
                .with_data(json!({ "fingerprint": key.fingerprint() })));
        }
        let (record, revision) = self.record(id).await?.ok_or_else(|| not_installed(id))?;
        let next = Record { rebound_publisher: Some(key.to_string()), ..record };
        self.replace_record(&next, revision, "plugin.publisherRebound").await?;
        tracing::warn!(plugin = %id, publisher = %key.fingerprint(), by, "plugin re-bound to another publisher for its next upgrade");
        Ok(next)
    }

    /// Go back to the version before the last upgrade (its code; data migrations are not undone).
    pub async fn rollback(&self, id: &str, by: &str) -> Result<Record> {
        let _guard = self.lifecycle.lock().await;
        crate::fleet::refuse_if_frozen(&self.services.blobs).await?;
        let (record, revision) = self.record(id).await?.ok_or_else(|| not_installed(id))?;
        let previous = record.previous.clone().ok_or_else(|| {
            Refusal::new("rollback-unavailable", format!("{id} has no previous version to roll back to")).with_data(json!({"id": id}))
        })?;
        let active = self.load_stored(id, &previous, 0).await?;
        self.services.declare_collections(id, &active.described.collections).await?;
        let next = Record { current: previous, previous: None, ..record };
        let doc = self.replace_record(&next, revision, "plugin.rolledBack").await?;
        if next.enabled {
            self.swap_in(Arc::new(Active { revision: doc, ..active }));
        }
        tracing::info!(plugin = %id, version = %next.current.version, by, "plugin rolled back");
        Ok(next)
    }

    /// Enable or disable a plugin: recorded in the registry, then loaded or unloaded here. A
    /// plugin enabled but failing to load stays enabled and notes its load error.
    pub async fn set_enabled(&self, id: &str, enabled: bool, by: &str) -> Result<Record> {
        let _guard = self.lifecycle.lock().await;
        let (record, revision) = self.record(id).await?.ok_or_else(|| not_installed(id))?;
        if record.enabled == enabled {
            return Ok(record);
        }
        let next = Record { enabled, ..record };
        let event = if enabled { "plugin.enabled" } else { "plugin.disabled" };
        let doc = self.replace_record(&next, revision, event).await?;
        if enabled {
            match self.load_stored(id, &next.current, doc).await {
                Ok(active) => {
                    self.services.declare_collections(id, &active.described.collections).await?;
                    self.swap_in(Arc::new(active));
                }
                Err(e) => self.note_load_error(id, &e),
            }
        } else {
            self.unload(id);
        }
        tracing::info!(plugin = %id, enabled, by, "plugin {}", if enabled { "enabled" } else { "disabled" });
        Ok(next)
    }

    /// Remove a plugin. Its data stays unless `purge`: then its collections' documents, its
    /// blobs, its signing keys and its stored bundles go too.
    pub async fn uninstall(&self, id: &str, purge: bool, by: &str) -> Result<Value> {
        let _guard = self.lifecycle.lock().await;
        let (record, revision) = self.record(id).await?.ok_or_else(|| not_installed(id))?;
        if record.current.publisher == crate::first_party::PUBLISHER {
            return Err(Refusal::new(
                "plugin-first-party",
                format!("{id} ships inside the host and is installed again at every start: disable it instead"),
            )
            .with_data(json!({ "id": id })));
        }
        // A purge needs the plugin's collections: from the loaded version, else its bundle.
        let collections: Vec<CollectionSpec> = match self.get(id) {
            Some(active) => active.described.collections.clone(),
            None if purge => self.load_stored(id, &record.current, 0).await.map(|a| a.described.collections).unwrap_or_default(),
            None => Vec::new(),
        };
        let id_owned = id.to_string();
        self.store()
            .transact(|tx| {
                let id = id_owned.clone();
                async move {
                    tx.delete(PLUGINS, &id, revision).await?;
                    crate::events::append(&tx, "plugin.uninstalled", &id, json!({ "id": id }), "host").await.map(drop)
                }
            })
            .await?;
        self.unload(id);
        let mut removed = json!({ "documents": 0, "blobs": 0 });
        if purge {
            removed = self.purge(id, &collections).await?;
        }
        tracing::info!(plugin = %id, purge, by, "plugin uninstalled");
        Ok(json!({ "id": id, "purged": purge, "removed": removed }))
    }

    async fn purge(&self, id: &str, collections: &[CollectionSpec]) -> Result<Value> {
        let mut documents = 0u64;
        self.services.declare_collections(id, collections).await?;
        for spec in collections {
            let name = collection_name(id, &spec.name);
            if !self
                .store()
                .transact(|tx| {
                    let name = name.clone();
                    async move { Ok(tx.is_declared(&name)) }
                })
                .await?
            {
                continue;
            }
            loop {
                let page = self
                    .store()
                    .transact(|tx| {
                        let name = name.clone();
                        async move { tx.scan(&name, None, 200).await }
                    })
                    .await?;
                if page.documents.is_empty() {
                    break;
                }
                documents += page.documents.len() as u64;
                self.store()
                    .transact(|tx| {
                        let (name, docs) = (name.clone(), page.documents.clone());
                        async move {
                            for d in docs {
                                tx.delete(&name, &d.id, d.revision).await?;
                            }
                            Ok(())
                        }
                    })
                    .await?;
            }
        }
        let mut blobs = 0u64;
        for prefix in [blob_prefix(id), format!("_capstan/plugins/{id}/")] {
            loop {
                let page = self.services.blobs.list(&prefix, None, 500).await?;
                if page.items.is_empty() {
                    break;
                }
                for item in page.items {
                    if self.services.blobs.delete(&item.key).await? {
                        blobs += 1;
                    }
                }
            }
        }
        let keys_prefix = format!("{id}/");
        self.store()
            .transact(|tx| {
                let keys_prefix = keys_prefix.clone();
                async move {
                    let page = tx.scan(super::imports::PLUGIN_KEYS, Some(&keys_prefix), 500).await?;
                    for d in page.documents.into_iter().filter(|d| d.id.starts_with(&keys_prefix)) {
                        tx.delete(super::imports::PLUGIN_KEYS, &d.id, d.revision).await?;
                    }
                    Ok(())
                }
            })
            .await?;
        Ok(json!({ "documents": documents, "blobs": blobs }))
    }

    /// Call `<plugin>.<method>` for `caller` through its registry entry, exactly as
    /// `POST /api/v1/<plugin>.<method>` would (for tests and the in-process test host).
    pub async fn dispatch(
        &self,
        plugin: &str,
        method: &str,
        caller: Option<&capstan_rpc::Identity>,
        request_id: &str,
        body: Value,
    ) -> Result<Value> {
        let name = format!("{plugin}.{method}");
        let Some(entry) = MethodSource::get(self, &name) else {
            return Err(self.absent(&name).await.unwrap_or_else(|| self.unavailable(plugin)));
        };
        entry.call(Call { identity: caller.cloned(), source: None, request_id: request_id.into(), body_text: None }, body).await
    }

    fn unavailable(&self, plugin: &str) -> Refusal {
        if let Some(e) = self.load_error(plugin) {
            return Refusal::new("plugin-unavailable", format!("plugin {plugin} is installed but not loaded: {}", e.message))
                .with_data(json!({ "plugin": plugin, "cause": e.code }));
        }
        Refusal::new("method-unknown", format!("there is no plugin {plugin:?} serving methods here")).with_data(json!({ "plugin": plugin }))
    }
}

/// Largest input schema a plugin may declare for one method, as JSON text.
const MAX_SCHEMA_BYTES: usize = 256 << 10;
/// Bodies up to about this size are checked against their schema inline (microseconds); larger
/// ones on the blocking pool.
const INLINE_VALIDATION_BYTES: usize = 16 << 10;

/// The validator of a plugin's input schema. Its `pattern`s run on the `regex` engine, which
/// is linear in the input (no backtracking to blow up), with its compiled size bounded; no
/// reference outside the schema is resolved.
fn input_validator(schema: &Value) -> std::result::Result<jsonschema::Validator, String> {
    let patterns = jsonschema::PatternOptions::regex().size_limit(1 << 20).dfa_size_limit(1 << 20);
    jsonschema::options().with_pattern_options(patterns).build(schema).map_err(|e| e.to_string())
}

/// The first way `body` breaks the method's schema: the message (values masked) and the field,
/// each bounded (a member name the client chose may be of any length, and both name it).
fn first_violation(entry: &MethodEntry, body: &Value) -> Option<(String, String)> {
    // the common case first: `is_valid` stops at the first failure and builds no error
    if entry.validator.is_valid(body) {
        return None;
    }
    let error = entry.validator.iter_errors(body).next()?;
    let path = error.instance_path().to_string();
    let field = path.trim_start_matches('/').replace('/', ".");
    Some((truncate(&error.masked().to_string(), 300), truncate(&field, 100)))
}

#[cfg(test)]
#[test]
fn a_violation_names_a_long_member_only_so_far() {
    let schema = json!({ "type": "object", "properties": { "labels": { "type": "object", "additionalProperties": { "type": "string" } } },
                         "additionalProperties": false });
    let validator = input_validator(&schema).unwrap();
    let entry = MethodEntry {
        summary: String::new(),
        role: Access::Public,
        input_schema: schema,
        output_schema: json!({}),
        read_only: false,
        validator,
    };
    let long = "k".repeat(100_000);
    let (message, _) = first_violation(&entry, &json!({ long.clone(): 1 })).unwrap();
    assert!(message.len() <= 303 && message.starts_with("Additional properties"), "{message}");
    let (message, field) = first_violation(&entry, &json!({ "labels": { long.clone(): 1 } })).unwrap();
    assert!(field.len() <= 103 && field.starts_with("labels.kkk") && message.len() <= 303, "{field}: {message}");
}

/// Whether `value` is larger than about `limit` bytes of JSON text; stops counting past it.
fn larger_than(value: &Value, limit: usize) -> bool {
    fn spend(value: &Value, left: &mut isize) {
        *left -= match value {
            Value::String(s) => s.len() as isize + 2,
            Value::Array(_) | Value::Object(_) => 2,
            _ => 8,
        };
        let children: Box<dyn Iterator<Item = (usize, &Value)>> = match value {
            Value::Array(items) => Box::new(items.iter().map(|v| (0, v))),
            Value::Object(fields) => Box::new(fields.iter().map(|(k, v)| (k.len() + 3, v))),
            _ => return,
        };
        for (key, child) in children {
            if *left < 0 {
                return;
            }
            *left -= key as isize;
            spend(child, left);
        }
    }
    let mut left = limit as isize;
    spend(value, &mut left);
    left < 0
}

#[cfg(test)]
#[test]
fn body_sizes_are_estimated_without_walking_past_the_limit() {
    assert!(!larger_than(&json!({ "name": "x".repeat(100) }), 200));
    assert!(larger_than(&json!({ "name": "x".repeat(300) }), 200));
    assert!(larger_than(&json!([[[["y".repeat(300)]]]]), 200));
    assert!(larger_than(&Value::Array(vec![json!(1); 100]), 200), "numbers count too");
}

#[cfg(test)]
#[test]
fn a_backtracking_pattern_is_checked_in_linear_time_or_refused() {
    // (a+)+$ against many a's and a b is the classic exponential case for a backtracking engine
    let validator = input_validator(&json!({ "type": "string", "pattern": "^(a+)+$" })).unwrap();
    assert!(!validator.is_valid(&json!(format!("{}b", "a".repeat(100_000)))));
    // look-around needs backtracking: such a schema is refused at describe, not run
    assert!(input_validator(&json!({ "type": "string", "pattern": "^(?=a)a$" })).is_err());
}

/// A plugin method as a registry entry: the caller's role judged (organization roles through
/// the platform's one authority), the body validated against the schema the plugin declares,
/// then the sandbox answers.
fn registry_entry(
    plugin: &str,
    verb: &str,
    entry: &Arc<MethodEntry>,
    sandbox: &Arc<Sandbox>,
    platform: &Arc<dyn Platform>,
    refusals: &[crate::faces::RefusalDecl],
) -> Arc<Method> {
    let (plugin_id, verb_name) = (plugin.to_string(), verb.to_string());
    let (entry_for_call, sandbox, platform) = (entry.clone(), sandbox.clone(), platform.clone());
    let handler: RawHandler = Arc::new(move |call: Call, body: Value| {
        let (entry, sandbox, platform) = (entry_for_call.clone(), sandbox.clone(), platform.clone());
        let (plugin, verb) = (plugin_id.clone(), verb_name.clone());
        Box::pin(async move {
            let caller = authorize(&*platform, entry.role, call.identity.as_ref(), &body, &plugin, &verb).await?;
            // a large body is checked on the blocking pool, so no schema holds an executor thread
            let (body, invalid) = if larger_than(&body, INLINE_VALIDATION_BYTES) {
                let entry = entry.clone();
                tokio::task::spawn_blocking(move || {
                    let invalid = first_violation(&entry, &body);
                    (body, invalid)
                })
                .await
                .map_err(|_| Refusal::internal("the input check stopped unexpectedly"))?
            } else {
                let invalid = first_violation(&entry, &body);
                (body, invalid)
            };
            if let Some((message, field)) = invalid {
                return Err(Refusal::invalid_request(format!("{plugin}.{verb}: {message}")).with_data(json!({ "field": field })));
            }
            // the client's own JSON text when there is one: it parsed to exactly `body`
            let text = call.body_text.unwrap_or_else(|| body.to_string());
            sandbox.handle(&call.request_id, caller, call.identity, &verb, entry.read_only, text).await
        })
    });
    let schemas = (entry.input_schema.clone(), entry.output_schema.clone());
    let mut method = Method::served_by(plugin, format!("{plugin}.{verb}"), entry.summary.clone(), entry.role, schemas, handler);
    if entry.read_only {
        method.read_only();
    }
    method.declared_refusals = refusals.iter().map(|r| (r.code.clone(), r.status)).collect();
    Arc::new(method)
}

/// The plugins' methods are registry entries: those of the versions loaded here, swapped with
/// them; a plugin that is installed but not serving says why.
#[async_trait::async_trait]
impl MethodSource for PluginHost {
    fn get(&self, name: &str) -> Option<Arc<Method>> {
        let (plugin, verb) = name.split_once('.')?;
        PluginHost::get(self, plugin)?.methods.get(verb).cloned()
    }

    fn list(&self) -> Vec<Arc<Method>> {
        self.loaded().iter().flat_map(|a| a.methods.values().cloned().collect::<Vec<_>>()).collect()
    }

    async fn absent(&self, name: &str) -> Option<Refusal> {
        let (plugin, verb) = name.split_once('.')?;
        if PluginHost::get(self, plugin).is_some() {
            return Some(
                Refusal::new(
                    "method-unknown",
                    format!("plugin {plugin} has no method {:?}; GET /api/v1/methods lists them", truncate(verb, 64)),
                )
                .with_data(json!({ "method": truncate(name, 100) })),
            );
        }
        if self.load_error(plugin).is_some() {
            return Some(self.unavailable(plugin));
        }
        check_plugin_id(plugin).ok()?;
        match self.record(plugin).await {
            Ok(Some((record, _))) if !record.enabled => Some(
                Refusal::new(
                    "plugin-disabled",
                    format!("the plugin {plugin} is disabled; an administrator enables it again on the Plugins page"),
                )
                .with_data(json!({ "plugin": plugin })),
            ),
            // installed and enabled, or embedded here and not yet installed (that happens in
            // the background at start)
            Ok(Some(_)) => Some(not_loaded(plugin)),
            Ok(None) if self.first_party.iter().any(|b| b.manifest.id == plugin) => Some(not_loaded(plugin)),
            Ok(None) => None,
            Err(refusal) => Some(refusal),
        }
    }
}

/// `plugin-not-loaded` (retryable).
fn not_loaded(plugin: &str) -> Refusal {
    Refusal::new(
            "plugin-not-loaded",
            format!("the plugin {plugin} is not loaded on this host yet; first-party plugins are installed in the background at start, so try again in a few seconds"),
        )
        .with_data(json!({ "plugin": plugin }))
        .retryable()
}

/// Every document of a (small) collection, a page at a time.
async fn scan_all(store: &Store, collection: &'static str) -> Result<Vec<crate::store::Document>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .transact(|tx| {
                let cursor = cursor.clone();
                async move { tx.scan(collection, cursor.as_deref(), 500).await }
            })
            .await?;
        out.extend(page.documents);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(out),
        }
    }
}

fn not_installed(id: &str) -> Refusal {
    Refusal::not_found(format!("plugin {id:?}")).with_data(json!({ "id": id }))
}

/// The caller as the plugin sees it, once the role is satisfied. A member or owner method
/// names its organization in the body's `organizationId`; the role is checked there
/// (`inventory::access`), and an administrator passes as it does for host methods.
async fn authorize(
    platform: &dyn Platform,
    role: Access,
    identity: Option<&capstan_rpc::Identity>,
    body: &Value,
    plugin: &str,
    method: &str,
) -> Result<Caller> {
    use super::runtime::CallerKind;
    use capstan_rpc::OrgRole;
    let Some(identity) = identity else {
        return match role {
            Access::Public => Ok(Caller { kind: CallerKind::Human, id: String::new(), roles: vec!["public".into()] }),
            _ => Err(capstan_rpc::denied()),
        };
    };
    let kind = if identity.kind == "machine" { CallerKind::Machine } else { CallerKind::Human };
    let mut roles = vec!["authenticated".to_string()];
    if identity.is_human_admin() {
        roles.push("admin".into());
    }
    let need = match role {
        Access::Public | Access::Authenticated => None,
        Access::Admin if identity.is_human_admin() => None,
        Access::Admin => {
            return Err(Refusal::new("forbidden", format!("{plugin}.{method} needs the admin role")).with_data(json!({ "role": role })));
        }
        Access::Member => Some(OrgRole::Member),
        Access::Owner => Some(OrgRole::Owner),
    };
    if let Some(need) = need {
        let organization = body["organizationId"].as_str().ok_or_else(|| {
            Refusal::invalid_request(format!("{plugin}.{method} acts within an organization: name it in organizationId"))
                .with_data(json!({ "field": "organizationId" }))
        })?;
        let held = platform.require(identity, organization, need).await?;
        roles.extend(
            held.iter()
                .flat_map(|r| match r {
                    OrgRole::Owner => ["member", "owner"].as_slice(),
                    OrgRole::Member => ["member"].as_slice(),
                })
                .map(|r| r.to_string()),
        );
    }
    Ok(Caller { kind, id: identity.user_id.clone(), roles })
}
