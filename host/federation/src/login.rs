//! One login through the identity provider, from the browser's first redirect to the Capstan
//! session its client picks up.
//!
//! 1. [`Federation::start_login`]: the client (the dashboard, or `capstan login --oidc`) names
//!    where the login returns to and the S256 challenge of a verifier it keeps; Capstan keeps a
//!    pending login (state, nonce, its own PKCE verifier sealed) and answers the IdP's
//!    authorization URL.
//! 2. [`Federation::finish_login`]: the IdP's redirect back. The pending login is taken (one
//!    use), the code exchanged with the PKCE verifier, the ID token verified, the live userinfo
//!    read, the person matched or created by (issuer, subject), their provider-granted
//!    memberships brought in step, and a one-time handoff code made for the return address.
//! 3. [`Federation::complete_handoff`]: the client shows the handoff code with its verifier and
//!    gets Capstan's session JWT. A handoff code seen by anyone else is worth nothing.

use crate::{Federation, HANDOFFS, IDENTITIES, LOGINS, SESSIONS, digest, http, random_code, refusal_internal};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use capstan_auth::{Credential, LoginAnswer, USERS, User};
use capstan_core::clock::{millis, now_ms};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::organizations::sync_provider_memberships;
use capstan_keyring::seal::{Context, Sealed};
use capstan_rpc::OrgRole;
use capstan_store::Tx;
use openidconnect::core::CoreGenderClaim;
use openidconnect::{
    AccessTokenHash, AdditionalClaims, AuthorizationCode, ClaimsVerificationError, CsrfToken, Nonce, OAuth2TokenResponse,
    PkceCodeChallenge, PkceCodeVerifier, RequestTokenError, Scope, SignatureVerificationError, TokenResponse, UserInfoClaims,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::Duration;

/// A pending login, as kept between the redirect to the IdP and its answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PendingLogin {
    nonce: String,
    /// Capstan's own PKCE verifier for the IdP, sealed.
    verifier: Sealed,
    /// The client's challenge the handoff will be checked against.
    challenge: String,
    return_to: String,
    created_at: u64,
    expires_at: u64,
}

/// A finished login waiting for its client.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Handoff {
    session_id: String,
    user_id: String,
    challenge: String,
    session_expires_at: u64,
    expires_at: u64,
}

/// A federated session: the IdP's tokens, sealed, for the live checks of owner writes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FederatedSession {
    /// The Capstan user.
    pub user_id: String,
    /// The issuer and the person's subject there.
    pub issuer: String,
    /// The person's subject at the issuer.
    pub subject: String,
    /// The access token (and the ID token), sealed under the keyring.
    pub tokens: Sealed,
    /// When the session was opened (milliseconds since the epoch).
    pub created_at: u64,
    /// When it ends: the access token's expiry, at most [`crate::MAX_SESSION`] after it opened.
    pub expires_at: u64,
}

/// What [`FederatedSession::tokens`] holds.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tokens {
    /// The IdP's access token (introspected and shown to userinfo).
    pub access_token: String,
    /// The ID token the login was made with.
    pub id_token: String,
}

/// The record (issuer, subject) → user.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FederatedIdentity {
    issuer: String,
    subject: String,
    user_id: String,
    created_at: u64,
    last_login_at: u64,
}

/// Where a finished login goes: a path of this Capstan, or a loopback address (RFC 8252) where
/// `capstan login --oidc` listens.
#[derive(Debug, Clone, PartialEq)]
pub enum ReturnTo {
    /// A path on this origin (`/login/oidc/finish`).
    Here(String),
    /// `http://127.0.0.1:<port>/…`, `http://[::1]:<port>/…` or `http://localhost:<port>/…`.
    Loopback(url::Url),
}

