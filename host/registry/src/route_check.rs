//! The HTTPS check a deployment's route passes before it is declared promoted
//! (`deployments.promoteRoute`): the hostname resolved to public addresses only (or to the
//! address an operator pinned, `CAPSTAN_ROUTE_CHECK_RESOLVE`), one fresh TLS connection with
//! SNI and certificate validation (the platform's roots and `CAPSTAN_ROUTE_CHECK_CA_FILE`),
//! no resumed session, no redirect followed, and the readiness path answering the status
//! stated. The evidence keeps the subject alternative names of the certificate presented.
//!
//! A failure names its stage (`resolve`, `connect`, `tls`, `http`) and a stable code; every
//! one is worth retrying once the target is fixed.

use capstan_core::causes::{find_cause, tls_cause};
use capstan_core::clock::now_ms;
use capstan_core::net::non_public_range;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// How long one route's check may take, resolution included.
pub const CHECK_BUDGET: Duration = Duration::from_secs(10);

/// A route a deployment publishes: a hostname and how its readiness is judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Route {
    /// The hostname (no wildcard): the service answers on it once the route is promoted.
    pub hostname: String,
    /// The path whose answer says the release is ready (default `/`).
    #[serde(default = "root_path")]
    pub readiness_path: String,
    /// The status that path answers when ready, 200–299 (default 200).
    #[serde(default = "ok_status")]
    pub expected_status: u16,
}

fn root_path() -> String {
    "/".into()
}

fn ok_status() -> u16 {
    200
}

/// Where a check stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Finding the addresses to dial.
    Resolve,
    /// Opening the TCP connection.
    Connect,
    /// The TLS handshake and the certificate.
    Tls,
    /// The readiness request's answer.
    Http,
}

/// What a route's successful check saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    /// The hostname checked (the SNI name and the `Host`).
    pub hostname: String,
    /// The addresses dialled.
    pub addresses: Vec<String>,
    /// The status the readiness path answered.
    pub status: u16,
    /// The subject alternative names of the certificate presented.
    pub subject_alt_names: Vec<String>,
    /// When (milliseconds since the epoch).
    pub checked_at: u64,
}

/// Why a route's check failed: structured, so a deployer's tooling acts on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Diagnostic {
    /// The hostname checked.
    pub hostname: String,
    /// Where it stopped.
    pub stage: Stage,
    /// A stable kebab-case code (`route-address-not-public`, `route-redirect-refused`, …).
    pub code: String,
    /// What a person reads.
    pub message: String,
    /// The status answered, at the http stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Always true: the check is worth running again once the target is fixed.
    pub retryable: bool,
    /// When (milliseconds since the epoch).
    pub checked_at: u64,
}

fn failed(route: &Route, stage: Stage, code: &str, message: impl Into<String>) -> Diagnostic {
    Diagnostic {
        hostname: route.hostname.clone(),
        stage,
        code: code.into(),
        message: message.into(),
        status: None,
        retryable: true,
        checked_at: now_ms(),
    }
}

/// How routes are checked on this host.
#[derive(Debug, Clone, Default)]
pub struct RouteCheck {
    /// Roots trusted besides the platform's (`CAPSTAN_ROUTE_CHECK_CA_FILE`).
    pub extra_roots: Vec<reqwest::Certificate>,
    /// Hostnames an operator pinned to an address (`CAPSTAN_ROUTE_CHECK_RESOLVE`): dialled
    /// there, whatever range it is in.
    pub pinned: BTreeMap<String, SocketAddr>,
}

/// Parse `CAPSTAN_ROUTE_CHECK_RESOLVE`: `host=address:port` entries, comma-separated.
pub fn parse_pins(text: &str) -> Result<BTreeMap<String, SocketAddr>, String> {
    let mut pins = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let shown = || entry.chars().take(80).collect::<String>();
        let (host, address) = entry.split_once('=').ok_or_else(|| format!("{:?} is not host=address:port", shown()))?;
        let host = host.trim().to_ascii_lowercase();
        if capstan_field_rules::validate::domain("hostname", &host).is_err() || host.starts_with("*.") {
            return Err(format!("{:?} does not name a hostname", shown()));
        }
        let address = address.trim().parse::<SocketAddr>().map_err(|_| format!("{:?} does not end in address:port", shown()))?;
        pins.insert(host, address);
    }
    Ok(pins)
}

impl RouteCheck {
    /// Check one route now.
    pub async fn check(&self, route: &Route) -> Result<Evidence, Diagnostic> {
        match tokio::time::timeout(CHECK_BUDGET, self.check_within(route)).await {
            Ok(answer) => answer,
            Err(_) => Err(failed(route, Stage::Connect, "route-check-timeout", "the route's check took longer than 10 seconds")),
        }
    }

    async fn addresses(&self, route: &Route) -> Result<Vec<SocketAddr>, Diagnostic> {
        if let Some(pinned) = self.pinned.get(&route.hostname) {
            return Ok(vec![*pinned]);
        }
        let found: Vec<SocketAddr> = tokio::net::lookup_host((route.hostname.as_str(), 443))
            .await
            .map_err(|e| failed(route, Stage::Resolve, "route-resolve-failed", format!("{} does not resolve: {e}", route.hostname)))?
            .collect();
        if found.is_empty() {
            return Err(failed(route, Stage::Resolve, "route-resolve-failed", format!("{} resolves to no address", route.hostname)));
        }
        // one internal address refuses the name: the check vouches for what the public reaches
        if let Some((address, range)) = found.iter().find_map(|a| non_public_range(a.ip()).map(|r| (a, r))) {
            return Err(failed(
                route,
                Stage::Resolve,
                "route-address-not-public",
                format!("{} resolves to {} ({range}): a route is checked at public addresses only", route.hostname, address.ip()),
            ));
        }
        Ok(found)
    }

