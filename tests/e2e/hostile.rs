//! Hostile HTTP: every method `GET /api/v1/methods` lists (the host's and the first-party
//! plugins'), called by every kind of caller with bodies generated from its input schema and
//! then mutated: fields missing, unknown or of the wrong type, huge strings and numbers, deep
//! nesting, control characters, invalid escapes and bytes, bodies that are no object, a body
//! over the limit. Every answer must be below 500 (or a retryable 503 that names itself), every
//! refusal the error envelope with a kebab-case code, and the server must neither panic nor stop
//! answering.
//!
//! The mutations come from a fixed seed, so a failure (reported with the method, the caller and
//! the body) happens again on the next run. Bodies act within the fixture's organization and
//! service, so owners' checks run as far as they go, and name nothing else that exists: a body
//! may add to the fixture, never change or delete what it holds.
//!
//! The schema fuzz does the same with fresh seeds, round after round until its time budget
//! (`CAPSTAN_FUZZ_SECONDS`; `.ci/run` sets it) runs out: bodies drawn from each method's input
//! schema and mutated, each judged against that schema, so that every body the schema refuses
//! must be refused by name (4xx, never 2xx nor 5xx) and any other must be answered below 500.
//! Its seed is printed, and `CAPSTAN_FUZZ_SEED` replays it.

use crate::support::*;
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const SEED: u64 = 0x15_4a7d_0c0f_fee5;

/// Mutated bodies per method for a caller that gets a sample (see [`budget`]).
const SAMPLE: usize = 8;
/// Mutated bodies per method at most, for a caller that gets them all.
const MAX_PER_METHOD: usize = 150;

/// A string well over any field's limit and well under the body limit (1 MiB by default).
const HUGE_STRING: usize = 100 * 1024;

/// The longest log line a request may cause, whatever it carries.
const MAX_LOG_LINE: usize = 4096;

/// Fields held at one value in every body: a long poll (`waitMs`) would otherwise hold a
/// request open for its whole window (25 s) by design.
const PINNED: &[(&str, &str, u64)] = &[("events.watch", "waitMs", 0)];

/// Methods the fuzz sends only bodies their schema refuses as a caller with a session: a valid
/// one ends the session, and the caller would be no one for the rest of the budget (the fixed
/// test sends them last).
const ENDS_SESSION: &[&str] = &["auth.logout"];

/// What the fuzz sends each method as each caller in a round: bodies drawn from its schema,
/// mutations of one of them, and a body that is no object or no JSON.
const FUZZ_DRAWN: usize = 3;
const FUZZ_MUTATED: usize = 6;

/// Failures shown per method when the fuzz fails (all are counted).
const FUZZ_SHOWN: usize = 3;

/// A step into a JSON value.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

type Path = Vec<Step>;

fn show(path: &[Step]) -> String {
    if path.is_empty() {
        return ".".into();
    }
    path.iter()
        .map(|step| match step {
            Step::Key(key) => format!(".{key}"),
            Step::Index(i) => format!("[{i}]"),
        })
        .collect()
}

/// splitmix64: a few lines of deterministic pseudo-randomness, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, salt: &str) -> Rng {
        // FNV-1a of the salt, so each method's mutations stay the same whatever runs before it
        let hash = salt.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        Rng(seed ^ hash)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// `n` of `items` (all of them if there are no more), keeping their order.
    fn sample<T>(&mut self, mut items: Vec<T>, n: usize) -> Vec<T> {
        while items.len() > n {
            let drop = self.below(items.len());
            items.remove(drop);
        }
        items
    }
}

/// Instances of a method's input schema (draft 2020-12 as the host and plugins emit it:
/// `$ref` into `$defs`, `oneOf`/`anyOf`, `const`, `type` lists with `null`).
struct Schema<'a> {
    root: &'a Value,
    fixture: &'a Identities,
    /// Where the fuzz draws each choice from; without it every choice is the first (the fixed
    /// test's bodies, the same on every run).
    vary: Option<RefCell<Rng>>,
}

