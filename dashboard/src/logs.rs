//! A service's **Logs** page at `/services/{id}/logs` (docs/runtime.md, "Workload logs"): a
//! replica picker (each slot, opening its newest attempt; a replica's older attempts listed with
//! when each was issued and whether its slot released it and when its logs expire) and the lines
//! of the chosen attempt, oldest first — the engine's timestamp, the text, stderr marked as an
//! error, and every loss Capstan or the node stated (a truncation, a gap, lines a node could not
//! read) as a warning in its place, never skipped.
//!
//! Everything goes through `runtime.getLogAttempts` and `runtime.getLogs` as the signed-in person,
//! so a refusal is theirs and shows as the page's error banner. An attempt is read page by page,
//! at most [`PAGES`] of them; past that the page says the attempt holds more and points to the CLI.
//!
//! While the page is open `static/logs.js` follows the attempt its slot still holds: it asks
//! `GET /services/{id}/logs/{assignment}/after?cursor=…` (a `runtime.getLogs` that waits up to
//! [`FOLLOW_WAIT_MS`] for new lines) and appends what comes, as JSON it renders with
//! `textContent`. At most [`MAX_FOLLOWERS`] such reads wait at once in this process.

use super::forms::{ErrorView, Signed, call, encode, query_of, status_of, str_of, u64_of, when};
use super::{nav, render, user_view};
use crate::Host;
use crate::Viewer;
use crate::refusal::Result;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// The most pages of an attempt's records the page reads.
const PAGES: usize = 64;
/// Records asked for per page (the method's largest).
const PAGE_RECORDS: usize = 1000;
/// Pages of attempts read for the picker (100 each: a slot keeps its newest 8).
const ATTEMPT_PAGES: usize = 10;
/// How long a follow read waits for new lines: under the method's 25 s and common proxy timeouts.
const FOLLOW_WAIT_MS: u64 = 20_000;
/// The most follow reads waiting at once in this process (more are answered 503).
const MAX_FOLLOWERS: usize = 256;

static FOLLOWERS: Semaphore = Semaphore::const_new(MAX_FOLLOWERS);

// ---------------------------------------------------------------------------------------
// Lines

/// One row of the lines: a line of the container's, or a loss or notice stated in its place.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct LogLine {
    /// `stdout`, `stderr`, `loss` (lines let go, never arrived or unreadable) or `notice`.
    kind: &'static str,
    /// How it is shown: `info` (stdout), `error` (stderr), `warning` (a loss) or `notice`.
    level: &'static str,
    /// The engine's timestamp as given (RFC 3339), `""` for a loss or a notice.
    ts: String,
    /// The timestamp as shown: `2026-12-06 22:40:01.123`.
    at: String,
    text: String,
    /// Bytes the agent cut off a line longer than 16 KiB.
    cut: Option<u64>,
}

impl LogLine {
    fn stated(kind: &'static str, text: String) -> LogLine {
        LogLine { kind, level: level_of(kind), ts: String::new(), at: String::new(), text, cut: None }
    }

    fn is_line(&self) -> bool {
        matches!(self.kind, "stdout" | "stderr")
    }
}

