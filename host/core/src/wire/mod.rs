//! The bodies of the agent's wire (`/agent/v1/…`, docs/nodes.md) that both ends share: the node
//! agent builds them, the host reads and judges them — one type each, so the two cannot drift.
//!
//! - [`heartbeat`]: the heartbeat's `report` of a node's host.

pub mod heartbeat;
