//! SQLite backend (embedded default): one table per collection, indexes as expression indexes
//! over the JSON data, WAL journal, a small pool of connections.
//!
//! Transactions start deferred and optimistic: a writer that finds its snapshot stale, or the
//! database locked past the busy timeout, gets `store-busy` and [`super::Store::transact`]
//! restarts it. SQLite calls are short and local, so they run inline (with `block_in_place` on
//! the multi-threaded runtime so other tasks keep moving).

use super::{CollectionSpec, Document, IndexSpec, Page, StoreBackend, TxnBackend, busy, conflict, exists};
use async_trait::async_trait;
use capstan_core::refusal::{Refusal, Result};
use rusqlite::{Connection, ErrorCode, OptionalExtension, params, types::Value as SqlValue};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

const POOL_SIZE: usize = 4;
const BUSY_TIMEOUT: Duration = Duration::from_millis(250);

/// The SQLite backend: one database file and a pool of up to four connections.
pub struct SqliteStore {
    path: PathBuf,
    idle: Arc<Mutex<Vec<Connection>>>,
    permits: Arc<Semaphore>,
}

impl SqliteStore {
    /// Open (creating if needed) the database file; its directory must exist or be creatable.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| unavailable("creating the database directory", e))?;
        }
        // a new database file is the owner's alone (SQLite gives its -wal and -shm files the
        // same mode); an existing one keeps the mode its operator chose
        {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| unavailable("creating the database file", e))?;
        }
        let first = connect(&path)?;
        Ok(SqliteStore { path, idle: Arc::new(Mutex::new(vec![first])), permits: Arc::new(Semaphore::new(POOL_SIZE)) })
    }

    async fn connection(&self) -> Result<Pooled> {
        let permit = self.permits.clone().acquire_owned().await.map_err(Refusal::internal)?;
        let reused = self.idle.lock().expect("sqlite pool lock").pop();
        let conn = match reused {
            Some(conn) => conn,
            None => blocking(|| connect(&self.path))?,
        };
        Ok(Pooled { conn: Some(conn), idle: self.idle.clone(), _permit: permit })
    }
}

/// How long opening a connection keeps trying while other processes hold the database (nodes
/// started together on one file race to switch it to WAL, which needs it alone).
const CONFIGURE_BUDGET: Duration = Duration::from_secs(10);

fn connect(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).map_err(|e| unavailable("opening the SQLite database", e))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| unavailable("configuring SQLite", e))?;
    let deadline = std::time::Instant::now() + CONFIGURE_BUDGET;
    let mut pause = Duration::from_millis(10);
    loop {
        match configure(&conn) {
            Ok(()) => return Ok(conn),
            Err(e)
                if matches!(e.sqlite_error_code(), Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked))
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(map_err(e, "configuring SQLite")),
        }
    }
}

/// WAL (switched once: the mode is kept in the file, so a connection to a database already in
/// WAL needs no exclusive lock), and FULL sync: a committed write survives power loss, which a
/// control plane's state must.
fn configure(conn: &Connection) -> rusqlite::Result<()> {
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get::<_, String>(0))?;
    }
    conn.execute_batch("PRAGMA synchronous=FULL;")
}

/// A connection borrowed from the pool; returned on drop (rolled back if a transaction is open).
struct Pooled {
    conn: Option<Connection>,
    idle: Arc<Mutex<Vec<Connection>>>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if !conn.is_autocommit() && conn.execute_batch("ROLLBACK").is_err() {
                return; // a connection we cannot reset is dropped, not reused
            }
            self.idle.lock().expect("sqlite pool lock").push(conn);
        }
    }
}

impl std::ops::Deref for Pooled {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn.as_ref().expect("pooled connection")
    }
}

/// Run a short blocking SQLite call without stalling the other tasks of a multi-threaded runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Refusal {
    Refusal::new("store-unavailable", format!("{what} failed")).retryable().detail(e)
}

fn map_err(e: rusqlite::Error, what: &str) -> Refusal {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => busy(format!("{what}: {e}")),
        _ => unavailable(what, e),
    }
}

