//! The host log, under the plugin's id and the call's request id (capability `log`).
//!
//! ```no_run
//! use capstan_sdk::log;
//!
//! capstan_sdk::info!("tidied {} notes", 3);
//! log::warn("quota nearly used");
//! log::log(log::Level::Info, "note stored", &[("note", "n1"), ("revision", "4")]);
//! ```
//!
//! Never log a secret value, token, password or key. Without the capability, lines are dropped.

use crate::bindings::capstan::plugin::log as wit;

pub use wit::Level;

/// Log `message` at `level` with `fields` added to the line.
pub fn log(level: Level, message: &str, fields: &[(&str, &str)]) {
    let fields: Vec<(String, String)> = fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    wit::log(level, message, &fields);
}

/// Log `message` at trace level.
pub fn trace(message: &str) {
    log(Level::Trace, message, &[]);
}

/// Log `message` at debug level.
pub fn debug(message: &str) {
    log(Level::Debug, message, &[]);
}

/// Log `message` at info level.
pub fn info(message: &str) {
    log(Level::Info, message, &[]);
}

/// Log `message` at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message, &[]);
}

/// Log `message` at error level.
pub fn error(message: &str) {
    log(Level::Error, message, &[]);
}

/// Log a `format!` message at trace level.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => { $crate::log::trace(&::std::format!($($arg)+)) };
}

/// Log a `format!` message at debug level.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log::debug(&::std::format!($($arg)+)) };
}

/// Log a `format!` message at info level.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log::info(&::std::format!($($arg)+)) };
}

/// Log a `format!` message at warn level.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log::warn(&::std::format!($($arg)+)) };
}

/// Log a `format!` message at error level.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log::error(&::std::format!($($arg)+)) };
}
