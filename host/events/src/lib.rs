//! The durable event outbox. A change and its event commit in one transaction ([`append`]);
//! consumers (plugins; pages and clients through [`methods`]) read in sequence order from their own
//! cursor and move it only after handling, so delivery is at least once and in commit order.

pub mod methods;

use capstan_core::refusal::{Refusal, Result};
use capstan_store::{CollectionSpec, Store, Tx};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The collection of events, one document per event keyed by its zero-padded sequence.
pub const EVENTS: &str = "events";
/// The collection of consumer cursors, one document per consumer (e.g. `plugin:<id>`).
pub const CURSORS: &str = "event_cursors";
/// One document holding the last sequence handed out; every append advances it (CAS), which
/// orders events exactly as their transactions committed.
const SEQUENCE: &str = "event_sequence";

/// One domain event in the outbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Its place in the outbox: 1 for the first event, one more per append, in commit order.
    pub sequence: u64,
    /// `<area>.<name>`, e.g. `service.deleting`, `example.noteChanged`.
    pub kind: String,
    /// The entity the event is about; order holds per subject.
    pub subject: String,
    /// The event's payload, always a JSON object.
    pub data: Value,
    /// When it was appended, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Who wrote it: `host` or `plugin:<id>`.
    pub source: String,
}

/// Declare the outbox's collections: the events, the consumer cursors and the sequence.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(CollectionSpec::new(EVENTS)).await?;
    store.declare(CollectionSpec::new(CURSORS)).await?;
    store.declare(CollectionSpec::new(SEQUENCE)).await
}

fn event_id(sequence: u64) -> String {
    format!("{sequence:020}")
}

/// Append an event inside the caller's transaction.
pub async fn append(tx: &Tx, kind: &str, subject: &str, data: Value, source: &str) -> Result<u64> {
    if !data.is_object() {
        return Err(Refusal::invalid_request("event data must be a JSON object"));
    }
    let sequence = match tx.get(SEQUENCE, "last").await? {
        Some(doc) => {
            let next = doc.data["value"].as_u64().unwrap_or(0) + 1;
            tx.replace(SEQUENCE, "last", doc.revision, json!({ "value": next })).await?;
            next
        }
        None => {
            tx.insert(SEQUENCE, "last", json!({ "value": 1 })).await?;
            1
        }
    };
    let event =
        Event { sequence, kind: kind.into(), subject: subject.into(), data, at_ms: capstan_core::clock::now_ms(), source: source.into() };
    tx.insert(EVENTS, &event_id(sequence), serde_json::to_value(&event).map_err(Refusal::internal)?).await?;
    Ok(sequence)
}

/// Up to `limit` events after `after`, in order.
pub async fn read_after(store: &Store, after: u64, limit: usize) -> Result<Vec<Event>> {
    let cursor = (after > 0).then(|| event_id(after));
    let page = store
        .transact(|tx| {
            let cursor = cursor.clone();
            async move { tx.scan(EVENTS, cursor.as_deref(), limit).await }
        })
        .await?;
    page.documents.into_iter().map(|d| serde_json::from_value(d.data).map_err(Refusal::internal)).collect()
}

/// The last sequence `consumer` handled (0: none).
pub async fn cursor(store: &Store, consumer: &str) -> Result<u64> {
    let consumer = consumer.to_string();
    let doc = store
        .transact(|tx| {
            let consumer = consumer.clone();
            async move { tx.get(CURSORS, &consumer).await }
        })
        .await?;
    Ok(doc.and_then(|d| d.data["sequence"].as_u64()).unwrap_or(0))
}

/// The newest sequence in the outbox (0: empty).
pub async fn head(store: &Store) -> Result<u64> {
    let doc = store.transact(|tx| async move { tx.get(SEQUENCE, "last").await }).await?;
    Ok(doc.and_then(|d| d.data["value"].as_u64()).unwrap_or(0))
}

