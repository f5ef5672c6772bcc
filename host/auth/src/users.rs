//! The `users.*` methods: the people who log in — listed, disabled and enabled again, given a
//! generated password — and the offline password reset an operator runs on a host whose
//! administrator password is lost.
//!
//! Every change advances the user's credential generation (so every JWT issued before it dies),
//! ends the user's sessions, and writes a `user.*` event in the same transaction. A generated
//! password is answered once and never logged.

use super::*;
use capstan_rpc::{Access, Call, Registry};
use methods::Context;
use schemars::JsonSchema;

/// Input of `users.list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListUsers {
    /// Where to continue: the `nextCursor` of the previous page; absent for the first page.
    pub cursor: Option<String>,
    /// At most 100 (default 50).
    pub limit: Option<usize>,
}

/// One person in a listing (never a verifier or a password).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UserView {
    /// The user's id.
    pub user_id: String,
    /// The login name.
    pub username: String,
    /// Whether the user is an infrastructure administrator.
    pub admin: bool,
    /// Whether the user is disabled: no login, no session.
    pub disabled: bool,
    /// Whether password login is enabled.
    pub password_enabled: bool,
    /// The credential generation: state it as `expectedGeneration` to change the user.
    pub generation: u64,
    /// When the user was created (milliseconds since the epoch).
    pub created_at: u64,
}

/// A page of people.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserPage {
    /// The people on this page, in id order.
    pub users: Vec<UserView>,
    /// Pass as `cursor` to fetch the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// Input of `users.setDisabled`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SetDisabled {
    /// The person to disable or enable.
    pub user_id: String,
    /// True to disable (login refused, sessions ended), false to enable again.
    pub disabled: bool,
    /// The credential generation read; another is refused as `conflict`.
    pub expected_generation: u64,
}

/// Input of `users.resetPassword` and `users.revokeSessions`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UserAtGeneration {
    /// The person.
    pub user_id: String,
    /// The credential generation read; another is refused as `conflict`.
    pub expected_generation: u64,
}

/// Answer of `users.setDisabled` and `users.revokeSessions`.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserChanged {
    /// The person after the change.
    #[serde(flatten)]
    pub user: UserView,
    /// How many of the person's sessions ended.
    pub sessions_revoked: usize,
}

/// Answer of `users.resetPassword` and of the offline reset.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PasswordReset {
    /// The person after the change.
    #[serde(flatten)]
    pub user: UserView,
    /// The new generated password, shown this once; Capstan keeps only its verifier.
    pub password: String,
    /// How many of the person's sessions ended.
    pub sessions_revoked: usize,
}

impl std::fmt::Debug for PasswordReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordReset").field("user", &self.user).field("sessions_revoked", &self.sessions_revoked).finish_non_exhaustive()
    }
}

fn user_view(id: &str, user: &User, credential: &Credential) -> UserView {
    UserView {
        user_id: id.into(),
        username: user.username.clone(),
        admin: user.admin,
        disabled: user.disabled,
        password_enabled: credential.verifier.is_some(),
        generation: credential.generation,
        created_at: user.created_at,
    }
}

/// A person's user and credential documents, or `user-not-found` (a machine user too: these
/// methods manage people).
async fn load_person(tx: &Tx, user_id: &str) -> Result<(Document, User, Document, Credential)> {
    let not_found = || Refusal::new("user-not-found", format!("no person has the id {user_id}")).with_data(json!({ "field": "userId" }));
    let Some(user_doc) = tx.get(USERS, user_id).await? else { return Err(not_found()) };
    let user = parse::<User>(&user_doc)?;
    if user.kind != "human" {
        return Err(not_found());
    }
    let credential_doc = tx.require(CREDENTIALS, user_id).await?;
    let credential = parse::<Credential>(&credential_doc)?;
    Ok((user_doc, user, credential_doc, credential))
}

