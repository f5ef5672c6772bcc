//! Authentication: human administrators (scrypt verifiers in a credential authority kept
//! apart from user records), sessions carried by Ed25519-signed JWTs, machine users with
//! tokens stored only as SHA-256, and the uniform denial.
//!
//! An authenticated request checks the session and the credential as they are in the store:
//! a JWT is only as good as the durable state it names, so revoking a session, advancing a
//! credential's generation or rotating a machine token ends the sessions it covers at once on
//! this node (verified sessions are kept briefly in memory and dropped on every such write, see
//! [`session_cache`]), and on the other nodes of the fleet within
//! [`session_cache::SESSION_CACHE_TTL`].

pub mod attempts;
pub mod jwt;
pub mod methods;
pub mod password;
pub mod session_cache;
pub mod users;

use capstan_blobs::Blobs;
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_keyring::Keyring;
use capstan_store::{CollectionSpec, Document, Store, Tx};
use jwt::{Claims, JwtKeys};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// The store collection of user records ([`User`]).
pub const USERS: &str = "users";
/// The store collection of the credential authority ([`Credential`], keyed by user id).
pub const CREDENTIALS: &str = "credentials";
/// The store collection of open sessions ([`Session`]).
pub const SESSIONS: &str = "sessions";
pub use capstan_rpc::receipts::RECEIPTS;

/// How long a human session lives.
pub const HUMAN_SESSION: Duration = Duration::from_secs(12 * 3600);
/// How long a JWT exchanged for a machine token lives.
pub const MACHINE_SESSION: Duration = Duration::from_secs(3600);
pub use capstan_rpc::ADMIN_FRESHNESS;

/// A user record. It never carries a password: see [`check_user_record`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct User {
    /// The login name, unique across users.
    pub username: String,
    /// `human` or `machine`.
    pub kind: String,
    /// Whether the user is an infrastructure administrator.
    pub admin: bool,
    /// When the user was created (milliseconds since the epoch).
    pub created_at: u64,
    /// A disabled person cannot log in and holds no session (see [`users`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
}

/// The credential authority's record for one user (same id as the user).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Credential {
    /// `human` or `machine`, as on the user record.
    pub kind: String,
    /// Advances on every credential mutation; human JWTs carry it.
    pub generation: u64,
    /// Human: the scrypt verifier, `None` when password login is revoked.
    pub verifier: Option<String>,
    /// Machine: SHA-256 (hex) of the current token, `None` when revoked.
    pub token_hash: Option<String>,
    /// When the credential last changed (milliseconds since the epoch).
    pub updated_at: u64,
    /// Machine: when the token stops opening sessions (milliseconds since the epoch); `None`: it does not expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expires_at: Option<u64>,
}

/// A stored session: what a JWT's `sid` names and every request re-reads.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    /// The user the session belongs to.
    pub user_id: String,
    /// `human` or `machine`.
    pub kind: String,
    /// Human sessions: the credential generation the session was opened under.
    pub generation: Option<u64>,
    /// Machine sessions: SHA-256 (hex) of the token the session was opened with.
    pub token_hash: Option<String>,
    /// When the session was opened (milliseconds since the epoch).
    pub created_at: u64,
    /// When the session ends (milliseconds since the epoch).
    pub expires_at: u64,
}

pub use capstan_rpc::Identity;

/// The answer to a successful login or token exchange (the JWT is shown this once).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoginAnswer {
    /// The session JWT, sent as a bearer token.
    pub token: String,
    /// When the session and its JWT expire (milliseconds since the epoch).
    pub expires_at: u64,
    /// The id of the user who logged in.
    pub user_id: String,
    /// The username of the user who logged in.
    pub username: String,
    /// Whether the user is an infrastructure administrator.
    pub admin: bool,
}

/// The authentication service: logins, token exchanges and request authentication over the
/// store, with the host's JWT signing key and the failed-login limiters.
pub struct Auth {
    store: Store,
    keys: JwtKeys,
    /// Every scrypt verification and hash of a request goes through it.
    hashing: password::Gate,
    /// What credential-change receipts are digested with.
    receipts: ReceiptKeys,
    /// Sessions verified in the last few seconds, dropped on writes to what they stand on.
    sessions: Arc<session_cache::SessionCache>,
}

