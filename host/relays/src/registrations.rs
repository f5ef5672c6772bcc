//! A cluster relay's registration and liveness, as the store keeps them (docs/relays.md,
//! "The relay's session").
//!
//! - `cluster_relay_bearers`: every bearer a relay credential issued, by its SHA-256, naming the
//!   cluster and generation — how a relay's socket offer (which carries only the bearer) finds
//!   its cluster. The bearer itself is the proof; [`identify`] then judges it as
//!   [`relays::verify`] does (a replaced generation is `relay-credential-generation-stale`).
//! - `cluster_relay_registrations`: one durable record per cluster, replaced whole by each
//!   accepted `relays.register` and advancing its generation — one relay per cluster is a rule
//!   of the store, and a restart does not forget it.
//! - `cluster_relay_sessions`: one row per registered socket, written by the fleet node that
//!   holds it and renewed while it is open. A row not renewed for [`LIVE_TTL_MS`] is a socket
//!   gone with its node; the election and `relays.list` read liveness from here, so every fleet
//!   node sees the same relays.

use crate::credentials::{self as relays, CredentialRef, Verified};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::emit;
use capstan_store::{CollectionSpec, Store, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

/// Issued bearers by SHA-256 (hex).
pub const BEARERS: &str = "cluster_relay_bearers";
/// One accepted registration per cluster, keyed by the cluster's id.
pub const REGISTRATIONS: &str = "cluster_relay_registrations";
/// One row per registered socket, keyed by the socket session's id.
pub const SESSIONS: &str = "cluster_relay_sessions";
/// How often the fleet node holding a socket renews its row.
pub const RENEW_EVERY_MS: u64 = 10_000;
/// A row not renewed for this long belongs to a socket whose node is gone.
pub const LIVE_TTL_MS: u64 = 3 * RENEW_EVERY_MS;

/// Declare the collections, and index the bearers of credentials issued before the index
/// existed (idempotent: an indexed bearer is left as it is).
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(CollectionSpec::new(BEARERS).index("by_cluster", &["clusterId"])).await?;
    store.declare(CollectionSpec::new(REGISTRATIONS)).await?;
    store.declare(CollectionSpec::new(SESSIONS).index("by_cluster", &["clusterId"]).index("by_fleet_node", &["fleetNodeId"])).await?;
    let mut cursor = None;
    loop {
        let page = store.transact(|tx| {
            let cursor = cursor.clone();
            async move { tx.scan(relays::CREDENTIALS, cursor.as_deref(), capstan_store::MAX_PAGE).await }
        });
        let page = page.await?;
        for doc in &page.documents {
            for (generation, sha256) in relays::issued_hashes(&doc.data) {
                let cluster_id = doc.id.as_str();
                store
                    .transact(|tx| {
                        let sha256 = sha256.clone();
                        async move {
                            if tx.get(BEARERS, &sha256).await?.is_none() {
                                tx.insert(BEARERS, &sha256, json!({ "clusterId": cluster_id, "generation": generation })).await?;
                            }
                            Ok(())
                        }
                    })
                    .await?;
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(()),
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Record that a credential issued `bearer` for `cluster_id` at `generation` (in the
/// transaction that issues it).
pub(crate) async fn record_bearer(tx: &Tx, cluster_id: &str, generation: u64, bearer: &[u8]) -> Result<()> {
    tx.insert(BEARERS, &sha256_hex(bearer), json!({ "clusterId": cluster_id, "generation": generation })).await.map(drop)
}

/// The cluster a relay bearer was issued for, judged as [`relays::verify`] judges it. A bearer
/// no credential issued (or one of a deleted cluster) is the uniform `unauthenticated`.
pub async fn identify(store: &Store, bearer: &[u8]) -> Result<Verified> {
    let id = sha256_hex(bearer);
    store
        .transact(|tx| {
            let id = id.clone();
            async move {
                let Some(doc) = tx.get(BEARERS, &id).await? else { return Err(capstan_rpc::denied()) };
                let cluster_id = doc.data["clusterId"].as_str().unwrap_or_default().to_string();
                relays::verify_in(&tx, &cluster_id, bearer).await.map_err(|refusal| match refusal.code.as_ref() {
                    "relay-credential-generation-stale" => refusal,
                    _ => capstan_rpc::denied(),
                })
            }
        })
        .await
}

/// What a relay states when it registers (the cluster is never part of it).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RegisterInput {
    /// The enrolled node the relay runs on: a node of the session's cluster.
    pub node_id: String,
    /// Strictly advancing within the socket (a relay counts from 1 on each new socket).
    pub sequence: u64,
    /// The relay's version (1–64 printable characters).
    pub version: String,
    /// The address the relay's own listener is bound on.
    #[serde(default)]
    pub listen_address: Option<std::net::IpAddr>,
    /// The port the relay's own listener is bound on (1–65535).
    #[serde(default)]
    pub listen_port: Option<u16>,
}

impl RegisterInput {
    /// Refuse a body no registration can come of, by name.
    pub fn check(&self) -> Result<()> {
        let printable = |s: &str| s.chars().all(|c| c.is_ascii_graphic() || c == ' ');
        if self.version.is_empty() || self.version.chars().count() > 64 || !printable(&self.version) {
            return Err(Refusal::invalid_request("version is 1–64 printable characters"));
        }
        if self.sequence == 0 {
            return Err(Refusal::invalid_request("sequence is a positive integer"));
        }
        if self.listen_port == Some(0) {
            return Err(Refusal::invalid_request("listenPort is 1–65535"));
        }
        if self.node_id.is_empty() || self.node_id.len() > 128 {
            return Err(Refusal::invalid_request("nodeId names an enrolled node"));
        }
        Ok(())
    }
}

/// A reference to the accepted registration record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationRef {
    /// The record's id (stable per cluster until the cluster is deleted).
    pub id: String,
    /// Advances by one per acceptance.
    pub generation: u64,
    /// SHA-256 over the cluster, the id and the generation.
    pub digest: String,
}

/// The durable registration record.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    /// The cluster.
    pub cluster_id: String,
    /// The record's id.
    pub id: String,
    /// Advances by one per acceptance.
    pub generation: u64,
    /// The node the relay runs on.
    pub node_id: String,
    /// The relay's version.
    pub version: String,
    /// Where its own listener is bound, when it said.
    pub listen_address: Option<String>,
    /// Its listener's port, when it said.
    pub listen_port: Option<u16>,
    /// The sequence the socket counted.
    pub sequence: u64,
    /// When Capstan accepted it (ms since the epoch; never moves backwards).
    pub accepted_at: u64,
    /// The relay credential the socket was verified under.
    pub credential: CredentialRef,
}

impl Registration {
    /// Its reference.
    pub fn reference(&self) -> RegistrationRef {
        let digest = relays::reference_digest(b"capstan-cluster-relay-registration-v1", &self.cluster_id, &self.id, self.generation);
        RegistrationRef { id: self.id.clone(), generation: self.generation, digest }
    }
}

/// The answer to an accepted `relays.register`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    /// The cluster the session's bearer names.
    pub cluster_id: String,
    /// The origin Capstan published for the relay.
    pub origin: String,
    /// The credential the socket was verified under.
    pub credential: CredentialRef,
    /// The durable record this acceptance produced.
    pub accepted_registration: RegistrationRef,
    /// When it was accepted (ms since the epoch).
    pub accepted_at: u64,
    /// The sequence accepted.
    pub sequence: u64,
}

/// Where the socket is held: the fleet node and the session.
#[derive(Debug, Clone)]
pub struct Socket<'a> {
    /// The socket session's id.
    pub session_id: &'a str,
    /// The fleet node holding it.
    pub fleet_node_id: &'a str,
}

