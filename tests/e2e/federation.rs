//! The platform login through a real identity provider: `tests/peers/idp`, built on the
//! certified `oidc-provider` (docs/idp-peer.md), started per test. People sign in over HTTP as a
//! browser would (its form, its cookies, every redirect taken by hand), through the CLI's
//! loopback flow, and — in `browser.rs` style — in a headless Chromium.
//!
//! Needs `node` and the peer's packages (`npm ci` in tests/peers/idp; `.ci/peers.sh` does it and
//! sets `CAPSTAN_TEST_IDP`). Without them the tests print why and pass, unless
//! `CAPSTAN_TEST_REQUIRE_IDP=1` makes them mandatory.

use crate::support::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CLIENT_ID: &str = "capstan";
const CLIENT_SECRET: &str = "capstan-client-secret-for-tests-1f7c";
/// Every persona's password at the peer.
pub const PERSONA_PASSWORD: &str = "correct horse battery staple";

/// The development IdP: a `node server.mjs` child, killed when dropped.
pub struct Idp {
    child: Child,
    /// Its issuer URL (`http://127.0.0.1:<port>`).
    pub issuer: String,
    agent: ureq::Agent,
}

impl Drop for Idp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The peer's `server.mjs`, or `None` (after saying why) when the test should be skipped.
pub fn idp_script() -> Option<String> {
    let script = std::env::var("CAPSTAN_TEST_IDP").ok().or_else(|| {
        let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/peers/idp/server.mjs");
        local.parent().unwrap().join("node_modules/oidc-provider").exists().then(|| local.display().to_string())
    });
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    match script.filter(|_| node) {
        Some(script) => Some(script),
        None => {
            let why = "the development IdP needs node and `npm ci` in tests/peers/idp (CAPSTAN_TEST_IDP)";
            assert!(std::env::var("CAPSTAN_TEST_REQUIRE_IDP").as_deref() != Ok("1"), "CAPSTAN_TEST_REQUIRE_IDP=1 but {why}");
            eprintln!("skipped: {why}");
            None
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).max_redirects(0).timeout_global(Some(Duration::from_secs(30))).build().into()
}

impl Idp {
    /// Start the IdP with Capstan's client, whose redirect URI is `redirect_uri`.
    pub fn start(script: &str, redirect_uri: &str) -> Idp {
        let port = free_port();
        let mut child = Command::new("node")
            .arg(script)
            .args(["--port", &port.to_string(), "--client-id", CLIENT_ID, "--client-secret", CLIENT_SECRET])
            .args(["--redirect-uri", redirect_uri])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning the development IdP");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let issuer = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(issuer) = line.strip_prefix("idp listening on ") {
                        break issuer.trim().to_string();
                    }
                }
                _ => panic!("the development IdP exited before it listened"),
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Idp { child, issuer, agent: agent() }
    }

    /// `POST /test/<path>` with `body`: the control's answer.
    pub fn control(&self, path: &str, body: Value) -> Value {
        let mut reply = self
            .agent
            .post(format!("{}/test/{path}", self.issuer))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap_or_else(|e| panic!("the IdP's /test/{path}: {e}"));
        let text = reply.body_mut().read_to_string().unwrap();
        assert!(reply.status().is_success(), "/test/{path} answered {}: {text}", reply.status());
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// What the IdP was asked so far (`GET /test/log`).
    pub fn log(&self) -> Vec<Value> {
        let mut reply = self.agent.get(format!("{}/test/log", self.issuer)).call().unwrap();
        serde_json::from_str::<Value>(&reply.body_mut().read_to_string().unwrap()).unwrap().as_array().cloned().unwrap_or_default()
    }
}

/// The environment that points a Capstan at `idp`.
pub fn oidc_env(cmd: &mut Command, idp: &Idp) {
    cmd.env("CAPSTAN_PLATFORM_OIDC_ISSUER", &idp.issuer)
        .env("CAPSTAN_PLATFORM_OIDC_CLIENT_ID", CLIENT_ID)
        .env("CAPSTAN_PLATFORM_OIDC_CLIENT_SECRET", CLIENT_SECRET)
        .env("CAPSTAN_PLATFORM_OIDC_NAME", "Acme ID");
}

