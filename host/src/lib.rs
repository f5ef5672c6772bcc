//! Capstan: the trusted host of a self-hosted infrastructure control plane.
//!
//! One folder per subsystem; see `ARCHITECTURE.md` at the repository root.

pub mod api;
pub mod auth;
pub mod blobs;
pub mod cli;
pub mod config;
pub mod dashboard;
pub mod events;
pub mod fleet;
pub mod inventory;
pub mod keyring;
pub mod migrate;
pub mod plugins;
pub mod refusal;
pub mod scheduler;
pub mod secrets;
pub mod store;
