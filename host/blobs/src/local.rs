//! The local-directory blob backend (`CAPSTAN_BLOB_URL=file:<dir>`).
//!
//! Layout under the root directory:
//! - `objects/`: key `a/b/c` is the file `objects/a/b/c~`. `~` is not a key character, so the
//!   object `a` (file `objects/a~`) and the objects under `a/` (directory `objects/a/`) never
//!   collide.
//! - `tmp/`: a put streams into a temporary file here first, then renames it into place.
//! - `lock`: conditional puts and deletes hold an exclusive `flock` on this file while they
//!   check and change `objects/`, so they are atomic also between processes sharing the
//!   directory.
//!
//! An etag is derived from the object file's metadata (inode, size, mtime, ctime), so it changes
//! on every write without storing anything next to the object.

use super::{BlobBackend, BlobMeta, BlobPage, BlobReader, PutMode, validate_key};
use async_trait::async_trait;
use capstan_core::refusal::{Refusal, Result};
use sha2::{Digest, Sha256};
use std::fmt;
use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Appended to the final key segment to name the object file.
const OBJECT_SUFFIX: char = '~';
/// Buffer size for streaming bodies in and out.
const IO_BUF: usize = 256 * 1024;
/// Temporary files older than this are left over from a crash and removed on open.
const STALE_TMP_AGE: Duration = Duration::from_secs(3600);

/// The local-directory backend: each object is a file under one directory (layout above).
pub struct LocalBlobs {
    /// The directory as configured, for `describe`.
    dir: String,
    inner: Arc<Inner>,
}

struct Inner {
    objects: PathBuf,
    tmp: PathBuf,
    lock: PathBuf,
}

impl LocalBlobs {
    /// Open (creating if missing, mode 0700) the blob directory `dir`.
    pub async fn open(dir: &str) -> Result<LocalBlobs> {
        let given = dir.to_string();
        let inner = blocking(move || {
            let root = std::path::absolute(&given).map_err(|e| unavailable("resolving the blob directory failed", e))?;
            let inner = Inner { objects: root.join("objects"), tmp: root.join("tmp"), lock: root.join("lock") };
            for dir in [&root, &inner.objects, &inner.tmp] {
                make_dirs(dir).map_err(|e| unavailable("creating the blob directory failed", at(dir, e)))?;
            }
            inner.open_lock_file()?;
            inner.remove_stale_temp_files();
            Ok(inner)
        })
        .await?;
        Ok(LocalBlobs { dir: dir.to_string(), inner: Arc::new(inner) })
    }
}

#[async_trait]
impl BlobBackend for LocalBlobs {
    fn describe(&self) -> String {
        format!("file:{}", self.dir)
    }

    async fn put(&self, key: &str, mut body: BlobReader, mode: PutMode) -> Result<BlobMeta> {
        validate_key(key)?;
        let temp = TempFile(Some(self.inner.tmp.join(format!("put-{:032x}", rand::random::<u128>()))));
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(temp.path())
            .await
            .map_err(|e| unavailable("creating a temporary blob file failed", at(temp.path(), e)))?;
        let size = copy_body(&mut body, &mut file, temp.path()).await?;
        file.flush().await.map_err(|e| unavailable("writing a blob failed", at(temp.path(), e)))?;
        let file = file.into_std().await;
        let inner = self.inner.clone();
        let key = key.to_string();
        blocking(move || inner.commit(temp, file, size, key, mode)).await
    }

    async fn get(&self, key: &str) -> Result<Option<(BlobMeta, BlobReader)>> {
        Ok(self.open_object(key).await?.map(|(meta, file)| {
            let reader: BlobReader = Box::pin(tokio::io::BufReader::with_capacity(IO_BUF, file));
            (meta, reader)
        }))
    }

