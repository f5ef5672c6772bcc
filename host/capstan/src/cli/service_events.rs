//! `capstan services events NAME`: what the runtime decided for a service and what its nodes
//! said, in order and in words (`runtime.getServiceEvents`, docs/runtime.md "Events"); `-f`
//! keeps printing what comes next.

use super::client::{Client, Common, print_json, utc};
use super::resolve;
use crate::refusal::Result;
use serde_json::{Value, json};
use std::time::Duration;

/// How often `-f` asks for what came next.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

#[derive(clap::Args)]
pub struct EventsArgs {
    /// The service's name or id (`svc_…`)
    pub service: String,
    /// The organization (name or id) to look the service's name up in
    #[arg(long, visible_alias = "org", value_name = "NAME|ID")]
    pub organization: Option<String>,
    /// How many of the newest events to show first (1–500)
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..=500))]
    pub limit: u16,
    /// Keep printing new events as they happen (ctrl-c ends)
    #[arg(short = 'f', long)]
    pub follow: bool,
    #[command(flatten)]
    pub common: Common,
}

/// One event as a line: time, replica, what happened.
fn line(event: &Value) -> String {
    format!("{}  {}  {}", utc(event["at"].as_u64()), event["slot"].as_str().unwrap_or("-"), event["words"].as_str().unwrap_or_default())
}

pub fn events(args: &EventsArgs) -> Result<()> {
    let client = Client::new(&args.common.connection)?;
    let service = resolve::service(&client, &args.service, args.organization.as_deref())?;
    let mut body = json!({ "serviceId": service, "limit": args.limit });
    loop {
        let answer = client.call("runtime.getServiceEvents", &body)?;
        let items = answer["items"].as_array().cloned().unwrap_or_default();
        if args.common.json && !args.follow {
            print_json(&answer);
            return Ok(());
        }
        for event in &items {
            if args.common.json { println!("{event}") } else { println!("{}", line(event)) }
        }
        if !args.follow {
            if items.is_empty() {
                println!("nothing happened to this service's replicas yet (capstan services run places them)");
            }
            return Ok(());
        }
        body = json!({ "serviceId": service, "after": answer["nextCursor"], "limit": 500 });
        if answer["nextCursor"].is_null() {
            body = json!({ "serviceId": service, "limit": args.limit });
        }
        if items.is_empty() {
            std::thread::sleep(FOLLOW_EVERY);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_as_time_replica_and_words() {
        let event = json!({ "at": 1_765_000_000_000u64, "slot": "node_1.0", "words": "restarted after its backoff (failure 2)" });
        let text = line(&event);
        assert!(text.ends_with("  node_1.0  restarted after its backoff (failure 2)"), "{text}");
        assert!(text.starts_with("2025-12-06"), "{text}");
    }
}
