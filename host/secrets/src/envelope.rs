//! The envelope engine: every secret version gets a fresh 256-bit data key (DEK); the material
//! is sealed with AES-256-GCM under that DEK, authenticated with the version's whole context;
//! the DEK is sealed under the keyring's active KEK with the same context. Opening checks the
//! context at both layers, so a swapped, tampered or re-bound envelope fails
//! `material-not-readable`, and one naming a KEK the keyring lacks fails `kek-unavailable`.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use capstan_core::refusal::{Refusal, Result};
use capstan_keyring::Keyring;
use capstan_keyring::seal::{Context, Sealed};
use serde::{Deserialize, Serialize};
use serde_json::json;
use zeroize::Zeroizing;

/// The envelope layout this engine writes and reads.
pub const PROFILE: &str = "capstan-envelope-v1";

/// Where a version's material belongs. Every field is authenticated: an envelope opens only
/// for the exact version, owner, key and environment it was sealed for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaterialContext {
    /// What the material is for (`secret-material`).
    pub purpose: String,
    /// The secret the version belongs to.
    pub secret_id: String,
    /// The version being sealed or opened.
    pub version_id: String,
    /// The owner reference: `service:<id>`, `organization:<id>/secretSet:<id>` or `system:<id>`.
    pub owner: String,
    /// The owning organization's id (empty for system secrets).
    pub organization: String,
    /// The secret's key, an environment variable name.
    pub key: String,
    /// The environment the secret is for.
    pub environment: String,
}

impl MaterialContext {
    fn sealing_context(&self) -> Context {
        Context::new(&self.purpose)
            .with("profile", PROFILE)
            .with("secretId", &self.secret_id)
            .with("versionId", &self.version_id)
            .with("owner", &self.owner)
            .with("organization", &self.organization)
            .with("key", &self.key)
            .with("environment", &self.environment)
    }

    /// The bytes the material's own GCM layer authenticates: the same context, canonical.
    /// In this member order, always (see [`capstan_keyring::seal::json_object`]).
    fn aad(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        capstan_keyring::seal::json_object(
            &mut out,
            [
                ("profile", PROFILE),
                ("purpose", self.purpose.as_str()),
                ("secretId", self.secret_id.as_str()),
                ("versionId", self.version_id.as_str()),
                ("owner", self.owner.as_str()),
                ("organization", self.organization.as_str()),
                ("key", self.key.as_str()),
                ("environment", self.environment.as_str()),
            ],
        );
        out
    }
}

/// A sealed version as stored: its profile, the KEK its DEK is wrapped by, the wrapped DEK
/// and the material sealed under the DEK. Carries no plaintext and no key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Envelope {
    /// The envelope layout, [`PROFILE`].
    pub profile: String,
    /// The id of the KEK the DEK is wrapped by; must equal the one `wrapped_dek` names.
    pub kek_id: String,
    /// The version's DEK sealed under that KEK with the version's context.
    pub wrapped_dek: Sealed,
    /// The AES-256-GCM nonce of the material: 12 bytes, base64.
    pub nonce: String,
    /// The material sealed under the DEK, with its GCM tag, base64.
    pub ciphertext: String,
}

fn not_readable(reason: &str) -> Refusal {
    Refusal::new("material-not-readable", "sealed material cannot be opened: it was altered or belongs to another context")
        .with_data(json!({ "reason": reason }))
}

/// Seal `plaintext` for `context` under a fresh DEK wrapped by the active KEK.
pub fn seal(keyring: &Keyring, context: &MaterialContext, plaintext: &[u8]) -> Result<Envelope> {
    let dek: Zeroizing<[u8; 32]> = Zeroizing::new(rand::random());
    let wrapped_dek = keyring.seal(&context.sealing_context(), dek.as_slice())?;
    let cipher = Aes256Gcm::new_from_slice(dek.as_slice()).map_err(Refusal::internal)?;
    let nonce: [u8; 12] = rand::random();
    let aad = context.aad();
    let ciphertext = cipher
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad: &aad })
        .map_err(|_| Refusal::internal("AES-GCM sealing failed"))?;
    Ok(Envelope {
        profile: PROFILE.into(),
        kek_id: wrapped_dek.kek_id.clone(),
        wrapped_dek,
        nonce: B64.encode(nonce),
        ciphertext: B64.encode(ciphertext),
    })
}

/// Unwrap the DEK of an envelope, checking the envelope states what its wrapped key says.
fn unwrap_dek(keyring: &Keyring, context: &MaterialContext, envelope: &Envelope) -> Result<Zeroizing<[u8; 32]>> {
    if envelope.profile != PROFILE {
        return Err(not_readable("profile"));
    }
    if envelope.kek_id != envelope.wrapped_dek.kek_id {
        return Err(not_readable("kek-id"));
    }
    let dek = keyring.open(&context.sealing_context(), &envelope.wrapped_dek)?;
    let dek: [u8; 32] = dek.as_slice().try_into().map_err(|_| not_readable("dek-length"))?;
    Ok(Zeroizing::new(dek))
}

/// Open an envelope for `context`. The plaintext is wiped when dropped.
pub fn open(keyring: &Keyring, context: &MaterialContext, envelope: &Envelope) -> Result<Zeroizing<Vec<u8>>> {
    let dek = unwrap_dek(keyring, context, envelope)?;
    let nonce: [u8; 12] = B64.decode(&envelope.nonce).ok().and_then(|n| n.try_into().ok()).ok_or_else(|| not_readable("nonce"))?;
    let ciphertext = B64.decode(&envelope.ciphertext).map_err(|_| not_readable("ciphertext"))?;
    let cipher = Aes256Gcm::new_from_slice(dek.as_slice()).map_err(Refusal::internal)?;
    cipher
        .decrypt(Nonce::from_slice(&nonce), Payload { msg: &ciphertext, aad: &context.aad() })
        .map(Zeroizing::new)
        .map_err(|_| not_readable("authentication"))
}

