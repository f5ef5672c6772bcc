//! The catalog publisher's path through the real binary: `capstan plugin keygen`, `capstan
//! appstore sign-catalog` from a directory of app definitions, `verify-catalog` with the right
//! key, another key, tampered files and against the catalog it should succeed — each refusal by
//! its code. Then a catalog signed so, served over HTTPS by a loopback source whose certificate
//! a private CA issued: fetched and activated only by a host started with that CA
//! (`--plugin-http-ca-file`), refused `http-tls-failed` by one without it.

use crate::appstore::wait_for_appstore;
use crate::support::{Capstan, Exited, capstan, dev_command, run_to_exit};
use serde_json::{Value, json};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

const WIKI: &str = r#"
id = "wiki"
name = "Wiki"
description = "A small wiki."

[[versions]]
version = "1.0.0"
[versions.template]
image = "registry.example.com/wiki:1.0.0"
ports = [{ port = 8080, protocol = "http" }]
volumes = [{ name = "data", mountPath = "/var/lib/wiki" }]

[[versions]]
version = "1.1.0"
[versions.template]
image = "registry.example.com/wiki:1.1.0"
ports = [{ port = 8080, protocol = "http" }]
volumes = [{ name = "data", mountPath = "/var/lib/wiki" }]
capabilities = ["mail"]
[versions.template.environment]
LOG_LEVEL = "info"
"#;

const CHAT: &str = r#"
id = "chat"
name = "Chat"

[[versions]]
version = "2.0.0"
[versions.template]
image = "ghcr.io/acme/chat:2.0.0"
ports = [{ port = 5222, protocol = "tcp", publicPort = 5222 }]
"#;

fn cli(args: &[&str]) -> Exited {
    let mut cmd = capstan();
    cmd.args(args);
    run_to_exit(cmd)
}

