//! `capstan nodes …` end to end: the real `capstan` binary as a client of `capstan serve --dev`.
//! A jump command created and printed with its expiry; a machine enrolled with its code and
//! beating over the agent's wire (played here with HTTP, no agent process needed); the list and
//! the node for people and as the API's exact JSON; a hostname intent set, shown pending, then
//! applied once reported, and reset; a rotation that replays; revoke, retire and delete refused
//! without --yes when standard input is a pipe, then done with it; the deletion impact; a bad id
//! refused by name; and never a token or its hash in anything the CLI prints.

use crate::support::{
    Capstan, Exited, TEST_ADMIN, capstan, client, dev_command, json_of, ok, run_to_exit, sha256_hex, succeeded, with_test_admin,
};
use serde_json::{Value, json};
use std::path::Path;

const PROTOCOL: &str = "capstan-agent/1";

/// Every CLI run's output, to check no token ever shows.
#[derive(Default)]
struct Outputs(Vec<String>);

impl Outputs {
    /// `capstan nodes ARGS` against `server` as the holder of `token`, standard input a pipe
    /// (`/dev/null`, not a terminal).
    fn nodes(&mut self, server: &Capstan, token: &str, config: &Path, args: &[&str]) -> Exited {
        let mut cmd = client(server, token, config);
        cmd.arg("nodes").args(args);
        let exited = run_to_exit(cmd);
        self.0.push(format!("{}{}", exited.stdout, exited.stderr));
        exited
    }
}

/// A refusal for people: exit 1, `capstan: refused (<code>): …` on standard error.
fn refused(exited: &Exited, code: &str) {
    exited.assert_refused(1, code);
}

/// A refusal with --json: exit 1, `{"ok":false,"error":{"code":…}}` on standard output.
fn refused_json(exited: &Exited, code: &str) -> Value {
    assert_eq!(exited.status.code(), Some(1), "stdout:\n{}\nstderr:\n{}", exited.stdout, exited.stderr);
    let answer: Value = serde_json::from_str(exited.stdout.trim()).expect("one line of JSON");
    assert_eq!((answer["ok"].clone(), answer["error"]["code"].clone()), (json!(false), json!(code)), "{answer}");
    answer
}

fn report(hostname: &str, apply: Option<Value>) -> Value {
    let mut report = json!({
        "hostname": hostname, "os": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.1.0-18-amd64", "arch": "x86_64",
        "cpus": 4, "memoryBytes": 8_589_934_592u64, "diskBytes": 107_374_182_400u64, "diskFreeBytes": 53_687_091_200u64,
        "agentVersion": "0.1.0", "uptimeSeconds": 3600, "addresses": ["192.0.2.10", "2001:db8::10"],
    });
    if let Some(apply) = apply {
        report["hostApply"] = apply;
    }
    report
}

fn beat(server: &Capstan, node_id: &str, token: &str, report: Value) -> crate::support::Reply {
    let bearer = format!("Bearer {token}");
    let body = json!({ "protocol": PROTOCOL, "nodeId": node_id, "report": report });
    server.request(
        "POST",
        "/agent/v1/heartbeat",
        &[("content-type", "application/json"), ("authorization", &bearer)],
        Some(body.to_string().as_bytes()),
    )
}

/// The table row of `id` in `listing`.
fn row<'a>(listing: &'a str, id: &str) -> &'a str {
    listing.lines().find(|l| l.starts_with(id)).unwrap_or_else(|| panic!("a row for {id} in:\n{listing}"))
}

