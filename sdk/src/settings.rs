//! The plugin's own settings: what [`crate::Descriptor::setting`] declared, as operators set them
//! (`settings.update` with `<pluginId>.<key>`), else the declared defaults. No capability needed.

use crate::bindings::capstan::plugin::settings as wit;
use crate::{Result, parse};
use serde::de::DeserializeOwned;

/// Every declared setting decoded into `T` (a struct with a field per key, camelCase; a key
/// with neither a value nor a default is absent, so make such fields `Option` or `#[serde(default)]`).
pub fn get<T: DeserializeOwned>() -> Result<T> {
    parse(&wit::get()?, "the plugin's settings")
}

/// A setting's text in a shape its JSON Schema pins down (a `pattern`), so a value in the wrong
/// shape is refused `setting-invalid` when it is set, not found out later by the plugin:
///
/// ```
/// capstan_sdk::shaped_text!(Origin, r"^https?://[A-Za-z0-9.\-\[\]:]+$", "An origin: http(s)://host[:port], no path.");
/// let origin: Origin = serde_json::from_str("\"https://mx.example\"").unwrap();
/// assert_eq!(origin.0, "https://mx.example");
/// ```
#[macro_export]
macro_rules! shaped_text {
    ($name:ident, $pattern:expr, $what:expr) => {
        #[doc = $what]
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name(pub String);

        impl $crate::serde::Serialize for $name {
            fn serialize<S: $crate::serde::Serializer>(&self, s: S) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> $crate::serde::Deserialize<'de> for $name {
            fn deserialize<D: $crate::serde::Deserializer<'de>>(d: D) -> ::std::result::Result<Self, D::Error> {
                <String as $crate::serde::Deserialize>::deserialize(d).map($name)
            }
        }

        impl $crate::JsonSchema for $name {
            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut $crate::schemars::SchemaGenerator) -> $crate::schemars::Schema {
                $crate::schemars::json_schema!({ "type": "string", "pattern": $pattern, "description": $what })
            }
        }
    };
}

/// A TCP port as a setting: 1–65535.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct PortNumber(pub u16);

impl schemars::JsonSchema for PortNumber {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PortNumber".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "integer", "minimum": 1, "maximum": 65535 })
    }
}