/// Record that `consumer` handled everything up to `sequence`. Never moves backwards.
pub async fn advance(store: &Store, consumer: &str, sequence: u64) -> Result<()> {
    let consumer = consumer.to_string();
    store
        .transact(|tx| {
            let consumer = consumer.clone();
            async move {
                match tx.get(CURSORS, &consumer).await? {
                    Some(doc) if doc.data["sequence"].as_u64().unwrap_or(0) >= sequence => Ok(()),
                    Some(doc) => tx.replace(CURSORS, &consumer, doc.revision, json!({ "sequence": sequence })).await.map(drop),
                    None => tx.insert(CURSORS, &consumer, json!({ "sequence": sequence })).await.map(drop),
                }
            }
        })
        .await
}

/// A delivered event stays this long after every consumer passed it: a consumer that just
/// handled it (or the dashboard's live channel reconnecting) can still read it back.
pub const DELIVERED_RETENTION_MS: u64 = 3600 * 1000;
/// An event older than this goes even if a consumer has not handled it: a consumer stuck for a
/// month must not grow the outbox without bound (the trim names it in a warning).
pub const MAX_EVENT_AGE_MS: u64 = 30 * 24 * 3600 * 1000;
/// Events read (and at most deleted) per transaction, so no trim transaction grows large.
pub const TRIM_BATCH: usize = 200;
/// Batches per trim pass; what remains waits for the next pass.
pub const TRIM_MAX_BATCHES: usize = 100;

/// What one [`trim`] pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trimmed {
    /// Events every counted consumer had handled.
    pub delivered: u64,
    /// Events deleted for age although a consumer had not handled them.
    pub expired: u64,
    /// The consumers that had not handled an expired event.
    pub lagging: Vec<String>,
}

