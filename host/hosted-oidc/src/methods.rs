//! The `hostedOidc.*` API methods: the dashboard's side of the browser's authorization handoff,
//! and the signing key's rotation.

use super::*;
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;

/// Names one pending authorization.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestRef {
    /// The id the dashboard was sent with (`/authorize/<request id>`).
    pub request_id: String,
}

/// Where the browser goes next.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedirectAnswer {
    /// The app's redirect URI with the answer (`code` and `state`, or `error=access_denied`).
    pub redirect_url: String,
}

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

const HANDOFF_REFUSALS: &[&str] = &["hosted-oidc-request-unknown", "hosted-oidc-human-required"];

/// Register the `hostedOidc.*` methods: `getAuthorization`, `completeAuthorization` and
/// `cancelAuthorization` (any authenticated person: the user signing in to the app), and
/// `rotateSigningKey` (an administrator with a fresh login).
pub fn register(registry: &mut Registry, oidc: Arc<HostedOidc>) {
    let mut registry = registry.with(oidc);
    registry
        .add(
            "hostedOidc.getAuthorization",
            "A hosted app's pending sign-in: the app, the scopes and the role the caller would have",
            Access::Authenticated,
            |oidc: Arc<HostedOidc>, call: Call, input: RequestRef| async move {
                oidc.authorization(&input.request_id, call.identity()?).await
            },
        )
        .refuses(HANDOFF_REFUSALS)
        .read_only();
    registry
        .add(
            "hostedOidc.completeAuthorization",
            "Approve a hosted app's pending sign-in: answers the app's redirect URL with a one-use code",
            Access::Authenticated,
            |oidc: Arc<HostedOidc>, call: Call, input: RequestRef| async move {
                let redirect_url = oidc.complete_authorization(&input.request_id, call.identity()?).await?;
                Ok(RedirectAnswer { redirect_url })
            },
        )
        .refuses(HANDOFF_REFUSALS)
        .refuses(&["hosted-app-access-denied"]);
    registry
        .add(
            "hostedOidc.cancelAuthorization",
            "Decline a hosted app's pending sign-in: answers the app's redirect URL with error=access_denied",
            Access::Authenticated,
            |oidc: Arc<HostedOidc>, call: Call, input: RequestRef| async move {
                let redirect_url = oidc.cancel_authorization(&input.request_id, call.identity()?).await?;
                Ok(RedirectAnswer { redirect_url })
            },
        )
        .refuses(HANDOFF_REFUSALS);
    registry
        .add(
            "hostedOidc.rotateSigningKey",
            "Make a new key sign hosted apps' ID tokens; the previous one stays published for 24 hours",
            Access::Admin,
            |oidc: Arc<HostedOidc>, call: Call, _: Empty| async move {
                call.identity()?.require_fresh()?;
                oidc.rotate_signing_key().await
            },
        )
        .refuses(&["admin-not-fresh"]);
}