fn ok(what: &str, exited: &Exited) {
    assert!(
        exited.status.success(),
        "{what} should succeed, got {:?}\nstdout:\n{}\nstderr:\n{}",
        exited.status,
        exited.stdout,
        exited.stderr
    );
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn keygen(path: &Path) -> String {
    let exited = cli(&["plugin", "keygen", "--output", p(path)]);
    ok("capstan plugin keygen", &exited);
    let key = exited.stdout.trim().to_string();
    assert!(key.starts_with("capstan-ed25519:"), "{key}");
    key
}

/// `path` with `from` replaced by `to` (once), written to `out`.
fn edited(path: &Path, out: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from:?} not in {text}");
    fs::write(out, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn a_publisher_signs_a_catalog_and_a_reader_verifies_it_or_refuses_it_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    fs::set_permissions(root, fs::Permissions::from_mode(0o700)).unwrap();
    let (key, other_key) = (root.join("catalog.pem"), root.join("other.pem"));
    let public = keygen(&key);
    let other = keygen(&other_key);
    let apps = root.join("apps");
    fs::create_dir(&apps).unwrap();
    fs::write(apps.join("wiki.toml"), WIKI).unwrap();
    fs::write(apps.join("chat.toml"), CHAT).unwrap();
    fs::write(apps.join("README.md"), "not a definition").unwrap();

    // ---- sign ----
    let first = root.join("catalog-1.json");
    let signed = cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "1", "--output", p(&first)]);
    ok("sign-catalog", &signed);
    let envelope: Value = serde_json::from_str(&fs::read_to_string(&first).unwrap()).unwrap();
    let digest = envelope["digest"].as_str().unwrap();
    for printed in [p(&first), "revision: 1", digest, public.as_str(), "2 (3 versions, 0 withdrawn)"] {
        assert!(signed.stdout.contains(printed), "sign-catalog prints {printed:?}:\n{}", signed.stdout);
    }
    assert_eq!((envelope["format"].as_str(), envelope["contract"].as_u64()), (Some("capstan-catalog"), Some(1)));
    assert_eq!(envelope["publicKey"].as_str(), Some(public.as_str()));
    assert_eq!(fs::metadata(&first).unwrap().permissions().mode() & 0o777, 0o644, "a catalog is public");

    // a revision is published once: the output is never replaced
    let again = cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "1", "--output", p(&first)]);
    again.assert_refused(1, "output-exists");

    // ---- verify ----
    let verified = cli(&["appstore", "verify-catalog", p(&first), "--trust", &other, "--trust", &public]);
    ok("verify-catalog with the signing key trusted", &verified);
    for shown in ["revision 1", digest, public.as_str(), "wiki", "Wiki", "1.1.0", "chat", "2.0.0"] {
        assert!(verified.stdout.contains(shown), "verify-catalog shows {shown:?}:\n{}", verified.stdout);
    }
    let as_json = cli(&["appstore", "verify-catalog", p(&first), "--trust", &public, "--json"]);
    ok("verify-catalog --json", &as_json);
    let answer: Value = serde_json::from_str(&as_json.stdout).unwrap();
    assert_eq!((answer["ok"].as_bool(), answer["revision"].as_u64(), answer["digest"].as_str()), (Some(true), Some(1), Some(digest)));
    let ids: Vec<_> = answer["apps"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["chat", "wiki"], "apps in file-name order");
    assert_eq!(answer["apps"][1]["newest"], "1.1.0");

    cli(&["appstore", "verify-catalog", p(&first), "--trust", &other]).assert_refused(1, "catalog-key-untrusted");
    let refused = cli(&["appstore", "verify-catalog", p(&first), "--trust", &other, "--json"]);
    let answer: Value = serde_json::from_str(&refused.stdout).unwrap();
    assert_eq!((answer["ok"].as_bool(), answer["error"]["code"].as_str()), (Some(false), Some("catalog-key-untrusted")));
    assert_eq!(answer["error"]["data"]["publicKey"].as_str(), Some(public.as_str()));

    // ---- tampered copies, each refused by name ----
    let tampered = root.join("tampered.json");
    edited(&first, &tampered, "\"revision\":1,", "\"revision\":2,");
    cli(&["appstore", "verify-catalog", p(&tampered), "--trust", &public]).assert_refused(1, "catalog-signature-invalid");
    let payload = envelope["payload"].as_str().unwrap();
    let flipped = if payload.starts_with('e') { payload.replacen('e', "f", 1) } else { format!("e{}", &payload[1..]) };
    edited(&first, &tampered, payload, &flipped);
    cli(&["appstore", "verify-catalog", p(&tampered), "--trust", &public]).assert_refused(1, "catalog-digest-mismatch");
    edited(&first, &tampered, "\"contract\":1,", "\"contract\":2,");
    cli(&["appstore", "verify-catalog", p(&tampered), "--trust", &public]).assert_refused(1, "catalog-contract-unsupported");
    let text = fs::read_to_string(&first).unwrap();
    fs::write(&tampered, &text[..text.len() / 2]).unwrap();
    cli(&["appstore", "verify-catalog", p(&tampered), "--trust", &public]).assert_refused(1, "catalog-malformed");
    cli(&["appstore", "verify-catalog", p(&first), "--trust", "capstan-ed25519:nope"]).assert_refused(1, "publisher-key-invalid");
    cli(&["appstore", "verify-catalog", p(&root.join("missing.json")), "--trust", &public]).assert_refused(1, "catalog-unreadable");

    // ---- succession: removing a published version is refused, withdrawing it is not ----
    let second = root.join("catalog-2.json");
    let without = WIKI.replacen(
        "version = \"1.0.0\"\n[versions.template]\nimage = \"registry.example.com/wiki:1.0.0\"",
        "version = \"1.2.0\"\n[versions.template]\nimage = \"registry.example.com/wiki:1.2.0\"",
        1,
    );
    fs::write(apps.join("wiki.toml"), &without).unwrap();
    ok(
        "sign revision 2",
        &cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "2", "--output", p(&second)]),
    );
    let refused = cli(&["appstore", "verify-catalog", p(&second), "--trust", &public, "--previous", p(&first)]);
    let stderr = refused.assert_refused(1, "catalog-version-removed");
    assert!(stderr.contains("wiki 1.0.0"), "the refusal names the app and version:\n{stderr}");

    let third = root.join("catalog-3.json");
    let withdrawn = WIKI.replacen("version = \"1.0.0\"\n", "version = \"1.0.0\"\nwithdrawn = { reason = \"data loss; use 1.1.0\" }\n", 1);
    fs::write(apps.join("wiki.toml"), &withdrawn).unwrap();
    let signed = cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "3", "--output", p(&third)]);
    ok("sign revision 3", &signed);
    assert!(signed.stdout.contains("1 withdrawn"), "{}", signed.stdout);
    let succeeded = cli(&["appstore", "verify-catalog", p(&third), "--trust", &public, "--previous", p(&first)]);
    ok("verify-catalog --previous", &succeeded);
    assert!(succeeded.stdout.contains("succeeds revision 1") && succeeded.stdout.contains("1.0.0 (withdrawn)"), "{}", succeeded.stdout);
    cli(&["appstore", "verify-catalog", p(&first), "--trust", &public, "--previous", p(&third)])
        .assert_refused(1, "catalog-revision-not-newer");
    let rewritten = root.join("catalog-4.json");
    fs::write(apps.join("wiki.toml"), withdrawn.replace("wiki:1.1.0", "wiki:1.1.1")).unwrap();
    ok(
        "sign revision 4",
        &cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "4", "--output", p(&rewritten)]),
    );
    cli(&["appstore", "verify-catalog", p(&rewritten), "--trust", &public, "--previous", p(&third)])
        .assert_refused(1, "catalog-version-rewritten");
    fs::write(apps.join("wiki.toml"), WIKI).unwrap();
    let reinstated = root.join("catalog-5.json");
    ok(
        "sign revision 5",
        &cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "5", "--output", p(&reinstated)]),
    );
    cli(&["appstore", "verify-catalog", p(&reinstated), "--trust", &public, "--previous", p(&third)])
        .assert_refused(1, "catalog-version-reinstated");

    // ---- a definition an install would refuse is refused at signing, naming file and field ----
    fs::write(apps.join("wiki.toml"), WIKI.replace("LOG_LEVEL = \"info\"", "DB_PASSWORD = \"hunter2\"")).unwrap();
    let refused =
        cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "6", "--output", p(&root.join("c6.json"))]);
    let stderr = refused.assert_refused(1, "app-definition-invalid");
    assert!(stderr.contains("wiki.toml") && stderr.contains("versions[1].template.environment.DB_PASSWORD"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "the value is never echoed:\n{stderr}");
    fs::write(apps.join("wiki.toml"), WIKI.replace("protocol = \"http\"", "protocol = \"sctp\"")).unwrap();
    let refused =
        cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "6", "--output", p(&root.join("c6.json"))]);
    let stderr = refused.assert_refused(1, "app-definition-invalid");
    assert!(stderr.contains("wiki.toml") && stderr.contains("sctp"), "{stderr}");
    assert!(!root.join("c6.json").exists(), "nothing is written for a refused catalog");
    // a key file that is not private is refused by the key reader
    fs::write(apps.join("wiki.toml"), WIKI).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let refused =
        cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "6", "--output", p(&root.join("c6.json"))]);
    refused.assert_refused(1, "input-permissions");
}

