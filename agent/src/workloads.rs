//! The node's runtime session (docs/runtime.md): `capstan-agent run` opens Capstan's socket as
//! an `agent` session with its node credential, registers a runtime session under a nonce
//! drawn once per process, takes the assignments Capstan pushes, runs them through the
//! container engine (`engine`), and reports what it observes and the stops and removals it
//! carried out. Capstan decides restarts: a container that exits is reported, never restarted
//! here.
//!
//! After a restart the agent adopts the containers carrying its labels: Capstan pushes every
//! current assignment to the new session, and a labelled container whose assignment Capstan
//! does not know (`assignment-unknown`) is an orphan, stopped and removed.
//!
//! Each running container's log is followed as a capture (`logs`); its batches go out as
//! `runtime.reportLogs` calls once the session is registered, and those not answered are sent
//! again on the next session. A stopped container is removed once its capture's final batch is
//! answered (or after `FINAL_WAIT`).

use crate::engine::{ContainerSpec, Engine, Observed, Phase, PortSpec, Probe, Protocol, PullAuth};
use crate::handler;
use crate::logs::{Answer, Captures, LogsFrom, Sends};
use crate::relay::{PROTOCOL, socket_url, upgrade};
use crate::state::StateDir;
use capstan_core::Refusal;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message;
use zeroize::Zeroizing;

/// How the runtime session runs.
pub struct Options {
    /// The state directory (the node credential).
    pub state: StateDir,
    /// The container engine's endpoint.
    pub engine: String,
    /// Where services' volumes live: volume NAME of service ID is DIR/ID/NAME.
    pub volumes_dir: PathBuf,
    /// The cluster relay carrying the session (`ws://HOST:PORT/`), else Capstan's socket.
    pub relay: Option<String>,
    /// Where secret files live while their container runs: DIR/<assignmentId>/<KEY>, bound
    /// read-only at /run/secrets. A memory-backed tmpfs (/dev/shm by default).
    pub secrets_dir: PathBuf,
    /// What the node answers Capstan's requests with besides `runtime.assign` (`agent.ping`,
    /// `backups.archive`, …: the relay's handlers, for this node's own data).
    pub methods: handler::Registry,
}

/// Requests one session answers at once besides `runtime.assign`; more are refused `agent-busy`.
const MAX_REQUESTS: usize = 16;
/// The frame limit a session keeps its replies under when the welcome names none.
const DEFAULT_MAX_FRAME: usize = (1 << 20) + (16 << 10);

/// Between reconcile passes.
const TICK: Duration = Duration::from_secs(1);
/// How long a container is given to stop.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The least time a replica has to become ready before it is reported unhealthy.
const STARTUP_DEADLINE: Duration = Duration::from_secs(60);
/// How long a labelled container nobody pushed is left alone after a session registers.
const ADOPTION_GRACE: Duration = Duration::from_secs(15);
/// How long a stopped container waits for its capture's final batch to be answered before it
/// is removed regardless.
const FINAL_WAIT: Duration = Duration::from_secs(10);
/// The longest wait between attempts to reach Capstan or the engine.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// An assignment as Capstan pushes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Assignment {
    assignment_id: String,
    revision: u64,
    service_id: String,
    slot: String,
    intent: String,
    work: Work,
    #[serde(default)]
    pull: Option<Pull>,
    #[serde(default)]
    secrets: Option<Sealed>,
    /// Where a capture this process starts reads the container's log from.
    #[serde(default)]
    logs_from: Option<LogsFrom>,
}

/// The secret values of a run, sealed to this process's recipient (docs/runtime.md, "Secret
/// material"): opened only when the container is created, never kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Sealed {
    manifest: u64,
    values: BTreeMap<String, capstan_core::sealed::SealedInput>,
    #[serde(default)]
    files: Vec<String>,
}

/// Where a run's container finds its host-side material.
struct Place<'a> {
    /// This node's id: every replica gets it as `CAPSTAN_CLUSTER_NODE_ID`.
    node_id: &'a str,
    volumes_dir: &'a std::path::Path,
    secrets_dir: &'a std::path::Path,
    recipient: &'a x25519_dalek::StaticSecret,
}

impl Place<'_> {
    /// The directory of an assignment's secret files.
    fn secret_files(&self, assignment_id: &str) -> PathBuf {
        self.secrets_dir.join(assignment_id)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Work {
    image: String,
    #[serde(default)]
    environment: BTreeMap<String, String>,
    #[serde(default)]
    ports: Vec<WorkPort>,
    #[serde(default)]
    volumes: Vec<WorkVolume>,
    #[serde(default)]
    health: Health,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorkPort {
    port: u16,
    protocol: String,
    #[serde(default)]
    public_port: Option<u16>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WorkVolume {
    name: String,
    mount_path: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Health {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    port: Option<u16>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    interval_ms: Option<u64>,
    #[serde(default)]
    threshold: Option<u32>,
}

#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Pull {
    server: String,
    username: String,
    password: String,
}

impl Drop for Pull {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.password);
    }
}

impl std::fmt::Debug for Pull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pull").field("server", &self.server).field("username", &self.username).finish_non_exhaustive()
    }
}

/// What the node said last of an assignment (reported again only when it changes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Said {
    phase: &'static str,
    ready: bool,
    digest: Option<String>,
    cause: Option<String>,
}

