//! How plugins' `gateway.request` (contract 0.2.4) reaches the external gateway: under Capstan's
//! enrolled client credential, read from its secret for each request
//! ([`capstan_gateway::plugin_request`]), so a credential bootstrapped or replaced serves the
//! next request, and no plugin ever holds it. The plugin host has checked the request (the
//! scope granted, the path, the body) and bounds the time; this adds the credential.

use capstan_plugin_host::imports::MAX_GATEWAY_REPLY_BYTES;
use capstan_plugin_host::{GatewayDispatch, GatewayReply, GatewayRequest, GatewayResponse};

/// The dispatcher the server installs ([`capstan_plugin_host::host::PluginHost::set_gateway_dispatch`]).
pub struct GatewayCalls(pub capstan_gateway::Context);

impl GatewayDispatch for GatewayCalls {
    fn request(&self, request: GatewayRequest) -> GatewayReply {
        let cx = self.0.clone();
        Box::pin(async move {
            let (status, body) = capstan_gateway::plugin_request(
                &cx,
                &request.method,
                &request.path,
                request.body.as_ref(),
                request.timeout,
                MAX_GATEWAY_REPLY_BYTES,
            )
            .await?;
            Ok(GatewayResponse { status, body })
        })
    }
}
