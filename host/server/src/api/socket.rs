//! `GET /api/v1/socket`: the same typed methods as `POST /api/v1/<method>`, over one WebSocket,
//! plus pushes from the host (docs/socket.md is the protocol).
//!
//! A session starts with the client's offer (its kind and the protocols it speaks); the host
//! answers `welcome` with the protocol it chose, or refuses by name and closes. Each `call`
//! frame goes through the registry's one door ([`capstan_rpc::Registry::invoke`]), as HTTP's do, so a method is
//! resolved, authenticated, decoded, forwarded to the coordinator and logged the same way, and
//! its refusal is the same error object. The host pushes to sessions through the [`Hub`].
//!
//! Bounds: a frame is at most [`Limits::max_frame_bytes`] (`frame-too-large`, closed); a
//! session runs at most [`MAX_IN_FLIGHT`] calls at once (`too-many-requests-in-flight`); what
//! the host sends a session waits in a queue of [`OUTBOUND_QUEUE`] frames, and a peer that
//! lets it fill is dropped (`slow-reader`), never buffered for; a peer silent for
//! [`SILENCE_TIMEOUT`] while pinged every [`PING_INTERVAL`] is closed (`ping-timeout`).

use super::{ApiError, AppState, bearer_token, log_refusal};
use crate::auth::Identity;
use crate::refusal::Refusal;
use axum::body::Bytes;
use axum::extract::ConnectInfo;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::http::{Extensions, HeaderMap};
use axum::response::{IntoResponse, Response};
use capstan_rpc::{Body, Caller, Invocation, Invoked};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

/// The protocol this host speaks, named in the offer and the welcome.
pub const PROTOCOL: &str = "capstan-socket/1";
/// Every protocol this host speaks, most preferred first.
pub const PROTOCOLS: &[&str] = &[PROTOCOL];

/// Room in a frame for what surrounds a method's body (`type`, `id`, `method`): any body that
/// `POST /api/v1/<method>` accepts (`CAPSTAN_MAX_BODY_BYTES`) fits in a `call` frame.
pub const FRAME_ENVELOPE_BYTES: usize = 16 * 1024;
/// Frames waiting for a session's writer. A peer that reads keeps this near empty; one that
/// stops reading fills the kernel's buffers, then this, and is dropped. With the frame limit it
/// bounds what one session can make the host hold.
pub const OUTBOUND_QUEUE: usize = 64;
/// Calls one session may have running at once: a dashboard's parallel reads fit; a client that
/// wants more opens another session (each is bounded on its own).
pub const MAX_IN_FLIGHT: usize = 16;
/// How often the host pings an open session (well inside the idle timeouts of common proxies).
pub const PING_INTERVAL: Duration = Duration::from_secs(20);
/// How long a peer may send nothing at all (no frame, no pong) before it is closed: three
/// pings unanswered, so one lost pong or a busy moment is not taken for a dead peer.
pub const SILENCE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a client has after the upgrade to send its offer.
pub const OFFER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the host tries to deliver its closing frame to a peer it closes (a peer that reads
/// nothing never takes it).
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Sessions open at once on this host. An upgraded connection no longer holds one of the
/// listener's connection slots (`CAPSTAN_MAX_CONNECTIONS`, 1024 by default), so the sessions
/// have their own bound, of the same size; one over it is refused `too-many-sessions`.
pub const MAX_SESSIONS: usize = 1024;
/// The longest call id accepted, in characters (a client's counter or a UUID fits easily).
pub const MAX_CALL_ID_CHARS: usize = 128;

/// The close codes the host ends a session with (the reason text is the code's name).
pub mod close {
    /// The peer closed, or went away.
    pub const NORMAL: u16 = 1000;
    /// `going-away`: this host is stopping (reconnect, to it or another fleet node).
    pub const GOING_AWAY: u16 = 1001;
    /// A frame that is not UTF-8 text where text was due.
    pub const INVALID: u16 = 1007;
    /// `frame-too-large`: a frame or message over the limit.
    pub const FRAME_TOO_LARGE: u16 = 1009;
    /// `offer-invalid` / `offer-expected`: the first frame is not a readable offer.
    pub const OFFER_INVALID: u16 = 4000;
    /// `protocol-unsupported`: no protocol of the offer is spoken here.
    pub const PROTOCOL_UNSUPPORTED: u16 = 4001;
    /// `session-kind-unknown`: the offer's kind is none of dashboard, cli, relay, agent.
    pub const SESSION_KIND_UNKNOWN: u16 = 4002;
    /// `unauthenticated`: the token does not authenticate, or a relay or agent offered none.
    pub const UNAUTHENTICATED: u16 = 4003;
    /// `offer-timeout`: no offer within [`super::OFFER_TIMEOUT`].
    pub const OFFER_TIMEOUT: u16 = 4004;
    /// `slow-reader`: the session's outbound queue filled.
    pub const SLOW_READER: u16 = 4008;
    /// `ping-timeout`: the peer was silent for the silence timeout.
    pub const PING_TIMEOUT: u16 = 4009;
    /// `session-expired`: the token the session opened with expired.
    pub const SESSION_EXPIRED: u16 = 4010;
    /// `relay-credential-generation-stale`: a relay's bearer was rotated away.
    pub const RELAY_CREDENTIAL_STALE: u16 = capstan_relays::CLOSE_CREDENTIAL_STALE;
}

/// What a session says it is (the offer's `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The operator's web UI.
    Dashboard,
    /// The `capstan` command line.
    Cli,
    /// A cluster's relay (needs a token).
    Relay,
    /// A node's agent (needs a token).
    Agent,
}

