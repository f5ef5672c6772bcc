//! SecretSets: an organization's shared secrets, attached to its services. A service's
//! secret configuration — which sets are attached, in which order — carries its own
//! `secretsRevision`, which every attach and detach states (compare-and-swap) and advances.
//! Attaching, detaching and retiring publish the affected services' manifests in the same
//! transaction; retiring a set detaches it from every service at once.

use super::manifests::{self, Conflict, Resolved};
use super::methods::Context;
use super::methods::{Owner, SecretView};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::{Entity, Listing, check_revision, emit, parse, require, to_value};
use capstan_rpc::receipts;
use capstan_rpc::{Access, Call, Registry};
use capstan_store::{CollectionSpec, Store, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The SecretSets (unique by organization and name).
pub const SETS: &str = "secret_sets";
/// One document per attached set of a service (id `<serviceId>~<secretSetId>`).
pub const ATTACHMENTS: &str = "secret_set_attachments";
/// Each service's secrets revision (id = service id; absent means 0).
pub const CONFIGURATIONS: &str = "service_secret_configurations";

/// Declare the SecretSet, attachment and service configuration collections in the store.
pub async fn declare(store: &Store) -> Result<()> {
    store
        .declare(
            CollectionSpec::new(SETS)
                .unique("by_organization_name", &["organizationId", "name"])
                .index("by_organization", &["organizationId"]),
        )
        .await?;
    store.declare(CollectionSpec::new(ATTACHMENTS).index("by_service", &["serviceId"]).index("by_set", &["secretSetId"])).await?;
    store.declare(CollectionSpec::new(CONFIGURATIONS)).await
}

/// Whether a SecretSet can still be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SetState {
    /// In use: it takes new member secrets and attachments.
    Active,
    /// Retired: detached from every service; it takes no new secret, attachment or update.
    Retired,
}

/// An organization's SecretSet: a named group of shared secrets its services attach.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretSet {
    /// The organization it belongs to.
    pub organization_id: String,
    /// Its name, unique within the organization.
    pub name: String,
    /// Free text, at most 500 characters (empty when none).
    #[serde(default)]
    pub description: String,
    /// Whether it is active or retired.
    pub state: SetState,
    /// When it was created (milliseconds since the epoch).
    pub created_at: u64,
    /// When it last changed (milliseconds since the epoch).
    pub updated_at: u64,
    /// When it was retired (milliseconds since the epoch); absent while active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_at: Option<u64>,
}

/// A SecretSet attached to a service.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// The service it is attached to.
    pub service_id: String,
    /// The attached SecretSet.
    pub secret_set_id: String,
    /// The organization of the service and the set.
    pub organization_id: String,
    /// The service's secrets revision the attachment was made at: the resolution order.
    pub position: u64,
    /// When it was attached (milliseconds since the epoch).
    pub attached_at: u64,
}

/// A service's secret configuration as answered.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Configuration {
    /// The service.
    pub service_id: String,
    /// The service's secrets revision: every attach and detach advances it (0 before the first).
    pub secrets_revision: u64,
    /// In resolution order: an earlier set wins a key a later one also provides.
    pub attachments: Vec<Attachment>,
}

/// Parameters of `secrets.createSecretSet`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateInput {
    /// The organization the SecretSet belongs to.
    pub organization_id: String,
    /// 1–63 of a-z 0-9 -, starting with a letter; unique within the organization.
    pub name: String,
    /// Free text, at most 500 characters, without control characters (default empty).
    pub description: Option<String>,
}

/// Parameters of `secrets.updateSecretSet`: the fields to change.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpdateInput {
    /// The SecretSet's id.
    pub id: String,
    /// The SecretSet's revision the caller read; another one is `conflict`.
    pub expected_revision: u64,
    /// A new name, by the same rules as at creation; absent keeps the current one.
    pub name: Option<String>,
    /// A new description, by the same rules as at creation; absent keeps the current one.
    pub description: Option<String>,
}

