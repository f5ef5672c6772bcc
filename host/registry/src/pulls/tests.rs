//! Pull credentials in a real SQLite store: issued, exchanged at the token flow, used as a
//! bearer, expired, revoked and swept.

use super::*;
use capstan_core::clock::now_ms;

pub(crate) const REPO: &str = "workloads/web-0123456789ab";
pub(crate) const HOLDER: &str = "asg_0123456789abcdef";

/// A store with the registry's collections (and authentication's, for the token flow's limits).
pub(crate) async fn store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("s.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
    crate::declare(&store).await.unwrap();
    for spec in capstan_auth::collections() {
        store.declare(spec).await.unwrap();
    }
    (store, dir)
}

/// Make `credential`'s record expire `secs_ago` seconds ago.
pub(crate) async fn expire(store: &Store, credential: &PullCredential, secs_ago: u64) {
    let id = credential.id();
    store
        .transact(|tx| async move {
            let doc = tx.require(PULL_CREDENTIALS, id).await?;
            let mut data = doc.data.clone();
            data["expiresAt"] = json!(now_ms() - secs_ago * 1000);
            tx.replace(PULL_CREDENTIALS, id, doc.revision, data).await.map(drop)
        })
        .await
        .unwrap();
}

/// The token flow's answer to a pull credential, from a client on loopback.
pub(crate) async fn token(store: &Store, username: &str, password: &str) -> Result<Value> {
    crate::token::pull_token(store, username, password, Some(std::net::IpAddr::from([127, 0, 0, 1]))).await
}

fn denied(result: Result<Grant>) {
    match result {
        Err(e) => assert!(e.is("unauthenticated"), "{e:?}"),
        Ok(grant) => panic!("accepted: {grant:?}"),
    }
}

async fn record(store: &Store, id: &str) -> Option<Value> {
    store.transact(|tx| async move { tx.get(PULL_CREDENTIALS, id).await }).await.unwrap().map(|d| d.data)
}

#[tokio::test]
async fn an_issued_credential_is_stored_only_as_its_digest() {
    let (store, _dir) = store().await;
    let before = now_ms();
    let credential = issue(&store, REPO, HOLDER, Duration::from_secs(600)).await.unwrap();
    let id = credential.id().to_string();
    assert!(id.starts_with("pcr_") && id.len() == 36, "{id}");
    assert_eq!(credential.username, format!("capstan-pull.{id}"));
    let secret = credential.password.expose();
    assert!(secret.starts_with("capstan_pull_") && secret.len() == "capstan_pull_".len() + 64, "a secret of 64 hex digits");
    assert!(!credential.username.contains(&secret["capstan_pull_".len()..]));
    assert!((before + 600_000..=now_ms() + 600_000).contains(&credential.expires_at), "milliseconds since the epoch");

    let data = record(&store, &id).await.unwrap();
    assert_eq!(data["repository"], REPO);
    assert_eq!(data["holder"], HOLDER);
    assert_eq!(data["secretHash"], hex::encode(Sha256::digest(secret.as_bytes())));
    assert_eq!(data["expiresAt"], credential.expires_at);
    assert_eq!(data["issuedAt"].as_u64().unwrap() + 600_000, credential.expires_at);
    assert!(!data.to_string().contains(&secret["capstan_pull_".len()..]), "the secret is not stored");

    let other = issue(&store, REPO, HOLDER, Duration::from_secs(600)).await.unwrap();
    assert_ne!(other.username, credential.username);
    assert_ne!(other.password.expose(), secret);
}

#[tokio::test]
async fn a_ttl_past_an_hour_or_under_a_second_and_bad_names_are_refused() {
    let (store, _dir) = store().await;
    for ttl in [Duration::ZERO, Duration::from_millis(999), MAX_TTL + Duration::from_secs(1), Duration::from_secs(24 * 3600)] {
        let refused = issue(&store, REPO, HOLDER, ttl).await.unwrap_err();
        assert_eq!(refused.code, "pull-credential-ttl-invalid", "{ttl:?}");
    }
    issue(&store, REPO, HOLDER, MAX_TTL).await.unwrap();
    for repository in ["", "Web", "a//b", "/a"] {
        assert_eq!(issue(&store, repository, HOLDER, MAX_TTL).await.unwrap_err().code, "registry-name-invalid", "{repository:?}");
    }
    for holder in ["", "asg 1", "asg\n1", &"a".repeat(129)] {
        assert_eq!(issue(&store, REPO, holder, MAX_TTL).await.unwrap_err().code, "pull-credential-holder-invalid", "{holder:?}");
    }
}