pub use capstan_rpc::denied;
pub use capstan_rpc::receipts::ReceiptKeys;

/// The keys mutation receipts are digested with, derived from `keyring`'s KEKs (see
/// [`capstan_rpc::receipts`]).
pub fn receipt_keys(keyring: &Keyring) -> ReceiptKeys {
    let (active, keys) = keyring.derived_keys("mutation receipts");
    ReceiptKeys::new(active, keys)
}

/// The store collections (and their indexes) authentication declares.
pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(USERS).unique("by_username", &["username"]).index("by_kind", &["kind"]),
        CollectionSpec::new(CREDENTIALS).unique("by_token_hash", &["tokenHash"]),
        attempts::collection(),
        CollectionSpec::new(SESSIONS).index("by_user", &["userId"]),
        CollectionSpec::new(RECEIPTS),
    ]
}

/// Refuse a user record that carries anything password- or token-like.
pub fn check_user_record(data: &Value) -> Result<()> {
    let forbidden = ["password", "verifier", "secret", "token", "hash"];
    if let Some(obj) = data.as_object()
        && let Some(key) = obj.keys().find(|k| forbidden.iter().any(|f| k.to_ascii_lowercase().contains(f)))
    {
        return Err(Refusal::new(
            "user-record-carries-password",
            format!("a user record may not carry {key:?}: credentials live in the credential authority"),
        ));
    }
    Ok(())
}

/// SHA-256 of a machine token, hex-encoded: the only form in which Capstan keeps it.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A new machine token: 32 random bytes, base64url, with a recognisable prefix.
pub fn new_machine_token() -> String {
    use base64::Engine;
    format!("capstan_mt_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>()))
}

fn parse<T: serde::de::DeserializeOwned>(doc: &Document) -> Result<T> {
    serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("stored {} is malformed: {e}", doc.id)))
}

fn to_value<T: Serialize>(value: &T) -> Result<Value> {
    serde_json::to_value(value).map_err(Refusal::internal)
}

/// Insert a user and its credential in the caller's transaction.
pub async fn insert_user(tx: &Tx, id: &str, user: &User, credential: &Credential) -> Result<()> {
    let data = to_value(user)?;
    check_user_record(&data)?;
    tx.insert(USERS, id, data).await?;
    tx.insert(CREDENTIALS, id, to_value(credential)?).await?;
    Ok(())
}

async fn find_user_by_name(tx: &Tx, username: &str) -> Result<Option<(String, User)>> {
    let page = tx.find(USERS, "by_username", &[json!(username)], None, 1).await?;
    page.documents.first().map(|d| Ok((d.id.clone(), parse::<User>(d)?))).transpose()
}

/// The user and credential records of a new human with a password verifier.
pub fn human_records(username: &str, admin: bool, verifier: String) -> (User, Credential) {
    let at = now_ms();
    let user = User { username: username.into(), kind: "human".into(), admin, created_at: at, disabled: false };
    let credential = Credential {
        kind: "human".into(),
        generation: 1,
        verifier: Some(verifier),
        token_hash: None,
        updated_at: at,
        token_expires_at: None,
    };
    (user, credential)
}

/// What bootstrapping the first administrator did.
#[derive(Debug, PartialEq)]
pub enum Bootstrap {
    /// The administrator was created.
    Created {
        /// The new administrator's username.
        username: String,
    },
    /// A user with that name already existed and was left untouched.
    AlreadyExists {
        /// The existing user's username.
        username: String,
    },
}

/// Create the administrator `username` with `password` unless that user exists. User and
/// credential are written in one transaction; an existing user is never touched.
pub async fn bootstrap_admin(store: &Store, blobs: &Blobs, username: &str, password: &str) -> Result<Bootstrap> {
    validate_username(username)?;
    password::check_policy(password)?;
    // the usual restart: nothing to hash or claim
    if store.transact(|tx| async move { find_user_by_name(&tx, username).await }).await?.is_some() {
        return Ok(Bootstrap::AlreadyExists { username: username.into() });
    }
    let pw = password.to_string();
    let verifier = tokio::task::spawn_blocking(move || password::hash(&pw)).await.map_err(Refusal::internal)??;
    let id = claim_user_id(blobs, "user").await?;
    let id = id.as_str();
    store
        .transact(|tx| {
            let verifier = verifier.clone();
            async move {
                if find_user_by_name(&tx, username).await?.is_some() {
                    return Ok(Bootstrap::AlreadyExists { username: username.into() });
                }
                let (user, credential) = human_records(username, true, verifier);
                insert_user(&tx, id, &user, &credential).await?;
                Ok(Bootstrap::Created { username: username.into() })
            }
        })
        .await
}

