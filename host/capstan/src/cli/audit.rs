//! `capstan audit list`: the audit log of a running host (`audit.list`, administrators), newest
//! first, filtered by method, actor, outcome, target and time, one page at a time.

use super::client::{Client, Common, finish, print_json, print_table, text, utc};
use crate::refusal::Result;
use clap::Subcommand;
use serde_json::{Value, json};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Audit records of state-changing calls, newest first (`audit.list`): who, which method,
    /// the ids it named, how it ended and the request id; never a body value. Prints the cursor
    /// of the next page when there is one.
    List {
        /// Only calls of this method (services.create)
        #[arg(long)]
        method: Option<String>,
        /// Only calls by this user (a username or an id)
        #[arg(long)]
        actor: Option<String>,
        /// ok, refused (any refusal) or one refusal's code
        #[arg(long)]
        outcome: Option<String>,
        /// Only calls that named or created this id
        #[arg(long)]
        target: Option<String>,
        /// Only calls at or after this time: RFC 3339 (2026-12-02T06:00:00Z) or milliseconds since the epoch
        #[arg(long, value_name = "TIME", value_parser = time)]
        since: Option<u64>,
        /// Only calls at or before this time: RFC 3339 or milliseconds since the epoch
        #[arg(long, value_name = "TIME", value_parser = time)]
        until: Option<u64>,
        /// Records per page, 1 to 200
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Continue after a previous page (the cursor it printed)
        #[arg(long)]
        cursor: Option<String>,
        #[command(flatten)]
        common: Common,
    },
}

pub fn run(command: AuditCommand) -> ExitCode {
    match command {
        AuditCommand::List { method, actor, outcome, target, since, until, limit, cursor, common } => {
            let body = json!({ "method": method, "actor": actor, "outcome": outcome, "target": target,
                "since": since, "until": until, "limit": limit, "cursor": cursor });
            finish(list(body, &common), common.json)
        }
    }
}

/// Milliseconds since the epoch from `text`: RFC 3339, or a number of milliseconds (a usage
/// error otherwise, as clap reports it).
fn time(text: &str) -> std::result::Result<u64, String> {
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .and_then(|t| u64::try_from(t.timestamp_millis()).ok())
        .ok_or_else(|| "an RFC 3339 time (2026-12-02T06:00:00Z) or milliseconds since the epoch".to_string())
}

/// Only the members that are set: the method refuses none, but `null` says nothing.
fn without_nulls(body: Value) -> Value {
    match body {
        Value::Object(members) => Value::Object(members.into_iter().filter(|(_, v)| !v.is_null()).collect()),
        other => other,
    }
}

fn list(body: Value, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let page = client.call("audit.list", &without_nulls(body))?;
    if common.json {
        print_json(&page);
        return Ok(());
    }
    let records = page["records"].as_array().map(Vec::as_slice).unwrap_or_default();
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let actor = &r["actor"];
            let who = match actor["username"].as_str() {
                Some(name) => format!("{name} ({})", text(actor, "kind")),
                None => text(actor, "kind").to_string(),
            };
            let targets: Vec<&str> = r["targets"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let targets = if targets.is_empty() { "-".to_string() } else { targets.join(",") };
            let request = match text(r, "requestId") {
                "" => "-",
                id => id,
            };
            vec![utc(r["at"].as_u64()), text(r, "method").into(), who, text(r, "outcome").into(), targets, request.into()]
        })
        .collect();
    print_table(&["TIME", "METHOD", "ACTOR", "OUTCOME", "TARGETS", "REQUEST"], &rows);
    if let Some(next) = page["nextCursor"].as_str() {
        eprintln!("more: capstan audit list --cursor {next} (with the same filters)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc_3339_or_milliseconds() {
        assert_eq!(time("1700000000000"), Ok(1_700_000_000_000));
        assert_eq!(time("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(time("1970-01-01T01:00:01+01:00"), Ok(1000));
        assert!(time("yesterday").is_err() && time("-5").is_err());
        assert_eq!(without_nulls(json!({ "method": null, "limit": 5 })), json!({ "limit": 5 }));
    }
}
