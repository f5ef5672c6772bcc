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
use crate::records::{BACKUPS, Backup, HOLDS, HeldBy, OBJECTS, Object, RESTORES, Reason, ReplicaState, Restore, State};
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
    if let Some(b) = backups.documents.into_iter().min_by_key(|d| d.data.created_at_ms) {
        return Ok(Some(Job::Backup(Box::new(b))));
    }
    let restores = store::find::<Restore>(RESTORES, "by_state", &[pending], None, 500)?;
    if let Some(r) = restores.documents.into_iter().min_by_key(|d| d.data.created_at_ms) {
        return Ok(Some(Job::Restore(Box::new(r))));
    }
    let now = now_ms();
    let mut stopping = store::find::<Restore>(RESTORES, "by_state", &[json!(State::Stopping.as_str())], None, 500)?.documents;
    stopping.sort_by_key(|d| d.data.created_at_ms);
    for doc in stopping {
        let waited_out = doc.data.started_at_ms.is_some_and(|t| now.saturating_sub(t) > STOP_WAIT_MS);
        if waited_out || hold::stopped_on(&doc.data.service_id, &doc.data.node_id)? {
            return Ok(Some(Job::Restore(Box::new(doc))));
        }
    }
    Ok(None)
}

/// Whether a restore waits for replicas to stop (the pass comes back for it soon).
pub(crate) fn stopping() -> Result<bool> {
    Ok(!store::find::<Restore>(RESTORES, "by_state", &[json!(State::Stopping.as_str())], None, 1)?.documents.is_empty())
}

fn object_key(backup_id: &str) -> String {
    format!("{OBJECTS}{backup_id}/volumes.tar.gz")
}

