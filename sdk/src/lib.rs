//! `capstan-sdk`: build Capstan managers in plain Rust.
//!
//! A manager is a WebAssembly component (`wasm32-wasip2`) that implements the `capstan:plugin`
//! WIT world. This crate generates the bindings and wraps them so a plugin is a [`Manager`]
//! with typed methods (serde bodies, JSON Schemas generated from the types), typed
//! [`Refusal`]s, and idiomatic wrappers of every host import: [`store`] (with
//! compare-and-swap and [`store::update_with_retry`]), [`inventory`], [`secrets`], [`blobs`]
//! (`std::io` streams), [`transfers`], [`http`], [`agents`], [`gateway`], [`runtime`],
//! [`events`], [`sign`] and [`log`].
//!
//! The host runs a fresh instance for every call, so nothing a plugin keeps in memory survives
//! it; the manager's functions take no `self`. Every import is gated by a capability the
//! operator approved at install (`capstan-plugin.toml` requests them); a call outside the grant
//! returns the refusal `capability-denied`.
//!
//! # A complete minimal manager
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "hello"
//! version = "0.1.0"
//! edition = "2024"
//!
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! capstan-sdk = "0.1"
//! schemars = "1"
//! serde = { version = "1", features = ["derive"] }
//! ```
//!
//! `src/lib.rs` (build with `cargo build --release --target wasm32-wasip2`):
//!
//! ```
//! use capstan_sdk::{Context, Descriptor, JsonSchema, Manager, Refusal, Result, Role, store};
//! use serde::{Deserialize, Serialize};
//!
//! struct Hello;
//!
//! #[derive(Deserialize, JsonSchema)]
//! #[serde(deny_unknown_fields)]
//! struct Greet {
//!     name: String,
//! }
//!
//! #[derive(Serialize, JsonSchema)]
//! struct Greeting {
//!     greeting: String,
//!     times: u64,
//! }
//!
//! #[derive(Serialize, Deserialize, Default)]
//! struct Counter {
//!     count: u64,
//! }
//!
//! impl Manager for Hello {
//!     fn describe() -> Descriptor {
//!         Descriptor::new().method("greet", "Greet someone.", Role::Authenticated, greet).collection("counters")
//!     }
//! }
//!
//! fn greet(_ctx: &Context, input: Greet) -> Result<Greeting> {
//!     if input.name.is_empty() {
//!         return Err(Refusal::invalid_request("Say who to greet.").with_data(capstan_sdk::json!({ "field": "name" })));
//!     }
//!     // Read-modify-write with compare-and-swap, retried when another call wins the race.
//!     let counter = store::update_with_retry("counters", &input.name, |current: Option<Counter>| {
//!         let mut counter = current.unwrap_or_default();
//!         counter.count += 1;
//!         Ok(Some(counter))
//!     }, 5)?;
//!     let times = counter.map_or(0, |doc| doc.data.count);
//!     capstan_sdk::info!("greeted {} ({times} times)", input.name);
//!     Ok(Greeting { greeting: format!("Hello, {}!", input.name), times })
//! }
//!
//! capstan_sdk::manager!(Hello);
//! # fn main() {}
//! ```
//!
//! with `capstan-plugin.toml` beside `Cargo.toml`:
//!
//! ```toml
//! [plugin]
//! id = "hello"
//! name = "Hello"
//! version = "0.1.0"
//! wit = "capstan:plugin@0.3.6"
//!
//! [capabilities]
//! requested = ["store", "log"]
//! ```
//!
//! The host serves `greet` at `POST /api/v1/hello.greet` to any signed-in caller, validating
//! the body against the schema generated from `Greet` first.
//!
//! On targets other than `wasm32` the crate compiles (so a plugin's pure logic can be unit
//! tested natively), but calling an import there panics.

mod context;
mod descriptor;
mod manager;
mod refusal;

pub mod agents;
pub mod blobs;
pub mod events;
pub mod gateway;
pub mod http;
pub mod inventory;
pub mod log;
pub mod runtime;
pub mod secrets;
pub mod settings;
pub mod sign;
pub mod storage;
pub mod store;
#[cfg(all(feature = "testing", not(target_family = "wasm")))]
mod test_host;
#[cfg(all(feature = "testing", not(target_family = "wasm")))]
pub mod testing;
pub mod transfers;

/// The bindings `wit-bindgen` generates for the `manager` world: the raw imports under
/// `bindings::capstan::plugin`, the export trait under `bindings::exports`, and `export!`.
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/0.3.6",
        world: "manager",
        pub_export_macro: true,
        default_bindings_module: "capstan_sdk::bindings",
    });

    // `generate!` reads the WIT without telling cargo: this makes a change of the contract
    // rebuild the SDK, and so every plugin built against it.
    const _: &str = include_str!("../../wit/0.3.6/manager.wit");
}

pub use context::{Caller, CallerKind, Context};
pub use descriptor::{CollectionSpec, Descriptor, Empty, Page, Role};
pub use manager::{Adapter, Event, Manager, ReconcileOutcome, ReconcileTrigger};
pub use refusal::Refusal;
/// The `schemars` (1.x) the SDK generates schemas with; the `JsonSchema` derive needs it as a
/// dependency of the plugin crate (or `#[schemars(crate = "capstan_sdk::schemars")]`).
pub use schemars;
pub use schemars::JsonSchema;
/// The `serde` the SDK encodes and decodes with.
pub use serde;
pub use serde_json::{Value, json};

