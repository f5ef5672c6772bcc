//! The active catalog, kept last-known-good in the plugin's store: the envelope text in chunks
//! named by their SHA-256 (`chunks`), and a pointer (`catalog/pointer`) that only ever moves to
//! a greater revision. Every read verifies the stored envelope again against the keys trusted
//! now, so a catalog whose key the operator stopped trusting stops being used. Nodes of a fleet
//! share the store, so they share what is active: the greatest revision any of them stored.

use capstan_catalog::{CatalogError, PublisherKey, Verified};
use capstan_sdk::store::{self, Batch};
use capstan_sdk::{Refusal, Result, Value, inventory, json};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const CATALOG: &str = "catalog";
pub const CHUNKS: &str = "chunks";
const POINTER: &str = "pointer";
/// Chunk size: well inside the store's 1 MiB document bound once JSON-encoded.
const CHUNK_BYTES: usize = 256 * 1024;
/// The setting listing catalog keys the operator trusts.
pub const TRUSTED_KEYS_SETTING: &str = "appStoreTrustedCatalogKeys";

/// `catalog/pointer`: which stored envelope is active.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pointer {
    pub revision: u64,
    pub digest: String,
    /// SHA-256 (hex) of each chunk, in order.
    pub chunks: Vec<String>,
    pub activated_at: u64,
    /// Where it came from: a source URL, or `import`.
    pub source: String,
}

#[derive(Serialize, Deserialize)]
struct Chunk {
    text: String,
}

/// A catalog refusal as the plugin answers it: the catalog's own code, message and data.
pub fn refusal(e: CatalogError) -> Refusal {
    Refusal::new(e.code(), e.to_string()).with_data(e.data())
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The catalog keys trusted now: those the operator lists in `appStoreTrustedCatalogKeys`.
/// (The host validates the setting; an entry that does not parse is skipped and logged.)
pub fn trusted_keys() -> Result<Vec<PublisherKey>> {
    let settings = inventory::settings::<Value>()?;
    let listed = settings.data.get(TRUSTED_KEYS_SETTING).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut keys = Vec::new();
    for text in listed.iter().filter_map(Value::as_str) {
        match text.parse::<PublisherKey>() {
            Ok(key) => keys.push(key),
            Err(e) => capstan_sdk::warn!("{TRUSTED_KEYS_SETTING} holds a key that does not parse: {}", e.reason()),
        }
    }
    Ok(keys)
}

/// Why no catalog is active, as `appstore-catalog-unavailable` (retryable) names it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unavailable {
    pub code: String,
    pub message: String,
}

impl Unavailable {
    pub fn refusal(&self) -> Refusal {
        Refusal::new("appstore-catalog-unavailable", format!("no verified App Store catalog is active: {}", self.message))
            .with_data(json!({ "cause": self.code }))
            .retryable()
    }
}

fn never_loaded() -> Unavailable {
    Unavailable {
        code: "catalog-not-loaded".into(),
        message: "no catalog was ever activated here: import one, or list sources in appStoreCatalogSources".into(),
    }
}

/// The pointer and its store revision, if a catalog was ever stored.
pub fn pointer() -> Result<Option<(Pointer, u64)>> {
    Ok(store::get::<Pointer>(CATALOG, POINTER)?.map(|d| (d.data, d.revision)))
}

/// The stored envelope text of `pointer`, its chunks checked against their names.
fn stored_text(pointer: &Pointer) -> std::result::Result<String, Unavailable> {
    let mut text = String::new();
    for name in &pointer.chunks {
        let chunk = store::get::<Chunk>(CHUNKS, name).map_err(|e| Unavailable { code: e.code().into(), message: e.message().into() })?;
        let Some(chunk) = chunk else {
            return Err(Unavailable { code: "catalog-chunk-missing".into(), message: format!("stored chunk {name} is missing") });
        };
        if hex::encode(Sha256::digest(chunk.data.text.as_bytes())) != *name {
            return Err(Unavailable {
                code: "catalog-chunk-corrupt".into(),
                message: format!("stored chunk {name} does not match its name"),
            });
        }
        text.push_str(&chunk.data.text);
    }
    Ok(text)
}

