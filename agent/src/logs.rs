//! Workload log captures (docs/runtime.md, "Workload logs"): for each assignment it runs, the
//! agent follows the container's log as one capture, cuts it into numbered batches and hands
//! them to the runtime session, which sends them as `runtime.reportLogs` calls.
//!
//! A capture outlives a socket session: its unanswered batches (8 at most; with 8 it stops
//! reading, and the engine keeps the lines) are sent one at a time, in order, and again on the
//! next session. It reads from where it stopped when its stream breaks or the engine starts its
//! container again, and on a stop it reads to the end and sends its final batch. Line contents
//! are never logged, only counts.

use crate::engine::{Engine, LogEntry, LogFault, LogStream, Mark, Phase};
use capstan_core::Refusal;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

/// A batch closes this long after its first entry…
const BATCH_AGE: Duration = Duration::from_secs(1);
/// …or once its line text reaches this many bytes…
const BATCH_BYTES: usize = 64 * 1024;
/// …or this many entries.
const BATCH_ENTRIES: usize = 4096;
/// A longer line is cut to this many bytes (on a character boundary).
const LINE_BYTES: usize = 16 * 1024;
/// Unanswered batches a capture holds at most (its memory bound).
const UNANSWERED: usize = 8;
/// A batch refused `logs-pressure` is sent again this much later.
const PRESSURE_WAIT: Duration = Duration::from_secs(3);
/// Between looks at a stopped container: the engine may start it again.
const STOPPED_POLL: Duration = Duration::from_secs(2);
/// After a broken stream, before reading again.
const REOPEN_DELAY: Duration = Duration::from_secs(1);

/// Where a push of `run` says a capture starts: after the first `skip` entries at `ts` (what
/// Capstan already keeps of the attempt).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LogsFrom {
    /// The newest kept entry's time (RFC 3339).
    pub ts: String,
    /// How many kept entries carry exactly `ts`.
    #[serde(default)]
    pub skip: u64,
}

/// One `runtime.reportLogs` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Batch {
    /// The assignment whose container wrote the lines.
    pub assignment_id: String,
    /// The capture: 16 lowercase hex characters, one per (agent process, assignment).
    pub capture_id: String,
    /// Numbered per capture from 1, without holes.
    pub sequence: u64,
    /// The lines, in the engine's order.
    pub entries: Vec<Entry>,
    /// Records that could not be read, counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<Lost>,
    /// The capture's last batch: its container stopped; nothing follows.
    #[serde(rename = "final")]
    pub last: bool,
}

/// One line of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// RFC 3339 in UTC, as the engine gave it.
    pub ts: String,
    /// `stdout` or `stderr`.
    pub stream: LogStream,
    /// The line (at most 16 KiB).
    pub line: String,
    /// Bytes cut from a longer line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut: Option<usize>,
}

/// Records the agent could not read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lost {
    /// How many.
    pub entries: u64,
    /// Why, in a word.
    pub reason: &'static str,
}

/// The batch being filled, and the numbering of a capture's batches.
#[derive(Debug)]
struct Batcher {
    assignment_id: String,
    capture_id: String,
    next_sequence: u64,
    entries: Vec<Entry>,
    bytes: usize,
    lost: u64,
    /// The engine's log was rotated past where this capture had read, before the open batch.
    rotated: bool,
    /// When the open batch took its first entry (or loss).
    opened: Option<Instant>,
}

impl Batcher {
    fn new(assignment_id: &str, capture_id: &str) -> Batcher {
        Batcher {
            assignment_id: assignment_id.to_string(),
            capture_id: capture_id.to_string(),
            next_sequence: 1,
            entries: Vec::new(),
            bytes: 0,
            lost: 0,
            rotated: false,
            opened: None,
        }
    }

    /// Add `entry` (read at `now`); the batch it closed, if it did.
    fn push(&mut self, entry: LogEntry, now: Instant) -> Option<Batch> {
        let (line, cut) = cut(entry.line);
        let before = if self.bytes + line.len() > BATCH_BYTES { self.close() } else { None };
        self.opened.get_or_insert(now);
        self.bytes += line.len();
        self.entries.push(Entry { ts: entry.ts, stream: entry.stream, line, cut });
        // a batch just opened by this entry cannot be full (one line is at most a quarter of it)
        before.or_else(|| (self.bytes >= BATCH_BYTES || self.entries.len() >= BATCH_ENTRIES).then(|| self.close()).flatten())
    }

    /// Count `n` records that could not be read.
    fn lose(&mut self, n: u64, now: Instant) {
        self.opened.get_or_insert(now);
        self.lost += n;
    }

    /// The log was rotated away before what comes next: stated as a loss of `engine-rotated`
    /// (its count is the records that did not read besides, 0 when none: the engine cannot say
    /// how many lines the rotation took).
    fn rotated(&mut self, now: Instant) {
        self.opened.get_or_insert(now);
        self.rotated = true;
    }

