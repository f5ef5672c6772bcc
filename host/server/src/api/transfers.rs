//! `PUT` and `GET /api/v1/transfers/<id>`: a plugin's blob moved by whoever holds a ticket the
//! plugin minted (a cluster's agent), straight between the request and the blob store
//! ([`crate::plugins::transfers`]).
//!
//! The ticket is redeemed from the headers before a byte of the body is read. An upload
//! streams into the blob store as it arrives — never whole in memory — counting and hashing
//! it; past the ticket's limit it fails and nothing is stored (`transfer-too-large`), and the
//! answer is `201 {key, size, sha256}` for the holder to compare with what it sent. A download
//! answers the object's bytes with its length.

use super::ApiError;
use crate::bearer::bearer_token;
use crate::blobs::Blobs;
use crate::plugins::imports::blob_prefix;
use crate::plugins::transfers::{self, Direction, Ticket};
use crate::refusal::Refusal;
use crate::store::Store;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, ReadBuf};

/// The ticket the request presents, taken for this one request.
async fn redeem(store: &Store, id: &str, headers: &axum::http::HeaderMap, direction: Direction) -> Result<Ticket, ApiError> {
    let token = bearer_token(headers).ok_or_else(transfers::ticket_invalid)?;
    let ticket = transfers::redeem(store, id, token, direction, transfers::now_ms()).await?;
    tracing::info!(ticket = %id, plugin = %ticket.plugin, ?direction, "transfer ticket presented");
    Ok(ticket)
}

/// The key as the plugin names it (without its prefix).
fn plugin_key(ticket: &Ticket) -> &str {
    ticket.key.strip_prefix(&blob_prefix(&ticket.plugin)).unwrap_or(&ticket.key)
}

fn too_large(max_bytes: u64) -> Refusal {
    Refusal::new("transfer-too-large", format!("this ticket allows at most {max_bytes} bytes")).with_data(json!({ "maxBytes": max_bytes }))
}

/// `PUT`: create the ticket's key from the body.
pub async fn upload(
    State(store): State<Store>,
    State(blobs): State<Blobs>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let ticket = redeem(&store, &id, &parts.headers, Direction::Upload).await?;
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > ticket.max_bytes) {
        return Err(too_large(ticket.max_bytes).into());
    }
    let progress = Arc::new(Mutex::new(Progress::default()));
    let stream = body.into_data_stream().map_err(|e| {
        let timed_out = crate::bodies::is_body_timeout(&e);
        std::io::Error::other(if timed_out { BodyError::TooSlow } else { BodyError::Broken(e.to_string()) })
    });
    let reader = Metered { inner: tokio_util::io::StreamReader::new(stream), progress: progress.clone(), max_bytes: ticket.max_bytes };
    let stored = blobs.put(&ticket.key, Box::pin(reader), crate::blobs::PutMode::CreateOnly).await;
    let progress = std::mem::take(&mut *progress.lock().expect("transfer progress"));
    let meta = match stored {
        Ok(meta) => meta,
        Err(_) if progress.exceeded => return Err(too_large(ticket.max_bytes).into()),
        Err(_) if progress.too_slow => return Err(crate::bodies::body_timeout_refusal().into()),
        Err(_) if progress.broken => return Err(Refusal::invalid_request("the upload was cut off; nothing was stored").into()),
        Err(e) => return Err(e.into()),
    };
    let sha256 = hex::encode(progress.hasher.finalize());
    tracing::info!(ticket = %id, plugin = %ticket.plugin, size = meta.size, "transfer stored");
    let answer = json!({ "key": plugin_key(&ticket), "size": meta.size, "sha256": sha256 });
    Ok((StatusCode::CREATED, axum::Json(answer)).into_response())
}

/// `GET`: the ticket's key, streamed.
pub async fn download(
    State(store): State<Store>,
    State(blobs): State<Blobs>,
    Path(id): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    let ticket = redeem(&store, &id, request.headers(), Direction::Download).await?;
    let Some((meta, reader)) = blobs.get(&ticket.key).await? else {
        return Err(Refusal::new("transfer-object-missing", "the object this ticket names is gone")
            .with_data(json!({ "key": plugin_key(&ticket) }))
            .into());
    };
    let mut response = Body::from_stream(tokio_util::io::ReaderStream::new(reader)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(meta.size));
    Ok(response)
}

/// What an upload has read so far.
#[derive(Default)]
struct Progress {
    hasher: Sha256,
    bytes: u64,
    exceeded: bool,
    too_slow: bool,
    broken: bool,
}

#[derive(Debug)]
enum BodyError {
    TooSlow,
    Broken(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooSlow => write!(f, "the body arrived too slowly"),
            BodyError::Broken(e) => write!(f, "the body could not be read: {e}"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Where an upload is "in the middle" for the crash point `transfer-upload:midway`.
const MIDWAY: u64 = 64 * 1024;

/// The body on its way to the blob store: hashed and counted, and failed past the limit (so
/// the store writes nothing).
struct Metered<R> {
    inner: R,
    progress: Arc<Mutex<Progress>>,
    max_bytes: u64,
}

impl<R: AsyncRead + Unpin> AsyncRead for Metered<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let mut progress = self.progress.lock().expect("transfer progress");
        match &polled {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                let earlier = progress.bytes;
                progress.bytes += read.len() as u64;
                if earlier < MIDWAY && progress.bytes >= MIDWAY {
                    // part of the body is on its way to the store, the rest not yet sent
                    capstan_core::crash_point("transfer-upload:midway");
                }
                if progress.bytes > self.max_bytes {
                    progress.exceeded = true;
                    return Poll::Ready(Err(std::io::Error::other("the upload is larger than its ticket allows")));
                }
                progress.hasher.update(read);
            }
            Poll::Ready(Err(e)) => match e.get_ref().and_then(|inner| inner.downcast_ref::<BodyError>()) {
                Some(BodyError::TooSlow) => progress.too_slow = true,
                _ => progress.broken = true,
            },
            Poll::Pending => {}
        }
        polled
    }
}