/// A dev Capstan on a known port (the IdP must know its redirect URI first) with the test
/// administrator, and the IdP it signs people in through.
pub fn capstan_with_idp(dir: &Path, script: &str) -> (Capstan, Idp) {
    let port = free_port();
    let idp = Idp::start(script, &format!("http://127.0.0.1:{port}/auth/oidc/callback"));
    let mut cmd = with_test_admin(capstan());
    cmd.arg("serve").arg("--dev").arg("--data-dir").arg(dir.join("data")).args(["--listen", &format!("127.0.0.1:{port}")]);
    oidc_env(&mut cmd, &idp);
    (Capstan::start(cmd), idp)
}

/// A browser's cookie jar, by host and name (paths ignored: the IdP does not mind extra cookies).
#[derive(Default)]
struct Jar(BTreeMap<(String, String), String>);

impl Jar {
    fn take(&mut self, host: &str, headers: &ureq::http::HeaderMap) {
        for value in headers.get_all("set-cookie") {
            let text = value.to_str().unwrap_or_default();
            let pair = text.split(';').next().unwrap_or_default();
            if let Some((name, value)) = pair.split_once('=') {
                let expired =
                    text.to_ascii_lowercase().contains("max-age=0") || text.to_ascii_lowercase().contains("expires=thu, 01 jan 1970");
                if value.is_empty() || expired {
                    self.0.remove(&(host.to_string(), name.trim().to_string()));
                } else {
                    self.0.insert((host.to_string(), name.trim().to_string()), value.to_string());
                }
            }
        }
    }

    fn header(&self, host: &str) -> Option<String> {
        let pairs: Vec<String> = self.0.iter().filter(|((h, _), _)| h == host).map(|((_, n), v)| format!("{n}={v}")).collect();
        (!pairs.is_empty()).then(|| pairs.join("; "))
    }
}

/// One answer a [`Browser`] got: status, `Location`, body.
pub struct Step {
    pub status: u16,
    pub location: Option<String>,
    pub body: String,
}

/// A browser without a screen: keeps cookies, takes redirects one by one.
pub struct Browser {
    agent: ureq::Agent,
    jar: Jar,
}

impl Browser {
    pub fn new() -> Browser {
        Browser { agent: agent(), jar: Jar::default() }
    }

    fn absolute(base: &str, location: &str) -> String {
        url::Url::parse(base).unwrap().join(location).unwrap().to_string()
    }

    pub fn request(&mut self, method: &str, url: &str, form: Option<&[(&str, &str)]>) -> Step {
        let parsed = url::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        let host = format!("{}:{}", parsed.host_str().unwrap(), parsed.port_or_known_default().unwrap());
        let mut builder = ureq::http::Request::builder().method(method).uri(url);
        if let Some(cookies) = self.jar.header(&host) {
            builder = builder.header("cookie", cookies);
        }
        let result = match form {
            Some(pairs) => {
                let body: String = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
                let request = builder.header("content-type", "application/x-www-form-urlencoded").body(body).unwrap();
                self.agent.run(request)
            }
            None => self.agent.run(builder.body(()).unwrap()),
        };
        let mut response = result.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        self.jar.take(&host, response.headers());
        let location = response.headers().get("location").map(|l| Browser::absolute(url, l.to_str().unwrap()));
        let body = response.body_mut().read_to_string().unwrap_or_default();
        Step { status: response.status().as_u16(), location, body }
    }

