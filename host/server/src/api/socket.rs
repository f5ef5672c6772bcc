//! `GET /api/v1/socket`: the same typed methods as `POST /api/v1/<method>`, over one WebSocket,
//! plus pushes from the host (docs/socket.md is the protocol).
//!
//! A session starts with the client's offer (its kind and the protocols it speaks); the host
//! answers `welcome` with the protocol it chose, or refuses by name and closes. Each `call`
//! frame goes through the registry's one door ([`capstan_rpc::Registry::invoke`]), as HTTP's do, so a method is
//! resolved, authenticated, decoded, forwarded to the coordinator and logged the same way, and
//! its refusal is the same error object. The open sessions are kept in the [`Hub`]
//! (`crate::sessions`), through which the host pushes to them.
//!
//! Bounds: a frame is at most [`Limits::max_frame_bytes`] (`frame-too-large`, closed); a
//! session runs at most [`Limits::max_in_flight`] calls at once (`too-many-requests-in-flight`);
//! what the host sends a session waits in a queue of [`Limits::outbound_queue`] frames, and a
//! peer that lets it fill is dropped (`slow-reader`), never buffered for; a peer silent for
//! [`Limits::silence_timeout`] while pinged every [`Limits::ping_interval`] is closed
//! (`ping-timeout`). The defaults are `crate::sessions`' constants.

use super::{ApiError, log_refusal};
use crate::auth::{Auth, Identity};
use crate::bearer::bearer_token;
use crate::refusal::Refusal;
use crate::relays::Relays;
use crate::sessions::{CLOSE_GRACE, Ended, Handle, Hub, Kind, Limits, Opened, Pool, Slot, close};
use crate::state::AppState;
use crate::store::Store;
use axum::body::Bytes;
use axum::extract::ConnectInfo;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRef, State};
use axum::http::{Extensions, HeaderMap};
use axum::response::{IntoResponse, Response};
use capstan_rpc::{Body, Caller, Invocation, Invoked, Registry};
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use std::collections::HashSet;
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

/// The longest call id accepted, in characters (a client's counter or a UUID fits easily).
pub const MAX_CALL_ID_CHARS: usize = 128;

/// What a socket session reaches of the host: the hub that keeps it, the registry's door its
/// calls go through, authentication for its offer, and the relays (a relay's bearer is checked
/// against the store; its registration and replies are the relays').
#[derive(Clone)]
pub struct SocketState {
    /// The open sessions, this one among them once its offer is accepted.
    pub hub: Arc<Hub>,
    /// Every method, reached by each `call` frame through the one door.
    pub methods: Arc<Registry>,
    /// Judges the bearer an offer carries.
    pub auth: Arc<Auth>,
    /// The cluster relays, for a relay's session.
    pub relays: Arc<Relays>,
    /// Where a relay's bearer is verified.
    pub store: Store,
    /// The runtime: a node's session registers, reports and is pushed its assignments there.
    pub runtime: capstan_runtime::Context,
}

impl FromRef<AppState> for SocketState {
    fn from_ref(state: &AppState) -> SocketState {
        SocketState {
            hub: state.sockets.clone(),
            methods: state.methods.clone(),
            auth: state.auth.clone(),
            relays: state.relays.clone(),
            store: state.store.clone(),
            runtime: state.runtime.clone(),
        }
    }
}

/// `GET /api/v1/socket`: upgrade to a WebSocket session; anything else is refused
/// `upgrade-required`.
pub async fn upgrade(
    State(state): State<SocketState>,
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
    let bearer = bearer_token(&headers).map(str::to_string);
    // the slot is taken by who the upgrade's bearer says is calling: strangers have a small pool
    // of their own, so they cannot hold the slots people and relays need
    let node = headers.get(capstan_core::wire::NODE_HEADER).and_then(|v| v.to_str().ok());
    let pool = match &bearer {
        Some(bearer) => pool_of_bearer(&state, bearer, node).await,
        None => Pool::Stranger,
    };
    let Some(slot) = state.hub.slot(pool) else {
        return ApiError(too_many_sessions(&state.hub, pool)).into_response();
    };
    let source = extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let max = state.hub.limits().max_frame_bytes;
    ws.max_frame_size(max).max_message_size(max).on_upgrade(move |socket| run(state, socket, bearer, source, slot))
}

/// The pool of the caller an upgrade's bearer stands for: a person or machine by its JWT, a relay
/// by its relay bearer, a node by its node token (with `capstan_core::wire::NODE_HEADER`), else a stranger (the
/// offer judges the bearer again, and names why).
async fn pool_of_bearer(state: &SocketState, bearer: &str, node: Option<&str>) -> Pool {
    if let Some(node) = node {
        return match capstan_nodes::credentials::authenticate(&state.runtime.nodes, Some(node), Some(bearer)).await {
            Ok(_) => Pool::Machine,
            Err(_) => Pool::Stranger,
        };
    }
    if let Ok(identity) = state.auth.authenticate(bearer).await {
        return Pool::of(Some(&identity), None);
    }
    match crate::relays::identify(&state.store, bearer.as_bytes()).await {
        Ok(_) => Pool::Machine,
        Err(_) => Pool::Stranger,
    }
}

