//! The signed envelope: a catalog payload carried as exact bytes (base64), its SHA-256, and an
//! Ed25519 signature over a domain-separated statement of format, contract, revision and digest.
//! See the crate's README for the format; [`verify`] is the only way to a [`Verified`] catalog.

use crate::error::CatalogError;
use crate::model::{App, AppVersion, Catalog, Snapshot, Template};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use capstan_publisher_key::PublisherKey;
use ed25519_dalek::{Signature, Signer, SigningKey};
use semver::Version;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The envelope's `format` tag.
pub const FORMAT: &str = "capstan-catalog";
/// The contract version this crate reads and writes.
pub const CONTRACT: u32 = 1;
/// The largest envelope accepted, in bytes; larger input is refused before it is parsed.
pub const MAX_ENVELOPE_BYTES: usize = 8 * 1024 * 1024;
/// The greatest revision: the largest integer a JSON number carries exactly everywhere.
pub const MAX_REVISION: u64 = (1 << 53) - 1;
/// The first line of the signed statement.
pub const STATEMENT_DOMAIN: &str = "capstan-catalog-signature-v1";

/// A catalog envelope as it travels (JSON, camelCase, unknown fields refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Envelope {
    /// Always [`FORMAT`].
    pub format: String,
    /// The contract version, [`CONTRACT`].
    pub contract: u32,
    /// 1 to [`MAX_REVISION`]; greater on every publication.
    pub revision: u64,
    /// Lowercase hex SHA-256 of the payload bytes.
    pub digest: String,
    /// The signer, `capstan-ed25519:…`.
    pub public_key: String,
    /// Standard base64 (padded) of the 64-byte Ed25519 signature over [`statement`].
    pub signature: String,
    /// Standard base64 (padded) of the payload bytes: the catalog as UTF-8 JSON.
    pub payload: String,
}

/// The exact bytes an envelope's signature covers:
/// `capstan-catalog-signature-v1\n{format}\n{contract}\n{revision}\n{digest hex}\n`.
pub fn statement(format: &str, contract: u32, revision: u64, digest_hex: &str) -> Vec<u8> {
    format!("{STATEMENT_DOMAIN}\n{format}\n{contract}\n{revision}\n{digest_hex}\n").into_bytes()
}

