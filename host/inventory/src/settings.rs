//! The public settings document (`settings.*`): one allowlisted JSON object with a revision.
//! Credentials never live here: a credential-bearing key is refused `setting-is-secret` and
//! belongs in system secrets.

use super::Context;
use super::{SETTINGS, check_revision, emit, to_value, validate};
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::net::IpAddr;

/// The one settings document's id.
pub const PUBLIC: &str = "public";

/// How a setting's value is judged.
#[derive(Clone, Copy)]
enum Kind {
    /// An http(s) URL without user info.
    Url,
    /// A list of https URLs (loopback http allowed, for tests and local mirrors).
    HttpsUrls,
    /// A list of http(s) URLs.
    Urls,
    /// A host name or IP address.
    Host,
    /// A map from a node name to a host name or IP address.
    HostsByNode,
    Port,
    /// Whole days, 0–3650.
    Days,
    /// 1–128 of A-Z a-z 0-9 . _ -
    Identifier,
    /// Canonical IP prefixes such as 192.0.2.10/32.
    Prefixes,
    /// One of starttls, tls, none.
    TlsMode,
    /// A value-free descriptor object.
    Descriptor,
    /// A list of Ed25519 public keys in `capstan-ed25519:` form.
    PublicKeys,
}

/// Every setting Capstan accepts, with what it is for.
const ALLOWED: &[(&str, Kind, &str)] = &[
    ("appStoreCatalogSources", Kind::HttpsUrls, "Where the App Store asks for signed catalogs, in order"),
    ("appStoreTrustedCatalogKeys", Kind::PublicKeys, "Catalog signing keys the App Store trusts besides the ones it ships with"),
    ("backupExternalTarget", Kind::Descriptor, "Value-free backup target descriptor (credentials are system secrets)"),
    ("backupNodeCacheKeepDays", Kind::Days, "Days a node keeps its backup cache"),
    ("corebuildWorkerUrl", Kind::Url, "A build worker URL"),
    ("corebuildWorkerUrls", Kind::Urls, "Build worker URLs"),
    ("dcrouterGatewayUrl", Kind::Url, "External gateway URL (its credential is a system secret)"),
    ("dcrouterGatewayClientId", Kind::Identifier, "Stable gateway client id for route, DNS, certificate and mail calls"),
    ("dcrouterTargetHost", Kind::Host, "Where the gateway forwards workload traffic"),
    ("dcrouterTargetPort", Kind::Port, "The port the gateway forwards workload traffic to"),
    ("dcrouterTargetHostsByNode", Kind::HostsByNode, "Pinned route targets by node name"),
    ("dcrouterForwardSourceAddresses", Kind::Prefixes, "Source prefixes the gateway's forwarded connections arrive from"),
    ("dcrouterMailSubmissionHost", Kind::Host, "SMTP submission host for service mail"),
    ("dcrouterMailSubmissionPort", Kind::Port, "SMTP submission port for service mail"),
    ("dcrouterMailSubmissionTlsMode", Kind::TlsMode, "starttls, tls or none"),
    ("dcrouterMailForwardTargetHost", Kind::Host, "Gateway-reachable SMTP forward target for inbound mail"),
    ("dcrouterMailForwardTargetHostsByNode", Kind::HostsByNode, "SMTP forward targets by node name"),
    ("deploymentArchiveRetentionDays", Kind::Days, "Accepted for compatibility; Capstan keeps no archived deployments"),
];

/// Words that mark a key as credential-bearing, compared without case or separators.
const SECRET_WORDS: &[&str] = &["token", "secret", "password", "passwd", "credential", "apikey", "privatekey", "accesskey"];

fn is_secret_key(key: &str) -> bool {
    let folded: String = key.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| folded.contains(w))
}

/// Whether `key` is a setting that lists URLs (what an `http-setting:<key>` grant may name).
pub fn lists_urls(key: &str) -> bool {
    ALLOWED.iter().any(|(name, kind, _)| *name == key && matches!(kind, Kind::HttpsUrls | Kind::Urls))
}

/// The URLs the public setting `key` lists now (none when it is unset).
pub async fn urls(store: &capstan_store::Store, key: &str) -> Result<Vec<String>> {
    let doc = store.transact(|tx| async move { tx.get(SETTINGS, PUBLIC).await }).await?;
    let listed = doc.as_ref().and_then(|d| d.data.get(key)).and_then(Value::as_array).cloned().unwrap_or_default();
    Ok(listed.iter().filter_map(Value::as_str).map(str::to_string).collect())
}

