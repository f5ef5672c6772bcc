//! The App Store's settings, declared in `describe` and set by operators as
//! `appstore.catalogSources` and `appstore.trustedCatalogKeys`.

use capstan_sdk::{JsonSchema, Result};
use serde::{Deserialize, Serialize};

/// The setting listing catalog source URLs (`appstore.catalogSources`).
pub const SOURCES: &str = "catalogSources";
/// The setting listing catalog keys the operator trusts (`appstore.trustedCatalogKeys`).
pub const TRUSTED_KEYS: &str = "trustedCatalogKeys";

/// Catalog source URLs, asked in order: https, or http to a loopback address (tests, local
/// mirrors). The `http-setting:appstore.catalogSources` grant lets the plugin reach exactly these.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct CatalogSources(
    #[schemars(
        length(max = 16),
        inner(regex(pattern = r"^(https://[^\s@/]+|http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?)(/\S*)?$"))
    )]
    pub Vec<String>,
);

/// Catalog signing keys trusted besides the shipped ones, as `capstan-ed25519:<43 base64url>`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct TrustedCatalogKeys(
    #[schemars(length(max = 16), inner(regex(pattern = r"^capstan-ed25519:[A-Za-z0-9_-]{43}$")))] pub Vec<String>,
);

/// Both settings as the plugin reads them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    #[serde(default)]
    pub catalog_sources: CatalogSources,
    #[serde(default)]
    pub trusted_catalog_keys: TrustedCatalogKeys,
}

/// The settings as operators set them, else their defaults (empty).
pub fn get() -> Result<Settings> {
    capstan_sdk::settings::get()
}
