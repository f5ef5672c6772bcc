//! The assignment producer at scale: one pass over 10,000 services on a cluster of 1,000
//! simulated nodes (each service pinned to one node, one replica), on SQLite. The first pass
//! admits every slot; the slots are then observed running and ready (as the nodes' reports
//! would write them); the next pass converges every verdict; and from then on a pass decides
//! nothing and writes nothing — the figure measured here, with the documents it wrote.
//!
//!   cargo bench -p capstan-runtime --features testing --bench producer
//!
//! Figures go in docs/benchmarks.md with this command.

use capstan_runtime::{RUNTIME_SLOTS, producer};
use capstan_store::Store;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use std::time::{Duration, Instant};

const SERVICES: usize = 10_000;
const NODES: usize = 1_000;
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

async fn fill(store: &Store) {
    capstan_nodes::declare(store).await.unwrap();
    capstan_secrets::methods::declare(store).await.unwrap();
    capstan_registry::declare(store).await.unwrap();
    capstan_runtime::declare(store).await.unwrap();
    let now = capstan_core::clock::now_ms();
    store
        .transact(|tx| async move {
            tx.insert(
                capstan_inventory::CLUSTER_RUNTIMES,
                "cluster_1",
                json!({ "phase": "pallet", "generation": 1, "updatedAt": 0, "updatedBy": "bench" }),
            )
            .await?;
            for n in 0..NODES {
                let node = json!({ "clusterId": "cluster_1", "name": format!("n{n}"), "hostname": format!("n{n}"), "hostnameIntent": null,
                                   "state": "active", "enrolledAt": 0, "lastReportAt": now + 3_600_000, "credentialGeneration": 1 });
                tx.insert(capstan_inventory::CLUSTER_NODES, &format!("node_{n:04}"), node).await?;
            }
            Ok(())
        })
        .await
        .unwrap();
    for start in (0..SERVICES).step_by(500) {
        store
            .transact(|tx| async move {
                for i in start..(start + 500).min(SERVICES) {
                    let service = json!({ "name": format!("svc-{i:05}"), "organizationId": "org_1", "image": format!("capstan.test/workloads/svc-{i:05}-0123456789ab@{DIGEST}"),
                        "ports": [{ "port": 8080, "protocol": "http", "publicPort": null }], "environment": { "LOG_LEVEL": "info" },
                        "scale": 1, "state": "active", "createdAt": 0, "updatedAt": 0 });
                    let id = format!("svc_{i:05}");
                    tx.insert(capstan_inventory::SERVICES, &id, service).await?;
                    let spec = json!({ "serviceId": id, "clusterId": "cluster_1", "organizationId": "org_1",
                        "placement": { "nodes": [format!("node_{:04}", i % NODES)] }, "replicasPerNode": 1, "hold": false,
                        "restart": "on-failure", "health": { "kind": "none" }, "updatedAt": 0, "updatedBy": "bench" });
                    tx.insert(capstan_runtime::RUNTIME_SPECS, &format!("{id}@cluster_1"), spec).await?;
                }
                Ok(())
            })
            .await
            .unwrap();
    }
}

/// Every slot observed running and ready, as its node's report writes it.
async fn observe_all(store: &Store) {
    let mut cursor: Option<String> = None;
    loop {
        let next = store
            .transact(|tx| {
                let cursor = cursor.clone();
                async move {
                    let page = tx.scan(RUNTIME_SLOTS, cursor.as_deref(), 500).await?;
                    for doc in &page.documents {
                        let mut data = doc.data.clone();
                        data["assignment"]["observation"] = json!({ "phase": "running", "ready": true, "imageDigest": DIGEST,
                                                                   "restartCount": 0, "observedAt": 1, "acceptedAt": 1 });
                        tx.replace(RUNTIME_SLOTS, &doc.id, doc.revision, data).await?;
                    }
                    Ok(page.next_cursor)
                }
            })
            .await
            .unwrap();
        match next {
            Some(next) => cursor = Some(next),
            None => return,
        }
    }
}

fn producer_pass(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
    let cx = rt.block_on(async {
        fill(&store).await;
        capstan_runtime::testing::context(store.clone(), dir.path()).await
    });
    let timed = |what: &str| {
        let started = Instant::now();
        let report = rt.block_on(producer::pass(&cx)).unwrap();
        eprintln!("{what}: {:.2} s, {} targets, {} documents written", started.elapsed().as_secs_f64(), report.targets, report.writes);
        report
    };
    timed("first pass (admits every slot)");
    rt.block_on(observe_all(&store));
    timed("second pass (every verdict converges)");
    let steady = timed("steady pass");
    assert_eq!(steady.writes, 0, "a steady pass writes nothing");
    let mut group = c.benchmark_group("producer");
    group.sample_size(10).measurement_time(Duration::from_secs(60));
    group.bench_function("steady pass, 10,000 services x 1,000 nodes", |b| {
        b.iter(|| {
            let report = rt.block_on(producer::pass(&cx)).unwrap();
            assert_eq!(report.writes, 0);
        })
    });
    group.finish();
}

criterion_group!(benches, producer_pass);
criterion_main!(benches);
