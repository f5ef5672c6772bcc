//! The token endpoint's and the userinfo endpoint's decisions, without HTTP: client
//! authentication, the one-use code (a replay revokes what it issued, RFC 6749 §4.1.2), PKCE,
//! the RS256 ID token, and the access token's claims.

use super::*;
use chrono::{DateTime, Utc};
use openidconnect::core::{
    CoreErrorResponseType, CoreGenderClaim, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm, CoreTokenType,
};
use openidconnect::{
    AccessToken, AdditionalClaims, Audience, EmptyExtraTokenFields, EndUserName, EndUserUsername, IdToken, IdTokenClaims, IdTokenFields,
    IssuerUrl, LocalizedClaim, Nonce, PkceCodeChallenge, PkceCodeVerifier, StandardClaims, StandardTokenResponse, SubjectIdentifier,
    UserInfoClaims,
};
use subtle::ConstantTimeEq;

/// The claim hosted apps read a user's role from: `roles`, the one role the user has in the app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolesClaim {
    /// The user's role in the app (one).
    pub roles: Vec<String>,
}
impl AdditionalClaims for RolesClaim {}

/// An ID token of a hosted app.
pub type HostedIdToken = IdToken<RolesClaim, CoreGenderClaim, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm>;
/// The token endpoint's answer: access token, `Bearer`, `expires_in`, ID token.
pub type HostedTokenResponse = StandardTokenResponse<
    IdTokenFields<RolesClaim, EmptyExtraTokenFields, CoreGenderClaim, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm>,
    CoreTokenType,
>;
/// The userinfo endpoint's answer.
pub type HostedUserInfo = UserInfoClaims<RolesClaim, CoreGenderClaim>;

/// A token endpoint error (RFC 6749 §5.2), or the service's own failure.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TokenError {
    pub status: u16,
    pub error: CoreErrorResponseType,
    pub description: &'static str,
}

impl TokenError {
    fn new(status: u16, error: CoreErrorResponseType, description: &'static str) -> Self {
        TokenError { status, error, description }
    }
    pub fn invalid_request(description: &'static str) -> Self {
        Self::new(400, CoreErrorResponseType::InvalidRequest, description)
    }
    pub fn invalid_client() -> Self {
        Self::new(401, CoreErrorResponseType::InvalidClient, "client authentication failed")
    }
    pub fn invalid_grant(description: &'static str) -> Self {
        Self::new(400, CoreErrorResponseType::InvalidGrant, description)
    }
    pub fn unsupported_grant_type() -> Self {
        Self::new(400, CoreErrorResponseType::UnsupportedGrantType, "only grant_type=authorization_code is supported")
    }
    /// The store or the signer failed: logged here with its detail, answered without it.
    pub fn from_refusal(refusal: Refusal) -> Self {
        tracing::warn!(code = %refusal.code, "the hosted apps' token endpoint failed: {refusal}");
        let error = if refusal.retryable { "temporarily_unavailable" } else { "server_error" };
        Self::new(if refusal.retryable { 503 } else { 500 }, CoreErrorResponseType::Extension(error.into()), "the server could not answer")
    }
}

/// What a code exchange decided inside its transaction (committed in every case: a spent or
/// replayed code's writes must stand even though the client is refused).
enum Exchange {
    Issued(Box<CodeRecord>, String),
    Refused(TokenError),
}

fn date(ms: u64) -> DateTime<Utc> {
    // whole seconds: JWT numeric dates (RFC 7519)
    DateTime::from_timestamp(i64::try_from(ms / 1000).unwrap_or(i64::MAX), 0).unwrap_or_default()
}

fn standard_claims(user_id: &str, username: &str) -> StandardClaims<CoreGenderClaim> {
    let mut name = LocalizedClaim::new();
    name.insert(None, EndUserName::new(username.to_string()));
    StandardClaims::new(SubjectIdentifier::new(user_id.to_string()))
        .set_preferred_username(Some(EndUserUsername::new(username.to_string())))
        .set_name(Some(name))
}

