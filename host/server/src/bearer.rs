//! The bearer token a request carries in `Authorization: Bearer <token>`: what the API, the
//! socket's upgrade, `/mcp`, `/metrics` and the agent's wire each read before judging it.

use axum::http::{HeaderMap, header};

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}