    async fn head(&self, key: &str) -> Result<Option<BlobMeta>> {
        Ok(self.open_object(key).await?.map(|(meta, _)| meta))
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<BlobPage> {
        let limit = super::validate_listing(prefix, cursor, limit)?;
        let inner = self.inner.clone();
        let prefix = prefix.to_string();
        let cursor = cursor.map(str::to_string);
        blocking(move || inner.list(&prefix, cursor.as_deref(), limit)).await
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        validate_key(key)?;
        let inner = self.inner.clone();
        let key = key.to_string();
        blocking(move || inner.delete(&key)).await
    }

    async fn probe(&self) -> Result<()> {
        super::probe::probe_conditional_writes(self).await
    }
}

impl LocalBlobs {
    /// Open an object's file; the etag comes from the open handle, so it describes exactly
    /// the bytes read from it.
    async fn open_object(&self, key: &str) -> Result<Option<(BlobMeta, tokio::fs::File)>> {
        validate_key(key)?;
        let path = self.inner.object_path(key);
        let file = match tokio::fs::File::open(&path).await {
            Ok(file) => file,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(unavailable("opening a blob failed", at(&path, e))),
        };
        let meta = file.metadata().await.map_err(|e| unavailable("reading blob metadata failed", at(&path, e)))?;
        if !meta.is_file() {
            return Err(unavailable("a blob is not a regular file", path.display()));
        }
        Ok(Some((blob_meta(key.to_string(), &meta), file)))
    }
}

impl Inner {
    fn object_path(&self, key: &str) -> PathBuf {
        // The key is validated: relative `/`-separated segments without `.`/`..`.
        self.objects.join(format!("{key}{OBJECT_SUFFIX}"))
    }

