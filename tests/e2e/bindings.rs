//! Platform bindings end to end (docs/bindings.md): a service of the two-node setup is given its
//! own PostgreSQL database by the bindings manager; its replicas wait (`bindings-pending`) until
//! the node states a working endpoint; the container is handed `DATABASE_URL` through the
//! secrets path, and that exact URL writes and reads a row from the node's network; another
//! binding's role cannot reach it; deleting the binding ends its access at once. Then a bucket:
//! the keys the container holds put and get in its bucket and nowhere else, and stop at once
//! when the binding goes.
//!
//! Needs what the runtime's tests need (root, podman, the test image) and a PostgreSQL server:
//! `CAPSTAN_TEST_POSTGRES_URL` (an admin role with CREATEROLE and CREATEDB) and
//! `CAPSTAN_TEST_POSTGRES_BIN` (where `psql` is), which `.ci/peers.sh` sets; without them the
//! test says why and skips, unless `CAPSTAN_TEST_REQUIRE_POSTGRES` is set. The bucket part needs
//! an S3 endpoint with IAM that checks credentials (`CAPSTAN_TEST_S3_ADMIN_*`, moto in CI) and
//! boto3 (moto's own dependency); without them it says why and is left out, unless
//! `CAPSTAN_TEST_REQUIRE_S3_ADMIN` is set.

use crate::runtime::{Images, Node, World, forwarder, in_netns, skipped};
use crate::support::eventually;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

const CONVERGE: Duration = Duration::from_secs(120);

