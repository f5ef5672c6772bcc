//! The method registry: every typed API method with its JSON Schemas, who may call it, and
//! strict decoding of request bodies against the method's input type. No HTTP here: the
//! server, the socket, the dashboard, MCP and the demo all call methods through the one door,
//! [`Registry::invoke`] ([`door`]).
//!
//! A method's handler gets the [`Call`] (who is calling, from where, under which request id)
//! and the context its area registered it with ([`Registry::with`]): a subsystem reaches the
//! services it was given, never the whole host.

pub mod audit;
pub mod door;
pub mod identity;
pub mod organizations;
pub mod receipts;

pub use capstan_core::refusal;
pub use door::{Body, Caller, Invocation, Invoked};
pub use identity::{ADMIN_FRESHNESS, Identity, denied};
pub use organizations::{OrgRole, OrganizationAuthority};

use capstan_core::refusal::{Refusal, Result};
use capstan_core::text::truncate;
use futures::future::BoxFuture;
use schemars::{JsonSchema, schema_for};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

/// Who may call a method, host or plugin. Checked by the dispatcher before the body is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Access {
    /// Anyone (login, probes).
    Public,
    /// Any authenticated user or machine.
    Authenticated,
    /// A member of the organization the request names (or an administrator); checked by
    /// `inventory::access` once the organization is known.
    Member,
    /// An owner of the organization the request names (or an administrator).
    Owner,
    /// A human administrator.
    Admin,
}

impl Access {
    /// The name a descriptor or a listing uses (`public`, `authenticated`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Public => "public",
            Access::Authenticated => "authenticated",
            Access::Member => "member",
            Access::Owner => "owner",
            Access::Admin => "admin",
        }
    }
}

impl FromStr for Access {
    type Err = Refusal;
    /// A plugin descriptor's role; anything else is refused `plugin-descriptor-invalid`.
    fn from_str(s: &str) -> Result<Access> {
        Ok(match s {
            "public" => Access::Public,
            "authenticated" => Access::Authenticated,
            "member" => Access::Member,
            "owner" => Access::Owner,
            "admin" => Access::Admin,
            other => {
                return Err(Refusal::new(
                    "plugin-descriptor-invalid",
                    format!("role {other:?} is not one of public, authenticated, member, owner, admin"),
                ));
            }
        })
    }
}

/// One call: the caller as established for this request, its address, the request's id.
#[derive(Debug, Clone, Default)]
pub struct Call {
    /// The authenticated caller; `None` only for public methods.
    pub identity: Option<Identity>,
    /// The client's address, when the call came over the network.
    pub source: Option<IpAddr>,
    /// The id every log line of the request carries (empty outside a request).
    pub request_id: String,
    /// The body's JSON text as the client sent it, when the call came over the API: a plugin's
    /// method hands it to the guest as is rather than serializing the parsed body again.
    pub body_text: Option<String>,
}

impl Call {
    /// A call made by `identity` from inside the host (the dashboard, a test).
    pub fn by(identity: &Identity) -> Call {
        Call { identity: Some(identity.clone()), ..Call::default() }
    }

    /// The authenticated caller (the dispatcher guarantees one for non-public methods).
    pub fn identity(&self) -> Result<&Identity> {
        self.identity.as_ref().ok_or_else(denied)
    }
}

/// One registered method: its name, schemas, access and handler.
pub struct Method {
    /// `<area>.<verb>`.
    pub name: String,
    /// One line for the listing and `--help`.
    pub summary: String,
    /// Who may call it.
    pub access: Access,
    /// The JSON Schema of the body.
    pub input_schema: Value,
    /// The JSON Schema of the answer.
    pub output_schema: Value,
    /// Only the coordinator lease's holder answers: another node forwards the request to it.
    pub coordinator_only: bool,
    /// The plugin that serves it; `None` for the host's own methods.
    pub plugin: Option<String>,
    /// It changes nothing: its calls are not audited. Declared by the method ([`Method::read_only`]);
    /// every other method, every plugin method among them, is recorded in the audit log.
    pub read_only: bool,
    /// The refusal codes a host method answers of its own, beyond [`GENERIC_REFUSALS`]
    /// ([`Method::refuses`]); shown by status in the OpenAPI document. Empty for a plugin's
    /// method: its plugin declares its codes ([`Method::declared_refusals`]).
    pub refuses: Vec<&'static str>,
    /// The refusal codes the plugin serving the method declared, with the HTTP status each
    /// answers (a code the host's table names keeps the table's).
    pub declared_refusals: Vec<(String, u16)>,
    /// Whose refusals the method passes on as they come, beyond those it declares (a plugin it
    /// runs, a relay's agent), when it does ([`Method::passes_on`]): their codes are not known here.
    pub passes_on: Option<&'static str>,
    /// What every body must be before the handler sees it, read from `input_schema` when the
    /// method is made ([`BodyRules`]).
    body_rules: BodyRules,
    handler: RawHandler,
}

/// The refusals any host method may answer whatever it does, so no method declares them: the
/// body reader's and decoder's, the caller's access, the store's (busy, unreachable, an id or a
/// document it cannot hold), the coordinator's forwarding, and `internal`.
pub const GENERIC_REFUSALS: &[&str] = &[
    "invalid-request",
    "request-too-large",
    "unsupported-media-type",
    "request-timeout",
    "unauthenticated",
    "forbidden",
    "store-busy",
    "store-unavailable",
    "invalid-id",
    "invalid-document",
    "document-too-large",
    "coordinator-unavailable",
    "internal",
];

