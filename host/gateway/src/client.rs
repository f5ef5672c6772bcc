//! The gateway endpoints Capstan calls (docs/gateway-protocol.md): who a token is, provisioning
//! and finalizing a client credential, domains, DNS records, certificates; and plugins' own
//! requests under the client credential ([`GatewayClient::exchange`]).
//!
//! Tokens pass through here as bearer headers marked sensitive; no error, log line or answer
//! of this module carries one.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::time::Duration;
use zeroize::Zeroizing;

/// How long one request to the gateway may take, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read from the gateway.
const MAX_ANSWER: usize = 64 * 1024;

/// What a gateway request came to when it did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// No answer: the gateway could not be reached, or timed out.
    Unreachable {
        /// Whether the request left (it may have arrived); a failed connection did not.
        sent: bool,
        /// What failed, without the URL or any header.
        reason: String,
    },
    /// `401`: the gateway does not accept the token.
    Unauthorized,
    /// Another 4xx.
    Refused {
        /// The status.
        status: u16,
        /// The gateway's error code (kebab-case, else `unnamed`).
        code: String,
    },
    /// A 5xx: the gateway is there but cannot serve now.
    Unavailable {
        /// The status.
        status: u16,
    },
    /// A 2xx whose body is not what the protocol says.
    Invalid(String),
    /// An answer longer than the request allowed (a plugin's request, [`GatewayClient::exchange`]).
    TooLarge {
        /// The most that was to be read, in bytes.
        limit: usize,
    },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unreachable { reason, .. } => write!(f, "the gateway could not be reached: {reason}"),
            Failure::Unauthorized => write!(f, "the gateway does not accept the token"),
            Failure::Refused { status, code } => write!(f, "the gateway refused with {status} {code}"),
            Failure::Unavailable { status } => write!(f, "the gateway answered {status}"),
            Failure::Invalid(what) => write!(f, "the gateway's answer is not usable: {what}"),
            Failure::TooLarge { limit } => write!(f, "the gateway's answer is longer than {limit} bytes"),
        }
    }
}

/// Who a token is at the gateway (`GET /v1/whoami`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WhoAmI {
    /// `admin`, or `client` for a client credential.
    pub role: String,
}

/// The policy a client credential is provisioned under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// What the credential may do (docs/gateway-protocol.md lists the scopes).
    pub scopes: Vec<String>,
    /// The addresses it may publish DNS records for (IP networks).
    pub allowed_dns_record_addresses: Vec<String>,
}

/// A credential the gateway issued, before it is finalized.
pub struct Issued {
    /// The gateway's id of the credential.
    pub credential_id: String,
    /// The bearer token; shown once by the gateway, wiped when dropped.
    pub token: Zeroizing<String>,
}

/// A certificate the gateway holds for one name, with its private key (a secret: wiped when
/// dropped, never logged).
pub struct Certificate {
    /// The certificate chain, PEM, the name's own first.
    pub certificate: String,
    /// Its private key, PEM.
    pub private_key: Zeroizing<String>,
    /// When the certificate stops being valid, milliseconds since the epoch.
    pub not_after: u64,
}

/// A plugin's request of the gateway, as [`GatewayClient::exchange`] sends it.
#[derive(Debug, Clone, Copy)]
pub struct Exchange<'a> {
    /// `GET`, `PUT`, `POST` or `DELETE`.
    pub method: &'a str,
    /// The path (and query) at the gateway's origin.
    pub path: &'a str,
    /// The JSON body, if any.
    pub body: Option<&'a Value>,
    /// How long it may take (at most the client's own timeout).
    pub timeout: Duration,
    /// The most of the answer's body read, in bytes.
    pub max_answer: usize,
}

/// Whether `token` is what a bearer token may be: 1–1024 bytes of visible ASCII.
pub fn is_token(token: &str) -> bool {
    (1..=1024).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_graphic())
}

/// A client of one gateway protocol, shared by every request.
#[derive(Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
}

impl Default for GatewayClient {
    fn default() -> Self {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            // a gateway answers where it is asked; a redirect would carry the bearer elsewhere
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the gateway's HTTP client builds");
        GatewayClient { http }
    }
}

