//! External target: with `backupTargetEndpoint` and `backupTargetBucket` set, every complete
//! backup is replicated to that S3 bucket by the host (`transfers.replicate`: the bytes never
//! pass through the plugin), each object read back there and checked against the manifest,
//! and the manifest itself (`manifest.json`) written last, so a manifest on the far side means
//! a whole copy. The credentials are the system secret `BACKUP_TARGET_CREDENTIALS`
//! (`<access key id>:<secret access key>`, management scope `backups:target`), read when needed
//! and never stored. A failed copy is retried with a growing delay; `backups.replicate` asks
//! again at once.

use crate::jobs::JOB_BUDGET;
use crate::records::{BACKUPS, Backup, OBJECTS, Object, Reason, Replica, ReplicaState, SCHEDULE, SCHEDULE_STATE, ScheduleState, State};
use crate::settings::{Target, settings};
use capstan_sdk::now_ms;
use capstan_sdk::store::{self, Doc};
use capstan_sdk::{Context, Refusal, Result, blobs, json, secrets, transfers};

/// The management scope of the external target's credentials, and the secret's key.
const TARGET_SCOPE: &str = "backups:target";
const TARGET_SECRET: &str = "BACKUP_TARGET_CREDENTIALS";
/// A failed replication is tried again after this, doubling per attempt up to [`RETRY_MAX_MS`].
const RETRY_FIRST_MS: u64 = 5 * 60 * 1000;
const RETRY_MAX_MS: u64 = 6 * 60 * 60 * 1000;

/// Copy the backups due for the external target while the pass has time; answers how many
/// were copied and how many failed.
pub(crate) fn replicate_due(ctx: &Context, now: u64) -> Result<(u32, u32)> {
    let Some(target) = settings()?.target() else {
        return Ok((0, 0));
    };
    queue_for_target(&target)?;
    let mut due = Vec::new();
    for state in [ReplicaState::Pending, ReplicaState::Failed] {
        let page = store::find::<Backup>(BACKUPS, "by_replica", &[json!(state)], None, 200)?;
        due.extend(page.documents.into_iter().filter(|d| {
            d.data.state == State::Complete && d.data.replica.as_ref().and_then(|r| r.next_attempt_at_ms).is_none_or(|at| at <= now)
        }));
    }
    due.sort_by_key(|d| d.data.created_at_ms);
    let mut credentials = None;
    let (mut copied, mut failed) = (0, 0);
    for mut doc in due {
        if ctx.remaining() <= JOB_BUDGET {
            break;
        }
        // read once per pass, and only when there is something to copy
        let credentials = credentials.get_or_insert_with(target_credentials).clone();
        let outcome = credentials.and_then(|(id, secret)| copy_backup(&doc, &target, id, secret));
        let replica = doc.data.replica.get_or_insert(Replica {
            target: None,
            reason: None,
            attempts: 0,
            next_attempt_at_ms: None,
            completed_at_ms: None,
        });
        replica.target = Some(target.name());
        replica.attempts += 1;
        match outcome {
            Ok(()) => {
                doc.data.replica_state = Some(ReplicaState::Complete);
                replica.reason = None;
                replica.next_attempt_at_ms = None;
                replica.completed_at_ms = Some(now_ms());
                copied += 1;
            }
            Err(reason) => {
                let delay = retry_delay_ms(replica.attempts);
                capstan_sdk::warn!(
                    "replicating backup {} failed: {} ({}); trying again in {} s",
                    doc.id,
                    reason.code,
                    reason.message,
                    delay / 1000
                );
                doc.data.replica_state = Some(ReplicaState::Failed);
                if reason.code == "backup-corrupt" {
                    // as a restore finds it: never restored, never copied again
                    doc.data.state = State::Corrupt;
                    doc.data.reason = Some(Reason { code: "backup-object-mismatch".into(), message: reason.message.clone() });
                }
                replica.reason = Some(reason);
                replica.next_attempt_at_ms = Some(now_ms() + delay);
                failed += 1;
            }
        }
        // pruned or asked again meanwhile: that write wins
        match store::Batch::new().replace(BACKUPS, &doc.id, doc.revision, &doc.data).commit() {
            Ok(_) => {}
            Err(r) if r.is("conflict") || r.is("not-found") => {}
            Err(r) => return Err(r),
        }
    }
    Ok((copied, failed))
}