/// The fixed message a debug build logs (at warn) when a host method answers a refusal code
/// it did not declare with [`Method::refuses`], or one that answers another HTTP status than
/// the OpenAPI document shows for it. The e2e suite fails any test whose server logged it.
pub const UNDECLARED_REFUSAL: &str = "a host method answered a refusal code it does not declare";

/// The handler of a method whose body another layer judges (a plugin's, validated against the
/// JSON Schema its plugin declares).
pub type RawHandler = Arc<dyn Fn(Call, Value) -> BoxFuture<'static, Result<Answer>> + Send + Sync>;

/// A method's answer: the JSON tree a host method built, or the JSON text a plugin answered,
/// checked to be one JSON value and passed on as it came (parsing it into a tree only to write
/// it out again is most of what a plugin's answer would cost the host).
#[derive(Debug, Clone)]
pub enum Answer {
    /// Built by the host.
    Tree(Value),
    /// A plugin's JSON text, one value.
    Text(Box<serde_json::value::RawValue>),
}

impl Answer {
    /// `text` as an answer, when it is one JSON value (surrounding whitespace allowed); the
    /// parser's complaint otherwise.
    pub fn text(text: String) -> std::result::Result<Answer, serde_json::Error> {
        serde_json::value::RawValue::from_string(text).map(Answer::Text)
    }

    /// The answer as a JSON tree, for a consumer that reads into it (the dashboard, a test). A
    /// text can still fail here where the check let it pass: a number beyond what a tree holds.
    pub fn into_value(self) -> Result<Value> {
        match self {
            Answer::Tree(value) => Ok(value),
            Answer::Text(text) => serde_json::from_str(text.get())
                .map_err(|e| Refusal::new("plugin-output-invalid", format!("the answer cannot be read as a JSON tree: {e}"))),
        }
    }

    /// The answer as a JSON tree to look into (null for a text that cannot be read as one).
    pub fn tree(&self) -> std::borrow::Cow<'_, Value> {
        match self {
            Answer::Tree(value) => std::borrow::Cow::Borrowed(value),
            Answer::Text(text) => std::borrow::Cow::Owned(serde_json::from_str(text.get()).unwrap_or(Value::Null)),
        }
    }
}

impl From<Value> for Answer {
    fn from(value: Value) -> Answer {
        Answer::Tree(value)
    }
}

impl Serialize for Answer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Answer::Tree(value) => value.serialize(serializer),
            Answer::Text(text) => text.serialize(serializer),
        }
    }
}

/// Methods an area loads and unloads while the host runs (the plugin host's): the registry
/// serves them beside the host's own, so a swap there is a swap here, all at once.
#[async_trait::async_trait]
pub trait MethodSource: Send + Sync {
    /// The method called `name`, if this source serves it now.
    fn get(&self, name: &str) -> Option<Arc<Method>>;

    /// Every method it serves now.
    fn list(&self) -> Vec<Arc<Method>>;

    /// Why `name` is not served, when it names something of this source that cannot answer
    /// now (say, an installed plugin that is disabled, or failed to load); `None` when the
    /// name is simply unknown to it.
    async fn absent(&self, name: &str) -> Option<Refusal>;
}

/// Every method the host serves, by name: its own, and those its sources serve now.
#[derive(Default)]
pub struct Registry {
    methods: BTreeMap<String, Arc<Method>>,
    sources: Vec<Arc<dyn MethodSource>>,
    /// Where [`Registry::call`] records state-changing calls (see [`audit`]).
    audit: Option<audit::AuditLog>,
    /// What [`Registry::invoke`] authenticates and forwards with.
    keepers: door::Keepers,
}

/// Registration of one area's methods, each handed a clone of the area's context per call.
pub struct Scope<'r, C> {
    registry: &'r mut Registry,
    context: C,
}

impl<C: Clone + Send + Sync + 'static> Scope<'_, C> {
    /// Register a method whose handler takes the area's context, the call and the decoded body.
    pub fn add<In, Out, F, Fut>(&mut self, name: &str, summary: &str, access: Access, handler: F) -> &mut Method
    where
        In: DeserializeOwned + JsonSchema + Send + 'static,
        Out: Serialize + JsonSchema + 'static,
        F: Fn(C, Call, In) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Out>> + Send + 'static,
    {
        let context = self.context.clone();
        self.registry.add(name, summary, access, move |call, input| handler(context.clone(), call, input))
    }
}

impl Registry {
    /// Register an area's methods with the context their handlers need.
    pub fn with<C: Clone + Send + Sync + 'static>(&mut self, context: C) -> Scope<'_, C> {
        Scope { registry: self, context }
    }

