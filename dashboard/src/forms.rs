//! What the inventory views (clusters, services, settings) share: the session a page or a
//! panel needs, calling a registered API method as the logged-in person (so the dashboard is
//! authorized and validated exactly like the API), the page banner, reading a form, and
//! turning the text an operator typed into a method's JSON body and back.
//!
//! Nothing here judges a value: text that does not even have the shape of a line (a label
//! without `=`) is refused `invalid-request` naming the field and line; everything else goes
//! to the method as typed, and the method judges it by field. Ports are read by the one reader
//! the CLI uses too (`capstan_field_rules::port`), so both faces take and show `443:8080/http`.

use super::{current_identity, message_page, refuse_cross_origin, rfc3339, to_login, unavailable, utc};
use crate::Host;
use crate::Viewer;
use crate::refusal::{Refusal, Result};
use axum::Form;
use axum::extract::{FromRef, FromRequest, Query, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use capstan_field_rules::port;
use capstan_rpc::Invocation;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// The largest page of a list the views ask for.
pub(super) const PAGE: usize = 50;

// ---------------------------------------------------------------------------------------
// Sessions and calls

/// The person the request's session stands for, or the answer to give instead: the login
/// page for a page, `401` with `HX-Redirect` for an htmx request (htmx then loads the login
/// page), the "cannot answer" page when the store is down.
pub(super) async fn session(state: &Host, headers: &HeaderMap) -> std::result::Result<Viewer, Response> {
    match current_identity(state, headers).await {
        Ok(Some(identity)) => Ok(identity),
        Ok(None) if headers.contains_key("hx-request") => Err((StatusCode::UNAUTHORIZED, [("hx-redirect", "/login")]).into_response()),
        Ok(None) => Err(to_login(state, headers)),
        Err(refusal) => Err(unavailable(refusal)),
    }
}

/// The signed-in person, as a handler argument: without a session the request is answered
/// by [`session`] (the login page, or `hx-redirect` for htmx) and the handler never runs.
pub(super) struct Signed(pub Viewer);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Signed
where
    Host: FromRef<S>,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> std::result::Result<Self, Response> {
        session(&Host::from_ref(state), &parts.headers).await.map(Signed)
    }
}

/// A form post: from this host (else `403`), with a session (else to the login page), its
/// fields read (else `400`/`413`) within the route's body limit.
pub(super) async fn post(state: &Host, request: Request) -> std::result::Result<(Viewer, FormData), Response> {
    post_within(state, request, None).await
}

/// [`post`], the form read within `limit` bytes rather than the route's limit. The origin and
/// the session are judged before a byte of the body is read.
pub(super) async fn post_within(state: &Host, request: Request, limit: Option<usize>) -> std::result::Result<(Viewer, FormData), Response> {
    let (parts, body) = request.into_parts();
    if let Some(refused) = refuse_cross_origin(state, &parts.headers) {
        return Err(refused);
    }
    let identity = session(state, &parts.headers).await?;
    let body = match limit {
        Some(limit) => axum::body::Body::new(http_body_util::Limited::new(body, limit)),
        None => body,
    };
    match Form::<Vec<(String, String)>>::from_request(Request::from_parts(parts, body), state).await {
        // browsers send a text area's line breaks as CRLF; the methods take LF
        Ok(Form(pairs)) => Ok((identity, FormData(pairs.into_iter().map(|(k, v)| (k, v.replace("\r\n", "\n"))).collect()))),
        Err(rejection) => {
            tracing::info!(status = rejection.status().as_u16(), "an unreadable dashboard form was refused");
            let status =
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE { StatusCode::PAYLOAD_TOO_LARGE } else { StatusCode::BAD_REQUEST };
            Err(message_page(status, "The form could not be read", "Nothing was changed. Go back, reload the page and try again."))
        }
    }
}

/// Call the registered API method `name` as `viewer`, exactly as `POST /api/v1/<name>`
/// would: through the registry's one door, which decodes the body strictly, authorizes,
/// forwards a coordinator-only method to the coordinator (with the session's token) and
/// records a state-changing call in the audit log.
pub(super) async fn call(state: &Host, viewer: &Viewer, name: &str, body: Value) -> Result<Value> {
    invoke(state, viewer, "", name, body).await
}

