//! Cluster relays, in one place (docs/relays.md): a cluster's relay credential
//! ([`credentials`], `relays.*` of the bearer), its registration and liveness as the store keeps
//! them ([`registrations`]), and the relays this fleet node holds — their registration over the
//! socket, the one election everything that must reach a cluster goes through, requests to the
//! elected relay wherever in the fleet it is connected ([`forward`]) and the configuration
//! pushed to it.
//!
//! What must survive a restart or be seen by every fleet node is in the store: the registration
//! record and one row per registered socket, renewed while the socket is open. What only this
//! process can know — which socket is which relay, the sequence a socket counted, the requests
//! waiting for a reply — is here, in memory, and dies with the socket. The sockets themselves are
//! the server's; relays reach them through [`Sessions`].

pub mod credentials;
pub mod forward;
pub mod methods;
pub mod registrations;

use capstan_core::refusal::{Refusal, Result};
use capstan_store::Store;
use registrations::{RegisterInput, Socket};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use zeroize::Zeroizing;

/// The close code of a relay session whose bearer was rotated away
/// (`relay-credential-generation-stale`).
pub const CLOSE_CREDENTIAL_STALE: u16 = 4011;

/// The socket sessions relays ride on (the server's hub), as relays use them.
pub trait Sessions: Send + Sync {
    /// Queue `frame` for the open session `id`; `false` when it is not open.
    fn send(&self, id: &str, frame: String) -> bool;
    /// End the session `id` with the close `code` and `reason`.
    fn end(&self, id: &str, code: u16, reason: &'static str);
    /// Push `topic` with `body` to the administrators' sessions on this node.
    fn push_to_admins(&self, topic: &str, body: &Value);
    /// The largest frame a session takes.
    fn max_frame_bytes(&self) -> usize;
}

/// Declare the relays' collections (credentials, export receipts, bearers, registrations,
/// sockets).
pub async fn declare(store: &Store) -> Result<()> {
    credentials::declare(store).await
}

/// Register every `relays.*` method: the credential's (over the secrets) and the sockets'.
pub fn register(registry: &mut capstan_rpc::Registry, secrets: capstan_secrets::methods::Context, relays: Arc<Relays>) {
    credentials::register(registry, secrets);
    methods::register(registry, relays);
}

/// The push topic of a cluster's configuration.
pub const CONFIG_TOPIC: &str = "relay.config";
/// What a caller is told to wait before asking a cluster without a connected relay again.
pub const RETRY_AFTER_MS: u64 = 5_000;
/// The longest a request to a relay may wait for its reply.
pub const MAX_DEADLINE: Duration = Duration::from_secs(60);
/// How often this node reads the outbox for changes its relays' configuration follows.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// A relay session on this node, from its welcome to its close.
struct Held {
    cluster_id: String,
    /// The bearer the session opened with, judged again on every frame (rotation has no overlap).
    bearer: Zeroizing<Vec<u8>>,
    /// The last sequence this socket had accepted (0 before its first registration).
    last_sequence: u64,
    /// The digest of the configuration last pushed to it.
    pushed: Option<String>,
    /// Held while a registration of this socket is judged, so two cannot pass one sequence.
    registering: Arc<tokio::sync::Mutex<()>>,
}

/// A request waiting for its reply.
struct Waiting {
    session_id: String,
    reply: oneshot::Sender<Map<String, Value>>,
}

/// The relays of this fleet node.
pub struct Relays {
    store: Store,
    sessions: Arc<dyn Sessions>,
    fleet_node_id: String,
    held: Mutex<HashMap<String, Held>>,
    waiting: Mutex<HashMap<String, Waiting>>,
    /// The outbox position the configuration pushes follow from; unknown while no relay is held.
    after: tokio::sync::Mutex<Option<u64>>,
    peers: forward::Peers,
    /// How node calls carried here are answered (the runtime's, set at assembly).
    node_calls: std::sync::OnceLock<Arc<dyn forward::NodeCalls>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().expect("the relay tables are never poisoned")
}

/// The refusal for a cluster no socket carries the relay of.
pub fn not_connected(cluster_id: &str) -> Refusal {
    Refusal::new("relay-not-connected", format!("no relay of cluster {} is connected", capstan_core::text::truncate(cluster_id, 64)))
        .with_data(json!({ "clusterId": capstan_core::text::truncate(cluster_id, 64), "retryAfterMs": RETRY_AFTER_MS }))
        .retryable()
}

/// The cluster and credential a relay's bearer verifies as, and the identity its session acts
/// as: the cluster's machine user.
pub async fn identify(store: &Store, bearer: &[u8]) -> Result<(credentials::Verified, capstan_rpc::Identity)> {
    let verified = registrations::identify(store, bearer).await?;
    let cluster_id = verified.cluster_id.as_str();
    let user = store
        .transact(|tx| async move {
            let cluster = capstan_inventory::clusters::require_cluster(&tx, cluster_id).await?;
            let user = tx.get(capstan_auth::USERS, &cluster.data.machine_user_id).await?;
            Ok(user.map(|u| (cluster.data.machine_user_id, u.data)))
        })
        .await?;
    let Some((user_id, user)) = user else { return Err(capstan_rpc::denied()) };
    let now = capstan_core::clock::now_ms();
    let identity = capstan_rpc::Identity {
        user_id,
        username: user["username"].as_str().unwrap_or_default().into(),
        kind: "machine".into(),
        admin: false,
        session_id: format!("relay:{cluster_id}"),
        authenticated_at: now,
        // a relay's bearer has no lifetime; its generation is judged on every frame instead
        expires_at: u64::MAX,
    };
    Ok((verified, identity))
}

impl Relays {
    /// The relays of the fleet node `fleet_node_id`, whose sessions live in `sessions`.
    pub fn new(store: Store, sessions: Arc<dyn Sessions>, fleet_node_id: String, peers: forward::Peers) -> Arc<Relays> {
        Arc::new(Relays {
            store,
            sessions,
            fleet_node_id,
            held: Mutex::default(),
            waiting: Mutex::default(),
            after: tokio::sync::Mutex::new(None),
            peers,
            node_calls: std::sync::OnceLock::new(),
        })
    }

