//! The bindings manager (docs/bindings.md): a service asks for a database or a bucket and gets
//! one.
//!
//! - `bindings.create` records a binding of a service (`database` on `postgresql`,
//!   `objectstorage` on `s3`), places it on
//!   the one node the service's runtime spec pins (a spec on every node or on several is refused
//!   `binding-placement-ambiguous`; without a spec it waits `binding-unplaced`), holds the
//!   service (its deletion waits until its bindings are deleted, the data kept or dropped by
//!   explicit choice) and gates its replicas (`bindings-pending`) until the binding is ready.
//! - The host provisions it (`storage.provision`: a role and a database on the node's PostgreSQL
//!   server, or a bucket and a key pair limited to it on its S3 endpoint, the credentials
//!   published as the service's secrets `DATABASE_URL`, `PG*` or `S3_*`); the plugin sees no
//!   credential. Provisioning is idempotent, so the reconcile pass simply asks
//!   again for every binding not ready, after a crash or an unreachable server.
//! - A service whose template snapshot (an App Store install) declares `database` or
//!   `objectstorage` among its capabilities is given those bindings when it is created or
//!   updated (`main` on postgresql, `files` on s3), as the manager's own work.
//! - `bindings.delete` revokes the credentials first (secrets revoked, login disabled, sessions
//!   ended), then drops the data when asked (`data: drop`) or keeps it (`data: keep`).
//! - The service's facet (`facets.bindings`) lists its bindings for the Bindings card: kind,
//!   engine, node, state and the names of its secrets, never a value.