#[test]
fn the_nodes_cli_creates_a_jump_command_reads_changes_and_retires_nodes_and_refuses_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    server.ready_status();
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let cluster = ok(&server, &admin, "clusters.create", json!({ "name": "cli-nodes" }));
    let cluster_id = cluster["cluster"]["id"].as_str().unwrap().to_string();
    let mut out = Outputs::default();

    // ---- help that says what each does and what it refuses ----
    let help = run_to_exit({
        let mut cmd = capstan();
        cmd.args(["nodes", "--help"]);
        cmd
    });
    for verb in ["list", "get", "jump", "credential", "rotate", "revoke", "set-hostname", "reset-hostname", "retire", "impact", "delete"] {
        assert!(help.stdout.lines().any(|l| l.trim_start().starts_with(verb)), "`capstan nodes --help` lists {verb}:\n{}", help.stdout);
    }
    let revoke_help = run_to_exit({
        let mut cmd = capstan();
        cmd.args(["nodes", "revoke", "--help"]);
        cmd
    });
    assert!(revoke_help.stdout.contains("confirmation-required") && revoke_help.stdout.contains("--yes"), "{}", revoke_help.stdout);

    // ---- an empty cluster, and the jump command printed with its expiry ----
    let empty = out.nodes(&server, &admin, &config, &["list", "--cluster", &cluster_id]);
    assert!(succeeded(&empty).contains(&format!("capstan nodes jump --cluster {cluster_id}")), "{}", empty.stdout);

    let jump = out.nodes(
        &server,
        &admin,
        &config,
        &["jump", "--cluster", &cluster_id, "--name", "alpha", "--set-hostname", "--ttl-minutes", "10"],
    );
    let printed = succeeded(&jump);
    let origin = format!("http://{}", server.addr);
    let command = printed.lines().map(str::trim).find(|l| l.starts_with("curl ")).unwrap_or_else(|| panic!("a command line:\n{printed}"));
    let code = command
        .strip_prefix(&format!("curl -fsSL '{origin}/jump/"))
        .and_then(|rest| rest.strip_suffix("' | sudo bash"))
        .unwrap_or_else(|| panic!("the one-line command: {command}"))
        .to_string();
    assert_eq!(code.len(), 16, "{command}");
    assert!(printed.contains("It works once, until ") && (printed.contains("(in 9 min)") || printed.contains("(in 10 min)")), "{printed}");
    assert!(printed.contains("shown this once"), "{printed}");
    // the command is what the server serves: its script enrolls with that code
    let script = server.get(&format!("/jump/{code}/setup.sh"));
    assert_eq!(script.status, 200, "{}", script.body);

    // with --json: the API's exact answer (another code, for no name)
    let second = json_of(&out.nodes(&server, &admin, &config, &["jump", "--cluster", &cluster_id, "--json"]));
    let second_code = second["code"].as_str().unwrap().to_string();
    assert_eq!(second["command"], format!("curl -fsSL '{origin}/jump/{second_code}' | sudo bash"));
    assert!(second["expiresAt"].as_u64().is_some() && second["scriptUrl"].is_string() && second["url"].is_string(), "{second}");
    assert_ne!(second_code, code);

    // refusals of jump, by name
    refused(&out.nodes(&server, &admin, &config, &["jump", "--cluster", "cluster_nope"]), "cluster-not-found");
    refused(&out.nodes(&server, &admin, &config, &["jump", "--cluster", &cluster_id, "--ttl-minutes", "5000"]), "invalid-request");
    refused(
        &out.nodes(&server, &admin, &config, &["jump", "--cluster", &cluster_id, "--name", "alpha", "--set-hostname"]),
        "hostname-in-use",
    );
    let unnamed = out.nodes(&server, &admin, &config, &["jump", "--cluster", &cluster_id, "--set-hostname"]);
    assert!(!unnamed.status.success() && unnamed.stderr.contains("--name"), "--set-hostname needs a name: {}", unnamed.stderr);
    refused(&out.nodes(&server, &admin, &config, &["jump", "--cluster", &cluster_id, "--name", "Not_A_Name"]), "name-invalid");

    // ---- a machine enrolls with the printed code, and beats ----
    let token = "a1".repeat(32);
    let enroll =
        json!({ "protocol": PROTOCOL, "code": code, "hostname": "machine-a", "tokenSha256": sha256_hex(&token), "agentVersion": "0.1.0" });
    let enrolled = server.request("POST", "/agent/v1/enroll", &[("content-type", "application/json")], Some(enroll.to_string().as_bytes()));
    let enrolled = enrolled.expect_json(200);
    let node_id = enrolled["nodeId"].as_str().unwrap().to_string();
    assert_eq!(enrolled["hostname"], "worker-alpha", "{enrolled}");

    let never = out.nodes(&server, &admin, &config, &["list", "--cluster", &cluster_id]);
    let line = row(succeeded(&never), &node_id);
    assert!(line.contains("worker-alpha") && line.contains("never-reported") && line.contains("never"), "{line}");

    beat(&server, &node_id, &token, report("worker-alpha", None)).expect_json(200);

    // ---- the list: a table for people, the exact answer with --json ----
    // the cluster by its name; the CLUSTER column shows its name too
    let listed = out.nodes(&server, &admin, &config, &["list", "--cluster", "cli-nodes"]);
    let table = succeeded(&listed);
    let header = table.lines().next().unwrap();
    for column in ["ID", "CLUSTER", "NAME", "HOSTNAME", "STATE", "LAST REPORT", "HOSTNAME INTENT"] {
        assert!(header.contains(column), "{header}");
    }
    let line = row(table, &node_id);
    assert!(line.contains(" cli-nodes ") && line.contains("alpha") && line.contains("worker-alpha"), "{line}");
    assert!(line.contains(" live ") && line.contains("s ago"), "live, reported seconds ago: {line}");

    let listed_json = json_of(&out.nodes(&server, &admin, &config, &["list", "--cluster", &cluster_id, "--json"]));
    let api_list = ok(&server, &admin, "nodes.list", json!({ "clusterId": cluster_id }));
    assert_eq!(listed_json, api_list, "--json prints the API's answer exactly");
    assert_eq!(listed_json["items"][0]["liveness"], "live");

    // ---- one node ----
    let got = out.nodes(&server, &admin, &config, &["get", &node_id]);
    let shown = succeeded(&got);
    assert!(shown.contains(&format!("alpha ({node_id})")) && shown.contains("active (live)"), "{shown}");
    assert!(shown.contains("intent:      none (generation 0)"), "{shown}");
    assert!(shown.contains("Debian GNU/Linux 12") && shown.contains("192.0.2.10, 2001:db8::10") && shown.contains("8.0 GiB"), "{shown}");
    let got_json = json_of(&out.nodes(&server, &admin, &config, &["get", &node_id, "--json"]));
    assert_eq!(got_json, ok(&server, &admin, "nodes.get", json!({ "id": node_id })));

    // ---- the hostname intent: set, pending, applied once reported, refused by name, reset ----
    let set = out.nodes(&server, &admin, &config, &["set-hostname", &node_id, "web-1", "--expected-generation", "0"]);
    assert!(succeeded(&set).contains("is to carry web-1 (intent generation 1)"), "{}", set.stdout);
    let pending = out.nodes(&server, &admin, &config, &["list"]);
    assert!(row(succeeded(&pending), &node_id).contains("web-1 (pending, gen 1)"), "{}", pending.stdout);
    let apply = json!({ "generation": 1, "hostname": "web-1", "outcome": "applied" });
    beat(&server, &node_id, &token, report("web-1", Some(apply))).expect_json(200);
    let applied = out.nodes(&server, &admin, &config, &["list"]);
    let line = row(succeeded(&applied), &node_id);
    assert!(line.contains("web-1 (applied, gen 1)") && line.contains(" web-1 "), "{line}");
    let got = out.nodes(&server, &admin, &config, &["get", &node_id]);
    assert!(succeeded(&got).contains("applied:   applied web-1 (generation 1)"), "{}", got.stdout);
    assert!(got.stdout.contains("reached:   - (several addresses and none advertised"), "{}", got.stdout);
    // an advertised address is where the node's published ports are reached
    let mut advertised = report("web-1", None);
    advertised["advertisedAddress"] = json!("192.0.2.10");
    beat(&server, &node_id, &token, advertised).expect_json(200);
    let got = out.nodes(&server, &admin, &config, &["get", &node_id]);
    assert!(succeeded(&got).contains("reached:   192.0.2.10 (advertised)"), "{}", got.stdout);

    refused(&out.nodes(&server, &admin, &config, &["set-hostname", &node_id, "web-2", "--expected-generation", "0"]), "conflict");
    refused(&out.nodes(&server, &admin, &config, &["set-hostname", &node_id, "Web_2", "--expected-generation", "1"]), "hostname-invalid");
    refused(&out.nodes(&server, &admin, &config, &["set-hostname", &node_id, "web-1", "--expected-generation", "1"]), "hostname-unchanged");
    let reset = json_of(&out.nodes(&server, &admin, &config, &["reset-hostname", &node_id, "--expected-generation", "1", "--json"]));
    // the name of the intent set (web-1) stands until another is given
    assert_eq!(
        (reset["hostnameIntent"]["hostname"].as_str(), reset["hostnameIntent"]["generation"].as_u64()),
        (Some("worker-web-1"), Some(2))
    );
    let reset = out.nodes(&server, &admin, &config, &["reset-hostname", &node_id, "--expected-generation", "2", "--name", "beta"]);
    assert!(succeeded(&reset).contains("is to carry worker-beta (intent generation 3)"), "{}", reset.stdout);

    // ---- the credential: metadata only; a rotation that replays ----
    let credential = out.nodes(&server, &admin, &config, &["credential", &node_id]);
    let shown = succeeded(&credential);
    assert!(shown.contains("state:         active") && shown.contains("generation:    1"), "{shown}");
    let new_token = "b2".repeat(32);
    let new_hash = sha256_hex(&new_token);
    let rotate = ["rotate", &node_id, "--token-sha256", &new_hash, "--expected-generation", "1", "--mutation-id", "e2e-rotate-1", "--json"];
    let rotated = json_of(&out.nodes(&server, &admin, &config, &rotate));
    assert_eq!((rotated["generation"].as_u64(), rotated["state"].as_str()), (Some(2), Some("active")), "{rotated}");
    let replayed = json_of(&out.nodes(&server, &admin, &config, &rotate));
    assert_eq!(replayed, rotated, "the same mutation id replays the recorded answer");
    beat(&server, &node_id, &token, report("web-1", None)).expect_error(401, "node-unauthorized");
    beat(&server, &node_id, &new_token, report("web-1", None)).expect_json(200);
    // refused by name: a stale generation, material that is not a SHA-256
    let third = "c3".repeat(32);
    let third_hash = sha256_hex(&third);
    refused(
        &out.nodes(&server, &admin, &config, &["rotate", &node_id, "--token-sha256", &third_hash, "--expected-generation", "1"]),
        "conflict",
    );
    refused(
        &out.nodes(&server, &admin, &config, &["rotate", &node_id, "--token-sha256", "not-a-hash", "--expected-generation", "2"]),
        "invalid-request",
    );
    // a mutation id the CLI generated, printed for a safe retry
    let generated = out.nodes(&server, &admin, &config, &["rotate", &node_id, "--token-sha256", &third_hash, "--expected-generation", "2"]);
    let shown = succeeded(&generated);
    assert!(shown.contains("generation 3") && shown.contains("mutation id cli-"), "{shown}");
    beat(&server, &node_id, &new_token, report("web-1", None)).expect_error(401, "node-unauthorized");
    beat(&server, &node_id, &third, report("web-1", None)).expect_json(200);

    // ---- revoke, retire and delete ask; piped without --yes they are refused and send nothing ----
    refused(&out.nodes(&server, &admin, &config, &["revoke", &node_id]), "confirmation-required");
    refused_json(&out.nodes(&server, &admin, &config, &["revoke", &node_id, "--json"]), "confirmation-required");
    refused(&out.nodes(&server, &admin, &config, &["retire", &node_id]), "confirmation-required");
    refused(&out.nodes(&server, &admin, &config, &["delete", &node_id]), "confirmation-required");
    let still = ok(&server, &admin, "nodes.getCredential", json!({ "nodeId": node_id }));
    assert_eq!((still["state"].as_str(), still["generation"].as_u64()), (Some("active"), Some(3)), "nothing was revoked: {still}");
    assert_eq!(ok(&server, &admin, "nodes.get", json!({ "id": node_id }))["state"], "active");

    // the impact of deleting an active node, and the refusal it names
    let impact = out.nodes(&server, &admin, &config, &["impact", &node_id]);
    let shown = succeeded(&impact);
    assert!(shown.contains("retired: no") && shown.contains("node-not-retired: "), "{shown}");
    refused(&out.nodes(&server, &admin, &config, &["delete", &node_id, "--yes"]), "node-not-retired");

    let revoked = out.nodes(&server, &admin, &config, &["revoke", &node_id, "--yes"]);
    assert!(succeeded(&revoked).contains("revoked the credential of") && revoked.stdout.contains("(generation 4)"), "{}", revoked.stdout);
    beat(&server, &node_id, &third, report("web-1", None)).expect_error(401, "node-unauthorized");
    refused(&out.nodes(&server, &admin, &config, &["revoke", &node_id, "--yes"]), "credential-revoked");

    let retired = out.nodes(&server, &admin, &config, &["retire", &node_id, "--yes"]);
    assert!(succeeded(&retired).contains(&format!("retired node {node_id}")), "{}", retired.stdout);
    let listed = out.nodes(&server, &admin, &config, &["list", "--cluster", &cluster_id]);
    assert!(row(succeeded(&listed), &node_id).contains(" retired "), "{}", listed.stdout);
    refused(&out.nodes(&server, &admin, &config, &["retire", &node_id, "--yes"]), "node-retired");
    let impact = json_of(&out.nodes(&server, &admin, &config, &["impact", &node_id, "--json"]));
    assert_eq!(impact, json!({ "id": node_id, "retired": true, "blockers": [] }));
    refused(&out.nodes(&server, &admin, &config, &["delete", &node_id, "--expected-revision", "1", "--yes"]), "conflict");
    let deleted = json_of(&out.nodes(&server, &admin, &config, &["delete", &node_id, "--yes", "--json"]));
    assert_eq!(deleted, json!({ "id": node_id, "deleted": true }));

    // ---- a bad id is refused by name ----
    refused(&out.nodes(&server, &admin, &config, &["get", &node_id]), "node-missing");
    refused(&out.nodes(&server, &admin, &config, &["get", "no such/node"]), "node-missing");
    refused_json(&out.nodes(&server, &admin, &config, &["impact", "node_missing", "--json"]), "node-missing");
    refused(&out.nodes(&server, &admin, &config, &["credential", "node_missing"]), "node-missing");
    refused(&out.nodes(&server, &admin, &config, &["set-hostname", "node_missing", "web-9", "--expected-generation", "0"]), "node-missing");
    refused(&out.nodes(&server, &admin, &config, &["retire", "node_missing", "--yes"]), "node-missing");

    // without a session: refused by the server, by name
    let mut anonymous = capstan();
    anonymous.args(["nodes", "list"]).env("CAPSTAN_URL", server.url("")).env("XDG_CONFIG_HOME", &config);
    run_to_exit(anonymous).assert_refused(1, "unauthenticated");

    // ---- never a token, nor its hash ----
    for secret in [token.as_str(), new_token.as_str(), third.as_str(), &sha256_hex(&token), &new_hash, &third_hash] {
        for output in &out.0 {
            assert!(!output.contains(secret), "a token or its hash was printed:\n{output}");
        }
        assert!(!server.stderr().contains(secret), "the server logged a token or its hash");
    }
}
