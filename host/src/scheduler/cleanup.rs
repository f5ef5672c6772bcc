//! `host.cleanup`: keeps the scheduler's history and the event outbox bounded.

use super::{HostTask, TaskLog, model};
use crate::plugins::host::PluginHost;
use crate::refusal::Result;
use crate::store::Store;
use std::collections::BTreeSet;
use std::sync::Arc;

pub const CLEANUP_ID: &str = "host.cleanup";

pub fn task(store: Store, plugins: Option<Arc<PluginHost>>) -> HostTask {
    HostTask::new(CLEANUP_ID, "Clean up history", "0 * * * *", move |log| {
        let (store, plugins) = (store.clone(), plugins.clone());
        async move { run(&store, plugins.as_deref(), &log, crate::fleet::now_ms()).await }
    })
    .description(
        "Removes task executions older than 30 days or beyond the newest 100 of their task, and events every consumer \
         handled more than an hour ago (any event after 30 days).",
    )
}

/// One cleanup pass at `now`.
pub async fn run(store: &Store, plugins: Option<&PluginHost>, log: &TaskLog, now: u64) -> Result<()> {
    let executions = model::trim_executions(store, now).await?;
    log.line(format!("removed {executions} old task executions"));
    // the cursor of a plugin that is no longer installed holds nothing back
    let installed: Option<BTreeSet<String>> = match plugins {
        Some(p) => Some(p.records().await?.into_iter().map(|(record, _)| record.id).collect()),
        None => None,
    };
    let counts = |consumer: &str| match (consumer.strip_prefix("plugin:"), &installed) {
        (Some(id), Some(installed)) => installed.contains(id),
        _ => true,
    };
    let trimmed = crate::events::trim(store, now, counts).await?;
    log.line(format!("removed {} delivered events", trimmed.delivered));
    if trimmed.expired > 0 {
        log.line(format!(
            "removed {} events older than 30 days that these consumers had not handled: {}",
            trimmed.expired,
            trimmed.lagging.join(", ")
        ));
    }
    Ok(())
}
