//! An in-process host for testing one plugin: an embedded store and blob directory in a
//! temporary directory, the real runtime, the plugin installed with every capability it
//! requests. [`crate::testing::TestHost`] wraps it for plugin authors.

use capstan_core::refusal::{Refusal, Result};
use capstan_plugin_host::bundle::{Bundle, PublisherKey, generate_key};
use capstan_plugin_host::host::PluginHost;
use capstan_plugin_host::imports::{PluginHttp, Services, collection_name};
use capstan_plugin_host::platform::{Platform, Replica, SecretMeta, SecretOwner, Zeroizing, async_trait};
use capstan_plugin_host::runtime::Runtime;
use capstan_rpc::{Identity, OrgRole, OrganizationAuthority};
use capstan_store::{Document, Page};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// The host one plugin is tested on (async; [`crate::testing::TestHost`] drives it).
pub struct TestHost {
    dir: PathBuf,
    pub host: Arc<PluginHost>,
    pub plugin: String,
    caller: Identity,
    platform: Arc<HarnessPlatform>,
}

impl TestHost {
    /// Install `component` with `manifest_text` (its `capstan-plugin.toml`) and its page
    /// templates on a fresh host.
    pub async fn load(manifest_text: &str, component: Vec<u8>, pages: std::collections::BTreeMap<String, String>) -> Result<TestHost> {
        let dir = std::env::temp_dir().join(format!("capstan-test-host-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).map_err(Refusal::internal)?;
        let store = capstan_store::Store::open(&format!("sqlite:{}", dir.join("store.sqlite").display()), &Default::default()).await?;
        let blobs = capstan_blobs::Blobs::open(&format!("file:{}", dir.join("blobs").display()), &Default::default()).await?;
        let keyring = Arc::new(capstan_keyring::Keyring::generate(None, None)?);
        // the platform model a plugin reads and holds services in, as on a real host
        capstan_inventory::declare(&store).await?;
        capstan_links::declare_secrets(&store).await?;
        let inner = capstan_links::InventoryPlatform::new(store.clone(), keyring.clone(), Arc::new(capstan_links::HostDependents));
        let platform = Arc::new(HarnessPlatform {
            inner,
            replicas: Default::default(),
            specs: Default::default(),
            rollouts: Default::default(),
            image_digests: Default::default(),
            gates: Default::default(),
        });
        // as in dev mode, the plugin may reach a test server on loopback, and no other internal address
        let loopback = capstan_core::net::parse_networks("127.0.0.0/8, ::1").map_err(Refusal::internal)?;
        let http = PluginHttp::new(&[], &loopback).map_err(Refusal::internal)?;
        let services = Services::with_http(store, blobs, keyring, "test-node".into(), platform.clone(), http);
        let key = generate_key();
        let publishers = vec![PublisherKey::from_verifying_key(key.verifying_key())];
        let host = PluginHost::new(Runtime::new(None)?, services, publishers, vec![]).await?;
        let mut bundle = Bundle::new(manifest_text.to_string(), component)?.with_pages(pages)?;
        bundle.sign(&key);
        let record = host.install(&bundle.to_bytes(), &["all-requested".into()], "test").await?;
        let now = capstan_core::clock::now_ms();
        let caller = Identity {
            user_id: "u-test".into(),
            username: "test".into(),
            kind: "human".into(),
            admin: true,
            session_id: "test".into(),
            authenticated_at: now,
            expires_at: now + 24 * 3_600_000,
        };
        Ok(TestHost { dir, host, plugin: record.id, caller, platform })
    }

    /// Call a method as an administrator, through the same checks an API call goes through.
    pub async fn call(&self, method: &str, body: Value) -> Result<Value> {
        self.host.dispatch(&self.plugin, method, Some(&self.caller), "test", body).await
    }

    /// Publish an event to the outbox as the host would (e.g. `service.deleting`).
    pub async fn publish(&self, kind: &str, subject: &str, data: Value) -> Result<u64> {
        let (kind, subject) = (kind.to_string(), subject.to_string());
        self.host
            .services
            .store
            .transact(|tx| {
                let (kind, subject, data) = (kind.clone(), subject.clone(), data.clone());
                async move { capstan_events::append(&tx, &kind, &subject, data, "host").await }
            })
            .await
    }

    /// Deliver every pending event the plugin subscribes to; how many it took.
    pub async fn deliver_events(&self) -> Result<usize> {
        let active = self.host.get(&self.plugin).ok_or_else(|| Refusal::internal("the plugin is not loaded"))?;
        capstan_plugin_host::work::deliver_pending(&self.host, &active).await
    }

    /// Run one reconcile pass now.
    pub async fn reconcile(&self, hints: Vec<String>) -> Result<String> {
        let active = self.host.get(&self.plugin).ok_or_else(|| Refusal::internal("the plugin is not loaded"))?;
        let trigger = capstan_plugin_host::runtime::wit_guest::ReconcileTrigger { periodic: hints.is_empty(), hints };
        Ok(active.sandbox.reconcile(&trigger).await?.summary)
    }

    /// Replace the public settings document (as `settings.update` would, without its checks):
    /// catalog sources, trusted keys and the like for the plugin to read.
    pub async fn set_settings(&self, settings: Value) -> Result<()> {
        self.host
            .services
            .store
            .transact(|tx| {
                let settings = settings.clone();
                async move {
                    let current = tx.get(capstan_inventory::SETTINGS, capstan_inventory::settings::PUBLIC).await?;
                    tx.put(capstan_inventory::SETTINGS, capstan_inventory::settings::PUBLIC, current.map(|d| d.revision), settings).await
                }
            })
            .await
            .map(drop)
    }

    /// Create an organization for the plugin's services to live in; its id.
    pub async fn create_organization(&self, name: &str) -> Result<String> {
        let id = capstan_core::ids::new_id("org");
        let now = capstan_core::clock::now_ms();
        let organization = capstan_inventory::organizations::Organization {
            name: name.into(),
            created_at: now,
            created_by: self.caller.user_id.clone(),
            updated_at: now,
            facets: Default::default(),
            identity_provider_organization: None,
        };
        self.insert(capstan_inventory::ORGANIZATIONS, &id, capstan_inventory::to_value(&organization)?).await?;
        Ok(id)
    }

    /// Create a cluster (no nodes, no relay) for the plugin's services to run on; its id.
    pub async fn create_cluster(&self, name: &str) -> Result<String> {
        let id = capstan_core::ids::new_id("cluster");
        let now = capstan_core::clock::now_ms();
        let cluster = capstan_inventory::clusters::Cluster {
            name: name.into(),
            machine_user_id: capstan_core::ids::new_id("machine"),
            description: String::new(),
            labels: Default::default(),
            created_at: now,
            updated_at: now,
            relay: Default::default(),
            facets: Default::default(),
        };
        self.insert(capstan_inventory::CLUSTERS, &id, capstan_inventory::to_value(&cluster)?).await?;
        Ok(id)
    }

    /// Insert a document of the host's own collections (what the platform keeps).
    /// Create a service of `organization` from `fields` (the inventory's service document, as
    /// `services.create` would have written it: `name`, `image`, `volumes`, …); its id.
    pub async fn create_service(&self, organization: &str, fields: Value) -> Result<String> {
        let id = capstan_core::ids::new_id("svc");
        let now = capstan_core::clock::now_ms();
        let mut service = serde_json::json!({ "organizationId": organization, "ports": [], "domains": [], "environment": {},
            "scale": 1, "volumes": [], "mailAddresses": [], "deployOnPush": false, "state": "active", "createdAt": now, "updatedAt": now });
        if let (Some(service), Value::Object(fields)) = (service.as_object_mut(), fields) {
            service.extend(fields);
        }
        self.insert(capstan_inventory::SERVICES, &id, service).await?;
        Ok(id)
    }

    async fn insert(&self, collection: &str, id: &str, data: Value) -> Result<()> {
        self.host
            .services
            .store
            .transact(|tx| {
                let data = data.clone();
                async move { tx.insert(collection, id, data).await }
            })
            .await
            .map(drop)
    }

    /// A service as the inventory holds it (`id`, `revision` and its fields), if it exists.
    pub async fn service(&self, id: &str) -> Result<Option<Value>> {
        let doc = self.host.services.store.transact(|tx| async move { tx.get(capstan_inventory::SERVICES, id).await }).await?;
        Ok(doc.map(|d| {
            let mut data = d.data;
            data["id"] = Value::String(d.id);
            data["revision"] = d.revision.into();
            data
        }))
    }

    /// Move the wall clock the plugin sees `by` ahead (the host's own clock is untouched).
    pub fn advance_clock(&self, by: std::time::Duration) {
        self.host.services.advance_plugin_clock(by);
    }

    /// The wall clock the plugin sees now, in milliseconds since the epoch.
    pub fn clock_ms(&self) -> u64 {
        self.host.services.plugin_clock_ms()
    }

    /// Every document of one of the plugin's collections (`id`, `revision` and its fields), in
    /// id order.
    pub async fn documents(&self, collection: &str) -> Result<Vec<Value>> {
        let name = collection_name(&self.plugin, collection);
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .host
                .services
                .store
                .transact(|tx| {
                    let (name, cursor) = (name.clone(), cursor.clone());
                    async move { tx.scan(&name, cursor.as_deref(), 100).await }
                })
                .await?;
            for d in page.documents {
                let mut data = d.data;
                data["id"] = Value::String(d.id);
                data["revision"] = d.revision.into();
                out.push(data);
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(out),
            }
        }
    }

    /// Write a document of one of the plugin's collections as another node of a fleet would,
    /// over whatever is there.
    pub async fn put_document(&self, collection: &str, id: &str, data: Value) -> Result<()> {
        let name = collection_name(&self.plugin, collection);
        let (name, id) = (&name, id);
        self.host
            .services
            .store
            .transact(|tx| {
                let data = data.clone();
                async move {
                    let current = tx.get(name, id).await?;
                    tx.put(name, id, current.map(|d| d.revision), data).await
                }
            })
            .await
            .map(drop)
    }

    /// Answer `runtime.service-replicas` of `service_id` with `replicas` from now on (sorted by
    /// cluster then slot, as the host answers), whether or not the service exists here.
    pub fn set_service_replicas(&self, service_id: &str, mut replicas: Vec<Replica>) {
        replicas.sort_by(|a, b| (&a.cluster_id, &a.slot).cmp(&(&b.cluster_id, &b.slot)));
        self.platform.replicas.write().expect("replicas lock").insert(service_id.to_string(), replicas);
    }

    /// Keep `body` as the spec of its service on its cluster (the next revision).
    pub fn put_service_spec(&self, body: Value) {
        let id = format!("{}@{}", body["serviceId"].as_str().unwrap_or_default(), body["clusterId"].as_str().unwrap_or_default());
        let mut specs = self.platform.specs.write().expect("specs lock");
        let revision = specs.get(&id).map_or(1, |(revision, _)| revision + 1);
        specs.insert(id, (revision, body));
    }

    /// The reason the plugin's gate holds the service's replicas for, if it does.
    pub fn service_gate(&self, service_id: &str) -> Option<String> {
        self.platform.gates.read().expect("gates lock").get(service_id).cloned()
    }

    /// Answer `runtime.service-image-digest` of `service_id` with `digest` from now on.
    pub fn set_service_image_digest(&self, service_id: &str, digest: &str) {
        self.platform.image_digests.write().expect("image digests lock").insert(service_id.to_string(), digest.to_string());
    }

    /// Answer `runtime.service-rollout` of `service_id` for `digest` with `rollout` (`{state,
    /// clusters}`, as the host answers) from now on.
    pub fn set_service_rollout(&self, service_id: &str, digest: &str, rollout: Value) {
        self.platform.rollouts.write().expect("rollouts lock").insert(format!("{service_id}@{digest}"), rollout);
    }

    /// The runtime specs the plugin set (`runtime.set-service-spec`), by `<serviceId>@<clusterId>`:
    /// the harness runs no services, so it keeps what it was asked.
    pub fn service_specs(&self) -> HashMap<String, Value> {
        self.platform.specs.read().expect("specs lock").iter().map(|(id, (_, spec))| (id.clone(), spec.clone())).collect()
    }

    /// Run a scheduled task now.
    pub async fn run_task(&self, name: &str) -> Result<String> {
        let active = self.host.get(&self.plugin).ok_or_else(|| Refusal::internal("the plugin is not loaded"))?;
        active.sandbox.run_task(name).await
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The platform a tested plugin reaches: the host's own over the embedded store
/// ([`capstan_links::InventoryPlatform`]), which runs no services, with the replicas a test
/// seeded ([`TestHost::set_service_replicas`]) answered in its place.
struct HarnessPlatform {
    inner: Arc<capstan_links::InventoryPlatform>,
    replicas: RwLock<HashMap<String, Vec<Replica>>>,
    /// The specs set, by `<serviceId>@<clusterId>`, with their revisions.
    specs: RwLock<HashMap<String, (u64, Value)>>,
    /// Rollouts answered, by `<serviceId>@<digest>`.
    rollouts: RwLock<HashMap<String, Value>>,
    image_digests: RwLock<HashMap<String, String>>,
    /// The gates plugins set, by service.
    gates: RwLock<HashMap<String, String>>,
}

#[async_trait]
impl OrganizationAuthority for HarnessPlatform {
    async fn require(&self, identity: &Identity, organization: &str, need: OrgRole) -> Result<Option<OrgRole>> {
        self.inner.require(identity, organization, need).await
    }
}

#[async_trait]
impl Platform for HarnessPlatform {
    fn setting_lists_urls(&self, key: &str) -> bool {
        self.inner.setting_lists_urls(key)
    }

    async fn setting_urls(&self, key: &str) -> Result<Option<Vec<String>>> {
        self.inner.setting_urls(key).await
    }

    fn plugin_identity(&self, plugin: &str) -> Identity {
        self.inner.plugin_identity(plugin)
    }

    async fn node(&self, id: &str) -> Result<Option<Document>> {
        self.inner.node(id).await
    }

    async fn nodes(&self, cursor: Option<&str>, limit: usize) -> Result<Page> {
        self.inner.nodes(cursor, limit).await
    }

    async fn service_replicas(&self, service_id: &str) -> Result<Vec<Replica>> {
        let seeded = self.replicas.read().expect("replicas lock").get(service_id).cloned();
        match seeded {
            Some(replicas) => Ok(replicas),
            None => self.inner.service_replicas(service_id).await,
        }
    }

    /// The specs set for the service, by cluster.
    async fn service_specs(&self, service_id: &str) -> Result<Vec<Document>> {
        self.inner.service_replicas(service_id).await?;
        let specs = self.specs.read().expect("specs lock");
        let mut found: Vec<Document> = specs
            .iter()
            .filter(|(_, (_, body))| body["serviceId"] == service_id)
            .map(|(id, (revision, body))| Document { id: id.clone(), revision: *revision, data: body.clone() })
            .collect();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }

    /// As seeded for the release, else as the host judges it (unplaced: the test host runs no
    /// services).
    async fn service_rollout(&self, service_id: &str, digest: &str) -> Result<Value> {
        let answer = self.inner.service_rollout(service_id, digest).await?;
        let seeded = self.rollouts.read().expect("rollouts lock").get(&format!("{service_id}@{digest}")).cloned();
        Ok(seeded.unwrap_or(answer))
    }

    /// As seeded for the service, else as the host answers (a pinned image's digest).
    async fn service_image_digest(&self, service_id: &str) -> Result<Option<String>> {
        let answer = self.inner.service_image_digest(service_id).await?;
        let seeded = self.image_digests.read().expect("image digests lock").get(service_id).cloned();
        Ok(seeded.or(answer))
    }

    /// Kept as asked (the service must exist and the reason be a code, as on a host).
    async fn set_service_gate(&self, plugin: &str, service_id: &str, waiting: Option<&str>) -> Result<()> {
        self.inner.set_service_gate(plugin, service_id, waiting).await?;
        let mut gates = self.gates.write().expect("gates lock");
        match waiting {
            Some(reason) => drop(gates.insert(service_id.to_string(), reason.to_string())),
            None => drop(gates.remove(service_id)),
        }
        Ok(())
    }

    /// Kept as asked, fenced by `expectedRevision` as the host fences it; the service must exist.
    async fn set_service_spec(&self, _actor: &Identity, body: Value) -> Result<Document> {
        let (service, cluster) = (body["serviceId"].as_str().unwrap_or_default(), body["clusterId"].as_str().unwrap_or_default());
        self.inner.service_replicas(service).await?;
        let id = format!("{service}@{cluster}");
        let mut specs = self.specs.write().expect("specs lock");
        let held = specs.get(&id).map(|(revision, _)| *revision);
        if body["expectedRevision"].as_u64() != held {
            return Err(Refusal::new("conflict", format!("the spec of {service} on {cluster} is at revision {held:?}")));
        }
        let revision = held.unwrap_or(0) + 1;
        specs.insert(id.clone(), (revision, body.clone()));
        Ok(Document { id, revision, data: body })
    }

    async fn create_service(&self, actor: &Identity, body: Value) -> Result<Document> {
        self.inner.create_service(actor, body).await
    }

    async fn update_service(&self, actor: &Identity, body: Value) -> Result<Document> {
        self.inner.update_service(actor, body).await
    }

    async fn set_facet(
        &self,
        kind: &str,
        id: &str,
        plugin: &str,
        value: Option<Value>,
        expected_revision: Option<u64>,
    ) -> Result<Document> {
        self.inner.set_facet(kind, id, plugin, value, expected_revision).await
    }

    async fn hold_service(&self, service_id: &str, holder: &str) -> Result<()> {
        self.inner.hold_service(service_id, holder).await
    }

    async fn release_service(&self, service_id: &str, holder: &str) -> Result<()> {
        self.inner.release_service(service_id, holder).await
    }

    async fn ensure_secret(
        &self,
        actor: &Identity,
        scope: &str,
        owner: SecretOwner,
        key: &str,
        length: u32,
        alphabet: &str,
    ) -> Result<SecretMeta> {
        self.inner.ensure_secret(actor, scope, owner, key, length, alphabet).await
    }

    async fn put_secret(
        &self,
        actor: &Identity,
        scope: &str,
        owner: SecretOwner,
        key: &str,
        value: Zeroizing<Vec<u8>>,
    ) -> Result<SecretMeta> {
        self.inner.put_secret(actor, scope, owner, key, value).await
    }

    async fn rotate_secret(&self, actor: &Identity, scope: &str, id: &str) -> Result<SecretMeta> {
        self.inner.rotate_secret(actor, scope, id).await
    }

    async fn revoke_secret(&self, actor: &Identity, scope: &str, id: &str) -> Result<SecretMeta> {
        self.inner.revoke_secret(actor, scope, id).await
    }

    async fn list_secrets(&self, scope: &str) -> Result<Vec<SecretMeta>> {
        self.inner.list_secrets(scope).await
    }

    async fn reveal_secret(&self, actor: &Identity, plugin: &str, scope: &str, id: &str) -> Result<Zeroizing<Vec<u8>>> {
        self.inner.reveal_secret(actor, plugin, scope, id).await
    }
}
