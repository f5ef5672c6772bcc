//! Cron schedules: whether one fell due in a window, and when it next falls due. Five fields,
//! UTC (the same dialect plugin descriptors declare).

use capstan_core::refusal::{Refusal, Result};
use chrono::{DateTime, Utc};
use std::str::FromStr;

/// Parse a cron expression, refusing `task-cron-invalid` with the parser's reason.
pub fn parse(cron: &str) -> Result<croner::Cron> {
    croner::Cron::from_str(cron)
        .map_err(|e| Refusal::new("task-cron-invalid", format!("cron {cron:?} is not a valid 5-field expression: {e}")))
}

fn to_utc(ms: u64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(i64::try_from(ms).ok()?)
}

/// Whether `cron` has an occurrence in `(since_ms, now_ms]`. An invalid expression is never due.
pub fn due_between(cron: &str, since_ms: u64, now_ms: u64) -> bool {
    let (Ok(cron), Some(since), Some(now)) = (croner::Cron::from_str(cron), to_utc(since_ms), to_utc(now_ms)) else { return false };
    cron.find_next_occurrence(&since, false).is_ok_and(|next| next <= now)
}

/// The first occurrence of `cron` strictly after `after_ms`, in milliseconds.
pub fn next_after(cron: &str, after_ms: u64) -> Option<u64> {
    let cron = croner::Cron::from_str(cron).ok()?;
    let next = cron.find_next_occurrence(&to_utc(after_ms)?, false).ok()?;
    u64::try_from(next.timestamp_millis()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_due_once_their_time_passed() {
        let s = |secs: u64| secs * 1000;
        // 0 * * * *: on the hour
        assert!(due_between("0 * * * *", s(3599), s(3600)));
        assert!(!due_between("0 * * * *", s(3600), s(3601)), "the window is open at its start");
        assert!(!due_between("0 * * * *", s(100), s(200)));
        assert!(due_between("*/5 * * * *", s(299), s(300)));
        assert!(!due_between("not a cron", 0, s(100_000)));
    }

    #[test]
    fn the_next_run_is_the_next_occurrence() {
        assert_eq!(next_after("0 * * * *", 1000), Some(3_600_000));
        assert_eq!(next_after("0 * * * *", 3_600_000), Some(7_200_000), "strictly after");
        assert_eq!(next_after("*/5 * * * *", 0), Some(300_000));
        assert_eq!(next_after("bogus", 0), None);
        assert_eq!(parse("61 * * * *").unwrap_err().code, "task-cron-invalid");
        assert!(parse("0 3 * * *").is_ok());
    }
}
