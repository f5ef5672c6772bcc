//! The conformance suite every blob backend must pass.
//!
//! Written only against [`Blobs`] / [`BlobBackend`](super::BlobBackend), so the local
//! directory and S3 backends run the same checks. Each run works under a fresh random key
//! prefix and cleans up after itself, so it can run against a shared bucket. Failures panic
//! with a message naming the check: this is a test suite.

use super::{BlobMeta, BlobReader, Blobs, PutMode};
use capstan_core::refusal::{Refusal, Result};
use sha2::{Digest, Sha256};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::sync::Barrier;

/// How many tasks race in the concurrency checks.
pub const RACERS: usize = 8;

/// A fresh key prefix (ending in `/`) for one run.
pub fn unique_prefix() -> String {
    format!("capstan-conformance/{}/", uuid::Uuid::new_v4().simple())
}

/// Run every check under a fresh prefix, then remove what they stored.
pub async fn run_all(blobs: &Blobs) {
    let p = unique_prefix();
    round_trip(blobs, &p).await;
    long_key(blobs, &p).await;
    overwrite_changes_etag(blobs, &p).await;
    create_only(blobs, &p).await;
    if_match(blobs, &p).await;
    absent(blobs, &p).await;
    delete_twice(blobs, &p).await;
    invalid_keys(blobs).await;
    list_paging(blobs, &format!("{p}list")).await;
    large_streamed_put(blobs, &p).await;
    race_create_only(std::slice::from_ref(blobs), &format!("{p}race-create")).await;
    race_if_match(std::slice::from_ref(blobs), &format!("{p}race-if-match")).await;
    remove_all(blobs, &p).await;
}

/// Put, head and get agree on bytes, size and etag; an empty object works too.
pub async fn round_trip(blobs: &Blobs, p: &str) {
    let key = format!("{p}round-trip/object.json");
    let body = b"{\"hello\":\"world\"}\n".to_vec();
    let put = blobs.put_bytes(&key, body.clone(), PutMode::Overwrite).await.expect("round trip: put");
    assert_eq!(put.key, key, "round trip: put returns the key");
    assert_eq!(put.size, body.len() as u64, "round trip: put returns the size");
    assert!(!put.etag.is_empty(), "round trip: put returns an etag");
    let head = blobs.head(&key).await.expect("round trip: head").expect("round trip: head finds the object");
    assert_eq!(head, put, "round trip: head matches what put returned");
    let (meta, bytes) = get(blobs, &key).await.expect("round trip: get finds the object");
    assert_eq!(bytes, body, "round trip: get returns the bytes put");
    assert_eq!(meta, put, "round trip: get's meta matches what put returned");
    let again = blobs.head(&key).await.expect("round trip: head again").expect("round trip: still there");
    assert_eq!(again.etag, put.etag, "round trip: the etag is stable while nothing writes");

    let empty = format!("{p}round-trip/empty");
    let put = blobs.put_bytes(&empty, Vec::new(), PutMode::Overwrite).await.expect("round trip: put empty");
    assert_eq!(put.size, 0, "round trip: empty object size");
    let (meta, bytes) = get(blobs, &empty).await.expect("round trip: get finds the empty object");
    assert!(bytes.is_empty(), "round trip: empty object reads back empty");
    assert_eq!(meta, put, "round trip: empty object meta");
}

/// A key near the 1024-byte limit, with long segments, round-trips.
pub async fn long_key(blobs: &Blobs, p: &str) {
    let mut key = format!("{p}long");
    while key.len() + 201 <= super::MAX_KEY_BYTES {
        key.push('/');
        key.push_str(&"k".repeat(200));
    }
    super::validate_key(&key).expect("long key: the test key is valid");
    blobs.put_bytes(&key, b"long".to_vec(), PutMode::CreateOnly).await.expect("long key: put");
    let (_, bytes) = get(blobs, &key).await.expect("long key: get finds the object");
    assert_eq!(bytes, b"long", "long key: bytes");
    let listed = blobs.list(&format!("{p}long/"), None, 10).await.expect("long key: list");
    assert_eq!(keys(&listed.items), [key.clone()], "long key: listed");
    assert!(blobs.delete(&key).await.expect("long key: delete"), "long key: delete finds it");
}

