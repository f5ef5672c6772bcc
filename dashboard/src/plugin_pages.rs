//! Pages plugins contribute, at `/p/<pluginId>/<path>`: what a plugin's `describe` declares
//! (title, the method that feeds the page, the methods offered as forms, an optional template
//! from its signed bundle), rendered without a host rebuild.
//!
//! A page calls its source method as the signed-in person, with a body built from the page's
//! query (each parameter a top-level field, converted to the type the method's input schema
//! declares; parameters starting with `_` are the dashboard's own). Without a template the page
//! is generated from the answer: a table for a list, a definition list for an object. A
//! template is rendered by a sandboxed MiniJinja environment that holds only the bundle's
//! templates (no filesystem, no loader, a fuel limit), autoescaped, inside the dashboard's own
//! layout and under its Content-Security-Policy; a template carrying a script is refused at
//! install. Forms are generated from their methods' input schemas and post to
//! `/p/<pluginId>/-/call/<method>`, which calls the method exactly as the API would.
//!
//! Panels: a plugin may add a panel to the page of every organization, cluster or service
//! ([`entity_panels`]), rendered from its bundle's template in the same sandbox with the entity
//! as `get` answered it and the plugin's facet of it.

use super::forms::{Flash, FormData, call_plugin, encode, redirect, status_of};
use super::{message_page, nav, render, user_view};
use crate::Host;
use crate::Viewer;
use crate::api::RequestId;
use crate::state::BodyLimit;
use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use capstan_server::plugins::faces::PageDecl;
use capstan_server::plugins::host::Active;
use minijinja::context;
use minijinja::value::Serde;
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Rows of a list shown before the rest is summarized.
const MAX_ROWS: usize = 500;
/// The most a plugin template may render, in bytes.
const MAX_RENDERED_BYTES: usize = 1 << 20;
/// The work a plugin template may do per render (MiniJinja fuel).
const TEMPLATE_FUEL: u64 = 200_000;
/// A refused form's field is put back up to this many characters (a pasted document is not).
const KEPT_TYPED: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------
// Output, generated

/// An answer as a generated page shows it.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Shown {
    /// A scalar as text.
    Text { text: String },
    /// Nothing (null, an empty list or object).
    Empty,
    /// A list of scalars.
    Chips { items: Vec<String> },
    /// A list of objects: a column per member.
    Table { columns: Vec<String>, rows: Vec<Vec<Shown>>, more: usize },
    /// An object: its members in order.
    Fields { fields: Vec<FieldShown> },
    /// Anything deeper, as compact JSON.
    Json { text: String },
}

#[derive(Debug, Serialize)]
struct FieldShown {
    name: String,
    value: Shown,
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(_) | Value::Number(_) => Some(value.to_string()),
        _ => None,
    }
}

/// Show `value` (`depth` levels of nesting still shown as structure; deeper is JSON).
fn shown(value: &Value, depth: usize) -> Shown {
    if let Some(text) = scalar(value) {
        return Shown::Text { text };
    }
    match value {
        Value::Null => Shown::Empty,
        Value::Array(items) if items.is_empty() => Shown::Empty,
        Value::Object(map) if map.is_empty() => Shown::Empty,
        Value::Array(items) if items.iter().all(|i| scalar(i).is_some()) => {
            Shown::Chips { items: items.iter().filter_map(scalar).collect() }
        }
        Value::Array(items) if depth > 0 && items.iter().all(Value::is_object) => {
            let mut columns: Vec<String> = Vec::new();
            for item in items.iter().take(MAX_ROWS) {
                for key in item.as_object().into_iter().flat_map(Map::keys) {
                    if !columns.contains(key) {
                        columns.push(key.clone());
                    }
                }
            }
            let rows = items
                .iter()
                .take(MAX_ROWS)
                .map(|item| columns.iter().map(|c| item.get(c).map_or(Shown::Empty, |v| shown(v, 0))).collect())
                .collect();
            Shown::Table { columns, rows, more: items.len().saturating_sub(MAX_ROWS) }
        }
        Value::Object(map) if depth > 0 => {
            Shown::Fields { fields: map.iter().map(|(name, v)| FieldShown { name: name.clone(), value: shown(v, depth - 1) }).collect() }
        }
        other => Shown::Json { text: other.to_string() },
    }
}

// ---------------------------------------------------------------------------------------
// Forms, generated from input schemas

