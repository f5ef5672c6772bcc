//! Signed node records. A node signs its record with its Ed25519 key each time it writes it;
//! a reader that acts on a record — above all the forwarding of a caller's credentials to the
//! coordinator — verifies the signature, and that the key is the one the node's id was claimed
//! with (`_capstan/identities/<id>.json`, create-only). Someone who can only rewrite a record
//! (say, to point a node's address elsewhere) cannot make it verify.
//!
//! The signature covers the record's JSON without its `signature` field, object keys sorted and
//! compact, after a context line: fields a newer build adds are covered too, and an older
//! reader still verifies them.

use super::NodeRecord;
use super::identity::NodeIdentity;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use capstan_core::refusal::{Refusal, Result};
use serde_json::{Value, json};

/// What every node record signature starts with, so it can never be taken for another message.
const CONTEXT: &[u8] = b"capstan node record v1\n";

/// `value` as compact JSON with every object's keys in byte order.
fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                // a string always serializes
                out.extend(serde_json::to_vec(key).unwrap_or_default());
                out.push(b':');
                canonical(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend(serde_json::to_vec(scalar).unwrap_or_default()),
    }
}

/// The bytes a record's signature covers: the context, then the record without `signature`.
fn signed_message(mut record: Value) -> Vec<u8> {
    if let Value::Object(map) = &mut record {
        map.remove("signature");
    }
    let mut message = CONTEXT.to_vec();
    canonical(&record, &mut message);
    message
}

/// `record` signed by `identity` (its `signature` set), ready to store.
pub fn sign(identity: &NodeIdentity, mut record: NodeRecord) -> Result<NodeRecord> {
    record.signature = None;
    let value = serde_json::to_value(&record).map_err(Refusal::internal)?;
    record.signature = Some(B64.encode(identity.sign(&signed_message(value))));
    Ok(record)
}

fn refused(code: &'static str, key: &str, why: &str) -> Refusal {
    Refusal::new(code, format!("the node record {key} {why}")).with_data(json!({ "key": key }))
}

/// Check that the stored `bytes` of a record carry a valid signature by the key in the record
/// (`fleet-record-unsigned`, `fleet-record-signature-invalid`), and decode it.
pub fn verify(key: &str, bytes: &[u8]) -> Result<NodeRecord> {
    let value: Value = serde_json::from_slice(bytes).map_err(|_| refused("fleet-record-invalid", key, "is not JSON"))?;
    let record: NodeRecord =
        serde_json::from_value(value.clone()).map_err(|_| refused("fleet-record-invalid", key, "is not a node record"))?;
    let Some(signature) = &record.signature else {
        return Err(refused("fleet-record-unsigned", key, "is not signed (written by a build before signed records)"));
    };
    if !signature_valid(&record.public_key, &signed_message(value), signature) {
        return Err(refused("fleet-record-signature-invalid", key, "does not carry a valid signature of its node's key"));
    }
    Ok(record)
}

/// Whether `signature` (base64) is a valid Ed25519 signature of `message` by `public_key`
/// (base64), as [`NodeIdentity::sign`] makes one.
pub fn signature_valid(public_key: &str, message: &[u8], signature: &str) -> bool {
    let public: Option<[u8; 32]> = B64.decode(public_key).ok().and_then(|k| k.try_into().ok());
    let signature: Option<[u8; 64]> = B64.decode(signature).ok().and_then(|s| s.try_into().ok());
    let (Some(public), Some(signature)) = (public, signature) else { return false };
    ed25519_dalek::VerifyingKey::from_bytes(&public)
        .is_ok_and(|public| public.verify_strict(message, &ed25519_dalek::Signature::from_bytes(&signature)).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(identity: &NodeIdentity) -> NodeRecord {
        NodeRecord {
            node_id: identity.id.clone(),
            public_key: identity.public_key(),
            addresses: super::super::Addresses { internal: "10.0.0.7".into(), api_port: 8080 },
            labels: [("zone".to_string(), "a".to_string()), ("disk".to_string(), "ssd".to_string())].into(),
            versions: None,
            serves: vec!["api".into()],
            network: Some("lan".into()),
            booted_at: 1,
            heartbeat_at: Some(2),
            draining_at: None,
            signature: None,
        }
    }

    #[test]
    fn a_signed_record_verifies_and_any_change_breaks_it() {
        let dir = tempfile::tempdir().unwrap();
        let (identity, _) = NodeIdentity::load_or_create(dir.path(), Some("n1")).unwrap();
        let signed = sign(&identity, record(&identity)).unwrap();
        let bytes = serde_json::to_vec_pretty(&signed).unwrap();
        assert_eq!(verify("k", &bytes).unwrap().addresses.internal, "10.0.0.7");

        // a field a newer build adds is covered, and an older reader still verifies it
        let mut newer = serde_json::to_value(sign(&identity, record(&identity)).unwrap()).unwrap();
        newer["region"] = json!("eu");
        newer["signature"] = Value::Null;
        let message = signed_message(newer.clone());
        newer["signature"] = json!(B64.encode(identity.sign(&message)));
        assert!(verify("k", &serde_json::to_vec(&newer).unwrap()).is_ok(), "keys in any order, unknown fields covered");

        let mut moved = serde_json::to_value(&signed).unwrap();
        moved["addresses"]["internal"] = json!("203.0.113.9");
        assert_eq!(verify("k", &serde_json::to_vec(&moved).unwrap()).unwrap_err().code, "fleet-record-signature-invalid");
        newer["region"] = json!("us");
        assert_eq!(verify("k", &serde_json::to_vec(&newer).unwrap()).unwrap_err().code, "fleet-record-signature-invalid");

        // another key, put in the record with its own signature, verifies only as that key:
        // the identity claim is what ties a key to the id (checked by the reader that acts)
        let other_dir = tempfile::tempdir().unwrap();
        let (other, _) = NodeIdentity::load_or_create(other_dir.path(), Some("n1")).unwrap();
        let forged = sign(&other, NodeRecord { public_key: identity.public_key(), ..record(&other) }).unwrap();
        assert_eq!(verify("k", &serde_json::to_vec(&forged).unwrap()).unwrap_err().code, "fleet-record-signature-invalid");

        let unsigned = serde_json::to_vec(&record(&identity)).unwrap();
        assert_eq!(verify("k", &unsigned).unwrap_err().code, "fleet-record-unsigned");
        assert_eq!(verify("k", b"{").unwrap_err().code, "fleet-record-invalid");
    }
}
