//! What this build serves, for the places that report it (the node record, `fleet nodes`) and
//! the ones that check against it (plugin manifests, the engine cache).

/// The plugin contract `capstan plugin new` and the SDK target (`wit/0.3.6`).
pub const PLUGIN_CONTRACT: &str = "capstan:plugin@0.3.6";

/// The wasmtime version plugins run on. Cargo does not expose dependency versions; the plugin
/// host's tests check this against Cargo.lock.
pub const PLUGIN_ENGINE: &str = "48.0.8";
