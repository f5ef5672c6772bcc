//! The one wall clock of the host. Every timestamp Capstan stores or compares comes from here,
//! so a test or a reader has one place to look.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Seconds since the Unix epoch (0 for a clock set before it): only for what a standard counts
/// in seconds (a JWT's claims, RFC 7519). Every moment Capstan stores or answers is [`now_ms`].
pub fn now_secs() -> u64 {
    now_ms() / 1000
}

/// Below this a stored moment is seconds since the epoch (until the year 5138); at or above it,
/// milliseconds (since 1973). Only data written before 0.3.0 counted seconds.
pub const SECONDS_BELOW: u64 = 100_000_000_000;

/// A moment that may have been written in seconds (before 0.3.0), in milliseconds: seconds are
/// multiplied by 1000, milliseconds stay as they are, so reading it twice changes nothing.
pub fn ms_from_legacy(at: u64) -> u64 {
    if at < SECONDS_BELOW { at.saturating_mul(1000) } else { at }
}

/// A span in milliseconds, the unit of the moments it is added to (saturating).
pub fn millis(span: Duration) -> u64 {
    u64::try_from(span.as_millis()).unwrap_or(u64::MAX)
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
    fn a_legacy_moment_reads_as_milliseconds_once() {
        let secs = 1_700_000_000;
        assert_eq!(ms_from_legacy(secs), 1_700_000_000_000);
        assert_eq!(ms_from_legacy(ms_from_legacy(secs)), 1_700_000_000_000, "a second reading changes nothing");
        let ms = now_ms();
        assert_eq!(ms_from_legacy(ms), ms, "a milliseconds moment stays");
        assert_eq!(ms_from_legacy(0), 0);
        assert_eq!(millis(Duration::from_secs(90)), 90_000);
        assert_eq!(millis(Duration::MAX), u64::MAX);
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
