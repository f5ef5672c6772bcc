//! `gateway` (contract 0.2.4): a plugin's request to the external gateway
//! (docs/gateway-protocol.md) under Capstan's enrolled client credential, which the plugin never
//! sees. The host checks the grant (`gateway:<scope>`: the paths that gateway scope covers,
//! [`capstan_core::gateway_scopes`]; `GET /v1/status`, the gateway's protocol number, to any
//! plugin granted at least one scope), the method, the path's shape and the body, gives the
//! request the plugin call's remaining time (less a margin, at most [`MAX_GATEWAY_TIMEOUT`]) and
//! hands it to the [`GatewayDispatch`] the server installed ([`Services::set_gateway_dispatch`]),
//! which adds the credential; until one is installed every request is refused
//! `gateway-not-enrolled`. Whatever status the gateway answers comes back as a response, except
//! 401 (the credential refused: `gateway-credential-refused`); the dispatcher's refusals pass
//! through by name. No body is logged; the token never reaches this side of the dispatcher.

use super::{CallData, Services, WitResult, read_only_refusal, refusal, timeout_within, to_wit};
use crate::manifest::Capability;
use crate::refusal::Refusal;
use crate::runtime::capstan::plugin::gateway;
use capstan_core::gateway_scopes::{self, METHODS};
use capstan_core::text::truncate;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest request body a plugin may send to the gateway, in bytes of JSON text.
pub const MAX_GATEWAY_REQUEST_BYTES: usize = 1 << 20;

/// Largest answer body the host passes back to a plugin, in bytes of JSON text (a dispatcher
/// reads no more than this of the gateway's answer).
pub const MAX_GATEWAY_REPLY_BYTES: usize = 1 << 20;

/// Longest path a plugin may ask for, in bytes (its query included).
pub const MAX_GATEWAY_PATH_BYTES: usize = 1024;

/// The longest a single gateway request may wait, whatever time the plugin call has left.
pub const MAX_GATEWAY_TIMEOUT: Duration = Duration::from_secs(15);

/// What the host keeps of the plugin call's remaining time for the plugin to finish after the
/// gateway answered (or the request timed out).
pub const GATEWAY_DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// One request a plugin makes of the gateway, checked by the host.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayRequest {
    /// The plugin that asks.
    pub plugin_id: String,
    /// `GET`, `PUT`, `POST` or `DELETE`.
    pub method: String,
    /// A path of the gateway's API (`/v1/routes/www.acme.example`, maybe with a query): one a
    /// scope granted to the plugin covers, in the shape the host checked (starts `/v1/`, at
    /// most [`MAX_GATEWAY_PATH_BYTES`], no dot segment, no `//`, no fragment).
    pub path: String,
    /// The JSON body, for `PUT` and `POST` only; at most [`MAX_GATEWAY_REQUEST_BYTES`] as text.
    pub body: Option<Value>,
    /// How long the dispatcher may wait for the answer: the plugin call's remaining time less
    /// [`GATEWAY_DEADLINE_MARGIN`], never more than [`MAX_GATEWAY_TIMEOUT`], never zero. One
    /// still waiting then is dropped and the plugin refused `gateway-unreachable` (retryable).
    pub timeout: Duration,
}

/// What the gateway answered: any status but 401, and the body when it was JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayResponse {
    /// The HTTP status.
    pub status: u16,
    /// The JSON body; `None` when the answer had none or it was not JSON.
    pub body: Option<Value>,
}

/// What [`GatewayDispatch::request`] answers: the gateway's response, or a refusal the plugin
/// receives by its code, message, retryability and data.
pub type GatewayReply = BoxFuture<'static, Result<GatewayResponse, Refusal>>;