/// Parameters of `secrets.retireSecretSet`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetireInput {
    /// The SecretSet's id.
    pub id: String,
    /// The SecretSet's revision the caller read; another one is `conflict`.
    pub expected_revision: u64,
    /// Repeating the same request with this id answers the first answer again.
    pub mutation_id: Option<String>,
}

/// The answer of `secrets.retireSecretSet`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retired {
    /// The SecretSet, now retired.
    pub secret_set: Entity<SecretSet>,
    /// The services it was detached from (each got its next manifest).
    pub detached_service_ids: Vec<String>,
}

/// Parameters of `secrets.listSecretSets`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListInput {
    /// Only this organization's SecretSets; absent lists every organization's.
    pub organization_id: Option<String>,
    /// Where to continue: the `nextCursor` of the previous page; absent for the first page.
    pub cursor: Option<String>,
    /// At most 200 (default 50).
    pub limit: Option<usize>,
}

/// The answer of `secrets.getSecretSet`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetDetail {
    /// The SecretSet.
    #[serde(flatten)]
    pub secret_set: Entity<SecretSet>,
    /// Its member secrets' metadata.
    pub secrets: Vec<SecretView>,
    /// The services it is attached to.
    pub attached_service_ids: Vec<String>,
}

/// Parameters of `secrets.attachSecretSet` and `secrets.detachSecretSet`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AttachInput {
    /// The service to attach the SecretSet to or detach it from.
    pub service_id: String,
    /// The SecretSet's id; attaching needs it active and in the service's organization.
    pub secret_set_id: String,
    /// The service's `secretsRevision` the caller read; another one is `conflict`.
    pub expected_secrets_revision: u64,
    /// Repeating the same request with this id answers the first answer again.
    pub mutation_id: Option<String>,
}

/// A request naming one service.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceRef {
    /// The service's id.
    pub service_id: String,
}

/// One key of a resolution preview: where it resolves from, never its value.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviewEntry {
    /// The environment the key is in.
    pub environment: String,
    /// The key.
    pub key: String,
    /// The secret version it resolves to, and from where.
    #[serde(flatten)]
    pub resolved: Resolved,
}

/// The answer of `secrets.previewResolution`: where each key of a service resolves from.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    /// The service.
    pub service_id: String,
    /// The service's current secrets revision.
    pub secrets_revision: u64,
    /// The newest published manifest (0 before the first).
    pub manifest_number: u64,
    /// Every key that resolves, by environment, then key.
    pub entries: Vec<PreviewEntry>,
    /// Every key more than one source provides.
    pub conflicts: Vec<Conflict>,
}

async fn require_set(tx: &Tx, id: &str) -> Result<Entity<SecretSet>> {
    require(tx, SETS, "secret-set", id).await
}

/// A set new secrets and attachments may use: it exists, belongs to `organization_id` and is
/// not retired.
pub async fn require_usable(tx: &Tx, id: &str, organization_id: &str) -> Result<Entity<SecretSet>> {
    let set = require_set(tx, id).await?;
    if set.data.organization_id != organization_id {
        return Err(Refusal::new(
            "secret-set-organization-mismatch",
            format!("the SecretSet {id} belongs to another organization than {organization_id}"),
        )
        .with_data(json!({ "secretSetId": id, "organizationId": set.data.organization_id })));
    }
    if set.data.state == SetState::Retired {
        return Err(Refusal::new("secret-set-retired", format!("the SecretSet {} is retired", set.data.name))
            .with_data(json!({ "secretSetId": id })));
    }
    Ok(set)
}

/// A service's attachments in resolution order.
pub async fn attachments(tx: &Tx, service_id: &str) -> Result<Vec<Attachment>> {
    let mut found: Vec<Attachment> = tx
        .find_all(ATTACHMENTS, "by_service", &[json!(service_id)])
        .await?
        .iter()
        .map(|d| Ok(parse::<Attachment>(d)?.data))
        .collect::<Result<_>>()?;
    found.sort_by_key(|a| a.position);
    Ok(found)
}

