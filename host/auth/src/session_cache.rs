//! Verified sessions, kept briefly in memory so an authenticated request does not read the
//! store (and check a signature) on every call.
//!
//! The key is the SHA-256 of the whole bearer JWT (its session id, its claims and its
//! signature), so a hit stands for exactly the bytes that were verified. An entry answers for
//! at most [`SESSION_CACHE_TTL`] after the store was read, and never past the session's
//! expiry (or a machine token's).
//!
//! Invalidation on this node is immediate: the cache watches the store's writes to users,
//! credentials and sessions ([`capstan_store::Store::watch_writes`]), and any write to one of
//! them, once its transaction has ended, drops the entries of that user or session. That covers
//! logout, password rotation and revocation, machine token rotation and revocation, session
//! revocation, user disable and deletion, and whatever else writes those records, without each
//! path having to remember the cache. A read racing a revocation cannot put the revoked
//! session back: the cache has an epoch that every invalidation advances, and an entry read
//! before it is not kept.
//!
//! Other nodes of the fleet (and other processes on the same database) do not see this node's
//! writes: there, a revoked session keeps working for at most [`SESSION_CACHE_TTL`].

use crate::{CREDENTIALS, Identity, SESSIONS, USERS};
use capstan_core::clock::now_ms;
use capstan_store::Store;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a verified session is answered from memory: the bound, fleet-wide, on a session
/// revoked through another node (on this node revocation is immediate).
pub const SESSION_CACHE_TTL: Duration = Duration::from_secs(5);
/// The most sessions kept; a full cache drops its stale entries, else starts over.
pub const SESSION_CACHE_ENTRIES: usize = 4096;

/// SHA-256 of a bearer JWT.
pub(crate) type TokenDigest = [u8; 32];

/// The verified sessions of one [`crate::Auth`].
#[derive(Default)]
pub(crate) struct SessionCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Advances on every invalidation; an entry read under an older epoch is not kept.
    epoch: u64,
    entries: HashMap<TokenDigest, Entry>,
}

struct Entry {
    identity: Identity,
    /// Seconds since the epoch: the session's expiry, or the machine token's when sooner.
    valid_until: u64,
    cached_at: Instant,
}

impl SessionCache {
    /// A cache that drops entries on `store`'s writes to users, credentials and sessions.
    pub(crate) fn watching(store: &Store) -> Arc<SessionCache> {
        let cache = Arc::new(SessionCache::default());
        let weak = Arc::downgrade(&cache);
        store.watch_writes(
            &[USERS, CREDENTIALS, SESSIONS],
            Arc::new(move |collection: &str, id: &str| {
                if let Some(cache) = weak.upgrade() {
                    cache.written(collection, id);
                }
            }),
        );
        cache
    }

