//! The App Store's catalog from an npm registry: a real one (verdaccio in CI, see .ci/peers.sh)
//! to which this test publishes the catalog package with `npm publish`; the host reads the
//! packument, takes the tarball, checks its integrity and activates the envelope inside, pinned
//! to a version or following the `latest` tag. Skipped, saying so, when
//! `CAPSTAN_TEST_NPM_REGISTRY` is not set.

use crate::appstore::{envelope, wait_for_appstore};
use crate::support::Capstan;
use capstan_catalog::{PublisherKey, SigningKey};
use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn registry() -> Option<String> {
    match std::env::var("CAPSTAN_TEST_NPM_REGISTRY") {
        Ok(url) if !url.trim().is_empty() => Some(url.trim().to_string()),
        _ => {
            eprintln!("skipped: CAPSTAN_TEST_NPM_REGISTRY is not set (an npm registry such as verdaccio; .ci/peers.sh starts one)");
            None
        }
    }
}

/// `npm publish` of a package `name@version` holding `catalog.json`, as a publisher would.
fn publish(root: &Path, registry: &str, name: &str, version: &str, envelope: &str) {
    let dir = root.join(format!("package-{version}"));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("package.json"), json!({ "name": name, "version": version, "files": ["catalog.json"] }).to_string()).unwrap();
    fs::write(dir.join("catalog.json"), envelope).unwrap();
    // the registry takes anonymous publishes; npm still wants a token to send
    let host = registry.split_once("://").map(|(_, rest)| rest).unwrap_or(registry).trim_end_matches('/');
    let npmrc = root.join("npmrc");
    fs::write(&npmrc, format!("//{host}/:_authToken=capstan-e2e-anonymous\n")).unwrap();
    let out = Command::new("npm")
        .args(["publish", "--registry", registry, "--userconfig"])
        .arg(&npmrc)
        .arg("--cache")
        .arg(root.join("npm-cache"))
        .current_dir(&dir)
        .output()
        .expect("npm is on PATH where CAPSTAN_TEST_NPM_REGISTRY is set");
    assert!(
        out.status.success(),
        "npm publish {name}@{version}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_catalog_package_published_to_an_npm_registry_is_fetched_checked_and_activated() {
    let Some(registry) = registry() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    fs::set_permissions(root, fs::Permissions::from_mode(0o700)).unwrap();

    // ---- the publisher publishes two revisions of the catalog package ----
    let key = SigningKey::from_bytes(&[42; 32]);
    let package = format!("capstan-e2e-catalog-{:016x}", rand::random::<u64>());
    publish(root, &registry, &package, "1.0.0", &envelope(&["1.0.0"], 1, &key));
    publish(root, &registry, &package, "1.1.0", &envelope(&["1.0.0", "1.1.0"], 2, &key));

    let server = Capstan::dev(&root.join("data"));
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let admin = server.login("admin", &password);
    let plugin = wait_for_appstore(&server, &admin);
    assert!(plugin["grants"].as_array().unwrap().contains(&json!("http-setting:appstore.catalogRegistries")), "{plugin}");
    let ok = |method: &str, body: Value| server.call_as(&admin, method, &body).expect_json(200);
    let set = |values: Value| {
        let settings = ok("settings.get", json!({}));
        ok("settings.update", json!({ "expectedRevision": settings["revision"], "set": values }));
    };
    set(json!({ "appstore.trustedCatalogKeys": [PublisherKey::from(&key).to_string()], "appstore.catalogRegistries": [registry] }));

    // ---- a package the registry does not hold is a named failure of that registry ----
    set(json!({ "appstore.catalogPackage": format!("{package}-missing") }));
    let status = ok("appstore.refreshCatalog", json!({}));
    let error = &status["loader"]["errors"][0];
    assert_eq!(
        (error["source"].as_str(), error["code"].as_str(), status["available"].as_bool()),
        (Some(registry.as_str()), Some("catalog-package-not-found"), Some(false)),
        "{status}"
    );

    // ---- pinned to a version: that version's envelope ----
    set(json!({ "appstore.catalogPackage": format!("{package}@1.0.0") }));
    let status = ok("appstore.refreshCatalog", json!({}));
    assert_eq!((status["active"]["revision"].as_u64(), status["loader"]["lastOutcome"].as_str()), (Some(1), Some("activated")), "{status}");
    assert_eq!(status["active"]["source"], format!("{registry} {package}@1.0.0"));
    assert_eq!(
        (status["registries"][0].as_str(), status["package"].as_str()),
        (Some(registry.as_str()), Some(format!("{package}@1.0.0").as_str()))
    );

    // ---- unpinned: the latest tag, the newer revision ----
    set(json!({ "appstore.catalogPackage": package }));
    let status = ok("appstore.refreshCatalog", json!({}));
    assert_eq!(status["active"]["revision"].as_u64(), Some(2), "{status}");
    assert_eq!(status["loader"]["errors"], json!([]));
    let listed = ok("appstore.listApps", json!({}));
    assert_eq!((listed["apps"][0]["id"].as_str(), listed["apps"][0]["newestVersion"].as_str()), (Some("wiki"), Some("1.1.0")), "{listed}");

    // ---- a registry setting that is not a URL is refused by the setting's schema ----
    let settings = ok("settings.get", json!({}));
    server
        .call_as(
            &admin,
            "settings.update",
            &json!({ "expectedRevision": settings["revision"], "set": { "appstore.catalogRegistries": ["ftp://x"] } }),
        )
        .expect_error(400, "setting-invalid");
}
