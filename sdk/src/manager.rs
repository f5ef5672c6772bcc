//! The [`Manager`] trait a plugin implements, and the adapter that exports it.

use crate::bindings::capstan::plugin::types;
use crate::bindings::exports::capstan::plugin::guest::{self as wit, Guest};
use crate::{Context, Descriptor, Refusal, Result};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::marker::PhantomData;
use std::time::Duration;

/// A manager: implement this for a unit struct and export it with [`crate::manager!`].
///
/// Every function is an associated function (no `self`): state lives in [`crate::store`] and
/// [`crate::blobs`]. The host runs a fresh instance for each call, except that a plugin whose
/// manifest sets `limits.reuse-instances = "reads"` may see one instance serve several
/// read-only calls of the same caller — so memory may or may not survive between those, and a
/// plugin must not depend on either.
pub trait Manager {
    /// Methods with their handlers, collections, subscriptions, schedules, reconcile period and
    /// placement. Must not use the imports (the host refuses them while describing).
    fn describe() -> Descriptor;

    /// Take one event of a subscribed kind. A refusal (or a trap) redelivers it later, and the
    /// events after it wait, so make this idempotent: delivery is at least once.
    fn on_event(ctx: &Context, event: Event) -> Result<()> {
        let _ = (ctx, event);
        Ok(())
    }

    /// One level-triggered pass: read durable state, decide, write only what changes.
    fn reconcile(ctx: &Context, trigger: ReconcileTrigger) -> Result<ReconcileOutcome> {
        let _ = (ctx, trigger);
        Ok(ReconcileOutcome::default())
    }

    /// Run the scheduled task `name`; the string is recorded as the execution's outcome.
    fn run_task(ctx: &Context, name: &str) -> Result<String> {
        let _ = ctx;
        Err(Refusal::new("task-unknown", format!("The plugin has no task {name:?}.")).with_data(serde_json::json!({ "task": name })))
    }

    /// Bring the data from version `from` (`None`: a fresh install) to `to`, before the new
    /// version serves any call. A refusal aborts the upgrade. It must be idempotent: an install
    /// or upgrade interrupted after it ran (a node killed) runs it again when asked again, and
    /// until then the previous version serves the data as migrated, as after a rollback.
    fn migrate(ctx: &Context, from: Option<&str>, to: &str) -> Result<()> {
        let _ = (ctx, from, to);
        Ok(())
    }
}

/// An event delivered to [`Manager::on_event`].
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Position in the outbox; strictly increasing.
    pub sequence: u64,
    /// `<pluginId>.<name>` or a host kind such as `service.deleting`.
    pub kind: String,
    /// The entity the event is about; ordering holds per subject.
    pub subject: String,
    /// The event's JSON data, as published.
    pub data: Value,
    /// Milliseconds since the Unix epoch when the event was published.
    pub at_ms: u64,
}

impl Event {
    /// The data decoded into `T` (refused `invalid-request` naming the field otherwise).
    pub fn data_as<T: DeserializeOwned>(&self) -> Result<T> {
        crate::decode_value(self.data.clone())
    }
}

impl TryFrom<wit::Event> for Event {
    type Error = Refusal;

    fn try_from(e: wit::Event) -> Result<Self> {
        let data = serde_json::from_str(&e.data).map_err(|err| Refusal::invalid_request(format!("event data is not JSON: {err}")))?;
        Ok(Event { sequence: e.sequence, kind: e.kind, subject: e.subject, data, at_ms: e.at_ms })
    }
}

/// Why a reconcile pass runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileTrigger {
    /// True when the period elapsed; false when hints woke it.
    pub periodic: bool,
    /// Subjects hinted since the last pass (deduplicated).
    pub hints: Vec<String>,
}

/// What a reconcile pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileOutcome {
    /// Run again this soon (sooner than the period).
    pub requeue_after: Option<Duration>,
    /// One line for the operator.
    pub summary: String,
}

impl ReconcileOutcome {
    /// A finished pass that found `summary`.
    pub fn done(summary: impl Into<String>) -> Self {
        ReconcileOutcome { requeue_after: None, summary: summary.into() }
    }

    /// Ask for the next pass after `delay` rather than the full period.
    pub fn requeue_after(mut self, delay: Duration) -> Self {
        self.requeue_after = Some(delay);
        self
    }

    /// A pass that answers its summary or the refusal that stopped it, as an outcome: a stopped
    /// pass is still a finished one (the loop goes on) with `code: message` as its summary, and
    /// the next comes after `retry` when the refusal is retryable (a peer that did not answer)
    /// or after `unconfigured` when not (a setting an operator is about to fix) — seconds, not
    /// the full period, either way.
    pub fn of_pass(pass: &crate::Result<String>, retry: Duration, unconfigured: Duration) -> Self {
        match pass {
            Ok(summary) => ReconcileOutcome::done(summary.clone()),
            Err(r) => ReconcileOutcome::done(format!("{}: {}", r.code(), r.message())).requeue_after(if r.is_retryable() {
                retry
            } else {
                unconfigured
            }),
        }
    }
}

