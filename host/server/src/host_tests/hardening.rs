//! What a caller may learn and leave behind, through the assembled host: a stranger's id answers
//! as a missing one, every failed login of a burst is audited, and a body is the object its
//! method takes, naming no id `""`.

use super::inventory::World;
use crate::auth::Identity;
use crate::refusal::Refusal;
use capstan_rpc::{Body, Caller, Invocation};
use serde_json::{Value, json};

async fn ok(w: &World, who: &Identity, method: &str, body: Value) -> Value {
    w.call(who, method, body.clone()).await.unwrap_or_else(|e| panic!("{method} {body}: {e}"))
}

async fn refused(w: &World, who: &Identity, method: &str, body: Value) -> Refusal {
    w.call(who, method, body.clone()).await.expect_err(&format!("{method} {body} should be refused"))
}

/// A person with a login who is an owner of `organization`.
async fn owner_of(w: &World, username: &str, organization: &str) -> Identity {
    let created = ok(w, &w.admin, "admin.createUser", json!({ "username": username })).await;
    let user_id = created["userId"].as_str().unwrap();
    ok(w, &w.admin, "organizations.setMember", json!({ "organizationId": organization, "userId": user_id, "role": "owner" })).await;
    let answer = w.state.auth.login(username, created["password"].as_str().unwrap(), None).await.unwrap();
    w.state.auth.authenticate(&answer.token).await.unwrap()
}

async fn org(w: &World, name: &str) -> String {
    ok(w, &w.admin, "organizations.create", json!({ "name": name })).await["id"].as_str().unwrap().to_string()
}

/// A deployment machine user granted `capabilities` on `service`, signed in.
async fn deployer(w: &World, username: &str, service: &str, capabilities: &[&str]) -> (String, Identity) {
    let created = ok(w, &w.admin, "deployers.create", json!({ "username": username })).await;
    let user_id = created["userId"].as_str().unwrap().to_string();
    ok(w, &w.admin, "deployers.grant", json!({ "serviceId": service, "userId": user_id, "capabilities": capabilities })).await;
    let session = w.state.auth.exchange_token(created["token"].as_str().unwrap(), None).await.unwrap();
    (user_id, w.state.auth.authenticate(&session.token).await.unwrap())
}

/// `answer` as text with `id` written as `<id>`: answers about two ids compared as shapes.
fn shape(answer: &impl serde::Serialize, id: &str) -> String {
    serde_json::to_string(answer).unwrap().replace(id, "<id>")
}

#[tokio::test]
async fn a_deployment_preflight_for_another_organizations_service_answers_as_for_none() {
    let w = World::new().await;
    let (acme, other) = (org(&w, "acme").await, org(&w, "other").await);
    let mine = ok(&w, &w.admin, "services.create", json!({ "name": "web", "organizationId": acme, "image": "nginx" })).await;
    let theirs =
        ok(&w, &w.admin, "services.create", json!({ "name": "api", "organizationId": other, "image": "nginx", "deployOnPush": true }))
            .await;
    let (mine, theirs) = (mine["id"].as_str().unwrap(), theirs["id"].as_str().unwrap());
    let missing = capstan_core::ids::new_id("svc");
    let (_, machine) = deployer(&w, "ci-acme", mine, &["deployment:reserve", "deployment:promote"]).await;
    let stranger = owner_of(&w, "olga", &acme).await;

    let preflight = |service: &str| json!({ "phase": "reserve", "serviceId": service, "tag": "1.0.0" });
    let ready = ok(&w, &machine, "deployments.getPreflight", preflight(mine)).await;
    assert_eq!((ready["ready"].clone(), ready["blockers"].clone()), (json!(true), json!([])), "{ready}");
    // a deployer, and a person who is not one, learn nothing of a service they cannot see:
    // neither that it exists nor its deploy-on-push switch
    for who in [&machine, &stranger] {
        let foreign = ok(&w, who, "deployments.getPreflight", preflight(theirs)).await;
        let unknown = ok(&w, who, "deployments.getPreflight", preflight(&missing)).await;
        assert_eq!(shape(&foreign, theirs), shape(&unknown, &missing), "{foreign} / {unknown}");
        let codes: Vec<&str> = foreign["blockers"].as_array().unwrap().iter().map(|b| b["code"].as_str().unwrap()).collect();
        assert_eq!(codes.last(), Some(&"service-not-found"), "{foreign}");
    }
    // the reservation itself answers the same
    let reserve = |service: &str| json!({ "serviceId": service, "tag": "1.0.0", "mutationId": format!("m-{service}") });
    let foreign = refused(&w, &machine, "deployments.reserve", reserve(theirs)).await;
    let unknown = refused(&w, &machine, "deployments.reserve", reserve(&missing)).await;
    assert_eq!(foreign.code, "service-not-found");
    assert_eq!(shape(&foreign, theirs), shape(&unknown, &missing));
    // one that may read the service without the grant is told what it lacks, as before
    let (_, reader) = deployer(&w, "ci-status", theirs, &["deployment:status"]).await;
    let blocked = ok(&w, &reader, "deployments.getPreflight", preflight(theirs)).await;
    let codes: Vec<&str> = blocked["blockers"].as_array().unwrap().iter().map(|b| b["code"].as_str().unwrap()).collect();
    assert_eq!(codes, ["forbidden", "deploy-on-push-enabled"], "{blocked}");
}

