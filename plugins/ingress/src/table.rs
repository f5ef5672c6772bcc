//! A cluster's route table: what its ingress serves, computed from the services routed through
//! it, and how one table is replaced by the next (withdrawals first).
//!
//! Pure functions of their inputs, so every rule here is tested without a host.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The relay release from which a route table may carry a source allowlist: the first reference
/// relay whose proxy enforces one.
pub const ALLOWLIST_MIN_RELAY_VERSION: (u64, u64, u64) = (0, 1, 0);

capstan_sdk::shaped_text!(
    Prefix,
    r"^[0-9A-Fa-f:.]{2,39}(/[0-9]{1,3})?$",
    "An address prefix: an IPv4 or IPv6 address with an optional /length (192.0.2.0/24, 2001:db8::/32)."
);

/// Where a route's connections go.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// The address the workload answers on (an IP address or a host name).
    pub address: String,
    /// The port it answers HTTP on there.
    pub port: u16,
}

/// One route: a hostname served for one service, at its targets (the ready replicas, or an
/// address outside Capstan's runtime). The hostname, the service and the allowlist are its
/// identity: a change of any revokes the route and issues another; its targets follow the
/// replicas in place.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub hostname: String,
    pub service_id: String,
    /// Sorted; empty while the service has no ready replica (the ingress answers 503).
    pub targets: Vec<Target>,
    /// For a non-public hostname: the only source prefixes the ingress may accept for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_allow_list: Option<Vec<String>>,
}

impl Route {
    /// What a route is, whatever its targets.
    fn identity(&self) -> (&str, &str, &Option<Vec<String>>) {
        (&self.hostname, &self.service_id, &self.source_allow_list)
    }
}

/// A hostname left out of the table, and why (the other routes are still served).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Omitted {
    pub hostname: String,
    pub service_id: String,
    /// Stable kebab-case code.
    pub code: String,
    pub reason: String,
    /// What an operator does about it.
    pub fix: String,
}

/// A service as the table reads it (from the inventory).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    #[serde(default)]
    pub domains: Vec<String>,
    #[serde(default)]
    pub ports: Vec<Port>,
    #[serde(default)]
    pub state: String,
}

/// A port of a service.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    pub port: u16,
    pub protocol: String,
    /// The port its replicas publish on their nodes.
    #[serde(default)]
    pub public_port: Option<u16>,
}

/// Where a routed service answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Reach {
    /// At an address outside Capstan's runtime (an attachment states it), on its HTTP port.
    External(String),
    /// Its replicas on the cluster's nodes, on the port its HTTP port is published at.
    Replicas(capstan_sdk::runtime::Reach),
}

/// A service routed through the cluster's ingress, with what the table needs of it.
#[derive(Debug, Clone)]
pub struct Source {
    pub service_id: String,
    pub service: Service,
    pub reach: Reach,
    /// Its hostnames that are not public: served only to the gateway's forwarding sources.
    pub private_hostnames: BTreeSet<String>,
}

/// What the ingress registration stated, as far as allowlists go.
#[derive(Debug, Clone, Default)]
pub struct Ingress {
    /// The ingress registered the route-source-allowlist capability.
    pub enforces_allow_lists: bool,
    /// The relay's release as the registration stated it.
    pub relay_version: Option<String>,
}

