//! Named methods on the runtime agents connected to the host (capability `agents`).

use crate::bindings::capstan::plugin::agents as wit;
use crate::{Result, encode, parse};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Call `method` (`agent.ping`) on the elected relay of `cluster_id` with `body`, within the
/// call's deadline (at most 30 s); refused by name (`relay-not-connected`, `relay-timeout`,
/// `agent-method-invalid`, `agent-request-too-large`, …; see the plugin docs' "Agents").
pub fn call<T: DeserializeOwned>(cluster_id: &str, method: &str, body: &impl Serialize) -> Result<T> {
    let answer = wit::call(cluster_id, method, &encode(body)?)?;
    parse(&answer, &format!("the answer of agent method {method}"))
}

/// Call `method` (`backups.archive`) on the agent of node `node_id` over that node's runtime
/// session (its own socket, or its cluster's relay carrying it), within the call's deadline (at
/// most 30 s); refused by name (`node-not-connected` when the node has no runtime session with
/// Capstan now — retryable —, `node-timeout`, `agent-method-invalid`, the agent's own refusals).
/// Contract 0.3.3.
pub fn call_node<T: DeserializeOwned>(node_id: &str, method: &str, body: &impl Serialize) -> Result<T> {
    let answer = wit::call_node(node_id, method, &encode(body)?)?;
    parse(&answer, &format!("the answer of agent method {method} on node {node_id}"))
}
