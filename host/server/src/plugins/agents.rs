//! The plugins' `agents.call`: the request goes to the cluster's elected relay, wherever in the
//! fleet it is connected.

use std::sync::Arc;

/// The dispatcher the server installs ([`capstan_plugin_host::host::PluginHost::set_agent_dispatch`]).
pub struct AgentCalls(pub Arc<crate::relays::Relays>);

impl capstan_plugin_host::AgentDispatch for AgentCalls {
    fn call(&self, request: capstan_plugin_host::AgentRequest) -> capstan_plugin_host::AgentReply {
        let relays = self.0.clone();
        Box::pin(async move { relays.call(&request.cluster_id, &request.method, request.body, request.timeout).await })
    }
}
