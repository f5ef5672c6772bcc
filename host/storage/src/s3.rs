//! S3 provisioning for object-storage bindings: one service, its own bucket and a key pair that
//! reaches that bucket only, on the S3 endpoint a node states.
//!
//! Capstan administers the endpoint with an admin key pair ([`Admin`]) that has S3 and IAM
//! rights; both APIs are spoken at the same origin (the IAM client's endpoint is the S3
//! endpoint, signed for the region given), path-style, with static credentials (no environment
//! or profile lookups), over rustls (aws-lc) for `https://`. For a binding it keeps:
//!
//! - the bucket [`bucket_name`] (`capstan-` and the binding id, `_` as `-`), created in the
//!   admin's region (a `LocationConstraint` unless the region is `us-east-1`);
//! - the IAM user [`user_name`] (`capstan-` and the binding id) with one inline policy
//!   ([`POLICY_NAME`], [`policy`]) allowing `s3:ListBucket` on the bucket and
//!   `s3:GetObject`, `s3:PutObject`, `s3:DeleteObject` on its objects — nothing else, so the
//!   key can neither reach another binding's bucket nor create one;
//! - exactly one access key of that user, whose secret only [`ensure`]'s caller ever sees.
//!
//! Every step checks or tolerates what is there, so [`ensure`], [`revoke`] and [`drop`] are
//! idempotent and resume wherever an earlier call stopped (a crash between any two requests
//! included). A key created by a call whose caller never stored its secret is deleted by the
//! next [`ensure`], which makes a new one: there is never more than one key per binding after
//! an [`ensure`] returns.
//!
//! Refusals: `objectstorage-endpoint-invalid` ([`check_endpoint`]), `binding-name-invalid`
//! ([`bucket_name`]), and for the endpoint's answers `objectstorage-endpoint-unreachable` (no
//! answer: connecting failed or timed out; retryable), `objectstorage-admin-rejected` (the admin
//! key pair refused: `InvalidAccessKeyId`, `SignatureDoesNotMatch`, `InvalidClientTokenId`,
//! `AccessDenied` or HTTP 401/403 on the admin's own call), `objectstorage-users-unsupported`
//! (the endpoint has no IAM API — HTTP 404/405/501, `NotImplemented`, an answer that is not
//! IAM's — so no key pair limited to one bucket can be made there) and
//! `objectstorage-provider-failed` (anything else: `data.code`, `data.status`; retryable for
//! HTTP 5xx, 429 and throttling).
//!
//! A secret key is never in a refusal, a log line or a `Debug` output: refusals carry the
//! provider's error code and message, never its raw answer (an S3 signature error's body echoes
//! what was signed).
//!
//! Not handled: versioned buckets ([`drop`] deletes current objects only, so a bucket holding
//! object versions or delete markers is refused `BucketNotEmpty`: `objectstorage-provider-failed`);
//! AWS's eventual consistency of IAM (a new key may take seconds to work there; moto, MinIO-like
//! servers answer at once).

use aws_sdk_iam::Client as IamClient;
use aws_sdk_s3::Client as S3Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, SharedHttpClient};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::types::{BucketLocationConstraint, CreateBucketConfiguration, Delete, ObjectIdentifier};
use capstan_core::refusal::{Refusal, Result};
use serde_json::json;
use std::fmt;
use std::time::Duration;
use zeroize::Zeroizing;

/// How long Capstan waits for the endpoint to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one attempt of a request may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request may take, its retries included.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(90);

/// The prefix of every binding's bucket and IAM user.
pub const NAME_PREFIX: &str = "capstan-";

/// The name of the inline policy Capstan puts on a binding's user.
pub const POLICY_NAME: &str = "capstan-binding";

/// The longest binding id (`[a-z][a-z0-9_]{0,39}`).
const MAX_BINDING_ID: usize = 40;

/// Keys [`drop`] deletes per `DeleteObjects` (S3's limit is 1000).
const DELETE_BATCH: usize = 1000;

/// Where and as whom Capstan administers an S3 endpoint.
///
/// `Debug` shows everything but the secret key.
#[derive(Clone)]
pub struct Admin {
    /// The endpoint's origin, `http(s)://host[:port]` ([`check_endpoint`]): S3 and IAM both.
    pub endpoint: String,
    /// The region requests are signed for and buckets are created in.
    pub region: String,
    /// The admin key pair's access key id (IAM and S3 rights).
    pub access_key_id: String,
    /// The admin key pair's secret key.
    pub secret_access_key: Zeroizing<String>,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

/// What [`ensure`] hands back: the binding's bucket and its key pair.
///
/// `secret_access_key` is empty when the caller already holds the key's secret (the key id it
/// said it holds is still the user's): the caller keeps the secret it holds. `Debug` shows
/// everything but the secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct Granted {
    /// The binding's bucket.
    pub bucket: String,
    /// The binding's access key id.
    pub access_key_id: String,
    /// Its secret key — empty when it is the key the caller said it holds.
    pub secret_access_key: Zeroizing<String>,
}

impl fmt::Debug for Granted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Granted")
            .field("bucket", &self.bucket)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &if self.secret_access_key.is_empty() { "<held by the caller>" } else { "<redacted>" })
            .finish()
    }
}

