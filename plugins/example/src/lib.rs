//! The example manager: the plugin contract in one small file, and the reference plugin authors
//! copy. It greets, keeps notes in its store with compare-and-swap, publishes an event for every
//! note written, records the events it receives (in order), counts notes in a reconcile loop and
//! a scheduled task, and records its migrations. It also shows how a manager takes part in a
//! service's deletion: it holds every service it hears of and releases it on `service.deleting`,
//! once it would have cleaned up what it owned. Its faces: a setting (`example.welcome`) that
//! `overview` reads, and dashboard pages for the overview and the notes. And it shows the
//! `agents` import: `pingAgent` asks a cluster's relay `agent.ping` (administrators only; it
//! needs the `agents` capability, which this manifest does not request yet, so until it does
//! the call is refused `capability-denied`). Last, a facet: `tagService` keeps a tag on a
//! service as the example's record of it (`facets.example`), which the host judges by the
//! schema declared here and shows on the service.

use capstan_sdk::inventory::EntityKind;
use capstan_sdk::store::{self, Batch, Doc};
use capstan_sdk::{
    Context, Descriptor, Empty, Event, JsonSchema, Manager, Page, ReconcileOutcome, ReconcileTrigger, Refusal, Result, Role,
};
use capstan_sdk::{Value, agents, events, inventory, json, settings};
use serde::{Deserialize, Serialize};
use std::time::Duration;

const NOTES: &str = "notes";
const COUNTERS: &str = "counters";
const EVENTS: &str = "events";
const META: &str = "meta";
/// How many received events `eventLog` keeps (the oldest are dropped first).
const EVENT_LOG_LIMIT: usize = 1000;

struct Example;

impl Manager for Example {
    fn describe() -> Descriptor {
        Descriptor::new()
            .method("greet", "Greet someone by name.", Role::Authenticated, greet)
            .read_only()
            .method("putNote", "Create a note, or replace the one at expectedRevision.", Role::Authenticated, put_note)
            .method("getNote", "One note.", Role::Authenticated, get_note)
            .read_only()
            .method("listNotes", "Notes in id order, a page at a time.", Role::Authenticated, list_notes)
            .read_only()
            .method("countEvents", "How many events the plugin has received.", Role::Authenticated, count_events)
            .read_only()
            .method("eventLog", "The events received, in the order they arrived.", Role::Authenticated, event_log)
            .read_only()
            .method("overview", "The welcome text (setting example.welcome) and how many notes there are.", Role::Authenticated, overview)
            .read_only()
            .method("pingAgent", "Ask the relay of a cluster agent.ping and show its answer.", Role::Admin, ping_agent)
            .method("tagService", "Keep a tag on a service as the example's facet of it; null removes it.", Role::Admin, tag_service)
            .facet::<ServiceTag>(EntityKind::Service, "A tag the example keeps on a service")
            .setting("welcome", "The text the overview opens with", Some(Welcome("Notes kept by the example plugin.".into())))
            .page(Page::new("", "Example", "overview").template("overview").form("putNote"))
            .page(Page::new("notes", "Notes", "listNotes").form("putNote"))
            .collection(NOTES)
            .collection(COUNTERS)
            .collection(EVENTS)
            .collection(META)
            .subscribe("example.noteChanged")
            .subscribe("service.*")
            .schedule("tidy", "0 * * * *", "Count the notes.")
            .reconcile_every(Duration::from_secs(60))
    }

    /// Record the event. Delivery is at least once and in order, so an event at or below the
    /// last recorded sequence is a redelivery: acknowledge it without counting it twice.
    fn on_event(_ctx: &Context, event: Event) -> Result<()> {
        take_part_in_deletion(&event)?;
        let counter = store::get::<EventCounter>(COUNTERS, "events")?;
        let log = store::get::<EventLog>(EVENTS, "log")?;
        if counter.as_ref().is_some_and(|c| event.sequence <= c.data.last_sequence) {
            return Ok(());
        }
        let next_counter = EventCounter { count: counter.as_ref().map_or(0, |c| c.data.count) + 1, last_sequence: event.sequence };
        let mut next_log = log.as_ref().map(|l| l.data.clone()).unwrap_or_default();
        next_log.events.push(Received { sequence: event.sequence, kind: event.kind, subject: event.subject });
        let excess = next_log.events.len().saturating_sub(EVENT_LOG_LIMIT);
        next_log.events.drain(..excess);
        // Both documents move together or not at all; a conflict refuses, and the host
        // redelivers the event.
        Batch::new()
            .put(COUNTERS, "events", counter.map(|c| c.revision), &next_counter)
            .put(EVENTS, "log", log.map(|l| l.revision), &next_log)
            .commit()?;
        Ok(())
    }

