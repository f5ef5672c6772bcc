//! The relay's backup methods: `backups.archive` and `backups.restore` (docs/relays.md,
//! "Backups on the relay").
//!
//! Capstan's backups manager asks the relay to archive a service's volume directories and
//! upload the archive straight to the host, and later to download one and restore it. The
//! bytes never pass through the manager: the host mints a single-use ticket (URL and bearer)
//! that the request carries, and the relay talks HTTP to the host itself — only to the origin
//! this node is enrolled with. The ticket's bearer never appears in a log line, an error or an
//! answer.
//!
//! Volume `<name>` of service `<id>` is the directory `<volumes dir>/<id>/<name>`. An archive
//! is a gzip-compressed tar: per volume, in the order asked, the entry `<volume>/` and then its
//! contents in sorted order (regular files, directories, symbolic links kept as links; other
//! file types are skipped and counted). Archives are written to, and downloaded into, private
//! files under `<volumes dir>/.capstan-tmp/`, removed in every outcome. A restore unpacks into
//! a staging directory beside the volumes, and only a fully unpacked, verified archive is
//! swapped in, volume by volume, by renames.

use crate::closure;
use crate::handler::{Answer, Handler, Registry, RelayContext};
use crate::state::StateDir;
use capstan_core::Refusal;
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use zeroize::Zeroizing;

/// The private directory of archives in flight, under the volumes directory.
pub const TMP_DIR: &str = ".capstan-tmp";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// The most of a host's answer (an error envelope, an upload receipt) that is read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
const CHUNK: usize = 64 * 1024;

/// Add `backups.archive` and `backups.restore` to `registry`: volumes live under `volumes_dir`,
/// transfers go only to the origin the node in `state` is enrolled with.
pub fn register(registry: &mut Registry, state: StateDir, volumes_dir: PathBuf) -> Result<(), Refusal> {
    let backups = Arc::new(Backups::new(state, volumes_dir)?);
    registry.add(Arc::new(ArchiveMethod(backups.clone())))?;
    registry.add(Arc::new(RestoreMethod(backups)))
}

/// What both methods share.
struct Backups {
    state: StateDir,
    root: PathBuf,
    http: reqwest::Client,
    /// Services with an archive or a restore running: a second one for the same service waits
    /// for none, it is refused `backup-busy` (retryable).
    busy: Arc<Mutex<HashSet<String>>>,
    /// Archives and restores running on their own (asked with `waitMs`), by `backupId:<id>` or
    /// `restoreId:<id>`, until their outcome is taken (or an hour after it came).
    jobs: Arc<Mutex<HashMap<String, Job>>>,
}

/// An archive or a restore running on its own: when it began, and its outcome once it came.
#[derive(Clone)]
struct Job {
    started: std::time::Instant,
    done: watch::Receiver<Option<Result<Value, Refusal>>>,
}

/// The longest one poll of an archive or a restore waits for it.
const MAX_POLL_WAIT: Duration = Duration::from_secs(25);
/// How long an archive's or a restore's outcome waits to be taken.
const KEEP_OUTCOME: Duration = Duration::from_secs(3600);

struct ArchiveMethod(Arc<Backups>);
struct RestoreMethod(Arc<Backups>);

impl Handler for ArchiveMethod {
    fn method(&self) -> &'static str {
        "backups.archive"
    }

    fn handle<'a>(&'a self, ctx: &'a RelayContext, body: Value) -> Answer<'a> {
        Box::pin(async move {
            this_node(ctx, &body)?;
            match wait_field(&body)? {
                Some(wait) => {
                    let key = ("backupId", id_field(&body, "backupId")?.to_string());
                    let this = self.0.clone();
                    self.0.polled(key, wait, async move { this.archive(body).await }).await
                }
                None => self.0.archive(body).await,
            }
        })
    }
}

impl Handler for RestoreMethod {
    fn method(&self) -> &'static str {
        "backups.restore"
    }

    fn handle<'a>(&'a self, ctx: &'a RelayContext, body: Value) -> Answer<'a> {
        Box::pin(async move {
            this_node(ctx, &body)?;
            match wait_field(&body)? {
                Some(wait) => {
                    let key = ("restoreId", id_field(&body, "restoreId")?.to_string());
                    let this = self.0.clone();
                    self.0.polled(key, wait, async move { this.restore(body).await }).await
                }
                None => self.0.restore(body).await,
            }
        })
    }
}

/// Volumes are node-local: a request naming another node (`nodeId`) is refused
/// `backup-node-foreign` rather than answered with this node's data.
fn this_node(ctx: &RelayContext, body: &Value) -> Result<(), Refusal> {
    match body.get("nodeId").and_then(Value::as_str) {
        Some(node) if node != ctx.node_id => Err(Refusal::new(
            "backup-node-foreign",
            format!("the request names node {node}; this relay runs on {} and holds only its own volumes", ctx.node_id),
        )
        .with_data(json!({ "nodeId": node, "relayNodeId": ctx.node_id }))),
        _ => Ok(()),
    }
}

/// What an archive held, or a restore wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Counts {
    files: u64,
    directories: u64,
    symlinks: u64,
    skipped: u64,
}

/// A single-use transfer ticket: where, and the bearer (secret: never shown).
pub(crate) struct Ticket {
    url: url::Url,
    token: Zeroizing<String>,
}

