//! Plugin call overhead: the example plugin's `greet` through the host (schema check, a fresh
//! instance, the call, JSON both ways) against the same handler written natively, as p50 and
//! p99 over many calls; instantiation alone; and loading a component cold, with and without
//! the compiled-artifact cache.
//!
//!   cargo bench -p capstan --bench plugins
//!
//! Builds the example plugin for wasm32-wasip2 first (into $CARGO_TARGET_DIR/wasm-plugins).

use capstan_server::auth::Identity;
use capstan_server::plugins::bundle::{Bundle, PublisherKey, generate_key};
use capstan_server::plugins::host::PluginHost;
use capstan_server::plugins::imports::Services;
use capstan_server::plugins::runtime::Runtime;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Calls timed per measurement; `CAPSTAN_BENCH_CALLS` sets another count (more, to profile).
fn calls() -> usize {
    std::env::var("CAPSTAN_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

fn build_example() -> Vec<u8> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace.join("target")).join("wasm-plugins");
    let status = std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(&workspace)
        .args(["build", "--release", "--target", "wasm32-wasip2", "-p", "capstan-plugin-example", "--target-dir"])
        .arg(&target)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the example plugin failed");
    std::fs::read(target.join("wasm32-wasip2/release/capstan_plugin_example.wasm")).expect("the example component")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Greet {
    name: String,
}

#[derive(Serialize)]
struct Greeting {
    greeting: String,
    version: String,
    caller: String,
}

/// The example's `greet`, written natively: decode, answer, encode.
async fn native_greet(identity: &Identity, body: Value) -> capstan_server::refusal::Result<Value> {
    let input: Greet = capstan_server::api::methods::decode(body)?;
    let out = Greeting { greeting: format!("Hello, {}!", input.name), version: "0.1.0".into(), caller: identity.user_id.clone() };
    serde_json::to_value(out).map_err(capstan_server::refusal::Refusal::internal)
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99))
}

async fn measure<F, Fut>(mut call: F) -> (Duration, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..100 {
        call().await; // warm up
    }
    let mut samples = Vec::with_capacity(calls());
    for _ in 0..calls() {
        let started = Instant::now();
        call().await;
        samples.push(started.elapsed());
    }
    percentiles(samples)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this quickly with no argument.
    if !std::env::args().any(|a| a == "--bench") {
        println!("plugins bench: run with `cargo bench -p capstan --bench plugins`");
        return;
    }
    let component = build_example();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let dir = tempfile::tempdir().expect("temp dir");
        let store =
            capstan_server::store::Store::open(&format!("sqlite:{}", dir.path().join("bench.sqlite").display()), &Default::default())
                .await
                .expect("store");
        let blobs = capstan_server::blobs::Blobs::open(&format!("file:{}", dir.path().join("blobs").display()), &Default::default())
            .await
            .expect("blobs");
        let keyring = std::sync::Arc::new(capstan_server::keyring::Keyring::generate(None, None).expect("keyring"));
        let platform =
            capstan_links::InventoryPlatform::new(store.clone(), keyring.clone(), std::sync::Arc::new(capstan_links::HostDependents));
        let services = Services::new(store, blobs, keyring, "bench".into(), platform);

        // cold load: compile without a cache, then load from the cache
        let cold_dir = tempfile::tempdir().expect("temp dir");
        let runtime = Runtime::new(Some(cold_dir.path().to_path_buf())).expect("runtime");
        let started = Instant::now();
        let first = runtime.prepare(&component, capstan_server::plugins::manifest::CURRENT_WIT).expect("compiles");
        let compile = started.elapsed();
        assert!(!first.cached);
        let fresh = Runtime::new(Some(cold_dir.path().to_path_buf())).expect("runtime");
        let started = Instant::now();
        assert!(fresh.prepare(&component, capstan_server::plugins::manifest::CURRENT_WIT).expect("loads").cached);
        let cached = started.elapsed();

        let host = PluginHost::new(runtime, services, vec![], vec![]).await.expect("plugin host");
        let key = generate_key();
        host.add_trusted_publisher(&PublisherKey::from_verifying_key(key.verifying_key()).to_string(), "bench", "bench")
            .await
            .expect("trust");
        let manifest = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plugins/example/capstan-plugin.toml"))
            .expect("manifest");
        let pages =
            capstan_server::plugins::bundle::read_page_templates(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plugins/example"))
                .expect("the example's pages");
        let mut bundle = Bundle::new(manifest, component).expect("bundle").with_pages(pages).expect("pages");
        bundle.sign(&key);
        host.install(&bundle.to_bytes(), &["all-requested".into()], "bench").await.expect("install");
        let now = capstan_core::clock::now_ms();
        let identity = Identity {
            user_id: "u-bench".into(),
            username: "bench".into(),
            kind: "human".into(),
            admin: true,
            session_id: "s".into(),
            authenticated_at: now,
            expires_at: now + 3_600_000,
        };
        let body = json!({ "name": "Ada" });
        let (native_p50, native_p99) = measure(|| async {
            native_greet(&identity, body.clone()).await.expect("native");
        })
        .await;
        let (plugin_p50, plugin_p99) = measure(|| async {
            host.dispatch("example", "greet", Some(&identity), "bench", body.clone()).await.expect("plugin");
        })
        .await;
        let active = host.get("example").expect("loaded");
        let (describe_p50, describe_p99) = measure(|| async {
            active.sandbox.describe().await.expect("describe");
        })
        .await;

        let calls = calls();
        println!("plugin greet ({calls} calls): p50 {plugin_p50:?}  p99 {plugin_p99:?}");
        println!("native greet ({calls} calls): p50 {native_p50:?}  p99 {native_p99:?}");
        println!("instantiate + describe (no imports): p50 {describe_p50:?}  p99 {describe_p99:?}");
        println!("cold load, compile (no cache): {compile:?}");
        println!("cold load, from the artifact cache: {cached:?}");
    });
}
