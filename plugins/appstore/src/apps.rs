//! Apps as the catalog offers them, and services made from them: install creates a service
//! from a version's template with that version's snapshot on it; upgrade writes the newer
//! version's template and snapshot against the service revision read; adoption gives every
//! service that names an app version without a snapshot the snapshot from the active catalog.

use crate::active;
use capstan_catalog::{App, AppVersion, Snapshot, Template, Verified, Version};
use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::{Context, JsonSchema, Refusal, Result, Value, json};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

fn app_not_found(app_id: &str) -> Refusal {
    Refusal::new("appstore-app-not-found", format!("the catalog has no app {app_id:?}")).with_data(json!({ "appId": app_id }))
}

fn version_not_found(app_id: &str, version: &Version) -> Refusal {
    Refusal::new("appstore-version-not-found", format!("the catalog has no version {version} of {app_id}"))
        .with_data(json!({ "appId": app_id, "version": version.to_string() }))
}

pub(crate) fn find_app<'a>(catalog: &'a Verified, app_id: &str) -> Result<&'a App> {
    catalog.app(app_id).ok_or_else(|| app_not_found(app_id))
}

/// The version asked for (it must be offered), or the one a new install gets.
pub(crate) fn offered_version<'a>(app: &'a App, version: Option<&Version>) -> Result<&'a AppVersion> {
    let chosen = match version {
        Some(v) => app.version(v).ok_or_else(|| version_not_found(&app.id, v))?,
        None => app.newest().ok_or_else(|| {
            Refusal::new("appstore-version-withdrawn", format!("every version of {} is withdrawn", app.id))
                .with_data(json!({ "appId": app.id }))
        })?,
    };
    if let Some(withdrawal) = &chosen.withdrawn {
        return Err(Refusal::new(
            "appstore-version-withdrawn",
            format!("{} {} is withdrawn: {}", app.id, chosen.version, withdrawal.reason),
        )
        .with_data(json!({ "appId": app.id, "version": chosen.version.to_string() })));
    }
    Ok(chosen)
}

/// The platform capabilities an app can be given: `platform-oidc` (Capstan as the app's OpenID
/// provider; the host reads the declaration from the service's snapshot when an administrator
/// enables single sign-on), `database` and `objectstorage` (the bindings manager makes them from
/// the same snapshot: [`crate::needs`]). A version that requires another is refused, naming only
/// those, rather than installed half-working.
const SUPPORTED_CAPABILITIES: [&str; 3] = [capstan_catalog::PLATFORM_OIDC, crate::needs::STORAGE[0], crate::needs::STORAGE[1]];

fn check_capabilities(app: &App, version: &AppVersion) -> Result<()> {
    let unsupported: Vec<&String> =
        version.template.capabilities.iter().filter(|c| !SUPPORTED_CAPABILITIES.contains(&c.as_str())).collect();
    if unsupported.is_empty() {
        return Ok(());
    }
    let names = unsupported.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ");
    Err(Refusal::new(
        "appstore-capability-unsupported",
        format!(
            "{} {} requires {names}, which no manager of this host provides (it provides {})",
            app.id,
            version.version,
            SUPPORTED_CAPABILITIES.join(", ")
        ),
    )
    .with_data(json!({ "appId": app.id, "version": version.version.to_string(), "capabilities": unsupported })))
}

// ---- listing ----

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppView {
    id: String,
    name: String,
    description: String,
    categories: Vec<String>,
    /// What a new install gets.
    newest_version: Option<String>,
    /// Offered versions, newest first.
    versions: Vec<String>,
    /// Withdrawn versions with the publisher's reason, newest first: kept in the catalog for
    /// the services already running them, never installed or offered as an upgrade.
    withdrawn: Vec<WithdrawnView>,
}

#[derive(Serialize, JsonSchema)]
pub struct WithdrawnView {
    version: String,
    reason: String,
}

fn app_view(app: &App) -> AppView {
    AppView {
        id: app.id.clone(),
        name: app.name.clone(),
        description: app.description.clone(),
        categories: app.categories.clone(),
        newest_version: app.newest().map(|v| v.version.to_string()),
        versions: app.offered().iter().map(|v| v.version.to_string()).collect(),
        withdrawn: withdrawn_versions(app),
    }
}

