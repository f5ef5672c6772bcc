//! `agents`: a plugin's request to the relay of one of the platform's clusters (`call`), or to
//! the agent of one node over its runtime session (`call-node`, contract 0.3.3). The host
//! checks the grant and the request (cluster or node id, method name, JSON body, sizes), gives it the
//! plugin call's remaining time (less a margin, at most [`MAX_AGENT_TIMEOUT`]) and hands it to
//! the [`AgentDispatch`] the server installed ([`Services::set_agent_dispatch`]); until one is
//! installed every call is refused `agent-not-connected` (retryable). A dispatcher that has not
//! answered within the timeout is refused `relay-timeout` (`node-timeout` for a node; retryable) for it. The answer comes
//! back as JSON text, bounded; the dispatcher's refusals pass through by name. Nothing of a
//! body is logged.

use super::{CallData, Services, WitResult, refusal, timeout_within, to_wit};
use crate::manifest::Capability;
use crate::refusal::Refusal;
use crate::runtime::capstan::plugin::agents;
use capstan_core::text::truncate;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest request body a plugin may send to an agent, in bytes of JSON text.
pub const MAX_AGENT_REQUEST_BYTES: usize = 1 << 20;

/// Largest answer the host passes back to a plugin, in bytes of JSON text.
pub const MAX_AGENT_REPLY_BYTES: usize = 1 << 20;

/// The longest a single agent request may wait, whatever time the plugin call has left.
pub const MAX_AGENT_TIMEOUT: Duration = Duration::from_secs(30);

/// What the host keeps of the plugin call's remaining time for the plugin to finish after the
/// agent answered (or the request timed out).
pub const AGENT_DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// Longest cluster id and method name, in bytes.
const MAX_NAME_BYTES: usize = 128;

/// One request a plugin makes of a cluster's relay, checked by the host.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRequest {
    /// The plugin that asks.
    pub plugin_id: String,
    /// The cluster whose relay answers: 1..=128 of `[A-Za-z0-9_.-]` (empty for a node's call).
    pub cluster_id: String,
    /// The node whose agent answers over its runtime session (`agents.call-node`, contract
    /// 0.3.3), instead of a cluster's relay: 1..=128 of `[A-Za-z0-9_.-]`.
    pub node_id: Option<String>,
    /// The agent method: dot-separated camelCase words, at least two (`agent.ping`), ≤ 128.
    pub method: String,
    /// The request body: any JSON value, at most [`MAX_AGENT_REQUEST_BYTES`] as text.
    pub body: Value,
    /// How long the dispatcher may wait for the answer: the plugin call's remaining time less
    /// [`AGENT_DEADLINE_MARGIN`], never more than [`MAX_AGENT_TIMEOUT`], never zero. A
    /// dispatcher that runs out of it refuses `relay-timeout` (retryable); one still waiting
    /// then is dropped and the plugin refused so by the host.
    pub timeout: Duration,
}

/// What [`AgentDispatch::call`] answers: the agent's result, or a refusal the plugin receives
/// by its code, message, retryability and data.
pub type AgentReply = BoxFuture<'static, Result<Value, Refusal>>;

/// How the `agents` import reaches a cluster's relay; the server provides it and installs it
/// with [`Services::set_agent_dispatch`] (or [`crate::host::PluginHost::set_agent_dispatch`]).
pub trait AgentDispatch: Send + Sync + 'static {
    /// Send `request` to the relay of `request.cluster_id` and answer its result within
    /// `request.timeout`. Refusals are the relay protocol's (`relay-not-connected`,
    /// `relay-timeout`, `agent-method-unknown`, …); they reach the plugin as they are.
    fn call(&self, request: AgentRequest) -> AgentReply;
}

/// The dispatcher of a host with no relay transport: every request is refused
/// `agent-not-connected` (retryable).
#[derive(Debug, Clone, Copy, Default)]
pub struct NotConnected;

impl AgentDispatch for NotConnected {
    fn call(&self, request: AgentRequest) -> AgentReply {
        let refused = match &request.node_id {
            Some(node) => {
                Refusal::new("agent-not-connected", format!("no agent of node {node:?} is connected")).with_data(json!({ "nodeId": node }))
            }
            None => Refusal::new("agent-not-connected", format!("no agent of cluster {:?} is connected", request.cluster_id))
                .with_data(json!({ "clusterId": request.cluster_id })),
        };
        let refused = refused.retryable();
        Box::pin(async move { Err(refused) })
    }
}

