//! The secrets methods through the registry: round trips, rotation, revocation, scopes,
//! sealed input bound to its request, and no planted value in any answer or refusal.

use crate::refusal::Refusal;
use crate::secrets::envelope;
use crate::secrets::ingress::{self, seal_to};
use serde_json::{Value, json};

const PLANTED: &str = "hunter2-planted-secret-value";

struct World {
    host: super::inventory::World,
}

impl World {
    async fn new() -> World {
        World { host: super::inventory::World::new().await }
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

    /// A service with its own `DB_PASSWORD` set to the planted value, sealed to the ingress key:
    /// (service id, its owner as the methods take it, the created secret).
    async fn planted_db_password(&self) -> (String, Value, Value) {
        let svc = self.service().await;
        let owner = json!({"kind": "service", "serviceId": svc});
        let sealed = self.sealed("secrets.create", &format!("service:{svc}"), "DB_PASSWORD", PLANTED);
        let created =
            self.call("secrets.create", json!({"owner": owner, "key": "DB_PASSWORD", "value": {"sealed": sealed}})).await.unwrap();
        (svc, owner, created)
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
    let (svc, owner, created) = w.planted_db_password().await;
    let owner_ref = format!("service:{svc}");
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(
        (created["state"].as_str(), created["versions"].as_u64(), created["environment"].as_str()),
        (Some("active"), Some(1), Some("production"))
    );
    assert_eq!(
        &**crate::secrets::methods::open_current(&w.host.state.store, &w.host.state.keyring, &id).await.unwrap(),
        PLANTED.as_bytes()
    );

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
    let generated = crate::secrets::methods::open_current(&w.host.state.store, &w.host.state.keyring, &id).await.unwrap();
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
            json!({"owner": {"kind": "organization", "organizationId": "org_missing", "secretSetId": "sset_missing"}, "key": "K", "value": generate}),
            "secret-set-not-found",
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
    let big = "x".repeat(crate::secrets::methods::MAX_VALUE_BYTES + 1);
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
                let source = tx.require(crate::secrets::methods::VERSIONS, &a_version).await?;
                let target = tx.require(crate::secrets::methods::VERSIONS, &b_version).await?;
                let mut data = target.data.clone();
                data["envelope"] = source.data["envelope"].clone();
                tx.replace(crate::secrets::methods::VERSIONS, &b_version, target.revision, data).await
            }
        })
        .await
        .unwrap();
    let err =
        crate::secrets::methods::open_current(&w.host.state.store, &w.host.state.keyring, b["id"].as_str().unwrap()).await.unwrap_err();
    assert_eq!(err.code, "material-not-readable");
    assert!(envelope::PROFILE.starts_with("capstan-envelope"));
}

#[tokio::test]
async fn every_change_publishes_a_manifest_once_and_an_agent_opens_its_sealed_copy() {
    let w = World::new().await;
    let (svc, owner, db) = w.planted_db_password().await;
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
    let current = crate::secrets::manifests::current(&w.host.state.store, &svc).await.unwrap().unwrap();
    let sealed = crate::secrets::manifests::seal_for_agent(
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
    let target = crate::secrets::manifests::agent_target(&svc, 3, "production", "DB_PASSWORD");
    assert_eq!(&**ingress::open_as(&agent, &target, value).unwrap(), PLANTED.as_bytes());
    let older = crate::secrets::manifests::agent_target(&svc, 2, "production", "DB_PASSWORD");
    assert_eq!(ingress::open_as(&agent, &older, value).unwrap_err().code, "sealed-input-invalid");
    let stranger = x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>());
    assert_eq!(ingress::open_as(&stranger, &target, value).unwrap_err().code, "sealed-input-invalid");
}

fn manifests_published(events: &[crate::events::Event], service: &str) -> usize {
    events.iter().filter(|e| e.kind == "secret.manifestPublished" && e.subject == service).count()
}

async fn events(w: &World) -> Vec<crate::events::Event> {
    crate::events::read_after(&w.host.state.store, 0, 1000).await.unwrap()
}

