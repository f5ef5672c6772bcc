//! Log payloads into Capstan's bucket, and the sweep that lets logs go.
//!
//! [`drain`] writes a capture's inline payloads as one segment
//! `runtime-logs/<serviceId>/<assignmentId>/<captureId>/<first>-<last>.jsonl` (one batch's JSON
//! per line) when the oldest waited 5 minutes, when they fill 1 MiB, when the capture's final
//! batch arrived, or — largest capture first — while all inline payloads pass 16 MiB. Only after
//! the write are the rows moved onto the segment, so a payload is always in the store or in a
//! written segment: a stop loses none. At a batch a second per capture that is one object per
//! capture every five minutes, not three hundred.
//!
//! [`sweep`] marks attempts their slot no longer holds as released, drops batches older than the
//! retention (`runtimeLogRetentionDays`, default 30) and whole attempts past it or beyond the
//! newest [`super::ATTEMPTS_PER_SLOT`] of a slot, stating every drop in the attempt's
//! truncation, and removes segments no row names.

use super::{ATTEMPTS_PER_SLOT, BUCKET_PREFIX, BatchRow, Inline, LOG_ATTEMPTS, LOG_BATCHES, LOG_INLINE, LogAttempt, Payload};
use crate::Context;
use capstan_blobs::{Blobs, PutMode};
use capstan_core::clock::now_ms;
use capstan_core::refusal::Result;
use capstan_inventory::{Entity, parse, to_value};
use capstan_store::{MAX_PAGE, Store};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

/// A capture's inline payloads are written once the oldest waited this long.
pub const SEGMENT_AGE_MS: u64 = 5 * 60 * 1000;
/// … or once they fill this much (a larger batch is a segment of its own).
pub const SEGMENT_BYTES: u64 = 1024 * 1024;
/// Past this much inline payload in all, the largest captures are written first.
pub const PRESSURE_BYTES: u64 = 16 * 1024 * 1024;
/// The host setting: days a batch is kept (default [`DEFAULT_RETENTION_DAYS`]).
pub const RETENTION_SETTING: &str = capstan_inventory::settings::RUNTIME_LOG_RETENTION_DAYS;
/// Days a batch is kept while the setting is unset.
pub const DEFAULT_RETENTION_DAYS: u64 = 30;
const DAY_MS: u64 = 24 * 60 * 60 * 1000;

/// The retention in milliseconds.
pub async fn retention_ms(store: &Store) -> Result<u64> {
    let days = capstan_inventory::settings::days_or(store, RETENTION_SETTING, DEFAULT_RETENTION_DAYS).await?;
    Ok(days * DAY_MS)
}

/// When a released attempt's logs go whole: the later of its issue, its last batch and its
/// release, plus the retention; `None` while its slot holds it.
pub fn expires_at(attempt: &LogAttempt, retention_ms: u64) -> Option<u64> {
    let released = attempt.released_at?;
    Some(released.max(attempt.issued_at).max(attempt.last_batch_at.unwrap_or(0)) + retention_ms)
}

/// The object key of a segment.
pub fn segment_key(service_id: &str, assignment_id: &str, capture_id: &str, first: u64, last: u64) -> String {
    format!("{BUCKET_PREFIX}{service_id}/{assignment_id}/{capture_id}/{first}-{last}.jsonl")
}

/// A segment's batches by (capture, sequence).
pub type Segment = HashMap<(String, u64), Payload>;

/// A segment's batches; `None` when it is gone or does not read.
pub async fn read(blobs: &Blobs, key: &str) -> Option<Segment> {
    let (_, bytes) = blobs.get_bytes(key).await.ok()??;
    let text = String::from_utf8(bytes).ok()?;
    let mut batches = HashMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let payload: Payload = serde_json::from_str(line).ok()?;
        batches.insert((payload.capture_id.clone(), payload.sequence), payload);
    }
    Some(batches)
}

/// What one drain pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Segments written.
    pub segments: usize,
    /// Batches moved onto them.
    pub batches: usize,
    /// Inline payload bytes left.
    pub inline_bytes: u64,
}

/// One capture's inline payloads, in sequence order.
struct Pending {
    rows: Vec<Entity<Inline>>,
    bytes: u64,
}

/// Write every capture's due inline payloads as segments.
pub async fn drain(cx: &Context) -> Result<Drained> {
    drain_at(cx, now_ms()).await
}

