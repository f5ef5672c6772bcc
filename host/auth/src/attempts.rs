//! Failed logins and token exchanges, counted in the store so every node of a fleet sees the
//! same counts (N nodes do not allow N times the attempts).
//!
//! A count is kept per key — (username, client) for logins, and the client alone — and slows
//! attempts down rather than blocking them: after a rule's free failures within its window,
//! each further attempt must wait twice as long after the last failure as the one before (1 s,
//! 2 s, 4 s, … up to 15 minutes). Keyed on the client too, a stranger's wrong passwords slow
//! down that stranger, never the user logging in from elsewhere. Keys are stored only as
//! digests.

use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_store::{CollectionSpec, Store};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// The collection of counts, by key digest.
pub const LOGIN_ATTEMPTS: &str = "login_attempts";

/// The collection's declaration.
pub fn collection() -> CollectionSpec {
    CollectionSpec::new(LOGIN_ATTEMPTS)
}

/// How a count slows attempts down.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Failures allowed before any wait.
    pub free: u64,
    /// A count is forgotten this long after its last failure.
    pub window: Duration,
    /// The first wait; each further failure doubles it.
    pub first_wait: Duration,
    /// The longest wait.
    pub max_wait: Duration,
}

impl Rule {
    /// How long after the last failure the next attempt must wait, with `failures` counted.
    pub fn wait_after(&self, failures: u64) -> Duration {
        if failures < self.free {
            return Duration::ZERO;
        }
        let doublings = (failures - self.free).min(20) as u32;
        self.first_wait.saturating_mul(1 << doublings).min(self.max_wait)
    }
}

/// For a username from one client: five free, then waits.
pub const PER_USER_AND_CLIENT: Rule =
    Rule { free: 5, window: Duration::from_secs(15 * 60), first_wait: Duration::from_secs(1), max_wait: Duration::from_secs(15 * 60) };

/// For a client, whatever usernames or tokens it tries: fifty free, then waits.
pub const PER_CLIENT: Rule =
    Rule { free: 50, window: Duration::from_secs(15 * 60), first_wait: Duration::from_secs(1), max_wait: Duration::from_secs(15 * 60) };

/// A key with its rule.
pub type Keyed = (String, Rule);

/// The key of a username tried from a client (no client: the username alone).
pub fn user_key(username: &str, client: Option<std::net::IpAddr>) -> String {
    format!("user:{}|client:{}", username.to_ascii_lowercase(), client.map(|c| c.to_string()).unwrap_or_default())
}

/// The key of a client.
pub fn client_key(client: std::net::IpAddr) -> String {
    format!("client:{client}")
}

fn doc_id(key: &str) -> String {
    hex::encode(&Sha256::digest(key.as_bytes())[..16])
}

fn rate_limited(wait: Duration) -> Refusal {
    let ms = wait.as_millis().max(1) as u64;
    Refusal::new("rate-limited", "too many failed attempts; wait before trying again").retryable().with_data(json!({ "retryAfterMs": ms }))
}

/// Count an attempt under every key now, unless one of them must still wait (then nothing is
/// counted and the answer is `rate-limited` with the longest wait). Counted before the
/// attempt is checked, in one transaction, so concurrent attempts on any node see each other;
/// [`take_back`] when it did not fail.
pub async fn begin(store: &Store, keys: &[Keyed]) -> Result<()> {
    store
        .transact(|tx| async move {
            let now = now_ms();
            let mut counted = Vec::with_capacity(keys.len());
            let mut wait = Duration::ZERO;
            for (key, rule) in keys {
                let id = doc_id(key);
                let doc = tx.get(LOGIN_ATTEMPTS, &id).await?;
                let (failures, last) = doc
                    .as_ref()
                    .map(|d| (d.data["failures"].as_u64().unwrap_or(0), d.data["lastMs"].as_u64().unwrap_or(0)))
                    .filter(|(_, last)| now.saturating_sub(*last) < rule.window.as_millis() as u64)
                    .unwrap_or((0, 0));
                let ready_at = last + rule.wait_after(failures).as_millis() as u64;
                wait = wait.max(Duration::from_millis(ready_at.saturating_sub(now)));
                counted.push((id, doc.map(|d| d.revision), failures + 1));
            }
            if !wait.is_zero() {
                return Err(rate_limited(wait));
            }
            for (id, revision, failures) in counted {
                let data = json!({ "failures": failures, "lastMs": now });
                match revision {
                    Some(revision) => tx.replace(LOGIN_ATTEMPTS, &id, revision, data).await.map(drop)?,
                    None => tx.insert(LOGIN_ATTEMPTS, &id, data).await.map(drop)?,
                }
            }
            Ok(())
        })
        .await
}

/// Take back the attempt [`begin`] counted under `keys` (it succeeded, or was never checked).
pub async fn take_back(store: &Store, keys: &[Keyed]) -> Result<()> {
    store
        .transact(|tx| async move {
            for (key, _) in keys {
                let id = doc_id(key);
                let Some(doc) = tx.get(LOGIN_ATTEMPTS, &id).await? else { continue };
                let failures = doc.data["failures"].as_u64().unwrap_or(0);
                if failures <= 1 {
                    tx.delete(LOGIN_ATTEMPTS, &id, doc.revision).await?;
                } else {
                    let data = json!({ "failures": failures - 1, "lastMs": doc.data["lastMs"] });
                    tx.replace(LOGIN_ATTEMPTS, &id, doc.revision, data).await?;
                }
            }
            Ok(())
        })
        .await
}

/// Forget the count under `key` (after a successful login).
pub async fn clear(store: &Store, key: &str) -> Result<()> {
    let id = doc_id(key);
    store
        .transact(|tx| {
            let id = id.clone();
            async move {
                if let Some(doc) = tx.get(LOGIN_ATTEMPTS, &id).await? {
                    tx.delete(LOGIN_ATTEMPTS, &id, doc.revision).await?;
                }
                Ok(())
            }
        })
        .await
}

/// Delete counts whose window has passed (the session reaper's round); how many went.
pub async fn reap(store: &Store) -> Result<usize> {
    let now = now_ms();
    let window = PER_USER_AND_CLIENT.window.max(PER_CLIENT.window).as_millis() as u64;
    crate::reap(store, LOGIN_ATTEMPTS, |data| now.saturating_sub(data["lastMs"].as_u64().unwrap_or(0)) >= window).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_after_the_free_failures_up_to_the_cap() {
        let rule = PER_USER_AND_CLIENT;
        assert_eq!(rule.wait_after(0), Duration::ZERO);
        assert_eq!(rule.wait_after(4), Duration::ZERO);
        assert_eq!(rule.wait_after(5), Duration::from_secs(1));
        assert_eq!(rule.wait_after(6), Duration::from_secs(2));
        assert_eq!(rule.wait_after(9), Duration::from_secs(16));
        assert_eq!(rule.wait_after(1000), Duration::from_secs(15 * 60));
    }

    #[test]
    fn keys_name_the_user_and_the_client_but_are_stored_as_digests() {
        let client = Some("198.51.100.7".parse().unwrap());
        assert_eq!(user_key("Admin", client), "user:admin|client:198.51.100.7");
        assert_ne!(user_key("admin", client), user_key("admin", Some("203.0.113.9".parse().unwrap())));
        assert_eq!(doc_id(&user_key("admin", client)).len(), 32);
        assert!(!doc_id(&user_key("admin", client)).contains("admin"));
    }
}
