//! Workload logs, Capstan's side: how many lines a second one capture's batches are kept at
//! (1,000 lines of 40 bytes a batch, each batch one transaction, on SQLite, the drain writing
//! segments into a local bucket as they fill), and how many
//! bucket objects one capture makes in an hour at one batch a second (the drain run every 10 s
//! as the producer's node runs it, an hour played on the clock the drain is given).
//!
//!   cargo bench -p capstan-runtime --features testing --bench logs
//!
//! Figures go in docs/benchmarks.md with this command.

use capstan_runtime::logs::{self, BatchInput, Entry, Stream, segments};
use criterion::{Criterion, criterion_group, criterion_main};
use std::time::Instant;

const CAPTURE: &str = "0123456789abcdef";

async fn hold(cx: &capstan_runtime::Context, assignment: &str) {
    let slot = capstan_runtime::testing::running_slot("svc_1", &format!("node_1.{assignment}"), assignment, 0, 1);
    capstan_runtime::testing::hold(&cx.store, &slot).await;
}

fn batch(assignment: &str, sequence: u64, lines: usize) -> BatchInput {
    let entries = (0..lines)
        .map(|i| Entry {
            ts: format!("2026-12-06T10:00:{:02}.{i:09}Z", sequence % 60),
            stream: Stream::Stdout,
            line: format!("{sequence:08} {i:06} the quick brown fox jumps"),
            cut: None,
        })
        .collect();
    BatchInput { assignment_id: assignment.into(), capture_id: CAPTURE.into(), sequence, entries, lost: None, last: false }
}

fn logs_kept(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cx = rt.block_on(async {
        let store = capstan_runtime::testing::store(dir.path()).await;
        let cx = capstan_runtime::testing::context(store, dir.path()).await;
        hold(&cx, "asg_throughput").await;
        hold(&cx, "asg_hour").await;
        cx
    });

    // an hour of one batch a second, the drain every 10 s: objects written
    let segments_in_an_hour = rt.block_on(async {
        let start = 1_765_000_000_000u64;
        let mut written = 0;
        for second in 1..=3600u64 {
            let now = start + second * 1000;
            logs::accept_at(&cx, "node_1", batch("asg_hour", second, 20), now).await.unwrap();
            if second % 10 == 0 {
                written += segments::drain_at(&cx, now).await.unwrap().segments;
            }
        }
        written
    });
    eprintln!("one capture at one batch a second for an hour: {segments_in_an_hour} bucket objects (drain every 10 s)");

    let mut sequence = 0u64;
    let mut group = c.benchmark_group("logs");
    group.throughput(criterion::Throughput::Elements(1000));
    group.bench_function("accept a batch of 1,000 lines", |b| {
        b.iter(|| {
            sequence += 1;
            let kept = rt.block_on(logs::accept(&cx, "node_1", batch("asg_throughput", sequence, 1000))).unwrap();
            // the drain's share: what is kept is written into the bucket as it fills (1 MiB
            // a segment), as the producer's node does every 10 s
            if sequence.is_multiple_of(16) {
                rt.block_on(segments::drain(&cx)).unwrap();
            }
            kept
        })
    });
    group.finish();
    let started = Instant::now();
    let drained = rt.block_on(segments::drain_at(&cx, capstan_core::clock::now_ms() + segments::SEGMENT_AGE_MS)).unwrap();
    eprintln!("then {} segments of {} batches written in {:.2} s", drained.segments, drained.batches, started.elapsed().as_secs_f64());
}

criterion_group!(benches, logs_kept);
criterion_main!(benches);
