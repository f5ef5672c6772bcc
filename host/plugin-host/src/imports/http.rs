//! `http`: outbound requests to the origins the grant names (`http:<origin>`), or to those a
//! granted setting lists right now (`http-setting:<key>`). No redirect is followed; bodies are
//! bounded; failures are named (`http-timeout`, `http-tls-failed`, `http-failed`).
//!
//! A granted origin is a name, and a name can point anywhere: so every address a request would
//! connect to is checked when it is resolved, and the connection goes to exactly the addresses
//! checked (no second lookup to rebind). Loopback, link-local (which holds the clouds'
//! metadata services), other metadata addresses, unspecified, multicast and broadcast are
//! refused `http-address-refused` unless the operator allows them
//! (`CAPSTAN_PLUGIN_HTTP_ALLOW`). A `Host` header the plugin sets is dropped: the URL says
//! where a request goes. No proxy from the environment is used.

use super::{CallData, RetryableWit, Services, WitResult, refusal, to_wit};
use crate::manifest::Capability;
use crate::platform::Platform;
use crate::runtime::capstan::plugin::{http, types};
use capstan_core::causes::{find_cause, tls_cause};
use capstan_core::net::{IpNet, refused_range};
use serde_json::json;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Largest HTTP response body a plugin receives.
const MAX_HTTP_BODY: usize = 16 << 20;

/// Plugins' outbound HTTP: the client, and the networks the operator lets plugins reach
/// despite the guard.
#[derive(Clone)]
pub struct PluginHttp {
    client: reqwest::Client,
    allowed: Arc<Vec<IpNet>>,
    /// The extra roots as PEM, for the S3 client of `transfers.replicate`.
    extra_roots_pem: Option<Arc<Vec<u8>>>,
}

impl PluginHttp {
    /// No redirects followed, no proxy, TLS verified against the platform's roots and
    /// `extra_roots` (`CAPSTAN_PLUGIN_HTTP_CA_FILE`, for a private CA), every resolved address
    /// checked by an [`AddressGuard`] that lets `allowed` through (`CAPSTAN_PLUGIN_HTTP_ALLOW`).
    pub fn new(extra_roots: &[reqwest::Certificate], allowed: &[IpNet]) -> reqwest::Result<PluginHttp> {
        let allowed = Arc::new(allowed.to_vec());
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(AddressGuard { allowed: allowed.clone() }))
            .user_agent(concat!("capstan/", env!("CARGO_PKG_VERSION")))
            .tls_certs_merge(extra_roots.iter().cloned())
            .build()?;
        Ok(PluginHttp { client, allowed, extra_roots_pem: None })
    }

    /// The same extra roots as PEM (the file `CAPSTAN_PLUGIN_HTTP_CA_FILE` names, already
    /// checked), so the S3 client of `transfers.replicate` trusts them too.
    pub fn with_extra_roots_pem(mut self, pem: Option<Vec<u8>>) -> Self {
        self.extra_roots_pem = pem.map(Arc::new);
        self
    }
}

/// The resolver of plugins' outbound HTTP: the system's lookup, then every address checked.
/// Reqwest connects to the addresses answered here, so what was checked is what is dialled.
struct AddressGuard {
    allowed: Arc<Vec<IpNet>>,
}

/// An address a plugin may not reach, found while resolving (or written in the URL).
#[derive(Debug)]
struct AddressRefused {
    range: &'static str,
}

impl std::fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the name resolves to a {} address, which plugins may not reach", self.range)
    }
}

impl std::error::Error for AddressRefused {}

/// `Err` naming the range when `ip` is refused and not in `allowed`.
fn check_address(ip: IpAddr, allowed: &[IpNet]) -> std::result::Result<(), AddressRefused> {
    match refused_range(ip) {
        Some(range) if !allowed.iter().any(|net| net.contains(&ip)) => Err(AddressRefused { range }),
        _ => Ok(()),
    }
}

