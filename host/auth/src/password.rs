//! Password verifiers: salted scrypt in PHC string form, and the password policy.

use capstan_core::refusal::{Refusal, Result};
use scrypt::Scrypt;
use scrypt::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use std::sync::LazyLock;
use tokio::sync::Semaphore;

/// New passwords: at least this many characters …
pub const MIN_CHARS: usize = 20;
/// … and at most this many UTF-8 bytes.
pub const MAX_BYTES: usize = 1024;

/// scrypt cost: N = 2^15, r = 8, p = 1 (32 MiB, on the order of 0.1 s per check).
fn params() -> scrypt::Params {
    scrypt::Params::new(15, 8, 1, 32).expect("valid scrypt parameters")
}

/// Refuse a new password shorter than [`MIN_CHARS`] characters or longer than [`MAX_BYTES`]
/// bytes.
pub fn check_policy(password: &str) -> Result<()> {
    if password.chars().count() < MIN_CHARS {
        return Err(Refusal::new("password-too-short", format!("a password needs at least {MIN_CHARS} characters")));
    }
    if password.len() > MAX_BYTES {
        return Err(Refusal::new("password-too-long", format!("a password may have at most {MAX_BYTES} UTF-8 bytes")));
    }
    Ok(())
}

/// A fresh salted verifier for `password` (CPU-heavy: call from a blocking task).
pub fn hash(password: &str) -> Result<String> {
    let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>()).map_err(|e| Refusal::internal(format!("salt: {e}")))?;
    Scrypt
        .hash_password_customized(password.as_bytes(), None, None, params(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| Refusal::internal(format!("scrypt failed: {e}")))
}

/// Whether `password` matches `verifier` (constant-time comparison inside the library).
pub fn verify(password: &str, verifier: &str) -> bool {
    match PasswordHash::new(verifier) {
        Ok(parsed) => Scrypt.verify_password(password.as_bytes(), &parsed).is_ok(),
        Err(_) => false,
    }
}

/// A verifier no password matches, checked when a username is unknown so that a wrong
/// username costs the same time as a wrong password.
pub fn decoy_verify(password: &str) {
    static DECOY: LazyLock<String> = LazyLock::new(|| hash("capstan-decoy-password-nobody-has").unwrap_or_default());
    let _ = verify(password, &DECOY);
}

/// Bounds the scrypt work (32 MiB and ~0.1 s of a core each) running at once: `slots` at a
/// time, at most `queue` more waiting their turn, and anything beyond refused `rate-limited`
/// at once, so a flood of logins costs bounded memory and never queues without end.
pub struct Gate {
    admitted: Semaphore,
    running: Semaphore,
}

impl Gate {
    /// A gate running `slots` at once (at least one) with `queue` more waiting.
    pub fn new(slots: usize, queue: usize) -> Gate {
        let slots = slots.max(1);
        Gate { admitted: Semaphore::new(slots + queue), running: Semaphore::new(slots) }
    }

    /// One per core, eight waiting per core.
    pub fn for_this_machine() -> Gate {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        Gate::new(cores, 8 * cores)
    }

    /// Run `work` (scrypt) on the blocking pool when a slot is free; `rate-limited`
    /// (retryable) when the queue is full.
    pub async fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let Ok(_admitted) = self.admitted.try_acquire() else {
            return Err(Refusal::new("rate-limited", "too many passwords are being checked at once; try again shortly")
                .retryable()
                .with_data(serde_json::json!({ "retryAfterMs": 1000 })));
        };
        let _running = self.running.acquire().await.map_err(Refusal::internal)?;
        tokio::task::spawn_blocking(work).await.map_err(Refusal::internal)
    }
}

/// A strong generated password: 24 characters from a 62-letter alphabet (~143 bits).
pub fn generate() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    let mut out = String::with_capacity(24);
    while out.len() < 24 {
        let byte = rand::random::<u8>() as usize;
        // rejection sampling keeps the distribution uniform
        if byte < ALPHABET.len() * (256 / ALPHABET.len()) {
            out.push(ALPHABET[byte % ALPHABET.len()] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_gate_runs_its_slots_queues_a_few_and_sheds_the_rest_by_name() {
        let gate = std::sync::Arc::new(Gate::new(1, 1));
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let running = tokio::spawn({
            let gate = gate.clone();
            async move {
                gate.run(move || {
                    let _ = started_tx.send(());
                    held.recv().ok();
                    "first"
                })
                .await
            }
        });
        started.await.unwrap();
        // one waits its turn; one more is shed at once
        let queued = tokio::spawn({
            let gate = gate.clone();
            async move { gate.run(|| "second").await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let shed = gate.run(|| "third").await.unwrap_err();
        assert_eq!((shed.code.as_ref(), shed.retryable), ("rate-limited", true));
        assert!(!queued.is_finished(), "the queued one waits for the slot");
        release.send(()).unwrap();
        assert_eq!(running.await.unwrap().unwrap(), "first");
        assert_eq!(queued.await.unwrap().unwrap(), "second");
        assert_eq!(gate.run(|| "again").await.unwrap(), "again", "slots come back");
    }

    #[test]
    fn verifiers_are_salted_and_check_the_password() {
        let a = hash("correct horse battery staple").unwrap();
        let b = hash("correct horse battery staple").unwrap();
        assert_ne!(a, b, "salted");
        assert!(a.starts_with("$scrypt$"));
        assert!(verify("correct horse battery staple", &a));
        assert!(!verify("correct horse battery stapler", &a));
        assert!(!verify("anything", "not a verifier"));
    }

    #[test]
    fn the_policy_counts_characters_and_bytes() {
        assert_eq!(check_policy("short").unwrap_err().code, "password-too-short");
        check_policy(&"é".repeat(20)).unwrap();
        assert_eq!(check_policy(&"é".repeat(513)).unwrap_err().code, "password-too-long");
        check_policy(&"a".repeat(1024)).unwrap();
    }

    #[test]
    fn generated_passwords_pass_the_policy_and_differ() {
        let a = generate();
        check_policy(&a).unwrap();
        assert_ne!(a, generate());
    }
}