/// How the `gateway` import reaches the external gateway with Capstan's enrolled client
/// credential; the server provides it and installs it with [`Services::set_gateway_dispatch`]
/// (or [`crate::host::PluginHost::set_gateway_dispatch`]).
pub trait GatewayDispatch: Send + Sync + 'static {
    /// Send `request` with the credential and answer the gateway's status and JSON body within
    /// `request.timeout`, reading at most [`MAX_GATEWAY_REPLY_BYTES`] of it. Refusals:
    /// `gateway-not-enrolled`, `gateway-unreachable` (retryable), `gateway-credential-refused`
    /// (the gateway answered 401), `gateway-reply-too-large`. Neither the credential nor a body
    /// may appear in a refusal or a log line.
    fn request(&self, request: GatewayRequest) -> GatewayReply;
}

/// The dispatcher of a host that holds no gateway credential (or has not installed one yet):
/// every request is refused `gateway-not-enrolled`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NotEnrolled;

impl GatewayDispatch for NotEnrolled {
    fn request(&self, _request: GatewayRequest) -> GatewayReply {
        let refused = Refusal::new(
            "gateway-not-enrolled",
            "Capstan holds no gateway credential yet; an administrator bootstraps one (capstan gateway bootstrap)",
        );
        Box::pin(async move { Err(refused) })
    }
}

/// The `gateway` provider: the gateway scopes granted (`gateway:<scope>`), and whichever
/// dispatcher the services hold at call time.
#[derive(Clone)]
pub(super) struct Gateway {
    services: Arc<Services>,
    plugin: String,
    scopes: Arc<BTreeSet<String>>,
}

impl Gateway {
    /// The provider when `grants` name at least one gateway scope.
    pub(super) fn new(services: &Arc<Services>, plugin: &str, grants: &BTreeSet<Capability>) -> Option<Self> {
        let scopes: BTreeSet<String> = grants
            .iter()
            .filter_map(|grant| match grant {
                Capability::Gateway(scope) => Some(scope.clone()),
                _ => None,
            })
            .collect();
        (!scopes.is_empty()).then(|| Gateway { services: services.clone(), plugin: plugin.to_string(), scopes: Arc::new(scopes) })
    }
}

impl gateway::Host for CallData {
    async fn request(&mut self, method: String, path: String, body: Option<String>) -> WitResult<gateway::Response> {
        // without any gateway scope (or in `describe`) the refusal names the scope the request
        // needs; which granted scope covers what is checked with the request
        let needed = gateway_scopes::covering(&method, &path).map_or("<scope>", |scope| scope.name);
        let provider = self.granted(&self.grant.gateway, Capability::Gateway(needed.to_string()))?;
        if let Some(body) = &body {
            self.budget.fits(body.len(), "the gateway request body")?;
        }
        let asking = Asking {
            plugin: &provider.plugin,
            request_id: &self.request_id,
            scopes: &provider.scopes,
            read_only: self.read_only,
            deadline: self.deadline,
        };
        let dispatch = provider.services.gateway_dispatch();
        request(dispatch.as_ref(), &asking, method, path, body.as_deref()).await
    }
}

/// Who asks, with what: the facts of the plugin call a request is checked against.
pub(super) struct Asking<'a> {
    plugin: &'a str,
    request_id: &'a str,
    /// The gateway scopes granted.
    scopes: &'a BTreeSet<String>,
    /// A method declared read-only is running: only GET goes.
    read_only: bool,
    /// When the plugin call ends (`None`: not known, so the cap).
    deadline: Option<Instant>,
}

