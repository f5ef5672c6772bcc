//! Services (`services.*`): workload definitions owned by an organization, written with an
//! expected revision and validated strictly, deleted in two phases.
//!
//! Deletion: the request marks the service `deleting` durably and emits `service.deleting`;
//! from then on it refuses new work (`service-deleting`). Managers that own something of a
//! service hold it (`service_holds`) and release it once they cleaned up. A level-triggered
//! finalizer ([`finalize_deleting`]) deletes every deleting service nothing holds any more —
//! run by the request itself, by the release of the last hold, and by a periodic host task,
//! so a deletion interrupted anywhere is finished by the next pass, never stranded.

use super::access::{self, OrgRole, ServiceNeed};
use super::organizations::require_organization;
use super::{Context, Dependents};
use super::{Entity, Listing, SERVICE_GRANTS, SERVICE_HOLDS, SERVICES, check_revision, emit, parse, require, to_value, validate};
use capstan_auth::Identity;
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_field_rules::service::{self as rules, PortRule};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::{Store, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The protocol a service's port speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// HTTP.
    Http,
}

/// A port a service's container listens on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Port {
    /// The port the container listens on.
    pub port: u16,
    /// What the port speaks: tcp, udp or http.
    pub protocol: Protocol,
    /// A port published on the node, if any.
    pub public_port: Option<u16>,
}

/// A named volume mounted into a service's container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Volume {
    /// 1–63 of a-z 0-9 -, starting with a letter.
    pub name: String,
    /// Where it is mounted: an absolute path other than / without . or .., at most 256 bytes.
    pub mount_path: String,
}

/// The database a service keeps in one of its volumes. A backup takes it as a closure — a
/// consistent copy taken while the service runs, not the file as it happens to lie on disk —
/// and a restore puts that copy back (docs/backups.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Database {
    /// Its engine: `sqlite`.
    pub engine: DatabaseEngine,
    /// The volume that holds it: one of the service's volumes.
    pub volume: String,
    /// Its file, relative to the volume: names joined by `/`, no `.` or `..`, at most 256 bytes.
    pub path: String,
}

/// The engines a database closure is taken of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DatabaseEngine {
    /// SQLite: the closure is the online backup of the live file (`VACUUM INTO`).
    Sqlite,
}

/// Whether a service is in use or being deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ServiceState {
    /// In use: it takes new work.
    Active,
    /// Marked for deletion: refuses new work until the finalizer removes it.
    Deleting,
}

/// A tag pushed to a service's repository in Capstan's registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistryPush {
    /// The tag.
    pub tag: String,
    /// The manifest (or index) digest it names.
    pub digest: String,
    /// When it was pushed (milliseconds since the epoch).
    pub pushed_at: u64,
}

/// A release a deployment operation promoted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRelease {
    /// The deployment operation that pushed and promoted it.
    pub operation_id: String,
    /// Its release tag.
    pub tag: String,
    /// The root digest the service runs.
    pub digest: String,
    /// When it was promoted (milliseconds since the epoch).
    pub promoted_at: u64,
}

/// Pin the service at `expected_revision` (the rollout fence) to `image` — a digest reference —
/// as `release` (the registry's `deployments.promote`, in its transaction). A service that moved
/// on is `conflict`; one being deleted `service-deleting`.
pub async fn pin_release(tx: &Tx, id: &str, expected_revision: u64, image: &str, release: ServiceRelease) -> Result<Entity<Service>> {
    let current = require_active(tx, id).await?;
    check_revision("service", id, expected_revision, current.revision)?;
    let mut next = current.data.clone();
    next.image = image.to_string();
    next.release = Some(release);
    next.updated_at = now_ms();
    let doc = tx.replace(SERVICES, id, current.revision, to_value(&next)?).await?;
    emit(tx, "service.updated", id, summary(id, &next)).await?;
    parse(&doc)
}

/// Add to the service's domains those of `hostnames` it does not list yet (a deployment
/// publishing its routes), under the domain rules; answers the ones added.
pub async fn publish_domains(tx: &Tx, id: &str, hostnames: &[String]) -> Result<Vec<String>> {
    let current = require_active(tx, id).await?;
    let mut next = current.data.clone();
    let added: Vec<String> = hostnames.iter().filter(|h| !next.domains.contains(h)).cloned().collect();
    if added.is_empty() {
        return Ok(added);
    }
    next.domains.extend(added.iter().cloned());
    rules::domains(&next.domains)?;
    check_relay_names(tx, &added).await?;
    next.updated_at = now_ms();
    tx.replace(SERVICES, id, current.revision, to_value(&next)?).await?;
    emit(tx, "service.updated", id, summary(id, &next)).await?;
    Ok(added)
}