    /// The key of a bearer JWT.
    pub(crate) fn key(bearer: &str) -> TokenDigest {
        Sha256::digest(bearer.as_bytes()).into()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The identity verified for `key`, unless it is older than the TTL or its session ended.
    pub(crate) fn get(&self, key: &TokenDigest) -> Option<Identity> {
        let inner = self.lock();
        let entry = inner.entries.get(key)?;
        (entry.cached_at.elapsed() < SESSION_CACHE_TTL && entry.valid_until > now_ms()).then(|| entry.identity.clone())
    }

    /// The epoch to pass to [`SessionCache::insert`]: taken before the store is read.
    pub(crate) fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// Keep `identity` for `key`, unless something was invalidated since `epoch` was taken
    /// (the store read may predate a revocation).
    pub(crate) fn insert(&self, key: TokenDigest, epoch: u64, identity: Identity, valid_until: u64) {
        let mut inner = self.lock();
        if inner.epoch != epoch {
            return;
        }
        if inner.entries.len() >= SESSION_CACHE_ENTRIES && !inner.entries.contains_key(&key) {
            inner.entries.retain(|_, entry| entry.cached_at.elapsed() < SESSION_CACHE_TTL);
            if inner.entries.len() >= SESSION_CACHE_ENTRIES {
                inner.entries.clear();
            }
        }
        inner.entries.insert(key, Entry { identity, valid_until, cached_at: Instant::now() });
    }

    /// A transaction wrote `collection`/`id`: drop the entries it may have changed.
    fn written(&self, collection: &str, id: &str) {
        let mut inner = self.lock();
        inner.epoch += 1;
        if collection == SESSIONS {
            inner.entries.retain(|_, entry| entry.identity.session_id != id);
        } else {
            // users and credentials are keyed by the user id
            inner.entries.retain(|_, entry| entry.identity.user_id != id);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Auth, Bootstrap, bootstrap_admin, revoke_sessions};
    use capstan_blobs::Blobs;
    use capstan_keyring::Keyring;
    use capstan_store::sqlite::SqliteStore;
    use serde_json::json;

    const PASSWORD: &str = "a-long-enough-admin-password";

    fn open_store(dir: &tempfile::TempDir) -> Store {
        Store::new(SqliteStore::open(dir.path().join("capstan.sqlite")).unwrap(), capstan_store::DEFAULT_BUDGET)
    }

    async fn setup() -> (tempfile::TempDir, Store, Arc<Auth>) {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(&dir);
        let blobs = Blobs::new(capstan_blobs::local::LocalBlobs::open(dir.path().join("blobs").to_str().unwrap()).await.unwrap());
        let auth = Auth::new(store.clone(), &Keyring::generate(None, None).unwrap(), "http://capstan.test").await.unwrap();
        assert_eq!(bootstrap_admin(&store, &blobs, "admin", PASSWORD).await.unwrap(), Bootstrap::Created { username: "admin".into() });
        (dir, store, auth)
    }

    /// A token of a fresh session, authenticated once (so held in the cache).
    async fn cached_session(auth: &Auth) -> (String, Identity) {
        let token = auth.login("admin", PASSWORD, None).await.unwrap().token;
        let identity = auth.authenticate(&token).await.unwrap();
        assert!(auth.sessions.get(&SessionCache::key(&token)).is_some(), "a verified session is kept");
        (token, identity)
    }

    fn identity(user: &str, session: &str) -> Identity {
        Identity {
            user_id: user.into(),
            username: user.into(),
            kind: "human".into(),
            admin: false,
            session_id: session.into(),
            authenticated_at: 0,
            expires_at: now_ms() + 60_000,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_logged_out_session_is_refused_at_once() {
        let (_dir, _store, auth) = setup().await;
        let (token, identity) = cached_session(&auth).await;
        let (other, _) = cached_session(&auth).await;
        auth.logout(&identity).await.unwrap();
        assert_eq!(auth.authenticate(&token).await.unwrap_err().code, "unauthenticated");
        auth.authenticate(&other).await.expect("the user's other session is untouched");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn revoked_sessions_and_changed_credentials_or_users_are_seen_at_once() {
        let (_dir, store, auth) = setup().await;
        // revoke_sessions: what password rotation and revocation, machine token rotation, user
        // disable and a cluster's deletion do
        let (token, identity) = cached_session(&auth).await;
        let user = identity.user_id.clone();
        let u = user.as_str();
        store.transact(|tx| async move { revoke_sessions(&tx, u).await }).await.unwrap();
        assert_eq!(auth.authenticate(&token).await.unwrap_err().code, "unauthenticated");

        // a credential written without deleting the sessions (its generation advanced)
        let (token, _) = cached_session(&auth).await;
        store
            .transact(|tx| async move {
                let doc = tx.require(CREDENTIALS, u).await?;
                let mut data = doc.data.clone();
                data["generation"] = json!(data["generation"].as_u64().unwrap() + 1);
                tx.replace(CREDENTIALS, u, doc.revision, data).await
            })
            .await
            .unwrap();
        assert_eq!(auth.authenticate(&token).await.unwrap_err().code, "unauthenticated");

        // a user record written: the next request sees the user as it is now
        let (token, identity) = cached_session(&auth).await;
        assert!(identity.admin);
        store
            .transact(|tx| async move {
                let doc = tx.require(USERS, u).await?;
                let mut data = doc.data.clone();
                data["admin"] = json!(false);
                tx.replace(USERS, u, doc.revision, data).await
            })
            .await
            .unwrap();
        assert!(!auth.authenticate(&token).await.unwrap().admin, "the demotion is seen on the next request");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_process_writes_are_seen_within_the_ttl_only() {
        let (dir, _store, auth) = setup().await;
        let (token, identity) = cached_session(&auth).await;
        // another node on the same database: its writes are not watched here
        let elsewhere = open_store(&dir);
        for spec in crate::collections() {
            elsewhere.declare(spec).await.unwrap();
        }
        let u = identity.user_id.as_str();
        elsewhere.transact(|tx| async move { revoke_sessions(&tx, u).await }).await.unwrap();
        auth.authenticate(&token).await.expect("answered from the cache, within SESSION_CACHE_TTL of the read");
        // what the TTL ends: the next read of the store refuses
        auth.sessions.lock().entries.clear();
        assert_eq!(auth.authenticate(&token).await.unwrap_err().code, "unauthenticated");
    }

    #[test]
    fn a_read_that_raced_an_invalidation_is_not_kept() {
        let cache = SessionCache::default();
        let key = SessionCache::key("token");
        let epoch = cache.epoch();
        cache.written(SESSIONS, "session_b"); // a revocation lands while the store is read
        cache.insert(key, epoch, identity("user_a", "session_a"), now_ms() + 60_000);
        assert!(cache.get(&key).is_none());
        cache.insert(key, cache.epoch(), identity("user_a", "session_a"), now_ms() + 60_000);
        assert!(cache.get(&key).is_some());
    }

    #[test]
    fn entries_end_with_their_session_and_go_by_user_or_session() {
        let cache = SessionCache::default();
        let (a, b, c) = (SessionCache::key("a"), SessionCache::key("b"), SessionCache::key("c"));
        cache.insert(a, cache.epoch(), identity("user_1", "session_a"), now_ms() + 60_000);
        cache.insert(b, cache.epoch(), identity("user_1", "session_b"), now_ms() + 60_000);
        cache.insert(c, cache.epoch(), identity("user_2", "session_c"), now_ms().saturating_sub(1));
        assert!(cache.get(&c).is_none(), "an ended session is not answered");
        cache.written(SESSIONS, "session_a");
        assert!(cache.get(&a).is_none() && cache.get(&b).is_some());
        cache.written(CREDENTIALS, "user_1");
        assert!(cache.get(&b).is_none());
        assert_eq!(cache.len(), 1, "only the ended session's entry is left, until the cache fills");
    }

    #[test]
    fn the_cache_is_bounded() {
        let cache = SessionCache::default();
        for n in 0..SESSION_CACHE_ENTRIES + 10 {
            cache.insert(SessionCache::key(&n.to_string()), cache.epoch(), identity("u", &format!("s{n}")), now_ms() + 60_000);
            assert!(cache.len() <= SESSION_CACHE_ENTRIES);
        }
    }
}