/// How a form field is typed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Input {
    Text,
    Number,
    Checkbox,
    /// One item per line (a list of strings).
    Lines,
    /// JSON (anything else).
    Json,
}

#[derive(Debug, Serialize)]
struct FieldView {
    name: String,
    label: String,
    hint: String,
    input: Input,
    required: bool,
    value: String,
}

#[derive(Debug, Serialize)]
struct FormView {
    method: String,
    title: String,
    action: String,
    page: String,
    fields: Vec<FieldView>,
}

/// The schema `schema` stands for: one `$ref` into the document's `$defs` followed.
fn resolved<'a>(schema: &'a Value, root: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
        Some(name) => root.get("$defs").and_then(|d| d.get(name)).unwrap_or(schema),
        None => schema,
    }
}

/// The JSON type a schema declares (the first that is not `null`).
fn type_of(schema: &Value) -> &str {
    match schema.get("type") {
        Some(Value::String(t)) => t,
        Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or(""),
        _ => "",
    }
}

fn input_of(schema: &Value, root: &Value) -> Input {
    let schema = resolved(schema, root);
    match type_of(schema) {
        "string" => Input::Text,
        "integer" | "number" => Input::Number,
        "boolean" => Input::Checkbox,
        "array" if type_of(resolved(schema.get("items").unwrap_or(&Value::Null), root)) == "string" => Input::Lines,
        _ => Input::Json,
    }
}

/// The top-level fields of an input schema with their inputs: the required ones first.
fn fields_of(schema: &Value) -> Vec<(String, Input, bool, String)> {
    let root = schema;
    let schema = resolved(schema, root);
    let required: Vec<&str> = schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Vec::new() };
    let mut fields: Vec<_> = properties
        .iter()
        .map(|(name, property)| {
            let hint = property.get("description").and_then(Value::as_str).unwrap_or_default().to_string();
            (name.clone(), input_of(property, root), required.contains(&name.as_str()), hint)
        })
        .collect();
    // what must be typed comes first
    fields.sort_by_key(|(_, _, required, _)| !required);
    fields
}

/// A value typed as `input` expects it, as the body carries it. A number that does not parse
/// is sent as the text it is, for the method to refuse by field.
fn typed(input: Input, text: &str) -> Option<Value> {
    let trimmed = text.trim();
    match input {
        Input::Checkbox => Some(Value::Bool(!trimmed.is_empty() && trimmed != "false")),
        _ if trimmed.is_empty() => None,
        Input::Text => Some(Value::String(text.to_string())),
        Input::Number => Some(serde_json::from_str::<serde_json::Number>(trimmed).map_or_else(|_| Value::from(trimmed), Value::Number)),
        Input::Lines => Some(Value::Array(text.lines().map(str::trim).filter(|l| !l.is_empty()).map(Value::from).collect())),
        Input::Json => Some(serde_json::from_str(trimmed).unwrap_or_else(|_| Value::from(trimmed))),
    }
}

/// The body of `schema`'s method from named texts (a form's fields, a page's query).
fn body_of(schema: &Value, texts: &[(String, String)]) -> Value {
    let fields = fields_of(schema);
    let mut body = Map::new();
    for (name, text) in texts {
        let input = fields.iter().find(|(field, ..)| field == name).map_or(Input::Text, |(_, input, ..)| *input);
        if let Some(value) = typed(input, text) {
            body.insert(name.clone(), value);
        }
    }
    // an unchecked box sends nothing: it is `false`
    for (name, input, ..) in &fields {
        if *input == Input::Checkbox && !body.contains_key(name) {
            body.insert(name.clone(), Value::Bool(false));
        }
    }
    Value::Object(body)
}

fn form_view(plugin: &str, page: &str, method: &str, schema: &Value, typed_in: &HashMap<String, String>) -> FormView {
    let fields = fields_of(schema)
        .into_iter()
        .map(|(name, input, required, hint)| FieldView {
            label: name.clone(),
            value: typed_in.get(&name).cloned().unwrap_or_default(),
            name,
            hint,
            input,
            required,
        })
        .collect();
    FormView {
        method: method.to_string(),
        title: method.to_string(),
        action: format!("/p/{plugin}/-/call/{method}"),
        page: page.to_string(),
        fields,
    }
}