impl Ticket {
    fn authorization(&self) -> Result<reqwest::header::HeaderValue, Refusal> {
        let text = Zeroizing::new(format!("Bearer {}", self.token.as_str()));
        let mut value = reqwest::header::HeaderValue::from_str(&text)
            .map_err(|_| Refusal::new("backup-request-invalid", "the ticket's token is not a usable bearer"))?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl Backups {
    fn new(state: StateDir, root: PathBuf) -> Result<Backups, Refusal> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("capstan-agent/", env!("CARGO_PKG_VERSION")))
            // a ticket's URL is the host's: never follow it elsewhere with a service's data
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Refusal::internal(format!("building the HTTP client: {e}")))?;
        Ok(Backups { state, root, http, busy: Arc::default(), jobs: Arc::default() })
    }

    /// The origin of the Capstan this node is enrolled with.
    fn enrolled_origin(&self) -> Result<String, Refusal> {
        let origin = self.state.read_credential()?.origin;
        url::Url::parse(&origin)
            .map(|url| url.origin().ascii_serialization())
            .map_err(|e| Refusal::new("origin-invalid", format!("the enrolled origin is not a URL: {e}")))
    }

    fn claim(&self, service_id: &str) -> Result<Busy, Refusal> {
        let mut busy = self.busy.lock().map_err(|_| Refusal::internal("the backup claims' lock is poisoned"))?;
        if !busy.insert(service_id.to_string()) {
            return Err(Refusal::new("backup-busy", format!("an archive or a restore of {service_id} is already running"))
                .with_data(json!({ "serviceId": service_id }))
                .retryable());
        }
        Ok(Busy { set: self.busy.clone(), service_id: service_id.to_string() })
    }

    /// `backups.archive` or `backups.restore` with `waitMs`: the work of one backup (`backupId`)
    /// or restore (`restoreId`) runs on its own — begun by the first such request, with that
    /// request's tickets — and each request waits at most `waitMs` (≤ 25 s) for it: its answer
    /// once it is done (then it is forgotten), else `{"running": true, <id field>, "elapsedMs"}`,
    /// so work longer than one request (or one reconcile pass of the manager) goes on, asked
    /// again until done. `key` is the id's field and value.
    async fn polled(
        &self,
        key: (&'static str, String),
        wait: Duration,
        work: impl Future<Output = Result<Value, Refusal>> + Send + 'static,
    ) -> Result<Value, Refusal> {
        let (field, id) = key;
        let job_key = format!("{field}:{id}");
        let job = {
            let mut jobs = self.jobs.lock().map_err(|_| Refusal::internal("the backup jobs' lock is poisoned"))?;
            jobs.retain(|_, job| job.done.borrow().is_none() || job.started.elapsed() < KEEP_OUTCOME);
            match jobs.get(&job_key) {
                Some(job) => job.clone(),
                None => {
                    let (outcome, done) = watch::channel(None);
                    tokio::spawn(async move {
                        let _ = outcome.send(Some(work.await));
                    });
                    let job = Job { started: std::time::Instant::now(), done };
                    jobs.insert(job_key.clone(), job.clone());
                    job
                }
            }
        };
        let mut done = job.done.clone();
        let waited = tokio::time::timeout(wait.min(MAX_POLL_WAIT), async { done.wait_for(Option::is_some).await.map(|o| o.clone()) }).await;
        match waited {
            Ok(Ok(Some(outcome))) => {
                if let Ok(mut jobs) = self.jobs.lock() {
                    jobs.remove(&job_key);
                }
                outcome
            }
            Ok(_) => Err(Refusal::internal("the backup job stopped without an outcome")),
            Err(_) => Ok(json!({ "running": true, field: id, "elapsedMs": job.started.elapsed().as_millis() as u64 })),
        }
    }

    async fn archive(&self, body: Value) -> Result<Value, Refusal> {
        let service_id = id_field(&body, "serviceId")?.to_string();
        id_field(&body, "backupId")?;
        let volumes = volumes_field(&body)?;
        let upload = &body["upload"];
        if !upload.is_object() {
            return Err(invalid("upload", "must be an object {url, token, maxBytes}"));
        }
        let origin = self.enrolled_origin()?;
        let ticket = ticket(upload, "upload", &origin)?;
        let max_bytes =
            upload["maxBytes"].as_u64().filter(|n| *n >= 1).ok_or_else(|| invalid("upload.maxBytes", "must be a whole number ≥ 1"))?;
        let database = closure::Declared::from_body(&body, &volumes)?;
        let database_ticket = database.as_ref().map(|_| closure::upload_ticket(&body, &origin)).transpose()?;
        let busy = self.claim(&service_id)?;

        let (root, service_dir, names) = (self.root.clone(), self.root.join(&service_id), volumes.clone());
        let max_closure = database_ticket.as_ref().map_or(0, |(_, max)| *max);
        // the closure first: the archive leaves the live database out, the closure stands for it
        let (copy, built) = tokio::task::spawn_blocking(move || {
            let copy = database.as_ref().map(|d| closure::take(&root, &service_dir, d, max_closure)).transpose()?;
            let skipped = database.as_ref().map(closure::Declared::archive_exclusions).unwrap_or_default();
            Ok::<_, Refusal>((copy, build_archive(&root, &service_dir, &names, max_bytes, &skipped)?))
        })
        .await
        .map_err(|e| Refusal::internal(format!("the archiving task stopped: {e}")))??;
        self.upload(&built, &ticket).await?;
        let database = match (&copy, &database_ticket) {
            (Some(copy), Some((ticket, _))) => {
                self.upload(copy, ticket).await?;
                json!({ "size": copy.size, "sha256": copy.sha256 })
            }
            _ => Value::Null,
        };
        drop(busy);
        let Built { size, sha256, counts, .. } = built;
        Ok(json!({
            "database": database,
            "size": size,
            "sha256": sha256,
            "files": counts.files,
            "directories": counts.directories,
            "symlinks": counts.symlinks,
            "skipped": counts.skipped,
            "volumes": volumes,
        }))
    }

    /// PUT the archive to the ticket's URL and check the host's receipt.
    async fn upload(&self, built: &Built, ticket: &Ticket) -> Result<(), Refusal> {
        let mut file = built.file.try_clone().map_err(|e| archive_failed(format!("reading the archive back: {e}")))?;
        file.seek(io::SeekFrom::Start(0)).map_err(|e| archive_failed(format!("reading the archive back: {e}")))?;
        let file = tokio::fs::File::from_std(file);
        let chunks = futures::stream::try_unfold(file, |mut file| async move {
            let mut chunk = vec![0u8; CHUNK];
            let n = file.read(&mut chunk).await?;
            if n == 0 {
                return Ok::<_, io::Error>(None);
            }
            chunk.truncate(n);
            Ok(Some((chunk, file)))
        });
        let response = self
            .http
            .put(ticket.url.clone())
            .header(reqwest::header::AUTHORIZATION, ticket.authorization()?)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header(reqwest::header::CONTENT_LENGTH, built.size)
            .body(reqwest::Body::wrap_stream(chunks))
            .send()
            .await
            .map_err(|e| transfer_failed("uploading the archive", &e))?;
        if !response.status().is_success() {
            return Err(host_refusal(response).await);
        }
        let receipt = read_bounded(response).await.map_err(|e| transfer_failed("reading the host's receipt", &e))?;
        let receipt: Value = serde_json::from_slice(&receipt).unwrap_or(Value::Null);
        let (Some(size), Some(sha256)) = (receipt["size"].as_u64(), receipt["sha256"].as_str()) else {
            return Err(Refusal::new("transfer-answer-invalid", "the host's receipt for the upload names no size and sha256"));
        };
        if size != built.size || !sha256.eq_ignore_ascii_case(&built.sha256) {
            return Err(Refusal::new("transfer-digest-mismatch", "the host received other bytes than the relay sent").with_data(json!({
                "size": built.size,
                "sha256": built.sha256,
                "receivedSize": size,
                "receivedSha256": capstan_core::text::truncate(sha256, 64),
            })));
        }
        Ok(())
    }

    async fn restore(&self, body: Value) -> Result<Value, Refusal> {
        let service_id = id_field(&body, "serviceId")?.to_string();
        let volumes = volumes_field(&body)?;
        let download = &body["download"];
        if !download.is_object() {
            return Err(invalid("download", "must be an object {url, token}"));
        }
        let origin = self.enrolled_origin()?;
        let ticket = ticket(download, "download", &origin)?;
        let database = closure::Declared::from_body(&body, &volumes)?;
        let database_ticket = database.as_ref().map(|_| closure::download_ticket(&body, &origin)).transpose()?;
        let size = body["size"].as_u64().filter(|n| *n >= 1).ok_or_else(|| invalid("size", "must be a whole number ≥ 1"))?;
        let sha256 = body["sha256"]
            .as_str()
            .filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| invalid("sha256", "must be 64 hexadecimal digits"))?
            .to_ascii_lowercase();
        let busy = self.claim(&service_id)?;

        let (temp, file) = temp_file(&self.root, "restore").map_err(|e| restore_failed(format!("creating the download file: {e}")))?;
        let mut file = tokio::fs::File::from_std(file);
        self.download(&ticket, size, &sha256, &mut file).await?;
        let mut file = file.into_std().await;
        file.seek(io::SeekFrom::Start(0)).map_err(|e| restore_failed(format!("reading the download back: {e}")))?;
        let copy = match (database, database_ticket) {
            (Some(declared), Some((ticket, size, sha256))) => {
                let (temp, file) =
                    temp_file(&self.root, "closure").map_err(|e| restore_failed(format!("creating the download file: {e}")))?;
                self.download(&ticket, size, &sha256, &mut tokio::fs::File::from_std(file)).await?;
                Some((declared, temp))
            }
            _ => None,
        };

        let service_dir = self.root.join(&service_id);
        let names = volumes.clone();
        // the unpacking and the swap run to their end even if the request is abandoned
        let counts = tokio::task::spawn_blocking(move || {
            let (_busy, _temp) = (busy, temp);
            let copy = copy.as_ref().map(|(declared, temp)| (declared, temp.path()));
            if let Some((_, path)) = copy {
                closure::check(path)?;
            }
            restore_volumes(file, &service_dir, &names, copy)
        })
        .await
        .map_err(|e| Refusal::internal(format!("the restoring task stopped: {e}")))??;
        Ok(json!({
            "files": counts.files,
            "directories": counts.directories,
            "symlinks": counts.symlinks,
            "volumes": volumes,
        }))
    }

    /// GET the ticket's URL into `file`, at most `size` bytes, and check them.
    async fn download(&self, ticket: &Ticket, size: u64, sha256: &str, file: &mut tokio::fs::File) -> Result<(), Refusal> {
        let mut response = self
            .http
            .get(ticket.url.clone())
            .header(reqwest::header::AUTHORIZATION, ticket.authorization()?)
            .send()
            .await
            .map_err(|e| transfer_failed("downloading the archive", &e))?;
        if !response.status().is_success() {
            return Err(host_refusal(response).await);
        }
        let size_mismatch = |received: String| {
            Refusal::new("backup-object-size-mismatch", format!("the host served {received} bytes; the backup holds {size}"))
                .with_data(json!({ "size": size }))
        };
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        while let Some(chunk) = response.chunk().await.map_err(|e| transfer_failed("downloading the archive", &e))? {
            received = received.saturating_add(chunk.len() as u64);
            if received > size {
                return Err(size_mismatch("more than".to_string()));
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(|e| restore_failed(format!("writing the download: {e}")))?;
        }
        file.flush().await.map_err(|e| restore_failed(format!("writing the download: {e}")))?;
        if received != size {
            return Err(size_mismatch(received.to_string()));
        }
        let digest = hex::encode(hasher.finalize());
        if digest != sha256 {
            return Err(Refusal::new("backup-object-digest-mismatch", "the archive the host served does not have the backup's SHA-256")
                .with_data(json!({ "sha256": sha256, "receivedSha256": digest })));
        }
        Ok(())
    }
}

