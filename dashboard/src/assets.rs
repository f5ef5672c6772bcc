//! The dashboard's static assets, embedded in the binary at compile time and served under
//! `/static/<content hash>/<path>` with a year-long immutable cache header: a new build with
//! a changed file gets a new URL, so a browser never keeps a stale copy.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// One embedded file.
pub struct Asset {
    /// The path under `dashboard/static/`.
    pub path: &'static str,
    /// The `content-type` it is served with.
    pub content_type: &'static str,
    /// Its bytes, embedded at compile time.
    pub bytes: &'static [u8],
}

/// Every file the dashboard serves.
pub static ASSETS: &[Asset] = &[
    Asset { path: "app.css", content_type: "text/css; charset=utf-8", bytes: include_bytes!("../static/app.css") },
    Asset { path: "logo.svg", content_type: "image/svg+xml", bytes: include_bytes!("../static/logo.svg") },
    Asset { path: "copy.js", content_type: "text/javascript; charset=utf-8", bytes: include_bytes!("../static/copy.js") },
    Asset { path: "seal.js", content_type: "text/javascript; charset=utf-8", bytes: include_bytes!("../static/seal.js") },
    Asset { path: "live.js", content_type: "text/javascript; charset=utf-8", bytes: include_bytes!("../static/live.js") },
    Asset { path: "logs.js", content_type: "text/javascript; charset=utf-8", bytes: include_bytes!("../static/logs.js") },
    Asset {
        path: "vendor/htmx.min.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../static/vendor/htmx.min.js"),
    },
    Asset {
        path: "vendor/htmx.LICENSE",
        content_type: "text/plain; charset=utf-8",
        bytes: include_bytes!("../static/vendor/htmx.LICENSE"),
    },
];

/// Cache forever: the URL changes with the content.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// The first 16 hex digits of each asset's SHA-256, in the order of [`ASSETS`].
static HASHES: LazyLock<Vec<String>> = LazyLock::new(|| ASSETS.iter().map(|a| hex::encode(&Sha256::digest(a.bytes)[..8])).collect());

fn find(path: &str) -> Option<(&'static Asset, &'static str)> {
    ASSETS.iter().zip(HASHES.iter()).find(|(a, _)| a.path == path).map(|(a, h)| (a, h.as_str()))
}

/// The URL of an embedded asset, `None` for a path that is not embedded.
pub fn url(path: &str) -> Option<String> {
    find(path).map(|(asset, hash)| format!("/static/{hash}/{}", asset.path))
}

/// `GET /static/{hash}/{*path}`: the asset when both the path and its current hash match.
pub async fn serve(Path((hash, path)): Path<(String, String)>) -> Response {
    match find(&path) {
        Some((asset, current)) if current == hash => (
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type)),
                (header::CACHE_CONTROL, HeaderValue::from_static(IMMUTABLE)),
            ],
            asset.bytes,
        )
            .into_response(),
        _ => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8"), (header::CACHE_CONTROL, "no-store")],
            "no such asset in this version of Capstan\n",
        )
            .into_response(),
    }
}