    fn open_lock_file(&self) -> Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.lock)
            .map_err(|e| unavailable("opening the blob lock file failed", at(&self.lock, e)))
    }

    /// Take the exclusive cross-process lock; released when the returned handle drops.
    ///
    /// Each call opens its own handle: `flock` locks belong to the open file description, so
    /// two handles contend even inside one process (one shared handle would not).
    fn lock(&self) -> Result<File> {
        let file = self.open_lock_file()?;
        file.lock().map_err(|e| unavailable("locking the blob directory failed", at(&self.lock, e)))?;
        Ok(file)
    }

    /// Move a fully written temporary file into place if `mode` allows it.
    fn commit(&self, temp: TempFile, file: File, size: u64, key: String, mode: PutMode) -> Result<BlobMeta> {
        // An mtime with nanosecond precision (the kernel stamps writes with a coarse clock)
        // makes an etag repeat after delete-and-recreate practically impossible.
        file.set_modified(SystemTime::now())
            .and_then(|()| file.sync_all())
            .map_err(|e| unavailable("writing a blob failed", at(temp.path(), e)))?;
        let target = self.object_path(&key);
        let _lock = self.lock()?;

        let current = match fs::metadata(&target) {
            Ok(meta) => Some(etag_of(&meta)),
            Err(e) if is_absent(&e) => None,
            Err(e) => return Err(unavailable("reading blob metadata failed", at(&target, e))),
        };
        match (&mode, &current) {
            (PutMode::Overwrite, _) | (PutMode::CreateOnly, None) => {}
            (PutMode::CreateOnly, Some(_)) => {
                return Err(Refusal::new("exists", format!("blob {key} already exists")).with_data(serde_json::json!({ "key": key })));
            }
            (PutMode::IfMatch(_), None) => {
                return Err(Refusal::new("conflict", format!("blob {key} does not exist, so it cannot match the given etag"))
                    .with_data(serde_json::json!({ "key": key })));
            }
            (PutMode::IfMatch(expected), Some(etag)) if expected != etag => {
                return Err(Refusal::new("conflict", format!("blob {key} has changed (its etag no longer matches)"))
                    .with_data(serde_json::json!({ "key": key })));
            }
            (PutMode::IfMatch(_), Some(_)) => {}
        }

        let parent = target.parent().expect("an object path has a parent");
        let created_dirs = !parent.is_dir();
        if created_dirs {
            make_dirs(parent).map_err(|e| unavailable("creating a blob directory failed", at(parent, e)))?;
        }
        fs::rename(temp.path(), &target).map_err(|e| unavailable("storing a blob failed", at(&target, e)))?;
        temp.disarm();

        let mut meta = file.metadata().map_err(|e| unavailable("reading blob metadata failed", at(&target, e)))?;
        let mut etag = etag_of(&meta);
        if current.as_ref() == Some(&etag) {
            // Never hand out the etag of the object this one replaced (ABA). With the old file
            // still linked while the new one was written the inodes differ, so this is a guard,
            // not a path we expect. Double the step in case the filesystem has coarse times.
            let mut step = Duration::from_nanos(1);
            for _ in 0..48 {
                let bumped = meta.modified().map(|t| t + step).and_then(|t| file.set_modified(t));
                meta = bumped.and_then(|()| file.metadata()).map_err(|e| unavailable("updating blob metadata failed", at(&target, e)))?;
                etag = etag_of(&meta);
                if current.as_ref() != Some(&etag) {
                    break;
                }
                step *= 2;
            }
            file.sync_all().map_err(|e| unavailable("writing a blob failed", at(&target, e)))?;
        }

        // Make the new directory entries durable: the parent, and every directory created.
        let mut dir = Some(parent);
        while let Some(d) = dir {
            sync_dir(d).map_err(|e| unavailable("syncing a blob directory failed", at(d, e)))?;
            if !created_dirs || d == self.objects {
                break;
            }
            dir = d.parent();
        }
        debug_assert_eq!(meta.len(), size, "the stored size matches the bytes streamed");
        Ok(BlobMeta { key, size: meta.len(), etag })
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let target = self.object_path(key);
        let _lock = self.lock()?;
        match fs::remove_file(&target) {
            Ok(()) => {}
            Err(e) if is_absent(&e) => return Ok(false),
            Err(e) => return Err(unavailable("deleting a blob failed", at(&target, e))),
        }
        // Remove directories left empty, up to (not including) `objects/`. Puts create
        // directories under the same lock, so none is removed under a put's feet.
        let mut dir = target.parent().expect("an object path has a parent");
        while dir != self.objects && fs::remove_dir(dir).is_ok() {
            dir = dir.parent().expect("an object directory has a parent");
        }
        sync_dir(dir).map_err(|e| unavailable("syncing a blob directory failed", at(dir, e)))?;
        Ok(true)
    }

    fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<BlobPage> {
        // Only the directory the prefix names up to its last `/` can hold matching keys; the
        // rest of the prefix (a partial segment) filters that directory's entries.
        let (base, partial) = match prefix.rfind('/') {
            Some(i) => (&prefix[..=i], &prefix[i + 1..]),
            None => ("", prefix),
        };
        let dir = match base.strip_suffix('/') {
            Some(rel) => self.objects.join(rel),
            None => self.objects.clone(),
        };
        let mut items = Vec::new();
        walk(&dir, base, Some(partial), cursor, limit + 1, &mut items).map_err(|e| unavailable("listing blobs failed", at(&dir, e)))?;
        let more = items.len() > limit;
        items.truncate(limit);
        let next_cursor = if more { items.last().map(|m| m.key.clone()) } else { None };
        Ok(BlobPage { items, next_cursor })
    }

    /// Best effort: temporary files a crashed put left behind.
    fn remove_stale_temp_files(&self) {
        let Ok(entries) = fs::read_dir(&self.tmp) else {
            return;
        };
        let now = SystemTime::now();
        for entry in entries.flatten() {
            let stale =
                entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age > STALE_TMP_AGE));
            if stale && entry.file_type().is_ok_and(|t| t.is_file()) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// Collect, in byte order, the objects under `dir` (whose keys start with `key_prefix`) that
