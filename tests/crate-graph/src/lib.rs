//! The workspace's crate graph, written down: which workspace crate may depend on which.
//!
//! `ARCHITECTURE.md` draws it; `tests/graph.rs` reads `cargo metadata` and fails on any
//! dependency between workspace crates (normal, build or dev) that [`ALLOWED`] does not name —
//! or, for a dev-dependency only, [`TEST_ONLY`] — on a workspace crate the table does not
//! place, and on a cycle. Adding an edge is a design decision: change the table and the drawing
//! together.

/// Every workspace crate and the workspace crates it may depend on, lowest first.
pub const ALLOWED: &[(&str, &[&str])] = &[
    // foundation: nothing of the domain, the plugins, the server or the presentation
    ("capstan-core", &[]),
    // publisher keys (plugin bundles, catalogs): pure, so the App Store plugin (wasm) shares them
    // through capstan-catalog; its `files` feature (native only) reads and writes key files
    // under capstan-core's private-file rules
    ("capstan-publisher-key", &["capstan-core"]),
    // the inventory's field rules, pure: the inventory enforces them, the catalog publisher's
    // tool checks templates with them
    ("capstan-field-rules", &["capstan-core"]),
    ("capstan-store", &["capstan-core"]),
    ("capstan-blobs", &["capstan-core"]),
    ("capstan-keyring", &["capstan-core"]),
    // the signed App Store catalog format, shared with the App Store plugin, over the host's
    // publisher keys; its `cli` feature (the `capstan-catalog` binary, never in the plugin) reads
    // key files and checks templates with the inventory's field rules — no other host crate
    ("capstan-catalog", &["capstan-core", "capstan-publisher-key", "capstan-field-rules"]),
    // the method registry: no HTTP, no domain
    ("capstan-rpc", &["capstan-core", "capstan-store"]),
    // domain: the fleet coordinates through the bucket; the outbox lives in the store
    ("capstan-fleet", &["capstan-core", "capstan-blobs", "capstan-rpc"]),
    ("capstan-events", &["capstan-core", "capstan-store", "capstan-rpc"]),
    (
        "capstan-auth",
        &["capstan-core", "capstan-store", "capstan-blobs", "capstan-keyring", "capstan-rpc", "capstan-fleet", "capstan-events"],
    ),
    // the inventory reaches the areas above it (secrets, plugins) only through its Dependents trait
    (
        "capstan-inventory",
        &["capstan-core", "capstan-field-rules", "capstan-store", "capstan-blobs", "capstan-rpc", "capstan-events", "capstan-auth"],
    ),
    (
        "capstan-secrets",
        &["capstan-core", "capstan-store", "capstan-keyring", "capstan-rpc", "capstan-events", "capstan-auth", "capstan-inventory"],
    ),
    // cluster relays: the credential (a system secret), registrations and liveness in the store,
    // the election, calls carried to the fleet node holding a relay, the configuration pushed;
    // the sockets are the server's, reached through its Sessions trait
    (
        "capstan-relays",
        &[
            "capstan-core",
            "capstan-store",
            "capstan-rpc",
            "capstan-fleet",
            "capstan-events",
            "capstan-auth",
            "capstan-inventory",
            "capstan-secrets",
        ],
    ),
    // nodes: jump codes, enrollment, the node credential authority, heartbeats, hostname
    // intents; its records live beside the inventory's clusters
    ("capstan-nodes", &["capstan-core", "capstan-store", "capstan-rpc", "capstan-events", "capstan-inventory"]),
    // the OCI registry under /v2: its bytes in the blobs, its facts in the store, its callers
    // authenticated by auth and judged by the inventory's roles and grants; a deployment's route
    // hostnames checked by the field rules
    (
        "capstan-registry",
        &["capstan-core", "capstan-field-rules", "capstan-store", "capstan-blobs", "capstan-rpc", "capstan-auth", "capstan-inventory"],
    ),
    // runs plugin tasks through its PluginTasks trait, knowing nothing else of plugins
    ("capstan-scheduler", &["capstan-core", "capstan-store", "capstan-rpc", "capstan-events", "capstan-fleet"]),
    // the plugin host: reaches the inventory, settings and organization roles only through its
    // Platform trait (and the rpc's OrganizationAuthority), answered by capstan-links
    (
        "capstan-plugin-host",
        &[
            "capstan-core",
            "capstan-publisher-key",
            "capstan-store",
            "capstan-blobs",
            "capstan-keyring",
            "capstan-rpc",
            "capstan-fleet",
            "capstan-events",
            "capstan-scheduler",
        ],
    ),
    // the external gateway's enrollment: its settings from the inventory, its credential a
    // system secret, the admin token opened by the secrets' sealed-input path
    ("capstan-gateway", &["capstan-core", "capstan-store", "capstan-rpc", "capstan-inventory", "capstan-secrets", "capstan-relays"]),
    // where areas meet: the inventory's Dependents and the plugin host's Platform, answered
    // (the keyring: the secrets a plugin reaches are sealed and opened with it; the nodes: the
    // nodes of clusters a plugin reads, with their liveness)
    (
        "capstan-links",
        &[
            "capstan-core",
            "capstan-store",
            "capstan-keyring",
            "capstan-rpc",
            "capstan-inventory",
            "capstan-secrets",
            "capstan-relays",
            "capstan-nodes",
            "capstan-plugin-host",
            "capstan-registry",
        ],
    ),
    // the server: the HTTP API, the host state, configuration, the assembly of `serve`, and the
    // first-party plugins it embeds; it knows nothing of the dashboard (which plugs in its pages)
    (
        "capstan-server",
        &[
            "capstan-core",
            "capstan-store",
            "capstan-blobs",
            "capstan-keyring",
            "capstan-rpc",
            "capstan-fleet",
            "capstan-events",
            "capstan-auth",
            "capstan-inventory",
            "capstan-secrets",
            "capstan-relays",
            "capstan-nodes",
            "capstan-registry",
            "capstan-scheduler",
            "capstan-plugin-host",
            "capstan-links",
            "capstan-gateway",
        ],
    ),
    // presentation: the dashboard acts through the server's registered methods (its tests
    // release a hold through capstan-links, as a manager would)
    // no plugin's crate: the App Store's view is its plugin's pages
    ("capstan-dashboard", &["capstan-core", "capstan-field-rules", "capstan-rpc", "capstan-server", "capstan-links"]),
    // the `capstan` binary: the CLI, `serve` with the dashboard's pages; no plugin's crate
    ("capstan", &["capstan-core", "capstan-field-rules", "capstan-server", "capstan-dashboard"]),
    // plugin authors' side: the SDK; its `testing` harness runs a plugin on the plugin host with
    // an embedded store (no server, no MongoDB, no S3)
    (
        "capstan-sdk",
        &[
            "capstan-core",
            "capstan-store",
            "capstan-blobs",
            "capstan-keyring",
            "capstan-rpc",
            "capstan-events",
            "capstan-inventory",
            "capstan-plugin-host",
            "capstan-links",
        ],
    ),
    ("capstan-plugin-appstore", &["capstan-sdk", "capstan-catalog"]),
    ("capstan-plugin-backups", &["capstan-sdk"]),
    // what the two mail managers share of SMTP submission
    ("capstan-plugin-smtp", &[]),
    ("capstan-plugin-mail", &["capstan-sdk", "capstan-plugin-smtp"]),
    ("capstan-plugin-coremail", &["capstan-sdk", "capstan-plugin-smtp"]),
    ("capstan-plugin-ingress", &["capstan-sdk"]),
    ("capstan-plugin-example", &["capstan-sdk"]),
    ("capstan-plugin-adversary", &["capstan-sdk"]),
    // the node agent, a program of its own on every node: the foundation only (refusals, private
    // files, the wire's shared bodies); it speaks to the host over HTTP (docs/nodes.md), never
    // through a host crate
    ("capstan-agent", &["capstan-core"]),
    ("capstan-crate-graph", &[]),
];

