//! Node runtime sessions: a node's agent registers one over its socket (docs/runtime.md, "Node
//! runtime sessions"), is pushed its assignments — each revision once per session, at most
//! [`MAX_IN_FLIGHT`] unanswered per node — and reports observations and receipts.
//!
//! A node's session rides its own socket, or its cluster's relay socket, which carries every
//! node of the cluster keyed by (relay socket, node) ([`NodeSessions::carry`]): the relay is a
//! carrier, never an authority — each node is judged by its own credential, on opening and on
//! every report, and only a node of the relay's own cluster is carried (`relay-node-foreign`).
//!
//! What a session holds lives in this process only: a session never outlives the agent
//! process (its nonce) or the socket that carried it, and the slots it reports on are the
//! durable truth.

pub use super::report_refused;
use super::slots::{self, Observation, Slot};
use super::transition::Intent;
use super::{Context, RUNTIME_SLOTS};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::{Entity, emit, to_value};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use zeroize::Zeroizing;

/// Unanswered pushes per node.
pub const MAX_IN_FLIGHT: usize = 8;
/// How long a push waits for the node's reply.
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a pull credential issued with a push lasts.
pub const PULL_TTL: Duration = Duration::from_secs(15 * 60);
/// The methods a node calls over its session.
pub const NODE_METHODS: [&str; 6] = [
    "runtime.registerSession",
    "runtime.enrollRecipient",
    "runtime.proveRecipient",
    "runtime.reportObservation",
    "runtime.reportReceipt",
    "runtime.reportLogs",
];

/// Calls one carried node may have running at once (a direct socket has the session's bound).
pub const MAX_CARRIED_CALLS: usize = 8;

/// A socket authenticated as a node: its own, or a relay socket carrying it.
struct Bound {
    node_id: String,
    token: Zeroizing<String>,
    /// The relay session carrying it (`None`: the node's own socket).
    carrier: Option<String>,
    /// Its calls running now (bounded for a carried node).
    calls: usize,
}

/// A node's current runtime session.
struct Current {
    socket: String,
    nonce: String,
    epoch: u64,
    /// Assignment id → the revision this session acknowledged.
    acked: HashMap<String, u64>,
    /// Assignment id → the revision pushed and not yet answered.
    in_flight: HashMap<String, u64>,
    /// The recipient challenge this session was sealed and has not answered yet.
    challenge: Option<Challenge>,
}

/// A recipient challenge: 32 random bytes sealed to the public key the agent offered, which only
/// the holder of its private half can answer.
struct Challenge {
    id: String,
    public_key: String,
    answer: Zeroizing<[u8; 32]>,
}

/// The target a recipient challenge is sealed for (docs/runtime.md, "Node recipients").
pub fn challenge_target(node_id: &str, challenge_id: &str) -> String {
    capstan_core::sealed::target("runtime.enrollRecipient", &format!("node:{node_id}"), challenge_id)
}

/// The node runtime sessions this process carries.
#[derive(Default)]
pub struct NodeSessions {
    bound: Mutex<HashMap<String, Bound>>,
    current: Mutex<HashMap<String, Current>>,
    waiting: Mutex<HashMap<String, oneshot::Sender<Map<String, Value>>>>,
    counter: AtomicU64,
}

impl NodeSessions {
    /// The socket `socket` authenticated as node `node_id` with `token` (judged again on every
    /// report).
    pub fn opened(&self, socket: &str, node_id: &str, token: &str) {
        let bound = Bound { node_id: node_id.into(), token: Zeroizing::new(token.into()), carrier: None, calls: 0 };
        self.bound.lock().expect("bound").insert(socket.into(), bound);
    }

    /// The socket closed: its node's session, if it was current, ends with it; a relay's
    /// socket ends every node session it carried (and no other).
    pub fn closed(&self, socket: &str) {
        let gone: Vec<(String, String)> = {
            let mut bound = self.bound.lock().expect("bound");
            let keys: Vec<String> = bound
                .iter()
                .filter(|(key, b)| key.as_str() == socket || b.carrier.as_deref() == Some(socket))
                .map(|(key, _)| key.clone())
                .collect();
            keys.into_iter().filter_map(|key| bound.remove(&key).map(|b| (key, b.node_id))).collect()
        };
        let mut current = self.current.lock().expect("current");
        for (key, node_id) in gone {
            if current.get(&node_id).is_some_and(|c| c.socket == key) {
                current.remove(&node_id);
                tracing::info!(node = %node_id, "node runtime session ended with its socket");
            }
        }
    }

    /// The key a node carried by the relay session `carrier` is known under (its "socket").
    pub fn carried_key(carrier: &str, node_id: &str) -> String {
        format!("{carrier}>{node_id}")
    }