/// Judge one key and value; refusals name the key, never the value.
fn check(key: &str, value: &Value) -> Result<()> {
    let shown: String = key.chars().take(64).collect();
    if is_secret_key(key) {
        return Err(Refusal::new(
            "setting-is-secret",
            format!("{shown} is a credential: store it as a system secret (capstan secrets set-system), never in settings"),
        )
        .with_data(json!({ "key": shown })));
    }
    let Some((_, kind, _)) = ALLOWED.iter().find(|(name, _, _)| *name == key) else {
        return Err(Refusal::new("setting-unknown", format!("{shown:?} is not a setting; settings.get lists them"))
            .with_data(json!({ "key": shown, "known": ALLOWED.iter().map(|(k, _, _)| k).collect::<Vec<_>>() })));
    };
    let bad =
        |what: &str| Refusal::new("setting-invalid", format!("{shown} must be {what}")).with_data(json!({ "key": shown, "field": shown }));
    let host_ok = |v: &Value| v.as_str().is_some_and(|h| h.parse::<IpAddr>().is_ok() || validate::is_hostname(h) || h == "localhost");
    match kind {
        Kind::Url => value.as_str().ok_or_else(|| bad("a URL")).and_then(|u| validate::url(key, u, false))?,
        Kind::Urls | Kind::HttpsUrls => {
            let https = matches!(kind, Kind::HttpsUrls);
            let list = value.as_array().filter(|l| l.len() <= 16).ok_or_else(|| bad("a list of at most 16 URLs"))?;
            for item in list {
                item.as_str().ok_or_else(|| bad("a list of URLs")).and_then(|u| validate::url(key, u, https))?;
            }
        }
        Kind::Host if !host_ok(value) => return Err(bad("a host name or IP address")),
        Kind::HostsByNode => {
            let map = value.as_object().filter(|m| m.len() <= 256).ok_or_else(|| bad("an object of node name to host"))?;
            if !map.iter().all(|(node, host)| !node.is_empty() && node.len() <= 63 && host_ok(host)) {
                return Err(bad("an object of node name to host"));
            }
        }
        Kind::Port if !value.as_u64().is_some_and(|p| (1..=65535).contains(&p)) => return Err(bad("a port 1–65535")),
        Kind::Days if value.as_u64().is_none_or(|d| d > 3650) => return Err(bad("whole days, 0–3650")),
        Kind::Identifier => {
            let ok = value
                .as_str()
                .is_some_and(|s| !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)));
            if !ok {
                return Err(bad("1–128 of A-Z a-z 0-9 . _ -"));
            }
        }
        Kind::Prefixes => {
            let list = value.as_array().filter(|l| l.len() <= 64).ok_or_else(|| bad("a list of at most 64 IP prefixes"))?;
            if !list.iter().all(|p| p.as_str().is_some_and(canonical_prefix)) {
                return Err(bad("canonical IP prefixes such as 192.0.2.10/32"));
            }
        }
        Kind::TlsMode if !matches!(value.as_str(), Some("starttls" | "tls" | "none")) => return Err(bad("one of starttls, tls, none")),
        Kind::PublicKeys => {
            let list = value.as_array().filter(|l| l.len() <= 16).ok_or_else(|| bad("a list of at most 16 public keys"))?;
            let parses = |k: &Value| k.as_str().is_some_and(|k| k.parse::<capstan_catalog::PublisherKey>().is_ok());
            if !list.iter().all(parses) {
                return Err(bad("public keys of the form capstan-ed25519:<43 base64url characters>"));
            }
        }
        Kind::Descriptor => {
            let map = value.as_object().ok_or_else(|| bad("an object"))?;
            if value.to_string().len() > 4096 {
                return Err(bad("an object of at most 4096 bytes"));
            }
            if let Some(inner) = map.keys().find(|k| is_secret_key(k)) {
                let inner: String = inner.chars().take(64).collect();
                return Err(Refusal::new("setting-is-secret", format!("{shown}.{inner} is a credential: store it as a system secret"))
                    .with_data(json!({ "key": format!("{shown}.{inner}") })));
            }
        }
        _ => {}
    }
    Ok(())
}

/// `address/length` with no bits set past the length.
fn canonical_prefix(text: &str) -> bool {
    let Some((address, length)) = text.split_once('/') else { return false };
    let (Ok(address), Ok(length)) = (address.parse::<IpAddr>(), length.parse::<u32>()) else { return false };
    match address {
        IpAddr::V4(v4) => length <= 32 && u32::from(v4).checked_shl(length).unwrap_or(0) == 0,
        IpAddr::V6(v6) => length <= 128 && u128::from(v6).checked_shl(length).unwrap_or(0) == 0,
    }
}

/// The public settings document as `settings.get` and `settings.update` answer it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SettingsView {
    /// 0 while nothing was ever set.
    pub revision: u64,
    /// The settings that are set, by key.
    pub settings: Map<String, Value>,
    /// Every key Capstan accepts, with what it is for.
    pub known: Vec<KnownSetting>,
}

