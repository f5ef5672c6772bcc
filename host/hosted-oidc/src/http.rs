//! The public endpoints under `/oidc`: discovery, JWKS, authorize, token, userinfo.

use super::token::{TokenError, challenge_well_formed};
use super::*;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use openidconnect::core::{
    CoreAuthDisplay, CoreClaimName, CoreClaimType, CoreClientAuthMethod, CoreGrantType, CoreJsonWebKey, CoreJsonWebKeySet,
    CoreJweContentEncryptionAlgorithm, CoreJweKeyManagementAlgorithm, CoreJwsSigningAlgorithm, CoreResponseMode, CoreResponseType,
    CoreSubjectIdentifierType,
};
use openidconnect::{
    AdditionalProviderMetadata, AuthUrl, IssuerUrl, JsonWebKeySetUrl, PkceCodeChallengeMethod, ProviderMetadata, ResponseTypes, Scope,
    StandardErrorResponse, TokenUrl, UserInfoUrl,
};
use std::collections::{BTreeMap, BTreeSet};

/// What discovery adds to the standard metadata: PKCE's methods (RFC 8414), and the issuer
/// parameter in authorization responses (RFC 9207).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ProviderExtras {
    code_challenge_methods_supported: Vec<PkceCodeChallengeMethod>,
    authorization_response_iss_parameter_supported: bool,
}
impl AdditionalProviderMetadata for ProviderExtras {}

type Metadata = ProviderMetadata<
    ProviderExtras,
    CoreAuthDisplay,
    CoreClientAuthMethod,
    CoreClaimName,
    CoreClaimType,
    CoreGrantType,
    CoreJweContentEncryptionAlgorithm,
    CoreJweKeyManagementAlgorithm,
    CoreJsonWebKey,
    CoreResponseMode,
    CoreResponseType,
    CoreSubjectIdentifierType,
>;

pub(crate) fn router<S: Clone + Send + Sync + 'static>(oidc: Arc<HostedOidc>) -> Router<S> {
    Router::new()
        .route("/oidc/.well-known/openid-configuration", get(discovery))
        .route("/oidc/jwks", get(jwks))
        .route("/oidc/authorize", get(authorize_get).post(authorize_post))
        .route("/oidc/token", post(token))
        .route("/oidc/userinfo", get(userinfo).post(userinfo))
        .with_state(oidc)
}

fn json_response(status: StatusCode, body: &impl Serialize, cache: &'static str) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            status,
            [
                (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
                (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
            ],
            bytes,
        )
            .into_response(),
        Err(e) => {
            tracing::warn!("serializing an OpenID answer failed: {e}");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A refusal of a public endpoint that is not the client's mistake.
fn unavailable(refusal: Refusal) -> Response {
    tracing::warn!(code = %refusal.code, "a hosted apps' OpenID endpoint failed: {refusal}");
    let status = if refusal.retryable { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::INTERNAL_SERVER_ERROR };
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "the OpenID provider could not answer; try again\n").into_response()
}

impl HostedOidc {
    fn metadata(&self) -> std::result::Result<Metadata, url::ParseError> {
        let at = |path: &str| format!("{}{path}", self.issuer);
        Ok(Metadata::new(
            IssuerUrl::new(self.issuer.clone())?,
            AuthUrl::new(at("/authorize"))?,
            JsonWebKeySetUrl::new(at("/jwks"))?,
            vec![ResponseTypes::new(vec![CoreResponseType::Code])],
            vec![CoreSubjectIdentifierType::Public],
            vec![CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256],
            ProviderExtras {
                code_challenge_methods_supported: vec![PkceCodeChallengeMethod::new("S256".into())],
                authorization_response_iss_parameter_supported: true,
            },
        )
        .set_token_endpoint(Some(TokenUrl::new(at("/token"))?))
        .set_userinfo_endpoint(Some(UserInfoUrl::new(at("/userinfo"))?))
        .set_scopes_supported(Some(SCOPES.iter().map(|s| Scope::new(s.to_string())).collect()))
        .set_response_modes_supported(Some(vec![CoreResponseMode::Query]))
        .set_grant_types_supported(Some(vec![CoreGrantType::AuthorizationCode]))
        .set_token_endpoint_auth_methods_supported(Some(vec![
            CoreClientAuthMethod::ClientSecretBasic,
            CoreClientAuthMethod::ClientSecretPost,
        ]))
        .set_claims_supported(Some(CLAIMS.iter().map(|c| CoreClaimName::new(c.to_string())).collect()))
        .set_claim_types_supported(Some(vec![CoreClaimType::Normal]))
        .set_claims_parameter_supported(Some(false))
        .set_request_parameter_supported(Some(false))
        .set_request_uri_parameter_supported(Some(false)))
    }
}

async fn discovery(State(oidc): State<Arc<HostedOidc>>) -> Response {
    match oidc.metadata() {
        Ok(metadata) => json_response(StatusCode::OK, &metadata, "public, max-age=300"),
        Err(e) => unavailable(Refusal::internal(format!("the provider metadata's URLs: {e}"))),
    }
}

async fn jwks(State(oidc): State<Arc<HostedOidc>>) -> Response {
    let keys = match oidc.published_keys().await {
        Ok(records) => records.iter().map(keys::verification_key).collect::<Result<Vec<_>>>(),
        Err(refusal) => Err(refusal),
    };
    match keys {
        Ok(keys) => json_response(StatusCode::OK, &CoreJsonWebKeySet::new(keys), "public, max-age=60"),
        Err(refusal) => unavailable(refusal),
    }
}

/// Form parameters (a query or an `application/x-www-form-urlencoded` body), each name once:
/// the names that came more than once are answered apart (RFC 6749 §3.1: none may repeat).
fn form(raw: &[u8]) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut params = BTreeMap::new();
    let mut repeated = BTreeSet::new();
    for (name, value) in url::form_urlencoded::parse(raw) {
        if params.insert(name.to_string(), value.into_owned()).is_some() {
            repeated.insert(name.into_owned());
        }
    }
    (params, repeated)
}

/// The error page of an authorization request that cannot be sent back to the app (no or an
/// unknown client, a redirect URI not registered): never a redirect.
fn error_page(message: &str) -> Response {
    let body = format!("This sign-in request cannot be answered: {message}.\nReturn to the app and start again.\n");
    (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], body)
        .into_response()
}