/// Every write changes the etag, even one with identical content.
pub async fn overwrite_changes_etag(blobs: &Blobs, p: &str) {
    let key = format!("{p}overwrite");
    let first = blobs.put_bytes(&key, b"aaaa".to_vec(), PutMode::Overwrite).await.expect("overwrite: first put");
    let second = blobs.put_bytes(&key, b"bbbb".to_vec(), PutMode::Overwrite).await.expect("overwrite: second put");
    assert_ne!(first.etag, second.etag, "overwrite: a write with new content changes the etag");
    let (meta, bytes) = get(blobs, &key).await.expect("overwrite: get finds the object");
    assert_eq!(bytes, b"bbbb", "overwrite: get returns the new content");
    assert_eq!(meta.etag, second.etag, "overwrite: get returns the new etag");
    // Identical content may keep its etag (S3's is the content's MD5); what a backend answers
    // must still be what head reports.
    let third = blobs.put_bytes(&key, b"bbbb".to_vec(), PutMode::Overwrite).await.expect("overwrite: third put");
    assert_eq!(blobs.head(&key).await.expect("overwrite: head").map(|m| m.etag), Some(third.etag), "overwrite: head");
}

/// Create-only succeeds when absent and is refused `exists` (content intact) when present.
pub async fn create_only(blobs: &Blobs, p: &str) {
    let key = format!("{p}create-only");
    let created = blobs.put_bytes(&key, b"first".to_vec(), PutMode::CreateOnly).await.expect("create-only on an absent key");
    let refused =
        expect_refusal(blobs.put_bytes(&key, b"second".to_vec(), PutMode::CreateOnly).await, "exists", "create-only on an existing key");
    assert!(refused.message.contains(&key), "create-only: the `exists` message names the key: {refused}");
    let (meta, bytes) = get(blobs, &key).await.expect("create-only: the object is still there");
    assert_eq!(bytes, b"first", "create-only: a refused create leaves the content intact");
    assert_eq!(meta.etag, created.etag, "create-only: a refused create leaves the etag intact");
}

/// If-match with the current etag succeeds with a new etag; stale or absent is `conflict`.
pub async fn if_match(blobs: &Blobs, p: &str) {
    let key = format!("{p}if-match");
    let v1 = blobs.put_bytes(&key, b"v1".to_vec(), PutMode::Overwrite).await.expect("if-match: initial put");
    let v2 = blobs.put_bytes(&key, b"v2".to_vec(), PutMode::IfMatch(v1.etag.clone())).await.expect("if-match with the current etag");
    assert_ne!(v2.etag, v1.etag, "if-match: a successful write returns a new etag");
    expect_refusal(
        blobs.put_bytes(&key, b"v3".to_vec(), PutMode::IfMatch(v1.etag.clone())).await,
        "conflict",
        "if-match with a stale etag",
    );
    expect_refusal(
        blobs.put_bytes(&key, b"v3".to_vec(), PutMode::IfMatch("not-an-etag".into())).await,
        "conflict",
        "if-match with a made-up etag",
    );
    let (meta, bytes) = get(blobs, &key).await.expect("if-match: the object is still there");
    assert_eq!(bytes, b"v2", "if-match: a refused write leaves the content intact");
    assert_eq!(meta.etag, v2.etag, "if-match: a refused write leaves the etag intact");

    let absent = format!("{p}if-match-absent");
    expect_refusal(
        blobs.put_bytes(&absent, b"x".to_vec(), PutMode::IfMatch(v2.etag.clone())).await,
        "conflict",
        "if-match on an absent key",
    );
    assert!(blobs.head(&absent).await.expect("if-match: head absent").is_none(), "if-match on an absent key created it");
}

/// Head, get and delete of a key never written.
pub async fn absent(blobs: &Blobs, p: &str) {
    let key = format!("{p}never-written/x");
    assert!(blobs.head(&key).await.expect("absent: head").is_none(), "absent: head returns None");
    assert!(get(blobs, &key).await.is_none(), "absent: get returns None");
    assert!(!blobs.delete(&key).await.expect("absent: delete"), "absent: delete returns false");
}

/// Delete reports true once, then false; the object is gone.
pub async fn delete_twice(blobs: &Blobs, p: &str) {
    let key = format!("{p}delete/me");
    blobs.put_bytes(&key, b"bye".to_vec(), PutMode::Overwrite).await.expect("delete: put");
    assert!(blobs.delete(&key).await.expect("delete: first"), "delete: the first delete finds the object");
    assert!(!blobs.delete(&key).await.expect("delete: second"), "delete: the second delete finds nothing");
    assert!(blobs.head(&key).await.expect("delete: head").is_none(), "delete: head after delete");
    assert!(get(blobs, &key).await.is_none(), "delete: get after delete");
    blobs.put_bytes(&key, b"again".to_vec(), PutMode::CreateOnly).await.expect("delete: create-only after delete");
    assert!(blobs.delete(&key).await.expect("delete: third"), "delete: the recreated object is deleted");
}