impl Kind {
    const ALL: [(&'static str, Kind); 4] =
        [("dashboard", Kind::Dashboard), ("cli", Kind::Cli), ("relay", Kind::Relay), ("agent", Kind::Agent)];

    fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.iter().find(|(n, _)| *n == name).map(|(_, k)| *k)
    }

    /// Relays and agents are machines the host pushes to by identity: they must authenticate.
    fn needs_identity(self) -> bool {
        matches!(self, Kind::Relay | Kind::Agent)
    }
}

/// The bounds of every session of a host (the constants above; tests shorten the timings).
#[derive(Debug, Clone)]
pub struct Limits {
    /// The largest frame (and message) a client may send.
    pub max_frame_bytes: usize,
    /// See [`OUTBOUND_QUEUE`].
    pub outbound_queue: usize,
    /// See [`MAX_IN_FLIGHT`].
    pub max_in_flight: usize,
    /// See [`PING_INTERVAL`].
    pub ping_interval: Duration,
    /// See [`SILENCE_TIMEOUT`].
    pub silence_timeout: Duration,
    /// See [`OFFER_TIMEOUT`].
    pub offer_timeout: Duration,
    /// See [`MAX_SESSIONS`].
    pub max_sessions: usize,
}

impl Limits {
    /// The limits for a host whose request bodies are at most `max_body_bytes`.
    pub fn for_bodies(max_body_bytes: usize) -> Limits {
        Limits {
            max_frame_bytes: max_body_bytes + FRAME_ENVELOPE_BYTES,
            outbound_queue: OUTBOUND_QUEUE,
            max_in_flight: MAX_IN_FLIGHT,
            ping_interval: PING_INTERVAL,
            silence_timeout: SILENCE_TIMEOUT,
            offer_timeout: OFFER_TIMEOUT,
            max_sessions: MAX_SESSIONS,
        }
    }
}

/// Why a session ended: the close code and its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The close code sent.
    pub code: u16,
    /// The refusal's name (the close frame's reason).
    pub reason: &'static str,
}

/// One open session as the hub keeps it.
struct Handle {
    kind: Kind,
    user_id: Option<String>,
    /// Opened by a person who is an administrator.
    admin: bool,
    outbound: mpsc::Sender<String>,
    ended: watch::Sender<Option<Ended>>,
}

impl Handle {
    /// End the session (the first reason wins).
    fn end(&self, code: u16, reason: &'static str) {
        self.ended.send_if_modified(|ended| {
            if ended.is_some() {
                return false;
            }
            *ended = Some(Ended { code, reason });
            true
        });
    }

