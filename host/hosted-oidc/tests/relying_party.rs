//! A real relying party signs in through the provider: authlib (Python), the library many apps
//! stand on, run by `relying_party.py` against `HostedOidc::router()` served on 127.0.0.1.
//!
//! It discovers the provider, starts the code flow with PKCE (S256), state and nonce; this test
//! plays the browser and the dashboard (the authorize answer's 303, then
//! `complete_authorization` for a person with a role); authlib exchanges the code with
//! client_secret_basic, validates the ID token with the keys of jwks_uri (signature, iss, aud,
//! exp, nonce, at_hash) and reads userinfo. Then the signing key is rotated and a second flow
//! runs: its ID token names the new key and verifies, and the first flow's ID token still
//! verifies with the JWKS that now publishes both. A replayed code is refused and revokes the
//! token it had issued.
//!
//! Without python3, authlib or requests the test says why and passes, unless
//! `CAPSTAN_TEST_REQUIRE_RELYING_PARTY=1` is set, then it fails.

use capstan_hosted_oidc::{ClientSpec, EnabledClient, HostedOidc};
use capstan_keyring::Keyring;
use capstan_rpc::Identity;
use capstan_store::Store;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/relying_party.py");
/// The app's redirect URI: never followed, the test reads the redirect itself.
const REDIRECT: &str = "http://127.0.0.1:9/login/generic_oauth";

