//! The node token: 32 bytes from the operating system's generator, 64 lowercase hex characters
//! on the wire and in the credential file. Only its SHA-256 ever leaves the machine outside an
//! `Authorization` header; its `Debug` and `Display` never show it, and its memory is wiped on drop.

use capstan_core::Refusal;
use rand::TryRngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use std::fmt;
use zeroize::Zeroizing;

/// Bytes of token material.
pub const TOKEN_BYTES: usize = 32;

/// A node token (secret).
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Zeroizing<String>);

impl Token {
    /// Draw fresh material from the operating system's random generator.
    pub fn draw() -> Result<Token, Refusal> {
        let mut bytes = Zeroizing::new([0u8; TOKEN_BYTES]);
        rand::rngs::OsRng
            .try_fill_bytes(bytes.as_mut())
            .map_err(|e| Refusal::new("random-unavailable", "the operating system's random generator failed").detail(e))?;
        Ok(Token(Zeroizing::new(hex::encode(bytes.as_ref()))))
    }

    /// The token as it is kept: 64 lowercase hex characters; `None` for anything else.
    pub fn parse(text: &str) -> Option<Token> {
        let ok = text.len() == TOKEN_BYTES * 2 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| Token(Zeroizing::new(text.to_string())))
    }

    /// The SHA-256 of the token's wire form (lowercase hex): what the host stores and compares.
    pub fn sha256_hex(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }

    /// The value of the `Authorization` header.
    pub fn bearer(&self) -> Zeroizing<String> {
        Zeroizing::new(format!("Bearer {}", self.0.as_str()))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Serialize for Token {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0.as_str())
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Zeroizing::new(String::deserialize(deserializer)?);
        // the message names the rule, never the value
        Token::parse(&text).ok_or_else(|| serde::de::Error::custom("a token is 64 lowercase hex characters"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drawn_tokens_are_64_hex_and_distinct() {
        let a = Token::draw().unwrap();
        let b = Token::draw().unwrap();
        assert_ne!(a, b);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json.len(), 66);
        let back: Token = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
        assert_eq!(a.sha256_hex().len(), 64);
        assert_ne!(a.sha256_hex(), json.trim_matches('"'));
    }

    #[test]
    fn the_hash_is_sha256_of_the_hex_form() {
        let token = Token::parse(&"ab".repeat(32)).unwrap();
        let expected = hex::encode(Sha256::digest("ab".repeat(32).as_bytes()));
        assert_eq!(token.sha256_hex(), expected);
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let token = Token::draw().unwrap();
        let secret = serde_json::to_value(&token).unwrap().as_str().unwrap().to_string();
        let debug = format!("{token:?} {token:#?}");
        assert!(!debug.contains(&secret), "{debug}");
        assert!(debug.contains("redacted"));
    }

    #[test]
    fn malformed_tokens_are_refused_without_echoing_them() {
        assert!(Token::parse("AB".repeat(32).as_str()).is_none(), "uppercase is not the wire form");
        assert!(Token::parse("ab").is_none());
        let err = serde_json::from_str::<Token>("\"zzsecretzz\"").unwrap_err().to_string();
        assert!(!err.contains("zzsecretzz"), "{err}");
    }
}
