//! `capstan services run | stop | status` end to end: the real `capstan` binary as a client of
//! `capstan serve --dev`. A service pinned by digest is run on a cluster (every node by default,
//! then on a node named by its name, with replicas and a health check), each write against the
//! revision the CLI read, never one typed; refusals by name (a node the cluster does not have, a
//! port the service does not declare, a health check that does not parse); the status per
//! cluster with the verdict the runtime decides within a few seconds, and as the method's exact
//! answer; a stop that keeps the spec, and a run that resumes it.

use crate::support::{
    Capstan, Exited, TEST_ADMIN, capstan, cli, dev_command, eventually, json_of, ok, run_to_exit, sha256_hex, succeeded, with_test_admin,
};
use serde_json::{Value, json};
use std::time::Duration;

const PROTOCOL: &str = "capstan-agent/1";

/// A refusal for people: exit 1, `capstan: refused (<code>): …` on standard error.
fn refused<'a>(exited: &'a Exited, code: &str) -> &'a str {
    exited.assert_refused(1, code)
}

/// The line of `text` that starts with `prefix` (after indentation).
fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines().find(|l| l.trim_start().starts_with(prefix)).unwrap_or_else(|| panic!("a line starting {prefix:?} in:\n{text}"))
}

#[test]
fn services_run_writes_specs_against_the_revision_read_and_status_prints_each_cluster_with_its_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    server.ready_status();
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let run = |args: &[&str]| cli(&server, &admin, &config, args);

    // ---- help that says what each does, with an example ----
    for verb in ["run", "stop", "status"] {
        let help = run_to_exit({
            let mut cmd = capstan();
            cmd.args(["services", verb, "--help"]);
            cmd
        });
        assert!(help.stdout.contains(&format!("Example: capstan services {verb} web")), "{verb}:\n{}", help.stdout);
    }

    // ---- an organization, a cluster, a service pinned by digest, a node ----
    ok(&server, &admin, "organizations.create", json!({ "name": "acme" }));
    let cluster = json_of(&run(&["clusters", "create", "eu-1", "--json"]));
    let cluster_id = cluster["cluster"]["id"].as_str().unwrap().to_string();
    json_of(&run(&["clusters", "create", "eu-2", "--json"]));
    let image = format!("reg.example/x@sha256:{}", "0f".repeat(32));
    let service = json_of(&run(&[
        "services",
        "create",
        "--organization",
        "acme",
        "--name",
        "web",
        "--image",
        &image,
        "--port",
        "8080/http",
        "--json",
    ]));
    let service_id = service["id"].as_str().unwrap().to_string();
    let jump = ok(&server, &admin, "nodes.createJumpCommand", json!({ "clusterId": cluster_id, "nodeName": "alpha" }));
    let token = "e4".repeat(32);
    let enroll = json!({ "protocol": PROTOCOL, "code": jump["code"], "hostname": "machine-a", "tokenSha256": sha256_hex(&token), "agentVersion": "0.1.0" });
    let enrolled = server.request("POST", "/agent/v1/enroll", &[("content-type", "application/json")], Some(enroll.to_string().as_bytes()));
    let node_id = enrolled.expect_json(200)["nodeId"].as_str().unwrap().to_string();
    let report = json!({ "hostname": "worker-alpha", "os": "Debian GNU/Linux 12", "kernel": "6.1.0", "arch": "x86_64", "cpus": 2,
        "memoryBytes": 1u64 << 31, "diskBytes": 1u64 << 34, "diskFreeBytes": 1u64 << 33, "agentVersion": "0.1.0", "uptimeSeconds": 60, "addresses": [] });
    let beat = json!({ "protocol": PROTOCOL, "nodeId": node_id, "report": report });
    let bearer = format!("Bearer {token}");
    let headers = [("content-type", "application/json"), ("authorization", bearer.as_str())];
    server.request("POST", "/agent/v1/heartbeat", &headers, Some(beat.to_string().as_bytes())).expect_json(200);

    // ---- a service that runs nowhere ----
    let nowhere = run(&["services", "status", "web"]);
    assert!(succeeded(&nowhere).contains("runs on no cluster"), "{}", nowhere.stdout);

    // ---- run: a first spec (every node, 1 replica), the exact answer with --json ----
    let first = json_of(&run(&["services", "run", "web", "--cluster", "eu-1", "--json"]));
    assert_eq!(
        (first["revision"].as_u64(), first["serviceId"].as_str(), first["clusterId"].as_str()),
        (Some(1), Some(service_id.as_str()), Some(cluster_id.as_str()))
    );
    assert_eq!(
        (first["placement"].clone(), first["replicasPerNode"].as_u64(), first["hold"].as_bool()),
        (json!({ "everyNode": true }), Some(1), Some(false))
    );
    assert_eq!(first["health"]["kind"], "none");

    // ---- run again: the node by its name, the revision read (never typed), what it replaced shown ----
    let second = run(&[
        "services",
        "run",
        "web",
        "--cluster",
        "eu-1",
        "--node",
        "alpha",
        "--replicas",
        "2",
        "--health",
        "http:8080/up",
        "--org",
        "acme",
    ]);
    let said = succeeded(&second);
    assert!(
        said.starts_with(&format!("web ({service_id}) runs on eu-1 ({cluster_id}): node alpha, 2 replicas per node, restart on-failure, health http:8080/up (spec revision 2)\n")),
        "{said}"
    );
    assert!(line(said, "it was:").contains("every active node, 1 replica per node, restart on-failure, no health check"), "{said}");
    assert!(said.contains("capstan services status web"), "{said}");
    let spec = &ok(&server, &admin, "runtime.getServiceSpec", json!({ "serviceId": service_id, "clusterId": cluster_id }))["items"][0];
    assert_eq!((spec["revision"].as_u64(), spec["placement"].clone()), (Some(2), json!({ "nodes": [node_id] })));
    assert_eq!((spec["health"]["port"].as_u64(), spec["health"]["path"].as_str()), (Some(8080), Some("/up")));

    // ---- refusals by name ----
    let nosuch = run(&["services", "run", "web", "--cluster", "eu-1", "--node", "nosuch"]);
    assert!(refused(&nosuch, "node-not-found").contains("\"nosuch\"") && nosuch.stderr.contains("eu-1"), "{}", nosuch.stderr);
    let elsewhere = run(&["services", "run", "web", "--cluster", "eu-1", "--node", "node_0123456789abcdef0123456789abcdef"]);
    refused(&elsewhere, "node-not-in-cluster");
    refused(&run(&["services", "run", "web", "--cluster", "eu-1", "--health", "tcp:9999"]), "health-port-undeclared");
    refused(&run(&["services", "run", "web", "--cluster", "eu-9"]), "cluster-not-found");
    refused(&run(&["services", "run", "nope", "--cluster", "eu-1"]), "service-not-found");
    let unparsed = run(&["services", "run", "web", "--cluster", "eu-1", "--health", "http:eighty"]);
    assert_eq!(unparsed.status.code(), Some(2), "{unparsed:?}");
    assert!(unparsed.stderr.contains("--health") && unparsed.stderr.contains("is not a port"), "{}", unparsed.stderr);
    let error = json_of_refusal(&run(&["services", "run", "web", "--cluster", "eu-1", "--node", "nosuch", "--json"]));
    assert_eq!(error["code"], "node-not-found", "{error}");
    let spec = &ok(&server, &admin, "runtime.getServiceSpec", json!({ "serviceId": service_id, "clusterId": cluster_id }))["items"][0];
    assert_eq!(spec["revision"], 2, "nothing refused was written");

    // ---- status: the cluster, its spec and, within a few seconds, the runtime's verdict ----
    let status = eventually("a verdict decided by the runtime", Duration::from_secs(60), || {
        let exited = run(&["services", "status", "web"]);
        let text = succeeded(&exited).to_string();
        if line(&text, "verdict:").contains("not decided yet") { Err(text) } else { Ok(text) }
    });
    assert!(status.starts_with(&format!("cluster eu-1 ({cluster_id})\n")), "{status}");
    assert!(
        line(&status, "spec:").contains("node alpha, 2 replicas per node") && line(&status, "spec:").contains("(revision 2)"),
        "{status}"
    );
    let verdict = line(&status, "verdict:");
    assert!(
        ["converged", "converging", "waiting (", "refused ("].iter().any(|v| verdict
            .trim()
            .trim_start_matches("verdict:")
            .trim()
            .starts_with(v)),
        "{verdict}"
    );
    let answer = json_of(&run(&["services", "status", "web", "--json"]));
    assert_eq!(
        (answer["serviceId"].as_str(), answer["targets"][0]["clusterId"].as_str()),
        (Some(service_id.as_str()), Some(cluster_id.as_str()))
    );
    assert_eq!(answer["targets"][0]["specRevision"], 2);
    let yaml = succeeded(&run(&["services", "status", "web", "-o", "yaml"])).to_string();
    assert!(yaml.contains(&format!("serviceId: {service_id}")), "{yaml}");
    if answer["targets"][0]["slots"].as_array().is_some_and(|s| !s.is_empty()) {
        let status = succeeded(&run(&["services", "status", "web"])).to_string();
        let header = line(&status, "SLOT");
        for column in ["NODE", "PHASE", "READY", "DIGEST", "RESTARTS", "CAUSE"] {
            assert!(header.contains(column), "{header}");
        }
        assert!(status.lines().any(|l| l.starts_with("0 ") && l.contains(" alpha ")), "a slot on alpha, by its name: {status}");
    }

    // ---- stop keeps the spec; run resumes it ----
    let stopped = run(&["services", "stop", "web", "--cluster", "eu-1"]);
    assert!(
        succeeded(&stopped).starts_with(&format!("web ({service_id}) is held on eu-1 ({cluster_id}): its replicas stop")),
        "{}",
        stopped.stdout
    );
    let spec = &ok(&server, &admin, "runtime.getServiceSpec", json!({ "serviceId": service_id, "clusterId": cluster_id }))["items"][0];
    assert_eq!((spec["hold"].as_bool(), spec["revision"].as_u64(), spec["replicasPerNode"].as_u64()), (Some(true), Some(3), Some(2)));
    assert_eq!(spec["placement"], json!({ "nodes": [node_id] }), "the rest of the spec is kept");
    let again = run(&["services", "stop", "web", "--cluster", "eu-1"]);
    assert!(
        succeeded(&again).contains(&format!("is already held on eu-1 ({cluster_id}); nothing changed (spec revision 3)")),
        "{}",
        again.stdout
    );
    assert!(line(succeeded(&run(&["services", "status", "web"])), "spec:").contains("held: nothing runs"));
    refused(&run(&["services", "stop", "web", "--cluster", "eu-2"]), "spec-not-found");
    // the command it prints states the held spec again
    let again = line(&stopped.stdout, "run it again:").trim().trim_start_matches("run it again:").trim().to_string();
    assert_eq!(again, format!("capstan services run web --cluster eu-1 --node {node_id} --replicas 2 --health http:8080/up"));
    let mut resume: Vec<&str> = again.split_whitespace().skip(1).collect();
    resume.push("--json");
    let resumed = json_of(&run(&resume));
    assert_eq!(
        (resumed["hold"].as_bool(), resumed["revision"].as_u64(), resumed["placement"].clone()),
        (Some(false), Some(4), json!({ "nodes": [node_id] }))
    );
    assert_eq!((resumed["replicasPerNode"].as_u64(), resumed["health"]["path"].as_str()), (Some(2), Some("/up")));
}

/// A refusal with --json: exit 1, `{"ok":false,"error":{…}}` on standard output; the error.
fn json_of_refusal(exited: &Exited) -> Value {
    assert_eq!(exited.status.code(), Some(1), "stdout:\n{}\nstderr:\n{}", exited.stdout, exited.stderr);
    let answer: Value = serde_json::from_str(exited.stdout.trim()).expect("one line of JSON");
    assert_eq!(answer["ok"], false, "{answer}");
    answer["error"].clone()
}