#[tokio::test]
async fn secret_sets_attach_in_order_resolve_with_conflicts_named_and_retire_detaching_everywhere() {
    let w = World::new().await;
    let web = w.service().await;
    let org = w.call("services.get", json!({"id": web})).await.unwrap()["organizationId"].as_str().unwrap().to_string();
    let api = w.call("services.create", json!({"name": "api", "organizationId": org, "image": "nginx"})).await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let generate = json!({"generate": {"length": 24, "alphabet": "hex"}});

    let set =
        w.call("secrets.createSecretSet", json!({"organizationId": org, "name": "shared", "description": "smtp relay"})).await.unwrap();
    let set_id = set["id"].as_str().unwrap().to_string();
    assert_eq!((set["state"].as_str(), set["revision"].as_u64()), (Some("active"), Some(1)));
    assert_eq!(w.call("secrets.createSecretSet", json!({"organizationId": org, "name": "shared"})).await.unwrap_err().code, "exists");
    let set_owner = json!({"kind": "organization", "organizationId": org, "secretSetId": set_id});
    let set_ref = format!("organization:{org}/secretSet:{set_id}");
    let smtp = w
        .call("secrets.create", json!({"owner": set_owner, "key": "SMTP_PASSWORD", "value": {"sealed": w.sealed("secrets.create", &set_ref, "SMTP_PASSWORD", PLANTED)}}))
        .await
        .unwrap();
    assert_eq!((smtp["ownerRef"].as_str(), smtp["organizationId"].as_str()), (Some(set_ref.as_str()), Some(org.as_str())));
    w.call("secrets.create", json!({"owner": set_owner, "key": "DB_URL", "value": generate})).await.unwrap();
    let own = w
        .call("secrets.create", json!({"owner": {"kind": "service", "serviceId": web}, "key": "DB_URL", "value": generate}))
        .await
        .unwrap();

    // attaching states the service's secrets revision
    let config = w.call("secrets.getServiceConfiguration", json!({"serviceId": web})).await.unwrap();
    assert_eq!(config, json!({"serviceId": web, "secretsRevision": 0, "attachments": []}));
    let attach = |service: &str, revision: u64| json!({"serviceId": service, "secretSetId": set_id, "expectedSecretsRevision": revision});
    assert_eq!(w.call("secrets.attachSecretSet", attach(&web, 3)).await.unwrap_err().code, "conflict");
    let config = w.call("secrets.attachSecretSet", attach(&web, 0)).await.unwrap();
    assert_eq!((config["secretsRevision"].as_u64(), config["attachments"][0]["secretSetId"].as_str()), (Some(1), Some(set_id.as_str())));
    assert_eq!(w.call("secrets.attachSecretSet", attach(&web, 1)).await.unwrap_err().code, "secret-set-already-attached");

    // the service's own secret wins and the conflict is named; the set supplies the rest
    let manifest = w.call("secrets.getManifest", json!({"serviceId": web})).await.unwrap();
    let entries = &manifest["entries"]["production"];
    assert_eq!(entries["DB_URL"]["secretId"], own["id"]);
    assert_eq!(entries["DB_URL"]["from"], json!({"kind": "service"}));
    assert_eq!(entries["SMTP_PASSWORD"]["from"], json!({"kind": "secretSet", "secretSetId": set_id}));
    let preview = w.call("secrets.previewResolution", json!({"serviceId": web})).await.unwrap();
    assert_eq!((preview["secretsRevision"].as_u64(), preview["manifestNumber"].clone()), (Some(1), manifest["number"].clone()));
    assert_eq!(preview["entries"].as_array().unwrap().len(), 2);
    assert_eq!(
        preview["conflicts"],
        json!([{"environment": "production", "key": "DB_URL", "resolvedFrom": {"kind": "service"}, "shadowed": [{"kind": "secretSet", "secretSetId": set_id}]}])
    );

    // an exact replay answers again and publishes nothing; the same id for another request is refused
    let mut replayable = attach(&api, 0);
    replayable["mutationId"] = json!("attach-api-1");
    let first = w.call("secrets.attachSecretSet", replayable.clone()).await.unwrap();
    let before = events(&w).await;
    assert_eq!(w.call("secrets.attachSecretSet", replayable.clone()).await.unwrap(), first);
    assert_eq!(events(&w).await.len(), before.len(), "a replay writes nothing");
    replayable["serviceId"] = json!(web);
    assert_eq!(w.call("secrets.attachSecretSet", replayable).await.unwrap_err().code, "mutation-reused");

    // rotating a set member publishes the manifest of every service it is attached to
    let before = events(&w).await;
    w.call("secrets.rotate", json!({"id": smtp["id"], "expectedVersionId": smtp["currentVersionId"], "value": generate})).await.unwrap();
    let after = events(&w).await;
    assert_eq!(
        (manifests_published(&after, &web), manifests_published(&after, &api)),
        (manifests_published(&before, &web) + 1, manifests_published(&before, &api) + 1)
    );

    // another organization's set, and a set that is not attached, are refused by name
    let other_org = w.call("organizations.create", json!({"name": "globex"})).await.unwrap();
    let foreign = w.call("secrets.createSecretSet", json!({"organizationId": other_org["id"], "name": "shared"})).await.unwrap();
    let body = json!({"serviceId": web, "secretSetId": foreign["id"], "expectedSecretsRevision": 1});
    assert_eq!(w.call("secrets.attachSecretSet", body.clone()).await.unwrap_err().code, "secret-set-organization-mismatch");
    assert_eq!(w.call("secrets.detachSecretSet", body).await.unwrap_err().code, "secret-set-not-attached");
    assert_eq!(
        w.call("organizations.delete", json!({"id": other_org["id"], "expectedRevision": other_org["revision"]})).await.unwrap_err().code,
        "organization-has-secret-sets"
    );

    // renaming states the revision
    let renamed = w.call("secrets.updateSecretSet", json!({"id": set_id, "expectedRevision": 1, "name": "mail-relay"})).await.unwrap();
    assert_eq!((renamed["name"].as_str(), renamed["revision"].as_u64()), (Some("mail-relay"), Some(2)));
    assert_eq!(
        w.call("secrets.updateSecretSet", json!({"id": set_id, "expectedRevision": 1, "description": "x"})).await.unwrap_err().code,
        "conflict"
    );

    // retiring detaches it from every service and publishes each one's manifest, in one go
    assert_eq!(w.call("secrets.retireSecretSet", json!({"id": set_id, "expectedRevision": 1})).await.unwrap_err().code, "conflict");
    let retired = w.call("secrets.retireSecretSet", json!({"id": set_id, "expectedRevision": 2})).await.unwrap();
    let mut detached: Vec<&str> = retired["detachedServiceIds"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    detached.sort();
    let mut both = vec![web.as_str(), api.as_str()];
    both.sort();
    assert_eq!((retired["secretSet"]["state"].as_str(), detached), (Some("retired"), both));
    for service in [&web, &api] {
        let manifest = w.call("secrets.getManifest", json!({"serviceId": service})).await.unwrap();
        assert!(manifest["entries"]["production"].get("SMTP_PASSWORD").is_none(), "{manifest}");
        let config = w.call("secrets.getServiceConfiguration", json!({"serviceId": service})).await.unwrap();
        assert_eq!(config["attachments"], json!([]));
    }
    let detail = w.call("secrets.getSecretSet", json!({"id": set_id})).await.unwrap();
    assert_eq!((detail["secrets"].as_array().unwrap().len(), detail["attachedServiceIds"].clone()), (2, json!([])));
    let web_revision =
        w.call("secrets.getServiceConfiguration", json!({"serviceId": web})).await.unwrap()["secretsRevision"].as_u64().unwrap();
    assert_eq!(w.call("secrets.attachSecretSet", attach(&web, web_revision)).await.unwrap_err().code, "secret-set-retired");
    assert_eq!(
        w.call("secrets.create", json!({"owner": set_owner, "key": "NEW_KEY", "value": generate})).await.unwrap_err().code,
        "secret-set-retired"
    );
    let smtp_now = w.call("secrets.get", json!({"id": smtp["id"]})).await.unwrap();
    let err =
        w.call("secrets.rotate", json!({"id": smtp["id"], "expectedVersionId": smtp_now["currentVersionId"], "value": generate})).await;
    assert_eq!(err.unwrap_err().code, "secret-set-retired");
    assert_eq!(
        w.call("secrets.retireSecretSet", json!({"id": set_id, "expectedRevision": retired["secretSet"]["revision"]}))
            .await
            .unwrap_err()
            .code,
        "secret-set-retired"
    );
    let listed = w.call("secrets.listSecretSets", json!({"organizationId": org})).await.unwrap();
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);
    assert_eq!(w.call("secrets.getSecretSet", json!({"id": "sset_missing"})).await.unwrap_err().code, "secret-set-not-found");
}