    /// The fleet node these relays are held by.
    pub fn fleet_node_id(&self) -> &str {
        &self.fleet_node_id
    }

    /// A relay session was welcomed, verified as `cluster_id`'s by `bearer`.
    pub fn opened(&self, session_id: &str, cluster_id: &str, bearer: &[u8]) {
        let held = Held {
            cluster_id: cluster_id.into(),
            bearer: Zeroizing::new(bearer.to_vec()),
            last_sequence: 0,
            pushed: None,
            registering: Arc::default(),
        };
        lock(&self.held).insert(session_id.into(), held);
    }

    /// A session ended: its row goes, and the requests waiting on it are answered
    /// `relay-not-connected` (their senders drop).
    pub async fn closed(&self, session_id: &str) {
        let Some(held) = lock(&self.held).remove(session_id) else { return };
        lock(&self.waiting).retain(|_, w| w.session_id != session_id);
        if held.last_sequence > 0 {
            if let Err(e) = registrations::forget(&self.store, session_id).await {
                tracing::warn!(code = %e.code, cluster = %held.cluster_id, "a closed relay socket's row stays until it ages out: {}", e.message);
            }
            self.announce(&held.cluster_id);
        }
    }

    /// Tell the administrators' sessions on this node that a relay of `cluster_id` came or went
    /// (`relay.sessionChanged`; the dashboard reads `relays.list` again).
    fn announce(&self, cluster_id: &str) {
        self.sessions.push_to_admins("relay.sessionChanged", &json!({ "clusterId": cluster_id }));
    }

    /// How many relay sessions this node holds (`/metrics`).
    pub fn held_count(&self) -> usize {
        lock(&self.held).len()
    }

    /// Whether `session_id` is a relay session of this node.
    pub fn is_relay(&self, session_id: &str) -> bool {
        lock(&self.held).contains_key(session_id)
    }

