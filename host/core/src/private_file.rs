//! Private files: the no-clobber writer for key material and the strict reader for
//! operator-supplied private inputs.
//!
//! The writer creates a random same-directory temporary file exclusively (mode 0600, never
//! following a symlink), fsyncs it, and hard-links it into place: the output holds the whole
//! content or does not exist, and an existing output — a symlink included — is never replaced.
//! The reader accepts only a regular file owned by this user, without group/other permission
//! bits, with one hard link and at most 64 KiB.

use crate::refusal::{Refusal, Result};
use serde_json::json;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Largest private input accepted.
pub const MAX_INPUT_BYTES: u64 = 64 * 1024;

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether a file or directory is owned by this user and not writable by group or others:
/// nobody else can have put or changed what it holds.
pub fn owned_unshared(meta: &fs::Metadata) -> bool {
    meta.uid() == effective_uid() && meta.mode() & 0o022 == 0
}

fn refuse(code: &'static str, message: String, path: &Path) -> Refusal {
    Refusal::new(code, message).with_data(json!({ "path": path.display().to_string() }))
}

/// Write `content` to the new file `output`, mode 0600, atomically and without clobbering, in a
/// directory only this user can write.
pub fn write_new(output: &Path, content: &[u8]) -> Result<()> {
    write_new_file(output, content, 0o600, true)
}

/// Write `content` to the new file `output`, mode 0644, atomically and without clobbering: a
/// file meant to be published (a signed catalog), so its directory need not be private.
pub fn write_new_public(output: &Path, content: &[u8]) -> Result<()> {
    write_new_file(output, content, 0o644, false)
}

/// A same-directory temporary file created with `mode`, synced and hard-linked into place, so
/// `output` is whole or absent and an existing file is never replaced (`output-exists`).
fn write_new_file(output: &Path, content: &[u8], mode: u32, private_dir: bool) -> Result<()> {
    let output = absolute(output)?;
    let dir = output.parent().ok_or_else(|| refuse("output-directory-missing", "the output has no directory".into(), &output))?;
    let dir_meta = fs::symlink_metadata(dir)
        .map_err(|_| refuse("output-directory-missing", format!("the output directory {} does not exist", dir.display()), dir))?;
    if dir_meta.file_type().is_symlink() || !dir_meta.is_dir() {
        return Err(refuse("output-directory-missing", format!("{} is not a directory (symbolic links are refused)", dir.display()), dir));
    }
    if private_dir && !owned_unshared(&dir_meta) {
        return Err(refuse(
            "output-directory-not-private",
            format!("the output directory {} must be owned by you and not writable by group or others", dir.display()),
            dir,
        ));
    }
    if fs::symlink_metadata(&output).is_ok() {
        return Err(refuse("output-exists", format!("{} already exists; it is never replaced", output.display()), &output));
    }
    let name = output.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.tmp-{:016x}", rand::random::<u64>()));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp)
            .map_err(|e| io_refusal("creating the temporary file", e))?;
        // the umask may narrow the mode: set it as asked
        file.set_permissions(fs::Permissions::from_mode(mode)).map_err(|e| io_refusal("setting permissions", e))?;
        file.write_all(content).map_err(|e| io_refusal("writing", e))?;
        file.sync_all().map_err(|e| io_refusal("syncing", e))?;
        fs::hard_link(&temp, &output).map_err(|e| match e.kind() {
            ErrorKind::AlreadyExists => {
                refuse("output-exists", format!("{} already exists; it is never replaced", output.display()), &output)
            }
            _ => io_refusal("publishing the file", e),
        })?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    let _ = fs::remove_file(&temp);
    result
}

/// Read an operator-supplied private file under the strict rules.
pub fn read_strict(path: &Path) -> Result<Vec<u8>> {
    let path = absolute(path)?;
    let meta = fs::symlink_metadata(&path).map_err(|e| match e.kind() {
        ErrorKind::NotFound => refuse("input-missing", format!("{} does not exist", path.display()), &path),
        _ => io_refusal("reading the file's metadata", e),
    })?;
    if meta.file_type().is_symlink() {
        return Err(refuse("input-symlink", format!("{} is a symbolic link; private inputs must be regular files", path.display()), &path));
    }
    let mut file = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).map_err(|e| io_refusal("opening", e))?;
    // judge the opened file itself, so a swap between the two looks cannot slip through
    let meta = file.metadata().map_err(|e| io_refusal("reading the file's metadata", e))?;
    if !meta.is_file() {
        return Err(refuse("input-not-regular", format!("{} is not a regular file", path.display()), &path));
    }
    if meta.uid() != effective_uid() {
        return Err(refuse("input-not-owned", format!("{} must be owned by the user running capstan", path.display()), &path));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(refuse(
            "input-permissions",
            format!("{} must not be readable or writable by group or others (chmod 600)", path.display()),
            &path,
        ));
    }
    if meta.nlink() != 1 {
        return Err(refuse("input-hard-links", format!("{} must have exactly one hard link", path.display()), &path));
    }
    if meta.len() > MAX_INPUT_BYTES {
        return Err(refuse("input-too-large", format!("{} is larger than 64 KiB", path.display()), &path));
    }
    let mut content = Vec::with_capacity(meta.len() as usize);
    Read::by_ref(&mut file).take(MAX_INPUT_BYTES + 1).read_to_end(&mut content).map_err(|e| io_refusal("reading", e))?;
    if content.len() as u64 > MAX_INPUT_BYTES {
        return Err(refuse("input-too-large", format!("{} is larger than 64 KiB", path.display()), &path));
    }
    Ok(content)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|e| io_refusal("resolving the path", e))
}

