//! A plugin that misbehaves on purpose, so the host's adversarial tests can show each kind of
//! misbehavior refused by name while the host keeps serving:
//!
//! - `spin`: an infinite loop (the call's deadline must stop it);
//! - `bomb`: allocates without bound (the memory limit must stop it);
//! - `forbidden`: calls `http.fetch`, which it was not granted, and answers the refusal it got
//!   (`capability-denied`) as its own;
//! - `trap`: panics, which is a WebAssembly trap;
//! - `garbage`: answers a body that is not JSON, through the raw bindings;
//! - `echo`: behaves, to prove the plugin still works after all of the above;
//! - `sleepy`: busy-waits on the wall clock for `ms` milliseconds (concurrency and deadlines);
//! - `fetch`: GETs the URL given (with the headers given), for tests of what its grants and the
//!   address guard let through;
//! - `chatter`: calls the store `calls` times (the host-call budget must stop it);
//! - `hoard`: fills blob writers it never finishes (the host-bytes budget must stop it; needs
//!   the `blobs` grant);
//! - `bloat`: answers `bytes` bytes (the host passes at most 16 MiB on);
//! - `secret`: drives the `secrets` import (`op` ensure, put, rotate, revoke, list or reveal), for
//!   tests of what its grants reach (needs `secrets:<scope>` grants);
//! - `tally` (a read) and `tallyWrite`: count calls in the instance's memory and answer the count
//!   (`print`: also print it; `trap`: then panic), for tests of which calls share an instance;
//! - `squat`: a public method that tries to create a service (given the grant), which an
//!   anonymous caller must not be able to do with the plugin's own authority;
//! - `gateway` and `gatewayRead` (a read): make the gateway request given (`method`, `path`,
//!   `body`) and answer the gateway's `status` and `body`, for tests of what `gateway:<scope>`
//!   grants reach (and that the credential never reaches the plugin);
//! - `replicas` (a read): where the service sent runs (`runtime.service-replicas`), for tests of
//!   what `runtime:read` reaches.

use capstan_sdk::bindings::capstan::plugin::types;
use capstan_sdk::bindings::exports::capstan::plugin::guest::{self, Guest};
use capstan_sdk::{Adapter, Context, Descriptor, Empty, JsonSchema, Manager, Result, Role, Value, http, json};
use serde::{Deserialize, Serialize};
use std::hint::black_box;
use std::time::{Duration, Instant};

struct Adversary;

impl Manager for Adversary {
    fn describe() -> Descriptor {
        Descriptor::new()
            .setting::<Vec<String>>("sources", "URLs an http-setting grant may open", None)
            .method("spin", "Loop forever.", Role::Authenticated, spin)
            .method("bomb", "Allocate memory without bound.", Role::Authenticated, bomb)
            .method("forbidden", "Fetch a URL without the http capability.", Role::Authenticated, forbidden)
            .method("trap", "Panic.", Role::Authenticated, trap)
            .method::<Empty, Value>("garbage", "Answer a body that is not JSON.", Role::Authenticated, |_, _| {
                // Never reached: `Raw::handle` answers `garbage` itself, below the SDK.
                Ok(json!({}))
            })
            .method("echo", "Answer the value sent.", Role::Authenticated, echo)
            .method("sleepy", "Busy-wait for ms milliseconds.", Role::Authenticated, sleepy)
            .method("fetch", "GET a URL and answer its status.", Role::Authenticated, fetch)
            .method("chatter", "Call the store many times.", Role::Authenticated, chatter)
            .method("hoard", "Fill blob writers without finishing them.", Role::Authenticated, hoard)
            .method("bloat", "Answer a huge body.", Role::Authenticated, bloat)
            .method("secret", "Drive the secrets import.", Role::Authenticated, secret)
            .method("squat", "Create the service sent, for anyone.", Role::Public, squat)
            .method("sneak", "Create the service sent, though declared a read.", Role::Authenticated, squat)
            .read_only()
            .method("peek", "Answer the value sent: a read.", Role::Authenticated, echo)
            .read_only()
            .method("tally", "Count this call in the instance's memory: a read.", Role::Authenticated, tally)
            .read_only()
            .method("tallyWrite", "Count this call in the instance's memory: a write.", Role::Authenticated, tally)
            .method("gateway", "Make the gateway request sent.", Role::Authenticated, gateway_request)
            .method("gatewayRead", "Make the gateway request sent: a read.", Role::Authenticated, gateway_request)
            .read_only()
            .method("replicas", "Where the service sent runs: a read.", Role::Authenticated, replicas)
            .read_only()
    }
}