    /// The bearer a session opened with is judged again: a replaced generation ends the session
    /// (`relay-credential-generation-stale`, close 4011) and is refused.
    pub async fn check(&self, session_id: &str) -> Result<String> {
        let (cluster_id, bearer) = {
            let held = lock(&self.held);
            let held = held.get(session_id).ok_or_else(unverified)?;
            (held.cluster_id.clone(), held.bearer.clone())
        };
        match credentials::verify(&self.store, &cluster_id, &bearer).await {
            Ok(_) => Ok(cluster_id),
            Err(refusal) => {
                tracing::info!(cluster = %cluster_id, code = %refusal.code, "a relay session's credential no longer holds: closed");
                self.sessions.end(session_id, CLOSE_CREDENTIAL_STALE, "relay-credential-generation-stale");
                Err(refusal)
            }
        }
    }

    /// `relays.register` from the session `session_id`.
    pub async fn register(&self, session_id: &str, body: Value) -> Result<Value> {
        let cluster_id = self.check(session_id).await?;
        let input: RegisterInput = serde_json::from_value(body).map_err(|e| Refusal::invalid_request(format!("relays.register: {e}")))?;
        input.check()?;
        let registering = lock(&self.held).get(session_id).ok_or_else(unverified)?.registering.clone();
        let _one_at_a_time = registering.lock().await;
        let (last, bearer) = {
            let held = lock(&self.held);
            let held = held.get(session_id).ok_or_else(unverified)?;
            (held.last_sequence, held.bearer.clone())
        };
        if input.sequence <= last {
            return Err(Refusal::new(
                "relay-sequence-stale",
                format!("this socket's last accepted registration was sequence {last}: count on from there"),
            )
            .with_data(json!({ "lastSequence": last })));
        }
        // the changes from here on are followed (the outbox is read only while relays are held)
        {
            let mut after = self.after.lock().await;
            if after.is_none() {
                *after = Some(capstan_events::head(&self.store).await?);
            }
        }
        let socket = Socket { session_id, fleet_node_id: &self.fleet_node_id };
        let accepted = registrations::register(&self.store, &cluster_id, &bearer, &input, socket).await?;
        let still_open = match lock(&self.held).get_mut(session_id) {
            Some(held) => {
                held.last_sequence = input.sequence;
                true
            }
            None => false,
        };
        if !still_open {
            // closed meanwhile: its row must not outlive it
            let _ = registrations::forget(&self.store, session_id).await;
            return Err(unverified());
        }
        tracing::info!(cluster = %cluster_id, node = %input.node_id, sequence = input.sequence, "relay registered");
        self.announce(&cluster_id);
        // the current configuration first, then the answer
        self.push_to(session_id, &cluster_id, true).await?;
        serde_json::to_value(accepted).map_err(Refusal::internal)
    }

    /// A `reply` frame from `session_id`.
    pub fn reply(&self, session_id: &str, frame: Map<String, Value>) {
        let id = frame.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
        let waiting = {
            let mut waiting = lock(&self.waiting);
            match waiting.get(&id) {
                Some(w) if w.session_id == session_id => waiting.remove(&id),
                _ => None,
            }
        };
        match waiting {
            Some(w) => {
                let _ = w.reply.send(frame);
            }
            None => tracing::info!(id = %capstan_core::text::truncate(&id, 64), "a relay's reply nobody waits for was dropped"),
        }
    }

    /// The sockets carrying `cluster_id`'s relay, judged as one election: exactly one, or a
    /// refusal by name.
    pub async fn elect(&self, cluster_id: &str) -> Result<registrations::LiveSocket> {
        let mut live = registrations::live(&self.store, cluster_id).await?;
        match live.len() {
            0 => Err(not_connected(cluster_id)),
            1 => Ok(live.remove(0)),
            n => Err(Refusal::new(
                "relay-ambiguous",
                format!("{n} sockets claim the relay of cluster {cluster_id}: stop all but one (relays.list shows them)"),
            )
            .with_data(json!({ "clusterId": cluster_id, "sessions": n }))),
        }
    }

