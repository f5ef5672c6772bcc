//! A service's runtime events (docs/runtime.md, "Events"): what the runtime decided for each
//! replica slot and what its node said of it, in words — scheduled, pulling, ready, health
//! failing, exited, stopping the failed replica, restarted after its backoff, released.
//!
//! The Runtime card ([`super::runtime`]) shows each slot's **history** folded under its row:
//! newest first, the last [`SHOWN_PER_SLOT`], "and N earlier" past them. The **Events** page at
//! `/services/{id}/events` lists every event the service keeps, newest first, or one replica's
//! (`?slot=<nodeId>.<index>`), with the node by name where the person may list nodes.
//! Failures (exited, failed, unhealthy) show as errors, restarts, replacements and stops as
//! warnings, readiness as success, everything else plainly.
//!
//! Each render reads `runtime.getServiceEvents` once, as the signed-in person, with the largest
//! limit (everything a service keeps), so a refusal is theirs and shows as a banner. The card
//! and the page's panel re-fetch themselves on `capstan-changed`: every event is written in the
//! transaction of a `runtime.*` outbox event, which the pages watch.

use super::forms::{ErrorView, Signed, call, encode, query_of, status_of, str_of, u64_of};
use super::{live, nav, render, rfc3339, user_view};
use crate::Host;
use crate::Viewer;
use crate::refusal::Result;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Events read per render: everything a service keeps (the method's largest limit).
const READ: usize = 500;
/// The most events a slot's history shows on the Runtime card.
pub(super) const SHOWN_PER_SLOT: usize = 10;
/// The longest words the card's history shows (the page shows them whole).
const WORDS_SHOWN: usize = 300;

// ---------------------------------------------------------------------------------------
// Events

/// One event as the card and the page show it.
#[derive(Debug, Serialize, Clone, PartialEq)]
pub(super) struct EventRow {
    id: String,
    slot: String,
    /// The slot's index on its node.
    index: String,
    node_id: String,
    /// The node's name, else its id (set by the page).
    node: String,
    /// The node's page (administrators).
    node_href: Option<String>,
    assignment_id: String,
    kind: String,
    /// `error`, `warning`, `ok` or `info`.
    level: &'static str,
    /// The pill class of the kind.
    class: &'static str,
    /// In the node's and the runtime's words, as stored.
    words: String,
    /// `2026-12-06 22:40:01 UTC`.
    at: String,
    /// RFC 3339.
    at_iso: String,
    /// `4 min ago`.
    ago: String,
}

/// How a kind is shown: a failure as an error, a restart, replacement or stop as a warning,
/// readiness as success, the rest plainly.
fn level_of(kind: &str) -> (&'static str, &'static str) {
    match kind {
        "exited" | "failed" | "unhealthy" => ("error", "pill-error"),
        "restarted" | "replaced" | "stopping" => ("warning", "pill-warn"),
        "ready" => ("ok", "pill-ok"),
        _ => ("info", ""),
    }
}

/// `2026-12-06 22:40:01 UTC` and its RFC 3339 form, from milliseconds since the epoch.
fn stamp(ms: u64) -> (String, String) {
    let iso = rfc3339(ms);
    let shown = match (iso.get(..10), iso.get(11..19)) {
        (Some(date), Some(time)) => format!("{date} {time} UTC"),
        _ => iso.clone(),
    };
    (shown, iso)
}

/// The rows of `runtime.getServiceEvents` items, in their order (oldest first).
fn rows_of(items: &[Value], now_ms: u64) -> Vec<EventRow> {
    items
        .iter()
        .map(|item| {
            let kind = str_of(item, "kind").to_string();
            let (level, class) = level_of(&kind);
            let at_ms = u64_of(item, "at");
            let (at, at_iso) = stamp(at_ms);
            let node_id = str_of(item, "nodeId").to_string();
            let slot = str_of(item, "slot");
            EventRow {
                id: str_of(item, "id").to_string(),
                index: slot.rsplit_once('.').map_or(slot, |(_, index)| index).to_string(),
                slot: slot.to_string(),
                node: node_id.clone(),
                node_href: None,
                node_id,
                assignment_id: str_of(item, "assignmentId").to_string(),
                kind,
                level,
                class,
                words: str_of(item, "words").to_string(),
                at,
                at_iso,
                ago: super::fleet::ago(now_ms.saturating_sub(at_ms)),
            }
        })
        .collect()
}

/// Every event the service keeps, oldest first.
pub(super) async fn read(state: &Host, identity: &Viewer, service_id: &str) -> Result<Vec<EventRow>> {
    let answer = call(state, identity, "runtime.getServiceEvents", json!({ "serviceId": service_id, "limit": READ })).await?;
    let items = answer["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(rows_of(items, capstan_core::clock::now_ms()))
}

// ---------------------------------------------------------------------------------------
// A slot's history on the Runtime card

/// One replica slot's history: its newest events, newest first.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct History {
    events: Vec<EventRow>,
    /// Events of the slot the card leaves to the Events page.
    earlier: usize,
    total: usize,
    /// The Events page, this slot's.
    href: String,
}

fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let shown: String = flat.chars().take(max).collect();
    if shown.len() < flat.len() { format!("{shown}…") } else { shown }
}

