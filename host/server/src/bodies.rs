//! Request bodies as the host holds them. Every body is paced ([`body_deadline`]: after a
//! grace it must keep up [`BODY_MIN_RATE`]). A route reads a body only once it knows who sends
//! it (or that the route needs nobody), against that caller's limit — a few KiB for nobody
//! ([`ANONYMOUS_BODY_BYTES`]) — and against one budget the whole listener shares
//! ([`BodyBudget`], `CAPSTAN_MAX_INFLIGHT_BODY_BYTES`): however many connections and HTTP/2
//! streams send at once, the bodies held together stay inside it, and a body that finds it
//! spent is refused `server-busy` (retryable) rather than waited for.

use crate::refusal::Refusal;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header;
use axum::http::request::Parts;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The most a caller nobody vouches for (a public method without a token, say `auth.login`)
/// may make the host buffer.
pub const ANONYMOUS_BODY_BYTES: usize = 8 * 1024;
/// The default of `CAPSTAN_MAX_INFLIGHT_BODY_BYTES`.
pub const DEFAULT_INFLIGHT_BODY_BYTES: usize = 64 * 1024 * 1024;
/// How much of a body refused unread (oversized, or its caller refused) is read and dropped
/// before the refusal is sent. A client still writing it when the refusal comes would meet a
/// connection reset (or SIGPIPE) instead of the named refusal; beyond this bound the connection
/// is simply closed. Dropped frames hold no memory; the body's pacing bounds the time.
const DRAINED_BODY_MAX: u64 = 16 * 1024 * 1024;

/// How long any request body may take before its rate counts.
pub const BODY_GRACE: Duration = Duration::from_secs(30);
/// The slowest average a body may arrive at after the grace: a 64 MiB bundle at this rate
/// takes about 17 minutes; a client sending a byte now and then is cut off after the grace.
pub const BODY_MIN_RATE: u64 = 64 * 1024;

/// Middleware: the request body must arrive at [`BODY_MIN_RATE`] on average after
/// [`BODY_GRACE`]; past that, reading it fails with [`BodyTimeout`] (which the API answers
/// `request-timeout`).
pub async fn body_deadline(request: Request, next: axum::middleware::Next) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let frames = http_body_util::BodyStream::new(body);
    let started = Instant::now();
    let paced = futures::stream::unfold((frames, 0u64, false), move |(mut frames, received, failed)| async move {
        if failed {
            return None;
        }
        let deadline = started + BODY_GRACE + Duration::from_millis(received.saturating_mul(1000) / BODY_MIN_RATE);
        tokio::select! {
            frame = frames.next() => {
                let frame = frame?;
                let size = frame.as_ref().ok().and_then(|f| f.data_ref()).map_or(0, |d| d.len() as u64);
                Some((frame, (frames, received + size, false)))
            }
            _ = tokio::time::sleep_until(deadline) => Some((Err(axum::Error::new(BodyTimeout)), (frames, received, true))),
        }
    });
    next.run(Request::from_parts(parts, Body::new(http_body_util::StreamBody::new(Box::pin(paced))))).await
}

/// A request body did not keep up [`BODY_MIN_RATE`].
#[derive(Debug)]
pub struct BodyTimeout;

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body arrived too slowly")
    }
}

impl std::error::Error for BodyTimeout {}

/// Whether `error` (or one of its sources) is a [`BodyTimeout`].
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(err) = source {
        if err.is::<BodyTimeout>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// The refusal for a body that did not keep up.
pub fn body_timeout_refusal() -> crate::refusal::Refusal {
    crate::refusal::Refusal::new(
        "request-timeout",
        format!("the request body arrived too slowly (at least {} KiB/s after {} s)", BODY_MIN_RATE / 1024, BODY_GRACE.as_secs()),
    )
}

/// The bytes of request bodies the host holds at once, shared by every connection of the
/// listener. Each buffered body holds its share until it is dropped.
#[derive(Clone, Debug)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    total: usize,
}

impl Default for BodyBudget {
    fn default() -> Self {
        BodyBudget::new(DEFAULT_INFLIGHT_BODY_BYTES)
    }
}

impl BodyBudget {
    /// A budget of `total` bytes (at most 4 GiB).
    pub fn new(total: usize) -> BodyBudget {
        let total = total.clamp(1, u32::MAX as usize);
        BodyBudget { bytes: Arc::new(Semaphore::new(total)), total }
    }

    /// Bytes not held by any body now.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// The whole budget.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Hold `n` more bytes, added to `held`; `server-busy` when the budget has not that many.
    fn hold(&self, n: usize, held: &mut Option<OwnedSemaphorePermit>) -> Result<(), Refusal> {
        if n == 0 {
            return Ok(());
        }
        let permit =
            u32::try_from(n).ok().and_then(|n| self.bytes.clone().try_acquire_many_owned(n).ok()).ok_or_else(|| busy(self.total))?;
        match held {
            Some(held) => held.merge(permit),
            None => *held = Some(permit),
        }
        Ok(())
    }
}

/// The refusal of a body the budget has no room for.
pub fn busy(total: usize) -> Refusal {
    Refusal::new(
        "server-busy",
        format!("this host is holding as many request bodies as it may ({total} bytes in all); try again in a moment"),
    )
    .with_data(json!({ "retryAfterMs": 1000 }))
    .retryable()
}

/// A body read whole: its bytes, holding their share of the [`BodyBudget`] until dropped.
#[derive(Debug)]
pub struct Buffered {
    bytes: Bytes,
    _held: Option<OwnedSemaphorePermit>,
}

