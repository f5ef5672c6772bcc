//! `federation.getStatus` (is the platform login on, and under which name) and
//! `federation.completeLogin` (a finished login's handoff to Capstan's session JWT).

use crate::Federation;
use crate::routes::off;
use capstan_auth::LoginAnswer;
use capstan_auth::methods::Empty;
use capstan_core::refusal::Result;
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Answer of `federation.getStatus`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Whether people can sign in through an identity provider here.
    pub enabled: bool,
    /// The provider's issuer URL.
    pub issuer: Option<String>,
    /// The name the sign-in button shows.
    pub display_name: Option<String>,
    /// Where a login begins (`GET`, with `challenge` and `returnTo`).
    pub start_path: Option<String>,
}

/// Input of `federation.completeLogin`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteInput {
    /// The handoff code the login's return address was given.
    pub handoff: String,
    /// The verifier whose S256 challenge the login began with.
    pub verifier: String,
}

/// Register `federation.*`; `federation` is `None` when no identity provider is configured.
pub fn register(registry: &mut Registry, federation: Option<Arc<Federation>>) {
    let mut registry = registry.with(federation);
    registry
        .add(
            "federation.getStatus",
            "Whether people sign in through an identity provider here, and its name",
            Access::Public,
            |federation: Option<Arc<Federation>>, _: Call, _: Empty| async move {
                Ok(match federation {
                    Some(f) => Status {
                        enabled: true,
                        issuer: Some(f.settings().issuer.clone()),
                        display_name: Some(f.settings().display_name.clone()),
                        start_path: Some(crate::routes::START.to_string()),
                    },
                    None => Status { enabled: false, issuer: None, display_name: None, start_path: None },
                })
            },
        )
        .read_only();
    registry
        .add(
            "federation.completeLogin",
            "Exchange a finished identity-provider login's handoff code and verifier for a session JWT",
            Access::Public,
            |federation: Option<Arc<Federation>>, _: Call, input: CompleteInput| async move {
                let federation = federation.ok_or_else(off)?;
                let answer: Result<LoginAnswer> = federation.complete_handoff(&input.handoff, &input.verifier).await;
                answer
            },
        )
        .refuses(&["platform-oidc-off", "oidc-handoff-invalid", "user-disabled"]);
}
