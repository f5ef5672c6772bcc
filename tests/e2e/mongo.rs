//! `capstan serve` (production mode) with its store in MongoDB: the wire server named by
//! `CAPSTAN_TEST_MONGODB_URL` (nx-27017 in CI, see .ci/peers.sh), a fresh database per test.
//! Ready with a mongodb backend, restarts keep the ledger, and an unreachable deployment is
//! refused by name without ever printing the password. Skipped, saying so, when the variable
//! is not set (except the test that needs no server).

use crate::support::{Capstan, ProdConfig, free_port, run_to_exit, with_test_admin};
use capstan::store::{Document, Store, StoreOptions};
use std::path::Path;
use std::process::Command;

/// Distinctive, so finding it in any output is unambiguous.
const PASSWORD: &str = "e2e-mongo-pw-7c1f9a3b5d";

pub(crate) fn mongo_url() -> Option<String> {
    match std::env::var("CAPSTAN_TEST_MONGODB_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url.trim().to_string()),
        _ => {
            eprintln!("skipped: CAPSTAN_TEST_MONGODB_URL is not set (a MongoDB wire server such as nx-27017; .ci/peers.sh starts one)");
            None
        }
    }
}

pub(crate) fn fresh_database() -> String {
    format!("capstan_e2e_{:016x}", rand::random::<u64>())
}

/// `capstan serve --listen 127.0.0.1:0` with the store in `database` at `url`, blobs and keyring under `dir`.
pub(crate) fn mongo_command(prod: &ProdConfig, dir: &Path, url: &str, database: &str) -> Command {
    let mut cmd = prod.command();
    cmd.env("CAPSTAN_DATABASE_URL", url)
        .env("CAPSTAN_DATABASE_NAME", database)
        .env("CAPSTAN_PUBLIC_ORIGIN", "http://127.0.0.1")
        .env("CAPSTAN_LOG", "debug")
        .current_dir(dir);
    cmd
}

/// The host ledger in `database`, read through the library while no server runs.
fn read_ledger(url: &str, database: &str) -> Option<Document> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    runtime.block_on(async {
        let options = StoreOptions { database_name: Some(database.to_string()), ..StoreOptions::default() };
        let store = Store::open(url, &options).await.unwrap_or_else(|e| panic!("opening {database}: {e}"));
        capstan::migrate::declare(&store).await.expect("declaring the ledger collection");
        store
            .transact(|tx| async move { tx.get(capstan::migrate::LEDGER_COLLECTION, "capstan").await })
            .await
            .unwrap_or_else(|e| panic!("reading the ledger: {e}"))
    })
}

/// Collections holding documents in `database` before anything ran.
fn populated(url: &str, database: &str) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    runtime.block_on(async {
        let options = StoreOptions { database_name: Some(database.to_string()), ..StoreOptions::default() };
        let store = Store::open(url, &options).await.unwrap_or_else(|e| panic!("opening {database}: {e}"));
        store.populated_collections().await.unwrap_or_else(|e| panic!("listing {database}: {e}"))
    })
}

/// What `describe()` shows for the test URL: scheme, hosts and the database, nothing else.
fn described(url: &str, database: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a mongodb:// URL");
    let authority = rest.split(['?', '#']).next().unwrap_or_default();
    let hosts = authority.rsplit_once('@').map(|(_, h)| h).unwrap_or(authority).split('/').next().unwrap_or_default();
    format!("{scheme}://{hosts}/{database}")
}

#[test]
fn serves_ready_on_mongodb_and_a_restart_keeps_the_ledger() {
    let Some(url) = mongo_url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let database = fresh_database();
    // nx-27017 started on a single file shares collections between databases: no database is
    // fresh there, and this test cannot mean anything (docs/compatibility.md)
    let inherited = populated(&url, &database);
    assert!(
        inherited.is_empty(),
        "the fresh database {database} already holds {inherited:?}: this server shares collections between \
         databases (nx-27017 started with --db <file>); start it with --data-dir <dir> (docs/compatibility.md)"
    );

    let prod = ProdConfig::under(dir.path());
    let first = Capstan::start(with_test_admin(mongo_command(&prod, dir.path(), &url, &database)));
    let status = first.admin_status();
    assert_eq!(status["ready"], true, "/status should be ready: {status}");
    assert_eq!(status["store"]["ok"], true, "the store should answer: {status}");
    assert_eq!(status["store"]["backend"], described(&url, &database), "{status}");
    assert_eq!(status["migrations"]["done"], true, "migrations should be done: {status}");
    let exited = first.stop();
    assert!(exited.status.success(), "SIGTERM should stop capstan cleanly, got {:?}; stderr:\n{}", exited.status, exited.stderr);
    assert!(exited.stderr.contains(&described(&url, &database)), "the start logs where the store is; stderr:\n{}", exited.stderr);
    assert!(exited.stderr.contains("empty database stamped"), "the first start stamps the empty database; stderr:\n{}", exited.stderr);

    let ledger = read_ledger(&url, &database).expect("the first start should leave a ledger");
    assert_eq!(ledger.data["dataVersion"], capstan::migrate::host_chain().target().to_string(), "{ledger:?}");
    assert_eq!(ledger.data["lock"], serde_json::Value::Null, "no lock should be left behind: {ledger:?}");

    let second = Capstan::start(mongo_command(&prod, dir.path(), &url, &database));
    let status = second.ready_status();
    assert_eq!(status["ready"], true, "/status should be ready after a restart: {status}");
    assert_eq!(status["migrations"]["history"], serde_json::json!([]), "nothing was migrated: {status}");
    let exited = second.stop();
    assert!(exited.status.success(), "SIGTERM should stop capstan cleanly, got {:?}; stderr:\n{}", exited.status, exited.stderr);
    assert!(!exited.stderr.contains("stamped"), "the second start must not stamp again; stderr:\n{}", exited.stderr);
    assert_eq!(read_ledger(&url, &database).as_ref(), Some(&ledger), "the ledger (revision and data) should be unchanged by a restart");
}

#[test]
fn an_unreachable_deployment_is_refused_without_showing_the_password() {
    // Needs no server: nothing listens on the port.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("mongodb://capstan:{PASSWORD}@127.0.0.1:{port}/prod?serverSelectionTimeoutMS=1000&connectTimeoutMS=1000");
    let exited = run_to_exit(mongo_command(&ProdConfig::under(dir.path()), dir.path(), &url, "capstan"));
    let stderr = exited.assert_refused(1, "store-unavailable");
    assert!(!stderr.contains(PASSWORD) && !exited.stdout.contains(PASSWORD), "the password must never be printed:\n{stderr}");
    assert!(!stderr.contains("capstan:e2e"), "nor the user info of the URL:\n{stderr}");
}

#[test]
fn a_malformed_url_is_refused_as_configuration_without_showing_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("mongodb://capstan:{PASSWORD}@127.0.0.1:1/?authMechanism=NOT-A-MECHANISM");
    let exited = run_to_exit(mongo_command(&ProdConfig::under(dir.path()), dir.path(), &url, "capstan"));
    exited.assert_refused(1, "config-invalid");
    assert!(
        !exited.stderr.contains(PASSWORD) && !exited.stdout.contains(PASSWORD),
        "the password must never be printed:\n{}",
        exited.stderr
    );
}
