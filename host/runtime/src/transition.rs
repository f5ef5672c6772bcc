//! The slot transition: one pure, exhaustive decision per slot, every case named
//! (docs/runtime.md, "Slots and the assignment producer"), and the failure backoff.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What an assignment asks of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Intent {
    /// Run the work (generation 1).
    Run,
    /// Stop it (generation 2).
    Stop,
    /// Remove it (generation 3).
    Remove,
}

impl Intent {
    /// The generation an assignment carries with this intent.
    pub fn generation(self) -> u32 {
        match self {
            Intent::Run => 1,
            Intent::Stop => 2,
            Intent::Remove => 3,
        }
    }
}

/// A slot as the transition reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotState {
    /// No assignment was ever admitted here (or the slot was released).
    Absent,
    /// The slot's current assignment.
    Held {
        /// The desired key the assignment was admitted under.
        key: String,
        /// Where it stands.
        intent: Intent,
        /// Its node reported it failed (exited, or unhealthy past the threshold).
        failed: bool,
        /// The node reported the stop done (generation 2's receipt).
        stop_receipt: bool,
        /// The node reported the removal done (generation 3's receipt).
        remove_receipt: bool,
    },
}

/// Everything besides the slot the decision reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Around<'a> {
    /// The desired key for this slot, or `None` when nothing is desired there.
    pub desired: Option<&'a str>,
    /// A failed slot's backoff has elapsed.
    pub backoff_elapsed: bool,
    /// The restart policy lets a failed slot be replaced.
    pub restarts: bool,
    /// Another slot of the service is between a drift's stop and its successor's readiness.
    pub other_replacing: bool,
}

/// The named cases of the transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    /// No slot, and a desire: run.
    AdmitRunFirst,
    /// Removed with both receipts, and a desire: run, citing the removal.
    AdmitRunSuccessor,
    /// Removed with both receipts, no desire: release the slot.
    Settled,
    /// At the desired attempt, not failed: nothing.
    Running,
    /// At another attempt than the desire: stop.
    Drift,
    /// Running with no desire: stop.
    Undesired,
    /// Failed, backoff elapsed: stop.
    FailedElapsed,
    /// Failed, backoff pending: wait.
    FailedWaiting,
    /// Failed under the restart policy `never`: wait.
    FailedKept,
    /// Stopped without its receipt: wait.
    StopReceiptPending,
    /// Stopped with its receipt: remove.
    Remove,
    /// Removed without its second receipt: wait.
    RemoveReceiptPending,
    /// Drifted while another slot is replacing: wait.
    ReplacementInFlight,
    /// No slot and no desire: nothing.
    Idle,
}

/// What a case does to the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Admit a run attempt under the desired key.
    Run,
    /// Ask the node to stop the current attempt.
    Stop,
    /// Ask the node to remove it.
    Remove,
    /// Release the slot's record.
    Release,
    /// Nothing now.
    Wait,
    /// Nothing at all.
    Nothing,
}

impl Case {
    /// The step this case takes.
    pub fn step(self) -> Step {
        match self {
            Case::AdmitRunFirst | Case::AdmitRunSuccessor => Step::Run,
            Case::Drift | Case::Undesired | Case::FailedElapsed => Step::Stop,
            Case::Remove => Step::Remove,
            Case::Settled => Step::Release,
            Case::FailedWaiting | Case::FailedKept | Case::StopReceiptPending | Case::RemoveReceiptPending | Case::ReplacementInFlight => {
                Step::Wait
            }
            Case::Running | Case::Idle => Step::Nothing,
        }
    }

    /// Its name as the table writes it.
    pub fn name(self) -> &'static str {
        match self {
            Case::AdmitRunFirst => "admit-run-first",
            Case::AdmitRunSuccessor => "admit-run-successor",
            Case::Settled => "settled",
            Case::Running => "running",
            Case::Drift => "drift",
            Case::Undesired => "undesired",
            Case::FailedElapsed => "failed-elapsed",
            Case::FailedWaiting => "failed-waiting",
            Case::FailedKept => "failed-kept",
            Case::StopReceiptPending => "stop-receipt-pending",
            Case::Remove => "remove",
            Case::RemoveReceiptPending => "remove-receipt-pending",
            Case::ReplacementInFlight => "replacement-in-flight",
            Case::Idle => "idle",
        }
    }
}

/// Decide one slot. Pure: the same slot and surroundings always give the same case.
pub fn decide(slot: &SlotState, around: Around<'_>) -> Case {
    let SlotState::Held { key, intent, failed, stop_receipt, remove_receipt } = slot else {
        return if around.desired.is_some() { Case::AdmitRunFirst } else { Case::Idle };
    };
    match intent {
        Intent::Run => match around.desired {
            None => Case::Undesired,
            Some(desired) if desired != key => {
                if around.other_replacing {
                    Case::ReplacementInFlight
                } else {
                    Case::Drift
                }
            }
            Some(_) if *failed && !around.restarts => Case::FailedKept,
            Some(_) if *failed && around.backoff_elapsed => Case::FailedElapsed,
            Some(_) if *failed => Case::FailedWaiting,
            Some(_) => Case::Running,
        },
        Intent::Stop if !stop_receipt => Case::StopReceiptPending,
        Intent::Stop => Case::Remove,
        Intent::Remove if !remove_receipt => Case::RemoveReceiptPending,
        Intent::Remove if around.desired.is_some() => Case::AdmitRunSuccessor,
        Intent::Remove => Case::Settled,
    }
}

