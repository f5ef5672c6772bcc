//! Deployment machine users and their per-service grants (`deployers.*`).
//!
//! A deployment runs as a deployment machine user: an API machine user with a token and the
//! grants an administrator attached to it. Only users created here are deployers; a human, an
//! administrator or a cluster's machine user never is (`deployment-machine-user-invalid`).

use super::Context;
use super::services::require_active;
use super::{Listing, PageInput, SERVICE_GRANTS, emit, to_value};
use capstan_auth::methods::{Expiry, set_machine_token_and};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::receipts;
use capstan_rpc::{Access, Call, Registry};
use capstan_store::Tx;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Users created as deployers (id = user id).
pub const DEPLOYERS: &str = "deployers";

/// What a grant may allow on one service.
pub const CAPABILITIES: &[&str] = &["deployment:status", "deployment:reserve", "deployment:promote", "registry:push", "registry:pull"];

/// The grant document id of `user_id` on `service_id`.
pub fn grant_id(service_id: &str, user_id: &str) -> String {
    format!("{service_id}~{user_id}")
}

/// The longest a deployer's token may live (milliseconds, as every moment it is added to).
const MAX_TOKEN_LIFETIME: u64 = 366 * 24 * 3600 * 1000;
/// How long a token lives when the request states nothing (milliseconds).
const DEFAULT_TOKEN_LIFETIME: u64 = 365 * 24 * 3600 * 1000;

/// Input of `deployers.create`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateInput {
    /// Lowercase, at most 64 characters, no `:` or `/`; also the registry login name.
    pub username: String,
    /// When the token stops working (milliseconds since the epoch), at most a year ahead; a year by default.
    pub expires_at: Option<u64>,
    /// Sent again with the same request, answers the same user (`token: null`, `replayed`).
    pub mutation_id: Option<String>,
}

/// Input of `deployers.rotateToken`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RotateInput {
    /// The deployer's user id.
    pub user_id: String,
    /// When the new token stops working (milliseconds since the epoch), at most a year ahead; a year by default.
    pub expires_at: Option<u64>,
    /// Sent again with the same request, answers the same rotation (`token: null`, `replayed`).
    pub mutation_id: Option<String>,
}

/// Input of `deployers.revokeToken`: names one deployer.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UserInput {
    /// The deployer's user id.
    pub user_id: String,
    /// Sent again with the same request, answers the same revocation (`replayed`).
    pub mutation_id: Option<String>,
}

/// A deployer's token, shown this once, with when it expires.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeployerToken {
    /// The deployer's user id.
    pub user_id: String,
    /// Its username (also its registry login name).
    pub username: String,
    /// The token, in the first answer only (Capstan keeps its SHA-256); `null` in a replay.
    pub token: Option<String>,
    /// The credential generation after this token was set.
    pub generation: u64,
    /// When the token stops working (milliseconds since the epoch).
    pub expires_at: u64,
    /// Whether this answers a `mutationId` sent before.
    #[serde(default)]
    pub replayed: bool,
}

/// Answer of `deployers.revokeToken`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenRevoked {
    /// The deployer's user id.
    pub user_id: String,
    /// The grants stay; only the token is gone.
    pub token_active: bool,
    /// Whether this answers a `mutationId` sent before.
    #[serde(default)]
    pub replayed: bool,
}

/// The expiry a request asks for, judged: in the future and at most a year ahead.
fn expiry(requested: Option<u64>) -> Result<u64> {
    let now = now_ms();
    let at = requested.unwrap_or(now + DEFAULT_TOKEN_LIFETIME);
    if at <= now || at > now + MAX_TOKEN_LIFETIME {
        return Err(Refusal::new(
            "expiry-invalid",
            "expiresAt is a moment in the future (milliseconds since the epoch), at most a year ahead",
        )
        .with_data(json!({ "field": "expiresAt" })));
    }
    Ok(at)
}

/// Input of `deployers.grant`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrantInput {
    /// The service; it must exist and not be deleting.
    pub service_id: String,
    /// A deployment machine user created with `deployers.create`.
    pub user_id: String,
    /// Replaces the user's capabilities on the service: any of deployment:status,
    /// deployment:reserve, deployment:promote, registry:push, registry:pull.
    pub capabilities: Vec<String>,
}

