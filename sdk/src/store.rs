//! The plugin's own document collections (capability `store`), declared in
//! [`Descriptor::collection`](crate::Descriptor::collection).
//!
//! Documents are JSON objects with an id and a revision that every write advances. A
//! read-modify-write is made safe by stating the revision that was read: [`Batch`] applies
//! writes atomically after checking every expectation, and [`update_with_retry`] does the whole
//! loop, retrying when another call won the race.

use crate::bindings::capstan::plugin::store as wit;
use crate::{Refusal, Result, Value, encode, json, parse};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A stored document with its data decoded into `T`.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc<T = Value> {
    /// The document's id within its collection.
    pub id: String,
    /// Advanced by every write; state it to replace or delete (compare-and-swap).
    pub revision: u64,
    /// The document's data.
    pub data: T,
}

impl Doc<Value> {
    /// The data decoded into `T`.
    pub fn parse<T: DeserializeOwned>(self) -> Result<Doc<T>> {
        let data = crate::decode_value(self.data)
            .map_err(|r| Refusal::internal(format!("document {:?} does not have the expected shape: {}", self.id, r.message())))?;
        Ok(Doc { id: self.id, revision: self.revision, data })
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T = Value> {
    /// The documents on this page.
    pub documents: Vec<Doc<T>>,
    /// Pass back as `cursor` to continue; `None` when the listing is complete.
    pub next_cursor: Option<String>,
}

fn doc<T: DeserializeOwned>(collection: &str, d: wit::Document) -> Result<Doc<T>> {
    let data = parse(&d.data, &format!("document {collection}/{}", d.id))?;
    Ok(Doc { id: d.id, revision: d.revision, data })
}

fn page<T: DeserializeOwned>(collection: &str, p: wit::Page) -> Result<Page<T>> {
    let documents = p.documents.into_iter().map(|d| doc(collection, d)).collect::<Result<_>>()?;
    Ok(Page { documents, next_cursor: p.next_cursor })
}

/// The document `collection/id`, or `None`.
pub fn get<T: DeserializeOwned>(collection: &str, id: &str) -> Result<Option<Doc<T>>> {
    wit::get(collection, id)?.map(|d| doc(collection, d)).transpose()
}

/// Documents whose fields indexed by `index` equal `key` (one value per index field), in id
/// order. `limit` is capped at 500 by the host.
pub fn find<T: DeserializeOwned>(collection: &str, index: &str, key: &[Value], cursor: Option<&str>, limit: u32) -> Result<Page<T>> {
    let key: Vec<String> = key.iter().map(Value::to_string).collect();
    page(collection, wit::find(collection, index, &key, cursor, limit)?)
}

/// Every document of `collection` in id order, a page at a time.
pub fn scan<T: DeserializeOwned>(collection: &str, cursor: Option<&str>, limit: u32) -> Result<Page<T>> {
    page(collection, wit::scan(collection, cursor, limit)?)
}

/// Writes applied atomically once every expectation holds.
///
/// ```no_run
/// use capstan_sdk::store::Batch;
/// # fn demo() -> capstan_sdk::Result<()> {
/// # let (note, note_revision, owner_revision) = (capstan_sdk::json!({}), 3, 7);
/// Batch::new()
///     .replace("notes", "n1", note_revision, &note)
///     .delete("drafts", "n1", 2)
///     .expect("owners", "alice", Some(owner_revision))
///     .commit()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct Batch {
    expectations: Vec<wit::Expectation>,
    writes: Vec<wit::Write>,
    error: Option<Refusal>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    fn encoded(&mut self, data: &impl Serialize) -> String {
        match encode(data) {
            Ok(text) => text,
            Err(e) => {
                self.error.get_or_insert(e);
                String::new()
            }
        }
    }

    /// Create `collection/id`; refused `exists` when the id (or a unique index value) is taken.
    pub fn insert(mut self, collection: &str, id: &str, data: &impl Serialize) -> Self {
        let data = self.encoded(data);
        self.writes.push(wit::Write { collection: collection.into(), id: id.into(), op: wit::WriteOp::Insert(data) });
        self
    }

    /// Replace `collection/id` that is at exactly `expected_revision`; refused `conflict` if it
    /// moved on, `not-found` if it is gone.
    pub fn replace(mut self, collection: &str, id: &str, expected_revision: u64, data: &impl Serialize) -> Self {
        let data = self.encoded(data);
        let op = wit::WriteOp::Replace(wit::Replacement { expected_revision, data });
        self.writes.push(wit::Write { collection: collection.into(), id: id.into(), op });
        self
    }

    /// Insert when `expected_revision` is `None` ("I read none"), replace otherwise: the
    /// `expectedRevision` convention of the API in one call.
    pub fn put(self, collection: &str, id: &str, expected_revision: Option<u64>, data: &impl Serialize) -> Self {
        match expected_revision {
            None => self.insert(collection, id, data),
            Some(revision) => self.replace(collection, id, revision, data),
        }
    }

    /// Delete `collection/id` that is at exactly `expected_revision`.
    pub fn delete(mut self, collection: &str, id: &str, expected_revision: u64) -> Self {
        self.writes.push(wit::Write { collection: collection.into(), id: id.into(), op: wit::WriteOp::Delete(expected_revision) });
        self
    }

    /// Require `collection/id`, which the batch does not write, to still be at `revision`
    /// (`None`: still absent); refused `conflict` otherwise.
    pub fn expect(mut self, collection: &str, id: &str, revision: Option<u64>) -> Self {
        self.expectations.push(wit::Expectation { collection: collection.into(), id: id.into(), revision });
        self
    }

    /// Whether the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Apply the batch. Returns the written documents in order (a deleted one with its last
    /// revision). Refused `conflict` when an expectation failed: re-read and try again.
    pub fn commit(self) -> Result<Vec<Doc>> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let written = wit::commit(&self.expectations, &self.writes)?;
        written.into_iter().zip(&self.writes).map(|(d, w)| doc(&w.collection, d)).collect()
    }
}

