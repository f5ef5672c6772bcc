//! The `auth.*` and `admin.*` API methods.

use super::*;
use capstan_rpc::receipts;
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;

/// Input of `auth.login`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginInput {
    /// The username.
    pub username: String,
    /// The user's password.
    pub password: String,
}

/// Input of `auth.exchangeToken`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExchangeInput {
    /// A machine user's token.
    pub token: String,
}

/// No input.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// Answer of `auth.logout`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoggedOut {
    /// Always true: the caller's session has ended.
    pub logged_out: bool,
}

/// Names one user.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UserRef {
    /// The user's id.
    pub user_id: String,
}

/// A user's credential metadata; never the password verifier or the token.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CredentialView {
    /// The user's id.
    pub user_id: String,
    /// The credential generation: advances on every change to the credential.
    pub generation: u64,
    /// Whether password login is enabled.
    pub password_enabled: bool,
    /// When the credential last changed (milliseconds since the epoch).
    pub updated_at: u64,
}

/// One credential operation.
#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Operation {
    /// Replace the password (at least 20 characters, at most 1024 UTF-8 bytes).
    RotatePassword {
        /// The new password.
        #[serde(rename = "newPassword")]
        new_password: String,
    },
    /// Disable password login.
    RevokePassword {},
    /// End every session of the user.
    RevokeSessions {},
}

/// Input of `admin.mutateHumanCredential`.
#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MutateInput {
    /// The human user whose credential changes.
    pub user_id: String,
    /// The credential generation the change is based on; a different current generation is
    /// refused as a conflict.
    pub expected_generation: u64,
    /// A stable id for this change: repeating it with the same request replays the answer.
    pub mutation_id: String,
    /// The change to make.
    pub operation: Operation,
}

/// Answer of `admin.mutateHumanCredential`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MutationAnswer {
    /// The credential after the change.
    #[serde(flatten)]
    pub credential: CredentialView,
    /// Whether this answer replays an earlier request with the same mutation id.
    pub replayed: bool,
}

/// Input of `admin.createMachineUser`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateMachineUser {
    /// The new machine user's username: 1 to 64 of `A-Z a-z 0-9 - _ . @`, starting with a
    /// letter or digit and not with `cluster-` or `pallet-registry-`.
    pub username: String,
}

/// A machine user with its new token.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineToken {
    /// The machine user's id.
    pub user_id: String,
    /// The machine user's username.
    pub username: String,
    /// Shown this once; Capstan keeps only its SHA-256.
    pub token: String,
    /// The credential generation after this token was set.
    pub generation: u64,
}

/// Input of `admin.listMachineUsers`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListInput {
    /// Where to continue: the `nextCursor` of the previous page; absent for the first page.
    pub cursor: Option<String>,
    /// At most 100 (default 50).
    pub limit: Option<usize>,
}

/// One machine user in a listing.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineUserView {
    /// The machine user's id.
    pub user_id: String,
    /// The machine user's username.
    pub username: String,
    /// Whether the user has a token (false once its tokens are revoked).
    pub token_active: bool,
    /// The credential generation.
    pub generation: u64,
    /// When the user was created (milliseconds since the epoch).
    pub created_at: u64,
}

/// A page of machine users.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineUserPage {
    /// The machine users on this page.
    pub users: Vec<MachineUserView>,
    /// Pass as `cursor` to fetch the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

fn view(user_id: &str, c: &Credential) -> CredentialView {
    CredentialView { user_id: user_id.into(), generation: c.generation, password_enabled: c.verifier.is_some(), updated_at: c.updated_at }
}

async fn load_credential(tx: &Tx, user_id: &str, kind: &str) -> Result<(Document, Credential)> {
    let user = tx.get(USERS, user_id).await?.map(|d| parse::<User>(&d)).transpose()?;
    match user {
        Some(u) if u.kind == kind => {}
        Some(_) => return Err(Refusal::new("wrong-user-kind", format!("user {user_id} is not a {kind} user"))),
        None => return Err(Refusal::not_found(format!("user {user_id}"))),
    }
    let doc = tx.require(CREDENTIALS, user_id).await?;
    let credential = parse::<Credential>(&doc)?;
    Ok((doc, credential))
}

