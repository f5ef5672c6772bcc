//! Where the host's areas meet without depending on each other. Each area declares what it
//! needs of the others as a trait; the answers live here, so the areas' crates stay apart:
//!
//! - [`HostDependents`]: what the secrets and plugin areas keep on the inventory's entities
//!   (the inventory's [`Dependents`]).
//! - [`InventoryPlatform`]: the inventory, the nodes of clusters, settings, organization roles,
//!   the secrets of the scopes granted and where services' replicas run (the runtime's slots,
//!   with the `registry` feature) as plugins reach them (the plugin host's [`Platform`]).

use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::access::{self, Authority, OrgRole};
use capstan_inventory::{Dependents, PluginFacet, PluginSetting};
use capstan_plugin_host::platform::{Platform, Replica, SecretMeta, SecretOwner};
use capstan_rpc::{Identity, OrganizationAuthority};
use capstan_store::{Document, Page, Store, Tx};
use serde_json::Value;
use std::sync::Arc;
use zeroize::Zeroizing;

/// The host's answer to [`Dependents`]: the secrets and plugin areas, consulted by the
/// inventory inside its own transactions.
pub struct HostDependents;

#[async_trait::async_trait]
impl Dependents for HostDependents {
    async fn organization_blocker(&self, tx: &Tx, organization_id: &str, name: &str) -> Result<Option<Refusal>> {
        Ok(capstan_secrets::sets::has_active(tx, organization_id).await?.then(|| {
            Refusal::new("organization-has-secret-sets", format!("the organization {name} still has active SecretSets: retire them first"))
        }))
    }

    async fn service_removed(&self, tx: &Tx, service_id: &str) -> Result<()> {
        // its own secrets are revoked and its SecretSet attachments go (the sets stay); its
        // registry repository is emptied by the next retention pass
        capstan_secrets::methods::forget_service(tx, service_id).await?;
        // its single sign-on client, codes, tokens and role assignments (docs/identity.md)
        #[cfg(feature = "registry")]
        if tx.is_declared(capstan_hosted_oidc::CLIENTS) {
            capstan_hosted_oidc::remove_service(tx, service_id).await?;
        }
        #[cfg(feature = "registry")]
        capstan_registry::retention::retire_service_repository(tx, service_id).await?;
        Ok(())
    }

    #[cfg(feature = "registry")]
    async fn service_runtime(&self, tx: &Tx, service_id: &str) -> Result<Vec<Value>> {
        if !tx.is_declared(capstan_runtime::RUNTIME_SPECS) {
            return Ok(Vec::new());
        }
        let specs = capstan_runtime::spec::of_service(tx, service_id).await?;
        specs.iter().map(|spec| serde_json::to_value(spec).map_err(Refusal::internal)).collect()
    }

    async fn cluster_blocker(&self, tx: &Tx, cluster_id: &str, name: &str) -> Result<Option<Refusal>> {
        match tx.is_declared(capstan_relays::registrations::SESSIONS) {
            true => capstan_relays::registrations::cluster_blocker(tx, cluster_id, name).await,
            false => Ok(None),
        }
    }

    async fn cluster_removed(&self, tx: &Tx, cluster_id: &str) -> Result<()> {
        match tx.is_declared(capstan_relays::registrations::SESSIONS) {
            true => capstan_relays::registrations::cluster_removed(tx, cluster_id).await,
            false => Ok(()),
        }
    }

    async fn holder_present(&self, tx: &Tx, holder: &str) -> Result<bool> {
        use capstan_plugin_host::host::PLUGINS;
        match holder.strip_prefix("plugin:") {
            Some(plugin) => Ok(tx.is_declared(PLUGINS) && tx.get(PLUGINS, plugin).await?.is_some()),
            None => Ok(true),
        }
    }

