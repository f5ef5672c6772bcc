//! Cluster relays through the assembled host: `clusters.enableRelay` / `clusters.disableRelay`
//! with the relay zone setting, and the relay credential (`relays.*`) with its verification.

use crate::api::Call;
use crate::auth::Identity;
use crate::refusal::Refusal;
use crate::relays::credentials as relays;
use crate::state::{AppState, test_state};
use serde_json::{Value, json};

const PASSWORD: &str = "a-long-enough-admin-password";

struct World {
    _dir: tempfile::TempDir,
    state: AppState,
    admin: Identity,
    cluster: String,
}

impl World {
    async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let state = test_state(dir.path()).await;
        crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
        let answer = state.auth.login("admin", PASSWORD, None).await.unwrap();
        let admin = state.auth.authenticate(&answer.token).await.unwrap();
        let mut world = World { _dir: dir, state, admin, cluster: String::new() };
        world.cluster = world.ok("clusters.create", json!({"name": "prod"})).await["cluster"]["id"].as_str().unwrap().to_string();
        world
    }

    async fn call(&self, method: &str, body: Value) -> Result<Value, Refusal> {
        let m = self.state.methods.get(method).unwrap_or_else(|| panic!("{method} is registered"));
        m.call(Call::by(&self.admin), body).await
    }

    async fn ok(&self, method: &str, body: Value) -> Value {
        self.call(method, body.clone()).await.unwrap_or_else(|e| panic!("{method} {body}: {e}"))
    }

    async fn refused(&self, method: &str, body: Value, code: &str) -> Refusal {
        let err = self.call(method, body.clone()).await.expect_err(&format!("{method} {body} should be refused {code}"));
        assert_eq!(err.code, code, "{method} {body}: {err}");
        err
    }

    async fn revision(&self) -> u64 {
        self.ok("clusters.get", json!({"id": self.cluster})).await["revision"].as_u64().unwrap()
    }

    async fn set_zone(&self, zone: Value) -> Result<Value, Refusal> {
        let revision = self.ok("settings.get", json!({})).await["revision"].as_u64().unwrap();
        self.call("settings.update", json!({"expectedRevision": revision, "set": {"clusterRelayZone": zone}})).await
    }

    async fn events(&self, kind: &str) -> Vec<crate::events::Event> {
        let all = crate::events::read_after(&self.state.store, 0, 1000).await.unwrap();
        all.into_iter().filter(|e| e.kind == kind).collect()
    }

    /// The bearer the cluster's relay secret holds now, opened as the host opens it.
    async fn bearer(&self) -> Vec<u8> {
        let found = self.ok("secrets.list", json!({"owner": {"kind": "system", "systemId": relays::system_id(&self.cluster)}})).await;
        let items = found["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "one relay secret: {found}");
        assert_eq!(items[0]["key"], relays::SECRET_KEY);
        assert_eq!(items[0]["managementScope"], relays::scope(&self.cluster));
        let id = items[0]["id"].as_str().unwrap();
        crate::secrets::methods::open_current(&self.state.store, &self.state.keyring, id).await.unwrap().to_vec()
    }
}