#[tokio::test]
async fn an_owner_cannot_learn_from_set_member_which_user_ids_exist() {
    let w = World::new().await;
    let acme = org(&w, "acme").await;
    let service = ok(&w, &w.admin, "services.create", json!({ "name": "web", "organizationId": acme, "image": "nginx" })).await;
    let owner = owner_of(&w, "olga", &acme).await;
    let (deployer_id, _) = deployer(&w, "ci-acme", service["id"].as_str().unwrap(), &["deployment:status"]).await;
    let missing = capstan_core::ids::new_id("usr");
    let set = |user: &str, role: Value| json!({ "organizationId": acme, "userId": user, "role": role });
    let unknown = refused(&w, &owner, "organizations.setMember", set(&missing, json!("member"))).await;
    let minted = refused(&w, &owner, "organizations.setMember", set(&deployer_id, json!("member"))).await;
    assert_eq!(unknown.code, "member-user-invalid");
    assert_eq!(shape(&unknown, &missing), shape(&minted, &deployer_id), "one answer whether or not the id exists");
    // removing a non-member says nothing about the user either
    let removed = ok(&w, &owner, "organizations.setMember", set(&missing, Value::Null)).await;
    assert_eq!(removed["role"], Value::Null);
    let removed = ok(&w, &owner, "organizations.setMember", set(&deployer_id, Value::Null)).await;
    assert_eq!(removed["role"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_failed_login_of_a_burst_is_audited_while_the_database_is_locked() {
    const BURST: usize = 500;
    let w = World::new().await;
    // another writer holds SQLite's one write lock through the burst, longer than a login's own
    // store work and then its audit record would each wait within the store's budget
    let store = w.state.store.clone();
    store.declare(crate::store::CollectionSpec::new("test_lock_holder")).await.unwrap();
    let locked = std::sync::Arc::new(tokio::sync::Notify::new());
    let holder = tokio::spawn({
        let locked = locked.clone();
        async move {
            store
                .transact(|tx| {
                    let locked = locked.clone();
                    async move {
                        tx.insert("test_lock_holder", &capstan_core::ids::new_id("lock"), json!({})).await?;
                        locked.notify_one();
                        tokio::time::sleep(2 * crate::store::DEFAULT_BUDGET + std::time::Duration::from_secs(2)).await;
                        Ok(())
                    }
                })
                .await
        }
    });
    locked.notified().await;
    let registry = &w.state.methods;
    let logins = (0..BURST).map(|i| async move {
        let source = std::net::IpAddr::from([10, 9, (i / 250) as u8, (i % 250) as u8 + 1]);
        let invocation = Invocation {
            method: "auth.login",
            caller: Caller::Bearer(None),
            source: Some(source),
            request_id: "",
            forwarded: false,
            body: Body::Value(json!({ "username": format!("nobody{}", i % 7), "password": "not the password" })),
        };
        registry.invoke(invocation).await.and_then(|invoked| invoked.into_value()).expect_err("no such user")
    });
    let mut answered: Vec<String> = futures::future::join_all(logins).await.into_iter().map(|r| r.code.to_string()).collect();
    holder.await.unwrap().unwrap();

    let (mut audited, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let page = ok(&w, &w.admin, "audit.list", json!({ "method": "auth.login", "limit": 200, "cursor": cursor })).await;
        audited.extend(page["records"].as_array().unwrap().iter().map(|r| r["outcome"].as_str().unwrap().to_string()));
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(audited.len(), BURST, "every failed login leaves its audit record");
    answered.sort();
    audited.sort();
    assert_eq!(audited, answered, "each with the refusal it answered");
}

#[tokio::test]
async fn a_body_that_is_not_an_object_is_refused_by_every_method_that_takes_one() {
    let w = World::new().await;
    let mut took_any = Vec::new();
    for method in w.state.methods.list().iter().filter(|m| m.plugin.is_none()) {
        if method.input_schema["type"] != "object" {
            took_any.push(method.name.clone());
            continue;
        }
        for body in [json!([]), json!([null, null]), json!(null)] {
            let answer = method.call(crate::api::Call::by(&w.admin), body.clone()).await;
            let refusal = answer.expect_err(&format!("{} {body}", method.name));
            assert_eq!(refusal.code, "invalid-request", "{} {body}: {refusal}", method.name);
        }
    }
    assert!(took_any.is_empty(), "every host method takes an object: {took_any:?}");
}

#[tokio::test]
async fn an_empty_id_is_refused_by_name_rather_than_looked_up() {
    let w = World::new().await;
    let invalid = |refusal: Refusal, field: &str| {
        assert_eq!(
            (refusal.code.as_ref(), refusal.data.as_ref().map(|d| d["field"].clone())),
            ("invalid-request", Some(json!(field))),
            "{refusal}"
        );
    };
    invalid(refused(&w, &w.admin, "relays.ping", json!({ "clusterId": "" })).await, "clusterId");
    invalid(refused(&w, &w.admin, "relays.list", json!({ "clusterIds": ["cluster_1", ""] })).await, "clusterIds[1]");
    invalid(refused(&w, &w.admin, "services.get", json!({ "id": "" })).await, "id");
    invalid(refused(&w, &w.admin, "deployments.getStatus", json!({ "operationId": "" })).await, "operationId");
    let acme = org(&w, "acme").await;
    invalid(
        refused(&w, &w.admin, "organizations.setMember", json!({ "organizationId": acme, "userId": "", "role": null })).await,
        "userId",
    );
    // every host method: each top-level id it takes, given as ""
    for method in w.state.methods.list().iter().filter(|m| m.plugin.is_none()) {
        let Some(properties) = method.input_schema["properties"].as_object() else { continue };
        for (field, schema) in properties {
            let string = schema["type"] == "string" || schema["type"].as_array().is_some_and(|t| t.contains(&json!("string")));
            if (field == "id" || field.ends_with("Id")) && string {
                let refusal = method.call(crate::api::Call::by(&w.admin), json!({ field.clone(): "" })).await.unwrap_err();
                invalid(refusal, field);
            }
        }
    }
}
