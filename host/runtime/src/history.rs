//! What the runtime decided for a service and what its nodes said, in order, in words an
//! operator reads: scheduled on a node, pulling, started, ready, health failing, restarted
//! after a backoff, replaced by a rollout, stopped, removed. Each record is written in the
//! transaction of the change it tells of; a service keeps its newest [`KEPT_PER_SERVICE`].
//! `runtime.getServiceEvents` reads them (`capstan services events`, the Runtime card).

use super::Context;
use super::transition::Case;
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::access::ServiceNeed;
use capstan_inventory::{Entity, parse, services, to_value};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::{CollectionSpec, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// One record per event: id `<serviceId>.<at, 13 digits>.<6 hex>`, so a service's read in time order.
pub const RUNTIME_EVENTS: &str = "runtime_events";
/// Events a service keeps: the newest.
pub const KEPT_PER_SERVICE: usize = 500;

/// The history's collection.
pub fn collection() -> CollectionSpec {
    CollectionSpec::new(RUNTIME_EVENTS).index("by_service", &["serviceId"])
}

/// One thing that happened to a replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeEvent {
    /// The service.
    pub service_id: String,
    /// When (milliseconds, Capstan's clock).
    pub at: u64,
    /// The replica slot.
    pub slot: String,
    /// The node it stands on.
    pub node_id: String,
    /// The attempt.
    pub assignment_id: String,
    /// `scheduled`, `replaced`, `restarted`, `stopping`, `removing`, `released`, `pulling`,
    /// `starting`, `running`, `ready`, `unhealthy`, `exited`, `failed`, `stopped`, `removed`.
    pub kind: String,
    /// What happened, in words.
    pub words: String,
}

impl RuntimeEvent {
    /// An event of a replica now.
    pub fn now(service_id: &str, slot: &str, node_id: &str, assignment_id: &str, kind: &str, words: String) -> RuntimeEvent {
        RuntimeEvent {
            service_id: service_id.into(),
            at: now_ms(),
            slot: slot.into(),
            node_id: node_id.into(),
            assignment_id: assignment_id.into(),
            kind: kind.into(),
            words,
        }
    }
}

/// Record `event` in `tx`.
pub async fn record(tx: &Tx, event: &RuntimeEvent) -> Result<()> {
    let id = format!("{}.{:013}.{}", event.service_id, event.at, hex::encode(rand::random::<[u8; 3]>()));
    tx.insert(RUNTIME_EVENTS, &id, to_value(event)?).await.map(drop)
}

/// A step of the producer in words: (kind, words). `failures` counts the slot's failed
/// attempts, `successor` says a run replaces an attempt that drifted.
pub fn step_words(case: Case, node: &str, failures: u32, successor: bool) -> (&'static str, String) {
    match case {
        Case::AdmitRunFirst => ("scheduled", format!("scheduled on node {node}")),
        Case::AdmitRunSuccessor if successor => ("replaced", "a new attempt replaces the one a rollout or a change left behind".into()),
        Case::AdmitRunSuccessor if failures > 0 => ("restarted", format!("restarted after its backoff (failure {failures})")),
        Case::AdmitRunSuccessor => ("scheduled", format!("scheduled again on node {node}")),
        Case::Drift => ("stopping", "stopping: replaced by a rollout or a change of the spec".into()),
        Case::Undesired => ("stopping", "stopping: no longer asked for (held, scaled down, moved or deleted)".into()),
        Case::FailedElapsed => ("stopping", format!("stopping the failed replica: its backoff passed (failure {failures})")),
        Case::Remove => ("removing", "removing the stopped container".into()),
        Case::Settled => ("released", "the slot is released".into()),
        other => ("changed", other.name().to_string()),
    }
}

/// A node's observation in words: (kind, words).
pub fn observed_words(phase: &str, ready: bool, cause: Option<&str>) -> (String, String) {
    let cause = cause.unwrap_or("the node said no more");
    match (phase, ready) {
        ("pulling", _) => ("pulling".into(), "pulling the image".into()),
        ("starting", _) => ("starting".into(), "starting the container".into()),
        ("running", true) => ("ready".into(), "running and ready".into()),
        ("running", false) => ("running".into(), "running, not ready yet".into()),
        ("unhealthy", _) => ("unhealthy".into(), cause.to_string()),
        (phase, _) => (phase.into(), format!("{phase}: {cause}")),
    }
}

