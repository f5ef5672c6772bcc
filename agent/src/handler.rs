//! What the relay answers: request handlers and their registry.
//!
//! The host reaches the cluster's relay with `request` frames (`{id, method, body,
//! deadlineMs}`, docs/relays.md); each method is one [`Handler`] in a [`Registry`]. The
//! built-ins (`agent.ping`, `agent.describe`) are handlers like any other, so a later manager
//! (backups, ingress) adds its methods the same way: implement [`Handler`] and
//! [`Registry::add`] it before the relay starts. A method nobody registered is refused
//! `agent-method-unknown`, naming what is answered.

use capstan_core::Refusal;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

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

impl Registry {
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
