//! The document store: one API, two backends (SQLite embedded; MongoDB in production).
//!
//! Documents are JSON objects under an `id` with a `revision` that every write advances.
//! All work happens inside a transaction ([`Store::transact`]); replace and delete state the
//! revision they read (compare-and-swap). Transient contention retries with backoff inside the
//! store's budget, so callers see either a committed result or a named refusal.

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
pub mod migrate;
#[cfg(feature = "mongodb")]
pub mod mongo;
pub mod sqlite;

pub use capstan_core::refusal;

use async_trait::async_trait;
use capstan_core::refusal::{Refusal, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A stored document: its id, current revision and JSON data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// The document's id, unique within its collection (1 to 256 bytes, no control characters).
    pub id: String,
    /// Starts at 1 on insert and goes up by one on every replace.
    pub revision: u64,
    /// Always a JSON object.
    pub data: Value,
}

/// One page of `find` or `scan` results, in id order.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The documents on this page, at most the requested limit.
    pub documents: Vec<Document>,
    /// Pass back as `cursor` to continue after the last document; `None` when done.
    pub next_cursor: Option<String>,
}

impl Page {
    /// A page from a query that fetched `limit + 1` rows: the extra row only says more remain.
    pub fn from_overfetch(mut documents: Vec<Document>, limit: usize) -> Page {
        let next_cursor = if documents.len() > limit {
            documents.truncate(limit);
            documents.last().map(|d| d.id.clone())
        } else {
            None
        };
        Page { documents, next_cursor }
    }
}

/// A collection and the indexes `find` may use. Declared in code, created at startup.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionSpec {
    /// The collection name, matching `[a-z][a-z0-9_]{0,63}`.
    pub name: String,
    /// The indexes declared on the collection.
    pub indexes: Vec<IndexSpec>,
}

/// An index over one or more fields of `data` (dotted paths). A document missing one of the
/// fields (or holding `null`) is not indexed, so unique indexes only bind present values.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexSpec {
    /// The index name, unique within its collection: 1 to 64 ASCII letters, digits or `_`.
    pub name: String,
    /// Dotted paths into `data`, in the order `find` takes their values.
    pub fields: Vec<String>,
    /// Whether no two documents may hold the same values in `fields`.
    pub unique: bool,
}

impl CollectionSpec {
    /// A collection named `name`, with no indexes yet.
    pub fn new(name: &str) -> Self {
        CollectionSpec { name: name.into(), indexes: Vec::new() }
    }

    /// Add a non-unique index `name` over `fields` (dotted paths into `data`).
    pub fn index(mut self, name: &str, fields: &[&str]) -> Self {
        self.indexes.push(IndexSpec { name: name.into(), fields: fields.iter().map(|f| f.to_string()).collect(), unique: false });
        self
    }

    /// Add a unique index `name` over `fields` (dotted paths into `data`).
    pub fn unique(mut self, name: &str, fields: &[&str]) -> Self {
        self.indexes.push(IndexSpec { name: name.into(), fields: fields.iter().map(|f| f.to_string()).collect(), unique: true });
        self
    }

    /// Check the collection name, and that index names are distinct identifiers over dotted field
    /// paths; refuses `invalid-collection` or `invalid-index` otherwise.
    pub fn validate(&self) -> Result<()> {
        validate_collection(&self.name)?;
        let mut seen = std::collections::HashSet::new();
        for index in &self.indexes {
            if !is_identifier(&index.name) || !seen.insert(&index.name) {
                return Err(Refusal::new(
                    "invalid-index",
                    format!("index name {:?} on {} is not a unique identifier", index.name, self.name),
                ));
            }
            if index.fields.is_empty() || index.fields.iter().any(|f| !f.split('.').all(is_identifier)) {
                return Err(Refusal::new("invalid-index", format!("index {} on {} needs dotted field paths", index.name, self.name)));
            }
        }
        Ok(())
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Largest page `find` and `scan` return, whatever the caller asks for.
pub const MAX_PAGE: usize = 1000;
/// Largest document, serialized.
pub const MAX_DOCUMENT_BYTES: usize = 4 * 1024 * 1024;

/// Refuses `invalid-collection` unless `name` matches `[a-z][a-z0-9_]{0,63}`.
pub fn validate_collection(name: &str) -> Result<()> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok { Ok(()) } else { Err(Refusal::new("invalid-collection", format!("collection name {name:?} must match [a-z][a-z0-9_]{{0,63}}"))) }
}

/// Refuses `invalid-id` unless `id` is 1 to 256 bytes without control characters.
pub fn validate_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 256 || id.chars().any(char::is_control) {
        return Err(Refusal::new("invalid-id", "document ids are 1 to 256 bytes without control characters"));
    }
    Ok(())
}

