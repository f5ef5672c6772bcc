//! The plugins' `agents.call` and `agents.call-node`: a cluster's request goes to its elected
//! relay, wherever in the fleet it is connected; a node's goes to its agent over its runtime
//! session held by this process.

use std::sync::Arc;

/// The dispatcher the server installs ([`capstan_plugin_host::host::PluginHost::set_agent_dispatch`]).
pub struct AgentCalls {
    /// The cluster relays.
    pub relays: Arc<crate::relays::Relays>,
    /// The runtime: node sessions.
    pub runtime: capstan_runtime::Context,
}

impl capstan_plugin_host::AgentDispatch for AgentCalls {
    fn call(&self, request: capstan_plugin_host::AgentRequest) -> capstan_plugin_host::AgentReply {
        let (relays, runtime) = (self.relays.clone(), self.runtime.clone());
        Box::pin(async move {
            match &request.node_id {
                Some(node) => capstan_runtime::sessions::call_node(&runtime, node, &request.method, request.body, request.timeout).await,
                None => relays.call(&request.cluster_id, &request.method, request.body, request.timeout).await,
            }
        })
    }
}
