use super::lease::{Coordinator, Role, check_fence, read_lease};
use super::*;
use capstan_blobs::local::LocalBlobs;

async fn bucket(dir: &tempfile::TempDir) -> Blobs {
    Blobs::new(LocalBlobs::open(dir.path().to_str().unwrap()).await.unwrap())
}

fn node(blobs: &Blobs, state: &std::path::Path, id: &str) -> Node {
    let (identity, _) = NodeIdentity::load_or_create(state, Some(id)).unwrap();
    Node::new(blobs.clone(), identity, Timing::default(), None)
}

fn addresses() -> Addresses {
    Addresses { internal: "127.0.0.1".into(), api_port: 8080 }
}

#[tokio::test]
async fn registration_writes_the_record_and_claims_the_id() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let blobs = bucket(&dir).await;
    let a = node(&blobs, state.path(), "alpha");
    let labels: BTreeMap<String, String> = [("tier".to_string(), "fast".to_string())].into();
    let record = a.register(addresses(), labels.clone(), vec!["api".into()]).await.unwrap();
    let versions = record.versions.as_ref().unwrap();
    assert_eq!(versions.capstan, env!("CARGO_PKG_VERSION"));
    // the contract and engine plugins run on, as the plugin host names them
    assert_eq!(versions.wit_world, capstan_core::build::PLUGIN_CONTRACT);
    assert!(versions.wit_world.starts_with("capstan:plugin@"), "{}", versions.wit_world);
    assert_eq!(versions.wasmtime.as_deref(), Some(capstan_core::build::PLUGIN_ENGINE));
    let nodes = read_nodes(&blobs).await.unwrap();
    assert_eq!(nodes, vec![record.clone()]);
    assert!(nodes[0].live(now_ms(), &Timing::default()));
    // re-registering with the same key is fine (a restart)
    a.register(addresses(), labels, vec![]).await.unwrap();

    // another key under the same id is refused, and so is a user claiming a node's id
    let other_state = tempfile::tempdir().unwrap();
    let impostor = node(&blobs, other_state.path(), "alpha");
    assert_eq!(impostor.register(addresses(), BTreeMap::new(), vec![]).await.unwrap_err().code, "identity-claimed");
    assert_eq!(claim_identity(&blobs, "alpha", "user", &a.identity.public_key()).await.unwrap_err().code, "identity-claimed");
}

#[tokio::test]
async fn a_beat_touches_only_its_field_and_draining_wins() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let blobs = bucket(&dir).await;
    let a = node(&blobs, state.path(), "alpha");
    let booted = a.register(addresses(), BTreeMap::new(), vec![]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    a.beat().await.unwrap();
    let after = read_nodes(&blobs).await.unwrap().remove(0);
    assert!(after.heartbeat_at > booted.heartbeat_at);
    assert_eq!(after.versions, booted.versions, "a heartbeat never rewrites versions");
    a.drain().await;
    a.beat().await.unwrap();
    let drained = read_nodes(&blobs).await.unwrap().remove(0);
    assert!(drained.draining_at.is_some(), "a beat after draining does not undo it");
    let now = now_ms();
    assert!(!drained.live(now, &Timing::default()));
    assert!(drained.answering(now, &Timing::default()), "a draining node still answers");
}

#[test]
fn liveness_is_an_age() {
    let timing = Timing::default();
    let mut r = NodeRecord {
        node_id: "n".into(),
        public_key: String::new(),
        addresses: addresses(),
        labels: BTreeMap::new(),
        versions: None,
        serves: vec![],
        network: None,
        booted_at: 0,
        heartbeat_at: None,
        draining_at: None,
        signature: None,
    };
    assert!(!r.live(1_000_000, &timing), "never beaten is not live");
    r.heartbeat_at = Some(1_000_000 - 90_000);
    assert!(r.live(1_000_000, &timing));
    assert!(!r.live(1_000_001, &timing), "outside the window");
}

