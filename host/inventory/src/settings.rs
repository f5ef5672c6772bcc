//! The public settings document (`settings.*`): one JSON object with a revision, holding the
//! host's own settings (an allowlist) and the settings installed plugins declare, each under
//! `<pluginId>.<key>` and judged by the JSON Schema the plugin declared. Credentials never live
//! here: a credential-bearing key or member is refused `setting-is-secret` and belongs in
//! secrets.

use super::Context;
use super::{PluginSetting, SETTINGS, check_revision, emit, to_value, validate};
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The one settings document's id.
pub const PUBLIC: &str = "public";

/// How a host setting's value is judged.
#[derive(Clone, Copy)]
enum Kind {
    /// An http(s) URL without user info.
    Url,
    /// A list of http(s) URLs.
    Urls,
    /// Whole days, 0–3650.
    Days,
    /// Whole days, 1–3650.
    RetentionDays,
    /// Milliseconds, 1000–86400000 (a second to a day).
    Millis,
    /// A count, 1–1000.
    Count,
    /// A DNS zone: 2–127 labels of 1–63 of a-z 0-9 - (no leading or trailing -), at most 200
    /// bytes, lower case, no trailing dot.
    Zone,
    /// An identifier another system issued: 1–128 of A-Z a-z 0-9 . _ -.
    Identifier,
    /// A list of at most 64 IP networks (`10.0.0.0/8`; an address stands for itself).
    Prefixes,
}

/// The host setting naming the external gateway's origin (docs/gateway-protocol.md).
pub const GATEWAY_URL: &str = "gatewayUrl";
/// The host setting naming the gateway client Capstan enrolls as.
pub const GATEWAY_CLIENT_ID: &str = "gatewayClientId";
/// The host setting listing the addresses Capstan's gateway client may publish DNS records for
/// (the policy it is provisioned under).
pub const GATEWAY_DNS_RECORD_ADDRESSES: &str = "gatewayDnsRecordAddresses";
/// At most this many prefixes in [`GATEWAY_DNS_RECORD_ADDRESSES`] (the gateway's limit).
pub const MAX_GATEWAY_PREFIXES: usize = 64;

/// Whether `id` is an identifier another system may issue: 1–128 of `A-Z a-z 0-9 . _ -`, and
/// not `.` or `..` (it is a path segment of the other system's URLs).
pub fn is_identifier(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && id != "."
        && id != ".."
}

/// The public settings document as it stands, read in `tx` (empty while nothing was set).
pub async fn current(tx: &capstan_store::Tx) -> Result<Map<String, Value>> {
    if !tx.is_declared(SETTINGS) {
        return Ok(Map::new());
    }
    Ok(tx.get(SETTINGS, PUBLIC).await?.and_then(|d| d.data.as_object().cloned()).unwrap_or_default())
}

/// The host setting naming the DNS zone cluster relays are reached under
/// (`https://relay.<clusterId>.<zone>:8443`).
pub const CLUSTER_RELAY_ZONE: &str = "clusterRelayZone";