    /// Register a method. `In` is decoded strictly (unknown fields refused) before `handler` runs.
    pub fn add<In, Out, F, Fut>(&mut self, name: &str, summary: &str, access: Access, handler: F) -> &mut Method
    where
        In: DeserializeOwned + JsonSchema + Send + 'static,
        Out: Serialize + JsonSchema + 'static,
        F: Fn(Call, In) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Out>> + Send + 'static,
    {
        assert!(valid_method_name(name), "method name {name} must be <area>.<verb> in camelCase");
        assert!(!self.methods.contains_key(name), "method {name} registered twice");
        let handler = Arc::new(handler);
        let input_schema = serde_json::to_value(schema_for!(In)).expect("schema serializes");
        let method = Method {
            name: name.into(),
            summary: summary.into(),
            access,
            body_rules: BodyRules::of(&input_schema),
            input_schema,
            output_schema: serde_json::to_value(schema_for!(Out)).expect("schema serializes"),
            coordinator_only: false,
            plugin: None,
            read_only: false,
            refuses: Vec::new(),
            declared_refusals: Vec::new(),
            passes_on: None,
            handler: Arc::new(move |call, body| {
                let handler = handler.clone();
                Box::pin(async move {
                    let input: In = decode(body)?;
                    let output = handler(call, input).await?;
                    serde_json::to_value(output).map(Answer::Tree).map_err(Refusal::internal)
                })
            }),
        };
        let entry = self.methods.entry(name.into()).or_insert(Arc::new(method));
        Arc::get_mut(entry).expect("a method is not shared while it is registered")
    }

    /// Serve the methods of `source` too (after the host's own, which it cannot shadow).
    pub fn add_source(&mut self, source: Arc<dyn MethodSource>) {
        self.sources.push(source);
    }

    /// The method called `name`, the host's or a source's.
    pub fn get(&self, name: &str) -> Option<Arc<Method>> {
        self.methods.get(name).cloned().or_else(|| self.sources.iter().find_map(|s| s.get(name)))
    }

    /// The method called `name`, or why there is none: what its source says
    /// (`plugin-disabled`, …) or `method-unknown`.
    pub async fn resolve(&self, name: &str) -> Result<Arc<Method>> {
        if let Some(method) = self.get(name) {
            return Ok(method);
        }
        for source in &self.sources {
            if let Some(refusal) = source.absent(name).await {
                return Err(refusal);
            }
        }
        let shown: String = name.chars().take(100).collect();
        Err(Refusal::new("method-unknown", format!("there is no method {shown:?}; GET /api/v1/methods lists them"))
            .with_data(json!({ "method": shown })))
    }

    /// Every method, the host's by name and then each source's.
    pub fn list(&self) -> Vec<Arc<Method>> {
        let mut all: Vec<Arc<Method>> = self.methods.values().cloned().collect();
        for source in &self.sources {
            all.extend(source.list().into_iter().filter(|m| !self.methods.contains_key(&m.name)));
        }
        all
    }

    /// The machine-readable listing served at `GET /api/v1/methods`.
    pub fn describe(&self) -> Value {
        let methods: Vec<Value> = self
            .list()
            .iter()
            .map(|m| {
                let mut entry = json!({"name": m.name, "summary": m.summary, "access": m.access, "coordinatorOnly": m.coordinator_only,
                    "readOnly": m.read_only, "input": m.input_schema, "output": m.output_schema});
                if let Some(plugin) = &m.plugin {
                    entry["plugin"] = json!(plugin);
                }
                entry
            })
            .collect();
        json!({ "methods": methods })
    }
}

impl Method {
    /// A method of `plugin` whose handler judges the body itself (against `input_schema`).
    pub fn served_by(plugin: &str, name: String, summary: String, access: Access, schemas: (Value, Value), handler: RawHandler) -> Method {
        let (input_schema, output_schema) = schemas;
        let plugin = Some(plugin.into());
        Method {
            name,
            summary,
            access,
            body_rules: BodyRules::of(&input_schema),
            input_schema,
            output_schema,
            coordinator_only: false,
            plugin,
            read_only: false,
            refuses: Vec::new(),
            declared_refusals: Vec::new(),
            passes_on: None,
            handler,
        }
    }

    /// Declare that the method changes nothing (a read): its calls are not audited.
    pub fn read_only(&mut self) -> &mut Self {
        self.read_only = true;
        self
    }

    /// Mark the method as answered by the coordinator only (`fleet::forward` takes it there).
    pub fn coordinator_only(&mut self) -> &mut Self {
        self.coordinator_only = true;
        self
    }

    /// Declare refusal codes the method answers of its own (beyond [`GENERIC_REFUSALS`]): the
    /// OpenAPI document lists them under the status each answers. Only codes it really can
    /// answer; a debug build logs [`UNDECLARED_REFUSAL`] for one it answers undeclared.
    pub fn refuses(&mut self, codes: &[&'static str]) -> &mut Self {
        for &code in codes {
            if !self.refuses.contains(&code) {
                self.refuses.push(code);
            }
        }
        self
    }

    /// Declare that the method also passes on the refusals of `whom` (say, "the plugin it
    /// installs (its migration)"), whose codes are not known here: the OpenAPI document says so
    /// under `default`, and such a code is not taken for an undeclared one.
    pub fn passes_on(&mut self, whom: &'static str) -> &mut Self {
        self.passes_on = Some(whom);
        self
    }

    /// Every refusal code the method may answer, sorted: those of [`GENERIC_REFUSALS`] that fit
    /// it (`unauthenticated` and `forbidden` only where a caller is required, `coordinator-unavailable`
    /// only for a coordinator-only method) and those it declares.
    pub fn refusal_codes(&self) -> Vec<&'static str> {
        let generic = GENERIC_REFUSALS.iter().copied().filter(|code| match *code {
            "unauthenticated" | "forbidden" => self.access != Access::Public,
            "coordinator-unavailable" => self.coordinator_only,
            _ => true,
        });
        let mut codes: Vec<&'static str> = generic.chain(self.refuses.iter().copied()).collect();
        codes.sort_unstable();
        codes.dedup();
        codes
    }

