//! Typed refusals: the named errors a manager answers with, and the ones the host answers a
//! manager's imports with.

use crate::bindings::capstan::plugin::types;
use serde_json::Value;
use std::fmt;

/// A named refusal: a stable kebab-case `code`, one sentence for a human, whether the same call
/// may succeed later unchanged, and optional JSON details.
///
/// The host turns a refusal a method returns into the standard error envelope of the API, so a
/// client sees exactly this code, message and data. Never put a secret in the message or data.
///
/// ```
/// use capstan_sdk::{Refusal, json};
///
/// let refusal = Refusal::new("mail-domain-unverified", "The domain has no verified DKIM record.")
///     .with_data(json!({ "domain": "example.com" }));
/// assert_eq!(refusal.code(), "mail-domain-unverified");
/// assert!(!refusal.is_retryable());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    code: String,
    message: String,
    retryable: bool,
    /// Boxed so a `Result<T, Refusal>` stays small whatever features serde_json has.
    data: Option<Box<Value>>,
}

impl Refusal {
    /// A refusal with `code` (kebab-case: `[a-z0-9]` words joined by `-`) and `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        let code = code.into();
        debug_assert!(is_kebab_case(&code), "refusal code {code:?} must be kebab-case");
        Refusal { code, message: message.into(), retryable: false, data: None }
    }

    /// Mark the refusal retryable: the same call may succeed later unchanged.
    pub fn retryable(mut self) -> Self {
        self.retryable = true;
        self
    }

    /// Attach details (a JSON object by convention: a field name, an id).
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(Box::new(data));
        self
    }

    /// `invalid-request`: the body or arguments are wrong.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Refusal::new("invalid-request", message)
    }

    /// `<what>-not-found`, e.g. `Refusal::not_found("example-note")` is
    /// `example-note-not-found` with the message "The example note does not exist.".
    pub fn not_found(what: &str) -> Self {
        let words = what.replace('-', " ");
        Refusal::new(format!("{what}-not-found"), format!("The {words} does not exist."))
    }

    /// `conflict`: the state moved on since it was read (a compare-and-swap lost).
    pub fn conflict(message: impl Into<String>) -> Self {
        Refusal::new("conflict", message)
    }

    /// `internal`: something that is the plugin's fault, not the caller's.
    pub fn internal(message: impl Into<String>) -> Self {
        Refusal::new("internal", message)
    }

    /// The stable kebab-case code.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The human sentence.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the same call may succeed later unchanged.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The details, if any.
    pub fn data(&self) -> Option<&Value> {
        self.data.as_deref()
    }

    /// Whether this refusal has `code`.
    pub fn is(&self, code: &str) -> bool {
        self.code == code
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Refusal {}

impl From<Refusal> for types::Refusal {
    fn from(r: Refusal) -> Self {
        types::Refusal { code: r.code, message: r.message, retryable: r.retryable, data: r.data.map(|d| d.to_string()) }
    }
}

impl From<types::Refusal> for Refusal {
    /// The host's refusal as it came. Data that is not JSON (which the host never sends) is kept
    /// as a JSON string rather than lost.
    fn from(r: types::Refusal) -> Self {
        let data = r.data.map(|text| Box::new(serde_json::from_str(&text).unwrap_or(Value::String(text))));
        Refusal { code: r.code, message: r.message, retryable: r.retryable, data }
    }
}

/// Refusals travel through `std::io` (a [`crate::blobs::BlobWriter`] used with `io::copy`)
/// and come back out unchanged; any other I/O error is `internal`.
impl From<std::io::Error> for Refusal {
    fn from(e: std::io::Error) -> Self {
        if e.get_ref().is_some_and(|inner| inner.is::<Refusal>()) {
            return *e.into_inner().expect("checked above").downcast::<Refusal>().expect("checked above");
        }
        Refusal::internal(format!("I/O failed: {e}"))
    }
}

impl From<Refusal> for std::io::Error {
    fn from(r: Refusal) -> Self {
        std::io::Error::other(r)
    }
}

/// `[a-z0-9]+(-[a-z0-9]+)*`
pub(crate) fn is_kebab_case(code: &str) -> bool {
    !code.is_empty() && code.split('-').all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_through_the_wit_shape() {
        let r = Refusal::new("mail-domain-unverified", "Verify the domain first.").retryable().with_data(json!({"domain": "a.example"}));
        let wit: types::Refusal = r.clone().into();
        assert_eq!(wit.code, "mail-domain-unverified");
        assert!(wit.retryable);
        assert_eq!(serde_json::from_str::<Value>(wit.data.as_deref().unwrap()).unwrap(), json!({"domain": "a.example"}));
        assert_eq!(Refusal::from(wit), r);
    }

    #[test]
    fn data_absent_and_not_json_survive() {
        let wit = types::Refusal { code: "conflict".into(), message: "moved".into(), retryable: false, data: None };
        assert_eq!(Refusal::from(wit).data(), None);
        let wit = types::Refusal { code: "x".into(), message: "m".into(), retryable: false, data: Some("not json".into()) };
        assert_eq!(Refusal::from(wit).data(), Some(&json!("not json")));
    }

    #[test]
    fn constructors_name_their_codes() {
        assert_eq!(Refusal::invalid_request("bad").code(), "invalid-request");
        assert_eq!(Refusal::conflict("moved").code(), "conflict");
        assert_eq!(Refusal::internal("oops").code(), "internal");
        let nf = Refusal::not_found("example-note");
        assert_eq!(nf.code(), "example-note-not-found");
        assert_eq!(nf.message(), "The example note does not exist.");
        assert!(nf.is("example-note-not-found"));
        assert_eq!(nf.to_string(), "example-note-not-found: The example note does not exist.");
    }

    #[test]
    fn kebab_case() {
        for ok in ["conflict", "not-found", "a1-b2", "x"] {
            assert!(is_kebab_case(ok), "{ok}");
        }
        for bad in ["", "Conflict", "not_found", "-a", "a-", "a--b", "a b"] {
            assert!(!is_kebab_case(bad), "{bad}");
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "kebab-case")]
    fn codes_must_be_kebab_case() {
        let _ = Refusal::new("NotKebab", "no");
    }

    #[test]
    fn io_errors_carry_refusals_back_out() {
        let r = Refusal::new("blob-too-large", "too big");
        let io: std::io::Error = r.clone().into();
        assert_eq!(Refusal::from(io), r);
        let other = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof");
        assert_eq!(Refusal::from(other).code(), "internal");
    }
}
