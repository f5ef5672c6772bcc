//! `POST /api/v1/uploads/plugin-bundle`: a bundle (up to 64 MiB) is too large for a JSON body,
//! so it travels once as raw bytes here (administrators only); `plugins.install` /
//! `plugins.upgrade` then name the upload.
//!
//! The caller is authorized from the headers before a byte of the body is read; the body is
//! then spooled to a temporary file with the limit enforced as it arrives (see
//! [`crate::plugins::uploads`]).

use super::ApiError;
use crate::auth::Auth;
use crate::bearer::bearer_token;
use crate::blobs::Blobs;
use crate::plugins::uploads::Spool;
use crate::refusal::Refusal;
use axum::Json;
use axum::extract::{Request, State};
use axum::http::header;
use futures::StreamExt;
use serde_json::{Value, json};
use std::sync::Arc;

/// Keep a bundle for a following install or upgrade and say what it is and what it requests
/// (see [`crate::plugins::uploads::keep`]).
pub async fn plugin_bundle(
    State(auth): State<Arc<Auth>>,
    State(blobs): State<Blobs>,
    request: Request,
) -> std::result::Result<Json<Value>, ApiError> {
    let (parts, body) = request.into_parts();
    let bearer = bearer_token(&parts.headers).ok_or_else(crate::auth::denied)?;
    let identity = auth.authenticate(bearer).await?;
    if !identity.is_human_admin() {
        return Err(Refusal::new("forbidden", "uploading a plugin bundle needs an administrator").into());
    }
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    Spool::check_declared(declared)?;
    let mut spool = Spool::new()?;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| match crate::bodies::is_body_timeout(&e) {
            true => crate::bodies::body_timeout_refusal(),
            false => Refusal::invalid_request("the request body could not be read").detail(e),
        })?;
        spool.push(&chunk).await?;
    }
    let (upload, inspection) = spool.keep(&blobs, &identity.username).await?;
    Ok(Json(json!({ "upload": upload, "bundle": inspection })))
}
