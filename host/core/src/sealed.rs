//! Sealed values (feature `sealed`): a value sealed to an X25519 recipient with an ephemeral
//! key (X25519, HKDF-SHA256, AES-256-GCM), the target it is for bound into the authenticated
//! data, so it opens only with the recipient's private key and only for that target. Capstan's
//! sealed input (clients to the keyring's ingress recipient) and the secret material sealed to
//! a node's recipient (Capstan to an agent) are both this layout.

use crate::refusal::{Refusal, Result};
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};
use serde_json::json;
use zeroize::Zeroizing;

/// The sealed-input layout this module writes and reads: every [`SealedInput`]'s `profile`.
pub const PROFILE: &str = "capstan-sealed-input-v1";
const INFO: &[u8] = b"capstan sealed input v1";

/// A value sealed to the ingress recipient, as a client sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SealedInput {
    /// `capstan-sealed-input-v1`.
    pub profile: String,
    /// The recipient id `secrets.getIngressRecipient` answered.
    pub recipient_id: String,
    /// The sender's one-time X25519 public key, base64.
    pub ephemeral_public_key: String,
    /// 12 bytes, base64.
    pub nonce: String,
    /// AES-256-GCM ciphertext with its tag, base64.
    pub ciphertext: String,
}

/// The target's fields in their fixed order: the bytes every sealing client (the CLI, the
/// dashboard's `seal.js`) builds, whatever JSON map order a dependency turns on.
#[derive(Serialize)]
struct Target<'a> {
    method: &'a str,
    owner: &'a str,
    key: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Aad<'a> {
    profile: &'a str,
    recipient_id: &'a str,
    target: &'a str,
}

/// The canonical target a sealed value is bound to: `{"method":…,"owner":…,"key":…}`.
pub fn target(method: &str, owner: &str, key: &str) -> String {
    serde_json::to_string(&Target { method, owner, key }).expect("the target serializes")
}

fn aad(recipient_id: &str, target: &str) -> Vec<u8> {
    serde_json::to_vec(&Aad { profile: PROFILE, recipient_id, target }).expect("aad serializes")
}

/// The content key: HKDF-SHA256 over the shared secret, salted with both public keys.
fn content_key(shared: &[u8; 32], ephemeral: &[u8; 32], recipient: &[u8; 32]) -> Zeroizing<[u8; 32]> {
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(ephemeral);
    salt[32..].copy_from_slice(recipient);
    let hkdf = hkdf::Hkdf::<sha2::Sha256>::new(Some(&salt), shared);
    let mut key = Zeroizing::new([0u8; 32]);
    hkdf.expand(INFO, key.as_mut_slice()).expect("32 bytes is a valid HKDF-SHA256 length");
    key
}

/// Seal `plaintext` to a recipient for `target` (what the CLI and the dashboard do).
pub fn seal_to(recipient_id: &str, recipient: &x25519_dalek::PublicKey, target: &str, plaintext: &[u8]) -> SealedInput {
    // used for this one value and dropped (wiped) at the end of the call
    let ephemeral = x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>());
    let ephemeral_public = x25519_dalek::PublicKey::from(&ephemeral);
    let shared = Zeroizing::new(*ephemeral.diffie_hellman(recipient).as_bytes());
    let key = content_key(&shared, ephemeral_public.as_bytes(), recipient.as_bytes());
    let cipher = Aes256Gcm::new_from_slice(key.as_slice()).expect("a 32-byte key");
    let nonce: [u8; 12] = rand::random();
    let ciphertext =
        cipher.encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad: &aad(recipient_id, target) }).expect("AES-GCM sealing");
    SealedInput {
        profile: PROFILE.into(),
        recipient_id: recipient_id.into(),
        ephemeral_public_key: B64.encode(ephemeral_public.as_bytes()),
        nonce: B64.encode(nonce),
        ciphertext: B64.encode(ciphertext),
    }
}

