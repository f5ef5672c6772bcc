//! Nodes: the machines of a cluster that run workloads (`docs/nodes.md`). A machine joins with
//! a single-use jump code ([`jump`]), enrolls itself ([`enroll`]) with a token it drew and of
//! which Capstan keeps only the SHA-256 ([`credentials`], kept apart from the node records),
//! then reports ([`heartbeat`]) and fetches the hostname Capstan wants it to carry
//! ([`hostnames`]). An administrator retires and deletes it ([`records`]).
//!
//! Every effect is one store transaction; node writes commit their domain event to the outbox
//! and the cluster's node snapshot in the same transaction. The agent's wire (`/agent/v1/…`)
//! is judged here ([`agent`]); the server only reads the bounded body and answers.

pub mod agent;
pub mod credentials;
pub mod enroll;
pub mod heartbeat;
pub mod hostnames;
pub mod jump;
pub mod recipients;
pub mod records;

use capstan_core::clock::Clock;
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::Registry;
use capstan_store::{CollectionSpec, Store, Tx};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

pub use records::{Node, NodeState, NodeView};

/// Nodes, by node id (the inventory's collection; it guards cluster deletion with it).
pub const CLUSTER_NODES: &str = capstan_inventory::CLUSTER_NODES;
/// Node credentials, by node id, kept apart from the node records.
pub const NODE_CREDENTIALS: &str = "node_credentials";
/// Jump codes, by the SHA-256 (lowercase hex) of the code.
pub const NODE_JUMP_CODES: &str = "node_jump_codes";
/// Each cluster's public node snapshot, by cluster id.
pub const CLUSTER_NODE_SNAPSHOTS: &str = "cluster_node_snapshots";

/// How long an accepted report stands while the setting is not set (milliseconds).
pub const DEFAULT_FRESHNESS_MS: u64 = 180_000;
/// The setting that overrides it.
pub const FRESHNESS_SETTING: &str = "nodeObservationFreshnessMs";

/// What the nodes area reaches.
#[derive(Clone)]
pub struct Context {
    /// The store every node read and write goes through.
    pub store: Store,
    /// The externally reachable origin of this Capstan, without a trailing slash: the jump
    /// command and the script point the machine at it.
    pub public_origin: String,
    /// Dev mode (`serve --dev`): a script may be rendered for an `http` origin.
    pub dev: bool,
    /// The clock every node timestamp and liveness judgement reads.
    pub clock: Clock,
    /// The `capstan-agent` file the host serves at `/agent/v1/binary/<platform>`, if any.
    pub agent_binary: Option<PathBuf>,
}

impl Context {
    /// The context `serve` builds: the agent binary from `CAPSTAN_AGENT_BINARY`, else the
    /// `capstan-agent` file next to this executable (when it exists).
    pub fn new(store: Store, public_origin: String, dev: bool) -> Context {
        let agent_binary = std::env::var_os("CAPSTAN_AGENT_BINARY").map(PathBuf::from).or_else(|| {
            let exe = std::env::current_exe().ok()?;
            let beside = exe.parent()?.join("capstan-agent");
            beside.is_file().then_some(beside)
        });
        Context { store, public_origin: public_origin.trim_end_matches('/').to_string(), dev, clock: Clock::system(), agent_binary }
    }
}

/// Every collection the nodes area keeps besides the inventory's `cluster_nodes`.
pub fn collections() -> Vec<CollectionSpec> {
    vec![
        CollectionSpec::new(NODE_CREDENTIALS),
        CollectionSpec::new(NODE_JUMP_CODES).index("by_cluster", &["clusterId"]),
        CollectionSpec::new(CLUSTER_NODE_SNAPSHOTS),
        recipients::collection(),
    ]
}

/// Declare the nodes area's collections (and the inventory's, which it writes and reads).
pub async fn declare(store: &Store) -> Result<()> {
    capstan_inventory::declare(store).await?;
    for spec in collections() {
        store.declare(spec).await?;
    }
    Ok(())
}

