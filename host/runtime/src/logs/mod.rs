//! Workload logs (docs/runtime.md, "Workload logs"): the batches a node's agent reports over its
//! runtime session, kept per attempt (an assignment), each batch committed with its payload
//! inline in one cheap transaction ([`accept`]) and later written into Capstan's bucket as one
//! segment per capture ([`segments`]); bounded per attempt, per slot and in time, every drop
//! stated as a truncation or a gap, never silent; read back page by page ([`reads`]).

pub mod reads;
pub mod segments;

use super::Context;
use super::report_refused;
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::{Entity, parse, to_value};
use capstan_store::{CollectionSpec, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

/// One record per attempt that kept logs: id the assignment id.
pub const LOG_ATTEMPTS: &str = "runtime_log_attempts";
/// One row per kept batch: id `<assignmentId>.<capture ordinal, 3 digits>.<sequence, 10 digits>`,
/// so an attempt's rows read in delivery order.
pub const LOG_BATCHES: &str = "runtime_log_batches";
/// Payloads not yet written into a segment (same ids as their batch rows).
pub const LOG_INLINE: &str = "runtime_log_inline";
/// Where segments live in Capstan's bucket (snapshots of Capstan leave it out).
pub const BUCKET_PREFIX: &str = "runtime-logs/";

/// Entries one batch may carry.
pub const MAX_BATCH_ENTRIES: usize = 4096;
/// Line text one batch may carry.
pub const MAX_BATCH_TEXT: usize = 64 * 1024;
/// The longest line (the agent cuts longer ones and says how much it cut).
pub const MAX_LINE: usize = 16 * 1024;
/// Line text kept per attempt; past it the oldest batches go (`byte-cap`).
pub const ATTEMPT_BYTES: u64 = 8 * 1024 * 1024;
/// Batches kept per attempt; past it the oldest go (`batch-cap`).
pub const ATTEMPT_BATCHES: u64 = 8192;
/// Attempts whose logs a slot keeps: the newest.
pub const ATTEMPTS_PER_SLOT: usize = 8;
/// Past this much inline payload, new batches are refused `logs-pressure` until segments are
/// written.
pub const INLINE_REFUSE_BYTES: u64 = 32 * 1024 * 1024;

/// The logs' collections.
pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(LOG_ATTEMPTS).index("by_service", &["serviceId"]),
        CollectionSpec::new(LOG_BATCHES).index("by_attempt", &["assignmentId"]).index("by_segment", &["segment"]),
        CollectionSpec::new(LOG_INLINE),
    ]
}

/// What this process knows of the logs between passes.
#[derive(Debug, Default)]
pub struct LogState {
    /// Inline payload bytes, as the last segment pass counted them plus what was accepted since
    /// (on a fleet node that runs no drain, only a guess until counted again).
    pub inline_bytes: AtomicU64,
    /// When this process last counted the inline payloads itself (at most every few seconds).
    pub counted_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// Wakes the readers waiting for new lines (`waitMs`) when this process accepts a batch.
    pub arrived: tokio::sync::Notify,
}

/// Which stream a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One line as the node read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// When the engine took it (RFC 3339, UTC, as the engine gave it).
    pub ts: String,
    /// stdout or stderr.
    pub stream: Stream,
    /// The line, without its newline.
    pub line: String,
    /// Bytes the agent cut off a line longer than 16 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<u64>,
}

/// Lines a node could not read, counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Lost {
    /// How many.
    pub entries: u64,
    /// Why, in a word (`engine-error`).
    pub reason: String,
}

/// `runtime.reportLogs`: one batch of a capture.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BatchInput {
    /// The attempt.
    pub assignment_id: String,
    /// 16 lowercase hex characters the agent drew for this capture.
    pub capture_id: String,
    /// From 1, one more per batch of the capture.
    pub sequence: u64,
    /// The lines.
    #[serde(default)]
    pub entries: Vec<Entry>,
    /// Lines the node could not read.
    #[serde(default)]
    pub lost: Option<Lost>,
    /// The capture's last batch.
    #[serde(default, rename = "final")]
    pub last: bool,
}

/// A capture of an attempt: one agent process reading one container's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capture {
    /// Its id.
    pub capture_id: String,
    /// The highest number accepted.
    pub high: u64,
    /// Its final batch arrived.
    #[serde(default)]
    pub ended: bool,
    /// Numbers the node skipped without accounting for them (gaps).
    #[serde(default)]
    pub missing: u64,
    /// When its first batch was accepted (milliseconds).
    pub first_accepted_at: u64,
}

/// Counts of batches, line bytes and entries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Batches.
    pub batches: u64,
    /// Bytes of line text.
    pub bytes: u64,
    /// Entries.
    pub entries: u64,
}

