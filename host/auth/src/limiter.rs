//! Failed-login rate limiting, per username and per source address: a sliding window of
//! recent failures with a bound on how many keys it remembers.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counts recent failures per key and blocks a key that reaches the limit within the window.
pub struct Limiter {
    window: Duration,
    max_failures: usize,
    max_keys: usize,
    failures: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl Limiter {
    /// A limiter allowing `max_failures` failures per key within `window`, remembering at
    /// most `max_keys` keys.
    pub fn new(window: Duration, max_failures: usize, max_keys: usize) -> Self {
        Limiter { window, max_failures, max_keys, failures: Mutex::new(HashMap::new()) }
    }

    /// `Some(wait)` when `key` has used up its failures in the window.
    pub fn blocked(&self, key: &str) -> Option<Duration> {
        let now = Instant::now();
        let mut map = self.failures.lock().expect("limiter lock");
        let entries = map.get_mut(key)?;
        while entries.front().is_some_and(|t| now.duration_since(*t) >= self.window) {
            entries.pop_front();
        }
        if entries.len() < self.max_failures {
            return None;
        }
        entries.front().map(|oldest| self.window.saturating_sub(now.duration_since(*oldest)))
    }

    /// Record a failure for `key`. At the key bound it first forgets keys with no failure
    /// left in the window, then if still full the key with the oldest latest failure.
    pub fn record_failure(&self, key: &str) {
        let now = Instant::now();
        let mut map = self.failures.lock().expect("limiter lock");
        if map.len() >= self.max_keys && !map.contains_key(key) {
            // bounded memory: forget keys whose failures have all aged out, else the stalest
            map.retain(|_, v| v.back().is_some_and(|t| now.duration_since(*t) < self.window));
            if map.len() >= self.max_keys
                && let Some(stalest) = map.iter().min_by_key(|(_, v)| v.back().copied()).map(|(k, _)| k.clone())
            {
                map.remove(&stalest);
            }
        }
        let entries = map.entry(key.to_string()).or_default();
        entries.push_back(now);
        while entries.len() > self.max_failures {
            entries.pop_front();
        }
    }

    /// Take back the latest failure recorded for `key` (an attempt counted before it was
    /// checked, which turned out not to fail).
    pub fn forgive(&self, key: &str) {
        let mut map = self.failures.lock().expect("limiter lock");
        if let Some(entries) = map.get_mut(key) {
            entries.pop_back();
            if entries.is_empty() {
                map.remove(key);
            }
        }
    }

    /// Forget every failure recorded for `key` (after a successful login).
    pub fn clear(&self, key: &str) {
        self.failures.lock().expect("limiter lock").remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_after_the_allowed_failures_until_the_window_passes() {
        let limiter = Limiter::new(Duration::from_millis(200), 3, 100);
        for _ in 0..3 {
            assert!(limiter.blocked("alice").is_none());
            limiter.record_failure("alice");
        }
        let wait = limiter.blocked("alice").expect("blocked after 3 failures");
        assert!(wait <= Duration::from_millis(200));
        assert!(limiter.blocked("bob").is_none(), "keys are separate");
        std::thread::sleep(Duration::from_millis(220));
        assert!(limiter.blocked("alice").is_none(), "the window passed");
        limiter.record_failure("alice");
        limiter.clear("alice");
        assert!(limiter.blocked("alice").is_none());
    }

    #[test]
    fn remembers_a_bounded_number_of_keys() {
        let limiter = Limiter::new(Duration::from_secs(60), 2, 10);
        for i in 0..100 {
            limiter.record_failure(&format!("k{i}"));
        }
        assert!(limiter.failures.lock().unwrap().len() <= 10);
    }
}
