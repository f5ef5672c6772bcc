use super::*;

fn held(url: &str, client: &str, prefixes: &[&str]) -> Held {
    Held {
        credential_id: "cred-1".into(),
        gateway_url: url.into(),
        client_id: client.into(),
        dns_record_addresses: prefixes.iter().map(|p| p.to_string()).collect(),
        secret_id: "sec_1".into(),
        issued_at: 1,
        finalized_at: Some(2),
    }
}

fn target(url: Option<&str>, client: Option<&str>, prefixes: &[&str]) -> Target {
    Target {
        gateway_url: url.map(str::to_string),
        client_id: client.map(str::to_string),
        dns_record_addresses: prefixes.iter().map(|p| p.to_string()).collect(),
    }
}

#[test]
fn nothing_configured_or_held_needs_a_bootstrap_naming_the_request() {
    let state = derive(&Target::default(), &Record::default());
    assert_eq!(state.state, Phase::AdminBootstrapRequired);
    assert!(state.reason.as_deref().unwrap().contains("gatewayUrl"), "{state:?}");
    let state = derive(&target(Some("https://gw.example"), Some("capstan"), &[]), &Record::default());
    assert_eq!(state.state, Phase::AdminBootstrapRequired);
    assert!(state.reason.as_deref().unwrap().contains("gateway.bootstrapCredential"), "{state:?}");
    assert!(!state.finalization_pending);
}

#[test]
fn a_held_credential_that_carries_the_settings_is_ready() {
    let record = Record { running: Some(held("https://gw.example", "capstan", &["10.0.0.0/8"])), ..Record::default() };
    let state = derive(&target(Some("https://gw.example"), Some("capstan"), &["10.0.0.0/8"]), &record);
    assert_eq!(state.state, Phase::Ready);
    assert_eq!(state.reason, None);
    assert_eq!(state.credential_id.as_deref(), Some("cred-1"));
    assert!(state.staged.is_empty());
}

#[test]
fn settings_the_credential_cannot_carry_are_staged_key_by_key() {
    let record = Record { running: Some(held("https://gw.example", "capstan", &["10.0.0.0/8"])), ..Record::default() };
    let state = derive(&target(Some("https://gw2.example"), Some("capstan"), &[]), &record);
    assert_eq!(state.state, Phase::AdminBootstrapRequired);
    // the running credential keeps its own target
    assert_eq!(state.gateway_url.as_deref(), Some("https://gw.example"));
    assert_eq!(
        state.staged,
        vec![
            StagedChange { key: GATEWAY_URL.into(), from: "https://gw.example".into(), to: "https://gw2.example".into() },
            StagedChange { key: GATEWAY_DNS_RECORD_ADDRESSES.into(), from: "10.0.0.0/8".into(), to: String::new() },
        ]
    );
    let reason = state.reason.unwrap();
    assert!(reason.contains(r#"Staged gateway settings change gatewayUrl "https://gw.example" -> "https://gw2.example"."#), "{reason}");
    assert!(reason.contains(r#"gatewayDnsRecordAddresses "10.0.0.0/8" -> ""."#), "{reason}");
}

#[test]
fn a_candidate_awaiting_finalization_is_degraded_with_the_last_attempt() {
    let record = Record {
        candidate: Some(Held { finalized_at: None, ..held("https://gw.example", "capstan", &[]) }),
        note: Some("the gateway answered 503".into()),
        ..Record::default()
    };
    let state = derive(&target(Some("https://gw.example"), Some("capstan"), &[]), &record);
    assert_eq!(state.state, Phase::Degraded);
    assert!(state.finalization_pending);
    assert!(state.reason.as_deref().unwrap().contains("503"));
    assert_eq!(state.credential_id, None, "nothing runs yet");
}

#[test]
fn a_reason_is_at_most_4096_characters() {
    let long = "x".repeat(5000);
    let record = Record { note: Some(long), ..Record::default() };
    let state = derive(&target(Some("https://gw.example"), Some("capstan"), &[]), &record);
    assert_eq!(state.reason.unwrap().chars().count(), MAX_REASON);
}

#[test]
fn a_token_is_1_to_1024_visible_ascii() {
    assert!(client::is_token("gwadm_abc-123.~!"));
    assert!(client::is_token(&"a".repeat(1024)));
    for bad in ["", "with space", "tab\t", "é", &"a".repeat(1025)] {
        assert!(!client::is_token(bad), "{bad:?}");
    }
}

#[test]
fn the_record_reads_back_what_was_written() {
    let record = Record { running: Some(held("https://gw.example", "c", &["192.0.2.0/24"])), candidate: None, note: Some("n".into()) };
    let back: Record = serde_json::from_value(serde_json::to_value(&record).unwrap()).unwrap();
    assert_eq!(back, record);
}
