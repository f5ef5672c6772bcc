//! The fleet: several Capstan processes sharing one database and one bucket. Each node has an
//! identity, registers itself in the bucket, beats a heartbeat, and competes for one
//! coordinator lease taken and renewed by conditional writes. Liveness is an age, computed
//! on read; nothing announces a death.
//!
//! Bucket layout (under the blob store):
//! - `_capstan/nodes/<id>.json`       the node record, signed by its node (written at boot; beats
//!   touch `heartbeatAt`): see [`signed`]
//! - `_capstan/identities/<id>.json`  the claim binding an id to a public key (create-only)
//! - `_capstan/coordinator/lease.json` the coordinator lease with its fence
//! - `_capstan/fleet/freeze.json`     a deploy freeze, while one stands

pub mod forward;
pub mod identity;
pub mod lease;
pub mod listing;
pub mod methods;
pub mod placement;
pub mod runtime;
pub mod signed;

use capstan_blobs::{BlobMeta, Blobs, PutMode};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use identity::NodeIdentity;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// Bucket prefix of the node records (`<prefix><id>.json`).
pub const NODES_PREFIX: &str = "_capstan/nodes/";
/// Bucket prefix of the identity claims (`<prefix><id>.json`).
pub const IDENTITIES_PREFIX: &str = "_capstan/identities/";
/// Bucket key of the deploy freeze, present only while one stands.
pub const FREEZE_KEY: &str = "_capstan/fleet/freeze.json";
/// The file in a node's state directory `capstan wg init` writes and `serve --network
/// wireguard` requires.
pub const WIREGUARD_FILE: &str = "wireguard.json";

/// How often things happen. The defaults are the documented ones; tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// How often a node writes its heartbeat.
    pub heartbeat: Duration,
    /// A node heard from within this window is answering; live if also not draining.
    pub liveness_window: Duration,
    /// The coordinator lease lives this long unless renewed; never longer than the window.
    pub lease_ttl: Duration,
    /// Each node re-reads the fleet's records this often.
    pub refresh: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat: Duration::from_secs(30),
            liveness_window: Duration::from_secs(90),
            lease_ttl: Duration::from_secs(90),
            refresh: Duration::from_secs(30),
        }
    }
}

/// Where other nodes reach a node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Addresses {
    /// The address other nodes dial (a wildcard bind is dialled on 127.0.0.1).
    pub internal: String,
    /// The port other nodes dial the node's API on.
    pub api_port: u16,
}

/// What a node's process was built as.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Versions {
    /// The Capstan version.
    pub capstan: String,
    /// The plugin contract the node serves (`capstan:plugin@…`, the current contract).
    pub wit_world: String,
    /// The plugin engine's (Wasmtime) version; `None` from a build that did not report it.
    pub wasmtime: Option<String>,
}

impl Versions {
    /// The versions of the running build.
    pub fn of_this_build() -> Self {
        Versions {
            capstan: env!("CARGO_PKG_VERSION").into(),
            wit_world: capstan_core::build::PLUGIN_CONTRACT.into(),
            wasmtime: Some(capstan_core::build::PLUGIN_ENGINE.into()),
        }
    }
}

/// A node's record in the bucket (`_capstan/nodes/<id>.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    /// The node's id.
    pub node_id: String,
    /// The node's Ed25519 public key, base64.
    pub public_key: String,
    /// Where other nodes reach it.
    pub addresses: Addresses,
    /// Its labels, which placement selectors match against.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// What the running process booted as; written at boot, never by a heartbeat. Absent in
    /// records of builds that did not report it.
    #[serde(default)]
    pub versions: Option<Versions>,
    /// What the node serves, e.g. `api`, `dashboard`.
    #[serde(default)]
    pub serves: Vec<String>,
    /// The network it joined the fleet over (e.g. `lan`, `wireguard`), if one was set.
    #[serde(default)]
    pub network: Option<String>,
    /// When it registered, in milliseconds since the Unix epoch.
    pub booted_at: u64,
    /// Its last heartbeat, in milliseconds since the Unix epoch; `None` if none is recorded.
    pub heartbeat_at: Option<u64>,
    /// When it marked itself as leaving, in milliseconds since the Unix epoch; `None` unless draining.
    pub draining_at: Option<u64>,
    /// The node's Ed25519 signature over the rest of the record, base64 ([`signed`]); absent
    /// in records of builds before signed records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl NodeRecord {
    /// Heard from within the window, whatever it said about leaving.
    pub fn answering(&self, now: u64, timing: &Timing) -> bool {
        self.heartbeat_at.is_some_and(|at| now.saturating_sub(at) <= timing.liveness_window.as_millis() as u64)
    }

    /// Answering and not draining.
    pub fn live(&self, now: u64, timing: &Timing) -> bool {
        self.answering(now, timing) && self.draining_at.is_none()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct IdentityClaim {
    id: String,
    kind: String,
    public_key: String,
    claimed_at: u64,
}

fn node_key(id: &str) -> String {
    format!("{NODES_PREFIX}{id}.json")
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Refusal::new("fleet-record-invalid", format!("{key} is not a valid record")).detail(e))
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(value).map_err(Refusal::internal)
}