#[tokio::test]
async fn the_lease_has_one_holder_and_moves_with_a_higher_fence() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = bucket(&dir).await;
    let ttl = Duration::from_millis(300);
    let a = Coordinator::new(blobs.clone(), "alpha", ttl);
    let b = Coordinator::new(blobs.clone(), "beta", ttl);
    assert_eq!(a.tick().await, Role::Holder { fence: 1 });
    assert_eq!(b.tick().await, Role::Candidate { holder: Some("alpha".into()), fence: 1 });
    assert_eq!(a.tick().await, Role::Holder { fence: 1 }, "renewal keeps the fence");
    check_fence(&blobs, 1).await.unwrap();

    // alpha stops renewing (dies): after the TTL beta takes over with a higher fence
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    assert_eq!(a.fence(), None, "a holder that missed its renewals stops acting as coordinator");
    assert_eq!(b.tick().await, Role::Holder { fence: 2 });
    assert_eq!(read_lease(&blobs).await.unwrap().unwrap().holder, "beta");

    // a decision alpha stamped under fence 1 is refused now
    let stale = check_fence(&blobs, 1).await.unwrap_err();
    assert_eq!((stale.code.as_ref(), stale.retryable, stale.http_status()), ("fence-stale", true, 503));
    check_fence(&blobs, 2).await.unwrap();
    // and alpha, coming back, is a candidate
    assert_eq!(a.tick().await, Role::Candidate { holder: Some("beta".into()), fence: 2 });
}

#[tokio::test]
async fn racing_candidates_elect_exactly_one() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = bucket(&dir).await;
    let coordinators: Vec<_> =
        (0..6).map(|i| std::sync::Arc::new(Coordinator::new(blobs.clone(), &format!("n{i}"), Duration::from_secs(30)))).collect();
    let tasks: Vec<_> = coordinators.iter().cloned().map(|c| tokio::spawn(async move { c.tick().await })).collect();
    let mut holders = 0;
    for t in tasks {
        if matches!(t.await.unwrap(), Role::Holder { .. }) {
            holders += 1;
        }
    }
    assert_eq!(holders, 1);
}

#[tokio::test]
async fn release_hands_over_without_waiting_for_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = bucket(&dir).await;
    let a = Coordinator::new(blobs.clone(), "alpha", Duration::from_secs(60));
    let b = Coordinator::new(blobs.clone(), "beta", Duration::from_secs(60));
    a.tick().await;
    a.release().await;
    assert_eq!(b.tick().await, Role::Holder { fence: 2 });
}

#[tokio::test]
async fn a_freeze_refuses_deploys_until_lifted() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = bucket(&dir).await;
    refuse_if_frozen(&blobs).await.unwrap();
    freeze(&blobs, "alice", "release week").await.unwrap();
    assert_eq!(refuse_if_frozen(&blobs).await.unwrap_err().code, "deploy-frozen");
    assert_eq!(freeze(&blobs, "bob", "again").await.unwrap_err().code, "deploy-frozen");
    assert_eq!(freeze(&blobs, "bob", " ").await.unwrap_err().code, "invalid-request");
    assert!(unfreeze(&blobs).await.unwrap());
    refuse_if_frozen(&blobs).await.unwrap();
}

#[tokio::test]
async fn the_listing_counts_versions_and_states_on_one_clock() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = bucket(&dir).await;
    let s1 = tempfile::tempdir().unwrap();
    let s2 = tempfile::tempdir().unwrap();
    node(&blobs, s1.path(), "alpha").register(addresses(), BTreeMap::new(), vec![]).await.unwrap();
    let b = node(&blobs, s2.path(), "beta");
    b.register(addresses(), BTreeMap::new(), vec![]).await.unwrap();
    b.drain().await;
    let nodes = read_nodes(&blobs).await.unwrap();
    let listing = listing::build(now_ms(), &Timing::default(), &nodes, None, None);
    assert_eq!((listing.total, listing.live), (2, 1));
    assert_eq!(listing.versions["capstan"], vec![(env!("CARGO_PKG_VERSION").to_string(), 2)]);
    let text = listing::render(&listing);
    assert!(text.starts_with("fleet: 2 nodes, 1 live\n"), "{text}");
    assert!(text.contains("draining"));
}

