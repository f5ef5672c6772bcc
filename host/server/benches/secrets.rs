//! Sealing and opening one secret version: a fresh DEK, AES-256-GCM under it with the whole
//! context authenticated, the DEK wrapped by the KEK — and the reverse; plus opening a value
//! sealed to the ingress recipient (X25519 + HKDF-SHA256 + AES-256-GCM).
//!
//!   cargo bench -p capstan --bench secrets

use capstan_server::keyring::Keyring;
use capstan_server::secrets::envelope::{self, MaterialContext};
use capstan_server::secrets::ingress;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

fn context() -> MaterialContext {
    MaterialContext {
        purpose: "secret-material".into(),
        secret_id: "sec_bench".into(),
        version_id: "ver_bench".into(),
        owner: "service:svc_bench".into(),
        organization: "org_bench".into(),
        key: "DB_PASSWORD".into(),
        environment: "production".into(),
    }
}

fn versions(c: &mut Criterion) {
    let keyring = Keyring::generate(None, None).expect("a keyring");
    let ctx = context();
    let mut group = c.benchmark_group("secret-version");
    for size in [32usize, 4096, 65536] {
        let value = vec![b'x'; size];
        group.throughput(Throughput::Bytes(size as u64));
        group
            .bench_with_input(BenchmarkId::new("seal", size), &value, |b, value| b.iter(|| envelope::seal(&keyring, &ctx, value).unwrap()));
        let sealed = envelope::seal(&keyring, &ctx, &value).unwrap();
        group.bench_with_input(BenchmarkId::new("open", size), &sealed, |b, sealed| {
            b.iter(|| envelope::open(&keyring, &ctx, sealed).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("seal+open", size), &value, |b, value| {
            b.iter(|| {
                let sealed = envelope::seal(&keyring, &ctx, value).unwrap();
                envelope::open(&keyring, &ctx, &sealed).unwrap()
            })
        });
    }
    group.finish();

    let target = ingress::target("secrets.create", "service:svc_bench", "DB_PASSWORD");
    let sealed = ingress::seal_to(keyring.ingress_id(), keyring.ingress_public_key(), &target, &[b'x'; 32]);
    c.bench_function("sealed-input/open-32", |b| b.iter(|| ingress::open(&keyring, &target, &sealed).unwrap()));
    c.bench_function("sealed-input/seal-32", |b| {
        b.iter(|| ingress::seal_to(keyring.ingress_id(), keyring.ingress_public_key(), &target, &[b'x'; 32]))
    });
}

criterion_group!(benches, versions);
criterion_main!(benches);
