//! The agent's wire (`/agent/v1/…`, docs/nodes.md): the request and answer bodies, and the one
//! HTTP client that sends them (rustls, with connect and whole-request timeouts).
//!
//! Every request and answer carries `"protocol": "capstan-agent/1"`. A refusal is the API's
//! refusal JSON (`{"error": {"code", "message", "data"?}}`); it reaches the caller as
//! [`WireError::Refused`], while a request that never got an answer (refused connection, reset,
//! timeout) is [`WireError::Unreachable`], which may be asked again.

use crate::token::Token;
use capstan_core::Refusal;
use capstan_core::text::{escape_control, truncate};
use capstan_core::wire::heartbeat::Report;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The protocol this agent speaks.
pub const PROTOCOL: &str = "capstan-agent/1";
/// This agent's version, as reported.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read (every answer of the wire is small).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// `POST /agent/v1/enroll`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrollRequest {
    /// [`PROTOCOL`].
    pub protocol: &'static str,
    /// The jump code (from standard input).
    pub code: String,
    /// The hostname the node offers.
    pub hostname: String,
    /// SHA-256 (hex) of the token the agent drew.
    pub token_sha256: String,
    /// [`AGENT_VERSION`].
    pub agent_version: &'static str,
}

/// The enrollment's answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrollAnswer {
    /// The new node's id.
    pub node_id: String,
    /// Its cluster.
    pub cluster_id: String,
    /// The hostname the host recorded.
    pub hostname: String,
    /// The credential's generation (1).
    pub credential_generation: u64,
}

/// `POST /agent/v1/heartbeat`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatRequest<'a> {
    /// [`PROTOCOL`].
    pub protocol: &'static str,
    /// The node.
    pub node_id: &'a str,
    /// The host facts.
    pub report: &'a Report,
}

/// The heartbeat's receipt.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatAnswer {
    /// Always `true`.
    pub accepted: bool,
    /// The generation the beat committed under.
    pub credential_generation: u64,
    /// How long the report stands.
    pub fresh_for_ms: u64,
}

/// `POST /agent/v1/host`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostRequest<'a> {
    /// [`PROTOCOL`].
    pub protocol: &'static str,
    /// The node.
    pub node_id: &'a str,
}

/// The node's desired host.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostAnswer {
    /// The desired hostname; `null` at generation 0 (nothing asked).
    pub hostname: Option<String>,
    /// The intent's generation.
    pub generation: u64,
}

/// `POST /agent/v1/rotate`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RotateRequest<'a> {
    /// [`PROTOCOL`].
    pub protocol: &'static str,
    /// The node.
    pub node_id: &'a str,
    /// SHA-256 (hex) of the new material.
    pub token_sha256: String,
    /// The generation the current token belongs to.
    pub expected_generation: u64,
    /// Replays the recorded answer when asked again.
    pub mutation_id: &'a str,
}

/// Credential metadata, as `nodes.rotateCredential` answers.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialAnswer {
    /// The new generation.
    pub generation: u64,
}

/// Why a request did not succeed.
#[derive(Debug)]
pub enum WireError {
    /// No answer arrived (connection refused or dropped, timeout): asking again may succeed.
    Unreachable(String),
    /// Capstan answered with a refusal.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The refusal's code.
        code: String,
        /// Its message (control characters escaped, bounded).
        message: String,
    },
}

impl WireError {
    /// The refusal code, when Capstan refused.
    pub fn code(&self) -> Option<&str> {
        match self {
            WireError::Refused { code, .. } => Some(code),
            WireError::Unreachable(_) => None,
        }
    }

    /// As a refusal to show: Capstan's own code and message, or `capstan-unreachable`.
    pub fn into_refusal(self) -> Refusal {
        match self {
            WireError::Unreachable(why) => Refusal::new("capstan-unreachable", format!("Capstan could not be reached: {why}")).retryable(),
            WireError::Refused { status, code, message } => Refusal::new(code, message).with_data(serde_json::json!({ "status": status })),
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Unreachable(why) => write!(f, "Capstan could not be reached: {why}"),
            WireError::Refused { status, code, message } => write!(f, "Capstan refused ({status}): {code}: {message}"),
        }
    }
}