fn see_other(location: &str) -> Response {
    match HeaderValue::from_str(location) {
        Ok(location) => {
            (StatusCode::SEE_OTHER, [(header::LOCATION, location), (header::CACHE_CONTROL, HeaderValue::from_static("no-store"))])
                .into_response()
        }
        Err(_) => unavailable(Refusal::internal("a redirect location is not a header value")),
    }
}

async fn authorize_get(State(oidc): State<Arc<HostedOidc>>, RawQuery(query): RawQuery) -> Response {
    oidc.authorize(query.unwrap_or_default().as_bytes()).await
}

async fn authorize_post(State(oidc): State<Arc<HostedOidc>>, headers: HeaderMap, body: Bytes) -> Response {
    if !is_form(&headers) {
        return error_page("an authorization request posted is a form (application/x-www-form-urlencoded)");
    }
    oidc.authorize(&body).await
}

fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"))
}

impl HostedOidc {
    /// An authorization request (OpenID Connect Core §3.1.2.1, with PKCE S256 required).
    async fn authorize(&self, raw: &[u8]) -> Response {
        let (params, repeated) = form(raw);
        let get = |name: &str| params.get(name).map(String::as_str).filter(|v| !v.is_empty());
        // until the client and its redirect URI check out, nothing is sent back to anyone
        let Some(client_id) = get("client_id").filter(|_| !repeated.contains("client_id")) else {
            return error_page("it names no client (client_id)");
        };
        let Some(redirect_uri) = get("redirect_uri").filter(|_| !repeated.contains("redirect_uri")) else {
            return error_page("it names no redirect_uri");
        };
        let client = if client_id.len() > 256 {
            None
        } else {
            let found = self
                .store
                .transact(|tx| async move {
                    let page = tx.find(CLIENTS, "by_client_id", &[json!(client_id)], None, 1).await?;
                    page.documents.first().map(parse::<ClientRecord>).transpose()
                })
                .await;
            match found {
                Ok(client) => client,
                Err(refusal) => return unavailable(refusal),
            }
        };
        let Some(client) = client else {
            tracing::info!("hosted app authorization request: unknown client");
            return error_page("the client is not known here");
        };
        if !client.redirect_uris.iter().any(|uri| uri == redirect_uri) {
            tracing::info!(service = %client.service_id, "hosted app authorization request: unregistered redirect_uri");
            return error_page("the redirect_uri is not one registered for the app");
        }
        let state = get("state");
        let back = |error: &str, description: &str| {
            let mut pairs = vec![("error", error), ("error_description", description)];
            if let Some(state) = state {
                pairs.push(("state", state));
            }
            pairs.push(("iss", self.issuer.as_str()));
            tracing::info!(service = %client.service_id, error, "hosted app authorization request refused");
            match redirect_with(redirect_uri, &pairs) {
                Ok(location) => see_other(&location),
                Err(refusal) => unavailable(refusal),
            }
        };
        if !repeated.is_empty() {
            return back("invalid_request", "a parameter is repeated");
        }
        if params.contains_key("request") {
            return back("request_not_supported", "request objects are not supported");
        }
        if params.contains_key("request_uri") {
            return back("request_uri_not_supported", "request_uri is not supported");
        }
        match get("response_type") {
            None => return back("invalid_request", "response_type is required"),
            Some("code") => {}
            Some(_) => return back("unsupported_response_type", "only response_type=code is supported"),
        }
        if get("response_mode").is_some_and(|mode| mode != "query") {
            return back("invalid_request", "only response_mode=query is supported");
        }
        let asked: Vec<&str> = get("scope").unwrap_or_default().split(' ').filter(|s| !s.is_empty()).collect();
        if !asked.contains(&"openid") {
            return back("invalid_scope", "the scope must include openid");
        }
        let mut scopes: Vec<String> = Vec::new();
        for scope in asked.into_iter().filter(|s| SCOPES.contains(s)) {
            if !scopes.iter().any(|s| s == scope) {
                scopes.push(scope.to_string());
            }
        }
        let Some(state) = state else { return back("invalid_request", "state is required") };
        if state.len() > 1024 {
            return back("invalid_request", "state is at most 1024 bytes");
        }
        let nonce = get("nonce");
        if nonce.is_some_and(|n| n.len() > 1024) {
            return back("invalid_request", "nonce is at most 1024 bytes");
        }
        let Some(challenge) = get("code_challenge") else {
            return back("invalid_request", "PKCE is required: code_challenge with code_challenge_method=S256");
        };
        if get("code_challenge_method") != Some("S256") {
            return back("invalid_request", "code_challenge_method must be S256");
        }
        if !challenge_well_formed(challenge) {
            return back("invalid_request", "code_challenge is not an S256 challenge");
        }
        if get("prompt").is_some_and(|p| p.split(' ').any(|v| v == "none")) {
            return back("interaction_required", "signing in to a hosted app needs the user in Capstan's dashboard");
        }
        let request_id = random_token();
        let now = self.now();
        let pending = PendingRequest {
            service_id: client.service_id.clone(),
            client_id: client.client_id.clone(),
            redirect_uri: redirect_uri.to_string(),
            scopes,
            state: state.to_string(),
            nonce: nonce.map(str::to_string),
            code_challenge: challenge.to_string(),
            created_at: now,
            expires_at: now + millis(REQUEST_LIFETIME),
        };
        let data = match to_value(&pending) {
            Ok(data) => data,
            Err(refusal) => return unavailable(refusal),
        };
        let id = digest(&request_id);
        let id = id.as_str();
        let stored = self
            .store
            .transact(|tx| {
                let data = data.clone();
                async move { tx.insert(REQUESTS, id, data).await }
            })
            .await;
        if let Err(refusal) = stored {
            tracing::warn!(code = %refusal.code, "a hosted app's authorization request was not stored: {refusal}");
            return back(
                if refusal.retryable { "temporarily_unavailable" } else { "server_error" },
                "the request could not be kept; try again",
            );
        }
        tracing::info!(service = %client.service_id, "hosted app authorization request pending in the dashboard");
        see_other(&format!("{}/authorize/{request_id}", self.origin))
    }
}

