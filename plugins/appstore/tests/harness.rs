//! The App Store plugin built for wasm32-wasip2 and run on an in-process host
//! (`capstan_sdk::testing`): catalogs signed here, imported and served from a loopback source,
//! refused by name while the active catalog stays, installs and upgrades through the inventory;
//! the chunks of superseded catalogs deleted once past their grace period.

use capstan_catalog::{Catalog, PublisherKey, SigningKey, sign};
use capstan_sdk::testing::TestHost;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

fn public(key: &SigningKey) -> String {
    PublisherKey::from(key).to_string()
}

fn version(v: &str, image: &str, level: &str) -> Value {
    json!({
        "version": v,
        "notes": format!("release {v}"),
        "template": {
            "image": image,
            "ports": [{ "port": 8080, "protocol": "http" }],
            "environment": { "LOG_LEVEL": level },
            "volumes": [{ "name": "data", "mountPath": "/var/lib/wiki" }]
        }
    })
}

/// A catalog with the app `wiki` in the given versions.
fn catalog(versions: Vec<Value>) -> Catalog {
    serde_json::from_value(json!({ "apps": [{ "id": "wiki", "name": "Wiki", "description": "A wiki.", "versions": versions }] })).unwrap()
}

fn envelope(catalog: &Catalog, revision: u64, key: &SigningKey) -> String {
    sign(catalog, revision, key).unwrap().to_json()
}

/// A loopback HTTP source answering `body` (changeable) to every request, or 404 when empty.
fn source() -> (String, Arc<Mutex<String>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/catalog.json", listener.local_addr().unwrap());
    let body = Arc::new(Mutex::new(String::new()));
    let served = body.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let body = served.lock().unwrap().clone();
            let status = if body.is_empty() { "404 Not Found" } else { "200 OK" };
            let _ = write!(stream, "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
        }
    });
    (url, body)
}

fn code(host: &TestHost, method: &str, body: Value) -> String {
    host.call(method, body).unwrap_err().code().to_string()
}