#[tokio::test]
async fn debug_never_prints_the_secret() {
    let (store, _dir) = store().await;
    let credential = issue(&store, REPO, HOLDER, Duration::from_secs(60)).await.unwrap();
    let shown = format!("{credential:?} {:?} {credential:#?}", credential.password);
    assert!(!shown.contains(credential.password.expose()), "{shown}");
    assert!(!shown.contains(&credential.password.expose()["capstan_pull_".len()..]), "{shown}");
    assert!(shown.contains("[redacted]") && shown.contains(&credential.username), "{shown}");
}

#[tokio::test]
async fn the_username_and_password_are_exchanged_for_a_grant_of_one_repository() {
    let (store, _dir) = store().await;
    let credential = issue(&store, REPO, HOLDER, Duration::from_secs(600)).await.unwrap();
    let other = issue(&store, "workloads/api-abcdefabcdef", "asg_other", Duration::from_secs(600)).await.unwrap();
    let (user, secret) = (credential.username.as_str(), credential.password.expose());
    let now = now_ms();

    let grant = exchange(&store, user, secret, now).await.unwrap();
    assert_eq!(grant, Grant { credential_id: credential.id().into(), repository: REPO.into(), expires_at: credential.expires_at });
    assert!(grant.allows(REPO, Action::Pull));
    assert!(!grant.allows("workloads/api-abcdefabcdef", Action::Pull));
    assert!(!grant.allows(REPO, Action::Push) && !grant.allows(REPO, Action::Delete));

    // every failure is the one denial
    let wrong = format!("{secret}0");
    denied(exchange(&store, user, &wrong, now).await);
    denied(exchange(&store, user, other.password.expose(), now).await);
    denied(exchange(&store, &other.username, secret, now).await);
    denied(exchange(&store, "capstan-pull.pcr_00000000000000000000000000000000", secret, now).await);
    denied(exchange(&store, "capstan-pull.nothing", secret, now).await);
    denied(exchange(&store, credential.id(), secret, now).await);
    denied(exchange(&store, user, "", now).await);
    // expired: accepted up to its last second, not at its expiry
    exchange(&store, user, secret, credential.expires_at - 1).await.unwrap();
    denied(exchange(&store, user, secret, credential.expires_at).await);
}

#[tokio::test]
async fn the_token_flow_answers_the_secret_as_a_bearer_of_the_grant() {
    let (store, _dir) = store().await;
    let credential = issue(&store, REPO, HOLDER, Duration::from_secs(600)).await.unwrap();
    let (user, secret) = (credential.username.as_str(), credential.password.expose());

    let body = token(&store, user, secret).await.unwrap();
    assert_eq!(body["token"], body["access_token"]);
    let expires_in = body["expires_in"].as_u64().unwrap();
    assert!((590..=600).contains(&expires_in), "{expires_in}");
    let bearer = body["token"].as_str().unwrap();
    let grant = bearer_grant(&store, bearer, now_ms()).await.unwrap();
    assert_eq!((grant.credential_id.as_str(), grant.repository.as_str()), (credential.id(), REPO));

    let refused = token(&store, user, &format!("{secret}x")).await.unwrap_err();
    assert!(refused.is("unauthenticated"), "{refused:?}");
    assert!(!format!("{refused:?}").contains(secret));
    let refused = token(&store, "capstan-pull.pcr_00000000000000000000000000000000", secret).await.unwrap_err();
    assert!(refused.is("unauthenticated"), "{refused:?}");

    // a bearer that is not a live credential's secret is the one denial
    denied(bearer_grant(&store, &format!("{bearer}0"), now_ms()).await);
    denied(bearer_grant(&store, "capstan_pull_", now_ms()).await);
    denied(bearer_grant(&store, &secret["capstan_pull_".len()..], now_ms()).await);
    denied(bearer_grant(&store, bearer, credential.expires_at).await);
}

#[tokio::test]
async fn an_expired_credential_is_refused_at_the_token_flow_and_as_a_bearer() {
    let (store, _dir) = store().await;
    let credential = issue(&store, REPO, HOLDER, Duration::from_secs(600)).await.unwrap();
    let (user, secret) = (credential.username.as_str(), credential.password.expose());
    let bearer = token(&store, user, secret).await.unwrap()["token"].as_str().unwrap().to_string();
    expire(&store, &credential, 1).await;
    assert!(token(&store, user, secret).await.unwrap_err().is("unauthenticated"));
    denied(exchange(&store, user, secret, now_ms()).await);
    denied(bearer_grant(&store, &bearer, now_ms()).await);
}

