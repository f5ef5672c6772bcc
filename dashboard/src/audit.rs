//! `/audit`: the audit log for administrators — state-changing calls newest first, filtered by
//! method, actor, outcome and target, one page at a time; through `audit.list`, as the API
//! answers it (never a body value).

use super::forms::{ErrorView, Signed, call, encode, status_of, str_of, u64_of, when};
use super::{message_page, nav, render, user_view};
use crate::Host;
use crate::state::AppState;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Records per page.
const PAGE: u64 = 50;

/// The routes of the view.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/audit", get(audit_page))
}

/// The filters a page was asked for (an empty field is no filter).
#[derive(Debug, Default, Deserialize, Serialize)]
struct Filters {
    #[serde(default)]
    method: String,
    #[serde(default)]
    actor: String,
    #[serde(default)]
    outcome: String,
    #[serde(default)]
    target: String,
    #[serde(default)]
    cursor: String,
}

impl Filters {
    /// The body of `audit.list`: the filters that are set, each at most 128 characters.
    fn body(&self) -> Value {
        let mut body = Map::new();
        for (key, value) in [("method", &self.method), ("actor", &self.actor), ("outcome", &self.outcome), ("target", &self.target)] {
            let value = value.trim();
            if !value.is_empty() {
                body.insert(key.into(), json!(value.chars().take(128).collect::<String>()));
            }
        }
        if !self.cursor.is_empty() {
            body.insert("cursor".into(), json!(self.cursor));
        }
        body.insert("limit".into(), json!(PAGE));
        Value::Object(body)
    }

    /// The query of the next page: these filters, continued after `cursor`.
    fn next(&self, cursor: &str) -> String {
        let pairs = [("method", &self.method), ("actor", &self.actor), ("outcome", &self.outcome), ("target", &self.target)];
        let mut query: Vec<String> =
            pairs.iter().filter(|(_, v)| !v.trim().is_empty()).map(|(key, value)| format!("{key}={}", encode(value.trim()))).collect();
        query.push(format!("cursor={}", encode(cursor)));
        query.join("&")
    }
}

#[derive(Serialize)]
struct RecordView {
    at: String,
    at_iso: String,
    method: String,
    /// The method's parts around its first dot (`services`, `create`): the cell breaks there.
    area: String,
    verb: String,
    actor: String,
    kind: String,
    outcome: String,
    ok: bool,
    targets: Vec<String>,
    request_id: String,
}

fn record_view(r: &Value) -> RecordView {
    let (at, at_iso) = when(u64_of(r, "at"));
    let actor = &r["actor"];
    let method = str_of(r, "method");
    let (area, verb) = method.split_once('.').unwrap_or((method, ""));
    RecordView {
        at,
        at_iso,
        area: area.into(),
        verb: verb.into(),
        method: method.into(),
        actor: str_of(actor, "username").into(),
        kind: str_of(actor, "kind").into(),
        outcome: str_of(r, "outcome").into(),
        ok: str_of(r, "outcome") == "ok",
        targets: r["targets"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect(),
        request_id: str_of(r, "requestId").into(),
    }
}

/// `GET /audit`.
async fn audit_page(State(state): State<Host>, Signed(identity): Signed, Query(filters): Query<Filters>) -> Response {
    if !identity.is_human_admin() {
        return message_page(StatusCode::FORBIDDEN, "Administrators only", "The audit log is for administrators.");
    }
    let (records, next, error, status) = match call(&state, &identity, "audit.list", filters.body()).await {
        Ok(page) => {
            let records: Vec<RecordView> = page["records"].as_array().into_iter().flatten().map(record_view).collect();
            let next = page["nextCursor"].as_str().map(|c| format!("/audit?{}", filters.next(c)));
            (records, next, None, StatusCode::OK)
        }
        Err(refusal) => (Vec::new(), None, Some(ErrorView::from(&refusal)), status_of(&refusal)),
    };
    let ctx = context! {
        page => "Audit",
        nav => Serde(nav(&state, "audit")),
        user => Serde(user_view(&identity)),
        filters => Serde(&filters),
        records => Serde(records),
        next => next,
        error => Serde(error),
    };
    render(status, "audit.html", ctx)
}