    /// Follow redirects from `url` while they stay off `stop_at`: the first `Location` that
    /// begins with `stop_at` (not followed), or the answer that is not a redirect.
    pub fn follow(&mut self, url: &str, stop_at: &str) -> Result<String, Step> {
        let mut next = url.to_string();
        for _ in 0..20 {
            let step = self.request("GET", &next, None);
            match step.location {
                Some(location) if location.starts_with(stop_at) => return Ok(location),
                Some(location) if (300..400).contains(&step.status) => next = location,
                _ => return Err(step),
            }
        }
        panic!("more than 20 redirects from {url}")
    }

    /// Sign in at the IdP from its authorization URL as `username`: the IdP's redirect back to
    /// Capstan's callback (not followed).
    pub fn sign_in_at_idp(&mut self, authorize: &str, callback_prefix: &str, username: &str, password: &str) -> String {
        let form = match self.follow(authorize, callback_prefix) {
            Ok(back) => return back, // still signed in at the IdP
            Err(step) => step,
        };
        assert_eq!(form.status, 200, "the IdP's login form: {}", form.body);
        let action = form.body.split("action=\"").nth(1).and_then(|rest| rest.split('"').next()).expect("a form action").to_string();
        let action = Browser::absolute(authorize, &action.replace("&amp;", "&"));
        let step = self.request("POST", &action, Some(&[("username", username), ("password", password)]));
        let next = step.location.unwrap_or_else(|| panic!("the IdP's login answered {} without a redirect: {}", step.status, step.body));
        if next.starts_with(callback_prefix) {
            return next;
        }
        self.follow(&next, callback_prefix)
            .unwrap_or_else(|step| panic!("the IdP did not send the browser back ({}): {}", step.status, step.body))
    }
}

/// A verifier and its S256 challenge, as a client of the platform login makes them.
pub fn verifier_pair() -> (String, String) {
    let verifier = format!("verifier-{:032x}-{:032x}", rand::random::<u128>(), rand::random::<u128>());
    let challenge = capstan::federation::login::challenge_of(&verifier);
    (verifier, challenge)
}

/// How one sign-in through the IdP ended at Capstan's callback.
pub enum SignedIn {
    /// A handoff code for the return address.
    Handoff(String),
    /// The callback refused: status and refusal code (from its page).
    Refused(u16, String),
}

/// Start a login at `server`, sign in at the IdP as `username`, and take the callback.
pub fn sign_in(server: &Capstan, browser: &mut Browser, username: &str, challenge: &str) -> SignedIn {
    let callback = server.url("/auth/oidc/callback");
    let (authorize, back) = begin(server, browser, username, challenge);
    let _ = authorize;
    finish(server, browser, &back, &callback)
}

/// The first half: Capstan's redirect to the IdP, and the IdP's redirect back (not followed).
pub fn begin(server: &Capstan, browser: &mut Browser, username: &str, challenge: &str) -> (String, String) {
    let start = server.url(&format!("/auth/oidc/start?challenge={challenge}&returnTo=%2Fdone"));
    let step = browser.request("GET", &start, None);
    assert_eq!(step.status, 303, "the start: {}", step.body);
    let authorize = step.location.expect("the IdP's authorization URL");
    let back = browser.sign_in_at_idp(&authorize, &server.url("/auth/oidc/callback"), username, PERSONA_PASSWORD);
    (authorize, back)
}

/// The second half: Capstan's callback.
pub fn finish(server: &Capstan, browser: &mut Browser, back: &str, callback: &str) -> SignedIn {
    assert!(back.starts_with(callback), "{back}");
    let step = browser.request("GET", back, None);
    if step.status == 303 {
        let location = step.location.unwrap();
        assert!(location.starts_with(&server.url("/done?")), "a login returns where it was asked to: {location}");
        let handoff = url::Url::parse(&location).unwrap().query_pairs().find(|(k, _)| k == "handoff").unwrap().1.into_owned();
        return SignedIn::Handoff(handoff);
    }
    let code = step.body.split("id=\"refusal-code\">").nth(1).and_then(|r| r.split('<').next()).unwrap_or("").to_string();
    SignedIn::Refused(step.status, code)
}