/// A new user id (`user_…` for people, `machine_…` for machine users), claimed in the fleet's
/// shared id keyspace (`_capstan/identities/`) where node ids live too, before the user is
/// written. A claim whose user is then not written (a refused creation) binds nothing and
/// names an id nobody will mint again.
pub async fn claim_user_id(blobs: &Blobs, kind: &str) -> Result<String> {
    let id = capstan_core::ids::new_id(kind);
    capstan_fleet::claim_identity(blobs, &id, kind, "").await?;
    Ok(id)
}

/// Whether any user exists (first start detection for dev mode).
pub async fn any_user(store: &Store) -> Result<bool> {
    Ok(!store.transact(|tx| async move { tx.scan(USERS, None, 1).await }).await?.documents.is_empty())
}

/// Username prefixes Capstan mints itself: a cluster's machine user (`cluster-<name>`) and the
/// registry's runtime credentials. Nobody else may take them.
pub const RESERVED_USERNAME_PREFIXES: &[&str] = &["cluster-", "pallet-registry-"];

/// Refuse a username that is not 1 to 64 of `A-Z a-z 0-9 - _ . @` starting with a letter or
/// digit, or that starts with a [reserved prefix](RESERVED_USERNAME_PREFIXES).
pub fn validate_username(username: &str) -> Result<()> {
    let ok = !username.is_empty()
        && username.len() <= 64
        && username.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
        && username.starts_with(|c: char| c.is_ascii_alphanumeric());
    if !ok {
        return Err(Refusal::invalid_request("a username is 1 to 64 of A-Z a-z 0-9 - _ . @, starting with a letter or digit")
            .with_data(json!({ "field": "username" })));
    }
    if let Some(prefix) = RESERVED_USERNAME_PREFIXES.iter().find(|p| username.to_ascii_lowercase().starts_with(*p)) {
        return Err(Refusal::new("username-reserved", format!("usernames starting with {prefix} are minted by Capstan"))
            .with_data(json!({ "field": "username" })));
    }
    Ok(())
}

/// The registry's door authenticates bearers here (`capstan_rpc::door`).
#[async_trait::async_trait]
impl capstan_rpc::door::Authenticator for Auth {
    async fn authenticate(&self, bearer: &str) -> Result<Identity> {
        Auth::authenticate(self, bearer).await
    }
}

impl Auth {
    /// Declare the authentication collections, load (or create) the host JWT signing key,
    /// and set up the failed-login limiters (10 failures per username, 50 per source
    /// address, in 15 minutes). `issuer` goes into every JWT's `iss`.
    pub async fn new(store: Store, keyring: &Keyring, issuer: &str) -> Result<Arc<Self>> {
        for spec in collections() {
            store.declare(spec).await?;
        }
        let keys = JwtKeys::load_or_create(&store, keyring, issuer).await?;
        let sessions = session_cache::SessionCache::watching(&store);
        Ok(Arc::new(Auth { store, keys, hashing: password::Gate::for_this_machine(), receipts: receipt_keys(keyring), sessions }))
    }

    /// The keys this host's mutation receipts are digested with.
    pub fn receipt_keys(&self) -> &ReceiptKeys {
        &self.receipts
    }

    /// A fresh verifier for `password`, through the hashing gate (`rate-limited` when full).
    pub async fn hash_password(&self, password: &str) -> Result<String> {
        let pw = password.to_string();
        self.hashing.run(move || password::hash(&pw)).await?
    }

