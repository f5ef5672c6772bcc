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
    Stdout,
    /// Standard error.
    Stderr,
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

    /// Whether an entry of a log read from the mark's second lies past the mark: entries before
    /// its time, and the first `count` at exactly its time, do not; after the first entry that
    /// does, every one does (the log is in the engine's order).
    pub fn filter(self) -> impl FnMut(&LogEntry) -> bool + Send + 'static {
        let mut seen_at_mark = 0;
        let mut passed = self.at.is_none();
        move |entry| {
            if !passed {
                let at = self.at.unwrap_or(i128::MIN);
                if entry.ts_nanos < at {
                    return false;
                }
                if entry.ts_nanos == at && seen_at_mark < self.count {
                    seen_at_mark += 1;
                    return false;
                }
                passed = true;
            }
            true
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
        self.docker
            .logs(container_id, Some(options))
            .flat_map(|message| {
                stream::iter(match message {
                    Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => records(LogStream::Stdout, &message),
                    Ok(LogOutput::StdErr { message }) => records(LogStream::Stderr, &message),
                    Ok(LogOutput::StdIn { .. }) => Vec::new(),
                    Err(e) => vec![Err(LogFault::Broken(engine_words(&e)))],
                })
            })
            .filter(move |record| std::future::ready(record.as_ref().map_or(true, &mut past_mark)))
            .boxed()
    }
}

/// The records of one message of the engine's stream: `<RFC 3339> <line>\n`, one or more (the
/// last may lack its newline: the engine splits a long line into records of its own).
pub(super) fn records(stream: LogStream, message: &[u8]) -> Vec<Result<LogEntry, LogFault>> {
    let message = message.strip_suffix(b"\n").unwrap_or(message);
    if message.is_empty() {
        return Vec::new();
    }
    message.split(|b| *b == b'\n').map(|record| entry(stream, record)).collect()
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
