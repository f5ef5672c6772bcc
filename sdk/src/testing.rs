//! Run a built plugin against an in-process Capstan host, from a plain `#[test]`.
//!
//! ```ignore
//! use capstan_sdk::testing::TestHost;
//! use serde_json::json;
//!
//! #[test]
//! fn greets() {
//!     let host = TestHost::build(env!("CARGO_MANIFEST_DIR"));
//!     let out = host.call("greet", json!({ "name": "Ada" })).unwrap();
//!     assert_eq!(out["greeting"], "Hello, Ada!");
//! }
//! ```
//!
//! `build` compiles the crate for `wasm32-wasip2` (into `$CARGO_TARGET_DIR/wasm-plugins`, or
//! `target/wasm-plugins` beside it) and installs it on a fresh host with an embedded store and
//! blob directory, every capability its manifest requests approved. Calls go through the
//! same role check and schema validation as the API; refusals come back as [`Refusal`]s.

use crate::Refusal;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a test implements to stand in for a cluster's relay ([`TestHost::set_agent_dispatch`]).
pub use capstan_plugin_host::{AgentDispatch, AgentReply, AgentRequest};

/// What a storage stand-in implements its trait with, and whom a call acts as.
pub use capstan_plugin_host::platform::async_trait;
/// What a test installs in place of the storage providers ([`TestHost::set_storage_dispatch`]).
pub use capstan_plugin_host::{BindingKind, Provisioned, StorageBinding, StorageDispatch};
/// What a test implements to stand in for the external gateway ([`TestHost::set_gateway_dispatch`]).
pub use capstan_plugin_host::{GatewayDispatch, GatewayReply, GatewayRequest, GatewayResponse};
pub use capstan_rpc::Identity;

/// A refusal as the host passes it (what an [`AgentDispatch`] or a [`GatewayDispatch`] refuses
/// with).
pub use capstan_core::refusal::Refusal as HostRefusal;

/// A built plugin installed on an in-process host, with the runtime that drives it.
pub struct TestHost {
    runtime: tokio::runtime::Runtime,
    inner: crate::test_host::TestHost,
}

fn to_sdk(r: capstan_core::refusal::Refusal) -> Refusal {
    let mut out = Refusal::new(r.code.to_string(), r.message.clone());
    if r.retryable {
        out = out.retryable();
    }
    if let Some(data) = r.data {
        out = out.with_data(*data);
    }
    out
}

/// Whether a test cannot build its plugin here because the `wasm32-wasip2` target is missing;
/// it says so on standard error. `CAPSTAN_TEST_REQUIRE_PLUGINS=1` (set by CI) makes a missing
/// target no reason to skip: the build then fails and says why.
pub fn wasm_target_missing() -> bool {
    let missing = std::process::Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).contains("wasm32-wasip2"))
        && std::env::var("CAPSTAN_TEST_REQUIRE_PLUGINS").as_deref() != Ok("1");
    if missing {
        eprintln!("skipped: the wasm32-wasip2 target is not installed");
    }
    missing
}

/// Build the plugin crate in `crate_dir` for wasm32-wasip2; the component's path.
pub fn build_component(crate_dir: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| crate_dir.join("target")).join("wasm-plugins");
    let output = std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(crate_dir)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--message-format=json-render-diagnostics", "--target-dir"])
        .arg(&target)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "building {} for wasm32-wasip2 failed", crate_dir.display());
    let manifest = crate_dir.join("Cargo.toml").canonicalize().expect("the crate has a Cargo.toml");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && Path::new(m["manifest_path"].as_str().unwrap_or("")) == manifest)
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| f.extension().is_some_and(|e| e == "wasm"))
        .expect("the crate builds a cdylib .wasm (crate-type = [\"cdylib\"])")
}

impl TestHost {
    /// Build the plugin crate in `crate_dir` and load it on a fresh in-process host.
    pub fn build(crate_dir: impl AsRef<Path>) -> TestHost {
        let dir = crate_dir.as_ref();
        let manifest = std::fs::read_to_string(dir.join("capstan-plugin.toml")).expect("capstan-plugin.toml beside Cargo.toml");
        Self::build_with_manifest(dir, &manifest)
    }

    /// Build the plugin crate in `crate_dir` and load it with `manifest` in place of its
    /// `capstan-plugin.toml` (say, one requesting another capability), with its page templates.
    pub fn build_with_manifest(crate_dir: impl AsRef<Path>, manifest: &str) -> TestHost {
        let dir = crate_dir.as_ref();
        let component = std::fs::read(build_component(dir)).expect("the built component");
        let pages = capstan_plugin_host::bundle::read_page_templates(dir).unwrap_or_else(|r| panic!("the page templates: {r}"));
        Self::load_with_pages(manifest, component, pages)
    }