fn endpoint_invalid(field: &str, message: String) -> Refusal {
    Refusal::new("objectstorage-endpoint-invalid", message).with_data(json!({ "field": field }))
}

/// Check an S3 endpoint and region as Capstan keeps them: `endpoint` a canonical `http://` or
/// `https://` origin — lowercase scheme and host (a DNS name, an IPv4 address or an IPv6
/// address in brackets), a port only when it is not the scheme's default, no user info, path
/// (not even `/`), query or fragment; `region` 1–32 of `a-z 0-9 -`. Refused
/// `objectstorage-endpoint-invalid` naming the field (`data.field`); an endpoint holding user
/// info is not echoed.
pub fn check_endpoint(endpoint: &str, region: &str) -> Result<()> {
    let (scheme, authority) = if let Some(rest) = endpoint.strip_prefix("https://") {
        ("https", rest)
    } else if let Some(rest) = endpoint.strip_prefix("http://") {
        ("http", rest)
    } else {
        return Err(endpoint_invalid("endpoint", format!("the S3 endpoint must be an http:// or https:// origin, not {endpoint:?}")));
    };
    if authority.contains('@') {
        // not echoed: it may hold credentials
        return Err(endpoint_invalid("endpoint", "the S3 endpoint must not hold user info (credentials)".into()));
    }
    let invalid = |why: &str| endpoint_invalid("endpoint", format!("the S3 endpoint {endpoint:?} is not a canonical origin: {why}"));
    if authority.contains(['/', '?', '#']) {
        return Err(invalid("it may have no path (not even a trailing '/'), query or fragment"));
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let Some((address, after)) = rest.split_once(']') else { return Err(invalid("an IPv6 address lacks its ']'")) };
        if address.parse::<std::net::Ipv6Addr>().is_err() || address.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(invalid("the host is not a lowercase IPv6 address"));
        }
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or_else(|| invalid("only ':port' may follow an IPv6 address"))?),
        };
        (None, port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(authority), None),
        }
    };
    if let Some(host) = host {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
            return Err(invalid("the host must be a lowercase DNS name, an IPv4 address or an IPv6 address in brackets"));
        }
    }
    if let Some(port) = port {
        let number = port.parse::<u16>().ok().filter(|p| *p > 0 && !port.starts_with('0'));
        match number {
            None => return Err(invalid("the port must be a number from 1 to 65535 without leading zeros")),
            Some(80) if scheme == "http" => return Err(invalid("port 80 is http's default: leave it out")),
            Some(443) if scheme == "https" => return Err(invalid("port 443 is https's default: leave it out")),
            Some(_) => {}
        }
    }
    if region.is_empty() || region.len() > 32 || !region.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
        return Err(endpoint_invalid(
            "region",
            format!("the S3 region must be 1 to 32 of a-z, 0-9 and '-' (such as us-east-1), not {region:?}"),
        ));
    }
    Ok(())
}

fn name_invalid(binding_id: &str, why: &str) -> Refusal {
    Refusal::new("binding-name-invalid", format!("no S3 bucket name can be made of the binding id: {why}"))
        .with_data(json!({ "bindingId": binding_id }))
}

/// Check a binding id: `[a-z][a-z0-9_]{0,39}`, not ending in `_` (a bucket name ends in a
/// letter or a digit) and not making one of the suffixes S3 reserves (`-s3alias`, `--ol-s3`,
/// `--x-s3`, `--table-s3`).
fn check_binding_id(binding_id: &str) -> Result<()> {
    let mut chars = binding_id.chars();
    if !matches!(chars.next(), Some('a'..='z')) {
        return Err(name_invalid(binding_id, "it must start with a lowercase letter"));
    }
    if binding_id.len() > MAX_BINDING_ID {
        return Err(name_invalid(binding_id, &format!("it is longer than {MAX_BINDING_ID} characters")));
    }
    if !chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_')) {
        return Err(name_invalid(binding_id, "it may hold only lowercase letters, digits and '_'"));
    }
    if binding_id.ends_with('_') {
        return Err(name_invalid(binding_id, "it must not end with '_'"));
    }
    let dashed = binding_id.replace('_', "-");
    if ["-s3alias", "--ol-s3", "--x-s3", "--table-s3"].iter().any(|s| dashed.ends_with(s)) {
        return Err(name_invalid(binding_id, "it would end the bucket's name with a suffix S3 reserves"));
    }
    Ok(())
}

/// A binding's bucket: `capstan-` and the binding id with `_` as `-` (at most 48 characters, a
/// valid S3 bucket name). Ids outside `[a-z][a-z0-9_]{0,39}`, ending with `_` or making a
/// suffix S3 reserves are refused `binding-name-invalid` (never truncated or changed otherwise:
/// two bindings would share a bucket).
pub fn bucket_name(binding_id: &str) -> Result<String> {
    check_binding_id(binding_id)?;
    Ok(format!("{NAME_PREFIX}{}", binding_id.replace('_', "-")))
}

/// A binding's IAM user: `capstan-` and the binding id (IAM allows `_`).
pub fn user_name(binding_id: &str) -> Result<String> {
    check_binding_id(binding_id)?;
    Ok(format!("{NAME_PREFIX}{binding_id}"))
}