#[tokio::test]
async fn enabling_a_relay_needs_the_zone_mints_its_origin_and_update_never_writes_it() {
    let w = World::new().await;
    let read = w.ok("clusters.get", json!({"id": w.cluster})).await;
    assert_eq!(read["relay"], json!({"enabled": false, "origin": null}), "off until enabled");

    let revision = w.revision().await;
    w.refused("clusters.enableRelay", json!({"id": w.cluster, "expectedRevision": revision}), "relay-zone-unset").await;

    // the zone is judged as a DNS zone
    for bad in [json!("Example.com"), json!("com"), json!("example.com."), json!("-a.example.com"), json!(7)] {
        assert_eq!(w.set_zone(bad.clone()).await.unwrap_err().code, "setting-invalid", "{bad}");
    }
    w.set_zone(json!("relays.example.com")).await.unwrap();

    w.refused("clusters.enableRelay", json!({"id": w.cluster, "expectedRevision": revision + 5}), "conflict").await;
    let enabled = w.ok("clusters.enableRelay", json!({"id": w.cluster, "expectedRevision": revision})).await;
    let label = w.cluster.replace('_', "-");
    let origin = format!("https://relay.{label}.relays.example.com:8443");
    assert_eq!(enabled["relay"], json!({"enabled": true, "origin": origin}));
    assert_eq!(w.ok("clusters.get", json!({"id": w.cluster})).await["relay"]["origin"], origin.as_str());
    let events = w.events("cluster.relayEnabled").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].subject, w.cluster);
    assert_eq!(events[0].data["origin"], origin.as_str());

    // an update carrying a relay key is refused by name, an echo of the served block included
    let revision = enabled["revision"].as_u64().unwrap();
    for relay in [enabled["relay"].clone(), json!({"enabled": false}), Value::Null] {
        let err = w
            .refused(
                "clusters.update",
                json!({"id": w.cluster, "expectedRevision": revision, "relay": relay}),
                "cluster-relay-not-writable",
            )
            .await;
        assert_eq!(err.data.as_deref().unwrap()["field"], "relay");
    }
    assert_eq!(w.revision().await, revision, "nothing was written");

    // a stale revision is refused; the current one disables
    w.refused("clusters.disableRelay", json!({"id": w.cluster, "expectedRevision": revision - 1}), "conflict").await;
    let disabled = w.ok("clusters.disableRelay", json!({"id": w.cluster, "expectedRevision": revision})).await;
    assert_eq!(disabled["relay"], json!({"enabled": false, "origin": null}));
    assert_eq!(w.events("cluster.relayDisabled").await.len(), 1);
    // disabling a disabled relay changes nothing
    let again = w.ok("clusters.disableRelay", json!({"id": w.cluster, "expectedRevision": disabled["revision"]})).await;
    assert_eq!(again["revision"], disabled["revision"]);
    w.refused("clusters.enableRelay", json!({"id": "cluster_missing", "expectedRevision": 1}), "cluster-not-found").await;
}

