//! Health probes of a container at its address: a TCP connect, or an HTTP GET answered 2xx/3xx,
//! each within 2 s.

use std::error::Error as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

/// How long a probe may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A health check of a service's container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A TCP connection to the port is accepted.
    Tcp {
        /// The container port.
        port: u16,
    },
    /// `GET path` on the port answers 2xx or 3xx (redirects are not followed).
    Http {
        /// The container port.
        port: u16,
        /// The request path (`/healthz`).
        path: String,
    },
}

/// Run `check` against `target` (the container's address); why it failed, in words.
pub async fn probe(check: &Probe, target: IpAddr) -> Result<(), String> {
    match check {
        Probe::Tcp { port } => {
            let address = SocketAddr::new(target, *port);
            match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("connecting to {address} failed: {e}")),
                Err(_) => Err(format!("connecting to {address} took longer than {} s", PROBE_TIMEOUT.as_secs())),
            }
        }
        Probe::Http { port, path } => {
            let path = if path.starts_with('/') { path.clone() } else { format!("/{path}") };
            let url = format!("http://{}{path}", SocketAddr::new(target, *port));
            let client = client()?;
            let answer = tokio::time::timeout(PROBE_TIMEOUT, client.get(&url).send()).await;
            match answer {
                Err(_) => Err(format!("GET {url} did not answer within {} s", PROBE_TIMEOUT.as_secs())),
                Ok(Err(e)) if e.is_timeout() => Err(format!("GET {url} did not answer within {} s", PROBE_TIMEOUT.as_secs())),
                Ok(Err(e)) => Err(format!("GET {url} failed: {}", error_chain(&e))),
                Ok(Ok(response)) => {
                    let status = response.status();
                    if status.is_success() || status.is_redirection() { Ok(()) } else { Err(format!("GET {url} answered {status}")) }
                }
            }
        }
    }
}

/// One client for every probe: no proxy, no redirects followed, the probe's timeout.
fn client() -> Result<&'static reqwest::Client, String> {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    if let Some(client) = CLIENT.get() {
        return Ok(client);
    }
    let built = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(PROBE_TIMEOUT)
        .timeout(PROBE_TIMEOUT)
        .build()
        .map_err(|e| format!("the probe's HTTP client could not be built: {e}"))?;
    Ok(CLIENT.get_or_init(|| built))
}

/// An error with its causes: reqwest's own words alone ("error sending request") say little.
fn error_chain(e: &reqwest::Error) -> String {
    let mut words = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !words.contains(&text) {
            words.push_str(": ");
            words.push_str(&text);
        }
        source = cause.source();
    }
    words
}
