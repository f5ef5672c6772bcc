//! A container's log as the engine gives it (docs/runtime.md, "Workload logs"): stdout and stderr
//! with the engine's timestamps, followed until the container stops, read from a point on
//! ([`Mark`]) so that what a capture already read is not read twice.
//!
//! The engine prefixes each record with its RFC 3339 timestamp and a space; one message of its
//! stream may hold several `\n`-terminated records. Its `since` is in whole seconds, so entries
//! of the mark's second up to the mark are skipped here.

use super::{Engine, engine_words};
use bollard::container::LogOutput;
use bollard::query_parameters::LogsOptions;
use futures::StreamExt;
use futures::stream::{self, BoxStream};

const NANOS_PER_SECOND: i128 = 1_000_000_000;

/// Which of the container's outputs a line came from (`stdout`, `stderr` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    /// Standard output.
    Stdout = 0,
    /// Standard error.
    Stderr = 1,
}

/// One line of a container's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// When the engine took the line: RFC 3339 in UTC, as the engine wrote it.
    pub ts: String,
    /// `ts` in nanoseconds since the Unix epoch, to compare by.
    pub ts_nanos: i128,
    /// Where it was written.
    pub stream: LogStream,
    /// The line without its newline; bytes that are not UTF-8 replaced (U+FFFD).
    pub line: String,
}

/// What reading a log meets besides entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogFault {
    /// A record whose timestamp does not read: it cannot be placed, so it is counted as lost;
    /// the stream goes on.
    Unreadable,
    /// The stream broke (the engine's words); nothing more is read from it.
    Broken(String),
    /// The log no longer holds where the reader stopped: the engine rotated (or cut) it past
    /// that point, so lines between may be gone — how many, the engine cannot say. Met once,
    /// just before the first entry read past the gap.
    Rotated,
}

/// A point in a container's log: the newest time read, and how many entries carrying exactly
/// that time were read. The start of the log is the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mark {
    at: Option<i128>,
    count: u64,
}

impl Mark {
    /// After the first `skip` entries at `ts` (RFC 3339); `None` when `ts` does not read.
    pub fn at(ts: &str, skip: u64) -> Option<Mark> {
        read_ts(ts).map(|(nanos, _)| Mark { at: Some(nanos), count: skip })
    }

    /// Past `entry` too. An entry older than the mark (the engine's clocks of stdout and stderr
    /// may interleave) leaves it where it is: reading again from the mark does not repeat it.
    pub fn advance(&mut self, entry: &LogEntry) {
        match self.at {
            Some(at) if entry.ts_nanos < at => {}
            Some(at) if entry.ts_nanos == at => self.count += 1,
            _ => *self = Mark { at: Some(entry.ts_nanos), count: 1 },
        }
    }

    /// What of a log read from the mark's second lies past the mark: entries before its time,
    /// and the first `count` at exactly its time, do not; after the first entry that does, every
    /// one does (the log is in the engine's order). When the log no longer holds the `count`
    /// entries at the mark — its first entry past the mark is later — what the reader had read
    /// was rotated away, and lines after it may have gone too: a [`LogFault::Rotated`] comes
    /// before that entry. Faults pass as they are.
    pub fn filter(self) -> impl FnMut(Result<LogEntry, LogFault>) -> Vec<Result<LogEntry, LogFault>> + Send + 'static {
        let mut seen_at_mark = 0;
        let mut passed = self.at.is_none();
        move |record| {
            let Ok(entry) = record else { return vec![record] };
            if passed {
                return vec![Ok(entry)];
            }
            let at = self.at.unwrap_or(i128::MIN);
            if entry.ts_nanos < at {
                return Vec::new();
            }
            if entry.ts_nanos == at && seen_at_mark < self.count {
                seen_at_mark += 1;
                return Vec::new();
            }
            passed = true;
            if seen_at_mark < self.count { vec![Err(LogFault::Rotated), Ok(entry)] } else { vec![Ok(entry)] }
        }
    }

    /// The engine's `since`: the mark's whole second (0, the start, when nothing was read).
    pub(super) fn since(&self) -> i32 {
        self.at.map_or(0, |nanos| i32::try_from(nanos.div_euclid(NANOS_PER_SECOND)).unwrap_or(i32::MAX))
    }
}

