//! `capstan admin reset-password`: recover a lost administrator password on a host you operate.
//!
//! An offline command: it never talks to a server. It opens the store `serve` would open (the
//! same flags, environment and configuration file) and the keyring next to it, and only a
//! keyring that unseals the host's signing key is accepted — holding the database and the
//! keyring is what operating the host means. In one transaction it gives the person a generated
//! password, enables them if they were disabled, ends every session they hold and writes
//! `user.passwordReset`. The password is printed once on standard output and logged nowhere.

use super::client::finish;
use crate::auth::{self, users};
use crate::config::{self, Flags};
use crate::keyring::Keyring;
use crate::refusal::{Refusal, Result};
use crate::store::{Store, StoreOptions};
use clap::Subcommand;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Give a person (an administrator who lost their password) a new generated password,
    /// printed once, and end their sessions; a disabled person is enabled again.
    ///
    /// Offline: run it where `capstan serve` runs, with the same configuration (--dev and
    /// --data-dir for a dev host, else the CAPSTAN_* variables or --config). It needs the
    /// database and the keyring file; the host may keep running.
    ResetPassword {
        /// The person's username
        #[arg(long, value_name = "NAME")]
        username: String,
        #[command(flatten)]
        local: super::snapshot::Local,
        /// Print the answer as one line of JSON (the password included)
        #[arg(long)]
        json: bool,
    },
}

pub fn run(command: AdminCommand) -> ExitCode {
    let AdminCommand::ResetPassword { username, local, json } = command;
    let flags = local.flags();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Refusal::internal)
        .and_then(|runtime| super::without_sigpipe(|| runtime.block_on(reset(&flags, &username))));
    let result = result.map(|reset| {
        if json {
            super::client::print_json(&json!({ "ok": true, "reset": reset }));
        } else {
            println!("reset the password of {} ({}); {} session(s) ended", reset.user.username, reset.user.user_id, reset.sessions_revoked);
            println!("password: {}", reset.password);
            println!("The password is shown this once: Capstan keeps only a verifier. Log in and change it.");
        }
    });
    finish(result, json)
}

async fn reset(flags: &Flags, username: &str) -> Result<users::PasswordReset> {
    let env = std::env::vars().filter(|(k, _)| k.starts_with("CAPSTAN_")).collect();
    let config = config::resolve(flags, &env)?;
    if let Some(dir) = &config.data_dir
        && !dir.is_dir()
    {
        return Err(Refusal::new("store-not-found", format!("no dev host's data is at {}", dir.display())));
    }
    // never create a keyring here: the one the host runs with, or nothing
    let path = &config.keyring_path;
    let meta = std::fs::metadata(path).map_err(|e| {
        Refusal::new("keyring-invalid", format!("the keyring {} cannot be read: {}", path.display(), e.kind()))
            .with_data(json!({ "reason": "unreadable", "path": path.display().to_string() }))
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Refusal::new(
            "keyring-invalid",
            format!("the keyring {} has mode {mode:04o}: group or others may read or write it; chmod 600 it", path.display()),
        )
        .with_data(json!({ "reason": "permissions", "mode": format!("{mode:04o}"), "path": path.display().to_string() })));
    }
    let keyring = Keyring::load(path)?;
    // opening a SQLite store creates its file: a path that holds none is refused first
    if let Some(file) = config.database_url.strip_prefix("sqlite:")
        && !file.is_empty()
        && !std::path::Path::new(file).exists()
    {
        return Err(Refusal::new("store-not-found", format!("no store is at {file}: has this host started?")));
    }
    let options = StoreOptions { database_name: config.database_name.clone(), budget: config.request_budget };
    let store = Store::open(&config.database_url, &options).await?;
    store.ping().await?;
    let chain = crate::migrate::host_chain();
    crate::store::migrate::declare(&store).await?;
    if crate::store::migrate::read_ledger(&store, &chain.name).await?.is_none() {
        return Err(Refusal::new("store-not-initialized", "this store holds no Capstan data: start the host once first"));
    }
    // the host's signing key unseals only under its keyring: the proof this is its keyring
    auth::Auth::new(store.clone(), &keyring, &config.public_origin).await?;
    crate::events::declare(&store).await?;
    users::reset_password_offline(&store, username).await
}
