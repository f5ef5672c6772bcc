//! The example plugin built for wasm32-wasip2 and run on an in-process host, as a plugin
//! author tests theirs with `capstan_sdk::testing`.

use capstan_sdk::testing::{AgentDispatch, AgentReply, AgentRequest, HostRefusal, TestHost};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn the_example_serves_its_methods_and_takes_events_in_order() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    let greeting = host.call("greet", json!({ "name": "Ada" })).unwrap();
    assert_eq!(greeting["greeting"], "Hello, Ada!");
    assert_eq!(greeting["version"], "0.1.0");

    // the host validates bodies before the plugin sees them
    assert_eq!(host.call("greet", json!({ "name": 1 })).unwrap_err().code(), "invalid-request");

    host.call("putNote", json!({ "id": "a", "text": "one" })).unwrap();
    host.call("putNote", json!({ "id": "b", "text": "two" })).unwrap();
    host.publish("service.deleting", "svc-1", json!({ "id": "svc-1" }));
    assert_eq!(host.deliver_events().unwrap(), 3);
    let log = host.call("eventLog", json!({})).unwrap();
    let kinds: Vec<&str> = log["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, vec!["example.noteChanged", "example.noteChanged", "service.deleting"]);
    assert_eq!(host.deliver_events().unwrap(), 0, "nothing is delivered twice once handled");

    // a setting: its declared default until an operator sets one
    let overview = host.call("overview", json!({})).unwrap();
    assert_eq!((overview["welcome"].as_str(), overview["notes"].as_u64()), (Some("Notes kept by the example plugin."), Some(2)));
    host.set_settings(json!({ "example.welcome": "Hello from the settings" }));
    assert_eq!(host.call("overview", json!({})).unwrap()["welcome"], "Hello from the settings");

    assert_eq!(host.reconcile(&[]).unwrap(), "2 notes");
    assert!(host.run_task("tidy").unwrap().contains("2 notes"));
    assert!(host.run_task("nothing").is_err());
}

/// A stand-in for the clusters' relays: records what it was asked, answers what it was given.
struct Relay {
    asked: Mutex<Vec<AgentRequest>>,
    answer: Result<Value, HostRefusal>,
}

impl Relay {
    fn answering(answer: Result<Value, HostRefusal>) -> Arc<Relay> {
        Arc::new(Relay { asked: Mutex::new(vec![]), answer })
    }
}

impl AgentDispatch for Relay {
    fn call(&self, request: AgentRequest) -> AgentReply {
        self.asked.lock().unwrap().push(request);
        let answer = self.answer.clone();
        Box::pin(async move { answer })
    }
}

#[test]
fn ping_agent_asks_the_clusters_relay_and_passes_its_refusals_on() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let dir = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{dir}/capstan-plugin.toml")).unwrap();

    // the example requests `agents` as shipped; without it the host refuses by name
    let without = manifest.replacen(", \"agents\"]", "]", 1);
    assert_ne!(without, manifest, "the manifest's capabilities line moved");
    let host = TestHost::build_with_manifest(dir, &without);
    let relay = Relay::answering(Ok(json!({ "pong": true })));
    host.set_agent_dispatch(relay.clone());
    let refused = host.call("pingAgent", json!({ "clusterId": "cluster_a" })).unwrap_err();
    assert_eq!(refused.code(), "capability-denied", "{refused:?}");
    assert!(relay.asked.lock().unwrap().is_empty());

    let host = TestHost::build(dir);

    // no dispatcher installed: not connected, retryable
    let refused = host.call("pingAgent", json!({ "clusterId": "cluster_a" })).unwrap_err();
    assert_eq!((refused.code(), refused.is_retryable()), ("agent-not-connected", true), "{refused:?}");

    let pong = json!({ "pong": true, "nodeId": "node_1", "at": 1764650000000u64 });
    let relay = Relay::answering(Ok(pong.clone()));
    host.set_agent_dispatch(relay.clone());
    let answer = host.call("pingAgent", json!({ "clusterId": "cluster_a" })).unwrap();
    assert_eq!(answer, json!({ "clusterId": "cluster_a", "reply": pong }));
    let asked = relay.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    let request = &asked[0];
    assert_eq!(
        (request.plugin_id.as_str(), request.cluster_id.as_str(), request.method.as_str(), &request.body),
        ("example", "cluster_a", "agent.ping", &json!({}))
    );
    // within the method's deadline (6 s), less the host's margin
    assert!(request.timeout > Duration::ZERO && request.timeout < Duration::from_secs(6), "{:?}", request.timeout);

    // the relay's refusal arrives by name, retryable, with its data
    let refusal = HostRefusal::new("relay-not-connected", "no relay of cluster cluster_a is connected")
        .retryable()
        .with_data(json!({ "clusterId": "cluster_a", "retryAfterMs": 2000 }));
    host.set_agent_dispatch(Relay::answering(Err(refusal)));
    let refused = host.call("pingAgent", json!({ "clusterId": "cluster_a" })).unwrap_err();
    assert_eq!((refused.code(), refused.is_retryable()), ("relay-not-connected", true), "{refused:?}");
    assert_eq!(refused.data().unwrap()["retryAfterMs"], 2000);

    // a cluster id the host refuses never reaches the relay
    let relay = Relay::answering(Ok(json!({})));
    host.set_agent_dispatch(relay.clone());
    let refused = host.call("pingAgent", json!({ "clusterId": "cluster a" })).unwrap_err();
    assert_eq!(refused.code(), "invalid-request", "{refused:?}");
    assert!(relay.asked.lock().unwrap().is_empty());
}