/// The public key `id` was claimed with, if it was.
pub async fn claimed_key(blobs: &Blobs, id: &str) -> Result<Option<String>> {
    let key = format!("{IDENTITIES_PREFIX}{id}.json");
    match blobs.get_bytes(&key).await? {
        Some((_, bytes)) => Ok(Some(decode::<IdentityClaim>(&key, &bytes)?.public_key)),
        None => Ok(None),
    }
}

/// Claim `id` for `public_key` in the shared id keyspace (nodes, users and operators). An id
/// already claimed by another key is refused `identity-claimed`.
pub async fn claim_identity(blobs: &Blobs, id: &str, kind: &str, public_key: &str) -> Result<()> {
    let key = format!("{IDENTITIES_PREFIX}{id}.json");
    let claim = IdentityClaim { id: id.into(), kind: kind.into(), public_key: public_key.into(), claimed_at: now_ms() };
    match blobs.put_bytes(&key, encode(&claim)?, PutMode::CreateOnly).await {
        Ok(_) => Ok(()),
        Err(e) if e.is("exists") => {
            let (_, bytes) =
                blobs.get_bytes(&key).await?.ok_or_else(|| Refusal::new("blobs-unavailable", "an identity claim vanished").retryable())?;
            let existing: IdentityClaim = decode(&key, &bytes)?;
            if existing.public_key == public_key && existing.kind == kind {
                Ok(())
            } else {
                Err(Refusal::new("identity-claimed", format!("the id {id:?} is already claimed by another {} key", existing.kind))
                    .with_data(json!({ "id": id, "kind": existing.kind })))
            }
        }
        Err(e) => Err(e),
    }
}

/// Read every node record (bounded pages); unreadable records, and signed ones whose signature
/// does not verify, are skipped with a warning. An unsigned record (a build before signed
/// records) is listed; whoever acts on a record's address checks more ([`forward`]).
pub async fn read_nodes(blobs: &Blobs) -> Result<Vec<NodeRecord>> {
    let mut nodes = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = blobs.list(NODES_PREFIX, cursor.as_deref(), 500).await?;
        for item in &page.items {
            if let Some((_, bytes)) = blobs.get_bytes(&item.key).await? {
                let checked = match signed::verify(&item.key, &bytes) {
                    Err(e) if e.is("fleet-record-unsigned") => decode::<NodeRecord>(&item.key, &bytes),
                    other => other,
                };
                match checked {
                    Ok(record) => nodes.push(record),
                    Err(e) => tracing::warn!(key = %item.key, "skipping a node record: {}", e.message),
                }
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(nodes),
        }
    }
}

/// This process as a member of the fleet.
pub struct Node {
    /// The bucket the fleet coordinates through.
    pub blobs: Blobs,
    /// This node's id and key pair.
    pub identity: NodeIdentity,
    /// The fleet's intervals and windows.
    pub timing: Timing,
    /// The network this node joined the fleet over (`lan`, `wireguard`, `public`), if one was set.
    pub network: Option<String>,
    /// The record as this node last wrote it: every write starts from here, never from the
    /// bucket, so a record someone else changed is never signed as this node's.
    own: tokio::sync::Mutex<Option<NodeRecord>>,
}

impl Node {
    /// This process in the fleet of `blobs`; [`Node::register`] makes it a member.
    pub fn new(blobs: Blobs, identity: NodeIdentity, timing: Timing, network: Option<String>) -> Node {
        Node { blobs, identity, timing, network, own: tokio::sync::Mutex::new(None) }
    }

