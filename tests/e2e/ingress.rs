//! The ingress manager end to end, with real processes only: `capstan serve --dev` (the ingress
//! plugin embedded and installed first-party), the real `capstan-agent` enrolled with a jump code
//! and run as `capstan-agent relay --ingress-listen ADDR --ingress-bearer-file FILE`, a test
//! HTTP service on loopback, and the HTTP API.
//!
//! One scenario, in order: a service designated the cluster's ingress (replays, reuse, a stale
//! revision and an existing designation refused by name); its bearer exported to a private file;
//! the relay started with the ingress, which registers through the relay's session and receives
//! its table; a request for a hostname goes through the agent's proxy to the service; a
//! non-public hostname is left out by name until the forwarding sources are set, then served
//! only to them; a domain change withdraws exactly the revoked route in a table of its own
//! before the next table adds the new one; a designation limited to another node refused by
//! name (`node-mismatch`); a service whose bearer was revoked designated again with a new one; a
//! second cluster's ingress, which no designation names, refused (`ingress-not-designated`).
//!
//! A second scenario adds the test gateway (`tests/peers/gateway`, with its forwarding listener):
//! Capstan enrolled there, the table's hostnames routed by the gateway to the address the ingress
//! registered, a request at the gateway reaching the service through the agent's proxy, a
//! hostname outside the gateway's domains refused by name, one another holder has at the
//! gateway refused `route-taken` and routed once let go, a domain change and a deletion
//! withdrawing their routes.

use crate::mail::{Gateway, enroll_at_gateway, gateway_available};
use crate::relays::{EnrolledCluster, RelayProcess, enroll_node, enrolled_cluster, enrolled_cluster_named, wait_listed};
use crate::support::{Capstan, Refusing, TEST_ADMIN, capstan, eventually, free_port, ok, refused, with_test_admin};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

const SEEN: Duration = Duration::from_secs(120);
const ZONE: &str = "ingress.e2e.example";

/// A test service: answers every request with 200 and `web saw <Host>`.
fn web_service() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let host = head.lines().find_map(|l| l.strip_prefix("host: ").or_else(|| l.strip_prefix("Host: "))).unwrap_or("?");
                let body = format!("web saw {host}");
                let _ = write!(stream, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
            });
        }
    });
    port
}

/// `GET /` through the proxy at `port` for `host`: the status and the body.
fn through(port: u16, host: &str) -> (u16, String) {
    through_at(&format!("127.0.0.1:{port}"), host).unwrap()
}

/// GET / for `host` from an ingress at `address` (`ip:port`) on a connection of its own: the
/// status and the body, or what went wrong.
pub(crate) fn through_at(address: &str, host: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect(address).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(20))).map_err(|e| e.to_string())?;
    write!(stream, "GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n").map_err(|e| format!("send: {e}"))?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(|e| format!("read: {e}"))?;
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

/// The hostnames of every table the relay applied, in order, from its log.
fn applied(relay: &RelayProcess) -> Vec<(u64, Vec<String>)> {
    relay
        .log()
        .lines()
        .filter(|l| l.contains("route table applied"))
        .map(|l| {
            let field = |name: &str| l.split(' ').find_map(|w| w.strip_prefix(name)).unwrap_or_default().to_string();
            let revision = field("revision=").parse().unwrap_or(0);
            let hostnames = field("hostnames=").split(',').filter(|h| !h.is_empty()).map(str::to_string).collect();
            (revision, hostnames)
        })
        .collect()
}

/// Export the cluster's current ingress bearer and hand it to the ingress in `file`; the bearer.
fn hand_over_bearer(server: &Capstan, admin: &str, cluster_id: &str, file: &std::path::Path) -> String {
    let bearer = ok(server, admin, "ingress.exportBearer", json!({ "clusterId": cluster_id }))["bearer"].as_str().unwrap().to_string();
    std::fs::write(file, &bearer).unwrap();
    bearer
}

/// Wait until the relay's log shows its ingress's registration refused with `refusal` (the
/// code and the delay, as the log line has them), and check that no registration was recorded.
fn registration_refused(server: &Capstan, admin: &str, relay: &RelayProcess, cluster_id: &str, refusal: &str) {
    eventually(&format!("the registration refused: {refusal}"), SEEN, || {
        let log = relay.log();
        if log.contains(refusal) { Ok(()) } else { Err(log) }
    });
    let read = ok(server, admin, "ingress.getDesignation", json!({ "clusterId": cluster_id }));
    assert!(read["designation"]["registration"].is_null(), "{read}");
}

fn table(server: &Capstan, admin: &str, cluster_id: &str) -> Value {
    ok(server, admin, "ingress.getRouteTable", json!({ "clusterId": cluster_id }))
}

fn hostnames(table: &Value) -> Vec<String> {
    table["table"]["routes"].as_array().map(|r| r.iter().map(|r| r["hostname"].as_str().unwrap().to_string()).collect()).unwrap_or_default()
}