/// Malformed keys, prefixes and cursors are refused `invalid-key` by every method.
pub async fn invalid_keys(blobs: &Blobs) {
    for bad in ["..", "/abs", "a//b", "", "a/../b", "./a", ".hidden", "a/", "a b", "a\\b"] {
        let what = |op: &str| format!("{op} with the invalid key {bad:?}");
        expect_refusal(blobs.put_bytes(bad, b"x".to_vec(), PutMode::Overwrite).await, "invalid-key", &what("put"));
        expect_refusal(blobs.put_bytes(bad, b"x".to_vec(), PutMode::CreateOnly).await, "invalid-key", &what("create-only put"));
        expect_refusal(blobs.get(bad).await, "invalid-key", &what("get"));
        expect_refusal(blobs.head(bad).await, "invalid-key", &what("head"));
        expect_refusal(blobs.delete(bad).await, "invalid-key", &what("delete"));
        // A prefix may be empty or end in `/`; everything else follows the key rules.
        if !bad.is_empty() && bad != "a/" {
            expect_refusal(blobs.list(bad, None, 10).await, "invalid-key", &what("list (prefix)"));
        }
        expect_refusal(blobs.list("", Some(bad), 10).await, "invalid-key", &what("list (cursor)"));
    }
    expect_refusal(blobs.list("", None, 0).await, "invalid-request", "list with limit 0");
}

/// Listing by prefix in byte order, paged through `next_cursor`, with nested keys and sibling
/// prefixes that must not show up. `base` must not end in `/`.
pub async fn list_paging(blobs: &Blobs, base: &str) {
    // Inserted out of order; `-` sorts before `/`, so `a-b` comes before `a/b`.
    let relative = ["b/x", "a/c/d", "c", "a", "a-b", "b", "a/b"];
    let mut etags = std::collections::BTreeMap::new();
    for rel in relative {
        let key = format!("{base}/{rel}");
        let meta = blobs.put_bytes(&key, rel.as_bytes().to_vec(), PutMode::CreateOnly).await.expect("list: put");
        etags.insert(key, meta);
    }
    for sibling in [format!("{base}-other"), format!("{base}ing/x"), format!("{base}ing"), base.to_string()] {
        blobs.put_bytes(&sibling, b"sibling".to_vec(), PutMode::Overwrite).await.expect("list: put sibling");
    }
    let full = |rels: &[&str]| rels.iter().map(|r| format!("{base}/{r}")).collect::<Vec<_>>();
    let expected = full(&["a", "a-b", "a/b", "a/c/d", "b", "b/x", "c"]);

    // Paging with limit 3: 3 + 3 + 1, concatenating to the whole set in order.
    let prefix = format!("{base}/");
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = blobs.list(&prefix, cursor.as_deref(), 3).await.expect("list: page");
        assert!(pages.len() < 10, "list: paging does not end");
        for item in &page.items {
            let put = &etags[&item.key];
            assert_eq!(item, put, "list: an item's size and etag match what put returned");
        }
        pages.push(keys(&page.items));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 3, 1], "list: page sizes with limit 3 over 7 keys: {pages:?}");
    assert_eq!(pages.concat(), expected, "list: pages concatenate to every key under the prefix, in byte order");

    // One page holding everything; a limit above the cap is capped, not refused.
    let all = blobs.list(&prefix, None, usize::MAX).await.expect("list: huge limit");
    assert_eq!(keys(&all.items), expected, "list: one page with a huge limit");
    assert_eq!(all.next_cursor, None, "list: no cursor when everything fits");
    let exact = blobs.list(&prefix, None, 7).await.expect("list: exact limit");
    assert_eq!(keys(&exact.items), expected, "list: a page exactly as large as the listing");
    assert_eq!(exact.next_cursor, None, "list: no cursor when nothing remains");

    // Prefixes that end inside a segment, at a `/`, or match nothing.
    let cases: [(String, Vec<String>); 6] = [
        (format!("{base}/a"), full(&["a", "a-b", "a/b", "a/c/d"])),
        (format!("{base}/a/"), full(&["a/b", "a/c/d"])),
        (format!("{base}/a/c/"), full(&["a/c/d"])),
        (format!("{base}/a/b"), full(&["a/b"])),
        (format!("{base}/b"), full(&["b", "b/x"])),
        (format!("{base}/zzz"), Vec::new()),
    ];
    for (prefix, want) in cases {
        let page = blobs.list(&prefix, None, 100).await.expect("list: by prefix");
        assert_eq!(keys(&page.items), want, "list: prefix {prefix:?}");
        assert_eq!(page.next_cursor, None, "list: prefix {prefix:?} needs no second page");
    }

    // A cursor is a key: the listing continues strictly after it, whether or not it exists.
    let cursor_cases: [(&str, &[&str]); 4] = [
        ("a-b", &["a/b", "a/c/d", "b", "b/x", "c"]),
        ("a/bb", &["a/c/d", "b", "b/x", "c"]),
        ("a/c", &["a/c/d", "b", "b/x", "c"]),
        ("c", &[]),
    ];
    for (after, want) in cursor_cases {
        let cursor = format!("{base}/{after}");
        let page = blobs.list(&prefix, Some(&cursor), 100).await.expect("list: with cursor");
        assert_eq!(keys(&page.items), full(want), "list: after cursor {cursor:?}");
    }
    let page = blobs.list(&prefix, Some(&format!("{base}/a/b")), 2).await.expect("list: cursor and limit");
    assert_eq!(keys(&page.items), full(&["a/c/d", "b"]), "list: cursor with limit 2");
    assert!(page.next_cursor.is_some(), "list: more remain after cursor with limit 2");
}

