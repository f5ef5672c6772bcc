//! The runtime against real components: the example plugin and the adversary, built for
//! wasm32-wasip2 from the workspace, signed, installed, called, upgraded, rolled back.

use crate::auth::Identity;
use crate::plugins::bundle::{Bundle, PublisherKey, generate_key};
use crate::plugins::host::PluginHost;
use crate::state::AppState;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// Build the test plugins once per test process; the artifacts' directory, or `None` (with
/// the reason printed) where they cannot be built — unless `CAPSTAN_TEST_REQUIRE_PLUGINS=1`
/// (as `.ci/run` sets it), which makes that a failure.
fn built() -> Option<&'static PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
            let target =
                std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace.join("target")).join("wasm-plugins");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = std::process::Command::new(cargo)
                .current_dir(&workspace)
                .args(["build", "--release", "--target", "wasm32-wasip2", "-p", "capstan-plugin-example", "-p", "capstan-plugin-adversary"])
                .arg("--target-dir")
                .arg(&target)
                .status();
            match status {
                Ok(s) if s.success() => Some(target.join("wasm32-wasip2/release")),
                other => {
                    let why = format!("building the test plugins for wasm32-wasip2 failed ({other:?}); is the target installed?");
                    assert!(std::env::var("CAPSTAN_TEST_REQUIRE_PLUGINS").as_deref() != Ok("1"), "{why}");
                    eprintln!("skipped: {why}");
                    None
                }
            }
        })
        .as_ref()
}

fn manifest(dir: &str, version: Option<&str>) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir).join("capstan-plugin.toml");
    let text = std::fs::read_to_string(path).unwrap();
    match version {
        Some(v) => text.replacen("version = \"0.1.0\"", &format!("version = \"{v}\""), 1),
        None => text,
    }
}

/// The example plugin's page templates.
fn example_pages() -> std::collections::BTreeMap<String, String> {
    crate::plugins::bundle::read_page_templates(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plugins/example")).unwrap()
}

/// Install the example plugin on `state`'s host, signed by a publisher trusted for it, with
/// everything it requests granted; false when the test plugins cannot be built here.
pub(super) async fn install_example(state: &AppState) -> bool {
    let Some(built) = built() else { return false };
    let key = generate_key();
    let host = &state.plugins;
    host.add_trusted_publisher(&PublisherKey::from_verifying_key(key.verifying_key()).to_string(), "Tests", "admin").await.unwrap();
    let component = std::fs::read(built.join("capstan_plugin_example.wasm")).unwrap();
    let mut bundle = Bundle::new(manifest("plugins/example", None), component).unwrap().with_pages(example_pages()).unwrap();
    bundle.sign(&key);
    host.install(&bundle.to_bytes(), &["all-requested".into()], "admin").await.unwrap();
    true
}

struct Fixture {
    _dir: tempfile::TempDir,
    state: AppState,
    host: Arc<PluginHost>,
    key: ed25519_dalek::SigningKey,
    admin: Identity,
}

impl Fixture {
    /// `None` when the test plugins cannot be built here (the reason was printed).
    async fn new() -> Option<Fixture> {
        built()?;
        let dir = tempfile::tempdir().unwrap();
        let state = crate::state::test_state(dir.path()).await;
        let host = state.plugins.clone();
        let key = generate_key();
        host.add_trusted_publisher(&PublisherKey::from_verifying_key(key.verifying_key()).to_string(), "Tests", "admin").await.unwrap();
        let now = capstan_core::clock::now_ms();
        let admin = Identity {
            user_id: "u-admin".into(),
            username: "admin".into(),
            kind: "human".into(),
            admin: true,
            session_id: "s".into(),
            authenticated_at: now,
            expires_at: now + 60_000,
        };
        Some(Fixture { _dir: dir, state, host, key, admin })
    }

    fn bundle(&self, crate_name: &str, dir: &str, version: Option<&str>) -> Vec<u8> {
        let component = std::fs::read(built().expect("built").join(format!("{crate_name}.wasm"))).unwrap();
        let pages =
            crate::plugins::bundle::read_page_templates(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir)).unwrap();
        let mut bundle = Bundle::new(manifest(dir, version), component).unwrap().with_pages(pages).unwrap();
        bundle.sign(&self.key);
        bundle.to_bytes()
    }

    fn example(&self, version: Option<&str>) -> Vec<u8> {
        self.bundle("capstan_plugin_example", "plugins/example", version)
    }

    /// The example plugin as built against `capstan:plugin@0.1.0` (`tests/plugins/example-0.1.0`,
    /// a pinned component), at `version`, and with its manifest's `wit` replaced by `wit`.
    fn example_0_1(&self, version: Option<&str>, wit: Option<&str>) -> Vec<u8> {
        let dir = "tests/plugins/example-0.1.0";
        let component = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir).join("plugin.wasm")).unwrap();
        let text = manifest(dir, version);
        let text = match wit {
            Some(wit) => text.replace("capstan:plugin@0.1.0", wit),
            None => text,
        };
        let mut bundle = Bundle::new(text, component).unwrap();
        bundle.sign(&self.key);
        bundle.to_bytes()
    }

    /// The example plugin as built against `capstan:plugin@0.2.0` (`tests/plugins/example-0.2.0`,
    /// a pinned component with its page template).
    fn example_0_2_0(&self) -> Vec<u8> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/plugins/example-0.2.0");
        let component = std::fs::read(dir.join("plugin.wasm")).unwrap();
        let pages = crate::plugins::bundle::read_page_templates(&dir).unwrap();
        let mut bundle = Bundle::new(manifest("tests/plugins/example-0.2.0", None), component).unwrap().with_pages(pages).unwrap();
        bundle.sign(&self.key);
        bundle.to_bytes()
    }

    /// The example plugin as built against `capstan:plugin@0.3.0` (`tests/plugins/example-0.3.0`,
    /// a pinned component with its page template), at `version`.
    fn example_0_3_0(&self, version: Option<&str>) -> Vec<u8> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/plugins/example-0.3.0");
        let component = std::fs::read(dir.join("plugin.wasm")).unwrap();
        let pages = crate::plugins::bundle::read_page_templates(&dir).unwrap();
        let mut bundle = Bundle::new(manifest("tests/plugins/example-0.3.0", version), component).unwrap().with_pages(pages).unwrap();
        bundle.sign(&self.key);
        bundle.to_bytes()
    }

    /// A new service (of a new organization) created by the administrator; its id.
    async fn service(&self, name: &str) -> String {
        let call = |method: &str, body: Value| {
            let method = self.state.methods.get(method).unwrap();
            async move { method.call(crate::api::Call::by(&self.admin), body).await.unwrap() }
        };
        let org = call("organizations.create", json!({ "name": format!("{name}-org") })).await;
        let service = json!({ "organizationId": org["id"], "name": name, "image": "nginx:1" });
        call("services.create", service).await["id"].as_str().unwrap().to_string()
    }

    fn adversary(&self) -> Vec<u8> {
        self.bundle("capstan_plugin_adversary", "tests/plugins/adversary", None)
    }

    /// The adversary at `version`, also requesting `capabilities` (its manifest asks for
    /// `store` and `log` only), signed.
    fn adversary_requesting(&self, version: Option<&str>, capabilities: &[&str]) -> Vec<u8> {
        let component = std::fs::read(built().expect("built").join("capstan_plugin_adversary.wasm")).unwrap();
        let more: String = capabilities.iter().map(|c| format!(", \"{c}\"")).collect();
        let text = manifest("tests/plugins/adversary", version).replacen(
            r#"requested = ["store", "log"]"#,
            &format!(r#"requested = ["store", "log"{more}]"#),
            1,
        );
        let mut bundle = Bundle::new(text, component).unwrap();
        bundle.sign(&self.key);
        bundle.to_bytes()
    }

    async fn call(&self, plugin: &str, method: &str, body: Value) -> crate::refusal::Result<Value> {
        self.host.dispatch(plugin, method, Some(&self.admin), "req-test", body).await
    }
}