/// Check one `gateway.request`, hand it to `dispatch` with the time the call has left, and
/// bound the answer.
pub(super) async fn request(
    dispatch: &dyn GatewayDispatch,
    asking: &Asking<'_>,
    method: String,
    path: String,
    body: Option<&str>,
) -> WitResult<gateway::Response> {
    let plugin = asking.plugin;
    if asking.read_only && method != "GET" {
        return Err(read_only_refusal(plugin, asking.request_id));
    }
    if !METHODS.contains(&method.as_str()) {
        return Err(refusal(
            "invalid-request",
            format!("gateway method {:?} must be one of {}", truncate(&method, 16), METHODS.join(", ")),
            json!({ "field": "method" }),
        ));
    }
    check_path(&path)?;
    check_scope(asking, &method, &path)?;
    let body = match body {
        None => None,
        Some(_) if method == "GET" || method == "DELETE" => {
            return Err(refusal("invalid-request", format!("a gateway {method} carries no body"), json!({ "field": "body" })));
        }
        Some(text) if text.len() > MAX_GATEWAY_REQUEST_BYTES => {
            return Err(refusal(
                "gateway-request-too-large",
                format!("the request body is {} bytes; a gateway request carries at most {MAX_GATEWAY_REQUEST_BYTES}", text.len()),
                json!({ "limitBytes": MAX_GATEWAY_REQUEST_BYTES, "bytes": text.len() }),
            ));
        }
        Some(text) => Some(
            serde_json::from_str::<Value>(text)
                .map_err(|e| refusal("invalid-request", format!("the request body is not valid JSON: {e}"), json!({ "field": "body" })))?,
        ),
    };
    let timeout = timeout_within(asking.deadline, Instant::now(), GATEWAY_DEADLINE_MARGIN, MAX_GATEWAY_TIMEOUT).ok_or_else(|| {
        refusal(
            "plugin-deadline-exceeded",
            format!("plugin {plugin} has no time left for a request to the gateway"),
            json!({ "plugin": plugin, "marginMs": GATEWAY_DEADLINE_MARGIN.as_millis() as u64 }),
        )
    })?;
    let started = Instant::now();
    let asked = GatewayRequest { plugin_id: plugin.to_string(), method: method.clone(), path: path.clone(), body, timeout };
    // the dispatcher is asked to keep to the timeout; the host holds it to it
    let answered = match tokio::time::timeout(timeout, dispatch.request(asked)).await {
        Ok(answered) => answered,
        Err(_) => Err(Refusal::new(
            "gateway-unreachable",
            format!("the gateway did not answer {method} {} within {} ms", truncate(&path, 128), timeout.as_millis()),
        )
        .retryable()
        .with_data(json!({ "timeoutMs": timeout.as_millis() as u64 }))),
    };
    let ms = started.elapsed().as_millis() as u64;
    let response = match answered {
        // a dispatcher should have refused it; the credential is not the plugin's to see refused
        Ok(response) if response.status == 401 => Err(credential_refused()),
        Ok(response) => Ok(response),
        Err(refused) => Err(refused),
    };
    let response = match response {
        Ok(response) => response,
        Err(refused) => {
            tracing::debug!(plugin = %plugin, request_id = %asking.request_id, method = %method, path = %truncate(&path, 256), ms,
                code = %refused.code, "gateway request refused");
            return Err(to_wit(refused));
        }
    };
    let text = response.body.as_ref().map(Value::to_string);
    let bytes = text.as_ref().map_or(0, String::len);
    tracing::debug!(plugin = %plugin, request_id = %asking.request_id, method = %method, path = %truncate(&path, 256), ms,
        status = response.status, bytes, "gateway request answered");
    if bytes > MAX_GATEWAY_REPLY_BYTES {
        tracing::warn!(plugin = %plugin, request_id = %asking.request_id, method = %method, path = %truncate(&path, 256), bytes,
            "the gateway answered more than a plugin is passed");
        return Err(reply_too_large(bytes));
    }
    Ok(gateway::Response { status: response.status, body: text })
}

/// `gateway-credential-refused`: the gateway answered 401 to Capstan's credential.
fn credential_refused() -> Refusal {
    Refusal::new(
        "gateway-credential-refused",
        "the gateway does not accept Capstan's client credential; an administrator bootstraps a new one (capstan gateway bootstrap)",
    )
}

/// `gateway-reply-too-large`: the gateway's answer was `bytes` long (at least).
fn reply_too_large(bytes: usize) -> super::types::Refusal {
    refusal(
        "gateway-reply-too-large",
        format!("the gateway's answer is {bytes} bytes; a plugin is passed at most {MAX_GATEWAY_REPLY_BYTES}"),
        json!({ "limitBytes": MAX_GATEWAY_REPLY_BYTES, "bytes": bytes }),
    )
}

