//! The `/v2` routes: one catch-all that reads what a path asks for from its end (repository
//! names contain `/`), authenticates the bearer, authorizes the action and serves it.
//!
//! A bearer is a Capstan session (a person's, a machine user's), judged by roles and grants,
//! or a pull credential's secret (`capstan_pull_…`, told by its prefix), which reads manifests
//! and blobs of its one repository and nothing else ([`crate::pulls`]).

use crate::Registry;
use crate::access::{Action, Allowed, authorize};
use crate::errors::OciError;
use crate::manifests::{self, MAX_MANIFEST};
use crate::names::{Digest, Reference, check_name, client_digest};
use crate::pulls::{self, Grant};
use crate::storage::{ManifestRecord, Part, PutRefused, Storage, missing_bytes};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use capstan_auth::Identity;
use capstan_blobs::BlobReader;
use capstan_core::clock::now_ms;
use capstan_store::Store;
use futures::TryStreamExt;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;

type Answer = Result<Response, OciError>;

/// The registry's routes, for the server to merge.
pub fn routes<S: Clone + Send + Sync + 'static>(registry: Arc<Registry>) -> Router<S> {
    Router::new()
        .route("/v2", get(base))
        .route("/v2/", get(base))
        .route("/v2/token", get(crate::token::token))
        .route("/v2/{*path}", any(dispatch))
        .with_state(registry)
}

/// The `WWW-Authenticate` challenge pointing at the token endpoint.
pub fn challenge(registry: &Registry, scope: Option<(&str, Action)>) -> String {
    let mut value = format!("Bearer realm=\"{}/v2/token\",service=\"capstan\"", registry.public_origin);
    if let Some((repository, action)) = scope {
        value.push_str(&format!(",scope=\"repository:{repository}:{}\"", action.scope()));
    }
    value
}

/// Who a bearer stands for.
#[derive(Debug)]
enum Caller {
    /// A session's user, judged by roles and grants.
    Person(Identity),
    /// A pull credential: its one repository's manifests and blobs.
    Puller(Grant),
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty())
}

async fn caller(registry: &Registry, headers: &HeaderMap, scope: Option<(&str, Action)>) -> Result<Caller, OciError> {
    let Some(bearer) = bearer(headers) else { return Err(OciError::unauthorized(challenge(registry, scope))) };
    let found = if pulls::is_pull_secret(bearer) {
        pulls::bearer_grant(&registry.storage.store, bearer, now_ms()).await.map(Caller::Puller)
    } else {
        registry.auth.authenticate(bearer).await.map(Caller::Person)
    };
    match found {
        Ok(caller) => Ok(caller),
        Err(e) if e.is("unauthenticated") => Err(OciError::unauthorized(challenge(registry, scope))),
        Err(e) => Err(e.into()),
    }
}

/// Allow `action` on `target` in `name` for `caller`, or refuse by name: a person by roles and
/// grants ([`authorize`]); a pull credential only `GET`/`HEAD` of a manifest or a blob in its
/// own repository, anything else the one `registry-access-denied`. The person, when it is one.
async fn allow<'a>(
    store: &Store,
    caller: &'a Caller,
    target: &Target<'_>,
    name: &str,
    action: Action,
) -> Result<(Allowed, Option<&'a Identity>), OciError> {
    match caller {
        Caller::Person(identity) => Ok((authorize(store, identity, name, action).await?, Some(identity))),
        Caller::Puller(grant) if matches!(target, Target::Manifest(..) | Target::Blob(..)) && grant.allows(name, action) => {
            Ok((Allowed { service_id: None, blobs_only: false }, None))
        }
        Caller::Puller(_) => Err(crate::access::denied()),
    }
}

fn api_version(mut response: Response) -> Response {
    response.headers_mut().insert("docker-distribution-api-version", HeaderValue::from_static("registry/2.0"));
    response
}