fn table(collection: &str) -> String {
    // collection names are validated to [a-z][a-z0-9_]*, so quoting is enough
    format!("\"c_{collection}\"")
}

fn index_sql_name(collection: &str, index: &IndexSpec) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{}|{}|{}", index.name, index.fields.join(","), index.unique));
    format!("ix_{collection}__{}__{}", index.name, &hex::encode(digest)[..8])
}

fn json_path(field: &str) -> String {
    // fields are validated dotted identifiers
    format!("json_extract(data, '$.{field}')")
}

fn to_sql(v: &Value) -> SqlValue {
    match v {
        Value::String(s) => SqlValue::Text(s.clone()),
        Value::Bool(b) => SqlValue::Integer(*b as i64),
        Value::Number(n) => match n.as_i64() {
            Some(i) => SqlValue::Integer(i),
            None => SqlValue::Real(n.as_f64().unwrap_or(f64::NAN)),
        },
        _ => SqlValue::Null,
    }
}

fn row_to_document(id: String, revision: i64, data: String) -> Result<Document> {
    let data = serde_json::from_str(&data).map_err(|e| Refusal::internal(format!("stored document {id} is not JSON: {e}")))?;
    Ok(Document { id, revision: revision as u64, data })
}

#[async_trait]
impl StoreBackend for SqliteStore {
    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    async fn ensure_collection(&self, spec: &CollectionSpec) -> Result<()> {
        let conn = self.connection().await?;
        blocking(|| {
            // one transaction: a refused index change leaves the old indexes in place
            conn.execute_batch("BEGIN IMMEDIATE").map_err(|e| map_err(e, "starting a schema change"))?;
            let t = table(&spec.name);
            conn.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS {t} (id TEXT PRIMARY KEY NOT NULL, revision INTEGER NOT NULL, data TEXT NOT NULL) WITHOUT ROWID"
            ))
            .map_err(|e| map_err(e, "creating a collection"))?;
            let wanted: Vec<(String, &IndexSpec)> = spec.indexes.iter().map(|i| (index_sql_name(&spec.name, i), i)).collect();
            let mut stmt = conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1 AND name LIKE 'ix\\_%' ESCAPE '\\'")
                .map_err(|e| map_err(e, "reading indexes"))?;
            let existing: Vec<String> = stmt
                .query_map([format!("c_{}", spec.name)], |r| r.get(0))
                .and_then(|rows| rows.collect())
                .map_err(|e| map_err(e, "reading indexes"))?;
            for name in existing.iter().filter(|n| !wanted.iter().any(|(w, _)| w == *n)) {
                conn.execute_batch(&format!("DROP INDEX \"{name}\"")).map_err(|e| map_err(e, "dropping an old index"))?;
            }
            for (name, index) in wanted.iter().filter(|(w, _)| !existing.contains(w)) {
                let exprs: Vec<String> = index.fields.iter().map(|f| json_path(f)).collect();
                let present = exprs.iter().map(|e| format!("{e} IS NOT NULL")).collect::<Vec<_>>().join(" AND ");
                // a plain index also carries the id, so a page of equal values comes in id order
                let (unique, columns) =
                    if index.unique { ("UNIQUE ", exprs.join(", ")) } else { ("", format!("{}, id", exprs.join(", "))) };
                conn.execute_batch(&format!("CREATE {unique}INDEX \"{name}\" ON {t} ({columns}) WHERE {present}")).map_err(|e| match e
                    .sqlite_error_code()
                {
                    Some(ErrorCode::ConstraintViolation) => Refusal::new(
                        "index-build-failed",
                        format!("unique index {} on {} cannot be built: existing documents share a value", index.name, spec.name),
                    ),
                    _ => map_err(e, "creating an index"),
                })?;
            }
            conn.execute_batch("COMMIT").map_err(|e| map_err(e, "committing a schema change"))
        })
    }

    async fn begin(&self) -> Result<Box<dyn TxnBackend>> {
        let conn = self.connection().await?;
        blocking(|| conn.execute_batch("BEGIN DEFERRED")).map_err(|e| map_err(e, "starting a transaction"))?;
        Ok(Box::new(SqliteTxn { conn }))
    }

    async fn populated_collections(&self) -> Result<Vec<String>> {
        let conn = self.connection().await?;
        blocking(|| {
            let mut stmt = conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'c\\_%' ESCAPE '\\' ORDER BY name")
                .map_err(|e| map_err(e, "listing collections"))?;
            let tables: Vec<String> =
                stmt.query_map([], |r| r.get(0)).and_then(|rows| rows.collect()).map_err(|e| map_err(e, "listing collections"))?;
            let mut populated = Vec::new();
            for t in tables {
                let any: bool = conn
                    .query_row(&format!("SELECT EXISTS (SELECT 1 FROM \"{t}\")"), [], |r| r.get(0))
                    .map_err(|e| map_err(e, "counting documents"))?;
                if any {
                    populated.push(t["c_".len()..].to_string());
                }
            }
            Ok(populated)
        })
    }

    async fn ping(&self) -> Result<()> {
        let conn = self.connection().await?;
        blocking(|| conn.query_row("SELECT 1", [], |_| Ok(()))).map_err(|e| map_err(e, "pinging SQLite"))
    }

    /// One connection, one blocking call: `BEGIN`, the reads, `COMMIT` (a read-only
    /// transaction, so one snapshot; the pooled connection rolls back if a read fails).
    async fn get_many(&self, reads: &[(&str, &str)]) -> Result<Vec<Option<Document>>> {
        let conn = self.connection().await?;
        blocking(|| {
            conn.execute_batch("BEGIN DEFERRED").map_err(|e| map_err(e, "starting a transaction"))?;
            let mut found = Vec::with_capacity(reads.len());
            for (collection, id) in reads {
                found.push(read_document(&conn, collection, id)?);
            }
            conn.execute_batch("COMMIT").map_err(|e| map_err(e, "committing"))?;
            Ok(found)
        })
    }
}