/// Re-wrap the DEK under the active KEK, leaving the material's ciphertext as it is. `None`
/// when the envelope already uses the active KEK. The material is never decrypted.
pub fn rewrap(keyring: &Keyring, context: &MaterialContext, envelope: &Envelope) -> Result<Option<Envelope>> {
    if envelope.kek_id == keyring.active_kek_id() {
        return Ok(None);
    }
    let dek = unwrap_dek(keyring, context, envelope)?;
    let wrapped_dek = keyring.seal(&context.sealing_context(), dek.as_slice())?;
    Ok(Some(Envelope { kek_id: wrapped_dek.kek_id.clone(), wrapped_dek, ..envelope.clone() }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_material_context_is_authenticated_as_the_binary_has_always_written_it() {
        let context = super::MaterialContext {
            purpose: "secret-version".into(),
            secret_id: "sec_1".into(),
            version_id: "ver_1".into(),
            owner: "service:svc_1".into(),
            organization: "org_1".into(),
            key: "SMTP_PASSWORD".into(),
            environment: "production".into(),
        };
        assert_eq!(
            String::from_utf8(context.aad()).unwrap(),
            r#"{"profile":"capstan-envelope-v1","purpose":"secret-version","secretId":"sec_1","versionId":"ver_1","owner":"service:svc_1","organization":"org_1","key":"SMTP_PASSWORD","environment":"production"}"#
        );
    }

    use super::*;

    fn context() -> MaterialContext {
        MaterialContext {
            purpose: "secret-material".into(),
            secret_id: "sec_1".into(),
            version_id: "ver_1".into(),
            owner: "service:svc_1".into(),
            organization: "org_1".into(),
            key: "DB_PASSWORD".into(),
            environment: "production".into(),
        }
    }

    #[test]
    fn a_version_opens_only_for_its_own_context() {
        let ring = Keyring::generate(None, None).unwrap();
        let envelope = seal(&ring, &context(), b"hunter2-planted-value").unwrap();
        assert_eq!(&**open(&ring, &context(), &envelope).unwrap(), b"hunter2-planted-value");
        let stored = serde_json::to_string(&envelope).unwrap();
        assert!(!stored.contains("hunter2"), "{stored}");
        // every field of the context is bound
        let rebinds: [fn(&mut MaterialContext); 7] = [
            |c| c.purpose = "other".into(),
            |c| c.secret_id = "sec_2".into(),
            |c| c.version_id = "ver_2".into(),
            |c| c.owner = "service:svc_2".into(),
            |c| c.organization = "org_2".into(),
            |c| c.key = "API_TOKEN".into(),
            |c| c.environment = "staging".into(),
        ];
        for rebind in rebinds {
            let mut other = context();
            rebind(&mut other);
            assert_eq!(open(&ring, &other, &envelope).unwrap_err().code, "material-not-readable", "{other:?}");
        }
    }

    #[test]
    fn swapped_or_tampered_parts_are_not_readable() {
        let ring = Keyring::generate(None, None).unwrap();
        let a = seal(&ring, &context(), b"value-a").unwrap();
        let b = seal(&ring, &context(), b"value-b").unwrap();
        // the DEK of one version with the material of another
        let swapped = Envelope { wrapped_dek: b.wrapped_dek.clone(), ..a.clone() };
        assert_eq!(open(&ring, &context(), &swapped).unwrap_err().code, "material-not-readable");
        let mut flipped = a.clone();
        let mut bytes = B64.decode(&flipped.ciphertext).unwrap();
        bytes[3] ^= 1;
        flipped.ciphertext = B64.encode(bytes);
        assert_eq!(open(&ring, &context(), &flipped).unwrap_err().code, "material-not-readable");
        let relabelled = Envelope { kek_id: "kek-other".into(), ..a.clone() };
        assert_eq!(open(&ring, &context(), &relabelled).unwrap_err().code, "material-not-readable");
        let profile = Envelope { profile: "v0".into(), ..a };
        assert_eq!(open(&ring, &context(), &profile).unwrap_err().code, "material-not-readable");
    }

    #[test]
    fn a_missing_kek_is_named_and_rewrap_moves_to_the_active_one() {
        let old = Keyring::generate(Some("kek-old"), None).unwrap();
        let envelope = seal(&old, &context(), b"value").unwrap();
        let stranger = Keyring::generate(Some("kek-new"), None).unwrap();
        assert_eq!(open(&stranger, &context(), &envelope).unwrap_err().code, "kek-unavailable");

        let rotated = old.with_new_active_kek(Some("kek-new")).unwrap();
        assert_eq!(&**open(&rotated, &context(), &envelope).unwrap(), b"value", "old KEKs keep opening what they sealed");
        let moved = rewrap(&rotated, &context(), &envelope).unwrap().expect("an old envelope moves");
        assert_eq!((moved.kek_id.as_str(), moved.ciphertext.as_str()), ("kek-new", envelope.ciphertext.as_str()));
        assert_eq!(&**open(&rotated, &context(), &moved).unwrap(), b"value");
        assert!(rewrap(&rotated, &context(), &moved).unwrap().is_none(), "a current one stays");
    }
}