    /// Load an already built component with its manifest text.
    pub fn load(manifest: &str, component: Vec<u8>) -> TestHost {
        Self::load_with_pages(manifest, component, Default::default())
    }

    /// Load an already built component with its manifest text and page templates
    /// (`pages/<name>.html` → text).
    pub fn load_with_pages(manifest: &str, component: Vec<u8>, pages: std::collections::BTreeMap<String, String>) -> TestHost {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
        let inner = runtime
            .block_on(crate::test_host::TestHost::load(manifest, component, pages))
            .unwrap_or_else(|r| panic!("the plugin did not install: {r}"));
        TestHost { runtime, inner }
    }

    /// Call a method (as an administrator).
    pub fn call(&self, method: &str, body: Value) -> Result<Value, Refusal> {
        self.runtime.block_on(self.inner.call(method, body)).map_err(to_sdk)
    }

    /// Publish an event as the host would, e.g. `service.deleting`.
    pub fn publish(&self, kind: &str, subject: &str, data: Value) -> u64 {
        self.runtime.block_on(self.inner.publish(kind, subject, data)).expect("the outbox takes the event")
    }

    /// Deliver every pending event the plugin subscribes to; how many it took.
    pub fn deliver_events(&self) -> Result<usize, Refusal> {
        self.runtime.block_on(self.inner.deliver_events()).map_err(to_sdk)
    }

    /// One reconcile pass now (hints as subjects; none: a periodic pass). Its summary.
    pub fn reconcile(&self, hints: &[&str]) -> Result<String, Refusal> {
        self.runtime.block_on(self.inner.reconcile(hints.iter().map(|h| h.to_string()).collect())).map_err(to_sdk)
    }

    /// Replace the host's public settings document (e.g. sources or keys the plugin reads).
    pub fn set_settings(&self, settings: Value) {
        self.runtime.block_on(self.inner.set_settings(settings)).expect("the settings are written")
    }

    /// Create an organization on the host; its id.
    pub fn create_organization(&self, name: &str) -> String {
        self.runtime.block_on(self.inner.create_organization(name)).expect("the organization is created")
    }

    /// A service as the host's inventory holds it (with `id` and `revision`), if it exists.
    pub fn service(&self, id: &str) -> Option<Value> {
        self.runtime.block_on(self.inner.service(id)).expect("the store answers")
    }

    /// Move the wall clock the plugin sees `by` ahead (the host's own clock is untouched):
    /// what a plugin does once time has passed, without waiting.
    pub fn advance_clock(&self, by: std::time::Duration) {
        self.inner.advance_clock(by)
    }

    /// The wall clock the plugin sees now, in milliseconds since the epoch.
    pub fn clock_ms(&self) -> u64 {
        self.inner.clock_ms()
    }

    /// Every document of one of the plugin's collections (with `id` and `revision`), in id order.
    pub fn documents(&self, collection: &str) -> Vec<Value> {
        self.runtime.block_on(self.inner.documents(collection)).expect("the store answers")
    }

    /// Create a cluster (no nodes, no relay) for the plugin's services to run on; its id.
    pub fn create_cluster(&self, name: &str) -> String {
        self.runtime.block_on(self.inner.create_cluster(name)).expect("the cluster is created")
    }

    /// The runtime specs the plugin set (`runtime::set_service_spec`), by
    /// `<serviceId>@<clusterId>`: this host runs no services, so it keeps what it was asked
    /// (fenced by `expectedRevision` as the host fences it).
    pub fn service_specs(&self) -> std::collections::HashMap<String, Value> {
        self.inner.service_specs()
    }

    /// Seed a runtime spec as an operator would set it (`body` is `runtime.setServiceSpec`'s
    /// input: `serviceId`, `clusterId`, `placement`, …): `runtime::service_specs` answers it.
    pub fn put_service_spec(&self, body: Value) {
        self.inner.put_service_spec(body)
    }

    /// Write a document of one of the plugin's collections, as another node sharing the store
    /// would (over whatever is there).
    pub fn put_document(&self, collection: &str, id: &str, data: Value) {
        self.runtime.block_on(self.inner.put_document(collection, id, data)).expect("the document is written")
    }

    /// Stand in for the clusters' relays: the plugin's `agents.call` reaches `dispatch` (after
    /// the host's checks). Without one every call is refused `agent-not-connected`.
    pub fn set_agent_dispatch(&self, dispatch: Arc<dyn AgentDispatch>) {
        self.inner.host.set_agent_dispatch(dispatch)
    }