/// What both scenarios start from.
struct Start {
    /// `capstan serve --dev` with the ingress plugin running.
    server: Capstan,
    admin: String,
    origin: String,
    /// An enrolled cluster whose relay is not started yet.
    cluster: EnrolledCluster,
    /// The organization `acme`.
    org_id: String,
    /// The service to designate the cluster's ingress.
    edge: Value,
    /// A web service answering on the given domains: a test service on loopback, its `http` port.
    web: Value,
}

fn start(root: &std::path::Path, env: &[(&str, &str)], domains: &[&str]) -> Start {
    let port = free_port();
    let origin = format!("http://127.0.0.1:{port}");
    let mut cmd = with_test_admin(capstan());
    cmd.args(["serve", "--dev", "--data-dir"]).arg(root.join("data")).args(["--listen", &format!("127.0.0.1:{port}")]);
    cmd.env("CAPSTAN_AGENT_BINARY", crate::nodes::agent_binary()).envs(env.iter().copied());
    let server = Capstan::start(cmd);
    server.ready_status();
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    eventually("the ingress plugin running", Duration::from_secs(180), || {
        let reply = server.call_as(&admin, "plugins.get", &json!({ "id": "ingress" }));
        if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
    });
    let cluster = enrolled_cluster(&server, &admin, root, &origin, ZONE);
    let org_id = ok(&server, &admin, "organizations.create", json!({ "name": "acme" }))["id"].as_str().unwrap().to_string();
    let edge = ok(
        &server,
        &admin,
        "services.create",
        json!({ "organizationId": org_id, "name": "edge", "image": "registry.example.com/edge:1", "scale": 1 }),
    );
    let web = ok(
        &server,
        &admin,
        "services.create",
        json!({ "organizationId": org_id, "name": "web", "image": "registry.example.com/web:1", "scale": 1,
                "ports": [{ "port": web_service(), "protocol": "http" }], "domains": domains }),
    );
    Start { server, admin, origin, cluster, org_id, edge, web }
}

/// The cluster's relay with its ingress proxy on `listen`, taking its bearer from `bearer_file`;
/// returned once the cluster lists it connected.
fn relay_with_ingress(
    server: &Capstan,
    admin: &str,
    cluster: &EnrolledCluster,
    relay_at: &str,
    listen: &str,
    bearer_file: &std::path::Path,
) -> RelayProcess {
    let relay = RelayProcess::start_with(
        &cluster.state_dir,
        &cluster.authorization,
        relay_at,
        &["--ingress-listen".as_ref(), listen.as_ref(), "--ingress-bearer-file".as_ref(), bearer_file.as_os_str()],
    );
    wait_listed(server, admin, &cluster.cluster_id, true, 1, &[&relay]);
    relay
}