/// What the `auth.*` and `admin.*` methods reach.
#[derive(Clone)]
pub struct Context {
    /// The authentication service.
    pub auth: Arc<Auth>,
    /// The store holding users, credentials and sessions.
    pub store: Store,
    /// The blob store, where new user ids are claimed.
    pub blobs: Blobs,
}

async fn mutate_credential(cx: Context, call: Call, input: MutateInput) -> Result<MutationAnswer> {
    let actor = call.identity()?.clone();
    actor.require_fresh()?;
    receipts::check_mutation_id(&input.mutation_id)?;
    // hash outside the transaction: it is slow, and the transaction may run twice
    let verifier = match &input.operation {
        Operation::RotatePassword { new_password } => {
            password::check_policy(new_password)?;
            Some(cx.auth.hash_password(new_password).await?)
        }
        _ => None,
    };
    let (input, verifier, actor_id, keys) = (&input, &verifier, actor.user_id.as_str(), cx.auth.receipt_keys());
    let answer = cx
        .store
        .transact(|tx| async move {
            if let Some(mut answer) = receipts::replay::<MutationAnswer>(&tx, keys, actor_id, Some(&input.mutation_id), input).await? {
                answer.replayed = true;
                return Ok(answer);
            }
            let (doc, mut credential) = load_credential(&tx, &input.user_id, "human").await?;
            if credential.generation != input.expected_generation {
                return Err(Refusal::new(
                    "conflict",
                    format!("the credential is at generation {}, not {}", credential.generation, input.expected_generation),
                )
                .with_data(json!({ "generation": credential.generation })));
            }
            match &input.operation {
                Operation::RotatePassword { .. } => credential.verifier = verifier.clone(),
                Operation::RevokePassword {} => credential.verifier = None,
                Operation::RevokeSessions {} => {}
            }
            credential.generation += 1;
            credential.updated_at = now_ms();
            tx.replace(CREDENTIALS, &input.user_id, doc.revision, to_value(&credential)?).await?;
            revoke_sessions(&tx, &input.user_id).await?;
            let answer = MutationAnswer { credential: view(&input.user_id, &credential), replayed: false };
            receipts::record(&tx, keys, actor_id, Some(&input.mutation_id), input, &answer).await?;
            Ok(answer)
        })
        .await?;
    if !answer.replayed {
        tracing::info!(actor = %actor.username, target = %answer.credential.user_id, generation = answer.credential.generation, "human credential changed");
    }
    Ok(answer)
}

/// Input of `admin.createUser`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    /// The new user's username: 1 to 64 of `A-Z a-z 0-9 - _ . @`, starting with a letter or
    /// digit and not with `cluster-` or `pallet-registry-`.
    pub username: String,
    /// An infrastructure administrator (default false). Organization roles are separate.
    #[serde(default)]
    pub admin: bool,
}

/// Answer of `admin.createUser`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedUser {
    /// The new user's id.
    pub user_id: String,
    /// The new user's username.
    pub username: String,
    /// Whether the new user is an infrastructure administrator.
    pub admin: bool,
    /// A generated password, shown this once; the user changes it after logging in.
    pub password: String,
}

async fn create_user(cx: Context, call: Call, input: CreateUser) -> Result<CreatedUser> {
    call.identity()?.require_fresh()?;
    validate_username(&input.username)?;
    let password = password::generate();
    let verifier = cx.auth.hash_password(&password).await?;
    let user_id = claim_user_id(&cx.blobs, "user").await?;
    let (username, id, admin) = (input.username.as_str(), user_id.as_str(), input.admin);
    cx.store
        .transact(|tx| {
            let verifier = verifier.clone();
            async move {
                if find_user_by_name(&tx, username).await?.is_some() {
                    return Err(Refusal::new("exists", format!("a user named {username} exists")));
                }
                let (user, credential) = human_records(username, admin, verifier);
                insert_user(&tx, id, &user, &credential).await
            }
        })
        .await?;
    tracing::info!(user = %input.username, admin, "user created");
    Ok(CreatedUser { user_id, username: input.username, admin, password })
}

async fn create_machine_user(cx: Context, call: Call, input: CreateMachineUser) -> Result<MachineToken> {
    call.identity()?.require_fresh()?;
    validate_username(&input.username)?;
    Ok(mint_machine_user(&cx.store, &cx.blobs, &input.username, None, |_, _| Box::pin(async { Ok(()) })).await?.0)
}

