//! Domain events (capability `events:publish`), committed to the durable outbox and delivered
//! at least once to every subscribed plugin.

use crate::bindings::capstan::plugin::events as wit;
use crate::{Result, encode};
use serde::Serialize;

/// Publish `kind` (`<pluginId>.<name>`; the host refuses other prefixes) about `subject` (the
/// entity it concerns; ordering holds per subject) with `data`.
pub fn publish(kind: &str, subject: &str, data: &impl Serialize) -> Result<()> {
    Ok(wit::publish(kind, subject, &encode(data)?)?)
}