#[test]
fn catalogs_are_verified_before_use_kept_last_known_good_and_serve_installs_and_upgrades() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    let publisher = key(7);

    // ---- nothing active: exactly the catalog-bound methods are refused, retryable ----
    let status = host.call("getCatalogStatus", json!({})).unwrap();
    assert_eq!((status["available"].as_bool(), status["unavailable"]["code"].as_str()), (Some(false), Some("catalog-not-loaded")));
    let listed = host.call("listApps", json!({})).unwrap();
    assert_eq!((listed["apps"].as_array().unwrap().len(), listed["status"]["available"].as_bool()), (0, Some(false)));
    let unavailable = host.call("getAppConfig", json!({ "appId": "wiki" })).unwrap_err();
    assert_eq!((unavailable.code(), unavailable.is_retryable()), ("appstore-catalog-unavailable", true));
    assert_eq!(unavailable.data().unwrap()["cause"], "catalog-not-loaded");
    let org = host.create_organization("acme");
    assert_eq!(code(&host, "listUpgradeable", json!({ "organizationId": org })), "appstore-catalog-unavailable");
    assert!(host.reconcile(&[]).unwrap().contains("no-sources"), "without sources a pass has nothing to ask");

    // ---- import: only a trusted key activates ----
    let first = catalog(vec![version("1.0.0", "registry.example.com/wiki:1.0.0", "info")]);
    let one = envelope(&first, 1, &publisher);
    assert_eq!(code(&host, "importCatalog", json!({ "envelope": one })), "catalog-key-untrusted");
    host.set_settings(json!({ "appstore.trustedCatalogKeys": [public(&publisher)] }));
    let imported = host.call("importCatalog", json!({ "envelope": one })).unwrap();
    assert_eq!((imported["outcome"].as_str(), imported["revision"].as_u64()), (Some("activated"), Some(1)));
    assert_eq!(host.call("importCatalog", json!({ "envelope": one })).unwrap()["outcome"], "unchanged");

    // ---- every bad candidate is refused by name and the active catalog stays ----
    let mut tampered: Value = serde_json::from_str(&envelope(&first, 2, &publisher)).unwrap();
    tampered["revision"] = json!(3);
    let rewritten = catalog(vec![version("1.0.0", "registry.example.com/wiki:evil", "info")]);
    let removed = catalog(vec![version("2.0.0", "registry.example.com/wiki:2.0.0", "info")]);
    for (candidate, expected) in [
        (tampered.to_string(), "catalog-signature-invalid"),
        (envelope(&first, 2, &key(9)), "catalog-key-untrusted"),
        (envelope(&rewritten, 2, &publisher), "catalog-version-rewritten"),
        (envelope(&removed, 2, &publisher), "catalog-version-removed"),
        ("{\"not\": \"an envelope\"}".to_string(), "catalog-malformed"),
    ] {
        assert_eq!(code(&host, "importCatalog", json!({ "envelope": candidate })), expected);
    }
    let status = host.call("getCatalogStatus", json!({})).unwrap();
    assert_eq!((status["active"]["revision"].as_u64(), status["active"]["source"].as_str()), (Some(1), Some("import")));
    assert_eq!(status["active"]["signer"], public(&publisher));

    // ---- install creates a service with the version's snapshot ----
    let config = host.call("getAppConfig", json!({ "appId": "wiki" })).unwrap();
    assert_eq!(
        (config["version"].as_str(), config["template"]["image"].as_str()),
        (Some("1.0.0"), Some("registry.example.com/wiki:1.0.0"))
    );
    assert_eq!(code(&host, "getAppConfig", json!({ "appId": "nope" })), "appstore-app-not-found");
    assert_eq!(code(&host, "getAppConfig", json!({ "appId": "wiki", "version": "9.9.9" })), "appstore-version-not-found");
    let installed = host.call("install", json!({ "organizationId": org, "appId": "wiki", "name": "team-wiki" })).unwrap();
    let service_id = installed["id"].as_str().unwrap().to_string();
    let service = host.service(&service_id).unwrap();
    assert_eq!(
        (service["image"].as_str(), service["template"]["version"].as_str()),
        (Some("registry.example.com/wiki:1.0.0"), Some("1.0.0"))
    );
    assert_eq!(service["template"]["catalogRevision"], 1);
    assert!(host.service_specs().is_empty(), "no cluster named: created, not started");
    // the environment given goes over the version's own; the name defaults to the app's id
    let installed = host.call(
        "install",
        json!({ "organizationId": org, "appId": "wiki", "environment": ["DOMAIN=https://wiki.acme.example", "", "LANG=en=US"] }),
    );
    let service = host.service(installed.unwrap()["id"].as_str().unwrap()).unwrap();
    assert_eq!((service["name"].as_str(), service["environment"]["DOMAIN"].as_str()), (Some("wiki"), Some("https://wiki.acme.example")));
    assert_eq!(service["environment"]["LANG"], "en=US", "a value keeps every = after the first");
    let bad =
        host.call("install", json!({ "organizationId": org, "appId": "wiki", "name": "wiki-3", "environment": ["NO VALUE"] })).unwrap_err();
    assert_eq!((bad.code(), bad.data().unwrap()["field"].as_str()), ("invalid-request", Some("environment")));

    // ---- started on a cluster: refused by name before anything is created ----
    let cluster = host.create_cluster("edge");
    let start = |name: &str, cluster: &str, node: Option<&str>| {
        let mut body = json!({ "organizationId": org, "appId": "wiki", "name": name, "clusterId": cluster });
        if let Some(node) = node {
            body["nodeId"] = json!(node);
        }
        code(&host, "install", body)
    };
    assert_eq!(start("wiki-2", "cluster_nope", None), "cluster-not-found");
    assert_eq!(start("wiki-2", &cluster, Some("node_nope")), "node-not-in-cluster");
    let no_node = host.call("install", json!({ "organizationId": org, "appId": "wiki", "name": "wiki-2", "clusterId": cluster }));
    let refused = no_node.unwrap_err();
    assert_eq!(refused.code(), "appstore-node-required", "the wiki keeps data in volumes: one node, named");
    assert_eq!(refused.data().unwrap()["nodes"], json!([]), "{:?}", refused.message());
    assert_eq!(
        code(&host, "install", json!({ "organizationId": org, "appId": "wiki", "name": "wiki-2", "nodeId": "node_a" })),
        "invalid-request"
    );
    assert!(host.service_specs().is_empty(), "nothing refused was started");
    assert_eq!(host.call("listUpgradeable", json!({ "organizationId": org })).unwrap(), json!([]));

    // ---- a source serves a newer revision: the reconcile pass activates it ----
    let (url, served) = source();
    let second = catalog(vec![
        version("1.0.0", "registry.example.com/wiki:1.0.0", "info"),
        version("1.1.0", "registry.example.com/wiki:1.1.0", "debug"),
    ]);
    host.set_settings(json!({ "appstore.trustedCatalogKeys": [public(&publisher)], "appstore.catalogSources": [url] }));
    let failed = host.call("refreshCatalog", json!({})).unwrap();
    assert_eq!((failed["loader"]["lastOutcome"].as_str(), failed["loader"]["consecutiveFailures"].as_u64()), (Some("failed"), Some(1)));
    assert_eq!(failed["loader"]["errors"][0]["code"], "catalog-source-failed");
    assert_eq!(failed["active"]["revision"], 1, "a failed load keeps the active catalog");
    let backoff = failed["loader"]["nextAttemptAt"].as_u64().unwrap() - failed["loader"]["lastAttemptAt"].as_u64().unwrap();
    assert_eq!(backoff, 60_000, "the first retry is a minute later");
    *served.lock().unwrap() = envelope(&second, 2, &publisher);
    let refreshed = host.call("refreshCatalog", json!({})).unwrap();
    assert_eq!((refreshed["active"]["revision"].as_u64(), refreshed["loader"]["lastOutcome"].as_str()), (Some(2), Some("activated")));
    assert_eq!(refreshed["active"]["source"].as_str(), Some(url.as_str()));
    assert_eq!(refreshed["loader"]["consecutiveFailures"], 0);

    // ---- upgrade: preview, then write the new template and snapshot ----
    let upgradeable = host.call("listUpgradeable", json!({ "organizationId": org })).unwrap();
    assert_eq!(upgradeable[0]["available"], json!(["1.1.0"]));
    let request = json!({ "organizationId": org, "serviceId": service_id });
    let preview = host.call("getUpgradePreview", request.clone()).unwrap();
    assert_eq!((preview["from"].as_str(), preview["to"].as_str()), (Some("1.0.0"), Some("1.1.0")));
    assert_eq!(preview["environmentChanged"], json!(["LOG_LEVEL"]));
    assert_eq!(code(&host, "upgrade", request.clone()), "invalid-request", "an upgrade states the revision it read");
    let mut stale = request.clone();
    stale["expectedRevision"] = json!(99);
    assert_eq!(code(&host, "upgrade", stale), "conflict");
    let mut upgrade = request.clone();
    upgrade["expectedRevision"] = service["revision"].clone();
    let upgraded = host.call("upgrade", upgrade).unwrap();
    assert_eq!(upgraded["to"], "1.1.0");
    let service = host.service(&service_id).unwrap();
    assert_eq!(
        (service["image"].as_str(), service["template"]["version"].as_str()),
        (Some("registry.example.com/wiki:1.1.0"), Some("1.1.0"))
    );
    assert_eq!(service["environment"]["LOG_LEVEL"], "debug");
    assert_eq!(code(&host, "getUpgradePreview", request), "appstore-up-to-date");

    // ---- a lower revision from the source is refused and the active one stays ----
    *served.lock().unwrap() = envelope(&first, 1, &publisher);
    let stayed = host.call("refreshCatalog", json!({})).unwrap();
    assert_eq!(
        (stayed["active"]["revision"].as_u64(), stayed["loader"]["errors"][0]["code"].as_str()),
        (Some(2), Some("catalog-revision-not-newer"))
    );

    // ---- the stored catalog is verified again on every use: an untrusted key disables it ----
    let successor = key(11);
    host.set_settings(json!({ "appstore.trustedCatalogKeys": [public(&successor)] }));
    let status = host.call("getCatalogStatus", json!({})).unwrap();
    assert_eq!((status["available"].as_bool(), status["unavailable"]["code"].as_str()), (Some(false), Some("catalog-key-untrusted")));
    // even then the pointer never moves back to a lower revision
    assert_eq!(code(&host, "importCatalog", json!({ "envelope": envelope(&first, 1, &successor) })), "catalog-revision-not-newer");
    host.set_settings(json!({ "appstore.trustedCatalogKeys": [public(&publisher)] }));
    assert_eq!(host.call("getCatalogStatus", json!({})).unwrap()["active"]["revision"], 2, "restored from the store, no source needed");
}