/// The admin of the test PostgreSQL server: (user, password, port), and where psql is.
pub(crate) fn postgres() -> Option<((String, String, u16), PathBuf)> {
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
fn psql(bin: &Path, node: &Node, url: &str, sql: &str) -> (bool, String) {
    let out = in_netns(Some(&node.netns), bin.join("psql"))
        .args([url, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("running psql");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The S3 endpoint with IAM and its admin key pair, when the tests have one.
fn s3_admin() -> Option<(String, String, String)> {
    let var = |name: &str| std::env::var(format!("CAPSTAN_TEST_S3_ADMIN_{name}")).ok();
    match (var("ENDPOINT"), var("ACCESS_KEY"), var("SECRET_KEY")) {
        (Some(endpoint), Some(key), Some(secret)) => Some((endpoint, key, secret)),
        _ => {
            let why = "CAPSTAN_TEST_S3_ADMIN_* are not set (.ci/peers.sh starts an S3 server with IAM)";
            assert!(std::env::var_os("CAPSTAN_TEST_REQUIRE_S3_ADMIN").is_none(), "{why}");
            eprintln!("leaving the bucket part of the bindings test out: {why}");
            None
        }
    }
}

/// What the replica's bindings delivered: `NAME=value` lines of its `/cgi-bin/binding-env`.
fn binding_env(node: &Node, name: &str) -> String {
    let page = node.fetch("/cgi-bin/binding-env", 2).unwrap_or_default();
    page.lines().find_map(|l| l.strip_prefix(&format!("{name}="))).unwrap_or_default().to_string()
}

/// With the key pair `env` names (`S3_*` as delivered): put and get `note.txt` in its bucket, then
/// try to put into `other`; answers boto3's account of it (`OK`, `OTHER-DENIED <code>`, or an
/// error).
fn with_bucket_keys(env: &[(String, String)], other: &str) -> String {
    const SCRIPT: &str = r#"
import os, sys, boto3, botocore
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name=os.environ["S3_REGION"],
                  aws_access_key_id=os.environ["S3_ACCESS_KEY_ID"], aws_secret_access_key=os.environ["S3_SECRET_ACCESS_KEY"])
bucket = os.environ["S3_BUCKET"]
try:
    s3.put_object(Bucket=bucket, Key="note.txt", Body=b"paid")
    assert s3.get_object(Bucket=bucket, Key="note.txt")["Body"].read() == b"paid"
    print("OK")
except botocore.exceptions.ClientError as e:
    print("OWN-DENIED", e.response["Error"]["Code"])
try:
    s3.put_object(Bucket=sys.argv[1], Key="x", Body=b"x")
    print("OTHER-ALLOWED")
except botocore.exceptions.ClientError as e:
    print("OTHER-DENIED", e.response["Error"]["Code"])
"#;
    let out =
        std::process::Command::new("python3").args(["-c", SCRIPT, other]).envs(env.iter().cloned()).output().expect("running python3");
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
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
    eventually("the placed binding waits for the node's database", CONVERGE, || {
        let pending = w.ok("bindings.get", json!({ "organizationId": org, "bindingId": binding }));
        let placed = (pending["state"].as_str(), pending["reason"].as_str(), pending["nodeId"].as_str());
        if placed == (Some("pending"), Some("database-endpoint-missing"), Some(node.as_str())) { Ok(()) } else { Err(pending.to_string()) }
    });

    // ---- the node's database endpoint: the server on the host's loopback, reached at the host's end of the node's link ----
    let listen = format!("{}:{}", nodes[0].host_ip, crate::support::free_port());
    nodes[0].forwarders.push(forwarder(None, &listen, &format!("127.0.0.1:{pg_port}")));
    let (host, port) = listen.rsplit_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    let recipient = w.ok("secrets.getIngressRecipient", json!({}));
    let endpoint = |password: &str, revision: Value| {
        let sealed = crate::secrets::seal(&recipient, "nodes.setStorageEndpoint", &node, "database", password.as_bytes())["sealed"].clone();
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
        let url = binding_env(&nodes[0], "DATABASE_URL");
        if url.starts_with("postgres") { Ok(url) } else { Err(url) }
    });
    let facet = w.ok("services.get", json!({ "id": ledger }))["facets"]["bindings"].clone();
    assert_eq!(facet["bindings"][0]["state"], "ready", "{facet}");
    let secret_password = url.split('@').next().and_then(|c| c.rsplit(':').next()).unwrap().to_string();
    for shown in [w.ok("bindings.get", json!({ "organizationId": org, "bindingId": binding })), facet] {
        assert!(!shown.to_string().contains(&secret_password), "no credential in a binding's record or facet: {shown}");
    }

    // ---- the URL the workload holds writes and reads a row, from the node's network ----
    let (ok, out) =
        psql(&bin, &nodes[0], &url, "CREATE TABLE entries (note text); INSERT INTO entries VALUES ('paid'); SELECT note FROM entries;");
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
    let to_theirs = format!("{}/{their_database}", url.strip_suffix(&format!("/{database}")).expect("the URL ends with its database"));
    let (ok, out) = psql(&bin, &nodes[0], &to_theirs, "SELECT 1;");
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

    // ---- a bucket: the keys the replica holds reach its bucket and no other ----
    if let Some((s3_endpoint, s3_key, s3_secret)) = s3_admin() {
        let sealed =
            crate::secrets::seal(&recipient, "nodes.setStorageEndpoint", &node, "objectStorage", s3_secret.as_bytes())["sealed"].clone();
        let revision = w.ok("nodes.getStorageEndpoint", json!({ "nodeId": node }))["revision"].clone();
        let stated = w.ok(
            "nodes.setStorageEndpoint",
            json!({ "nodeId": node, "expectedRevision": revision,
                    "objectStorage": { "endpoint": s3_endpoint, "region": "us-east-1", "accessKeyId": s3_key, "sealedSecretAccessKey": sealed } }),
        );
        assert_eq!(stated["objectStorage"]["endpoint"], s3_endpoint.as_str(), "{stated}");
        assert!(stated["database"].is_object(), "the database endpoint is kept: {stated}");
        assert!(!stated.to_string().contains(&s3_secret), "the admin secret key is never shown");
        let files = w.ok(
            "bindings.create",
            json!({ "organizationId": org, "serviceId": ledger, "kind": "objectstorage", "engine": "s3", "name": "files" }),
        );
        assert_eq!(files["state"], "ready", "{files}");
        let theirs = w.ok(
            "bindings.create",
            json!({ "organizationId": org, "serviceId": other, "kind": "objectstorage", "engine": "s3", "name": "files" }),
        );
        let bucket = files["resource"].as_str().unwrap().to_string();
        // the replica is replaced with its new secrets, and holds the bucket's keys
        let env = eventually("the replica holds S3_*", CONVERGE, || {
            let env: Vec<(String, String)> = ["S3_ENDPOINT", "S3_BUCKET", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY", "S3_REGION"]
                .iter()
                .map(|n| (n.to_string(), binding_env(&nodes[0], n)))
                .collect();
            if env[1].1 == bucket && env.iter().all(|(_, v)| !v.is_empty()) { Ok(env) } else { Err(format!("{:?}", env[1])) }
        });
        let answered = with_bucket_keys(&env, theirs["resource"].as_str().unwrap());
        assert!(answered.contains("OK\n") && answered.contains("OTHER-DENIED AccessDenied"), "{answered}");
        let gone = w.ok("bindings.delete", json!({ "organizationId": org, "bindingId": files["id"], "data": "drop" }));
        assert_eq!(gone["state"], "deleted", "{gone}");
        let answered = with_bucket_keys(&env, theirs["resource"].as_str().unwrap());
        assert!(answered.contains("OWN-DENIED InvalidAccessKeyId"), "the deleted binding's keys stop at once: {answered}");
        w.ok("bindings.delete", json!({ "organizationId": org, "bindingId": theirs["id"], "data": "drop" }));
    }

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