impl ReturnTo {
    /// Read a return address; anything else is refused `oidc-return-invalid` (no open redirect).
    pub fn parse(text: &str) -> Result<ReturnTo> {
        let invalid = || {
            Refusal::new("oidc-return-invalid", "a login returns to a path of this Capstan or to http://127.0.0.1:<port>/ (the CLI)")
                .with_data(json!({ "field": "returnTo" }))
        };
        if text.len() > 512 {
            return Err(invalid());
        }
        if text.starts_with('/') && !text.starts_with("//") && !text.contains('\\') {
            return Ok(ReturnTo::Here(text.to_string()));
        }
        let url = url::Url::parse(text).map_err(|_| invalid())?;
        let loopback = matches!(url.host_str(), Some("127.0.0.1" | "[::1]" | "localhost"));
        if url.scheme() == "http" && loopback && url.port().is_some() && url.username().is_empty() && url.fragment().is_none() {
            return Ok(ReturnTo::Loopback(url));
        }
        Err(invalid())
    }

    /// The address with `pairs` added to its query.
    pub fn with(&self, pairs: &[(&str, &str)]) -> String {
        let base = match self {
            ReturnTo::Here(path) => url::Url::parse(&format!("http://here{path}")).expect("a path"),
            ReturnTo::Loopback(url) => url.clone(),
        };
        let mut url = base;
        url.query_pairs_mut().extend_pairs(pairs);
        match self {
            ReturnTo::Here(_) => format!("{}{}", url.path(), url.query().map(|q| format!("?{q}")).unwrap_or_default()),
            ReturnTo::Loopback(_) => url.to_string(),
        }
    }
}

/// The S256 challenge of `verifier`.
pub fn challenge_of(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

fn check_challenge(challenge: &str) -> Result<()> {
    if challenge.len() == 43 && challenge.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        Ok(())
    } else {
        Err(Refusal::invalid_request("challenge is the S256 challenge of a verifier: 43 base64url characters")
            .with_data(json!({ "field": "challenge" })))
    }
}

fn unknown_login() -> Refusal {
    Refusal::new(
        "oidc-login-unknown",
        "this login is not known here: it was finished already, or began more than 10 minutes ago — sign in again",
    )
}

fn unavailable(e: impl std::fmt::Display) -> Refusal {
    Refusal::new("identity-provider-unavailable", format!("the identity provider did not answer usably: {e}")).retryable()
}

fn context(kind: &str, id: &str) -> Context {
    Context::new(kind).with("id", id)
}

/// The claims Capstan reads of the live userinfo: all of them, by name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnyClaims {
    /// Every claim, by name.
    #[serde(flatten)]
    pub claims: BTreeMap<String, Value>,
}

impl AdditionalClaims for AnyClaims {}

/// The organizations an organizations claim grants, with the role each gives (`owner` among
/// its roles: owner; otherwise member). Accepted shapes: a list of ids, a list of objects with
/// `id` and `roles` (or `role`), an object keyed by id whose values carry `roles`. Anything
/// else is refused `oidc-claim-invalid`.
pub fn organizations(claim: &str, value: Option<&Value>) -> Result<Vec<(String, OrgRole)>> {
    let invalid = || {
        Refusal::new("oidc-claim-invalid", format!("the identity provider's {claim} claim is not a list of organizations Capstan can read"))
    };
    let role_of = |entry: &Value| {
        let owner = match (entry.get("roles"), entry.get("role")) {
            (Some(Value::Array(roles)), _) => roles.iter().any(|r| r == "owner"),
            (_, Some(Value::String(role))) => role == "owner",
            _ => false,
        };
        if owner { OrgRole::Owner } else { OrgRole::Member }
    };
    let mut found = Vec::new();
    match value {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                match item {
                    Value::String(id) if !id.is_empty() => found.push((id.clone(), OrgRole::Member)),
                    Value::Object(entry) => match entry.get("id") {
                        Some(Value::String(id)) if !id.is_empty() => found.push((id.clone(), role_of(item))),
                        _ => return Err(invalid()),
                    },
                    _ => return Err(invalid()),
                }
            }
        }
        Some(Value::Object(map)) => {
            for (id, entry) in map {
                found.push((id.clone(), role_of(entry)));
            }
        }
        Some(_) => return Err(invalid()),
    }
    Ok(found)
}

