//! `plugins.*` API methods. (The bundle upload endpoint is the server's: it is HTTP.)
//!
//! A bundle travels once as raw bytes to `POST /api/v1/uploads/plugin-bundle` (administrators
//! only; see [`super::uploads`]), which answers an upload id and what the bundle requests;
//! `plugins.install` / `plugins.upgrade` then name the upload and the approved capabilities.

use super::bundle::{Bundle, Inspection};
use super::host::{LastError, PluginHost, Record, TrustedPublisher};
use super::uploads;
use crate::blobs::Blobs;
use crate::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

/// What the `plugins.*` methods reach: the plugin host, and the blobs where uploads wait.
#[derive(Clone)]
pub struct Context {
    /// The plugin host the methods act on.
    pub host: Arc<PluginHost>,
    /// Where uploaded bundles wait for `plugins.install` / `plugins.upgrade`.
    pub blobs: Blobs,
}

/// Input of the methods that take no parameters.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

/// Input of the methods that act on one plugin.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ById {
    /// The plugin id.
    pub id: String,
}

/// Input of `plugins.install` and `plugins.upgrade`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InstallInput {
    /// The upload id `POST /api/v1/uploads/plugin-bundle` answered.
    pub upload: String,
    /// Exactly the capabilities the manifest requests, or `["all-requested"]`.
    pub approve: Vec<String>,
}

/// Input of `plugins.uninstall`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UninstallInput {
    /// The plugin id.
    pub id: String,
    /// Also delete the plugin's documents, blobs, signing keys and stored bundles.
    #[serde(default)]
    pub purge: bool,
}

/// Input of `plugins.addTrustedPublisher`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AddPublisherInput {
    /// The key exactly as `capstan plugin keygen` prints it (`capstan-ed25519:…`).
    pub public_key: String,
    /// Who the key belongs to, for people reading the list.
    pub name: String,
}

/// Input of `plugins.removeTrustedPublisher`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RemovePublisherInput {
    /// The key to stop trusting (`capstan-ed25519:…`).
    pub public_key: String,
}

/// Input of `plugins.rebindPublisher`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RebindInput {
    /// The plugin's id.
    pub id: String,
    /// The trusted publisher key (`capstan-ed25519:…`) that may sign its next upgrade.
    pub public_key: String,
}

/// A plugin as the API shows it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginView {
    /// The plugin's id.
    pub id: String,
    /// The plugin's display name.
    pub name: String,
    /// `running`, `disabled` or `failed` (installed but not loaded here; see `lastError`).
    pub status: String,
    /// The installed version.
    pub version: String,
    /// The version `plugins.rollback` would go back to, if any.
    pub previous_version: Option<String>,
    /// The key that signed the installed bundle, or `first-party`.
    pub publisher: String,
    /// Another publisher key allowed to sign the next upgrade (`plugins.rebindPublisher`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebound_publisher: Option<String>,
    /// The capabilities the operator approved.
    pub grants: Vec<String>,
    /// The installed bundle's canonical digest, hex.
    pub digest: String,
    /// When the installed version was installed, in milliseconds since the epoch.
    pub installed_at: u64,
    /// The user who installed it.
    pub installed_by: String,
    /// Why the plugin last failed to load on this node, if it did.
    #[schemars(with = "Option<Value>")]
    pub last_error: Option<LastError>,
    /// The methods the plugin serves (`<id>.<method>`); empty unless it is loaded here.
    pub methods: Vec<String>,
    /// The contract the installed version targets (`capstan:plugin@0.2.4`).
    pub wit: String,
    /// The settings the installed version declares (`settings.update` sets `<id>.<key>`).
    pub settings: Vec<crate::faces::SettingDecl>,
    /// The dashboard pages the installed version contributes, under `/p/<id>/`.
    pub pages: Vec<crate::faces::PageDecl>,
}