/// Take `hostnames` out of the service's domains again (a route that failed its check); a
/// service being deleted, or gone, is left as it is.
pub async fn withdraw_domains(tx: &Tx, id: &str, hostnames: &[String]) -> Result<()> {
    let Some(current) = tx.get(SERVICES, id).await? else { return Ok(()) };
    let mut next: Service = serde_json::from_value(current.data.clone()).map_err(Refusal::internal)?;
    if next.state != ServiceState::Active || !next.domains.iter().any(|d| hostnames.contains(d)) {
        return Ok(());
    }
    next.domains.retain(|d| !hostnames.contains(d));
    next.updated_at = now_ms();
    tx.replace(SERVICES, id, current.revision, to_value(&next)?).await?;
    emit(tx, "service.updated", id, summary(id, &next)).await
}

/// Record on the service that `tag` of its repository (`<host>/<repository>`, `image_base`) now
/// names `digest` (the registry's push hook). With `deployOnPush` on, a service whose `image`
/// runs that tag is pinned to the digest (`<base>:<tag>@<digest>`). A service being deleted,
/// or one that is gone, records nothing.
pub async fn record_push(store: &Store, id: &str, image_base: &str, tag: &str, digest: &str) -> Result<()> {
    store
        .transact(|tx| async move {
            let Some(current) = tx.get(SERVICES, id).await? else { return Ok(()) };
            let mut next: Service = serde_json::from_value(current.data.clone()).map_err(Refusal::internal)?;
            if next.state != ServiceState::Active {
                return Ok(());
            }
            next.registry_push = Some(RegistryPush { tag: tag.into(), digest: digest.into(), pushed_at: now_ms() });
            let tagged = format!("{image_base}:{tag}");
            let deploys =
                next.deploy_on_push && (next.image == tagged || next.image.strip_prefix(&tagged).is_some_and(|rest| rest.starts_with('@')));
            if deploys {
                next.image = format!("{tagged}@{digest}");
            }
            next.updated_at = now_ms();
            tx.replace(SERVICES, id, current.revision, to_value(&next)?).await?;
            emit(&tx, "service.pushed", id, json!({ "id": id, "tag": tag, "digest": digest, "deployed": deploys })).await?;
            if deploys {
                emit(&tx, "service.updated", id, summary(id, &next)).await?;
            }
            Ok(())
        })
        .await
}

/// A service: a workload definition owned by an organization.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    /// 1–63 of a-z 0-9 -, starting with a letter; unique within the organization.
    pub name: String,
    /// The organization that owns it; it never moves to another.
    pub organization_id: String,
    /// The image it runs: an OCI image reference.
    pub image: String,
    /// The ports its container listens on.
    #[serde(default)]
    pub ports: Vec<Port>,
    /// The domains it answers on (`app.example.com` or `*.example.com`).
    #[serde(default)]
    pub domains: Vec<String>,
    /// Plain configuration only; anything credential-like belongs in secrets.
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// Replicas, 0–64.
    pub scale: u32,
    /// The volumes mounted into its container.
    #[serde(default)]
    pub volumes: Vec<Volume>,
    /// The database it keeps in one of its volumes, if any: backed up as a closure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<Database>,
    /// The service's mail addresses.
    #[serde(default)]
    pub mail_addresses: Vec<String>,
    /// The release a deployment operation promoted: `image` pins its digest (the registry's
    /// `deployments.promote` writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ServiceRelease>,
    /// The newest tag pushed to its repository in Capstan's registry (the registry writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_push: Option<RegistryPush>,
    /// The legacy switch: a push of the tag its `image` names in its own repository pins the
    /// image to the pushed digest at once. Deployment operations need it off.
    #[serde(default)]
    pub deploy_on_push: bool,
    /// The template snapshot a manager (the App Store) created or upgraded it from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Value>,
    /// The records managers keep on it, by plugin id (`inventory.set-facet`; no operator
    /// write touches them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facets: crate::facets::Facets,
    /// `active`, or `deleting` once marked for deletion.
    pub state: ServiceState,
    /// When it was marked for deletion (milliseconds since the epoch); absent while active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleting_at: Option<u64>,
    /// When it was created (milliseconds since the epoch).
    pub created_at: u64,
    /// When it was last changed (milliseconds since the epoch).
    pub updated_at: u64,
}

