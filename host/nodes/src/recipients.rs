//! Node recipients (docs/runtime.md, "Secret material"): the X25519 public key a node's agent
//! draws once per process and proves it holds (a challenge sealed to it, answered over the
//! node's runtime session). Secret material for the node's workloads is sealed to the newest
//! one only; its private half never leaves the agent's memory. Each proof is a new generation.

use capstan_core::refusal::{Refusal, Result};
use capstan_store::{CollectionSpec, Store, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One document per node (id = node id): its current recipient.
pub const NODE_RECIPIENTS: &str = "node_recipients";

/// The collection's declaration.
pub fn collection() -> CollectionSpec {
    CollectionSpec::new(NODE_RECIPIENTS)
}

/// A node's current recipient as `nodes.get` shows it (no key material beyond the public key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Recipient {
    /// 1, 2, …: one more with every proof (a restarted agent proves a new key).
    pub generation: u64,
    /// The X25519 public key, base64 (32 bytes).
    pub public_key: String,
    /// When it was proven (ms since the epoch).
    pub enrolled_at: u64,
    /// The agent process that proved it: its runtime session's nonce. Material is sealed to this
    /// recipient only for that process's session.
    #[serde(skip_serializing)]
    #[schemars(skip)]
    pub nonce: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    generation: u64,
    public_key: String,
    enrolled_at: u64,
    nonce: String,
}

impl From<Stored> for Recipient {
    fn from(s: Stored) -> Recipient {
        Recipient { generation: s.generation, public_key: s.public_key, enrolled_at: s.enrolled_at, nonce: s.nonce }
    }
}

/// The node's current recipient, if it ever proved one (nothing where the store does not keep
/// recipients).
pub async fn current(tx: &Tx, node_id: &str) -> Result<Option<Recipient>> {
    if !tx.is_declared(NODE_RECIPIENTS) {
        return Ok(None);
    }
    match tx.get(NODE_RECIPIENTS, node_id).await? {
        Some(doc) => serde_json::from_value::<Stored>(doc.data).map(|s| Some(s.into())).map_err(Refusal::internal),
        None => Ok(None),
    }
}

/// Record `public_key` (base64) as `node_id`'s next recipient generation, proven by the agent
/// process `nonce` at `now` (ms).
pub async fn record(store: &Store, node_id: &str, public_key: &str, nonce: &str, now: u64) -> Result<Recipient> {
    store
        .transact(|tx| async move {
            super::records::require_node(&tx, node_id).await?;
            let doc = tx.get(NODE_RECIPIENTS, node_id).await?;
            let last = doc.as_ref().and_then(|d| d.data["generation"].as_u64()).unwrap_or(0);
            let stored = Stored { generation: last + 1, public_key: public_key.into(), enrolled_at: now, nonce: nonce.into() };
            let data = serde_json::to_value(&stored).map_err(Refusal::internal)?;
            tx.put(NODE_RECIPIENTS, node_id, doc.map(|d| d.revision), data).await?;
            Ok(stored.into())
        })
        .await
}
