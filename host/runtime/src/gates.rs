//! Gates: a manager keeps a service's replicas from starting while something it provides for
//! them is not ready (a database binding being provisioned: `bindings-pending`). One gate per
//! (service, holder); while any waits, every target of the service waits with the lowest
//! holder's reason and decides nothing — no replica starts, none running stops. A gate goes with
//! its service.

use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result, valid_code as valid_reason};
use capstan_store::{CollectionSpec, Tx};
use serde_json::json;

/// The gates: id `<serviceId>~<holder>`, `{serviceId, holder, waiting, since}`.
pub const RUNTIME_GATES: &str = "runtime_gates";

/// The gates' collection.
pub fn collection() -> CollectionSpec {
    CollectionSpec::new(RUNTIME_GATES).index("by_service", &["serviceId"])
}

/// Set (`Some(reason)`) or lift (`None`) `holder`'s gate on the service, in the caller's
/// transaction; writes only when it changes. The service must exist (the caller checks it).
pub async fn set(tx: &Tx, service_id: &str, holder: &str, waiting: Option<&str>) -> Result<bool> {
    if let Some(reason) = waiting.filter(|r| !valid_reason(r)) {
        return Err(Refusal::new("invalid-request", format!("a gate's reason is a kebab-case code of 1 to 64 characters, not {reason:?}")));
    }
    let id = format!("{service_id}~{holder}");
    let stored = tx.get(RUNTIME_GATES, &id).await?;
    match (waiting, stored) {
        (None, None) => Ok(false),
        (None, Some(doc)) => tx.delete(RUNTIME_GATES, &id, doc.revision).await.map(|_| true),
        (Some(reason), Some(doc)) if doc.data["waiting"] == reason => Ok(false),
        (Some(reason), stored) => {
            let data = json!({ "serviceId": service_id, "holder": holder, "waiting": reason, "since": now_ms() });
            tx.put(RUNTIME_GATES, &id, stored.map(|d| d.revision), data).await.map(|_| true)
        }
    }
}

/// The reason the service's replicas wait for, if a gate holds them: the lowest holder's.
pub async fn waiting(tx: &Tx, service_id: &str) -> Result<Option<String>> {
    if !tx.is_declared(RUNTIME_GATES) {
        return Ok(None);
    }
    let mut gates = tx.find_all(RUNTIME_GATES, "by_service", &[json!(service_id)]).await?;
    gates.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(gates.first().and_then(|g| g.data["waiting"].as_str()).map(str::to_string))
}

/// Remove every gate of a removed service, in the caller's transaction.
pub async fn remove_service(tx: &Tx, service_id: &str) -> Result<()> {
    if !tx.is_declared(RUNTIME_GATES) {
        return Ok(());
    }
    for doc in tx.find_all(RUNTIME_GATES, "by_service", &[json!(service_id)]).await? {
        tx.delete(RUNTIME_GATES, &doc.id, doc.revision).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_a_short_kebab_case_code() {
        for good in ["bindings-pending", "a", "wait-2", "2-wait"] {
            assert!(valid_reason(good), "{good}");
        }
        for bad in ["", "Bindings", "-x", "x-", "a--b", "a b", "a_b", &"a".repeat(65)] {
            assert!(!valid_reason(bad), "{bad}");
        }
    }
}
