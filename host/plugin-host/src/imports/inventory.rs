//! `inventory`: the platform model read (`inventory:read`) and services written
//! (`inventory:write-services`) — the writes through the server's [`Platform`], acting as the
//! caller of the current method or else as the plugin itself. The nodes of clusters are read
//! through the [`Platform`] too (as `nodes.get` answers them, with their liveness); the fleet's
//! Capstan processes from the bucket. No function writes a node. A plugin writes its own
//! facets of organizations, clusters and services, which the [`Platform`] judges by what it
//! declared.

use super::{CallData, Services, WitResult, parse_object, to_wit};
use crate::blobs::Blobs;
use crate::manifest::Capability;
use crate::platform::Platform;
use crate::runtime::capstan::plugin::inventory;
use crate::store::Store;
use std::sync::Arc;

/// The `inventory:read` provider.
#[derive(Clone)]
pub(super) struct Reader {
    store: Store,
    blobs: Blobs,
    platform: Arc<dyn Platform>,
}

impl Reader {
    pub(super) fn new(services: &Arc<Services>) -> Self {
        Reader { store: services.store.clone(), blobs: services.blobs.clone(), platform: services.platform.clone() }
    }
}

/// The `inventory:write-services` provider.
#[derive(Clone)]
pub(super) struct ServiceWriter {
    pub(super) platform: Arc<dyn Platform>,
    pub(super) plugin: String,
}

impl ServiceWriter {
    pub(super) fn new(services: &Arc<Services>, plugin: &str) -> Self {
        ServiceWriter { platform: services.platform.clone(), plugin: plugin.to_string() }
    }

    /// How a hold of this plugin is named on a service.
    fn holder(&self) -> String {
        format!("plugin:{}", self.plugin)
    }
}

/// Writes the plugin's own facets (`inventory.set-facet`).
#[derive(Clone)]
pub(super) struct FacetWriter {
    platform: Arc<dyn Platform>,
    plugin: String,
}

impl FacetWriter {
    pub(super) fn new(services: &Arc<Services>, plugin: &str) -> Self {
        FacetWriter { platform: services.platform.clone(), plugin: plugin.to_string() }
    }
}

impl CallData {
    fn reader(&self) -> WitResult<Reader> {
        self.granted(&self.grant.inventory, Capability::InventoryRead)
    }

    /// Every plugin writes its own facets, except while it describes itself.
    fn facet_writer(&self) -> WitResult<FacetWriter> {
        self.granted(&Some(self.grant.facets.clone()), Capability::InventoryRead)
    }

    fn service_writer(&self) -> WitResult<ServiceWriter> {
        self.granted(&self.grant.services, Capability::InventoryWriteServices)
    }

    /// Who an inventory write acts as: the caller of the current method, or outside a method
    /// call the plugin itself with the authority the operator approved for it. An anonymous
    /// caller of a public method is nobody: it lends the plugin no authority, so the write is
    /// refused `unauthenticated`.
    pub(super) fn actor(&self, writer: &ServiceWriter) -> WitResult<capstan_rpc::Identity> {
        match &self.acting {
            super::Acting::Caller(identity) => Ok(identity.clone()),
            super::Acting::Plugin => Ok(writer.platform.plugin_identity(&writer.plugin)),
            super::Acting::Anonymous => Err(to_wit(
                crate::refusal::Refusal::new("unauthenticated", "an anonymous call of a public method cannot change services")
                    .with_data(serde_json::json!({ "plugin": writer.plugin })),
            )),
        }
    }
}

impl inventory::Host for CallData {
    async fn get(&mut self, kind: inventory::EntityKind, id: String) -> WitResult<Option<inventory::Entity>> {
        let reader = self.reader()?;
        let collection = match kind {
            inventory::EntityKind::Node => {
                let node = reader.platform.node(&id).await.map_err(to_wit)?;
                return Ok(node.map(|d| entity(kind, d)));
            }
            inventory::EntityKind::FleetNode => {
                let nodes = crate::fleet::read_nodes(&reader.blobs).await.map_err(to_wit)?;
                return Ok(nodes.into_iter().find(|n| n.node_id == id).map(fleet_node_entity));
            }
            inventory::EntityKind::Organization => "organizations",
            inventory::EntityKind::Cluster => "clusters",
            inventory::EntityKind::Service => "services",
        };
        let doc = reader.store.transact(|tx| {
            let id = id.clone();
            async move { if tx.is_declared(collection) { tx.get(collection, &id).await } else { Ok(None) } }
        });
        Ok(doc.await.map_err(to_wit)?.map(|d| entity(kind, d)))
    }