impl<'a> Schema<'a> {
    fn fixed(root: &'a Value, fixture: &'a Identities) -> Schema<'a> {
        Schema { root, fixture, vary: None }
    }

    fn varied(root: &'a Value, fixture: &'a Identities, rng: Rng) -> Schema<'a> {
        Schema { root, fixture, vary: Some(RefCell::new(rng)) }
    }

    /// One of `n` choices: the first, unless the instances vary.
    fn choose(&self, n: usize) -> usize {
        match &self.vary {
            Some(rng) if n > 1 => rng.borrow_mut().below(n),
            _ => 0,
        }
    }

    fn resolve(&self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
            Some(name) => self.resolve(&self.root["$defs"][name]),
            None => schema,
        }
    }

    /// A plausible value for `schema`: required members only, or every member when `full`.
    fn instance(&self, schema: &'a Value, name: &str, full: bool, depth: usize) -> Value {
        let schema = self.resolve(schema);
        if let Some(value) = schema.get("const") {
            return value.clone();
        }
        if let Some(values) = schema.get("enum").and_then(Value::as_array).filter(|e| !e.is_empty()) {
            return values[self.choose(values.len())].clone();
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(alternatives) = schema.get(key).and_then(Value::as_array) {
                // the first that is not null, unless the instances vary
                let chosen = match self.vary {
                    Some(_) => alternatives.get(self.choose(alternatives.len())),
                    None => alternatives.iter().find(|a| self.resolve(a)["type"] != "null").or(alternatives.first()),
                };
                return chosen.map_or(Value::Null, |a| self.instance(a, name, full, depth));
            }
        }
        let kind = match &schema["type"] {
            Value::String(kind) => kind.as_str(),
            Value::Array(kinds) => {
                let kinds: Vec<&str> = kinds.iter().filter_map(Value::as_str).collect();
                match self.vary {
                    Some(_) if !kinds.is_empty() => kinds[self.choose(kinds.len())],
                    _ => kinds.iter().copied().find(|k| *k != "null").unwrap_or("null"),
                }
            }
            _ => "string",
        };
        match kind {
            "object" if depth < 8 => {
                let required: Vec<&str> = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                let members = schema["properties"].as_object().into_iter().flatten();
                let chosen = members.filter(|(key, _)| full || required.contains(&key.as_str()) || self.choose(2) == 1);
                let mut object: serde_json::Map<String, Value> =
                    chosen.map(|(key, s)| (key.clone(), self.instance(s, key, full, depth + 1))).collect();
                // a map (labels, environment): members of the schema its values have, if varied
                if let Some(values) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                    for i in 0..self.choose(3) {
                        object.insert(format!("hostile-{i}"), self.instance(values, name, full, depth + 1));
                    }
                }
                Value::Object(object)
            }
            "object" => json!({}),
            "array" if schema.get("items").is_some() && depth < 8 => {
                let count = match self.vary {
                    Some(_) => self.choose(3).max(schema["minItems"].as_u64().unwrap_or(0) as usize),
                    None => 1,
                };
                Value::Array((0..count).map(|_| self.instance(&schema["items"], name, full, depth + 1)).collect())
            }
            "array" => json!([]),
            "integer" | "number" => self.number(schema, name, kind == "integer"),
            "boolean" => json!(self.choose(2) == 0),
            "null" => Value::Null,
            _ => self.string(schema, name),
        }
    }

    /// A plausible number, or (varied) one of the schema's bounds or another within them.
    fn number(&self, schema: &Value, name: &str, integer: bool) -> Value {
        let bound = |key: &str| schema.get(key).filter(|v| v.is_number()).cloned();
        let low = schema["minimum"].as_i64().unwrap_or(0);
        let within = low.saturating_add(self.choose(1000) as i64);
        let fraction = (!integer).then(|| json!(within as f64 + 0.25));
        let candidates: Vec<Value> = [Some(plausible_number(name)), bound("minimum"), bound("maximum"), Some(json!(within)), fraction]
            .into_iter()
            .flatten()
            .collect();
        candidates[self.choose(candidates.len())].clone()
    }

    /// A plausible string, or (varied) an empty one, one of the longest length the schema
    /// allows, or a word of random letters.
    fn string(&self, schema: &Value, name: &str) -> Value {
        let longest = schema["maxLength"].as_u64().map(|n| "x".repeat((n as usize).min(HUGE_STRING)));
        let letters: String = (0..1 + self.choose(24)).map(|_| char::from(b'a' + self.choose(26) as u8)).collect();
        let candidates: Vec<String> =
            [Some(plausible_string(name, self.fixture)), Some(String::new()), longest, Some(letters)].into_iter().flatten().collect();
        // the plausible one half the time: the others are mostly refused before a method's checks
        let pick = if self.choose(2) == 0 { 0 } else { self.choose(candidates.len()) };
        json!(candidates[pick])
    }
}

/// A string that looks right for a member called `name`. The organization and service a body
/// acts within are the fixture's, so owners' checks run as far as they go; any other id names
/// nothing, so no body can change or delete what the fixture holds.
fn plausible_string(name: &str, fixture: &Identities) -> String {
    let text = match name {
        "organizationId" => return fixture.organization_id.clone(),
        "serviceId" => return fixture.service_id.clone(),
        "id" | "upload" => "hostile_00000000000000000000000000000000",
        n if n.ends_with("Id") => "hostile_00000000000000000000000000000000",
        "username" => "hostile-user",
        "password" | "newPassword" => "hostile-password-0123456789-abcdef",
        "image" => "registry.example.com/hostile:1.0",
        "token" => "capstan_mt_hostile",
        "key" => "HOSTILE_KEY",
        "domains" => "hostile.example.com",
        "mailAddresses" => "hostile@example.com",
        "mountPath" => "/var/lib/hostile",
        "version" => "1.0.0",
        "capabilities" => "deployment:status",
        _ => "hostile",
    };
    text.into()
}