/// A service's claim on its volumes, released on drop.
#[derive(Debug)]
struct Busy {
    set: Arc<Mutex<HashSet<String>>>,
    service_id: String,
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.lock() {
            set.remove(&self.service_id);
        }
    }
}

// ---- requests ----------------------------------------------------------------------------

/// `waitMs`, when the request asks the work to run on its own.
fn wait_field(body: &Value) -> Result<Option<Duration>, Refusal> {
    body.get("waitMs")
        .map(|w| w.as_u64().map(Duration::from_millis).ok_or_else(|| invalid("waitMs", "must be a whole number of milliseconds")))
        .transpose()
}

pub(crate) fn invalid(field: &str, why: &str) -> Refusal {
    Refusal::new("backup-request-invalid", format!("{field} {why}")).with_data(json!({ "field": field }))
}

fn id_field<'a>(body: &'a Value, field: &str) -> Result<&'a str, Refusal> {
    body[field]
        .as_str()
        .filter(|id| !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
        .ok_or_else(|| invalid(field, "must be 1–128 characters of A-Z a-z 0-9 _ -"))
}

fn is_volume_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

fn volumes_field(body: &Value) -> Result<Vec<String>, Refusal> {
    let list = body["volumes"]
        .as_array()
        .filter(|list| !list.is_empty() && list.len() <= 64)
        .ok_or_else(|| invalid("volumes", "must be a list of 1–64 volume names"))?;
    let mut names: Vec<String> = Vec::with_capacity(list.len());
    for item in list {
        let name = item
            .as_str()
            .filter(|name| is_volume_name(name))
            .ok_or_else(|| invalid("volumes", "must hold names of 1–63 characters of a-z 0-9 - starting with a letter"))?;
        if names.iter().any(|n| n == name) {
            return Err(invalid("volumes", &format!("names {name} twice")));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

/// The ticket under `field` (`upload`, `download`): an http(s) URL of the enrolled origin and a
/// bearer.
pub(crate) fn ticket(value: &Value, field: &str, enrolled_origin: &str) -> Result<Ticket, Refusal> {
    let url_field = format!("{field}.url");
    let token_field = format!("{field}.token");
    let url = value["url"]
        .as_str()
        .and_then(|text| url::Url::parse(text).ok())
        .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
        .ok_or_else(|| invalid(&url_field, "must be an http or https URL"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(&url_field, "must not carry credentials"));
    }
    let token = value["token"]
        .as_str()
        .filter(|token| !token.is_empty() && token.len() <= 4096 && token.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| invalid(&token_field, "must be a non-empty bearer of printable characters"))?;
    let origin = url.origin().ascii_serialization();
    if origin != enrolled_origin {
        return Err(Refusal::new(
            "transfer-origin-foreign",
            format!("{url_field} is at {origin}, not at the Capstan this node is enrolled with ({enrolled_origin}); a service's data goes nowhere else"),
        )
        .with_data(json!({ "origin": origin })));
    }
    Ok(Ticket { url, token: Zeroizing::new(token.to_string()) })
}

// ---- the host's answers ------------------------------------------------------------------

fn transfer_failed(what: &str, e: &reqwest::Error) -> Refusal {
    Refusal::new("transfer-failed", format!("{what} failed: {}", crate::wire::describe(e))).retryable()
}

async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = MAX_ANSWER_BYTES.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ANSWER_BYTES {
            break;
        }
    }
    Ok(body)
}

fn is_code(code: &str) -> bool {
    !code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A non-2xx answer: the host's refusal (`{error: {code, message}}`) passed on, or
/// `transfer-refused` when the body is not one.
async fn host_refusal(response: reqwest::Response) -> Refusal {
    let status = response.status().as_u16();
    let body = read_bounded(response).await.unwrap_or_default();
    let envelope: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let error = &envelope["error"];
    match (error["code"].as_str().filter(|c| is_code(c)), error["message"].as_str()) {
        (Some(code), Some(message)) => {
            let message = capstan_core::text::escape_control(&capstan_core::text::truncate(message, 500)).into_owned();
            let mut refusal = Refusal::new(code.to_string(), message);
            refusal.retryable = error["retryable"].as_bool().unwrap_or(false);
            if error["data"].is_object() {
                refusal = refusal.with_data(error["data"].clone());
            }
            refusal
        }
        _ => {
            let refusal = Refusal::new("transfer-refused", format!("the host answered the transfer with HTTP {status} and no refusal"))
                .with_data(json!({ "status": status }));
            if status >= 500 { refusal.retryable() } else { refusal }
        }
    }
}

// ---- local files -------------------------------------------------------------------------

pub(crate) fn archive_failed(message: String) -> Refusal {
    Refusal::new("backup-archive-failed", message)
}

pub(crate) fn restore_failed(message: String) -> Refusal {
    Refusal::new("restore-failed", message)
}

fn archive_invalid(message: String) -> Refusal {
    Refusal::new("backup-archive-invalid", message)
}

/// A private temporary file, removed on drop.
pub(crate) struct TempFile {
    path: PathBuf,
}

impl TempFile {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), "removing a temporary backup file failed: {e}");
        }
    }
}

/// A new private file (0600) in `<root>/.capstan-tmp/` (0700, created when missing).
pub(crate) fn temp_file(root: &Path, kind: &str) -> io::Result<(TempFile, fs::File)> {
    fs::create_dir_all(root)?;
    let dir = root.join(TMP_DIR);
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(&dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    if meta.mode() & 0o777 != 0o700 {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
    }
    let path = dir.join(format!("{kind}-{:016x}", rand::random::<u64>()));
    let file = fs::OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path)?;
    Ok((TempFile { path }, file))
}