/// An assignment this agent holds, and how far it got.
#[derive(Debug)]
struct Held {
    assignment: Assignment,
    container: Option<String>,
    /// A start that failed: not tried again (Capstan decides a new attempt).
    failed: Option<String>,
    said: Option<Said>,
    /// Passing probes in a row; failing probes in a row.
    passes: u32,
    failures: u32,
    next_probe: Instant,
    /// The receipt generation reported and accepted (2 stopped, 3 removed).
    receipted: u32,
    /// When a stop stopped its container, which waits for its capture's final batch.
    stopped_at: Option<Instant>,
}

impl Held {
    fn new(assignment: Assignment) -> Held {
        Held {
            assignment,
            container: None,
            failed: None,
            said: None,
            passes: 0,
            failures: 0,
            next_probe: Instant::now(),
            receipted: 0,
            stopped_at: None,
        }
    }
}

/// A report in flight: which assignment, and what it reported.
#[derive(Debug, Clone)]
enum Pending {
    Observation(String, Said),
    Receipt(String, u32),
    Register,
    /// `runtime.enrollRecipient`: a challenge sealed to this process's key comes back.
    Enroll,
    /// `runtime.proveRecipient`: the key becomes the node's recipient.
    Prove,
    /// `runtime.reportLogs`: a capture's batch, by capture id and sequence.
    Logs(String, u64),
}

/// The X25519 key this agent process draws at start: secret material for its workloads is
/// sealed to it. Its private half lives in this process's memory only (wiped on drop), never on
/// disk or in a log line; a restarted agent draws and proves a new one.
struct Recipient {
    secret: x25519_dalek::StaticSecret,
    /// The generation Capstan recorded for it, once proven.
    generation: Option<u64>,
}

impl Recipient {
    fn draw() -> Recipient {
        let bytes = Zeroizing::new(rand::random::<[u8; 32]>());
        Recipient { secret: x25519_dalek::StaticSecret::from(*bytes), generation: None }
    }

    fn public_key(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(x25519_dalek::PublicKey::from(&self.secret).as_bytes())
    }
}

