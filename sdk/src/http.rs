//! Outbound HTTP to approved origins only (capability `http:<origin>`, e.g.
//! `http:https://catalog.example.com`, or `http-setting:<key>`: the origins the public setting
//! `<key>` lists when the request is made). Redirects are not followed; bodies are capped.
//!
//! ```no_run
//! use capstan_sdk::http::Request;
//! use std::time::Duration;
//!
//! # fn demo() -> capstan_sdk::Result<()> {
//! let response = Request::get("https://catalog.example.com/index.json").timeout(Duration::from_secs(5)).send()?;
//! if response.is_success() {
//!     let index: capstan_sdk::Value = response.json()?;
//! }
//! # Ok(()) }
//! ```

use crate::bindings::capstan::plugin::http as wit;
use crate::{Refusal, Result, encode, parse};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

pub use wit::Response;

/// An outbound request.
#[derive(Debug, Clone)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    timeout: Option<Duration>,
    error: Option<Refusal>,
}

impl Request {
    /// `method` is `GET`, `POST`, `PUT`, `PATCH`, `DELETE` or `HEAD`; `url` is absolute and its
    /// origin must be granted.
    pub fn new(method: &str, url: &str) -> Self {
        Request { method: method.into(), url: url.into(), headers: Vec::new(), body: None, timeout: None, error: None }
    }

    /// A `GET` request to `url`.
    pub fn get(url: &str) -> Self {
        Request::new("GET", url)
    }

    /// A `POST` request to `url`.
    pub fn post(url: &str) -> Self {
        Request::new("POST", url)
    }

    /// A `PUT` request to `url`.
    pub fn put(url: &str) -> Self {
        Request::new("PUT", url)
    }

    /// A `DELETE` request to `url`.
    pub fn delete(url: &str) -> Self {
        Request::new("DELETE", url)
    }

    /// Add the header `name: value`.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Send `body` as the request body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// `value` as a JSON body, with `content-type: application/json`.
    pub fn json(mut self, value: &impl Serialize) -> Self {
        match encode(value) {
            Ok(text) => self.header("content-type", "application/json").body(text),
            Err(e) => {
                self.error = Some(e);
                self
            }
        }
    }

    /// At most the remaining call deadline either way.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Send it: see [`fetch`].
    pub fn send(self) -> Result<Response> {
        fetch(self)
    }
}

/// Send `request`. Refused `capability-denied` (origin not granted), `http-timeout`,
/// `http-tls-failed` (its `data.cause` names why, e.g. `certificate-unknown-issuer`),
/// `http-failed` or `http-body-too-large`; a non-2xx status is a response, not a refusal.
pub fn fetch(request: Request) -> Result<Response> {
    if let Some(error) = request.error {
        return Err(error);
    }
    let timeout_ms = request.timeout.map(|t| u32::try_from(t.as_millis()).unwrap_or(u32::MAX));
    let wire = wit::Request { method: request.method, url: request.url, headers: request.headers, body: request.body, timeout_ms };
    Ok(wit::fetch(&wire)?)
}

impl Response {
    /// A 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body as UTF-8 text (invalid sequences replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body decoded from JSON into `T`; refused `http-body-invalid` otherwise.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        let text = std::str::from_utf8(&self.body).map_err(|_| Refusal::new("http-body-invalid", "The response body is not UTF-8."))?;
        parse(text, "the response body").map_err(|r| {
            let refusal = Refusal::new("http-body-invalid", r.message());
            match r.data() {
                Some(data) => refusal.with_data(data.clone()),
                None => refusal,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_answer_headers_and_json() {
        let r = Response { status: 201, headers: vec![("Content-Type".into(), "application/json".into())], body: br#"{"a":1}"#.to_vec() };
        assert!(r.is_success());
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.json::<serde_json::Value>().unwrap()["a"], 1);
        let bad = Response { status: 500, headers: vec![], body: b"oops".to_vec() };
        assert!(!bad.is_success());
        assert_eq!(bad.text(), "oops");
        assert_eq!(bad.json::<serde_json::Value>().unwrap_err().code(), "http-body-invalid");
    }

    #[test]
    fn requests_build() {
        let r = Request::post("https://a.example/x").json(&serde_json::json!({"k": 1})).timeout(Duration::from_secs(2));
        assert_eq!(r.method, "POST");
        assert_eq!(r.body.as_deref(), Some(&br#"{"k":1}"#[..]));
        assert_eq!(r.headers, [("content-type".to_string(), "application/json".to_string())]);
        assert_eq!(r.timeout, Some(Duration::from_secs(2)));
    }
}
