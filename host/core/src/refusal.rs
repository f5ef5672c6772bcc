//! Named refusals: the one error shape every subsystem returns and every client sees.
//!
//! A refusal has a stable kebab-case `code`, a human message, whether retrying may help, and
//! optional structured `data`. It never carries a secret value. Internal failures keep their
//! detail in the log (`detail`, never serialized) and show the client a generic message.

use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// A named refusal: what every fallible operation of the host answers instead of a bare error.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Refusal {
    /// The stable kebab-case code clients match on.
    pub code: Cow<'static, str>,
    /// What a person reads.
    pub message: String,
    /// Whether asking again may succeed.
    pub retryable: bool,
    /// Boxed: keeps `Result<T, Refusal>` small on every hot path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Box<Value>>,
    /// Operator-facing detail for the log only (never sent to a client).
    #[serde(skip)]
    pub detail: Option<String>,
    /// The HTTP status its producer declared for its code (a plugin declares its refusal
    /// codes with their status); a code the host's table names keeps the table's.
    #[serde(skip)]
    pub status: Option<u16>,
}

impl Refusal {
    /// A refusal with its code and message.
    pub fn new(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Refusal { code: code.into(), message: message.into(), retryable: false, data: None, detail: None, status: None }
    }

    /// Mark the refusal as one that asking again may get past.
    pub fn retryable(mut self) -> Self {
        self.retryable = true;
        self
    }

    /// Attach structured data for clients (never a secret).
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(Box::new(data));
        self
    }

    /// An unexpected failure: the client sees `internal`, the log sees `detail`.
    pub fn internal(detail: impl fmt::Display) -> Self {
        Refusal {
            code: Cow::Borrowed("internal"),
            message: "internal error; the server log has the details under this request id".into(),
            retryable: false,
            data: None,
            detail: Some(detail.to_string()),
            status: None,
        }
    }

    /// `invalid-request`: the body or a field is not acceptable.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Refusal::new("invalid-request", message)
    }

    /// `invalid-request` naming the member that is not acceptable (`data.field`).
    pub fn invalid_field(field: &str, message: impl Into<String>) -> Self {
        Refusal::invalid_request(message).with_data(serde_json::json!({ "field": field }))
    }

    /// `not-found`: the named thing does not exist.
    pub fn not_found(what: impl fmt::Display) -> Self {
        Refusal::new("not-found", format!("{what} does not exist"))
    }

    /// Attach log-only detail (never shown to clients).
    pub fn detail(mut self, detail: impl fmt::Display) -> Self {
        self.detail = Some(detail.to_string());
        self
    }

    /// Whether this refusal has `code`.
    pub fn is(&self, code: &str) -> bool {
        self.code == code
    }

    /// The HTTP status that fits this refusal: its code's ([`code_status`]), or for a code the
    /// table does not name the status its producer declared, else 400 (a client mistake)
    /// unless the refusal is retryable (503).
    pub fn http_status(&self) -> u16 {
        // a refusal that says retrying may help is not the client's mistake: the service
        // (a plugin's catalog, a lock, a peer) is unavailable for now
        code_status(&self.code).or(self.status).unwrap_or(if self.retryable { 503 } else { 400 })
    }
}