/// Dependencies allowed only as dev-dependencies (for a crate's tests), beyond [`ALLOWED`].
pub const TEST_ONLY: &[(&str, &[&str])] = &[
    // the end-to-end tests play the catalog publisher, signing catalogs in-process; the binary
    // itself depends on no plugin's crate
    ("capstan", &["capstan-catalog"]),
    // the dashboard's tests import signed catalogs through the App Store's pages
    ("capstan-dashboard", &["capstan-catalog"]),
];

/// The crates `name` may depend on; `None` for a crate the table does not place.
pub fn allowed(name: &str) -> Option<&'static [&'static str]> {
    ALLOWED.iter().find(|(crate_name, _)| *crate_name == name).map(|(_, deps)| *deps)
}

/// Whether `from` may depend on `to` as a dependency of `kind` (`normal`, `build` or `dev`).
pub fn edge_allowed(from: &str, to: &str, kind: &str) -> bool {
    let listed = |table: &[(&str, &[&str])]| table.iter().any(|(name, deps)| *name == from && deps.contains(&to));
    listed(ALLOWED) || (kind == "dev" && listed(TEST_ONLY))
}

/// A cycle among `edges` (as the crates along it, first repeated last), if there is one.
pub fn find_cycle(edges: &[(String, String)]) -> Option<Vec<String>> {
    fn visit(node: &str, edges: &[(String, String)], path: &mut Vec<String>, done: &mut Vec<String>) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.iter().any(|n| n == node) {
            return None;
        }
        path.push(node.to_string());
        for (_, to) in edges.iter().filter(|(from, _)| from == node) {
            if let Some(cycle) = visit(to, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.push(node.to_string());
        None
    }
    let mut done = Vec::new();
    edges.iter().find_map(|(from, _)| visit(from, edges, &mut Vec::new(), &mut done))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edges(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn test_only_edges_are_allowed_to_tests_alone() {
        assert!(edge_allowed("capstan", "capstan-catalog", "dev"));
        assert!(!edge_allowed("capstan", "capstan-catalog", "normal"));
        assert!(!edge_allowed("capstan", "capstan-catalog", "build"));
        assert!(edge_allowed("capstan-dashboard", "capstan-catalog", "dev"));
        assert!(!edge_allowed("capstan-dashboard", "capstan-catalog", "normal"));
        assert!(edge_allowed("capstan", "capstan-server", "normal") && edge_allowed("capstan", "capstan-server", "dev"));
        assert!(!edge_allowed("capstan-core", "capstan-store", "dev"));
    }

    #[test]
    fn cycles_are_found_and_a_chain_is_not_one() {
        assert_eq!(find_cycle(&edges(&[("a", "b"), ("b", "c")])), None);
        let cycle = find_cycle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])).unwrap();
        assert_eq!(cycle.first(), cycle.last());
        assert_eq!(cycle.len(), 4);
        assert!(find_cycle(&edges(&[("x", "y"), ("y", "x")])).is_some());
    }

    #[test]
    fn the_allowed_graph_itself_has_no_cycle() {
        let all: Vec<(String, String)> = ALLOWED
            .iter()
            .chain(TEST_ONLY)
            .flat_map(|(from, deps)| deps.iter().map(move |to| (from.to_string(), to.to_string())))
            .collect();
        assert_eq!(find_cycle(&all), None);
        for (from, deps) in ALLOWED.iter().chain(TEST_ONLY) {
            assert!(allowed(from).is_some(), "{from} has test-only dependencies but is not placed in the table");
            for dep in *deps {
                assert!(allowed(dep).is_some(), "{dep} is allowed as a dependency but not placed in the table");
            }
        }
        for (from, deps) in TEST_ONLY {
            for dep in *deps {
                assert!(!allowed(from).unwrap_or_default().contains(dep), "{from} -> {dep} is in both tables");
            }
        }
    }
}