/// `GET /v2/`: whether the caller is authenticated.
async fn base(State(registry): State<Arc<Registry>>, headers: HeaderMap) -> Response {
    api_version(match caller(&registry, &headers, None).await {
        Ok(_) => axum::Json(json!({})).into_response(),
        Err(e) => e.into_response(),
    })
}

/// What a `/v2/<path>` asks for.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Tags(&'a str),
    Manifest(&'a str, &'a str),
    Referrers(&'a str, &'a str),
    UploadStart(&'a str),
    Upload(&'a str, &'a str),
    Blob(&'a str, &'a str),
}

/// Read a path from its end: `<name>/tags/list`, `<name>/manifests/<ref>`,
/// `<name>/referrers/<digest>`, `<name>/blobs/uploads/[<id>]`, `<name>/blobs/<digest>`.
fn target(path: &str) -> Option<Target<'_>> {
    let (head, last) = path.rsplit_once('/')?;
    let (name, second) = head.rsplit_once('/').unwrap_or(("", head));
    let name_before = |suffix: &str| path.strip_suffix(suffix).filter(|n| !n.is_empty());
    if second == "tags" && last == "list" {
        return Some(Target::Tags(name));
    }
    if second == "manifests" {
        return Some(Target::Manifest(name, last));
    }
    if second == "referrers" {
        return Some(Target::Referrers(name, last));
    }
    if let Some(name) = name_before("/blobs/uploads/").or_else(|| name_before("/blobs/uploads")) {
        return Some(Target::UploadStart(name));
    }
    if second == "uploads"
        && let Some(name) = name.strip_suffix("/blobs")
    {
        return Some(Target::Upload(name, last));
    }
    if second == "blobs" {
        return Some(Target::Blob(name, last));
    }
    None
}

async fn dispatch(State(registry): State<Arc<Registry>>, request: Request) -> Response {
    let path = request.uri().path().strip_prefix("/v2/").unwrap_or("").to_string();
    let query: HashMap<String, String> = request.uri().query().map(url_decoded_pairs).unwrap_or_default();
    let answer = serve(&registry, &path, &query, request).await;
    api_version(answer.unwrap_or_else(IntoResponse::into_response))
}

async fn serve(registry: &Registry, path: &str, query: &HashMap<String, String>, request: Request) -> Answer {
    let Some(target) = target(path) else {
        return Err(OciError::new(StatusCode::NOT_FOUND, "UNSUPPORTED", "registry-route-unknown", "no registry API answers at this path"));
    };
    let name = match &target {
        Target::Tags(n)
        | Target::Manifest(n, _)
        | Target::Referrers(n, _)
        | Target::UploadStart(n)
        | Target::Upload(n, _)
        | Target::Blob(n, _) => *n,
    };
    check_name(name)?;
    let method = request.method().clone();
    let action = match method {
        Method::GET | Method::HEAD => Action::Pull,
        Method::DELETE if !matches!(target, Target::Upload(..)) => Action::Delete,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE => Action::Push,
        _ => {
            return Err(OciError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "UNSUPPORTED",
                "method-not-allowed",
                "this method is not served here",
            ));
        }
    };
    let caller = caller(registry, request.headers(), Some((name, action))).await?;
    let (allowed, person) = allow(&registry.storage.store, &caller, &target, name, action).await?;
    // what only a person does (uploads, manifest pushes) is refused to anyone else
    let person = || person.ok_or_else(crate::access::denied);
    let storage = &registry.storage;
    let head = method == Method::HEAD;
    match (target, method) {
        (Target::Blob(_, digest), Method::GET | Method::HEAD) => {
            get_blob(storage, name, &client_digest(digest)?, request.headers(), head).await
        }
        (Target::Blob(_, digest), Method::DELETE) => {
            let digest = client_digest(digest)?;
            if storage.unlink(name, &digest).await? {
                Ok(StatusCode::ACCEPTED.into_response())
            } else {
                Err(OciError::blob_unknown(digest.as_str()))
            }
        }
        (Target::UploadStart(_), Method::POST) => start_upload(registry, name, query, person()?, request).await,
        (Target::Upload(_, id), Method::GET) => {
            let (record, _) = storage.upload(name, id).await?.ok_or_else(OciError::upload_unknown)?;
            Ok(upload_answer(StatusCode::NO_CONTENT, name, id, record.size))
        }
        (Target::Upload(_, id), Method::PATCH) => patch_upload(storage, name, id, request).await,
        (Target::Upload(_, id), Method::PUT) => finish_upload(storage, name, id, query, request).await,
        (Target::Upload(_, id), Method::DELETE) => {
            let (record, _) = storage.upload(name, id).await?.ok_or_else(OciError::upload_unknown)?;
            storage.end_upload(id, &record.parts, None).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (Target::Manifest(_, reference), Method::GET | Method::HEAD) => {
            get_manifest(storage, name, &Reference::parse(reference)?, head).await
        }
        (Target::Manifest(_, reference), Method::PUT) => {
            put_manifest(registry, name, &Reference::parse(reference)?, &allowed, person()?, request).await
        }
        (Target::Manifest(_, reference), Method::DELETE) => {
            let done = match Reference::parse(reference)? {
                Reference::Digest(digest) => storage.delete_manifest(name, &digest).await?,
                Reference::Tag(tag) => storage.delete_tag(name, &tag).await?,
            };
            if done { Ok(StatusCode::ACCEPTED.into_response()) } else { Err(OciError::manifest_unknown(reference)) }
        }
        (Target::Tags(_), Method::GET | Method::HEAD) => list_tags(storage, name, query).await,
        (Target::Referrers(_, digest), Method::GET | Method::HEAD) => referrers(storage, name, &client_digest(digest)?, query).await,
        _ => Err(OciError::new(StatusCode::METHOD_NOT_ALLOWED, "UNSUPPORTED", "method-not-allowed", "this method is not served here")),
    }
}

