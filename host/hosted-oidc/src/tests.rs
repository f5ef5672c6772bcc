use super::token::{HostedIdToken, HostedTokenResponse, pkce_matches};
use super::*;
use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use http_body_util::BodyExt;
use openidconnect::core::{CoreJsonWebKeySet, CoreJwsSigningAlgorithm};
use openidconnect::{
    ClientId, ClientSecret, IdTokenVerifier, IssuerUrl, JsonWebKey, Nonce, OAuth2TokenResponse, PkceCodeChallenge, TokenResponse,
};
use tower::ServiceExt;

const ORIGIN: &str = "http://capstan.test";
const REDIRECT: &str = "http://127.0.0.1:8080/login/generic_oauth";

struct Fixture {
    _dir: tempfile::TempDir,
    store: Store,
    keyring: Arc<Keyring>,
    clock: Clock,
    oidc: Arc<HostedOidc>,
    app: Router,
    client: EnabledClient,
    alice: Identity,
}

fn person(user_id: &str, username: &str) -> Identity {
    Identity {
        user_id: user_id.into(),
        username: username.into(),
        kind: "human".into(),
        admin: false,
        session_id: format!("session-{user_id}"),
        authenticated_at: capstan_core::clock::now_ms(),
        expires_at: capstan_core::clock::now_ms() + 3_600_000,
    }
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
    let keyring = Arc::new(Keyring::generate(None, None).unwrap());
    let clock = Clock::system();
    let oidc = HostedOidc::with_clock(store.clone(), keyring.clone(), ORIGIN, clock.clone()).await.unwrap();
    let client = oidc
        .enable_client(ClientSpec {
            service_id: "svc-grafana".into(),
            name: Some("Grafana".into()),
            redirect_uris: vec![REDIRECT.into()],
            roles: vec!["Admin".into(), "Editor".into(), "Viewer".into()],
        })
        .await
        .unwrap();
    let alice = person("user_alice", "alice");
    oidc.assign_role("svc-grafana", &alice.user_id, Some("Editor")).await.unwrap();
    let app = oidc.router();
    Fixture { _dir: dir, store, keyring, clock, oidc, app, client, alice }
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, HeaderMap, Vec<u8>) {
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    (parts.status, parts.headers, body.collect().await.unwrap().to_bytes().to_vec())
}

async fn get(app: &Router, uri: &str) -> (StatusCode, HeaderMap, Vec<u8>) {
    send(app, Request::get(uri).body(Body::empty()).unwrap()).await
}

fn location(headers: &HeaderMap) -> String {
    headers.get(header::LOCATION).expect("a Location").to_str().unwrap().to_string()
}

fn query_of(url: &str) -> BTreeMap<String, String> {
    url::Url::parse(url).unwrap().query_pairs().into_owned().collect()
}

use std::collections::BTreeMap;

/// One browser's start of a sign-in: its PKCE verifier, state and nonce.
struct Start {
    verifier: String,
    state: String,
    nonce: String,
}

fn authorize_uri(client_id: &str, params: &[(&str, &str)]) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    query.append_pair("client_id", client_id);
    for (k, v) in params {
        query.append_pair(k, v);
    }
    format!("/oidc/authorize?{}", query.finish())
}

/// A valid authorization request's parameters, with a fresh PKCE pair.
fn valid(start: &Start) -> Vec<(&'static str, String)> {
    let challenge = PkceCodeChallenge::from_code_verifier_sha256(&openidconnect::PkceCodeVerifier::new(start.verifier.clone()));
    vec![
        ("redirect_uri", REDIRECT.to_string()),
        ("response_type", "code".to_string()),
        ("scope", "openid profile roles".to_string()),
        ("state", start.state.clone()),
        ("nonce", start.nonce.clone()),
        ("code_challenge", challenge.as_str().to_string()),
        ("code_challenge_method", "S256".to_string()),
    ]
}

fn start() -> Start {
    Start { verifier: random_token() + "-verifier", state: random_token(), nonce: random_token() }
}

/// Authorize and answer the request id the dashboard is sent with.
async fn pending_request(f: &Fixture, start: &Start) -> String {
    let params = valid(start);
    let pairs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, headers, _) = get(&f.app, &authorize_uri(&f.client.client_id, &pairs)).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let location = location(&headers);
    let prefix = format!("{ORIGIN}/authorize/");
    location.strip_prefix(&prefix).unwrap_or_else(|| panic!("{location}")).to_string()
}

/// A code for `who` (through authorize and the dashboard's approval).
async fn code_for(f: &Fixture, start: &Start, who: &Identity) -> String {
    let request_id = pending_request(f, start).await;
    let redirect = f.oidc.complete_authorization(&request_id, who).await.unwrap();
    assert!(redirect.starts_with(REDIRECT), "{redirect}");
    let query = query_of(&redirect);
    assert_eq!(query["state"], start.state);
    assert_eq!(query["iss"], f.oidc.issuer());
    query["code"].clone()
}