/// Accept a registration for the cluster `bearer` verifies as, in one transaction: the bearer is
/// judged again (a rotation between the socket's offer and this write makes one of the two
/// lose), the relay must be enabled, the node must be the cluster's; the record is replaced
/// whole and the socket's row written.
pub async fn register(store: &Store, cluster_id: &str, bearer: &[u8], input: &RegisterInput, socket: Socket<'_>) -> Result<Accepted> {
    input.check()?;
    let accepted = store
        .transact(|tx| async move {
            let verified = relays::verify_in(&tx, cluster_id, bearer).await?;
            let cluster = capstan_inventory::clusters::require_cluster(&tx, cluster_id).await?;
            let origin = match (&cluster.data.relay.enabled, &cluster.data.relay.origin) {
                (true, Some(origin)) => origin.clone(),
                _ => {
                    return Err(Refusal::new(
                        "relay-cluster-not-enabled",
                        format!("no administrator enabled the relay of cluster {}: clusters.enableRelay first", cluster.data.name),
                    )
                    .with_data(json!({ "clusterId": cluster_id })));
                }
            };
            let node = if capstan_store::validate_id(&input.node_id).is_ok() {
                tx.get(capstan_inventory::CLUSTER_NODES, &input.node_id).await?
            } else {
                None
            };
            let Some(node) = node else {
                return Err(Refusal::new("relay-node-unknown", "no node of this Capstan has that id")
                    .with_data(json!({ "nodeId": capstan_core::text::truncate(&input.node_id, 128) })));
            };
            if node.data["clusterId"].as_str() != Some(cluster_id) {
                return Err(Refusal::new("relay-node-foreign", "the node belongs to another cluster than the relay's")
                    .with_data(json!({ "nodeId": input.node_id })));
            }
            let previous = tx.get(REGISTRATIONS, cluster_id).await?;
            let prior: Option<Registration> =
                previous.as_ref().map(|d| serde_json::from_value(d.data.clone())).transpose().map_err(Refusal::internal)?;
            let at = now_ms().max(prior.as_ref().map_or(0, |p| p.accepted_at));
            let record = Registration {
                cluster_id: cluster_id.into(),
                id: prior.as_ref().map_or_else(|| capstan_core::ids::new_id("relayreg"), |p| p.id.clone()),
                generation: prior.as_ref().map_or(1, |p| p.generation + 1),
                node_id: input.node_id.clone(),
                version: input.version.clone(),
                listen_address: input.listen_address.map(|a| a.to_string()),
                listen_port: input.listen_port,
                sequence: input.sequence,
                accepted_at: at,
                credential: verified.credential.clone(),
            };
            let data = serde_json::to_value(&record).map_err(Refusal::internal)?;
            tx.put(REGISTRATIONS, cluster_id, previous.map(|d| d.revision), data).await?;
            let row = json!({
                "clusterId": cluster_id,
                "fleetNodeId": socket.fleet_node_id,
                "nodeId": input.node_id,
                "credentialGeneration": verified.credential.generation,
                "registrationGeneration": record.generation,
                "renewedAt": at,
            });
            let existing = tx.get(SESSIONS, socket.session_id).await?;
            tx.put(SESSIONS, socket.session_id, existing.map(|d| d.revision), row).await?;
            let reference = record.reference();
            emit(
                &tx,
                "relay.registered",
                cluster_id,
                json!({ "clusterId": cluster_id, "nodeId": input.node_id, "registration": reference }),
            )
            .await?;
            Ok(Accepted {
                cluster_id: cluster_id.into(),
                origin,
                credential: verified.credential,
                accepted_registration: reference,
                accepted_at: at,
                sequence: input.sequence,
            })
        })
        .await?;
    Ok(accepted)
}

