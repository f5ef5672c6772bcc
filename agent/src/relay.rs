//! `capstan-agent relay`: the reference cluster relay (docs/relays.md, "The relay's session").
//!
//! The relay runs on an enrolled node. It opens `ws(s)://<origin>/api/v1/socket` (the origin
//! the node enrolled with), offers the relay bearer read from the authorization file, waits
//! for the welcome (which names the cluster the bearer was verified for), and registers the
//! node with `relays.register`. Then it keeps the session: `relay.config` pushes are kept in
//! `relay-config.json` in the state directory (private, atomic; a push whose digest is the one
//! kept is skipped), `request` frames are answered by the handlers of a [`Registry`] (each on
//! a task of its own, abandoned at its `deadlineMs`), and the host is pinged when it falls
//! silent.
//!
//! Any loss of the session is followed by a new one: promptly after the host's `going-away`
//! (1001), otherwise after the crate's backoff (`backoff.rs`). The authorization file is read
//! again before every attempt, so a rotated bearer handed to the file is taken without a
//! restart. The bearer never appears in a log line, an error or any output.

use crate::backoff::{After, next_delay};
use crate::carrier::Carrier;
use crate::handler::{Registry, RelayContext};
use crate::ingress::Ingress;
use crate::state::{RelayConfig, StateDir};
use capstan_core::Refusal;
use capstan_core::private_file;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use zeroize::Zeroizing;

/// The socket protocol the relay speaks.
pub const PROTOCOL: &str = "capstan-socket/1";
/// The longest wait between attempts while the host refuses the bearer: a bearer handed to the
/// file is taken within a minute (sooner: a change of the file ends the wait at once).
const CREDENTIAL_RETRY_CAP: Duration = Duration::from_secs(60);
/// How long connecting, and then the welcome, may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one frame may take to go out.
const SEND_TIMEOUT: Duration = Duration::from_secs(15);

/// How the relay runs.
pub struct Options {
    /// The state directory (the enrolled node's credential; the relay configuration is kept here).
    pub state: StateDir,
    /// The file holding the relay bearer (`capstan keyring export-relay-authorization`).
    pub authorization_file: PathBuf,
    /// Where the relay's own listener is bound, reported with the registration.
    pub listen: Option<SocketAddr>,
    /// The methods the relay answers.
    pub registry: Registry,
    /// The first wait after a failure, doubled per failure in a row up to five minutes (1 s).
    pub retry_base: Duration,
    /// The cluster ingress this relay runs, if any: registered after each accepted relay
    /// registration (its `ingress.applyRouteTable` handler is in `registry`).
    pub ingress: Option<Arc<Ingress>>,
    /// Where the cluster's nodes open their runtime sessions to be carried (`carrier`).
    pub nodes_listen: Option<SocketAddr>,
}

/// The relay bearer (secret): its `Debug` never shows it, its memory is wiped on drop.
pub struct Bearer(Zeroizing<String>);

impl Bearer {
    /// The bearer itself, for the one frame that presents it.
    pub fn expose(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Bearer(<redacted>)")
    }
}

/// Read the relay bearer: a regular file owned by this user with one link, not readable or
/// writable by group or others (refused `authorization-file-…` by name otherwise), holding one
/// printable token (surrounding whitespace is trimmed).
pub fn read_authorization(path: &Path) -> Result<Bearer, Refusal> {
    let bytes = Zeroizing::new(private_file::read_strict(path).map_err(|r| match r.code.strip_prefix("input-") {
        // input-missing, -symlink, -not-regular, -not-owned, -permissions, -hard-links, -too-large
        Some(rule) => Refusal {
            code: format!("authorization-file-{rule}").into(),
            message: format!("the relay authorization file: {}", r.message),
            ..r
        },
        None => r,
    })?);
    let data = json!({ "path": path.display().to_string() });
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| {
            Refusal::new("authorization-file-invalid", format!("{} does not hold a relay bearer", path.display())).with_data(data.clone())
        })?
        .trim();
    if text.is_empty() {
        return Err(
            Refusal::new("authorization-file-empty", format!("{} is empty; it must hold the relay bearer", path.display())).with_data(data)
        );
    }
    if !text.bytes().all(|b| b.is_ascii_graphic()) {
        // never quoted: it is most of a bearer
        return Err(Refusal::new(
            "authorization-file-invalid",
            format!("{} does not hold one relay bearer (printable characters without spaces)", path.display()),
        )
        .with_data(data));
    }
    Ok(Bearer(Zeroizing::new(text.to_string())))
}

/// The socket's address for an origin: `http` → `ws`, `https` → `wss`, path `/api/v1/socket`.
pub fn socket_url(origin: &str) -> Result<String, Refusal> {
    let origin = origin.trim_end_matches('/');
    let rest = origin
        .strip_prefix("https://")
        .map(|rest| ("wss", rest))
        .or_else(|| origin.strip_prefix("http://").map(|rest| ("ws", rest)))
        .ok_or_else(|| Refusal::new("origin-invalid", format!("the enrolled origin {origin:?} is neither http nor https")))?;
    Ok(format!("{}://{}/api/v1/socket", rest.0, rest.1))
}

/// The upgrade to the socket at `url` carrying `authorization` (`Bearer …`, never logged) and,
/// for a node's runtime session, the node id beside it (`capstan_core::wire::NODE_HEADER`): the host then takes
/// the session's slot from the machines' pool at once, which strangers' sessions cannot fill.
pub fn upgrade(url: &str, authorization: &str, node: Option<&str>) -> Result<Request, String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::HeaderValue;
    let mut request = url.into_client_request().map_err(|e| format!("{url} is no WebSocket address: {e}"))?;
    let mut value = HeaderValue::from_str(authorization).map_err(|_| "the bearer cannot travel in a header".to_string())?;
    value.set_sensitive(true);
    request.headers_mut().insert("authorization", value);
    if let Some(node) = node {
        let value = HeaderValue::from_str(node).map_err(|_| format!("the node id {node:?} cannot travel in a header"))?;
        request.headers_mut().insert(capstan_core::wire::NODE_HEADER, value);
    }
    Ok(request)
}