    async fn plugin_settings(&self, tx: &Tx) -> Result<Vec<PluginSetting>> {
        use capstan_plugin_host::host::{PLUGINS, Record};
        if !tx.is_declared(PLUGINS) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut cursor = None;
        loop {
            let page = tx.scan(PLUGINS, cursor.as_deref(), 100).await?;
            for doc in page.documents {
                let record: Record = serde_json::from_value(doc.data).map_err(Refusal::internal)?;
                out.extend(record.current.settings.into_iter().map(|s| PluginSetting {
                    plugin: record.id.clone(),
                    key: s.key,
                    summary: s.summary,
                    schema: s.schema,
                    default: s.default,
                }));
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(out),
            }
        }
    }

    fn check_plugin_setting(&self, setting: &PluginSetting, value: &Value) -> Result<()> {
        let declared = capstan_plugin_host::faces::SettingDecl {
            key: setting.key.clone(),
            summary: setting.summary.clone(),
            schema: setting.schema.clone(),
            default: setting.default.clone(),
        };
        capstan_plugin_host::faces::check_value(&setting.full_key(), &declared, value)
    }

    async fn plugin_facet(&self, tx: &Tx, plugin: &str, kind: &str) -> Result<Option<PluginFacet>> {
        use capstan_plugin_host::host::{PLUGINS, Record};
        if !tx.is_declared(PLUGINS) {
            return Ok(None);
        }
        let Some(doc) = tx.get(PLUGINS, plugin).await? else { return Ok(None) };
        let record: Record = serde_json::from_value(doc.data).map_err(Refusal::internal)?;
        Ok(record.current.faces.facet(kind).map(|f| PluginFacet {
            kind: f.kind.clone(),
            summary: f.summary.clone(),
            schema: f.schema.clone(),
        }))
    }

    fn check_plugin_facet(&self, plugin: &str, id: &str, facet: &PluginFacet, value: &Value) -> Result<()> {
        let declared = capstan_plugin_host::faces::FacetDecl {
            kind: facet.kind.clone(),
            summary: facet.summary.clone(),
            schema: facet.schema.clone(),
        };
        capstan_plugin_host::faces::check_facet(plugin, id, &declared, value)
    }
}

/// The inventory and the secrets as the plugin host reaches them.
pub struct InventoryPlatform {
    store: Store,
    secrets: capstan_secrets::methods::Context,
    dependents: Arc<dyn Dependents>,
    /// The clock a node's liveness is judged at.
    clock: capstan_core::clock::Clock,
    /// Where what a plugin changes on its own account (a reconcile pass, a task, an event) is
    /// recorded; what it changes in a caller's call is the call's record. None: not recorded
    /// (a test host).
    audit: Option<capstan_rpc::audit::AuditLog>,
}

impl InventoryPlatform {
    /// Over `store` (secrets sealed with `keyring`), releasing holds with `dependents` consulted.
    pub fn new(store: Store, keyring: Arc<capstan_keyring::Keyring>, dependents: Arc<dyn Dependents>) -> Arc<Self> {
        Arc::new(Self::unaudited(store, keyring, dependents))
    }

    /// [`InventoryPlatform::new`], recording in `audit` what plugins change on their own account.
    pub fn audited(
        store: Store,
        keyring: Arc<capstan_keyring::Keyring>,
        dependents: Arc<dyn Dependents>,
        audit: capstan_rpc::audit::AuditLog,
    ) -> Arc<Self> {
        Arc::new(InventoryPlatform { audit: Some(audit), ..Self::unaudited(store, keyring, dependents) })
    }

    fn unaudited(store: Store, keyring: Arc<capstan_keyring::Keyring>, dependents: Arc<dyn Dependents>) -> Self {
        let secrets = capstan_secrets::methods::Context { store: store.clone(), keyring };
        InventoryPlatform { store, secrets, dependents, clock: capstan_core::clock::Clock::system(), audit: None }
    }