fn level_of(kind: &str) -> &'static str {
    match kind {
        "stdout" => "info",
        "stderr" => "error",
        "loss" => "warning",
        _ => "notice",
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `2026-12-06T22:40:01.123456789Z` as `2026-12-06 22:40:01.123`; anything else as given.
fn shown_ts(ts: &str) -> String {
    let (Some(date), Some("T"), Some(time)) = (ts.get(..10), ts.get(10..11), ts.get(11..19)) else { return ts.to_string() };
    let fraction: String = ts
        .get(19..)
        .and_then(|rest| rest.strip_prefix('.'))
        .map(|f| f.chars().take_while(char::is_ascii_digit).take(3).collect())
        .unwrap_or_default();
    if fraction.is_empty() { format!("{date} {time}") } else { format!("{date} {time}.{fraction}") }
}

/// The rows of `runtime.getLogs` records, in their order.
fn lines_of(records: &[Value]) -> Vec<LogLine> {
    let mut out = Vec::new();
    for record in records {
        match record["kind"].as_str() {
            Some("truncation") => {
                let reasons: Vec<&str> = record["reasons"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                let lines = plural(u64_of(record, "entries"), "earlier line was", "earlier lines were");
                out.push(LogLine::stated("loss", format!("{lines} let go: {}", reasons.join(", "))));
            }
            Some("gap") => {
                let batches = u64_of(record, "batches");
                let text = match u64_of(record, "entries") {
                    // numbers the node skipped: it never said how many lines
                    0 => format!("{} of lines never arrived", plural(batches, "batch", "batches")),
                    // kept rows whose payload is gone: Capstan's own loss
                    n => format!(
                        "{} missing: Capstan no longer holds {}",
                        plural(n, "line is", "lines are"),
                        plural(batches, "batch", "batches")
                    ),
                };
                out.push(LogLine::stated("loss", text));
            }
            Some("batch") => {
                for entry in record["entries"].as_array().into_iter().flatten() {
                    let ts = str_of(entry, "ts").to_string();
                    let kind = if entry["stream"] == "stderr" { "stderr" } else { "stdout" };
                    out.push(LogLine {
                        kind,
                        level: level_of(kind),
                        at: shown_ts(&ts),
                        ts,
                        text: str_of(entry, "line").to_string(),
                        cut: entry["cut"].as_u64(),
                    });
                }
                if let Some(lost) = record.get("lost").filter(|l| l.is_object()) {
                    let (entries, reason) = (u64_of(lost, "entries"), str_of(lost, "reason"));
                    let said = match (reason, entries) {
                        // the engine cannot say how many lines its rotation took
                        ("engine-rotated", 0) => {
                            "Lines may be missing here: the engine rotated its log past where the node had read (engine-rotated)"
                                .to_string()
                        }
                        _ => format!("{} the node could not read ({reason})", plural(entries, "line", "lines")),
                    };
                    out.push(LogLine::stated("loss", said));
                }
                if record["final"] == true {
                    out.push(LogLine::stated("notice", "The container stopped: its log ends here".into()));
                }
            }
            _ => {}
        }
    }
    out
}

/// An attempt's records from its start, page by page, at most [`PAGES`] pages: the rows, the
/// cursor to read on from (`""` while nothing is kept), and whether it holds more.
async fn read_lines(state: &Host, identity: &Viewer, service: &str, assignment: &str) -> Result<(Vec<LogLine>, String, bool)> {
    let (mut lines, mut cursor) = (Vec::new(), String::new());
    for _ in 0..PAGES {
        let mut body = json!({ "serviceId": service, "assignmentId": assignment, "limit": PAGE_RECORDS });
        if !cursor.is_empty() {
            body["cursor"] = json!(cursor);
        }
        let page = call(state, identity, "runtime.getLogs", body).await?;
        let records = page["records"].as_array().map(Vec::as_slice).unwrap_or_default();
        lines.extend(lines_of(records));
        if let Some(next) = page["nextCursor"].as_str().filter(|c| !c.is_empty()) {
            cursor = next.to_string();
        }
        if page["end"] == true || records.is_empty() {
            return Ok((lines, cursor, false));
        }
    }
    Ok((lines, cursor, true))
}

// ---------------------------------------------------------------------------------------
// The picker

/// One attempt in the picker.
#[derive(Debug, Serialize)]
struct AttemptView {
    id: String,
    href: String,
    issued: (String, String),
    /// Its slot still holds it (it may get new lines).
    current: bool,
    released: Option<(String, String)>,
    /// When its logs are let go (only once released).
    expires: Option<(String, String)>,
    last_line: Option<(String, String)>,
    lines_kept: u64,
    chosen: bool,
}

/// One replica (slot): its attempts, newest first.
#[derive(Debug, Serialize)]
struct ReplicaView {
    slot: String,
    /// Its newest attempt.
    href: String,
    chosen: bool,
    attempts: Vec<AttemptView>,
}

fn at_ms(value: &Value, key: &str) -> Option<(String, String)> {
    value[key].as_u64().map(when)
}

/// The replicas of `runtime.getLogAttempts` items (newest first), by slot, `chosen` marked.
fn replicas_of(items: &[Value], base: &str, chosen: &str) -> Vec<ReplicaView> {
    let mut replicas: Vec<ReplicaView> = Vec::new();
    for item in items {
        let id = str_of(item, "assignmentId").to_string();
        let attempt = AttemptView {
            href: format!("{base}?attempt={}", encode(&id)),
            issued: at_ms(item, "issuedAt").unwrap_or_default(),
            current: item["releasedAt"].is_null(),
            released: at_ms(item, "releasedAt"),
            expires: at_ms(item, "expiresAt"),
            last_line: at_ms(item, "lastBatchAt"),
            lines_kept: u64_of(&item["kept"], "entries"),
            chosen: id == chosen,
            id,
        };
        let slot = str_of(item, "slot");
        match replicas.iter_mut().find(|r| r.slot == slot) {
            Some(replica) => {
                replica.chosen |= attempt.chosen;
                replica.attempts.push(attempt);
            }
            None => replicas.push(ReplicaView {
                slot: slot.to_string(),
                href: attempt.href.clone(),
                chosen: attempt.chosen,
                attempts: vec![attempt],
            }),
        }
    }
    replicas.sort_by(|a, b| a.slot.cmp(&b.slot));
    replicas
}

/// Every attempt whose logs are kept, newest first (at most [`ATTEMPT_PAGES`] pages).
async fn read_attempts(state: &Host, identity: &Viewer, service: &str) -> Result<Vec<Value>> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..ATTEMPT_PAGES {
        let mut body = json!({ "serviceId": service, "limit": 100 });
        if let Some(cursor) = &cursor {
            body["cursor"] = json!(cursor);
        }
        let page = call(state, identity, "runtime.getLogAttempts", body).await?;
        items.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    Ok(items)
}

// ---------------------------------------------------------------------------------------
// The page

/// A service as a page about it names it (the Logs, Events and secrets pages).
#[derive(Serialize)]
pub(super) struct ServiceHead {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) organization_id: String,
    organization: String,
    href: String,
    organization_href: String,
}

/// The service `id` as its page's head shows it; its organization links to `/<area>?org=…`
/// (`services`, `secrets`).
pub(super) async fn service_head(state: &Host, identity: &Viewer, id: &str, area: &str) -> Result<ServiceHead> {
    let service = call(state, identity, "services.get", json!({ "id": id })).await?;
    let organization_id = str_of(&service, "organizationId").to_string();
    // the organization's name is a courtesy: its id stands in when it cannot be read
    let organization = match call(state, identity, "organizations.get", json!({ "id": organization_id })).await {
        Ok(org) => str_of(&org, "name").to_string(),
        Err(_) => organization_id.clone(),
    };
    Ok(ServiceHead {
        id: id.into(),
        name: str_of(&service, "name").to_string(),
        href: format!("/services/{}", encode(id)),
        organization_href: format!("/{area}?org={}", encode(&organization_id)),
        organization_id,
        organization,
    })
}

/// The chosen attempt's lines, as the page shows them.
#[derive(Serialize)]
struct ShownView {
    assignment_id: String,
    slot: String,
    lines: Vec<LogLine>,
    /// Lines of the container's among them.
    line_count: usize,
    /// It holds more than the page read.
    more: bool,
    /// Where the page follows new lines from; `None` when it does not follow.
    follow_href: Option<String>,
    cursor: String,
    /// Why the page does not follow (the attempt was released, or holds more than is shown).
    still: Option<&'static str>,
}

#[derive(Deserialize, Default)]
pub(super) struct LogsQuery {
    attempt: Option<String>,
}

/// `GET /services/{id}/logs?attempt=<assignmentId>`: the picker and the chosen attempt's lines
/// (the newest attempt of the service when none is asked for).
pub(super) async fn page(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let asked = query_of::<LogsQuery>(&uri).unwrap_or_default().attempt.filter(|a| !a.is_empty());
    let base = format!("/services/{}/logs", encode(&id));
    let common = |status: StatusCode, service: Option<&ServiceHead>, ctx: minijinja::Value| {
        let page = service.map(|s| format!("Logs of {}", s.name)).unwrap_or_else(|| "Logs".into());
        let ctx = context! { page, nav => Serde(nav(&state, "services")), user => Serde(user_view(&identity)), ..ctx };
        render(status, "service_logs.html", ctx)
    };
    let service = match service_head(&state, &identity, &id, "services").await {
        Ok(service) => service,
        Err(refusal) => return common(status_of(&refusal), None, context! { service_error => Serde(Some(ErrorView::from(&refusal))) }),
    };
    let items = match read_attempts(&state, &identity, &id).await {
        Ok(items) => items,
        Err(refusal) => {
            let ctx = context! { service => Serde(&service), logs_error => Serde(Some(ErrorView::from(&refusal))) };
            return common(status_of(&refusal), Some(&service), ctx);
        }
    };
    // the asked attempt (the method judges it), else the newest
    let Some(chosen) = asked.or_else(|| items.first().map(|a| str_of(a, "assignmentId").to_string())) else {
        return common(
            StatusCode::OK,
            Some(&service),
            context! { service => Serde(&service), replicas => Serde(Vec::<ReplicaView>::new()) },
        );
    };
    let replicas = replicas_of(&items, &base, &chosen);
    let attempt = items.iter().find(|a| str_of(a, "assignmentId") == chosen);
    let (lines, cursor, more) = match read_lines(&state, &identity, &id, &chosen).await {
        Ok(read) => read,
        Err(refusal) => {
            let ctx =
                context! { service => Serde(&service), replicas => Serde(replicas), logs_error => Serde(Some(ErrorView::from(&refusal))) };
            return common(status_of(&refusal), Some(&service), ctx);
        }
    };
    let released = attempt.is_some_and(|a| !a["releasedAt"].is_null());
    let still = if more {
        Some("it holds more lines than this page shows")
    } else if released {
        Some("its slot released it: no new lines come")
    } else {
        None
    };
    let shown = ShownView {
        slot: attempt.map(|a| str_of(a, "slot").to_string()).unwrap_or_default(),
        line_count: lines.iter().filter(|l| l.is_line()).count(),
        follow_href: still.is_none().then(|| format!("{base}/{}/after", encode(&chosen))),
        assignment_id: chosen,
        lines,
        more,
        cursor,
        still,
    };
    common(StatusCode::OK, Some(&service), context! { service => Serde(&service), replicas => Serde(replicas), shown => Serde(shown) })
}

#[derive(Deserialize, Default)]
pub(super) struct AfterQuery {
    cursor: Option<String>,
}

/// `GET /services/{id}/logs/{assignment}/after?cursor=…`: the lines after `cursor`, waiting up to
/// [`FOLLOW_WAIT_MS`] for some, as `{"lines": [...], "cursor": "…"}`; a refusal as
/// `{"error": {"code", "message"}}` with its status.
pub(super) async fn after(
    State(state): State<Host>,
    Signed(identity): Signed,
    Path((id, assignment)): Path<(String, String)>,
    uri: Uri,
) -> Response {
    let cursor = query_of::<AfterQuery>(&uri).unwrap_or_default().cursor.filter(|c| !c.is_empty());
    let Ok(_permit) = FOLLOWERS.try_acquire() else {
        let error = json!({ "error": { "code": "busy", "message": "too many pages are following logs; this one tries again shortly" } });
        let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(error)).into_response();
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return response;
    };
    let mut body = json!({ "serviceId": id, "assignmentId": assignment, "limit": PAGE_RECORDS, "waitMs": FOLLOW_WAIT_MS });
    if let Some(cursor) = &cursor {
        body["cursor"] = json!(cursor);
    }
    match call(&state, &identity, "runtime.getLogs", body).await {
        Ok(page) => {
            let mut records = page["records"].as_array().cloned().unwrap_or_default();
            // read from the start (nothing was kept when the page was read): the page stated the truncation
            records.retain(|r| r["kind"] != "truncation");
            let next = page["nextCursor"].as_str().filter(|c| !c.is_empty()).map(str::to_string).or(cursor).unwrap_or_default();
            Json(json!({ "lines": lines_of(&records), "cursor": next })).into_response()
        }
        Err(refusal) => (status_of(&refusal), Json(json!({ "error": ErrorView::from(&refusal) }))).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_shown_to_the_millisecond() {
        assert_eq!(shown_ts("2026-12-06T22:40:01.123456789Z"), "2026-12-06 22:40:01.123");
        assert_eq!(shown_ts("2026-12-06T22:40:01Z"), "2026-12-06 22:40:01");
        assert_eq!(shown_ts("2026-12-06T22:40:01.5Z"), "2026-12-06 22:40:01.5");
        assert_eq!(shown_ts("yesterday"), "yesterday");
        assert_eq!(shown_ts("2026-12-06Tä"), "2026-12-06Tä", "never cut inside a character");
    }

    #[test]
    fn every_loss_is_a_warning_in_its_place() {
        let records = [
            json!({ "kind": "truncation", "batches": 2, "bytes": 90, "entries": 7, "reasons": ["byte-cap"] }),
            json!({ "kind": "batch", "captureId": "c", "sequence": 3, "final": false,
                    "entries": [{ "ts": "2026-12-06T10:00:00.1Z", "stream": "stdout", "line": "starting" },
                                { "ts": "2026-12-06T10:00:00.2Z", "stream": "stderr", "line": "warning: x", "cut": 10 }] }),
            json!({ "kind": "gap", "captureId": "c", "batches": 1, "entries": 0 }),
            json!({ "kind": "batch", "captureId": "c", "sequence": 5, "final": true, "entries": [],
                    "lost": { "entries": 3, "reason": "engine-error" } }),
            json!({ "kind": "gap", "captureId": "c", "batches": 2, "entries": 1 }),
        ];
        let lines = lines_of(&records);
        let shown: Vec<(&str, &str)> = lines.iter().map(|l| (l.kind, l.text.as_str())).collect();
        assert_eq!(
            shown,
            [
                ("loss", "7 earlier lines were let go: byte-cap"),
                ("stdout", "starting"),
                ("stderr", "warning: x"),
                ("loss", "1 batch of lines never arrived"),
                ("loss", "3 lines the node could not read (engine-error)"),
                ("notice", "The container stopped: its log ends here"),
                ("loss", "1 line is missing: Capstan no longer holds 2 batches"),
            ]
        );
        assert_eq!(
            (lines[2].cut, lines[2].at.as_str(), lines[2].ts.as_str()),
            (Some(10), "2026-12-06 10:00:00.2", "2026-12-06T10:00:00.2Z")
        );
    }

    #[test]
    fn the_picker_groups_attempts_by_replica_newest_first() {
        let items = [
            json!({ "assignmentId": "asg_3", "slot": "node_a.0", "issuedAt": 3000, "releasedAt": null, "expiresAt": null, "kept": { "entries": 4 } }),
            json!({ "assignmentId": "asg_2", "slot": "node_b.0", "issuedAt": 2000, "releasedAt": null, "expiresAt": null, "kept": { "entries": 1 } }),
            json!({ "assignmentId": "asg_1", "slot": "node_a.0", "issuedAt": 1000, "releasedAt": 2500, "expiresAt": 90_000_000, "kept": { "entries": 9 } }),
        ];
        let replicas = replicas_of(&items, "/services/svc_1/logs", "asg_1");
        let slots: Vec<(&str, &str, bool, usize)> =
            replicas.iter().map(|r| (r.slot.as_str(), r.href.as_str(), r.chosen, r.attempts.len())).collect();
        assert_eq!(
            slots,
            [("node_a.0", "/services/svc_1/logs?attempt=asg_3", true, 2), ("node_b.0", "/services/svc_1/logs?attempt=asg_2", false, 1)]
        );
        let older = &replicas[0].attempts[1];
        assert_eq!((older.id.as_str(), older.chosen, older.current, older.lines_kept), ("asg_1", true, false, 9));
        assert!(older.released.is_some() && older.expires.is_some() && replicas[0].attempts[0].expires.is_none());
    }
}