/// The services a set is attached to.
pub async fn attached_services(tx: &Tx, secret_set_id: &str) -> Result<Vec<String>> {
    tx.find_all(ATTACHMENTS, "by_set", &[json!(secret_set_id)]).await?.iter().map(|d| Ok(parse::<Attachment>(d)?.data.service_id)).collect()
}

async fn secrets_revision(tx: &Tx, service_id: &str) -> Result<(Option<u64>, u64)> {
    let doc = tx.get(CONFIGURATIONS, service_id).await?;
    Ok(match doc {
        Some(doc) => (Some(doc.revision), doc.data["secretsRevision"].as_u64().unwrap_or(0)),
        None => (None, 0),
    })
}

/// Advance a service's secrets revision; answers the new one.
async fn advance(tx: &Tx, service_id: &str) -> Result<u64> {
    let (doc_revision, revision) = secrets_revision(tx, service_id).await?;
    tx.put(CONFIGURATIONS, service_id, doc_revision, json!({ "secretsRevision": revision + 1 })).await?;
    Ok(revision + 1)
}

async fn configuration(tx: &Tx, service_id: &str) -> Result<Configuration> {
    Ok(Configuration {
        service_id: service_id.into(),
        secrets_revision: secrets_revision(tx, service_id).await?.1,
        attachments: attachments(tx, service_id).await?,
    })
}

fn attachment_id(service_id: &str, secret_set_id: &str) -> String {
    format!("{service_id}~{secret_set_id}")
}

/// A service is gone: its attachments and secrets revision go with it.
pub async fn forget_service(tx: &Tx, service_id: &str) -> Result<()> {
    for doc in tx.find_all(ATTACHMENTS, "by_service", &[json!(service_id)]).await? {
        tx.delete(ATTACHMENTS, &doc.id, doc.revision).await?;
    }
    if let Some(doc) = tx.get(CONFIGURATIONS, service_id).await? {
        tx.delete(CONFIGURATIONS, service_id, doc.revision).await?;
    }
    Ok(())
}

/// Active SecretSets of an organization (an organization with one is not deleted).
pub async fn has_active(tx: &Tx, organization_id: &str) -> Result<bool> {
    let sets = tx.find_all(SETS, "by_organization", &[json!(organization_id)]).await?;
    Ok(sets.iter().any(|d| d.data["state"] == "active"))
}

fn check_description(description: &str) -> Result<()> {
    if description.chars().count() > 500 || description.chars().any(char::is_control) {
        return Err(Refusal::invalid_request("a description is at most 500 characters, without control characters")
            .with_data(json!({ "field": "description" })));
    }
    Ok(())
}

async fn refuse_taken_name(tx: &Tx, organization_id: &str, name: &str, except: Option<&str>) -> Result<()> {
    let taken = tx.find(SETS, "by_organization_name", &[json!(organization_id), json!(name)], None, 1).await?;
    match taken.documents.first() {
        Some(doc) if Some(doc.id.as_str()) != except => {
            Err(Refusal::new("exists", format!("the organization already has a SecretSet named {name}")).with_data(json!({ "id": doc.id })))
        }
        _ => Ok(()),
    }
}

async fn create(cx: Context, _: Call, input: CreateInput) -> Result<Entity<SecretSet>> {
    capstan_inventory::validate::name("name", &input.name)?;
    let description = input.description.clone().unwrap_or_default();
    check_description(&description)?;
    let id = capstan_core::ids::new_id("sset");
    let (input, id, description) = (&input, &id, &description);
    let set = cx
        .store
        .transact(|tx| async move {
            capstan_inventory::organizations::require_organization(&tx, &input.organization_id).await?;
            refuse_taken_name(&tx, &input.organization_id, &input.name, None).await?;
            let at = now_ms();
            let set = SecretSet {
                organization_id: input.organization_id.clone(),
                name: input.name.clone(),
                description: description.clone(),
                state: SetState::Active,
                created_at: at,
                updated_at: at,
                retired_at: None,
            };
            let doc = tx.insert(SETS, id, to_value(&set)?).await?;
            emit(&tx, "secretSet.created", id, json!({ "id": id, "organizationId": set.organization_id, "name": set.name })).await?;
            Ok(Entity { id: id.clone(), revision: doc.revision, data: set })
        })
        .await?;
    tracing::info!(secret_set = %set.id, organization = %set.data.organization_id, "SecretSet created");
    Ok(set)
}

