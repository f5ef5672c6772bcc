use super::methods::*;
use super::*;
use capstan_rpc::{Call, Registry};

const PASSWORD: &str = "a-long-enough-admin-password";

/// What these tests reach: the store and blobs auth stands on, auth itself, and its methods.
struct AppState {
    store: Store,
    blobs: Blobs,
    auth: Arc<Auth>,
    methods: Registry,
}

async fn setup() -> (tempfile::TempDir, AppState) {
    let dir = tempfile::tempdir().unwrap();
    let store =
        Store::new(capstan_store::sqlite::SqliteStore::open(dir.path().join("capstan.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET);
    let blobs = Blobs::new(capstan_blobs::local::LocalBlobs::open(dir.path().join("blobs").to_str().unwrap()).await.unwrap());
    let keyring = Keyring::generate(None, None).unwrap();
    let auth = Auth::new(store.clone(), &keyring, "http://capstan.test").await.unwrap();
    capstan_events::declare(&store).await.unwrap();
    let mut methods = Registry::default();
    register(&mut methods, Context { auth: auth.clone(), store: store.clone(), blobs: blobs.clone() });
    let state = AppState { store, blobs, auth, methods };
    assert_eq!(
        bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap(),
        Bootstrap::Created { username: "admin".into() }
    );
    (dir, state)
}

fn call(_: &AppState, identity: Option<Identity>) -> Call {
    Call { identity, source: Some("192.0.2.1".parse().unwrap()), ..Call::default() }
}

async fn admin(state: &AppState) -> Identity {
    let answer = state.auth.login("admin", PASSWORD, None).await.unwrap();
    state.auth.authenticate(&answer.token).await.unwrap()
}

fn rotate(user_id: &str, generation: u64, mutation_id: &str, password: &str) -> MutateInput {
    MutateInput {
        user_id: user_id.into(),
        expected_generation: generation,
        mutation_id: mutation_id.into(),
        operation: Operation::RotatePassword { new_password: password.into() },
    }
}

async fn mutate(state: &AppState, actor: &Identity, input: MutateInput) -> Result<MutationAnswer> {
    let method = state.methods.get("admin.mutateHumanCredential").unwrap();
    let answer = method.call(call(state, Some(actor.clone())), serde_json::to_value(&input).unwrap()).await?;
    Ok(serde_json::from_value(answer).unwrap())
}

#[tokio::test]
async fn a_session_s_moments_are_milliseconds_and_its_jwt_claims_seconds() {
    let (_dir, state) = setup().await;
    let before = now_ms();
    let answer = state.auth.login("admin", PASSWORD, None).await.unwrap();
    let twelve_hours = capstan_core::clock::millis(HUMAN_SESSION);
    assert!((before + twelve_hours..=now_ms() + twelve_hours).contains(&answer.expires_at), "{}", answer.expires_at);
    let claims = state.auth.keys.verify(&answer.token).unwrap();
    assert_eq!(claims.exp, answer.expires_at / 1000, "RFC 7519 counts seconds");
    let identity = state.auth.authenticate(&answer.token).await.unwrap();
    assert_eq!((identity.expires_at, identity.authenticated_at), (answer.expires_at, claims.auth_time * 1000));
    identity.require_fresh().unwrap();
    let (sid, uid) = (claims.sid.as_str(), identity.user_id.as_str());
    let session = state.store.transact(|tx| async move { tx.get(SESSIONS, sid).await }).await.unwrap().unwrap();
    let created = session.data["createdAt"].as_u64().unwrap();
    assert!((before..=now_ms()).contains(&created), "{created}");
    let user = state.store.transact(|tx| async move { tx.get(USERS, uid).await }).await.unwrap().unwrap();
    assert!(user.data["createdAt"].as_u64().unwrap() > capstan_core::clock::SECONDS_BELOW, "{}", user.data);
}

#[tokio::test]
async fn bootstrap_never_overwrites_and_user_records_carry_no_password() {
    let (_dir, state) = setup().await;
    let again = bootstrap_admin(&state.store, &state.blobs, "admin", "another-long-password-value").await.unwrap();
    assert_eq!(again, Bootstrap::AlreadyExists { username: "admin".into() });
    state.auth.login("admin", PASSWORD, None).await.expect("the original password still works");
    let users = state.store.transact(|tx| async move { tx.scan(USERS, None, 10).await }).await.unwrap();
    let text = serde_json::to_string(&users.documents).unwrap();
    assert!(!text.contains("scrypt") && !text.contains("verifier"), "{text}");
    assert_eq!(check_user_record(&json!({"username": "x", "passwordHash": "y"})).unwrap_err().code, "user-record-carries-password");
    assert_eq!(bootstrap_admin(&state.store, &state.blobs, "other", "short").await.unwrap_err().code, "password-too-short");
}

#[tokio::test]
async fn wrong_username_and_wrong_password_get_the_same_denial() {
    let (_dir, state) = setup().await;
    let wrong_password = state.auth.login("admin", "not-the-password-at-all", None).await.unwrap_err();
    let wrong_user = state.auth.login("nobody", PASSWORD, None).await.unwrap_err();
    let malformed_user = state.auth.login("bad name!", PASSWORD, None).await.unwrap_err();
    assert_eq!(wrong_password, wrong_user);
    assert_eq!(wrong_user, malformed_user);
    assert_eq!(wrong_user.code, "unauthenticated");
}

#[tokio::test]
async fn failed_logins_slow_down_the_client_that_makes_them_and_not_the_user() {
    let (_dir, state) = setup().await;
    let stranger = Some("198.51.100.7".parse().unwrap());
    for _ in 0..5 {
        assert_eq!(state.auth.login("admin", "wrong-wrong-wrong-wrong", stranger).await.unwrap_err().code, "unauthenticated");
    }
    let limited = state.auth.login("admin", PASSWORD, stranger).await.unwrap_err();
    assert_eq!(limited.code, "rate-limited");
    let wait = limited.data.unwrap()["retryAfterMs"].as_u64().unwrap();
    assert!((1..=1000).contains(&wait), "the first wait is at most a second: {wait}");
    // the user, from their own address, is not locked out by a stranger's guesses
    state.auth.login("admin", PASSWORD, Some("203.0.113.9".parse().unwrap())).await.expect("the user logs in from elsewhere");
    // the address limit is separate and larger: other usernames from the stranger still answer
    assert_eq!(state.auth.login("someone", "whatever-whatever-whatever", stranger).await.unwrap_err().code, "unauthenticated");
    // the count is in the store, so every node of a fleet sees it
    let key = attempts::user_key("admin", stranger);
    let elsewhere = attempts::begin(&state.store, &[(key, attempts::PER_USER_AND_CLIENT)]).await.unwrap_err();
    assert_eq!(elsewhere.code, "rate-limited");
    // once the wait has passed one more guess is checked, and the next wait is longer
    tokio::time::sleep(std::time::Duration::from_millis(wait + 50)).await;
    assert_eq!(state.auth.login("admin", "wrong-wrong-wrong-wrong", stranger).await.unwrap_err().code, "unauthenticated");
    let longer = state.auth.login("admin", "wrong-wrong-wrong-wrong", stranger).await.unwrap_err();
    assert_eq!(longer.code, "rate-limited");
    assert!(longer.data.unwrap()["retryAfterMs"].as_u64().unwrap() > 1000, "the wait doubled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_wrong_logins_count_before_hashing_and_a_good_one_takes_its_count_back() {
    let (_dir, state) = setup().await;
    // a success leaves no count behind: ten wrong ones still answer after it
    state.auth.login("admin", PASSWORD, None).await.unwrap();
    // forty at once for one username: each counts before its scrypt runs, so no more than the
    // five free ones are checked, and the rest are refused without hashing
    let attempts: Vec<_> = (0..40)
        .map(|_| {
            let auth = state.auth.clone();
            tokio::spawn(async move { auth.login("admin", "wrong-wrong-wrong-wrong", None).await.unwrap_err().code })
        })
        .collect();
    let mut checked = 0;
    for attempt in attempts {
        match attempt.await.unwrap().as_ref() {
            "unauthenticated" => checked += 1,
            "rate-limited" => {}
            other => panic!("unexpected refusal {other}"),
        }
    }
    assert!((1..=5).contains(&checked), "{checked} wrong passwords were checked; five are free");
}

#[tokio::test]
async fn sessions_end_on_logout_and_on_credential_mutations() {
    let (_dir, state) = setup().await;
    let first = state.auth.login("admin", PASSWORD, None).await.unwrap();
    let identity = state.auth.authenticate(&first.token).await.unwrap();
    assert!(identity.is_human_admin());
    state.auth.logout(&identity).await.unwrap();
    assert_eq!(state.auth.authenticate(&first.token).await.unwrap_err().code, "unauthenticated");

    let actor = admin(&state).await;
    let bystander = state.auth.login("admin", PASSWORD, None).await.unwrap();
    let answer = mutate(
        &state,
        &actor,
        MutateInput {
            user_id: actor.user_id.clone(),
            expected_generation: 1,
            mutation_id: "m1".into(),
            operation: Operation::RevokeSessions {},
        },
    )
    .await
    .unwrap();
    assert_eq!(answer.credential.generation, 2);
    assert!(!answer.replayed);
    assert_eq!(state.auth.authenticate(&bystander.token).await.unwrap_err().code, "unauthenticated", "older JWTs end");
    state.auth.login("admin", PASSWORD, None).await.expect("the password still works after revokeSessions");
}

#[tokio::test]
async fn password_rotation_replays_and_refuses_reuse_and_stale_generations() {
    let (_dir, state) = setup().await;
    let actor = admin(&state).await;
    let new_password = "the-rotated-password-is-long";
    let first = mutate(&state, &actor, rotate(&actor.user_id, 1, "rot-1", new_password)).await.unwrap();
    assert_eq!((first.credential.generation, first.replayed), (2, false));
    assert_eq!(state.auth.login("admin", PASSWORD, None).await.unwrap_err().code, "unauthenticated");
    let fresh = admin_with(&state, new_password).await;

    let replay = mutate(&state, &fresh, rotate(&actor.user_id, 1, "rot-1", new_password)).await;
    // the receipt is bound to its actor (same user), so the exact request replays
    let replay = replay.unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.credential, first.credential);

    let reused = mutate(&state, &fresh, rotate(&actor.user_id, 1, "rot-1", "a-different-long-password")).await.unwrap_err();
    assert_eq!(reused.code, "mutation-reused");
    let stale = mutate(&state, &fresh, rotate(&actor.user_id, 1, "rot-2", "a-different-long-password")).await.unwrap_err();
    assert_eq!(stale.code, "conflict");
    let short = mutate(&state, &fresh, rotate(&actor.user_id, 2, "rot-3", "short")).await.unwrap_err();
    assert_eq!(short.code, "password-too-short");

    let revoked = mutate(
        &state,
        &fresh,
        MutateInput {
            user_id: actor.user_id.clone(),
            expected_generation: 2,
            mutation_id: "rev".into(),
            operation: Operation::RevokePassword {},
        },
    )
    .await
    .unwrap();
    assert!(!revoked.credential.password_enabled);
    assert_eq!(state.auth.login("admin", new_password, None).await.unwrap_err().code, "unauthenticated");
}

async fn admin_with(state: &AppState, password: &str) -> Identity {
    let answer = state.auth.login("admin", password, None).await.unwrap();
    state.auth.authenticate(&answer.token).await.unwrap()
}

#[tokio::test]
async fn sensitive_mutations_need_a_fresh_login() {
    let (_dir, state) = setup().await;
    let mut stale = admin(&state).await;
    stale.authenticated_at -= capstan_core::clock::millis(ADMIN_FRESHNESS) + 1000;
    let err = mutate(&state, &stale, rotate(&stale.user_id, 1, "m", "a-long-enough-new-password")).await.unwrap_err();
    assert_eq!(err.code, "admin-not-fresh");
    let get = state.methods.get("admin.getHumanCredential").unwrap();
    let err = get.call(call(&state, Some(stale.clone())), json!({"userId": stale.user_id})).await.unwrap_err();
    assert_eq!(err.code, "admin-not-fresh");
    let fresh = admin(&state).await;
    let view = get.call(call(&state, Some(fresh.clone())), json!({"userId": fresh.user_id})).await.unwrap();
    assert_eq!(view["generation"], 1);
    assert_eq!(view["passwordEnabled"], true);
    assert!(view.get("verifier").is_none());
}

#[tokio::test]
async fn machine_tokens_open_sessions_bound_to_the_token() {
    let (_dir, state) = setup().await;
    let actor = admin(&state).await;
    let create = state.methods.get("admin.createMachineUser").unwrap();
    let created = create.call(call(&state, Some(actor.clone())), json!({"username": "ci-bot"})).await.unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    let user_id = created["userId"].as_str().unwrap().to_string();
    assert!(token.starts_with("capstan_mt_"));
    let dup = create.call(call(&state, Some(actor.clone())), json!({"username": "ci-bot"})).await.unwrap_err();
    assert_eq!(dup.code, "exists");

    let session = state.auth.exchange_token(&token, None).await.unwrap();
    let machine = state.auth.authenticate(&session.token).await.unwrap();
    assert_eq!((machine.kind.as_str(), machine.admin), ("machine", false));
    assert_eq!(state.auth.exchange_token("capstan_mt_wrong", None).await.unwrap_err().code, "unauthenticated");
    assert_eq!(state.auth.login("ci-bot", "whatever-whatever-whatever", None).await.unwrap_err().code, "unauthenticated");

    // the credential authority keeps only the hash
    let uid = user_id.as_str();
    let cred = state.store.transact(|tx| async move { tx.require(CREDENTIALS, uid).await }).await.unwrap();
    assert!(!cred.data.to_string().contains(&token));

    let rotate = state.methods.get("admin.rotateMachineToken").unwrap();
    let rotated = rotate.call(call(&state, Some(actor.clone())), json!({"userId": user_id})).await.unwrap();
    assert_eq!(state.auth.authenticate(&session.token).await.unwrap_err().code, "unauthenticated", "old token's sessions end");
    assert_eq!(state.auth.exchange_token(&token, None).await.unwrap_err().code, "unauthenticated");
    let new_session = state.auth.exchange_token(rotated["token"].as_str().unwrap(), None).await.unwrap();
    state.auth.authenticate(&new_session.token).await.unwrap();

    let revoke = state.methods.get("admin.revokeMachineTokens").unwrap();
    revoke.call(call(&state, Some(actor.clone())), json!({"userId": user_id})).await.unwrap();
    assert_eq!(state.auth.authenticate(&new_session.token).await.unwrap_err().code, "unauthenticated");

    let list = state.methods.get("admin.listMachineUsers").unwrap();
    let page = list.call(call(&state, Some(actor.clone())), json!({})).await.unwrap();
    assert_eq!(page["users"][0]["username"], "ci-bot");
    assert_eq!(page["users"][0]["tokenActive"], false);

    let wrong_kind = rotate.call(call(&state, Some(actor.clone())), json!({"userId": actor.user_id})).await.unwrap_err();
    assert_eq!(wrong_kind.code, "wrong-user-kind");
}

#[tokio::test]
async fn every_user_id_is_claimed_in_the_fleet_id_keyspace() {
    let (_dir, state) = setup().await;
    let actor = admin(&state).await;
    let create = state.methods.get("admin.createUser").unwrap();
    let person = create.call(call(&state, Some(actor.clone())), json!({"username": "alice"})).await.unwrap();
    let machine = state.methods.get("admin.createMachineUser").unwrap();
    let robot = machine.call(call(&state, Some(actor.clone())), json!({"username": "deploy-bot"})).await.unwrap();
    let ids = [
        (actor.user_id.clone(), "user"),
        (person["userId"].as_str().unwrap().to_string(), "user"),
        (robot["userId"].as_str().unwrap().to_string(), "machine"),
    ];
    for (id, kind) in &ids {
        let (_, bytes) =
            state.blobs.get_bytes(&format!("{}{id}.json", capstan_fleet::IDENTITIES_PREFIX)).await.unwrap().expect("a claim per user");
        let claim: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!((claim["id"].as_str(), claim["kind"].as_str()), (Some(id.as_str()), Some(*kind)), "{claim}");
        // nobody else can take the id: a node with a key is refused
        let taken = capstan_fleet::claim_identity(&state.blobs, id, "node", "c29tZS1ub2RlLWtleQ").await.unwrap_err();
        assert_eq!(taken.code, "identity-claimed");
    }
    // a refused creation (the name exists) leaves the existing users' claims as they were
    let refused = create.call(call(&state, Some(actor)), json!({"username": "alice"})).await.unwrap_err();
    assert_eq!(refused.code, "exists");
}

#[tokio::test]
async fn a_rotation_receipt_is_keyed_by_the_keyring_and_holds_nothing_to_test_guesses_against() {
    use sha2::{Digest, Sha256};
    let (_dir, state) = setup().await;
    let actor = admin(&state).await;
    let new_password = "the-rotated-password-is-long";
    let request = rotate(&actor.user_id, 1, "rot-k", new_password);
    mutate(&state, &actor, rotate(&actor.user_id, 1, "rot-k", new_password)).await.unwrap();
    let receipt_id = format!("{}:rot-k", actor.user_id);
    let receipt = state
        .store
        .transact(|tx| {
            let id = receipt_id.clone();
            async move { tx.get(RECEIPTS, &id).await }
        })
        .await
        .unwrap()
        .expect("the receipt is recorded");
    let text = receipt.data.to_string();
    assert!(!text.contains(new_password), "no password in a receipt");
    // the salted SHA-256 of the request, which a copy of the store could test guesses with,
    // is not what is kept
    let salt = receipt.data["salt"].as_str().unwrap();
    let body = serde_json::to_vec(&request).unwrap();
    let unkeyed = hex::encode(Sha256::new().chain_update(salt.as_bytes()).chain_update(&body).finalize());
    assert_ne!(receipt.data["digest"].as_str(), Some(unkeyed.as_str()));
    assert!(receipt.data["key"].as_str().is_some_and(|k| k.starts_with("kek-")), "{text}");

    // a keyring that does not hold the receipt's key cannot tell: refused, never run twice
    let other = receipt_keys(&Keyring::generate(None, None).unwrap());
    let actor_id = actor.user_id.clone();
    let replayed = state
        .store
        .transact(|tx| {
            let (other, actor_id, request) = (other.clone(), actor_id.clone(), rotate(&actor_id, 1, "rot-k", new_password));
            async move { capstan_rpc::receipts::replay::<serde_json::Value>(&tx, &other, &actor_id, Some("rot-k"), &request).await }
        })
        .await;
    assert_eq!(replayed.unwrap_err().code, "mutation-reused");
}

async fn run(state: &AppState, actor: &Identity, method: &str, body: Value) -> Result<Value> {
    state.methods.get(method).unwrap().call(call(state, Some(actor.clone())), body).await
}

async fn events_of(state: &AppState) -> Vec<String> {
    capstan_events::read_after(&state.store, 0, 100).await.unwrap().into_iter().map(|e| e.kind).collect()
}

#[tokio::test]
async fn people_are_listed_disabled_enabled_and_given_a_password_once() {
    let (_dir, state) = setup().await;
    let actor = admin(&state).await;
    let created = run(&state, &actor, "admin.createUser", json!({ "username": "pat" })).await.unwrap();
    let pat = created["userId"].as_str().unwrap().to_string();
    let first_password = created["password"].as_str().unwrap().to_string();
    run(&state, &actor, "admin.createMachineUser", json!({ "username": "robot" })).await.unwrap();

    let listed = run(&state, &actor, "users.list", json!({})).await.unwrap();
    let names: Vec<&str> = listed["users"].as_array().unwrap().iter().map(|u| u["username"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2, "people only, never a machine user: {listed}");
    assert!(names.contains(&"admin") && names.contains(&"pat"));
    assert!(!listed.to_string().contains("scrypt"));
    assert_eq!(run(&state, &actor, "users.list", json!({ "extra": 1 })).await.unwrap_err().code, "invalid-request");

    // disable: login refused like any wrong password, the open session ends
    let session = state.auth.login("pat", &first_password, None).await.unwrap();
    let stale = run(&state, &actor, "users.setDisabled", json!({ "userId": pat, "disabled": true, "expectedGeneration": 7 })).await;
    assert_eq!(stale.unwrap_err().code, "conflict");
    let off = run(&state, &actor, "users.setDisabled", json!({ "userId": pat, "disabled": true, "expectedGeneration": 1 })).await.unwrap();
    assert_eq!((off["disabled"].as_bool(), off["generation"].as_u64(), off["sessionsRevoked"].as_u64()), (Some(true), Some(2), Some(1)));
    assert_eq!(state.auth.authenticate(&session.token).await.unwrap_err().code, "unauthenticated");
    assert_eq!(state.auth.login("pat", &first_password, None).await.unwrap_err().code, "unauthenticated");
    let on = run(&state, &actor, "users.setDisabled", json!({ "userId": pat, "disabled": false, "expectedGeneration": 2 })).await.unwrap();
    assert_eq!(on["disabled"], false);
    state.auth.login("pat", &first_password, None).await.expect("enabled again, the password still works");

    // reset: a new password once, the old one and every session end
    let before = state.auth.login("pat", &first_password, None).await.unwrap();
    let reset = run(&state, &actor, "users.resetPassword", json!({ "userId": pat, "expectedGeneration": 3 })).await.unwrap();
    let new_password = reset["password"].as_str().unwrap();
    assert!(new_password.len() >= 20 && reset["sessionsRevoked"].as_u64() >= Some(1));
    assert_eq!(state.auth.authenticate(&before.token).await.unwrap_err().code, "unauthenticated");
    assert_eq!(state.auth.login("pat", &first_password, None).await.unwrap_err().code, "unauthenticated");
    state.auth.login("pat", new_password, None).await.expect("the generated password works");

    let revoked = run(&state, &actor, "users.revokeSessions", json!({ "userId": pat, "expectedGeneration": 4 })).await.unwrap();
    assert_eq!(revoked["generation"], 5);
    assert_eq!(events_of(&state).await, ["user.disabled", "user.enabled", "user.passwordReset", "user.sessionsRevoked"]);
}

#[tokio::test]
async fn people_changes_are_refused_by_name() {
    let (_dir, state) = setup().await;
    let actor = admin(&state).await;
    let body = |id: &str| json!({ "userId": id, "disabled": true, "expectedGeneration": 1 });
    assert_eq!(run(&state, &actor, "users.setDisabled", body(&actor.user_id)).await.unwrap_err().code, "user-is-self");
    assert_eq!(run(&state, &actor, "users.setDisabled", body("user_missing")).await.unwrap_err().code, "user-not-found");
    let robot = run(&state, &actor, "admin.createMachineUser", json!({ "username": "robot" })).await.unwrap();
    let robot = robot["userId"].as_str().unwrap();
    let reset = run(&state, &actor, "users.resetPassword", json!({ "userId": robot, "expectedGeneration": 1 })).await;
    assert_eq!(reset.unwrap_err().code, "user-not-found", "machine users are not people");

    // a second administrator may not disable the last enabled one
    let other = run(&state, &actor, "admin.createUser", json!({ "username": "root2", "admin": true })).await.unwrap();
    let other_id = other["userId"].as_str().unwrap().to_string();
    let other_login = state.auth.login("root2", other["password"].as_str().unwrap(), None).await.unwrap();
    let other_actor = state.auth.authenticate(&other_login.token).await.unwrap();
    run(&state, &other_actor, "users.setDisabled", body(&actor.user_id)).await.expect("two administrators: one may go");
    let enable = json!({ "userId": actor.user_id, "disabled": false, "expectedGeneration": 2 });
    run(&state, &other_actor, "users.setDisabled", enable).await.unwrap();
    let fresh = admin(&state).await;
    run(&state, &fresh, "users.setDisabled", body(&other_id)).await.unwrap();
    assert_eq!(state.auth.authenticate(&other_login.token).await.unwrap_err().code, "unauthenticated");
    // the guard behind that: whoever acts, the last enabled administrator stays
    let last = json!({ "userId": fresh.user_id, "disabled": true, "expectedGeneration": 3 });
    assert_eq!(run(&state, &other_actor, "users.setDisabled", last).await.unwrap_err().code, "last-administrator");

    let mut stale = admin(&state).await;
    stale.authenticated_at -= capstan_core::clock::millis(ADMIN_FRESHNESS) + 1000;
    let err = run(&state, &stale, "users.resetPassword", json!({ "userId": other_id, "expectedGeneration": 2 })).await.unwrap_err();
    assert_eq!(err.code, "admin-not-fresh");
}

#[tokio::test]
async fn the_offline_reset_gives_a_new_password_ends_sessions_and_enables() {
    let (_dir, state) = setup().await;
    let session = state.auth.login("admin", PASSWORD, None).await.unwrap();
    let reset = users::reset_password_offline(&state.store, "admin").await.unwrap();
    assert_eq!((reset.user.username.as_str(), reset.sessions_revoked, reset.user.disabled), ("admin", 1, false));
    assert!(!format!("{reset:?}").contains(&reset.password), "Debug never shows the password");
    assert_eq!(state.auth.authenticate(&session.token).await.unwrap_err().code, "unauthenticated");
    assert_eq!(state.auth.login("admin", PASSWORD, None).await.unwrap_err().code, "unauthenticated");
    state.auth.login("admin", &reset.password, None).await.unwrap();
    for name in ["nobody", "bad name!"] {
        assert_eq!(users::reset_password_offline(&state.store, name).await.unwrap_err().code, "user-not-found");
    }
    assert_eq!(events_of(&state).await, ["user.passwordReset"]);
}
