//! Replica slots (`runtime_slots`): one document per `<nodeId>.<index>` of a service, holding
//! the slot's current assignment and what its node last said of it.

use super::RUNTIME_SLOTS;
use super::transition::{Intent, SlotState};
use capstan_core::refusal::Result;
use capstan_inventory::{Entity, parse};
use capstan_store::Tx;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;

/// A port of the work, as the node publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkPort {
    /// The port the container listens on.
    pub port: u16,
    /// `tcp` or `udp` (http is tcp).
    pub protocol: String,
    /// The port published on the node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_port: Option<u16>,
}

/// A volume of the work: `<volumes dir>/<serviceId>/<name>` on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkVolume {
    /// The volume's name.
    pub name: String,
    /// Where it is mounted in the container.
    pub mount_path: String,
}

/// What a run assignment runs: values only, so its digest is the desire's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Work {
    /// The image, by digest.
    pub image: String,
    /// The service's plain environment.
    pub environment: BTreeMap<String, String>,
    /// Its ports.
    pub ports: Vec<WorkPort>,
    /// Its volumes.
    pub volumes: Vec<WorkVolume>,
    /// Its health check.
    pub health: crate::spec::Health,
    /// Its restart policy (part of the key: a change of policy is a new attempt).
    pub restart: crate::spec::Restart,
    /// The secrets its replicas get, value-free (absent when the service has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<WorkSecrets>,
}

/// The secrets a run gets: which version each key resolves to, pinned when the attempt is
/// admitted; the values are sealed to the node's recipient with each push, never stored here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkSecrets {
    /// The service's resolved manifest the keys were read from. Not part of the desire's key: a
    /// new manifest that changes nothing of this environment replaces no replica.
    pub manifest: u64,
    /// The secrets' environment.
    pub environment: String,
    /// KEY → the secret version it resolves to.
    pub keys: BTreeMap<String, PinnedSecret>,
    /// Keys delivered as files under `/run/secrets` (the rest are environment variables).
    pub files: Vec<String>,
}

/// One key's secret version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedSecret {
    /// The secret.
    pub secret_id: String,
    /// Its version.
    pub version_id: String,
}

impl Work {
    /// The desire's key: SHA-256 of the work's canonical JSON (the manifest number left out).
    pub fn key(&self) -> String {
        use sha2::Digest;
        let mut keyed = self.clone();
        if let Some(secrets) = &mut keyed.secrets {
            secrets.manifest = 0;
        }
        let bytes = serde_json::to_vec(&keyed).unwrap_or_default();
        hex::encode(sha2::Sha256::digest(bytes))
    }
}

/// What the node last said of an assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// `pulling`, `starting`, `running`, `unhealthy`, `exited` or `failed`.
    pub phase: String,
    /// Whether its health check passes (a running container without one is ready).
    pub ready: bool,
    /// The image digest the container runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// How often the node restarted the container itself (Capstan's restarts are new attempts).
    #[serde(default)]
    pub restart_count: u32,
    /// Why it is not running, in the node's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// When the node observed it (milliseconds since the epoch, the node's clock).
    pub observed_at: u64,
    /// When Capstan accepted it (milliseconds since the epoch, Capstan's clock).
    pub accepted_at: u64,
}

impl Observation {
    /// The node says the attempt failed.
    pub fn failed(&self) -> bool {
        matches!(self.phase.as_str(), "exited" | "failed" | "unhealthy")
    }
}

/// A slot's current assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    /// The desire's key it was admitted under.
    pub key: String,
    /// Run, stop or remove.
    pub intent: Intent,
    /// Advances with every change the node must hear of (what a session acknowledges).
    pub revision: u64,
    /// What it runs.
    pub work: Work,
    /// The repository of Capstan's registry the image is pulled from, if it is Capstan's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// It replaces an attempt that drifted (a rollout step, not a first start).
    #[serde(default)]
    pub successor: bool,
    /// When it was admitted (milliseconds).
    pub admitted_at: u64,
    /// What the node last said of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<Observation>,
    /// When the node reported it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<u64>,
    /// When the node reported it removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_at: Option<u64>,
    /// Why it was stopped (the case that stopped it), once it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_cause: Option<String>,
}

