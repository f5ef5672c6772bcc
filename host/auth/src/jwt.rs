//! JWTs signed with the host's Ed25519 key. The key is generated once, stored in the store
//! sealed under the keyring (the plugin and the database never see it in the clear), and
//! loaded at start.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use capstan_core::refusal::{Refusal, Result};
use capstan_keyring::Keyring;
use capstan_keyring::seal::{Context, Sealed};
use capstan_store::{CollectionSpec, Store};
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::EncodePrivateKey;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// The store collection holding the sealed host signing key.
pub const HOST_KEYS: &str = "host_keys";
const SIGNING_KEY_ID: &str = "jwt-signing";

/// What a Capstan JWT says. Every field is checked against the store on every request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Claims {
    /// The issuer: the host's public origin.
    pub iss: String,
    /// The user id.
    pub sub: String,
    /// The session id.
    pub sid: String,
    /// `human` or `machine`.
    pub kind: String,
    /// Human sessions: the credential generation the session was opened under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Machine sessions: SHA-256 of the token the JWT was exchanged for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_hash: Option<String>,
    /// When the JWT was issued (seconds since the epoch).
    pub iat: u64,
    /// When the JWT expires (seconds since the epoch); the session's expiry.
    pub exp: u64,
    /// When the user last proved who they are (seconds since the epoch; administrator freshness).
    pub auth_time: u64,
}

/// The host's JWT signing and verification keys, with the key id and issuer they go with.
pub struct JwtKeys {
    kid: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
    issuer: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredKey {
    kid: String,
    public_key: String,
    sealed: Sealed,
}

fn context(kid: &str) -> Context {
    Context::new("jwt-signing-key").with("kid", kid)
}

impl JwtKeys {
    /// Load the host signing key, creating it on the first start. Several processes starting
    /// at once agree on one key: the insert refuses `exists` and the loser reads the winner's.
    pub async fn load_or_create(store: &Store, keyring: &Keyring, issuer: &str) -> Result<Self> {
        store.declare(CollectionSpec::new(HOST_KEYS)).await?;
        loop {
            if let Some(doc) = store.transact(|tx| async move { tx.get(HOST_KEYS, SIGNING_KEY_ID).await }).await? {
                let stored: StoredKey =
                    serde_json::from_value(doc.data).map_err(|e| Refusal::internal(format!("stored signing key: {e}")))?;
                let secret = keyring.open(&context(&stored.kid), &stored.sealed)?;
                let bytes: [u8; 32] =
                    secret.as_slice().try_into().map_err(|_| Refusal::internal("stored signing key has the wrong length"))?;
                return Self::from_secret(stored.kid, &SigningKey::from_bytes(&bytes), issuer);
            }
            let kid = format!("host-{:016x}", rand::random::<u64>());
            let key = SigningKey::from_bytes(&rand::random());
            let sealed = keyring.seal(&context(&kid), key.as_bytes())?;
            let stored = StoredKey { kid: kid.clone(), public_key: B64.encode(key.verifying_key().as_bytes()), sealed };
            let data = serde_json::to_value(&stored).map_err(Refusal::internal)?;
            match store
                .transact(|tx| {
                    let data = data.clone();
                    async move { tx.insert(HOST_KEYS, SIGNING_KEY_ID, data).await }
                })
                .await
            {
                Ok(_) => {
                    tracing::info!(kid = %kid, "generated the host JWT signing key (sealed under the keyring)");
                    return Self::from_secret(kid, &key, issuer);
                }
                Err(e) if e.is("exists") => continue, // another process won: use its key
                Err(e) => return Err(e),
            }
        }
    }

    fn from_secret(kid: String, key: &SigningKey, issuer: &str) -> Result<Self> {
        let der = key.to_pkcs8_der().map_err(|e| Refusal::internal(format!("encoding the signing key: {e}")))?;
        Ok(JwtKeys {
            kid,
            encoding: EncodingKey::from_ed_der(der.as_bytes()),
            decoding: DecodingKey::from_ed_der(key.verifying_key().as_bytes()),
            issuer: issuer.to_string(),
        })
    }