    /// Queue a frame; a full queue drops the session (`slow-reader`). False when not queued.
    fn send(&self, frame: String) -> bool {
        match self.outbound.try_send(frame) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!("socket session dropped: its outbound queue is full (a slow reader)");
                self.end(close::SLOW_READER, "slow-reader");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

/// Which sessions a push goes to.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    /// Every open session.
    Everyone,
    /// Every session of this kind.
    Kind(Kind),
    /// Every session of a person who is an administrator (what only they may read).
    Admins,
    /// Every session that authenticated as this user (or machine user) id.
    User(&'a str),
    /// The session with this id.
    Session(&'a str),
}

/// What a push reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delivery {
    /// Sessions the push was queued for.
    pub queued: usize,
    /// Sessions dropped because their outbound queue was full.
    pub dropped: usize,
}

/// Relays ride on this host's sessions.
impl crate::relays::Sessions for Hub {
    fn send(&self, id: &str, frame: String) -> bool {
        Hub::send(self, id, frame)
    }
    fn end(&self, id: &str, code: u16, reason: &'static str) {
        Hub::end(self, id, code, reason)
    }
    fn push_to_admins(&self, topic: &str, body: &Value) {
        self.push(Target::Admins, topic, body);
    }
    fn max_frame_bytes(&self) -> usize {
        self.limits.max_frame_bytes
    }
}

/// The open sessions of this host, and how host code pushes to them.
pub struct Hub {
    limits: Limits,
    sessions: Mutex<HashMap<String, Arc<Handle>>>,
    /// Woken whenever a session leaves (what [`Hub::close_all`] waits on).
    emptied: tokio::sync::Notify,
    /// One permit per session, upgraded or being upgraded.
    slots: Arc<Semaphore>,
}

impl Hub {
    /// A hub with no session yet.
    pub fn new(limits: Limits) -> Hub {
        let slots = Arc::new(Semaphore::new(limits.max_sessions));
        Hub { limits, sessions: Mutex::default(), emptied: tokio::sync::Notify::new(), slots }
    }

    /// The limits every session of this hub runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Push `{type:"push", topic, body}` to the sessions `target` names. A session whose
    /// outbound queue is full is dropped (`slow-reader`) rather than waited for.
    pub fn push(&self, target: Target<'_>, topic: &str, body: &Value) -> Delivery {
        let frame = json!({ "type": "push", "topic": topic, "body": body }).to_string();
        let chosen: Vec<Arc<Handle>> = {
            let sessions = self.sessions.lock().expect("the session table is never poisoned");
            sessions
                .iter()
                .filter(|(id, h)| match target {
                    Target::Everyone => true,
                    Target::Kind(kind) => h.kind == kind,
                    Target::Admins => h.admin,
                    Target::User(user) => h.user_id.as_deref() == Some(user),
                    Target::Session(session) => id.as_str() == session,
                })
                .map(|(_, h)| h.clone())
                .collect()
        };
        let mut delivery = Delivery::default();
        for handle in chosen {
            if handle.ended.borrow().is_some() {
                continue;
            }
            if handle.send(frame.clone()) {
                delivery.queued += 1;
            } else if handle.ended.borrow().is_some_and(|e| e.code == close::SLOW_READER) {
                delivery.dropped += 1;
            }
        }
        delivery
    }

    /// End every open session with `going-away` (the host is stopping) and wait, at most
    /// [`CLOSE_GRACE`], until each has sent its close frame; calls still running finish
    /// unanswered.
    pub async fn close_all(&self) {
        let open: Vec<Arc<Handle>> = self.sessions.lock().expect("the session table is never poisoned").values().cloned().collect();
        for handle in open {
            handle.end(close::GOING_AWAY, "going-away");
        }
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            loop {
                let emptied = self.emptied.notified();
                if self.is_empty() {
                    break;
                }
                emptied.await;
            }
        })
        .await;
    }

    /// Queue `frame` for the session `id`; false when it is not open (or was just dropped as a
    /// slow reader).
    pub fn send(&self, id: &str, frame: String) -> bool {
        let handle = self.sessions.lock().expect("the session table is never poisoned").get(id).cloned();
        handle.is_some_and(|h| h.ended.borrow().is_none() && h.send(frame))
    }

    /// End the session `id` with `code` (its close frame's reason is `reason`).
    pub fn end(&self, id: &str, code: u16, reason: &'static str) {
        if let Some(handle) = self.sessions.lock().expect("the session table is never poisoned").get(id) {
            handle.end(code, reason);
        }
    }

    /// Whether the session `id` is open (or still sending its close frame).
    pub fn is_open(&self, id: &str) -> bool {
        self.sessions.lock().expect("the session table is never poisoned").contains_key(id)
    }

    /// How many sessions are open of each kind (`/metrics`).
    pub fn open_by_kind(&self) -> Vec<(&'static str, usize)> {
        let sessions = self.sessions.lock().expect("the session table is never poisoned");
        Kind::ALL.iter().map(|(name, kind)| (*name, sessions.values().filter(|h| h.kind == *kind).count())).collect()
    }