/// Input of `services.create`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateInput {
    /// 1–63 of a-z 0-9 -, starting with a letter; unique within the organization.
    pub name: String,
    /// The organization that will own it; the caller must be one of its owners.
    pub organization_id: String,
    /// The image it runs: an OCI image reference, e.g. registry.example.com/team/app:1.2.
    pub image: String,
    /// The ports its container listens on: at most 32, ports 1–65535; a port is listed, and a
    /// public port published, at most once for udp and once for tcp or http.
    pub ports: Option<Vec<Port>>,
    /// The domains it answers on: at most 32 lowercase host names such as `app.example.com` or
    /// `*.example.com`, none twice.
    pub domains: Option<Vec<String>>,
    /// Plain environment variables: at most 256, keys matching `[A-Z_][A-Z0-9_]*`, values at most
    /// 4096 bytes; a credential-like name or value is refused `environment-value-is-secret`
    /// (secrets hold those).
    pub environment: Option<BTreeMap<String, String>>,
    /// Replicas, 0–64 (default 1).
    pub scale: Option<u32>,
    /// Volumes to mount: at most 32, no name or mount path twice.
    pub volumes: Option<Vec<Volume>>,
    /// The database it keeps in one of its volumes (`{engine: "sqlite", volume, path}`), backed
    /// up as a closure.
    pub database: Option<Database>,
    /// The service's mail addresses: at most 32 lowercase addresses such as app@example.com, none
    /// twice.
    pub mail_addresses: Option<Vec<String>>,
    /// The template snapshot a manager creates it from: a JSON object of at most 64 KiB.
    pub template: Option<Value>,
    /// The legacy deploy-on-push switch (default off): a push of the tag `image` names in the
    /// service's own repository pins `image` to the pushed digest.
    pub deploy_on_push: Option<bool>,
}

/// Input of `services.update`; absent fields stay as stored, a given list or map replaces the
/// stored one whole.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpdateInput {
    /// The service's id.
    pub id: String,
    /// The revision the caller read; any other current revision is refused `conflict`.
    pub expected_revision: u64,
    /// A new name: 1–63 of a-z 0-9 -, starting with a letter; unique within the organization.
    pub name: Option<String>,
    /// Accepted only when it echoes the stored organization: a service never moves.
    pub organization_id: Option<String>,
    /// A new image: an OCI image reference, e.g. registry.example.com/team/app:1.2.
    pub image: Option<String>,
    /// The ports its container listens on: at most 32, ports 1–65535; a port is listed, and a
    /// public port published, at most once for udp and once for tcp or http.
    pub ports: Option<Vec<Port>>,
    /// The domains it answers on: at most 32 lowercase host names such as `app.example.com` or
    /// `*.example.com`, none twice.
    pub domains: Option<Vec<String>>,
    /// Plain environment variables: at most 256, keys matching `[A-Z_][A-Z0-9_]*`, values at most
    /// 4096 bytes; a credential-like name or value is refused `environment-value-is-secret`
    /// (secrets hold those).
    pub environment: Option<BTreeMap<String, String>>,
    /// Replicas, 0–64.
    pub scale: Option<u32>,
    /// Volumes to mount: at most 32, no name or mount path twice.
    pub volumes: Option<Vec<Volume>>,
    /// The database it keeps in one of its volumes (`{engine: "sqlite", volume, path}`); `null`
    /// removes the declaration.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Option<Database>")]
    pub database: Option<Option<Database>>,
    /// The service's mail addresses: at most 32 lowercase addresses such as app@example.com, none
    /// twice.
    pub mail_addresses: Option<Vec<String>>,
    /// The template snapshot a manager upgrades it from: a JSON object of at most 64 KiB.
    pub template: Option<Value>,
    /// The legacy deploy-on-push switch: a push of the tag `image` names in the service's own
    /// repository pins `image` to the pushed digest.
    pub deploy_on_push: Option<bool>,
}

/// Input of `services.delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeleteInput {
    /// The service's id.
    pub id: String,
    /// The revision the caller read; any other current revision is refused `conflict`.
    pub expected_revision: u64,
}

/// Input of `services.list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListInput {
    /// Required unless the caller is an administrator.
    pub organization_id: Option<String>,
    /// Where to continue: the `nextCursor` of the previous page; absent for the first page.
    pub cursor: Option<String>,
    /// At most 200 (default 50).
    pub limit: Option<usize>,
}

