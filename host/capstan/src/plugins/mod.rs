//! Plugins: managers as sandboxed WebAssembly components behind the `capstan:plugin` WIT
//! world (`wit/manager.wit`), loaded from signed bundles and swapped live.

pub mod bundle;
pub mod first_party;
pub mod host;
pub mod imports;
pub mod manifest;
pub mod methods;
pub mod runtime;
pub mod tasks;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod work;

#[cfg(test)]
mod tests;