impl Counts {
    fn add(&mut self, batches: u64, bytes: u64, entries: u64) {
        self.batches += batches;
        self.bytes += bytes;
        self.entries += entries;
    }
}

/// What bounds dropped of an attempt, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Truncation {
    /// What was dropped.
    #[serde(flatten)]
    pub dropped: Counts,
    /// `batch-cap`, `byte-cap`, `retention`.
    pub reasons: BTreeSet<String>,
}

/// Where a new capture of the attempt starts reading (docs/runtime.md, "Where a capture starts").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Resume {
    /// The newest kept entry's timestamp.
    pub ts: String,
    /// How many kept entries carry exactly that timestamp.
    pub skip: u64,
}

/// The log record of one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogAttempt {
    /// The service.
    pub service_id: String,
    /// The cluster.
    pub cluster_id: String,
    /// The node that runs it (the only one whose batches it takes).
    pub node_id: String,
    /// `<nodeId>.<index>`.
    pub slot: String,
    /// When the attempt was admitted (milliseconds).
    pub issued_at: u64,
    /// When its slot stopped holding it, once the sweep saw that.
    #[serde(default)]
    pub released_at: Option<u64>,
    /// When its last batch was accepted.
    #[serde(default)]
    pub last_batch_at: Option<u64>,
    /// In the order their first batch was accepted.
    pub captures: Vec<Capture>,
    /// What is kept.
    pub kept: Counts,
    /// What bounds dropped.
    #[serde(default)]
    pub truncation: Truncation,
    /// Where a new capture starts.
    #[serde(default)]
    pub resume: Option<Resume>,
}

/// One kept batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchRow {
    /// The service.
    pub service_id: String,
    /// The attempt.
    pub assignment_id: String,
    /// Its capture and the capture's ordinal in the attempt.
    pub capture_id: String,
    /// See [`Capture`].
    pub ordinal: usize,
    /// Its number.
    pub sequence: u64,
    /// Entries and line bytes.
    pub entries: u64,
    /// Line bytes.
    pub bytes: u64,
    /// When it was accepted (milliseconds).
    pub accepted_at: u64,
    /// Numbers missing right before it (a gap).
    #[serde(default)]
    pub missing_before: u64,
    /// The segment holding its payload, once written (else the payload is inline).
    #[serde(default)]
    pub segment: Option<String>,
}

/// A payload not yet in a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inline {
    /// The service (names the segment).
    pub service_id: String,
    /// The attempt.
    pub assignment_id: String,
    /// The capture.
    pub capture_id: String,
    /// Its number.
    pub sequence: u64,
    /// The payload's length.
    pub bytes: u64,
    /// When it was accepted.
    pub accepted_at: u64,
    /// The capture's final batch (its segment is due at once).
    #[serde(default)]
    pub last: bool,
    /// The batch as the node sent it, canonical JSON ([`Payload`]).
    pub payload: String,
}

/// A batch as kept: one line of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Payload {
    /// Its capture.
    pub capture_id: String,
    /// Its number.
    pub sequence: u64,
    /// The lines.
    pub entries: Vec<Entry>,
    /// Lines the node could not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<Lost>,
    /// The capture's last batch.
    #[serde(default, rename = "final", skip_serializing_if = "std::ops::Not::not")]
    pub last: bool,
}

/// A batch row's id: rows of an attempt sort in delivery order.
pub fn batch_id(assignment_id: &str, ordinal: usize, sequence: u64) -> String {
    format!("{assignment_id}.{ordinal:03}.{sequence:010}")
}

