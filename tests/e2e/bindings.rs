//! Platform bindings end to end (docs/bindings.md): a service of the two-node setup is given its
//! own PostgreSQL database by the bindings manager; its replicas wait (`bindings-pending`) until
//! the node states a working endpoint; the container is handed `DATABASE_URL` through the
//! secrets path, and that exact URL writes and reads a row from the node's network; another
//! binding's role cannot reach it; deleting the binding ends its access at once.
//!
//! Needs what the runtime's tests need (root, podman, the test image) and a PostgreSQL server:
//! `CAPSTAN_TEST_POSTGRES_URL` (an admin role with CREATEROLE and CREATEDB) and
//! `CAPSTAN_TEST_POSTGRES_BIN` (where `psql` is), which `.ci/peers.sh` sets; without them the
//! test says why and skips, unless `CAPSTAN_TEST_REQUIRE_POSTGRES` is set.

use crate::runtime::{Images, Node, World, forwarder, in_netns, skipped};
use crate::support::eventually;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

const CONVERGE: Duration = Duration::from_secs(120);

/// The admin of the test PostgreSQL server: (user, password, port), and where psql is.
fn postgres() -> Option<((String, String, u16), PathBuf)> {
    let (url, bin) = match (std::env::var("CAPSTAN_TEST_POSTGRES_URL"), std::env::var("CAPSTAN_TEST_POSTGRES_BIN")) {
        (Ok(url), Ok(bin)) => (url, bin),
        _ => {
            let why = "CAPSTAN_TEST_POSTGRES_URL and CAPSTAN_TEST_POSTGRES_BIN are not set (.ci/peers.sh starts a PostgreSQL server)";
            assert!(std::env::var_os("CAPSTAN_TEST_REQUIRE_POSTGRES").is_none(), "{why}");
            eprintln!("skipping the bindings test: {why}");
            return None;
        }
    };
    let rest = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")).expect("a postgres:// URL");
    let (credential, place) = rest.split_once('@').expect("the URL names its admin");
    let (user, password) = credential.split_once(':').expect("the URL holds the admin's password");
    let port = place.split('/').next().unwrap().rsplit_once(':').unwrap().1.parse().unwrap();
    Some(((user.to_string(), password.to_string(), port), PathBuf::from(bin)))
}

