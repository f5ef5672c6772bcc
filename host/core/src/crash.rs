//! Crash points: named places between the halves of an operation where a debug build kills its
//! own process with SIGKILL when `CAPSTAN_CRASH_AT` names the place, so a test can interrupt the
//! operation exactly there, as `kill -9` would, and check what a restart finds (the kill -9
//! suite, `tests/e2e/crash.rs`). Release builds compile every crash point to nothing: production
//! never carries the hook.
//!
//! `CAPSTAN_CRASH_AT=<name>` kills at the first time the point is reached; `<name>#<n>` at the
//! n-th time. Each crash point documents its name where it is placed.

/// The environment variable naming the crash point where a debug build kills itself.
pub const CRASH_AT: &str = "CAPSTAN_CRASH_AT";

/// Written to standard error, followed by the point as armed (`name` or `name#n`), just before
/// the kill: how a test tells the crash it asked for from any other death.
pub const CRASH_LINE: &str = "capstan: crash point reached, killing this process with SIGKILL: ";

/// A crash point named `name` (a `format_args!` for names with parts, so a release build
/// formats nothing).
#[inline(always)]
pub fn crash_point(name: impl std::fmt::Display) {
    #[cfg(debug_assertions)]
    armed::reached(&name);
    #[cfg(not(debug_assertions))]
    let _ = name;
}

#[cfg(debug_assertions)]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The armed point and the hit at which it kills, read once from the environment.
    fn armed() -> Option<&'static (String, u64)> {
        static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
        ARMED.get_or_init(|| std::env::var(super::CRASH_AT).ok().as_deref().and_then(super::parse)).as_ref()
    }

    pub(super) fn reached(name: &dyn std::fmt::Display) {
        static HITS: AtomicU64 = AtomicU64::new(0);
        let Some((point, at)) = armed() else { return };
        if name.to_string() != *point || HITS.fetch_add(1, Ordering::SeqCst) + 1 != *at {
            return;
        }
        // the point as it was armed: `name`, or `name#n`
        match at {
            1 => eprintln!("{}{point}", super::CRASH_LINE),
            n => eprintln!("{}{point}#{n}", super::CRASH_LINE),
        }
        // SAFETY: kill(2) on our own pid with a constant signal has no memory-safety preconditions.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        // SIGKILL cannot be caught or ignored; should it not have been delivered, still never go on
        std::process::abort();
    }
}

/// `name` or `name#n` (n ≥ 1) as the point and the hit that kills; `None` when empty or invalid.
#[cfg_attr(not(debug_assertions), allow(dead_code))]
fn parse(text: &str) -> Option<(String, u64)> {
    let (name, at) = match text.rsplit_once('#') {
        Some((name, n)) => (name, n.parse().ok().filter(|n| *n >= 1)?),
        None => (text, 1),
    };
    (!name.is_empty()).then(|| (name.to_string(), at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_point_names_the_place_and_optionally_the_hit() {
        assert_eq!(parse("lease:taken"), Some(("lease:taken".into(), 1)));
        assert_eq!(parse("plugin-commit:p_appstore__catalog#2"), Some(("plugin-commit:p_appstore__catalog".into(), 2)));
        assert_eq!(parse(""), None);
        assert_eq!(parse("x#0"), None);
        assert_eq!(parse("x#many"), None);
        assert_eq!(parse("#3"), None);
    }

    #[test]
    fn an_unarmed_crash_point_does_nothing() {
        // the test process has no CAPSTAN_CRASH_AT naming this point
        crash_point("core-tests:never-armed");
        crash_point(format_args!("core-tests:{}", 1));
    }
}
