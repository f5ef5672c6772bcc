//! `events.head` and `events.watch`: whether something changed in the outbox, never what — for
//! a page or a client that refreshes what it shows when that changes (the dashboard's live
//! updates). An area is the first word of an event's kind (`service` for `service.deleting`).

use crate::{head, read_after};
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::Store;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::time::Instant;

/// How often a waiting watch looks at the outbox's head.
pub const POLL_EVERY: Duration = Duration::from_millis(500);
/// The longest a watch waits before answering "nothing changed".
pub const WAIT_AT_MOST: Duration = Duration::from_secs(25);
/// The most events one look reads (a larger gap is simply "changed").
const SCAN: usize = 200;
/// The most areas one watch names.
const MAX_AREAS: usize = 16;

/// The body of `events.head`: nothing.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// The body of `events.watch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WatchInput {
    /// The sequence the caller has seen (the `head` of an earlier answer).
    pub after: u64,
    /// The areas to watch (1 to 16), e.g. `["service", "organization"]`.
    pub areas: Vec<String>,
    /// How long to wait at most, in milliseconds (default and most: 25 000).
    pub wait_ms: Option<u64>,
}

/// Where the outbox is, and whether an event of the watched areas came after `after`.
#[derive(Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Watched {
    /// The sequence to watch from next.
    pub head: u64,
    /// Whether an event of the areas committed after `after` (or the outbox moved back).
    pub changed: bool,
}

/// Whether `kind` is of one of `areas`.
pub fn in_areas(kind: &str, areas: &[&str]) -> bool {
    kind.split('.').next().is_some_and(|area| areas.contains(&area))
}

/// Wait (up to `wait`) until an event of `areas` committed after `after`.
pub async fn watch(store: &Store, after: u64, areas: &[&str], wait: Duration) -> Result<Watched> {
    let deadline = Instant::now() + wait;
    let mut after = after;
    loop {
        let head = head(store).await?;
        if head < after {
            // the outbox is behind what the caller saw (a restored database): show what is there
            return Ok(Watched { head, changed: true });
        }
        if head > after {
            if head - after > SCAN as u64 {
                return Ok(Watched { head, changed: true });
            }
            let seen = read_after(store, after, SCAN).await?;
            let newest = seen.last().map_or(head, |e| e.sequence.max(head));
            if seen.iter().any(|e| in_areas(&e.kind, areas)) {
                return Ok(Watched { head: newest, changed: true });
            }
            after = newest;
        }
        if Instant::now() + POLL_EVERY > deadline {
            return Ok(Watched { head: after, changed: false });
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Add `events.head` and `events.watch` (any signed-in caller: they show no event's content).
pub fn register(registry: &mut Registry, store: Store) {
    let mut registry = registry.with(store);
    registry
        .add("events.head", "The outbox's newest sequence", Access::Authenticated, |store: Store, _: Call, _: Empty| async move {
            Ok(serde_json::json!({ "head": head(&store).await? }))
        })
        .read_only();
    registry
        .add(
            "events.watch",
            "Wait (up to 25 s) until an event of the named areas follows a sequence; answers the new head and whether one did",
            Access::Authenticated,
            |store: Store, _: Call, input: WatchInput| async move {
                let valid = |a: &String| (1..=32).contains(&a.len()) && a.chars().all(|c| c.is_ascii_alphanumeric());
                if input.areas.is_empty() || input.areas.len() > MAX_AREAS || !input.areas.iter().all(valid) {
                    return Err(Refusal::invalid_request(format!("name 1 to {MAX_AREAS} areas, each letters and digits (e.g. service)"))
                        .with_data(serde_json::json!({ "field": "areas" })));
                }
                let wait = Duration::from_millis(input.wait_ms.unwrap_or(u64::MAX)).min(WAIT_AT_MOST);
                let areas: Vec<&str> = input.areas.iter().map(String::as_str).collect();
                watch(&store, input.after, &areas, wait).await
            },
        )
        .read_only();
}

#[cfg(test)]
mod tests {
    use super::in_areas;

    #[test]
    fn an_area_is_the_first_word_of_a_kind() {
        assert!(in_areas("service.deleting", &["service"]));
        assert!(!in_areas("services.x", &["service"]) && !in_areas("cluster.created", &["service"]));
    }
}