fn validate_data(data: &Value) -> Result<()> {
    if !data.is_object() {
        return Err(Refusal::new("invalid-document", "document data must be a JSON object"));
    }
    Ok(())
}

fn validate_limit(limit: usize) -> Result<usize> {
    if limit == 0 {
        return Err(Refusal::invalid_request("limit must be at least 1"));
    }
    Ok(limit.min(MAX_PAGE))
}

/// One open transaction on a backend. Dropping it without `commit` rolls it back.
#[async_trait]
pub trait TxnBackend: Send {
    /// The document `id` in `collection`, or `None` when absent.
    async fn get(&mut self, collection: &str, id: &str) -> Result<Option<Document>>;
    /// Refuses `exists` when the id (or a unique index value) is taken.
    async fn insert(&mut self, collection: &str, id: &str, data: Value) -> Result<Document>;
    /// Refuses `not-found` when absent, `conflict` when the revision moved on.
    async fn replace(&mut self, collection: &str, id: &str, expected_revision: u64, data: Value) -> Result<Document>;
    /// Refuses `not-found` when absent, `conflict` when the revision moved on.
    async fn delete(&mut self, collection: &str, id: &str, expected_revision: u64) -> Result<()>;
    /// Documents whose indexed fields equal `key`, in id order, after `cursor`.
    async fn find(&mut self, spec: &CollectionSpec, index: &IndexSpec, key: &[Value], cursor: Option<&str>, limit: usize) -> Result<Page>;
    /// Every document of a collection, in id order, after `cursor`.
    async fn scan(&mut self, collection: &str, cursor: Option<&str>, limit: usize) -> Result<Page>;
    /// Insert a document at the revision it had elsewhere (restoring a snapshot); refuses
    /// `exists` like `insert`.
    async fn insert_at(&mut self, collection: &str, id: &str, revision: u64, data: Value) -> Result<Document>;
    /// Make the transaction's writes durable; may refuse `store-busy` on contention.
    async fn commit(&mut self) -> Result<()>;
}

/// A database behind [`Store`] (SQLite or MongoDB): creates collections and opens transactions.
#[async_trait]
pub trait StoreBackend: Send + Sync {
    /// A short description for status output, never including credentials.
    fn describe(&self) -> String;
    /// Create the collection and its indexes if missing; replace indexes whose definition changed.
    async fn ensure_collection(&self, spec: &CollectionSpec) -> Result<()>;
    /// Start a transaction.
    async fn begin(&self) -> Result<Box<dyn TxnBackend>>;
    /// Names of collections holding at least one document.
    async fn populated_collections(&self) -> Result<Vec<String>>;
    /// Prove the backend answers.
    async fn ping(&self) -> Result<()>;

    /// The documents `reads` name (collection, id), each `None` when absent, read in one
    /// read-only transaction (so from one snapshot). A backend may do it in one round trip;
    /// by default it is `begin`, one `get` per document and `commit`.
    async fn get_many(&self, reads: &[(&str, &str)]) -> Result<Vec<Option<Document>>> {
        let mut txn = self.begin().await?;
        let mut found = Vec::with_capacity(reads.len());
        for (collection, id) in reads {
            found.push(txn.get(collection, id).await?);
        }
        txn.commit().await?;
        Ok(found)
    }
}

/// What [`Store::watch_writes`] calls with the collection and id of a document a transaction
/// of this process wrote.
pub type WriteWatcher = Arc<dyn Fn(&str, &str) + Send + Sync>;

type Watchers = Arc<std::sync::RwLock<Vec<(Vec<String>, WriteWatcher)>>>;