    /// When the open batch closes by age.
    fn deadline(&self) -> Option<Instant> {
        self.opened.map(|opened| opened + BATCH_AGE)
    }

    /// Close the open batch; `None` when nothing is in it.
    fn close(&mut self) -> Option<Batch> {
        self.opened.is_some().then(|| self.take(false))
    }

    /// The capture's final batch: what is open, perhaps nothing.
    fn finish(&mut self) -> Batch {
        self.take(true)
    }

    fn take(&mut self, last: bool) -> Batch {
        let batch = Batch {
            assignment_id: self.assignment_id.clone(),
            capture_id: self.capture_id.clone(),
            sequence: self.next_sequence,
            entries: std::mem::take(&mut self.entries),
            lost: match (self.rotated, self.lost) {
                (true, entries) => Some(Lost { entries, reason: "engine-rotated" }),
                (false, 0) => None,
                (false, entries) => Some(Lost { entries, reason: "engine-error" }),
            },
            last,
        };
        self.next_sequence += 1;
        self.bytes = 0;
        self.lost = 0;
        self.rotated = false;
        self.opened = None;
        batch
    }
}

/// A line at most `LINE_BYTES` long (cut on a character boundary), and how many bytes it lost.
fn cut(mut line: String) -> (String, Option<usize>) {
    if line.len() <= LINE_BYTES {
        return (line, None);
    }
    let mut end = LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let dropped = line.len() - end;
    line.truncate(end);
    (line, Some(dropped))
}

/// Where a capture reads its container's log: the engine, or a test's script.
pub trait Source: Send + Sync + 'static {
    /// The log after `from`, until the container stops.
    fn open(&self, from: Mark) -> BoxStream<'static, Result<LogEntry, LogFault>>;
    /// The container's state now; `None` once it is gone.
    fn phase(&self) -> impl Future<Output = Result<Option<Phase>, Refusal>> + Send;
}

/// One container of the engine.
struct EngineLog {
    engine: Engine,
    container_id: String,
}

impl Source for EngineLog {
    fn open(&self, from: Mark) -> BoxStream<'static, Result<LogEntry, LogFault>> {
        self.engine.logs(&self.container_id, from)
    }

    async fn phase(&self) -> Result<Option<Phase>, Refusal> {
        Ok(self.engine.observe(&self.container_id).await?.map(|observed| observed.phase))
    }
}

/// A capture's closed, unanswered batches (in order), shared by its task and the session.
struct Outbox {
    batches: Mutex<VecDeque<Batch>>,
    /// Free places among `UNANSWERED`: the task takes one per batch, an answer gives it back.
    slots: Semaphore,
}

impl Outbox {
    fn batches(&self) -> MutexGuard<'_, VecDeque<Batch>> {
        self.batches.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A capture's task: reads its source into batches.
struct Reader<S> {
    source: S,
    batcher: Batcher,
    /// How far it read (its own high-water).
    mark: Mark,
    outbox: Arc<Outbox>,
    wake: Arc<Notify>,
    finish: watch::Receiver<bool>,
    /// Asked to finish: the next end of the stream is the capture's.
    finishing: bool,
}

impl<S: Source> Reader<S> {
    async fn run(mut self) {
        loop {
            let broken = self.read().await;
            if self.finishing && !broken {
                break;
            }
            if !self.wait(broken).await {
                break;
            }
        }
        let last = self.batcher.finish();
        self.queue(last).await;
    }

    /// Read the log from the mark to its end (`false`) or until it breaks (`true`).
    async fn read(&mut self) -> bool {
        let mut records = self.source.open(self.mark);
        loop {
            let deadline = self.batcher.deadline();
            tokio::select! {
                record = records.next() => match record {
                    None => return false,
                    Some(Ok(entry)) => {
                        self.mark.advance(&entry);
                        if let Some(batch) = self.batcher.push(entry, Instant::now()) {
                            self.queue(batch).await;
                        }
                    }
                    Some(Err(LogFault::Unreadable)) => self.batcher.lose(1, Instant::now()),
                    Some(Err(LogFault::Rotated)) => {
                        // the rotation is stated in a batch of its own, where the lines went
                        self.close().await;
                        self.batcher.rotated(Instant::now());
                    }
                    Some(Err(LogFault::Broken(why))) => {
                        tracing::warn!(assignment = %self.batcher.assignment_id, capture = %self.batcher.capture_id,
                            "the container's log stream broke ({why}); reading again from where it was");
                        return true;
                    }
                },
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => self.close().await,
                _ = self.finish.changed(), if !self.finishing => self.finishing = true,
            }
        }
    }