/// Sign in as `username` all the way to a session token.
pub fn token_for(server: &Capstan, browser: &mut Browser, username: &str) -> String {
    let (verifier, challenge) = verifier_pair();
    let handoff = match sign_in(server, browser, username, &challenge) {
        SignedIn::Handoff(handoff) => handoff,
        SignedIn::Refused(status, code) => panic!("{username}'s sign-in was refused {status} {code}"),
    };
    let answer = server.call("federation.completeLogin", &json!({ "handoff": handoff, "verifier": verifier }).to_string()).expect_json(200);
    answer["token"].as_str().unwrap().to_string()
}

fn refused_with(server: &Capstan, browser: &mut Browser, username: &str) -> (u16, String) {
    let (_, challenge) = verifier_pair();
    match sign_in(server, browser, username, &challenge) {
        SignedIn::Refused(status, code) => (status, code),
        SignedIn::Handoff(_) => panic!("{username}'s sign-in should have been refused"),
    }
}

/// An organization linked to the IdP's organization `link`: its id and revision.
fn linked_organization(server: &Capstan, admin: &str, name: &str, link: &str) -> (String, u64) {
    let org = ok(server, admin, "organizations.create", json!({ "name": name, "identityProviderOrganization": link }));
    (org["id"].as_str().unwrap().to_string(), org["revision"].as_u64().unwrap())
}

/// `organizations.update` renaming `org` as the holder of `token` (the revision read by `admin`).
fn rename(server: &Capstan, admin: &str, token: &str, org: &str, name: &str) -> Reply {
    let current = ok(server, admin, "organizations.get", json!({ "id": org }));
    server.call_as(token, "organizations.update", &json!({ "id": org, "expectedRevision": current["revision"], "name": name }))
}