/// The store handle the host passes around.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn StoreBackend>,
    specs: Arc<std::sync::RwLock<std::collections::HashMap<String, CollectionSpec>>>,
    watchers: Watchers,
    budget: Duration,
}

/// How to open a store besides its URL.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// MongoDB database name; the one the URL names (else `capstan`) when absent.
    pub database_name: Option<String>,
    /// Time a transaction may spend retrying transient contention.
    pub budget: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { database_name: None, budget: DEFAULT_BUDGET }
    }
}

/// Default time a transaction may spend retrying transient contention.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(5);

impl Store {
    /// A store over `backend` whose transactions retry transient contention for up to `budget`.
    pub fn new(backend: impl StoreBackend + 'static, budget: Duration) -> Self {
        Store { backend: Arc::new(backend), specs: Default::default(), watchers: Default::default(), budget }
    }

    /// Open the backend a `CAPSTAN_DATABASE_URL` names.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self> {
        let budget = options.budget;
        if let Some(path) = url.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(Refusal::new(
                    "config-invalid",
                    "CAPSTAN_DATABASE_URL sqlite: needs a file path, e.g. sqlite:/var/lib/capstan/capstan.sqlite",
                ));
            }
            return Ok(Store::new(sqlite::SqliteStore::open(path)?, budget));
        }
        if url.starts_with("mongodb://") || url.starts_with("mongodb+srv://") {
            #[cfg(feature = "mongodb")]
            return Ok(Store::new(mongo::MongoStore::open(url, options.database_name.as_deref()).await?, budget));
            #[cfg(not(feature = "mongodb"))]
            return Err(Refusal::new(
                "store-backend-unavailable",
                "this build of Capstan has no MongoDB backend (the store crate's mongodb feature)",
            ));
        }
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
        Err(Refusal::new("config-invalid", format!("CAPSTAN_DATABASE_URL must start with sqlite: or mongodb:// (got scheme {scheme:?})")))
    }

    /// The backend's short description for status output, never including credentials.
    pub fn describe(&self) -> String {
        self.backend.describe()
    }

    /// Prove the backend answers.
    pub async fn ping(&self) -> Result<()> {
        self.backend.ping().await
    }

    /// Names of collections holding at least one document.
    pub async fn populated_collections(&self) -> Result<Vec<String>> {
        self.backend.populated_collections().await
    }

    /// Declare a collection: created (with its indexes) if missing, remembered for `find`.
    pub async fn declare(&self, spec: CollectionSpec) -> Result<()> {
        spec.validate()?;
        self.backend.ensure_collection(&spec).await?;
        self.specs.write().expect("store specs lock").insert(spec.name.clone(), spec);
        Ok(())
    }

    /// Call `watcher` with (collection, id) for every document of `collections` that a
    /// transaction of this store (or of any clone of it) inserted, replaced or deleted, once
    /// that transaction has ended: after its commit, or after it rolled back (a harmless extra
    /// call), never before. Writes by other processes sharing the database are not seen.
    /// For caches of durable state, which drop what a write may have changed.
    pub fn watch_writes(&self, collections: &[&str], watcher: WriteWatcher) {
        let collections = collections.iter().map(|c| c.to_string()).collect();
        self.watchers.write().expect("store watchers lock").push((collections, watcher));
    }

    /// The documents `reads` name (collection, id), each `None` when absent, read from one
    /// snapshot in a short read-only transaction that the backend may run in one call (SQLite:
    /// one blocking call on one connection rather than one per statement). Transient
    /// contention is retried inside the budget like [`Store::transact`].
    pub async fn read_many(&self, reads: &[(&str, &str)]) -> Result<Vec<Option<Document>>> {
        {
            let specs = self.specs.read().expect("store specs lock");
            for (collection, id) in reads {
                if !specs.contains_key(*collection) {
                    return Err(Refusal::internal(format!("collection {collection} was never declared")));
                }
                validate_id(id)?;
            }
        }
        let started = Instant::now();
        let mut attempt: u32 = 0;
        loop {
            match self.backend.get_many(reads).await {
                Err(e) if e.is("store-busy") && started.elapsed() < self.budget => {
                    metrics::counter!("capstan_store_transaction_retries_total").increment(1);
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                other => {
                    record_transaction(&other, started, Access::Read);
                    return other;
                }
            }
        }
    }

    /// Run `work` in a transaction and commit it. Transient contention (`store-busy`) restarts
    /// the whole closure with backoff until the budget is spent; any other refusal rolls back
    /// and is returned as is. The closure may therefore run more than once: keep side effects
    /// outside the store out of it.
    pub async fn transact<T, F, Fut>(&self, mut work: F) -> Result<T>
    where
        F: FnMut(Tx) -> Fut + Send,
        Fut: Future<Output = Result<T>> + Send,
        T: Send,
    {
        let started = Instant::now();
        let mut attempt: u32 = 0;
        loop {
            let written: Written = Default::default();
            let wrote = Arc::new(AtomicBool::new(false));
            let result: Result<T> = async {
                let inner = self.backend.begin().await?;
                let tx = Tx {
                    inner: Arc::new(tokio::sync::Mutex::new(Some(inner))),
                    specs: self.specs.clone(),
                    watchers: self.watchers.clone(),
                    written: written.clone(),
                    wrote: wrote.clone(),
                };
                let value = work(tx.clone()).await?;
                let mut guard = tx.inner.lock().await;
                let mut open = guard.take().ok_or_else(closed)?;
                open.commit().await?;
                Ok(value)
            }
            .await;
            // the transaction has ended (committed, or rolled back when its handle dropped)
            self.tell_watchers(&written);
            match result {
                Err(e) if e.is("store-busy") && started.elapsed() < self.budget => {
                    metrics::counter!("capstan_store_transaction_retries_total").increment(1);
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                other => {
                    let access = if wrote.load(Ordering::Relaxed) { Access::Write } else { Access::Read };
                    record_transaction(&other, started, access);
                    return other;
                }
            }
        }
    }

    /// One read-only transaction over every collection, for a consistent copy of the whole
    /// store (a snapshot of Capstan): collections need not be declared in this process.
    pub async fn read_everything(&self) -> Result<ReadEverything> {
        let collections = self.backend.populated_collections().await?;
        let txn = self.backend.begin().await?;
        Ok(ReadEverything { collections, txn })
    }

    /// Write `documents` into `collection` at their own revisions, in one transaction (retried
    /// on transient contention inside the budget), creating the collection without indexes
    /// when missing: the host declares its indexes when it starts. For restoring a snapshot
    /// into an empty store only; refuses `exists` for a document already there.
    pub async fn restore_documents(&self, collection: &str, documents: &[Document]) -> Result<()> {
        validate_collection(collection)?;
        for document in documents {
            validate_id(&document.id)?;
            validate_data(&document.data)?;
            if document.revision == 0 {
                return Err(Refusal::invalid_request(format!("{collection}/{} has revision 0", document.id)));
            }
        }
        let known = self.specs.read().expect("store specs lock").contains_key(collection);
        if !known {
            self.backend.ensure_collection(&CollectionSpec::new(collection)).await?;
        }
        let started = Instant::now();
        let mut attempt: u32 = 0;
        loop {
            let result: Result<()> = async {
                let mut txn = self.backend.begin().await?;
                for document in documents {
                    txn.insert_at(collection, &document.id, document.revision, document.data.clone()).await?;
                }
                txn.commit().await
            }
            .await;
            match result {
                Err(e) if e.is("store-busy") && started.elapsed() < self.budget => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                }
                other => return other,
            }
        }
    }

    fn tell_watchers(&self, written: &Written) {
        let written = std::mem::take(&mut *written.lock().expect("store written lock"));
        if written.is_empty() {
            return;
        }
        let watchers = self.watchers.read().expect("store watchers lock");
        for (collection, id) in &written {
            for (_, watcher) in watchers.iter().filter(|(collections, _)| collections.contains(collection)) {
                watcher(collection, id);
            }
        }
    }
}