    /// How many sessions are open.
    pub fn len(&self) -> usize {
        self.sessions.lock().expect("the session table is never poisoned").len()
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert(&self, id: &str, handle: Arc<Handle>) {
        self.sessions.lock().expect("the session table is never poisoned").insert(id.to_string(), handle);
    }

    fn remove(&self, id: &str) {
        self.sessions.lock().expect("the session table is never poisoned").remove(id);
        self.emptied.notify_waiters();
    }
}

/// `GET /api/v1/socket`: upgrade to a WebSocket session; anything else is refused
/// `upgrade-required`.
pub async fn upgrade(
    State(state): State<AppState>,
    headers: HeaderMap,
    extensions: Extensions,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let Ok(ws) = ws else {
        return ApiError(Refusal::new(
            "upgrade-required",
            "GET /api/v1/socket opens a WebSocket: send the WebSocket upgrade handshake (docs/socket.md)",
        ))
        .into_response();
    };
    let Ok(slot) = state.sockets.slots.clone().try_acquire_owned() else {
        let max = state.sockets.limits.max_sessions;
        tracing::warn!(max, "a socket session was refused: every session slot is in use");
        let refusal = Refusal::new("too-many-sessions", format!("this host holds at most {max} socket sessions; try again later"))
            .with_data(json!({ "limit": max }))
            .retryable();
        return ApiError(refusal).into_response();
    };
    let source = extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let bearer = bearer_token(&headers).map(str::to_string);
    let max = state.sockets.limits.max_frame_bytes;
    ws.max_frame_size(max).max_message_size(max).on_upgrade(move |socket| async move {
        run(state, socket, bearer, source).await;
        drop(slot);
    })
}

type Sink = SplitSink<WebSocket, Message>;
type Stream = SplitStream<WebSocket>;

/// A session-level error frame (no call id) as JSON text.
fn session_error(refusal: &Refusal) -> String {
    json!({ "type": "error", "id": null, "error": refusal }).to_string()
}

/// Send a refusal and a close frame directly (before the writer runs), within the grace.
async fn refuse(sink: &mut Sink, code: u16, refusal: Refusal) {
    log_refusal(&refusal);
    let reason = Utf8Bytes::from(refusal.code.to_string());
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        sink.send(Message::text(session_error(&refusal))).await?;
        sink.send(Message::Close(Some(CloseFrame { code, reason }))).await
    })
    .await;
}

/// An accepted offer.
struct Accepted {
    protocol: &'static str,
    kind: Kind,
    token: Option<String>,
    identity: Option<Identity>,
    /// A relay session: the cluster and credential its bearer verified as.
    relay: Option<crate::relays::credentials::Verified>,
}