/// An app's withdrawn versions, newest first.
fn withdrawn_versions(app: &App) -> Vec<WithdrawnView> {
    let mut withdrawn: Vec<&AppVersion> = app.versions.iter().filter(|v| v.withdrawn.is_some()).collect();
    withdrawn.sort_by(|a, b| b.version.cmp(&a.version));
    withdrawn
        .into_iter()
        .map(|v| WithdrawnView {
            version: v.version.to_string(),
            reason: v.withdrawn.as_ref().map(|w| w.reason.clone()).unwrap_or_default(),
        })
        .collect()
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppList {
    apps: Vec<AppView>,
    status: crate::Status,
}

pub fn list_apps(_ctx: &Context, _: capstan_sdk::Empty) -> Result<AppList> {
    let apps = match active::current()? {
        Ok((catalog, _)) => catalog.apps().iter().map(app_view).collect(),
        Err(_) => Vec::new(),
    };
    Ok(AppList { apps, status: crate::current_status()? })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AppVersionRef {
    app_id: String,
    /// Default: the version a new install gets.
    #[schemars(with = "Option<String>")]
    version: Option<Version>,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppConfig {
    app_id: String,
    name: String,
    version: String,
    notes: String,
    /// Why it was withdrawn, when it was (it is then not offered).
    withdrawn: Option<String>,
    #[schemars(with = "Value")]
    template: Template,
    template_digest: String,
    catalog_revision: u64,
    /// The app with every version, offered and withdrawn (its page lists them).
    app: AppView,
    /// Where it can be started: the clusters with their active nodes, by name.
    clusters: Vec<ClusterChoice>,
}

/// A cluster an app can be started on, with its active nodes.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterChoice {
    id: String,
    name: String,
    nodes: Vec<NodeChoice>,
}

/// An active node of a cluster.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeChoice {
    id: String,
    name: String,
}

/// Every cluster with its active nodes, by name (the install form's choices).
fn cluster_choices() -> Result<Vec<ClusterChoice>> {
    let nodes = inventory::list_all::<Value>(EntityKind::Node)?;
    let mut clusters: Vec<ClusterChoice> = inventory::list_all::<Value>(EntityKind::Cluster)?
        .into_iter()
        .map(|c| {
            let mut nodes: Vec<NodeChoice> = nodes
                .iter()
                .filter(|n| n.data["clusterId"] == c.id.as_str() && n.data["state"] == "active")
                .map(|n| NodeChoice { id: n.id.clone(), name: n.data["name"].as_str().unwrap_or(&n.id).to_string() })
                .collect();
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
            ClusterChoice { name: c.data["name"].as_str().unwrap_or(&c.id).to_string(), id: c.id, nodes }
        })
        .collect();
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(clusters)
}

pub fn get_app_config(_ctx: &Context, input: AppVersionRef) -> Result<AppConfig> {
    let (catalog, _) = active::require()?;
    let app = find_app(&catalog, &input.app_id)?;
    let version = match &input.version {
        Some(v) => app.version(v).ok_or_else(|| version_not_found(&app.id, v))?,
        None => offered_version(app, None)?,
    };
    Ok(AppConfig {
        app_id: app.id.clone(),
        name: app.name.clone(),
        version: version.version.to_string(),
        notes: version.notes.clone(),
        withdrawn: version.withdrawn.as_ref().map(|w| w.reason.clone()),
        template: version.template.clone(),
        template_digest: version.template.digest_hex(),
        catalog_revision: catalog.revision(),
        app: app_view(app),
        clusters: cluster_choices()?,
    })
}

// ---- install ----

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Install {
    organization_id: String,
    app_id: String,
    /// Default: the version a new install gets.
    #[schemars(with = "Option<String>")]
    version: Option<Version>,
    /// The new service's name (unique in the organization); default: the app's id.
    #[serde(default)]
    name: Option<String>,
    domains: Option<Vec<String>>,
    scale: Option<u32>,
    /// Environment variables as `KEY=value`, over the version's own (a key it sets takes the
    /// value given here; others are added): what its notes ask for (`DOMAIN=https://…`).
    #[serde(default)]
    environment: Vec<String>,
    /// The cluster the app runs on: it starts there at once. Absent, the service is only
    /// created (it runs once a runtime spec places it: `capstan services run`).
    cluster_id: Option<String>,
    /// The node of that cluster it runs on. Default: every active node of the cluster — but an
    /// app that keeps data in volumes runs on one node, so it names one unless the cluster has
    /// only one.
    node_id: Option<String>,
}

/// Where an installed app runs (`runtime.setServiceSpec`'s placement), judged before anything is
/// created: the cluster exists, the node is one of its active nodes, an app with volumes has one.
pub(crate) fn placement_for(template: &Template, cluster_id: &str, node_id: Option<&str>) -> Result<Value> {
    if inventory::get::<Value>(EntityKind::Cluster, cluster_id)?.is_none() {
        return Err(Refusal::new("cluster-not-found", format!("no cluster {cluster_id}")).with_data(json!({ "field": "clusterId" })));
    }
    let active: Vec<String> = inventory::list_all::<Value>(EntityKind::Node)?
        .into_iter()
        .filter(|n| n.data["clusterId"] == cluster_id && n.data["state"] == "active")
        .map(|n| n.id)
        .collect();
    match node_id {
        Some(node) if active.iter().any(|n| n == node) => Ok(json!({ "nodes": [node] })),
        Some(node) => Err(Refusal::new("node-not-in-cluster", format!("{node} is not an active node of cluster {cluster_id}"))
            .with_data(json!({ "field": "nodeId" }))),
        None if template.volumes.is_empty() && crate::needs::of(template).is_empty() => Ok(json!({ "everyNode": true })),
        None => match active.as_slice() {
            [only] => Ok(json!({ "nodes": [only] })),
            _ => Err(Refusal::new(
                "appstore-node-required",
                format!(
                    "the app keeps its data in volumes or in a database or bucket of its node, so it runs on one node: name it (nodeId, one of the {} active nodes of the cluster)",
                    active.len()
                ),
            )
            .with_data(json!({ "field": "nodeId", "nodes": active }))),
        },
    }
}

/// How an installed app's readiness is probed: its first http port answering `/` (2xx or 3xx),
/// else its first tcp port accepting a connection, else none.
fn health_for(template: &Template) -> Value {
    use capstan_catalog::Protocol;
    let first = |protocol: Protocol| template.ports.iter().find(|p| p.protocol == protocol).map(|p| p.port);
    match (first(Protocol::Http), first(Protocol::Tcp)) {
        (Some(port), _) => json!({ "kind": "http", "port": port, "path": "/" }),
        (None, Some(port)) => json!({ "kind": "tcp", "port": port }),
        (None, None) => json!({ "kind": "none" }),
    }
}

/// `KEY=value` lines as a map (`invalid-request` naming the line otherwise); empty lines are
/// skipped. The names are checked as the service's (`services.create` refuses a bad one).
fn environment_lines(lines: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for line in lines.iter().map(|l| l.trim_end_matches('\r')).filter(|l| !l.trim().is_empty()) {
        match line.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                out.insert(key.trim().to_string(), value.to_string());
            }
            _ => {
                let shown: String = line.chars().take(40).collect();
                return Err(Refusal::invalid_request(format!("environment lines are KEY=value; {shown:?} is not"))
                    .with_data(json!({ "field": "environment" })));
            }
        }
    }
    Ok(out)
}

