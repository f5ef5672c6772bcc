//! `events`: publish to the host's outbox, under the plugin's own kinds (`<id>.<name>`).

use super::{CallData, Services, WitResult, parse_object, refusal, to_wit};
use crate::manifest::Capability;
use crate::runtime::capstan::plugin::events;
use crate::store::Store;
use capstan_core::text::truncate;
use serde_json::json;
use std::sync::Arc;

/// The `events:publish` provider.
#[derive(Clone)]
pub(super) struct Publisher {
    store: Store,
    plugin: String,
}

impl Publisher {
    pub(super) fn new(services: &Arc<Services>, plugin: &str) -> Self {
        Publisher { store: services.store.clone(), plugin: plugin.to_string() }
    }
}

impl events::Host for CallData {
    async fn publish(&mut self, kind: String, subject: String, data: String) -> WitResult<()> {
        self.changing()?;
        let publisher = self.granted(&self.grant.events, Capability::EventsPublish)?;
        let own = format!("{}.", publisher.plugin);
        if !kind.starts_with(&own) || kind.len() > 128 || !kind[own.len()..].chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(refusal(
                "invalid-request",
                format!("event kinds of this plugin are {own}<name> (letters and digits)"),
                json!({ "kind": truncate(&kind, 128) }),
            ));
        }
        if subject.is_empty() || subject.len() > 256 {
            return Err(refusal("invalid-request", "an event subject is 1 to 256 bytes".into(), json!({})));
        }
        let data = parse_object(&data, "event data")?;
        let source = format!("plugin:{}", publisher.plugin);
        let appended = publisher.store.transact(|tx| {
            let (kind, subject, data, source) = (kind.clone(), subject.clone(), data.clone(), source.clone());
            async move { crate::events::append(&tx, &kind, &subject, data, &source).await }
        });
        appended.await.map(drop).map_err(to_wit)
    }
}