    /// After the stream ended or broke: `true` to read again — the engine started the container
    /// again, the stream broke, or the capture is to finish (what is left is read) —, `false`
    /// once the container is gone.
    async fn wait(&mut self, broken: bool) -> bool {
        let pause = if broken { REOPEN_DELAY } else { STOPPED_POLL };
        let mut look = Instant::now() + pause;
        loop {
            let deadline = self.batcher.deadline();
            tokio::select! {
                _ = self.finish.changed(), if !self.finishing => {
                    self.finishing = true;
                    return true;
                }
                // what was read goes out on time meanwhile
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    self.close().await;
                    continue;
                }
                _ = tokio::time::sleep_until(look) => look = Instant::now() + pause,
            }
            match self.source.phase().await {
                Ok(None) => return false,
                Ok(Some(Phase::Running)) => return true,
                // a stopped container's broken stream: what it holds is read again
                Ok(Some(_)) if broken => return true,
                // stopped: it may be started again; or the engine did not answer
                Ok(Some(_)) | Err(_) => {}
            }
        }
    }

    /// Close the open batch (its time is up) and hand it on.
    async fn close(&mut self) {
        if let Some(batch) = self.batcher.close() {
            self.queue(batch).await;
        }
    }

    /// Hand a closed batch to the session, once fewer than `UNANSWERED` are out: until then
    /// nothing more is read (the engine keeps the lines).
    async fn queue(&mut self, batch: Batch) {
        if let Some(lost) = &batch.lost {
            tracing::warn!(assignment = %batch.assignment_id, capture = %batch.capture_id, lost = lost.entries, reason = lost.reason,
                "a loss of log lines is reported (engine-error: records without a readable timestamp; engine-rotated: the engine rotated its log past where this capture read)");
        }
        if let Ok(slot) = self.outbox.slots.acquire().await {
            slot.forget();
        }
        self.outbox.batches().push_back(batch);
        self.wake.notify_one();
    }
}

/// One capture, as the session holds it.
struct Capture {
    id: String,
    outbox: Arc<Outbox>,
    finish: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Nothing more will be sent: its final batch was answered, or Capstan refused it.
    over: bool,
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The agent process's captures, by assignment. They live beside the held assignments, across
/// socket sessions.
#[derive(Default)]
pub struct Captures {
    by_assignment: HashMap<String, Capture>,
    wake: Arc<Notify>,
}

impl Captures {
    /// Notified whenever a capture closed a batch.
    pub fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Follow the log of `container_id` for `assignment_id` from `from` (the start when absent),
    /// unless this process follows it already (its own high-water is newer than any `from`).
    pub fn follow(&mut self, engine: &Engine, assignment_id: &str, container_id: &str, from: Option<&LogsFrom>) {
        if self.by_assignment.contains_key(assignment_id) {
            return;
        }
        let mark = match from {
            None => Mark::default(),
            Some(from) => Mark::at(&from.ts, from.skip).unwrap_or_else(|| {
                tracing::warn!(assignment = assignment_id, "logsFrom.ts is no RFC 3339 time; the capture reads the log from its start");
                Mark::default()
            }),
        };
        self.follow_source(assignment_id, EngineLog { engine: engine.clone(), container_id: container_id.to_string() }, mark);
    }

    fn follow_source(&mut self, assignment_id: &str, source: impl Source, from: Mark) {
        let id = format!("{:016x}", rand::random::<u64>());
        let outbox = Arc::new(Outbox { batches: Mutex::new(VecDeque::new()), slots: Semaphore::new(UNANSWERED) });
        let (finish, finish_rx) = watch::channel(false);
        let reader = Reader {
            source,
            batcher: Batcher::new(assignment_id, &id),
            mark: from,
            outbox: outbox.clone(),
            wake: self.wake.clone(),
            finish: finish_rx,
            finishing: false,
        };
        tracing::info!(assignment = assignment_id, capture = %id, "following the container's log");
        let task = tokio::spawn(reader.run());
        self.by_assignment.insert(assignment_id.to_string(), Capture { id, outbox, finish, task, over: false });
    }

    /// The container of `assignment_id` stopped: its capture reads to the end and sends its
    /// final batch.
    pub fn finish(&mut self, assignment_id: &str) {
        if let Some(capture) = self.by_assignment.get(assignment_id) {
            let _ = capture.finish.send(true);
        }
    }

    /// Whether the capture of `assignment_id` still has batches to send (its final among them).
    pub fn sending(&self, assignment_id: &str) -> bool {
        self.by_assignment.get(assignment_id).is_some_and(|capture| !capture.over)
    }

    /// Stop the capture of `assignment_id` at once, its batches unsent (an orphan's).
    pub fn stop(&mut self, assignment_id: &str) {
        self.by_assignment.remove(assignment_id);
    }

    /// Let go of the captures that are over, of assignments `held` no longer names.
    pub fn forget(&mut self, held: impl Fn(&str) -> bool) {
        self.by_assignment.retain(|assignment, capture| !capture.over || held(assignment));
    }

    /// Capstan took batch `sequence` of capture `capture_id`: its place is free.
    fn accepted(&mut self, capture_id: &str, sequence: u64) {
        let Some(capture) = self.by_capture(capture_id) else { return };
        let mut batches = capture.outbox.batches();
        let Some(at) = batches.iter().position(|b| b.sequence == sequence) else { return };
        let batch = batches.remove(at).expect("a position found is there");
        drop(batches);
        capture.outbox.slots.add_permits(1);
        capture.over |= batch.last;
    }