/// A service as `services.get` answers it, with what still holds a deleting one.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    /// The service.
    #[serde(flatten)]
    pub service: Entity<Service>,
    /// Managers that still own something of the service (`plugin:<id>`, `host:runtime`).
    pub holds: Vec<String>,
    /// Where it runs: its runtime specs, one per cluster, with their revisions
    /// (`runtime.setServiceSpec`, docs/runtime.md).
    pub runtime: Vec<Value>,
}

/// Answer of `services.delete`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeleteAnswer {
    /// The service's id.
    pub id: String,
    /// `deleting` while managers still hold it, `deleted` once it is gone.
    pub state: String,
    /// The managers that still hold it (`plugin:<id>` or `host:<name>`); empty once it is deleted.
    pub waiting_for: Vec<String>,
}

/// A field that is present: `null` is `Some(None)`, absence stays `None` (the field's default).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> std::result::Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The database, if declared, lies in one of the service's volumes at a plain relative path.
fn check_database(service: &Service) -> Result<()> {
    let Some(db) = &service.database else { return Ok(()) };
    let volumes: Vec<&str> = service.volumes.iter().map(|v| v.name.as_str()).collect();
    rules::database(&db.volume, &db.path, &volumes)
}

fn invalid(code: &'static str, field: &str, message: String) -> Refusal {
    Refusal::new(code, message).with_data(json!({ "field": field }))
}

impl Port {
    /// The port as the field rules see it.
    fn rule(&self) -> PortRule {
        PortRule { port: self.port, udp: self.protocol == Protocol::Udp, public_port: self.public_port }
    }
}

/// Check every field a write sets (a create is checked as the update that sets everything);
/// the first mistake is named by its field.
fn check_fields(fields: &UpdateInput) -> Result<()> {
    if let Some(name) = &fields.name {
        validate::name("name", name)?;
    }
    if let Some(image) = &fields.image {
        validate::image(image)?;
    }
    if let Some(ports) = &fields.ports {
        rules::ports(&ports.iter().map(Port::rule).collect::<Vec<_>>())?;
    }
    if let Some(domains) = &fields.domains {
        rules::domains(domains)?;
    }
    if let Some(environment) = &fields.environment {
        rules::environment(environment)?;
    }
    if let Some(scale) = fields.scale {
        rules::scale(scale)?;
    }
    if let Some(volumes) = &fields.volumes {
        rules::volumes(&volumes.iter().map(|v| (v.name.as_str(), v.mount_path.as_str())).collect::<Vec<_>>())?;
    }
    if let Some(addresses) = &fields.mail_addresses {
        rules::mail_addresses(addresses)?;
    }
    if let Some(template) = &fields.template {
        rules::template(template)?;
    }
    Ok(())
}

/// Read a service or refuse `service-not-found`.
pub async fn require_service(tx: &Tx, id: &str) -> Result<Entity<Service>> {
    require(tx, SERVICES, "service", id).await
}

/// A service as `identity` may know it, with `need` allowed: one it may not read is
/// `service-not-found` exactly as a missing one, so a stranger cannot probe which ids exist;
/// one it may read but not change is `forbidden`.
pub async fn visible_service(tx: &Tx, identity: &Identity, id: &str, need: ServiceNeed) -> Result<Entity<Service>> {
    let service = require_service(tx, id).await?;
    let organization = &service.data.organization_id;
    match access::require_service(tx, identity, &service.id, organization, ServiceNeed::Read).await {
        Err(e) if e.is("forbidden") => return Err(super::not_found("service", id)),
        other => other?,
    }
    if need == ServiceNeed::Write {
        access::require_service(tx, identity, &service.id, organization, need).await?;
    }
    Ok(service)
}

/// Refuse new work for a service marked for deletion.
pub fn refuse_if_deleting(service: &Entity<Service>) -> Result<()> {
    if service.data.state == ServiceState::Deleting {
        return Err(Refusal::new("service-deleting", format!("the service {} is being deleted and takes no new work", service.data.name))
            .with_data(json!({ "id": service.id })));
    }
    Ok(())
}

async fn name_taken(tx: &Tx, organization: &str, name: &str) -> Result<bool> {
    Ok(!tx.find(SERVICES, "by_organization_name", &[json!(organization), json!(name)], None, 1).await?.documents.is_empty())
}

