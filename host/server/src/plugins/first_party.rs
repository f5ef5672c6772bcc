//! First-party plugins ship inside the host binary (built by `host/capstan/build.rs` from the
//! `plugins/` directories the host's Cargo.toml lists). They are trusted because this binary
//! carries them — an unsigned bundle is first-party only when it is byte for byte one of these —
//! and they still run sandboxed with exactly the capabilities they declare.

use super::bundle::Bundle;
use crate::refusal::Result;

pub use capstan_plugin_host::first_party::{INSTALLER, PUBLISHER};

include!(concat!(env!("OUT_DIR"), "/first_party.rs"));

/// The bundles this binary embeds.
pub fn bundles() -> Result<Vec<Bundle>> {
    EMBEDDED
        .iter()
        .map(|(manifest, component, pages)| {
            let pages = pages.iter().map(|(name, text)| (name.to_string(), text.to_string())).collect();
            Bundle::new(manifest.to_string(), component.to_vec())?.with_pages(pages)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_embedded_plugin_is_a_valid_bundle() {
        for bundle in super::bundles().unwrap() {
            bundle.manifest.check_wit_supported().unwrap();
            assert!(bundle.signature.is_none(), "first-party bundles are trusted by being embedded, not signed");
        }
    }
}