/// The HTTP client for one origin.
#[derive(Clone)]
pub struct Client {
    origin: String,
    http: reqwest::Client,
}

impl Client {
    /// A client for `origin` (already checked by `origin::check_origin`).
    pub fn new(origin: &str) -> Result<Client, Refusal> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("capstan-agent/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Refusal::internal(format!("building the HTTP client: {e}")))?;
        Ok(Client { origin: origin.trim_end_matches('/').to_string(), http })
    }

    /// The origin.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// POST `body` to `path` (with the bearer `token`, when given) and read the answer.
    pub async fn post<B: Serialize, A: DeserializeOwned>(&self, path: &str, body: &B, token: Option<&Token>) -> Result<A, WireError> {
        let bytes = serde_json::to_vec(body).map_err(|e| WireError::Unreachable(format!("encoding the request: {e}")))?;
        let mut request = self
            .http
            .post(format!("{}{path}", self.origin))
            .header("content-type", "application/json")
            .header("accept", "application/json");
        if let Some(token) = token {
            request = request.header("authorization", token.bearer().as_str());
        }
        let response = request.body(bytes).send().await.map_err(|e| WireError::Unreachable(describe(&e)))?;
        let status = response.status().as_u16();
        let body = read_bounded(response).await?;
        if (200..300).contains(&status) {
            let answer: serde_json::Value = serde_json::from_slice(&body).map_err(|_| WireError::Refused {
                status,
                code: "answer-malformed".into(),
                message: "Capstan's answer is not JSON".into(),
            })?;
            if answer.get("protocol").and_then(|p| p.as_str()).is_some_and(|p| p != PROTOCOL) {
                return Err(WireError::Refused {
                    status,
                    code: "protocol-unsupported".into(),
                    message: format!("Capstan answered in protocol {}", clean(answer["protocol"].as_str().unwrap_or_default())),
                });
            }
            return serde_json::from_value(answer).map_err(|e| WireError::Refused {
                status,
                code: "answer-malformed".into(),
                message: format!("Capstan's answer does not have the expected shape: {}", clean(&e.to_string())),
            });
        }
        // a gateway in front of Capstan (or Capstan starting) is not a refusal of this request
        let refusal = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| {
            let error = v.get("error")?;
            Some((error.get("code")?.as_str()?.to_string(), error.get("message").and_then(|m| m.as_str()).unwrap_or_default().to_string()))
        });
        match refusal {
            Some((code, message)) => Err(WireError::Refused { status, code: clean(&code), message: clean(&message) }),
            None if matches!(status, 502..=504) => Err(WireError::Unreachable(format!("HTTP {status} from a proxy"))),
            None => {
                Err(WireError::Refused { status, code: "answer-malformed".into(), message: format!("HTTP {status} without a refusal") })
            }
        }
    }
}

/// How often a request whose answer was lost is asked again, and the first pause (doubled
/// after each attempt): 1 s, 2 s, 4 s, 8 s, 16 s.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all.
    pub attempts: u32,
    /// The first pause.
    pub first_pause: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry { attempts: 6, first_pause: Duration::from_secs(1) }
    }
}

impl Client {
    /// [`Client::post`], asking again with the exact same request while no answer arrives
    /// (the host answers a repeated enrollment or rotation with the answer it recorded).
    pub async fn post_retrying<B: Serialize, A: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        token: Option<&Token>,
        retry: Retry,
    ) -> Result<A, WireError> {
        let mut pause = retry.first_pause;
        let mut attempt = 1;
        loop {
            match self.post(path, body, token).await {
                Err(WireError::Unreachable(why)) if attempt < retry.attempts => {
                    tracing::warn!(
                        attempt,
                        "{path}: no answer ({why}); asking again with the same request in {}",
                        humantime::format_duration(pause)
                    );
                    tokio::time::sleep(pause).await;
                    pause = pause.saturating_mul(2);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}

async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, WireError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| WireError::Unreachable(describe(&e)))? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_ANSWER_BYTES {
            return Err(WireError::Refused {
                status: 0,
                code: "answer-too-large".into(),
                message: "Capstan's answer is larger than 64 KiB".into(),
            });
        }
    }
    Ok(body)
}