    /// Count the notes into `counters/reconcile`. (The example records every pass so tests can
    /// see them; a real reconciler writes only when something changed.)
    fn reconcile(_ctx: &Context, _trigger: ReconcileTrigger) -> Result<ReconcileOutcome> {
        let notes = count_notes()?;
        store::update_with_retry(
            COUNTERS,
            "reconcile",
            |current: Option<ReconcileCounter>| {
                let passes = current.map_or(0, |c| c.passes) + 1;
                Ok(Some(ReconcileCounter { passes, last_notes: notes }))
            },
            5,
        )?;
        Ok(ReconcileOutcome::done(format!("{notes} notes")))
    }

    fn run_task(_ctx: &Context, name: &str) -> Result<String> {
        match name {
            "tidy" => Ok(format!("tidy: {} notes, nothing to tidy", count_notes()?)),
            other => Err(Refusal::new("task-unknown", format!("The example has no task {other:?}."))),
        }
    }

    /// Append `{from, to}` to `meta/migrations`.
    fn migrate(_ctx: &Context, from: Option<&str>, to: &str) -> Result<()> {
        let step = Migration { from: from.map(str::to_string), to: to.to_string() };
        store::update_with_retry(
            META,
            "migrations",
            |current: Option<Migrations>| {
                let mut all = current.unwrap_or_default();
                all.migrations.push(step.clone());
                Ok(Some(all))
            },
            5,
        )?;
        capstan_sdk::info!("migrated from {} to {to}", from.unwrap_or("nothing"));
        Ok(())
    }
}

capstan_sdk::manager!(Example);

// ---- greet ----

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Greet {
    #[schemars(length(min = 1, max = 200))]
    name: String,
}

#[derive(Serialize, JsonSchema)]
struct Greeting {
    greeting: String,
    /// The plugin version that answered.
    version: String,
    /// The caller's user id.
    caller: String,
}

fn greet(ctx: &Context, input: Greet) -> Result<Greeting> {
    Ok(Greeting {
        greeting: format!("Hello, {}!", input.name),
        version: ctx.plugin_version().to_string(),
        caller: ctx.caller().id().to_string(),
    })
}

// ---- overview: a setting read back ----

