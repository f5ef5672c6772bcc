//! The plugins as the scheduler sees them ([`PluginTasks`]): the schedules loaded plugins
//! declare, each run in its plugin's sandbox, and which plugins are installed.

use super::host::PluginHost;
use super::runtime::PASS_DEADLINE;
use crate::refusal::Result;
use crate::scheduler::{PluginSchedule, PluginTasks};
use std::collections::BTreeSet;
use std::sync::Arc;

#[async_trait::async_trait]
impl PluginTasks for PluginHost {
    fn schedules(&self) -> Vec<PluginSchedule> {
        let mut all = Vec::new();
        for active in self.loaded() {
            for schedule in &active.described.schedules {
                let (runs_in, name) = (active.clone(), schedule.name.clone());
                all.push(PluginSchedule {
                    plugin: active.manifest.id.clone(),
                    name: schedule.name.clone(),
                    summary: schedule.summary.clone(),
                    cron: schedule.cron.clone(),
                    workload: active.described.placement.id.clone(),
                    deadline: PASS_DEADLINE,
                    run: Arc::new(move || {
                        let (active, name) = (runs_in.clone(), name.clone());
                        Box::pin(async move { active.sandbox.run_task(&name).await })
                    }),
                });
            }
        }
        all
    }

    async fn installed(&self) -> Result<BTreeSet<String>> {
        Ok(self.records().await?.into_iter().map(|(record, _)| record.id).collect())
    }
}