/// Create a machine user and its token (returned this once). `also` runs in the same
/// transaction with the new user's id, for callers that write more with it (a deployer, a
/// cluster); a refusal from it creates nothing.
pub async fn mint_machine_user<'c, T, F>(
    store: &Store,
    blobs: &Blobs,
    username: &str,
    expires_at: Option<u64>,
    also: F,
) -> Result<(MachineToken, T)>
where
    T: Send,
    F: Fn(Tx, String) -> futures::future::BoxFuture<'c, Result<T>> + Send + Sync,
{
    let token = new_machine_token();
    let hash = token_hash(&token);
    let user_id = claim_user_id(blobs, "machine").await?;
    let (hash_ref, id, also) = (hash.as_str(), user_id.as_str(), &also);
    let extra = store
        .transact(|tx| async move {
            if find_user_by_name(&tx, username).await?.is_some() {
                return Err(Refusal::new("exists", format!("a user named {username} exists")));
            }
            let at = now_ms();
            let user = User { username: username.into(), kind: "machine".into(), admin: false, created_at: at, disabled: false };
            let credential = Credential {
                kind: "machine".into(),
                generation: 1,
                verifier: None,
                token_hash: Some(hash_ref.into()),
                updated_at: at,
                token_expires_at: expires_at,
            };
            insert_user(&tx, id, &user, &credential).await?;
            also(tx.clone(), id.to_string()).await
        })
        .await;
    let extra = extra?;
    tracing::info!(machine_user = %username, "machine user created");
    Ok((MachineToken { user_id, username: username.into(), token, generation: 1 }, extra))
}

/// How a new machine token expires.
#[derive(Debug, Clone, Copy)]
pub enum Expiry {
    /// As the token it replaces did.
    Keep,
    /// At this moment (milliseconds since the epoch), or never.
    Set(Option<u64>),
}

/// Replace (or with `None`, remove) a machine user's token; every session opened with the
/// old token ends because its JWT names the old hash.
pub async fn set_machine_token(
    store: &Store,
    call: &Call,
    user_id: &str,
    token: Option<&str>,
    expiry: Expiry,
) -> Result<(User, Credential)> {
    set_machine_token_and(store, call, user_id, token, expiry, |_, _, _| Box::pin(async { Ok(()) }))
        .await
        .map(|(user, credential, ())| (user, credential))
}

/// [`set_machine_token`], and `also` in the same transaction (given the user and its new
/// credential): what the caller writes with it (a mutation receipt, say) commits with it.
pub async fn set_machine_token_and<'c, T, F>(
    store: &Store,
    call: &Call,
    user_id: &str,
    token: Option<&str>,
    expiry: Expiry,
    also: F,
) -> Result<(User, Credential, T)>
where
    T: Send,
    F: Fn(Tx, User, Credential) -> futures::future::BoxFuture<'c, Result<T>> + Send + Sync,
{
    call.identity()?.require_fresh()?;
    let hash = token.map(token_hash);
    let (hash, also) = (hash.as_deref(), &also);
    store
        .transact(|tx| async move {
            let (doc, mut credential) = load_credential(&tx, user_id, "machine").await?;
            let user = parse::<User>(&tx.require(USERS, user_id).await?)?;
            credential.token_hash = hash.map(str::to_string);
            if let Expiry::Set(at) = expiry {
                credential.token_expires_at = at;
            }
            credential.generation += 1;
            credential.updated_at = now_ms();
            tx.replace(CREDENTIALS, user_id, doc.revision, to_value(&credential)?).await?;
            revoke_sessions(&tx, user_id).await?;
            let extra = also(tx.clone(), user.clone(), credential.clone()).await?;
            Ok((user, credential, extra))
        })
        .await
}

async fn list_machine_users(cx: Context, _: Call, input: ListInput) -> Result<MachineUserPage> {
    let limit = input.limit.unwrap_or(50).clamp(1, 100);
    let cursor = input.cursor.as_deref();
    cx.store
        .transact(|tx| async move {
            let page = tx.find(USERS, "by_kind", &[json!("machine")], cursor, limit).await?;
            let mut users = Vec::new();
            for doc in &page.documents {
                let user = parse::<User>(doc)?;
                let credential = parse::<Credential>(&tx.require(CREDENTIALS, &doc.id).await?)?;
                users.push(MachineUserView {
                    user_id: doc.id.clone(),
                    username: user.username,
                    token_active: credential.token_hash.is_some(),
                    generation: credential.generation,
                    created_at: user.created_at,
                });
            }
            Ok(MachineUserPage { users, next_cursor: page.next_cursor })
        })
        .await
}