/// An archive written to its temporary file.
pub(crate) struct Built {
    pub(crate) _temp: TempFile,
    pub(crate) file: fs::File,
    pub(crate) size: u64,
    pub(crate) sha256: String,
    pub(crate) counts: Counts,
}

/// Where the archive goes: its file, counted and hashed, refused past `max` bytes.
struct Sink {
    file: fs::File,
    hasher: Sha256,
    len: u64,
    max: u64,
    over: Rc<Cell<bool>>,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.len.saturating_add(buf.len() as u64) > self.max {
            self.over.set(true);
            return Err(io::Error::other("the archive is larger than maxBytes"));
        }
        let n = self.file.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Archive `volumes` of the service's directory, leaving out the paths in `skipped` (relative to
/// it: a database the closure stands for).
fn build_archive(root: &Path, service_dir: &Path, volumes: &[String], max_bytes: u64, skipped: &[PathBuf]) -> Result<Built, Refusal> {
    for volume in volumes {
        let dir = service_dir.join(volume);
        let missing = |why: &str| {
            Refusal::new("volume-missing", format!("the volume {volume} ({}) {why}", dir.display())).with_data(json!({ "volume": volume }))
        };
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(missing("is not a directory")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing("does not exist")),
            Err(e) => return Err(archive_failed(format!("the volume {volume} cannot be read: {e}"))),
        }
    }
    let (temp, file) = temp_file(root, "archive").map_err(|e| archive_failed(format!("creating the archive file: {e}")))?;
    let over = Rc::new(Cell::new(false));
    let sink = Sink {
        file: file.try_clone().map_err(|e| archive_failed(format!("creating the archive file: {e}")))?,
        hasher: Sha256::new(),
        len: 0,
        max: max_bytes,
        over: over.clone(),
    };
    let mut counts = Counts::default();
    match write_archive(sink, service_dir, volumes, skipped, &mut counts) {
        Ok(sink) => Ok(Built { _temp: temp, file, size: sink.len, sha256: hex::encode(sink.hasher.finalize()), counts }),
        Err(_) if over.get() => Err(Refusal::new("backup-too-large", format!("the archive is larger than maxBytes ({max_bytes} bytes)"))
            .with_data(json!({ "maxBytes": max_bytes }))),
        Err(e) => Err(archive_failed(format!("archiving the volumes failed: {e}"))),
    }
}

fn write_archive(sink: Sink, service_dir: &Path, volumes: &[String], skipped: &[PathBuf], counts: &mut Counts) -> io::Result<Sink> {
    let mut builder = tar::Builder::new(GzEncoder::new(sink, Compression::default()));
    for volume in volumes {
        append_tree(&mut builder, &service_dir.join(volume), Path::new(volume), skipped, counts)?;
    }
    let mut sink = builder.into_inner()?.finish()?;
    sink.flush()?;
    Ok(sink)
}

/// A header for `meta`: its mode bits, mtime and owner ids.
fn header_for(meta: &fs::Metadata, kind: tar::EntryType) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(meta.mode() & 0o7777);
    header.set_mtime(meta.mtime().max(0) as u64);
    header.set_uid(u64::from(meta.uid()));
    header.set_gid(u64::from(meta.gid()));
    header.set_size(0);
    header
}

/// Append the directory `dir` as `name/`, then its contents in sorted order.
fn append_tree<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &Path,
    name: &Path,
    skipped: &[PathBuf],
    counts: &mut Counts,
) -> io::Result<()> {
    let meta = fs::symlink_metadata(dir)?;
    let mut entry_name = name.as_os_str().to_owned();
    entry_name.push("/");
    builder.append_data(&mut header_for(&meta, tar::EntryType::Directory), Path::new(&entry_name), io::empty())?;
    counts.directories += 1;
    let mut children = fs::read_dir(dir)?.map(|entry| entry.map(|e| e.file_name())).collect::<io::Result<Vec<_>>>()?;
    children.sort();
    for child in children {
        let path = dir.join(&child);
        let inner = name.join(&child);
        if skipped.contains(&inner) {
            continue;
        }
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // gone while walking
            Err(e) => return Err(e),
        };
        let kind = meta.file_type();
        if kind.is_dir() {
            append_tree(builder, &path, &inner, skipped, counts)?;
        } else if kind.is_symlink() {
            let target = fs::read_link(&path)?;
            builder.append_link(&mut header_for(&meta, tar::EntryType::Symlink), &inner, &target)?;
            counts.symlinks += 1;
        } else if kind.is_file() {
            // never through a link that replaced the file since, never blocked by a FIFO
            let flags = (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32;
            let file = match fs::OpenOptions::new().read(true).custom_flags(flags).open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", inner.display()))),
            };
            let meta = file.metadata()?;
            if !meta.is_file() {
                counts.skipped += 1;
                continue;
            }
            let size = meta.len();
            let mut header = header_for(&meta, tar::EntryType::Regular);
            header.set_size(size);
            // exactly `size` bytes even if the file changes while it is read
            let data = (&file).take(size).chain(io::repeat(0)).take(size);
            builder.append_data(&mut header, &inner, data)?;
            counts.files += 1;
        } else {
            counts.skipped += 1;
        }
    }
    Ok(())
}

/// A restore's staging directory: removed on drop unless kept (a swap that could not be undone
/// leaves the previous copies there).
struct Staging {
    path: PathBuf,
    keep: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            remove_tree(&self.path);
        }
    }
}

/// Remove a tree, opening up directories restored without write permission if need be.
fn remove_tree(path: &Path) {
    if fs::remove_dir_all(path).is_ok() {
        return;
    }
    open_up(path);
    if let Err(e) = fs::remove_dir_all(path)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), "removing a restore's staging directory failed: {e}");
    }
}

fn open_up(dir: &Path) {
    if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return;
    }
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                open_up(&entry.path());
            }
        }
    }
}

/// Unpack the archive beside the volumes, put the database closure (if any) in place, swap.
fn restore_volumes(
    archive: fs::File,
    service_dir: &Path,
    volumes: &[String],
    closure: Option<(&closure::Declared, &Path)>,
) -> Result<Counts, Refusal> {
    fs::create_dir_all(service_dir).map_err(|e| restore_failed(format!("creating {}: {e}", service_dir.display())))?;
    let path = service_dir.join(format!(".restore-{:016x}", rand::random::<u64>()));
    fs::DirBuilder::new().mode(0o700).create(&path).map_err(|e| restore_failed(format!("creating {}: {e}", path.display())))?;
    let mut staging = Staging { path, keep: false };
    let counts = unpack(archive, &staging.path, volumes)?;
    for volume in volumes {
        if !fs::symlink_metadata(staging.path.join(volume)).is_ok_and(|m| m.is_dir()) {
            return Err(archive_invalid(format!("the archive holds no volume {volume}")).with_data(json!({ "volume": volume })));
        }
    }
    if let Some((declared, path)) = closure {
        closure::place(&staging.path, declared, path)?;
    }
    swap(service_dir, &mut staging, volumes)?;
    Ok(counts)
}

/// An entry's path as plain relative components (no root, no `.`, no `..`).
fn relative_path(path: &Path) -> Option<PathBuf> {
    let mut relative = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => relative.push(part),
            _ => return None,
        }
    }
    (!relative.as_os_str().is_empty()).then_some(relative)
}