/// The application roles a roles claim names: a list of strings, one space-separated string, or
/// an object keyed by role (as Zitadel's project roles claim is).
pub fn roles(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::Array(items)) => items.iter().filter_map(|r| r.as_str().map(str::to_string)).collect(),
        Some(Value::String(text)) => text.split_whitespace().map(str::to_string).collect(),
        Some(Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// The application role that makes a person an infrastructure administrator.
pub const ADMIN_ROLE: &str = "admin";

/// A username for a new person: the provider's `preferred_username` (else the e-mail's local
/// part) made of the characters usernames take, else `person`.
pub fn username_base(preferred: Option<&str>, email: Option<&str>) -> String {
    let clean = |text: &str| {
        let mut name: String = text.chars().filter(|c| c.is_ascii_alphanumeric() || "-_.@".contains(*c)).take(48).collect();
        while name.starts_with(|c: char| !c.is_ascii_alphanumeric()) {
            name.remove(0);
        }
        name
    };
    for candidate in [preferred.map(clean), email.and_then(|e| e.split('@').next()).map(clean)].into_iter().flatten() {
        if !candidate.is_empty() && capstan_auth::validate_username(&candidate).is_ok() {
            return candidate;
        }
    }
    "person".to_string()
}

async fn free_username(tx: &Tx, base: &str) -> Result<String> {
    let taken = |name: String| async move {
        let page = tx.find(USERS, "by_username", &[json!(name)], None, 1).await?;
        Ok::<_, Refusal>(!page.documents.is_empty())
    };
    if !taken(base.to_string()).await? {
        return Ok(base.to_string());
    }
    for n in 2..=20 {
        let name = format!("{base}-{n}");
        if !taken(name.clone()).await? {
            return Ok(name);
        }
    }
    Ok(format!("{base}-{:08x}", rand::random::<u32>()))
}

/// What a finished login answers: where the browser goes next.
pub struct Finished {
    /// The return address with `handoff=<code>` added.
    pub location: String,
}

impl Federation {
    /// Begin a login for a client that will show `challenge`'s verifier at the handoff and
    /// wants to come back to `return_to`: the IdP's authorization URL to send the browser to.
    pub async fn start_login(&self, challenge: &str, return_to: &str) -> Result<String> {
        check_challenge(challenge)?;
        ReturnTo::parse(return_to)?;
        let client = self.provider.client(&self.settings)?;
        let (pkce_challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let state = random_code();
        let nonce = random_code();
        let (state_for_url, nonce_for_url) = (state.clone(), nonce.clone());
        let mut request = client
            .authorize_url(
                openidconnect::core::CoreAuthenticationFlow::AuthorizationCode,
                move || CsrfToken::new(state_for_url),
                move || Nonce::new(nonce_for_url),
            )
            .set_pkce_challenge(pkce_challenge);
        for scope in self.settings.scopes.iter().filter(|s| *s != "openid") {
            request = request.add_scope(Scope::new(scope.clone()));
        }
        let (url, _, _) = request.url();
        let at = now_ms();
        let pending = PendingLogin {
            nonce,
            verifier: self.keyring.seal(&context("federated-login", &state), verifier.secret().as_bytes())?,
            challenge: challenge.to_string(),
            return_to: return_to.to_string(),
            created_at: at,
            expires_at: at + millis(crate::LOGIN_WINDOW),
        };
        let data = serde_json::to_value(&pending).map_err(Refusal::internal)?;
        let id = state.as_str();
        self.store
            .transact(|tx| {
                let data = data.clone();
                async move { tx.insert(LOGINS, id, data).await }
            })
            .await?;
        Ok(url.to_string())
    }

    /// Take the pending login `state` names (one use): its return address, and the login itself.
    async fn take_pending(&self, state: &str) -> Result<PendingLogin> {
        if state.len() != 64 || !state.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(unknown_login());
        }
        let taken = self
            .store
            .transact(|tx| async move {
                let Some(doc) = tx.get(LOGINS, state).await? else { return Ok(None) };
                tx.delete(LOGINS, state, doc.revision).await?;
                Ok(Some(doc))
            })
            .await?;
        let pending: PendingLogin = match taken {
            Some(doc) => serde_json::from_value(doc.data).map_err(|e| refusal_internal("a pending login", e))?,
            None => return Err(unknown_login()),
        };
        if pending.expires_at <= now_ms() {
            return Err(unknown_login());
        }
        Ok(pending)
    }

    /// Where an error of the login that `state` names should be shown: the loopback address of
    /// the CLI that started it, if that is what it was (read without taking it).
    pub async fn loopback_of(&self, state: &str) -> Option<ReturnTo> {
        if state.len() != 64 || !state.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let doc = self.store.transact(|tx| async move { tx.get(LOGINS, state).await }).await.ok()??;
        match ReturnTo::parse(doc.data["returnTo"].as_str()?) {
            Ok(r @ ReturnTo::Loopback(_)) => Some(r),
            _ => None,
        }
    }

    /// The IdP's redirect back without a code (it refused, or the person cancelled): the
    /// pending login is spent.
    pub async fn finish_refused(&self, state: &str) -> Result<()> {
        self.take_pending(state).await.map(|_| ())
    }

    /// The IdP's redirect back with `code` and `state`: the login finished (see the module).
    pub async fn finish_login(&self, code: &str, state: &str) -> Result<Finished> {
        let pending = self.take_pending(state).await?;
        let return_to = ReturnTo::parse(&pending.return_to)?;
        let verifier = self.keyring.open(&context("federated-login", state), &pending.verifier)?;
        let verifier = PkceCodeVerifier::new(String::from_utf8(verifier.to_vec()).map_err(Refusal::internal)?);
        let client = self.provider.client(&self.settings)?;
        let http_client = self.provider.http().clone();
        let send = |request| http::send(http_client.clone(), request);
        let exchange =
            client.exchange_code(AuthorizationCode::new(code.to_string())).map_err(|e| refusal_internal("the token endpoint", e))?;
        let response = exchange.set_pkce_verifier(verifier).request_async(&send).await.map_err(|e| match e {
            RequestTokenError::ServerResponse(answer) => Refusal::new(
                "oidc-code-refused",
                format!(
                    "the identity provider refused the authorization code ({}): it was used already, or has expired — sign in again",
                    answer.error()
                ),
            ),
            other => unavailable(other),
        })?;
        let id_token =
            response.id_token().ok_or_else(|| Refusal::new("oidc-id-token-invalid", "the identity provider answered no ID token"))?;
        let nonce = Nonce::new(pending.nonce.clone());
        let claims = match id_token.claims(&client.id_token_verifier(), &nonce) {
            Err(ClaimsVerificationError::SignatureVerification(SignatureVerificationError::NoMatchingKey))
                if self.provider.refresh_keys().await =>
            {
                // the issuer rotated its keys: verify with the keys it publishes now
                let client = self.provider.client(&self.settings)?;
                id_token.claims(&client.id_token_verifier(), &nonce).cloned().map_err(id_token_refusal)?
            }
            verified => verified.cloned().map_err(id_token_refusal)?,
        };
        if let Some(expected) = claims.access_token_hash() {
            let client = self.provider.client(&self.settings)?;
            let verifier = client.id_token_verifier();
            let alg =
                id_token.signing_alg().map_err(|e| Refusal::new("oidc-id-token-invalid", format!("the ID token's algorithm: {e}")))?;
            let key = id_token.signing_key(&verifier).map_err(id_token_refusal_signature)?;
            let actual = AccessTokenHash::from_token(response.access_token(), alg, key)
                .map_err(|e| Refusal::new("oidc-id-token-invalid", format!("the access token's hash: {e}")))?;
            if actual != *expected {
                return Err(Refusal::new("oidc-id-token-invalid", "the ID token was not issued with this access token"));
            }
        }
        let subject = claims.subject().clone();
        let userinfo: UserInfoClaims<AnyClaims, CoreGenderClaim> = client
            .user_info(response.access_token().clone(), Some(subject.clone()))
            .map_err(|e| refusal_internal("the userinfo endpoint", e))?
            .request_async(&send)
            .await
            .map_err(unavailable)?;
        let live = &userinfo.additional_claims().claims;
        let granted = organizations(&self.settings.organization_claim, live.get(&self.settings.organization_claim))?;
        let admin = roles(live.get(&self.settings.roles_claim)).iter().any(|r| r == ADMIN_ROLE);
        let preferred =
            userinfo.preferred_username().map(|u| u.as_str().to_string()).or_else(|| claims.preferred_username().map(|u| u.to_string()));
        let email = userinfo.email().map(|e| e.as_str().to_string());

        let at = now_ms();
        let lifetime = session_lifetime(response.expires_in());
        let session_id = capstan_core::ids::new_id(crate::SESSION_PREFIX);
        let session_expires_at = at + millis(lifetime);
        let tokens = Tokens { access_token: response.access_token().secret().clone(), id_token: id_token.to_string() };
        let sealed =
            self.keyring.seal(&context("federated-session", &session_id), &serde_json::to_vec(&tokens).map_err(Refusal::internal)?)?;
        let issuer = self.settings.issuer.clone();
        let identity_id = digest(&format!("{issuer}\n{}", subject.as_str()));
        let handoff = random_code();
        let new_user_id = capstan_auth::claim_user_id(&self.blobs, "user").await?;
        let username = username_base(preferred.as_deref(), email.as_deref());
        let (issuer, subject, granted) = (&issuer, subject.as_str(), &granted);
        let (identity_id, session_id_ref, new_user_id, username, handoff_ref) =
            (identity_id.as_str(), session_id.as_str(), new_user_id.as_str(), username.as_str(), handoff.as_str());
        let (sealed, challenge) = (&sealed, pending.challenge.as_str());
        let user_id = self
            .store
            .transact(|tx| async move {
                let user_id = match tx.get(IDENTITIES, identity_id).await? {
                    Some(doc) => {
                        let mut known: FederatedIdentity =
                            serde_json::from_value(doc.data).map_err(|e| refusal_internal("a federated identity", e))?;
                        let user = tx.get(USERS, &known.user_id).await?.ok_or_else(disabled)?;
                        let mut record: User = serde_json::from_value(user.data.clone()).map_err(|e| refusal_internal("a user", e))?;
                        if record.disabled || record.kind != "human" {
                            return Err(disabled());
                        }
                        if record.admin != admin {
                            // the provider's roles claim decides, at every login
                            record.admin = admin;
                            tx.replace(USERS, &known.user_id, user.revision, serde_json::to_value(&record).map_err(Refusal::internal)?)
                                .await?;
                        }
                        known.last_login_at = at;
                        tx.replace(IDENTITIES, identity_id, doc.revision, serde_json::to_value(&known).map_err(Refusal::internal)?).await?;
                        known.user_id
                    }
                    None => {
                        if !admin && !any_linked(&tx, granted).await? {
                            return Err(no_organization());
                        }
                        let username = free_username(&tx, username).await?;
                        let user = User { username, kind: "human".into(), admin, created_at: at, disabled: false };
                        // no password: this person signs in through the identity provider
                        let credential = Credential {
                            kind: "human".into(),
                            generation: 1,
                            verifier: None,
                            token_hash: None,
                            updated_at: at,
                            token_expires_at: None,
                        };
                        capstan_auth::insert_user(&tx, new_user_id, &user, &credential).await?;
                        let known = FederatedIdentity {
                            issuer: issuer.clone(),
                            subject: subject.to_string(),
                            user_id: new_user_id.to_string(),
                            created_at: at,
                            last_login_at: at,
                        };
                        tx.insert(IDENTITIES, identity_id, serde_json::to_value(&known).map_err(Refusal::internal)?).await?;
                        new_user_id.to_string()
                    }
                };
                let held = sync_provider_memberships(&tx, &user_id, granted).await?;
                if held.is_empty() && !admin && !has_membership(&tx, &user_id).await? {
                    return Ok(Err(no_organization()));
                }
                let session = FederatedSession {
                    user_id: user_id.clone(),
                    issuer: issuer.clone(),
                    subject: subject.to_string(),
                    tokens: sealed.clone(),
                    created_at: at,
                    expires_at: session_expires_at,
                };
                tx.insert(SESSIONS, session_id_ref, serde_json::to_value(&session).map_err(Refusal::internal)?).await?;
                let record = Handoff {
                    session_id: session_id_ref.to_string(),
                    user_id: user_id.clone(),
                    challenge: challenge.to_string(),
                    session_expires_at,
                    expires_at: at + millis(crate::HANDOFF_WINDOW),
                };
                tx.insert(HANDOFFS, &digest(handoff_ref), serde_json::to_value(&record).map_err(Refusal::internal)?).await?;
                Ok(Ok(user_id))
            })
            .await??;
        tracing::info!(user = %user_id, issuer = %self.settings.issuer, session = %session_id, "platform OIDC login");
        Ok(Finished { location: return_to.with(&[("handoff", &handoff)]) })
    }

    /// The client's half of a finished login: the handoff code and the verifier of the challenge
    /// it began with, for Capstan's session JWT. Any mismatch, reuse or delay is one refusal,
    /// `oidc-handoff-invalid`.
    pub async fn complete_handoff(&self, handoff: &str, verifier: &str) -> Result<LoginAnswer> {
        let invalid = || {
            Refusal::new(
                "oidc-handoff-invalid",
                "this sign-in cannot be completed: it was completed already or has expired — sign in again",
            )
        };
        if handoff.len() != 64 || !handoff.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(invalid());
        }
        let id = digest(handoff);
        let id_ref = id.as_str();
        let taken = self
            .store
            .transact(|tx| async move {
                let Some(doc) = tx.get(HANDOFFS, id_ref).await? else { return Ok(None) };
                tx.delete(HANDOFFS, id_ref, doc.revision).await?;
                Ok(Some(doc))
            })
            .await?;
        let record: Handoff = match taken {
            Some(doc) => serde_json::from_value(doc.data).map_err(|e| refusal_internal("a handoff", e))?,
            None => return Err(invalid()),
        };
        if record.expires_at <= now_ms() || challenge_of(verifier) != record.challenge {
            return Err(invalid());
        }
        self.auth.open_federated_session(&record.user_id, &record.session_id, record.session_expires_at).await
    }
}

