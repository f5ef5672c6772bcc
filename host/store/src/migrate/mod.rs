//! Forward-only data migrations: a chain of steps per owner (the host, later each plugin), a
//! ledger document recording how far a database has come, and a lock with an expiry so only
//! one process migrates at a time.
//!
//! Rules: a ledger below the chain's oldest supported version is refused before the lock is
//! taken or anything is written; a ledger ahead of this build is refused (no downgrades); a
//! database without a ledger is stamped at the target when empty and taken to sit at the
//! floor when populated. A step must be idempotent: when a start is interrupted half way, the
//! next start runs the same step again and it finishes what is left.

use crate::{CollectionSpec, Document, Store};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use semver::Version;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// The collection holding one ledger document per chain.
pub const LEDGER_COLLECTION: &str = "migrations";

/// What a step's function returns: a boxed future of its result.
pub type StepFuture = Pin<Box<dyn Future<Output = Result<()>> + Send>>;
/// A step's work, called with a [`StepContext`].
pub type StepFn = Arc<dyn Fn(StepContext) -> StepFuture + Send + Sync>;

/// One step of a chain: moves the data from `from` to `to`.
#[derive(Clone)]
pub struct Step {
    /// The step's name, as recorded in the ledger.
    pub name: String,
    /// The data version the step starts from.
    pub from: Version,
    /// The data version the step leaves the data at.
    pub to: Version,
    /// The step's work; it must be idempotent, since an interrupted start runs it again.
    pub run: StepFn,
}

impl Step {
    /// A step `name` moving the data from `from` to `to` by `run`; panics unless both versions are semver.
    pub fn new<F, Fut>(name: &str, from: &str, to: &str, run: F) -> Self
    where
        F: Fn(StepContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        Step {
            name: name.into(),
            from: Version::parse(from).expect("step versions are semver"),
            to: Version::parse(to).expect("step versions are semver"),
            run: Arc::new(move |ctx| Box::pin(run(ctx))),
        }
    }
}

/// What a running step can reach.
#[derive(Clone)]
pub struct StepContext {
    /// The store being migrated.
    pub store: Store,
    lock: Arc<LockHandle>,
}

impl StepContext {
    /// Push the lock's expiry forward; long steps call this between chunks.
    pub async fn renew_lock(&self) -> Result<()> {
        self.lock.renew(&self.store).await
    }
}

/// A migration chain: its ledger id, its floor and its steps in order.
#[derive(Clone)]
pub struct Chain {
    /// The chain's name, which is also the id of its ledger document.
    pub name: String,
    /// The floor: the oldest data version this build can migrate from.
    pub oldest_supported: Version,
    /// The steps in order, each starting where the previous one ends.
    pub steps: Vec<Step>,
    /// Collections whose documents make this chain's data "populated"; `None` means every
    /// collection except the ledger (the host chain).
    pub data_collections: Option<Vec<String>>,
}

impl Chain {
    /// Build a chain, checking that the steps connect end to end from the floor.
    pub fn new(name: &str, oldest_supported: &str, steps: Vec<Step>) -> Self {
        let floor = Version::parse(oldest_supported).expect("floor is semver");
        let mut at = floor.clone();
        for step in &steps {
            assert_eq!(step.from, at, "migration chain {name}: step {} must start at {at}", step.name);
            assert!(step.to > step.from, "migration chain {name}: step {} must move forward", step.name);
            at = step.to.clone();
        }
        Chain { name: name.into(), oldest_supported: floor, steps, data_collections: None }
    }

    /// The version the chain brings data to: the last step's `to`, or the floor when there are no steps.
    pub fn target(&self) -> Version {
        self.steps.last().map(|s| s.to.clone()).unwrap_or_else(|| self.oldest_supported.clone())
    }
}

/// A chain's ledger document: the version its data is at, the lock, and the steps applied.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Ledger {
    /// The version (semver) the chain's data is at.
    pub data_version: String,
    /// The migration lock and when it expires; `None` once released.
    pub lock: Option<LedgerLock>,
    /// The step a process started and has not finished (it reruns on the next start).
    pub running: Option<String>,
    /// The steps that finished, oldest first.
    pub history: Vec<LedgerEntry>,
}

