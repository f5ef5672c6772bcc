//! Capstan as the OpenID provider of the apps it hosts.
//!
//! A hosted app (Grafana, Gitea, …) logs its users in through Capstan with the OpenID Connect
//! authorization code flow and PKCE (S256, required). Its client is registered by
//! [`HostedOidc::enable_client`] with the roles the app declares; an operator gives a Capstan
//! user one of those roles with [`HostedOidc::assign_role`], and only a human with a role in
//! the app gets through ([`HostedOidc::complete_authorization`] refuses anyone else
//! `hosted-app-access-denied`).
//!
//! The flow: the app sends the browser to `GET /oidc/authorize` ([`HostedOidc::router`]), which
//! checks the request and parks it as a pending authorization (10 minutes), then sends the
//! browser on to the dashboard at `/authorize/<request id>`. There the user, logged
//! in to Capstan, sees [`HostedOidc::authorization`] and approves
//! ([`HostedOidc::complete_authorization`], the browser goes back to the app with a one-use
//! code) or declines ([`HostedOidc::cancel_authorization`], `error=access_denied`). The app
//! exchanges the code at `POST /oidc/token` for an opaque access token (1 hour) and an RS256
//! ID token, and may read `GET /oidc/userinfo` with the access token.
//!
//! The protocol's types (provider metadata, JWKS, ID token claims and their signing) are the
//! `openidconnect` crate's; keys are generated with `rsa` ([`keys`]). Nothing secret is stored
//! in the clear: a client secret, a code, an access token and a pending request's id are kept
//! only as their SHA-256, the signing keys' private halves are sealed under the keyring.

mod http;
pub mod keys;
pub mod methods;
mod token;

pub use methods::register;
pub use token::{HostedIdToken, HostedTokenResponse, HostedUserInfo, RolesClaim};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use capstan_core::clock::{Clock, millis};
use capstan_core::refusal::{Refusal, Result};
use capstan_keyring::Keyring;
use capstan_rpc::Identity;
use capstan_store::{CollectionSpec, Document, Store, Tx};
use keys::KeyRecord;
use openidconnect::core::CoreRsaPrivateSigningKey;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The registered clients, one per hosted app (keyed by service id).
pub const CLIENTS: &str = "hosted_oidc_clients";
/// Who has which role in which app (keyed `<service id>/<user id>`).
pub const ASSIGNMENTS: &str = "hosted_oidc_assignments";
/// Pending authorizations awaiting the user in the dashboard (keyed by the SHA-256 of the id).
pub const REQUESTS: &str = "hosted_oidc_requests";
/// Authorization codes (keyed by the SHA-256 of the code), kept after use to catch a replay.
pub const CODES: &str = "hosted_oidc_codes";
/// Access tokens (keyed by the SHA-256 of the token).
pub const TOKENS: &str = "hosted_oidc_tokens";
/// The ID token signing keys ([`keys`]).
pub const KEYS: &str = "hosted_oidc_keys";

/// How long a pending authorization waits for the user.
pub const REQUEST_LIFETIME: Duration = Duration::from_secs(10 * 60);
/// How long an authorization code may be exchanged.
pub const CODE_LIFETIME: Duration = Duration::from_secs(5 * 60);
/// How long an access token and an ID token live.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);
/// How long a superseded signing key stays published after a rotation.
pub const KEY_OVERLAP: Duration = Duration::from_secs(24 * 3600);

/// The scopes the provider knows; any other scope asked for is ignored.
pub const SCOPES: &[&str] = &["openid", "profile", "roles"];
/// The claims ID tokens and the userinfo answer carry.
pub const CLAIMS: &[&str] = &["iss", "sub", "aud", "iat", "exp", "auth_time", "nonce", "at_hash", "preferred_username", "name", "roles"];

/// What [`HostedOidc::enable_client`] registers for one hosted app.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientSpec {
    /// The hosted app's service id: 1 to 128 of `A-Z a-z 0-9 - _ .`, starting with a letter or digit.
    pub service_id: String,
    /// What the dashboard calls the app when it asks the user (the service id when absent).
    #[serde(default)]
    pub name: Option<String>,
    /// Where the app receives codes: 1 to 10 absolute URLs without fragment, `https` (or `http`
    /// on a loopback host); an authorization request must name one of them exactly.
    pub redirect_uris: Vec<String>,
    /// The roles the app declares (1 to 32, each 1 to 64 of `A-Z a-z 0-9 - _ . :`).
    pub roles: Vec<String>,
}

