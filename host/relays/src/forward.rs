//! A request for a relay connected to another fleet node is carried there:
//! `POST /fleet/v1/relay-call` on that node's internal address, signed by the sending node's key.
//!
//! The receiving node believes a request only when it is signed by the key the sender's id was
//! claimed with in the bucket, names the receiver, is at most [`MAX_SKEW_MS`] old, and its
//! nonce was not seen before (a replayed request runs nothing). The signature covers the body's
//! SHA-256, which travels in a header ([`BODY_SHA256`]): the receiver judges the headers before
//! it reads a byte of the body, so a stranger cannot make it buffer one, and then holds the body
//! it reads to that hash. Like coordinator forwarding, it
//! goes over plain HTTP, so only on a private network (`lan`, `wireguard`): a node on `public`
//! refuses `relay-elsewhere`, naming the node that holds the relay.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_fleet::forward::{Unfollowable, peer};
use capstan_fleet::runtime::Fleet;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The route a node answers relay calls for the fleet on.
pub const PATH: &str = "/fleet/v1/relay-call";
/// The sending node's id.
pub const FROM: &str = "x-capstan-node";
/// When it signed (ms since the epoch).
pub const AT: &str = "x-capstan-node-at";
/// A value never used twice by the sender.
pub const NONCE: &str = "x-capstan-node-nonce";
/// The Ed25519 signature (base64) over [`message`].
pub const SIGNATURE: &str = "x-capstan-node-signature";
/// The SHA-256 (hex) of the body, which the signature covers.
pub const BODY_SHA256: &str = "x-capstan-node-body-sha256";
/// How far a signed request's time may be from the receiver's clock.
pub const MAX_SKEW_MS: u64 = 30_000;
/// A forwarded request's body is at most this large.
pub const MAX_BODY: usize = 2 * 1024 * 1024;

/// What is carried to the node holding the relay.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RelayCall {
    /// The cluster.
    pub cluster_id: String,
    /// The socket session the sender's election named.
    pub session_id: String,
    /// The relay's method.
    pub method: String,
    /// Its body.
    pub body: Value,
    /// How long the sender waits.
    pub deadline_ms: u64,
    /// A call to this node's agent over its runtime session held on the receiving fleet node
    /// (then `clusterId` and `sessionId` are empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
}

/// What is signed: the purpose, both nodes, the time, the nonce and the body's hash (hex).
pub fn message(from: &str, to: &str, at: u64, nonce: &str, body_sha256: &str) -> Vec<u8> {
    format!("capstan-relay-call-v1\n{from}\n{to}\n{at}\n{nonce}\n{body_sha256}").into_bytes()
}

/// The SHA-256 of `body`, as [`BODY_SHA256`] carries it.
pub fn body_sha256(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

/// How this node reaches the others (and recognizes them).
#[derive(Clone)]
pub struct Peers {
    fleet: Arc<Fleet>,
    http: reqwest::Client,
    /// Nonces seen, with when they may be forgotten.
    seen: Arc<Mutex<HashMap<String, u64>>>,
}

impl Peers {
    /// Peers of `fleet`'s node.
    pub fn new(fleet: Arc<Fleet>) -> Peers {
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).build().expect("an HTTP client with defaults builds");
        Peers { fleet, http, seen: Arc::default() }
    }

    /// Carry `call` to `node_id` and answer what its relay answered.
    pub async fn call(&self, node_id: &str, call: &RelayCall, timeout: Duration) -> Result<Value> {
        let base = match peer(&self.fleet, node_id).await? {
            Ok(base) => base,
            Err(Unfollowable::Public { address }) => {
                return Err(Refusal::new(
                    "relay-elsewhere",
                    format!("the relay of cluster {} is connected to fleet node {node_id} ({address}); nodes on a public network do not carry requests over plain HTTP", call.cluster_id),
                )
                .with_data(json!({ "clusterId": call.cluster_id, "fleetNode": node_id, "address": address })));
            }
            Err(Unfollowable::NotAnswering) | Err(Unfollowable::Untrusted(_)) => return Err(super::not_connected(&call.cluster_id)),
        };
        let body = serde_json::to_vec(call).map_err(Refusal::internal)?;
        let identity = &self.fleet.node.identity;
        let (at, nonce, hash) = (now_ms(), capstan_core::ids::new_id("nonce"), body_sha256(&body));
        let signature = B64.encode(identity.sign(&message(&identity.id, node_id, at, &nonce, &hash)));
        let unreachable = |e: reqwest::Error| {
            Refusal::new("relay-not-connected", format!("fleet node {node_id}, which holds the relay, could not be reached"))
                .with_data(json!({ "clusterId": call.cluster_id, "fleetNode": node_id, "retryAfterMs": super::RETRY_AFTER_MS }))
                .retryable()
                .detail(e)
        };
        let reply = self
            .http
            .post(format!("{base}{PATH}"))
            .timeout(timeout + Duration::from_secs(2))
            .header(FROM, &identity.id)
            .header(AT, at.to_string())
            .header(NONCE, &nonce)
            .header(SIGNATURE, signature)
            .header(BODY_SHA256, hash)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(unreachable)?;
        let ok = reply.status().is_success();
        let bytes = reply.bytes().await.map_err(unreachable)?;
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        match ok {
            true => Ok(answer["result"].clone()),
            false => Err(super::relay_refusal(answer.get("error").cloned())),
        }
    }

    /// Judge a carried request by its headers alone, before its body is read: the sender's
    /// signature by its claimed key, addressed to this node, fresh, and never seen before.
    pub async fn admit(&self, signed: &Signed<'_>) -> Result<()> {
        let Signed { from, at, nonce, signature, body_sha256 } = *signed;
        let refused = |why: &str| unverified(from, why);
        let at: u64 = at.parse().map_err(|_| refused("no time"))?;
        let now = now_ms();
        if at.abs_diff(now) > MAX_SKEW_MS {
            return Err(refused("signed too long ago (or clocks apart)"));
        }
        if nonce.is_empty() || nonce.len() > 128 {
            return Err(refused("no nonce"));
        }
        if body_sha256.len() != 64 || !body_sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(refused("no body hash"));
        }
        let Some(key) = capstan_fleet::claimed_key(&self.fleet.node.blobs, from).await? else { return Err(refused("unknown node")) };
        let to = &self.fleet.node.identity.id;
        if !capstan_fleet::signed::signature_valid(&key, &message(from, to, at, nonce, body_sha256), signature) {
            return Err(refused("bad signature"));
        }
        let mut seen = self.seen.lock().expect("the nonce table is never poisoned");
        seen.retain(|_, until| *until > now);
        if seen.insert(format!("{from}\n{nonce}"), now + 2 * MAX_SKEW_MS).is_some() {
            return Err(refused("replayed"));
        }
        Ok(())
    }
}

