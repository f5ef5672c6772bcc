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

/// The first occurrence strictly after `after_ms`. Occurrences fall on whole seconds, so that is
/// the first strictly after `after_ms`'s whole second — which is what croner is asked: given a
/// start with a fraction of a second, it answers the occurrence shifted by that fraction (and a
/// window closing within it then missed the occurrence, and the next window skipped it).
fn next_occurrence(cron: &croner::Cron, after_ms: u64) -> Option<DateTime<Utc>> {
    cron.find_next_occurrence(&to_utc(after_ms - after_ms % 1000)?, false).ok()
}

/// Whether `cron` has an occurrence in `(since_ms, now_ms]`. An invalid expression is never due.
pub fn due_between(cron: &str, since_ms: u64, now_ms: u64) -> bool {
    let (Ok(cron), Some(now)) = (croner::Cron::from_str(cron), to_utc(now_ms)) else { return false };
    next_occurrence(&cron, since_ms).is_some_and(|next| next <= now)
}

/// The first occurrence of `cron` strictly after `after_ms`, in milliseconds.
pub fn next_after(cron: &str, after_ms: u64) -> Option<u64> {
    let cron = croner::Cron::from_str(cron).ok()?;
    u64::try_from(next_occurrence(&cron, after_ms)?.timestamp_millis()).ok()
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

    /// Found by the property tests: a time with a fraction of a second shifted the occurrence
    /// found by that fraction, so a tick less than a second after the one before it, across the
    /// minute, did not see the run due, and the tick after it was past it: the run was skipped.
    #[test]
    fn a_time_between_seconds_neither_shifts_nor_skips_the_occurrence() {
        assert_eq!(next_after("* * * * *", 1), Some(60_000));
        assert_eq!(next_after("0 * * * *", 3_599_999), Some(3_600_000));
        assert_eq!(next_after("0 * * * *", 3_600_001), Some(7_200_000));
        assert!(due_between("* * * * *", 59_700, 60_650), "a window of 950 ms across the minute sees it");
        assert!(!due_between("* * * * *", 60_650, 61_700), "and the next window does not see it again");
        assert!(due_between("0 * * * *", 3_599_999, 3_600_000));
        assert!(!due_between("0 * * * *", 3_600_000, 3_600_999));
    }
}