impl Envelope {
    /// The envelope as compact JSON (what a publisher serves and a host stores).
    pub fn to_json(&self) -> String {
        // plain strings and integers: serializing cannot fail
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse an envelope's structure, without checking digest, signature or payload.
    ///
    /// Refuses `catalog-malformed` (over [`MAX_ENVELOPE_BYTES`], not JSON, not an object of
    /// exactly the envelope's fields, another `format`) and `catalog-contract-unsupported` (a
    /// `contract` number other than [`CONTRACT`], judged before the rest of the shape, so a
    /// future contract is named as such even when its fields differ).
    pub fn parse(bytes: &[u8]) -> Result<Envelope, CatalogError> {
        if bytes.len() > MAX_ENVELOPE_BYTES {
            return Err(CatalogError::malformed(format!(
                "the envelope is {} bytes; the limit is {MAX_ENVELOPE_BYTES} bytes (8 MiB)",
                bytes.len()
            )));
        }
        #[derive(Deserialize)]
        struct Probe {
            format: Option<Value>,
            contract: Option<Value>,
        }
        let probe: Probe =
            serde_json::from_slice(bytes).map_err(|e| CatalogError::malformed(format!("the envelope is not a JSON object: {e}")))?;
        if probe.format.as_ref().and_then(Value::as_str) != Some(FORMAT) {
            return Err(CatalogError::malformed(format!("the envelope's format is not {FORMAT:?}: this is not a Capstan catalog")));
        }
        match probe.contract {
            Some(Value::Number(n)) if n.as_u64() == Some(u64::from(CONTRACT)) => {}
            Some(Value::Number(n)) => return Err(CatalogError::ContractUnsupported { contract: n.to_string() }),
            _ => return Err(CatalogError::malformed("the envelope's contract is missing or not a number")),
        }
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let envelope: Envelope = serde_path_to_error::deserialize(de)
            .map_err(|e| CatalogError::malformed(format!("the envelope's {}: {}", e.path(), e.inner())))?;
        Ok(envelope)
    }
}

/// Sign `payload` as revision `revision` with `key`: the envelope a publisher serves.
///
/// Refuses `catalog-malformed` when the payload breaks a model rule (naming the field), the
/// revision is 0 or above [`MAX_REVISION`], or the envelope would exceed [`MAX_ENVELOPE_BYTES`]
/// — a producer never signs what a reader refuses.
pub fn sign(payload: &Catalog, revision: u64, key: &SigningKey) -> Result<Envelope, CatalogError> {
    sign_with(payload, revision, &PublisherKey::from(key), |statement| Ok::<_, CatalogError>(key.sign(statement).to_bytes()))
}

/// [`sign`] by a key held elsewhere: `signer` is its public key and `sign` answers the Ed25519
/// signature of the statement it is given (a plugin's host-kept key, for one).
pub fn sign_with<E: From<CatalogError>>(
    payload: &Catalog,
    revision: u64,
    signer: &PublisherKey,
    sign: impl FnOnce(&[u8]) -> Result<[u8; 64], E>,
) -> Result<Envelope, E> {
    check_revision(revision)?;
    payload.validate().map_err(|e| CatalogError::malformed(format!("payload: {e}")))?;
    let bytes = serde_json::to_vec(payload).map_err(|e| CatalogError::malformed(format!("payload: {e}")))?;
    let digest = hex::encode(Sha256::digest(&bytes));
    let signature = sign(&statement(FORMAT, CONTRACT, revision, &digest))?;
    let envelope = Envelope {
        format: FORMAT.into(),
        contract: CONTRACT,
        revision,
        digest,
        public_key: signer.to_string(),
        signature: B64.encode(signature),
        payload: B64.encode(&bytes),
    };
    let size = envelope.to_json().len();
    if size > MAX_ENVELOPE_BYTES {
        return Err(CatalogError::malformed(format!(
            "the signed envelope would be {size} bytes; the limit is {MAX_ENVELOPE_BYTES} bytes (8 MiB)"
        ))
        .into());
    }
    Ok(envelope)
}

fn check_revision(revision: u64) -> Result<(), CatalogError> {
    if revision == 0 || revision > MAX_REVISION {
        return Err(CatalogError::malformed(format!("the revision {revision} is not between 1 and {MAX_REVISION}")));
    }
    Ok(())
}

/// Parse and verify an envelope against the trusted catalog keys.
///
/// In this order, each refused by name: size and structure ([`Envelope::parse`]); the revision's
/// range, the key's text, the signature's and digest's encodings and the payload's base64
/// (`catalog-malformed`); the payload's SHA-256 against `digest` (`catalog-digest-mismatch`);
/// the signature over [`statement`] (`catalog-signature-invalid`, strict verification); the key
/// among `trusted` (`catalog-key-untrusted`; an empty `trusted` trusts nothing); only then is
/// the payload parsed and checked against the model (`catalog-malformed`, naming the field).
pub fn verify(bytes: &[u8], trusted: &[PublisherKey]) -> Result<Verified, CatalogError> {
    let envelope = Envelope::parse(bytes)?;
    check_revision(envelope.revision)?;
    let signer: PublisherKey =
        envelope.public_key.parse().map_err(|e| CatalogError::malformed(format!("the envelope's publicKey: {e}")))?;
    let signature: [u8; 64] = B64
        .decode(&envelope.signature)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| CatalogError::malformed("the envelope's signature is not standard base64 of 64 bytes"))?;
    let canonical_hex = envelope.digest.len() == 64 && envelope.digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !canonical_hex {
        return Err(CatalogError::malformed("the envelope's digest is not 64 lowercase hex characters"));
    }
    let payload = B64.decode(&envelope.payload).map_err(|_| CatalogError::malformed("the envelope's payload is not standard base64"))?;
    let digest: [u8; 32] = Sha256::digest(&payload).into();
    let computed = hex::encode(digest);
    if computed != envelope.digest {
        return Err(CatalogError::DigestMismatch { stated: envelope.digest.clone(), computed });
    }
    let signed = statement(&envelope.format, envelope.contract, envelope.revision, &envelope.digest);
    signer
        .verifying_key()
        .verify_strict(&signed, &Signature::from_bytes(&signature))
        .map_err(|_| CatalogError::SignatureInvalid { public_key: signer.to_string() })?;
    if !trusted.contains(&signer) {
        return Err(CatalogError::KeyUntrusted { public_key: signer.to_string(), fingerprint: signer.fingerprint() });
    }
    let de = &mut serde_json::Deserializer::from_slice(&payload);
    let catalog: Catalog =
        serde_path_to_error::deserialize(de).map_err(|e| CatalogError::malformed(format!("payload: {}: {}", e.path(), e.inner())))?;
    catalog.validate().map_err(|e| CatalogError::malformed(format!("payload: {e}")))?;
    Ok(Verified { envelope, catalog, digest, signer })
}