/// Run the runtime session until `stop` turns true; never exits on a failure.
pub async fn run(options: Options, mut stop: watch::Receiver<bool>) {
    let nonce = nonce();
    let mut recipient = Recipient::draw();
    let mut held: HashMap<String, Held> = HashMap::new();
    let mut captures = Captures::default();
    let mut delay = Duration::from_secs(1);
    let mut engine: Option<Engine> = None;
    loop {
        if engine.is_none() {
            match Engine::connect(&options.engine).await {
                Ok(connected) => {
                    tracing::info!(engine = %connected.describe(), "container engine reached");
                    engine = Some(connected);
                }
                Err(refusal) => tracing::warn!(code = %refusal.code, "{}; workloads wait for it", refusal.message),
            }
        }
        if let Some(engine) = &engine {
            let mut session = Session {
                options: &options,
                engine,
                nonce: &nonce,
                recipient: &mut recipient,
                held: &mut held,
                captures: &mut captures,
                sends: Sends::default(),
                next_id: 1,
                pending: HashMap::new(),
                registered: false,
                node_id: None,
                requests: tokio::task::JoinSet::new(),
                replies: mpsc::channel(MAX_REQUESTS),
                context: None,
                max_frame_bytes: DEFAULT_MAX_FRAME,
            };
            let ended = session.run(&mut stop).await;
            if session.registered {
                delay = Duration::from_secs(1);
            }
            match ended {
                Ok(()) => return,
                Err(why) => tracing::warn!(retry_in = %humantime::format_duration(delay), "runtime session ended: {why}"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
        delay = (delay * 2).min(MAX_BACKOFF);
    }
}

/// A lowercase UUID (v4) naming this process.
fn nonce() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

struct Session<'a> {
    options: &'a Options,
    engine: &'a Engine,
    nonce: &'a str,
    recipient: &'a mut Recipient,
    held: &'a mut HashMap<String, Held>,
    /// The process's log captures (they outlive this session).
    captures: &'a mut Captures,
    /// This session's sending of their batches.
    sends: Sends,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    /// Capstan accepted the registration on this socket.
    registered: bool,
    /// The node this session is (its credential's).
    node_id: Option<String>,
    /// Requests being answered, and where their replies come back to the socket.
    requests: tokio::task::JoinSet<()>,
    replies: (mpsc::Sender<String>, mpsc::Receiver<String>),
    /// What the requests' handlers know of the session.
    context: Option<Arc<handler::RelayContext>>,
    max_frame_bytes: usize,
}

impl Session<'_> {
    /// One socket's session: `Ok` when asked to stop, `Err` (why) when it ended otherwise.
    async fn run(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), String> {
        let credential = self.options.state.read_credential().map_err(|r| format!("{}: {}", r.code, r.message))?;
        self.node_id = Some(credential.node_id.clone());
        let url = match &self.options.relay {
            Some(relay) => relay.clone(),
            None => socket_url(&credential.origin).map_err(|r| r.message.to_string())?,
        };
        let bearer = credential.token.bearer();
        // straight to Capstan the upgrade carries the node's credential (a machine's slot); a
        // relay is told it only in the offer, which it carries
        let request = match &self.options.relay {
            Some(_) => {
                tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url.as_str()).map_err(|e| e.to_string())?
            }
            None => upgrade(&url, &bearer, Some(&credential.node_id))?,
        };
        let (mut ws, _) = tokio::time::timeout(Duration::from_secs(20), tokio_tungstenite::connect_async(request))
            .await
            .map_err(|_| format!("connecting to {url} timed out"))?
            .map_err(|e| format!("connecting to {url} failed: {e}"))?;
        let token = bearer.strip_prefix("Bearer ").unwrap_or(bearer.as_str());
        let offer = Zeroizing::new(
            json!({ "type": "offer", "kind": "agent", "protocols": [PROTOCOL], "node": credential.node_id, "token": token }).to_string(),
        );
        ws.send(Message::text(offer.as_str())).await.map_err(|e| e.to_string())?;
        let welcome = read_frame(&mut ws).await?;
        if welcome["type"] != "welcome" {
            let code = welcome["error"]["code"].as_str().unwrap_or("unknown");
            return Err(format!("the host refused the session: {code}"));
        }
        if let Some(max) = welcome["maxFrameBytes"].as_u64() {
            self.max_frame_bytes = usize::try_from(max).unwrap_or(DEFAULT_MAX_FRAME);
        }
        let methods = self.options.methods.methods();
        self.context = Some(Arc::new(handler::RelayContext::new(credential.node_id.clone(), credential.cluster_id.clone(), methods, None)));
        let id = self
            .call(
                &mut ws,
                "runtime.registerSession",
                json!({ "nodeId": credential.node_id, "nonce": self.nonce, "agentVersion": env!("CARGO_PKG_VERSION") }),
                Pending::Register,
            )
            .await?;
        tracing::debug!(call = id, "runtime session registering");
        let registered_at = Instant::now();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let logs_closed = self.captures.wake();
        loop {
            tokio::select! {
                _ = stop.changed() => {
                    let _ = ws.close(None).await;
                    return Ok(());
                }
                frame = read_frame(&mut ws) => {
                    let frame = frame?;
                    self.frame(&mut ws, frame).await?;
                }
                _ = tick.tick() => {
                    self.reconcile(&mut ws, registered_at.elapsed() >= ADOPTION_GRACE).await?;
                    self.send_logs(&mut ws).await?;
                }
                _ = logs_closed.notified() => self.send_logs(&mut ws).await?,
                Some(reply) = self.replies.1.recv() => ws.send(Message::text(reply)).await.map_err(|e| e.to_string())?,
                Some(_) = self.requests.join_next(), if !self.requests.is_empty() => {}
            }
        }
    }

    async fn call(&mut self, ws: &mut Socket, method: &str, body: Value, pending: Pending) -> Result<u64, String> {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, pending);
        let frame = json!({ "type": "call", "id": id, "method": method, "body": body });
        ws.send(Message::text(frame.to_string())).await.map_err(|e| e.to_string())?;
        Ok(id)
    }

    /// Send the captures' batches that are due on this session, once it is registered.
    async fn send_logs(&mut self, ws: &mut Socket) -> Result<(), String> {
        if !self.registered {
            return Ok(());
        }
        for batch in self.sends.due(self.captures, tokio::time::Instant::now()) {
            let body = serde_json::to_value(&batch).map_err(|e| e.to_string())?;
            self.call(ws, "runtime.reportLogs", body, Pending::Logs(batch.capture_id, batch.sequence)).await?;
        }
        Ok(())
    }

    async fn frame(&mut self, ws: &mut Socket, frame: Value) -> Result<(), String> {
        match frame["type"].as_str() {
            Some("request") if frame["method"] != "runtime.assign" => {
                self.request(&frame);
                Ok(())
            }
            Some("request") => {
                let answer = self.assign(frame["body"].clone());
                let reply = match answer {
                    Ok(result) => json!({ "type": "reply", "id": frame["id"], "result": result }),
                    Err(refusal) => json!({ "type": "reply", "id": frame["id"], "error": refusal }),
                };
                ws.send(Message::text(reply.to_string())).await.map_err(|e| e.to_string())?;
                // act on it at once rather than at the next tick
                self.reconcile(ws, false).await
            }
            Some("result") | Some("error") => {
                let Some(pending) = frame["id"].as_u64().and_then(|id| self.pending.remove(&id)) else { return Ok(()) };
                self.answered(ws, pending, &frame).await
            }
            _ => Ok(()),
        }
    }

    /// Answer a request for one of the node's methods on a task of its own; the reply comes
    /// back through `replies` (a handler that outlives the request's deadline sends none).
    fn request(&mut self, frame: &Value) {
        let Some(context) = self.context.clone() else { return };
        let sender = self.replies.0.clone();
        if self.requests.len() >= MAX_REQUESTS {
            let refusal = Refusal::new("agent-busy", format!("this node answers at most {MAX_REQUESTS} requests at once"))
                .with_data(json!({ "limit": MAX_REQUESTS }))
                .retryable();
            let reply = handler::reply_frame(&frame["id"], Err(refusal), self.max_frame_bytes);
            self.requests.spawn(async move {
                let _ = sender.send(reply).await;
            });
            return;
        }
        let Some(answering) = self.options.methods.answer(context, frame, self.max_frame_bytes) else { return };
        self.requests.spawn(async move {
            if let Some(reply) = answering.await {
                let _ = sender.send(reply).await;
            }
        });
    }

    fn assign(&mut self, body: Value) -> Result<Value, Refusal> {
        let assignment: Assignment =
            serde_json::from_value(body).map_err(|e| Refusal::new("assignment-invalid", format!("the assignment does not read: {e}")))?;
        match self.held.get_mut(&assignment.assignment_id) {
            Some(held) if held.assignment.revision >= assignment.revision => {}
            Some(held) => {
                tracing::info!(assignment = %assignment.assignment_id, slot = %assignment.slot, intent = %assignment.intent, "assignment moved");
                held.assignment = assignment;
            }
            None => {
                tracing::info!(assignment = %assignment.assignment_id, slot = %assignment.slot, intent = %assignment.intent, "assignment received");
                self.held.insert(assignment.assignment_id.clone(), Held::new(assignment));
            }
        }
        Ok(json!({ "accepted": true }))
    }

    async fn answered(&mut self, ws: &mut Socket, pending: Pending, frame: &Value) -> Result<(), String> {
        let refusal = frame.get("error");
        match pending {
            Pending::Register => match refusal {
                None => {
                    self.registered = true;
                    tracing::info!(epoch = %frame["result"]["sessionEpoch"], "runtime session registered");
                    // every session proves this process's key again (a session is this process's)
                    let body = json!({ "publicKey": self.recipient.public_key() });
                    self.call(ws, "runtime.enrollRecipient", body, Pending::Enroll).await?;
                    // what the last session left unanswered goes again
                    self.send_logs(ws).await?;
                }
                Some(error) => tracing::warn!(code = %error["code"], "the runtime session was refused: {}", error["message"]),
            },
            Pending::Enroll => match refusal {
                None => {
                    let result = &frame["result"];
                    let (Some(node), Some(challenge_id)) = (self.node_id.clone(), result["challengeId"].as_str()) else {
                        return Err("the recipient challenge does not read".into());
                    };
                    let sealed: capstan_core::sealed::SealedInput = serde_json::from_value(result["challenge"].clone())
                        .map_err(|_| "the recipient challenge does not read".to_string())?;
                    let target = capstan_core::sealed::target("runtime.enrollRecipient", &format!("node:{node}"), challenge_id);
                    let answer = capstan_core::sealed::open_as(&self.recipient.secret, &target, &sealed)
                        .map_err(|r| format!("the recipient challenge does not open: {}", r.code))?;
                    use base64::Engine;
                    let answer = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(answer.as_slice()));
                    let body = json!({ "challengeId": challenge_id, "answer": answer.as_str() });
                    self.call(ws, "runtime.proveRecipient", body, Pending::Prove).await?;
                }
                Some(error) => tracing::warn!(code = %error["code"], reason = %error["data"]["reason"], "the recipient was refused"),
            },
            Pending::Prove => match refusal {
                None => {
                    let generation = frame["result"]["generation"].as_u64();
                    self.recipient.generation = generation;
                    tracing::info!(generation, "node recipient enrolled");
                }
                Some(error) => tracing::warn!(code = %error["code"], reason = %error["data"]["reason"], "the recipient proof was refused"),
            },
            Pending::Observation(id, said) => match refusal {
                None => {
                    if let Some(held) = self.held.get_mut(&id) {
                        held.said = Some(said);
                    }
                }
                Some(error) if error["data"]["reason"] == "assignment-unknown" => self.orphaned(&id).await,
                Some(error) => tracing::warn!(assignment = %id, reason = %error["data"]["reason"], "an observation was refused"),
            },
            Pending::Receipt(id, generation) => match refusal {
                None => {
                    if generation == 3 {
                        self.held.remove(&id);
                    } else if let Some(held) = self.held.get_mut(&id) {
                        held.receipted = generation;
                    }
                }
                Some(error) if error["data"]["reason"] == "assignment-unknown" => {
                    self.held.remove(&id);
                }
                Some(error) => tracing::warn!(assignment = %id, reason = %error["data"]["reason"], "a receipt was refused"),
            },
            Pending::Logs(capture, sequence) => {
                let answer = match refusal {
                    None if frame["result"]["accepted"] == true => Answer::Accepted,
                    None => Answer::Refused("not-accepted"),
                    Some(error) => Answer::Refused(error["data"]["reason"].as_str().unwrap_or("")),
                };
                if let Answer::Refused(reason) = answer {
                    tracing::debug!(capture = %capture, sequence, reason, "a log batch was refused");
                }
                self.sends.answered(self.captures, &capture, sequence, answer, tokio::time::Instant::now());
                // the capture's next batch goes at once
                self.send_logs(ws).await?;
            }
        }
        Ok(())
    }

    /// Capstan knows no assignment `id`: whatever carries it goes.
    async fn orphaned(&mut self, id: &str) {
        self.held.remove(id);
        self.captures.stop(id);
        if let Ok(containers) = self.engine.list().await {
            for container in containers.iter().filter(|c| c.assignment_id == id) {
                tracing::info!(assignment = %id, container = %container.container_id, "removing a container Capstan no longer assigns");
                if let Err(refusal) = self.engine.stop_and_remove(&container.container_id, STOP_GRACE).await {
                    tracing::warn!(code = %refusal.code, "removing an orphan failed: {}", refusal.message);
                }
            }
        }
        forget_secret_files(&self.options.secrets_dir.join(id));
    }

    /// Make every held assignment true, and report what changed.
    async fn reconcile(&mut self, ws: &mut Socket, adopt: bool) -> Result<(), String> {
        let containers = match self.engine.list().await {
            Ok(containers) => containers,
            Err(refusal) => return Err(format!("{}: {}", refusal.code, refusal.message)),
        };
        let ids: Vec<String> = self.held.keys().cloned().collect();
        for id in ids {
            let found = containers.iter().find(|c| c.assignment_id == id).cloned();
            let Some(held) = self.held.get_mut(&id) else { continue };
            let place = Place {
                node_id: self.node_id.as_deref().unwrap_or_default(),
                volumes_dir: &self.options.volumes_dir,
                secrets_dir: &self.options.secrets_dir,
                recipient: &self.recipient.secret,
            };
            let step = step(self.engine, &place, self.captures, held, found).await;
            match step {
                Step::Observe(said) => {
                    let in_flight = self.pending.values().any(|p| matches!(p, Pending::Observation(i, s) if i == &id && s == &said));
                    if held.said.as_ref() != Some(&said) && !in_flight {
                        let body = json!({ "assignmentId": id, "generation": 1, "phase": said.phase, "ready": said.ready,
                                           "imageDigest": said.digest, "restartCount": 0, "cause": said.cause, "observedAt": now_ms() });
                        self.call(ws, "runtime.reportObservation", body, Pending::Observation(id.clone(), said)).await?;
                    }
                }
                Step::Receipt(generation) => {
                    let in_flight = self.pending.values().any(|p| matches!(p, Pending::Receipt(i, g) if i == &id && *g == generation));
                    if !in_flight {
                        let body = json!({ "assignmentId": id, "generation": generation });
                        self.call(ws, "runtime.reportReceipt", body, Pending::Receipt(id.clone(), generation)).await?;
                    }
                }
                Step::Nothing => {}
            }
        }
        if adopt {
            // labelled containers no assignment names: asked about once; an unknown one is removed
            let unknown: Vec<&Observed> =
                containers.iter().filter(|c| !c.assignment_id.is_empty() && !self.held.contains_key(&c.assignment_id)).collect();
            for container in unknown {
                let asked = self.pending.values().any(|p| matches!(p, Pending::Observation(i, _) if i == &container.assignment_id));
                if !asked {
                    let said = observed_said(container, false);
                    let body = json!({ "assignmentId": container.assignment_id, "generation": 1, "phase": said.phase, "ready": false,
                                       "imageDigest": said.digest, "restartCount": 0, "cause": said.cause, "observedAt": now_ms() });
                    self.call(ws, "runtime.reportObservation", body, Pending::Observation(container.assignment_id.clone(), said)).await?;
                }
            }
        }
        let held = &*self.held;
        self.captures.forget(|id| held.contains_key(id));
        Ok(())
    }
}

