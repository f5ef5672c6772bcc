//! The HTTP listener: each connection is served by hyper within bounds a slow or hostile client
//! cannot stretch ([`Bounds`]).
//!
//! - At most `max_connections` are open at once; further clients wait in the kernel's accept
//!   queue until one closes (they are not refused, and they hold no memory here).
//! - A connection with no request in flight — one that never sent a byte, an HTTP/2 connection
//!   with no stream, a kept-alive one between requests — is closed after [`IDLE_TIMEOUT`]; a
//!   request head must arrive within [`HEADER_TIMEOUT`] of its first byte (hyper closes the
//!   connection). A response still being sent counts as in flight.
//! - What one connection can make the host hold is small: HTTP/1 buffers at most
//!   [`HTTP1_MAX_BUF`] (a request head larger than that is refused 431); HTTP/2 over cleartext
//!   (h2c, prior knowledge) is served for clients that speak it, with at most [`H2_MAX_STREAMS`]
//!   concurrent streams and flow-control windows of [`H2_WINDOW`] (the protocol's default), so
//!   a peer can send at most that much before the host reads it.
//! - Request bodies are paced and held against one budget for the whole listener
//!   (`crate::bodies`); the budget rides on every request as an extension.
//! - Once a burst of connections has gone, the allocator is asked to return freed memory to the
//!   system ([`trim_after_closes`]), so an attack leaves no lasting footprint.
//!
//! A request's client is the connection's peer, or when the peer is one of the trusted proxies
//! (`CAPSTAN_TRUSTED_PROXIES`), the nearest address in `X-Forwarded-For` that is not one
//! ([`TrustedProxies`]); `ConnectInfo<SocketAddr>` holds that client for everything after.
//!
//! Shutdown stops accepting, lets requests in flight finish, and returns once every
//! connection is closed (the caller bounds how long that may take).

use crate::bodies::BodyBudget;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

/// How long a client has to send a whole request head once it has begun it.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may stay open with no request in flight.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most an HTTP/1 connection buffers (a request head must fit in it).
pub const HTTP1_MAX_BUF: usize = 64 * 1024;
/// Concurrent streams an HTTP/2 connection may open.
pub const H2_MAX_STREAMS: u32 = 32;
/// HTTP/2 flow-control windows, per stream and per connection: what a peer may send before the
/// host reads it (65,535 bytes is the protocol's initial window).
pub const H2_WINDOW: u32 = 65_535;
/// What an HTTP/2 connection queues of its answers for a peer that does not read them.
pub const H2_MAX_SEND_BUF: usize = 64 * 1024;

/// The bounds the listener serves within.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Connections open at once (`CAPSTAN_MAX_CONNECTIONS`).
    pub max_connections: usize,
    /// The request bodies held at once, across every connection (`CAPSTAN_MAX_INFLIGHT_BODY_BYTES`).
    pub body_budget: BodyBudget,
    /// See [`IDLE_TIMEOUT`] (tests shorten it).
    pub idle_timeout: Duration,
}

impl Bounds {
    /// `max_connections` at once, bodies held within `inflight_body_bytes`.
    pub fn new(max_connections: usize, inflight_body_bytes: usize) -> Bounds {
        Bounds { max_connections, body_budget: BodyBudget::new(inflight_body_bytes), idle_timeout: IDLE_TIMEOUT }
    }
}

/// Serve `router` on `listener` until `shutdown` completes, then drain.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    proxies: TrustedProxies,
    shutdown: impl Future<Output = ()> + Send,
) {
    let router = if proxies.0.is_empty() { router } else { router.layer(axum::middleware::from_fn_with_state(proxies, resolve_client)) };
    let Bounds { max_connections, body_budget, idle_timeout } = bounds;
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let (closing, _) = watch::channel(false);
    // every connection holds a receiver; the sender sees them all gone once they have closed
    let (open_tx, open_rx) = watch::channel(());
    let closed = Arc::new(AtomicU64::new(0));
    let trimmer = tokio::spawn(trim_after_closes(closed.clone()));
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
        let activity = Arc::new(Activity::new());
        let service = TowerToHyperService::new(Connection {
            router: router.clone(),
            remote,
            budget: body_budget.clone(),
            activity: activity.clone(),
        });
        let (mut closing, open, closed) = (closing.subscribe(), open_rx.clone(), closed.clone());
        tokio::spawn(async move {
            let mut builder = Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_buf_size(HTTP1_MAX_BUF);
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(H2_MAX_STREAMS)
                .initial_stream_window_size(H2_WINDOW)
                .initial_connection_window_size(H2_WINDOW)
                .max_send_buf_size(H2_MAX_SEND_BUF);
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let idle = tokio::time::sleep(idle_timeout);
            tokio::pin!(idle);
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
                    _ = &mut idle => match activity.idle_for() {
                        Some(idle_for) if idle_for >= idle_timeout => {
                            // nothing in flight to lose: dropping the connection closes it
                            tracing::debug!(%remote, "an idle connection was closed");
                            break;
                        }
                        Some(idle_for) => idle.as_mut().reset(Instant::now() + (idle_timeout - idle_for)),
                        None => idle.as_mut().reset(Instant::now() + idle_timeout),
                    },
                }
            }
            closed.fetch_add(1, Ordering::Relaxed);
            drop((permit, open));
        });
    }
    drop(listener);
    let _ = closing.send(true);
    drop(open_rx);
    open_tx.closed().await;
    trimmer.abort();
}

/// What one connection is doing: how many of its requests are in flight (an answer still being
/// sent counts), and since when it has had none.
struct Activity {
    in_flight: AtomicUsize,
    quiet_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Activity {
        Activity { in_flight: AtomicUsize::new(0), quiet_since: Mutex::new(Instant::now()) }
    }