/// `/<pluginId>`: a plugin of this host (loaded, installed, or embedded and still being
/// installed) leads to its pages at `/p/<pluginId>`; any other path is not found, as it would
/// be without this route.
pub(super) async fn shortcut(State(state): State<Host>, Path(plugin): Path<String>, request: Request) -> Response {
    let read = matches!(*request.method(), axum::http::Method::GET | axum::http::Method::HEAD);
    if read && state.plugins.knows(&plugin).await {
        return axum::response::Redirect::permanent(&format!("/p/{}", encode(&plugin))).into_response();
    }
    if super::wants_html(request.headers(), request.uri().path()) {
        return super::not_found_page();
    }
    crate::api::ApiError(crate::refusal::Refusal::new("not-found", "no such path; the API lives under /api/v1/")).into_response()
}

// ---------------------------------------------------------------------------------------
// Panels on entities' pages

/// A plugin's panel on an entity's page: its HTML, or why it could not be rendered.
#[derive(Debug, Serialize)]
pub(crate) struct PanelView {
    plugin: String,
    title: String,
    html: Option<String>,
    error: Option<String>,
}

/// The panels the plugins loaded here add to the page of the `kind` entity `entity` (as its
/// `get` answered it), plugin by plugin: each rendered from its bundle's template with
/// `entity`, `facet` (the plugin's facet of it, or none), `user` and `plugin`. A panel that
/// fails to render says so in its place; the page stands.
pub(crate) fn entity_panels(state: &Host, identity: &Viewer, kind: &str, entity: &Value) -> Vec<PanelView> {
    let user = user_view(identity);
    let mut panels = Vec::new();
    for active in state.plugins.loaded() {
        let plugin = active.manifest.id.clone();
        for panel in active.described.faces.panels.iter().filter(|p| p.kind == kind) {
            let ctx = context! {
                entity => Serde(entity),
                facet => Serde(entity.get("facets").and_then(|f| f.get(&plugin))),
                user => Serde(&user),
                plugin => &plugin,
            };
            let (html, error) = match render_plugin_template(&active, &panel.template, ctx) {
                Ok(html) => (Some(html), None),
                Err(e) => {
                    tracing::warn!(plugin = %plugin, template = %panel.template, error = %e, "a plugin's panel failed to render");
                    (None, Some(format!("The panel could not be shown: {e}")))
                }
            };
            panels.push(PanelView { plugin: plugin.clone(), title: panel.title.clone(), html, error });
        }
    }
    panels
}

// ---------------------------------------------------------------------------------------
// Templates from the bundle

/// Render the bundle template `name` of `active` in a sandbox: only the bundle's templates
/// exist (so an include or extends reaches nothing else), with a fuel limit and a size limit.
fn render_plugin_template(active: &Active, name: &str, ctx: minijinja::Value) -> Result<String, String> {
    let mut env = minijinja::Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_recursion_limit(32);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
    env.add_filter("when", when_filter);
    env.add_filter("urlencode", |text: &str| encode(text));
    for (template, source) in &active.templates {
        env.add_template_owned(template.clone(), source.clone()).map_err(|e| format!("{template}: {e}"))?;
    }
    let html = env.get_template(name).and_then(|t| t.render(ctx)).map_err(|e| e.to_string())?;
    if html.len() > MAX_RENDERED_BYTES {
        return Err(format!("rendered more than {MAX_RENDERED_BYTES} bytes"));
    }
    Ok(html)
}

/// `{{ at | when }}`: a time in milliseconds since the epoch as `2025-01-31 13:45 UTC`
/// (`{{ at | when("s") }}` for a plugin's own seconds); anything else as it is.
fn when_filter(value: minijinja::Value, unit: Option<&str>) -> String {
    match u64::try_from(value.clone()) {
        Ok(n) => super::utc(if unit == Some("s") { n.saturating_mul(1000) } else { n }),
        Err(_) => value.to_string(),
    }
}

/// A page's title with `{field}` replaced by that top-level text or number of the answer
/// (`App {name}`); without an answer, the title's words before the first placeholder.
fn title_of(title: &str, output: Option<&Value>) -> String {
    let mut shown = String::new();
    let mut rest = title;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|c| open + c) else { break };
        shown.push_str(&rest[..open]);
        match output.and_then(|o| o.get(&rest[open + 1..close])).and_then(scalar) {
            Some(value) => shown.push_str(&value.chars().take(80).collect::<String>()),
            None if output.is_none() => return shown.trim_end().to_string(),
            None => {}
        }
        rest = &rest[close + 1..];
    }
    shown.push_str(rest);
    shown.trim().to_string()
}

