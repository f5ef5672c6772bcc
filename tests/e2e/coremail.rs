//! The CoreMail control plane end to end, with real processes only: `capstan serve --dev` (the
//! coremail plugin embedded and installed first-party), the test CoreMail
//! (`tests/peers/coremail`: the control protocol of docs/coremail-protocol.md) and the HTTP API.
//!
//! One scenario, in order: off, the status is `{enabled: false}` alone; settings in the wrong
//! shape are refused when they are set and the epoch is no setting at all; on, the CoreMail
//! service receives its environment (the control bootstrap with verifiers only, the gateway
//! credential) while CoreMail refuses the control credential it cannot check yet; with the
//! bootstrap, the desired state is applied at epoch 1 with the quotas clamped; an unchanged
//! pass writes nothing (no preparation, no record, no secret version); a settings change is a
//! new epoch; a CoreMail that lost its state gets the same epoch again, one that kept it after a
//! Capstan restart nothing; a rotated control credential keeps its predecessor retiring for 15
//! minutes; statistics come from CoreMail; off again, `{enabled: false}`.

use crate::support::{Capstan, TEST_ADMIN, capstan, eventually, free_port, ok, with_test_admin};
use capstan_core::clock::now_ms;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a pass may take to show: every 10 s, 1 s after an event, 5 s after a failure.
const SETTLED: Duration = Duration::from_secs(90);

/// The test CoreMail on a fixed port, reading its bootstrap from `bootstrap`.
struct CoreMail {
    child: Child,
    port: u16,
}

impl CoreMail {
    fn start(port: u16, bootstrap: &Path, state: Option<&Path>) -> CoreMail {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/peers/coremail/coremail.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).args(["--port", &port.to_string(), "--bootstrap-file"]).arg(bootstrap);
        if let Some(state) = state {
            cmd.arg("--state").arg(state);
        }
        let log = std::fs::OpenOptions::new().create(true).append(true).open(bootstrap.with_extension("log")).unwrap();
        let mut child = cmd.stdout(Stdio::piped()).stderr(log).spawn().expect("starting tests/peers/coremail/coremail.py");
        let mut ready = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut ready).unwrap();
        assert!(ready.starts_with("coremail ready"), "the test CoreMail did not start: {ready:?}");
        CoreMail { child, port }
    }

    fn request(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let mut response = match body {
            Some(body) => agent.post(&url).content_type("application/json").send(body.to_string()),
            None if method == "GET" => agent.get(&url).call(),
            None => agent.post(&url).send_empty(),
        }
        .expect("the test CoreMail answers");
        let text = response.body_mut().read_to_string().unwrap();
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    fn counters(&self) -> Value {
        self.request("GET", "/test/counters", None)
    }
}

impl Drop for CoreMail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_capstan(data: &Path) -> (Capstan, String) {
    let mut cmd = with_test_admin(capstan());
    cmd.args(["serve", "--dev", "--data-dir"]).arg(data).args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    // the test CoreMail is on loopback
    cmd.env("CAPSTAN_PLUGIN_HTTP_ALLOW", "127.0.0.0/8");
    let server = Capstan::start(cmd);
    server.ready_status();
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    eventually("the coremail plugin running", Duration::from_secs(180), || {
        let reply = server.call_as(&admin, "plugins.get", &json!({ "id": "coremail" }));
        if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
    });
    (server, admin)
}

fn set(server: &Capstan, admin: &str, values: Value) -> Value {
    let settings = ok(server, admin, "settings.get", json!({}));
    server.call_as(admin, "settings.update", &json!({ "expectedRevision": settings["revision"], "set": values })).expect_json(200)
}

/// The CoreMail service's secrets: key → active version (revoked ones left out).
fn environment(server: &Capstan, admin: &str, service_id: &str) -> Vec<(String, String)> {
    let listed = ok(server, admin, "secrets.list", json!({ "owner": { "kind": "service", "serviceId": service_id }, "limit": 200 }));
    let mut out: Vec<(String, String)> = listed["items"]
        .as_array()
        .or(listed["secrets"].as_array())
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| if s.get("secret").is_some() { s["secret"].clone() } else { s.clone() })
        .filter(|s| s["state"] == "active")
        .map(|s| (s["key"].as_str().unwrap_or_default().to_string(), s["activeVersion"].to_string()))
        .collect();
    out.sort();
    out
}

