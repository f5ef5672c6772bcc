//! The backups manager: backups of a service's volumes, taken by the agent of the cluster the
//! service runs on and restored through it.
//!
//! A request (`backups.create`, `backups.restore`) only records what is wanted (`pending`) and
//! publishes an event that wakes the reconcile loop; the pass does the work within its
//! deadline. For a backup it mints an upload ticket (`transfers`), asks the cluster's relay to
//! archive the service's volume directories and `PUT` the archive with it (`backups.archive`),
//! so the bytes go agent → host → blob store and never through this plugin; then it has the
//! host read the stored object back (`transfers.digest`) and compares length and SHA-256 with
//! what the agent sent. The backup record is the commit point: only a record whose objects
//! verify is `complete`; one whose objects do not is `corrupt`; objects without a record, or of
//! a failed backup, are garbage the pass collects. A restore verifies every object the same way
//! before the agent is asked to apply anything (`backups.restore` with a download ticket), and
//! the agent swaps the volumes only once the whole archive checked out, so a restore in doubt
//! keeps what is there.
//!
//! Schedules: the setting `backupCron` (off unless set) is evaluated by the reconcile loop; when
//! it falls due, every service with volumes gets a backup (the `backup-all-services` run), and
//! every complete backup prunes its service to `backupKeepLast` (24 unless set), oldest first,
//! never the only complete one.
//!
//! External target: with `backupTargetEndpoint` and `backupTargetBucket` set, every complete
//! backup is replicated to that S3 bucket by the host (`transfers.replicate`: the bytes never
//! pass through the plugin), each object read back there and checked against the manifest,
//! and the manifest itself (`manifest.json`) written last, so a manifest on the far side means
//! a whole copy. The credentials are the system secret `BACKUP_TARGET_CREDENTIALS`
//! (`<access key id>:<secret access key>`, management scope `backups:target`), read when needed
//! and never stored. A failed copy is retried with a growing delay; `backups.replicate` asks
//! again at once.

use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::now_ms;
use capstan_sdk::store::{self, Doc};
use capstan_sdk::{
    CollectionSpec, Context, Descriptor, Empty, Event, JsonSchema, Manager, Page, ReconcileOutcome, ReconcileTrigger, Refusal, Result,
    Role, Value,
};
use capstan_sdk::{agents, blobs, events, json, secrets, settings, transfers};
use serde::{Deserialize, Serialize};
use std::time::Duration;

const BACKUPS: &str = "backups";
const RESTORES: &str = "restores";
const SCHEDULE: &str = "schedule";
/// The one document of [`SCHEDULE`].
const SCHEDULE_STATE: &str = "state";
/// Where backups' objects live in the plugin's blob prefix: `backups/<backupId>/…`.
const OBJECTS: &str = "backups/";
/// A `running` backup or restore older than this was left by a pass that died (a pass lives at
/// most 30 s).
const STALE_MS: u64 = 3 * 60 * 1000;
/// How long the agent has to present a ticket.
const TICKET_TTL_MS: u32 = 60_000;
/// A job is started only with at least this much of the pass left.
const JOB_BUDGET: Duration = Duration::from_secs(12);
/// Garbage is collected in passes whose minute is a multiple of this (no state kept for it).
const GC_EVERY_MINUTES: u64 = 10;
/// The management scope of the external target's credentials, and the secret's key.
const TARGET_SCOPE: &str = "backups:target";
const TARGET_SECRET: &str = "BACKUP_TARGET_CREDENTIALS";
/// A failed replication is tried again after this, doubling per attempt up to [`RETRY_MAX_MS`].
const RETRY_FIRST_MS: u64 = 5 * 60 * 1000;
const RETRY_MAX_MS: u64 = 6 * 60 * 60 * 1000;

struct Backups;