    /// Record `method` done by a plugin on its own account (`actor` is the plugin): the ids the
    /// body names and the one it made, and how it ended. A caller's call is recorded by the door.
    async fn record(&self, actor: &Identity, method: &str, body: &Value, done: &Result<Document>) {
        let Some(audit) = self.audit.as_ref().filter(|_| actor.kind == "plugin") else { return };
        let mut targets = capstan_rpc::audit::targets(body);
        let outcome = match done {
            Ok(made) => {
                targets.push(made.id.clone());
                "ok".to_string()
            }
            Err(refusal) => refusal.code.to_string(),
        };
        let who = capstan_rpc::audit::Actor {
            user_id: Some(actor.user_id.clone()),
            username: Some(actor.username.clone()),
            kind: actor.kind.clone(),
        };
        let plugin = actor.user_id.strip_prefix("plugin:").map(String::from);
        audit.append(capstan_rpc::audit::Record::host(method, who, targets).by_plugin(plugin).ended(outcome)).await;
    }
}

/// Declare the collections the secrets a plugin reaches live in (for a host, like the SDK's
/// test host, that declares only what its plugins reach).
pub async fn declare_secrets(store: &Store) -> Result<()> {
    capstan_secrets::methods::declare(store).await
}

/// A secret's metadata as a plugin sees it.
fn secret_meta(view: capstan_secrets::methods::SecretView) -> SecretMeta {
    use capstan_secrets::methods::{Owner, State};
    let secret = view.secret;
    SecretMeta {
        id: view.id,
        owner: match secret.owner {
            Owner::Service { service_id } => SecretOwner::Service(service_id),
            Owner::Organization { organization_id, .. } => SecretOwner::Organization(organization_id),
            Owner::System { system_id } => SecretOwner::System(system_id),
        },
        key: secret.key,
        management_scope: secret.management_scope.unwrap_or_default(),
        active_version: secret.current_version_id,
        state: match secret.state {
            State::Active => "active".into(),
            State::Revoked => "revoked".into(),
        },
        created_at_ms: secret.created_at * 1000,
        rotated_at_ms: (secret.versions > 1).then_some(secret.updated_at * 1000),
    }
}

/// A node as `nodes.get` answers it, as the document a plugin reads.
fn node_document(view: capstan_nodes::NodeView) -> Result<Document> {
    let (id, revision) = (view.node.id.clone(), view.node.revision);
    Ok(Document { id, revision, data: capstan_inventory::to_value(&view)? })
}

fn document(entity: capstan_inventory::Entity<capstan_inventory::services::Service>) -> Result<Document> {
    Ok(Document { id: entity.id, revision: entity.revision, data: capstan_inventory::to_value(&entity.data)? })
}

#[async_trait::async_trait]
impl OrganizationAuthority for InventoryPlatform {
    async fn require(&self, identity: &Identity, organization: &str, need: OrgRole) -> Result<Option<OrgRole>> {
        Authority(self.store.clone()).require(identity, organization, need).await
    }
}

#[async_trait::async_trait]
impl Platform for InventoryPlatform {
    fn setting_lists_urls(&self, key: &str) -> bool {
        capstan_inventory::settings::lists_urls(key)
    }

    async fn setting_urls(&self, key: &str) -> Result<Option<Vec<String>>> {
        capstan_inventory::settings::urls(&self.store, key).await
    }

    fn plugin_identity(&self, plugin: &str) -> Identity {
        access::plugin_identity(plugin)
    }

    async fn node(&self, id: &str) -> Result<Option<Document>> {
        capstan_nodes::records::read(&self.store, &self.clock, id).await?.map(node_document).transpose()
    }

    async fn nodes(&self, cursor: Option<&str>, limit: usize) -> Result<Page> {
        let page = capstan_nodes::records::read_page(&self.store, &self.clock, None, cursor, Some(limit)).await?;
        Ok(Page { documents: page.items.into_iter().map(node_document).collect::<Result<_>>()?, next_cursor: page.next_cursor })
    }

    async fn service_replicas(&self, service_id: &str) -> Result<Vec<Replica>> {
        of_service(&self.store, service_id, |tx, id| async move { replicas_of(&tx, &id).await }).await
    }

    async fn service_specs(&self, service_id: &str) -> Result<Vec<Document>> {
        of_service(&self.store, service_id, |tx, id| async move { specs_of(&tx, &id).await }).await
    }