pub fn install(_ctx: &Context, input: Install) -> Result<Value> {
    let (catalog, _) = active::require()?;
    let app = find_app(&catalog, &input.app_id)?;
    let version = offered_version(app, input.version.as_ref())?;
    check_capabilities(app, version)?;
    let placement = match &input.cluster_id {
        Some(cluster) => Some(placement_for(&version.template, cluster, input.node_id.as_deref())?),
        None if input.node_id.is_some() => {
            return Err(Refusal::invalid_request("nodeId names a node of the cluster clusterId names: name the cluster too")
                .with_data(json!({ "field": "clusterId" })));
        }
        None => None,
    };
    let snapshot = Snapshot::of(app, version, catalog.revision());
    let template = &version.template;
    let name = input.name.clone().unwrap_or_else(|| app.id.clone());
    let mut environment = template.environment.clone();
    environment.extend(environment_lines(&input.environment)?);
    let mut body = json!({
        "name": name,
        "organizationId": input.organization_id,
        "image": template.image,
        "ports": template.ports,
        "environment": environment,
        "volumes": template.volumes,
        "template": snapshot,
    });
    if let Some(domains) = &input.domains {
        body["domains"] = json!(domains);
    }
    if let Some(scale) = input.scale {
        body["scale"] = json!(scale);
    }
    // as the caller: the inventory judges the caller's right to create in the organization
    let service = inventory::create_service::<Value>(&body)?;
    capstan_sdk::info!("installed {} {} as service {}", app.id, version.version, service.id);
    let mut answer = json!({
        "id": service.id,
        "name": name,
        "revision": service.revision,
        "appId": app.id,
        "version": version.version.to_string()
    });
    // its databases and buckets are made by the bindings manager from the snapshot: the app
    // waits for them before its first replica starts
    let needs = crate::needs::of(template);
    if !needs.is_empty() {
        crate::needs::gate(&service.id, &needs)?;
        answer["waitsFor"] = json!(needs);
    }
    if let (Some(cluster), Some(placement)) = (&input.cluster_id, placement) {
        match start(&service.id, template, cluster, placement) {
            Ok(revision) => {
                answer["clusterId"] = json!(cluster);
                answer["specRevision"] = json!(revision);
            }
            // the service stands: say so, and how to start it, rather than lose it
            Err(refused) => {
                return Err(Refusal::new(
                    refused.code(),
                    format!(
                        "{} was created as service {}, but it could not be started on {cluster}: {} (start it with `capstan services run {}`)",
                        app.id,
                        service.id,
                        refused.message(),
                        service.id
                    ),
                )
                .with_data(json!({ "serviceId": service.id, "clusterId": cluster })));
            }
        }
    }
    Ok(answer)
}