/// One setting Capstan accepts.
#[derive(Debug, Serialize, JsonSchema)]
pub struct KnownSetting {
    /// The setting's key.
    pub key: &'static str,
    /// What the setting is for.
    pub summary: &'static str,
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

fn view(revision: u64, settings: Map<String, Value>) -> SettingsView {
    SettingsView { revision, settings, known: ALLOWED.iter().map(|(key, _, summary)| KnownSetting { key, summary }).collect() }
}

async fn get(cx: Context, _: Call, _: super::Empty) -> Result<SettingsView> {
    let doc = cx.store.transact(|tx| async move { tx.get(SETTINGS, PUBLIC).await }).await?;
    Ok(match doc {
        Some(doc) => view(doc.revision, doc.data.as_object().cloned().unwrap_or_default()),
        None => view(0, Map::new()),
    })
}

async fn update(cx: Context, _: Call, input: UpdateInput) -> Result<SettingsView> {
    for (key, value) in &input.set {
        if value.is_null() {
            let shown: String = key.chars().take(64).collect();
            return Err(Refusal::invalid_request(format!("{shown} is null: remove a setting with unset"))
                .with_data(json!({ "field": format!("set.{shown}") })));
        }
        check(key, value)?;
    }
    for key in &input.unset {
        if input.set.contains_key(key) {
            return Err(Refusal::invalid_request("a key is both set and unset").with_data(json!({ "field": "unset" })));
        }
        // unset of a key nothing could ever hold is a mistake worth naming (a credential's
        // included: it was never here)
        if !ALLOWED.iter().any(|(k, _, _)| k == key) {
            check(key, &Value::Null)?;
        }
    }
    let input = &input;
    let (revision, settings, changed) = cx
        .store
        .transact(|tx| async move {
            let current = tx.get(SETTINGS, PUBLIC).await?;
            let revision = current.as_ref().map_or(0, |d| d.revision);
            check_revision("settings", PUBLIC, input.expected_revision, revision)?;
            let mut settings = current.as_ref().and_then(|d| d.data.as_object().cloned()).unwrap_or_default();
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
            let doc = tx.put(SETTINGS, PUBLIC, current.map(|d| d.revision), to_value(&settings)?).await?;
            emit(&tx, "settings.updated", PUBLIC, json!({ "changed": changed })).await?;
            Ok((doc.revision, settings, changed))
        })
        .await?;
    if !changed.is_empty() {
        tracing::info!(changed = ?changed, "settings updated");
    }
    Ok(view(revision, settings))
}

/// Register the `settings.*` methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry.add("settings.get", "The public settings document, its revision and every key Capstan accepts", Access::Authenticated, get);
    registry.add(
        "settings.update",
        "Set and unset public settings with the expected revision (administrator); unknown keys and credentials are refused",
        Access::Admin,
        update,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_named_before_unknown_keys() {
        for key in [
            "dcrouterGatewayToken",
            "DCROUTER_GATEWAY_API_TOKEN",
            "HETZNER_TOKEN",
            "s3SecretKey",
            "smtpPassword",
            "BACKUP_EXTERNAL_TARGET_CREDENTIALS",
        ] {
            assert_eq!(check(key, &json!("x")).unwrap_err().code, "setting-is-secret", "{key}");
        }
        let err = check("colour", &json!("blue")).unwrap_err();
        assert_eq!(err.code, "setting-unknown");
        let err = check("backupExternalTarget", &json!({"bucket": "b", "secretKey": "hunter2"})).unwrap_err();
        assert_eq!(err.code, "setting-is-secret");
        assert!(!err.message.contains("hunter2"));
    }

    #[test]
    fn values_are_judged_by_kind() {
        assert!(check("appStoreCatalogSources", &json!(["https://catalog.example.com/c.json", "http://127.0.0.1:9/c"])).is_ok());
        let key = "capstan-ed25519:11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
        assert!(check("appStoreTrustedCatalogKeys", &json!([key])).is_ok());
        for bad in [json!(key), json!(["capstan-ed25519:short"]), json!([key.to_uppercase()])] {
            assert_eq!(check("appStoreTrustedCatalogKeys", &bad).unwrap_err().code, "setting-invalid", "{bad}");
        }
        assert_eq!(check("appStoreCatalogSources", &json!(["http://catalog.example.com/"])).unwrap_err().code, "setting-invalid");
        assert!(check("dcrouterTargetPort", &json!(443)).is_ok());
        assert!(check("dcrouterTargetPort", &json!(0)).is_err() && check("dcrouterTargetPort", &json!("443")).is_err());
        assert!(check("dcrouterForwardSourceAddresses", &json!(["192.0.2.10/32", "2001:db8::/32"])).is_ok());
        assert!(check("dcrouterForwardSourceAddresses", &json!(["192.0.2.10/24"])).is_err());
        assert!(check("dcrouterMailSubmissionTlsMode", &json!("starttls")).is_ok());
        assert!(check("dcrouterMailSubmissionTlsMode", &json!("ssl")).is_err());
        assert!(check("dcrouterTargetHostsByNode", &json!({"node-a": "10.0.0.1", "node-b": "gw.example.com"})).is_ok());
        assert!(check("dcrouterTargetHostsByNode", &json!({"node-a": 5})).is_err());
        assert!(check("backupNodeCacheKeepDays", &json!(7)).is_ok() && check("backupNodeCacheKeepDays", &json!(-1)).is_err());
    }
}
