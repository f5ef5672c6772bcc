//! `/mcp`: a read-only Model Context Protocol endpoint (streamable HTTP, through the official
//! Rust SDK `rmcp`) for an administrator's assistant.
//!
//! Every tool answers a safe summary built from the answer of a registered list method
//! (`clusters.list`, `services.list`, `nodes.list`, `plugins.list`, `tasks.list`,
//! `deployments.list`), called
//! through the registry as the administrator who asked: the same code, access checks and paging
//! as `POST /api/v1/<method>`. Each summary copies only named fields, so a token, key, secret
//! value, sealed material, environment value or log never reaches an answer, whatever those
//! methods add later.
//!
//! The transport runs stateless (no session kept between requests), so any node of a fleet
//! answers any request behind a load balancer.

use super::ApiError;
use crate::auth::{Auth, Identity};
use crate::bearer::bearer_token;
use crate::refusal::Refusal;
use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use capstan_rpc::{Invocation, Registry};
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// Where the endpoint is served.
pub const PATH: &str = "/mcp";

/// The most items one tool answer holds; `limit` asks for fewer.
pub const MAX_ITEMS: usize = 100;

/// Items per answer when the caller states no `limit`.
const DEFAULT_ITEMS: usize = 50;

/// The `/mcp` route: the administrator check (by `auth`), then the SDK's streamable HTTP
/// service, whose tools call `methods`, reading bodies of at most `max_body_bytes`.
pub fn routes<S: Clone + Send + Sync + 'static>(methods: Arc<Registry>, auth: Arc<Auth>, max_body_bytes: usize) -> Router<S> {
    let tools = Tools { methods };
    let config = StreamableHttpServerConfig::default()
        // no session kept on this node: any fleet node answers any request
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(max_body_bytes)
        // Host validation guards a local server against DNS rebinding by a browser; here
        // every request carries an administrator's bearer, which a rebinding page cannot.
        .disable_allowed_hosts();
    let service = StreamableHttpService::new(move || Ok(tools.clone()), Arc::new(NeverSessionManager::default()), config);
    Router::new().route_service(PATH, service).route_layer(middleware::from_fn_with_state(auth, admit))
}

/// Only an administrator's bearer JWT reaches the tools: none (or one that does not
/// authenticate) is the uniform `401 unauthenticated`, anyone else `403 forbidden`, each in the
/// API's error envelope. The identity rides along to the tools in the request's extensions.
async fn admit(State(auth): State<Arc<Auth>>, mut request: Request, next: Next) -> Response {
    let Some(bearer) = bearer_token(request.headers()) else {
        return ApiError(crate::auth::denied()).into_response();
    };
    let identity = match auth.authenticate(bearer).await {
        Ok(identity) => identity,
        Err(refusal) => return ApiError(refusal).into_response(),
    };
    if !identity.is_human_admin() {
        return ApiError(Refusal::new("forbidden", "the MCP endpoint needs an administrator")).into_response();
    }
    request.extensions_mut().insert(identity);
    next.run(request).await
}

/// The tools, over the methods of this node.
#[derive(Clone)]
struct Tools {
    methods: Arc<Registry>,
}

/// A page of a paged list.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PageArgs {
    /// The `nextCursor` of the previous answer; absent for the first page.
    cursor: Option<String>,
    /// At most 100 (default 50).
    limit: Option<usize>,
}

/// A page of services, or of their domains.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceArgs {
    /// Only this organization's services (id).
    organization_id: Option<String>,
    /// The `nextCursor` of the previous answer; absent for the first page.
    cursor: Option<String>,
    /// At most 100 (default 50).
    limit: Option<usize>,
}

/// A page of nodes.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NodeArgs {
    /// Only this cluster's nodes (id).
    cluster_id: Option<String>,
    /// The `nextCursor` of the previous answer; absent for the first page.
    cursor: Option<String>,
    /// At most 100 (default 50).
    limit: Option<usize>,
}

/// One service's deployments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DeploymentArgs {
    /// The service (id).
    service_id: String,
    /// At most 100 (default 20), newest first.
    limit: Option<usize>,
}

/// No arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// One tool: its name, what it says of itself, and its argument type.
struct ToolSpec {
    name: &'static str,
    description: &'static str,
    schema: fn() -> Tool,
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    Tool::new(name, description, Arc::new(Map::new()))
        .with_input_schema::<T>()
        .with_annotations(ToolAnnotations::new().read_only(true).destructive(false).idempotent(true).open_world(false))
}

