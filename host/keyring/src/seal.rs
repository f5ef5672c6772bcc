//! Sealing under a KEK: AES-256-GCM with a fresh 96-bit nonce and an authenticated context.
//!
//! The context binds a sealed value to where it belongs (owner, purpose, ids, …): opening it
//! under any other context fails, so a sealed value cannot be moved between records. The
//! stored form names its profile and KEK, so opening picks the right key after a rotation.
//! This is the bottom layer of the secrets envelope engine (which seals per-version DEKs with
//! it), and of every host key kept in the store (the JWT signing key, …).

use super::Keyring;
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use capstan_core::refusal::{Refusal, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use zeroize::Zeroizing;

/// The sealing profile this build writes and opens, recorded in every [`Sealed`] value.
pub const PROFILE: &str = "aes-256-gcm";

/// A sealed value as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sealed {
    /// The sealing profile; only [`PROFILE`] opens.
    pub profile: String,
    /// The id of the KEK that sealed the value.
    pub kek_id: String,
    /// The 96-bit AES-GCM nonce, base64.
    pub nonce: String,
    /// The AES-256-GCM ciphertext with its authentication tag, base64.
    pub ciphertext: String,
}

/// The authenticated context: string pairs, canonically ordered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context(BTreeMap<String, String>);

impl Context {
    /// A context holding the single entry `purpose` = `purpose`.
    pub fn new(purpose: &str) -> Self {
        Context::default().with("purpose", purpose)
    }

    /// Add (or replace) the entry `key` = `value`.
    pub fn with(mut self, key: &str, value: &str) -> Self {
        self.0.insert(key.into(), value.into());
        self
    }

    /// The bytes GCM authenticates: `{"profile":…,"kekId":…,"context":{…}}`, the context's
    /// entries in key order.
    fn aad(&self, kek_id: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + self.0.iter().map(|(k, v)| k.len() + v.len() + 6).sum::<usize>());
        out.extend_from_slice(b"{\"profile\":");
        json_string(&mut out, PROFILE);
        out.extend_from_slice(b",\"kekId\":");
        json_string(&mut out, kek_id);
        out.extend_from_slice(b",\"context\":");
        json_object(&mut out, self.0.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        out.push(b'}');
        out
    }
}

/// `{"k":"v",…}` with the members in the order given, strings escaped as serde_json escapes them.
///
/// Authenticated data is written out here rather than left to a `serde_json` map: a map's
/// member order depends on the cargo feature `preserve_order` (the shipped binary has it through
/// the MongoDB driver, a crate's own tests do not), and sealed material must not stop opening
/// because a dependency changed. The order is the one the binary has always written.
pub fn json_object<'a>(out: &mut Vec<u8>, members: impl IntoIterator<Item = (&'a str, &'a str)>) {
    out.push(b'{');
    for (i, (key, value)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_string(out, key);
        out.push(b':');
        json_string(out, value);
    }
    out.push(b'}');
}

fn json_string(out: &mut Vec<u8>, text: &str) {
    serde_json::to_writer(&mut *out, text).expect("a string serializes");
}

fn not_readable(reason: &str) -> Refusal {
    Refusal::new("material-not-readable", "sealed material cannot be opened: it was altered or belongs to another context")
        .with_data(json!({ "reason": reason }))
}