fn read_document(conn: &Connection, collection: &str, id: &str) -> Result<Option<Document>> {
    let mut stmt = conn
        .prepare_cached(&format!("SELECT revision, data FROM {} WHERE id = ?1", table(collection)))
        .map_err(|e| map_err(e, "reading a document"))?;
    stmt.query_row([id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))
        .optional()
        .map_err(|e| map_err(e, "reading a document"))?
        .map(|(rev, data)| row_to_document(id.to_string(), rev, data))
        .transpose()
}

struct SqliteTxn {
    conn: Pooled,
}

impl SqliteTxn {
    fn current_revision(&self, collection: &str, id: &str) -> Result<Option<u64>> {
        self.conn
            .query_row(&format!("SELECT revision FROM {} WHERE id = ?1", table(collection)), [id], |r| r.get::<_, i64>(0))
            .optional()
            .map(|r| r.map(|r| r as u64))
            .map_err(|e| map_err(e, "reading a revision"))
    }

    fn write_err(&self, e: rusqlite::Error, collection: &str, id: &str) -> Refusal {
        if let rusqlite::Error::SqliteFailure(err, Some(message)) = &e
            && err.code == ErrorCode::ConstraintViolation
        {
            // "UNIQUE constraint failed: index 'ix_<collection>__<name>__<hash>'"
            let prefix = format!("index 'ix_{collection}__");
            let index = message.split_once(&prefix).and_then(|(_, rest)| rest.rsplit_once("__")).map(|(name, _)| name);
            return exists(collection, id, index);
        }
        map_err(e, "writing a document")
    }

    fn query_page(&self, sql: &str, params: &[SqlValue], limit: usize) -> Result<Page> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| map_err(e, "querying documents"))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(params.iter()), |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
            })
            .and_then(|rows| rows.collect::<std::result::Result<Vec<_>, _>>())
            .map_err(|e| map_err(e, "querying documents"))?;
        let docs = rows.into_iter().map(|(id, rev, data)| row_to_document(id, rev, data)).collect::<Result<Vec<_>>>()?;
        Ok(Page::from_overfetch(docs, limit))
    }
}