/// The routes of `sources` and the hostnames left out, both sorted.
///
/// A route per domain of an active service, to its first HTTP port: at its external address, or
/// published on the nodes of its ready replicas. Left out: a wildcard (the table carries exact
/// names), a service without an HTTP port, replicas whose HTTP port is not published, ready
/// replicas none of whose nodes states an address, a hostname two services claim (served for
/// neither), a non-public hostname the ingress cannot restrict to `forward_sources` (three
/// reasons, checked in order). A service being deleted leaves out only its own routes.
pub fn compute(sources: &[Source], forward_sources: &[String], ingress: &Ingress) -> (Vec<Route>, Vec<Omitted>) {
    let mut claims: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for source in sources.iter().filter(|s| s.service.state == "active") {
        for domain in &source.service.domains {
            claims.entry(domain.as_str()).or_default().insert(source.service_id.as_str());
        }
    }
    let mut routes = Vec::new();
    let mut omitted = Vec::new();
    for source in sources.iter().filter(|s| s.service.state == "active") {
        let http = source.service.ports.iter().find(|p| p.protocol == "http");
        for hostname in &source.service.domains {
            let leave = |code: &str, reason: String, fix: &str| Omitted {
                hostname: hostname.clone(),
                service_id: source.service_id.clone(),
                code: code.into(),
                reason,
                fix: fix.into(),
            };
            if hostname.starts_with("*.") {
                omitted.push(leave(
                    "route-hostname-wildcard",
                    "the route table carries exact hostnames, not wildcards".into(),
                    "List each hostname the service answers on.",
                ));
                continue;
            }
            if claims.get(hostname.as_str()).is_some_and(|c| c.len() > 1) {
                let others: Vec<&str> = claims[hostname.as_str()].iter().copied().filter(|s| *s != source.service_id).collect();
                omitted.push(leave(
                    "route-hostname-contested",
                    format!("the hostname is also a domain of {}; it is served for neither", others.join(", ")),
                    "Remove the hostname from all services but one.",
                ));
                continue;
            }
            let Some(http) = http else {
                omitted.push(leave(
                    "route-port-missing",
                    "the service declares no port with protocol http".into(),
                    "Add an http port to the service.",
                ));
                continue;
            };
            let targets = match &source.reach {
                Reach::External(address) => vec![Target { address: address.clone(), port: http.port }],
                Reach::Replicas(_) if http.public_port.is_none() => {
                    omitted.push(leave(
                        "route-port-unpublished",
                        format!(
                            "the service's http port {} is not published on its nodes, so the ingress cannot reach its replicas",
                            http.port
                        ),
                        "Set the http port's publicPort.",
                    ));
                    continue;
                }
                Reach::Replicas(reach) => {
                    if reach.ready.is_empty() && !reach.unaddressed.is_empty() {
                        omitted.push(leave(
                            "route-target-unaddressed",
                            format!("the nodes of its ready replicas state no address: {}", reach.unaddressed.join(", ")),
                            "Start each node's agent with --advertise-address (a node with several addresses states which one is reached).",
                        ));
                        continue;
                    }
                    let port = http.public_port.unwrap_or(http.port);
                    reach.ready.iter().map(|address| Target { address: address.clone(), port }).collect()
                }
            };
            let mut allow = None;
            if source.private_hostnames.contains(hostname) {
                if let Some(why) = allowlist_refused(forward_sources, ingress) {
                    omitted.push(why(hostname, &source.service_id));
                    continue;
                }
                let mut prefixes = forward_sources.to_vec();
                prefixes.sort();
                prefixes.dedup();
                allow = Some(prefixes);
            }
            routes.push(Route { hostname: hostname.clone(), service_id: source.service_id.clone(), targets, source_allow_list: allow });
        }
    }
    routes.sort();
    omitted.sort();
    (routes, omitted)
}

type Leave = Box<dyn Fn(&str, &str) -> Omitted>;

/// Why a non-public hostname cannot be served with an allowlist, if it cannot.
fn allowlist_refused(forward_sources: &[String], ingress: &Ingress) -> Option<Leave> {
    let leave = |code: &'static str, reason: String, fix: &'static str| -> Leave {
        Box::new(move |hostname: &str, service_id: &str| Omitted {
            hostname: hostname.into(),
            service_id: service_id.into(),
            code: code.into(),
            reason: reason.clone(),
            fix: fix.into(),
        })
    };
    if forward_sources.is_empty() {
        return Some(leave(
            "forward-source-unset",
            "no gateway forwarding source is configured (ingress.forwardSourceAddresses), so the ingress cannot restrict this non-public hostname to the gateway".into(),
            "Set ingress.forwardSourceAddresses.",
        ));
    }
    if !ingress.enforces_allow_lists {
        return Some(leave(
            "ingress-allowlist-unsupported",
            "the cluster ingress cannot enforce a source allowlist: its registration does not state the routeSourceAllowList capability"
                .into(),
            "Run an ingress that registers capabilities.routeSourceAllowList under the current designation.",
        ));
    }
    let version = ingress.relay_version.as_deref().unwrap_or("unknown");
    if parse_version(version).is_none_or(|v| v < ALLOWLIST_MIN_RELAY_VERSION) {
        let (a, b, c) = ALLOWLIST_MIN_RELAY_VERSION;
        return Some(leave(
            "relay-allowlist-unsupported",
            format!("the cluster relay would refuse a route table carrying a source allowlist: it speaks {version}, below {a}.{b}.{c}"),
            "Upgrade the cluster's relay.",
        ));
    }
    None
}

/// `major.minor.patch` (a pre-release or build suffix ignored).
pub fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let core = text.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let v = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(v)
}