/// A registered client with its secret, shown this once.
#[derive(Clone, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnabledClient {
    /// The service the client belongs to.
    pub service_id: String,
    /// The OAuth client id the app is configured with.
    pub client_id: String,
    /// The client secret: 32 random bytes, base64url. Capstan keeps only its SHA-256.
    pub client_secret: String,
    /// The issuer; discovery is at `<issuer>/.well-known/openid-configuration`.
    pub issuer: String,
    /// The registered redirect URIs.
    pub redirect_uris: Vec<String>,
    /// The roles the app declares.
    pub roles: Vec<String>,
}

/// Debug without the secret.
impl std::fmt::Debug for EnabledClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnabledClient")
            .field("service_id", &self.service_id)
            .field("client_id", &self.client_id)
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

/// A registered client's metadata: never its secret or the secret's hash.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientView {
    /// The service the client belongs to.
    pub service_id: String,
    /// The OAuth client id.
    pub client_id: String,
    /// What the dashboard calls the app.
    pub name: String,
    /// The registered redirect URIs.
    pub redirect_uris: Vec<String>,
    /// The roles the app declares.
    pub roles: Vec<String>,
    /// When the client (and its current secret) was registered (milliseconds since the epoch).
    pub created_at: u64,
}

/// One user's role in one app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoleAssignment {
    /// The hosted app's service id.
    pub service_id: String,
    /// The Capstan user id.
    pub user_id: String,
    /// The role, one the app declares.
    pub role: String,
    /// When it was assigned (milliseconds since the epoch).
    pub assigned_at: u64,
}

/// A signing key's metadata (never the key).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyView {
    /// The key id ID tokens name in their header.
    pub kid: String,
    /// Always `RS256`.
    pub algorithm: String,
    /// When the key was made (milliseconds since the epoch).
    pub created_at: u64,
    /// When a superseded key stops being published (milliseconds since the epoch); absent for
    /// the active key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retires_at: Option<u64>,
}