/// `psql <url> -c <sql>` from the node's network namespace: (success, output).
fn psql(bin: &PathBuf, node: &Node, url: &str, sql: &str) -> (bool, String) {
    let out = in_netns(Some(&node.netns), bin.join("psql"))
        .args([url, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("running psql");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn refused(w: &World, method: &str, body: Value) -> Value {
    let reply = w.server.call_as(&w.admin, method, &body);
    assert!(reply.status >= 400, "{method} should be refused: {}", reply.body);
    reply.json()["error"].clone()
}

#[test]
fn a_service_gets_its_own_postgresql_database_through_its_secrets_and_loses_it_when_the_binding_goes() {
    if skipped() {
        return;
    }
    let Some(((admin_user, admin_password, pg_port), bin)) = postgres() else { return };
    let dir = tempfile::tempdir().unwrap();
    let images = Images::build(dir.path(), &["ledger"]);
    let w = World::start(&dir.path().join("data"), images);
    let org = w.ok("organizations.create", json!({ "name": "acme" }))["id"].as_str().unwrap().to_string();
    let cluster = w.ok("clusters.create", json!({ "name": "ledgers" }))["cluster"]["id"].as_str().unwrap().to_string();
    let (ledger, deployer, _) = w.published_service(&org, "ledger");
    w.release(&ledger, &deployer, "1.0.0", "ledger");
    let mut nodes = w.two_nodes(dir.path(), &cluster, 8);
    let node = nodes[0].id().to_string();
    eventually("the bindings plugin running", CONVERGE, || {
        let reply = w.server.call_as(&w.admin, "plugins.get", &json!({ "id": "bindings" }));
        if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
    });

    // ---- the binding first: no spec yet, so it is not placed, and the service is held ----
    let created = w.ok(
        "bindings.create",
        json!({ "organizationId": org, "serviceId": ledger, "kind": "database", "engine": "postgresql", "name": "main" }),
    );
    assert_eq!((created["state"].as_str(), created["reason"].as_str()), (Some("pending"), Some("binding-unplaced")), "{created}");
    let binding = created["id"].as_str().unwrap().to_string();
    let again = refused(
        &w,
        "bindings.create",
        json!({ "organizationId": org, "serviceId": ledger, "kind": "database", "engine": "postgresql", "name": "second" }),
    );
    assert_eq!(again["code"], "binding-environment-conflict", "{again}");
    let mongo = refused(
        &w,
        "bindings.create",
        json!({ "organizationId": org, "serviceId": ledger, "kind": "database", "engine": "mongodb", "name": "docs" }),
    );
    assert_eq!(mongo["code"], "binding-engine-unsupported", "{mongo}");

    // ---- pinned to the first node, which states no database yet: the replicas wait ----
    w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": ledger, "clusterId": cluster, "expectedRevision": null,
                "placement": { "everyNode": false, "nodes": [node] }, "replicasPerNode": 1,
                "health": { "kind": "http", "port": 8080, "path": "/", "intervalMs": 1000 } }),
    );
    eventually("the replicas wait for the binding", CONVERGE, || {
        let target = w.status(&ledger);
        let waiting = target["verdict"] == json!({ "state": "waiting", "reason": "bindings-pending" });
        if waiting && target["slots"].as_array().is_none_or(Vec::is_empty) { Ok(()) } else { Err(target.to_string()) }
    });
    let pending = w.ok("bindings.get", json!({ "organizationId": org, "bindingId": binding }));
    assert_eq!(pending["reason"], "database-endpoint-missing", "{pending}");

    // ---- the node's database endpoint: the server on the host's loopback, reached at the host's end of the node's link ----
    let listen = format!("{}:{}", nodes[0].host_ip, crate::support::free_port());
    nodes[0].forwarders.push(forwarder(None, &listen, &format!("127.0.0.1:{pg_port}")));
    let (host, port) = listen.rsplit_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    let recipient = w.ok("secrets.getIngressRecipient", json!({}));
    let endpoint = |password: &str, revision: Value| {
        let sealed = crate::secrets::seal(&recipient, "nodes.setStorageEndpoint", &node, "database", password.as_bytes());
        json!({ "nodeId": node, "expectedRevision": revision,
                "database": { "engine": "postgresql", "host": host, "port": port, "user": admin_user, "sealedPassword": sealed } })
    };
    let wrong = refused(&w, "nodes.setStorageEndpoint", endpoint("not-the-password", Value::Null));
    assert_eq!(wrong["code"], "database-admin-rejected", "a wrong credential is refused before anything is kept: {wrong}");
    let stated = w.ok("nodes.getStorageEndpoint", json!({ "nodeId": node }));
    assert!(stated.get("database").is_none(), "{stated}");
    let stated = w.ok("nodes.setStorageEndpoint", endpoint(&admin_password, Value::Null));
    assert_eq!(stated["database"], json!({ "engine": "postgresql", "host": host, "port": port, "user": admin_user }), "{stated}");
    assert!(!stated.to_string().contains(&admin_password), "the admin password is never shown");

    // ---- provisioned by the next pass; the replica starts with DATABASE_URL ----
    let ready = eventually("the binding is ready", CONVERGE, || {
        let got = w.ok("bindings.get", json!({ "organizationId": org, "bindingId": binding }));
        if got["state"] == "ready" { Ok(got) } else { Err(got.to_string()) }
    });
    let keys: Vec<&str> = ready["secretKeys"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(keys, ["PGPASSWORD", "DATABASE_URL", "PGHOST", "PGPORT", "PGDATABASE", "PGUSER"], "{ready}");
    w.converged(&ledger, "the ledger runs with its database", |t| t["slots"].as_array().is_some_and(|s| s.len() == 1));
    let url = eventually("the replica holds DATABASE_URL", CONVERGE, || {
        let url = nodes[0].fetch("/cgi-bin/database-url", 2).unwrap_or_default();
        if url.starts_with("postgres") { Ok(url) } else { Err(url) }
    });
    let facet = w.ok("services.get", json!({ "id": ledger }))["facets"]["bindings"].clone();
    assert_eq!(facet["bindings"][0]["state"], "ready", "{facet}");
    let secret_password = url.split('@').next().and_then(|c| c.rsplit(':').next()).unwrap().to_string();
    for shown in [w.ok("bindings.get", json!({ "organizationId": org, "bindingId": binding })), facet] {
        assert!(!shown.to_string().contains(&secret_password), "no credential in a binding's record or facet: {shown}");
    }

    // ---- the URL the workload holds writes and reads a row, from the node's network ----
    let (ok, out) = psql(&bin, &nodes[0], &url, "CREATE TABLE entries (note text); INSERT INTO entries VALUES ('paid'); SELECT note FROM entries;");
    assert!(ok && out.lines().any(|l| l.trim() == "paid"), "{out}");

    // ---- another service's binding: its role cannot reach this database ----
    let (other, _, _) = w.published_service(&org, "other");
    w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": other, "clusterId": cluster, "expectedRevision": null,
                "placement": { "everyNode": false, "nodes": [node] }, "replicasPerNode": 1 }),
    );
    let theirs = w.ok(
        "bindings.create",
        json!({ "organizationId": org, "serviceId": other, "kind": "database", "engine": "postgresql", "name": "main" }),
    );
    assert_eq!(theirs["state"], "ready", "provisioned at once when it can be: {theirs}");
    let database = ready["resource"].as_str().unwrap();
    let their_database = theirs["resource"].as_str().unwrap();
    assert_ne!(database, their_database);
    let (ok, out) = psql(&bin, &nodes[0], &url.replace(&format!("/{database}"), &format!("/{their_database}")), "SELECT 1;");
    assert!(!ok && out.contains("permission denied"), "a binding's role reaches only its own database: {out}");

    // ---- a service on every node cannot be given a binding ----
    let (everywhere, _, _) = w.published_service(&org, "everywhere");
    w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": everywhere, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true }, "replicasPerNode": 1 }),
    );
    let ambiguous = refused(
        &w,
        "bindings.create",
        json!({ "organizationId": org, "serviceId": everywhere, "kind": "database", "engine": "postgresql", "name": "main" }),
    );
    assert_eq!(ambiguous["code"], "binding-placement-ambiguous", "{ambiguous}");

    // ---- deleting the binding ends its access at once, and its data goes when asked ----
    let deleted = w.ok("bindings.delete", json!({ "organizationId": org, "bindingId": binding, "data": "drop" }));
    assert_eq!(deleted["state"], "deleted", "{deleted}");
    let (ok, out) = psql(&bin, &nodes[0], &url, "SELECT 1;");
    assert!(!ok, "the deleted binding's credentials no longer connect: {out}");
    let listed = w.ok("bindings.list", json!({ "organizationId": org, "serviceId": ledger }));
    assert_eq!(listed["bindings"], json!([]), "{listed}");
    // the other binding is kept, its data with it
    let kept = w.ok("bindings.delete", json!({ "organizationId": org, "bindingId": theirs["id"], "data": "keep" }));
    assert_eq!(kept["state"], "deleted", "{kept}");
}