/// A WebSocket upgrade request.
pub type Request = tokio_tungstenite::tungstenite::handshake::client::Request;

/// How a session ended.
#[derive(Debug, Clone, PartialEq)]
enum Ended {
    /// The host is stopping (1001): reconnect promptly.
    GoingAway,
    /// The host refused the bearer (`relay-credential-generation-stale` 4011, `unauthenticated`
    /// 4003, …): wait for the operator to hand over the current one.
    CredentialRefused { code: String, message: String },
    /// Anything else: unreachable, dropped, closed, a broken exchange.
    Lost(String),
}

/// Session-level refusal codes after which the host closes the session.
fn closes_session(code: &str) -> bool {
    matches!(
        code,
        "offer-invalid"
            | "protocol-unsupported"
            | "session-kind-unknown"
            | "offer-timeout"
            | "frame-too-large"
            | "slow-reader"
            | "ping-timeout"
            | "session-expired"
    ) || credential_refusal(code)
}

fn credential_refusal(code: &str) -> bool {
    code == "unauthenticated" || code.starts_with("relay-credential-")
}

fn ended_by_refusal(code: &str, message: &str) -> Ended {
    if credential_refusal(code) {
        Ended::CredentialRefused { code: code.into(), message: message.into() }
    } else {
        Ended::Lost(format!("the host refused the session: {code}: {message}"))
    }
}

fn ended_by_close(frame: Option<&CloseFrame>) -> Ended {
    let Some(frame) = frame else { return Ended::Lost("the host closed the session".into()) };
    let reason = capstan_core::text::escape_control(&capstan_core::text::truncate(frame.reason.as_str(), 120)).into_owned();
    match u16::from(frame.code) {
        1001 => Ended::GoingAway,
        4011 => Ended::CredentialRefused {
            code: "relay-credential-generation-stale".into(),
            message: "the bearer belongs to an earlier generation of the relay credential".into(),
        },
        4003 => Ended::CredentialRefused { code: "unauthenticated".into(), message: "the host does not recognize the bearer".into() },
        code => Ended::Lost(format!("the host closed the session ({code} {reason})")),
    }
}

/// Run the relay until `shutdown` completes. A node that is not enrolled, or an authorization
/// file that cannot be used, is refused at once; after that, nothing ends the relay but
/// `shutdown`.
pub async fn relay(options: Options, shutdown: impl Future<Output = &'static str>) -> Result<(), Refusal> {
    let credential = options.state.read_credential()?;
    let url = socket_url(&credential.origin)?;
    read_authorization(&options.authorization_file)?;
    // a configuration kept by an earlier run is already applied: a push of the same is skipped
    let kept = match options.state.read_relay_config() {
        Ok(kept) => kept.map(|c| c.digest),
        Err(refusal) => {
            tracing::warn!("the kept relay configuration cannot be read ({refusal}); the next push replaces it");
            None
        }
    };
    tracing::info!(
        socket = %url,
        node_id = %credential.node_id,
        methods = ?options.registry.methods(),
        authorization_file = %options.authorization_file.display(),
        "capstan-agent relay starting"
    );
    let carrier = Arc::new(Carrier::new(PROTOCOL));
    if let Some(addr) = options.nodes_listen {
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            Refusal::new("nodes-listen-failed", format!("the nodes' listener cannot bind {addr}: {e}"))
                .with_data(json!({ "address": addr.to_string() }))
        })?;
        tracing::info!(address = %addr, "carrying the cluster's node runtime sessions");
        tokio::spawn(crate::carrier::listen(listener, carrier.clone()));
    }
    let mut relay = Relay {
        carrier,
        node_id: credential.node_id,
        url,
        config_digest: kept,
        listen: options.listen,
        registry: Arc::new(options.registry),
        state: options.state,
        retry_base: options.retry_base,
        ingress: options.ingress,
    };
    let mut failures: u32 = 0;
    tokio::pin!(shutdown);
    loop {
        let attempt = async {
            let bearer = read_authorization(&options.authorization_file)
                .map_err(|r| Ended::Lost(format!("the authorization file cannot be used: {r}")))?;
            Ok::<_, Ended>(relay.session(&bearer).await)
        };
        let (ended, registered) = tokio::select! {
            why = &mut shutdown => return stopped(why),
            outcome = attempt => match outcome {
                Ok(outcome) => outcome,
                Err(ended) => (ended, false),
            },
        };
        if registered {
            failures = 0;
        }
        let draw = rand::random::<f64>();
        let delay = match &ended {
            Ended::GoingAway => {
                tracing::info!("the host is going away (1001); reconnecting");
                failures = 0;
                options.retry_base.min(Duration::from_secs(1)).mul_f64(draw)
            }
            Ended::CredentialRefused { code, message } => {
                failures = failures.saturating_add(1);
                tracing::error!(
                    code = %code,
                    "the host refused the relay's bearer: {message}; hand the relay the current authorization (capstan keyring export-relay-authorization) in {} — it is read again before every attempt",
                    options.authorization_file.display()
                );
                next_delay(options.retry_base, After::Failure(failures), draw).min(CREDENTIAL_RETRY_CAP)
            }
            Ended::Lost(why) => {
                failures = failures.saturating_add(1);
                tracing::warn!("the relay's session ended: {why}");
                next_delay(options.retry_base, After::Failure(failures), draw)
            }
        };
        tracing::debug!(delay = %humantime::format_duration(delay), "next attempt");
        let changed = file_changed(&options.authorization_file, delay);
        tokio::select! {
            why = &mut shutdown => return stopped(why),
            changed = changed => if changed {
                tracing::info!("the authorization file changed; reconnecting");
            },
        }
    }
}

fn stopped(why: &str) -> Result<(), Refusal> {
    tracing::info!("stopping ({why})");
    Ok(())
}