/// What a reconcile of one assignment asks to report.
enum Step {
    Observe(Said),
    Receipt(u32),
    Nothing,
}

fn said(phase: &'static str, ready: bool, digest: Option<String>, cause: Option<String>) -> Said {
    Said { phase, ready, digest, cause }
}

/// What the engine's view of a container says, before any probe.
fn observed_said(container: &Observed, ready: bool) -> Said {
    match container.phase {
        Phase::Running => said("running", ready, container.image_digest.clone(), None),
        Phase::Created => said("starting", false, container.image_digest.clone(), None),
        Phase::Exited | Phase::Dead => said("exited", false, container.image_digest.clone(), container.cause.clone()),
        Phase::Unknown => said(
            "failed",
            false,
            container.image_digest.clone(),
            container.cause.clone().or(Some("the engine reports an unknown state".into())),
        ),
    }
}

async fn step(engine: &Engine, place: &Place<'_>, captures: &mut Captures, held: &mut Held, found: Option<Observed>) -> Step {
    match held.assignment.intent.as_str() {
        "run" => run_step(engine, place, captures, held, found).await,
        "stop" | "remove" => {
            let generation = if held.assignment.intent == "stop" { 2 } else { 3 };
            if held.receipted >= generation {
                return Step::Nothing;
            }
            if let Some(container) = found.as_ref().map(|c| c.container_id.clone()).or(held.container.clone()) {
                if !log_read_to_end(engine, captures, held, &container).await {
                    return Step::Nothing;
                }
                if let Err(refusal) = engine.stop_and_remove(&container, STOP_GRACE).await {
                    tracing::warn!(code = %refusal.code, "stopping a container failed: {}", refusal.message);
                    return Step::Nothing;
                }
                tracing::info!(assignment = %held.assignment.assignment_id, slot = %held.assignment.slot, "container stopped and removed");
                held.container = None;
            }
            forget_secret_files(&place.secret_files(&held.assignment.assignment_id));
            // a stop removes too: its removal receipt follows as soon as Capstan asks for it
            Step::Receipt(generation)
        }
        _ => Step::Nothing,
    }
}