    async fn service_rollout(&self, service_id: &str, digest: &str) -> Result<Value> {
        let digest = digest.to_string();
        of_service(&self.store, service_id, |tx, id| {
            let digest = digest.clone();
            async move { rollout_of(&tx, &id, &digest).await }
        })
        .await
    }

    async fn service_image_digest(&self, service_id: &str) -> Result<Option<String>> {
        of_service(&self.store, service_id, |tx, id| async move { image_digest_of(&tx, &id).await }).await
    }

    async fn set_service_gate(&self, plugin: &str, service_id: &str, waiting: Option<&str>) -> Result<()> {
        let holder = format!("plugin:{plugin}");
        of_service(&self.store, service_id, |tx, id| {
            let holder = holder.clone();
            async move { set_gate(&tx, &id, &holder, waiting).await }
        })
        .await
    }

    async fn set_service_spec(&self, actor: &Identity, body: Value) -> Result<Document> {
        let done = set_spec(&self.store, actor, body.clone()).await;
        self.record(actor, "runtime.setServiceSpec", &body, &done).await;
        done
    }

    async fn create_service(&self, actor: &Identity, body: Value) -> Result<Document> {
        let done = match capstan_rpc::decode(body.clone()) {
            Ok(input) => capstan_inventory::services::create(&self.store, actor, input).await.and_then(document),
            Err(refusal) => Err(refusal),
        };
        self.record(actor, "services.create", &body, &done).await;
        done
    }

    async fn update_service(&self, actor: &Identity, body: Value) -> Result<Document> {
        let done = match capstan_rpc::decode(body.clone()) {
            Ok(input) => capstan_inventory::services::update(&self.store, actor, input).await.and_then(document),
            Err(refusal) => Err(refusal),
        };
        self.record(actor, "services.update", &body, &done).await;
        done
    }

    async fn set_facet(
        &self,
        kind: &str,
        id: &str,
        plugin: &str,
        value: Option<Value>,
        expected_revision: Option<u64>,
    ) -> Result<Document> {
        let write = capstan_inventory::facets::Write { kind, id, plugin, value, expected_revision };
        capstan_inventory::facets::set(&self.store, &*self.dependents, write).await
    }

    async fn hold_service(&self, service_id: &str, holder: &str) -> Result<()> {
        capstan_inventory::services::hold(&self.store, service_id, holder).await
    }

    async fn release_service(&self, service_id: &str, holder: &str) -> Result<()> {
        capstan_inventory::services::release(&self.store, &*self.dependents, service_id, holder).await
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
        use capstan_secrets::managed;
        let generate = capstan_secrets::methods::Generate { length: length as usize, alphabet: alphabet.into() };
        managed::ensure(&self.secrets, actor, scope, managed_owner(owner)?, key, generate).await.map(secret_meta)
    }

    async fn put_secret(
        &self,
        actor: &Identity,
        scope: &str,
        owner: SecretOwner,
        key: &str,
        value: Zeroizing<Vec<u8>>,
    ) -> Result<SecretMeta> {
        capstan_secrets::managed::put(&self.secrets, actor, scope, managed_owner(owner)?, key, value).await.map(secret_meta)
    }

    async fn rotate_secret(&self, actor: &Identity, scope: &str, id: &str) -> Result<SecretMeta> {
        capstan_secrets::managed::rotate(&self.secrets, actor, scope, id).await.map(secret_meta)
    }

    async fn revoke_secret(&self, actor: &Identity, scope: &str, id: &str) -> Result<SecretMeta> {
        capstan_secrets::managed::revoke(&self.secrets, actor, scope, id).await.map(secret_meta)
    }

    async fn list_secrets(&self, scope: &str) -> Result<Vec<SecretMeta>> {
        Ok(capstan_secrets::managed::list(&self.store, scope).await?.into_iter().map(secret_meta).collect())
    }

    async fn reveal_secret(&self, actor: &Identity, plugin: &str, scope: &str, id: &str) -> Result<Zeroizing<Vec<u8>>> {
        capstan_secrets::managed::reveal(&self.secrets, actor, plugin, scope, id).await
    }
}

