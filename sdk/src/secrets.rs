//! Secrets within the management scopes the operator approved (capability `secrets:<scope>`;
//! `secrets:mail` covers `mail:<serviceId>`). Values never cross except through [`reveal`],
//! which needs `secrets-reveal:<scope>`.

use crate::Result;
use crate::bindings::capstan::plugin::secrets as wit;

pub use wit::{Generate, Owner, SecretInfo};

impl Generate {
    /// `length` characters of `[A-Za-z0-9]`.
    pub fn alphanumeric(length: u32) -> Self {
        Generate { length, alphabet: "alphanumeric".into() }
    }

    /// `length` lowercase hex digits.
    pub fn hex(length: u32) -> Self {
        Generate { length, alphabet: "hex".into() }
    }

    /// `length` characters of unpadded base64url.
    pub fn base64url(length: u32) -> Self {
        Generate { length, alphabet: "base64url".into() }
    }

    /// `length` printable ASCII characters.
    pub fn printable(length: u32) -> Self {
        Generate { length, alphabet: "printable".into() }
    }
}

/// The secret `key` of `owner` in `scope`, created with a generated value if no active one
/// exists, else the existing one unchanged. Refused `management-scope-mismatch` when another
/// scope manages it.
pub fn ensure(scope: &str, owner: &Owner, key: &str, generate: &Generate) -> Result<SecretInfo> {
    Ok(wit::ensure(scope, owner, key, generate)?)
}

/// Store `value` as the secret `key` of `owner` in `scope` (contract 0.2.3): created when
/// there is none, a new version when the active value differs, unchanged (nothing written) when
/// it is the same, so a manager may put on every pass. A revoked secret becomes active again
/// with the value, managed from `scope` from then on whichever scope revoked it (a key one
/// manager let go passes to the next); another scope's active secret is
/// `management-scope-mismatch`. For values the plugin receives from outside Capstan (a password
/// a gateway issued) or derives; let the host generate what it can ([`ensure`]). Never log it.
pub fn put(scope: &str, owner: &Owner, key: &str, value: &[u8]) -> Result<SecretInfo> {
    Ok(wit::put(scope, owner, key, value)?)
}

/// A new version with a newly generated value.
pub fn rotate(scope: &str, secret_id: &str) -> Result<SecretInfo> {
    Ok(wit::rotate(scope, secret_id)?)
}

/// Revoke the secret `secret_id` in `scope`; its metadata as it now is.
pub fn revoke(scope: &str, secret_id: &str) -> Result<SecretInfo> {
    Ok(wit::revoke(scope, secret_id)?)
}

/// Metadata of every secret in `scope`; never a value.
pub fn list(scope: &str) -> Result<Vec<SecretInfo>> {
    Ok(wit::list(scope)?)
}

/// The active value, for deriving something from it (a DKIM public key, say). Never log it,
/// store it or answer it. Capability `secrets-reveal:<scope>`.
pub fn reveal(scope: &str, secret_id: &str) -> Result<Vec<u8>> {
    Ok(wit::reveal(scope, secret_id)?)
}

/// `text` as a part of a secret's key (`[A-Z0-9_]`): letters and digits in capitals, anything
/// else `_` — `web@acme.example` → `WEB_ACME_EXAMPLE`, as in `MAIL_WEB_ACME_EXAMPLE_SMTP_USER`.
pub fn key_part(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}