fn invalid(reason: &str) -> Refusal {
    Refusal::new("sealed-input-invalid", "the sealed value does not open for this request: seal it again for this target")
        .with_data(json!({ "reason": reason }))
}

/// Open a value sealed to `secret`'s public key (an agent opening its sealed manifest).
pub fn open_as(secret: &x25519_dalek::StaticSecret, target: &str, input: &SealedInput) -> Result<Zeroizing<Vec<u8>>> {
    let public = x25519_dalek::PublicKey::from(secret);
    open_with(&public, |ephemeral| Zeroizing::new(*secret.diffie_hellman(ephemeral).as_bytes()), target, input)
}

/// Open a value sealed to `recipient`, agreeing on the shared secret with `agree` (the private
/// key's side of X25519, wherever it is kept): the plaintext, wiped when dropped, or
/// `sealed-input-invalid` with the reason word.
pub fn open_with(
    recipient: &x25519_dalek::PublicKey,
    agree: impl FnOnce(&x25519_dalek::PublicKey) -> Zeroizing<[u8; 32]>,
    target: &str,
    input: &SealedInput,
) -> Result<Zeroizing<Vec<u8>>> {
    if input.profile != PROFILE {
        return Err(invalid("profile"));
    }
    let decode32 = |text: &str| -> Option<[u8; 32]> { B64.decode(text).ok()?.try_into().ok() };
    let ephemeral = decode32(&input.ephemeral_public_key).ok_or_else(|| invalid("ephemeral-public-key"))?;
    let nonce: [u8; 12] = B64.decode(&input.nonce).ok().and_then(|n| n.try_into().ok()).ok_or_else(|| invalid("nonce"))?;
    let ciphertext = B64.decode(&input.ciphertext).map_err(|_| invalid("ciphertext"))?;
    let shared = agree(&x25519_dalek::PublicKey::from(ephemeral));
    let key = content_key(&shared, &ephemeral, recipient.as_bytes());
    let cipher = Aes256Gcm::new_from_slice(key.as_slice()).map_err(Refusal::internal)?;
    cipher
        .decrypt(Nonce::from_slice(&nonce), Payload { msg: &ciphertext, aad: &aad(&input.recipient_id, target) })
        .map(Zeroizing::new)
        .map_err(|_| invalid("authentication"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_sealed_to_a_key_opens_with_it_only_for_its_target() {
        let secret = x25519_dalek::StaticSecret::from([7u8; 32]);
        let public = x25519_dalek::PublicKey::from(&secret);
        let here = target("runtime.material", "assignment:asg_1", "production/DB_PASSWORD");
        let sealed = seal_to("node:node_1#1", &public, &here, b"planted-value");
        assert!(!serde_json::to_string(&sealed).unwrap().contains("planted"));
        assert_eq!(&**open_as(&secret, &here, &sealed).unwrap(), b"planted-value");
        let elsewhere = target("runtime.material", "assignment:asg_2", "production/DB_PASSWORD");
        assert_eq!(open_as(&secret, &elsewhere, &sealed).unwrap_err().code, "sealed-input-invalid", "another assignment");
        let other = x25519_dalek::StaticSecret::from([8u8; 32]);
        assert_eq!(open_as(&other, &here, &sealed).unwrap_err().code, "sealed-input-invalid", "another key");
        let relabelled = SealedInput { recipient_id: "node:node_1#2".into(), ..sealed.clone() };
        assert_eq!(open_as(&secret, &here, &relabelled).unwrap_err().code, "sealed-input-invalid", "the recipient id is bound");
        let mut tampered = sealed;
        let mut bytes = B64.decode(&tampered.ciphertext).unwrap();
        bytes[3] ^= 0x40;
        tampered.ciphertext = B64.encode(bytes);
        assert_eq!(open_as(&secret, &here, &tampered).unwrap_err().code, "sealed-input-invalid");
    }
}
