//! The one wall clock of the host. Every timestamp Capstan stores or compares comes from here,
//! so a test or a reader has one place to look.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Seconds since the Unix epoch (0 for a clock set before it).
pub fn now_secs() -> u64 {
    now_ms() / 1000
}

/// The wall clock as an area holds it: [`now_ms`], plus an offset only a test moves
/// ([`Clock::advance`]), so a test can step past a window (a report's freshness, a code's
/// expiry) without sleeping. Clones share the offset.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    ahead_ms: Arc<AtomicU64>,
}

impl Clock {
    /// The system clock, not moved.
    pub fn system() -> Clock {
        Clock::default()
    }

    /// Milliseconds since the Unix epoch, as this clock reads it.
    pub fn now_ms(&self) -> u64 {
        now_ms().saturating_add(self.ahead_ms.load(Ordering::Relaxed))
    }

    /// Seconds since the Unix epoch, as this clock reads it.
    pub fn now_secs(&self) -> u64 {
        self.now_ms() / 1000
    }

    /// Move this clock (and every clone of it) `by` ahead of the system's: for tests.
    pub fn advance(&self, by: Duration) {
        self.ahead_ms.fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_milliseconds_agree() {
        let (ms, secs) = (now_ms(), now_secs());
        assert!(ms > 1_600_000_000_000, "{ms}");
        assert!(secs.abs_diff(ms / 1000) <= 1, "{secs} vs {ms}");
    }

    #[test]
    fn a_clock_moves_with_its_clones() {
        let clock = Clock::system();
        let clone = clock.clone();
        let before = clone.now_ms();
        clock.advance(Duration::from_secs(600));
        assert!(clone.now_ms() >= before + 600_000);
        assert!(Clock::system().now_ms() < before + 600_000);
    }
}