/// The app `wiki` in versions 1.0.0 … 1.0.{count - 1}, each with 4000 bytes of release notes:
/// with 110 versions or more the envelope spans three chunks, and since a later revision only
/// adds versions at the end, the middle chunk of every such envelope is the same.
fn big_catalog(count: usize) -> Catalog {
    let versions = (0..count)
        .map(|i| {
            let mut v = version(&format!("1.0.{i}"), &format!("registry.example.com/wiki:1.0.{i}"), "info");
            let notes = format!("release 1.0.{i}: ");
            v["notes"] = json!(format!("{notes}{}", "n".repeat(4000 - notes.len())));
            v
        })
        .collect();
    catalog(versions)
}

fn chunk_names(host: &TestHost) -> BTreeSet<String> {
    host.documents("chunks").iter().map(|d| d["id"].as_str().unwrap().to_string()).collect()
}

/// The chunks the catalog pointer names.
fn pointed(host: &TestHost) -> BTreeSet<String> {
    let catalog = host.documents("catalog");
    let pointer = catalog.iter().find(|d| d["id"] == "pointer").expect("a catalog is active");
    pointer["chunks"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect()
}

fn stored_at(host: &TestHost, name: &str) -> Option<u64> {
    host.documents("chunks").iter().find(|d| d["id"] == name).and_then(|d| d["storedAt"].as_u64())
}

/// A chunk as another node stores it: named by the SHA-256 of its text.
fn put_chunk(host: &TestHost, text: &str, stored_at: Option<u64>) -> String {
    let name = hex::encode(Sha256::digest(text.as_bytes()));
    let mut data = json!({ "text": text });
    if let Some(at) = stored_at {
        data["storedAt"] = json!(at);
    }
    host.put_document("chunks", &name, data);
    name
}

#[test]
fn chunks_no_pointer_names_are_deleted_once_past_the_grace_period_and_fresh_ones_survive() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    let publisher = key(7);
    host.set_settings(json!({ "appstore.trustedCatalogKeys": [public(&publisher)] }));

    // ---- three imports: each leaves the chunks only its own envelope had behind ----
    let mut named = Vec::new();
    for revision in 1..=3u64 {
        let envelope = envelope(&big_catalog(100 + 10 * revision as usize), revision, &publisher);
        let imported = host.call("importCatalog", json!({ "envelope": envelope })).unwrap();
        assert_eq!(imported["outcome"], "activated");
        named.push(pointed(&host));
    }
    let current = named[2].clone();
    assert_eq!(current.len(), 3, "the envelope spans three chunks");
    assert!(named[0].intersection(&named[1]).count() >= 1, "revisions share their unchanged middle chunk");
    let stored = chunk_names(&host);
    assert!(stored.len() > current.len() + 2, "superseded catalogs left {} chunks behind", stored.len() - current.len());
    let started = host.clock_ms();
    for name in &stored {
        assert!(stored_at(&host, name).is_some_and(|at| at <= started), "every chunk carries the time it was stored");
    }

    // ---- within the grace period nothing is deleted; a chunk stored before stamps existed gets one ----
    let legacy = put_chunk(&host, "a chunk stored by an earlier build", None);
    let summary = host.reconcile(&[]).unwrap();
    assert!(summary.contains("catalog chunks: 0 deleted, 1 stamped"), "{summary}");
    assert_eq!(chunk_names(&host).len(), stored.len() + 1);
    assert!(stored_at(&host, &legacy).is_some());

    // ---- an hour later: only the current catalog's chunks remain, and one a node just stored ----
    host.advance_clock(Duration::from_secs(61 * 60));
    let fresh = put_chunk(&host, "a chunk another node stored for a catalog it is about to activate", Some(host.clock_ms()));
    let summary = host.reconcile(&[]).unwrap();
    let deleted = stored.len() - current.len() + 1;
    assert!(summary.contains(&format!("catalog chunks: {deleted} deleted, 0 stamped")), "{summary}");
    let mut expected = current.clone();
    expected.insert(fresh.clone());
    assert_eq!(chunk_names(&host), expected);
    let status = host.call("getCatalogStatus", json!({})).unwrap();
    assert_eq!((status["available"].as_bool(), status["active"]["revision"].as_u64()), (Some(true), Some(3)));
    assert_eq!(host.call("listApps", json!({})).unwrap()["apps"][0]["newestVersion"], "1.0.129");

    // a pass soon after decides nothing and writes nothing
    let revisions: Vec<Value> = host.documents("chunks").iter().map(|d| d["revision"].clone()).collect();
    assert!(!host.reconcile(&[]).unwrap().contains("catalog chunks"));
    assert_eq!(host.documents("chunks").iter().map(|d| d["revision"].clone()).collect::<Vec<_>>(), revisions);

    // ---- an activation reusing an old chunk claims it again before the pointer names it ----
    let before = host.clock_ms();
    let envelope = envelope(&big_catalog(140), 4, &publisher);
    assert_eq!(host.call("importCatalog", json!({ "envelope": envelope })).unwrap()["outcome"], "activated");
    let fourth = pointed(&host);
    let reused: Vec<&String> = fourth.intersection(&current).collect();
    assert!(!reused.is_empty(), "revision 4 reuses the middle chunk of revision 3");
    for name in &fourth {
        assert!(stored_at(&host, name).is_some_and(|at| at >= before), "chunk {name} was claimed by the activation");
    }

    // ---- the fresh chunk outlives a pass within its grace period, and not one after it ----
    host.advance_clock(Duration::from_secs(16 * 60));
    host.reconcile(&[]).unwrap();
    assert!(chunk_names(&host).contains(&fresh), "16 minutes old: kept");
    host.advance_clock(Duration::from_secs(45 * 60));
    host.reconcile(&[]).unwrap();
    assert_eq!(chunk_names(&host), fourth, "61 minutes old and named by no pointer: deleted, with revision 3's own");
    assert_eq!(host.call("getCatalogStatus", json!({})).unwrap()["active"]["revision"], 4);
}