    /// Username and password to a JWT. Wrong username and wrong password are one denial. The
    /// attempt counts against the limits (see [`attempts`]: the username from this client, and
    /// the client) before the password is checked, so concurrent attempts cannot all slip
    /// under them; a success takes its count back.
    pub async fn login(&self, username: &str, password: &str, source: Option<IpAddr>) -> Result<LoginAnswer> {
        let user_key = attempts::user_key(username, source);
        let mut keys = vec![(user_key.clone(), attempts::PER_USER_AND_CLIENT)];
        keys.extend(source.map(|client| (attempts::client_key(client), attempts::PER_CLIENT)));
        attempts::begin(&self.store, &keys).await?;
        let take_back = || async {
            if let Err(e) = attempts::take_back(&self.store, &keys).await {
                tracing::warn!(code = %e.code, "a login attempt's count was not taken back: {}", e.message);
            }
        };
        let found = if validate_username(username).is_ok() {
            let read = self
                .store
                .transact(|tx| async move {
                    let Some((id, user)) = find_user_by_name(&tx, username).await? else { return Ok(None) };
                    let credential = tx.get(CREDENTIALS, &id).await?.map(|d| parse::<Credential>(&d)).transpose()?;
                    Ok(Some((id, user, credential)))
                })
                .await;
            match read {
                Ok(found) => found,
                Err(refusal) => {
                    take_back().await;
                    return Err(refusal);
                }
            }
        } else {
            None
        };
        let candidate = found.and_then(|(id, user, credential)| match credential {
            Some(c) if user.kind == "human" && !user.disabled && c.verifier.is_some() => Some((id, user, c)),
            _ => None,
        });
        let pw = password.to_string();
        let verifier = candidate.as_ref().map(|(_, _, credential)| credential.verifier.clone().unwrap_or_default());
        let checked = self
            .hashing
            .run(move || match verifier {
                Some(verifier) => password::verify(&pw, &verifier),
                None => {
                    password::decoy_verify(&pw);
                    false
                }
            })
            .await;
        let verified = match checked {
            Ok(verified) => verified,
            // shed unchecked: it does not count as a failure
            Err(refusal) => {
                take_back().await;
                return Err(refusal);
            }
        };
        let Some((user_id, user, credential)) = candidate.filter(|_| verified) else {
            tracing::info!("login denied");
            return Err(denied());
        };
        take_back().await;
        if let Err(e) = attempts::clear(&self.store, &user_key).await {
            tracing::warn!(code = %e.code, "a login's earlier failures were not forgotten: {}", e.message);
        }
        let at = now_ms();
        let session = Session {
            user_id: user_id.clone(),
            kind: "human".into(),
            generation: Some(credential.generation),
            token_hash: None,
            created_at: at,
            expires_at: at + capstan_core::clock::millis(HUMAN_SESSION),
        };
        self.open_session(&user_id, &user, session, at).await
    }

    /// A machine token to a JWT bound to that token's hash.
    pub async fn exchange_token(&self, token: &str, source: Option<IpAddr>) -> Result<LoginAnswer> {
        // counted before the lookup like a login, per client; a success takes it back
        let keys: Vec<attempts::Keyed> = source.map(|client| (attempts::client_key(client), attempts::PER_CLIENT)).into_iter().collect();
        attempts::begin(&self.store, &keys).await?;
        let hash = token_hash(token);
        let hash_ref = hash.as_str();
        let found = self
            .store
            .transact(|tx| async move {
                let page = tx.find(CREDENTIALS, "by_token_hash", &[json!(hash_ref)], None, 1).await?;
                let Some(doc) = page.documents.first() else { return Ok(None) };
                // an expired token opens nothing, and is denied like any wrong one
                if parse::<Credential>(doc)?.token_expires_at.is_some_and(|t| t <= now_ms()) {
                    return Ok(None);
                }
                let user = tx.get(USERS, &doc.id).await?.map(|d| parse::<User>(&d)).transpose()?;
                Ok(user.map(|u| (doc.id.clone(), u)))
            })
            .await;
        let found = match found {
            Ok(found) => found,
            // never checked: it does not count as a failure
            Err(refusal) => {
                attempts::take_back(&self.store, &keys).await?;
                return Err(refusal);
            }
        };
        let Some((user_id, user)) = found.filter(|(_, u)| u.kind == "machine") else {
            tracing::info!("token exchange denied");
            return Err(denied());
        };
        attempts::take_back(&self.store, &keys).await?;
        let at = now_ms();
        let session = Session {
            user_id: user_id.clone(),
            kind: "machine".into(),
            generation: None,
            token_hash: Some(hash.clone()),
            created_at: at,
            expires_at: at + capstan_core::clock::millis(MACHINE_SESSION),
        };
        self.open_session(&user_id, &user, session, at).await
    }

