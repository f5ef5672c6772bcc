//! Data migrations: the store's chain machinery, and the host's own chain.

pub use capstan_store::migrate::*;

use capstan_core::refusal::{Refusal, Result};
use serde_json::{Map, Value};

/// The host's own chain. Its floor is the first data version Capstan ever wrote; steps are
/// appended here as the host's data model evolves, and deleted once every deployment has
/// passed them (raising the floor).
pub fn host_chain() -> Chain {
    Chain::new(
        "capstan",
        "0.1.0",
        vec![
            Step::new("service-records-to-facets", "0.1.0", "0.2.0", records_to_facets),
            Step::new("timestamps-to-milliseconds", "0.2.0", "0.3.0", timestamps_to_milliseconds),
        ],
    )
}

/// Rewrite every document of `collection` that `rewrite` changes (`None`: left as it is), a
/// page at a time, each document in its own transaction, renewing the migration lock per page.
async fn rewrite_each(ctx: &StepContext, collection: &str, rewrite: impl Fn(&Value) -> Result<Option<Value>>) -> Result<()> {
    let mut cursor: Option<String> = None;
    loop {
        let page = ctx
            .store
            .transact(|tx| {
                let cursor = cursor.clone();
                async move { tx.scan(collection, cursor.as_deref(), 100).await }
            })
            .await?;
        for doc in page.documents {
            let Some(rewritten) = rewrite(&doc.data)? else { continue };
            ctx.store
                .transact(|tx| {
                    let rewritten = rewritten.clone();
                    let id = doc.id.clone();
                    async move { tx.replace(collection, &id, doc.revision, rewritten).await.map(drop) }
                })
                .await?;
        }
        ctx.renew_lock().await?;
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(()),
        }
    }
}

/// The records two managers kept as fields of a service before managers had facets: the
/// field, and the plugin whose facet it becomes. Named here once, to be carried over; nothing
/// else in the host reads them.
const FORMER_FIELDS: &[(&str, &str, Option<&str>)] = &[
    // the mail manager's list of bound addresses becomes `facets.mail.bindings`
    ("mail", "mail", Some("bindings")),
    // CoreMail's binding becomes `facets.coremail` as it is
    ("coreMail", "coremail", None),
];

/// 0.1.0 → 0.2.0: each service's `mail` and `coreMail` move into its facets. A service with
/// neither is left as it is, so a second run finds nothing to do.
async fn records_to_facets(ctx: StepContext) -> Result<()> {
    capstan_inventory::declare(&ctx.store).await?;
    rewrite_each(&ctx, capstan_inventory::SERVICES, carried_over).await
}

/// A service document with its former fields moved into `facets`; `None` when it has none.
fn carried_over(data: &Value) -> Result<Option<Value>> {
    let mut data = data.clone();
    let object = data.as_object_mut().ok_or_else(|| Refusal::internal("a service document is not an object"))?;
    if !FORMER_FIELDS.iter().any(|(field, _, _)| object.contains_key(*field)) {
        return Ok(None);
    }
    let mut facets = match object.remove("facets") {
        Some(Value::Object(facets)) => facets,
        _ => Map::new(),
    };
    for (field, plugin, member) in FORMER_FIELDS {
        let Some(record) = object.remove(*field) else { continue };
        let empty = record.is_null() || record.as_array().is_some_and(Vec::is_empty);
        if empty || facets.contains_key(*plugin) {
            continue;
        }
        let facet = match member {
            Some(member) => Value::Object(Map::from_iter([(member.to_string(), record)])),
            None => record,
        };
        facets.insert(plugin.to_string(), facet);
    }
    if !facets.is_empty() {
        object.insert("facets".into(), Value::Object(facets));
    }
    Ok(Some(data))
}

