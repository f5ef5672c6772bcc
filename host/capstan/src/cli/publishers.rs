//! `capstan publishers list | add | remove`: the publisher keys plugin bundles may be signed by
//! on a running host, clients of `plugins.listTrustedPublishers`, `plugins.addTrustedPublisher`
//! and `plugins.removeTrustedPublisher` (administrators; a change needs a login from the last 5
//! minutes). Keys trusted by configuration (`CAPSTAN_TRUSTED_PUBLISHERS`) are listed and cannot
//! be removed here.

use super::client::{Client, Common, finish, print_json, print_table, text, utc};
use super::confirm::{Confirm, ask, can_confirm};
use crate::refusal::{Refusal, Result};
use clap::Subcommand;
use serde_json::{Value, json};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum PublishersCommand {
    /// Trusted publishers: each key with its name, fingerprint, who added it and when.
    List {
        #[command(flatten)]
        common: Common,
    },
    /// Trust a publisher key (`capstan-ed25519:…`, as `capstan plugin keygen` prints it).
    Add {
        /// The public key
        public_key: String,
        /// What to call the publisher (1 to 100 printable characters)
        #[arg(long)]
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Stop trusting a publisher: installed plugins it signed keep running; their next
    /// upgrade must be signed by a trusted key. Asks on a terminal ([y/N]); refused
    /// `confirmation-required` without --yes when standard input is not a terminal.
    Remove {
        /// The publisher's name, fingerprint or public key
        publisher: String,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
}

pub fn run(command: PublishersCommand) -> ExitCode {
    let (result, json) = match command {
        PublishersCommand::List { common } => (list(&common), common.json),
        PublishersCommand::Add { public_key, name, common } => (add(&public_key, &name, &common), common.json),
        PublishersCommand::Remove { publisher, confirm, common } => (remove(&publisher, &confirm, &common), common.json),
    };
    finish(result, json)
}

fn with_login_hint(client: &Client) -> impl Fn(Refusal) -> Refusal + '_ {
    move |mut refusal| {
        if refusal.is("admin-not-fresh") {
            refusal.message = format!("{} (run `capstan login --url {}` and try again)", refusal.message, client.url());
        }
        refusal
    }
}

fn list(common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let answer = client.call("plugins.listTrustedPublishers", &json!({}))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let mut rows: Vec<Vec<String>> = added(&answer)
        .iter()
        .map(|p| {
            vec![
                text(p, "name").to_string(),
                text(p, "fingerprint").to_string(),
                format!("{} at {}", text(p, "addedBy"), utc(p["addedAt"].as_u64())),
                text(p, "publicKey").to_string(),
            ]
        })
        .collect();
    for key in answer["configured"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let key = key.as_str().unwrap_or("-");
        rows.push(vec!["-".into(), "-".into(), "configuration".into(), key.into()]);
    }
    if rows.is_empty() {
        println!("no trusted publishers: add one with `capstan publishers add KEY --name NAME`");
        return Ok(());
    }
    print_table(&["NAME", "FINGERPRINT", "ADDED", "PUBLIC KEY"], &rows);
    Ok(())
}

fn added(answer: &Value) -> &[Value] {
    answer["added"].as_array().map(Vec::as_slice).unwrap_or_default()
}

fn add(public_key: &str, name: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let body = json!({ "publicKey": public_key.trim(), "name": name });
    let answer = client.call("plugins.addTrustedPublisher", &body).map_err(with_login_hint(&client))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    println!("trusting {} as {name:?} ({})", text(&answer, "publicKey"), text(&answer, "fingerprint"));
    Ok(())
}

fn remove(publisher: &str, confirm: &Confirm, common: &Common) -> Result<()> {
    can_confirm(confirm)?;
    let client = Client::new(&common.connection)?;
    let listed = client.call("plugins.listTrustedPublishers", &json!({}))?;
    let wanted = publisher.trim();
    let matching: Vec<&Value> =
        added(&listed).iter().filter(|p| [text(p, "name"), text(p, "fingerprint"), text(p, "publicKey")].contains(&wanted)).collect();
    let key = match matching.as_slice() {
        [one] => text(one, "publicKey").to_string(),
        [] if listed["configured"].as_array().is_some_and(|c| c.iter().any(|k| k.as_str() == Some(wanted))) => {
            return Err(Refusal::new(
                "publisher-configured",
                "this key is trusted by configuration (CAPSTAN_TRUSTED_PUBLISHERS): remove it there and restart",
            ));
        }
        [] => return Err(Refusal::new("publisher-not-found", format!("no trusted publisher is named {wanted}"))),
        _ => {
            return Err(Refusal::new(
                "publisher-ambiguous",
                format!("several trusted publishers are named {wanted}: name one by fingerprint"),
            )
            .with_data(json!({ "fingerprints": matching.iter().map(|p| text(p, "fingerprint")).collect::<Vec<_>>() })));
        }
    };
    ask(confirm, || Ok(format!("Stop trusting publisher {wanted} ({key})? Bundles it signs are refused from now on.")))?;
    let answer = client.call("plugins.removeTrustedPublisher", &json!({ "publicKey": key })).map_err(with_login_hint(&client))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    println!("no longer trusting {wanted} ({key})");
    Ok(())
}
