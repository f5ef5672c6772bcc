//! The audit log: one record for every call of a state-changing method, the host's and
//! plugins' alike — who called (user id, name and kind), which method, the ids it targeted,
//! how it ended (`ok` or the refusal's code), the request's id and when. Never a body value:
//! the targets are the body's top-level `id`/`…Id` members that have the shape of an id.
//!
//! The answer's ids join them on success (`id` of what a call created, `userId`, …).
//!
//! A method is state-changing unless it is declared read-only ([`Method::read_only`]); every
//! plugin method is (the plugin contract declares no read-only flag). The record is written
//! by [`Registry::invoke`] right after the method answered, in a transaction apart from the
//! method's (the methods open their own transactions, often several, or none for a plugin, so
//! the record cannot join them) shared with the records of calls answered at the same moment
//! ([`AuditLog::append`]), and a failure to write it is logged and never turns a done mutation
//! into a refusal.
//!
//! Records are kept under ids that begin with the inverted time of the call, so the store's id
//! order — the primary key of both backends — is newest first: listing walks it from a time
//! bound, and retention deletes the tail.

use super::{Access, Answer, Call, Method, Registry};
use capstan_core::refusal::{Refusal, Result};
use capstan_store::{CollectionSpec, Store};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

/// The audit records.
pub const AUDIT: &str = "audit_records";

/// How many records a listing reads at most per call before it answers with what it found and
/// a cursor to continue (so a filter matching nothing never reads the whole log at once).
const EXAMINED_PER_CALL: usize = 5000;

/// The largest page `audit.list` answers.
pub const MAX_LIMIT: usize = 200;

/// Records kept this many days unless the setting `auditRetentionDays` says otherwise.
pub const DEFAULT_RETENTION_DAYS: u64 = 90;

/// At most this many targets are recorded per call.
const MAX_TARGETS: usize = 8;

/// `10^17 - 1`: microseconds since the epoch subtracted from it give ids that sort newest first
/// (17 digits hold every time until the year 5138).
const INVERTED: u64 = 99_999_999_999_999_999;

/// The collection and its indexes (besides the id, which is the time order).
pub fn collection() -> CollectionSpec {
    CollectionSpec::new(AUDIT).index("by_method", &["method"])
}

/// Declare the audit collection on `store`.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(collection()).await
}

/// The id prefix of records made at `micros` (microseconds since the epoch): every id at that
/// instant sorts after it, every later one before it.
fn time_key(micros: u64) -> String {
    format!("{:017}", INVERTED.saturating_sub(micros))
}

/// Microseconds since the epoch, strictly increasing within this process: records of one node
/// sort in the order they were made.
fn stamp() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(moved) => last = moved,
        }
    }
}

/// A new record's id at `micros`.
fn record_id(micros: u64) -> String {
    format!("{}-{:08x}", time_key(micros), rand::random::<u32>())
}

/// Whether `s` has the shape of an id: 1 to 128 of `A-Z a-z 0-9 _ . : @ -`.
fn id_shaped(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_alphanumeric() || "_.:@-".contains(c))
}

/// The ids a body names: its top-level `id` and `…Id` members (not `mutationId`) holding a
/// string shaped like an id, sorted (a body's member order is no order), at most [`MAX_TARGETS`].
pub fn targets(body: &Value) -> Vec<String> {
    let Some(members) = body.as_object() else { return Vec::new() };
    let mut found: Vec<String> = members
        .iter()
        .filter(|(key, _)| *key == "id" || (key.ends_with("Id") && *key != "mutationId"))
        .filter_map(|(_, value)| value.as_str().filter(|id| id_shaped(id)).map(str::to_string))
        .collect();
    found.sort();
    found.dedup();
    found.truncate(MAX_TARGETS);
    found
}

/// Who made a recorded call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Actor {
    /// The user's id (absent for an anonymous caller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The user's name (absent for an anonymous caller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// `human`, `machine`, `plugin`, … as authentication established it; `anonymous` for a
    /// public method called without a valid token.
    pub kind: String,
}

