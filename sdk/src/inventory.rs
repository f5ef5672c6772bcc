//! Reads of the platform model the operator edits — organizations, clusters, services, the
//! nodes of clusters with their liveness ([`EntityKind::Node`], as `nodes.get` answers them,
//! never a credential), settings, the fleet's Capstan processes ([`EntityKind::FleetNode`])
//! (capability `inventory:read`) — and service writes on behalf of the caller
//! (`inventory:write-services`). Nodes are read-only to plugins. A plugin writes its own facets
//! (the records it declared with [`crate::Descriptor::facet`]) on organizations, clusters and
//! services.

use crate::bindings::capstan::plugin::inventory as wit;
use crate::{Result, Value, encode, parse};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use wit::EntityKind;

/// An entity as the API's `get` answers it, decoded into `T`.
#[derive(Debug, Clone, PartialEq)]
pub struct Entity<T = Value> {
    /// What kind of entity it is.
    pub kind: EntityKind,
    /// The entity's id.
    pub id: String,
    /// The entity's revision.
    pub revision: u64,
    /// The entity as the API's `get` answers it (never a secret).
    pub data: T,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityPage<T = Value> {
    /// The entities on this page.
    pub entities: Vec<Entity<T>>,
    /// Pass back as `cursor` to continue; `None` when the listing is complete.
    pub next_cursor: Option<String>,
}

fn entity<T: DeserializeOwned>(e: wit::Entity) -> Result<Entity<T>> {
    let data = parse(&e.data, &format!("{:?} {}", e.kind, e.id))?;
    Ok(Entity { kind: e.kind, id: e.id, revision: e.revision, data })
}

/// The entity, or `None`.
pub fn get<T: DeserializeOwned>(kind: EntityKind, id: &str) -> Result<Option<Entity<T>>> {
    wit::get(kind, id)?.map(entity).transpose()
}

/// Entities of `kind` a page at a time.
pub fn list<T: DeserializeOwned>(kind: EntityKind, cursor: Option<&str>, limit: u32) -> Result<EntityPage<T>> {
    let page = wit::list(kind, cursor, limit)?;
    Ok(EntityPage { entities: page.entities.into_iter().map(entity).collect::<Result<_>>()?, next_cursor: page.next_cursor })
}

/// Every entity of `kind`, in id order, read 500 to a page (for a manager's pass over a
/// fleet's services, say).
pub fn list_all<T: DeserializeOwned>(kind: EntityKind) -> Result<Vec<Entity<T>>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = list::<T>(kind, cursor.as_deref(), 500)?;
        out.extend(page.entities);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(out),
        }
    }
}

/// The public settings document and its revision.
pub fn settings<T: DeserializeOwned>() -> Result<Entity<T>> {
    entity(wit::settings()?)
}

/// Create a service as `services.create` would: inside a method call with the caller's
/// authority, outside one with the authority the operator approved for this plugin. An
/// anonymous caller of a public method has no authority to lend: refused `unauthenticated`.
pub fn create_service<T: DeserializeOwned>(body: &impl Serialize) -> Result<Entity<T>> {
    entity(wit::create_service(&encode(body)?)?)
}

/// Update a service as `services.update` would (the body carries `expectedRevision`).
pub fn update_service<T: DeserializeOwned>(body: &impl Serialize) -> Result<Entity<T>> {
    entity(wit::update_service(&encode(body)?)?)
}

/// Record that this plugin owns something of the service: its deletion waits for
/// [`release_service`]. Refused `service-deleting` once the service is being deleted.
pub fn hold_service(service_id: &str) -> Result<()> {
    Ok(wit::hold_service(service_id)?)
}

/// Release this plugin's hold on the service once it cleaned up (after `service.deleting`);
/// the last release of a deleting service finishes its deletion.
pub fn release_service(service_id: &str) -> Result<()> {
    Ok(wit::release_service(service_id)?)
}

/// Write this plugin's facet of the `kind` entity `id` (declared with
/// [`crate::Descriptor::facet`]); the host judges it by the declared schema (`facet-invalid`)
/// and answers the entity as written, its facets under `facets.<pluginId>`. Writing what is
/// there already changes nothing. With `expected_revision` (the revision the record was
/// derived from), an entity changed since is `conflict` and nothing is written.
pub fn set_facet<T: DeserializeOwned>(
    kind: EntityKind,
    id: &str,
    value: &impl Serialize,
    expected_revision: Option<u64>,
) -> Result<Entity<T>> {
    entity(wit::set_facet(kind, id, Some(&encode(value)?), expected_revision)?)
}

/// Remove this plugin's facet of the `kind` entity `id` (taken even while a service is being
/// deleted), fenced by `expected_revision` as [`set_facet`] is.
pub fn clear_facet<T: DeserializeOwned>(kind: EntityKind, id: &str, expected_revision: Option<u64>) -> Result<Entity<T>> {
    entity(wit::set_facet(kind, id, None, expected_revision)?)
}