/// Completes after `delay` (false), or sooner when the file at `path` changes (true: a new
/// bearer handed over).
/// What tells a replaced file from the one read before: its modification time, length and inode.
type FileState = (Option<std::time::SystemTime>, u64, u64);

fn file_state(path: &Path) -> Option<FileState> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.modified().ok(), m.len(), std::os::unix::fs::MetadataExt::ino(&m)))
}

async fn file_changed(path: &Path, delay: Duration) -> bool {
    let look = || file_state(path);
    let before = look();
    let until = tokio::time::Instant::now() + delay;
    loop {
        let step = until.saturating_duration_since(tokio::time::Instant::now()).min(Duration::from_millis(500));
        if step.is_zero() {
            return false;
        }
        tokio::time::sleep(step).await;
        if look() != before {
            return true;
        }
    }
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

struct Relay {
    /// The node runtime sessions this relay carries.
    carrier: Arc<Carrier>,
    node_id: String,
    url: String,
    /// The digest of the configuration kept in the state directory.
    config_digest: Option<String>,
    listen: Option<SocketAddr>,
    registry: Arc<Registry>,
    state: StateDir,
    retry_base: Duration,
    ingress: Option<Arc<Ingress>>,
}

/// What the relay's call for its ingress is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IngressStep {
    Register,
    Fetch,
}

/// The welcome's limits that the relay acts on.
struct Limits {
    max_frame_bytes: usize,
    ping_interval: Duration,
    silence_timeout: Duration,
}

impl Limits {
    fn from_welcome(welcome: &Value) -> Limits {
        let limits = &welcome["limits"];
        let ms = |key: &str, default: u64| Duration::from_millis(limits[key].as_u64().unwrap_or(default).clamp(1_000, 3_600_000));
        Limits {
            max_frame_bytes: limits["maxFrameBytes"].as_u64().map(|n| n as usize).unwrap_or(1_064_960),
            ping_interval: ms("pingIntervalMs", 20_000),
            silence_timeout: ms("silenceTimeoutMs", 60_000),
        }
    }
}

impl Relay {
    /// One session, from connecting to its end; answers how it ended and whether a
    /// registration was accepted on it.
    async fn session(&mut self, bearer: &Bearer) -> (Ended, bool) {
        let mut registered = false;
        let ended = self.session_inner(bearer, &mut registered).await;
        (ended, registered)
    }

    async fn session_inner(&mut self, bearer: &Bearer, registered: &mut bool) -> Ended {
        // the bearer rides on the upgrade too: the host then takes the session's slot from the
        // machines' pool at once, which strangers' sessions cannot fill
        let authorization = Zeroizing::new(format!("Bearer {}", bearer.0.as_str()));
        let request = match upgrade(&self.url, &authorization, None) {
            Ok(request) => request,
            Err(why) => return Ended::Lost(why),
        };
        let mut ws = match tokio::time::timeout(OPEN_TIMEOUT, tokio_tungstenite::connect_async(request)).await {
            Err(_) => return Ended::Lost(format!("connecting to {} timed out", self.url)),
            Ok(Err(e)) => return Ended::Lost(format!("connecting to {} failed: {e}", self.url)),
            Ok(Ok((ws, _response))) => ws,
        };
        let offer =
            Zeroizing::new(json!({"type": "offer", "kind": "relay", "protocols": [PROTOCOL], "token": bearer.0.as_str()}).to_string());
        if let Err(e) = send(&mut ws, Message::text(offer.as_str())).await {
            return Ended::Lost(format!("sending the offer failed: {e}"));
        }
        let welcome = match tokio::time::timeout(OPEN_TIMEOUT, welcome(&mut ws)).await {
            Err(_) => return Ended::Lost("no welcome within 20 s".into()),
            Ok(Err(ended)) => return ended,
            Ok(Ok(welcome)) => welcome,
        };
        let Some(cluster_id) = welcome["relay"]["clusterId"].as_str() else {
            let _ = tokio::time::timeout(SEND_TIMEOUT, ws.close(None)).await;
            return Ended::Lost("the welcome names no relay cluster: the host did not open a relay session".into());
        };
        let credential = &welcome["relay"]["credential"];
        tracing::info!(
            cluster_id,
            session_id = welcome["sessionId"].as_str().unwrap_or_default(),
            credential_generation = credential["generation"].as_u64().unwrap_or_default(),
            "relay session opened"
        );
        let limits = Limits::from_welcome(&welcome);
        let ctx =
            Arc::new(RelayContext::new(self.node_id.clone(), cluster_id.to_string(), self.registry.methods(), self.config_digest.clone()));
        let ended = self.serve(&mut ws, &ctx, &limits, registered).await;
        self.carrier.detach();
        self.config_digest = ctx.config_digest();
        ended
    }

    /// The registration body for `sequence`.
    fn registration(&self, sequence: u64) -> Value {
        let mut body = json!({"nodeId": self.node_id, "sequence": sequence, "version": env!("CARGO_PKG_VERSION")});
        if let Some(listen) = self.listen {
            body["listenAddress"] = json!(listen.ip().to_string());
            body["listenPort"] = json!(listen.port());
        }
        body
    }