/// What the dashboard shows a user about a pending authorization.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationView {
    /// The pending authorization's id.
    pub request_id: String,
    /// The hosted app's service id.
    pub service_id: String,
    /// What the app is called.
    pub app_name: String,
    /// The OAuth client id.
    pub client_id: String,
    /// The scopes asked for that the provider knows (`openid`, `profile`, `roles`).
    pub scopes: Vec<String>,
    /// Where the browser goes back to (scheme, host and port of the redirect URI).
    pub redirect_origin: String,
    /// The role the user would have in the app; absent: the user has none and is refused.
    pub role: Option<String>,
    /// When the pending authorization lapses (milliseconds since the epoch).
    pub expires_at: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClientRecord {
    service_id: String,
    client_id: String,
    name: String,
    /// SHA-256 (hex) of the client secret.
    secret_hash: String,
    redirect_uris: Vec<String>,
    roles: Vec<String>,
    created_at: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PendingRequest {
    service_id: String,
    client_id: String,
    redirect_uri: String,
    scopes: Vec<String>,
    state: String,
    #[serde(default)]
    nonce: Option<String>,
    code_challenge: String,
    created_at: u64,
    expires_at: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CodeRecord {
    service_id: String,
    client_id: String,
    user_id: String,
    username: String,
    redirect_uri: String,
    scopes: Vec<String>,
    #[serde(default)]
    nonce: Option<String>,
    code_challenge: String,
    /// When the user last proved who they are (milliseconds since the epoch).
    auth_time: u64,
    created_at: u64,
    expires_at: u64,
    /// When the code was exchanged (or a failed exchange spent it).
    #[serde(default)]
    used_at: Option<u64>,
    /// When the record may go: after its expiry, or once used after the tokens it issued.
    reap_after: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TokenRecord {
    service_id: String,
    client_id: String,
    user_id: String,
    username: String,
    /// The document id of the code the token was issued for.
    code_id: String,
    scopes: Vec<String>,
    created_at: u64,
    expires_at: u64,
}

/// Remove the client of `service_id` with its pending requests, codes, tokens and role
/// assignments, in the caller's transaction (a deleted service's cleanup); whether there was one.
pub async fn remove_service(tx: &Tx, service_id: &str) -> Result<bool> {
    let Some(doc) = tx.get(CLIENTS, service_id).await? else { return Ok(false) };
    forget_grants(tx, service_id).await?;
    for doc in tx.find_all(ASSIGNMENTS, "by_service", &[json!(service_id)]).await? {
        tx.delete(ASSIGNMENTS, &doc.id, doc.revision).await?;
    }
    tx.delete(CLIENTS, service_id, doc.revision).await?;
    Ok(true)
}

/// The store collections (and their indexes) the provider declares.
pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(CLIENTS).unique("by_client_id", &["clientId"]),
        CollectionSpec::new(ASSIGNMENTS).index("by_service", &["serviceId"]).index("by_user", &["userId"]),
        CollectionSpec::new(REQUESTS).index("by_service", &["serviceId"]),
        CollectionSpec::new(CODES).index("by_service", &["serviceId"]),
        CollectionSpec::new(TOKENS)
            .index("by_service", &["serviceId"])
            .index("by_code", &["codeId"])
            .index("by_service_user", &["serviceId", "userId"])
            .index("by_user", &["userId"]),
        CollectionSpec::new(KEYS),
    ]
}

/// SHA-256 of `text`, hex: the only form a secret, a code, a token or a request id is kept in.
pub fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// 32 random bytes, base64url without padding.
fn random_token() -> String {
    B64URL.encode(rand::random::<[u8; 32]>())
}

fn parse<T: serde::de::DeserializeOwned>(doc: &Document) -> Result<T> {
    serde_json::from_value(doc.data.clone()).map_err(|e| Refusal::internal(format!("stored {} is malformed: {e}", doc.id)))
}

fn to_value<T: Serialize>(value: &T) -> Result<Value> {
    serde_json::to_value(value).map_err(Refusal::internal)
}

fn assignment_id(service_id: &str, user_id: &str) -> String {
    format!("{service_id}/{user_id}")
}

/// `hosted-oidc-client-unknown`.
fn client_unknown(service_id: &str) -> Refusal {
    let shown: String = service_id.chars().take(128).collect();
    Refusal::new("hosted-oidc-client-unknown", format!("no OpenID client is enabled for the service {shown:?}"))
        .with_data(json!({ "serviceId": shown }))
}

/// `hosted-oidc-request-unknown`: one answer for an id never issued, lapsed, used or withdrawn.
fn request_unknown() -> Refusal {
    Refusal::new("hosted-oidc-request-unknown", "this sign-in request is unknown or has lapsed: start again from the app")
}

fn require_human(who: &Identity) -> Result<()> {
    if who.kind != "human" {
        return Err(Refusal::new("hosted-oidc-human-required", "only a person signs in to a hosted app"));
    }
    Ok(())
}

/// Refuse a service id that is not 1 to 128 of `A-Z a-z 0-9 - _ .` starting with a letter or digit.
fn validate_service_id(service_id: &str) -> Result<()> {
    let ok = !service_id.is_empty()
        && service_id.len() <= 128
        && service_id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && service_id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Refusal::invalid_field("serviceId", "a service id is 1 to 128 of A-Z a-z 0-9 - _ . starting with a letter or digit"))
    }
}

fn validate_role(role: &str) -> bool {
    !role.is_empty() && role.len() <= 64 && role.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
}

