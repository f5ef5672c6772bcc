//! Cluster relay names published at the gateway (docs/gateway-protocol.md, "DNS records"):
//! `relay.<cluster label>.<clusterRelayZone>` → the address the cluster's relay registered its
//! listener on, with a 60 s TTL, and only inside `gatewayDnsRecordAddresses` — the addresses the
//! client credential may publish for. A relay disabled, a cluster deleted or an address that
//! moved out of the allowance withdraws its record. What was published is kept beside the
//! enrollment record, so a withdrawal is known after a restart.

use super::{Context, ENROLLMENT, enrolled};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::settings::{self, CLUSTER_RELAY_ZONE, GATEWAY_DNS_RECORD_ADDRESSES};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::Store;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The TTL of a relay name's record, in seconds: a relay that moves is found again within it.
pub const TTL_SECONDS: u32 = 60;
/// What was published, in the enrollment's collection.
const PUBLISHED: &str = "relay-names";

/// A cluster relay's name and whether it is published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelayName {
    /// `relay.<cluster label>.<zone>`.
    pub name: String,
    /// The cluster whose relay it names.
    pub cluster_id: String,
    /// The address the relay registered its listener on, if it did.
    pub address: Option<String>,
    /// Whether the gateway holds the record now.
    pub published: bool,
    /// Why it is not published, when it is not.
    pub reason: Option<String>,
}

/// A record as published: its type and value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    #[serde(rename = "type")]
    kind: String,
    value: String,
}

/// The relay names as the settings, clusters and registrations say, each with the record it
/// should have (`None`: it should have none, `reason` says why).
async fn desired(store: &Store) -> Result<Vec<(RelayName, Option<Record>)>> {
    store
        .transact(|tx| async move {
            let settings = settings::current(&tx).await?;
            let Some(zone) = settings.get(CLUSTER_RELAY_ZONE).and_then(Value::as_str).map(str::to_string) else { return Ok(Vec::new()) };
            let allowed: Vec<capstan_core::net::IpNet> = settings
                .get(GATEWAY_DNS_RECORD_ADDRESSES)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .filter_map(|p| capstan_core::net::parse_networks(p).ok())
                .flatten()
                .collect();
            let mut out = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let page = tx.scan(capstan_inventory::CLUSTERS, cursor.as_deref(), capstan_store::MAX_PAGE).await?;
                for doc in page.documents {
                    if doc.data["relay"]["enabled"] != true {
                        continue;
                    }
                    let name = format!("relay.{}.{zone}", doc.id.replace('_', "-"));
                    let registration = tx.get(capstan_relays::registrations::REGISTRATIONS, &doc.id).await?;
                    let address = registration.and_then(|r| r.data["listenAddress"].as_str().map(str::to_string));
                    let (record, reason) = match address.as_deref().map(str::parse::<IpAddr>) {
                        None => (None, Some("the relay registered no listen address".to_string())),
                        Some(Err(_)) => (None, Some("the relay's listen address is not an IP address".to_string())),
                        Some(Ok(ip)) if !allowed.iter().any(|net| net.contains(&ip)) => {
                            (None, Some(format!("the relay's address {ip} is outside gatewayDnsRecordAddresses")))
                        }
                        Some(Ok(ip)) => {
                            (Some(Record { kind: if ip.is_ipv4() { "A" } else { "AAAA" }.into(), value: ip.to_string() }), None)
                        }
                    };
                    out.push((RelayName { name, cluster_id: doc.id.clone(), address, published: false, reason }, record));
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => return Ok(out),
                }
            }
        })
        .await
}

async fn published(store: &Store) -> Result<BTreeMap<String, Record>> {
    let doc = store.transact(|tx| async move { tx.get(ENROLLMENT, PUBLISHED).await }).await?;
    match doc {
        None => Ok(BTreeMap::new()),
        Some(doc) => serde_json::from_value(doc.data["records"].clone()).map_err(Refusal::internal),
    }
}

/// What a pass changed: the names it withdrew and the records it put.
fn changes(before: &BTreeMap<String, Record>, after: &BTreeMap<String, Record>) -> (Vec<String>, BTreeMap<String, Record>) {
    let withdrawn = before.keys().filter(|n| !after.contains_key(*n)).cloned().collect();
    let put = after.iter().filter(|(n, r)| before.get(*n) != Some(*r)).map(|(n, r)| (n.clone(), r.clone())).collect();
    (withdrawn, put)
}