/// The inline policy of a binding's user: list the bucket, read, write and delete its objects.
pub fn policy(bucket: &str) -> String {
    json!({
        "Version": "2012-10-17",
        "Statement": [
            { "Sid": "ListTheBucket", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [format!("arn:aws:s3:::{bucket}")] },
            {
                "Sid": "UseItsObjects",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                "Resource": [format!("arn:aws:s3:::{bucket}/*")]
            }
        ]
    })
    .to_string()
}

/// The environment a binding's service gets: `S3_ENDPOINT`, `S3_BUCKET`, `S3_ACCESS_KEY_ID`,
/// `S3_SECRET_ACCESS_KEY`, `S3_REGION` (path-style addressing: the bucket is not in the host).
pub fn environment(endpoint: &str, region: &str, g: &Granted) -> Vec<(&'static str, String)> {
    vec![
        ("S3_ENDPOINT", endpoint.to_owned()),
        ("S3_BUCKET", g.bucket.clone()),
        ("S3_ACCESS_KEY_ID", g.access_key_id.clone()),
        ("S3_SECRET_ACCESS_KEY", g.secret_access_key.to_string()),
        ("S3_REGION", region.to_owned()),
    ]
}

/// Which of the endpoint's APIs a request went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    S3,
    Iam,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Api::S3 => "S3",
            Api::Iam => "IAM",
        }
    }
}

/// A failed request, as much of it as may be shown.
#[derive(Debug)]
struct Failure {
    /// No answer: a timeout, a connection failure, an answer cut short.
    unreachable: bool,
    /// An answer the client could not read as the API's (a different API answered, or it was
    /// cut short).
    unparsed: bool,
    status: Option<u16>,
    code: Option<String>,
    /// The causes' messages, the status and the request id (never the raw answer).
    detail: String,
}

impl Failure {
    fn of<E>(err: &SdkError<E>) -> Failure
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let status = err.raw_response().map(|r| r.status().as_u16());
        let code = err.code().map(str::to_owned);
        let unreachable = matches!(err, SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_));
        let unparsed = matches!(err, SdkError::ResponseError(_)) && status.is_some();
        let mut detail = String::new();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = cause {
            if !detail.is_empty() {
                detail.push_str(": ");
            }
            detail.push_str(&e.to_string());
            cause = e.source();
        }
        if let Some(message) = err.message() {
            detail.push_str(&format!(": {message}"));
        }
        if let Some(status) = status {
            detail.push_str(&format!(" (HTTP {status})"));
        }
        Failure { unreachable, unparsed, status, code, detail }
    }

    fn code(&self) -> &str {
        self.code.as_deref().unwrap_or("")
    }

    fn is(&self, code: &str) -> bool {
        self.code() == code
    }

    /// The admin's key pair refused (unknown, wrong secret, or not allowed).
    fn credentials_refused(&self) -> bool {
        self.status.is_some_and(|s| s == 401 || s == 403)
            || matches!(
                self.code(),
                "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "InvalidClientTokenId" | "ExpiredToken" | "InvalidToken"
            )
    }

    /// The answer says there is no IAM API here.
    fn no_iam(&self) -> bool {
        self.status.is_some_and(|s| matches!(s, 404 | 405 | 501))
            || matches!(self.code(), "NotImplemented" | "InvalidAction" | "UnknownOperation" | "MethodNotAllowed" | "InvalidRequest")
            // an answer IAM's parser does not understand (no error code, or no IAM answer at all)
            || (self.code.is_none() && self.status.is_some_and(|s| s < 500))
            || self.unparsed
    }

    fn transient(&self) -> bool {
        self.status.is_some_and(|s| s >= 500 || s == 429)
            || matches!(
                self.code(),
                "SlowDown" | "Throttling" | "ThrottlingException" | "RequestTimeout" | "InternalError" | "ServiceUnavailable"
            )
    }

    /// The refusal for `doing` ("create a binding's bucket") having failed at `admin`'s endpoint.
    fn refusal(&self, admin: &Admin, api: Api, doing: &str) -> Refusal {
        let endpoint = &admin.endpoint;
        let data = json!({ "endpoint": endpoint, "api": api.name(), "code": self.code, "status": self.status });
        if api == Api::Iam && self.unparsed && !self.transient() {
            return users_unsupported(admin, doing, &self.detail, data);
        }
        if self.unreachable {
            return Refusal::new(
                "objectstorage-endpoint-unreachable",
                format!("cannot {doing}: the S3 endpoint {endpoint} cannot be reached ({})", self.detail),
            )
            .with_data(json!({ "endpoint": endpoint }))
            .retryable();
        }
        if api == Api::Iam && self.no_iam() && !self.credentials_refused() {
            return users_unsupported(admin, doing, &self.detail, data);
        }
        if self.credentials_refused() {
            let code = self.code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default();
            return Refusal::new(
                "objectstorage-admin-rejected",
                format!(
                    "cannot {doing}: the S3 endpoint {endpoint} refused the admin key {}{code} on its {} API; check the key pair and its S3 and IAM rights",
                    admin.access_key_id,
                    api.name()
                ),
            )
            .with_data(data)
            .detail(&self.detail);
        }
        let what = self.code.clone().or_else(|| self.status.map(|s| format!("HTTP {s}"))).unwrap_or_else(|| "no answer".into());
        let refusal = Refusal::new(
            "objectstorage-provider-failed",
            format!("the S3 endpoint {endpoint} failed to {doing} ({} API: {what})", api.name()),
        )
        .with_data(data)
        .detail(&self.detail);
        if self.transient() { refusal.retryable() } else { refusal }
    }
}