/// One audit record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The record's id; ids sort newest first.
    #[serde(default)]
    pub id: String,
    /// When the method answered (milliseconds since the epoch).
    pub at: u64,
    /// The method called.
    pub method: String,
    /// The plugin serving it; absent for the host's own methods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// Who called.
    pub actor: Actor,
    /// The ids the call named (and the id of what it created).
    pub targets: Vec<String>,
    /// `ok`, or the code of the refusal it answered.
    pub outcome: String,
    /// The request's id (as in the logs and the `x-request-id` header); empty for calls the
    /// dashboard makes without one.
    pub request_id: String,
    /// The client's address, when the call came over the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// When it was made, in microseconds (the order of its id).
    #[serde(skip)]
    #[schemars(skip)]
    micros: u64,
}

impl Record {
    /// The record of something the host did by itself rather than answered (secret material
    /// issued to a node, say): `method` names it, `actor` whom it was done for, `targets` the ids
    /// it concerns.
    pub fn host(method: &str, actor: Actor, mut targets: Vec<String>) -> Record {
        targets.truncate(MAX_TARGETS);
        let micros = stamp();
        Record {
            id: String::new(),
            at: micros / 1000,
            micros,
            method: method.into(),
            plugin: None,
            actor,
            targets,
            outcome: "ok".into(),
            request_id: String::new(),
            source: None,
        }
    }

    /// This record as made by `plugin` (on its own account).
    pub fn by_plugin(mut self, plugin: Option<String>) -> Record {
        self.plugin = plugin;
        self
    }

    /// This record ending in `outcome` (`ok`, or a refusal's code).
    pub fn ended(mut self, outcome: String) -> Record {
        self.outcome = capstan_core::text::truncate(&outcome, 64);
        self
    }

    /// The record of `call` to `method`, answered `outcome`.
    fn of(method: &Method, call: &Call, mut targets: Vec<String>, outcome: std::result::Result<&Value, &Refusal>) -> Record {
        let targets_of = self::targets;
        let actor = match &call.identity {
            Some(who) => Actor { user_id: Some(who.user_id.clone()), username: Some(who.username.clone()), kind: who.kind.clone() },
            None => Actor { user_id: None, username: None, kind: "anonymous".into() },
        };
        if call.identity.is_none() {
            // an anonymous caller's body is theirs to fill with anything: nothing of it is kept
            targets.clear();
        }
        let outcome = match outcome {
            Ok(answer) => {
                // what it made or touched, as the answer names it (`id`, `userId`, …): the host's
                // words, so kept for an anonymous caller too (a login names who logged in)
                targets.extend(targets_of(answer));
                targets.sort();
                targets.dedup();
                targets.truncate(MAX_TARGETS);
                "ok".to_string()
            }
            Err(refusal) => capstan_core::text::truncate(&refusal.code, 64),
        };
        let micros = stamp();
        Record {
            id: String::new(),
            at: micros / 1000,
            micros,
            method: method.name.clone(),
            plugin: method.plugin.clone(),
            actor,
            targets,
            outcome,
            request_id: call.request_id.chars().take(64).collect(),
            source: call.source.map(|ip| ip.to_string()),
        }
    }
}

/// Where the audit records are written and read.
#[derive(Clone)]
pub struct AuditLog {
    store: Store,
    /// Records waiting to be written, and whose turn it is to write them.
    waiting: Arc<Waiting>,
}

/// Records appended and not yet written, written together by one caller at a time (a group
/// commit): a burst of calls — 500 failed logins at once — makes a few transactions rather
/// than 500 racing for SQLite's one writer, where those that lost past the store's budget went
/// unrecorded ("database is locked").
#[derive(Default)]
struct Waiting {
    /// Kept until written (or given up on), so a writer whose call was dropped mid-write leaves
    /// them to the next one.
    records: std::sync::Mutex<Vec<(String, Value)>>,
    turn: futures::lock::Mutex<()>,
}

/// The most records one transaction writes.
const RECORDS_PER_TRANSACTION: usize = 200;

/// How long a batch of records keeps being retried while the store is busy (each attempt has
/// the store's own budget, with its backoff) before it is given up and logged.
const WRITE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

impl AuditLog {
    /// The audit log kept in `store` (whose audit collection is [`declare`]d).
    pub fn new(store: Store) -> AuditLog {
        AuditLog { store, waiting: Arc::default() }
    }