fn spin(_ctx: &Context, _: Empty) -> Result<Empty> {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

fn bomb(_ctx: &Context, _: Empty) -> Result<Empty> {
    const CHUNK: usize = 16 << 20;
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = vec![0u8; CHUNK];
        for i in (0..CHUNK).step_by(4096) {
            chunk[i] = 1;
        }
        hoard.push(black_box(chunk));
    }
}

#[derive(Serialize, JsonSchema)]
struct Fetched {
    status: u16,
}

fn forbidden(_ctx: &Context, _: Empty) -> Result<Fetched> {
    let response = http::Request::get("https://example.com/").send()?;
    Ok(Fetched { status: response.status })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Fetch {
    url: String,
    /// Headers to send, such as a `Host` that should never reach the server.
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
}

fn fetch(_ctx: &Context, input: Fetch) -> Result<Fetched> {
    let mut request = http::Request::get(&input.url);
    for (name, value) in &input.headers {
        request = request.header(name, value);
    }
    let response = request.send()?;
    Ok(Fetched { status: response.status })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Squat {
    service: Value,
}

fn squat(_ctx: &Context, input: Squat) -> Result<Value> {
    let created: capstan_sdk::inventory::Entity<Value> = capstan_sdk::inventory::create_service(&input.service)?;
    Ok(json!({ "id": created.id }))
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Count {
    calls: u32,
}

#[derive(Serialize, JsonSchema)]
struct Done {
    done: u32,
}

/// The store answers every call (a missing collection is a refusal too); the first refusal
/// that is not about the collection ends the loop and is answered as the adversary's own.
fn chatter(_ctx: &Context, input: Count) -> Result<Done> {
    for done in 0..input.calls {
        if let Err(refusal) = capstan_sdk::store::get::<Value>("nothing", "x")
            && refusal.code() == "resource-exhausted"
        {
            return Err(refusal);
        }
        black_box(done);
    }
    Ok(Done { done: input.calls })
}

fn hoard(_ctx: &Context, _: Empty) -> Result<Done> {
    use std::io::Write;
    let chunk = vec![7u8; 1 << 20];
    let mut writers = Vec::new();
    for n in 0..4096u32 {
        let mut writer = capstan_sdk::blobs::BlobWriter::new(&format!("hoard/{n}"), capstan_sdk::blobs::PutMode::Overwrite);
        // an io::Error carries the host's refusal back out
        writer.write_all(&chunk).and_then(|()| writer.flush()).map_err(capstan_sdk::Refusal::from)?;
        writers.push(writer);
    }
    Ok(Done { done: writers.len() as u32 })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Size {
    bytes: u32,
}

#[derive(Serialize, JsonSchema)]
struct Bloated {
    filler: String,
}

fn bloat(_ctx: &Context, input: Size) -> Result<Bloated> {
    // Reached only natively: `Raw::handle` answers `bloat` itself, with one allocation, so the
    // answer's size and not the plugin's memory is what the host meets.
    Ok(Bloated { filler: "x".repeat(input.bytes as usize) })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SecretOp {
    op: String,
    scope: String,
    #[serde(default)]
    service_id: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    id: Option<String>,
    /// The value `put` stores.
    #[serde(default)]
    value: Option<String>,
}

fn secret(_ctx: &Context, input: SecretOp) -> Result<Value> {
    use capstan_sdk::secrets::{self, Generate, Owner, SecretInfo};
    let shown = |info: SecretInfo| json!({ "id": info.id, "key": info.key, "scope": info.management_scope, "version": info.active_version, "state": info.state });
    let id = input.id.as_deref().unwrap_or_default();
    Ok(match input.op.as_str() {
        "ensure" => {
            let owner = Owner::Service(input.service_id.unwrap_or_default());
            shown(secrets::ensure(&input.scope, &owner, input.key.as_deref().unwrap_or("TOKEN"), &Generate::hex(32))?)
        }
        "put" => {
            let owner = Owner::Service(input.service_id.unwrap_or_default());
            let value = input.value.unwrap_or_default();
            shown(secrets::put(&input.scope, &owner, input.key.as_deref().unwrap_or("TOKEN"), value.as_bytes())?)
        }
        "rotate" => shown(secrets::rotate(&input.scope, id)?),
        "revoke" => shown(secrets::revoke(&input.scope, id)?),
        "list" => Value::Array(secrets::list(&input.scope)?.into_iter().map(shown).collect()),
        "reveal" => json!({ "value": String::from_utf8_lossy(&secrets::reveal(&input.scope, id)?) }),
        other => return Err(capstan_sdk::Refusal::new("invalid-request", format!("no op {other}"))),
    })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GatewayAsk {
    method: String,
    path: String,
    #[serde(default)]
    body: Option<Value>,
}

fn gateway_request(_ctx: &Context, input: GatewayAsk) -> Result<Value> {
    let response = capstan_sdk::gateway::request(&input.method, &input.path, input.body.as_ref())?;
    Ok(json!({ "status": response.status, "body": response.body, "ok": response.ok(), "code": response.code() }))
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceAsk {
    service_id: String,
}

fn replicas(_ctx: &Context, input: ServiceAsk) -> Result<Value> {
    Ok(json!({ "replicas": capstan_sdk::runtime::service_replicas(&input.service_id)? }))
}

fn trap(_ctx: &Context, _: Empty) -> Result<Empty> {
    panic!("the adversary traps on purpose");
}

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Echo {
    value: Value,
}

fn echo(_ctx: &Context, input: Echo) -> Result<Echo> {
    Ok(input)
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Tally {
    #[serde(default)]
    print: bool,
    #[serde(default)]
    trap: bool,
}

#[derive(Serialize, JsonSchema)]
struct Tallied {
    count: u64,
}

thread_local! {
    /// Calls this instance has served: what survives a call when the host keeps the instance.
    static CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn tally(_ctx: &Context, input: Tally) -> Result<Tallied> {
    let count = CALLS.with(|c| {
        c.set(c.get() + 1);
        c.get()
    });
    if input.print {
        println!("tally {count}");
    }
    if input.trap {
        panic!("the adversary traps on purpose after counting {count}");
    }
    Ok(Tallied { count })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Sleepy {
    ms: u64,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Slept {
    slept_ms: u64,
}

fn sleepy(_ctx: &Context, input: Sleepy) -> Result<Slept> {
    let start = Instant::now();
    let budget = Duration::from_millis(input.ms);
    while start.elapsed() < budget {
        black_box(());
    }
    Ok(Slept { slept_ms: start.elapsed().as_millis() as u64 })
}

/// The raw export: everything goes to the SDK's adapter except `garbage`, which answers bytes
/// the SDK would never produce.
struct Raw;

impl Guest for Raw {
    fn describe() -> guest::Descriptor {
        Adapter::<Adversary>::describe()
    }

    fn handle(ctx: types::CallContext, method: String, body: String) -> std::result::Result<String, types::Refusal> {
        if method == "garbage" {
            return Ok("this is {not json".to_string());
        }
        if method == "bloat" {
            let size: Size = serde_json::from_str(&body).map_err(|e| types::Refusal {
                code: "invalid-request".into(),
                message: e.to_string(),
                retryable: false,
                data: None,
            })?;
            let mut answer = String::with_capacity(size.bytes as usize + 16);
            answer.push_str("{\"filler\":\"");
            answer.extend(std::iter::repeat_n('x', size.bytes as usize));
            answer.push_str("\"}");
            return Ok(answer);
        }
        Adapter::<Adversary>::handle(ctx, method, body)
    }

    fn on_event(ctx: types::CallContext, event: guest::Event) -> std::result::Result<(), types::Refusal> {
        Adapter::<Adversary>::on_event(ctx, event)
    }

    fn reconcile(
        ctx: types::CallContext,
        trigger: guest::ReconcileTrigger,
    ) -> std::result::Result<guest::ReconcileOutcome, types::Refusal> {
        Adapter::<Adversary>::reconcile(ctx, trigger)
    }

    fn run_task(ctx: types::CallContext, name: String) -> std::result::Result<String, types::Refusal> {
        Adapter::<Adversary>::run_task(ctx, name)
    }

    fn migrate(ctx: types::CallContext, from: Option<String>, to: String) -> std::result::Result<(), types::Refusal> {
        Adapter::<Adversary>::migrate(ctx, from, to)
    }
}

// Only a component can carry these exports (a native cdylib cannot link their names); the
// alias keeps native builds from calling everything dead.
#[allow(dead_code)]
type Exported = Raw;
#[cfg(target_arch = "wasm32")]
capstan_sdk::bindings::export!(Exported with_types_in capstan_sdk::bindings);