/// How the API shows `record`, with its status and methods on this node.
pub fn view(host: &PluginHost, record: &Record) -> PluginView {
    let active = host.get(&record.id);
    let last_error = host.load_error(&record.id);
    let status = match (&active, record.enabled) {
        (_, false) => "disabled",
        (Some(_), true) => "running",
        (None, true) => "failed",
    };
    PluginView {
        id: record.id.clone(),
        name: record.name.clone(),
        status: status.into(),
        version: record.current.version.clone(),
        previous_version: record.previous.as_ref().map(|p| p.version.clone()),
        publisher: record.current.publisher.clone(),
        rebound_publisher: record.rebound_publisher.clone(),
        grants: record.current.grants.clone(),
        digest: record.current.digest.clone(),
        installed_at: record.current.installed_at,
        installed_by: record.current.installed_by.clone(),
        last_error,
        methods: active.map(|a| a.described.methods.keys().map(|m| format!("{}.{m}", record.id)).collect()).unwrap_or_default(),
        wit: record.current.wit.clone(),
        settings: record.current.settings.clone(),
        pages: record.current.pages.clone(),
    }
}

/// What `plugins.list` answers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PluginList {
    /// Every installed plugin.
    pub plugins: Vec<PluginView>,
}

/// One command of `plugins.listCommands`: what the plugin declares, with the method in full.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PluginCommand {
    /// The plugin that declares it.
    pub plugin: String,
    /// What it declares; its `method` is the full name (`backups.create`).
    #[serde(flatten)]
    pub command: crate::commands::CommandDecl,
}

/// What `plugins.listCommands` answers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct CommandList {
    /// The commands of every running plugin, by name.
    pub commands: Vec<PluginCommand>,
}

/// The commands the running plugins add to the CLI, by name.
pub fn commands(host: &PluginHost) -> CommandList {
    let mut commands: Vec<PluginCommand> = host
        .loaded()
        .iter()
        .flat_map(|active| {
            active.manifest.commands.iter().map(|declared| {
                let mut command = declared.clone();
                command.method = format!("{}.{}", active.manifest.id, declared.method);
                PluginCommand { plugin: active.manifest.id.clone(), command }
            })
        })
        .collect();
    commands.sort_by(|a, b| (&a.command.name, &a.plugin).cmp(&(&b.command.name, &b.plugin)));
    CommandList { commands }
}

/// What `plugins.listTrustedPublishers` answers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublisherList {
    /// Keys from CAPSTAN_TRUSTED_PUBLISHERS (removable only there).
    pub configured: Vec<String>,
    /// Keys added through `plugins.addTrustedPublisher`.
    #[schemars(with = "Vec<Value>")]
    pub added: Vec<TrustedPublisher>,
}

fn by(call: &Call) -> Result<String> {
    Ok(call.identity()?.username.clone())
}

enum Operation {
    Install,
    Upgrade,
}

/// Install or upgrade from an upload. The upload is dropped once it is installed or refused for
/// good; it stays for another try after `capabilities-not-approved` or a refusal worth
/// retrying (the dashboard shows the approval step again; `plugins.discardUpload` drops it).
async fn apply_upload(cx: &Context, call: &Call, input: &InstallInput, operation: Operation) -> Result<PluginView> {
    let host = &cx.host;
    let bytes = uploads::take(&cx.blobs, &input.upload).await?;
    let by = by(call)?;
    let outcome = match operation {
        Operation::Install => host.install(&bytes, &input.approve, &by).await,
        Operation::Upgrade => host.upgrade(&bytes, &input.approve, &by).await,
    };
    match &outcome {
        Err(refusal) if refusal.is("capabilities-not-approved") || refusal.retryable => {}
        _ => {
            let _ = uploads::forget(&cx.blobs, &input.upload).await;
        }
    }
    Ok(view(host, &outcome?))
}

/// What `plugins.inspectUpload` answers.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct UploadView {
    /// The upload id.
    pub upload: String,
    /// What the kept bundle is and requests.
    #[schemars(with = "Value")]
    pub bundle: Inspection,
}

/// The body of `plugins.inspectUpload` and `plugins.discardUpload`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ByUpload {
    /// The upload id `POST /api/v1/uploads/plugin-bundle` answered.
    pub upload: String,
}

