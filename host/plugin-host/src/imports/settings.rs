//! `settings`: the plugin's own settings — every key its `describe` declared, with the value an
//! operator set (`settings.update`, key `<pluginId>.<key>`) or the declared default. No
//! capability: a plugin always reads its own, and only its own.

use super::{CallData, WitResult, refusal, to_wit};
use crate::runtime::capstan::plugin::settings;
use crate::store::Store;
use serde_json::{Map, Value, json};
use std::sync::OnceLock;

/// Where the settings document lives (the inventory's `settings` collection, document `public`).
const SETTINGS: (&str, &str) = ("settings", "public");

/// What a plugin version reads its settings from: the store, and what its `describe` declared
/// (known once it ran).
pub(super) struct OwnSettings {
    pub(super) store: Store,
    pub(super) declared: OnceLock<Vec<DeclaredSetting>>,
}

/// One declared setting as the import needs it.
#[derive(Debug, Clone)]
pub struct DeclaredSetting {
    /// The key within the plugin.
    pub key: String,
    /// The value while none is set.
    pub default: Option<Value>,
}

/// The settings of `plugin` out of the settings document `stored`: each declared key's set
/// value, else its default; a key with neither is absent.
pub fn effective(plugin: &str, declared: &[DeclaredSetting], stored: Option<&Map<String, Value>>) -> Map<String, Value> {
    let mut out = Map::new();
    for setting in declared {
        let set = stored.and_then(|s| s.get(&format!("{plugin}.{}", setting.key)));
        if let Some(value) = set.or(setting.default.as_ref()) {
            out.insert(setting.key.clone(), value.clone());
        }
    }
    out
}

impl settings::Host for CallData {
    async fn get(&mut self) -> WitResult<String> {
        self.budget.call()?;
        if self.grant.describing {
            return Err(refusal("capability-denied", "describe must not use host imports".into(), json!({})));
        }
        let declared = self.grant.settings.declared.get().cloned().unwrap_or_default();
        let store = self.grant.settings.store.clone();
        let doc = store
            .transact(|tx| async move { if tx.is_declared(SETTINGS.0) { tx.get(SETTINGS.0, SETTINGS.1).await } else { Ok(None) } })
            .await
            .map_err(to_wit)?;
        let stored = doc.as_ref().and_then(|d| d.data.as_object());
        Ok(Value::Object(effective(self.plugin(), &declared, stored)).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_sees_its_declared_keys_set_or_defaulted_and_nothing_else() {
        let declared = vec![
            DeclaredSetting { key: "sources".into(), default: Some(json!([])) },
            DeclaredSetting { key: "keepDays".into(), default: Some(json!(7)) },
            DeclaredSetting { key: "banner".into(), default: None },
        ];
        let stored = json!({
            "example.sources": ["https://a.example"],
            "other.keepDays": 30,
            "keepDays": 99,
            "example.undeclared": true,
        });
        let seen = effective("example", &declared, stored.as_object());
        assert_eq!(Value::Object(seen), json!({ "sources": ["https://a.example"], "keepDays": 7 }));
        assert_eq!(Value::Object(effective("example", &declared, None)), json!({ "sources": [], "keepDays": 7 }));
    }
}
