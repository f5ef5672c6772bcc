//! The App Store's settings, declared in `describe` and set by operators as
//! `appstore.catalogSources`, `appstore.catalogRegistries`, `appstore.catalogPackage` and
//! `appstore.trustedCatalogKeys`.

use capstan_sdk::{JsonSchema, Result};
use serde::{Deserialize, Serialize};

/// The setting listing catalog source URLs (`appstore.catalogSources`).
pub const SOURCES: &str = "catalogSources";
/// The setting listing npm registries asked for the catalog package (`appstore.catalogRegistries`).
pub const REGISTRIES: &str = "catalogRegistries";
/// The setting naming the catalog's npm package (`appstore.catalogPackage`).
pub const PACKAGE: &str = "catalogPackage";
/// The package asked for while `appstore.catalogPackage` is not set.
pub const DEFAULT_PACKAGE: &str = "capstan-appstore-catalog";
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

/// npm registries asked for the catalog package, in order after the sources: https, or http to
/// a loopback address. The `http-setting:appstore.catalogRegistries` grant lets the plugin reach
/// exactly these (the package's tarball must be on its registry's origin).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct CatalogRegistries(
    #[schemars(
        length(max = 16),
        inner(regex(pattern = r"^(https://[^\s@/]+|http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?)(/\S*)?$"))
    )]
    pub Vec<String>,
);

/// The npm package holding the signed envelope (`catalog.json` at its top): `name` or
/// `@scope/name`, optionally pinned as `name@version` or `name@tag` (else the `latest` tag).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CatalogPackage(
    #[schemars(regex(pattern = r"^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*(@[!-~]+)?$"), length(max = 260))] pub String,
);

impl Default for CatalogPackage {
    fn default() -> Self {
        CatalogPackage(DEFAULT_PACKAGE.into())
    }
}

/// Catalog signing keys trusted besides the shipped ones, as `capstan-ed25519:<43 base64url>`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct TrustedCatalogKeys(
    #[schemars(length(max = 16), inner(regex(pattern = r"^capstan-ed25519:[A-Za-z0-9_-]{43}$")))] pub Vec<String>,
);

/// The settings as the plugin reads them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    #[serde(default)]
    pub catalog_sources: CatalogSources,
    #[serde(default)]
    pub catalog_registries: CatalogRegistries,
    #[serde(default)]
    pub catalog_package: CatalogPackage,
    #[serde(default)]
    pub trusted_catalog_keys: TrustedCatalogKeys,
}

/// The settings as operators set them, else their defaults (empty).
pub fn get() -> Result<Settings> {
    capstan_sdk::settings::get()
}