#[test]
fn an_upgrade_reports_its_rollout_on_the_runtime_and_rolls_back_to_the_release_it_replaced() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    let publisher = key(7);
    host.set_settings(json!({ "appstore.trustedCatalogKeys": [public(&publisher)] }));
    let (d1, d2) = (format!("sha256:{}", "1".repeat(64)), format!("sha256:{}", "2".repeat(64)));
    let (v1, v2) = (format!("registry.example.com/wiki:1.0.0@{d1}"), format!("registry.example.com/wiki:1.1.0@{d2}"));
    let versions = catalog(vec![version("1.0.0", &v1, "info"), version("1.1.0", &v2, "debug")]);
    host.call("importCatalog", json!({ "envelope": envelope(&versions, 1, &publisher) })).unwrap();
    let org = host.create_organization("acme");
    let installed =
        host.call("install", json!({ "organizationId": org, "appId": "wiki", "version": "1.0.0", "name": "team-wiki" })).unwrap();
    let id = installed["id"].as_str().unwrap().to_string();
    let status = |host: &TestHost| host.call("getServiceUpgradeStatus", json!({ "organizationId": org, "serviceId": id })).unwrap();
    assert!(status(&host).get("upgrade").is_none(), "no upgrade yet: {}", status(&host));
    let refused = host.call("rollbackUpgrade", json!({ "organizationId": org, "serviceId": id, "expectedRevision": 1 })).unwrap_err();
    assert_eq!(refused.code(), "appstore-rollback-unavailable", "{refused:?}");

    // the upgrade's image on the runtime: unplaced here until the runtime says otherwise
    let revision = host.service(&id).unwrap()["revision"].as_u64().unwrap();
    let started =
        host.call("startServiceUpgrade", json!({ "organizationId": org, "serviceId": id, "expectedRevision": revision })).unwrap();
    let upgrade = &started["upgradeStatus"]["upgrade"];
    assert_eq!((upgrade["version"].as_str(), upgrade["rollbackTo"].as_str()), (Some("1.1.0"), Some("1.0.0")), "{started}");
    assert_eq!(upgrade["rollout"]["state"], "unplaced", "{started}");
    let failed = json!({ "state": "failed", "clusters": [{ "clusterId": "cluster_a", "state": "failed", "wanted": 2, "healthy": 1,
        "shortfall": [{ "slot": "node_b.0", "nodeId": "node_b", "state": "failed", "reason": "exited" }] }] });
    host.set_service_rollout(&id, &d2, failed.clone());
    assert_eq!(status(&host)["upgrade"]["rollout"], failed, "the runtime's judgement of the upgrade's digest, as it stands");
    // its clusters by name where the inventory knows them
    let cluster = host.create_cluster("edge");
    let mut named = failed.clone();
    named["clusters"][0]["clusterId"] = json!(cluster);
    host.set_service_rollout(&id, &d2, named);
    assert_eq!(status(&host)["upgrade"]["clusterNames"], json!({ cluster.clone(): "edge" }));

    // back to the release it replaced, fenced by the revision read
    let stale = host.call("rollbackUpgrade", json!({ "organizationId": org, "serviceId": id, "expectedRevision": revision })).unwrap_err();
    assert_eq!(stale.code(), "conflict", "{stale:?}");
    let revision = host.service(&id).unwrap()["revision"].as_u64().unwrap();
    let back = host.call("rollbackUpgrade", json!({ "organizationId": org, "serviceId": id, "expectedRevision": revision })).unwrap();
    assert_eq!((back["state"].as_str(), back["from"].as_str(), back["to"].as_str()), (Some("rolled-back"), Some("1.1.0"), Some("1.0.0")));
    let service = host.service(&id).unwrap();
    assert_eq!(
        (service["image"].as_str(), service["template"]["version"].as_str(), service["environment"]["LOG_LEVEL"].as_str()),
        (Some(v1.as_str()), Some("1.0.0"), Some("info")),
        "the release before the upgrade, whole"
    );
    let after = status(&host);
    assert!(after.get("upgrade").is_none(), "nothing left to roll back: {after}");
    assert_eq!(after["status"], "available", "1.1.0 is offered again: {after}");
    let again = host.call("rollbackUpgrade", json!({ "organizationId": org, "serviceId": id, "expectedRevision": back["revision"] }));
    assert_eq!(again.unwrap_err().code(), "appstore-rollback-unavailable");
}

