//! Capstan's enrollment at the external gateway end to end: `capstan serve --dev`, the test
//! gateway (`tests/peers/gateway`, its client-enrollment endpoints) and `capstan gateway
//! bootstrap | status` as an administrator runs them, the admin token piped in.
//!
//! One scenario, in order: unconfigured, a client id without a URL, the wrong target, a token
//! sealed for another target or not visible ASCII, the gateway down, a token it does not know, a
//! client token — each refused by name with the enrollment unchanged; a finalization the gateway
//! cannot do yet answers degraded, refuses a second bootstrap as pending, and is finalized by
//! Capstan's retry; the held token is the gateway's active credential; a settings change the
//! credential cannot carry is staged until the next bootstrap replaces the credential; a
//! refused provisioning leaves the running one; domains synced in, relay names published and
//! withdrawn; certificates fetched through the gateway — a relay name's by its own relay or an
//! administrator only, the rest of the relay namespace reserved. The admin token is planted and
//! found in no answer, no output, no log and no file of the data directory.

use crate::mail::{ADMIN_TOKEN, Gateway, TOKEN, gateway_available};
use crate::support::{Capstan, EXIT_TIMEOUT, Exited, TEST_ADMIN, capstan, eventually, free_port, with_store, with_test_admin};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

const CLIENT_ID: &str = "capstan-e2e";

struct Cli<'a> {
    server: &'a Capstan,
    admin: String,
    config: PathBuf,
    /// Everything any command printed, searched for the planted token at the end.
    seen: std::cell::RefCell<String>,
}

impl Cli<'_> {
    fn run(&self, args: &[&str], stdin: &[u8]) -> Exited {
        let mut cmd = capstan();
        cmd.args(args).env("CAPSTAN_URL", self.server.url("")).env("CAPSTAN_TOKEN", &self.admin).env("XDG_CONFIG_HOME", &self.config);
        let exited = crate::plugins::run(cmd, stdin, EXIT_TIMEOUT);
        self.seen.borrow_mut().push_str(&format!("{}\n{}\n", exited.stdout, exited.stderr));
        exited
    }

    fn bootstrap(&self, url: &str, client_id: &str, token: &str) -> Exited {
        self.run(&["gateway", "bootstrap", "--gateway-url", url, "--client-id", client_id, "--json"], format!("{token}\n").as_bytes())
    }

    fn refused(&self, url: &str, client_id: &str, token: &str, code: &str) {
        let exited = self.bootstrap(url, client_id, token);
        assert_eq!(exited.status.code(), Some(1), "{code}: {exited:?}");
        let answer: Value = serde_json::from_str(exited.stdout.trim()).unwrap_or_else(|_| panic!("{exited:?}"));
        assert_eq!(answer["error"]["code"], code, "{answer}");
        assert!(answer["error"]["message"].as_str().unwrap().starts_with(&format!("External gateway bootstrap refused: {code}.")));
    }

    fn status(&self) -> Value {
        let exited = self.run(&["gateway", "status", "--json"], b"");
        assert!(exited.status.success(), "{exited:?}");
        serde_json::from_str(exited.stdout.trim()).unwrap()
    }
}

fn set(server: &Capstan, admin: &str, set: Value, unset: &[&str]) -> u16 {
    let revision = server.call_as(admin, "settings.get", &json!({})).expect_json(200)["revision"].clone();
    server.call_as(admin, "settings.update", &json!({ "expectedRevision": revision, "set": set, "unset": unset })).status
}

/// The gateway's client credentials, oldest first is not promised: by id.
fn credentials(gateway: &Gateway) -> Vec<Value> {
    gateway.get("/test/clients").1["credentials"].as_array().cloned().unwrap()
}

/// Every file under `dir`, read whole.
fn every_file(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            every_file(&path, out);
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, bytes));
        }
    }
}

