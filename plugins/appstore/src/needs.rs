//! What an app needs of the platform's storage (docs/appstore.md, "Databases and buckets"): a
//! version whose template declares `database` or `objectstorage` is installed on one node, and
//! its replicas wait (the App Store's gate, `bindings-pending`) until the bindings manager —
//! which reads the same declaration from the service's snapshot and makes the bindings — says
//! in its facet of the service that every one of them is ready. The App Store never sees a
//! credential: the bindings' secrets reach the app as the service's own.

use capstan_catalog::Template;
use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::store::{self, Batch};
use capstan_sdk::{Result, Value, json, runtime};

/// The capabilities a binding provides, as a template declares them.
pub const STORAGE: [&str; 2] = ["database", "objectstorage"];
/// Installed apps whose replicas wait for their bindings: id = service id, `{serviceId, needs}`.
pub const AWAITING: &str = "awaiting";
/// The gate's reason while they wait.
const PENDING: &str = "bindings-pending";

/// What of `template`'s capabilities a binding provides.
pub fn of(template: &Template) -> Vec<String> {
    template.capabilities.iter().filter(|c| STORAGE.contains(&c.as_str())).cloned().collect()
}

/// Gate the new service `service_id` until its bindings are ready (before its spec is set, so
/// no replica starts without its credentials), and remember to lift the gate.
pub fn gate(service_id: &str, needs: &[String]) -> Result<()> {
    runtime::set_service_gate(service_id, Some(PENDING))?;
    Batch::new().put(AWAITING, service_id, None, &json!({ "serviceId": service_id, "needs": needs })).commit()?;
    Ok(())
}

/// Whether the bindings manager's facet of a service (`facets.bindings`) shows a ready binding
/// of every kind in `needs`.
pub fn ready(facet: &Value, needs: &[String]) -> bool {
    let bindings = facet["bindings"].as_array().map(Vec::as_slice).unwrap_or_default();
    needs.iter().all(|need| bindings.iter().any(|b| b["kind"] == need.as_str() && b["state"] == "ready"))
}

/// Lift the gate of every awaiting app whose bindings are ready (forget a service that is gone);
/// how many were released.
pub fn release_ready() -> Result<usize> {
    let mut released = 0;
    let mut cursor = None;
    loop {
        let page = store::scan::<Value>(AWAITING, cursor.as_deref(), 100)?;
        for doc in page.documents {
            let needs: Vec<String> = serde_json::from_value(doc.data["needs"].clone()).unwrap_or_default();
            let service = inventory::get::<Value>(EntityKind::Service, &doc.id)?;
            let done = match &service {
                None => true,
                Some(s) if ready(&s.data["facets"]["bindings"], &needs) => {
                    runtime::set_service_gate(&doc.id, None)?;
                    released += 1;
                    true
                }
                Some(_) => false,
            };
            if done {
                Batch::new().delete(AWAITING, &doc.id, doc.revision).commit()?;
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(released),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_is_ready_once_every_kind_it_needs_has_a_ready_binding() {
        let needs = vec!["database".to_string(), "objectstorage".to_string()];
        let facet = json!({ "bindings": [{ "kind": "database", "state": "ready" }, { "kind": "objectstorage", "state": "pending" }] });
        assert!(!ready(&facet, &needs));
        let facet = json!({ "bindings": [{ "kind": "database", "state": "ready" }, { "kind": "objectstorage", "state": "ready" }] });
        assert!(ready(&facet, &needs));
        assert!(!ready(&Value::Null, &needs), "no facet yet: not ready");
        assert!(ready(&Value::Null, &[]), "nothing needed");
    }
}