    /// Capstan takes nothing more of capture `capture_id` (`reason`): it stops, its batches go.
    fn refused(&mut self, capture_id: &str, reason: &str) {
        let Some(capture) = self.by_capture(capture_id) else { return };
        if capture.over {
            return;
        }
        let dropped = capture.outbox.batches().len();
        tracing::warn!(capture = capture_id, reason, dropped, "Capstan takes no more of this capture's logs; it stops");
        capture.task.abort();
        capture.outbox.batches().clear();
        capture.over = true;
    }

    fn by_capture(&mut self, capture_id: &str) -> Option<&mut Capture> {
        self.by_assignment.values_mut().find(|capture| capture.id == capture_id)
    }
}

/// How Capstan answered one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<'a> {
    /// `{"accepted": true}` (a replay too).
    Accepted,
    /// Refused, with `data.reason`.
    Refused(&'a str),
}

/// One socket session's sending of batches: which are out on it, and which wait. A new session
/// starts with none, so every unanswered batch is sent again.
#[derive(Debug, Default)]
pub struct Sends {
    out: HashSet<(String, u64)>,
    /// Refused for now: sent again after the instant, or (`None`) on the next session. A later
    /// batch of the same capture waits behind it, to keep the order.
    waiting: HashMap<(String, u64), Option<Instant>>,
}

impl Sends {
    /// The batches to send now, each then counted out: a capture's oldest unanswered one, while
    /// none of it is out. One at a time per capture, because Capstan keeps a capture's batches
    /// by their number: one answered before an earlier one would make that one a replay.
    pub fn due(&mut self, captures: &Captures, now: Instant) -> Vec<Batch> {
        let mut due = Vec::new();
        for capture in captures.by_assignment.values() {
            let Some(batch) = capture.outbox.batches().front().cloned() else { continue };
            let key = (capture.id.clone(), batch.sequence);
            if self.out.contains(&key) {
                continue;
            }
            match self.waiting.get(&key) {
                Some(Some(until)) if *until <= now => {
                    self.waiting.remove(&key);
                }
                Some(_) => continue,
                None => {}
            }
            self.out.insert(key);
            due.push(batch);
        }
        due
    }

