//! Live updates from the event outbox: `GET /live/wait?after=<sequence>&areas=<a,b>`.
//!
//! A page that shows inventory carries one small element (`live.html`) that htmx loads as
//! soon as it is on the page: a long poll that reads the outbox's head every
//! [`POLL_EVERY`] and answers once an event in one of the page's areas (`cluster`,
//! `service`, `organization`, `settings`, `secret`, `secretSet`) committed after `after`, or after [`WAIT_AT_MOST`]
//! with nothing. The answer is the element again, holding the new head, so htmx swaps it in
//! and the next poll starts from there; when something changed it also carries
//! `HX-Trigger: capstan-changed`, on which the page's panels re-fetch themselves. A refresh
//! therefore follows a change, never a timer.
//!
//! Bounded: one poll per page; each reads at most [`SCAN`] events per look (a larger gap
//! is simply "changed"); at most [`MAX_WAITERS`] polls wait at once in this process (more
//! are answered `503` and the element tries again after a few seconds, as after any error).
//! It needs a logged-in session like every page, and shows no event's content.

use super::forms::{query_of, session};
use super::render;
use crate::api::AppState;
use crate::events;
use crate::refusal::Result;
use crate::store::Store;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use minijinja::context;
use serde::Deserialize;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// How often a waiting poll looks at the outbox's head.
pub(super) const POLL_EVERY: Duration = Duration::from_millis(500);
/// The longest a poll waits before answering "nothing changed".
pub(super) const WAIT_AT_MOST: Duration = Duration::from_secs(25);
/// The most events one look reads.
const SCAN: usize = 200;
/// The most polls waiting at once in this process.
const MAX_WAITERS: usize = 256;
/// The areas a page may watch: the first word of an event's kind.
pub(super) const AREAS: &[&str] = &["cluster", "service", "organization", "settings", "secret", "secretSet"];
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

fn in_areas(kind: &str, areas: &[&str]) -> bool {
    kind.split('.').next().is_some_and(|area| areas.contains(&area))
}

/// Wait (up to `wait`) until an event of `areas` committed after `after`. Answers the head
/// to wait from next and whether something in the areas changed.
pub(super) async fn watch(store: &Store, after: u64, areas: &[&str], wait: Duration) -> Result<(u64, bool)> {
    let deadline = Instant::now() + wait;
    let mut after = after;
    loop {
        let head = events::head(store).await?;
        if head < after {
            // the outbox is behind what the page saw (a restored database): show what is there
            return Ok((head, true));
        }
        if head > after {
            if head - after > SCAN as u64 {
                return Ok((head, true));
            }
            let seen = events::read_after(store, after, SCAN).await?;
            let newest = seen.last().map_or(head, |e| e.sequence.max(head));
            if seen.iter().any(|e| in_areas(&e.kind, areas)) {
                return Ok((newest, true));
            }
            after = newest;
        }
        if Instant::now() + POLL_EVERY > deadline {
            return Ok((after, false));
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// The live element for a page watching `areas`, waiting from `head`.
pub(super) fn element(head: u64, areas: &[&str]) -> minijinja::Value {
    context! { live => context! { head, areas => areas.join(","), changed => false } }
}

/// The outbox's head now, for a page about to read what it shows (read first, so a change
/// committed while the page is read is still announced). `0` when it cannot be read: the
/// first poll then finds whatever is there and the panels refresh once.
pub(super) async fn head(store: &Store) -> u64 {
    match events::head(store).await {
        Ok(head) => head,
        Err(refusal) => {
            tracing::warn!(code = %refusal.code, "the dashboard could not read the outbox head: {}", refusal.message);
            0
        }
    }
}

/// `GET /live/wait?after=<sequence>&areas=<a,b>`.
pub(super) async fn wait(State(state): State<AppState>, headers: HeaderMap, uri: Uri) -> Response {
    if let Err(response) = session(&state, &headers).await {
        return response;
    }
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
    match watch(&state.store, after, &areas, WAIT_AT_MOST).await {
        Ok((head, changed)) => {
            let ctx = context! { live => context! { head, areas => areas.join(","), changed } };
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
        assert!(in_areas("service.deleting", &["service"]));
        assert!(!in_areas("services.x", &["service"]) && !in_areas("cluster.created", &["service"]));
    }
}