#[test]
fn an_admin_token_enrolls_capstan_at_the_gateway_once_and_is_never_kept() {
    if !gateway_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (http, smtp) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{http}");
    let port = free_port();
    let mut cmd = with_test_admin(capstan());
    cmd.args(["serve", "--dev", "--data-dir"]).arg(&data).args(["--listen", &format!("127.0.0.1:{port}")]);
    cmd.env("CAPSTAN_GATEWAY_RETRY_MS", "300");
    cmd.env("CAPSTAN_AGENT_BINARY", crate::nodes::agent_binary());
    let origin = format!("http://127.0.0.1:{port}");
    let server = Capstan::start(cmd);
    server.ready_status();
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let cli = Cli { server: &server, admin: admin.clone(), config: dir.path().join("config"), seen: Default::default() };

    // ---- nothing configured: bootstrap required, and refused by name ----
    let state = cli.status();
    assert_eq!(state["state"], "admin-bootstrap-required", "{state}");
    assert!(state["reason"].as_str().unwrap().contains("gatewayUrl"), "{state}");
    cli.refused(&url, CLIENT_ID, ADMIN_TOKEN, "gateway-unconfigured");
    let unenrolled = server.call_as(&admin, "domains.sync", &json!({}));
    assert_eq!(
        (unenrolled.status, unenrolled.json()["error"]["code"].clone()),
        (409, json!("gateway-not-enrolled")),
        "{}",
        unenrolled.body
    );
    assert_eq!(set(&server, &admin, json!({ "gatewayClientId": CLIENT_ID }), &[]), 400, "a client id needs a URL");
    let settings = json!({ "gatewayUrl": url, "gatewayClientId": CLIENT_ID, "gatewayDnsRecordAddresses": ["10.0.0.0/8"] });
    assert_eq!(set(&server, &admin, settings, &[]), 200);
    let state = cli.status();
    assert!(state["reason"].as_str().unwrap().contains("gateway.bootstrapCredential"), "{state}");

    // ---- refused before anything reaches the gateway ----
    cli.refused(&url, "another-client", ADMIN_TOKEN, "gateway-target-mismatch");
    cli.refused(&format!("http://127.0.0.1:{}", free_port()), CLIENT_ID, ADMIN_TOKEN, "gateway-target-mismatch");
    cli.refused(&url, CLIENT_ID, "not visible ascii", "bootstrap-token-invalid");
    // sealed for another client's target, named as this one: it does not open
    let recipient = server.call_as(&admin, "secrets.getIngressRecipient", &json!({})).expect_json(200);
    let public: [u8; 32] = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, recipient["publicKey"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let elsewhere = capstan::secrets::ingress::target("gateway.bootstrapCredential", &url, "another-client");
    let sealed = capstan::secrets::ingress::seal_to(
        recipient["recipientId"].as_str().unwrap(),
        &x25519_dalek::PublicKey::from(public),
        &elsewhere,
        ADMIN_TOKEN.as_bytes(),
    );
    let body = json!({ "expectedGatewayUrl": url, "expectedGatewayClientId": CLIENT_ID, "sealedAdminToken": sealed });
    let refused = server.call_as(&admin, "gateway.bootstrapCredential", &body).expect_error(400, "bootstrap-token-invalid");
    cli.seen.borrow_mut().push_str(&refused.to_string());
    // the gateway down: unreachable, retryable, nothing changed
    cli.refused(&url, CLIENT_ID, ADMIN_TOKEN, "gateway-unreachable");
    assert_eq!(cli.status()["state"], "admin-bootstrap-required");

    // ---- the gateway up: tokens it does not know, or not an admin's ----
    let gateway = Gateway::start(http, smtp, &dir.path().join("gateway-state.json"));
    cli.refused(&url, CLIENT_ID, "gwadmin-unknown", "bootstrap-token-rejected");
    cli.refused(&url, CLIENT_ID, TOKEN, "bootstrap-token-not-admin");
    assert!(credentials(&gateway).is_empty(), "nothing provisioned by a refused bootstrap");

    // ---- issued, not finalizable yet: degraded, pending, then finalized by the retry ----
    gateway.put("/test/faults", json!({ "finalize": 503 }));
    let exited = cli.bootstrap(&url, CLIENT_ID, ADMIN_TOKEN);
    assert!(exited.status.success(), "{exited:?}");
    let degraded: Value = serde_json::from_str(exited.stdout.trim()).unwrap();
    assert_eq!((degraded["state"].as_str(), degraded["finalizationPending"].as_bool()), (Some("degraded"), Some(true)), "{degraded}");
    cli.refused(&url, CLIENT_ID, ADMIN_TOKEN, "bootstrap-candidate-pending");
    let issued = credentials(&gateway);
    assert_eq!(issued.len(), 1, "{issued:?}");
    assert_eq!(issued[0]["state"], "candidate");
    gateway.put("/test/faults", json!({}));
    let ready = eventually("the retry finalizes the credential", Duration::from_secs(60), || {
        let state = cli.status();
        if state["state"] == "ready" { Ok(state) } else { Err(state.to_string()) }
    });
    let first = issued[0]["id"].as_str().unwrap().to_string();
    assert_eq!(ready["credentialId"], first.as_str());
    assert_eq!((ready["gatewayUrl"].as_str(), ready["clientId"].as_str()), (Some(url.as_str()), Some(CLIENT_ID)));
    let active = credentials(&gateway);
    assert_eq!(active[0]["state"], "active");
    // least privilege: the scopes Capstan needs, DNS records only inside the prefixes set
    assert_eq!(active[0]["policy"]["allowedDnsRecordAddresses"], json!(["10.0.0.0/8"]));
    assert!(!active[0]["policy"]["scopes"].as_array().unwrap().is_empty());
    assert_eq!(cli.run(&["gateway", "status"], b"").stdout.lines().next(), Some("enrollment: ready"));

    // the token Capstan keeps is the gateway's, as a system secret
    let held_token = |credential: &str| -> String {
        let listed =
            server.call_as(&admin, "secrets.list", &json!({ "owner": { "kind": "system", "systemId": "gateway" } })).expect_json(200);
        let secret = listed["items"].as_array().unwrap().iter().find(|s| s["key"] == "GATEWAY_CLIENT_TOKEN" && s["state"] == "active");
        let id = secret.unwrap_or_else(|| panic!("{listed}"))["id"].as_str().unwrap().to_string();
        assert_eq!(secret.unwrap()["managementScope"], "gateway:client");
        let keyring = capstan::keyring::Keyring::load(&data.join("keyring.json")).unwrap();
        let opened = with_store(&data.join("capstan.sqlite"), &[], |store| async move {
            capstan::secrets::methods::declare(&store).await.unwrap();
            capstan::secrets::methods::open_current(&store, &keyring, &id).await.unwrap().to_vec()
        });
        let issued = gateway.get(&format!("/test/client-tokens/{credential}")).1["token"].as_str().unwrap().to_string();
        assert_eq!(String::from_utf8(opened).unwrap(), issued, "Capstan holds the credential the gateway issued");
        issued
    };
    let first_token = held_token(&first);

    // ---- a change the credential cannot carry is staged until the next bootstrap ----
    assert_eq!(set(&server, &admin, json!({ "gatewayDnsRecordAddresses": ["10.0.0.0/8", "192.0.2.0/24"] }), &[]), 200);
    let staged = cli.status();
    assert_eq!(staged["state"], "admin-bootstrap-required", "{staged}");
    assert_eq!(staged["credentialId"], first.as_str(), "the running credential keeps serving");
    assert!(
        staged["reason"]
            .as_str()
            .unwrap()
            .contains(r#"Staged gateway settings change gatewayDnsRecordAddresses "10.0.0.0/8" -> "10.0.0.0/8,192.0.2.0/24"."#),
        "{staged}"
    );
    let exited = cli.bootstrap(&url, CLIENT_ID, ADMIN_TOKEN);
    assert!(exited.status.success(), "{exited:?}");
    let again: Value = serde_json::from_str(exited.stdout.trim()).unwrap();
    assert_eq!(again["state"], "ready", "{again}");
    let second = again["credentialId"].as_str().unwrap().to_string();
    assert_ne!(second, first);
    let now = credentials(&gateway);
    let state_of = |id: &str| now.iter().find(|c| c["id"] == id).map(|c| c["state"].clone());
    assert_eq!((state_of(&first), state_of(&second)), (Some(json!("revoked")), Some(json!("active"))), "{now:?}");
    assert_ne!(held_token(&second), first_token);

    // ---- a refused provisioning leaves the running credential ----
    gateway.put("/test/faults", json!({ "provision": 403 }));
    cli.refused(&url, CLIENT_ID, ADMIN_TOKEN, "bootstrap-provisioning-refused");
    let kept = cli.status();
    assert_eq!((kept["state"].as_str(), kept["credentialId"].as_str()), (Some("ready"), Some(second.as_str())), "{kept}");
    gateway.put("/test/faults", json!({}));

    // ---- domains: a zone an administrator registers, the gateway's synced in with the credential ----
    let zone = server.call_as(&admin, "domains.register", &json!({ "name": "zone.example" })).expect_json(200);
    assert_eq!((zone["registered"].as_bool(), zone["atGateway"].as_bool()), (Some(true), Some(false)), "{zone}");
    let bad = server.call_as(&admin, "domains.register", &json!({ "name": "Not_A.Domain" }));
    assert_eq!((bad.status, bad.json()["error"]["code"].clone()), (400, json!("domain-invalid")), "{}", bad.body);
    let synced = server.call_as(&admin, "domains.sync", &json!({})).expect_json(200);
    assert_eq!(synced["listed"], 1, "{synced}");
    let listing = server.call_as(&admin, "domains.list", &json!({})).expect_json(200);
    let item = |name: &str| listing["items"].as_array().unwrap().iter().find(|d| d["name"] == name).cloned();
    let acme = item("acme.example").unwrap_or_else(|| panic!("the gateway's domain synced in: {listing}"));
    assert_eq!(
        (acme["atGateway"].as_bool(), acme["verified"].as_bool(), acme["registered"].as_bool()),
        (Some(true), Some(true), Some(false))
    );
    assert_eq!(item("zone.example").unwrap()["registered"], true);
    assert!(listing["sync"]["syncedAt"].is_u64() && listing["sync"]["failure"].is_null(), "{listing}");
    let gone = server.call_as(&admin, "domains.unregister", &json!({ "name": "zone.example" })).expect_json(200);
    assert_eq!(gone["unregistered"], true);
    let listing = server.call_as(&admin, "domains.list", &json!({})).expect_json(200);
    assert_eq!(listing["items"].as_array().unwrap().len(), 1, "{listing}");

    // ---- relay names: published with a 60 s TTL inside gatewayDnsRecordAddresses only ----
    let cluster = crate::relays::enrolled_cluster(&server, &admin, dir.path(), &origin, "relays.gw.example");
    let relay_name = format!("relay.{}.relays.gw.example", cluster.cluster_id.replace('_', "-"));
    let names = server.call_as(&admin, "domains.listRelayNames", &json!({})).expect_json(200);
    assert_eq!(names["ttlSeconds"], 60);
    assert_eq!(names["items"][0]["name"], relay_name.as_str(), "{names}");
    assert!(names["items"][0]["reason"].as_str().unwrap().contains("no listen address"), "{names}");
    let relay = crate::relays::RelayProcess::start(&cluster.state_dir, &cluster.authorization, "10.0.0.5:8443");
    crate::relays::wait_listed(&server, &admin, &cluster.cluster_id, true, 1, &[&relay]);
    let published = server.call_as(&admin, "domains.publishRelayNames", &json!({})).expect_json(200);
    assert_eq!(published["items"][0]["published"], true, "{published}");
    let record = |gateway: &Gateway| {
        let (status, listing) = gateway.get("/v1/dns-records");
        assert_eq!(status, 200, "{listing}");
        listing["records"].as_array().unwrap().iter().find(|r| r["name"] == relay_name.as_str()).cloned()
    };
    assert_eq!(
        record(&gateway),
        Some(json!({ "name": relay_name, "type": "A", "values": ["10.0.0.5"], "ttl": 60, "clientId": CLIENT_ID })),
        "published under Capstan's own client credential"
    );
    // a second cluster's relay name: published beside the first, withdrawn when its relay is disabled
    let (second, second_name, second_relay) = cluster_with_relay(&server, &admin, dir.path(), &origin, "second", "10.0.0.6:8443");
    server.call_as(&admin, "domains.publishRelayNames", &json!({})).expect_json(200);
    let record_of = |gateway: &Gateway, name: &str| {
        let (status, listing) = gateway.get("/v1/dns-records");
        assert_eq!(status, 200, "{listing}");
        listing["records"].as_array().unwrap().iter().find(|r| r["name"] == name).map(|r| r["values"].clone())
    };
    assert_eq!(record_of(&gateway, &second_name), Some(json!(["10.0.0.6"])));
    certificates(&server, &admin, &gateway, &cluster, &relay_name, &second_name);
    let held = server.call_as(&admin, "clusters.get", &json!({ "id": second.cluster_id })).expect_json(200);
    server
        .call_as(&admin, "clusters.disableRelay", &json!({ "id": second.cluster_id, "expectedRevision": held["revision"] }))
        .expect_json(200);
    eventually("a disabled relay's name withdrawn", Duration::from_secs(60), || match record_of(&gateway, &second_name) {
        None => Ok(()),
        Some(r) => Err(r.to_string()),
    });
    assert_eq!(record_of(&gateway, &relay_name), Some(json!(["10.0.0.5"])), "the other cluster's name stays");
    drop(second_relay);
    // a third cluster's name outlives its relay's connection, and goes with the cluster
    let (third, third_name, third_relay) = cluster_with_relay(&server, &admin, dir.path(), &origin, "third", "10.0.0.7:8443");
    drop(third_relay);
    crate::relays::wait_listed(&server, &admin, &third.cluster_id, false, 0, &[]);
    server.call_as(&admin, "domains.publishRelayNames", &json!({})).expect_json(200);
    assert_eq!(record_of(&gateway, &third_name), Some(json!(["10.0.0.7"])), "a relay that went away may come back");
    let credential: Value = serde_json::from_slice(&std::fs::read(third.state_dir.join("credential.json")).unwrap()).unwrap();
    let node_id = credential["nodeId"].as_str().unwrap();
    let node = server.call_as(&admin, "nodes.get", &json!({ "id": node_id })).expect_json(200);
    server.call_as(&admin, "nodes.retire", &json!({ "id": node_id, "expectedRevision": node["revision"] })).expect_json(200);
    let node = server.call_as(&admin, "nodes.get", &json!({ "id": node_id })).expect_json(200);
    server.call_as(&admin, "nodes.delete", &json!({ "id": node_id, "expectedRevision": node["revision"] })).expect_json(200);
    let held = server.call_as(&admin, "clusters.get", &json!({ "id": third.cluster_id })).expect_json(200);
    server.call_as(&admin, "clusters.delete", &json!({ "id": third.cluster_id, "expectedRevision": held["revision"] })).expect_json(200);
    eventually("a deleted cluster's relay name withdrawn", Duration::from_secs(60), || match record_of(&gateway, &third_name) {
        None => Ok(()),
        Some(r) => Err(r.to_string()),
    });
    assert_eq!(record_of(&gateway, &relay_name), Some(json!(["10.0.0.5"])), "the other cluster's name stays");
    // an allowance that no longer covers the relay's address withdraws its name
    assert_eq!(set(&server, &admin, json!({ "gatewayDnsRecordAddresses": ["192.0.2.0/24"] }), &[]), 200);
    eventually("the relay name withdrawn", Duration::from_secs(60), || match record(&gateway) {
        None => Ok(()),
        Some(r) => Err(r.to_string()),
    });
    let names = server.call_as(&admin, "domains.listRelayNames", &json!({})).expect_json(200);
    assert_eq!(names["items"][0]["published"], false);
    assert!(names["items"][0]["reason"].as_str().unwrap().contains("outside gatewayDnsRecordAddresses"), "{names}");
    drop(relay);

    // ---- the gateway down: a sync is refused by name and the failure kept for the listing ----
    gateway.stop();
    let down = server.call_as(&admin, "domains.sync", &json!({}));
    assert_eq!((down.status, down.json()["error"]["code"].clone()), (503, json!("gateway-unreachable")), "{}", down.body);
    let listing = server.call_as(&admin, "domains.list", &json!({})).expect_json(200);
    assert!(listing["sync"]["failure"].as_str().is_some_and(|f| f.contains("could not be read")), "{listing}");
    assert_eq!(listing["items"].as_array().unwrap().len(), 1, "a failed sync loses nothing: {listing}");

    // ---- the admin token: in no answer, output, log or file ----
    let seen = cli.seen.borrow().clone();
    assert!(!seen.contains(ADMIN_TOKEN), "the admin token was printed");
    assert!(!server.stdout().contains(ADMIN_TOKEN) && !server.stderr().contains(ADMIN_TOKEN), "the admin token was logged");
    let mut files = Vec::new();
    every_file(&data, &mut files);
    for (path, bytes) in &files {
        assert!(!bytes.windows(ADMIN_TOKEN.len()).any(|w| w == ADMIN_TOKEN.as_bytes()), "the admin token is in {}", path.display());
    }
    assert!(files.len() > 3, "the data directory was read: {files:?}");
}

/// A cluster `name` under the relay zone with its node enrolled (in `root/<name>`) and its relay
/// running, listening at `listen`; the cluster, its relay name and the relay.
fn cluster_with_relay(
    server: &Capstan,
    admin: &str,
    root: &Path,
    origin: &str,
    name: &str,
    listen: &str,
) -> (crate::relays::EnrolledCluster, String, crate::relays::RelayProcess) {
    let cluster_root = root.join(name);
    std::fs::create_dir(&cluster_root).unwrap();
    let cluster = crate::relays::enrolled_cluster_named(server, admin, &cluster_root, origin, "relays.gw.example", name);
    let relay_name = format!("relay.{}.relays.gw.example", cluster.cluster_id.replace('_', "-"));
    let relay = crate::relays::RelayProcess::start(&cluster.state_dir, &cluster.authorization, listen);
    crate::relays::wait_listed(server, admin, &cluster.cluster_id, true, 1, &[&relay]);
    (cluster, relay_name, relay)
}

/// `openssl ARGS` on `input`; its output, or a panic saying what failed.
fn openssl(args: &[&str], input: &str) -> String {
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(args);
    let exited = crate::plugins::run(cmd, input.as_bytes(), EXIT_TIMEOUT);
    assert!(exited.status.success(), "openssl {args:?} (Debian: apt-get install openssl): {exited:?}");
    exited.stdout
}

/// Check that `answer` holds a certificate for exactly `name` under the gateway's CA, with the
/// key that belongs to it.
fn check_certificate(gateway: &Gateway, answer: &Value, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, gateway.get("/test/ca").1["certificate"].as_str().unwrap()).unwrap();
    let certificate = answer["certificate"].as_str().unwrap();
    let verified = openssl(&["verify", "-CAfile", ca.to_str().unwrap()], certificate);
    assert!(verified.trim_end().ends_with(": OK"), "{verified}");
    let names = openssl(&["x509", "-noout", "-ext", "subjectAltName"], certificate);
    assert_eq!(names.lines().nth(1).map(str::trim), Some(format!("DNS:{name}").as_str()), "{names}");
    let public = openssl(&["x509", "-noout", "-pubkey"], certificate);
    assert_eq!(openssl(&["pkey", "-pubout"], answer["privateKey"].as_str().unwrap()), public, "the key is the certificate's");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let days = (answer["notAfter"].as_u64().unwrap() - now) / 86_400_000;
    assert!((80..=90).contains(&days), "valid for {days} more days");
}

/// `domains.fetchCertificate` end to end: a relay name's certificate to an administrator and to
/// that cluster's own relay (its machine identity, on a socket opened with its bearer), refused
/// to another cluster's; the rest of the relay namespace reserved for everyone; other names an
/// administrator's, served only when the gateway serves them; a certificate still being issued
/// refused with when to ask again; the key in no log line.
fn certificates(server: &Capstan, admin: &str, gateway: &Gateway, cluster: &crate::relays::EnrolledCluster, relay_name: &str, other: &str) {
    let get = |name: &str| server.call_as(admin, "domains.fetchCertificate", &json!({ "name": name }));
    let answer = get(relay_name).expect_json(200);
    assert_eq!(answer["name"], relay_name);
    check_certificate(gateway, &answer, relay_name);
    let again = get(relay_name).expect_json(200);
    assert_eq!(again["certificate"], answer["certificate"], "the gateway's one certificate for the name, asked again");

    let bearer = std::fs::read_to_string(&cluster.authorization).unwrap();
    let (mut ws, welcome) = crate::socket::open(server, "relay", Some(bearer.trim()));
    assert_eq!(welcome["relay"]["clusterId"], cluster.cluster_id.as_str(), "{welcome}");
    let own = crate::socket::call(&mut ws, 1, "domains.fetchCertificate", json!({ "name": relay_name }));
    assert_eq!(own["result"]["certificate"], answer["certificate"], "the cluster's relay fetches its own: {}", own["error"]);
    let foreign = crate::socket::call(&mut ws, 2, "domains.fetchCertificate", json!({ "name": other }));
    assert_eq!(foreign["error"]["code"], "relay-certificate-not-owned", "{foreign}");
    let generic = crate::socket::call(&mut ws, 3, "domains.fetchCertificate", json!({ "name": "www.acme.example" }));
    assert_eq!(generic["error"]["code"], "forbidden", "{generic}");
    drop(ws);

    let label = cluster.cluster_id.replace('_', "-");
    for reserved in ["relay.cluster-nowhere.relays.gw.example".to_string(), format!("*.{label}.relays.gw.example")] {
        let error = get(&reserved).expect_error(409, "relay-name-reserved");
        assert_eq!(error["data"]["name"], reserved.as_str());
    }
    let www = get("www.acme.example").expect_json(200);
    check_certificate(gateway, &www, "www.acme.example");
    get("www.elsewhere.example").expect_error(409, "certificate-name-not-served");
    get("Not A Name").expect_error(400, "invalid-request");

    gateway.put("/test/faults", json!({ "certificates": 409 }));
    let pending = get(relay_name).expect_error(503, "relay-certificate-pending");
    assert_eq!(pending["data"]["retryAfterMs"], 5000);
    gateway.put("/test/faults", json!({}));

    for key in [&answer, &www].map(|a| a["privateKey"].as_str().unwrap().lines().nth(1).unwrap().to_string()) {
        assert!(!server.stdout().contains(&key) && !server.stderr().contains(&key), "a certificate's key was logged");
    }
}
