//! The backups manager: backups of a service's volumes, taken by the agent of the cluster the
//! service runs on and restored through it.
//!
//! A request (`backups.create`, `backups.restore`) only records what is wanted (`pending`) and
//! publishes an event that wakes the reconcile loop; the pass does the work within its
//! deadline. The manager is wired together here; the rest lives by concern:
//!
//! - `records`: backups, restores and the schedule's state, and where they are kept;
//! - `settings`: the operator's settings and the external target they name;
//! - `methods`: the methods, which record what is wanted or read what is recorded;
//! - `placement`: the service, cluster and node a backup runs through;
//! - `jobs`: taking a backup and applying a restore, each verified against the blob store;
//! - `retention`: pruning to `backupKeepLast`, and collecting objects of no backup or of a failed one;
//! - `replication`: copies on the external S3 target;
//! - `schedule`: `backupCron` and the `backup-all-services` run.

mod hold;
mod jobs;
mod methods;
mod placement;
mod records;
mod replication;
mod retention;
mod schedule;
mod settings;

use capstan_sdk::now_ms;
use capstan_sdk::{CollectionSpec, Context, Descriptor, Event, Manager, Page, ReconcileOutcome, ReconcileTrigger, Result, Role};
use jobs::{JOB_BUDGET, Job, fail_interrupted, next_job, release_holds, run_backup, run_restore, stopping};
use methods::{create, get, get_restore, list, overview, replicate, restore, run_all};
use records::{BACKUPS, HOLDS, RESTORES, SCHEDULE};
use replication::replicate_due;
use retention::collect_garbage;
use schedule::schedule_if_due;
use std::num::NonZeroU32;
use std::time::Duration;

/// Garbage is collected in passes whose minute is a multiple of this (no state kept for it).
const GC_EVERY_MINUTES: u64 = 10;

/// Complete backups kept per service unless `backupKeepLast` says otherwise. Declared as a
/// `NonZeroU32`, whose schema has `minimum: 1`: `settings.update` refuses 0 by that schema
/// (`setting-invalid`), as the setting's summary says, rather than storing what would keep none.
const DEFAULT_KEEP_LAST: NonZeroU32 = NonZeroU32::new(24).expect("24 is not 0");

struct Backups;

impl Manager for Backups {
    fn describe() -> Descriptor {
        Descriptor::new()
            .method(
                "create",
                "Back up a service's volumes now: recorded pending, taken by the agents of the nodes its volumes are on.",
                Role::Owner,
                create,
            )
            .method("get", "One backup: state, reason, objects with size and SHA-256.", Role::Member, get)
            .read_only()
            .method("list", "An organization's backups (or one service's), newest first.", Role::Member, list)
            .read_only()
            .method("restore", "Restore a complete backup into its service (or another of the organization).", Role::Owner, restore)
            .method("getRestore", "One restore: state and reason.", Role::Member, get_restore)
            .read_only()
            .method("overview", "Every backup and restore, newest first, with the schedule and retention.", Role::Admin, overview)
            .read_only()
            .method("runAll", "Back up every service with volumes now (what backupCron runs).", Role::Admin, run_all)
            .method("replicate", "Copy a complete backup to the external S3 target now (again, if it failed).", Role::Owner, replicate)
            .setting::<Option<String>>(
                "backupCron",
                "When every service with volumes is backed up: a 5-field cron expression (UTC), or null for never",
                None,
            )
            .setting(
                "backupKeepLast",
                "Complete backups kept per service, at least 1 (the oldest are pruned first)",
                Some(DEFAULT_KEEP_LAST),
            )
            .setting("backupMaxBytes", "The largest archive one backup may store, in bytes (at most 16 GiB)", Some(4u64 << 30))
            .setting::<Option<String>>(
                "backupTargetEndpoint",
                "The external S3 target's endpoint, http(s)://host[:port] (path-style), or null for no external copies",
                None,
            )
            .setting::<Option<String>>("backupTargetBucket", "The external S3 target's bucket", None)
            .setting("backupTargetPrefix", "Where in the bucket copies go: <prefix>/backups/<backupId>/…", Some("capstan".to_string()))
            .setting("backupTargetRegion", "The external S3 target's region", Some("us-east-1".to_string()))
            // /p/backups: every service's backups (state, size, age), the schedule, restores
            .nav("Backups", "database")
            .page(Page::new("", "Backups", "overview").template("overview").form("runAll").form("create").form("replicate"))
            // /p/backups/restore?organizationId=…&backupId=…: what a restore replaces, confirmed there
            .page(Page::new("restore", "Restore a backup", "get").template("restore").form("restore").hidden())
            // /p/backups/organization?organizationId=…: an organization's backups, for its members
            .page(Page::new("organization", "Backups of an organization", "list").template("organization"))
            .collection(
                CollectionSpec::new(BACKUPS)
                    .index("by_org", &["organizationId"])
                    .index("by_service", &["serviceId"])
                    .index("by_state", &["state"])
                    .index("by_replica", &["replicaState"]),
            )
            .collection(CollectionSpec::new(RESTORES).index("by_org", &["organizationId"]).index("by_state", &["state"]))
            .collection(HOLDS)
            .collection(SCHEDULE)
            .subscribe("backups.requested")
            .reconcile_every(Duration::from_secs(60))
    }