/// Whether a stopping container's log has been read to the end: its capture's final batch
/// answered, or `FINAL_WAIT` passed since it was stopped (or it has no capture). The first call
/// stops the container and tells the capture to finish; until then the step waits.
async fn log_read_to_end(engine: &Engine, captures: &mut Captures, held: &mut Held, container: &str) -> bool {
    let id = &held.assignment.assignment_id;
    if !captures.sending(id) {
        return true;
    }
    if let Some(stopped_at) = held.stopped_at {
        let waited = stopped_at.elapsed() >= FINAL_WAIT;
        if waited {
            tracing::warn!(assignment = %id, "the capture's final log batch is not answered after {} s; the container goes", FINAL_WAIT.as_secs());
        }
        return waited;
    }
    match engine.stop(container, STOP_GRACE).await {
        Ok(()) => {}
        Err(refusal) if refusal.code == "engine-unreachable" => {
            tracing::warn!(code = %refusal.code, "stopping a container failed: {}", refusal.message);
            return false;
        }
        Err(refusal) => {
            // removed by force: its capture reads what the engine still gives
            tracing::warn!(code = %refusal.code, "stopping a container failed: {}", refusal.message);
            captures.finish(id);
            return true;
        }
    }
    tracing::info!(assignment = %id, slot = %held.assignment.slot, "container stopped; its log is read to the end");
    captures.finish(id);
    held.stopped_at = Some(Instant::now());
    false
}

