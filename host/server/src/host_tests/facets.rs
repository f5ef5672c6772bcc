//! Facets through the assembled host: the example plugin (built for wasm32-wasip2) keeps its
//! record on a service with `inventory.set-facet`, judged by the schema it declared; nobody
//! else writes it, and the operator's writes keep it.

use super::inventory::World;
use crate::inventory::facets::{self, Write};
use serde_json::{Value, json};

/// A world with the example plugin installed and a service to tag; `None` when the test
/// plugins cannot be built here (the reason was printed).
async fn tagged_world() -> Option<(World, String)> {
    let w = World::new().await;
    if !super::plugins::install_example(&w.state).await {
        return None;
    }
    let org = w.call(&w.admin, "organizations.create", json!({ "name": "acme" })).await.unwrap()["id"].as_str().unwrap().to_string();
    let service = w
        .call(&w.admin, "services.create", json!({ "organizationId": org, "name": "web", "image": "registry.example.com/web:1" }))
        .await
        .unwrap();
    Some((w, service["id"].as_str().unwrap().to_string()))
}

async fn tag(w: &World, service: &str, tag: Value) -> crate::refusal::Result<Value> {
    w.state.plugins.dispatch("example", "tagService", Some(&w.admin), "req-facets", json!({ "serviceId": service, "tag": tag })).await
}

#[tokio::test]
async fn a_plugin_keeps_its_facet_on_a_service_judged_by_its_schema() {
    let Some((w, service)) = tagged_world().await else { return };
    let before = w.call(&w.admin, "services.get", json!({ "id": service })).await.unwrap();
    assert!(before.get("facets").is_none(), "a new service carries no facet: {before}");

    let written = tag(&w, &service, json!("blue")).await.unwrap();
    assert_eq!(written["facets"], json!({ "example": { "tag": "blue" } }), "{written}");
    let read = w.call(&w.admin, "services.get", json!({ "id": service })).await.unwrap();
    assert_eq!(read["facets"]["example"]["tag"], "blue", "{read}");
    assert_eq!(read["revision"].as_u64(), before["revision"].as_u64().map(|r| r + 1), "one write: {read}");
    let events = crate::events::read_after(&w.state.store, 0, 1000).await.unwrap();
    let updated = events.iter().rfind(|e| e.kind == "service.updated" && e.subject == service).expect("a service.updated event");
    assert_eq!(updated.data["facet"], "example", "the event names the facet, not its value: {:?}", updated.data);
    assert!(updated.data.get("tag").is_none());

    // the same value again writes nothing
    tag(&w, &service, json!("blue")).await.unwrap();
    let again = w.call(&w.admin, "services.get", json!({ "id": service })).await.unwrap();
    assert_eq!(again["revision"], read["revision"], "{again}");

    // off the declared schema: refused by name, naming where, and nothing written
    let refused = tag(&w, &service, json!("x".repeat(41))).await.unwrap_err();
    assert_eq!(refused.code, "facet-invalid", "{refused}");
    assert_eq!(refused.data.as_ref().unwrap()["field"], "facets.example.tag", "{refused}");
    assert!(!refused.message.contains(&"x".repeat(41)), "the value is never quoted: {refused}");
    let unchanged = w.call(&w.admin, "services.get", json!({ "id": service })).await.unwrap();
    assert_eq!(unchanged["facets"]["example"]["tag"], "blue");

    // an operator's change keeps it, and no operator writes a facet
    let updated =
        w.call(&w.admin, "services.update", json!({ "id": service, "expectedRevision": unchanged["revision"], "scale": 2 })).await;
    assert_eq!(updated.unwrap()["facets"]["example"]["tag"], "blue");
    let current = w.call(&w.admin, "services.get", json!({ "id": service })).await.unwrap();
    let forged = w
        .call(&w.admin, "services.update", json!({ "id": service, "expectedRevision": current["revision"], "facets": { "example": {} } }))
        .await;
    assert_eq!(forged.unwrap_err().code, "invalid-request");

    // removed: the service carries no facet again
    let cleared = tag(&w, &service, Value::Null).await.unwrap();
    assert!(cleared.get("facets").is_none(), "{cleared}");
}

#[tokio::test]
async fn a_facet_is_written_only_by_the_plugin_that_declared_it_on_that_kind() {
    let Some((w, service)) = tagged_world().await else { return };
    let dependents = capstan_links::HostDependents;
    let write = |kind: &'static str, id: String, plugin: &'static str, expected_revision: Option<u64>| Write {
        kind,
        id: Box::leak(id.into_boxed_str()),
        plugin,
        value: Some(json!({ "tag": "red" })),
        expected_revision,
    };
    // a plugin that declares no facet (or is not installed) writes none
    let refused = facets::set(&w.state.store, &dependents, write("service", service.clone(), "backups", None)).await.unwrap_err();
    assert_eq!(refused.code, "facet-undeclared", "{refused}");
    // the example declares one on services, none on clusters or organizations
    let org = w.call(&w.admin, "organizations.list", json!({})).await.unwrap()["items"][0]["id"].as_str().unwrap().to_string();
    let refused = facets::set(&w.state.store, &dependents, write("organization", org, "example", None)).await.unwrap_err();
    assert_eq!(refused.code, "facet-undeclared", "{refused}");
    let refused = facets::set(&w.state.store, &dependents, write("node", service.clone(), "example", None)).await.unwrap_err();
    assert_eq!(refused.code, "facet-undeclared", "{refused}");
    let refused = facets::set(&w.state.store, &dependents, write("service", "svc_missing".into(), "example", None)).await.unwrap_err();
    assert_eq!(refused.code, "service-not-found", "{refused}");
    // fenced by the revision the record was derived from
    let current = w.call(&w.admin, "services.get", json!({ "id": service })).await.unwrap();
    let revision = current["revision"].as_u64().unwrap();
    let refused =
        facets::set(&w.state.store, &dependents, write("service", service.clone(), "example", Some(revision + 1))).await.unwrap_err();
    assert_eq!(refused.code, "conflict", "{refused}");
    let written = facets::set(&w.state.store, &dependents, write("service", service.clone(), "example", Some(revision))).await.unwrap();
    assert_eq!(written.data["facets"]["example"]["tag"], "red");
    // a service being deleted takes no new record; removing one is always taken
    crate::inventory::services::hold(&w.state.store, &service, "host:facets-test").await.unwrap();
    let deleting = w.call(&w.admin, "services.delete", json!({ "id": service, "expectedRevision": written.revision })).await.unwrap();
    assert_eq!(deleting["state"], "deleting", "{deleting}");
    let refused = facets::set(&w.state.store, &dependents, write("service", service.clone(), "example", None)).await.unwrap_err();
    assert_eq!(refused.code, "service-deleting", "{refused}");
    let removal = Write { kind: "service", id: &service, plugin: "example", value: None, expected_revision: None };
    let removed = facets::set(&w.state.store, &dependents, removal).await.unwrap();
    assert!(removed.data.get("facets").is_none(), "{:?}", removed.data);
}