fn name_exists(name: &str) -> Refusal {
    Refusal::new("exists", format!("the organization has a service named {name}")).with_data(json!({ "field": "name" }))
}

/// A create checked as the update that sets everything.
fn create_fields(input: &CreateInput) -> UpdateInput {
    UpdateInput {
        id: String::new(),
        expected_revision: 0,
        name: Some(input.name.clone()),
        organization_id: Some(input.organization_id.clone()),
        image: Some(input.image.clone()),
        ports: input.ports.clone(),
        domains: input.domains.clone(),
        environment: input.environment.clone(),
        scale: input.scale,
        volumes: input.volumes.clone(),
        database: None,
        mail_addresses: input.mail_addresses.clone(),
        template: input.template.clone(),
        deploy_on_push: input.deploy_on_push,
    }
}

/// Create a service as `identity` (an owner of its organization or an administrator).
pub async fn create(store: &Store, identity: &Identity, input: CreateInput) -> Result<Entity<Service>> {
    let fields = create_fields(&input);
    check_fields(&fields)?;
    let at = now_ms();
    let service = Service {
        name: fields.name.unwrap_or_default(),
        organization_id: input.organization_id,
        image: input.image,
        ports: fields.ports.unwrap_or_default(),
        domains: fields.domains.unwrap_or_default(),
        environment: fields.environment.unwrap_or_default(),
        scale: fields.scale.unwrap_or(1),
        volumes: fields.volumes.unwrap_or_default(),
        database: input.database,
        mail_addresses: fields.mail_addresses.unwrap_or_default(),
        facets: Default::default(),
        release: None,
        registry_push: None,
        deploy_on_push: fields.deploy_on_push.unwrap_or(false),
        template: fields.template,
        state: ServiceState::Active,
        deleting_at: None,
        created_at: at,
        updated_at: at,
    };
    check_database(&service)?;
    let id = capstan_core::ids::new_id("svc");
    let (id_ref, service_ref) = (&id, &service);
    let doc = store
        .transact(|tx| async move {
            access::require_org(&tx, identity, &service_ref.organization_id, OrgRole::Owner).await?;
            require_organization(&tx, &service_ref.organization_id).await?;
            if name_taken(&tx, &service_ref.organization_id, &service_ref.name).await? {
                return Err(name_exists(&service_ref.name));
            }
            check_relay_names(&tx, &service_ref.domains).await?;
            let doc = tx.insert(SERVICES, id_ref, to_value(service_ref)?).await?;
            emit(&tx, "service.created", id_ref, summary(id_ref, service_ref)).await?;
            Ok(doc)
        })
        .await?;
    tracing::info!(service = %id, name = %service.name, organization = %service.organization_id, "service created");
    parse(&doc)
}

/// `relay-name-reserved` for a domain that is, or covers, a cluster relay's name
/// (`relay.<cluster label>.<clusterRelayZone>`, docs/relays.md): those names are Capstan's.
async fn check_relay_names(tx: &Tx, domains: &[String]) -> Result<()> {
    let settings = crate::settings::current(tx).await?;
    let Some(zone) = settings.get(crate::settings::CLUSTER_RELAY_ZONE).and_then(Value::as_str) else { return Ok(()) };
    match domains.iter().find(|d| is_relay_name(d, zone)) {
        None => Ok(()),
        Some(domain) => Err(Refusal::new(
            "relay-name-reserved",
            format!("{domain} is a cluster relay's name under the relay zone {zone}; relay names are Capstan's"),
        )
        .with_data(json!({ "field": "domains", "domain": domain, "zone": zone }))),
    }
}

/// Whether `domain` is `relay.<label>.<zone>`, or a wildcard `*.<label>.<zone>` covering one.
fn is_relay_name(domain: &str, zone: &str) -> bool {
    relay_namespace(domain, zone).is_some()
}

/// Where `domain` sits in the relay namespace of `zone`: `relay.<label>.<zone>` is
/// `Some((label, false))`, the wildcard `*.<label>.<zone>` covering it `Some((label, true))`;
/// `None` outside it. A cluster's label is its id with `_` written `-`.
pub fn relay_namespace<'d>(domain: &'d str, zone: &str) -> Option<(&'d str, bool)> {
    let rest = domain.strip_suffix(zone)?.strip_suffix('.')?;
    match rest.split_once('.') {
        Some((first @ ("relay" | "*"), label)) if !label.is_empty() && !label.contains('.') => Some((label, first == "*")),
        _ => None,
    }
}

