//! Workload logs on a real SQLite store and a local bucket: batches kept once, replays and
//! foreign nodes refused or answered by name, gaps and bounds stated, segments written and read
//! back, and the sweep letting go what the retention and the slot bound no longer keep.

use super::segments::{self, SEGMENT_AGE_MS};
use super::*;
use crate::{Context, RUNTIME_SLOTS};
use capstan_core::refusal::Refusal;

struct World {
    cx: Context,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::store(dir.path()).await;
    let cx = crate::testing::context(store, dir.path()).await;
    World { cx, _dir: dir }
}

/// A slot `node_1.<index>` of `svc_1` holding `assignment` (admitted at `issued`).
async fn hold(cx: &Context, index: u32, assignment: &str, issued: u64) {
    crate::testing::hold(&cx.store, &crate::testing::running_slot("svc_1", &format!("node_1.{index}"), assignment, issued, 1)).await;
}

async fn release(cx: &Context, index: u32) {
    let id = crate::slots::slot_id("svc_1", &format!("node_1.{index}"));
    cx.store
        .transact(|tx| {
            let id = id.clone();
            async move {
                let doc = tx.get(RUNTIME_SLOTS, &id).await?.unwrap();
                tx.delete(RUNTIME_SLOTS, &id, doc.revision).await
            }
        })
        .await
        .unwrap();
}

const CAPTURE: &str = "0123456789abcdef";

fn entry(ts: &str, stream: Stream, line: &str) -> Entry {
    Entry { ts: ts.into(), stream, line: line.into(), cut: None }
}

fn batch(assignment: &str, sequence: u64, entries: Vec<Entry>) -> BatchInput {
    BatchInput { assignment_id: assignment.into(), capture_id: CAPTURE.into(), sequence, entries, lost: None, last: false }
}

async fn attempt(cx: &Context, id: &str) -> Option<LogAttempt> {
    let doc = cx.store.transact(|tx| async move { tx.get(LOG_ATTEMPTS, id).await }).await.unwrap()?;
    Some(parse::<LogAttempt>(&doc).unwrap().data)
}

async fn rows(cx: &Context, id: &str) -> Vec<BatchRow> {
    let docs = cx.store.transact(|tx| async move { tx.find_all(LOG_BATCHES, "by_attempt", &[json!(id)]).await }).await.unwrap();
    docs.iter().map(|d| parse::<BatchRow>(d).unwrap().data).collect()
}