/// are after `cursor`, until `out` holds `want`. At the top level only entries whose segment
/// starts with `partial` count.
///
/// Visiting each directory's entries sorted by their key (`name` for an object, `name/` for a
/// directory) yields keys in byte order: a directory's keys all start with `name/` and no
/// sibling key has that as a prefix. So the walk can stop early and skip whole directories
/// that lie before the cursor.
fn walk(dir: &Path, key_prefix: &str, partial: Option<&str>, cursor: Option<&str>, want: usize, out: &mut Vec<BlobMeta>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if is_absent(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut found: Vec<(String, bool)> = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) if is_absent(&e) => continue,
            Err(e) => return Err(e),
        };
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let file_type = match entry.file_type() {
            Ok(t) => t,
            Err(e) if is_absent(&e) => continue,
            Err(e) => return Err(e),
        };
        let (segment, is_dir) = if file_type.is_dir() {
            (name.as_str(), true)
        } else if let (true, Some(segment)) = (file_type.is_file(), name.strip_suffix(OBJECT_SUFFIX)) {
            (segment, false)
        } else {
            continue;
        };
        if validate_key(segment).is_err() || partial.is_some_and(|p| !segment.starts_with(p)) {
            continue;
        }
        let key = if is_dir { format!("{key_prefix}{segment}/") } else { format!("{key_prefix}{segment}") };
        let before_cursor = cursor.is_some_and(|c| if is_dir { key.as_str() < c && !c.starts_with(&key) } else { key.as_str() <= c });
        if !before_cursor {
            found.push((key, is_dir));
        }
    }
    found.sort_unstable();
    for (key, is_dir) in found {
        if out.len() >= want {
            break;
        }
        if is_dir {
            walk(&dir.join(key[key_prefix.len()..].trim_end_matches('/')), &key, None, cursor, want, out)?;
            continue;
        }
        let path = dir.join(format!("{}{OBJECT_SUFFIX}", &key[key_prefix.len()..]));
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() => out.push(blob_meta(key, &meta)),
            Ok(_) => {}
            Err(e) if is_absent(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Stream `body` into `file`, in large writes; returns the byte count.
async fn copy_body(body: &mut BlobReader, file: &mut tokio::fs::File, path: &Path) -> Result<u64> {
    let mut buf = vec![0u8; IO_BUF];
    let mut total = 0u64;
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            let n = body
                .read(&mut buf[filled..])
                .await
                .map_err(|e| Refusal::new("blobs-unavailable", "reading the blob body failed").retryable().detail(e))?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            return Ok(total);
        }
        file.write_all(&buf[..filled]).await.map_err(|e| unavailable("writing a blob failed", at(path, e)))?;
        total += filled as u64;
    }
}

/// A temporary file removed on drop unless disarmed (refused, failed or cancelled puts).
struct TempFile(Option<PathBuf>);