    /// The issuer every JWT signed here carries and every verified JWT must carry.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Sign `claims` into a compact EdDSA JWT whose header names this key's id.
    pub fn sign(&self, claims: &Claims) -> Result<String> {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).map_err(|e| Refusal::internal(format!("signing a JWT: {e}")))
    }

    /// Verify signature, algorithm, key id, issuer and expiry. Any failure is `None`: the caller
    /// answers one uniform denial.
    pub fn verify(&self, token: &str) -> Option<Claims> {
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_issuer(&[self.issuer.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "sub"]);
        validation.leeway = 5;
        match jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation) {
            Ok(data) if data.header.kid.as_deref() == Some(self.kid.as_str()) => Some(data.claims),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(reason = %e, "JWT refused");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_core::clock::now_secs;
    use capstan_store::{DEFAULT_BUDGET, sqlite::SqliteStore};

    fn claims(exp: u64) -> Claims {
        Claims {
            iss: "http://capstan.test".into(),
            sub: "u1".into(),
            sid: "s1".into(),
            kind: "human".into(),
            generation: Some(1),
            token_hash: None,
            iat: now_secs(),
            exp,
            auth_time: now_secs(),
        }
    }

    #[tokio::test]
    async fn the_key_is_created_once_sealed_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), DEFAULT_BUDGET);
        let keyring = Keyring::generate(None, None).unwrap();
        let a = JwtKeys::load_or_create(&store, &keyring, "http://capstan.test").await.unwrap();
        let b = JwtKeys::load_or_create(&store, &keyring, "http://capstan.test").await.unwrap();
        let token = a.sign(&claims(now_secs() + 60)).unwrap();
        let seen = b.verify(&token).expect("a reloaded key verifies what the first one signed");
        assert_eq!((seen.sub.as_str(), seen.sid.as_str(), seen.generation), ("u1", "s1", Some(1)));
        // the stored document holds no clear key
        let doc = store.transact(|tx| async move { tx.require(HOST_KEYS, SIGNING_KEY_ID).await }).await.unwrap();
        assert!(doc.data["sealed"]["ciphertext"].is_string());
        // another keyring cannot open it
        let other = Keyring::generate(None, None).unwrap();
        assert_eq!(JwtKeys::load_or_create(&store, &other, "x").await.err().unwrap().code, "kek-unavailable");
    }

    #[tokio::test]
    async fn tampered_expired_or_foreign_tokens_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), DEFAULT_BUDGET);
        let keyring = Keyring::generate(None, None).unwrap();
        let keys = JwtKeys::load_or_create(&store, &keyring, "http://capstan.test").await.unwrap();
        let good = keys.sign(&claims(now_secs() + 60)).unwrap();
        assert!(keys.verify(&good).is_some());
        assert!(keys.verify(&keys.sign(&claims(now_secs() - 60)).unwrap()).is_none(), "expired");
        let mut parts: Vec<String> = good.split('.').map(str::to_string).collect();
        parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&Claims { sub: "admin".into(), ..claims(now_secs() + 60) }).unwrap());
        assert!(keys.verify(&parts.join(".")).is_none(), "tampered claims");
        assert!(keys.verify("not.a.jwt").is_none());
        let other_dir = tempfile::tempdir().unwrap();
        let other_store = Store::new(SqliteStore::open(other_dir.path().join("s.sqlite")).unwrap(), DEFAULT_BUDGET);
        let foreign = JwtKeys::load_or_create(&other_store, &keyring, "http://capstan.test").await.unwrap();
        assert!(keys.verify(&foreign.sign(&claims(now_secs() + 60)).unwrap()).is_none(), "another host's key");
        let wrong_issuer = JwtKeys::load_or_create(&store, &keyring, "http://elsewhere").await.unwrap();
        assert!(keys.verify(&wrong_issuer.sign(&Claims { iss: "http://elsewhere".into(), ..claims(now_secs() + 60) }).unwrap()).is_none());
    }
}