fn reason(refusal: &Refusal) -> String {
    refusal.data.as_ref().and_then(|d| d["reason"].as_str()).unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_batch_is_kept_once_gaps_are_stated_and_other_nodes_or_ended_captures_are_refused() {
    let w = world().await;
    let cx = &w.cx;
    hold(cx, 0, "asg_1", 1_000).await;
    let ts = "2026-12-06T22:40:01.000000001Z";
    let first = batch("asg_1", 1, vec![entry(ts, Stream::Stdout, "one"), entry(ts, Stream::Stderr, "two")]);
    assert_eq!(accept(cx, "node_1", first.clone()).await.unwrap(), json!({ "accepted": true, "replay": false }));
    assert_eq!(accept(cx, "node_1", first).await.unwrap(), json!({ "accepted": true, "replay": true }), "a resend lands once");
    let kept = attempt(cx, "asg_1").await.unwrap();
    assert_eq!((kept.kept.batches, kept.kept.entries, kept.kept.bytes), (1, 2, 6));
    assert_eq!(kept.resume, Some(Resume { ts: ts.into(), skip: 2 }));
    assert_eq!((kept.issued_at, kept.slot.as_str()), (1_000, "node_1.0"));

    // a batch of the same instant carries the skip on; a later one starts it again
    accept(cx, "node_1", batch("asg_1", 2, vec![entry(ts, Stream::Stdout, "three")])).await.unwrap();
    assert_eq!(attempt(cx, "asg_1").await.unwrap().resume, Some(Resume { ts: ts.into(), skip: 3 }));
    // number 3 never comes: 4 is kept and the hole stated
    let later = "2026-12-06T22:40:02Z";
    accept(cx, "node_1", batch("asg_1", 4, vec![entry(later, Stream::Stdout, "four")])).await.unwrap();
    let kept = attempt(cx, "asg_1").await.unwrap();
    assert_eq!((kept.captures[0].high, kept.captures[0].missing), (4, 1));
    assert_eq!(kept.resume, Some(Resume { ts: later.into(), skip: 1 }));
    assert_eq!(rows(cx, "asg_1").await.iter().map(|r| (r.sequence, r.missing_before)).collect::<Vec<_>>(), [(1, 0), (2, 0), (4, 1)]);
    // a late 3 is a replay, not a rewrite of history
    assert_eq!(accept(cx, "node_1", batch("asg_1", 3, vec![])).await.unwrap()["replay"], true);

    // another node, an attempt no slot holds, a bad capture id
    let foreign = accept(cx, "node_2", batch("asg_1", 5, vec![])).await.unwrap_err();
    assert_eq!((&*foreign.code, reason(&foreign).as_str()), ("runtime-session-report-refused", "log-attempt-unkept"));
    assert_eq!(reason(&accept(cx, "node_1", batch("asg_none", 1, vec![])).await.unwrap_err()), "log-attempt-unkept");
    let mut bad = batch("asg_1", 5, vec![]);
    bad.capture_id = "NOT-HEX".into();
    assert_eq!(reason(&accept(cx, "node_1", bad).await.unwrap_err()), "request-invalid");
    let long = batch("asg_1", 5, vec![entry(later, Stream::Stdout, &"x".repeat(MAX_LINE + 1))]);
    assert_eq!(reason(&accept(cx, "node_1", long).await.unwrap_err()), "request-invalid");

    // the final batch ends the capture; a new number after it is refused, a new capture is not
    let mut last = batch("asg_1", 5, vec![]);
    last.last = true;
    accept(cx, "node_1", last).await.unwrap();
    assert_eq!(reason(&accept(cx, "node_1", batch("asg_1", 6, vec![])).await.unwrap_err()), "log-capture-ended");
    let mut next = batch("asg_1", 1, vec![entry(later, Stream::Stdout, "five")]);
    next.capture_id = "fedcba9876543210".into();
    accept(cx, "node_1", next).await.unwrap();
    let ids: Vec<String> = rows(cx, "asg_1").await.iter().map(|r| format!("{}:{}", r.ordinal, r.sequence)).collect();
    assert_eq!(ids, ["0:1", "0:2", "0:4", "0:5", "1:1"], "rows read in delivery order");
}

#[tokio::test]
async fn past_its_bytes_an_attempt_drops_its_oldest_batches_and_says_so() {
    let w = world().await;
    let cx = &w.cx;
    hold(cx, 0, "asg_1", 0).await;
    let line = "y".repeat(MAX_LINE);
    let per_batch = (MAX_BATCH_TEXT / MAX_LINE) as u64;
    let batches = ATTEMPT_BYTES / (MAX_LINE as u64 * per_batch) + 3;
    for n in 1..=batches {
        let entries = (0..per_batch).map(|_| entry("2026-12-06T00:00:00Z", Stream::Stdout, &line)).collect();
        accept(cx, "node_1", batch("asg_1", n, entries)).await.unwrap();
    }
    let kept = attempt(cx, "asg_1").await.unwrap();
    assert!(kept.kept.bytes <= ATTEMPT_BYTES, "{:?}", kept.kept);
    assert_eq!(kept.truncation.dropped.batches, 3);
    assert_eq!(kept.truncation.dropped.bytes, 3 * MAX_BATCH_TEXT as u64);
    assert!(kept.truncation.reasons.contains("byte-cap"));
    assert_eq!(rows(cx, "asg_1").await[0].sequence, 4, "the oldest went first");
}

#[tokio::test]
async fn due_payloads_become_one_segment_per_capture_read_back_whole() {
    let w = world().await;
    let cx = &w.cx;
    hold(cx, 0, "asg_1", 0).await;
    hold(cx, 1, "asg_2", 0).await;
    for n in 1..=3 {
        let entries = vec![entry("2026-12-06T00:00:01Z", Stream::Stdout, &format!("line {n}"))];
        accept(cx, "node_1", batch("asg_1", n, entries.clone())).await.unwrap();
        accept(cx, "node_1", batch("asg_2", n, entries)).await.unwrap();
    }
    // nothing is due yet: young, small, no final batch
    assert_eq!(segments::drain(cx).await.unwrap().segments, 0);
    // asg_2's capture ends: its segment is due at once
    let mut last = batch("asg_2", 4, vec![]);
    last.last = true;
    accept(cx, "node_1", last).await.unwrap();
    let drained = segments::drain(cx).await.unwrap();
    assert_eq!((drained.segments, drained.batches), (1, 4));
    let key = segments::segment_key("svc_1", "asg_2", CAPTURE, 1, 4);
    assert!(rows(cx, "asg_2").await.iter().all(|r| r.segment.as_deref() == Some(key.as_str())));
    let read = segments::read(&cx.blobs, &key).await.unwrap();
    assert_eq!(read[&(CAPTURE.to_string(), 2)].entries[0].line, "line 2");
    assert!(read[&(CAPTURE.to_string(), 4)].last);
    // five minutes on, asg_1's are due too
    let later = segments::drain_at(cx, capstan_core::clock::now_ms() + SEGMENT_AGE_MS).await.unwrap();
    assert_eq!((later.segments, later.inline_bytes), (1, 0));
    let inline = cx.store.transact(|tx| async move { tx.scan(LOG_INLINE, None, 10).await }).await.unwrap();
    assert!(inline.documents.is_empty(), "every payload moved");
}

#[tokio::test]
async fn the_sweep_releases_expires_and_keeps_the_newest_attempts_of_a_slot() {
    let w = world().await;
    let cx = &w.cx;
    // ten attempts of one slot over time; the slot holds the last
    for n in 1..=10u64 {
        let id = format!("asg_{n:02}");
        hold(cx, 0, &id, n).await;
        let mut b = batch(&id, 1, vec![entry("2026-12-06T00:00:01Z", Stream::Stdout, "hello")]);
        b.last = true;
        accept(cx, "node_1", b).await.unwrap();
    }
    segments::drain(cx).await.unwrap();
    let swept = segments::sweep(cx).await.unwrap();
    assert_eq!((swept.released, swept.attempts), (9, 2), "{swept:?}");
    assert!(attempt(cx, "asg_01").await.is_none() && attempt(cx, "asg_02").await.is_none());
    assert_eq!(attempt(cx, "asg_10").await.unwrap().released_at, None, "held by its slot");
    let gone = segments::segment_key("svc_1", "asg_01", CAPTURE, 1, 1);
    assert!(cx.blobs.head(&gone).await.unwrap().is_none(), "its segment went with it");

    // past the retention a released attempt goes whole; the held one loses only old batches
    release(cx, 0).await;
    hold(cx, 1, "asg_10", 10).await;
    let month = 31 * 24 * 60 * 60 * 1000;
    let swept = segments::sweep_at(cx, capstan_core::clock::now_ms() + month).await.unwrap();
    assert_eq!(swept.attempts, 7, "{swept:?}");
    let held = attempt(cx, "asg_10").await.unwrap();
    assert_eq!((held.kept.batches, held.truncation.dropped.batches), (0, 1));
    assert!(held.truncation.reasons.contains("retention"));
    let left = cx.blobs.list(BUCKET_PREFIX, None, 100).await.unwrap();
    assert!(left.items.is_empty(), "no segment is left that no row names: {:?}", left.items);
}

#[tokio::test]
async fn a_capture_filling_a_mebibyte_is_written_without_waiting() {
    let w = world().await;
    let cx = &w.cx;
    hold(cx, 0, "asg_1", 0).await;
    for n in 1..=6 {
        let entries = (0..4096).map(|i| entry("2026-12-06T00:00:01Z", Stream::Stdout, &format!("burst {i}"))).collect();
        accept(cx, "node_1", batch("asg_1", n, entries)).await.unwrap();
    }
    let drained = segments::drain(cx).await.unwrap();
    assert!(drained.segments >= 1 && drained.batches == 6, "{drained:?}");
    assert!(rows(cx, "asg_1").await.iter().all(|r| r.segment.is_some()));
}

#[tokio::test]
async fn a_node_that_only_guessed_its_way_past_the_bound_counts_again_before_refusing() {
    let w = world().await;
    let cx = &w.cx;
    hold(cx, 0, "asg_1", 0).await;
    // a fleet node that runs no drain: its guess grew past the bound, the store holds little
    cx.logs.inline_bytes.store(INLINE_REFUSE_BYTES + 1, std::sync::atomic::Ordering::Relaxed);
    accept(cx, "node_1", batch("asg_1", 1, vec![entry("2026-12-06T00:00:01Z", Stream::Stdout, "kept")])).await.unwrap();
    assert!(cx.logs.inline_bytes.load(std::sync::atomic::Ordering::Relaxed) < 1024);
    // while the store truly holds too much, the refusal stands (counted again at most every 5 s)
    cx.logs.inline_bytes.store(INLINE_REFUSE_BYTES + 1, std::sync::atomic::Ordering::Relaxed);
    let refused = accept(cx, "node_1", batch("asg_1", 2, vec![])).await.unwrap_err();
    assert_eq!((reason(&refused), refused.retryable), ("logs-pressure".to_string(), true));
}