/// Input of `deployers.revoke`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevokeInput {
    /// The service's id.
    pub service_id: String,
    /// The deployer's user id.
    pub user_id: String,
}

/// A deployer's capabilities on one service.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The service's id.
    pub service_id: String,
    /// The deployer's user id.
    pub user_id: String,
    /// What the deployer may do on the service, sorted and without duplicates.
    pub capabilities: Vec<String>,
    /// The user id of whoever last set the grant.
    pub granted_by: String,
    /// When the grant was last set (milliseconds since the epoch).
    pub granted_at: u64,
}

/// One deployer as `deployers.list` answers it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeployerView {
    /// The deployer's user id.
    pub user_id: String,
    /// The deployer's username, also its registry login name.
    pub username: String,
    /// Whether the user holds a token now.
    pub token_active: bool,
    /// When that token stops working (milliseconds since the epoch).
    pub token_expires_at: Option<u64>,
    /// Its grants, one per service.
    pub grants: Vec<Grant>,
}

/// Answer of `deployers.revoke`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revoked {
    /// The service's id.
    pub service_id: String,
    /// The deployer's user id.
    pub user_id: String,
    /// Whether a grant existed.
    pub revoked: bool,
}

fn check_username(username: &str) -> Result<()> {
    let ok = !username.is_empty()
        && username.len() <= 64
        && username.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && username.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c));
    if !ok {
        return Err(Refusal::new("deployment-machine-user-invalid", "a deployer's username is 1–64 of a-z 0-9 - _ . (no : or /)")
            .with_data(json!({ "field": "username" })));
    }
    capstan_auth::validate_username(username)
}

/// The answer `actor` recorded for this exact request under its `mutationId`, marked replayed.
async fn replayed<T: serde::de::DeserializeOwned + Send>(
    cx: &Context,
    actor: &str,
    mutation_id: Option<&str>,
    request: &(impl Serialize + Sync),
) -> Result<Option<T>> {
    let Some(mutation_id) = mutation_id else { return Ok(None) };
    receipts::check_mutation_id(mutation_id)?;
    let keys = &cx.receipts;
    cx.store.transact(|tx| async move { receipts::replay::<T>(&tx, keys, actor, Some(mutation_id), request).await }).await
}

async fn create(cx: Context, call: Call, input: CreateInput) -> Result<DeployerToken> {
    let actor = call.identity()?.clone();
    actor.require_fresh()?;
    check_username(&input.username)?;
    if let Some(mut answer) = replayed::<DeployerToken>(&cx, &actor.user_id, input.mutation_id.as_deref(), &input).await? {
        answer.replayed = true;
        return Ok(answer);
    }
    let expires_at = expiry(input.expires_at)?;
    let (username, input_ref, keys, actor_id) = (input.username.as_str(), &input, &cx.receipts, actor.user_id.as_str());
    let (token, ()) = capstan_auth::methods::mint_machine_user(&cx.store, &cx.blobs, username, Some(expires_at), |tx, user_id| {
        Box::pin(async move {
            tx.insert(DEPLOYERS, &user_id, json!({ "username": username, "createdAt": now_ms() })).await?;
            // the receipt keeps the answer without the token: a replay never shows it again
            let answer = DeployerToken { user_id, username: username.into(), token: None, generation: 1, expires_at, replayed: false };
            receipts::record(&tx, keys, actor_id, input_ref.mutation_id.as_deref(), input_ref, &answer).await
        })
    })
    .await?;
    Ok(DeployerToken {
        user_id: token.user_id,
        username: token.username,
        token: Some(token.token),
        generation: token.generation,
        expires_at,
        replayed: false,
    })
}

