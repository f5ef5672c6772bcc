//! `host.cleanup`: keeps the scheduler's history and the event outbox bounded.

use super::{HostTask, PluginTasks, TaskLog, model};
use capstan_core::refusal::Result;
use capstan_store::Store;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The id of the built-in cleanup task.
pub const CLEANUP_ID: &str = "host.cleanup";

/// The `host.cleanup` task: on the hour, one cleanup [`run`].
pub fn task(store: Store, plugins: Option<Arc<dyn PluginTasks>>) -> HostTask {
    HostTask::new(CLEANUP_ID, "Clean up history", "0 * * * *", move |log| {
        let (store, plugins) = (store.clone(), plugins.clone());
        async move { run(&store, plugins.as_deref(), &log, capstan_core::clock::now_ms()).await }
    })
    .description(
        "Removes task executions older than 30 days or beyond the newest 100 of their task, and events every consumer \
         handled more than an hour ago (any event after 30 days).",
    )
}

/// Whether a consumer's cursor holds events back: a plugin's only while it is installed
/// (`installed` is `None` when this host runs without plugins: then every cursor counts).
fn holds_events(consumer: &str, installed: Option<&BTreeSet<String>>) -> bool {
    match (consumer.strip_prefix("plugin:"), installed) {
        (Some(id), Some(installed)) => installed.contains(id),
        _ => true,
    }
}

/// One cleanup pass at `now`.
pub async fn run(store: &Store, plugins: Option<&dyn PluginTasks>, log: &TaskLog, now: u64) -> Result<()> {
    let executions = model::trim_executions(store, now).await?;
    log.line(format!("removed {executions} old task executions"));
    // the cursor of a plugin that is no longer installed holds nothing back
    let installed: Option<BTreeSet<String>> = match plugins {
        Some(p) => Some(p.installed().await?),
        None => None,
    };
    let trimmed = capstan_events::trim(store, now, |consumer| holds_events(consumer, installed.as_ref())).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_installed_plugins_hold_events_back() {
        let installed: BTreeSet<String> = ["mail".to_string()].into();
        assert!(holds_events("plugin:mail", Some(&installed)));
        assert!(!holds_events("plugin:gone", Some(&installed)));
        assert!(holds_events("dashboard", Some(&installed)), "other consumers always count");
        assert!(holds_events("plugin:gone", None));
    }
}