/// Call `name` as [`call`] does when this host serves it, and `Ok(None)` when it does not
/// (`method-unknown`): for a method that a host may not have yet (a newer one, or one still
/// being built), which a view shows as "nothing yet" rather than as a failure.
pub(super) async fn call_if_served(state: &Host, viewer: &Viewer, name: &str, body: Value) -> Result<Option<Value>> {
    if let Err(refusal) = state.methods.resolve(name).await
        && refusal.is("method-unknown")
    {
        tracing::debug!(method = name, "the dashboard reads a method this host does not serve yet");
        return Ok(None);
    }
    invoke(state, viewer, "", name, body).await.map(Some)
}

/// Call the plugin method `<plugin>.<method>` as `viewer` through the same registry entry
/// `POST /api/v1/<plugin>.<method>` reaches. A plugin that is not serving here is refused by
/// name: `plugin-unavailable` (installed but failed to load, with its cause),
/// `plugin-disabled`, or `plugin-not-loaded` (retryable: first-party plugins are installed in
/// the background at start).
pub(super) async fn call_plugin(state: &Host, viewer: &Viewer, request_id: &str, plugin: &str, method: &str, body: Value) -> Result<Value> {
    invoke(state, viewer, request_id, &format!("{plugin}.{method}"), body).await
}

async fn invoke(state: &Host, viewer: &Viewer, request_id: &str, name: &str, body: Value) -> Result<Value> {
    let invocation = Invocation::verified(name, viewer, Some(viewer.bearer()), body).with_request_id(request_id);
    let result = async { state.methods.invoke(invocation).await?.into_value() }.await;
    if let Err(refusal) = &result {
        log_refusal(name, refusal);
    }
    result
}

fn log_refusal(method: &str, refusal: &Refusal) {
    if refusal.http_status() >= 500 {
        tracing::error!(method, code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "a dashboard call failed: {}", refusal.message);
    } else {
        tracing::info!(method, code = %refusal.code, "a dashboard call was refused: {}", refusal.message);
    }
}