fn basic(client_id: &str, secret: &str) -> String {
    use base64::Engine;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{client_id}:{secret}")))
}

async fn token_request(f: &Fixture, authorization: Option<&str>, form: &[(&str, &str)]) -> (StatusCode, HeaderMap, Value) {
    let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
    let mut request = Request::post("/oidc/token").header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(authorization) = authorization {
        request = request.header(header::AUTHORIZATION, authorization);
    }
    let (status, headers, body) = send(&f.app, request.body(Body::from(body)).unwrap()).await;
    (status, headers, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

async fn exchange(f: &Fixture, code: &str, verifier: &str) -> (StatusCode, HeaderMap, Value) {
    token_request(
        f,
        Some(&basic(&f.client.client_id, &f.client.client_secret)),
        &[("grant_type", "authorization_code"), ("code", code), ("redirect_uri", REDIRECT), ("code_verifier", verifier)],
    )
    .await
}

async fn jwks(f: &Fixture) -> CoreJsonWebKeySet {
    let (status, _, body) = get(&f.app, "/oidc/jwks").await;
    assert_eq!(status, StatusCode::OK);
    serde_json::from_slice(&body).unwrap()
}

async fn userinfo(f: &Fixture, access_token: &str) -> (StatusCode, HeaderMap, Value) {
    let request =
        Request::get("/oidc/userinfo").header(header::AUTHORIZATION, format!("Bearer {access_token}")).body(Body::empty()).unwrap();
    let (status, headers, body) = send(&f.app, request).await;
    (status, headers, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// Verify an ID token the way a relying party does (signature with the JWKS, iss, aud, exp, nonce).
async fn verify(f: &Fixture, id_token: &HostedIdToken, nonce: &str) -> (String, Value) {
    let keys = jwks(f).await;
    let verifier = IdTokenVerifier::new_confidential_client(
        ClientId::new(f.client.client_id.clone()),
        ClientSecret::new(f.client.client_secret.clone()),
        IssuerUrl::new(f.oidc.issuer().to_string()).unwrap(),
        keys,
    )
    .set_allowed_algs(vec![CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256]);
    let claims = id_token.claims(&verifier, &Nonce::new(nonce.to_string())).expect("the ID token verifies");
    let header_kid = {
        use base64::Engine;
        let text = id_token.to_string();
        let header = text.split('.').next().unwrap();
        let header: Value = serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap();
        assert_eq!(header["alg"], "RS256");
        header["kid"].as_str().unwrap().to_string()
    };
    (header_kid, serde_json::to_value(claims).unwrap())
}

#[tokio::test]
async fn discovery_describes_the_provider() {
    let f = fixture().await;
    let (status, _, body) = get(&f.app, "/oidc/.well-known/openid-configuration").await;
    assert_eq!(status, StatusCode::OK);
    let meta: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(meta["issuer"], "http://capstan.test/oidc");
    assert_eq!(meta["authorization_endpoint"], "http://capstan.test/oidc/authorize");
    assert_eq!(meta["token_endpoint"], "http://capstan.test/oidc/token");
    assert_eq!(meta["userinfo_endpoint"], "http://capstan.test/oidc/userinfo");
    assert_eq!(meta["jwks_uri"], "http://capstan.test/oidc/jwks");
    assert_eq!(meta["response_types_supported"], json!(["code"]));
    assert_eq!(meta["grant_types_supported"], json!(["authorization_code"]));
    assert_eq!(meta["subject_types_supported"], json!(["public"]));
    assert_eq!(meta["id_token_signing_alg_values_supported"], json!(["RS256"]));
    assert_eq!(meta["scopes_supported"], json!(["openid", "profile", "roles"]));
    assert_eq!(meta["token_endpoint_auth_methods_supported"], json!(["client_secret_basic", "client_secret_post"]));
    assert_eq!(meta["code_challenge_methods_supported"], json!(["S256"]));
    for claim in ["sub", "preferred_username", "name", "roles", "nonce"] {
        assert!(meta["claims_supported"].as_array().unwrap().contains(&json!(claim)), "{claim}");
    }
    let keys = jwks(&f).await;
    assert_eq!(keys.keys().len(), 1);
    let jwk = serde_json::to_value(&keys.keys()[0]).unwrap();
    assert_eq!((jwk["kty"].as_str(), jwk["use"].as_str(), jwk["alg"].as_str()), (Some("RSA"), Some("sig"), Some("RS256")));
    assert!(jwk.get("d").is_none() && jwk.get("p").is_none(), "no private part is published: {jwk}");
}

#[tokio::test]
async fn an_unknown_client_or_redirect_gets_an_error_page_never_a_redirect() {
    let f = fixture().await;
    let s = start();
    let params = valid(&s);
    let pairs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, headers, body) = get(&f.app, &authorize_uri("oidc_nobody", &pairs)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(headers.get(header::LOCATION).is_none());
    assert!(String::from_utf8(body).unwrap().contains("client"));
    let (status, headers, _) = get(&f.app, "/oidc/authorize?response_type=code").await;
    assert_eq!((status, headers.get(header::LOCATION).is_none()), (StatusCode::BAD_REQUEST, true));
    for redirect in ["http://127.0.0.1:8080/login/other", "http://127.0.0.1:8080/login/generic_oauth/", "https://evil.example/cb"] {
        let mut pairs = pairs.clone();
        pairs[0] = ("redirect_uri", redirect);
        let (status, headers, _) = get(&f.app, &authorize_uri(&f.client.client_id, &pairs)).await;
        assert_eq!((status, headers.get(header::LOCATION).is_none()), (StatusCode::BAD_REQUEST, true), "{redirect}");
    }
    // a redirect_uri given twice is not trusted either
    let mut twice = pairs.clone();
    twice.push(("redirect_uri", REDIRECT));
    let (status, _, _) = get(&f.app, &authorize_uri(&f.client.client_id, &twice)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_bad_request_to_a_known_redirect_goes_back_with_an_error() {
    let f = fixture().await;
    let s = start();
    let params = valid(&s);
    let base: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let without = |name: &str| base.iter().copied().filter(|(k, _)| *k != name).collect::<Vec<_>>();
    let with = |name: &'static str, value: &'static str| {
        let mut pairs = without(name);
        pairs.push((name, value));
        pairs
    };
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (without("code_challenge"), "invalid_request"),
        (without("code_challenge_method"), "invalid_request"),
        (with("code_challenge_method", "plain"), "invalid_request"),
        (with("code_challenge", "too-short"), "invalid_request"),
        (without("response_type"), "invalid_request"),
        (with("response_type", "token"), "unsupported_response_type"),
        (with("scope", "profile roles"), "invalid_scope"),
        (without("state"), "invalid_request"),
        (with("prompt", "none"), "interaction_required"),
        (with("request", "eyJ..."), "request_not_supported"),
        (with("response_mode", "fragment"), "invalid_request"),
        (
            {
                let mut pairs = base.clone();
                pairs.push(("scope", "openid"));
                pairs
            },
            "invalid_request",
        ),
    ];
    for (pairs, error) in cases {
        let (status, headers, _) = get(&f.app, &authorize_uri(&f.client.client_id, &pairs)).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{pairs:?}");
        let location = location(&headers);
        assert!(location.starts_with(REDIRECT), "{location}");
        let query = query_of(&location);
        assert_eq!(query["error"], error, "{pairs:?}");
        assert_eq!(query["iss"], "http://capstan.test/oidc");
        if pairs.iter().any(|(k, _)| *k == "state") {
            assert_eq!(query["state"], s.state);
        }
    }
    // nothing was parked for the dashboard
    let pending = f.store.transact(|tx| async move { tx.scan(REQUESTS, None, 10).await }).await.unwrap();
    assert!(pending.documents.is_empty());
}

#[tokio::test]
async fn the_code_flow_issues_verifiable_tokens_with_the_users_role() {
    let f = fixture().await;
    let s = start();
    let request_id = pending_request(&f, &s).await;
    let view = f.oidc.authorization(&request_id, &f.alice).await.unwrap();
    assert_eq!(
        (view.service_id.as_str(), view.app_name.as_str(), view.role.as_deref(), view.redirect_origin.as_str()),
        ("svc-grafana", "Grafana", Some("Editor"), "http://127.0.0.1:8080")
    );
    assert_eq!(view.scopes, vec!["openid", "profile", "roles"]);
    let bob = person("user_bob", "bob");
    assert_eq!(f.oidc.authorization(&request_id, &bob).await.unwrap().role, None, "bob has no role");
    let redirect = f.oidc.complete_authorization(&request_id, &f.alice).await.unwrap();
    let code = query_of(&redirect)["code"].clone();
    // the request is used up
    assert_eq!(f.oidc.complete_authorization(&request_id, &f.alice).await.unwrap_err().code, "hosted-oidc-request-unknown");

    let (status, headers, body) = exchange(&f, &code, &s.verifier).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers.get(header::CACHE_CONTROL).unwrap(), "no-store");
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 3600);
    assert!(body.get("refresh_token").is_none());
    let answer: HostedTokenResponse = serde_json::from_value(body).unwrap();
    let (kid, claims) = verify(&f, answer.id_token().unwrap(), &s.nonce).await;
    assert_eq!(Some(kid.as_str()), jwks(&f).await.keys()[0].key_id().map(|k| k.as_str()));
    assert_eq!(claims["iss"], "http://capstan.test/oidc");
    assert_eq!(claims["sub"], "user_alice");
    assert_eq!(claims["aud"], json!([f.client.client_id]));
    assert_eq!(claims["nonce"], s.nonce);
    assert_eq!(claims["preferred_username"], "alice");
    assert_eq!(claims["name"], "alice");
    assert_eq!(claims["roles"], json!(["Editor"]));
    assert_eq!(claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(), 3600);
    assert_eq!(claims["auth_time"].as_u64().unwrap(), f.alice.authenticated_at / 1000);
    assert!(claims["at_hash"].is_string());

    let access = answer.access_token().secret().clone();
    let (status, _, info) = userinfo(&f, &access).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info, json!({"sub": "user_alice", "preferred_username": "alice", "name": "alice", "roles": ["Editor"]}));
    // POST works too
    let request = Request::post("/oidc/userinfo").header(header::AUTHORIZATION, format!("Bearer {access}")).body(Body::empty()).unwrap();
    assert_eq!(send(&f.app, request).await.0, StatusCode::OK);
    // a changed role shows at once; a removed one ends the token
    f.oidc.assign_role("svc-grafana", "user_alice", Some("Admin")).await.unwrap();
    assert_eq!(userinfo(&f, &access).await.2["roles"], json!(["Admin"]));
    f.oidc.assign_role("svc-grafana", "user_alice", None).await.unwrap();
    let (status, headers, _) = userinfo(&f, &access).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers.get(header::WWW_AUTHENTICATE).unwrap(), "Bearer error=\"invalid_token\"");
}

#[tokio::test]
async fn a_replayed_code_is_refused_and_revokes_its_tokens() {
    let f = fixture().await;
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let (status, _, body) = exchange(&f, &code, &s.verifier).await;
    assert_eq!(status, StatusCode::OK);
    let access = body["access_token"].as_str().unwrap().to_string();
    assert_eq!(userinfo(&f, &access).await.0, StatusCode::OK);
    let (status, _, body) = exchange(&f, &code, &s.verifier).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_grant")));
    let (status, headers, _) = userinfo(&f, &access).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the token issued from the replayed code is revoked");
    assert_eq!(headers.get(header::WWW_AUTHENTICATE).unwrap(), "Bearer error=\"invalid_token\"");
    // garbage and missing bearers
    assert_eq!(userinfo(&f, "not-a-token").await.0, StatusCode::UNAUTHORIZED);
    let (status, headers, _) = get(&f.app, "/oidc/userinfo").await;
    assert_eq!((status, headers.get(header::WWW_AUTHENTICATE).unwrap().to_str().unwrap()), (StatusCode::UNAUTHORIZED, "Bearer"));
}

#[tokio::test]
async fn pkce_is_checked_and_a_failed_exchange_spends_the_code() {
    assert!(
        pkce_matches("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"),
        "RFC 7636 appendix B"
    );
    assert!(!pkce_matches("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXj", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"));
    assert!(!pkce_matches("short", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"));
    let f = fixture().await;
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let other = start();
    let (status, _, body) = exchange(&f, &code, &other.verifier).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_grant")));
    let (_, _, body) = exchange(&f, &code, &s.verifier).await;
    assert_eq!(body["error"], "invalid_grant", "the code was spent by the failed try");
    // no verifier at all
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let (status, _, body) = token_request(
        &f,
        Some(&basic(&f.client.client_id, &f.client.client_secret)),
        &[("grant_type", "authorization_code"), ("code", &code), ("redirect_uri", REDIRECT)],
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_grant")));
}

#[tokio::test]
async fn client_authentication_and_the_redirect_are_checked_at_the_token_endpoint() {
    let f = fixture().await;
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let form = [("grant_type", "authorization_code"), ("code", code.as_str()), ("redirect_uri", REDIRECT), ("code_verifier", &s.verifier)];
    // a wrong secret, an unknown client, no authentication: invalid_client, the code untouched
    for authorization in [basic(&f.client.client_id, "wrong-secret"), basic("oidc_nobody", &f.client.client_secret)] {
        let (status, headers, body) = token_request(&f, Some(&authorization), &form).await;
        assert_eq!((status, body["error"].as_str()), (StatusCode::UNAUTHORIZED, Some("invalid_client")));
        assert!(headers.get(header::WWW_AUTHENTICATE).unwrap().to_str().unwrap().starts_with("Basic"));
    }
    let (status, _, body) = token_request(&f, None, &form).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::UNAUTHORIZED, Some("invalid_client")));
    // both methods at once
    let mut both = form.to_vec();
    both.push(("client_secret", &f.client.client_secret));
    let (status, _, body) = token_request(&f, Some(&basic(&f.client.client_id, &f.client.client_secret)), &both).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_request")));
    // another grant type
    let (_, _, body) = token_request(
        &f,
        Some(&basic(&f.client.client_id, &f.client.client_secret)),
        &[("grant_type", "refresh_token"), ("refresh_token", "x")],
    )
    .await;
    assert_eq!(body["error"], "unsupported_grant_type");
    // client_secret_post, but another redirect: invalid_grant (and the code is spent)
    let mut post = vec![("client_id", f.client.client_id.as_str()), ("client_secret", f.client.client_secret.as_str())];
    post.extend([
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("redirect_uri", "http://127.0.0.1:8080/x"),
        ("code_verifier", &s.verifier),
    ]);
    let (status, _, body) = token_request(&f, None, &post).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_grant")));
    // client_secret_post with everything right
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let post = [
        ("client_id", f.client.client_id.as_str()),
        ("client_secret", f.client.client_secret.as_str()),
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("redirect_uri", REDIRECT),
        ("code_verifier", &s.verifier),
    ];
    let (status, _, body) = token_request(&f, None, &post).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // a code is bound to its client: another app's client cannot redeem it
    let other = f
        .oidc
        .enable_client(ClientSpec {
            service_id: "svc-gitea".into(),
            name: None,
            redirect_uris: vec![REDIRECT.into()],
            roles: vec!["user".into()],
        })
        .await
        .unwrap();
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let (_, _, body) = token_request(
        &f,
        Some(&basic(&other.client_id, &other.client_secret)),
        &[("grant_type", "authorization_code"), ("code", &code), ("redirect_uri", REDIRECT), ("code_verifier", &s.verifier)],
    )
    .await;
    assert_eq!(body["error"], "invalid_grant");
    assert_eq!(exchange(&f, &code, &s.verifier).await.0, StatusCode::OK, "the rightful client still can");
}

#[tokio::test]
async fn roles_decide_who_gets_in() {
    let f = fixture().await;
    let bob = person("user_bob", "bob");
    let s = start();
    let request_id = pending_request(&f, &s).await;
    let refused = f.oidc.complete_authorization(&request_id, &bob).await.unwrap_err();
    assert_eq!((refused.code.as_ref(), refused.http_status()), ("hosted-app-access-denied", 403));
    // a machine never signs in to an app
    let machine = Identity { kind: "machine".into(), ..f.alice.clone() };
    let refused = f.oidc.complete_authorization(&request_id, &machine).await.unwrap_err();
    assert_eq!((refused.code.as_ref(), refused.http_status()), ("hosted-oidc-human-required", 403));
    assert_eq!(f.oidc.authorization(&request_id, &machine).await.unwrap_err().code, "hosted-oidc-human-required");
    // roles must be declared; the app must exist
    let undeclared = f.oidc.assign_role("svc-grafana", "user_bob", Some("Owner")).await.unwrap_err();
    assert_eq!((undeclared.code.as_ref(), undeclared.http_status()), ("hosted-oidc-role-undeclared", 400));
    let unknown = f.oidc.assign_role("svc-nothing", "user_bob", Some("Viewer")).await.unwrap_err();
    assert_eq!((unknown.code.as_ref(), unknown.http_status()), ("hosted-oidc-client-unknown", 404));
    // once bob has a role, the same request goes through
    f.oidc.assign_role("svc-grafana", "user_bob", Some("Viewer")).await.unwrap();
    let redirect = f.oidc.complete_authorization(&request_id, &bob).await.unwrap();
    assert!(query_of(&redirect).contains_key("code"));
    let assigned: Vec<(String, String)> =
        f.oidc.assignments("svc-grafana").await.unwrap().into_iter().map(|a| (a.user_id, a.role)).collect();
    assert_eq!(assigned, vec![("user_alice".into(), "Editor".into()), ("user_bob".into(), "Viewer".into())]);
    // replacing the client keeps assignments of roles it still declares
    f.oidc
        .enable_client(ClientSpec {
            service_id: "svc-grafana".into(),
            name: Some("Grafana".into()),
            redirect_uris: vec![REDIRECT.into()],
            roles: vec!["Admin".into(), "Viewer".into()],
        })
        .await
        .unwrap();
    let assigned: Vec<String> = f.oidc.assignments("svc-grafana").await.unwrap().into_iter().map(|a| a.user_id).collect();
    assert_eq!(assigned, vec!["user_bob"], "alice's Editor is no longer declared");
}

#[tokio::test]
async fn declining_sends_access_denied_back() {
    let f = fixture().await;
    let s = start();
    let request_id = pending_request(&f, &s).await;
    let redirect = f.oidc.cancel_authorization(&request_id, &f.alice).await.unwrap();
    let query = query_of(&redirect);
    assert_eq!((query["error"].as_str(), query["state"].as_str()), ("access_denied", s.state.as_str()));
    assert!(!query.contains_key("code"));
    let gone = f.oidc.complete_authorization(&request_id, &f.alice).await.unwrap_err();
    assert_eq!((gone.code.as_ref(), gone.http_status()), ("hosted-oidc-request-unknown", 404));
    assert_eq!(f.oidc.authorization("made-up", &f.alice).await.unwrap_err().code, "hosted-oidc-request-unknown");
}

#[tokio::test]
async fn requests_codes_and_tokens_lapse() {
    let f = fixture().await;
    // a pending request lapses after 10 minutes
    let s = start();
    let request_id = pending_request(&f, &s).await;
    f.clock.advance(REQUEST_LIFETIME + Duration::from_secs(1));
    assert_eq!(f.oidc.authorization(&request_id, &f.alice).await.unwrap_err().code, "hosted-oidc-request-unknown");
    // a code after 5 minutes
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    f.clock.advance(CODE_LIFETIME + Duration::from_secs(1));
    assert_eq!(exchange(&f, &code, &s.verifier).await.2["error"], "invalid_grant");
    // an access token after an hour
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let access = exchange(&f, &code, &s.verifier).await.2["access_token"].as_str().unwrap().to_string();
    assert_eq!(userinfo(&f, &access).await.0, StatusCode::OK);
    f.clock.advance(TOKEN_LIFETIME + Duration::from_secs(1));
    assert_eq!(userinfo(&f, &access).await.0, StatusCode::UNAUTHORIZED);
    // and the reaper takes all of it away
    assert!(f.oidc.reap_expired().await.unwrap() >= 4);
    for collection in [REQUESTS, CODES, TOKENS] {
        let left = f.store.transact(|tx| async move { tx.scan(collection, None, 10).await }).await.unwrap();
        assert!(left.documents.is_empty(), "{collection}: {:?}", left.documents);
    }
}

#[tokio::test]
async fn rotation_keeps_the_old_key_published_for_the_overlap_then_drops_it() {
    let f = fixture().await;
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let before: HostedTokenResponse = serde_json::from_value(exchange(&f, &code, &s.verifier).await.2).unwrap();
    let (old_kid, _) = verify(&f, before.id_token().unwrap(), &s.nonce).await;

    let rotated = f.oidc.rotate_signing_key().await.unwrap();
    assert_ne!(rotated.kid, old_kid);
    assert_eq!((rotated.algorithm.as_str(), rotated.retires_at), ("RS256", None));
    let published: Vec<String> = jwks(&f).await.keys().iter().map(|k| k.key_id().unwrap().to_string()).collect();
    assert_eq!(published, vec![rotated.kid.clone(), old_kid.clone()], "the active key first");
    let views = f.oidc.signing_keys().await.unwrap();
    assert_eq!(views[1].retires_at.unwrap() - views[0].created_at, millis(KEY_OVERLAP));

    // the old ID token still verifies; a new one carries the new kid
    verify(&f, before.id_token().unwrap(), &s.nonce).await;
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let after: HostedTokenResponse = serde_json::from_value(exchange(&f, &code, &s.verifier).await.2).unwrap();
    assert_eq!(verify(&f, after.id_token().unwrap(), &s.nonce).await.0, rotated.kid);

    // past the overlap the old key is no longer published, and the next rotation deletes it
    f.clock.advance(KEY_OVERLAP + Duration::from_secs(1));
    let published: Vec<String> = jwks(&f).await.keys().iter().map(|k| k.key_id().unwrap().to_string()).collect();
    assert_eq!(published, vec![rotated.kid.clone()]);
    let third = f.oidc.rotate_signing_key().await.unwrap();
    let stored: Vec<String> =
        f.store.transact(|tx| async move { tx.scan(KEYS, None, 10).await }).await.unwrap().documents.into_iter().map(|d| d.id).collect();
    assert!(!stored.contains(&old_kid) && stored.contains(&rotated.kid) && stored.contains(&third.kid), "{stored:?}");
}

#[tokio::test]
async fn a_second_start_on_the_same_store_carries_on() {
    let f = fixture().await;
    let first_kid = f.oidc.signing_keys().await.unwrap()[0].kid.clone();
    let again = HostedOidc::with_clock(f.store.clone(), f.keyring.clone(), ORIGIN, f.clock.clone()).await.unwrap();
    assert_eq!(again.signing_keys().await.unwrap().len(), 1, "no second key is made");
    assert_eq!(again.signing_keys().await.unwrap()[0].kid, first_kid);
    assert_eq!(again.client("svc-grafana").await.unwrap().unwrap().client_id, f.client.client_id);
    // a request parked by the first is approved and exchanged by the second
    let s = start();
    let request_id = pending_request(&f, &s).await;
    let redirect = again.complete_authorization(&request_id, &f.alice).await.unwrap();
    let code = query_of(&redirect)["code"].clone();
    let second = Fixture { app: again.router(), oidc: again.clone(), ..fixture_parts(&f) };
    let (status, _, body) = exchange(&second, &code, &s.verifier).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer: HostedTokenResponse = serde_json::from_value(body).unwrap();
    assert_eq!(verify(&f, answer.id_token().unwrap(), &s.nonce).await.0, first_kid, "signed by the reloaded key");
    // a rotation on one is what the other signs with
    let rotated = again.rotate_signing_key().await.unwrap();
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let answer: HostedTokenResponse = serde_json::from_value(exchange(&f, &code, &s.verifier).await.2).unwrap();
    assert_eq!(verify(&f, answer.id_token().unwrap(), &s.nonce).await.0, rotated.kid);
    // another keyring cannot open the stored key
    let other = Arc::new(Keyring::generate(None, None).unwrap());
    let refused = HostedOidc::with_clock(f.store.clone(), other, ORIGIN, f.clock.clone()).await.unwrap_err();
    assert_eq!(refused.code, "kek-unavailable");
}

/// The parts of `f` a second fixture over the same store shares.
fn fixture_parts(f: &Fixture) -> Fixture {
    Fixture {
        _dir: tempfile::tempdir().unwrap(),
        store: f.store.clone(),
        keyring: f.keyring.clone(),
        clock: f.clock.clone(),
        oidc: f.oidc.clone(),
        app: f.app.clone(),
        client: f.client.clone(),
        alice: f.alice.clone(),
    }
}

#[tokio::test]
async fn disabling_a_client_ends_everything_it_issued() {
    let f = fixture().await;
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let access = exchange(&f, &code, &s.verifier).await.2["access_token"].as_str().unwrap().to_string();
    let pending = pending_request(&f, &start()).await;
    assert!(f.oidc.disable_client("svc-grafana").await.unwrap());
    assert!(!f.oidc.disable_client("svc-grafana").await.unwrap());
    assert_eq!(f.oidc.client("svc-grafana").await.unwrap(), None);
    assert_eq!(userinfo(&f, &access).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(f.oidc.authorization(&pending, &f.alice).await.unwrap_err().code, "hosted-oidc-request-unknown");
    assert!(f.oidc.assignments("svc-grafana").await.unwrap().is_empty());
    let (_, _, body) = exchange(&f, &code, &s.verifier).await;
    assert_eq!(body["error"], "invalid_client");
}

#[tokio::test]
async fn client_registration_is_validated_and_replacing_it_changes_the_secret() {
    let f = fixture().await;
    let spec = |service_id: &str, redirect: &str, roles: &[&str]| ClientSpec {
        service_id: service_id.into(),
        name: None,
        redirect_uris: vec![redirect.into()],
        roles: roles.iter().map(|r| r.to_string()).collect(),
    };
    for (input, code) in [
        (spec("", REDIRECT, &["a"]), "invalid-request"),
        (spec("has/slash", REDIRECT, &["a"]), "invalid-request"),
        (spec("svc", "http://app.example/cb", &["a"]), "hosted-oidc-redirect-invalid"),
        (spec("svc", "https://app.example/cb#frag", &["a"]), "hosted-oidc-redirect-invalid"),
        (spec("svc", "not a url", &["a"]), "hosted-oidc-redirect-invalid"),
        (spec("svc", "https://user:pw@app.example/cb", &["a"]), "hosted-oidc-redirect-invalid"),
        (spec("svc", "https://app.example/cb", &[]), "invalid-request"),
        (spec("svc", "https://app.example/cb", &["has space"]), "invalid-request"),
    ] {
        assert_eq!(f.oidc.enable_client(input).await.unwrap_err().code, code);
    }
    let enabled = f.oidc.enable_client(spec("svc-app", "https://app.example/cb", &["user", "admin", "user"])).await.unwrap();
    assert_eq!(enabled.roles, vec!["user", "admin"], "declared once each, in order");
    assert_eq!(enabled.issuer, "http://capstan.test/oidc");
    assert_eq!(B64URL.decode(&enabled.client_secret).unwrap().len(), 32);
    assert!(!format!("{enabled:?}").contains(&enabled.client_secret), "Debug hides the secret");
    let view = f.oidc.client("svc-app").await.unwrap().unwrap();
    assert_eq!((view.client_id.as_str(), view.name.as_str()), (enabled.client_id.as_str(), "svc-app"));
    let replaced = f.oidc.enable_client(spec("svc-app", "https://app.example/cb", &["user"])).await.unwrap();
    assert_ne!(
        (replaced.client_id.as_str(), replaced.client_secret.as_str()),
        (enabled.client_id.as_str(), enabled.client_secret.as_str())
    );
    // the old credentials no longer authenticate
    let (status, _, _) =
        token_request(&f, Some(&basic(&enabled.client_id, &enabled.client_secret)), &[("grant_type", "authorization_code")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // a public origin with a path is refused
    let refused = HostedOidc::new(f.store.clone(), f.keyring.clone(), "https://capstan.example/sub").await.unwrap_err();
    assert_eq!(refused.code, "invalid-request");
    let trailing = HostedOidc::new(f.store.clone(), f.keyring.clone(), "https://capstan.example/").await.unwrap();
    assert_eq!(trailing.issuer(), "https://capstan.example/oidc");
}

#[tokio::test]
async fn the_store_holds_no_secret() {
    let f = fixture().await;
    let s = start();
    let request_id = pending_request(&f, &s).await;
    let redirect = f.oidc.complete_authorization(&request_id, &f.alice).await.unwrap();
    let code = query_of(&redirect)["code"].clone();
    let body = exchange(&f, &code, &s.verifier).await.2;
    let access = body["access_token"].as_str().unwrap().to_string();
    let pending = pending_request(&f, &start()).await;
    let mut everything = String::new();
    for collection in [CLIENTS, ASSIGNMENTS, REQUESTS, CODES, TOKENS, KEYS] {
        let docs = f.store.transact(|tx| async move { tx.scan(collection, None, 100).await }).await.unwrap();
        everything.push_str(&serde_json::to_string(&docs.documents).unwrap());
    }
    for secret in [&f.client.client_secret, &code, &access, &request_id, &pending, &s.verifier] {
        assert!(!everything.contains(secret.as_str()), "a secret is stored in the clear");
    }
    assert!(everything.contains(&digest(&f.client.client_secret)), "the secret's hash is what is kept");
    assert!(!everything.contains("PRIVATE KEY"), "the signing key is sealed");
}

#[tokio::test]
async fn the_methods_hand_off_to_the_dashboard_and_rotate_for_a_fresh_admin() {
    use capstan_rpc::{Call, Registry};
    let f = fixture().await;
    let mut registry = Registry::default();
    register(&mut registry, f.oidc.clone());
    let s = start();
    let request_id = pending_request(&f, &s).await;
    let call = |name: &str, who: &Identity, body: Value| {
        let method = registry.get(name).unwrap();
        let who = who.clone();
        async move { method.call(Call::by(&who), body).await }
    };
    let view = call("hostedOidc.getAuthorization", &f.alice, json!({"requestId": request_id})).await.unwrap();
    assert_eq!((view["appName"].as_str(), view["role"].as_str()), (Some("Grafana"), Some("Editor")));
    let unknown = call("hostedOidc.getAuthorization", &f.alice, json!({"requestId": "nope"})).await.unwrap_err();
    assert_eq!(unknown.code, "hosted-oidc-request-unknown");
    assert!(registry.get("hostedOidc.getAuthorization").unwrap().declares(&unknown), "declared, with its status");
    let bob = person("user_bob", "bob");
    let denied = call("hostedOidc.completeAuthorization", &bob, json!({"requestId": request_id})).await.unwrap_err();
    assert_eq!(denied.code, "hosted-app-access-denied");
    assert!(registry.get("hostedOidc.completeAuthorization").unwrap().declares(&denied));
    let strict = call("hostedOidc.getAuthorization", &f.alice, json!({"requestId": request_id, "x": 1})).await.unwrap_err();
    assert_eq!(strict.code, "invalid-request");
    let done = call("hostedOidc.completeAuthorization", &f.alice, json!({"requestId": request_id})).await.unwrap();
    assert!(done["redirectUrl"].as_str().unwrap().starts_with(REDIRECT));
    let request_id = pending_request(&f, &start()).await;
    let declined = call("hostedOidc.cancelAuthorization", &f.alice, json!({"requestId": request_id})).await.unwrap();
    assert!(declined["redirectUrl"].as_str().unwrap().contains("error=access_denied"));

    let refused = call("hostedOidc.rotateSigningKey", &f.alice, json!({})).await.unwrap_err();
    assert_eq!(refused.code, "forbidden", "not an administrator");
    let stale = Identity { admin: true, authenticated_at: 0, ..f.alice.clone() };
    let not_fresh = call("hostedOidc.rotateSigningKey", &stale, json!({})).await.unwrap_err();
    assert_eq!(not_fresh.code, "admin-not-fresh");
    assert!(registry.get("hostedOidc.rotateSigningKey").unwrap().declares(&not_fresh));
    let admin = Identity { admin: true, ..f.alice.clone() };
    let rotated = call("hostedOidc.rotateSigningKey", &admin, json!({})).await.unwrap();
    assert_eq!(rotated["kid"], f.oidc.signing_keys().await.unwrap()[0].kid);
    for name in ["hostedOidc.getAuthorization", "hostedOidc.completeAuthorization", "hostedOidc.cancelAuthorization"] {
        assert_eq!(registry.get(name).unwrap().access, capstan_rpc::Access::Authenticated);
    }
}

#[tokio::test]
async fn forgetting_a_user_ends_their_roles_and_tokens_in_every_app() {
    let f = fixture().await;
    f.oidc
        .enable_client(ClientSpec {
            service_id: "svc-gitea".into(),
            name: None,
            redirect_uris: vec![REDIRECT.into()],
            roles: vec!["user".into()],
        })
        .await
        .unwrap();
    f.oidc.assign_role("svc-gitea", "user_alice", Some("user")).await.unwrap();
    f.oidc.assign_role("svc-gitea", "user_bob", Some("user")).await.unwrap();
    let s = start();
    let code = code_for(&f, &s, &f.alice).await;
    let access = exchange(&f, &code, &s.verifier).await.2["access_token"].as_str().unwrap().to_string();
    assert_eq!(f.oidc.forget_user("user_alice").await.unwrap(), 3, "two roles and a token");
    assert_eq!(userinfo(&f, &access).await.0, StatusCode::UNAUTHORIZED);
    assert!(f.oidc.assignments("svc-grafana").await.unwrap().is_empty());
    let left: Vec<String> = f.oidc.assignments("svc-gitea").await.unwrap().into_iter().map(|a| a.user_id).collect();
    assert_eq!(left, vec!["user_bob"]);
    assert_eq!(f.oidc.forget_user("user_alice").await.unwrap(), 0);
}