#[tokio::test]
async fn replays_create_nothing_twice_and_a_deleted_service_takes_its_secrets_and_attachments_along() {
    let w = World::new().await;
    let svc = w.service().await;
    let owner = json!({"kind": "service", "serviceId": svc});
    let owner_ref = format!("service:{svc}");
    let body = json!({"owner": owner, "key": "DB_PASSWORD", "mutationId": "create-db-1", "value": {"sealed": w.sealed("secrets.create", &owner_ref, "DB_PASSWORD", PLANTED)}});
    let first = w.call("secrets.create", body.clone()).await.unwrap();
    let before = events(&w).await.len();
    assert_eq!(w.call("secrets.create", body).await.unwrap(), first, "the exact replay answers the first answer");
    assert_eq!(events(&w).await.len(), before, "and writes nothing, publishes nothing");
    let rotate = json!({"id": first["id"], "expectedVersionId": first["currentVersionId"], "mutationId": "rotate-db-1", "value": {"generate": {"length": 16, "alphabet": "hex"}}});
    let rotated = w.call("secrets.rotate", rotate.clone()).await.unwrap();
    assert_eq!(w.call("secrets.rotate", rotate).await.unwrap(), rotated, "a replayed generate does not generate again");
    assert_eq!(w.call("secrets.get", json!({"id": first["id"]})).await.unwrap()["versions"], 2);
    let err = w.call("secrets.revoke", json!({"id": first["id"], "mutationId": "bad id!"})).await.unwrap_err();
    assert_eq!(err.code, "invalid-request");

    let org = w.call("services.get", json!({"id": svc})).await.unwrap()["organizationId"].clone();
    let set = w.call("secrets.createSecretSet", json!({"organizationId": org, "name": "shared"})).await.unwrap();
    w.call("secrets.attachSecretSet", json!({"serviceId": svc, "secretSetId": set["id"], "expectedSecretsRevision": 0})).await.unwrap();
    let service = w.call("services.get", json!({"id": svc})).await.unwrap();
    let deleted = w.call("services.delete", json!({"id": svc, "expectedRevision": service["revision"]})).await.unwrap();
    assert_eq!(deleted["state"], "deleted");
    let secret = w.call("secrets.get", json!({"id": first["id"]})).await.unwrap();
    assert_eq!(secret["state"], "revoked", "a deleted service's own secrets are revoked");
    let detail = w.call("secrets.getSecretSet", json!({"id": set["id"]})).await.unwrap();
    assert_eq!((detail["state"].as_str(), detail["attachedServiceIds"].clone()), (Some("active"), json!([])), "the set stays, detached");
    assert_eq!(w.call("secrets.previewResolution", json!({"serviceId": svc})).await.unwrap_err().code, "service-not-found");
}

#[tokio::test]
async fn a_pinned_version_opens_for_its_replica_while_the_secret_is_active_and_is_refused_by_name_once_revoked() {
    let w = World::new().await;
    let (_, _, db) = w.planted_db_password().await;
    let (id, version) = (db["id"].as_str().unwrap(), db["currentVersionId"].as_str().unwrap());
    let (store, keyring) = (&w.host.state.store, &w.host.state.keyring);
    let opened = crate::secrets::manifests::open_pinned(store, keyring, id, version).await.unwrap();
    assert_eq!(opened.as_slice(), PLANTED.as_bytes());
    w.call("secrets.revoke", json!({"id": id})).await.unwrap();
    let refused = crate::secrets::manifests::open_pinned(store, keyring, id, version).await.unwrap_err();
    assert_eq!(refused.code, "secret-manifest-not-accepted", "a replica admitted before the revocation is not handed it again");
    let gone = crate::secrets::manifests::open_pinned(store, keyring, "sec_00000000000000000000000000000000", version).await.unwrap_err();
    assert_eq!(gone.code, "secret-manifest-not-accepted");
}