/// The refusal of a session whose pool is full.
fn too_many_sessions(hub: &Hub, pool: Pool) -> Refusal {
    let max = hub.limit(pool);
    tracing::warn!(max, pool = pool.name(), "a socket session was refused: every slot of its pool is in use");
    Refusal::new("too-many-sessions", format!("this host holds at most {max} socket sessions of a {} caller; try again later", pool.name()))
        .with_data(json!({ "limit": max, "pool": pool.name() }))
        .retryable()
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
    /// A node's session (an `agent` offer naming its node): the node its credential verified as.
    node: Option<String>,
}

/// Judge the first frame: a readable offer first, then its protocols (before anything about the
/// caller is looked at), its kind, and last the token.
async fn judge_offer(state: &SocketState, first: Message, header_bearer: Option<String>) -> Result<Accepted, (u16, Refusal)> {
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
    if let Some(unknown) = offer.keys().find(|k| !["type", "kind", "protocols", "token", "node"].contains(&k.as_str())) {
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
                Ok(Accepted { protocol, kind, token: Some(bearer), identity: Some(identity), relay: Some(verified), node: None })
            }
            Err(refusal) if refusal.is("relay-credential-generation-stale") => Err((close::RELAY_CREDENTIAL_STALE, refusal)),
            Err(refusal) => Err((close::UNAUTHENTICATED, refusal)),
        };
    }
    if let Some(node) = offer.get("node") {
        // a node's runtime session: its node id and node token, judged by the nodes area
        let (Some(node), Some(token), Kind::Agent) = (node.as_str(), token.as_deref(), kind) else {
            return Err(invalid("\"node\" is offered by an agent session, with the node's token as the offer's token".into()));
        };
        return match capstan_nodes::credentials::authenticate(&state.runtime.nodes, Some(node), Some(token)).await {
            Ok(who) => {
                Ok(Accepted { protocol, kind, token: Some(token.to_string()), identity: None, relay: None, node: Some(who.node_id) })
            }
            Err(_) => Err((close::UNAUTHENTICATED, Refusal::new("unauthenticated", "the node id and token were not accepted"))),
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
    Ok(Accepted { protocol, kind, token, identity, relay: None, node: None })
}

async fn run(state: SocketState, socket: WebSocket, header_bearer: Option<String>, source: Option<IpAddr>, slot: Slot) {
    let session_id = capstan_core::ids::new_id("socket");
    let span = tracing::info_span!("socket", session = %session_id);
    session(state, socket, header_bearer, source, session_id, slot).instrument(span).await
}

async fn session(
    state: SocketState,
    socket: WebSocket,
    header_bearer: Option<String>,
    source: Option<IpAddr>,
    session_id: String,
    slot: Slot,
) {
    let hub = state.hub.clone();
    let limits = hub.limits().clone();
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
    let Accepted { protocol, kind, token, identity, relay, node } = accepted;
    // the offer says who is calling: the session moves to that caller's pool (held until it ends)
    let pool = Pool::of(identity.as_ref(), Some(kind));
    let _slot = match slot.pool() == pool {
        true => slot,
        false => {
            let moved = hub.slot(pool);
            drop(slot);
            match moved {
                Some(moved) => moved,
                None => return refuse(&mut sink, close::TRY_AGAIN_LATER, too_many_sessions(&hub, pool)).await,
            }
        }
    };
    let mut welcome = json!({
        "type": "welcome",
        "protocol": protocol,
        "sessionId": session_id,
        "kind": kind,
        "identity": identity.as_ref().map(|i| json!({ "userId": i.user_id, "username": i.username, "kind": i.kind, "admin": i.admin })),
        "limits": {
            "maxFrameBytes": limits.max_frame_bytes,
            "maxInFlight": limits.max_in_flight,
            "outboundQueue": limits.outbound_queue_of(kind),
            "pingIntervalMs": limits.ping_interval.as_millis() as u64,
            "silenceTimeoutMs": limits.silence_timeout.as_millis() as u64,
        },
    });
    if let Some(relay) = &relay {
        welcome["relay"] = json!({ "clusterId": relay.cluster_id, "credential": relay.credential });
    }
    if let Some(node) = &node {
        welcome["node"] = json!({ "nodeId": node });
    }
    if sink.send(Message::text(welcome.to_string())).await.is_err() {
        return;
    }
    tracing::info!(kind = ?kind, user = identity.as_ref().map(|i| i.username.as_str()).unwrap_or("-"), "socket session opened");
    let (user_id, admin) = (identity.as_ref().map(|i| i.user_id.clone()), identity.as_ref().is_some_and(|i| i.is_human_admin()));
    let Opened { handle, queue, ended: watching } = hub.open(&session_id, kind, user_id, admin);
    if let (Some(relay), Some(bearer)) = (&relay, &token) {
        state.relays.opened(&session_id, &relay.cluster_id, bearer.as_bytes());
    }
    if let (Some(node), Some(bearer)) = (&node, &token) {
        state.runtime.sessions.opened(&session_id, node, bearer);
    }
    let writer = tokio::spawn(write(sink, queue, watching.clone(), limits.ping_interval, handle.clone()).in_current_span());
    // the session ends with the token it opened with (a relay's bearer has no lifetime: it
    // holds until rotated, which every frame checks)
    let expiry = identity.as_ref().filter(|_| relay.is_none()).map(|i| {
        let left = i.expires_at.saturating_sub(capstan_core::clock::now_ms());
        Instant::now() + Duration::from_millis(left)
    });
    let session = Session {
        state: state.clone(),
        handle: handle.clone(),
        // a relay's calls run as the identity its bearer verified (the bearer is no JWT)
        verified: relay.is_some().then(|| identity.clone()).flatten(),
        token: token.filter(|_| relay.is_none() && node.is_none()).map(Arc::from),
        source,
        in_flight: Arc::new(Semaphore::new(limits.max_in_flight)),
        ids: Arc::default(),
        session_id: session_id.clone(),
        follows: Arc::default(),
    };
    read(&session, &mut stream, watching, &limits, expiry).await;
    handle.end(close::NORMAL, "closed");
    let _ = writer.await;
    // gone from the hub once its close frame is sent (or could not be)
    hub.remove(&session_id);
    state.relays.closed(&session_id).await;
    state.runtime.sessions.closed(&session_id);
    let ended = handle.ended();
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
    state: SocketState,
    handle: Arc<Handle>,
    verified: Option<Identity>,
    token: Option<Arc<str>>,
    source: Option<IpAddr>,
    in_flight: Arc<Semaphore>,
    ids: Arc<Mutex<HashSet<String>>>,
    session_id: String,
    /// The attempts this session follows (`runtime.followLogs`): they stop with it.
    follows: Arc<super::follow::Follows>,
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
        Some(kind @ ("node-open" | "node" | "node-close")) if session.state.relays.is_relay(&session.session_id) => {
            let kind = kind.to_string();
            return super::carried::relay_frame(&session.state, &session.handle, &session.session_id, &kind, frame);
        }
        Some("reply") if session.state.runtime.sessions.is_node(&session.session_id) => {
            session.state.runtime.sessions.reply(frame);
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
        let limit = session.state.hub.limits().max_in_flight;
        let refusal = Refusal::new("too-many-requests-in-flight", format!("a session runs at most {limit} calls at once"))
            .with_data(json!({ "limit": limit }))
            .retryable();
        return refuse_frame(session, Some(id), refusal);
    };
    let (state, handle, token, source, ids) =
        (session.state.clone(), session.handle.clone(), session.token.clone(), session.source, session.ids.clone());
    let (verified, session_id, follows) = (session.verified.clone(), session.session_id.clone(), session.follows.clone());
    let request_id = uuid::Uuid::new_v4().simple().to_string();
    let span =
        tracing::info_span!("call", session = %session.session_id, id = %request_id, method = %capstan_core::text::truncate(&method, 100));
    tokio::spawn(
        async move {
            let started = std::time::Instant::now();
            let asker = super::follow::Asker { verified: verified.clone(), token: token.clone(), request_id: request_id.clone() };
            let caller = match verified {
                Some(identity) => Caller::Verified { identity, bearer: token.as_deref() },
                None => Caller::Bearer(token.as_deref()),
            };
            let relays = &state.relays;
            let dispatched = async {
                // a node's session calls its runtime methods, answered here, and nothing else
                if state.runtime.sessions.is_node(&session_id) {
                    if !capstan_runtime::sessions::NODE_METHODS.contains(&method.as_str()) {
                        return Err(Refusal::new(
                            "forbidden",
                            "a node's runtime session calls only the runtime's node methods (docs/runtime.md)",
                        ));
                    }
                    let answer = capstan_runtime::sessions::node_call(&state.runtime, &session_id, &method, body).await?;
                    return Ok(Invoked::Here { answer: answer.into(), answered_by: None });
                }
                if matches!(caller, Caller::Verified { .. }) {
                    relays.check(&session_id).await?;
                }
                // a registration, and a follow, belong to this socket: answered here, never dispatched
                if method == "relays.register" {
                    return Ok(Invoked::Here { answer: relays.register(&session_id, body).await?.into(), answered_by: None });
                }
                if method == "runtime.followLogs" {
                    let answer = super::follow::follow(&state, &session_id, &follows, asker, body).await?;
                    return Ok(Invoked::Here { answer: answer.into(), answered_by: None });
                }
                if method == "runtime.unfollowLogs" {
                    return Ok(Invoked::Here { answer: super::follow::unfollow(&follows, &body)?.into(), answered_by: None });
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
