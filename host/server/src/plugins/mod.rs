//! Plugins: the plugin host (`capstan-plugin-host`) and the first-party bundles this binary
//! embeds.

pub use capstan_plugin_host::*;

pub mod first_party;
