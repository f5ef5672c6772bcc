//! Named methods on the runtime agents connected to the host (capability `agents`).

use crate::bindings::capstan::plugin::agents as wit;
use crate::{Result, encode, parse};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Call `method` (`agent.ping`) on the elected relay of `cluster_id` with `body`, within the
/// call's deadline (at most 30 s); refused by name (`relay-not-connected`, `relay-timeout`,
/// `agent-method-invalid`, `agent-request-too-large`, …; see the plugin docs' "Agents").
pub fn call<T: DeserializeOwned>(cluster_id: &str, method: &str, body: &impl Serialize) -> Result<T> {
    let answer = wit::call(cluster_id, method, &encode(body)?)?;
    parse(&answer, &format!("the answer of agent method {method}"))
}