/// How long after its `attempts`-th failed attempt a replication is tried again: 5 minutes,
/// doubling, at most 6 hours.
fn retry_delay_ms(attempts: u32) -> u64 {
    RETRY_FIRST_MS.saturating_mul(1 << attempts.saturating_sub(1).min(16)).min(RETRY_MAX_MS)
}

/// A target not seen before: every complete backup not yet copied there is queued for it.
fn queue_for_target(target: &Target) -> Result<()> {
    let name = target.name();
    let current = store::get::<ScheduleState>(SCHEDULE, SCHEDULE_STATE)?;
    let (revision, mut state) = current.map_or((None, ScheduleState::default()), |d| (Some(d.revision), d.data));
    if state.replica_target.as_deref() == Some(name.as_str()) {
        return Ok(());
    }
    let complete = json!(State::Complete.as_str());
    let mut cursor: Option<String> = None;
    let mut queued = 0;
    loop {
        let page = store::find::<Backup>(BACKUPS, "by_state", std::slice::from_ref(&complete), cursor.as_deref(), 500)?;
        for mut doc in page.documents {
            let there = doc.data.replica_state == Some(ReplicaState::Complete)
                && doc.data.replica.as_ref().and_then(|r| r.target.as_deref()) == Some(name.as_str());
            if there || doc.data.replica_state == Some(ReplicaState::Pending) {
                continue;
            }
            doc.data.replica_state = Some(ReplicaState::Pending);
            doc.data.replica = None;
            if store::Batch::new().replace(BACKUPS, &doc.id, doc.revision, &doc.data).commit().is_ok() {
                queued += 1;
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    capstan_sdk::info!("external target {name}: {queued} complete backups queued for it");
    state.replica_target = Some(name);
    store::Batch::new().put(SCHEDULE, SCHEDULE_STATE, revision, &state).commit()?;
    Ok(())
}

/// The target's key pair from the system secret `BACKUP_TARGET_CREDENTIALS`
/// (`<access key id>:<secret access key>`), or why there is none.
fn target_credentials() -> std::result::Result<(String, String), Reason> {
    let missing = |message: String| Reason { code: "backup-target-credentials-missing".into(), message };
    let listed = secrets::list(TARGET_SCOPE).map_err(|r| Reason::from(&r))?;
    let Some(secret) = listed.iter().find(|s| s.key == TARGET_SECRET && s.state == "active") else {
        return Err(missing(format!(
            "no active secret {TARGET_SECRET} in the management scope {TARGET_SCOPE}: \
             capstan secrets set-system {TARGET_SECRET} --system-id backups --scope {TARGET_SCOPE} < <access key id>:<secret access key>"
        )));
    };
    let value = secrets::reveal(TARGET_SCOPE, &secret.id).map_err(|r| Reason::from(&r))?;
    let text = String::from_utf8(value).map_err(|_| missing(format!("{TARGET_SECRET} is not text")))?;
    match text.trim().split_once(':') {
        Some((id, secret)) if !id.is_empty() && !secret.is_empty() => Ok((id.to_string(), secret.to_string())),
        _ => Err(missing(format!("{TARGET_SECRET} must be <access key id>:<secret access key>"))),
    }
}

/// The target with its key pair, as the host's transfers take it.
fn s3_target(target: &Target, access_key_id: String, secret_access_key: String) -> transfers::S3Target {
    transfers::S3Target {
        endpoint: target.endpoint.clone(),
        region: target.region.clone(),
        bucket: target.bucket.clone(),
        prefix: target.prefix.clone(),
        access_key_id,
        secret_access_key,
    }
}

/// A refusal of the target, in the manager's words for its credentials.
fn named(r: Refusal) -> Reason {
    match r.code() {
        "s3-target-credentials-rejected" => Reason { code: "backup-target-credentials-rejected".into(), message: r.message().to_string() },
        _ => Reason::from(&r),
    }
}

/// Bring `object` of `doc` back from the external target into the blob store, when Capstan's
/// own copy is gone or no longer matches the manifest: only from the target the backup's copy
/// completed on (the one set now), and only what reads back exactly as the manifest says
/// (otherwise the copy here is deleted). `Ok(false)`: there is no copy to recover from.
pub(crate) fn recover_object(doc: &Doc<Backup>, object: &Object) -> std::result::Result<bool, Reason> {
    let Some(target) = settings().map_err(|r| Reason::from(&r))?.target() else {
        return Ok(false);
    };
    let copied_there = doc.data.replica_state == Some(ReplicaState::Complete)
        && doc.data.replica.as_ref().and_then(|r| r.target.as_deref()) == Some(target.name().as_str());
    if !copied_there {
        return Ok(false);
    }
    let (id, secret) = target_credentials()?;
    let Some(recovered) = transfers::recover(&object.key, &s3_target(&target, id, secret)).map_err(named)? else {
        return Ok(false);
    };
    if recovered.size != object.size || recovered.sha256 != object.sha256 {
        let _ = blobs::delete(&object.key);
        return Err(Reason {
            code: "backup-target-mismatch".into(),
            message: format!(
                "{} reads back from the target as {} bytes ({}), the manifest says {} bytes ({}); nothing was restored",
                object.key, recovered.size, recovered.sha256, object.size, object.sha256
            ),
        });
    }
    capstan_sdk::info!("backup {}: {} recovered from the external target {}", doc.id, object.key, target.name());
    Ok(true)
}

/// Copy every object of a complete backup to the target, each read back there and checked
/// against the manifest, then the manifest itself (`manifest.json`), last.
fn copy_backup(doc: &Doc<Backup>, target: &Target, access_key_id: String, secret_access_key: String) -> std::result::Result<(), Reason> {
    let s3 = s3_target(target, access_key_id, secret_access_key);
    for object in &doc.data.objects {
        // only what the manifest says goes out: an object changed here is corrupt, and is not sent
        let here = transfers::digest(&object.key).map_err(named)?;
        if here.as_ref().is_none_or(|h| h.size != object.size || h.sha256 != object.sha256) {
            return Err(Reason {
                code: "backup-corrupt".into(),
                message: format!("{} no longer matches the manifest in the blob store; nothing of it was copied", object.key),
            });
        }
        let far = transfers::replicate(&object.key, &s3).map_err(named)?;
        if far.size != object.size || far.sha256 != object.sha256 {
            return Err(Reason {
                code: "backup-target-mismatch".into(),
                message: format!(
                    "{} reads back from the target as {} bytes ({}), the manifest says {} bytes ({})",
                    object.key, far.size, far.sha256, object.size, object.sha256
                ),
            });
        }
    }
    let mut manifest = doc.data.clone();
    manifest.replica_state = None;
    manifest.replica = None;
    let bytes = serde_json::to_vec_pretty(&json!({ "id": doc.id, "backup": manifest }))
        .map_err(|e| Reason { code: "internal".into(), message: format!("the manifest does not encode: {e}") })?;
    let key = format!("{OBJECTS}{}/manifest.json", doc.id);
    blobs::put(&key, &bytes, blobs::PutMode::Overwrite).map_err(|r| Reason::from(&r))?;
    let far = transfers::replicate(&key, &s3).map_err(named);
    // only the far side keeps it: here the record is the manifest
    let _ = blobs::delete(&key);
    if far?.size != bytes.len() as u64 {
        return Err(Reason { code: "backup-target-mismatch".into(), message: "the manifest reads back from the target changed".into() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_replication_waits_longer_each_time_up_to_six_hours() {
        let minutes = |attempts| retry_delay_ms(attempts) / 60_000;
        assert_eq!([minutes(0), minutes(1), minutes(2), minutes(3), minutes(7)], [5, 5, 10, 20, 320]);
        assert_eq!(minutes(8), 360);
        assert_eq!(minutes(u32::MAX), 360);
    }
}