    /// Call `method` on the relay of `cluster_id`, wherever in the fleet it is connected, and
    /// wait at most `timeout` for its answer.
    pub async fn call(&self, cluster_id: &str, method: &str, body: Value, timeout: Duration) -> Result<Value> {
        let elected = self.elect(cluster_id).await?;
        if elected.fleet_node_id == self.fleet_node_id {
            return self.call_here(&elected.session_id, cluster_id, method, body, timeout).await;
        }
        let request = forward::RelayCall {
            cluster_id: cluster_id.into(),
            session_id: elected.session_id,
            method: method.into(),
            body,
            deadline_ms: timeout.as_millis() as u64,
            node_id: None,
        };
        self.peers.call(&elected.fleet_node_id, &request, timeout).await
    }

    /// Call `method` on the relay session `session_id` held here.
    pub async fn call_here(&self, session_id: &str, cluster_id: &str, method: &str, body: Value, timeout: Duration) -> Result<Value> {
        let timeout = timeout.min(MAX_DEADLINE);
        let held = lock(&self.held).get(session_id).map(|h| (h.cluster_id.clone(), h.last_sequence));
        match held {
            Some((cluster, sequence)) if cluster == cluster_id && sequence > 0 => {}
            _ => return Err(not_connected(cluster_id)),
        }
        // a session whose credential was replaced is never asked anything
        if let Err(refusal) = self.check(session_id).await {
            return Err(not_connected(cluster_id)
                .with_data(json!({ "clusterId": cluster_id, "retryAfterMs": RETRY_AFTER_MS, "cause": refusal.code })));
        }
        let id = capstan_core::ids::new_id("relayreq");
        let frame =
            json!({ "type": "request", "id": id, "method": method, "body": body, "deadlineMs": timeout.as_millis() as u64 }).to_string();
        let limit = self.sessions.max_frame_bytes();
        if frame.len() > limit {
            return Err(Refusal::new("agent-request-too-large", format!("a request to a relay is at most {limit} bytes"))
                .with_data(json!({ "limitBytes": limit })));
        }
        let (reply, answer) = oneshot::channel();
        lock(&self.waiting).insert(id.clone(), Waiting { session_id: session_id.into(), reply });
        if !self.sessions.send(session_id, frame) {
            lock(&self.waiting).remove(&id);
            return Err(not_connected(cluster_id));
        }
        let answered = tokio::time::timeout(timeout, answer).await;
        lock(&self.waiting).remove(&id);
        let mut frame = match answered {
            Err(_) => {
                return Err(Refusal::new(
                    "relay-timeout",
                    format!("the relay of cluster {cluster_id} did not answer {method} within {} ms", timeout.as_millis()),
                )
                .with_data(json!({ "clusterId": cluster_id, "retryAfterMs": RETRY_AFTER_MS }))
                .retryable());
            }
            // the socket closed while waiting
            Ok(Err(_)) => return Err(not_connected(cluster_id)),
            Ok(Ok(frame)) => frame,
        };
        if let Some(result) = frame.remove("result") {
            return Ok(result);
        }
        Err(relay_refusal(frame.remove("error")))
    }

    /// Push `cluster_id`'s configuration to its relays registered on this node.
    pub async fn push_config(&self, cluster_id: &str) {
        let sessions: Vec<String> =
            lock(&self.held).iter().filter(|(_, h)| h.cluster_id == cluster_id && h.last_sequence > 0).map(|(id, _)| id.clone()).collect();
        for session_id in sessions {
            if let Err(e) = self.push_to(&session_id, cluster_id, false).await {
                tracing::info!(cluster = %cluster_id, code = %e.code, "a relay's configuration was not pushed: {}", e.message);
            }
        }
    }

    /// Push the configuration to one session (`always`: even when it holds this digest).
    async fn push_to(&self, session_id: &str, cluster_id: &str, always: bool) -> Result<()> {
        self.check(session_id).await?;
        let config = config(&self.store, cluster_id).await?;
        let digest = hex::encode(Sha256::digest(config.to_string().as_bytes()));
        {
            let mut held = lock(&self.held);
            let Some(held) = held.get_mut(session_id) else { return Ok(()) };
            if !always && held.pushed.as_deref() == Some(digest.as_str()) {
                return Ok(());
            }
            held.pushed = Some(digest.clone());
        }
        let frame =
            json!({ "type": "push", "topic": CONFIG_TOPIC, "body": { "clusterId": cluster_id, "digest": digest, "config": config } });
        self.sessions.send(session_id, frame.to_string());
        Ok(())
    }

