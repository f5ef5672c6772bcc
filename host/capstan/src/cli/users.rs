//! `capstan users list | create | disable | enable | reset-password | revoke-sessions`: people's
//! accounts on a running host, clients of `users.*` and `admin.createUser` (administrators; every
//! change needs a login from the last 5 minutes).
//!
//! A person is named by username or id. A change states the credential generation it read:
//! the CLI reads the person first and writes against that, so a change in between is refused
//! `conflict`. A generated password goes to standard output once, never to a log.

use super::client::{Client, Common, finish, print_json, print_table, text, utc};
use super::confirm::{Confirm, ask, can_confirm};
use super::inventory;
use super::resolve;
use crate::refusal::{Refusal, Result};
use clap::Subcommand;
use serde_json::{Value, json};
use std::process::ExitCode;

/// The most pages a lookup by username reads (100 people each).
const MAX_PAGES: usize = 1000;

#[derive(Subcommand)]
pub enum UsersCommand {
    /// People (human users) with whether each is an administrator or disabled (`users.list`).
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Create a person's account with a generated password (`admin.createUser`).
    ///
    /// The password is printed once, on standard output; Capstan keeps only a verifier, so it
    /// cannot be shown again. The person logs in with `capstan login --username NAME`.
    /// --admin makes an infrastructure administrator; organization roles are given with
    /// `capstan organizations set-member`.
    Create {
        /// The username (1–64 of A-Z a-z 0-9 - _ . @, starting with a letter or digit)
        username: String,
        /// Make the person an infrastructure administrator
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Disable a person: their login is refused and their sessions end (`users.setDisabled`).
    Disable {
        /// The person's username or id
        user: String,
        #[command(flatten)]
        common: Common,
    },
    /// Enable a disabled person again; their password is the one they had.
    Enable {
        /// The person's username or id
        user: String,
        #[command(flatten)]
        common: Common,
    },
    /// Give a person a generated password, printed once, and end their sessions
    /// (`users.resetPassword`). For a lost administrator password on a host you operate, see
    /// `capstan admin reset-password`.
    ResetPassword {
        /// The person's username or id
        user: String,
        #[command(flatten)]
        common: Common,
    },
    /// End every session of a person; their password stays (`users.revokeSessions`). Asks on a
    /// terminal ([y/N]); refused `confirmation-required` without --yes when standard input is
    /// not a terminal.
    RevokeSessions {
        /// The person's username or id
        user: String,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
}

pub fn run(command: UsersCommand) -> ExitCode {
    let (result, json) = match command {
        UsersCommand::List { common } => (list(&common), common.json),
        UsersCommand::Create { username, admin, common } => {
            return inventory::users(inventory::UsersCommand::Create { username, admin, common });
        }
        UsersCommand::Disable { user, common } => (set_disabled(&user, true, &common), common.json),
        UsersCommand::Enable { user, common } => (set_disabled(&user, false, &common), common.json),
        UsersCommand::ResetPassword { user, common } => (reset_password(&user, &common), common.json),
        UsersCommand::RevokeSessions { user, confirm, common } => (revoke_sessions(&user, &confirm, &common), common.json),
    };
    finish(result, json)
}

/// Every person, page by page (bounded).
fn all(client: &Client) -> Result<Vec<Value>> {
    let (mut people, mut cursor) = (Vec::new(), None::<String>);
    for _ in 0..MAX_PAGES {
        let page = client.call("users.list", &json!({ "cursor": cursor, "limit": 100 }))?;
        people.extend(page["users"].as_array().cloned().unwrap_or_default());
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return Ok(people),
        }
    }
    Err(Refusal::new("too-many-users", "more people than one lookup reads: name the person by id"))
}

/// The person `name` names (a username or an id, as the shared resolver reads them), as
/// `users.list` shows them.
pub fn find(client: &Client, name: &str) -> Result<Value> {
    let people = all(client)?;
    let id = resolve::user_among(&people, name)?;
    people.iter().find(|p| p["userId"].as_str() == Some(id.as_str())).cloned().ok_or_else(|| Refusal::internal("a listed person vanished"))
}

fn with_login_hint(client: &Client) -> impl Fn(Refusal) -> Refusal + '_ {
    move |mut refusal| {
        if refusal.is("admin-not-fresh") {
            refusal.message = format!("{} (run `capstan login --url {}` and try again)", refusal.message, client.url());
        }
        refusal
    }
}

fn yes_no(value: &Value) -> &'static str {
    if value.as_bool() == Some(true) { "yes" } else { "no" }
}

fn list(common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let people = all(&client)?;
    if common.json {
        print_json(&json!({ "users": people }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = people
        .iter()
        .map(|p| {
            vec![
                text(p, "username").to_string(),
                text(p, "userId").to_string(),
                yes_no(&p["admin"]).into(),
                yes_no(&p["disabled"]).into(),
                utc(p["createdAt"].as_u64()),
            ]
        })
        .collect();
    print_table(&["USERNAME", "ID", "ADMIN", "DISABLED", "CREATED"], &rows);
    Ok(())
}

/// Read the person, then call `method` with their id and the generation read, plus `extra`.
fn change(client: &Client, user: &str, method: &str, extra: Value) -> Result<Value> {
    let person = find(client, user)?;
    let mut body = json!({ "userId": person["userId"], "expectedGeneration": person["generation"] });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    client.call(method, &body).map_err(with_login_hint(client))
}

fn set_disabled(user: &str, disabled: bool, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let answer = change(&client, user, "users.setDisabled", json!({ "disabled": disabled }))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let name = text(&answer, "username");
    match (disabled, answer["sessionsRevoked"].as_u64().unwrap_or(0)) {
        (true, ended) => println!("disabled {name}: login refused, {ended} session(s) ended"),
        (false, _) => println!("enabled {name}: they log in with the password they had"),
    }
    Ok(())
}

fn reset_password(user: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let answer = change(&client, user, "users.resetPassword", json!({}))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let ended = answer["sessionsRevoked"].as_u64().unwrap_or(0);
    println!("reset the password of {}; {ended} session(s) ended", text(&answer, "username"));
    println!("password: {}", text(&answer, "password"));
    println!("The password is shown this once: Capstan keeps only a verifier. Hand it over privately.");
    Ok(())
}

fn revoke_sessions(user: &str, confirm: &Confirm, common: &Common) -> Result<()> {
    can_confirm(confirm)?;
    let client = Client::new(&common.connection)?;
    ask(confirm, || Ok(format!("End every session of {user}? They log in again with their password.")))?;
    let answer = change(&client, user, "users.revokeSessions", json!({}))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let ended = answer["sessionsRevoked"].as_u64().unwrap_or(0);
    println!("ended {ended} session(s) of {}; their password stays", text(&answer, "username"));
    Ok(())
}