    async fn list(&mut self, kind: inventory::EntityKind, cursor: Option<String>, limit: u32) -> WitResult<inventory::EntityPage> {
        let reader = self.reader()?;
        let collection = match kind {
            inventory::EntityKind::Node => {
                let page = reader.platform.nodes(cursor.as_deref(), limit as usize).await.map_err(to_wit)?;
                return Ok(page_of(kind, page));
            }
            inventory::EntityKind::FleetNode => {
                let nodes = crate::fleet::read_nodes(&reader.blobs).await.map_err(to_wit)?;
                let after: Vec<_> = nodes.into_iter().filter(|n| cursor.as_deref().is_none_or(|c| n.node_id.as_str() > c)).collect();
                let limit = (limit as usize).clamp(1, 500);
                let next_cursor = (after.len() > limit).then(|| after[limit - 1].node_id.clone());
                let entities = after.into_iter().take(limit).map(fleet_node_entity).collect();
                return Ok(inventory::EntityPage { entities, next_cursor });
            }
            inventory::EntityKind::Organization => "organizations",
            inventory::EntityKind::Cluster => "clusters",
            inventory::EntityKind::Service => "services",
        };
        let page = reader.store.transact(|tx| {
            let cursor = cursor.clone();
            async move {
                if tx.is_declared(collection) {
                    tx.scan(collection, cursor.as_deref(), limit as usize).await
                } else {
                    Ok(crate::store::Page { documents: vec![], next_cursor: None })
                }
            }
        });
        Ok(page_of(kind, page.await.map_err(to_wit)?))
    }

    async fn settings(&mut self) -> WitResult<inventory::Entity> {
        let reader = self.reader()?;
        let doc = reader
            .store
            .transact(|tx| async move { if tx.is_declared("settings") { tx.get("settings", "public").await } else { Ok(None) } });
        let doc = doc.await.map_err(to_wit)?;
        Ok(match doc {
            Some(d) => entity(inventory::EntityKind::Organization, d),
            None => inventory::Entity { kind: inventory::EntityKind::Organization, id: "public".into(), revision: 0, data: "{}".into() },
        })
    }

    async fn create_service(&mut self, body: String) -> WitResult<inventory::Entity> {
        self.changing()?;
        let writer = self.service_writer()?;
        let body = parse_object(&body, "the service")?;
        let created = writer.platform.create_service(&self.actor(&writer)?, body).await.map_err(to_wit)?;
        Ok(entity(inventory::EntityKind::Service, created))
    }

    async fn update_service(&mut self, body: String) -> WitResult<inventory::Entity> {
        self.changing()?;
        let writer = self.service_writer()?;
        let body = parse_object(&body, "the service")?;
        let updated = writer.platform.update_service(&self.actor(&writer)?, body).await.map_err(to_wit)?;
        Ok(entity(inventory::EntityKind::Service, updated))
    }

    async fn hold_service(&mut self, service_id: String) -> WitResult<()> {
        self.changing()?;
        let writer = self.service_writer()?;
        self.actor(&writer)?; // an anonymous call changes nothing, holds included
        writer.platform.hold_service(&service_id, &writer.holder()).await.map_err(to_wit)
    }

    async fn release_service(&mut self, service_id: String) -> WitResult<()> {
        self.changing()?;
        let writer = self.service_writer()?;
        self.actor(&writer)?;
        writer.platform.release_service(&service_id, &writer.holder()).await.map_err(to_wit)
    }

    /// The plugin's own record on an entity: no capability beyond having declared the facet
    /// (which the operator saw at install), written as the plugin whoever called it.
    async fn set_facet(
        &mut self,
        kind: inventory::EntityKind,
        id: String,
        value: Option<String>,
        expected_revision: Option<u64>,
    ) -> WitResult<inventory::Entity> {
        self.changing()?;
        let writer = self.facet_writer()?;
        let kind_name = match kind {
            inventory::EntityKind::Organization => "organization",
            inventory::EntityKind::Cluster => "cluster",
            inventory::EntityKind::Service => "service",
            inventory::EntityKind::Node | inventory::EntityKind::FleetNode => {
                return Err(to_wit(crate::refusal::Refusal::new(
                    "facet-undeclared",
                    "a facet is kept on an organization, a cluster or a service",
                )));
            }
        };
        let value = match value {
            None => None,
            Some(text) => Some(
                serde_json::from_str(&text)
                    .map_err(|e| to_wit(crate::refusal::Refusal::new("facet-invalid", format!("the facet is not JSON: {e}"))))?,
            ),
        };
        let written = writer.platform.set_facet(kind_name, &id, &writer.plugin, value, expected_revision).await.map_err(to_wit)?;
        Ok(entity(kind, written))
    }
}

fn entity(kind: inventory::EntityKind, d: crate::store::Document) -> inventory::Entity {
    inventory::Entity { kind, id: d.id, revision: d.revision, data: d.data.to_string() }
}

fn page_of(kind: inventory::EntityKind, page: crate::store::Page) -> inventory::EntityPage {
    inventory::EntityPage { entities: page.documents.into_iter().map(|d| entity(kind, d)).collect(), next_cursor: page.next_cursor }
}

fn fleet_node_entity(n: crate::fleet::NodeRecord) -> inventory::Entity {
    let data = serde_json::to_string(&n).unwrap_or_else(|_| "{}".into());
    inventory::Entity { kind: inventory::EntityKind::FleetNode, id: n.node_id, revision: 0, data }
}