use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::storage::{self, Binding as StorageBinding, Kind};
use capstan_sdk::store::{self, Batch, Doc};
use capstan_sdk::{
    CollectionSpec, Context, Descriptor, Event, JsonSchema, Manager, ReconcileOutcome, ReconcileTrigger, Refusal, Result, Role, json, log,
    now_ms, runtime,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::time::Duration;

const BINDINGS: &str = "bindings";
/// The reason a service's replicas wait while a binding of it is not ready.
const PENDING: &str = "bindings-pending";
/// What has a provider: (kind, engine).
const SUPPORTED: &[(&str, &str)] = &[("database", "postgresql"), ("objectstorage", "s3")];
/// At most this many bindings per service.
const MAX_PER_SERVICE: usize = 8;

struct BindingsManager;

impl Manager for BindingsManager {
    fn describe() -> Descriptor {
        Descriptor::new()
            .refusal("binding-placement-ambiguous", 409, "The service runs on every node or on several: a binding lives on one node")
            .refusal("binding-exists", 409, "The service already has a binding of that name")
            .refusal("binding-environment-conflict", 409, "The service already has a binding of that kind: its secrets would collide")
            .refusal(
                "binding-engine-unsupported",
                422,
                "No provider of that engine: Capstan provides database on postgresql and objectstorage on s3",
            )
            .refusal("binding-not-found", 404, "No such binding in this organization")
            .refusal("binding-limit", 409, "The service has as many bindings as it may")
            .method("create", "Give a service a database or a bucket on the storage endpoint of the node it runs on.", Role::Owner, create)
            .method("get", "One binding: kind, engine, node, state, the names of its secrets.", Role::Member, get)
            .read_only()
            .method("list", "The bindings of a service, or of the organization.", Role::Member, list)
            .read_only()
            .method("delete", "Revoke a binding's credentials, then keep or drop its data.", Role::Owner, delete)
            .facet::<ServiceFacet>(EntityKind::Service, "The service's bindings: kind, engine, node, state and the names of their secrets")
            .panel(EntityKind::Service, "Bindings", "service-panel")
            .collection(CollectionSpec::new(BINDINGS).index("by_service", &["serviceId"]).index("by_org", &["organizationId"]))
            .subscribe("service.created")
            .subscribe("service.updated")
            .subscribe("service.deleting")
            .subscribe("runtime.spec-set")
            .reconcile_every(Duration::from_secs(10))
    }

    /// A service created or updated gets the bindings its template declares; anything else
    /// (a spec set, a service going) only hints the reconcile loop.
    fn on_event(_ctx: &Context, event: Event) -> Result<()> {
        if event.kind == "service.created" || event.kind == "service.updated" {
            declared(&event.subject)?;
        }
        Ok(())
    }

    fn reconcile(_ctx: &Context, _trigger: ReconcileTrigger) -> Result<ReconcileOutcome> {
        let mut services = BTreeSet::new();
        let (mut ready, mut failures) = (0, Vec::new());
        let mut cursor = None;
        loop {
            let page = store::scan::<Binding>(BINDINGS, cursor.as_deref(), 100)?;
            for doc in page.documents {
                services.insert(doc.data.service_id.clone());
                match converge(doc) {
                    Ok(true) => ready += 1,
                    Ok(false) => {}
                    Err(refusal) => failures.push(refusal.code().to_string()),
                }
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        for service_id in &services {
            if let Err(refusal) = publish(service_id) {
                failures.push(format!("{service_id}: {}", refusal.code()));
            }
        }
        let mut summary = format!("{} bindings ready of {} services' bindings", ready, services.len());
        if !failures.is_empty() {
            summary.push_str(&format!("; failed: {}", failures.join(", ")));
        }
        Ok(ReconcileOutcome::done(summary))
    }
}

capstan_sdk::manager!(BindingsManager);

// ---- records ----

/// What a binding gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
enum BindingKind {
    /// A PostgreSQL role and a database of its own.
    Database,
    /// A bucket and a key pair limited to it.
    Objectstorage,
}

/// Where a binding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
enum State {
    /// Not provisioned yet (why: `reason`); the service's replicas wait.
    Pending,
    /// Provisioned: its credentials are the service's secrets.
    Ready,
    /// Being deleted: credentials revoked first, then the data kept or dropped.
    Deleting,
}

/// Keep or drop a deleted binding's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
enum DataChoice {
    /// The database and its role stay (the role cannot log in).
    Keep,
    /// The database and its role are dropped.
    Drop,
}

/// A binding (`bindings/<id>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Binding {
    /// `bnd_<hex>`: the provider's names derive from it.
    id: String,
    service_id: String,
    organization_id: String,
    /// The operator's name for it, unique per service.
    name: String,
    kind: BindingKind,
    engine: String,
    /// The node it lives on, once placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    state: State,
    /// Why it is not ready (a refusal code: `binding-unplaced`, `database-endpoint-missing`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Where the workload reaches it, once provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
    /// The database (and its role) at the provider, once provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resource: Option<String>,
    /// The service's secrets holding its credentials (names only).
    #[serde(default)]
    secret_keys: Vec<String>,
    /// For a binding being deleted: what becomes of its data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<DataChoice>,
    created_at: u64,
    updated_at: u64,
}

/// The service's facet: its bindings, value-free.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ServiceFacet {
    bindings: Vec<FacetEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct FacetEntry {
    id: String,
    name: String,
    kind: BindingKind,
    engine: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// The names of the variables its secrets set (a facet names no credential, only where
    /// they go).
    variables: Vec<String>,
}

/// The part of a service this manager reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Service {
    organization_id: String,
    #[serde(default)]
    state: Option<String>,
    /// The App Store's snapshot of the template it was installed from, if it was.
    #[serde(default)]
    template: Option<serde_json::Value>,
}

/// The bindings a template declares: (kind, engine, name) for each storage capability.
fn declared_by(template: &serde_json::Value) -> Vec<(BindingKind, &'static str, &'static str)> {
    let capabilities = template["template"]["capabilities"].as_array().map(Vec::as_slice).unwrap_or_default();
    let has = |name: &str| capabilities.iter().any(|c| c == name);
    let mut out = Vec::new();
    if has("database") {
        out.push((BindingKind::Database, "postgresql", "main"));
    }
    if has("objectstorage") {
        out.push((BindingKind::Objectstorage, "s3", "files"));
    }
    out
}

/// Give the service the bindings its template declares that it has no binding of that kind for.
fn declared(service_id: &str) -> Result<()> {
    let Some(service) = inventory::get::<Service>(EntityKind::Service, service_id)? else { return Ok(()) };
    if service.data.state.as_deref() == Some("deleting") {
        return Ok(());
    }
    let Some(template) = &service.data.template else { return Ok(()) };
    let existing = of_service(service_id)?;
    for (kind, engine, name) in declared_by(template) {
        if existing.iter().any(|b| b.data.kind == kind) {
            continue;
        }
        let input = CreateInput {
            organization_id: service.data.organization_id.clone(),
            service_id: service_id.to_string(),
            kind,
            engine: engine.into(),
            name: name.into(),
        };
        let made = add(input)?;
        log::info(&format!("binding {} ({name}) made for service {service_id}, as its template declares", made.id));
    }
    Ok(())
}

// ---- placement and provisioning ----

/// The node the service's runtime spec pins: `Ok(None)` without a spec (it waits
/// `binding-unplaced`); `binding-placement-ambiguous` for a spec on every node, on several, or
/// several specs.
fn placement(service_id: &str) -> Result<Option<String>> {
    let specs = runtime::service_specs(service_id)?;
    let ambiguous = |why: &str| {
        Refusal::new(
            "binding-placement-ambiguous",
            format!("service {service_id} {why}: a binding lives on the one node its runtime spec pins"),
        )
        .with_data(json!({ "serviceId": service_id }))
    };
    match specs.as_slice() {
        [] => Ok(None),
        [spec] => {
            let placement = &spec.data["placement"];
            if placement["everyNode"].as_bool() == Some(true) {
                return Err(ambiguous("runs on every node"));
            }
            match placement["nodes"].as_array().map(Vec::as_slice) {
                Some([node]) => Ok(node.as_str().map(str::to_string)),
                _ => Err(ambiguous("runs on several nodes")),
            }
        }
        _ => Err(ambiguous("runs on several clusters")),
    }
}

fn storage_binding(b: &Binding, node_id: &str) -> StorageBinding {
    StorageBinding {
        binding_id: b.id.clone(),
        service_id: b.service_id.clone(),
        node_id: node_id.to_string(),
        kind: match b.kind {
            BindingKind::Database => Kind::Database,
            BindingKind::Objectstorage => Kind::ObjectStorage,
        },
        engine: b.engine.clone(),
    }
}

/// Bring one binding forward: place and provision a pending one, finish a deletion. Writes only
/// when something changed; `true` when it is ready.
fn converge(doc: Doc<Binding>) -> Result<bool> {
    let mut next = doc.data.clone();
    match next.state {
        State::Ready => return Ok(true),
        State::Deleting => return finish_delete(doc).map(|_| false),
        State::Pending => {}
    }
    let placed = match &next.node_id {
        Some(node) => Ok(Some(node.clone())),
        None => placement(&next.service_id),
    };
    match placed {
        Ok(None) => next.reason = Some("binding-unplaced".into()),
        Err(refusal) => next.reason = Some(refusal.code().to_string()),
        Ok(Some(node_id)) => {
            next.node_id = Some(node_id.clone());
            match storage::provision(&storage_binding(&next, &node_id)) {
                Ok(done) => {
                    next.state = State::Ready;
                    next.reason = None;
                    next.endpoint = Some(done.endpoint);
                    next.resource = Some(done.name);
                    next.secret_keys = done.secret_keys;
                }
                Err(refusal) => {
                    log::warn(&format!("binding {} of service {} not provisioned: {}", next.id, next.service_id, refusal.code()));
                    next.reason = Some(refusal.code().to_string());
                }
            }
        }
    }
    let ready = next.state == State::Ready;
    if next != doc.data {
        next.updated_at = now_ms();
        Batch::new().replace(BINDINGS, &doc.id, doc.revision, &next).commit()?;
    }
    Ok(ready)
}

/// Revoke, then keep or drop the data, then forget the binding.
fn finish_delete(doc: Doc<Binding>) -> Result<()> {
    let b = &doc.data;
    if let Some(node_id) = &b.node_id {
        let target = storage_binding(b, node_id);
        let done = match b.data {
            Some(DataChoice::Drop) => storage::destroy(&target),
            _ => storage::revoke(&target),
        };
        match done {
            // the node states no endpoint any more: its secrets are revoked (the host does that
            // first), and no provider is left to ask
            Err(refusal) if refusal.code().ends_with("-endpoint-missing") => {
                log::warn(&format!("binding {} deleted without its provider: {}", b.id, refusal.code()));
            }
            other => other?,
        }
    }
    Batch::new().delete(BINDINGS, &doc.id, doc.revision).commit()?;
    Ok(())
}

fn of_service(service_id: &str) -> Result<Vec<Doc<Binding>>> {
    Ok(store::find::<Binding>(BINDINGS, "by_service", &[json!(service_id)], None, 100)?.documents)
}

/// The service's facet, gate and hold as its bindings now stand.
fn publish(service_id: &str) -> Result<()> {
    let bindings = of_service(service_id)?;
    let gone = inventory::get::<Service>(EntityKind::Service, service_id)?.is_none();
    if gone {
        return Ok(());
    }
    let waiting = bindings.iter().any(|b| b.data.state != State::Ready);
    runtime::set_service_gate(service_id, waiting.then_some(PENDING))?;
    if bindings.is_empty() {
        inventory::clear_facet::<serde_json::Value>(EntityKind::Service, service_id, None)?;
        // nothing of the service is kept here any more: its deletion need not wait
        return inventory::release_service(service_id);
    }
    let facet = ServiceFacet {
        bindings: bindings
            .iter()
            .map(|d| FacetEntry {
                id: d.data.id.clone(),
                name: d.data.name.clone(),
                kind: d.data.kind,
                engine: d.data.engine.clone(),
                node_id: d.data.node_id.clone(),
                state: d.data.state,
                reason: d.data.reason.clone(),
                variables: d.data.secret_keys.clone(),
            })
            .collect(),
    };
    inventory::set_facet::<serde_json::Value>(EntityKind::Service, service_id, &facet, None).map(drop)
}

// ---- methods ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateInput {
    /// The organization the service belongs to.
    organization_id: String,
    service_id: String,
    /// `database` or `objectstorage`.
    kind: BindingKind,
    /// `postgresql` for a database, `s3` for object storage.
    engine: String,
    /// The binding's name, unique per service: 1–40 of a-z 0-9 -.
    name: String,
}