/// Delete events from the front of the outbox: those every consumer has handled and that are
/// older than [`DELIVERED_RETENTION_MS`], and any older than [`MAX_EVENT_AGE_MS`]. Only the
/// cursors for which `counts(consumer)` holds are considered (a cursor left behind by an
/// uninstalled plugin must not hold events forever). Stops at the first event that stays.
pub async fn trim(store: &Store, now_ms: u64, counts: impl Fn(&str) -> bool) -> Result<Trimmed> {
    let mut cursors: Vec<(String, u64)> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store
            .transact(|tx| {
                let after = after.clone();
                async move { tx.scan(CURSORS, after.as_deref(), 500).await }
            })
            .await?;
        cursors.extend(page.documents.iter().filter(|d| counts(&d.id)).map(|d| (d.id.clone(), d.data["sequence"].as_u64().unwrap_or(0))));
        match page.next_cursor {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    // with no consumer at all, nothing is waiting for any event
    let floor = cursors.iter().map(|(_, s)| *s).min().unwrap_or(u64::MAX);
    let mut trimmed = Trimmed::default();
    for _ in 0..TRIM_MAX_BATCHES {
        let (delivered, expired, lagging_upto, more) = store
            .transact(|tx| async move {
                let page = tx.scan(EVENTS, None, TRIM_BATCH).await?;
                let (mut delivered, mut expired, mut lagging_upto) = (0u64, 0u64, 0u64);
                for doc in &page.documents {
                    let sequence = doc.data["sequence"].as_u64().or_else(|| doc.id.parse().ok()).unwrap_or(0);
                    let at = doc.data["atMs"].as_u64().unwrap_or(0);
                    if sequence <= floor && at.saturating_add(DELIVERED_RETENTION_MS) <= now_ms {
                        delivered += 1;
                    } else if at.saturating_add(MAX_EVENT_AGE_MS) <= now_ms {
                        expired += 1;
                        lagging_upto = sequence;
                    } else {
                        return Ok((delivered, expired, lagging_upto, false));
                    }
                    tx.delete(EVENTS, &doc.id, doc.revision).await?;
                }
                Ok((delivered, expired, lagging_upto, page.next_cursor.is_some()))
            })
            .await?;
        trimmed.delivered += delivered;
        trimmed.expired += expired;
        for (consumer, sequence) in &cursors {
            if *sequence < lagging_upto && !trimmed.lagging.contains(consumer) {
                trimmed.lagging.push(consumer.clone());
            }
        }
        if !more {
            break;
        }
    }
    if trimmed.expired > 0 {
        tracing::warn!(expired = trimmed.expired, lagging = ?trimmed.lagging,
            "events older than 30 days were deleted before these consumers handled them");
    }
    Ok(trimmed)
}

/// Whether `kind` matches a subscription: exact, or `<prefix>.*`, or `*`.
pub fn matches(subscription: &str, kind: &str) -> bool {
    match subscription.strip_suffix('*') {
        Some("") => true,
        Some(prefix) => prefix.ends_with('.') && kind.starts_with(prefix),
        None => subscription == kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn trimming_keeps_what_a_consumer_still_needs_and_drops_what_is_too_old() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
        declare(&store).await.unwrap();
        for i in 0..6 {
            store.transact(|tx| async move { append(&tx, "test.happened", "s", json!({ "i": i }), "host").await }).await.unwrap();
        }
        let at = read_after(&store, 0, 100).await.unwrap()[5].at_ms;
        advance(&store, "plugin:fast", 6).await.unwrap();
        advance(&store, "plugin:slow", 2).await.unwrap();
        advance(&store, "plugin:gone", 1).await.unwrap();
        let counts = |c: &str| c != "plugin:gone";
        let sequences =
            |store: Store| async move { read_after(&store, 0, 100).await.unwrap().iter().map(|e| e.sequence).collect::<Vec<_>>() };

        // delivered to everyone but younger than the retention: kept
        assert_eq!(trim(&store, at, counts).await.unwrap(), Trimmed::default());
        assert_eq!(sequences(store.clone()).await.len(), 6);

        // an hour later: up to the slowest counted cursor goes (the uninstalled plugin's is ignored)
        let later = at + DELIVERED_RETENTION_MS;
        let t = trim(&store, later, counts).await.unwrap();
        assert_eq!((t.delivered, t.expired), (2, 0));
        assert_eq!(sequences(store.clone()).await, vec![3, 4, 5, 6]);
        assert_eq!(trim(&store, later, counts).await.unwrap(), Trimmed::default(), "a second pass decides nothing");

        // a month later: everything goes, and the lagging consumer is named
        let t = trim(&store, at + MAX_EVENT_AGE_MS, counts).await.unwrap();
        assert_eq!((t.delivered, t.expired, t.lagging), (0, 4, vec!["plugin:slow".to_string()]));
        assert!(sequences(store.clone()).await.is_empty());
        // the sequence goes on where it was
        let next = store.transact(|tx| async move { append(&tx, "test.happened", "s", json!({}), "host").await }).await.unwrap();
        assert_eq!(next, 7);
    }

    #[test]
    fn subscriptions_match_exactly_or_by_prefix() {
        assert!(matches("service.deleting", "service.deleting"));
        assert!(!matches("service.deleting", "service.deleted"));
        assert!(matches("service.*", "service.deleting"));
        assert!(!matches("service.*", "services.x"));
        assert!(matches("*", "anything.at"));
        assert!(!matches("serv*", "service.x"));
    }

    #[tokio::test]
    async fn events_keep_commit_order_and_cursors_never_go_back() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
        declare(&store).await.unwrap();
        for i in 0..5 {
            store
                .transact(|tx| async move { append(&tx, "test.happened", &format!("s{i}"), json!({ "i": i }), "host").await })
                .await
                .unwrap();
        }
        let all = read_after(&store, 0, 100).await.unwrap();
        assert_eq!(all.iter().map(|e| e.sequence).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        assert_eq!(all[2].data["i"], 2);
        let rest = read_after(&store, 3, 100).await.unwrap();
        assert_eq!(rest.iter().map(|e| e.sequence).collect::<Vec<_>>(), vec![4, 5]);
        assert_eq!(head(&store).await.unwrap(), 5);
        advance(&store, "plugin:x", 4).await.unwrap();
        advance(&store, "plugin:x", 2).await.unwrap();
        assert_eq!(cursor(&store, "plugin:x").await.unwrap(), 4);
        assert_eq!(cursor(&store, "plugin:y").await.unwrap(), 0);
        // a failed transaction leaves no event behind
        let failed: Result<()> = store
            .transact(|tx| async move {
                append(&tx, "test.happened", "s", json!({}), "host").await?;
                Err(Refusal::new("conflict", "no"))
            })
            .await;
        assert!(failed.is_err());
        assert_eq!(head(&store).await.unwrap(), 5);
    }
}