#[tokio::test]
async fn a_record_someone_else_rewrote_is_skipped_and_the_next_beat_restores_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let blobs = bucket(&dir).await;
    let a = node(&blobs, state.path(), "alpha");
    a.register(addresses(), BTreeMap::new(), vec![]).await.unwrap();
    let key = node_key("alpha");
    let (_, bytes) = blobs.get_bytes(&key).await.unwrap().unwrap();
    let mut tampered: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    tampered["addresses"]["internal"] = json!("203.0.113.9");
    blobs.put_bytes(&key, serde_json::to_vec(&tampered).unwrap(), PutMode::Overwrite).await.unwrap();
    assert!(read_nodes(&blobs).await.unwrap().is_empty(), "a record whose signature fails is not listed");

    // the beat writes what the node knows, signed: the other writer's address is gone
    a.beat().await.unwrap();
    let restored = read_nodes(&blobs).await.unwrap().remove(0);
    assert_eq!(restored.addresses.internal, "127.0.0.1");
    signed::verify(&key, &blobs.get_bytes(&key).await.unwrap().unwrap().1).unwrap();
}

#[tokio::test]
async fn forwarding_follows_only_a_record_its_node_signed_and_never_leaves_a_public_network() {
    let dir = tempfile::tempdir().unwrap();
    let (holder_state, asker_state, forger_state, public_state) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let blobs = bucket(&dir).await;
    let holder = runtime::Fleet::new(std::sync::Arc::new(node(&blobs, holder_state.path(), "holder")));
    holder.node.register(addresses(), BTreeMap::new(), vec![]).await.unwrap();
    assert_eq!(holder.coordinator.tick().await, Role::Holder { fence: 1 });
    let asker = runtime::Fleet::new(std::sync::Arc::new(node(&blobs, asker_state.path(), "asker")));
    let to_holder = forward::Route::Holder { node_id: "holder".into(), base_url: "http://127.0.0.1:8080".into() };
    assert_eq!(forward::route(&asker, false).await.unwrap(), to_holder);

    let key = node_key("holder");
    let (_, signed_bytes) = blobs.get_bytes(&key).await.unwrap().unwrap();
    let put = |bytes: Vec<u8>| {
        let (blobs, key) = (blobs.clone(), key.clone());
        async move { blobs.put_bytes(&key, bytes, PutMode::Overwrite).await.unwrap() }
    };
    let cause = |refused: Refusal| {
        assert_eq!((refused.code.as_ref(), refused.http_status()), ("coordinator-unavailable", 503), "{refused}");
        refused.data.unwrap()["cause"].as_str().unwrap().to_string()
    };

    // an address someone rewrote
    let mut moved: serde_json::Value = serde_json::from_slice(&signed_bytes).unwrap();
    moved["addresses"]["internal"] = json!("203.0.113.9");
    put(serde_json::to_vec(&moved).unwrap()).await;
    assert_eq!(cause(forward::route(&asker, false).await.unwrap_err()), "fleet-record-signature-invalid");
    // a record another key signed under the holder's id: valid as a signature, not as the holder
    let (forger, _) = NodeIdentity::load_or_create(forger_state.path(), Some("holder")).unwrap();
    let mut forged: NodeRecord = serde_json::from_slice(&signed_bytes).unwrap();
    forged.public_key = forger.public_key();
    forged.addresses.internal = "203.0.113.9".into();
    put(serde_json::to_vec(&signed::sign(&forger, forged).unwrap()).unwrap()).await;
    assert_eq!(cause(forward::route(&asker, false).await.unwrap_err()), "fleet-record-signature-invalid");
    // no signature at all
    let mut unsigned: serde_json::Value = serde_json::from_slice(&signed_bytes).unwrap();
    unsigned.as_object_mut().unwrap().remove("signature");
    put(serde_json::to_vec(&unsigned).unwrap()).await;
    assert_eq!(cause(forward::route(&asker, false).await.unwrap_err()), "fleet-record-unsigned");

    // the holder's own write makes it followed again
    holder.node.beat().await.unwrap();
    assert_eq!(forward::route(&asker, false).await.unwrap(), to_holder);

    // a node on a public network sends the client to the holder instead of forwarding its token
    let (identity, _) = NodeIdentity::load_or_create(public_state.path(), Some("edge")).unwrap();
    let public = runtime::Fleet::new(std::sync::Arc::new(Node::new(blobs.clone(), identity, Timing::default(), Some("public".into()))));
    let refused = forward::route(&public, false).await.unwrap_err();
    assert_eq!((refused.code.as_ref(), refused.http_status()), ("coordinator-elsewhere", 421), "{refused}");
    assert_eq!(refused.data.unwrap()["address"], "http://127.0.0.1:8080");
}