/// Unpack the entries of the requested volumes into `staging`.
fn unpack(archive: fs::File, staging: &Path, volumes: &[String]) -> Result<Counts, Refusal> {
    let mut archive = tar::Archive::new(GzDecoder::new(io::BufReader::new(archive)));
    archive.set_overwrite(false);
    archive.set_preserve_mtime(true);
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    let unreadable = |e: io::Error| archive_invalid(format!("the archive cannot be read: {e}"));
    let mut counts = Counts::default();
    // directories get their mode and mtime last, deepest first: a read-only directory must
    // not stop what goes into it
    let mut directories: Vec<(PathBuf, u32, u64)> = Vec::new();
    for entry in archive.entries().map_err(unreadable)? {
        let mut entry = entry.map_err(unreadable)?;
        let raw = entry.path().map_err(unreadable)?.into_owned();
        let shown = capstan_core::text::escape_control(&capstan_core::text::truncate(&raw.to_string_lossy(), 200)).into_owned();
        let relative = relative_path(&raw).ok_or_else(|| archive_invalid(format!("the entry {shown:?} is not a plain relative path")))?;
        let mut components = relative.components();
        let volume = components.next().and_then(|c| c.as_os_str().to_str()).unwrap_or_default();
        if !volumes.iter().any(|v| v == volume) {
            continue; // a volume not asked for
        }
        let kind = entry.header().entry_type();
        let is_root = components.next().is_none();
        match kind {
            tar::EntryType::Directory => {}
            tar::EntryType::Regular | tar::EntryType::Symlink if !is_root => {}
            tar::EntryType::Regular | tar::EntryType::Symlink => {
                return Err(archive_invalid(format!("the volume entry {shown:?} is not a directory")));
            }
            _ => return Err(archive_invalid(format!("the entry {shown:?} is neither a file, a directory nor a symbolic link"))),
        }
        // nothing is written through a link, or below anything but a directory, the archive made
        let mut parent = staging.to_path_buf();
        if let Some(parents) = relative.parent() {
            for part in parents.components() {
                parent.push(part);
                match fs::symlink_metadata(&parent) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        return Err(archive_invalid(format!("the entry {shown:?} would be written through a symbolic link")));
                    }
                    Ok(meta) if !meta.is_dir() => return Err(archive_invalid(format!("the entry {shown:?} lies below a file"))),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) => return Err(restore_failed(format!("unpacking {shown:?}: {e}"))),
                }
            }
        }
        let target = staging.join(&relative);
        match fs::symlink_metadata(&target) {
            Ok(meta) if meta.is_dir() && kind == tar::EntryType::Directory => {}
            Ok(_) => return Err(archive_invalid(format!("the entry {shown:?} appears twice"))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(restore_failed(format!("unpacking {shown:?}: {e}"))),
        }
        if kind == tar::EntryType::Directory {
            let mode = entry.header().mode().map_err(unreadable)?;
            let mtime = entry.header().mtime().map_err(unreadable)?;
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&target)
                .map_err(|e| restore_failed(format!("unpacking {shown:?}: {e}")))?;
            directories.push((target, mode, mtime));
            counts.directories += 1;
            continue;
        }
        if !entry.unpack_in(staging).map_err(|e| restore_failed(format!("unpacking {shown:?}: {e}")))? {
            return Err(archive_invalid(format!("the entry {shown:?} lies outside the volumes")));
        }
        if kind == tar::EntryType::Symlink {
            counts.symlinks += 1;
        } else {
            counts.files += 1;
        }
    }
    directories.sort_by_key(|(path, ..)| std::cmp::Reverse(path.components().count()));
    for (dir, mode, mtime) in directories {
        if let Some(at) = std::time::UNIX_EPOCH.checked_add(Duration::from_secs(mtime)) {
            fs::File::open(&dir)
                .and_then(|d| d.set_modified(at))
                .map_err(|e| restore_failed(format!("setting the time of {}: {e}", dir.display())))?;
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| restore_failed(format!("setting the mode of {}: {e}", dir.display())))?;
    }
    Ok(counts)
}

