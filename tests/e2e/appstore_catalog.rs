//! A signed catalog served over HTTPS by a loopback source whose certificate a private CA
//! issued: fetched and activated only by a host started with that CA (`--plugin-http-ca-file`),
//! refused `http-tls-failed` by one without it. (The publisher's `capstan-catalog sign | verify`
//! are the catalog crate's own tests, plugins/appstore/catalog/tests/cli.rs: here the catalogs
//! are signed in-process with the same library.)

use crate::appstore::{envelope, wait_for_appstore};
use crate::support::{Capstan, Exited, HttpsTarget, TargetReply, capstan, dev_command, run_to_exit};
use capstan_catalog::{PublisherKey, SigningKey};
use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::PermissionsExt;

fn cli(args: &[&str]) -> Exited {
    let mut cmd = capstan();
    cmd.args(args);
    run_to_exit(cmd)
}

/// A loopback HTTPS source answering `body` (changeable) to every request, or 404 while it is
/// empty. Its certificate (for 127.0.0.1) is issued by a private CA made here; answers the
/// source's URL, the body and the CA certificate as PEM.
fn https_source() -> (String, HttpsTarget) {
    let target = HttpsTarget::start(&["127.0.0.1"], TargetReply::new(404, ""));
    (format!("https://{}/catalog.json", target.addr), target)
}

#[test]
fn a_catalog_source_behind_a_private_ca_is_trusted_only_with_the_plugin_http_ca_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    fs::set_permissions(root, fs::Permissions::from_mode(0o700)).unwrap();

    // ---- the publisher signs two revisions; the second is served over HTTPS ----
    let key = SigningKey::from_bytes(&[42; 32]);
    let public = PublisherKey::from(&key).to_string();
    let first = envelope(&["1.0.0"], 1, &key);
    let (url, source) = https_source();
    let mut catalog = TargetReply::new(200, &envelope(&["1.0.0", "1.1.0"], 2, &key));
    catalog.headers.push(("content-type".into(), "application/json".into()));
    source.answer(catalog);
    let ca_pem = source.ca_pem.clone();
    let ca_file = root.join("private-ca.pem");
    fs::write(&ca_file, ca_pem).unwrap();

    // ---- a host that trusts only the platform's roots refuses the source's certificate ----
    let data = root.join("data");
    let server = Capstan::dev(&data);
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let admin = server.login("admin", &password);
    wait_for_appstore(&server, &admin);
    let ok_call = |server: &Capstan, admin: &str, method: &str, body: Value| server.call_as(admin, method, &body).expect_json(200);
    let settings = ok_call(&server, &admin, "settings.get", json!({}));
    let set = json!({ "appstore.trustedCatalogKeys": [public], "appstore.catalogSources": [url] });
    ok_call(&server, &admin, "settings.update", json!({ "expectedRevision": settings["revision"], "set": set }));
    let imported = ok_call(&server, &admin, "appstore.importCatalog", json!({ "envelope": first }));
    assert_eq!(imported["outcome"], "activated");
    let status = ok_call(&server, &admin, "appstore.refreshCatalog", json!({}));
    let error = &status["loader"]["errors"][0];
    assert_eq!(
        (error["source"].as_str(), error["code"].as_str(), error["cause"].as_str()),
        (Some(url.as_str()), Some("http-tls-failed"), Some("certificate-unknown-issuer")),
        "{status}"
    );
    assert!(error["message"].as_str().unwrap().contains("CAPSTAN_PLUGIN_HTTP_CA_FILE"), "the refusal says what to do: {error}");
    assert_eq!(
        (status["loader"]["lastOutcome"].as_str(), status["active"]["revision"].as_u64()),
        (Some("failed"), Some(1)),
        "a failed fetch keeps the active catalog: {status}"
    );
    drop(server);

    // ---- the same host started with the private CA fetches and activates it ----
    let mut cmd = dev_command(&data);
    cmd.arg("--plugin-http-ca-file").arg(&ca_file);
    let server = Capstan::start(cmd);
    let admin = server.login("admin", &password);
    wait_for_appstore(&server, &admin);
    let status = ok_call(&server, &admin, "appstore.refreshCatalog", json!({}));
    assert_eq!(
        (status["active"]["revision"].as_u64(), status["active"]["source"].as_str(), status["loader"]["lastOutcome"].as_str()),
        (Some(2), Some(url.as_str()), Some("activated")),
        "{status}"
    );
    assert_eq!(status["loader"]["errors"], json!([]));
    let listed = ok_call(&server, &admin, "appstore.listApps", json!({}));
    assert_eq!((listed["apps"][0]["id"].as_str(), listed["apps"][0]["newestVersion"].as_str()), (Some("wiki"), Some("1.1.0")), "{listed}");
}

#[test]
fn a_plugin_http_ca_file_that_cannot_be_read_or_holds_no_certificate_refuses_the_start_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let data = root.join("data");
    let empty = root.join("empty.pem");
    fs::write(&empty, "# no certificate here\n").unwrap();
    for (file, says) in [(root.join("missing.pem"), "cannot be read"), (empty, "holds no certificate")] {
        let mut cmd = dev_command(&data);
        cmd.env("CAPSTAN_PLUGIN_HTTP_CA_FILE", &file);
        let exited = run_to_exit(cmd);
        let stderr = exited.assert_refused(2, "config-invalid");
        assert!(stderr.contains("CAPSTAN_PLUGIN_HTTP_CA_FILE") && stderr.contains(says), "{stderr}");
        assert!(!data.exists(), "a refused start opens and writes nothing");
    }
    let help = cli(&["serve", "--help"]);
    assert!(help.status.success(), "serve --help: {help:?}");
    assert!(help.stdout.contains("--plugin-http-ca-file") && help.stdout.contains("CAPSTAN_PLUGIN_HTTP_CA_FILE"), "{}", help.stdout);
}