/// Whether `zone` is a DNS zone a relay origin may be minted under.
pub fn is_zone(zone: &str) -> bool {
    let labels: Vec<&str> = zone.split('.').collect();
    zone.len() <= 200
        && labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// The relay zone set now, read in `tx`; `None` while unset.
pub async fn relay_zone(tx: &capstan_store::Tx) -> Result<Option<String>> {
    if !tx.is_declared(SETTINGS) {
        return Ok(None);
    }
    let doc = tx.get(SETTINGS, PUBLIC).await?;
    Ok(doc.and_then(|d| d.data.get(CLUSTER_RELAY_ZONE).and_then(Value::as_str).map(str::to_string)).filter(|z| is_zone(z)))
}

/// The host setting saying how many days audit records are kept.
pub const AUDIT_RETENTION_DAYS: &str = "auditRetentionDays";

/// How many days audit records are kept: the setting `auditRetentionDays`, else
/// [`capstan_rpc::audit::DEFAULT_RETENTION_DAYS`].
pub async fn audit_retention_days(store: &capstan_store::Store) -> Result<u64> {
    days_or(store, AUDIT_RETENTION_DAYS, capstan_rpc::audit::DEFAULT_RETENTION_DAYS).await
}

/// The days a retention setting `key` holds (at least 1), else `default`.
pub async fn days_or(store: &capstan_store::Store, key: &str, default: u64) -> Result<u64> {
    let doc = store.transact(|tx| async move { if tx.is_declared(SETTINGS) { tx.get(SETTINGS, PUBLIC).await } else { Ok(None) } }).await?;
    let set = doc.and_then(|d| d.data.get(key).and_then(Value::as_u64)).filter(|days| *days >= 1);
    Ok(set.unwrap_or(default))
}

/// The host setting saying how many days workload logs are kept (the runtime's sweep reads it).
pub const RUNTIME_LOG_RETENTION_DAYS: &str = "runtimeLogRetentionDays";

/// The host setting saying how many snapshots of Capstan the scheduled task keeps in the bucket.
pub const SNAPSHOT_KEEP_LAST: &str = "snapshotKeepLast";

/// Snapshots kept in the bucket while `snapshotKeepLast` is unset.
pub const DEFAULT_SNAPSHOT_KEEP_LAST: usize = 7;

/// How many snapshots the scheduled task `host.snapshot` keeps: the setting `snapshotKeepLast`,
/// else [`DEFAULT_SNAPSHOT_KEEP_LAST`].
pub async fn snapshot_keep_last(store: &capstan_store::Store) -> Result<usize> {
    let doc = store.transact(|tx| async move { if tx.is_declared(SETTINGS) { tx.get(SETTINGS, PUBLIC).await } else { Ok(None) } }).await?;
    let set = doc.and_then(|d| d.data.get(SNAPSHOT_KEEP_LAST).and_then(Value::as_u64)).filter(|n| (1..=1000).contains(n));
    Ok(set.map(|n| n as usize).unwrap_or(DEFAULT_SNAPSHOT_KEEP_LAST))
}

/// Every host setting, with what it is for. A manager's settings are its plugin's to declare.
/// What the settings page says of keys kept only so that settings carried over stay valid.
pub const CARRIED_OVER: &str = "Kept so settings carried over from the earlier platform stay valid; Capstan reads nothing here";

const ALLOWED: &[(&str, Kind, &str)] = &[
    ("corebuildWorkerUrl", Kind::Url, CARRIED_OVER),
    ("corebuildWorkerUrls", Kind::Urls, CARRIED_OVER),
    ("deploymentArchiveRetentionDays", Kind::Days, CARRIED_OVER),
    (AUDIT_RETENTION_DAYS, Kind::RetentionDays, "How many days audit records are kept (1–3650, default 90); older ones are deleted daily"),
    (
        RUNTIME_LOG_RETENTION_DAYS,
        Kind::RetentionDays,
        "How many days workload logs are kept (1–3650, default 30): older batches, and attempts released longer ago, are let go",
    ),
    (
        SNAPSHOT_KEEP_LAST,
        Kind::Count,
        "How many snapshots of Capstan the task host.snapshot keeps in the blob store (1–1000, default 7); older ones are deleted, oldest first",
    ),
    (
        "nodeObservationFreshnessMs",
        Kind::Millis,
        "How long a node's accepted report stands (milliseconds, default 180000); past it the node reads offline",
    ),
    (
        CLUSTER_RELAY_ZONE,
        Kind::Zone,
        "The DNS zone cluster relays are reached under: a relay's origin is https://relay.<clusterId>.<zone>:8443",
    ),
    (GATEWAY_URL, Kind::Url, "The external gateway's origin; its credential enters only through gateway.bootstrapCredential"),
    (GATEWAY_CLIENT_ID, Kind::Identifier, "The gateway client Capstan enrolls as at the external gateway (needs gatewayUrl)"),
    (
        GATEWAY_DNS_RECORD_ADDRESSES,
        Kind::Prefixes,
        "The address prefixes (at most 64) Capstan's gateway client may publish DNS records for; a change needs a new gateway bootstrap",
    ),
];

/// Whether `key` is a host setting that lists URLs (what an `http-setting:<key>` grant may name
/// besides the plugin's own settings).
pub fn lists_urls(key: &str) -> bool {
    ALLOWED.iter().any(|(name, kind, _)| *name == key && matches!(kind, Kind::Urls))
}

/// The URLs the setting `key` holds now (a URL or a list of them); `None` when it is unset.
pub async fn urls(store: &capstan_store::Store, key: &str) -> Result<Option<Vec<String>>> {
    let doc = store.transact(|tx| async move { if tx.is_declared(SETTINGS) { tx.get(SETTINGS, PUBLIC).await } else { Ok(None) } }).await?;
    Ok(doc.as_ref().and_then(|d| d.data.get(key)).map(capstan_core::net::urls_in))
}

/// `setting-is-secret` for `shown`, naming the key or member (never the value).
fn secret(shown: &str) -> Refusal {
    Refusal::new(
        "setting-is-secret",
        format!("{shown} is a credential: store it as a secret (capstan secrets set-system), never in settings"),
    )
    .with_data(json!({ "key": shown }))
}

/// Judge one key and value against the host's allowlist and `plugins`' declarations;
/// refusals name the key, never the value.
fn check(key: &str, value: &Value, plugins: &[PluginSetting], dependents: &dyn super::Dependents) -> Result<()> {
    let shown: String = key.chars().take(96).collect();
    if capstan_core::text::names_a_credential(key) {
        return Err(secret(&shown));
    }
    if let Some(setting) = plugins.iter().find(|s| s.full_key() == key) {
        return dependents.check_plugin_setting(setting, value);
    }
    let Some((_, kind, _)) = ALLOWED.iter().find(|(name, _, _)| *name == key) else {
        let known: Vec<String> = ALLOWED.iter().map(|(k, _, _)| k.to_string()).chain(plugins.iter().map(PluginSetting::full_key)).collect();
        return Err(Refusal::new("setting-unknown", format!("{shown:?} is not a setting; settings.get lists them"))
            .with_data(json!({ "key": shown, "known": known })));
    };
    let bad =
        |what: &str| Refusal::new("setting-invalid", format!("{shown} must be {what}")).with_data(json!({ "key": shown, "field": shown }));
    match kind {
        Kind::Url => value.as_str().ok_or_else(|| bad("a URL")).and_then(|u| validate::url(key, u, false))?,
        Kind::Urls => {
            let list = value.as_array().filter(|l| l.len() <= 16).ok_or_else(|| bad("a list of at most 16 URLs"))?;
            for item in list {
                item.as_str().ok_or_else(|| bad("a list of URLs")).and_then(|u| validate::url(key, u, false))?;
            }
        }
        Kind::Days if value.as_u64().is_none_or(|d| d > 3650) => return Err(bad("whole days, 0–3650")),
        Kind::Days => {}
        Kind::RetentionDays if value.as_u64().is_none_or(|d| !(1..=3650).contains(&d)) => return Err(bad("whole days, 1–3650")),
        Kind::RetentionDays => {}
        Kind::Millis if value.as_u64().is_none_or(|ms| !(1000..=86_400_000).contains(&ms)) => {
            return Err(bad("milliseconds, 1000–86400000"));
        }
        Kind::Millis => {}
        Kind::Count if value.as_u64().is_none_or(|n| !(1..=1000).contains(&n)) => return Err(bad("a whole number, 1–1000")),
        Kind::Count => {}
        Kind::Zone if value.as_str().is_none_or(|z| !is_zone(z)) => {
            return Err(bad("a DNS zone: lower-case labels of a-z 0-9 - joined by dots, at least two, no trailing dot"));
        }
        Kind::Zone => {}
        Kind::Identifier if value.as_str().is_none_or(|id| !is_identifier(id)) => return Err(bad("1–128 of A-Z a-z 0-9 . _ -")),
        Kind::Identifier => {}
        Kind::Prefixes => {
            let list =
                value.as_array().filter(|l| l.len() <= MAX_GATEWAY_PREFIXES).ok_or_else(|| bad("a list of at most 64 IP networks"))?;
            for item in list {
                let text = item.as_str().ok_or_else(|| bad("a list of IP networks"))?;
                if text.contains(',') || !capstan_core::net::parse_networks(text).is_ok_and(|n| n.len() == 1) {
                    return Err(bad("a list of IP networks (address/prefix)"));
                }
            }
        }
    }
    Ok(())
}

/// What holds between keys: a gateway client id names a client of a gateway, so it needs the
/// gateway's URL.
fn check_together(settings: &Map<String, Value>) -> Result<()> {
    if settings.contains_key(GATEWAY_CLIENT_ID) && !settings.contains_key(GATEWAY_URL) {
        return Err(Refusal::new("setting-invalid", format!("{GATEWAY_CLIENT_ID} needs {GATEWAY_URL}: set both"))
            .with_data(json!({ "key": GATEWAY_CLIENT_ID, "field": GATEWAY_URL })));
    }
    Ok(())
}

/// The public settings document as `settings.get` and `settings.update` answer it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SettingsView {
    /// 0 while nothing was ever set.
    pub revision: u64,
    /// The settings that are set, by key.
    pub settings: Map<String, Value>,
    /// Every key Capstan accepts now: the host's, then each installed plugin's.
    pub known: Vec<KnownSetting>,
}

