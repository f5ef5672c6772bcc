//! Mutation receipts: a write that names a `mutationId` may be sent again — after a lost
//! answer, say — and gets its first answer back without anything happening twice. A receipt
//! keeps a salted digest of the request, never the request itself (it may carry a password or
//! a sealed value), so only the exact same request replays; the same id with another request
//! is refused `mutation-reused`.

use capstan_core::refusal::{Refusal, Result};
use capstan_store::Tx;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use sha2::{Digest, Sha256};

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

fn digest(salt: &str, request: &impl Serialize) -> Result<String> {
    let body = serde_json::to_vec(request).map_err(Refusal::internal)?;
    Ok(hex::encode(Sha256::new().chain_update(salt.as_bytes()).chain_update(&body).finalize()))
}

/// The answer recorded for `actor`'s mutation `mutation_id` if this exact request made it;
/// `None` when the id is new (or there is none); `mutation-reused` when it named a different
/// request.
pub async fn replay<T: DeserializeOwned>(tx: &Tx, actor: &str, mutation_id: Option<&str>, request: &impl Serialize) -> Result<Option<T>> {
    let Some(mutation_id) = mutation_id else { return Ok(None) };
    check_mutation_id(mutation_id)?;
    let Some(receipt) = tx.get(RECEIPTS, &receipt_id(actor, mutation_id)).await? else { return Ok(None) };
    let salt = receipt.data["salt"].as_str().unwrap_or_default();
    if receipt.data["digest"].as_str() != Some(digest(salt, request)?.as_str()) {
        return Err(Refusal::new("mutation-reused", "this mutationId was used for a different request")
            .with_data(json!({ "mutationId": mutation_id })));
    }
    serde_json::from_value(receipt.data["answer"].clone()).map(Some).map_err(Refusal::internal)
}

/// Record the answer of `actor`'s mutation (if it names one) in the transaction that made it.
pub async fn record(tx: &Tx, actor: &str, mutation_id: Option<&str>, request: &impl Serialize, answer: &impl Serialize) -> Result<()> {
    let Some(mutation_id) = mutation_id else { return Ok(()) };
    let salt = hex::encode(rand::random::<[u8; 16]>());
    let receipt = json!({
        "actor": actor,
        "salt": salt,
        "digest": digest(&salt, request)?,
        "answer": answer,
        "at": capstan_core::clock::now_secs(),
    });
    tx.insert(RECEIPTS, &receipt_id(actor, mutation_id), receipt).await.map(drop)
}