/// Bring the gateway's relay-name records to what the clusters say: put each that is missing
/// or changed, delete each no longer wanted. Answers every relay name with its state.
pub async fn publish(cx: &Context) -> Result<Vec<RelayName>> {
    let (gateway_url, token) = enrolled(cx).await?;
    let wanted = desired(cx.store()).await?;
    let mut held = published(cx.store()).await?;
    let before = held.clone();
    let mut failure = None;
    let keep: BTreeMap<&str, &Record> = wanted.iter().filter_map(|(n, r)| r.as_ref().map(|r| (n.name.as_str(), r))).collect();
    for name in before.keys().filter(|n| !keep.contains_key(n.as_str())) {
        match cx.client.delete_dns_record(&gateway_url, &token, name).await {
            Ok(()) => {
                held.remove(name);
            }
            Err(e) => failure = Some(format!("withdrawing {name}: {e}")),
        }
    }
    for (name, record) in &keep {
        if held.get(*name) == Some(*record) {
            continue;
        }
        match cx.client.put_dns_record(&gateway_url, &token, name, &record.kind, &record.value, TTL_SECONDS).await {
            Ok(()) => {
                held.insert(name.to_string(), (*record).clone());
            }
            Err(e) => failure = Some(format!("publishing {name}: {e}")),
        }
    }
    if held != before {
        // Another publisher (the periodic pass, a call, another node) may have written since it
        // was read: apply this pass's changes onto what is stored now rather than overwrite it.
        let (withdrawn, put) = changes(&before, &held);
        let (withdrawn, put) = (&withdrawn, &put);
        held = cx
            .store()
            .transact(|tx| async move {
                let doc = tx.get(ENROLLMENT, PUBLISHED).await?;
                let mut now: BTreeMap<String, Record> = match &doc {
                    Some(doc) => serde_json::from_value(doc.data["records"].clone()).map_err(Refusal::internal)?,
                    None => BTreeMap::new(),
                };
                withdrawn.iter().for_each(|name| drop(now.remove(name)));
                now.extend(put.iter().map(|(n, r)| (n.clone(), r.clone())));
                let data = serde_json::json!({ "records": now });
                tx.put(ENROLLMENT, PUBLISHED, doc.map(|d| d.revision), data).await?;
                Ok(now)
            })
            .await?;
    }
    if let Some(failure) = failure {
        return Err(Refusal::new("gateway-unreachable", format!("relay names: {failure}")).retryable());
    }
    Ok(view(wanted, &held))
}

