//! `capstan-catalog`: the App Store's signed catalog format — the model (apps, versions,
//! service templates), the envelope (payload bytes, SHA-256 digest, Ed25519 signature over a
//! domain-separated statement), verification against trusted keys, and the succession rules a
//! new catalog must keep. Pure: no filesystem, clock or randomness in the core API, so the App
//! Store plugin (wasm32-wasip2) and the publisher's `capstan-catalog sign | verify` share one
//! implementation. The feature `fs` adds [`definitions`], reading a directory of app
//! definition files; the feature `cli` builds the `capstan-catalog` binary (`src/main.rs`).
//!
//! The format is specified in this crate's README.md.
//!
//! ```
//! use capstan_catalog::{Catalog, PublisherKey, check_succession, sign, verify};
//! # let key = capstan_catalog::SigningKey::from_bytes(&[1; 32]);
//! let envelope = sign(&Catalog::default(), 1, &key).unwrap();
//! let trusted = [PublisherKey::from(&key)];
//! let verified = verify(envelope.to_json().as_bytes(), &trusted).unwrap();
//! check_succession(None, &verified).unwrap();
//! ```

#[cfg(feature = "fs")]
pub mod definitions;
mod envelope;
mod error;
mod model;
mod succession;

/// Publisher keys: the host's (`capstan-publisher-key`), the one text form catalogs and plugin
/// bundles are signed under.
pub use capstan_publisher_key::{KeyError, PUBLIC_KEY_PREFIX, PublisherKey};
pub use envelope::{
    CONTRACT, Envelope, FORMAT, MAX_ENVELOPE_BYTES, MAX_REVISION, STATEMENT_DOMAIN, Verified, sign, sign_with, statement, verify,
};
pub use error::CatalogError;
pub use model::{
    App, AppVersion, Catalog, Invalid, MAX_APPS, MAX_CAPABILITIES, MAX_CATEGORIES, MAX_ENVIRONMENT, MAX_NAME_CHARS, MAX_OIDC_ROLES,
    MAX_PORTS, MAX_REDIRECT_PATH_BYTES, MAX_TEMPLATE_BYTES, MAX_TEXT_BYTES, MAX_VERSIONS, MAX_VOLUMES, PLATFORM_OIDC, PlatformOidc, Port,
    Protocol, Snapshot, Template, Volume, Withdrawal,
};
pub use succession::check_succession;

/// The versions and keys this crate uses, for callers that name them.
pub use ed25519_dalek::SigningKey;
pub use semver::Version;
