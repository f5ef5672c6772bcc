//! A request for a relay connected to another fleet node is carried there:
//! `POST /fleet/v1/relay-call` on that node's internal address, signed by the sending node's key.
//!
//! The receiving node believes a request only when it is signed by the key the sender's id was
//! claimed with in the bucket, names the receiver, is at most [`MAX_SKEW_MS`] old, and its
//! nonce was not seen before (a replayed request runs nothing). Like coordinator forwarding, it
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
}

/// What is signed: the purpose, both nodes, the time, the nonce and the body's hash.
pub fn message(from: &str, to: &str, at: u64, nonce: &str, body: &[u8]) -> Vec<u8> {
    let hash = hex::encode(Sha256::digest(body));
    format!("capstan-relay-call-v1\n{from}\n{to}\n{at}\n{nonce}\n{hash}").into_bytes()
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
        let (at, nonce) = (now_ms(), capstan_core::ids::new_id("nonce"));
        let signature = B64.encode(identity.sign(&message(&identity.id, node_id, at, &nonce, &body)));
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

    /// Judge a carried request: the sender's signature by its claimed key, addressed to this
    /// node, fresh, and never seen before.
    pub async fn admit(&self, from: &str, at: &str, nonce: &str, signature: &str, body: &[u8]) -> Result<()> {
        let refused = |why: &str| {
            tracing::warn!(from = %capstan_core::text::truncate(from, 64), "a relay call from the fleet was refused: {why}");
            Refusal::new("fleet-request-unverified", "a relay call from another fleet node was not verified")
        };
        let at: u64 = at.parse().map_err(|_| refused("no time"))?;
        let now = now_ms();
        if at.abs_diff(now) > MAX_SKEW_MS {
            return Err(refused("signed too long ago (or clocks apart)"));
        }
        if nonce.is_empty() || nonce.len() > 128 {
            return Err(refused("no nonce"));
        }
        let Some(key) = capstan_fleet::claimed_key(&self.fleet.node.blobs, from).await? else { return Err(refused("unknown node")) };
        let to = &self.fleet.node.identity.id;
        if !capstan_fleet::signed::signature_valid(&key, &message(from, to, at, nonce, body), signature) {
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

/// How a carried call announces itself: the sender, when it signed, its nonce, its signature
/// (the headers [`FROM`], [`AT`], [`NONCE`], [`SIGNATURE`]).
pub struct Signed<'a> {
    /// The sending node's id.
    pub from: &'a str,
    /// When it signed, as sent.
    pub at: &'a str,
    /// Its nonce.
    pub nonce: &'a str,
    /// Its signature (base64).
    pub signature: &'a str,
}

impl super::Relays {
    /// A call another fleet node carried here (`POST /fleet/v1/relay-call`) for a relay this
    /// node holds: judged ([`Peers::admit`]), then asked of the relay; its result, or the relay's
    /// refusal.
    pub async fn carried(&self, signed: Signed<'_>, body: &[u8]) -> Result<Value> {
        self.peers.admit(signed.from, signed.at, signed.nonce, signed.signature, body).await?;
        let call: RelayCall = serde_json::from_slice(body).map_err(|e| Refusal::invalid_request(format!("a carried relay call: {e}")))?;
        let timeout = Duration::from_millis(call.deadline_ms).min(super::MAX_DEADLINE);
        self.call_here(&call.session_id, &call.cluster_id, &call.method, call.body, timeout).await
    }
}