fn is_capture_id(id: &str) -> bool {
    id.len() == 16 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Refuse a batch no node should send (`request-invalid`).
fn check(input: &BatchInput) -> Result<()> {
    let invalid = |why: String| Err(report_refused("request-invalid", why));
    if !is_capture_id(&input.capture_id) {
        return invalid("captureId is 16 lowercase hex characters".into());
    }
    if input.sequence == 0 {
        return invalid("sequence counts from 1".into());
    }
    if input.entries.len() > MAX_BATCH_ENTRIES {
        return invalid(format!("a batch carries at most {MAX_BATCH_ENTRIES} entries"));
    }
    let text: usize = input.entries.iter().map(|e| e.line.len()).sum();
    if text > MAX_BATCH_TEXT {
        return invalid(format!("a batch carries at most {MAX_BATCH_TEXT} bytes of line text"));
    }
    if let Some(entry) = input.entries.iter().find(|e| e.line.len() > MAX_LINE || e.ts.is_empty() || e.ts.len() > 64) {
        return invalid(format!("a line is at most {MAX_LINE} bytes and its ts 1–64 characters (one was {} bytes)", entry.line.len()));
    }
    if input.lost.as_ref().is_some_and(|l| l.reason.is_empty() || l.reason.len() > 64) {
        return invalid("lost.reason is a word of 1–64 characters".into());
    }
    Ok(())
}

/// The attempt's log record, made from its slot on the first batch: only for an attempt its
/// slot holds on this node (`log-attempt-unkept` otherwise).
async fn attempt_of(tx: &Tx, node_id: &str, assignment_id: &str) -> Result<(Option<u64>, LogAttempt)> {
    let unkept = || report_refused("log-attempt-unkept", "no attempt of this node keeps logs under that assignment");
    if let Some(doc) = tx.get(LOG_ATTEMPTS, assignment_id).await? {
        let attempt: Entity<LogAttempt> = parse(&doc)?;
        if attempt.data.node_id != node_id {
            return Err(unkept());
        }
        return Ok((Some(attempt.revision), attempt.data));
    }
    let slot = super::slots::by_assignment(tx, assignment_id).await?.filter(|s| s.data.node_id == node_id).ok_or_else(unkept)?;
    let slot = slot.data;
    let attempt = LogAttempt {
        service_id: slot.service_id,
        cluster_id: slot.cluster_id,
        node_id: slot.node_id,
        slot: slot.slot,
        issued_at: slot.assignment.admitted_at,
        released_at: None,
        last_batch_at: None,
        captures: Vec::new(),
        kept: Counts::default(),
        truncation: Truncation::default(),
        resume: None,
    };
    Ok((None, attempt))
}

/// Where a capture reading on from `resume` and then `entries` stands.
fn resume_after(resume: Option<Resume>, entries: &[Entry]) -> Option<Resume> {
    let Some(last) = entries.last() else { return resume };
    let at_last = entries.iter().rev().take_while(|e| e.ts == last.ts).count() as u64;
    let carried = match resume {
        Some(r) if r.ts == last.ts && at_last == entries.len() as u64 => r.skip,
        _ => 0,
    };
    Some(Resume { ts: last.ts.clone(), skip: carried + at_last })
}

/// `runtime.reportLogs`: keep one batch (or answer a replay), in one transaction.
pub async fn accept(cx: &Context, node_id: &str, input: BatchInput) -> Result<Value> {
    accept_at(cx, node_id, input, now_ms()).await
}

/// [`accept`] as of `now` (milliseconds): how tests and benchmarks play an hour in a moment.
pub async fn accept_at(cx: &Context, node_id: &str, input: BatchInput, now: u64) -> Result<Value> {
    check(&input)?;
    if cx.logs.inline_bytes.load(Ordering::Relaxed) > INLINE_REFUSE_BYTES {
        recount(cx).await?;
    }
    if cx.logs.inline_bytes.load(Ordering::Relaxed) > INLINE_REFUSE_BYTES {
        return Err(report_refused(
            "logs-pressure",
            "Capstan holds too many log batches not yet written to its bucket: send it again later",
        )
        .retryable());
    }
    let payload = Payload {
        capture_id: input.capture_id.clone(),
        sequence: input.sequence,
        entries: input.entries.clone(),
        lost: input.lost.clone(),
        last: input.last,
    };
    let payload = serde_json::to_string(&payload).map_err(Refusal::internal)?;
    let bytes: u64 = input.entries.iter().map(|e| e.line.len() as u64).sum();
    let kept = cx
        .store
        .transact(|tx| {
            let (input, payload) = (&input, &payload);
            async move {
                let (revision, mut attempt) = attempt_of(&tx, node_id, &input.assignment_id).await?;
                let ordinal = match attempt.captures.iter().position(|c| c.capture_id == input.capture_id) {
                    Some(i) => i,
                    None => {
                        let capture =
                            Capture { capture_id: input.capture_id.clone(), high: 0, ended: false, missing: 0, first_accepted_at: now };
                        attempt.captures.push(capture);
                        attempt.captures.len() - 1
                    }
                };
                let capture = &mut attempt.captures[ordinal];
                if input.sequence <= capture.high {
                    return Ok(None);
                }
                if capture.ended {
                    return Err(report_refused("log-capture-ended", "the capture's final batch was accepted: nothing follows it"));
                }
                let missing_before = input.sequence - capture.high - 1;
                capture.missing += missing_before;
                capture.high = input.sequence;
                capture.ended = input.last;
                let entries = input.entries.len() as u64;
                let id = batch_id(&input.assignment_id, ordinal, input.sequence);
                let row = BatchRow {
                    service_id: attempt.service_id.clone(),
                    assignment_id: input.assignment_id.clone(),
                    capture_id: input.capture_id.clone(),
                    ordinal,
                    sequence: input.sequence,
                    entries,
                    bytes,
                    accepted_at: now,
                    missing_before,
                    segment: None,
                };
                tx.insert(LOG_BATCHES, &id, to_value(&row)?).await?;
                let inline = Inline {
                    service_id: attempt.service_id.clone(),
                    assignment_id: input.assignment_id.clone(),
                    capture_id: input.capture_id.clone(),
                    sequence: input.sequence,
                    bytes: payload.len() as u64,
                    accepted_at: now,
                    last: input.last,
                    payload: payload.clone(),
                };
                tx.insert(LOG_INLINE, &id, to_value(&inline)?).await?;
                attempt.kept.add(1, bytes, entries);
                attempt.last_batch_at = Some(now);
                attempt.resume = resume_after(attempt.resume.take(), &input.entries);
                let dropped = bound(&tx, &input.assignment_id, &mut attempt).await?;
                match revision {
                    Some(revision) => tx.replace(LOG_ATTEMPTS, &input.assignment_id, revision, to_value(&attempt)?).await?,
                    None => tx.insert(LOG_ATTEMPTS, &input.assignment_id, to_value(&attempt)?).await?,
                };
                Ok(Some(dropped))
            }
        })
        .await?;
    let Some(dropped) = kept else { return Ok(json!({ "accepted": true, "replay": true })) };
    cx.logs.inline_bytes.fetch_add(payload.len() as u64, Ordering::Relaxed);
    cx.logs.arrived.notify_waiters();
    segments::forget_unheld(cx, dropped).await;
    Ok(json!({ "accepted": true, "replay": false }))
}

/// Count the inline payloads again (at most every 5 s): the guess of a fleet node that accepts
/// batches but runs no drain only grows, and must not refuse for ever what another node wrote.
async fn recount(cx: &Context) -> Result<()> {
    {
        let mut at = cx.logs.counted_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if at.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(5)) {
            return Ok(());
        }
        *at = Some(std::time::Instant::now());
    }
    let total = segments::inline_total(&cx.store).await?;
    cx.logs.inline_bytes.store(total, Ordering::Relaxed);
    Ok(())
}

