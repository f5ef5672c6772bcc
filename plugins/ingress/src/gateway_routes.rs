//! Routes at the external gateway (docs/gateway-protocol.md, "Routes"): every route of a
//! designated cluster's issued table is forwarded by the gateway to the address the cluster's
//! registered ingress advertised, with `public: false` for a hostname the table restricts to the
//! gateway's forwarding sources. The gateway is asked with Capstan's enrolled credential through
//! the host (`gateway:routes:write`); the plugin never holds it.
//!
//! Order and durability: a hostname is recorded (`published/<hostname>`, unconfirmed) before the
//! gateway is asked to route it and confirmed once it answered, and its record goes only after
//! the gateway forgot it, so a pass that dies anywhere leaves nothing at the gateway that this
//! manager does not know of. Withdrawals go first; a route revoked from a table leaves the
//! gateway in the pass that revoked it (the table is issued before the gateway is asked).

use crate::table::Route;
use capstan_sdk::store::{self, Batch};
use capstan_sdk::{JsonSchema, Refusal, Result, Value, gateway, json};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What the gateway has been asked to hold, by hostname.
pub const PUBLISHED: &str = "published";

/// Where the gateway forwards a cluster's hostnames: its ingress, as the registration stated.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Target {
    /// An IP address or a DNS name.
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Target {
    /// `host:port`, `[v6]:port` for an IPv6 address.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') { write!(f, "[{}]:{}", self.host, self.port) } else { write!(f, "{}:{}", self.host, self.port) }
    }
}

/// The route the gateway should hold for one hostname.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Wanted {
    pub cluster_id: String,
    pub service_id: String,
    pub target: Target,
    /// False for a hostname the ingress serves to the gateway's forwarding sources alone.
    pub public: bool,
}

/// A hostname's record: the route asked for, and whether the gateway confirmed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Held {
    route: Wanted,
    confirmed: bool,
}

/// A hostname the gateway does not route, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    pub hostname: String,
    pub service_id: String,
    /// Stable kebab-case code: the gateway's (`name-not-served`, `route-taken`, …) or
    /// `route-hostname-contested`.
    pub code: String,
    pub reason: String,
}

/// One cluster's state at the gateway, as the last pass left it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayState {
    /// Hostnames the gateway confirmed it routes to the cluster's ingress.
    pub routed: usize,
    /// Hostnames it does not route, each by name.
    pub refused: Vec<Refused>,
    /// Why nothing of the cluster is routed, or why the last pass stopped.
    pub failure: Option<String>,
}

/// A designated cluster as the plan reads it.
pub struct Cluster {
    pub cluster_id: String,
    /// Where its registered ingress is reached (`None`: it stated none, or none registered).
    pub target: Option<Target>,
    /// The routes of its issued table.
    pub routes: Vec<Route>,
}

/// What the gateway should hold, by hostname, and each cluster's state before the gateway is
/// asked: a hostname two clusters' tables carry is routed for neither; a cluster whose ingress
/// stated no address has none of its hostnames routed.
pub fn plan(clusters: &[Cluster]) -> (BTreeMap<String, Wanted>, BTreeMap<String, GatewayState>) {
    let mut wanted: BTreeMap<String, Wanted> = BTreeMap::new();
    let mut contested: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut states: BTreeMap<String, GatewayState> = BTreeMap::new();
    let mut claims: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for cluster in clusters {
        for route in &cluster.routes {
            claims.entry(route.hostname.as_str()).or_default().insert(cluster.cluster_id.as_str());
        }
    }
    for cluster in clusters {
        let state = states.entry(cluster.cluster_id.clone()).or_default();
        let Some(target) = &cluster.target else {
            if !cluster.routes.is_empty() {
                state.failure = Some(
                    "the cluster's ingress has not registered an address the gateway reaches it at \
                     (capstan-agent relay --ingress-advertise HOST:PORT)"
                        .into(),
                );
            }
            continue;
        };
        for route in &cluster.routes {
            if claims.get(route.hostname.as_str()).is_some_and(|c| c.len() > 1) {
                contested.entry(route.hostname.clone()).or_default().push((cluster.cluster_id.clone(), route.service_id.clone()));
                continue;
            }
            wanted.insert(
                route.hostname.clone(),
                Wanted {
                    cluster_id: cluster.cluster_id.clone(),
                    service_id: route.service_id.clone(),
                    target: target.clone(),
                    public: route.source_allow_list.is_none(),
                },
            );
        }
    }
    for (hostname, holders) in contested {
        for (cluster_id, service_id) in holders {
            states.entry(cluster_id).or_default().refused.push(Refused {
                hostname: hostname.clone(),
                service_id,
                code: "route-hostname-contested".into(),
                reason: "the tables of two clusters carry this hostname: the gateway routes it for neither".into(),
            });
        }
    }
    (wanted, states)
}

