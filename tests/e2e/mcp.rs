//! The read-only MCP endpoint at `/mcp`, through a real MCP client (the official Rust SDK's,
//! over streamable HTTP): an administrator lists the tools and calls each; values planted
//! beforehand (a secret, a service's environment value, a relay bearer, machine and session
//! tokens, a password) appear in no answer; a member and an anonymous caller are refused.

use crate::support::*;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use std::collections::BTreeSet;

const PLANTED_SECRET: &str = "mcp-planted-secret-value-3f9a1c";
const PLANTED_ENVIRONMENT: &str = "mcp-planted-environment-value-8d2e";
const ZONE: &str = "relays.mcp.example";
const TOOLS: [&str; 7] = ["list_clusters", "list_services", "list_nodes", "list_domains", "list_plugins", "list_tasks", "list_deployments"];

type Client = RunningService<RoleClient, ()>;

/// An MCP session with `/mcp` as the holder of `token` (none: no `Authorization`).
async fn connect(server: &Capstan, token: Option<&str>) -> Result<Client, String> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(server.url("/mcp"));
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    ().serve(StreamableHttpClientTransport::from_config(config)).await.map_err(|e| e.to_string())
}

/// Call `tool` with `arguments`; the answer's structured content, and the whole answer as text.
async fn call(client: &Client, tool: &'static str, arguments: Value) -> (CallToolResult, String) {
    let Value::Object(arguments) = arguments else { panic!("arguments are an object") };
    let result = client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("{tool} should answer, got {e}"));
    let text = serde_json::to_string(&result).unwrap();
    (result, text)
}

fn structured(tool: &str, result: &CallToolResult) -> Value {
    assert_ne!(result.is_error, Some(true), "{tool} should succeed: {result:?}");
    result.structured_content.clone().unwrap_or_else(|| panic!("{tool} answers structured content: {result:?}"))
}

