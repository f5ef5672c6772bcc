//! The agent's state directory: `credential.json` (the node credential, private),
//! `status.json` (the last beat's outcome and the last hostname apply, for `status`) and, on a
//! node that runs the cluster's relay, `relay-config.json` (the last `relay.config` pushed).
//!
//! The directory is mode 0700 and owned by the agent's user; the credential file is mode 0600
//! with one link. Looser permissions are refused by name before anything is read. The credential
//! is first written no-clobber (`capstan_core::private_file::write_new`) and afterwards replaced
//! atomically (temporary file, fsync, rename, directory fsync), so a crash leaves the old file
//! or the new one, never a torn one. Writers hold an advisory lock (`.lock`), so `rotate` and a
//! running agent never interleave their read-modify-writes.

use crate::token::Token;
use capstan_core::Refusal;
use capstan_core::private_file;
use capstan_core::wire::heartbeat::HostApply;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where the state lives when neither `--state-dir` nor `CAPSTAN_AGENT_STATE_DIR` says.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/capstan-agent";
const CREDENTIAL_FILE: &str = "credential.json";
const STATUS_FILE: &str = "status.json";
const RELAY_CONFIG_FILE: &str = "relay-config.json";
const LOCK_FILE: &str = ".lock";

/// The node credential as kept in `credential.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credential {
    /// The Capstan origin the node enrolled with (`https://…`, or `http://` to loopback or a dev
    /// host).
    pub origin: String,
    /// The node's id.
    pub node_id: String,
    /// The cluster the node belongs to.
    pub cluster_id: String,
    /// The bearer token in use.
    pub token: Token,
    /// The credential generation the token belongs to (the `expectedGeneration` of a rotation).
    #[serde(default = "first_generation")]
    pub credential_generation: u64,
    /// Material of a rotation asked for but not yet confirmed (kept before asking, so a lost
    /// answer can be asked for again with the same material).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_token: Option<Token>,
    /// The `mutationId` of that rotation (a retry reuses it, so the host replays its answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_mutation_id: Option<String>,
    /// The origin is a dev host reached over plain http (`enroll --dev-host`); said at every start.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dev_host: bool,
}

fn first_generation() -> u64 {
    1
}

/// The outcome of one beat, kept for `capstan-agent status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BeatRecord {
    /// When (milliseconds since the epoch).
    pub at_ms: u64,
    /// `accepted`, `unreachable`, `unauthorized` or `refused`.
    pub outcome: String,
    /// The refusal code, when Capstan refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// What happened, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The credential generation an accepted beat committed under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_generation: Option<u64>,
    /// The last beat Capstan accepted (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_accepted_at_ms: Option<u64>,
}

/// What `status.json` holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The last beat's outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_beat: Option<BeatRecord>,
    /// The last hostname apply (reported on every beat after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_apply: Option<HostApply>,
}

/// What `relay-config.json` holds: the last `relay.config` push the relay applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RelayConfig {
    /// The digest the host sent with it (a push with the same digest is skipped).
    pub digest: String,
    /// The whole configuration, as pushed.
    pub config: serde_json::Value,
    /// When it was received (milliseconds since the epoch).
    pub received_at: u64,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