impl Manager for Backups {
    fn describe() -> Descriptor {
        Descriptor::new()
            .method("create", "Back up a service's volumes now: recorded pending, taken by its cluster's agent.", Role::Owner, create)
            .method("get", "One backup: state, reason, objects with size and SHA-256.", Role::Member, get)
            .method("list", "An organization's backups (or one service's), newest first.", Role::Member, list)
            .method("restore", "Restore a complete backup into its service (or another of the organization).", Role::Owner, restore)
            .method("getRestore", "One restore: state and reason.", Role::Member, get_restore)
            .method("overview", "Every backup and restore, newest first, with the schedule and retention.", Role::Admin, overview)
            .method("runAll", "Back up every service with volumes now (what backupCron runs).", Role::Admin, run_all)
            .method("replicate", "Copy a complete backup to the external S3 target now (again, if it failed).", Role::Owner, replicate)
            .setting::<Option<String>>(
                "backupCron",
                "When every service with volumes is backed up: a 5-field cron expression (UTC), or null for never",
                None,
            )
            .setting("backupKeepLast", "Complete backups kept per service, at least 1 (the oldest are pruned first)", Some(24u32))
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
        // more waiting: come back at once rather than after the period
        Ok(if next_job()?.is_some() { outcome.requeue_after(Duration::from_millis(100)) } else { outcome })
    }
}

capstan_sdk::manager!(Backups);

// ---- records ----

/// Where a backup or restore is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
enum State {
    /// Recorded; the reconcile loop takes it next.
    Pending,
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
    fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Complete => "complete",
            State::Failed => "failed",
            State::Corrupt => "corrupt",
        }
    }
}