// ---------------------------------------------------------------------------------------
// Answers of forms, for the page that follows

/// How long a form's answer waits for the page it returns to.
const ANSWER_KEPT: Duration = Duration::from_secs(600);
/// The most answers kept at once (the oldest go first).
const ANSWERS_KEPT: usize = 256;

/// A form's answer, kept for the page the browser is sent back to (post, redirect, get): the
/// page shows it once it is there. Kept in this process only; a page served by another node
/// says the method answered without showing what.
struct Answer {
    token: String,
    user_id: String,
    plugin: String,
    method: String,
    at: Instant,
    value: Value,
}

static ANSWERS: LazyLock<Mutex<VecDeque<Answer>>> = LazyLock::new(|| Mutex::new(VecDeque::new()));

fn keep_answer(user_id: &str, plugin: &str, method: &str, value: Value) -> String {
    let token = capstan_core::ids::new_id("answer");
    let mut answers = ANSWERS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    answers.retain(|a| a.at.elapsed() < ANSWER_KEPT);
    while answers.len() >= ANSWERS_KEPT {
        answers.pop_front();
    }
    answers.push_back(Answer {
        token: token.clone(),
        user_id: user_id.into(),
        plugin: plugin.into(),
        method: method.into(),
        at: Instant::now(),
        value,
    });
    token
}

/// The answer `token` names, for the same person, plugin and method only.
fn kept_answer(token: &str, user_id: &str, plugin: &str, method: &str) -> Option<Value> {
    let answers = ANSWERS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    answers
        .iter()
        .find(|a| a.token == token && a.user_id == user_id && a.plugin == plugin && a.method == method && a.at.elapsed() < ANSWER_KEPT)
        .map(|a| a.value.clone())
}

// ---------------------------------------------------------------------------------------
// Handlers

fn request_id(extension: Option<Extension<RequestId>>) -> String {
    extension.map(|Extension(id)| id.0).unwrap_or_default()
}

/// No such page: a plugin that is not serving here says why (`plugin-not-loaded`, …).
async fn not_found(state: &Host, plugin: &str) -> Response {
    if state.plugins.get(plugin).is_none()
        && let Err(refusal) = state.methods.resolve(&format!("{plugin}.-")).await
        && refusal.code != "method-unknown"
    {
        let retry = if refusal.is("plugin-not-loaded") { " Reload this page in a few seconds." } else { "" };
        return message_page(
            status_of(&refusal),
            "This plugin is not serving here",
            &format!("Plugin {plugin} cannot show its pages: {} ({}).{retry}", refusal.message, refusal.code),
        );
    }
    message_page(
        StatusCode::NOT_FOUND,
        "Page not found",
        &format!("Plugin {plugin} has no such page here (it may be disabled or not loaded on this node)."),
    )
}

/// The loaded plugin and its page at `path`.
fn find(state: &Host, plugin: &str, path: &str) -> Option<(Arc<Active>, PageDecl)> {
    let active = state.plugins.get(plugin)?;
    let page = active.described.pages.iter().find(|p| p.path == path)?.clone();
    Some((active, page))
}

fn page_href(plugin: &str, path: &str) -> String {
    if path.is_empty() { format!("/p/{plugin}") } else { format!("/p/{plugin}/{path}") }
}

/// What a page shows after a form post: the banner and what was typed.
struct Posted {
    flash: Flash,
    status: StatusCode,
    method: String,
    typed: HashMap<String, String>,
}

/// An organization as the pages' pickers offer it.
#[derive(Serialize)]
struct Organization {
    id: String,
    name: String,
}

