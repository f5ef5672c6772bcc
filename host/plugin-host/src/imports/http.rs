//! `http`: outbound requests to the origins the grant names (`http:<origin>`), or to those a
//! granted setting lists right now (`http-setting:<key>`). No redirect is followed; bodies are
//! bounded; failures are named (`http-timeout`, `http-tls-failed`, `http-failed`).

use super::{CallData, RetryableWit, Services, WitResult, refusal, to_wit};
use crate::manifest::Capability;
use crate::platform::Platform;
use crate::runtime::capstan::plugin::{http, types};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Largest HTTP response body a plugin receives.
const MAX_HTTP_BODY: usize = 16 << 20;

/// The client plugins' outbound HTTP goes through: no redirects followed, TLS verified against
/// the platform's roots and `extra_roots` (`CAPSTAN_PLUGIN_HTTP_CA_FILE`, for a private CA).
pub fn plugin_http_client(extra_roots: &[reqwest::Certificate]) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("capstan/", env!("CARGO_PKG_VERSION")))
        .tls_certs_merge(extra_roots.iter().cloned())
        .build()
}

/// `scheme://host[:port]` of a URL, the port only when it is not the scheme's default.
pub fn origin_of(url: &reqwest::Url) -> Option<String> {
    let host = url.host_str()?;
    Some(match url.port() {
        Some(port) => format!("{}://{}:{port}", url.scheme(), host.to_ascii_lowercase()),
        None => format!("{}://{}", url.scheme(), host.to_ascii_lowercase()),
    })
}

/// The `http` provider: the origins granted by name and the settings whose URLs are granted.
#[derive(Clone)]
pub(super) struct Outbound {
    client: reqwest::Client,
    origins: Arc<BTreeSet<String>>,
    settings: Arc<Vec<String>>,
    platform: Arc<dyn Platform>,
}

impl Outbound {
    /// Present when the grant names an origin or a setting.
    pub(super) fn new(services: &Arc<Services>, grants: &BTreeSet<Capability>) -> Option<Self> {
        let mut origins = BTreeSet::new();
        let mut settings = Vec::new();
        for grant in grants {
            match grant {
                Capability::Http(origin) => drop(origins.insert(origin.clone())),
                Capability::HttpSetting(key) => settings.push(key.clone()),
                _ => {}
            }
        }
        (!origins.is_empty() || !settings.is_empty()).then(|| Outbound {
            client: services.http.clone(),
            origins: Arc::new(origins),
            settings: Arc::new(settings),
            platform: services.platform.clone(),
        })
    }