fn users_unsupported(admin: &Admin, doing: &str, detail: &str, data: serde_json::Value) -> Refusal {
    Refusal::new(
        "objectstorage-users-unsupported",
        format!(
            "cannot {doing}: the S3 endpoint {} answers no IAM API, so no key pair limited to one bucket can be made there",
            admin.endpoint
        ),
    )
    .with_data(data)
    .detail(detail)
}

/// The clients' HTTP connector: rustls with aws-lc, the platform's roots.
fn http_client() -> SharedHttpClient {
    use aws_smithy_http_client::tls;
    aws_smithy_http_client::Builder::new().tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc)).build_https()
}

fn credentials(admin: &Admin) -> Credentials {
    Credentials::new(&admin.access_key_id, admin.secret_access_key.as_str(), None, None, "capstan-storage")
}

fn timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build()
}

/// The admin's S3 and IAM clients, both at its endpoint. Checks the endpoint first.
struct Clients {
    s3: S3Client,
    iam: IamClient,
}

impl Clients {
    fn new(admin: &Admin) -> Result<Clients> {
        check_endpoint(&admin.endpoint, &admin.region)?;
        let http = http_client();
        let s3 = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(admin.region.clone()))
            .credentials_provider(credentials(admin))
            .endpoint_url(&admin.endpoint)
            .force_path_style(true)
            .retry_config(RetryConfig::standard())
            .timeout_config(timeouts())
            .http_client(http.clone())
            .build();
        let iam = aws_sdk_iam::Config::builder()
            .behavior_version(aws_sdk_iam::config::BehaviorVersion::latest())
            .region(aws_sdk_iam::config::Region::new(admin.region.clone()))
            .credentials_provider(credentials(admin))
            .endpoint_url(&admin.endpoint)
            .retry_config(RetryConfig::standard())
            .timeout_config(timeouts())
            .http_client(http)
            .build();
        Ok(Clients { s3: S3Client::from_conf(s3), iam: IamClient::from_conf(iam) })
    }
}

/// Check that the admin key pair works at its endpoint: S3 `ListBuckets`, then IAM `GetUser`
/// (the key's own user). Refused `objectstorage-endpoint-invalid`, `-unreachable`,
/// `objectstorage-admin-rejected` (S3 refusing the key, or IAM refusing it access), and
/// `objectstorage-users-unsupported` when the IAM call gets no IAM answer — S3 having accepted
/// the same key, a signature or key error from the IAM call means the same.
pub async fn check(admin: &Admin) -> Result<()> {
    let clients = Clients::new(admin)?;
    clients.s3.list_buckets().send().await.map_err(|e| Failure::of(&e).refusal(admin, Api::S3, "list its buckets"))?;
    if let Err(err) = clients.iam.get_user().send().await {
        let failure = Failure::of(&err);
        let doing = "read the admin's IAM user";
        if !failure.unreachable && !failure.is("AccessDenied") && (failure.no_iam() || failure.credentials_refused()) {
            let data = json!({ "endpoint": admin.endpoint, "api": "IAM", "code": failure.code, "status": failure.status });
            return Err(users_unsupported(admin, doing, &failure.detail, data));
        }
        return Err(failure.refusal(admin, Api::Iam, doing));
    }
    Ok(())
}

/// Make sure the binding's bucket exists (created in the admin's region when missing).
async fn ensure_bucket(clients: &Clients, admin: &Admin, bucket: &str) -> Result<()> {
    match clients.s3.head_bucket().bucket(bucket).send().await {
        Ok(_) => return Ok(()),
        Err(err) => {
            let failure = Failure::of(&err);
            // 403: a bucket someone else owns (or a key refused): CreateBucket tells which
            if !matches!(failure.status, Some(404 | 403)) {
                return Err(failure.refusal(admin, Api::S3, "look for a binding's bucket"));
            }
        }
    }
    let mut create = clients.s3.create_bucket().bucket(bucket);
    if admin.region != "us-east-1" {
        create = create.create_bucket_configuration(
            CreateBucketConfiguration::builder().location_constraint(BucketLocationConstraint::from(admin.region.as_str())).build(),
        );
    }
    match create.send().await {
        Ok(_) => Ok(()),
        Err(err) => {
            let failure = Failure::of(&err);
            if failure.is("BucketAlreadyOwnedByYou") {
                return Ok(());
            }
            if failure.is("BucketAlreadyExists") {
                return Err(Refusal::new(
                    "objectstorage-provider-failed",
                    format!("the bucket {bucket} on the S3 endpoint {} belongs to someone else", admin.endpoint),
                )
                .with_data(
                    json!({ "endpoint": admin.endpoint, "api": "S3", "code": failure.code, "status": failure.status, "bucket": bucket }),
                ));
            }
            Err(failure.refusal(admin, Api::S3, "create a binding's bucket"))
        }
    }
}

