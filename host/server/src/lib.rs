//! The Capstan server: the HTTP API and its router (`api`: the handlers, the socket's protocol,
//! `/mcp`), how request bodies are held (`bodies`), the host state and its assembly (`state`:
//! every part of the host, every area's methods registered), the open socket sessions (`sessions`), the host's own methods
//! (`system`, `snapshot`), `/metrics` (`metrics`), the listener, configuration (`config`), the
//! first-party plugins this build embeds (`plugins`), and what `capstan serve` runs (`serve`).
//! Handlers take the parts of the state they need, never the whole of it. The dashboard plugs
//! its pages in as [`api::Pages`]; this crate knows nothing of it.
//!
//! The modules import one another one way: `serve` over `api` over `state` over the rest; a
//! test (`tests/crate-graph`) fails on any circle among them.

pub use capstan_auth as auth;
pub use capstan_blobs as blobs;
pub use capstan_core::refusal;
pub use capstan_events as events;
pub use capstan_federation as federation;
pub use capstan_fleet as fleet;
pub use capstan_inventory as inventory;
pub use capstan_keyring as keyring;
pub use capstan_nodes as nodes;
pub use capstan_relays as relays;
pub use capstan_runtime as runtime;
pub use capstan_scheduler as scheduler;
pub use capstan_secrets as secrets;
pub use capstan_store as store;

pub mod api;
pub mod bearer;
pub mod bodies;
pub mod config;
pub mod demo;
#[cfg(test)]
mod host_tests;
pub mod hosted_apps;
pub mod listener;
pub mod metrics;
pub mod migrate;
pub mod page_headers;
pub mod plugins;
pub mod serve;
pub mod sessions;
pub mod snapshot;
pub mod state;
pub mod system;