/// Input of `runtime.getServiceEvents`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EventsInput {
    /// The service.
    pub service_id: String,
    /// The `nextCursor` of an earlier answer: only what came after it. Without it, the newest.
    #[serde(default)]
    pub after: Option<String>,
    /// 1–500 (default 100).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// One event as read.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    /// Its id (a cursor).
    pub id: String,
    /// The event.
    #[serde(flatten)]
    pub event: RuntimeEvent,
}

/// Answer of `runtime.getServiceEvents`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Events {
    /// Oldest first.
    pub items: Vec<EventView>,
    /// Pass back as `after` for what comes next (the last item's id, or the `after` given).
    pub next_cursor: Option<String>,
}

async fn events(cx: Context, call: Call, input: EventsInput) -> Result<Events> {
    let limit = input.limit.unwrap_or(100);
    if !(1..=KEPT_PER_SERVICE).contains(&limit) {
        return Err(Refusal::new("limit-invalid", "limit is 1–500").with_data(json!({ "field": "limit" })));
    }
    let identity = call.identity()?.clone();
    cx.store
        .transact(|tx| {
            let (identity, input) = (identity.clone(), &input);
            async move {
                let service = services::visible_service(&tx, &identity, &input.service_id, ServiceNeed::Read).await?;
                if let Some(after) = &input.after
                    && !after.starts_with(&format!("{}.", service.id))
                {
                    return Err(
                        Refusal::new("cursor-invalid", "the cursor is not one this read handed out").with_data(json!({ "field": "after" }))
                    );
                }
                let items: Vec<EventView> = match &input.after {
                    Some(after) => {
                        let page = tx.find(RUNTIME_EVENTS, "by_service", &[json!(service.id)], Some(after), limit).await?;
                        page.documents.iter().map(view).collect::<Result<_>>()?
                    }
                    None => {
                        let all = tx.find_all(RUNTIME_EVENTS, "by_service", &[json!(service.id)]).await?;
                        let skip = all.len().saturating_sub(limit);
                        all[skip..].iter().map(view).collect::<Result<_>>()?
                    }
                };
                let next_cursor = items.last().map(|e| e.id.clone()).or(input.after.clone());
                Ok(Events { items, next_cursor })
            }
        })
        .await
}

fn view(doc: &capstan_store::Document) -> Result<EventView> {
    let event: Entity<RuntimeEvent> = parse(doc)?;
    Ok(EventView { id: event.id, event: event.data })
}

/// Keep each service's newest [`KEPT_PER_SERVICE`] events; answers how many went.
pub async fn prune(cx: &Context) -> Result<usize> {
    let mut services: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = cx.store.transact(|tx| {
            let cursor = cursor.clone();
            async move { tx.scan(capstan_inventory::SERVICES, cursor.as_deref(), capstan_store::MAX_PAGE).await }
        });
        let page = page.await?;
        services.extend(page.documents.iter().map(|d| d.id.clone()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut pruned = 0;
    for service in services {
        let service = service.as_str();
        pruned += cx
            .store
            .transact(|tx| async move {
                let all = tx.find_all(RUNTIME_EVENTS, "by_service", &[json!(service)]).await?;
                let over = all.len().saturating_sub(KEPT_PER_SERVICE);
                for doc in &all[..over] {
                    tx.delete(RUNTIME_EVENTS, &doc.id, doc.revision).await?;
                }
                Ok(over)
            })
            .await?;
    }
    Ok(pruned)
}

/// Register `runtime.getServiceEvents`.
pub fn register(registry: &mut Registry, cx: Context) {
    registry
        .with(cx)
        .add(
            "runtime.getServiceEvents",
            "What the runtime decided for a service and what its nodes said, in order and in words (member)",
            Access::Member,
            events,
        )
        .refuses(&["service-not-found", "cursor-invalid", "limit-invalid"])
        .read_only();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_observations_read_as_an_operator_says_them() {
        assert_eq!(step_words(Case::AdmitRunFirst, "edge-1", 0, false), ("scheduled", "scheduled on node edge-1".into()));
        assert_eq!(step_words(Case::AdmitRunSuccessor, "edge-1", 2, false).1, "restarted after its backoff (failure 2)");
        assert_eq!(step_words(Case::AdmitRunSuccessor, "edge-1", 0, true).0, "replaced");
        assert_eq!(step_words(Case::FailedElapsed, "edge-1", 1, false).1, "stopping the failed replica: its backoff passed (failure 1)");
        assert_eq!(observed_words("running", true, None), ("ready".into(), "running and ready".into()));
        assert_eq!(observed_words("exited", false, Some("exited with status 1")).1, "exited: exited with status 1");
        assert_eq!(observed_words("unhealthy", false, Some("health check failing: refused")).1, "health check failing: refused");
    }
}
