//! The App Store manager: apps from a signed catalog (`capstan-catalog`), installed and
//! upgraded as services through the inventory.
//!
//! - **Never a startup blocker.** Loading only schedules work: the reconcile loop asks the
//!   sources (settings `appstore.catalogSources`, then the npm registries of
//!   `appstore.catalogRegistries` holding the package `appstore.catalogPackage`) when a pass is due — every 15 minutes, and after
//!   a failure with a backoff from 1 to 30 minutes. The catalog takes no part in readiness.
//! - **Verified before use, last-known-good in the store** (`active`): a candidate activates
//!   only with a trusted signature (setting `appstore.trustedCatalogKeys`), its digest, the
//!   supported contract and a greater revision, every published version kept as it was.
//! - **Superseded catalogs do not pile up**: with each loader pass, stored chunks no pointer
//!   names are deleted once they are an hour old (`active::collect_garbage`).
//! - While no verified catalog is active, exactly `getAppConfig`, `listUpgradeable`,
//!   `install`, `getUpgradePreview`, `upgrade` and `startServiceUpgrade` are refused
//!   `appstore-catalog-unavailable` (retryable) with the cause; `listApps` answers an empty list
//!   with the status, and a service's upgrade status is `unknown` with that cause as its blocker.

mod active;
mod apps;
mod demo;
mod loader;
mod needs;
mod npm;
mod rollouts;
mod settings;

use capstan_sdk::{Context, Descriptor, Empty, JsonSchema, Manager, Page, ReconcileOutcome, ReconcileTrigger, Result, Role};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A reconcile pass that had to put a snapshot adoption off asks for the next pass this soon.
const ADOPTION_RETRY: Duration = Duration::from_secs(5);

struct AppStore;

impl Manager for AppStore {
    fn describe() -> Descriptor {
        Descriptor::new()
            .method(
                "getCatalogStatus",
                "The active catalog (revision, digest, signer), the loader's last outcome and schedule.",
                Role::Authenticated,
                status,
            )
            .read_only()
            .method("refreshCatalog", "Ask the catalog sources now, in order; answers the status.", Role::Admin, refresh)
            .method("importCatalog", "Activate an operator-carried signed catalog envelope (for an offline host).", Role::Admin, import)
            .method(
                "listApps",
                "Apps and their offered versions; empty, with the status, while no catalog is active.",
                Role::Authenticated,
                apps::list_apps,
            )
            .read_only()
            .method(
                "getAppConfig",
                "One app version: its template, notes and whether it is withdrawn.",
                Role::Authenticated,
                apps::get_app_config,
            )
            .read_only()
            .method(
                "install",
                "Create a service in an organization from an app version's template, and start it on a cluster when one is named.",
                Role::Owner,
                apps::install,
            )
            .method(
                "listUpgradeable",
                "An organization's services from the App Store with a newer version offered.",
                Role::Member,
                apps::list_upgradeable,
            )
            .read_only()
            .method("getUpgradePreview", "What upgrading a service to a version changes.", Role::Member, apps::upgrade_preview)
            .read_only()
            .method(
                "upgrade",
                "Upgrade a service to a newer version of its app, stating the service revision read.",
                Role::Owner,
                apps::upgrade,
            )
            .method(
                "startServiceUpgrade",
                "Start a hosted app's upgrade (the newest offered version unless one is named), stating the service revision read; answers its upgrade status.",
                Role::Owner,
                apps::start_service_upgrade,
            )
            .method(
                "getServiceUpgradeStatus",
                "A hosted app's upgrade status: up-to-date, available, blocked (with the blockers) or unknown while no catalog is active; with its last upgrade's rollout while it runs that upgrade's image.",
                Role::Member,
                apps::service_upgrade_status,
            )
            .read_only()
            .method(
                "rollbackUpgrade",
                "Roll a hosted app back to the release its last upgrade replaced, stating the service revision read; the runtime rolls it out.",
                Role::Owner,
                rollouts::rollback,
            )
            .method(
                "installDemo",
                "Install the demo catalog (real self-hosted apps) signed by this host's own demo key, trusted here only; serve --dev --demo calls it.",
                Role::Admin,
                demo::install,
            )
            .setting::<settings::CatalogSources>(
                settings::SOURCES,
                "Where the App Store asks for signed catalogs, in order (https, or http to a loopback address)",
                Some(settings::CatalogSources::default()),
            )
            .setting::<settings::CatalogRegistries>(
                settings::REGISTRIES,
                "npm registries asked for the catalog package after the sources, in order (https, or http to a loopback address)",
                Some(settings::CatalogRegistries::default()),
            )
            .setting::<settings::CatalogPackage>(
                settings::PACKAGE,
                "The npm package holding the signed catalog (catalog.json at its top): name, or name@version / name@tag to pin it",
                Some(settings::CatalogPackage::default()),
            )
            .setting::<settings::TrustedCatalogKeys>(
                settings::TRUSTED_KEYS,
                "Catalog signing keys the App Store trusts besides the ones it ships with",
                Some(settings::TrustedCatalogKeys::default()),
            )
            // the dashboard's App Store: the bundle's pages/*.html render what these answer
            .nav("App Store", "box")
            .page(Page::new("", "App Store", "listApps").template("store").form("refreshCatalog").form("importCatalog"))
            .page(Page::new("upgrades", "App upgrades", "listUpgradeable").template("upgrades"))
            .page(Page::new("app", "App {name}", "getAppConfig").template("app").form("install").hidden())
            .page(Page::new("upgrade", "Upgrade {serviceName}", "getUpgradePreview").template("upgrade").form("upgrade").hidden())
            .page(Page::new("rollout", "Upgrade of {serviceName}", "getServiceUpgradeStatus").template("rollout").form("rollbackUpgrade").hidden())
            .collection(active::CATALOG)
            .collection(active::CHUNKS)
            .collection(loader::LOADER)
            .collection(demo::DEMO)
            .collection(rollouts::UPGRADES)
            .collection(needs::AWAITING)
            .reconcile_every(Duration::from_secs(60))
    }

