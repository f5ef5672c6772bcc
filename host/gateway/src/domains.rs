//! Domains: the zones an administrator registered with Capstan, and the domains the external
//! gateway makes available to Capstan's client, synced in with the enrolled credential
//! (`GET /v1/domains`, docs/gateway-protocol.md). One document per domain name in
//! [`DOMAINS`]; the state of the last sync is kept beside the enrollment record.

use super::{Context, ENROLLMENT, enrolled};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::{CollectionSpec, Store};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The domains, by name.
pub const DOMAINS: &str = "gateway_domains";
/// The last sync's state, in the enrollment's collection.
const SYNC: &str = "domains-sync";
/// At most this many domains are taken from one gateway answer.
const MAX_DOMAINS: usize = 1000;

/// Declare the domains' collection.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(CollectionSpec::new(DOMAINS)).await
}

/// A domain Capstan knows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Domain {
    /// The domain name (lowercase).
    pub name: String,
    /// An administrator registered it with `domains.register`.
    pub registered: bool,
    /// Who registered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_by: Option<String>,
    /// When it was registered (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_at: Option<u64>,
    /// The gateway listed it as available to Capstan at the last sync.
    pub at_gateway: bool,
    /// The gateway says it is verified for Capstan's client.
    pub verified: bool,
    /// When the gateway last listed it (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_at: Option<u64>,
}

/// How the last sync went.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncState {
    /// When the gateway last answered (ms).
    pub synced_at: Option<u64>,
    /// Why the last attempt failed, when it did (value-free).
    pub failure: Option<String>,
    /// How many domains the gateway listed then.
    pub listed: usize,
}