/// One setting Capstan accepts.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KnownSetting {
    /// The setting's key (`<pluginId>.<key>` for a plugin's).
    pub key: String,
    /// What the setting is for.
    pub summary: String,
    /// The plugin that declares it; none for the host's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// The JSON Schema its value must match (a plugin's setting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Its value while none is set (a plugin's setting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

/// Input of `settings.update`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpdateInput {
    /// The revision `settings.get` answered (0 when nothing was ever set).
    pub expected_revision: u64,
    /// Keys to set to these values.
    #[serde(default)]
    pub set: Map<String, Value>,
    /// Keys to remove.
    #[serde(default)]
    pub unset: Vec<String>,
}

fn view(revision: u64, settings: Map<String, Value>, plugins: Vec<PluginSetting>) -> SettingsView {
    let host = ALLOWED.iter().map(|(key, _, summary)| KnownSetting {
        key: key.to_string(),
        summary: summary.to_string(),
        plugin: None,
        schema: None,
        default: None,
    });
    let declared = plugins.into_iter().map(|s| KnownSetting {
        key: s.full_key(),
        summary: s.summary,
        plugin: Some(s.plugin),
        schema: Some(s.schema),
        default: s.default,
    });
    SettingsView { revision, settings, known: host.chain(declared).collect() }
}