#[test]
fn the_coremail_control_plane_prepares_a_strictly_increasing_epoch_delivers_verifiers_only_and_writes_nothing_unchanged() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: python3 is not installed (the test CoreMail is a Python script)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut server, mut admin) = start_capstan(&data);
    let status = |server: &Capstan, admin: &str| ok(server, admin, "coremail.getControlStatus", json!({}));

    // ---- off: enabled false and nothing else ----
    assert_eq!(status(&server, &admin), json!({ "enabled": false }));

    // ---- wrong shapes refused at edit time; the epoch is no setting ----
    for (key, wrong) in [
        ("coremail.coreMailControlEndpointUrl", json!("https://coremail.example")),
        ("coremail.coreMailControlEndpointUrl", json!("https://coremail.example/socket/")),
        ("coremail.coreMailControlEndpointUrl", json!("http://coremail.example/socket")),
        ("coremail.coreMailTransferOrigin", json!("https://transfer.example/")),
        ("coremail.coreMailGatewayEndpointUrl", json!("wss://gateway.example")),
        ("coremail.coreMailServiceId", json!("coremail")),
        ("coremail.coreMailSmtpTlsMode", json!("plaintext")),
        ("coremail.coreMailDefaultMessagesPerMinute", json!(0)),
    ] {
        let settings = ok(&server, &admin, "settings.get", json!({}));
        let reply = server.call_as(&admin, "settings.update", &json!({ "expectedRevision": settings["revision"], "set": { key: wrong } }));
        let refusal = reply.expect_error(400, "setting-invalid");
        assert!(refusal.to_string().contains(key.split('.').nth(1).unwrap()), "the refusal names the setting: {refusal}");
    }
    let settings = ok(&server, &admin, "settings.get", json!({}));
    let epoch_write = server.call_as(
        &admin,
        "settings.update",
        &json!({ "expectedRevision": settings["revision"], "set": { "coremail.coreMailConfigEpoch": 99 } }),
    );
    epoch_write.expect_error(400, "setting-unknown");

    // ---- on, CoreMail running without its bootstrap yet ----
    let org_id = ok(&server, &admin, "organizations.create", json!({ "name": "mailops" }))["id"].as_str().unwrap().to_string();
    let service_id = create(&server, &admin, &org_id, json!({ "name": "coremail", "image": "registry.example.com/coremail:1" }));
    let web_id = create(
        &server,
        &admin,
        &org_id,
        json!({ "name": "web", "image": "registry.example.com/web:1", "mailAddresses": ["web@acme.example", "ops@acme.example"] }),
    );
    let port = free_port();
    let bootstrap_file = dir.path().join("bootstrap.json");
    let state_file = dir.path().join("coremail-state.json");
    let mut coremail = CoreMail::start(port, &bootstrap_file, Some(&state_file));
    set(
        &server,
        &admin,
        json!({
            "coremail.coreMailEnabled": true,
            "coremail.coreMailServiceId": service_id,
            "coremail.coreMailControlEndpointUrl": format!("http://127.0.0.1:{port}/socket"),
            "coremail.coreMailTransferOrigin": "https://transfer.mail.example",
            "coremail.coreMailGatewayEndpointUrl": "wss://gateway.mail.example/",
            "coremail.coreMailSmtpHost": "smtp.mail.example",
            "coremail.coreMailDefaultMessagesPerMinute": 100_000,
        }),
    );
    let refused = eventually("CoreMail refusing a credential it cannot check", SETTLED, || {
        let s = status(&server, &admin);
        if s["lastError"]["code"] == "coremail-credential-refused" { Ok(s) } else { Err(s.to_string()) }
    });
    assert_eq!(
        refused["quotas"],
        json!({ "messagesPerMinute": 600, "messagesPerDay": 2000, "maxPendingInbound": 1000 }),
        "clamped: {refused}"
    );
    assert!(refused["epoch"].is_null(), "nothing is prepared before CoreMail's status is read: {refused}");
    let keys: Vec<String> = environment(&server, &admin, &service_id).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        [
            "COREMAIL_CONTROL_BOOTSTRAP",
            "COREMAIL_GATEWAY_CREDENTIAL_ID",
            "COREMAIL_GATEWAY_CREDENTIAL_SECRET",
            "COREMAIL_GATEWAY_CREDENTIAL_VERSION",
            "COREMAIL_GATEWAY_ENDPOINT_URL",
            "COREMAIL_TRANSFER_ORIGIN",
        ],
        "CoreMail's environment: the control credential only as its verifier, in the bootstrap"
    );
    let bootstrap: Value = serde_json::from_str(refused["bootstrap"].as_str().unwrap()).unwrap();
    assert_eq!(bootstrap["credentialId"], "capstan-control");
    let verifier = bootstrap["verifiers"][0]["verifier"].as_str().unwrap();
    assert!(verifier.starts_with("coremail-v1$") && verifier.len() == "coremail-v1$".len() + 32 + 1 + 64, "{verifier}");

    // ---- the bootstrap delivered: epoch 1 applied ----
    std::fs::write(&bootstrap_file, refused["bootstrap"].as_str().unwrap()).unwrap();
    let first = applied_at(&server, &admin, 1);
    assert_eq!(first["coreMail"]["digest"], first["digest"], "{first}");

    // ---- phase 1, dual-write: the binding, its environment beside the direct path's ----
    let binding_id = format!("capstan.{web_id}");
    let record = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    assert_eq!(record["facets"]["coremail"], json!({ "bindingId": binding_id, "want": "dual-write" }), "{record}");
    let forged = server.call_as(
        &admin,
        "services.update",
        &json!({ "id": web_id, "expectedRevision": record["revision"], "facets": { "coremail": null } }),
    );
    forged.expect_error(400, "invalid-request"); // only the CoreMail manager writes its facet
    let mut expected: Vec<String> = [
        "MAIL_COREMAIL_BINDING_ID",
        "MAIL_COREMAIL_CREDENTIAL_ID",
        "MAIL_COREMAIL_CREDENTIAL_SECRET",
        "MAIL_COREMAIL_CREDENTIAL_VERSION",
        "MAIL_COREMAIL_URL",
        "MAIL_FROM",
    ]
    .iter()
    .map(|k| k.to_string())
    .collect();
    for token in ["WEB_ACME_EXAMPLE", "OPS_ACME_EXAMPLE"] {
        for field in [
            "FROM",
            "COREMAIL_URL",
            "COREMAIL_BINDING_ID",
            "COREMAIL_CREDENTIAL_ID",
            "COREMAIL_CREDENTIAL_VERSION",
            "COREMAIL_CREDENTIAL_SECRET",
        ] {
            expected.push(format!("MAIL_{token}_{field}"));
        }
    }
    expected.sort();
    let web_keys =
        |server: &Capstan, admin: &str| -> Vec<String> { environment(server, admin, &web_id).into_iter().map(|(k, _)| k).collect() };
    assert_eq!(web_keys(&server, &admin), expected, "the unscoped group and a complete group per address; SMTP_* stays the direct path's");
    let applied = coremail.request("GET", "/test/applied", None);
    let bound = &applied["desired"]["bindings"][0];
    assert_eq!((bound["bindingId"].as_str(), bound["serviceId"].as_str()), (Some(binding_id.as_str()), Some(web_id.as_str())), "{applied}");
    assert!(bound["credential"]["verifier"].as_str().unwrap().starts_with("coremail-v1$"), "CoreMail gets the verifier: {applied}");
    let phase_of =
        |s: &Value| s["services"].as_array().unwrap().iter().find(|p| p["serviceId"] == web_id.as_str()).cloned().unwrap_or_default();
    assert_eq!(phase_of(&first)["phase"], "dual-write", "{first}");
    coremail.request("POST", &format!("/test/bindings/{binding_id}"), Some(json!({ "status": "active" })));
    eventually("CoreMail reporting the binding active", SETTLED, || {
        let s = status(&server, &admin);
        if phase_of(&s)["coreMailStatus"] == "active" { Ok(()) } else { Err(s.to_string()) }
    });

    // ---- unchanged: passes read and write nothing ----
    let quiet = |server: &Capstan, admin: &str, coremail: &CoreMail| {
        let (before, record, env) = (coremail.counters(), status(server, admin), environment(server, admin, &service_id));
        eventually("two more passes", SETTLED, || {
            let now = coremail.counters();
            if now["statusReads"].as_u64() >= before["statusReads"].as_u64().map(|n| n + 2) { Ok(()) } else { Err(now.to_string()) }
        });
        let after = status(server, admin);
        assert_eq!(coremail.counters()["prepares"], before["prepares"], "nothing prepared");
        assert_eq!(after["preparedRevision"], record["preparedRevision"], "the prepared record unwritten");
        assert_eq!(after["lastPass"], record["lastPass"], "the status record unwritten");
        assert_eq!(after["facets"]["coremail"], record["facets"]["coremail"], "CoreMail's report unchanged, and not rewritten");
        assert_eq!(environment(server, admin, &service_id), env, "no secret version written");
    };
    quiet(&server, &admin, &coremail);

    // ---- a settings change is the next epoch ----
    set(&server, &admin, json!({ "coremail.coreMailSmtpPort": 2587 }));
    let second = applied_at(&server, &admin, 2);
    assert_ne!(second["digest"], first["digest"]);

    // ---- CoreMail lost its state: the same epoch again (it never applied it) ----
    drop(coremail);
    std::fs::remove_file(&state_file).unwrap();
    coremail = CoreMail::start(port, &bootstrap_file, Some(&state_file));
    eventually("the desired state sent again", SETTLED, || {
        let counters = coremail.counters();
        if counters["prepares"].as_u64() >= Some(1) { Ok(()) } else { Err(counters.to_string()) }
    });
    let again = applied_at(&server, &admin, 2);
    assert_eq!(again["preparedRevision"], second["preparedRevision"], "the epoch was not advanced: {again}");

    // ---- Capstan restarted, CoreMail kept its state: nothing to do ----
    server.stop();
    (server, admin) = start_capstan(&data);
    let restarted = status(&server, &admin);
    assert_eq!((restarted["epoch"].clone(), restarted["digest"].clone()), (json!(2), second["digest"].clone()), "{restarted}");
    quiet(&server, &admin, &coremail);

    // ---- the control credential rotated: the previous one retiring for 15 minutes ----
    let before_rotation = now_ms();
    set(&server, &admin, json!({ "coremail.coreMailControlCredentialVersion": 2 }));
    let rotated = eventually("the control credential at version 2", SETTLED, || {
        let s = status(&server, &admin);
        if s["controlCredential"]["version"] == 2 { Ok(s) } else { Err(s.to_string()) }
    });
    let retiring = &rotated["controlCredential"]["retiring"];
    assert_eq!(retiring[0]["version"], 1, "{rotated}");
    let until = retiring[0]["acceptUntil"].as_u64().unwrap();
    assert!(until >= before_rotation + 15 * 60 * 1000 && until <= now_ms() + 15 * 60 * 1000, "{rotated}");
    let bootstrap: Value = serde_json::from_str(rotated["bootstrap"].as_str().unwrap()).unwrap();
    assert_eq!(bootstrap["verifiers"].as_array().map(Vec::len), Some(2), "both verifiers, the old with its deadline: {bootstrap}");
    assert_ne!(bootstrap["verifiers"][0]["verifier"], json!(verifier), "a new secret, a new verifier");
    // CoreMail restarted with its new environment: the rotated credential is accepted, the
    // desired state (naming the new version) is epoch 3
    std::fs::write(&bootstrap_file, rotated["bootstrap"].as_str().unwrap()).unwrap();
    let third = applied_at(&server, &admin, 3);
    assert_eq!(third["controlCredential"]["version"], 2);

    // ---- an address removed: its group goes, the desired state follows (epoch 4) ----
    let current = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    ok(
        &server,
        &admin,
        "services.update",
        json!({ "id": web_id, "expectedRevision": current["revision"], "mailAddresses": ["web@acme.example"] }),
    );
    applied_at(&server, &admin, 4);
    let keys = web_keys(&server, &admin);
    assert!(keys.iter().all(|k| !k.starts_with("MAIL_OPS_")) && keys.contains(&"MAIL_WEB_ACME_EXAMPLE_FROM".to_string()), "{keys:?}");

    // ---- statistics, as CoreMail counts them, per service ----
    let day = "2026-12-01";
    coremail.request(
        "POST",
        "/test/traffic",
        Some(json!({ "bindingId": binding_id, "day": day, "delivered": 3, "acknowledged": 2, "rejected": 1, "received": 4 })),
    );
    let stats = ok(&server, &admin, "coremail.getServiceMailStatistics", json!({ "serviceId": web_id }));
    assert_eq!(
        stats["days"],
        json!([{ "serviceId": web_id, "bindingId": binding_id, "day": day, "delivered": 3, "acknowledged": 2, "rejected": 1, "received": 4 }])
    );

    // ---- off again: every service back on the direct path at once ----
    set(&server, &admin, json!({ "coremail.coreMailEnabled": false }));
    assert_eq!(status(&server, &admin), json!({ "enabled": false }));
    eventually("the web service back on the direct path", SETTLED, || {
        let record = ok(&server, &admin, "services.get", json!({ "id": web_id }));
        let keys = web_keys(&server, &admin);
        if record["facets"]["coremail"].is_null() && keys.is_empty() { Ok(()) } else { Err(format!("{record} {keys:?}")) }
    });
    server.call_as(&admin, "coremail.getServiceMailStatistics", &json!({})).expect_error(400, "coremail-disabled");
    drop(coremail);
}

