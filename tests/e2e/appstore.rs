//! The App Store plugin end to end, as it ships: embedded in the real binary, installed at the
//! first start as first-party, its catalog imported and refused over HTTP, an app installed and
//! upgraded through the API, a service that names an app version adopted into its snapshot, and
//! the last-known-good catalog restored after a restart with no source reachable.

use crate::support::*;
use capstan_catalog::{Catalog, PublisherKey, SigningKey, sign};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;

fn catalog(versions: &[&str]) -> Catalog {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| {
            json!({
                "version": v,
                "template": {
                    "image": format!("registry.example.com/wiki:{v}"),
                    "ports": [{ "port": 8080, "protocol": "http" }],
                    "environment": { "WIKI_VERSION": v },
                    "volumes": [{ "name": "data", "mountPath": "/var/lib/wiki" }]
                }
            })
        })
        .collect();
    serde_json::from_value(json!({ "apps": [{ "id": "wiki", "name": "Wiki", "versions": versions }] })).unwrap()
}

pub fn envelope(versions: &[&str], revision: u64, key: &SigningKey) -> String {
    sign(&catalog(versions), revision, key).unwrap().to_json()
}

/// The App Store plugin once it is installed and loaded here (the first start compiles it in the
/// background; another node of the fleet loads it from the shared registry).
pub fn wait_for_appstore(server: &Capstan, admin: &str) -> Value {
    // a generous bound: on a busy 2-core machine compiling the plugin alone can take a minute
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    loop {
        let reply = server.call_as(admin, "plugins.get", &json!({ "id": "appstore" }));
        if reply.status == 200 && reply.json()["status"] == "running" {
            return reply.json();
        }
        assert!(std::time::Instant::now() < deadline, "the App Store was not installed within 180 s: {}", reply.body);
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

#[test]
fn the_embedded_app_store_imports_installs_upgrades_adopts_and_restores_its_catalog_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = dir.path().join("data");
    let server = Capstan::dev(&data);
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let admin = server.login("admin", &password);
    let ok = |server: &Capstan, method: &str, body: Value| server.call_as(&admin, method, &body).expect_json(200);

    // shipped inside the binary, installed in the background of the first start with what it declares
    let plugin = wait_for_appstore(&server, &admin);
    assert_eq!(
        (plugin["publisher"].as_str(), plugin["status"].as_str(), plugin["installedBy"].as_str()),
        (Some("first-party"), Some("running"), Some("capstan"))
    );
    assert!(plugin["grants"].as_array().unwrap().contains(&json!("http-setting:appstore.catalogSources")), "{plugin}");
    server.call_as(&admin, "plugins.uninstall", &json!({ "id": "appstore" })).expect_error(400, "plugin-first-party");

    // no catalog yet: the status says why, the catalog-bound methods are refused (retryable)
    let status = ok(&server, "appstore.getCatalogStatus", json!({}));
    assert_eq!(status["available"], false);
    let refused =
        server.call_as(&admin, "appstore.getAppConfig", &json!({ "appId": "wiki" })).expect_error(503, "appstore-catalog-unavailable");
    assert_eq!((refused["retryable"].as_bool(), refused["data"]["cause"].as_str()), (Some(true), Some("catalog-not-loaded")));

    // an operator-carried envelope, signed by a key the operator trusts
    let publisher = SigningKey::from_bytes(&[42; 32]);
    let settings = ok(&server, "settings.get", json!({}));
    ok(
        &server,
        "settings.update",
        json!({ "expectedRevision": settings["revision"], "set": { "appstore.trustedCatalogKeys": [PublisherKey::from(&publisher).to_string()] } }),
    );
    let imported = ok(&server, "appstore.importCatalog", json!({ "envelope": envelope(&["1.0.0"], 1, &publisher) }));
    assert_eq!(imported["outcome"], "activated");
    let untrusted = envelope(&["1.0.0", "1.1.0"], 2, &SigningKey::from_bytes(&[7; 32]));
    server.call_as(&admin, "appstore.importCatalog", &json!({ "envelope": untrusted })).expect_error(400, "catalog-key-untrusted");
    let rewritten = sign(&catalog(&["1.0.0"]), 2, &publisher).unwrap();
    let mut tampered: Value = serde_json::from_str(&rewritten.to_json()).unwrap();
    tampered["revision"] = json!(5);
    server
        .call_as(&admin, "appstore.importCatalog", &json!({ "envelope": tampered.to_string() }))
        .expect_error(400, "catalog-signature-invalid");

    // install through the API: a service with the version's snapshot
    let org = ok(&server, "organizations.create", json!({ "name": "acme" }));
    let installed = ok(&server, "appstore.install", json!({ "organizationId": org["id"], "appId": "wiki", "name": "team-wiki" }));
    let service = ok(&server, "services.get", json!({ "id": installed["id"] }));
    assert_eq!(
        (service["image"].as_str(), service["template"]["version"].as_str()),
        (Some("registry.example.com/wiki:1.0.0"), Some("1.0.0"))
    );

    // a service written naming an app version gets its snapshot at the next activation
    let named = ok(
        &server,
        "services.create",
        json!({ "name": "other-wiki", "organizationId": org["id"], "image": "registry.example.com/wiki:1.0.0", "template": { "appId": "wiki", "version": "1.0.0" } }),
    );
    ok(&server, "appstore.importCatalog", json!({ "envelope": envelope(&["1.0.0", "1.1.0"], 2, &publisher) }));
    let adopted = ok(&server, "services.get", json!({ "id": named["id"] }));
    assert!(adopted["template"]["templateDigest"].is_string(), "{adopted}");

    // upgrade through the API, stating the revision read
    let upgradeable = ok(&server, "appstore.listUpgradeable", json!({ "organizationId": org["id"] }));
    assert_eq!(upgradeable.as_array().unwrap().len(), 2, "{upgradeable}");
    let upgrade = json!({ "organizationId": org["id"], "serviceId": installed["id"], "expectedRevision": service["revision"] });
    assert_eq!(ok(&server, "appstore.upgrade", upgrade.clone())["to"], "1.1.0");
    let service = ok(&server, "services.get", json!({ "id": installed["id"] }));
    assert_eq!(
        (service["image"].as_str(), service["environment"]["WIKI_VERSION"].as_str()),
        (Some("registry.example.com/wiki:1.1.0"), Some("1.1.0"))
    );
    server.call_as(&admin, "appstore.upgrade", &upgrade).expect_error(400, "appstore-up-to-date");

    // a hosted app's upgrade status, derived on read; startServiceUpgrade starts the upgrade
    let status_of = |id: &Value| ok(&server, "appstore.getServiceUpgradeStatus", json!({ "organizationId": org["id"], "serviceId": id }));
    let status = status_of(&installed["id"]);
    assert_eq!((status["status"].as_str(), status["currentVersion"].as_str()), (Some("up-to-date"), Some("1.1.0")), "{status}");
    let status = status_of(&named["id"]);
    assert_eq!(
        (status["status"].as_str(), status["targetVersion"].as_str(), status["available"].clone()),
        (Some("available"), Some("1.1.0"), json!(["1.1.0"])),
        "{status}"
    );
    let start = json!({ "organizationId": org["id"], "serviceId": named["id"], "expectedRevision": status["serviceRevision"] });
    let started = ok(&server, "appstore.startServiceUpgrade", start.clone());
    assert_eq!(
        (started["state"].as_str(), started["from"].as_str(), started["to"].as_str(), started["upgradeStatus"]["status"].as_str()),
        (Some("started"), Some("1.0.0"), Some("1.1.0"), Some("up-to-date")),
        "{started}"
    );
    assert_eq!(ok(&server, "services.get", json!({ "id": named["id"] }))["image"], "registry.example.com/wiki:1.1.0");
    // started again: nothing newer is offered
    server.call_as(&admin, "appstore.startServiceUpgrade", &start).expect_error(400, "appstore-up-to-date");
    let plain =
        ok(&server, "services.create", json!({ "name": "plain", "organizationId": org["id"], "image": "registry.example.com/plain:1" }));
    assert_eq!(status_of(&plain["id"])["status"], "not-from-catalog");

    // no catalog usable (its key is no longer trusted): the status is unknown with that reason
    // as its blocker, and starting an upgrade is refused until a catalog is active again
    let settings = ok(&server, "settings.get", json!({}));
    ok(&server, "settings.update", json!({ "expectedRevision": settings["revision"], "set": { "appstore.trustedCatalogKeys": [] } }));
    let status = status_of(&installed["id"]);
    assert_eq!(
        (status["status"].as_str(), status["blockers"][0]["code"].as_str(), status["blockers"][0]["cause"].as_str()),
        (Some("unknown"), Some("appstore-catalog-unavailable"), Some("catalog-key-untrusted")),
        "{status}"
    );
    let start = json!({ "organizationId": org["id"], "serviceId": installed["id"], "expectedRevision": status["serviceRevision"] });
    let refused = server.call_as(&admin, "appstore.startServiceUpgrade", &start).expect_error(503, "appstore-catalog-unavailable");
    assert_eq!(refused["data"]["cause"], "catalog-key-untrusted");
    let settings = ok(&server, "settings.get", json!({}));
    ok(
        &server,
        "settings.update",
        json!({ "expectedRevision": settings["revision"], "set": { "appstore.trustedCatalogKeys": [PublisherKey::from(&publisher).to_string()] } }),
    );
    drop(server);

    // a restart restores the last-known-good catalog from the store, no source needed
    let server = Capstan::dev(&data);
    let admin = server.login("admin", &password);
    let status = server.call_as(&admin, "appstore.getCatalogStatus", &json!({})).expect_json(200);
    assert_eq!((status["available"].as_bool(), status["active"]["revision"].as_u64()), (Some(true), Some(2)));
    let apps = server.call_as(&admin, "appstore.listApps", &json!({})).expect_json(200);
    assert_eq!(apps["apps"][0]["versions"], json!(["1.1.0", "1.0.0"]));
}

#[test]
fn two_hosts_on_one_store_converge_on_the_greater_catalog_revision() {
    let dir = tempfile::tempdir().unwrap();
    let prod = ProdConfig::under(dir.path());
    let password = "a-long-enough-admin-password-for-two-hosts";
    let start = |node: &str| {
        let mut cmd = prod.command();
        cmd.env("CAPSTAN_STATE_DIR", dir.path().join(format!("state-{node}"))).env("CAPSTAN_ADMIN_ACCOUNT", format!("root:{password}"));
        Capstan::start(cmd)
    };
    let (a, b) = (start("a"), start("b"));
    let (token_a, token_b) = (a.login("root", password), b.login("root", password));
    wait_for_appstore(&a, &token_a);
    wait_for_appstore(&b, &token_b);

    let publisher = SigningKey::from_bytes(&[42; 32]);
    let settings = a.call_as(&token_a, "settings.get", &json!({})).expect_json(200);
    let trust = json!({ "expectedRevision": settings["revision"], "set": { "appstore.trustedCatalogKeys": [PublisherKey::from(&publisher).to_string()] } });
    a.call_as(&token_a, "settings.update", &trust).expect_json(200);
    let import =
        |server: &Capstan, token: &str, envelope: String| server.call_as(token, "appstore.importCatalog", &json!({ "envelope": envelope }));
    let revision = |server: &Capstan, token: &str| {
        server.call_as(token, "appstore.getCatalogStatus", &json!({})).expect_json(200)["active"]["revision"].as_u64()
    };

    // what one host activates, the other uses: the last-known-good lives in the shared store
    assert_eq!(import(&a, &token_a, envelope(&["1.0.0"], 1, &publisher)).expect_json(200)["outcome"], "activated");
    assert_eq!(revision(&b, &token_b), Some(1));
    assert_eq!(import(&b, &token_b, envelope(&["1.0.0", "1.1.0"], 2, &publisher)).expect_json(200)["outcome"], "activated");
    assert_eq!(revision(&a, &token_a), Some(2));
    // the older revision, arriving late at the other host, does not move the pointer back
    import(&a, &token_a, envelope(&["1.0.0"], 1, &publisher)).expect_error(400, "catalog-revision-not-newer");
    assert_eq!((revision(&a, &token_a), revision(&b, &token_b)), (Some(2), Some(2)));
}
