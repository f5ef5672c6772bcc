//! `/authorize/<request id>`: where a hosted app's sign-in through Capstan (its OpenID
//! provider, docs/identity.md) asks the signed-in person to go on. The page names the app, where
//! the browser goes back to and the role the person has there; "Continue" answers the app with a
//! code (`hostedOidc.completeAuthorization`), "Cancel" with `access_denied`
//! (`hostedOidc.cancelAuthorization`). A person without a role in the app is told so and can only
//! cancel.

use super::forms::{ErrorView, call, post, status_of, str_of};
use super::{render, user_view};
use crate::Host;
use crate::state::AppState;
use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use minijinja::context;
use minijinja::value::Serde;
use serde_json::json;

/// The routes of the page.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/authorize/{id}", get(page).post(decide))
}

/// `GET /authorize/<id>`: a person not logged in goes to the login page, which comes back here.
async fn page(State(state): State<Host>, headers: axum::http::HeaderMap, Path(id): Path<String>) -> Response {
    let viewer = match super::current_identity(&state, &headers).await {
        Ok(Some(viewer)) => viewer,
        Ok(None) => {
            let safe: String = id.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').take(200).collect();
            return super::forms::redirect(&format!("/login?next=%2Fauthorize%2F{safe}"));
        }
        Err(refusal) => return super::unavailable(refusal),
    };
    match call(&state, &viewer, "hostedOidc.getAuthorization", json!({ "requestId": id })).await {
        Ok(view) => {
            let ctx = context! {
                user => Serde(user_view(&viewer)),
                request_id => id,
                app => str_of(&view, "appName"),
                redirect_origin => str_of(&view, "redirectOrigin"),
                role => view["role"].as_str(),
            };
            no_referrer(render(StatusCode::OK, "authorize.html", ctx))
        }
        Err(refusal) => {
            let ctx = context! { user => Serde(user_view(&viewer)), error => Serde(ErrorView::from(&refusal)) };
            no_referrer(render(status_of(&refusal), "authorize.html", ctx))
        }
    }
}

/// `POST /authorize/<id>` with `decision=continue|cancel`: back to the app.
async fn decide(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (viewer, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let method = match form.text("decision") {
        "continue" => "hostedOidc.completeAuthorization",
        _ => "hostedOidc.cancelAuthorization",
    };
    match call(&state, &viewer, method, json!({ "requestId": id })).await {
        Ok(answer) => match HeaderValue::from_str(str_of(&answer, "redirectUrl")) {
            Ok(location) => no_referrer((StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()),
            Err(_) => super::message_page(StatusCode::BAD_GATEWAY, "No way back to the app", "The app's address cannot be followed."),
        },
        Err(refusal) => {
            let ctx = context! { user => Serde(user_view(&viewer)), error => Serde(ErrorView::from(&refusal)) };
            no_referrer(render(status_of(&refusal), "authorize.html", ctx))
        }
    }
}

/// The app's code rides in the redirect: no page here passes an address on.
fn no_referrer(mut response: Response) -> Response {
    response.headers_mut().insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}
