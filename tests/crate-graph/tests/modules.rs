//! Holds host/server's top-level modules to one-way imports: `api` may reach the state it is
//! served from, the state may not reach back into `api`, and so on down. A module naming another
//! (`crate::<module>` in its code, tests included) is an edge; any circle of edges fails.

use capstan_crate_graph::{find_cycle, read_module_graph};

#[test]
fn the_server_modules_import_each_other_in_no_circle() {
    let src = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../host/server/src"));
    let (modules, edges) = read_module_graph(src).expect("host/server/src is readable");
    for expected in ["api", "serve", "state", "sessions", "metrics"] {
        assert!(modules.iter().any(|m| m == expected), "lib.rs declares {expected}: {modules:?}");
    }
    assert!(edges.iter().any(|e| e.from == "serve" && e.to == "api"), "the references were read: {edges:?}");
    let pairs: Vec<(String, String)> = edges.iter().map(|e| (e.from.clone(), e.to.clone())).collect();
    if let Some(cycle) = find_cycle(&pairs) {
        // name what ties each step of the circle, so the fix can start at the right line
        let ties: Vec<String> = cycle
            .windows(2)
            .map(|step| {
                let seen: Vec<String> = edges
                    .iter()
                    .filter(|e| e.from == step[0] && e.to == step[1])
                    .take(3)
                    .map(|e| format!("{} ({})", e.path, e.file))
                    .collect();
                format!("{} -> {}: {}", step[0], step[1], seen.join(", "))
            })
            .collect();
        panic!("host/server's modules import each other in a circle: {}\n  {}", cycle.join(" -> "), ties.join("\n  "));
    }
}