/// Bring the gateway's routes to `clusters`' tables: withdraw what is no longer wanted, then
/// put what is missing or changed. Answers each cluster's state (a failure that stops the pass,
/// such as `gateway-not-enrolled` or an unreachable gateway, is every cluster's).
pub fn sync(clusters: &[Cluster]) -> Result<BTreeMap<String, GatewayState>> {
    let (wanted, mut states) = plan(clusters);
    let held = read_held()?;
    let stop = |states: &mut BTreeMap<String, GatewayState>, why: String| {
        for state in states.values_mut() {
            state.failure.get_or_insert_with(|| why.clone());
        }
    };
    // withdrawals first
    for (hostname, (revision, _)) in &held {
        if wanted.contains_key(hostname) {
            continue; // kept, or replaced whole by the PUT below
        }
        match ask("DELETE", hostname, None) {
            Ok(answer) if answer.ok() || answer.code() == Some("route-unknown") || answer.code() == Some("route-taken") => {
                Batch::new().delete(PUBLISHED, hostname, *revision).commit()?;
            }
            Ok(answer) => {
                stop(&mut states, format!("withdrawing {hostname}: the gateway answered {}", described(&answer)));
                return Ok(counted(states, &held_now()?));
            }
            Err(refusal) => {
                stop(&mut states, failure_of(&refusal));
                return Ok(counted(states, &held_now()?));
            }
        }
    }
    let held = read_held()?;
    for (hostname, route) in &wanted {
        let (mut revision, recorded) = match held.get(hostname) {
            Some((_, record)) if record.confirmed && &record.route == route => continue,
            Some((revision, record)) => (Some(*revision), &record.route == route),
            None => (None, false),
        };
        if !recorded {
            // recorded before the gateway is asked (a route asked for again is recorded already)
            let pending = Held { route: route.clone(), confirmed: false };
            revision = Batch::new().put(PUBLISHED, hostname, revision, &pending).commit()?.last().map(|d| d.revision);
        }
        let body = json!({"target": route.target, "public": route.public});
        match ask("PUT", hostname, Some(&body)) {
            Ok(answer) if answer.ok() => {
                Batch::new().put(PUBLISHED, hostname, revision, &Held { route: route.clone(), confirmed: true }).commit()?;
            }
            Ok(answer) if answer.status < 500 => {
                let state = states.entry(route.cluster_id.clone()).or_default();
                state.refused.push(Refused {
                    hostname: hostname.clone(),
                    service_id: route.service_id.clone(),
                    code: answer.code().unwrap_or("unnamed").to_string(),
                    reason: format!("the gateway refused the route: {}", described(&answer)),
                });
            }
            Ok(answer) => {
                stop(&mut states, format!("routing {hostname}: the gateway answered {}", described(&answer)));
                return Ok(counted(states, &held_now()?));
            }
            Err(refusal) => {
                stop(&mut states, failure_of(&refusal));
                return Ok(counted(states, &held_now()?));
            }
        }
    }
    Ok(counted(states, &held_now()?))
}

/// Every hostname's record with its revision.
fn read_held() -> Result<BTreeMap<String, (u64, Held)>> {
    let mut out = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store::scan::<Held>(PUBLISHED, cursor.as_deref(), 500)?;
        out.extend(page.documents.into_iter().map(|d| (d.id, (d.revision, d.data))));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(out),
        }
    }
}