impl Engine {
    /// Follow the log of `container_id` (stdout and stderr) after `from`, until the container
    /// stops (a stopped container's stream ends once what it holds is read).
    pub fn logs(&self, container_id: &str, from: Mark) -> BoxStream<'static, Result<LogEntry, LogFault>> {
        let options = LogsOptions { follow: true, stdout: true, stderr: true, timestamps: true, since: from.since(), ..Default::default() };
        let mut past_mark = from.filter();
        let joiner = std::sync::Arc::new(std::sync::Mutex::new(Joiner::default()));
        let rest = joiner.clone();
        self.docker
            .logs(container_id, Some(options))
            .flat_map(move |message| {
                let mut joiner = joiner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                stream::iter(match message {
                    Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => joiner.push(LogStream::Stdout, &message),
                    Ok(LogOutput::StdErr { message }) => joiner.push(LogStream::Stderr, &message),
                    Ok(LogOutput::StdIn { .. }) => Vec::new(),
                    Err(e) => vec![Err(LogFault::Broken(engine_words(&e)))],
                })
            })
            // a last line the container wrote without its newline ends with the stream
            .chain(
                stream::iter(std::iter::once(()))
                    .flat_map(move |()| stream::iter(rest.lock().unwrap_or_else(std::sync::PoisonError::into_inner).flush())),
            )
            .flat_map(move |record| stream::iter(past_mark(record)))
            .boxed()
    }
}

/// Joins the lines the engine splits: a record that ends a message without its newline is a
/// part (the engine cuts long lines, and a line its reader met across two reads), continued by
/// the next records of the same stream — their own timestamps dropped — until one ends with a
/// newline. The line keeps its first part's time.
#[derive(Debug, Default)]
pub(super) struct Joiner {
    pending: [Option<LogEntry>; 2],
}

impl Joiner {
    /// The lines one message of the engine's stream completes: `<RFC 3339> <text>\n`, one or more.
    pub(super) fn push(&mut self, stream: LogStream, message: &[u8]) -> Vec<Result<LogEntry, LogFault>> {
        let ends_line = message.ends_with(b"\n");
        let body = message.strip_suffix(b"\n").unwrap_or(message);
        if body.is_empty() {
            return Vec::new();
        }
        let records: Vec<&[u8]> = body.split(|b| *b == b'\n').collect();
        let last = records.len() - 1;
        let pending = &mut self.pending[stream as usize];
        let mut lines = Vec::new();
        for (i, record) in records.into_iter().enumerate() {
            let part = match entry(stream, record) {
                Ok(part) => part,
                Err(fault) => {
                    lines.push(Err(fault));
                    continue;
                }
            };
            let line = match pending.take() {
                Some(mut started) => {
                    started.line.push_str(&part.line);
                    started
                }
                None => part,
            };
            if i < last || ends_line { lines.push(Ok(line)) } else { *pending = Some(line) }
        }
        lines
    }

    /// What is left unfinished when the stream ends: lines written without a last newline.
    pub(super) fn flush(&mut self) -> Vec<Result<LogEntry, LogFault>> {
        self.pending.iter_mut().filter_map(Option::take).map(Ok).collect()
    }
}

/// The lines of one message read on its own (a part left open at its end is a line too).
#[cfg(test)]
pub(super) fn records(stream: LogStream, message: &[u8]) -> Vec<Result<LogEntry, LogFault>> {
    let mut joiner = Joiner::default();
    let mut lines = joiner.push(stream, message);
    lines.extend(joiner.flush());
    lines
}

fn entry(stream: LogStream, record: &[u8]) -> Result<LogEntry, LogFault> {
    let (ts, line) = match record.iter().position(|b| *b == b' ') {
        Some(space) => (&record[..space], &record[space + 1..]),
        None => (record, &[][..]),
    };
    let (ts_nanos, ts) = std::str::from_utf8(ts).ok().and_then(read_ts).ok_or(LogFault::Unreadable)?;
    Ok(LogEntry { ts, ts_nanos, stream, line: String::from_utf8_lossy(line).into_owned() })
}

/// An RFC 3339 time: nanoseconds since the epoch, and its text in UTC — the engine's own when
/// it wrote UTC, converted when it wrote another offset.
fn read_ts(ts: &str) -> Option<(i128, String)> {
    let parsed = chrono::DateTime::parse_from_rfc3339(ts).ok()?;
    let nanos = i128::from(parsed.timestamp()) * NANOS_PER_SECOND + i128::from(parsed.timestamp_subsec_nanos());
    let text = if ts.ends_with('Z') {
        ts.to_string()
    } else {
        parsed.with_timezone(&chrono::Utc).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
    };
    Some((nanos, text))
}