/// Start the installed app `service_id` on `cluster`: one replica per node `placement` names,
/// probed as its ports allow. The spec's revision.
pub(crate) fn start(service_id: &str, template: &Template, cluster: &str, placement: Value) -> Result<u64> {
    let spec = json!({ "serviceId": service_id, "clusterId": cluster, "expectedRevision": null, "placement": placement,
                       "replicasPerNode": 1, "health": health_for(template) });
    Ok(capstan_sdk::runtime::set_service_spec(&spec)?.revision)
}

// ---- services from the catalog ----

/// A service's snapshot, when it carries one.
fn snapshot_of(service: &Value) -> Option<Snapshot> {
    serde_json::from_value(service.get("template")?.clone()).ok()
}

/// Every service (paged through the inventory), with its id and revision.
fn all_services() -> Result<Vec<inventory::Entity<Value>>> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = inventory::list::<Value>(EntityKind::Service, cursor.as_deref(), 200)?;
        all.extend(page.entities);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(all),
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OrganizationRef {
    organization_id: String,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Upgradeable {
    service_id: String,
    name: String,
    app_id: String,
    current_version: String,
    /// Offered versions greater than the current one, oldest first.
    available: Vec<String>,
}

pub fn list_upgradeable(_ctx: &Context, input: OrganizationRef) -> Result<Vec<Upgradeable>> {
    let (catalog, _) = active::require()?;
    let mut found = Vec::new();
    for service in all_services()? {
        if service.data["organizationId"] != input.organization_id.as_str() {
            continue;
        }
        let Some(snapshot) = snapshot_of(&service.data) else { continue };
        let available: Vec<String> =
            catalog.versions_newer_than(&snapshot.app_id, &snapshot.version).iter().map(|v| v.version.to_string()).collect();
        if !available.is_empty() {
            found.push(Upgradeable {
                service_id: service.id,
                name: service.data["name"].as_str().unwrap_or_default().into(),
                app_id: snapshot.app_id,
                current_version: snapshot.version.to_string(),
                available,
            });
        }
    }
    Ok(found)
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpgradeRequest {
    organization_id: String,
    service_id: String,
    /// Default: the newest offered version greater than the current one.
    #[schemars(with = "Option<String>")]
    version: Option<Version>,
    /// For `upgrade` and `startServiceUpgrade`: the service revision read (a newer one is `conflict`).
    expected_revision: Option<u64>,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    service_id: String,
    /// The service's name, organization and revision as read (an upgrade states the revision).
    service_name: String,
    organization_id: String,
    service_revision: u64,
    app_id: String,
    from: String,
    to: String,
    image: Change,
    /// Keys the new template adds, drops, or sets to another value (values are plain
    /// configuration; keys the operator added stay untouched).
    environment_added: Vec<String>,
    environment_removed: Vec<String>,
    environment_changed: Vec<String>,
    ports_changed: bool,
    volumes_changed: bool,
    /// Whether the service's current version declares single sign-on (`platformOidc`) and the
    /// new one declares it differently or not at all (roles, redirect path or variables): where
    /// an administrator enabled single sign-on for the service, they disable it before the
    /// upgrade and enable it again after (the App Store cannot see whether it is enabled).
    oidc_contract_changes: bool,
    /// Release notes of every version passed, oldest first.
    notes: Vec<String>,
    /// Every offered version newer than the current one, oldest first (other targets).
    available: Vec<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct Change {
    from: String,
    to: String,
}

struct Plan {
    service: inventory::Entity<Value>,
    from: Snapshot,
    to: Snapshot,
    environment: BTreeMap<String, String>,
    preview: Preview,
}

/// What upgrading `service_id` to `version` would write, checked against the catalog.
fn plan(input: &UpgradeRequest) -> Result<Plan> {
    let (catalog, _) = active::require()?;
    let service = service_in(&input.organization_id, &input.service_id)?;
    let from = snapshot_of(&service.data).ok_or_else(|| {
        Refusal::new(
            "appstore-service-not-from-catalog",
            "the service carries no App Store snapshot: it was not installed from the catalog",
        )
        .with_data(json!({ "serviceId": input.service_id }))
    })?;
    let app = find_app(&catalog, &from.app_id)?;
    let newer = catalog.versions_newer_than(&from.app_id, &from.version);
    let target = match &input.version {
        Some(v) => {
            let chosen = offered_version(app, Some(v))?;
            if chosen.version <= from.version {
                return Err(Refusal::new("version-not-newer", format!("{} runs {}; {v} is not newer", input.service_id, from.version))
                    .with_data(json!({ "current": from.version.to_string(), "offered": v.to_string() })));
            }
            chosen
        }
        None => *newer.last().ok_or_else(|| {
            Refusal::new("appstore-up-to-date", format!("{} {} is the newest offered version", from.app_id, from.version))
                .with_data(json!({ "serviceId": input.service_id }))
        })?,
    };
    check_capabilities(app, target)?;
    let to = Snapshot::of(app, target, catalog.revision());
    let current: BTreeMap<String, String> = serde_json::from_value(service.data["environment"].clone()).unwrap_or_default();
    // the old template's keys make way for the new template's; the operator's own stay
    let mut environment: BTreeMap<String, String> =
        current.iter().filter(|(k, _)| !from.template.environment.contains_key(*k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    environment.extend(to.template.environment.clone());
    let keys = |m: &BTreeMap<String, String>| m.keys().cloned().collect::<std::collections::BTreeSet<_>>();
    let (old, new) = (keys(&from.template.environment), keys(&to.template.environment));
    let preview = Preview {
        service_id: service.id.clone(),
        service_name: service.data["name"].as_str().unwrap_or_default().into(),
        organization_id: input.organization_id.clone(),
        service_revision: service.revision,
        app_id: from.app_id.clone(),
        from: from.version.to_string(),
        to: to.version.to_string(),
        image: Change { from: service.data["image"].as_str().unwrap_or_default().into(), to: to.template.image.clone() },
        environment_added: new.difference(&old).cloned().collect(),
        environment_removed: old.difference(&new).cloned().collect(),
        environment_changed: old
            .intersection(&new)
            .filter(|k| from.template.environment[*k] != to.template.environment[*k])
            .cloned()
            .collect(),
        ports_changed: from.template.ports != to.template.ports,
        volumes_changed: from.template.volumes != to.template.volumes,
        oidc_contract_changes: from.template.platform_oidc.is_some() && from.template.platform_oidc != to.template.platform_oidc,
        notes: newer
            .iter()
            .filter(|v| v.version <= to.version && !v.notes.is_empty())
            .map(|v| format!("{}: {}", v.version, v.notes))
            .collect(),
        available: newer.iter().map(|v| v.version.to_string()).collect(),
    };
    Ok(Plan { service, from, to, environment, preview })
}

pub fn upgrade_preview(_ctx: &Context, input: UpgradeRequest) -> Result<Preview> {
    Ok(plan(&input)?.preview)
}

pub fn upgrade(_ctx: &Context, input: UpgradeRequest) -> Result<Value> {
    Ok(write_upgrade(&input)?.0)
}

/// Write the planned upgrade against the revision the caller read; answers what `upgrade`
/// answers, and the service as written.
fn write_upgrade(input: &UpgradeRequest) -> Result<(Value, inventory::Entity<Value>)> {
    let expected = input.expected_revision.ok_or_else(|| {
        Refusal::invalid_request("an upgrade states the service revision it read (expectedRevision)")
            .with_data(json!({ "field": "expectedRevision" }))
    })?;
    let plan = plan(input)?;
    let body = json!({
        "id": plan.service.id,
        "expectedRevision": expected,
        "image": plan.to.template.image,
        "ports": plan.to.template.ports,
        "environment": plan.environment,
        "volumes": plan.to.template.volumes,
        "template": plan.to,
    });
    let service = inventory::update_service::<Value>(&body)?;
    capstan_sdk::info!("upgraded service {} from {} {} to {}", service.id, plan.from.app_id, plan.from.version, plan.to.version);
    // what it ran before is the release a rollback returns to; the upgrade stands without it
    if let Err(e) =
        crate::rollouts::keep(&plan.service, &plan.from.version.to_string(), &plan.to.version.to_string(), &plan.to.template.image)
    {
        capstan_sdk::warn!("the release before the upgrade of {} was not kept ({}): it cannot be rolled back", service.id, e.code());
    }
    let answer = json!({
        "id": service.id,
        "name": plan.preview.service_name,
        "revision": service.revision,
        "from": plan.preview.from,
        "to": plan.preview.to
    });
    Ok((answer, service))
}

// ---- a hosted app's upgrade status ----

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceRef {
    organization_id: String,
    service_id: String,
}

/// Why an upgrade cannot be offered or judged: a refusal's code, message and cause.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    code: String,
    message: String,
    /// The refusal's `data.cause`, when it names one (why no catalog is active).
    #[serde(skip_serializing_if = "Option::is_none")]
    cause: Option<String>,
}

impl From<&Refusal> for Blocker {
    fn from(e: &Refusal) -> Blocker {
        let cause = e.data().and_then(|d| d.get("cause")).and_then(Value::as_str).map(String::from);
        Blocker { code: e.code().into(), message: e.message().into(), cause }
    }
}

/// A hosted app's upgrade status, derived on every read from the service and the active catalog.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    service_id: String,
    service_name: String,
    /// The service revision read (what `startServiceUpgrade` states).
    service_revision: u64,
    /// `up-to-date`, `available` (an upgrade can start), `blocked` (newer versions exist but
    /// none can be installed here: see `blockers`), `unknown` (no verified catalog is active:
    /// the cause is the blocker) or `not-from-catalog`.
    status: String,
    app_id: Option<String>,
    current_version: Option<String>,
    /// What an upgrade started now moves to.
    target_version: Option<String>,
    /// Offered versions newer than the current one, oldest first.
    available: Vec<String>,
    blockers: Vec<Blocker>,
    /// The active catalog's revision the status was judged against.
    catalog_revision: Option<u64>,
    /// The last upgrade, while the service runs the image it set: its rollout on the runtime and
    /// the version a rollback returns to.
    #[serde(skip_serializing_if = "Option::is_none")]
    upgrade: Option<crate::rollouts::UpgradeRollout>,
}

fn service_in(organization_id: &str, service_id: &str) -> Result<inventory::Entity<Value>> {
    inventory::get::<Value>(EntityKind::Service, service_id)?
        .filter(|s| s.data["organizationId"] == organization_id)
        .ok_or_else(|| Refusal::new("service-not-found", format!("there is no service {service_id:?} in the organization")))
}

/// The upgrade status of one service: never refused for want of a catalog (it is `unknown`);
/// with its last upgrade's rollout while it runs that upgrade's image.
fn upgrade_status(organization_id: &str, service_id: &str) -> Result<UpgradeStatus> {
    let service = service_in(organization_id, service_id)?;
    let upgrade = crate::rollouts::of(&service)?;
    Ok(UpgradeStatus { upgrade, ..catalog_status(service)? })
}

/// What the active catalog offers `service`.
fn catalog_status(service: inventory::Entity<Value>) -> Result<UpgradeStatus> {
    let snapshot = snapshot_of(&service.data);
    let mut status = UpgradeStatus {
        service_id: service.id.clone(),
        service_name: service.data["name"].as_str().unwrap_or_default().into(),
        service_revision: service.revision,
        status: "not-from-catalog".into(),
        app_id: snapshot.as_ref().map(|s| s.app_id.clone()),
        current_version: snapshot.as_ref().map(|s| s.version.to_string()),
        target_version: None,
        available: Vec::new(),
        blockers: Vec::new(),
        catalog_revision: None,
        upgrade: None,
    };
    let Some(snapshot) = snapshot else { return Ok(status) };
    let catalog = match active::current()? {
        Ok((catalog, _)) => catalog,
        Err(why) => {
            status.status = "unknown".into();
            status.blockers.push(Blocker::from(&why.refusal()));
            return Ok(status);
        }
    };
    status.catalog_revision = Some(catalog.revision());
    let Some(app) = catalog.app(&snapshot.app_id) else {
        status.status = "blocked".into();
        status.blockers.push(Blocker::from(&app_not_found(&snapshot.app_id)));
        return Ok(status);
    };
    let newer = catalog.versions_newer_than(&snapshot.app_id, &snapshot.version);
    status.available = newer.iter().map(|v| v.version.to_string()).collect();
    // the newest version that can be installed here; each one that cannot says why
    for version in newer.iter().rev() {
        match check_capabilities(app, version) {
            Ok(()) => {
                status.target_version = Some(version.version.to_string());
                break;
            }
            Err(e) => status.blockers.push(Blocker::from(&e)),
        }
    }
    status.status = match (&status.target_version, newer.is_empty()) {
        (Some(_), _) => "available",
        (None, true) => "up-to-date",
        (None, false) => "blocked",
    }
    .into();
    if status.target_version.is_some() {
        status.blockers.clear();
    }
    Ok(status)
}

pub fn service_upgrade_status(_ctx: &Context, input: ServiceRef) -> Result<UpgradeStatus> {
    upgrade_status(&input.organization_id, &input.service_id)
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Started {
    /// `started`: the service now states the new version; its cluster rolls it out from there.
    state: String,
    service_id: String,
    from: String,
    to: String,
    /// The service revision written.
    revision: u64,
    /// The upgrade status after the write.
    upgrade_status: UpgradeStatus,
}

/// Start a hosted app's upgrade: the same checks and write as `upgrade`, to the newest
/// offered version unless one is named; refused like it while no catalog is active.
pub fn start_service_upgrade(_ctx: &Context, input: UpgradeRequest) -> Result<Started> {
    let (answer, service) = write_upgrade(&input)?;
    let text = |key: &str| answer[key].as_str().unwrap_or_default().to_string();
    Ok(Started {
        state: "started".into(),
        service_id: service.id.clone(),
        from: text("from"),
        to: text("to"),
        revision: service.revision,
        upgrade_status: upgrade_status(&input.organization_id, &service.id)?,
    })
}

// ---- adoption ----

/// A service that names an app version but carries no snapshot of it: `{appId, version}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Reference {
    app_id: String,
    version: Version,
}

/// What an adoption round did: snapshots given, and those put off by a refusal worth trying
/// again (the service changed meanwhile, the store busy).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Adopted {
    pub adopted: usize,
    pub deferred: usize,
}

/// Give every service whose template names an app version the catalog lists, but holds no
/// snapshot, that version's snapshot. Never fails on one service: each miss is logged.
pub fn adopt_snapshots(catalog: &Verified) -> Result<Adopted> {
    let mut done = Adopted::default();
    for service in all_services()? {
        if snapshot_of(&service.data).is_some() {
            continue;
        }
        let Some(reference) = service.data.get("template").and_then(|t| serde_json::from_value::<Reference>(t.clone()).ok()) else {
            continue;
        };
        let Some(snapshot) = catalog.snapshot(&reference.app_id, &reference.version) else { continue };
        let body = json!({ "id": service.id, "expectedRevision": service.revision, "template": snapshot });
        match inventory::update_service::<Value>(&body) {
            Ok(_) => done.adopted += 1,
            Err(e) => {
                capstan_sdk::warn!("snapshot adoption for service {} skipped: {} ({})", service.id, e.message(), e.code());
                if e.is_retryable() || e.is("conflict") {
                    done.deferred += 1;
                }
            }
        }
    }
    Ok(done)
}