/// The active catalog, verified again now; or why there is none.
pub fn current() -> Result<std::result::Result<(Verified, Pointer), Unavailable>> {
    let Some((pointer, _)) = pointer()? else { return Ok(Err(never_loaded())) };
    let text = match stored_text(&pointer) {
        Ok(text) => text,
        Err(why) => return Ok(Err(why)),
    };
    Ok(match capstan_catalog::verify(text.as_bytes(), &trusted_keys()?) {
        Ok(verified) => Ok((verified, pointer)),
        Err(e) => Err(Unavailable { code: e.code().into(), message: format!("the stored catalog no longer verifies: {e}") }),
    })
}

/// The active catalog, or `appstore-catalog-unavailable` with its cause.
pub fn require() -> Result<(Verified, Pointer)> {
    current()?.map_err(|why| why.refusal())
}

/// What an activation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// The candidate is now active.
    Activated,
    /// The candidate is the active catalog already.
    Unchanged,
    /// Another node stored a greater revision meanwhile; that one stays active.
    Superseded,
}

/// Verify `envelope` and make it active if it may succeed the active catalog: a trusted
/// signature, its digest, the supported contract, a greater revision, and every published
/// version kept as it was. A refusal leaves the active catalog as it is.
pub fn activate(envelope: &[u8], source: &str) -> Result<(Outcome, Verified)> {
    let trusted = trusted_keys()?;
    let candidate = capstan_catalog::verify(envelope, &trusted).map_err(refusal)?;
    for _ in 0..5 {
        let stored = pointer()?;
        let active = match &stored {
            Some((p, _)) => stored_text(p).ok().and_then(|t| capstan_catalog::verify(t.as_bytes(), &trusted).ok()),
            None => None,
        };
        if active.as_ref().is_some_and(|a| a.same_as(&candidate)) {
            return Ok((Outcome::Unchanged, candidate));
        }
        // the pointer never moves back, even past a stored catalog that no longer verifies
        // (its key was removed): succession is judged against it only while it verifies
        if let Some((pointer, _)) = &stored
            && candidate.revision() <= pointer.revision
        {
            return Err(refusal(CatalogError::RevisionNotNewer { active: pointer.revision, candidate: candidate.revision() }));
        }
        capstan_catalog::check_succession(active.as_ref(), &candidate).map_err(refusal)?;
        let text = std::str::from_utf8(envelope).map_err(|_| Refusal::new("catalog-malformed", "the catalog is not UTF-8 text"))?;
        let chunks = store_chunks(text)?;
        let next = Pointer {
            revision: candidate.revision(),
            digest: candidate.digest_hex().to_string(),
            chunks,
            activated_at: now_ms(),
            source: source.to_string(),
        };
        match Batch::new().put(CATALOG, POINTER, stored.as_ref().map(|(_, r)| *r), &next).commit() {
            Ok(_) => {
                capstan_sdk::info!("catalog revision {} activated from {source}", candidate.revision());
                return Ok((Outcome::Activated, candidate));
            }
            // the pointer moved meanwhile: judge the candidate against what is there now
            Err(e) if e.is("conflict") || e.is("exists") => continue,
            Err(e) => return Err(e),
        }
    }
    match current()? {
        Ok((active, _)) if active.revision() >= candidate.revision() => Ok((Outcome::Superseded, active)),
        _ => Err(Refusal::new("store-busy", "the catalog pointer kept moving; try again").retryable()),
    }
}

/// Store the envelope text in chunks named by their SHA-256 (already stored ones are kept).
fn store_chunks(text: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(CHUNK_BYTES);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (piece, after) = rest.split_at(end);
        let name = hex::encode(Sha256::digest(piece.as_bytes()));
        if store::get::<Chunk>(CHUNKS, &name)?.is_none() {
            match Batch::new().insert(CHUNKS, &name, &Chunk { text: piece.to_string() }).commit() {
                Ok(_) => {}
                Err(e) if e.is("exists") => {} // the same name holds the same text
                Err(e) => return Err(e),
            }
        }
        names.push(name);
        rest = after;
    }
    Ok(names)
}
