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

use super::forms::{Flash, FormData, call_plugin, encode, post, redirect, status_of};
use super::{message_page, nav, render, user_view};
use crate::api::{AppState, RequestId};
use crate::auth::Identity;
use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use capstan_server::plugins::faces::PageDecl;
use capstan_server::plugins::host::Active;
use minijinja::context;
use minijinja::value::Serde;
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::Arc;

/// Rows of a list shown before the rest is summarized.
const MAX_ROWS: usize = 500;
/// The most a plugin template may render, in bytes.
const MAX_RENDERED_BYTES: usize = 1 << 20;
/// The work a plugin template may do per render (MiniJinja fuel).
const TEMPLATE_FUEL: u64 = 200_000;

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

// ---------------------------------------------------------------------------------------
// Templates from the bundle

/// Render the bundle template `name` of `active` in a sandbox: only the bundle's templates
/// exist (so an include or extends reaches nothing else), with a fuel limit and a size limit.
fn render_plugin_template(active: &Active, name: &str, ctx: minijinja::Value) -> Result<String, String> {
    let mut env = minijinja::Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_recursion_limit(32);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Lenient);
    for (template, source) in &active.templates {
        env.add_template_owned(template.clone(), source.clone()).map_err(|e| format!("{template}: {e}"))?;
    }
    let html = env.get_template(name).and_then(|t| t.render(ctx)).map_err(|e| e.to_string())?;
    if html.len() > MAX_RENDERED_BYTES {
        return Err(format!("rendered more than {MAX_RENDERED_BYTES} bytes"));
    }
    Ok(html)
}

// ---------------------------------------------------------------------------------------
// Handlers

fn request_id(extension: Option<Extension<RequestId>>) -> String {
    extension.map(|Extension(id)| id.0).unwrap_or_default()
}

fn not_found(plugin: &str) -> Response {
    message_page(
        StatusCode::NOT_FOUND,
        "Page not found",
        &format!("Plugin {plugin} has no such page here (it may be disabled or not loaded on this node)."),
    )
}

/// The loaded plugin and its page at `path`.
fn find(state: &AppState, plugin: &str, path: &str) -> Option<(Arc<Active>, PageDecl)> {
    let active = state.plugins.get(plugin)?;
    let page = active.described.pages.iter().find(|p| p.path == path)?.clone();
    Some((active, page))
}

/// What a page shows after a form post: the banner and what was typed.
struct Posted {
    flash: Flash,
    status: StatusCode,
    method: String,
    typed: HashMap<String, String>,
}

async fn show(
    state: &AppState,
    identity: &Identity,
    request_id: &str,
    active: &Active,
    page: &PageDecl,
    uri: &Uri,
    posted: Option<Posted>,
) -> Response {
    let plugin = active.manifest.id.as_str();
    let (own, params): (Vec<_>, Vec<_>) = query_pairs(uri).into_iter().partition(|(k, _)| k.starts_with('_'));
    let schema_of = |verb: &str| active.described.methods.get(verb).map(|m| m.input_schema.clone()).unwrap_or(json!({}));
    let body = body_of(&schema_of(&page.source), &params);
    let answer = call_plugin(state, identity, request_id, plugin, &page.source, body).await;
    let done = own.iter().find(|(k, _)| k == "_done").map(|(_, method)| method.clone());
    let mut status = posted.as_ref().map_or(StatusCode::OK, |p| p.status);
    let flash = posted.as_ref().map(|p| &p.flash);
    let done_flash =
        done.filter(|m| page.forms.contains(m)).map(|m| Flash::done("Done", format!("{plugin}.{m} answered without a refusal.")));
    let forms: Vec<FormView> = page
        .forms
        .iter()
        .map(|method| {
            let typed = posted.as_ref().filter(|p| p.method == *method).map(|p| p.typed.clone()).unwrap_or_default();
            form_view(plugin, &page.path, method, &schema_of(method), &typed)
        })
        .collect();
    let (output, error) = match &answer {
        Ok(output) => (Some(output.clone()), None),
        Err(refusal) => {
            if posted.is_none() {
                status = status_of(refusal);
            }
            (None, Some(super::forms::ErrorView::from(refusal)))
        }
    };
    let mut body_html = None;
    if let (Some(template), Some(output)) = (&page.template, &output) {
        let rendered_forms: HashMap<String, minijinja::Value> =
            forms.iter().map(|f| (f.method.clone(), minijinja::Value::from_safe_string(render_form(f)))).collect();
        let ctx = context! {
            output => Serde(output),
            query => Serde(params.iter().cloned().collect::<HashMap<_, _>>()),
            page => Serde(json!({ "title": page.title, "path": page.path, "plugin": plugin })),
            forms => minijinja::Value::from_object(rendered_forms),
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
    let ctx = context! {
        page => page.title.clone(),
        nav => Serde(nav(state, &format!("p:{plugin}/{}", page.path))),
        user => Serde(user_view(identity)),
        flash => Serde(flash.or(done_flash.as_ref())),
        error => Serde(error),
        plugin => plugin,
        source => format!("{plugin}.{}", page.source),
        shown => Serde(output.as_ref().filter(|_| page.template.is_none()).map(|o| shown(o, 2))),
        templated => body_html.map(minijinja::Value::from_safe_string),
        forms => Serde(if page.template.is_some() { Vec::new() } else { forms }),
    };
    render(status, "plugin_page.html", ctx)
}

/// A generated form as HTML, for a template to place (`{{ forms.<method> }}`).
fn render_form(form: &FormView) -> String {
    let ctx = context! { form => Serde(form) };
    super::TEMPLATE_ENV.get_template("plugin_form.html").and_then(|t| t.render(ctx)).unwrap_or_else(|e| {
        tracing::error!(form = %form.method, error = %e, "a generated plugin form failed to render");
        String::new()
    })
}

/// A page's query as name/value pairs, in order.
fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri).map(|q| q.0).unwrap_or_default()
}