    /// Open the session of a person the platform's identity provider vouched for (see
    /// `capstan-federation`): its id is the federated session's, it ends at `expires_at`, and it
    /// stands on the person's credential generation like a password session, so revoking the
    /// person's sessions ends it too. A disabled person is refused `user-disabled`.
    pub async fn open_federated_session(&self, user_id: &str, session_id: &str, expires_at: u64) -> Result<LoginAnswer> {
        let found = self.store.read_many(&[(USERS, user_id), (CREDENTIALS, user_id)]).await?;
        let [user, credential] = <[Option<Document>; 2]>::try_from(found).map_err(|_| Refusal::internal("read_many"))?;
        let user = user.map(|d| parse::<User>(&d)).transpose()?;
        let credential = credential.map(|d| parse::<Credential>(&d)).transpose()?;
        let (Some(user), Some(credential)) = (user, credential) else {
            return Err(Refusal::new("user-disabled", "this person is no longer in Capstan"));
        };
        if user.disabled || user.kind != "human" {
            return Err(Refusal::new("user-disabled", "this person is disabled in Capstan: an administrator can enable them again"));
        }
        let at = now_ms();
        let session = Session {
            user_id: user_id.to_string(),
            kind: "human".into(),
            generation: Some(credential.generation),
            token_hash: None,
            created_at: at,
            expires_at,
        };
        self.open_session_as(session_id.to_string(), user_id, &user, session, at).await
    }

    async fn open_session(&self, user_id: &str, user: &User, session: Session, at: u64) -> Result<LoginAnswer> {
        self.open_session_as(capstan_core::ids::new_id("session"), user_id, user, session, at).await
    }

    async fn open_session_as(&self, session_id: String, user_id: &str, user: &User, session: Session, at: u64) -> Result<LoginAnswer> {
        let data = to_value(&session)?;
        let sid = session_id.as_str();
        self.store
            .transact(|tx| {
                let data = data.clone();
                async move { tx.insert(SESSIONS, sid, data).await }
            })
            .await?;
        let claims = Claims {
            iss: self.keys.issuer().to_string(),
            sub: user_id.to_string(),
            sid: session_id.clone(),
            kind: session.kind.clone(),
            generation: session.generation,
            token_hash: session.token_hash.clone(),
            // JWT claims are seconds (RFC 7519), unlike every stored moment
            iat: at / 1000,
            exp: session.expires_at / 1000,
            auth_time: at / 1000,
        };
        tracing::info!(user = %user.username, session = %session_id, "session opened");
        Ok(LoginAnswer {
            token: self.keys.sign(&claims)?,
            expires_at: session.expires_at,
            user_id: user_id.into(),
            username: user.username.clone(),
            admin: user.admin,
        })
    }