/// A migration lock as stored in the ledger.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LedgerLock {
    /// The holding process ([`LockOptions::owner`]).
    pub owner: String,
    /// Milliseconds since the Unix epoch.
    pub expires_at: u64,
}

/// One finished step in a ledger's history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    /// The step's name.
    pub step: String,
    /// The data version the step started from.
    pub from: String,
    /// The data version the step left the data at.
    pub to: String,
    /// When the step finished, in milliseconds since the Unix epoch.
    pub finished_at: u64,
}

/// What [`run`] did to bring a chain to its target.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The chain's name.
    pub chain: String,
    /// The version the database was at (`None`: no ledger, judged by its data).
    pub from: Option<String>,
    /// The version the data is at now.
    pub to: String,
    /// Names of the steps this run applied, in order.
    pub applied: Vec<String>,
    /// Whether an empty database was stamped at the target without running any step.
    pub stamped: bool,
}

/// How long a lock lives and how long a start waits for someone else's.
#[derive(Debug, Clone)]
pub struct LockOptions {
    /// Identifies this process as the lock holder in the ledger.
    pub owner: String,
    /// How long a taken or renewed lock lasts before another process may take it.
    pub ttl: Duration,
    /// How long to wait for another process's lock before refusing `lock-timeout`.
    pub wait: Duration,
}

impl LockOptions {
    /// Options for this process: owner `<pid>/<random uuid>`, a 10-minute lock, waiting up to 30 seconds.
    pub fn for_this_process() -> Self {
        LockOptions {
            owner: format!("{}/{}", std::process::id(), uuid::Uuid::new_v4()),
            ttl: Duration::from_secs(600),
            wait: Duration::from_secs(30),
        }
    }
}

/// Declare the ledger collection ([`LEDGER_COLLECTION`]) on `store`.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(CollectionSpec::new(LEDGER_COLLECTION)).await
}

/// Read a chain's ledger as it stands, without touching it.
pub async fn read_ledger(store: &Store, chain: &str) -> Result<Option<(Ledger, u64)>> {
    let doc = store.transact(|tx| async move { tx.get(LEDGER_COLLECTION, chain).await }).await?;
    doc.map(parse_ledger).transpose()
}

fn parse_ledger(doc: Document) -> Result<(Ledger, u64)> {
    let ledger: Ledger = serde_json::from_value(doc.data)
        .map_err(|e| Refusal::new("ledger-invalid", format!("the migration ledger {} cannot be read", doc.id)).detail(e))?;
    Ok((ledger, doc.revision))
}

fn version_of(ledger: &Ledger, chain: &str) -> Result<Version> {
    Version::parse(&ledger.data_version).map_err(|_| {
        Refusal::new(
            "ledger-invalid",
            format!("the migration ledger {chain} states data version {:?}, which is not semver", ledger.data_version),
        )
    })
}

/// Refuse a version this build cannot carry forward: below the floor or ahead of the target.
fn judge(chain: &Chain, version: &Version) -> Result<()> {
    if *version < chain.oldest_supported {
        return Err(Refusal::new(
            "ledger-below-oldest-supported-version",
            format!(
                "the {} data is at version {version}, below the oldest this build can migrate ({}); first run a release that still carries the steps from {version}",
                chain.name, chain.oldest_supported
            ),
        )
        .with_data(json!({"chain": chain.name, "dataVersion": version.to_string(), "oldestSupported": chain.oldest_supported.to_string()})));
    }
    let target = chain.target();
    if *version > target {
        return Err(Refusal::new(
            "data-version-ahead",
            format!("the {} data is at version {version}, ahead of this build ({target}); downgrades are refused — run a build at least that new", chain.name),
        )
        .with_data(json!({"chain": chain.name, "dataVersion": version.to_string(), "target": target.to_string()})));
    }
    Ok(())
}

async fn is_populated(store: &Store, chain: &Chain) -> Result<bool> {
    let populated = store.populated_collections().await?;
    Ok(populated.iter().any(|c| match &chain.data_collections {
        None => c != LEDGER_COLLECTION,
        Some(own) => own.contains(c),
    }))
}

