//! `GET /v2/token`: the Docker token flow. A person's username and password, or a machine
//! user's (a deployer's) username and token, in HTTP Basic authentication, open a Capstan
//! session whose JWT is the registry bearer. Nothing is granted by the token itself: every
//! request is judged from the caller's roles and grants as they are then, and the session is
//! checked as the API checks it (a changed password, a disabled user, a revoked or expired
//! machine token end it at once).

use crate::Registry;
use crate::errors::OciError;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use capstan_core::clock::now_secs;
use serde_json::json;
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
            let now = now_secs();
            let issued_at = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(now)).to_string();
            let body = json!({
                "token": answer.token,
                "access_token": answer.token,
                "expires_in": answer.expires_at.saturating_sub(now),
                "issued_at": issued_at,
            });
            tracing::info!(user = %answer.username, "registry token issued");
            axum::Json(body).into_response()
        }
        Err(refusal) if refusal.is("unauthenticated") => {
            let mut e = OciError::unauthorized(crate::routes::challenge(&registry, None));
            e.message = "the username, password or token was not accepted".into();
            e.into_response()
        }
        Err(refusal) => OciError::from(refusal).into_response(),
    }
}