/// Drop an attempt's oldest batches past its bounds, stating them in its truncation; answers
/// the segments the dropped rows named (removed once no row names them).
async fn bound(tx: &Tx, assignment_id: &str, attempt: &mut LogAttempt) -> Result<Vec<String>> {
    let mut segments = Vec::new();
    while attempt.kept.batches > ATTEMPT_BATCHES || attempt.kept.bytes > ATTEMPT_BYTES {
        let reason = if attempt.kept.batches > ATTEMPT_BATCHES { "batch-cap" } else { "byte-cap" };
        let page = tx.find(LOG_BATCHES, "by_attempt", &[json!(assignment_id)], None, 64).await?;
        if page.documents.is_empty() {
            break;
        }
        for doc in &page.documents {
            if attempt.kept.batches <= ATTEMPT_BATCHES && attempt.kept.bytes <= ATTEMPT_BYTES {
                break;
            }
            let row: Entity<BatchRow> = parse(doc)?;
            segments.extend(drop_row(tx, &row).await?);
            attempt.kept.batches -= 1;
            attempt.kept.bytes = attempt.kept.bytes.saturating_sub(row.data.bytes);
            attempt.kept.entries = attempt.kept.entries.saturating_sub(row.data.entries);
            attempt.truncation.dropped.add(1, row.data.bytes, row.data.entries);
            attempt.truncation.reasons.insert(reason.into());
        }
    }
    Ok(segments)
}

/// Delete a batch row and its inline payload; answers the segment it named.
async fn drop_row(tx: &Tx, row: &Entity<BatchRow>) -> Result<Option<String>> {
    tx.delete(LOG_BATCHES, &row.id, row.revision).await?;
    if let Some(inline) = tx.get(LOG_INLINE, &row.id).await? {
        tx.delete(LOG_INLINE, &row.id, inline.revision).await?;
    }
    Ok(row.data.segment.clone())
}

/// [`resume_of`] in a transaction of its own.
pub async fn resume_of_store(store: &capstan_store::Store, assignment_id: &str) -> Result<Option<Resume>> {
    store.transact(|tx| async move { resume_of(&tx, assignment_id).await }).await
}

/// Where a new capture of `assignment_id` starts, for its push (`logsFrom`).
pub async fn resume_of(tx: &Tx, assignment_id: &str) -> Result<Option<Resume>> {
    let Some(doc) = tx.get(LOG_ATTEMPTS, assignment_id).await? else { return Ok(None) };
    Ok(parse::<LogAttempt>(&doc)?.data.resume)
}

#[cfg(test)]
mod tests;