impl reqwest::dns::Resolve for AddressGuard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allowed = self.allowed.clone();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            // one refused address refuses the name: a name that mixes public and internal
            // addresses is a rebinding attempt as often as not
            for addr in &found {
                check_address(addr.ip(), &allowed)?;
            }
            Ok(Box::new(found.into_iter()) as reqwest::dns::Addrs)
        })
    }
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
    http: PluginHttp,
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
            http: services.http.clone(),
            origins: Arc::new(origins),
            settings: Arc::new(settings),
            platform: services.platform.clone(),
        })
    }

    /// Whether `origin` is granted by name, or listed now by a granted setting (for one of the
    /// plugin's own settings left unset, by its declared default).
    async fn allows(&self, origin: &str, plugin: &str, declared: &[super::DeclaredSetting]) -> WitResult<bool> {
        if self.origins.contains(origin) {
            return Ok(true);
        }
        for key in self.settings.iter() {
            let default = || {
                let own = key.strip_prefix(plugin).and_then(|k| k.strip_prefix('.'))?;
                declared.iter().find(|d| d.key == own)?.default.as_ref().map(capstan_core::net::urls_in)
            };
            let listed = self.platform.setting_urls(key).await.map_err(to_wit)?.or_else(default).unwrap_or_default();
            if listed.iter().filter_map(|u| reqwest::Url::parse(u).ok()).any(|u| origin_of(&u).as_deref() == Some(origin)) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl CallData {
    /// The outbound provider for `url` and its origin, when the grant allows that origin (by
    /// name, or listed now by a granted setting; else denied as `http:<origin>`) and an
    /// address written in the URL is one plugins may reach (a name is checked as it resolves).
    pub(super) async fn outbound_to(&mut self, url: &reqwest::Url) -> WitResult<(Outbound, String)> {
        let origin = origin_of(url).ok_or_else(|| refusal("invalid-request", "the URL has no host".into(), json!({})))?;
        let capability = Capability::Http(origin.clone());
        let outbound = self.granted(&self.grant.http, capability.clone())?;
        let declared = self.grant.settings.declared.get().map(Vec::as_slice).unwrap_or_default();
        if !outbound.allows(&origin, self.plugin(), declared).await? {
            return Err(self.denied(&capability));
        }
        let literal = url.host_str().and_then(|h| h.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok());
        if let Some(ip) = literal {
            check_address(ip, &outbound.http.allowed).map_err(|refused| address_refusal(&refused, &origin))?;
        }
        Ok((outbound, origin))
    }
}

impl Outbound {
    /// How another client reaches out as this one does: the address check (for a client that
    /// resolves names itself) and the extra roots as PEM.
    #[cfg(feature = "s3")]
    pub(super) fn reach(&self) -> crate::blobs::s3::Reach {
        let allowed = self.http.allowed.clone();
        crate::blobs::s3::Reach {
            check: Arc::new(move |ip| check_address(ip, &allowed).map_err(|refused| refused.range.to_string())),
            extra_roots_pem: self.http.extra_roots_pem.clone(),
        }
    }
}

impl http::Host for CallData {
    async fn fetch(&mut self, request: http::Request) -> WitResult<http::Response> {
        let url =
            reqwest::Url::parse(&request.url).map_err(|e| refusal("invalid-request", format!("not an absolute URL: {e}"), json!({})))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refusal("invalid-request", "only http and https URLs can be fetched".into(), json!({})));
        }
        let (outbound, origin) = self.outbound_to(&url).await?;
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .ok()
            .filter(|m| ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"].contains(&m.as_str()))
            .ok_or_else(|| refusal("invalid-request", format!("HTTP method {:?} is not allowed", request.method), json!({})))?;
        if !matches!(method.as_str(), "GET" | "HEAD") {
            self.changing()?;
        }
        let timeout = std::time::Duration::from_millis(request.timeout_ms.unwrap_or(5_000).min(30_000) as u64);
        let mut builder = outbound.http.client.request(method, url).timeout(timeout);
        for (name, value) in request.headers.iter().filter(|(name, _)| !name.eq_ignore_ascii_case("host")) {
            builder = builder.header(name, value);
        }
        if let Some(body) = request.body {
            self.budget.fits(body.len(), "the request body")?;
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
            self.budget.fits(body.len() + chunk.len(), "the response body")?;
            body.extend_from_slice(&chunk);
        }
        Ok(http::Response { status, headers, body })
    }
}

/// `http-address-refused`: the origin is (or resolves to) an address plugins may not reach.
fn address_refusal(refused: &AddressRefused, origin: &str) -> types::Refusal {
    refusal(
        "http-address-refused",
        format!("fetching {origin} refused: {refused} (an operator allows a network with CAPSTAN_PLUGIN_HTTP_ALLOW)"),
        json!({ "origin": origin, "range": refused.range }),
    )
}

/// Why a request was not answered, as the plugin is told: `http-timeout`, `http-tls-failed`
/// (the TLS cause named in `data.cause`, e.g. `certificate-unknown-issuer`) or `http-failed`.
fn send_refusal(e: &reqwest::Error, origin: &str) -> types::Refusal {
    if let Some(refused) = find_cause::<AddressRefused>(e) {
        return address_refusal(refused, origin);
    }
    if e.is_timeout() {
        return refusal("http-timeout", format!("fetching {origin} failed: {}", without_url(e)), json!({ "origin": origin }))
            .retryable_wit();
    }
    if let Some(tls) = find_cause::<rustls::Error>(e) {
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
        let found = find_cause::<rustls::Error>(&wrapped).expect("the rustls error inside the io::Error");
        assert_eq!(tls_cause(found), "certificate-unknown-issuer");
        let plain = Outer(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"));
        assert!(find_cause::<rustls::Error>(&plain).is_none());
        assert_eq!(tls_cause(&rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)), "certificate-expired");
        assert_eq!(tls_cause(&rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)), "certificate-name-mismatch");
        assert_eq!(tls_cause(&rustls::Error::DecryptError), "handshake-failed");
    }

    #[test]
    fn internal_ranges_are_refused_unless_allowed() {
        // the ranges themselves: capstan_core::net's tests
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let loopback: IpNet = "127.0.0.0/8".parse().unwrap();
        assert!(check_address(ip("127.0.0.1"), &[loopback]).is_ok(), "an allowed network is let through");
        assert_eq!(check_address(ip("::1"), &[loopback]).unwrap_err().range, "loopback", "only what is allowed");
        assert!(check_address(ip("10.1.2.3"), &[]).is_ok());
    }

    #[tokio::test]
    async fn a_name_resolving_to_a_refused_address_is_refused_before_connecting() {
        let http = PluginHttp::new(&[], &[]).unwrap();
        let error = http.client.get("http://localhost:9/").send().await.unwrap_err();
        let refused = find_cause::<AddressRefused>(&error).expect("the guard's refusal in the chain");
        assert_eq!(refused.range, "loopback");
        assert_eq!(send_refusal(&error, "http://localhost:9").code, "http-address-refused");
    }

    #[test]
    fn origins_drop_default_ports_and_paths() {
        let origin = |u: &str| origin_of(&reqwest::Url::parse(u).unwrap()).unwrap();
        assert_eq!(origin("https://Catalog.Example.com/path?q=1"), "https://catalog.example.com");
        assert_eq!(origin("https://example.com:443/"), "https://example.com");
        assert_eq!(origin("http://127.0.0.1:8080/x"), "http://127.0.0.1:8080");
    }
}