async fn rotate_token(cx: Context, call: Call, input: RotateInput) -> Result<DeployerToken> {
    let actor = call.identity()?.clone();
    if let Some(mut answer) = replayed::<DeployerToken>(&cx, &actor.user_id, input.mutation_id.as_deref(), &input).await? {
        answer.replayed = true;
        return Ok(answer);
    }
    let expires_at = expiry(input.expires_at)?;
    let user = input.user_id.as_str();
    cx.store.transact(|tx| async move { require_deployer(&tx, user).await }).await?;
    let token = capstan_auth::new_machine_token();
    let (input_ref, keys, actor_id) = (&input, &cx.receipts, actor.user_id.as_str());
    let (found, credential, ()) =
        set_machine_token_and(&cx.store, &call, user, Some(&token), Expiry::Set(Some(expires_at)), |tx, found, credential| {
            Box::pin(async move {
                let answer = DeployerToken {
                    user_id: input_ref.user_id.clone(),
                    username: found.username,
                    token: None,
                    generation: credential.generation,
                    expires_at,
                    replayed: false,
                };
                receipts::record(&tx, keys, actor_id, input_ref.mutation_id.as_deref(), input_ref, &answer).await
            })
        })
        .await?;
    tracing::info!(deployer = %found.username, "deployer token rotated");
    Ok(DeployerToken {
        user_id: input.user_id,
        username: found.username,
        token: Some(token),
        generation: credential.generation,
        expires_at,
        replayed: false,
    })
}

async fn revoke_token(cx: Context, call: Call, input: UserInput) -> Result<TokenRevoked> {
    let actor = call.identity()?.clone();
    if let Some(mut answer) = replayed::<TokenRevoked>(&cx, &actor.user_id, input.mutation_id.as_deref(), &input).await? {
        answer.replayed = true;
        return Ok(answer);
    }
    let user = input.user_id.as_str();
    cx.store.transact(|tx| async move { require_deployer(&tx, user).await }).await?;
    let answer = TokenRevoked { user_id: input.user_id.clone(), token_active: false, replayed: false };
    let (input_ref, keys, actor_id, answer_ref) = (&input, &cx.receipts, actor.user_id.as_str(), &answer);
    let (found, _, ()) = set_machine_token_and(&cx.store, &call, user, None, Expiry::Set(None), |tx, _, _| {
        Box::pin(async move { receipts::record(&tx, keys, actor_id, input_ref.mutation_id.as_deref(), input_ref, answer_ref).await })
    })
    .await?;
    tracing::info!(deployer = %found.username, "deployer token revoked");
    Ok(answer)
}

/// Refuse anyone who is not a deployer created by `deployers.create`.
async fn require_deployer(tx: &Tx, user_id: &str) -> Result<()> {
    let known = capstan_store::validate_id(user_id).is_ok() && tx.get(DEPLOYERS, user_id).await?.is_some();
    if !known {
        return Err(Refusal::new("deployment-machine-user-invalid", "grants go to deployment machine users created with deployers.create")
            .with_data(json!({ "field": "userId" })));
    }
    Ok(())
}

async fn grant(cx: Context, call: Call, input: GrantInput) -> Result<Grant> {
    let identity = call.identity()?.clone();
    let mut capabilities = input.capabilities.clone();
    capabilities.sort();
    capabilities.dedup();
    if let Some(unknown) = capabilities.iter().find(|c| !CAPABILITIES.contains(&c.as_str())) {
        let shown: String = unknown.chars().take(64).collect();
        return Err(Refusal::new("deployment-capability-unknown", format!("{shown:?} is not one of {}", CAPABILITIES.join(", ")))
            .with_data(json!({ "field": "capabilities" })));
    }
    if capabilities.is_empty() {
        return Err(Refusal::invalid_request("name at least one capability; revoke with deployers.revoke")
            .with_data(json!({ "field": "capabilities" })));
    }
    let grant = Grant {
        service_id: input.service_id.clone(),
        user_id: input.user_id.clone(),
        capabilities,
        granted_by: identity.user_id.clone(),
        granted_at: now_ms(),
    };
    let grant_ref = &grant;
    cx.store
        .transact(|tx| async move {
            require_active(&tx, &grant_ref.service_id).await?;
            require_deployer(&tx, &grant_ref.user_id).await?;
            let id = grant_id(&grant_ref.service_id, &grant_ref.user_id);
            match tx.get(SERVICE_GRANTS, &id).await? {
                Some(doc) => tx.replace(SERVICE_GRANTS, &id, doc.revision, to_value(grant_ref)?).await?,
                None => tx.insert(SERVICE_GRANTS, &id, to_value(grant_ref)?).await?,
            };
            emit(
                &tx,
                "service.deployerGranted",
                &grant_ref.service_id,
                json!({ "id": grant_ref.service_id, "userId": grant_ref.user_id, "capabilities": grant_ref.capabilities }),
            )
            .await
        })
        .await?;
    tracing::info!(service = %grant.service_id, user = %grant.user_id, capabilities = ?grant.capabilities, "deployer granted");
    Ok(grant)
}

