use super::lease::{Coordinator, Role, check_fence, read_lease};
use super::*;
use capstan_blobs::local::LocalBlobs;

async fn bucket(dir: &tempfile::TempDir) -> Blobs {
    Blobs::new(LocalBlobs::open(dir.path().to_str().unwrap()).await.unwrap())
}

fn node(blobs: &Blobs, state: &std::path::Path, id: &str) -> Node {
    let (identity, _) = NodeIdentity::load_or_create(state, Some(id)).unwrap();
    Node { blobs: blobs.clone(), identity, timing: Timing::default() }
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
    let record = a.register(addresses(), labels.clone(), None, vec!["api".into()]).await.unwrap();
    assert_eq!(record.versions.as_ref().unwrap().capstan, env!("CARGO_PKG_VERSION"));
    let nodes = read_nodes(&blobs).await.unwrap();
    assert_eq!(nodes, vec![record.clone()]);
    assert!(nodes[0].live(now_ms(), &Timing::default()));
    // re-registering with the same key is fine (a restart)
    a.register(addresses(), labels, None, vec![]).await.unwrap();

    // another key under the same id is refused, and so is a user claiming a node's id
    let other_state = tempfile::tempdir().unwrap();
    let impostor = node(&blobs, other_state.path(), "alpha");
    assert_eq!(impostor.register(addresses(), BTreeMap::new(), None, vec![]).await.unwrap_err().code, "identity-claimed");
    assert_eq!(claim_identity(&blobs, "alpha", "user", &a.identity.public_key()).await.unwrap_err().code, "identity-claimed");
}

#[tokio::test]
async fn a_beat_touches_only_its_field_and_draining_wins() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let blobs = bucket(&dir).await;
    let a = node(&blobs, state.path(), "alpha");
    let booted = a.register(addresses(), BTreeMap::new(), None, vec![]).await.unwrap();
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
    node(&blobs, s1.path(), "alpha").register(addresses(), BTreeMap::new(), None, vec![]).await.unwrap();
    let b = node(&blobs, s2.path(), "beta");
    b.register(addresses(), BTreeMap::new(), None, vec![]).await.unwrap();
    b.drain().await;
    let nodes = read_nodes(&blobs).await.unwrap();
    let listing = listing::build(now_ms(), &Timing::default(), &nodes, None, None);
    assert_eq!((listing.total, listing.live), (2, 1));
    assert_eq!(listing.versions["capstan"], vec![(env!("CARGO_PKG_VERSION").to_string(), 2)]);
    let text = listing::render(&listing);
    assert!(text.starts_with("fleet: 2 nodes, 1 live\n"), "{text}");
    assert!(text.contains("draining"));
}