/// The service, when it is one of the organization's and not on its way out.
fn service_in(organization_id: &str, service_id: &str) -> Result<Service> {
    match inventory::get::<Service>(EntityKind::Service, service_id)? {
        Some(e) if e.data.organization_id == organization_id && e.data.state.as_deref() != Some("deleting") => Ok(e.data),
        _ => Err(Refusal::new("service-not-found", format!("no service {service_id} in this organization"))
            .with_data(json!({ "serviceId": service_id }))),
    }
}

fn check_name(name: &str) -> Result<()> {
    let ok = (1..=40).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok { Ok(()) } else { Err(Refusal::invalid_request("a binding's name is 1–40 of a-z 0-9 -, not starting or ending with -")) }
}

fn create(_ctx: &Context, input: CreateInput) -> Result<Binding> {
    add(input)
}

/// Record, place, gate, and provision when it can: what `create` does, for a caller or for a
/// template's declaration.
fn add(input: CreateInput) -> Result<Binding> {
    check_name(&input.name)?;
    let provided =
        matches!((input.kind, input.engine.as_str()), (BindingKind::Database, "postgresql") | (BindingKind::Objectstorage, "s3"));
    if !provided {
        return Err(Refusal::new(
            "binding-engine-unsupported",
            format!(
                "no provider of {:?} on {:?}: Capstan provides database on postgresql and objectstorage on s3",
                input.kind, input.engine
            ),
        )
        .with_data(json!({ "kind": input.kind, "engine": input.engine, "supported": SUPPORTED })));
    }
    service_in(&input.organization_id, &input.service_id)?;
    let existing = of_service(&input.service_id)?;
    if existing.iter().any(|b| b.data.name == input.name) {
        return Err(Refusal::new("binding-exists", format!("the service already has a binding named {}", input.name)));
    }
    if existing.iter().any(|b| b.data.kind == input.kind) {
        let names = match input.kind {
            BindingKind::Database => "DATABASE_URL and PG*",
            BindingKind::Objectstorage => "S3_*",
        };
        return Err(Refusal::new(
            "binding-environment-conflict",
            format!("the service already has a binding of that kind: a second would set the same {names} names"),
        ));
    }
    if existing.len() >= MAX_PER_SERVICE {
        return Err(Refusal::new("binding-limit", format!("a service has at most {MAX_PER_SERVICE} bindings")));
    }
    // refused now rather than recorded to wait forever
    let node_id = placement(&input.service_id)?;
    inventory::hold_service(&input.service_id)?;
    let now = now_ms();
    let id = format!("bnd_{:016x}", rand::random::<u64>());
    let binding = Binding {
        id: id.clone(),
        service_id: input.service_id.clone(),
        organization_id: input.organization_id,
        name: input.name,
        kind: input.kind,
        engine: input.engine,
        node_id,
        state: State::Pending,
        reason: Some("binding-unplaced".into()),
        endpoint: None,
        resource: None,
        secret_keys: Vec::new(),
        data: None,
        created_at: now,
        updated_at: now,
    };
    let written = Batch::new().insert(BINDINGS, &id, &binding).commit()?;
    let revision = written.first().map_or(1, |d| d.revision);
    // gated before anything is provisioned, so no replica starts without its credentials
    publish(&input.service_id)?;
    // provisioned at once when it can be; otherwise the reconcile pass asks again
    converge(Doc { id: id.clone(), revision, data: binding })?;
    publish(&input.service_id)?;
    Ok(require(&id)?.data)
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GetInput {
    organization_id: String,
    binding_id: String,
}

fn require(id: &str) -> Result<Doc<Binding>> {
    store::get::<Binding>(BINDINGS, id)?.ok_or_else(|| not_found(id))
}

fn not_found(id: &str) -> Refusal {
    Refusal::new("binding-not-found", format!("no binding {id} in this organization")).with_data(json!({ "bindingId": id }))
}

fn in_org(organization_id: &str, id: &str) -> Result<Doc<Binding>> {
    let doc = require(id)?;
    if doc.data.organization_id != organization_id {
        return Err(not_found(id));
    }
    Ok(doc)
}

fn get(_ctx: &Context, input: GetInput) -> Result<Binding> {
    Ok(in_org(&input.organization_id, &input.binding_id)?.data)
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ListInput {
    organization_id: String,
    /// Only this service's (all of them: a service has at most a few).
    #[serde(default)]
    service_id: Option<String>,
    /// The organization's: continue after this cursor (`nextCursor` of the page before).
    #[serde(default)]
    cursor: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Listed {
    bindings: Vec<Binding>,
    /// Pass back as `cursor` for the next page; absent when the listing is complete.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

fn list(_ctx: &Context, input: ListInput) -> Result<Listed> {
    let (docs, next_cursor) = match &input.service_id {
        Some(service_id) => (of_service(service_id)?, None),
        None => {
            let page = store::find::<Binding>(BINDINGS, "by_org", &[json!(input.organization_id)], input.cursor.as_deref(), 100)?;
            (page.documents, page.next_cursor)
        }
    };
    let bindings = docs.into_iter().map(|d| d.data).filter(|b| b.organization_id == input.organization_id).collect();
    Ok(Listed { bindings, next_cursor })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DeleteInput {
    organization_id: String,
    binding_id: String,
    /// `keep` the database (its role can no longer log in) or `drop` it: no default.
    data: DataChoice,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Deleted {
    binding_id: String,
    /// `deleted`, or `deleting` when the provider could not be reached (the reconcile pass
    /// finishes it; the credentials are revoked first whatever happens).
    state: String,
    data: DataChoice,
}

fn delete(_ctx: &Context, input: DeleteInput) -> Result<Deleted> {
    let doc = in_org(&input.organization_id, &input.binding_id)?;
    let mut next = doc.data.clone();
    next.state = State::Deleting;
    next.data = Some(input.data);
    next.updated_at = now_ms();
    let written = Batch::new().replace(BINDINGS, &doc.id, doc.revision, &next).commit()?;
    let revision = written.first().map_or(doc.revision + 1, |d| d.revision);
    let state = match finish_delete(Doc { id: doc.id.clone(), revision, data: next }) {
        Ok(()) => "deleted",
        Err(refusal) if refusal.is_retryable() => "deleting",
        Err(refusal) => return Err(refusal),
    };
    publish(&doc.data.service_id)?;
    Ok(Deleted { binding_id: input.binding_id, state: state.into(), data: input.data })
}