/// A replica slot of a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Slot {
    /// The service.
    pub service_id: String,
    /// The cluster.
    pub cluster_id: String,
    /// The node it stands on, for good.
    pub node_id: String,
    /// `<nodeId>.<index>`.
    pub slot: String,
    /// The current assignment's id (`asg_…`).
    pub assignment_id: String,
    /// The current assignment.
    pub assignment: Assignment,
    /// Consecutive failed attempts under the current key.
    #[serde(default)]
    pub failures: u32,
    /// Attempts Capstan admitted in this slot.
    #[serde(default)]
    pub attempts: u32,
    /// The last cause the node gave, kept across attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_cause: Option<String>,
}

impl Slot {
    /// The slot as the transition reads it.
    pub fn state(&self) -> SlotState {
        let a = &self.assignment;
        SlotState::Held {
            key: a.key.clone(),
            intent: a.intent,
            failed: a.observation.as_ref().is_some_and(Observation::failed),
            stop_receipt: a.stopped_at.is_some(),
            remove_receipt: a.removed_at.is_some(),
        }
    }

    /// The phase as operators (and managers) read it: `removed` or `stopped` once the node
    /// reported it, else the node's own word, `pending` before it said anything.
    pub fn phase(&self) -> String {
        let a = &self.assignment;
        match (a.removed_at, a.stopped_at, &a.observation) {
            (Some(_), _, _) => "removed".to_string(),
            (None, Some(_), _) => "stopped".to_string(),
            (None, None, Some(o)) => o.phase.clone(),
            (None, None, None) => "pending".to_string(),
        }
    }

    /// Ready: the node says so, and the slot is to run.
    pub fn ready(&self) -> bool {
        self.assignment.intent == Intent::Run && self.assignment.observation.as_ref().is_some_and(|o| o.ready)
    }

    /// The image digest its node says it runs.
    pub fn image_digest(&self) -> Option<String> {
        self.assignment.observation.as_ref().and_then(|o| o.image_digest.clone())
    }

    /// Running the desired key, observed ready.
    pub fn ready_at(&self, key: &str) -> bool {
        let a = &self.assignment;
        a.intent == Intent::Run && a.key == key && a.observation.as_ref().is_some_and(|o| o.ready && !o.failed())
    }

    /// Between a drift's stop and its successor's having been ready for [`SETTLE_MS`] at `now`.
    pub fn replacing(&self, desired: Option<&str>, now: u64) -> bool {
        let a = &self.assignment;
        match a.intent {
            Intent::Stop | Intent::Remove => desired.is_some() && a.stop_cause.as_deref() == Some("drift"),
            // a successor replaces until its own attempt is observed ready and settled (whatever
            // is desired now); an observation is rewritten only when it changes, so the accepted
            // time of a ready one is when it became ready
            Intent::Run => {
                a.successor && !a.observation.as_ref().is_some_and(|o| o.ready && !o.failed() && now >= o.accepted_at + SETTLE_MS)
            }
        }
    }
}

/// How long a successor stays ready before the next replica of its service is replaced: an
/// ingress that follows ready replicas (it hears of each observation) routes to it by then, so
/// traffic always has a ready replica to go to during a rollout.
pub const SETTLE_MS: u64 = 5_000;

/// A slot's document id: `<serviceId>@<slot>`.
pub fn slot_id(service_id: &str, slot: &str) -> String {
    format!("{service_id}@{slot}")
}

/// A slot's name: `<nodeId>.<index>`.
pub fn slot_name(node_id: &str, index: u32) -> String {
    format!("{node_id}.{index}")
}

/// Every slot of a service on one cluster.
pub async fn of_service_in(tx: &Tx, service_id: &str, cluster_id: &str) -> Result<Vec<Entity<Slot>>> {
    let docs = tx.find_all(RUNTIME_SLOTS, "by_service", &[json!(service_id)]).await?;
    let mut slots = Vec::new();
    for doc in &docs {
        let slot: Entity<Slot> = parse(doc)?;
        if slot.data.cluster_id == cluster_id {
            slots.push(slot);
        }
    }
    Ok(slots)
}

/// Every slot on one node.
pub async fn of_node(tx: &Tx, node_id: &str) -> Result<Vec<Entity<Slot>>> {
    tx.find_all(RUNTIME_SLOTS, "by_node", &[json!(node_id)]).await?.iter().map(parse).collect()
}

/// The slot holding `assignment_id`, if any.
pub async fn by_assignment(tx: &Tx, assignment_id: &str) -> Result<Option<Entity<Slot>>> {
    let page = tx.find(RUNTIME_SLOTS, "by_assignment", &[json!(assignment_id)], None, 1).await?;
    page.documents.first().map(parse).transpose()
}