/// Refuse (`hosted-oidc-redirect-invalid`) a redirect URI that is not absolute, carries a
/// fragment or credentials, or is `http` on anything but a loopback host.
fn validate_redirect_uri(uri: &str) -> Result<()> {
    let invalid = |why: &str| {
        Refusal::new("hosted-oidc-redirect-invalid", format!("a redirect URI {why}")).with_data(json!({ "field": "redirectUris" }))
    };
    if uri.len() > 2048 {
        return Err(invalid("is at most 2048 bytes"));
    }
    let parsed = url::Url::parse(uri).map_err(|_| invalid("is an absolute URL"))?;
    if parsed.fragment().is_some() {
        return Err(invalid("has no fragment"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid("carries no credentials"));
    }
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if is_loopback(&parsed) => Ok(()),
        _ => Err(invalid("is https (http only on a loopback host)")),
    }
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// `redirect_uri` with `params` appended to its query.
fn redirect_with(redirect_uri: &str, params: &[(&str, &str)]) -> Result<String> {
    let mut url = url::Url::parse(redirect_uri).map_err(|_| Refusal::internal("a stored redirect URI does not parse"))?;
    {
        let mut query = url.query_pairs_mut();
        for (key, value) in params {
            query.append_pair(key, value);
        }
    }
    Ok(url.into())
}

/// The provider: clients, role assignments, pending authorizations, codes, tokens and keys,
/// all in the store, so every process of a fleet answers alike.
pub struct HostedOidc {
    store: Store,
    keyring: Arc<Keyring>,
    clock: Clock,
    origin: String,
    issuer: String,
    /// The active key as last opened: (kid, key). Reopened when another key becomes active.
    signing: Mutex<Option<(String, Arc<CoreRsaPrivateSigningKey>)>>,
}

impl std::fmt::Debug for HostedOidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostedOidc").field("issuer", &self.issuer).finish_non_exhaustive()
    }
}

impl HostedOidc {
    /// The provider of `public_origin` (`https://capstan.example`, no path): its issuer is
    /// `<public origin>/oidc`. Declares the collections and loads the signing key, making one
    /// (sealed under `keyring`) on the first start.
    pub async fn new(store: Store, keyring: Arc<Keyring>, public_origin: &str) -> Result<Arc<Self>> {
        Self::with_clock(store, keyring, public_origin, Clock::system()).await
    }