fn serialize(data: &Value) -> Result<String> {
    let text = data.to_string();
    if text.len() > super::MAX_DOCUMENT_BYTES {
        return Err(Refusal::new("document-too-large", "a document may hold at most 4 MiB of JSON"));
    }
    Ok(text)
}

#[async_trait]
impl TxnBackend for SqliteTxn {
    async fn get(&mut self, collection: &str, id: &str) -> Result<Option<Document>> {
        blocking(|| read_document(&self.conn, collection, id))
    }

    async fn insert(&mut self, collection: &str, id: &str, data: Value) -> Result<Document> {
        self.insert_at(collection, id, 1, data).await
    }

    async fn replace(&mut self, collection: &str, id: &str, expected_revision: u64, data: Value) -> Result<Document> {
        let text = serialize(&data)?;
        blocking(|| {
            match self.current_revision(collection, id)? {
                None => return Err(Refusal::not_found(format!("{collection}/{id}"))),
                Some(actual) if actual != expected_revision => return Err(conflict(collection, id, expected_revision, actual)),
                Some(_) => {}
            }
            let revision = expected_revision + 1;
            self.conn
                .execute(
                    &format!("UPDATE {} SET revision = ?1, data = ?2 WHERE id = ?3 AND revision = ?4", table(collection)),
                    params![revision as i64, text, id, expected_revision as i64],
                )
                .map_err(|e| self.write_err(e, collection, id))?;
            Ok(Document { id: id.to_string(), revision, data })
        })
    }

    async fn delete(&mut self, collection: &str, id: &str, expected_revision: u64) -> Result<()> {
        blocking(|| {
            match self.current_revision(collection, id)? {
                None => return Err(Refusal::not_found(format!("{collection}/{id}"))),
                Some(actual) if actual != expected_revision => return Err(conflict(collection, id, expected_revision, actual)),
                Some(_) => {}
            }
            self.conn
                .execute(&format!("DELETE FROM {} WHERE id = ?1", table(collection)), [id])
                .map_err(|e| map_err(e, "deleting a document"))?;
            Ok(())
        })
    }

    async fn find(&mut self, spec: &CollectionSpec, index: &IndexSpec, key: &[Value], cursor: Option<&str>, limit: usize) -> Result<Page> {
        let conditions: Vec<String> = index.fields.iter().enumerate().map(|(i, f)| format!("{} = ?{}", json_path(f), i + 1)).collect();
        let mut params: Vec<SqlValue> = key.iter().map(to_sql).collect();
        params.push(SqlValue::Text(cursor.unwrap_or("").to_string()));
        params.push(SqlValue::Integer(limit as i64 + 1));
        let n = key.len();
        let sql = format!(
            "SELECT id, revision, data FROM {} INDEXED BY \"{}\" WHERE {} AND id > ?{} ORDER BY id LIMIT ?{}",
            table(&spec.name),
            index_sql_name(&spec.name, index),
            conditions.join(" AND "),
            n + 1,
            n + 2
        );
        blocking(|| self.query_page(&sql, &params, limit))
    }

    async fn scan(&mut self, collection: &str, cursor: Option<&str>, limit: usize) -> Result<Page> {
        let sql = format!("SELECT id, revision, data FROM {} WHERE id > ?1 ORDER BY id LIMIT ?2", table(collection));
        let params = [SqlValue::Text(cursor.unwrap_or("").to_string()), SqlValue::Integer(limit as i64 + 1)];
        blocking(|| self.query_page(&sql, &params, limit))
    }

    async fn insert_at(&mut self, collection: &str, id: &str, revision: u64, data: Value) -> Result<Document> {
        let text = serialize(&data)?;
        let stored = i64::try_from(revision).map_err(|_| Refusal::invalid_request(format!("revision {revision} is out of range")))?;
        blocking(|| {
            if self.current_revision(collection, id)?.is_some() {
                return Err(exists(collection, id, None));
            }
            self.conn
                .execute(&format!("INSERT INTO {} (id, revision, data) VALUES (?1, ?2, ?3)", table(collection)), params![id, stored, text])
                .map_err(|e| self.write_err(e, collection, id))?;
            Ok(Document { id: id.to_string(), revision, data })
        })
    }

