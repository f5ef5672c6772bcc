//! Named methods on the runtime agents connected to the host (capability `agents`).

use crate::bindings::capstan::plugin::agents as wit;
use crate::{Result, encode, parse};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Call `method` on the agent of `cluster_id` with `body`; refused `agent-not-connected` when
/// none is.
pub fn call<T: DeserializeOwned>(cluster_id: &str, method: &str, body: &impl Serialize) -> Result<T> {
    let answer = wit::call(cluster_id, method, &encode(body)?)?;
    parse(&answer, &format!("the answer of agent method {method}"))
}