fn all() -> Vec<String> {
    vec!["all-requested".into()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installed_plugin_serves_its_methods_and_keeps_its_data_across_upgrade_and_rollback() {
    let Some(f) = Fixture::new().await else { return };
    let record = f.host.install(&f.example(None), &all(), "admin").await.unwrap();
    assert_eq!(record.current.version, "0.1.0");
    assert_eq!(record.current.grants, vec!["agents", "events:publish", "inventory:read", "inventory:write-services", "log", "store"]);

    let greeting = f.call("example", "greet", json!({ "name": "Ada" })).await.unwrap();
    assert_eq!(greeting["greeting"], "Hello, Ada!");
    assert_eq!(greeting["version"], "0.1.0");
    assert_eq!(greeting["caller"], "u-admin");

    let note = f.call("example", "putNote", json!({ "id": "n1", "text": "first" })).await.unwrap();
    assert_eq!(note["revision"], 1);
    let stale = f.call("example", "putNote", json!({ "id": "n1", "text": "again", "expectedRevision": 7 })).await.unwrap_err();
    assert_eq!(stale.code, "conflict");
    let missing = f.call("example", "getNote", json!({ "id": "nope" })).await.unwrap_err();
    assert!(missing.code.ends_with("not-found"), "{missing}");

    // the host validates the body against the method's schema before the plugin runs
    let invalid = f.call("example", "greet", json!({ "name": 5 })).await.unwrap_err();
    assert_eq!(invalid.code, "invalid-request");
    let unknown = f.call("example", "nothing", json!({})).await.unwrap_err();
    assert_eq!(unknown.code, "method-unknown");

    // the same version again is not an upgrade; a higher one is, and runs its migration
    let same = f.host.upgrade(&f.example(None), &all(), "admin").await.unwrap_err();
    assert_eq!(same.code, "version-not-newer");
    let upgraded = f.host.upgrade(&f.example(Some("0.2.0")), &all(), "admin").await.unwrap();
    assert_eq!(upgraded.previous.as_ref().unwrap().version, "0.1.0");
    let greeting = f.call("example", "greet", json!({ "name": "Ada" })).await.unwrap();
    assert_eq!(greeting["version"], "0.2.0");
    assert_eq!(f.call("example", "getNote", json!({ "id": "n1" })).await.unwrap()["text"], "first");

    let back = f.host.rollback("example", "admin").await.unwrap();
    assert_eq!(back.current.version, "0.1.0");
    assert_eq!(f.call("example", "greet", json!({ "name": "Ada" })).await.unwrap()["version"], "0.1.0");
    assert_eq!(f.host.rollback("example", "admin").await.unwrap_err().code, "rollback-unavailable");

    f.host.set_enabled("example", false, "admin").await.unwrap();
    assert_eq!(f.call("example", "greet", json!({ "name": "Ada" })).await.unwrap_err().code, "plugin-disabled");
    assert!(f.state.methods.get("example.greet").is_none(), "a disabled plugin's methods leave the registry");
    f.host.set_enabled("example", true, "admin").await.unwrap();
    assert!(f.state.methods.get("example.greet").is_some(), "and come back with it");
    assert_eq!(f.call("example", "getNote", json!({ "id": "n1" })).await.unwrap()["text"], "first");

    // a restart loads the registry again
    let fresh = PluginHost::new(f.host.runtime.clone(), f.host.services.clone(), vec![], vec![]).await.unwrap();
    fresh.sync().await.unwrap();
    assert!(fresh.get("example").is_some());

    let removed = f.host.uninstall("example", true, "admin").await.unwrap();
    assert_eq!(removed["purged"], true);
    assert!(removed["removed"]["documents"].as_u64().unwrap() >= 1);
    assert!(f.host.record("example").await.unwrap().is_none());
    let _ = &f.state;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_for_the_0_1_contract_installs_serves_and_upgrades_to_the_current_one() {
    let Some(f) = Fixture::new().await else { return };
    let record = f.host.install(&f.example_0_1(None, None), &all(), "admin").await.unwrap();
    assert_eq!(record.current.wit, "capstan:plugin@0.1.0");
    assert!(record.current.settings.is_empty() && record.current.pages.is_empty(), "0.1.0 declares neither");

    // calls, refusals, the store and the caller all cross the adapter
    let greeting = f.call("example", "greet", json!({ "name": "Ada" })).await.unwrap();
    assert_eq!((greeting["greeting"].as_str(), greeting["caller"].as_str()), (Some("Hello, Ada!"), Some("u-admin")));
    assert_eq!(f.call("example", "putNote", json!({ "id": "n1", "text": "first" })).await.unwrap()["revision"], 1);
    let stale = f.call("example", "putNote", json!({ "id": "n1", "text": "again", "expectedRevision": 7 })).await.unwrap_err();
    assert_eq!(stale.code, "conflict");
    let listed = f.call("example", "listNotes", json!({})).await.unwrap();
    assert_eq!(listed["notes"][0]["text"], "first", "{listed}");

    // a manifest naming the current contract over a 0.1.0 component is caught at load
    let lying = f.host.upgrade(&f.example_0_1(Some("0.1.5"), Some(crate::plugins::manifest::CURRENT_WIT)), &all(), "admin").await;
    assert_eq!(lying.unwrap_err().code, "wit-version-mismatch");

    // the same plugin built against the current contract upgrades it, data kept; and back
    let upgraded = f.host.upgrade(&f.example(Some("0.2.0")), &all(), "admin").await.unwrap();
    assert_eq!(upgraded.current.wit, crate::plugins::manifest::CURRENT_WIT);
    assert_eq!(f.call("example", "getNote", json!({ "id": "n1" })).await.unwrap()["text"], "first");
    let back = f.host.rollback("example", "admin").await.unwrap();
    assert_eq!(back.current.wit, "capstan:plugin@0.1.0");
    assert_eq!(f.call("example", "getNote", json!({ "id": "n1" })).await.unwrap()["text"], "first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_for_the_0_2_0_contract_runs_on_the_current_host_and_upgrades_to_it() {
    let Some(f) = Fixture::new().await else { return };
    assert_ne!(crate::plugins::manifest::CURRENT_WIT, "capstan:plugin@0.2.0", "this test pins the contract before the current one");
    let record = f.host.install(&f.example_0_2_0(), &all(), "admin").await.unwrap();
    assert_eq!(record.current.wit, "capstan:plugin@0.2.0");
    assert_eq!(record.current.pages.len(), 2, "0.2.0 declares pages");

    // its 0.2.0 imports and exports resolve to the current ones
    let greeting = f.call("example", "greet", json!({ "name": "Ada" })).await.unwrap();
    assert_eq!(greeting["greeting"], "Hello, Ada!");
    assert_eq!(f.call("example", "putNote", json!({ "id": "n1", "text": "first" })).await.unwrap()["revision"], 1);

    let upgraded = f.host.upgrade(&f.example(Some("0.2.0")), &all(), "admin").await.unwrap();
    assert_eq!(upgraded.current.wit, crate::plugins::manifest::CURRENT_WIT);
    assert_eq!(f.call("example", "getNote", json!({ "id": "n1" })).await.unwrap()["text"], "first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_for_the_0_3_0_contract_runs_on_the_current_host_and_upgrades_to_it() {
    let Some(f) = Fixture::new().await else { return };
    assert_ne!(crate::plugins::manifest::CURRENT_WIT, "capstan:plugin@0.3.0", "this test pins the contract before the current one");
    let record = f.host.install(&f.example_0_3_0(None), &all(), "admin").await.unwrap();
    assert_eq!(record.current.wit, "capstan:plugin@0.3.0");
    assert!(record.current.faces.facet("service").is_some(), "0.3.0 declares facets");

    // its 0.3.0 imports and exports resolve to the current ones, 0.3.0's own set-facet included
    let greeting = f.call("example", "greet", json!({ "name": "Ada" })).await.unwrap();
    assert_eq!(greeting["greeting"], "Hello, Ada!");
    assert_eq!(f.call("example", "putNote", json!({ "id": "n1", "text": "first" })).await.unwrap()["revision"], 1);
    let service = f.service("web").await;
    let tagged = f.call("example", "tagService", json!({ "serviceId": service, "tag": "blue" })).await.unwrap();
    assert_eq!(tagged["facets"]["example"]["tag"], "blue", "{tagged}");

    // a 0.3.0 component under a manifest naming 0.3.1 loads too (a patch only adds), and the
    // same plugin built against the current contract upgrades it, data kept
    let text = manifest("tests/plugins/example-0.3.0", Some("0.1.5")).replace("capstan:plugin@0.3.0", "capstan:plugin@0.3.1");
    let component = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/plugins/example-0.3.0/plugin.wasm")).unwrap();
    let mut bundle = Bundle::new(text, component).unwrap().with_pages(example_pages()).unwrap();
    bundle.sign(&f.key);
    assert_eq!(f.host.upgrade(&bundle.to_bytes(), &all(), "admin").await.unwrap().current.wit, "capstan:plugin@0.3.1");
    let upgraded = f.host.upgrade(&f.example(Some("0.2.0")), &all(), "admin").await.unwrap();
    assert_eq!(upgraded.current.version, "0.2.0");
    assert_eq!(f.call("example", "getNote", json!({ "id": "n1" })).await.unwrap()["text"], "first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_granted_runtime_read_reads_where_a_service_runs_through_the_sdk() {
    let Some(f) = Fixture::new().await else { return };
    let service = f.service("web").await;
    let slot =
        super::plugin_runtime::slot(&service, "cluster_a", "node_a", 0, crate::runtime::transition::Intent::Run, Some(("running", true)));
    let id = crate::runtime::slots::slot_id(&service, &slot.slot);
    let data = serde_json::to_value(&slot).unwrap();
    f.state
        .store
        .transact(|tx| {
            let (id, data) = (id.clone(), data.clone());
            async move { tx.insert(crate::runtime::RUNTIME_SLOTS, &id, data).await }
        })
        .await
        .unwrap();

    // not granted: refused by name, the capability named
    f.host.install(&f.adversary(), &all(), "admin").await.unwrap();
    let refused = f.call("adversary", "replicas", json!({ "serviceId": service })).await.unwrap_err();
    assert_eq!(refused.code, "capability-denied", "{refused}");
    assert_eq!(refused.data.as_ref().unwrap()["capability"], "runtime:read", "{refused}");

    // granted: the replicas, through the SDK's types (a read-only method may ask)
    let upgraded = f.host.upgrade(&f.adversary_requesting(Some("0.2.0"), &["runtime:read"]), &all(), "admin").await.unwrap();
    assert!(upgraded.current.grants.contains(&"runtime:read".to_string()), "{:?}", upgraded.current.grants);
    let read = f.call("adversary", "replicas", json!({ "serviceId": service })).await.unwrap();
    assert_eq!(
        read["replicas"],
        json!([{
            "clusterId": "cluster_a", "nodeId": "node_a", "slot": "node_a.0", "assignmentId": "asg_node_a_0",
            "intent": "run", "phase": "running", "ready": true, "imageDigest": "sha256:abc",
        }]),
        "{read}"
    );
    let missing = f.call("adversary", "replicas", json!({ "serviceId": "svc_nope" })).await.unwrap_err();
    assert_eq!(missing.code, "service-not-found", "{missing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_refuses_by_name_and_records_nothing() {
    let Some(f) = Fixture::new().await else { return };
    let good = f.example(None);

    let mut changed = good.clone();
    let at = changed.len() / 2;
    changed[at] ^= 0x01;
    let refused = f.host.install(&changed, &all(), "admin").await.unwrap_err();
    assert!(["bundle-signature-invalid", "bundle-malformed"].contains(&refused.code.as_ref()), "{refused}");

    let stranger = generate_key();
    let mut untrusted = Bundle::parse(&good).unwrap();
    untrusted.sign(&stranger);
    assert_eq!(f.host.install(&untrusted.to_bytes(), &all(), "admin").await.unwrap_err().code, "publisher-untrusted");

    let too_few = vec!["store".to_string()];
    assert_eq!(f.host.install(&good, &too_few, "admin").await.unwrap_err().code, "capabilities-not-approved");

    assert_eq!(f.host.install(&[0u8; 100], &all(), "admin").await.unwrap_err().code, "bundle-malformed");

    // a page naming a template the bundle does not carry
    let component = std::fs::read(built().expect("built").join("capstan_plugin_example.wasm")).unwrap();
    let mut bare = Bundle::new(manifest("plugins/example", None), component).unwrap();
    bare.sign(&f.key);
    let refused = f.host.install(&bare.to_bytes(), &all(), "admin").await.unwrap_err();
    assert_eq!(refused.code, "plugin-descriptor-invalid", "{refused}");
    assert!(refused.message.contains("pages/overview.html"), "{refused}");
    assert!(f.host.records().await.unwrap().is_empty());

    f.host
        .install(
            &good,
            &[
                "agents".into(),
                "events:publish".into(),
                "inventory:read".into(),
                "inventory:write-services".into(),
                "log".into(),
                "store".into(),
            ],
            "admin",
        )
        .await
        .unwrap();
    assert_eq!(f.host.install(&good, &all(), "admin").await.unwrap_err().code, "plugin-exists");

    crate::fleet::freeze(&f.state.blobs, "alice", "release week").await.unwrap();
    assert_eq!(f.host.upgrade(&f.example(Some("0.3.0")), &all(), "admin").await.unwrap_err().code, "deploy-frozen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misbehaving_plugin_is_refused_by_name_and_the_host_keeps_serving() {
    let Some(f) = Fixture::new().await else { return };
    f.host.install(&f.adversary(), &all(), "admin").await.unwrap();
    f.host.install(&f.example(None), &all(), "admin").await.unwrap();

    let spin = f.call("adversary", "spin", json!({})).await.unwrap_err();
    assert_eq!(spin.code, "plugin-deadline-exceeded", "{spin}");
    let bomb = f.call("adversary", "bomb", json!({})).await.unwrap_err();
    assert_eq!(bomb.code, "plugin-resource-exhausted", "{bomb}");
    let forbidden = f.call("adversary", "forbidden", json!({})).await.unwrap_err();
    assert_eq!(forbidden.code, "capability-denied", "{forbidden}");
    let trap = f.call("adversary", "trap", json!({})).await.unwrap_err();
    assert_eq!(trap.code, "plugin-failed", "{trap}");
    let garbage = f.call("adversary", "garbage", json!({})).await.unwrap_err();
    assert_eq!(garbage.code, "plugin-output-invalid", "{garbage}");

    assert_eq!(f.call("adversary", "echo", json!({ "value": "still here" })).await.unwrap()["value"], "still here");
    assert_eq!(f.call("example", "greet", json!({ "name": "Ada" })).await.unwrap()["greeting"], "Hello, Ada!");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_make_the_host_do_or_hold_more_than_a_call_s_budgets() {
    let Some(f) = Fixture::new().await else { return };
    f.host.install(&f.adversary_requesting(None, &["blobs"]), &all(), "admin").await.unwrap();
    let budget = |refused: &crate::refusal::Refusal| refused.data.as_ref().map(|d| d["budget"].clone()).unwrap_or_default();

    let within = f.call("adversary", "chatter", json!({ "calls": 1000 })).await.unwrap();
    assert_eq!(within["done"], 1000);
    let chatter = f.call("adversary", "chatter", json!({ "calls": crate::plugins::imports::MAX_HOST_CALLS + 1 })).await.unwrap_err();
    assert_eq!((chatter.code.as_ref(), budget(&chatter)), ("resource-exhausted", json!("host-calls")), "{chatter}");

    // 1 MiB per writer, never finished: the host holds at most the plugin's memory limit (64 MiB)
    let hoard = f.call("adversary", "hoard", json!({})).await.unwrap_err();
    assert_eq!((hoard.code.as_ref(), budget(&hoard)), ("resource-exhausted", json!("host-bytes")), "{hoard}");

    let limit = crate::plugins::imports::MAX_METHOD_OUTPUT as u32;
    assert_eq!(f.call("adversary", "bloat", json!({ "bytes": 1000 })).await.unwrap()["filler"].as_str().unwrap().len(), 1000);
    let bloat = f.call("adversary", "bloat", json!({ "bytes": limit })).await.unwrap_err();
    assert_eq!((bloat.code.as_ref(), budget(&bloat)), ("resource-exhausted", json!("method-output")), "{bloat}");

    // each call has budgets of its own: the next one starts afresh
    assert_eq!(f.call("adversary", "chatter", json!({ "calls": 1000 })).await.unwrap()["done"], 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_a_subscribed_plugin_in_commit_order() {
    let Some(f) = Fixture::new().await else { return };
    f.host.install(&f.example(None), &all(), "admin").await.unwrap();
    for i in 0..5 {
        f.call("example", "putNote", json!({ "id": format!("n{i}"), "text": "x" })).await.unwrap();
    }
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let worker = crate::plugins::work::spawn(f.host.clone(), None, stop);
    let mut log = Value::Null;
    for _ in 0..80 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        log = f.call("example", "eventLog", json!({})).await.unwrap();
        if log["events"].as_array().is_some_and(|e| e.len() == 5) {
            break;
        }
    }
    let _ = stop_tx.send(true);
    let _ = worker.await;
    let events = log["events"].as_array().expect("an event log");
    let subjects: Vec<&str> = events.iter().map(|e| e["subject"].as_str().unwrap()).collect();
    assert_eq!(subjects, vec!["n0", "n1", "n2", "n3", "n4"]);
    let sequences: Vec<u64> = events.iter().map(|e| e["sequence"].as_u64().unwrap()).collect();
    assert!(sequences.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(
        crate::events::cursor(&f.host.services.store, "plugin:example").await.unwrap(),
        crate::events::head(&f.host.services.store).await.unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compiled_component_is_cached_by_digest() {
    let Some(f) = Fixture::new().await else { return };
    let component = std::fs::read(built().expect("built").join("capstan_plugin_example.wasm")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let runtime = crate::plugins::runtime::Runtime::new(Some(dir.path().to_path_buf())).unwrap();
    assert!(!runtime.prepare(&component, crate::plugins::manifest::CURRENT_WIT).unwrap().cached);
    assert!(runtime.prepare(&component, crate::plugins::manifest::CURRENT_WIT).unwrap().cached);
    let _ = f;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_party_plugins_install_at_start_follow_the_binary_and_are_disabled_rather_than_uninstalled() {
    let Some(f) = Fixture::new().await else { return };
    let component = std::fs::read(built().expect("built").join("capstan_plugin_example.wasm")).unwrap();
    let embedded = |version: Option<&str>| {
        Bundle::new(manifest("plugins/example", version), component.clone()).unwrap().with_pages(example_pages()).unwrap()
    };
    let (runtime, services) = (f.host.runtime.clone(), f.host.services.clone());
    let start = |first_party: Vec<Bundle>| PluginHost::new(runtime.clone(), services.clone(), vec![], first_party);

    // the first start installs it with exactly what it declares, trusted as first-party
    let host = start(vec![embedded(None)]).await.unwrap();
    host.install_first_party().await.unwrap();
    let (record, revision) = host.record("example").await.unwrap().unwrap();
    assert_eq!(
        (record.current.publisher.as_str(), record.current.installed_by.as_str(), record.current.version.as_str()),
        ("first-party", "capstan", "0.1.0")
    );
    assert_eq!(record.current.grants, vec!["agents", "events:publish", "inventory:read", "inventory:write-services", "log", "store"]);
    assert_eq!(host.dispatch("example", "greet", Some(&f.admin), "r", json!({ "name": "Ada" })).await.unwrap()["version"], "0.1.0");
    host.install_first_party().await.unwrap();
    assert_eq!(host.record("example").await.unwrap().unwrap().1, revision, "a second start changes nothing");

    // a restart loads it from the registry again; a binary that does not embed those bytes cannot
    let restarted = start(vec![embedded(None)]).await.unwrap();
    restarted.sync().await.unwrap();
    assert!(restarted.get("example").is_some());
    let stranger = start(vec![]).await.unwrap();
    stranger.sync().await.unwrap();
    assert!(stranger.get("example").is_none());
    assert_eq!(stranger.load_error("example").unwrap().code, "bundle-signature-invalid");

    // a newer binary upgrades it at start
    let newer = start(vec![embedded(Some("0.2.0"))]).await.unwrap();
    newer.install_first_party().await.unwrap();
    let (record, _) = newer.record("example").await.unwrap().unwrap();
    assert_eq!((record.current.version.as_str(), record.previous.unwrap().version.as_str()), ("0.2.0", "0.1.0"));
    assert_eq!(newer.dispatch("example", "greet", Some(&f.admin), "r", json!({ "name": "Ada" })).await.unwrap()["version"], "0.2.0");
    // an unsigned bundle is first-party only byte for byte
    let imitation = embedded(Some("0.3.0")).to_bytes();
    assert_eq!(newer.upgrade(&imitation, &all(), "admin").await.unwrap_err().code, "bundle-signature-invalid");
    // it is not uninstalled (it would come back at the next start): it is disabled
    assert_eq!(newer.uninstall("example", false, "admin").await.unwrap_err().code, "plugin-first-party");
    newer.set_enabled("example", false, "admin").await.unwrap();
    let newest = start(vec![embedded(Some("0.4.0"))]).await.unwrap();
    newest.install_first_party().await.unwrap();
    let (record, _) = newest.record("example").await.unwrap().unwrap();
    assert_eq!((record.current.version.as_str(), record.enabled), ("0.2.0", false), "a disabled plugin stays as the operator left it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_another_publisher_installed_under_a_first_party_id_is_left_alone() {
    let Some(f) = Fixture::new().await else { return };
    f.host.install(&f.example(None), &all(), "admin").await.unwrap();
    let component = std::fs::read(built().expect("built").join("capstan_plugin_example.wasm")).unwrap();
    let first_party =
        vec![Bundle::new(manifest("plugins/example", Some("0.9.0")), component).unwrap().with_pages(example_pages()).unwrap()];
    let host = PluginHost::new(f.host.runtime.clone(), f.host.services.clone(), vec![], first_party).await.unwrap();
    host.install_first_party().await.unwrap();
    let (record, _) = host.record("example").await.unwrap().unwrap();
    assert_eq!(record.current.version, "0.1.0");
    assert_ne!(record.current.publisher, "first-party");
}

/// A loopback HTTP server answering every request `200 ok` — but `421` to one whose `Host`
/// names another server; its origin.
async fn answering_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut request = [0u8; 4096];
                let n = socket.read(&mut request).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..n]).to_ascii_lowercase();
                let answer: &[u8] = if head.contains("\r\nhost: 127.0.0.1:") || head.contains("\r\nhost: localhost:") {
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                } else {
                    b"HTTP/1.1 421 Misdirected Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                };
                let _ = socket.write_all(answer).await;
            });
        }
    });
    origin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_setting_grant_reaches_exactly_the_origins_the_operator_lists_now() {
    let Some(f) = Fixture::new().await else { return };
    // its own URL setting, and a host setting that lists URLs
    let bundle = f.adversary_requesting(None, &["http-setting:adversary.sources", "http-setting:corebuildWorkerUrls"]);
    let record = f.host.install(&bundle, &all(), "admin").await.unwrap();
    assert!(record.current.grants.contains(&"http-setting:adversary.sources".to_string()), "{:?}", record.current.grants);

    let (listed, unlisted, worker) = (answering_server().await, answering_server().await, answering_server().await);
    let fetch = |origin: &str| f.call("adversary", "fetch", json!({ "url": format!("{origin}/catalog.json") }));
    assert_eq!(fetch(&listed).await.unwrap_err().code, "capability-denied", "nothing is listed yet");
    let settings = f.state.methods.get("settings.update").unwrap();
    let call = || crate::api::Call::by(&f.admin);
    let body = json!({ "expectedRevision": 0, "set": {
        "adversary.sources": [format!("{listed}/catalog.json")],
        "corebuildWorkerUrls": [format!("{worker}/")],
    } });
    settings.call(call(), body).await.unwrap();
    assert_eq!(fetch(&listed).await.unwrap()["status"], 200);
    assert_eq!(fetch(&worker).await.unwrap()["status"], 200);
    assert_eq!(fetch(&unlisted).await.unwrap_err().code, "capability-denied", "another origin stays closed");
    settings.call(call(), json!({ "expectedRevision": 1, "unset": ["adversary.sources"] })).await.unwrap();
    assert_eq!(fetch(&listed).await.unwrap_err().code, "capability-denied", "the grant follows the setting as it stands");

    // only a setting that lists URLs, of the host or the plugin's own, can be named
    for capability in ["http-setting:deploymentArchiveRetentionDays", "http-setting:adversary.nothing", "http-setting:example.welcome"] {
        let refused = f.host.upgrade(&f.adversary_requesting(Some("0.2.0"), &[capability]), &all(), "admin").await.unwrap_err();
        assert_eq!(refused.code, "capability-unknown", "{capability}: {refused}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_declares_its_settings_and_operators_set_them_within_their_schema() {
    let Some(f) = Fixture::new().await else { return };
    let method = |name: &str| f.state.methods.get(name).unwrap_or_else(|| panic!("{name} is registered"));
    let call = || crate::api::Call::by(&f.admin);
    let settings_update = method("settings.update");
    let update = |body: Value| settings_update.call(call(), body);
    assert_eq!(update(json!({ "expectedRevision": 0, "set": { "example.welcome": "Hi" } })).await.unwrap_err().code, "setting-unknown");

    f.host.install(&f.example(None), &all(), "admin").await.unwrap();
    let listed = method("settings.get").call(call(), json!({})).await.unwrap();
    let known = listed["known"].as_array().unwrap().iter().find(|k| k["key"] == "example.welcome").cloned().unwrap();
    assert_eq!((known["plugin"].as_str(), known["default"].as_str()), (Some("example"), Some("Notes kept by the example plugin.")));
    assert_eq!(known["schema"]["type"], "string");
    assert_eq!(f.call("example", "overview", json!({})).await.unwrap()["welcome"], "Notes kept by the example plugin.");

    for (value, code) in [(json!(""), "setting-invalid"), (json!(5), "setting-invalid"), (json!({ "apiKey": "x" }), "setting-is-secret")] {
        let refused = update(json!({ "expectedRevision": 0, "set": { "example.welcome": value } })).await.unwrap_err();
        assert_eq!(refused.code, code, "{value}: {refused}");
        assert_eq!(refused.data.as_ref().unwrap()["key"], "example.welcome");
    }
    for (key, code) in [("example.nothing", "setting-unknown"), ("example.apiToken", "setting-is-secret")] {
        assert_eq!(update(json!({ "expectedRevision": 0, "set": { key: "x" } })).await.unwrap_err().code, code, "{key}");
    }
    update(json!({ "expectedRevision": 0, "set": { "example.welcome": "Welcome, operators" } })).await.unwrap();
    assert_eq!(f.call("example", "overview", json!({})).await.unwrap()["welcome"], "Welcome, operators", "the plugin reads it");

    // a setting that outlived its plugin can still be removed
    f.host.uninstall("example", true, "admin").await.unwrap();
    assert_eq!(update(json!({ "expectedRevision": 1, "set": { "example.welcome": "x" } })).await.unwrap_err().code, "setting-unknown");
    let cleared = update(json!({ "expectedRevision": 1, "unset": ["example.welcome"] })).await.unwrap();
    assert_eq!(cleared["settings"], json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_http_reaches_no_internal_address_the_operator_did_not_allow() {
    let Some(f) = Fixture::new().await else { return };
    let allowed = answering_server().await;
    let port = allowed.rsplit(':').next().unwrap();
    // the fixture allows 127.0.0.0/8 only: every origin below is granted, few are reachable
    let (v6, metadata, named) = (format!("http://[::1]:{port}"), "http://169.254.169.254".to_string(), format!("http://localhost:{port}"));
    let grants: Vec<String> = [&allowed, &v6, &metadata, &named].iter().map(|o| format!("http:{o}")).collect();
    let grants: Vec<&str> = grants.iter().map(String::as_str).collect();
    f.host.install(&f.adversary_requesting(None, &grants), &all(), "admin").await.unwrap();
    let fetch =
        |origin: &str, headers: Value| f.call("adversary", "fetch", json!({ "url": format!("{origin}/catalog.json"), "headers": headers }));

    assert_eq!(fetch(&allowed, json!({})).await.unwrap()["status"], 200, "an allowed network is reached");
    for (origin, range) in [(&v6, "loopback"), (&metadata, "link-local")] {
        let refused = fetch(origin, json!({})).await.unwrap_err();
        assert_eq!(refused.code, "http-address-refused", "{origin}: {refused}");
        assert_eq!(refused.data.as_ref().unwrap()["range"], range, "{origin}");
    }
    // a name is checked on every address it resolves to: one outside the allowed networks
    // refuses it (localhost is ::1 too where the machine resolves it so)
    let resolved: Vec<std::net::SocketAddr> = tokio::net::lookup_host(("localhost", 80)).await.unwrap().collect();
    let answer = fetch(&named, json!({})).await;
    if resolved.iter().any(|a| a.ip().is_ipv6()) {
        assert_eq!(answer.unwrap_err().code, "http-address-refused", "localhost resolves to {resolved:?}");
    } else {
        assert_eq!(answer.unwrap()["status"], 200, "localhost resolves to {resolved:?}");
    }
    // the URL says where a request goes: a Host the plugin sets is dropped
    assert_eq!(fetch(&allowed, json!({ "Host": "metadata.internal" })).await.unwrap()["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_stays_for_another_try_after_an_approval_refusal_and_goes_once_installed_or_discarded() {
    let Some(f) = Fixture::new().await else { return };
    let method = |name: &str| f.state.methods.get(name).unwrap_or_else(|| panic!("{name} is registered"));
    let call = || crate::api::Call::by(&f.admin);
    let (upload, inspection) = crate::plugins::uploads::keep(&f.state.blobs, f.example(None), "admin").await.unwrap();
    assert_eq!(inspection.id, "example");

    // too few capabilities approved: refused, and the upload is still there to look at
    let partial = json!({ "upload": upload, "approve": ["log"] });
    assert_eq!(method("plugins.install").call(call(), partial).await.unwrap_err().code, "capabilities-not-approved");
    let kept = method("plugins.inspectUpload").call(call(), json!({ "upload": upload })).await.unwrap();
    assert_eq!((kept["upload"].as_str(), kept["bundle"]["id"].as_str()), (Some(upload.as_str()), Some("example")));

    // installed: the upload is gone
    let installed = method("plugins.install").call(call(), json!({ "upload": upload, "approve": all() })).await.unwrap();
    assert_eq!(installed["id"], "example");
    let gone = method("plugins.inspectUpload").call(call(), json!({ "upload": upload })).await.unwrap_err();
    assert_eq!(gone.code, "upload-not-found");

    // discarded: once, then there is nothing to discard; a malformed id is refused by name
    let (other, _) = crate::plugins::uploads::keep(&f.state.blobs, f.example(Some("0.2.0")), "admin").await.unwrap();
    let discarder = method("plugins.discardUpload");
    let discard = |upload: &str| discarder.call(call(), json!({ "upload": upload }));
    assert_eq!(discard(&other).await.unwrap(), json!({ "discarded": true }));
    assert_eq!(discard(&other).await.unwrap(), json!({ "discarded": false }));
    assert_eq!(discard("../../etc/passwd").await.unwrap_err().code, "invalid-request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_caller_of_a_public_method_lends_the_plugin_no_authority() {
    let Some(f) = Fixture::new().await else { return };
    f.host.install(&f.adversary_requesting(None, &["inventory:write-services"]), &all(), "admin").await.unwrap();
    let create_org = f.state.methods.get("organizations.create").unwrap();
    let org = create_org.call(crate::api::Call::by(&f.admin), json!({ "name": "acme" })).await.unwrap();
    let service = |name: &str| json!({ "service": { "organizationId": org["id"], "name": name, "image": "nginx:1" } });

    // anonymous: the plugin's own authority (which manages every service) is not lent out
    let refused = f.host.dispatch("adversary", "squat", None, "req-anon", service("squatted")).await.unwrap_err();
    assert_eq!(refused.code, "unauthenticated", "{refused}");
    let list = f.state.methods.get("services.list").unwrap();
    let listed = list.call(crate::api::Call::by(&f.admin), json!({ "organizationId": org["id"] })).await.unwrap();
    assert_eq!(listed["items"], json!([]), "nothing was created");

    // an authenticated caller's own authority is what the write carries
    let created = f.call("adversary", "squat", service("invited")).await.unwrap();
    assert!(created["id"].as_str().is_some_and(|id| !id.is_empty()), "{created}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_declared_read_only_is_not_audited_and_changes_nothing() {
    let Some(f) = Fixture::new().await else { return };
    f.host.install(&f.adversary_requesting(None, &["inventory:write-services"]), &all(), "admin").await.unwrap();
    let method = |name: &str| f.state.methods.get(name).unwrap();
    assert!(method("adversary.peek").read_only && method("adversary.sneak").read_only, "declared in the input schema");
    assert!(!method("adversary.squat").read_only, "undeclared: a write, audited");
    let org = method("organizations.create").call(crate::api::Call::by(&f.admin), json!({ "name": "readers" })).await.unwrap();

    // the declaration holds: an import that would change something is refused while it runs
    let service = json!({ "service": { "organizationId": org["id"], "name": "sneaked", "image": "nginx:1" } });
    let refused = f.call("adversary", "sneak", service).await.unwrap_err();
    assert_eq!(refused.code, "read-only-method", "{refused}");
    let listed = method("services.list").call(crate::api::Call::by(&f.admin), json!({ "organizationId": org["id"] })).await.unwrap();
    assert_eq!(listed["items"], json!([]), "nothing was created");
    assert_eq!(f.call("adversary", "peek", json!({ "value": 7 })).await.unwrap(), json!({ "value": 7 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_serves_several_reads_of_one_caller_only_when_the_manifest_asks_for_it() {
    let Some(f) = Fixture::new().await else { return };
    let tally = |who: &Identity, body: Value| {
        let (host, who) = (f.host.clone(), who.clone());
        async move { host.dispatch("adversary", "tally", Some(&who), "req-t", body).await.map(|v| v["count"].as_u64().unwrap()) }
    };
    // the default: every call a fresh instance
    f.host.install(&f.adversary(), &all(), "admin").await.unwrap();
    for _ in 0..3 {
        assert_eq!(tally(&f.admin, json!({})).await.unwrap(), 1);
    }

    // reuse-instances = "reads": one caller's reads share an instance, nobody else's do
    let component = std::fs::read(built().unwrap().join("capstan_plugin_adversary.wasm")).unwrap();
    let text = manifest("tests/plugins/adversary", Some("0.2.0")) + "\n[limits]\nreuse-instances = \"reads\"\n";
    let mut bundle = Bundle::new(text, component).unwrap();
    bundle.sign(&f.key);
    f.host.upgrade(&bundle.to_bytes(), &all(), "admin").await.unwrap();
    let other = Identity { user_id: "u-other".into(), username: "other".into(), admin: false, ..f.admin.clone() };
    let same_user_fewer_roles = Identity { admin: false, ..f.admin.clone() };
    assert_eq!(tally(&f.admin, json!({})).await.unwrap(), 1);
    assert_eq!(tally(&f.admin, json!({})).await.unwrap(), 2, "the same caller's second read ran in the kept instance");
    assert_eq!(tally(&other, json!({})).await.unwrap(), 1, "another caller never gets it");
    assert_eq!(tally(&same_user_fewer_roles, json!({})).await.unwrap(), 1, "nor the same user with other roles");
    assert_eq!(tally(&f.admin, json!({})).await.unwrap(), 3);
    assert_eq!(tally(&other, json!({})).await.unwrap(), 2);

    // a write, an anonymous call: fresh instances, and the kept one is untouched
    let write = f.host.dispatch("adversary", "tallyWrite", Some(&f.admin), "req-w", json!({})).await.unwrap();
    assert_eq!(write["count"], 1);
    assert_eq!(tally(&f.admin, json!({})).await.unwrap(), 4);

    // printing ends the instance (stdio is captured per call); so does a trap
    assert_eq!(tally(&f.admin, json!({ "print": true })).await.unwrap(), 5);
    assert_eq!(tally(&f.admin, json!({})).await.unwrap(), 1, "the instance that printed was not kept");
    assert_eq!(tally(&f.admin, json!({})).await.unwrap(), 2);
    let trapped = tally(&f.admin, json!({ "trap": true })).await.unwrap_err();
    assert_eq!(trapped.code, "plugin-failed", "{trapped}");
    assert_eq!(tally(&f.admin, json!({})).await.unwrap(), 1, "the instance that trapped was not kept");

    // reads at once each take an instance; both are kept afterwards
    let (a, b) = tokio::join!(tally(&f.admin, json!({})), tally(&f.admin, json!({})));
    let mut counts = [a.unwrap(), b.unwrap()];
    counts.sort();
    assert!(counts == [1, 2] || counts == [2, 3], "{counts:?}");

    // an upgrade starts over: the kept instances went with the version they ran
    let component = std::fs::read(built().unwrap().join("capstan_plugin_adversary.wasm")).unwrap();
    let text = manifest("tests/plugins/adversary", Some("0.3.0")) + "\n[limits]\nreuse-instances = \"reads\"\n";
    let mut bundle = Bundle::new(text, component).unwrap();
    bundle.sign(&f.key);
    f.host.upgrade(&bundle.to_bytes(), &all(), "admin").await.unwrap();
    assert_eq!(tally(&f.admin, json!({})).await.unwrap(), 1);
}

/// Everything logged in this test process from the first call on (debug and above), for tests
/// that prove a value never reaches the log.
pub(super) fn captured_logs() -> Arc<std::sync::Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<std::sync::Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || LogSink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other test sets a global subscriber");
        logs
    })
    .clone()
}

/// A writer appending to the captured log.
struct LogSink(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_a_plugin_generates_rotates_and_reveals_never_reaches_the_log() {
    let logs = captured_logs();
    let Some(f) = Fixture::new().await else { return };
    f.host.install(&f.adversary_requesting(None, &["secrets:mail", "secrets-reveal:mail"]), &all(), "admin").await.unwrap();
    let create = |method: &str, body: Value| {
        let method = f.state.methods.get(method).unwrap_or_else(|| panic!("{method} is registered"));
        let call = crate::api::Call::by(&f.admin);
        async move { method.call(call, body).await.unwrap() }
    };
    let org = create("organizations.create", json!({ "name": "logged" })).await;
    let service = create("services.create", json!({ "organizationId": org["id"], "name": "web", "image": "nginx:1" })).await;
    let service_id = service["id"].as_str().unwrap().to_string();
    let scope = format!("mail:{service_id}");
    let op = |op: &str, id: Option<&str>| json!({ "op": op, "scope": scope, "serviceId": service_id, "key": "SMTP_PASSWORD", "id": id });
    let id = f.call("adversary", "secret", op("ensure", None)).await.unwrap()["id"].as_str().unwrap().to_string();
    let mut values = Vec::new();
    for _ in 0..2 {
        values.push(f.call("adversary", "secret", op("reveal", Some(&id))).await.unwrap()["value"].as_str().unwrap().to_string());
        f.call("adversary", "secret", op("rotate", Some(&id))).await.unwrap();
    }
    f.call("adversary", "secret", op("revoke", Some(&id))).await.unwrap();
    assert_eq!(f.call("adversary", "secret", op("reveal", Some(&id))).await.unwrap_err().code, "secret-revoked");

    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(text.contains("plugin call") && text.contains("adversary"), "the plugin's calls were logged, so the log was captured");
    for value in &values {
        assert!(!text.contains(value.as_str()), "a revealed value reached the log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_keeps_service_secrets_within_its_scopes_and_every_reveal_is_recorded() {
    let Some(f) = Fixture::new().await else { return };
    let bundle = f.adversary_requesting(None, &["secrets:mail", "secrets-reveal:mail", "secrets:audit"]);
    f.host.install(&bundle, &all(), "admin").await.unwrap();
    let admin_call = |method: &str, body: Value| {
        let method = f.state.methods.get(method).unwrap_or_else(|| panic!("{method} is registered"));
        let call = crate::api::Call::by(&f.admin);
        async move { method.call(call, body).await }
    };
    let org = admin_call("organizations.create", json!({ "name": "acme" })).await.unwrap();
    let service = admin_call("services.create", json!({ "organizationId": org["id"], "name": "web", "image": "nginx:1" })).await.unwrap();
    let service_id = service["id"].as_str().unwrap().to_string();
    let scope = format!("mail:{service_id}");
    let op = |op: &str, scope: &str, id: Option<&str>| json!({ "op": op, "scope": scope, "serviceId": service_id, "key": "SMTP_PASSWORD", "id": id });

    // ensure creates once, then answers the same secret
    let made = f.call("adversary", "secret", op("ensure", &scope, None)).await.unwrap();
    assert_eq!((made["scope"].as_str(), made["state"].as_str()), (Some(scope.as_str()), Some("active")), "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(f.call("adversary", "secret", op("ensure", &scope, None)).await.unwrap()["id"], id.as_str());
    // it resolves for the service exactly as an API-written secret does
    let manifest = admin_call("secrets.getManifest", json!({ "serviceId": service_id })).await.unwrap();
    assert_eq!(manifest["entries"]["production"]["SMTP_PASSWORD"]["secretId"], id.as_str(), "{manifest}");

    // reveal within the reveal grant; a rotation changes the value
    let first = f.call("adversary", "secret", op("reveal", &scope, Some(&id))).await.unwrap()["value"].as_str().unwrap().to_string();
    assert!(first.len() == 32 && first.chars().all(|c| c.is_ascii_hexdigit()), "generated as asked: 32 hex digits");
    let rotated = f.call("adversary", "secret", op("rotate", &scope, Some(&id))).await.unwrap();
    assert_ne!(rotated["version"], made["version"]);
    let second = f.call("adversary", "secret", op("reveal", &scope, Some(&id))).await.unwrap()["value"].as_str().unwrap().to_string();
    assert!(second != first && second.len() == 32, "a rotation generates a new value the same way");
    let listed = f.call("adversary", "secret", op("list", &scope, None)).await.unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");

    // read again: the same version for the same caller adds no record
    let third = f.call("adversary", "secret", op("reveal", &scope, Some(&id))).await.unwrap()["value"].as_str().unwrap().to_string();
    assert_eq!(third, second);

    // every reveal is on record for administrators: which secret, version, plugin, for whom
    let detail = admin_call("secrets.get", json!({ "id": id })).await.unwrap();
    let reveals = detail["reveals"].as_array().unwrap();
    assert_eq!(reveals.len(), 2, "{detail}");
    assert_eq!(reveals[0]["versionId"], rotated["version"], "newest first: {detail}");
    assert_eq!((reveals[0]["plugin"].as_str(), reveals[0]["actingFor"].as_str()), (Some("adversary"), Some("u-admin")), "{detail}");
    assert!(!detail.to_string().contains(&second), "no answer carries a value");

    // outside the grant: another scope, a reveal without its grant, a caller without access
    let denied = f.call("adversary", "secret", op("ensure", "backups", None)).await.unwrap_err();
    assert_eq!(
        (denied.code.as_ref(), denied.data.as_ref().unwrap()["capability"].as_str()),
        ("capability-denied", Some("secrets:backups"))
    );
    let audit = f.call("adversary", "secret", op("ensure", "audit", None)).await.unwrap_err();
    assert_eq!(audit.code, "management-scope-mismatch", "one secret per owner and key, managed from one scope: {audit}");
    let blind = f.call("adversary", "secret", op("reveal", "audit", Some(&id))).await.unwrap_err();
    assert_eq!(
        (blind.code.as_ref(), blind.data.as_ref().unwrap()["capability"].as_str()),
        ("capability-denied", Some("secrets-reveal:audit"))
    );
    let mismatch = f.call("adversary", "secret", op("rotate", "mail", Some(&id))).await.unwrap_err();
    assert_eq!(mismatch.code, "management-scope-mismatch", "{mismatch}");
    let stranger = Identity { user_id: "u-stranger".into(), username: "stranger".into(), admin: false, ..f.admin.clone() };
    let refused = f.host.dispatch("adversary", "secret", Some(&stranger), "req-s", op("reveal", &scope, Some(&id))).await.unwrap_err();
    assert_eq!(refused.code, "forbidden", "the caller's own access to the service counts: {refused}");
    let anonymous = f.host.dispatch("adversary", "secret", None, "req-a", op("list", &scope, None)).await.unwrap_err();
    assert_eq!(anonymous.code, "unauthenticated", "{anonymous}");

    // revoked: no value and no new secret under that key
    assert_eq!(f.call("adversary", "secret", op("revoke", &scope, Some(&id))).await.unwrap()["state"], "revoked");
    for op_name in ["reveal", "ensure"] {
        let refused = f.call("adversary", "secret", op(op_name, &scope, Some(&id))).await.unwrap_err();
        assert_eq!(refused.code, "secret-revoked", "{op_name}: {refused}");
        assert!(!refused.to_string().contains(&second), "no refusal carries a value");
    }

    // put (0.2.3): the plugin's own value; a revoked secret of its scope is active again with it
    let put = |scope: &str, value: &str| {
        let mut body = op("put", scope, None);
        body["value"] = json!(value);
        f.call("adversary", "secret", body)
    };
    let reinstated = put(&scope, "issued-by-a-gateway").await.unwrap();
    assert_eq!((reinstated["id"].as_str(), reinstated["state"].as_str()), (Some(id.as_str()), Some("active")), "{reinstated}");
    let read = f.call("adversary", "secret", op("reveal", &scope, Some(&id))).await.unwrap();
    assert_eq!(read["value"], "issued-by-a-gateway");
    let again = put(&scope, "issued-by-a-gateway").await.unwrap();
    assert_eq!(again["version"], reinstated["version"], "the same value writes nothing");
    let changed = put(&scope, "rotated-at-the-gateway").await.unwrap();
    assert_ne!(changed["version"], reinstated["version"], "another value is a new version");
    let detail = admin_call("secrets.get", json!({ "id": id })).await.unwrap();
    assert!(!detail.to_string().contains("rotated-at-the-gateway"), "no answer carries a put value: {detail}");
    assert_eq!(put("audit", "x").await.unwrap_err().code, "management-scope-mismatch");
    // revoked, the key passes to the next scope that puts it, and from there only back once
    // that one revoked it too
    assert_eq!(f.call("adversary", "secret", op("revoke", &scope, Some(&id))).await.unwrap()["state"], "revoked");
    let taken = put("audit", "from-the-next-manager").await.unwrap();
    assert_eq!(
        (taken["id"].as_str(), taken["scope"].as_str(), taken["state"].as_str()),
        (Some(id.as_str()), Some("audit"), Some("active")),
        "{taken}"
    );
    assert_eq!(put(&scope, "x").await.unwrap_err().code, "management-scope-mismatch", "active in audit now");
    assert_eq!(f.call("adversary", "secret", op("revoke", "audit", Some(&id))).await.unwrap()["state"], "revoked");
    let back = put(&scope, "rotated-at-the-gateway").await.unwrap();
    assert_eq!((back["scope"].as_str(), back["state"].as_str()), (Some(scope.as_str()), Some("active")), "{back}");
    let changed = back;
    let manifest = admin_call("secrets.getManifest", json!({ "serviceId": service_id })).await.unwrap();
    assert_eq!(manifest["entries"]["production"]["SMTP_PASSWORD"]["versionId"], changed["version"], "{manifest}");
    let fresh = {
        let mut body = op("put", &scope, None);
        (body["key"], body["value"]) = (json!("SMTP_HOST"), json!("smtp.acme.example"));
        f.call("adversary", "secret", body).await.unwrap()
    };
    assert_eq!((fresh["key"].as_str(), fresh["state"].as_str()), (Some("SMTP_HOST"), Some("active")), "a put creates: {fresh}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_is_upgraded_only_by_its_publisher_and_first_party_ids_stay_the_host_s() {
    let Some(f) = Fixture::new().await else { return };
    let component = std::fs::read(built().expect("built").join("capstan_plugin_example.wasm")).unwrap();
    let signed = |key: &ed25519_dalek::SigningKey, id: &str, version: &str| {
        let text = manifest("plugins/example", Some(version)).replacen("id = \"example\"", &format!("id = \"{id}\""), 1);
        let mut bundle = Bundle::new(text, component.clone()).unwrap().with_pages(example_pages()).unwrap();
        bundle.sign(key);
        bundle.to_bytes()
    };
    let other = generate_key();
    let other_text = PublisherKey::from_verifying_key(other.verifying_key()).to_string();
    f.host.add_trusted_publisher(&other_text, "Other", "admin").await.unwrap();

    // a first-party id (the embedded App Store's) is not another publisher's to take
    let squatted = f.host.install(&signed(&f.key, "appstore", "9.0.0"), &all(), "admin").await.unwrap_err();
    assert_eq!(squatted.code, "plugin-id-reserved", "{squatted}");

    // installed from one key, upgraded only by it — though the other key is trusted too
    f.host.install(&signed(&f.key, "example", "0.1.0"), &all(), "admin").await.unwrap();
    let taken = f.host.upgrade(&signed(&other, "example", "0.2.0"), &all(), "admin").await.unwrap_err();
    assert_eq!(taken.code, "publisher-mismatch", "{taken}");
    assert_eq!(f.host.record("example").await.unwrap().unwrap().0.current.version, "0.1.0", "nothing changed");

    // an administrator with a fresh login re-binds it, for the next upgrade
    let rebind = f.state.methods.get("plugins.rebindPublisher").unwrap();
    let stale = Identity { authenticated_at: 0, ..f.admin.clone() };
    let body = json!({ "id": "example", "publicKey": other_text });
    let refused = rebind.call(crate::api::Call::by(&stale), body.clone()).await.unwrap_err();
    assert_eq!(refused.code, "admin-not-fresh", "{refused}");
    let untrusted = PublisherKey::from_verifying_key(generate_key().verifying_key()).to_string();
    let refused = f.host.rebind_publisher("example", &untrusted, "admin").await.unwrap_err();
    assert_eq!(refused.code, "publisher-untrusted", "{refused}");
    let view = rebind.call(crate::api::Call::by(&f.admin), body).await.unwrap();
    assert_eq!(view["reboundPublisher"], other_text.as_str(), "{view}");
    let upgraded = f.host.upgrade(&signed(&other, "example", "0.2.0"), &all(), "admin").await.unwrap();
    assert_eq!((upgraded.current.publisher.as_str(), upgraded.rebound_publisher.as_deref()), (other_text.as_str(), None));
    // and now the first key is the stranger
    let back = f.host.upgrade(&signed(&f.key, "example", "0.3.0"), &all(), "admin").await.unwrap_err();
    assert_eq!(back.code, "publisher-mismatch", "{back}");
}

/// A loopback stand-in for the external gateway: `PUT /v1/routes/www.acme.example` answers
/// `200`, `/v1/routes/missing` `404 route-unknown`, `/v1/routes/revoked` `401`, anything else
/// `204`; every request as it arrived (head and body) is kept. Its origin.
async fn gateway_server(seen: Arc<std::sync::Mutex<Vec<String>>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = socket.read(&mut buf).await.unwrap_or(0);
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).to_string();
                    let complete = text.find("\r\n\r\n").is_some_and(|end| {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
                            .unwrap_or(0usize);
                        request.len() >= end + 4 + length
                    });
                    if complete || n == 0 {
                        break;
                    }
                }
                let text = String::from_utf8_lossy(&request).to_string();
                let line = text.lines().next().unwrap_or_default().to_string();
                seen.lock().unwrap().push(text);
                let (status, body) = if line.starts_with("PUT /v1/routes/www.acme.example ") {
                    ("200 OK", r#"{"name":"www.acme.example","target":"10.0.0.5:443"}"#)
                } else if line.contains(" /v1/routes/missing ") {
                    ("404 Not Found", r#"{"error":{"code":"route-unknown","message":"no such route"}}"#)
                } else if line.contains(" /v1/routes/revoked ") {
                    ("401 Unauthorized", r#"{"error":{"code":"unauthorized","message":"missing or wrong gateway token"}}"#)
                } else {
                    ("204 No Content", "")
                };
                let answer = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    origin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_gateway_requests_carry_capstans_credential_on_the_paths_of_its_scopes_only() {
    let Some(f) = Fixture::new().await else { return };
    let ask = |method: &str, path: &str, body: Option<Value>| json!({ "method": method, "path": path, "body": body });
    let put_route = || ask("PUT", "/v1/routes/www.acme.example", Some(json!({ "target": "10.0.0.5:443" })));

    // without a gateway grant: refused, naming the scope the request needs
    f.host.install(&f.adversary(), &all(), "admin").await.unwrap();
    let refused = f.call("adversary", "gateway", put_route()).await.unwrap_err();
    assert_eq!(refused.code, "capability-denied", "{refused}");
    assert_eq!(refused.data.as_deref().unwrap()["capability"], "gateway:routes:write");

    // granted routes:write; the host holds no credential yet
    let record = f.host.upgrade(&f.adversary_requesting(Some("0.2.0"), &["gateway:routes:write"]), &all(), "admin").await.unwrap();
    assert!(record.current.grants.contains(&"gateway:routes:write".to_string()), "{:?}", record.current.grants);
    let refused = f.call("adversary", "gateway", put_route()).await.unwrap_err();
    assert_eq!((refused.code.as_ref(), refused.http_status()), ("gateway-not-enrolled", 409), "{refused}");
    // another scope's path, the enrollment's own, a bad path, a write in a read: refused here
    let other = f.call("adversary", "gateway", ask("GET", "/v1/domains", None)).await.unwrap_err();
    assert_eq!(
        (other.code.as_ref(), other.data.as_deref().unwrap()["capability"].as_str()),
        ("capability-denied", Some("gateway:domains:read"))
    );
    let whoami = f.call("adversary", "gateway", ask("GET", "/v1/whoami", None)).await.unwrap_err();
    assert_eq!(whoami.code, "capability-denied");
    let dotted = f.call("adversary", "gateway", ask("GET", "/v1/routes/../whoami", None)).await.unwrap_err();
    assert_eq!((dotted.code.as_ref(), dotted.http_status()), ("gateway-path-invalid", 400));
    let read = f.call("adversary", "gatewayRead", put_route()).await.unwrap_err();
    assert_eq!(read.code, "read-only-method");

    // enrolled: the credential Capstan holds, at a gateway on loopback
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let origin = gateway_server(seen.clone()).await;
    let token = "gw-client-token-the-plugin-must-never-see";
    let secret = crate::secrets::managed::put(
        &f.state.gateway.secrets,
        &capstan_gateway::host_identity(),
        capstan_gateway::SCOPE,
        crate::secrets::managed::ManagedOwner::System(capstan_gateway::SYSTEM_ID.into()),
        capstan_gateway::TOKEN_KEY,
        zeroize::Zeroizing::new(token.as_bytes().to_vec()),
    )
    .await
    .unwrap();
    let running = json!({ "running": {
        "credentialId": "cred-1", "gatewayUrl": origin, "clientId": "capstan", "dnsRecordAddresses": [],
        "secretId": secret.id, "issuedAt": 1, "finalizedAt": 2,
    } });
    f.state
        .store
        .transact(|tx| {
            let running = running.clone();
            async move { tx.insert(capstan_gateway::ENROLLMENT, "current", running).await.map(drop) }
        })
        .await
        .unwrap();

    let put = f.call("adversary", "gateway", put_route()).await.unwrap();
    assert_eq!(put, json!({ "status": 200, "body": { "name": "www.acme.example", "target": "10.0.0.5:443" }, "ok": true, "code": null }));
    let request = seen.lock().unwrap()[0].clone();
    assert!(request.starts_with("PUT /v1/routes/www.acme.example HTTP/1.1\r\n"), "{request}");
    assert!(request.to_ascii_lowercase().contains(&format!("\r\nauthorization: bearer {token}\r\n").to_ascii_lowercase()), "{request}");
    assert!(request.ends_with(r#"{"target":"10.0.0.5:443"}"#), "{request}");
    // a 404 is an answer; no body is none
    let missing = f.call("adversary", "gateway", ask("GET", "/v1/routes/missing", None)).await.unwrap();
    assert_eq!(
        (missing["status"].as_u64(), missing["ok"].as_bool(), missing["code"].as_str()),
        (Some(404), Some(false), Some("route-unknown"))
    );
    let gone = f.call("adversary", "gateway", ask("DELETE", "/v1/routes/old.acme.example", None)).await.unwrap();
    assert_eq!(gone, json!({ "status": 204, "body": null, "ok": true, "code": null }));
    // the credential refused is a refusal, and names no token
    let revoked = f.call("adversary", "gateway", ask("GET", "/v1/routes/revoked", None)).await.unwrap_err();
    assert_eq!((revoked.code.as_ref(), revoked.http_status()), ("gateway-credential-refused", 502));
    for shown in [put.to_string(), missing.to_string(), gone.to_string(), revoked.to_string(), serde_json::to_string(&revoked).unwrap()] {
        assert!(!shown.contains(token), "{shown}");
    }
    assert_eq!(seen.lock().unwrap().len(), 4, "the refused requests never left");
}