/// The moments written in seconds before 0.3.0, by collection: dotted paths into a document,
/// `*` standing for every member of an object or element of an array. Everything else was in
/// milliseconds already (nodes, fleet, audit, events, scheduler, plugins, runtime, backups).
const MOMENTS_IN_SECONDS: &[(&str, &[&str])] = &[
    (capstan_inventory::ORGANIZATIONS, &["createdAt", "updatedAt"]),
    (capstan_inventory::MEMBERS, &["updatedAt"]),
    (capstan_inventory::CLUSTERS, &["createdAt", "updatedAt"]),
    (capstan_inventory::CLUSTER_RUNTIMES, &["updatedAt"]),
    (capstan_inventory::SERVICES, &["createdAt", "updatedAt", "deletingAt", "registryPush.pushedAt", "release.promotedAt"]),
    (capstan_inventory::SERVICE_HOLDS, &["since"]),
    (capstan_inventory::SERVICE_GRANTS, &["grantedAt"]),
    (capstan_inventory::grants::DEPLOYERS, &["createdAt"]),
    (capstan_auth::USERS, &["createdAt"]),
    (capstan_auth::CREDENTIALS, &["updatedAt", "tokenExpiresAt"]),
    (capstan_auth::SESSIONS, &["createdAt", "expiresAt"]),
    (capstan_auth::RECEIPTS, &["at"]),
    (capstan_secrets::methods::SECRETS, &["createdAt", "updatedAt", "revokedAt"]),
    (capstan_secrets::methods::VERSIONS, &["createdAt"]),
    (capstan_secrets::sets::SETS, &["createdAt", "updatedAt", "retiredAt"]),
    (capstan_secrets::sets::ATTACHMENTS, &["attachedAt"]),
    (capstan_secrets::manifests::MANIFESTS, &["publishedAt"]),
    (capstan_relays::credentials::CREDENTIALS, &["createdAt", "updatedAt"]),
    (capstan_relays::credentials::EXPORTS, &["at"]),
    (capstan_registry::storage::BLOBS, &["createdAt", "usedAt"]),
    (capstan_registry::storage::LINKS, &["createdAt"]),
    (capstan_registry::storage::MANIFESTS, &["createdAt", "usedAt"]),
    (capstan_registry::storage::TAGS, &["updatedAt"]),
    (capstan_registry::storage::UPLOADS, &["createdAt", "updatedAt"]),
    (capstan_registry::pulls::PULL_CREDENTIALS, &["issuedAt", "expiresAt"]),
    (capstan_registry::retention::RETENTION, &["lastPassAt", "since.*"]),
    (capstan_registry::retention::RETIRED, &["retiredAt"]),
    (
        capstan_registry::deployments::OPERATIONS,
        &["createdAt", "updatedAt", "promotedAt", "rolledBackAt", "routeEvidence.*.checkedAt", "routeDiagnostic.checkedAt"],
    ),
    (capstan_registry::deployments::CLAIMS, &["createdAt"]),
    (capstan_registry::deployments::ROUTE_CLAIMS, &["createdAt"]),
];

/// 0.2.0 → 0.3.0: every moment the table names, written in seconds, becomes milliseconds
/// ([`capstan_core::clock::ms_from_legacy`]), so every moment stored or answered is one unit.
/// A value in milliseconds already is left alone, so a second run changes nothing.
async fn timestamps_to_milliseconds(ctx: StepContext) -> Result<()> {
    capstan_inventory::declare(&ctx.store).await?;
    for spec in capstan_auth::collections() {
        ctx.store.declare(spec).await?;
    }
    capstan_secrets::methods::declare(&ctx.store).await?;
    capstan_relays::declare(&ctx.store).await?;
    capstan_registry::declare(&ctx.store).await?;
    for (collection, paths) in MOMENTS_IN_SECONDS {
        rewrite_each(&ctx, collection, |data| Ok(in_milliseconds(data, paths))).await?;
    }
    Ok(())
}

/// `data` with the moments at `paths` in milliseconds; `None` when none was in seconds.
fn in_milliseconds(data: &Value, paths: &[&str]) -> Option<Value> {
    let mut data = data.clone();
    let mut changed = false;
    for path in paths {
        let segments: Vec<&str> = path.split('.').collect();
        changed |= convert(&mut data, &segments);
    }
    changed.then_some(data)
}