    async fn check_within(&self, route: &Route) -> Result<Evidence, Diagnostic> {
        let addresses = self.addresses(route).await?;
        // a client per check: its own connection and no TLS session to resume
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .https_only(true)
            .tls_info(true)
            .pool_max_idle_per_host(0)
            .resolve_to_addrs(&route.hostname, &addresses)
            .tls_certs_merge(self.extra_roots.iter().cloned())
            .user_agent(concat!("capstan-route-check/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| failed(route, Stage::Connect, "route-connect-failed", format!("no HTTPS client: {e}")))?;
        let url = format!("https://{}{}", route.hostname, route.readiness_path);
        let response = client.get(&url).send().await.map_err(|e| transport_failure(route, &e))?;
        let certificate =
            response.extensions().get::<reqwest::tls::TlsInfo>().and_then(|info| info.peer_certificate().map(<[u8]>::to_vec)).ok_or_else(
                || failed(route, Stage::Tls, "tls-peer-certificate-unavailable", "the connection exposed no peer certificate"),
            )?;
        let names = subject_alt_names(&certificate);
        if names.is_empty() {
            return Err(failed(
                route,
                Stage::Tls,
                "tls-subject-alt-names-missing",
                "the certificate presented has no subject alternative names",
            ));
        }
        let status = response.status().as_u16();
        if response.status().is_redirection() {
            let mut diagnostic = failed(
                route,
                Stage::Http,
                "route-redirect-refused",
                format!("{} answered a redirect ({status}): the readiness path must answer itself", route.readiness_path),
            );
            diagnostic.status = Some(status);
            return Err(diagnostic);
        }
        if status != route.expected_status {
            let mut diagnostic = failed(
                route,
                Stage::Http,
                "route-status-unexpected",
                format!("{} answered {status}, not {}", route.readiness_path, route.expected_status),
            );
            diagnostic.status = Some(status);
            return Err(diagnostic);
        }
        Ok(Evidence {
            hostname: route.hostname.clone(),
            addresses: addresses.iter().map(ToString::to_string).collect(),
            status,
            subject_alt_names: names,
            checked_at: now_ms(),
        })
    }
}

/// The stage and code of a request that got no answer.
fn transport_failure(route: &Route, e: &reqwest::Error) -> Diagnostic {
    if let Some(tls) = find_cause::<rustls::Error>(e) {
        let cause = tls_cause(tls);
        let hint = if cause == "certificate-unknown-issuer" { " (a private CA is trusted with CAPSTAN_ROUTE_CHECK_CA_FILE)" } else { "" };
        return failed(route, Stage::Tls, "route-tls-failed", format!("TLS {cause}: {tls}{hint}"));
    }
    // the URL is the route's own, no secret in it; the chain says what failed
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        text = format!("{text}: {inner}");
        source = inner.source();
    }
    let code = if e.is_timeout() { "route-check-timeout" } else { "route-connect-failed" };
    failed(route, Stage::Connect, code, capstan_core::text::truncate(&text, 400))
}

/// The DNS names and addresses a DER certificate's subject alternative names list.
fn subject_alt_names(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, certificate)) = x509_parser::parse_x509_certificate(der) else { return Vec::new() };
    let Ok(Some(extension)) = certificate.subject_alternative_name() else { return Vec::new() };
    extension
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => Some(dns.to_string()),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*bytes).ok()?).to_string()),
                16 => Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*bytes).ok()?).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_parse_and_a_bad_entry_is_named() {
        let pins = parse_pins(" app.example.com=127.0.0.1:8443, Other.example.com=[::1]:443 ,").unwrap();
        assert_eq!(pins["app.example.com"], "127.0.0.1:8443".parse().unwrap());
        assert_eq!(pins["other.example.com"], "[::1]:443".parse().unwrap());
        assert!(parse_pins("").unwrap().is_empty());
        assert!(parse_pins("app.example.com").unwrap_err().contains("host=address:port"));
        assert!(parse_pins("app.example.com=127.0.0.1").unwrap_err().contains("address:port"));
        assert!(parse_pins("*.example.com=127.0.0.1:1").unwrap_err().contains("hostname"));
    }

    #[test]
    fn a_certificates_names_are_read() {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["app.example.com".to_string(), "127.0.0.1".to_string()]).unwrap();
        let certificate = params.self_signed(&key).unwrap();
        assert_eq!(subject_alt_names(certificate.der()), ["app.example.com", "127.0.0.1"]);
        let bare = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap().self_signed(&key).unwrap();
        assert!(subject_alt_names(bare.der()).is_empty());
        assert!(subject_alt_names(b"not a certificate").is_empty());
    }

    #[tokio::test]
    async fn a_name_resolving_to_an_internal_address_is_refused_before_dialling() {
        let route = Route { hostname: "localhost".into(), readiness_path: "/".into(), expected_status: 200 };
        let diagnostic = RouteCheck::default().check(&route).await.unwrap_err();
        assert_eq!((diagnostic.stage, diagnostic.code.as_str()), (Stage::Resolve, "route-address-not-public"), "{diagnostic:?}");
        assert!(diagnostic.retryable);
    }
}
