//! List latency with 10,000 and 100,000 services: what `services.list` runs for one page of 100
//! (the organization's index `by_organization` from a cursor, each document decoded as a
//! service), at the first page, the middle and the last, and an administrator's scan of all
//! services. Pagination and indexes hold when a page deep in the listing costs about what the
//! first does, and a listing ten times longer costs at most a little more per page.
//!
//!   cargo bench -p capstan-server --bench lists
//!
//! SQLite always runs; MongoDB (10,000 only: the wire server here is a SQLite-backed stand-in
//! whose inserts are slow) when CAPSTAN_TEST_MONGODB_URL is set. Figures go in
//! docs/benchmarks.md with the command that produced them.

use capstan_inventory::services::Service;
use capstan_server::store::{Store, StoreOptions};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::runtime::Runtime;

const ORG: &str = "org_bench";
const PAGE: usize = 100;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime")
}

/// A service as `services.create` stores one: a port, a domain, a few variables.
fn service(i: usize) -> Value {
    json!({
        "name": format!("svc-{i:06}"), "organizationId": ORG, "image": format!("registry.example.com/team/app:{i}"),
        "ports": [{ "port": 8080, "protocol": "http", "publicPort": null }],
        "domains": [format!("app-{i}.example.com")],
        "environment": { "LOG_LEVEL": "info", "REGION": "eu-central" },
        "scale": 1, "volumes": [], "mailAddresses": [], "state": "active", "createdAt": 1_796_000_000u64, "updatedAt": 1_796_000_000u64,
    })
}

/// `count` services in one organization, inserted 500 to a transaction.
async fn fill(store: &Store, count: usize) {
    capstan_inventory::declare(store).await.expect("declare");
    for start in (0..count).step_by(500) {
        store
            .transact(|tx| async move {
                for i in start..(start + 500).min(count) {
                    tx.insert(capstan_inventory::SERVICES, &format!("svc_{i:08}"), service(i)).await?;
                }
                Ok(())
            })
            .await
            .expect("insert");
    }
}

/// The cursors of the first page, the middle page and the last page of the organization's listing.
async fn cursors(store: &Store) -> Vec<(&'static str, Option<String>)> {
    let mut all: Vec<Option<String>> = vec![None];
    loop {
        let cursor = all.last().cloned().flatten();
        let page = store
            .transact(|tx| {
                let cursor = cursor.clone();
                async move { tx.find(capstan_inventory::SERVICES, "by_organization", &[json!(ORG)], cursor.as_deref(), PAGE).await }
            })
            .await
            .expect("page");
        match page.next_cursor {
            Some(next) => all.push(Some(next)),
            None => break,
        }
    }
    let last = all.len() - 1;
    vec![("first", all[0].clone()), ("middle", all[last / 2].clone()), ("last", all[last].clone())]
}

/// One page as `services.list` reads it: the index from the cursor, each document decoded.
async fn page(store: &Store, cursor: Option<&str>) -> usize {
    store
        .transact(|tx| async move {
            let page = tx.find(capstan_inventory::SERVICES, "by_organization", &[json!(ORG)], cursor, PAGE).await?;
            let decoded: Vec<Service> = page.documents.into_iter().map(|d| serde_json::from_value(d.data).expect("a service")).collect();
            Ok(decoded.len())
        })
        .await
        .expect("page")
}

fn lists(c: &mut Criterion) {
    let rt = runtime();
    let options = StoreOptions { database_name: None, budget: Duration::from_secs(60) };
    let mut backends: Vec<(&str, usize)> = vec![("sqlite", 10_000), ("sqlite", 100_000)];
    let mongo = std::env::var("CAPSTAN_TEST_MONGODB_URL").ok();
    match &mongo {
        Some(_) => backends.push(("mongodb", 10_000)),
        None => eprintln!("mongodb skipped: CAPSTAN_TEST_MONGODB_URL is not set"),
    }
    let mut group = c.benchmark_group("services.list page of 100");
    group.sample_size(50).measurement_time(Duration::from_secs(5));
    for (backend, count) in backends {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = rt.block_on(async {
            let store = match backend {
                "sqlite" => Store::open(&format!("sqlite:{}", dir.path().join("lists.sqlite").display()), &options).await,
                _ => {
                    let options =
                        StoreOptions { database_name: Some(format!("bench_lists_{:08x}", rand::random::<u32>())), ..options.clone() };
                    Store::open(mongo.as_deref().unwrap_or_default(), &options).await
                }
            }
            .expect("store");
            let started = std::time::Instant::now();
            fill(&store, count).await;
            eprintln!("{backend}: {count} services inserted in {:.1} s", started.elapsed().as_secs_f64());
            store
        });
        for (at, cursor) in rt.block_on(cursors(&store)) {
            group.bench_with_input(BenchmarkId::new(format!("{backend}/{count}"), at), &cursor, |b, cursor| {
                b.to_async(&rt).iter(|| page(&store, cursor.as_deref()));
            });
        }
        group.bench_with_input(BenchmarkId::new(format!("{backend}/{count}"), "admin-scan-first"), &(), |b, _| {
            b.to_async(&rt).iter(|| async {
                store
                    .transact(|tx| async move { tx.scan(capstan_inventory::SERVICES, None, PAGE).await })
                    .await
                    .expect("scan")
                    .documents
                    .len()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, lists);
criterion_main!(benches);