#[test]
fn an_upgrade_to_a_tag_reports_the_rollout_of_the_digest_the_runtime_resolved_it_to() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    let publisher = key(7);
    host.set_settings(json!({ "appstore.trustedCatalogKeys": [public(&publisher)] }));
    let versions = catalog(vec![
        version("1.0.0", "registry.example.com/wiki:1.0.0", "info"),
        version("1.1.0", "registry.example.com/wiki:1.1.0", "debug"),
    ]);
    host.call("importCatalog", json!({ "envelope": envelope(&versions, 1, &publisher) })).unwrap();
    let org = host.create_organization("acme");
    let installed =
        host.call("install", json!({ "organizationId": org, "appId": "wiki", "version": "1.0.0", "name": "team-wiki" })).unwrap();
    let id = installed["id"].as_str().unwrap().to_string();
    let revision = host.service(&id).unwrap()["revision"].as_u64().unwrap();
    let started =
        host.call("startServiceUpgrade", json!({ "organizationId": org, "serviceId": id, "expectedRevision": revision })).unwrap();
    // the tag is not resolved yet: no digest, so no rollout to judge
    assert_eq!(started["upgradeStatus"]["upgrade"]["rollout"], Value::Null, "{started}");
    // once the runtime resolved the tag, its digest's rollout is the upgrade's
    let digest = format!("sha256:{}", "3".repeat(64));
    host.set_service_image_digest(&id, &digest);
    let healthy = json!({ "state": "healthy", "clusters": [{ "clusterId": "cluster_a", "state": "healthy", "wanted": 1, "healthy": 1, "shortfall": [] }] });
    host.set_service_rollout(&id, &digest, healthy.clone());
    let status = host.call("getServiceUpgradeStatus", json!({ "organizationId": org, "serviceId": id })).unwrap();
    assert_eq!(status["upgrade"]["rollout"], healthy, "{status}");
}

