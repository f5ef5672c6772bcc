//! Reading kept logs: `runtime.getLogAttempts` (a service's attempts, newest first) and
//! `runtime.getLogs` (one attempt's records in delivery order, a page at a time, optionally
//! waiting for new lines), authorized like the service's runtime view.

use super::{BatchRow, Counts, Entry, LOG_ATTEMPTS, LOG_BATCHES, LOG_INLINE, LogAttempt, Lost, Payload, Truncation};
use crate::Context;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::access::ServiceNeed;
use capstan_inventory::services;
use capstan_inventory::{Entity, parse};
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// Records one page holds at most, whatever `limit` asks.
pub const MAX_RECORDS: usize = 1000;
/// Entries one page carries at most (a page ends before it would pass this).
pub const PAGE_ENTRIES: u64 = 4096;
/// Line bytes one page carries at most.
pub const PAGE_BYTES: u64 = 2 * 1024 * 1024;
/// The longest a read waits for new lines.
pub const MAX_WAIT: Duration = Duration::from_secs(25);

/// Input of `runtime.getLogAttempts`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AttemptsInput {
    /// The service.
    pub service_id: String,
    /// The `nextCursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
    /// 1–100 (default 20).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One attempt whose logs are kept.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptView {
    /// The attempt (its assignment).
    pub assignment_id: String,
    /// `<nodeId>.<index>`.
    pub slot: String,
    /// The node.
    pub node_id: String,
    /// The cluster.
    pub cluster_id: String,
    /// When it was admitted (milliseconds).
    pub issued_at: u64,
    /// When its slot stopped holding it; `null` while it does.
    pub released_at: Option<u64>,
    /// When its last batch was accepted.
    pub last_batch_at: Option<u64>,
    /// When its logs are dropped whole; `null` while its slot holds it.
    pub expires_at: Option<u64>,
    /// Its captures, in order (ids, numbers, whether ended, numbers missing).
    pub captures: Vec<super::Capture>,
    /// What is kept.
    pub kept: Counts,
    /// What bounds dropped.
    pub truncation: Truncation,
}

/// Answer of `runtime.getLogAttempts`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attempts {
    /// Newest issued first.
    pub items: Vec<AttemptView>,
    /// Pass back as `cursor`; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

fn limit_invalid(range: &str) -> Refusal {
    Refusal::new("limit-invalid", format!("limit is {range}")).with_data(json!({ "field": "limit" }))
}

fn cursor_invalid() -> Refusal {
    Refusal::new("cursor-invalid", "the cursor is not one this read handed out").with_data(json!({ "field": "cursor" }))
}

async fn attempts(cx: Context, call: Call, input: AttemptsInput) -> Result<Attempts> {
    let limit = input.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(limit_invalid("1–100"));
    }
    let identity = call.identity()?.clone();
    let retention = super::segments::retention_ms(&cx.store).await?;
    cx.store
        .transact(|tx| {
            let (identity, input) = (identity.clone(), &input);
            async move {
                let service = services::visible_service(&tx, &identity, &input.service_id, ServiceNeed::Read).await?;
                let docs = tx.find_all(LOG_ATTEMPTS, "by_service", &[json!(service.id)]).await?;
                let mut all: Vec<Entity<LogAttempt>> = docs.iter().map(parse).collect::<Result<_>>()?;
                all.sort_by(|a, b| b.data.issued_at.cmp(&a.data.issued_at).then_with(|| a.id.cmp(&b.id)));
                let start = match &input.cursor {
                    None => 0,
                    Some(cursor) => all.iter().position(|a| &a.id == cursor).map(|i| i + 1).ok_or_else(cursor_invalid)?,
                };
                let page: Vec<AttemptView> = all.iter().skip(start).take(limit).map(|a| view(a, retention)).collect();
                let next_cursor = (start + page.len() < all.len()).then(|| page.last().map(|a| a.assignment_id.clone())).flatten();
                Ok(Attempts { items: page, next_cursor })
            }
        })
        .await
}

fn view(attempt: &Entity<LogAttempt>, retention_ms: u64) -> AttemptView {
    let a = &attempt.data;
    AttemptView {
        assignment_id: attempt.id.clone(),
        slot: a.slot.clone(),
        node_id: a.node_id.clone(),
        cluster_id: a.cluster_id.clone(),
        issued_at: a.issued_at,
        released_at: a.released_at,
        last_batch_at: a.last_batch_at,
        expires_at: super::segments::expires_at(a, retention_ms),
        captures: a.captures.clone(),
        kept: a.kept.clone(),
        truncation: a.truncation.clone(),
    }
}