    /// Whether `refusal` is one this method may answer ([`Method::refusal_codes`]), answered with
    /// the status the OpenAPI document shows for its code. A plugin's method declares none, so
    /// every refusal of one is accepted; so is any code a method that passes on another's
    /// refusals ([`Method::passes_on`]) does not declare.
    pub fn declares(&self, refusal: &Refusal) -> bool {
        let code = refusal.code.as_ref();
        if self.plugin.is_some() {
            return true;
        }
        if self.refusal_codes().contains(&code) {
            return refusal.http_status() == documented_status(code);
        }
        self.passes_on.is_some()
    }

    /// Run the method for `call`, its answer as a JSON tree ([`Method::answer`] passes a plugin's
    /// text on unparsed).
    pub async fn call(&self, call: Call, body: Value) -> Result<Value> {
        self.answer(call, body).await?.into_value()
    }

    /// Run the method for `call`. An administrator-only method refuses anyone else here, before
    /// the body is looked at; then a body that is not the object the input is, or names an id
    /// `""`, is refused `invalid-request` (its `BodyRules`), host and plugin methods alike.
    /// Organization roles are checked by the handler once it knows the organization, through
    /// the one [`OrganizationAuthority`].
    pub async fn answer(&self, call: Call, body: Value) -> Result<Answer> {
        if self.access == Access::Admin && !call.identity.as_ref().is_some_and(|i| i.is_human_admin()) {
            return Err(Refusal::new("forbidden", format!("{} needs an administrator", self.name)));
        }
        self.body_rules.check(&body)?;
        let answer = (self.handler)(call, body).await;
        // Keeps the declarations true as the code changes: a debug build (every test's) says
        // when a method answers a code it does not declare, and the e2e suite fails on it.
        #[cfg(debug_assertions)]
        if let Err(refusal) = &answer
            && !self.declares(refusal)
        {
            tracing::warn!(method = %self.name, code = %refusal.code, status = refusal.http_status(), "{UNDECLARED_REFUSAL}");
        }
        answer
    }
}

/// The HTTP status the OpenAPI document shows for a refusal coded `code`: its status in the one
/// table ([`capstan_core::refusal::code_status`]), else 400. A retryable refusal whose code the
/// table does not name answers 503: such a code belongs in the table before a method declares it.
pub fn documented_status(code: &str) -> u16 {
    capstan_core::refusal::code_status(code).unwrap_or(400)
}

/// `<area>.<verb>`: lowercase-initial camelCase words joined by one dot.
pub fn valid_method_name(name: &str) -> bool {
    let Some((area, verb)) = name.split_once('.') else { return false };
    let word = |w: &str| w.starts_with(|c: char| c.is_ascii_lowercase()) && w.chars().all(|c| c.is_ascii_alphanumeric()) && w.len() <= 64;
    word(area) && word(verb)
}

/// What a decoding error says without the value it quotes (serde writes `invalid type:
/// string "…", expected a map`): the value may be a secret put in the wrong field.
fn value_free(inner: &str) -> String {
    if inner.starts_with("missing field") {
        return inner.to_string();
    }
    match inner.split_once(", expected ") {
        Some((_, expected)) => format!("expected {expected}"),
        None => "not a value this field accepts".to_string(),
    }
}

/// The longest field name a refusal shows: a client's unknown member may be of any length, and
/// the refusal (and the log line that records it) names it only this far.
const MAX_FIELD_SHOWN: usize = 100;

/// Decode a body strictly. A mistake names the field: unknown fields by their path, type
/// errors by the path where they occurred, each at most [`MAX_FIELD_SHOWN`] bytes; the
/// offending value is never quoted.
pub fn decode<T: DeserializeOwned>(body: Value) -> Result<T> {
    serde_path_to_error::deserialize(body).map_err(|err| {
        let path = truncate(&err.path().to_string(), MAX_FIELD_SHOWN);
        let inner = err.inner().to_string();
        let at_top = path == "." || path.is_empty();
        let unknown = inner.strip_prefix("unknown field `").and_then(|rest| rest.split_once('`'));
        let missing = inner.strip_prefix("missing field `").and_then(|rest| rest.split_once('`'));
        let (field, message) = match (unknown, missing) {
            (Some((name, _)), _) => {
                // the path already ends at the unknown field
                let field = if at_top { truncate(name, MAX_FIELD_SHOWN) } else { path.clone() };
                (field.clone(), format!("unknown field {field:?}"))
            }
            // the path ends at the object that lacks it
            (None, Some((name, _))) => {
                let field = truncate(&if at_top { name.to_string() } else { format!("{path}.{name}") }, MAX_FIELD_SHOWN);
                (field.clone(), format!("missing field {field:?}"))
            }
            _ if at_top => (String::new(), format!("invalid request body: {}", value_free(&inner))),
            _ => (path.clone(), format!("invalid field {path:?}: {}", value_free(&inner))),
        };
        let refusal = Refusal::invalid_request(message);
        if field.is_empty() { refusal } else { refusal.with_data(json!({ "field": field })) }
    })
}