/// Implements the generated `Guest` export for any [`Manager`]; [`crate::manager!`] exports
/// `Adapter<YourManager>`.
///
/// A plugin that needs the raw exports for one call (answering bytes the SDK would not
/// produce, say) can implement [`crate::bindings::exports::capstan::plugin::guest::Guest`] on
/// its own type, forward the rest to `Adapter<M>`, and export it with
/// `capstan_sdk::bindings::export!(MyType with_types_in capstan_sdk::bindings)`.
pub struct Adapter<M>(PhantomData<M>);

/// `M`'s descriptor, built once per instance: `describe` must answer the same every time, so an
/// instance the host keeps for another call (`reuse-instances`) routes it without building the
/// descriptor again.
fn described<M: Manager + 'static>() -> &'static Descriptor {
    thread_local! {
        // one entry per manager type (one in a plugin; a native test may run several)
        static BUILT: std::cell::RefCell<Vec<(std::any::TypeId, &'static Descriptor)>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let id = std::any::TypeId::of::<M>();
    if let Some(found) = BUILT.with_borrow(|built| built.iter().find(|(t, _)| *t == id).map(|(_, d)| *d)) {
        return found;
    }
    let descriptor: &'static Descriptor = Box::leak(Box::new(M::describe()));
    BUILT.with_borrow_mut(|built| built.push((id, descriptor)));
    descriptor
}

impl<M: Manager + 'static> Guest for Adapter<M> {
    fn describe() -> wit::Descriptor {
        M::describe().to_wit()
    }

    fn handle(ctx: types::CallContext, method: String, body: String) -> std::result::Result<String, types::Refusal> {
        Ok(described::<M>().handle(&ctx.into(), &method, &body)?)
    }

    fn on_event(ctx: types::CallContext, event: wit::Event) -> std::result::Result<(), types::Refusal> {
        Ok(M::on_event(&ctx.into(), event.try_into()?)?)
    }

    fn reconcile(ctx: types::CallContext, trigger: wit::ReconcileTrigger) -> std::result::Result<wit::ReconcileOutcome, types::Refusal> {
        let trigger = ReconcileTrigger { periodic: trigger.periodic, hints: trigger.hints };
        let outcome = M::reconcile(&ctx.into(), trigger)?;
        Ok(wit::ReconcileOutcome {
            requeue_after_ms: outcome.requeue_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            summary: outcome.summary,
        })
    }

    fn run_task(ctx: types::CallContext, name: String) -> std::result::Result<String, types::Refusal> {
        Ok(M::run_task(&ctx.into(), &name)?)
    }

    fn migrate(ctx: types::CallContext, from: Option<String>, to: String) -> std::result::Result<(), types::Refusal> {
        Ok(M::migrate(&ctx.into(), from.as_deref(), &to)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::Empty;
    use crate::{Role, json};

    struct Minimal;

    impl Manager for Minimal {
        fn describe() -> Descriptor {
            Descriptor::new().method::<Empty, Value>("hello", "Hello.", Role::Public, |ctx, _| Ok(json!({"v": ctx.plugin_version()})))
        }
    }

    fn wit_ctx() -> types::CallContext {
        crate::context::test_context().into()
    }

    #[test]
    fn adapter_forwards_with_defaults() {
        type A = Adapter<Minimal>;
        assert_eq!(A::describe().methods[0].name, "hello");
        assert_eq!(A::handle(wit_ctx(), "hello".into(), "{}".into()).unwrap(), r#"{"v":"1.2.3"}"#);
        let refusal = A::handle(wit_ctx(), "hello".into(), r#"{"x":1}"#.into()).unwrap_err();
        assert_eq!(refusal.code, "invalid-request");
        let event = wit::Event { sequence: 1, kind: "service.deleting".into(), subject: "s1".into(), data: "{}".into(), at_ms: 5 };
        A::on_event(wit_ctx(), event).unwrap();
        let outcome = A::reconcile(wit_ctx(), wit::ReconcileTrigger { periodic: true, hints: vec![] }).unwrap();
        assert_eq!((outcome.requeue_after_ms, outcome.summary.as_str()), (None, ""));
        assert_eq!(A::run_task(wit_ctx(), "tidy".into()).unwrap_err().code, "task-unknown");
        A::migrate(wit_ctx(), None, "0.1.0".into()).unwrap();
    }

    #[test]
    fn events_decode_their_data() {
        #[derive(serde::Deserialize, Debug)]
        struct Deleting {
            #[serde(rename = "serviceId")]
            service_id: String,
        }
        let raw = wit::Event {
            sequence: 9,
            kind: "service.deleting".into(),
            subject: "s1".into(),
            data: r#"{"serviceId":"s1"}"#.into(),
            at_ms: 1,
        };
        let event = Event::try_from(raw).unwrap();
        assert_eq!(event.data_as::<Deleting>().unwrap().service_id, "s1");
        let err = Event { data: json!({"serviceId": 3}), ..event }.data_as::<Deleting>().unwrap_err();
        assert_eq!(err.data(), Some(&json!({"field": "serviceId"})));
        let bad = wit::Event { sequence: 9, kind: "k".into(), subject: "s".into(), data: "nope".into(), at_ms: 1 };
        assert_eq!(Event::try_from(bad).unwrap_err().code(), "invalid-request");
    }

    #[test]
    fn outcomes_requeue() {
        let o = ReconcileOutcome::done("3 notes").requeue_after(Duration::from_secs(5));
        assert_eq!((o.summary.as_str(), o.requeue_after), ("3 notes", Some(Duration::from_secs(5))));
    }
}