/// Bring a chain's data to its target. Returns what was done; refuses by name otherwise.
pub async fn run(store: &Store, chain: &Chain, lock: &LockOptions) -> Result<Outcome> {
    declare(store).await?;
    let target = chain.target();
    let name = chain.name.as_str();

    // First read: judge before any lock or write.
    let start = match read_ledger(store, name).await? {
        Some((ledger, _)) => {
            let version = version_of(&ledger, name)?;
            judge(chain, &version)?;
            if version == target {
                return Ok(Outcome {
                    chain: name.into(),
                    from: Some(version.to_string()),
                    to: target.to_string(),
                    applied: vec![],
                    stamped: false,
                });
            }
            Some(version)
        }
        None if !is_populated(store, chain).await? => {
            let ledger = Ledger { data_version: target.to_string(), lock: None, running: None, history: vec![] };
            let data = serde_json::to_value(&ledger).map_err(Refusal::internal)?;
            match store
                .transact(|tx| {
                    let data = data.clone();
                    async move { tx.insert(LEDGER_COLLECTION, name, data).await }
                })
                .await
            {
                Ok(_) => {
                    tracing::info!(chain = name, version = %target, "empty database stamped at the migration target");
                    return Ok(Outcome { chain: name.into(), from: None, to: target.to_string(), applied: vec![], stamped: true });
                }
                // another process stamped or started first: go through the lock like everyone
                Err(e) if e.is("exists") => None,
                Err(e) => return Err(e),
            }
        }
        None => None,
    };

    let handle = Arc::new(LockHandle::acquire(store, chain, lock).await?);
    let result = apply(store, chain, &handle).await;
    let released = handle.release(store).await;
    let (applied, at) = result?;
    released?;
    Ok(Outcome { chain: name.into(), from: start.map(|v| v.to_string()), to: at.to_string(), applied, stamped: false })
}

async fn apply(store: &Store, chain: &Chain, lock: &Arc<LockHandle>) -> Result<(Vec<String>, Version)> {
    let name = chain.name.as_str();
    let mut applied = Vec::new();
    loop {
        let (ledger, revision) = lock.read_own(store).await?;
        let version = version_of(&ledger, name)?;
        judge(chain, &version)?; // another process may have moved it while we waited
        let Some(step) = chain.steps.iter().find(|s| s.from == version) else {
            if version == chain.target() {
                return Ok((applied, version));
            }
            return Err(Refusal::new("migration-chain-broken", format!("no {name} migration step starts at {version}")));
        };
        if ledger.running.as_deref() == Some(step.name.as_str()) {
            tracing::warn!(chain = name, step = %step.name, "resuming a migration step an earlier start did not finish");
        }
        let mut marked = ledger.clone();
        marked.running = Some(step.name.clone());
        marked.lock = Some(lock.fresh_lock());
        lock.write(store, revision, &marked).await?;

        tracing::info!(chain = name, step = %step.name, from = %step.from, to = %step.to, "running migration step");
        let ctx = StepContext { store: store.clone(), lock: lock.clone() };
        (step.run)(ctx).await.map_err(|mut e| {
            e.message = format!("migration step {} ({} to {}) refused: {}", step.name, step.from, step.to, e.message);
            let mut data = e.data.take().map(|d| *d).unwrap_or_else(|| json!({}));
            if let Some(obj) = data.as_object_mut() {
                obj.insert("step".into(), json!(step.name));
            }
            e.with_data(data)
        })?;
        // Crash point `migrate:step-done`: the step's work is durable, the ledger still names
        // it `running`; the next start runs the step again (steps are idempotent).
        capstan_core::crash_point("migrate:step-done");

        // re-read: the step may have renewed the lock, moving the revision
        let (mut done, current) = lock.read_own(store).await?;
        done.data_version = step.to.to_string();
        done.running = None;
        done.lock = Some(lock.fresh_lock());
        done.history.push(LedgerEntry {
            step: step.name.clone(),
            from: step.from.to_string(),
            to: step.to.to_string(),
            finished_at: now_ms(),
        });
        lock.write(store, current, &done).await?;
        applied.push(step.name.clone());
    }
}

