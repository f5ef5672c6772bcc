//! The mail manager end to end, with real processes only: `capstan serve --dev` (the mail plugin
//! embedded and installed first-party), the test mail gateway (`tests/peers/gateway`: the gateway
//! protocol over HTTP and a real SMTP submission listener with AUTH), Python's `smtplib` as the
//! service's mail client, and the HTTP API.
//!
//! One scenario, in order: Capstan not enrolled at the gateway, the pass is `gateway-unconfigured`
//! naming the bootstrap; enrolled (`capstan gateway bootstrap`, the manager asking under that
//! credential) but the gateway down, `gateway-unreachable` and nothing bound; the gateway up, a service
//! with two addresses gets a credential and a forward target per address at the gateway and the
//! `MAIL_<TOKEN>_SMTP_*` and `SMTP_*` secrets in its resolved manifest; the password Capstan
//! holds is the one the gateway accepts (by its verifier), a real message submitted with it is
//! accepted and a wrong password refused; removing an address revokes exactly its credential,
//! target and secrets; the gateway down again leaves everything as it was while a new address
//! waits, and comes through once it is back; deleting the service leaves nothing at the gateway.

use crate::support::{Capstan, EXIT_TIMEOUT, TEST_ADMIN, capstan, eventually, free_port, ok, with_test_admin};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a pass may take to show: the loop wakes on the service's events or every 5 s after
/// a gateway failure; a loaded CI machine is slow.
const SETTLED: Duration = Duration::from_secs(90);
pub(crate) const TOKEN: &str = "gateway-token-for-capstan-e2e";
/// The test gateway's admin token (what an administrator hands to `capstan gateway bootstrap`).
pub(crate) const ADMIN_TOKEN: &str = "gwadmin-planted-7f3c9a1e-e2e";

/// Whether the test gateway can run here (python3 with aiosmtpd); when it cannot, the caller
/// skips (this says why) unless `CAPSTAN_TEST_REQUIRE_GATEWAY` is set (`.ci/run` sets it).
pub(crate) fn gateway_available() -> bool {
    let ok = Command::new("python3").args(["-c", "import aiosmtpd"]).output().is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("CAPSTAN_TEST_REQUIRE_GATEWAY").is_some() {
        panic!("CAPSTAN_TEST_REQUIRE_GATEWAY is set but python3 cannot import aiosmtpd (python3 -m pip install aiosmtpd)");
    }
    if !ok {
        eprintln!(
            "skipped: python3 cannot import aiosmtpd (python3 -m pip install aiosmtpd); CAPSTAN_TEST_REQUIRE_GATEWAY makes this a failure"
        );
    }
    ok
}

/// The loopback address a [`Gateway::start_forwarding`] gateway admits as a private source
/// (`--private-source 127.0.0.2/32`): a `public: false` route is forwarded to requests from it
/// ([`Gateway::forward_private`]) and refused `route-not-public` from 127.0.0.1 ([`Gateway::forward`]).
#[allow(dead_code)] // for the routes tests; not every one is used yet
pub(crate) const PRIVATE_SOURCE: &str = "127.0.0.2";

/// The test gateway on fixed ports with its state in `state`.
pub(crate) struct Gateway {
    child: Child,
    pub(crate) http: u16,
    /// The port of its forwarding listener (`--forward-port`), when started with one.
    pub(crate) forward: Option<u16>,
}

impl Gateway {
    pub(crate) fn start(http: u16, smtp: u16, state: &Path) -> Gateway {
        Gateway::spawn(http, smtp, None, state)
    }

    /// The gateway with its forwarding listener on `forward` too (routes forwarded by `Host`),
    /// admitting [`PRIVATE_SOURCE`] for routes that are not public.
    #[allow(dead_code)] // for the routes tests; not every one is used yet
    pub(crate) fn start_forwarding(http: u16, smtp: u16, forward: u16, state: &Path) -> Gateway {
        Gateway::spawn(http, smtp, Some(forward), state)
    }

