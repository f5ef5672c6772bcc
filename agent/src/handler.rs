//! What the relay answers: request handlers and their registry.
//!
//! The host reaches the cluster's relay with `request` frames (`{id, method, body,
//! deadlineMs}`, docs/relays.md); each method is one [`Handler`] in a [`Registry`]. The
//! built-ins (`agent.ping`, `agent.describe`) are handlers like any other, so a later manager
//! (backups, ingress) adds its methods the same way: implement [`Handler`] and
//! [`Registry::add`] it before the relay starts. A method nobody registered is refused
//! `agent-method-unknown`, naming what is answered.

use capstan_core::Refusal;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a handler's work comes to: the reply's `result`, or its `error`.
pub type Answer<'a> = Pin<Box<dyn Future<Output = Result<Value, Refusal>> + Send + 'a>>;

/// One method the relay answers.
///
/// Requests run concurrently, each on a task of its own; a handler that is still running when
/// the request's `deadlineMs` passes is dropped (the host no longer waits for it), so a
/// handler must leave nothing half-done across an `.await`.
pub trait Handler: Send + Sync {
    /// The method's name, `<area>.<verb>` (`agent.ping`).
    fn method(&self) -> &'static str;
    /// Answer one request. `body` is the request's body (`{}` when absent); a refusal becomes
    /// the reply's `error` (its `detail` stays in the log).
    fn handle<'a>(&'a self, ctx: &'a RelayContext, body: Value) -> Answer<'a>;
}

/// What a handler knows of the relay's session.
#[derive(Debug)]
pub struct RelayContext {
    /// The enrolled node the relay runs on.
    pub node_id: String,
    /// The cluster the host verified the relay's bearer for (the welcome's `relay.clusterId`).
    pub cluster_id: String,
    /// The relay's version.
    pub version: &'static str,
    /// Every method answered, sorted.
    pub methods: Vec<String>,
    config_digest: Mutex<Option<String>>,
}

impl RelayContext {
    /// A context for one session.
    pub fn new(node_id: String, cluster_id: String, methods: Vec<String>, config_digest: Option<String>) -> RelayContext {
        RelayContext { node_id, cluster_id, version: env!("CARGO_PKG_VERSION"), methods, config_digest: Mutex::new(config_digest) }
    }

    /// The digest of the configuration last applied, if any.
    pub fn config_digest(&self) -> Option<String> {
        self.config_digest.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// Note a newly applied configuration.
    pub fn set_config_digest(&self, digest: String) {
        if let Ok(mut held) = self.config_digest.lock() {
            *held = Some(digest);
        }
    }
}

/// The methods the relay answers, by name.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: BTreeMap<&'static str, Arc<dyn Handler>>,
}

/// A request that names no deadline runs at most this long.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// Nor does any request run longer than this.
const MAX_DEADLINE: Duration = Duration::from_secs(600);

/// `{"type":"reply","id",…,"result"|"error"}`; an answer over the socket's frame limit is
/// replaced by `agent-reply-too-large`.
pub fn reply_frame(id: &Value, answer: Result<Value, Refusal>, max_frame_bytes: usize) -> String {
    let frame = match &answer {
        Ok(result) => json!({"type": "reply", "id": id, "result": result}),
        Err(refusal) => json!({"type": "reply", "id": id, "error": refusal}),
    };
    let text = frame.to_string();
    if text.len() <= max_frame_bytes {
        return text;
    }
    let refusal = Refusal::new("agent-reply-too-large", "the answer is larger than the socket's frame limit")
        .with_data(json!({ "limitBytes": max_frame_bytes, "bytes": text.len() }));
    json!({"type": "reply", "id": id, "error": refusal}).to_string()
}