impl TempFile {
    fn path(&self) -> &Path {
        self.0.as_deref().expect("temporary file not yet disarmed")
    }

    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

fn blob_meta(key: String, meta: &Metadata) -> BlobMeta {
    BlobMeta { key, size: meta.len(), etag: etag_of(meta) }
}

/// Hex of the first 16 bytes of sha256 over (inode, size, mtime ns, ctime ns).
fn etag_of(meta: &Metadata) -> String {
    let mut hash = Sha256::new();
    for n in [meta.ino(), meta.size()] {
        hash.update(n.to_le_bytes());
    }
    for (secs, nanos) in [(meta.mtime(), meta.mtime_nsec()), (meta.ctime(), meta.ctime_nsec())] {
        hash.update((i128::from(secs) * 1_000_000_000 + i128::from(nanos)).to_le_bytes());
    }
    hex::encode(&hash.finalize()[..16])
}

fn make_dirs(path: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(path)
}

fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

fn is_absent(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
}

/// An io failure: the client sees `what`, the log also sees the path and the error.
fn unavailable(what: &str, detail: impl fmt::Display) -> Refusal {
    Refusal::new("blobs-unavailable", what).retryable().detail(detail)
}

fn at(path: &Path, e: io::Error) -> String {
    format!("{}: {e}", path.display())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Refusal::internal(format!("blob task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Blobs, conformance};
    use std::time::Instant;

    async fn open_temp() -> (tempfile::TempDir, Blobs) {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::new(LocalBlobs::open(dir.path().to_str().unwrap()).await.unwrap());
        (dir, blobs)
    }

    fn tmp_is_empty(root: &Path) -> bool {
        fs::read_dir(root.join("tmp")).unwrap().next().is_none()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn conformance_suite() {
        let (dir, blobs) = open_temp().await;
        conformance::run_all(&blobs).await;
        blobs.probe().await.unwrap();
        // Everything was cleaned up: no temp files, no objects, no empty directories.
        assert!(tmp_is_empty(dir.path()));
        assert_eq!(fs::read_dir(dir.path().join("objects")).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn open_creates_the_layout_private_and_describe_names_the_dir() {
        use std::os::unix::fs::PermissionsExt;
        let parent = tempfile::tempdir().unwrap();
        let root = parent.path().join("new/blobs");
        let dir = root.to_str().unwrap();
        let blobs = LocalBlobs::open(dir).await.unwrap();
        assert_eq!(blobs.describe(), format!("file:{dir}"));
        for sub in ["new", "new/blobs", "new/blobs/objects", "new/blobs/tmp"] {
            let mode = fs::metadata(parent.path().join(sub)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{sub} is private: {mode:o}");
        }
        assert!(root.join("lock").is_file());
        // Opening again is fine.
        LocalBlobs::open(dir).await.unwrap();
        // A file where the directory should be is `blobs-unavailable`, without the path.
        let file = parent.path().join("file");
        fs::write(&file, b"x").unwrap();
        let err = LocalBlobs::open(file.to_str().unwrap()).await.err().unwrap();
        assert!(err.is("blobs-unavailable") && err.retryable, "{err}");
        assert!(!err.message.contains('/'), "{err:?}");
        assert!(err.detail.unwrap().contains(file.to_str().unwrap()));
    }

    #[tokio::test]
    async fn key_and_nested_keys_coexist() {
        let (dir, blobs) = open_temp().await;
        blobs.put_bytes("a", b"file".to_vec(), PutMode::CreateOnly).await.unwrap();
        blobs.put_bytes("a/b", b"nested".to_vec(), PutMode::CreateOnly).await.unwrap();
        blobs.put_bytes("a/b/c", b"deeper".to_vec(), PutMode::CreateOnly).await.unwrap();
        assert!(dir.path().join("objects/a~").is_file());
        assert!(dir.path().join("objects/a/b~").is_file());
        assert!(dir.path().join("objects/a/b/c~").is_file());
        assert_eq!(blobs.get_bytes("a").await.unwrap().unwrap().1, b"file");
        assert_eq!(blobs.get_bytes("a/b").await.unwrap().unwrap().1, b"nested");
        assert_eq!(blobs.get_bytes("a/b/c").await.unwrap().unwrap().1, b"deeper");
        let page = blobs.list("", None, 10).await.unwrap();
        let keys: Vec<_> = page.items.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["a", "a/b", "a/b/c"]);
        assert!(blobs.delete("a").await.unwrap());
        assert_eq!(blobs.get_bytes("a/b").await.unwrap().unwrap().1, b"nested");
        assert!(blobs.delete("a/b").await.unwrap());
        assert_eq!(blobs.get_bytes("a/b/c").await.unwrap().unwrap().1, b"deeper");
    }

    #[tokio::test]
    async fn delete_removes_empty_directories() {
        let (dir, blobs) = open_temp().await;
        let objects = dir.path().join("objects");
        blobs.put_bytes("x/y/z/k2", b"2".to_vec(), PutMode::Overwrite).await.unwrap();
        blobs.put_bytes("x/y/k1", b"1".to_vec(), PutMode::Overwrite).await.unwrap();
        assert!(blobs.delete("x/y/z/k2").await.unwrap());
        assert!(!objects.join("x/y/z").exists(), "the emptied directory is gone");
        assert!(objects.join("x/y").is_dir(), "a directory still holding an object stays");
        assert!(blobs.delete("x/y/k1").await.unwrap());
        assert!(!objects.join("x").exists(), "every emptied directory is gone");
        assert!(objects.is_dir(), "objects/ itself stays");
        assert!(!blobs.delete("x/y/k1").await.unwrap());
        // Deleting an absent key under a missing directory is just `false`.
        assert!(!blobs.delete("no/such/dir/key").await.unwrap());
    }

    #[tokio::test]
    async fn refused_conditional_puts_leave_no_temp_file() {
        let (dir, blobs) = open_temp().await;
        let meta = blobs.put_bytes("k", b"v1".to_vec(), PutMode::CreateOnly).await.unwrap();
        assert!(tmp_is_empty(dir.path()));
        let err = blobs.put_bytes("k", b"v2".to_vec(), PutMode::CreateOnly).await.unwrap_err();
        assert!(err.is("exists") && err.message.contains('k'), "{err}");
        assert!(tmp_is_empty(dir.path()), "temp file removed after `exists`");
        blobs.put_bytes("k", b"v2".to_vec(), PutMode::IfMatch(meta.etag.clone())).await.unwrap();
        let err = blobs.put_bytes("k", b"v3".to_vec(), PutMode::IfMatch(meta.etag)).await.unwrap_err();
        assert!(err.is("conflict"), "{err}");
        assert!(tmp_is_empty(dir.path()), "temp file removed after `conflict`");
        let err = blobs.put_bytes("absent", b"v".to_vec(), PutMode::IfMatch("x".into())).await.unwrap_err();
        assert!(err.is("conflict"), "{err}");
        assert!(tmp_is_empty(dir.path()), "temp file removed after `conflict` on an absent key");
        assert!(!dir.path().join("objects/absent~").exists());
    }

    #[tokio::test]
    async fn failing_body_leaves_no_temp_file_and_no_object() {
        struct Failing(usize);
        impl tokio::io::AsyncRead for Failing {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<io::Result<()>> {
                if self.0 == 0 {
                    return std::task::Poll::Ready(Err(io::Error::other("client went away")));
                }
                self.0 -= 1;
                buf.put_slice(b"some bytes");
                std::task::Poll::Ready(Ok(()))
            }
        }
        let (dir, blobs) = open_temp().await;
        let err = blobs.put("k", Box::pin(Failing(3)), PutMode::Overwrite).await.unwrap_err();
        assert!(err.is("blobs-unavailable") && err.retryable, "{err}");
        assert!(tmp_is_empty(dir.path()));
        assert!(blobs.head("k").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn stale_temp_files_are_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        LocalBlobs::open(path).await.unwrap();
        let stale = dir.path().join("tmp/put-stale");
        let fresh = dir.path().join("tmp/put-fresh");
        fs::write(&stale, b"x").unwrap();
        fs::write(&fresh, b"x").unwrap();
        File::options().write(true).open(&stale).unwrap().set_modified(SystemTime::now() - Duration::from_secs(2 * 3600)).unwrap();
        LocalBlobs::open(path).await.unwrap();
        assert!(!stale.exists(), "a temp file older than an hour is removed");
        assert!(fresh.exists(), "a recent temp file (maybe a put in progress) stays");
    }

    #[tokio::test]
    async fn list_skips_foreign_files_and_hands_out_the_last_key_as_cursor() {
        let (dir, blobs) = open_temp().await;
        for key in ["p/1", "p/2", "p/3"] {
            blobs.put_bytes(key, b"x".to_vec(), PutMode::Overwrite).await.unwrap();
        }
        let objects = dir.path().join("objects");
        fs::write(objects.join("p/no-suffix"), b"x").unwrap();
        fs::write(objects.join("p/.hidden~"), b"x").unwrap();
        fs::create_dir(objects.join("p/empty-dir")).unwrap();
        std::os::unix::fs::symlink(objects.join("p/1~"), objects.join("p/link~")).unwrap();
        let page = blobs.list("p/", None, 2).await.unwrap();
        let keys: Vec<_> = page.items.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["p/1", "p/2"]);
        assert_eq!(page.next_cursor.as_deref(), Some("p/2"));
        let page = blobs.list("p/", page.next_cursor.as_deref(), 2).await.unwrap();
        let keys: Vec<_> = page.items.iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["p/3"]);
        assert_eq!(page.next_cursor, None);
        // A prefix whose directory does not exist lists nothing.
        assert!(blobs.list("nope/deeper/", None, 5).await.unwrap().items.is_empty());
    }

    #[tokio::test]
    async fn etags_follow_the_open_handle() {
        let (_dir, blobs) = open_temp().await;
        let v1 = blobs.put_bytes("k", b"one".to_vec(), PutMode::Overwrite).await.unwrap();
        let (meta, mut reader) = blobs.get("k").await.unwrap().unwrap();
        let v2 = blobs.put_bytes("k", b"two!".to_vec(), PutMode::Overwrite).await.unwrap();
        // The stream opened before the overwrite still reads the old bytes under the old etag.
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).await.unwrap();
        assert_eq!((meta.etag.as_str(), bytes.as_slice()), (v1.etag.as_str(), b"one".as_slice()));
        assert_eq!(blobs.head("k").await.unwrap().unwrap(), v2);
    }

    #[test]
    fn file_locks_exclude_separate_handles_in_one_process() {
        // `flock` belongs to the open file description: two opens of the lock file contend even
        // within one process, which is what lets two `LocalBlobs` (or two `lock()` calls of one)
        // exclude each other.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let first = File::create(&path).unwrap();
        let second = File::options().write(true).open(&path).unwrap();
        first.lock().unwrap();
        assert!(matches!(second.try_lock(), Err(fs::TryLockError::WouldBlock)), "a second handle must not get the lock");
        drop(first);
        second.try_lock().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_instances_on_one_directory_race() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        let handles = [Blobs::new(LocalBlobs::open(path).await.unwrap()), Blobs::new(LocalBlobs::open(path).await.unwrap())];
        conformance::race_create_only(&handles, "race/create").await;
        conformance::race_if_match(&handles, "race/if-match").await;
        assert!(tmp_is_empty(dir.path()), "refused racers left temp files");
    }

    /// Not a test on its own: the body of a child process `separate_processes_race` starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn child_racer() {
        let Ok(spec) = std::env::var("CAPSTAN_BLOBS_TEST_CHILD") else {
            return;
        };
        let mut parts = spec.split('|');
        let (dir, start, etag) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap().to_string());
        let blobs = Blobs::new(LocalBlobs::open(dir).await.unwrap());
        let ready = format!("{start}.ready-{}", std::process::id());
        fs::write(&ready, b"").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Path::new(start).exists() {
            assert!(Instant::now() < deadline, "the parent never said go");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let attempts = (0..4).map(|i| {
            let (blobs, etag) = (blobs.clone(), etag.clone());
            tokio::spawn(async move {
                let body = format!("{} {i}", std::process::id()).into_bytes();
                let created = blobs.put_bytes("race/create", body.clone(), PutMode::CreateOnly).await;
                let matched = blobs.put_bytes("race/if-match", body, PutMode::IfMatch(etag)).await;
                (created, matched)
            })
        });
        for attempt in attempts.collect::<Vec<_>>() {
            let (created, matched) = attempt.await.unwrap();
            let outcome = |r: Result<BlobMeta>| match r {
                Ok(_) => "won".to_string(),
                Err(e) => e.code.to_string(),
            };
            println!("RACE-RESULT create={} if-match={}", outcome(created), outcome(matched));
        }
    }

    #[tokio::test]
    async fn separate_processes_race() {
        const CHILDREN: usize = 4;
        let dir = tempfile::tempdir().unwrap();
        let signals = tempfile::tempdir().unwrap();
        let start = signals.path().join("go");
        let path = dir.path().to_str().unwrap();
        let blobs = Blobs::new(LocalBlobs::open(path).await.unwrap());
        let initial = blobs.put_bytes("race/if-match", b"start".to_vec(), PutMode::Overwrite).await.unwrap();
        let spec = format!("{path}|{}|{}", start.display(), initial.etag);
        let children: Vec<_> = (0..CHILDREN)
            .map(|_| {
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "local::tests::child_racer", "--nocapture", "--test-threads=1"])
                    .env("CAPSTAN_BLOBS_TEST_CHILD", &spec)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // Let every child open its store before any races.
        let deadline = Instant::now() + Duration::from_secs(60);
        while fs::read_dir(signals.path()).unwrap().count() < CHILDREN {
            assert!(Instant::now() < deadline, "children did not get ready");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        fs::write(&start, b"").unwrap();
        let mut lines = Vec::new();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stdout));
            let stdout = String::from_utf8(out.stdout).unwrap();
            // libtest prints `test ... ` before the first line of output, hence not a prefix match.
            lines.extend(stdout.lines().filter_map(|l| l.split_once("RACE-RESULT ")).map(|(_, r)| r.to_string()));
        }
        assert_eq!(lines.len(), CHILDREN * 4, "{lines:?}");
        let count = |s: &str| lines.iter().filter(|l| l.contains(s)).count();
        assert_eq!(count("create=won"), 1, "{lines:?}");
        assert_eq!(count("create=exists"), CHILDREN * 4 - 1, "{lines:?}");
        assert_eq!(count("if-match=won"), 1, "{lines:?}");
        assert_eq!(count("if-match=conflict"), CHILDREN * 4 - 1, "{lines:?}");
        assert!(tmp_is_empty(dir.path()), "refused racers left temp files");
    }
}
