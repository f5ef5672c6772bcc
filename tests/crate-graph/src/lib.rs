//! The workspace's crate graph, written down: which workspace crate may depend on which.
//!
//! `ARCHITECTURE.md` draws it; `tests/graph.rs` reads `cargo metadata` and fails on any
//! dependency between workspace crates (normal, build or dev) that [`ALLOWED`] does not name —
//! or, for a dev-dependency only, [`TEST_ONLY`] — on a workspace crate the table does not
//! place, and on a cycle. Adding an edge is a design decision: change the table and the drawing
//! together.
//!
//! One level down, `tests/modules.rs` holds host/server's top-level modules to one-way imports:
//! [`read_module_graph`] reads which module names which (`crate::<module>` in code), and a
//! circle among them ([`find_cycle`]) fails.

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
    // the OpenID provider of hosted apps: its clients, role assignments, codes and tokens in the
    // store, its RS256 signing keys sealed under the keyring, the dashboard's handoff as methods;
    // it names Capstan users by id and takes the signed-in person as the rpc's Identity
    ("capstan-hosted-oidc", &["capstan-core", "capstan-store", "capstan-keyring", "capstan-rpc"]),
    // the inventory reaches the areas above it (secrets, plugins) only through its Dependents trait
    (
        "capstan-inventory",
        &["capstan-core", "capstan-field-rules", "capstan-store", "capstan-blobs", "capstan-rpc", "capstan-events", "capstan-auth"],
    ),
    (
        "capstan-secrets",
        &["capstan-core", "capstan-store", "capstan-keyring", "capstan-rpc", "capstan-events", "capstan-auth", "capstan-inventory"],
    ),
    // the platform login through an identity provider: its pending logins and sealed tokens in
    // the store, people made by auth, provider-granted memberships kept by the inventory
    (
        "capstan-federation",
        &["capstan-core", "capstan-store", "capstan-blobs", "capstan-keyring", "capstan-rpc", "capstan-auth", "capstan-inventory"],
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
    // storage endpoints of nodes and the providers behind them: the nodes' records, the admin
    // credentials as system secrets, the bindings' credentials as the services' own secrets
    ("capstan-storage", &["capstan-core", "capstan-store", "capstan-rpc", "capstan-inventory", "capstan-secrets", "capstan-nodes"]),
    // the runtime: specs, slots and the producer over the inventory's services and the nodes'
    // records, pull credentials from the registry, a service's secrets opened under the keyring
    // and sealed to the node's recipient, pushes through the server's sockets (the relays'
    // Sessions trait), workload logs written as segments into Capstan's bucket
    (
        "capstan-runtime",
        &[
            "capstan-core",
            "capstan-store",
            "capstan-blobs",
            "capstan-keyring",
            "capstan-rpc",
            "capstan-events",
            "capstan-inventory",
            "capstan-secrets",
            "capstan-relays",
            "capstan-nodes",
            "capstan-registry",
        ],
    ),
    // where areas meet: the inventory's Dependents and the plugin host's Platform, answered
    // (the keyring: the secrets a plugin reaches are sealed and opened with it; the nodes: the
    // nodes of clusters a plugin reads, with their liveness; the registry only behind its
    // `registry` feature, which the server turns on and the SDK's harness does not)
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
            "capstan-runtime",
            "capstan-hosted-oidc",
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
            "capstan-storage",
            "capstan-runtime",
            "capstan-hosted-oidc",
            "capstan-federation",
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
    ("capstan-plugin-bindings", &["capstan-sdk"]),
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

/// One module of a crate reaching another: the file and the path it names it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleEdge {
    /// The top-level module the file belongs to.
    pub from: String,
    /// The top-level module it names.
    pub to: String,
    /// The file, relative to the crate's `src/`.
    pub file: String,
    /// The path as written (`crate::api::AppState`).
    pub path: String,
}

/// The top-level modules `lib.rs` declares (`mod x;` / `pub mod x;`, whatever its attributes).
/// A `pub use other_crate as x;` is an alias to another crate, not a module: it is not listed.
pub fn top_level_modules(lib_rs: &str) -> Vec<String> {
    let code = strip_comments_and_strings(lib_rs);
    let mut modules = Vec::new();
    for line in code.lines() {
        let mut words = line.split_whitespace().skip_while(|w| w.starts_with("#[") || w.starts_with("pub"));
        if words.next() != Some("mod") {
            continue;
        }
        if let Some(name) = words.next().and_then(|w| w.strip_suffix(';')) {
            modules.push(name.to_string());
        }
    }
    modules
}

