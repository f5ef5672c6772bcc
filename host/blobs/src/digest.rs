//! The exact length and SHA-256 of an object's content, taken as it streams by: what a copy is
//! checked against on the far side, and what a plugin checks a stored object against.

use crate::BlobReader;
use capstan_core::refusal::{Refusal, Result};
use sha2::{Digest, Sha256};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

/// An object's content as length and SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ObjectDigest {
    /// Bytes.
    pub size: u64,
    /// 64 lowercase hex digits.
    pub sha256: String,
}

/// A digest being taken.
#[derive(Debug, Clone, Default)]
pub struct Digesting {
    hasher: Sha256,
    size: u64,
}

impl Digesting {
    /// Count and hash `bytes`.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
    }

    /// The digest of everything passed to [`Self::update`].
    pub fn finish(self) -> ObjectDigest {
        ObjectDigest { size: self.size, sha256: hex::encode(self.hasher.finalize()) }
    }
}

/// Read `reader` to its end: its digest. A failed read is `blobs-unavailable` (retryable).
pub async fn read_digest(mut reader: BlobReader) -> Result<ObjectDigest> {
    let mut digest = Digesting::default();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n =
            reader.read(&mut buf).await.map_err(|e| Refusal::new("blobs-unavailable", "reading a blob failed").retryable().detail(e))?;
        if n == 0 {
            return Ok(digest.finish());
        }
        digest.update(&buf[..n]);
    }
}

/// A reader that digests what is read through it into a shared [`Digesting`] (shared because
/// the reader itself is handed to, and consumed by, whoever stores the bytes).
pub struct DigestReader {
    inner: BlobReader,
    digest: Arc<Mutex<Digesting>>,
}

impl DigestReader {
    /// Digest what `inner` yields into `digest`.
    pub fn new(inner: BlobReader, digest: Arc<Mutex<Digesting>>) -> Self {
        DigestReader { inner, digest }
    }
}

impl AsyncRead for DigestReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled
            && let Ok(mut digest) = self.digest.lock()
        {
            digest.update(&buf.filled()[before..]);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_digest_is_the_length_and_sha256_of_what_went_through() {
        let shared = Arc::new(Mutex::new(Digesting::default()));
        let mut reader = DigestReader::new(Box::pin(std::io::Cursor::new(b"abc".to_vec())), shared.clone());
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        let seen = shared.lock().unwrap().clone().finish();
        // the SHA-256 of "abc" (FIPS 180-2, appendix B.1)
        let abc = ObjectDigest { size: 3, sha256: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into() };
        assert_eq!(seen, abc);
        assert_eq!(read_digest(Box::pin(std::io::Cursor::new(b"abc".to_vec()))).await.unwrap(), abc);
        assert_eq!(read_digest(Box::pin(std::io::Cursor::new(Vec::new()))).await.unwrap().size, 0);
    }
}