fn view(wanted: Vec<(RelayName, Option<Record>)>, held: &BTreeMap<String, Record>) -> Vec<RelayName> {
    wanted
        .into_iter()
        .map(|(mut name, record)| {
            name.published = record.is_some() && held.get(&name.name) == record.as_ref();
            if record.is_some() && !name.published {
                name.reason = Some("not published yet: the next sync publishes it".into());
            }
            name
        })
        .collect()
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Listing {
    items: Vec<RelayName>,
    /// Seconds a relay name's record lives at resolvers.
    ttl_seconds: u32,
}

async fn list(cx: Context, _: Call, _: capstan_secrets::methods::Empty) -> Result<Listing> {
    let wanted = desired(cx.store()).await?;
    let held = published(cx.store()).await?;
    Ok(Listing { items: view(wanted, &held), ttl_seconds: TTL_SECONDS })
}

async fn publish_now(cx: Context, _: Call, _: capstan_secrets::methods::Empty) -> Result<Listing> {
    Ok(Listing { items: publish(&cx).await?, ttl_seconds: TTL_SECONDS })
}

/// Register `domains.listRelayNames` and `domains.publishRelayNames`.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "domains.listRelayNames",
            "Every cluster relay's name, its address, and whether the gateway publishes it (and why not)",
            Access::Admin,
            list,
        )
        .read_only();
    registry
        .add(
            "domains.publishRelayNames",
            "Publish the relay names at the gateway now (60 s TTL, inside gatewayDnsRecordAddresses)",
            Access::Admin,
            publish_now,
        )
        .refuses(&["gateway-not-enrolled", "gateway-unreachable"]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_store::CollectionSpec;
    use serde_json::json;

    #[tokio::test]
    async fn a_relay_name_is_wanted_only_for_an_enabled_relay_registered_inside_the_allowance() {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap();
        let store = Store::new(sqlite, capstan_store::DEFAULT_BUDGET);
        for collection in [capstan_inventory::SETTINGS, capstan_inventory::CLUSTERS, capstan_relays::registrations::REGISTRATIONS] {
            store.declare(CollectionSpec::new(collection)).await.unwrap();
        }
        assert!(desired(&store).await.unwrap().is_empty(), "no relay zone: no names");
        let settings = json!({ "clusterRelayZone": "relays.example.com", "gatewayDnsRecordAddresses": ["10.0.0.0/8", "2001:db8::/32"] });
        let clusters = [
            ("cluster_a", true, Some("10.0.0.5")),
            ("cluster_b", true, Some("192.0.2.9")),
            ("cluster_c", true, None),
            ("cluster_d", false, Some("10.0.0.6")),
            ("cluster_e", true, Some("2001:db8::7")),
        ];
        store
            .transact(|tx| {
                let settings = settings.clone();
                async move {
                    tx.insert(capstan_inventory::SETTINGS, capstan_inventory::settings::PUBLIC, settings).await?;
                    for (id, enabled, address) in clusters {
                        tx.insert(capstan_inventory::CLUSTERS, id, json!({ "relay": { "enabled": enabled } })).await?;
                        if let Some(address) = address {
                            tx.insert(capstan_relays::registrations::REGISTRATIONS, id, json!({ "listenAddress": address })).await?;
                        }
                    }
                    Ok(())
                }
            })
            .await
            .unwrap();
        let wanted = desired(&store).await.unwrap();
        let names: Vec<(&str, Option<&Record>, Option<&str>)> =
            wanted.iter().map(|(n, r)| (n.name.as_str(), r.as_ref(), n.reason.as_deref())).collect();
        assert_eq!(names.len(), 4, "a disabled relay has no name: {names:?}");
        assert_eq!(names[0].0, "relay.cluster-a.relays.example.com");
        assert_eq!(names[0].1, Some(&Record { kind: "A".into(), value: "10.0.0.5".into() }));
        assert!(names[1].1.is_none() && names[1].2.unwrap().contains("192.0.2.9 is outside gatewayDnsRecordAddresses"));
        assert!(names[2].1.is_none() && names[2].2.unwrap().contains("no listen address"));
        assert_eq!(names[3].1, Some(&Record { kind: "AAAA".into(), value: "2001:db8::7".into() }));
    }

    #[test]
    fn a_published_name_shows_as_such_and_a_pending_one_says_so() {
        let name = |n: &str| RelayName {
            name: n.into(),
            cluster_id: "c".into(),
            address: Some("10.0.0.5".into()),
            published: false,
            reason: None,
        };
        let record = Record { kind: "A".into(), value: "10.0.0.5".into() };
        let held: BTreeMap<String, Record> = [("relay.a.z.example".to_string(), record.clone())].into();
        let shown = view(vec![(name("relay.a.z.example"), Some(record.clone())), (name("relay.b.z.example"), Some(record))], &held);
        assert!(shown[0].published && shown[0].reason.is_none());
        assert!(!shown[1].published && shown[1].reason.as_deref().unwrap().contains("not published yet"));
    }

    #[test]
    fn a_pass_changes_only_the_names_it_put_or_withdrew() {
        let a = Record { kind: "A".into(), value: "10.0.0.5".into() };
        let b = Record { kind: "A".into(), value: "10.0.0.6".into() };
        let before: BTreeMap<String, Record> =
            [("x".to_string(), a.clone()), ("y".to_string(), a.clone()), ("z".to_string(), a.clone())].into();
        let after: BTreeMap<String, Record> =
            [("x".to_string(), a.clone()), ("y".to_string(), b.clone()), ("w".to_string(), a.clone())].into();
        let (withdrawn, put) = changes(&before, &after);
        assert_eq!(withdrawn, vec!["z".to_string()]);
        assert_eq!(put, [("w".to_string(), a), ("y".to_string(), b)].into());
    }
}