/// `GET /p/{plugin}`: the plugin's first page.
pub(super) async fn index(
    State(state): State<AppState>,
    super::forms::Signed(identity): super::forms::Signed,
    Path(plugin): Path<String>,
    id: Option<Extension<RequestId>>,
    uri: Uri,
) -> Response {
    match find(&state, &plugin, "") {
        Some((active, page)) => show(&state, &identity, &request_id(id), &active, &page, &uri, None).await,
        None => not_found(&plugin),
    }
}

/// `GET /p/{plugin}/{*path}`.
pub(super) async fn page(
    State(state): State<AppState>,
    super::forms::Signed(identity): super::forms::Signed,
    Path((plugin, path)): Path<(String, String)>,
    id: Option<Extension<RequestId>>,
    uri: Uri,
) -> Response {
    match find(&state, &plugin, path.trim_end_matches('/')) {
        Some((active, page)) => show(&state, &identity, &request_id(id), &active, &page, &uri, None).await,
        None => not_found(&plugin),
    }
}

/// `POST /p/{plugin}/-/call/{method}` (`_page` and the method's fields): call a method a page
/// offers as a form; back to the page, or the page again with the refusal and what was typed.
pub(super) async fn call(State(state): State<AppState>, Path((plugin, method)): Path<(String, String)>, request: Request) -> Response {
    let id = request.extensions().get::<RequestId>().map(|id| id.0.clone()).unwrap_or_default();
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let page_path = form.text("_page").to_string();
    let Some((active, page)) = find(&state, &plugin, &page_path) else { return not_found(&plugin) };
    if !page.forms.contains(&method) {
        return not_found(&plugin);
    }
    let schema = active.described.methods.get(&method).map(|m| m.input_schema.clone()).unwrap_or(json!({}));
    let FormData(pairs) = form;
    let texts: Vec<(String, String)> = pairs.into_iter().filter(|(k, _)| !k.starts_with('_')).collect();
    let body = body_of(&schema, &texts);
    let back = if page.path.is_empty() { format!("/p/{plugin}") } else { format!("/p/{plugin}/{}", page.path) };
    match call_plugin(&state, &identity, &id, &plugin, &method, body).await {
        Ok(_) => redirect(&format!("{back}?_done={}", encode(&method))),
        Err(refusal) => {
            let posted = Posted {
                flash: Flash::refused(&format!("{plugin}.{method} refused"), &refusal, "Nothing was changed; your entries are kept below."),
                status: status_of(&refusal),
                method: method.clone(),
                typed: texts.into_iter().map(|(k, v)| (k, v.chars().take(4000).collect())).collect(),
            };
            let uri: Uri = back.parse().unwrap_or_default();
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
}