#[test]
fn people_sign_in_through_the_identity_provider_and_owner_writes_ask_it_again() {
    let Some(script) = idp_script() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (server, idp) = capstan_with_idp(dir.path(), &script);
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let status = server.call("federation.getStatus", "{}").expect_json(200);
    assert_eq!(status["enabled"], true);
    assert_eq!(status["displayName"], "Acme ID");
    assert_eq!(status["issuer"], idp.issuer.as_str());
    let (acme, _) = linked_organization(&server, &admin, "acme", "org-acme");
    let (globex, _) = linked_organization(&server, &admin, "globex", "org-globex");
    // one Capstan organization per provider organization
    server
        .call_as(&admin, "organizations.create", &json!({ "name": "acme-too", "identityProviderOrganization": "org-acme" }))
        .expect_error(400, "identity-provider-organization-linked");

    // the owner signs in: Capstan's own session, her organization from the live claims
    let mut browser = Browser::new();
    let olivia = token_for(&server, &mut browser, "olivia");
    let whoami = ok(&server, &olivia, "auth.whoami", json!({}));
    assert_eq!(whoami["username"], "olivia");
    assert_eq!(whoami["admin"], false);
    assert!(whoami["sessionId"].as_str().unwrap().starts_with("fsession_"), "{whoami}");
    let orgs = ok(&server, &olivia, "organizations.list", json!({}));
    let names: Vec<&str> = orgs["items"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["acme"], "{orgs}");
    let members = ok(&server, &admin, "organizations.listMembers", json!({ "organizationId": acme }));
    assert_eq!(members["items"][0]["role"], "owner", "{members}");
    // the authorization request asked for the organization scopes, with PKCE
    let log = idp.log();
    let auth = log.iter().find(|e| e["path"].as_str().is_some_and(|p| p.starts_with("/auth"))).expect("an authorization request");
    let query = auth["query"].to_string();
    for needle in ["organizations", "roles", "S256", "nonce", "state"] {
        assert!(query.contains(needle), "the authorization request should carry {needle}: {query}");
    }

    // an owner write asks the provider first (introspection), and runs
    let introspections = |idp: &Idp| idp.log().iter().filter(|e| e["path"].as_str().is_some_and(|p| p.contains("introspect"))).count();
    let before = introspections(&idp);
    rename(&server, &admin, &olivia, &acme, "acme-corp").expect_json(200);
    assert_eq!(introspections(&idp), before + 1, "one live introspection for the owner write");
    // a foreign organization's write is refused
    rename(&server, &admin, &olivia, &globex, "mine").expect_error(403, "forbidden");

    // the provider makes her a member: the next owner write is refused, the membership follows
    idp.control("personas/olivia", json!({ "organizations": [{ "id": "org-acme", "name": "Acme", "roles": ["member"] }] }));
    rename(&server, &admin, &olivia, &acme, "acme-again").expect_error(403, "forbidden");
    let members = ok(&server, &admin, "organizations.listMembers", json!({ "organizationId": acme }));
    assert_eq!(members["items"][0]["role"], "member", "{members}");
    idp.control("personas/olivia", json!({ "organizations": [{ "id": "org-acme", "name": "Acme", "roles": ["owner"] }] }));
    rename(&server, &admin, &olivia, &acme, "acme-again").expect_json(200);

    // the provider revokes her tokens: the owner write ends the session
    idp.control("revoke/olivia", json!({}));
    rename(&server, &admin, &olivia, &acme, "acme-later").expect_error(401, "federated-session-ended");
    server.call_as(&olivia, "auth.whoami", &json!({})).expect_error(401, "unauthenticated");

    // a person in no organization this Capstan knows is refused an identity, and none is made
    assert_eq!(refused_with(&server, &mut Browser::new(), "nora"), (403, "oidc-no-organization".into()));
    let users = ok(&server, &admin, "users.list", json!({}));
    assert!(!users.to_string().contains("\"nora\""), "no user for nora: {users}");
    // the admin role makes an infrastructure administrator
    let ada = token_for(&server, &mut Browser::new(), "ada");
    assert_eq!(ok(&server, &ada, "auth.whoami", json!({}))["admin"], true);

    // a revoked password keeps the provider's sign-in; a disabled person is refused both
    let mut browser = Browser::new();
    let olivia = token_for(&server, &mut browser, "olivia");
    let me = ok(&server, &olivia, "auth.whoami", json!({}));
    let user_id = me["userId"].as_str().unwrap().to_string();
    let person = |users: &Value| users["users"].as_array().unwrap().iter().find(|u| u["userId"] == user_id.as_str()).cloned().unwrap();
    let listed = person(&ok(&server, &admin, "users.list", json!({})));
    assert_eq!(listed["passwordEnabled"], false, "a person from the provider has no password: {listed}");
    ok(&server, &admin, "users.resetPassword", json!({ "userId": user_id, "expectedGeneration": listed["generation"] }));
    let listed = person(&ok(&server, &admin, "users.list", json!({})));
    assert_eq!(listed["passwordEnabled"], true, "{listed}");
    let revoke = json!({
        "userId": user_id,
        "expectedGeneration": listed["generation"],
        "mutationId": "revoke-olivia",
        "operation": { "revokePassword": {} },
    });
    ok(&server, &admin, "admin.mutateHumanCredential", revoke);
    let again = token_for(&server, &mut browser, "olivia");
    assert_eq!(ok(&server, &again, "auth.whoami", json!({}))["username"], "olivia");
    let generation = person(&ok(&server, &admin, "users.list", json!({})))["generation"].clone();
    ok(&server, &admin, "users.setDisabled", json!({ "userId": user_id, "disabled": true, "expectedGeneration": generation }));
    server.call_as(&again, "auth.whoami", &json!({})).expect_error(401, "unauthenticated");
    assert_eq!(refused_with(&server, &mut browser, "olivia"), (403, "user-disabled".into()));

    // no token of the provider's reaches a log line
    let log = server.stderr();
    assert!(!log.contains(CLIENT_SECRET), "the client secret must not be logged");
    drop(idp);
}

