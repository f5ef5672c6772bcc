//! Sealed input: how a value reaches Capstan without ever travelling in the clear, even inside
//! TLS logs or proxies. The client seals it to the keyring's X25519 ingress recipient with an
//! ephemeral key (X25519, HKDF-SHA256, AES-256-GCM) and binds the request's target into the
//! authenticated data, so a sealed value opens only for the request it was made for.

use capstan_core::refusal::{Refusal, Result};
use capstan_keyring::Keyring;
use serde_json::json;
use zeroize::Zeroizing;

pub use capstan_core::sealed::{PROFILE, SealedInput, open_as, seal_to, target};

/// Open a sealed value sent to the keyring's ingress recipient for `target`. The plaintext is
/// wiped when dropped.
pub fn open(keyring: &Keyring, target: &str, input: &SealedInput) -> Result<Zeroizing<Vec<u8>>> {
    if input.recipient_id != keyring.ingress_id() {
        return Err(Refusal::new(
            "sealed-input-recipient-unknown",
            "the value was sealed to another recipient: fetch secrets.getIngressRecipient and seal it again",
        )
        .with_data(json!({ "recipientId": keyring.ingress_id() })));
    }
    capstan_core::sealed::open_with(keyring.ingress_public_key(), |ephemeral| keyring.ingress_agree(ephemeral), target, input)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as B64;

    #[test]
    fn a_sealed_value_opens_only_for_its_target_and_recipient() {
        let ring = Keyring::generate(None, None).unwrap();
        let here = target("secrets.create", "service:svc_1", "DB_PASSWORD");
        let sealed = seal_to(ring.ingress_id(), ring.ingress_public_key(), &here, b"hunter2-planted");
        assert!(!serde_json::to_string(&sealed).unwrap().contains("hunter2"));
        assert_eq!(&**open(&ring, &here, &sealed).unwrap(), b"hunter2-planted");
        for elsewhere in [
            target("secrets.create", "service:svc_2", "DB_PASSWORD"),
            target("secrets.create", "service:svc_1", "API_TOKEN"),
            target("secrets.rotate", "service:svc_1", "DB_PASSWORD"),
        ] {
            assert_eq!(open(&ring, &elsewhere, &sealed).unwrap_err().code, "sealed-input-invalid", "{elsewhere}");
        }
        let other = Keyring::generate(None, None).unwrap();
        assert_eq!(open(&other, &here, &sealed).unwrap_err().code, "sealed-input-recipient-unknown");
        let mut tampered = sealed.clone();
        let mut bytes = B64.decode(&tampered.ciphertext).unwrap();
        bytes[0] ^= 1;
        tampered.ciphertext = B64.encode(bytes);
        assert_eq!(open(&ring, &here, &tampered).unwrap_err().code, "sealed-input-invalid");
        let garbage = SealedInput { ephemeral_public_key: "not base64!".into(), ..sealed };
        assert_eq!(open(&ring, &here, &garbage).unwrap_err().code, "sealed-input-invalid");
    }
}