/// Judge the first frame: a readable offer first, then its protocols (before anything about the
/// caller is looked at), its kind, and last the token.
async fn judge_offer(state: &AppState, first: Message, header_bearer: Option<String>) -> Result<Accepted, (u16, Refusal)> {
    let invalid = |message: String| (close::OFFER_INVALID, Refusal::new("offer-invalid", message));
    let Message::Text(text) = first else {
        return Err(invalid("the first frame is a JSON text offer: {\"type\":\"offer\",…}".into()));
    };
    let Ok(Value::Object(offer)) = serde_json::from_str::<Value>(text.as_str()) else {
        return Err(invalid("the first frame is a JSON object: the offer".into()));
    };
    if offer.get("type").and_then(Value::as_str) != Some("offer") {
        return Err(invalid("a session starts with an offer: {\"type\":\"offer\",\"kind\",\"protocols\"}".into()));
    }
    if let Some(unknown) = offer.keys().find(|k| !["type", "kind", "protocols", "token"].contains(&k.as_str())) {
        let shown = capstan_core::text::truncate(unknown, 100);
        return Err(invalid(format!("unknown field {shown:?} in the offer")));
    }
    let Some(offered) = offer.get("protocols").and_then(Value::as_array) else {
        return Err(invalid("the offer names the protocols it speaks: \"protocols\": [\"capstan-socket/1\"]".into()));
    };
    let offered: Vec<&str> = offered.iter().filter_map(Value::as_str).collect();
    let Some(protocol) = PROTOCOLS.iter().find(|p| offered.contains(p)) else {
        let shown: Vec<String> = offered.iter().take(8).map(|p| capstan_core::text::truncate(p, 64)).collect();
        return Err((
            close::PROTOCOL_UNSUPPORTED,
            Refusal::new("protocol-unsupported", format!("this host speaks {}", PROTOCOLS.join(", ")))
                .with_data(json!({ "spoken": PROTOCOLS, "offered": shown })),
        ));
    };
    let kind_name = offer.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some(kind) = Kind::parse(kind_name) else {
        let kinds: Vec<&str> = Kind::ALL.iter().map(|(n, _)| *n).collect();
        return Err((
            close::SESSION_KIND_UNKNOWN,
            Refusal::new("session-kind-unknown", format!("a session is one of {}", kinds.join(", "))).with_data(json!({ "kinds": kinds })),
        ));
    };
    let token = match offer.get("token") {
        None | Some(Value::Null) => header_bearer,
        Some(Value::String(token)) if !token.is_empty() => Some(token.clone()),
        Some(_) => return Err(invalid("the offer's token is a string: the bearer JWT".into())),
    };
    if kind == Kind::Relay {
        // a relay's token is its cluster's relay bearer, not a JWT (docs/relays.md)
        let Some(bearer) = token else {
            return Err((
                close::UNAUTHENTICATED,
                Refusal::new("unauthenticated", "a relay session needs its relay bearer as the offer's token"),
            ));
        };
        return match crate::relays::identify(&state.store, bearer.as_bytes()).await {
            Ok((verified, identity)) => {
                Ok(Accepted { protocol, kind, token: Some(bearer), identity: Some(identity), relay: Some(verified) })
            }
            Err(refusal) if refusal.is("relay-credential-generation-stale") => Err((close::RELAY_CREDENTIAL_STALE, refusal)),
            Err(refusal) => Err((close::UNAUTHENTICATED, refusal)),
        };
    }
    let identity = match &token {
        Some(token) => match state.auth.authenticate(token).await {
            Ok(identity) => Some(identity),
            Err(refusal) => return Err((close::UNAUTHENTICATED, refusal)),
        },
        None if kind.needs_identity() => {
            return Err((
                close::UNAUTHENTICATED,
                Refusal::new("unauthenticated", format!("a {kind_name} session needs a token: the offer's token or Authorization: Bearer")),
            ));
        }
        None => None,
    };
    Ok(Accepted { protocol, kind, token, identity, relay: None })
}

async fn run(state: AppState, socket: WebSocket, header_bearer: Option<String>, source: Option<IpAddr>) {
    let session_id = capstan_core::ids::new_id("socket");
    let span = tracing::info_span!("socket", session = %session_id);
    session(state, socket, header_bearer, source, session_id).instrument(span).await
}