/// `capability-denied`, logged, unless a granted scope covers `method` on `path`, or it is
/// `GET /v1/status` ([`gateway_scopes::open_to_any_scope`]) and some scope is granted.
fn check_scope(asking: &Asking<'_>, method: &str, path: &str) -> WitResult<()> {
    let scope = gateway_scopes::covering(method, path);
    if scope.is_some_and(|scope| asking.scopes.contains(scope.name)) {
        return Ok(());
    }
    let open = gateway_scopes::open_to_any_scope(method, path);
    if open && !asking.scopes.is_empty() {
        return Ok(());
    }
    let shown = truncate(path, 128);
    let (message, data) = match scope {
        Some(scope) => (
            format!("plugin {} was not granted gateway:{}, which {method} {shown} needs", asking.plugin, scope.name),
            json!({ "capability": format!("gateway:{}", scope.name) }),
        ),
        None if open => (
            format!("plugin {} was granted no gateway scope; {method} {shown} needs any one", asking.plugin),
            json!({ "capability": "gateway:<scope>" }),
        ),
        None => (
            format!("no gateway scope covers {method} {shown}: a plugin reaches only the paths of the gateway scopes it is granted"),
            json!({ "method": method, "path": shown }),
        ),
    };
    tracing::warn!(plugin = %asking.plugin, request_id = %asking.request_id, method = %method, path = %shown,
        scope = scope.map_or("none", |s| s.name), "plugin asked the gateway for a request no granted scope covers");
    Err(refusal("capability-denied", message, data))
}

/// `gateway-path-invalid` unless `path` is in the shape a gateway path may take: it starts with
/// `/v1/`, is at most [`MAX_GATEWAY_PATH_BYTES`], holds only unreserved and sub-delimiter
/// characters, `%` escapes, `/` and `?`, and has no `.` or `..` segment (escaped or not), no
/// escaped `/`, `\` or NUL, no `//` and no fragment.
fn check_path(path: &str) -> WitResult<()> {
    match path_problem(path) {
        None => Ok(()),
        Some(why) => Err(refusal(
            "gateway-path-invalid",
            format!("gateway path {:?} {why}", truncate(path, 128)),
            json!({ "path": truncate(path, 128), "limitBytes": MAX_GATEWAY_PATH_BYTES }),
        )),
    }
}