#[test]
fn a_designated_ingress_registers_through_its_relay_serves_its_table_and_withdraws_before_it_adds() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let Start { server, admin, origin, cluster, org_id, edge, web } =
        start(root, &[], &["web.e2e.example", "old.e2e.example", "priv.e2e.example"]);
    let cluster_id = cluster.cluster_id.as_str();
    let edge_id = edge["id"].as_str().unwrap().to_string();
    let web_id = web["id"].as_str().unwrap().to_string();
    // a relay's name is Capstan's: no service answers on it
    let relay_name = format!("relay.{}.{ZONE}", cluster_id.replace('_', "-"));
    let taken = json!({ "id": web_id, "expectedRevision": web["revision"], "domains": ["web.e2e.example", relay_name] });
    let error = refused(&server.call_as(&admin, "services.update", &taken), Refusing::ClientErrorOr503, "relay-name-reserved");
    assert_eq!(error["data"]["domain"], relay_name.as_str());

    // ---- designation: the environment fences, then the revision, replay, reuse ----
    let bare = ok(&server, &admin, "clusters.create", json!({ "name": "bare" }))["cluster"]["id"].as_str().unwrap().to_string();
    let rev = ok(&server, &admin, "services.get", json!({ "id": edge_id }))["revision"].clone();
    let no_relay = json!({ "clusterId": bare, "serviceId": edge_id, "expectedRevision": rev, "mutationId": "designate-bare" });
    assert_eq!(
        refused(&server.call_as(&admin, "ingress.designate", &no_relay), Refusing::ClientErrorOr503, "cluster-relay-missing")["data"]["clusterId"],
        bare.as_str()
    );
    let claims = ok(
        &server,
        &admin,
        "services.create",
        json!({ "organizationId": org_id, "name": "claims", "image": "registry.example.com/edge:1", "environment": { "CAPSTAN_CLUSTER_NODE_ID": "n" } }),
    );
    let conflicting =
        json!({ "clusterId": cluster_id, "serviceId": claims["id"], "expectedRevision": 1, "mutationId": "designate-claims" });
    let error = refused(
        &server.call_as(&admin, "ingress.designate", &conflicting),
        Refusing::ClientErrorOr503,
        "cluster-ingress-environment-conflict",
    );
    assert_eq!(error["data"]["names"], json!(["CAPSTAN_CLUSTER_NODE_ID"]));

    let edge_revision = ok(&server, &admin, "services.get", json!({ "id": edge_id }))["revision"].clone();
    let request = json!({ "clusterId": cluster_id, "serviceId": edge_id, "expectedRevision": edge_revision, "mutationId": "designate-1" });
    let stale = json!({ "clusterId": cluster_id, "serviceId": edge_id, "expectedRevision": edge_revision.as_u64().unwrap() + 7, "mutationId": "designate-0" });
    let error = refused(&server.call_as(&admin, "ingress.designate", &stale), Refusing::ClientErrorOr503, "conflict");
    assert_eq!(error["data"]["field"], "expectedRevision");
    let designated = ok(&server, &admin, "ingress.designate", request.clone());
    assert_eq!((designated["replayed"].as_bool(), designated["designation"]["generation"].as_u64()), (Some(false), Some(1)));
    let replayed = ok(&server, &admin, "ingress.designate", request.clone());
    assert_eq!(replayed["replayed"], true);
    assert_eq!(replayed["designation"], designated["designation"], "a replay answers the recorded result");
    let mut reused = request.clone();
    reused["serviceId"] = json!(web_id);
    refused(&server.call_as(&admin, "ingress.designate", &reused), Refusing::ClientErrorOr503, "mutation-reused");
    let mut again = request.clone();
    again["mutationId"] = json!("designate-2");
    let present = refused(&server.call_as(&admin, "ingress.designate", &again), Refusing::ClientErrorOr503, "designation-present");
    assert_eq!(present["data"]["generation"], 1);
    let read = ok(&server, &admin, "ingress.getDesignation", json!({ "clusterId": cluster_id }));
    assert_eq!(read["designation"]["serviceId"], edge_id.as_str());
    assert!(!read.to_string().contains("bearer\":"), "no answer but the export carries the bearer: {read}");

    // ---- the bearer, handed to the ingress in a private file ----
    let exported = ok(&server, &admin, "ingress.exportBearer", json!({ "clusterId": cluster_id }));
    let bearer = exported["bearer"].as_str().unwrap().to_string();
    assert_eq!(bearer.len(), 43, "32 random bytes, base64url");
    let bearer_file = root.join("relay-export/ingress-bearer");
    // a wrong bearer first: refused by name, and tried again once the file changes
    std::fs::write(&bearer_file, "x".repeat(43)).unwrap();
    std::fs::set_permissions(&bearer_file, std::fs::Permissions::from_mode(0o600)).unwrap();

    // a registration from anyone but the cluster's relay is refused, with when to try again
    let foreign = refused(
        &server.call_as(
            &admin,
            "ingress.register",
            &json!({ "clusterId": cluster_id, "nodeId": "node_x", "bearer": bearer, "version": "1", "relayVersion": "0.1.0" }),
        ),
        Refusing::ClientErrorOr503,
        "relay-not-connected",
    );
    assert_eq!(foreign["data"]["retryAfterMs"], 5000);
    assert!(!foreign.to_string().contains(&bearer), "a refusal never quotes the bearer");

    // ---- routes, the relay with its ingress ----
    ok(
        &server,
        &admin,
        "ingress.attachService",
        json!({ "clusterId": cluster_id, "serviceId": web_id, "address": "127.0.0.1", "privateHostnames": ["priv.e2e.example"] }),
    );
    let proxy = free_port();
    let relay = relay_with_ingress(&server, &admin, &cluster, "10.0.0.5:8443", &format!("127.0.0.1:{proxy}"), &bearer_file);
    eventually("the wrong bearer refused", SEEN, || {
        if relay.log().contains("code=\"bearer-refused\" retry_after_ms=60000") { Ok(()) } else { Err(relay.log()) }
    });
    let read = ok(&server, &admin, "ingress.getDesignation", json!({ "clusterId": cluster_id }));
    assert!(read["designation"]["registration"].is_null(), "{read}");
    std::fs::write(&bearer_file, &bearer).unwrap();
    eventually("the ingress registered through its relay", SEEN, || {
        let read = ok(&server, &admin, "ingress.getDesignation", json!({ "clusterId": cluster_id }));
        if read["designation"]["registration"]["routeSourceAllowList"] == true { Ok(()) } else { Err(format!("{read}\n{}", relay.log())) }
    });
    let first = eventually("the first table, applied by the relay", SEEN, || {
        let t = table(&server, &admin, cluster_id);
        if t["table"].is_object() && t["appliedRevision"] == t["table"]["revision"] { Ok(t) } else { Err(format!("{t}\n{}", relay.log())) }
    });
    assert_eq!(hostnames(&first), ["old.e2e.example", "web.e2e.example"]);
    let omitted = &first["omitted"][0];
    assert_eq!((omitted["hostname"].as_str(), omitted["code"].as_str()), (Some("priv.e2e.example"), Some("forward-source-unset")));
    assert!(!relay.log().contains(&bearer), "the relay never logs the ingress bearer");
    let node_id =
        ok(&server, &admin, "ingress.getDesignation", json!({ "clusterId": cluster_id }))["designation"]["registration"]["nodeId"]
            .as_str()
            .unwrap()
            .to_string();
    let credential: Value = serde_json::from_slice(&std::fs::read(cluster.state_dir.join("credential.json")).unwrap()).unwrap();
    assert_eq!(credential["nodeId"], node_id.as_str(), "the ingress registered from the relay's node");
    let environment = ok(&server, &admin, "ingress.getEnvironment", json!({ "clusterId": cluster_id, "nodeId": node_id }));
    let relay_origin = format!("https://relay.{}.{ZONE}:8443", cluster_id.replace('_', "-"));
    assert_eq!(environment["environment"], json!({ "CAPSTAN_CLUSTER_RELAY_ORIGIN": relay_origin, "CAPSTAN_CLUSTER_NODE_ID": node_id }));
    assert_eq!(environment["secrets"], json!(["CAPSTAN_CLUSTER_INGRESS_BEARER", "CAPSTAN_CLUSTER_RELAY_ORIGIN"]));
    // the relay origin reaches the replicas by the secrets path, as the bearer does
    let secrets = ok(&server, &admin, "secrets.list", json!({ "owner": { "kind": "service", "serviceId": edge_id } }));
    let origin_secret = secrets["items"].as_array().unwrap().iter().find(|s| s["key"] == "CAPSTAN_CLUSTER_RELAY_ORIGIN").cloned();
    assert_eq!(origin_secret.as_ref().map(|s| &s["state"]), Some(&json!("active")), "{secrets}");

    // ---- through the agent's proxy ----
    assert_eq!(through(proxy, "web.e2e.example"), (200, "web saw web.e2e.example".to_string()));
    assert_eq!(through(proxy, "WEB.e2e.example:80").0, 200, "the Host's port and case do not matter");
    assert_eq!(through(proxy, "nowhere.e2e.example").0, 404);
    assert_eq!(through(proxy, "priv.e2e.example").0, 404, "a non-public hostname left out is not served");

    // ---- a non-public hostname, served to the forwarding sources alone ----
    let settings = ok(&server, &admin, "settings.get", json!({}));
    ok(
        &server,
        &admin,
        "settings.update",
        json!({ "expectedRevision": settings["revision"], "set": { "ingress.forwardSourceAddresses": ["192.0.2.0/24"] } }),
    );
    let private = eventually("the private route with its allowlist", SEEN, || {
        let t = table(&server, &admin, cluster_id);
        let route = t["table"]["routes"].as_array().into_iter().flatten().find(|r| r["hostname"] == "priv.e2e.example").cloned();
        match route {
            Some(route) if t["appliedRevision"] == t["table"]["revision"] => Ok(route),
            _ => Err(t.to_string()),
        }
    });
    assert_eq!(private["sourceAllowList"], json!(["192.0.2.0/24"]));
    assert_eq!(through(proxy, "priv.e2e.example").0, 403, "loopback is not a forwarding source");
    let settings = ok(&server, &admin, "settings.get", json!({}));
    ok(
        &server,
        &admin,
        "settings.update",
        json!({ "expectedRevision": settings["revision"], "set": { "ingress.forwardSourceAddresses": ["127.0.0.0/8"] } }),
    );
    eventually("the private hostname served to loopback", SEEN, || match through(proxy, "priv.e2e.example") {
        (200, body) => Ok(body),
        other => Err(format!("{other:?}")),
    });

    // ---- a domain change: the revoked route is withdrawn in a table of its own, then the new one added ----
    let before = applied(&relay).len();
    let web = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    ok(
        &server,
        &admin,
        "services.update",
        json!({ "id": web_id, "expectedRevision": web["revision"], "domains": ["web.e2e.example", "new.e2e.example", "priv.e2e.example"] }),
    );
    let steps = eventually("the new hostname served", SEEN, || {
        let steps = applied(&relay);
        if steps.last().is_some_and(|(_, h)| h.contains(&"new.e2e.example".to_string())) { Ok(steps) } else { Err(relay.log()) }
    });
    let steps = &steps[before..];
    assert_eq!(steps.len(), 2, "one withdrawal, then one addition: {steps:?}");
    assert_eq!(steps[0].1, ["priv.e2e.example", "web.e2e.example"], "exactly the revoked route withdrawn first");
    assert_eq!(steps[1].1, ["new.e2e.example", "priv.e2e.example", "web.e2e.example"]);
    assert_eq!(steps[1].0, steps[0].0 + 1, "consecutive revisions");
    assert_eq!(through(proxy, "new.e2e.example"), (200, "web saw new.e2e.example".to_string()));
    assert_eq!(through(proxy, "old.e2e.example").0, 404);

    // ---- designating the same service again rotates its bearer; the ingress registers again ----
    let rev = ok(&server, &admin, "services.get", json!({ "id": edge_id }))["revision"].clone();
    let rotated = ok(
        &server,
        &admin,
        "ingress.designate",
        json!({ "clusterId": cluster_id, "serviceId": edge_id, "expectedRevision": rev, "expectedGeneration": 1, "mutationId": "designate-3" }),
    );
    assert_eq!(rotated["designation"]["generation"], 2);
    let new_bearer = hand_over_bearer(&server, &admin, cluster_id, &bearer_file);
    assert_ne!(new_bearer, bearer, "a rotation issues a new bearer");
    eventually("the ingress registered under generation 2", SEEN, || {
        let read = ok(&server, &admin, "ingress.getDesignation", json!({ "clusterId": cluster_id }));
        if read["designation"]["registration"].is_object() { Ok(()) } else { Err(format!("{read}\n{}", relay.log())) }
    });
    assert!(!relay.log().contains(&new_bearer), "the relay never logs the ingress bearer");

    // ---- a malformed registration is refused before anything is read ----
    let malformed = json!({ "clusterId": cluster_id, "nodeId": node_id, "bearer": "has space", "version": "1", "relayVersion": "0.1.0" });
    assert_eq!(
        refused(&server.call_as(&admin, "ingress.register", &malformed), Refusing::ClientErrorOr503, "registration-invalid")["data"]["retryAfterMs"],
        60000
    );

    // ---- the designated service scaled to 0: the ingress is refused, tried every 5 s, then taken ----
    let scale = |n: u32| {
        let rev = ok(&server, &admin, "services.get", json!({ "id": edge_id }))["revision"].clone();
        ok(&server, &admin, "services.update", json!({ "id": edge_id, "expectedRevision": rev, "scale": n }));
    };
    scale(0);
    let rev = ok(&server, &admin, "services.get", json!({ "id": edge_id }))["revision"].clone();
    let third = json!({ "clusterId": cluster_id, "serviceId": edge_id, "expectedRevision": rev, "expectedGeneration": 2, "mutationId": "designate-4" });
    assert_eq!(ok(&server, &admin, "ingress.designate", third)["designation"]["generation"], 3);
    let third_bearer = hand_over_bearer(&server, &admin, cluster_id, &bearer_file);
    registration_refused(&server, &admin, &relay, cluster_id, "code=\"assignment-not-running\" retry_after_ms=5000");
    scale(1);
    eventually("the ingress registered once the service runs", SEEN, || {
        let read = ok(&server, &admin, "ingress.getDesignation", json!({ "clusterId": cluster_id }));
        if read["designation"]["registration"].is_object() { Ok(()) } else { Err(format!("{read}\n{}", relay.log())) }
    });

    // ---- detaching withdraws the service's routes ----
    let detached = ok(&server, &admin, "ingress.detachService", json!({ "serviceId": web_id }));
    assert_eq!(detached["detached"], true);
    eventually("the routes withdrawn", SEEN, || match through(proxy, "web.e2e.example").0 {
        404 => Ok(()),
        other => Err(format!("HTTP {other}")),
    });

    // ---- the designation moved to another service: the previous service's bearer is revoked ----
    let relay_service = ok(
        &server,
        &admin,
        "services.create",
        json!({ "organizationId": org_id, "name": "edge-2", "image": "registry.example.com/edge:2", "scale": 1 }),
    );
    let moved = json!({ "clusterId": cluster_id, "serviceId": relay_service["id"], "expectedRevision": relay_service["revision"],
                        "expectedGeneration": 3, "mutationId": "designate-5" });
    let moved = ok(&server, &admin, "ingress.designate", moved);
    assert_eq!((moved["designation"]["generation"].as_u64(), &moved["designation"]["serviceId"]), (Some(4), &relay_service["id"]));
    let secrets = ok(&server, &admin, "secrets.list", json!({ "owner": { "kind": "service", "serviceId": edge_id } }));
    let previous = secrets["items"].as_array().unwrap().iter().find(|s| s["key"] == "CAPSTAN_CLUSTER_INGRESS_BEARER").cloned();
    assert_eq!(previous.as_ref().map(|s| &s["state"]), Some(&json!("revoked")), "{secrets}");
    let previous = secrets["items"].as_array().unwrap().iter().find(|s| s["key"] == "CAPSTAN_CLUSTER_RELAY_ORIGIN").cloned();
    assert_eq!(previous.as_ref().map(|s| &s["state"]), Some(&json!("revoked")), "a moved designation revokes the origin too: {secrets}");
    let moved_bearer = hand_over_bearer(&server, &admin, cluster_id, &bearer_file);
    assert_ne!(moved_bearer, third_bearer);
    eventually("the ingress registered under the moved designation", SEEN, || {
        let read = ok(&server, &admin, "ingress.getDesignation", json!({ "clusterId": cluster_id }));
        if read["designation"]["registration"].is_object() && read["designation"]["generation"] == 4 {
            Ok(())
        } else {
            Err(format!("{read}\n{}", relay.log()))
        }
    });

    // ---- a deleted service: its routes withdrawn and its attachment dropped ----
    ok(&server, &admin, "ingress.attachService", json!({ "clusterId": cluster_id, "serviceId": web_id, "address": "127.0.0.1" }));
    let listed = ok(&server, &admin, "ingress.listAttachments", json!({ "clusterId": cluster_id }));
    assert_eq!(listed["items"][0]["serviceId"], web_id.as_str(), "{listed}");
    eventually("the service routed again", SEEN, || match through(proxy, "web.e2e.example") {
        (200, body) => Ok(body),
        other => Err(format!("{other:?}\n{}", relay.log())),
    });
    let web = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    ok(&server, &admin, "services.delete", json!({ "id": web_id, "expectedRevision": web["revision"] }));
    eventually("the deleted service's routes withdrawn", SEEN, || match through(proxy, "web.e2e.example").0 {
        404 => Ok(()),
        other => Err(format!("HTTP {other}")),
    });
    eventually("the deleted service's attachment dropped", SEEN, || {
        let listed = ok(&server, &admin, "ingress.listAttachments", json!({ "clusterId": cluster_id }));
        if listed["items"] == json!([]) { Ok(()) } else { Err(listed.to_string()) }
    });
    assert!(!relay.log().contains(&third_bearer) && !relay.log().contains(&moved_bearer), "the relay never logs the ingress bearer");

    // ---- back to the first service, whose bearer was revoked, and only on a second node ----
    let second_node = enroll_node(&server, &admin, cluster_id, &origin, &root.join("agent-state-2"), Some("edge-second"));
    assert_ne!(second_node, node_id);
    let rev = ok(&server, &admin, "services.get", json!({ "id": edge_id }))["revision"].clone();
    let foreign_node = json!({ "clusterId": cluster_id, "serviceId": edge_id, "expectedRevision": rev, "expectedGeneration": 4,
                               "nodeIds": ["node_nowhere"], "mutationId": "designate-6" });
    let refused_node = refused(&server.call_as(&admin, "ingress.designate", &foreign_node), Refusing::ClientErrorOr503, "node-mismatch");
    assert_eq!(refused_node["data"]["field"], "nodeIds");
    let back = json!({ "clusterId": cluster_id, "serviceId": edge_id, "expectedRevision": rev, "expectedGeneration": 4,
                       "nodeIds": [second_node], "mutationId": "designate-7" });
    assert_eq!(ok(&server, &admin, "ingress.designate", back)["designation"]["generation"], 5);
    let secrets = ok(&server, &admin, "secrets.list", json!({ "owner": { "kind": "service", "serviceId": edge_id } }));
    let bearers: Vec<&Value> =
        secrets["items"].as_array().unwrap().iter().filter(|s| s["key"] == "CAPSTAN_CLUSTER_INGRESS_BEARER").collect();
    assert!(bearers.iter().any(|s| s["state"] == "active"), "a revoked bearer is replaced: {secrets}");
    let recovered_bearer = hand_over_bearer(&server, &admin, cluster_id, &bearer_file);
    for earlier in [&bearer, &new_bearer, &third_bearer, &moved_bearer] {
        assert_ne!(&recovered_bearer, earlier, "the recovered bearer is a new one");
    }
    // the relay's node is not the one the designation names
    registration_refused(&server, &admin, &relay, cluster_id, "code=\"node-mismatch\" retry_after_ms=60000");
    // the same service again, on any node: a rotated bearer, and the ingress registers
    let rev = ok(&server, &admin, "services.get", json!({ "id": edge_id }))["revision"].clone();
    let anywhere = json!({ "clusterId": cluster_id, "serviceId": edge_id, "expectedRevision": rev, "expectedGeneration": 5, "mutationId": "designate-8" });
    assert_eq!(ok(&server, &admin, "ingress.designate", anywhere)["designation"]["generation"], 6);
    let last_bearer = hand_over_bearer(&server, &admin, cluster_id, &bearer_file);
    eventually("the ingress registered under generation 6", SEEN, || {
        let read = ok(&server, &admin, "ingress.getDesignation", json!({ "clusterId": cluster_id }));
        if read["designation"]["registration"]["nodeId"] == node_id.as_str() && read["designation"]["generation"] == 6 {
            Ok(())
        } else {
            Err(format!("{read}\n{}", relay.log()))
        }
    });
    assert!(!relay.log().contains(&recovered_bearer) && !relay.log().contains(&last_bearer), "the relay never logs the ingress bearer");

    // ---- a second cluster whose relay runs an ingress that no designation names ----
    let spare_root = root.join("spare");
    std::fs::create_dir(&spare_root).unwrap();
    let spare = enrolled_cluster_named(&server, &admin, &spare_root, &origin, ZONE, "spare");
    // holding the first cluster's bearer changes nothing: there is no designation to judge it by
    let spare_bearer = spare_root.join("relay-export/ingress-bearer");
    std::fs::write(&spare_bearer, &last_bearer).unwrap();
    std::fs::set_permissions(&spare_bearer, std::fs::Permissions::from_mode(0o600)).unwrap();
    let spare_proxy = format!("127.0.0.1:{}", free_port());
    let spare_relay = relay_with_ingress(&server, &admin, &spare, "10.0.0.6:8443", &spare_proxy, &spare_bearer);
    registration_refused(&server, &admin, &spare_relay, &spare.cluster_id, "code=\"ingress-not-designated\" retry_after_ms=60000");
    assert_eq!(table(&server, &admin, &spare.cluster_id)["table"], Value::Null, "no table for a cluster without a designation");
    assert!(!spare_relay.log().contains(&last_bearer), "the relay never logs the ingress bearer");
}

