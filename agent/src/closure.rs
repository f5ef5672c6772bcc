//! A service's database closure (docs/relays.md, "Backups on the relay"): the consistent copy
//! of the database a service declares in one of its volumes (`{engine, volume, path}`).
//!
//! Copying a live database file with the rest of a volume can catch it between two writes, and
//! misses what sits in its write-ahead log. So a backup that carries a `database` takes the
//! closure first — SQLite's `VACUUM INTO`, one read transaction, whatever the service is
//! writing — uploads it as an object of its own, and leaves the live file and its `-wal`,
//! `-shm` and `-journal` companions out of the volume archive. A restore checks the closure's
//! length, SHA-256 and `PRAGMA integrity_check` before anything is swapped, and puts it in the
//! staged volume in place of the file, so the database comes back exactly as it was copied.

use crate::backups::{Built, Counts, Ticket, archive_failed, invalid, restore_failed, temp_file, ticket};
use capstan_core::Refusal;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::{self, Read, Seek};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// The files SQLite keeps beside a database: never archived with the volume, the closure
/// stands for all of them.
const COMPANIONS: &[&str] = &["", "-wal", "-shm", "-journal"];
/// The longest path of a database inside its volume, in bytes (as services.* declare it).
const MAX_PATH: usize = 256;
/// How long the copy waits for a writer holding the database locked.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The database a request names: in which volume, at which relative path.
#[derive(Debug, Clone, PartialEq)]
pub struct Declared {
    pub volume: String,
    pub path: PathBuf,
}

impl Declared {
    /// The request's `database` (`{engine: "sqlite", volume, path}`), if it has one; its
    /// volume must be one of `volumes`.
    pub fn from_body(body: &Value, volumes: &[String]) -> Result<Option<Declared>, Refusal> {
        let database = &body["database"];
        if database.is_null() {
            return Ok(None);
        }
        if !database.is_object() {
            return Err(invalid("database", "must be an object {engine, volume, path, …}"));
        }
        match database["engine"].as_str() {
            Some("sqlite") => {}
            Some(other) => {
                return Err(Refusal::new(
                    "database-engine-unsupported",
                    format!("this relay takes closures of sqlite databases, not {}", capstan_core::text::truncate(other, 40)),
                ));
            }
            None => return Err(invalid("database.engine", "must name the engine (sqlite)")),
        }
        let volume = database["volume"]
            .as_str()
            .filter(|v| volumes.iter().any(|name| name == v))
            .ok_or_else(|| invalid("database.volume", "must be one of the volumes asked for"))?;
        let path = database["path"]
            .as_str()
            .filter(|p| p.len() <= MAX_PATH && !p.ends_with('/'))
            .map(Path::new)
            .and_then(plain_relative)
            .ok_or_else(|| invalid("database.path", "must be a relative path inside the volume, without . or .."))?;
        Ok(Some(Declared { volume: volume.to_string(), path }))
    }

    /// Its file and companions relative to the service's directory: what the volume archive
    /// leaves out.
    pub fn archive_exclusions(&self) -> Vec<PathBuf> {
        let file = Path::new(&self.volume).join(&self.path);
        COMPANIONS
            .iter()
            .map(|suffix| {
                let mut name = file.as_os_str().to_owned();
                name.push(suffix);
                PathBuf::from(name)
            })
            .collect()
    }
}

/// `path` when it is names only (no root, `.` or `..`).
fn plain_relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// The upload ticket and size bound under `database.upload`.
pub fn upload_ticket(body: &Value, origin: &str) -> Result<(Ticket, u64), Refusal> {
    let upload = &body["database"]["upload"];
    if !upload.is_object() {
        return Err(invalid("database.upload", "must be an object {url, token, maxBytes}"));
    }
    let max =
        upload["maxBytes"].as_u64().filter(|n| *n >= 1).ok_or_else(|| invalid("database.upload.maxBytes", "must be a whole number ≥ 1"))?;
    Ok((ticket(upload, "database.upload", origin)?, max))
}

