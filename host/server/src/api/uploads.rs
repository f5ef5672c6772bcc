//! `POST /api/v1/uploads/plugin-bundle`: a bundle (up to 64 MiB) is too large for a JSON body,
//! so it travels once as raw bytes here (administrators only); `plugins.install` /
//! `plugins.upgrade` then name the upload.

use super::{ApiError, AppState};
use crate::plugins::bundle::MAX_BUNDLE_BYTES;
use crate::plugins::methods::keep_upload;
use crate::refusal::Refusal;
use axum::Json;
use axum::extract::{Request, State};
use serde_json::{Value, json};

/// Keep a bundle for a following install or upgrade and say what it is and what it requests
/// (see [`keep_upload`]).
pub async fn plugin_bundle(State(state): State<AppState>, request: Request) -> std::result::Result<Json<Value>, ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = super::read_body_limited(&parts.headers, body, MAX_BUNDLE_BYTES).await.map_err(|e| {
        if e.is("request-too-large") {
            Refusal::new("bundle-too-large", format!("a bundle is at most {MAX_BUNDLE_BYTES} bytes"))
        } else {
            e
        }
    })?;
    let bearer = super::bearer_token(&parts.headers).ok_or_else(crate::auth::denied)?;
    let identity = state.auth.authenticate(bearer).await?;
    if !identity.is_human_admin() {
        return Err(Refusal::new("forbidden", "uploading a plugin bundle needs an administrator").into());
    }
    let (upload, inspection) = keep_upload(&state.blobs, &bytes, &identity.username).await?;
    Ok(Json(json!({ "upload": upload, "bundle": inspection })))
}
