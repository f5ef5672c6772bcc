//! Mutation receipts: a write that names a `mutationId` may be sent again — after a lost
//! answer, say — and gets its first answer back without anything happening twice. A receipt
//! keeps a keyed digest of the request (HMAC-SHA256 under a key derived from the keyring, see
//! [`ReceiptKeys`]), never the request itself (it may carry a password or a sealed value), so
//! only the exact same request replays; the same id with another request is refused
//! `mutation-reused`. Without the keyring, a copy of the store cannot test guesses of what a
//! request carried against its receipt.

use capstan_core::refusal::{Refusal, Result};
use capstan_store::Tx;
use hmac::{Hmac, Mac};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use zeroize::Zeroizing;

/// The keys receipts are digested with, by id (the id of the keyring KEK each is derived
/// from); new receipts use the active one, and a receipt names the key it was made with.
#[derive(Clone)]
pub struct ReceiptKeys {
    active: String,
    keys: BTreeMap<String, Zeroizing<[u8; 32]>>,
}

impl ReceiptKeys {
    /// The keys, and the id of the one new receipts use (which must be among them).
    pub fn new(active: String, keys: impl IntoIterator<Item = (String, Zeroizing<[u8; 32]>)>) -> Self {
        let keys: BTreeMap<_, _> = keys.into_iter().collect();
        assert!(keys.contains_key(&active), "the active receipt key is one of the keys");
        ReceiptKeys { active, keys }
    }
}

impl std::fmt::Debug for ReceiptKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiptKeys").field("active", &self.active).field("ids", &self.keys.keys().collect::<Vec<_>>()).finish()
    }
}

/// Receipts, by `<actor user id>:<mutationId>`.
pub const RECEIPTS: &str = "mutation_receipts";

/// A mutation id is 1–128 of `A-Z a-z 0-9 - _ . :`.
pub fn check_mutation_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 128 || !id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)) {
        return Err(Refusal::invalid_request("mutationId is 1 to 128 of A-Z a-z 0-9 - _ . :").with_data(json!({ "field": "mutationId" })));
    }
    Ok(())
}

fn receipt_id(actor: &str, mutation_id: &str) -> String {
    format!("{actor}:{mutation_id}")
}

fn keyed_digest(key: &[u8; 32], salt: &str, request: &impl Serialize) -> Result<String> {
    let body = serde_json::to_vec(request).map_err(Refusal::internal)?;
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).map_err(Refusal::internal)?;
    mac.update(salt.as_bytes());
    mac.update(&body);
    Ok(hex::encode(mac.finalize().into_bytes()))
}

/// The digest of receipts written before receipts were keyed (salted SHA-256): still read, so
/// a replay across an upgrade answers as before.
fn legacy_digest(salt: &str, request: &impl Serialize) -> Result<String> {
    let body = serde_json::to_vec(request).map_err(Refusal::internal)?;
    Ok(hex::encode(Sha256::new().chain_update(salt.as_bytes()).chain_update(&body).finalize()))
}

/// The answer recorded for `actor`'s mutation `mutation_id` if this exact request made it;
/// `None` when the id is new (or there is none); `mutation-reused` when it named a different
/// request.
pub async fn replay<T: DeserializeOwned>(
    tx: &Tx,
    keys: &ReceiptKeys,
    actor: &str,
    mutation_id: Option<&str>,
    request: &impl Serialize,
) -> Result<Option<T>> {
    let Some(mutation_id) = mutation_id else { return Ok(None) };
    check_mutation_id(mutation_id)?;
    let Some(receipt) = tx.get(RECEIPTS, &receipt_id(actor, mutation_id)).await? else { return Ok(None) };
    let salt = receipt.data["salt"].as_str().unwrap_or_default();
    let reused = |why: &str| {
        Refusal::new("mutation-reused", format!("this mutationId was used for {why}")).with_data(json!({ "mutationId": mutation_id }))
    };
    let expected = match receipt.data["key"].as_str() {
        // a key the keyring no longer holds cannot tell: never run the mutation twice
        Some(key) => keyed_digest(keys.keys.get(key).ok_or_else(|| reused("a request under a retired keyring key"))?, salt, request)?,
        None => legacy_digest(salt, request)?,
    };
    if receipt.data["digest"].as_str() != Some(expected.as_str()) {
        return Err(reused("a different request"));
    }
    serde_json::from_value(receipt.data["answer"].clone()).map(Some).map_err(Refusal::internal)
}

/// Record the answer of `actor`'s mutation (if it names one) in the transaction that made it.
pub async fn record(
    tx: &Tx,
    keys: &ReceiptKeys,
    actor: &str,
    mutation_id: Option<&str>,
    request: &impl Serialize,
    answer: &impl Serialize,
) -> Result<()> {
    let Some(mutation_id) = mutation_id else { return Ok(()) };
    let salt = hex::encode(rand::random::<[u8; 16]>());
    let receipt = json!({
        "actor": actor,
        "salt": salt,
        "key": keys.active,
        "digest": keyed_digest(&keys.keys[&keys.active], &salt, request)?,
        "answer": answer,
        "at": capstan_core::clock::now_ms(),
    });
    tx.insert(RECEIPTS, &receipt_id(actor, mutation_id), receipt).await.map(drop)
}