/// The control status once CoreMail reports `epoch` applied and the last pass stopped on nothing.
fn applied_at(server: &Capstan, admin: &str, epoch: u64) -> Value {
    eventually(&format!("CoreMail applying epoch {epoch}"), SETTLED, || {
        let s = ok(server, admin, "coremail.getControlStatus", json!({}));
        if s["coreMail"]["appliedEpoch"] == epoch && s["coreMail"]["state"] == "applied" && s["lastError"].is_null() {
            Ok(s)
        } else {
            Err(s.to_string())
        }
    })
}

/// A service's phase and step as `coremail.getControlStatus` shows them.
fn phase_of(server: &Capstan, admin: &str, service_id: &str) -> (String, String, Value) {
    let s = ok(server, admin, "coremail.getControlStatus", json!({}));
    let entry = s["services"].as_array().into_iter().flatten().find(|p| p["serviceId"] == service_id).cloned().unwrap_or_default();
    (entry["phase"].as_str().unwrap_or("none").to_string(), entry["want"].as_str().unwrap_or("none").to_string(), s)
}

fn await_phase(server: &Capstan, admin: &str, service_id: &str, phase: &str) -> Value {
    eventually(&format!("the service at {phase}"), SETTLED, || {
        let (now, want, s) = phase_of(server, admin, service_id);
        if now == phase && want == phase { Ok(s) } else { Err(format!("{now} asking {want}: {s}")) }
    })
}