/// Make sure the binding's IAM user exists.
async fn ensure_user(clients: &Clients, admin: &Admin, user: &str) -> Result<()> {
    match clients.iam.get_user().user_name(user).send().await {
        Ok(_) => return Ok(()),
        Err(err) => {
            let failure = Failure::of(&err);
            if !failure.is("NoSuchEntity") {
                return Err(failure.refusal(admin, Api::Iam, "look for a binding's IAM user"));
            }
        }
    }
    match clients.iam.create_user().user_name(user).send().await {
        Ok(_) => Ok(()),
        Err(err) => {
            let failure = Failure::of(&err);
            // created meanwhile by a concurrent call
            if failure.is("EntityAlreadyExists") {
                return Ok(());
            }
            Err(failure.refusal(admin, Api::Iam, "create a binding's IAM user"))
        }
    }
}

/// The user's access keys: (id, active). `None` when the user does not exist.
async fn access_keys(clients: &Clients, admin: &Admin, user: &str) -> Result<Option<Vec<(String, bool)>>> {
    let mut keys = Vec::new();
    let mut marker: Option<String> = None;
    loop {
        let out = match clients.iam.list_access_keys().user_name(user).set_marker(marker.take()).send().await {
            Ok(out) => out,
            Err(err) => {
                let failure = Failure::of(&err);
                if failure.is("NoSuchEntity") {
                    return Ok(None);
                }
                return Err(failure.refusal(admin, Api::Iam, "list a binding user's access keys"));
            }
        };
        for key in out.access_key_metadata() {
            if let Some(id) = key.access_key_id() {
                let active = key.status().is_none_or(|s| *s == aws_sdk_iam::types::StatusType::Active);
                keys.push((id.to_owned(), active));
            }
        }
        match out.marker() {
            Some(next) if out.is_truncated() => marker = Some(next.to_owned()),
            _ => return Ok(Some(keys)),
        }
    }
}

/// Delete one of the user's access keys (one already gone is fine).
async fn delete_key(clients: &Clients, admin: &Admin, user: &str, id: &str) -> Result<()> {
    match clients.iam.delete_access_key().user_name(user).access_key_id(id).send().await {
        Ok(_) => Ok(()),
        Err(err) => {
            let failure = Failure::of(&err);
            if failure.is("NoSuchEntity") {
                return Ok(());
            }
            Err(failure.refusal(admin, Api::Iam, "delete a binding's access key"))
        }
    }
}

/// Make sure the binding is on the endpoint — its bucket, its IAM user, the user's policy
/// ([`policy`], put again every time) — and hand back its key pair. Idempotent; resumes
/// wherever an earlier call stopped.
///
/// The key: when `held_access_key_id` is given and is still an active key of the user, the
/// caller holds its secret: the answer names that key with an **empty** secret (the caller
/// keeps the secret it holds), and every other key of the user is deleted. Otherwise every key
/// of the user is deleted (ones whose secret a crashed call never delivered included) and a new
/// one is created, its secret in the answer — the only time it is ever shown. Either way the
/// user has exactly one key afterwards.
pub async fn ensure(admin: &Admin, binding_id: &str, held_access_key_id: Option<&str>) -> Result<Granted> {
    let bucket = bucket_name(binding_id)?;
    let user = user_name(binding_id)?;
    let clients = Clients::new(admin)?;
    ensure_bucket(&clients, admin, &bucket).await?;
    ensure_user(&clients, admin, &user).await?;
    clients
        .iam
        .put_user_policy()
        .user_name(&user)
        .policy_name(POLICY_NAME)
        .policy_document(policy(&bucket))
        .send()
        .await
        .map_err(|e| Failure::of(&e).refusal(admin, Api::Iam, "set a binding user's policy"))?;

    let keys = access_keys(&clients, admin, &user).await?.unwrap_or_default();
    let held = held_access_key_id.filter(|held| keys.iter().any(|(id, active)| id == held && *active));
    for (id, _) in &keys {
        if Some(id.as_str()) != held {
            delete_key(&clients, admin, &user, id).await?;
        }
    }
    if let Some(held) = held {
        tracing::info!(binding_id, bucket, "S3 binding ensured: bucket, user, policy; the held key stays");
        return Ok(Granted { bucket, access_key_id: held.to_owned(), secret_access_key: Zeroizing::new(String::new()) });
    }
    let out = clients
        .iam
        .create_access_key()
        .user_name(&user)
        .send()
        .await
        .map_err(|e| Failure::of(&e).refusal(admin, Api::Iam, "create a binding's access key"))?;
    let Some(key) = out.access_key() else {
        return Err(Refusal::new(
            "objectstorage-provider-failed",
            format!("the S3 endpoint {} created an access key without naming it", admin.endpoint),
        )
        .with_data(json!({ "endpoint": admin.endpoint, "api": "IAM", "code": null, "status": null })));
    };
    let granted = Granted {
        bucket,
        access_key_id: key.access_key_id().to_owned(),
        secret_access_key: Zeroizing::new(key.secret_access_key().to_owned()),
    };
    tracing::info!(
        binding_id,
        bucket = granted.bucket,
        access_key_id = granted.access_key_id,
        "S3 binding ensured: bucket, user, policy, a new key"
    );
    Ok(granted)
}