/// Convert the moments at `path` below `value`: whether any changed. A missing member, a null
/// or anything not a whole number is left as it is.
fn convert(value: &mut Value, path: &[&str]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        let Some(at) = value.as_u64() else { return false };
        let ms = capstan_core::clock::ms_from_legacy(at);
        *value = Value::from(ms);
        return ms != at;
    };
    let children: Vec<&mut Value> = match (*first, value) {
        ("*", Value::Object(members)) => members.values_mut().collect(),
        ("*", Value::Array(items)) => items.iter_mut().collect(),
        (key, Value::Object(members)) => members.get_mut(key).into_iter().collect(),
        _ => Vec::new(),
    };
    children.into_iter().fold(false, |changed, child| convert(child, rest) | changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_host_chain_is_well_formed() {
        let chain = super::host_chain();
        assert!(chain.target() >= chain.oldest_supported);
    }

    #[test]
    fn the_managers_former_fields_move_into_their_facets_once() {
        let binding = json!({ "address": "web@acme.example", "smtpUsername": "u", "credentialVersion": 1, "inbound": null, "targetType": "direct", "retired": false });
        let before = json!({
            "name": "web", "state": "active", "mailAddresses": ["web@acme.example"],
            "mail": [binding.clone()],
            "coreMail": { "bindingId": "b-1", "want": "dual-write" },
        });
        let after = carried_over(&before).unwrap().unwrap();
        assert_eq!(
            after,
            json!({
                "name": "web", "state": "active", "mailAddresses": ["web@acme.example"],
                "facets": { "mail": { "bindings": [binding] }, "coremail": { "bindingId": "b-1", "want": "dual-write" } },
            })
        );
        assert_eq!(carried_over(&after).unwrap(), None, "a second run finds nothing to do");
        // an empty record is dropped, not carried; a facet already written is kept
        let partial = json!({ "name": "api", "mail": [], "coreMail": null, "facets": { "coremail": { "bindingId": "b-2", "want": "coremail-only" } } });
        assert_eq!(
            carried_over(&partial).unwrap().unwrap(),
            json!({ "name": "api", "facets": { "coremail": { "bindingId": "b-2", "want": "coremail-only" } } })
        );
    }

    #[test]
    fn moments_in_seconds_become_milliseconds_once() {
        let paths = ["createdAt", "updatedAt", "deletingAt", "registryPush.pushedAt", "routeEvidence.*.checkedAt", "since.*"];
        let before = json!({
            "name": "web", "scale": 3, "createdAt": 1_700_000_000u64, "updatedAt": 1_700_000_500_123u64, "deletingAt": null,
            "registryPush": { "tag": "v1", "pushedAt": 1_700_000_100u64 },
            "routeEvidence": [{ "status": 200, "checkedAt": 1_700_000_200u64 }, { "status": 204, "checkedAt": 1_700_000_300_000u64 }],
            "since": { "a/b": 1_700_000_400u64, "c/d": 1_700_000_400_000u64 },
            "facets": { "mail": { "since": 17 } },
        });
        let after = in_milliseconds(&before, &paths).unwrap();
        assert_eq!(
            after,
            json!({
                "name": "web", "scale": 3, "createdAt": 1_700_000_000_000u64, "updatedAt": 1_700_000_500_123u64, "deletingAt": null,
                "registryPush": { "tag": "v1", "pushedAt": 1_700_000_100_000u64 },
                "routeEvidence": [{ "status": 200, "checkedAt": 1_700_000_200_000u64 }, { "status": 204, "checkedAt": 1_700_000_300_000u64 }],
                "since": { "a/b": 1_700_000_400_000u64, "c/d": 1_700_000_400_000u64 },
                "facets": { "mail": { "since": 17 } },
            }),
            "seconds become milliseconds; milliseconds, nulls, other fields and unnamed paths stay"
        );
        assert_eq!(in_milliseconds(&after, &paths), None, "a second run changes nothing");
        let absent = json!({ "name": "api", "registryPush": null, "routeEvidence": "odd" });
        assert_eq!(in_milliseconds(&absent, &paths), None, "missing or odd members are left alone");
    }

    #[test]
    fn the_moments_table_names_each_collection_once() {
        let mut names: Vec<&str> = MOMENTS_IN_SECONDS.iter().map(|(c, _)| *c).collect();
        names.sort_unstable();
        let count = names.len();
        names.dedup();
        assert_eq!(names.len(), count);
    }
}
