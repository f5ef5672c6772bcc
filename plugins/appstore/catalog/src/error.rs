//! The refusals of reading, verifying and succeeding a catalog: one enum, each variant with a
//! stable kebab-case [`code`](CatalogError::code), a message for people (its `Display`) and
//! structured [`data`](CatalogError::data). None carries anything secret: a catalog holds none.

use crate::CONTRACT;
use serde_json::{Value, json};

/// Why a catalog envelope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// `catalog-malformed`: too large, not the envelope's JSON shape, not this format, an
    /// undecodable field, or a payload that is not a valid catalog (the reason names the field).
    #[error("the catalog is malformed: {reason}")]
    Malformed {
        /// What is wrong, naming the field when one is known.
        reason: String,
    },
    /// `catalog-contract-unsupported`: the envelope states a contract version this reader does
    /// not implement (`contract` as the envelope spelled it).
    #[error("the catalog's contract version {contract} is not supported; this reader supports contract {CONTRACT}")]
    ContractUnsupported {
        /// The contract version as the envelope spelled it.
        contract: String,
    },
    /// `catalog-digest-mismatch`: the payload's SHA-256 is not the digest the envelope states.
    #[error("the catalog's payload does not match its digest: it states {stated}, the payload hashes to {computed}")]
    DigestMismatch {
        /// The digest the envelope states.
        stated: String,
        /// The payload's actual SHA-256, lowercase hex.
        computed: String,
    },
    /// `catalog-signature-invalid`: the signature does not verify for the stated key over the
    /// signed statement: the envelope was changed after signing (or signed with another key).
    #[error("the catalog's signature does not verify for {public_key}: the catalog was changed after signing")]
    SignatureInvalid {
        /// The key the envelope names as signer, in text form.
        public_key: String,
    },
    /// `catalog-key-untrusted`: the signature verifies, but the key is not a trusted catalog key.
    #[error("the catalog is signed by {public_key} (fingerprint {fingerprint}), which is not a trusted catalog key")]
    KeyUntrusted {
        /// The signing key, in text form.
        public_key: String,
        /// The signing key's fingerprint ([`PublisherKey::fingerprint`](crate::PublisherKey::fingerprint)).
        fingerprint: String,
    },
    /// `catalog-revision-not-newer`: the candidate's revision is not greater than the active one.
    #[error("the catalog's revision {candidate} is not newer than the active revision {active}")]
    RevisionNotNewer {
        /// The active catalog's revision.
        active: u64,
        /// The candidate catalog's revision.
        candidate: u64,
    },
    /// `catalog-version-removed`: a version the active catalog published is missing.
    #[error(
        "{app} {version} is published by the active catalog but missing from the candidate: a published version is never removed (withdraw it instead)"
    )]
    VersionRemoved {
        /// The app's id.
        app: String,
        /// The missing version.
        version: String,
    },
    /// `catalog-version-rewritten`: a published version's template changed (digests differ).
    #[error(
        "{app} {version} is published by the active catalog with template digest {active_digest}, but the candidate's is {candidate_digest}: a published version is never rewritten (publish a new version)"
    )]
    VersionRewritten {
        /// The app's id.
        app: String,
        /// The rewritten version.
        version: String,
        /// The template digest in the active catalog, lowercase hex.
        active_digest: String,
        /// The template digest in the candidate catalog, lowercase hex.
        candidate_digest: String,
    },
    /// `catalog-version-reinstated`: a version the active catalog withdrew is offered again.
    #[error("{app} {version} is withdrawn in the active catalog and offered again by the candidate: a withdrawal is never undone")]
    VersionReinstated {
        /// The app's id.
        app: String,
        /// The withdrawn version offered again.
        version: String,
    },
}

impl CatalogError {
    pub(crate) fn malformed(reason: impl Into<String>) -> Self {
        CatalogError::Malformed { reason: reason.into() }
    }