/// Stop the binding's credentials at once: every access key of its user is deleted. The user,
/// its policy and the bucket stay ([`drop`] removes them). A user that is not there is fine.
pub async fn revoke(admin: &Admin, binding_id: &str) -> Result<()> {
    let user = user_name(binding_id)?;
    let clients = Clients::new(admin)?;
    revoke_keys(&clients, admin, &user).await?;
    tracing::info!(binding_id, "S3 binding revoked: its access keys deleted");
    Ok(())
}

async fn revoke_keys(clients: &Clients, admin: &Admin, user: &str) -> Result<bool> {
    let Some(keys) = access_keys(clients, admin, user).await? else {
        return Ok(false);
    };
    for (id, _) in &keys {
        delete_key(clients, admin, user, id).await?;
    }
    Ok(true)
}

/// Remove the binding: its keys first ([`revoke`]), then its user's inline policies and the
/// user, then every object of the bucket (listed page by page, deleted a thousand at a time;
/// unfinished multipart uploads aborted) and the bucket. Idempotent: what is not there is fine.
/// Object versions are out of reach: a versioned bucket keeping some is refused
/// `objectstorage-provider-failed` (`BucketNotEmpty`).
pub async fn drop(admin: &Admin, binding_id: &str) -> Result<()> {
    let bucket = bucket_name(binding_id)?;
    let user = user_name(binding_id)?;
    let clients = Clients::new(admin)?;
    if revoke_keys(&clients, admin, &user).await? {
        delete_user(&clients, admin, &user).await?;
    }
    empty_bucket(&clients, admin, &bucket).await?;
    match clients.s3.delete_bucket().bucket(&bucket).send().await {
        Ok(_) => {}
        Err(err) => {
            let failure = Failure::of(&err);
            if !failure.is("NoSuchBucket") {
                return Err(failure.refusal(admin, Api::S3, "delete a binding's bucket"));
            }
        }
    }
    tracing::info!(binding_id, bucket, "S3 binding dropped: keys, user and bucket");
    Ok(())
}

/// Delete the user's inline policies, then the user.
async fn delete_user(clients: &Clients, admin: &Admin, user: &str) -> Result<()> {
    let mut policies = Vec::new();
    let mut marker: Option<String> = None;
    loop {
        let out = match clients.iam.list_user_policies().user_name(user).set_marker(marker.take()).send().await {
            Ok(out) => out,
            Err(err) => {
                let failure = Failure::of(&err);
                if failure.is("NoSuchEntity") {
                    return Ok(());
                }
                return Err(failure.refusal(admin, Api::Iam, "list a binding user's policies"));
            }
        };
        policies.extend(out.policy_names().iter().cloned());
        match out.marker() {
            Some(next) if out.is_truncated() => marker = Some(next.to_owned()),
            _ => break,
        }
    }
    if !policies.iter().any(|p| p == POLICY_NAME) {
        policies.push(POLICY_NAME.to_owned());
    }
    for name in &policies {
        if let Err(err) = clients.iam.delete_user_policy().user_name(user).policy_name(name).send().await {
            let failure = Failure::of(&err);
            if !failure.is("NoSuchEntity") {
                return Err(failure.refusal(admin, Api::Iam, "delete a binding user's policy"));
            }
        }
    }
    if let Err(err) = clients.iam.delete_user().user_name(user).send().await {
        let failure = Failure::of(&err);
        if !failure.is("NoSuchEntity") {
            return Err(failure.refusal(admin, Api::Iam, "delete a binding's IAM user"));
        }
    }
    Ok(())
}