#[test]
fn an_administrator_reads_safe_summaries_over_mcp_and_nobody_else_does() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut cmd = with_test_admin(dev_command(&data));
    cmd.env("CAPSTAN_METRICS_TOKEN", crate::operating::SCRAPE_TOKEN);
    let server = Capstan::start(cmd);
    server.ready_status();
    let ids = Identities::create(&server);
    let admin = ids.token(Kind::Administrator).unwrap().to_string();
    let ok = |method: &str, body: Value| server.call_as(&admin, method, &body).expect_json(200);

    // ---- planted: values no answer may carry ----
    let mut planted: Vec<String> =
        vec![PLANTED_SECRET.into(), PLANTED_ENVIRONMENT.into(), ids.member_password.clone(), ids.deployer_token.clone()];
    planted.extend(Kind::ALL.iter().filter_map(|kind| ids.token(*kind)).map(str::to_string));
    let service = ok(
        "services.create",
        json!({ "name": "shop", "organizationId": ids.organization_id, "image": "nginx:1.27",
                "domains": ["shop.example.com"], "environment": { "GREETING": PLANTED_ENVIRONMENT } }),
    );
    let shop_id = service["id"].as_str().unwrap().to_string();
    let recipient = ok("secrets.getIngressRecipient", json!({}));
    let sealed = crate::secrets::seal(&recipient, "secrets.create", &format!("service:{shop_id}"), "MCP_KEY", PLANTED_SECRET.as_bytes());
    ok("secrets.create", json!({ "owner": { "kind": "service", "serviceId": shop_id }, "key": "MCP_KEY", "value": sealed }));
    // a cluster whose relay is enabled with a bearer minted and exported
    let settings = ok("settings.get", json!({}));
    ok("settings.update", json!({ "expectedRevision": settings["revision"], "set": { "clusterRelayZone": ZONE } }));
    let cluster = ok("clusters.get", json!({ "id": ids.cluster_id }));
    ok("clusters.enableRelay", json!({ "id": ids.cluster_id, "expectedRevision": cluster["revision"] }));
    ok("relays.mutateCredential", json!({ "clusterId": ids.cluster_id, "action": "ensure", "mutationId": "mcp-mint" }));
    let bearer_file = dir.path().join("relay-authorization");
    crate::relays::export(&server, &admin, &dir.path().join("config"), &ids.cluster_id, &bearer_file, &[]);
    planted.push(std::fs::read_to_string(&bearer_file).unwrap().trim().to_string());
    ok("clusters.create", json!({ "name": "second" }));
    // two nodes, one heard from 10 s ago and one 200 s ago: only the first is live (180 s)
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let node = |name: &str, reported: u64| {
        json!({ "clusterId": ids.cluster_id, "name": name, "hostname": format!("worker-{name}"), "state": "active",
                "enrolledAt": now_ms - 600_000, "lastReportAt": reported, "credentialGeneration": 1 })
    };
    with_store(&data.join("capstan.sqlite"), &[], |store| async move {
        capstan::inventory::declare(&store).await.unwrap();
        store
            .transact(|tx| {
                let (fresh, stale) = (node("fresh", now_ms - 10_000), node("stale", now_ms - 200_000));
                async move {
                    tx.insert(capstan::inventory::CLUSTER_NODES, "node_mcpfresh", fresh).await?;
                    tx.insert(capstan::inventory::CLUSTER_NODES, "node_mcpstale", stale).await
                }
            })
            .await
            .unwrap();
    });

    // the first-party App Store is installed in the background at the first start
    crate::appstore::wait_for_appstore(&server, &admin);

    // what the audit log holds of the methods the tools read, and how many calls of them the
    // door counted, per method
    const READS: [&str; 5] = ["clusters.list", "services.list", "nodes.list", "plugins.list", "tasks.list"];
    let audited = || -> Vec<usize> {
        READS
            .iter()
            .map(|method| ok("audit.list", json!({ "method": method, "limit": 200 }))["records"].as_array().unwrap().len())
            .collect()
    };
    let counted = || -> Vec<f64> {
        let (_, samples) = crate::operating::scrape(&server);
        let calls = |method: &str| crate::operating::total(&samples, "capstan_method_calls_total", &[("method", method)]);
        READS.iter().map(|method| calls(method)).collect()
    };
    let before = audited();
    let counted_before = counted();

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut answers = String::new();
    runtime.block_on(async {
        let client = connect(&server, Some(&admin)).await.expect("an administrator's MCP session starts");
        let tools = client.list_all_tools().await.expect("tools/list answers");
        let names: BTreeSet<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, TOOLS.into_iter().collect(), "{tools:?}");
        for tool in &tools {
            assert_eq!(tool.annotations.as_ref().and_then(|a| a.read_only_hint), Some(true), "{} is read-only", tool.name);
        }
        answers.push_str(&serde_json::to_string(&tools).unwrap());

        let mut each = |(result, text): (CallToolResult, String), tool: &str| {
            answers.push_str(&text);
            structured(tool, &result)
        };
        let clusters = each(call(&client, "list_clusters", json!({})).await, "list_clusters");
        let fixture = clusters["clusters"].as_array().unwrap().iter().find(|c| c["name"] == "fixture").expect("the fixture cluster");
        assert_eq!(fixture["relay"]["enabled"], true, "{clusters}");
        assert!(fixture.get("machineUserId").is_none(), "{fixture}");
        // paged: one at a time, the cursor leading to the other
        let first = each(call(&client, "list_clusters", json!({ "limit": 1 })).await, "list_clusters");
        assert_eq!(first["clusters"].as_array().unwrap().len(), 1, "{first}");
        let cursor = first["nextCursor"].as_str().expect("a cursor to the second cluster").to_string();
        let second = each(call(&client, "list_clusters", json!({ "limit": 1, "cursor": cursor })).await, "list_clusters");
        assert_ne!(first["clusters"][0]["id"], second["clusters"][0]["id"], "{first} {second}");

        let services = each(call(&client, "list_services", json!({ "organizationId": ids.organization_id })).await, "list_services");
        let shop = services["services"].as_array().unwrap().iter().find(|s| s["id"] == shop_id.as_str()).expect("the shop service");
        assert_eq!(shop["domains"], json!(["shop.example.com"]), "{shop}");
        assert!(shop.get("environment").is_none(), "{shop}");

        let domains = each(call(&client, "list_domains", json!({})).await, "list_domains");
        assert_eq!(
            domains["domains"],
            json!([{ "domain": "shop.example.com", "serviceId": shop_id, "serviceName": "shop", "organizationId": ids.organization_id }]),
            "{domains}"
        );

        let nodes = each(call(&client, "list_nodes", json!({ "clusterId": ids.cluster_id })).await, "list_nodes");
        let live: BTreeSet<(String, bool)> = nodes["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| (n["name"].as_str().unwrap().to_string(), n["live"].as_bool().unwrap()))
            .collect();
        assert_eq!(live, [("fresh".to_string(), true), ("stale".to_string(), false)].into_iter().collect(), "{nodes}");

        let plugins = each(call(&client, "list_plugins", json!({})).await, "list_plugins");
        assert!(plugins["plugins"].as_array().unwrap().iter().any(|p| p["id"] == "appstore" && p["firstParty"] == true), "{plugins}");

        let tasks = each(call(&client, "list_tasks", json!({})).await, "list_tasks");
        assert!(tasks["tasks"].as_array().unwrap().iter().any(|t| t["id"] == "host.cleanup"), "{tasks}");

        let deployments = each(call(&client, "list_deployments", json!({ "serviceId": shop_id })).await, "list_deployments");
        assert_eq!(deployments, json!({ "deployments": [], "total": 0 }), "{deployments}");

        // a mistaken argument is refused by name, as the API would refuse it
        let (refused, text) = call(&client, "list_plugins", json!({ "verbose": true })).await;
        answers.push_str(&text);
        assert_eq!(refused.is_error, Some(true), "{refused:?}");
        assert_eq!(refused.structured_content.as_ref().unwrap()["error"]["code"], "invalid-request", "{refused:?}");
        client.cancel().await.unwrap();

        // nobody but an administrator gets a session
        for (who, token) in
            [("a member", ids.token(Kind::Member)), ("a cluster machine", ids.token(Kind::ClusterMachine)), ("anyone", None)]
        {
            assert!(connect(&server, token).await.is_err(), "{who} should not start an MCP session");
        }
    });

    // the tools' reads went through the API's door: the door counted each, and the audit log
    // holds of them what it holds of the same reads made over HTTP (reads leave no record)
    let counted_after = counted();
    for (i, method) in READS.iter().enumerate() {
        assert!(
            counted_after[i] > counted_before[i],
            "{method}: the door counted no MCP call of it ({counted_before:?} → {counted_after:?})"
        );
    }
    let after_mcp = audited();
    for method in READS {
        let body = if method == "services.list" { json!({ "organizationId": ids.organization_id }) } else { json!({}) };
        ok(method, body);
    }
    ok("nodes.list", json!({ "clusterId": ids.cluster_id }));
    let after_api = audited();
    for (i, method) in READS.iter().enumerate() {
        let (over_mcp, over_api) = (after_mcp[i] - before[i], after_api[i] - after_mcp[i]);
        assert_eq!(over_mcp > 0, over_api > 0, "{method}: {over_mcp} records over MCP, {over_api} over the API");
    }

    let log = server.stderr();
    for value in &planted {
        assert!(!answers.contains(value.as_str()), "a planted value ({} bytes) reached an MCP answer", value.len());
        assert!(!log.contains(value.as_str()), "a planted value ({} bytes) reached the server's log", value.len());
    }
    // the SDK's per-request lines stay out of the log at the default filter
    assert!(!log.contains("Service initialized"), "{log}");

    // the refusals, as plain HTTP sees them: the API's error envelope
    let initialize = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "e2e", "version": "1" } } })
    .to_string();
    let post = |token: Option<&str>| {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("content-type", "application/json"), ("accept", "application/json, text/event-stream")];
        if let Some(bearer) = &bearer {
            headers.push(("authorization", bearer.as_str()));
        }
        server.request("POST", "/mcp", &headers, Some(initialize.as_bytes()))
    };
    post(None).expect_error(401, "unauthenticated");
    post(Some("not-a-token")).expect_error(401, "unauthenticated");
    post(ids.token(Kind::Member)).expect_error(403, "forbidden");
    post(ids.token(Kind::Deployer)).expect_error(403, "forbidden");
    let answer = post(Some(&admin));
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.contains("\"capstan\""), "the server names itself: {}", answer.body);
}
