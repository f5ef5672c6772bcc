//! Re-wrapping secret versions under a rotated KEK, through the registry.

use crate::api::Call;
use crate::refusal::Result;
use crate::secrets::methods::*;
use crate::secrets::{envelope, ingress};
use crate::state::test_state;
use crate::store::Store;
use serde_json::{Value, json};
use std::sync::Arc;

const PLANTED: &str = "hunter2-planted-rewrap-value";

async fn call(state: &crate::state::AppState, admin: &crate::auth::Identity, method: &str, body: Value) -> Result<Value> {
    let m = state.methods.get(method).unwrap();
    let result = m.call(Call::by(admin), body).await;
    let shown = match &result {
        Ok(v) => v.to_string(),
        Err(e) => format!("{} {} {:?} {:?}", e.code, e.message, e.data, e.detail),
    };
    assert!(!shown.contains(PLANTED), "{method} showed the value: {shown}");
    result
}

async fn all_versions(store: &Store) -> Vec<(String, Version)> {
    store
        .transact(|tx| async move { tx.scan(VERSIONS, None, 1000).await })
        .await
        .unwrap()
        .documents
        .into_iter()
        .map(|d| (d.id, serde_json::from_value(d.data).unwrap()))
        .collect()
}

#[tokio::test]
async fn rewrap_moves_every_version_to_the_new_kek_in_resumable_pages_and_all_still_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut state = test_state(dir.path()).await;
    crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", "a-long-enough-admin-password").await.unwrap();
    let answer = state.auth.login("admin", "a-long-enough-admin-password", None).await.unwrap();
    let admin = state.auth.authenticate(&answer.token).await.unwrap();
    let org = call(&state, &admin, "organizations.create", json!({"name": "acme"})).await.unwrap();
    let svc = call(&state, &admin, "services.create", json!({"name": "web", "organizationId": org["id"], "image": "nginx"})).await.unwrap();
    let owner_ref = format!("service:{}", svc["id"].as_str().unwrap());
    let sealed = ingress::seal_to(
        state.keyring.ingress_id(),
        state.keyring.ingress_public_key(),
        &ingress::target("secrets.create", &owner_ref, "DB_PASSWORD"),
        PLANTED.as_bytes(),
    );
    let owner = json!({"kind": "service", "serviceId": svc["id"]});
    let db =
        call(&state, &admin, "secrets.create", json!({"owner": owner, "key": "DB_PASSWORD", "value": {"sealed": sealed}})).await.unwrap();
    let generate = json!({"generate": {"length": 24, "alphabet": "hex"}});
    let api = call(&state, &admin, "secrets.create", json!({"owner": owner, "key": "API_TOKEN", "value": generate})).await.unwrap();
    call(&state, &admin, "secrets.rotate", json!({"id": api["id"], "expectedVersionId": api["currentVersionId"], "value": generate}))
        .await
        .unwrap();
    let system = json!({"kind": "system", "systemId": "gateway"});
    let gateway =
        call(&state, &admin, "secrets.create", json!({"owner": system, "key": "GATEWAY_TOKEN", "value": generate})).await.unwrap();
    call(&state, &admin, "secrets.revoke", json!({"id": gateway["id"]})).await.unwrap();
    let old_kek = state.keyring.active_kek_id().to_string();
    let before = all_versions(&state.store).await;
    assert_eq!(before.len(), 4);
    assert!(before.iter().all(|(_, v)| v.envelope.kek_id == old_kek));

    // nothing to move while the sealing KEK is the active one
    let idle = call(&state, &admin, "secrets.rewrap", json!({})).await.unwrap();
    assert_eq!(idle, json!({"rewrapped": 0, "alreadyCurrent": 4, "activeKekId": old_kek, "nextCursor": null}));

    // the keyring rotates (as `capstan keyring rotate` and a restart do)
    let rotated = Arc::new(state.keyring.with_new_active_kek(Some("kek-rotated")).unwrap());
    state = state.with_keyring(rotated);
    assert_eq!(&**open_current(&state.store, &state.keyring, db["id"].as_str().unwrap()).await.unwrap(), PLANTED.as_bytes());

    // pages of 3: resumable by cursor until it is null
    let (mut cursor, mut rewrapped, mut pages) = (Value::Null, 0, 0);
    loop {
        let page = call(&state, &admin, "secrets.rewrap", json!({"cursor": cursor, "limit": 3})).await.unwrap();
        assert_eq!(page["activeKekId"], "kek-rotated");
        rewrapped += page["rewrapped"].as_u64().unwrap();
        pages += 1;
        cursor = page["nextCursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!((rewrapped, pages), (4, 2));

    let after = all_versions(&state.store).await;
    for ((id, old), (_, new)) in before.iter().zip(&after) {
        assert_eq!(new.envelope.kek_id, "kek-rotated", "{id}");
        assert_eq!(new.envelope.ciphertext, old.envelope.ciphertext, "the material itself is not touched");
        let doc = state.store.transact(|tx| async move { require_secret(&tx, &new.secret_id).await }).await.unwrap().1;
        let opened = envelope::open(&state.keyring, &material_context(&new.secret_id, id, &doc), &new.envelope).unwrap();
        let was = envelope::open(&state.keyring, &material_context(&old.secret_id, id, &doc), &old.envelope).unwrap();
        assert_eq!(opened, was, "{id} still opens to the same value");
    }
    assert_eq!(&**open_current(&state.store, &state.keyring, db["id"].as_str().unwrap()).await.unwrap(), PLANTED.as_bytes());
    let detail = call(&state, &admin, "secrets.get", json!({"id": api["id"]})).await.unwrap();
    assert!(detail["versionHistory"].as_array().unwrap().iter().all(|v| v["kekId"] == "kek-rotated"), "{detail}");

    // a second pass finds everything current and writes nothing
    let again = call(&state, &admin, "secrets.rewrap", json!({"limit": 500})).await.unwrap();
    assert_eq!((again["rewrapped"].as_u64(), again["alreadyCurrent"].as_u64()), (Some(0), Some(4)));
    for limit in [0, 501] {
        let err = call(&state, &admin, "secrets.rewrap", json!({"limit": limit})).await.unwrap_err();
        assert_eq!(err.code, "invalid-request");
    }
    let err = call(&state, &admin, "secrets.rewrap", json!({"extra": PLANTED})).await.unwrap_err();
    assert_eq!(err.code, "invalid-request");
}
