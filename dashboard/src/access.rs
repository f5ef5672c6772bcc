//! `/services/<id>/access`: a hosted app's single sign-on through Capstan's OpenID provider, for
//! administrators (docs/identity.md) — what its template declares, whether it is on (turned on
//! and off here), and who holds which of the app's roles (given and taken away here). Through
//! `apps.getAccess`, `apps.setOidc` and `apps.assignRole`, as the API answers them; the client
//! secret is never shown.

use super::forms::{ErrorView, Flash, Signed, call, encode, post, redirect, status_of, str_of};
use super::{message_page, nav, render, user_view};
use crate::Host;
use crate::state::AppState;
use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post as post_route};
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The routes of the view.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/services/{id}/access", get(page))
        .route("/services/{id}/access/oidc", post_route(set_oidc))
        .route("/services/{id}/access/assign", post_route(assign))
}

#[derive(Deserialize)]
struct Done {
    done: Option<String>,
}

#[derive(Serialize)]
struct Person {
    user_id: String,
    username: String,
}

async fn page(State(state): State<Host>, Signed(viewer): Signed, Path(id): Path<String>, Query(done): Query<Done>) -> Response {
    let flash = match done.done.as_deref() {
        Some("on") => Some(Flash::done(
            "Single sign-on is on",
            "The app's replicas receive the issuer, client id and client secret as the service's own secrets.",
        )),
        Some("off") => Some(Flash::done("Single sign-on is off", "The app's client is removed and its credentials revoked.")),
        Some("assigned") => Some(Flash::done("Roles changed", "The app sees the new role at the person's next sign-in.")),
        _ => None,
    };
    show(&state, &viewer, &id, StatusCode::OK, flash).await
}

async fn show(state: &Host, viewer: &super::Viewer, id: &str, status: StatusCode, flash: Option<Flash>) -> Response {
    if !viewer.identity.is_human_admin() {
        return message_page(StatusCode::FORBIDDEN, "Administrators only", "A hosted app's single sign-on is set by administrators.");
    }
    let (access, error, status) = match call(state, viewer, "apps.getAccess", json!({ "serviceId": id })).await {
        Ok(access) => (access, None, status),
        Err(refusal) => (Value::Null, Some(ErrorView::from(&refusal)), status_of(&refusal)),
    };
    let people = people(state, viewer).await;
    let ctx = context! {
        page => "Single sign-on",
        nav => Serde(nav(state, "services")),
        user => Serde(user_view(viewer)),
        flash => Serde(flash),
        service_id => id,
        service_href => format!("/services/{}", encode(id)),
        action => format!("/services/{}/access", encode(id)),
        access => Serde(access),
        people => Serde(people),
        error => Serde(error),
    };
    render(status, "access.html", ctx)
}

/// Every enabled person, page by page (at most 50 pages of 100), for the role form's choice.
async fn people(state: &Host, viewer: &super::Viewer) -> Vec<Person> {
    let (mut people, mut cursor) = (Vec::new(), None::<String>);
    for _ in 0..50 {
        let Ok(page) = call(state, viewer, "users.list", json!({ "cursor": cursor, "limit": 100 })).await else { break };
        people.extend(
            page["users"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|u| u["disabled"] != true)
                .map(|u| Person { user_id: str_of(u, "userId").into(), username: str_of(u, "username").into() }),
        );
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    people
}

async fn set_oidc(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (viewer, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let enabled = form.text("enabled") == "true";
    match call(&state, &viewer, "apps.setOidc", json!({ "serviceId": id, "enabled": enabled })).await {
        Ok(_) => redirect(&format!("/services/{}/access?done={}", encode(&id), if enabled { "on" } else { "off" })),
        Err(refusal) => {
            let flash = Flash::refused("Single sign-on was not changed", &refusal, "");
            show(&state, &viewer, &id, status_of(&refusal), Some(flash)).await
        }
    }
}

async fn assign(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (viewer, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let role = match form.text("role") {
        "" => Value::Null,
        role => json!(role),
    };
    match call(&state, &viewer, "apps.assignRole", json!({ "serviceId": id, "userId": form.text("userId"), "role": role })).await {
        Ok(_) => redirect(&format!("/services/{}/access?done=assigned", encode(&id))),
        Err(refusal) => {
            let flash = Flash::refused("The role was not changed", &refusal, "");
            show(&state, &viewer, &id, status_of(&refusal), Some(flash)).await
        }
    }
}