async fn run_step(engine: &Engine, place: &Place<'_>, captures: &mut Captures, held: &mut Held, found: Option<Observed>) -> Step {
    if let Some(cause) = &held.failed {
        return Step::Observe(said("failed", false, None, Some(cause.clone())));
    }
    let container = match found {
        Some(container) => {
            held.container = Some(container.container_id.clone());
            captures.follow(engine, &held.assignment.assignment_id, &container.container_id, held.assignment.logs_from.as_ref());
            container
        }
        None if held.container.is_some() => {
            // it was there and is gone (removed behind the agent's back, or the engine lost it)
            held.failed = Some("the container is gone".into());
            return Step::Observe(said("failed", false, None, held.failed.clone()));
        }
        None => match start(engine, place, &held.assignment).await {
            Ok(id) => {
                tracing::info!(assignment = %held.assignment.assignment_id, slot = %held.assignment.slot, container = %id, "container started");
                held.container = Some(id.clone());
                captures.follow(engine, &held.assignment.assignment_id, &id, held.assignment.logs_from.as_ref());
                match engine.observe(&id).await {
                    Ok(Some(container)) => container,
                    _ => return Step::Observe(said("starting", false, None, None)),
                }
            }
            Err(cause) => {
                tracing::warn!(assignment = %held.assignment.assignment_id, "starting failed: {cause}");
                held.failed = Some(cause.clone());
                return Step::Observe(said("failed", false, None, Some(cause)));
            }
        },
    };
    if container.phase != Phase::Running {
        return Step::Observe(observed_said(&container, false));
    }
    let health = &held.assignment.work.health;
    let probe = match (health.kind.as_str(), health.port) {
        ("tcp", Some(port)) => Some(Probe::Tcp { port }),
        ("http", Some(port)) => Some(Probe::Http { port, path: health.path.clone().unwrap_or_else(|| "/".into()) }),
        _ => None,
    };
    let Some(probe) = probe else { return Step::Observe(observed_said(&container, true)) };
    if Instant::now() >= held.next_probe {
        let interval = Duration::from_millis(health.interval_ms.unwrap_or(5_000));
        // until the first pass, probe every second so readiness shows promptly
        held.next_probe = Instant::now() + if held.passes == 0 { Duration::from_secs(1) } else { interval };
        let target = container.address.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        match crate::engine::probe(&probe, target).await {
            Ok(()) => {
                held.passes += 1;
                held.failures = 0;
            }
            Err(why) => {
                held.failures += 1;
                if held.passes > 0 && held.failures >= health.threshold.unwrap_or(3) {
                    return Step::Observe(said(
                        "unhealthy",
                        false,
                        container.image_digest.clone(),
                        Some(format!("health check failing: {why}")),
                    ));
                }
                // a replica that never becomes ready is as failed as one that stopped being so:
                // Capstan replaces it after the backoff rather than it waiting unready for ever
                let deadline = startup_probes(health);
                if held.passes == 0 && held.failures >= deadline {
                    return Step::Observe(said(
                        "unhealthy",
                        false,
                        container.image_digest.clone(),
                        Some(format!("never became ready: health check failing for {deadline} s: {why}")),
                    ));
                }
            }
        }
    }
    let ready = held.passes > 0 && held.failures == 0;
    Step::Observe(observed_said(&container, ready))
}

/// Probes (one a second) a replica has to pass its health check for the first time: the
/// longer of a minute and what `threshold` failures at the check's interval take.
fn startup_probes(health: &Health) -> u32 {
    let interval_s = health.interval_ms.unwrap_or(5_000).div_ceil(1_000);
    let threshold = u64::from(health.threshold.unwrap_or(3));
    u32::try_from((threshold * interval_s).max(STARTUP_DEADLINE.as_secs())).unwrap_or(u32::MAX)
}

/// The variable every replica finds its node's id in (the cluster ingress registers with it).
const NODE_ID_VARIABLE: &str = "CAPSTAN_CLUSTER_NODE_ID";

