//! Tests that drive the areas' methods through the assembled host (the registry `AppState`
//! builds, with every area's context), as the API dispatcher and the dashboard call them.

mod audit;
mod facets;
mod hardening;
mod inventory;
mod listener;
mod nodes;
mod plugin_nodes;
mod plugin_runtime;
mod plugins;
mod relay_sessions;
mod relays;
mod rewrap;
mod runtime_sessions;
mod secrets;
mod socket;
mod socket_pages;
mod transfers;