/// A registered socket somewhere in the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSocket {
    /// The socket session's id.
    pub session_id: String,
    /// The fleet node holding it.
    pub fleet_node_id: String,
}

fn fresh(doc: &capstan_store::Document, now: u64) -> bool {
    doc.data["renewedAt"].as_u64().is_some_and(|at| at + LIVE_TTL_MS > now)
}

/// The sockets carrying `cluster_id`'s relay right now, fleet-wide.
pub async fn live_in(tx: &Tx, cluster_id: &str, now: u64) -> Result<Vec<LiveSocket>> {
    let rows = tx.find_all(SESSIONS, "by_cluster", &[json!(cluster_id)]).await?;
    Ok(rows
        .iter()
        .filter(|d| fresh(d, now))
        .map(|d| LiveSocket { session_id: d.id.clone(), fleet_node_id: d.data["fleetNodeId"].as_str().unwrap_or_default().into() })
        .collect())
}

/// [`live_in`] in a transaction of its own.
pub async fn live(store: &Store, cluster_id: &str) -> Result<Vec<LiveSocket>> {
    let now = now_ms();
    store.transact(|tx| async move { live_in(&tx, cluster_id, now).await }).await
}

/// Renew the rows of the sockets `session_ids` (those this fleet node holds).
pub async fn renew(store: &Store, session_ids: &[String]) -> Result<()> {
    let now = now_ms();
    for id in session_ids {
        store
            .transact(|tx| async move {
                if let Some(doc) = tx.get(SESSIONS, id).await? {
                    let mut data = doc.data.clone();
                    data["renewedAt"] = json!(now);
                    tx.replace(SESSIONS, id, doc.revision, data).await?;
                }
                Ok(())
            })
            .await?;
    }
    Ok(())
}