/// What to write after reading `current` and deciding `desired` (`None`: absent).
#[derive(Debug, PartialEq)]
enum Plan {
    Nothing,
    Insert(Value),
    Replace(u64, Value),
    Delete(u64),
}

fn plan(current: Option<(u64, &Value)>, desired: Option<Value>) -> Plan {
    match (current, desired) {
        (None, None) => Plan::Nothing,
        (None, Some(new)) => Plan::Insert(new),
        (Some((_, old)), Some(new)) if *old == new => Plan::Nothing,
        (Some((revision, _)), Some(new)) => Plan::Replace(revision, new),
        (Some((revision, _)), None) => Plan::Delete(revision),
    }
}

/// Whether a refusal means another writer won the race (so re-reading may succeed).
fn lost_race(refusal: &Refusal, plan: &Plan) -> bool {
    match plan {
        Plan::Insert(_) => refusal.is("conflict") || refusal.is("exists"),
        Plan::Replace(..) | Plan::Delete(_) => refusal.is("conflict") || refusal.is("not-found"),
        Plan::Nothing => false,
    }
}

/// Read-modify-write `collection/id` with compare-and-swap.
///
/// `update` maps the current data (`None`: absent) to the desired data (`None`: absent, so an
/// existing document is deleted). Nothing is written when the desired data equals the current
/// data. When another call wrote the document in between, it is read again and `update` runs
/// again, up to `max_attempts` times in all; after that the last `conflict` is returned. A
/// refusal from `update` is returned as is. Answers the document as it now is.
pub fn update_with_retry<T, F>(collection: &str, id: &str, mut update: F, max_attempts: u32) -> Result<Option<Doc<T>>>
where
    T: Serialize + DeserializeOwned,
    F: FnMut(Option<T>) -> Result<Option<T>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current: Option<Doc<Value>> = get(collection, id)?;
        let current_data = current.clone().map(Doc::parse::<T>).transpose()?.map(|d| d.data);
        let desired = update(current_data)?;
        let desired_value = desired.as_ref().map(serde_json::to_value).transpose();
        let desired_value = desired_value.map_err(|e| Refusal::internal(format!("encoding the document failed: {e}")))?;
        let plan = plan(current.as_ref().map(|d| (d.revision, &d.data)), desired_value);
        let batch = match &plan {
            Plan::Nothing => return Ok(current.map(|d| Doc { id: d.id, revision: d.revision, data: desired }).and_then(Doc::transpose)),
            Plan::Insert(v) => Batch::new().insert(collection, id, v),
            Plan::Replace(revision, v) => Batch::new().replace(collection, id, *revision, v),
            Plan::Delete(revision) => Batch::new().delete(collection, id, *revision),
        };
        match batch.commit() {
            Ok(mut written) => {
                let Some(data) = desired else { return Ok(None) };
                let revision = written.pop().map_or(0, |d| d.revision);
                return Ok(Some(Doc { id: id.to_string(), revision, data }));
            }
            Err(refusal) if lost_race(&refusal, &plan) && attempt < max_attempts.max(1) => continue,
            Err(refusal) if lost_race(&refusal, &plan) => {
                return Err(Refusal::conflict(format!("{collection}/{id} kept changing; gave up after {attempt} attempts"))
                    .retryable()
                    .with_data(json!({ "collection": collection, "id": id, "attempts": attempt })));
            }
            Err(refusal) => return Err(refusal),
        }
    }
}