const TOOLS: &[ToolSpec] = &[
    ToolSpec {
        name: "list_clusters",
        description: "Clusters, paged: id, name, description, labels, whether the relay is enabled and its origin.",
        schema: || tool::<PageArgs>("list_clusters", TOOLS[0].description),
    },
    ToolSpec {
        name: "list_services",
        description: "Services, paged (of one organization with organizationId): name, organization, image, ports, \
                      domains, scale, state. Never an environment value.",
        schema: || tool::<ServiceArgs>("list_services", TOOLS[1].description),
    },
    ToolSpec {
        name: "list_nodes",
        description: "Runtime nodes, paged (of one cluster with clusterId): name, cluster, hostname, state, and whether \
                      the node is live (reported within the node freshness window, 180 s unless set otherwise).",
        schema: || tool::<NodeArgs>("list_nodes", TOOLS[2].description),
    },
    ToolSpec {
        name: "list_domains",
        description: "The domains services answer on, paged by service (of one organization with organizationId): \
                      each domain with its service and organization.",
        schema: || tool::<ServiceArgs>("list_domains", TOOLS[3].description),
    },
    ToolSpec {
        name: "list_plugins",
        description: "Installed plugins (at most 100): id, name, status, version, approved capabilities, method count.",
        schema: || tool::<NoArgs>("list_plugins", TOOLS[4].description),
    },
    ToolSpec {
        name: "list_tasks",
        description: "Scheduled tasks (at most 100): id, kind, plugin, title, schedule, enabled, next run, whether one \
                      runs now, and how the last run ended (never its log).",
        schema: || tool::<NoArgs>("list_tasks", TOOLS[5].description),
    },
    ToolSpec {
        name: "list_deployments",
        description: "One service's deployment operations, newest first (at most 100): release tag, digest, state, \
                      when promoted, whether the service runs it now and whether it is a rollback target, and for the \
                      current one its rollout per cluster (healthy replicas of those wanted, and why the others are not).",
        schema: || tool::<DeploymentArgs>("list_deployments", TOOLS[6].description),
    },
];

impl rmcp::ServerHandler for Tools {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("capstan", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Read-only summaries of this Capstan: clusters, services, nodes, domains, plugins, tasks and deployments. \
                 Paged tools answer nextCursor; pass it back as cursor for the next page.",
            )
    }

    async fn list_tools(&self, _: Option<PaginatedRequestParams>, _: RequestContext<RoleServer>) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(TOOLS.iter().map(|t| (t.schema)()).collect()))
    }

    async fn call_tool(&self, request: CallToolRequestParams, context: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let identity = parts
            .and_then(|parts| parts.extensions.get::<Identity>())
            .cloned()
            // `admit` put it there; without it nothing is answered
            .ok_or_else(|| ErrorData::internal_error("the caller is not known", None))?;
        // the bearer `admit` checked: a forwarded call carries it to the coordinator
        let bearer = parts.and_then(|parts| bearer_token(&parts.headers)).map(str::to_string);
        let request_id = parts.and_then(|parts| parts.extensions.get::<super::RequestId>()).map(|r| r.0.clone()).unwrap_or_default();
        let asker = Asker { identity, bearer, request_id };
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let answer = match TOOLS.iter().find(|t| t.name == request.name) {
            Some(spec) => self.run(spec.name, &asker, arguments).await,
            None => return Err(ErrorData::invalid_params(format!("there is no tool {:?}", truncated(&request.name)), None)),
        };
        Ok(match answer {
            Ok(value) => CallToolResult::structured(value),
            // a refusal is value-free by convention: its code and message are safe to show
            Err(refusal) => CallToolResult::structured_error(json!({ "error": { "code": refusal.code, "message": refusal.message } })),
        }
        .into())
    }
}