    /// Append `record`, returning once it is written. Records appended at the same time are
    /// written together by whichever of their callers gets the turn first; contention is
    /// retried for up to [`WRITE_PATIENCE`]. A failure is logged, never answered: the call it
    /// records has already happened.
    pub async fn append(&self, mut record: Record) {
        record.id = record_id(record.micros);
        let id = record.id.clone();
        let data = match serde_json::to_value(&record) {
            Ok(Value::Object(mut data)) => {
                data.remove("id");
                Value::Object(data)
            }
            _ => return,
        };
        self.waiting.records.lock().expect("audit records lock").push((id.clone(), data));
        let _turn = self.waiting.turn.lock().await;
        loop {
            let batch: Vec<(String, Value)> = {
                let records = self.waiting.records.lock().expect("audit records lock");
                if !records.iter().any(|(waiting, _)| *waiting == id) {
                    // written (or given up on) by the caller whose turn came before
                    return;
                }
                records.iter().take(RECORDS_PER_TRANSACTION).cloned().collect()
            };
            let written = self.write(&batch).await;
            if let Err(refusal) = &written {
                let method = batch.first().and_then(|(_, data)| data["method"].as_str()).unwrap_or_default();
                tracing::error!(%method, records = batch.len(), code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "audit records could not be written: {}", refusal.message);
            }
            let done: std::collections::HashSet<&str> = batch.iter().map(|(id, _)| id.as_str()).collect();
            self.waiting.records.lock().expect("audit records lock").retain(|(id, _)| !done.contains(id.as_str()));
        }
    }

    /// Write `batch` in one transaction, retrying while the store is busy for up to
    /// [`WRITE_PATIENCE`]. A record already there (its writer was dropped after the commit) is
    /// left as it is.
    async fn write(&self, batch: &[(String, Value)]) -> Result<()> {
        let started = std::time::Instant::now();
        loop {
            let written = self
                .store
                .transact(|tx| async move {
                    for (id, data) in batch {
                        if tx.get(AUDIT, id).await?.is_none() {
                            tx.insert(AUDIT, id, data.clone()).await?;
                        }
                    }
                    Ok(())
                })
                .await;
            match written {
                // the store waited out its own budget with backoff: another round of it
                Err(e) if e.is("store-busy") && started.elapsed() < WRITE_PATIENCE => continue,
                other => return other,
            }
        }
    }

    /// One page of records matching `query`, newest first.
    pub async fn list(&self, query: ListInput) -> Result<AuditPage> {
        let limit = query.limit.unwrap_or(50);
        if limit == 0 || limit > MAX_LIMIT {
            return Err(Refusal::invalid_request(format!("limit is 1 to {MAX_LIMIT}")).with_data(json!({ "field": "limit" })));
        }
        if let (Some(since), Some(until)) = (query.since, query.until)
            && since > until
        {
            return Err(Refusal::invalid_request("since is after until").with_data(json!({ "field": "since" })));
        }
        if let Some(cursor) = &query.cursor
            && (cursor.len() > 64 || !cursor.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        {
            return Err(Refusal::invalid_request("cursor is the nextCursor of a previous page").with_data(json!({ "field": "cursor" })));
        }
        // the newest record to show: `until`'s key sorts just before every record at or before it
        let from_until = query.until.map(|until| time_key(until.saturating_mul(1000).saturating_add(999)));
        let start = match (query.cursor.clone(), from_until) {
            (Some(cursor), Some(bound)) => Some(cursor.max(bound)),
            (cursor, bound) => cursor.or(bound),
        };
        let query = std::sync::Arc::new(query);
        self.store
            .transact(|tx| {
                let (query, mut cursor) = (query.clone(), start.clone());
                async move {
                    let mut records = Vec::new();
                    let mut examined = 0;
                    loop {
                        let batch = (EXAMINED_PER_CALL - examined).min(500);
                        let page = match &query.method {
                            Some(method) => tx.find(AUDIT, "by_method", &[json!(method)], cursor.as_deref(), batch).await?,
                            None => tx.scan(AUDIT, cursor.as_deref(), batch).await?,
                        };
                        for document in page.documents {
                            examined += 1;
                            let id = document.id.clone();
                            let mut record: Record = serde_json::from_value(document.data).map_err(Refusal::internal)?;
                            record.id = id.clone();
                            if query.since.is_some_and(|since| record.at < since) {
                                // everything after this is older still
                                return Ok(AuditPage { records, next_cursor: None });
                            }
                            cursor = Some(id);
                            if query.matches(&record) {
                                records.push(record);
                                if records.len() == limit {
                                    return Ok(AuditPage { records, next_cursor: cursor });
                                }
                            }
                        }
                        if page.next_cursor.is_none() {
                            return Ok(AuditPage { records, next_cursor: None });
                        }
                        if examined >= EXAMINED_PER_CALL {
                            // answer what was found; the cursor continues where the reading stopped
                            return Ok(AuditPage { records, next_cursor: cursor });
                        }
                    }
                }
            })
            .await
    }

    /// Delete every record older than `days` days before `now` (milliseconds since the epoch),
    /// 500 per transaction; answers how many were deleted.
    pub async fn prune(&self, now: u64, days: u64) -> Result<usize> {
        let cutoff = now.saturating_sub(days.saturating_mul(86_400_000));
        // ids after this key are records made before the cutoff
        let older = time_key(cutoff.saturating_mul(1000));
        let mut deleted = 0;
        loop {
            let older = older.clone();
            let removed = self
                .store
                .transact(|tx| {
                    let older = older.clone();
                    async move {
                        let page = tx.scan(AUDIT, Some(&older), 500).await?;
                        for document in &page.documents {
                            tx.delete(AUDIT, &document.id, document.revision).await?;
                        }
                        Ok(page.documents.len())
                    }
                })
                .await?;
            deleted += removed;
            if removed < 500 {
                return Ok(deleted);
            }
        }
    }
}

/// Input of `audit.list`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListInput {
    /// Only calls of this method (`services.create`).
    pub method: Option<String>,
    /// Only calls by this user (an id or a name).
    pub actor: Option<String>,
    /// `ok`, `refused` (any refusal) or one refusal's code.
    pub outcome: Option<String>,
    /// Only calls that named or created this id.
    pub target: Option<String>,
    /// Only calls at or after this time (milliseconds since the epoch).
    pub since: Option<u64>,
    /// Only calls at or before this time (milliseconds since the epoch).
    pub until: Option<u64>,
    /// Where to continue: the `nextCursor` of the previous page; absent for the first page.
    pub cursor: Option<String>,
    /// At most 200 (default 50).
    pub limit: Option<usize>,
}