async fn update(cx: Context, _: Call, input: UpdateInput) -> Result<Entity<SecretSet>> {
    if let Some(name) = &input.name {
        capstan_inventory::validate::name("name", name)?;
    }
    if let Some(description) = &input.description {
        check_description(description)?;
    }
    let input = &input;
    cx.store
        .transact(|tx| async move {
            let mut set = require_set(&tx, &input.id).await?;
            check_revision("secret-set", &input.id, input.expected_revision, set.revision)?;
            if set.data.state == SetState::Retired {
                return Err(Refusal::new("secret-set-retired", format!("the SecretSet {} is retired", set.data.name)));
            }
            if let Some(name) = &input.name {
                refuse_taken_name(&tx, &set.data.organization_id, name, Some(&input.id)).await?;
                set.data.name = name.clone();
            }
            if let Some(description) = &input.description {
                set.data.description = description.clone();
            }
            set.data.updated_at = now_ms();
            let doc = tx.replace(SETS, &input.id, set.revision, to_value(&set.data)?).await?;
            emit(&tx, "secretSet.updated", &input.id, json!({ "id": input.id, "name": set.data.name })).await?;
            Ok(Entity { revision: doc.revision, ..set })
        })
        .await
}

/// Detach `secret_set_id` from a service inside `tx`: advance its revision, publish its manifest.
async fn detach_in(tx: &Tx, service_id: &str, secret_set_id: &str) -> Result<()> {
    let id = attachment_id(service_id, secret_set_id);
    let doc = tx.require(ATTACHMENTS, &id).await?;
    tx.delete(ATTACHMENTS, &id, doc.revision).await?;
    let revision = advance(tx, service_id).await?;
    emit(
        tx,
        "service.secretSetDetached",
        service_id,
        json!({ "serviceId": service_id, "secretSetId": secret_set_id, "secretsRevision": revision }),
    )
    .await?;
    manifests::publish(tx, service_id).await.map(drop)
}

async fn retire(cx: Context, call: Call, input: RetireInput) -> Result<Retired> {
    let receipt_keys = &capstan_auth::receipt_keys(&cx.keyring);
    let actor = call.identity()?.user_id.clone();
    let (input, actor) = (&input, actor.as_str());
    let retired = cx
        .store
        .transact(|tx| async move {
            if let Some(answer) =
                receipts::replay(&tx, receipt_keys, actor, input.mutation_id.as_deref(), &("secrets.retireSecretSet", input)).await?
            {
                return Ok(answer);
            }
            let mut set = require_set(&tx, &input.id).await?;
            check_revision("secret-set", &input.id, input.expected_revision, set.revision)?;
            if set.data.state == SetState::Retired {
                return Err(Refusal::new("secret-set-retired", format!("the SecretSet {} is already retired", set.data.name)));
            }
            let services = attached_services(&tx, &input.id).await?;
            for service_id in &services {
                detach_in(&tx, service_id, &input.id).await?;
            }
            let at = now_ms();
            set.data.state = SetState::Retired;
            set.data.retired_at = Some(at);
            set.data.updated_at = at;
            let doc = tx.replace(SETS, &input.id, set.revision, to_value(&set.data)?).await?;
            emit(&tx, "secretSet.retired", &input.id, json!({ "id": input.id, "detachedServiceIds": services })).await?;
            let answer = Retired { secret_set: Entity { revision: doc.revision, ..set }, detached_service_ids: services };
            receipts::record(&tx, receipt_keys, actor, input.mutation_id.as_deref(), &("secrets.retireSecretSet", input), &answer).await?;
            Ok(answer)
        })
        .await?;
    tracing::info!(secret_set = %input.id, detached = retired.detached_service_ids.len(), "SecretSet retired");
    Ok(retired)
}