    /// Where a frame for `socket` goes: the relay session carrying it (the frame wrapped as
    /// `{"type": "node", "node", "frame"}`), or the node's own socket.
    pub fn route(&self, socket: &str, frame: Value) -> (String, String) {
        let carrier = self.bound.lock().expect("bound").get(socket).and_then(|b| b.carrier.clone().map(|c| (c, b.node_id.clone())));
        match carrier {
            Some((carrier, node_id)) => (carrier, json!({ "type": "node", "node": node_id, "frame": frame }).to_string()),
            None => (socket.to_string(), frame.to_string()),
        }
    }

    /// Take one of a carried node's [`MAX_CARRIED_CALLS`] (a direct socket's calls are bounded
    /// by its session): `false` when they are all running.
    pub fn begin_call(&self, socket: &str) -> bool {
        let mut bound = self.bound.lock().expect("bound");
        match bound.get_mut(socket) {
            Some(b) if b.carrier.is_some() && b.calls >= MAX_CARRIED_CALLS => false,
            Some(b) => {
                b.calls += 1;
                true
            }
            None => true,
        }
    }

    /// A call taken with [`NodeSessions::begin_call`] was answered.
    pub fn end_call(&self, socket: &str) {
        if let Some(b) = self.bound.lock().expect("bound").get_mut(socket) {
            b.calls = b.calls.saturating_sub(1);
        }
    }

    /// Whether `socket` is a node's.
    pub fn is_node(&self, socket: &str) -> bool {
        self.bound.lock().expect("bound").contains_key(socket)
    }

    /// The nodes with a current session here.
    pub fn nodes(&self) -> Vec<String> {
        self.current.lock().expect("current").keys().cloned().collect()
    }

    /// How many sessions are current here.
    pub fn count(&self) -> usize {
        self.current.lock().expect("current").len()
    }

    /// A `reply` frame from a node's socket.
    pub fn reply(&self, frame: Map<String, Value>) {
        let Some(id) = frame.get("id").and_then(Value::as_str) else { return };
        if let Some(waiter) = self.waiting.lock().expect("waiting").remove(id) {
            let _ = waiter.send(frame);
        }
    }

    fn node_of(&self, socket: &str) -> Result<(String, Zeroizing<String>)> {
        let bound = self.bound.lock().expect("bound");
        let b = bound.get(socket).ok_or_else(|| report_refused("session-unknown", "this socket is not a node's"))?;
        Ok((b.node_id.clone(), b.token.clone()))
    }

    /// The node's session on `socket` is its current one.
    fn require_current(&self, socket: &str, node_id: &str) -> Result<()> {
        match self.current.lock().expect("current").get(node_id) {
            Some(c) if c.socket == socket => Ok(()),
            Some(_) => Err(report_refused("session-superseded", "a newer runtime session of this node exists")),
            None => Err(report_refused("session-unknown", "register the runtime session first (runtime.registerSession)")),
        }
    }
}