async fn session(state: AppState, socket: WebSocket, header_bearer: Option<String>, source: Option<IpAddr>, session_id: String) {
    let hub = state.sockets.clone();
    let limits = hub.limits.clone();
    let (mut sink, mut stream) = socket.split();
    let first = match tokio::time::timeout(limits.offer_timeout, stream.next()).await {
        Err(_) => {
            let refusal = Refusal::new("offer-timeout", format!("no offer within {} ms of the upgrade", limits.offer_timeout.as_millis()));
            return refuse(&mut sink, close::OFFER_TIMEOUT, refusal).await;
        }
        Ok(None) => return,
        Ok(Some(Err(e))) => {
            if let Some((code, refusal)) = read_refusal(e, &limits) {
                refuse(&mut sink, code, refusal).await;
            }
            return;
        }
        Ok(Some(Ok(first))) => first,
    };
    let accepted = match judge_offer(&state, first, header_bearer).await {
        Ok(accepted) => accepted,
        Err((code, refusal)) => return refuse(&mut sink, code, refusal).await,
    };
    let Accepted { protocol, kind, token, identity, relay } = accepted;
    let mut welcome = json!({
        "type": "welcome",
        "protocol": protocol,
        "sessionId": session_id,
        "kind": kind,
        "identity": identity.as_ref().map(|i| json!({ "userId": i.user_id, "username": i.username, "kind": i.kind, "admin": i.admin })),
        "limits": {
            "maxFrameBytes": limits.max_frame_bytes,
            "maxInFlight": limits.max_in_flight,
            "outboundQueue": limits.outbound_queue,
            "pingIntervalMs": limits.ping_interval.as_millis() as u64,
            "silenceTimeoutMs": limits.silence_timeout.as_millis() as u64,
        },
    });
    if let Some(relay) = &relay {
        welcome["relay"] = json!({ "clusterId": relay.cluster_id, "credential": relay.credential });
    }
    if sink.send(Message::text(welcome.to_string())).await.is_err() {
        return;
    }
    tracing::info!(kind = ?kind, user = identity.as_ref().map(|i| i.username.as_str()).unwrap_or("-"), "socket session opened");
    let (outbound, queue) = mpsc::channel(limits.outbound_queue);
    let (ended, watching) = watch::channel(None);
    let (user_id, admin) = (identity.as_ref().map(|i| i.user_id.clone()), identity.as_ref().is_some_and(|i| i.is_human_admin()));
    let handle = Arc::new(Handle { kind, user_id, admin, outbound, ended });
    hub.insert(&session_id, handle.clone());
    if let (Some(relay), Some(bearer)) = (&relay, &token) {
        state.relays.opened(&session_id, &relay.cluster_id, bearer.as_bytes());
    }
    let writer = tokio::spawn(write(sink, queue, watching.clone(), limits.ping_interval, handle.clone()).in_current_span());
    // the session ends with the token it opened with (a relay's bearer has no lifetime: it
    // holds until rotated, which every frame checks)
    let expiry = identity.as_ref().filter(|_| relay.is_none()).map(|i| {
        let left = i.expires_at.saturating_sub(capstan_core::clock::now_secs());
        Instant::now() + Duration::from_secs(left)
    });
    let session = Session {
        state: state.clone(),
        handle: handle.clone(),
        // a relay's calls run as the identity its bearer verified (the bearer is no JWT)
        verified: relay.is_some().then(|| identity.clone()).flatten(),
        token: token.filter(|_| relay.is_none()).map(Arc::from),
        source,
        in_flight: Arc::new(Semaphore::new(limits.max_in_flight)),
        ids: Arc::default(),
        session_id: session_id.clone(),
    };
    read(&session, &mut stream, watching, &limits, expiry).await;
    handle.end(close::NORMAL, "closed");
    let _ = writer.await;
    // gone from the hub once its close frame is sent (or could not be)
    hub.remove(&session_id);
    state.relays.closed(&session_id).await;
    let ended = *handle.ended.borrow();
    if ended.is_some_and(|e| e.code != close::NORMAL) {
        // the host closed: wait (briefly) for the peer's close frame, as the closing handshake
        // has it, so the peer reads the close code rather than a reset connection
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            while let Some(Ok(message)) = stream.next().await {
                if matches!(message, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
    tracing::info!(code = ended.map(|e| e.code), reason = ended.map(|e| e.reason), "socket session closed");
}

/// What a read error means for the peer: a frame over the limit is `frame-too-large`, text
/// that is not UTF-8 `frame-malformed`; anything else (a reset) ends the session silently.
fn read_refusal(error: axum::Error, limits: &Limits) -> Option<(u16, Refusal)> {
    use tokio_tungstenite::tungstenite::Error as Ws;
    let inner = error.into_inner();
    match inner.downcast_ref::<Ws>() {
        Some(Ws::Capacity(_)) => Some((
            close::FRAME_TOO_LARGE,
            Refusal::new("frame-too-large", format!("frames are limited to {} bytes", limits.max_frame_bytes))
                .with_data(json!({ "limitBytes": limits.max_frame_bytes })),
        )),
        Some(Ws::Utf8(_)) => Some((close::INVALID, Refusal::new("frame-malformed", "a text frame that is not UTF-8"))),
        _ => None,
    }
}

async fn until_ended(watching: &mut watch::Receiver<Option<Ended>>) {
    let _ = watching.wait_for(Option::is_some).await;
}

/// The writer: the queue's frames and the pings, in order; when the session ends, its close
/// frame (within [`CLOSE_GRACE`]).
async fn write(
    mut sink: Sink,
    mut queue: mpsc::Receiver<String>,
    mut watching: watch::Receiver<Option<Ended>>,
    every: Duration,
    handle: Arc<Handle>,
) {
    let mut ping = tokio::time::interval_at(Instant::now() + every, every);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let message = tokio::select! {
            biased;
            _ = until_ended(&mut watching) => break,
            frame = queue.recv() => match frame {
                Some(frame) => Message::text(frame),
                None => break,
            },
            _ = ping.tick() => Message::Ping(Bytes::new()),
        };
        let sent = tokio::select! {
            sent = sink.send(message) => sent,
            _ = until_ended(&mut watching) => break,
        };
        if sent.is_err() {
            handle.end(close::NORMAL, "closed");
            break;
        }
    }
    let ended = *watching.borrow();
    if let Some(Ended { code, reason }) = ended {
        let frame = CloseFrame { code, reason: Utf8Bytes::from_static(reason) };
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            // what was queued before the end goes first (the refusal that explains it), except
            // to a slow reader, whose full queue is what ended it
            if code != close::SLOW_READER {
                while let Ok(queued) = queue.try_recv() {
                    sink.send(Message::text(queued)).await?;
                }
            }
            sink.send(Message::Close(Some(frame))).await
        })
        .await;
    }
}