/// The next table to issue on the way from `current` to `desired`: `desired` itself when
/// nothing of `current` is revoked or nothing is added; otherwise `current` without the revoked
/// routes, so the withdrawal is served before any addition. A route is revoked or added by its
/// identity; new targets of a route that stays are no revocation and go with either step.
pub fn next_step(current: &[Route], desired: &[Route]) -> Vec<Route> {
    let kept = |r: &Route, among: &[Route]| among.iter().any(|o| o.identity() == r.identity());
    let revoked = current.iter().any(|r| !kept(r, desired));
    let added = desired.iter().any(|r| !kept(r, current));
    if revoked && added { desired.iter().filter(|r| kept(r, current)).cloned().collect() } else { desired.to_vec() }
}

/// Whether `text` is an address prefix: an IPv4 or IPv6 address with an optional `/len`.
pub fn is_prefix(text: &str) -> bool {
    let (address, len) = match text.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (text, None),
    };
    let Ok(ip) = address.parse::<std::net::IpAddr>() else { return false };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    len.is_none_or(|l| !l.starts_with('+') && l.parse::<u8>().is_ok_and(|n| n <= max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(id: &str, domains: &[&str], http: Option<u16>, private: &[&str]) -> Source {
        Source {
            service_id: id.into(),
            service: Service {
                domains: domains.iter().map(|d| d.to_string()).collect(),
                ports: http.into_iter().map(|port| Port { port, protocol: "http".into(), public_port: None }).collect(),
                state: "active".into(),
            },
            reach: Reach::External("10.0.0.7".into()),
            private_hostnames: private.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn able() -> Ingress {
        Ingress { enforces_allow_lists: true, relay_version: Some("0.1.0".into()) }
    }

    #[test]
    fn a_route_per_exact_domain_to_the_first_http_port() {
        let (routes, omitted) = compute(&[source("svc_a", &["b.example", "a.example", "*.example"], Some(8080), &[])], &[], &able());
        assert_eq!(routes.iter().map(|r| r.hostname.as_str()).collect::<Vec<_>>(), ["a.example", "b.example"]);
        assert!(routes.iter().all(|r| r.targets == [Target { address: "10.0.0.7".into(), port: 8080 }] && r.source_allow_list.is_none()));
        assert_eq!(omitted.len(), 1);
        assert_eq!(omitted[0].code, "route-hostname-wildcard");
    }

    #[test]
    fn a_contested_hostname_is_served_for_neither_and_a_portless_service_for_nothing() {
        let (routes, omitted) = compute(
            &[source("svc_a", &["shared.example", "a.example"], Some(80), &[]), source("svc_b", &["shared.example"], None, &[])],
            &[],
            &able(),
        );
        assert_eq!(routes.iter().map(|r| r.hostname.as_str()).collect::<Vec<_>>(), ["a.example"]);
        let codes: Vec<(&str, &str)> = omitted.iter().map(|o| (o.service_id.as_str(), o.code.as_str())).collect();
        assert_eq!(codes, [("svc_a", "route-hostname-contested"), ("svc_b", "route-hostname-contested")]);
        assert!(omitted[0].reason.contains("svc_b"), "{}", omitted[0].reason);
    }

    #[test]
    fn a_deleting_service_leaves_out_only_its_own_routes() {
        let mut gone = source("svc_b", &["shared.example"], Some(80), &[]);
        gone.service.state = "deleting".into();
        let (routes, omitted) = compute(&[source("svc_a", &["shared.example"], Some(80), &[]), gone], &[], &able());
        assert_eq!(routes.len(), 1, "a deleting service claims nothing");
        assert!(omitted.is_empty());
    }

    #[test]
    fn a_private_hostname_carries_the_forwarding_sources_or_is_left_out_by_name() {
        let sources = [source("svc_a", &["pub.example", "priv.example"], Some(80), &["priv.example"])];
        let forward = vec!["192.0.2.0/24".to_string(), "2001:db8::/32".to_string()];
        let (routes, _) = compute(&sources, &forward, &able());
        let private = routes.iter().find(|r| r.hostname == "priv.example").unwrap();
        assert_eq!(private.source_allow_list.as_deref(), Some(&["192.0.2.0/24".to_string(), "2001:db8::/32".to_string()][..]));
        assert!(routes.iter().find(|r| r.hostname == "pub.example").unwrap().source_allow_list.is_none());

        let cases = [
            (vec![], able(), "forward-source-unset"),
            (forward.clone(), Ingress { enforces_allow_lists: false, ..able() }, "ingress-allowlist-unsupported"),
            (forward.clone(), Ingress { relay_version: Some("0.0.9".into()), ..able() }, "relay-allowlist-unsupported"),
            (forward.clone(), Ingress { relay_version: None, ..able() }, "relay-allowlist-unsupported"),
        ];
        for (forward, ingress, code) in cases {
            let (routes, omitted) = compute(&sources, &forward, &ingress);
            assert_eq!(routes.iter().map(|r| r.hostname.as_str()).collect::<Vec<_>>(), ["pub.example"], "{code}: public routes stay");
            assert_eq!(omitted.len(), 1);
            assert_eq!((omitted[0].hostname.as_str(), omitted[0].code.as_str()), ("priv.example", code));
        }
    }

    #[test]
    fn replicas_are_reached_where_they_are_ready_on_the_published_port_or_left_out_by_name() {
        let replicas = |ready: &[&str], unaddressed: &[&str]| {
            Reach::Replicas(capstan_sdk::runtime::Reach {
                ready: ready.iter().map(|a| a.to_string()).collect(),
                unaddressed: unaddressed.iter().map(|n| n.to_string()).collect(),
            })
        };
        let mut web = source("svc_a", &["a.example"], Some(8080), &[]);
        web.service.ports[0].public_port = Some(18080);
        web.reach = replicas(&["10.0.0.8", "10.0.0.9"], &["node_c"]);
        let (routes, omitted) = compute(std::slice::from_ref(&web), &[], &able());
        let at = |a: &str| Target { address: a.into(), port: 18080 };
        assert_eq!(routes[0].targets, [at("10.0.0.8"), at("10.0.0.9")], "on the published port; an unaddressed node left out");
        assert!(omitted.is_empty());
        // no replica ready: the route stays, with nothing to send to
        web.reach = replicas(&[], &[]);
        let (routes, _) = compute(std::slice::from_ref(&web), &[], &able());
        assert!(routes[0].targets.is_empty());
        // ready replicas, but no node states an address
        web.reach = replicas(&[], &["node_a", "node_b"]);
        let (routes, omitted) = compute(std::slice::from_ref(&web), &[], &able());
        assert!(routes.is_empty());
        assert_eq!(omitted[0].code, "route-target-unaddressed");
        assert!(omitted[0].reason.contains("node_a, node_b"), "{}", omitted[0].reason);
        // the http port not published
        web.service.ports[0].public_port = None;
        web.reach = replicas(&["10.0.0.8"], &[]);
        let (routes, omitted) = compute(std::slice::from_ref(&web), &[], &able());
        assert!(routes.is_empty());
        assert_eq!(omitted[0].code, "route-port-unpublished");
    }

    #[test]
    fn a_change_withdraws_the_revoked_routes_before_it_adds() {
        let route = |h: &str, port: u16| Route {
            hostname: h.into(),
            service_id: "svc_a".into(),
            targets: vec![Target { address: "10.0.0.7".into(), port }],
            source_allow_list: None,
        };
        let current = vec![route("a.example", 80), route("old.example", 80)];
        let desired = vec![route("a.example", 80), route("new.example", 80)];
        assert_eq!(next_step(&current, &desired), vec![route("a.example", 80)], "first the withdrawal alone");
        assert_eq!(next_step(&next_step(&current, &desired), &desired), desired, "then the addition");
        assert_eq!(next_step(&current, &current[..1]), current[..1], "a withdrawal alone is one step");
        assert_eq!(next_step(&current[..1], &current), current, "an addition alone is one step");
        // new targets of a route that stays are no revocation: they go at once
        let moved = vec![route("a.example", 8080), route("old.example", 80)];
        assert_eq!(next_step(&current, &moved), moved);
        // and with the withdrawal step when there is one
        let next = vec![route("a.example", 8080), route("new.example", 80)];
        assert_eq!(next_step(&current, &next), vec![route("a.example", 8080)]);
        // another service taking a hostname is a revocation and an addition
        let taken = vec![Route { service_id: "svc_b".into(), ..route("a.example", 80) }, route("old.example", 80)];
        assert_eq!(next_step(&current, &taken), vec![route("old.example", 80)]);
    }

    #[test]
    fn prefixes_and_versions_are_read_strictly() {
        for good in ["192.0.2.0/24", "192.0.2.7", "2001:db8::/32", "::1/128", "0.0.0.0/0"] {
            assert!(is_prefix(good), "{good}");
        }
        for bad in ["192.0.2.0/33", "2001:db8::/129", "example.com/24", "192.0.2.0/", "192.0.2.0/+8", ""] {
            assert!(!is_prefix(bad), "{bad}");
        }
        assert_eq!(parse_version("0.1.0"), Some((0, 1, 0)));
        assert_eq!(parse_version("1.2.3-rc.1"), Some((1, 2, 3)));
        assert_eq!(parse_version("1.2"), None);
        assert_eq!(parse_version("1.2.3.4"), None);
    }
}