impl GatewayClient {
    /// Send one request to `origin` + `path` with `token` as its bearer (marked sensitive, so no
    /// debug output shows it), within `timeout` when given (the client's own otherwise); the
    /// answer's status and head.
    async fn send(
        &self,
        method: reqwest::Method,
        origin: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response, Failure> {
        let url = format!("{}{path}", origin.trim_end_matches('/'));
        let mut bearer = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| Failure::Invalid("the token does not fit a header".into()))?;
        bearer.set_sensitive(true);
        let mut request = self.http.request(method, &url).header(reqwest::header::AUTHORIZATION, bearer);
        if let Some(body) = body {
            request = request.header(reqwest::header::CONTENT_TYPE, "application/json").body(body.to_string());
        }
        if let Some(timeout) = timeout {
            request = request.timeout(timeout.min(REQUEST_TIMEOUT));
        }
        request.send().await.map_err(|e| Failure::Unreachable {
            // a refused or failed connection means the request never left
            sent: !e.is_connect(),
            reason: without_url(&e),
        })
    }

    /// One request to `origin` + `path` with `token` as its bearer; the answer's JSON on a 2xx.
    async fn request(&self, method: reqwest::Method, origin: &str, path: &str, token: &str, body: Option<Value>) -> Result<Value, Failure> {
        let answer = self.send(method, origin, path, token, body.as_ref(), None).await?;
        let status = answer.status().as_u16();
        let bytes = match read_limited(answer, MAX_ANSWER).await {
            Err(Failure::TooLarge { .. }) => return Err(Failure::Invalid("the answer is too large".into())),
            read => read?,
        };
        match status {
            200..=299 if bytes.is_empty() => Ok(Value::Null),
            200..=299 => serde_json::from_slice(&bytes).map_err(|_| Failure::Invalid("the body is not JSON".into())),
            401 => Err(Failure::Unauthorized),
            400..=499 => {
                let code = serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
                    .filter(|c| (1..=64).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
                    .unwrap_or_else(|| "unnamed".into());
                Err(Failure::Refused { status, code })
            }
            _ => Err(Failure::Unavailable { status }),
        }
    }

    /// A plugin's request (`gateway.request`, after the plugin host checked it) at `origin` with
    /// the client's `token`. Answers whatever status the gateway gave with its body when that is
    /// JSON (`None` for an empty body or one that is not JSON), reading at most
    /// `request.max_answer` bytes of it (`Failure::TooLarge` past that). `401` is
    /// `Failure::Unauthorized`: the credential refused is not an answer.
    pub async fn exchange(&self, origin: &str, token: &str, request: &Exchange<'_>) -> Result<(u16, Option<Value>), Failure> {
        let method = match request.method {
            "GET" => reqwest::Method::GET,
            "PUT" => reqwest::Method::PUT,
            "POST" => reqwest::Method::POST,
            "DELETE" => reqwest::Method::DELETE,
            _ => return Err(Failure::Invalid("the method is not GET, PUT, POST or DELETE".into())),
        };
        let answer = self.send(method, origin, request.path, token, request.body, Some(request.timeout)).await?;
        let status = answer.status().as_u16();
        if status == 401 {
            return Err(Failure::Unauthorized);
        }
        let bytes = read_limited(answer, request.max_answer).await?;
        Ok((status, serde_json::from_slice(&bytes).ok()))
    }

    /// `GET /v1/whoami`: the role of `token`.
    pub async fn whoami(&self, origin: &str, token: &str) -> Result<WhoAmI, Failure> {
        let answer = self.request(reqwest::Method::GET, origin, "/v1/whoami", token, None).await?;
        serde_json::from_value(answer).map_err(|_| Failure::Invalid("whoami names no role".into()))
    }

    /// `POST /v1/clients/<clientId>/credentials` with an admin token: a candidate credential
    /// for `client_id` under `policy`, checked to be exactly what was asked for.
    pub async fn provision(&self, origin: &str, admin_token: &str, client_id: &str, policy: &Policy) -> Result<Issued, Failure> {
        let path = format!("/v1/clients/{client_id}/credentials");
        let answer = self.request(reqwest::Method::POST, origin, &path, admin_token, Some(json!({ "policy": policy }))).await?;
        let credential_id = answer["credentialId"].as_str().filter(|id| capstan_inventory::settings::is_identifier(id));
        let Some(credential_id) = credential_id else { return Err(Failure::Invalid("no usable credentialId".into())) };
        if answer["clientId"].as_str() != Some(client_id) {
            return Err(Failure::Invalid("the credential is another client's".into()));
        }
        if answer["state"].as_str() != Some("candidate") {
            return Err(Failure::Invalid("the credential is not a candidate".into()));
        }
        // the gateway must not widen (or narrow) what was asked for
        if serde_json::from_value::<Policy>(answer["policy"].clone()).ok().as_ref() != Some(policy) {
            return Err(Failure::Invalid("the credential's policy is not the one asked for".into()));
        }
        let token = answer["token"].as_str().filter(|t| is_token(t));
        let Some(token) = token else { return Err(Failure::Invalid("the token is not 1–1024 visible ASCII".into())) };
        Ok(Issued { credential_id: credential_id.to_string(), token: Zeroizing::new(token.to_string()) })
    }

    /// `GET /v1/domains` with the client's token: every domain the gateway makes available to
    /// the client, with whether it is verified (names that are not domain names are left out).
    pub async fn domains(&self, origin: &str, token: &str) -> Result<Vec<(String, bool)>, Failure> {
        let answer = self.request(reqwest::Method::GET, origin, "/v1/domains", token, None).await?;
        let Some(listed) = answer["domains"].as_array() else { return Err(Failure::Invalid("the answer lists no domains".into())) };
        Ok(listed
            .iter()
            .filter_map(|d| {
                let name = d["name"].as_str()?.trim_end_matches('.').to_ascii_lowercase();
                crate::domains::is_domain(&name).then(|| (name, d["verified"].as_bool().unwrap_or(false)))
            })
            .collect())
    }

    /// `PUT /v1/dns-records/<name>` with the client's token: one record of `kind` (`A`,
    /// `AAAA`) holding `value`, living `ttl` seconds at resolvers.
    pub async fn put_dns_record(&self, origin: &str, token: &str, name: &str, kind: &str, value: &str, ttl: u32) -> Result<(), Failure> {
        let body = json!({ "type": kind, "values": [value], "ttl": ttl });
        self.request(reqwest::Method::PUT, origin, &format!("/v1/dns-records/{name}"), token, Some(body)).await.map(drop)
    }

    /// `DELETE /v1/dns-records/<name>` with the client's token; a record already gone is fine.
    pub async fn delete_dns_record(&self, origin: &str, token: &str, name: &str) -> Result<(), Failure> {
        match self.request(reqwest::Method::DELETE, origin, &format!("/v1/dns-records/{name}"), token, None).await {
            Ok(_) | Err(Failure::Refused { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `GET /v1/certificates/<name>` with the client's token: the certificate the gateway holds
    /// (or issues) for exactly `name`, checked to be for that name and to be PEM.
    pub async fn certificate(&self, origin: &str, token: &str, name: &str) -> Result<Certificate, Failure> {
        let mut answer = self.request(reqwest::Method::GET, origin, &format!("/v1/certificates/{name}"), token, None).await?;
        // taken out of the tree at once, so the key's one copy is the wiped one
        let private_key = Zeroizing::new(match answer["privateKey"].take() {
            Value::String(key) => key,
            _ => String::new(),
        });
        if answer["name"].as_str() != Some(name) {
            return Err(Failure::Invalid("the certificate is for another name".into()));
        }
        let certificate = answer["certificate"].as_str().unwrap_or_default();
        if !certificate.trim_start().starts_with("-----BEGIN CERTIFICATE-----") {
            return Err(Failure::Invalid("the certificate is not PEM".into()));
        }
        let key = private_key.trim_start();
        if !(key.starts_with("-----BEGIN ") && key.lines().next().is_some_and(|l| l.ends_with("PRIVATE KEY-----"))) {
            return Err(Failure::Invalid("the private key is not PEM".into()));
        }
        let Some(not_after) = answer["notAfter"].as_u64() else { return Err(Failure::Invalid("notAfter is not a time".into())) };
        Ok(Certificate { certificate: certificate.to_string(), private_key, not_after })
    }

    /// `POST /v1/client/finalize` with the candidate's own token: the candidate becomes the
    /// client's active credential and the one before it stops working.
    pub async fn finalize(&self, origin: &str, candidate_token: &str, credential_id: &str) -> Result<(), Failure> {
        let body = json!({ "credentialId": credential_id });
        let answer = self.request(reqwest::Method::POST, origin, "/v1/client/finalize", candidate_token, Some(body)).await?;
        if answer["credentialId"].as_str() != Some(credential_id) || answer["state"].as_str() != Some("active") {
            return Err(Failure::Invalid("finalize did not answer the credential active".into()));
        }
        Ok(())
    }
}

/// A transport error's text without its URL's query (the URL itself is a public setting).
fn without_url(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    match std::error::Error::source(error) {
        Some(source) => format!("{kind}: {source}"),
        None => kind.to_string(),
    }
}

/// The body of `answer`, at most `limit` bytes (`Failure::TooLarge` past them).
async fn read_limited(mut answer: reqwest::Response, limit: usize) -> Result<Zeroizing<Vec<u8>>, Failure> {
    if answer.content_length().is_some_and(|length| length > limit as u64) {
        return Err(Failure::TooLarge { limit });
    }
    // answers carry credentials (a finalized client key, SMTP passwords): the buffer is wiped
    // when dropped, and sized up front where the length is known so growing leaves no copies
    let mut bytes = Zeroizing::new(Vec::with_capacity(answer.content_length().unwrap_or(0) as usize));
    while let Some(chunk) = answer.chunk().await.map_err(|e| Failure::Unreachable { sent: true, reason: without_url(&e) })? {
        if bytes.len() + chunk.len() > limit {
            return Err(Failure::TooLarge { limit });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const TOKEN: &str = "client-token-that-must-not-leak";

    /// A one-connection-at-a-time HTTP server answering each request with `answer`; what it
    /// was sent comes back on the channel.
    async fn serve(answer: &'static str) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                // the head, then as much body as content-length says
                loop {
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    seen.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&seen).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap())
                            })
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + length {
                            break;
                        }
                    }
                    if n == 0 {
                        break;
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&seen).to_string());
                let _ = socket.write_all(answer.as_bytes()).await;
                let _ = socket.shutdown().await;
            }
        });
        (origin, rx)
    }

    async fn exchange(origin: &str, method: &str, body: Option<&Value>, max_answer: usize) -> Result<(u16, Option<Value>), Failure> {
        let request = Exchange { method, path: "/v1/routes/www.acme.example", body, timeout: Duration::from_secs(5), max_answer };
        GatewayClient::default().exchange(origin, TOKEN, &request).await
    }

    #[tokio::test]
    async fn any_status_is_an_answer_with_its_json_body_and_the_request_carries_the_bearer() {
        let (origin, mut seen) =
            serve("HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 40\r\nconnection: close\r\n\r\n{\"error\":{\"code\":\"route-unknown\",\"x\":1}}")
                .await;
        let answer = exchange(&origin, "PUT", Some(&json!({ "target": "a" })), 1 << 20).await.unwrap();
        assert_eq!(answer, (404, Some(json!({ "error": { "code": "route-unknown", "x": 1 } }))));
        let request = seen.recv().await.unwrap();
        assert!(request.starts_with("PUT /v1/routes/www.acme.example HTTP/1.1\r\n"), "{request}");
        assert!(request.to_ascii_lowercase().contains(&format!("authorization: bearer {TOKEN}").to_ascii_lowercase()), "{request}");
        assert!(request.ends_with("{\"target\":\"a\"}"), "{request}");
    }

    #[tokio::test]
    async fn no_body_or_one_that_is_not_json_is_none() {
        let (origin, _seen) = serve("HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n").await;
        assert_eq!(exchange(&origin, "DELETE", None, 1 << 20).await.unwrap(), (204, None));
        let (origin, _seen) = serve("HTTP/1.1 502 Bad Gateway\r\ncontent-length: 5\r\nconnection: close\r\n\r\noops!").await;
        assert_eq!(exchange(&origin, "GET", None, 1 << 20).await.unwrap(), (502, None));
    }

    #[tokio::test]
    async fn a_401_is_the_credential_refused_and_a_long_answer_too_large() {
        let (origin, _seen) = serve("HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}").await;
        assert_eq!(exchange(&origin, "GET", None, 1 << 20).await.unwrap_err(), Failure::Unauthorized);
        let (origin, _seen) = serve("HTTP/1.1 200 OK\r\ncontent-length: 12\r\nconnection: close\r\n\r\n\"0123456789\"").await;
        assert_eq!(exchange(&origin, "GET", None, 11).await.unwrap_err(), Failure::TooLarge { limit: 11 });
        assert_eq!(exchange(&origin, "GET", None, 12).await.unwrap(), (200, Some(json!("0123456789"))));
    }

    #[tokio::test]
    async fn no_answer_is_unreachable_and_says_nothing_of_the_token() {
        // a port nobody listens on
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let failure = exchange(&origin, "GET", None, 1 << 20).await.unwrap_err();
        assert!(matches!(failure, Failure::Unreachable { sent: false, .. }), "{failure:?}");
        assert!(!format!("{failure:?} {failure}").contains(TOKEN));
        assert!(matches!(exchange(&origin, "PATCH", None, 1 << 20).await.unwrap_err(), Failure::Invalid(_)));
    }
}
