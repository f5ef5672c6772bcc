//! `capstan gateway bootstrap | status`: Capstan's enrollment at the external gateway
//! (`gateway.bootstrapCredential`, `gateway.getEnrollmentState`; docs/gateway-protocol.md).
//!
//! The gateway admin token is read from standard input only (or typed with `--prompt`), sealed
//! to the server's ingress recipient for exactly the gateway URL and client id named, and never
//! printed. The server uses it once to provision its own client credential and forgets it.

use super::client::{Client, Common, finish, print_json, text, utc};
use super::secrets::{ValueInput, read_input, recipient};
use crate::refusal::{Refusal, Result};
use crate::secrets::ingress;
use clap::Subcommand;
use serde_json::{Value, json};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum GatewayCommand {
    /// Enroll Capstan at the external gateway with a short-lived gateway admin token read from
    /// standard input (`capstan gateway bootstrap --gateway-url URL --client-id ID < token-file`).
    ///
    /// The URL and client id must be the ones `capstan settings get` shows as gatewayUrl and
    /// gatewayClientId (a staged change's, when one is staged): the token is sealed for exactly
    /// that target. It is 1–1024 visible ASCII; one trailing newline is dropped. Revoke the admin
    /// token at the gateway once `capstan gateway status` answers ready.
    Bootstrap {
        /// The gateway URL the token is for (the setting gatewayUrl)
        #[arg(long, value_name = "URL")]
        gateway_url: String,
        /// The gateway client id Capstan enrolls as (the setting gatewayClientId)
        #[arg(long, value_name = "ID")]
        client_id: String,
        #[command(flatten)]
        input: ValueInput,
        #[command(flatten)]
        common: Common,
    },
    /// Show the enrollment: ready, degraded (a credential awaits finalization) or
    /// admin-bootstrap-required, with the reason and any staged settings change.
    Status {
        #[command(flatten)]
        common: Common,
    },
}

pub fn run(command: GatewayCommand) -> ExitCode {
    let (result, json) = match command {
        GatewayCommand::Bootstrap { gateway_url, client_id, input, common } => {
            (bootstrap(&gateway_url, &client_id, &input, &common), common.json)
        }
        GatewayCommand::Status { common } => (status(&common), common.json),
    };
    finish(result, json)
}

fn bootstrap(gateway_url: &str, client_id: &str, input: &ValueInput, common: &Common) -> Result<()> {
    // the token is read (and refused when empty or oversized) before anything is sent
    let token = read_input(input, "the gateway admin token")?;
    let client = Client::new(&common.connection)?;
    let (recipient_id, public) = recipient(&client)?;
    let target = ingress::target("gateway.bootstrapCredential", gateway_url, client_id);
    let sealed = ingress::seal_to(&recipient_id, &public, &target, &token);
    drop(token);
    let body = json!({
        "expectedGatewayUrl": gateway_url,
        "expectedGatewayClientId": client_id,
        "sealedAdminToken": serde_json::to_value(sealed).map_err(Refusal::internal)?,
    });
    let answer = client.call("gateway.bootstrapCredential", &body)?;
    report(&answer, common);
    Ok(())
}

fn status(common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let answer = client.call("gateway.getEnrollmentState", &json!({}))?;
    report(&answer, common);
    Ok(())
}

fn report(answer: &Value, common: &Common) {
    if common.json {
        print_json(answer);
        return;
    }
    println!("enrollment: {}", text(answer, "state"));
    if answer["finalizationPending"].as_bool() == Some(true) {
        println!("  finalization pending: Capstan retries it");
    }
    if answer["credentialId"].is_string() {
        println!("  gateway:    {}", text(answer, "gatewayUrl"));
        println!("  client:     {}", text(answer, "clientId"));
        println!("  credential: {} (finalized {})", text(answer, "credentialId"), utc(answer["finalizedAt"].as_u64()));
    }
    if let Some(reason) = answer["reason"].as_str() {
        println!("  {reason}");
    }
}