/// Delete every object of the bucket and abort its unfinished uploads. A bucket that is not
/// there is fine.
async fn empty_bucket(clients: &Clients, admin: &Admin, bucket: &str) -> Result<()> {
    let gone = |failure: &Failure| failure.is("NoSuchBucket");
    let mut last_first: Option<String> = None;
    loop {
        // always the first page: what was listed is deleted before the next listing
        let out = match clients.s3.list_objects_v2().bucket(bucket).max_keys(DELETE_BATCH as i32).send().await {
            Ok(out) => out,
            Err(err) => {
                let failure = Failure::of(&err);
                if gone(&failure) {
                    return Ok(());
                }
                return Err(failure.refusal(admin, Api::S3, "list a binding bucket's objects"));
            }
        };
        let keys: Vec<&str> = out.contents().iter().filter_map(|o| o.key()).collect();
        if keys.is_empty() {
            break;
        }
        // the first key of a listing made after deleting the previous one's: the deletion did
        // not take (no endless loop over a server answering so)
        if last_first.as_deref() == keys.first().copied() {
            return Err(Refusal::new(
                "objectstorage-provider-failed",
                format!("the S3 endpoint {} still lists objects of a binding's bucket it said it deleted", admin.endpoint),
            )
            .with_data(json!({ "endpoint": admin.endpoint, "api": "S3", "code": null, "status": null, "bucket": bucket }))
            .retryable());
        }
        last_first = keys.first().map(|k| (*k).to_owned());
        let objects = keys
            .iter()
            .map(|k| ObjectIdentifier::builder().key(*k).build())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Refusal::internal("an object to delete could not be named").detail(e))?;
        let delete = Delete::builder()
            .set_objects(Some(objects))
            .quiet(true)
            .build()
            .map_err(|e| Refusal::internal("the objects to delete could not be named").detail(e))?;
        let out = clients
            .s3
            .delete_objects()
            .bucket(bucket)
            .delete(delete)
            .send()
            .await
            .map_err(|e| Failure::of(&e).refusal(admin, Api::S3, "delete a binding bucket's objects"))?;
        if let Some(error) = out.errors().first() {
            return Err(Refusal::new(
                "objectstorage-provider-failed",
                format!(
                    "the S3 endpoint {} failed to delete {} of a binding bucket's objects ({})",
                    admin.endpoint,
                    out.errors().len(),
                    error.code().unwrap_or("no code")
                ),
            )
            .with_data(json!({ "endpoint": admin.endpoint, "api": "S3", "code": error.code(), "status": null, "bucket": bucket })));
        }
    }
    loop {
        let out = match clients.s3.list_multipart_uploads().bucket(bucket).send().await {
            Ok(out) => out,
            Err(err) => {
                let failure = Failure::of(&err);
                if gone(&failure) {
                    return Ok(());
                }
                return Err(failure.refusal(admin, Api::S3, "list a binding bucket's unfinished uploads"));
            }
        };
        let uploads: Vec<(&str, &str)> = out.uploads().iter().filter_map(|u| Some((u.key()?, u.upload_id()?))).collect();
        if uploads.is_empty() {
            return Ok(());
        }
        for (key, upload_id) in uploads {
            if let Err(err) = clients.s3.abort_multipart_upload().bucket(bucket).key(key).upload_id(upload_id).send().await {
                let failure = Failure::of(&err);
                if !failure.is("NoSuchUpload") && !gone(&failure) {
                    return Err(failure.refusal(admin, Api::S3, "abort a binding bucket's unfinished upload"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_canonical_origins() {
        for good in [
            "http://127.0.0.1:9000",
            "https://s3.example.com",
            "https://s3.example.com:8443",
            "http://[::1]:9000",
            "http://[fd00::2]",
            "http://minio",
        ] {
            check_endpoint(good, "us-east-1").unwrap_or_else(|r| panic!("{good}: {r:?}"));
        }
        for bad in [
            "",
            "s3.example.com",
            "ftp://s3.example.com",
            "HTTP://s3.example.com",
            "https://S3.example.com",
            "https://s3.example.com/",
            "https://s3.example.com/bucket",
            "https://s3.example.com?x=1",
            "https://s3.example.com#f",
            "https://s3.example.com:443",
            "http://s3.example.com:80",
            "http://s3.example.com:0",
            "http://s3.example.com:09000",
            "http://s3.example.com:65536",
            "http://10.0.0.5:80800",
            "http://s3.example.com:",
            "http://:9000",
            "http://-s3.example.com",
            "http://s3..example.com",
            "http://s3 example.com",
            "http://[::1",
            "http://[::G]:9000",
            "http://[FD00::2]",
            "http://[::1]x",
        ] {
            let refusal = check_endpoint(bad, "us-east-1").unwrap_err();
            assert!(refusal.is("objectstorage-endpoint-invalid"), "{bad}: {refusal:?}");
            assert_eq!(refusal.data.as_ref().and_then(|d| d["field"].as_str()), Some("endpoint"), "{bad}");
        }
        let refusal = check_endpoint("https://admin:hunter2@s3.example.com", "us-east-1").unwrap_err();
        assert!(refusal.is("objectstorage-endpoint-invalid"));
        assert!(!refusal.message.contains("hunter2"), "{}", refusal.message);
        for bad in ["", "US-EAST-1", "us_east_1", "us east", &"a".repeat(33)] {
            let refusal = check_endpoint("http://127.0.0.1:9000", bad).unwrap_err();
            assert!(refusal.is("objectstorage-endpoint-invalid"), "{bad:?}: {refusal:?}");
            assert_eq!(refusal.data.as_ref().and_then(|d| d["field"].as_str()), Some("region"), "{bad:?}");
        }
        check_endpoint("http://127.0.0.1:9000", "garage").unwrap();
        check_endpoint("http://127.0.0.1:9000", &"a".repeat(32)).unwrap();
    }

    #[test]
    fn bucket_names_are_valid_and_distinct() {
        let id = "bnd_0123456789abcdef0123456789abcdef";
        assert_eq!(bucket_name(id).unwrap(), "capstan-bnd-0123456789abcdef0123456789abcdef");
        assert_eq!(user_name(id).unwrap(), format!("capstan-{id}"));
        let longest = format!("a{}", "b".repeat(39));
        assert_eq!(bucket_name(&longest).unwrap().len(), 48);
        assert_eq!(bucket_name("x").unwrap(), "capstan-x");
        for bad in
            ["", "_a", "1abc", "Abc", "a-b", "a.b", "a b", "é", "abc_", "a_s3alias", "a__x_s3", "a__ol_s3", &format!("a{}", "b".repeat(40))]
        {
            let refusal = bucket_name(bad).unwrap_err();
            assert!(refusal.is("binding-name-invalid"), "{bad}: {refusal:?}");
        }
        // what S3 asks of a bucket name
        for id in [id, "x", "a_b_c", &longest] {
            let name = bucket_name(id).unwrap();
            assert!((3..=63).contains(&name.len()), "{name}");
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{name}");
            assert!(name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()), "{name}");
        }
    }

    #[test]
    fn the_policy_names_the_bucket_alone() {
        let policy: serde_json::Value = serde_json::from_str(&policy("capstan-x")).unwrap();
        let statements = policy["Statement"].as_array().unwrap();
        assert_eq!(statements.len(), 2);
        assert_eq!(statements[0]["Action"], json!(["s3:ListBucket"]));
        assert_eq!(statements[0]["Resource"], json!(["arn:aws:s3:::capstan-x"]));
        assert_eq!(statements[1]["Action"], json!(["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]));
        assert_eq!(statements[1]["Resource"], json!(["arn:aws:s3:::capstan-x/*"]));
    }

    #[test]
    fn environment_names_the_bucket_and_key() {
        let granted =
            Granted { bucket: "capstan-x".into(), access_key_id: "AKIAEXAMPLE".into(), secret_access_key: Zeroizing::new("s3cr3t".into()) };
        let env = environment("http://127.0.0.1:9000", "us-east-1", &granted);
        let get = |key: &str| env.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str()).unwrap();
        assert_eq!(get("S3_ENDPOINT"), "http://127.0.0.1:9000");
        assert_eq!(get("S3_BUCKET"), "capstan-x");
        assert_eq!(get("S3_ACCESS_KEY_ID"), "AKIAEXAMPLE");
        assert_eq!(get("S3_SECRET_ACCESS_KEY"), "s3cr3t");
        assert_eq!(get("S3_REGION"), "us-east-1");
        assert_eq!(env.len(), 5);
    }

    #[test]
    fn failures_are_named_for_the_operator() {
        let admin = Admin {
            endpoint: "http://127.0.0.1:9000".into(),
            region: "us-east-1".into(),
            access_key_id: "AKIAADMIN".into(),
            secret_access_key: Zeroizing::new("hunter2-secret".into()),
        };
        let failure = |status: Option<u16>, code: Option<&str>, unreachable: bool| Failure {
            unreachable,
            unparsed: false,
            status,
            code: code.map(str::to_owned),
            detail: "detail".into(),
        };
        let named = |f: Failure, api: Api| f.refusal(&admin, api, "do it");
        let unreachable = named(failure(None, None, true), Api::S3);
        assert!(unreachable.is("objectstorage-endpoint-unreachable") && unreachable.retryable, "{unreachable:?}");
        for code in ["InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"] {
            assert!(named(failure(Some(403), Some(code), false), Api::S3).is("objectstorage-admin-rejected"), "{code}");
            assert!(named(failure(Some(403), Some(code), false), Api::Iam).is("objectstorage-admin-rejected"), "{code}");
        }
        for (status, code) in
            [(404, None), (405, Some("MethodNotAllowed")), (501, Some("NotImplemented")), (400, Some("InvalidAction")), (200, None)]
        {
            let refusal = named(failure(Some(status), code, false), Api::Iam);
            assert!(refusal.is("objectstorage-users-unsupported"), "{status} {code:?}: {refusal:?}");
        }
        let failed = named(failure(Some(409), Some("BucketNotEmpty"), false), Api::S3);
        assert!(failed.is("objectstorage-provider-failed") && !failed.retryable, "{failed:?}");
        assert_eq!(failed.data.as_ref().unwrap()["code"], "BucketNotEmpty");
        let busy = named(failure(Some(503), Some("SlowDown"), false), Api::S3);
        assert!(busy.is("objectstorage-provider-failed") && busy.retryable, "{busy:?}");
        let garbled = Failure { unparsed: true, ..failure(Some(200), None, true) };
        assert!(named(garbled, Api::Iam).is("objectstorage-users-unsupported"));
        let cut = Failure { unparsed: true, ..failure(Some(200), None, true) };
        assert!(named(cut, Api::S3).is("objectstorage-endpoint-unreachable"));
        let missing = named(failure(Some(404), Some("NoSuchBucket"), false), Api::S3);
        assert!(missing.is("objectstorage-provider-failed"), "{missing:?}");
    }

    #[test]
    fn debug_redacts_secret_keys() {
        let admin = Admin {
            endpoint: "http://127.0.0.1:9000".into(),
            region: "us-east-1".into(),
            access_key_id: "AKIAADMIN".into(),
            secret_access_key: Zeroizing::new("hunter2-secret".into()),
        };
        let shown = format!("{admin:?}");
        assert!(!shown.contains("hunter2") && shown.contains("AKIAADMIN") && shown.contains("<redacted>"), "{shown}");
        let granted = Granted {
            bucket: "capstan-x".into(),
            access_key_id: "AKIAX".into(),
            secret_access_key: Zeroizing::new("hunter3-secret".into()),
        };
        let shown = format!("{granted:?}");
        assert!(!shown.contains("hunter3") && shown.contains("AKIAX") && shown.contains("<redacted>"), "{shown}");
    }
}