#[tokio::test]
async fn relay_credential_ensure_rotate_replay_and_verification() {
    let w = World::new().await;
    let get = w.ok("relays.getCredential", json!({"clusterId": w.cluster})).await;
    assert_eq!(get["credential"], Value::Null);
    w.refused(
        "relays.mutateCredential",
        json!({"clusterId": w.cluster, "action": "rotate", "expectedGeneration": 1, "mutationId": "r0"}),
        "relay-credential-absent",
    )
    .await;
    w.refused(
        "relays.mutateCredential",
        json!({"clusterId": "cluster_missing", "action": "ensure", "mutationId": "e0"}),
        "cluster-not-found",
    )
    .await;

    // ensure mints generation 1, and answers it again afterwards
    let minted = w.ok("relays.mutateCredential", json!({"clusterId": w.cluster, "action": "ensure", "mutationId": "e1"})).await;
    assert_eq!(minted["generation"], 1);
    assert_eq!(minted["replayed"], false);
    let first = w.bearer().await;
    assert_eq!(first.len(), 43);
    let text = minted.to_string();
    assert!(!text.contains(std::str::from_utf8(&first).unwrap()), "no answer carries the bearer");
    let ensured = w.ok("relays.mutateCredential", json!({"clusterId": w.cluster, "action": "ensure", "mutationId": "e2"})).await;
    assert_eq!(
        (ensured["id"].clone(), ensured["generation"].clone(), ensured["digest"].clone()),
        (minted["id"].clone(), json!(1), minted["digest"].clone())
    );
    assert_eq!(w.bearer().await, first, "ensure of an existing credential writes nothing");

    // verification: the current bearer is accepted with its generation; anything else is named
    let verified = relays::verify(&w.state.store, &w.cluster, &first).await.unwrap();
    assert_eq!(verified.credential.generation, 1);
    assert_eq!(verified.credential.digest, minted["digest"].as_str().unwrap());
    assert_eq!(relays::verify(&w.state.store, &w.cluster, b"not-the-bearer").await.unwrap_err().code, "relay-credential-invalid");
    assert_eq!(relays::verify(&w.state.store, "cluster_missing", &first).await.unwrap_err().code, "relay-credential-absent");

    // rotation requires the exact generation
    for stale in [json!(0), json!(2), Value::Null] {
        w.refused(
            "relays.mutateCredential",
            json!({"clusterId": w.cluster, "action": "rotate", "expectedGeneration": stale, "mutationId": format!("bad-{stale}")}),
            "relay-credential-generation-mismatch",
        )
        .await;
    }
    let rotate = json!({"clusterId": w.cluster, "action": "rotate", "expectedGeneration": 1, "mutationId": "rot-1"});
    let rotated = w.ok("relays.mutateCredential", rotate.clone()).await;
    assert_eq!(rotated["generation"], 2);
    assert_eq!(rotated["id"], minted["id"]);
    assert_ne!(rotated["digest"], minted["digest"]);
    let second = w.bearer().await;
    assert_ne!(second, first);

    // no overlap: the old generation is stale from the commit on
    let stale = relays::verify(&w.state.store, &w.cluster, &first).await.unwrap_err();
    assert_eq!(stale.code, "relay-credential-generation-stale");
    assert!(!format!("{stale} {:?}", stale.data).contains(std::str::from_utf8(&first).unwrap()));
    assert_eq!(relays::verify(&w.state.store, &w.cluster, &second).await.unwrap().credential.generation, 2);

    // an exact replay answers the recorded answer and renews nothing; the id over another body is refused
    let replayed = w.ok("relays.mutateCredential", rotate).await;
    assert_eq!(replayed["generation"], 2);
    assert_eq!(replayed["replayed"], true);
    assert_eq!(replayed["digest"], rotated["digest"]);
    assert_eq!(w.bearer().await, second);
    w.refused(
        "relays.mutateCredential",
        json!({"clusterId": w.cluster, "action": "rotate", "expectedGeneration": 2, "mutationId": "rot-1"}),
        "mutation-reused",
    )
    .await;

    let got = w.ok("relays.getCredential", json!({"clusterId": w.cluster})).await;
    assert_eq!(got["credential"]["generation"], 2);
    assert_eq!(got["credential"]["digest"], rotated["digest"]);
    assert_eq!(w.events("relay.credentialIssued").await.len(), 1);
    assert_eq!(w.events("relay.credentialRotated").await.len(), 1);

    // the export answers exactly the bearer the verification accepts, for the named generation only
    w.refused(
        "relays.exportAuthorization",
        json!({"clusterId": w.cluster, "expectedGeneration": 1}),
        "relay-credential-generation-mismatch",
    )
    .await;
    let exported = w.ok("relays.exportAuthorization", json!({"clusterId": w.cluster, "expectedGeneration": 2})).await;
    assert_eq!(exported["authorization"].as_str().unwrap().as_bytes(), second.as_slice());
    assert_eq!(exported["credential"]["generation"], 2);
    assert_eq!(w.events("relay.authorizationExported").await.len(), 1);
    for event in crate::events::read_after(&w.state.store, 0, 1000).await.unwrap() {
        let data = event.data.to_string();
        assert!(
            !data.contains(std::str::from_utf8(&second).unwrap()) && !data.contains(std::str::from_utf8(&first).unwrap()),
            "{}",
            event.kind
        );
    }
}

#[tokio::test]
async fn methods_list_the_relay_methods() {
    let w = World::new().await;
    for method in
        ["clusters.enableRelay", "clusters.disableRelay", "relays.mutateCredential", "relays.getCredential", "relays.exportAuthorization"]
    {
        assert!(w.state.methods.get(method).is_some(), "{method}");
    }
}
