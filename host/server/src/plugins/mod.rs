//! Plugins: the plugin host (`capstan-plugin-host`), the first-party bundles this binary
//! embeds, and how plugins' gateway requests reach the gateway ([`gateway`]).

pub use capstan_plugin_host::*;

pub mod first_party;
pub mod gateway;