/// An object of several MiB streamed in odd-sized chunks reads back bit for bit.
pub async fn large_streamed_put(blobs: &Blobs, p: &str) {
    const SIZE: u64 = 8 * 1024 * 1024 + 12_345;
    let key = format!("{p}large/object.bin");
    let expected = {
        let mut generator = Generator::new(SIZE);
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = generator.fill(&mut buf);
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
        }
        hex::encode(hash.finalize())
    };
    let body: BlobReader = Box::pin(GeneratedReader { generator: Generator::new(SIZE), calls: 0 });
    let put = blobs.put(&key, body, PutMode::CreateOnly).await.expect("large: put");
    assert_eq!(put.size, SIZE, "large: put size");
    let head = blobs.head(&key).await.expect("large: head").expect("large: head finds the object");
    assert_eq!(head, put, "large: head");

    let (meta, mut reader) = blobs.get(&key).await.expect("large: get").expect("large: get finds the object");
    assert_eq!(meta, put, "large: get meta");
    let mut hash = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buf).await.expect("large: reading the stream");
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        total += n as u64;
    }
    assert_eq!(total, SIZE, "large: streamed size");
    assert_eq!(hex::encode(hash.finalize()), expected, "large: sha256 of the streamed content");
    assert!(blobs.delete(&key).await.expect("large: delete"), "large: delete");
}

