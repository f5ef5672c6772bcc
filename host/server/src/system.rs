//! Methods about the host itself: readiness, version, migration state.
//! Readiness is derived on every read from the store, the blobs and the ledger. Anyone may ask;
//! where the store and the blobs are (paths, hosts) is told to administrators only.

use crate::auth::Identity;
use crate::blobs::Blobs;
use crate::migrate::{self, Chain};
use crate::plugins::host::{PluginHost, Readiness};
use crate::refusal::{Refusal, Result};
use crate::store::Store;
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The readiness report of `GET /status` and `system.getStatus`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// True when the store and blobs answer and the host's migrations are done.
    pub ready: bool,
    /// The Capstan version this server runs.
    pub version: String,
    /// Whether the document store answers a ping.
    pub store: Component,
    /// Whether the object storage answers a one-object listing.
    pub blobs: Component,
    /// The host's migration chain, as its ledger states it.
    pub migrations: MigrationState,
    /// How far this node is with loading its plugins (not part of `ready`: the host serves its
    /// own methods meanwhile, and a plugin's answer `plugin-not-loaded`, retryable); absent when
    /// the plugin registry cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugins: Option<Readiness>,
}

/// One storage backend's health in a status report.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Component {
    /// True when the backend answered its probe.
    pub ok: bool,
    /// The backend's short description, e.g. `sqlite:<path>` (never credentials); told to
    /// administrators only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The refusal code when not ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A migration chain's state: where its data is, where this build takes it, and what ran.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationState {
    /// The chain's name (`capstan` for the host's own).
    pub chain: String,
    /// The version the ledger states; absent when it cannot be read.
    pub data_version: Option<String>,
    /// The data version this build migrates to.
    pub target: String,
    /// The oldest data version this build can migrate from.
    pub oldest_supported: String,
    /// True when the data is at the target and no step is left unfinished.
    pub done: bool,
    /// A step an interrupted start left unfinished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
    /// The steps that finished, oldest first (empty when the ledger cannot be read).
    pub history: Vec<HistoryEntry>,
    /// Why the ledger could not be read (a refusal code), when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One finished migration step in a chain's history.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// The step's name, as recorded in the ledger.
    pub step: String,
    /// The data version the step started from.
    pub from: String,
    /// The data version the step left the data at.
    pub to: String,
    /// Milliseconds since the Unix epoch.
    pub finished_at: u64,
}

fn component(result: Result<()>, backend: String, details: bool) -> Component {
    let (ok, error) = match result {
        Ok(()) => (true, None),
        Err(e) => {
            tracing::warn!(code = %e.code, detail = e.detail.as_deref().unwrap_or(""), "{backend} is not answering");
            (false, Some(e.code.to_string()))
        }
    };
    Component { ok, backend: details.then_some(backend), error }
}

/// What the system methods and `/status` read: the store, the blobs and the host's chain.
#[derive(Clone)]
pub struct System {
    /// The document store, pinged and read for the migration ledger.
    pub store: Store,
    /// The object storage, probed with a one-object listing.
    pub blobs: Blobs,
    /// The host's migration chain, whose target the ledger is compared with.
    pub chain: Arc<Chain>,
    /// The plugin host, asked how far its plugins are loaded.
    pub plugins: Arc<PluginHost>,
    /// Whether this host runs in development mode (`serve --dev`).
    pub dev: bool,
}

/// Whether a caller is told where the store and the blobs are: administrators only.
pub fn sees_details(identity: Option<&Identity>) -> bool {
    identity.is_some_and(Identity::is_human_admin)
}

/// Probe the store and the blobs, read the migration ledger and the plugins' readiness, on
/// every call; with `details`, say where the store and the blobs are.
pub async fn status_report(state: &System, details: bool) -> StatusReport {
    let store = component(state.store.ping().await, state.store.describe(), details);
    let blobs = component(state.blobs.list("", None, 1).await.map(|_| ()), state.blobs.describe(), details);
    let migrations = migration_state(state).await;
    let plugins = match state.plugins.readiness().await {
        Ok(readiness) => Some(readiness),
        Err(e) => {
            tracing::warn!(code = %e.code, "plugin readiness not read: {}", e.message);
            None
        }
    };
    let ready = store.ok && blobs.ok && migrations.done;
    StatusReport { ready, version: env!("CARGO_PKG_VERSION").into(), store, blobs, migrations, plugins }
}

async fn migration_state(state: &System) -> MigrationState {
    let chain = &state.chain;
    let (ledger, error) = match migrate::read_ledger(&state.store, &chain.name).await {
        Ok(ledger) => (ledger.map(|(l, _)| l), None),
        Err(e) => {
            tracing::warn!(code = %e.code, detail = e.detail.as_deref().unwrap_or(""), "the migration ledger cannot be read");
            (None, Some(e.code.to_string()))
        }
    };
    let target = chain.target().to_string();
    MigrationState {
        chain: chain.name.clone(),
        done: ledger.as_ref().is_some_and(|l| l.data_version == target && l.running.is_none()),
        data_version: ledger.as_ref().map(|l| l.data_version.clone()),
        target,
        oldest_supported: chain.oldest_supported.to_string(),
        running: ledger.as_ref().and_then(|l| l.running.clone()),
        history: ledger
            .map(|l| {
                l.history.into_iter().map(|h| HistoryEntry { step: h.step, from: h.from, to: h.to, finished_at: h.finished_at }).collect()
            })
            .unwrap_or_default(),
        error,
    }
}

/// No parameters.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// The parameters of `migrations.getStatus`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigrationsQuery {
    /// The chain to report; the host's own chain (`capstan`) when absent.
    pub chain: Option<String>,
}

/// The answer of `system.getVersion`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionReport {
    /// The Capstan version this server runs.
    pub version: String,
    /// The data version this build migrates to.
    pub data_version_target: String,
    /// Whether this host runs in development mode (`serve --dev`): what `capstan plugin dev`
    /// asks before it trusts a key or installs anything. Told to administrators only; absent for
    /// anyone else.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev: Option<bool>,
}

/// Register the public methods `system.getStatus`, `system.getVersion` and `migrations.getStatus`.
pub fn register(registry: &mut Registry, system: System) {
    let mut registry = registry.with(system);
    registry
        .add(
            "system.getStatus",
            "Readiness of the store, the blobs, the migrations and the plugins (same as GET /status; backends for administrators)",
            Access::Public,
            |system: System, call: Call, _: Empty| async move { Ok(status_report(&system, sees_details(call.identity.as_ref())).await) },
        )
        .read_only();
    registry
        .add(
            "system.getVersion",
            "The Capstan version and the data version it migrates to (and, for administrators, whether the host runs with serve --dev)",
            Access::Public,
            |system: System, call: Call, _: Empty| async move {
                Ok(VersionReport {
                    version: env!("CARGO_PKG_VERSION").into(),
                    data_version_target: system.chain.target().to_string(),
                    dev: sees_details(call.identity.as_ref()).then_some(system.dev),
                })
            },
        )
        .read_only();
    registry
        .add(
            "migrations.getStatus",
            "A migration chain's ledger: data version, target, floor, history (public, like GET /status)",
            Access::Public,
            |system: System, _: Call, q: MigrationsQuery| async move {
                match q.chain.as_deref() {
                    None | Some("capstan") => Ok(migration_state(&system).await),
                    Some(other) => Err(Refusal::not_found(format!("migration chain {:?}", other.chars().take(100).collect::<String>()))),
                }
            },
        )
        .refuses(&["not-found"])
        .read_only();
}
