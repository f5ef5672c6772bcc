//! The keyring: key-encryption keys (KEKs) and the X25519 ingress recipient, in one private
//! JSON file the operator mounts (`CAPSTAN_KEYRING_PATH`).
//!
//! ```json
//! {"version":1,"activeKekId":"kek-…","keks":{"kek-…":"<32 bytes, base64>"},
//!  "ingress":{"id":"ingress-…","privateKey":"<base64>","publicKey":"<base64>"}}
//! ```
//!
//! Key material never leaves this module except through sealing: nothing here implements
//! `Debug` or `Serialize` for keys, and reports carry ids and fingerprints only.

use capstan_core::private_file;
pub mod seal;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use capstan_core::refusal::{Refusal, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use zeroize::{Zeroize, Zeroizing};

/// The keyring file format version this build reads and writes (`"version"` in the file).
pub const KEYRING_VERSION: u32 = 1;

/// A 256-bit key-encryption key, wiped when dropped.
pub struct Kek(Zeroizing<[u8; 32]>);

impl Kek {
    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// A key derived from one KEK, with that KEK's id (see [`Keyring::derived_keys`]).
pub type DerivedKey = (String, Zeroizing<[u8; 32]>);

/// A loaded keyring: its KEKs (one of them active for sealing) and the ingress X25519 key pair.
pub struct Keyring {
    active_kek_id: String,
    keks: BTreeMap<String, Kek>,
    ingress_id: String,
    ingress_secret: x25519_dalek::StaticSecret,
    ingress_public: x25519_dalek::PublicKey,
}

/// Ids only: a keyring printed by mistake shows no key.
impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("active_kek_id", &self.active_kek_id)
            .field("kek_ids", &self.keks.keys().collect::<Vec<_>>())
            .field("ingress_id", &self.ingress_id)
            .finish_non_exhaustive()
    }
}

/// The on-disk shape. Key strings are wiped after parsing.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct KeyringFile {
    version: u32,
    active_kek_id: String,
    keks: BTreeMap<String, String>,
    ingress: IngressFile,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct IngressFile {
    id: String,
    private_key: String,
    public_key: String,
}

impl Drop for KeyringFile {
    fn drop(&mut self) {
        for value in self.keks.values_mut() {
            value.zeroize();
        }
        self.ingress.private_key.zeroize();
    }
}

/// What `keyring check` and status output may show: ids and fingerprints, never keys.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeyringReport {
    /// The id of the KEK new values are sealed under.
    pub active_kek_id: String,
    /// Every KEK the keyring holds, in id order.
    pub keks: Vec<KeyReport>,
    /// The ingress key pair: its id and the fingerprint of its public key.
    pub ingress: KeyReport,
}

/// One key as reports show it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeyReport {
    /// The key's id.
    pub id: String,
    /// `sha256:` and 32 hex digits of a domain-separated SHA-256 of the key (the public key, for
    /// ingress), enough to tell keys apart without revealing them.
    pub fingerprint: String,
}

fn invalid(what: impl Into<String>) -> Refusal {
    let what = what.into();
    Refusal::new("keyring-invalid", format!("the keyring is not valid: {what}")).with_data(json!({ "reason": what }))
}

/// Ids are safe identifiers: letters, digits, `-`, `_`, `.`; 1 to 64 characters.
pub fn valid_key_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn fingerprint(domain: &str, bytes: &[u8]) -> String {
    let digest = Sha256::new().chain_update(domain.as_bytes()).chain_update([0u8]).chain_update(bytes).finalize();
    format!("sha256:{}", &hex::encode(digest)[..32])
}

fn decode_32(what: &str, text: &str) -> Result<Zeroizing<[u8; 32]>> {
    let bytes = Zeroizing::new(B64.decode(text.trim()).map_err(|_| invalid(format!("{what} is not base64")))?);
    let array: [u8; 32] = bytes.as_slice().try_into().map_err(|_| invalid(format!("{what} must be 32 bytes, not {}", bytes.len())))?;
    Ok(Zeroizing::new(array))
}