/// The organizations the person may see, for pickers (none when they cannot be read).
async fn organizations(state: &Host, identity: &Viewer) -> Vec<Organization> {
    match super::forms::call(state, identity, "organizations.list", json!({ "limit": 500 })).await {
        Ok(listing) => {
            let mut all: Vec<Organization> = listing["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| Organization { id: super::forms::str_of(o, "id").into(), name: super::forms::str_of(o, "name").into() })
                .collect();
            all.sort_by(|a, b| a.name.cmp(&b.name));
            all
        }
        Err(_) => Vec::new(),
    }
}

/// The required fields of `schema` a page's query leaves out or empty.
fn missing_fields(schema: &Value, params: &[(String, String)]) -> Vec<FieldView> {
    fields_of(schema)
        .into_iter()
        .filter(|(name, _, required, _)| *required && !params.iter().any(|(k, v)| k == name && !v.trim().is_empty()))
        .map(|(name, input, required, hint)| FieldView { label: name.clone(), name, hint, input, required, value: String::new() })
        .collect()
}

async fn show(
    state: &Host,
    identity: &Viewer,
    request_id: &str,
    active: &Active,
    page: &PageDecl,
    uri: &Uri,
    posted: Option<Posted>,
) -> Response {
    let plugin = active.manifest.id.as_str();
    let (own, params): (Vec<_>, Vec<_>) = query_pairs(uri).into_iter().partition(|(k, _)| k.starts_with('_'));
    let schema_of = |verb: &str| active.described.methods.get(verb).map(|m| m.input_schema.clone()).unwrap_or(json!({}));
    let source_schema = schema_of(&page.source);
    // the source gets the parameters it takes; the rest are the template's
    let source = resolved(&source_schema, &source_schema);
    let taken: Vec<(String, String)> = match source.get("properties").and_then(Value::as_object) {
        Some(properties) => params.iter().filter(|(k, _)| properties.contains_key(k)).cloned().collect(),
        // a method taking nothing (`Empty`) leaves every parameter to the template
        None if source.get("additionalProperties") == Some(&Value::Bool(false)) => Vec::new(),
        None => params.clone(),
    };
    let missing = missing_fields(&source_schema, &taken);
    let answer = if missing.is_empty() {
        Some(call_plugin(state, identity, request_id, plugin, &page.source, body_of(&source_schema, &taken)).await)
    } else {
        None
    };
    let own_value = |key: &str| own.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let done = own_value("_done").filter(|m| page.forms.iter().any(|f| f == m) || find_form_page(active, m)).map(str::to_string);
    let done_answer = match (&done, own_value("_answer")) {
        (Some(method), Some(token)) => kept_answer(token, &identity.user_id, plugin, method),
        _ => None,
    };
    let mut status = posted.as_ref().map_or(StatusCode::OK, |p| p.status);
    let forms: Vec<FormView> = page
        .forms
        .iter()
        .map(|method| {
            let typed = posted.as_ref().filter(|p| p.method == *method).map(|p| p.typed.clone()).unwrap_or_default();
            form_view(plugin, &page.path, method, &schema_of(method), &typed)
        })
        .collect();
    let mut unconfigured_note = None;
    let (output, error) = match &answer {
        Some(Ok(output)) => (Some(output.clone()), None),
        // a manager not configured yet is no failure: the page says so calmly, with the setting
        Some(Err(refusal)) if unconfigured(refusal) => {
            let setting = refusal.data.as_ref().and_then(|d| d["setting"].as_str()).map(str::to_string);
            unconfigured_note = Some((super::forms::ErrorView::from(refusal), setting));
            (None, None)
        }
        Some(Err(refusal)) => {
            if posted.is_none() {
                status = status_of(refusal);
            }
            (None, Some(super::forms::ErrorView::from(refusal)))
        }
        None => (None, None),
    };
    let query: HashMap<String, String> = params.iter().cloned().collect();
    let organizations = organizations(state, identity).await;
    let mut body_html = None;
    if let Some(template) = page.template.as_ref().filter(|_| output.is_some() || !missing.is_empty()) {
        let rendered_forms: HashMap<String, minijinja::Value> =
            forms.iter().map(|f| (f.method.clone(), minijinja::Value::from_safe_string(render_form(f)))).collect();
        let refused = posted.as_ref().map(|p| json!({ "method": p.method, "typed": p.typed }));
        let ctx = context! {
            output => Serde(&output),
            query => Serde(&query),
            page => Serde(json!({ "title": page.title, "path": page.path, "plugin": plugin, "query": encode_pairs(&params) })),
            forms => minijinja::Value::from_object(rendered_forms),
            missing => Serde(missing.iter().map(|f| f.name.clone()).collect::<Vec<_>>()),
            user => Serde(json!({ "username": identity.username, "admin": identity.admin })),
            organizations => Serde(&organizations),
            done => Serde(&done),
            answer => Serde(&done_answer),
            refused => Serde(refused),
        };
        match render_plugin_template(active, template, ctx) {
            Ok(html) => body_html = Some(html),
            Err(why) => {
                tracing::warn!(plugin, template = %template, error = %why, "a plugin page template failed to render");
                return message_page(
                    StatusCode::BAD_GATEWAY,
                    "This page could not be rendered",
                    &format!("Plugin {plugin}'s template {template} failed (plugin-template-failed); the server log has the details."),
                );
            }
        }
    }
    // a templated page shows what a form did itself; a generated one says so and shows it
    let done_flash =
        done.as_ref().filter(|_| page.template.is_none()).map(|m| Flash::done("Done", format!("{plugin}.{m} answered without a refusal.")));
    let flash = posted.as_ref().map(|p| &p.flash).or(done_flash.as_ref());
    // a detail page (not in the navigation) marks the plugin's first page that is
    let nav_path = if page.navigation {
        page.path.clone()
    } else {
        active.described.pages.iter().find(|p| p.navigation).map(|p| p.path.clone()).unwrap_or_default()
    };
    let ctx = context! {
        page => title_of(&page.title, output.as_ref()),
        nav => Serde(nav(state, &format!("p:{plugin}/{nav_path}"))),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(error),
        unconfigured => Serde(unconfigured_note),
        plugin => plugin,
        source => format!("{plugin}.{}", page.source),
        shown => Serde(output.as_ref().filter(|_| page.template.is_none()).map(|o| shown(o, 2))),
        answered => Serde(done_answer.as_ref().filter(|_| page.template.is_none()).map(|o| shown(o, 2))),
        templated => body_html.map(minijinja::Value::from_safe_string),
        forms => Serde(if page.template.is_some() { Vec::new() } else { forms }),
        asks => Serde(if page.template.is_some() { Vec::new() } else { missing }),
        asks_action => page_href(plugin, &page.path),
        asks_organizations => Serde(&organizations),
    };
    render(status, "plugin_page.html", ctx)
}

/// Whether a refusal says the manager is not configured (or switched off) rather than that
/// something failed: codes ending in `-disabled`, `-unconfigured` or `-not-configured`.
fn unconfigured(refusal: &capstan_core::refusal::Refusal) -> bool {
    ["-disabled", "-unconfigured", "-not-configured"].iter().any(|end| refusal.code.ends_with(end))
}

/// Whether `method` is a form of any page of `active` (a form may send the browser on to
/// another page of its plugin, which then says it answered).
fn find_form_page(active: &Active, method: &str) -> bool {
    active.described.pages.iter().any(|p| p.forms.iter().any(|f| f == method))
}

/// A generated form as HTML, for a template to place (`{{ forms.<method> }}`).
fn render_form(form: &FormView) -> String {
    let ctx = context! { form => Serde(form) };
    super::TEMPLATE_ENV.get_template("plugin_form.html").and_then(|t| t.render(ctx)).unwrap_or_else(|e| {
        tracing::error!(form = %form.method, error = %e, "a generated plugin form failed to render");
        String::new()
    })
}

/// A query (without the `?`) as name/value pairs, in order; nothing when it does not parse.
fn pairs_of_query(query: &str) -> Vec<(String, String)> {
    format!("/?{query}").parse::<Uri>().map(|uri| query_pairs(&uri)).unwrap_or_default()
}

/// A page's query as name/value pairs, in order.
fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri).map(|q| q.0).unwrap_or_default()
}