async fn list(cx: Context, _: Call, input: ListInput) -> Result<Listing<Entity<SecretSet>>> {
    let limit = capstan_inventory::page_limit(input.limit);
    let input = &input;
    cx.store
        .transact(|tx| async move {
            let cursor = input.cursor.as_deref();
            let page = match &input.organization_id {
                Some(org) => tx.find(SETS, "by_organization", &[json!(org)], cursor, limit).await?,
                None => tx.scan(SETS, cursor, limit).await?,
            };
            let items = page.documents.iter().map(parse).collect::<Result<_>>()?;
            Ok(Listing { items, next_cursor: page.next_cursor })
        })
        .await
}

async fn get(cx: Context, _: Call, input: capstan_inventory::ById) -> Result<SetDetail> {
    let id = input.id.as_str();
    cx.store
        .transact(|tx| async move {
            let set = require_set(&tx, id).await?;
            let owner = Owner::Organization { organization_id: set.data.organization_id.clone(), secret_set_id: id.into() };
            let mut secrets = Vec::new();
            for doc in tx.find_all(super::methods::SECRETS, "by_owner", &[json!(owner.reference())]).await? {
                secrets.push(super::methods::view(&doc.id, doc.revision, super::methods::parse_secret(&doc)?));
            }
            let attached_service_ids = attached_services(&tx, id).await?;
            Ok(SetDetail { secret_set: set, secrets, attached_service_ids })
        })
        .await
}

/// Attach (`attach: true`) or detach a set, stating the service's secrets revision.
async fn change_attachment(cx: Context, call: Call, input: AttachInput, attach: bool) -> Result<Configuration> {
    let receipt_keys = &capstan_auth::receipt_keys(&cx.keyring);
    let method = if attach { "secrets.attachSecretSet" } else { "secrets.detachSecretSet" };
    let actor = call.identity()?.user_id.clone();
    let (input, actor) = (&input, actor.as_str());
    let answer = cx
        .store
        .transact(|tx| async move {
            if let Some(answer) = receipts::replay(&tx, receipt_keys, actor, input.mutation_id.as_deref(), &(method, input)).await? {
                return Ok(answer);
            }
            let service = capstan_inventory::services::require_active(&tx, &input.service_id).await?;
            let (_, revision) = secrets_revision(&tx, &input.service_id).await?;
            if revision != input.expected_secrets_revision {
                return Err(Refusal::new(
                    "conflict",
                    format!("the service's secrets are at revision {revision}, not {}: read them again", input.expected_secrets_revision),
                )
                .with_data(json!({ "serviceId": input.service_id, "secretsRevision": revision })));
            }
            let attached = tx.get(ATTACHMENTS, &attachment_id(&input.service_id, &input.secret_set_id)).await?.is_some();
            if attach {
                if attached {
                    return Err(Refusal::new("secret-set-already-attached", "the SecretSet is already attached to this service")
                        .with_data(json!({ "secretSetId": input.secret_set_id })));
                }
                // every attachment is checked again, so a missing or retired set never resolves
                require_usable(&tx, &input.secret_set_id, &service.data.organization_id).await?;
                let position = advance(&tx, &input.service_id).await?;
                let attachment = Attachment {
                    service_id: input.service_id.clone(),
                    secret_set_id: input.secret_set_id.clone(),
                    organization_id: service.data.organization_id.clone(),
                    position,
                    attached_at: now_ms(),
                };
                tx.insert(ATTACHMENTS, &attachment_id(&input.service_id, &input.secret_set_id), to_value(&attachment)?).await?;
                let data = json!({ "serviceId": input.service_id, "secretSetId": input.secret_set_id, "secretsRevision": position });
                emit(&tx, "service.secretSetAttached", &input.service_id, data).await?;
                manifests::publish(&tx, &input.service_id).await?;
            } else {
                if !attached {
                    return Err(Refusal::new("secret-set-not-attached", "the SecretSet is not attached to this service")
                        .with_data(json!({ "secretSetId": input.secret_set_id })));
                }
                detach_in(&tx, &input.service_id, &input.secret_set_id).await?;
            }
            let answer = configuration(&tx, &input.service_id).await?;
            receipts::record(&tx, receipt_keys, actor, input.mutation_id.as_deref(), &(method, input), &answer).await?;
            Ok(answer)
        })
        .await?;
    tracing::info!(service = %input.service_id, secret_set = %input.secret_set_id, method, revision = answer.secrets_revision, "secret configuration changed");
    Ok(answer)
}