fn random_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

impl Keyring {
    /// A fresh keyring: one KEK and one ingress key pair from the operating system's CSPRNG.
    pub fn generate(kek_id: Option<&str>, ingress_id: Option<&str>) -> Result<Self> {
        let kek_id = kek_id.map(str::to_string).unwrap_or_else(|| random_id("kek"));
        let ingress_id = ingress_id.map(str::to_string).unwrap_or_else(|| random_id("ingress"));
        for id in [&kek_id, &ingress_id] {
            if !valid_key_id(id) {
                return Err(Refusal::invalid_request(format!("key id {id:?} must be 1 to 64 of A-Z a-z 0-9 - _ .")));
            }
        }
        let mut keks = BTreeMap::new();
        keks.insert(kek_id.clone(), Kek(Zeroizing::new(rand::random())));
        let secret = x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>());
        let public = x25519_dalek::PublicKey::from(&secret);
        Ok(Keyring { active_kek_id: kek_id, keks, ingress_id, ingress_secret: secret, ingress_public: public })
    }

    /// Parse and validate a keyring file's content, naming what is wrong.
    pub fn parse(content: &[u8]) -> Result<Self> {
        let file: KeyringFile = serde_json::from_slice(content).map_err(|e| {
            // serde's message names fields and types, never values of this shape
            invalid(format!("{} (line {}, column {})", classify(&e), e.line(), e.column()))
        })?;
        if file.version != KEYRING_VERSION {
            return Err(invalid(format!("version {} is not supported (expected {KEYRING_VERSION})", file.version)));
        }
        if file.keks.is_empty() {
            return Err(invalid("it holds no KEK"));
        }
        let mut keks = BTreeMap::new();
        for (id, value) in &file.keks {
            if !valid_key_id(id) {
                return Err(invalid(format!("KEK id {id:?} is not a safe identifier")));
            }
            keks.insert(id.clone(), Kek(decode_32(&format!("KEK {id}"), value)?));
        }
        if !keks.contains_key(&file.active_kek_id) {
            return Err(invalid(format!("the active KEK {:?} is not among its KEKs", file.active_kek_id)));
        }
        if !valid_key_id(&file.ingress.id) {
            return Err(invalid(format!("ingress id {:?} is not a safe identifier", file.ingress.id)));
        }
        let secret = x25519_dalek::StaticSecret::from(*decode_32("the ingress private key", &file.ingress.private_key)?);
        let public = x25519_dalek::PublicKey::from(&secret);
        let stated = decode_32("the ingress public key", &file.ingress.public_key)?;
        if public.as_bytes() != &*stated {
            return Err(invalid("the ingress public key does not belong to its private key"));
        }
        Ok(Keyring {
            active_kek_id: file.active_kek_id.clone(),
            keks,
            ingress_id: file.ingress.id.clone(),
            ingress_secret: secret,
            ingress_public: public,
        })
    }

    /// The runtime loader `serve` uses: any readable file, validated in full.
    pub fn load(path: &Path) -> Result<Self> {
        let content = Zeroizing::new(std::fs::read(path).map_err(|e| {
            Refusal::new("keyring-invalid", format!("the keyring {} cannot be read: {}", path.display(), e.kind()))
                .with_data(json!({ "reason": "unreadable", "path": path.display().to_string() }))
        })?);
        Self::parse(&content)
    }

    /// The strict loader for CLI inputs (private-file rules), then full validation.
    pub fn load_strict(path: &Path) -> Result<Self> {
        let content = Zeroizing::new(private_file::read_strict(path)?);
        Self::parse(&content)
    }

    /// Serialize for the private writer. The returned buffer is wiped when dropped.
    pub fn to_file_bytes(&self) -> Zeroizing<Vec<u8>> {
        let file = KeyringFile {
            version: KEYRING_VERSION,
            active_kek_id: self.active_kek_id.clone(),
            keks: self.keks.iter().map(|(id, k)| (id.clone(), B64.encode(k.bytes()))).collect(),
            ingress: IngressFile {
                id: self.ingress_id.clone(),
                private_key: B64.encode(self.ingress_secret.to_bytes()),
                public_key: B64.encode(self.ingress_public.as_bytes()),
            },
        };
        let mut text = serde_json::to_vec_pretty(&file).expect("keyring serializes");
        text.push(b'\n');
        Zeroizing::new(text)
    }

    /// Write a new keyring file with the no-clobber private writer.
    pub fn write_new(&self, path: &Path) -> Result<()> {
        private_file::write_new(path, &self.to_file_bytes())
    }

    /// The id of the KEK [`Keyring::seal`] seals under.
    pub fn active_kek_id(&self) -> &str {
        &self.active_kek_id
    }

    /// A 32-byte key for `purpose` derived (HKDF-SHA256) from each KEK, by KEK id, with the
    /// active KEK's id: keys as private as the keyring, which change when it is rotated and
    /// stay derivable while their KEK is kept.
    pub fn derived_keys(&self, purpose: &str) -> (String, Vec<DerivedKey>) {
        let info = format!("capstan {purpose} v1");
        let keys = self
            .keks
            .iter()
            .map(|(id, kek)| {
                let mut key = Zeroizing::new([0u8; 32]);
                hkdf::Hkdf::<sha2::Sha256>::new(None, kek.bytes())
                    .expand(info.as_bytes(), key.as_mut())
                    .expect("32 bytes is a valid HKDF length");
                (id.clone(), key)
            })
            .collect();
        (self.active_kek_id.clone(), keys)
    }

    pub(crate) fn kek(&self, id: &str) -> Option<&Kek> {
        self.keks.get(id)
    }

    /// The id of the ingress key pair.
    pub fn ingress_id(&self) -> &str {
        &self.ingress_id
    }

    /// The ingress recipient's X25519 public key, which senders encrypt to.
    pub fn ingress_public_key(&self) -> &x25519_dalek::PublicKey {
        &self.ingress_public
    }

    /// The X25519 shared secret between the ingress recipient and a sender's ephemeral key
    /// (the secret key itself never leaves the keyring). Wiped when dropped.
    pub fn ingress_agree(&self, ephemeral: &x25519_dalek::PublicKey) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(*self.ingress_secret.diffie_hellman(ephemeral).as_bytes())
    }

    /// This keyring with one more KEK, which becomes the active one (`kek_id`, or a random
    /// id). Every earlier KEK stays, so what they sealed keeps opening.
    pub fn with_new_active_kek(&self, kek_id: Option<&str>) -> Result<Keyring> {
        let id = kek_id.map(str::to_string).unwrap_or_else(|| random_id("kek"));
        if !valid_key_id(&id) {
            return Err(Refusal::invalid_request(format!("key id {id:?} must be 1 to 64 of A-Z a-z 0-9 - _ .")));
        }
        if self.keks.contains_key(&id) {
            return Err(Refusal::new("exists", format!("the keyring already holds a KEK {id:?}")));
        }
        let mut keks: BTreeMap<String, Kek> = self.keks.iter().map(|(k, v)| (k.clone(), Kek(Zeroizing::new(*v.bytes())))).collect();
        keks.insert(id.clone(), Kek(Zeroizing::new(rand::random())));
        Ok(Keyring {
            active_kek_id: id,
            keks,
            ingress_id: self.ingress_id.clone(),
            ingress_secret: self.ingress_secret.clone(),
            ingress_public: self.ingress_public,
        })
    }

    /// Ids and fingerprints of every key, safe to print.
    pub fn report(&self) -> KeyringReport {
        KeyringReport {
            active_kek_id: self.active_kek_id.clone(),
            keks: self
                .keks
                .iter()
                .map(|(id, k)| KeyReport { id: id.clone(), fingerprint: fingerprint("capstan-kek", k.bytes()) })
                .collect(),
            ingress: KeyReport { id: self.ingress_id.clone(), fingerprint: fingerprint("capstan-ingress", self.ingress_public.as_bytes()) },
        }
    }
}