/// What every body of a method must be before its handler decodes it, read once from the
/// method's input schema: an object where the input is one (serde fills a struct from a JSON
/// array by position, so `[]` or `[null, null]` would pass for a list's paging), and no empty
/// id anywhere the schema puts one (`""` names nothing: looking it up would only answer how a
/// missing thing is missed, `relay-not-connected` for cluster "", say).
#[derive(Debug, Clone, Default)]
struct BodyRules {
    /// The input is a JSON object.
    object: bool,
    /// Where ids sit: members named `id` or `…Id` that hold a string, and each string of a
    /// `…Ids` list, at any depth the schema describes (never inside free-form maps).
    ids: Vec<Vec<Step>>,
}

/// One step of a path into a body.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Member(String),
    Each,
}

/// How many schema nodes are followed looking for ids, and how deep: a plugin's schema is not
/// ours to trust with the host's time (recursive, or branching without end).
const ID_SEARCH_BUDGET: usize = 2_000;
const ID_SEARCH_DEPTH: usize = 8;

impl BodyRules {
    fn of(schema: &Value) -> BodyRules {
        let object = match schema.get("type") {
            Some(kind) => kind == "object",
            None => schema.get("properties").is_some(),
        };
        let (mut ids, mut budget) = (Vec::new(), ID_SEARCH_BUDGET);
        id_paths(schema, schema, &mut Vec::new(), &mut budget, &mut ids);
        ids.sort();
        ids.dedup();
        BodyRules { object, ids }
    }

    /// `invalid-request` for a body that is not the object the input is, or names an id `""`
    /// (naming the member).
    fn check(&self, body: &Value) -> Result<()> {
        if self.object && !body.is_object() {
            return Err(Refusal::invalid_request("the body must be a JSON object: this method takes its input by member name"));
        }
        for path in &self.ids {
            if let Some(field) = empty_at(body, path, String::new()) {
                return Err(Refusal::invalid_field(&field, format!("{field} is empty: an id names something")));
            }
        }
        Ok(())
    }
}

/// `schema`, or what its local `$ref` points at (within `root`).
fn resolved<'s>(mut schema: &'s Value, root: &'s Value) -> &'s Value {
    for _ in 0..8 {
        match schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')).and_then(|p| root.pointer(p)) {
            Some(target) => schema = target,
            None => break,
        }
    }
    schema
}

/// Whether `schema` lets a value be a string.
fn admits_string(schema: &Value, root: &Value) -> bool {
    let schema = resolved(schema, root);
    let typed = match schema.get("type") {
        Some(Value::String(kind)) => kind == "string",
        Some(Value::Array(kinds)) => kinds.iter().any(|k| k == "string"),
        _ => false,
    };
    typed
        || ["anyOf", "oneOf"].iter().any(|key| {
            schema
                .get(*key)
                .and_then(Value::as_array)
                .is_some_and(|branches| branches.iter().any(|b| resolved(b, root).get("type") == Some(&json!("string"))))
        })
}

/// Collect into `out` the paths of the ids `schema` describes (see [`BodyRules::ids`]).
fn id_paths(schema: &Value, root: &Value, path: &mut Vec<Step>, budget: &mut usize, out: &mut Vec<Vec<Step>>) {
    if *budget == 0 || path.len() > ID_SEARCH_DEPTH {
        return;
    }
    *budget -= 1;
    let schema = resolved(schema, root);
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, member) in properties {
            path.push(Step::Member(name.clone()));
            let items = resolved(member, root).get("items");
            if (name == "id" || name.ends_with("Id")) && admits_string(member, root) {
                out.push(path.clone());
            } else if name.ends_with("Ids") && items.is_some_and(|items| admits_string(items, root)) {
                path.push(Step::Each);
                out.push(path.clone());
                path.pop();
            } else {
                id_paths(member, root, path, budget, out);
            }
            path.pop();
        }
    }
    if let Some(items) = schema.get("items").filter(|items| items.is_object()) {
        path.push(Step::Each);
        id_paths(items, root, path, budget, out);
        path.pop();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for branch in schema.get(key).and_then(Value::as_array).into_iter().flatten() {
            id_paths(branch, root, path, budget, out);
        }
    }
}

