//! Capstan's foundation: what every other crate of the host stands on and nothing else.
//!
//! - [`refusal`]: the one error shape every subsystem returns and every client sees;
//! - [`bindings`]: a storage binding as the plugin host and the providers both name it;
//! - [`build`]: the plugin contract and engine this build serves;
//! - [`clock`]: the one wall clock;
//! - [`crash`]: crash points, where a debug build kills itself on request (the kill -9 tests);
//! - [`gateway_scopes`]: the external gateway's client scopes and the requests each covers;
//! - [`ids`]: random identifiers;
//! - [`net`]: lists of IP networks from the configuration;
//! - [`private_file`]: the no-clobber writer and strict reader for key material;
//! - [`text`]: values that must not be printed, and bounded echoes of client input;
//! - `testing` (the `testing` feature, for dev-dependencies only): byte-string mutations for
//!   property tests.
//! - [`wire`]: the agent wire's bodies the node agent and the host share (the heartbeat's report).

pub mod bindings;
pub mod build;
pub mod causes;
pub mod clock;
pub mod crash;
pub mod gateway_scopes;
pub mod ids;
pub mod net;
pub mod private_file;
pub mod refusal;
#[cfg(feature = "sealed")]
pub mod sealed;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;
pub mod wire;

pub use crash::crash_point;
pub use refusal::{Refusal, Result};
