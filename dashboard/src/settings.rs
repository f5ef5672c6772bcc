//! The Settings view at `/settings`: the public settings document, every key Capstan accepts
//! with what it is for (as `settings.get` answers them) and its value, grouped as the host's
//! own and each plugin's (a plugin's keys are `<pluginId>.<key>`, with the default it declares
//! shown where none is set), edited in one form with the revision the page read
//! (`settings.update`, administrators). Values are typed as
//! JSON (`443`, `["https://…"]`, `{"bucket": "b"}`); a bare word is taken as text. Only the
//! keys whose value was changed are sent; an emptied field removes its key. Another key may
//! be named at the bottom of the form: the method refuses anything that is not a setting
//! (`setting-unknown`) or is a credential (`setting-is-secret`), by name.
//!
//! Below it, administrators see Capstan's enrollment at the external gateway
//! (`gateway.getEnrollmentState`) and, once `gatewayUrl` and `gatewayClientId` are set, a form
//! that takes a gateway admin token: `dashboard/static/seal.js` seals it in the browser for
//! exactly that URL and client id, and only the sealed JSON is posted
//! (`gateway.bootstrapCredential`).
//!
//! A small status panel re-fetches itself when a `settings.*` event commits and says when the
//! document moved past the revision the form was read at; the form itself is never replaced
//! under the operator's hands.

use super::forms::{ErrorView, Flash, FormData, Signed, call, number, post, query_of, redirect, status_of, u64_of};
use super::{live, nav, render, user_view};
use crate::Host;
use crate::Viewer;
use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::collections::HashMap;

const AREAS: &[&str] = &["settings"];

#[derive(Serialize)]
struct RowView {
    key: String,
    summary: String,
    /// Whether the document holds the key.
    set: bool,
    /// The stored value as the form shows it (empty when not set).
    read: String,
    /// What the input holds: the stored value, or what the operator typed.
    value: String,
    known: bool,
    /// The declared default as the form shows it, when the key is a plugin's and has one.
    default: String,
}

/// The rows of the host's settings, of one plugin's, or of keys nothing accepts any more.
#[derive(Serialize)]
struct GroupView {
    /// `capstan`, a plugin id, or `unknown`.
    id: String,
    title: String,
    rows: Vec<RowView>,
}

/// A value as the form shows it: text as it is, anything else as compact JSON.
fn shown(value: &Value) -> String {
    value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string())
}

/// A typed value: JSON when it parses as JSON, else the text itself.
fn typed_value(text: &str) -> Value {
    let text = text.trim();
    serde_json::from_str(text).unwrap_or_else(|_| Value::from(text))
}

/// What the form was read at and what the operator typed, after a refusal.
#[derive(Default)]
struct Typed {
    revision: Option<String>,
    /// `key → (read, typed)`.
    values: HashMap<String, (String, String)>,
    other_key: String,
    other_value: String,
}

/// The rows grouped: the host's first, then each plugin's in id order, then unknown keys.
fn groups(rows: Vec<(Option<String>, RowView)>) -> Vec<GroupView> {
    let mut groups: Vec<GroupView> = Vec::new();
    let mut ordered = rows;
    let carried = |row: &RowView| row.summary == capstan_server::inventory::settings::CARRIED_OVER;
    ordered.sort_by_key(|(plugin, row)| (!row.known, carried(row), plugin.is_some(), plugin.clone()));
    for (plugin, row) in ordered {
        let (id, title) = match (&plugin, row.known) {
            (_, false) => ("unknown".to_string(), "Not accepted any more".to_string()),
            // folded away on the page: kept valid, read by nothing
            (None, true) if row.summary == capstan_server::inventory::settings::CARRIED_OVER => {
                ("carried".to_string(), "Carried over from the earlier platform (Capstan reads none of them)".to_string())
            }
            (None, true) => ("capstan".to_string(), "Capstan".to_string()),
            (Some(plugin), true) => (plugin.clone(), format!("Plugin {plugin}")),
        };
        match groups.last_mut() {
            Some(group) if group.id == id => group.rows.push(row),
            _ => groups.push(GroupView { id, title, rows: vec![row] }),
        }
    }
    groups
}

fn rows(document: &Value, typed: &Typed) -> Vec<(Option<String>, RowView)> {
    let settings = document["settings"].as_object().cloned().unwrap_or_default();
    let mut rows: Vec<(Option<String>, RowView)> = document["known"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| {
            let key = k["key"].as_str().unwrap_or_default().to_string();
            let stored = settings.get(&key);
            let row = RowView {
                summary: k["summary"].as_str().unwrap_or_default().into(),
                set: stored.is_some(),
                read: stored.map(shown).unwrap_or_default(),
                value: String::new(),
                known: true,
                default: k.get("default").map(shown).unwrap_or_default(),
                key,
            };
            (k["plugin"].as_str().map(str::to_string), row)
        })
        .collect();
    // a stored key the allowlist no longer names is still shown (and may be removed)
    for (key, value) in &settings {
        if !rows.iter().any(|(_, r)| r.key == *key) {
            let row = RowView {
                key: key.clone(),
                summary: "Not a setting Capstan or an installed plugin accepts; it may be removed".into(),
                set: true,
                read: shown(value),
                value: String::new(),
                known: false,
                default: String::new(),
            };
            rows.push((None, row));
        }
    }
    for (_, row) in &mut rows {
        row.value = match typed.values.get(&row.key) {
            Some((read, typed)) => {
                // the form keeps what it was read at, so only the operator's changes are sent
                row.read = read.clone();
                typed.clone()
            }
            None => row.read.clone(),
        };
    }
    rows
}