/// The download ticket, length and SHA-256 under `database` of a restore.
pub fn download_ticket(body: &Value, origin: &str) -> Result<(Ticket, u64, String), Refusal> {
    let database = &body["database"];
    let download = &database["download"];
    if !download.is_object() {
        return Err(invalid("database.download", "must be an object {url, token}"));
    }
    let size = database["size"].as_u64().filter(|n| *n >= 1).ok_or_else(|| invalid("database.size", "must be a whole number ≥ 1"))?;
    let sha256 = database["sha256"]
        .as_str()
        .filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| invalid("database.sha256", "must be 64 hexadecimal digits"))?
        .to_ascii_lowercase();
    Ok((ticket(download, "database.download", origin)?, size, sha256))
}

/// Take the closure of the database `declared` in the service's directory into a private
/// temporary file under `root`: at most `max_bytes`.
pub fn take(root: &Path, service_dir: &Path, declared: &Declared, max_bytes: u64) -> Result<Built, Refusal> {
    let live = service_dir.join(&declared.volume).join(&declared.path);
    let shown = Path::new(&declared.volume).join(&declared.path).display().to_string();
    let missing = |why: &str| {
        Refusal::new("database-missing", format!("the database {shown} {why}"))
            .with_data(json!({ "volume": declared.volume, "path": declared.path }))
    };
    match fs::symlink_metadata(&live) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Err(missing("is not a regular file")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing("does not exist")),
        Err(e) => return Err(archive_failed(format!("the database {shown} cannot be read: {e}"))),
    }
    let (temp, file) = temp_file(root, "closure").map_err(|e| archive_failed(format!("creating the closure file: {e}")))?;
    // read-write without create: a database that vanished is not made anew, and SQLite can
    // take its shared-memory lock; VACUUM INTO writes only the copy
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let unreadable = |e: rusqlite::Error| {
        Refusal::new("database-unreadable", format!("the database {shown} cannot be copied: {e}"))
            .with_data(json!({ "volume": declared.volume, "path": declared.path }))
    };
    let db = rusqlite::Connection::open_with_flags(&live, flags).map_err(unreadable)?;
    db.busy_timeout(BUSY_TIMEOUT).map_err(unreadable)?;
    let target = temp.path().to_str().ok_or_else(|| archive_failed("the closure file's path is not UTF-8".into()))?;
    db.execute("VACUUM INTO ?1", [target]).map_err(unreadable)?;
    drop(db);
    let (size, sha256) = digest(&file).map_err(|e| archive_failed(format!("reading the closure back: {e}")))?;
    if size > max_bytes {
        return Err(Refusal::new("backup-too-large", format!("the database closure is larger than maxBytes ({max_bytes} bytes)"))
            .with_data(json!({ "maxBytes": max_bytes })));
    }
    Ok(Built { _temp: temp, file, size, sha256, counts: Counts::default() })
}

/// The length and SHA-256 of `file`, read from its start.
fn digest(mut file: &fs::File) -> io::Result<(u64, String)> {
    file.seek(io::SeekFrom::Start(0))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex::encode(hasher.finalize())))
}

/// A downloaded closure must be a whole SQLite database: `PRAGMA integrity_check` answers `ok`.
pub fn check(path: &Path) -> Result<(), Refusal> {
    let invalid =
        |why: String| Refusal::new("database-closure-invalid", format!("the database closure is not a sound SQLite database: {why}"));
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let db = rusqlite::Connection::open_with_flags(path, flags).map_err(|e| invalid(e.to_string()))?;
    let verdict: String = db.query_row("PRAGMA integrity_check", [], |row| row.get(0)).map_err(|e| invalid(e.to_string()))?;
    if verdict != "ok" {
        return Err(invalid(capstan_core::text::truncate(&verdict, 200)));
    }
    Ok(())
}

