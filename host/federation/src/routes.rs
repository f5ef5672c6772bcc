//! The browser's way through a login: `GET /auth/oidc/start` sends it to the identity provider,
//! `GET /auth/oidc/callback` is where the provider sends it back (the redirect URI registered
//! there). A refused login is a small page naming the refusal's code, or — for a login the CLI
//! began — a redirect to its loopback address carrying the code.

use crate::Federation;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use capstan_core::refusal::Refusal;
use serde::Deserialize;
use std::sync::Arc;

/// Where a login begins.
pub const START: &str = "/auth/oidc/start";
/// The redirect URI: `<public origin>/auth/oidc/callback`.
pub const CALLBACK: &str = "/auth/oidc/callback";

/// The routes, whether the platform login is configured or not (`platform-oidc-off` when not).
pub fn routes<S: Clone + Send + Sync + 'static>(federation: Option<Arc<Federation>>) -> Router<S> {
    Router::new().route(START, get(start)).route(CALLBACK, get(callback)).with_state(federation)
}

/// The refusal every route and method answers when `CAPSTAN_PLATFORM_OIDC_ISSUER` is not set.
pub fn off() -> Refusal {
    Refusal::new("platform-oidc-off", "this Capstan has no identity provider configured (CAPSTAN_PLATFORM_OIDC_ISSUER)")
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartQuery {
    challenge: Option<String>,
    return_to: Option<String>,
}

async fn start(State(federation): State<Option<Arc<Federation>>>, Query(query): Query<StartQuery>) -> Response {
    let Some(federation) = federation else { return page(&off()) };
    let (Some(challenge), Some(return_to)) = (query.challenge, query.return_to) else {
        return page(&Refusal::invalid_request("a login begins with challenge and returnTo"));
    };
    match federation.start_login(&challenge, &return_to).await {
        Ok(url) => no_store(Redirect::to(&url).into_response()),
        Err(refusal) => page(&refusal),
    }
}

#[derive(Deserialize)]
struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

async fn callback(State(federation): State<Option<Arc<Federation>>>, Query(query): Query<CallbackQuery>) -> Response {
    let Some(federation) = federation else { return page(&off()) };
    let state = query.state.unwrap_or_default();
    let loopback = federation.loopback_of(&state).await;
    let outcome = match (query.code, query.error) {
        (Some(code), None) => federation.finish_login(&code, &state).await,
        (_, error) => {
            // the provider refused (the person cancelled, say): the pending login is spent
            let said = error.unwrap_or_else(|| "no code".into());
            let said: String = said.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(64).collect();
            let _ = federation.finish_refused(&state).await;
            Err(Refusal::new("oidc-login-refused", format!("the identity provider did not sign you in ({said})")))
        }
    };
    match (outcome, loopback) {
        (Ok(finished), _) => no_store(Redirect::to(&finished.location).into_response()),
        (Err(refusal), Some(cli)) => {
            let location = cli.with(&[("error", refusal.code.as_ref()), ("message", &refusal.message)]);
            no_store(Redirect::to(&location).into_response())
        }
        (Err(refusal), None) => page(&refusal),
    }
}

fn no_store(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // the callback's URL holds a code: no page it leads to may pass it on
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

/// A refused login, as a page (the status the refusal's code answers everywhere).
fn page(refusal: &Refusal) -> Response {
    let status = StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    let escape = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;");
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign-in refused · Capstan</title></head>\
         <body><main><h1>Sign-in refused</h1><p id=\"refusal-message\">{}</p><p>Code: <code id=\"refusal-code\">{}</code></p>\
         <p><a href=\"/login\">Back to sign in</a></p></main></body></html>",
        escape(&refusal.message),
        escape(&refusal.code)
    );
    let mut response = no_store((status, Html(body)).into_response());
    response.headers_mut().insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"));
    response
}