    fn spawn(http: u16, smtp: u16, forward: Option<u16>, state: &Path) -> Gateway {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/peers/gateway/gateway.py");
        let mut command = Command::new("python3");
        command
            .arg(script)
            .args(["--http-port", &http.to_string(), "--smtp-port", &smtp.to_string(), "--token", TOKEN])
            .args(["--admin-token", ADMIN_TOKEN]);
        if let Some(forward) = forward {
            command.args(["--forward-port", &forward.to_string(), "--private-source", &format!("{PRIVATE_SOURCE}/32")]);
        }
        let mut child = command
            .args(["--domain", "acme.example", "--state"])
            .arg(state)
            .stdout(Stdio::piped())
            // its request log, kept beside its state for a failing run
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(state.with_extension("log")).unwrap())
            .spawn()
            .expect("starting tests/peers/gateway/gateway.py");
        let mut ready = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut ready).unwrap();
        assert!(ready.starts_with("gateway ready"), "the test gateway did not start: {ready:?}");
        if let Some(forward) = forward {
            assert!(ready.trim_end().ends_with(&format!(" forward={forward}")), "no forwarding listener: {ready:?}");
        }
        Gateway { child, http, forward }
    }

    fn forward_port(&self) -> u16 {
        self.forward.expect("the test gateway was started without a forwarding listener (Gateway::start_forwarding)")
    }

    /// `GET <path>` on the forwarding listener from 127.0.0.1 with `Host: <host>`: the status and
    /// body the gateway passed back from the route's target (or its own refusal, e.g. 404
    /// `route-unknown`, 403 `route-not-public`, 502 `route-target-unreachable`). Redirects are
    /// not followed.
    #[allow(dead_code)] // for the routes tests; not every one is used yet
    pub(crate) fn forward(&self, host: &str, path: &str) -> (u16, String) {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).max_redirects(0).build().into();
        let mut response = agent
            .get(format!("http://127.0.0.1:{}{path}", self.forward_port()))
            .header("host", host)
            .call()
            .expect("the test gateway's forwarding listener answers");
        let status = response.status().as_u16();
        (status, response.body_mut().read_to_string().unwrap_or_default())
    }

    /// [`Gateway::forward`] from [`PRIVATE_SOURCE`], which the gateway admits for routes that are
    /// not public (sent by python3's http.client: it binds the source address).
    #[allow(dead_code)] // for the routes tests; not every one is used yet
    pub(crate) fn forward_private(&self, host: &str, path: &str) -> (u16, String) {
        let script = "import http.client, sys\n\
            port, source, host, path = sys.argv[1:]\n\
            c = http.client.HTTPConnection('127.0.0.1', int(port), timeout=30, source_address=(source, 0))\n\
            c.request('GET', path, headers={'Host': host})\n\
            r = c.getresponse()\n\
            sys.stdout.write(str(r.status) + '\\n')\n\
            sys.stdout.flush()\n\
            sys.stdout.buffer.write(r.read())\n";
        let out = Command::new("python3")
            .args(["-c", script, &self.forward_port().to_string(), PRIVATE_SOURCE, host, path])
            .output()
            .expect("running python3");
        assert!(out.status.success(), "forwarding from {PRIVATE_SOURCE} failed: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (status, body) = text.split_once('\n').unwrap_or((&text, ""));
        (status.parse().expect("a status line"), body.to_string())
    }

    /// `GET /v1/routes` with the admin token: every client's routes, `{"routes": [...]}`.
    pub(crate) fn routes(&self) -> Value {
        let (status, routes) = self.admin("GET", "/v1/routes", None);
        assert_eq!(status, 200, "GET /v1/routes with the admin token: {routes}");
        routes
    }

    /// `method` on `path` with the gateway's admin token (what the gateway's own operator does):
    /// the status and the JSON answer (`null` for none).
    pub(crate) fn admin(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let url = format!("http://127.0.0.1:{}{path}", self.http);
        let bearer = format!("Bearer {ADMIN_TOKEN}");
        let sent = match (method, body) {
            ("GET", _) => agent.get(&url).header("authorization", &bearer).call(),
            ("DELETE", _) => agent.delete(&url).header("authorization", &bearer).call(),
            ("PUT", Some(body)) => {
                agent.put(&url).header("authorization", &bearer).header("content-type", "application/json").send(body.to_string())
            }
            other => panic!("Gateway::admin does not send {other:?}"),
        };
        let mut response = sent.expect("the test gateway answers");
        let text = response.body_mut().read_to_string().unwrap_or_default();
        (response.status().as_u16(), serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub(crate) fn get(&self, path: &str) -> (u16, Value) {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut response = agent
            .get(format!("http://127.0.0.1:{}{path}", self.http))
            .header("authorization", format!("Bearer {TOKEN}"))
            .call()
            .expect("the test gateway answers");
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    /// `PUT` a JSON body (the test-only `/test/faults`).
    pub(crate) fn put(&self, path: &str, body: Value) -> Value {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut response =
            agent.put(format!("http://127.0.0.1:{}{path}", self.http)).send(body.to_string()).expect("the test gateway answers");
        serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap_or(Value::Null)
    }

    /// The ids of the credentials and of the forward targets whose id starts with `prefix`.
    pub(crate) fn held(&self, prefix: &str) -> (Vec<String>, Vec<Value>) {
        let ids = |v: &Value, field: &str| -> Vec<Value> { v[field].as_array().cloned().unwrap_or_default() };
        let credentials = ids(&self.get(&format!("/v1/smtp-credentials?prefix={prefix}")).1, "credentials");
        let targets = ids(&self.get(&format!("/v1/smtp-forward-targets?prefix={prefix}")).1, "targets");
        let mut names: Vec<String> = credentials.iter().map(|c| c["id"].as_str().unwrap().to_string()).collect();
        names.sort();
        (names, targets)
    }

    pub(crate) fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Submit one message over SMTP with AUTH (Python's smtplib, as a service would): `Ok` when the
/// listener accepted it, else what it answered.
fn submit(port: u16, username: &str, password: &str, from: &str, to: &str) -> Result<(), String> {
    let script = "import smtplib, sys\n\
        port, user, password, sender, rcpt = sys.argv[1:]\n\
        s = smtplib.SMTP('127.0.0.1', int(port), timeout=20)\n\
        try:\n    s.login(user, password)\n    s.sendmail(sender, [rcpt], 'Subject: capstan e2e\\r\\n\\r\\nhello from a service\\r\\n')\n\
        except smtplib.SMTPException as e:\n    print(e, file=sys.stderr); sys.exit(1)\n\
        finally:\n    s.close()\n";
    let out = Command::new("python3").args(["-c", script, &port.to_string(), username, password, from, to]).output().unwrap();
    if out.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&out.stderr).to_string()) }
}

/// The keys of the service's newest resolved manifest.
pub(crate) fn manifest_keys(server: &Capstan, admin: &str, service_id: &str) -> Vec<String> {
    let manifest = ok(server, admin, "secrets.getManifest", json!({ "serviceId": service_id }));
    let mut keys: Vec<String> = manifest["entries"]["production"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
    keys.sort();
    keys
}

/// `services.update` of `fields`, read-modify-write: the mail manager writes the service's `mail`
/// record too, so a conflict is read again and retried.
pub(crate) fn update_service(server: &Capstan, admin: &str, service_id: &str, fields: Value) -> Value {
    eventually(&format!("services.update {fields}"), SETTLED, || {
        let current = ok(server, admin, "services.get", json!({ "id": service_id }));
        let mut body = fields.clone();
        body["id"] = json!(service_id);
        body["expectedRevision"] = current["revision"].clone();
        let reply = server.call_as(admin, "services.update", &body);
        if reply.status == 200 { Ok(reply.json()) } else { Err(reply.body.clone()) }
    })
}

/// Capstan enrolled at the test gateway at `url` as `client_id`, as an administrator does it: the
/// host settings (`gatewayUrl`, `gatewayClientId`, `gatewayDnsRecordAddresses`), then `capstan
/// gateway bootstrap` with the admin token piped in, until the enrollment is ready. The managers
/// reach the gateway under that credential (the plugin import `gateway`).
pub(crate) fn enroll_at_gateway(server: &Capstan, admin: &str, url: &str, client_id: &str, config: &Path) {
    let revision = ok(server, admin, "settings.get", json!({}))["revision"].clone();
    let settings = json!({ "gatewayUrl": url, "gatewayClientId": client_id, "gatewayDnsRecordAddresses": ["10.0.0.0/8"] });
    ok(server, admin, "settings.update", json!({ "expectedRevision": revision, "set": settings }));
    let mut cmd = capstan();
    cmd.args(["gateway", "bootstrap", "--gateway-url", url, "--client-id", client_id, "--json"]);
    cmd.env("CAPSTAN_URL", server.url("")).env("CAPSTAN_TOKEN", admin).env("XDG_CONFIG_HOME", config);
    let exited = crate::plugins::run(cmd, format!("{ADMIN_TOKEN}\n").as_bytes(), EXIT_TIMEOUT);
    assert!(exited.status.success(), "{exited:?}");
    eventually("the gateway enrollment ready", Duration::from_secs(120), || {
        let state = ok(server, admin, "gateway.getEnrollmentState", json!({}));
        if state["state"] == "ready" { Ok(()) } else { Err(state.to_string()) }
    });
}

fn group(token: &str) -> Vec<String> {
    ["HOST", "PASSWORD", "PORT", "TLS", "USER"].iter().map(|f| format!("MAIL_{token}_SMTP_{f}")).collect()
}

const SMTP_ALIASES: [&str; 5] = ["SMTP_HOST", "SMTP_PASSWORD", "SMTP_PORT", "SMTP_TLS", "SMTP_USER"];

#[test]
fn a_services_addresses_are_bound_at_the_gateway_delivered_as_secrets_withdrawn_exactly_and_survive_the_gateway_down() {
    if !gateway_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (http, smtp) = (free_port(), free_port());
    let state = dir.path().join("gateway-state.json");
    let mut cmd = with_test_admin(capstan());
    cmd.args(["serve", "--dev", "--data-dir"]).arg(dir.path().join("data")).args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    let server = Capstan::start(cmd);
    server.ready_status();
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    eventually("the mail plugin running", Duration::from_secs(180), || {
        let reply = server.call_as(&admin, "plugins.get", &json!({ "id": "mail" }));
        if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
    });
    let stopped_by = |code: &str| {
        eventually(&format!("the mail pass stopped by {code}"), SETTLED, || {
            let targets = ok(&server, &admin, "mail.listServiceTargets", json!({}));
            if targets["gateway"]["error"]["code"] == code { Ok(targets) } else { Err(targets.to_string()) }
        })
    };

    // ---- a service with two addresses and a published SMTP port ----
    let org_id = ok(&server, &admin, "organizations.create", json!({ "name": "acme" }))["id"].as_str().unwrap().to_string();
    let service = ok(
        &server,
        &admin,
        "services.create",
        json!({
            "organizationId": org_id, "name": "web", "image": "registry.example.com/web:1",
            "ports": [{ "port": 2525, "protocol": "tcp", "publicPort": 30025 }],
            "mailAddresses": ["web@acme.example", "ops@acme.example"],
        }),
    );
    let service_id = service["id"].as_str().unwrap().to_string();
    let prefix = format!("capstan.{service_id}.");
    let settings = ok(&server, &admin, "settings.get", json!({}));
    // a setting in the wrong shape is refused when it is set, not found out by a pass
    for (key, wrong) in [("mail.submissionTls", json!("plaintext")), ("mail.submissionPort", json!(0))] {
        let reply = server.call_as(&admin, "settings.update", &json!({ "expectedRevision": settings["revision"], "set": { key: wrong } }));
        reply.expect_error(400, "setting-invalid");
    }
    let set = json!({
        "mail.submissionHost": "127.0.0.1",
        "mail.submissionPort": smtp,
        "mail.submissionTls": "none",
        "mail.forwardTargetHost": "10.0.0.5",
    });
    ok(&server, &admin, "settings.update", json!({ "expectedRevision": settings["revision"], "set": set }));

    // ---- not enrolled: unconfigured, naming the bootstrap ----
    let unconfigured = stopped_by("gateway-unconfigured");
    assert!(unconfigured["gateway"]["error"]["message"].as_str().unwrap().contains("capstan gateway bootstrap"), "{unconfigured}");
    // the manager has no gateway setting of its own any more
    let revision = ok(&server, &admin, "settings.get", json!({}))["revision"].clone();
    let own_url = json!({ "expectedRevision": revision, "set": { "mail.gatewayUrl": "http://127.0.0.1:1" } });
    server.call_as(&admin, "settings.update", &own_url).expect_error(400, "setting-unknown");
    // ---- enrolled, but the gateway down: unreachable, nothing bound ----
    // the submission host unset first, so that no pass reaches the gateway while it is enrolled
    // and up; set again once it is down
    let revision = ok(&server, &admin, "settings.get", json!({}))["revision"].clone();
    ok(&server, &admin, "settings.update", json!({ "expectedRevision": revision, "unset": ["mail.submissionHost"] }));
    eventually("the mail pass stopped by the unset submission host", SETTLED, || {
        let targets = ok(&server, &admin, "mail.listServiceTargets", json!({}));
        let error = &targets["gateway"]["error"];
        if error["code"] == "gateway-unconfigured" && error["message"].as_str().is_some_and(|m| m.contains("mail.submissionHost")) {
            Ok(())
        } else {
            Err(targets.to_string())
        }
    });
    let gateway = Gateway::start(http, smtp, &state);
    enroll_at_gateway(&server, &admin, &format!("http://127.0.0.1:{http}"), "capstan-mail-e2e", &dir.path().join("config"));
    gateway.stop();
    let revision = ok(&server, &admin, "settings.get", json!({}))["revision"].clone();
    ok(&server, &admin, "settings.update", json!({ "expectedRevision": revision, "set": { "mail.submissionHost": "127.0.0.1" } }));
    let down = stopped_by("gateway-unreachable");
    let addresses = &down["services"][0]["addresses"];
    assert!(addresses.as_array().unwrap().iter().all(|a| a["state"] == "pending"), "nothing is bound while the gateway is down: {down}");
    assert!(manifest_keys(&server, &admin, &service_id).is_empty(), "no secret without the gateway");

    // ---- the gateway up: both addresses bound, their secrets in the manifest ----
    let gateway = Gateway::start(http, smtp, &state);
    let mail_of = || ok(&server, &admin, "mail.getServiceMail", json!({ "organizationId": org_id, "serviceId": service_id }));
    let all_active = |count: usize| {
        eventually("every address active", SETTLED, || {
            let mail = mail_of();
            let list = mail["addresses"].as_array().unwrap();
            if list.len() == count && list.iter().all(|a| a["state"] == "active") { Ok(mail) } else { Err(mail.to_string()) }
        })
    };
    all_active(2);
    // the first address is the default sender once its SMTP_* group is written
    let mail = eventually("the default sender", SETTLED, || {
        let mail = mail_of();
        if mail["addresses"][0]["defaultSender"] == true { Ok(mail) } else { Err(mail.to_string()) }
    });
    let web = mail["addresses"][0].clone();
    assert_eq!((web["address"].as_str(), &mail["addresses"][1]["defaultSender"]), (Some("web@acme.example"), &json!(false)), "{mail}");
    // a service Capstan does not run: the forward host alone, no alternates
    assert_eq!(web["inbound"], json!({ "host": "10.0.0.5", "port": 30025, "alternates": [] }), "{mail}");
    let mut expected: Vec<String> = group("WEB_ACME_EXAMPLE").into_iter().chain(group("OPS_ACME_EXAMPLE")).collect();
    expected.extend(SMTP_ALIASES.iter().map(|k| k.to_string()));
    expected.sort();
    eventually("the manifest carrying both groups and the SMTP_* aliases", SETTLED, || {
        let keys = manifest_keys(&server, &admin, &service_id);
        if keys == expected { Ok(()) } else { Err(format!("{keys:?}")) }
    });
    let (credentials, targets) = gateway.held(&prefix);
    assert_eq!(credentials, [format!("{prefix}OPS_ACME_EXAMPLE"), format!("{prefix}WEB_ACME_EXAMPLE")]);
    assert_eq!(targets.len(), 2, "a forward target per address: {targets:?}");
    assert!(targets.iter().all(|t| t["host"] == "10.0.0.5" && t["port"] == 30025 && t["alternates"] == json!([])), "{targets:?}");
    // the gateway takes alternates on a direct target, answers them, and refuses malformed ones
    let (status, answer) = gateway.admin("GET", "/v1/status", None);
    assert_eq!((status, &answer["smtpForwardAlternates"]), (200, &json!(true)), "{answer}");
    let spare = "/v1/smtp-forward-targets/e2e.alternates";
    let alternates = json!([{ "host": "10.0.0.7", "port": 30025 }, { "host": "10.0.0.8", "port": 30025 }]);
    let body = json!({ "address": "spare@acme.example", "host": "10.0.0.6", "port": 30025, "alternates": alternates });
    let (status, answer) = gateway.admin("PUT", spare, Some(body));
    assert_eq!((status, &answer["alternates"]), (200, &alternates), "{answer}");
    for bad in [
        json!([{ "host": "10.0.0.6", "port": 30025 }]),
        json!([{ "host": "10.0.0.7", "port": 30025 }, { "host": "10.0.0.7", "port": 30025 }]),
        json!([{ "host": "10.0.0.7", "port": 0 }]),
        json!([{ "host": "10.0.0.7", "port": 30025, "weight": 1 }]),
        json!((0..17).map(|i| json!({ "host": format!("10.0.1.{i}"), "port": 25 })).collect::<Vec<_>>()),
    ] {
        let body = json!({ "address": "spare@acme.example", "host": "10.0.0.6", "port": 30025, "alternates": bad });
        let (status, answer) = gateway.admin("PUT", spare, Some(body));
        assert_eq!((status, &answer["error"]["code"]), (400, &json!("invalid-request")), "{bad}: {answer}");
    }
    assert_eq!(gateway.admin("DELETE", spare, None).0, 204);

    // ---- the service's mail facet carries the public metadata, fenced by its revision ----
    let record = eventually("the service's mail record", SETTLED, || {
        let service = ok(&server, &admin, "services.get", json!({ "id": service_id }));
        if service["facets"]["mail"]["bindings"].as_array().is_some_and(|m| m.len() == 2) { Ok(service) } else { Err(service.to_string()) }
    });
    assert_eq!(
        record["facets"]["mail"]["bindings"][0],
        json!({
            "address": "web@acme.example", "smtpUsername": web["username"], "credentialVersion": 1,
            "inbound": { "host": "10.0.0.5", "port": 30025, "alternates": [] }, "targetType": "direct", "retired": false,
        }),
        "{record}"
    );
    let forged = server.call_as(
        &admin,
        "services.update",
        &json!({ "id": service_id, "expectedRevision": record["revision"], "facets": { "mail": { "bindings": [] } } }),
    );
    forged.expect_error(400, "invalid-request"); // only the mail manager writes its facet

    // ---- the password Capstan holds is the gateway's; real mail goes through with it ----
    let checked = ok(&server, &admin, "mail.checkServiceMail", json!({ "organizationId": org_id, "serviceId": service_id }));
    assert!(checked["addresses"].as_array().unwrap().iter().all(|a| a["credential"] == "match"), "{checked}");
    let web_id = format!("{prefix}WEB_ACME_EXAMPLE");
    let password = gateway.get(&format!("/test/passwords/{web_id}")).1["password"].as_str().unwrap().to_string();
    let username = web["username"].as_str().unwrap();
    submit(smtp, username, &password, "web@acme.example", "someone@elsewhere.example")
        .expect("a message submitted with the service's credential");
    let messages = gateway.get("/test/messages").1;
    assert_eq!(messages["messages"][0]["username"], username, "{messages}");
    assert_eq!(messages["messages"][0]["mailFrom"], "web@acme.example", "{messages}");
    let wrong = submit(smtp, username, "not-the-password", "web@acme.example", "someone@elsewhere.example").unwrap_err();
    assert!(wrong.contains("535"), "a wrong password is refused: {wrong}");
    let foreign = submit(smtp, username, &password, "ops@acme.example", "someone@elsewhere.example").unwrap_err();
    assert!(foreign.contains("553"), "a credential sends only as its own address: {foreign}");

    // ---- removing an address revokes exactly its credential, target and secrets ----
    update_service(&server, &admin, &service_id, json!({ "mailAddresses": ["web@acme.example"] }));
    eventually("the removed address gone from the gateway", SETTLED, || {
        let (credentials, targets) = gateway.held(&prefix);
        if credentials == [web_id.clone()] && targets.len() == 1 { Ok(()) } else { Err(format!("{credentials:?} {targets:?}")) }
    });
    eventually("the removed address's record gone with it", SETTLED, || {
        let record = ok(&server, &admin, "services.get", json!({ "id": service_id }));
        if record["facets"]["mail"]["bindings"].as_array().map(Vec::len) == Some(1) { Ok(()) } else { Err(record.to_string()) }
    });
    let mut kept: Vec<String> = group("WEB_ACME_EXAMPLE").into_iter().chain(SMTP_ALIASES.iter().map(|k| k.to_string())).collect();
    kept.sort();
    eventually("only the kept address's secrets resolving", SETTLED, || {
        let keys = manifest_keys(&server, &admin, &service_id);
        if keys == kept { Ok(()) } else { Err(format!("{keys:?}")) }
    });
    submit(smtp, username, &password, "web@acme.example", "someone@elsewhere.example").expect("the kept address still sends");

    // ---- the gateway down: nothing changes, a new address waits, and comes through after ----
    gateway.stop();
    update_service(&server, &admin, &service_id, json!({ "mailAddresses": ["web@acme.example", "sales@acme.example"] }));
    let down = stopped_by("gateway-unreachable");
    let listed = &down["services"][0]["addresses"];
    assert_eq!(listed[0]["state"], "active", "what was bound stays bound: {down}");
    assert_eq!(listed[1]["state"], "pending", "{down}");
    assert_eq!(manifest_keys(&server, &admin, &service_id), kept, "no secret changes while the gateway is down");
    let gateway = Gateway::start(http, smtp, &state);
    all_active(2);
    let (credentials, _) = gateway.held(&prefix);
    assert_eq!(credentials, [format!("{prefix}SALES_ACME_EXAMPLE"), web_id.clone()]);
    assert!(manifest_keys(&server, &admin, &service_id).contains(&"MAIL_SALES_ACME_EXAMPLE_SMTP_PASSWORD".to_string()));

    // ---- the page shows it ----
    let cookie = format!("capstan_session={admin}");
    let page = server.request("GET", "/p/mail", &[("cookie", &cookie), ("accept", "text/html")], None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(r#"data-address="sales@acme.example""#) && page.body.contains("10.0.0.5:30025"), "{}", page.body);

    // ---- deleting the service leaves nothing at the gateway ----
    let deleting = eventually("services.delete", SETTLED, || {
        let current = ok(&server, &admin, "services.get", json!({ "id": service_id }));
        let reply = server.call_as(&admin, "services.delete", &json!({ "id": service_id, "expectedRevision": current["revision"] }));
        if reply.status == 200 { Ok(reply.json()) } else { Err(reply.body.clone()) }
    });
    assert_eq!(deleting["state"], "deleting", "the mail manager holds it until the gateway forgot it: {deleting}");
    eventually("the service deleted", SETTLED, || {
        let reply = server.call_as(&admin, "services.get", &json!({ "id": service_id }));
        if reply.status == 404 { Ok(()) } else { Err(reply.body.clone()) }
    });
    assert_eq!(gateway.held(&prefix), (Vec::new(), Vec::new()), "nothing of the service is left at the gateway");
    gateway.stop();
    let exited = server.stop();
    assert!(!exited.stderr.contains(&password), "no password in the log");
}