    /// A request was recorded: the event's delivery already hints the reconcile loop.
    fn on_event(_ctx: &Context, _event: Event) -> Result<()> {
        Ok(())
    }

    fn reconcile(ctx: &Context, _trigger: ReconcileTrigger) -> Result<ReconcileOutcome> {
        let now = now_ms();
        let mut summary = Vec::new();
        let interrupted = fail_interrupted(now)?;
        if interrupted > 0 {
            summary.push(format!("{interrupted} interrupted"));
        }
        let released = release_holds()?;
        if released > 0 {
            summary.push(format!("{released} holds released"));
        }
        if let Some(queued) = schedule_if_due(now)? {
            summary.push(format!("schedule queued {queued}"));
        }
        let mut done = 0;
        while ctx.remaining() > JOB_BUDGET {
            let Some(job) = next_job()? else { break };
            match job {
                Job::Backup(doc) => run_backup(*doc)?,
                Job::Restore(doc) => run_restore(*doc)?,
            }
            done += 1;
        }
        if done > 0 {
            summary.push(format!("{done} jobs"));
        }
        let (copied, failed) = replicate_due(ctx, now)?;
        if copied + failed > 0 {
            summary.push(format!("{copied} replicated, {failed} replications failed"));
        }
        if (now / 60_000).is_multiple_of(GC_EVERY_MINUTES) {
            let collected = collect_garbage()?;
            if collected > 0 {
                summary.push(format!("{collected} objects collected"));
            }
        }
        let outcome = ReconcileOutcome::done(if summary.is_empty() { "idle".to_string() } else { summary.join(", ") });
        // more waiting: come back at once rather than after the period; a restore waiting for
        // replicas to stop, within a second
        Ok(if next_job()?.is_some() {
            outcome.requeue_after(Duration::from_millis(100))
        } else if stopping()? {
            outcome.requeue_after(Duration::from_secs(1))
        } else {
            outcome
        })
    }
}

capstan_sdk::manager!(Backups);

#[cfg(test)]
mod tests {
    use capstan_sdk::Manager;

    #[test]
    fn keep_last_is_declared_at_least_one_so_zero_is_refused() {
        let described = super::Backups::describe().to_wit();
        let keep_last = described.settings.iter().find(|s| s.key == "backupKeepLast").expect("declared");
        let schema: serde_json::Value = serde_json::from_str(&keep_last.schema).unwrap();
        assert_eq!((schema["type"].as_str(), schema["minimum"].as_u64()), (Some("integer"), Some(1)), "{schema}");
        assert_eq!(keep_last.default.as_deref(), Some("24"));
    }
}
