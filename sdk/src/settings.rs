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