fn url_decoded_pairs(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter_map(|(k, v)| Some((percent_decode(k)?, percent_decode(v)?)))
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn header_value(value: &str) -> HeaderValue {
    HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The request's body as a reader for the blob store.
fn body_reader(request: Request) -> BlobReader {
    let stream = request.into_body().into_data_stream().map_err(std::io::Error::other);
    Box::pin(tokio_util::io::StreamReader::new(stream))
}

/// A blob's bytes, whole or a `Range: bytes=a-b` of them.
async fn get_blob(storage: &Storage, name: &str, digest: &Digest, headers: &HeaderMap, head: bool) -> Answer {
    let record = storage.blob_in(name, digest).await?.ok_or_else(|| OciError::blob_unknown(digest.as_str()))?;
    // a client that found the blob may push a manifest naming it a while later
    storage.note_use(crate::storage::BLOBS, digest.as_str(), record.used_at.max(record.created_at)).await;
    let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        Some(spec) => Some(parse_range(spec, record.size).ok_or_else(|| range_unsatisfiable(record.size))?),
        None => None,
    };
    let (start, end) = range.unwrap_or((0, record.size.saturating_sub(1)));
    let length = if record.size == 0 { 0 } else { end - start + 1 };
    let body = if head {
        Body::empty()
    } else {
        use tokio::io::AsyncReadExt;
        let reader = storage.open(&record, start).await?.ok_or_else(|| missing_bytes(digest.as_str()))?;
        Body::from_stream(tokio_util::io::ReaderStream::with_capacity(reader.take(length), 256 << 10))
    };
    let mut response = Response::new(body);
    *response.status_mut() = if range.is_some() { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert("docker-content-digest", header_value(digest.as_str()));
    h.insert(header::ETAG, header_value(&format!("\"{digest}\"")));
    if range.is_some() {
        h.insert(header::CONTENT_RANGE, header_value(&format!("bytes {start}-{end}/{}", record.size)));
    }
    Ok(response)
}

/// `bytes=a-b`, `bytes=a-` or `bytes=-n` within `size`: the inclusive first and last byte.
fn parse_range(spec: &str, size: u64) -> Option<(u64, u64)> {
    let spec = spec.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let (start, end) = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            (size.checked_sub(n.min(size))?, size.checked_sub(1)?)
        }
        (a, "") => (a.parse().ok()?, size.checked_sub(1)?),
        (a, b) => (a.parse().ok()?, b.parse::<u64>().ok()?.min(size.checked_sub(1)?)),
    };
    (start <= end && end < size).then_some((start, end))
}

