//! Certificates through the gateway (docs/gateway-protocol.md, "Certificates"): Capstan issues
//! none itself. `domains.fetchCertificate {name}` answers the gateway's certificate and key for
//! exactly `name`, asked with Capstan's client credential on every call — asking is what renews
//! it at the gateway, and Capstan keeps no copy.
//!
//! A name in the relay namespace (`relay.<cluster label>.<clusterRelayZone>`) is one cluster's:
//! its certificate goes to an administrator or to that cluster's own machine identity (its
//! relay), anyone else is refused `relay-certificate-not-owned`. A relay name whose relay is not
//! enabled or whose cluster does not exist, and any wildcard covering a relay name, is
//! `relay-name-reserved` whoever asks: a certificate issued for it would still be valid once a
//! relay carries the name. Every other name is an administrator's to fetch.

use super::client::Failure;
use super::{Context, enrolled};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::services::relay_namespace;
use capstan_inventory::settings::{self, CLUSTER_RELAY_ZONE};
use capstan_rpc::{Access, Call, Identity, Registry};
use capstan_store::Store;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How long a caller waits before asking again for a certificate the gateway is still issuing.
pub const PENDING_RETRY_MS: u64 = 5_000;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Input {
    /// The exact name: a lowercase DNS name, or `*.` and one.
    name: String,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Output {
    name: String,
    /// The certificate chain, PEM, the name's own first.
    certificate: String,
    /// Its private key, PEM (a secret: write it where only its server reads it).
    private_key: String,
    /// When the certificate stops being valid, milliseconds since the epoch; ask again before.
    not_after: u64,
}

/// Whose certificate a name is.
#[derive(Debug, PartialEq)]
enum Holder {
    /// An enabled relay's name: its cluster's, reached by its machine user.
    Cluster { cluster_id: String, machine_user_id: String },
    /// Any other name: administrators fetch it.
    Administrators,
}

/// Whether `name` is a name a certificate is asked for: a DNS name or a wildcard of one.
fn is_certificate_name(name: &str) -> bool {
    settings::is_zone(name.strip_prefix("*.").unwrap_or(name))
}

/// Who holds `name`, as the relay zone and the clusters say now.
async fn holder(store: &Store, name: &str) -> Result<Holder> {
    store
        .transact(|tx| async move {
            let settings = settings::current(&tx).await?;
            let Some(zone) = settings.get(CLUSTER_RELAY_ZONE).and_then(Value::as_str) else { return Ok(Holder::Administrators) };
            let Some((label, wildcard)) = relay_namespace(name, zone) else { return Ok(Holder::Administrators) };
            let reserved = |why: &str| {
                Refusal::new("relay-name-reserved", format!("{name} is in the relay namespace of {zone}: {why}"))
                    .with_data(json!({ "name": name, "zone": zone }))
            };
            if wildcard {
                return Err(reserved("a wildcard covering a relay name is never issued"));
            }
            let cluster = match tx.get(capstan_inventory::CLUSTERS, &label.replace('-', "_")).await {
                Err(refusal) if refusal.is("invalid-id") => None,
                read => read?,
            };
            match cluster {
                Some(doc) if doc.id.replace('_', "-") == label && doc.data["relay"]["enabled"] == true => Ok(Holder::Cluster {
                    machine_user_id: doc.data["machineUserId"].as_str().unwrap_or_default().to_string(),
                    cluster_id: doc.id,
                }),
                _ => Err(reserved("no cluster with an enabled relay carries it")),
            }
        })
        .await
}

/// Whether `identity` may have the certificate of a name `holder` holds.
fn may_fetch(holder: &Holder, identity: &Identity, name: &str) -> Result<()> {
    if identity.is_human_admin() {
        return Ok(());
    }
    match holder {
        Holder::Cluster { machine_user_id, .. } if identity.kind == "machine" && identity.user_id == *machine_user_id => Ok(()),
        Holder::Cluster { cluster_id, .. } => Err(Refusal::new(
            "relay-certificate-not-owned",
            format!("{name} is the relay name of cluster {cluster_id}: its certificate goes to that cluster's relay or an administrator"),
        )
        .with_data(json!({ "name": name, "clusterId": cluster_id }))),
        Holder::Administrators => Err(Refusal::new("forbidden", format!("a certificate for {name} is an administrator's to fetch"))
            .with_data(json!({ "name": name }))),
    }
}

/// What a failed fetch answers the caller.
fn refused(failure: Failure, name: &str, relay: bool) -> Refusal {
    match failure {
        Failure::Refused { status: 409, code } if code == "certificate-pending" => {
            let code = if relay { "relay-certificate-pending" } else { "certificate-pending" };
            Refusal::new(code, format!("the gateway is still issuing the certificate for {name}; ask again"))
                .with_data(json!({ "name": name, "retryAfterMs": PENDING_RETRY_MS }))
                .retryable()
        }
        Failure::Refused { status: 404, code } if code == "name-not-served" => Refusal::new(
            "certificate-name-not-served",
            format!("the gateway serves no certificate for {name}: it lies in none of its domains and is no name Capstan published there"),
        )
        .with_data(json!({ "name": name })),
        failure @ (Failure::Unreachable { .. } | Failure::Unavailable { .. }) => {
            Refusal::new("gateway-unreachable", format!("the certificate for {name} could not be fetched: {failure}")).retryable()
        }
        other => Refusal::new("gateway-certificate-refused", format!("the gateway did not hand out the certificate for {name}: {other}"))
            .with_data(json!({ "name": name })),
    }
}

async fn fetch_certificate(cx: Context, call: Call, input: Input) -> Result<Output> {
    let identity = call.identity()?;
    let name = input.name;
    if !is_certificate_name(&name) {
        return Err(Refusal::invalid_request("name must be a lowercase DNS name of at least two labels, or *. and one")
            .with_data(json!({ "field": "name" })));
    }
    let holder = holder(cx.store(), &name).await?;
    may_fetch(&holder, identity, &name)?;
    let (gateway_url, token) = enrolled(&cx).await?;
    let relay = matches!(holder, Holder::Cluster { .. });
    let fetched = cx.client.certificate(&gateway_url, &token, &name).await.map_err(|failure| refused(failure, &name, relay))?;
    let cluster = match &holder {
        Holder::Cluster { cluster_id, .. } => cluster_id.as_str(),
        Holder::Administrators => "-",
    };
    tracing::info!(name = %name, cluster = %cluster, by = %identity.username, not_after = fetched.not_after, "certificate handed out");
    Ok(Output { name, certificate: fetched.certificate, private_key: fetched.private_key.to_string(), not_after: fetched.not_after })
}

/// Register `domains.fetchCertificate`. Not a read: asking may make the gateway issue or renew,
/// and handing out a key is recorded in the audit log (who fetched which name).
pub fn register(registry: &mut Registry, cx: Context) {
    registry
        .with(cx)
        .add(
            "domains.fetchCertificate",
            "The gateway's certificate and key for one name: a relay name to its cluster's relay or an administrator, any other to an administrator",
            Access::Authenticated,
            fetch_certificate,
        )
        .refuses(&[
            "relay-name-reserved",
            "relay-certificate-not-owned",
            "relay-certificate-pending",
            "certificate-pending",
            "certificate-name-not-served",
            "gateway-not-enrolled",
            "gateway-unreachable",
            "gateway-certificate-refused",
        ]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_store::CollectionSpec;

    fn who(kind: &str, user_id: &str, admin: bool) -> Identity {
        Identity {
            user_id: user_id.into(),
            username: user_id.into(),
            kind: kind.into(),
            admin,
            session_id: String::new(),
            authenticated_at: capstan_core::clock::now_ms(),
            expires_at: u64::MAX,
        }
    }

    #[tokio::test]
    async fn a_relay_name_is_its_clusters_and_the_rest_of_the_namespace_is_reserved() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
        for collection in [capstan_inventory::SETTINGS, capstan_inventory::CLUSTERS] {
            store.declare(CollectionSpec::new(collection)).await.unwrap();
        }
        assert_eq!(holder(&store, "relay.cluster-a.relays.example.com").await.unwrap(), Holder::Administrators, "no relay zone");
        store
            .transact(|tx| async move {
                let settings = json!({ "clusterRelayZone": "relays.example.com" });
                tx.insert(capstan_inventory::SETTINGS, settings::PUBLIC, settings).await?;
                let enabled = json!({ "relay": { "enabled": true }, "machineUserId": "usr_a" });
                tx.insert(capstan_inventory::CLUSTERS, "cluster_a", enabled).await?;
                tx.insert(capstan_inventory::CLUSTERS, "cluster_b", json!({ "relay": { "enabled": false }, "machineUserId": "usr_b" }))
                    .await?;
                Ok(())
            })
            .await
            .unwrap();
        let a = holder(&store, "relay.cluster-a.relays.example.com").await.unwrap();
        assert_eq!(a, Holder::Cluster { cluster_id: "cluster_a".into(), machine_user_id: "usr_a".into() });
        for reserved in [
            "relay.cluster-b.relays.example.com", // its relay is disabled
            "relay.cluster-z.relays.example.com", // no such cluster
            "*.cluster-a.relays.example.com",     // a wildcard covering an enabled one
            "*.cluster-z.relays.example.com",     // and one covering none
            "relay.cluster_a.relays.example.com", // not how a label is written
        ] {
            let refusal = holder(&store, reserved).await.unwrap_err();
            assert_eq!((refusal.code.as_ref(), refusal.http_status()), ("relay-name-reserved", 409), "{reserved}");
        }
        for free in ["www.acme.example", "app.relays.example.com", "relay.a.b.relays.example.com", "*.relays.example.com"] {
            assert_eq!(holder(&store, free).await.unwrap(), Holder::Administrators, "{free}");
        }

        let name = "relay.cluster-a.relays.example.com";
        assert!(may_fetch(&a, &who("human", "usr_admin", true), name).is_ok());
        assert!(may_fetch(&a, &who("machine", "usr_a", false), name).is_ok(), "the cluster's own relay");
        let other = may_fetch(&a, &who("machine", "usr_b", false), name).unwrap_err();
        assert_eq!((other.code.as_ref(), other.http_status()), ("relay-certificate-not-owned", 403));
        assert_eq!(other.data.unwrap()["clusterId"], "cluster_a");
        let member = may_fetch(&a, &who("human", "usr_a", false), name).unwrap_err();
        assert_eq!(member.code, "relay-certificate-not-owned", "a human who is not an administrator, even under the machine's id");
        assert_eq!(may_fetch(&Holder::Administrators, &who("machine", "usr_a", false), "www.acme.example").unwrap_err().code, "forbidden");
    }

    #[test]
    fn the_gateways_answers_become_named_refusals() {
        let pending = refused(Failure::Refused { status: 409, code: "certificate-pending".into() }, "relay.c.z.example", true);
        assert_eq!((pending.code.as_ref(), pending.http_status(), pending.retryable), ("relay-certificate-pending", 503, true));
        assert_eq!(pending.data.unwrap()["retryAfterMs"], PENDING_RETRY_MS);
        let pending = refused(Failure::Refused { status: 409, code: "certificate-pending".into() }, "www.a.example", false);
        assert_eq!(pending.code, "certificate-pending");
        let unserved = refused(Failure::Refused { status: 404, code: "name-not-served".into() }, "www.b.example", false);
        assert_eq!((unserved.code.as_ref(), unserved.http_status()), ("certificate-name-not-served", 409));
        let down = refused(Failure::Unreachable { sent: false, reason: "connection failed".into() }, "x.example", false);
        assert_eq!((down.code.as_ref(), down.http_status(), down.retryable), ("gateway-unreachable", 503, true));
        let scope = refused(Failure::Refused { status: 403, code: "scope-missing".into() }, "x.example", false);
        assert_eq!((scope.code.as_ref(), scope.http_status()), ("gateway-certificate-refused", 502));
        assert_eq!(refused(Failure::Unauthorized, "x.example", false).code, "gateway-certificate-refused");
    }

    #[test]
    fn names_are_dns_names_or_one_wildcard_of_one() {
        for good in ["www.acme.example", "*.acme.example", "relay.cluster-a.relays.example.com"] {
            assert!(is_certificate_name(good), "{good}");
        }
        for bad in ["", "acme", "*.acme", "WWW.acme.example", "*.*.acme.example", "www.acme.example.", "a b.example", "x.*.example"] {
            assert!(!is_certificate_name(bad), "{bad}");
        }
    }
}