fn check_generation(credential: &Credential, expected: u64) -> Result<()> {
    if credential.generation != expected {
        return Err(Refusal::new("conflict", format!("the credential is at generation {}, not {expected}", credential.generation))
            .with_data(json!({ "generation": credential.generation })));
    }
    Ok(())
}

/// Advance the credential (with `verifier` when given), end the person's sessions and write
/// `kind` to the outbox, in the caller's transaction.
async fn advance(
    tx: &Tx,
    user_id: &str,
    user: &User,
    doc: &Document,
    mut credential: Credential,
    verifier: Option<String>,
    kind: &str,
) -> Result<(UserView, usize)> {
    if let Some(verifier) = verifier {
        credential.verifier = Some(verifier);
    }
    credential.generation += 1;
    credential.updated_at = now_ms();
    tx.replace(CREDENTIALS, user_id, doc.revision, to_value(&credential)?).await?;
    let revoked = revoke_sessions(tx, user_id).await?;
    let view = user_view(user_id, user, &credential);
    capstan_events::append(tx, kind, user_id, json!({ "userId": user_id, "username": user.username }), "host").await?;
    Ok((view, revoked))
}

async fn enabled_admins(tx: &Tx) -> Result<usize> {
    let (mut count, mut cursor) = (0, None::<String>);
    loop {
        let page = tx.find(USERS, "by_kind", &[json!("human")], cursor.as_deref(), capstan_store::MAX_PAGE).await?;
        for doc in &page.documents {
            let user = parse::<User>(doc)?;
            count += usize::from(user.admin && !user.disabled);
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(count),
        }
    }
}

async fn list(cx: Context, _: Call, input: ListUsers) -> Result<UserPage> {
    let limit = input.limit.unwrap_or(50).clamp(1, 100);
    let cursor = input.cursor.as_deref();
    cx.store
        .transact(|tx| async move {
            let page = tx.find(USERS, "by_kind", &[json!("human")], cursor, limit).await?;
            let mut users = Vec::new();
            for doc in &page.documents {
                let user = parse::<User>(doc)?;
                let credential = parse::<Credential>(&tx.require(CREDENTIALS, &doc.id).await?)?;
                users.push(user_view(&doc.id, &user, &credential));
            }
            Ok(UserPage { users, next_cursor: page.next_cursor })
        })
        .await
}

async fn set_disabled(cx: Context, call: Call, input: SetDisabled) -> Result<UserChanged> {
    let actor = call.identity()?.clone();
    actor.require_fresh()?;
    if input.disabled && input.user_id == actor.user_id {
        return Err(Refusal::new("user-is-self", "you cannot disable your own account: another administrator can")
            .with_data(json!({ "field": "userId" })));
    }
    let input = &input;
    let (user, revoked) = cx
        .store
        .transact(|tx| async move {
            let (user_doc, mut user, credential_doc, credential) = load_person(&tx, &input.user_id).await?;
            check_generation(&credential, input.expected_generation)?;
            if user.disabled == input.disabled {
                return Ok((user_view(&input.user_id, &user, &credential), 0));
            }
            if input.disabled && user.admin && enabled_admins(&tx).await? <= 1 {
                return Err(Refusal::new("last-administrator", "this is the last enabled administrator: enable or create another first"));
            }
            user.disabled = input.disabled;
            tx.replace(USERS, &input.user_id, user_doc.revision, to_value(&user)?).await?;
            let kind = if input.disabled { "user.disabled" } else { "user.enabled" };
            advance(&tx, &input.user_id, &user, &credential_doc, credential, None, kind).await
        })
        .await?;
    tracing::info!(actor = %actor.username, user = %user.username, disabled = user.disabled, "user access changed");
    Ok(UserChanged { user, sessions_revoked: revoked })
}

