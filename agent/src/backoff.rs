//! When the next beat goes out: a pure schedule, given the failures in a row and a random draw.
//!
//! - After an accepted beat: the interval, jittered by up to ±10 % so a fleet of agents started
//!   together does not beat in step.
//! - While Capstan cannot be reached (or refuses): the interval doubled per failure in a row,
//!   capped at five minutes, and jittered down by up to 20 % (never above the cap).
//! - While the credential is refused (`node-unauthorized`): never faster than a minute (or the
//!   interval, when that is longer): an operator may fix it, and a hot loop helps nobody.

use std::time::Duration;

/// The longest wait between two attempts.
pub const CAP: Duration = Duration::from_secs(300);
/// The shortest wait while the credential is refused.
pub const UNAUTHORIZED_FLOOR: Duration = Duration::from_secs(60);

/// Why the schedule is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// The last beat was accepted.
    Accepted,
    /// The `n`-th failure in a row (1 = the first) to reach Capstan or be accepted by it.
    Failure(u32),
    /// The `n`-th refusal of the credential in a row.
    Unauthorized(u32),
}

/// The wait before the next attempt. `draw` is uniform in `[0, 1)`.
pub fn next_delay(interval: Duration, after: After, draw: f64) -> Duration {
    let draw = draw.clamp(0.0, 1.0);
    match after {
        After::Accepted => interval.mul_f64(0.9 + 0.2 * draw),
        After::Failure(n) => backed_off(interval, n, draw),
        After::Unauthorized(n) => {
            let floor = UNAUTHORIZED_FLOOR.max(interval).min(CAP);
            backed_off(floor, n, draw).max(floor.mul_f64(0.8))
        }
    }
}

fn backed_off(base: Duration, n: u32, draw: f64) -> Duration {
    let doublings = n.saturating_sub(1).min(20);
    let raw = base.saturating_mul(1u32 << doublings).min(CAP);
    raw.mul_f64(1.0 - 0.2 * draw)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THIRTY: Duration = Duration::from_secs(30);

    #[test]
    fn accepted_beats_keep_the_interval_within_ten_percent() {
        assert_eq!(next_delay(THIRTY, After::Accepted, 0.0), Duration::from_secs(27));
        assert_eq!(next_delay(THIRTY, After::Accepted, 0.5), THIRTY);
        let top = next_delay(THIRTY, After::Accepted, 0.999_999);
        assert!(top > Duration::from_secs(32) && top < Duration::from_secs(33), "{top:?}");
    }

    #[test]
    fn failures_double_to_the_five_minute_cap() {
        let untouched: Vec<u64> = (1..=6).map(|n| next_delay(THIRTY, After::Failure(n), 0.0).as_secs()).collect();
        assert_eq!(untouched, [30, 60, 120, 240, 300, 300]);
        assert_eq!(next_delay(THIRTY, After::Failure(u32::MAX), 0.0), CAP, "no overflow");
        for n in 1..40 {
            for draw in [0.0, 0.3, 0.999] {
                let delay = next_delay(THIRTY, After::Failure(n), draw);
                assert!(delay <= CAP, "never above the cap: {n} {draw} {delay:?}");
                assert!(delay >= Duration::from_secs(24), "jitter takes at most 20 %: {delay:?}");
            }
        }
        let jittered = next_delay(THIRTY, After::Failure(9), 0.5);
        assert_eq!(jittered, Duration::from_secs(270));
    }

    #[test]
    fn a_short_test_interval_backs_off_from_itself() {
        let second = Duration::from_secs(1);
        let untouched: Vec<u64> = (1..=10).map(|n| next_delay(second, After::Failure(n), 0.0).as_secs()).collect();
        assert_eq!(untouched, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
    }

    #[test]
    fn a_refused_credential_is_retried_slowly() {
        let second = Duration::from_secs(1);
        assert!(next_delay(second, After::Unauthorized(1), 0.999) >= Duration::from_secs(48));
        assert_eq!(next_delay(second, After::Unauthorized(1), 0.0), Duration::from_secs(60));
        assert_eq!(next_delay(second, After::Unauthorized(3), 0.0), Duration::from_secs(240));
        assert_eq!(next_delay(second, After::Unauthorized(50), 0.0), CAP);
        assert_eq!(next_delay(Duration::from_secs(600), After::Unauthorized(1), 0.0), CAP);
    }
}