/// A loopback HTTPS source answering `body` (changeable) to every request, or 404 while it is
/// empty. Its certificate (for 127.0.0.1) is issued by a private CA made here; answers the
/// source's URL, the body and the CA certificate as PEM.
fn https_source() -> (String, Arc<Mutex<String>>, String) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "Capstan e2e private CA");
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&leaf_key, &*ca).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone(), ca.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}/catalog.json", listener.local_addr().unwrap());
    let body = Arc::new(Mutex::new(String::new()));
    let served = body.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
            let _ = stream.set_write_timeout(Some(std::time::Duration::from_secs(10)));
            let Ok(connection) = rustls::ServerConnection::new(config.clone()) else { continue };
            let mut tls = rustls::StreamOwned::new(connection, stream);
            // the request head; a client that refuses the certificate ends the handshake here
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 64 * 1024 {
                match tls.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            if !request.windows(4).any(|w| w == b"\r\n\r\n") {
                continue;
            }
            let body = served.lock().unwrap().clone();
            let status = if body.is_empty() { "404 Not Found" } else { "200 OK" };
            let _ = write!(
                tls,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    (url, body, ca.pem())
}

#[test]
fn a_catalog_source_behind_a_private_ca_is_trusted_only_with_the_plugin_http_ca_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    fs::set_permissions(root, fs::Permissions::from_mode(0o700)).unwrap();

    // ---- the publisher signs two revisions; the second is served over HTTPS ----
    let key = root.join("catalog.pem");
    let public = keygen(&key);
    let apps = root.join("apps");
    fs::create_dir(&apps).unwrap();
    fs::write(apps.join("wiki.toml"), WIKI).unwrap();
    let (first, second) = (root.join("catalog-1.json"), root.join("catalog-2.json"));
    ok(
        "sign revision 1",
        &cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "1", "--output", p(&first)]),
    );
    fs::write(apps.join("chat.toml"), CHAT).unwrap();
    ok(
        "sign revision 2",
        &cli(&["appstore", "sign-catalog", "--apps", p(&apps), "--key", p(&key), "--revision", "2", "--output", p(&second)]),
    );
    let (url, served, ca_pem) = https_source();
    *served.lock().unwrap() = fs::read_to_string(&second).unwrap();
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
    let set = json!({ "appStoreTrustedCatalogKeys": [public], "appStoreCatalogSources": [url] });
    ok_call(&server, &admin, "settings.update", json!({ "expectedRevision": settings["revision"], "set": set }));
    let imported = ok_call(&server, &admin, "appstore.importCatalog", json!({ "envelope": fs::read_to_string(&first).unwrap() }));
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
    let ids: Vec<&str> = listed["apps"].as_array().unwrap().iter().filter_map(|a| a["id"].as_str()).collect();
    assert!(ids.contains(&"chat") && ids.contains(&"wiki"), "{listed}");
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
    ok("serve --help", &help);
    assert!(help.stdout.contains("--plugin-http-ca-file") && help.stdout.contains("CAPSTAN_PLUGIN_HTTP_CA_FILE"), "{}", help.stdout);
}