/// The `welcome` setting: one line of text.
#[derive(Serialize, Deserialize, JsonSchema)]
struct Welcome(#[schemars(length(min = 1, max = 200))] String);

#[derive(Deserialize)]
struct ExampleSettings {
    welcome: Welcome,
}

#[derive(Serialize, JsonSchema)]
struct Overview {
    welcome: String,
    notes: u64,
}

fn overview(_ctx: &Context, _: Empty) -> Result<Overview> {
    let ExampleSettings { welcome: Welcome(welcome) } = settings::get()?;
    Ok(Overview { welcome, notes: count_notes()? })
}

// ---- pingAgent: a request to a cluster's relay ----

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PingAgent {
    #[schemars(length(min = 1, max = 128))]
    cluster_id: String,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct AgentPing {
    cluster_id: String,
    /// The relay's answer as it gave it (`{pong, nodeId, at}`).
    reply: Value,
}

/// `agent.ping` on the cluster's relay. The host's refusals (`relay-not-connected`,
/// `relay-timeout`, `capability-denied`, …) reach the caller as they are.
fn ping_agent(_ctx: &Context, input: PingAgent) -> Result<AgentPing> {
    let reply: Value = agents::call(&input.cluster_id, "agent.ping", &json!({}))?;
    Ok(AgentPing { cluster_id: input.cluster_id, reply })
}

// ---- notes ----

/// A note as stored in `notes/<id>`.
#[derive(Serialize, Deserialize)]
struct Note {
    text: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PutNote {
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9._-]+$"))]
    id: String,
    #[schemars(length(max = 10000))]
    text: String,
    /// The revision that was read; absent: "I read none" (create).
    expected_revision: Option<u64>,
}

#[derive(Serialize, JsonSchema)]
struct Saved {
    id: String,
    revision: u64,
}

fn put_note(_ctx: &Context, input: PutNote) -> Result<Saved> {
    let note = Note { text: input.text };
    let written = Batch::new().put(NOTES, &input.id, input.expected_revision, &note).commit().map_err(|refusal| {
        // `exists` (insert) and `not-found` (replace) are both "not at the revision you read".
        if refusal.is("exists") || refusal.is("not-found") || refusal.is("conflict") {
            Refusal::conflict(format!("The note {:?} is not at the revision the request expected.", input.id))
                .with_data(json!({ "id": input.id, "expectedRevision": input.expected_revision }))
        } else {
            refusal
        }
    })?;
    let revision = written[0].revision;
    // The write is committed; the event tells subscribers (this plugin among them).
    events::publish("example.noteChanged", &input.id, &json!({ "id": input.id, "revision": revision }))?;
    Ok(Saved { id: input.id, revision })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetNote {
    id: String,
}

#[derive(Serialize, JsonSchema)]
struct NoteView {
    id: String,
    revision: u64,
    text: String,
}

impl From<Doc<Note>> for NoteView {
    fn from(d: Doc<Note>) -> Self {
        NoteView { id: d.id, revision: d.revision, text: d.data.text }
    }
}

fn get_note(_ctx: &Context, input: GetNote) -> Result<NoteView> {
    match store::get::<Note>(NOTES, &input.id)? {
        Some(doc) => Ok(doc.into()),
        None => Err(Refusal::not_found("example-note").with_data(json!({ "id": input.id }))),
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListNotes {
    cursor: Option<String>,
    /// Default 50.
    #[schemars(range(min = 1, max = 500))]
    limit: Option<u32>,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct NotePage {
    notes: Vec<NoteView>,
    next_cursor: Option<String>,
}

fn list_notes(_ctx: &Context, input: ListNotes) -> Result<NotePage> {
    let page = store::scan::<Note>(NOTES, input.cursor.as_deref(), input.limit.unwrap_or(50).clamp(1, 500))?;
    Ok(NotePage { notes: page.documents.into_iter().map(NoteView::from).collect(), next_cursor: page.next_cursor })
}

/// Hold a service while this manager "owns" something of it, release it when it is being
/// deleted. Both are idempotent, so a redelivered event does no harm; a service already gone
/// or already deleting is simply not held.
fn take_part_in_deletion(event: &Event) -> Result<()> {
    let outcome = match event.kind.as_str() {
        "service.created" => inventory::hold_service(&event.subject),
        "service.deleting" => inventory::release_service(&event.subject),
        _ => return Ok(()),
    };
    match outcome {
        Err(refusal) if matches!(refusal.code(), "service-deleting" | "service-not-found") => Ok(()),
        other => other,
    }
}

fn count_notes() -> Result<u64> {
    let (mut count, mut cursor) = (0, None);
    loop {
        let page = store::scan::<capstan_sdk::Value>(NOTES, cursor.as_deref(), 500)?;
        count += page.documents.len() as u64;
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(count),
        }
    }
}

// ---- events ----

/// `counters/events`.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct EventCounter {
    count: u64,
    last_sequence: u64,
}

/// `events/log`: the events received, oldest first.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Default)]
struct EventLog {
    events: Vec<Received>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone)]
struct Received {
    sequence: u64,
    kind: String,
    subject: String,
}

fn count_events(_ctx: &Context, _: Empty) -> Result<EventCounter> {
    let counter = store::get::<EventCounter>(COUNTERS, "events")?;
    Ok(counter.map_or(EventCounter { count: 0, last_sequence: 0 }, |c| c.data))
}

fn event_log(_ctx: &Context, _: Empty) -> Result<EventLog> {
    Ok(store::get::<EventLog>(EVENTS, "log")?.map(|l| l.data).unwrap_or_default())
}

// ---- reconcile and migrations ----

/// `counters/reconcile`.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReconcileCounter {
    passes: u64,
    last_notes: u64,
}

/// `meta/migrations`: every migration run, oldest first.
#[derive(Serialize, Deserialize, Default)]
struct Migrations {
    migrations: Vec<Migration>,
}

#[derive(Serialize, Deserialize, Clone)]
struct Migration {
    from: Option<String>,
    to: String,
}

/// The example's facet of a service (`facets.example`).
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ServiceTag {
    /// 1–40 characters.
    #[schemars(length(min = 1, max = 40))]
    tag: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TagService {
    /// The service (`svc_…`).
    service_id: String,
    /// The tag; null removes it. The host refuses one off the facet's schema (`facet-invalid`).
    tag: Option<String>,
}

/// The service as written, its facets included.
fn tag_service(_ctx: &Context, input: TagService) -> Result<Value> {
    let written = match input.tag {
        Some(tag) => inventory::set_facet::<Value>(EntityKind::Service, &input.service_id, &ServiceTag { tag }, None)?,
        None => inventory::clear_facet::<Value>(EntityKind::Service, &input.service_id, None)?,
    };
    Ok(written.data)
}