/// What every service event carries: enough to route it, never the environment.
fn summary(id: &str, service: &Service) -> Value {
    json!({ "id": id, "name": service.name, "organizationId": service.organization_id, "state": service.state })
}

/// Update a service as `identity`; absent fields stay as stored.
pub async fn update(store: &Store, identity: &Identity, input: UpdateInput) -> Result<Entity<Service>> {
    check_fields(&input)?;
    let input = &input;
    store
        .transact(|tx| async move {
            let current = visible_service(&tx, identity, &input.id, ServiceNeed::Write).await?;
            check_revision("service", &input.id, input.expected_revision, current.revision)?;
            refuse_if_deleting(&current)?;
            if let Some(org) = &input.organization_id
                && *org != current.data.organization_id
            {
                return Err(invalid(
                    "service-organization-immutable",
                    "organizationId",
                    "a service never moves to another organization".into(),
                ));
            }
            let mut next = current.data.clone();
            if let Some(name) = &input.name
                && *name != next.name
            {
                if name_taken(&tx, &next.organization_id, name).await? {
                    return Err(name_exists(name));
                }
                next.name = name.clone();
            }
            let f = input.clone();
            next.image = f.image.unwrap_or(next.image);
            next.ports = f.ports.unwrap_or(next.ports);
            if let Some(domains) = &f.domains {
                check_relay_names(&tx, domains).await?;
            }
            next.domains = f.domains.unwrap_or(next.domains);
            next.environment = f.environment.unwrap_or(next.environment);
            next.scale = f.scale.unwrap_or(next.scale);
            next.deploy_on_push = f.deploy_on_push.unwrap_or(next.deploy_on_push);
            next.volumes = f.volumes.unwrap_or(next.volumes);
            next.database = f.database.unwrap_or(next.database);
            check_database(&next)?;
            next.mail_addresses = f.mail_addresses.unwrap_or(next.mail_addresses);
            next.template = f.template.or(next.template);
            if to_value(&next)? == to_value(&current.data)? {
                return Ok(current);
            }
            next.updated_at = now_ms();
            let doc = tx.replace(SERVICES, &input.id, current.revision, to_value(&next)?).await?;
            emit(&tx, "service.updated", &input.id, summary(&input.id, &next)).await?;
            parse(&doc)
        })
        .await
}

async fn get(cx: Context, call: Call, input: super::ById) -> Result<ServiceView> {
    let identity = call.identity()?.clone();
    let (identity, id, dependents) = (&identity, input.id.as_str(), &*cx.dependents);
    cx.store
        .transact(|tx| async move {
            let service = visible_service(&tx, identity, id, ServiceNeed::Read).await?;
            let holds = holders(&tx, dependents, id).await?;
            let runtime = dependents.service_runtime(&tx, id).await?;
            Ok(ServiceView { service, holds, runtime })
        })
        .await
}

async fn list(cx: Context, call: Call, input: ListInput) -> Result<Listing<Entity<Service>>> {
    let identity = call.identity()?.clone();
    let limit = super::page_limit(input.limit);
    let (identity, input) = (&identity, &input);
    cx.store
        .transact(|tx| async move {
            let page = match &input.organization_id {
                Some(org) => {
                    access::require_org(&tx, identity, org, OrgRole::Member).await?;
                    require_organization(&tx, org).await?;
                    tx.find(SERVICES, "by_organization", &[json!(org)], input.cursor.as_deref(), limit).await?
                }
                None if identity.is_human_admin() => tx.scan(SERVICES, input.cursor.as_deref(), limit).await?,
                None => {
                    return Err(Refusal::invalid_request("organizationId is required: name the organization whose services to list")
                        .with_data(json!({ "field": "organizationId" })));
                }
            };
            Ok(Listing { items: page.documents.iter().map(parse).collect::<Result<_>>()?, next_cursor: page.next_cursor })
        })
        .await
}