impl Tools {
    async fn run(&self, tool: &str, identity: &Asker, arguments: Value) -> Result<Value, Refusal> {
        match tool {
            "list_clusters" => {
                let args: PageArgs = capstan_rpc::decode(arguments)?;
                let page = self.call(identity, "clusters.list", paged(None, args.cursor, args.limit)).await?;
                Ok(summarize_page(&page, "clusters", cluster))
            }
            "list_services" => {
                let args: ServiceArgs = capstan_rpc::decode(arguments)?;
                let body = paged(args.organization_id.map(|id| ("organizationId", id)), args.cursor, args.limit);
                let page = self.call(identity, "services.list", body).await?;
                Ok(summarize_page(&page, "services", service))
            }
            "list_nodes" => {
                let args: NodeArgs = capstan_rpc::decode(arguments)?;
                let body = paged(args.cluster_id.map(|id| ("clusterId", id)), args.cursor, args.limit);
                let page = self.call(identity, "nodes.list", body).await?;
                Ok(summarize_page(&page, "nodes", node))
            }
            "list_domains" => {
                let args: ServiceArgs = capstan_rpc::decode(arguments)?;
                let body = paged(args.organization_id.map(|id| ("organizationId", id)), args.cursor, args.limit);
                let page = self.call(identity, "services.list", body).await?;
                Ok(domains(&page))
            }
            "list_plugins" => {
                let _: NoArgs = capstan_rpc::decode(arguments)?;
                let list = self.call(identity, "plugins.list", json!({})).await?;
                Ok(capped(&list, "plugins", plugin))
            }
            "list_tasks" => {
                let _: NoArgs = capstan_rpc::decode(arguments)?;
                let list = self.call(identity, "tasks.list", json!({})).await?;
                Ok(capped(&list, "tasks", task))
            }
            "list_deployments" => {
                let args: DeploymentArgs = capstan_rpc::decode(arguments)?;
                let limit = args.limit.unwrap_or(20).min(MAX_ITEMS);
                let list = self.call(identity, "deployments.list", json!({ "serviceId": args.service_id, "limit": limit })).await?;
                Ok(json!({ "deployments": items(&list, "items").iter().map(deployment).collect::<Vec<_>>(), "total": list["total"] }))
            }
            other => Err(Refusal::new("tool-unknown", format!("there is no tool {:?}", truncated(other)))),
        }
    }

    /// Call a registered method as the asker, through the API's one door.
    async fn call(&self, asker: &Asker, method: &str, body: Value) -> Result<Value, Refusal> {
        let invocation = Invocation::verified(method, &asker.identity, asker.bearer.as_deref(), body).with_request_id(&asker.request_id);
        self.methods.invoke(invocation).await?.into_value()
    }
}

/// Who asks for a tool: the administrator `admit` let in, their bearer and the request's id.
struct Asker {
    identity: Identity,
    bearer: Option<String>,
    request_id: String,
}

fn truncated(name: &str) -> String {
    name.chars().take(64).collect()
}

/// A list method's body: an optional filter, the cursor, the limit capped at [`MAX_ITEMS`].
fn paged(filter: Option<(&str, String)>, cursor: Option<String>, limit: Option<usize>) -> Value {
    let mut body = Map::new();
    if let Some((key, value)) = filter {
        body.insert(key.into(), json!(value));
    }
    if let Some(cursor) = cursor {
        body.insert("cursor".into(), json!(cursor));
    }
    body.insert("limit".into(), json!(limit.unwrap_or(DEFAULT_ITEMS).clamp(1, MAX_ITEMS)));
    Value::Object(body)
}

/// The named members of `item` that are present, copied as they are.
fn pick(item: &Value, keys: &[&str]) -> Value {
    let mut out = Map::new();
    for key in keys {
        if let Some(value) = item.get(*key).filter(|v| !v.is_null()) {
            out.insert((*key).into(), value.clone());
        }
    }
    Value::Object(out)
}

fn items(page: &Value, key: &str) -> Vec<Value> {
    page.get(key).and_then(Value::as_array).cloned().unwrap_or_default()
}

/// A paged listing's `items`, summarized, with the `nextCursor` to continue from.
fn summarize_page(page: &Value, key: &str, summary: fn(&Value) -> Value) -> Value {
    let list: Vec<Value> = items(page, "items").iter().take(MAX_ITEMS).map(summary).collect();
    json!({ key: list, "nextCursor": page.get("nextCursor").cloned().unwrap_or(Value::Null) })
}

/// An unpaged listing's `key`, summarized and cut at [`MAX_ITEMS`] (`truncated` says so).
fn capped(list: &Value, key: &str, summary: fn(&Value) -> Value) -> Value {
    let all = items(list, key);
    let shown: Vec<Value> = all.iter().take(MAX_ITEMS).map(summary).collect();
    json!({ key: shown, "total": all.len(), "truncated": all.len() > MAX_ITEMS })
}

fn cluster(item: &Value) -> Value {
    let mut out = pick(item, &["id", "name", "description", "labels", "createdAt", "updatedAt"]);
    if let Some(relay) = item.get("relay") {
        out["relay"] = pick(relay, &["enabled", "origin"]);
    }
    out
}

fn service(item: &Value) -> Value {
    pick(item, &["id", "name", "organizationId", "image", "ports", "domains", "scale", "state", "createdAt", "updatedAt"])
}

fn node(item: &Value) -> Value {
    pick(item, &["id", "name", "clusterId", "hostname", "state", "live", "liveness", "lastReportAt", "enrolledAt"])
}

