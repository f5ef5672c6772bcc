//! Retention: every complete backup prunes its service to `backupKeepLast` (24 unless set),
//! oldest first, never the only complete one; objects without a record, or of a failed backup,
//! are collected.

use crate::records::{BACKUPS, Backup, OBJECTS, State};
use capstan_sdk::store::{self, Doc};
use capstan_sdk::{Result, blobs, json};

/// Keep the newest `keep` complete backups of `service`; delete older ones (and failed or
/// corrupt ones older than the oldest kept), the record first — it is the commit point — then
/// its objects. The only complete backup is never pruned (`keep` is at least 1).
pub(crate) fn prune(service: &str, keep: u32) -> Result<u32> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store::find::<Backup>(BACKUPS, "by_service", &[json!(service)], cursor.as_deref(), 500)?;
        all.extend(page.documents);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let mut complete: Vec<&Doc<Backup>> = all.iter().filter(|d| d.data.state == State::Complete).collect();
    complete.sort_by_key(|b| std::cmp::Reverse(b.data.created_at_ms));
    let keep = keep.max(1) as usize;
    let Some(oldest_kept) = complete.get(keep.min(complete.len()).saturating_sub(1)).map(|d| d.data.created_at_ms) else {
        return Ok(0);
    };
    let doomed = all.iter().filter(|d| match d.data.state {
        State::Complete => d.data.created_at_ms < oldest_kept,
        State::Failed | State::Corrupt => d.data.created_at_ms < oldest_kept,
        State::Pending | State::Stopping | State::Running => false,
    });
    let mut pruned = 0;
    for doc in doomed {
        if store::Batch::new().delete(BACKUPS, &doc.id, doc.revision).commit().is_ok() {
            for object in &doc.data.objects {
                let _ = blobs::delete(&object.key);
            }
            pruned += 1;
        }
    }
    if pruned > 0 {
        capstan_sdk::info!("pruned {pruned} backups of service {service}, keeping the newest {keep} complete");
    }
    Ok(pruned)
}

/// Objects under `backups/` whose backup has no record, or a failed one: deleted. At most one
/// page of the listing per pass.
pub(crate) fn collect_garbage() -> Result<u32> {
    let page = blobs::list(OBJECTS, None, 1000)?;
    let mut collected = 0;
    let mut judged: Option<(String, bool)> = None;
    for info in page.items {
        let Some(backup_id) = info.key.strip_prefix(OBJECTS).and_then(|rest| rest.split('/').next()).map(str::to_string) else { continue };
        let garbage = match &judged {
            Some((id, garbage)) if *id == backup_id => *garbage,
            _ => {
                let garbage = match store::get::<Backup>(BACKUPS, &backup_id)? {
                    None => true,
                    Some(doc) => doc.data.state == State::Failed,
                };
                judged = Some((backup_id, garbage));
                garbage
            }
        };
        if garbage && blobs::delete(&info.key)? {
            collected += 1;
        }
    }
    Ok(collected)
}
