//! The open `/api/v1/socket` sessions of this host (the [`Hub`]), the bounds every session runs
//! under ([`Limits`]), the close codes a session ends with, and how host code pushes to
//! sessions ([`Target`]). The socket's HTTP face and protocol (the upgrade, the offer, the
//! frames) are `api::socket`'s; relays reach these sessions through
//! [`capstan_relays::Sessions`], which the hub implements.

use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

/// Room in a frame for what surrounds a method's body (`type`, `id`, `method`): any body that
/// `POST /api/v1/<method>` accepts (`CAPSTAN_MAX_BODY_BYTES`) fits in a `call` frame.
pub const FRAME_ENVELOPE_BYTES: usize = 16 * 1024;
/// Frames waiting for a session's writer. A peer that reads keeps this near empty; one that
/// stops reading fills the kernel's buffers, then this, and is dropped. With the frame limit it
/// bounds what one session can make the host hold.
pub const OUTBOUND_QUEUE: usize = 64;
/// Frames waiting for a relay session's writer: a relay carries every node session of its
/// cluster, each with up to eight unanswered pushes and its calls' answers, all of them the
/// host's own frames (docs/relays.md, "Carrying node sessions").
pub const RELAY_OUTBOUND_QUEUE: usize = 16 * 1024;
/// Calls one session may have running at once: a dashboard's parallel reads fit; a client that
/// wants more opens another session (each is bounded on its own).
pub const MAX_IN_FLIGHT: usize = 16;
/// How often the host pings an open session (well inside the idle timeouts of common proxies).
pub const PING_INTERVAL: Duration = Duration::from_secs(20);
/// How long a peer may send nothing at all (no frame, no pong) before it is closed: three
/// pings unanswered, so one lost pong or a busy moment is not taken for a dead peer.
pub const SILENCE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a client has after the upgrade to send its offer (a client sends it at once).
pub const OFFER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the host tries to deliver its closing frame to a peer it closes (a peer that reads
/// nothing never takes it).
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// People's sessions open at once on this host. An upgraded connection no longer holds one of
/// the listener's connection slots (`CAPSTAN_MAX_CONNECTIONS`, 1024 by default), so sessions
/// have bounds of their own, one per [`Pool`]; one over its pool's is refused
/// `too-many-sessions`.
pub const MAX_SESSIONS: usize = 1024;
/// Sessions whose caller nobody vouches for: upgraded without a bearer that authenticates and
/// still waiting for an offer, or anonymous. A small pool of their own, so strangers cannot hold
/// the slots of people or machines.
pub const MAX_STRANGER_SESSIONS: usize = 64;
/// Sessions of relays and agents (and machine users): reserved apart from people's and
/// strangers', so no number of those keeps a relay out.
pub const MAX_MACHINE_SESSIONS: usize = 1024;

/// The pools a session holds its slot in, by who its caller is. The upgrade takes a slot by the
/// `Authorization` bearer it carries (none, or one that does not authenticate: a stranger); an
/// offer whose token says otherwise moves the session to that pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// Nobody known (yet).
    Stranger,
    /// A person's session (dashboard, cli).
    Person,
    /// A relay, an agent, a machine user.
    Machine,
}

impl Pool {
    /// The pool of a caller who is `identity` (a relay's or agent's session is a machine's).
    pub fn of(identity: Option<&capstan_rpc::Identity>, kind: Option<Kind>) -> Pool {
        match (identity, kind) {
            (_, Some(Kind::Relay | Kind::Agent)) => Pool::Machine,
            (Some(identity), _) if identity.kind == "machine" => Pool::Machine,
            (Some(_), _) => Pool::Person,
            (None, _) => Pool::Stranger,
        }
    }

