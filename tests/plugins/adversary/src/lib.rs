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
//! - `fetch`: GETs the URL given, for tests of what its grants let through;
//! - `squat`: a public method that tries to create a service (given the grant), which an
//!   anonymous caller must not be able to do with the plugin's own authority.

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
            .method("squat", "Create the service sent, for anyone.", Role::Public, squat)
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
}

fn fetch(_ctx: &Context, input: Fetch) -> Result<Fetched> {
    let response = http::Request::get(&input.url).send()?;
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