async fn revoke(cx: Context, _: Call, input: RevokeInput) -> Result<Revoked> {
    let input = &input;
    cx.store
        .transact(|tx| async move {
            super::services::require_service(&tx, &input.service_id).await?;
            let id = grant_id(&input.service_id, &input.user_id);
            let revoked = match tx.get(SERVICE_GRANTS, &id).await? {
                Some(doc) => {
                    tx.delete(SERVICE_GRANTS, &id, doc.revision).await?;
                    emit(&tx, "service.deployerRevoked", &input.service_id, json!({ "id": input.service_id, "userId": input.user_id }))
                        .await?;
                    true
                }
                None => false,
            };
            Ok(Revoked { service_id: input.service_id.clone(), user_id: input.user_id.clone(), revoked })
        })
        .await
}

async fn list(cx: Context, _: Call, input: PageInput) -> Result<Listing<DeployerView>> {
    let limit = input.limit();
    let cursor = input.cursor.as_deref();
    cx.store
        .transact(|tx| async move {
            let page = tx.scan(DEPLOYERS, cursor, limit).await?;
            let mut items = Vec::new();
            for doc in &page.documents {
                let credential = tx.get(capstan_auth::CREDENTIALS, &doc.id).await?;
                let token_active = credential.as_ref().is_some_and(|c| !c.data["tokenHash"].is_null());
                let token_expires_at = credential.as_ref().and_then(|c| c.data["tokenExpiresAt"].as_u64()).filter(|_| token_active);
                let grants = tx.find(SERVICE_GRANTS, "by_user", &[json!(doc.id)], None, capstan_store::MAX_PAGE).await?;
                let grants = grants.documents.iter().map(|g| super::parse::<Grant>(g).map(|e| e.data)).collect::<Result<_>>()?;
                items.push(DeployerView {
                    user_id: doc.id.clone(),
                    username: doc.data["username"].as_str().unwrap_or_default().into(),
                    token_active,
                    token_expires_at,
                    grants,
                });
            }
            Ok(Listing { items, next_cursor: page.next_cursor })
        })
        .await
}

/// Register the `deployers.*` methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "deployers.create",
            "Create a deployment machine user; its token is shown this once (administrator, fresh login)",
            Access::Admin,
            create,
        )
        .refuses(&[
            "admin-not-fresh",
            "deployment-machine-user-invalid",
            "expiry-invalid",
            "exists",
            "blobs-unavailable",
            "identity-claimed",
            "mutation-reused",
        ]);
    registry
        .add(
            "deployers.grant",
            "Give a deployment machine user capabilities on one service, replacing what it held there (administrator)",
            Access::Admin,
            grant,
        )
        .refuses(&["deployment-capability-unknown", "service-not-found", "service-deleting", "deployment-machine-user-invalid"]);
    registry.add(
        "deployers.rotateToken",
        "Replace every token of a deployer with one new token (shown this once); sessions of the old one end (administrator, fresh login)",
        Access::Admin,
        rotate_token,
    ).refuses(&["expiry-invalid", "deployment-machine-user-invalid", "admin-not-fresh", "wrong-user-kind", "not-found", "mutation-reused"]);
    registry
        .add(
            "deployers.revokeToken",
            "Remove a deployer's token; its grants stay and every session it opened ends (administrator, fresh login)",
            Access::Admin,
            revoke_token,
        )
        .refuses(&["deployment-machine-user-invalid", "admin-not-fresh", "wrong-user-kind", "not-found", "mutation-reused"]);
    registry
        .add("deployers.revoke", "Remove a deployment machine user's grant on a service (administrator)", Access::Admin, revoke)
        .refuses(&["service-not-found"]);
    registry
        .add("deployers.list", "Deployment machine users with their grants, never a token (administrator)", Access::Admin, list)
        .read_only();
}