/// The refusal of a carried request that is not believed (why is logged, never answered).
fn unverified(from: &str, why: &str) -> Refusal {
    tracing::warn!(from = %capstan_core::text::truncate(from, 64), "a relay call from the fleet was refused: {why}");
    Refusal::new("fleet-request-unverified", "a relay call from another fleet node was not verified")
}

/// How a carried call announces itself: the sender, when it signed, its nonce, its signature
/// and the body's hash (the headers [`FROM`], [`AT`], [`NONCE`], [`SIGNATURE`], [`BODY_SHA256`]).
#[derive(Clone, Copy)]
pub struct Signed<'a> {
    /// The sending node's id.
    pub from: &'a str,
    /// When it signed, as sent.
    pub at: &'a str,
    /// Its nonce.
    pub nonce: &'a str,
    /// Its signature (base64).
    pub signature: &'a str,
    /// The body's SHA-256 (hex), which the signature covers.
    pub body_sha256: &'a str,
}

impl super::Relays {
    /// Judge the headers of a call another fleet node carried here (`POST /fleet/v1/relay-call`),
    /// before its body is read ([`Peers::admit`]).
    pub async fn admit_carried(&self, signed: &Signed<'_>) -> Result<()> {
        self.peers.admit(signed).await
    }

    /// A carried call whose headers [`Relays::admit_carried`] believed, for a relay this node
    /// holds: its body held to the signed hash, then asked of the relay; its result, or the
    /// relay's refusal.
    pub async fn carried(&self, signed: Signed<'_>, body: &[u8]) -> Result<Value> {
        if body_sha256(body) != signed.body_sha256.to_ascii_lowercase() {
            return Err(unverified(signed.from, "the body is not the one signed"));
        }
        let call: RelayCall = serde_json::from_slice(body).map_err(|e| Refusal::invalid_request(format!("a carried relay call: {e}")))?;
        let timeout = Duration::from_millis(call.deadline_ms).min(super::MAX_DEADLINE);
        if let Some(node_id) = &call.node_id {
            let Some(nodes) = self.node_calls.get() else {
                return Err(Refusal::new("node-not-connected", format!("node {node_id} has no runtime session here")).retryable());
            };
            return nodes.call(node_id, &call.method, call.body, timeout).await;
        }
        self.call_here(&call.session_id, &call.cluster_id, &call.method, call.body, timeout).await
    }

    /// Call `method` on the agent of `node_id`, whose runtime session the fleet node
    /// `fleet_node_id` holds: carried there as relay calls are (signed, over the fleet's private
    /// network).
    pub async fn call_node_at(&self, fleet_node_id: &str, node_id: &str, method: &str, body: Value, timeout: Duration) -> Result<Value> {
        let request = RelayCall {
            cluster_id: String::new(),
            session_id: String::new(),
            method: method.into(),
            body,
            deadline_ms: timeout.as_millis() as u64,
            node_id: Some(node_id.into()),
        };
        self.peers.call(fleet_node_id, &request, timeout).await
    }

    /// Answer node calls carried here with `calls` (the runtime's node sessions held here).
    pub fn set_node_calls(&self, calls: Arc<dyn NodeCalls>) {
        let _ = self.node_calls.set(calls);
    }
}

/// How a fleet node answers a call carried to it for a node whose runtime session it holds.
pub trait NodeCalls: Send + Sync {
    /// Call `method` on `node_id`'s agent over its session held here; `node-not-connected` when
    /// it holds none.
    fn call<'a>(&'a self, node_id: &'a str, method: &'a str, body: Value, timeout: Duration) -> NodeCallAnswer<'a>;
}

/// What a [`NodeCalls`] call comes to.
pub type NodeCallAnswer<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Value>> + Send + 'a>>;
