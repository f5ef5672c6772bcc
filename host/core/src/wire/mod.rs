//! The bodies of the agent's wire (`/agent/v1/…`, docs/nodes.md) that both ends share: the node
//! agent builds them, the host reads and judges them — one type each, so the two cannot drift.
//!
//! - [`heartbeat`]: the heartbeat's `report` of a node's host.
//! - [`NODE_HEADER`]: the header naming the node on its runtime session's upgrade.

pub mod heartbeat;

/// The header a node's agent names its node id in when it opens its runtime session straight to
/// Capstan's socket, beside its node token as the bearer: the session then takes a machine's
/// slot, which strangers' sessions cannot fill (docs/socket.md).
pub const NODE_HEADER: &str = "x-capstan-node-id";