/// The field (`clusterId`, `owner.serviceId`, `clusterIds[2]`) where `value` holds `""` along
/// `path`, if it does.
fn empty_at(value: &Value, path: &[Step], shown: String) -> Option<String> {
    match path.split_first() {
        None => (value.as_str() == Some("")).then_some(shown),
        Some((Step::Member(name), rest)) => {
            let shown = if shown.is_empty() { name.clone() } else { format!("{shown}.{name}") };
            empty_at(value.get(name.as_str())?, rest, shown)
        }
        Some((Step::Each, rest)) => {
            value.as_array()?.iter().enumerate().find_map(|(i, item)| empty_at(item, rest, format!("{shown}[{i}]")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Input {
        name: String,
        nested: Option<Nested>,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Nested {
        count: u32,
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = decode::<Input>(json!({"name": "x", "extra": 1})).unwrap_err();
        assert_eq!(err.code, "invalid-request");
        assert_eq!(err.data.unwrap()["field"], "extra");
        let err = decode::<Input>(json!({"name": "x", "nested": {"count": 1, "deep": 2}})).unwrap_err();
        assert_eq!(err.data.unwrap()["field"], "nested.deep");
    }

    #[test]
    fn missing_fields_are_named() {
        let err = decode::<Input>(json!({})).unwrap_err();
        assert_eq!((err.code.as_ref(), err.data.unwrap()["field"].clone()), ("invalid-request", json!("name")));
        let err = decode::<Input>(json!({"name": "x", "nested": {}})).unwrap_err();
        assert_eq!(err.data.unwrap()["field"], "nested.count");
        assert_eq!(err.message, "missing field \"nested.count\"");
    }

    #[test]
    fn a_field_is_named_at_most_so_far_whatever_its_length() {
        let long = "k".repeat(100_000);
        for body in [json!({ "name": "x", long.clone(): 1 }), json!({ "name": "x", "nested": { "count": 1, long.clone(): 1 } })] {
            let err = decode::<Input>(body).unwrap_err();
            let field = err.data.unwrap()["field"].as_str().unwrap().to_string();
            assert!(field.len() <= MAX_FIELD_SHOWN + '…'.len_utf8() && field.ends_with('…'), "{field}");
            assert!(err.message.len() < 2 * MAX_FIELD_SHOWN, "{}", err.message);
        }
        let err = decode::<Input>(json!({ "name": "x", "extra": 1 })).unwrap_err();
        assert_eq!(err.data.unwrap()["field"], "extra", "a short name is named whole");
    }

    #[test]
    fn type_errors_and_missing_fields_are_refused() {
        let err = decode::<Input>(json!({"name": 5})).unwrap_err();
        assert_eq!(err.data.unwrap()["field"], "name");
        let err = decode::<Input>(json!({"name": "x", "nested": {"count": -1}})).unwrap_err();
        assert_eq!(err.data.unwrap()["field"], "nested.count");
        let err = decode::<Input>(json!({})).unwrap_err();
        assert_eq!(err.code, "invalid-request");
        assert!(err.message.contains("name"), "{}", err.message);
        assert_eq!(decode::<Input>(json!([])).unwrap_err().code, "invalid-request");
    }

    #[test]
    fn refusals_never_quote_the_value() {
        let err = decode::<Input>(json!({"name": {"secret": "hunter2"}})).unwrap_err();
        assert!(!err.message.contains("hunter2"), "{}", err.message);
        let err = decode::<Input>(json!({"name": "x", "nested": {"count": "hunter2-planted"}})).unwrap_err();
        assert!(!err.message.contains("hunter2") && err.message.contains("expected"), "{}", err.message);
        assert_eq!(decode::<Input>(json!({})).unwrap_err().message, "missing field \"name\"");
    }

    #[test]
    fn method_names_are_area_dot_verb() {
        for ok in ["auth.login", "services.create", "appstore.getCatalogStatus"] {
            assert!(valid_method_name(ok), "{ok}");
        }
        for bad in ["login", "Auth.login", "a.b.c", "a.", ".b", "a.get-x"] {
            assert!(!valid_method_name(bad), "{bad}");
        }
    }

    /// A person who is an administrator or not (the door's tests call as them too).
    pub(crate) fn person(admin: bool) -> Identity {
        Identity {
            user_id: "usr_1".into(),
            username: "ann".into(),
            kind: "human".into(),
            admin,
            session_id: "s".into(),
            authenticated_at: 0,
            expires_at: 0,
        }
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Named {
        name: String,
    }

    #[test]
    fn a_scoped_handler_gets_its_areas_context_and_admin_methods_refuse_anyone_else() {
        let mut registry = Registry::default();
        let mut scope = registry.with(String::from("the area's context"));
        scope.add("area.echo", "echo", Access::Authenticated, |context: String, call: Call, input: Named| async move {
            Ok(json!({ "context": context, "name": input.name, "by": call.identity()?.username }))
        });
        scope.add("area.secret", "admins only", Access::Admin, |_: String, _: Call, _: Named| async move { Ok(json!("ran")) });
        let run = |name: &str, call: Call, body: Value| {
            let method = registry.get(name).expect("registered");
            futures::executor::block_on(method.call(call, body))
        };
        let answer = run("area.echo", Call::by(&person(false)), json!({"name": "x"})).unwrap();
        assert_eq!(answer, json!({"context": "the area's context", "name": "x", "by": "ann"}));
        assert_eq!(run("area.echo", Call::by(&person(false)), json!({"name": "x", "extra": 1})).unwrap_err().code, "invalid-request");
        assert_eq!(run("area.echo", Call::default(), json!({"name": "x"})).unwrap_err().code, "unauthenticated");
        assert_eq!(run("area.secret", Call::by(&person(false)), json!({"name": "x"})).unwrap_err().code, "forbidden");
        assert_eq!(run("area.secret", Call::default(), json!({"name": "x"})).unwrap_err().code, "forbidden");
        assert_eq!(run("area.secret", Call::by(&person(true)), json!({"name": "x"})).unwrap(), json!("ran"));
        let listed: Vec<String> = registry.list().iter().map(|m| m.name.clone()).collect();
        assert_eq!(listed, ["area.echo", "area.secret"]);
    }

    /// A source serving `loaded.*` and saying `away.*` is disabled, as the plugin host does.
    struct Loaded(Arc<Method>);

    #[async_trait::async_trait]
    impl MethodSource for Loaded {
        fn get(&self, name: &str) -> Option<Arc<Method>> {
            (name == self.0.name).then(|| self.0.clone())
        }
        fn list(&self) -> Vec<Arc<Method>> {
            vec![self.0.clone()]
        }
        async fn absent(&self, name: &str) -> Option<Refusal> {
            name.starts_with("away.").then(|| Refusal::new("plugin-disabled", "away is disabled"))
        }
    }

    #[test]
    fn a_source_serves_beside_the_host_cannot_shadow_it_and_says_why_it_does_not_serve() {
        let handler = |answer: &'static str| -> RawHandler {
            Arc::new(move |_, _| Box::pin(async move { Answer::text(json!(answer).to_string()).map_err(Refusal::internal) }))
        };
        let plugin = |name: &str, answer: &'static str| {
            Arc::new(Method::served_by("p", name.into(), "s".into(), Access::Authenticated, (json!({}), json!({})), handler(answer)))
        };
        let mut registry = Registry::default();
        registry.add("area.echo", "Echo", Access::Public, |_, _: Value| async move { Ok(json!({ "host": true })) });
        registry.add_source(Arc::new(Loaded(plugin("loaded.run", "plugin"))));
        registry.add_source(Arc::new(Loaded(plugin("area.echo", "shadow"))));
        let call = |name: &str| {
            futures::executor::block_on(async {
                let method = registry.resolve(name).await?;
                method.call(Call::default(), json!({})).await
            })
        };
        assert_eq!(call("loaded.run").unwrap(), json!("plugin"));
        assert_eq!(call("area.echo").unwrap(), json!({ "host": true }), "the host's own method answers");
        assert_eq!(call("away.run").unwrap_err().code, "plugin-disabled");
        assert_eq!(call("nobody.run").unwrap_err().code, "method-unknown");
        let listing = registry.describe();
        let names: Vec<&str> = listing["methods"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["area.echo", "loaded.run"]);
        assert_eq!(listing["methods"][1]["plugin"], "p");
    }

    #[test]
    fn a_method_declares_its_own_refusals_and_the_generic_ones_at_their_documented_status() {
        let mut registry = Registry::default();
        registry
            .add("area.make", "makes", Access::Member, |_, _: Value| async move { Ok(json!({})) })
            .refuses(&["exists", "quota-exceeded"]);
        registry.add("area.ping", "pings", Access::Public, |_, _: Value| async move { Ok(json!({})) });
        registry.add("area.relay", "relays", Access::Admin, |_, _: Value| async move { Ok(json!({})) }).passes_on("the relay's agent");
        let (make, ping, relay) =
            (registry.get("area.make").unwrap(), registry.get("area.ping").unwrap(), registry.get("area.relay").unwrap());
        let refusal = |code: &'static str| Refusal::new(code, "x");
        assert!(make.declares(&refusal("exists")) && make.declares(&refusal("quota-exceeded")));
        assert!(make.declares(&refusal("store-busy").retryable()) && make.declares(&refusal("forbidden")), "generic");
        assert!(!make.declares(&refusal("conflict")), "not declared");
        assert!(!make.declares(&refusal("quota-exceeded").retryable()), "answered 503 where the document shows 400");
        assert!(!ping.declares(&refusal("forbidden")), "a public method declares a forbidden of its own");
        assert!(!ping.declares(&refusal("coordinator-unavailable")), "only a coordinator-only method");
        assert!(relay.declares(&refusal("agent-busy")), "passed on");
        assert_eq!(make.refusal_codes().iter().filter(|c| **c == "exists").count(), 1);
        let plugin =
            Method::served_by("p", "p.run".into(), "s".into(), Access::Authenticated, (json!({}), json!({})), make.handler.clone());
        assert!(plugin.declares(&refusal("anything-at-all")), "a plugin's refusals are its own");
    }

    #[test]
    fn an_answers_text_is_one_json_value_written_out_as_it_came() {
        let text = Answer::text(" {\"b\": 1,  \"a\": [1.50, \"\\u00e9\"]}\n".into()).unwrap();
        assert_eq!(serde_json::to_string(&text).unwrap(), "{\"b\": 1,  \"a\": [1.50, \"\\u00e9\"]}", "unchanged, trimmed");
        assert_eq!(text.clone().into_value().unwrap(), json!({ "a": [1.5, "é"], "b": 1 }));
        #[derive(Serialize)]
        struct Frame<'a> {
            result: &'a Answer,
        }
        let framed = serde_json::to_string(&Frame { result: &text }).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&framed).unwrap()["result"]["b"], 1, "it nests inside a frame");
        for bad in ["", "{", "{} {}", "[1,]", "nul", "{\"a\":1}x", "\"\\x\""] {
            assert!(Answer::text(bad.into()).is_err(), "{bad:?} is not one JSON value");
        }
        let huge = Answer::text("[1e400]".into()).expect("the check reads the number's form, not its size");
        assert_eq!(huge.clone().into_value().unwrap_err().code, "plugin-output-invalid");
        assert_eq!(*huge.tree(), Value::Null);
        let tree = Answer::from(json!({ "a": 1 }));
        assert_eq!(serde_json::to_string(&tree).unwrap(), "{\"a\":1}");
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Page {
        cursor: Option<String>,
        #[serde(default)]
        limit: Option<u32>,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Nothing {}

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Targets {
        cluster_id: String,
        node_id: Option<String>,
        cluster_ids: Option<Vec<String>>,
        owner: Option<Owner>,
        #[serde(default)]
        routes: Vec<Owner>,
        #[serde(default)]
        labels: BTreeMap<String, String>,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Owner {
        service_id: String,
    }

    fn answered(method: &Method, body: Value) -> Result<Value> {
        futures::executor::block_on(method.call(Call::by(&person(true)), body))
    }

    #[test]
    fn a_body_that_is_not_the_object_the_input_is_is_refused_before_decoding() {
        let mut registry = Registry::default();
        registry.add("area.list", "lists", Access::Authenticated, |_, _: Page| async move { Ok(json!({ "items": [] })) });
        registry.add("area.whoami", "who", Access::Authenticated, |_, _: Nothing| async move { Ok(json!({})) });
        registry.add("area.any", "anything", Access::Authenticated, |_, body: Value| async move { Ok(body) });
        let (list, whoami, any) =
            (registry.get("area.list").unwrap(), registry.get("area.whoami").unwrap(), registry.get("area.any").unwrap());
        // serde alone fills a struct from an array by position: these all decoded
        assert!(decode::<Page>(json!([null, null])).is_ok() && decode::<Nothing>(json!([])).is_ok());
        for body in [json!([]), json!([null, null]), json!([null]), json!(null), json!("x"), json!(1)] {
            assert_eq!(answered(&list, body.clone()).unwrap_err().code, "invalid-request", "{body}");
            assert_eq!(answered(&whoami, body.clone()).unwrap_err().code, "invalid-request", "{body}");
        }
        assert_eq!(answered(&list, json!({})).unwrap(), json!({ "items": [] }));
        assert_eq!(answered(&whoami, json!({})).unwrap(), json!({}));
        assert_eq!(answered(&any, json!([1])).unwrap(), json!([1]), "an input that is any value takes an array");
        // a plugin's method, by the schema its plugin declared
        let echo: RawHandler = Arc::new(|_, body| Box::pin(async move { Ok(Answer::Tree(body)) }));
        let schemas = (json!({ "type": "object", "properties": { "backupId": { "type": "string" } } }), json!({}));
        let plugin = Method::served_by("p", "p.get".into(), "s".into(), Access::Authenticated, schemas, echo.clone());
        assert_eq!(answered(&plugin, json!([])).unwrap_err().code, "invalid-request");
        assert_eq!(answered(&plugin, json!({ "backupId": "b" })).unwrap(), json!({ "backupId": "b" }));
        let untyped = Method::served_by("p", "p.any".into(), "s".into(), Access::Authenticated, (json!({}), json!({})), echo);
        assert_eq!(answered(&untyped, json!([])).unwrap(), json!([]));
    }

    #[test]
    fn an_empty_id_is_refused_by_name_wherever_the_schema_puts_one() {
        let mut registry = Registry::default();
        registry.add("area.target", "targets", Access::Authenticated, |_, _: Targets| async move { Ok(json!("looked up")) });
        let method = registry.get("area.target").unwrap();
        let field = |body: Value| {
            let refusal = answered(&method, body.clone()).expect_err(&body.to_string());
            assert_eq!(refusal.code, "invalid-request", "{body}");
            refusal.data.unwrap()["field"].as_str().unwrap().to_string()
        };
        assert_eq!(field(json!({ "clusterId": "" })), "clusterId");
        assert_eq!(field(json!({ "clusterId": "c", "nodeId": "" })), "nodeId");
        assert_eq!(field(json!({ "clusterId": "c", "clusterIds": ["a", ""] })), "clusterIds[1]");
        assert_eq!(field(json!({ "clusterId": "c", "owner": { "serviceId": "" } })), "owner.serviceId");
        assert_eq!(field(json!({ "clusterId": "c", "routes": [{ "serviceId": "s" }, { "serviceId": "" }] })), "routes[1].serviceId");
        let fine = json!({ "clusterId": "c", "nodeId": null, "clusterIds": [], "labels": { "teamId": "" } });
        assert_eq!(answered(&method, fine).unwrap(), json!("looked up"), "a free-form map is the caller's");
        let schemas = (json!({ "type": "object", "properties": { "backupId": { "type": "string" } } }), json!({}));
        let echo: RawHandler = Arc::new(|_, body| Box::pin(async move { Ok(Answer::Tree(body)) }));
        let plugin = Method::served_by("p", "p.get".into(), "s".into(), Access::Authenticated, schemas, echo);
        assert_eq!(answered(&plugin, json!({ "backupId": "" })).unwrap_err().data.unwrap()["field"], "backupId");
    }

    #[test]
    fn a_schema_without_end_is_searched_for_ids_only_so_far() {
        let endless = json!({ "type": "object", "properties": { "next": { "$ref": "#" }, "id": { "type": "string" } } });
        let rules = BodyRules::of(&endless);
        assert!(rules.object && rules.ids.len() <= ID_SEARCH_DEPTH + 1, "{:?}", rules.ids);
        assert_eq!(rules.check(&json!({ "next": { "id": "" } })).unwrap_err().data.unwrap()["field"], "next.id");
    }

    #[test]
    fn access_names_round_trip_and_unknown_roles_are_refused() {
        for access in [Access::Public, Access::Authenticated, Access::Member, Access::Owner, Access::Admin] {
            assert_eq!(access.as_str().parse::<Access>().unwrap(), access);
            assert_eq!(serde_json::to_value(access).unwrap(), json!(access.as_str()));
        }
        assert_eq!("root".parse::<Access>().unwrap_err().code, "plugin-descriptor-invalid");
    }
}
