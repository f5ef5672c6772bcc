//! Plugin background work on this node: keep the loaded versions in step with the registry,
//! deliver events from the outbox, run reconcile passes, sweep expired bundle uploads. Events
//! and reconcile run only where the coordinator placed the plugin's workload, one round at a
//! time per plugin. Scheduled tasks are the scheduler's (`crate::scheduler`), with the same
//! placement.

use super::host::{Active, PluginHost};
use super::runtime::wit_guest;
use crate::fleet::runtime::Fleet;
use crate::refusal::Result;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the registry is re-read (another node may have upgraded a plugin).
const SYNC_EVERY: Duration = Duration::from_secs(5);
/// How often each plugin's round is considered.
const ROUND_EVERY: Duration = Duration::from_millis(250);
/// A hinted reconcile waits this long after the last hint.
const QUIET: Duration = Duration::from_secs(1);
/// A failed reconcile pass is tried again after this, doubling with each failure in a row up
/// to the plugin's period.
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// How often abandoned bundle uploads (they are also swept at every upload) and expired
/// transfer tickets are swept.
const SWEEP_UPLOADS_EVERY: Duration = Duration::from_secs(10 * 60);
/// Events handed to a plugin per round.
const EVENT_BATCH: usize = 100;

#[derive(Default)]
struct PluginState {
    busy: Arc<AtomicBool>,
    shared: Arc<Mutex<Shared>>,
}

#[derive(Default)]
struct Shared {
    hints: BTreeSet<String>,
    last_hint: Option<Instant>,
    last_pass: Option<Instant>,
    requeue_at: Option<Instant>,
    /// After a failed delivery, wait until then.
    events_backoff_until: Option<Instant>,
    events_failures: u32,
    /// Reconcile passes failed in a row (a trap, the deadline, a refusal).
    pass_failures: u32,
}

/// Start this node's plugin background work (registry sync, event delivery, reconcile passes)
/// until `stop` turns true; with a fleet, only plugins whose workload is placed here get rounds.
pub fn spawn(host: Arc<PluginHost>, fleet: Option<Arc<Fleet>>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut states: HashMap<String, PluginState> = HashMap::new();
        let mut last_sync = Instant::now();
        let mut last_sweep = Instant::now();
        let mut ticker = tokio::time::interval(ROUND_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
            if last_sync.elapsed() >= SYNC_EVERY {
                last_sync = Instant::now();
                if let Err(e) = host.sync().await {
                    tracing::warn!(code = %e.code, "plugin registry not read: {}", e.message);
                }
            }
            if last_sweep.elapsed() >= SWEEP_UPLOADS_EVERY {
                last_sweep = Instant::now();
                let (blobs, store) = (host.services.blobs.clone(), host.services.store.clone());
                tokio::spawn(async move {
                    super::uploads::sweep(&blobs, std::time::SystemTime::now()).await;
                    super::transfers::sweep(&store, super::transfers::now_ms()).await;
                });
            }
            let loaded = host.loaded();
            states.retain(|id, _| loaded.iter().any(|a| &a.manifest.id == id));
            for active in loaded {
                let workload = active.described.placement.id.clone();
                if let Some(fleet) = &fleet
                    && !fleet.assigned_here(&workload).await
                {
                    continue;
                }
                let state = states.entry(active.manifest.id.clone()).or_default();
                if state.busy.swap(true, Ordering::AcqRel) {
                    continue; // one round at a time per plugin
                }
                let (busy, shared, host) = (Busy(state.busy.clone()), state.shared.clone(), host.clone());
                tokio::spawn(async move {
                    let _busy = busy; // cleared when the round ends, also by a panic
                    round(&host, &active, &shared).await;
                });
            }
        }
    })
}