    /// Register, then answer the host until the session ends.
    async fn serve(&self, ws: &mut Socket, ctx: &Arc<RelayContext>, limits: &Limits, registered: &mut bool) -> Ended {
        // the relay counts from 1 on each new socket; only an accepted registration consumes one
        let mut sequence: u64 = 1;
        let mut call_id: u64 = 0;
        let mut awaiting: Option<u64> = None;
        let mut register_at: Option<tokio::time::Instant> = Some(tokio::time::Instant::now());
        let mut register_failures: u32 = 0;
        let mut last_refusal: Option<String> = None;
        // the ingress's own calls: one at a time, after the relay's registration
        let mut ingress_call: Option<(u64, IngressStep)> = None;
        let mut ingress_at: Option<tokio::time::Instant> = None;
        let mut ingress_refusal: Option<String> = None;
        // the bearer file as the last registration read it: a change ends a wait after a refusal
        let mut ingress_seen: Option<FileState> = None;
        let (replies, mut outbox) = mpsc::channel::<String>(64);
        self.carrier.attach(replies.clone());
        // dropped with the session: a request still running is abandoned with it
        let mut requests = JoinSet::new();
        let mut last_heard = Instant::now();
        let mut pinged = false;
        let mut tick = tokio::time::interval(limits.ping_interval / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let register_due = async {
                match register_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let ingress_wanted = async {
                match &self.ingress {
                    Some(ingress) if ingress_call.is_none() && *registered => ingress.wanted.notified().await,
                    _ => std::future::pending().await,
                }
            };
            let ingress_due = async {
                let refused = ingress_refusal.as_deref().is_some_and(|code| code != "registered");
                match (ingress_at, &self.ingress) {
                    (Some(at), Some(ingress)) if refused => {
                        // a bearer handed over after a refusal is tried at once, not after retryAfterMs
                        while tokio::time::Instant::now() < at && file_state(ingress.bearer_file()) == ingress_seen {
                            tokio::time::sleep(at.saturating_duration_since(tokio::time::Instant::now()).min(Duration::from_millis(500)))
                                .await;
                        }
                    }
                    (Some(at), _) => tokio::time::sleep_until(at).await,
                    (None, _) => std::future::pending().await,
                }
            };
            tokio::select! {
                frame = ws.next() => {
                    let message = match frame {
                        None => return Ended::Lost("the host dropped the connection".into()),
                        Some(Err(e)) => return Ended::Lost(format!("reading from the socket failed: {e}")),
                        Some(Ok(message)) => message,
                    };
                    last_heard = Instant::now();
                    pinged = false;
                    let text = match message {
                        Message::Text(text) => text,
                        Message::Close(frame) => return ended_by_close(frame.as_ref()),
                        Message::Binary(_) => {
                            tracing::debug!("a binary frame from the host was ignored");
                            continue;
                        }
                        _ => continue,
                    };
                    let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) else {
                        tracing::warn!(bytes = text.len(), "a frame from the host is not JSON; ignored");
                        continue;
                    };
                    match frame["type"].as_str().unwrap_or_default() {
                        "push" => self.push(&frame, ctx),
                        "node-opened" | "node-refused" | "node" | "node-close" => self.carrier.host_said(&frame),
                        "request" => self.request(&frame, ctx, &replies, &mut requests, limits.max_frame_bytes),
                        "result" if awaiting.is_some() && frame["id"].as_u64() == awaiting => {
                            awaiting = None;
                            *registered = true;
                            register_failures = 0;
                            last_refusal = None;
                            let answer = &frame["result"];
                            tracing::info!(
                                sequence,
                                cluster_id = answer["clusterId"].as_str().unwrap_or_default(),
                                origin = answer["origin"].as_str().unwrap_or_default(),
                                registration_generation = answer["acceptedRegistration"]["generation"].as_u64().unwrap_or_default(),
                                "relay registered"
                            );
                            sequence += 1;
                            if self.ingress.is_some() {
                                ingress_at = Some(tokio::time::Instant::now());
                            }
                        }
                        "result" | "error" if ingress_call.is_some() && frame["id"].as_u64() == ingress_call.map(|(id, _)| id) => {
                            let (_, step) = ingress_call.take().unwrap_or((0, IngressStep::Register));
                            ingress_at = self.ingress_answer(step, &frame, ctx, &mut ingress_refusal);
                        }
                        "error" if awaiting.is_some() && frame["id"].as_u64() == awaiting => {
                            awaiting = None;
                            let error = &frame["error"];
                            let code = error["code"].as_str().unwrap_or("unknown");
                            let message = error["message"].as_str().unwrap_or_default();
                            if credential_refusal(code) {
                                return ended_by_refusal(code, message);
                            }
                            if code == "relay-sequence-stale" {
                                // not ours to lose track of, but say so and step past it
                                let last = error["data"]["lastSequence"].as_u64().unwrap_or(sequence);
                                tracing::warn!(sequence, last, "the host had a later registration sequence; registering above it");
                                sequence = last.saturating_add(1);
                                register_at = Some(tokio::time::Instant::now());
                                continue;
                            }
                            // A refusal of the registration names the host's data (the node, the
                            // cluster's relay), not this socket: it is sent again unchanged on the
                            // same socket once the backoff passes (the host allows that: a refused
                            // registration consumes no sequence). Reconnecting would only churn
                            // sessions, and the open socket still learns of a rotated-away bearer
                            // (the host closes it 4011).
                            register_failures = register_failures.saturating_add(1);
                            let delay = next_delay(self.retry_base, After::Failure(register_failures), rand::random::<f64>());
                            if last_refusal.as_deref() != Some(code) {
                                tracing::error!(code, "the host refused the relay's registration: {message}; trying again (every {} at most)", humantime::format_duration(crate::backoff::CAP));
                                last_refusal = Some(code.to_string());
                            }
                            register_at = Some(tokio::time::Instant::now() + delay);
                        }
                        "error" if frame["id"].is_null() => {
                            let code = frame["error"]["code"].as_str().unwrap_or("unknown");
                            let message = frame["error"]["message"].as_str().unwrap_or_default();
                            if closes_session(code) {
                                return ended_by_refusal(code, message);
                            }
                            tracing::warn!(code, "the host refused a frame of the relay: {message}");
                        }
                        other => tracing::debug!(frame_type = other, "a frame from the host was ignored"),
                    }
                }
                Some(reply) = outbox.recv() => {
                    if let Err(e) = send(ws, Message::text(reply)).await {
                        return Ended::Lost(format!("writing to the socket failed: {e}"));
                    }
                }
                Some(_) = requests.join_next(), if !requests.is_empty() => {}
                _ = ingress_wanted => {
                    ingress_refusal = None;
                    ingress_at = Some(tokio::time::Instant::now());
                }
                _ = ingress_due => {
                    ingress_at = None;
                    let Some(ingress) = &self.ingress else { continue };
                    let step = if ingress_call.is_none() && ingress_refusal.as_deref() == Some("registered") { IngressStep::Fetch } else { IngressStep::Register };
                    let body = match step {
                        IngressStep::Fetch => Ok(json!({"clusterId": ctx.cluster_id})),
                        IngressStep::Register => {
                            ingress_seen = file_state(ingress.bearer_file());
                            ingress.registration(ctx)
                        }
                    };
                    let body = match body {
                        Ok(body) => body,
                        Err(refusal) => {
                            tracing::error!(code = %refusal.code, "the ingress cannot register: {refusal}; trying again in 60 s, or once the bearer file changes");
                            ingress_refusal = Some(refusal.code.to_string());
                            ingress_at = Some(tokio::time::Instant::now() + Duration::from_secs(60));
                            continue;
                        }
                    };
                    call_id += 1;
                    ingress_call = Some((call_id, step));
                    let method = if step == IngressStep::Register { "ingress.register" } else { "ingress.getRouteTable" };
                    let call = Zeroizing::new(json!({"type": "call", "id": call_id, "method": method, "body": body}).to_string());
                    if let Err(e) = send(ws, Message::text(call.as_str())).await {
                        return Ended::Lost(format!("writing to the socket failed: {e}"));
                    }
                }
                _ = register_due => {
                    register_at = None;
                    call_id += 1;
                    awaiting = Some(call_id);
                    let call = json!({"type": "call", "id": call_id, "method": "relays.register", "body": self.registration(sequence)});
                    tracing::debug!(sequence, "registering");
                    if let Err(e) = send(ws, Message::text(call.to_string())).await {
                        return Ended::Lost(format!("writing to the socket failed: {e}"));
                    }
                }
                _ = tick.tick() => {
                    let silent = last_heard.elapsed();
                    if silent >= limits.silence_timeout {
                        let _ = tokio::time::timeout(SEND_TIMEOUT, ws.close(None)).await;
                        return Ended::Lost(format!("the host was silent for {}", humantime::format_duration(Duration::from_secs(silent.as_secs()))));
                    }
                    if silent >= limits.ping_interval && !pinged {
                        pinged = true;
                        if let Err(e) = send(ws, Message::Ping(Vec::new().into())).await {
                            return Ended::Lost(format!("writing to the socket failed: {e}"));
                        }
                    }
                }
            }
        }
    }

