//! The HTTP client the OpenID Connect exchanges go through: the host's reqwest, never following
//! a redirect (an issuer's endpoint that redirects is an answer, not a hop to take), with short
//! timeouts and a bound on what an answer may hold.

use openidconnect::{HttpRequest, HttpResponse};
use std::time::Duration;

/// The most an IdP's answer may hold (discovery, JWKS, tokens, userinfo, introspection).
const MAX_ANSWER: usize = 1 << 20;

/// Why an exchange with the IdP failed (never a token or a secret).
#[derive(Debug)]
pub struct Failure(pub String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

/// The client: no redirects, 5 s to connect, 10 s per exchange.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .build()
        .expect("the HTTP client's settings are valid")
}

/// Send one request of the `openidconnect` crate through `client`.
pub async fn send(client: reqwest::Client, request: HttpRequest) -> Result<HttpResponse, Failure> {
    let (parts, body) = request.into_parts();
    let mut builder = client.request(parts.method, parts.uri.to_string()).body(body);
    for (name, value) in &parts.headers {
        builder = builder.header(name, value);
    }
    let mut response = builder.send().await.map_err(|e| Failure(describe(&e)))?;
    let mut answer = openidconnect::http::Response::builder().status(response.status());
    for (name, value) in response.headers() {
        answer = answer.header(name, value);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| Failure(describe(&e)))? {
        if bytes.len() + chunk.len() > MAX_ANSWER {
            return Err(Failure(format!("the identity provider answered more than {MAX_ANSWER} bytes")));
        }
        bytes.extend_from_slice(&chunk);
    }
    answer.body(bytes).map_err(|e| Failure(e.to_string()))
}

/// What went wrong, without the URL's query (a code may sit there).
pub fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    match e.url() {
        Some(url) => format!("the request to {}{} {kind}", url.origin().ascii_serialization(), url.path()),
        None => format!("a request to the identity provider {kind}"),
    }
}