/// Every replica slot of a service as a plugin reads it, by cluster then slot: the runtime's
/// slots, where the host runs services (the `registry` feature, which brings the runtime).
#[cfg(feature = "registry")]
async fn replicas_of(tx: &Tx, service_id: &str) -> Result<Vec<Replica>> {
    use capstan_plugin_host::platform::ReplicaIntent;
    use capstan_runtime::transition::Intent;
    if !tx.is_declared(capstan_runtime::RUNTIME_SLOTS) {
        return Ok(Vec::new());
    }
    let docs = tx.find_all(capstan_runtime::RUNTIME_SLOTS, "by_service", &[serde_json::json!(service_id)]).await?;
    let mut replicas = Vec::with_capacity(docs.len());
    for doc in &docs {
        let slot = capstan_inventory::parse::<capstan_runtime::slots::Slot>(doc)?.data;
        // as `runtime.getServiceStatus` words it
        replicas.push(Replica {
            intent: match slot.assignment.intent {
                Intent::Run => ReplicaIntent::Run,
                Intent::Stop => ReplicaIntent::Stop,
                Intent::Remove => ReplicaIntent::Remove,
            },
            ready: slot.ready(),
            image_digest: slot.image_digest(),
            phase: slot.phase(),
            cluster_id: slot.cluster_id.clone(),
            node_id: slot.node_id.clone(),
            slot: slot.slot.clone(),
            assignment_id: slot.assignment_id.clone(),
        });
    }
    replicas.sort_by(|a, b| (&a.cluster_id, &a.slot).cmp(&(&b.cluster_id, &b.slot)));
    Ok(replicas)
}

/// What `read` finds of the service `service_id` in one transaction, once the service is known
/// to exist (`service-not-found` otherwise).
async fn of_service<T, F, Fut>(store: &Store, service_id: &str, read: F) -> Result<T>
where
    F: Fn(Tx, String) -> Fut + Send + Sync,
    Fut: std::future::Future<Output = Result<T>> + Send,
    T: Send,
{
    let read = &read;
    store
        .transact(|tx| async move {
            if !tx.is_declared(capstan_inventory::SERVICES) {
                return Err(capstan_inventory::not_found("service", service_id));
            }
            let service = capstan_inventory::services::require_service(&tx, service_id).await?;
            read(tx, service.id).await
        })
        .await
}

/// A service's runtime specs, by cluster, where the host runs services.
#[cfg(feature = "registry")]
async fn specs_of(tx: &Tx, service_id: &str) -> Result<Vec<Document>> {
    if !tx.is_declared(capstan_runtime::RUNTIME_SPECS) {
        return Ok(Vec::new());
    }
    let specs = capstan_runtime::spec::of_service(tx, service_id).await?;
    specs.into_iter().map(|s| Ok(Document { id: s.id, revision: s.revision, data: capstan_inventory::to_value(&s.data)? })).collect()
}

/// Without the runtime no service is meant to run anywhere.
#[cfg(not(feature = "registry"))]
async fn specs_of(_tx: &Tx, _service_id: &str) -> Result<Vec<Document>> {
    Ok(Vec::new())
}

/// Where release `digest` of a service stands on the runtime, as `deployments.getStatus` judges a
/// promoted release.
#[cfg(feature = "registry")]
async fn rollout_of(tx: &Tx, service_id: &str, digest: &str) -> Result<Value> {
    use capstan_registry::rollout::{Rollout, Rollouts};
    let Some(digest) = capstan_registry::names::Digest::parse(digest) else {
        return Err(Refusal::invalid_request("a release digest is `sha256:` and 64 lowercase hex digits")
            .with_data(serde_json::json!({ "field": "digest" })));
    };
    let clusters = capstan_runtime::rollout::Evidence.clusters(tx, service_id, digest.as_str()).await?;
    capstan_inventory::to_value(&Rollout::of(clusters))
}

