//! Objects under the plugin's own prefix (capability `blobs`). Keys are relative paths of
//! `[A-Za-z0-9._-]` segments joined by `/`. Bodies stream through `std::io`.
//!
//! ```no_run
//! use capstan_sdk::blobs::{self, BlobWriter, PutMode};
//! use std::io::{Read, Write};
//!
//! # fn demo() -> capstan_sdk::Result<()> {
//! let mut writer = BlobWriter::new("exports/2024.json", PutMode::Overwrite);
//! writer.write_all(b"{\"notes\": []}")?;
//! let info = writer.finish()?;
//!
//! if let Some((info, mut reader)) = blobs::open("exports/2024.json")? {
//!     let mut text = String::new();
//!     reader.read_to_string(&mut text)?;
//! }
//! # Ok(()) }
//! ```

use crate::Result;
use crate::bindings::capstan::plugin::blobs as wit;
use std::io;

pub use wit::{BlobInfo, BlobPage, PutMode};

/// The largest chunk that crosses to the host in one call.
const CHUNK: usize = 1 << 20;
/// How much a writer gathers before passing it on.
const BUFFER: usize = 256 << 10;

/// An object being written; nothing is visible until [`BlobWriter::finish`]. Dropping it
/// unfinished stores nothing.
#[derive(Debug)]
pub struct BlobWriter {
    inner: wit::BlobWriter,
    buffer: Vec<u8>,
}

impl BlobWriter {
    /// Start writing `key`; `mode` says when the write may happen (checked by `finish`).
    pub fn new(key: &str, mode: PutMode) -> Self {
        BlobWriter { inner: wit::BlobWriter::new(key, &mode), buffer: Vec::new() }
    }

    fn send_buffer(&mut self) -> Result<()> {
        for chunk in self.buffer.chunks(CHUNK) {
            self.inner.write(chunk)?;
        }
        self.buffer.clear();
        Ok(())
    }

    /// Store what was written. Refused `blob-too-large` past the host's limit, `exists` (for
    /// [`PutMode::CreateOnly`]) or `conflict` (for [`PutMode::IfMatch`]).
    pub fn finish(mut self) -> Result<BlobInfo> {
        self.send_buffer()?;
        Ok(self.inner.finish()?)
    }
}

impl io::Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.buffer.len() + buf.len() > BUFFER {
            self.send_buffer()?;
        }
        if buf.len() >= BUFFER {
            for chunk in buf.chunks(CHUNK) {
                self.inner.write(chunk).map_err(crate::Refusal::from)?;
            }
        } else {
            self.buffer.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(self.send_buffer()?)
    }
}

/// An object being read, in chunks of up to 1 MiB.
#[derive(Debug)]
pub struct BlobReader {
    inner: wit::BlobReader,
    chunk: Vec<u8>,
    at: usize,
    done: bool,
}

impl io::Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        while self.at == self.chunk.len() {
            if self.done {
                return Ok(0);
            }
            let want = u32::try_from(buf.len().clamp(64 << 10, CHUNK)).unwrap_or(CHUNK as u32);
            self.chunk = self.inner.read(want).map_err(crate::Refusal::from)?;
            self.at = 0;
            self.done = self.chunk.is_empty();
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The object at `key` with a reader of its content, or `None`.
pub fn open(key: &str) -> Result<Option<(BlobInfo, BlobReader)>> {
    Ok(wit::open(key)?.map(|(info, inner)| (info, BlobReader { inner, chunk: Vec::new(), at: 0, done: false })))
}

/// The whole object at `key`, or `None`.
pub fn get(key: &str) -> Result<Option<Vec<u8>>> {
    let Some((info, mut reader)) = open(key)? else { return Ok(None) };
    let mut bytes = Vec::with_capacity(usize::try_from(info.size).unwrap_or(0).min(16 << 20));
    io::Read::read_to_end(&mut reader, &mut bytes)?;
    Ok(Some(bytes))
}

/// Store `bytes` at `key` in one go.
pub fn put(key: &str, bytes: &[u8], mode: PutMode) -> Result<BlobInfo> {
    let mut writer = BlobWriter::new(key, mode);
    io::Write::write_all(&mut writer, bytes)?;
    writer.finish()
}

/// Metadata of `key`, or `None`.
pub fn head(key: &str) -> Result<Option<BlobInfo>> {
    Ok(wit::head(key)?)
}

/// Objects whose keys start with `prefix`, a page at a time.
pub fn list(prefix: &str, cursor: Option<&str>, limit: u32) -> Result<BlobPage> {
    Ok(wit::list(prefix, cursor, limit)?)
}

/// Delete `key`; true when something was deleted.
pub fn delete(key: &str) -> Result<bool> {
    Ok(wit::delete(key)?)
}
