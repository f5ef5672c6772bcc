//! Publisher private keys on disk (feature `files`): PKCS#8 PEM files, written and read under
//! `capstan-core`'s private-file rules. `capstan plugin keygen` writes them; `capstan plugin
//! sign` and `capstan-catalog sign` read them.

use crate::{KeyError, PublisherKey};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use capstan_core::private_file;
use capstan_core::refusal::{Refusal, Result};
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use serde_json::json;
use std::path::Path;
use zeroize::Zeroizing;

const PEM_BEGIN: &str = "-----BEGIN PRIVATE KEY-----";
const PEM_END: &str = "-----END PRIVATE KEY-----";

/// A publisher key that does not parse, refused under its own code (`publisher-key-invalid`).
impl From<KeyError> for Refusal {
    fn from(e: KeyError) -> Refusal {
        Refusal::new(e.code(), e.to_string())
    }
}

/// A fresh random signing key.
pub fn generate_key() -> SigningKey {
    SigningKey::from_bytes(&rand::random())
}

/// Write `key` as a PKCS#8 PEM file, mode 0600, never replacing an existing file (the keyring's
/// private writer: `output-exists`, `output-directory-not-private`, …). Returns the public key.
pub fn write_key_file(path: &Path, key: &SigningKey) -> Result<PublisherKey> {
    // PKCS#8 v1 (no embedded public key), the form `openssl genpkey -algorithm ed25519` writes
    // and every OpenSSL 3 reads
    let keypair = ed25519_dalek::pkcs8::KeypairBytes { secret_key: key.to_bytes(), public_key: None };
    let der = keypair.to_pkcs8_der().map_err(|e| Refusal::internal(format!("encoding the signing key: {e}")))?;
    let body = Zeroizing::new(B64.encode(der.as_bytes()));
    let mut pem = Zeroizing::new(String::with_capacity(body.len() + 80));
    pem.push_str(PEM_BEGIN);
    pem.push('\n');
    for line in body.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str(PEM_END);
    pem.push('\n');
    private_file::write_new(path, pem.as_bytes())?;
    Ok(PublisherKey::from(key))
}

/// Read a key file written by [`write_key_file`] under the keyring's strict rules (a regular file
/// you own, mode 0600 or stricter, one link, ≤ 64 KiB: `input-permissions` and friends); refuses
/// `key-file-invalid` when it is not an Ed25519 PKCS#8 PEM private key.
pub fn read_key_file(path: &Path) -> Result<SigningKey> {
    let raw = Zeroizing::new(private_file::read_strict(path)?);
    let invalid = || {
        Refusal::new("key-file-invalid", format!("{} is not an Ed25519 private key in PKCS#8 PEM form", path.display()))
            .with_data(json!({ "path": path.display().to_string() }))
    };
    let text = std::str::from_utf8(&raw).map_err(|_| invalid())?;
    let inner = text.trim().strip_prefix(PEM_BEGIN).and_then(|t| t.strip_suffix(PEM_END)).ok_or_else(invalid)?;
    let body: Zeroizing<String> = Zeroizing::new(inner.chars().filter(|c| !c.is_ascii_whitespace()).collect());
    let der = Zeroizing::new(B64.decode(body.as_bytes()).map_err(|_| invalid())?);
    SigningKey::from_pkcs8_der(&der).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn private_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    #[test]
    fn key_file_round_trip() {
        let dir = private_dir();
        let path = dir.path().join("publisher.pem");
        let k = generate_key();
        let public = write_key_file(&path, &k).unwrap();
        assert_eq!(public, PublisherKey::from(&k));
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("-----BEGIN PRIVATE KEY-----\n") && text.ends_with("-----END PRIVATE KEY-----\n"), "{text}");
        assert_eq!(read_key_file(&path).unwrap().to_bytes(), k.to_bytes());
        assert_eq!(write_key_file(&path, &generate_key()).unwrap_err().code, "output-exists");
        assert_eq!(read_key_file(&path).unwrap().to_bytes(), k.to_bytes(), "never replaced");
        assert_ne!(generate_key().to_bytes(), k.to_bytes());
    }

    #[test]
    fn reads_an_openssl_generated_key() {
        // `openssl genpkey -algorithm ed25519` (a throwaway test key)
        let pem =
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIEf1WSbAJAHqRMzb1XGD49pAz09KU7mA9xb86hWi/RpD\n-----END PRIVATE KEY-----\n";
        let dir = private_dir();
        let path = dir.path().join("openssl.pem");
        private_file::write_new(&path, pem.as_bytes()).unwrap();
        let key = read_key_file(&path).unwrap();
        assert_eq!(PublisherKey::from(&key).to_string(), "capstan-ed25519:R7dLXdjdTfvY2wllj0OKXNP6Px9tMOnryaYsVq7QdTE");
        // and what we write is that same v1 form
        let ours = dir.path().join("ours.pem");
        write_key_file(&ours, &key).unwrap();
        assert_eq!(fs::read_to_string(&ours).unwrap(), pem);
    }

    #[test]
    fn key_file_must_be_private_and_valid() {
        let dir = private_dir();
        let path = dir.path().join("publisher.pem");
        write_key_file(&path, &generate_key()).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(read_key_file(&path).unwrap_err().code, "input-permissions");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o604)).unwrap();
        assert_eq!(read_key_file(&path).unwrap_err().code, "input-permissions");
        assert_eq!(read_key_file(&dir.path().join("absent")).unwrap_err().code, "input-missing");

        for (name, content) in [
            ("garbage", &b"not a key"[..]),
            ("empty-pem", b"-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"),
            ("bad-base64", b"-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n"),
            ("not-pkcs8", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
        ] {
            let p = dir.path().join(name);
            private_file::write_new(&p, content).unwrap();
            assert_eq!(read_key_file(&p).unwrap_err().code, "key-file-invalid", "{name}");
        }
    }

    #[test]
    fn a_key_that_does_not_parse_is_refused_by_its_code() {
        let refusal = Refusal::from("nope".parse::<PublisherKey>().unwrap_err());
        assert_eq!(refusal.code, "publisher-key-invalid");
        assert!(refusal.message.contains("the prefix is missing"), "{}", refusal.message);
    }
}