    /// The clusters whose relays this node holds.
    fn clusters_held(&self) -> Vec<String> {
        let mut clusters: Vec<String> = lock(&self.held).values().filter(|h| h.last_sequence > 0).map(|h| h.cluster_id.clone()).collect();
        clusters.sort();
        clusters.dedup();
        clusters
    }

    /// Start the node's relay loops: rows left by an earlier process go, this node's rows are
    /// renewed, and changes in the outbox push configuration to the relays they concern.
    pub async fn spawn(self: &Arc<Self>, stop: watch::Receiver<bool>) -> Result<Vec<tokio::task::JoinHandle<()>>> {
        let left = registrations::forget_fleet_node(&self.store, &self.fleet_node_id).await?;
        if left > 0 {
            tracing::info!(rows = left, "relay sockets an earlier process held were forgotten");
        }
        let renewing = self.clone();
        let renew = capstan_fleet::runtime::every(Duration::from_millis(registrations::RENEW_EVERY_MS), stop.clone(), move || {
            let relays = renewing.clone();
            async move {
                let ids: Vec<String> = lock(&relays.held).iter().filter(|(_, h)| h.last_sequence > 0).map(|(id, _)| id.clone()).collect();
                if let Err(e) = registrations::renew(&relays.store, &ids).await {
                    tracing::warn!(code = %e.code, "relay sockets were not renewed: {}", e.message);
                }
            }
        });
        let watching = self.clone();
        let watch = capstan_fleet::runtime::every(WATCH_EVERY, stop, move || {
            let relays = watching.clone();
            async move {
                let mut after = relays.after.lock().await;
                if let Err(e) = relays.follow(&mut after).await {
                    tracing::warn!(code = %e.code, "relay configuration changes were not read: {}", e.message);
                }
            }
        });
        Ok(vec![renew, watch])
    }

    /// Read the outbox after `after` and push the configuration of every held cluster a change
    /// concerns.
    /// `after` is unknown (`None`) until this node's first relay registers (it is set to the
    /// outbox head before that registration commits): a node that holds no relay reads nothing.
    async fn follow(&self, after: &mut Option<u64>) -> Result<()> {
        if self.clusters_held().is_empty() {
            return Ok(());
        }
        let Some(mut after_seq) = *after else { return Ok(()) };
        let result = self.follow_from(&mut after_seq).await;
        *after = Some(after_seq);
        result
    }

