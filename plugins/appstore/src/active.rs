//! The active catalog, kept last-known-good in the plugin's store: the envelope text in chunks
//! named by their SHA-256 (`chunks`), and a pointer (`catalog/pointer`) that only ever moves to
//! a greater revision. Every read verifies the stored envelope again against the keys trusted
//! now, so a catalog whose key the operator stopped trusting stops being used. Nodes of a fleet
//! share the store, so they share what is active: the greatest revision any of them stored.
//!
//! Chunks no pointer names any more (those of superseded catalogs) are deleted by
//! [`collect_garbage`] once they are older than [`CHUNK_GRACE_MS`]; its comment argues why
//! that never deletes a chunk an activation in flight on another node is about to point to.

use capstan_catalog::{CatalogError, PublisherKey, Verified};
/// Milliseconds since the epoch.
pub use capstan_sdk::now_ms;
use capstan_sdk::store::{self, Batch};
use capstan_sdk::{Refusal, Result, Value, json};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;

pub const CATALOG: &str = "catalog";
pub const CHUNKS: &str = "chunks";
const POINTER: &str = "pointer";
/// Chunk size: well inside the store's 1 MiB document bound once JSON-encoded.
const CHUNK_BYTES: usize = 256 * 1024;
/// How long a chunk no pointer names is kept after an activation last stored or claimed it.
pub const CHUNK_GRACE_MS: u64 = 60 * 60 * 1000;
/// An activation reusing a stored chunk stamps it again when its stamp is older than this, so
/// every chunk an activation names is at most this old once the activation has claimed it.
const CHUNK_RESTAMP_MS: u64 = CHUNK_GRACE_MS / 2;
/// Chunks read per page by the cleanup (each up to 256 KiB of text).
const CLEANUP_PAGE: u32 = 8;

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

/// `chunks/<sha256 of text>`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk {
    text: String,
    /// When an activation last stored or claimed it (ms since the epoch). Chunks stored before
    /// the cleanup existed have none: the cleanup stamps them first and counts from then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stored_at: Option<u64>,
}

/// A catalog refusal as the plugin answers it: the catalog's own code, message and data.
pub fn refusal(e: CatalogError) -> Refusal {
    Refusal::new(e.code(), e.to_string()).with_data(e.data())
}

/// The catalog keys trusted now: those the operator lists in `appstore.trustedCatalogKeys`, and
/// this host's demo signer where the demo was installed.
/// (The host checks the setting's form; an entry that still does not parse is skipped and logged.)
pub fn trusted_keys() -> Result<Vec<PublisherKey>> {
    let listed = crate::settings::get()?.trusted_catalog_keys.0;
    let mut keys = Vec::new();
    for text in &listed {
        match text.parse::<PublisherKey>() {
            Ok(key) => keys.push(key),
            Err(e) => capstan_sdk::warn!("appstore.trustedCatalogKeys holds a key that does not parse: {}", e.reason()),
        }
    }
    // the demo catalog's signer, on the host the demo was installed on (`serve --dev --demo`)
    keys.extend(crate::demo::trusted_key()?);
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
        message: "no catalog was ever activated here: import one, or list sources in appstore.catalogSources".into(),
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

/// Store the envelope text in chunks named by their SHA-256 (already stored ones are kept, and
/// claimed: see [`claim_chunk`]).
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
        claim_chunk(&name, piece)?;
        names.push(name);
        rest = after;
    }
    Ok(names)
}

/// Make `chunks/<name>` hold `piece` with a stamp younger than [`CHUNK_RESTAMP_MS`]: insert it
/// stamped now, keep it if its stamp is recent, or stamp it again (compare-and-swap, so a
/// cleanup that read the old stamp cannot delete it after).
fn claim_chunk(name: &str, piece: &str) -> Result<()> {
    let now = now_ms();
    let fresh = Chunk { text: piece.to_string(), stored_at: Some(now) };
    for _ in 0..5 {
        let written = match store::get::<Value>(CHUNKS, name)? {
            None => Batch::new().insert(CHUNKS, name, &fresh).commit(),
            Some(doc) if doc.data.get("storedAt").and_then(Value::as_u64).is_some_and(|at| now.saturating_sub(at) < CHUNK_RESTAMP_MS) => {
                return Ok(());
            }
            // the same name holds the same text; writing `piece` also mends a corrupt copy
            Some(doc) => Batch::new().replace(CHUNKS, name, doc.revision, &fresh).commit(),
        };
        match written {
            Ok(_) => return Ok(()),
            // another node stored, stamped or collected it meanwhile: look again
            Err(e) if e.is("exists") || e.is("conflict") || e.is("not-found") => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Refusal::new("store-busy", "a catalog chunk kept changing; try again").retryable())
}

/// What one cleanup did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    /// Chunks deleted: no pointer named them and they were older than the grace period.
    pub deleted: usize,
    /// Chunks without a stamp (stored before the cleanup existed) stamped now.
    pub stamped: usize,
}

/// Delete the chunks the pointer does not name that were stored or claimed more than
/// [`CHUNK_GRACE_MS`] ago.
///
/// Why this never deletes a chunk an activation in flight (on this node or another sharing
/// the store) is about to point to: an activation claims every chunk it names before it moves
/// the pointer ([`claim_chunk`]), leaving each with a stamp younger than [`CHUNK_RESTAMP_MS`]
/// (half the grace), and a plugin call lives at most 30 s (its deadline), so the pointer moves within 30 s of
/// the claim. This pass reads the pointer first: an activation that moved it earlier has its
/// chunks in the set kept; one that moves it later claimed them at most 30 s before that, so
/// their stamps are younger than half the grace plus a minute here, far from the full grace.
/// A claim that lands between this pass's read and its delete changed the chunk's revision,
/// and the delete states the revision read (compare-and-swap), so it is refused instead.
/// Wall clocks of the nodes may differ by up to half the grace (30 minutes) without harm.
pub fn collect_garbage() -> Result<Collected> {
    let keep: BTreeSet<String> = pointer()?.map(|(p, _)| p.chunks.into_iter().collect()).unwrap_or_default();
    let now = now_ms();
    let mut done = Collected::default();
    let mut cursor: Option<String> = None;
    loop {
        let page = store::scan::<Value>(CHUNKS, cursor.as_deref(), CLEANUP_PAGE)?;
        for doc in page.documents {
            if keep.contains(&doc.id) {
                continue;
            }
            let written = match doc.data.get("storedAt").and_then(Value::as_u64) {
                Some(at) if now.saturating_sub(at) >= CHUNK_GRACE_MS => {
                    Batch::new().delete(CHUNKS, &doc.id, doc.revision).commit().map(|_| done.deleted += 1)
                }
                Some(_) => continue,
                None => {
                    let mut stamped = doc.data.clone();
                    if let Some(fields) = stamped.as_object_mut() {
                        fields.insert("storedAt".into(), json!(now));
                    }
                    Batch::new().replace(CHUNKS, &doc.id, doc.revision, &stamped).commit().map(|_| done.stamped += 1)
                }
            };
            match written {
                Ok(()) => {}
                // claimed, stamped or deleted meanwhile: the next pass looks again
                Err(e) if e.is("conflict") || e.is("not-found") => {}
                Err(e) => return Err(e),
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if done.deleted > 0 {
        capstan_sdk::info!("deleted {} catalog chunks no pointer names", done.deleted);
    }
    Ok(done)
}