    /// Its name, as a refusal's data carries it.
    pub fn name(self) -> &'static str {
        match self {
            Pool::Stranger => "stranger",
            Pool::Person => "person",
            Pool::Machine => "machine",
        }
    }
}

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
    /// `too-many-sessions`: the pool the offer's caller belongs to is full.
    pub const TRY_AGAIN_LATER: u16 = 1013;
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
    /// Every kind, under its name in an offer.
    pub(crate) const ALL: [(&'static str, Kind); 4] =
        [("dashboard", Kind::Dashboard), ("cli", Kind::Cli), ("relay", Kind::Relay), ("agent", Kind::Agent)];

    /// The kind an offer names.
    pub(crate) fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.iter().find(|(n, _)| *n == name).map(|(_, k)| *k)
    }

    /// Relays and agents are machines the host pushes to by identity: they must authenticate.
    pub(crate) fn needs_identity(self) -> bool {
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
    /// See [`RELAY_OUTBOUND_QUEUE`].
    pub relay_outbound_queue: usize,
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
    /// See [`MAX_STRANGER_SESSIONS`].
    pub max_stranger_sessions: usize,
    /// See [`MAX_MACHINE_SESSIONS`].
    pub max_machine_sessions: usize,
}

impl Limits {
    /// The outbound queue of a session of `kind`.
    pub fn outbound_queue_of(&self, kind: Kind) -> usize {
        if kind == Kind::Relay { self.relay_outbound_queue } else { self.outbound_queue }
    }

    /// The limits for a host whose request bodies are at most `max_body_bytes`.
    pub fn for_bodies(max_body_bytes: usize) -> Limits {
        Limits {
            max_frame_bytes: max_body_bytes + FRAME_ENVELOPE_BYTES,
            outbound_queue: OUTBOUND_QUEUE,
            relay_outbound_queue: RELAY_OUTBOUND_QUEUE,
            max_in_flight: MAX_IN_FLIGHT,
            ping_interval: PING_INTERVAL,
            silence_timeout: SILENCE_TIMEOUT,
            offer_timeout: OFFER_TIMEOUT,
            max_sessions: MAX_SESSIONS,
            max_stranger_sessions: MAX_STRANGER_SESSIONS,
            max_machine_sessions: MAX_MACHINE_SESSIONS,
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
pub(crate) struct Handle {
    kind: Kind,
    user_id: Option<String>,
    /// Opened by a person who is an administrator.
    admin: bool,
    outbound: mpsc::Sender<String>,
    ended: watch::Sender<Option<Ended>>,
}

impl Handle {
    /// End the session (the first reason wins).
    pub(crate) fn end(&self, code: u16, reason: &'static str) {
        self.ended.send_if_modified(|ended| {
            if ended.is_some() {
                return false;
            }
            *ended = Some(Ended { code, reason });
            true
        });
    }

    /// Queue a frame; a full queue drops the session (`slow-reader`). False when not queued.
    pub(crate) fn send(&self, frame: String) -> bool {
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

    /// Why the session ended, once it has.
    pub(crate) fn ended(&self) -> Option<Ended> {
        *self.ended.borrow()
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

/// A session just kept in the hub ([`Hub::open`]).
pub(crate) struct Opened {
    /// Its handle: queue a frame, end it.
    pub(crate) handle: Arc<Handle>,
    /// The frames queued for it, in order, for its writer.
    pub(crate) queue: mpsc::Receiver<String>,
    /// Set once it ends, with why.
    pub(crate) ended: watch::Receiver<Option<Ended>>,
}

/// The open sessions of this host, and how host code pushes to them.
pub struct Hub {
    limits: Limits,
    sessions: Mutex<HashMap<String, Arc<Handle>>>,
    /// Woken whenever a session leaves (what [`Hub::close_all`] waits on).
    emptied: tokio::sync::Notify,
    /// One permit per session, upgraded or being upgraded, in its pool: strangers', people's,
    /// machines'.
    slots: [Arc<Semaphore>; 3],
}

/// A session's place in its pool, held from the upgrade until the session is gone.
#[derive(Debug)]
pub(crate) struct Slot {
    pool: Pool,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    /// The pool it is of.
    pub(crate) fn pool(&self) -> Pool {
        self.pool
    }
}

impl Hub {
    /// A hub with no session yet.
    pub fn new(limits: Limits) -> Hub {
        let pool = |n: usize| Arc::new(Semaphore::new(n));
        let slots = [pool(limits.max_stranger_sessions), pool(limits.max_sessions), pool(limits.max_machine_sessions)];
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

    /// A slot in `pool` while one is free: held from the upgrade until the session is gone.
    pub(crate) fn slot(&self, pool: Pool) -> Option<Slot> {
        self.slots[pool as usize].clone().try_acquire_owned().ok().map(|permit| Slot { pool, _permit: permit })
    }

    /// How many sessions `pool` holds at most.
    pub(crate) fn limit(&self, pool: Pool) -> usize {
        match pool {
            Pool::Stranger => self.limits.max_stranger_sessions,
            Pool::Person => self.limits.max_sessions,
            Pool::Machine => self.limits.max_machine_sessions,
        }
    }

    /// Keep the session `id`, whose offer was accepted, for pushes and [`Hub::end`]: its handle,
    /// the queue its writer drains, and the watch on its end.
    pub(crate) fn open(&self, id: &str, kind: Kind, user_id: Option<String>, admin: bool) -> Opened {
        let (outbound, queue) = mpsc::channel(self.limits.outbound_queue_of(kind));
        let (ended, watching) = watch::channel(None);
        let handle = Arc::new(Handle { kind, user_id, admin, outbound, ended });
        self.sessions.lock().expect("the session table is never poisoned").insert(id.to_string(), handle.clone());
        Opened { handle, queue, ended: watching }
    }

    /// Forget the session `id` once its close frame is sent (or could not be).
    pub(crate) fn remove(&self, id: &str) {
        self.sessions.lock().expect("the session table is never poisoned").remove(id);
        self.emptied.notify_waiters();
    }
}