/// [`drain`] as of `now` (milliseconds).
pub async fn drain_at(cx: &Context, now: u64) -> Result<Drained> {
    // ids sort by attempt, capture and number, so a scan meets each capture's rows together
    let mut captures: BTreeMap<(String, String), Pending> = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = scan(&cx.store, LOG_INLINE, cursor.as_deref()).await?;
        for doc in &page.documents {
            let row: Entity<Inline> = parse(doc)?;
            let pending =
                captures.entry((row.data.assignment_id.clone(), row.data.capture_id.clone())).or_insert(Pending { rows: vec![], bytes: 0 });
            pending.bytes += row.data.bytes;
            pending.rows.push(row);
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut total: u64 = captures.values().map(|p| p.bytes).sum();
    let due = |p: &Pending| p.bytes >= SEGMENT_BYTES || p.rows.iter().any(|r| r.data.last || r.data.accepted_at + SEGMENT_AGE_MS <= now);
    let mut order: Vec<(String, String)> = captures.iter().filter(|(_, p)| due(p)).map(|(k, _)| k.clone()).collect();
    // under pressure, the largest captures too, until what is left fits
    let mut by_size: Vec<(&(String, String), u64)> = captures.iter().filter(|(_, p)| !due(p)).map(|(k, p)| (k, p.bytes)).collect();
    by_size.sort_by_key(|(_, bytes)| std::cmp::Reverse(*bytes));
    let mut left = total - order.iter().map(|k| captures[k].bytes).sum::<u64>();
    for (key, bytes) in by_size {
        if left <= PRESSURE_BYTES {
            break;
        }
        order.push(key.clone());
        left -= bytes;
    }
    let mut drained = Drained::default();
    for key in order {
        let pending = captures.remove(&key).expect("listed");
        for chunk in chunks(pending.rows) {
            let moved = write_segment(cx, &chunk).await?;
            drained.segments += 1;
            drained.batches += moved;
            total -= chunk.iter().map(|r| r.data.bytes).sum::<u64>();
        }
    }
    drained.inline_bytes = total;
    cx.logs.inline_bytes.store(total, Ordering::Relaxed);
    Ok(drained)
}

/// A capture's rows cut into segments of at most [`SEGMENT_BYTES`] (a larger batch alone).
fn chunks(rows: Vec<Entity<Inline>>) -> Vec<Vec<Entity<Inline>>> {
    let mut out: Vec<Vec<Entity<Inline>>> = Vec::new();
    let mut bytes = 0;
    for row in rows {
        if out.is_empty() || bytes + row.data.bytes > SEGMENT_BYTES {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += row.data.bytes;
        out.last_mut().expect("pushed").push(row);
    }
    out
}

/// Write one segment, then move its rows onto it: answers how many moved.
async fn write_segment(cx: &Context, rows: &[Entity<Inline>]) -> Result<usize> {
    let (first, last) = (&rows[0].data, &rows[rows.len() - 1].data);
    let key = segment_key(&first.service_id, &first.assignment_id, &first.capture_id, first.sequence, last.sequence);
    let mut body = String::new();
    for row in rows {
        body.push_str(&row.data.payload);
        body.push('\n');
    }
    cx.blobs.put_bytes(&key, body.into_bytes(), PutMode::Overwrite).await?;
    let key = &key;
    cx.store
        .transact(|tx| async move {
            let mut moved = 0;
            for row in rows {
                // a row a bound dropped meanwhile is not moved (its segment line is unread)
                let Some(doc) = tx.get(LOG_BATCHES, &row.id).await? else { continue };
                let mut batch: Entity<BatchRow> = parse(&doc)?;
                batch.data.segment = Some(key.clone());
                tx.replace(LOG_BATCHES, &row.id, batch.revision, to_value(&batch.data)?).await?;
                if let Some(inline) = tx.get(LOG_INLINE, &row.id).await? {
                    tx.delete(LOG_INLINE, &row.id, inline.revision).await?;
                }
                moved += 1;
            }
            Ok(moved)
        })
        .await
}

/// The bytes of every inline payload.
pub async fn inline_total(store: &Store) -> Result<u64> {
    let mut total = 0;
    let mut cursor: Option<String> = None;
    loop {
        let page = scan(store, LOG_INLINE, cursor.as_deref()).await?;
        for doc in &page.documents {
            total += doc.data.get("bytes").and_then(serde_json::Value::as_u64).unwrap_or(0);
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(total),
        }
    }
}

/// One page of a collection, in id order after `cursor`.
async fn scan(store: &Store, collection: &str, cursor: Option<&str>) -> Result<capstan_store::Page> {
    store.transact(|tx| async move { tx.scan(collection, cursor, MAX_PAGE).await }).await
}

/// Whether some batch row names the segment `key`.
async fn named(store: &Store, key: &str) -> Result<bool> {
    store.transact(|tx| async move { Ok(!tx.find(LOG_BATCHES, "by_segment", &[json!(key)], None, 1).await?.documents.is_empty()) }).await
}

/// Remove the segments among `keys` that no row names any more.
pub async fn forget_unheld(cx: &Context, keys: Vec<String>) {
    let mut keys = keys;
    keys.sort();
    keys.dedup();
    for key in keys {
        match named(&cx.store, &key).await {
            Ok(false) => {
                if let Err(refusal) = cx.blobs.delete(&key).await {
                    tracing::warn!(code = %refusal.code, "removing a log segment failed; the sweep tries again: {}", refusal.message);
                }
            }
            Ok(true) => {}
            Err(refusal) => tracing::warn!(code = %refusal.code, "reading who holds a log segment failed: {}", refusal.message),
        }
    }
}

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Attempts newly seen released.
    pub released: usize,
    /// Attempts dropped whole (expired, or beyond the newest of their slot).
    pub attempts: usize,
    /// Batches dropped for their age.
    pub batches: usize,
    /// Segments removed.
    pub segments: usize,
}

/// Let go what the retention and the per-slot bound no longer keep.
pub async fn sweep(cx: &Context) -> Result<Swept> {
    sweep_at(cx, now_ms()).await
}

/// [`sweep`] as of `now` (milliseconds).
pub async fn sweep_at(cx: &Context, now: u64) -> Result<Swept> {
    let retention = retention_ms(&cx.store).await?;
    let mut swept = Swept::default();
    let mut attempts: Vec<Entity<LogAttempt>> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = scan(&cx.store, LOG_ATTEMPTS, cursor.as_deref()).await?;
        attempts.extend(page.documents.iter().map(parse).collect::<Result<Vec<_>>>()?);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    // the newest attempts of each slot are kept
    let mut by_slot: BTreeMap<(String, String), Vec<&Entity<LogAttempt>>> = BTreeMap::new();
    for attempt in &attempts {
        by_slot.entry((attempt.data.service_id.clone(), attempt.data.slot.clone())).or_default().push(attempt);
    }
    let mut beyond: Vec<String> = Vec::new();
    for list in by_slot.values_mut() {
        list.sort_by(|a, b| b.data.issued_at.cmp(&a.data.issued_at).then_with(|| a.id.cmp(&b.id)));
        beyond.extend(list.iter().skip(ATTEMPTS_PER_SLOT).map(|a| a.id.clone()));
    }
    for attempt in &attempts {
        let id = attempt.id.as_str();
        let held = cx.store.transact(|tx| async move { Ok(crate::slots::by_assignment(&tx, id).await?.is_some()) }).await?;
        let mut record = attempt.data.clone();
        if !held && record.released_at.is_none() {
            record.released_at = Some(now);
            swept.released += 1;
        }
        let expired = !held && expires_at(&record, retention).is_some_and(|at| at <= now);
        let segments = if expired || beyond.iter().any(|b| b == id) {
            swept.attempts += 1;
            drop_attempt(cx, id).await?
        } else {
            let (dropped, segments) = drop_older(cx, id, now.saturating_sub(retention), record.released_at).await?;
            swept.batches += dropped;
            segments
        };
        swept.segments += segments.len();
        forget_unheld(cx, segments).await;
    }
    swept.segments += remove_unnamed(cx).await?;
    Ok(swept)
}

/// Drop an attempt whole: its rows, payloads and record. Answers the segments its rows named.
async fn drop_attempt(cx: &Context, id: &str) -> Result<Vec<String>> {
    let mut segments = Vec::new();
    loop {
        // a page of rows per transaction, the record with the last
        let (named, done) = cx
            .store
            .transact(|tx| async move {
                let page = tx.find(LOG_BATCHES, "by_attempt", &[json!(id)], None, 256).await?;
                let mut named = Vec::new();
                for doc in &page.documents {
                    let row: Entity<BatchRow> = parse(doc)?;
                    named.extend(super::drop_row(&tx, &row).await?);
                }
                let done = page.next_cursor.is_none();
                if done && let Some(doc) = tx.get(LOG_ATTEMPTS, id).await? {
                    tx.delete(LOG_ATTEMPTS, id, doc.revision).await?;
                }
                Ok((named, done))
            })
            .await?;
        segments.extend(named);
        if done {
            return Ok(segments);
        }
    }
}

/// Drop an attempt's batches accepted before `cutoff` (stated as `retention`), and record its
/// release. Answers how many went and the segments they named.
async fn drop_older(cx: &Context, id: &str, cutoff: u64, released_at: Option<u64>) -> Result<(usize, Vec<String>)> {
    cx.store
        .transact(|tx| async move {
            let Some(doc) = tx.get(LOG_ATTEMPTS, id).await? else { return Ok((0, vec![])) };
            let mut attempt: Entity<LogAttempt> = parse(&doc)?;
            let mut segments = Vec::new();
            let mut dropped = 0;
            let rows = tx.find_all(LOG_BATCHES, "by_attempt", &[json!(id)]).await?;
            for doc in &rows {
                let row: Entity<BatchRow> = parse(doc)?;
                if row.data.accepted_at >= cutoff {
                    continue;
                }
                segments.extend(super::drop_row(&tx, &row).await?);
                let a = &mut attempt.data;
                a.kept.batches = a.kept.batches.saturating_sub(1);
                a.kept.bytes = a.kept.bytes.saturating_sub(row.data.bytes);
                a.kept.entries = a.kept.entries.saturating_sub(row.data.entries);
                a.truncation.dropped.add(1, row.data.bytes, row.data.entries);
                a.truncation.reasons.insert("retention".into());
                dropped += 1;
            }
            let released = attempt.data.released_at.is_none() && released_at.is_some();
            if dropped > 0 || released {
                attempt.data.released_at = attempt.data.released_at.or(released_at);
                tx.replace(LOG_ATTEMPTS, id, attempt.revision, to_value(&attempt.data)?).await?;
            }
            Ok((dropped, segments))
        })
        .await
}

/// Remove the objects under `runtime-logs/` no row names and no inline payload is about to
/// be written over (a write whose rows were never moved, or a segment a crash left behind).
async fn remove_unnamed(cx: &Context) -> Result<usize> {
    let mut removed = 0;
    let mut cursor: Option<String> = None;
    loop {
        let page = cx.blobs.list(BUCKET_PREFIX, cursor.as_deref(), capstan_blobs::MAX_LIST_LIMIT).await?;
        for item in &page.items {
            if named(&cx.store, &item.key).await? || pending_for(cx, &item.key).await? {
                continue;
            }
            if cx.blobs.delete(&item.key).await? {
                removed += 1;
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(removed),
        }
    }
}

/// Whether inline payloads of the segment's capture and range still wait to be moved onto it.
async fn pending_for(cx: &Context, key: &str) -> Result<bool> {
    let Some(rest) = key.strip_prefix(BUCKET_PREFIX) else { return Ok(false) };
    let parts: Vec<&str> = rest.split('/').collect();
    let [_, assignment, capture, range] = parts.as_slice() else { return Ok(false) };
    let Some((first, _)) = range.trim_end_matches(".jsonl").split_once('-') else { return Ok(false) };
    let Ok(first) = first.parse::<u64>() else { return Ok(false) };
    let (assignment, capture) = (assignment.to_string(), capture.to_string());
    cx.store
        .transact(|tx| {
            let (assignment, capture) = (assignment.clone(), capture.clone());
            async move {
                let Some(doc) = tx.get(LOG_ATTEMPTS, &assignment).await? else { return Ok(false) };
                let attempt: Entity<LogAttempt> = parse(&doc)?;
                let Some(ordinal) = attempt.data.captures.iter().position(|c| c.capture_id == capture) else { return Ok(false) };
                Ok(tx.get(LOG_INLINE, &super::batch_id(&assignment, ordinal, first)).await?.is_some())
            }
        })
        .await
}
