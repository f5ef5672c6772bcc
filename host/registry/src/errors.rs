//! Errors in the distribution spec's format: `{"errors":[{"code","message","detail"}]}`, where
//! `code` is the spec's (`BLOB_UNKNOWN`, `DENIED`, …) and `detail.reason` Capstan's stable
//! kebab-case code, so a client can tell apart refusals the spec gives one code.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use capstan_core::refusal::Refusal;
use serde_json::{Value, json};
use std::borrow::Cow;

/// A refusal as a registry client sees it.
#[derive(Debug)]
pub struct OciError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The spec's error code.
    pub code: &'static str,
    /// What a person reads.
    pub message: String,
    /// Capstan's kebab-case code.
    pub reason: Cow<'static, str>,
    /// More facts for the client (never a secret).
    pub data: Option<Box<Value>>,
    /// `WWW-Authenticate`, on an authentication challenge.
    pub challenge: Option<String>,
}

impl OciError {
    /// An error with its status, spec code, Capstan code and message.
    pub fn new(status: StatusCode, code: &'static str, reason: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        OciError { status, code, message: message.into(), reason: reason.into(), data: None, challenge: None }
    }

    /// Attach facts.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(Box::new(data));
        self
    }

    /// `401 UNAUTHORIZED` with the token challenge.
    pub fn unauthorized(challenge: String) -> Self {
        let mut e = OciError::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "unauthenticated", "authentication required");
        e.challenge = Some(challenge);
        e
    }

    /// `403 DENIED`.
    pub fn denied(reason: &'static str, message: impl Into<String>) -> Self {
        OciError::new(StatusCode::FORBIDDEN, "DENIED", reason, message)
    }

    /// `400 NAME_INVALID`.
    pub fn name_invalid(name: &str) -> Self {
        OciError::new(StatusCode::BAD_REQUEST, "NAME_INVALID", "registry-name-invalid", "invalid repository name")
            .with_data(json!({ "name": capstan_core::text::truncate(name, 140) }))
    }

    /// `404 NAME_UNKNOWN`.
    pub fn name_unknown(name: &str) -> Self {
        OciError::new(StatusCode::NOT_FOUND, "NAME_UNKNOWN", "registry-repository-not-found", "repository name not known to registry")
            .with_data(json!({ "name": name }))
    }

    /// `400 TAG_INVALID`.
    pub fn tag_invalid(tag: &str) -> Self {
        OciError::new(StatusCode::BAD_REQUEST, "TAG_INVALID", "registry-tag-invalid", "manifest tag did not match the tag grammar")
            .with_data(json!({ "tag": capstan_core::text::truncate(tag, 140) }))
    }

    /// `400 DIGEST_INVALID`.
    pub fn digest_invalid(message: impl Into<String>) -> Self {
        OciError::new(StatusCode::BAD_REQUEST, "DIGEST_INVALID", "registry-digest-invalid", message)
    }

    /// `400 UNSUPPORTED` for a digest algorithm Capstan does not store.
    pub fn unsupported_digest(algorithm: &str) -> Self {
        OciError::new(StatusCode::BAD_REQUEST, "UNSUPPORTED", "registry-digest-unsupported", "only sha256 digests are supported")
            .with_data(json!({ "algorithm": capstan_core::text::truncate(algorithm, 40) }))
    }

    /// `404 BLOB_UNKNOWN`.
    pub fn blob_unknown(digest: &str) -> Self {
        OciError::new(StatusCode::NOT_FOUND, "BLOB_UNKNOWN", "registry-blob-not-found", "blob unknown to registry")
            .with_data(json!({ "digest": digest }))
    }

    /// `404 BLOB_UPLOAD_UNKNOWN`.
    pub fn upload_unknown() -> Self {
        OciError::new(StatusCode::NOT_FOUND, "BLOB_UPLOAD_UNKNOWN", "registry-upload-not-found", "blob upload unknown to registry")
    }

    /// `400 BLOB_UPLOAD_INVALID`.
    pub fn upload_invalid(reason: &'static str, message: impl Into<String>) -> Self {
        OciError::new(StatusCode::BAD_REQUEST, "BLOB_UPLOAD_INVALID", reason, message)
    }

    /// `404 MANIFEST_UNKNOWN`.
    pub fn manifest_unknown(reference: &str) -> Self {
        OciError::new(StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN", "registry-manifest-not-found", "manifest unknown to registry")
            .with_data(json!({ "reference": reference }))
    }

    /// `400 MANIFEST_INVALID`.
    pub fn manifest_invalid(message: impl Into<String>) -> Self {
        OciError::new(StatusCode::BAD_REQUEST, "MANIFEST_INVALID", "registry-manifest-invalid", message)
    }

    /// `400 MANIFEST_BLOB_UNKNOWN`.
    pub fn manifest_blob_unknown(digest: &str) -> Self {
        OciError::new(
            StatusCode::BAD_REQUEST,
            "MANIFEST_BLOB_UNKNOWN",
            "registry-manifest-blob-unknown",
            "manifest references a manifest or blob unknown to registry",
        )
        .with_data(json!({ "digest": digest }))
    }
}

impl From<Refusal> for OciError {
    fn from(refusal: Refusal) -> Self {
        let (status, code) = match refusal.code.as_ref() {
            "unauthenticated" => (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            "forbidden" => (StatusCode::FORBIDDEN, "DENIED"),
            "rate-limited" => (StatusCode::TOO_MANY_REQUESTS, "TOOMANYREQUESTS"),
            _ if refusal.retryable => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
            _ => match StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR) {
                s if s.is_server_error() => (s, "UNKNOWN"),
                s => (s, "UNSUPPORTED"),
            },
        };
        if status.is_server_error() {
            tracing::error!(code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "registry request failed: {}", refusal.message);
        }
        OciError { status, code, message: refusal.message, reason: refusal.code, data: refusal.data, challenge: None }
    }
}

impl IntoResponse for OciError {
    fn into_response(self) -> Response {
        if self.status == StatusCode::NOT_FOUND {
            // a client asks whether a blob is there before it uploads: routine, not news
            tracing::debug!(code = self.code, reason = %self.reason, "registry request refused: {}", self.message);
        } else if !self.status.is_server_error() {
            tracing::info!(code = self.code, reason = %self.reason, "registry request refused: {}", self.message);
        }
        let mut detail = json!({ "reason": self.reason });
        if let Some(Value::Object(data)) = self.data.map(|d| *d) {
            detail.as_object_mut().expect("an object").extend(data);
        }
        let body = json!({ "errors": [{ "code": self.code, "message": self.message, "detail": detail }] });
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(challenge) = self.challenge.and_then(|c| HeaderValue::from_str(&c).ok()) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
        }
        response
    }
}
