//! `capstan services logs NAME`: a service's replica logs (docs/runtime.md, "Workload logs"),
//! a client of `runtime.getLogAttempts` and `runtime.getLogs`. Each replica's newest attempt is
//! read whole, the replicas interleaved by the engine's timestamps and prefixed with their slot
//! as `docker compose logs` does; stderr shows in red on a terminal, and every loss Capstan or
//! the node stated (a truncation, a gap, lines lost) is said in its place, never skipped.
//! `-f` follows: new lines within about a second, and a replica's new attempt (a restart, a
//! rollout) from its first line.

use super::client::{Client, Common};
use super::resolve;
use crate::refusal::{Refusal, Result};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often `-f` asks several replicas for new lines when none came.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);
/// How long `-f` lets Capstan wait for a single replica's new lines (then it looks for a new
/// attempt).
const FOLLOW_WAIT_MS: u64 = 2_000;
/// How often `-f` looks for new attempts (a replica restarted or replaced).
const ATTEMPTS_EVERY: Duration = Duration::from_secs(3);

#[derive(clap::Args)]
pub struct LogsArgs {
    /// The service's name or id (`svc_…`)
    pub service: String,
    /// The organization (name or id) to look the service's name up in
    #[arg(long, visible_alias = "org", value_name = "NAME|ID")]
    pub organization: Option<String>,
    /// Only this replica: its slot (`node_….0`, as `services status` shows it) or its node's id
    #[arg(long, value_name = "SLOT|NODE")]
    pub replica: Option<String>,
    /// Only lines of the last DURATION (`90s`, `10m`, `2h`)
    #[arg(long, value_name = "DURATION", value_parser = parse_since)]
    pub since: Option<Duration>,
    /// Only the last N lines (of every replica together)
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    /// Keep printing new lines as the replicas write them, across restarts (ctrl-c ends)
    #[arg(short = 'f', long)]
    pub follow: bool,
    #[command(flatten)]
    pub common: Common,
}

fn parse_since(text: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration such as 90s, 10m or 2h: {e}"))
}

/// One line to print.
#[derive(Debug, Clone, PartialEq)]
struct Line {
    /// Nanoseconds since the epoch (for interleaving); 0 for a notice.
    at: i128,
    slot: String,
    assignment: String,
    ts: String,
    stderr: bool,
    text: String,
    /// A loss stated (a notice, not a line of the container's).
    notice: bool,
}

/// Nanoseconds since the epoch of an RFC 3339 time; `None` when it does not read.
fn nanos(ts: &str) -> Option<i128> {
    let at = humantime::parse_rfc3339_weak(ts.trim_end_matches('Z')).ok()?;
    let since = at.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(since.as_nanos() as i128)
}

/// The lines of one page of `runtime.getLogs`, losses as notices.
fn lines_of(page: &Value, slot: &str, assignment: &str) -> Vec<Line> {
    let notice = |text: String| Line {
        at: 0,
        slot: slot.into(),
        assignment: assignment.into(),
        ts: String::new(),
        stderr: false,
        text,
        notice: true,
    };
    let mut out = Vec::new();
    for record in page["records"].as_array().into_iter().flatten() {
        match record["kind"].as_str() {
            Some("truncation") => out.push(notice(format!(
                "{} earlier lines ({} batches) were let go: {}",
                record["entries"],
                record["batches"],
                record["reasons"].as_array().into_iter().flatten().filter_map(Value::as_str).collect::<Vec<_>>().join(", ")
            ))),
            Some("gap") => out.push(notice(match record["entries"].as_u64() {
                Some(n) if n > 0 => format!("{n} lines are missing ({} batches Capstan no longer holds)", record["batches"]),
                _ => format!("{} batches of lines never arrived", record["batches"]),
            })),
            Some("batch") => {
                for entry in record["entries"].as_array().into_iter().flatten() {
                    let ts = entry["ts"].as_str().unwrap_or_default().to_string();
                    let mut text = entry["line"].as_str().unwrap_or_default().to_string();
                    if let Some(cut) = entry["cut"].as_u64() {
                        text.push_str(&format!(" […{cut} bytes cut]"));
                    }
                    out.push(Line {
                        at: nanos(&ts).unwrap_or(0),
                        slot: slot.into(),
                        assignment: assignment.into(),
                        ts,
                        stderr: entry["stream"] == "stderr",
                        text,
                        notice: false,
                    });
                }
                if let Some(lost) = record.get("lost").filter(|l| l.is_object()) {
                    let reason = lost["reason"].as_str().unwrap_or("?");
                    out.push(notice(match (reason, lost["entries"].as_u64()) {
                        // the engine cannot say how many lines its rotation took
                        ("engine-rotated", Some(0)) => {
                            "lines may be missing here: the engine rotated its log past where the node had read (engine-rotated)"
                                .to_string()
                        }
                        (_, entries) => format!("{} lines the node could not read ({reason})", entries.unwrap_or(0)),
                    }));
                }
            }
            _ => {}
        }
    }
    out
}