/// An exclusive hold on the state directory's lock; released on drop.
pub struct Lock(#[allow(dead_code)] File);

fn refuse(code: &'static str, message: String, path: &Path) -> Refusal {
    Refusal::new(code, message).with_data(json!({ "path": path.display().to_string() }))
}

fn io_refusal(code: &'static str, what: &str, path: &Path, e: std::io::Error) -> Refusal {
    refuse(code, format!("{what} {} failed: {}", path.display(), e.kind()), path).detail(e)
}

impl StateDir {
    /// The state directory at `path` (made absolute).
    pub fn new(path: impl Into<PathBuf>) -> StateDir {
        let path = path.into();
        StateDir { path: std::path::absolute(&path).unwrap_or(path) }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The credential file's path.
    pub fn credential_path(&self) -> PathBuf {
        self.path.join(CREDENTIAL_FILE)
    }

    fn status_path(&self) -> PathBuf {
        self.path.join(STATUS_FILE)
    }

    /// Create the directory (mode 0700) when it is missing, narrow it to 0700 when it is ours and
    /// empty; refuse it when it is not private otherwise.
    pub fn create(&self) -> Result<(), Refusal> {
        match fs::symlink_metadata(&self.path) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if let Some(parent) = self.path.parent() {
                    fs::create_dir_all(parent).map_err(|e| io_refusal("state-dir-unusable", "creating", parent, e))?;
                }
                DirBuilder::new()
                    .mode(0o700)
                    .create(&self.path)
                    .map_err(|e| io_refusal("state-dir-unusable", "creating", &self.path, e))?;
                // the umask may have narrowed it further; say exactly 0700
                fs::set_permissions(&self.path, fs::Permissions::from_mode(0o700))
                    .map_err(|e| io_refusal("state-dir-unusable", "setting permissions on", &self.path, e))?;
            }
            Err(e) => return Err(io_refusal("state-dir-unusable", "reading", &self.path, e)),
            // an empty directory of ours made open by hand (mkdir -p) holds nothing yet: narrow it
            Ok(meta)
                if meta.is_dir()
                    && meta.mode() & 0o077 != 0
                    && meta.uid() == rustix::process::geteuid().as_raw()
                    && fs::read_dir(&self.path).is_ok_and(|mut entries| entries.next().is_none()) =>
            {
                fs::set_permissions(&self.path, fs::Permissions::from_mode(0o700))
                    .map_err(|e| io_refusal("state-dir-unusable", "setting permissions on", &self.path, e))?;
                tracing::info!(path = %self.path.display(), "the empty state directory was open to others: now mode 0700");
            }
            Ok(_) => {}
        }
        self.check()
    }

    /// Refuse a directory that is missing, a symbolic link, not owned by this user, or open to
    /// group or others.
    pub fn check(&self) -> Result<(), Refusal> {
        let meta = fs::symlink_metadata(&self.path).map_err(|e| match e.kind() {
            ErrorKind::NotFound => refuse(
                "not-enrolled",
                format!("the state directory {} does not exist; enroll this machine first (capstan-agent enroll)", self.path.display()),
                &self.path,
            ),
            _ => io_refusal("state-dir-unusable", "reading", &self.path, e),
        })?;
        if meta.file_type().is_symlink() || !meta.is_dir() {
            return Err(refuse(
                "state-dir-unusable",
                format!("{} is not a directory (symbolic links are refused)", self.path.display()),
                &self.path,
            ));
        }
        if meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(refuse(
                "state-dir-not-owned",
                format!("the state directory {} must be owned by the user running capstan-agent", self.path.display()),
                &self.path,
            ));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(refuse(
                "state-dir-permissions",
                format!(
                    "the state directory {} is mode {:o}; it must not be open to group or others (chmod 700)",
                    self.path.display(),
                    meta.mode() & 0o777
                ),
                &self.path,
            ));
        }
        Ok(())
    }

    /// Hold the directory's lock until the answer is dropped.
    pub fn lock(&self) -> Result<Lock, Refusal> {
        self.check()?;
        let path = self.path.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc_o_nofollow())
            .open(&path)
            .map_err(|e| io_refusal("state-dir-unusable", "opening", &path, e))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io_refusal("state-dir-unusable", "locking", &path, e.into()))?;
        Ok(Lock(file))
    }

    /// Whether a credential file exists (whatever it holds).
    pub fn has_credential(&self) -> bool {
        fs::symlink_metadata(self.credential_path()).is_ok()
    }

    /// Read the credential under the strict rules.
    pub fn read_credential(&self) -> Result<Credential, Refusal> {
        self.check()?;
        let path = self.credential_path();
        let bytes = private_file::read_strict(&path).map_err(|r| match r.code.as_ref() {
            "input-missing" => refuse(
                "not-enrolled",
                format!("{} does not exist; enroll this machine first (capstan-agent enroll)", path.display()),
                &path,
            ),
            "input-permissions" => refuse(
                "state-file-permissions",
                format!("{} must not be readable or writable by group or others (chmod 600)", path.display()),
                &path,
            ),
            _ => r,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| {
            // the category and position only: serde's message could quote what the file holds
            refuse(
                "state-file-invalid",
                format!(
                    "{} is not a credential file ({:?} error at line {}, column {})",
                    path.display(),
                    e.classify(),
                    e.line(),
                    e.column()
                ),
                &path,
            )
        })
    }

    /// Write the first credential: no-clobber, so a second enrollment never replaces one.
    pub fn write_new_credential(&self, credential: &Credential) -> Result<(), Refusal> {
        self.check()?;
        let bytes = zeroize::Zeroizing::new(serde_json::to_vec_pretty(credential).map_err(Refusal::internal)?);
        private_file::write_new(&self.credential_path(), &bytes).map_err(|r| match r.code.as_ref() {
            "output-exists" => already_enrolled(&self.credential_path()),
            _ => r,
        })
    }

    /// Replace the credential atomically (the caller holds the lock).
    pub fn replace_credential(&self, credential: &Credential, _lock: &Lock) -> Result<(), Refusal> {
        self.check()?;
        let bytes = zeroize::Zeroizing::new(serde_json::to_vec_pretty(credential).map_err(Refusal::internal)?);
        let path = self.credential_path();
        private_file::replace_atomically(&path, &bytes, 0o600).map_err(|e| io_refusal("state-write-failed", "replacing", &path, e))
    }

    /// The last recorded status; empty when none was kept (or it cannot be read).
    pub fn read_status(&self) -> Status {
        private_file::read_strict(&self.status_path()).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    /// Keep `status` (atomically, mode 0600).
    pub fn write_status(&self, status: &Status) -> Result<(), Refusal> {
        self.write_private(&self.status_path(), status)
    }

    /// The relay configuration file's path.
    pub fn relay_config_path(&self) -> PathBuf {
        self.path.join(RELAY_CONFIG_FILE)
    }

    /// The relay configuration last kept; `None` when no push was ever applied. A file that is
    /// not private or not a configuration is refused by name.
    pub fn read_relay_config(&self) -> Result<Option<RelayConfig>, Refusal> {
        self.check()?;
        let path = self.relay_config_path();
        let bytes = match private_file::read_strict(&path) {
            Ok(bytes) => bytes,
            Err(r) if r.is("input-missing") => return Ok(None),
            Err(r) if r.is("input-permissions") => {
                return Err(refuse(
                    "state-file-permissions",
                    format!("{} must not be readable or writable by group or others (chmod 600)", path.display()),
                    &path,
                ));
            }
            Err(r) => return Err(r),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            refuse(
                "state-file-invalid",
                format!(
                    "{} is not a relay configuration file ({:?} error at line {}, column {})",
                    path.display(),
                    e.classify(),
                    e.line(),
                    e.column()
                ),
                &path,
            )
        })
    }

    /// Keep the relay configuration (atomically, mode 0600).
    pub fn write_relay_config(&self, config: &RelayConfig) -> Result<(), Refusal> {
        self.write_private(&self.relay_config_path(), config)
    }

    /// The one writer of the directory's private JSON files other than the credential: checks
    /// the directory, then replaces `path` atomically with a mode 0600 file.
    fn write_private(&self, path: &Path, value: &impl Serialize) -> Result<(), Refusal> {
        self.check()?;
        let bytes = serde_json::to_vec_pretty(value).map_err(Refusal::internal)?;
        private_file::replace_atomically(path, &bytes, 0o600).map_err(|e| io_refusal("state-write-failed", "replacing", path, e))
    }
}

