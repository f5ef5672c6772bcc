//! The audit log as the assembled host keeps it: which methods are declared read-only, and
//! calls through the registry's one door (as HTTP, the socket, the dashboard, MCP and the demo
//! make them) recorded.

use super::inventory::World;
use capstan_rpc::Invocation;
use serde_json::json;

/// Verbs that only read. A host method named with one of them and not declared read-only (or
/// the reverse) is most likely a declaration forgotten: this list is a check, never the rule.
/// (`follow`/`unfollow`: a socket session's live tail of what `get` reads, and its end.)
const READING_VERBS: &[&str] = &["get", "list", "head", "watch", "whoami", "inspect", "preview", "ping", "follow", "unfollow"];

#[tokio::test]
async fn host_methods_declare_reads_and_everything_else_is_audited() {
    let world = World::new().await;
    let mut undeclared = Vec::new();
    for method in world.state.methods.list() {
        let verb = method.name.split_once('.').map(|(_, verb)| verb).unwrap_or_default();
        let reads = READING_VERBS.iter().any(|r| verb.starts_with(r));
        if method.plugin.is_some() {
            // a plugin declares its reads itself, and the host holds it to them (host_tests/plugins.rs)
            continue;
        } else if reads != method.read_only {
            undeclared.push(method.name.clone());
        }
    }
    assert!(undeclared.is_empty(), "read-only declarations to check: {undeclared:?}");
    let listing = world.state.methods.describe();
    let audit = listing["methods"].as_array().unwrap().iter().find(|m| m["name"] == "audit.list").unwrap();
    assert_eq!((audit["readOnly"].clone(), audit["access"].clone()), (json!(true), json!("admin")));
}

#[tokio::test]
async fn calls_through_the_registry_are_recorded_and_reads_are_not() {
    let world = World::new().await;
    let registry = &world.state.methods;
    let call = |name: &'static str, body: serde_json::Value| {
        let invocation = Invocation::verified(name, &world.admin, None, body).with_request_id("req-audit");
        async move { registry.invoke(invocation).await?.into_value() }
    };
    let org = call("organizations.create", json!({ "name": "audited" })).await.unwrap();
    call("organizations.list", json!({})).await.unwrap();
    let refused = call("organizations.create", json!({ "name": "audited" })).await.unwrap_err();
    let page = call("audit.list", json!({})).await.unwrap();
    let records = page["records"].as_array().unwrap();
    let seen: Vec<(&str, &str)> = records.iter().map(|r| (r["method"].as_str().unwrap(), r["outcome"].as_str().unwrap())).collect();
    assert_eq!(seen, [("organizations.create", refused.code.as_ref()), ("organizations.create", "ok")]);
    assert!(records[1]["targets"].as_array().unwrap().contains(&org["id"]), "{page}");
    assert_eq!((records[1]["actor"]["username"].clone(), records[1]["requestId"].clone()), (json!("admin"), json!("req-audit")));
    assert!(!page.to_string().contains("audited"), "no body value: {page}");
}
