//! The reconcile loop's work: taking a pending backup, applying a pending restore, failing what
//! a dead pass left running.
//!
//! For a backup the pass mints an upload ticket (`transfers`), asks the cluster's relay to
//! archive the service's volume directories and `PUT` the archive with it (`backups.archive`),
//! so the bytes go agent → host → blob store and never through this plugin; then it has the
//! host read the stored object back (`transfers.digest`) and compares length and SHA-256 with
//! what the agent sent. The backup record is the commit point: only a record whose objects
//! verify is `complete`; one whose objects do not is `corrupt`; objects without a record, or of
//! a failed backup, are garbage the pass collects. A restore verifies every object the same way
//! before the agent is asked to apply anything (`backups.restore` with a download ticket), and
//! the agent swaps the volumes only once the whole archive checked out, so a restore in doubt
//! keeps what is there. Around it the service's replicas stop and start again ([`crate::hold`]):
//! a restore whose service runs on its cluster waits `stopping` until none runs on its node.

use crate::hold;
use crate::records::{
    BACKUPS, Backup, HOLDS, HeldBy, OBJECTS, Object, PartWaiting, RESTORES, Reason, ReplicaState, Restore, State, nodes_of,
};
use crate::retention::prune;
use crate::settings::settings;
use capstan_sdk::now_ms;
use capstan_sdk::store::{self, Doc};
use capstan_sdk::{Refusal, Result, Value, agents, blobs, json, transfers};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A `running` backup or restore older than this was left by a pass that died (a pass lives at
/// most 30 s).
const STALE_MS: u64 = 3 * 60 * 1000;
/// How long the agent has to present a ticket.
const TICKET_TTL_MS: u32 = 60_000;
/// How long the agent has to present an archive's upload ticket: it makes the archive first,
/// for as long as that takes (the longest a ticket lives).
const ARCHIVE_TICKET_TTL_MS: u32 = 3_600_000;
/// How long one ask for an archive or a restore waits for it (within the job's budget of the
/// pass).
const AGENT_WAIT_MS: u64 = 8_000;
/// How soon an archive still being made, or a restore still being applied, is asked for again.
const LOOK_AGAIN_MS: u64 = 2_000;
/// How long a part may go without word from its node's agent (the node unreachable) before the
/// backup or restore fails; an agent that answers it is still at it is waited for.
const SILENCE_LIMIT_MS: u64 = 60 * 60 * 1000;
/// A job is started only with at least this much of the pass left.
pub(crate) const JOB_BUDGET: Duration = Duration::from_secs(12);
/// How long a restore waits for the service's replicas on its node to stop.
const STOP_WAIT_MS: u64 = 5 * 60 * 1000;

pub(crate) enum Job {
    Backup(Box<Doc<Backup>>),
    Restore(Box<Doc<Restore>>),
}

/// The oldest pending backup, else the oldest pending restore, else the oldest stopping
/// restore whose replicas stopped (or that waited too long).
pub(crate) fn next_job() -> Result<Option<Job>> {
    let pending = json!(State::Pending.as_str());
    let backups = store::find::<Backup>(BACKUPS, "by_state", std::slice::from_ref(&pending), None, 500)?;
    let now = now_ms();
    // a part whose archive is still being made is asked for again from its time on
    let due = backups.documents.into_iter().filter(|d| d.data.archiving.as_ref().is_none_or(|a| a.next_look_at_ms <= now));
    if let Some(b) = due.min_by_key(|d| d.data.created_at_ms) {
        return Ok(Some(Job::Backup(Box::new(b))));
    }
    let restores = store::find::<Restore>(RESTORES, "by_state", &[pending], None, 500)?;
    // a part being applied is asked for again from its time on
    let due = restores.documents.into_iter().filter(|d| d.data.applying.as_ref().is_none_or(|a| a.next_look_at_ms <= now));
    if let Some(r) = due.min_by_key(|d| d.data.created_at_ms) {
        return Ok(Some(Job::Restore(Box::new(r))));
    }
    let mut stopping = store::find::<Restore>(RESTORES, "by_state", &[json!(State::Stopping.as_str())], None, 500)?.documents;
    stopping.sort_by_key(|d| d.data.created_at_ms);
    for doc in stopping {
        let waited_out = doc.data.part_started_at_ms.or(doc.data.started_at_ms).is_some_and(|t| now.saturating_sub(t) > STOP_WAIT_MS);
        let part = next_part(&doc.data);
        if waited_out || part.is_none_or(|node| hold::stopped_on(&doc.data.service_id, &[node]).unwrap_or(false)) {
            return Ok(Some(Job::Restore(Box::new(doc))));
        }
    }
    Ok(None)
}

/// Whether a restore waits for replicas to stop (the pass comes back for it soon).
pub(crate) fn stopping() -> Result<bool> {
    Ok(!store::find::<Restore>(RESTORES, "by_state", &[json!(State::Stopping.as_str())], None, 1)?.documents.is_empty())
}

/// Where a part's objects live: `backups/<backupId>/` for a backup of one node,
/// `backups/<backupId>/<nodeId>/` for each part of one of several.
fn part_prefix(backup_id: &str, part: Option<&str>) -> String {
    match part {
        None => format!("{OBJECTS}{backup_id}/"),
        Some(node) => format!("{OBJECTS}{backup_id}/{node}/"),
    }
}

fn object_key(backup_id: &str, part: Option<&str>) -> String {
    format!("{}volumes.tar.gz", part_prefix(backup_id, part))
}

fn closure_key(backup_id: &str, part: Option<&str>) -> String {
    format!("{}database.sqlite", part_prefix(backup_id, part))
}

/// Ask the agent of `node` (of `cluster_id`) for `method`: over the node's runtime session, or —
/// a node without one (its agent runs no workloads, or an older one) — through its cluster's
/// relay, which answers only for the node it runs on (`backup-node-foreign` for another).
fn ask_node<T: serde::de::DeserializeOwned>(cluster_id: &str, node: &str, method: &str, body: &Value) -> Result<T> {
    match agents::call_node::<T>(node, method, body) {
        Err(away) if away.is("node-not-connected") => match agents::call(cluster_id, method, body) {
            // the relay runs elsewhere: the node itself is what is away
            Err(r) if r.is("backup-node-foreign") => Err(away),
            answered => answered,
        },
        answered => answered,
    }
}

/// What the agent answers `backups.archive`: the archive, and the database closure when one
/// was asked for.
#[derive(Debug, Deserialize)]
struct Archived {
    size: u64,
    sha256: String,
    #[serde(default)]
    database: Option<Sent>,
}

/// An object as the agent sent it.
#[derive(Debug, Deserialize)]
struct Sent {
    size: u64,
    sha256: String,
}

pub(crate) fn run_backup(doc: Doc<Backup>) -> Result<()> {
    let Some(mut doc) = start(BACKUPS, doc, |b| {
        let now = now_ms();
        b.state = State::Running;
        b.started_at_ms = b.started_at_ms.or(Some(now));
        b.pass_started_at_ms = Some(now);
    })?
    else {
        return Ok(());
    };
    let nodes: Vec<String> = nodes_of(&doc.data.node_id, &doc.data.nodes).into_iter().map(String::from).collect();
    let several = nodes.len() > 1;
    // one part a job: a backup of several nodes goes on across passes, never failed for taking long
    let next = nodes.iter().find(|n| !doc.data.objects.iter().any(|o| o.node_id.as_deref() == Some(n.as_str())));
    let part = match next {
        Some(node) => take_part(&doc, node, several),
        None => Ok(Part::Stored(Vec::new())),
    };
    let backup = &mut doc.data;
    let outcome = match part {
        Ok(Part::Waiting { node, unreachable }) => match wait_again(&mut backup.archiving, node, unreachable) {
            None => {
                backup.state = State::Pending;
                store::Batch::new().replace(BACKUPS, &doc.id, doc.revision, &doc.data).commit()?;
                return Ok(());
            }
            Some(reason) => Err(Verdict::Failed(reason)),
        },
        Ok(Part::Stored(objects)) => {
            backup.archiving = None;
            backup.objects.extend(objects);
            let done = nodes.iter().filter(|n| !several || backup.objects.iter().any(|o| o.node_id.as_deref() == Some(n.as_str()))).count();
            if several && done < nodes.len() {
                // the next part on the next job (a pass takes several when it has the time)
                backup.state = State::Pending;
                capstan_sdk::info!("backup {}: the part of {} nodes of {} is stored", doc.id, done, nodes.len());
                store::Batch::new().replace(BACKUPS, &doc.id, doc.revision, &doc.data).commit()?;
                return Ok(());
            }
            Ok(())
        }
        Err(verdict) => Err(verdict),
    };
    backup.finished_at_ms = Some(now_ms());
    match outcome {
        Ok(()) => {
            backup.state = State::Complete;
            backup.size = backup.objects.iter().map(|o| o.size).sum();
            if settings()?.target().is_some() {
                backup.replica_state = Some(ReplicaState::Pending);
            }
        }
        Err(Verdict::Corrupt(reason, objects)) => {
            backup.state = State::Corrupt;
            backup.reason = Some(reason);
            backup.objects.extend(objects);
        }
        Err(Verdict::Failed(reason)) => {
            backup.state = State::Failed;
            backup.reason = Some(reason);
            // nothing of a failed backup is kept
            delete_objects(&doc.id, &nodes);
            backup.objects.clear();
        }
    }
    let (service, state) = (backup.service_id.clone(), backup.state);
    capstan_sdk::info!("backup {} of service {} is {}", doc.id, service, state.as_str());
    store::Batch::new().replace(BACKUPS, &doc.id, doc.revision, &doc.data).commit()?;
    if state == State::Complete {
        prune(&service, settings()?.backup_keep_last)?;
    }
    Ok(())
}

/// A part its agent is still at, or whose node did not answer (`unreachable`): noted in
/// `waiting`, to be asked for again a little later on a pass with the time for it — `None` —
/// or, after an hour without word from the agent, why it is given up.
fn wait_again(waiting: &mut Option<PartWaiting>, node: String, unreachable: Option<Reason>) -> Option<Reason> {
    let now = now_ms();
    let part = match waiting {
        Some(part) if part.node_id == node => part,
        _ => waiting.insert(PartWaiting { node_id: node, since_ms: now, next_look_at_ms: now, heard_at_ms: None, unreachable: None }),
    };
    match &unreachable {
        None => part.heard_at_ms = Some(now),
        Some(reason) if part.given_up(now, SILENCE_LIMIT_MS) => return Some(reason.clone()),
        Some(_) => {}
    }
    part.next_look_at_ms = now + LOOK_AGAIN_MS;
    part.unreachable = unreachable;
    None
}

enum Verdict {
    Failed(Reason),
    Corrupt(Reason, Vec<Object>),
}

/// Every object a backup may have stored (a failed or interrupted one keeps none).
fn delete_objects(backup_id: &str, nodes: &[String]) {
    let parts: Vec<Option<&str>> = match nodes {
        [_] | [] => vec![None],
        nodes => nodes.iter().map(|n| Some(n.as_str())).collect(),
    };
    for part in parts {
        let _ = blobs::delete(&object_key(backup_id, part));
        let _ = blobs::delete(&closure_key(backup_id, part));
    }
}

impl From<Refusal> for Verdict {
    fn from(r: Refusal) -> Self {
        Verdict::Failed(Reason::from(&r))
    }
}

/// Have the agent of `node` archive its volumes (and take the database's closure, when the
/// service declares one), each uploaded with a ticket of its own, then verify what the blob
/// store holds. The objects name their node when the backup has `several` parts.
fn take_part(doc: &Doc<Backup>, node: &str, several: bool) -> std::result::Result<Part, Verdict> {
    let backup = &doc.data;
    let part = several.then_some(node);
    let max_bytes = settings()?.backup_max_bytes.clamp(1, 16 << 30);
    let (key, closure) = (object_key(&doc.id, part), closure_key(&doc.id, part));
    let upload = transfers::upload(&key, max_bytes, ARCHIVE_TICKET_TTL_MS)?;
    // the archive runs on its own on the node: each ask waits a while, then asks again later
    let mut body = json!({
        "serviceId": backup.service_id,
        "backupId": doc.id,
        "nodeId": node,
        "volumes": backup.volumes,
        "upload": { "url": upload.url, "token": upload.token, "maxBytes": max_bytes },
        "waitMs": AGENT_WAIT_MS,
    });
    if let Some(db) = &backup.database {
        let upload = transfers::upload(&closure, max_bytes, ARCHIVE_TICKET_TTL_MS)?;
        body["database"] = json!({
            "engine": db.engine,
            "volume": db.volume,
            "path": db.path,
            "upload": { "url": upload.url, "token": upload.token, "maxBytes": max_bytes },
        });
    }
    let sent: Archived = match ask_node::<Value>(&backup.cluster_id, node, "backups.archive", &body) {
        Ok(answer) if answer["running"] == true => return Ok(Part::Waiting { node: node.to_string(), unreachable: None }),
        Ok(answer) => serde_json::from_value(answer).map_err(|e| {
            Verdict::Failed(Reason {
                code: "agent-answer-invalid".into(),
                message: format!("the agent's answer to backups.archive does not read: {e}"),
            })
        })?,
        // the node is away for now (restarting, its session moving): asked again later
        Err(r) if r.is_retryable() => {
            return Ok(Part::Waiting { node: node.to_string(), unreachable: Some(Reason::from(&r)) });
        }
        Err(r) => return Err(r.into()),
    };
    let mut objects = vec![stored_object(&key, "volumes", &Sent { size: sent.size, sha256: sent.sha256 }, part)?];
    if backup.database.is_some() {
        let Some(database) = &sent.database else {
            return Err(Verdict::Failed(Reason {
                code: "database-closure-unsupported".into(),
                message: "the agent took no database closure: it is older than this manager; nothing was kept".into(),
            }));
        };
        objects.push(stored_object(&closure, "database", database, part)?);
    }
    if let Some(reason) = objects.iter().find_map(|(_, mismatch)| mismatch.clone()) {
        return Err(Verdict::Corrupt(reason, objects.into_iter().map(|(o, _)| o).collect()));
    }
    Ok(Part::Stored(objects.into_iter().map(|(o, _)| o).collect()))
}

/// Where one part is.
enum Part {
    /// Its objects, stored and verified.
    Stored(Vec<Object>),
    /// Its archive is still being made on `node` (or the node could not be reached: why).
    Waiting { node: String, unreachable: Option<Reason> },
}

/// The object the blob store holds at `key`, and why it is not what the agent sent, if it is not.
fn stored_object(key: &str, kind: &str, sent: &Sent, part: Option<&str>) -> std::result::Result<(Object, Option<Reason>), Verdict> {
    let Some(stored) = transfers::digest(key)? else {
        return Err(Verdict::Failed(Reason {
            code: "backup-object-missing".into(),
            message: format!("the agent reported an upload of {kind} the blob store does not hold"),
        }));
    };
    let object =
        Object { key: key.to_string(), kind: kind.into(), size: stored.size, sha256: stored.sha256, node_id: part.map(String::from) };
    let mismatch = (object.size != sent.size || object.sha256 != sent.sha256).then(|| Reason {
        code: "backup-object-mismatch".into(),
        message: format!(
            "the agent sent {} bytes of {kind} ({}), the blob store holds {} bytes ({})",
            sent.size, sent.sha256, object.size, object.sha256
        ),
    });
    Ok((object, mismatch))
}

/// The node whose part a restore applies next: the first of its nodes not restored yet.
fn next_part(restore: &Restore) -> Option<&str> {
    nodes_of(&restore.node_id, &restore.nodes).into_iter().find(|n| !restore.restored.iter().any(|r| r == n))
}

/// One job of a restore: its parts are applied one node at a time — the service's replicas on
/// that node stopped first (the others keep serving), then the part applied (across passes, as
/// long as the agent is at it), then that node's replicas started again — so a restore of
/// several nodes never stops all of them at once.
pub(crate) fn run_restore(doc: Doc<Restore>) -> Result<()> {
    let was = doc.data.state;
    let Some(mut doc) = start(RESTORES, doc, |r| {
        let now = now_ms();
        r.state = State::Running;
        r.started_at_ms = r.started_at_ms.or(Some(now));
        r.pass_started_at_ms = Some(now);
    })?
    else {
        return Ok(());
    };
    let nodes: Vec<String> = nodes_of(&doc.data.node_id, &doc.data.nodes).into_iter().map(String::from).collect();
    let Some(part) = next_part(&doc.data).map(str::to_string) else {
        return finish(doc, Ok(()));
    };
    // a part not started yet: its node's replicas stop first, waited for on later passes
    let fresh = was == State::Pending && doc.data.held.is_none() && doc.data.applying.is_none();
    let outcome = match fresh {
        true => match hold::hold(&doc.data.service_id, &doc.data.cluster_id, &[part.as_str()]) {
            Ok(Some(held)) => {
                doc.data.held = Some(held.clone());
                doc.data.state = State::Stopping;
                doc.data.part_started_at_ms = Some(now_ms());
                let holding = HeldBy { service_id: doc.data.service_id.clone(), held, restore_id: Some(doc.id.clone()) };
                let key = format!("{}.{part}", doc.id);
                store::Batch::new().replace(RESTORES, &doc.id, doc.revision, &doc.data).put(HOLDS, &key, None, &holding).commit()?;
                return Ok(());
            }
            Ok(None) => apply_restore(&mut doc, &nodes, &part),
            Err(r) => Err(Reason::from(&r)),
        },
        false if was == State::Pending || hold::stopped_on(&doc.data.service_id, &[part.as_str()]).unwrap_or(false) => {
            apply_restore(&mut doc, &nodes, &part)
        }
        false => Err(Reason {
            code: "restore-replicas-running".into(),
            message: format!("the service's replicas on {part} did not stop within 5 minutes; its part was not restored"),
        }),
    };
    let restore = &mut doc.data;
    match outcome {
        Ok(Applied::Waiting { node, unreachable }) => match wait_again(&mut restore.applying, node, unreachable) {
            None => {
                // it goes on: the agent applies the part on its own, asked again a little later
                restore.state = State::Pending;
                store::Batch::new().replace(RESTORES, &doc.id, doc.revision, &doc.data).commit()?;
                Ok(())
            }
            Some(reason) => finish(doc, Err(reason)),
        },
        Ok(Applied::Part) => {
            // the next part on the next job; this node's replicas start again on its restored data
            restore.held = None;
            restore.state = State::Pending;
            store::Batch::new().replace(RESTORES, &doc.id, doc.revision, &doc.data).commit()?;
            release_holds()?;
            Ok(())
        }
        Ok(Applied::All) => finish(doc, Ok(())),
        Err(reason) => finish(doc, Err(reason)),
    }
}

/// A restore's end: `complete`, or `failed` naming the parts restored before; its holds released
/// (the replicas start again, on the restored data or on what was there).
fn finish(mut doc: Doc<Restore>, outcome: std::result::Result<(), Reason>) -> Result<()> {
    let restore = &mut doc.data;
    restore.applying = None;
    restore.finished_at_ms = Some(now_ms());
    match outcome {
        Ok(()) => restore.state = State::Complete,
        Err(mut reason) => {
            if !restore.restored.is_empty() {
                reason.message = format!("{} (restored already: {})", reason.message, restore.restored.join(", "));
            }
            restore.state = State::Failed;
            restore.reason = Some(reason);
        }
    }
    capstan_sdk::info!(
        "restore {} of backup {} into service {} is {}",
        doc.id,
        restore.backup_id,
        restore.service_id,
        restore.state.as_str()
    );
    store::Batch::new().replace(RESTORES, &doc.id, doc.revision, &doc.data).commit()?;
    release_holds()?;
    Ok(())
}

/// Where applying a restore is.
enum Applied {
    /// Every part is applied.
    All,
    /// One more part is applied; others remain.
    Part,
    /// A part its node's agent is still applying (or whose node could not be reached: why).
    Waiting { node: String, unreachable: Option<Reason> },
}

/// Release the holds of restores that ended, and of parts restored (a failed release is tried
/// again by the next pass); how many were released.
pub(crate) fn release_holds() -> Result<u32> {
    let mut released = 0;
    for doc in store::scan::<HeldBy>(HOLDS, None, 100)?.documents {
        let restore = store::get::<Restore>(RESTORES, doc.data.restore_id.as_deref().unwrap_or(&doc.id))?;
        let done = restore.is_none_or(|r| {
            matches!(r.data.state, State::Complete | State::Failed)
                || (!doc.data.held.nodes.is_empty() && doc.data.held.nodes.iter().all(|n| r.data.restored.contains(n)))
        });
        if !done {
            continue;
        }
        match hold::release(&doc.data.service_id, &doc.data.held) {
            Ok(_) => {
                store::Batch::new().delete(HOLDS, &doc.id, doc.revision).commit()?;
                released += 1;
            }
            Err(r) => capstan_sdk::warn!("the hold of restore {} was not released ({}); the next pass tries again", doc.id, r.code()),
        }
    }
    Ok(released)
}

/// Verify every object of the backup (once), then have the agents apply their parts, one part a
/// job: a restore of several nodes, or of a large part, goes on across passes. Nothing reaches an
/// agent unless every object verified.
fn apply_restore(doc: &mut Doc<Restore>, nodes: &[String], node: &str) -> std::result::Result<Applied, Reason> {
    let restore = &mut doc.data;
    let reason = |r: Refusal| Reason::from(&r);
    let Some(backup) = store::get::<Backup>(BACKUPS, &restore.backup_id).map_err(reason)? else {
        return Err(Reason { code: "backup-not-found".into(), message: format!("backup {} is gone", restore.backup_id) });
    };
    if backup.data.state != State::Complete {
        return Err(Reason {
            code: "backup-not-complete".into(),
            message: format!("backup {} is {}", backup.id, backup.data.state.as_str()),
        });
    }
    if !restore.verified {
        verify_objects(&backup)?;
        restore.verified = true;
    }
    let several = nodes.len() > 1;
    // a part lands on its own node; a backup of one node on the restore's node
    let part = |o: &&Object| !several || o.node_id.as_deref() == Some(node);
    let objects = backup.data.objects.iter().filter(part).collect();
    match restore_part(&doc.id, restore, &backup.data, node, objects) {
        Ok(true) => {
            restore.applying = None;
            restore.restored.push(node.to_string());
            Ok(if restore.restored.len() == nodes.len() { Applied::All } else { Applied::Part })
        }
        Ok(false) => Ok(Applied::Waiting { node: node.to_string(), unreachable: None }),
        // the node is away for now (restarting, its session moving): asked again later
        Err(r) if r.is_retryable() => Ok(Applied::Waiting { node: node.to_string(), unreachable: Some(Reason::from(&r)) }),
        Err(r) => Err(Reason::from(&r)),
    }
}

/// Every object of `backup` as its manifest says — the external target's copy fetched back
/// where Capstan's is gone or changed — else the backup is marked corrupt.
fn verify_objects(backup: &Doc<Backup>) -> std::result::Result<(), Reason> {
    let reason = |r: Refusal| Reason::from(&r);
    for object in &backup.data.objects {
        let matches =
            |stored: &Option<transfers::Digest>| stored.as_ref().is_some_and(|s| s.size == object.size && s.sha256 == object.sha256);
        let mut stored = transfers::digest(&object.key).map_err(reason)?;
        // Capstan's copy gone or changed: the external target's, when the backup was copied there
        if !matches(&stored) && crate::replication::recover_object(backup, object)? {
            stored = transfers::digest(&object.key).map_err(reason)?;
        }
        if !matches(&stored) {
            let message = match stored {
                None => format!("{} is missing from the blob store", object.key),
                Some(s) => format!(
                    "{} holds {} bytes ({}), the manifest says {} bytes ({})",
                    object.key, s.size, s.sha256, object.size, object.sha256
                ),
            };
            mark_corrupt(backup.clone(), &message).map_err(reason)?;
            return Err(Reason { code: "backup-corrupt".into(), message: format!("{message}; nothing was restored") });
        }
    }
    Ok(())
}

/// Have the agent of `node` apply its part: the volumes archive, and the database closure when
/// the backup holds one (every object was verified before). The agent applies it on its own:
/// `true` once it is applied, `false` while the agent is still at it.
fn restore_part(restore_id: &str, restore: &Restore, backup: &Backup, node: &str, objects: Vec<&Object>) -> Result<bool> {
    let Some(object) = objects.iter().find(|o| o.kind == "volumes") else {
        return Err(Refusal::new("backup-corrupt", format!("the backup lists no volumes archive for {node}")));
    };
    let download = transfers::download(&object.key, TICKET_TTL_MS)?;
    let mut body = json!({
        "serviceId": restore.service_id,
        "restoreId": restore_id,
        "waitMs": AGENT_WAIT_MS,
        "nodeId": node,
        "volumes": restore.volumes,
        "download": { "url": download.url, "token": download.token },
        "size": object.size,
        "sha256": object.sha256,
    });
    let closure = objects.iter().find(|o| o.kind == "database");
    match (&backup.database, closure) {
        (Some(db), Some(closure)) => {
            let download = transfers::download(&closure.key, TICKET_TTL_MS)?;
            body["database"] = json!({
                "engine": db.engine,
                "volume": db.volume,
                "path": db.path,
                "download": { "url": download.url, "token": download.token },
                "size": closure.size,
                "sha256": closure.sha256,
            });
        }
        (None, None) => {}
        _ => return Err(Refusal::new("backup-corrupt", "the backup's database and its closure do not go together")),
    }
    let answer = ask_node::<Value>(&restore.cluster_id, node, "backups.restore", &body)?;
    Ok(answer["running"] != true)
}

fn mark_corrupt(mut backup: Doc<Backup>, message: &str) -> Result<()> {
    backup.data.state = State::Corrupt;
    backup.data.reason = Some(Reason { code: "backup-object-mismatch".into(), message: message.to_string() });
    store::Batch::new().replace(BACKUPS, &backup.id, backup.revision, &backup.data).commit()?;
    Ok(())
}

/// Move a pending record to running (compare-and-swap); `None` when another pass took it.
fn start<T: Serialize + Clone>(collection: &str, mut doc: Doc<T>, change: impl FnOnce(&mut T)) -> Result<Option<Doc<T>>> {
    change(&mut doc.data);
    match store::Batch::new().replace(collection, &doc.id, doc.revision, &doc.data).commit() {
        Ok(written) => {
            doc.revision = written.first().map_or(doc.revision + 1, |d| d.revision);
            Ok(Some(doc))
        }
        Err(r) if r.is("conflict") => Ok(None),
        Err(r) => Err(r),
    }
}

/// `running` records left by a pass that died: failed `interrupted`, their objects deleted.
pub(crate) fn fail_interrupted(now: u64) -> Result<u32> {
    let running = json!(State::Running.as_str());
    let mut failed = 0;
    let interrupted = || Some(Reason { code: "interrupted".into(), message: "the pass taking it stopped before it finished".into() });
    for mut doc in store::find::<Backup>(BACKUPS, "by_state", std::slice::from_ref(&running), None, 500)?.documents {
        // the pass taking its current part: a backup of several parts may go on for longer
        if doc.data.pass_started_at_ms.or(doc.data.started_at_ms).is_some_and(|t| now.saturating_sub(t) > STALE_MS) {
            doc.data.state = State::Failed;
            doc.data.reason = interrupted();
            doc.data.finished_at_ms = Some(now);
            if store::Batch::new().replace(BACKUPS, &doc.id, doc.revision, &doc.data).commit().is_ok() {
                delete_objects(&doc.id, &doc.data.nodes);
                failed += 1;
            }
        }
    }
    for mut doc in store::find::<Restore>(RESTORES, "by_state", &[running], None, 500)?.documents {
        // the pass taking its current part: a restore of several parts may go on for longer
        if doc.data.pass_started_at_ms.or(doc.data.started_at_ms).is_some_and(|t| now.saturating_sub(t) > STALE_MS) {
            doc.data.state = State::Failed;
            doc.data.reason = interrupted();
            doc.data.finished_at_ms = Some(now);
            if store::Batch::new().replace(RESTORES, &doc.id, doc.revision, &doc.data).commit().is_ok() {
                failed += 1;
            }
        }
    }
    Ok(failed)
}
