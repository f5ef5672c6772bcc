//! The Capstan server: the HTTP API (`api`), the host state every method is registered
//! with, configuration (`config`), the first-party plugins this build embeds (`plugins`), and
//! the assembly `capstan serve` runs (`serve`). The dashboard plugs its pages in as
//! [`api::Pages`]; this crate knows nothing of it.

pub use capstan_auth as auth;
pub use capstan_blobs as blobs;
pub use capstan_core::refusal;
pub use capstan_events as events;
pub use capstan_fleet as fleet;
pub use capstan_inventory as inventory;
pub use capstan_keyring as keyring;
pub use capstan_nodes as nodes;
pub use capstan_relays as relays;
pub use capstan_scheduler as scheduler;
pub use capstan_secrets as secrets;
pub use capstan_store as store;

pub mod api;
pub mod config;
pub mod demo;
#[cfg(test)]
mod host_tests;
pub mod listener;
pub mod metrics;
pub mod migrate;
pub mod plugins;
pub mod serve;
pub mod snapshot;
