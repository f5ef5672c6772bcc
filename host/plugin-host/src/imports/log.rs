//! `log`: the plugin's log records, under its id and the request id, bounded.

use super::CallData;
use crate::manifest::Capability;
use crate::runtime::capstan::plugin::log;
use capstan_core::text::{escape_control, truncate};

/// The `log` provider.
#[derive(Clone)]
pub(super) struct Logger;

impl log::Host for CallData {
    async fn log(&mut self, level: log::Level, message: String, fields: Vec<(String, String)>) {
        if self.granted(&self.grant.log, Capability::Log).is_err() {
            return;
        }
        // escaped: a message is one log line, and cannot forge another
        let message = escape_control(&truncate(&message, 4000)).into_owned();
        let fields: String = fields
            .iter()
            .take(16)
            .map(|(k, v)| format!(" {}={:?}", escape_control(&truncate(k, 64)), truncate(v, 512)))
            .collect::<Vec<_>>()
            .join("");
        let (plugin, request_id) = (self.plugin(), &self.request_id);
        match level {
            log::Level::Trace => tracing::trace!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
            log::Level::Debug => tracing::debug!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
            log::Level::Info => tracing::info!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
            log::Level::Warn => tracing::warn!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
            log::Level::Error => tracing::error!(plugin = %plugin, request_id = %request_id, "{message}{fields}"),
        }
    }
}