/// A catalog whose envelope verified against trusted keys and whose payload is a valid model.
/// Only [`verify`] makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    envelope: Envelope,
    catalog: Catalog,
    digest: [u8; 32],
    signer: PublisherKey,
}

impl Verified {
    /// The envelope's revision.
    pub fn revision(&self) -> u64 {
        self.envelope.revision
    }

    /// The envelope's contract version (always [`CONTRACT`]).
    pub fn contract(&self) -> u32 {
        self.envelope.contract
    }

    /// The payload's SHA-256.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    /// The payload's SHA-256, lowercase hex (the envelope's `digest`).
    pub fn digest_hex(&self) -> &str {
        &self.envelope.digest
    }

    /// The key that signed it (one of the trusted keys).
    pub fn signer(&self) -> &PublisherKey {
        &self.signer
    }

    /// The envelope as verified; [`Envelope::to_json`] is what to store as last-known-good
    /// (verify it again when reading it back).
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The verified catalog payload.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Every app, in the publisher's order.
    pub fn apps(&self) -> &[App] {
        &self.catalog.apps
    }

    /// The app with this id.
    pub fn app(&self, app_id: &str) -> Option<&App> {
        self.catalog.app(app_id)
    }

    /// An app's version, withdrawn or not.
    pub fn version(&self, app_id: &str, version: &Version) -> Option<&AppVersion> {
        self.app(app_id)?.version(version)
    }

    /// An app version's template, withdrawn or not (a service running a withdrawn version
    /// still has its template).
    pub fn template(&self, app_id: &str, version: &Version) -> Option<&Template> {
        Some(&self.version(app_id, version)?.template)
    }

    /// The version a new install of the app gets ([`App::newest`]).
    pub fn newest_version(&self, app_id: &str) -> Option<&AppVersion> {
        self.app(app_id)?.newest()
    }

    /// The versions a service of the app running `current` may upgrade to, oldest first
    /// ([`App::upgrades_from`]); empty for an unknown app.
    pub fn versions_newer_than(&self, app_id: &str, current: &Version) -> Vec<&AppVersion> {
        self.app(app_id).map(|app| app.upgrades_from(current)).unwrap_or_default()
    }

    /// The snapshot a service of this app version carries, taken from this catalog.
    pub fn snapshot(&self, app_id: &str, version: &Version) -> Option<Snapshot> {
        let app = self.app(app_id)?;
        Some(Snapshot::of(app, app.version(version)?, self.revision()))
    }

    /// Whether `other` is this very catalog again (same revision and digest): a confirmation,
    /// not a candidate to succeed it.
    pub fn same_as(&self, other: &Verified) -> bool {
        self.revision() == other.revision() && self.digest == other.digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_APPS;
    use crate::model::tests::{app, catalog};

    pub(super) fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    pub(super) fn trusted() -> Vec<PublisherKey> {
        vec![PublisherKey::from(&key(9)), PublisherKey::from(&key(1))]
    }

    pub(super) fn signed() -> String {
        sign(&catalog(), 42, &key(1)).unwrap().to_json()
    }

    fn code(bytes: &[u8]) -> &'static str {
        verify(bytes, &trusted()).unwrap_err().code()
    }

