//! Facets: the records managers keep on organizations, clusters and services. A plugin
//! declares a facet for an entity kind with its JSON Schema; the entity then carries it as
//! `facets.<pluginId>`, written only by that plugin (`inventory.set-facet`) and judged by the
//! declared schema through [`Dependents`] — the inventory knows no plugin's record. Anyone who
//! reads the entity reads its facets; no operator write touches them.

use super::{CLUSTERS, Dependents, ORGANIZATIONS, SERVICES, check_revision, emit, not_found};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_store::{Document, Store};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// An entity's facets: each plugin's record of it, by plugin id.
pub type Facets = BTreeMap<String, Value>;

/// The entity kinds that carry facets, with their collections.
const KINDS: &[(&str, &str)] = &[("organization", ORGANIZATIONS), ("cluster", CLUSTERS), ("service", SERVICES)];

/// One facet write: `plugin`'s record of the `kind` entity `id`.
pub struct Write<'a> {
    /// `organization`, `cluster` or `service`.
    pub kind: &'a str,
    /// The entity's id.
    pub id: &'a str,
    /// The plugin whose facet it is.
    pub plugin: &'a str,
    /// The record; `None` removes it.
    pub value: Option<Value>,
    /// The revision the plugin read the entity at, if the record must not be laid over a newer
    /// one (`conflict`).
    pub expected_revision: Option<u64>,
}

/// Write (`Some`) or remove (`None`) a plugin's facet of an entity, as the plugin declared it
/// ([`Dependents::plugin_facet`], judged by [`Dependents::check_plugin_facet`]), with the
/// entity's `<kind>.updated` event naming the facet. Unchanged, nothing is written.
pub async fn set(store: &Store, dependents: &dyn Dependents, write: Write<'_>) -> Result<Document> {
    let Write { kind, id, plugin, value, expected_revision } = write;
    let Some(&(_, collection)) = KINDS.iter().find(|(k, _)| *k == kind) else {
        return Err(Refusal::new("facet-undeclared", format!("{kind} keeps no facets; organizations, clusters and services do")));
    };
    let value = &value;
    store
        .transact(|tx| async move {
            let Some(doc) = tx.get(collection, id).await? else { return Err(not_found(kind, id)) };
            if let Some(expected) = expected_revision {
                check_revision(kind, id, expected, doc.revision)?;
            }
            let Some(declared) = dependents.plugin_facet(&tx, plugin, kind).await? else {
                return Err(Refusal::new(
                    "facet-undeclared",
                    format!("plugin {plugin} declares no facet on {kind}s: its descriptor names the records it keeps"),
                )
                .with_data(json!({ "plugin": plugin, "kind": kind })));
            };
            if let Some(value) = value {
                if doc.data["state"] == "deleting" {
                    return Err(Refusal::new("service-deleting", format!("service {id} is being deleted; only removing a facet is taken"))
                        .with_data(json!({ "id": id })));
                }
                dependents.check_plugin_facet(plugin, id, &declared, value)?;
            }
            let mut data = doc.data.clone();
            let Some(object) = data.as_object_mut() else { return Err(Refusal::internal(format!("{kind} {id} is not an object"))) };
            let facets = object.entry("facets").or_insert_with(|| Value::Object(Map::new()));
            let Some(facets) = facets.as_object_mut() else {
                return Err(Refusal::internal(format!("{kind} {id}: facets is not an object")));
            };
            let before = facets.get(plugin).cloned();
            if before.as_ref() == value.as_ref() {
                return Ok(doc);
            }
            match value {
                Some(value) => facets.insert(plugin.to_string(), value.clone()),
                None => facets.remove(plugin),
            };
            if facets.is_empty() {
                object.remove("facets");
            }
            object.insert("updatedAt".into(), json!(now_ms()));
            let written = tx.replace(collection, id, doc.revision, data).await?;
            emit(&tx, &format!("{kind}.updated"), id, event(kind, id, &written.data, plugin)).await?;
            Ok(written)
        })
        .await
}

/// What a facet write's event carries: what routes it (never the record itself).
fn event(kind: &str, id: &str, data: &Value, plugin: &str) -> Value {
    let mut event = json!({ "id": id, "name": data["name"], "facet": plugin });
    if kind == "service" {
        event["organizationId"] = data["organizationId"].clone();
        event["state"] = data["state"].clone();
    }
    event
}
