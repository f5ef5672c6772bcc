//! `GET /v2/token`: the Docker token flow. A person's username and password, or a machine
//! user's (a deployer's) username and token, in HTTP Basic authentication, open a Capstan
//! session whose JWT is the registry bearer. Nothing is granted by the token itself: every
//! request is judged from the caller's roles and grants as they are then, and the session is
//! checked as the API checks it (a changed password, a disabled user, a revoked or expired
//! machine token end it at once).
//!
//! A pull credential (`capstan-pull.<id>` and its `capstan_pull_…` secret, [`crate::pulls`])
//! opens no session: its secret is answered as the bearer, which `/v2` recognises by its prefix
//! and allows only to pull its one repository, until the credential expires or is revoked.

use crate::Registry;
use crate::errors::OciError;
use crate::pulls;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use capstan_auth::attempts;
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_store::Store;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;

/// The prefix every machine token carries (`capstan_auth::new_machine_token`).
const MACHINE_TOKEN_PREFIX: &str = "capstan_mt_";
/// Longest username or password read from a Basic header.
const MAX_CREDENTIAL: usize = 1024;

fn basic(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") || encoded.len() > 4 * MAX_CREDENTIAL {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let (user, password) = String::from_utf8(decoded).ok()?.split_once(':').map(|(u, p)| (u.to_string(), p.to_string()))?;
    (!user.is_empty() && !password.is_empty()).then_some((user, password))
}

/// `GET /v2/token`.
pub async fn token(State(registry): State<Arc<Registry>>, request: Request) -> Response {
    let source = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let Some((username, password)) = basic(request.headers()) else {
        let mut e = OciError::unauthorized(crate::routes::challenge(&registry, None));
        e.reason = "registry-credentials-required".into();
        e.message = "log in with a username and a password or machine token".into();
        return e.into_response();
    };
    if username.starts_with(pulls::USERNAME_PREFIX) && pulls::is_pull_secret(&password) {
        return match pull_token(&registry.storage.store, &username, &password, source).await {
            Ok(body) => axum::Json(body).into_response(),
            Err(refusal) => refused(&registry, refusal),
        };
    }
    let opened = if password.starts_with(MACHINE_TOKEN_PREFIX) {
        registry.auth.exchange_token(&password, source).await.and_then(|answer| {
            // the name must be the token's user: a token is never a way to learn whose it is
            if answer.username == username { Ok(answer) } else { Err(capstan_auth::denied()) }
        })
    } else {
        registry.auth.login(&username, &password, source).await
    };
    match opened {
        Ok(answer) => {
            tracing::info!(user = %answer.username, "registry token issued");
            axum::Json(token_body(&answer.token, answer.expires_at, now_ms())).into_response()
        }
        Err(refusal) => refused(&registry, refusal),
    }
}

/// The token flow's answer: `token` (and `access_token`, its OAuth name) valid until `expires_at`.
/// Both moments are milliseconds; the answer counts `expires_in` in seconds, as the token
/// specification says.
fn token_body(token: &str, expires_at: u64, now: u64) -> Value {
    let issued_at = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(now)).to_string();
    json!({
        "token": token,
        "access_token": token,
        "expires_in": expires_at.saturating_sub(now) / 1000,
        "issued_at": issued_at,
    })
}

/// A refusal as the token flow answers it: every authentication failure the one `401`.
fn refused(registry: &Registry, refusal: Refusal) -> Response {
    if refusal.is("unauthenticated") {
        let mut e = OciError::unauthorized(crate::routes::challenge(registry, None));
        e.message = "the username, password or token was not accepted".into();
        e.into_response()
    } else {
        OciError::from(refusal).into_response()
    }
}

/// A pull credential's username and secret to the token answer, whose bearer is the secret
/// itself. Counted against the client's limit like a machine token's exchange (a success takes
/// it back); every failure to verify is the uniform denial.
pub(crate) async fn pull_token(store: &Store, username: &str, password: &str, source: Option<std::net::IpAddr>) -> Result<Value> {
    let keys: Vec<attempts::Keyed> = source.map(|client| (attempts::client_key(client), attempts::PER_CLIENT)).into_iter().collect();
    attempts::begin(store, &keys).await?;
    let take_back = || async {
        if let Err(e) = attempts::take_back(store, &keys).await {
            tracing::warn!(code = %e.code, "a pull token attempt's count was not taken back: {}", e.message);
        }
    };
    let now = now_ms();
    match pulls::exchange(store, username, password, now).await {
        Ok(grant) => {
            take_back().await;
            tracing::info!(credential = %grant.credential_id, repository = %grant.repository, "registry pull token issued");
            Ok(token_body(password, grant.expires_at, now))
        }
        Err(refusal) if refusal.is("unauthenticated") => {
            tracing::info!("registry pull token denied");
            Err(refusal)
        }
        // never checked: it does not count as a failure
        Err(refusal) => {
            take_back().await;
            Err(refusal)
        }
    }
}