/// What every SDK function and manager handler answers.
pub type Result<T> = std::result::Result<T, Refusal>;

/// Milliseconds since the Unix epoch by the host's clock (WASI's wall clock); 0 before 1970.
pub fn now_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

/// Export `$manager` (a type implementing [`Manager`]) as the component's `guest` interface.
/// Invoke it once, at the plugin crate's root.
///
/// The exports exist only when building for `wasm32`: their symbol names
/// (`capstan:plugin/guest@0.3.6#handle`) mean something only to a component, and a native
/// `cdylib` cannot even link them. Native builds (unit tests, clippy) get everything else.
#[macro_export]
macro_rules! manager {
    ($manager:ty) => {
        #[doc(hidden)]
        #[allow(dead_code)]
        type __CapstanSdkExportedManager = $crate::Adapter<$manager>;
        #[cfg(target_arch = "wasm32")]
        $crate::bindings::export!(__CapstanSdkExportedManager with_types_in $crate::bindings);
    };
}

/// Decode JSON text into `T` strictly: trailing text is refused, and a mismatch is refused
/// `invalid-request` with `data.field` naming the field (`tags[0].weight`), as the host's own
/// API does.
pub fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(decoding_refusal)?;
    de.end().map_err(|e| Refusal::invalid_request(format!("invalid request body: {}", without_position(&e))))?;
    Ok(value)
}

/// [`decode`] for a JSON value already parsed.
pub fn decode_value<T: serde::de::DeserializeOwned>(value: Value) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(decoding_refusal)
}

fn decoding_refusal(err: serde_path_to_error::Error<serde_json::Error>) -> Refusal {
    let path = err.path().to_string();
    let path = if path == "." { String::new() } else { path };
    let inner = without_position(err.inner());
    let join = |name: &str| if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
    let quoted = |prefix: &str| inner.strip_prefix(prefix).and_then(|rest| rest.split_once('`')).map(|(name, _)| name.to_string());
    let (field, message) = if let Some(name) = quoted("unknown field `") {
        // the path already ends at the unknown field, except at the top level
        let field = if path.is_empty() { name } else { path.clone() };
        (field.clone(), format!("unknown field {field:?}"))
    } else if let Some(name) = quoted("missing field `") {
        let field = join(&name);
        (field.clone(), format!("missing field {field:?}"))
    } else if path.is_empty() || err.inner().is_syntax() || err.inner().is_eof() {
        (String::new(), format!("invalid request body: {inner}"))
    } else {
        (path.clone(), format!("invalid field {path:?}: {inner}"))
    };
    let refusal = Refusal::invalid_request(message);
    if field.is_empty() { refusal } else { refusal.with_data(json!({ "field": field })) }
}

/// serde_json's message without its " at line 1 column 7" suffix.
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) if e.line() > 0 => text[..at].to_string(),
        _ => text,
    }
}

/// Serialize `value` to JSON text, refusing `internal` if it cannot be.
pub(crate) fn encode<T: serde::Serialize + ?Sized>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Refusal::internal(format!("encoding JSON failed: {e}")))
}

/// Parse JSON text the host sent, refusing `internal` naming `what` if it is not `T`.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T> {
    decode(text).map_err(|r| {
        let mut refusal = Refusal::internal(format!("{what} does not have the expected shape: {}", r.message()));
        if let Some(data) = r.data() {
            refusal = refusal.with_data(data.clone());
        }
        refusal
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_is_strict_and_names_fields() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Outer {
            inner: Inner,
        }
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Inner {
            n: u32,
        }
        assert_eq!(decode::<Outer>(r#"{"inner": {"n": 1}}"#).unwrap().inner.n, 1);
        let field = |text: &str| decode::<Outer>(text).unwrap_err().data().cloned();
        assert_eq!(field(r#"{"inner": {}}"#), Some(json!({"field": "inner.n"})));
        assert_eq!(field(r#"{"inner": {"n": 1, "m": 2}}"#), Some(json!({"field": "inner.m"})));
        assert_eq!(field(r#"{"inner": {"n": -1}}"#), Some(json!({"field": "inner.n"})));
        assert_eq!(field(r#"{"inner": {"n": 1}, "x": 0}"#), Some(json!({"field": "x"})));
        assert_eq!(field(r#"{}"#), Some(json!({"field": "inner"})));
        assert_eq!(field(r#"{"inner": {"n": 1}} {}"#), None);
        let err = decode::<Outer>(r#"{"inner": {"n": true}}"#).unwrap_err();
        assert_eq!(err.message(), "invalid field \"inner.n\": invalid type: boolean `true`, expected u32");
        let err = decode_value::<Outer>(json!({"inner": {"n": "1"}})).unwrap_err();
        assert_eq!(err.data(), Some(&json!({"field": "inner.n"})));
    }

    #[test]
    fn parse_blames_the_host_data_not_the_caller() {
        let err = parse::<u32>("\"x\"", "document notes/a").unwrap_err();
        assert_eq!(err.code(), "internal");
        assert!(err.message().starts_with("document notes/a does not have the expected shape"), "{}", err.message());
    }
}