fn clean(text: &str) -> String {
    escape_control(&truncate(text, 500)).into_owned()
}

/// What went wrong with a request, without its URL's secrets (there are none: the token is a
/// header) and with the cause chain, on one line.
pub(crate) fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "connection failed".to_string()
    } else {
        "the request failed".to_string()
    };
    let mut source = std::error::Error::source(e);
    let mut depth = 0;
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
        depth += 1;
        if depth > 4 {
            break;
        }
    }
    clean(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn members(value: &Value) -> Vec<String> {
        let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }

    #[test]
    fn enroll_request_has_exactly_the_documented_members() {
        let body = serde_json::to_value(EnrollRequest {
            protocol: PROTOCOL,
            code: "AbCd1234EfGh5678".into(),
            hostname: "web-1".into(),
            token_sha256: "0".repeat(64),
            agent_version: AGENT_VERSION,
        })
        .unwrap();
        assert_eq!(members(&body), ["agentVersion", "code", "hostname", "protocol", "tokenSha256"]);
        assert_eq!(body["protocol"], "capstan-agent/1");
    }

    #[test]
    fn heartbeat_host_and_rotate_requests_have_exactly_the_documented_members() {
        let report = crate::report::tests::sample();
        let beat = serde_json::to_value(HeartbeatRequest { protocol: PROTOCOL, node_id: "node_1", report: &report }).unwrap();
        assert_eq!(members(&beat), ["nodeId", "protocol", "report"]);
        let host = serde_json::to_value(HostRequest { protocol: PROTOCOL, node_id: "node_1" }).unwrap();
        assert_eq!(members(&host), ["nodeId", "protocol"]);
        let rotate = serde_json::to_value(RotateRequest {
            protocol: PROTOCOL,
            node_id: "node_1",
            token_sha256: "a".repeat(64),
            expected_generation: 1,
            mutation_id: "rot_1",
        })
        .unwrap();
        assert_eq!(members(&rotate), ["expectedGeneration", "mutationId", "nodeId", "protocol", "tokenSha256"]);
        assert_eq!(rotate["expectedGeneration"], 1);
    }

    #[test]
    fn documented_answers_parse() {
        let enroll: EnrollAnswer = serde_json::from_value(
            json!({"protocol": PROTOCOL, "nodeId": "node_1", "clusterId": "cls_1", "hostname": "web-1", "credentialGeneration": 1}),
        )
        .unwrap();
        assert_eq!((enroll.node_id.as_str(), enroll.credential_generation), ("node_1", 1));
        let beat: HeartbeatAnswer = serde_json::from_value(json!({"protocol": PROTOCOL, "accepted": true, "nodeId": "node_1",
            "credentialGeneration": 2, "acceptedAt": "2025-01-01T00:00:00Z", "freshForMs": 180000}))
        .unwrap();
        assert_eq!(beat.fresh_for_ms, 180000);
        let host: HostAnswer = serde_json::from_value(json!({"protocol": PROTOCOL, "hostname": null, "generation": 0})).unwrap();
        assert_eq!((host.hostname, host.generation), (None, 0));
        let cred: CredentialAnswer = serde_json::from_value(json!({"nodeId": "node_1", "generation": 2, "sessionEpoch": 1,
            "state": "active", "rotatedAt": 1, "revokedAt": null, "protocol": PROTOCOL}))
        .unwrap();
        assert_eq!(cred.generation, 2);
    }

    #[test]
    fn the_bearer_never_shows_in_a_request_debug() {
        let token = Token::draw().unwrap();
        let secret = serde_json::to_value(&token).unwrap().as_str().unwrap().to_string();
        let request = RotateRequest {
            protocol: PROTOCOL,
            node_id: "node_1",
            token_sha256: token.sha256_hex(),
            expected_generation: 1,
            mutation_id: "rot_1",
        };
        let shown = format!("{request:?} {}", serde_json::to_string(&request).unwrap());
        assert!(!shown.contains(&secret));
    }
}