/// [`RACERS`] tasks race a create-only put of one key, spread over `handles` (e.g. separate
/// clients or processes' stores on the same storage): exactly one wins, the rest get `exists`.
/// Three rounds; `key` is deleted at the end of each.
pub async fn race_create_only(handles: &[Blobs], key: &str) {
    assert!(!handles.is_empty(), "race: no handles");
    for round in 0..3 {
        let barrier = Arc::new(Barrier::new(RACERS));
        let tasks: Vec<_> = (0..RACERS)
            .map(|i| {
                let blobs = handles[i % handles.len()].clone();
                let barrier = barrier.clone();
                let key = key.to_string();
                tokio::spawn(async move {
                    barrier.wait().await;
                    blobs.put_bytes(&key, format!("racer {i}").into_bytes(), PutMode::CreateOnly).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            match task.await.expect("race: task panicked") {
                Ok(meta) => winners.push((i, meta)),
                Err(e) => assert!(e.is("exists"), "race create-only round {round}: racer {i} got {e}, expected `exists`"),
            }
        }
        assert_eq!(winners.len(), 1, "race create-only round {round}: exactly one winner, got {winners:?}");
        let (winner, meta) = &winners[0];
        let (got, bytes) = get(&handles[0], key).await.expect("race create-only: the object exists");
        assert_eq!(bytes, format!("racer {winner}").into_bytes(), "race create-only: the winner's content is stored");
        assert_eq!(&got, meta, "race create-only: the winner's etag is current");
        assert!(handles[0].delete(key).await.expect("race create-only: delete"), "race create-only: delete");
    }
}

/// [`RACERS`] tasks race an if-match put from the same etag: exactly one wins, the rest get
/// `conflict`, and the winner's content and etag are current. Three rounds.
pub async fn race_if_match(handles: &[Blobs], key: &str) {
    assert!(!handles.is_empty(), "race: no handles");
    let mut etag = handles[0].put_bytes(key, b"start".to_vec(), PutMode::Overwrite).await.expect("race if-match: initial put").etag;
    for round in 0..3 {
        let barrier = Arc::new(Barrier::new(RACERS));
        let tasks: Vec<_> = (0..RACERS)
            .map(|i| {
                let blobs = handles[i % handles.len()].clone();
                let barrier = barrier.clone();
                let key = key.to_string();
                let etag = etag.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    blobs.put_bytes(&key, format!("round {round} racer {i}").into_bytes(), PutMode::IfMatch(etag)).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            match task.await.expect("race: task panicked") {
                Ok(meta) => winners.push((i, meta)),
                Err(e) => assert!(e.is("conflict"), "race if-match round {round}: racer {i} got {e}, expected `conflict`"),
            }
        }
        assert_eq!(winners.len(), 1, "race if-match round {round}: exactly one winner, got {winners:?}");
        let (winner, meta) = winners.pop().expect("one winner");
        assert_ne!(meta.etag, etag, "race if-match: the winner gets a new etag");
        let (got, bytes) = get(&handles[0], key).await.expect("race if-match: the object exists");
        assert_eq!(bytes, format!("round {round} racer {winner}").into_bytes(), "race if-match: the winner's content is stored");
        assert_eq!(got, meta, "race if-match: the winner's etag is current");
        etag = meta.etag;
    }
    assert!(handles[0].delete(key).await.expect("race if-match: delete"), "race if-match: delete");
}

/// Delete everything under `p` (exercising list + delete) and check nothing is left.
pub async fn remove_all(blobs: &Blobs, p: &str) {
    loop {
        let page = blobs.list(p, None, 100).await.expect("cleanup: list");
        for item in &page.items {
            assert!(blobs.delete(&item.key).await.expect("cleanup: delete"), "cleanup: listed key {} is deletable", item.key);
        }
        if page.next_cursor.is_none() {
            break;
        }
    }
    let left = blobs.list(p, None, 10).await.expect("cleanup: final list");
    assert!(left.items.is_empty(), "cleanup: objects left under {p}: {:?}", keys(&left.items));
}

/// Read a whole object, panicking on errors; `None` when absent.
async fn get(blobs: &Blobs, key: &str) -> Option<(BlobMeta, Vec<u8>)> {
    blobs.get_bytes(key).await.unwrap_or_else(|e| panic!("get {key:?}: {e}"))
}

fn keys(items: &[BlobMeta]) -> Vec<String> {
    items.iter().map(|m| m.key.clone()).collect()
}

/// Assert the outcome is a refusal with `code`; returns it.
#[track_caller]
fn expect_refusal<T>(outcome: Result<T>, code: &str, what: &str) -> Refusal {
    match outcome {
        Ok(_) => panic!("{what}: succeeded, expected the refusal `{code}`"),
        Err(e) => {
            assert!(e.is(code), "{what}: refused {e}, expected `{code}`");
            e
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), so the expected hash can be computed twice.
struct Generator {
    state: u64,
    remaining: u64,
}

impl Generator {
    fn new(size: u64) -> Self {
        Generator { state: 0x9e37_79b9_7f4a_7c15, remaining: size }
    }

    fn fill(&mut self, buf: &mut [u8]) -> usize {
        let n = buf.len().min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        for byte in &mut buf[..n] {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            *byte = (self.state >> 32) as u8;
        }
        self.remaining -= n as u64;
        n
    }
}

/// Serves the generator's bytes in chunks of varying (often odd) sizes.
struct GeneratedReader {
    generator: Generator,
    calls: usize,
}

impl AsyncRead for GeneratedReader {
    fn poll_read(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        const CHUNKS: [usize; 6] = [1, 7, 4096, 65_537, 1 << 20, 333];
        let this = self.get_mut();
        let want = buf.remaining().min(CHUNKS[this.calls % CHUNKS.len()]);
        this.calls += 1;
        let n = this.generator.fill(buf.initialize_unfilled_to(want));
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}