    /// Replace a top-level field of an envelope text.
    fn with(text: &str, field: &str, value: Value) -> String {
        let mut v: Value = serde_json::from_str(text).unwrap();
        v[field] = value;
        v.to_string()
    }

    #[test]
    fn round_trip() {
        let text = signed();
        let verified = verify(text.as_bytes(), &trusted()).unwrap();
        assert_eq!(verified.catalog(), &catalog());
        assert_eq!(verified.revision(), 42);
        assert_eq!(verified.contract(), CONTRACT);
        assert_eq!(verified.signer(), &PublisherKey::from(&key(1)));
        assert_eq!(verified.envelope().to_json(), text);
        assert_eq!(verified.digest_hex(), hex::encode(verified.digest()));
        let payload = B64.decode(&verified.envelope().payload).unwrap();
        assert_eq!(payload, serde_json::to_vec(&catalog()).unwrap(), "the payload is the catalog's JSON");
        assert_eq!(verified.digest_hex(), hex::encode(Sha256::digest(&payload)));
        // stored, restored, verified again: the same catalog
        let again = verify(verified.envelope().to_json().as_bytes(), &trusted()).unwrap();
        assert!(again.same_as(&verified) && again == verified);
        // whitespace and field order are not part of what is signed
        let pretty = serde_json::to_string_pretty(&serde_json::from_str::<Value>(&text).unwrap()).unwrap();
        assert!(verify(pretty.as_bytes(), &trusted()).unwrap().same_as(&verified));

        let v = |s: &str| s.parse::<Version>().unwrap();
        assert_eq!(verified.apps().len(), 2);
        assert_eq!(verified.app("chat").unwrap().name, "The chat");
        assert_eq!(verified.newest_version("wiki").unwrap().version, v("1.1.0"));
        assert_eq!(verified.template("wiki", &v("1.0.0")).unwrap().image, "registry.example.com/wiki:1.0.0");
        assert!(verified.template("wiki", &v("9.0.0")).is_none() && verified.template("nope", &v("1.0.0")).is_none());
        assert_eq!(verified.versions_newer_than("wiki", &v("1.0.0")).len(), 1);
        assert!(verified.versions_newer_than("nope", &v("1.0.0")).is_empty());
        let snapshot = verified.snapshot("wiki", &v("1.0.0")).unwrap();
        assert_eq!((snapshot.catalog_revision, snapshot.is_consistent()), (42, true));
    }

    #[test]
    fn the_signed_statement_is_exactly_documented() {
        let envelope = sign(&catalog(), 42, &key(1)).unwrap();
        let text = format!("capstan-catalog-signature-v1\ncapstan-catalog\n1\n42\n{}\n", envelope.digest);
        let signature = Signature::from_bytes(&B64.decode(&envelope.signature).unwrap().try_into().unwrap());
        key(1).verifying_key().verify_strict(text.as_bytes(), &signature).unwrap();
        assert_eq!(statement(FORMAT, CONTRACT, 42, &envelope.digest), text.as_bytes());
    }