fn range_unsatisfiable(size: u64) -> OciError {
    OciError::new(StatusCode::RANGE_NOT_SATISFIABLE, "BLOB_UNKNOWN", "registry-range-invalid", "the requested range is not within the blob")
        .with_data(json!({ "size": size }))
}

fn upload_answer(status: StatusCode, name: &str, id: &str, size: u64) -> Response {
    let mut response = status.into_response();
    let h = response.headers_mut();
    h.insert(header::LOCATION, header_value(&format!("/v2/{name}/blobs/uploads/{id}")));
    h.insert(header::RANGE, header_value(&format!("0-{}", size.saturating_sub(1))));
    h.insert("docker-upload-uuid", header_value(id));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
    response
}

fn blob_created(name: &str, digest: &Digest) -> Response {
    let mut response = StatusCode::CREATED.into_response();
    let h = response.headers_mut();
    h.insert(header::LOCATION, header_value(&format!("/v2/{name}/blobs/{digest}")));
    h.insert("docker-content-digest", header_value(digest.as_str()));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
    response
}

/// `POST …/blobs/uploads/`: a mount, a whole blob (`?digest=`), or a new upload session.
async fn start_upload(registry: &Registry, name: &str, query: &HashMap<String, String>, caller: &Identity, request: Request) -> Answer {
    let storage = &registry.storage;
    if let (Some(mount), Some(from)) = (query.get("mount"), query.get("from")) {
        let digest = client_digest(mount)?;
        // a source the caller may not read is answered as a plain upload session, as the spec asks
        let readable = check_name(from).is_ok() && authorize(&storage.store, caller, from, Action::Pull).await.is_ok();
        if readable && storage.mount(from, name, &digest).await? {
            return Ok(blob_created(name, &digest));
        }
    } else if let Some(expected) = query.get("digest") {
        let expected = client_digest(expected)?;
        let key = Storage::part_key(&uuid::Uuid::new_v4().simple().to_string(), 0);
        let part = storage.write_part(&key, body_reader(request)).await.map_err(body_failed)?;
        return commit(storage, name, &expected, part, &[]).await;
    }
    let id = storage.start_upload(name, &caller.user_id).await?;
    Ok(upload_answer(StatusCode::ACCEPTED, name, &id, 0))
}

fn body_failed(refusal: capstan_core::refusal::Refusal) -> OciError {
    if refusal.is("blobs-unavailable") && refusal.detail.as_deref().is_some_and(|d| d.contains("body")) {
        OciError::upload_invalid("registry-upload-broken", "the upload's body could not be read to its end; nothing was stored")
    } else {
        refusal.into()
    }
}

/// Keep `part` as the blob `expected` in `name` when its digest is that; `also` are keys to
/// remove either way (an upload's other parts).
async fn commit(storage: &Storage, name: &str, expected: &Digest, part: Part, also: &[String]) -> Answer {
    if Digest::from_hex(&part.sha256) != *expected {
        let mut unused = also.to_vec();
        unused.push(part.key);
        storage.discard(&unused).await;
        return Err(
            OciError::digest_invalid("the uploaded content does not match the digest").with_data(json!({ "digest": expected.as_str() }))
        );
    }
    let mut unused = storage.commit_blob(name, expected, &part).await?;
    unused.extend(also.iter().filter(|k| **k != part.key).cloned());
    storage.discard(&unused).await;
    Ok(blob_created(name, expected))
}