    /// Capstan's answer to batch `sequence` of `capture_id`, sent on this session.
    pub fn answered(&mut self, captures: &mut Captures, capture_id: &str, sequence: u64, answer: Answer<'_>, now: Instant) {
        let key = (capture_id.to_string(), sequence);
        self.out.remove(&key);
        match answer {
            Answer::Accepted => captures.accepted(capture_id, sequence),
            Answer::Refused("logs-pressure") => {
                self.waiting.insert(key, Some(now + PRESSURE_WAIT));
            }
            Answer::Refused(reason @ ("log-attempt-unkept" | "log-capture-ended")) => captures.refused(capture_id, reason),
            Answer::Refused(_) => {
                self.waiting.insert(key, None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An entry at second `second` (and `nanos`) of a fixed minute.
    fn entry(second: u32, nanos: u32, line: &str) -> LogEntry {
        let ts = format!("2026-12-06T22:40:{second:02}.{nanos:09}Z");
        let ts_nanos = (1_796_596_800 + i128::from(second)) * 1_000_000_000 + i128::from(nanos);
        LogEntry { ts, ts_nanos, stream: LogStream::Stdout, line: line.to_string() }
    }

    #[test]
    fn a_batch_closes_a_second_after_its_first_entry() {
        let t0 = Instant::now();
        let mut batcher = Batcher::new("asg_1", "00000000000000aa");
        assert_eq!((batcher.deadline(), batcher.close()), (None, None), "nothing open, nothing to close");
        assert_eq!(batcher.push(entry(1, 0, "a"), t0), None);
        assert_eq!(batcher.push(entry(1, 5, "b"), t0 + Duration::from_millis(900)), None);
        assert_eq!(batcher.deadline(), Some(t0 + BATCH_AGE), "from its first entry");
        let first = batcher.close().unwrap();
        assert_eq!((first.sequence, first.entries.len(), first.last, first.lost.as_ref()), (1, 2, false, None));
        assert_eq!(batcher.push(entry(2, 0, "c"), t0 + Duration::from_secs(5)), None);
        assert_eq!(batcher.deadline(), Some(t0 + Duration::from_secs(6)));
        assert_eq!(batcher.close().unwrap().sequence, 2, "numbered without holes");
        // a loss alone opens a batch too, and the final batch may hold nothing
        batcher.lose(2, t0);
        assert_eq!(batcher.deadline(), Some(t0 + BATCH_AGE));
        let lost = batcher.close().unwrap();
        assert_eq!((lost.sequence, lost.entries.len(), lost.lost), (3, 0, Some(Lost { entries: 2, reason: "engine-error" })));
        let last = batcher.finish();
        assert_eq!((last.sequence, last.entries.len(), last.lost, last.last), (4, 0, None, true));
    }

    #[test]
    fn a_batch_closes_at_64_kib_of_lines_or_4096_entries() {
        let now = Instant::now();
        let mut batcher = Batcher::new("asg_1", "00000000000000aa");
        let quarter = "q".repeat(16 * 1024);
        for _ in 0..3 {
            assert_eq!(batcher.push(entry(1, 0, &quarter), now), None);
        }
        let full = batcher.push(entry(1, 0, &quarter), now).expect("64 KiB reached");
        assert_eq!(full.entries.len(), 4);
        assert_eq!(full.entries.iter().map(|e| e.line.len()).sum::<usize>(), BATCH_BYTES);
        // a line that would carry it past 64 KiB goes to the next batch
        for _ in 0..3 {
            assert_eq!(batcher.push(entry(1, 0, &quarter), now), None);
        }
        assert_eq!(batcher.push(entry(1, 0, "short"), now), None);
        let before = batcher.push(entry(1, 0, &quarter), now).expect("the open batch closes first");
        assert_eq!((before.sequence, before.entries.len()), (2, 4));
        assert_eq!(
            batcher.close().unwrap().entries,
            vec![Entry { ts: entry(1, 0, "").ts, stream: LogStream::Stdout, line: quarter, cut: None }]
        );
        // many short lines: 4,096 entries at most
        for i in 0..BATCH_ENTRIES - 1 {
            assert_eq!(batcher.push(entry(1, 0, "x"), now), None, "{i}");
        }
        let many = batcher.push(entry(1, 0, "x"), now).expect("4,096 entries");
        assert_eq!((many.sequence, many.entries.len()), (4, BATCH_ENTRIES));
    }

    #[test]
    fn a_line_past_16_kib_is_cut_on_a_character_boundary_saying_how_much() {
        let mut batcher = Batcher::new("asg_1", "00000000000000aa");
        batcher.push(entry(1, 0, &"a".repeat(LINE_BYTES + 5)), Instant::now());
        // "a" then two-byte characters: byte 16,384 falls inside one
        let wide = format!("a{}", "é".repeat(LINE_BYTES / 2));
        batcher.push(entry(1, 0, &wide), Instant::now());
        batcher.push(entry(1, 0, &"b".repeat(LINE_BYTES)), Instant::now());
        let batch = batcher.close().unwrap();
        assert_eq!((batch.entries[0].line.len(), batch.entries[0].cut), (LINE_BYTES, Some(5)));
        assert_eq!((batch.entries[1].line.len(), batch.entries[1].cut), (LINE_BYTES - 1, Some(2)));
        assert!(batch.entries[1].line.ends_with('é'));
        assert_eq!((batch.entries[2].line.len(), batch.entries[2].cut), (LINE_BYTES, None), "16 KiB exactly is whole");
    }

    #[test]
    fn a_batch_reads_as_the_wire_says() {
        let batch = Batch {
            assignment_id: "asg_1".into(),
            capture_id: "9f2c0a7d41e8b356".into(),
            sequence: 12,
            entries: vec![
                Entry {
                    ts: "2026-12-06T22:40:01.123456789Z".into(),
                    stream: LogStream::Stdout,
                    line: "listening on :8080".into(),
                    cut: None,
                },
                Entry { ts: "2026-12-06T22:40:02Z".into(), stream: LogStream::Stderr, line: "long".into(), cut: Some(7) },
            ],
            lost: Some(Lost { entries: 3, reason: "engine-error" }),
            last: false,
        };
        assert_eq!(
            serde_json::to_value(&batch).unwrap(),
            json!({ "assignmentId": "asg_1", "captureId": "9f2c0a7d41e8b356", "sequence": 12,
                    "entries": [{ "ts": "2026-12-06T22:40:01.123456789Z", "stream": "stdout", "line": "listening on :8080" },
                                { "ts": "2026-12-06T22:40:02Z", "stream": "stderr", "line": "long", "cut": 7 }],
                    "lost": { "entries": 3, "reason": "engine-error" }, "final": false })
        );
        let last = Batch { entries: vec![], lost: None, last: true, sequence: 13, ..batch };
        assert_eq!(
            serde_json::to_value(&last).unwrap(),
            json!({ "assignmentId": "asg_1", "captureId": "9f2c0a7d41e8b356", "sequence": 13, "entries": [], "final": true })
        );
        let from: LogsFrom = serde_json::from_value(json!({ "ts": "2026-12-06T22:40:01Z", "skip": 2 })).unwrap();
        assert_eq!(from, LogsFrom { ts: "2026-12-06T22:40:01Z".into(), skip: 2 });
    }

    /// How a scripted stream ends.
    #[derive(Debug, Clone, Copy)]
    enum End {
        /// The container stopped.
        Stops,
        /// The stream broke.
        Breaks,
        /// It runs on, writing nothing more.
        Hangs,
    }

    /// A container's log as a test writes it: each opening shows the log up to a length, and ends
    /// as planned (the last plan repeats).
    #[derive(Clone)]
    struct Script {
        log: Arc<Mutex<Vec<LogEntry>>>,
        plans: Arc<Mutex<VecDeque<(usize, End)>>>,
        phase: Arc<Mutex<Option<Phase>>>,
        /// The mark of each opening.
        opened: Arc<Mutex<Vec<Mark>>>,
        /// Entries the reader has taken.
        taken: Arc<AtomicUsize>,
        /// The first entries the engine no longer holds (rotated away).
        gone: Arc<AtomicUsize>,
    }

    impl Script {
        fn new(log: Vec<LogEntry>, plans: &[(usize, End)], phase: Option<Phase>) -> Script {
            Script {
                log: Arc::new(Mutex::new(log)),
                plans: Arc::new(Mutex::new(plans.iter().copied().collect())),
                phase: Arc::new(Mutex::new(phase)),
                opened: Arc::default(),
                taken: Arc::default(),
                gone: Arc::default(),
            }
        }
    }

    impl Source for Script {
        fn open(&self, from: Mark) -> BoxStream<'static, Result<LogEntry, LogFault>> {
            self.opened.lock().unwrap().push(from);
            let mut plans = self.plans.lock().unwrap();
            let (upto, end) = if plans.len() > 1 { plans.pop_front().unwrap() } else { plans[0] };
            let mut past_mark = from.filter();
            let first = self.gone.load(Ordering::SeqCst).min(upto);
            let shown: Vec<_> = self.log.lock().unwrap()[first..upto].iter().cloned().flat_map(|e| past_mark(Ok(e))).collect();
            let taken = self.taken.clone();
            let shown = stream::iter(shown).inspect(move |_| {
                taken.fetch_add(1, Ordering::SeqCst);
            });
            match end {
                End::Stops => shown.boxed(),
                End::Breaks => shown.chain(stream::once(async { Err(LogFault::Broken("connection reset".into())) })).boxed(),
                End::Hangs => shown.chain(stream::pending()).boxed(),
            }
        }

        async fn phase(&self) -> Result<Option<Phase>, Refusal> {
            Ok(*self.phase.lock().unwrap())
        }
    }

    /// The batches due on `sends` until `enough` says so (10 s at most).
    /// The batches sent until `enough` says so, each accepted as Capstan would.
    async fn sent_until(captures: &mut Captures, sends: &mut Sends, enough: impl Fn(&[Batch]) -> bool) -> Vec<Batch> {
        let wake = captures.wake();
        let mut sent = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !enough(&sent) {
            assert!(
                Instant::now() < deadline,
                "only {} batches came: {:?}",
                sent.len(),
                sent.iter().map(|b| b.sequence).collect::<Vec<_>>()
            );
            let _ = tokio::time::timeout(Duration::from_millis(100), wake.notified()).await;
            for batch in sends.due(captures, Instant::now()) {
                sends.answered(captures, &batch.capture_id, batch.sequence, Answer::Accepted, Instant::now());
                sent.push(batch);
            }
        }
        sent
    }

    /// Wait until the capture's reader has taken `count` entries.
    async fn taken(script: &Script, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while script.taken.load(Ordering::SeqCst) < count {
            assert!(Instant::now() < deadline, "the reader took {}", script.taken.load(Ordering::SeqCst));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn lines(batches: &[Batch]) -> Vec<&str> {
        batches.iter().flat_map(|b| b.entries.iter().map(|e| e.line.as_str())).collect()
    }

    #[tokio::test]
    async fn a_capture_starts_at_logs_from_reads_on_after_a_break_and_finishes_with_a_final_batch() {
        let log = vec![entry(1, 0, "a"), entry(2, 0, "b"), entry(2, 0, "c"), entry(2, 0, "d"), entry(3, 0, "e"), entry(4, 0, "f")];
        let script = Script::new(log, &[(4, End::Breaks), (6, End::Stops)], Some(Phase::Exited));
        let mut captures = Captures::default();
        let from = LogsFrom { ts: entry(2, 0, "").ts, skip: 1 };
        captures.follow_source("asg_1", script.clone(), Mark::at(&from.ts, from.skip).unwrap());
        let mut sends = Sends::default();
        let sent = sent_until(&mut captures, &mut sends, |sent| lines(sent).len() == 4).await;
        assert_eq!(lines(&sent), ["c", "d", "e", "f"], "from logsFrom on, nothing twice after the break");
        // the stopped container's capture waits (the engine may start it again) until told to finish
        assert!(captures.sending("asg_1"));
        captures.finish("asg_1");
        let mut rest = sent_until(&mut captures, &mut sends, |sent| sent.last().is_some_and(|b| b.last)).await;
        let mut all = sent;
        all.append(&mut rest);
        assert_eq!(lines(&all), ["c", "d", "e", "f"]);
        assert_eq!(all.iter().map(|b| b.sequence).collect::<Vec<_>>(), (1..=all.len() as u64).collect::<Vec<_>>());
        assert!(all.iter().all(|b| b.capture_id == all[0].capture_id && b.assignment_id == "asg_1"));
        assert_eq!(all[0].capture_id.len(), 16);
        assert!(all[0].capture_id.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert_eq!(
            *script.opened.lock().unwrap(),
            [
                Mark::at(&entry(2, 0, "").ts, 1).unwrap(),
                Mark::at(&entry(2, 0, "").ts, 3).unwrap(),
                Mark::at(&entry(4, 0, "").ts, 1).unwrap()
            ],
            "each opening from where it had read"
        );
        // the final batch answered, the capture has nothing more to send
        for batch in &all {
            sends.answered(&mut captures, &batch.capture_id, batch.sequence, Answer::Accepted, Instant::now());
        }
        assert!(!captures.sending("asg_1"));
        captures.forget(|_| true);
        assert!(captures.by_assignment.contains_key("asg_1"), "kept while its assignment is held: no second capture");
        captures.forget(|_| false);
        assert!(captures.by_assignment.is_empty());
    }

    #[tokio::test]
    async fn lines_the_engine_rotated_away_while_the_stream_was_broken_are_stated_as_a_loss() {
        let log = vec![entry(1, 0, "a"), entry(2, 0, "b"), entry(3, 0, "c"), entry(4, 0, "d"), entry(5, 0, "e")];
        let script = Script::new(log, &[(2, End::Breaks), (5, End::Stops)], Some(Phase::Running));
        let mut captures = Captures::default();
        captures.follow_source("asg_1", script.clone(), Mark::default());
        let mut sends = Sends::default();
        taken(&script, 2).await;
        // while the reader was away the engine rotated its log: a, b and c are gone
        script.gone.store(3, Ordering::SeqCst);
        let sent = sent_until(&mut captures, &mut sends, |sent| lines(sent).len() == 4).await;
        assert_eq!(lines(&sent), ["a", "b", "d", "e"], "nothing twice, nothing invented");
        let loss = sent.iter().find(|b| b.lost.is_some()).expect("the rotation is stated");
        assert_eq!(loss.lost, Some(Lost { entries: 0, reason: "engine-rotated" }), "how many, the engine cannot say");
        assert_eq!(lines(std::slice::from_ref(loss))[0], "d", "stated where the lines went, before what came after them");
        assert!(sent.iter().filter(|b| b.sequence < loss.sequence).all(|b| b.lost.is_none()));

        // a log that still holds where the reader stopped states nothing
        let log = vec![entry(1, 0, "a"), entry(2, 0, "b"), entry(3, 0, "c")];
        let script = Script::new(log, &[(2, End::Breaks), (3, End::Stops)], Some(Phase::Running));
        let mut captures = Captures::default();
        captures.follow_source("asg_2", script.clone(), Mark::default());
        taken(&script, 2).await;
        script.gone.store(1, Ordering::SeqCst);
        let sent = sent_until(&mut captures, &mut Sends::default(), |sent| lines(sent).len() == 3).await;
        assert!(sent.iter().all(|b| b.lost.is_none()), "{sent:?}");
    }

    #[tokio::test]
    async fn a_container_the_engine_started_again_stays_in_the_same_capture() {
        let log = vec![entry(1, 0, "a"), entry(1, 0, "b"), entry(5, 0, "c")];
        let script = Script::new(log, &[(2, End::Stops), (3, End::Stops)], Some(Phase::Exited));
        let mut captures = Captures::default();
        captures.follow_source("asg_1", script.clone(), Mark::default());
        let mut sends = Sends::default();
        let first = sent_until(&mut captures, &mut sends, |sent| !sent.is_empty()).await;
        assert_eq!(lines(&first), ["a", "b"]);
        *script.phase.lock().unwrap() = Some(Phase::Running);
        let again = sent_until(&mut captures, &mut sends, |sent| !sent.is_empty()).await;
        assert_eq!(lines(&again), ["c"]);
        assert_eq!((again[0].capture_id.as_str(), again[0].sequence, again[0].last), (first[0].capture_id.as_str(), 2, false));
        // a container that is gone (removed behind the agent's back) ends its capture
        *script.phase.lock().unwrap() = None;
        let last = sent_until(&mut captures, &mut sends, |sent| !sent.is_empty()).await;
        assert_eq!((last[0].sequence, last[0].entries.len(), last[0].last), (3, 0, true));
    }

    #[tokio::test]
    async fn with_8_batches_unanswered_a_capture_stops_reading_and_sends_one_at_a_time() {
        let quarter = "q".repeat(LINE_BYTES);
        let log: Vec<LogEntry> = (0..80).map(|i| entry(1, i, &quarter)).collect();
        let script = Script::new(log, &[(80, End::Hangs)], Some(Phase::Running));
        let mut captures = Captures::default();
        captures.follow_source("asg_1", script.clone(), Mark::default());
        let mut sends = Sends::default();
        // eight batches of four lines, and the ninth's four read: then the reader waits
        taken(&script, 9 * 4).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(script.taken.load(Ordering::SeqCst), 9 * 4);
        let numbers = |batches: Vec<Batch>| batches.iter().map(|b| b.sequence).collect::<Vec<_>>();
        assert_eq!(numbers(sends.due(&captures, Instant::now())), [1], "the oldest goes first");
        assert_eq!(numbers(sends.due(&captures, Instant::now())), [] as [u64; 0], "one of a capture out at a time");
        let capture = captures_id(&captures);
        sends.answered(&mut captures, &capture, 1, Answer::Accepted, Instant::now());
        assert_eq!(numbers(sends.due(&captures, Instant::now())), [2]);
        taken(&script, 10 * 4).await;
    }

    fn captures_id(captures: &Captures) -> String {
        captures.by_assignment.values().next().unwrap().id.clone()
    }

    #[tokio::test]
    async fn unanswered_batches_go_again_on_the_next_session_and_refusals_are_kept_apart() {
        let quarter = "q".repeat(LINE_BYTES);
        let log: Vec<LogEntry> = (0..12).map(|i| entry(1, i, &quarter)).collect();
        let script = Script::new(log, &[(12, End::Hangs)], Some(Phase::Running));
        let mut captures = Captures::default();
        captures.follow_source("asg_1", script.clone(), Mark::default());
        taken(&script, 12).await;
        let numbers = |batches: Vec<Batch>| batches.iter().map(|b| b.sequence).collect::<Vec<_>>();
        let mut first = Sends::default();
        let now = Instant::now();
        assert_eq!(numbers(first.due(&captures, now)), [1]);
        let capture = captures_id(&captures);
        assert!(first.due(&captures, now).is_empty(), "out once per session");
        first.answered(&mut captures, &capture, 1, Answer::Accepted, now);
        assert_eq!(numbers(first.due(&captures, now)), [2]);
        first.answered(&mut captures, &capture, 2, Answer::Refused("logs-pressure"), now);
        assert_eq!(numbers(first.due(&captures, now + Duration::from_secs(2))), [] as [u64; 0], "pressure: a few seconds later");
        assert_eq!(numbers(first.due(&captures, now + PRESSURE_WAIT)), [2]);
        first.answered(&mut captures, &capture, 2, Answer::Refused("session-superseded"), now);
        assert!(first.due(&captures, now + PRESSURE_WAIT).is_empty(), "it waits for the next session, the third behind it");
        // the session ends: the next one sends the unanswered batches again, in order
        let mut second = Sends::default();
        assert_eq!(numbers(second.due(&captures, now)), [2]);
        second.answered(&mut captures, &capture, 2, Answer::Accepted, now);
        assert_eq!(numbers(second.due(&captures, now)), [3]);
        // Capstan keeps nothing more of the attempt: the capture stops, its batches go
        second.answered(&mut captures, &capture, 3, Answer::Refused("log-attempt-unkept"), now);
        assert!(!captures.sending("asg_1"));
        assert!(Sends::default().due(&captures, now).is_empty());
    }

    #[tokio::test]
    async fn a_real_containers_log_is_shipped_and_read_to_the_end_when_it_stops() {
        use crate::engine::tests::{engine_under_test, start_script, unique_assignment, with_cleanup};
        let Some((socket, image)) = engine_under_test() else { return };
        let engine = Engine::connect(&format!("unix://{socket}")).await.unwrap();
        let assignment = unique_assignment();
        with_cleanup(&engine, &[&assignment], async {
            // the shell answers SIGTERM with a last line
            let script = "trap 'echo bye; exit 0' TERM; echo one; echo two >&2; while true; do sleep 0.1; done";
            let id = start_script(&engine, &image, "node_test.5", &assignment, script).await;
            let mut captures = Captures::default();
            captures.follow(&engine, &assignment, &id, None);
            let mut sends = Sends::default();
            let running = sent_until(&mut captures, &mut sends, |sent| lines(sent).len() == 2).await;
            assert_eq!(lines(&running), ["one", "two"]);
            assert_eq!(
                running.iter().flat_map(|b| b.entries.iter().map(|e| e.stream)).collect::<Vec<_>>(),
                [LogStream::Stdout, LogStream::Stderr]
            );

            engine.stop(&id, Duration::from_secs(5)).await.unwrap();
            captures.finish(&assignment);
            let rest = sent_until(&mut captures, &mut sends, |sent| sent.last().is_some_and(|b| b.last)).await;
            assert_eq!(lines(&rest), ["bye"], "what it wrote while stopping is read to the end");
            for batch in running.iter().chain(&rest) {
                sends.answered(&mut captures, &batch.capture_id, batch.sequence, Answer::Accepted, Instant::now());
            }
            assert!(!captures.sending(&assignment), "its final batch answered, the container may go");
        })
        .await;
    }
}