    #[test]
    fn malformed_envelopes_are_refused_by_name() {
        let text = signed();
        for (why, bad) in [
            ("empty", String::new()),
            ("not JSON", "capstan".into()),
            ("an array", "[]".into()),
            ("no format", with(&text, "format", Value::Null)),
            ("another format", with(&text, "format", "capstan-plugin".into())),
            ("no contract", with(&text, "contract", Value::Null)),
            ("contract text", with(&text, "contract", "1".into())),
            ("unknown field", with(&text, "extra", true.into())),
            ("revision 0", with(&text, "revision", 0.into())),
            ("negative revision", with(&text, "revision", (-1).into())),
            ("huge revision", with(&text, "revision", (MAX_REVISION + 1).into())),
            ("key text", with(&text, "publicKey", "ed25519:abc".into())),
            ("short signature", with(&text, "signature", B64.encode([0u8; 63]).into())),
            ("signature not base64", with(&text, "signature", "!!".into())),
            (
                "uppercase digest",
                with(&text, "digest", serde_json::from_str::<Value>(&text).unwrap()["digest"].as_str().unwrap().to_uppercase().into()),
            ),
            ("short digest", with(&text, "digest", "abcd".into())),
            ("payload not base64", with(&text, "payload", "a=b".into())),
            ("duplicate field", text.replacen("{", r#"{"revision":42,"#, 1)),
            ("trailing data", format!("{text} {{}}")),
            ("format spelled otherwise", text.replacen("\"capstan-catalog\"", "\"capstan-catalog\u{fffd}\"", 1)),
        ] {
            let err = verify(bad.as_bytes(), &trusted()).unwrap_err();
            assert_eq!(err.code(), "catalog-malformed", "{why}: {err}");
        }
        let mut invalid_utf8 = text.clone().into_bytes();
        invalid_utf8.insert(2, 0xff);
        assert_eq!(code(&invalid_utf8), "catalog-malformed");
        let huge = vec![b' '; MAX_ENVELOPE_BYTES + 1];
        let err = verify(&huge, &trusted()).unwrap_err();
        assert!(err.code() == "catalog-malformed" && err.to_string().contains("8 MiB"), "{err}");
    }

    #[test]
    fn another_contract_is_named_even_when_its_shape_differs() {
        for contract in [2, 0, 1_000_000] {
            let bad = format!(r#"{{"format":"capstan-catalog","contract":{contract},"somethingNew":[]}}"#);
            let err = verify(bad.as_bytes(), &trusted()).unwrap_err();
            assert_eq!(err, CatalogError::ContractUnsupported { contract: contract.to_string() });
        }
        assert_eq!(code(with(&signed(), "contract", 1.5.into()).as_bytes()), "catalog-contract-unsupported");
    }

    #[test]
    fn digest_signature_and_trust_are_refused_by_name() {
        let text = signed();
        let envelope: Envelope = serde_json::from_str(&text).unwrap();
        // a changed payload with the old digest
        let mut payload = B64.decode(&envelope.payload).unwrap();
        let at = payload.iter().position(|b| *b == b'w').unwrap();
        payload[at] = b'W';
        let changed = with(&text, "payload", B64.encode(&payload).into());
        assert_eq!(code(changed.as_bytes()), "catalog-digest-mismatch");
        // … and with its digest recomputed: the signature no longer covers it
        let rehashed = with(&changed, "digest", hex::encode(Sha256::digest(&payload)).into());
        assert_eq!(code(rehashed.as_bytes()), "catalog-signature-invalid");
        // another revision, another key, another signature
        assert_eq!(code(with(&text, "revision", 43.into()).as_bytes()), "catalog-signature-invalid");
        assert_eq!(code(with(&text, "publicKey", PublisherKey::from(&key(9)).to_string().into()).as_bytes()), "catalog-signature-invalid");
        let other = sign(&catalog(), 42, &key(2)).unwrap();
        assert_eq!(code(with(&text, "signature", other.signature.clone().into()).as_bytes()), "catalog-signature-invalid");
        // a valid signature by a key nobody trusts
        let err = verify(other.to_json().as_bytes(), &trusted()).unwrap_err();
        assert_eq!(
            err,
            CatalogError::KeyUntrusted {
                public_key: PublisherKey::from(&key(2)).to_string(),
                fingerprint: PublisherKey::from(&key(2)).fingerprint()
            }
        );
        assert_eq!(verify(text.as_bytes(), &[]).unwrap_err().code(), "catalog-key-untrusted", "no trusted key trusts nothing");
        // a signed payload that is not a valid catalog is refused after the signature checks
        let signed_bad = |payload: &[u8]| {
            let digest = hex::encode(Sha256::digest(payload));
            let signature = key(1).sign(&statement(FORMAT, CONTRACT, 5, &digest));
            Envelope {
                format: FORMAT.into(),
                contract: CONTRACT,
                revision: 5,
                digest,
                public_key: PublisherKey::from(&key(1)).to_string(),
                signature: B64.encode(signature.to_bytes()),
                payload: B64.encode(payload),
            }
            .to_json()
        };
        for (payload, mentions) in [
            (&br#"{"apps":[{"id":"x","name":"X","versions":[]}]}"#[..], "apps[0].versions"),
            (br#"{"apps":[{"id":"x","name":"X","versions":[{"version":"1","template":{"image":"i"}}]}]}"#, "apps[0].versions[0].version"),
            (br#"{"apps":[],"more":1}"#, "more"),
            (b"\xff", "payload"),
        ] {
            let err = verify(signed_bad(payload).as_bytes(), &trusted()).unwrap_err();
            assert!(err.code() == "catalog-malformed" && err.to_string().contains(mentions), "{err}");
        }
        assert!(verify(signed_bad(b"{\"apps\":[]}").as_bytes(), &trusted()).unwrap().apps().is_empty(), "an empty catalog is valid");
    }

    #[test]
    fn every_one_byte_change_is_refused_by_name() {
        let text = signed();
        let bytes = text.as_bytes();
        let named = [
            "catalog-malformed",
            "catalog-contract-unsupported",
            "catalog-digest-mismatch",
            "catalog-signature-invalid",
            "catalog-key-untrusted",
        ];
        let envelope: Envelope = serde_json::from_str(&text).unwrap();
        let region = |needle: &str| {
            let start = text.find(needle).unwrap();
            start..start + needle.len()
        };
        let (payload, digest, key, signature) =
            (region(&envelope.payload), region(&envelope.digest), region(&envelope.public_key), region(&envelope.signature));
        let revision = region("\"revision\":42");
        let mut seen = std::collections::BTreeMap::<&str, usize>::new();
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x20, 0x80] {
                let mut changed = bytes.to_vec();
                changed[i] ^= flip;
                let err = verify(&changed, &trusted()).expect_err(&format!("a change at byte {i} ({flip:#x}) must be refused"));
                assert!(named.contains(&err.code()), "{}", err.code());
                *seen.entry(err.code()).or_default() += 1;
                // where the change lands decides the name, whenever the text still decodes
                if err.code() != "catalog-malformed" {
                    let expected = if payload.contains(&i) || digest.contains(&i) {
                        "catalog-digest-mismatch"
                    } else if key.contains(&i) || signature.contains(&i) || revision.contains(&i) {
                        "catalog-signature-invalid"
                    } else {
                        "catalog-contract-unsupported"
                    };
                    assert_eq!(err.code(), expected, "byte {i} ({flip:#x})");
                }
            }
        }
        // every kind of change was exercised, not just broken JSON
        for code in ["catalog-malformed", "catalog-digest-mismatch", "catalog-signature-invalid"] {
            assert!(seen.get(code).copied().unwrap_or(0) > 0, "{code} was never reached: {seen:?}");
        }
    }

    #[test]
    fn sign_refuses_what_a_reader_would_refuse() {
        assert_eq!(sign(&catalog(), 0, &key(1)).unwrap_err().code(), "catalog-malformed");
        assert_eq!(sign(&catalog(), MAX_REVISION + 1, &key(1)).unwrap_err().code(), "catalog-malformed");
        assert!(sign(&catalog(), MAX_REVISION, &key(1)).is_ok());
        let mut bad = catalog();
        bad.apps.push(app("wiki", &["3.0.0"]));
        let err = sign(&bad, 1, &key(1)).unwrap_err();
        assert!(err.to_string().contains("apps[2].id"), "{err}");
        // a catalog too large for one envelope
        let mut big = Catalog::default();
        for i in 0..MAX_APPS {
            let mut a = app(&format!("app{i}"), &["1.0.0"]);
            a.description = "d".repeat(4096);
            a.versions[0].notes = "n".repeat(4096);
            big.apps.push(a);
        }
        let err = sign(&big, 1, &key(1)).unwrap_err();
        assert!(err.code() == "catalog-malformed" && err.to_string().contains("8 MiB"), "{err}");
    }
}

/// Property tests: [`verify`] reads an envelope fetched from a catalog source, so whatever bytes
/// arrive it answers a verified catalog or a refusal by one of its documented names, never a
/// panic — and it answers a catalog only for exactly what a trusted key signed.
#[cfg(test)]
mod proptests {
    use super::tests::{key, signed, trusted};
    use super::*;
    use crate::model::tests::catalog;
    use capstan_core::testing::{apply, mutation};
    use proptest::prelude::*;
    use proptest::sample::select;

    /// Every refusal `verify` documents.
    const CODES: &[&str] = &[
        "catalog-malformed",
        "catalog-contract-unsupported",
        "catalog-digest-mismatch",
        "catalog-signature-invalid",
        "catalog-key-untrusted",
    ];

    fn kebab(code: &str) -> bool {
        !code.is_empty()
            && !code.starts_with('-')
            && !code.ends_with('-')
            && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    /// Parse and verify `bytes` against [`trusted`]: a refusal carries a documented code; what
    /// verifies is a valid catalog signed by a trusted key.
    fn check(bytes: &[u8]) -> Result<Option<Verified>, TestCaseError> {
        if let Err(err) = Envelope::parse(bytes) {
            prop_assert!(["catalog-malformed", "catalog-contract-unsupported"].contains(&err.code()), "parse: {}", err.code());
        }
        match verify(bytes, &trusted()) {
            Ok(verified) => {
                prop_assert!(verified.catalog().validate().is_ok());
                prop_assert!(trusted().contains(verified.signer()));
                Ok(Some(verified))
            }
            Err(err) => {
                prop_assert!(kebab(err.code()), "code {:?} is not kebab-case", err.code());
                prop_assert!(CODES.contains(&err.code()), "undocumented code {:?}: {}", err.code(), err);
                prop_assert!(!err.to_string().is_empty() && err.data().is_object());
                Ok(None)
            }
        }
    }

    /// The envelope of `payload`, signed (validly) by `key(1)`, a trusted key.
    fn envelope_of(payload: &[u8]) -> String {
        let digest = hex::encode(Sha256::digest(payload));
        let signature = key(1).sign(&statement(FORMAT, CONTRACT, 7, &digest));
        Envelope {
            format: FORMAT.into(),
            contract: CONTRACT,
            revision: 7,
            digest,
            public_key: PublisherKey::from(&key(1)).to_string(),
            signature: B64.encode(signature.to_bytes()),
            payload: B64.encode(payload),
        }
        .to_json()
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
            "\\PC{0,20}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-zA-Z]{0,8}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A value for an envelope field: any JSON, or text close to what the field holds.
    fn field_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            json_value(),
            prop::collection::vec(any::<u8>(), 0..100).prop_map(|b| Value::from(B64.encode(b))),
            prop::collection::vec(any::<u8>(), 32).prop_map(|b| Value::from(hex::encode(b))),
            any::<u8>().prop_map(|seed| Value::from(PublisherKey::from(&key(seed)).to_string())),
            select(vec![Value::from(FORMAT), Value::from(CONTRACT), Value::from(MAX_REVISION), Value::from(0), Value::from(42)]),
        ]
    }

    /// Bytes a source might serve: anything, any text, or deeply nested JSON.
    fn served_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            "\\PC{0,400}".prop_map(String::into_bytes),
            (1usize..4096, select(vec!["[", "{\"a\":", "{\"format\":"])).prop_map(|(n, open)| open.repeat(n).into_bytes()),
            json_value().prop_map(|v| v.to_string().into_bytes()),
        ]
    }

    const FIELDS: [&str; 8] = ["format", "contract", "revision", "digest", "publicKey", "signature", "payload", "extra"];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever a source serves is refused by name.
        #[test]
        fn served_bytes_are_refused_by_name(bytes in served_bytes()) {
            prop_assert!(check(&bytes)?.is_none());
        }

        /// An envelope whose fields are each kept, dropped or replaced by any value verifies only
        /// as the very catalog signed; anything else is refused by name.
        #[test]
        fn envelope_fields_of_any_value_are_refused_by_name(
            changes in prop::collection::vec(prop::option::weighted(0.3, prop::option::of(field_value())), FIELDS.len()),
        ) {
            let original = verify(signed().as_bytes(), &trusted()).unwrap();
            let mut envelope: Value = serde_json::from_str(&signed()).unwrap();
            for (field, change) in FIELDS.iter().zip(&changes) {
                match change {
                    None => {}
                    Some(None) => {
                        envelope.as_object_mut().unwrap().remove(*field);
                    }
                    Some(Some(value)) => envelope[*field] = value.clone(),
                }
            }
            if let Some(verified) = check(envelope.to_string().as_bytes())? {
                prop_assert!(verified.same_as(&original) && verified.catalog() == original.catalog());
            }
        }

        /// A few changes anywhere in a signed envelope's text are refused by name, unless they
        /// leave the same signed catalog (insignificant whitespace).
        #[test]
        fn a_changed_envelope_is_refused_or_the_same(mutations in prop::collection::vec(mutation(), 1..4)) {
            let text = signed();
            let original = verify(text.as_bytes(), &trusted()).unwrap();
            let mut bytes = text.into_bytes();
            for m in &mutations {
                apply(&mut bytes, m);
            }
            if let Some(verified) = check(&bytes)? {
                prop_assert!(verified.same_as(&original) && verified.catalog() == original.catalog());
            }
        }

        /// Any payload bytes, validly signed by a trusted key: a valid catalog, or refused
        /// `catalog-malformed` (the payload is checked after the signature).
        #[test]
        fn a_signed_payload_of_any_bytes_is_a_valid_catalog_or_malformed(
            payload in prop_oneof![
                served_bytes(),
                prop::collection::vec(mutation(), 1..4).prop_map(|mutations| {
                    let mut payload = serde_json::to_vec(&catalog()).unwrap();
                    for m in &mutations {
                        apply(&mut payload, m);
                    }
                    payload
                }),
            ],
        ) {
            match verify(envelope_of(&payload).as_bytes(), &trusted()) {
                Ok(verified) => prop_assert!(verified.catalog().validate().is_ok()),
                Err(err) => prop_assert_eq!(err.code(), "catalog-malformed", "{}", err),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Signed at any revision by any key, an envelope verifies under that key as the same
        /// catalog and revision; under no trusted key it is untrusted; at another revision its
        /// signature fails.
        #[test]
        fn signed_envelopes_round_trip(revision in 1..=MAX_REVISION, other in 0..=MAX_REVISION + 1, seed in any::<u8>()) {
            let envelope = sign(&catalog(), revision, &key(seed)).unwrap();
            let text = envelope.to_json();
            let signer = PublisherKey::from(&key(seed));
            let verified = verify(text.as_bytes(), std::slice::from_ref(&signer)).unwrap();
            prop_assert_eq!(verified.revision(), revision);
            prop_assert_eq!(verified.catalog(), &catalog());
            prop_assert_eq!(verified.signer(), &signer);
            prop_assert_eq!(verified.envelope(), &envelope);
            prop_assert_eq!(verify(text.as_bytes(), &[]).unwrap_err().code(), "catalog-key-untrusted");

            let mut changed: Value = serde_json::from_str(&text).unwrap();
            changed["revision"] = other.into();
            let result = verify(changed.to_string().as_bytes(), std::slice::from_ref(&signer));
            match result {
                Ok(again) => prop_assert!(other == revision && again.same_as(&verified)),
                Err(err) if other == 0 || other > MAX_REVISION => prop_assert_eq!(err.code(), "catalog-malformed"),
                Err(err) => prop_assert_eq!(err.code(), "catalog-signature-invalid"),
            }
        }
    }
}