/// Property tests: [`open`] reads a [`SealedInput`] a client sent, so whatever its fields hold it
/// answers the plaintext sealed for this very target or a refusal by one of its two names, never
/// a panic.
#[cfg(test)]
mod proptests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as B64;
    use proptest::prelude::*;
    use proptest::sample::{Index, select};
    use std::sync::OnceLock;

    /// One keyring for every case (generating one is cheap, but a fixed one keeps cases
    /// reproducible apart from the sealing randomness).
    fn ring() -> &'static Keyring {
        static RING: OnceLock<Keyring> = OnceLock::new();
        RING.get_or_init(|| Keyring::generate(Some("kek-p"), Some("ingress-p")).unwrap())
    }

    fn here() -> String {
        target("secrets.create", "service:svc_1", "DB_PASSWORD")
    }

    fn kebab(code: &str) -> bool {
        !code.is_empty()
            && !code.starts_with('-')
            && !code.ends_with('-')
            && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    /// Open `input` for `target`, requiring a refusal to be one of `open`'s two codes.
    fn check(target: &str, input: &SealedInput) -> std::result::Result<Option<Zeroizing<Vec<u8>>>, TestCaseError> {
        match open(ring(), target, input) {
            Ok(plaintext) => Ok(Some(plaintext)),
            Err(err) => {
                prop_assert!(kebab(&err.code));
                prop_assert!(
                    ["sealed-input-invalid", "sealed-input-recipient-unknown"].contains(&err.code.as_ref()),
                    "undocumented code {:?}",
                    err.code
                );
                Ok(None)
            }
        }
    }

    /// Text for a base64 field: base64 of any length, or any text.
    fn field() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..80).prop_map(|b| B64.encode(b)),
            prop::collection::vec(any::<u8>(), 32).prop_map(|b| B64.encode(b)),
            prop::collection::vec(any::<u8>(), 12).prop_map(|b| B64.encode(b)),
            select(vec![B64.encode([0u8; 32]), B64.encode([0xffu8; 32]), "AAAA".into(), "A===".into(), String::new()]),
            "\\PC{0,60}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A sealed input of any field values (a low-order ephemeral key, a short nonce, text that
        /// is not base64, another profile or recipient) is refused by name: none opens.
        #[test]
        fn arbitrary_sealed_inputs_are_refused_by_name(
            profile in prop_oneof![Just(PROFILE.to_string()), "\\PC{0,30}"],
            to_this_ring in any::<bool>(),
            recipient in "\\PC{0,30}",
            ephemeral_public_key in field(),
            nonce in field(),
            ciphertext in field(),
        ) {
            let recipient_id = if to_this_ring { ring().ingress_id().to_string() } else { recipient };
            let input = SealedInput { profile, recipient_id, ephemeral_public_key, nonce, ciphertext };
            prop_assert!(check(&here(), &input)?.is_none(), "forged input opened: {:?}", input);
            let agent = x25519_dalek::StaticSecret::from([7u8; 32]);
            if let Err(err) = open_as(&agent, &here(), &input) {
                prop_assert_eq!(err.code.as_ref(), "sealed-input-invalid");
            } else {
                prop_assert!(false, "forged input opened for an agent: {:?}", input);
            }
        }

        /// Sealed to this ring for a target, any plaintext opens to itself for that target and for
        /// no other.
        #[test]
        fn sealed_values_open_only_for_their_target(
            plaintext in prop::collection::vec(any::<u8>(), 0..512),
            method in "[a-z]{1,8}\\.[a-zA-Z]{1,12}",
            owner in "\\PC{0,24}",
            key in "\\PC{0,24}",
            other in "\\PC{0,24}",
        ) {
            let here = target(&method, &owner, &key);
            let sealed = seal_to(ring().ingress_id(), ring().ingress_public_key(), &here, &plaintext);
            let opened = check(&here, &sealed)?;
            prop_assert_eq!(opened.as_deref().map(|p| &p[..]), Some(&plaintext[..]));
            for elsewhere in [target(&method, &owner, &other), target(&method, &other, &key), target(&other, &owner, &key)] {
                if elsewhere != here {
                    prop_assert!(check(&elsewhere, &sealed)?.is_none());
                }
            }
        }

        /// A sealed value with a few characters of its JSON changed: when it still reads as a
        /// sealed input and differs from the one sent, it is refused by name.
        #[test]
        fn a_changed_sealed_value_never_opens(
            changes in prop::collection::vec((any::<Index>(), prop_oneof![any::<char>(), "[A-Za-z0-9+/=]"
                .prop_map(|s| s.chars().next().unwrap())]), 1..4),
        ) {
            let sealed = seal_to(ring().ingress_id(), ring().ingress_public_key(), &here(), b"hunter2-planted");
            let mut chars: Vec<char> = serde_json::to_string(&sealed).unwrap().chars().collect();
            for (at, c) in &changes {
                let at = at.index(chars.len());
                chars[at] = *c;
            }
            let text: String = chars.into_iter().collect();
            if let Ok(changed) = serde_json::from_str::<SealedInput>(&text) {
                let opened = check(&here(), &changed)?;
                if changed == sealed {
                    prop_assert!(opened.is_some());
                } else {
                    prop_assert!(opened.is_none(), "a changed input opened: {:?}", changed);
                }
            }
        }
    }
}