/// Hold the fields of `method` that [`PINNED`] names in `body`; their names.
fn pin(method: &str, body: &mut Value) -> Vec<&'static str> {
    let pinned: Vec<_> = PINNED.iter().filter(|(m, _, _)| *m == method).collect();
    if let Some(object) = body.as_object_mut() {
        for (_, field, value) in &pinned {
            object.insert(field.to_string(), json!(value));
        }
    }
    pinned.iter().map(|(_, field, _)| *field).collect()
}

/// A number that looks right for a member called `name`.
fn plausible_number(name: &str) -> Value {
    match name {
        "expiresAt" => json!(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64 + 86_400_000),
        "port" | "publicPort" => json!(8080),
        "length" => json!(32),
        _ => json!(1),
    }
}

/// One body to send, and what it is for the report.
struct Mutation {
    label: String,
    body: Vec<u8>,
}

/// A JSON value whose serialization is then spliced with bytes no value can produce.
const SPLICE: &str = "@@hostile-splice@@";

fn json_body(label: String, value: &Value) -> Mutation {
    Mutation { label, body: value.to_string().into_bytes() }
}

/// `value` with the node at `path` replaced by `raw`, byte for byte.
fn spliced(label: String, value: &Value, path: &[Step], raw: &[u8]) -> Mutation {
    let mut marked = value.clone();
    *node(&mut marked, path) = json!(SPLICE);
    let text = marked.to_string();
    let (before, after) = text.split_once(&format!("\"{SPLICE}\"")).expect("the splice mark is in the body");
    let mut body = before.as_bytes().to_vec();
    body.extend_from_slice(raw);
    body.extend_from_slice(after.as_bytes());
    Mutation { label, body }
}