/// The status a page showing `refusal` answers with.
pub(super) fn status_of(refusal: &Refusal) -> StatusCode {
    StatusCode::from_u16(refusal.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

// ---------------------------------------------------------------------------------------
// Banners

/// What a post did, or why it did not: the page's banner.
#[derive(Debug, Serialize)]
pub(super) struct Flash {
    pub ok: bool,
    /// The refusal's code (refusals only).
    pub code: Option<String>,
    /// The field the refusal names, if it names one.
    pub field: Option<String>,
    pub title: String,
    pub message: String,
}

impl Flash {
    pub fn done(title: impl Into<String>, message: impl Into<String>) -> Flash {
        Flash { ok: true, code: None, field: None, title: title.into(), message: message.into() }
    }

    /// A refusal as the banner shows it: its code in the title, its message, what to do next.
    pub fn refused(title: &str, refusal: &Refusal, after: &str) -> Flash {
        let mut message = refusal.message.trim_end_matches('.').to_string();
        message.push('.');
        if !after.is_empty() {
            message = format!("{message} {after}");
        }
        let field = refusal.data.as_ref().and_then(|d| d.get("field")).and_then(Value::as_str).map(|f| f.chars().take(100).collect());
        Flash { ok: false, code: Some(refusal.code.to_string()), field, title: format!("{title} ({})", refusal.code), message }
    }
}

/// A refusal shown in a panel: its code and client-facing message (never its detail).
#[derive(Debug, Serialize)]
pub(super) struct ErrorView {
    pub code: String,
    pub message: String,
}

impl From<&Refusal> for ErrorView {
    fn from(refusal: &Refusal) -> ErrorView {
        ErrorView { code: refusal.code.to_string(), message: refusal.message.trim_end_matches('.').to_string() }
    }
}

// ---------------------------------------------------------------------------------------
// Forms, queries, redirects

/// A form's fields, in order (repeated names kept).
#[derive(Debug, Default)]
pub(super) struct FormData(pub Vec<(String, String)>);

impl FormData {
    /// The field as typed (`""` when absent).
    pub fn raw(&self, name: &str) -> &str {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).unwrap_or_default()
    }

    /// The field without surrounding whitespace.
    pub fn text(&self, name: &str) -> &str {
        self.raw(name).trim()
    }
}

/// `%`-encode everything but ASCII letters, digits, `-`, `_` and `.`, for a query value or
/// a path segment.
pub(super) fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// A page's query, `None` when it does not read as one.
pub(super) fn query_of<T: DeserializeOwned>(uri: &Uri) -> Option<T> {
    Query::<T>::try_from_uri(uri).ok().map(|q| q.0)
}

/// `303 See Other` to a location built from encoded parts.
pub(super) fn redirect(location: &str) -> Response {
    match HeaderValue::from_str(location) {
        Ok(value) => (StatusCode::SEE_OTHER, [(header::LOCATION, value)]).into_response(),
        Err(_) => (StatusCode::SEE_OTHER, [(header::LOCATION, HeaderValue::from_static("/"))]).into_response(),
    }
}

/// A name from a query (`?name=`) shown in a banner: only what an inventory name may be
/// (a-z 0-9 -, at most 63), so a crafted link cannot put other words on the page.
pub(super) fn shown_name(name: Option<&str>) -> Option<String> {
    name.filter(|n| !n.is_empty() && n.len() <= 63 && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        .map(str::to_string)
}

// ---------------------------------------------------------------------------------------
// Values

/// `2025-01-31 13:45 UTC` and its RFC 3339 form, from milliseconds since the epoch.
pub(super) fn when(ms: u64) -> (String, String) {
    (utc(ms), rfc3339(ms))
}

pub(super) fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

pub(super) fn u64_of(value: &Value, key: &str) -> u64 {
    value.get(key).and_then(Value::as_u64).unwrap_or_default()
}

/// A number field as the method should get it: a number when it reads as one, else the text
/// (so the method's strict decoding refuses it by name).
pub(super) fn number(text: &str) -> Value {
    let text = text.trim();
    text.parse::<u64>().map(Value::from).unwrap_or_else(|_| Value::from(text))
}

/// A `key=value` pair, as the templates list them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(super) struct Pair {
    pub key: String,
    pub value: String,
}

pub(super) fn pairs_of(value: Option<&Value>) -> Vec<Pair> {
    value
        .and_then(Value::as_object)
        .map(|map| {
            map.iter()
                .map(|(k, v)| Pair { key: k.clone(), value: v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()) })
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn strings_of(value: Option<&Value>) -> Vec<String> {
    value.and_then(Value::as_array).map(|list| list.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

/// The non-empty lines of a text area, trimmed, with their 1-based line numbers.
fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().map(str::trim).enumerate().filter(|(_, l)| !l.is_empty()).map(|(i, l)| (i + 1, l))
}

fn shape(field: &str, line: usize, expected: &str) -> Refusal {
    Refusal::invalid_request(format!("{field}, line {line}: write {expected}")).with_data(json!({ "field": field }))
}

/// `KEY=value` lines to an object (labels, environment).
pub(super) fn parse_pairs(field: &str, text: &str, example: &str) -> Result<Map<String, Value>> {
    let mut map = Map::new();
    for (n, line) in lines(text) {
        let Some((key, value)) = line.split_once('=') else { return Err(shape(field, n, example)) };
        map.insert(key.trim().to_string(), Value::from(value.trim()));
    }
    Ok(map)
}

pub(super) fn format_pairs(pairs: &[Pair]) -> String {
    pairs.iter().map(|p| format!("{}={}\n", p.key, p.value)).collect()
}

/// A list typed one per line (or separated by commas or spaces): domains, mail addresses.
pub(super) fn parse_list(text: &str) -> Vec<Value> {
    text.split(|c: char| c == ',' || c.is_whitespace()).filter(|s| !s.is_empty()).map(Value::from).collect()
}

/// Ports, one per line, written the one way the CLI writes them too (Docker's
/// `published:target`, docs/inventory.md "Ports"): `443:8080/http`, `53/udp`, `9000`. A line that is
/// not a port is refused by the shared reader's code (`port-invalid`, `port-syntax-old` for
/// the former `8080/http:443` order) naming the field and the line.
pub(super) fn parse_ports(field: &str, text: &str) -> Result<Vec<Value>> {
    let mut ports = Vec::new();
    for (n, line) in lines(text) {
        let spec = port::parse(field, line).map_err(|refusal| Refusal { message: format!("line {n}: {}", refusal.message), ..refusal })?;
        ports.push(spec.to_json());
    }
    Ok(ports)
}

pub(super) fn format_ports(ports: Option<&Value>) -> Vec<String> {
    ports.and_then(Value::as_array).map(|list| list.iter().map(port::format).collect()).unwrap_or_default()
}

/// Volumes, one per line: `NAME:/mount/path`.
pub(super) fn parse_volumes(field: &str, text: &str) -> Result<Vec<Value>> {
    let mut volumes = Vec::new();
    for (n, line) in lines(text) {
        let Some((name, path)) = line.split_once(':') else { return Err(shape(field, n, "NAME:/mount/path, e.g. data:/var/lib/app")) };
        volumes.push(json!({ "name": name.trim(), "mountPath": path.trim() }));
    }
    Ok(volumes)
}

pub(super) fn format_volumes(volumes: Option<&Value>) -> Vec<String> {
    let Some(list) = volumes.and_then(Value::as_array) else { return Vec::new() };
    list.iter().map(|v| format!("{}:{}", str_of(v, "name"), str_of(v, "mountPath"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_text_becomes_the_methods_json() {
        let ports = parse_ports("ports", "443:8080/HTTP\n\n 53/udp \n9000").unwrap();
        assert_eq!(
            Value::from(ports),
            json!([
                {"port": 8080, "protocol": "http", "publicPort": 443},
                {"port": 53, "protocol": "udp"},
                {"port": 9000, "protocol": "tcp"},
            ])
        );
        let err = parse_ports("ports", "80\n:80").unwrap_err();
        assert_eq!((err.code.as_ref(), err.message.contains("line 2")), ("port-invalid", true), "{err}");
        assert_eq!(err.data.unwrap()["field"], "ports");
        let old = parse_ports("ports", "8080/http:443").unwrap_err();
        assert_eq!((old.code.as_ref(), old.message.contains("write 443:8080/http")), ("port-syntax-old", true), "{old}");
        assert!(parse_ports("ports", "abc/tcp").is_err());
        let back = format_ports(Some(&json!([{"port": 8080, "protocol": "http", "publicPort": 443}, {"port": 53, "protocol": "udp"}])));
        assert_eq!(back, ["443:8080/http", "53/udp"]);
        assert_eq!(
            parse_pairs("labels", "region=eu\nnote = a=b\n", "KEY=value").unwrap(),
            json!({"region": "eu", "note": "a=b"}).as_object().unwrap().clone()
        );
        assert_eq!(parse_pairs("labels", "region", "KEY=value").unwrap_err().data.unwrap()["field"], "labels");
        assert_eq!(parse_list("a.example, b.example\nc.example"), [json!("a.example"), json!("b.example"), json!("c.example")]);
        assert_eq!(Value::from(parse_volumes("volumes", "data:/var/lib/x").unwrap()), json!([{"name": "data", "mountPath": "/var/lib/x"}]));
        assert!(parse_volumes("volumes", "data").is_err());
        assert_eq!(number(" 3 "), json!(3));
        assert_eq!(number("three"), json!("three"));
    }

    #[test]
    fn names_and_ids_from_links_are_plain() {
        assert_eq!(shown_name(Some("eu-1")).as_deref(), Some("eu-1"));
        assert_eq!(shown_name(Some("<b>")), None);
        assert_eq!(encode("a b&c/d"), "a%20b%26c%2Fd");
    }
}