async fn get(cx: Context, _: Call, _: super::Empty) -> Result<SettingsView> {
    let dependents = cx.dependents.clone();
    let (doc, plugins) = cx
        .store
        .transact(|tx| {
            let dependents = dependents.clone();
            async move { Ok((tx.get(SETTINGS, PUBLIC).await?, dependents.plugin_settings(&tx).await?)) }
        })
        .await?;
    Ok(match doc {
        Some(doc) => view(doc.revision, doc.data.as_object().cloned().unwrap_or_default(), plugins),
        None => view(0, Map::new(), plugins),
    })
}

async fn update(cx: Context, _: Call, input: UpdateInput) -> Result<SettingsView> {
    let dependents = cx.dependents.clone();
    let plugins = cx.store.transact(|tx| {
        let dependents = dependents.clone();
        async move { dependents.plugin_settings(&tx).await }
    });
    let plugins = plugins.await?;
    for (key, value) in &input.set {
        if value.is_null() {
            let shown: String = key.chars().take(96).collect();
            return Err(Refusal::invalid_request(format!("{shown} is null: remove a setting with unset"))
                .with_data(json!({ "field": format!("set.{shown}") })));
        }
        check(key, value, &plugins, &*cx.dependents)?;
    }
    for key in &input.unset {
        if input.set.contains_key(key) {
            return Err(Refusal::invalid_request("a key is both set and unset").with_data(json!({ "field": "unset" })));
        }
    }
    let (input, plugins, dependents) = (&input, &plugins, &*cx.dependents);
    let (revision, settings, changed) = cx
        .store
        .transact(|tx| async move {
            let current = tx.get(SETTINGS, PUBLIC).await?;
            let revision = current.as_ref().map_or(0, |d| d.revision);
            check_revision("settings", PUBLIC, input.expected_revision, revision)?;
            let mut settings = current.as_ref().and_then(|d| d.data.as_object().cloned()).unwrap_or_default();
            // an unset of a key nothing holds and nothing declares is a mistake worth naming (a
            // plugin's setting that outlived its plugin may still be removed)
            for key in &input.unset {
                if !settings.contains_key(key) && !ALLOWED.iter().any(|(k, _, _)| k == key) && !plugins.iter().any(|s| s.full_key() == *key)
                {
                    check(key, &Value::Null, plugins, dependents)?;
                }
            }
            let mut changed = Vec::new();
            for (key, value) in &input.set {
                if settings.get(key) != Some(value) {
                    settings.insert(key.clone(), value.clone());
                    changed.push(key.clone());
                }
            }
            for key in &input.unset {
                if settings.remove(key).is_some() {
                    changed.push(key.clone());
                }
            }
            if changed.is_empty() {
                return Ok((revision, settings, changed));
            }
            check_together(&settings)?;
            let doc = tx.put(SETTINGS, PUBLIC, current.map(|d| d.revision), to_value(&settings)?).await?;
            emit(&tx, "settings.updated", PUBLIC, json!({ "changed": changed })).await?;
            Ok((doc.revision, settings, changed))
        })
        .await?;
    if !changed.is_empty() {
        tracing::info!(changed = ?changed, "settings updated");
    }
    Ok(view(revision, settings, plugins.clone()))
}

