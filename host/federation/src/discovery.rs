//! The issuer's discovery document, checked at start, and its signing keys, fetched again when
//! an ID token names a key Capstan does not hold yet (the issuer rotated).
//!
//! Fail closed: a start whose issuer does not answer, answers for another issuer, or does not
//! advertise what Capstan needs (every configured scope, the userinfo and introspection
//! endpoints, PKCE with S256, the authorization code flow) is refused
//! `platform-oidc-discovery-incomplete` or `platform-oidc-issuer-unreachable`, naming it.

use crate::http;
use crate::{Settings, refusal_internal};
use capstan_core::refusal::{Refusal, Result};
use openidconnect::core::{
    CoreAuthDisplay, CoreClaimName, CoreClaimType, CoreClient, CoreClientAuthMethod, CoreGrantType, CoreJsonWebKey, CoreJsonWebKeySet,
    CoreJweContentEncryptionAlgorithm, CoreJweKeyManagementAlgorithm, CoreResponseMode, CoreResponseType, CoreSubjectIdentifierType,
};
use openidconnect::{AdditionalProviderMetadata, AuthType, ClientId, ClientSecret, IssuerUrl, ProviderMetadata, RedirectUrl};
use serde::{Deserialize, Serialize};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// What Capstan reads of a discovery document beyond OpenID Connect Core's fields.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Extra {
    /// RFC 8414 / RFC 7662: where access tokens are introspected.
    #[serde(default)]
    pub introspection_endpoint: Option<String>,
    /// RFC 8414: the PKCE methods the issuer takes.
    #[serde(default)]
    pub code_challenge_methods_supported: Option<Vec<String>>,
}

impl AdditionalProviderMetadata for Extra {}

/// A discovery document as Capstan reads it.
pub type Metadata = ProviderMetadata<
    Extra,
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

/// The configured client, ready to log people in (its endpoints set from discovery).
pub type Client = openidconnect::Client<
    openidconnect::EmptyAdditionalClaims,
    CoreAuthDisplay,
    openidconnect::core::CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJsonWebKey,
    openidconnect::core::CoreAuthPrompt,
    openidconnect::StandardErrorResponse<openidconnect::core::CoreErrorResponseType>,
    openidconnect::core::CoreTokenResponse,
    openidconnect::core::CoreTokenIntrospectionResponse,
    openidconnect::core::CoreRevocableToken,
    openidconnect::core::CoreRevocationErrorResponse,
    openidconnect::EndpointSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointMaybeSet,
    openidconnect::EndpointMaybeSet,
>;

/// How soon after one JWKS fetch another may be made for an unknown key (an attacker's token
/// naming made-up keys must not make Capstan hammer the issuer).
const JWKS_REFETCH_SPACING: Duration = Duration::from_secs(10);

/// The checked issuer.
pub struct Provider {
    metadata: RwLock<Metadata>,
    last_jwks_fetch: tokio::sync::Mutex<Instant>,
    /// Where access tokens are introspected.
    pub introspection_endpoint: String,
    /// Whether the token endpoint takes client_secret_basic (else client_secret_post).
    basic_auth: bool,
    http: reqwest::Client,
}

fn incomplete(settings: &Settings, missing: &[String]) -> Refusal {
    Refusal::new(
        "platform-oidc-discovery-incomplete",
        format!(
            "the identity provider {} does not advertise what Capstan needs for the platform login: {}",
            settings.issuer,
            missing.join("; ")
        ),
    )
    .with_data(serde_json::json!({ "missing": missing }))
}

/// What a discovery document lacks for `settings` (empty: nothing).
pub fn missing(settings: &Settings, metadata: &Metadata) -> Vec<String> {
    let mut missing = Vec::new();
    let supported: Vec<String> = metadata.scopes_supported().map(|s| s.iter().map(|s| s.to_string()).collect()).unwrap_or_default();
    if metadata.scopes_supported().is_none() {
        missing.push("scopes_supported (the scopes it takes)".to_string());
    } else {
        for scope in settings.scopes.iter().filter(|s| !supported.contains(s)) {
            missing.push(format!("the scope {scope}"));
        }
    }
    if metadata.userinfo_endpoint().is_none() {
        missing.push("userinfo_endpoint".to_string());
    }
    if metadata.additional_metadata().introspection_endpoint.as_deref().is_none_or(str::is_empty) {
        missing.push("introspection_endpoint".to_string());
    }
    if !metadata.additional_metadata().code_challenge_methods_supported.as_ref().is_some_and(|m| m.iter().any(|m| m == "S256")) {
        missing.push("PKCE with S256 (code_challenge_methods_supported)".to_string());
    }
    if !metadata
        .response_types_supported()
        .iter()
        .any(|r: &openidconnect::ResponseTypes<CoreResponseType>| r.len() == 1 && r[0] == CoreResponseType::Code)
    {
        missing.push("the authorization code flow (response type code)".to_string());
    }
    if metadata.token_endpoint().is_none() {
        missing.push("token_endpoint".to_string());
    }
    let methods = metadata.token_endpoint_auth_methods_supported();
    let takes = |m: &CoreClientAuthMethod| methods.is_none_or(|all| all.contains(m));
    if !takes(&CoreClientAuthMethod::ClientSecretBasic) && !takes(&CoreClientAuthMethod::ClientSecretPost) {
        missing.push("client_secret_basic or client_secret_post at the token endpoint".to_string());
    }
    missing
}