/// `already-enrolled`: a credential exists; enrolling again would strand it.
pub fn already_enrolled(path: &Path) -> Refusal {
    refuse(
        "already-enrolled",
        format!("{} already holds a node credential; this machine is enrolled (remove the file to enroll it anew)", path.display()),
        path,
    )
}

fn libc_o_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_core::wire::heartbeat::ApplyOutcome;

    fn credential() -> Credential {
        Credential {
            origin: "https://capstan.example".into(),
            node_id: "node_0123".into(),
            cluster_id: "cls_1".into(),
            token: Token::draw().unwrap(),
            credential_generation: 1,
            pending_token: None,
            pending_mutation_id: None,
            dev_host: false,
        }
    }

    fn state_dir() -> (tempfile::TempDir, StateDir) {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::new(root.path().join("state"));
        dir.create().unwrap();
        (root, dir)
    }

    #[test]
    fn the_directory_is_created_private_and_the_file_written_0600() {
        let (_root, dir) = state_dir();
        assert_eq!(fs::metadata(dir.path()).unwrap().mode() & 0o777, 0o700);
        let cred = credential();
        dir.write_new_credential(&cred).unwrap();
        let meta = fs::metadata(dir.credential_path()).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(dir.read_credential().unwrap(), cred);
        let json: serde_json::Value = serde_json::from_slice(&fs::read(dir.credential_path()).unwrap()).unwrap();
        let mut members: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
        members.sort();
        assert_eq!(members, ["clusterId", "credentialGeneration", "nodeId", "origin", "token"]);
    }

    #[test]
    fn a_second_enrollment_never_replaces_the_credential() {
        let (_root, dir) = state_dir();
        let first = credential();
        dir.write_new_credential(&first).unwrap();
        assert_eq!(dir.write_new_credential(&credential()).unwrap_err().code, "already-enrolled");
        assert_eq!(dir.read_credential().unwrap(), first);
    }

    #[test]
    fn looser_permissions_are_refused_by_name() {
        let (_root, dir) = state_dir();
        dir.write_new_credential(&credential()).unwrap();
        fs::set_permissions(dir.credential_path(), fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(dir.read_credential().unwrap_err().code, "state-file-permissions");
        fs::set_permissions(dir.credential_path(), fs::Permissions::from_mode(0o600)).unwrap();
        dir.read_credential().unwrap();

        for mode in [0o750, 0o701, 0o770, 0o755] {
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(dir.read_credential().unwrap_err().code, "state-dir-permissions", "mode {mode:o}");
            assert_eq!(dir.create().unwrap_err().code, "state-dir-permissions", "a directory holding a credential is not fixed");
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        dir.read_credential().unwrap();
    }

    #[test]
    fn an_empty_directory_made_by_hand_is_narrowed_to_0700() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("made-by-hand");
        fs::create_dir(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        let dir = StateDir::new(&path);
        dir.create().unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_missing_credential_or_directory_says_not_enrolled() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::new(root.path().join("absent"));
        assert_eq!(dir.read_credential().unwrap_err().code, "not-enrolled");
        dir.create().unwrap();
        assert_eq!(dir.read_credential().unwrap_err().code, "not-enrolled");
    }

    #[test]
    fn a_symlinked_credential_or_directory_is_refused() {
        let (root, dir) = state_dir();
        let elsewhere = root.path().join("elsewhere.json");
        fs::write(&elsewhere, b"{}").unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.credential_path()).unwrap();
        assert_eq!(dir.read_credential().unwrap_err().code, "input-symlink");

        let linked = StateDir::new(root.path().join("linked-dir"));
        std::os::unix::fs::symlink(dir.path(), linked.path()).unwrap();
        assert_eq!(linked.check().unwrap_err().code, "state-dir-unusable");
    }

    #[test]
    fn replacing_is_atomic_and_leaves_no_temporary_file() {
        let (_root, dir) = state_dir();
        let mut cred = credential();
        dir.write_new_credential(&cred).unwrap();
        let lock = dir.lock().unwrap();
        cred.pending_token = Some(Token::draw().unwrap());
        cred.pending_mutation_id = Some("rot_1".into());
        dir.replace_credential(&cred, &lock).unwrap();
        drop(lock);
        assert_eq!(dir.read_credential().unwrap(), cred);
        let meta = fs::metadata(dir.credential_path()).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.nlink()), (0o600, 1));
        let names: Vec<String> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");

        // a replace that cannot complete leaves the old file whole
        let before = fs::read(dir.credential_path()).unwrap();
        let lock = dir.lock().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o500)).unwrap();
        let failed = dir.replace_credential(&credential(), &lock);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        if rustix::process::geteuid().is_root() {
            // root writes through a read-only directory: nothing to prove here
            drop(failed);
        } else {
            assert_eq!(failed.unwrap_err().code, "state-write-failed");
            assert_eq!(fs::read(dir.credential_path()).unwrap(), before);
        }
    }

    #[test]
    fn a_corrupt_file_is_refused_without_quoting_it() {
        let (_root, dir) = state_dir();
        dir.write_new_credential(&credential()).unwrap();
        let lock = dir.lock().unwrap();
        private_file::replace_atomically(&dir.credential_path(), br#"{"origin": "zzsecretzz", "token": 5}"#, 0o600).unwrap();
        drop(lock);
        let err = dir.read_credential().unwrap_err();
        assert_eq!(err.code, "state-file-invalid");
        assert!(!err.to_string().contains("zzsecretzz"), "{err}");
    }

    #[test]
    fn the_credential_debug_output_hides_both_tokens() {
        let mut cred = credential();
        cred.pending_token = Some(Token::draw().unwrap());
        let secrets =
            [&cred.token, cred.pending_token.as_ref().unwrap()].map(|t| serde_json::to_value(t).unwrap().as_str().unwrap().to_string());
        let debug = format!("{cred:?}");
        for secret in secrets {
            assert!(!debug.contains(&secret), "{debug}");
        }
    }

    #[test]
    fn the_relay_config_is_kept_private_and_read_back() {
        let (_root, dir) = state_dir();
        assert_eq!(dir.read_relay_config().unwrap(), None);
        let config = RelayConfig { digest: "d1".into(), config: json!({"cluster": {"id": "cls_1"}}), received_at: 7 };
        dir.write_relay_config(&config).unwrap();
        assert_eq!(dir.read_relay_config().unwrap(), Some(config));
        assert_eq!(fs::metadata(dir.relay_config_path()).unwrap().mode() & 0o777, 0o600);
        fs::set_permissions(dir.relay_config_path(), fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(dir.read_relay_config().unwrap_err().code, "state-file-permissions");
    }

    #[test]
    fn status_round_trips_and_defaults_to_empty() {
        let (_root, dir) = state_dir();
        assert_eq!(dir.read_status(), Status::default());
        let status = Status {
            last_beat: Some(BeatRecord {
                at_ms: 5,
                outcome: "accepted".into(),
                code: None,
                message: None,
                credential_generation: Some(1),
                last_accepted_at_ms: Some(5),
            }),
            host_apply: Some(HostApply { generation: 2, hostname: "db-1".into(), outcome: ApplyOutcome::Applied, reason: None }),
        };
        dir.write_status(&status).unwrap();
        assert_eq!(dir.read_status(), status);
        assert_eq!(fs::metadata(dir.path().join(STATUS_FILE)).unwrap().mode() & 0o777, 0o600);
    }
}