/// Pull the image and start the container; the cause in words when it fails.
async fn start(engine: &Engine, place: &Place<'_>, assignment: &Assignment) -> Result<String, String> {
    let volumes_dir = place.volumes_dir;
    let auth =
        assignment.pull.as_ref().map(|p| PullAuth { username: p.username.clone(), password: p.password.clone(), server: p.server.clone() });
    engine.pull(&assignment.work.image, auth.as_ref()).await.map_err(|r| format!("image pull failed: {}", r.message))?;
    let work = &assignment.work;
    let ports = work
        .ports
        .iter()
        .filter_map(|p| {
            let protocol = if p.protocol == "udp" { Protocol::Udp } else { Protocol::Tcp };
            p.public_port.map(|host| PortSpec { container_port: p.port, protocol, host_port: Some(host), host_ip: None })
        })
        .collect();
    let volumes = work.volumes.iter().map(|v| (volumes_dir.join(&assignment.service_id).join(&v.name), v.mount_path.clone())).collect();
    let (mut environment, secrets_dir) = match &assignment.secrets {
        Some(sealed) => deliver_secrets(place, assignment, sealed)?,
        None => (work.environment.clone(), None),
    };
    // where it runs: the node's own id, whatever the service's environment says
    if !place.node_id.is_empty() {
        environment.insert(NODE_ID_VARIABLE.to_string(), place.node_id.to_string());
    }
    let spec = ContainerSpec {
        service_id: assignment.service_id.clone(),
        slot: assignment.slot.clone(),
        assignment_id: assignment.assignment_id.clone(),
        image: work.image.clone(),
        environment,
        ports,
        volumes,
        command: None,
        secrets_dir,
    };
    let started = engine.start(&spec).await.map_err(|r| format!("{}: {}", r.code, r.message));
    if started.is_err() {
        forget_secret_files(&place.secret_files(&assignment.assignment_id));
    }
    started
}

/// Open a run's sealed values: environment variables merged over the service's plain ones, and
/// the keys listed as files written (0400) into the assignment's directory under the secrets
/// directory. The values never touch the state or volumes directories.
fn deliver_secrets(
    place: &Place<'_>,
    assignment: &Assignment,
    sealed: &Sealed,
) -> Result<(BTreeMap<String, String>, Option<PathBuf>), String> {
    let mut environment = assignment.work.environment.clone();
    let dir = place.secret_files(&assignment.assignment_id);
    let mut wrote = false;
    for (key, value) in &sealed.values {
        let target = capstan_core::sealed::target(
            "runtime.assign",
            &format!("assignment:{}", assignment.assignment_id),
            &format!("{}/{}/{}/{key}", assignment.service_id, assignment.slot, sealed.manifest),
        );
        let plaintext = capstan_core::sealed::open_as(place.recipient, &target, value)
            .map_err(|r| format!("the secret material for {key} does not open with this process's key ({})", r.code))?;
        if sealed.files.contains(key) {
            write_secret_file(&dir, key, &plaintext).map_err(|e| format!("writing the secret file {key} failed: {e}"))?;
            wrote = true;
        } else {
            let text = String::from_utf8(plaintext.to_vec())
                .map_err(|_| format!("the secret {key} is not UTF-8 text: deliver it as a file (runtime spec secrets.files)"))?;
            environment.insert(key.clone(), text);
        }
    }
    Ok((environment, wrote.then_some(dir)))
}

/// Write one secret file, readable by its owner only, in a private directory.
fn write_secret_file(dir: &std::path::Path, key: &str, value: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let path = dir.join(key);
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o400).open(&path)?;
    file.write_all(value)
}

/// Remove an assignment's secret files (there may be none).
fn forget_secret_files(dir: &std::path::Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %dir.display(), "removing secret files failed: {e}"),
    }
}