fn token_error(error: TokenError) -> Response {
    let body = StandardErrorResponse::new(error.error.clone(), Some(error.description.to_string()), None);
    let mut response = json_response(StatusCode::from_u16(error.status).unwrap_or(StatusCode::BAD_REQUEST), &body, "no-store");
    response.headers_mut().insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    if error.status == 401 {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"capstan-oidc\""));
    }
    response
}

/// One `application/x-www-form-urlencoded` value (`+` a space, `%XX` a byte), as RFC 6749
/// §2.3.1 encodes the client id and secret inside HTTP Basic credentials.
fn form_decode(value: &str) -> String {
    let escaped = value.replace('&', "%26");
    url::form_urlencoded::parse(format!("v={escaped}").as_bytes()).next().map(|(_, v)| v.into_owned()).unwrap_or_default()
}

/// The client id and secret of `Authorization: Basic …`; `Err` for another or a malformed
/// `Authorization`, `Ok(None)` without one.
fn basic_credentials(headers: &HeaderMap) -> std::result::Result<Option<(String, String)>, ()> {
    let Some(value) = headers.get(header::AUTHORIZATION) else { return Ok(None) };
    let value = value.to_str().map_err(|_| ())?;
    let (scheme, encoded) = value.split_once(' ').ok_or(())?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(());
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|_| ())?;
    let decoded = String::from_utf8(decoded).map_err(|_| ())?;
    let (id, secret) = decoded.split_once(':').ok_or(())?;
    Ok(Some((form_decode(id), form_decode(secret))))
}

