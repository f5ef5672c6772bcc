//! Node runtime sessions a cluster's relay carries over its own socket (docs/relays.md,
//! "Carrying node sessions"): the relay opens one per node it serves (`node-open` with the
//! node's id and token), forwards each node's frames wrapped as `{"type": "node", "node",
//! "frame"}` both ways, and closes it (`node-close`). The relay is a carrier, not an authority:
//! each node is judged by its own credential when opened and on every call, and only a node of
//! the relay's cluster is carried (`relay-node-foreign`). One node's frames never reach another
//! node's session, and one node opening, closing or misbehaving leaves the others alone.

use super::log_refusal;
use super::socket::{MAX_CALL_ID_CHARS, SocketState};
use crate::refusal::Refusal;
use crate::sessions::Handle;
use capstan_runtime::sessions::{NODE_METHODS, NodeSessions};
use serde_json::{Map, Value, json};
use std::sync::Arc;
use tracing::Instrument;

/// A frame the relay session `relay` sent about a node it carries (`kind` is its type:
/// `node-open`, `node` or `node-close`).
pub(super) fn relay_frame(state: &SocketState, handle: &Arc<Handle>, relay: &str, kind: &str, mut frame: Map<String, Value>) {
    let refuse = |refusal: Refusal| {
        log_refusal(&refusal);
        handle.send(json!({ "type": "error", "id": null, "error": refusal }).to_string());
    };
    let node = match frame.get("node").and_then(Value::as_str) {
        Some(node) if capstan_store::validate_id(node).is_ok() => node.to_string(),
        _ => return refuse(Refusal::new("frame-malformed", format!("a {kind} frame names the carried node's id as \"node\""))),
    };
    let key = NodeSessions::carried_key(relay, &node);
    match kind {
        "node-open" => {
            let Some(Value::String(token)) = frame.remove("token") else {
                return refuse(Refusal::new("frame-malformed", "a node-open frame carries the node's token as \"token\""));
            };
            let (state, handle, relay) = (state.clone(), handle.clone(), relay.to_string());
            tokio::spawn(
                async move {
                    let opened = async {
                        let cluster_id = state.relays.check(&relay).await.map_err(|_| {
                            Refusal::new("carrier-identity-unverified", "this relay's credential no longer names a cluster")
                        })?;
                        capstan_runtime::sessions::carry(&state.runtime, &relay, &cluster_id, &node, &token).await
                    };
                    let answer = match opened.await {
                        Ok(_) => json!({ "type": "node-opened", "node": node }),
                        Err(refusal) => {
                            log_refusal(&refusal);
                            json!({ "type": "node-refused", "node": node, "error": refusal })
                        }
                    };
                    handle.send(answer.to_string());
                }
                .in_current_span(),
            );
        }
        "node-close" => state.runtime.sessions.closed(&key),
        _ => {
            let Some(Value::Object(inner)) = frame.remove("frame") else {
                return refuse(Refusal::new("frame-malformed", "a node frame carries the node's frame object as \"frame\""));
            };
            if !state.runtime.sessions.is_node(&key) {
                // the relay missed the end of this node's session: it closes the node's link
                let refusal = capstan_runtime::sessions::report_refused("session-unknown", "this relay carries no session of that node");
                handle.send(json!({ "type": "node-close", "node": node, "error": refusal }).to_string());
                return;
            }
            node_frame(state, handle, key, node, inner);
        }
    }
}

/// A carried node's own frame: a reply to a push, or a call of one of its runtime methods.
fn node_frame(state: &SocketState, handle: &Arc<Handle>, key: String, node: String, mut frame: Map<String, Value>) {
    let to_node = |inner: Value| json!({ "type": "node", "node": node, "frame": inner }).to_string();
    let id = match frame.get("id") {
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= MAX_CALL_ID_CHARS => Some(Value::String(s.clone())),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Some(Value::Number(n.clone())),
        _ => None,
    };
    let refuse = |id: Option<Value>, refusal: Refusal| {
        log_refusal(&refusal);
        handle.send(to_node(json!({ "type": "error", "id": id, "error": refusal })));
    };
    match frame.get("type").and_then(Value::as_str) {
        Some("reply") => return state.runtime.sessions.reply(frame),
        Some("call") => {}
        _ => return refuse(id, Refusal::new("frame-unexpected", "a carried node sends call and reply frames")),
    }
    let Some(id) = id else {
        return refuse(
            None,
            Refusal::new("frame-malformed", format!("a call has an \"id\": 1 to {MAX_CALL_ID_CHARS} characters or an integer")),
        );
    };
    let method = match frame.remove("method") {
        Some(Value::String(method)) if NODE_METHODS.contains(&method.as_str()) => method,
        _ => {
            let refusal = Refusal::new("forbidden", "a node's runtime session calls only the runtime's node methods (docs/runtime.md)");
            return refuse(Some(id), refusal);
        }
    };
    if !state.runtime.sessions.begin_call(&key) {
        let limit = capstan_runtime::sessions::MAX_CARRIED_CALLS;
        let refusal = Refusal::new("too-many-requests-in-flight", format!("a carried node runs at most {limit} calls at once"))
            .with_data(json!({ "limit": limit }))
            .retryable();
        return refuse(Some(id), refusal);
    }
    let body = frame.remove("body").filter(|b| !b.is_null()).unwrap_or_else(|| json!({}));
    let (state, handle) = (state.clone(), handle.clone());
    let span = tracing::info_span!("carried", node = %node, method = %method);
    tokio::spawn(
        async move {
            let answer = capstan_runtime::sessions::node_call(&state.runtime, &key, &method, body).await;
            state.runtime.sessions.end_call(&key);
            let inner = match answer {
                Ok(result) => json!({ "type": "result", "id": id, "result": result }),
                Err(refusal) => {
                    log_refusal(&refusal);
                    json!({ "type": "error", "id": id, "error": refusal })
                }
            };
            handle.send(json!({ "type": "node", "node": node, "frame": inner }).to_string());
        }
        .instrument(span),
    );
}