/// The relay session `carrier` of `cluster_id` carries node `node_id`, which presented
/// `token`: judged by the node's own credential, and only a node of that cluster. A node
/// carried again on the same socket replaces its earlier binding (the node reconnected to
/// the relay); the other nodes the socket carries are untouched. Answers the session key.
pub async fn carry(cx: &Context, carrier: &str, cluster_id: &str, node_id: &str, token: &str) -> Result<String> {
    let who = capstan_nodes::credentials::authenticate(&cx.nodes, Some(node_id), Some(token))
        .await
        .map_err(|_| Refusal::new("unauthenticated", "the node id and token were not accepted"))?;
    let node_cluster = cx
        .store
        .transact(|tx| {
            let node_id = who.node_id.clone();
            async move { capstan_nodes::records::require_node(&tx, &node_id).await.map(|n| n.data.cluster_id) }
        })
        .await?;
    if node_cluster != cluster_id {
        return Err(Refusal::new("relay-node-foreign", "a relay carries the nodes of its own cluster only"));
    }
    let key = NodeSessions::carried_key(carrier, &who.node_id);
    cx.sessions.closed(&key);
    let bound = Bound { node_id: who.node_id.clone(), token: Zeroizing::new(token.into()), carrier: Some(carrier.into()), calls: 0 };
    cx.sessions.bound.lock().expect("bound").insert(key.clone(), bound);
    tracing::info!(node = %who.node_id, "a node's runtime session is carried by its cluster's relay");
    Ok(key)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RegisterInput {
    node_id: String,
    nonce: String,
    #[serde(default)]
    agent_version: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ObservationInput {
    assignment_id: String,
    generation: u32,
    phase: String,
    ready: bool,
    #[serde(default)]
    image_digest: Option<String>,
    #[serde(default)]
    restart_count: u32,
    #[serde(default)]
    cause: Option<String>,
    observed_at: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReceiptInput {
    assignment_id: String,
    generation: u32,
}

const PHASES: [&str; 6] = ["pulling", "starting", "running", "unhealthy", "exited", "failed"];

fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text
            .bytes()
            .enumerate()
            .all(|(i, b)| if [8, 13, 18, 23].contains(&i) { b == b'-' } else { b.is_ascii_hexdigit() && !b.is_ascii_uppercase() })
}

fn decode<T: serde::de::DeserializeOwned>(body: Value) -> Result<T> {
    serde_json::from_value(body).map_err(|e| {
        report_refused("request-invalid", format!("the report does not read: {}", capstan_core::text::truncate(&e.to_string(), 200)))
    })
}

/// A call a node makes over its session (one of [`NODE_METHODS`]).
pub async fn node_call(cx: &Context, socket: &str, method: &str, body: Value) -> Result<Value> {
    let (node_id, token) = cx.sessions.node_of(socket)?;
    // the node's own credential still holds (a rotation or revocation ends what it may do)
    capstan_nodes::credentials::authenticate(&cx.nodes, Some(&node_id), Some(&token))
        .await
        .map_err(|_| report_refused("session-unauthorized", "the node's credential no longer authenticates"))?;
    match method {
        "runtime.registerSession" => register(cx, socket, &node_id, decode(body)?).await,
        "runtime.enrollRecipient" => enroll_recipient(cx, socket, &node_id, decode(body)?),
        "runtime.proveRecipient" => prove_recipient(cx, socket, &node_id, decode(body)?).await,
        "runtime.reportObservation" => {
            cx.sessions.require_current(socket, &node_id)?;
            observe(cx, &node_id, decode(body)?).await
        }
        "runtime.reportReceipt" => {
            cx.sessions.require_current(socket, &node_id)?;
            receipt(cx, &node_id, decode(body)?).await
        }
        "runtime.reportLogs" => {
            cx.sessions.require_current(socket, &node_id)?;
            crate::logs::accept(cx, &node_id, decode(body)?).await
        }
        _ => Err(Refusal::new("method-unknown", format!("{method} is not a node's runtime method"))),
    }
}

async fn register(cx: &Context, socket: &str, node_id: &str, input: RegisterInput) -> Result<Value> {
    if input.node_id != node_id {
        return Err(report_refused("request-invalid", "nodeId is the node this socket authenticated as"));
    }
    if !is_uuid(&input.nonce) {
        return Err(report_refused("request-invalid", "nonce is a lowercase UUID drawn once per agent process"));
    }
    let cluster_id =
        cx.store.transact(|tx| async move { capstan_nodes::records::require_node(&tx, node_id).await.map(|n| n.data.cluster_id) }).await?;
    let epoch = {
        let mut current = cx.sessions.current.lock().expect("current");
        match current.get(node_id) {
            Some(c) if c.socket == socket && c.nonce == input.nonce => c.epoch,
            previous => {
                let epoch = previous.map_or(0, |c| c.epoch).max(now_ms()) + 1;
                let session = Current {
                    socket: socket.into(),
                    nonce: input.nonce.clone(),
                    epoch,
                    acked: HashMap::new(),
                    in_flight: HashMap::new(),
                    challenge: None,
                };
                current.insert(node_id.into(), session);
                tracing::info!(node = %node_id, epoch, version = input.agent_version.as_deref().unwrap_or("-"), "node runtime session registered");
                epoch
            }
        }
    };
    cx.delivery_wake.notify_one();
    record_held_here(cx, node_id, epoch).await;
    Ok(json!({ "sessionEpoch": epoch, "nodeId": node_id, "clusterId": cluster_id }))
}

/// Record that this fleet node holds `node_id`'s session (a call to the node made on another
/// fleet node is carried here). Best effort: without the record such a call is refused
/// `node-not-connected` there, and the node's next registration writes it again.
async fn record_held_here(cx: &Context, node_id: &str, epoch: u64) {
    let Some(here) = cx.here.get() else { return };
    let record = json!({ "fleetNodeId": here, "sessionEpoch": epoch, "at": now_ms() });
    let written = cx
        .store
        .transact(|tx| {
            let record = record.clone();
            async move {
                let held = tx.get(crate::RUNTIME_NODE_SESSIONS, node_id).await?;
                tx.put(crate::RUNTIME_NODE_SESSIONS, node_id, held.map(|d| d.revision), record).await.map(drop)
            }
        })
        .await;
    if let Err(refusal) = written {
        tracing::warn!(node = %node_id, code = %refusal.code, "where the node's session is held was not recorded: {}", refusal.message);
    }
}

/// The fleet node that last registered `node_id`'s runtime session, when it is not this one
/// (`None`: held here, or never recorded).
pub async fn held_elsewhere(cx: &Context, node_id: &str) -> Result<Option<String>> {
    let doc = cx.store.transact(|tx| async move { tx.get(crate::RUNTIME_NODE_SESSIONS, node_id).await }).await?;
    let holder = doc.and_then(|d| d.data["fleetNodeId"].as_str().map(str::to_string));
    Ok(holder.filter(|holder| cx.here.get() != Some(holder)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct EnrollInput {
    public_key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProveInput {
    challenge_id: String,
    answer: String,
}

/// `runtime.enrollRecipient {publicKey}`: the agent offers the X25519 public key it drew for
/// this process; it is answered a challenge sealed to that key, which `runtime.proveRecipient`
/// answers. A new offer replaces a challenge not answered yet.
fn enroll_recipient(cx: &Context, socket: &str, node_id: &str, input: EnrollInput) -> Result<Value> {
    use base64::Engine;
    let key: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(&input.public_key)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| report_refused("request-invalid", "publicKey is an X25519 public key: 32 bytes in base64"))?;
    let public = x25519_dalek::PublicKey::from(key);
    // a low-order point makes every shared secret the same: anyone could open what is sealed to it
    let probe = x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>());
    if !probe.diffie_hellman(&public).was_contributory() {
        return Err(report_refused("request-invalid", "publicKey is not a usable X25519 public key (a low-order point)"));
    }
    let id = format!("rch_{}", hex::encode(rand::random::<[u8; 16]>()));
    let answer = Zeroizing::new(rand::random::<[u8; 32]>());
    let sealed = capstan_core::sealed::seal_to(&format!("node:{node_id}"), &public, &challenge_target(node_id, &id), answer.as_slice());
    let mut current = cx.sessions.current.lock().expect("current");
    match current.get_mut(node_id) {
        Some(session) if session.socket == socket => {
            session.challenge = Some(Challenge { id: id.clone(), public_key: input.public_key, answer });
        }
        Some(_) => return Err(report_refused("session-superseded", "a newer runtime session of this node exists")),
        None => return Err(report_refused("session-unknown", "register the runtime session first (runtime.registerSession)")),
    }
    Ok(json!({ "challengeId": id, "challenge": sealed }))
}

/// `runtime.proveRecipient {challengeId, answer}`: the opened challenge (base64) proves the
/// agent holds the private key; the key becomes the node's next recipient generation, bound to
/// this session's agent process.
async fn prove_recipient(cx: &Context, socket: &str, node_id: &str, input: ProveInput) -> Result<Value> {
    use base64::Engine;
    let (public_key, nonce) = {
        let mut current = cx.sessions.current.lock().expect("current");
        let session = match current.get_mut(node_id) {
            Some(session) if session.socket == socket => session,
            Some(_) => return Err(report_refused("session-superseded", "a newer runtime session of this node exists")),
            None => return Err(report_refused("session-unknown", "register the runtime session first (runtime.registerSession)")),
        };
        let challenge = match session.challenge.take() {
            Some(challenge) if challenge.id == input.challenge_id => challenge,
            other => {
                session.challenge = other;
                return Err(report_refused("recipient-challenge-unknown", "no such challenge is open: enroll the recipient again"));
            }
        };
        let answer = base64::engine::general_purpose::STANDARD.decode(&input.answer).map(Zeroizing::new).unwrap_or_default();
        if answer.as_slice() != challenge.answer.as_slice() {
            return Err(report_refused("recipient-proof-invalid", "the answer is not the challenge: enroll the recipient again"));
        }
        (challenge.public_key, session.nonce.clone())
    };
    let recipient = capstan_nodes::recipients::record(&cx.store, node_id, &public_key, &nonce, now_ms()).await?;
    tracing::info!(node = %node_id, generation = recipient.generation, "node recipient enrolled");
    cx.delivery_wake.notify_one();
    Ok(json!({ "generation": recipient.generation, "enrolledAt": recipient.enrolled_at }))
}

/// The slot holding `assignment_id` on `node_id`, or `assignment-unknown`.
async fn node_slot(tx: &capstan_store::Tx, node_id: &str, assignment_id: &str) -> Result<Entity<Slot>> {
    let unknown =
        || report_refused("assignment-unknown", "no current assignment of this node has that id: stop and remove what carries it");
    if capstan_store::validate_id(assignment_id).is_err() {
        return Err(unknown());
    }
    match slots::by_assignment(tx, assignment_id).await? {
        Some(slot) if slot.data.node_id == node_id => Ok(slot),
        _ => Err(unknown()),
    }
}

async fn observe(cx: &Context, node_id: &str, input: ObservationInput) -> Result<Value> {
    if !PHASES.contains(&input.phase.as_str()) {
        return Err(report_refused("request-invalid", format!("phase is one of {}", PHASES.join(", "))));
    }
    let cause = input.cause.as_deref().map(|c| capstan_core::text::truncate(c, 512));
    let digest = input.image_digest.as_deref().map(|d| capstan_core::text::truncate(d, 80));
    let changed = cx
        .store
        .transact(|tx| {
            let (input, cause, digest) = (&input, cause.clone(), digest.clone());
            async move {
                let mut slot = node_slot(&tx, node_id, &input.assignment_id).await?;
                if input.generation != 1 || slot.data.assignment.intent != Intent::Run {
                    return Err(report_refused("not-current", "the assignment has moved past running: report its receipts"));
                }
                let a = &mut slot.data.assignment;
                let same = a.observation.as_ref().is_some_and(|o| {
                    o.phase == input.phase
                        && o.ready == input.ready
                        && o.image_digest == digest
                        && o.restart_count == input.restart_count
                        && o.cause == cause
                });
                if same {
                    return Ok(false);
                }
                a.observation = Some(Observation {
                    phase: input.phase.clone(),
                    ready: input.ready,
                    image_digest: digest,
                    restart_count: input.restart_count,
                    cause: cause.clone(),
                    observed_at: input.observed_at,
                    accepted_at: now_ms(),
                });
                if cause.is_some() {
                    slot.data.last_cause = cause;
                }
                tx.replace(RUNTIME_SLOTS, &slot.id, slot.revision, to_value(&slot.data)?).await?;
                let body =
                    json!({ "slot": slot.data.slot, "assignmentId": input.assignment_id, "phase": input.phase, "ready": input.ready });
                emit(&tx, "runtime.observed", &slot.data.service_id, body).await?;
                let s = &slot.data;
                let said = s.assignment.observation.as_ref().and_then(|o| o.cause.as_deref());
                let (kind, words) = crate::history::observed_words(&input.phase, input.ready, said);
                let event = crate::history::RuntimeEvent::now(&s.service_id, &s.slot, node_id, &input.assignment_id, &kind, words);
                crate::history::record(&tx, &event).await?;
                Ok(true)
            }
        })
        .await?;
    if changed {
        cx.wake();
    }
    Ok(json!({ "accepted": true, "changed": changed }))
}

async fn receipt(cx: &Context, node_id: &str, input: ReceiptInput) -> Result<Value> {
    let changed = cx
        .store
        .transact(|tx| {
            let input = &input;
            async move {
                let mut slot = node_slot(&tx, node_id, &input.assignment_id).await?;
                let a = &mut slot.data.assignment;
                let now = now_ms();
                let field = match (input.generation, a.intent) {
                    (2, Intent::Stop | Intent::Remove) => &mut a.stopped_at,
                    (3, Intent::Remove) => &mut a.removed_at,
                    (2 | 3, _) => return Err(report_refused("not-current", "the assignment is not asked for that yet")),
                    _ => return Err(report_refused("request-invalid", "a receipt's generation is 2 (stopped) or 3 (removed)")),
                };
                if field.is_some() {
                    return Ok(false);
                }
                *field = Some(now);
                tx.replace(RUNTIME_SLOTS, &slot.id, slot.revision, to_value(&slot.data)?).await?;
                let body = json!({ "slot": slot.data.slot, "assignmentId": input.assignment_id, "generation": input.generation });
                emit(&tx, "runtime.receipt", &slot.data.service_id, body).await?;
                let (kind, words) =
                    if input.generation == 2 { ("stopped", "the container stopped") } else { ("removed", "the container was removed") };
                let s = &slot.data;
                let event = crate::history::RuntimeEvent::now(&s.service_id, &s.slot, node_id, &input.assignment_id, kind, words.into());
                crate::history::record(&tx, &event).await?;
                Ok(true)
            }
        })
        .await?;
    if changed {
        cx.wake();
    }
    Ok(json!({ "accepted": true, "changed": changed }))
}

/// One delivery pass over the node sessions current here: every assignment revision a session
/// has not acknowledged is pushed, at most [`MAX_IN_FLIGHT`] unanswered per node.
pub async fn deliver(cx: &Context) -> Result<usize> {
    let mut claimed = Vec::new();
    for node_id in cx.sessions.nodes() {
        let slots = cx.store.transact(|tx| {
            let node_id = node_id.clone();
            async move { slots::of_node(&tx, &node_id).await }
        });
        for slot in slots.await? {
            if let Some((socket, epoch)) = cx.sessions.claim(&node_id, &slot.data) {
                claimed.push(Claimed { socket, epoch, slot: slot.data });
            }
        }
    }
    let pushed = claimed.len();
    let mut claimed = claimed.into_iter().peekable();
    while claimed.peek().is_some() {
        let batch: Vec<Claimed> = claimed.by_ref().take(PULL_BATCH).collect();
        // the batch's pull credentials in one transaction, not one each
        let wanted: Vec<(&str, &str)> = batch.iter().filter_map(|c| c.pull_wanted()).collect();
        let mut credentials = match capstan_registry::pulls::issue_many(&cx.store, &wanted, PULL_TTL).await {
            Ok(credentials) => credentials.into_iter(),
            Err(refusal) => {
                tracing::warn!(code = %refusal.code, pushes = batch.len(), "pull credentials were not issued; pushed on a later pass: {}", refusal.message);
                for c in &batch {
                    cx.sessions.settle(&c.slot.node_id, c.epoch, &c.slot.assignment_id, c.slot.assignment.revision, false);
                }
                continue;
            }
        };
        for c in batch {
            let pull = if c.pull_wanted().is_some() { credentials.next() } else { None };
            let cx = cx.clone();
            tokio::spawn(async move { push(&cx, &c.socket, c.epoch, c.slot, pull).await });
        }
    }
    Ok(pushed)
}

/// Pushes whose pull credentials are issued in one transaction.
const PULL_BATCH: usize = 256;

/// A push slot taken for an assignment revision.
struct Claimed {
    socket: String,
    epoch: u64,
    slot: Slot,
}

impl Claimed {
    /// The (repository, holder) of the pull credential this push carries, if it carries one.
    fn pull_wanted(&self) -> Option<(&str, &str)> {
        let a = &self.slot.assignment;
        (a.intent == Intent::Run).then_some(())?;
        Some((a.repository.as_deref()?, self.slot.assignment_id.as_str()))
    }
}

/// Whether a slot's assignment is settled on the node (nothing left to tell it).
fn settled(slot: &Slot) -> bool {
    let a = &slot.assignment;
    a.intent == Intent::Remove && a.removed_at.is_some()
}

impl NodeSessions {
    /// Take a push slot for this revision on the node's current session, if it needs one.
    fn claim(&self, node_id: &str, slot: &Slot) -> Option<(String, u64)> {
        if settled(slot) {
            return None;
        }
        let mut current = self.current.lock().expect("current");
        let session = current.get_mut(node_id)?;
        let revision = slot.assignment.revision;
        let id = &slot.assignment_id;
        if session.acked.get(id) == Some(&revision) || session.in_flight.get(id) == Some(&revision) {
            return None;
        }
        if session.in_flight.len() >= MAX_IN_FLIGHT {
            return None;
        }
        session.in_flight.insert(id.clone(), revision);
        Some((session.socket.clone(), session.epoch))
    }

    fn settle(&self, node_id: &str, epoch: u64, assignment_id: &str, revision: u64, accepted: bool) {
        let mut current = self.current.lock().expect("current");
        let Some(session) = current.get_mut(node_id).filter(|s| s.epoch == epoch) else { return };
        session.in_flight.remove(assignment_id);
        if accepted {
            session.acked.insert(assignment_id.into(), revision);
        }
    }

    /// Forget acknowledgements of assignments no slot of the node holds any more.
    fn forget(&self, node_id: &str, keep: &[String]) {
        if let Some(session) = self.current.lock().expect("current").get_mut(node_id) {
            session.acked.retain(|id, _| keep.contains(id));
        }
    }
}

async fn push(cx: &Context, socket: &str, epoch: u64, slot: Slot, pull: Option<capstan_registry::pulls::PullCredential>) {
    let (node_id, assignment_id, revision) = (slot.node_id.clone(), slot.assignment_id.clone(), slot.assignment.revision);
    let accepted = match push_once(cx, socket, &slot, pull).await {
        Ok(()) => true,
        Err(refusal) => {
            tracing::warn!(node = %node_id, assignment = %assignment_id, code = %refusal.code, "an assignment push was not accepted: {}", refusal.message);
            false
        }
    };
    cx.sessions.settle(&node_id, epoch, &assignment_id, revision, accepted);
    if accepted {
        // an acknowledgement frees room for the node's next push
        cx.delivery_wake.notify_one();
    }
}

async fn push_once(cx: &Context, socket: &str, slot: &Slot, pull: Option<capstan_registry::pulls::PullCredential>) -> Result<()> {
    let a = &slot.assignment;
    let mut body = json!({
        "assignmentId": slot.assignment_id,
        "revision": a.revision,
        "serviceId": slot.service_id,
        "slot": slot.slot,
        "intent": a.intent,
        "generation": a.intent.generation(),
        "work": a.work,
    });
    if a.intent == Intent::Run
        && let Some(secrets) = &a.work.secrets
    {
        body["secrets"] = seal_material(cx, socket, slot, secrets).await?;
    }
    if a.intent == Intent::Run {
        // where a capture of a new agent process starts reading the container's log
        let id = slot.assignment_id.as_str();
        if let Some(resume) = crate::logs::resume_of_store(&cx.store, id).await? {
            body["logsFrom"] = serde_json::to_value(resume).map_err(Refusal::internal)?;
        }
    }
    if let Some(credential) = pull {
        body["pull"] = json!({
            "server": cx.registry_host,
            "username": credential.username,
            "password": credential.password.expose(),
            "expiresAt": credential.expires_at,
        });
    }
    let reply = request(cx, socket, "runtime.assign", body, PUSH_TIMEOUT)
        .await
        .map_err(|e| if e.is("node-timeout") { Refusal::new("push-failed", "no answer within the push timeout") } else { e })?;
    match reply.get("result") {
        Some(result) if result.get("accepted") == Some(&Value::Bool(true)) => Ok(()),
        _ => {
            let code = reply.get("error").and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or("reply-malformed");
            Err(Refusal::new("node-refused", format!("the node answered {code}")))
        }
    }
}

/// Send `method` with `body` to the agent on `socket` as a `request` frame (its own socket, or
/// wrapped for the relay carrying it) and wait at most `timeout` for its `reply` frame.
async fn request(cx: &Context, socket: &str, method: &str, body: Value, timeout: Duration) -> Result<Map<String, Value>> {
    let id = format!("rt_{}", cx.sessions.counter.fetch_add(1, Ordering::Relaxed));
    let frame = json!({ "type": "request", "id": id, "method": method, "body": body, "deadlineMs": timeout.as_millis() as u64 });
    let frame_bytes = frame.to_string().len();
    let limit = cx.frames.max_frame_bytes();
    if frame_bytes > limit {
        return Err(Refusal::new("agent-request-too-large", format!("a request to a node is at most {limit} bytes"))
            .with_data(json!({ "limitBytes": limit })));
    }
    let (sender, receiver) = oneshot::channel();
    cx.sessions.waiting.lock().expect("waiting").insert(id.clone(), sender);
    let (to, frame) = cx.sessions.route(socket, frame);
    if !cx.frames.send(&to, frame) {
        cx.sessions.waiting.lock().expect("waiting").remove(&id);
        return Err(Refusal::new("node-not-connected", "the node's socket is gone"));
    }
    match tokio::time::timeout(timeout, receiver).await {
        Ok(Ok(reply)) => Ok(reply),
        _ => {
            cx.sessions.waiting.lock().expect("waiting").remove(&id);
            Err(Refusal::new("node-timeout", format!("the node did not answer {method} within {} ms", timeout.as_millis())).retryable())
        }
    }
}

/// The longest a call to a node's agent may wait for its answer.
pub const MAX_NODE_CALL: Duration = Duration::from_secs(60);

/// Call `method` (a method the node's agent answers: `backups.archive`, `agent.ping`, …) on the
/// agent of `node_id` over its current runtime session held by this process, and wait at most
/// `timeout` (≤ [`MAX_NODE_CALL`]) for its answer: the agent's result, or its refusal as it gave
/// it. `node-not-connected` (retryable) when no session of the node is current here.
pub async fn call_node(cx: &Context, node_id: &str, method: &str, body: Value, timeout: Duration) -> Result<Value> {
    let socket = cx.sessions.current.lock().expect("current").get(node_id).map(|c| c.socket.clone());
    let Some(socket) = socket else {
        return Err(Refusal::new("node-not-connected", format!("node {node_id} has no runtime session with this Capstan now"))
            .with_data(json!({ "nodeId": node_id }))
            .retryable());
    };
    let mut reply = request(cx, &socket, method, body, timeout.min(MAX_NODE_CALL)).await?;
    if let Some(result) = reply.remove("result") {
        return Ok(result);
    }
    // the agent's refusal as it gave it (the relay's agent answers in the same shape)
    Err(capstan_relays::relay_refusal(reply.remove("error")))
}

/// The target a secret value of an assignment is sealed for: the assignment, its service and
/// slot, the manifest its versions were pinned from, and the key.
pub fn material_target(assignment_id: &str, service_id: &str, slot: &str, manifest: u64, key: &str) -> String {
    capstan_core::sealed::target("runtime.assign", &format!("assignment:{assignment_id}"), &format!("{service_id}/{slot}/{manifest}/{key}"))
}

/// The recipient id of a node's recipient generation.
pub fn recipient_id(node_id: &str, generation: u64) -> String {
    format!("node:{node_id}#{generation}")
}

/// Seal a run's pinned secret values to its node's recipient: only the recipient the agent
/// process on this session proved (`recipient-generation-stale` before it has), each value opened
/// under the keyring, sealed, and wiped. Every issuance is recorded in the audit log, value-free.
async fn seal_material(cx: &Context, socket: &str, slot: &Slot, secrets: &crate::slots::WorkSecrets) -> Result<Value> {
    use base64::Engine;
    let node_id = &slot.node_id;
    let nonce = cx.sessions.current.lock().expect("current").get(node_id).filter(|c| c.socket == socket).map(|c| c.nonce.clone());
    let recipient = cx.store.transact(|tx| async move { capstan_nodes::recipients::current(&tx, node_id).await }).await?;
    let stale = || {
        Refusal::new("recipient-generation-stale", "the node's agent has not proven a key for this process yet: sealed after it has")
            .with_data(json!({ "nodeId": node_id }))
    };
    let recipient = recipient.filter(|r| nonce.as_deref() == Some(r.nonce.as_str())).ok_or_else(stale)?;
    let key: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(&recipient.public_key)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Refusal::internal("a stored recipient key does not read"))?;
    let public = x25519_dalek::PublicKey::from(key);
    let to = recipient_id(node_id, recipient.generation);
    let mut values = serde_json::Map::new();
    for (name, pinned) in &secrets.keys {
        let plaintext = capstan_secrets::manifests::open_pinned(&cx.store, &cx.keyring, &pinned.secret_id, &pinned.version_id).await?;
        let target = material_target(&slot.assignment_id, &slot.service_id, &slot.slot, secrets.manifest, name);
        let sealed = capstan_core::sealed::seal_to(&to, &public, &target, &plaintext);
        values.insert(name.clone(), serde_json::to_value(sealed).map_err(Refusal::internal)?);
    }
    let actor = capstan_rpc::audit::Actor { user_id: Some(node_id.clone()), username: None, kind: "node".into() };
    let targets = vec![
        slot.service_id.clone(),
        node_id.clone(),
        slot.assignment_id.clone(),
        format!("manifest:{}", secrets.manifest),
        format!("recipient:{}", recipient.generation),
    ];
    cx.audit.append(capstan_rpc::audit::Record::host("runtime.issueMaterial", actor, targets)).await;
    tracing::info!(node = %node_id, assignment = %slot.assignment_id, manifest = secrets.manifest, generation = recipient.generation, keys = secrets.keys.len(), "secret material sealed to the node's recipient");
    Ok(json!({
        "manifest": secrets.manifest,
        "environment": secrets.environment,
        "recipientGeneration": recipient.generation,
        "values": values,
        "files": secrets.files,
    }))
}

/// Forget what no slot needs any more (after a full delivery pass).
pub async fn forget_retired(cx: &Context) -> Result<()> {
    for node_id in cx.sessions.nodes() {
        let held = cx.store.transact(|tx| {
            let node_id = node_id.clone();
            async move { slots::of_node(&tx, &node_id).await }
        });
        let keep: Vec<String> = held.await?.into_iter().map(|s| s.data.assignment_id).collect();
        cx.sessions.forget(&node_id, &keep);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(n: u32, revision: u64) -> Slot {
        crate::testing::running_slot(&format!("svc_{n}"), "node_1.0", &format!("asg_{n}"), 0, revision)
    }

    fn sessions() -> NodeSessions {
        let sessions = NodeSessions::default();
        sessions.opened("socket_1", "node_1", "token");
        let current = Current {
            socket: "socket_1".into(),
            nonce: "n".into(),
            epoch: 7,
            acked: HashMap::new(),
            in_flight: HashMap::new(),
            challenge: None,
        };
        sessions.current.lock().unwrap().insert("node_1".into(), current);
        sessions
    }

    #[test]
    fn at_most_eight_pushes_are_unanswered_per_node_and_an_acknowledged_revision_is_not_pushed_again() {
        let s = sessions();
        let claimed: Vec<bool> = (0..10).map(|n| s.claim("node_1", &slot(n, 1)).is_some()).collect();
        assert_eq!(claimed, [[true; 8].as_slice(), &[false, false]].concat(), "eight in flight, the rest wait");
        assert!(s.claim("node_1", &slot(0, 1)).is_none(), "a push in flight is not pushed again");
        s.settle("node_1", 7, "asg_0", 1, true);
        assert!(s.claim("node_1", &slot(0, 1)).is_none(), "acknowledged by this session");
        assert!(s.claim("node_1", &slot(0, 2)).is_some(), "a new revision is pushed");
        s.settle("node_1", 7, "asg_1", 1, false);
        assert!(s.claim("node_1", &slot(1, 1)).is_some(), "a refused push is pushed again");
        // another node's sessions are not this one's
        assert!(s.claim("node_2", &slot(9, 1)).is_none());
    }

    #[test]
    fn a_closed_socket_ends_its_nodes_session_and_a_settled_slot_needs_no_push() {
        let s = sessions();
        let mut removed = slot(0, 3);
        removed.assignment.intent = Intent::Remove;
        removed.assignment.removed_at = Some(1);
        assert!(s.claim("node_1", &removed).is_none());
        s.closed("socket_1");
        assert!(!s.is_node("socket_1"));
        assert_eq!(s.count(), 0);
        assert!(s.claim("node_1", &slot(0, 1)).is_none());
    }
}