/// Sync the gateway's domains in now: every domain it lists is recorded `atGateway`, one it no
/// longer lists is not (and is forgotten unless registered). Refused `gateway-not-enrolled`
/// while Capstan holds no finalized credential, `gateway-unreachable` and
/// `gateway-domains-refused` when the gateway does not answer with a listing.
pub async fn sync(cx: &Context) -> Result<SyncState> {
    let _one = cx.syncing.lock().await;
    let (gateway_url, token) = enrolled(cx).await?;
    let listed = match cx.client.domains(&gateway_url, &token).await {
        Ok(listed) => listed,
        Err(failure) => {
            let refusal = match failure {
                super::client::Failure::Unreachable { .. } | super::client::Failure::Unavailable { .. } => {
                    Refusal::new("gateway-unreachable", format!("the gateway's domains could not be read: {failure}")).retryable()
                }
                other => Refusal::new("gateway-domains-refused", format!("the gateway did not list its domains: {other}")),
            };
            record_sync(cx.store(), |state| state.failure = Some(refusal.message.clone())).await?;
            return Err(refusal);
        }
    };
    let at = now_ms();
    let listed: BTreeMap<String, bool> = listed.into_iter().take(MAX_DOMAINS).collect();
    let count = listed.len();
    let listed = &listed;
    cx.store()
        .transact(|tx| async move {
            let mut seen = std::collections::BTreeSet::new();
            let mut cursor: Option<String> = None;
            loop {
                let page = tx.scan(DOMAINS, cursor.as_deref(), 500).await?;
                for doc in page.documents {
                    let mut domain: Domain = serde_json::from_value(doc.data.clone()).map_err(Refusal::internal)?;
                    seen.insert(domain.name.clone());
                    let next = match listed.get(&domain.name) {
                        Some(verified) => Domain { at_gateway: true, verified: *verified, synced_at: Some(at), ..domain.clone() },
                        None if domain.registered => Domain { at_gateway: false, verified: false, ..domain.clone() },
                        None => {
                            tx.delete(DOMAINS, &doc.id, doc.revision).await?;
                            continue;
                        }
                    };
                    if next != domain {
                        domain = next;
                        tx.replace(DOMAINS, &doc.id, doc.revision, to_value(&domain)?).await?;
                    }
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            for (name, verified) in listed.iter().filter(|(name, _)| !seen.contains(*name)) {
                let domain = Domain {
                    name: name.clone(),
                    registered: false,
                    registered_by: None,
                    registered_at: None,
                    at_gateway: true,
                    verified: *verified,
                    synced_at: Some(at),
                };
                tx.insert(DOMAINS, name, to_value(&domain)?).await?;
            }
            Ok(())
        })
        .await?;
    record_sync(cx.store(), |state| *state = SyncState { synced_at: Some(at), failure: None, listed: count }).await
}

/// Apply `change` to the kept sync state, on every attempt of the transaction: a retried
/// attempt (a conflict, a busy store) must not write the state back unchanged — that once kept a
/// success recorded over the failure that followed it.
async fn record_sync(store: &Store, change: impl Fn(&mut SyncState) + Send + Sync) -> Result<SyncState> {
    let change = &change;
    store
        .transact(|tx| async move {
            let held = tx.get(ENROLLMENT, SYNC).await?;
            let mut state: SyncState = match &held {
                Some(doc) => serde_json::from_value(doc.data.clone()).map_err(Refusal::internal)?,
                None => SyncState::default(),
            };
            change(&mut state);
            tx.put(ENROLLMENT, SYNC, held.map(|d| d.revision), to_value(&state)?).await?;
            Ok(state)
        })
        .await
}

fn to_value(value: &impl Serialize) -> Result<Value> {
    serde_json::to_value(value).map_err(Refusal::internal)
}

/// Whether `name` is a domain name: at least two lowercase labels of a-z 0-9 - (none starting
/// or ending with -), at most 200 bytes, no trailing dot — the relay zone's rule.
pub fn is_domain(name: &str) -> bool {
    capstan_inventory::settings::is_zone(name)
}

// ---- methods ----

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NameInput {
    /// A domain name such as `example.com`.
    name: String,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Listing {
    items: Vec<Domain>,
    sync: SyncState,
}

async fn list(cx: Context, _: Call, _: capstan_secrets::methods::Empty) -> Result<Listing> {
    let store = cx.store();
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store.transact(|tx| {
            let cursor = cursor.clone();
            async move { tx.scan(DOMAINS, cursor.as_deref(), 500).await }
        });
        let page = page.await?;
        for doc in page.documents {
            items.push(serde_json::from_value(doc.data).map_err(Refusal::internal)?);
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let sync = store.transact(|tx| async move { tx.get(ENROLLMENT, SYNC).await }).await?;
    let sync = sync.map(|d| serde_json::from_value(d.data)).transpose().map_err(Refusal::internal)?.unwrap_or_default();
    Ok(Listing { items, sync })
}

async fn register_domain(cx: Context, call: Call, input: NameInput) -> Result<Domain> {
    let name = input.name.trim_end_matches('.').to_string();
    if !is_domain(&name) {
        return Err(
            Refusal::new("domain-invalid", "name must be a lowercase domain name like example.com").with_data(json!({"field": "name"}))
        );
    }
    let by = call.identity.as_ref().map(|i| i.user_id.clone());
    let (name_ref, by_ref) = (&name, &by);
    cx.store()
        .transact(|tx| async move {
            let held = tx.get(DOMAINS, name_ref).await?;
            let mut domain = match &held {
                Some(doc) => serde_json::from_value::<Domain>(doc.data.clone()).map_err(Refusal::internal)?,
                None => Domain {
                    name: name_ref.clone(),
                    registered: false,
                    registered_by: None,
                    registered_at: None,
                    at_gateway: false,
                    verified: false,
                    synced_at: None,
                },
            };
            if domain.registered {
                return Ok(domain);
            }
            domain.registered = true;
            domain.registered_by = by_ref.clone();
            domain.registered_at = Some(now_ms());
            tx.put(DOMAINS, name_ref, held.map(|d| d.revision), to_value(&domain)?).await?;
            Ok(domain)
        })
        .await
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Unregistered {
    name: String,
    unregistered: bool,
}

async fn unregister(cx: Context, _: Call, input: NameInput) -> Result<Unregistered> {
    let name = &input.name;
    if !is_domain(name) {
        return Err(
            Refusal::new("domain-invalid", "name must be a lowercase domain name like example.com").with_data(json!({"field": "name"}))
        );
    }
    let unregistered = cx
        .store()
        .transact(|tx| async move {
            let Some(doc) = tx.get(DOMAINS, name).await? else { return Ok(false) };
            let mut domain: Domain = serde_json::from_value(doc.data.clone()).map_err(Refusal::internal)?;
            if !domain.registered {
                return Ok(false);
            }
            if domain.at_gateway {
                domain.registered = false;
                domain.registered_by = None;
                domain.registered_at = None;
                tx.replace(DOMAINS, name, doc.revision, to_value(&domain)?).await?;
            } else {
                tx.delete(DOMAINS, name, doc.revision).await?;
            }
            Ok(true)
        })
        .await?;
    Ok(Unregistered { name: input.name, unregistered })
}

async fn sync_now(cx: Context, _: Call, _: capstan_secrets::methods::Empty) -> Result<SyncState> {
    sync(&cx).await
}

/// Register the `domains.*` methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "domains.list",
            "Every domain: registered by an administrator, available at the gateway, or both; and the last sync",
            Access::Admin,
            list,
        )
        .read_only();
    registry
        .add(
            "domains.register",
            "Register a zone with Capstan (administrator); registering it again changes nothing",
            Access::Admin,
            register_domain,
        )
        .refuses(&["domain-invalid"]);
    registry
        .add("domains.unregister", "Forget a registered zone (one the gateway lists stays, as the gateway's)", Access::Admin, unregister)
        .refuses(&["domain-invalid"]);
    registry
        .add("domains.sync", "Read the gateway's available domains now with Capstan's gateway credential", Access::Admin, sync_now)
        .refuses(&["gateway-not-enrolled", "gateway-unreachable", "gateway-domains-refused"]);
}
