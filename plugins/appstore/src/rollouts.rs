//! An upgrade's rollout and its rollback. Every upgrade keeps what the service ran before — its
//! image, ports, environment, volumes and the snapshot of its version — as the release it rolls
//! back to (`upgrades/<serviceId>`, the last upgrade only). While the service runs the image
//! the upgrade set, its status carries the rollout of that image's digest as the runtime judges
//! it for the deployment path (`runtime.service-rollout`: per cluster, the replicas the spec wants
//! running exactly that digest, ready), and `rollbackUpgrade` writes the kept release back, which
//! the runtime rolls out the same way — one slot at a time, each replaced only once its
//! successor is ready.

use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::runtime::{self, Rollout};
use capstan_sdk::store::{self, Batch};
use capstan_sdk::{Context, JsonSchema, Refusal, Result, Value, json, now_ms};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The last upgrade of each service, by service id: what it rolls back to.
pub const UPGRADES: &str = "upgrades";

/// The service's fields an upgrade replaces, kept as they were before it.
const KEPT_FIELDS: [&str; 5] = ["image", "ports", "environment", "volumes", "template"];

/// The last upgrade of a service.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    /// The version it upgraded from, and the one it upgraded to.
    pub from_version: String,
    pub to_version: String,
    /// The image the upgrade set: the rollout is judged while the service runs it.
    pub image: String,
    /// The service's [`KEPT_FIELDS`] before the upgrade.
    pub previous: Value,
    pub at_ms: u64,
}

/// Keep what `before` (the service as read before the upgrade) ran, as the release an upgrade
/// to `to_version` with `image` rolls back to.
pub fn keep(before: &inventory::Entity<Value>, from_version: &str, to_version: &str, image: &str) -> Result<()> {
    let previous: serde_json::Map<String, Value> =
        KEPT_FIELDS.iter().filter_map(|field| before.data.get(*field).map(|v| (field.to_string(), v.clone()))).collect();
    let kept = Kept {
        from_version: from_version.into(),
        to_version: to_version.into(),
        image: image.into(),
        previous: Value::Object(previous),
        at_ms: now_ms(),
    };
    let stored = store::get::<Kept>(UPGRADES, &before.id)?;
    Batch::new().put(UPGRADES, &before.id, stored.map(|d| d.revision), &kept).commit()?;
    Ok(())
}

/// Where the service's last upgrade stands: `None` once the service runs another image than
/// the upgrade set (it moved on, or was rolled back).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeRollout {
    /// The version a rollback returns to.
    pub rollback_to: String,
    /// The version the upgrade moved to.
    pub version: String,
    /// The upgrade's image on the runtime; `None` while its tag is not resolved to a digest
    /// (the runtime says why: `image-plan-missing`).
    pub rollout: Option<Rollout>,
    /// The names of the rollout's clusters, by id, for people.
    pub cluster_names: BTreeMap<String, String>,
}

/// The rollout of `service`'s last upgrade, while it runs the upgrade's image.
pub fn of(service: &inventory::Entity<Value>) -> Result<Option<UpgradeRollout>> {
    let Some(kept) = store::get::<Kept>(UPGRADES, &service.id)? else { return Ok(None) };
    let image = service.data["image"].as_str().unwrap_or_default();
    if image != kept.data.image {
        return Ok(None);
    }
    // the digest the image pins, or the one the runtime resolved the catalog's tag to
    let rollout = runtime::service_image_digest(&service.id)?.map(|digest| runtime::service_rollout(&service.id, &digest)).transpose()?;
    let mut cluster_names = BTreeMap::new();
    for cluster in rollout.iter().flat_map(|r| &r.clusters) {
        if let Some(found) = inventory::get::<Value>(EntityKind::Cluster, &cluster.cluster_id)? {
            cluster_names.insert(found.id, found.data["name"].as_str().unwrap_or_default().to_string());
        }
    }
    Ok(Some(UpgradeRollout { rollback_to: kept.data.from_version, version: kept.data.to_version, rollout, cluster_names }))
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RollbackRequest {
    organization_id: String,
    service_id: String,
    /// The service revision read (a newer one is `conflict`).
    expected_revision: u64,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolledBack {
    /// `rolled-back`: the service states the kept release again; its clusters roll it out.
    state: String,
    service_id: String,
    /// The version it left, and the one it runs again.
    from: String,
    to: String,
    /// The service revision written.
    revision: u64,
}

/// Write the release the service's last upgrade kept back onto the service (stating the revision
/// read). Refused `appstore-rollback-unavailable` when no upgrade is kept, or the service runs
/// another image than the upgrade set (it changed since).
pub fn rollback(_ctx: &Context, input: RollbackRequest) -> Result<RolledBack> {
    let service = inventory::get::<Value>(EntityKind::Service, &input.service_id)?
        .filter(|s| s.data["organizationId"] == input.organization_id.as_str())
        .ok_or_else(|| Refusal::new("service-not-found", format!("there is no service {:?} in the organization", input.service_id)))?;
    let unavailable = |why: String| Refusal::new("appstore-rollback-unavailable", why).with_data(json!({ "serviceId": input.service_id }));
    let Some(kept) = store::get::<Kept>(UPGRADES, &service.id)? else {
        return Err(unavailable(format!("no upgrade of {} is kept to roll back", input.service_id)));
    };
    if service.data["image"].as_str() != Some(kept.data.image.as_str()) {
        return Err(unavailable(format!(
            "{} runs another image than its last upgrade set ({}): it changed since, so there is nothing to roll back",
            input.service_id, kept.data.image
        )));
    }
    let mut body = json!({ "id": service.id, "expectedRevision": input.expected_revision });
    for field in KEPT_FIELDS {
        if let Some(value) = kept.data.previous.get(field) {
            body[field] = value.clone();
        }
    }
    let written = inventory::update_service::<Value>(&body)?;
    Batch::new().delete(UPGRADES, &service.id, kept.revision).commit()?;
    capstan_sdk::info!("rolled service {} back from {} to {}", service.id, kept.data.to_version, kept.data.from_version);
    Ok(RolledBack {
        state: "rolled-back".into(),
        service_id: service.id,
        from: kept.data.to_version,
        to: kept.data.from_version,
        revision: written.revision,
    })
}