/// A replica's attempt being read: where its next page starts.
struct Reading {
    slot: String,
    assignment: String,
    cursor: Option<String>,
}

impl Reading {
    /// Read on from the cursor: every page until the newest kept batch, waiting up to `wait_ms`
    /// for new lines when there are none.
    fn read(&mut self, client: &Client, service: &str, wait_ms: u64) -> Result<Vec<Line>> {
        let mut lines = Vec::new();
        loop {
            let mut body = json!({ "serviceId": service, "assignmentId": self.assignment, "limit": 1000, "waitMs": wait_ms });
            if let Some(cursor) = &self.cursor {
                body["cursor"] = json!(cursor);
            }
            let page = client.call("runtime.getLogs", &body)?;
            lines.extend(lines_of(&page, &self.slot, &self.assignment));
            if let Some(next) = page["nextCursor"].as_str().filter(|c| !c.is_empty()) {
                self.cursor = Some(next.to_string());
            }
            if page["end"] != true {
                continue;
            }
            return Ok(lines);
        }
    }
}

/// The newest attempt of each replica (`--replica` applied), by slot.
fn newest_attempts(client: &Client, service: &str, replica: Option<&str>) -> Result<BTreeMap<String, String>> {
    let mut newest: BTreeMap<String, String> = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut body = json!({ "serviceId": service, "limit": 100 });
        if let Some(c) = &cursor {
            body["cursor"] = json!(c);
        }
        let page = client.call("runtime.getLogAttempts", &body)?;
        // newest issued first: the first seen of a slot is its newest
        for item in page["items"].as_array().into_iter().flatten() {
            let (slot, node) = (item["slot"].as_str().unwrap_or_default(), item["nodeId"].as_str().unwrap_or_default());
            if replica.is_some_and(|r| r != slot && r != node) {
                continue;
            }
            newest.entry(slot.to_string()).or_insert_with(|| item["assignmentId"].as_str().unwrap_or_default().to_string());
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return Ok(newest),
        }
    }
}

/// Interleave by time (a notice stays after what came before it of its replica), then keep
/// what `--since` and `--tail` ask for.
fn select(mut lines: Vec<Line>, since: Option<i128>, tail: Option<usize>) -> Vec<Line> {
    let mut last_at: BTreeMap<String, i128> = BTreeMap::new();
    for line in &mut lines {
        let seen = last_at.entry(line.slot.clone()).or_insert(0);
        if line.notice { line.at = *seen } else { *seen = line.at }
    }
    lines.sort_by_key(|l| l.at);
    if let Some(since) = since {
        lines.retain(|l| l.at >= since);
    }
    if let Some(tail) = tail {
        let skip = lines.len().saturating_sub(tail);
        lines.drain(..skip);
    }
    lines
}

struct Printer {
    json: bool,
    colour: bool,
    width: usize,
    slots: Vec<String>,
}

const PALETTE: [&str; 6] = ["36", "33", "32", "35", "34", "96"];