/// `PATCH` an upload: append the body as its next part.
async fn patch_upload(storage: &Storage, name: &str, id: &str, request: Request) -> Answer {
    let (record, revision) = storage.upload(name, id).await?.ok_or_else(OciError::upload_unknown)?;
    if let Some(range) = request.headers().get(header::CONTENT_RANGE).and_then(|v| v.to_str().ok()) {
        let start = range.trim().trim_start_matches("bytes ").split('-').next().and_then(|s| s.trim().parse::<u64>().ok());
        if start != Some(record.size) {
            return Ok(out_of_order(name, id, record.size));
        }
    }
    let key = Storage::part_key(id, record.parts.len());
    let part = storage.write_part(&key, body_reader(request)).await.map_err(body_failed)?;
    if part.size == 0 {
        storage.discard(&[key]).await;
        return Ok(upload_answer(StatusCode::ACCEPTED, name, id, record.size));
    }
    match storage.add_part(id, record, revision, part).await? {
        Ok(record) => Ok(upload_answer(StatusCode::ACCEPTED, name, id, record.size)),
        Err(()) => {
            // another chunk got there first: this one is not part of the upload
            storage.discard(&[key]).await;
            let size = storage.upload(name, id).await?.map_or(0, |(r, _)| r.size);
            Ok(out_of_order(name, id, size))
        }
    }
}

fn out_of_order(name: &str, id: &str, size: u64) -> Response {
    let mut response = OciError::upload_invalid("registry-upload-out-of-order", "the chunk does not start where the upload ends")
        .with_data(json!({ "size": size }))
        .into_response();
    *response.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
    let h = response.headers_mut();
    h.insert(header::LOCATION, header_value(&format!("/v2/{name}/blobs/uploads/{id}")));
    h.insert(header::RANGE, header_value(&format!("0-{}", size.saturating_sub(1))));
    h.insert("docker-upload-uuid", header_value(id));
    response
}

/// `PUT` an upload `?digest=`: its last part (the body, if any), then the blob.
async fn finish_upload(storage: &Storage, name: &str, id: &str, query: &HashMap<String, String>, request: Request) -> Answer {
    let expected = client_digest(query.get("digest").ok_or_else(|| OciError::digest_invalid("finishing an upload needs ?digest="))?)?;
    let (mut record, revision) = storage.upload(name, id).await?.ok_or_else(OciError::upload_unknown)?;
    let declared_empty = request.headers().get(header::CONTENT_LENGTH).is_some_and(|v| v == "0");
    if !declared_empty || record.parts.is_empty() {
        let key = Storage::part_key(id, record.parts.len());
        let part = storage.write_part(&key, body_reader(request)).await.map_err(body_failed)?;
        if part.size > 0 || record.parts.is_empty() {
            record = match storage.add_part(id, record, revision, part).await? {
                Ok(record) => record,
                Err(()) => {
                    storage.discard(&[key]).await;
                    return Err(OciError::upload_invalid("registry-upload-out-of-order", "the upload changed while it was being finished"));
                }
            };
        } else {
            storage.discard(&[key]).await;
        }
    }
    let whole = storage.joined(id, &record.parts).await?;
    let parts: Vec<String> = record.parts.iter().map(|p| p.key.clone()).collect();
    let answer = commit(storage, name, &expected, whole.clone(), &parts).await;
    // the record goes either way: a wrong digest ends the upload (the client starts again)
    storage.end_upload(id, &[], None).await?;
    answer
}

/// A manifest by tag or digest, exactly as pushed.
async fn get_manifest(storage: &Storage, name: &str, reference: &Reference, head: bool) -> Answer {
    let shown = match reference {
        Reference::Tag(t) => t.clone(),
        Reference::Digest(d) => d.to_string(),
    };
    let (record, blob) = storage.manifest(name, reference).await?.ok_or_else(|| OciError::manifest_unknown(&shown))?;
    let member = crate::storage::member_id(name, &record.digest);
    storage.note_use(crate::storage::MANIFESTS, &member, record.used_at.max(record.created_at)).await;
    let body =
        if head { Body::empty() } else { Body::from(storage.manifest_bytes(&blob).await?.ok_or_else(|| missing_bytes(&record.digest))?) };
    let mut response = Response::new(body);
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, header_value(&record.media_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(record.size));
    h.insert("docker-content-digest", header_value(&record.digest));
    h.insert(header::ETAG, header_value(&format!("\"{}\"", record.digest)));
    Ok(response)
}