/// The top-level module a source file (its path relative to `src/`, `/`-separated) belongs to:
/// `metrics.rs` and `api/socket.rs` to `metrics` and `api`; `None` for the crate root.
pub fn module_of(file: &str) -> Option<String> {
    let first = file.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// Every reference from one top-level module to another among `files` (path relative to `src/`,
/// text): each `crate::<module>` in code (a `use` or a path; `crate::{a, b::c}` names each),
/// comments and string literals left out. `modules` are the crate's top-level modules
/// ([`top_level_modules`]); a name that is none of them (an alias to another crate) is no edge,
/// and neither is a module naming itself. `super::` is not followed: inside a module's own files
/// it names the module itself.
pub fn module_edges(modules: &[String], files: &[(String, String)]) -> Vec<ModuleEdge> {
    let mut edges = Vec::new();
    for (file, text) in files {
        let Some(from) = module_of(file) else { continue };
        let code = strip_comments_and_strings(text);
        for (to, path) in crate_references(&code) {
            if to != from && modules.contains(&to) {
                edges.push(ModuleEdge { from: from.clone(), to, file: file.clone(), path });
            }
        }
    }
    edges
}

/// The top-level names after each `crate::` in `code`, with the path as written.
fn crate_references(code: &str) -> Vec<(String, String)> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + "crate::".len()..];
        rest = after;
        // `$crate::` (a macro's) and `my_crate::` are other paths
        if before.is_some_and(|c| is_ident(c) || c == '$') {
            continue;
        }
        let after = after.trim_start();
        if let Some(group) = after.strip_prefix('{') {
            // `crate::{a, b::c, d as e}`: the first name of each item at the group's own depth
            let mut depth = 0usize;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && is_ident(c) => {
                        let name: String = group[i..].chars().take_while(|c| is_ident(*c)).collect();
                        found.push((name.clone(), format!("crate::{{{name}…}}")));
                        item_start = false;
                    }
                    c if c.is_whitespace() => {}
                    _ => item_start = false,
                }
            }
        } else {
            let name: String = after.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                let path: String = after.chars().take_while(|c| is_ident(*c) || *c == ':').collect();
                found.push((name, format!("crate::{}", path.trim_end_matches(':'))));
            }
        }
    }
    found
}

/// `text` with its comments and the contents of its string and character literals blanked out
/// (line breaks kept), so a path in a doc comment or a message is not taken for a reference.
pub fn strip_comments_and_strings(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == '"'
            || (c == 'r' && matches!(next, Some('"') | Some('#')) && !chars[..i].last().is_some_and(|p| p.is_alphanumeric() || *p == '_'))
        {
            // a string, or a raw string r"…" / r#"…"#
            let raw = c == 'r';
            let mut hashes = 0;
            if raw {
                i += 1;
                while chars.get(i) == Some(&'#') {
                    hashes += 1;
                    i += 1;
                }
                if chars.get(i) != Some(&'"') {
                    // `r#ident`, a raw identifier
                    out.push('r');
                    continue;
                }
            }
            i += 1;
            out.push('"');
            while i < chars.len() {
                if !raw && chars[i] == '\\' {
                    i += 2;
                    out.push_str("  ");
                    continue;
                }
                if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                blank(&mut out, chars[i]);
                i += 1;
            }
            out.push('"');
        } else if c == '\'' {
            // a character literal ('x', '\n', '\''); a lifetime ('a) has no closing quote
            if next == Some('\\') {
                let close = (i + 2..chars.len().min(i + 12)).find(|&j| chars[j] == '\'' && j > i + 2);
                i = close.map_or(i + 1, |j| j + 1);
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The module graph of the crate whose sources are under `src`: its top-level modules (from
/// `lib.rs`) and every reference between them ([`module_edges`]) in the `.rs` files below.
pub fn read_module_graph(src: &std::path::Path) -> std::io::Result<(Vec<String>, Vec<ModuleEdge>)> {
    fn walk(dir: &std::path::Path, base: &std::path::Path, files: &mut Vec<(String, String)>) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.path());
        for entry in entries {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, base, files)?;
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(base).expect("below the base").components();
                let relative: Vec<String> = relative.map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
                files.push((relative.join("/"), std::fs::read_to_string(&path)?));
            }
        }
        Ok(())
    }
    let modules = top_level_modules(&std::fs::read_to_string(src.join("lib.rs"))?);
    let mut files = Vec::new();
    walk(src, src, &mut files)?;
    Ok((modules.clone(), module_edges(&modules, &files)))
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

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn modules_are_what_lib_rs_declares_and_aliases_are_not() {
        let lib = "//! The crate.\npub use capstan_auth as auth;\npub use capstan_core::refusal;\npub mod api;\n#[cfg(test)]\nmod host_tests;\npub mod state;\n";
        assert_eq!(top_level_modules(lib), ["api", "host_tests", "state"]);
        assert_eq!(module_of("api/socket.rs").as_deref(), Some("api"));
        assert_eq!(module_of("metrics.rs").as_deref(), Some("metrics"));
        assert_eq!(module_of("lib.rs"), None);
    }

    #[test]
    fn references_are_read_from_code_alone() {
        let modules: Vec<String> = ["api", "metrics", "state", "auth_free"].iter().map(|s| s.to_string()).collect();
        let found = module_edges(
            &modules,
            &files(&[
                ("api/mod.rs", "use crate::{auth, metrics::{self, track}, state as s};\nfn f() { crate::api::x(); }"),
                ("api/socket.rs", "//! see [`crate::state::AppState`]\nlet s = \"crate::auth_free\"; let c = '\"'; crate::metrics::scrape"),
                ("metrics.rs", "/* crate::api */ fn g<'a>(x: &'a str) { $crate::api::m!(); my_crate::state::y(); }"),
                ("lib.rs", "pub mod api; use crate::state;"),
            ]),
        );
        let pairs: Vec<(&str, &str, &str)> = found.iter().map(|e| (e.from.as_str(), e.to.as_str(), e.file.as_str())).collect();
        assert_eq!(pairs, [("api", "metrics", "api/mod.rs"), ("api", "state", "api/mod.rs"), ("api", "metrics", "api/socket.rs")]);
        assert_eq!(found[2].path, "crate::metrics::scrape");
    }

    #[test]
    fn a_circle_of_modules_is_found() {
        let modules: Vec<String> = ["api", "metrics"].iter().map(|s| s.to_string()).collect();
        let found = module_edges(&modules, &files(&[("api/mod.rs", "use crate::metrics;"), ("metrics.rs", "use crate::api::AppState;")]));
        let pairs: Vec<(String, String)> = found.into_iter().map(|e| (e.from, e.to)).collect();
        assert!(find_cycle(&pairs).is_some());
    }
}