    /// Ask the sources when a pass is due, and delete the stored catalog chunks no pointer
    /// names any more; then give every service the snapshot of its version.
    fn reconcile(_ctx: &Context, _trigger: ReconcileTrigger) -> Result<ReconcileOutcome> {
        let mut summary = Vec::new();
        if loader::due()? {
            let state = loader::pass()?;
            summary.push(format!("catalog sources: {}", state.last_outcome.unwrap_or_default()));
            // housekeeping: a failure here is logged and tried again at the next pass
            match active::collect_garbage() {
                Ok(done) if done.deleted > 0 || done.stamped > 0 => {
                    summary.push(format!("catalog chunks: {} deleted, {} stamped", done.deleted, done.stamped))
                }
                Ok(_) => {}
                Err(e) => capstan_sdk::warn!("cleaning up catalog chunks failed: {} ({})", e.message(), e.code()),
            }
        }
        // apps whose databases and buckets are ready start
        match needs::release_ready() {
            Ok(0) => {}
            Ok(released) => summary.push(format!("{released} apps' bindings ready")),
            Err(e) => capstan_sdk::warn!("releasing apps waiting for their bindings failed: {} ({})", e.message(), e.code()),
        }
        let mut deferred = 0;
        if let Ok((catalog, _)) = active::current()? {
            let done = apps::adopt_snapshots(&catalog)?;
            summary.push(format!("{} snapshots adopted", done.adopted));
            deferred = done.deferred;
        }
        if deferred > 0 {
            // an adoption a refusal put off is tried again soon, not at the next period
            summary.push(format!("{deferred} put off"));
            return Ok(ReconcileOutcome::done(summary.join("; ")).requeue_after(ADOPTION_RETRY));
        }
        Ok(ReconcileOutcome::done(summary.join("; ")))
    }

    fn migrate(_ctx: &Context, _from: Option<&str>, _to: &str) -> Result<()> {
        Ok(())
    }
}

capstan_sdk::manager!(AppStore);

/// The active catalog as the status names it.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveView {
    /// The catalog's revision.
    pub revision: u64,
    /// The catalog payload's SHA-256, lowercase hex.
    pub digest: String,
    /// The key that signed it, `capstan-ed25519:…`.
    pub signer: String,
    /// How many apps the catalog holds.
    pub apps: usize,
    /// When it was activated, in milliseconds since the Unix epoch.
    pub activated_at: u64,
    /// A source URL, `<registry> <package>@<version>` for an npm registry, or `import`.
    pub source: String,
}

/// What `getCatalogStatus` answers: the active catalog or why there is none, the sources and
/// the loader's schedule.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Whether a verified catalog is active.
    pub available: bool,
    /// The active catalog, when there is one.
    pub active: Option<ActiveView>,
    /// Why no catalog is active (`code`, `message`), when none is.
    #[schemars(with = "Option<capstan_sdk::Value>")]
    pub unavailable: Option<active::Unavailable>,
    /// The catalog source URLs (setting `appstore.catalogSources`), in the order they are asked.
    pub sources: Vec<String>,
    /// The npm registries asked after the sources (setting `appstore.catalogRegistries`).
    pub registries: Vec<String>,
    /// The npm package asked for there (setting `appstore.catalogPackage`).
    pub package: String,
    /// The loader's last attempt, outcome, errors and next due time (`loader/state`).
    #[schemars(with = "capstan_sdk::Value")]
    pub loader: loader::State,
}

/// The status as it is now (the active catalog verified again).
pub fn current_status() -> Result<Status> {
    let (active, unavailable) = match active::current()? {
        Ok((catalog, pointer)) => (
            Some(ActiveView {
                revision: catalog.revision(),
                digest: catalog.digest_hex().to_string(),
                signer: catalog.signer().to_string(),
                apps: catalog.apps().len(),
                activated_at: pointer.activated_at,
                source: pointer.source,
            }),
            None,
        ),
        Err(why) => (None, Some(why)),
    };
    let settings = settings::get()?;
    Ok(Status {
        available: active.is_some(),
        active,
        unavailable,
        sources: settings.catalog_sources.0,
        registries: settings.catalog_registries.0,
        package: settings.catalog_package.0,
        loader: loader::state()?,
    })
}

fn status(_ctx: &Context, _: Empty) -> Result<Status> {
    current_status()
}

fn refresh(_ctx: &Context, _: Empty) -> Result<Status> {
    loader::pass()?;
    if let Ok((catalog, _)) = active::current()? {
        apps::adopt_snapshots(&catalog)?;
    }
    current_status()
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Import {
    /// The signed catalog envelope, as text (what `capstan-catalog sign` writes).
    envelope: String,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Imported {
    /// `activated`, `unchanged` (it is the active catalog) or `superseded` (a greater revision
    /// is active already).
    #[schemars(with = "String")]
    outcome: active::Outcome,
    revision: u64,
    status: Status,
}

fn import(_ctx: &Context, input: Import) -> Result<Imported> {
    let (outcome, catalog) = active::activate(input.envelope.as_bytes(), "import")?;
    if outcome == active::Outcome::Activated {
        apps::adopt_snapshots(&catalog)?;
    }
    Ok(Imported { outcome, revision: catalog.revision(), status: current_status()? })
}