async fn read_frame(ws: &mut Socket) -> Result<Value, String> {
    loop {
        match ws.next().await {
            None => return Err("the host dropped the connection".into()),
            Some(Err(e)) => return Err(format!("reading from the socket failed: {e}")),
            Some(Ok(Message::Text(text))) => {
                return serde_json::from_str(text.as_str()).map_err(|_| "the host sent a frame that is not JSON".to_string());
            }
            Some(Ok(Message::Close(frame))) => {
                let why = frame.map(|f| format!("{} {}", u16::from(f.code), f.reason)).unwrap_or_default();
                return Err(format!("the host closed the session ({why})"));
            }
            Some(Ok(_)) => continue,
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_has_a_minute_or_threshold_intervals_to_become_ready() {
        let health = |interval_ms, threshold| Health { interval_ms: Some(interval_ms), threshold: Some(threshold), ..Health::default() };
        assert_eq!(startup_probes(&Health::default()), 60, "defaults: 3 x 5 s is under a minute");
        assert_eq!(startup_probes(&health(30_000, 5)), 150, "5 x 30 s");
        assert_eq!(startup_probes(&health(1_500, 1)), 60);
    }

    #[test]
    fn the_nonce_is_a_lowercase_uuid_drawn_anew() {
        let (a, b) = (nonce(), nonce());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.as_bytes()[14], b'4', "version 4: {a}");
        assert!(a.bytes().enumerate().all(|(i, c)| if [8, 13, 18, 23].contains(&i) {
            c == b'-'
        } else {
            c.is_ascii_hexdigit() && !c.is_ascii_uppercase()
        }));
    }

    #[test]
    fn an_assignment_reads_as_capstan_pushes_it_and_its_password_is_never_printed() {
        let body = json!({ "assignmentId": "asg_1", "revision": 2, "serviceId": "svc_1", "slot": "node_1.0", "intent": "run", "generation": 1,
            "work": { "image": "capstan.test/workloads/web-1@sha256:00", "environment": { "A": "b" },
                      "ports": [{ "port": 8080, "protocol": "tcp", "publicPort": 18080 }], "volumes": [{ "name": "data", "mountPath": "/data" }],
                      "health": { "kind": "http", "port": 8080, "path": "/", "intervalMs": 5000, "threshold": 3 }, "restart": "on-failure" },
            "pull": { "server": "capstan.test", "username": "capstan-pull.pcr_1", "password": "capstan_pull_secret", "expiresAt": 1 } });
        let assignment: Assignment = serde_json::from_value(body).unwrap();
        assert_eq!(assignment.work.ports[0].public_port, Some(18080));
        assert_eq!(assignment.work.health.kind, "http");
        let shown = format!("{assignment:?}");
        assert!(!shown.contains("capstan_pull_secret"), "{shown}");
    }

    #[test]
    fn sealed_secrets_open_with_this_process_key_into_the_environment_and_private_files() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let secret = x25519_dalek::StaticSecret::from([3u8; 32]);
        let public = x25519_dalek::PublicKey::from(&secret);
        let body = json!({ "assignmentId": "asg_7", "revision": 1, "serviceId": "svc_1", "slot": "node_1.0", "intent": "run",
            "work": { "image": "capstan.test/workloads/web-1@sha256:00", "environment": { "A": "plain" } } });
        let assignment: Assignment = serde_json::from_value(body).unwrap();
        let seal = |key: &str, value: &[u8], slot: &str| {
            let target = capstan_core::sealed::target("runtime.assign", "assignment:asg_7", &format!("svc_1/{slot}/4/{key}"));
            capstan_core::sealed::seal_to("node:node_1#2", &public, &target, value)
        };
        let values: BTreeMap<String, capstan_core::sealed::SealedInput> = [
            ("DB_PASSWORD".to_string(), seal("DB_PASSWORD", b"planted-env-value", "node_1.0")),
            ("TLS_KEY".to_string(), seal("TLS_KEY", &[0xff, 0x00, 0x10], "node_1.0")),
        ]
        .into();
        let sealed = Sealed { manifest: 4, values, files: vec!["TLS_KEY".into()] };
        let place = Place { node_id: "node_a", volumes_dir: root.path(), secrets_dir: &root.path().join("secrets"), recipient: &secret };
        let (environment, dir) = deliver_secrets(&place, &assignment, &sealed).unwrap();
        assert_eq!(environment["A"], "plain");
        assert_eq!(environment["DB_PASSWORD"], "planted-env-value");
        assert!(!environment.contains_key("TLS_KEY"), "a file key is no variable");
        let dir = dir.expect("a files directory");
        assert_eq!(dir, root.path().join("secrets/asg_7"));
        assert_eq!(std::fs::read(dir.join("TLS_KEY")).unwrap(), [0xff, 0x00, 0x10]);
        assert_eq!(std::fs::metadata(dir.join("TLS_KEY")).unwrap().permissions().mode() & 0o777, 0o400);
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        forget_secret_files(&dir);
        assert!(!dir.exists());

        // another process's key, or a value sealed for another slot, does not open
        let other = x25519_dalek::StaticSecret::from([4u8; 32]);
        let elsewhere = Place { recipient: &other, ..place };
        assert!(deliver_secrets(&elsewhere, &assignment, &sealed).unwrap_err().contains("does not open"));
        let moved =
            Sealed { manifest: 4, values: [("DB_PASSWORD".to_string(), seal("DB_PASSWORD", b"x", "node_1.1"))].into(), files: vec![] };
        assert!(deliver_secrets(&place, &assignment, &moved).unwrap_err().contains("does not open"));
        // bytes that are no text cannot be an environment variable
        let binary = Sealed { manifest: 4, values: [("TLS_KEY".to_string(), seal("TLS_KEY", &[0xff], "node_1.0"))].into(), files: vec![] };
        assert!(deliver_secrets(&place, &assignment, &binary).unwrap_err().contains("not UTF-8"));
    }

    #[test]
    fn what_the_engine_says_becomes_the_words_capstan_reads() {
        let mut container = Observed {
            container_id: "c1".into(),
            service_id: "svc_1".into(),
            slot: "node_1.0".into(),
            assignment_id: "asg_1".into(),
            phase: Phase::Running,
            exit_code: None,
            started_at: None,
            finished_at: None,
            image_digest: Some("sha256:ab".into()),
            address: None,
            published: vec![],
            cause: None,
        };
        assert_eq!(observed_said(&container, true), said("running", true, Some("sha256:ab".into()), None));
        container.phase = Phase::Exited;
        container.cause = Some("exited with status 1".into());
        assert_eq!(observed_said(&container, true), said("exited", false, Some("sha256:ab".into()), Some("exited with status 1".into())));
    }
}