    /// How long the connection has had nothing in flight; `None` while something is.
    fn idle_for(&self) -> Option<Duration> {
        let quiet_since = *self.quiet_since.lock().expect("the activity lock is never poisoned");
        (self.in_flight.load(Ordering::Acquire) == 0).then(|| quiet_since.elapsed())
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }
}

/// One request in flight on a connection, until its answer has been sent (or abandoned).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.quiet_since.lock().expect("the activity lock is never poisoned") = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The router as one connection serves it: each request learns its client and the body budget,
/// and counts as in flight until its answer's body is done.
#[derive(Clone)]
struct Connection {
    router: Router,
    remote: SocketAddr,
    budget: BodyBudget,
    activity: Arc<Activity>,
}

impl<B> tower::Service<Request<B>> for Connection
where
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let mut request = request.map(Body::new);
        request.extensions_mut().insert(ConnectInfo(self.remote));
        request.extensions_mut().insert(self.budget.clone());
        let in_flight = self.activity.begin();
        let router = self.router.clone();
        Box::pin(async move {
            let response = tower::ServiceExt::oneshot(router, request).await?;
            // the answer holds the request in flight until hyper has sent (or dropped) its body
            Ok(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &in_flight;
                    frame
                }))
            }))
        })
    }
}

/// Every 10 s after connections have closed, hand the memory the allocator keeps free back to
/// the system (glibc keeps freed arenas otherwise: an instance stayed at 662 MB after its
/// attackers had gone).
async fn trim_after_closes(closed: Arc<AtomicU64>) {
    let mut seen = 0;
    let mut every = tokio::time::interval(Duration::from_secs(10));
    loop {
        every.tick().await;
        let now = closed.load(Ordering::Relaxed);
        if now != seen {
            seen = now;
            trim();
        }
    }
}

/// Bound the allocator's arenas to two per core, unless the operator set `MALLOC_ARENA_MAX`:
/// glibc's default of eight per core lets a burst of connections, served on many threads, leave
/// memory spread over arenas that neither merge nor shrink (the siege's peak went from 276 to
/// 233 MiB with four on two cores, docs/benchmarks.md). Called once at start.
pub fn bound_allocator_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let arenas = i32::try_from(cores * 2).unwrap_or(i32::MAX).max(2);
        // SAFETY: mallopt only sets an allocator parameter; it takes no pointers.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

/// Return free heap memory to the system, where the allocator can.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The proxies whose `X-Forwarded-For` is believed: addresses and networks
/// (`CAPSTAN_TRUSTED_PROXIES`, e.g. `10.0.0.0/8, 192.0.2.10`). None by default: then every
/// request's client is the connection's peer, and `X-Forwarded-For` is ignored.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Arc<Vec<ipnet::IpNet>>);

impl TrustedProxies {
    /// Parse a comma-separated list of addresses and networks; the entry that is neither is
    /// named in the error.
    pub fn parse(text: &str) -> std::result::Result<TrustedProxies, String> {
        capstan_core::net::parse_networks(text).map(|nets| TrustedProxies(Arc::new(nets)))
    }

    fn trusts(&self, ip: std::net::IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// Who a request from `peer` comes from: `peer` itself unless it is a trusted proxy; then,
    /// reading `X-Forwarded-For` from the nearest hop back, the first address that is not a
    /// trusted proxy (an entry that is no address ends the walk at the hop before it).
    pub fn client(&self, peer: std::net::IpAddr, headers: &axum::http::HeaderMap) -> std::net::IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let hops: Vec<&str> =
            headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(str::trim).collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            let Ok(ip) = hop.parse::<std::net::IpAddr>() else { break };
            client = ip;
            if !self.trusts(ip) {
                break;
            }
        }
        client
    }
}

/// Middleware: replace the peer in `ConnectInfo` with the client [`TrustedProxies::client`]
/// names.
async fn resolve_client(
    axum::extract::State(proxies): axum::extract::State<TrustedProxies>,
    mut request: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<std::net::SocketAddr>>().copied() {
        let client = proxies.client(peer.ip(), request.headers());
        if client != peer.ip() {
            request.extensions_mut().insert(ConnectInfo(std::net::SocketAddr::new(client, 0)));
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    #[test]
    fn only_a_trusted_proxy_is_believed_and_only_as_far_as_trusted_hops_go() {
        let proxies = TrustedProxies::parse("10.0.0.0/8, 192.0.2.10").unwrap();
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", HeaderValue::from_static("203.0.113.66, 198.51.100.7"));
        headers.append("x-forwarded-for", HeaderValue::from_static("10.1.2.3"));
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        // a client that is not a proxy cannot claim another address
        assert_eq!(proxies.client(ip("198.51.100.99"), &headers), ip("198.51.100.99"));
        // through two trusted hops, the first untrusted one from the near end is the client;
        // what it claimed before it (203.0.113.66) is not believed
        assert_eq!(proxies.client(ip("192.0.2.10"), &headers), ip("198.51.100.7"));
        // a hop that is no address ends the walk
        let mut junk = HeaderMap::new();
        junk.insert("x-forwarded-for", HeaderValue::from_static("198.51.100.7, not-an-address"));
        assert_eq!(proxies.client(ip("10.9.9.9"), &junk), ip("10.9.9.9"));
        // no header: the proxy itself
        assert_eq!(proxies.client(ip("10.9.9.9"), &HeaderMap::new()), ip("10.9.9.9"));
        // none trusted by default
        assert_eq!(TrustedProxies::default().client(ip("10.1.1.1"), &headers), ip("10.1.1.1"));
        assert!(TrustedProxies::parse("10.0.0.0/8, example.com").unwrap_err().contains("example.com"));
    }
}