async fn settings_page(state: &Host, identity: &Viewer, status: StatusCode, flash: Option<Flash>, typed: Typed) -> Response {
    let head = live::head(state, identity).await;
    let document = call(state, identity, "settings.get", json!({})).await;
    let (rows, revision, error) = match &document {
        Ok(document) => (groups(rows(document, &typed)), u64_of(document, "revision"), None),
        Err(refusal) => (Vec::new(), 0, Some(ErrorView::from(refusal))),
    };
    let expected = typed.revision.clone().unwrap_or_else(|| revision.to_string());
    let (gateway, gateway_seal) = gateway_card(state, identity, document.as_ref().ok()).await;
    let ctx = context! {
        page => "Settings",
        nav => Serde(nav(state, "settings")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(error),
        groups => Serde(rows),
        expected_revision => expected,
        other_key => typed.other_key,
        other_value => typed.other_value,
        gateway => Serde(gateway),
        gateway_seal => Serde(gateway_seal),
        ..context! { ..live::element(head, AREAS), ..status_context(document.as_ref().ok(), revision) }
    };
    render(status, "settings.html", ctx)
}

/// What the gateway's bootstrap form seals to: the ingress recipient and the target.
#[derive(Serialize)]
struct GatewaySeal {
    recipient_id: String,
    public_key: String,
    url: String,
    client_id: String,
}

/// The enrollment (administrators only) and, when the settings name a target, what the
/// bootstrap form seals to.
async fn gateway_card(state: &Host, identity: &Viewer, document: Option<&Value>) -> (Option<Value>, Option<GatewaySeal>) {
    if !identity.is_human_admin() {
        return (None, None);
    }
    let Ok(enrollment) = call(state, identity, "gateway.getEnrollmentState", json!({})).await else { return (None, None) };
    let setting = |key: &str| document.and_then(|d| d["settings"][key].as_str()).map(str::to_string);
    let (Some(url), Some(client_id)) = (setting("gatewayUrl"), setting("gatewayClientId")) else { return (Some(enrollment), None) };
    let Ok(recipient) = call(state, identity, "secrets.getIngressRecipient", json!({})).await else { return (Some(enrollment), None) };
    let text = |key: &str| recipient[key].as_str().unwrap_or_default().to_string();
    let seal = GatewaySeal { recipient_id: text("recipientId"), public_key: text("publicKey"), url, client_id };
    (Some(enrollment), Some(seal))
}

/// `POST /settings/gateway/bootstrap` (`gatewayUrl`, `clientId`, `sealed`: the admin token
/// sealed in the browser).
pub(super) async fn bootstrap_gateway(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let sealed: Option<Value> = serde_json::from_str(form.text("sealed")).ok();
    let answer = match sealed {
        None => Err(crate::refusal::Refusal::new(
            "bootstrap-token-invalid",
            "the token did not arrive sealed: this page seals it in the browser, which needs JavaScript and a secure page (https or localhost)",
        )),
        Some(sealed) => {
            let body = json!({
                "expectedGatewayUrl": form.text("gatewayUrl"),
                "expectedGatewayClientId": form.text("clientId"),
                "sealedAdminToken": sealed,
            });
            call(&state, &identity, "gateway.bootstrapCredential", body).await
        }
    };
    match answer {
        Ok(enrollment) => redirect(&format!("/settings?done=gateway-{}#gateway", enrollment["state"].as_str().unwrap_or("unknown"))),
        Err(refusal) => {
            let flash =
                Flash::refused("Capstan was not enrolled at the gateway", &refusal, "The token was not kept; enter it again to retry.");
            settings_page(&state, &identity, status_of(&refusal), Some(flash), Typed::default()).await
        }
    }
}

/// The status panel: the document's revision and how many keys are set, and whether it moved
/// past `read` (the revision the page's form was read at).
fn status_context(document: Option<&Value>, read: u64) -> minijinja::Value {
    let Some(document) = document else { return context! { status => Serde(None::<Value>) } };
    let revision = u64_of(document, "revision");
    let set = document["settings"].as_object().map_or(0, Map::len);
    let known = document["known"].as_array().map_or(0, Vec::len);
    context! { status => context! { revision, read, moved => revision != read, set, known } }
}

#[derive(Deserialize)]
pub(super) struct PageQuery {
    done: Option<String>,
    read: Option<u64>,
}

/// `GET /settings`.
pub(super) async fn page(State(state): State<Host>, Signed(identity): Signed, uri: Uri) -> Response {
    let query = query_of::<PageQuery>(&uri);
    let flash = match query.as_ref().and_then(|q| q.done.as_deref()) {
        Some("updated") => Some(Flash::done("Settings saved", "The changed keys are stored; managers read them from the new revision.")),
        Some("unchanged") => Some(Flash::done("Nothing to save", "No value differed from what the page showed, so nothing was written.")),
        Some("gateway-ready") => Some(Flash::done(
            "Enrolled at the gateway",
            "Capstan holds its own client credential now; revoke the admin token at the gateway.",
        )),
        Some("gateway-degraded") => Some(Flash::done(
            "Credential issued, finalization pending",
            "The gateway issued Capstan's credential but could not finalize it yet; Capstan retries it. Revoke the admin token once this says ready.",
        )),
        _ => None,
    };
    settings_page(&state, &identity, StatusCode::OK, flash, Typed::default()).await
}

/// `GET /settings/panel?read=<revision>`: the status panel alone, for htmx.
pub(super) async fn panel(State(state): State<Host>, Signed(identity): Signed, uri: Uri) -> Response {
    let read = query_of::<PageQuery>(&uri).and_then(|q| q.read).unwrap_or_default();
    let document = call(&state, &identity, "settings.get", json!({})).await.ok();
    render(StatusCode::OK, "settings_panel.html", status_context(document.as_ref(), read))
}

/// What the form asks to change: keys whose input differs from the value it was read at
/// (an emptied input removes the key), and the other key when one is named.
fn changes(form: &FormData) -> (Map<String, Value>, Vec<String>) {
    let (mut set, mut unset) = (Map::new(), Vec::new());
    let mut change = |key: &str, text: &str| {
        if text.trim().is_empty() {
            unset.push(key.to_string());
        } else {
            set.insert(key.to_string(), typed_value(text));
        }
    };
    for (name, text) in &form.0 {
        let Some(key) = name.strip_prefix("value.") else { continue };
        if text.trim() != form.text(&format!("read.{key}")) {
            change(key, text);
        }
    }
    let other = form.text("otherKey");
    if !other.is_empty() {
        change(other, form.raw("otherValue"));
    }
    (set, unset)
}

/// `POST /settings/update` (`expectedRevision`, `value.<key>` and `read.<key>` per key,
/// `otherKey`, `otherValue`).
pub(super) async fn update(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let (set, unset) = changes(&form);
    if set.is_empty() && unset.is_empty() {
        return redirect("/settings?done=unchanged");
    }
    let body = json!({ "expectedRevision": number(form.text("expectedRevision")), "set": set, "unset": unset });
    match call(&state, &identity, "settings.update", body).await {
        Ok(_) => redirect("/settings?done=updated"),
        Err(refusal) => {
            let mut typed = Typed {
                revision: Some(form.text("expectedRevision").chars().take(40).collect()),
                other_key: form.raw("otherKey").chars().take(200).collect(),
                other_value: form.raw("otherValue").chars().take(4000).collect(),
                ..Typed::default()
            };
            for (name, text) in &form.0 {
                if let Some(key) = name.strip_prefix("value.") {
                    let read = form.text(&format!("read.{key}")).to_string();
                    typed.values.insert(key.to_string(), (read, text.chars().take(4000).collect()));
                }
            }
            let after = if refusal.is("conflict") {
                if let Some(revision) = refusal.data.as_ref().and_then(|d| d.get("revision")).and_then(Value::as_u64) {
                    typed.revision = Some(revision.to_string());
                }
                "Someone saved settings since this page read them. Your changes are still in the form; sending it again applies only the keys you changed."
            } else {
                "Nothing was saved; your entries are kept below."
            };
            let flash = Flash::refused("The settings were not saved", &refusal, after);
            settings_page(&state, &identity, status_of(&refusal), Some(flash), typed).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changed_keys_are_sent() {
        let form = FormData(
            [
                ("expectedRevision", "3"),
                ("value.dcrouterTargetPort", "8443"),
                ("read.dcrouterTargetPort", "443"),
                ("value.dcrouterTargetHost", "gw.example.com"),
                ("read.dcrouterTargetHost", "gw.example.com"),
                ("value.backupNodeCacheKeepDays", ""),
                ("read.backupNodeCacheKeepDays", "7"),
                ("value.appStoreCatalogSources", r#"["https://c.example.com/a.json"]"#),
                ("read.appStoreCatalogSources", ""),
                ("otherKey", "colour"),
                ("otherValue", "blue"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .to_vec(),
        );
        let (set, unset) = changes(&form);
        assert_eq!(
            Value::Object(set),
            json!({"dcrouterTargetPort": 8443, "appStoreCatalogSources": ["https://c.example.com/a.json"], "colour": "blue"})
        );
        assert_eq!(unset, ["backupNodeCacheKeepDays"]);
        assert_eq!(shown(&json!("starttls")), "starttls");
        assert_eq!(shown(&json!(["a"])), r#"["a"]"#);
        assert_eq!(typed_value("tls"), json!("tls"));
    }
}
