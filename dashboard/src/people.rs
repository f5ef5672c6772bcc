//! People, organizations and publishers: `/users` (people with whether each is an administrator
//! or disabled; create, disable, enable, reset a password, end sessions — administrators, with a
//! login from the last 5 minutes), `/organizations` and `/organizations/{id}` (organizations;
//! an organization's members and their roles, given, changed and removed by its owners; renamed
//! by its owners), and `/publishers` (the publisher keys plugin bundles may be signed by, with
//! their names; added and removed by administrators).
//!
//! Every action is the registered method's (`users.*`, `admin.createUser`,
//! `organizations.*`, `plugins.*TrustedPublisher*`), called as the signed-in person, so the
//! dashboard is authorized and validated exactly like the API; a change states the generation
//! or revision the page read. A generated password is shown once, on the answer to the post
//! that made it (never in a redirect, a link or a log). Refusals are shown by name.

use super::forms::{ErrorView, Flash, FormData, Signed, call, encode, post, redirect, status_of, str_of, u64_of, when};
use super::{message_page, nav, render, user_view};
use crate::Host;
use crate::Viewer;
use crate::refusal::{Refusal, Result};
use crate::state::AppState;
use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post as post_route};
use minijinja::context;
use minijinja::value::Serde;
use serde::Serialize;
use serde_json::{Value, json};

/// The routes of these pages.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/users", get(users_page).post(create_user))
        .route("/users/{id}/{action}", post_route(user_action))
        .route("/organizations", get(organizations_page).post(create_organization))
        .route("/organizations/{id}", get(organization_page))
        .route("/organizations/{id}/rename", post_route(rename_organization))
        .route("/organizations/{id}/members", post_route(set_member))
        .route("/publishers", get(publishers_page).post(add_publisher))
        .route("/publishers/remove", post_route(remove_publisher))
}

fn forbidden(what: &str) -> Response {
    message_page(
        StatusCode::FORBIDDEN,
        "Administrators only",
        &format!("The {what} view is for administrators. Ask one to show you, or to make you one."),
    )
}

/// The most people one page reads (pages of 100).
const MAX_PAGES: usize = 100;

