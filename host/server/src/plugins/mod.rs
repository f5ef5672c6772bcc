//! Plugins: the plugin host (`capstan-plugin-host`), the first-party bundles this binary
//! embeds, how plugins' gateway requests reach the gateway ([`gateway`]) and their agent
//! calls the cluster relays ([`agents`]), and their storage bindings the providers ([`storage`]).

pub use capstan_plugin_host::*;

pub mod agents;
pub mod first_party;
pub mod gateway;
pub mod storage;