    /// The stable kebab-case refusal code.
    pub fn code(&self) -> &'static str {
        match self {
            CatalogError::Malformed { .. } => "catalog-malformed",
            CatalogError::ContractUnsupported { .. } => "catalog-contract-unsupported",
            CatalogError::DigestMismatch { .. } => "catalog-digest-mismatch",
            CatalogError::SignatureInvalid { .. } => "catalog-signature-invalid",
            CatalogError::KeyUntrusted { .. } => "catalog-key-untrusted",
            CatalogError::RevisionNotNewer { .. } => "catalog-revision-not-newer",
            CatalogError::VersionRemoved { .. } => "catalog-version-removed",
            CatalogError::VersionRewritten { .. } => "catalog-version-rewritten",
            CatalogError::VersionReinstated { .. } => "catalog-version-reinstated",
        }
    }

    /// The refusal's structured data (camelCase keys), for a refusal's `data`.
    pub fn data(&self) -> Value {
        match self {
            CatalogError::Malformed { reason } => json!({ "reason": reason }),
            CatalogError::ContractUnsupported { contract } => json!({ "contract": contract, "supported": [CONTRACT] }),
            CatalogError::DigestMismatch { stated, computed } => json!({ "stated": stated, "computed": computed }),
            CatalogError::SignatureInvalid { public_key } => json!({ "publicKey": public_key }),
            CatalogError::KeyUntrusted { public_key, fingerprint } => json!({ "publicKey": public_key, "fingerprint": fingerprint }),
            CatalogError::RevisionNotNewer { active, candidate } => json!({ "activeRevision": active, "candidateRevision": candidate }),
            CatalogError::VersionRemoved { app, version } | CatalogError::VersionReinstated { app, version } => {
                json!({ "appId": app, "version": version })
            }
            CatalogError::VersionRewritten { app, version, active_digest, candidate_digest } => json!({
                "appId": app,
                "version": version,
                "activeTemplateDigest": active_digest,
                "candidateTemplateDigest": candidate_digest,
            }),
        }
    }

    /// The app a succession refusal names.
    pub fn app(&self) -> Option<&str> {
        match self {
            CatalogError::VersionRemoved { app, .. }
            | CatalogError::VersionRewritten { app, .. }
            | CatalogError::VersionReinstated { app, .. } => Some(app),
            _ => None,
        }
    }

    /// The version a succession refusal names.
    pub fn version(&self) -> Option<&str> {
        match self {
            CatalogError::VersionRemoved { version, .. }
            | CatalogError::VersionRewritten { version, .. }
            | CatalogError::VersionReinstated { version, .. } => Some(version),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_kebab_case() {
        let all = [
            CatalogError::malformed("x"),
            CatalogError::ContractUnsupported { contract: "2".into() },
            CatalogError::DigestMismatch { stated: "a".into(), computed: "b".into() },
            CatalogError::SignatureInvalid { public_key: "k".into() },
            CatalogError::KeyUntrusted { public_key: "k".into(), fingerprint: "f".into() },
            CatalogError::RevisionNotNewer { active: 2, candidate: 1 },
            CatalogError::VersionRemoved { app: "a".into(), version: "1.0.0".into() },
            CatalogError::VersionRewritten {
                app: "a".into(),
                version: "1.0.0".into(),
                active_digest: "x".into(),
                candidate_digest: "y".into(),
            },
            CatalogError::VersionReinstated { app: "a".into(), version: "1.0.0".into() },
        ];
        let codes: Vec<_> = all.iter().map(CatalogError::code).collect();
        assert_eq!(
            codes,
            [
                "catalog-malformed",
                "catalog-contract-unsupported",
                "catalog-digest-mismatch",
                "catalog-signature-invalid",
                "catalog-key-untrusted",
                "catalog-revision-not-newer",
                "catalog-version-removed",
                "catalog-version-rewritten",
                "catalog-version-reinstated",
            ]
        );
        for error in &all {
            assert!(error.data().is_object());
            assert!(!error.to_string().is_empty());
        }
        assert_eq!((all[6].app(), all[6].version()), (Some("a"), Some("1.0.0")));
        assert_eq!(all[0].app(), None);
    }
}