/// Why the relying party cannot run here, if it cannot.
fn missing() -> Option<String> {
    match Command::new("python3").args(["-c", "import authlib, requests"]).output() {
        Err(e) => Some(format!("python3 does not run: {e}")),
        Ok(out) if !out.status.success() => {
            Some(format!("python3 lacks authlib or requests: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
        Ok(_) => None,
    }
}

async fn read_line(stdout: BufReader<ChildStdout>) -> (BufReader<ChildStdout>, String) {
    let read = tokio::task::spawn_blocking(move || {
        let mut stdout = stdout;
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the relying party's stdout reads");
        (stdout, line)
    });
    tokio::time::timeout(Duration::from_secs(120), read).await.expect("the relying party answers within 2 minutes").unwrap()
}

fn fail(child: &mut Child, what: &str) -> ! {
    let _ = child.kill();
    let output = child.stderr.take().map(|mut e| {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut e, &mut text);
        text
    });
    panic!("{what}; the relying party's stderr:\n{}", output.unwrap_or_default());
}

/// One sign-in by authlib, `who` approving in the "dashboard"; what the script printed at the end.
async fn sign_in(oidc: &HostedOidc, client: &EnabledClient, who: &Identity, old: Option<(&str, &str)>) -> Value {
    let mut command = Command::new("python3");
    command
        .arg(SCRIPT)
        .env("RP_ISSUER", oidc.issuer())
        .env("RP_CLIENT_ID", &client.client_id)
        .env("RP_CLIENT_SECRET", &client.client_secret)
        .env("RP_REDIRECT_URI", REDIRECT)
        .env("AUTHLIB_INSECURE_TRANSPORT", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((id_token, nonce)) = old {
        command.env("RP_OLD_ID_TOKEN", id_token).env("RP_OLD_NONCE", nonce);
    }
    let mut child = command.spawn().expect("python3 starts");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (stdout, line) = read_line(stdout).await;
    let Ok(first) = serde_json::from_str::<Value>(&line) else { fail(&mut child, &format!("no authorization URL: {line:?}")) };
    let authorize = first["authorize"].as_str().expect("an authorization URL").to_string();
    let query: Vec<(String, String)> = url::Url::parse(&authorize).unwrap().query_pairs().into_owned().collect();
    let param = |name: &str| query.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(param("code_challenge_method").as_deref(), Some("S256"), "{authorize}");
    assert!(param("code_challenge").is_some() && param("state").is_some() && param("nonce").is_some(), "{authorize}");

    // the browser: the provider sends it on to the dashboard
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let answer = http.get(&authorize).send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 303);
    let location = answer.headers()["location"].to_str().unwrap().to_string();
    let request_id = location.split_once("/authorize/").map(|(_, id)| id.to_string()).unwrap_or_else(|| panic!("{location}"));
    // the dashboard: the signed-in person approves
    let redirect = oidc.complete_authorization(&request_id, who).await.unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{redirect}").unwrap();
    drop(stdin);
    let (_, line) = read_line(stdout).await;
    let status = tokio::task::spawn_blocking(move || {
        let status = child.wait().unwrap();
        (status, child)
    })
    .await
    .unwrap();
    let (status, mut child) = status;
    if !status.success() {
        fail(&mut child, &format!("the relying party failed ({status})"));
    }
    serde_json::from_str(&line).unwrap_or_else(|_| panic!("the relying party's answer: {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authlib_signs_in_and_verifies_id_tokens_across_a_key_rotation() {
    if let Some(reason) = missing() {
        if std::env::var("CAPSTAN_TEST_REQUIRE_RELYING_PARTY").is_ok_and(|v| v == "1") {
            panic!("CAPSTAN_TEST_REQUIRE_RELYING_PARTY=1 but {reason}");
        }
        eprintln!("skipped: {reason} (set CAPSTAN_TEST_REQUIRE_RELYING_PARTY=1 to fail instead)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
    let keyring = Arc::new(Keyring::generate(None, None).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let oidc = HostedOidc::new(store, keyring, &origin).await.unwrap();
    let router = oidc.router();
    tokio::spawn(async move { axum::serve(listener, router).await });

    let client = oidc
        .enable_client(ClientSpec {
            service_id: "svc-grafana".into(),
            name: Some("Grafana".into()),
            redirect_uris: vec![REDIRECT.into()],
            roles: vec!["Admin".into(), "Editor".into(), "Viewer".into()],
        })
        .await
        .unwrap();
    let now = capstan_core::clock::now_ms();
    let alice = Identity {
        user_id: "user_alice".into(),
        username: "alice".into(),
        kind: "human".into(),
        admin: false,
        session_id: "session-alice".into(),
        authenticated_at: now,
        expires_at: now + 3_600_000,
    };
    oidc.assign_role("svc-grafana", &alice.user_id, Some("Editor")).await.unwrap();

    let first = sign_in(&oidc, &client, &alice, None).await;
    let claims = &first["claims"];
    assert_eq!(claims["iss"], json!(format!("{origin}/oidc")));
    assert_eq!(claims["sub"], "user_alice");
    assert_eq!(claims["aud"], json!([client.client_id]));
    assert_eq!(claims["nonce"], first["nonce"]);
    assert_eq!(claims["preferred_username"], "alice");
    assert_eq!(claims["name"], "alice");
    assert_eq!(claims["roles"], json!(["Editor"]));
    assert_eq!(claims["auth_time"], json!(now / 1000));
    assert_eq!(first["alg"], "RS256");
    assert_eq!(first["expires_in"], 3600);
    assert_eq!(first["userinfo"], json!({"sub": "user_alice", "preferred_username": "alice", "name": "alice", "roles": ["Editor"]}));
    let first_kid = first["kid"].as_str().unwrap().to_string();
    assert_eq!(first["jwks_kids"], json!([first_kid]));

    // a new signing key: the next ID token names it, and both keys are published
    let rotated = oidc.rotate_signing_key().await.unwrap();
    assert_ne!(rotated.kid, first_kid);
    let second = sign_in(&oidc, &client, &alice, Some((first["id_token"].as_str().unwrap(), first["nonce"].as_str().unwrap()))).await;
    assert_eq!(second["kid"], json!(rotated.kid));
    assert_eq!(second["jwks_kids"], json!([rotated.kid, first_kid]), "the active key first, the old one still published");
    assert_eq!(second["old_token_verified"], true, "the ID token from before the rotation still verifies");
    assert_eq!(second["claims"]["roles"], json!(["Editor"]));

    // the first flow's code presented again: refused, and the token it issued is revoked
    let http = reqwest::Client::new();
    let replay = http
        .post(format!("{}/token", oidc.issuer()))
        .basic_auth(&client.client_id, Some(&client.client_secret))
        .form(&[
            ("grant_type", "authorization_code"),
            ("code", first["code"].as_str().unwrap()),
            ("redirect_uri", REDIRECT),
            ("code_verifier", first["code_verifier"].as_str().unwrap()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status().as_u16(), 400);
    assert_eq!(replay.json::<Value>().await.unwrap()["error"], "invalid_grant");
    let userinfo = |token: String| {
        let http = http.clone();
        let url = format!("{}/userinfo", oidc.issuer());
        async move { http.get(url).bearer_auth(token).send().await.unwrap() }
    };
    let revoked = userinfo(first["access_token"].as_str().unwrap().to_string()).await;
    assert_eq!(revoked.status().as_u16(), 401);
    assert_eq!(revoked.headers()["www-authenticate"], "Bearer error=\"invalid_token\"");
    assert_eq!(
        userinfo(second["access_token"].as_str().unwrap().to_string()).await.status().as_u16(),
        200,
        "the other flow's token stands"
    );
}