/// Whether `verifier` is a PKCE code verifier (RFC 7636 §4.1: 43 to 128 unreserved characters)
/// whose S256 challenge is `challenge`; compared in constant time.
pub(crate) fn pkce_matches(verifier: &str, challenge: &str) -> bool {
    let well_formed = (43..=128).contains(&verifier.len()) && verifier.chars().all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c));
    if !well_formed {
        return false;
    }
    let computed = PkceCodeChallenge::from_code_verifier_sha256(&PkceCodeVerifier::new(verifier.to_string()));
    bool::from(computed.as_str().as_bytes().ct_eq(challenge.as_bytes()))
}

/// Whether `challenge` is what an S256 challenge looks like: 43 base64url characters.
pub(crate) fn challenge_well_formed(challenge: &str) -> bool {
    challenge.len() == 43 && challenge.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl HostedOidc {
    /// The client `client_id` if `secret` is its secret (the SHA-256 compared in constant time);
    /// `invalid_client` otherwise, one answer for an unknown client and a wrong secret.
    pub(crate) async fn authenticate_client(&self, client_id: &str, secret: &str) -> Result<ClientRecord, TokenError> {
        let presented = Sha256::digest(secret.as_bytes());
        let found = if client_id.is_empty() || client_id.len() > 256 {
            None
        } else {
            self.store
                .transact(|tx| async move {
                    let page = tx.find(CLIENTS, "by_client_id", &[json!(client_id)], None, 1).await?;
                    page.documents.first().map(parse::<ClientRecord>).transpose()
                })
                .await
                .map_err(TokenError::from_refusal)?
        };
        let Some(client) = found else {
            tracing::info!("hosted app token request: unknown client");
            return Err(TokenError::invalid_client());
        };
        let stored = hex::decode(&client.secret_hash).unwrap_or_default();
        if !bool::from(presented.as_slice().ct_eq(stored.as_slice())) {
            tracing::info!(service = %client.service_id, "hosted app token request: wrong client secret");
            return Err(TokenError::invalid_client());
        }
        Ok(client)
    }

    /// Exchange `code` for `client`: one use only; a code presented again is refused and the
    /// access tokens it issued are revoked. `access_token` is the fresh token to issue.
    pub(crate) async fn exchange_code(
        &self,
        client: &ClientRecord,
        code: &str,
        redirect_uri: &str,
        verifier: &str,
    ) -> Result<HostedTokenResponse, TokenError> {
        let access_token = random_token();
        let token_id = digest(&access_token);
        let code_id = digest(code);
        let now = self.now();
        let outcome = self
            .store
            .transact(|tx| {
                let (token_id, code_id) = (token_id.clone(), code_id.clone());
                async move {
                    let Some(doc) = tx.get(CODES, &code_id).await? else {
                        return Ok(Exchange::Refused(TokenError::invalid_grant("the code is unknown or has expired")));
                    };
                    let mut record: CodeRecord = parse(&doc)?;
                    // another client's code: refused, and left alone
                    if record.client_id != client.client_id {
                        return Ok(Exchange::Refused(TokenError::invalid_grant("the code is unknown or has expired")));
                    }
                    if record.used_at.is_some() {
                        let mut revoked = 0;
                        for token in tx.find_all(TOKENS, "by_code", &[json!(code_id)]).await? {
                            tx.delete(TOKENS, &token.id, token.revision).await?;
                            revoked += 1;
                        }
                        tracing::warn!(service = %record.service_id, revoked, "a hosted app's code was presented again: the tokens it issued are revoked");
                        return Ok(Exchange::Refused(TokenError::invalid_grant("the code was already used")));
                    }
                    // from here the code is spent, whatever the answer
                    record.used_at = Some(now);
                    record.reap_after = now + millis(TOKEN_LIFETIME);
                    tx.replace(CODES, &code_id, doc.revision, to_value(&record)?).await?;
                    if record.expires_at <= now {
                        return Ok(Exchange::Refused(TokenError::invalid_grant("the code is unknown or has expired")));
                    }
                    if record.redirect_uri != redirect_uri {
                        return Ok(Exchange::Refused(TokenError::invalid_grant("redirect_uri differs from the authorization request's")));
                    }
                    if !pkce_matches(verifier, &record.code_challenge) {
                        return Ok(Exchange::Refused(TokenError::invalid_grant("code_verifier does not match the code_challenge")));
                    }
                    let Some(role) = role_of(&tx, &record.service_id, &record.user_id).await? else {
                        return Ok(Exchange::Refused(TokenError::invalid_grant("the user no longer has a role in the app")));
                    };
                    let token = TokenRecord {
                        service_id: record.service_id.clone(),
                        client_id: record.client_id.clone(),
                        user_id: record.user_id.clone(),
                        username: record.username.clone(),
                        code_id: code_id.clone(),
                        scopes: record.scopes.clone(),
                        created_at: now,
                        expires_at: now + millis(TOKEN_LIFETIME),
                    };
                    tx.insert(TOKENS, &token_id, to_value(&token)?).await?;
                    Ok(Exchange::Issued(Box::new(record), role))
                }
            })
            .await
            .map_err(TokenError::from_refusal)?;
        let (record, role) = match outcome {
            Exchange::Issued(record, role) => (record, role),
            Exchange::Refused(error) => {
                tracing::info!(service = %client.service_id, error = %error.description, "hosted app code exchange refused");
                return Err(error);
            }
        };
        let access_token = AccessToken::new(access_token);
        let id_token = self.id_token(&record, &role, &access_token, now).await.map_err(TokenError::from_refusal)?;
        let mut answer =
            HostedTokenResponse::new(access_token, CoreTokenType::Bearer, IdTokenFields::new(Some(id_token), EmptyExtraTokenFields {}));
        answer.set_expires_in(Some(&TOKEN_LIFETIME));
        tracing::info!(service = %record.service_id, user = %record.user_id, "hosted app tokens issued");
        Ok(answer)
    }

    /// The RS256 ID token for a code's user, signed with the active key (its kid in the header).
    async fn id_token(&self, record: &CodeRecord, role: &str, access_token: &AccessToken, now: u64) -> Result<HostedIdToken> {
        let (_, key) = self.active_key().await?;
        let issuer = IssuerUrl::new(self.issuer.clone()).map_err(Refusal::internal)?;
        let claims = IdTokenClaims::new(
            issuer,
            vec![Audience::new(record.client_id.clone())],
            date(now + millis(TOKEN_LIFETIME)),
            date(now),
            standard_claims(&record.user_id, &record.username),
            RolesClaim { roles: vec![role.to_string()] },
        )
        .set_nonce(record.nonce.clone().map(Nonce::new))
        .set_auth_time(Some(date(record.auth_time)));
        HostedIdToken::new(claims, key.as_ref(), CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256, Some(access_token), None)
            .map_err(|e| Refusal::internal(format!("signing an ID token: {e}")))
    }

    /// The claims of the user an access token was issued to, their role as it is now; `None`
    /// for a token unknown, expired, or whose user no longer has a role in the app.
    pub(crate) async fn userinfo(&self, access_token: &str) -> Result<Option<HostedUserInfo>> {
        if access_token.is_empty() || access_token.len() > 256 {
            return Ok(None);
        }
        let token_id = digest(access_token);
        let now = self.now();
        let found = self
            .store
            .transact(|tx| {
                let token_id = token_id.clone();
                async move {
                    let Some(doc) = tx.get(TOKENS, &token_id).await? else { return Ok(None) };
                    let token: TokenRecord = parse(&doc)?;
                    if token.expires_at <= now {
                        return Ok(None);
                    }
                    let client = tx.get(CLIENTS, &token.service_id).await?.map(|d| parse::<ClientRecord>(&d)).transpose()?;
                    if client.is_none_or(|c| c.client_id != token.client_id) {
                        return Ok(None);
                    }
                    let role = role_of(&tx, &token.service_id, &token.user_id).await?;
                    Ok(role.map(|role| (token, role)))
                }
            })
            .await?;
        Ok(found
            .map(|(token, role)| HostedUserInfo::new(standard_claims(&token.user_id, &token.username), RolesClaim { roles: vec![role] })))
    }
}
