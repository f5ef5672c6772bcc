//! The RS256 keys hosted apps' ID tokens are signed with.
//!
//! Each key is one document of [`KEYS`](crate::KEYS), keyed by its `kid`: the public JWK (what
//! the JWKS publishes) and the private key (PKCS#1) sealed under the keyring, bound to its kid
//! (it opens nowhere else and never leaves the host in the clear). The active key is the newest
//! one not retiring; a rotation makes a new one active and gives every other one a retirement
//! moment [`KEY_OVERLAP`](crate::KEY_OVERLAP) ahead, until which it stays published (ID tokens
//! it signed still verify) and after which it is dropped.

use capstan_core::refusal::{Refusal, Result};
use capstan_keyring::Keyring;
use capstan_keyring::seal::{Context, Sealed};
use openidconnect::core::{CoreJsonWebKey, CoreRsaPrivateSigningKey};
use openidconnect::{JsonWebKeyId, PrivateSigningKey};
use rsa::pkcs1::{EncodeRsaPrivateKey, LineEnding};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The size of the RSA keys generated here.
pub const RSA_BITS: usize = 2048;

/// One stored signing key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KeyRecord {
    /// The key id every ID token it signs names in its header.
    pub kid: String,
    /// When the key was made (milliseconds since the epoch).
    pub created_at: u64,
    /// When the key stops being published (milliseconds since the epoch); `None` while it has
    /// not been superseded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retires_at: Option<u64>,
    /// The public key as a JWK (`kty` RSA, `use` sig, `alg` RS256, the kid).
    pub public_jwk: Value,
    /// The PKCS#1 PEM of the private key, sealed under the keyring with [`context`].
    pub sealed: Sealed,
}

impl KeyRecord {
    /// Whether the JWKS publishes the key at `now`.
    pub fn published(&self, now: u64) -> bool {
        self.retires_at.is_none_or(|at| at > now)
    }
}

/// What a sealed private key is bound to.
fn context(kid: &str) -> Context {
    Context::new("hosted-oidc-signing-key").with("kid", kid)
}

/// A new RSA key (slow: run it off the async threads) and its record, sealed under `keyring`.
pub(crate) fn generate(keyring: &Keyring, created_at: u64) -> Result<(KeyRecord, CoreRsaPrivateSigningKey)> {
    let kid = format!("oidc-{}", hex::encode(rand::random::<[u8; 8]>()));
    let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, RSA_BITS)
        .map_err(|e| Refusal::internal(format!("generating an RSA key: {e}")))?;
    let pem = private.to_pkcs1_pem(LineEnding::LF).map_err(|e| Refusal::internal(format!("encoding an RSA key: {e}")))?;
    let signing = parse(&kid, &pem)?;
    let public_jwk = serde_json::to_value(public_jwk(&signing)).map_err(Refusal::internal)?;
    let sealed = keyring.seal(&context(&kid), pem.as_bytes())?;
    Ok((KeyRecord { kid, created_at, retires_at: None, public_jwk, sealed }, signing))
}

/// The signing key a record seals, opened under `keyring`.
pub(crate) fn open(keyring: &Keyring, record: &KeyRecord) -> Result<CoreRsaPrivateSigningKey> {
    let pem = keyring.open(&context(&record.kid), &record.sealed)?;
    let pem = std::str::from_utf8(&pem).map_err(|_| Refusal::internal("a stored signing key is not PEM"))?;
    parse(&record.kid, pem)
}

fn parse(kid: &str, pem: &str) -> Result<CoreRsaPrivateSigningKey> {
    // the parser's message may quote the input: never passed on
    CoreRsaPrivateSigningKey::from_pem(pem, Some(JsonWebKeyId::new(kid.to_string())))
        .map_err(|_| Refusal::internal(format!("the signing key {kid} does not parse")))
}

/// The public half of `key` as its JWK, with `alg` RS256 (relying parties pick keys by it).
fn public_jwk(key: &CoreRsaPrivateSigningKey) -> Value {
    let mut jwk = serde_json::to_value(key.as_verification_key()).unwrap_or_default();
    if let Some(object) = jwk.as_object_mut() {
        object.insert("alg".into(), Value::from("RS256"));
    }
    jwk
}

/// A stored public JWK, as the JWKS type takes it.
pub(crate) fn verification_key(record: &KeyRecord) -> Result<CoreJsonWebKey> {
    serde_json::from_value(record.public_jwk.clone())
        .map_err(|e| Refusal::internal(format!("the stored public key {} is malformed: {e}", record.kid)))
}

/// Published keys in the JWKS's order: the active key first, then the others newest first.
pub(crate) fn order(records: &mut [KeyRecord]) {
    records.sort_by(|a, b| {
        (a.retires_at.is_some(), std::cmp::Reverse(a.created_at), &a.kid).cmp(&(
            b.retires_at.is_some(),
            std::cmp::Reverse(b.created_at),
            &b.kid,
        ))
    });
}
