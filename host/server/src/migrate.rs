//! Data migrations: the store's chain machinery, and the host's own chain.

pub use capstan_store::migrate::*;

use capstan_core::refusal::{Refusal, Result};
use serde_json::{Map, Value};

/// The host's own chain. Its floor is the first data version Capstan ever wrote; steps are
/// appended here as the host's data model evolves, and deleted once every deployment has
/// passed them (raising the floor).
pub fn host_chain() -> Chain {
    Chain::new("capstan", "0.1.0", vec![Step::new("service-records-to-facets", "0.1.0", "0.2.0", records_to_facets)])
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
    let services = capstan_inventory::SERVICES;
    capstan_inventory::declare(&ctx.store).await?;
    let mut cursor: Option<String> = None;
    loop {
        let page = ctx
            .store
            .transact(|tx| {
                let cursor = cursor.clone();
                async move { tx.scan(services, cursor.as_deref(), 100).await }
            })
            .await?;
        for doc in page.documents {
            let Some(moved) = carried_over(&doc.data)? else { continue };
            ctx.store
                .transact(|tx| {
                    let moved = moved.clone();
                    let id = doc.id.clone();
                    async move { tx.replace(services, &id, doc.revision, moved).await.map(drop) }
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
}
