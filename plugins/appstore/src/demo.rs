//! The demo catalog `capstan serve --dev --demo` installs: real self-hosted apps (images, ports,
//! volumes and environment as their projects document them, `demo/catalog.json`), signed by a
//! key the host keeps for this plugin on this host (capability `sign`; created on first use,
//! sealed under the keyring, never seen here). That key is trusted only where the demo was
//! installed: its public half is recorded in `demo/key`, which [`trusted_key`] reads.

use crate::active::{self, Outcome};
use capstan_catalog::{Catalog, CatalogError, PUBLIC_KEY_PREFIX, PublisherKey};
use capstan_sdk::store::{self, Batch};
use capstan_sdk::{Context, JsonSchema, Refusal, Result, json};
use serde::{Deserialize, Serialize};

pub const DEMO: &str = "demo";
const KEY_DOC: &str = "key";
/// The host-kept key the demo catalog is signed with.
const SIGNING_KEY: &str = "demo-catalog";
/// The demo catalog's one revision: the same apps sign to the same envelope, so installing the
/// demo again changes nothing.
const REVISION: u64 = 1;
const APPS: &str = include_str!("../demo/catalog.json");

/// `demo/key`: the demo signer this host trusts.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DemoKey {
    public_key: String,
}

/// The demo signer, when the demo was installed here.
pub fn trusted_key() -> Result<Option<PublisherKey>> {
    Ok(store::get::<DemoKey>(DEMO, KEY_DOC)?.and_then(|d| d.data.public_key.parse().ok()))
}

/// The demo apps, as a catalog.
pub fn catalog() -> Result<Catalog> {
    serde_json::from_str(APPS).map_err(|e| Refusal::new("catalog-malformed", format!("the demo catalog: {e}")))
}

/// A refusal, from the catalog's or the host's.
struct Failed(Refusal);

impl From<CatalogError> for Failed {
    fn from(e: CatalogError) -> Failed {
        Failed(active::refusal(e))
    }
}