impl Keyring {
    /// Seal `plaintext` under the active KEK, bound to `context`.
    pub fn seal(&self, context: &Context, plaintext: &[u8]) -> Result<Sealed> {
        let kek_id = self.active_kek_id().to_string();
        let kek = self.kek(&kek_id).ok_or_else(|| Refusal::internal("active KEK missing from a validated keyring"))?;
        let cipher = Aes256Gcm::new_from_slice(kek.bytes()).map_err(Refusal::internal)?;
        let nonce: [u8; 12] = rand::random();
        let aad = context.aad(&kek_id);
        let ciphertext = cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad: &aad })
            .map_err(|_| Refusal::internal("AES-GCM sealing failed"))?;
        Ok(Sealed { profile: PROFILE.into(), kek_id, nonce: B64.encode(nonce), ciphertext: B64.encode(ciphertext) })
    }

    /// Open a sealed value under the context it was sealed with. The plaintext is wiped on drop.
    pub fn open(&self, context: &Context, sealed: &Sealed) -> Result<Zeroizing<Vec<u8>>> {
        if sealed.profile != PROFILE {
            return Err(not_readable("profile"));
        }
        let kek = self.kek(&sealed.kek_id).ok_or_else(|| {
            Refusal::new("kek-unavailable", format!("the keyring has no KEK {:?}, which sealed this material", sealed.kek_id))
                .with_data(json!({ "kekId": sealed.kek_id }))
        })?;
        let nonce: [u8; 12] = B64.decode(&sealed.nonce).ok().and_then(|n| n.try_into().ok()).ok_or_else(|| not_readable("nonce"))?;
        let ciphertext = B64.decode(&sealed.ciphertext).map_err(|_| not_readable("ciphertext"))?;
        let cipher = Aes256Gcm::new_from_slice(kek.bytes()).map_err(Refusal::internal)?;
        let aad = context.aad(&sealed.kek_id);
        cipher
            .decrypt(Nonce::from_slice(&nonce), Payload { msg: &ciphertext, aad: &aad })
            .map(Zeroizing::new)
            .map_err(|_| not_readable("authentication"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_authenticated_data_is_the_json_the_binary_has_always_written() {
        // insertion order outside, key order inside, serde_json's escaping: a golden value, so a
        // change of encoding (which would leave every sealed value unreadable) fails here
        let context = super::Context::new("jwt-signing-key").with("kid", "k\"1/é\n");
        assert_eq!(
            String::from_utf8(context.aad("kek-2026")).unwrap(),
            r#"{"profile":"aes-256-gcm","kekId":"kek-2026","context":{"kid":"k\"1/é\n","purpose":"jwt-signing-key"}}"#
        );
    }

    use super::*;

    fn ctx() -> Context {
        Context::new("test").with("owner", "service:s1").with("key", "DB_PASSWORD")
    }

    #[test]
    fn seals_and_opens_under_the_same_context() {
        let ring = Keyring::generate(None, None).unwrap();
        let sealed = ring.seal(&ctx(), b"hunter2-but-longer").unwrap();
        assert_eq!(sealed.kek_id, ring.active_kek_id());
        assert!(!sealed.ciphertext.contains("hunter2"));
        assert_eq!(&**ring.open(&ctx(), &sealed).unwrap(), b"hunter2-but-longer");
        let again = ring.seal(&ctx(), b"hunter2-but-longer").unwrap();
        assert_ne!(again.nonce, sealed.nonce, "a fresh nonce every time");
    }

    #[test]
    fn another_context_or_altered_bytes_are_not_readable() {
        let ring = Keyring::generate(None, None).unwrap();
        let sealed = ring.seal(&ctx(), b"value").unwrap();
        let moved = ctx().with("owner", "service:s2");
        assert_eq!(ring.open(&moved, &sealed).unwrap_err().code, "material-not-readable");
        assert_eq!(ring.open(&Context::new("other"), &sealed).unwrap_err().code, "material-not-readable");

        let mut flipped = sealed.clone();
        let mut bytes = B64.decode(&flipped.ciphertext).unwrap();
        bytes[0] ^= 1;
        flipped.ciphertext = B64.encode(bytes);
        assert_eq!(ring.open(&ctx(), &flipped).unwrap_err().code, "material-not-readable");

        let mut bad_nonce = sealed.clone();
        bad_nonce.nonce = "AAAA".into();
        assert_eq!(ring.open(&ctx(), &bad_nonce).unwrap_err().code, "material-not-readable");

        let mut profile = sealed.clone();
        profile.profile = "none".into();
        assert_eq!(ring.open(&ctx(), &profile).unwrap_err().code, "material-not-readable");
    }

    #[test]
    fn a_kek_the_keyring_lacks_is_named() {
        let ring = Keyring::generate(None, None).unwrap();
        let other = Keyring::generate(None, None).unwrap();
        let sealed = other.seal(&ctx(), b"value").unwrap();
        let err = ring.open(&ctx(), &sealed).unwrap_err();
        assert_eq!(err.code, "kek-unavailable");

        // relabelling the KEK id does not help: the id is authenticated too
        let mut relabelled = sealed.clone();
        relabelled.kek_id = ring.active_kek_id().into();
        assert_eq!(ring.open(&ctx(), &relabelled).unwrap_err().code, "material-not-readable");
    }
}
