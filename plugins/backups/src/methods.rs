//! The methods (`backups.*`): each records what is wanted, or reads what is recorded; the
//! reconcile loop does the work.

use crate::placement::{ServiceView, placement, restore_placement, service_of, services_with_volumes};
use crate::records::{
    BACKUPS, Backup, RESTORES, ReplicaState, Restore, RunSummary, SCHEDULE, SCHEDULE_STATE, ScheduleState, Shown, State, new_id, nodes_of,
    placed, shown,
};
use crate::schedule::backup_all;
use crate::settings::{Target, settings};
use capstan_sdk::now_ms;
use capstan_sdk::store::{self, Doc};
use capstan_sdk::{Context, Empty, JsonSchema, Refusal, Result, events, json};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct CreateInput {
    organization_id: String,
    service_id: String,
    /// The cluster: by default the one the service's replicas run on, else the only one
    /// (`cluster-required` when there are several).
    #[serde(default)]
    cluster_id: Option<String>,
    /// The node whose volumes are backed up: by default every node the service's replicas
    /// stand on (one part per node), else the cluster's only node (`backup-node-required`).
    #[serde(default)]
    node_id: Option<String>,
}

pub(crate) fn create(ctx: &Context, input: CreateInput) -> Result<Shown<Backup>> {
    let service = service_of(&input.organization_id, &input.service_id)?;
    if service.volumes.is_empty() {
        return Err(Refusal::new(
            "service-has-no-volumes",
            format!("service {} declares no volumes: there is nothing to back up", service.name),
        ));
    }
    let (cluster_id, nodes) = placement(&input.service_id, input.cluster_id.as_deref(), input.node_id.as_deref())?;
    let backup = queue_backup(&service, &input.service_id, cluster_id, nodes, "manual", ctx.caller().id())?;
    Ok(shown(backup))
}

/// Record a pending backup and wake the reconcile loop.
pub(crate) fn queue_backup(
    service: &ServiceView,
    service_id: &str,
    cluster_id: String,
    nodes: Vec<String>,
    trigger: &str,
    by: &str,
) -> Result<Doc<Backup>> {
    let id = new_id("bkp");
    let (node_id, nodes) = placed(nodes);
    let backup = Backup {
        organization_id: service.organization_id.clone(),
        service_id: service_id.to_string(),
        service_name: service.name.clone(),
        cluster_id,
        node_id,
        nodes,
        volumes: service.volumes.iter().map(|v| v.name.clone()).collect(),
        database: service.database.clone(),
        state: State::Pending,
        reason: None,
        trigger: trigger.to_string(),
        requested_by: by.to_string(),
        created_at_ms: now_ms(),
        started_at_ms: None,
        pass_started_at_ms: None,
        archiving: None,
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
pub(crate) struct GetInput {
    organization_id: String,
    backup_id: String,
}

pub(crate) fn get(_ctx: &Context, input: GetInput) -> Result<Shown<Backup>> {
    Ok(shown(backup_of(&input.organization_id, &input.backup_id)?))
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ListInput {
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
pub(crate) struct BackupList {
    backups: Vec<Shown<Backup>>,
    next_cursor: Option<String>,
}

pub(crate) fn list(_ctx: &Context, input: ListInput) -> Result<BackupList> {
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
pub(crate) struct RestoreInput {
    organization_id: String,
    backup_id: String,
    /// Restore into this service of the organization instead of the backup's own.
    #[serde(default)]
    service_id: Option<String>,
}

pub(crate) fn restore(ctx: &Context, input: RestoreInput) -> Result<Shown<Restore>> {
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
    let backup_nodes: Vec<String> = nodes_of(&backup.data.node_id, &backup.data.nodes).into_iter().map(String::from).collect();
    let (cluster_id, nodes) = restore_placement(&service_id, (&backup.data.cluster_id, &backup_nodes))?;
    let (node_id, nodes) = placed(nodes);
    let id = new_id("rst");
    let record = Restore {
        organization_id: input.organization_id,
        backup_id: backup.id.clone(),
        service_id,
        cluster_id,
        node_id,
        nodes,
        volumes: backup.data.volumes.clone(),
        state: State::Pending,
        reason: None,
        held: None,
        verified: false,
        restored: Vec::new(),
        applying: None,
        part_started_at_ms: None,
        pass_started_at_ms: None,
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
pub(crate) struct GetRestoreInput {
    organization_id: String,
    restore_id: String,
}

pub(crate) fn get_restore(_ctx: &Context, input: GetRestoreInput) -> Result<Shown<Restore>> {
    match store::get::<Restore>(RESTORES, &input.restore_id)? {
        Some(doc) if doc.data.organization_id == input.organization_id => Ok(shown(doc)),
        _ => Err(Refusal::new("restore-not-found", format!("no restore {} in this organization", input.restore_id))),
    }
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Overview {
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
    /// What can be backed up: the services with volumes, by organization (for a picker).
    candidates: Vec<Candidates>,
}

/// One organization's services with volumes.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Candidates {
    organization_id: String,
    organization_name: String,
    /// `{id, name}`, by name.
    services: Vec<Candidate>,
}

#[derive(Debug, Serialize, JsonSchema)]
struct Candidate {
    id: String,
    name: String,
}

/// The services with volumes by organization, organizations and services by name.
fn candidates() -> Result<Vec<Candidates>> {
    let mut by_org: std::collections::BTreeMap<String, Vec<Candidate>> = std::collections::BTreeMap::new();
    for service in services_with_volumes()? {
        by_org.entry(service.data.organization_id).or_default().push(Candidate { id: service.id, name: service.data.name });
    }
    let mut out = Vec::new();
    for (organization_id, mut services) in by_org {
        let name = capstan_sdk::inventory::get::<serde_json::Value>(capstan_sdk::inventory::EntityKind::Organization, &organization_id)?
            .and_then(|o| o.data["name"].as_str().map(String::from))
            .unwrap_or_else(|| organization_id.clone());
        services.sort_by(|a, b| a.name.cmp(&b.name));
        out.push(Candidates { organization_id, organization_name: name, services });
    }
    out.sort_by(|a, b| a.organization_name.cmp(&b.organization_name));
    Ok(out)
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

fn backup_of(organization: &str, id: &str) -> Result<Doc<Backup>> {
    match store::get::<Backup>(BACKUPS, id)? {
        Some(doc) if doc.data.organization_id == organization => Ok(doc),
        _ => Err(Refusal::new("backup-not-found", format!("no backup {id} in this organization"))),
    }
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

pub(crate) fn overview(_ctx: &Context, _input: Empty) -> Result<Overview> {
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
        candidates: candidates()?,
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

pub(crate) fn run_all(ctx: &Context, _input: Empty) -> Result<RunSummary> {
    backup_all(ctx.caller().id())
}

pub(crate) fn replicate(_ctx: &Context, input: GetInput) -> Result<Shown<Backup>> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
                nodes: Vec::new(),
                volumes: vec!["data".into()],
                database: None,
                state,
                reason: None,
                trigger: "manual".into(),
                requested_by: "u".into(),
                created_at_ms: at,
                started_at_ms: None,
                pass_started_at_ms: None,
                archiving: None,
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
}