async fn all_people(state: &Host, identity: &Viewer) -> Result<Vec<Value>> {
    let (mut people, mut cursor) = (Vec::new(), None::<String>);
    for _ in 0..MAX_PAGES {
        let page = call(state, identity, "users.list", json!({ "cursor": cursor, "limit": 100 })).await?;
        people.extend(page["users"].as_array().cloned().unwrap_or_default());
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    Ok(people)
}

// ---------------------------------------------------------------------------------------
// People

#[derive(Serialize)]
struct PersonView {
    id: String,
    username: String,
    admin: bool,
    disabled: bool,
    password_enabled: bool,
    generation: u64,
    created: String,
    created_iso: String,
    is_self: bool,
}

/// A password just generated, shown on this answer only.
#[derive(Serialize)]
struct Generated {
    username: String,
    password: String,
}

async fn render_users(state: &Host, identity: &Viewer, status: StatusCode, flash: Option<Flash>, generated: Option<Generated>) -> Response {
    let (people, error) = match all_people(state, identity).await {
        Ok(people) => (people, None),
        Err(refusal) => (Vec::new(), Some(ErrorView::from(&refusal))),
    };
    let people: Vec<PersonView> = people
        .iter()
        .map(|p| {
            let (created, created_iso) = when(u64_of(p, "createdAt"));
            PersonView {
                id: str_of(p, "userId").into(),
                username: str_of(p, "username").into(),
                admin: p["admin"].as_bool().unwrap_or(false),
                disabled: p["disabled"].as_bool().unwrap_or(false),
                password_enabled: p["passwordEnabled"].as_bool().unwrap_or(false),
                generation: u64_of(p, "generation"),
                created,
                created_iso,
                is_self: str_of(p, "userId") == identity.user_id,
            }
        })
        .collect();
    let ctx = context! {
        page => "Users",
        nav => Serde(nav(state, "users")),
        user => Serde(user_view(identity)),
        people => Serde(people),
        error => Serde(error),
        flash => Serde(flash),
        generated => Serde(generated),
    };
    render(status, "users.html", ctx)
}

/// `GET /users`.
async fn users_page(State(state): State<Host>, Signed(identity): Signed) -> Response {
    if !identity.is_human_admin() {
        return forbidden("users");
    }
    render_users(&state, &identity, StatusCode::OK, None, None).await
}

/// `POST /users`: create a person; the generated password is on this answer only.
async fn create_user(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let body = json!({ "username": form.text("username"), "admin": form.text("admin") == "on" });
    match call(&state, &identity, "admin.createUser", body).await {
        Ok(answer) => {
            let username = str_of(&answer, "username").to_string();
            let flash = Flash::done(format!("Created {username}"), "Hand the password below over privately: it is shown this once.");
            let generated = Generated { username, password: str_of(&answer, "password").into() };
            render_users(&state, &identity, StatusCode::OK, Some(flash), Some(generated)).await
        }
        Err(refusal) => render_users(&state, &identity, status_of(&refusal), Some(refused("Not created", &refusal)), None).await,
    }
}

fn refused(title: &str, refusal: &Refusal) -> Flash {
    let after = if refusal.is("admin-not-fresh") {
        "Log out and in again, then repeat the change."
    } else if refusal.is("conflict") {
        "It changed since this page was read: look again and repeat the change."
    } else {
        ""
    };
    Flash::refused(title, refusal, after)
}

/// `POST /users/{id}/{disable|enable|reset-password|revoke-sessions}` with the generation read.
async fn user_action(State(state): State<Host>, Path((id, action)): Path<(String, String)>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let generation = super::forms::number(form.text("expectedGeneration"));
    let (method, body) = match action.as_str() {
        "disable" | "enable" => {
            ("users.setDisabled", json!({ "userId": id, "disabled": action == "disable", "expectedGeneration": generation }))
        }
        "reset-password" => ("users.resetPassword", json!({ "userId": id, "expectedGeneration": generation })),
        "revoke-sessions" => ("users.revokeSessions", json!({ "userId": id, "expectedGeneration": generation })),
        _ => return super::not_found_page(),
    };
    match call(&state, &identity, method, body).await {
        Ok(answer) => {
            let name = str_of(&answer, "username").to_string();
            let ended = u64_of(&answer, "sessionsRevoked");
            let (flash, generated) = match action.as_str() {
                "disable" => (Flash::done(format!("Disabled {name}"), format!("Their login is refused; {ended} session(s) ended.")), None),
                "enable" => (Flash::done(format!("Enabled {name}"), "They log in with the password they had."), None),
                "reset-password" => (
                    Flash::done(
                        format!("New password for {name}"),
                        format!("{ended} session(s) ended. Hand the password below over privately: it is shown this once."),
                    ),
                    Some(Generated { username: name, password: str_of(&answer, "password").into() }),
                ),
                _ => (Flash::done(format!("Ended {name}'s sessions"), format!("{ended} session(s) ended; their password stays.")), None),
            };
            render_users(&state, &identity, StatusCode::OK, Some(flash), generated).await
        }
        Err(refusal) => render_users(&state, &identity, status_of(&refusal), Some(refused("Not changed", &refusal)), None).await,
    }
}

// ---------------------------------------------------------------------------------------
// Organizations

#[derive(Serialize)]
struct OrganizationRow {
    id: String,
    name: String,
    href: String,
}

/// `GET /organizations`: every organization for an administrator, one's own for anyone else.
async fn organizations_page(State(state): State<Host>, Signed(identity): Signed) -> Response {
    render_organizations(&state, &identity, StatusCode::OK, None, "").await
}

async fn render_organizations(state: &Host, identity: &Viewer, status: StatusCode, flash: Option<Flash>, typed: &str) -> Response {
    let (rows, error) = match call(state, identity, "organizations.list", json!({ "limit": 200 })).await {
        Ok(answer) => {
            let rows = answer["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| OrganizationRow {
                    id: str_of(o, "id").into(),
                    name: str_of(o, "name").into(),
                    href: format!("/organizations/{}", encode(str_of(o, "id"))),
                })
                .collect();
            (rows, None)
        }
        Err(refusal) => (Vec::new(), Some(ErrorView::from(&refusal))),
    };
    let ctx = context! {
        page => "Organizations",
        nav => Serde(nav(state, "organizations")),
        user => Serde(user_view(identity)),
        organizations => Serde(rows),
        error => Serde(error),
        flash => Serde(flash),
        typed => typed,
    };
    render(status, "organizations.html", ctx)
}

