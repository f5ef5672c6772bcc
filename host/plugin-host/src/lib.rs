//! The plugin host: managers as sandboxed WebAssembly components behind the `capstan:plugin`
//! WIT world (`wit/<version>/manager.wit`; earlier versions through adapters such as
//! `contract_0_1`), loaded from signed bundles and swapped live.
//!
//! - [`bundle`], [`manifest`]: what a plugin is and what it asks for.
//! - [`runtime`]: the wasmtime engine and one instance per call.
//! - [`imports`]: the WIT imports, one provider per interface, built from the approved grant.
//! - [`host`]: the registry of installed plugins, lifecycle, dispatch.
//! - [`work`], [`tasks`]: events, reconciles and scheduled tasks.
//! - [`transfers`], [`uploads`]: bytes that reach the blob store over HTTP, not through a plugin.
//! - [`platform`]: what plugins reach of the inventory, through a trait the server implements.
//! - [`AgentDispatch`]: how the `agents` import reaches a cluster's relay, which the server
//!   installs ([`host::PluginHost::set_agent_dispatch`]).
//! - [`GatewayDispatch`]: how the `gateway` import reaches the external gateway with Capstan's
//!   enrolled credential, which the server installs ([`host::PluginHost::set_gateway_dispatch`]).

// The subsystems this crate reaches, under short names.
use capstan_blobs as blobs;
use capstan_core::refusal;
use capstan_events as events;
use capstan_fleet as fleet;
use capstan_keyring as keyring;
use capstan_scheduler as scheduler;
use capstan_store as store;

pub mod bundle;
pub mod commands;
mod contract_0_1;
mod contract_0_2;
pub mod faces;
pub mod first_party;
pub mod host;
pub mod imports;
pub mod manifest;
pub mod methods;
pub mod platform;
pub mod runtime;
pub mod tasks;
pub mod transfers;
pub mod uploads;
pub mod work;

pub use imports::{
    AgentDispatch, AgentReply, AgentRequest, BindingKind, GatewayDispatch, GatewayReply, GatewayRequest, GatewayResponse, NoStorage,
    NotConnected, NotEnrolled, Provisioned, StorageBinding, StorageDispatch,
};