/// Describe a JSON error without quoting the input (which holds key material).
fn classify(e: &serde_json::Error) -> String {
    let text = e.to_string();
    // serde_json messages quote field names and may quote string values for invalid types;
    // keep only the part before any value and name the category
    if text.starts_with("missing field") {
        // the name missing is one of the format's own
        text.split(" at line").next().unwrap_or("malformed").to_string()
    } else if text.starts_with("unknown field") {
        // the unknown name is the input's own text, which a cut file can join to key material:
        // only serde's list of the names expected (the format's own) is kept
        let text = text.rsplit_once(" at line").map_or(text.as_str(), |(message, _)| message);
        match text.rsplit_once(", expected ") {
            Some((_, expected)) if expected.bytes().all(|b| b.is_ascii_alphabetic() || b" `,".contains(&b)) => {
                format!("an unknown field, expected {expected}")
            }
            _ => "an unknown field".into(),
        }
    } else {
        match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "it is not valid JSON".into(),
            _ => "a field has the wrong type".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keyrings_round_trip_through_the_file_format() {
        let ring = Keyring::generate(Some("kek-a"), Some("in-a")).unwrap();
        let bytes = ring.to_file_bytes();
        let back = Keyring::parse(&bytes).unwrap();
        assert_eq!(back.report(), ring.report());
        assert_eq!(back.active_kek_id(), "kek-a");
        let other = Keyring::generate(None, None).unwrap();
        assert_ne!(other.report().keks[0].fingerprint, ring.report().keks[0].fingerprint);
        assert!(valid_key_id(other.active_kek_id()));
    }

    #[test]
    fn reports_never_carry_key_material() {
        let ring = Keyring::generate(None, None).unwrap();
        let report = serde_json::to_string(&ring.report()).unwrap() + &format!("{ring:?}");
        let file: serde_json::Value = serde_json::from_slice(&ring.to_file_bytes()).unwrap();
        let kek = file["keks"][ring.active_kek_id()].as_str().unwrap();
        let private = file["ingress"]["privateKey"].as_str().unwrap();
        assert!(!report.contains(kek) && !report.contains(private));
    }

    fn mutate(f: impl FnOnce(&mut serde_json::Value)) -> Refusal {
        let ring = Keyring::generate(Some("k1"), Some("i1")).unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&ring.to_file_bytes()).unwrap();
        f(&mut v);
        match Keyring::parse(v.to_string().as_bytes()) {
            Ok(_) => panic!("expected keyring-invalid"),
            Err(e) => e,
        }
    }

    #[test]
    fn invalid_keyrings_are_refused_naming_what_is_wrong() {
        let cases: Vec<(Refusal, &str)> = vec![
            (mutate(|v| v["activeKekId"] = json!("k2")), "active KEK"),
            (mutate(|v| v["keks"]["k1"] = json!("c2hvcnQ=")), "32 bytes"),
            (mutate(|v| v["keks"]["k1"] = json!("***")), "base64"),
            (mutate(|v| v["keks"] = json!({})), "no KEK"),
            (mutate(|v| v["version"] = json!(7)), "version"),
            (mutate(|v| v["ingress"]["publicKey"] = json!(B64.encode([7u8; 32]))), "does not belong"),
            (mutate(|v| v.as_object_mut().unwrap().remove("ingress").map(|_| ()).unwrap()), "missing field"),
            (mutate(|v| v["extra"] = json!(1)), "unknown field"),
            (mutate(|v| v["keks"] = json!({"bad id!": B64.encode([1u8; 32])})), "safe identifier"),
        ];
        for (err, expected) in cases {
            assert_eq!(err.code, "keyring-invalid");
            assert!(err.message.contains(expected), "{:?} should mention {expected:?}", err.message);
        }
        assert!(Keyring::parse(b"not json").unwrap_err().message.contains("not valid JSON"));
    }

    #[test]
    fn an_unknown_field_cut_into_key_material_is_refused_without_echoing_it() {
        let ring = Keyring::generate(Some("kek-a"), Some("in-a")).unwrap();
        let text = String::from_utf8(ring.to_file_bytes().to_vec()).unwrap();
        let file: serde_json::Value = serde_json::from_str(&text).unwrap();
        let kek = file["keks"]["kek-a"].as_str().unwrap();
        // a chunk cut from `"act|iveKekId": …, "keks": { "kek-a": "` leaves a field named
        // `act` and the KEK
        let cut = text.find("\"activeKekId\"").unwrap() + 4;
        let resumed = text.find(kek).unwrap();
        let err = Keyring::parse(format!("{}{}", &text[..cut], &text[resumed..]).as_bytes()).unwrap_err();
        assert_eq!(err.code, "keyring-invalid");
        assert!(err.message.contains("unknown field, expected one of `version`"), "{}", err.message);
        let shown = format!("{} {:?}", err.message, err.data);
        assert!(kek.as_bytes().windows(8).all(|w| !shown.contains(std::str::from_utf8(w).unwrap())), "{shown}");
    }

    #[test]
    fn a_wrong_typed_key_is_refused_without_echoing_it() {
        let err = mutate(|v| v["ingress"]["privateKey"] = json!(12345678901234u64));
        assert!(!err.message.contains("12345678901234"), "{}", err.message);
    }
}