fn closure_key(backup_id: &str) -> String {
    format!("{OBJECTS}{backup_id}/database.sqlite")
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
        b.state = State::Running;
        b.started_at_ms = Some(now_ms());
    })?
    else {
        return Ok(());
    };
    let outcome = take_backup(&doc);
    let backup = &mut doc.data;
    backup.finished_at_ms = Some(now_ms());
    match outcome {
        Ok(objects) => {
            backup.state = State::Complete;
            backup.size = objects.iter().map(|o| o.size).sum();
            backup.objects = objects;
            if settings()?.target().is_some() {
                backup.replica_state = Some(ReplicaState::Pending);
            }
        }
        Err(Verdict::Corrupt(reason, objects)) => {
            backup.state = State::Corrupt;
            backup.reason = Some(reason);
            backup.objects = objects;
        }
        Err(Verdict::Failed(reason)) => {
            backup.state = State::Failed;
            backup.reason = Some(reason);
            // nothing of a failed backup is kept
            delete_objects(&doc.id);
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

enum Verdict {
    Failed(Reason),
    Corrupt(Reason, Vec<Object>),
}

/// Every object a backup may have stored (a failed or interrupted one keeps none).
fn delete_objects(backup_id: &str) {
    let _ = blobs::delete(&object_key(backup_id));
    let _ = blobs::delete(&closure_key(backup_id));
}

impl From<Refusal> for Verdict {
    fn from(r: Refusal) -> Self {
        Verdict::Failed(Reason::from(&r))
    }
}

/// Have the agent archive the volumes (and take the database's closure, when the service
/// declares one), each uploaded with a ticket of its own, then verify what the blob store holds.
fn take_backup(doc: &Doc<Backup>) -> std::result::Result<Vec<Object>, Verdict> {
    let backup = &doc.data;
    let max_bytes = settings()?.backup_max_bytes.clamp(1, 16 << 30);
    let (key, closure) = (object_key(&doc.id), closure_key(&doc.id));
    let upload = transfers::upload(&key, max_bytes, TICKET_TTL_MS)?;
    let mut body = json!({
        "serviceId": backup.service_id,
        "backupId": doc.id,
        "nodeId": backup.node_id,
        "volumes": backup.volumes,
        "upload": { "url": upload.url, "token": upload.token, "maxBytes": max_bytes },
    });
    if let Some(db) = &backup.database {
        let upload = transfers::upload(&closure, max_bytes, TICKET_TTL_MS)?;
        body["database"] = json!({
            "engine": db.engine,
            "volume": db.volume,
            "path": db.path,
            "upload": { "url": upload.url, "token": upload.token, "maxBytes": max_bytes },
        });
    }
    let sent: Archived = agents::call(&backup.cluster_id, "backups.archive", &body)?;
    let mut objects = vec![stored_object(&key, "volumes", &Sent { size: sent.size, sha256: sent.sha256 })?];
    if backup.database.is_some() {
        let Some(database) = &sent.database else {
            return Err(Verdict::Failed(Reason {
                code: "database-closure-unsupported".into(),
                message: "the agent took no database closure: it is older than this manager; nothing was kept".into(),
            }));
        };
        objects.push(stored_object(&closure, "database", database)?);
    }
    if let Some(reason) = objects.iter().find_map(|(_, mismatch)| mismatch.clone()) {
        return Err(Verdict::Corrupt(reason, objects.into_iter().map(|(o, _)| o).collect()));
    }
    Ok(objects.into_iter().map(|(o, _)| o).collect())
}

/// The object the blob store holds at `key`, and why it is not what the agent sent, if it is not.
fn stored_object(key: &str, kind: &str, sent: &Sent) -> std::result::Result<(Object, Option<Reason>), Verdict> {
    let Some(stored) = transfers::digest(key)? else {
        return Err(Verdict::Failed(Reason {
            code: "backup-object-missing".into(),
            message: format!("the agent reported an upload of {kind} the blob store does not hold"),
        }));
    };
    let object = Object { key: key.to_string(), kind: kind.into(), size: stored.size, sha256: stored.sha256 };
    let mismatch = (object.size != sent.size || object.sha256 != sent.sha256).then(|| Reason {
        code: "backup-object-mismatch".into(),
        message: format!(
            "the agent sent {} bytes of {kind} ({}), the blob store holds {} bytes ({})",
            sent.size, sent.sha256, object.size, object.sha256
        ),
    });
    Ok((object, mismatch))
}

pub(crate) fn run_restore(doc: Doc<Restore>) -> Result<()> {
    let first = doc.data.state == State::Pending;
    let Some(mut doc) = start(RESTORES, doc, |r| {
        r.state = State::Running;
        r.started_at_ms = r.started_at_ms.or(Some(now_ms()));
    })?
    else {
        return Ok(());
    };
    let outcome = match first {
        // first the service's replicas stop: the restore waits for them on later passes
        true => match hold::hold(&doc.data.service_id, &doc.data.cluster_id) {
            Ok(Some(held)) => {
                doc.data.held = Some(held.clone());
                doc.data.state = State::Stopping;
                let holding = HeldBy { service_id: doc.data.service_id.clone(), held };
                store::Batch::new().replace(RESTORES, &doc.id, doc.revision, &doc.data).put(HOLDS, &doc.id, None, &holding).commit()?;
                return Ok(());
            }
            Ok(None) => apply_restore(&doc),
            Err(r) => Err(Reason::from(&r)),
        },
        false if hold::stopped_on(&doc.data.service_id, &doc.data.node_id).unwrap_or(false) => apply_restore(&doc),
        false => Err(Reason {
            code: "restore-replicas-running".into(),
            message: format!("the service's replicas on {} did not stop within 5 minutes; nothing was restored", doc.data.node_id),
        }),
    };
    let restore = &mut doc.data;
    restore.finished_at_ms = Some(now_ms());
    match outcome {
        Ok(()) => restore.state = State::Complete,
        Err(reason) => {
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
    // the replicas start again, on the restored data or on what was there
    release_holds()?;
    Ok(())
}

/// Release the holds of restores that ended (a failed release is tried again by the next pass);
/// how many were released.
pub(crate) fn release_holds() -> Result<u32> {
    let mut released = 0;
    for doc in store::scan::<HeldBy>(HOLDS, None, 100)?.documents {
        let ended = store::get::<Restore>(RESTORES, &doc.id)?.is_none_or(|r| matches!(r.data.state, State::Complete | State::Failed));
        if !ended {
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

/// Verify every object of the backup, then have the agent apply it. Nothing reaches the agent
/// unless every object verified.
fn apply_restore(doc: &Doc<Restore>) -> std::result::Result<(), Reason> {
    let restore = &doc.data;
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
    for object in &backup.data.objects {
        let stored = transfers::digest(&object.key).map_err(reason)?;
        if stored.as_ref().is_none_or(|s| s.size != object.size || s.sha256 != object.sha256) {
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
    let Some(object) = backup.data.objects.iter().find(|o| o.kind == "volumes") else {
        return Err(Reason { code: "backup-corrupt".into(), message: "the backup lists no volumes archive".into() });
    };
    let download = transfers::download(&object.key, TICKET_TTL_MS).map_err(reason)?;
    let mut body = json!({
        "serviceId": restore.service_id,
        "nodeId": restore.node_id,
        "volumes": restore.volumes,
        "download": { "url": download.url, "token": download.token },
        "size": object.size,
        "sha256": object.sha256,
    });
    let closure = backup.data.objects.iter().find(|o| o.kind == "database");
    match (&backup.data.database, closure) {
        (Some(db), Some(closure)) => {
            let download = transfers::download(&closure.key, TICKET_TTL_MS).map_err(reason)?;
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
        _ => {
            return Err(Reason {
                code: "backup-corrupt".into(),
                message: "the backup's database and its closure do not go together".into(),
            });
        }
    }
    agents::call::<Value>(&restore.cluster_id, "backups.restore", &body).map_err(reason)?;
    Ok(())
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
        if doc.data.started_at_ms.is_some_and(|t| now.saturating_sub(t) > STALE_MS) {
            doc.data.state = State::Failed;
            doc.data.reason = interrupted();
            doc.data.finished_at_ms = Some(now);
            if store::Batch::new().replace(BACKUPS, &doc.id, doc.revision, &doc.data).commit().is_ok() {
                delete_objects(&doc.id);
                failed += 1;
            }
        }
    }
    for mut doc in store::find::<Restore>(RESTORES, "by_state", &[running], None, 500)?.documents {
        if doc.data.started_at_ms.is_some_and(|t| now.saturating_sub(t) > STALE_MS) {
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