fn held_now() -> Result<BTreeMap<String, Held>> {
    Ok(read_held()?.into_iter().map(|(h, (_, record))| (h, record)).collect())
}

/// `states` with each cluster's confirmed routes counted and its refusals sorted.
fn counted(mut states: BTreeMap<String, GatewayState>, held: &BTreeMap<String, Held>) -> BTreeMap<String, GatewayState> {
    for (cluster_id, state) in states.iter_mut() {
        state.routed = held.values().filter(|h| h.confirmed && &h.route.cluster_id == cluster_id).count();
        state.refused.sort();
    }
    states
}

fn ask(method: &str, hostname: &str, body: Option<&Value>) -> Result<gateway::Response> {
    gateway::request(method, &format!("/v1/routes/{hostname}"), body)
}

/// A gateway answer for a message: its status and error code.
fn described(answer: &gateway::Response) -> String {
    match answer.code() {
        Some(code) => format!("{} {code}", answer.status),
        None => answer.status.to_string(),
    }
}

fn failure_of(refusal: &Refusal) -> String {
    match refusal.code() {
        "gateway-not-enrolled" => "Capstan holds no gateway credential yet (capstan gateway bootstrap): no route is synced".into(),
        code => format!("the gateway could not be asked: {code}: {}", refusal.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Target as RouteTarget;

    fn route(hostname: &str, service: &str, private: bool) -> Route {
        Route {
            hostname: hostname.into(),
            service_id: service.into(),
            targets: vec![RouteTarget { address: "10.0.0.9".into(), port: 8080 }],
            source_allow_list: private.then(|| vec!["192.0.2.0/24".into()]),
        }
    }

    fn target(port: u16) -> Option<Target> {
        Some(Target { host: "192.0.2.10".into(), port })
    }

    #[test]
    fn every_route_of_a_registered_clusters_table_goes_to_its_ingress() {
        let clusters = [Cluster {
            cluster_id: "c1".into(),
            target: target(80),
            routes: vec![route("www.acme.example", "svc_a", false), route("admin.acme.example", "svc_a", true)],
        }];
        let (wanted, states) = plan(&clusters);
        assert_eq!(wanted.len(), 2);
        let www = &wanted["www.acme.example"];
        assert_eq!((www.cluster_id.as_str(), www.service_id.as_str(), www.public), ("c1", "svc_a", true));
        assert_eq!(www.target, target(80).unwrap(), "the ingress's address, not the workload's");
        assert!(!wanted["admin.acme.example"].public, "a hostname with an allowlist is not public");
        assert_eq!(states["c1"], GatewayState::default());
    }

    #[test]
    fn a_hostname_two_clusters_carry_is_routed_for_neither_and_named_for_both() {
        let clusters = [
            Cluster { cluster_id: "c1".into(), target: target(80), routes: vec![route("www.acme.example", "svc_a", false)] },
            Cluster {
                cluster_id: "c2".into(),
                target: target(81),
                routes: vec![route("www.acme.example", "svc_b", false), route("b.acme.example", "svc_b", false)],
            },
        ];
        let (wanted, states) = plan(&clusters);
        assert_eq!(wanted.keys().collect::<Vec<_>>(), ["b.acme.example"]);
        for (cluster, service) in [("c1", "svc_a"), ("c2", "svc_b")] {
            let refused = &states[cluster].refused;
            assert_eq!(refused.len(), 1, "{cluster}");
            assert_eq!((refused[0].code.as_str(), refused[0].service_id.as_str()), ("route-hostname-contested", service));
        }
    }

    #[test]
    fn a_cluster_whose_ingress_stated_no_address_has_nothing_routed_and_says_why() {
        let clusters = [
            Cluster { cluster_id: "c1".into(), target: None, routes: vec![route("www.acme.example", "svc_a", false)] },
            Cluster { cluster_id: "c2".into(), target: None, routes: vec![] },
        ];
        let (wanted, states) = plan(&clusters);
        assert!(wanted.is_empty());
        assert!(states["c1"].failure.as_deref().unwrap().contains("--ingress-advertise"));
        assert_eq!(states["c2"].failure, None, "nothing to route, nothing missing");
    }
}
