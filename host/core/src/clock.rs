//! The one wall clock of the host. Every timestamp Capstan stores or compares comes from here,
//! so a test or a reader has one place to look.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Seconds since the Unix epoch (0 for a clock set before it).
pub fn now_secs() -> u64 {
    now_ms() / 1000
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
}