async fn delete(cx: Context, call: Call, input: DeleteInput) -> Result<DeleteAnswer> {
    let identity = call.identity()?.clone();
    let (identity_ref, input_ref) = (&identity, &input);
    cx.store
        .transact(|tx| async move {
            let current = visible_service(&tx, identity_ref, &input_ref.id, ServiceNeed::Write).await?;
            check_revision("service", &input_ref.id, input_ref.expected_revision, current.revision)?;
            if current.data.state == ServiceState::Deleting {
                // asking again is fine: the finalizer below decides whether it is done
                return Ok(());
            }
            let mut next = current.data.clone();
            next.state = ServiceState::Deleting;
            next.deleting_at = Some(now_ms());
            next.updated_at = now_ms();
            tx.replace(SERVICES, &input_ref.id, current.revision, to_value(&next)?).await?;
            emit(&tx, "service.deleting", &input_ref.id, summary(&input_ref.id, &next)).await?;
            Ok(())
        })
        .await?;
    // Crash point `service-delete:marked`: the service is `deleting` (with its event), the
    // finalizer has not run; the periodic finalizer finishes it.
    capstan_core::crash_point("service-delete:marked");
    tracing::info!(service = %input.id, actor = %identity.username, "service marked for deletion");
    let outcome = finalize_one(&cx.store, &*cx.dependents, &input.id).await?;
    Ok(DeleteAnswer { id: input.id, state: if outcome.is_empty() { "deleted".into() } else { "deleting".into() }, waiting_for: outcome })
}

/// The holders whose hold counts, as `plugin:<id>` (or `host:<name>`): a plugin that is no
/// longer installed will never release what it held, so its hold is not counted.
pub async fn holders(tx: &Tx, dependents: &dyn Dependents, service_id: &str) -> Result<Vec<String>> {
    let page = tx.find(SERVICE_HOLDS, "by_service", &[json!(service_id)], None, capstan_store::MAX_PAGE).await?;
    let mut holders = Vec::new();
    for holder in page.documents.iter().filter_map(|d| d.data["holder"].as_str()) {
        if dependents.holder_present(tx, holder).await? {
            holders.push(holder.to_string());
        }
    }
    Ok(holders)
}

fn hold_id(service_id: &str, holder: &str) -> String {
    format!("{service_id}~{holder}")
}

/// Record that `holder` owns something of the service; its deletion waits for the release.
/// A deleting service takes no new holds (`service-deleting`).
pub async fn hold(store: &Store, service_id: &str, holder: &str) -> Result<()> {
    store
        .transact(|tx| async move {
            let service = require_service(&tx, service_id).await?;
            refuse_if_deleting(&service)?;
            hold_in(&tx, service_id, holder).await
        })
        .await
}

/// [`hold`] inside the caller's transaction, which has read the service as active.
pub async fn hold_in(tx: &Tx, service_id: &str, holder: &str) -> Result<()> {
    let id = hold_id(service_id, holder);
    if tx.get(SERVICE_HOLDS, &id).await?.is_none() {
        tx.insert(SERVICE_HOLDS, &id, json!({ "serviceId": service_id, "holder": holder, "since": now_ms() })).await?;
    }
    Ok(())
}

/// Release `holder`'s hold (idempotent); the last release of a deleting service finishes it.
pub async fn release(store: &Store, dependents: &dyn Dependents, service_id: &str, holder: &str) -> Result<()> {
    let id = hold_id(service_id, holder);
    let deleting = store
        .transact(|tx| {
            let id = id.clone();
            async move {
                if let Some(doc) = tx.get(SERVICE_HOLDS, &id).await? {
                    tx.delete(SERVICE_HOLDS, &id, doc.revision).await?;
                }
                Ok(tx.get(SERVICES, service_id).await?.is_some_and(|d| d.data["state"] == "deleting"))
            }
        })
        .await?;
    if deleting {
        finalize_one(store, dependents, service_id).await?;
    }
    Ok(())
}

/// Finish one deleting service if nothing holds it any more. Answers who still holds it
/// (empty: it is gone, or was never there).
pub async fn finalize_one(store: &Store, dependents: &dyn Dependents, service_id: &str) -> Result<Vec<String>> {
    let waiting = store
        .transact(|tx| async move {
            let Some(doc) = tx.get(SERVICES, service_id).await? else { return Ok(Vec::new()) };
            let service: Entity<Service> = parse(&doc)?;
            if service.data.state != ServiceState::Deleting {
                return Ok(vec![]);
            }
            let waiting = holders(&tx, dependents, service_id).await?;
            if !waiting.is_empty() {
                return Ok(waiting);
            }
            // gone for good: its holds and grants go with the row, page by page
            for collection in [SERVICE_HOLDS, SERVICE_GRANTS] {
                loop {
                    let page = tx.find(collection, "by_service", &[json!(service_id)], None, capstan_store::MAX_PAGE).await?;
                    for doc in &page.documents {
                        tx.delete(collection, &doc.id, doc.revision).await?;
                    }
                    if page.next_cursor.is_none() {
                        break;
                    }
                }
            }
            // what other areas keep on it goes too (its secrets are revoked, say)
            dependents.service_removed(&tx, service_id).await?;
            // Crash point `service-delete:finalizing`: half of the finalizer's transaction is
            // written and not committed; the store must roll all of it back.
            capstan_core::crash_point("service-delete:finalizing");
            tx.delete(SERVICES, service_id, service.revision).await?;
            emit(&tx, "service.deleted", service_id, summary(service_id, &service.data)).await?;
            tracing::info!(service = %service_id, name = %service.data.name, "service deleted");
            Ok(Vec::new())
        })
        .await?;
    Ok(waiting)
}