/// `PUT` a manifest: judged, its references checked, stored, tagged.
fn operation_required() -> OciError {
    OciError::denied(
        "deployment-operation-required",
        "a deployer's manifest is accepted only for its own deployment operation holding this exact tag",
    )
}

async fn put_manifest(
    registry: &Registry,
    name: &str,
    reference: &Reference,
    allowed: &Allowed,
    caller: &Identity,
    request: Request,
) -> Answer {
    // a deployer pushes the parts of its image (child manifests by digest) only while one of its
    // operations waits for an image in this repository; the tag itself is judged with the write
    if allowed.blobs_only
        && matches!(reference, Reference::Digest(_))
        && !crate::deployments::awaiting_image(&registry.storage.store, name, allowed.service_id.as_deref().unwrap_or_default(), caller)
            .await?
    {
        return Err(operation_required());
    }
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
    let bytes = axum::body::to_bytes(request.into_body(), MAX_MANIFEST).await.map_err(|_| {
        let mut e = OciError::manifest_invalid(format!("a manifest is at most {MAX_MANIFEST} bytes"));
        e.status = StatusCode::PAYLOAD_TOO_LARGE;
        e.reason = "registry-manifest-too-large".into();
        e
    })?;
    let judged = manifests::judge(&bytes, content_type.as_deref())?;
    let digest = manifests::digest_of(&bytes);
    let tag = match reference {
        Reference::Digest(expected) if *expected != digest => {
            return Err(OciError::digest_invalid("the manifest does not match the digest it was pushed under")
                .with_data(json!({ "digest": expected.as_str() })));
        }
        Reference::Digest(_) => None,
        Reference::Tag(tag) => Some(tag.as_str()),
    };
    let record = ManifestRecord {
        repository: name.to_string(),
        digest: digest.to_string(),
        media_type: judged.media_type,
        size: bytes.len() as u64,
        subject: judged.subject.clone(),
        artifact_type: judged.artifact_type,
        annotations: judged.annotations,
        references: judged.references,
        created_at: now_ms(),
        used_at: now_ms(),
    };
    let pusher = crate::storage::Pusher { identity: Some(caller), deployer: allowed.blobs_only };
    match registry.storage.put_manifest(record, bytes.to_vec(), tag, &pusher).await? {
        Ok(()) => {}
        Err(PutRefused::BlobUnknown(missing)) => return Err(OciError::manifest_blob_unknown(&missing)),
        Err(PutRefused::OperationRequired) => return Err(operation_required()),
        Err(PutRefused::Reserved(operation)) => {
            return Err(OciError::new(
                StatusCode::CONFLICT,
                "DENIED",
                "release-tag-reserved",
                "a deployment operation reserved this tag: only its own push takes it",
            )
            .with_data(json!({ "operationId": operation })));
        }
    }
    tracing::info!(repository = name, digest = %digest, tag = tag.unwrap_or(""), "manifest pushed");
    if let (Some(service), Some(tag)) = (&allowed.service_id, tag) {
        // the push is stored either way; a failed record is said, and the next push records again
        let base = format!("{}/{name}", registry.host());
        if let Err(e) = capstan_inventory::services::record_push(&registry.storage.store, service, &base, tag, digest.as_str()).await {
            tracing::warn!(service = %service, code = %e.code, "a push was not recorded on its service: {}", e.message);
        }
    }
    let mut response = StatusCode::CREATED.into_response();
    let h = response.headers_mut();
    h.insert(header::LOCATION, header_value(&format!("/v2/{name}/manifests/{digest}")));
    h.insert("docker-content-digest", header_value(digest.as_str()));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
    if let Some(subject) = judged.subject {
        h.insert("oci-subject", header_value(&subject));
    }
    Ok(response)
}

