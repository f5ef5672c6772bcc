//! `capstan apps access SERVICE [--enable | --disable] [--assign PERSON=ROLE …] [--unassign PERSON …]`:
//! single sign-on for a hosted app through Capstan's OpenID provider (docs/identity.md), a
//! client of `apps.getAccess`, `apps.setOidc` and `apps.assignRole` (administrators). Without a
//! change it shows the app's declaration, whether it is on, and who holds which role.
//!
//! The App Store adds its own `capstan apps …` commands (`plugins.listCommands`); `access` is the
//! host's, taken before those are looked up.

use super::client::{Client, Common, finish, print_json, print_table, text};
use super::resolve;
use crate::refusal::{Refusal, Result};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum AppsCommand {
    /// A hosted app's single sign-on: show it, turn it on or off, give people the app's roles.
    ///
    /// --enable registers the app's client (its redirect URIs are the service's HTTPS domains)
    /// and hands the issuer, client id and client secret to the app's replicas as the service's
    /// own secrets, under the variables its template declares; the secret is never shown.
    /// --disable removes the client and revokes those secrets. Changes run in the order
    /// enable, assignments, disable.
    Access {
        /// The service (name or id; --organization narrows a name)
        service: String,
        /// The organization a service name is looked up in
        #[arg(long)]
        organization: Option<String>,
        /// Turn single sign-on on
        #[arg(long, conflicts_with = "disable")]
        enable: bool,
        /// Turn single sign-on off
        #[arg(long)]
        disable: bool,
        /// Give PERSON (username or id) one of the app's roles: PERSON=ROLE (repeatable)
        #[arg(long, value_name = "PERSON=ROLE")]
        assign: Vec<String>,
        /// Take PERSON's role away (repeatable)
        #[arg(long, value_name = "PERSON")]
        unassign: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
}

/// `capstan apps …` as the host's own command group (only `access`).
#[derive(Parser)]
#[command(name = "capstan apps", about = "Hosted apps' single sign-on through Capstan (the App Store adds the other apps commands)")]
struct AppsCli {
    #[command(subcommand)]
    command: AppsCommand,
}

/// Whether `args` (after `capstan`) are `apps access …`.
pub fn is_access(args: &[OsString]) -> bool {
    args.len() >= 2 && args[0] == "apps" && args[1] == "access"
}

/// Run `capstan apps access …` from its words after `capstan`.
pub fn run_from(args: Vec<OsString>) -> ExitCode {
    match AppsCli::try_parse_from(std::iter::once(OsString::from("capstan apps")).chain(args.into_iter().skip(1))) {
        Ok(cli) => run(cli.command),
        Err(usage) => usage.exit(),
    }
}

pub fn run(command: AppsCommand) -> ExitCode {
    match command {
        AppsCommand::Access { service, organization, enable, disable, assign, unassign, common } => {
            let json = common.json;
            finish(access(&service, organization.as_deref(), enable, disable, &assign, &unassign, &common), json)
        }
    }
}

fn access(
    service: &str,
    organization: Option<&str>,
    enable: bool,
    disable: bool,
    assign: &[String],
    unassign: &[String],
    common: &Common,
) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let service_id = resolve::service(&client, service, organization)?;
    let mut changes: Vec<(String, Option<String>)> = Vec::new();
    for pair in assign {
        let (person, role) = pair.split_once('=').filter(|(p, r)| !p.is_empty() && !r.is_empty()).ok_or_else(|| {
            Refusal::new("assign-invalid", format!("--assign takes PERSON=ROLE, not {pair:?}")).with_data(json!({ "field": "assign" }))
        })?;
        changes.push((person.to_string(), Some(role.to_string())));
    }
    changes.extend(unassign.iter().map(|p| (p.clone(), None)));
    let mut answer = if enable {
        client.call("apps.setOidc", &json!({ "serviceId": service_id, "enabled": true }))?
    } else {
        client.call("apps.getAccess", &json!({ "serviceId": service_id }))?
    };
    for (person, role) in changes {
        let user = super::users::find(&client, &person)?;
        answer = client.call("apps.assignRole", &json!({ "serviceId": service_id, "userId": user["userId"], "role": role }))?;
    }
    if disable {
        answer = client.call("apps.setOidc", &json!({ "serviceId": service_id, "enabled": false }))?;
    }
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    show(&answer);
    Ok(())
}

fn show(access: &Value) {
    let declared = &access["declared"];
    println!("single sign-on: {}", if access["enabled"] == true { "on" } else { "off" });
    if let Some(blocker) = access["blocker"].as_str() {
        println!("  cannot be on: {blocker}");
    }
    if declared.is_object() {
        let roles: Vec<&str> = declared["roles"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        println!("  roles the app declares: {}", roles.join(", "));
        println!(
            "  the app reads {}, {} and {} (the service's own secrets)",
            text(declared, "issuerVariable"),
            text(declared, "clientIdVariable"),
            text(declared, "clientSecretVariable")
        );
    }
    println!("  issuer: {}", text(access, "issuer"));
    if let Some(client_id) = access["clientId"].as_str() {
        println!("  client id: {client_id}");
        for uri in access["redirectUris"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            println!("  redirect URI: {uri}");
        }
    }
    let rows: Vec<Vec<String>> = access["assignments"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| vec![text(a, "username").to_string(), text(a, "userId").to_string(), text(a, "role").to_string()])
        .collect();
    if rows.is_empty() {
        println!("  nobody holds a role yet (--assign PERSON=ROLE)");
    } else {
        print_table(&["PERSON", "ID", "ROLE"], &rows);
    }
}