    /// Create a service of `organization` in the host's inventory from `fields` (`name`,
    /// `image`, `volumes`, …, as `services.create` writes them); its id.
    pub fn create_service(&self, organization: &str, fields: Value) -> String {
        self.runtime.block_on(self.inner.create_service(organization, fields)).expect("the service is created")
    }

    /// The public origin transfer tickets name (`transfers.upload`/`download`): without one they
    /// are refused `transfers-unavailable`, as on a host with no public origin.
    pub fn set_public_origin(&self, origin: &str) {
        self.inner.host.set_public_origin(origin)
    }

    /// Stand in for the external gateway: the plugin's `gateway.request` reaches `dispatch`
    /// (after the host's checks: the scope granted, the path, the body), which answers in place
    /// of the gateway and Capstan's credential. Without one every request is refused
    /// `gateway-not-enrolled`.
    pub fn set_gateway_dispatch(&self, dispatch: Arc<dyn GatewayDispatch>) {
        self.inner.host.set_gateway_dispatch(dispatch)
    }

    /// Stand in for the storage providers: the plugin's `storage` calls reach `dispatch` (after
    /// the host's checks: the grant, a read-only method), which answers in place of the nodes'
    /// providers. Without one every call is refused `storage-unavailable`.
    pub fn set_storage_dispatch(&self, dispatch: Arc<dyn StorageDispatch>) {
        self.inner.host.set_storage_dispatch(dispatch)
    }

    /// Stand in for the runtime, which this host does not run: the plugin's
    /// `runtime::service_replicas(service_id)` answers `replicas` from now on (sorted by cluster
    /// then slot, as the host answers), whether or not the service exists here. Without it every
    /// service runs nowhere (an empty list) and an unknown one is `service-not-found`.
    pub fn set_service_replicas(&self, service_id: &str, replicas: Vec<crate::runtime::Replica>) {
        use capstan_plugin_host::platform::{Replica, ReplicaIntent};
        let replicas = replicas
            .into_iter()
            .map(|r| Replica {
                cluster_id: r.cluster_id,
                node_id: r.node_id,
                slot: r.slot,
                assignment_id: r.assignment_id,
                intent: match r.intent {
                    crate::runtime::Intent::Run => ReplicaIntent::Run,
                    crate::runtime::Intent::Stop => ReplicaIntent::Stop,
                    crate::runtime::Intent::Remove => ReplicaIntent::Remove,
                },
                phase: r.phase,
                ready: r.ready,
                image_digest: r.image_digest,
            })
            .collect();
        self.inner.set_service_replicas(service_id, replicas)
    }

    /// The reason the plugin's gate (`runtime::set_service_gate`) holds the service's replicas
    /// for, if it does.
    pub fn service_gate(&self, service_id: &str) -> Option<String> {
        self.inner.service_gate(service_id)
    }

    /// `runtime::service_image_digest(service_id)` answers `digest` from now on (as if the
    /// runtime had resolved the service's image tag to it).
    pub fn set_service_image_digest(&self, service_id: &str, digest: &str) {
        self.inner.set_service_image_digest(service_id, digest)
    }

    /// `runtime::service_rollout(service_id, digest)` answers `rollout` (`{state, clusters}`, as the
    /// host answers) from now on. Without it every release is `unplaced`: the test host runs no
    /// services.
    pub fn set_service_rollout(&self, service_id: &str, digest: &str, rollout: serde_json::Value) {
        self.inner.set_service_rollout(service_id, digest, rollout)
    }

    /// Run a scheduled task now; its summary.
    pub fn run_task(&self, name: &str) -> Result<String, Refusal> {
        self.runtime.block_on(self.inner.run_task(name)).map_err(to_sdk)
    }
}

#[cfg(test)]
mod tests {
    use crate::Role;
    use capstan_rpc::Access;

    /// A role is a string on the WIT contract: the guest's `Role` and the host's one `Access`
    /// type must spell the same five, in both directions.
    #[test]
    fn the_sdk_roles_are_the_hosts_access_names() {
        let roles = [Role::Public, Role::Authenticated, Role::Member, Role::Owner, Role::Admin];
        let accesses = [Access::Public, Access::Authenticated, Access::Member, Access::Owner, Access::Admin];
        for (role, access) in roles.into_iter().zip(accesses) {
            assert_eq!(role.as_str().parse::<Access>().unwrap(), access);
            assert_eq!(access.as_str(), role.as_str());
        }
    }
}