/// Input of `runtime.getLogs`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LogsInput {
    /// The service.
    pub service_id: String,
    /// The attempt (`runtime.getLogAttempts`).
    pub assignment_id: String,
    /// The `nextCursor` of the previous page (`<capture ordinal>.<last sequence delivered>`).
    #[serde(default)]
    pub cursor: Option<String>,
    /// Records on a page, 1–1000 (default 200).
    #[serde(default)]
    pub limit: Option<usize>,
    /// With nothing after the cursor, wait up to this long (milliseconds, at most 25 000) for
    /// new lines before answering an empty page.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// One record of an attempt's logs.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum LogRecord {
    /// What bounds dropped (opens the first page when anything was).
    #[serde(rename_all = "camelCase")]
    Truncation {
        /// Batches, bytes and entries dropped.
        #[serde(flatten)]
        dropped: Counts,
        /// `batch-cap`, `byte-cap`, `retention`.
        reasons: Vec<String>,
    },
    /// Lines that are not there: numbers the node skipped, or kept batches whose payload is gone.
    #[serde(rename_all = "camelCase")]
    Gap {
        /// The capture.
        capture_id: String,
        /// Batches missing.
        batches: u64,
        /// Entries known missing (0 when the node skipped numbers: it never said how many).
        entries: u64,
    },
    /// A kept batch, as the node sent it.
    #[serde(rename_all = "camelCase")]
    Batch {
        /// The capture.
        capture_id: String,
        /// Its number.
        sequence: u64,
        /// The lines.
        entries: Vec<Entry>,
        /// Lines the node could not read, counted.
        #[serde(skip_serializing_if = "Option::is_none")]
        lost: Option<Lost>,
        /// The capture's last batch.
        #[serde(rename = "final")]
        last: bool,
    },
}

/// Answer of `runtime.getLogs`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogsPage {
    /// The attempt.
    pub assignment_id: String,
    /// In delivery order.
    pub records: Vec<LogRecord>,
    /// Pass back as `cursor` to read on (also after the last page: new lines come after it).
    pub next_cursor: String,
    /// Whether this page reached the newest kept batch.
    pub end: bool,
}

fn parse_cursor(cursor: Option<&str>) -> Result<Option<(usize, u64)>> {
    let Some(cursor) = cursor else { return Ok(None) };
    let (ordinal, sequence) = cursor.split_once('.').ok_or_else(cursor_invalid)?;
    Ok(Some((ordinal.parse().map_err(|_| cursor_invalid())?, sequence.parse().map_err(|_| cursor_invalid())?)))
}

async fn logs(cx: Context, call: Call, input: LogsInput) -> Result<LogsPage> {
    let limit = input.limit.unwrap_or(200);
    if !(1..=MAX_RECORDS).contains(&limit) {
        return Err(limit_invalid("1–1000"));
    }
    let after = parse_cursor(input.cursor.as_deref())?;
    let wait = Duration::from_millis(input.wait_ms.unwrap_or(0)).min(MAX_WAIT);
    let identity = call.identity()?.clone();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let arrived = cx.logs.arrived.notified();
        let page = read_page(&cx, &identity, &input, after, limit).await?;
        if !page.records.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(page);
        }
        // woken by a batch this process accepted, or a look a little later (another fleet
        // node may have accepted it)
        let _ = tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + Duration::from_millis(500)), arrived).await;
    }
}

async fn read_page(
    cx: &Context,
    identity: &capstan_rpc::Identity,
    input: &LogsInput,
    after: Option<(usize, u64)>,
    limit: usize,
) -> Result<LogsPage> {
    // the ledger in a transaction, the payloads outside it
    let (attempt, rows, inline, more) = cx
        .store
        .transact(|tx| async move {
            let service = services::visible_service(&tx, identity, &input.service_id, ServiceNeed::Read).await?;
            let attempt = match tx.get(LOG_ATTEMPTS, &input.assignment_id).await? {
                Some(doc) => parse::<LogAttempt>(&doc)?.data,
                None => return Err(attempt_not_found(&input.assignment_id)),
            };
            if attempt.service_id != service.id {
                return Err(attempt_not_found(&input.assignment_id));
            }
            if let Some((ordinal, _)) = after
                && ordinal >= attempt.captures.len()
            {
                return Err(cursor_invalid());
            }
            let cursor = after.map(|(ordinal, sequence)| super::batch_id(&input.assignment_id, ordinal, sequence));
            let page = tx.find(LOG_BATCHES, "by_attempt", &[json!(input.assignment_id)], cursor.as_deref(), limit).await?;
            let rows: Vec<Entity<BatchRow>> = page.documents.iter().map(parse).collect::<Result<_>>()?;
            let mut inline = HashMap::new();
            for row in rows.iter().filter(|r| r.data.segment.is_none()) {
                if let Some(doc) = tx.get(LOG_INLINE, &row.id).await? {
                    inline.insert(row.id.clone(), parse::<super::Inline>(&doc)?.data.payload);
                }
            }
            Ok((attempt, rows, inline, page.next_cursor.is_some()))
        })
        .await?;
    let mut records = Vec::new();
    if after.is_none() && attempt.truncation.dropped.batches > 0 {
        let t = &attempt.truncation;
        records.push(LogRecord::Truncation { dropped: t.dropped.clone(), reasons: t.reasons.iter().cloned().collect() });
    }
    let mut segments: HashMap<String, Option<super::segments::Segment>> = HashMap::new();
    let (mut entries, mut bytes) = (0u64, 0u64);
    let mut last = after;
    let mut cut_short = false;
    for row in &rows {
        let r = &row.data;
        if !records.is_empty() && (entries + r.entries > PAGE_ENTRIES || bytes + r.bytes > PAGE_BYTES) {
            cut_short = true;
            break;
        }
        if r.missing_before > 0 {
            push_gap(&mut records, &r.capture_id, r.missing_before, 0);
        }
        let payload = match &r.segment {
            None => inline.get(&row.id).and_then(|p| serde_json::from_str::<Payload>(p).ok()),
            Some(key) => {
                if !segments.contains_key(key) {
                    segments.insert(key.clone(), super::segments::read(&cx.blobs, key).await);
                }
                segments[key].as_ref().and_then(|s| s.get(&(r.capture_id.clone(), r.sequence)).cloned())
            }
        };
        match payload {
            Some(p) => records.push(LogRecord::Batch {
                capture_id: p.capture_id,
                sequence: p.sequence,
                entries: p.entries,
                lost: p.lost,
                last: p.last,
            }),
            // a kept row whose payload is gone (its segment removed, or a store restored
            // without inline payloads): Capstan's own loss, stated
            None => push_gap(&mut records, &r.capture_id, 1, r.entries),
        }
        entries += r.entries;
        bytes += r.bytes;
        last = Some((r.ordinal, r.sequence));
    }
    let next_cursor = match last {
        Some((ordinal, sequence)) => format!("{ordinal}.{sequence}"),
        None => String::new(),
    };
    Ok(LogsPage { assignment_id: input.assignment_id.clone(), records, next_cursor, end: !more && !cut_short })
}

