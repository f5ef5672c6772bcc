//! Signatures by Ed25519 keys the host keeps for the plugin (capability `sign`). Each named key
//! is created on first use and sealed under the host's keyring; the plugin never sees it.

use crate::bindings::capstan::plugin::sign as wit;
use crate::{Refusal, Result};

/// The Ed25519 signature of `message` under the plugin's key `key_name`.
pub fn sign(key_name: &str, message: &[u8]) -> Result<[u8; 64]> {
    exact(wit::sign(key_name, message)?, "signature")
}

/// The Ed25519 public key of `key_name`.
pub fn public_key(key_name: &str) -> Result<[u8; 32]> {
    exact(wit::public_key(key_name)?, "public key")
}

fn exact<const N: usize>(bytes: Vec<u8>, what: &str) -> Result<[u8; N]> {
    let len = bytes.len();
    bytes.try_into().map_err(|_| Refusal::internal(format!("the host answered a {what} of {len} bytes, not {N}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn lengths_are_checked() {
        assert_eq!(super::exact::<2>(vec![1, 2], "x").unwrap(), [1, 2]);
        assert_eq!(super::exact::<2>(vec![1], "x").unwrap_err().code(), "internal");
    }
}
