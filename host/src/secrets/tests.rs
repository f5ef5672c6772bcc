//! The secrets methods through the registry: round trips, rotation, revocation, scopes,
//! sealed input bound to its request, and no planted value in any answer or refusal.

use super::envelope;
use super::ingress::{self, seal_to};
use crate::refusal::Refusal;
use serde_json::{Value, json};

const PLANTED: &str = "hunter2-planted-secret-value";

struct World {
    host: crate::inventory::tests::World,
}

impl World {
    async fn new() -> World {
        World { host: crate::inventory::tests::World::new().await }
    }

    async fn call(&self, method: &str, body: Value) -> Result<Value, Refusal> {
        let result = self.host.call(&self.host.admin, method, body).await;
        // whatever happens, no answer and no refusal carries the planted value
        let shown = match &result {
            Ok(v) => v.to_string(),
            Err(e) => format!("{} {} {:?} {:?}", e.code, e.message, e.data, e.detail),
        };
        assert!(!shown.contains(PLANTED), "{method} showed the value: {shown}");
        result
    }

    fn sealed(&self, method: &str, owner: &str, key: &str, value: &str) -> Value {
        let keyring = &self.host.state.keyring;
        let target = ingress::target(method, owner, key);
        serde_json::to_value(seal_to(keyring.ingress_id(), keyring.ingress_public_key(), &target, value.as_bytes())).unwrap()
    }

    async fn service(&self) -> String {
        let org = self.call("organizations.create", json!({"name": "acme"})).await.unwrap();
        let svc = self.call("services.create", json!({"name": "web", "organizationId": org["id"], "image": "nginx"})).await.unwrap();
        svc["id"].as_str().unwrap().to_string()
    }
}

#[tokio::test]
async fn a_sealed_value_round_trips_and_rotates_into_immutable_versions() {
    let w = World::new().await;
    let svc = w.service().await;
    let owner = json!({"kind": "service", "serviceId": svc});
    let owner_ref = format!("service:{svc}");
    let created = w
        .call("secrets.create", json!({"owner": owner, "key": "DB_PASSWORD", "value": {"sealed": w.sealed("secrets.create", &owner_ref, "DB_PASSWORD", PLANTED)}}))
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(
        (created["state"].as_str(), created["versions"].as_u64(), created["environment"].as_str()),
        (Some("active"), Some(1), Some("production"))
    );
    assert_eq!(&**super::methods::open_current(&w.host.state.store, &w.host.state.keyring, &id).await.unwrap(), PLANTED.as_bytes());

    // a value sealed for another request does not open here
    let wrong = w.sealed("secrets.create", &owner_ref, "OTHER_KEY", PLANTED);
    let err = w.call("secrets.create", json!({"owner": owner, "key": "API_TOKEN", "value": {"sealed": wrong}})).await.unwrap_err();
    assert_eq!(err.code, "sealed-input-invalid");
    let again = w.sealed("secrets.create", &owner_ref, "DB_PASSWORD", "x-another-value");
    assert_eq!(
        w.call("secrets.create", json!({"owner": owner, "key": "DB_PASSWORD", "value": {"sealed": again}})).await.unwrap_err().code,
        "exists"
    );

    // rotation: a new version, stated against the one read; versions never change
    let first_version = created["currentVersionId"].clone();
    let rotated = w
        .call(
            "secrets.rotate",
            json!({"id": id, "expectedVersionId": first_version, "value": {"generate": {"length": 32, "alphabet": "alphanumeric"}}}),
        )
        .await
        .unwrap();
    assert_eq!(rotated["versions"], 2);
    let generated = super::methods::open_current(&w.host.state.store, &w.host.state.keyring, &id).await.unwrap();
    assert_eq!(generated.len(), 32);
    assert!(generated.iter().all(u8::is_ascii_alphanumeric));
    let stale = w
        .call(
            "secrets.rotate",
            json!({"id": id, "expectedVersionId": first_version, "value": {"generate": {"length": 32, "alphabet": "hex"}}}),
        )
        .await;
    assert_eq!(stale.unwrap_err().code, "conflict");
    let sealed_for_create = w.sealed("secrets.create", &owner_ref, "DB_PASSWORD", PLANTED);
    let err = w
        .call("secrets.rotate", json!({"id": id, "expectedVersionId": rotated["currentVersionId"], "value": {"sealed": sealed_for_create}}))
        .await;
    assert_eq!(err.unwrap_err().code, "sealed-input-invalid", "a value sealed for create does not open for rotate");

    let detail = w.call("secrets.get", json!({"id": id})).await.unwrap();
    let history = detail["versionHistory"].as_array().unwrap();
    assert_eq!((history.len(), history[0]["number"].as_u64(), history[1]["source"].as_str()), (2, Some(2), Some("sealed")));
    assert!(!detail.to_string().contains("ciphertext") && !detail.to_string().contains("wrappedDek"), "no envelope in an answer: {detail}");

    // revocation keeps the history and refuses new versions
    let revoked = w.call("secrets.revoke", json!({"id": id})).await.unwrap();
    assert_eq!(revoked["state"], "revoked");
    let err = w
        .call(
            "secrets.rotate",
            json!({"id": id, "expectedVersionId": revoked["currentVersionId"], "value": {"generate": {"length": 16, "alphabet": "hex"}}}),
        )
        .await;
    assert_eq!(err.unwrap_err().code, "secret-revoked");
    let listed = w.call("secrets.list", json!({"owner": owner})).await.unwrap();
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);

    let kinds: Vec<String> = crate::events::read_after(&w.host.state.store, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .filter(|k| k.starts_with("secret."))
        .collect();
    assert_eq!(
        kinds,
        [
            "secret.created",
            "secret.manifestPublished",
            "secret.rotated",
            "secret.manifestPublished",
            "secret.revoked",
            "secret.manifestPublished"
        ]
    );
}