fn path_problem(path: &str) -> Option<&'static str> {
    if path.len() > MAX_GATEWAY_PATH_BYTES {
        return Some("is longer than 1024 bytes");
    }
    if !path.starts_with("/v1/") {
        return Some("must start with /v1/");
    }
    if path.contains('#') {
        return Some("must not carry a fragment (#)");
    }
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=%/?".contains(&b);
    if !path.bytes().all(allowed) {
        return Some("may hold only A-Z a-z 0-9 - . _ ~ ! $ & ' ( ) * + , ; = % / ?");
    }
    let bytes = path.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%' && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit) && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit)) {
            return Some("has a % that does not start an escape of two hex digits");
        }
    }
    if path.contains("//") {
        return Some("must not hold an empty segment (//)");
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%00") {
        return Some("must not hold an escaped NUL");
    }
    let (route, _query) = lower.split_once('?').unwrap_or((&lower, ""));
    if route.contains("%2f") || route.contains("%5c") {
        return Some("must not escape / or \\ in its path");
    }
    if route.split('/').any(|segment| matches!(segment.replace("%2e", ".").as_str(), "." | "..")) {
        return Some("must not hold a . or .. segment");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::capstan::plugin::types::Refusal as WitRefusal;
    use std::sync::Mutex;

    /// Records what it was asked and answers what it was given.
    struct Fake {
        asked: Mutex<Vec<GatewayRequest>>,
        answer: Result<GatewayResponse, Refusal>,
    }

    impl Fake {
        fn answering(answer: Result<GatewayResponse, Refusal>) -> Arc<Fake> {
            Arc::new(Fake { asked: Mutex::new(vec![]), answer })
        }
        fn ok() -> Arc<Fake> {
            Fake::answering(Ok(GatewayResponse { status: 200, body: Some(json!({ "ok": true })) }))
        }
        fn asked(&self) -> Vec<GatewayRequest> {
            self.asked.lock().unwrap().clone()
        }
    }

    impl GatewayDispatch for Fake {
        fn request(&self, request: GatewayRequest) -> GatewayReply {
            self.asked.lock().unwrap().push(request);
            let answer = self.answer.clone();
            Box::pin(async move { answer })
        }
    }

    fn soon() -> Option<Instant> {
        Some(Instant::now() + Duration::from_secs(6))
    }

    fn every_scope() -> BTreeSet<String> {
        gateway_scopes::NAMES.iter().map(|s| s.to_string()).collect()
    }

    struct Ask {
        scopes: BTreeSet<String>,
        read_only: bool,
        deadline: Option<Instant>,
    }

    impl Ask {
        fn new() -> Ask {
            Ask { scopes: every_scope(), read_only: false, deadline: soon() }
        }
        fn scopes(mut self, scopes: &[&str]) -> Ask {
            self.scopes = scopes.iter().map(|s| s.to_string()).collect();
            self
        }
        fn read_only(mut self) -> Ask {
            self.read_only = true;
            self
        }
        fn deadline(mut self, deadline: Option<Instant>) -> Ask {
            self.deadline = deadline;
            self
        }
        async fn send(
            &self,
            dispatch: &dyn GatewayDispatch,
            method: &str,
            path: &str,
            body: Option<&str>,
        ) -> Result<gateway::Response, WitRefusal> {
            let asking =
                Asking { plugin: "ingress", request_id: "req-1", scopes: &self.scopes, read_only: self.read_only, deadline: self.deadline };
            request(dispatch, &asking, method.into(), path.into(), body).await
        }
    }

    fn data(r: &WitRefusal) -> Value {
        serde_json::from_str(r.data.as_deref().unwrap_or("null")).unwrap()
    }

    #[tokio::test]
    async fn a_checked_request_reaches_the_dispatcher_and_its_answer_comes_back() {
        let fake = Fake::ok();
        let answer = Ask::new().send(fake.as_ref(), "PUT", "/v1/routes/www.acme.example", Some(r#"{"target":"a"}"#)).await.unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(serde_json::from_str::<Value>(answer.body.as_deref().unwrap()).unwrap(), json!({ "ok": true }));
        let asked = fake.asked();
        assert_eq!(asked.len(), 1);
        let request = &asked[0];
        assert_eq!(
            (request.plugin_id.as_str(), request.method.as_str(), request.path.as_str(), &request.body),
            ("ingress", "PUT", "/v1/routes/www.acme.example", &Some(json!({ "target": "a" })))
        );
        // within what the call has left, less the margin
        assert!(request.timeout <= Duration::from_secs(6) - GATEWAY_DEADLINE_MARGIN, "{:?}", request.timeout);
        assert!(request.timeout > Duration::from_secs(5), "{:?}", request.timeout);
        // a GET with a query, a POST without a body
        Ask::new().send(fake.as_ref(), "GET", "/v1/smtp-credentials?prefix=capstan.svc_1", None).await.unwrap();
        Ask::new().send(fake.as_ref(), "POST", "/v1/smtp-credentials/c1/rotate", None).await.unwrap();
        assert_eq!(fake.asked()[2].body, None);
    }

    #[tokio::test]
    async fn the_timeout_is_capped_and_no_time_left_is_refused_before_the_dispatcher() {
        let fake = Fake::ok();
        Ask::new().deadline(Some(Instant::now() + Duration::from_secs(300))).send(fake.as_ref(), "GET", "/v1/domains", None).await.unwrap();
        Ask::new().deadline(None).send(fake.as_ref(), "GET", "/v1/domains", None).await.unwrap();
        assert!(fake.asked().iter().all(|r| r.timeout == MAX_GATEWAY_TIMEOUT));

        let fake = Fake::ok();
        for deadline in [Instant::now(), Instant::now() + GATEWAY_DEADLINE_MARGIN / 2] {
            let refused = Ask::new().deadline(Some(deadline)).send(fake.as_ref(), "GET", "/v1/domains", None).await.unwrap_err();
            assert_eq!((refused.code.as_str(), refused.retryable), ("plugin-deadline-exceeded", false));
        }
        assert!(fake.asked().is_empty());
    }

    #[tokio::test]
    async fn bad_requests_are_refused_by_name_before_the_dispatcher() {
        let fake = Fake::ok();
        let long = format!("/v1/routes/{}", "a".repeat(MAX_GATEWAY_PATH_BYTES));
        let cases: &[(&str, &str, Option<&str>, &str)] = &[
            ("PATCH", "/v1/routes/a", None, "invalid-request"),
            ("get", "/v1/domains", None, "invalid-request"),
            ("", "/v1/domains", None, "invalid-request"),
            ("GET", "", None, "gateway-path-invalid"),
            ("GET", "/v2/domains", None, "gateway-path-invalid"),
            ("GET", "v1/domains", None, "gateway-path-invalid"),
            ("GET", "https://gateway.example/v1/domains", None, "gateway-path-invalid"),
            ("GET", &long, None, "gateway-path-invalid"),
            ("PUT", "/v1/routes/../clients/capstan/credentials", None, "gateway-path-invalid"),
            ("PUT", "/v1/routes/%2e%2E", None, "gateway-path-invalid"),
            ("PUT", "/v1/routes/./a", None, "gateway-path-invalid"),
            ("PUT", "/v1/routes/a%2Fb", None, "gateway-path-invalid"),
            ("PUT", "/v1/routes/a%5cb", None, "gateway-path-invalid"),
            ("PUT", "/v1/routes/a%00", None, "gateway-path-invalid"),
            ("PUT", "/v1/routes/a%zz", None, "gateway-path-invalid"),
            ("PUT", "/v1/routes/a%2", None, "gateway-path-invalid"),
            ("PUT", "/v1//routes/a", None, "gateway-path-invalid"),
            ("GET", "/v1/domains#x", None, "gateway-path-invalid"),
            ("GET", "/v1/domains ", None, "gateway-path-invalid"),
            ("GET", "/v1/domains\n", None, "gateway-path-invalid"),
            ("GET", "/v1/certificates/a@b", None, "gateway-path-invalid"),
            ("GET", "/v1/certificates/é", None, "gateway-path-invalid"),
            ("PUT", "/v1/routes/a", Some("{not json"), "invalid-request"),
            ("PUT", "/v1/routes/a", Some(""), "invalid-request"),
            ("GET", "/v1/domains", Some("{}"), "invalid-request"),
            ("DELETE", "/v1/routes/a", Some("{}"), "invalid-request"),
        ];
        for (method, path, body, code) in cases {
            let refused = Ask::new().send(fake.as_ref(), method, path, *body).await.unwrap_err();
            assert_eq!(refused.code, *code, "{method:?} {path:?} {body:?}");
        }
        assert!(fake.asked().is_empty());
        // what the shape allows
        for path in ["/v1/routes/www.acme.example", "/v1/routes/a..b", "/v1/routes/%2e%2ex", "/v1/routes/a~b_c-d!$&'()*+,;=%41"] {
            Ask::new().send(fake.as_ref(), "PUT", path, Some("{}")).await.unwrap();
        }
        let at_limit = format!("/v1/routes/{}", "a".repeat(MAX_GATEWAY_PATH_BYTES - "/v1/routes/".len()));
        Ask::new().send(fake.as_ref(), "DELETE", &at_limit, None).await.unwrap();
        assert_eq!(fake.asked().len(), 5);
    }

    #[tokio::test]
    async fn a_scope_not_granted_is_capability_denied_naming_it_before_the_dispatcher() {
        let fake = Fake::ok();
        let ask = Ask::new().scopes(&["domains:read"]);
        ask.send(fake.as_ref(), "GET", "/v1/domains", None).await.unwrap();
        let refused = ask.send(fake.as_ref(), "PUT", "/v1/routes/www.acme.example", Some("{}")).await.unwrap_err();
        assert_eq!((refused.code.as_str(), refused.retryable), ("capability-denied", false));
        assert_eq!(data(&refused)["capability"], "gateway:routes:write");
        assert!(refused.message.contains("gateway:routes:write"), "{}", refused.message);
        // a read scope does not write its paths
        let ask = Ask::new().scopes(&["certificates:read"]);
        ask.send(fake.as_ref(), "GET", "/v1/certificates/www.acme.example", None).await.unwrap();
        let refused = ask.send(fake.as_ref(), "DELETE", "/v1/certificates/www.acme.example", None).await.unwrap_err();
        assert_eq!(refused.code, "capability-denied");
        // enrollment is the host's alone, whatever is granted
        for (method, path) in [("GET", "/v1/whoami"), ("POST", "/v1/clients/capstan/credentials"), ("POST", "/v1/client/finalize")] {
            let refused = Ask::new().send(fake.as_ref(), method, path, None).await.unwrap_err();
            assert_eq!(refused.code, "capability-denied", "{method} {path}");
            assert_eq!(data(&refused)["path"], path);
        }
        assert_eq!(fake.asked().len(), 2);
    }

    #[tokio::test]
    async fn the_status_is_open_to_any_one_scope_for_get_only() {
        let fake = Fake::answering(Ok(GatewayResponse { status: 200, body: Some(json!({ "protocol": 1 })) }));
        // granted one scope, whichever: dispatched, in a read-only method too
        for scope in ["smtp:write", "domains:read"] {
            let answer = Ask::new().scopes(&[scope]).send(fake.as_ref(), "GET", "/v1/status", None).await.unwrap();
            assert_eq!((answer.status, answer.body.as_deref()), (200, Some(r#"{"protocol":1}"#)), "{scope}");
        }
        Ask::new().scopes(&["peers:write"]).read_only().send(fake.as_ref(), "GET", "/v1/status", None).await.unwrap();
        assert_eq!(fake.asked().len(), 3);
        assert!(fake.asked().iter().all(|r| (r.method.as_str(), r.path.as_str(), &r.body) == ("GET", "/v1/status", &None)));
        // no gateway grant: denied, naming that any scope would do
        let refused = Ask::new().scopes(&[]).send(fake.as_ref(), "GET", "/v1/status", None).await.unwrap_err();
        assert_eq!((refused.code.as_str(), refused.retryable), ("capability-denied", false));
        assert_eq!(data(&refused)["capability"], "gateway:<scope>");
        // anything but GET of exactly the status is still refused, whatever is granted
        for (method, path, body) in [
            ("PUT", "/v1/status", Some("{}")),
            ("POST", "/v1/status", Some("{}")),
            ("DELETE", "/v1/status", None),
            ("GET", "/v1/status?verbose=1", None),
            ("GET", "/v1/status/x", None),
        ] {
            let refused = Ask::new().send(fake.as_ref(), method, path, body).await.unwrap_err();
            assert_eq!(refused.code, "capability-denied", "{method} {path}");
            assert_eq!(data(&refused)["path"], path, "{method} {path}");
        }
        assert_eq!(fake.asked().len(), 3);
    }

    #[tokio::test]
    async fn a_read_only_method_may_get_and_nothing_else() {
        let fake = Fake::ok();
        let ask = Ask::new().read_only();
        ask.send(fake.as_ref(), "GET", "/v1/routes/www.acme.example", None).await.unwrap();
        for (method, body) in [("PUT", Some("{}")), ("POST", Some("{}")), ("DELETE", None)] {
            let refused = ask.send(fake.as_ref(), method, "/v1/routes/www.acme.example", body).await.unwrap_err();
            assert_eq!(refused.code, "read-only-method", "{method}");
        }
        assert_eq!(fake.asked().len(), 1);
    }

    #[tokio::test]
    async fn an_oversized_body_is_refused_with_the_limit_before_the_dispatcher() {
        let fake = Fake::ok();
        let body = format!("\"{}\"", "x".repeat(MAX_GATEWAY_REQUEST_BYTES));
        let refused = Ask::new().send(fake.as_ref(), "PUT", "/v1/routes/a", Some(&body)).await.unwrap_err();
        assert_eq!(refused.code, "gateway-request-too-large");
        assert_eq!(data(&refused)["limitBytes"], MAX_GATEWAY_REQUEST_BYTES);
        assert!(fake.asked().is_empty());
        // exactly at the limit passes
        let body = format!("\"{}\"", "x".repeat(MAX_GATEWAY_REQUEST_BYTES - 2));
        Ask::new().send(fake.as_ref(), "PUT", "/v1/routes/a", Some(&body)).await.unwrap();
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused() {
        let fake = Fake::answering(Ok(GatewayResponse { status: 200, body: Some(Value::String("x".repeat(MAX_GATEWAY_REPLY_BYTES))) }));
        let refused = Ask::new().send(fake.as_ref(), "GET", "/v1/domains", None).await.unwrap_err();
        assert_eq!(refused.code, "gateway-reply-too-large");
        assert_eq!(data(&refused)["limitBytes"], MAX_GATEWAY_REPLY_BYTES);
    }

    #[tokio::test]
    async fn a_status_is_a_response_but_401_is_the_credential_refused() {
        let not_found = json!({ "error": { "code": "route-unknown", "message": "no such route" } });
        let fake = Fake::answering(Ok(GatewayResponse { status: 404, body: Some(not_found.clone()) }));
        let answer = Ask::new().send(fake.as_ref(), "GET", "/v1/routes/a", None).await.unwrap();
        assert_eq!(answer.status, 404);
        assert_eq!(serde_json::from_str::<Value>(answer.body.as_deref().unwrap()).unwrap(), not_found);

        let fake = Fake::answering(Ok(GatewayResponse { status: 204, body: None }));
        let answer = Ask::new().send(fake.as_ref(), "DELETE", "/v1/routes/a", None).await.unwrap();
        assert_eq!((answer.status, answer.body), (204, None));

        let fake = Fake::answering(Ok(GatewayResponse { status: 401, body: Some(json!({ "error": { "code": "unauthorized" } })) }));
        let refused = Ask::new().send(fake.as_ref(), "GET", "/v1/routes/a", None).await.unwrap_err();
        assert_eq!(refused.code, "gateway-credential-refused");
    }

    #[tokio::test]
    async fn the_dispatchers_refusals_pass_through_by_name_with_retryable_and_data() {
        let refused = Refusal::new("gateway-unreachable", "the gateway could not be reached: connection failed")
            .retryable()
            .with_data(json!({ "sent": false }));
        let fake = Fake::answering(Err(refused));
        let got = Ask::new().send(fake.as_ref(), "GET", "/v1/domains", None).await.unwrap_err();
        assert_eq!((got.code.as_str(), got.retryable), ("gateway-unreachable", true));
        assert_eq!(got.message, "the gateway could not be reached: connection failed");
        assert_eq!(data(&got), json!({ "sent": false }));

        let fake = Fake::answering(Err(credential_refused()));
        let got = Ask::new().send(fake.as_ref(), "GET", "/v1/domains", None).await.unwrap_err();
        assert_eq!((got.code.as_str(), got.retryable), ("gateway-credential-refused", false));
    }

    /// Never answers.
    struct Silent;

    impl GatewayDispatch for Silent {
        fn request(&self, _request: GatewayRequest) -> GatewayReply {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test]
    async fn a_dispatcher_that_outlasts_the_timeout_is_refused_unreachable_within_the_deadline() {
        let deadline = Instant::now() + GATEWAY_DEADLINE_MARGIN + Duration::from_millis(200);
        let got = Ask::new().deadline(Some(deadline)).send(&Silent, "GET", "/v1/domains", None).await.unwrap_err();
        assert_eq!((got.code.as_str(), got.retryable), ("gateway-unreachable", true));
        assert!(Instant::now() < deadline, "the plugin still has time to answer");
    }

    #[tokio::test]
    async fn without_a_dispatcher_every_request_is_not_enrolled() {
        let got = Ask::new().send(&NotEnrolled, "GET", "/v1/domains", None).await.unwrap_err();
        assert_eq!((got.code.as_str(), got.retryable), ("gateway-not-enrolled", false));
    }
}
