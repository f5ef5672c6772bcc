//! Capstan as the OpenID provider of a hosted app, through the real binary: an administrator
//! turns single sign-on on for a service whose template declares `platform-oidc`, the client's
//! credentials become the service's own secrets, a person is given one of the app's roles, and
//! a real relying-party library (Python's authlib, host/hosted-oidc/tests/relying_party.py)
//! completes a code flow — the person continuing on the dashboard's page — and verifies the ID
//! token with Capstan's JWKS, before and after a key rotation. Turning it off revokes the
//! credentials; deleting the service removes the client.
//!
//! Needs python3 with authlib; without them the test prints why and passes, unless
//! `CAPSTAN_TEST_REQUIRE_RELYING_PARTY=1` (set by `.ci/peers.sh`) makes them mandatory.

use crate::support::*;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../hosted-oidc/tests/relying_party.py");
const REDIRECT: &str = "https://grafana.acme.test/login/generic_oauth";

fn relying_party_available() -> bool {
    let ok = Command::new("python3").args(["-c", "import authlib"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let why = "python3 with authlib is missing (pip install authlib)";
        assert!(
            std::env::var("CAPSTAN_TEST_REQUIRE_RELYING_PARTY").as_deref() != Ok("1"),
            "CAPSTAN_TEST_REQUIRE_RELYING_PARTY=1 but {why}"
        );
        eprintln!("skipped: {why}");
    }
    ok
}

fn grafana_template() -> Value {
    json!({
        "appId": "grafana",
        "version": "11.0.0",
        "templateDigest": "0".repeat(64),
        "catalogRevision": 1,
        "template": {
            "image": "docker.io/grafana/grafana:11.0.0",
            "capabilities": ["platform-oidc"],
            "platformOidc": {
                "roles": ["Admin", "Editor", "Viewer"],
                "redirectPath": "/login/generic_oauth",
                "issuerVariable": "GF_AUTH_GENERIC_OAUTH_ISSUER",
                "clientIdVariable": "GF_AUTH_GENERIC_OAUTH_CLIENT_ID",
                "clientSecretVariable": "GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET",
            },
        },
    })
}

/// The active value of the service's secret `key`, opened from the dev store with the dev
/// keyring (the value no answer shows; the replicas get it through the secrets path).
fn secret_value(data: &Path, service: &str, key: &str) -> String {
    use capstan::secrets::envelope;
    use capstan::secrets::methods::{SECRETS, Secret, VERSIONS, Version, declare, material_context};
    let keyring = capstan::keyring::Keyring::load(&data.join("keyring.json")).unwrap();
    let (service, key) = (service.to_string(), key.to_string());
    with_store(&data.join("capstan.sqlite"), &[], |store| async move {
        declare(&store).await.unwrap();
        let page = store.transact(|tx| async move { tx.scan(SECRETS, None, 500).await }).await.unwrap();
        let (id, secret) = page
            .documents
            .into_iter()
            .map(|d| (d.id.clone(), serde_json::from_value::<Secret>(d.data).unwrap()))
            .find(|(_, s)| s.key == key && s.owner_ref.contains(&service))
            .unwrap_or_else(|| panic!("the service's secret {key}"));
        let version_id = secret.current_version_id.as_str();
        let version = store.transact(|tx| async move { tx.require(VERSIONS, version_id).await }).await.unwrap();
        let version: Version = serde_json::from_value(version.data).unwrap();
        let context = material_context(&id, &secret.current_version_id, &secret);
        String::from_utf8(envelope::open(&keyring, &context, &version.envelope).unwrap().to_vec()).unwrap()
    })
}

/// One code flow of authlib against `server`, the person holding `person` continuing on the
/// dashboard's page (`via_page`) or through `hostedOidc.completeAuthorization`: what authlib
/// printed at the end.
fn flow(server: &Capstan, client_id: &str, secret: &str, person: &str, via_page: bool, old: Option<(&str, &str)>) -> Value {
    let mut rp = Command::new("python3");
    rp.arg(SCRIPT)
        .env("RP_ISSUER", server.url("/oidc"))
        .env("RP_CLIENT_ID", client_id)
        .env("RP_CLIENT_SECRET", secret)
        .env("RP_REDIRECT_URI", REDIRECT)
        .env("AUTHLIB_INSECURE_TRANSPORT", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((token, nonce)) = old {
        rp.env("RP_OLD_ID_TOKEN", token).env("RP_OLD_NONCE", nonce);
    }
    let mut child = rp.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&out.next().expect("the authorization URL").unwrap()).unwrap();
    let authorize = first["authorize"].as_str().unwrap();
    let path = authorize.strip_prefix(&server.url("")).expect("the provider is this server");
    let (status, location, body) = raw("GET", &server.url(path), &[], None);
    assert_eq!(status, 303, "{body}");
    let location = location.expect("to the dashboard's page");
    let request_id = location.split_once("/authorize/").map(|(_, id)| id.to_string()).unwrap_or_else(|| panic!("{location}"));
    let back = if via_page {
        let cookie = format!("capstan_session={person}");
        let page_url = server.url(&format!("/authorize/{request_id}"));
        // not logged in: to the login page, which comes back here
        let (status, login, _) = raw("GET", &page_url, &[], None);
        assert_eq!((status, login.as_deref()), (303, Some(format!("/login?next=%2Fauthorize%2F{request_id}").as_str())));
        let (status, _, form) = raw("GET", &server.url(login.as_deref().unwrap()), &[], None);
        assert!(status == 200 && form.contains("name=\"next\"") && form.contains(&request_id), "the login form goes on there: {form}");
        let (status, _, page) = raw("GET", &page_url, &[("cookie", &cookie)], None);
        assert_eq!(status, 200, "{page}");
        assert!(page.contains("Continue to grafana"), "{page}");
        assert!(page.contains("Editor"), "{page}");
        let origin = server.url("");
        let origin = origin.trim_end_matches('/');
        let headers = [("cookie", cookie.as_str()), ("origin", origin), ("content-type", "application/x-www-form-urlencoded")];
        let (status, decided, body) = raw("POST", &page_url, &headers, Some(b"decision=continue"));
        assert_eq!(status, 303, "{body}");
        let decided = decided.unwrap();
        assert!(decided.starts_with(REDIRECT), "{decided}");
        decided
    } else {
        let view = ok(server, person, "hostedOidc.getAuthorization", json!({ "requestId": request_id }));
        assert_eq!(view["role"], "Editor", "{view}");
        ok(server, person, "hostedOidc.completeAuthorization", json!({ "requestId": request_id }))["redirectUrl"]
            .as_str()
            .unwrap()
            .to_string()
    };
    writeln!(child.stdin.take().unwrap(), "{back}").unwrap();
    let last = out.next().expect("authlib's verdict").unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(child.wait().unwrap().success(), "authlib refused: {err}\n{last}");
    serde_json::from_str(&last).unwrap()
}

#[test]
fn a_hosted_app_signs_its_people_in_through_capstan_and_authlib_verifies_it() {
    if !relying_party_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Capstan::start(with_test_admin(dev_command(&data)));
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let org = ok(&server, &admin, "organizations.create", json!({ "name": "acme" }))["id"].as_str().unwrap().to_string();
    let create = |name: &str, domains: Value, template: Value| {
        let body = json!({ "organizationId": org, "name": name, "image": "docker.io/grafana/grafana:11.0.0", "domains": domains, "template": template });
        ok(&server, &admin, "services.create", body)["id"].as_str().unwrap().to_string()
    };
    let grafana = create("grafana", json!(["grafana.acme.test"]), grafana_template());
    let plain = create("plain", json!(["plain.acme.test"]), Value::Null);
    let hidden = create("hidden", json!([]), grafana_template());

    // what may be turned on, and what may not
    let access = ok(&server, &admin, "apps.getAccess", json!({ "serviceId": grafana }));
    assert_eq!(access["enabled"], false);
    assert_eq!(access["declared"]["roles"], json!(["Admin", "Editor", "Viewer"]));
    assert_eq!(access["issuer"], server.url("/oidc").as_str());
    server.call_as(&admin, "apps.setOidc", &json!({ "serviceId": plain, "enabled": true })).expect_error(409, "hosted-app-oidc-undeclared");
    server
        .call_as(&admin, "apps.setOidc", &json!({ "serviceId": hidden, "enabled": true }))
        .expect_error(409, "hosted-app-domain-required");

    // on: the client, and its credentials as the service's own secrets (no value answered)
    let on = server.call_as(&admin, "apps.setOidc", &json!({ "serviceId": grafana, "enabled": true })).expect_json(200);
    assert_eq!(on["enabled"], true);
    assert_eq!(on["redirectUris"], json!([REDIRECT]));
    let client_id = on["clientId"].as_str().unwrap().to_string();
    let secrets = ok(&server, &admin, "secrets.list", json!({ "owner": { "kind": "service", "serviceId": grafana } }));
    let mut keys: Vec<&str> = secrets["items"].as_array().unwrap().iter().map(|s| s["key"].as_str().unwrap()).collect();
    keys.sort();
    assert_eq!(
        keys,
        ["GF_AUTH_GENERIC_OAUTH_CLIENT_ID", "GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET", "GF_AUTH_GENERIC_OAUTH_ISSUER"],
        "{secrets}"
    );
    assert!(secrets["items"].as_array().unwrap().iter().all(|s| s["managementScope"] == "hosted-oidc"), "{secrets}");
    let client_secret = secret_value(&data, &grafana, "GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET");
    assert_eq!(secret_value(&data, &grafana, "GF_AUTH_GENERIC_OAUTH_CLIENT_ID"), client_id);
    assert_eq!(secret_value(&data, &grafana, "GF_AUTH_GENERIC_OAUTH_ISSUER"), server.url("/oidc"));
    assert!(!on.to_string().contains(&client_secret) && !server.stderr().contains(&client_secret), "the client secret is never shown");

    // a person with one of the app's roles
    let created = ok(&server, &admin, "admin.createUser", json!({ "username": "alice" }));
    let alice_id = created["userId"].as_str().or(created["user"]["userId"].as_str()).unwrap().to_string();
    let alice = server.login("alice", created["password"].as_str().unwrap());
    server
        .call_as(&admin, "apps.assignRole", &json!({ "serviceId": grafana, "userId": alice_id, "role": "Owner" }))
        .expect_error(400, "hosted-oidc-role-undeclared");
    let assigned = ok(&server, &admin, "apps.assignRole", json!({ "serviceId": grafana, "userId": alice_id, "role": "Editor" }));
    assert_eq!(assigned["assignments"][0]["username"], "alice", "{assigned}");

    // the dashboard's Access view shows it, and gives roles too
    let cookie = format!("capstan_session={admin}");
    let view = server.url(&format!("/services/{grafana}/access"));
    let (status, _, page) = raw("GET", &view, &[("cookie", &cookie)], None);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("id=\"access-state\">on<") && page.contains(&client_id) && page.contains("alice"), "{page}");
    assert!(!page.contains(&client_secret), "the Access view never shows the secret");
    let origin = server.url("");
    let form = format!("userId={alice_id}&role=Viewer");
    let headers =
        [("cookie", cookie.as_str()), ("origin", origin.trim_end_matches('/')), ("content-type", "application/x-www-form-urlencoded")];
    let (status, location, body) = raw("POST", &format!("{view}/assign"), &headers, Some(form.as_bytes()));
    assert_eq!((status, location.as_deref()), (303, Some(format!("/services/{grafana}/access?done=assigned").as_str())), "{body}");
    let access = ok(&server, &admin, "apps.getAccess", json!({ "serviceId": grafana }));
    assert_eq!(access["assignments"][0]["role"], "Viewer", "{access}");
    ok(&server, &admin, "apps.assignRole", json!({ "serviceId": grafana, "userId": alice_id, "role": "Editor" }));
    let (status, _, page) = raw("GET", &server.url(&format!("/services/{grafana}")), &[("cookie", &cookie)], None);
    assert!(status == 200 && page.contains("id=\"service-access\""), "the service page links the Access view: {page}");

    // authlib signs alice in, she continues on the dashboard's page
    let first = flow(&server, &client_id, &client_secret, &alice, true, None);
    assert_eq!(first["claims"]["preferred_username"], "alice", "{first}");
    assert_eq!(first["claims"]["roles"], json!(["Editor"]), "{first}");
    assert_eq!(first["userinfo"]["roles"], json!(["Editor"]), "{first}");

    // the signing key rotates; the old ID token still verifies, the new one carries the new key
    let rotated = ok(&server, &admin, "hostedOidc.rotateSigningKey", json!({}));
    let old = (first["id_token"].as_str().unwrap(), first["nonce"].as_str().unwrap());
    let second = flow(&server, &client_id, &client_secret, &alice, false, Some(old));
    assert_ne!(second["kid"], first["kid"]);
    assert_eq!(second["kid"], rotated["kid"], "{rotated}");
    assert_eq!(second["old_token_verified"], true, "{second}");

    // off: the credentials are revoked and the old secret opens nothing
    ok(&server, &admin, "apps.setOidc", json!({ "serviceId": grafana, "enabled": false }));
    let secrets = ok(&server, &admin, "secrets.list", json!({ "owner": { "kind": "service", "serviceId": grafana } }));
    assert!(secrets["items"].as_array().unwrap().iter().all(|s| s["state"] == "revoked"), "{secrets}");
    let token = token_call(&server, &client_id, &client_secret);
    assert_eq!(token.status, 401, "{}", token.body);

    // on again, then the service deleted: the client goes with it
    let on = ok(&server, &admin, "apps.setOidc", json!({ "serviceId": grafana, "enabled": true }));
    let (client_id, client_secret) =
        (on["clientId"].as_str().unwrap().to_string(), secret_value(&data, &grafana, "GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET"));
    // the CLI: `capstan apps access` beside the App Store's apps commands
    let config = dir.path().join("config");
    let shown = cli(&server, &admin, &config, &["apps", "access", &grafana, "--assign", "alice=Viewer"]);
    let text = succeeded(&shown);
    assert!(text.contains("single sign-on: on") && text.contains("alice") && text.contains("Viewer"), "{text}");
    assert!(!text.contains(&client_secret), "{text}");
    let wrong = cli(&server, &admin, &config, &["apps", "access", &grafana, "--assign", "alice"]);
    wrong.assert_refused(1, "assign-invalid");
    let service = ok(&server, &admin, "services.get", json!({ "id": grafana }));
    ok(&server, &admin, "services.delete", json!({ "id": grafana, "expectedRevision": service["revision"] }));
    let token = token_call(&server, &client_id, &client_secret);
    assert_eq!(token.status, 401, "a deleted service's client authenticates nothing: {}", token.body);
}

/// One request without following redirects: status, `Location`, body.
fn raw(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> (u16, Option<String>, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).max_redirects(0).build().into();
    let mut builder = ureq::http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let result = match body {
        Some(bytes) => agent.run(builder.body(bytes.to_vec()).unwrap()),
        None => agent.run(builder.body(()).unwrap()),
    };
    let mut response = result.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let location = response.headers().get("location").map(|l| l.to_str().unwrap().to_string());
    (response.status().as_u16(), location, response.body_mut().read_to_string().unwrap_or_default())
}

/// A token request with the client's credentials and a made-up code: 401 when the client is
/// not (or no longer) known, 400 `invalid_grant` when it is.
fn token_call(server: &Capstan, client_id: &str, secret: &str) -> Reply {
    use base64::Engine;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{client_id}:{secret}"));
    let body = format!("grant_type=authorization_code&code=made-up&redirect_uri={REDIRECT}&code_verifier={}", "v".repeat(43));
    server.request(
        "POST",
        "/oidc/token",
        &[("authorization", &format!("Basic {basic}")), ("content-type", "application/x-www-form-urlencoded")],
        Some(body.as_bytes()),
    )
}