/// The digest a service's image runs as: pinned, else its image plan's (for that very image).
#[cfg(feature = "registry")]
async fn image_digest_of(tx: &Tx, service_id: &str) -> Result<Option<String>> {
    use capstan_runtime::images::{ImagePlan, RUNTIME_IMAGE_PLANS, is_pinned};
    let service = capstan_inventory::services::require_service(tx, service_id).await?;
    let image = &service.data.image;
    if is_pinned(image) {
        return Ok(image.rsplit_once('@').map(|(_, digest)| digest.to_string()));
    }
    if !tx.is_declared(RUNTIME_IMAGE_PLANS) {
        return Ok(None);
    }
    let plan = tx.get(RUNTIME_IMAGE_PLANS, service_id).await?.as_ref().map(capstan_inventory::parse::<ImagePlan>).transpose()?;
    Ok(plan.and_then(|p| p.data.digest.filter(|_| p.data.image == *image)))
}

/// Without the runtime no tag is resolved: only a pinned image names its digest.
#[cfg(not(feature = "registry"))]
async fn image_digest_of(tx: &Tx, service_id: &str) -> Result<Option<String>> {
    let service = capstan_inventory::services::require_service(tx, service_id).await?;
    let image = &service.data.image;
    Ok(image.rsplit_once("@sha256:").map(|(_, hex)| format!("sha256:{hex}")))
}

/// Without the runtime nothing places a service: every release is unplaced.
#[cfg(not(feature = "registry"))]
async fn rollout_of(_tx: &Tx, _service_id: &str, _digest: &str) -> Result<Value> {
    Ok(serde_json::json!({ "state": "unplaced", "clusters": [] }))
}

/// Write a service's runtime spec as `actor`, where the host runs services.
#[cfg(feature = "registry")]
async fn set_spec(store: &Store, actor: &Identity, body: Value) -> Result<Document> {
    let spec = capstan_runtime::spec::write(store, actor, capstan_rpc::decode(body)?).await?;
    Ok(Document { id: spec.id, revision: spec.revision, data: capstan_inventory::to_value(&spec.data)? })
}

#[cfg(feature = "registry")]
async fn set_gate(tx: &Tx, service_id: &str, holder: &str, waiting: Option<&str>) -> Result<()> {
    if !tx.is_declared(capstan_runtime::gates::RUNTIME_GATES) {
        return Ok(());
    }
    capstan_runtime::gates::set(tx, service_id, holder, waiting).await.map(drop)
}

/// Without the runtime no service runs anywhere: a gate holds nothing back.
#[cfg(not(feature = "registry"))]
async fn set_gate(_tx: &Tx, _service_id: &str, _holder: &str, waiting: Option<&str>) -> Result<()> {
    match waiting {
        Some(reason) if !capstan_core::refusal::valid_code(reason) => Err(Refusal::invalid_request("a gate's reason is a kebab-case code")),
        _ => Ok(()),
    }
}

/// Without the runtime no service runs anywhere: a spec has nowhere to go.
#[cfg(not(feature = "registry"))]
async fn set_spec(_store: &Store, _actor: &Identity, _body: Value) -> Result<Document> {
    Err(capstan_core::refusal::Refusal::new("runtime-unavailable", "this host runs no services: a runtime spec has nowhere to go"))
}

/// Without the runtime (the SDK's test harness) no service runs anywhere.
#[cfg(not(feature = "registry"))]
async fn replicas_of(_tx: &Tx, _service_id: &str) -> Result<Vec<Replica>> {
    Ok(Vec::new())
}

/// Whom a plugin's secret belongs to: a service or the system; an organization's secrets belong
/// to its SecretSets, which an administrator creates.
fn managed_owner(owner: SecretOwner) -> Result<capstan_secrets::managed::ManagedOwner> {
    use capstan_secrets::managed::ManagedOwner;
    match owner {
        SecretOwner::Service(id) => Ok(ManagedOwner::Service(id)),
        SecretOwner::System(id) => Ok(ManagedOwner::System(id)),
        SecretOwner::Organization(_) => Err(Refusal::new(
            "secret-owner-unsupported",
            "an organization's secrets belong to its SecretSets, which an administrator creates; a plugin manages service and system secrets",
        )),
    }
}