impl ListInput {
    fn matches(&self, record: &Record) -> bool {
        let actor = self
            .actor
            .as_deref()
            .is_none_or(|actor| record.actor.user_id.as_deref() == Some(actor) || record.actor.username.as_deref() == Some(actor));
        let outcome = self.outcome.as_deref().is_none_or(|outcome| match outcome {
            "refused" => record.outcome != "ok",
            code => record.outcome == code,
        });
        let target = self.target.as_deref().is_none_or(|target| record.targets.iter().any(|t| t == target));
        let method = self.method.as_deref().is_none_or(|method| record.method == method);
        actor && outcome && target && method
    }
}

/// A page of audit records.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditPage {
    /// The records on this page, newest first. A page may hold fewer than `limit` (even none)
    /// and still have a `nextCursor`: a listing reads a bounded part of the log per call.
    pub records: Vec<Record>,
    /// Pass as `cursor` to continue; absent when no older record matches.
    pub next_cursor: Option<String>,
}

/// Register `audit.list` (administrators only, read-only).
pub fn register(registry: &mut Registry, log: AuditLog) {
    registry
        .with(log)
        .add(
            "audit.list",
            "Audit records of state-changing calls, newest first, by method, actor, outcome, target and time (never a body value)",
            Access::Admin,
            |log: AuditLog, _: Call, input: ListInput| async move { log.list(input).await },
        )
        .read_only();
}

impl Registry {
    /// Record every call of a state-changing method in `log`.
    pub fn set_audit(&mut self, log: AuditLog) {
        self.audit = Some(log);
    }

    /// Run `method` for `call` as [`Method::call`] does, and record the call in the audit log
    /// when the method changes state (whether it answered or refused). Callers come in through
    /// [`Registry::invoke`], which runs a call here once it is established and not forwarded.
    #[cfg(test)]
    pub(crate) async fn call(&self, method: &Method, call: Call, body: Value) -> Result<Value> {
        self.answer(method, call, body).await?.into_value()
    }

    /// [`Registry::call`], the answer as [`Method::answer`] gives it (a plugin's text unparsed).
    pub(crate) async fn answer(&self, method: &Method, call: Call, body: Value) -> Result<Answer> {
        let Some(log) = self.audit.as_ref().filter(|_| !method.read_only) else {
            return method.answer(call, body).await;
        };
        let targets = targets(&body);
        let audited = call.clone();
        let answer = method.answer(call, body).await;
        // what it touched is read from the answer: a plugin's text is parsed here, for writes only
        let tree = answer.as_ref().map(Answer::tree);
        let outcome = match &tree {
            Ok(tree) => Ok(&**tree),
            Err(refusal) => Err(*refusal),
        };
        log.append(Record::of(method, &audited, targets, outcome)).await;
        answer
    }

