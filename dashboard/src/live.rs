//! Live updates from the event outbox.
//!
//! A page that shows inventory carries one small element (`live.html`) with the outbox's head
//! and the page's areas (`cluster`, `relay`, `service`, `organization`, `settings`, `secret`,
//! `secretSet`, `runtime`). Its script (`static/live.js`) opens a session on `/api/v1/socket`
//! (kind `dashboard`; the upgrade's session cookie is its bearer, see [`crate::pages`]) and waits
//! with `events.watch` calls over it — one at a time, each answered once an event of the
//! page's areas committed after the head it names, or after 25 s with nothing — and on any
//! push whose topic starts with one of the areas. Either fires `capstan-changed`, on which
//! the page's panels re-fetch themselves. A refresh therefore follows a change, never a timer.
//!
//! The long poll `GET /live/wait?after=<sequence>&areas=<a,b>` is the fallback, started by
//! the script only when the socket cannot serve the page (a proxy without WebSocket upgrades,
//! a refused or anonymous session): the same `events.watch` over HTTP. Its answer is the
//! element again, holding the new head and polling from then on, and when something changed it
//! also carries `HX-Trigger: capstan-changed`.
//!
//! Bounded: one poll per page; at most [`MAX_WAITERS`] polls wait at once in this process (more
//! are answered `503` and the element tries again after a few seconds, as after any error).
//! It needs a logged-in session like every page, and shows no event's content.

use super::forms::{call, query_of, session};
use super::render;
use crate::Host;
use crate::Viewer;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use capstan_server::events::methods::Watched;
use minijinja::context;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Semaphore;

/// The most polls waiting at once in this process.
const MAX_WAITERS: usize = 256;
/// The areas a page may watch: the first word of an event's kind.
pub(super) const AREAS: &[&str] = &["cluster", "relay", "service", "organization", "settings", "secret", "secretSet", "runtime"];
/// The event the panels listen for.
pub(super) const CHANGED: &str = "capstan-changed";

static WAITERS: Semaphore = Semaphore::const_new(MAX_WAITERS);

#[derive(Deserialize)]
pub(super) struct WaitQuery {
    after: Option<String>,
    areas: Option<String>,
}

/// The known areas named in `areas` (comma-separated), in a stable order.
fn areas_of(text: &str) -> Vec<&'static str> {
    let asked: Vec<&str> = text.split(',').map(str::trim).collect();
    AREAS.iter().copied().filter(|area| asked.contains(area)).collect()
}

/// Wait through `events.watch` until an event of `areas` committed after `after`.
async fn watch(state: &Host, identity: &Viewer, after: u64, areas: &[&str]) -> crate::refusal::Result<Watched> {
    let answer = call(state, identity, "events.watch", json!({ "after": after, "areas": areas })).await?;
    serde_json::from_value(answer).map_err(crate::refusal::Refusal::internal)
}

/// The live element for a page watching `areas`, waiting from `head`.
pub(super) fn element(head: u64, areas: &[&str]) -> minijinja::Value {
    context! { live => context! { head, areas => areas.join(","), changed => false, polling => false } }
}

/// The outbox's head now, for a page about to read what it shows (read first, so a change
/// committed while the page is read is still announced). `0` when it cannot be read: the
/// first poll then finds whatever is there and the panels refresh once.
pub(super) async fn head(state: &Host, identity: &Viewer) -> u64 {
    match call(state, identity, "events.head", json!({})).await.map(|answer| answer["head"].as_u64()) {
        Ok(Some(head)) => head,
        Ok(None) => 0,
        Err(refusal) => {
            tracing::warn!(code = %refusal.code, "the dashboard could not read the outbox head: {}", refusal.message);
            0
        }
    }
}

/// `GET /live/wait?after=<sequence>&areas=<a,b>`.
pub(super) async fn wait(State(state): State<Host>, headers: HeaderMap, uri: Uri) -> Response {
    let identity = match session(&state, &headers).await {
        Ok(identity) => identity,
        Err(response) => return response,
    };
    let query = query_of(&uri).unwrap_or(WaitQuery { after: None, areas: None });
    let areas = areas_of(query.areas.as_deref().unwrap_or_default());
    let after = query.after.as_deref().and_then(|a| a.trim().parse::<u64>().ok());
    let (Some(after), false) = (after, areas.is_empty()) else {
        return plain(StatusCode::BAD_REQUEST, "name the sequence to wait after and the areas to watch\n");
    };
    let Ok(_permit) = WAITERS.try_acquire() else {
        let mut response = plain(StatusCode::SERVICE_UNAVAILABLE, "too many pages are waiting for changes; this one tries again shortly\n");
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return response;
    };
    match watch(&state, &identity, after, &areas).await {
        Ok(Watched { head, changed }) => {
            // the poll's element keeps polling: the page fell back to it
            let ctx = context! { live => context! { head, areas => areas.join(","), changed, polling => true } };
            let mut response = render(StatusCode::OK, "live.html", ctx);
            if changed {
                response.headers_mut().insert("hx-trigger", HeaderValue::from_static(CHANGED));
            }
            response
        }
        Err(refusal) => {
            tracing::warn!(code = %refusal.code, "a live wait could not read the outbox: {}", refusal.message);
            plain(StatusCode::SERVICE_UNAVAILABLE, "the outbox could not be read; this page tries again shortly\n")
        }
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn areas_are_the_known_ones_only() {
        assert_eq!(areas_of("service, organization,bogus"), ["service", "organization"]);
        assert!(areas_of("").is_empty());
    }
}
