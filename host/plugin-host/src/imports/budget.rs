//! What one plugin call may make the host do for it. The memory limit bounds the plugin's own
//! memory; these bound the host's work and memory on its behalf, so a plugin cannot spend what
//! the operator never approved through its imports:
//!
//! - **host calls**: at most [`MAX_HOST_CALLS`] calls of Capstan's imports per plugin call;
//! - **host bytes**: what the host holds for the call (blob writers' buffers) plus any one
//!   transient allocation (a commit's documents, a request or response body, event data) stays
//!   within the plugin's memory limit — the operator approved that much per instance, and the
//!   host holds at most as much again.
//!
//! Past either, an import answers `resource-exhausted` (naming which budget in `data.budget`).

use super::{WitResult, refusal};
use serde_json::json;
use std::cell::Cell;

/// Calls of Capstan's imports one plugin call may make (WASI's clocks and random are not
/// counted: they cost the host nothing it keeps).
pub const MAX_HOST_CALLS: u32 = 20_000;

/// Largest answer of a plugin's method, in bytes.
pub const MAX_METHOD_OUTPUT: usize = 16 << 20;

/// The budgets of one plugin call.
#[derive(Debug)]
pub struct CallBudget {
    calls_left: Cell<u32>,
    bytes_limit: usize,
    bytes_held: Cell<usize>,
}

/// `resource-exhausted` for `budget` (`host-calls` or `host-bytes`).
pub fn exhausted(budget: &str, message: String, limit: usize) -> crate::runtime::capstan::plugin::types::Refusal {
    refusal("resource-exhausted", message, json!({ "budget": budget, "limit": limit }))
}

impl CallBudget {
    /// A call's budgets: [`MAX_HOST_CALLS`], and `bytes_limit` host bytes.
    pub fn new(bytes_limit: usize) -> Self {
        CallBudget { calls_left: Cell::new(MAX_HOST_CALLS), bytes_limit, bytes_held: Cell::new(0) }
    }

    /// A new call on the same instance: its host calls count afresh; bytes still held (by
    /// handles the instance kept open) stay held.
    pub fn renew(&self) {
        self.calls_left.set(MAX_HOST_CALLS);
    }

    /// Count one host call.
    pub fn call(&self) -> WitResult<()> {
        match self.calls_left.get() {
            0 => {
                Err(exhausted("host-calls", format!("a plugin call may make at most {MAX_HOST_CALLS} host calls"), MAX_HOST_CALLS as usize))
            }
            left => {
                self.calls_left.set(left - 1);
                Ok(())
            }
        }
    }

    /// Refuse unless `bytes` more fit beside what is held (a transient allocation, not kept).
    pub fn fits(&self, bytes: usize, what: &str) -> WitResult<()> {
        if self.bytes_held.get().saturating_add(bytes) > self.bytes_limit {
            return Err(exhausted(
                "host-bytes",
                format!(
                    "{what} would take the host past the {} MiB it holds for a call of this plugin (its memory limit)",
                    self.bytes_limit >> 20
                ),
                self.bytes_limit,
            ));
        }
        Ok(())
    }

    /// Hold `bytes` more for the rest of the call, or refuse as [`CallBudget::fits`] does.
    pub fn hold(&self, bytes: usize, what: &str) -> WitResult<()> {
        self.fits(bytes, what)?;
        self.bytes_held.set(self.bytes_held.get() + bytes);
        Ok(())
    }

    /// Give back `bytes` held.
    pub fn release(&self, bytes: usize) {
        self.bytes_held.set(self.bytes_held.get().saturating_sub(bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_calls_run_out_by_name() {
        let budget = CallBudget::new(1 << 20);
        for _ in 0..MAX_HOST_CALLS {
            budget.call().unwrap();
        }
        let refused = budget.call().unwrap_err();
        assert_eq!(refused.code, "resource-exhausted");
        assert!(refused.data.unwrap().contains("\"host-calls\""));
        budget.hold(100, "a blob").unwrap();
        budget.renew();
        budget.call().unwrap();
        assert!(budget.fits((1 << 20) - 100, "a commit").is_ok());
        assert!(budget.fits((1 << 20) - 99, "a commit").is_err(), "renewing keeps what is held");
    }

    #[test]
    fn held_bytes_count_until_released_and_transient_ones_against_the_rest() {
        let budget = CallBudget::new(10);
        budget.hold(6, "a blob").unwrap();
        assert!(budget.fits(4, "a commit").is_ok());
        let refused = budget.fits(5, "a commit").unwrap_err();
        assert_eq!(refused.code, "resource-exhausted");
        assert!(refused.message.contains("a commit"), "{}", refused.message);
        assert!(budget.hold(5, "another blob").is_err(), "a refused hold holds nothing");
        budget.release(6);
        budget.hold(10, "a blob").unwrap();
    }
}
