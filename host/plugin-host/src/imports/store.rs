//! `store`: the plugin's own collections (`p_<id>__<name>`), those its `describe` declared.

use super::{CallData, Services, WitResult, parse_object, refusal, to_wit};
use crate::manifest::Capability;
use crate::refusal::Refusal;
use crate::runtime::capstan::plugin::store;
use capstan_core::text::truncate;
use serde_json::{Value, json};
use std::sync::Arc;

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

/// The `store` provider: one plugin's declared collections.
#[derive(Clone)]
pub(super) struct Collections {
    services: Arc<Services>,
    plugin: String,
}

impl Collections {
    pub(super) fn new(services: &Arc<Services>, plugin: &str) -> Self {
        Collections { services: services.clone(), plugin: plugin.to_string() }
    }

    /// The host name of the plugin's collection `name`, if its `describe` declared it.
    fn name(&self, name: &str) -> WitResult<String> {
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
}

impl CallData {
    fn collections(&self) -> WitResult<Collections> {
        self.granted(&self.grant.store, Capability::Store)
    }
}

fn wit_document(d: crate::store::Document) -> store::Document {
    store::Document { id: d.id, revision: d.revision, data: d.data.to_string() }
}

fn wit_page(p: crate::store::Page) -> store::Page {
    store::Page { documents: p.documents.into_iter().map(wit_document).collect(), next_cursor: p.next_cursor }
}

impl store::Host for CallData {
    async fn get(&mut self, collection: String, id: String) -> WitResult<Option<store::Document>> {
        let c = self.collections()?;
        let name = c.name(&collection)?;
        let doc = c.services.store.transact(|tx| {
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
        let c = self.collections()?;
        let name = c.name(&collection)?;
        let key: Vec<Value> = key
            .iter()
            .map(|k| serde_json::from_str(k).map_err(|e| refusal("invalid-request", format!("index key is not JSON: {e}"), json!({}))))
            .collect::<WitResult<_>>()?;
        let page = c.services.store.transact(|tx| {
            let (name, index, key, cursor) = (name.clone(), index.clone(), key.clone(), cursor.clone());
            async move { tx.find(&name, &index, &key, cursor.as_deref(), limit as usize).await }
        });
        page.await.map(wit_page).map_err(to_wit)
    }

    async fn scan(&mut self, collection: String, cursor: Option<String>, limit: u32) -> WitResult<store::Page> {
        let c = self.collections()?;
        let name = c.name(&collection)?;
        let page = c.services.store.transact(|tx| {
            let (name, cursor) = (name.clone(), cursor.clone());
            async move { tx.scan(&name, cursor.as_deref(), limit as usize).await }
        });
        page.await.map(wit_page).map_err(to_wit)
    }

    async fn commit(&mut self, expectations: Vec<store::Expectation>, writes: Vec<store::Write>) -> WitResult<Vec<store::Document>> {
        self.changing()?;
        enum Op {
            Insert(Value),
            Replace(u64, Value),
            Delete(u64),
        }
        let c = self.collections()?;
        // the documents, parsed and copied into the transaction, count as their JSON text
        let text: usize = writes
            .iter()
            .map(|w| match &w.op {
                store::WriteOp::Insert(data) => data.len(),
                store::WriteOp::Replace(r) => r.data.len(),
                store::WriteOp::Delete(_) => 0,
            })
            .sum();
        self.budget.fits(text, "the commit's documents")?;
        let mut checks = Vec::with_capacity(expectations.len());
        for e in expectations {
            checks.push((c.name(&e.collection)?, e.id, e.revision));
        }
        let mut ops = Vec::with_capacity(writes.len());
        for w in writes {
            let name = c.name(&w.collection)?;
            // Crash points `plugin-commit:<collection>` / `plugin-committed:<collection>` (the host
            // name, e.g. `p_appstore__catalog`): before / after a batch writing it commits.
            capstan_core::crash_point(format_args!("plugin-commit:{name}"));
            let op = match w.op {
                store::WriteOp::Insert(data) => Op::Insert(parse_object(&data, "document data")?),
                store::WriteOp::Replace(r) => Op::Replace(r.expected_revision, parse_object(&r.data, "document data")?),
                store::WriteOp::Delete(revision) => Op::Delete(revision),
            };
            ops.push((name, w.id, op));
        }
        let (checks, ops) = (Arc::new(checks), Arc::new(ops));
        let written = c.services.store.transact(|tx| {
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
        let written = written.await;
        if written.is_ok() {
            ops.iter().for_each(|(name, _, _)| capstan_core::crash_point(format_args!("plugin-committed:{name}")));
        }
        written.map(|docs| docs.into_iter().map(wit_document).collect()).map_err(to_wit)
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
}