/// Each domain of each service on the page, with its service; paged as the services are.
fn domains(page: &Value) -> Value {
    let mut list = Vec::new();
    for item in items(page, "items").iter().take(MAX_ITEMS) {
        for domain in item.get("domains").and_then(Value::as_array).into_iter().flatten() {
            list.push(json!({
                "domain": domain,
                "serviceId": item.get("id"),
                "serviceName": item.get("name"),
                "organizationId": item.get("organizationId"),
            }));
        }
    }
    json!({ "domains": list, "nextCursor": page.get("nextCursor").cloned().unwrap_or(Value::Null) })
}

fn plugin(item: &Value) -> Value {
    let mut out = pick(item, &["id", "name", "status", "version", "previousVersion", "grants", "installedAt", "wit"]);
    out["firstParty"] = json!(item.get("publisher").and_then(Value::as_str) == Some("first-party"));
    out["methods"] = json!(item.get("methods").and_then(Value::as_array).map_or(0, Vec::len));
    if let Some(code) = item.get("lastError").and_then(|e| e.get("code")) {
        out["lastErrorCode"] = code.clone();
    }
    out
}

fn deployment(item: &Value) -> Value {
    let mut out =
        pick(item, &["id", "serviceId", "tag", "digest", "state", "createdAt", "promotedAt", "rolledBackAt", "current", "rollbackTarget"]);
    if let Some(rollout) = item.get("rollout") {
        let clusters: Vec<Value> = rollout["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let mut cluster = pick(c, &["clusterId", "state", "wanted", "healthy", "reason"]);
                let short: Vec<Value> =
                    c["shortfall"].as_array().into_iter().flatten().map(|s| pick(s, &["slot", "nodeId", "state", "reason"])).collect();
                cluster["shortfall"] = Value::Array(short);
                cluster
            })
            .collect();
        out["rollout"] = json!({ "state": rollout["state"], "clusters": clusters });
    }
    out
}

fn task(item: &Value) -> Value {
    let mut out = pick(item, &["id", "kind", "plugin", "title", "cron", "enabled", "nextRunAt"]);
    out["running"] = json!(item.get("runningExecutionId").is_some_and(|v| !v.is_null()));
    if let Some(last) = item.get("lastExecution").filter(|v| !v.is_null()) {
        out["lastExecution"] = pick(last, &["id", "status", "trigger", "startedAt", "endedAt", "durationMs"]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_copy_only_named_fields() {
        let page = json!({ "items": [{
            "id": "svc_1", "name": "web", "organizationId": "org_1", "image": "nginx:1",
            "environment": { "TOKEN": "planted-value" }, "mailAddresses": ["a@b.c"], "domains": ["a.example.com"],
            "template": { "secret": "planted-value" }, "scale": 1, "state": "active"
        }], "nextCursor": "svc_1" });
        let summary = summarize_page(&page, "services", service);
        assert!(!summary.to_string().contains("planted-value"));
        assert_eq!(summary["services"][0]["name"], "web");
        assert_eq!(summary["nextCursor"], "svc_1");
        let domains = domains(&page);
        assert_eq!(domains["domains"][0]["domain"], "a.example.com");
        assert_eq!(domains["domains"][0]["serviceName"], "web");
        assert!(!domains.to_string().contains("planted-value"));
    }

    #[test]
    fn a_task_shows_how_its_last_run_ended_without_its_log() {
        let list = json!({ "tasks": [{ "id": "host.x", "kind": "host", "title": "X", "cron": "* * * * *", "enabled": true,
            "runningExecutionId": null,
            "lastExecution": { "status": "failed", "startedAt": 1, "error": "planted-value", "log": ["planted-value"] } }] });
        let summary = capped(&list, "tasks", task);
        assert!(!summary.to_string().contains("planted-value"));
        assert_eq!(summary["tasks"][0]["lastExecution"]["status"], "failed");
        assert_eq!(summary["tasks"][0]["running"], false);
        assert_eq!(summary["total"], 1);
    }

    #[test]
    fn pages_are_capped() {
        assert_eq!(paged(None, None, Some(10_000))["limit"], MAX_ITEMS);
        assert_eq!(paged(None, None, None)["limit"], DEFAULT_ITEMS);
        assert_eq!(paged(Some(("clusterId", "c".into())), Some("x".into()), Some(0))["limit"], 1);
        let many = json!({ "plugins": (0..150).map(|i| json!({ "id": format!("p{i}"), "publisher": "k" })).collect::<Vec<_>>() });
        let summary = capped(&many, "plugins", plugin);
        assert_eq!(summary["plugins"].as_array().unwrap().len(), MAX_ITEMS);
        assert_eq!(summary["truncated"], true);
        assert_eq!(summary["plugins"][0]["firstParty"], false);
    }
}