/// Whether a finished transaction wrote: `write` when its last attempt inserted, replaced or
/// deleted a document (or tried to), `read` otherwise ([`Store::read_many`] included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

impl Access {
    fn label(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// Count a finished transaction by outcome (`committed`, `conflict`, `busy` once the budget is
/// spent, `refused` for any other refusal) and access (`read`, `write`) with its time, retries
/// included (`/metrics`).
fn record_transaction<T>(result: &Result<T>, started: Instant, access: Access) {
    let outcome = match result {
        Ok(_) => "committed",
        Err(e) if e.is("conflict") => "conflict",
        Err(e) if e.is("store-busy") => "busy",
        Err(_) => "refused",
    };
    metrics::counter!("capstan_store_transactions_total", "outcome" => outcome, "access" => access.label()).increment(1);
    metrics::histogram!("capstan_store_transaction_duration_seconds").record(started.elapsed().as_secs_f64());
}

/// The wait before retrying transient contention the `attempt`th time.
fn backoff(attempt: u32) -> Duration {
    let backoff = Duration::from_millis((5u64 << attempt.min(6)).min(250));
    let jitter = Duration::from_millis(rand::random::<u64>() % 5);
    backoff + jitter
}

/// The watched documents a transaction wrote: (collection, id).
type Written = Arc<std::sync::Mutex<Vec<(String, String)>>>;

fn closed() -> Refusal {
    Refusal::internal("transaction used after it ended")
}

/// A handle on the current transaction, cheap to clone; valid until `transact` commits.
#[derive(Clone)]
pub struct Tx {
    inner: Arc<tokio::sync::Mutex<Option<Box<dyn TxnBackend>>>>,
    specs: Arc<std::sync::RwLock<std::collections::HashMap<String, CollectionSpec>>>,
    watchers: Watchers,
    written: Written,
    /// Set by every insert, replace and delete: the transaction counts as a write.
    wrote: Arc<AtomicBool>,
}

impl Tx {
    fn spec(&self, collection: &str) -> Result<CollectionSpec> {
        self.specs
            .read()
            .expect("store specs lock")
            .get(collection)
            .cloned()
            .ok_or_else(|| Refusal::internal(format!("collection {collection} was never declared")))
    }

    /// Whether `collection` was declared on this store (a subsystem not yet started has none).
    pub fn is_declared(&self, collection: &str) -> bool {
        self.specs.read().expect("store specs lock").contains_key(collection)
    }

    /// Remember a write of a watched collection, for [`Store::watch_writes`].
    fn note_write(&self, collection: &str, id: &str) {
        self.wrote.store(true, Ordering::Relaxed);
        let watched = self.watchers.read().expect("store watchers lock").iter().any(|(c, _)| c.iter().any(|c| c == collection));
        if watched {
            self.written.lock().expect("store written lock").push((collection.to_string(), id.to_string()));
        }
    }

    /// The open transaction, after checking the collection was declared.
    async fn open(&self, collection: &str) -> Result<OpenTxn<'_>> {
        self.spec(collection)?;
        let guard = self.inner.lock().await;
        if guard.is_none() {
            return Err(closed());
        }
        Ok(OpenTxn(guard))
    }

    /// The document `id` in the declared `collection`, or `None` when absent.
    pub async fn get(&self, collection: &str, id: &str) -> Result<Option<Document>> {
        validate_id(id)?;
        self.open(collection).await?.get().get(collection, id).await
    }

    /// Like `get`, but an absent document is the refusal `not-found`.
    pub async fn require(&self, collection: &str, id: &str) -> Result<Document> {
        self.get(collection, id).await?.ok_or_else(|| Refusal::not_found(format!("{collection}/{id}")))
    }

    /// Insert a new document at revision 1; refuses `exists` when the id (or a unique index value)
    /// is taken.
    pub async fn insert(&self, collection: &str, id: &str, data: Value) -> Result<Document> {
        validate_id(id)?;
        validate_data(&data)?;
        self.note_write(collection, id);
        self.open(collection).await?.get().insert(collection, id, data).await
    }

    /// Replace the data of a document still at `expected_revision`, advancing its revision; refuses
    /// `not-found` when absent, `conflict` when the revision moved on.
    pub async fn replace(&self, collection: &str, id: &str, expected_revision: u64, data: Value) -> Result<Document> {
        validate_id(id)?;
        validate_data(&data)?;
        self.note_write(collection, id);
        self.open(collection).await?.get().replace(collection, id, expected_revision, data).await
    }

    /// Insert when `expected_revision` is `None` ("I read none"), replace otherwise.
    pub async fn put(&self, collection: &str, id: &str, expected_revision: Option<u64>, data: Value) -> Result<Document> {
        match expected_revision {
            None => self.insert(collection, id, data).await,
            Some(revision) => self.replace(collection, id, revision, data).await,
        }
    }

    /// Delete a document still at `expected_revision`; refuses `not-found` when absent, `conflict`
    /// when the revision moved on.
    pub async fn delete(&self, collection: &str, id: &str, expected_revision: u64) -> Result<()> {
        validate_id(id)?;
        self.note_write(collection, id);
        self.open(collection).await?.get().delete(collection, id, expected_revision).await
    }

    /// One page of documents whose declared `index` equals `key` (one string, number or boolean per
    /// field), in id order after `cursor`; `limit` is capped at [`MAX_PAGE`].
    pub async fn find(&self, collection: &str, index: &str, key: &[Value], cursor: Option<&str>, limit: usize) -> Result<Page> {
        let limit = validate_limit(limit)?;
        let spec = self.spec(collection)?;
        let index_spec = spec
            .indexes
            .iter()
            .find(|i| i.name == index)
            .cloned()
            .ok_or_else(|| Refusal::internal(format!("index {index} is not declared on {collection}")))?;
        if key.len() != index_spec.fields.len() {
            return Err(Refusal::invalid_request(format!("index {index} takes {} values", index_spec.fields.len())));
        }
        if key.iter().any(|v| v.is_null() || v.is_object() || v.is_array()) {
            return Err(Refusal::invalid_request("index values are strings, numbers or booleans"));
        }
        self.open(collection).await?.get().find(&spec, &index_spec, key, cursor, limit).await
    }

    /// Every document whose `index` matches `key`, read page by page in this transaction.
    pub async fn find_all(&self, collection: &str, index: &str, key: &[Value]) -> Result<Vec<Document>> {
        let mut found = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self.find(collection, index, key, cursor.as_deref(), MAX_PAGE).await?;
            found.extend(page.documents);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(found),
            }
        }
    }

    /// One page of every document in `collection`, in id order after `cursor`; `limit` is capped at
    /// [`MAX_PAGE`].
    pub async fn scan(&self, collection: &str, cursor: Option<&str>, limit: usize) -> Result<Page> {
        let limit = validate_limit(limit)?;
        self.open(collection).await?.get().scan(collection, cursor, limit).await
    }
}

