//! The example plugin built for wasm32-wasip2 and run on an in-process host, as a plugin
//! author tests theirs with `capstan_sdk::testing`.

use capstan_sdk::testing::TestHost;
use serde_json::json;

#[test]
fn the_example_serves_its_methods_and_takes_events_in_order() {
    if std::process::Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).contains("wasm32-wasip2"))
        && std::env::var("CAPSTAN_TEST_REQUIRE_PLUGINS").as_deref() != Ok("1")
    {
        eprintln!("skipped: the wasm32-wasip2 target is not installed");
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
