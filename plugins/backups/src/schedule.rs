//! Schedules: the setting `backupCron` (off unless set) is evaluated by the reconcile loop; when
//! it falls due, every service with volumes gets a backup (the `backup-all-services` run).

use crate::methods::queue_backup;
use crate::placement::{placement, services_with_volumes};
use crate::records::{RunSummary, SCHEDULE, SCHEDULE_STATE, ScheduleState, Skipped};
use crate::settings::settings;
use capstan_sdk::Result;
use capstan_sdk::now_ms;
use capstan_sdk::store;

/// When `backupCron` fell due since the last look, run `backup-all-services`; answers how many
/// backups it queued.
pub(crate) fn schedule_if_due(now: u64) -> Result<Option<u32>> {
    let Some(cron) = settings()?.backup_cron else {
        return Ok(None);
    };
    let current = store::get::<ScheduleState>(SCHEDULE, SCHEDULE_STATE)?;
    let (revision, mut state) = current.map_or((None, ScheduleState::default()), |d| (Some(d.revision), d.data));
    if state.cron.as_deref() != Some(cron.as_str()) || state.next_due_ms.is_none() {
        // a new (or changed) expression: due next at its first occurrence from now
        state.cron = Some(cron.clone());
        state.next_due_ms = next_due(&cron, now);
        store::Batch::new().put(SCHEDULE, SCHEDULE_STATE, revision, &state).commit()?;
        return Ok(None);
    }
    if state.next_due_ms.is_some_and(|due| now < due) {
        return Ok(None);
    }
    let summary = backup_all("schedule")?;
    let queued = summary.queued;
    state.next_due_ms = next_due(&cron, now);
    state.last_run = Some(summary);
    store::Batch::new().put(SCHEDULE, SCHEDULE_STATE, revision, &state).commit()?;
    Ok(Some(queued))
}

/// The first occurrence of `cron` after `after_ms` (none if it never comes); why, when the
/// expression does not parse.
fn next_occurrence(cron: &str, after_ms: u64) -> std::result::Result<Option<u64>, String> {
    use std::str::FromStr;
    let parsed = croner::Cron::from_str(cron).map_err(|e| e.to_string())?;
    let Some(after) = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(i64::try_from(after_ms).unwrap_or(i64::MAX)) else {
        return Ok(None);
    };
    Ok(parsed.find_next_occurrence(&after, false).ok().and_then(|t| u64::try_from(t.timestamp_millis()).ok()))
}

/// [`next_occurrence`]; an expression that does not parse stops the schedule (logged) rather
/// than fail every pass.
fn next_due(cron: &str, after_ms: u64) -> Option<u64> {
    next_occurrence(cron, after_ms).unwrap_or_else(|why| {
        capstan_sdk::warn!("backupCron {cron:?} is not a cron expression ({why}); no scheduled backups until it is fixed");
        None
    })
}

/// `backup-all-services`: a pending backup for every service with volumes that can be placed
/// (the nodes its replicas stand on, else its only cluster's only node); the others are listed
/// with the code that says why.
pub(crate) fn backup_all(by: &str) -> Result<RunSummary> {
    let mut summary = RunSummary { at_ms: now_ms(), by: by.to_string(), queued: 0, skipped: Vec::new() };
    for service in services_with_volumes()? {
        match placement(&service.id, None, None) {
            Ok((cluster, nodes)) => {
                queue_backup(&service.data, &service.id, cluster, nodes, "schedule", by)?;
                summary.queued += 1;
            }
            Err(r) => summary.skipped.push(Skipped { service_id: service.id, code: r.code().to_string() }),
        }
    }
    capstan_sdk::info!("backup-all-services by {by}: {} queued, {} skipped", summary.queued, summary.skipped.len());
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_occurrence_follows_the_expression_and_a_bad_one_stops_the_schedule() {
        // 2026-12-02T15:00:00Z
        let at = 1_796_223_600_000u64;
        assert_eq!(next_occurrence("30 15 * * *", at), Ok(Some(at + 30 * 60 * 1000)));
        assert_eq!(next_occurrence("0 15 * * *", at), Ok(Some(at + 24 * 3600 * 1000)), "strictly after");
        assert!(next_occurrence("not a cron", at).is_err());
        assert!(next_occurrence("61 * * * *", at).is_err());
    }
}