    /// [`HostedOidc::new`] reading time from `clock` (tests move it past lifetimes).
    pub async fn with_clock(store: Store, keyring: Arc<Keyring>, public_origin: &str, clock: Clock) -> Result<Arc<Self>> {
        let origin = public_origin.trim_end_matches('/');
        let parsed = url::Url::parse(origin).map_err(|_| Refusal::invalid_field("publicOrigin", "the public origin is an absolute URL"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() || parsed.path() != "/" || parsed.query().is_some() {
            return Err(Refusal::invalid_field("publicOrigin", "the public origin is http(s)://host[:port], without a path"));
        }
        for spec in collections() {
            store.declare(spec).await?;
        }
        let oidc = Arc::new(HostedOidc {
            store,
            keyring,
            clock,
            origin: origin.to_string(),
            issuer: format!("{origin}/oidc"),
            signing: Mutex::new(None),
        });
        oidc.active_key().await?;
        Ok(oidc)
    }

    /// The issuer: `<public origin>/oidc`.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Register the client of one hosted app, or replace it: a new client id and secret (the
    /// old ones, their pending authorizations, codes and tokens stop working), the new redirect
    /// URIs and roles (an assignment of a role no longer declared goes). The secret is
    /// answered this once; only its SHA-256 is kept.
    pub async fn enable_client(&self, input: ClientSpec) -> Result<EnabledClient> {
        validate_service_id(&input.service_id)?;
        if input.redirect_uris.is_empty() || input.redirect_uris.len() > 10 {
            return Err(Refusal::new("hosted-oidc-redirect-invalid", "a client has 1 to 10 redirect URIs")
                .with_data(json!({ "field": "redirectUris" })));
        }
        for uri in &input.redirect_uris {
            validate_redirect_uri(uri)?;
        }
        let mut roles: Vec<String> = Vec::new();
        for role in &input.roles {
            if !roles.contains(role) {
                roles.push(role.clone());
            }
        }
        if roles.is_empty() || roles.len() > 32 || !roles.iter().all(|r| validate_role(r)) {
            return Err(Refusal::invalid_field("roles", "an app declares 1 to 32 roles, each 1 to 64 of A-Z a-z 0-9 - _ . :"));
        }
        let name = input.name.clone().filter(|n| !n.trim().is_empty()).unwrap_or_else(|| input.service_id.clone());
        if name.chars().count() > 128 || name.chars().any(char::is_control) {
            return Err(Refusal::invalid_field("name", "an app's name is at most 128 characters without control characters"));
        }
        let secret = random_token();
        let record = ClientRecord {
            service_id: input.service_id.clone(),
            client_id: capstan_core::ids::new_id("oidc"),
            name,
            secret_hash: digest(&secret),
            redirect_uris: input.redirect_uris.clone(),
            roles: roles.clone(),
            created_at: self.now(),
        };
        let data = to_value(&record)?;
        let service_id = record.service_id.as_str();
        let replaced = self
            .store
            .transact(|tx| {
                let (data, roles) = (data.clone(), roles.clone());
                async move {
                    let existing = tx.get(CLIENTS, service_id).await?;
                    let replaced = existing.is_some();
                    if let Some(doc) = existing {
                        forget_grants(&tx, service_id).await?;
                        for doc in tx.find_all(ASSIGNMENTS, "by_service", &[json!(service_id)]).await? {
                            let assignment: RoleAssignment = parse(&doc)?;
                            if !roles.contains(&assignment.role) {
                                tx.delete(ASSIGNMENTS, &doc.id, doc.revision).await?;
                            }
                        }
                        tx.replace(CLIENTS, service_id, doc.revision, data).await?;
                    } else {
                        tx.insert(CLIENTS, service_id, data).await?;
                    }
                    Ok(replaced)
                }
            })
            .await?;
        tracing::info!(service = %service_id, client = %record.client_id, replaced, "hosted app OpenID client enabled");
        Ok(EnabledClient {
            service_id: record.service_id,
            client_id: record.client_id,
            client_secret: secret,
            issuer: self.issuer.clone(),
            redirect_uris: record.redirect_uris,
            roles: record.roles,
        })
    }

    /// Remove the client of `service_id` with everything hanging from it: pending
    /// authorizations, codes, access tokens and role assignments. Whether there was one.
    pub async fn disable_client(&self, service_id: &str) -> Result<bool> {
        validate_service_id(service_id)?;
        let removed = self.store.transact(|tx| async move { remove_service(&tx, service_id).await }).await?;
        if removed {
            tracing::info!(service = %service_id, "hosted app OpenID client disabled");
        }
        Ok(removed)
    }

    /// The client of `service_id`, without its secret.
    pub async fn client(&self, service_id: &str) -> Result<Option<ClientView>> {
        validate_service_id(service_id)?;
        let doc = self.store.transact(|tx| async move { tx.get(CLIENTS, service_id).await }).await?;
        doc.map(|d| parse::<ClientRecord>(&d).map(view)).transpose()
    }

    /// Give `user_id` the role `role` in the app of `service_id` (replacing any role they had),
    /// or with `None` take their role away, which ends their access tokens for the app. The
    /// role must be one the app declares (`hosted-oidc-role-undeclared`). The caller answers
    /// for `user_id` naming a Capstan user.
    pub async fn assign_role(&self, service_id: &str, user_id: &str, role: Option<&str>) -> Result<()> {
        validate_service_id(service_id)?;
        if user_id.is_empty() || user_id.len() > 128 || user_id.chars().any(char::is_control) {
            return Err(Refusal::invalid_field("userId", "a user id is 1 to 128 characters"));
        }
        let id = assignment_id(service_id, user_id);
        let at = self.now();
        self.store
            .transact(|tx| {
                let id = id.clone();
                async move {
                    let client: ClientRecord = parse(&tx.get(CLIENTS, service_id).await?.ok_or_else(|| client_unknown(service_id))?)?;
                    let existing = tx.get(ASSIGNMENTS, &id).await?;
                    match role {
                        Some(role) => {
                            if !client.roles.iter().any(|r| r == role) {
                                let shown: String = role.chars().take(64).collect();
                                return Err(Refusal::new(
                                    "hosted-oidc-role-undeclared",
                                    format!("the app does not declare the role {shown:?}"),
                                )
                                .with_data(json!({ "role": shown, "declared": client.roles })));
                            }
                            let record = RoleAssignment {
                                service_id: service_id.into(),
                                user_id: user_id.into(),
                                role: role.into(),
                                assigned_at: at,
                            };
                            tx.put(ASSIGNMENTS, &id, existing.map(|d| d.revision), to_value(&record)?).await?;
                        }
                        None => {
                            if let Some(doc) = existing {
                                tx.delete(ASSIGNMENTS, &id, doc.revision).await?;
                            }
                            for doc in tx.find_all(TOKENS, "by_service_user", &[json!(service_id), json!(user_id)]).await? {
                                tx.delete(TOKENS, &doc.id, doc.revision).await?;
                            }
                        }
                    }
                    Ok(())
                }
            })
            .await?;
        tracing::info!(service = %service_id, user = %user_id, role = role.unwrap_or("-"), "hosted app role assigned");
        Ok(())
    }

    /// Take every role `user_id` has in any app away and end their access tokens: for a user
    /// who is deleted or disabled. How many assignments and tokens went.
    pub async fn forget_user(&self, user_id: &str) -> Result<usize> {
        let removed = self
            .store
            .transact(|tx| async move {
                let mut removed = 0;
                for collection in [ASSIGNMENTS, TOKENS] {
                    for doc in tx.find_all(collection, "by_user", &[json!(user_id)]).await? {
                        tx.delete(collection, &doc.id, doc.revision).await?;
                        removed += 1;
                    }
                }
                Ok(removed)
            })
            .await?;
        if removed > 0 {
            tracing::info!(user = %user_id, removed, "a user's hosted app roles and tokens removed");
        }
        Ok(removed)
    }

    /// The role assignments of the app of `service_id`, by user id.
    pub async fn assignments(&self, service_id: &str) -> Result<Vec<RoleAssignment>> {
        validate_service_id(service_id)?;
        let docs = self.store.transact(|tx| async move { tx.find_all(ASSIGNMENTS, "by_service", &[json!(service_id)]).await }).await?;
        let mut all: Vec<RoleAssignment> = docs.iter().map(parse).collect::<Result<_>>()?;
        all.sort_by(|a, b| a.user_id.cmp(&b.user_id));
        Ok(all)
    }

    /// The published signing keys, the active one first.
    pub async fn signing_keys(&self) -> Result<Vec<KeyView>> {
        Ok(self.published_keys().await?.iter().map(key_view).collect())
    }

    /// Make a new signing key active. The keys it supersedes stay published for
    /// [`KEY_OVERLAP`] (ID tokens they signed still verify), then are dropped.
    pub async fn rotate_signing_key(&self) -> Result<KeyView> {
        let keyring = self.keyring.clone();
        let at = self.now();
        let (record, signing) = tokio::task::spawn_blocking(move || keys::generate(&keyring, at)).await.map_err(Refusal::internal)??;
        let data = to_value(&record)?;
        let kid = record.kid.as_str();
        let retires_at = at + millis(KEY_OVERLAP);
        self.store
            .transact(|tx| {
                let data = data.clone();
                async move {
                    for doc in all_docs(&tx, KEYS).await? {
                        let mut old: KeyRecord = parse(&doc)?;
                        if !old.published(at) {
                            tx.delete(KEYS, &doc.id, doc.revision).await?;
                        } else if old.retires_at.is_none() {
                            old.retires_at = Some(retires_at);
                            tx.replace(KEYS, &doc.id, doc.revision, to_value(&old)?).await?;
                        }
                    }
                    tx.insert(KEYS, kid, data).await
                }
            })
            .await?;
        *self.signing.lock().expect("signing key lock") = Some((record.kid.clone(), Arc::new(signing)));
        tracing::info!(kid = %record.kid, "hosted apps' ID token signing key rotated");
        Ok(key_view(&record))
    }

    /// Every key record the JWKS publishes now, the active one first.
    async fn published_keys(&self) -> Result<Vec<KeyRecord>> {
        let now = self.now();
        let docs = self.store.transact(|tx| async move { all_docs(&tx, KEYS).await }).await?;
        let mut records: Vec<KeyRecord> = docs.iter().map(parse).collect::<Result<Vec<KeyRecord>>>()?;
        records.retain(|r| r.published(now));
        keys::order(&mut records);
        Ok(records)
    }

    /// The active signing key, made on the first start. Processes starting together may each
    /// make one: all are published, and every process signs with the same one (the newest).
    async fn active_key(&self) -> Result<(String, Arc<CoreRsaPrivateSigningKey>)> {
        let active = self.published_keys().await?.into_iter().find(|r| r.retires_at.is_none());
        let record = match active {
            Some(record) => record,
            None => {
                let keyring = self.keyring.clone();
                let at = self.now();
                let (record, signing) =
                    tokio::task::spawn_blocking(move || keys::generate(&keyring, at)).await.map_err(Refusal::internal)??;
                let data = to_value(&record)?;
                let kid = record.kid.as_str();
                self.store
                    .transact(|tx| {
                        let data = data.clone();
                        async move { tx.insert(KEYS, kid, data).await }
                    })
                    .await?;
                tracing::info!(kid = %record.kid, "generated the hosted apps' ID token signing key (sealed under the keyring)");
                let signing = Arc::new(signing);
                *self.signing.lock().expect("signing key lock") = Some((record.kid.clone(), signing.clone()));
                return Ok((record.kid, signing));
            }
        };
        if let Some((kid, key)) = self.signing.lock().expect("signing key lock").as_ref()
            && *kid == record.kid
        {
            return Ok((kid.clone(), key.clone()));
        }
        let signing = Arc::new(keys::open(&self.keyring, &record)?);
        *self.signing.lock().expect("signing key lock") = Some((record.kid.clone(), signing.clone()));
        Ok((record.kid, signing))
    }

    /// The pending authorization `request_id` names, its client and the role `who` would get.
    async fn pending(&self, tx: &Tx, request_id: &str) -> Result<(Document, PendingRequest, ClientRecord)> {
        let doc = tx.get(REQUESTS, &digest(request_id)).await?.ok_or_else(request_unknown)?;
        let request: PendingRequest = parse(&doc)?;
        if request.expires_at <= self.now() {
            return Err(request_unknown());
        }
        let client = match tx.get(CLIENTS, &request.service_id).await? {
            Some(client) => parse::<ClientRecord>(&client)?,
            None => return Err(request_unknown()),
        };
        if client.client_id != request.client_id {
            return Err(request_unknown());
        }
        Ok((doc, request, client))
    }

    /// What the dashboard shows `who` about the pending authorization `request_id`: the app,
    /// the scopes and the role they would get (none: they would be refused).
    pub async fn authorization(&self, request_id: &str, who: &Identity) -> Result<AuthorizationView> {
        require_human(who)?;
        let user_id = who.user_id.as_str();
        self.store
            .transact(|tx| async move {
                let (_, request, client) = self.pending(&tx, request_id).await?;
                let role = role_of(&tx, &client.service_id, user_id).await?;
                let redirect_origin = url::Url::parse(&request.redirect_uri).map(|u| u.origin().ascii_serialization()).unwrap_or_default();
                Ok(AuthorizationView {
                    request_id: request_id.to_string(),
                    service_id: client.service_id,
                    app_name: client.name,
                    client_id: client.client_id,
                    scopes: request.scopes,
                    redirect_origin,
                    role,
                    expires_at: request.expires_at,
                })
            })
            .await
    }

    /// `who` approves the pending authorization `request_id`: answers the URL the browser goes
    /// back to, the app's redirect URI with a one-use `code`, the `state` and the `iss`. A user
    /// without a role in the app is refused `hosted-app-access-denied` (the request stays, so
    /// an operator may assign one, or the user may decline).
    pub async fn complete_authorization(&self, request_id: &str, who: &Identity) -> Result<String> {
        require_human(who)?;
        let code = random_token();
        let code_id = digest(&code);
        let now = self.now();
        let (service_id, redirect) = self
            .store
            .transact(|tx| {
                let code_id = code_id.clone();
                let code = code.clone();
                async move {
                    let (doc, request, client) = self.pending(&tx, request_id).await?;
                    if role_of(&tx, &client.service_id, &who.user_id).await?.is_none() {
                        return Err(Refusal::new(
                            "hosted-app-access-denied",
                            format!("you have no role in {}: an administrator assigns one", client.name),
                        )
                        .with_data(json!({ "serviceId": client.service_id })));
                    }
                    let record = CodeRecord {
                        service_id: client.service_id.clone(),
                        client_id: client.client_id.clone(),
                        user_id: who.user_id.clone(),
                        username: who.username.clone(),
                        redirect_uri: request.redirect_uri.clone(),
                        scopes: request.scopes.clone(),
                        nonce: request.nonce.clone(),
                        code_challenge: request.code_challenge.clone(),
                        auth_time: who.authenticated_at,
                        created_at: now,
                        expires_at: now + millis(CODE_LIFETIME),
                        used_at: None,
                        reap_after: now + millis(CODE_LIFETIME),
                    };
                    tx.delete(REQUESTS, &doc.id, doc.revision).await?;
                    tx.insert(CODES, &code_id, to_value(&record)?).await?;
                    let redirect =
                        redirect_with(&request.redirect_uri, &[("code", &code), ("state", &request.state), ("iss", &self.issuer)])?;
                    Ok((client.service_id, redirect))
                }
            })
            .await?;
        tracing::info!(service = %service_id, user = %who.user_id, "hosted app sign-in approved");
        Ok(redirect)
    }

    /// `who` declines the pending authorization `request_id`: answers the URL the browser goes
    /// back to, the app's redirect URI with `error=access_denied` and the `state`.
    pub async fn cancel_authorization(&self, request_id: &str, who: &Identity) -> Result<String> {
        require_human(who)?;
        let redirect = self
            .store
            .transact(|tx| async move {
                let (doc, request, _) = self.pending(&tx, request_id).await?;
                tx.delete(REQUESTS, &doc.id, doc.revision).await?;
                redirect_with(
                    &request.redirect_uri,
                    &[
                        ("error", "access_denied"),
                        ("error_description", "the user declined the sign-in"),
                        ("state", &request.state),
                        ("iss", &self.issuer),
                    ],
                )
            })
            .await?;
        tracing::info!(user = %who.user_id, "hosted app sign-in declined");
        Ok(redirect)
    }

    /// The axum router of the public endpoints, under `/oidc`: discovery, JWKS, authorize,
    /// token and userinfo.
    pub fn router<S: Clone + Send + Sync + 'static>(self: &Arc<Self>) -> axum::Router<S> {
        http::router(self.clone())
    }

    /// Delete what has lapsed: pending authorizations, codes (a used one once the tokens it
    /// issued have expired), access tokens, and signing keys past their overlap. How many
    /// documents went. For a periodic host task; nothing depends on it for correctness.
    pub async fn reap_expired(&self) -> Result<usize> {
        let now = self.now();
        let mut reaped = 0;
        for (collection, field) in [(REQUESTS, "expiresAt"), (CODES, "reapAfter"), (TOKENS, "expiresAt"), (KEYS, "retiresAt")] {
            let docs = self.store.transact(|tx| async move { all_docs(&tx, collection).await }).await?;
            for doc in docs.iter().filter(|d| d.data.get(field).and_then(Value::as_u64).is_some_and(|at| at <= now)) {
                let (id, revision) = (doc.id.as_str(), doc.revision);
                match self.store.transact(|tx| async move { tx.delete(collection, id, revision).await }).await {
                    Ok(()) => reaped += 1,
                    Err(e) if e.is("conflict") || e.is("not-found") => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(reaped)
    }
}

fn view(record: ClientRecord) -> ClientView {
    ClientView {
        service_id: record.service_id,
        client_id: record.client_id,
        name: record.name,
        redirect_uris: record.redirect_uris,
        roles: record.roles,
        created_at: record.created_at,
    }
}

fn key_view(record: &KeyRecord) -> KeyView {
    KeyView { kid: record.kid.clone(), algorithm: "RS256".into(), created_at: record.created_at, retires_at: record.retires_at }
}

/// The role `user_id` has in the app of `service_id`, if any.
async fn role_of(tx: &Tx, service_id: &str, user_id: &str) -> Result<Option<String>> {
    let doc = tx.get(ASSIGNMENTS, &assignment_id(service_id, user_id)).await?;
    Ok(doc.map(|d| parse::<RoleAssignment>(&d)).transpose()?.map(|a| a.role))
}

/// Every document of `collection`, page by page in this transaction.
async fn all_docs(tx: &Tx, collection: &str) -> Result<Vec<Document>> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = tx.scan(collection, cursor.as_deref(), capstan_store::MAX_PAGE).await?;
        all.extend(page.documents);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(all),
        }
    }
}

/// Delete the pending authorizations, codes and access tokens of `service_id`.
async fn forget_grants(tx: &Tx, service_id: &str) -> Result<()> {
    for collection in [REQUESTS, CODES, TOKENS] {
        for doc in tx.find_all(collection, "by_service", &[json!(service_id)]).await? {
            tx.delete(collection, &doc.id, doc.revision).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
