//! Applying the hostname intent: a pluggable [`Applier`].
//!
//! - [`Hostnamectl`]: `hostnamectl set-hostname NAME` (root, systemd), the real one;
//! - [`HostnameFile`]: writes the name to a file (`--hostname-file`), for tests and for
//!   machines whose hostname another tool applies from a file;
//! - [`Unavailable`]: neither root nor a file: every apply fails, saying why.
//!
//! Whether an intent needs applying is decided by [`decide`], a pure function of the intent and
//! the last apply, so a pass that decides nothing does nothing.

use capstan_core::wire::heartbeat::{ApplyOutcome, HostApply};
use std::path::PathBuf;
use std::process::Command;

/// Sets the machine's hostname.
pub trait Applier: Send + Sync {
    /// Set the hostname to `name` (one lowercase DNS label); the error says why it failed.
    fn apply(&self, name: &str) -> Result<(), String>;
    /// The hostname as this applier sees it now (`None`: ask the operating system).
    fn current(&self) -> Option<String>;
    /// What it is, for the log.
    fn describe(&self) -> String;
}

/// `hostnamectl set-hostname`.
pub struct Hostnamectl;

impl Applier for Hostnamectl {
    fn apply(&self, name: &str) -> Result<(), String> {
        let output = Command::new("hostnamectl").arg("set-hostname").arg(name).output().map_err(|e| format!("running hostnamectl: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr);
            Err(format!("hostnamectl set-hostname failed ({}): {}", output.status, capstan_core::text::truncate(stderr.trim(), 300)))
        }
    }

    fn current(&self) -> Option<String> {
        None
    }

    fn describe(&self) -> String {
        "hostnamectl".into()
    }
}

/// Writes the hostname (and a newline) to a file, atomically.
pub struct HostnameFile(pub PathBuf);

impl Applier for HostnameFile {
    fn apply(&self, name: &str) -> Result<(), String> {
        capstan_core::private_file::replace_atomically(&self.0, format!("{name}\n").as_bytes(), 0o644)
            .map_err(|e| format!("writing {}: {e}", self.0.display()))
    }

    fn current(&self) -> Option<String> {
        std::fs::read_to_string(&self.0).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
    }

    fn describe(&self) -> String {
        format!("the hostname file {}", self.0.display())
    }
}

/// No way to set the hostname.
pub struct Unavailable;

impl Applier for Unavailable {
    fn apply(&self, _name: &str) -> Result<(), String> {
        Err("the agent runs without root and without --hostname-file; it cannot set the hostname".into())
    }

    fn current(&self) -> Option<String> {
        None
    }

    fn describe(&self) -> String {
        "nothing (not root, no --hostname-file)".into()
    }
}

/// The applier for this run: the file when one is named, else `hostnamectl` as root.
pub fn choose(hostname_file: Option<PathBuf>, is_root: bool) -> Box<dyn Applier> {
    match hostname_file {
        Some(path) => Box::new(HostnameFile(path)),
        None if is_root => Box::new(Hostnamectl),
        None => Box::new(Unavailable),
    }
}

/// Whether the intent (`hostname` at `generation`) needs applying, given the last apply: a new
/// generation or name does; one already applied does not; a failed one is tried again.
pub fn decide(hostname: Option<&str>, generation: u64, last: Option<&HostApply>) -> Option<String> {
    let hostname = hostname?;
    if generation == 0 {
        return None;
    }
    match last {
        Some(last) if last.generation == generation && last.hostname == hostname && last.outcome == ApplyOutcome::Applied => None,
        // an older answer (a stale replica) never walks the applied name back
        Some(last) if last.generation > generation => None,
        _ => Some(hostname.to_string()),
    }
}

/// Apply `hostname` at `generation` and describe the outcome as reported.
pub fn apply(applier: &dyn Applier, hostname: &str, generation: u64) -> HostApply {
    let result = if crate::origin::is_hostname_label(hostname) {
        applier.apply(hostname)
    } else {
        Err("the intent is not one lowercase DNS label".to_string())
    };
    match result {
        Ok(()) => HostApply { generation, hostname: hostname.to_string(), outcome: ApplyOutcome::Applied, reason: None },
        // the host takes 1–256 bytes of text without control characters
        Err(reason) => HostApply {
            generation,
            hostname: one_line(hostname, 63),
            outcome: ApplyOutcome::Failed,
            reason: Some(one_line(&reason, MAX_REASON)),
        },
    }
}

/// The longest `reason` reported (bytes, before the ellipsis a cut adds).
const MAX_REASON: usize = 240;

/// `text` on one line (control characters escaped), at most about `max` bytes, never empty.
fn one_line(text: &str, max: usize) -> String {
    let cut = capstan_core::text::truncate(&capstan_core::text::escape_control(text), max);
    if cut.is_empty() { "(empty)".into() } else { cut }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(generation: u64, hostname: &str) -> HostApply {
        HostApply { generation, hostname: hostname.into(), outcome: ApplyOutcome::Applied, reason: None }
    }

    #[test]
    fn the_file_applier_writes_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = HostnameFile(dir.path().join("hostname"));
        assert_eq!(file.current(), None);
        let outcome = apply(&file, "db-7", 2);
        assert_eq!(outcome, applied(2, "db-7"));
        assert_eq!(std::fs::read_to_string(dir.path().join("hostname")).unwrap(), "db-7\n");
        assert_eq!(file.current().as_deref(), Some("db-7"));
        apply(&file, "db-8", 3);
        assert_eq!(file.current().as_deref(), Some("db-8"));
    }