/// The failure backoff: `min(10 s · 2^n, 10 min)`, `n` the consecutive earlier failures of the
/// slot under the same desire.
pub fn backoff(earlier_failures: u32) -> Duration {
    const BASE: Duration = Duration::from_secs(10);
    const MAX: Duration = Duration::from_secs(600);
    BASE.saturating_mul(1u32.checked_shl(earlier_failures.min(31)).unwrap_or(u32::MAX)).min(MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(key: &str, intent: Intent, failed: bool, stop: bool, remove: bool) -> SlotState {
        SlotState::Held { key: key.into(), intent, failed, stop_receipt: stop, remove_receipt: remove }
    }

    fn around(desired: Option<&str>, backoff_elapsed: bool, restarts: bool, other_replacing: bool) -> Around<'_> {
        Around { desired, backoff_elapsed, restarts, other_replacing }
    }

    /// Every (slot, surroundings) pair the inputs can make, against the table.
    #[test]
    fn the_table_covers_every_pair() {
        let slots = {
            let mut slots = vec![SlotState::Absent];
            for key in ["k1", "k2"] {
                for intent in [Intent::Run, Intent::Stop, Intent::Remove] {
                    for failed in [false, true] {
                        for stop in [false, true] {
                            for remove in [false, true] {
                                slots.push(held(key, intent, failed, stop, remove));
                            }
                        }
                    }
                }
            }
            slots
        };
        let mut seen = std::collections::BTreeSet::new();
        for slot in &slots {
            for desired in [None, Some("k1")] {
                for backoff_elapsed in [false, true] {
                    for restarts in [false, true] {
                        for other in [false, true] {
                            let case = decide(slot, around(desired, backoff_elapsed, restarts, other));
                            seen.insert(case.name());
                            let expected = expected(slot, desired, backoff_elapsed, restarts, other);
                            assert_eq!(
                                case, expected,
                                "{slot:?} desired={desired:?} elapsed={backoff_elapsed} restarts={restarts} other={other}"
                            );
                        }
                    }
                }
            }
        }
        // every named case is reachable
        assert_eq!(seen.len(), 14, "{seen:?}");
    }

    /// The table of docs/runtime.md, written out independently of `decide`'s match.
    fn expected(slot: &SlotState, desired: Option<&str>, elapsed: bool, restarts: bool, other: bool) -> Case {
        let SlotState::Held { key, intent, failed, stop_receipt, remove_receipt } = slot else {
            return if desired.is_some() { Case::AdmitRunFirst } else { Case::Idle };
        };
        let at_desire = desired == Some(key.as_str());
        match (intent, desired.is_some()) {
            (Intent::Remove, _) if !remove_receipt => Case::RemoveReceiptPending,
            (Intent::Remove, true) => Case::AdmitRunSuccessor,
            (Intent::Remove, false) => Case::Settled,
            (Intent::Stop, _) if *stop_receipt => Case::Remove,
            (Intent::Stop, _) => Case::StopReceiptPending,
            (Intent::Run, false) => Case::Undesired,
            (Intent::Run, true) if !at_desire && other => Case::ReplacementInFlight,
            (Intent::Run, true) if !at_desire => Case::Drift,
            (Intent::Run, true) if !failed => Case::Running,
            (Intent::Run, true) if !restarts => Case::FailedKept,
            (Intent::Run, true) if elapsed => Case::FailedElapsed,
            (Intent::Run, true) => Case::FailedWaiting,
        }
    }

    #[test]
    fn drift_waits_only_for_another_replacement_and_an_empty_desire_never_waits() {
        let running = held("old", Intent::Run, false, false, false);
        assert_eq!(decide(&running, around(Some("new"), false, true, true)), Case::ReplacementInFlight);
        assert_eq!(decide(&running, around(Some("new"), false, true, false)), Case::Drift);
        // a hold or a deletion stops every slot at once
        assert_eq!(decide(&running, around(None, false, true, true)), Case::Undesired);
        // a failure is replaced whatever the others do
        let failed = held("new", Intent::Run, true, false, false);
        assert_eq!(decide(&failed, around(Some("new"), true, true, true)), Case::FailedElapsed);
    }

    #[test]
    fn every_step_is_named() {
        assert_eq!(Case::AdmitRunFirst.step(), Step::Run);
        assert_eq!(Case::Drift.step(), Step::Stop);
        assert_eq!(Case::Remove.step(), Step::Remove);
        assert_eq!(Case::Settled.step(), Step::Release);
        assert_eq!(Case::FailedWaiting.step(), Step::Wait);
        assert_eq!(Case::Running.step(), Step::Nothing);
        assert_eq!(Intent::Stop.generation(), 2);
    }

    #[test]
    fn backoff_doubles_from_ten_seconds_to_ten_minutes() {
        let secs: Vec<u64> = (0..8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![10, 20, 40, 80, 160, 320, 600, 600]);
        assert_eq!(backoff(u32::MAX), Duration::from_secs(600));
    }
}