async fn preview(cx: Context, _: Call, input: ServiceRef) -> Result<Preview> {
    let service_id = input.service_id.as_str();
    cx.store
        .transact(|tx| async move {
            capstan_inventory::services::require_service(&tx, service_id).await?;
            let resolution = manifests::resolution(&tx, service_id).await?;
            let entries = resolution
                .entries
                .into_iter()
                .flat_map(|(environment, keys)| {
                    keys.into_iter().map(move |(key, resolved)| PreviewEntry { environment: environment.clone(), key, resolved })
                })
                .collect();
            Ok(Preview {
                service_id: service_id.into(),
                secrets_revision: secrets_revision(&tx, service_id).await?.1,
                manifest_number: manifests::head(&tx, service_id).await?,
                entries,
                conflicts: resolution.conflicts,
            })
        })
        .await
}

/// Register the SecretSet methods: create, update, retire, list and get SecretSets, a service's
/// configuration, attach, detach and the resolution preview.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add("secrets.createSecretSet", "Create an organization's SecretSet (shared secrets its services attach)", Access::Admin, create)
        .refuses(&["name-invalid", "organization-not-found", "exists"]);
    registry.add("secrets.updateSecretSet", "Rename or describe a SecretSet, stating its revision", Access::Admin, update).refuses(&[
        "name-invalid",
        "secret-set-not-found",
        "conflict",
        "secret-set-retired",
        "exists",
    ]);
    registry
        .add(
            "secrets.retireSecretSet",
            "Retire a SecretSet: detached from every service, each service's manifest published, in one transaction",
            Access::Admin,
            retire,
        )
        .refuses(&["mutation-reused", "secret-set-not-found", "conflict", "secret-set-retired"]);
    registry.add("secrets.listSecretSets", "SecretSets, all or one organization's, paged", Access::Admin, list).read_only();
    registry
        .add("secrets.getSecretSet", "A SecretSet with its member secrets' metadata and the services it is attached to", Access::Admin, get)
        .refuses(&["secret-set-not-found"])
        .read_only();
    registry
        .add(
            "secrets.getServiceConfiguration",
            "A service's secrets revision and attached SecretSets in resolution order",
            Access::Admin,
            |cx: Context, _: Call, input: ServiceRef| async move {
                let service_id = input.service_id.as_str();
                cx.store
                    .transact(|tx| async move {
                        capstan_inventory::services::require_service(&tx, service_id).await?;
                        configuration(&tx, service_id).await
                    })
                    .await
            },
        )
        .refuses(&["service-not-found"])
        .read_only();
    registry
        .add(
            "secrets.attachSecretSet",
            "Attach a SecretSet to a service, stating the service's secrets revision",
            Access::Admin,
            |cx: Context, call: Call, input: AttachInput| change_attachment(cx, call, input, true),
        )
        .refuses(&[
            "mutation-reused",
            "service-not-found",
            "service-deleting",
            "conflict",
            "secret-set-already-attached",
            "secret-set-not-found",
            "secret-set-organization-mismatch",
            "secret-set-retired",
        ]);
    registry
        .add(
            "secrets.detachSecretSet",
            "Detach a SecretSet from a service, stating the service's secrets revision",
            Access::Admin,
            |cx: Context, call: Call, input: AttachInput| change_attachment(cx, call, input, false),
        )
        .refuses(&["mutation-reused", "service-not-found", "service-deleting", "conflict", "secret-set-not-attached"]);
    registry.add(
        "secrets.previewResolution",
        "Which key of a service resolves from where (its own secrets, then attached SecretSets in order) and every conflict; value-free",
        Access::Admin,
        preview,
    ).refuses(&["service-not-found"]).read_only();
}