    /// The answer to the ingress's call: when to call again (`None`: not until the relay
    /// registers again). `state` holds the last refusal code, or `registered`.
    fn ingress_answer(
        &self,
        step: IngressStep,
        frame: &Value,
        ctx: &RelayContext,
        state: &mut Option<String>,
    ) -> Option<tokio::time::Instant> {
        let ingress = self.ingress.as_ref()?;
        let now = tokio::time::Instant::now();
        if frame["type"] == "error" {
            let error = &frame["error"];
            let code = error["code"].as_str().unwrap_or("unknown");
            let retry = error["data"]["retryAfterMs"].as_u64().unwrap_or(60_000).clamp(1_000, 300_000);
            if state.as_deref() != Some(code) {
                tracing::error!(
                    code,
                    retry_after_ms = retry,
                    "the ingress manager refused the ingress: {}",
                    error["message"].as_str().unwrap_or_default()
                );
            }
            *state = Some(code.to_string());
            return Some(now + Duration::from_millis(retry));
        }
        match step {
            IngressStep::Register => {
                let generation = frame["result"]["generation"].as_u64().unwrap_or_default();
                ingress.registered_under(generation);
                tracing::info!(generation, "the cluster ingress registered");
                *state = Some("registered".into());
                // the table issued so far, read once: later tables are pushed
                Some(now)
            }
            IngressStep::Fetch => {
                let table = &frame["result"]["table"];
                if !table.is_null() {
                    match serde_json::from_value::<crate::ingress::Table>(table.clone())
                        .map_err(|e| Refusal::new("route-table-invalid", e.to_string()))
                        .and_then(|t| ingress.apply(&ctx.cluster_id, t))
                    {
                        Ok(_) => {}
                        Err(r) if r.code == "route-table-stale" => {}
                        Err(r) => tracing::warn!(code = %r.code, "the route table read at registration was not applied: {r}"),
                    }
                }
                None
            }
        }
    }

    /// A push from the host: `relay.config` is kept; other topics are not the relay's.
    fn push(&self, frame: &Value, ctx: &RelayContext) {
        let topic = frame["topic"].as_str().unwrap_or_default();
        if topic != "relay.config" {
            tracing::debug!(topic, "a push the relay does not follow was ignored");
            return;
        }
        let body = &frame["body"];
        let digest = body["digest"].as_str().filter(|d| !d.is_empty() && d.len() <= 128 && d.bytes().all(|b| b.is_ascii_graphic()));
        let (Some(digest), Some(_)) = (digest, body["config"].as_object()) else {
            tracing::warn!(code = "relay-config-invalid", "a relay.config push without a digest or a config was ignored");
            return;
        };
        if let Some(cluster) = body["clusterId"].as_str()
            && cluster != ctx.cluster_id
        {
            tracing::warn!(code = "relay-config-foreign", cluster_id = cluster, "a relay.config push for another cluster was ignored");
            return;
        }
        if ctx.config_digest().as_deref() == Some(digest) {
            tracing::debug!(digest, "relay configuration unchanged; skipped");
            return;
        }
        let kept = RelayConfig { digest: digest.to_string(), config: body["config"].clone(), received_at: capstan_core::clock::now_ms() };
        match self.state.write_relay_config(&kept) {
            Ok(()) => {
                ctx.set_config_digest(kept.digest);
                tracing::info!(digest, path = %self.state.relay_config_path().display(), "relay configuration kept");
            }
            Err(refusal) => tracing::error!("keeping the relay configuration failed: {refusal}"),
        }
    }