/// Remove the row of a socket that closed (or was refused after registering).
pub async fn forget(store: &Store, session_id: &str) -> Result<()> {
    store
        .transact(|tx| async move {
            if let Some(doc) = tx.get(SESSIONS, session_id).await? {
                tx.delete(SESSIONS, session_id, doc.revision).await?;
            }
            Ok(())
        })
        .await
}

/// Remove every row of `fleet_node_id` (at its start: what an earlier process left).
pub async fn forget_fleet_node(store: &Store, fleet_node_id: &str) -> Result<usize> {
    store
        .transact(|tx| async move {
            let rows = tx.find_all(SESSIONS, "by_fleet_node", &[json!(fleet_node_id)]).await?;
            for row in &rows {
                tx.delete(SESSIONS, &row.id, row.revision).await?;
            }
            Ok(rows.len())
        })
        .await
}

/// One item of `relays.list`: the registration record, its reference and whether a socket
/// carries it now.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    /// The record as accepted.
    #[serde(flatten)]
    pub record: Registration,
    /// The record's reference.
    pub accepted_registration: RegistrationRef,
    /// Whether a socket carries the cluster's relay right now (grants nothing).
    pub live: bool,
    /// How many sockets do (more than one makes the election refuse `relay-ambiguous`).
    pub live_sessions: usize,
}

/// The registrations of `cluster_ids` (every registered cluster when `None`), with liveness.
pub async fn list(store: &Store, cluster_ids: Option<&[String]>) -> Result<Vec<Listed>> {
    let now = now_ms();
    store
        .transact(|tx| async move {
            let docs = match cluster_ids {
                Some(ids) => {
                    let mut docs = Vec::new();
                    for id in ids {
                        if capstan_store::validate_id(id).is_ok()
                            && let Some(doc) = tx.get(REGISTRATIONS, id).await?
                        {
                            docs.push(doc);
                        }
                    }
                    docs
                }
                None => {
                    let mut docs = Vec::new();
                    let mut cursor = None;
                    loop {
                        let page = tx.scan(REGISTRATIONS, cursor.as_deref(), capstan_store::MAX_PAGE).await?;
                        docs.extend(page.documents);
                        match page.next_cursor {
                            Some(next) => cursor = Some(next),
                            None => break,
                        }
                    }
                    docs
                }
            };
            let mut items = Vec::new();
            for doc in docs {
                let record: Registration = serde_json::from_value(doc.data).map_err(Refusal::internal)?;
                let sockets = live_in(&tx, &record.cluster_id, now).await?.len();
                items.push(Listed { accepted_registration: record.reference(), record, live: sockets > 0, live_sessions: sockets });
            }
            Ok(items)
        })
        .await
}

/// Why `cluster_id` cannot be deleted yet: a live socket carries its relay.
pub async fn cluster_blocker(tx: &Tx, cluster_id: &str, name: &str) -> Result<Option<Refusal>> {
    let sockets = live_in(tx, cluster_id, now_ms()).await?;
    Ok((!sockets.is_empty()).then(|| {
        Refusal::new("cluster-relay-live", format!("a relay is connected for cluster {name}: stop it (or disable the relay) first"))
            .with_data(json!({ "clusterId": cluster_id, "liveSessions": sockets.len() }))
    }))
}

/// Remove what only the deleted cluster `cluster_id` held of its relay, in the deleting
/// transaction: its credential, export receipts, issued-bearer index, registration and rows,
/// and its relay secret (revoked, so it authenticates nothing).
pub async fn cluster_removed(tx: &Tx, cluster_id: &str) -> Result<()> {
    for doc in tx.find_all(BEARERS, "by_cluster", &[json!(cluster_id)]).await? {
        tx.delete(BEARERS, &doc.id, doc.revision).await?;
    }
    for doc in tx.find_all(SESSIONS, "by_cluster", &[json!(cluster_id)]).await? {
        tx.delete(SESSIONS, &doc.id, doc.revision).await?;
    }
    for doc in tx.find_all(relays::EXPORTS, "by_cluster", &[json!(cluster_id)]).await? {
        tx.delete(relays::EXPORTS, &doc.id, doc.revision).await?;
    }
    if let Some(doc) = tx.get(REGISTRATIONS, cluster_id).await? {
        tx.delete(REGISTRATIONS, cluster_id, doc.revision).await?;
    }
    relays::credential_removed(tx, cluster_id).await
}