#[test]
fn tampered_tokens_wrong_nonces_wrong_issuers_and_replays_are_refused_by_name() {
    let Some(script) = idp_script() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (server, idp) = capstan_with_idp(dir.path(), &script);
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    linked_organization(&server, &admin, "acme", "org-acme");
    let callback = server.url("/auth/oidc/callback");

    for (mischief, status, code) in [
        ("tamper", 401, "oidc-id-token-signature-invalid"),
        ("wrong-nonce", 401, "oidc-id-token-nonce-mismatch"),
        ("wrong-issuer", 401, "oidc-id-token-issuer-mismatch"),
        ("wrong-audience", 401, "oidc-id-token-audience-mismatch"),
        ("expired", 401, "oidc-id-token-expired"),
    ] {
        idp.control("mischief", json!({ "idToken": mischief }));
        assert_eq!(refused_with(&server, &mut Browser::new(), "olivia"), (status, code.to_string()), "{mischief}");
    }

    // the callback replayed: its login was spent
    let mut browser = Browser::new();
    let (_, challenge) = verifier_pair();
    let (_, back) = begin(&server, &mut browser, "olivia", &challenge);
    assert!(matches!(finish(&server, &mut browser, &back, &callback), SignedIn::Handoff(_)));
    match finish(&server, &mut browser, &back, &callback) {
        SignedIn::Refused(status, code) => assert_eq!((status, code.as_str()), (400, "oidc-login-unknown")),
        SignedIn::Handoff(_) => panic!("a replayed callback must not sign in"),
    }
    // the code replayed under a fresh login: the provider refuses it
    let code = url::Url::parse(&back).unwrap().query_pairs().find(|(k, _)| k == "code").unwrap().1.into_owned();
    let (_, challenge) = verifier_pair();
    let step = browser.request("GET", &server.url(&format!("/auth/oidc/start?challenge={challenge}&returnTo=%2Fdone")), None);
    let state = url::Url::parse(&step.location.unwrap()).unwrap().query_pairs().find(|(k, _)| k == "state").unwrap().1.into_owned();
    let replay = format!("{callback}?code={code}&state={state}");
    match finish(&server, &mut browser, &replay, &callback) {
        SignedIn::Refused(status, code) => assert_eq!((status, code.as_str()), (400, "oidc-code-refused")),
        SignedIn::Handoff(_) => panic!("a replayed code must not sign in"),
    }

    // a handoff taken with the wrong verifier is worth nothing, and is spent
    let (verifier, challenge) = verifier_pair();
    let SignedIn::Handoff(handoff) = sign_in(&server, &mut browser, "olivia", &challenge) else { panic!("sign-in") };
    server
        .call("federation.completeLogin", &json!({ "handoff": handoff, "verifier": "not-the-verifier" }).to_string())
        .expect_error(400, "oidc-handoff-invalid");
    server
        .call("federation.completeLogin", &json!({ "handoff": handoff, "verifier": verifier }).to_string())
        .expect_error(400, "oidc-handoff-invalid");
    // a return address elsewhere is refused before anything happens
    let step = browser.request(
        "GET",
        &server.url(&format!("/auth/oidc/start?challenge={challenge}&returnTo=https%3A%2F%2Fevil.example%2F")),
        None,
    );
    assert_eq!(step.status, 400, "{}", step.body);
    assert!(step.body.contains("oidc-return-invalid"), "{}", step.body);

    // the provider rotates its signing key: the next sign-in verifies with the new key
    let rotated = idp.control("rotate-keys", json!({}));
    let token = token_for(&server, &mut Browser::new(), "olivia");
    assert_eq!(ok(&server, &token, "auth.whoami", json!({}))["username"], "olivia", "after rotating to {rotated}");
}