/// What a session's calls share.
struct Session {
    state: AppState,
    handle: Arc<Handle>,
    verified: Option<Identity>,
    token: Option<Arc<str>>,
    source: Option<IpAddr>,
    in_flight: Arc<Semaphore>,
    ids: Arc<Mutex<HashSet<String>>>,
    session_id: String,
}

/// The reader: frames in, until the peer closes, falls silent, sends what cannot be read, or the
/// session is ended from elsewhere (a full queue).
async fn read(
    session: &Session,
    stream: &mut Stream,
    mut watching: watch::Receiver<Option<Ended>>,
    limits: &Limits,
    expiry: Option<Instant>,
) {
    let mut heard = Instant::now();
    loop {
        let frame = tokio::select! {
            _ = until_ended(&mut watching) => return,
            _ = tokio::time::sleep_until(heard + limits.silence_timeout) => {
                tracing::info!("socket peer silent: closed");
                return session.handle.end(close::PING_TIMEOUT, "ping-timeout");
            }
            _ = tokio::time::sleep_until(expiry.unwrap_or_else(Instant::now)), if expiry.is_some() => {
                return session.handle.end(close::SESSION_EXPIRED, "session-expired");
            }
            frame = stream.next() => frame,
        };
        heard = Instant::now();
        match frame {
            None | Some(Ok(Message::Close(_))) => return session.handle.end(close::NORMAL, "closed"),
            Some(Err(e)) => {
                if let Some((code, refusal)) = read_refusal(e, limits) {
                    log_refusal(&refusal);
                    session.handle.send(session_error(&refusal));
                    let reason = if code == close::FRAME_TOO_LARGE { "frame-too-large" } else { "frame-malformed" };
                    return session.handle.end(code, reason);
                }
                return session.handle.end(close::NORMAL, "closed");
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            Some(Ok(Message::Binary(_))) => {
                refuse_frame(session, None, Refusal::new("frame-malformed", "frames are JSON text, not binary"));
            }
            Some(Ok(Message::Text(text))) => frame_in(session, text.as_str()),
        }
    }
}

/// A call's answer as the socket writes it.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ResultFrame<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a Value,
    request_id: &'a str,
    result: &'a capstan_rpc::Answer,
    #[serde(skip_serializing_if = "Option::is_none")]
    answered_by: Option<&'a str>,
}

/// `frame` as text (a JSON tree or a checked text always writes out).
fn result_frame(frame: ResultFrame<'_>) -> String {
    serde_json::to_string(&frame).unwrap_or_else(|e| {
        json!({ "type": "error", "id": frame.id, "requestId": frame.request_id, "error": Refusal::internal(e) }).to_string()
    })
}

/// Answer one frame with an error (`id` when the frame had a readable one).
fn refuse_frame(session: &Session, id: Option<Value>, refusal: Refusal) {
    log_refusal(&refusal);
    session.handle.send(json!({ "type": "error", "id": id, "error": refusal }).to_string());
}

/// A call id: a string of at most [`MAX_CALL_ID_CHARS`] characters or an integer.
fn call_id(frame: &Map<String, Value>) -> Option<Value> {
    match frame.get("id")? {
        Value::String(s) if !s.is_empty() && s.chars().count() <= MAX_CALL_ID_CHARS => Some(Value::String(s.clone())),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(Value::Number(n.clone())),
        _ => None,
    }
}

