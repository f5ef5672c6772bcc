//! `capstan serve --dev --demo`: demo data for a newcomer — an organization, a cluster and a
//! service, then each plugin's own demo (`<pluginId>.installDemo`, `{organizationId, clusterId?}`
//! — the cluster when this host runs a node in it) once the
//! first-party plugins are loaded: the App Store's is a catalog of real self-hosted apps signed
//! by a key of this host and trusted only here, with a few apps installed from it.
//!
//! Everything goes through the registered methods, as an administrator named `demo-installer`,
//! and is idempotent: what a name already holds (`exists`) is left as it is, so a second start
//! adds nothing. Never run without the flag; `--demo` without `--dev` is refused at start.
//!
//! Where a container engine answers on this machine, the host also runs a node of its own in
//! the demo's cluster ([`node`]) and the App Store's demo starts one app on it.

pub mod node;

use crate::plugins::host::PluginHost;
use capstan_core::Refusal;
use capstan_rpc::{Identity, Invocation, Registry};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// The demo's organization, cluster and plain service.
pub const ORGANIZATION: &str = "demo";
const CLUSTER: &str = "demo-cluster";
const SERVICE: (&str, &str) = ("website", "docker.io/library/nginx:1.27");
/// How long the demo waits for the first-party plugins (compiling them on a busy machine).
const PLUGINS_WAIT: Duration = Duration::from_secs(600);

fn installer() -> Identity {
    let now = capstan_core::clock::now_ms();
    Identity {
        user_id: "host:demo-installer".into(),
        username: "demo-installer".into(),
        kind: "human".into(),
        admin: true,
        session_id: String::new(),
        authenticated_at: now,
        expires_at: now + capstan_core::clock::millis(PLUGINS_WAIT) + 600_000,
    }
}

/// Call `method` as the installer through the API's one door (audited as any caller's write).
async fn call(methods: &Registry, method: &str, body: Value) -> Result<Value, Refusal> {
    methods.invoke(Invocation::verified(method, &installer(), None, body)).await?.into_value()
}

/// `method` once: created now (`Some`), or there already (`None`, refused `exists`).
async fn ensure(methods: &Registry, method: &str, body: Value) -> Result<Option<Value>, Refusal> {
    match call(methods, method, body).await {
        Ok(answer) => Ok(Some(answer)),
        Err(e) if e.code == "exists" => Ok(None),
        Err(e) => Err(e),
    }
}

/// The id of the `kind` (`organizations`, `clusters`) named `name`: created now with `body` (its id
/// at `created_id`, a JSON pointer, in the answer), or found by name when it is there already.
async fn ensure_named(methods: &Registry, kind: &str, name: &str, body: Value, created_id: &str) -> Result<String, Refusal> {
    if let Some(created) = ensure(methods, &format!("{kind}.create"), body).await? {
        return Ok(created.pointer(created_id).and_then(Value::as_str).unwrap_or_default().to_string());
    }
    let listed = call(methods, &format!("{kind}.list"), json!({ "limit": 100 })).await?;
    listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["name"] == name)
        .and_then(|o| o["id"].as_str())
        .map(String::from)
        .ok_or_else(|| Refusal::new("demo-failed", format!("the demo's {name} exists but is not listed")))
}

/// What the demo's own node needs: the data directory, the agent binary, the engine named (if
/// any) and Capstan's origin.
pub struct NodeSetup {
    /// The dev data directory (the node keeps its files under it).
    pub data_dir: std::path::PathBuf,
    /// The `capstan-agent` beside this executable (or `CAPSTAN_AGENT_BINARY`).
    pub agent_binary: Option<std::path::PathBuf>,
    /// The engine `--engine` named; `None`: looked for.
    pub engine: Option<String>,
    /// Capstan's origin, which the agent enrolls with.
    pub origin: String,
}

/// Install the demo data through `methods` (each plugin's once `plugins` has loaded the
/// first-party ones); each step logged, a failure logged and left for the next start.
pub async fn install(methods: Arc<Registry>, plugins: Arc<PluginHost>, setup: NodeSetup) {
    if let Err(e) = run(&methods, &plugins, setup).await {
        tracing::warn!(refusal = %e, "the demo data was not installed in full; the next start with --demo tries again");
    }
}