/// Register every `nodes.*` method.
pub fn register(registry: &mut Registry, cx: Context) {
    jump::register(registry, cx.clone());
    records::register(registry, cx.clone());
    credentials::register(registry, cx.clone());
    hostnames::register(registry, cx);
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Whether `text` is a SHA-256 in lowercase hex (64 characters).
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Equal strings compared in time independent of where they differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `id` is a node id as stored ids are judged: `^[A-Za-z0-9_-]{1,128}$`.
pub fn is_node_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A new node id: `node_<32 hex>` (first character alphanumeric).
pub fn new_node_id() -> String {
    capstan_core::ids::new_id("node")
}

/// `hostname-invalid` unless `hostname` is one lowercase RFC 1123 label (1–63 of a-z 0-9 -,
/// neither first nor last a hyphen).
pub fn check_hostname(field: &str, hostname: &str) -> Result<()> {
    let bytes = hostname.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-';
    if ok {
        return Ok(());
    }
    Err(Refusal::new("hostname-invalid", "a hostname is one lowercase DNS label: 1–63 of a-z 0-9 -, not starting or ending with -")
        .with_data(json!({ "field": field })))
}

/// `name-invalid` unless `name` is a node name the hostname scheme can carry: 1–48 of
/// a-z 0-9 -, neither first nor last a hyphen (so `worker-<name>` is one label).
pub fn check_name(field: &str, name: &str) -> Result<()> {
    if name.len() <= 48 && check_hostname(field, name).is_ok() {
        return Ok(());
    }
    Err(Refusal::new("name-invalid", "a node name is 1–48 of a-z 0-9 -, not starting or ending with -")
        .with_data(json!({ "field": field })))
}

/// The hostname the default scheme gives a node named `name`.
pub fn worker_hostname(name: &str) -> String {
    format!("worker-{name}")
}

/// The node name a hostname proposes: `worker-grasberg` names `grasberg`, `foo` names `foo`
/// (cut to 48 characters).
pub fn propose_name(hostname: &str) -> String {
    let base = hostname.strip_prefix("worker-").filter(|rest| !rest.is_empty()).unwrap_or(hostname);
    let cut: String = base.chars().take(48).collect();
    let name = cut.trim_end_matches('-').to_string();
    if check_name("name", &name).is_ok() { name } else { "node".to_string() }
}

/// How long an accepted report stands: the setting, read in `tx`, or the default.
pub async fn freshness_ms(tx: &Tx) -> Result<u64> {
    let doc = tx.get(capstan_inventory::SETTINGS, capstan_inventory::settings::PUBLIC).await?;
    Ok(doc.and_then(|d| d.data.get(FRESHNESS_SETTING).and_then(Value::as_u64)).unwrap_or(DEFAULT_FRESHNESS_MS))
}

/// `node-missing` (HTTP 404) naming the node asked for (cut to 128 characters).
pub fn node_missing(id: &str) -> Refusal {
    let shown: String = id.chars().take(128).collect();
    Refusal::new("node-missing", format!("there is no node {shown:?}")).with_data(json!({ "id": shown }))
}

/// Append this change's event in the writing transaction.
pub(crate) async fn emit(tx: &Tx, kind: &str, subject: &str, data: Value) -> Result<()> {
    capstan_events::append(tx, kind, subject, data, "host").await.map(drop)
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A nodes context on a fresh SQLite store, with one cluster (`cluster_1`, named `prod`).
    pub(crate) async fn context(dir: &std::path::Path, origin: &str, dev: bool) -> Context {
        let store = Store::new(capstan_store::sqlite::SqliteStore::open(dir.join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
        declare(&store).await.unwrap();
        store
            .transact(|tx| async move {
                tx.insert(
                    capstan_inventory::CLUSTERS,
                    "cluster_1",
                    json!({"name": "prod", "machineUserId": "usr_1", "createdAt": 1, "updatedAt": 1}),
                )
                .await
                .map(drop)
            })
            .await
            .unwrap();
        Context { store, public_origin: origin.into(), dev, clock: Clock::system(), agent_binary: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_are_one_lowercase_label() {
        for ok in ["a", "worker-1", "node-a", &"x".repeat(63)] {
            check_hostname("hostname", ok).unwrap();
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"x".repeat(64), "é"] {
            assert_eq!(check_hostname("hostname", bad).unwrap_err().code, "hostname-invalid", "{bad}");
        }
        check_name("name", &"n".repeat(48)).unwrap();
        assert_eq!(check_name("name", &"n".repeat(49)).unwrap_err().code, "name-invalid");
        assert_eq!(check_name("name", "Big").unwrap_err().code, "name-invalid");
    }

    #[test]
    fn names_are_proposed_from_hostnames() {
        assert_eq!(propose_name("worker-grasberg"), "grasberg");
        assert_eq!(propose_name("foo"), "foo");
        assert_eq!(propose_name("worker-"), "worker");
        assert_eq!(propose_name(&format!("{}-b", "a".repeat(47))), "a".repeat(47));
    }

    #[test]
    fn node_ids_and_hashes() {
        let id = new_node_id();
        assert!(is_node_id(&id) && id.starts_with("node_") && id.len() == 37, "{id}");
        assert!(is_node_id("-lead") && !is_node_id("") && !is_node_id("a.b") && !is_node_id(&"a".repeat(129)));
        let digest = sha256_hex(b"abc");
        assert_eq!(digest, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert!(is_sha256_hex(&digest) && !is_sha256_hex(&digest.to_uppercase()) && !is_sha256_hex("ab"));
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