/// The `agents` provider: reaches whichever dispatcher the services hold at call time.
#[derive(Clone)]
pub(super) struct Agents {
    services: Arc<Services>,
    plugin: String,
}

impl Agents {
    pub(super) fn new(services: &Arc<Services>, plugin: &str) -> Self {
        Agents { services: services.clone(), plugin: plugin.to_string() }
    }
}

impl agents::Host for CallData {
    async fn call(&mut self, cluster_id: String, method: String, body: String) -> WitResult<String> {
        self.changing()?;
        let agents = self.granted(&self.grant.agents, Capability::Agents)?;
        let dispatch = agents.services.agent_dispatch();
        call(dispatch.as_ref(), &agents.plugin, &self.request_id, self.deadline, To::Relay(cluster_id), method, &body).await
    }

    async fn call_node(&mut self, node_id: String, method: String, body: String) -> WitResult<String> {
        self.changing()?;
        let agents = self.granted(&self.grant.agents, Capability::Agents)?;
        let dispatch = agents.services.agent_dispatch();
        call(dispatch.as_ref(), &agents.plugin, &self.request_id, self.deadline, To::Node(node_id), method, &body).await
    }
}

/// Whose agent answers: a cluster's elected relay, or one node's agent over its runtime session.
#[derive(Debug, Clone)]
pub(super) enum To {
    Relay(String),
    Node(String),
}

/// Check one `agents.call`, hand it to `dispatch` with the time the call has left before
/// `deadline` (its end; `None`: no end known, so the cap), and bound the answer.
pub(super) async fn call(
    dispatch: &dyn AgentDispatch,
    plugin: &str,
    request_id: &str,
    deadline: Option<Instant>,
    to: To,
    method: String,
    body: &str,
) -> WitResult<String> {
    let (cluster_id, node_id) = match to {
        To::Relay(cluster_id) => {
            check_id(&cluster_id, "clusterId", "cluster")?;
            (cluster_id, None)
        }
        To::Node(node_id) => {
            check_id(&node_id, "nodeId", "node")?;
            (String::new(), Some(node_id))
        }
    };
    let whose = match &node_id {
        Some(node) => format!("the agent of node {node:?}"),
        None => format!("the relay of cluster {cluster_id:?}"),
    };
    check_method(&method)?;
    if body.len() > MAX_AGENT_REQUEST_BYTES {
        return Err(refusal(
            "agent-request-too-large",
            format!("the request body is {} bytes; an agent request carries at most {MAX_AGENT_REQUEST_BYTES}", body.len()),
            json!({ "limitBytes": MAX_AGENT_REQUEST_BYTES, "bytes": body.len() }),
        ));
    }
    let body: Value = serde_json::from_str(body)
        .map_err(|e| refusal("invalid-request", format!("the request body is not valid JSON: {e}"), json!({ "field": "body" })))?;
    let timeout = timeout_within(deadline, Instant::now(), AGENT_DEADLINE_MARGIN, MAX_AGENT_TIMEOUT).ok_or_else(|| {
        refusal(
            "plugin-deadline-exceeded",
            format!("plugin {plugin} has no time left for a request to an agent"),
            json!({ "plugin": plugin, "marginMs": AGENT_DEADLINE_MARGIN.as_millis() as u64 }),
        )
    })?;
    let started = Instant::now();
    let request = AgentRequest {
        plugin_id: plugin.to_string(),
        cluster_id: cluster_id.clone(),
        node_id: node_id.clone(),
        method: method.clone(),
        body,
        timeout,
    };
    // the dispatcher is asked to keep to the timeout; the host holds it to it
    let answered = match tokio::time::timeout(timeout, dispatch.call(request)).await {
        Ok(answered) => answered,
        Err(_) => {
            let code = if node_id.is_some() { "node-timeout" } else { "relay-timeout" };
            let data = match &node_id {
                Some(node) => json!({ "nodeId": node, "method": method, "timeoutMs": timeout.as_millis() as u64 }),
                None => json!({ "clusterId": cluster_id, "method": method, "timeoutMs": timeout.as_millis() as u64 }),
            };
            Err(Refusal::new(code, format!("{whose} did not answer {method} within {} ms", timeout.as_millis()))
                .retryable()
                .with_data(data))
        }
    };
    let ms = started.elapsed().as_millis() as u64;
    let value = match answered {
        Ok(value) => value,
        Err(refused) => {
            tracing::debug!(plugin = %plugin, request_id = %request_id, to = %whose, method = %method, ms,
                code = %refused.code, "agent request refused");
            return Err(to_wit(refused));
        }
    };
    let text = value.to_string();
    tracing::debug!(plugin = %plugin, request_id = %request_id, to = %whose, method = %method, ms,
        bytes = text.len(), "agent request answered");
    if text.len() > MAX_AGENT_REPLY_BYTES {
        tracing::warn!(plugin = %plugin, request_id = %request_id, to = %whose, method = %method, bytes = text.len(),
            "an agent answered more than a plugin is passed");
        return Err(refusal(
            "relay-reply-too-large",
            format!("the agent's answer is {} bytes; a plugin is passed at most {MAX_AGENT_REPLY_BYTES}", text.len()),
            json!({ "limitBytes": MAX_AGENT_REPLY_BYTES, "bytes": text.len(), "clusterId": cluster_id, "method": method }),
        ));
    }
    Ok(text)
}