/// The service's resolved manifest: key → the scope of the secret it resolves to.
fn manifest_scopes(server: &Capstan, admin: &str, service_id: &str) -> std::collections::BTreeMap<String, String> {
    let manifest = ok(server, admin, "secrets.getManifest", json!({ "serviceId": service_id }));
    let secrets = ok(server, admin, "secrets.list", json!({ "owner": { "kind": "service", "serviceId": service_id }, "limit": 200 }));
    let listed = secrets["items"].as_array().or(secrets["secrets"].as_array()).cloned().unwrap_or_default();
    let scope_of = |key: &str| {
        listed
            .iter()
            .map(|s| if s.get("secret").is_some() { s["secret"].clone() } else { s.clone() })
            .find(|s| s["key"] == key && s["state"] == "active")
            .map(|s| s["managementScope"].as_str().or(s["scope"].as_str()).unwrap_or("?").to_string())
            .unwrap_or_else(|| "revoked".into())
    };
    manifest["entries"]["production"].as_object().into_iter().flatten().map(|(k, _)| (k.clone(), scope_of(k))).collect()
}

#[test]
fn a_service_walks_the_three_phases_through_the_gateway_keeps_its_phase_over_a_restart_walks_back_and_returns_direct_at_once() {
    if !crate::mail::gateway_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut server, mut admin) = start_capstan(&data);
    let gateway = crate::mail::Gateway::start(free_port(), free_port(), &dir.path().join("gateway-state.json"));

    // ---- the direct path: a service with two addresses bound at the gateway ----
    let org_id = ok(&server, &admin, "organizations.create", json!({ "name": "phases" }))["id"].as_str().unwrap().to_string();
    let coremail_id = create(&server, &admin, &org_id, json!({ "name": "coremail", "image": "registry.example.com/coremail:1" }));
    let web_id = create(
        &server,
        &admin,
        &org_id,
        json!({
            "name": "web", "image": "registry.example.com/web:1",
            "ports": [{ "port": 2525, "protocol": "tcp", "publicPort": 30025 }],
            "mailAddresses": ["web@acme.example", "ops@acme.example"],
        }),
    );
    let prefix = format!("capstan.{web_id}.");
    let gateway_url = format!("http://127.0.0.1:{}", gateway.http);
    crate::mail::enroll_at_gateway(&server, &admin, &gateway_url, "capstan-coremail-e2e", &dir.path().join("config"));
    set(
        &server,
        &admin,
        json!({
            "mail.submissionHost": "127.0.0.1",
            "mail.submissionPort": 2587,
            "mail.submissionTls": "none",
            "mail.forwardTargetHost": "10.0.0.5",
        }),
    );
    let direct_targets = || {
        eventually("both addresses forwarded to the service, with a credential each", SETTLED, || {
            let (credentials, targets) = gateway.held(&prefix);
            let direct = targets.iter().all(|t| t["targetType"] == "direct" && t["host"] == "10.0.0.5" && t["port"] == 30025);
            if credentials.len() == 2 && targets.len() == 2 && direct { Ok(()) } else { Err(format!("{credentials:?} {targets:?}")) }
        })
    };
    direct_targets();

    // ---- CoreMail on: phase 1, dual-write ----
    let port = free_port();
    let bootstrap_file = dir.path().join("bootstrap.json");
    let state_file = dir.path().join("coremail-state.json");
    let coremail = CoreMail::start(port, &bootstrap_file, Some(&state_file));
    set(
        &server,
        &admin,
        json!({
            "coremail.coreMailEnabled": true,
            "coremail.coreMailServiceId": coremail_id,
            "coremail.coreMailControlEndpointUrl": format!("http://127.0.0.1:{port}/socket"),
            "coremail.coreMailTransferOrigin": "https://transfer.mail.example",
            "coremail.coreMailGatewayEndpointUrl": "wss://gateway.mail.example/",
            "coremail.coreMailSmtpHost": "smtp.coremail.example",
            "coremail.coreMailSmtpPort": 2465,
            "coremail.coreMailSmtpTlsMode": "tls",
        }),
    );
    let bootstrap = eventually("the control bootstrap", SETTLED, || {
        let s = status_of(&server, &admin);
        s["bootstrap"].as_str().map(str::to_string).ok_or(s.to_string())
    });
    std::fs::write(&bootstrap_file, bootstrap).unwrap();
    let dual = await_phase(&server, &admin, &web_id, "dual-write");
    // the gateway knows CoreMail as a peer by the verifier of its gateway credential, nothing more
    let peer = eventually("CoreMail registered at the gateway as a peer", SETTLED, || {
        let (status, peer) = gateway.get("/v1/peers/coremail-gateway");
        if status == 200 { Ok(peer) } else { Err(peer.to_string()) }
    });
    assert_eq!(peer["verifiers"], json!([{ "version": 1, "verifier": dual["gatewayCredential"]["verifier"] }]), "{peer}");
    let binding_id = format!("capstan.{web_id}");
    direct_targets();

    // ---- phase 2, inbound cutover: once CoreMail reports the binding active ----
    coremail.request("POST", &format!("/test/bindings/{binding_id}"), Some(json!({ "status": "active" })));
    await_phase(&server, &admin, &web_id, "inbound-cutover");
    let (credentials, targets) = gateway.held(&prefix);
    assert_eq!(credentials.len(), 2, "both environments remain: {credentials:?}");
    assert!(targets.iter().all(|t| t["targetType"] == "coremail" && t["peerId"] == "coremail-gateway"), "inbound at CoreMail: {targets:?}");
    let record = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    assert!(
        record["facets"]["mail"]["bindings"].as_array().unwrap().iter().all(|m| m["targetType"] == "coremail" && m["retired"] == false),
        "{record}"
    );
    let scopes = manifest_scopes(&server, &admin, &web_id);
    assert_eq!(scopes.get("SMTP_PASSWORD").map(String::as_str), Some(format!("mail:{web_id}").as_str()), "{scopes:?}");

    // ---- Capstan restarted in the middle: the phase is derived, not remembered ----
    server.stop();
    (server, admin) = start_capstan(&data);
    let (phase, want, _) = phase_of(&server, &admin, &web_id);
    assert_eq!((phase.as_str(), want.as_str()), ("inbound-cutover", "inbound-cutover"), "unchanged over a restart");

    // ---- phase 3, CoreMail only: once CoreMail reported traffic ----
    coremail.request(
        "POST",
        "/test/traffic",
        Some(json!({ "bindingId": binding_id, "day": "2026-12-03", "delivered": 1, "acknowledged": 0, "rejected": 0, "received": 2 })),
    );
    await_phase(&server, &admin, &web_id, "coremail-only");
    let only = eventually("SMTP_* pointing at CoreMail", SETTLED, || {
        let scopes = manifest_scopes(&server, &admin, &web_id);
        let ours = format!("coremail:{web_id}");
        let keys = ["SMTP_HOST", "SMTP_USER", "SMTP_PASSWORD", "MAIL_WEB_ACME_EXAMPLE_SMTP_USER", "MAIL_OPS_ACME_EXAMPLE_SMTP_PASSWORD"];
        if keys.iter().all(|k| scopes.get(*k) == Some(&ours)) { Ok(scopes) } else { Err(format!("{scopes:?}")) }
    });
    assert!(only.values().all(|scope| *scope == format!("coremail:{web_id}")), "nothing of the direct path resolves: {only:?}");
    let (credentials, targets) = gateway.held(&prefix);
    assert!(credentials.is_empty(), "the direct credentials retired at the gateway: {credentials:?}");
    let record = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    assert!(
        record["facets"]["mail"]["bindings"].as_array().unwrap().iter().all(|m| m["targetType"] == "coremail" && m["retired"] == true),
        "the mail manager's record says what it retired: {record}"
    );
    assert_eq!(targets.len(), 2, "inbound stays with CoreMail: {targets:?}");

    // ---- the binding stops being active: back one phase at a time ----
    coremail.request("POST", &format!("/test/bindings/{binding_id}"), Some(json!({ "status": "failed" })));
    eventually("the direct credentials issued again", SETTLED, || {
        let (credentials, _) = gateway.held(&prefix);
        if credentials.len() == 2 { Ok(()) } else { Err(format!("{credentials:?}")) }
    });
    await_phase(&server, &admin, &web_id, "dual-write");
    direct_targets();
    eventually("SMTP_* the direct path's again", SETTLED, || {
        let scopes = manifest_scopes(&server, &admin, &web_id);
        if scopes.get("SMTP_PASSWORD") == Some(&format!("mail:{web_id}")) { Ok(()) } else { Err(format!("{scopes:?}")) }
    });

    // ---- active again, then CoreMail off: the direct path at once ----
    coremail.request("POST", &format!("/test/bindings/{binding_id}"), Some(json!({ "status": "active" })));
    await_phase(&server, &admin, &web_id, "inbound-cutover");
    set(&server, &admin, json!({ "coremail.coreMailEnabled": false }));
    eventually("the service direct again and CoreMail's peer gone", SETTLED, || {
        let record = ok(&server, &admin, "services.get", json!({ "id": web_id }));
        let (credentials, targets) = gateway.held(&prefix);
        let direct = targets.iter().all(|t| t["targetType"] == "direct") && targets.len() == 2 && credentials.len() == 2;
        let peer = gateway.get("/v1/peers/coremail-gateway").0;
        if record["facets"]["coremail"].is_null() && direct && peer == 404 {
            Ok(())
        } else {
            Err(format!("{record} {targets:?} peer {peer}"))
        }
    });
    let scopes = manifest_scopes(&server, &admin, &web_id);
    assert!(scopes.values().all(|scope| *scope == format!("mail:{web_id}")), "only the direct path resolves: {scopes:?}");
    drop(coremail);
}

/// A service created in `org_id` with `fields`: its id.
fn create(server: &Capstan, admin: &str, org_id: &str, mut fields: Value) -> String {
    fields["organizationId"] = json!(org_id);
    ok(server, admin, "services.create", fields)["id"].as_str().unwrap().to_string()
}

fn status_of(server: &Capstan, admin: &str) -> Value {
    ok(server, admin, "coremail.getControlStatus", json!({}))
}