/// Run this machine's node in the demo's cluster, enrolling it the first time; whether it runs
/// (why not is logged in plain words).
async fn start_node(methods: &Registry, setup: &NodeSetup, cluster_id: &str) -> bool {
    let found = node::find(&setup.data_dir, setup.agent_binary.as_deref(), setup.engine.as_deref(), &setup.origin).await;
    let node = match found {
        Ok(node) => node,
        Err(why) => {
            tracing::info!("the demo runs no node of its own: {why}");
            return false;
        }
    };
    let started = async {
        if !node.enrolled() {
            let jump = call(methods, "nodes.createJumpCommand", json!({ "clusterId": cluster_id, "ttlMinutes": 5 })).await?;
            node.enroll(jump["code"].as_str().unwrap_or_default()).await?;
        }
        node.run()
    };
    match started.await {
        Ok(mut child) => {
            tracing::info!(engine = %node.engine, hostname = node::HOSTNAME, "the demo's node runs on this machine in {CLUSTER}");
            // held until the host stops (the agent is killed with it)
            tokio::spawn(async move {
                match child.wait().await {
                    Ok(status) => tracing::warn!(%status, "the demo's node agent stopped (its log: demo-node/agent.log in the data dir)"),
                    Err(e) => tracing::warn!(error = %e, "the demo's node agent cannot be followed"),
                }
            });
            true
        }
        Err(e) => {
            tracing::warn!(refusal = %e, "the demo's node did not start");
            false
        }
    }
}

async fn run(methods: &Registry, plugins: &PluginHost, setup: NodeSetup) -> Result<(), Refusal> {
    let organization_id = ensure_named(methods, "organizations", ORGANIZATION, json!({ "name": ORGANIZATION }), "/id").await?;
    // the cluster's machine token is shown once to its creator: the demo has no use for it
    let cluster = json!({ "name": CLUSTER, "description": "The demo's cluster." });
    let cluster_id = ensure_named(methods, "clusters", CLUSTER, cluster, "/cluster/id").await?;
    let node = start_node(methods, &setup, &cluster_id).await;
    ensure(
        methods,
        "services.create",
        json!({ "name": SERVICE.0, "organizationId": organization_id, "image": SERVICE.1, "ports": [{ "port": 80, "protocol": "http" }] }),
    )
    .await?;
    tracing::info!(organization = %organization_id, "demo organization, cluster and service in place");
    // each plugin's own demo, once the first-party plugins (installed in the background) serve
    let expected: Vec<(String, String)> =
        crate::plugins::first_party::bundles()?.into_iter().map(|b| (b.manifest.id.clone(), b.manifest.version.to_string())).collect();
    let deadline = tokio::time::Instant::now() + PLUGINS_WAIT;
    loop {
        let loaded = plugins.loaded();
        let ready =
            expected.iter().all(|(id, version)| loaded.iter().any(|a| a.manifest.id == *id && a.manifest.version.to_string() == *version));
        if ready {
            let mut body = json!({ "organizationId": organization_id });
            if node {
                body["clusterId"] = json!(cluster_id);
            }
            // what each plugin's demo started on the node (its answer's `started`), for the log
            let mut started: Vec<String> = Vec::new();
            for active in loaded.iter().filter(|a| a.methods.contains_key("installDemo")) {
                let method = format!("{}.installDemo", active.manifest.id);
                match call(methods, &method, body.clone()).await {
                    Ok(answer) => {
                        started.extend(answer["started"].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(String::from)));
                        tracing::info!(%method, answer = %answer, "demo installed")
                    }
                    Err(e) => tracing::warn!(%method, refusal = %e, "a plugin's demo was not installed"),
                }
            }
            match (node, started.is_empty()) {
                (true, false) => tracing::info!(
                    "the demo's {} start on this machine's node once their images are pulled: `capstan services status <name>` follows each",
                    started.join(", ")
                ),
                (true, true) => tracing::info!("the demo's node runs in {CLUSTER}: what the demo started there before runs again"),
                (false, _) => tracing::info!(
                    "the demo's services are in place, none started: no node runs in {CLUSTER} (a machine joins it with a jump command)"
                ),
            }
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Refusal::new("demo-failed", "the first-party plugins did not load in time for their demo"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