/// A read-only transaction over the whole store ([`Store::read_everything`]): every page it
/// reads comes from one snapshot of the database.
pub struct ReadEverything {
    collections: Vec<String>,
    txn: Box<dyn TxnBackend>,
}

impl ReadEverything {
    /// The collections holding documents when the copy began, in name order.
    pub fn collections(&self) -> &[String] {
        &self.collections
    }

    /// One page of `collection` in id order after `cursor`; `limit` is capped at [`MAX_PAGE`].
    pub async fn scan(&mut self, collection: &str, cursor: Option<&str>, limit: usize) -> Result<Page> {
        validate_collection(collection)?;
        let limit = validate_limit(limit)?;
        self.txn.scan(collection, cursor, limit).await
    }

    /// End the transaction (it wrote nothing).
    pub async fn finish(mut self) -> Result<()> {
        self.txn.commit().await
    }
}

struct OpenTxn<'a>(tokio::sync::MutexGuard<'a, Option<Box<dyn TxnBackend>>>);

impl OpenTxn<'_> {
    fn get(&mut self) -> &mut dyn TxnBackend {
        self.0.as_mut().expect("checked open").as_mut()
    }
}

/// The refusal every backend gives for a duplicate id or unique value.
pub fn exists(collection: &str, id: &str, index: Option<&str>) -> Refusal {
    match index {
        None => Refusal::new("exists", format!("{collection}/{id} already exists"))
            .with_data(serde_json::json!({"collection": collection, "id": id})),
        Some(index) => Refusal::new("exists", format!("another document in {collection} already holds this {index}"))
            .with_data(serde_json::json!({"collection": collection, "index": index})),
    }
}