/// Property tests: a cron expression arrives in a plugin's task descriptor or a request, so
/// whatever text it is the parser answers a schedule or `task-cron-invalid`, never a panic; and
/// a schedule's next run is strictly after the given time, matches the expression, and is the
/// first that does.
#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::select;

    /// 2100-01-01T00:00:00Z in milliseconds: the times asked about stay below it.
    const YEAR_2100_MS: u64 = 4_102_444_800_000;

    /// One field of a cron expression: the forms croner knows, with numbers in and out of range.
    fn field() -> impl Strategy<Value = String> {
        let number = prop_oneof![4 => 0u32..62, 1 => any::<u32>()];
        let atom = prop_oneof![
            3 => Just("*".to_string()),
            4 => number.clone().prop_map(|n| n.to_string()),
            2 => (number.clone(), number.clone()).prop_map(|(a, b)| format!("{a}-{b}")),
            2 => (prop_oneof![Just("*".to_string()), number.clone().prop_map(|n| n.to_string())], number.clone())
                .prop_map(|(a, s)| format!("{a}/{s}")),
            1 => (number.clone(), number.clone(), number.clone()).prop_map(|(a, b, s)| format!("{a}-{b}/{s}")),
            1 => select(vec![
                "?", "L", "W", "LW", "15W", "5L", "1#2", "MON#5", "FRI#1", "MON", "sun", "JAN", "dec", "MON-FRI", "JAN-MAR", "L-2",
                "#", "-", "/", ",", "*/", "1-", "0x1", "1.5", "",
            ])
            .prop_map(String::from),
        ];
        prop::collection::vec(atom, 1..4).prop_map(|atoms| atoms.join(","))
    }

    /// A five-field expression (sometimes four, six or seven fields, or a nickname).
    fn expression() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => prop::collection::vec(field(), 5).prop_map(|f| f.join(" ")),
            1 => prop::collection::vec(field(), 0..8).prop_map(|f| f.join(" ")),
            1 => select(vec!["@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@reboot", "@every 5m"])
                .prop_map(String::from),
        ]
    }

    /// Expressions that fire somewhere within every two years: minutes, hours and months as
    /// stars, numbers or steps in range, a day of month up to 28, any weekday.
    fn firing_expression() -> impl Strategy<Value = String> {
        let pick = |max: u32| {
            prop_oneof![
                Just("*".to_string()),
                (0..=max).prop_map(|n| n.to_string()),
                (1..=max).prop_map(|s| format!("*/{s}")),
                (0..=max, 0..=max).prop_map(|(a, b)| format!("{},{}", a.min(b), a.max(b))),
            ]
        };
        let day = prop_oneof![Just("*".to_string()), (1u32..=28).prop_map(|d| d.to_string()), (1u32..=9).prop_map(|s| format!("*/{s}"))];
        let month = prop_oneof![
            Just("*".to_string()),
            (1u32..=12).prop_map(|m| m.to_string()),
            select(vec!["JAN", "JUN-AUG", "*/3"]).prop_map(String::from)
        ];
        let weekday = prop_oneof![
            Just("*".to_string()),
            (0u32..=6).prop_map(|d| d.to_string()),
            select(vec!["MON-FRI", "SAT,SUN"]).prop_map(String::from)
        ];
        (pick(59), pick(23), day, month, weekday).prop_map(|(m, h, d, mo, w)| format!("{m} {h} {d} {mo} {w}"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any text parses or is refused `task-cron-invalid`; asking when it is due, for any
        /// times, answers without a panic (an invalid expression is never due).
        #[test]
        fn any_expression_parses_or_is_refused_by_name(
            text in prop_oneof![any::<String>(), "[ -~]{0,40}", expression()],
            since in prop_oneof![0..YEAR_2100_MS, any::<u64>()],
            span in 0u64..10_000_000_000,
        ) {
            let parsed = parse(&text);
            if let Err(err) = &parsed {
                prop_assert_eq!(err.code.as_ref(), "task-cron-invalid");
                prop_assert!(!err.message.is_empty());
            }
            let due = due_between(&text, since, since.saturating_add(span));
            let next = next_after(&text, since);
            if parsed.is_err() {
                prop_assert!(!due && next.is_none());
            }
            if let Some(next) = next {
                prop_assert!(next > since);
                prop_assert_eq!(due, next <= since.saturating_add(span));
            }
        }

        /// A schedule's next run is strictly after the time given, on a whole minute, matches the
        /// expression, and is the first minute after that time that does; the schedule is due
        /// between the two and not before.
        #[test]
        fn the_next_run_is_the_first_match_after(cron in firing_expression(), after in 0..YEAR_2100_MS) {
            let schedule = parse(&cron).unwrap();
            let next = next_after(&cron, after).unwrap();
            prop_assert!(next > after);
            prop_assert_eq!(next % 60_000, 0, "on a whole minute");
            prop_assert!(schedule.is_time_matching(&to_utc(next).unwrap()).unwrap());
            prop_assert!(due_between(&cron, after, next));
            prop_assert!(!due_between(&cron, after, next - 1));
            // no minute in between matches (checked where the gap is at most a day)
            if next - after <= 86_400_000 {
                let mut minute = (after / 60_000 + 1) * 60_000;
                while minute < next {
                    prop_assert!(!schedule.is_time_matching(&to_utc(minute).unwrap()).unwrap(), "{} matches before {}", minute, next);
                    minute += 60_000;
                }
            }
        }
    }
}