#[tokio::test]
async fn revoking_a_holder_ends_its_credentials_and_their_bearers_at_once() {
    let (store, _dir) = store().await;
    let first = issue(&store, REPO, HOLDER, Duration::from_secs(600)).await.unwrap();
    let second = issue(&store, "workloads/api-abcdefabcdef", HOLDER, Duration::from_secs(600)).await.unwrap();
    let kept = issue(&store, REPO, "asg_other", Duration::from_secs(600)).await.unwrap();
    let now = now_ms();
    for c in [&first, &second, &kept] {
        exchange(&store, &c.username, c.password.expose(), now).await.unwrap();
    }

    revoke(&store, HOLDER).await.unwrap();
    for c in [&first, &second] {
        denied(exchange(&store, &c.username, c.password.expose(), now).await);
        denied(bearer_grant(&store, c.password.expose(), now).await);
        assert!(record(&store, c.id()).await.is_none());
    }
    exchange(&store, &kept.username, kept.password.expose(), now).await.unwrap();
    bearer_grant(&store, kept.password.expose(), now).await.unwrap();
    // revoking again, or a holder with none, is nothing to do
    revoke(&store, HOLDER).await.unwrap();
    revoke(&store, "asg_none").await.unwrap();
}

#[tokio::test]
async fn the_sweep_drops_expired_records_only() {
    let (store, _dir) = store().await;
    let short = issue(&store, REPO, HOLDER, Duration::from_secs(60)).await.unwrap();
    let long = issue(&store, REPO, HOLDER, Duration::from_secs(3600)).await.unwrap();
    let gone = issue(&store, REPO, "asg_2", Duration::from_secs(600)).await.unwrap();
    expire(&store, &gone, 10).await;

    assert_eq!(sweep(&store, now_ms()).await.unwrap(), 1);
    assert!(record(&store, gone.id()).await.is_none());
    assert!(record(&store, short.id()).await.is_some());
    assert_eq!(sweep(&store, now_ms()).await.unwrap(), 0, "nothing else expired yet");

    assert_eq!(sweep(&store, short.expires_at).await.unwrap(), 1, "expired at its expiry");
    assert!(record(&store, short.id()).await.is_none());
    exchange(&store, &long.username, long.password.expose(), now_ms()).await.unwrap();
    assert_eq!(sweep(&store, long.expires_at + 1).await.unwrap(), 1);
    assert_eq!(sweep(&store, u64::MAX).await.unwrap(), 0);
}

#[test]
fn usernames_name_a_credential_id_only_in_their_one_form() {
    assert_eq!(credential_id("capstan-pull.pcr_0123456789abcdef0123456789abcdef"), Some("pcr_0123456789abcdef0123456789abcdef"));
    for bad in [
        "capstan-pull.pcr_0123456789ABCDEF0123456789abcdef",
        "capstan-pull.pcr_0123456789abcdef0123456789abcde",
        "capstan-pull.usr_0123456789abcdef0123456789abcdef",
        "capstan-pull.",
        "pcr_0123456789abcdef0123456789abcdef",
        "alice",
    ] {
        assert_eq!(credential_id(bad), None, "{bad}");
    }
    assert!(is_pull_secret("capstan_pull_x") && !is_pull_secret("capstan_mt_x") && !is_pull_secret("eyJ..."));
    let hex = "0123456789abcdef".repeat(4);
    assert!(well_formed(&format!("capstan_pull_{hex}")));
    for bad in
        [format!("capstan_pull_{hex}0"), format!("capstan_pull_{}", &hex[1..]), format!("capstan_pull_{}", hex.to_uppercase()), hex.clone()]
    {
        assert!(!well_formed(&bad), "{bad}");
    }
    assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"abc", b"ab"));
}

#[tokio::test]
async fn many_are_issued_in_one_transaction_in_order_or_none_when_one_is_refused() {
    let (store, _dir) = store().await;
    let wanted = [(REPO, "asg_1"), ("workloads/api-0123456789ab", "asg_2"), (REPO, "asg_3")];
    let issued = issue_many(&store, &wanted, Duration::from_secs(600)).await.unwrap();
    assert_eq!(issued.len(), 3);
    for ((repository, holder), credential) in wanted.iter().zip(&issued) {
        let data = record(&store, credential.id()).await.unwrap();
        assert_eq!((data["repository"].as_str(), data["holder"].as_str()), (Some(*repository), Some(*holder)), "in order");
        assert_eq!(data["secretHash"], hex::encode(Sha256::digest(credential.password.expose().as_bytes())));
    }
    assert!(issue_many(&store, &[], Duration::from_secs(600)).await.unwrap().is_empty());
    // one bad pair refuses the whole batch, and nothing of it is stored
    let refused = issue_many(&store, &[(REPO, "asg_4"), ("Bad", "asg_5")], Duration::from_secs(600)).await.unwrap_err();
    assert_eq!(refused.code, "registry-name-invalid");
    let stored = store.transact(|tx| async move { tx.scan(PULL_CREDENTIALS, None, 100).await }).await.unwrap();
    assert_eq!(stored.documents.len(), 3, "the refused batch wrote nothing");
}
