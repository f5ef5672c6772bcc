//! Node identity: a node is its Ed25519 key pair, kept with its id in `node.json` in the state
//! directory (mode 0600). A node that comes back keeps both; a pinned id that differs from the
//! stored one replaces the identity with a new pair; a file that cannot be read as an
//! identity is never replaced (the registry may still hold its public key).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use capstan_core::refusal::{Refusal, Result};
use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The identity file's name in the state directory.
pub const FILE_NAME: &str = "node.json";

/// This node's identity: its id and its Ed25519 signing key.
pub struct NodeIdentity {
    /// The node id.
    pub id: String,
    key: SigningKey,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIdentity").field("id", &self.id).field("public_key", &self.public_key()).finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeFile {
    version: u32,
    node_id: String,
    private_key: String,
    public_key: String,
}

/// What [`NodeIdentity::load_or_create`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    /// No identity was stored: a new one was created.
    Created,
    /// The stored identity was kept.
    Reused,
    /// The pinned id differed from the stored one: a new key pair under the new id.
    Replaced {
        /// The id of the identity that was replaced.
        previous: String,
    },
}

/// Node ids: lowercase letters, digits and `-`, 1 to 63 characters, starting with a letter or
/// digit (they name files in the bucket and share one keyspace with user ids).
pub fn valid_node_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn invalid_input(message: String, path: &Path) -> Refusal {
    Refusal::new("invalid-input", message).with_data(json!({ "path": path.display().to_string() }))
}

impl NodeIdentity {
    /// The Ed25519 public key, base64.
    pub fn public_key(&self) -> String {
        B64.encode(self.key.verifying_key().as_bytes())
    }