fn io_refusal(what: &str, e: std::io::Error) -> Refusal {
    Refusal::new("private-file-io", format!("{what} failed: {}", e.kind())).detail(e)
}

/// Replace `path` with `bytes` atomically (a same-directory temporary file created with `mode`,
/// synced, renamed over `path`, the directory synced): readers see the old file or the new one.
pub fn replace_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.tmp-{:016x}", rand::random::<u64>()));
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(mode).custom_flags(libc::O_NOFOLLOW).open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)?;
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn private_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    #[test]
    fn a_published_file_is_readable_by_others_and_never_clobbered() {
        let dir = tempfile::tempdir().unwrap();
        // a directory the group may write: fine to publish into, not to keep a key in
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o775)).unwrap();
        let out = dir.path().join("catalog-7.json");
        write_new_public(&out, b"{}").unwrap();
        assert_eq!(fs::metadata(&out).unwrap().mode() & 0o777, 0o644);
        assert_eq!(write_new_public(&out, b"again").unwrap_err().code, "output-exists");
        assert_eq!(fs::read(&out).unwrap(), b"{}");
        assert_eq!(
            write_new(&dir.path().join("k.pem"), b"k").unwrap_err().code,
            "output-directory-not-private",
            "a private file still needs a private directory"
        );
    }

    #[test]
    fn writes_a_new_private_file_and_never_clobbers() {
        let dir = private_dir();
        let out = dir.path().join("k.json");
        write_new(&out, b"first").unwrap();
        let meta = fs::metadata(&out).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(meta.nlink(), 1, "the temporary link is gone");
        assert_eq!(fs::read(&out).unwrap(), b"first");

        let err = write_new(&out, b"second").unwrap_err();
        assert_eq!(err.code, "output-exists");
        assert_eq!(fs::read(&out).unwrap(), b"first");

        let target = dir.path().join("target");
        let link = dir.path().join("link.json");
        symlink(&target, &link).unwrap(); // dangling
        assert_eq!(write_new(&link, b"x").unwrap_err().code, "output-exists");
        assert!(!target.exists(), "a symlink is never followed");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2, "no temporary file left behind");
    }

    #[test]
    fn refuses_a_shared_or_missing_directory() {
        let dir = private_dir();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o770)).unwrap();
        assert_eq!(write_new(&dir.path().join("k"), b"x").unwrap_err().code, "output-directory-not-private");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o703)).unwrap();
        assert_eq!(write_new(&dir.path().join("k"), b"x").unwrap_err().code, "output-directory-not-private");
        assert_eq!(write_new(&dir.path().join("none/k"), b"x").unwrap_err().code, "output-directory-missing");
    }

    #[test]
    fn strict_reader_refuses_each_rule_by_name() {
        let dir = private_dir();
        let good = dir.path().join("good");
        write_new(&good, b"{}").unwrap();
        assert_eq!(read_strict(&good).unwrap(), b"{}");

        assert_eq!(read_strict(&dir.path().join("absent")).unwrap_err().code, "input-missing");

        let link = dir.path().join("link");
        symlink(&good, &link).unwrap();
        assert_eq!(read_strict(&link).unwrap_err().code, "input-symlink");

        assert_eq!(read_strict(dir.path()).unwrap_err().code, "input-not-regular");

        let loose = dir.path().join("loose");
        write_new(&loose, b"{}").unwrap();
        fs::set_permissions(&loose, fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(read_strict(&loose).unwrap_err().code, "input-permissions");

        let linked = dir.path().join("linked");
        write_new(&linked, b"{}").unwrap();
        fs::hard_link(&linked, dir.path().join("second-name")).unwrap();
        assert_eq!(read_strict(&linked).unwrap_err().code, "input-hard-links");

        let big = dir.path().join("big");
        write_new(&big, &vec![b' '; 64 * 1024 + 1]).unwrap();
        assert_eq!(read_strict(&big).unwrap_err().code, "input-too-large");
    }

    #[test]
    fn strict_reader_refuses_a_file_owned_by_someone_else() {
        if effective_uid() != 0 {
            eprintln!("skipped: needs root to hand a file to another user");
            return;
        }
        let dir = private_dir();
        let path = dir.path().join("theirs");
        write_new(&path, b"{}").unwrap();
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        assert_eq!(read_strict(&path).unwrap_err().code, "input-not-owned");
    }
}