/// What reading a bundle may refuse ([`Bundle::parse`], its manifest).
const BUNDLE_REFUSALS: &[&str] = &[
    "bundle-malformed",
    "bundle-too-large",
    "manifest-invalid",
    "plugin-id-invalid",
    "plugin-id-reserved",
    "capability-unknown",
    "wit-version-unsupported",
];

/// What verifying and preparing a bundle to run may refuse: its signature and trust, the
/// approval, compiling it, and its describe call.
const PREPARE_REFUSALS: &[&str] = &[
    "bundle-signature-invalid",
    "publisher-untrusted",
    "capabilities-not-approved",
    "wit-version-mismatch",
    "plugin-imports-unsupported",
    "plugin-descriptor-invalid",
    "plugin-failed",
    "plugin-deadline-exceeded",
    "plugin-resource-exhausted",
    "plugin-output-invalid",
    "plugin-busy",
];

/// What swapping an installed plugin's version (an upgrade, a rollback) may answer of its own.
const VERSION_SWAP_REFUSALS: &[&str] = &["deploy-frozen", "not-found", "invalid-collection", "conflict", "blobs-unavailable"];

/// Add the `plugins.*` methods to `registry`, all for administrators but `plugins.listCommands`.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "plugins.list",
            "Installed plugins with status, version, publisher and grants",
            Access::Admin,
            |cx: Context, _: Call, _: Empty| async move {
                let host = cx.host;
                let records = host.records().await?;
                Ok(PluginList { plugins: records.iter().map(|(r, _)| view(&host, r)).collect() })
            },
        )
        .read_only();
    registry
        .add(
            "plugins.listCommands",
            "The commands running plugins add to the capstan command line (name, arguments, method, columns)",
            Access::Authenticated,
            |cx: Context, _: Call, _: Empty| async move { Ok(commands(&cx.host)) },
        )
        .read_only();
    registry
        .add(
            "plugins.get",
            "One plugin: status, version, grants, last error",
            Access::Admin,
            |cx: Context, _: Call, input: ById| async move {
                let host = cx.host;
                let (record, _) = host.record(&input.id).await?.ok_or_else(|| Refusal::not_found(format!("plugin {:?}", input.id)))?;
                Ok(view(&host, &record))
            },
        )
        .refuses(&["not-found"])
        .read_only();
    registry
        .add(
            "plugins.inspectUpload",
            "What a kept upload is and requests, for the approval step",
            Access::Admin,
            |cx: Context, _: Call, input: ByUpload| async move {
                let bytes = uploads::take(&cx.blobs, &input.upload).await?;
                Ok(UploadView { bundle: Bundle::parse(&bytes)?.inspect(), upload: input.upload })
            },
        )
        .refuses(BUNDLE_REFUSALS)
        .refuses(&["upload-not-found", "blobs-unavailable"])
        .read_only();
    registry
        .add(
            "plugins.discardUpload",
            "Drop a kept upload that will not be installed",
            Access::Admin,
            |cx: Context, _: Call, input: ByUpload| async move {
                let discarded = uploads::forget(&cx.blobs, &input.upload).await?;
                Ok(json!({ "discarded": discarded }))
            },
        )
        .refuses(&["blobs-unavailable"]);
    registry
        .add(
            "plugins.install",
            "Install an uploaded bundle, approving exactly the capabilities it requests",
            Access::Admin,
            |cx: Context, call: Call, input: InstallInput| async move { apply_upload(&cx, &call, &input, Operation::Install).await },
        )
        .refuses(BUNDLE_REFUSALS)
        .refuses(PREPARE_REFUSALS)
        .refuses(&["upload-not-found", "deploy-frozen", "plugin-exists", "invalid-collection", "blobs-unavailable"])
        .passes_on("the plugin it runs (its migration, its describe call)");
    registry
        .add(
            "plugins.upgrade",
            "Upgrade to a higher version from an uploaded bundle: migrate, then swap without failing a call",
            Access::Admin,
            |cx: Context, call: Call, input: InstallInput| async move { apply_upload(&cx, &call, &input, Operation::Upgrade).await },
        )
        .refuses(BUNDLE_REFUSALS)
        .refuses(PREPARE_REFUSALS)
        .refuses(VERSION_SWAP_REFUSALS)
        .refuses(&["upload-not-found", "publisher-mismatch", "version-not-newer"])
        .passes_on("the plugin it runs (its migration, its describe call)");
    registry
        .add(
            "plugins.rollback",
            "Go back to the version before the last upgrade",
            Access::Admin,
            |cx: Context, call: Call, input: ById| async move {
                let host = cx.host;
                let record = host.rollback(&input.id, &by(&call)?).await?;
                Ok(view(&host, &record))
            },
        )
        .refuses(BUNDLE_REFUSALS)
        .refuses(PREPARE_REFUSALS)
        .refuses(VERSION_SWAP_REFUSALS)
        .refuses(&["rollback-unavailable", "bundle-missing", "bundle-mismatch"])
        .passes_on("the plugin it runs (its migration, its describe call)");
    registry
        .add(
            "plugins.disable",
            "Stop serving a plugin (its data stays)",
            Access::Admin,
            |cx: Context, call: Call, input: ById| async move {
                let host = cx.host;
                let record = host.set_enabled(&input.id, false, &by(&call)?).await?;
                Ok(view(&host, &record))
            },
        )
        .refuses(&["not-found", "conflict"]);
    registry
        .add(
            "plugins.rebindPublisher",
            "Let another trusted publisher key sign a plugin's next upgrade (needs a fresh administrator login)",
            Access::Admin,
            |cx: Context, call: Call, input: RebindInput| async move {
                let host = cx.host;
                call.identity()?.require_fresh()?;
                let record = host.rebind_publisher(&input.id, &input.public_key, &by(&call)?).await?;
                Ok(view(&host, &record))
            },
        )
        .refuses(&["admin-not-fresh", "publisher-key-invalid", "publisher-untrusted", "not-found", "conflict"]);
    registry
        .add("plugins.enable", "Serve a disabled plugin again", Access::Admin, |cx: Context, call: Call, input: ById| async move {
            let host = cx.host;
            let record = host.set_enabled(&input.id, true, &by(&call)?).await?;
            Ok(view(&host, &record))
        })
        .refuses(&["not-found", "conflict", "invalid-collection"]);
    registry
        .add(
            "plugins.uninstall",
            "Remove a plugin; its data stays unless purge is true",
            Access::Admin,
            |cx: Context, call: Call, input: UninstallInput| async move {
                let host = cx.host;
                host.uninstall(&input.id, input.purge, &by(&call)?).await
            },
        )
        .refuses(&["not-found", "plugin-first-party"]);
    registry
        .add(
            "plugins.listTrustedPublishers",
            "Publisher keys bundles may be signed by",
            Access::Admin,
            |cx: Context, _: Call, _: Empty| async move {
                let host = cx.host;
                Ok(PublisherList {
                    configured: host.configured_publishers().iter().map(ToString::to_string).collect(),
                    added: host.trusted_publishers().await?,
                })
            },
        )
        .read_only();
    registry
        .add(
            "plugins.addTrustedPublisher",
            "Trust a publisher key (needs a fresh administrator login)",
            Access::Admin,
            |cx: Context, call: Call, input: AddPublisherInput| async move {
                let host = cx.host;
                let identity = call.identity()?;
                identity.require_fresh()?;
                let added = host.add_trusted_publisher(&input.public_key, &input.name, &identity.username).await?;
                serde_json::to_value(added).map_err(Refusal::internal)
            },
        )
        .refuses(&["admin-not-fresh", "publisher-key-invalid", "publisher-exists"]);
    registry
        .add(
            "plugins.removeTrustedPublisher",
            "Stop trusting a publisher key (needs a fresh administrator login)",
            Access::Admin,
            |cx: Context, call: Call, input: RemovePublisherInput| async move {
                let host = cx.host;
                call.identity()?.require_fresh()?;
                let removed = host.remove_trusted_publisher(&input.public_key).await?;
                Ok(json!({ "removed": removed }))
            },
        )
        .refuses(&["admin-not-fresh", "publisher-key-invalid", "publisher-configured"]);
}