const GATEWAY_CLIENT: &str = "capstan-ingress-e2e";

/// The routes the test gateway holds, as `(hostname, host, port, public, clientId)`.
fn gateway_routes(gateway: &Gateway) -> Vec<(String, String, u64, bool, String)> {
    let routes = gateway.routes();
    routes["routes"]
        .as_array()
        .unwrap_or_else(|| panic!("{routes}"))
        .iter()
        .map(|r| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                text(&r["hostname"]),
                text(&r["target"]["host"]),
                r["target"]["port"].as_u64().unwrap_or(0),
                r["public"] == true,
                text(&r["clientId"]),
            )
        })
        .collect()
}

/// The ingress overview's entry of `cluster_id`.
fn overview_of(server: &Capstan, admin: &str, cluster_id: &str) -> Value {
    let overview = ok(server, admin, "ingress.overview", json!({}));
    overview["clusters"].as_array().unwrap().iter().find(|c| c["clusterId"] == cluster_id).cloned().unwrap_or(Value::Null)
}

#[test]
fn a_clusters_hostnames_are_routed_by_the_gateway_to_its_ingress_and_withdrawn_with_them() {
    if !gateway_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (http, smtp, forward) = (free_port(), free_port(), free_port());
    let gateway = Gateway::start_forwarding(http, smtp, forward, &root.join("gateway-state.json"));
    let Start { server, admin, cluster, edge, web, .. } =
        start(root, &[("CAPSTAN_GATEWAY_RETRY_MS", "300")], &["www.acme.example", "shop.acme.example", "elsewhere.example"]);
    let cluster_id = cluster.cluster_id.as_str();
    let edge_id = edge["id"].as_str().unwrap().to_string();
    let web_id = web["id"].as_str().unwrap().to_string();
    let request =
        json!({ "clusterId": cluster_id, "serviceId": edge_id, "expectedRevision": edge["revision"], "mutationId": "designate-gw" });
    ok(&server, &admin, "ingress.designate", request);
    ok(&server, &admin, "ingress.attachService", json!({ "clusterId": cluster_id, "serviceId": web_id, "address": "127.0.0.1" }));
    let bearer_file = root.join("relay-export/ingress-bearer");
    let bearer = hand_over_bearer(&server, &admin, cluster_id, &bearer_file);
    std::fs::set_permissions(&bearer_file, std::fs::Permissions::from_mode(0o600)).unwrap();

    // ---- the ingress registers with the address it listens on; nothing is routed before enrollment ----
    let proxy = free_port();
    let relay = relay_with_ingress(&server, &admin, &cluster, "10.0.0.5:8443", &format!("127.0.0.1:{proxy}"), &bearer_file);
    let unenrolled = eventually("the gateway routes waiting for an enrollment", SEEN, || {
        let item = overview_of(&server, &admin, cluster_id);
        let failure = item["gatewayFailure"].as_str().unwrap_or_default().to_string();
        if failure.contains("gateway credential") { Ok(item) } else { Err(format!("{item}\n{}", relay.log())) }
    });
    assert_eq!(unenrolled["advertised"], format!("127.0.0.1:{proxy}"), "{unenrolled}");
    assert!(gateway_routes(&gateway).is_empty());

    // ---- enrolled: the table's hostnames are routed to the ingress, the one outside the gateway's domains refused by name ----
    enroll_at_gateway(&server, &admin, &format!("http://127.0.0.1:{http}"), GATEWAY_CLIENT, &root.join("config"));
    let routed = eventually("the hostnames routed at the gateway", SEEN, || {
        let routes = gateway_routes(&gateway);
        if routes.len() == 2 { Ok(routes) } else { Err(format!("{routes:?} {}", overview_of(&server, &admin, cluster_id))) }
    });
    let to_ingress = |hostname: &str| (hostname.to_string(), "127.0.0.1".to_string(), u64::from(proxy), true, GATEWAY_CLIENT.to_string());
    assert_eq!(routed, [to_ingress("shop.acme.example"), to_ingress("www.acme.example")]);
    let item = eventually("the overview counting them", SEEN, || {
        let item = overview_of(&server, &admin, cluster_id);
        if item["gatewayRouted"] == 2 { Ok(item) } else { Err(item.to_string()) }
    });
    assert_eq!(item["gatewayRefused"], json!(["elsewhere.example: name-not-served"]), "{item}");
    assert_eq!(item["gatewayFailure"], Value::Null, "{item}");

    // the dashboard's Ingress page shows the hostnames at the gateway and the refusal by name
    let cookie = format!("capstan_session={admin}");
    let page = server.request("GET", "/p/ingress", &[("cookie", &cookie), ("accept", "text/html")], None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("data-refused>elsewhere.example: name-not-served<"), "{}", page.body);
    assert!(page.body.contains(&format!(r#"id="advertised-{cluster_id}">127.0.0.1:{proxy}<"#)), "{}", page.body);
    assert!(page.body.contains(&format!(r#"id="gateway-{cluster_id}" data-routed="2""#)), "{}", page.body);
    // the task forms: the designation by names, the attached services by names
    assert!(
        page.body.contains(r#"id="card-designate""#) && page.body.contains(r#"data-attach-cluster=""#),
        "the forms are on the page: {}",
        page.body
    );
    let _ = std::fs::write(std::env::temp_dir().join("capstan-ingress-page.html"), &page.body);

    // ---- a request at the gateway reaches the service through the cluster's ingress ----
    assert_eq!(gateway.forward("www.acme.example", "/"), (200, "web saw www.acme.example".to_string()));
    assert_eq!(gateway.forward("elsewhere.example", "/").0, 404, "not routed at the gateway");

    // ---- the gateway failing: the pass stops by name, what it routes stays, and the next pass after it recovers catches up ----
    gateway.put("/test/faults", json!({ "routes": 503 }));
    let web = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    ok(
        &server,
        &admin,
        "services.update",
        json!({ "id": web_id, "expectedRevision": web["revision"], "domains": ["www.acme.example", "shop.acme.example", "elsewhere.example", "late.acme.example"] }),
    );
    let failing = eventually("the failure shown", SEEN, || {
        let item = overview_of(&server, &admin, cluster_id);
        if item["gatewayFailure"].as_str().is_some_and(|f| f.contains("503")) { Ok(item) } else { Err(item.to_string()) }
    });
    assert_eq!(failing["gatewayRouted"], 2, "{failing}");
    assert_eq!(gateway_routes(&gateway), [to_ingress("shop.acme.example"), to_ingress("www.acme.example")]);
    assert_eq!(gateway.forward("www.acme.example", "/").0, 200, "the routes held keep serving");
    gateway.put("/test/faults", json!({}));
    eventually("the new hostname routed once the gateway answers", SEEN, || {
        let routes = gateway_routes(&gateway);
        if routes.len() == 3 { Ok(()) } else { Err(format!("{routes:?}")) }
    });

    // ---- a domain change: the revoked hostname leaves the gateway, the new one arrives ----
    let web = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    ok(
        &server,
        &admin,
        "services.update",
        json!({ "id": web_id, "expectedRevision": web["revision"], "domains": ["www.acme.example", "new.acme.example"] }),
    );
    eventually("the gateway following the table", SEEN, || {
        let routes = gateway_routes(&gateway);
        if routes == [to_ingress("new.acme.example"), to_ingress("www.acme.example")] { Ok(()) } else { Err(format!("{routes:?}")) }
    });
    assert_eq!(gateway.forward("new.acme.example", "/"), (200, "web saw new.acme.example".to_string()));
    assert_eq!(gateway.forward("shop.acme.example", "/").0, 404);
    let item = eventually("no refusal left", SEEN, || {
        let item = overview_of(&server, &admin, cluster_id);
        if item["gatewayRefused"] == json!([]) { Ok(item) } else { Err(item.to_string()) }
    });
    assert_eq!(item["gatewayRouted"], 2);

    // ---- a hostname another holder has at the gateway: refused by name and left alone, routed once let go ----
    let theirs = json!({ "target": { "host": "192.0.2.7", "port": 8080 }, "public": true });
    assert_eq!(gateway.admin("PUT", "/v1/routes/taken.acme.example", Some(theirs)).0, 200);
    let web = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    let domains = json!(["www.acme.example", "new.acme.example", "taken.acme.example"]);
    ok(&server, &admin, "services.update", json!({ "id": web_id, "expectedRevision": web["revision"], "domains": domains }));
    let item = eventually("the taken hostname refused by name", SEEN, || {
        let item = overview_of(&server, &admin, cluster_id);
        if item["gatewayRefused"] == json!(["taken.acme.example: route-taken"]) { Ok(item) } else { Err(item.to_string()) }
    });
    assert_eq!(item["gatewayRouted"], 2, "{item}");
    let theirs = ("taken.acme.example".to_string(), "192.0.2.7".to_string(), 8080, true, String::new());
    assert!(gateway_routes(&gateway).contains(&theirs), "their route is left as it was: {:?}", gateway_routes(&gateway));
    assert_eq!(gateway.admin("DELETE", "/v1/routes/taken.acme.example", None).0, 204);
    eventually("the hostname routed by a later pass once let go", SEEN, || {
        let routes = gateway_routes(&gateway);
        if routes.contains(&to_ingress("taken.acme.example")) { Ok(()) } else { Err(format!("{routes:?}")) }
    });
    let item = eventually("the refusal gone", SEEN, || {
        let item = overview_of(&server, &admin, cluster_id);
        if item["gatewayRefused"] == json!([]) && item["gatewayRouted"] == 3 { Ok(item) } else { Err(item.to_string()) }
    });
    assert_eq!(item["gatewayFailure"], Value::Null, "{item}");

    // ---- the service deleted: its routes leave the gateway ----
    let web = ok(&server, &admin, "services.get", json!({ "id": web_id }));
    ok(&server, &admin, "services.delete", json!({ "id": web_id, "expectedRevision": web["revision"] }));
    eventually("the deleted service's routes withdrawn at the gateway", SEEN, || {
        let routes = gateway_routes(&gateway);
        if routes.is_empty() { Ok(()) } else { Err(format!("{routes:?}")) }
    });
    assert_eq!(gateway.forward("www.acme.example", "/").0, 404);
    assert!(!relay.log().contains(&bearer), "the relay never logs the ingress bearer");
    let admin_token = crate::mail::ADMIN_TOKEN;
    assert!(!server.stdout().contains(admin_token) && !server.stderr().contains(admin_token), "the admin token is in no log line");
    gateway.stop();
}
