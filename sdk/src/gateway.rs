//! The external gateway (docs/gateway-protocol.md), reached with Capstan's enrolled client
//! credential, which the plugin never sees (contract 0.2.4). Capability `gateway:<scope>`, e.g.
//! `gateway:routes:write`: the paths that gateway scope covers (`domains:read`: `GET
//! /v1/domains`; `routes:write`: `/v1/routes`, `/v1/routes/<name>`; `certificates:read`: `GET
//! /v1/certificates/<name>`; `dns-records:write`: `/v1/dns-records`, `/v1/dns-records/<name>`;
//! `smtp:write`: `/v1/smtp-credentials…`, `/v1/smtp-forward-targets…`; `peers:write`:
//! `/v1/peers/<id>`). `GET /v1/status` (the gateway's protocol number) goes with any one scope
//! granted.
//!
//! ```no_run
//! use capstan_sdk::{Refusal, gateway, json};
//!
//! # fn demo() -> capstan_sdk::Result<()> {
//! // capability `gateway:dns-records:write`
//! let record = json!({ "type": "A", "values": ["10.0.0.5"], "ttl": 60 });
//! let put = gateway::put("/v1/dns-records/node1.acme.example", &record)?;
//! if !put.ok() {
//!     let code = put.code().unwrap_or("unnamed").to_string();
//!     return Err(Refusal::new("dns-record-refused", format!("the gateway answered {} {code}", put.status)));
//! }
//! let gone = gateway::delete("/v1/dns-records/old.acme.example")?;
//! assert!(gone.ok() || gone.code() == Some("record-unknown"));
//! # Ok(()) }
//! ```
//!
//! Any status but 401 is a [`Response`]; refusals are named: `capability-denied` (no granted
//! scope covers the path), `gateway-path-invalid`, `invalid-request`, `gateway-not-enrolled`,
//! `gateway-unreachable` (retryable), `gateway-credential-refused`, `gateway-request-too-large`,
//! `gateway-reply-too-large`, `read-only-method` (anything but GET in a read-only method),
//! `plugin-deadline-exceeded`.

use crate::bindings::capstan::plugin::gateway as wit;
use crate::{Result, decode_value, encode, parse};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What the gateway answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The HTTP status (never 401: the credential refused is the refusal
    /// `gateway-credential-refused`).
    pub status: u16,
    /// The JSON body; `None` when the answer had none (or not JSON).
    pub body: Option<Value>,
}

impl Response {
    /// Whether the status is 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The gateway's error code (`{"error": {"code": …}}`), on an answer that carries one.
    pub fn code(&self) -> Option<&str> {
        self.body.as_ref()?.get("error")?.get("code")?.as_str()
    }

    /// The body decoded as `T` (`null` when there was none); `invalid-request` naming the field
    /// when it is not one.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        decode_value(self.body.clone().unwrap_or(Value::Null))
    }
}

/// `method` (`GET`, `PUT`, `POST` or `DELETE`) on `path` (`/v1/routes/www.acme.example`, a
/// query allowed), with `body` as JSON for `PUT` and `POST`. See the module for the refusals.
pub fn request(method: &str, path: &str, body: Option<&impl Serialize>) -> Result<Response> {
    let body = body.map(encode).transpose()?;
    let answer = wit::request(method, path, body.as_deref())?;
    let body = answer.body.map(|text| parse::<Value>(&text, "the gateway's answer")).transpose()?;
    Ok(Response { status: answer.status, body })
}

/// `GET path`.
pub fn get(path: &str) -> Result<Response> {
    request("GET", path, None::<&Value>)
}

/// `PUT path` with `body`.
pub fn put(path: &str, body: &impl Serialize) -> Result<Response> {
    request("PUT", path, Some(body))
}

/// `POST path` with `body`.
pub fn post(path: &str, body: &impl Serialize) -> Result<Response> {
    request("POST", path, Some(body))
}

/// `DELETE path`.
pub fn delete(path: &str) -> Result<Response> {
    request("DELETE", path, None::<&Value>)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ok_is_2xx_and_code_is_the_gateways_error_code() {
        let response = |status, body: Option<Value>| Response { status, body };
        assert!(response(200, None).ok());
        assert!(response(204, None).ok());
        assert!(!response(199, None).ok());
        assert!(!response(404, None).ok());
        let missing = response(404, Some(json!({ "error": { "code": "route-unknown", "message": "no" } })));
        assert_eq!(missing.code(), Some("route-unknown"));
        assert_eq!(response(200, Some(json!({ "code": "x" }))).code(), None);
        assert_eq!(response(500, Some(json!("oops"))).code(), None);
        assert_eq!(response(500, None).code(), None);
    }

    #[test]
    fn json_decodes_the_body() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Route {
            target: String,
        }
        let response = Response { status: 200, body: Some(json!({ "target": "a" })) };
        assert_eq!(response.json::<Route>().unwrap(), Route { target: "a".into() });
        assert_eq!(Response { status: 204, body: None }.json::<Option<Route>>().unwrap(), None);
        assert_eq!(Response { status: 200, body: Some(json!({})) }.json::<Route>().unwrap_err().code(), "invalid-request");
    }
}
