//! `capstan serve` with its blobs in S3 (moto in CI, see .ci/peers.sh): ready on a fresh bucket,
//! refused `blob-bucket-missing` for a missing one, and the secret key printed nowhere.
//! Skipped, saying so, when `CAPSTAN_TEST_S3_ENDPOINT` is not set.

use crate::support::{Capstan, ProdConfig, run_to_exit, with_test_admin};
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use std::path::Path;
use std::process::Command;

pub(crate) const ACCESS_KEY: &str = "capstan-e2e";
/// Distinctive, so finding it in any output is unambiguous.
pub(crate) const SECRET_KEY: &str = "e2e-secret-9f2c4b7a1d3e5f60";

pub(crate) fn endpoint() -> Option<String> {
    match std::env::var("CAPSTAN_TEST_S3_ENDPOINT") {
        Ok(endpoint) if !endpoint.trim().is_empty() => Some(endpoint.trim().to_string()),
        _ => {
            eprintln!("skipped: CAPSTAN_TEST_S3_ENDPOINT is not set (an S3 server such as moto; .ci/peers.sh starts one)");
            None
        }
    }
}

pub(crate) fn fresh_bucket_name() -> String {
    format!("capstan-e2e-{:016x}", rand::random::<u64>())
}

/// Create `bucket` on the test server with the SDK (signed, so a real S3 works too).
pub(crate) fn create_bucket(endpoint: &str, bucket: &str) {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "e2e"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    let client = aws_sdk_s3::Client::from_conf(config);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    runtime
        .block_on(client.create_bucket().bucket(bucket).send())
        .unwrap_or_else(|e| panic!("creating the bucket {bucket} at {endpoint}: {e}"));
}

/// `capstan serve` (production mode) with SQLite under `dir` and blobs in `s3://<bucket>/capstan`.
fn s3_command(dir: &Path, endpoint: &str, bucket: &str) -> Command {
    let prod = ProdConfig::under(dir);
    let mut cmd = prod.command();
    cmd.env("CAPSTAN_PUBLIC_ORIGIN", "http://127.0.0.1")
        .env("CAPSTAN_BLOB_URL", format!("s3://{bucket}/capstan"))
        .env("CAPSTAN_S3_ENDPOINT", endpoint)
        .env("CAPSTAN_S3_ACCESS_KEY", ACCESS_KEY)
        .env("CAPSTAN_S3_SECRET_KEY", SECRET_KEY)
        .env("CAPSTAN_S3_FORCE_PATH_STYLE", "true")
        // The most talkative level the SDK's own logs show up at, to look for the secret there too.
        .env("CAPSTAN_LOG", "debug")
        .current_dir(dir);
    cmd
}

fn assert_no_secret(what: &str, output: &str) {
    assert!(!output.contains(SECRET_KEY), "the S3 secret key must never be printed, but {what} holds it:\n{output}");
}

#[test]
fn serves_ready_with_blobs_in_an_s3_bucket() {
    let Some(endpoint) = endpoint() else { return };
    let dir = tempfile::tempdir().unwrap();
    let bucket = fresh_bucket_name();
    create_bucket(&endpoint, &bucket);

    let server = Capstan::start(with_test_admin(s3_command(dir.path(), &endpoint, &bucket)));
    let status = server.admin_status();
    assert_eq!(status["ready"], true, "/status should be ready: {status}");
    assert_eq!(status["blobs"]["ok"], true, "the bucket should answer: {status}");
    let backend = status["blobs"]["backend"].as_str().unwrap_or_default();
    assert_eq!(backend, format!("s3://{bucket}/capstan (endpoint {})", endpoint.trim_end_matches('/')), "{status}");
    assert!(!dir.path().join("blobs").exists(), "no local blob directory is made when the blobs are in S3");

    let exited = server.stop();
    assert!(exited.status.success(), "SIGTERM should stop capstan cleanly, got {:?}; stderr:\n{}", exited.status, exited.stderr);
    assert!(exited.stderr.contains(&format!("s3://{bucket}/capstan")), "the start logs where the blobs are; stderr:\n{}", exited.stderr);
    assert_no_secret("stdout", &exited.stdout);
    assert_no_secret("stderr", &exited.stderr);
}

