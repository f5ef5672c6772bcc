//! `capstan-agent status`: what this machine is enrolled as, how its last beat went and, on a
//! relay's node, which relay configuration it keeps — read from the state directory (no request
//! is made). Never the token.

use crate::state::{BeatRecord, RelayConfig, StateDir};
use capstan_core::Refusal;
use serde_json::{Value, json};

/// The status as JSON (`--json`).
pub fn status_json(state: &StateDir) -> Result<Value, Refusal> {
    let credential = state.read_credential()?;
    let status = state.read_status();
    Ok(json!({
        "origin": credential.origin,
        "devHost": credential.dev_host,
        "nodeId": credential.node_id,
        "clusterId": credential.cluster_id,
        "credentialGeneration": credential.credential_generation,
        "rotationPending": credential.pending_token.is_some(),
        "stateDir": state.path().display().to_string(),
        "lastBeat": status.last_beat.as_ref().map(|b| {
            let mut v = serde_json::to_value(b).unwrap_or(Value::Null);
            v["at"] = json!(rfc3339(b.at_ms));
            v
        }),
        "hostApply": status.host_apply,
        "relayConfig": relay_config(state).map(|c| json!({
            "digest": c.digest,
            "receivedAt": rfc3339(c.received_at),
            "receivedAtMs": c.received_at,
        })),
    }))
}

/// The status for people.
pub fn status_text(state: &StateDir) -> Result<String, Refusal> {
    let credential = state.read_credential()?;
    let status = state.read_status();
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<12}{v}\n"));
    let dev = if credential.dev_host { " (dev host, plain http)" } else { "" };
    line("origin", format!("{}{dev}", credential.origin));
    line("node", credential.node_id.clone());
    line("cluster", credential.cluster_id.clone());
    line(
        "credential",
        format!(
            "generation {}{}",
            credential.credential_generation,
            if credential.pending_token.is_some() { " (a rotation is pending: run capstan-agent rotate)" } else { "" }
        ),
    );
    line("last beat", status.last_beat.as_ref().map(describe_beat).unwrap_or_else(|| "none yet".into()));
    if let Some(apply) = &status.host_apply {
        line(
            "hostname",
            match &apply.reason {
                None => format!("{} applied (intent generation {})", apply.hostname, apply.generation),
                Some(reason) => format!("{} failed (intent generation {}): {reason}", apply.hostname, apply.generation),
            },
        );
    }
    if let Some(config) = relay_config(state) {
        line("relay", format!("configuration {} received {}", config.digest, rfc3339(config.received_at)));
    }
    Ok(out)
}

/// The relay configuration kept, if any (a file that cannot be read shows as none: `relay`
/// says why when it starts).
fn relay_config(state: &StateDir) -> Option<RelayConfig> {
    state.read_relay_config().ok().flatten()
}

fn describe_beat(beat: &BeatRecord) -> String {
    let mut text = format!("{} at {}", beat.outcome, rfc3339(beat.at_ms));
    if let (Some(code), Some(message)) = (&beat.code, &beat.message) {
        text.push_str(&format!(" — {code}: {message}"));
    }
    if beat.outcome != "accepted" {
        match beat.last_accepted_at_ms {
            Some(at) => text.push_str(&format!(" (last accepted {})", rfc3339(at))),
            None => text.push_str(" (none accepted yet)"),
        }
    }
    text
}

fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| ms.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Credential, Status};
    use crate::token::Token;
    use capstan_core::wire::heartbeat::{ApplyOutcome, HostApply};

    #[test]
    fn status_names_the_node_and_the_last_beat_never_the_token() {
        let root = tempfile::tempdir().unwrap();
        let dir = StateDir::new(root.path().join("s"));
        dir.create().unwrap();
        let token = Token::draw().unwrap();
        let secret = serde_json::to_value(&token).unwrap().as_str().unwrap().to_string();
        let credential = Credential {
            origin: "https://c.example".into(),
            node_id: "node_9".into(),
            cluster_id: "cls_2".into(),
            token,
            credential_generation: 3,
            pending_token: None,
            pending_mutation_id: None,
            dev_host: false,
        };
        dir.write_new_credential(&credential).unwrap();
        let text = status_text(&dir).unwrap();
        assert!(text.contains("node_9") && text.contains("cls_2") && text.contains("none yet"), "{text}");
        dir.write_status(&Status {
            last_beat: Some(BeatRecord {
                at_ms: 1_700_000_000_000,
                outcome: "unauthorized".into(),
                code: Some("node-unauthorized".into()),
                message: Some("node credential refused".into()),
                credential_generation: None,
                last_accepted_at_ms: Some(1_699_999_999_000),
            }),
            host_apply: Some(HostApply { generation: 2, hostname: "db-1".into(), outcome: ApplyOutcome::Applied, reason: None }),
        })
        .unwrap();
        let text = status_text(&dir).unwrap();
        assert!(text.contains("unauthorized at 2023-11-14T22:13:20Z — node-unauthorized"), "{text}");
        assert!(text.contains("db-1 applied"), "{text}");
        let json = status_json(&dir).unwrap();
        assert_eq!(json["nodeId"], "node_9");
        assert_eq!(json["lastBeat"]["outcome"], "unauthorized");
        assert_eq!(json["lastBeat"]["at"], "2023-11-14T22:13:20Z");
        assert_eq!(json["credentialGeneration"], 3);
        assert!(!text.contains(&secret) && !json.to_string().contains(&secret));
        assert_eq!(json["relayConfig"], Value::Null);
        assert!(!text.contains("relay"), "{text}");

        dir.write_relay_config(&RelayConfig { digest: "d1".into(), config: json!({}), received_at: 1_700_000_000_000 }).unwrap();
        let text = status_text(&dir).unwrap();
        assert!(text.contains("relay       configuration d1 received 2023-11-14T22:13:20Z"), "{text}");
        let json = status_json(&dir).unwrap();
        assert_eq!(
            json["relayConfig"],
            json!({"digest": "d1", "receivedAt": "2023-11-14T22:13:20Z", "receivedAtMs": 1_700_000_000_000u64})
        );
    }
}