async fn token(State(oidc): State<Arc<HostedOidc>>, headers: HeaderMap, body: Bytes) -> Response {
    match oidc.token(&headers, &body).await {
        Ok(answer) => {
            // RFC 6749 §5.1 takes the type case-insensitively; written as RFC 6750 does
            let mut answer = serde_json::to_value(&answer).unwrap_or_default();
            answer["token_type"] = Value::from("Bearer");
            let mut response = json_response(StatusCode::OK, &answer, "no-store");
            response.headers_mut().insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
            response
        }
        Err(error) => token_error(error),
    }
}

impl HostedOidc {
    async fn token(&self, headers: &HeaderMap, body: &[u8]) -> std::result::Result<token::HostedTokenResponse, TokenError> {
        if !is_form(headers) {
            return Err(TokenError::invalid_request("the body is a form (application/x-www-form-urlencoded)"));
        }
        let (params, repeated) = form(body);
        if !repeated.is_empty() {
            return Err(TokenError::invalid_request("a parameter is repeated"));
        }
        let get = |name: &str| params.get(name).map(String::as_str).filter(|v| !v.is_empty());
        let basic = basic_credentials(headers).map_err(|_| TokenError::invalid_client())?;
        let (client_id, secret) = match (basic, get("client_secret")) {
            (Some(_), Some(_)) => return Err(TokenError::invalid_request("one client authentication method at a time")),
            (Some((id, secret)), None) => {
                if get("client_id").is_some_and(|form_id| form_id != id) {
                    return Err(TokenError::invalid_request("client_id differs from the authenticated client"));
                }
                (id, secret)
            }
            (None, Some(secret)) => (get("client_id").unwrap_or_default().to_string(), secret.to_string()),
            (None, None) => return Err(TokenError::invalid_client()),
        };
        let client = self.authenticate_client(&client_id, &secret).await?;
        match get("grant_type") {
            None => return Err(TokenError::invalid_request("grant_type is required")),
            Some("authorization_code") => {}
            Some(_) => return Err(TokenError::unsupported_grant_type()),
        }
        let code = get("code").ok_or_else(|| TokenError::invalid_request("code is required"))?;
        let redirect_uri = get("redirect_uri").ok_or_else(|| TokenError::invalid_request("redirect_uri is required"))?;
        let verifier = get("code_verifier").ok_or_else(|| TokenError::invalid_grant("code_verifier is required (PKCE)"))?;
        self.exchange_code(&client, code, redirect_uri, verifier).await
    }
}

/// A `401` of the userinfo endpoint (RFC 6750 §3).
fn bearer_denied(error: Option<&'static str>) -> Response {
    let challenge = match error {
        Some(error) => format!("Bearer error=\"{error}\""),
        None => "Bearer".to_string(),
    };
    let mut response = (StatusCode::UNAUTHORIZED, [(header::CACHE_CONTROL, "no-store")]).into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

async fn userinfo(State(oidc): State<Arc<HostedOidc>>, headers: HeaderMap) -> Response {
    let Some(authorization) = headers.get(header::AUTHORIZATION) else { return bearer_denied(None) };
    let token = authorization
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let Some(token) = token else { return bearer_denied(Some("invalid_request")) };
    match oidc.userinfo(token).await {
        Ok(Some(claims)) => json_response(StatusCode::OK, &claims, "no-store"),
        Ok(None) => bearer_denied(Some("invalid_token")),
        Err(refusal) => unavailable(refusal),
    }
}