impl Provider {
    /// Read the issuer's discovery document and JWKS and check them against `settings`.
    pub async fn discover(settings: &Settings) -> Result<Provider> {
        let issuer = IssuerUrl::new(settings.issuer.clone())
            .map_err(|e| Refusal::new("config-invalid", format!("CAPSTAN_PLATFORM_OIDC_ISSUER is not a URL: {e}")))?;
        let client = http::client();
        let send = |request| http::send(client.clone(), request);
        // the crate checks the document names this very issuer and fetches its JWKS
        let metadata = Metadata::discover_async(issuer, &send).await.map_err(|e| {
            Refusal::new(
                "platform-oidc-issuer-unreachable",
                format!("the identity provider {} did not answer its discovery document usably: {e}", settings.issuer),
            )
        })?;
        let missing = missing(settings, &metadata);
        if !missing.is_empty() {
            return Err(incomplete(settings, &missing));
        }
        let methods = metadata.token_endpoint_auth_methods_supported();
        let basic_auth = methods.is_none_or(|all| all.contains(&CoreClientAuthMethod::ClientSecretBasic));
        let introspection_endpoint = metadata.additional_metadata().introspection_endpoint.clone().unwrap_or_default();
        Ok(Provider {
            metadata: RwLock::new(metadata),
            // the first unknown key may be fetched at once
            last_jwks_fetch: tokio::sync::Mutex::new(Instant::now().checked_sub(JWKS_REFETCH_SPACING).unwrap_or_else(Instant::now)),
            introspection_endpoint,
            basic_auth,
            http: client,
        })
    }

    /// The HTTP client exchanges with the issuer go through.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Whether the token and introspection endpoints take HTTP Basic client authentication.
    pub fn basic_auth(&self) -> bool {
        self.basic_auth
    }

    /// The client for `settings`, from the document as it is now (keys included).
    pub fn client(&self, settings: &Settings) -> Result<Client> {
        let metadata = self.metadata.read().expect("provider metadata lock").clone();
        let redirect = RedirectUrl::new(settings.redirect_uri()).map_err(|e| refusal_internal("the redirect URI", e))?;
        let client = CoreClient::from_provider_metadata(
            metadata,
            ClientId::new(settings.client_id.clone()),
            Some(ClientSecret::new(settings.client_secret.expose().to_string())),
        )
        .set_redirect_uri(redirect)
        .set_auth_type(if self.basic_auth { AuthType::BasicAuth } else { AuthType::RequestBody });
        Ok(client)
    }

    /// Fetch the issuer's JWKS again (it may have rotated its keys), unless that was done in
    /// the last [`JWKS_REFETCH_SPACING`]. Whether new keys were taken.
    pub async fn refresh_keys(&self) -> bool {
        let mut last = self.last_jwks_fetch.lock().await;
        if last.elapsed() < JWKS_REFETCH_SPACING {
            return false;
        }
        *last = Instant::now();
        let uri = self.metadata.read().expect("provider metadata lock").jwks_uri().clone();
        let client = self.http.clone();
        let send = |request| http::send(client.clone(), request);
        match CoreJsonWebKeySet::fetch_async(&uri, &send).await {
            Ok(keys) => {
                let mut metadata = self.metadata.write().expect("provider metadata lock");
                *metadata = metadata.clone().set_jwks(keys);
                tracing::info!("the identity provider's signing keys were fetched again");
                true
            }
            Err(e) => {
                tracing::warn!("the identity provider's signing keys could not be fetched again: {e}");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_core::text::SecretString;

    fn settings() -> Settings {
        Settings {
            issuer: "https://idp.example".into(),
            client_id: "capstan".into(),
            client_secret: SecretString::new("s".into()),
            scopes: crate::DEFAULT_SCOPES.iter().map(|s| s.to_string()).collect(),
            organization_claim: "organizations".into(),
            roles_claim: "roles".into(),
            display_name: "idp.example".into(),
            public_origin: "https://capstan.example".into(),
        }
    }

    fn document(extra: serde_json::Value) -> Metadata {
        let mut doc = serde_json::json!({
            "issuer": "https://idp.example",
            "authorization_endpoint": "https://idp.example/auth",
            "token_endpoint": "https://idp.example/token",
            "userinfo_endpoint": "https://idp.example/me",
            "introspection_endpoint": "https://idp.example/token/introspection",
            "jwks_uri": "https://idp.example/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "scopes_supported": ["openid", "profile", "organizations", "roles", "email"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                doc.as_object_mut().unwrap().remove(k);
            } else {
                doc[k] = v.clone();
            }
        }
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn a_complete_document_lacks_nothing() {
        assert!(missing(&settings(), &document(serde_json::json!({}))).is_empty());
    }

    #[test]
    fn each_thing_capstan_needs_is_named_when_missing() {
        let cases = [
            (serde_json::json!({ "scopes_supported": ["openid", "profile"] }), vec!["the scope organizations", "the scope roles"]),
            (serde_json::json!({ "scopes_supported": null }), vec!["scopes_supported (the scopes it takes)"]),
            (serde_json::json!({ "userinfo_endpoint": null }), vec!["userinfo_endpoint"]),
            (serde_json::json!({ "introspection_endpoint": null }), vec!["introspection_endpoint"]),
            (
                serde_json::json!({ "code_challenge_methods_supported": ["plain"] }),
                vec!["PKCE with S256 (code_challenge_methods_supported)"],
            ),
            (serde_json::json!({ "code_challenge_methods_supported": null }), vec!["PKCE with S256 (code_challenge_methods_supported)"]),
            (serde_json::json!({ "response_types_supported": ["id_token"] }), vec!["the authorization code flow (response type code)"]),
            (
                serde_json::json!({ "token_endpoint_auth_methods_supported": ["private_key_jwt"] }),
                vec!["client_secret_basic or client_secret_post at the token endpoint"],
            ),
        ];
        for (change, expected) in cases {
            assert_eq!(missing(&settings(), &document(change.clone())), expected, "{change}");
        }
    }
}