    async fn follow_from(&self, after: &mut u64) -> Result<()> {
        loop {
            let events = capstan_events::read_after(&self.store, *after, 200).await?;
            let Some(last) = events.last() else { return Ok(()) };
            *after = last.sequence;
            let held = self.clusters_held();
            if held.is_empty() {
                continue;
            }
            let mut touched: Vec<String> = Vec::new();
            for event in &events {
                match concerns(&event.kind, &event.subject, &event.data) {
                    Concerns::Cluster(id) if held.contains(&id) => touched.push(id),
                    Concerns::Every => touched.extend(held.iter().cloned()),
                    _ => {}
                }
            }
            touched.sort();
            touched.dedup();
            for cluster_id in touched {
                self.push_config(&cluster_id).await;
            }
            if events.len() < 200 {
                return Ok(());
            }
        }
    }
}

/// Which relays an outbox event concerns.
#[derive(Debug, PartialEq)]
enum Concerns {
    Cluster(String),
    Every,
    Nothing,
}

fn concerns(kind: &str, subject: &str, data: &Value) -> Concerns {
    let cluster_of = || data["clusterId"].as_str().map(|c| Concerns::Cluster(c.into())).unwrap_or(Concerns::Nothing);
    match kind.split_once('.') {
        Some(("cluster", _)) => Concerns::Cluster(subject.into()),
        Some(("node", _)) | Some(("relay", _)) => cluster_of(),
        Some(("settings", "updated")) => {
            let relay_reads = |key: &Value| key.as_str() == Some(capstan_inventory::settings::CLUSTER_RELAY_ZONE);
            match data["changed"].as_array().is_some_and(|changed| changed.iter().any(relay_reads)) {
                true => Concerns::Every,
                false => Concerns::Nothing,
            }
        }
        _ => Concerns::Nothing,
    }
}

/// A cluster's configuration as its relay receives it: the whole, never a delta.
pub async fn config(store: &Store, cluster_id: &str) -> Result<Value> {
    store
        .transact(|tx| async move {
            let cluster = capstan_inventory::clusters::require_cluster(&tx, cluster_id).await?;
            let nodes = tx.find_all(capstan_inventory::CLUSTER_NODES, "by_cluster", &[json!(cluster_id)]).await?;
            let nodes: Vec<Value> = nodes
                .iter()
                .map(|n| json!({ "id": n.id, "name": n.data["name"], "hostname": n.data["hostname"], "state": n.data["state"] }))
                .collect();
            let zone = capstan_inventory::settings::relay_zone(&tx).await?;
            Ok(json!({
                "cluster": { "id": cluster_id, "name": cluster.data.name, "revision": cluster.revision, "relay": cluster.data.relay },
                "nodes": nodes,
                "settings": { capstan_inventory::settings::CLUSTER_RELAY_ZONE: zone },
            }))
        })
        .await
}

/// A relay's error object as a refusal, kept by name (a shapeless one is named as such).
pub fn relay_refusal(error: Option<Value>) -> Refusal {
    let error = error.unwrap_or(Value::Null);
    let code = error["code"].as_str().filter(|c| is_code(c));
    let Some(code) = code else {
        return Refusal::new("relay-reply-malformed", "the relay answered with neither a result nor an error object");
    };
    let message = capstan_core::text::truncate(error["message"].as_str().unwrap_or(""), 1024);
    let mut refusal = Refusal::new(code.to_string(), message);
    if error["retryable"].as_bool() == Some(true) {
        refusal = refusal.retryable();
    }
    if let Some(data) = error.get("data").filter(|d| d.is_object()) {
        refusal = refusal.with_data(data.clone());
    }
    refusal
}

/// A kebab-case refusal code of at most 64 characters.
fn is_code(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= 64
        && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !code.starts_with('-')
        && !code.ends_with('-')
}

fn unverified() -> Refusal {
    Refusal::new(
        "relay-identity-unverified",
        "only a relay session verified by its cluster's relay bearer registers (docs/relays.md): open the socket as kind relay with the bearer as its token",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbox_events_concern_the_cluster_they_name() {
        let none = json!({});
        assert_eq!(concerns("cluster.updated", "cluster_a", &none), Concerns::Cluster("cluster_a".into()));
        assert_eq!(concerns("cluster.relayEnabled", "cluster_a", &none), Concerns::Cluster("cluster_a".into()));
        assert_eq!(concerns("node.retired", "node_1", &json!({"clusterId": "cluster_b"})), Concerns::Cluster("cluster_b".into()));
        assert_eq!(
            concerns("relay.credentialRotated", "cluster_c", &json!({"clusterId": "cluster_c"})),
            Concerns::Cluster("cluster_c".into())
        );
        assert_eq!(concerns("settings.updated", "public", &json!({"changed": ["clusterRelayZone"]})), Concerns::Every);
        assert_eq!(concerns("settings.updated", "public", &json!({"changed": ["publicOrigin"]})), Concerns::Nothing);
        assert_eq!(concerns("service.updated", "svc_1", &none), Concerns::Nothing);
    }

    #[test]
    fn a_relays_error_keeps_its_name_and_a_shapeless_one_is_named() {
        let refusal = relay_refusal(Some(
            json!({"code": "agent-method-unknown", "message": "no", "retryable": false, "data": {"methods": ["agent.ping"]}}),
        ));
        assert_eq!((refusal.code.as_ref(), refusal.retryable), ("agent-method-unknown", false));
        assert_eq!(refusal.data.as_deref(), Some(&json!({"methods": ["agent.ping"]})));
        assert!(relay_refusal(Some(json!({"code": "busy", "retryable": true}))).retryable);
        assert_eq!(relay_refusal(None).code, "relay-reply-malformed");
        assert_eq!(relay_refusal(Some(json!({"code": "Not Kebab"}))).code, "relay-reply-malformed");
    }
}