/// Swap the staged volumes in: each current one (if any) moves to `<staging>/<volume>.previous`,
/// the staged one into its place. A failure puts back what was swapped.
fn swap(service_dir: &Path, staging: &mut Staging, volumes: &[String]) -> Result<(), Refusal> {
    let mut swapped: Vec<(PathBuf, PathBuf, Option<PathBuf>)> = Vec::new();
    for volume in volumes {
        let live = service_dir.join(volume);
        let staged = staging.path.join(volume);
        let previous = staging.path.join(format!("{volume}.previous"));
        let step = || -> Result<Option<PathBuf>, (io::Error, bool)> {
            let had = match fs::symlink_metadata(&live) {
                Ok(_) => true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                Err(e) => return Err((e, true)),
            };
            if had {
                fs::rename(&live, &previous).map_err(|e| (e, true))?;
            }
            if let Err(e) = fs::rename(&staged, &live) {
                let restored = !had || fs::rename(&previous, &live).is_ok();
                return Err((e, restored));
            }
            Ok(had.then(|| previous.clone()))
        };
        match step() {
            Ok(previous) => swapped.push((live, staged, previous)),
            Err((e, mut consistent)) => {
                for (live, staged, previous) in swapped.iter().rev() {
                    let back = fs::rename(live, staged).is_ok() && previous.as_ref().is_none_or(|p| fs::rename(p, live).is_ok());
                    consistent &= back;
                }
                if !consistent {
                    staging.keep = true;
                    tracing::error!(staging = %staging.path.display(), "a restore could not put every volume back; the previous copies are kept in the staging directory");
                }
                return Err(restore_failed(format!("swapping in the volume {volume} failed: {e}")).with_data(json!({ "volume": volume })));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_for_another_nodes_volumes_is_refused() {
        let ctx = RelayContext::new("node_a".into(), "cls_1".into(), Vec::new(), None);
        assert!(this_node(&ctx, &json!({ "nodeId": "node_a" })).is_ok());
        assert!(this_node(&ctx, &json!({})).is_ok(), "a request naming no node is for this one");
        let refused = this_node(&ctx, &json!({ "nodeId": "node_b" })).unwrap_err();
        assert_eq!(
            (refused.code.as_ref(), refused.data.as_ref().map(|d| d["nodeId"].clone())),
            ("backup-node-foreign", Some(json!("node_b")))
        );
    }
    use crate::mock::{Mock, Received, enrolled};
    use std::collections::BTreeMap;

    const SVC: &str = "svc_1";

    /// A host keeping one object: PUT `/api/v1/transfers/trn_up` stores it and answers its size
    /// and digest, GET `/api/v1/transfers/trn_down` serves it (or `served`, when set). A wrong
    /// bearer is refused `transfer-ticket-invalid`; `trn_liar` misreports the digest; `trn_plain`
    /// answers 500 without a refusal.
    struct Fixture {
        mock: Mock,
        stored: Arc<Mutex<Vec<u8>>>,
        served: Arc<Mutex<Option<Vec<u8>>>>,
        registry: Registry,
        root: PathBuf,
        _dirs: (tempfile::TempDir, tempfile::TempDir),
    }

    fn answer(status: u16, body: Value) -> Option<(u16, &'static str, Vec<u8>)> {
        Some((status, "application/json", body.to_string().into_bytes()))
    }

    async fn fixture() -> Fixture {
        let stored: Arc<Mutex<Vec<u8>>> = Arc::default();
        let served: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
        let (keep, serve) = (stored.clone(), served.clone());
        let mock = Mock::start_raw(move |request: &Received, _| {
            let bearer = request.headers.get("authorization").cloned().unwrap_or_default();
            let expected = if request.method == "PUT" { "Bearer tok-up" } else { "Bearer tok-down" };
            if bearer != expected {
                return answer(403, json!({"error": {"code": "transfer-ticket-invalid", "message": "no such ticket", "retryable": false}}));
            }
            match (request.method.as_str(), request.path.as_str()) {
                ("PUT", "/api/v1/transfers/trn_plain") => Some((500, "text/plain", b"oops".to_vec())),
                ("PUT", path) => {
                    *keep.lock().unwrap() = request.raw.clone();
                    let sha256 = if path.ends_with("trn_liar") { "0".repeat(64) } else { hex::encode(Sha256::digest(&request.raw)) };
                    answer(201, json!({"key": "backups/bkp_1", "size": request.raw.len(), "sha256": sha256}))
                }
                ("GET", "/api/v1/transfers/trn_down") => {
                    let bytes = serve.lock().unwrap().clone().unwrap_or_else(|| keep.lock().unwrap().clone());
                    Some((200, "application/octet-stream", bytes))
                }
                _ => answer(404, json!({"error": {"code": "transfer-not-found", "message": "no such transfer"}})),
            }
        })
        .await;
        let (state_root, state, _credential) = enrolled(&mock.origin);
        let volumes = tempfile::tempdir().unwrap();
        let root = volumes.path().join("volumes");
        let mut registry = Registry::with_builtins();
        register(&mut registry, state, root.clone()).unwrap();
        Fixture { mock, stored, served, registry, root, _dirs: (state_root, volumes) }
    }

    impl Fixture {
        async fn call(&self, method: &str, body: Value) -> Result<Value, Refusal> {
            let ctx = RelayContext::new("node_1".into(), "cls_1".into(), self.registry.methods(), None);
            self.registry.get(method).unwrap().handle(&ctx, body).await
        }

        fn archive_body(&self, volumes: &[&str], transfer: &str, token: &str, max_bytes: u64) -> Value {
            json!({"serviceId": SVC, "backupId": "bkp_1", "volumes": volumes,
                "upload": {"url": format!("{}/api/v1/transfers/{transfer}", self.mock.origin), "token": token, "maxBytes": max_bytes}})
        }

        fn restore_body(&self, volumes: &[&str], size: u64, sha256: &str) -> Value {
            json!({"serviceId": SVC, "volumes": volumes, "size": size, "sha256": sha256,
                "download": {"url": format!("{}/api/v1/transfers/trn_down", self.mock.origin), "token": "tok-down"}})
        }

        fn volume(&self, name: &str) -> PathBuf {
            self.root.join(SVC).join(name)
        }

        /// Nothing left behind: no temporary file, no staging directory.
        fn assert_clean(&self) {
            let tmp = self.root.join(TMP_DIR);
            if tmp.exists() {
                assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0, "a temporary file was left behind");
            }
            if let Ok(entries) = fs::read_dir(self.root.join(SVC)) {
                for entry in entries {
                    let name = entry.unwrap().file_name().to_string_lossy().into_owned();
                    assert!(!name.starts_with(".restore-"), "a staging directory was left behind: {name}");
                }
            }
        }
    }

    fn write(path: &Path, bytes: &[u8], mode: u32) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Every file, directory and symbolic link under `dir`: kind, mode, mtime, content or target.
    fn snapshot(dir: &Path) -> BTreeMap<String, String> {
        fn walk(base: &Path, dir: &Path, into: &mut BTreeMap<String, String>) {
            let meta = fs::symlink_metadata(dir).unwrap();
            let name = dir.strip_prefix(base).unwrap().display().to_string();
            into.insert(format!("{name}/"), format!("dir {:o} {}", meta.mode() & 0o7777, meta.mtime()));
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = fs::symlink_metadata(&path).unwrap();
                let name = path.strip_prefix(base).unwrap().display().to_string();
                if meta.is_dir() {
                    walk(base, &path, into);
                } else if meta.file_type().is_symlink() {
                    into.insert(name, format!("link -> {}", fs::read_link(&path).unwrap().display()));
                } else if meta.is_file() {
                    let content = fs::read(&path).unwrap();
                    into.insert(name, format!("file {:o} {} {}", meta.mode() & 0o7777, meta.mtime(), hex::encode(Sha256::digest(content))));
                }
            }
        }
        let mut into = BTreeMap::new();
        walk(dir, dir, &mut into);
        into
    }

    /// Two volumes: `data` (files, nested directories, a symbolic link, a socket, an empty
    /// directory, assorted modes) and `config`.
    fn populate(fx: &Fixture) {
        let data = fx.volume("data");
        write(&data.join("a.txt"), b"alpha", 0o640);
        let big: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        write(&data.join("sub/deeper/b.bin"), &big, 0o600);
        write(&data.join("sub/run.sh"), b"#!/bin/sh\necho hi\n", 0o755);
        fs::create_dir_all(data.join("empty")).unwrap();
        std::os::unix::fs::symlink("sub/deeper/b.bin", data.join("link")).unwrap();
        std::os::unix::net::UnixListener::bind(data.join("sock")).unwrap();
        fs::set_permissions(data.join("sub"), fs::Permissions::from_mode(0o750)).unwrap();
        write(&fx.volume("config").join("app.toml"), b"port = 80\n", 0o644);
    }

    async fn archived(fx: &Fixture, volumes: &[&str]) -> Value {
        fx.call("backups.archive", fx.archive_body(volumes, "trn_up", "tok-up", 10_000_000)).await.unwrap()
    }

    #[tokio::test]
    async fn an_archive_asked_with_wait_ms_runs_on_its_own_and_is_answered_to_a_later_request() {
        let fx = fixture().await;
        populate(&fx);
        let whole = archived(&fx, &["data", "config"]).await;
        let mut body = fx.archive_body(&["data", "config"], "trn_up", "tok-up", 10_000_000);
        body["waitMs"] = json!(0);
        let first = fx.call("backups.archive", body.clone()).await.unwrap();
        assert_eq!((first["running"].as_bool(), first["backupId"].as_str()), (Some(true), Some("bkp_1")), "{first}");
        // the next request (its ticket unused: the running archive has one) waits for the outcome
        body["waitMs"] = json!(20_000);
        body["upload"]["token"] = json!("not-presented");
        let done = fx.call("backups.archive", body.clone()).await.unwrap();
        assert_eq!((done["size"].clone(), done["sha256"].clone()), (whole["size"].clone(), whole["sha256"].clone()), "{done}");
        // a bad wait is refused by name
        body["waitMs"] = json!("soon");
        assert_eq!(fx.call("backups.archive", body).await.unwrap_err().code, "backup-request-invalid");
    }

    #[tokio::test]
    async fn an_archive_uploaded_and_restored_reproduces_the_volumes_exactly() {
        let fx = fixture().await;
        populate(&fx);
        let data_before = snapshot(&fx.volume("data"));
        let answer = archived(&fx, &["data", "config"]).await;

        let stored = fx.stored.lock().unwrap().clone();
        assert_eq!(answer["size"], json!(stored.len()));
        assert_eq!(answer["sha256"], json!(hex::encode(Sha256::digest(&stored))));
        assert_eq!(
            (&answer["files"], &answer["directories"], &answer["symlinks"], &answer["skipped"]),
            (&json!(4), &json!(5), &json!(1), &json!(1)),
            "{answer}"
        );
        assert_eq!(answer["volumes"], json!(["data", "config"]));
        let put = fx.mock.requests().into_iter().find(|r| r.method == "PUT").unwrap();
        assert_eq!(put.path, "/api/v1/transfers/trn_up");
        assert_eq!(put.headers["authorization"], "Bearer tok-up");
        assert_eq!(put.headers["content-type"], "application/octet-stream");
        assert_eq!(put.headers["content-length"], stored.len().to_string());
        assert!(!answer.to_string().contains("tok-up"));
        fx.assert_clean();

        // the archive: volumes in the order asked, each directory first, sorted within
        let mut names = Vec::new();
        let mut archive = tar::Archive::new(GzDecoder::new(stored.as_slice()));
        for entry in archive.entries().unwrap() {
            names.push(entry.unwrap().path().unwrap().display().to_string());
        }
        assert_eq!(
            names,
            [
                "data/",
                "data/a.txt",
                "data/empty/",
                "data/link",
                "data/sub/",
                "data/sub/deeper/",
                "data/sub/deeper/b.bin",
                "data/sub/run.sh",
                "config/",
                "config/app.toml"
            ]
        );

        // change, add, remove; then restore data only
        write(&fx.volume("data").join("a.txt"), b"changed", 0o600);
        write(&fx.volume("data").join("new.txt"), b"new", 0o644);
        fs::remove_file(fx.volume("data").join("sub/deeper/b.bin")).unwrap();
        fs::remove_file(fx.volume("data").join("link")).unwrap();
        write(&fx.volume("config").join("app.toml"), b"port = 8080\n", 0o644);
        let config_before = snapshot(&fx.volume("config"));

        let size = answer["size"].as_u64().unwrap();
        let sha256 = answer["sha256"].as_str().unwrap();
        let restored = fx.call("backups.restore", fx.restore_body(&["data"], size, sha256)).await.unwrap();
        assert_eq!(restored, json!({"files": 3, "directories": 4, "symlinks": 1, "volumes": ["data"]}));
        let data_after = snapshot(&fx.volume("data"));
        assert_eq!(data_after, data_before);
        assert!(!fx.volume("data").join("sock").exists(), "the socket was never archived");
        assert_eq!(fs::read(fx.volume("data").join("sub/deeper/b.bin")).unwrap().len(), 200_000);
        assert_eq!(snapshot(&fx.volume("config")), config_before, "a volume not asked for is untouched");
        let get = fx.mock.requests().into_iter().find(|r| r.method == "GET").unwrap();
        assert_eq!(get.headers["authorization"], "Bearer tok-down");
        fx.assert_clean();

        // restoring onto a service with no volumes yet creates them
        fs::remove_dir_all(fx.root.join(SVC)).unwrap();
        fx.call("backups.restore", fx.restore_body(&["data", "config"], size, sha256)).await.unwrap();
        assert_eq!(snapshot(&fx.volume("data")), data_before);
        assert_eq!(fs::read(fx.volume("config").join("app.toml")).unwrap(), b"port = 80\n");
        fx.assert_clean();

        // a restore asked with waitMs runs on its own; a later request takes its outcome
        write(&fx.volume("data").join("a.txt"), b"changed again", 0o600);
        let mut body = fx.restore_body(&["data"], size, sha256);
        body["waitMs"] = json!(0);
        let refused = fx.call("backups.restore", body.clone()).await.unwrap_err();
        assert_eq!((&*refused.code, refused.message.contains("restoreId")), ("backup-request-invalid", true), "{refused:?}");
        body["restoreId"] = json!("rst_1");
        let first = fx.call("backups.restore", body.clone()).await.unwrap();
        assert_eq!((first["running"].as_bool(), first["restoreId"].as_str()), (Some(true), Some("rst_1")), "{first}");
        body["waitMs"] = json!(20_000);
        body["download"]["token"] = json!("not-presented");
        let done = fx.call("backups.restore", body).await.unwrap();
        assert_eq!(done, json!({"files": 3, "directories": 4, "symlinks": 1, "volumes": ["data"]}));
        assert_eq!(snapshot(&fx.volume("data")), data_before);
        fx.assert_clean();
    }

    #[tokio::test]
    async fn a_download_that_is_not_the_backup_changes_nothing() {
        let fx = fixture().await;
        populate(&fx);
        let answer = archived(&fx, &["data"]).await;
        write(&fx.volume("data").join("a.txt"), b"changed", 0o600);
        let before = snapshot(&fx.volume("data"));
        let size = answer["size"].as_u64().unwrap();
        let sha256 = answer["sha256"].as_str().unwrap();

        let mut flipped = fx.stored.lock().unwrap().clone();
        let middle = flipped.len() / 2;
        flipped[middle] ^= 0x01;
        *fx.served.lock().unwrap() = Some(flipped);
        let refused = fx.call("backups.restore", fx.restore_body(&["data"], size, sha256)).await.unwrap_err();
        assert_eq!(refused.code, "backup-object-digest-mismatch");
        assert_eq!(snapshot(&fx.volume("data")), before);
        fx.assert_clean();

        *fx.served.lock().unwrap() = None;
        for wrong in [size - 1, size + 1] {
            let refused = fx.call("backups.restore", fx.restore_body(&["data"], wrong, sha256)).await.unwrap_err();
            assert_eq!(refused.code, "backup-object-size-mismatch", "size {wrong}");
            assert_eq!(snapshot(&fx.volume("data")), before);
            fx.assert_clean();
        }
    }

    /// A gzip'd tar of raw entries (names written as they are, `..` and all).
    fn raw_archive(entries: &[(&str, tar::EntryType, &str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::default()));
        for (name, kind, link, data) in entries {
            let mut header = tar::Header::new_gnu();
            let old = header.as_old_mut();
            old.name[..name.len()].copy_from_slice(name.as_bytes());
            old.linkname[..link.len()].copy_from_slice(link.as_bytes());
            header.set_entry_type(*kind);
            header.set_mode(if *kind == tar::EntryType::Directory { 0o755 } else { 0o644 });
            header.set_size(data.len() as u64);
            header.set_mtime(1_700_000_000);
            header.set_uid(0);
            header.set_gid(0);
            header.set_cksum();
            builder.append(&header, *data).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    #[tokio::test]
    async fn an_archive_that_escapes_its_volumes_is_refused_and_changes_nothing() {
        use tar::EntryType::{Directory, Link, Regular, Symlink};
        let fx = fixture().await;
        populate(&fx);
        let outside = tempfile::tempdir().unwrap();
        let before = snapshot(&fx.volume("data"));
        let outside_link = outside.path().display().to_string();
        let cases: Vec<(&str, &str, Vec<u8>)> = vec![
            ("a ../ entry", "not a plain relative path", raw_archive(&[("data/", Directory, "", b""), ("data/../x", Regular, "", b"x")])),
            (
                "an absolute entry",
                "not a plain relative path",
                raw_archive(&[("data/", Directory, "", b""), ("/data/x", Regular, "", b"x")]),
            ),
            (
                "an entry through a link",
                "through a symbolic link",
                raw_archive(&[
                    ("data/", Directory, "", b""),
                    ("data/out", Symlink, &outside_link, b""),
                    ("data/out/evil", Regular, "", b"x"),
                ]),
            ),
            ("a hard link", "neither a file", raw_archive(&[("data/", Directory, "", b""), ("data/h", Link, "data/a.txt", b"")])),
            ("a missing volume", "holds no volume data", raw_archive(&[("config/", Directory, "", b""), ("config/x", Regular, "", b"x")])),
            ("a volume that is a file", "is not a directory", raw_archive(&[("data", Regular, "", b"x")])),
            ("not an archive", "cannot be read", b"not gzip at all".to_vec()),
        ];
        for (case, why, bytes) in cases {
            let (size, sha256) = (bytes.len() as u64, hex::encode(Sha256::digest(&bytes)));
            *fx.served.lock().unwrap() = Some(bytes);
            let refused = fx.call("backups.restore", fx.restore_body(&["data"], size, &sha256)).await.unwrap_err();
            assert_eq!(refused.code, "backup-archive-invalid", "{case}: {refused:?}");
            assert!(refused.message.contains(why), "{case}: {}", refused.message);
            assert_eq!(snapshot(&fx.volume("data")), before, "{case}");
            assert!(!fx.root.join(SVC).join("x").exists() && !fx.root.join("x").exists(), "{case}");
            assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0, "{case}");
            fx.assert_clean();
        }
    }

    #[tokio::test]
    async fn archives_are_refused_by_name() {
        let fx = fixture().await;
        populate(&fx);

        let foreign = json!({"serviceId": SVC, "backupId": "bkp_1", "volumes": ["data"],
            "upload": {"url": "https://elsewhere.example.com/api/v1/transfers/trn_up", "token": "tok-up", "maxBytes": 1000}});
        let refused = fx.call("backups.archive", foreign).await.unwrap_err();
        assert_eq!(refused.code, "transfer-origin-foreign");
        let foreign = json!({"serviceId": SVC, "volumes": ["data"], "size": 1, "sha256": "0".repeat(64),
            "download": {"url": "http://127.0.0.2:1/api/v1/transfers/trn_down", "token": "tok-down"}});
        assert_eq!(fx.call("backups.restore", foreign).await.unwrap_err().code, "transfer-origin-foreign");
        assert!(fx.mock.requests().is_empty(), "nothing was sent anywhere");

        let refused = fx.call("backups.archive", fx.archive_body(&["data"], "trn_up", "tok-up", 10)).await.unwrap_err();
        assert_eq!(refused.code, "backup-too-large");
        assert_eq!(refused.data.as_deref(), Some(&json!({"maxBytes": 10})));
        assert!(fx.mock.requests().is_empty());
        fx.assert_clean();

        let refused = fx.call("backups.archive", fx.archive_body(&["data", "nope"], "trn_up", "tok-up", 1_000_000)).await.unwrap_err();
        assert_eq!(refused.code, "volume-missing");
        assert_eq!(refused.data.as_deref(), Some(&json!({"volume": "nope"})));

        let refused = fx.call("backups.archive", fx.archive_body(&["data"], "trn_up", "zz-wrong-zz", 1_000_000)).await.unwrap_err();
        assert_eq!(refused.code, "transfer-ticket-invalid");
        assert_eq!(refused.message, "no such ticket");
        assert!(!format!("{refused:?}").contains("zz-wrong-zz"));
        fx.assert_clean();

        let refused = fx.call("backups.archive", fx.archive_body(&["data"], "trn_plain", "tok-up", 1_000_000)).await.unwrap_err();
        assert_eq!((refused.code.as_ref(), refused.retryable), ("transfer-refused", true));
        let refused = fx.call("backups.archive", fx.archive_body(&["data"], "trn_liar", "tok-up", 1_000_000)).await.unwrap_err();
        assert_eq!(refused.code, "transfer-digest-mismatch");
        fx.assert_clean();

        for (body, field) in [
            (json!({"serviceId": "svc/1", "backupId": "b", "volumes": ["data"]}), "serviceId"),
            (json!({"serviceId": "s", "volumes": ["data"]}), "backupId"),
            (json!({"serviceId": "s", "backupId": "b", "volumes": []}), "volumes"),
            (json!({"serviceId": "s", "backupId": "b", "volumes": ["Data"]}), "volumes"),
            (json!({"serviceId": "s", "backupId": "b", "volumes": ["data", "data"]}), "volumes"),
            (
                json!({"serviceId": "s", "backupId": "b", "volumes": ["data"], "upload": {"url": "ftp://x/y", "token": "t", "maxBytes": 1}}),
                "upload.url",
            ),
        ] {
            let refused = fx.call("backups.archive", body).await.unwrap_err();
            assert_eq!((refused.code.as_ref(), refused.data.as_deref()), ("backup-request-invalid", Some(&json!({"field": field}))));
        }
        let mut body = fx.archive_body(&["data"], "trn_up", "", 1);
        assert_eq!(fx.call("backups.archive", body.clone()).await.unwrap_err().data.as_deref(), Some(&json!({"field": "upload.token"})));
        body["upload"]["token"] = json!("t");
        body["upload"]["maxBytes"] = json!(0);
        assert_eq!(fx.call("backups.archive", body).await.unwrap_err().data.as_deref(), Some(&json!({"field": "upload.maxBytes"})));
        let mut body = fx.restore_body(&["data"], 1, "nothex");
        assert_eq!(fx.call("backups.restore", body.clone()).await.unwrap_err().data.as_deref(), Some(&json!({"field": "sha256"})));
        body["sha256"] = json!("a".repeat(64));
        body["size"] = json!(0);
        assert_eq!(fx.call("backups.restore", body).await.unwrap_err().data.as_deref(), Some(&json!({"field": "size"})));
    }

    #[test]
    fn a_swap_that_fails_midway_puts_every_volume_back() {
        let root = tempfile::tempdir().unwrap();
        let service = root.path().join(SVC);
        write(&service.join("a/old.txt"), b"old a", 0o644);
        write(&service.join("b/old.txt"), b"old b", 0o644);
        let staging_path = service.join(".restore-test");
        write(&staging_path.join("a/new.txt"), b"new a", 0o644);
        // no staged b: its rename fails after a was swapped
        let mut staging = Staging { path: staging_path.clone(), keep: false };
        let refused = swap(&service, &mut staging, &["a".to_string(), "b".to_string()]).unwrap_err();
        assert_eq!(refused.code, "restore-failed");
        assert_eq!(refused.data.as_deref(), Some(&json!({"volume": "b"})));
        assert!(!staging.keep);
        drop(staging);
        assert_eq!(fs::read(service.join("a/old.txt")).unwrap(), b"old a");
        assert_eq!(fs::read(service.join("b/old.txt")).unwrap(), b"old b");
        assert!(!service.join("a/new.txt").exists());
        assert!(!staging_path.exists(), "the staging directory is removed");
    }

    #[tokio::test]
    async fn one_backup_at_a_time_per_service() {
        let fx = fixture().await;
        let backups = Backups::new(crate::state::StateDir::new(fx.root.join("unused")), fx.root.clone()).unwrap();
        let held = backups.claim(SVC).unwrap();
        let refused = backups.claim(SVC).unwrap_err();
        assert_eq!((refused.code.as_ref(), refused.retryable), ("backup-busy", true));
        let other = backups.claim("svc_2").unwrap();
        drop(held);
        drop(backups.claim(SVC).unwrap());
        drop(other);
    }

    #[tokio::test]
    async fn an_unreachable_host_is_a_retryable_transfer_failure() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let (_state_root, state, _credential) = enrolled(&origin);
        let volumes = tempfile::tempdir().unwrap();
        fs::create_dir_all(volumes.path().join(SVC).join("data")).unwrap();
        let backups = Backups::new(state, volumes.path().to_path_buf()).unwrap();
        let body = json!({"serviceId": SVC, "backupId": "bkp_1", "volumes": ["data"],
            "upload": {"url": format!("{origin}/api/v1/transfers/trn_up"), "token": "tok-up", "maxBytes": 100_000}});
        let refused = backups.archive(body).await.unwrap_err();
        assert_eq!((refused.code.as_ref(), refused.retryable), ("transfer-failed", true), "{refused:?}");
        assert!(!refused.message.contains("tok-up"));
        assert_eq!(fs::read_dir(volumes.path().join(TMP_DIR)).unwrap().count(), 0);
    }
}