impl Printer {
    fn print(&mut self, out: &mut impl Write, line: &Line) -> std::io::Result<()> {
        if self.json {
            let stream = if line.notice {
                "notice"
            } else if line.stderr {
                "stderr"
            } else {
                "stdout"
            };
            let record = json!({ "slot": line.slot, "assignmentId": line.assignment, "ts": line.ts, "stream": stream, "line": line.text });
            return writeln!(out, "{record}");
        }
        let index = match self.slots.iter().position(|s| *s == line.slot) {
            Some(i) => i,
            None => {
                self.slots.push(line.slot.clone());
                self.slots.len() - 1
            }
        };
        let prefix = format!("{:width$} |", line.slot, width = self.width);
        if !self.colour {
            let mark = if line.notice { "-- " } else { "" };
            return writeln!(out, "{prefix} {mark}{}", line.text);
        }
        let tint = PALETTE[index % PALETTE.len()];
        match (line.notice, line.stderr) {
            (true, _) => writeln!(out, "\x1b[{tint}m{prefix}\x1b[0m \x1b[33m-- {}\x1b[0m", line.text),
            (false, true) => writeln!(out, "\x1b[{tint}m{prefix}\x1b[0m \x1b[31m{}\x1b[0m", line.text),
            (false, false) => writeln!(out, "\x1b[{tint}m{prefix}\x1b[0m {}", line.text),
        }
    }
}

pub fn logs(args: &LogsArgs) -> Result<()> {
    let client = Client::new(&args.common.connection)?;
    let service = resolve::service(&client, &args.service, args.organization.as_deref())?;
    let since = args.since.map(|d| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        now.saturating_sub(d).as_nanos() as i128
    });
    let mut readings: Vec<Reading> = newest_attempts(&client, &service, args.replica.as_deref())?
        .into_iter()
        .map(|(slot, assignment)| Reading { slot, assignment, cursor: None })
        .collect();
    if readings.is_empty() && !args.follow {
        let whose = args.replica.as_deref().map(|r| format!(" of the replica {r}")).unwrap_or_default();
        return Err(Refusal::new("logs-none", format!("no logs are kept{whose}: the service has not run, or its logs were let go")));
    }
    let stdout = std::io::stdout();
    let mut printer = Printer {
        json: args.common.json,
        colour: stdout.is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        width: readings.iter().map(|r| r.slot.len()).max().unwrap_or(0),
        slots: Vec::new(),
    };
    let mut out = stdout.lock();
    let mut lines = Vec::new();
    for reading in &mut readings {
        lines.extend(reading.read(&client, &service, 0)?);
    }
    for line in select(lines, since, args.tail) {
        printed(printer.print(&mut out, &line))?;
    }
    printed(out.flush())?;
    if !args.follow {
        return Ok(());
    }
    let mut looked = Instant::now();
    loop {
        if looked.elapsed() >= ATTEMPTS_EVERY {
            looked = Instant::now();
            for (slot, assignment) in newest_attempts(&client, &service, args.replica.as_deref())? {
                match readings.iter_mut().find(|r| r.slot == slot) {
                    Some(r) if r.assignment == assignment => {}
                    Some(r) => {
                        *r = Reading { slot: slot.clone(), assignment: assignment.clone(), cursor: None };
                        printed(writeln!(out, "{:w$} | -- a new attempt: {assignment}", slot, w = printer.width))?;
                    }
                    None => {
                        printer.width = printer.width.max(slot.len());
                        readings.push(Reading { slot, assignment, cursor: None });
                    }
                }
            }
        }
        // one replica: Capstan answers as its lines come; several: each is asked in turn
        let wait_ms = if readings.len() == 1 { FOLLOW_WAIT_MS } else { 0 };
        let mut fresh = Vec::new();
        for reading in &mut readings {
            match reading.read(&client, &service, wait_ms) {
                Ok(lines) => fresh.extend(lines),
                // a host restarting: say so and read again
                Err(refusal) if refusal.retryable => eprintln!("capstan: not read this time ({}): {}", refusal.code, refusal.message),
                Err(refusal) => return Err(refusal),
            }
        }
        let quiet = fresh.is_empty();
        for line in select(fresh, None, None) {
            printed(printer.print(&mut out, &line))?;
        }
        printed(out.flush())?;
        if quiet && wait_ms == 0 {
            std::thread::sleep(FOLLOW_EVERY);
        }
    }
}