    /// Record that `call` to `method` was refused before the method ran (its body could not be
    /// read), when the method changes state.
    pub(crate) async fn refused(&self, method: &Method, call: &Call, refusal: &Refusal) {
        if let Some(log) = self.audit.as_ref().filter(|_| !method.read_only) {
            log.append(Record::of(method, call, Vec::new(), Err(refusal))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Identity;
    use capstan_core::clock::now_ms;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("a.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
        (dir, store)
    }

    fn admin() -> Identity {
        Identity {
            user_id: "usr_1".into(),
            username: "ann".into(),
            kind: "human".into(),
            admin: true,
            session_id: "s".into(),
            authenticated_at: capstan_core::clock::now_ms(),
            expires_at: u64::MAX,
        }
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Change {
        service_id: String,
        password: Option<String>,
        mutation_id: Option<String>,
    }

    #[test]
    fn targets_are_id_members_shaped_like_ids_and_nothing_else() {
        let body = json!({ "serviceId": "svc_1", "password": "hunter2-planted", "mutationId": "m-1", "name": "web",
            "clusterId": "has a space", "id": "svc_1", "organizationId": "org_2", "nested": { "userId": "usr_9" } });
        assert_eq!(targets(&body), ["org_2", "svc_1"]);
        assert!(targets(&json!("svc_1")).is_empty());
        let many: serde_json::Map<String, Value> = (0..20).map(|i| (format!("k{i}Id"), json!(format!("id{i}")))).collect();
        assert_eq!(targets(&Value::Object(many)).len(), MAX_TARGETS);
    }

    #[test]
    fn ids_sort_newest_first() {
        let (older, newer) = (record_id(1_700_000_000_000_000), record_id(1_700_000_000_000_001));
        assert!(newer < older, "{newer} {older}");
        assert!(time_key(1_700_000_000_000_000) < older, "a record sorts after its own instant's key");
        assert!(time_key(1_700_000_000_000_001) < newer && newer < time_key(1_700_000_000_000_000));
    }

    fn registry(store: &Store) -> Registry {
        let mut registry = Registry::default();
        registry.set_audit(AuditLog::new(store.clone()));
        registry.add("area.change", "changes", Access::Authenticated, |_: Call, input: Change| async move {
            if input.service_id == "svc_missing" {
                return Err(Refusal::new("service-not-found", "no"));
            }
            Ok(json!({ "id": "thing_1", "password": input.password }))
        });
        registry.add("area.read", "reads", Access::Authenticated, |_: Call, _: Value| async move { Ok(json!({})) }).read_only();
        registry.add("area.admin", "admins", Access::Admin, |_: Call, _: Value| async move { Ok(json!({})) });
        registry
    }

    async fn run(registry: &Registry, name: &str, call: Call, body: Value) -> Result<Value> {
        let method = registry.get(name).unwrap();
        registry.call(&method, call, body).await
    }

    #[tokio::test]
    async fn state_changing_calls_are_recorded_with_outcome_and_targets_and_reads_are_not() {
        let (_dir, store) = store();
        declare(&store).await.unwrap();
        let registry = registry(&store);
        let log = AuditLog::new(store.clone());
        let ann = admin();
        let mut bob = admin();
        (bob.user_id, bob.username, bob.admin) = ("usr_2".into(), "bob".into(), false);
        let call = |who: &Identity| Call {
            identity: Some(who.clone()),
            source: Some([10, 0, 0, 1].into()),
            request_id: "req-1".into(),
            body_text: None,
        };
        run(&registry, "area.change", call(&ann), json!({ "serviceId": "svc_1", "password": "hunter2-planted" })).await.unwrap();
        run(&registry, "area.read", call(&ann), json!({})).await.unwrap();
        assert_eq!(
            run(&registry, "area.change", call(&bob), json!({ "serviceId": "svc_missing" })).await.unwrap_err().code,
            "service-not-found"
        );
        assert_eq!(run(&registry, "area.admin", call(&bob), json!({})).await.unwrap_err().code, "forbidden");
        let refused = registry.get("area.change").unwrap();
        registry.refused(&refused, &Call::default(), &Refusal::invalid_request("not JSON")).await;

        let page = log.list(ListInput::default()).await.unwrap();
        let seen: Vec<(&str, &str, Option<&str>)> =
            page.records.iter().map(|r| (r.method.as_str(), r.outcome.as_str(), r.actor.username.as_deref())).collect();
        assert_eq!(
            seen,
            [
                ("area.change", "invalid-request", None),
                ("area.admin", "forbidden", Some("bob")),
                ("area.change", "service-not-found", Some("bob")),
                ("area.change", "ok", Some("ann"))
            ]
        );
        let first = page.records.last().unwrap();
        assert_eq!(first.targets, ["svc_1", "thing_1"], "the named id and the created one");
        assert_eq!((first.request_id.as_str(), first.source.as_deref(), first.actor.kind.as_str()), ("req-1", Some("10.0.0.1"), "human"));
        assert_eq!(page.records[0].actor.kind, "anonymous");
        let shown = serde_json::to_string(&page).unwrap();
        assert!(!shown.contains("hunter2"), "no body value: {shown}");

        let only = |query: ListInput| {
            let log = log.clone();
            async move { log.list(query).await.unwrap().records.into_iter().map(|r| r.outcome).collect::<Vec<_>>() }
        };
        assert_eq!(only(ListInput { actor: Some("ann".into()), ..Default::default() }).await, ["ok"]);
        assert_eq!(only(ListInput { actor: Some("usr_2".into()), ..Default::default() }).await, ["forbidden", "service-not-found"]);
        assert_eq!(only(ListInput { outcome: Some("refused".into()), ..Default::default() }).await.len(), 3);
        assert_eq!(only(ListInput { outcome: Some("forbidden".into()), ..Default::default() }).await, ["forbidden"]);
        assert_eq!(only(ListInput { target: Some("thing_1".into()), ..Default::default() }).await, ["ok"]);
        assert_eq!(only(ListInput { method: Some("area.admin".into()), ..Default::default() }).await, ["forbidden"]);
        assert_eq!(only(ListInput { since: Some(now_ms() + 60_000), ..Default::default() }).await.len(), 0);
        assert_eq!(only(ListInput { until: Some(now_ms().saturating_sub(60_000)), ..Default::default() }).await.len(), 0);
        assert_eq!(only(ListInput { since: Some(now_ms() - 60_000), until: Some(now_ms() + 1000), ..Default::default() }).await.len(), 4);
    }

    #[tokio::test]
    async fn pages_continue_where_they_stopped_and_retention_deletes_the_old() {
        let (_dir, store) = store();
        declare(&store).await.unwrap();
        let log = AuditLog::new(store.clone());
        let method = Method::served_by(
            "p",
            "p.run".into(),
            "s".into(),
            Access::Authenticated,
            (json!({}), json!({})),
            std::sync::Arc::new(|_, _| Box::pin(async { Ok(json!({}).into()) })),
        );
        let day = 86_400_000;
        for age in [0, 1, 2, 100, 200] {
            let mut record = Record::of(&method, &Call::by(&admin()), vec![format!("t{age}")], Ok(&json!({})));
            record.at -= age * day;
            record.micros -= age * day * 1000;
            log.append(record).await;
        }
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = log.list(ListInput { limit: Some(2), cursor: cursor.clone(), ..Default::default() }).await.unwrap();
            seen.extend(page.records.into_iter().map(|r| (r.targets[0].clone(), r.plugin)));
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let targets: Vec<&str> = seen.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(targets, ["t0", "t1", "t2", "t100", "t200"]);
        assert!(seen.iter().all(|(_, plugin)| plugin.as_deref() == Some("p")));
        let limit = log.list(ListInput { limit: Some(0), ..Default::default() }).await.unwrap_err();
        assert_eq!(limit.code, "invalid-request");
        assert_eq!(log.list(ListInput { cursor: Some("x y".into()), ..Default::default() }).await.unwrap_err().code, "invalid-request");

        assert_eq!(log.prune(now_ms(), DEFAULT_RETENTION_DAYS).await.unwrap(), 2);
        let left = log.list(ListInput::default()).await.unwrap().records;
        assert_eq!(left.iter().map(|r| r.targets[0].as_str()).collect::<Vec<_>>(), ["t0", "t1", "t2"]);
        assert_eq!(log.prune(now_ms(), DEFAULT_RETENTION_DAYS).await.unwrap(), 0, "nothing twice");
    }
}
