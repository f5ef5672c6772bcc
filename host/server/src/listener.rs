//! The HTTP listener: each connection is served by hyper within bounds a slow or hostile client
//! cannot stretch.
//!
//! - At most `max_connections` are open at once; further clients wait in the kernel's accept
//!   queue until one closes (they are not refused, and they hold no memory here).
//! - A request head must arrive within [`HEADER_TIMEOUT`] (hyper closes the connection).
//! - A request body must keep up an average of [`BODY_MIN_RATE`] after a [`BODY_GRACE`]
//!   allowance ([`body_deadline`]); a body that stalls is refused `request-timeout` (408).
//!
//! A request's client is the connection's peer, or when the peer is one of the trusted proxies
//! (`CAPSTAN_TRUSTED_PROXIES`), the nearest address in `X-Forwarded-For` that is not one
//! ([`TrustedProxies`]); `ConnectInfo<SocketAddr>` holds that client for everything after.
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
pub async fn serve(
    listener: TcpListener,
    router: Router,
    max_connections: usize,
    proxies: TrustedProxies,
    shutdown: impl Future<Output = ()> + Send,
) {
    let router = if proxies.0.is_empty() { router } else { router.layer(axum::middleware::from_fn_with_state(proxies, resolve_client)) };
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