/// Why a backup or restore failed: a refusal code and its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
struct Reason {
    code: String,
    message: String,
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
struct Database {
    /// `sqlite`.
    engine: String,
    /// The volume holding it.
    volume: String,
    /// Its file inside the volume.
    path: String,
}

/// One stored object of a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
struct Object {
    /// Under the plugin's blob prefix.
    key: String,
    /// `volumes`: a gzip-compressed tar of the service's volume directories (without the
    /// database's files); `database`: the database's closure.
    kind: String,
    size: u64,
    sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Backup {
    organization_id: String,
    service_id: String,
    service_name: String,
    cluster_id: String,
    /// The node whose volumes are backed up (data is node-local).
    node_id: String,
    volumes: Vec<String>,
    /// The service's database when the backup was asked for: its closure is an object of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    database: Option<Database>,
    state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
    /// `manual` or `schedule`.
    trigger: String,
    requested_by: String,
    created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finished_at_ms: Option<u64>,
    /// The manifest: every object with its exact length and SHA-256.
    #[serde(default)]
    objects: Vec<Object>,
    /// The objects' total size, in bytes.
    #[serde(default)]
    size: u64,
    /// `pending`, `complete` or `failed`: where the copy on the external target is (indexed;
    /// absent when no target was set when the backup completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replica_state: Option<ReplicaState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replica: Option<Replica>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
enum ReplicaState {
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
struct Replica {
    /// `<endpoint>/<bucket>/<prefix>` of the last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
    #[serde(default)]
    attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next_attempt_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    completed_at_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Restore {
    organization_id: String,
    backup_id: String,
    /// The service restored into (the backup's own unless named).
    service_id: String,
    cluster_id: String,
    node_id: String,
    volumes: Vec<String>,
    state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
    requested_by: String,
    created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finished_at_ms: Option<u64>,
}

/// A record with its id and revision, as methods answer it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Shown<T> {
    id: String,
    revision: u64,
    #[serde(flatten)]
    record: T,
}

fn shown<T>(doc: Doc<T>) -> Shown<T> {
    Shown { id: doc.id, revision: doc.revision, record: doc.data }
}

/// What the schedule did last, and when it is due next.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ScheduleState {
    /// The expression `next_due_ms` was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cron: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next_due_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_run: Option<RunSummary>,
    /// The external target complete backups were last queued for (a new one queues them all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replica_target: Option<String>,
}

/// One `backup-all-services` run.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct RunSummary {
    at_ms: u64,
    /// `schedule` or the administrator who asked.
    by: String,
    queued: u32,
    /// Services with volumes that could not be placed, with the code that says why.
    skipped: Vec<Skipped>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Skipped {
    service_id: String,
    code: String,
}

// ---- settings ----

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Settings {
    #[serde(default)]
    backup_cron: Option<String>,
    backup_keep_last: u32,
    backup_max_bytes: u64,
    #[serde(default)]
    backup_target_endpoint: Option<String>,
    #[serde(default)]
    backup_target_bucket: Option<String>,
    backup_target_prefix: String,
    backup_target_region: String,
}

impl Settings {
    /// The external target, when one is set (endpoint and bucket); credentials are not here.
    fn target(&self) -> Option<Target> {
        let endpoint = self.backup_target_endpoint.as_deref().map(str::trim).filter(|e| !e.is_empty())?;
        let bucket = self.backup_target_bucket.as_deref().map(str::trim).filter(|b| !b.is_empty())?;
        Some(Target {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            bucket: bucket.to_string(),
            prefix: self.backup_target_prefix.trim_matches('/').to_string(),
            region: self.backup_target_region.trim().to_string(),
        })
    }
}

/// The external target the settings name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Target {
    endpoint: String,
    bucket: String,
    prefix: String,
    region: String,
}

impl Target {
    /// How a backup's replica names where it went.
    fn name(&self) -> String {
        match self.prefix.as_str() {
            "" => format!("{}/{}", self.endpoint, self.bucket),
            prefix => format!("{}/{}/{prefix}", self.endpoint, self.bucket),
        }
    }
}

// ---- methods ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateInput {
    organization_id: String,
    service_id: String,
    /// Required when Capstan manages more than one cluster (`cluster-required`).
    #[serde(default)]
    cluster_id: Option<String>,
    /// The node whose volumes are backed up; required when the cluster has more than one
    /// (`backup-node-required`).
    #[serde(default)]
    node_id: Option<String>,
}

fn create(ctx: &Context, input: CreateInput) -> Result<Shown<Backup>> {
    let service = service_of(&input.organization_id, &input.service_id)?;
    if service.volumes.is_empty() {
        return Err(Refusal::new(
            "service-has-no-volumes",
            format!("service {} declares no volumes: there is nothing to back up", service.name),
        ));
    }
    let cluster_id = resolve_cluster(input.cluster_id.as_deref())?;
    let node_id = resolve_node(&cluster_id, input.node_id.as_deref())?;
    let backup = queue_backup(&service, &input.service_id, cluster_id, node_id, "manual", ctx.caller().id())?;
    Ok(shown(backup))
}

/// Record a pending backup and wake the reconcile loop.
fn queue_backup(
    service: &ServiceView,
    service_id: &str,
    cluster_id: String,
    node_id: String,
    trigger: &str,
    by: &str,
) -> Result<Doc<Backup>> {
    let id = new_id("bkp");
    let backup = Backup {
        organization_id: service.organization_id.clone(),
        service_id: service_id.to_string(),
        service_name: service.name.clone(),
        cluster_id,
        node_id,
        volumes: service.volumes.iter().map(|v| v.name.clone()).collect(),
        database: service.database.clone(),
        state: State::Pending,
        reason: None,
        trigger: trigger.to_string(),
        requested_by: by.to_string(),
        created_at_ms: now_ms(),
        started_at_ms: None,
        finished_at_ms: None,
        objects: Vec::new(),
        size: 0,
        replica_state: None,
        replica: None,
    };
    let written = store::Batch::new().insert(BACKUPS, &id, &backup).commit()?;
    events::publish("backups.requested", &id, &json!({ "kind": "backup" }))?;
    Ok(Doc { id, revision: written.first().map_or(1, |d| d.revision), data: backup })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GetInput {
    organization_id: String,
    backup_id: String,
}

fn get(_ctx: &Context, input: GetInput) -> Result<Shown<Backup>> {
    Ok(shown(backup_of(&input.organization_id, &input.backup_id)?))
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ListInput {
    organization_id: String,
    /// Only this service's backups.
    #[serde(default)]
    service_id: Option<String>,
    #[serde(default)]
    cursor: Option<String>,
    /// 1–500 (100 unless given).
    #[serde(default)]
    limit: Option<u32>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct BackupList {
    backups: Vec<Shown<Backup>>,
    next_cursor: Option<String>,
}

fn list(_ctx: &Context, input: ListInput) -> Result<BackupList> {
    let limit = input.limit.unwrap_or(100).clamp(1, 500);
    let page = match &input.service_id {
        Some(service) => store::find::<Backup>(BACKUPS, "by_service", &[json!(service)], input.cursor.as_deref(), limit)?,
        None => store::find::<Backup>(BACKUPS, "by_org", &[json!(input.organization_id)], input.cursor.as_deref(), limit)?,
    };
    let mut backups: Vec<_> = page.documents.into_iter().filter(|d| d.data.organization_id == input.organization_id).map(shown).collect();
    backups.sort_by_key(|b| std::cmp::Reverse(b.record.created_at_ms));
    Ok(BackupList { backups, next_cursor: page.next_cursor })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RestoreInput {
    organization_id: String,
    backup_id: String,
    /// Restore into this service of the organization instead of the backup's own.
    #[serde(default)]
    service_id: Option<String>,
}

fn restore(ctx: &Context, input: RestoreInput) -> Result<Shown<Restore>> {
    let backup = backup_of(&input.organization_id, &input.backup_id)?;
    if backup.data.state != State::Complete {
        return Err(Refusal::new(
            "backup-not-complete",
            format!("backup {} is {}: only a complete backup is restored", backup.id, backup.data.state.as_str()),
        )
        .with_data(json!({ "state": backup.data.state })));
    }
    let service_id = input.service_id.unwrap_or_else(|| backup.data.service_id.clone());
    // the target must exist in the organization and still be in use
    service_of(&input.organization_id, &service_id)?;
    let id = new_id("rst");
    let record = Restore {
        organization_id: input.organization_id,
        backup_id: backup.id.clone(),
        service_id,
        cluster_id: backup.data.cluster_id.clone(),
        node_id: backup.data.node_id.clone(),
        volumes: backup.data.volumes.clone(),
        state: State::Pending,
        reason: None,
        requested_by: ctx.caller().id().to_string(),
        created_at_ms: now_ms(),
        started_at_ms: None,
        finished_at_ms: None,
    };
    let written = store::Batch::new().insert(RESTORES, &id, &record).commit()?;
    events::publish("backups.requested", &id, &json!({ "kind": "restore" }))?;
    Ok(Shown { id, revision: written.first().map_or(1, |d| d.revision), record })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GetRestoreInput {
    organization_id: String,
    restore_id: String,
}

fn get_restore(_ctx: &Context, input: GetRestoreInput) -> Result<Shown<Restore>> {
    match store::get::<Restore>(RESTORES, &input.restore_id)? {
        Some(doc) if doc.data.organization_id == input.organization_id => Ok(shown(doc)),
        _ => Err(Refusal::new("restore-not-found", format!("no restore {} in this organization", input.restore_id))),
    }
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Overview {
    /// `backupCron`, or none: no scheduled backups.
    backup_cron: Option<String>,
    backup_keep_last: u32,
    backup_max_bytes: u64,
    /// When the schedule falls due next (milliseconds since the epoch).
    next_due_ms: Option<u64>,
    last_run: Option<RunSummary>,
    /// Where complete backups are copied, if a target is set (never its credentials).
    target: Option<Target>,
    /// When this answer was made (milliseconds since the epoch): what ages are counted from.
    now_ms: u64,
    /// The newest backups (at most 200), by service: services by name, each newest first.
    services: Vec<ServiceBackups>,
    /// The newest restores (at most 200).
    restores: Vec<Shown<Restore>>,
}

/// One service's backups, newest first.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ServiceBackups {
    service_id: String,
    service_name: String,
    organization_id: String,
    /// The newest complete backup's size in bytes, if one is complete.
    last_complete_size: Option<u64>,
    /// When the newest complete backup was taken.
    last_complete_at_ms: Option<u64>,
    backups: Vec<Shown<Backup>>,
}

/// `backups` (newest first) by service, services by name then id, each keeping that order.
fn by_service(backups: Vec<Shown<Backup>>) -> Vec<ServiceBackups> {
    let mut services: Vec<ServiceBackups> = Vec::new();
    for backup in backups {
        let at = match services.iter().position(|s| s.service_id == backup.record.service_id) {
            Some(at) => at,
            None => {
                services.push(ServiceBackups {
                    service_id: backup.record.service_id.clone(),
                    service_name: backup.record.service_name.clone(),
                    organization_id: backup.record.organization_id.clone(),
                    last_complete_size: None,
                    last_complete_at_ms: None,
                    backups: Vec::new(),
                });
                services.len() - 1
            }
        };
        let service = &mut services[at];
        if backup.record.state == State::Complete && service.last_complete_at_ms.is_none() {
            service.last_complete_size = Some(backup.record.size);
            service.last_complete_at_ms = Some(backup.record.created_at_ms);
        }
        service.backups.push(backup);
    }
    services.sort_by(|a, b| (&a.service_name, &a.service_id).cmp(&(&b.service_name, &b.service_id)));
    services
}

fn overview(_ctx: &Context, _input: Empty) -> Result<Overview> {
    let settings = settings()?;
    let schedule = store::get::<ScheduleState>(SCHEDULE, SCHEDULE_STATE)?.map(|d| d.data).unwrap_or_default();
    let mut backups: Vec<_> = newest::<Backup>(BACKUPS, |b| b.created_at_ms)?;
    backups.truncate(200);
    let mut restores: Vec<_> = newest::<Restore>(RESTORES, |r| r.created_at_ms)?;
    restores.truncate(200);
    let next_due_ms = if schedule.cron == settings.backup_cron { schedule.next_due_ms } else { None };
    let target = settings.target();
    Ok(Overview {
        backup_cron: settings.backup_cron,
        backup_keep_last: settings.backup_keep_last,
        backup_max_bytes: settings.backup_max_bytes,
        next_due_ms,
        last_run: schedule.last_run,
        target,
        now_ms: now_ms(),
        services: by_service(backups),
        restores,
    })
}

/// Every record of `collection`, newest first by `created`.
fn newest<T: serde::de::DeserializeOwned>(collection: &str, created: impl Fn(&T) -> u64) -> Result<Vec<Shown<T>>> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store::scan::<T>(collection, cursor.as_deref(), 500)?;
        all.extend(page.documents);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    all.sort_by_key(|b| std::cmp::Reverse(created(&b.data)));
    Ok(all.into_iter().map(shown).collect())
}

fn run_all(ctx: &Context, _input: Empty) -> Result<RunSummary> {
    backup_all(ctx.caller().id())
}

fn replicate(_ctx: &Context, input: GetInput) -> Result<Shown<Backup>> {
    let mut backup = backup_of(&input.organization_id, &input.backup_id)?;
    if backup.data.state != State::Complete {
        return Err(Refusal::new(
            "backup-not-complete",
            format!("backup {} is {}: only a complete backup is replicated", backup.id, backup.data.state.as_str()),
        )
        .with_data(json!({ "state": backup.data.state })));
    }
    if settings()?.target().is_none() {
        return Err(Refusal::new(
            "backup-target-unconfigured",
            "no external target is set: set backups.backupTargetEndpoint and backups.backupTargetBucket",
        ));
    }
    backup.data.replica_state = Some(ReplicaState::Pending);
    if let Some(replica) = &mut backup.data.replica {
        replica.next_attempt_at_ms = None;
    }
    let written = store::Batch::new().replace(BACKUPS, &backup.id, backup.revision, &backup.data).commit()?;
    backup.revision = written.first().map_or(backup.revision + 1, |d| d.revision);
    events::publish("backups.requested", &backup.id, &json!({ "kind": "replicate" }))?;
    Ok(shown(backup))
}

// ---- placement ----

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServiceView {
    name: String,
    organization_id: String,
    #[serde(default)]
    volumes: Vec<VolumeView>,
    #[serde(default)]
    database: Option<Database>,
    #[serde(default)]
    state: Option<String>,
}

#[derive(Debug, Deserialize)]
struct VolumeView {
    name: String,
}

/// The service `id` of `organization`, in use; `service-not-found` otherwise (a service of
/// another organization reads the same).
fn service_of(organization: &str, id: &str) -> Result<ServiceView> {
    match inventory::get::<ServiceView>(EntityKind::Service, id)? {
        Some(e) if e.data.organization_id == organization && e.data.state.as_deref() != Some("deleting") => Ok(e.data),
        _ => Err(Refusal::new("service-not-found", format!("no service {id} in use in this organization"))),
    }
}

fn backup_of(organization: &str, id: &str) -> Result<Doc<Backup>> {
    match store::get::<Backup>(BACKUPS, id)? {
        Some(doc) if doc.data.organization_id == organization => Ok(doc),
        _ => Err(Refusal::new("backup-not-found", format!("no backup {id} in this organization"))),
    }
}

/// The cluster a backup runs through: the one named, or the only one there is.
fn resolve_cluster(named: Option<&str>) -> Result<String> {
    if let Some(id) = named {
        return match inventory::get::<Value>(EntityKind::Cluster, id)? {
            Some(e) => Ok(e.id),
            None => Err(Refusal::new("cluster-not-found", format!("no cluster {id}"))),
        };
    }
    let clusters = inventory::list::<Value>(EntityKind::Cluster, None, 2)?;
    match clusters.entities.as_slice() {
        [only] if clusters.next_cursor.is_none() => Ok(only.id.clone()),
        [] => Err(Refusal::new("cluster-required", "there is no cluster: a backup is taken by a cluster's agent")),
        _ => Err(Refusal::new("cluster-required", "Capstan manages more than one cluster: name the service's in clusterId")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeView {
    cluster_id: String,
    #[serde(default)]
    state: Option<String>,
}

/// The node whose volumes are backed up: the one named, which must be an enrolled node of the
/// cluster (`node-unresolved`), or the cluster's only node (`backup-node-required`).
fn resolve_node(cluster: &str, named: Option<&str>) -> Result<String> {
    let usable = |n: &NodeView| n.cluster_id == cluster && n.state.as_deref() != Some("retired");
    if let Some(id) = named {
        return match inventory::get::<NodeView>(EntityKind::Node, id)? {
            Some(e) if usable(&e.data) => Ok(e.id),
            _ => Err(Refusal::new("node-unresolved", format!("{id} is no enrolled node of cluster {cluster}"))
                .with_data(json!({ "nodeId": id }))),
        };
    }
    let mut nodes = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = inventory::list::<NodeView>(EntityKind::Node, cursor.as_deref(), 500)?;
        nodes.extend(page.entities.into_iter().filter(|e| usable(&e.data)).map(|e| e.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    match nodes.as_slice() {
        [only] => Ok(only.clone()),
        _ => Err(Refusal::new(
            "backup-node-required",
            format!("cluster {cluster} has {} nodes: name the one whose volumes to back up in nodeId", nodes.len()),
        )
        .with_data(json!({ "nodes": nodes.len() }))),
    }
}

// ---- the reconcile loop's work ----

enum Job {
    Backup(Box<Doc<Backup>>),
    Restore(Box<Doc<Restore>>),
}

/// The oldest pending backup, else the oldest pending restore.
fn next_job() -> Result<Option<Job>> {
    let pending = json!(State::Pending.as_str());
    let backups = store::find::<Backup>(BACKUPS, "by_state", std::slice::from_ref(&pending), None, 500)?;
    if let Some(b) = backups.documents.into_iter().min_by_key(|d| d.data.created_at_ms) {
        return Ok(Some(Job::Backup(Box::new(b))));
    }
    let restores = store::find::<Restore>(RESTORES, "by_state", &[pending], None, 500)?;
    Ok(restores.documents.into_iter().min_by_key(|d| d.data.created_at_ms).map(|d| Job::Restore(Box::new(d))))
}

fn settings() -> Result<Settings> {
    settings::get::<Settings>()
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

fn run_backup(doc: Doc<Backup>) -> Result<()> {
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

fn run_restore(doc: Doc<Restore>) -> Result<()> {
    let Some(mut doc) = start(RESTORES, doc, |r| {
        r.state = State::Running;
        r.started_at_ms = Some(now_ms());
    })?
    else {
        return Ok(());
    };
    let outcome = apply_restore(&doc);
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
    Ok(())
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
fn fail_interrupted(now: u64) -> Result<u32> {
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

/// Keep the newest `keep` complete backups of `service`; delete older ones (and failed or
/// corrupt ones older than the oldest kept), the record first — it is the commit point — then
/// its objects. The only complete backup is never pruned (`keep` is at least 1).
fn prune(service: &str, keep: u32) -> Result<u32> {
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
        State::Pending | State::Running => false,
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
fn collect_garbage() -> Result<u32> {
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

// ---- the external target ----

/// Copy the backups due for the external target while the pass has time; answers how many
/// were copied and how many failed.
fn replicate_due(ctx: &Context, now: u64) -> Result<(u32, u32)> {
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

/// Copy every object of a complete backup to the target, each read back there and checked
/// against the manifest, then the manifest itself (`manifest.json`), last.
fn copy_backup(doc: &Doc<Backup>, target: &Target, access_key_id: String, secret_access_key: String) -> std::result::Result<(), Reason> {
    let s3 = transfers::S3Target {
        endpoint: target.endpoint.clone(),
        region: target.region.clone(),
        bucket: target.bucket.clone(),
        prefix: target.prefix.clone(),
        access_key_id,
        secret_access_key,
    };
    let named = |r: Refusal| match r.code() {
        "s3-target-credentials-rejected" => Reason { code: "backup-target-credentials-rejected".into(), message: r.message().to_string() },
        _ => Reason::from(&r),
    };
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

// ---- schedule ----

/// When `backupCron` fell due since the last look, run `backup-all-services`; answers how many
/// backups it queued.
fn schedule_if_due(now: u64) -> Result<Option<u32>> {
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
/// (one cluster, one node); the others are listed with the code that says why.
fn backup_all(by: &str) -> Result<RunSummary> {
    let mut summary = RunSummary { at_ms: now_ms(), by: by.to_string(), queued: 0, skipped: Vec::new() };
    let placement = resolve_cluster(None).and_then(|cluster| resolve_node(&cluster, None).map(|node| (cluster, node)));
    let mut cursor: Option<String> = None;
    loop {
        let page = inventory::list::<ServiceView>(EntityKind::Service, cursor.as_deref(), 500)?;
        for service in page.entities {
            if service.data.volumes.is_empty() || service.data.state.as_deref() == Some("deleting") {
                continue;
            }
            match &placement {
                Ok((cluster, node)) => {
                    queue_backup(&service.data, &service.id, cluster.clone(), node.clone(), "schedule", by)?;
                    summary.queued += 1;
                }
                Err(r) => summary.skipped.push(Skipped { service_id: service.id, code: r.code().to_string() }),
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    capstan_sdk::info!("backup-all-services by {by}: {} queued, {} skipped", summary.queued, summary.skipped.len());
    Ok(summary)
}

// ---- small things ----

/// `<prefix>_<32 hex>`, like the host's ids.
fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:032x}", rand::random::<u128>())
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

    #[test]
    fn a_target_needs_an_endpoint_and_a_bucket_and_is_named_by_where_copies_go() {
        let settings = |endpoint: Option<&str>, bucket: Option<&str>, prefix: &str| Settings {
            backup_cron: None,
            backup_keep_last: 24,
            backup_max_bytes: 1,
            backup_target_endpoint: endpoint.map(str::to_string),
            backup_target_bucket: bucket.map(str::to_string),
            backup_target_prefix: prefix.to_string(),
            backup_target_region: " us-east-1 ".to_string(),
        };
        assert_eq!(settings(None, Some("b"), "p").target(), None);
        assert_eq!(settings(Some("https://s3.example.com"), None, "p").target(), None);
        assert_eq!(settings(Some("  "), Some("b"), "p").target(), None);
        let target = settings(Some("https://s3.example.com/"), Some("offsite"), "/capstan/").target().unwrap();
        assert_eq!(
            (target.endpoint.as_str(), target.prefix.as_str(), target.region.as_str()),
            ("https://s3.example.com", "capstan", "us-east-1")
        );
        assert_eq!(target.name(), "https://s3.example.com/offsite/capstan");
        assert_eq!(settings(Some("http://h:9000"), Some("b"), "").target().unwrap().name(), "http://h:9000/b");
    }

    #[test]
    fn a_failed_replication_waits_longer_each_time_up_to_six_hours() {
        let minutes = |attempts| retry_delay_ms(attempts) / 60_000;
        assert_eq!([minutes(0), minutes(1), minutes(2), minutes(3), minutes(7)], [5, 5, 10, 20, 320]);
        assert_eq!(minutes(8), 360);
        assert_eq!(minutes(u32::MAX), 360);
    }

    #[test]
    fn backups_are_grouped_by_service_name_keeping_newest_first() {
        let backup = |id: &str, service: &str, name: &str, state: State, at: u64, size: u64| Shown {
            id: id.to_string(),
            revision: 1,
            record: Backup {
                organization_id: "org".into(),
                service_id: service.into(),
                service_name: name.into(),
                cluster_id: "c".into(),
                node_id: "n".into(),
                volumes: vec!["data".into()],
                database: None,
                state,
                reason: None,
                trigger: "manual".into(),
                requested_by: "u".into(),
                created_at_ms: at,
                started_at_ms: None,
                finished_at_ms: None,
                objects: Vec::new(),
                size,
                replica_state: None,
                replica: None,
            },
        };
        // newest first, as `newest` answers them
        let grouped = by_service(vec![
            backup("b4", "svc_web", "web", State::Failed, 40, 0),
            backup("b3", "svc_db", "db", State::Complete, 30, 300),
            backup("b2", "svc_web", "web", State::Complete, 20, 200),
            backup("b1", "svc_db", "db", State::Complete, 10, 100),
        ]);
        let shape: Vec<String> = grouped
            .iter()
            .map(|s| {
                let ids: Vec<&str> = s.backups.iter().map(|b| b.id.as_str()).collect();
                format!("{} {ids:?} {:?} {:?}", s.service_name, s.last_complete_at_ms, s.last_complete_size)
            })
            .collect();
        assert_eq!(shape, [r#"db ["b3", "b1"] Some(30) Some(300)"#, r#"web ["b4", "b2"] Some(20) Some(200)"#]);
        assert!(by_service(Vec::new()).is_empty());
    }

    #[test]
    fn ids_are_prefixed_and_distinct() {
        let (a, b) = (new_id("bkp"), new_id("bkp"));
        assert!(a.starts_with("bkp_") && a.len() == 36, "{a}");
        assert_ne!(a, b);
    }
}
