//! Capstan: the trusted host of a self-hosted infrastructure control plane.
//!
//! One folder per subsystem; see `ARCHITECTURE.md` at the repository root.

// The subsystems still inside this crate gain their item docs as they move into crates of
// their own; the crates already cut out deny nothing less than the workspace lints.
#![allow(missing_docs)]

pub use capstan_auth as auth;
pub use capstan_blobs as blobs;
pub use capstan_core::refusal;
pub use capstan_events as events;
pub use capstan_fleet as fleet;
pub use capstan_inventory as inventory;
pub use capstan_keyring as keyring;
pub use capstan_scheduler as scheduler;
pub use capstan_secrets as secrets;
pub use capstan_store::{self as store, migrate};

pub mod api;
pub mod cli;
pub mod config;
pub mod dashboard;
#[cfg(test)]
mod host_tests;
pub mod plugins;
