//! The plugins' `agents.call` and `agents.call-node`: a cluster's request goes to its elected
//! relay, wherever in the fleet it is connected; a node's goes to its agent over its runtime
//! session — held by this process, or carried to the fleet node that holds it.

use std::sync::Arc;
use std::time::Duration;

/// The dispatcher the server installs ([`capstan_plugin_host::host::PluginHost::set_agent_dispatch`]).
pub struct AgentCalls {
    /// The cluster relays (and the fleet's hop to another node).
    pub relays: Arc<crate::relays::Relays>,
    /// The runtime: node sessions.
    pub runtime: capstan_runtime::Context,
}

impl capstan_plugin_host::AgentDispatch for AgentCalls {
    fn call(&self, request: capstan_plugin_host::AgentRequest) -> capstan_plugin_host::AgentReply {
        let (relays, runtime) = (self.relays.clone(), self.runtime.clone());
        Box::pin(async move {
            let capstan_plugin_host::AgentRequest { node_id, cluster_id, method, body, timeout, .. } = request;
            let Some(node) = node_id else { return relays.call(&cluster_id, &method, body, timeout).await };
            match capstan_runtime::sessions::call_node(&runtime, &node, &method, body.clone(), timeout).await {
                // the node's session is held by another fleet node: carried there
                Err(away) if away.is("node-not-connected") => match capstan_runtime::sessions::held_elsewhere(&runtime, &node).await? {
                    Some(holder) => relays.call_node_at(&holder, &node, &method, body, timeout).await,
                    None => Err(away),
                },
                answered => answered,
            }
        })
    }
}

/// Node calls another fleet node carried here: answered by the sessions this process holds.
pub struct NodeCallsHere(pub capstan_runtime::Context);

impl crate::relays::forward::NodeCalls for NodeCallsHere {
    fn call<'a>(
        &'a self,
        node_id: &'a str,
        method: &'a str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> crate::relays::forward::NodeCallAnswer<'a> {
        Box::pin(capstan_runtime::sessions::call_node(&self.0, node_id, method, body, timeout))
    }
}
