//! The bindings manager built for wasm32-wasip2 and run on an in-process host
//! (`capstan_sdk::testing`), its providers stood in for: a binding waits unplaced until the
//! service's spec pins a node, gates the service's replicas until it is provisioned, waits
//! again while the provider cannot be reached, and is revoked (data kept) or destroyed (data
//! dropped) on delete; a service on every node is refused.

use capstan_sdk::testing::{HostRefusal, Provisioned, StorageBinding, StorageDispatch, TestHost, async_trait};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// Records what it was asked; refuses with `failing` while it is set.
#[derive(Default)]
struct Providers {
    asked: Mutex<Vec<String>>,
    failing: Mutex<Option<HostRefusal>>,
}

impl Providers {
    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }

    fn answer(&self, what: String) -> Result<(), HostRefusal> {
        self.asked.lock().unwrap().push(what);
        match self.failing.lock().unwrap().clone() {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl StorageDispatch for Providers {
    async fn node_endpoints(&self, node_id: &str) -> Result<Value, HostRefusal> {
        Ok(json!({ "nodeId": node_id }))
    }

    async fn provision(&self, _: &capstan_sdk::testing::Identity, _: &str, b: &StorageBinding) -> Result<Provisioned, HostRefusal> {
        self.answer(format!("provision {} {} on {}", b.binding_id, b.service_id, b.node_id))?;
        Ok(Provisioned {
            endpoint: "10.0.0.5:5432".into(),
            name: format!("capstan_{}", b.binding_id),
            secret_keys: vec!["PGPASSWORD".into(), "DATABASE_URL".into()],
        })
    }

    async fn revoke(&self, _: &capstan_sdk::testing::Identity, _: &str, b: &StorageBinding) -> Result<(), HostRefusal> {
        self.answer(format!("revoke {}", b.binding_id))
    }

    async fn destroy(&self, _: &capstan_sdk::testing::Identity, _: &str, b: &StorageBinding) -> Result<(), HostRefusal> {
        self.answer(format!("destroy {}", b.binding_id))
    }
}

fn spec(service: &str, placement: Value) -> Value {
    json!({ "serviceId": service, "clusterId": "cluster_a", "placement": placement, "replicasPerNode": 1 })
}

/// The manager on a host whose providers `Providers` stands in for, and an organization.
fn host() -> Option<(TestHost, Arc<Providers>, String)> {
    if capstan_sdk::testing::wasm_target_missing() {
        return None;
    }
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    let providers = Arc::new(Providers::default());
    host.set_storage_dispatch(providers.clone());
    let org = host.create_organization("acme");
    Some((host, providers, org))
}

#[test]
fn a_binding_is_placed_provisioned_gated_and_deleted_by_choice() {
    let Some((host, providers, org)) = host() else { return };
    let service = host.create_service(&org, json!({ "name": "ledger", "image": "registry.example.com/ledger:1" }));
    let create = |service: &str, name: &str| {
        host.call(
            "create",
            json!({ "organizationId": org, "serviceId": service, "kind": "database", "engine": "postgresql", "name": name }),
        )
    };

    // no spec: recorded, unplaced, and the service's replicas gated
    let created = create(&service, "main").unwrap();
    assert_eq!((created["state"].as_str(), created["reason"].as_str()), (Some("pending"), Some("binding-unplaced")), "{created}");
    assert_eq!(host.service_gate(&service).as_deref(), Some("bindings-pending"));
    assert!(providers.asked().is_empty(), "nothing is provisioned before it is placed");
    let id = created["id"].as_str().unwrap().to_string();
    let facet = &host.service(&service).unwrap()["facets"]["bindings"];
    assert_eq!(facet["bindings"][0]["state"], "pending", "{facet}");

    // pinned to one node: the next pass provisions it there and lifts the gate
    host.put_service_spec(spec(&service, json!({ "everyNode": false, "nodes": ["node_a"] })));
    host.reconcile(&[]).unwrap();
    assert_eq!(providers.asked(), [format!("provision {id} {service} on node_a")]);
    let ready = host.call("get", json!({ "organizationId": org, "bindingId": id })).unwrap();
    assert_eq!((ready["state"].as_str(), ready["nodeId"].as_str()), (Some("ready"), Some("node_a")), "{ready}");
    assert_eq!(ready["secretKeys"], json!(["PGPASSWORD", "DATABASE_URL"]));
    assert_eq!(host.service_gate(&service), None);
    // a steady pass asks nothing more
    host.reconcile(&[]).unwrap();
    assert_eq!(providers.asked().len(), 1);

    // one database binding per service; names unique; engines provided only
    assert_eq!(create(&service, "main").unwrap_err().code(), "binding-exists");
    assert_eq!(create(&service, "second").unwrap_err().code(), "binding-environment-conflict");
    let mongo = host
        .call("create", json!({ "organizationId": org, "serviceId": service, "kind": "database", "engine": "mongodb", "name": "docs" }));
    assert_eq!(mongo.unwrap_err().code(), "binding-engine-unsupported");
    // a bucket beside the database: provisioned at once on the same node
    let bucket = |engine: &str, name: &str| {
        host.call("create", json!({ "organizationId": org, "serviceId": service, "kind": "objectstorage", "engine": engine, "name": name }))
    };
    assert_eq!(bucket("minio", "files").unwrap_err().code(), "binding-engine-unsupported");
    let files = bucket("s3", "files").unwrap();
    assert_eq!((files["state"].as_str(), files["kind"].as_str()), (Some("ready"), Some("objectstorage")), "{files}");
    assert_eq!(bucket("s3", "more").unwrap_err().code(), "binding-environment-conflict");
    let files_id = files["id"].as_str().unwrap().to_string();
    let stranger = host.call("get", json!({ "organizationId": "org_other", "bindingId": id }));
    assert_eq!(stranger.unwrap_err().code(), "binding-not-found", "another organization cannot read it");

    // a service on every node: refused, nothing recorded
    let everywhere = host.create_service(&org, json!({ "name": "everywhere", "image": "registry.example.com/e:1" }));
    host.put_service_spec(spec(&everywhere, json!({ "everyNode": true })));
    assert_eq!(create(&everywhere, "main").unwrap_err().code(), "binding-placement-ambiguous");
    assert_eq!(host.service_gate(&everywhere), None);

    // the provider down: the binding waits with the provider's reason, the gate holds
    let second = host.create_service(&org, json!({ "name": "second", "image": "registry.example.com/s:1" }));
    host.put_service_spec(spec(&second, json!({ "everyNode": false, "nodes": ["node_b"] })));
    *providers.failing.lock().unwrap() = Some(HostRefusal::new("database-endpoint-unreachable", "the server did not answer").retryable());
    let waiting = create(&second, "main").unwrap();
    assert_eq!((waiting["state"].as_str(), waiting["reason"].as_str()), (Some("pending"), Some("database-endpoint-unreachable")));
    assert_eq!(host.service_gate(&second).as_deref(), Some("bindings-pending"));
    *providers.failing.lock().unwrap() = None;
    host.reconcile(&[]).unwrap();
    let second_id = waiting["id"].as_str().unwrap().to_string();
    assert_eq!(host.call("get", json!({ "organizationId": org, "bindingId": second_id })).unwrap()["state"], "ready");
    assert_eq!(host.service_gate(&second), None);

    // deleting: dropped data destroys, kept data revokes; the record and the facet go
    let dropped = host.call("delete", json!({ "organizationId": org, "bindingId": id, "data": "drop" })).unwrap();
    assert_eq!(dropped["state"], "deleted", "{dropped}");
    let kept = host.call("delete", json!({ "organizationId": org, "bindingId": second_id, "data": "keep" })).unwrap();
    assert_eq!(kept["state"], "deleted", "{kept}");
    assert_eq!(host.service_gate(&service), None, "the bucket is still ready");
    host.call("delete", json!({ "organizationId": org, "bindingId": files_id, "data": "drop" })).unwrap();
    let asked = providers.asked();
    assert_eq!(asked[asked.len() - 3..], [format!("destroy {id}"), format!("revoke {second_id}"), format!("destroy {files_id}")]);
    let listed = host.call("list", json!({ "organizationId": org })).unwrap();
    assert_eq!(listed["bindings"], json!([]), "{listed}");
    assert!(host.service(&service).unwrap()["facets"].get("bindings").is_none(), "the facet goes with the last binding");
    let no_choice = host.call("delete", json!({ "organizationId": org, "bindingId": id }));
    assert_eq!(no_choice.unwrap_err().code(), "invalid-request", "the data's fate is never defaulted");
}

#[test]
fn a_service_whose_template_declares_storage_is_given_those_bindings() {
    let Some((host, providers, org)) = host() else { return };
    let snapshot = json!({ "appId": "wiki", "version": "1.0.0",
                           "template": { "image": "registry.example.com/wiki:1", "capabilities": ["database", "objectstorage", "platform-oidc"] } });
    let wiki = host.create_service(&org, json!({ "name": "wiki", "image": "registry.example.com/wiki:1", "template": snapshot }));
    host.put_service_spec(spec(&wiki, json!({ "everyNode": false, "nodes": ["node_a"] })));
    host.publish("service.created", &wiki, json!({}));
    host.deliver_events().unwrap();
    let listed = host.call("list", json!({ "organizationId": org, "serviceId": wiki })).unwrap();
    let made: Vec<(&str, &str, &str)> = listed["bindings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["kind"].as_str().unwrap(), b["engine"].as_str().unwrap(), b["state"].as_str().unwrap()))
        .collect();
    assert_eq!(made.len(), 2, "{listed}");
    assert!(made.contains(&("database", "postgresql", "ready")) && made.contains(&("objectstorage", "s3", "ready")), "{listed}");
    // delivered again (at least once): nothing more is made
    host.publish("service.updated", &wiki, json!({}));
    host.deliver_events().unwrap();
    assert_eq!(host.call("list", json!({ "organizationId": org, "serviceId": wiki })).unwrap()["bindings"].as_array().unwrap().len(), 2);
    assert_eq!(providers.asked().len(), 2);
    // a service without a template is left alone
    let plain = host.create_service(&org, json!({ "name": "plain", "image": "registry.example.com/p:1" }));
    host.publish("service.created", &plain, json!({}));
    host.deliver_events().unwrap();
    assert_eq!(host.call("list", json!({ "organizationId": org, "serviceId": plain })).unwrap()["bindings"], json!([]));
}