    #[test]
    fn a_failure_is_reported_with_its_reason() {
        let missing = HostnameFile("/nonexistent-dir/for/sure/hostname".into());
        let outcome = apply(&missing, "db-7", 2);
        assert_eq!(outcome.outcome, ApplyOutcome::Failed);
        assert!(outcome.reason.unwrap().contains("/nonexistent-dir"));
        let outcome = apply(&Unavailable, "db-7", 2);
        assert_eq!(outcome.outcome, ApplyOutcome::Failed);
        let dir = tempfile::tempdir().unwrap();
        let file = HostnameFile(dir.path().join("hostname"));
        let long = apply(&FailsWith("line one\nline two ".repeat(40)), "db-7", 2);
        let reason = long.reason.unwrap();
        assert!(reason.len() <= 256 && !reason.chars().any(char::is_control), "{reason}");
        let refused = apply(&file, "Not A Label", 4);
        assert_eq!(refused.outcome, ApplyOutcome::Failed);
        assert!(!dir.path().join("hostname").exists(), "an invalid name is never applied");
    }

    struct FailsWith(String);

    impl Applier for FailsWith {
        fn apply(&self, _name: &str) -> Result<(), String> {
            Err(self.0.clone())
        }
        fn current(&self) -> Option<String> {
            None
        }
        fn describe(&self) -> String {
            "failing".into()
        }
    }

    #[test]
    fn the_decision_applies_each_generation_once() {
        assert_eq!(decide(None, 0, None), None, "nothing asked");
        assert_eq!(decide(Some("a"), 0, None), None);
        assert_eq!(decide(Some("web-1"), 1, None).as_deref(), Some("web-1"));
        assert_eq!(decide(Some("web-1"), 1, Some(&applied(1, "web-1"))), None, "already applied");
        assert_eq!(decide(Some("web-2"), 2, Some(&applied(1, "web-1"))).as_deref(), Some("web-2"));
        assert_eq!(decide(Some("web-1"), 1, Some(&applied(2, "web-2"))), None, "an older intent never wins");
        let failed = HostApply { outcome: ApplyOutcome::Failed, reason: Some("x".into()), ..applied(2, "web-2") };
        assert_eq!(decide(Some("web-2"), 2, Some(&failed)).as_deref(), Some("web-2"), "a failure is tried again");
    }

    #[test]
    fn the_applier_is_chosen_by_file_then_root() {
        assert!(choose(Some("/tmp/x".into()), true).describe().contains("/tmp/x"), "a file wins even as root");
        assert_eq!(choose(None, true).describe(), "hostnamectl");
        assert!(choose(None, false).describe().starts_with("nothing"));
    }
}