#[tokio::test]
async fn refusals_are_named_and_scopes_keep_managers_apart() {
    let w = World::new().await;
    let svc = w.service().await;
    let owner = json!({"kind": "service", "serviceId": svc});
    let generate = json!({"generate": {"length": 24, "alphabet": "base64url"}});
    for (body, code) in [
        (json!({"owner": owner, "key": "lower", "value": generate}), "environment-key-invalid"),
        (json!({"owner": {"kind": "service", "serviceId": "svc_missing"}, "key": "K", "value": generate}), "service-not-found"),
        (
            json!({"owner": {"kind": "organization", "organizationId": "org_missing"}, "key": "K", "value": generate}),
            "organization-not-found",
        ),
        (json!({"owner": {"kind": "system", "systemId": "bad id!"}, "key": "K", "value": generate}), "invalid-request"),
        (json!({"owner": owner, "key": "K", "value": {"generate": {"length": 8, "alphabet": "hex"}}}), "invalid-request"),
        (json!({"owner": owner, "key": "K", "value": {"generate": {"length": 32, "alphabet": "emoji"}}}), "invalid-request"),
        (json!({"owner": owner, "key": "K", "value": generate, "extra": PLANTED}), "invalid-request"),
        (json!({"owner": owner, "key": "K", "value": {"plain": PLANTED}}), "invalid-request"),
        (json!({"owner": owner, "key": "K", "environment": "Prod", "value": generate}), "name-invalid"),
    ] {
        assert_eq!(w.call("secrets.create", body.clone()).await.unwrap_err().code, code, "{body}");
    }
    let owner_ref = format!("service:{svc}");
    let empty = w.sealed("secrets.create", &owner_ref, "EMPTY", "");
    assert_eq!(
        w.call("secrets.create", json!({"owner": owner, "key": "EMPTY", "value": {"sealed": empty}})).await.unwrap_err().code,
        "input-empty"
    );
    let big = "x".repeat(super::methods::MAX_VALUE_BYTES + 1);
    let oversized = w.sealed("secrets.create", &owner_ref, "BIG", &big);
    assert_eq!(
        w.call("secrets.create", json!({"owner": owner, "key": "BIG", "value": {"sealed": oversized}})).await.unwrap_err().code,
        "input-oversized"
    );

    let mail = w
        .call(
            "secrets.create",
            json!({"owner": owner, "key": "SMTP_PASSWORD", "managementScope": format!("mail:{svc}"), "value": generate}),
        )
        .await
        .unwrap();
    let version = mail["currentVersionId"].clone();
    for scope in [json!(null), json!(format!("backups:{svc}"))] {
        let err = w
            .call("secrets.rotate", json!({"id": mail["id"], "expectedVersionId": version, "managementScope": scope, "value": generate}))
            .await;
        assert_eq!(err.unwrap_err().code, "management-scope-mismatch", "{scope}");
        let err = w.call("secrets.revoke", json!({"id": mail["id"], "managementScope": scope})).await;
        assert_eq!(err.unwrap_err().code, "management-scope-mismatch");
    }
    w.call(
        "secrets.rotate",
        json!({"id": mail["id"], "expectedVersionId": version, "managementScope": format!("mail:{svc}"), "value": generate}),
    )
    .await
    .unwrap();
    assert_eq!(w.call("secrets.get", json!({"id": "sec_missing"})).await.unwrap_err().code, "secret-not-found");

    // system secrets belong to no organization
    let system = w
        .call(
            "secrets.create",
            json!({"owner": {"kind": "system", "systemId": "gateway"}, "key": "DCROUTER_GATEWAY_API_TOKEN", "value": generate}),
        )
        .await
        .unwrap();
    assert_eq!((system["ownerRef"].as_str(), system["organizationId"].as_str()), (Some("system:gateway"), Some("")));
    let recipient = w.call("secrets.getIngressRecipient", json!({})).await.unwrap();
    assert_eq!(recipient["recipientId"], w.host.state.keyring.ingress_id());
}

