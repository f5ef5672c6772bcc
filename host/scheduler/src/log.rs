//! The log a running task appends to: a bounded tail kept with the execution, oldest lines
//! dropped first, so a chatty task cannot grow its execution record without limit.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Lines kept per execution.
pub const MAX_LOG_LINES: usize = 50;
/// Bytes kept per execution (sum of the lines).
pub const MAX_LOG_BYTES: usize = 8 * 1024;
/// One line is cut here, so a single line cannot push every other line out.
pub const MAX_LINE_BYTES: usize = 1024;

#[derive(Debug, Default)]
struct Tail {
    lines: VecDeque<String>,
    bytes: usize,
    /// Lines dropped from the front so far.
    dropped: u64,
    /// Advances on every append, so a writer can tell whether anything changed.
    version: u64,
}

/// A handle a task writes its log through; cheap to clone. Lines must not hold secrets: the
/// tail is shown to administrators as written.
#[derive(Debug, Clone, Default)]
pub struct TaskLog {
    tail: Arc<Mutex<Tail>>,
}

impl TaskLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a line (text with newlines becomes several lines; control characters are
    /// dropped; a line longer than [`MAX_LINE_BYTES`] is cut).
    pub fn line(&self, text: impl AsRef<str>) {
        let mut tail = self.tail.lock().expect("task log");
        for raw in text.as_ref().lines() {
            let clean: String = raw.chars().filter(|c| !c.is_control() || *c == '\t').collect();
            let line = capstan_core::text::truncate(&clean, MAX_LINE_BYTES);
            tail.bytes += line.len();
            tail.lines.push_back(line);
            while tail.lines.len() > MAX_LOG_LINES || tail.bytes > MAX_LOG_BYTES {
                let Some(old) = tail.lines.pop_front() else { break };
                tail.bytes -= old.len();
                tail.dropped += 1;
            }
            tail.version += 1;
        }
    }

    /// The lines kept and how many were dropped before them.
    pub fn snapshot(&self) -> (Vec<String>, u64) {
        let tail = self.tail.lock().expect("task log");
        (tail.lines.iter().cloned().collect(), tail.dropped)
    }

    pub(super) fn version(&self) -> u64 {
        self.tail.lock().expect("task log").version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_newest_lines_within_both_bounds() {
        let log = TaskLog::new();
        for i in 0..120 {
            log.line(format!("line {i}"));
        }
        let (lines, dropped) = log.snapshot();
        assert_eq!(lines.len(), MAX_LOG_LINES);
        assert_eq!(lines.first().map(String::as_str), Some("line 70"));
        assert_eq!(lines.last().map(String::as_str), Some("line 119"));
        assert_eq!(dropped, 70);

        let log = TaskLog::new();
        for _ in 0..20 {
            log.line("x".repeat(5000));
        }
        let (lines, dropped) = log.snapshot();
        assert!(lines.iter().map(String::len).sum::<usize>() <= MAX_LOG_BYTES);
        assert!(lines.iter().all(|l| l.len() <= MAX_LINE_BYTES + '…'.len_utf8()), "long lines are cut");
        assert_eq!(lines.len() as u64 + dropped, 20);

        let log = TaskLog::new();
        log.line("one\ntwo\u{7}\r");
        assert_eq!(log.snapshot().0, vec!["one", "two"]);
        assert_eq!(log.version(), 2);
    }
}