fn node<'v>(value: &'v mut Value, path: &[Step]) -> &'v mut Value {
    path.iter().fold(value, |v, step| match step {
        Step::Key(key) => &mut v[key.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

/// Every node below the root, parents first.
fn paths(value: &Value, prefix: &mut Path, out: &mut Vec<Path>) {
    let children: Vec<(Step, &Value)> = match value {
        Value::Object(map) => map.iter().map(|(k, v)| (Step::Key(k.clone()), v)).collect(),
        Value::Array(items) => items.iter().enumerate().map(|(i, v)| (Step::Index(i), v)).collect(),
        _ => return,
    };
    for (step, child) in children {
        prefix.push(step);
        out.push(prefix.clone());
        paths(child, prefix, out);
        prefix.pop();
    }
}

fn nested(open: &str, close: &str, depth: usize) -> Vec<u8> {
    format!("{}1{}", open.repeat(depth), close.repeat(depth)).into_bytes()
}

/// Values of every JSON type, the wrong ones for a node drawn from here.
fn wrong_types() -> Vec<Value> {
    vec![Value::Null, json!(true), json!(0), json!(-1.5), json!("hostile"), json!([]), json!({}), json!([null, 1, "a"]), json!({ "a": [] })]
}

fn same_type(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Numbers a field of integers is least ready for, as JSON text.
const HOSTILE_NUMBERS: &[&str] = &[
    "1e308",
    "-1",
    "18446744073709551615", // u64::MAX
    "18446744073709551616", // u64::MAX + 1
    "9007199254740993",     // 2^53 + 1
    "-9223372036854775809", // i64::MIN - 1
    "1.5",
    "-0",
];

/// Strings with what a field of text is least ready for.
const HOSTILE_TEXT: &[&str] = &[
    "a\u{0}b",
    "\u{1b}[31mred\u{1b}[0m",
    "line\r\nInjected: header",
    "\u{7f}\u{80}\u{9f}",
    "rtl\u{202e}txt.exe",
    "zero\u{200b}width\u{feff}",
    "\u{10ffff}\u{fffd}",
    "../../etc/passwd",
    "%00%0a",
];

/// Bytes a JSON string may not hold, spliced where a string was.
const HOSTILE_ESCAPES: &[(&str, &[u8])] = &[
    ("a lone surrogate escape", br#""\ud800""#),
    ("a reversed surrogate pair", br#""\udc00\ud800""#),
    ("an invalid escape", br#""\x41""#),
    ("invalid UTF-8", b"\"a\xff\xfeb\""),
    ("an overlong UTF-8 NUL", b"\"\xc0\x80\""),
    ("a raw control character", b"\"a\x01b\""),
];

/// Every mutation of the full instance `full` of a method (and the minimal one).
fn mutations(full: &Value, minimal: &Value, pinned: &[&str], rng: &mut Rng) -> Vec<Mutation> {
    let mut out = vec![json_body("the generated body (every member)".into(), full)];
    if minimal != full {
        out.push(json_body("the generated body (required members)".into(), minimal));
    }
    let mut all = Vec::new();
    paths(full, &mut Vec::new(), &mut all);
    let all: Vec<Path> = all.into_iter().filter(|p| !matches!(&p[0], Step::Key(k) if pinned.contains(&k.as_str()))).collect();
    for path in std::iter::once(Vec::new()).chain(all.iter().cloned()) {
        let at = show(&path);
        let mut value = full.clone();
        let current = node(&mut value, &path).clone();
        if let Value::Object(_) = current {
            node(&mut value, &path)["hostileUnknown"] = json!(1);
            out.push(json_body(format!("an unknown member in {at}"), &value));
        }
        if path.is_empty() {
            continue;
        }
        // missing: drop the member (an array item stays: its parent is mutated as a whole)
        if let (Some(Step::Key(key)), Some(parent)) = (path.last(), path.split_last().map(|(_, p)| p)) {
            let mut without = full.clone();
            node(&mut without, parent).as_object_mut().map(|m| m.remove(key));
            out.push(json_body(format!("without {at}"), &without));
        }
        let candidates: Vec<Value> = wrong_types().into_iter().filter(|w| !same_type(w, &current)).collect();
        for _ in 0..2 {
            let mut wrong = full.clone();
            let chosen = rng.pick(&candidates).clone();
            *node(&mut wrong, &path) = chosen.clone();
            out.push(json_body(format!("{at} = {chosen}"), &wrong));
        }
        match current {
            Value::String(_) => {
                let mut huge = full.clone();
                *node(&mut huge, &path) = json!("h\u{e9}".repeat(HUGE_STRING / 3));
                out.push(json_body(format!("{at} a string of {} KiB", HUGE_STRING / 1024), &huge));
                let mut odd = full.clone();
                let text = *rng.pick(HOSTILE_TEXT);
                *node(&mut odd, &path) = json!(text);
                out.push(json_body(format!("{at} = {text:?}"), &odd));
                let (what, raw) = *rng.pick(HOSTILE_ESCAPES);
                out.push(spliced(format!("{at} with {what}"), full, &path, raw));
            }
            Value::Number(_) => {
                for number in HOSTILE_NUMBERS {
                    out.push(spliced(format!("{at} = {number}"), full, &path, number.as_bytes()));
                }
            }
            _ => {}
        }
        out.push(spliced(format!("{at} nested 10000 arrays deep"), full, &path, &nested("[", "]", 10_000)));
        out.push(spliced(format!("{at} nested 100 objects deep"), full, &path, &nested("{\"a\":", "}", 100)));
    }
    out
}

/// Bodies that are no object, or no JSON, the same for every method.
fn whole_bodies() -> Vec<Mutation> {
    let raw = |label: &str, body: &[u8]| Mutation { label: label.into(), body: body.to_vec() };
    let mut huge_key = b"{\"".to_vec();
    huge_key.extend(std::iter::repeat_n(b'k', HUGE_STRING));
    huge_key.extend_from_slice(b"\":1}");
    vec![
        raw("the body null", b"null"),
        raw("the body an array", b"[]"),
        raw("the body an array of nulls", b"[null, null]"),
        raw("the body a string", b"\"hostile\""),
        raw("the body a number", b"1e999"),
        raw("the body true", b"true"),
        raw("an empty body", b""),
        raw("a body cut short", b"{\"a\":"),
        raw("a body with a byte-order mark", b"\xef\xbb\xbf{}"),
        raw("a body of invalid UTF-8", b"{\"\xff\":1}"),
        raw("a body of two objects", b"{}{}"),
        raw("a body with a member twice", b"{\"id\":\"a\",\"id\":\"b\"}"),
        raw("a body nested 10000 arrays deep", &nested("[", "]", 10_000)),
        raw("a body nested 10000 objects deep", &nested("{\"a\":", "}", 10_000)),
        Mutation { label: format!("a member name of {} KiB", HUGE_STRING / 1024), body: huge_key },
    ]
}

/// `Authorization` headers that must authenticate no one: forgeries of the fixture's tokens,
/// and things that are no bearer token at all.
fn forged_credentials(server: &Capstan, fixture: &Identities) -> Vec<(&'static str, Vec<u8>)> {
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let member = fixture.token(Kind::Member).expect("the member's session");
    let admin = fixture.token(Kind::Administrator).expect("the administrator's session");
    let admin_id = server.call_as(admin, "auth.whoami", &json!({})).expect_json(200)["userId"].clone();
    let parts: Vec<&str> = member.split('.').collect();
    assert_eq!(parts.len(), 3, "a session token is a JWT");
    let decode = |part: &str| -> Value {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).expect("a JWT part is base64url");
        serde_json::from_slice(&bytes).expect("a JWT part is JSON")
    };
    let (header, mut claims) = (decode(parts[0]), decode(parts[1]));
    claims["sub"] = admin_id;
    let as_admin = b64(claims.to_string().as_bytes());
    let mut unsigned = header.clone();
    unsigned["alg"] = json!("none");
    let mut symmetric = header;
    symmetric["alg"] = json!("HS256");
    let mut flipped = member.to_string();
    let last = if flipped.ends_with('A') { "B" } else { "A" };
    flipped.replace_range(flipped.len() - 1.., last);
    vec![
        ("the member's token claiming the administrator", format!("Bearer {}.{as_admin}.{}", parts[0], parts[2])),
        ("an unsigned token (alg none)", format!("Bearer {}.{as_admin}.", b64(unsigned.to_string().as_bytes()))),
        ("a token signed HS256", format!("Bearer {}.{as_admin}.{}", b64(symmetric.to_string().as_bytes()), parts[2])),
        ("the member's token with its signature changed", format!("Bearer {flipped}")),
        ("a machine token not exchanged", format!("Bearer {}", fixture.deployer_token)),
        ("a token of 8 KiB", format!("Bearer {}", "t".repeat(8 * 1024))),
        ("a token of three dots", "Bearer ...".into()),
        ("a token with text after it", format!("Bearer {admin} trailing")),
        ("Basic credentials", "Basic YWRtaW46ZTJlLWFkbWluaXN0cmF0b3ItcGFzc3dvcmQtN1F4".into()),
        ("a bearer without a token", "Bearer".into()),
    ]
    .into_iter()
    .map(|(what, value)| (what, value.into_bytes()))
    .chain([("bytes that are no text", b"Bearer \xe9\xff".to_vec())])
    .collect()
}

/// A whole `POST /api/v1/<method>` request with `authorization` as its header's bytes.
fn with_authorization(method: &str, authorization: &[u8], body: &[u8]) -> Vec<u8> {
    let head = format!("POST /api/v1/{method} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\nauthorization: ");
    let mut request = head.into_bytes();
    request.extend_from_slice(authorization);
    request.extend_from_slice(format!("\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    request
}

/// How many mutated bodies a caller sends a method.
#[derive(Clone, Copy)]
enum Budget {
    All,
    Sample(usize),
}

/// Every body for a caller the method lets reach its own checks; a sample for one it refuses
/// before its body is judged (an administrator's method for anyone else, and any method but a
/// public one for an anonymous caller).
fn budget(kind: Kind, access: &str) -> Budget {
    match (kind, access) {
        (Kind::Anonymous, "public") => Budget::All,
        (Kind::Anonymous, _) => Budget::Sample(SAMPLE),
        (Kind::Administrator, _) => Budget::All,
        (_, "admin") => Budget::Sample(SAMPLE),
        _ => Budget::All,
    }
}

/// What is wrong with an answer, if anything.
fn judge(reply: &Reply) -> Option<String> {
    match reply.status {
        200..=299 => match serde_json::from_str::<Value>(&reply.body) {
            Ok(_) => None,
            Err(e) => Some(format!("HTTP {} without a JSON body ({e})", reply.status)),
        },
        400..=599 => {
            let body: Value = match serde_json::from_str(&reply.body) {
                Ok(body) => body,
                Err(e) => return Some(format!("HTTP {} without a JSON body ({e})", reply.status)),
            };
            let error = match envelope_error(&body) {
                Ok(error) => error,
                Err(problem) => return Some(format!("HTTP {}: {problem}", reply.status)),
            };
            let unavailable = reply.status == 503 && error["retryable"] == true;
            (reply.status >= 500 && !unavailable).then(|| format!("HTTP {} {}", reply.status, error["code"]))
        }
        other => Some(format!("HTTP {other}")),
    }
}

/// What the callers sent and saw, gathered across their threads.
#[derive(Default)]
struct Tally {
    sent: usize,
    failures: Vec<String>,
    slowest: (Duration, String),
}

impl Tally {
    fn record(&mut self, what: String, took: Duration, problem: Option<String>, reply: &Reply, body: &[u8]) {
        self.sent += 1;
        if let Some(problem) = problem {
            let (answer, body) = (excerpt(reply.body.as_bytes()), excerpt(body));
            self.failures.push(format!("{what}: {problem}\n    answer: {answer}\n    body: {body}"));
        }
        if took > self.slowest.0 {
            self.slowest = (took, what);
        }
    }
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
    if bytes.len() > 300 { format!("{text}… ({} bytes)", bytes.len()) } else { text }
}

#[test]
fn every_method_survives_hostile_bodies_from_every_kind_of_caller() {
    let started = Instant::now();
    let (_dir, server, methods, fixture) = start();

    // each method's bodies, the same whoever sends them
    let whole = whole_bodies();
    let bodies: Vec<(String, String, Vec<Mutation>)> = methods
        .iter()
        .map(|method| {
            let name = method["name"].as_str().expect("a method name").to_string();
            let access = method["access"].as_str().unwrap_or_default().to_string();
            let schema = Schema::fixed(&method["input"], &fixture);
            let mut full = schema.instance(&method["input"], "", true, 0);
            let mut minimal = schema.instance(&method["input"], "", false, 0);
            let pinned = pin(&name, &mut full);
            pin(&name, &mut minimal);
            let mut rng = Rng::new(SEED, &name);
            let mut generated = mutations(&full, &minimal, &pinned, &mut rng);
            // the generated body itself is always sent
            let rest = rng.sample(generated.split_off(1), MAX_PER_METHOD - 1);
            generated.extend(rest);
            (name, access, generated)
        })
        .collect();

    let forged = forged_credentials(&server, &fixture);
    let tally = Mutex::new(Tally::default());
    std::thread::scope(|scope| {
        for kind in Kind::ALL {
            let (server, fixture, bodies, whole, forged, tally) = (&server, &fixture, &bodies, &whole, &forged, &tally);
            scope.spawn(move || {
                let mut rng = Rng::new(SEED, kind.name());
                for (method, access, generated) in bodies {
                    let chosen: Vec<&Mutation> = generated.iter().chain(whole).collect();
                    let chosen = match budget(kind, access) {
                        Budget::All => chosen,
                        // the generated body always, then a sample of the mutations
                        Budget::Sample(n) => {
                            let (base, rest) = chosen.split_at(1);
                            base.iter().copied().chain(rng.sample(rest.to_vec(), n)).collect()
                        }
                    };
                    for mutation in chosen {
                        let began = Instant::now();
                        let reply = fixture.call(server, kind, method, &mutation.body);
                        let what = format!("{method} as {} with {}", kind.name(), mutation.label);
                        tally.lock().unwrap().record(what, began.elapsed(), judge(&reply), &reply, &mutation.body);
                    }
                    if kind != Kind::Anonymous {
                        continue;
                    }
                    // a forged or malformed credential is no one: a method that needs someone
                    // refuses it as it refuses no credential, a public one answers as it would
                    for (what, authorization) in forged {
                        let began = Instant::now();
                        let reply = server.raw(&with_authorization(method, authorization, &generated[0].body));
                        let problem = match access.as_str() {
                            "public" => judge(&reply),
                            _ if reply.status == 401 && reply.body.contains("\"unauthenticated\"") => None,
                            _ => Some(format!("expected 401 unauthenticated, got {}", reply.status)),
                        };
                        tally.lock().unwrap().record(format!("{method} with {what}"), began.elapsed(), problem, &reply, &generated[0].body);
                    }
                    // over the body limit: nobody is refused by name before a byte is read,
                    // unauthenticated where the method needs someone, request-too-large (over
                    // the few KiB nobody may send) where it is public
                    let mut body = b"{\"a\":\"".to_vec();
                    body.resize(1024 * 1024 + 1, b'a');
                    body.extend_from_slice(b"\"}");
                    let began = Instant::now();
                    let reply = server.raw(&sized_post(&format!("/api/v1/{method}"), &body));
                    let (status, code) = if access == "public" { (413, "request-too-large") } else { (401, "unauthenticated") };
                    let refused = reply.status == status && reply.body.contains(&format!("\"{code}\""));
                    let problem = (!refused).then(|| format!("expected {status} {code}, got {}", reply.status));
                    tally.lock().unwrap().record(format!("{method} with a body over the limit"), began.elapsed(), problem, &reply, &body);
                }
            });
        }
    });

    let Tally { sent, failures, slowest: (took, what) } = tally.into_inner().unwrap();
    println!(
        "hostile HTTP: {sent} requests over {} methods in {:.1?}; the slowest took {took:.1?}: {what}",
        bodies.len(),
        started.elapsed()
    );
    // bounded: what each caller sends is capped per method
    let per_method = MAX_PER_METHOD + whole.len() + forged.len() + 1;
    assert!(sent <= bodies.len() * Kind::ALL.len() * per_method, "{sent} requests is more than the bounds allow");
    assert!(failures.is_empty(), "{} answers were not named refusals or answers:\n{}", failures.len(), failures.join("\n"));

    assert_whole(server);
}

/// A server started with the test administrator, the methods it lists (a session that ends
/// is ended last, so it serves its caller's other calls first) and the fixture.
fn start() -> (tempfile::TempDir, Capstan, Vec<Value>, Identities) {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let mut methods = server.listed_methods();
    let fixture = Identities::create(&server);
    methods.sort_by_key(|m| m["name"].as_str().is_some_and(|name| ENDS_SESSION.contains(&name)));
    (dir, server, methods, fixture)
}

/// The server still answers, and its log holds no panic and no line a request made too long.
fn assert_whole(server: Capstan) {
    assert_eq!(server.ready_status()["ready"], true);
    let log = server.stop().stderr;
    assert!(!log.to_lowercase().contains("panic"), "the server's log mentions a panic:\n{log}");
    // what a caller can trigger at will is logged below ERROR: an operator's alert on ERROR
    // lines is not an attacker's to ring
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).take(10).collect();
    assert!(errors.is_empty(), "a caller made the server log at ERROR:\n{}", errors.join("\n"));
    // a request cannot make the log say much more than the request says about itself
    let long: Vec<String> = log
        .lines()
        .filter(|l| l.len() > MAX_LOG_LINE)
        .map(|l| format!("{} bytes: {}…", l.len(), &l[..l.floor_char_boundary(300)]))
        .collect();
    assert!(long.is_empty(), "{} log lines are longer than {MAX_LOG_LINE} bytes:\n{}", long.len(), long.join("\n"));
}

/// The fuzz's budget and seed from the environment (`None`: skipped, saying why). A seed alone
/// replays one round.
fn fuzz_settings() -> Option<(Duration, u64)> {
    let read = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let (seconds, seed) = (read("CAPSTAN_FUZZ_SECONDS"), read("CAPSTAN_FUZZ_SEED"));
    if seconds.is_none() && seed.is_none() {
        eprintln!("skipped: CAPSTAN_FUZZ_SECONDS is not set (the schema fuzz's time budget; .ci/run sets it)");
        return None;
    }
    let budget = seconds.map_or(Duration::ZERO, |s| {
        Duration::from_secs_f64(s.trim().parse().unwrap_or_else(|e| panic!("CAPSTAN_FUZZ_SECONDS={s:?}: {e}")))
    });
    let seed = match seed {
        Some(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("CAPSTAN_FUZZ_SEED={s:?}: {e}"))
        }
        None => Rng(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64).next(),
    };
    Some((budget, seed))
}

/// Whether `body` breaks the schema `validator` holds, and how (the first error). A body of
/// nothing but whitespace is `{}`, as the API documents.
fn violation(validator: &jsonschema::Validator, body: &[u8]) -> Option<String> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { body };
    match serde_json::from_slice::<Value>(body) {
        Err(e) => Some(format!("not JSON: {e}")),
        Ok(value) => validator.iter_errors(&value).next().map(|e| format!("{} at {:?}", e, e.instance_path().as_str())),
    }
}

/// What is wrong with an answer to a body that breaks the method's schema (`violation`) or
/// not: [`judge`]'s rules, and a body the schema refuses is never taken.
fn judge_by_schema(reply: &Reply, violation: Option<&str>) -> Option<String> {
    judge(reply).or_else(|| {
        let violation = violation?;
        (reply.status < 400).then(|| format!("HTTP {} for a body its schema refuses ({violation})", reply.status))
    })
}

/// A round's bodies for `method` as one caller, from the round's `seed`: drawn from its input
/// schema, then a sample of the mutations of a fully drawn one; and one of the `whole` bodies.
fn fuzz_bodies<'w>(method: &Value, fixture: &Identities, whole: &'w [Mutation], seed: u64, kind: Kind) -> (Vec<Mutation>, &'w Mutation) {
    let name = method["name"].as_str().expect("a method name");
    let mut rng = Rng::new(seed, &format!("{name} as {}", kind.name()));
    let schema = Schema::varied(&method["input"], fixture, Rng(rng.next()));
    let mut bodies: Vec<Mutation> = (0..FUZZ_DRAWN)
        .map(|_| {
            let mut drawn = schema.instance(&method["input"], "", false, 0);
            pin(name, &mut drawn);
            json_body("a body drawn from the schema".into(), &drawn)
        })
        .collect();
    let mut full = schema.instance(&method["input"], "", true, 0);
    let mut minimal = schema.instance(&method["input"], "", false, 0);
    let pinned = pin(name, &mut full);
    pin(name, &mut minimal);
    let mutated = mutations(&full, &minimal, &pinned, &mut rng);
    bodies.extend(rng.sample(mutated, FUZZ_MUTATED));
    (bodies, rng.pick(whole))
}

/// What the fuzz's callers sent and saw.
#[derive(Default)]
struct FuzzTally {
    tally: Tally,
    /// Bodies the schema takes, and how many of those were answered 2xx.
    valid: usize,
    taken: usize,
    /// Failures by method: how many, and the first few.
    by_method: BTreeMap<String, (usize, Vec<String>)>,
    /// Rounds each caller finished, and how long they took.
    rounds: Vec<(Kind, Duration)>,
}

#[test]
fn fuzz_every_method_from_its_schema_within_a_time_budget() {
    let Some((budget, seed)) = fuzz_settings() else { return };
    println!("schema fuzz: seed {seed:#x} (CAPSTAN_FUZZ_SEED={seed:#x} replays it), budget {budget:?}");
    let started = Instant::now();
    let (_dir, server, methods, fixture) = start();
    // the plugin host judges a plugin's bodies with this crate and these pattern options
    let validators: Vec<jsonschema::Validator> = methods
        .iter()
        .map(|method| {
            let patterns = jsonschema::PatternOptions::regex().size_limit(1 << 20).dfa_size_limit(1 << 20);
            jsonschema::options()
                .with_pattern_options(patterns)
                .build(&method["input"])
                .unwrap_or_else(|e| panic!("{}: the input schema does not compile: {e}", method["name"]))
        })
        .collect();
    let whole = whole_bodies();
    let deadline = Instant::now() + budget;

    let tally = Mutex::new(FuzzTally::default());
    std::thread::scope(|scope| {
        for kind in Kind::ALL {
            let (server, fixture, methods, validators, whole, tally) = (&server, &fixture, &methods, &validators, &whole, &tally);
            scope.spawn(move || {
                // each round's seed is drawn from the one before, so a round's seed replays it
                let mut round_seed = seed;
                // every method at least once, then rounds until the budget is spent (the last
                // one cut short where it runs out)
                for round in 0.. {
                    let began_round = Instant::now();
                    for (method, validator) in methods.iter().zip(validators) {
                        if round > 0 && Instant::now() >= deadline {
                            return;
                        }
                        let name = method["name"].as_str().expect("a method name");
                        let (bodies, extra) = fuzz_bodies(method, fixture, whole, round_seed, kind);
                        for body in bodies.iter().chain([extra]) {
                            let violated = violation(validator, &body.body);
                            if violated.is_none() && ENDS_SESSION.contains(&name) && fixture.token(kind).is_some() {
                                continue;
                            }
                            let began = Instant::now();
                            let reply = fixture.call(server, kind, name, &body.body);
                            let took = began.elapsed();
                            let problem = judge_by_schema(&reply, violated.as_deref());
                            let verdict = violated.as_deref().map_or("valid".into(), |v| format!("invalid: {v}"));
                            let what = format!(
                                "{name} as {} with {} ({verdict}; round {round}, CAPSTAN_FUZZ_SEED={round_seed:#x} replays it first)",
                                kind.name(),
                                body.label
                            );
                            let mut tally = tally.lock().unwrap();
                            if violated.is_none() {
                                tally.valid += 1;
                                tally.taken += usize::from((200..300).contains(&reply.status));
                            }
                            tally.tally.record(what, took, problem, &reply, &body.body);
                            // kept by method, a few each: a budget of failures would not fit a report
                            if let Some(failure) = tally.tally.failures.pop() {
                                let (count, shown) = tally.by_method.entry(name.to_string()).or_default();
                                *count += 1;
                                if shown.len() < FUZZ_SHOWN {
                                    shown.push(failure);
                                }
                            }
                        }
                    }
                    tally.lock().unwrap().rounds.push((kind, began_round.elapsed()));
                    round_seed = Rng(round_seed).next();
                }
            });
        }
    });

    let FuzzTally { tally: Tally { sent, slowest: (took, what), .. }, valid, taken, by_method, rounds } = tally.into_inner().unwrap();
    let longest = rounds.iter().map(|(_, d)| *d).max().unwrap_or_default();
    let fewest = Kind::ALL.iter().map(|k| rounds.iter().filter(|(kind, _)| kind == k).count()).min().unwrap_or(0);
    println!(
        "schema fuzz (seed {seed:#x}): {sent} requests over {} methods in {:.1?}, {fewest} whole rounds by the slowest \
         caller, the longest {longest:.1?}; {valid} bodies the schema takes, {taken} of them answered 2xx; the slowest \
         request took {took:.1?}: {what}",
        methods.len(),
        started.elapsed(),
    );
    let failed: usize = by_method.values().map(|(count, _)| count).sum();
    let shown: Vec<String> =
        by_method.iter().map(|(method, (count, first))| format!("{method}: {count} failures, the first:\n{}", first.join("\n"))).collect();
    assert!(
        failed == 0,
        "schema fuzz with CAPSTAN_FUZZ_SEED={seed:#x}: {failed} answers over {} methods were not named refusals or answers, or took a \
         body its schema refuses:\n{}",
        by_method.len(),
        shown.join("\n")
    );
    assert_whole(server);
}
