//! The HTTP listener: each connection is served by hyper within bounds a slow or hostile client
//! cannot stretch.
//!
//! - At most `max_connections` are open at once; further clients wait in the kernel's accept
//!   queue until one closes (they are not refused, and they hold no memory here).
//! - A request head must arrive within [`HEADER_TIMEOUT`] (hyper closes the connection).
//! - A request body must keep up an average of [`BODY_MIN_RATE`] after a [`BODY_GRACE`]
//!   allowance ([`body_deadline`]); a body that stalls is refused `request-timeout` (408).
//!
//! Shutdown stops accepting, lets requests in flight finish, and returns once every
//! connection is closed (the caller bounds how long that may take).

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use futures::StreamExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

/// How long a client has to send a whole request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long any request body may take before its rate counts.
pub const BODY_GRACE: Duration = Duration::from_secs(30);
/// The slowest average a body may arrive at after the grace: a 64 MiB bundle at this rate
/// takes about 17 minutes; a client sending a byte now and then is cut off after the grace.
pub const BODY_MIN_RATE: u64 = 64 * 1024;

/// Serve `router` on `listener` until `shutdown` completes, then drain.
pub async fn serve(listener: TcpListener, router: Router, max_connections: usize, shutdown: impl Future<Output = ()> + Send) {
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let (closing, _) = watch::channel(false);
    // every connection holds a receiver; the sender sees them all gone once they have closed
    let (open_tx, open_rx) = watch::channel(());
    let mut warned_full = false;
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the connection slots are never closed"),
            _ = &mut shutdown => break,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // out of file descriptors, say: wait a moment rather than spin
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        if slots.available_permits() == 0 && !warned_full {
            tracing::warn!(max_connections, "every connection slot is in use; new clients wait until one closes");
        }
        warned_full = slots.available_permits() == 0;
        let service = TowerToHyperService::new(tower::Layer::layer(&axum::Extension(ConnectInfo(remote)), router.clone()));
        let (mut closing, open) = (closing.subscribe(), open_rx.clone());
        tokio::spawn(async move {
            let mut builder = Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let mut draining = false;
            loop {
                tokio::select! {
                    served = connection.as_mut() => {
                        if let Err(e) = served {
                            tracing::debug!(error = %e, %remote, "connection ended with an error");
                        }
                        break;
                    }
                    _ = closing.wait_for(|c| *c), if !draining => {
                        draining = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
            }
            drop((permit, open));
        });
    }
    drop(listener);
    let _ = closing.send(true);
    drop(open_rx);
    open_tx.closed().await;
}

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