impl Registry {
    /// The work of answering one `request` frame (`{id, method, body, deadlineMs}`), to run on a
    /// task of its own: the `reply` frame's text, or `None` when the handler outlived the
    /// request's deadline (the host no longer waits; nothing is sent). `None` at once for a
    /// request without a usable id, which nothing could answer.
    pub fn answer(&self, ctx: Arc<RelayContext>, frame: &Value, max_frame_bytes: usize) -> Option<BoxFuture<'static, Option<String>>> {
        let id = frame["id"].clone();
        if !(id.is_string() || id.is_u64() || id.is_i64()) {
            tracing::warn!("a request without a usable id was ignored");
            return None;
        }
        let Some(method) = frame["method"].as_str() else {
            let refusal = Refusal::new("agent-request-invalid", "the request names no method");
            let reply = reply_frame(&id, Err(refusal), max_frame_bytes);
            return Some(Box::pin(async move { Some(reply) }));
        };
        let body = match &frame["body"] {
            Value::Null => json!({}),
            body => body.clone(),
        };
        let deadline = frame["deadlineMs"].as_u64().map(Duration::from_millis).unwrap_or(DEFAULT_DEADLINE).min(MAX_DEADLINE);
        let method = method.to_string();
        let handler = self.get(&method);
        let registry = self.clone();
        Some(Box::pin(async move {
            let answer = match handler {
                None => Err(registry.unknown(&method)),
                Some(handler) => match tokio::time::timeout(deadline, handler.handle(&ctx, body)).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        tracing::warn!(method = %capstan_core::text::escape_control(&method), deadline_ms = deadline.as_millis() as u64, "a request outlived its deadline; abandoned");
                        return None;
                    }
                },
            };
            if let Err(refusal) = &answer
                && let Some(detail) = &refusal.detail
            {
                tracing::warn!(code = %refusal.code, "a request failed: {detail}");
            }
            Some(reply_frame(&id, answer, max_frame_bytes))
        }))
    }

    /// A registry holding the built-ins (`agent.ping`, `agent.describe`).
    pub fn with_builtins() -> Registry {
        let mut registry = Registry::default();
        for handler in [Arc::new(Ping) as Arc<dyn Handler>, Arc::new(Describe)] {
            // the built-ins' names are distinct: this cannot refuse
            let _ = registry.add(handler);
        }
        registry
    }

    /// Add a handler; a second handler for a method is refused `relay-handler-duplicate`.
    pub fn add(&mut self, handler: Arc<dyn Handler>) -> Result<(), Refusal> {
        let method = handler.method();
        if self.handlers.contains_key(method) {
            return Err(Refusal::new("relay-handler-duplicate", format!("a handler for {method} is already registered"))
                .with_data(json!({ "method": method })));
        }
        self.handlers.insert(method, handler);
        Ok(())
    }

    /// The handler for `method`.
    pub fn get(&self, method: &str) -> Option<Arc<dyn Handler>> {
        self.handlers.get(method).cloned()
    }

    /// Every method answered, sorted.
    pub fn methods(&self) -> Vec<String> {
        self.handlers.keys().map(|m| m.to_string()).collect()
    }

    /// `agent-method-unknown`, naming what is answered.
    pub fn unknown(&self, method: &str) -> Refusal {
        Refusal::new(
            "agent-method-unknown",
            format!("this relay answers no method {:?}", capstan_core::text::escape_control(&capstan_core::text::truncate(method, 128))),
        )
        .with_data(json!({ "methods": self.methods() }))
    }
}

/// `agent.ping` → `{pong: true, nodeId, at}` (`at`: this machine's clock, ms).
pub struct Ping;

impl Handler for Ping {
    fn method(&self) -> &'static str {
        "agent.ping"
    }

    fn handle<'a>(&'a self, ctx: &'a RelayContext, _body: Value) -> Answer<'a> {
        Box::pin(async move { Ok(json!({ "pong": true, "nodeId": ctx.node_id, "at": capstan_core::clock::now_ms() })) })
    }
}

/// `agent.describe` → `{nodeId, clusterId, version, methods, configDigest}`.
pub struct Describe;

impl Handler for Describe {
    fn method(&self) -> &'static str {
        "agent.describe"
    }

    fn handle<'a>(&'a self, ctx: &'a RelayContext, _body: Value) -> Answer<'a> {
        Box::pin(async move {
            Ok(json!({
                "nodeId": ctx.node_id,
                "clusterId": ctx.cluster_id,
                "version": ctx.version,
                "methods": ctx.methods,
                "configDigest": ctx.config_digest(),
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;

    impl Handler for Echo {
        fn method(&self) -> &'static str {
            "backups.echo"
        }

        fn handle<'a>(&'a self, _ctx: &'a RelayContext, body: Value) -> Answer<'a> {
            Box::pin(async move { Ok(body) })
        }
    }

    #[tokio::test]
    async fn the_builtins_are_handlers_and_more_can_be_added_once() {
        let mut registry = Registry::with_builtins();
        assert_eq!(registry.methods(), ["agent.describe", "agent.ping"]);
        registry.add(Arc::new(Echo)).unwrap();
        assert_eq!(registry.add(Arc::new(Echo)).unwrap_err().code, "relay-handler-duplicate");
        assert_eq!(registry.methods(), ["agent.describe", "agent.ping", "backups.echo"]);

        let ctx = RelayContext::new("node_1".into(), "cls_1".into(), registry.methods(), None);
        let pong = registry.get("agent.ping").unwrap().handle(&ctx, json!({})).await.unwrap();
        assert_eq!((pong["pong"].clone(), pong["nodeId"].clone()), (json!(true), json!("node_1")));
        assert!(pong["at"].as_u64().unwrap() > 1_700_000_000_000);
        let described = registry.get("agent.describe").unwrap().handle(&ctx, json!({})).await.unwrap();
        assert_eq!(described["configDigest"], Value::Null);
        ctx.set_config_digest("d1".into());
        let described = registry.get("agent.describe").unwrap().handle(&ctx, json!({})).await.unwrap();
        assert_eq!(
            described,
            json!({"nodeId": "node_1", "clusterId": "cls_1", "version": env!("CARGO_PKG_VERSION"),
                "methods": ["agent.describe", "agent.ping", "backups.echo"], "configDigest": "d1"})
        );
        let unknown = registry.unknown("agent.nope\u{1b}");
        assert_eq!(unknown.code, "agent-method-unknown");
        assert_eq!(unknown.data.unwrap()["methods"], json!(["agent.describe", "agent.ping", "backups.echo"]));
        assert!(!unknown.message.contains('\u{1b}'));
    }
}