/// `POST /organizations`: create one (administrators).
async fn create_organization(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    match call(&state, &identity, "organizations.create", json!({ "name": form.text("name") })).await {
        Ok(answer) => redirect(&format!("/organizations/{}?created=1", encode(str_of(&answer, "id")))),
        Err(refusal) => {
            let flash = refused("Not created", &refusal);
            render_organizations(&state, &identity, status_of(&refusal), Some(flash), form.text("name")).await
        }
    }
}

#[derive(Serialize)]
struct MemberRow {
    user_id: String,
    username: String,
    role: String,
}

async fn render_organization(state: &Host, identity: &Viewer, id: &str, status: StatusCode, flash: Option<Flash>) -> Response {
    let organization = match call(state, identity, "organizations.get", json!({ "id": id })).await {
        Ok(organization) => organization,
        Err(refusal) => {
            let message = format!("{} ({}).", refusal.message.trim_end_matches('.'), refusal.code);
            return message_page(status_of(&refusal), "This organization cannot be shown", &message);
        }
    };
    let (members, error) = match call(state, identity, "organizations.listMembers", json!({ "organizationId": id, "limit": 200 })).await {
        Ok(answer) => {
            let rows: Vec<MemberRow> = answer["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| MemberRow {
                    user_id: str_of(m, "userId").into(),
                    username: str_of(m, "username").into(),
                    role: str_of(m, "role").into(),
                })
                .collect();
            (rows, None)
        }
        Err(refusal) => (Vec::new(), Some(ErrorView::from(&refusal))),
    };
    let owner = identity.is_human_admin() || members.iter().any(|m| m.user_id == identity.user_id && m.role == "owner");
    let ctx = context! {
        page => "Organizations",
        nav => Serde(nav(state, "organizations")),
        user => Serde(user_view(identity)),
        organization => context! {
            id => str_of(&organization, "id"),
            name => str_of(&organization, "name"),
            revision => u64_of(&organization, "revision"),
        },
        members => Serde(members),
        panels => Serde(super::plugin_pages::entity_panels(state, identity, "organization", &organization)),
        owner => owner,
        error => Serde(error),
        flash => Serde(flash),
    };
    render(status, "organization.html", ctx)
}

/// `GET /organizations/{id}`: its members and their roles.
async fn organization_page(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: axum::http::Uri) -> Response {
    let flash = uri.query().is_some_and(|q| q.contains("created=1")).then(|| Flash::done("Organization created", "Give it members below."));
    render_organization(&state, &identity, &id, StatusCode::OK, flash).await
}

/// `POST /organizations/{id}/rename` with the revision read.
async fn rename_organization(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let body = json!({ "id": id, "name": form.text("name"), "expectedRevision": super::forms::number(form.text("expectedRevision")) });
    match call(&state, &identity, "organizations.update", body).await {
        Ok(answer) => {
            let flash = Flash::done("Renamed", format!("The organization is now {}.", str_of(&answer, "name")));
            render_organization(&state, &identity, &id, StatusCode::OK, Some(flash)).await
        }
        Err(refusal) => render_organization(&state, &identity, &id, status_of(&refusal), Some(refused("Not renamed", &refusal))).await,
    }
}

/// The user a member form names: an id as it is; a username looked up among people when the
/// caller may list them (administrators), else refused by name.
async fn member_id(state: &Host, identity: &Viewer, form: &FormData) -> Result<String> {
    let given = form.text("user");
    if let Some(id) = form.0.iter().find(|(k, _)| k == "userId").map(|(_, v)| v.trim()).filter(|v| !v.is_empty()) {
        return Ok(id.to_string());
    }
    if given.is_empty() {
        return Err(Refusal::invalid_request("name the person by username or id").with_data(json!({ "field": "user" })));
    }
    if identity.is_human_admin() {
        let people = all_people(state, identity).await?;
        if let Some(person) =
            people.iter().find(|p| str_of(p, "username") == given).or_else(|| people.iter().find(|p| str_of(p, "userId") == given))
        {
            return Ok(str_of(person, "userId").to_string());
        }
        return Err(Refusal::new("user-not-found", format!("no person is named {given}")).with_data(json!({ "field": "user" })));
    }
    Ok(given.to_string())
}