/// Demo services installed from the demo catalog: (service name, app, version). Each runs an
/// older version where there is a newer one, so the upgrade paths have something to show.
const SERVICES: [(&str, &str, &str); 3] = [("git", "gitea", "1.22.2"), ("cache", "redis", "7.2.6"), ("status", "uptime-kuma", "1.23.16")];
/// The demo service that starts when the demo names a cluster (a small app answering HTTP).
const STARTED: &str = "status";

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DemoInput {
    /// An organization to install a few demo services into (a service of the same name there
    /// is left as it is).
    organization_id: Option<String>,
    /// A cluster with a node to start the demo's `status` app (Uptime Kuma) on, with the
    /// organization: it gets a runtime spec there unless it has one.
    cluster_id: Option<String>,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Installed {
    /// `activated` the first time, `unchanged` after.
    #[schemars(with = "String")]
    outcome: Outcome,
    /// The demo signer, trusted on this host only.
    signer: String,
    apps: usize,
    /// The demo services installed now (none when they were there already).
    services: Vec<String>,
    /// The demo services given a runtime spec now, on `clusterId`.
    started: Vec<String>,
}

/// Sign the demo apps with this host's demo key, trust that key here, and activate them.
/// Refused `appstore-demo-refused` while another publisher's catalog is active: the demo never
/// takes the place of a real catalog.
pub fn install(ctx: &Context, input: DemoInput) -> Result<Installed> {
    let public = capstan_sdk::sign::public_key(SIGNING_KEY)?;
    let text = format!("{PUBLIC_KEY_PREFIX}{}", base64_url(&public));
    let signer: PublisherKey = text.parse().map_err(|_| Refusal::internal("the host's demo key does not parse"))?;
    if let Ok((active, _)) = active::current()?
        && active.signer() != &signer
    {
        return Err(Refusal::new(
            "appstore-demo-refused",
            format!("a catalog signed by {} is active here; the demo catalog does not replace it", active.signer()),
        ));
    }
    let envelope = capstan_catalog::sign_with(&catalog()?, REVISION, &signer, |statement| {
        capstan_sdk::sign::sign(SIGNING_KEY, statement).map_err(Failed)
    })
    .map_err(|Failed(e)| e)?;
    if trusted_key()?.as_ref() != Some(&signer) {
        let doc = DemoKey { public_key: signer.to_string() };
        match store::get::<DemoKey>(DEMO, KEY_DOC)? {
            Some(old) => Batch::new().replace(DEMO, KEY_DOC, old.revision, &doc).commit()?,
            None => Batch::new().insert(DEMO, KEY_DOC, &doc).commit()?,
        };
    }
    let (outcome, catalog) = active::activate(envelope.to_json().as_bytes(), "demo")?;
    if outcome == Outcome::Activated {
        crate::apps::adopt_snapshots(&catalog)?;
    }
    let mut services = Vec::new();
    let mut started = Vec::new();
    if let Some(organization_id) = &input.organization_id {
        for (name, app_id, version) in SERVICES {
            let body = json!({ "organizationId": organization_id, "appId": app_id, "version": version, "name": name });
            let request = serde_json::from_value(body).map_err(|e| Refusal::internal(format!("a demo install: {e}")))?;
            match crate::apps::install(ctx, request) {
                Ok(_) => services.push(name.to_string()),
                // installed by an earlier start
                Err(e) if e.is("exists") => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(cluster) = &input.cluster_id
            && start(&catalog, organization_id, cluster)?
        {
            started.push(STARTED.to_string());
        }
    }
    Ok(Installed { outcome, signer: signer.to_string(), apps: catalog.apps().len(), services, started })
}

/// Give the demo's [`STARTED`] service of `organization_id` a runtime spec on `cluster`, unless it
/// has one there; whether it was given one now.
fn start(catalog: &capstan_catalog::Verified, organization_id: &str, cluster: &str) -> Result<bool> {
    let Some((_, app_id, version)) = SERVICES.iter().find(|(name, ..)| *name == STARTED) else { return Ok(false) };
    let service = capstan_sdk::inventory::list_all::<serde_json::Value>(capstan_sdk::inventory::EntityKind::Service)?
        .into_iter()
        .find(|s| s.data["organizationId"] == organization_id && s.data["name"] == STARTED)
        .ok_or_else(|| Refusal::internal(format!("the demo service {STARTED} is not in the organization")))?;
    if capstan_sdk::runtime::service_specs(&service.id)?.iter().any(|s| s.data["clusterId"] == cluster) {
        return Ok(false);
    }
    let app = crate::apps::find_app(catalog, app_id)?;
    let version = version.parse().map_err(|_| Refusal::internal("a demo version does not parse"))?;
    let template = &crate::apps::offered_version(app, Some(&version))?.template;
    let placement = crate::apps::placement_for(template, cluster, None)?;
    // the demo's node is this machine: its ports are published on the same numbers, so the app
    // answers at http://127.0.0.1:<port>/
    let mut ports = service.data["ports"].clone();
    for port in ports.as_array_mut().into_iter().flatten() {
        if port.get("publicPort").is_none_or(serde_json::Value::is_null) {
            port["publicPort"] = port["port"].clone();
        }
    }
    let update = json!({ "id": service.id, "expectedRevision": service.revision, "ports": ports });
    capstan_sdk::inventory::update_service::<serde_json::Value>(&update)?;
    crate::apps::start(&service.id, template, cluster, placement)?;
    Ok(true)
}

/// Unpadded base64url, as a `capstan-ed25519:` key is written.
fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_apps_sign_into_a_catalog_a_host_verifies() {
        let key = capstan_catalog::SigningKey::from_bytes(&[9; 32]);
        let envelope = capstan_catalog::sign(&catalog().unwrap(), REVISION, &key).unwrap();
        let verified = capstan_catalog::verify(envelope.to_json().as_bytes(), &[PublisherKey::from(&key)]).unwrap();
        let ids: Vec<&str> = verified.apps().iter().map(|a| a.id.as_str()).collect();
        for app in ["gitea", "uptime-kuma", "vaultwarden", "postgresql", "redis", "plausible"] {
            assert!(ids.contains(&app), "{app} in {ids:?}");
        }
        // a host-kept key written as a `capstan-ed25519:` text parses back to itself
        let text = format!("{PUBLIC_KEY_PREFIX}{}", base64_url(PublisherKey::from(&key).as_bytes()));
        assert_eq!(text.parse::<PublisherKey>().unwrap(), PublisherKey::from(&key));
    }
}