/// Register the `auth.*` and `admin.*` methods with `cx` as their context.
pub fn register(registry: &mut Registry, cx: Context) {
    crate::users::register(registry, cx.clone());
    let mut registry = registry.with(cx);
    registry
        .add(
            "auth.login",
            "Username and password to a session JWT (one uniform denial on any mistake)",
            Access::Public,
            |cx: Context, call: Call, input: LoginInput| async move { cx.auth.login(&input.username, &input.password, call.source).await },
        )
        .refuses(&["unauthenticated", "rate-limited"]);
    registry
        .add(
            "auth.exchangeToken",
            "A machine user's token to a session JWT bound to that token",
            Access::Public,
            |cx: Context, call: Call, input: ExchangeInput| async move { cx.auth.exchange_token(&input.token, call.source).await },
        )
        .refuses(&["unauthenticated", "rate-limited"]);
    registry
        .add("auth.whoami", "The caller's identity and session", Access::Authenticated, |_: Context, call: Call, _: Empty| async move {
            call.identity().cloned()
        })
        .read_only();
    registry.add("auth.logout", "End the caller's session", Access::Authenticated, |cx: Context, call: Call, _: Empty| async move {
        cx.auth.logout(call.identity()?).await?;
        Ok(LoggedOut { logged_out: true })
    });
    registry
        .add(
            "admin.getHumanCredential",
            "A human user's credential metadata (needs a login from the last 5 minutes)",
            Access::Admin,
            |cx: Context, call: Call, input: UserRef| async move {
                call.identity()?.require_fresh()?;
                let id = input.user_id.as_str();
                cx.store.transact(|tx| async move { Ok(view(id, &load_credential(&tx, id, "human").await?.1)) }).await
            },
        )
        .refuses(&["admin-not-fresh", "wrong-user-kind", "not-found"])
        .read_only();
    registry
        .add(
            "admin.mutateHumanCredential",
            "rotatePassword, revokePassword or revokeSessions with an expected generation and a mutationId (fresh login required)",
            Access::Admin,
            mutate_credential,
        )
        .refuses(&[
            "admin-not-fresh",
            "password-too-short",
            "password-too-long",
            "mutation-reused",
            "wrong-user-kind",
            "not-found",
            "conflict",
        ]);
    registry
        .add(
            "admin.createUser",
            "Create a person's account with a generated password shown this once (administrator, fresh login)",
            Access::Admin,
            create_user,
        )
        .refuses(&["admin-not-fresh", "username-reserved", "exists", "blobs-unavailable", "identity-claimed"]);
    registry
        .add("admin.createMachineUser", "Create a machine user; its token is returned this once", Access::Admin, create_machine_user)
        .refuses(&["admin-not-fresh", "username-reserved", "exists", "blobs-unavailable", "identity-claimed"]);
    registry
        .add(
            "admin.rotateMachineToken",
            "Give a machine user a new token (returned once); sessions of the old one end",
            Access::Admin,
            |cx: Context, call: Call, input: UserRef| async move {
                let token = new_machine_token();
                let (user, credential) = set_machine_token(&cx.store, &call, &input.user_id, Some(&token), Expiry::Keep).await?;
                Ok(MachineToken { user_id: input.user_id, username: user.username, token, generation: credential.generation })
            },
        )
        .refuses(&["admin-not-fresh", "wrong-user-kind", "not-found"]);
    registry
        .add(
            "admin.revokeMachineTokens",
            "Remove a machine user's token; every session opened with it ends",
            Access::Admin,
            |cx: Context, call: Call, input: UserRef| async move {
                let (_, credential) = set_machine_token(&cx.store, &call, &input.user_id, None, Expiry::Keep).await?;
                Ok(view(&input.user_id, &credential))
            },
        )
        .refuses(&["admin-not-fresh", "wrong-user-kind", "not-found"]);
    registry.add("admin.listMachineUsers", "Machine users, paged", Access::Admin, list_machine_users).read_only();
}
