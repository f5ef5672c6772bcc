//! Backend benchmarks: single-document compare-and-swap updates with 1 and 8 concurrent
//! writers, and blob put/get throughput at 4 KiB and 16 MiB, on every backend reachable.
//!
//!   cargo bench -p capstan --bench backends
//!
//! SQLite and the local blob directory always run. MongoDB runs when CAPSTAN_TEST_MONGODB_URL
//! is set, S3 when CAPSTAN_TEST_S3_ENDPOINT is set (as `.ci/peers.sh` sets them). Figures go in
//! docs/benchmarks.md with the command that produced them.

use capstan_server::blobs::{Blobs, PutMode};
use capstan_server::config::{S3Settings, SecretString};
use capstan_server::store::{CollectionSpec, Store, StoreOptions};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime")
}

struct Backends {
    stores: Vec<(String, Store)>,
    blobs: Vec<(String, Blobs)>,
    _dir: tempfile::TempDir,
}

async fn backends() -> Backends {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = StoreOptions { database_name: None, budget: Duration::from_secs(30) };
    let mut stores = vec![(
        "sqlite".to_string(),
        Store::open(&format!("sqlite:{}", dir.path().join("bench.sqlite").display()), &options).await.expect("sqlite"),
    )];
    if let Ok(url) = std::env::var("CAPSTAN_TEST_MONGODB_URL") {
        let options = StoreOptions { database_name: Some(format!("bench_{:08x}", rand::random::<u32>())), ..options.clone() };
        stores.push(("mongodb".into(), Store::open(&url, &options).await.expect("mongodb")));
    } else {
        eprintln!("mongodb skipped: CAPSTAN_TEST_MONGODB_URL is not set");
    }
    let mut blobs = vec![(
        "local".to_string(),
        Blobs::open(&format!("file:{}", dir.path().join("blobs").display()), &S3Settings::default()).await.expect("local blobs"),
    )];
    if let Ok(endpoint) = std::env::var("CAPSTAN_TEST_S3_ENDPOINT") {
        let bucket = format!("capstan-bench-{:08x}", rand::random::<u32>());
        let settings = S3Settings {
            endpoint: Some(endpoint.clone()),
            region: "us-east-1".into(),
            access_key: Some("capstan-test".into()),
            secret_key: Some(SecretString::new("capstan-test-secret".into())),
            force_path_style: true,
        };
        create_bucket(&settings, &bucket).await;
        blobs.push(("s3".into(), Blobs::open(&format!("s3://{bucket}"), &settings).await.expect("s3 blobs")));
    } else {
        eprintln!("s3 skipped: CAPSTAN_TEST_S3_ENDPOINT is not set");
    }
    Backends { stores, blobs, _dir: dir }
}

async fn create_bucket(settings: &S3Settings, bucket: &str) {
    use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(settings.region.clone()))
        .endpoint_url(settings.endpoint.clone().expect("endpoint"))
        .force_path_style(true)
        .credentials_provider(Credentials::new("capstan-test", "capstan-test-secret", None, None, "bench"))
        .build();
    aws_sdk_s3::Client::from_conf(config).create_bucket().bucket(bucket).send().await.expect("create bucket");
}

/// One compare-and-swap increment, retried by the store on transient contention and by us on
/// a conflict (another writer got there first).
async fn increment(store: &Store, collection: &str) {
    loop {
        let result = store
            .transact(|tx| async move {
                let doc = tx.require(collection, "counter").await?;
                let n = doc.data["n"].as_u64().unwrap_or(0);
                tx.replace(collection, "counter", doc.revision, json!({ "n": n + 1 })).await
            })
            .await;
        match result {
            Ok(_) => return,
            Err(e) if e.is("conflict") || e.is("store-busy") => continue,
            Err(e) => panic!("increment failed: {e}"),
        }
    }
}

fn store_cas(c: &mut Criterion) {
    let rt = runtime();
    let backends = rt.block_on(backends());
    let mut group = c.benchmark_group("store_cas_update");
    group.sample_size(20).measurement_time(Duration::from_secs(10));
    for (name, store) in &backends.stores {
        let collection = format!("bench_{:08x}", rand::random::<u32>());
        rt.block_on(async {
            store.declare(CollectionSpec::new(&collection)).await.expect("declare");
            let c = collection.as_str();
            store.transact(|tx| async move { tx.insert(c, "counter", json!({ "n": 0 })).await }).await.expect("seed");
        });
        // The MongoDB wire server CI runs (nx-27017) does not isolate concurrent transactions
        // (docs/compatibility.md); concurrent writers are measured only on a real replica set.
        let concurrent = name != "mongodb" || std::env::var("CAPSTAN_BENCH_MONGODB_CONCURRENT").is_ok();
        if !concurrent {
            eprintln!("mongodb 8_writers skipped: set CAPSTAN_BENCH_MONGODB_CONCURRENT=1 against a real replica set");
        }
        let counts: &[usize] = if concurrent { &[1, 8] } else { &[1] };
        for &writers in counts {
            // one iteration = one committed update; with 8 writers, 8 run at once on one document
            group.throughput(Throughput::Elements(1));
            group.bench_with_input(BenchmarkId::new(name.as_str(), format!("{writers}_writers")), &writers, |b, &writers| {
                b.to_async(&rt).iter_custom(|iters| {
                    let store = store.clone();
                    let collection = collection.clone();
                    async move {
                        let per_writer = iters.div_ceil(writers as u64);
                        let started = Instant::now();
                        let tasks: Vec<_> = (0..writers)
                            .map(|_| {
                                let store = store.clone();
                                let collection = collection.clone();
                                tokio::spawn(async move {
                                    for _ in 0..per_writer {
                                        increment(&store, &collection).await;
                                    }
                                })
                            })
                            .collect();
                        for t in tasks {
                            t.await.expect("writer");
                        }
                        started.elapsed().mul_f64(iters as f64 / (per_writer * writers as u64) as f64)
                    }
                });
            });
        }
    }
    group.finish();
}

fn blob_throughput(c: &mut Criterion) {
    let rt = runtime();
    let backends = rt.block_on(backends());
    let mut group = c.benchmark_group("blob");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    for (name, blobs) in &backends.blobs {
        for (label, size) in [("4KiB", 4 * 1024usize), ("16MiB", 16 * 1024 * 1024)] {
            let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            let key = format!("bench/{label}");
            group.throughput(Throughput::Bytes(size as u64));
            group.bench_function(BenchmarkId::new(format!("{name}_put"), label), |b| {
                b.to_async(&rt).iter(|| {
                    let body = body.clone();
                    let key = key.clone();
                    async move { blobs.put_bytes(&key, body, PutMode::Overwrite).await.expect("put") }
                });
            });
            group.bench_function(BenchmarkId::new(format!("{name}_get"), label), |b| {
                b.to_async(&rt).iter(|| {
                    let key = key.clone();
                    async move {
                        let (_, bytes) = blobs.get_bytes(&key).await.expect("get").expect("present");
                        assert_eq!(bytes.len(), size);
                    }
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, store_cas, blob_throughput);
criterion_main!(benches);
