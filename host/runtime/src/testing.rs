//! Stand-ins for what the runtime reaches outside itself, for its tests and benchmarks (the
//! `testing` feature): no dependents, no sockets, and a context over a real SQLite store and a
//! local bucket in a directory.

use crate::Context;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::{Dependents, PluginSetting};
use capstan_store::{Store, Tx};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// Nothing hangs on services.
pub struct NoDependents;

#[async_trait::async_trait]
impl Dependents for NoDependents {
    async fn organization_blocker(&self, _: &Tx, _: &str, _: &str) -> Result<Option<Refusal>> {
        Ok(None)
    }
    async fn service_removed(&self, _: &Tx, _: &str) -> Result<()> {
        Ok(())
    }
    async fn holder_present(&self, _: &Tx, _: &str) -> Result<bool> {
        Ok(true)
    }
    async fn plugin_settings(&self, _: &Tx) -> Result<Vec<PluginSetting>> {
        Ok(Vec::new())
    }
    fn check_plugin_setting(&self, _: &PluginSetting, _: &Value) -> Result<()> {
        Ok(())
    }
}

/// No socket: nothing is pushed.
pub struct NoSockets;

impl capstan_relays::Sessions for NoSockets {
    fn send(&self, _: &str, _: String) -> bool {
        false
    }
    fn end(&self, _: &str, _: u16, _: &'static str) {}
    fn push_to_admins(&self, _: &str, _: &Value) {}
    fn max_frame_bytes(&self) -> usize {
        1 << 20
    }
}

/// A runtime context over `store`, its bucket under `dir/blobs`.
pub async fn context(store: Store, dir: &Path) -> Context {
    let nodes = capstan_nodes::Context::new(store.clone(), "https://capstan.test".into(), false);
    let keyring = Arc::new(capstan_keyring::Keyring::generate(None, None).expect("a keyring"));
    let blobs = capstan_blobs::local::LocalBlobs::open(&dir.join("blobs").display().to_string()).await.expect("a local bucket");
    Context::new(store, Arc::new(NoDependents), nodes, Arc::new(NoSockets), keyring, capstan_blobs::Blobs::new(blobs))
}

/// A SQLite store in `dir`, the runtime's and the inventory's collections declared.
pub async fn store(dir: &Path) -> Store {
    let store = Store::new(capstan_store::sqlite::SqliteStore::open(dir.join("s.sqlite")).expect("a store"), capstan_store::DEFAULT_BUDGET);
    crate::declare(&store).await.expect("declared");
    capstan_inventory::declare(&store).await.expect("declared");
    store
}