/// The HTTP status every refusal coded `code` answers, or `None` for a code this table does not
/// name (answered 400, or 503 when retryable; see [`Refusal::http_status`]). The one table: the
/// API's answers and the OpenAPI document's responses both read it. Every `…-not-found` is 404.
pub fn code_status(code: &str) -> Option<u16> {
    Some(match code {
        "not-found" | "method-unknown" => 404,
        // the nodes area: one uniform answer for a code that cannot be used, a node that is
        // not there, an agent binary not shipped here
        "jump-code-invalid" | "node-missing" | "agent-binary-unavailable" => 404,
        "node-unauthorized" | "fleet-request-unverified" => 401,
        "protocol-unsupported" => 422,
        "hostname-in-use" | "credential-revoked" | "node-retired" | "node-not-retired" | "public-origin-not-https" => 409,
        code if code.ends_with("-not-found") => 404,
        "method-not-allowed" => 405,
        "exists" | "conflict" | "mutation-reused" => 409,
        // the target's current state stands in the way
        "task-running" | "task-disabled" | "execution-not-running" | "plugin-disabled" => 409,
        "secret-set-retired" | "secret-set-already-attached" | "secret-set-not-attached" => 409,
        "cluster-relay-live" | "relay-ambiguous" => 409,
        // a release tag is pushed once, reserved once
        "version-collision" | "release-tag-occupied" | "release-tag-reserved" => 409,
        "deployment-state-invalid" | "deployment-image-missing" | "deployment-superseded" | "route-unavailable" => 409,
        "deploy-on-push-enabled" => 409,
        "relay-name-reserved" | "gateway-not-enrolled" => 409,
        // the route's target does not pass its check yet; what was published is withdrawn
        "deployment-route-check-failed" | "rollout-not-healthy" | "release-not-kept" | "release-current" => 409,
        "deployment-identity-required" => 403,
        "request-too-large" | "bundle-too-large" | "transfer-too-large" => 413,
        // a download's Range asks for bytes the file does not have (or for several ranges)
        "range-not-satisfiable" => 416,
        // one answer whatever is wrong with a ticket, so nobody learns of one without its token
        "transfer-ticket-invalid" | "transfer-ticket-expired" | "transfer-ticket-used" => 403,
        "transfer-object-missing" => 404,
        "transfers-unavailable" => 503,
        "rate-limited" => 429,
        // another node answers this; the client calls it there (`data.address`)
        "coordinator-elsewhere" => 421,
        "request-timeout" => 408,
        "unsupported-media-type" => 415,
        "unauthenticated" => 401,
        "forbidden" => 403,
        "store-busy" | "store-unavailable" | "blobs-unavailable" | "not-ready" | "coordinator-unavailable" => 503,
        // always retryable: named here so the OpenAPI document shows the status they answer
        "plugin-busy" | "relay-not-connected" | "relay-timeout" | "server-busy" => 503,
        // the external gateway's enrollment (docs/gateway-protocol.md)
        "gateway-unconfigured" | "gateway-target-mismatch" | "bootstrap-candidate-pending" => 409,
        "gateway-unreachable" => 503,
        "bootstrap-provisioning-refused" => 502,
        // certificates through the gateway (docs/gateway-protocol.md, "Certificates")
        "relay-certificate-not-owned" => 403,
        "relay-certificate-pending" | "certificate-pending" => 503,
        "certificate-name-not-served" => 409,
        "gateway-certificate-refused" => 502,
        // plugins' requests through the gateway (`gateway.request`, WIT 0.2.4), when a plugin
        // passes one of these on
        "gateway-path-invalid" => 400,
        "gateway-request-too-large" => 413,
        "gateway-credential-refused" | "gateway-reply-too-large" => 502,
        // the platform login through an identity provider (capstan-federation, docs/identity.md)
        "platform-oidc-off" => 404,
        "oidc-login-unknown" | "oidc-code-refused" | "oidc-return-invalid" | "oidc-handoff-invalid" | "oidc-login-refused" => 400,
        "oidc-id-token-signature-invalid"
        | "oidc-id-token-issuer-mismatch"
        | "oidc-id-token-audience-mismatch"
        | "oidc-id-token-expired"
        | "oidc-id-token-nonce-mismatch"
        | "oidc-id-token-invalid"
        | "federated-session-ended" => 401,
        "oidc-no-organization" | "user-disabled" => 403,
        "oidc-claim-invalid" => 502,
        "identity-provider-unavailable" | "platform-oidc-issuer-unreachable" => 503,
        "platform-oidc-discovery-incomplete" => 409,
        // single sign-on for a hosted app (apps.setOidc): nothing declared, no HTTPS domain
        "hosted-app-oidc-undeclared" | "hosted-app-domain-required" => 409,
        // the OpenID provider of hosted apps (capstan-hosted-oidc): a sign-in request unknown or
        // lapsed, an app with no client, a person without a role in the app, a non-person
        "hosted-oidc-request-unknown" | "hosted-oidc-client-unknown" => 404,
        "hosted-app-access-denied" | "hosted-oidc-human-required" => 403,
        "hosted-oidc-role-undeclared" | "hosted-oidc-redirect-invalid" => 400,
        "internal" => 500,
        _ => return None,
    })
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refusal {}

/// A result whose error is a [`Refusal`].
pub type Result<T, E = Refusal> = std::result::Result<T, E>;

/// Stable refusal codes (and reasons of the same kind): lowercase words joined by single
/// hyphens, at most 64 characters.
pub fn valid_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= 64
        && code.split('-').all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_detail_never_serializes() {
        let r = Refusal::internal("disk /secret/path failed");
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("/secret/path"), "{json}");
        assert_eq!(r.http_status(), 500);
        assert!(r.to_string().contains("/secret/path"));
    }

    #[test]
    fn client_mistakes_are_not_500() {
        for code in ["invalid-request", "invalid-key", "config-missing"] {
            assert_eq!(Refusal::new(code, "x").http_status(), 400);
        }
        assert_eq!(Refusal::new("conflict", "x").http_status(), 409);
        for code in ["not-found", "task-not-found", "execution-not-found"] {
            assert_eq!(Refusal::new(code, "x").http_status(), 404, "{code}");
        }
        assert_eq!(Refusal::new("not-foundling", "x").http_status(), 400);
        assert_eq!(Refusal::new("store-busy", "x").retryable().http_status(), 503);
        // any other retryable refusal (a plugin's, say) is the service's state, not a mistake
        assert_eq!(Refusal::new("appstore-catalog-unavailable", "x").retryable().http_status(), 503);
        assert_eq!(Refusal::new("conflict", "x").retryable().http_status(), 409, "a listed code keeps its status");
        // a producer's declared status stands for a code the table does not name, never over it
        let declared = |code: &'static str, status| Refusal { status: Some(status), ..Refusal::new(code, "x") };
        assert_eq!(declared("thing-in-the-way", 409).http_status(), 409);
        assert_eq!(declared("conflict", 422).http_status(), 409);
    }

    #[test]
    fn a_plugins_gateway_refusals_have_their_statuses() {
        for (code, status) in [
            ("gateway-path-invalid", 400),
            ("gateway-request-too-large", 413),
            ("gateway-credential-refused", 502),
            ("gateway-reply-too-large", 502),
            ("gateway-not-enrolled", 409),
            ("gateway-unreachable", 503),
        ] {
            assert_eq!(code_status(code), Some(status), "{code}");
        }
    }
}