/// The level-triggered sweep: try to finish every deleting service. Answers how many were
/// finished and how many still wait.
pub async fn finalize_deleting(store: &Store, dependents: &dyn Dependents) -> Result<(usize, usize)> {
    let (mut finished, mut waiting) = (0, 0);
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .transact(|tx| {
                let cursor = cursor.clone();
                async move { tx.find(SERVICES, "by_state", &[json!("deleting")], cursor.as_deref(), 100).await }
            })
            .await?;
        for doc in &page.documents {
            if finalize_one(store, dependents, &doc.id).await?.is_empty() {
                finished += 1;
            } else {
                waiting += 1;
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok((finished, waiting)),
        }
    }
}

/// A service id that must exist, for grants and other references.
pub async fn require_active(tx: &Tx, id: &str) -> Result<Entity<Service>> {
    let service = require_service(tx, id).await?;
    refuse_if_deleting(&service)?;
    Ok(service)
}

/// What checking a service's fields may refuse ([`check_fields`]), each naming its field.
const FIELD_REFUSALS: &[&str] = &[
    "name-invalid",
    "image-invalid",
    "port-invalid",
    "port-duplicate",
    "domain-invalid",
    "domain-duplicate",
    "relay-name-reserved",
    "environment-key-invalid",
    "environment-value-invalid",
    "environment-value-is-secret",
    "scale-invalid",
    "volume-invalid",
    "database-volume-unknown",
    "database-path-invalid",
    "mail-address-invalid",
    "template-invalid",
    "too-many-items",
];

/// Register the `services.*` methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "services.create",
            "Create a service in an organization (owner); every field validated, credential-like environment refused",
            Access::Owner,
            |cx: Context, call: Call, input: CreateInput| async move { create(&cx.store, call.identity()?, input).await },
        )
        .refuses(FIELD_REFUSALS)
        .refuses(&["organization-not-found", "exists"]);
    registry
        .add(
            "services.update",
            "Change a service's fields with its expected revision (owner); absent fields stay",
            Access::Owner,
            |cx: Context, call: Call, input: UpdateInput| async move { update(&cx.store, call.identity()?, input).await },
        )
        .refuses(FIELD_REFUSALS)
        .refuses(&["service-not-found", "conflict", "service-deleting", "service-organization-immutable", "exists"]);
    registry
        .add("services.get", "One service and what still holds it (member, or a deployer granted deployment:status)", Access::Member, get)
        .refuses(&["service-not-found"])
        .read_only();
    registry
        .add("services.list", "An organization's services, paged (member; an administrator may list all)", Access::Member, list)
        .refuses(&["organization-not-found"])
        .read_only();
    registry
        .add("services.delete", "Mark a service for deletion (owner); it is removed once no manager holds it", Access::Owner, delete)
        .refuses(&["service-not-found", "conflict"]);
}

#[cfg(test)]
mod relay_name_tests {
    use super::{is_relay_name, relay_namespace};

    #[test]
    fn relay_names_and_wildcards_covering_them_are_reserved() {
        let zone = "relays.example.com";
        assert!(is_relay_name("relay.cluster-0f3a.relays.example.com", zone));
        assert!(is_relay_name("*.cluster-0f3a.relays.example.com", zone));
        assert_eq!(relay_namespace("relay.cluster-0f3a.relays.example.com", zone), Some(("cluster-0f3a", false)));
        assert_eq!(relay_namespace("*.cluster-0f3a.relays.example.com", zone), Some(("cluster-0f3a", true)));
        for free in [
            "relays.example.com",
            "app.relays.example.com",
            "relay.a.b.relays.example.com",
            "relay.cluster-1.example.com",
            "xrelays.example.com",
            "relay..relays.example.com",
        ] {
            assert!(!is_relay_name(free, zone), "{free}");
        }
    }
}
