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

/// The spec of `svc_1` on `cl_1` (organization `org_1`) with `placement`, `replicas` per node.
pub fn spec(placement: crate::spec::Placement, replicas: u32, hold: bool) -> crate::spec::Spec {
    crate::spec::Spec {
        service_id: "svc_1".into(),
        cluster_id: "cl_1".into(),
        organization_id: "org_1".into(),
        placement,
        replicas_per_node: replicas,
        hold,
        held_nodes: Vec::new(),
        restart: crate::spec::Restart::OnFailure,
        health: Default::default(),
        secrets: Default::default(),
        updated_at: 0,
        updated_by: "user_1".into(),
    }
}

/// A slot of `service_id` on `node_1` named `slot`, running `assignment_id` (admitted at
/// `admitted_at`, revision `revision`) of a fixed image.
pub fn running_slot(service_id: &str, slot: &str, assignment_id: &str, admitted_at: u64, revision: u64) -> crate::slots::Slot {
    let work = crate::slots::Work {
        image: "reg.example/x@sha256:00".into(),
        environment: Default::default(),
        ports: vec![],
        volumes: vec![],
        health: Default::default(),
        restart: Default::default(),
        secrets: None,
    };
    crate::slots::Slot {
        service_id: service_id.into(),
        cluster_id: "cl_1".into(),
        node_id: "node_1".into(),
        slot: slot.into(),
        assignment_id: assignment_id.into(),
        assignment: crate::slots::Assignment {
            key: work.key(),
            intent: crate::transition::Intent::Run,
            revision,
            work,
            repository: None,
            successor: false,
            admitted_at,
            observation: None,
            stopped_at: None,
            removed_at: None,
            stop_cause: None,
        },
        failures: 0,
        attempts: 1,
        last_cause: None,
    }
}

/// What a node says of an assignment: `phase`, ready or not, running `digest`, accepted at `at`.
pub fn observed(phase: &str, ready: bool, digest: Option<&str>, at: u64) -> crate::slots::Observation {
    crate::slots::Observation {
        phase: phase.into(),
        ready,
        image_digest: digest.map(str::to_string),
        restart_count: 0,
        cause: None,
        observed_at: at,
        accepted_at: at,
    }
}

/// Store `slot` (replacing the slot of that name).
pub async fn hold(store: &Store, slot: &crate::slots::Slot) {
    let id = crate::slots::slot_id(&slot.service_id, &slot.slot);
    let value = serde_json::to_value(slot).expect("a slot");
    store
        .transact(|tx| {
            let (id, value) = (id.clone(), value.clone());
            async move {
                if let Some(doc) = tx.get(crate::RUNTIME_SLOTS, &id).await? {
                    tx.delete(crate::RUNTIME_SLOTS, &id, doc.revision).await?;
                }
                tx.insert(crate::RUNTIME_SLOTS, &id, value).await.map(drop)
            }
        })
        .await
        .expect("the slot stored");
}