/// Name/value pairs as a query (without the `?`).
fn encode_pairs(pairs: &[(String, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{}={}", encode(k), encode(v))).collect::<Vec<_>>().join("&")
}

/// `GET /p/{plugin}`: the plugin's first page.
pub(super) async fn index(
    State(state): State<Host>,
    super::forms::Signed(identity): super::forms::Signed,
    Path(plugin): Path<String>,
    id: Option<Extension<RequestId>>,
    uri: Uri,
) -> Response {
    match find(&state, &plugin, "") {
        Some((active, page)) => show(&state, &identity, &request_id(id), &active, &page, &uri, None).await,
        None => not_found(&state, &plugin).await,
    }
}

/// `GET /p/{plugin}/{*path}`.
pub(super) async fn page(
    State(state): State<Host>,
    super::forms::Signed(identity): super::forms::Signed,
    Path((plugin, path)): Path<(String, String)>,
    id: Option<Extension<RequestId>>,
    uri: Uri,
) -> Response {
    match find(&state, &plugin, path.trim_end_matches('/')) {
        Some((active, page)) => show(&state, &identity, &request_id(id), &active, &page, &uri, None).await,
        None => not_found(&state, &plugin).await,
    }
}

/// `POST /p/{plugin}/-/call/{method}`: call a method a page offers as a form, with the form's
/// fields as its body. The dashboard's own fields: `_page` (the page the form is on),
/// `_return` (that page's query, to come back with), `_next` (another page of the plugin to go
/// to instead). Answered: to that page with `_done=<method>` (and the answer, kept for it);
/// refused: the form's page again with the refusal and what was typed.
///
/// It reads as much as the API would take for the method (`CAPSTAN_MAX_BODY_BYTES`),
/// form-encoded (up to three bytes per character).
pub(super) async fn call(
    State(state): State<Host>,
    State(BodyLimit(max_body_bytes)): State<BodyLimit>,
    Path((plugin, method)): Path<(String, String)>,
    request: Request,
) -> Response {
    let id = request.extensions().get::<RequestId>().map(|id| id.0.clone()).unwrap_or_default();
    let limit = max_body_bytes.saturating_mul(3).max(super::FORM_LIMIT);
    let (identity, form) = match super::forms::post_within(&state, request, Some(limit)).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let page_path = form.text("_page").to_string();
    let Some((active, page)) = find(&state, &plugin, &page_path) else { return not_found(&state, &plugin).await };
    if !page.forms.contains(&method) {
        return not_found(&state, &plugin).await;
    }
    let schema = active.described.methods.get(&method).map(|m| m.input_schema.clone()).unwrap_or(json!({}));
    // the query to come back with, re-encoded: only name/value pairs, none of the dashboard's own
    let back_query: Vec<(String, String)> = pairs_of_query(form.text("_return")).into_iter().filter(|(k, _)| !k.starts_with('_')).collect();
    let next = form.text("_next").to_string();
    let next = if next.is_empty() || !active.described.pages.iter().any(|p| p.path == next) { page.path.clone() } else { next };
    let FormData(pairs) = form;
    let texts: Vec<(String, String)> = pairs.into_iter().filter(|(k, _)| !k.starts_with('_')).collect();
    let body = body_of(&schema, &texts);
    match call_plugin(&state, &identity, &id, &plugin, &method, body).await {
        Ok(answer) => {
            let token = keep_answer(&identity.user_id, &plugin, &method, answer);
            let mut query = back_query;
            query.push(("_done".into(), method.clone()));
            query.push(("_answer".into(), token));
            redirect(&format!("{}?{}", page_href(&plugin, &next), encode_pairs(&query)))
        }
        Err(refusal) => {
            let posted = Posted {
                flash: Flash::refused(&format!("{plugin}.{method} refused"), &refusal, "Nothing was changed; your entries are kept below."),
                status: status_of(&refusal),
                method: method.clone(),
                typed: texts.into_iter().map(|(k, v)| (k, v.chars().take(KEPT_TYPED).collect())).collect(),
            };
            let uri: Uri = format!("{}?{}", page_href(&plugin, &page.path), encode_pairs(&back_query)).parse().unwrap_or_default();
            show(&state, &identity, &id, &active, &page, &uri, Some(posted)).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_shown_as_tables_lists_and_facts() {
        let page = json!({ "notes": [{ "id": "a", "text": "one" }, { "id": "b", "tags": ["x"] }], "count": 2, "next": null });
        let Shown::Fields { fields } = shown(&page, 2) else { panic!("an object is a definition list") };
        let notes = &fields.iter().find(|f| f.name == "notes").unwrap().value;
        let Shown::Table { columns, rows, more } = notes else { panic!("a list of objects is a table: {notes:?}") };
        assert_eq!(columns, &["id", "text", "tags"]);
        assert_eq!((rows.len(), *more), (2, 0));
        assert!(matches!(&rows[1][2], Shown::Chips { items } if items == &["x"]));
        assert!(matches!(&rows[1][1], Shown::Empty));
        assert!(matches!(&fields.iter().find(|f| f.name == "count").unwrap().value, Shown::Text { text } if text == "2"));
        assert!(matches!(shown(&json!({"a": {"b": {"c": 1}}}), 1), Shown::Fields { .. }));
        assert!(matches!(shown(&json!([[1, 2]]), 2), Shown::Json { .. }), "deeper than shown is JSON");
    }

    #[test]
    fn a_template_places_the_generated_forms() {
        let form = form_view("example", "", "putNote", &json!({ "properties": { "id": { "type": "string" } } }), &HashMap::new());
        let html = render_form(&form);
        assert!(html.contains(r#"id="form-putNote""#) && html.contains(r#"name="id""#), "{html}");
        let forms: HashMap<String, minijinja::Value> = [("putNote".to_string(), minijinja::Value::from_safe_string(html.clone()))].into();
        let mut env = minijinja::Environment::new();
        env.add_template("pages/t.html", "<div>{{ forms.putNote }}</div>").unwrap();
        let out = env.get_template("pages/t.html").unwrap().render(context! { forms => minijinja::Value::from_object(forms) }).unwrap();
        assert_eq!(out, format!("<div>{html}</div>"), "placed as HTML, not escaped");
    }

    #[test]
    fn form_texts_become_the_body_the_schema_describes() {
        let schema = json!({
            "type": "object",
            "required": ["tags"],
            "properties": {
                "id": { "type": "string" },
                "limit": { "type": ["integer", "null"] },
                "pinned": { "type": "boolean" },
                "tags": { "type": "array", "items": { "type": "string" } },
                "meta": { "$ref": "#/$defs/Meta" }
            },
            "$defs": { "Meta": { "type": "object" } }
        });
        let inputs: Vec<(String, Input)> = fields_of(&schema).into_iter().map(|(name, input, ..)| (name, input)).collect();
        assert_eq!(inputs[0], ("tags".to_string(), Input::Lines), "the required field first");
        let by_name: HashMap<String, Input> = inputs.into_iter().collect();
        let expected =
            [("id", Input::Text), ("limit", Input::Number), ("meta", Input::Json), ("pinned", Input::Checkbox), ("tags", Input::Lines)];
        assert_eq!(by_name, expected.map(|(n, i)| (n.to_string(), i)).into());
        let texts = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let body =
            body_of(&schema, &texts(&[("id", "n1"), ("limit", "5"), ("tags", "a\n\n b \n"), ("meta", r#"{"k": 1}"#), ("extra", "x")]));
        assert_eq!(body, json!({ "id": "n1", "limit": 5, "pinned": false, "tags": ["a", "b"], "meta": {"k": 1}, "extra": "x" }));
        let body = body_of(&schema, &texts(&[("limit", "five"), ("pinned", "on"), ("id", "")]));
        assert_eq!(body, json!({ "limit": "five", "pinned": true }), "left for the method to refuse by field");
    }

    #[test]
    fn titles_name_what_the_page_shows() {
        let output = json!({ "name": "Wiki", "count": 3, "list": [1] });
        assert_eq!(title_of("App {name}", Some(&output)), "App Wiki");
        assert_eq!(title_of("{count} notes", Some(&output)), "3 notes");
        assert_eq!(title_of("App {list}", Some(&output)), "App", "only text and numbers are placed");
        assert_eq!(title_of("App {name}", None), "App", "without an answer, the words before the placeholder");
        assert_eq!(title_of("Odd {name", Some(&output)), "Odd {name");
    }

    #[test]
    fn a_kept_answer_is_shown_only_to_its_person_for_its_form() {
        let token = keep_answer("usr_a", "appstore", "install", json!({ "id": "svc_1" }));
        assert_eq!(kept_answer(&token, "usr_a", "appstore", "install"), Some(json!({ "id": "svc_1" })));
        assert_eq!(kept_answer(&token, "usr_b", "appstore", "install"), None);
        assert_eq!(kept_answer(&token, "usr_a", "example", "install"), None);
        assert_eq!(kept_answer(&token, "usr_a", "appstore", "upgrade"), None);
        assert_eq!(kept_answer("answer_nope", "usr_a", "appstore", "install"), None);
    }

    #[test]
    fn a_page_asks_for_the_required_fields_its_query_leaves_out() {
        let schema = json!({ "required": ["organizationId"], "properties": { "organizationId": { "type": "string" }, "limit": { "type": "integer" } } });
        let asks: Vec<String> = missing_fields(&schema, &[]).into_iter().map(|f| f.name).collect();
        assert_eq!(asks, ["organizationId"]);
        assert!(missing_fields(&schema, &[("organizationId".into(), " ".into())]).len() == 1, "blank is missing");
        assert!(missing_fields(&schema, &[("organizationId".into(), "org_1".into())]).is_empty());
        assert_eq!(pairs_of_query("a=1&b=x%20y"), [("a".to_string(), "1".to_string()), ("b".to_string(), "x y".to_string())]);
        assert_eq!(encode_pairs(&pairs_of_query("a=1&b=x%20y")), "a=1&b=x%20y");
    }
}