fn frame_in(session: &Session, text: &str) {
    let Ok(Value::Object(mut frame)) = serde_json::from_str::<Value>(text) else {
        return refuse_frame(session, None, Refusal::new("frame-malformed", "a frame is a JSON object with a \"type\""));
    };
    let id = call_id(&frame);
    match frame.get("type").and_then(Value::as_str) {
        Some("call") => {}
        Some("reply") if session.state.relays.is_relay(&session.session_id) => {
            // every frame a relay sends is judged under its credential as it is now
            let (relays, session_id) = (session.state.relays.clone(), session.session_id.clone());
            tokio::spawn(
                async move {
                    if relays.check(&session_id).await.is_ok() {
                        relays.reply(&session_id, frame);
                    }
                }
                .in_current_span(),
            );
            return;
        }
        Some("offer") => {
            return refuse_frame(session, id, Refusal::new("frame-unexpected", "the session already began: an offer comes once, first"));
        }
        Some(other) => {
            let shown = capstan_core::text::truncate(other, 40);
            return refuse_frame(session, id, Refusal::new("frame-unexpected", format!("a client sends call frames, not {shown:?}")));
        }
        None => return refuse_frame(session, id, Refusal::new("frame-malformed", "a frame is a JSON object with a \"type\"")),
    }
    let Some(id) = id else {
        let message = format!("a call has an \"id\": a string of 1 to {MAX_CALL_ID_CHARS} characters or an integer");
        return refuse_frame(session, None, Refusal::new("frame-malformed", message));
    };
    if let Some(unknown) = frame.keys().find(|k| !["type", "id", "method", "body"].contains(&k.as_str())) {
        let shown = capstan_core::text::truncate(unknown, 100);
        return refuse_frame(session, Some(id), Refusal::new("frame-malformed", format!("unknown field {shown:?} in a call")));
    }
    let Some(Value::String(method)) = frame.remove("method") else {
        return refuse_frame(session, Some(id), Refusal::new("frame-malformed", "a call names its \"method\""));
    };
    // no body is `{}`, as an empty HTTP body is
    let body = match frame.remove("body") {
        None | Some(Value::Null) => json!({}),
        Some(body) => body,
    };
    let key = id.to_string();
    if !session.ids.lock().expect("the id set is never poisoned").insert(key.clone()) {
        return refuse_frame(session, Some(id), Refusal::new("call-id-in-use", "a call with this id is still running"));
    }
    let Ok(permit) = session.in_flight.clone().try_acquire_owned() else {
        session.ids.lock().expect("the id set is never poisoned").remove(&key);
        let limit = session.state.sockets.limits.max_in_flight;
        let refusal = Refusal::new("too-many-requests-in-flight", format!("a session runs at most {limit} calls at once"))
            .with_data(json!({ "limit": limit }))
            .retryable();
        return refuse_frame(session, Some(id), refusal);
    };
    let (state, handle, token, source, ids) =
        (session.state.clone(), session.handle.clone(), session.token.clone(), session.source, session.ids.clone());
    let (verified, session_id) = (session.verified.clone(), session.session_id.clone());
    let request_id = uuid::Uuid::new_v4().simple().to_string();
    let span =
        tracing::info_span!("call", session = %session.session_id, id = %request_id, method = %capstan_core::text::truncate(&method, 100));
    tokio::spawn(
        async move {
            let started = std::time::Instant::now();
            let caller = match verified {
                Some(identity) => Caller::Verified { identity, bearer: token.as_deref() },
                None => Caller::Bearer(token.as_deref()),
            };
            let relays = &state.relays;
            let dispatched = async {
                if matches!(caller, Caller::Verified { .. }) {
                    relays.check(&session_id).await?;
                }
                // a registration belongs to this socket: answered here, never dispatched
                if method == "relays.register" {
                    return Ok(Invoked::Here { answer: relays.register(&session_id, body).await?.into(), answered_by: None });
                }
                let invocation =
                    Invocation { method: &method, caller, source, request_id: &request_id, forwarded: false, body: Body::Value(body) };
                state.methods.invoke(invocation).await
            };
            let (answer, answered_by) = match dispatched.await {
                Ok(Invoked::Here { answer, answered_by }) => (Ok(answer), answered_by),
                Ok(Invoked::There(forwarded)) => {
                    let answered_by = forwarded.answered_by.clone();
                    (forwarded.into_answer(), answered_by)
                }
                Err(refusal) => (Err(refusal), None),
            };
            let answered_by = answered_by.as_deref();
            let answer = match answer {
                // a plugin's answer goes into the frame as the text it is
                Ok(result) => result_frame(ResultFrame { kind: "result", id: &id, request_id: &request_id, result: &result, answered_by }),
                Err(refusal) => {
                    log_refusal(&refusal);
                    let mut frame = json!({ "type": "error", "id": id, "requestId": request_id, "error": refusal });
                    if let Some(node) = answered_by {
                        frame["answeredBy"] = json!(node);
                    }
                    frame.to_string()
                }
            };
            tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, "call done");
            ids.lock().expect("the id set is never poisoned").remove(&key);
            drop(permit);
            handle.send(answer);
        }
        .instrument(span),
    );
}
