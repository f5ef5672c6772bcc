//! The platform login through the organization's OpenID Connect identity provider
//! (`CAPSTAN_PLATFORM_OIDC_*`, docs/identity.md).
//!
//! At start the issuer's discovery document is read and checked: it must advertise every scope
//! Capstan asks for, a userinfo and an introspection endpoint and PKCE with S256, or the start
//! fails closed naming what is missing ([`discovery`]). A login is an authorization code flow
//! with PKCE, state and nonce; the ID token is verified by the `openidconnect` crate (issuer,
//! audience, signature from the issuer's JWKS — fetched again once when a token names a key it
//! does not hold, so the issuer may rotate —, expiry, nonce) ([`login`]). People are matched by
//! (issuer, subject), never by name or e-mail; their application role comes from the roles
//! claim, their organizations from the organizations claim of the issuer's live userinfo. The
//! IdP's tokens stay in the store sealed under the keyring; Capstan's own session JWT names only
//! the federated session (`fsession_…`), which lasts as long as the IdP's access token and at
//! most [`MAX_SESSION`]. No refresh token is kept. Every owner write of a federated person asks
//! the issuer again (token introspection) before it runs ([`live`]).

pub mod discovery;
mod http;
pub mod live;
pub mod login;
pub mod methods;
pub mod routes;

use capstan_auth::Auth;
use capstan_blobs::Blobs;
use capstan_core::refusal::{Refusal, Result};
use capstan_core::text::SecretString;
use capstan_keyring::Keyring;
use capstan_store::{CollectionSpec, Store};
use std::sync::Arc;
use std::time::Duration;

/// Pending logins: the state, nonce and PKCE verifier of a login on its way through the IdP.
pub const LOGINS: &str = "federated_logins";
/// One-time handoffs from a finished login to the client that started it.
pub const HANDOFFS: &str = "federated_handoffs";
/// (issuer, subject) → Capstan user.
pub const IDENTITIES: &str = "federated_identities";
/// Federated sessions: the IdP's tokens, sealed; same id as the Capstan session they carry.
pub const SESSIONS: &str = "federated_sessions";

/// The longest a federated session lasts, whatever the IdP's tokens say.
pub const MAX_SESSION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a login may take at the IdP.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(10 * 60);
/// How long a finished login waits for its client to pick it up.
pub const HANDOFF_WINDOW: Duration = Duration::from_secs(2 * 60);
/// The prefix of a federated session's id (and of the Capstan session it carries).
pub const SESSION_PREFIX: &str = "fsession";

/// What `CAPSTAN_PLATFORM_OIDC_*` configure.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The issuer URL, exactly as its discovery document names it.
    pub issuer: String,
    /// Capstan's client id at the issuer.
    pub client_id: String,
    /// Capstan's client secret at the issuer (never shown).
    pub client_secret: SecretString,
    /// The scopes asked for; `openid` among them.
    pub scopes: Vec<String>,
    /// The claim naming the person's organizations (default `organizations`).
    pub organization_claim: String,
    /// The claim naming the person's application roles (default `roles`).
    pub roles_claim: String,
    /// The name the sign-in button shows (default: the issuer's host).
    pub display_name: String,
    /// Capstan's public origin: where the IdP sends the browser back to.
    pub public_origin: String,
}

/// The default scopes: the person, and the claims organizations and roles are read from.
pub const DEFAULT_SCOPES: &[&str] = &["openid", "profile", "organizations", "roles"];

impl Settings {
    /// The redirect URI registered at the issuer: `<public origin>/auth/oidc/callback`.
    pub fn redirect_uri(&self) -> String {
        format!("{}{}", self.public_origin, routes::CALLBACK)
    }
}

/// The platform login: the checked issuer, the store it keeps its records in, and the host parts
/// it opens sessions and creates people with.
pub struct Federation {
    settings: Settings,
    provider: discovery::Provider,
    store: Store,
    blobs: Blobs,
    keyring: Arc<Keyring>,
    auth: Arc<Auth>,
}

/// The collections the platform login declares.
pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(LOGINS),
        CollectionSpec::new(HANDOFFS),
        CollectionSpec::new(IDENTITIES).index("by_user", &["userId"]),
        CollectionSpec::new(SESSIONS).index("by_user", &["userId"]),
    ]
}

impl Federation {
    /// Read and check the issuer's discovery document (failing closed, see [`discovery`]) and
    /// declare the collections.
    pub async fn start(settings: Settings, store: Store, blobs: Blobs, keyring: Arc<Keyring>, auth: Arc<Auth>) -> Result<Arc<Self>> {
        for spec in collections() {
            store.declare(spec).await?;
        }
        let provider = discovery::Provider::discover(&settings).await?;
        tracing::info!(issuer = %settings.issuer, "platform OIDC login is on");
        Ok(Arc::new(Federation { settings, provider, store, blobs, keyring, auth }))
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }
}

/// Delete pending logins, handoffs and federated sessions whose time has passed; how many went.
pub async fn reap_expired(store: &Store) -> Result<usize> {
    let now = capstan_core::clock::now_ms();
    let mut reaped = 0;
    for collection in [LOGINS, HANDOFFS, SESSIONS] {
        reaped += capstan_auth::reap_expired(store, collection, now).await?;
    }
    Ok(reaped)
}

fn refusal_internal(what: &str, e: impl std::fmt::Display) -> Refusal {
    Refusal::internal(format!("{what}: {e}"))
}

/// SHA-256, hex: the form in which one-time codes are kept.
fn digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// 32 random bytes, hex: states, nonces, handoff codes.
fn random_code() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}