/// Put the closure at `path` in place of the database in the staged volumes under `staging`:
/// its companions go, missing directories are made (never through a link the archive made).
pub fn place(staging: &Path, declared: &Declared, closure: &Path) -> Result<(), Refusal> {
    let mut parent = staging.join(&declared.volume);
    if let Some(dirs) = declared.path.parent() {
        for part in dirs.components() {
            parent.push(part);
            match fs::symlink_metadata(&parent) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(restore_failed(format!("the database's directory {} is not a directory in the backup", parent.display())));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&parent)
                    .map_err(|e| restore_failed(format!("creating {}: {e}", parent.display())))?,
                Err(e) => return Err(restore_failed(format!("placing the database: {e}"))),
            }
        }
    }
    for companion in declared.archive_exclusions() {
        match fs::remove_file(staging.join(&companion)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(restore_failed(format!("clearing {} in the staged volume: {e}", companion.display()))),
        }
    }
    let target = staging.join(&declared.volume).join(&declared.path);
    fs::copy(closure, &target).map_err(|e| restore_failed(format!("placing the database closure: {e}")))?;
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600))
        .map_err(|e| restore_failed(format!("placing the database closure: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared(path: &str) -> Declared {
        Declared { volume: "data".into(), path: path.into() }
    }

    #[test]
    fn a_request_names_a_sqlite_database_inside_one_of_its_volumes() {
        let volumes = vec!["data".to_string()];
        let body = |db: Value| json!({ "database": db });
        assert_eq!(Declared::from_body(&json!({}), &volumes).unwrap(), None);
        let ok = Declared::from_body(&body(json!({"engine": "sqlite", "volume": "data", "path": "db/app.sqlite"})), &volumes).unwrap();
        assert_eq!(ok, Some(declared("db/app.sqlite")));
        let code = |db: Value| Declared::from_body(&body(db), &volumes).unwrap_err().code.to_string();
        assert_eq!(code(json!({"engine": "postgres", "volume": "data", "path": "x"})), "database-engine-unsupported");
        assert_eq!(code(json!({"engine": "sqlite", "volume": "logs", "path": "x"})), "backup-request-invalid");
        for path in ["", "/abs.db", "../up.db", "a/../b.db", "dir/"] {
            assert_eq!(code(json!({"engine": "sqlite", "volume": "data", "path": path})), "backup-request-invalid", "{path:?}");
        }
        assert_eq!(code(json!("sqlite")), "backup-request-invalid");
    }

    #[test]
    fn the_archive_leaves_out_the_file_and_its_companions() {
        let names: Vec<String> = declared("db/app.sqlite").archive_exclusions().iter().map(|p| p.display().to_string()).collect();
        assert_eq!(names, ["data/db/app.sqlite", "data/db/app.sqlite-wal", "data/db/app.sqlite-shm", "data/db/app.sqlite-journal"]);
    }

    #[test]
    fn a_closure_holds_what_sits_in_the_write_ahead_log_and_is_placed_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (root, service) = (dir.path().join("volumes"), dir.path().join("volumes/svc_1"));
        fs::create_dir_all(service.join("data/db")).unwrap();
        let live = rusqlite::Connection::open(service.join("data/db/app.sqlite")).unwrap();
        live.pragma_update(None, "journal_mode", "WAL").unwrap();
        live.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        live.execute_batch("CREATE TABLE notes(body TEXT); INSERT INTO notes VALUES ('first'), ('second');").unwrap();
        assert!(service.join("data/db/app.sqlite-wal").metadata().unwrap().len() > 0, "the rows sit in the log");

        let built = take(&root, &service, &declared("db/app.sqlite"), 1 << 20).unwrap();
        assert!(built.size > 0 && built.sha256.len() == 64);
        check(built._temp.path()).unwrap();
        let code = |path: &str, max: u64| take(&root, &service, &declared(path), max).err().map(|e| e.code.to_string());
        let too_small = code("db/app.sqlite", 16);
        assert_eq!(too_small.as_deref(), Some("backup-too-large"));
        assert_eq!(code("db/none.sqlite", 1 << 20).as_deref(), Some("database-missing"));
        fs::write(service.join("data/plain.txt"), b"not a database, but long enough to be read as a header....").unwrap();
        assert_eq!(code("plain.txt", 1 << 20).as_deref(), Some("database-unreadable"));

        let staging = dir.path().join("staging");
        fs::create_dir_all(staging.join("data")).unwrap();
        fs::write(staging.join("data/db"), b"a file where the directory goes").unwrap();
        assert_eq!(place(&staging, &declared("db/app.sqlite"), built._temp.path()).unwrap_err().code, "restore-failed");
        fs::remove_file(staging.join("data/db")).unwrap();
        place(&staging, &declared("db/app.sqlite"), built._temp.path()).unwrap();
        let restored = rusqlite::Connection::open(staging.join("data/db/app.sqlite")).unwrap();
        let rows: i64 = restored.query_row("SELECT count(*) FROM notes", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, 2);

        fs::write(dir.path().join("garbage.db"), vec![7u8; 4096]).unwrap();
        assert_eq!(check(&dir.path().join("garbage.db")).unwrap_err().code, "database-closure-invalid");
    }
}