/// How long a federated session lasts: as long as the IdP's access token (1 hour when the IdP
/// does not say), never more than [`crate::MAX_SESSION`].
pub fn session_lifetime(access_token_expires_in: Option<Duration>) -> Duration {
    access_token_expires_in.unwrap_or(Duration::from_secs(3600)).min(crate::MAX_SESSION)
}

fn disabled() -> Refusal {
    Refusal::new("user-disabled", "this person is disabled in Capstan: an administrator can enable them again")
}

fn no_organization() -> Refusal {
    Refusal::new(
        "oidc-no-organization",
        "the identity provider names no organization of this Capstan for this person, nor the admin role: ask an administrator to link your organization",
    )
}

/// Whether any of the provider's organizations `granted` names is linked to one here.
async fn any_linked(tx: &Tx, granted: &[(String, OrgRole)]) -> Result<bool> {
    for (link, _) in granted {
        let found = tx.find(capstan_inventory::ORGANIZATIONS, "by_identity_provider_organization", &[json!(link)], None, 1).await?;
        if !found.documents.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether the user is a member of any organization (a membership a person set counts too).
async fn has_membership(tx: &Tx, user: &str) -> Result<bool> {
    Ok(!tx.find(capstan_inventory::MEMBERS, "by_user", &[json!(user)], None, 1).await?.documents.is_empty())
}

fn id_token_refusal(e: ClaimsVerificationError) -> Refusal {
    let (code, what) = match &e {
        ClaimsVerificationError::SignatureVerification(_) => {
            ("oidc-id-token-signature-invalid", "its signature does not verify with the issuer's keys")
        }
        ClaimsVerificationError::InvalidIssuer(_) => ("oidc-id-token-issuer-mismatch", "it was issued by another issuer"),
        ClaimsVerificationError::InvalidAudience(_) => ("oidc-id-token-audience-mismatch", "it was issued for another client"),
        ClaimsVerificationError::Expired(_) => ("oidc-id-token-expired", "it has expired"),
        ClaimsVerificationError::InvalidNonce(_) => ("oidc-id-token-nonce-mismatch", "its nonce is not the one this login sent"),
        _ => ("oidc-id-token-invalid", "it is not a valid ID token"),
    };
    tracing::info!(code, reason = %e, "an ID token was refused");
    Refusal::new(code, format!("the identity provider's ID token was refused: {what}"))
}

fn id_token_refusal_signature(e: SignatureVerificationError) -> Refusal {
    id_token_refusal(ClaimsVerificationError::SignatureVerification(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_addresses_are_paths_here_or_loopback_ports() {
        assert_eq!(ReturnTo::parse("/login/oidc/finish").unwrap(), ReturnTo::Here("/login/oidc/finish".into()));
        assert!(matches!(ReturnTo::parse("http://127.0.0.1:4711/callback").unwrap(), ReturnTo::Loopback(_)));
        assert!(matches!(ReturnTo::parse("http://localhost:4711/").unwrap(), ReturnTo::Loopback(_)));
        for bad in
            ["//evil.example/x", "https://evil.example/", "http://127.0.0.1/", "http://10.0.0.1:80/", "javascript:alert(1)", "/\\evil", ""]
        {
            assert_eq!(ReturnTo::parse(bad).unwrap_err().code, "oidc-return-invalid", "{bad}");
        }
        assert_eq!(ReturnTo::parse("/login/oidc/finish").unwrap().with(&[("handoff", "ab")]), "/login/oidc/finish?handoff=ab");
        assert_eq!(ReturnTo::parse("http://127.0.0.1:9/cb").unwrap().with(&[("handoff", "ab")]), "http://127.0.0.1:9/cb?handoff=ab");
    }

    #[test]
    fn organizations_claims_of_each_shape_are_read_and_others_refused() {
        let read = |v: Value| organizations("organizations", Some(&v));
        assert_eq!(
            read(json!([{ "id": "org-acme", "roles": ["owner"] }, { "id": "org-b", "roles": ["member"] }])).unwrap(),
            vec![("org-acme".to_string(), OrgRole::Owner), ("org-b".to_string(), OrgRole::Member)]
        );
        assert_eq!(read(json!(["a", "b"])).unwrap(), vec![("a".to_string(), OrgRole::Member), ("b".to_string(), OrgRole::Member)]);
        assert_eq!(read(json!({ "x": { "role": "owner" } })).unwrap(), vec![("x".to_string(), OrgRole::Owner)]);
        assert!(organizations("organizations", None).unwrap().is_empty());
        for bad in [json!("acme"), json!([1]), json!([{ "name": "no id" }]), json!([""])] {
            assert_eq!(read(bad.clone()).unwrap_err().code, "oidc-claim-invalid", "{bad}");
        }
    }

    #[test]
    fn roles_and_usernames_are_read_from_what_providers_send() {
        assert_eq!(roles(Some(&json!(["admin", "user"]))), vec!["admin", "user"]);
        assert_eq!(roles(Some(&json!("admin user"))), vec!["admin", "user"]);
        assert_eq!(roles(Some(&json!({ "admin": { "org": "x" } }))), vec!["admin"]);
        assert!(roles(Some(&json!(3))).is_empty());
        assert_eq!(username_base(Some("olivia"), None), "olivia");
        assert_eq!(username_base(Some("Olivia Owner!"), None), "OliviaOwner");
        assert_eq!(username_base(None, Some("o.w@acme.test")), "o.w");
        assert_eq!(username_base(Some("cluster-x"), None), "person");
        assert_eq!(username_base(Some("..."), None), "person");
    }

    #[test]
    fn a_session_lasts_as_the_access_token_does_and_at_most_seven_days() {
        assert_eq!(session_lifetime(Some(Duration::from_secs(600))), Duration::from_secs(600));
        assert_eq!(session_lifetime(None), Duration::from_secs(3600));
        assert_eq!(session_lifetime(Some(Duration::from_secs(30 * 24 * 3600))), crate::MAX_SESSION);
    }

    #[test]
    fn a_challenge_is_the_s256_of_its_verifier() {
        // RFC 7636 appendix B
        assert_eq!(challenge_of("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        assert!(check_challenge("E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM").is_ok());
        assert!(check_challenge("short").is_err());
    }
}