#[test]
fn a_start_fails_closed_when_the_issuer_lacks_what_capstan_needs() {
    let Some(script) = idp_script() else { return };
    let dir = tempfile::tempdir().unwrap();
    let idp = Idp::start(&script, "http://127.0.0.1:9/auth/oidc/callback");
    let mut cmd = capstan();
    cmd.arg("serve").arg("--dev").arg("--data-dir").arg(dir.path().join("a")).args(["--listen", "127.0.0.1:0"]);
    oidc_env(&mut cmd, &idp);
    cmd.env("CAPSTAN_PLATFORM_OIDC_SCOPES", "openid profile groups");
    let exited = run_to_exit(cmd);
    let text = exited.assert_refused(1, "platform-oidc-discovery-incomplete");
    assert!(text.contains("the scope groups"), "{text}");

    // nothing answers at the issuer
    let mut cmd = capstan();
    cmd.arg("serve").arg("--dev").arg("--data-dir").arg(dir.path().join("b")).args(["--listen", "127.0.0.1:0"]);
    cmd.env("CAPSTAN_PLATFORM_OIDC_ISSUER", format!("http://127.0.0.1:{}", free_port()))
        .env("CAPSTAN_PLATFORM_OIDC_CLIENT_ID", CLIENT_ID)
        .env("CAPSTAN_PLATFORM_OIDC_CLIENT_SECRET", CLIENT_SECRET);
    run_to_exit(cmd).assert_refused(1, "platform-oidc-issuer-unreachable");

    // the issuer without its client: named, nothing opened
    let mut cmd = capstan();
    cmd.arg("serve").arg("--dev").arg("--data-dir").arg(dir.path().join("c")).args(["--listen", "127.0.0.1:0"]);
    cmd.env("CAPSTAN_PLATFORM_OIDC_ISSUER", &idp.issuer);
    let text = run_to_exit(cmd).assert_refused(2, "config-missing").to_string();
    assert!(text.contains("CAPSTAN_PLATFORM_OIDC_CLIENT_ID") && text.contains("CAPSTAN_PLATFORM_OIDC_CLIENT_SECRET"), "{text}");
}

#[test]
fn capstan_login_oidc_signs_in_through_a_loopback_port() {
    let Some(script) = idp_script() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (server, _idp) = capstan_with_idp(dir.path(), &script);
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    linked_organization(&server, &admin, "acme", "org-acme");
    let config = dir.path().join("config");
    let mut login = capstan();
    login
        .args(["login", "--oidc", "--no-browser", "--url", &server.url("")])
        .env("XDG_CONFIG_HOME", &config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = login.spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let start = loop {
        let line = lines.next().expect("the CLI prints the sign-in address").unwrap();
        if let Some(url) = line.trim().strip_prefix(&server.url("/auth/oidc/start")) {
            break server.url(&format!("/auth/oidc/start{url}"));
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let mut browser = Browser::new();
    let step = browser.request("GET", &start, None);
    let authorize = step.location.expect("to the IdP");
    let back = browser.sign_in_at_idp(&authorize, &server.url("/auth/oidc/callback"), "olivia", PERSONA_PASSWORD);
    let step = browser.request("GET", &back, None);
    let loopback = step.location.expect("to the CLI's loopback port");
    assert!(loopback.starts_with("http://127.0.0.1:"), "{loopback}");
    let page = browser.request("GET", &loopback, None);
    assert!(page.body.contains("Signed in to Capstan"), "{}", page.body);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the CLI should finish once the browser is back");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(status.success(), "{out}");
    assert!(out.contains("as olivia"), "{out}");
    // the stored token works for the next command
    let mut whoami = capstan();
    whoami.args(["call", "auth.whoami", "--url", &server.url("")]).env("XDG_CONFIG_HOME", &config);
    let exited = run_to_exit(whoami);
    assert!(succeeded(&exited).contains("olivia"), "{exited:?}");

    // a server without an identity provider says so
    let plain = Capstan::dev(&dir.path().join("plain"));
    let mut login = capstan();
    login.args(["login", "--oidc", "--no-browser", "--url", &plain.url("")]).env("XDG_CONFIG_HOME", &config);
    run_to_exit(login).assert_refused(1, "platform-oidc-off");
}