#[tokio::test]
async fn a_stored_envelope_moved_to_another_secret_does_not_open() {
    let w = World::new().await;
    let svc = w.service().await;
    let owner = json!({"kind": "service", "serviceId": svc});
    let generate = json!({"generate": {"length": 24, "alphabet": "hex"}});
    let a = w.call("secrets.create", json!({"owner": owner, "key": "A_KEY", "value": generate})).await.unwrap();
    let b = w.call("secrets.create", json!({"owner": owner, "key": "B_KEY", "value": generate})).await.unwrap();
    let (a_version, b_version) = (a["currentVersionId"].as_str().unwrap().to_string(), b["currentVersionId"].as_str().unwrap().to_string());
    // copy A's envelope over B's version, as someone with store access might
    let store = w.host.state.store.clone();
    store
        .transact(|tx| {
            let (a_version, b_version) = (a_version.clone(), b_version.clone());
            async move {
                let source = tx.require(super::methods::VERSIONS, &a_version).await?;
                let target = tx.require(super::methods::VERSIONS, &b_version).await?;
                let mut data = target.data.clone();
                data["envelope"] = source.data["envelope"].clone();
                tx.replace(super::methods::VERSIONS, &b_version, target.revision, data).await
            }
        })
        .await
        .unwrap();
    let err = super::methods::open_current(&w.host.state.store, &w.host.state.keyring, b["id"].as_str().unwrap()).await.unwrap_err();
    assert_eq!(err.code, "material-not-readable");
    assert!(envelope::PROFILE.starts_with("capstan-envelope"));
}

#[tokio::test]
async fn every_change_publishes_a_manifest_once_and_an_agent_opens_its_sealed_copy() {
    let w = World::new().await;
    let svc = w.service().await;
    let owner = json!({"kind": "service", "serviceId": svc});
    let owner_ref = format!("service:{svc}");
    let db = w
        .call("secrets.create", json!({"owner": owner, "key": "DB_PASSWORD", "value": {"sealed": w.sealed("secrets.create", &owner_ref, "DB_PASSWORD", PLANTED)}}))
        .await
        .unwrap();
    let api = w
        .call("secrets.create", json!({"owner": owner, "key": "API_TOKEN", "value": {"generate": {"length": 20, "alphabet": "hex"}}}))
        .await
        .unwrap();
    let manifest = w.call("secrets.getManifest", json!({"serviceId": svc})).await.unwrap();
    assert_eq!(manifest["number"], 2, "one manifest per change: {manifest}");
    assert_eq!(manifest["entries"]["production"]["DB_PASSWORD"]["versionId"], db["currentVersionId"]);
    assert_eq!(manifest["entries"]["production"]["API_TOKEN"]["secretId"], api["id"]);

    // a revocation resolves differently: a new manifest without the key; revoking again publishes nothing
    w.call("secrets.revoke", json!({"id": api["id"]})).await.unwrap();
    w.call("secrets.revoke", json!({"id": api["id"]})).await.unwrap();
    let manifest = w.call("secrets.getManifest", json!({"serviceId": svc})).await.unwrap();
    assert_eq!(manifest["number"], 3);
    assert!(manifest["entries"]["production"].get("API_TOKEN").is_none());
    let published = crate::events::read_after(&w.host.state.store, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "secret.manifestPublished")
        .count();
    assert_eq!(published, 3);

    // the agent's copy opens with its own key, for this manifest and key only
    let agent = x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>());
    let current = super::manifests::current(&w.host.state.store, &svc).await.unwrap().unwrap();
    let sealed = super::manifests::seal_for_agent(
        &w.host.state.store,
        &w.host.state.keyring,
        &current,
        "agent-1",
        &x25519_dalek::PublicKey::from(&agent),
    )
    .await
    .unwrap();
    assert!(!serde_json::to_string(&sealed).unwrap().contains(PLANTED));
    let value = &sealed.values["production"]["DB_PASSWORD"];
    let target = super::manifests::agent_target(&svc, 3, "production", "DB_PASSWORD");
    assert_eq!(&**ingress::open_as(&agent, &target, value).unwrap(), PLANTED.as_bytes());
    let older = super::manifests::agent_target(&svc, 2, "production", "DB_PASSWORD");
    assert_eq!(ingress::open_as(&agent, &older, value).unwrap_err().code, "sealed-input-invalid");
    let stranger = x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>());
    assert_eq!(ingress::open_as(&stranger, &target, value).unwrap_err().code, "sealed-input-invalid");
}