/// A gap, merged into the one right before it (adjacent losses are one gap).
fn push_gap(records: &mut Vec<LogRecord>, capture: &str, batches: u64, entries: u64) {
    if let Some(LogRecord::Gap { capture_id, batches: b, entries: e }) = records.last_mut()
        && capture_id == capture
    {
        *b += batches;
        *e += entries;
        return;
    }
    records.push(LogRecord::Gap { capture_id: capture.into(), batches, entries });
}

fn attempt_not_found(id: &str) -> Refusal {
    Refusal::new("attempt-not-found", format!("no logs are kept for the attempt {id} of this service"))
        .with_data(json!({ "assignmentId": id }))
}

/// Register the reads.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "runtime.getLogAttempts",
            "A service's attempts whose logs are kept, newest first: captures, what is kept, what bounds dropped, when they expire (member)",
            Access::Member,
            attempts,
        )
        .refuses(&["service-not-found", "cursor-invalid", "limit-invalid"])
        .read_only();
    registry
        .add(
            "runtime.getLogs",
            "One attempt's log lines in order, a page at a time (truncations and gaps stated); waitMs waits for new lines (member)",
            Access::Member,
            logs,
        )
        .refuses(&["service-not-found", "attempt-not-found", "cursor-invalid", "limit-invalid"])
        .read_only();
    registry
        .add(
            "runtime.followLogs",
            "Follow one attempt's log lines over a socket session: the first page now, then each new page pushed as runtime.logs (member; socket only)",
            Access::Member,
            follow_over_http,
        )
        .refuses(&["socket-required", "service-not-found", "attempt-not-found", "cursor-invalid", "limit-invalid", "too-many-follows"])
        .read_only();
    registry
        .add("runtime.unfollowLogs", "Stop a follow of this socket session (socket only)", Access::Authenticated, unfollow_over_http)
        .refuses(&["socket-required", "follow-not-found"])
        .read_only();
}

/// Input of `runtime.followLogs`: what `runtime.getLogs` takes, without `waitMs` (a follow waits
/// on its own).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FollowInput {
    /// The service.
    pub service_id: String,
    /// The attempt (`runtime.getLogAttempts`).
    pub assignment_id: String,
    /// Where to start: a `nextCursor` (absent: the attempt's first line).
    #[serde(default)]
    pub cursor: Option<String>,
}

/// Input of `runtime.unfollowLogs`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UnfollowInput {
    /// The `followId` `runtime.followLogs` answered.
    pub follow_id: String,
}

/// A follow belongs to a socket session: the server answers it there (docs/runtime.md).
async fn follow_over_http(_: Context, _: Call, _: FollowInput) -> Result<serde_json::Value> {
    Err(Refusal::new(
        "socket-required",
        "runtime.followLogs is called over an /api/v1/socket session; over HTTP, read with runtime.getLogs and waitMs",
    ))
}

async fn unfollow_over_http(_: Context, _: Call, _: UnfollowInput) -> Result<serde_json::Value> {
    Err(Refusal::new("socket-required", "runtime.unfollowLogs is called over the /api/v1/socket session that follows"))
}