async fn reset_password(cx: Context, call: Call, input: UserAtGeneration) -> Result<PasswordReset> {
    let actor = call.identity()?.clone();
    actor.require_fresh()?;
    let password = password::generate();
    // hash outside the transaction: it is slow, and the transaction may run twice
    let verifier = cx.auth.hash_password(&password).await?;
    let (input, verifier) = (&input, verifier.as_str());
    let (user, revoked) = cx
        .store
        .transact(|tx| async move {
            let (_, user, credential_doc, credential) = load_person(&tx, &input.user_id).await?;
            check_generation(&credential, input.expected_generation)?;
            advance(&tx, &input.user_id, &user, &credential_doc, credential, Some(verifier.into()), "user.passwordReset").await
        })
        .await?;
    tracing::info!(actor = %actor.username, user = %user.username, sessions_revoked = revoked, "password reset");
    Ok(PasswordReset { user, password, sessions_revoked: revoked })
}

async fn revoke(cx: Context, call: Call, input: UserAtGeneration) -> Result<UserChanged> {
    let actor = call.identity()?.clone();
    actor.require_fresh()?;
    let input = &input;
    let (user, revoked) = cx
        .store
        .transact(|tx| async move {
            let (_, user, credential_doc, credential) = load_person(&tx, &input.user_id).await?;
            check_generation(&credential, input.expected_generation)?;
            advance(&tx, &input.user_id, &user, &credential_doc, credential, None, "user.sessionsRevoked").await
        })
        .await?;
    tracing::info!(actor = %actor.username, user = %user.username, sessions_revoked = revoked, "sessions revoked");
    Ok(UserChanged { user, sessions_revoked: revoked })
}

/// The offline reset (`capstan admin reset-password`): give the person `username` a generated
/// password, enable them if disabled, end their sessions and write `user.passwordReset`, all
/// in one transaction on the store itself — for a host whose administrator password is lost,
/// run by whoever holds the store and the keyring.
pub async fn reset_password_offline(store: &Store, username: &str) -> Result<PasswordReset> {
    let no_person = || Refusal::new("user-not-found", format!("no person is named {username}")).with_data(json!({ "field": "username" }));
    validate_username(username).map_err(|_| no_person())?;
    let password = password::generate();
    let pw = password.clone();
    let verifier = tokio::task::spawn_blocking(move || password::hash(&pw)).await.map_err(Refusal::internal)??;
    let verifier = verifier.as_str();
    let (user, revoked) = store
        .transact(|tx| async move {
            let Some((id, _)) = find_user_by_name(&tx, username).await? else { return Err(no_person()) };
            let (user_doc, mut user, credential_doc, credential) = load_person(&tx, &id).await.map_err(|_| no_person())?;
            if user.disabled {
                user.disabled = false;
                tx.replace(USERS, &id, user_doc.revision, to_value(&user)?).await?;
            }
            advance(&tx, &id, &user, &credential_doc, credential, Some(verifier.into()), "user.passwordReset").await
        })
        .await?;
    tracing::info!(user = %user.username, sessions_revoked = revoked, "password reset offline");
    Ok(PasswordReset { user, password, sessions_revoked: revoked })
}

/// Register the `users.*` methods with `cx` as their context.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add("users.list", "People (human users), paged: administrator, disabled, credential generation", Access::Admin, list)
        .read_only();
    registry
        .add(
            "users.setDisabled",
            "Disable a person (login refused, sessions ended) or enable them again, with the generation read (administrator, fresh login)",
            Access::Admin,
            set_disabled,
        )
        .refuses(&["admin-not-fresh", "user-is-self", "user-not-found", "conflict", "last-administrator"]);
    registry.add(
        "users.resetPassword",
        "Give a person a generated password shown this once and end their sessions, with the generation read (administrator, fresh login)",
        Access::Admin,
        reset_password,
    ).refuses(&["admin-not-fresh", "user-not-found", "conflict"]);
    registry
        .add(
            "users.revokeSessions",
            "End every session of a person, with the generation read (administrator, fresh login)",
            Access::Admin,
            revoke,
        )
        .refuses(&["admin-not-fresh", "user-not-found", "conflict"]);
}