/// Most tags one page lists.
const MAX_TAGS_PAGE: usize = 1000;

async fn list_tags(storage: &Storage, name: &str, query: &HashMap<String, String>) -> Answer {
    let n = match query.get("n") {
        Some(n) => n.parse::<usize>().map_err(|_| {
            OciError::new(StatusCode::BAD_REQUEST, "PAGINATION_NUMBER_INVALID", "registry-page-size-invalid", "n must be a number")
        })?,
        None => MAX_TAGS_PAGE,
    };
    let last = query.get("last").map(String::as_str).filter(|l| !l.is_empty());
    let (tags, more) = if n == 0 {
        (vec![], false)
    } else {
        storage.tags(name, last, n.min(MAX_TAGS_PAGE)).await?.ok_or_else(|| OciError::name_unknown(name))?
    };
    let next = tags.last().cloned();
    let mut response = axum::Json(json!({ "name": name, "tags": tags })).into_response();
    if more && let Some(next) = next {
        let link = format!("</v2/{name}/tags/list?last={next}&n={}>; rel=\"next\"", n.min(MAX_TAGS_PAGE));
        response.headers_mut().insert(header::LINK, header_value(&link));
    }
    Ok(response)
}

async fn referrers(storage: &Storage, name: &str, digest: &Digest, query: &HashMap<String, String>) -> Answer {
    let wanted = query.get("artifactType").filter(|t| !t.is_empty());
    let found = storage.referrers(name, digest).await?;
    let manifests: Vec<_> = found
        .iter()
        .filter(|m| wanted.is_none_or(|w| m.artifact_type.as_ref() == Some(w)))
        .map(|m| {
            let mut d = json!({ "mediaType": m.media_type, "digest": m.digest, "size": m.size });
            if let Some(t) = &m.artifact_type {
                d["artifactType"] = json!(t);
            }
            if let Some(a) = &m.annotations {
                d["annotations"] = a.clone();
            }
            d
        })
        .collect();
    let body = json!({ "schemaVersion": 2, "mediaType": manifests::OCI_INDEX, "manifests": manifests });
    let mut response = (StatusCode::OK, serde_json::to_vec(&body).unwrap_or_default()).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(manifests::OCI_INDEX));
    if wanted.is_some() {
        h.insert("oci-filters-applied", HeaderValue::from_static("artifactType"));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_read_from_their_end() {
        assert_eq!(target("a/b/tags/list"), Some(Target::Tags("a/b")));
        assert_eq!(target("a/manifests/latest"), Some(Target::Manifest("a", "latest")));
        assert_eq!(target("a/b/referrers/sha256:x"), Some(Target::Referrers("a/b", "sha256:x")));
        assert_eq!(target("a/blobs/uploads/"), Some(Target::UploadStart("a")));
        assert_eq!(target("a/blobs/uploads"), Some(Target::UploadStart("a")));
        assert_eq!(target("a/b/blobs/uploads/123"), Some(Target::Upload("a/b", "123")));
        assert_eq!(target("blobs/blobs/sha256:x"), Some(Target::Blob("blobs", "sha256:x")));
        assert_eq!(target("a/manifests/b/blobs/sha256:x"), Some(Target::Blob("a/manifests/b", "sha256:x")));
        assert_eq!(target("a/whatever"), None);
        assert_eq!(target("nothing"), None);
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), Some((0, 9)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=-10", 100), Some((90, 99)));
        assert_eq!(parse_range("bytes=50-200", 100), Some((50, 99)));
        assert_eq!(parse_range("bytes=100-", 100), None);
        assert_eq!(parse_range("bytes=5-4", 100), None);
        assert_eq!(parse_range("items=0-1", 100), None);
        assert_eq!(parse_range("bytes=0-0", 0), None);
    }

    #[tokio::test]
    async fn a_pull_credential_s_bearer_reads_only_its_repository_s_manifests_and_blobs() {
        use crate::pulls::tests::{HOLDER, REPO, expire, store, token};
        let (store, _dir) = store().await;
        let credential = pulls::issue(&store, REPO, HOLDER, std::time::Duration::from_secs(600)).await.unwrap();
        let body = token(&store, &credential.username, credential.password.expose()).await.unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, header_value(&format!("Bearer {}", body["token"].as_str().unwrap())));
        let bearer = bearer(&headers).unwrap();
        assert!(pulls::is_pull_secret(bearer), "told from a session by its prefix");
        let caller = Caller::Puller(pulls::bearer_grant(&store, bearer, now_ms()).await.unwrap());

        let digest = format!("sha256:{}", "a".repeat(64));
        let judge = |path: String, action: Action| {
            let (caller, store) = (&caller, &store);
            async move {
                let target = target(&path).unwrap();
                let name = match &target {
                    Target::Tags(n)
                    | Target::Manifest(n, _)
                    | Target::Referrers(n, _)
                    | Target::UploadStart(n)
                    | Target::Upload(n, _)
                    | Target::Blob(n, _) => *n,
                };
                allow(store, caller, &target, name, action).await.map(|(allowed, person)| (allowed, person.is_some()))
            }
        };
        for path in [format!("{REPO}/manifests/{digest}"), format!("{REPO}/manifests/v1"), format!("{REPO}/blobs/{digest}")] {
            let (allowed, person) = judge(path.clone(), Action::Pull).await.unwrap_or_else(|e| panic!("{path}: {e:?}"));
            assert_eq!((allowed, person), (Allowed { service_id: None, blobs_only: false }, false), "{path}");
        }
        let refused = [
            // another repository
            (format!("workloads/api-abcdefabcdef/manifests/{digest}"), Action::Pull),
            (format!("workloads/api-abcdefabcdef/blobs/{digest}"), Action::Pull),
            (format!("{REPO}-x/blobs/{digest}"), Action::Pull),
            // what is not a manifest or a blob
            (format!("{REPO}/tags/list"), Action::Pull),
            (format!("{REPO}/referrers/{digest}"), Action::Pull),
            // pushes and deletions
            (format!("{REPO}/blobs/uploads/"), Action::Push),
            (format!("{REPO}/blobs/uploads/0123"), Action::Push),
            (format!("{REPO}/manifests/v1"), Action::Push),
            (format!("{REPO}/manifests/{digest}"), Action::Delete),
            (format!("{REPO}/blobs/{digest}"), Action::Delete),
        ];
        for (path, action) in refused {
            let e = judge(path.clone(), action).await.unwrap_err();
            assert_eq!(
                (e.status, e.code, e.reason.as_ref()),
                (StatusCode::FORBIDDEN, "DENIED", "registry-access-denied"),
                "{path} {action:?}"
            );
        }

        // expired or revoked, the bearer stands for no one (answered 401 with the challenge)
        expire(&store, &credential, 1).await;
        assert!(pulls::bearer_grant(&store, bearer, now_ms()).await.unwrap_err().is("unauthenticated"));
        let again = pulls::issue(&store, REPO, HOLDER, std::time::Duration::from_secs(600)).await.unwrap();
        let bearer = token(&store, &again.username, again.password.expose()).await.unwrap()["token"].as_str().unwrap().to_string();
        pulls::bearer_grant(&store, &bearer, now_ms()).await.unwrap();
        pulls::revoke(&store, HOLDER).await.unwrap();
        assert!(pulls::bearer_grant(&store, &bearer, now_ms()).await.unwrap_err().is("unauthenticated"));
    }

    #[test]
    fn queries_are_decoded() {
        let q = url_decoded_pairs("mount=sha256%3Aab&from=a%2Fb&n=2");
        assert_eq!(q["mount"], "sha256:ab");
        assert_eq!(q["from"], "a/b");
        assert_eq!(q["n"], "2");
    }
}