    async fn commit(&mut self) -> Result<()> {
        blocking(|| self.conn.execute_batch("COMMIT")).map_err(|e| map_err(e, "committing"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DEFAULT_BUDGET, Store, conformance};

    fn temp_store(dir: &tempfile::TempDir) -> Store {
        Store::new(SqliteStore::open(dir.path().join("capstan.sqlite")).unwrap(), DEFAULT_BUDGET)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_database_and_its_journal_are_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = temp_store(&dir);
        store.declare(crate::CollectionSpec::new("things")).await.unwrap();
        store.transact(|tx| async move { tx.insert("things", "a", serde_json::json!({})).await }).await.unwrap();
        let mode = |name: &str| std::fs::metadata(dir.path().join(name)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("capstan.sqlite"), 0o600);
        assert_eq!(mode("capstan.sqlite-wal"), 0o600, "SQLite gives its journal the database's mode");
        // an existing file keeps the mode its operator gave it
        let chosen = dir.path().join("chosen.sqlite");
        std::fs::write(&chosen, b"").unwrap();
        std::fs::set_permissions(&chosen, std::fs::Permissions::from_mode(0o640)).unwrap();
        SqliteStore::open(&chosen).unwrap();
        assert_eq!(mode("chosen.sqlite"), 0o640);
    }

    #[test]
    fn opening_waits_while_another_process_holds_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared.sqlite");
        // another node, mid-way through creating the database, holds it alone for longer than
        // one busy wait
        let holder = Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN EXCLUSIVE; CREATE TABLE t(x);").unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(BUSY_TIMEOUT * 3);
            holder.execute_batch("COMMIT").unwrap();
        });
        SqliteStore::open(&path).expect("opened once the other holder let go");
        releaser.join().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        conformance::run_all(&temp_store(&dir)).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn conformance_suite_single_threaded() {
        let dir = tempfile::tempdir().unwrap();
        conformance::run_all(&temp_store(&dir)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_handles_on_one_file_see_each_other_and_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let a = temp_store(&dir);
        let b = temp_store(&dir);
        conformance::two_stores_share_state(&a, &b).await;
    }

    #[tokio::test]
    async fn data_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let spec = CollectionSpec::new("things");
        {
            let store = temp_store(&dir);
            store.declare(spec.clone()).await.unwrap();
            store.transact(|tx| async move { tx.insert("things", "a", serde_json::json!({"n": 1})).await }).await.unwrap();
        }
        let store = temp_store(&dir);
        store.declare(spec).await.unwrap();
        let doc = store.transact(|tx| async move { tx.require("things", "a").await }).await.unwrap();
        assert_eq!(doc.data["n"], 1);
        assert_eq!(store.populated_collections().await.unwrap(), vec!["things".to_string()]);
    }

    #[tokio::test]
    async fn changed_index_definition_is_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let store = temp_store(&dir);
        store.declare(CollectionSpec::new("people").index("by_name", &["name"])).await.unwrap();
        store
            .transact(|tx| async move {
                tx.insert("people", "1", serde_json::json!({"name": "x"})).await?;
                tx.insert("people", "2", serde_json::json!({"name": "x"})).await
            })
            .await
            .unwrap();
        // turning the index unique over duplicate data is refused by name, nothing lost
        let err = store.declare(CollectionSpec::new("people").unique("by_name", &["name"])).await.unwrap_err();
        assert!(err.is("index-build-failed"), "{err}");
        let found =
            store.transact(|tx| async move { tx.find("people", "by_name", &[serde_json::json!("x")], None, 10).await }).await.unwrap();
        assert_eq!(found.documents.len(), 2, "the old index still serves");
        store.declare(CollectionSpec::new("people").unique("by_mail", &["mail"])).await.unwrap();
        let page = store.transact(|tx| async move { tx.scan("people", None, 10).await }).await.unwrap();
        assert_eq!(page.documents.len(), 2);
    }
}
