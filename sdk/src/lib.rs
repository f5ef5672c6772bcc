//! `capstan-sdk`: what plugin authors build Capstan managers with.
//!
//! The plugin runtime issue fills this crate: typed methods with serde bodies, typed refusals,
//! a store helper with compare-and-swap, and a test harness that runs a plugin against an
//! in-memory host. Until then it is an empty crate so the workspace layout is in place.