impl std::ops::Deref for Buffered {
    type Target = Bytes;
    fn deref(&self) -> &Bytes {
        &self.bytes
    }
}

/// Read `body` whole: at most `limit` bytes (a larger one is refused `request-too-large`), held
/// against the budget the router put in the request's extensions (`server-busy` when it is
/// spent); a body that stalls is refused as the listener's pacing says.
pub async fn read(parts: &Parts, mut body: Body, limit: usize) -> Result<Buffered, Refusal> {
    let too_large = || {
        Refusal::new("request-too-large", format!("request bodies are limited to {limit} bytes")).with_data(json!({ "limitBytes": limit }))
    };
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared.filter(|n| *n > limit as u64) {
        if declared <= DRAINED_BODY_MAX {
            drain(body, DRAINED_BODY_MAX).await;
        }
        return Err(too_large());
    }
    let budget = parts.extensions.get::<BodyBudget>();
    let mut held = None;
    // a declared length is held at once: a body the budget cannot take is refused before it
    // is read; one without a length is held frame by frame as it comes
    if let (Some(budget), Some(declared)) = (budget, declared) {
        budget.hold(declared as usize, &mut held)?;
    }
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(unreadable)?;
        let Ok(data) = frame.into_data() else { continue };
        if bytes.len() + data.len() > limit {
            return Err(too_large());
        }
        if let (Some(budget), None) = (budget, declared) {
            budget.hold(data.len(), &mut held)?;
        }
        bytes.extend_from_slice(&data);
    }
    Ok(Buffered { bytes: bytes.into(), _held: held })
}

/// Why a body could not be read: it stalled (the listener's pacing), or the connection failed.
fn unreadable(e: axum::Error) -> Refusal {
    if is_body_timeout(&e) {
        return body_timeout_refusal();
    }
    Refusal::invalid_request("the request body could not be read").detail(e)
}

/// Read and drop up to `max` bytes of a body (the listener's body pacing still bounds the time);
/// whether it ended within them.
async fn drain(mut body: Body, max: u64) -> bool {
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { return false };
        seen += frame.data_ref().map_or(0, |d| d.len() as u64);
        if seen > max {
            return false;
        }
    }
    true
}

/// A body refused before it was read (its method unknown, its caller refused): drop it, up to
/// [`DRAINED_BODY_MAX`], so the client reads the refusal; whether the connection must close
/// instead (a body larger than that).
pub async fn refused_unread(parts: &Parts, body: Body) -> bool {
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAINED_BODY_MAX) {
        return true;
    }
    !drain(body, DRAINED_BODY_MAX).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn parts(length: Option<usize>, budget: Option<&BodyBudget>) -> Parts {
        let mut request = Request::builder().method("POST").uri("/api/v1/x");
        if let Some(length) = length {
            request = request.header(header::CONTENT_LENGTH, length);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        if let Some(budget) = budget {
            parts.extensions.insert(budget.clone());
        }
        parts
    }

    /// A body of `n` bytes in frames of 1 KiB, with no declared length.
    fn chunked(n: usize) -> Body {
        let frames = (0..n.div_ceil(1024)).map(move |i| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 1024.min(n - i * 1024)])));
        Body::from_stream(futures::stream::iter(frames))
    }

    #[tokio::test]
    async fn a_buffered_body_holds_its_share_of_the_budget_until_it_is_dropped() {
        let budget = BodyBudget::new(10_000);
        let first = read(&parts(Some(6_000), Some(&budget)), Body::from(vec![0u8; 6_000]), 1 << 20).await.unwrap();
        assert_eq!(first.len(), 6_000);
        assert_eq!(budget.available(), 4_000);
        // a second declared body that does not fit is refused before it is read
        let refused = read(&parts(Some(6_000), Some(&budget)), Body::from(vec![0u8; 6_000]), 1 << 20).await.unwrap_err();
        assert_eq!((refused.code.as_ref(), refused.retryable, refused.http_status()), ("server-busy", true, 503));
        // nor one without a length, once its frames pass what is left
        let refused = read(&parts(None, Some(&budget)), chunked(5_000), 1 << 20).await.unwrap_err();
        assert!(refused.is("server-busy"));
        assert_eq!(budget.available(), 4_000, "a refused body gives back what it held");
        drop(first);
        assert_eq!(budget.available(), 10_000);
        let chunked_read = read(&parts(None, Some(&budget)), chunked(5_000), 1 << 20).await.unwrap();
        assert_eq!((chunked_read.len(), budget.available()), (5_000, 5_000));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_declared_or_not() {
        let declared = read(&parts(Some(2_000), None), Body::from(vec![0u8; 2_000]), 1_000).await.unwrap_err();
        assert_eq!((declared.code.as_ref(), declared.http_status()), ("request-too-large", 413));
        let undeclared = read(&parts(None, None), chunked(2_000), 1_000).await.unwrap_err();
        assert!(undeclared.is("request-too-large"));
        assert_eq!(read(&parts(None, None), Body::empty(), 1_000).await.unwrap().len(), 0);
    }

    #[tokio::test]
    async fn an_unread_body_is_dropped_up_to_a_bound_beyond_which_the_connection_closes() {
        assert!(!refused_unread(&parts(None, None), chunked(3_000)).await);
        assert!(!refused_unread(&parts(Some(1 << 20), None), Body::from(vec![0u8; 1 << 20])).await);
        assert!(refused_unread(&parts(Some(50 << 20), None), Body::empty()).await);
        assert!(refused_unread(&parts(None, None), chunked(17 << 20)).await);
    }
}