    /// A bearer JWT to the identity it stands for, checked against the session and the
    /// credential as they are now (on this node; see [`session_cache`] for the fleet's bound).
    /// Every failure is the uniform denial.
    pub async fn authenticate(&self, bearer: &str) -> Result<Identity> {
        let key = session_cache::SessionCache::key(bearer);
        if let Some(identity) = self.sessions.get(&key) {
            return Ok(identity);
        }
        let epoch = self.sessions.epoch();
        let claims = self.keys.verify(bearer).ok_or_else(denied)?;
        // one short read-only transaction: session, user and credential from one snapshot
        let found = self.store.read_many(&[(SESSIONS, &claims.sid), (USERS, &claims.sub), (CREDENTIALS, &claims.sub)]).await?;
        let [session, user, credential] = <[Option<Document>; 3]>::try_from(found).map_err(|_| Refusal::internal("read_many"))?;
        let session = session.map(|d| parse::<Session>(&d)).transpose()?;
        let user = user.map(|d| parse::<User>(&d)).transpose()?;
        let credential = credential.map(|d| parse::<Credential>(&d)).transpose()?;
        let (Some(session), Some(user), Some(credential)) = (session, user, credential) else { return Err(denied()) };
        let live = session.user_id == claims.sub
            && session.kind == claims.kind
            && user.kind == claims.kind
            && !user.disabled
            && session.expires_at > now_ms()
            && match claims.kind.as_str() {
                "human" => claims.generation == Some(credential.generation) && session.generation == claims.generation,
                "machine" => {
                    claims.token_hash.is_some()
                        && claims.token_hash == credential.token_hash
                        && session.token_hash == claims.token_hash
                        && credential.token_expires_at.is_none_or(|t| t > now_ms())
                }
                _ => false,
            };
        if !live {
            return Err(denied());
        }
        let identity = Identity {
            user_id: claims.sub,
            username: user.username,
            kind: user.kind,
            admin: user.admin,
            session_id: claims.sid,
            authenticated_at: claims.auth_time.saturating_mul(1000),
            expires_at: session.expires_at,
        };
        let valid_until = match (claims.kind.as_str(), credential.token_expires_at) {
            ("machine", Some(token_expires_at)) => session.expires_at.min(token_expires_at),
            _ => session.expires_at,
        };
        self.sessions.insert(key, epoch, identity.clone(), valid_until);
        Ok(identity)
    }

    /// End the caller's session.
    pub async fn logout(&self, identity: &Identity) -> Result<()> {
        let sid = identity.session_id.as_str();
        self.store
            .transact(|tx| async move {
                if let Some(doc) = tx.get(SESSIONS, sid).await? {
                    tx.delete(SESSIONS, sid, doc.revision).await?;
                }
                Ok(())
            })
            .await?;
        tracing::info!(user = %identity.username, session = %sid, "session closed");
        Ok(())
    }

    /// The store authentication reads and writes.
    pub fn store(&self) -> &Store {
        &self.store
    }
}

/// Delete sessions whose expiry has passed (a host task the fleet places on one node).
pub async fn reap_expired_sessions(store: &Store) -> Result<usize> {
    let now = now_ms();
    let reaped = reap(store, SESSIONS, |data| data.get("expiresAt").and_then(Value::as_u64).is_some_and(|at| at <= now)).await?;
    if reaped > 0 {
        tracing::info!(reaped, "expired sessions removed");
    }
    Ok(reaped)
}

/// Delete the documents of `collection` whose `expiresAt` is at or before `now`; how many went.
pub async fn reap_expired(store: &Store, collection: &'static str, now: u64) -> Result<usize> {
    reap(store, collection, |data| data.get("expiresAt").and_then(Value::as_u64).is_some_and(|at| at <= now)).await
}

/// Delete the documents of `collection` whose data `expired` says are; how many went (one
/// changed or deleted meanwhile is left to the next round).
pub(crate) async fn reap(store: &Store, collection: &'static str, expired: impl Fn(&Value) -> bool) -> Result<usize> {
    let mut reaped = 0;
    let mut cursor: Option<String> = None;
    loop {
        let c = cursor.clone();
        let page = store
            .transact(|tx| {
                let c = c.clone();
                async move { tx.scan(collection, c.as_deref(), 500).await }
            })
            .await?;
        for doc in page.documents.iter().filter(|doc| expired(&doc.data)) {
            let (id, revision) = (doc.id.as_str(), doc.revision);
            match store.transact(|tx| async move { tx.delete(collection, id, revision).await }).await {
                Ok(()) => reaped += 1,
                Err(e) if e.is("conflict") || e.is("not-found") => {}
                Err(e) => return Err(e),
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(reaped),
        }
    }
}

/// Delete every session of a user inside the caller's transaction (bounded pages).
pub async fn revoke_sessions(tx: &Tx, user_id: &str) -> Result<usize> {
    let mut count = 0;
    loop {
        let page = tx.find(SESSIONS, "by_user", &[json!(user_id)], None, 500).await?;
        if page.documents.is_empty() {
            return Ok(count);
        }
        for doc in &page.documents {
            tx.delete(SESSIONS, &doc.id, doc.revision).await?;
            count += 1;
        }
    }
}

#[cfg(test)]
mod tests;