    /// Whether `origin` is granted by name, or listed now by a granted setting.
    async fn allows(&self, origin: &str) -> WitResult<bool> {
        if self.origins.contains(origin) {
            return Ok(true);
        }
        for key in self.settings.iter() {
            let listed = self.platform.setting_urls(key).await.map_err(to_wit)?;
            if listed.iter().filter_map(|u| reqwest::Url::parse(u).ok()).any(|u| origin_of(&u).as_deref() == Some(origin)) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl http::Host for CallData {
    async fn fetch(&mut self, request: http::Request) -> WitResult<http::Response> {
        let url =
            reqwest::Url::parse(&request.url).map_err(|e| refusal("invalid-request", format!("not an absolute URL: {e}"), json!({})))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refusal("invalid-request", "only http and https URLs can be fetched".into(), json!({})));
        }
        let origin = origin_of(&url).ok_or_else(|| refusal("invalid-request", "the URL has no host".into(), json!({})))?;
        // granted by name, or listed now by a granted setting; else denied as `http:<origin>`
        let capability = Capability::Http(origin.clone());
        let outbound = self.granted(&self.grant.http, capability.clone())?;
        if !outbound.allows(&origin).await? {
            return Err(self.denied(&capability));
        }
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .ok()
            .filter(|m| ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"].contains(&m.as_str()))
            .ok_or_else(|| refusal("invalid-request", format!("HTTP method {:?} is not allowed", request.method), json!({})))?;
        let timeout = std::time::Duration::from_millis(request.timeout_ms.unwrap_or(5_000).min(30_000) as u64);
        let mut builder = outbound.client.request(method, url).timeout(timeout);
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        if let Some(body) = request.body {
            builder = builder.body(body);
        }
        let response = builder.send().await.map_err(|e| send_refusal(&e, &origin))?;
        let status = response.status().as_u16();
        let headers =
            response.headers().iter().filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string()))).collect();
        let mut body = Vec::new();
        let mut stream = response;
        while let Some(chunk) = stream.chunk().await.map_err(|e| {
            refusal("http-failed", format!("reading the response from {origin} failed: {}", without_url(&e)), json!({})).retryable_wit()
        })? {
            if body.len() + chunk.len() > MAX_HTTP_BODY {
                return Err(refusal("http-body-too-large", format!("the response is larger than {MAX_HTTP_BODY} bytes"), json!({})));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(http::Response { status, headers, body })
    }
}

/// Why a request was not answered, as the plugin is told: `http-timeout`, `http-tls-failed`
/// (the TLS cause named in `data.cause`, e.g. `certificate-unknown-issuer`) or `http-failed`.
fn send_refusal(e: &reqwest::Error, origin: &str) -> types::Refusal {
    if e.is_timeout() {
        return refusal("http-timeout", format!("fetching {origin} failed: {}", without_url(e)), json!({ "origin": origin }))
            .retryable_wit();
    }
    if let Some(tls) = tls_error(e) {
        let cause = tls_cause(tls);
        let hint = if cause == "certificate-unknown-issuer" {
            "; its issuer is not among the roots trusted here (a private CA is added with CAPSTAN_PLUGIN_HTTP_CA_FILE)"
        } else {
            ""
        };
        let refused = refusal(
            "http-tls-failed",
            format!("fetching {origin} failed: TLS {cause}: {tls}{hint}"),
            json!({ "origin": origin, "cause": cause }),
        );
        // a certificate this host refuses stays refused until someone changes it or the trust
        return if cause.starts_with("certificate-") { refused } else { refused.retryable_wit() };
    }
    refusal("http-failed", format!("fetching {origin} failed: {}", without_url(e)), json!({ "origin": origin })).retryable_wit()
}

/// The TLS error somewhere in `e`'s chain of causes. (An `io::Error` wrapping one hides it from
/// `source()`, so it is opened by hand.)
fn tls_error<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    let mut next = Some(e);
    for _ in 0..16 {
        let current = next?;
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = current.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
            next = Some(inner);
            continue;
        }
        next = current.source();
    }
    None
}

/// A stable kebab-case name for a TLS failure.
fn tls_cause(e: &rustls::Error) -> &'static str {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "certificate-unknown-issuer",
            C::Expired | C::ExpiredContext { .. } => "certificate-expired",
            C::NotValidYet | C::NotValidYetContext { .. } => "certificate-not-yet-valid",
            C::NotValidForName | C::NotValidForNameContext { .. } => "certificate-name-mismatch",
            C::Revoked => "certificate-revoked",
            C::BadSignature => "certificate-bad-signature",
            _ => "certificate-invalid",
        },
        rustls::Error::AlertReceived(_) => "alert-received",
        rustls::Error::NoCertificatesPresented => "certificate-missing",
        _ => "handshake-failed",
    }
}

/// A reqwest error without its URL (a query string may carry a token).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text.replace(url.as_str(), "<url>");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_are_found_behind_io_errors_and_named() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let unknown = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = Outer(std::io::Error::new(std::io::ErrorKind::InvalidData, unknown));
        let found = tls_error(&wrapped).expect("the rustls error inside the io::Error");
        assert_eq!(tls_cause(found), "certificate-unknown-issuer");
        let plain = Outer(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"));
        assert!(tls_error(&plain).is_none());
        assert_eq!(tls_cause(&rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)), "certificate-expired");
        assert_eq!(tls_cause(&rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)), "certificate-name-mismatch");
        assert_eq!(tls_cause(&rustls::Error::DecryptError), "handshake-failed");
    }

    #[test]
    fn origins_drop_default_ports_and_paths() {
        let origin = |u: &str| origin_of(&reqwest::Url::parse(u).unwrap()).unwrap();
        assert_eq!(origin("https://Catalog.Example.com/path?q=1"), "https://catalog.example.com");
        assert_eq!(origin("https://example.com:443/"), "https://example.com");
        assert_eq!(origin("http://127.0.0.1:8080/x"), "http://127.0.0.1:8080");
    }
}
