//! The headers every HTML page Capstan serves carries — the dashboard's pages and the jump
//! landing page alike, from this one list: a strict Content-Security-Policy (no inline script or
//! style, nothing loaded from elsewhere, no framing, forms only to this origin), no MIME
//! sniffing, the referrer kept to this origin, and no caching unless the page says otherwise.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

/// The policy on every page.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'";

/// Each header every page carries, with its value.
pub const HEADERS: [(HeaderName, &str); 3] = [
    (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "same-origin"),
];

/// Set [`HEADERS`] on a page's answer; a page is never cached unless it said how it may be.
pub fn apply(headers: &mut HeaderMap) {
    for (name, value) in HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
}
