//! `capstan-publisher-key`: publisher keys in Capstan's text form, `capstan-ed25519:<base64url,
//! no padding, of the 32 bytes>` — the form `capstan plugin keygen` prints, plugin bundles are
//! signed under and catalog keys are trusted by. Only the canonical spelling parses.
//!
//! Pure (no filesystem, clock or randomness), so the host and the App Store plugin
//! (`wasm32-wasip2`, through `capstan-catalog`) share it. The feature `files` adds [`files`]: the
//! PKCS#8 PEM private key files `capstan plugin keygen` writes and the signing tools read, under
//! `capstan-core`'s private-file rules (native only).

#[cfg(feature = "files")]
pub mod files;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// The prefix of a publisher key's text form.
pub const PUBLIC_KEY_PREFIX: &str = "capstan-ed25519:";

/// A publisher's Ed25519 public key. Text form: `capstan-ed25519:<43 base64url characters>`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PublisherKey(VerifyingKey);

impl PublisherKey {
    /// The publisher key of an Ed25519 verifying key.
    pub fn from_verifying_key(key: VerifyingKey) -> Self {
        PublisherKey(key)
    }

    /// The Ed25519 verifying key, to check signatures with.
    pub fn verifying_key(&self) -> &VerifyingKey {
        &self.0
    }

    /// The key's 32 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }

    /// The first 16 hex characters of SHA-256 of the key bytes.
    pub fn fingerprint(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))[..16].to_string()
    }
}

impl From<&SigningKey> for PublisherKey {
    fn from(key: &SigningKey) -> Self {
        PublisherKey(key.verifying_key())
    }
}

impl fmt::Display for PublisherKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PUBLIC_KEY_PREFIX}{}", B64URL.encode(self.0.as_bytes()))
    }
}

impl fmt::Debug for PublisherKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublisherKey({self})")
    }
}

/// Why a text is not a publisher key (code `publisher-key-invalid`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a publisher key must be {PUBLIC_KEY_PREFIX}<43 base64url characters>; {reason}")]
pub struct KeyError {
    reason: &'static str,
}

impl KeyError {
    /// The stable refusal code: `publisher-key-invalid`.
    pub fn code(&self) -> &'static str {
        "publisher-key-invalid"
    }

    /// What exactly is wrong, e.g. `the prefix is missing`.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl FromStr for PublisherKey {
    type Err = KeyError;

    /// Refuses text that is not `capstan-ed25519:` + 43 base64url characters, not 32 bytes, not
    /// a usable Ed25519 point (weak keys included), or not the canonical spelling.
    fn from_str(s: &str) -> Result<PublisherKey, KeyError> {
        let refuse = |reason| KeyError { reason };
        let encoded = s.strip_prefix(PUBLIC_KEY_PREFIX).ok_or(refuse("the prefix is missing"))?;
        if encoded.len() != 43 {
            return Err(refuse("the key has the wrong length"));
        }
        let bytes = B64URL.decode(encoded).map_err(|_| refuse("the key is not base64url without padding"))?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| refuse("the key is not 32 bytes"))?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|_| refuse("the key is not an Ed25519 public key"))?;
        if key.is_weak() {
            return Err(refuse("the key is a weak (small-order) point"));
        }
        // only the canonical spelling round-trips; refuse any other
        let parsed = PublisherKey(key);
        if parsed.to_string() != s {
            return Err(refuse("the key is not in canonical form"));
        }
        Ok(parsed)
    }
}

impl Serialize for PublisherKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PublisherKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_every_other_spelling() {
        let key = PublisherKey::from(&SigningKey::from_bytes(&[7; 32]));
        let text = key.to_string();
        assert!(text.starts_with(PUBLIC_KEY_PREFIX) && text.len() == PUBLIC_KEY_PREFIX.len() + 43, "{text}");
        assert_eq!(text.parse::<PublisherKey>().unwrap(), key);
        assert_eq!(key.fingerprint().len(), 16);
        assert_eq!(format!("{key:?}"), format!("PublisherKey({text})"));
        let json = serde_json::to_string(&key).unwrap();
        assert_eq!(serde_json::from_str::<PublisherKey>(&json).unwrap(), key);

        let encoded = &text[PUBLIC_KEY_PREFIX.len()..];
        let identity = format!(
            "{PUBLIC_KEY_PREFIX}{}",
            B64URL.encode({
                let mut b = [0u8; 32];
                b[0] = 1;
                b
            })
        );
        for (bad, reason) in [
            (encoded.to_string(), "the prefix is missing"),
            (format!("capstan-ed25519:{encoded}="), "the key has the wrong length"),
            (format!("capstan-ed25519:{}", &encoded[..42]), "the key has the wrong length"),
            (format!("capstan-ed25519:{}!", &encoded[..42]), "the key is not base64url without padding"),
            (identity, "the key is a weak (small-order) point"),
        ] {
            let err = bad.parse::<PublisherKey>().unwrap_err();
            assert_eq!((err.code(), err.reason()), ("publisher-key-invalid", reason), "{bad}");
            assert!(err.to_string().contains(reason));
        }
        // the last character carries 2 unused bits: a non-canonical spelling of the same bytes
        let last = encoded.chars().last().unwrap();
        let sibling = B64URL_ALPHABET
            .chars()
            .find(|c| *c != last && (B64URL_ALPHABET.find(*c).unwrap() >> 2) == (B64URL_ALPHABET.find(last).unwrap() >> 2));
        if let Some(sibling) = sibling {
            let bad = format!("capstan-ed25519:{}{sibling}", &encoded[..42]);
            assert!(bad.parse::<PublisherKey>().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<PublisherKey>("\"nope\"").is_err());
    }

    const B64URL_ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
}