    /// Claim the id and write the node record (versions, addresses, labels; a fresh beat).
    pub async fn register(&self, addresses: Addresses, labels: BTreeMap<String, String>, serves: Vec<String>) -> Result<NodeRecord> {
        claim_identity(&self.blobs, &self.identity.id, "node", &self.identity.public_key()).await?;
        let at = now_ms();
        let record = NodeRecord {
            node_id: self.identity.id.clone(),
            public_key: self.identity.public_key(),
            addresses,
            labels,
            versions: Some(Versions::of_this_build()),
            serves,
            network: self.network.clone(),
            booted_at: at,
            heartbeat_at: Some(at),
            draining_at: None,
            signature: None,
        };
        let record = signed::sign(&self.identity, record)?;
        let mut own = self.own.lock().await;
        self.blobs.put_bytes(&node_key(&record.node_id), encode(&record)?, PutMode::Overwrite).await?;
        *own = Some(record.clone());
        tracing::info!(node = %record.node_id, "registered in the fleet");
        Ok(record)
    }

    /// Change one field of this node's record: one write at a time, from the record as this
    /// node last wrote it, so a beat never undoes a drain and what another writer put in the
    /// bucket is replaced, not signed.
    async fn update(&self, change: impl Fn(&mut NodeRecord)) -> Result<BlobMeta> {
        let mut own = self.own.lock().await;
        let current = own.as_ref().ok_or_else(|| Refusal::new("node-unregistered", "this node has not registered in the fleet"))?;
        let mut next = current.clone();
        change(&mut next);
        let next = signed::sign(&self.identity, next)?;
        let written = self.blobs.put_bytes(&node_key(&self.identity.id), encode(&next)?, PutMode::Overwrite).await?;
        *own = Some(next);
        Ok(written)
    }

    /// Write a heartbeat: set this node's `heartbeatAt` to now.
    pub async fn beat(&self) -> Result<()> {
        self.update(|r| r.heartbeat_at = Some(now_ms())).await.map(|_| ())
    }

    /// Say this node is leaving: first thing on shutdown. Best effort, bounded, never fails.
    pub async fn drain(&self) {
        match tokio::time::timeout(Duration::from_secs(5), self.update(|r| r.draining_at = Some(now_ms()))).await {
            Ok(Ok(_)) => tracing::info!(node = %self.identity.id, "draining: marked as leaving"),
            Ok(Err(e)) => tracing::warn!(code = %e.code, "could not mark this node as draining: {}", e.message),
            Err(_) => tracing::warn!("could not mark this node as draining: the bucket did not answer in time"),
        }
    }
}

/// A deploy freeze: while it stands, plugin installs and upgrades are refused `deploy-frozen`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Freeze {
    /// When it was put in place, in milliseconds since the Unix epoch.
    pub since: u64,
    /// Who put it in place.
    pub by: String,
    /// Why, as given (trimmed).
    pub reason: String,
}

/// The deploy freeze that stands, if any.
pub async fn read_freeze(blobs: &Blobs) -> Result<Option<Freeze>> {
    match blobs.get_bytes(FREEZE_KEY).await? {
        Some((_, bytes)) => decode(FREEZE_KEY, &bytes).map(Some),
        None => Ok(None),
    }
}

/// Put a deploy freeze in place. Refused `invalid-request` without a reason of 1 to 500 bytes,
/// and `deploy-frozen` while a freeze already stands.
pub async fn freeze(blobs: &Blobs, by: &str, reason: &str) -> Result<Freeze> {
    if reason.trim().is_empty() || reason.len() > 500 {
        return Err(Refusal::invalid_request("a freeze needs a reason of 1 to 500 bytes").with_data(json!({ "field": "reason" })));
    }
    let freeze = Freeze { since: now_ms(), by: by.into(), reason: reason.trim().into() };
    match blobs.put_bytes(FREEZE_KEY, encode(&freeze)?, PutMode::CreateOnly).await {
        Ok(_) => Ok(freeze),
        Err(e) if e.is("exists") => Err(Refusal::new("deploy-frozen", "a deploy freeze already stands; lift it first")),
        Err(e) => Err(e),
    }
}

/// Lift the deploy freeze; `false` when none was standing.
pub async fn unfreeze(blobs: &Blobs) -> Result<bool> {
    blobs.delete(FREEZE_KEY).await
}

/// Refuse a deploy (plugin install or upgrade) while a freeze stands.
pub async fn refuse_if_frozen(blobs: &Blobs) -> Result<()> {
    if let Some(f) = read_freeze(blobs).await? {
        return Err(Refusal::new("deploy-frozen", format!("deploys are frozen by {}: {}", f.by, f.reason)).with_data(json!(f)));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