impl<T> Doc<Option<T>> {
    fn transpose(self) -> Option<Doc<T>> {
        self.data.map(|data| Doc { id: self.id, revision: self.revision, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_the_smallest_write() {
        let old = json!({"n": 1});
        assert_eq!(plan(None, None), Plan::Nothing);
        assert_eq!(plan(None, Some(json!({"n": 2}))), Plan::Insert(json!({"n": 2})));
        assert_eq!(plan(Some((4, &old)), Some(json!({"n": 1}))), Plan::Nothing);
        assert_eq!(plan(Some((4, &old)), Some(json!({"n": 2}))), Plan::Replace(4, json!({"n": 2})));
        assert_eq!(plan(Some((4, &old)), None), Plan::Delete(4));
    }

    #[test]
    fn retries_only_races() {
        let conflict = Refusal::conflict("moved");
        let exists = Refusal::new("exists", "taken");
        let gone = Refusal::new("not-found", "gone");
        let denied = Refusal::new("capability-denied", "no");
        assert!(lost_race(&conflict, &Plan::Insert(json!({}))));
        assert!(lost_race(&exists, &Plan::Insert(json!({}))));
        assert!(!lost_race(&gone, &Plan::Insert(json!({}))));
        assert!(lost_race(&gone, &Plan::Replace(1, json!({}))));
        assert!(lost_race(&conflict, &Plan::Delete(1)));
        assert!(!lost_race(&exists, &Plan::Delete(1)));
        assert!(!lost_race(&denied, &Plan::Replace(1, json!({}))));
    }

    #[test]
    fn batches_build_the_wit_writes() {
        let b = Batch::new()
            .insert("a", "1", &json!({"x": 1}))
            .put("a", "2", Some(3), &json!({}))
            .put("a", "3", None, &json!({}))
            .delete("b", "4", 9)
            .expect("c", "5", None);
        assert!(!b.is_empty());
        assert_eq!(b.writes.len(), 4);
        assert!(matches!(&b.writes[0].op, wit::WriteOp::Insert(d) if d == r#"{"x":1}"#));
        assert!(matches!(&b.writes[1].op, wit::WriteOp::Replace(r) if r.expected_revision == 3));
        assert!(matches!(&b.writes[2].op, wit::WriteOp::Insert(_)));
        assert!(matches!(&b.writes[3].op, wit::WriteOp::Delete(9)));
        assert_eq!(b.expectations[0].revision, None);
        assert!(Batch::new().is_empty());
    }

    #[test]
    fn a_batch_that_cannot_encode_refuses_before_committing() {
        let mut bad = std::collections::HashMap::new();
        bad.insert((1, 2), 3);
        let err = Batch::new().insert("a", "1", &bad).commit().unwrap_err();
        assert_eq!(err.code(), "internal");
    }

    #[test]
    fn documents_parse() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Note {
            text: String,
        }
        let d = Doc { id: "n".into(), revision: 2, data: json!({"text": "hi"}) };
        assert_eq!(d.clone().parse::<Note>().unwrap().data, Note { text: "hi".into() });
        let d = Doc { data: json!({"text": 1}), ..d };
        assert_eq!(d.parse::<Note>().unwrap_err().code(), "internal");
        let w = wit::Document { id: "n".into(), revision: 1, data: r#"{"text":"x"}"#.into() };
        assert_eq!(doc::<Note>("notes", w).unwrap().data.text, "x");
    }
}