/// A Grafana-like version declaring single sign-on through Capstan (`platform-oidc`).
fn oidc_version(v: &str, roles: &[&str], capabilities: &[&str]) -> Value {
    json!({
        "version": v,
        "template": {
            "image": format!("registry.example.com/grafana:{v}"),
            "ports": [{ "port": 3000, "protocol": "http" }],
            "environment": { "GF_AUTH_GENERIC_OAUTH_ENABLED": "true" },
            "capabilities": capabilities,
            "platformOidc": {
                "roles": roles,
                "redirectPath": "/login/generic_oauth",
                "issuerVariable": "GF_AUTH_GENERIC_OAUTH_ISSUER",
                "clientIdVariable": "GF_AUTH_GENERIC_OAUTH_CLIENT_ID",
                "clientSecretVariable": "GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET"
            }
        }
    })
}

#[test]
fn a_version_declaring_platform_oidc_installs_and_upgrades_with_its_declaration_and_others_are_still_refused() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    let publisher = key(7);
    host.set_settings(json!({ "appstore.trustedCatalogKeys": [public(&publisher)] }));
    let oidc = ["platform-oidc"];
    let mut mailing = version("3.0.0", "registry.example.com/grafana:3.0.0", "info");
    mailing["template"]["capabilities"] = json!(["mail"]);
    let catalog: Catalog = serde_json::from_value(json!({ "apps": [
        { "id": "grafana", "name": "Grafana", "versions": [
            oidc_version("1.0.0", &["Admin", "Editor", "Viewer"], &oidc),
            oidc_version("1.1.0", &["Admin", "Editor", "Viewer"], &oidc),
            oidc_version("2.0.0", &["Admin", "Viewer"], &oidc),
            oidc_version("2.1.0", &["Admin", "Viewer"], &["mail", "platform-oidc"]),
            mailing
        ] }
    ] }))
    .unwrap();
    host.call("importCatalog", json!({ "envelope": envelope(&catalog, 1, &publisher) })).unwrap();
    let org = host.create_organization("acme");

    // ---- installed with the declaration in its snapshot ----
    let installed =
        host.call("install", json!({ "organizationId": org, "appId": "grafana", "version": "1.0.0", "name": "dashboards" })).unwrap();
    let id = installed["id"].as_str().unwrap().to_string();
    let service = host.service(&id).unwrap();
    let declared = &oidc_version("1.0.0", &["Admin", "Editor", "Viewer"], &oidc)["template"]["platformOidc"];
    assert_eq!(&service["template"]["template"]["platformOidc"], declared, "{service}");
    assert_eq!(service["template"]["template"]["capabilities"], json!(["platform-oidc"]));
    assert!(service["environment"].get("GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET").is_none(), "installing does not enable single sign-on");

    // ---- an upgrade keeping the declaration: no contract change ----
    let preview = host.call("getUpgradePreview", json!({ "organizationId": org, "serviceId": id, "version": "1.1.0" })).unwrap();
    assert_eq!(preview["oidcContractChanges"], false, "{preview}");
    let revision = service["revision"].clone();
    host.call("upgrade", json!({ "organizationId": org, "serviceId": id, "version": "1.1.0", "expectedRevision": revision })).unwrap();

    // ---- one changing it says so, and writes the new declaration ----
    let preview = host.call("getUpgradePreview", json!({ "organizationId": org, "serviceId": id, "version": "2.0.0" })).unwrap();
    assert_eq!(preview["oidcContractChanges"], true, "{preview}");
    let revision = host.service(&id).unwrap()["revision"].clone();
    host.call("upgrade", json!({ "organizationId": org, "serviceId": id, "version": "2.0.0", "expectedRevision": revision })).unwrap();
    let service = host.service(&id).unwrap();
    assert_eq!(service["template"]["template"]["platformOidc"]["roles"], json!(["Admin", "Viewer"]), "{service}");
    assert_eq!(service["template"]["version"], "2.0.0");

    // ---- any other capability is still refused, naming only the unsupported ones ----
    for (version, status_target) in [("2.1.0", "2.1.0"), ("3.0.0", "3.0.0")] {
        let refused =
            host.call("install", json!({ "organizationId": org, "appId": "grafana", "version": version, "name": "g2" })).unwrap_err();
        assert_eq!(refused.code(), "appstore-capability-unsupported", "{refused:?}");
        assert_eq!(refused.data().unwrap()["capabilities"], json!(["mail"]), "{refused:?}");
        assert!(refused.message().contains("requires mail, which no manager"), "{}", refused.message());
        let upgrade = host.call("getUpgradePreview", json!({ "organizationId": org, "serviceId": id, "version": status_target }));
        assert_eq!(upgrade.unwrap_err().code(), "appstore-capability-unsupported");
    }
    let status = host.call("getServiceUpgradeStatus", json!({ "organizationId": org, "serviceId": id })).unwrap();
    assert_eq!(status["status"], "blocked", "{status}");
    assert_eq!(status["blockers"][0]["code"], "appstore-capability-unsupported", "{status}");
}