/// Property tests: [`Keyring::parse`] reads a file an operator mounts (or a CLI input), so
/// whatever it is given it answers a valid keyring or `keyring-invalid` naming what is wrong,
/// never a panic — and its refusals never quote the key material.
#[cfg(test)]
mod proptests {
    use super::*;
    use capstan_core::testing::{apply, mutation};
    use proptest::prelude::*;
    use proptest::sample::select;
    use serde_json::Value;

    fn kebab(code: &str) -> bool {
        !code.is_empty()
            && !code.starts_with('-')
            && !code.ends_with('-')
            && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    /// Parse `content`: a refusal is `keyring-invalid` and quotes none of `secrets` (8 characters
    /// of any of them are too many); a keyring keeps its rules and survives its own file format.
    fn check(content: &[u8], secrets: &[String]) -> Result<Option<Keyring>, TestCaseError> {
        match Keyring::parse(content) {
            Ok(ring) => {
                let report = ring.report();
                prop_assert!(report.keks.iter().any(|k| k.id == report.active_kek_id));
                prop_assert!(report.keks.iter().all(|k| valid_key_id(&k.id)) && valid_key_id(&report.ingress.id));
                let again = Keyring::parse(&ring.to_file_bytes()).unwrap();
                prop_assert_eq!(again.report(), report);
                Ok(Some(ring))
            }
            Err(err) => {
                prop_assert!(kebab(&err.code));
                prop_assert_eq!(err.code.as_ref(), "keyring-invalid", "{}", err.message);
                let shown = format!("{} {:?} {:?}", err.message, err.data, err.detail);
                for secret in secrets {
                    for window in secret.as_bytes().windows(8) {
                        let window = std::str::from_utf8(window).unwrap();
                        prop_assert!(!shown.contains(window), "the refusal quotes key material {:?}: {}", window, shown);
                    }
                }
                Ok(None)
            }
        }
    }

    /// A keyring file with two KEKs, and the base64 texts of its three secrets.
    fn valid_file() -> (Vec<u8>, Vec<String>) {
        let ring = Keyring::generate(Some("kek-a"), Some("ingress-a")).unwrap().with_new_active_kek(Some("kek-b")).unwrap();
        let bytes = ring.to_file_bytes().to_vec();
        let file: Value = serde_json::from_slice(&bytes).unwrap();
        let secrets = vec![
            file["keks"]["kek-a"].as_str().unwrap().to_string(),
            file["keks"]["kek-b"].as_str().unwrap().to_string(),
            file["ingress"]["privateKey"].as_str().unwrap().to_string(),
        ];
        (bytes, secrets)
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
            "\\PC{0,20}".prop_map(Value::from),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| Value::from(B64.encode(b))),
            select(vec!["kek-a", "kek-b", "ingress-a", "bad id!", ""]).prop_map(Value::from),
        ];
        leaf.prop_recursive(2, 12, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-zA-Z-]{0,10}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Where in a keyring file a value may be changed.
    const PLACES: [&[&str]; 9] = [
        &["version"],
        &["activeKekId"],
        &["keks"],
        &["keks", "kek-a"],
        &["ingress"],
        &["ingress", "id"],
        &["ingress", "privateKey"],
        &["ingress", "publicKey"],
        &["extra"],
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary bytes and text are refused `keyring-invalid`.
        #[test]
        fn arbitrary_bytes_are_refused(bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..1024),
            "\\PC{0,400}".prop_map(String::into_bytes),
            json_value().prop_map(|v| v.to_string().into_bytes()),
        ]) {
            prop_assert!(check(&bytes, &[])?.is_none());
        }

        /// A valid file with values replaced or removed anywhere in its shape: a valid keyring or
        /// `keyring-invalid`, never quoting the keys left in it.
        #[test]
        fn a_reshaped_file_is_valid_or_refused_without_quoting_keys(
            changes in prop::collection::vec((select(PLACES.to_vec()), prop::option::of(json_value())), 1..4),
        ) {
            let (bytes, secrets) = valid_file();
            let mut file: Value = serde_json::from_slice(&bytes).unwrap();
            for (place, value) in &changes {
                let (last, parents) = place.split_last().unwrap();
                let mut at = &mut file;
                for p in parents {
                    at = &mut at[*p];
                }
                match (value, at.as_object_mut()) {
                    (Some(value), Some(object)) => {
                        object.insert(last.to_string(), value.clone());
                    }
                    (None, Some(object)) => {
                        object.remove(*last);
                    }
                    _ => {}
                }
            }
            check(file.to_string().as_bytes(), &secrets)?;
        }

        /// A valid file with a few bytes flipped, cut, inserted or removed: a valid keyring or
        /// `keyring-invalid`, never quoting the keys.
        #[test]
        fn a_changed_file_is_valid_or_refused_without_quoting_keys(mutations in prop::collection::vec(mutation(), 1..4)) {
            let (mut bytes, secrets) = valid_file();
            for m in &mutations {
                apply(&mut bytes, m);
            }
            check(&bytes, &secrets)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A keyring with any valid ids, rotated, reads back from its file as itself: the same
        /// ids and fingerprints, and what its KEKs sealed still opens.
        #[test]
        fn keyrings_round_trip_through_their_file(
            kek in "[A-Za-z0-9._-]{1,64}",
            next in "[A-Za-z0-9._-]{1,64}",
            ingress in "[A-Za-z0-9._-]{1,64}",
            plaintext in prop::collection::vec(any::<u8>(), 0..256),
        ) {
            let ring = Keyring::generate(Some(&kek), Some(&ingress)).unwrap();
            let context = seal::Context::new("proptest");
            let sealed = ring.seal(&context, &plaintext).unwrap();
            let ring = match ring.with_new_active_kek(Some(&next)) {
                Ok(rotated) => rotated,
                Err(err) => {
                    prop_assert!(next == kek && err.code == "exists");
                    ring
                }
            };
            let back = Keyring::parse(&ring.to_file_bytes()).unwrap();
            prop_assert_eq!(back.report(), ring.report());
            prop_assert_eq!(back.active_kek_id(), next.as_str());
            prop_assert_eq!(back.ingress_id(), ingress.as_str());
            prop_assert_eq!(back.ingress_public_key(), ring.ingress_public_key());
            prop_assert_eq!(&**back.open(&context, &sealed).unwrap(), &plaintext[..]);
        }
    }
}