/// The histories of `rows` (oldest first) by slot: newest first, at most [`SHOWN_PER_SLOT`]
/// each, their words on one line.
pub(super) fn by_slot(rows: Vec<EventRow>, events_href: &str) -> BTreeMap<String, History> {
    let mut grouped: BTreeMap<String, Vec<EventRow>> = BTreeMap::new();
    for row in rows {
        grouped.entry(row.slot.clone()).or_default().push(row);
    }
    grouped
        .into_iter()
        .map(|(slot, rows)| {
            let total = rows.len();
            let events: Vec<EventRow> = rows
                .into_iter()
                .rev()
                .take(SHOWN_PER_SLOT)
                .map(|mut row| {
                    row.words = one_line(&row.words, WORDS_SHOWN);
                    row
                })
                .collect();
            let history = History { earlier: total - events.len(), total, href: format!("{events_href}?slot={}", encode(&slot)), events };
            (slot, history)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The Events page

/// A replica in the page's picker.
#[derive(Debug, Serialize)]
struct ReplicaTab {
    slot: String,
    /// `<node name>.<index>` where the node's name is known.
    label: String,
    href: String,
    count: usize,
    chosen: bool,
}

#[derive(Deserialize, Default)]
pub(super) struct EventsQuery {
    slot: Option<String>,
}

fn asked_slot(uri: &Uri) -> Option<String> {
    query_of::<EventsQuery>(uri).unwrap_or_default().slot.map(|s| s.trim().chars().take(200).collect()).filter(|s: &String| !s.is_empty())
}

/// The page's panel: the replica picker and the events, newest first (`slot`: one replica's);
/// `Err` with the refusal when they cannot be read.
async fn panel_context(
    state: &Host,
    identity: &Viewer,
    service_id: &str,
    slot: Option<&str>,
) -> std::result::Result<minijinja::Value, (crate::refusal::Refusal, minijinja::Value)> {
    let service_href = format!("/services/{}", encode(service_id));
    let base = format!("{service_href}/events");
    let panel_href = match slot {
        Some(slot) => format!("{base}/panel?slot={}", encode(slot)),
        None => format!("{base}/panel"),
    };
    let rows = match read(state, identity, service_id).await {
        Ok(rows) => rows,
        Err(refusal) => {
            let ctx = context! { events_error => Serde(Some(ErrorView::from(&refusal))), events_panel_href => panel_href, events_href => base, events_service_href => service_href };
            return Err((refusal, ctx));
        }
    };
    let nodes = super::runtime::node_names_for(state, identity).await;
    let mut counts: BTreeMap<&str, (usize, String)> = BTreeMap::new();
    for row in &rows {
        let label = match nodes.get(&row.node_id) {
            Some(name) => format!("{name}.{}", row.index),
            None => row.slot.clone(),
        };
        counts.entry(row.slot.as_str()).or_insert((0, label)).0 += 1;
    }
    let replicas: Vec<ReplicaTab> = counts
        .into_iter()
        .map(|(s, (count, label))| ReplicaTab {
            slot: s.to_string(),
            label,
            href: format!("{base}?slot={}", encode(s)),
            count,
            chosen: slot == Some(s),
        })
        .collect();
    let total = rows.len();
    let events: Vec<EventRow> = rows
        .into_iter()
        .rev()
        .filter(|row| slot.is_none_or(|s| row.slot == s))
        .map(|mut row| {
            if let Some(name) = nodes.get(&row.node_id) {
                row.node = name.clone();
            }
            row.node_href = identity.admin.then(|| format!("/nodes/{}", encode(&row.node_id)));
            row
        })
        .collect();
    Ok(context! {
        events => Serde(events),
        events_total => total,
        events_replicas => Serde(replicas),
        events_slot => slot,
        events_error => Serde(None::<ErrorView>),
        events_panel_href => panel_href,
        events_href => base,
        events_service_href => service_href,
    })
}

/// `GET /services/{id}/events?slot=<nodeId>.<index>`: the service's events, newest first, or
/// one replica's.
pub(super) async fn page(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let slot = asked_slot(&uri);
    let head = live::head(&state, &identity).await;
    let common = |status: StatusCode, name: Option<&str>, ctx: minijinja::Value| {
        let page = name.map(|n| format!("Events of {n}")).unwrap_or_else(|| "Events".into());
        let ctx = context! { page, nav => Serde(nav(&state, "services")), user => Serde(user_view(&identity)), ..ctx };
        render(status, "service_events.html", ctx)
    };
    let service = match super::logs::service_head(&state, &identity, &id, "services").await {
        Ok(service) => service,
        Err(refusal) => return common(status_of(&refusal), None, context! { service_error => Serde(Some(ErrorView::from(&refusal))) }),
    };
    let watch = live::element(head, &[super::runtime::AREA]);
    let (status, panel) = match panel_context(&state, &identity, &id, slot.as_deref()).await {
        Ok(panel) => (StatusCode::OK, panel),
        Err((refusal, panel)) => (status_of(&refusal), panel),
    };
    common(status, Some(&service.name), context! { service => Serde(&service), ..context! { ..watch, ..panel } })
}

/// `GET /services/{id}/events/panel?slot=…`: the page's panel alone, for htmx (a refusal is its
/// banner, answered `200` so htmx swaps it in).
pub(super) async fn panel(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let slot = asked_slot(&uri);
    let ctx = match panel_context(&state, &identity, &id, slot.as_deref()).await {
        Ok(ctx) | Err((_, ctx)) => ctx,
    };
    render(StatusCode::OK, "service_events_panel.html", ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, at: u64, slot: &str, kind: &str, words: &str) -> Value {
        json!({ "id": id, "serviceId": "svc_1", "at": at, "slot": slot, "nodeId": "node_a", "assignmentId": "asg_1", "kind": kind, "words": words })
    }

    #[test]
    fn kinds_read_as_errors_warnings_and_success() {
        let levels: Vec<&str> = ["exited", "failed", "unhealthy", "restarted", "replaced", "stopping", "ready", "scheduled", "released"]
            .iter()
            .map(|k| level_of(k).0)
            .collect();
        assert_eq!(levels, ["error", "error", "error", "warning", "warning", "warning", "ok", "info", "info"]);
        assert_eq!(level_of("exited").1, "pill-error");
    }

    #[test]
    fn events_are_stamped_to_the_second_in_utc() {
        let rows = rows_of(&[item("e1", 1_796_683_201_250, "node_a.0", "ready", "running and ready")], 1_796_683_291_250);
        assert_eq!((rows[0].at.as_str(), rows[0].at_iso.as_str()), ("2026-12-07 22:40:01 UTC", "2026-12-07T22:40:01Z"));
        assert_eq!(rows[0].ago, "90 s ago");
        assert_eq!((rows[0].level, rows[0].class), ("ok", "pill-ok"));
    }

    #[test]
    fn a_slots_history_is_its_newest_events_first_and_counts_the_earlier_ones() {
        let mut items = vec![item("b1", 5, "node_b.0", "scheduled", "scheduled on node b")];
        for n in 0..12u64 {
            items.push(item(&format!("a{n}"), 10 + n, "node_a.0", "exited", &format!("exited:\n  status {n}")));
        }
        let histories = by_slot(rows_of(&items, 100), "/services/svc_1/events");
        let a = &histories["node_a.0"];
        assert_eq!((a.total, a.earlier, a.events.len()), (12, 2, SHOWN_PER_SLOT));
        assert_eq!((a.events[0].id.as_str(), a.events[9].id.as_str()), ("a11", "a2"), "newest first");
        assert_eq!(a.events[0].words, "exited: status 11", "on one line");
        assert_eq!(a.href, "/services/svc_1/events?slot=node_a.0");
        let b = &histories["node_b.0"];
        assert_eq!((b.total, b.earlier, b.events[0].kind.as_str()), (1, 0, "scheduled"));
    }
}