/// The migration lock this process holds on one ledger.
struct LockHandle {
    chain: String,
    options: LockOptions,
}

impl LockHandle {
    async fn acquire(store: &Store, chain: &Chain, options: &LockOptions) -> Result<Self> {
        let handle = LockHandle { chain: chain.name.clone(), options: options.clone() };
        let deadline = tokio::time::Instant::now() + options.wait;
        loop {
            let name = handle.chain.as_str();
            let mine = handle.fresh_lock();
            let floor = chain.oldest_supported.to_string();
            let taken = store
                .transact(|tx| {
                    let mine = mine.clone();
                    let floor = floor.clone();
                    async move {
                        match tx.get(LEDGER_COLLECTION, name).await? {
                            None => {
                                // populated without a ledger: it sits at the floor
                                let ledger = Ledger { data_version: floor, lock: Some(mine), running: None, history: vec![] };
                                tx.insert(LEDGER_COLLECTION, name, serde_json::to_value(&ledger).map_err(Refusal::internal)?).await?;
                                Ok(None)
                            }
                            Some(doc) => {
                                let revision = doc.revision;
                                let (mut ledger, _) = parse_ledger(doc)?;
                                match &ledger.lock {
                                    Some(held) if held.owner != mine.owner && held.expires_at > now_ms() => Ok(Some(held.clone())),
                                    _ => {
                                        ledger.lock = Some(mine);
                                        tx.replace(
                                            LEDGER_COLLECTION,
                                            name,
                                            revision,
                                            serde_json::to_value(&ledger).map_err(Refusal::internal)?,
                                        )
                                        .await?;
                                        Ok(None)
                                    }
                                }
                            }
                        }
                    }
                })
                .await;
            let held = match taken {
                Ok(None) => return Ok(handle),
                Ok(Some(held)) => held,
                Err(e) if e.is("conflict") || e.is("exists") => continue, // raced another process: look again
                Err(e) => return Err(e),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(Refusal::new(
                    "lock-timeout",
                    format!(
                        "another process ({}) holds the {name} migration lock until {}; make sure it has stopped and wait for the lock to expire — do not clear it by hand",
                        held.owner,
                        format_ms(held.expires_at)
                    ),
                )
                .retryable()
                .with_data(json!({"chain": name, "holder": held.owner, "expiresAt": held.expires_at})));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn fresh_lock(&self) -> LedgerLock {
        LedgerLock { owner: self.options.owner.clone(), expires_at: now_ms() + self.options.ttl.as_millis() as u64 }
    }

    /// Read the ledger and check the lock is still ours.
    async fn read_own(&self, store: &Store) -> Result<(Ledger, u64)> {
        let (ledger, revision) =
            read_ledger(store, &self.chain).await?.ok_or_else(|| Refusal::internal("migration ledger vanished while locked"))?;
        match &ledger.lock {
            Some(l) if l.owner == self.options.owner => Ok((ledger, revision)),
            _ => Err(Refusal::new("lock-lost", format!("the {} migration lock expired and was taken by another process", self.chain))
                .retryable()),
        }
    }

    async fn write(&self, store: &Store, revision: u64, ledger: &Ledger) -> Result<u64> {
        let data = serde_json::to_value(ledger).map_err(Refusal::internal)?;
        let name = self.chain.as_str();
        let doc = store
            .transact(|tx| {
                let data = data.clone();
                async move { tx.replace(LEDGER_COLLECTION, name, revision, data).await }
            })
            .await
            .map_err(|e| {
                if e.is("conflict") { Refusal::new("lock-lost", "the migration ledger changed under the lock").retryable() } else { e }
            })?;
        Ok(doc.revision)
    }

    async fn renew(&self, store: &Store) -> Result<()> {
        let (mut ledger, revision) = self.read_own(store).await?;
        ledger.lock = Some(self.fresh_lock());
        self.write(store, revision, &ledger).await.map(|_| ())
    }

    async fn release(&self, store: &Store) -> Result<()> {
        let (mut ledger, revision) = self.read_own(store).await?;
        ledger.lock = None;
        self.write(store, revision, &ledger).await.map(|_| ())
    }
}

fn format_ms(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests;
