//! The records the manager keeps (backups, restores, the schedule's state), what methods answer
//! them as, and where they and their objects are kept.

use capstan_sdk::store::Doc;
use capstan_sdk::{JsonSchema, Refusal};
use serde::{Deserialize, Serialize};

pub(crate) const BACKUPS: &str = "backups";
pub(crate) const RESTORES: &str = "restores";
pub(crate) const SCHEDULE: &str = "schedule";
/// The one document of [`SCHEDULE`].
pub(crate) const SCHEDULE_STATE: &str = "state";
/// Where backups' objects live in the plugin's blob prefix: `backups/<backupId>/…`.
pub(crate) const OBJECTS: &str = "backups/";

/// Where a backup or restore is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) enum State {
    /// Recorded; the reconcile loop takes it next.
    Pending,
    /// A restore waiting for the service's replicas on its node to stop (`held`).
    Stopping,
    /// Being taken (or applied) by the cluster's agent.
    Running,
    /// Every object verified (a backup), or applied (a restore).
    Complete,
    /// Ended without a usable result; `reason` names why.
    Failed,
    /// A backup whose stored objects do not match what the agent sent or the manifest lists.
    Corrupt,
}

impl State {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Stopping => "stopping",
            State::Running => "running",
            State::Complete => "complete",
            State::Failed => "failed",
            State::Corrupt => "corrupt",
        }
    }
}

/// Why a backup or restore failed: a refusal code and its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Reason {
    pub(crate) code: String,
    pub(crate) message: String,
}

impl From<&Refusal> for Reason {
    fn from(r: &Refusal) -> Self {
        Reason { code: r.code().to_string(), message: r.message().to_string() }
    }
}

/// The database a service keeps in one of its volumes (as `services.*` declare it): backed up
/// as a closure, a consistent copy the agent takes while the service runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Database {
    /// `sqlite`.
    pub(crate) engine: String,
    /// The volume holding it.
    pub(crate) volume: String,
    /// Its file inside the volume.
    pub(crate) path: String,
}

/// A part its node's agent is still at — archiving it (a backup) or applying it (a restore) —
/// longer than one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PartWaiting {
    pub(crate) node_id: String,
    /// When the manager first asked for it.
    pub(crate) since_ms: u64,
    /// When the manager asks again.
    pub(crate) next_look_at_ms: u64,
    /// When the agent last answered that it is still at it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) heard_at_ms: Option<u64>,
    /// Why the last ask went unanswered, when the node could not be reached (it is asked again
    /// until an hour passed without an answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unreachable: Option<Reason>,
}

impl PartWaiting {
    /// An hour without word from the agent: the part is given up.
    pub(crate) fn given_up(&self, now: u64, limit_ms: u64) -> bool {
        now.saturating_sub(self.heard_at_ms.unwrap_or(self.since_ms)) > limit_ms
    }
}

/// One stored object of a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Object {
    /// Under the plugin's blob prefix.
    pub(crate) key: String,
    /// `volumes`: a gzip-compressed tar of the service's volume directories (without the
    /// database's files); `database`: the database's closure.
    pub(crate) kind: String,
    pub(crate) size: u64,
    pub(crate) sha256: String,
    /// The node it was taken on, in a backup of several nodes (each part its node's volumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) node_id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Backup {
    pub(crate) organization_id: String,
    pub(crate) service_id: String,
    pub(crate) service_name: String,
    pub(crate) cluster_id: String,
    /// The node whose volumes are backed up (data is node-local): the first of `nodes`.
    pub(crate) node_id: String,
    /// Every node whose volumes are parts of it, when there are several (an every-node service):
    /// each part's objects name their node. Empty: `nodeId` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) nodes: Vec<String>,
    pub(crate) volumes: Vec<String>,
    /// The service's database when the backup was asked for: its closure is an object of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) database: Option<Database>,
    pub(crate) state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<Reason>,
    /// `manual` or `schedule`.
    pub(crate) trigger: String,
    pub(crate) requested_by: String,
    pub(crate) created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) started_at_ms: Option<u64>,
    /// When the pass taking its current part began (a backup of several parts goes on across
    /// passes; only a pass that died is interrupted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pass_started_at_ms: Option<u64>,
    /// A part whose archive the node's agent is still making (it goes on by itself; the manager
    /// asks again from this time on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) archiving: Option<PartWaiting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) finished_at_ms: Option<u64>,
    /// The manifest: every object with its exact length and SHA-256.
    #[serde(default)]
    pub(crate) objects: Vec<Object>,
    /// The objects' total size, in bytes.
    #[serde(default)]
    pub(crate) size: u64,
    /// `pending`, `complete` or `failed`: where the copy on the external target is (indexed;
    /// absent when no target was set when the backup completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) replica_state: Option<ReplicaState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) replica: Option<Replica>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) enum ReplicaState {
    /// To be copied by the next pass (or when a target is set).
    Pending,
    /// Every object and the manifest are on the target, each read back and verified there.
    Complete,
    /// The last attempt failed (`reason`); tried again after `nextAttemptAtMs`.
    Failed,
}