#[test]
fn a_missing_bucket_refuses_the_start_by_name() {
    let Some(endpoint) = endpoint() else { return };
    let dir = tempfile::tempdir().unwrap();
    let bucket = fresh_bucket_name();

    let exited = run_to_exit(s3_command(dir.path(), &endpoint, &bucket));
    let stderr = exited.assert_refused(1, "blob-bucket-missing");
    assert!(stderr.contains(&bucket), "the refusal names the bucket {bucket}; stderr:\n{stderr}");
    assert_no_secret("stdout", &exited.stdout);
    assert_no_secret("stderr", &exited.stderr);
}

#[test]
fn an_invalid_bucket_name_is_refused_before_anything_is_contacted() {
    // Needs no S3 server: the URL is checked first.
    let dir = tempfile::tempdir().unwrap();
    let exited = run_to_exit(s3_command(dir.path(), "http://127.0.0.1:9", "Not_A_Bucket"));
    let stderr = exited.assert_refused(1, "config-invalid");
    assert!(stderr.contains("Not_A_Bucket"), "the refusal names the bucket; stderr:\n{stderr}");
    assert_no_secret("stderr", &exited.stderr);
}

/// The production pair together: `capstan serve` on `mongodb://` and `s3://` starts, migrates
/// (stamps the empty database), serves `/status` ready and survives a restart.
#[test]
fn production_on_mongodb_and_s3_serves_ready_and_survives_a_restart() {
    let Some(endpoint) = endpoint() else { return };
    let Ok(mongo) = std::env::var("CAPSTAN_TEST_MONGODB_URL") else {
        eprintln!("skipped: CAPSTAN_TEST_MONGODB_URL is not set (.ci/peers.sh starts a MongoDB wire server)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bucket = fresh_bucket_name();
    create_bucket(&endpoint, &bucket);
    let database = format!("capstan_e2e_{:016x}", rand::random::<u64>());
    let prod = ProdConfig::under(dir.path());
    let command = || {
        let mut cmd = prod.command();
        cmd.env("CAPSTAN_PUBLIC_ORIGIN", "http://127.0.0.1")
            .env("CAPSTAN_DATABASE_URL", &mongo)
            .env("CAPSTAN_DATABASE_NAME", &database)
            .env("CAPSTAN_BLOB_URL", format!("s3://{bucket}/capstan"))
            .env("CAPSTAN_S3_ENDPOINT", &endpoint)
            .env("CAPSTAN_S3_ACCESS_KEY", ACCESS_KEY)
            .env("CAPSTAN_S3_SECRET_KEY", SECRET_KEY)
            .env("CAPSTAN_S3_FORCE_PATH_STYLE", "true")
            .current_dir(dir.path());
        cmd
    };
    let first = Capstan::start(with_test_admin(command()));
    let status = first.admin_status();
    assert_eq!(status["ready"], true, "{status}");
    assert!(status["store"]["backend"].as_str().unwrap_or_default().starts_with("mongodb://"), "{status}");
    assert!(status["blobs"]["backend"].as_str().unwrap_or_default().starts_with("s3://"), "{status}");
    let version = status["migrations"]["dataVersion"].clone();
    assert!(first.stderr().contains("stamped"), "the empty database is stamped at the target");
    let exited = first.stop();
    assert!(exited.status.success(), "{:?}\n{}", exited.status, exited.stderr);

    let second = Capstan::start(command());
    let status = second.ready_status();
    assert_eq!(status["ready"], true, "{status}");
    assert_eq!(status["migrations"]["dataVersion"], version, "{status}");
    assert!(!second.stderr().contains("stamped"), "a restart finds its ledger and stamps nothing");
    assert_no_secret("stderr", &second.stderr());
}