/// A plugin's "round running" flag, cleared when dropped: a round that panics (its task is
/// unwound) does not leave its plugin marked busy for good.
struct Busy(Arc<AtomicBool>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// One round for one plugin: events, then reconcile if due.
async fn round(host: &PluginHost, active: &Arc<Active>, shared: &Mutex<Shared>) {
    deliver_events(host, active, shared).await;
    reconcile_if_due(active, shared).await;
}

async fn deliver_events(host: &PluginHost, active: &Active, shared: &Mutex<Shared>) {
    if active.described.subscriptions.is_empty() {
        return;
    }
    if shared.lock().expect("plugin work").events_backoff_until.is_some_and(|t| Instant::now() < t) {
        return;
    }
    let result = deliver_batch(host, active, |subject| {
        let mut s = shared.lock().expect("plugin work");
        s.hints.insert(subject.to_string());
        s.last_hint = Some(Instant::now());
    })
    .await;
    let mut s = shared.lock().expect("plugin work");
    match result {
        Ok(_) => s.events_failures = 0,
        Err(e) => {
            s.events_failures += 1;
            let backoff = Duration::from_millis((500u64 << s.events_failures.min(7)).min(60_000));
            s.events_backoff_until = Some(Instant::now() + backoff);
            tracing::warn!(plugin = %active.manifest.id, code = %e.code, retry_in_ms = backoff.as_millis() as u64,
                "event delivery failed: {}", e.message);
        }
    }
}

/// Deliver everything pending for `active` now; how many events it took (for tests).
pub async fn deliver_pending(host: &PluginHost, active: &Active) -> Result<usize> {
    let mut total = 0;
    loop {
        let before = crate::events::cursor(&host.services.store, &format!("plugin:{}", active.manifest.id)).await?;
        total += deliver_batch(host, active, |_| {}).await?;
        let after = crate::events::cursor(&host.services.store, &format!("plugin:{}", active.manifest.id)).await?;
        if after == before {
            return Ok(total);
        }
    }
}

/// Hand the next batch of outbox events to the plugin, in order, moving its cursor past
/// each one handled (and past events it does not subscribe to). Stops at the first refusal:
/// that event is delivered again later and the ones after it wait.
async fn deliver_batch(host: &PluginHost, active: &Active, mut delivered: impl FnMut(&str)) -> Result<usize> {
    let subscriptions = &active.described.subscriptions;
    let store = &host.services.store;
    let consumer = format!("plugin:{}", active.manifest.id);
    let after = crate::events::cursor(store, &consumer).await?;
    let events = crate::events::read_after(store, after, EVENT_BATCH).await?;
    let (mut handled, mut count) = (after, 0);
    for event in events {
        if subscriptions.iter().any(|s| crate::events::matches(s, &event.kind)) {
            let wit = wit_guest::Event {
                sequence: event.sequence,
                kind: event.kind.clone(),
                subject: event.subject.clone(),
                data: event.data.to_string(),
                at_ms: event.at_ms,
            };
            if let Err(e) = active.sandbox.on_event(&wit).await {
                crate::events::advance(store, &consumer, handled).await?;
                return Err(e);
            }
            delivered(&event.subject);
            count += 1;
        }
        handled = event.sequence;
    }
    if handled > after {
        crate::events::advance(store, &consumer, handled).await?;
    }
    Ok(count)
}

async fn reconcile_if_due(active: &Active, shared: &Mutex<Shared>) {
    let Some(period) = active.described.reconcile_period else { return };
    let trigger = {
        let mut s = shared.lock().expect("plugin work");
        let now = Instant::now();
        let periodic = s.last_pass.is_none_or(|t| now >= t + period) || s.requeue_at.is_some_and(|t| now >= t);
        let hinted = !s.hints.is_empty() && s.last_hint.is_some_and(|t| now >= t + QUIET);
        if !periodic && !hinted {
            return;
        }
        let hints = std::mem::take(&mut s.hints).into_iter().collect();
        s.last_pass = Some(now);
        s.requeue_at = None;
        wit_guest::ReconcileTrigger { periodic, hints }
    };
    match active.sandbox.reconcile(&trigger).await {
        Ok(outcome) => {
            tracing::debug!(plugin = %active.manifest.id, summary = %outcome.summary, "reconcile pass done");
            let mut s = shared.lock().expect("plugin work");
            s.pass_failures = 0;
            if let Some(ms) = outcome.requeue_after_ms {
                s.requeue_at = Some(Instant::now() + Duration::from_millis(ms.max(100)));
            }
        }
        Err(e) => {
            // not left until the next period: what the pass was to do is tried again soon
            let mut s = shared.lock().expect("plugin work");
            s.pass_failures = s.pass_failures.saturating_add(1);
            let retry = retry_after(s.pass_failures, period);
            s.requeue_at = Some(Instant::now() + retry);
            tracing::warn!(plugin = %active.manifest.id, code = %e.code, retry_ms = retry.as_millis() as u64,
                "reconcile pass failed: {}", e.message);
        }
    }
}

/// When a pass that failed `failures` times in a row is tried again: 1 s, 2 s, 4 s, … never
/// later than the plugin's `period`.
fn retry_after(failures: u32, period: Duration) -> Duration {
    RETRY_FIRST.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(period)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_pass_is_tried_again_soon_then_less_often_up_to_the_period() {
        let period = Duration::from_secs(60);
        let waits: Vec<u64> = (1..=8).map(|n| retry_after(n, period).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(retry_after(u32::MAX, period), period, "no overflow however long it fails");
        assert_eq!(retry_after(1, Duration::from_millis(500)), Duration::from_millis(500), "never later than a short period");
    }

    #[tokio::test]
    async fn a_round_that_panics_does_not_leave_its_plugin_busy() {
        let flag = Arc::new(AtomicBool::new(true));
        let busy = Busy(flag.clone());
        let round = tokio::spawn(async move {
            let _busy = busy;
            panic!("a round failed");
        });
        assert!(round.await.unwrap_err().is_panic());
        assert!(!flag.load(Ordering::Acquire), "the flag was cleared by the unwinding round");
    }
}
