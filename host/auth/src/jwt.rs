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

/// Property tests: [`JwtKeys::verify`] reads the bearer token of any request, so whatever text
/// arrives it answers the claims this host signed or nothing (which `Auth::authenticate` turns
/// into the uniform denial, `unauthenticated`), never a panic.
#[cfg(test)]
mod proptests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
    use capstan_core::clock::now_secs;
    use proptest::prelude::*;
    use proptest::sample::{Index, select};
    use proptest::test_runner::TestRunner;

    const ISSUER: &str = "http://capstan.test";
    const KID: &str = "host-00000000000000a1";

    fn keys() -> JwtKeys {
        JwtKeys::from_secret(KID.into(), &SigningKey::from_bytes(&[5; 32]), ISSUER).unwrap()
    }

    /// Claims this host could sign: any subject, session and kind, expiring in the future.
    fn claims() -> impl Strategy<Value = Claims> {
        (
            "\\PC{0,40}",
            "\\PC{0,40}",
            prop_oneof![Just("human".to_string()), Just("machine".to_string()), "\\PC{0,10}"],
            prop::option::of(any::<u64>()),
            prop::option::of("[0-9a-f]{64}"),
            60u64..100_000_000,
            any::<u32>(),
        )
            .prop_map(|(sub, sid, kind, generation, token_hash, ttl, ago)| {
                let now = now_secs();
                Claims {
                    iss: ISSUER.into(),
                    sub,
                    sid,
                    kind,
                    generation,
                    token_hash,
                    iat: now,
                    exp: now + ttl,
                    auth_time: now.saturating_sub(u64::from(ago)),
                }
            })
    }

    /// Replace the character at `at` (a position in `token`) by `c`.
    fn replace(token: &str, at: &Index, c: char) -> String {
        let mut chars: Vec<char> = token.chars().collect();
        let at = at.index(chars.len());
        chars[at] = c;
        chars.into_iter().collect()
    }

    /// A character a tamperer might put in a token: mostly base64url and `.`.
    fn token_char() -> impl Strategy<Value = char> {
        prop_oneof![
            4 => "[A-Za-z0-9_.-]".prop_map(|s| s.chars().next().unwrap()),
            1 => any::<char>(),
        ]
    }

    fn header(alg: &str, kid: &str) -> String {
        B64URL.encode(serde_json::json!({ "alg": alg, "kid": kid, "typ": "JWT" }).to_string())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary text, and three dot-separated base64url segments of anything, verify to
        /// nothing.
        #[test]
        fn arbitrary_tokens_verify_to_nothing(token in prop_oneof![
            any::<String>(),
            "[A-Za-z0-9_.-]{0,300}",
            (
                prop::collection::vec(any::<u8>(), 0..120),
                prop::collection::vec(any::<u8>(), 0..200),
                prop::collection::vec(any::<u8>(), 0..80),
            )
                .prop_map(|(h, c, s)| format!("{}.{}.{}", B64URL.encode(h), B64URL.encode(c), B64URL.encode(s))),
        ]) {
            prop_assert!(keys().verify(&token).is_none());
        }

        /// A signed token verifies to exactly its claims, and no longer once any one character is
        /// changed, it is cut short anywhere, or anything is appended.
        #[test]
        fn signed_tokens_verify_and_tampered_ones_do_not(
            claims in claims(),
            at in any::<Index>(),
            c in token_char(),
            more in "[A-Za-z0-9_.=-]{1,8}",
        ) {
            let keys = keys();
            let token = keys.sign(&claims).unwrap();
            prop_assert_eq!(keys.verify(&token), Some(claims));
            let tampered = replace(&token, &at, c);
            if tampered != token {
                prop_assert!(keys.verify(&tampered).is_none(), "{} verified", tampered);
            }
            prop_assert!(keys.verify(&token[..at.index(token.len())]).is_none());
            let appended = format!("{token}{more}");
            prop_assert!(keys.verify(&appended).is_none());
        }

        /// Expired (past the leeway), issued for another issuer, under another key id or by
        /// another key, a token verifies to nothing.
        #[test]
        fn foreign_or_expired_tokens_verify_to_nothing(claims in claims(), past in 6u64..1_000_000, seed in 0u8..5, which in 0u8..4) {
            let keys = keys();
            let (token, what) = match which {
                0 => (keys.sign(&Claims { exp: now_secs() - past, ..claims }).unwrap(), "expired"),
                1 => {
                    let other = JwtKeys::from_secret(KID.into(), &SigningKey::from_bytes(&[5; 32]), "http://elsewhere").unwrap();
                    (other.sign(&Claims { iss: "http://elsewhere".into(), ..claims }).unwrap(), "another issuer")
                }
                2 => {
                    let other = JwtKeys::from_secret("host-other".into(), &SigningKey::from_bytes(&[5; 32]), ISSUER).unwrap();
                    (other.sign(&claims).unwrap(), "another key id")
                }
                _ => {
                    let other = JwtKeys::from_secret(KID.into(), &SigningKey::from_bytes(&[seed; 32]), ISSUER).unwrap();
                    (other.sign(&claims).unwrap(), "another key")
                }
            };
            prop_assert!(keys.verify(&token).is_none(), "{} verified", what);
        }

        /// Tokens forged with another algorithm in the header (none, HMAC keyed with the public
        /// key, RSA) or no signature at all verify to nothing, whatever they claim.
        #[test]
        fn forged_headers_verify_to_nothing(
            claims in claims(),
            alg in select(vec!["none", "None", "HS256", "HS512", "RS256", "ES256", "EdDSA", "ed25519", ""]),
            signature in prop_oneof![Just(Vec::new()), prop::collection::vec(any::<u8>(), 64), prop::collection::vec(any::<u8>(), 0..100)],
        ) {
            let keys = keys();
            let body = B64URL.encode(serde_json::to_vec(&claims).unwrap());
            let forged = format!("{}.{body}.{}", header(alg, KID), B64URL.encode(&signature));
            prop_assert!(keys.verify(&forged).is_none(), "{} verified", forged);
            let public = SigningKey::from_bytes(&[5; 32]).verifying_key().to_bytes();
            let mut hmac_header = Header::new(Algorithm::HS256);
            hmac_header.kid = Some(KID.into());
            let confused = jsonwebtoken::encode(&hmac_header, &claims, &EncodingKey::from_secret(&public)).unwrap();
            prop_assert!(keys.verify(&confused).is_none(), "HS256 keyed with the public key verified");
        }
    }

    /// Through [`crate::Auth::authenticate`], a real session's token changed in any one character
    /// is the uniform denial `unauthenticated`.
    #[test]
    fn a_tampered_session_token_is_the_uniform_denial() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (auth, token) = runtime.block_on(async {
            let store =
                Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
            let blobs = capstan_blobs::Blobs::new(
                capstan_blobs::local::LocalBlobs::open(dir.path().join("blobs").to_str().unwrap()).await.unwrap(),
            );
            let keyring = Keyring::generate(None, None).unwrap();
            let auth = crate::Auth::new(store.clone(), &keyring, ISSUER).await.unwrap();
            crate::bootstrap_admin(&store, &blobs, "admin", "a-long-enough-admin-password").await.unwrap();
            let token = auth.login("admin", "a-long-enough-admin-password", None).await.unwrap().token;
            auth.authenticate(&token).await.unwrap();
            (auth, token)
        });
        let mut runner = TestRunner::new(ProptestConfig::with_cases(64));
        runner
            .run(&(any::<Index>(), token_char()), |(at, c)| {
                let tampered = replace(&token, &at, c);
                if tampered != token {
                    let err = runtime.block_on(auth.authenticate(&tampered)).unwrap_err();
                    prop_assert_eq!(err.code.as_ref(), "unauthenticated");
                }
                Ok(())
            })
            .unwrap();
    }
}