/// The refusal every backend gives for a stale expected revision.
pub fn conflict(collection: &str, id: &str, expected: u64, actual: u64) -> Refusal {
    Refusal::new("conflict", format!("{collection}/{id} is at revision {actual}, not {expected}"))
        .with_data(serde_json::json!({"collection": collection, "id": id, "expectedRevision": expected, "revision": actual}))
}

/// The refusal for transient contention; `transact` retries it inside the budget.
pub fn busy(detail: impl std::fmt::Display) -> Refusal {
    Refusal::new("store-busy", "the store is busy; try again").retryable().detail(detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A backend that is always busy, counting how often a transaction was attempted.
    struct AlwaysBusy(Arc<AtomicUsize>);

    #[async_trait]
    impl StoreBackend for AlwaysBusy {
        fn describe(&self) -> String {
            "busy:".into()
        }
        async fn ensure_collection(&self, _: &CollectionSpec) -> Result<()> {
            Ok(())
        }
        async fn begin(&self) -> Result<Box<dyn TxnBackend>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(busy("locked by another writer"))
        }
        async fn populated_collections(&self) -> Result<Vec<String>> {
            Ok(vec![])
        }
        async fn ping(&self) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn transient_contention_is_retried_until_the_budget_is_spent() {
        let attempts = Arc::new(AtomicUsize::new(0));
        let store = Store::new(AlwaysBusy(attempts.clone()), Duration::from_millis(100));
        let err = store.transact(|_tx| async move { Ok(()) }).await.unwrap_err();
        assert_eq!(err.code, "store-busy");
        assert!(err.retryable, "the caller may try again later");
        assert!(attempts.load(Ordering::SeqCst) > 1, "retried before giving up");
    }

    #[tokio::test]
    async fn other_refusals_are_not_retried() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), DEFAULT_BUDGET);
        store.declare(CollectionSpec::new("things")).await.unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let err = store
            .transact(|_tx| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(Refusal::new("conflict", "stale"))
                }
            })
            .await
            .unwrap_err();
        assert_eq!((err.code.as_ref(), runs.load(Ordering::SeqCst)), ("conflict", 1));
    }

    /// Counts every counter by its name and labels (`name{k=v,…}`).
    #[derive(Default)]
    struct Counters(std::sync::Mutex<std::collections::BTreeMap<String, Arc<std::sync::atomic::AtomicU64>>>);

    impl Counters {
        fn get(&self, key: &str) -> u64 {
            self.0.lock().unwrap().get(key).map_or(0, |c| c.load(Ordering::SeqCst))
        }
    }

    impl metrics::Recorder for Counters {
        fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
        fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
        fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
        fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
            let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            metrics::Counter::from_arc(self.0.lock().unwrap().entry(name).or_default().clone())
        }
        fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            metrics::Gauge::noop()
        }
        fn register_histogram(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn transactions_are_counted_as_reads_or_writes() {
        let counters = Counters::default();
        let _recording = metrics::set_default_local_recorder(&counters);
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), DEFAULT_BUDGET);
        store.declare(CollectionSpec::new("things")).await.unwrap();
        store.transact(|tx| async move { tx.insert("things", "a", serde_json::json!({})).await }).await.unwrap();
        store.transact(|tx| async move { tx.get("things", "a").await }).await.unwrap();
        store.transact(|tx| async move { tx.scan("things", None, 10).await }).await.unwrap();
        store.read_many(&[("things", "a"), ("things", "b")]).await.unwrap();
        // a write refused is still a write, counted under its outcome
        let err = store.transact(|tx| async move { tx.replace("things", "a", 7, serde_json::json!({})).await }).await.unwrap_err();
        assert!(err.is("conflict"), "{err}");
        let count =
            |outcome: &str, access: &str| counters.get(&format!("capstan_store_transactions_total{{outcome={outcome},access={access}}}"));
        assert_eq!(count("committed", "write"), 1);
        assert_eq!(count("committed", "read"), 3, "two transactions that only read, and one read_many");
        assert_eq!(count("conflict", "write"), 1);
    }
}
