//! `/docs/api`: the API reference, the OpenAPI 3.1 document `GET /api/v1/openapi.json` serves
//! (built from the same registry, plugins included), rendered here on the server: operations by
//! tag, each with its access, summary, refusals and its request and answer schemas. No script:
//! an interactive renderer vendored for it (Swagger UI, Redoc) would be over a megabyte.

use super::{nav, render, to_login, unavailable, user_view};
use crate::Host;
use crate::state::AppState;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use minijinja::context;
use minijinja::value::Serde;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// The routes of this page.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/docs/api", get(page))
}

/// One operation as the page shows it.
#[derive(Serialize)]
struct OperationView {
    name: String,
    path: String,
    summary: String,
    access: String,
    plugin: Option<String>,
    coordinator_only: bool,
    needs_token: bool,
    refusals: Vec<String>,
    input: String,
    output: String,
}

/// The operations of one tag (a host area or a plugin).
#[derive(Serialize)]
struct TagView {
    name: String,
    operations: Vec<OperationView>,
}

/// The document's operations, by tag, each with its schemas as indented JSON.
fn tags(doc: &Value) -> Vec<TagView> {
    let schema = |reference: &Value| {
        let name = reference.as_str().unwrap_or_default().trim_start_matches("#/components/schemas/");
        serde_json::to_string_pretty(&doc["components"]["schemas"][name]).unwrap_or_default()
    };
    let mut by_tag: BTreeMap<String, Vec<OperationView>> = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        let operation = &item["post"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let view = OperationView {
            name: text(&operation["operationId"]),
            path: path.clone(),
            summary: text(&operation["summary"]),
            access: text(&operation["x-capstan-access"]),
            plugin: operation["x-capstan-plugin"].as_str().map(str::to_string),
            coordinator_only: operation["x-capstan-coordinator-only"] == true,
            needs_token: operation["x-capstan-access"] != "public",
            refusals: operation["x-capstan-refusals"].as_array().into_iter().flatten().map(text).collect(),
            input: schema(&operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]),
            output: schema(&operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]),
        };
        by_tag.entry(text(&operation["tags"][0])).or_default().push(view);
    }
    by_tag.into_iter().map(|(name, operations)| TagView { name, operations }).collect()
}

/// `GET /docs/api`: for any signed-in person (the document itself is public, as the listing is).
async fn page(State(state): State<Host>, headers: HeaderMap) -> Response {
    let identity = match super::current_identity(&state, &headers).await {
        Ok(Some(identity)) => identity,
        Ok(None) => return to_login(&state, &headers),
        Err(refusal) => return unavailable(refusal),
    };
    let doc = crate::api::openapi::document(&state.methods.list(), &state.public_origin);
    let tags = tags(&doc);
    let count: usize = tags.iter().map(|t| t.operations.len()).sum();
    let ctx = context! {
        page => "API",
        nav => Serde(nav(&state, "api")),
        user => Serde(user_view(&identity)),
        openapi_version => doc["openapi"].as_str().unwrap_or_default(),
        count,
        tags => Serde(tags),
    };
    render(StatusCode::OK, "api_docs.html", ctx)
}