/// `POST /organizations/{id}/members`: give a person a role, change it, or remove them
/// (`role` = `none`).
async fn set_member(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let result = async {
        let user_id = member_id(&state, &identity, &form).await?;
        let role = match form.text("role") {
            "none" => Value::Null,
            role => Value::from(role),
        };
        call(&state, &identity, "organizations.setMember", json!({ "organizationId": id, "userId": user_id, "role": role })).await
    }
    .await;
    match result {
        Ok(answer) => {
            let message = match answer["role"].as_str() {
                Some(role) => format!("They are now {role}."),
                None => "They are no longer a member.".into(),
            };
            render_organization(&state, &identity, &id, StatusCode::OK, Some(Flash::done("Membership changed", message))).await
        }
        Err(refusal) => render_organization(&state, &identity, &id, status_of(&refusal), Some(refused("Not changed", &refusal))).await,
    }
}

// ---------------------------------------------------------------------------------------
// Publishers

#[derive(Serialize)]
struct PublisherRow {
    name: String,
    fingerprint: String,
    public_key: String,
    added_by: String,
    added: String,
    added_iso: String,
    configured: bool,
}

async fn render_publishers(state: &Host, identity: &Viewer, status: StatusCode, flash: Option<Flash>) -> Response {
    let (rows, error) = match call(state, identity, "plugins.listTrustedPublishers", json!({})).await {
        Ok(answer) => {
            let mut rows: Vec<PublisherRow> = answer["added"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let (added, added_iso) = when(u64_of(p, "addedAt"));
                    PublisherRow {
                        name: str_of(p, "name").into(),
                        fingerprint: str_of(p, "fingerprint").into(),
                        public_key: str_of(p, "publicKey").into(),
                        added_by: str_of(p, "addedBy").into(),
                        added,
                        added_iso,
                        configured: false,
                    }
                })
                .collect();
            rows.extend(answer["configured"].as_array().into_iter().flatten().filter_map(Value::as_str).map(|key| PublisherRow {
                name: String::new(),
                fingerprint: String::new(),
                public_key: key.into(),
                added_by: String::new(),
                added: String::new(),
                added_iso: String::new(),
                configured: true,
            }));
            (rows, None)
        }
        Err(refusal) => (Vec::new(), Some(ErrorView::from(&refusal))),
    };
    let ctx = context! {
        page => "Publishers",
        nav => Serde(nav(state, "publishers")),
        user => Serde(user_view(identity)),
        publishers => Serde(rows),
        error => Serde(error),
        flash => Serde(flash),
    };
    render(status, "publishers.html", ctx)
}

/// `GET /publishers`.
async fn publishers_page(State(state): State<Host>, Signed(identity): Signed) -> Response {
    if !identity.is_human_admin() {
        return forbidden("publishers");
    }
    render_publishers(&state, &identity, StatusCode::OK, None).await
}

/// `POST /publishers`: trust a key under a name.
async fn add_publisher(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let body = json!({ "publicKey": form.text("publicKey"), "name": form.text("name") });
    match call(&state, &identity, "plugins.addTrustedPublisher", body).await {
        Ok(answer) => {
            let flash =
                Flash::done(format!("Trusting {}", str_of(&answer, "name")), format!("Fingerprint {}.", str_of(&answer, "fingerprint")));
            render_publishers(&state, &identity, StatusCode::OK, Some(flash)).await
        }
        Err(refusal) => render_publishers(&state, &identity, status_of(&refusal), Some(refused("Not added", &refusal))).await,
    }
}

/// `POST /publishers/remove`: stop trusting a key.
async fn remove_publisher(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    match call(&state, &identity, "plugins.removeTrustedPublisher", json!({ "publicKey": form.text("publicKey") })).await {
        Ok(answer) if answer["removed"] == true => {
            let flash = Flash::done("Publisher removed", "Bundles it signs are no longer trusted; installed plugins keep running.");
            render_publishers(&state, &identity, StatusCode::OK, Some(flash)).await
        }
        Ok(_) => {
            let refusal = Refusal::new("publisher-not-found", "that key was not trusted here");
            render_publishers(&state, &identity, StatusCode::NOT_FOUND, Some(refused("Not removed", &refusal))).await
        }
        Err(refusal) => render_publishers(&state, &identity, status_of(&refusal), Some(refused("Not removed", &refusal))).await,
    }
}