/// A write to standard output: a closed pipe (`| head`) ends the command quietly.
fn printed(written: std::io::Result<()>) -> Result<()> {
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => other.map_err(|e| Refusal::new("output-failed", "writing to standard output failed").detail(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(records: Value) -> Value {
        json!({ "records": records, "nextCursor": "0.1", "end": true })
    }

    #[test]
    fn records_become_lines_and_every_loss_a_notice() {
        let got = lines_of(
            &page(json!([
                { "kind": "truncation", "batches": 2, "bytes": 10, "entries": 7, "reasons": ["byte-cap"] },
                { "kind": "gap", "captureId": "c", "batches": 1, "entries": 0 },
                { "kind": "batch", "captureId": "c", "sequence": 3, "final": false,
                  "entries": [{ "ts": "2026-12-06T22:40:01.5Z", "stream": "stdout", "line": "up" },
                              { "ts": "2026-12-06T22:40:02Z", "stream": "stderr", "line": "oops", "cut": 9 }],
                  "lost": { "entries": 3, "reason": "engine-error" } },
            ])),
            "node_1.0",
            "asg_1",
        );
        let texts: Vec<(&str, bool, bool)> = got.iter().map(|l| (l.text.as_str(), l.stderr, l.notice)).collect();
        assert_eq!(
            texts,
            [
                ("7 earlier lines (2 batches) were let go: byte-cap", false, true),
                ("1 batches of lines never arrived", false, true),
                ("up", false, false),
                ("oops […9 bytes cut]", true, false),
                ("3 lines the node could not read (engine-error)", false, true),
            ]
        );
        assert_eq!(got[2].at, nanos("2026-12-06T22:40:01.5Z").unwrap());
        assert!(got[3].at - got[2].at == 500_000_000);
    }

    fn line(slot: &str, ts: &str, text: &str) -> Line {
        Line {
            at: nanos(ts).unwrap(),
            slot: slot.into(),
            assignment: "a".into(),
            ts: ts.into(),
            stderr: false,
            text: text.into(),
            notice: false,
        }
    }

    #[test]
    fn replicas_interleave_by_time_and_since_and_tail_keep_the_newest() {
        let lines = vec![
            line("n1.0", "2026-12-06T10:00:01Z", "a1"),
            line("n1.0", "2026-12-06T10:00:03.000000001Z", "a2"),
            line("n2.0", "2026-12-06T10:00:02Z", "b1"),
            line("n2.0", "2026-12-06T10:00:04Z", "b2"),
        ];
        let texts = |v: Vec<Line>| v.into_iter().map(|l| l.text).collect::<Vec<_>>();
        assert_eq!(texts(select(lines.clone(), None, None)), ["a1", "b1", "a2", "b2"]);
        assert_eq!(texts(select(lines.clone(), None, Some(2))), ["a2", "b2"]);
        let since = nanos("2026-12-06T10:00:02Z");
        assert_eq!(texts(select(lines, since, None)), ["b1", "a2", "b2"]);
    }

    #[test]
    fn a_line_prints_behind_its_replica_and_json_keeps_every_field() {
        let mut plain = Printer { json: false, colour: false, width: 6, slots: vec![] };
        let mut out = Vec::new();
        plain.print(&mut out, &line("n1.0", "2026-12-06T10:00:01Z", "hello")).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "n1.0   | hello\n");
        let mut json = Printer { json: true, colour: false, width: 0, slots: vec![] };
        let mut out = Vec::new();
        json.print(&mut out, &line("n1.0", "2026-12-06T10:00:01Z", "hello")).unwrap();
        let record: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            record,
            json!({ "slot": "n1.0", "assignmentId": "a", "ts": "2026-12-06T10:00:01Z", "stream": "stdout", "line": "hello" })
        );
    }
}