/// A cluster or node id (`field`, a `kind`'s): 1..=128 of `[A-Za-z0-9_.-]`.
fn check_id(id: &str, field: &str, kind: &str) -> WitResult<()> {
    let ok = (1..=MAX_NAME_BYTES).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        return Ok(());
    }
    Err(refusal(
        "invalid-request",
        format!("{kind} id {:?} must be 1 to {MAX_NAME_BYTES} of [A-Za-z0-9_.-]", truncate(id, 64)),
        json!({ "field": field }),
    ))
}

/// An agent method: `^[a-z][a-zA-Z0-9]*(\.[a-z][a-zA-Z0-9]*)+$`, at most 128 bytes.
fn check_method(method: &str) -> WitResult<()> {
    let word = |w: &str| w.starts_with(|c: char| c.is_ascii_lowercase()) && w.bytes().all(|b| b.is_ascii_alphanumeric());
    let ok = method.len() <= MAX_NAME_BYTES && method.split('.').count() >= 2 && method.split('.').all(word);
    if ok {
        return Ok(());
    }
    Err(refusal(
        "agent-method-invalid",
        format!(
            "agent method {:?} must be dot-separated camelCase words (agent.ping), at most {MAX_NAME_BYTES} bytes",
            truncate(method, 64)
        ),
        json!({ "method": truncate(method, 64) }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::capstan::plugin::types::Refusal as WitRefusal;
    use std::sync::Mutex;

    /// Records what it was asked and answers what it was given.
    struct Fake {
        asked: Mutex<Vec<AgentRequest>>,
        answer: Result<Value, Refusal>,
    }

    impl Fake {
        fn answering(answer: Result<Value, Refusal>) -> Arc<Fake> {
            Arc::new(Fake { asked: Mutex::new(vec![]), answer })
        }
        fn asked(&self) -> Vec<AgentRequest> {
            self.asked.lock().unwrap().clone()
        }
    }

    impl AgentDispatch for Fake {
        fn call(&self, request: AgentRequest) -> AgentReply {
            self.asked.lock().unwrap().push(request);
            let answer = self.answer.clone();
            Box::pin(async move { answer })
        }
    }

    fn soon() -> Option<Instant> {
        Some(Instant::now() + Duration::from_secs(6))
    }

    async fn ask(fake: &Fake, deadline: Option<Instant>, cluster: &str, method: &str, body: &str) -> Result<String, WitRefusal> {
        call(fake, "example", "req-1", deadline, To::Relay(cluster.into()), method.into(), body).await
    }

    fn data(r: &WitRefusal) -> Value {
        serde_json::from_str(r.data.as_deref().unwrap_or("null")).unwrap()
    }

    #[tokio::test]
    async fn a_checked_request_reaches_the_dispatcher_and_its_answer_comes_back_as_json_text() {
        let fake = Fake::answering(Ok(json!({ "pong": true, "nodeId": "node_1", "at": 1 })));
        let deadline = soon();
        let answer = ask(&fake, deadline, "cluster_abc", "agent.ping", r#"{"a":[1,2]}"#).await.unwrap();
        assert_eq!(serde_json::from_str::<Value>(&answer).unwrap(), json!({ "pong": true, "nodeId": "node_1", "at": 1 }));
        let asked = fake.asked();
        assert_eq!(asked.len(), 1);
        let request = &asked[0];
        assert_eq!(
            (request.plugin_id.as_str(), request.cluster_id.as_str(), request.method.as_str(), &request.body),
            ("example", "cluster_abc", "agent.ping", &json!({ "a": [1, 2] }))
        );
        // within what the call has left, less the margin
        assert!(request.timeout <= Duration::from_secs(6) - AGENT_DEADLINE_MARGIN, "{:?}", request.timeout);
        assert!(request.timeout > Duration::from_secs(5), "{:?}", request.timeout);
    }

    #[tokio::test]
    async fn the_timeout_is_capped_and_no_time_left_is_refused_before_the_dispatcher() {
        let fake = Fake::answering(Ok(json!({})));
        ask(&fake, Some(Instant::now() + Duration::from_secs(300)), "c1", "agent.ping", "{}").await.unwrap();
        ask(&fake, None, "c1", "agent.ping", "{}").await.unwrap();
        assert!(fake.asked().iter().all(|r| r.timeout == MAX_AGENT_TIMEOUT));

        let fake = Fake::answering(Ok(json!({})));
        for deadline in [Instant::now(), Instant::now() + AGENT_DEADLINE_MARGIN / 2] {
            let refused = ask(&fake, Some(deadline), "c1", "agent.ping", "{}").await.unwrap_err();
            assert_eq!(refused.code, "plugin-deadline-exceeded");
            assert!(!refused.retryable);
        }
        assert!(fake.asked().is_empty());
    }

    #[tokio::test]
    async fn bad_requests_are_refused_by_name_before_the_dispatcher() {
        let fake = Fake::answering(Ok(json!({})));
        let long = "a".repeat(129);
        let long_method = format!("agent.{}", "x".repeat(123));
        let cases: [(&str, &str, &str, &str); 14] = [
            ("", "agent.ping", "{}", "invalid-request"),
            (&long, "agent.ping", "{}", "invalid-request"),
            ("c 1", "agent.ping", "{}", "invalid-request"),
            ("c\n1", "agent.ping", "{}", "invalid-request"),
            ("c1", "", "{}", "agent-method-invalid"),
            ("c1", "ping", "{}", "agent-method-invalid"),
            ("c1", "agent.", "{}", "agent-method-invalid"),
            ("c1", ".ping", "{}", "agent-method-invalid"),
            ("c1", "Agent.ping", "{}", "agent-method-invalid"),
            ("c1", "agent.Ping", "{}", "agent-method-invalid"),
            ("c1", "agent.pi-ng", "{}", "agent-method-invalid"),
            ("c1", &long_method, "{}", "agent-method-invalid"),
            ("c1", "agent.ping", "{not json", "invalid-request"),
            ("c1", "agent.ping", "", "invalid-request"),
        ];
        for (cluster, method, body, code) in cases {
            let refused = ask(&fake, soon(), cluster, method, body).await.unwrap_err();
            assert_eq!(refused.code, code, "{cluster:?} {method:?} {body:?}");
        }
        // what the pattern allows
        for method in ["agent.ping", "agent.describe", "a.b.c", "relay.getConfig2", &format!("agent.{}", "x".repeat(122))] {
            ask(&fake, soon(), "cluster_1.a-b", method, "null").await.unwrap();
        }
        assert_eq!(fake.asked().len(), 5);
    }

    #[tokio::test]
    async fn an_oversized_body_is_refused_with_the_limit_before_the_dispatcher() {
        let fake = Fake::answering(Ok(json!({})));
        let body = format!("\"{}\"", "x".repeat(MAX_AGENT_REQUEST_BYTES));
        let refused = ask(&fake, soon(), "c1", "agent.ping", &body).await.unwrap_err();
        assert_eq!(refused.code, "agent-request-too-large");
        assert_eq!(data(&refused)["limitBytes"], MAX_AGENT_REQUEST_BYTES);
        assert!(fake.asked().is_empty());
        // exactly at the limit passes
        let body = format!("\"{}\"", "x".repeat(MAX_AGENT_REQUEST_BYTES - 2));
        ask(&fake, soon(), "c1", "agent.ping", &body).await.unwrap();
    }

    #[tokio::test]
    async fn a_node_call_names_its_node_and_is_checked_as_a_relay_call_is() {
        let fake = Fake::answering(Ok(json!({ "size": 3 })));
        let answer = call(&*fake, "backups", "r", soon(), To::Node("node_7".into()), "backups.archive".into(), "{}").await.unwrap();
        assert_eq!(answer, r#"{"size":3}"#);
        let asked = fake.asked();
        assert_eq!((asked[0].node_id.as_deref(), asked[0].cluster_id.as_str()), (Some("node_7"), ""), "the node, no cluster");
        let refused = call(&*fake, "backups", "r", soon(), To::Node("node 7".into()), "backups.archive".into(), "{}").await.unwrap_err();
        assert_eq!((refused.code.as_str(), data(&refused)["field"].as_str()), ("invalid-request", Some("nodeId")));
        let refused = call(&*fake, "backups", "r", soon(), To::Node("node_7".into()), "archive".into(), "{}").await.unwrap_err();
        assert_eq!(refused.code, "agent-method-invalid");
        let silent = call(
            &Silent,
            "backups",
            "r",
            Some(Instant::now() + Duration::from_millis(900)),
            To::Node("node_7".into()),
            "backups.archive".into(),
            "{}",
        );
        let refused = silent.await.unwrap_err();
        assert_eq!((refused.code.as_str(), refused.retryable, data(&refused)["nodeId"].as_str()), ("node-timeout", true, Some("node_7")));
        let refused =
            call(&NotConnected, "backups", "r", soon(), To::Node("node_7".into()), "backups.archive".into(), "{}").await.unwrap_err();
        assert_eq!((refused.code.as_str(), data(&refused)["nodeId"].as_str()), ("agent-not-connected", Some("node_7")));
    }

    /// Never answers.
    struct Silent;

    impl AgentDispatch for Silent {
        fn call(&self, _request: AgentRequest) -> AgentReply {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test]
    async fn a_dispatcher_that_outlasts_the_timeout_is_refused_relay_timeout_within_the_deadline() {
        let deadline = Instant::now() + AGENT_DEADLINE_MARGIN + Duration::from_millis(200);
        let got = call(&Silent, "example", "r", Some(deadline), To::Relay("c1".into()), "agent.ping".into(), "{}").await.unwrap_err();
        assert_eq!((got.code.as_str(), got.retryable), ("relay-timeout", true));
        assert!(Instant::now() < deadline, "the plugin still has time to answer");
        assert_eq!(data(&got)["clusterId"], "c1");
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused() {
        let fake = Fake::answering(Ok(Value::String("x".repeat(MAX_AGENT_REPLY_BYTES))));
        let refused = ask(&fake, soon(), "c1", "agent.ping", "{}").await.unwrap_err();
        assert_eq!(refused.code, "relay-reply-too-large");
        assert_eq!(data(&refused)["limitBytes"], MAX_AGENT_REPLY_BYTES);
    }

    #[tokio::test]
    async fn the_dispatchers_refusals_pass_through_by_name_with_retryable_and_data() {
        let refused = Refusal::new("relay-not-connected", "no relay of cluster c1 is connected")
            .retryable()
            .with_data(json!({ "clusterId": "c1", "retryAfterMs": 2000 }));
        let fake = Fake::answering(Err(refused));
        let got = ask(&fake, soon(), "c1", "agent.ping", "{}").await.unwrap_err();
        assert_eq!((got.code.as_str(), got.retryable), ("relay-not-connected", true));
        assert_eq!(got.message, "no relay of cluster c1 is connected");
        assert_eq!(data(&got), json!({ "clusterId": "c1", "retryAfterMs": 2000 }));

        let fake = Fake::answering(Err(Refusal::new("agent-method-unknown", "no").with_data(json!({ "methods": ["agent.ping"] }))));
        let got = ask(&fake, soon(), "c1", "agent.nothing", "{}").await.unwrap_err();
        assert_eq!((got.code.as_str(), got.retryable), ("agent-method-unknown", false));
        assert_eq!(data(&got)["methods"], json!(["agent.ping"]));
    }

    #[tokio::test]
    async fn without_a_dispatcher_every_request_is_not_connected_and_retryable() {
        let got = call(&NotConnected, "example", "r", soon(), To::Relay("c1".into()), "agent.ping".into(), "{}").await.unwrap_err();
        assert_eq!((got.code.as_str(), got.retryable), ("agent-not-connected", true));
        assert_eq!(data(&got)["clusterId"], "c1");
    }
}