    /// A request from the host: answered on a task of its own, abandoned at its deadline.
    fn request(
        &self,
        frame: &Value,
        ctx: &Arc<RelayContext>,
        replies: &mpsc::Sender<String>,
        requests: &mut JoinSet<()>,
        max_frame_bytes: usize,
    ) {
        let Some(answering) = self.registry.answer(ctx.clone(), frame, max_frame_bytes) else { return };
        let replies = replies.clone();
        requests.spawn(async move {
            if let Some(reply) = answering.await {
                let _ = replies.send(reply).await;
            }
        });
    }
}

/// Send one frame; a host that takes nothing for `SEND_TIMEOUT` is given up on.
async fn send(ws: &mut Socket, message: Message) -> Result<(), String> {
    match tokio::time::timeout(SEND_TIMEOUT, ws.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("the host took nothing for {} s", SEND_TIMEOUT.as_secs())),
    }
}

/// Wait for the welcome; an offer refusal (an error frame, then a close) ends the session.
async fn welcome(ws: &mut Socket) -> Result<Value, Ended> {
    loop {
        let message = match ws.next().await {
            None => return Err(Ended::Lost("the host dropped the connection before the welcome".into())),
            Some(Err(e)) => return Err(Ended::Lost(format!("reading from the socket failed: {e}"))),
            Some(Ok(message)) => message,
        };
        let text = match message {
            Message::Text(text) => text,
            Message::Close(frame) => return Err(ended_by_close(frame.as_ref())),
            _ => continue,
        };
        let Ok(frame) = serde_json::from_str::<Value>(text.as_str()) else {
            return Err(Ended::Lost("the host's first frame is not JSON".into()));
        };
        match frame["type"].as_str() {
            Some("welcome") if frame["protocol"].as_str().is_none_or(|p| p == PROTOCOL) => return Ok(frame),
            Some("welcome") => return Err(Ended::Lost("the host welcomed the relay to a protocol it does not speak".into())),
            Some("error") => {
                let code = frame["error"]["code"].as_str().unwrap_or("unknown");
                return Err(ended_by_refusal(code, frame["error"]["message"].as_str().unwrap_or_default()));
            }
            _ => return Err(Ended::Lost("the host's first frame is not a welcome".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{Answer, Handler};
    use crate::mock::{Peer, SocketMock, enrolled};
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;
    use tokio::sync::oneshot;

    #[test]
    fn a_nodes_upgrade_carries_its_token_hidden_and_its_id() {
        let request = upgrade("ws://127.0.0.1:8080/api/v1/socket", "Bearer tok", Some("node_1")).unwrap();
        let authorization = &request.headers()["authorization"];
        assert!(authorization.is_sensitive(), "never printed by a header dump");
        assert_eq!(authorization, "Bearer tok");
        assert_eq!(request.headers()[capstan_core::wire::NODE_HEADER], "node_1");
        let relay = upgrade("ws://127.0.0.1:8080/api/v1/socket", "Bearer r", None).unwrap();
        assert!(relay.headers().get(capstan_core::wire::NODE_HEADER).is_none());
        assert!(upgrade("not a url", "Bearer r", None).is_err());
        assert!(upgrade("ws://127.0.0.1:1/", "Bearer r", Some("bad\nid")).is_err());
    }

    /// Write `bearer` to a private authorization file.
    fn authorization(dir: &Path, bearer: &str) -> PathBuf {
        let path = dir.join("relay-authorization");
        std::fs::write(&path, bearer).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    fn options(state: StateDir, authorization_file: PathBuf, registry: Registry) -> Options {
        Options {
            state,
            authorization_file,
            listen: Some("10.0.0.5:8443".parse().unwrap()),
            registry,
            retry_base: Duration::from_millis(20),
            ingress: None,
            nodes_listen: None,
        }
    }

    /// Run the relay until `done` fires (or 20 s pass: a failure).
    async fn run_until(options: Options, done: oneshot::Receiver<()>) {
        let stop = async move {
            tokio::time::timeout(Duration::from_secs(20), done).await.expect("the mock host's script did not finish").unwrap();
            "test"
        };
        relay(options, stop).await.unwrap();
    }

    /// A handler that outlives any deadline.
    struct Slow;

    impl Handler for Slow {
        fn method(&self) -> &'static str {
            "test.slow"
        }

        fn handle<'a>(&'a self, _ctx: &'a RelayContext, _body: Value) -> Answer<'a> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(json!("late"))
            })
        }
    }

    fn request(id: &str, method: &str, deadline_ms: u64) -> Value {
        json!({"type": "request", "id": id, "method": method, "body": {}, "deadlineMs": deadline_ms})
    }

    fn config_push(digest: &str) -> Value {
        json!({"type": "push", "topic": "relay.config", "body": {"clusterId": "cls_1", "digest": digest,
            "config": {"cluster": {"id": "cls_1", "name": "edge", "revision": 3}, "nodes": [], "settings": {}}}})
    }

    /// Answer `request` frames until `count` replies are in; keyed by id.
    async fn replies(peer: &mut Peer, count: usize) -> std::collections::HashMap<String, Value> {
        let mut replies = std::collections::HashMap::new();
        while replies.len() < count {
            let frame = peer.recv().await.expect("the relay went away");
            assert_eq!(frame["type"], "reply", "{frame}");
            replies.insert(frame["id"].as_str().unwrap().to_string(), frame);
        }
        replies
    }

    #[tokio::test]
    async fn the_relay_offers_its_bearer_registers_keeps_the_config_and_answers_requests() {
        type Seen = Vec<(usize, &'static str, Value)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let (done, finished) = oneshot::channel();
        let done = Arc::new(Mutex::new(Some(done)));
        let root = tempfile::tempdir().unwrap();
        let config_file = Arc::new(Mutex::new(PathBuf::new()));
        let (log, file) = (seen.clone(), config_file.clone());
        let mock = SocketMock::start(move |mut peer, index| {
            let (log, done, file) = (log.clone(), done.clone(), file.clone());
            async move {
                log.lock().unwrap().push((index, "path", json!(peer.path)));
                let offer = peer.recv().await.unwrap();
                log.lock().unwrap().push((index, "offer", offer));
                peer.welcome("cls_1").await;
                let call = peer.recv().await.unwrap();
                log.lock().unwrap().push((index, "call", call.clone()));
                peer.result(&call, json!({"clusterId": "cls_1", "sequence": call["body"]["sequence"]})).await;
                if index > 0 {
                    // the second socket: registered again from 1; the test is over
                    if let Some(done) = done.lock().unwrap().take() {
                        let _ = done.send(());
                    }
                    peer.hold().await;
                    return;
                }
                let kept = || -> RelayConfig { serde_json::from_slice(&std::fs::read(&*file.lock().unwrap()).unwrap()).unwrap() };
                // a slow request first: the others are answered while it runs, and it never is
                peer.send(request("r0", "test.slow", 100)).await;
                peer.send(config_push("d1")).await;
                peer.send(request("r1", "agent.ping", 5000)).await;
                peer.send(request("r2", "agent.describe", 5000)).await;
                peer.send(json!({"type": "request", "id": "r3", "method": "agent.nope", "deadlineMs": 5000})).await;
                let answered = replies(&mut peer, 3).await;
                let first = kept();
                // the same digest again: skipped, the file untouched
                tokio::time::sleep(Duration::from_millis(5)).await;
                peer.send(config_push("d1")).await;
                peer.send(request("r4", "agent.describe", 5000)).await;
                let again = replies(&mut peer, 1).await;
                assert_eq!(kept(), first, "a push of the kept digest is skipped");
                peer.send(config_push("d2")).await;
                peer.send(request("r5", "agent.describe", 5000)).await;
                let changed = replies(&mut peer, 1).await;
                assert_eq!(kept().digest, "d2");
                // the slow request's deadline has passed long ago: nothing more comes for it
                tokio::time::sleep(Duration::from_millis(150)).await;
                for (id, reply) in answered.into_iter().chain(again).chain(changed) {
                    log.lock().unwrap().push((index, "reply", json!({"id": id, "reply": reply})));
                }
                peer.close(1001, "going-away").await;
            }
        })
        .await;
        let (_root_state, state, _credential) = enrolled(&mock.origin);
        *config_file.lock().unwrap() = state.relay_config_path();
        let file = authorization(root.path(), "  relay-bearer-gen2\n");
        let mut registry = Registry::with_builtins();
        registry.add(Arc::new(Slow)).unwrap();
        run_until(options(state.clone(), file, registry), finished).await;

        let seen = seen.lock().unwrap().clone();
        let of = |index: usize, what: &str| -> Vec<Value> {
            seen.iter().filter(|(i, w, _)| *i == index && *w == what).map(|(_, _, v)| v.clone()).collect()
        };
        for index in [0, 1] {
            assert_eq!(of(index, "path"), [json!("/api/v1/socket")]);
            assert_eq!(
                of(index, "offer"),
                [json!({"type": "offer", "kind": "relay", "protocols": ["capstan-socket/1"], "token": "relay-bearer-gen2"})],
                "the bearer from the file, trimmed"
            );
            let call = &of(index, "call")[0];
            assert_eq!(call["method"], "relays.register");
            assert_eq!(
                call["body"],
                json!({"nodeId": "node_1", "sequence": 1, "version": env!("CARGO_PKG_VERSION"), "listenAddress": "10.0.0.5", "listenPort": 8443}),
                "each socket counts from 1"
            );
        }
        let replies: std::collections::HashMap<String, Value> =
            of(0, "reply").into_iter().map(|v| (v["id"].as_str().unwrap().to_string(), v["reply"].clone())).collect();
        assert!(!replies.contains_key("r0"), "an abandoned request is never answered");
        let pong = &replies["r1"]["result"];
        assert_eq!((&pong["pong"], &pong["nodeId"]), (&json!(true), &json!("node_1")));
        assert!(pong["at"].as_u64().unwrap() > 1_700_000_000_000);
        let methods = json!(["agent.describe", "agent.ping", "test.slow"]);
        assert_eq!(
            replies["r2"]["result"],
            json!({"nodeId": "node_1", "clusterId": "cls_1", "version": env!("CARGO_PKG_VERSION"), "methods": methods, "configDigest": "d1"})
        );
        assert_eq!(replies["r3"]["error"]["code"], "agent-method-unknown");
        assert_eq!(replies["r3"]["error"]["data"]["methods"], methods);
        assert_eq!(replies["r4"]["result"]["configDigest"], "d1");
        assert_eq!(replies["r5"]["result"]["configDigest"], "d2");

        let path = state.relay_config_path();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let kept = state.read_relay_config().unwrap().unwrap();
        assert_eq!(kept.digest, "d2");
        assert_eq!(kept.config["cluster"]["name"], "edge");
        // sorted: whether serde_json keeps insertion order depends on the features the build unifies
        let mut members: Vec<String> =
            serde_json::from_slice::<Value>(&std::fs::read(&path).unwrap()).unwrap().as_object().unwrap().keys().cloned().collect();
        members.sort();
        assert_eq!(members, ["config", "digest", "receivedAt"]);
    }

    #[tokio::test]
    async fn a_stale_bearer_is_retried_and_the_rotated_file_is_read_again() {
        let root = tempfile::tempdir().unwrap();
        let file = authorization(root.path(), "bearer-gen1");
        let offers: Arc<Mutex<Vec<(usize, Value)>>> = Arc::default();
        let (done, finished) = oneshot::channel();
        let done = Arc::new(Mutex::new(Some(done)));
        let (log, rotated) = (offers.clone(), file.clone());
        let mock = SocketMock::start(move |mut peer, index| {
            let (log, done, rotated) = (log.clone(), done.clone(), rotated.clone());
            async move {
                let offer = peer.recv().await.unwrap();
                log.lock().unwrap().push((index, offer.clone()));
                if offer["token"] == "bearer-gen1" {
                    // the operator hands over the next generation while the relay is refused
                    std::fs::write(&rotated, "bearer-gen2\n").unwrap();
                    peer.send(json!({"type": "error", "id": null, "error": {"code": "relay-credential-generation-stale",
                        "message": "an earlier generation", "retryable": false, "data": {"currentGeneration": 2}}}))
                        .await;
                    peer.close(4011, "relay-credential-generation-stale").await;
                    return;
                }
                peer.welcome("cls_1").await;
                let call = peer.recv().await.unwrap();
                peer.result(&call, json!({"clusterId": "cls_1", "sequence": 1})).await;
                if let Some(done) = done.lock().unwrap().take() {
                    let _ = done.send(());
                }
                peer.hold().await;
            }
        })
        .await;
        let (_root_state, state, _credential) = enrolled(&mock.origin);
        run_until(options(state, file, Registry::with_builtins()), finished).await;
        let offers = offers.lock().unwrap().clone();
        let tokens: Vec<(usize, Value)> = offers.iter().map(|(i, o)| (*i, o["token"].clone())).collect();
        assert_eq!(tokens, [(0, json!("bearer-gen1")), (1, json!("bearer-gen2"))]);
    }

    #[tokio::test]
    async fn a_refused_registration_is_sent_again_unchanged_on_the_same_socket() {
        let calls: Arc<Mutex<Vec<(usize, Value)>>> = Arc::default();
        let (done, finished) = oneshot::channel();
        let done = Arc::new(Mutex::new(Some(done)));
        let log = calls.clone();
        let mock = SocketMock::start(move |mut peer, index| {
            let (log, done) = (log.clone(), done.clone());
            async move {
                peer.recv().await.unwrap();
                peer.welcome("cls_1").await;
                let first = peer.recv().await.unwrap();
                log.lock().unwrap().push((index, first.clone()));
                peer.send(json!({"type": "error", "id": first["id"], "requestId": "req_1", "error": {"code": "relay-cluster-not-enabled",
                    "message": "no administrator enabled this cluster's relay", "retryable": false}}))
                    .await;
                let second = peer.recv().await.unwrap();
                log.lock().unwrap().push((index, second.clone()));
                peer.result(&second, json!({"clusterId": "cls_1", "sequence": 1})).await;
                if let Some(done) = done.lock().unwrap().take() {
                    let _ = done.send(());
                }
                peer.hold().await;
            }
        })
        .await;
        let root = tempfile::tempdir().unwrap();
        let (_root_state, state, _credential) = enrolled(&mock.origin);
        let mut options = options(state, authorization(root.path(), "b"), Registry::with_builtins());
        options.listen = None;
        run_until(options, finished).await;
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 2);
        assert!(calls.iter().all(|(index, _)| *index == 0), "the same socket");
        assert_ne!(calls[0].1["id"], calls[1].1["id"]);
        assert_eq!(calls[0].1["body"], calls[1].1["body"]);
        assert_eq!(calls[0].1["body"], json!({"nodeId": "node_1", "sequence": 1, "version": env!("CARGO_PKG_VERSION")}));
    }

    #[tokio::test]
    async fn the_authorization_file_must_be_private_and_hold_a_bearer() {
        let root = tempfile::tempdir().unwrap();
        let (_root_state, state, _credential) = enrolled("http://127.0.0.1:9");
        let file = authorization(root.path(), "zzsecretzz");
        let bearer = read_authorization(&file).unwrap();
        assert!(!format!("{bearer:?}").contains("zzsecretzz"));

        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let refused = relay(options(state.clone(), file.clone(), Registry::with_builtins()), std::future::pending()).await.unwrap_err();
        assert_eq!(refused.code, "authorization-file-permissions");
        assert!(!refused.to_string().contains("zzsecretzz"));

        let missing = root.path().join("absent");
        assert_eq!(read_authorization(&missing).unwrap_err().code, "authorization-file-missing");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_authorization(&link).unwrap_err().code, "authorization-file-symlink");
        assert_eq!(read_authorization(root.path()).unwrap_err().code, "authorization-file-not-regular");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&file, " \n").unwrap();
        assert_eq!(read_authorization(&file).unwrap_err().code, "authorization-file-empty");
        std::fs::write(&file, "zzsecret zz").unwrap();
        let invalid = read_authorization(&file).unwrap_err();
        assert_eq!(invalid.code, "authorization-file-invalid");
        assert!(!invalid.to_string().contains("zzsecret"));
    }

    #[test]
    fn the_socket_address_follows_the_origin() {
        assert_eq!(socket_url("https://capstan.example.com:8443").unwrap(), "wss://capstan.example.com:8443/api/v1/socket");
        assert_eq!(socket_url("http://127.0.0.1:8080/").unwrap(), "ws://127.0.0.1:8080/api/v1/socket");
        assert_eq!(socket_url("ftp://x").unwrap_err().code, "origin-invalid");
    }

    #[test]
    fn close_codes_say_what_to_do_next() {
        let close = |code: u16| ended_by_close(Some(&CloseFrame { code: code.into(), reason: "x".into() }));
        assert_eq!(close(1001), Ended::GoingAway);
        assert!(matches!(close(4011), Ended::CredentialRefused { code, .. } if code == "relay-credential-generation-stale"));
        assert!(matches!(close(4003), Ended::CredentialRefused { code, .. } if code == "unauthenticated"));
        assert!(matches!(close(4009), Ended::Lost(_)));
        let big = crate::handler::reply_frame(&json!("r"), Ok(json!("x".repeat(200))), 100);
        assert_eq!(serde_json::from_str::<Value>(&big).unwrap()["error"]["code"], "agent-reply-too-large");
    }
}