    /// Sign `message` with the node's private key: the 64-byte Ed25519 signature.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        use ed25519_dalek::Signer;
        self.key.sign(message).to_bytes().to_vec()
    }

    /// Load the identity in `state_dir`, creating it on the first boot.
    pub fn load_or_create(state_dir: &Path, pinned: Option<&str>) -> Result<(Self, Loaded)> {
        if let Some(id) = pinned
            && !valid_node_id(id)
        {
            return Err(Refusal::new(
                "invalid-input",
                format!("node id {id:?} must be 1 to 63 of a-z 0-9 -, starting with a letter or digit"),
            )
            .with_data(json!({ "field": "nodeId" })));
        }
        let path = state_dir.join(FILE_NAME);
        let existing = match std::fs::read(&path) {
            Ok(bytes) => Some(Self::parse(&bytes, &path)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(invalid_input(format!("{} cannot be read: {}", path.display(), e.kind()), &path)),
        };
        match (existing, pinned) {
            (Some(identity), None) => Ok((identity, Loaded::Reused)),
            (Some(identity), Some(id)) if identity.id == id => Ok((identity, Loaded::Reused)),
            (Some(identity), Some(id)) => {
                let fresh = Self::generate(id.to_string());
                fresh.write(&path, true)?;
                Ok((fresh, Loaded::Replaced { previous: identity.id }))
            }
            (None, pinned) => {
                let id = pinned.map(str::to_string).unwrap_or_else(|| format!("node-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff));
                let fresh = Self::generate(id);
                std::fs::create_dir_all(state_dir)
                    .map_err(|e| invalid_input(format!("cannot create the state directory: {}", e.kind()), state_dir))?;
                fresh.write(&path, false)?;
                Ok((fresh, Loaded::Created))
            }
        }
    }

    fn generate(id: String) -> Self {
        NodeIdentity { id, key: SigningKey::from_bytes(&rand::random()) }
    }

    fn parse(bytes: &[u8], path: &Path) -> Result<Self> {
        let unreadable = |why: &str| {
            invalid_input(
                format!(
                    "{} is not a node identity ({why}); it is never replaced automatically — restore it or move it away",
                    path.display()
                ),
                path,
            )
        };
        let file: NodeFile = serde_json::from_slice(bytes).map_err(|_| unreadable("not the expected JSON"))?;
        if file.version != 1 || !valid_node_id(&file.node_id) {
            return Err(unreadable("unknown version or invalid id"));
        }
        let secret = Zeroizing::new(B64.decode(&file.private_key).map_err(|_| unreadable("private key is not base64"))?);
        let secret: [u8; 32] = secret.as_slice().try_into().map_err(|_| unreadable("private key has the wrong length"))?;
        let key = SigningKey::from_bytes(&secret);
        if B64.encode(key.verifying_key().as_bytes()) != file.public_key {
            return Err(unreadable("public key does not match the private key"));
        }
        Ok(NodeIdentity { id: file.node_id, key })
    }

    /// Write atomically (temporary file + rename), mode 0600. `replace` allows an existing file.
    fn write(&self, path: &Path, replace: bool) -> Result<()> {
        let file =
            NodeFile { version: 1, node_id: self.id.clone(), private_key: B64.encode(self.key.as_bytes()), public_key: self.public_key() };
        let text = Zeroizing::new(serde_json::to_vec_pretty(&file).map_err(Refusal::internal)?);
        let temp: PathBuf = path.with_extension(format!("tmp-{:08x}", rand::random::<u32>()));
        let io = |e: std::io::Error| Refusal::new("state-dir-unusable", format!("writing {} failed: {}", path.display(), e.kind()));
        let result = (|| {
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temp).map_err(io)?;
            f.write_all(&text).map_err(io)?;
            f.sync_all().map_err(io)?;
            if replace { std::fs::rename(&temp, path).map_err(io) } else { std::fs::hard_link(&temp, path).map_err(io) }
        })();
        let _ = std::fs::remove_file(&temp);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn first_boot_creates_and_later_boots_reuse() {
        let dir = tempfile::tempdir().unwrap();
        let (a, how) = NodeIdentity::load_or_create(dir.path(), None).unwrap();
        assert_eq!(how, Loaded::Created);
        assert!(valid_node_id(&a.id));
        assert_eq!(std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().permissions().mode() & 0o777, 0o600);
        let (b, how) = NodeIdentity::load_or_create(dir.path(), None).unwrap();
        assert_eq!(how, Loaded::Reused);
        assert_eq!((a.id.clone(), a.public_key()), (b.id.clone(), b.public_key()));
        let (c, how) = NodeIdentity::load_or_create(dir.path(), Some(&a.id)).unwrap();
        assert_eq!(how, Loaded::Reused);
        assert_eq!(c.public_key(), a.public_key());
    }

    #[test]
    fn a_different_pinned_id_gets_a_new_key_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = NodeIdentity::load_or_create(dir.path(), Some("alpha")).unwrap();
        let (b, how) = NodeIdentity::load_or_create(dir.path(), Some("beta")).unwrap();
        assert_eq!(how, Loaded::Replaced { previous: "alpha".into() });
        assert_eq!(b.id, "beta");
        assert_ne!(a.public_key(), b.public_key());
        let (again, _) = NodeIdentity::load_or_create(dir.path(), None).unwrap();
        assert_eq!(again.id, "beta");
    }

    #[test]
    fn an_unreadable_state_file_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        for garbage in
            [&b"not json"[..], b"{\"version\":1}", b"{\"version\":1,\"nodeId\":\"a\",\"privateKey\":\"AAAA\",\"publicKey\":\"AAAA\"}"]
        {
            std::fs::write(&path, garbage).unwrap();
            let err = NodeIdentity::load_or_create(dir.path(), None).unwrap_err();
            assert_eq!(err.code, "invalid-input");
            let err = NodeIdentity::load_or_create(dir.path(), Some("other")).unwrap_err();
            assert_eq!(err.code, "invalid-input", "a pinned id does not replace an unreadable file either");
            assert_eq!(std::fs::read(&path).unwrap(), garbage, "never replaced");
        }
        assert_eq!(NodeIdentity::load_or_create(dir.path(), Some("Bad_Id")).unwrap_err().code, "invalid-input");
    }
}