/// Register the `settings.*` methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add("settings.get", "The public settings document, its revision and every key Capstan accepts", Access::Authenticated, get)
        .read_only();
    registry
        .add(
            "settings.update",
            "Set and unset public settings with the expected revision (administrator); unknown keys and credentials are refused",
            Access::Admin,
            update,
        )
        .refuses(&["setting-is-secret", "setting-unknown", "setting-invalid", "conflict"]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_store::Tx;

    /// Plugin settings judged as the plugin host would: here, only strings fit.
    struct Strings;

    #[async_trait::async_trait]
    impl super::super::Dependents for Strings {
        async fn organization_blocker(&self, _: &Tx, _: &str, _: &str) -> Result<Option<Refusal>> {
            Ok(None)
        }
        async fn service_removed(&self, _: &Tx, _: &str) -> Result<()> {
            Ok(())
        }
        async fn holder_present(&self, _: &Tx, _: &str) -> Result<bool> {
            Ok(true)
        }
        async fn plugin_settings(&self, _: &Tx) -> Result<Vec<PluginSetting>> {
            Ok(vec![])
        }
        fn check_plugin_setting(&self, setting: &PluginSetting, value: &Value) -> Result<()> {
            match value.is_string() {
                true => Ok(()),
                false => Err(Refusal::new("setting-invalid", format!("{} must be text", setting.full_key()))),
            }
        }
    }

    fn declared() -> Vec<PluginSetting> {
        vec![PluginSetting {
            plugin: "mail".into(),
            key: "submissionHost".into(),
            summary: "s".into(),
            schema: json!({"type": "string"}),
            default: None,
        }]
    }

    fn code(key: &str, value: Value) -> String {
        check(key, &value, &declared(), &Strings).map_or_else(|e| e.code.to_string(), |()| "ok".into())
    }

    #[test]
    fn secrets_are_named_before_unknown_keys() {
        for key in ["dcrouterGatewayToken", "DCROUTER_GATEWAY_API_TOKEN", "HETZNER_TOKEN", "s3SecretKey", "mail.smtpPassword"] {
            assert_eq!(code(key, json!("x")), "setting-is-secret", "{key}");
        }
        assert_eq!(code("colour", json!("blue")), "setting-unknown");
        assert_eq!(code("appStoreCatalogSources", json!([])), "setting-unknown", "a manager's settings are its plugin's");
        assert_eq!(code("mail.other", json!("x")), "setting-unknown", "only what the plugin declares");
    }

    #[test]
    fn host_values_are_judged_by_kind_and_plugin_values_by_their_plugin() {
        assert_eq!(code("corebuildWorkerUrls", json!(["https://w.example.com/", "http://127.0.0.1:9/"])), "ok");
        assert_eq!(code("corebuildWorkerUrls", json!("https://w.example.com/")), "setting-invalid");
        assert_eq!(code("corebuildWorkerUrl", json!("ftp://w.example.com/")), "setting-invalid");
        assert_eq!(code("deploymentArchiveRetentionDays", json!(7)), "ok");
        assert_eq!(code("deploymentArchiveRetentionDays", json!(-1)), "setting-invalid");
        assert_eq!(code("auditRetentionDays", json!(30)), "ok");
        for days in [json!(0), json!(3651), json!("30")] {
            assert_eq!(code("auditRetentionDays", days), "setting-invalid");
        }
        assert_eq!(code("snapshotKeepLast", json!(3)), "ok");
        for count in [json!(0), json!(1001), json!("3"), json!(2.5)] {
            assert_eq!(code("snapshotKeepLast", count), "setting-invalid");
        }
        assert_eq!(code("mail.submissionHost", json!("smtp.example.com")), "ok");
        assert_eq!(code("mail.submissionHost", json!(25)), "setting-invalid");
    }

    #[test]
    fn gateway_settings_are_an_origin_a_client_id_and_at_most_64_prefixes() {
        assert_eq!(code(GATEWAY_URL, json!("https://gw.example.com")), "ok");
        assert_eq!(code(GATEWAY_CLIENT_ID, json!("capstan-prod.1")), "ok");
        for id in [json!(""), json!(".."), json!("has space"), json!("x".repeat(129)), json!(7)] {
            assert_eq!(code(GATEWAY_CLIENT_ID, id), "setting-invalid");
        }
        assert_eq!(code(GATEWAY_DNS_RECORD_ADDRESSES, json!(["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"])), "ok");
        let many: Vec<String> = (0..65).map(|i| format!("10.0.{i}.0/24")).collect();
        for prefixes in [json!(many), json!("10.0.0.0/8"), json!(["10.0.0.0/33"]), json!(["10.0.0.0/8, 10.1.0.0/16"]), json!([""])] {
            assert_eq!(code(GATEWAY_DNS_RECORD_ADDRESSES, prefixes), "setting-invalid");
        }
        let mut settings = Map::new();
        settings.insert(GATEWAY_CLIENT_ID.into(), json!("c"));
        assert_eq!(check_together(&settings).unwrap_err().code, "setting-invalid", "a client id without a URL");
        settings.insert(GATEWAY_URL.into(), json!("https://gw.example.com"));
        assert!(check_together(&settings).is_ok());
    }
}