#[test]
fn an_app_needing_a_database_installs_on_one_node_and_waits_for_its_bindings() {
    if capstan_sdk::testing::wasm_target_missing() {
        return;
    }
    let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
    let publisher = key(7);
    host.set_settings(json!({ "appstore.trustedCatalogKeys": [public(&publisher)] }));
    let mut wiki = version("1.0.0", "registry.example.com/wiki:1.0.0", "info");
    wiki["template"]["capabilities"] = json!(["database", "objectstorage"]);
    let catalog: Catalog = serde_json::from_value(json!({ "apps": [{ "id": "wiki", "name": "Wiki", "versions": [wiki] }] })).unwrap();
    host.call("importCatalog", json!({ "envelope": envelope(&catalog, 1, &publisher) })).unwrap();
    let org = host.create_organization("acme");

    // a cluster: the app keeps data in its node's database, so it runs on one node, named
    let cluster = host.create_cluster("edge");
    let everywhere = host.call("install", json!({ "organizationId": org, "appId": "wiki", "clusterId": cluster, "name": "w1" }));
    assert_eq!(everywhere.unwrap_err().code(), "appstore-node-required");

    // installed: its replicas are gated until its bindings are ready, the declaration in its snapshot
    let installed = host.call("install", json!({ "organizationId": org, "appId": "wiki", "name": "w2" })).unwrap();
    assert_eq!(installed["waitsFor"], json!(["database", "objectstorage"]), "{installed}");
    let id = installed["id"].as_str().unwrap().to_string();
    assert_eq!(host.service_gate(&id).as_deref(), Some("bindings-pending"));
    assert_eq!(host.service(&id).unwrap()["template"]["template"]["capabilities"], json!(["database", "objectstorage"]));
    // no bindings manager has said they are ready: the gate stays
    host.reconcile(&[]).unwrap();
    assert_eq!(host.service_gate(&id).as_deref(), Some("bindings-pending"));
    assert_eq!(host.documents("awaiting").len(), 1);
}