/// The copy of a backup on the external target.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Replica {
    /// `<endpoint>/<bucket>/<prefix>` of the last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<Reason>,
    #[serde(default)]
    pub(crate) attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) next_attempt_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) completed_at_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Restore {
    pub(crate) organization_id: String,
    pub(crate) backup_id: String,
    /// The service restored into (the backup's own unless named).
    pub(crate) service_id: String,
    pub(crate) cluster_id: String,
    /// Where it lands: the first of `nodes`.
    pub(crate) node_id: String,
    /// Every node a part lands on (each its own part), when there are several.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) nodes: Vec<String>,
    pub(crate) volumes: Vec<String>,
    pub(crate) state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<Reason>,
    /// The hold the restore put on the service's runtime spec for the part it applies (that
    /// part's node), until the part is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) held: Option<Held>,
    /// Every object of the backup was read back and matched its manifest (once, before any
    /// part is applied).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) verified: bool,
    /// The nodes whose part is applied, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) restored: Vec<String>,
    /// A part the node's agent is still applying (it goes on by itself; the manager asks again
    /// from this time on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) applying: Option<PartWaiting>,
    /// When the current part's node was held: its replicas are waited for from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) part_started_at_ms: Option<u64>,
    /// When the pass taking it now (or last) took it: a restore of several parts goes on for
    /// longer than a pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pass_started_at_ms: Option<u64>,
    pub(crate) requested_by: String,
    pub(crate) created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) started_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) finished_at_ms: Option<u64>,
}

/// The nodes of a backup or restore: `nodes`, else `nodeId` alone.
pub(crate) fn nodes_of<'a>(node_id: &'a str, nodes: &'a [String]) -> Vec<&'a str> {
    match nodes {
        [] => vec![node_id],
        nodes => nodes.iter().map(String::as_str).collect(),
    }
}

/// `node_id` and `nodes` as the records keep them: the first node, and all of them when several.
pub(crate) fn placed(nodes: Vec<String>) -> (String, Vec<String>) {
    let first = nodes.first().cloned().unwrap_or_default();
    (first, if nodes.len() > 1 { nodes } else { Vec::new() })
}

/// The holds restores keep on services' runtime specs, one per part (`<restoreId>.<nodeId>`), until released.
pub(crate) const HOLDS: &str = "holds";

/// The runtime spec a restore holds while it runs: the service's replicas on its nodes stop
/// first and start again after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Held {
    pub(crate) cluster_id: String,
    /// The spec's revision with the hold (the restore's write, or the operator's).
    pub(crate) spec_revision: u64,
    /// The restore set the hold (and releases it); `false`: the operator held it already.
    pub(crate) ours: bool,
    /// The nodes the restore added to the spec's `heldNodes` (and takes out again); none in a
    /// hold of the whole spec recorded before restores held only their nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) nodes: Vec<String>,
}

/// A hold a restore keeps on its service's runtime spec for one part, until released.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HeldBy {
    pub(crate) service_id: String,
    pub(crate) held: Held,
    /// The restore holding it (`holds/<restoreId>.<nodeId>`, a part's hold); absent in a hold
    /// recorded before restores held one node at a time (`holds/<restoreId>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) restore_id: Option<String>,
}

/// A record with its id and revision, as methods answer it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Shown<T> {
    pub(crate) id: String,
    pub(crate) revision: u64,
    #[serde(flatten)]
    pub(crate) record: T,
}

pub(crate) fn shown<T>(doc: Doc<T>) -> Shown<T> {
    Shown { id: doc.id, revision: doc.revision, record: doc.data }
}

/// What the schedule did last, and when it is due next.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ScheduleState {
    /// The expression `next_due_ms` was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cron: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) next_due_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_run: Option<RunSummary>,
    /// The external target complete backups were last queued for (a new one queues them all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) replica_target: Option<String>,
}

/// One `backup-all-services` run.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunSummary {
    pub(crate) at_ms: u64,
    /// `schedule` or the administrator who asked.
    pub(crate) by: String,
    pub(crate) queued: u32,
    /// Services with volumes that could not be placed, with the code that says why.
    pub(crate) skipped: Vec<Skipped>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Skipped {
    pub(crate) service_id: String,
    pub(crate) code: String,
}

/// `<prefix>_<32 hex>`, like the host's ids.
pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_and_distinct() {
        let (a, b) = (new_id("bkp"), new_id("bkp"));
        assert!(a.starts_with("bkp_") && a.len() == 36, "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_part_is_given_up_only_after_an_hour_without_word_from_its_agent() {
        const HOUR: u64 = 3_600_000;
        let mut part = PartWaiting { node_id: "node_a".into(), since_ms: 0, next_look_at_ms: 0, heard_at_ms: None, unreachable: None };
        assert!(!part.given_up(HOUR, HOUR) && part.given_up(HOUR + 1, HOUR), "never heard of: counted from the first ask");
        // an agent still at it after five hours keeps the part going
        part.heard_at_ms = Some(5 * HOUR);
        assert!(!part.given_up(5 * HOUR + HOUR, HOUR));
        assert!(part.given_up(6 * HOUR + 1, HOUR));
    }
}
