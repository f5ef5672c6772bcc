//! What a manager declares about itself — methods with their schemas and handlers, collections,
//! subscriptions, schedules, reconcile period, placement, settings, dashboard pages — and the
//! typed method router.

use crate::bindings::exports::capstan::plugin::guest as wit;
use crate::inventory::EntityKind;
use crate::{Context, Refusal, Result};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::fmt;
use std::time::Duration;

/// Who may call a method; the host enforces it before the plugin runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Anyone, without signing in.
    Public,
    /// Any signed-in user or machine.
    Authenticated,
    /// A member of the organization the request names in its `organizationId` field (or an
    /// administrator); the host checks the membership before the plugin runs.
    Member,
    /// An owner of the organization the request names in `organizationId` (or an administrator).
    Owner,
    /// An administrator.
    Admin,
}

impl Role {
    /// The role's name as `describe` declares it: `public`, `authenticated`, `member`, `owner`
    /// or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Public => "public",
            Role::Authenticated => "authenticated",
            Role::Member => "member",
            Role::Owner => "owner",
            Role::Admin => "admin",
        }
    }
}

/// The body of a method that takes no fields: `{}` (anything else is refused).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

type Handler = Box<dyn Fn(&Context, &str) -> Result<String>>;

struct Method {
    name: String,
    summary: String,
    role: Role,
    /// Declared a read ([`Descriptor::read_only`]).
    read_only: bool,
    input_schema: fn() -> Value,
    output_schema: fn() -> Value,
    handler: Handler,
}

/// A collection of the plugin's store, with its indexes.
///
/// Names are `[a-z][a-z0-9]{0,19}`. A `&str` converts into a collection without indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionSpec {
    name: String,
    indexes: Vec<(String, Vec<String>, bool)>,
}

impl CollectionSpec {
    /// A collection called `name`, without indexes. Panics when `name` is not
    /// `[a-z][a-z0-9]{0,19}`.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        assert!(valid_collection_name(&name), "collection name {name:?} must match [a-z][a-z0-9]{{0,19}}");
        CollectionSpec { name, indexes: Vec::new() }
    }

    /// An index over `fields` (dotted paths into the document data), queried with
    /// [`crate::store::find`].
    pub fn index(mut self, name: impl Into<String>, fields: &[&str]) -> Self {
        self.indexes.push((name.into(), fields.iter().map(|f| f.to_string()).collect(), false));
        self
    }

    /// A unique index: an insert or replace that would duplicate a key is refused `exists`.
    pub fn unique_index(mut self, name: impl Into<String>, fields: &[&str]) -> Self {
        self.indexes.push((name.into(), fields.iter().map(|f| f.to_string()).collect(), true));
        self
    }

    /// The collection's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl From<&str> for CollectionSpec {
    fn from(name: &str) -> Self {
        CollectionSpec::new(name)
    }
}

/// Everything `describe` answers, plus the handlers of the methods.
///
/// ```
/// use capstan_sdk::{CollectionSpec, Context, Descriptor, JsonSchema, Page, Result, Role};
/// use serde::{Deserialize, Serialize};
/// use std::time::Duration;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Greet { name: String }
///
/// #[derive(Serialize, JsonSchema)]
/// struct Greeting { greeting: String }
///
/// fn greet(_ctx: &Context, input: Greet) -> Result<Greeting> {
///     Ok(Greeting { greeting: format!("Hello, {}!", input.name) })
/// }
///
/// let descriptor = Descriptor::new()
///     .method("greet", "Say hello.", Role::Authenticated, greet)
///     .collection(CollectionSpec::new("notes").index("byOwner", &["owner"]))
///     .subscribe("service.deleting")
///     .schedule("tidy", "0 * * * *", "Drop stale notes.")
///     .reconcile_every(Duration::from_secs(60))
///     .placement(1, [("zone", "a")])
///     .setting("keepDays", "Days notes are kept", Some(30u32))
///     .page(Page::new("", "Greeting", "greet").form("greet"));
/// assert_eq!(descriptor.method_names().collect::<Vec<_>>(), ["greet"]);
/// ```
pub struct Descriptor {
    methods: Vec<Method>,
    collections: Vec<CollectionSpec>,
    subscriptions: Vec<String>,
    schedules: Vec<(String, String, String)>,
    reconcile_period: Option<Duration>,
    replicas: u32,
    selector: Vec<(String, String)>,
    settings: Vec<Setting>,
    pages: Vec<Page>,
    facets: Vec<Facet>,
    panels: Vec<(EntityKind, String, String)>,
    nav: Option<(String, String)>,
    refusals: Vec<(String, u16, String)>,
}

/// A declared facet; its schema is generated only when the descriptor is described.
struct Facet {
    kind: EntityKind,
    summary: String,
    schema: fn() -> Value,
}

/// A declared setting; its schema is generated only when the descriptor is described, never
/// on a method call (every call builds the descriptor to find its handler).
struct Setting {
    key: String,
    summary: String,
    schema: fn() -> Value,
    default: Option<String>,
}

/// A dashboard page at `/p/<pluginId>/<path>`, showing what the method `source` answers.
///
/// Without a template the host generates it from the method's output schema (a table for a
/// list, a definition list for an object) with a form per [`Page::form`]; with one, the
/// bundle's `pages/<name>.html` (MiniJinja, no scripts) renders `output`, `query`, `forms` and
/// `page`. The method's body is built from the page's query parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    path: String,
    title: String,
    source: String,
    template: Option<String>,
    forms: Vec<String>,
    navigation: bool,
}

impl Page {
    /// A page at `path` (lowercase words joined by `-` and `/`; `""` for the plugin's first
    /// page) titled `title`, fed by the method `source`; listed in the navigation.
    pub fn new(path: &str, title: &str, source: &str) -> Self {
        Page { path: path.into(), title: title.into(), source: source.into(), template: None, forms: Vec::new(), navigation: true }
    }

    /// Render with the bundle's template `pages/<name>.html` instead of a generated page.
    pub fn template(mut self, name: &str) -> Self {
        self.template = Some(format!("pages/{name}.html"));
        self
    }

    /// Offer the method `method` as a form on the page.
    pub fn form(mut self, method: &str) -> Self {
        self.forms.push(method.into());
        self
    }

    /// Keep the page out of the navigation (a detail page reached by links).
    pub fn hidden(mut self) -> Self {
        self.navigation = false;
        self
    }
}

impl Default for Descriptor {
    fn default() -> Self {
        Descriptor {
            methods: Vec::new(),
            collections: Vec::new(),
            subscriptions: Vec::new(),
            schedules: Vec::new(),
            reconcile_period: None,
            replicas: 1,
            selector: Vec::new(),
            settings: Vec::new(),
            pages: Vec::new(),
            facets: Vec::new(),
            panels: Vec::new(),
            nav: None,
            refusals: Vec::new(),
        }
    }
}

impl Descriptor {
    /// No methods, collections, subscriptions or schedules; no reconcile loop; one replica.
    pub fn new() -> Self {
        Self::default()
    }

    /// A method served at `POST /api/v1/<pluginId>.<name>` (`name` is camelCase). The JSON
    /// Schemas of `In` and `Out` are generated for `describe`; the host validates bodies against
    /// the input schema, and the router decodes them into `In` strictly before `handler` runs.
    pub fn method<In, Out>(mut self, name: &str, summary: &str, role: Role, handler: impl Fn(&Context, In) -> Result<Out> + 'static) -> Self
    where
        In: DeserializeOwned + JsonSchema,
        Out: Serialize + JsonSchema,
    {
        assert!(valid_method_name(name), "method name {name:?} must be camelCase ([a-z][A-Za-z0-9]*, at most 64)");
        assert!(self.methods.iter().all(|m| m.name != name), "method {name:?} declared twice");
        let handler: Handler = Box::new(move |ctx, body| {
            let input: In = crate::decode(body)?;
            let output = handler(ctx, input)?;
            serde_json::to_string(&output).map_err(|e| Refusal::internal(format!("encoding the answer failed: {e}")))
        });
        self.methods.push(Method {
            name: name.into(),
            summary: summary.into(),
            role,
            read_only: false,
            input_schema: schema_of::<In>,
            output_schema: schema_of::<Out>,
            handler,
        });
        self
    }

    /// Declare the method just added a read: it changes nothing, so the host leaves its calls
    /// out of the audit log, and refuses (`read-only-method`) every import that would change
    /// something while it runs — a store commit, a secret or service written, an event
    /// published, a blob written, an agent called, an HTTP request other than GET or HEAD.
    /// Declared to the host as `"x-capstan-read-only": true` in the method's input schema.
    pub fn read_only(mut self) -> Self {
        let method = self.methods.last_mut().expect("read_only() follows the method(…) it declares");
        method.read_only = true;
        self
    }

    /// A collection of the plugin's store. Only declared collections can be used.
    pub fn collection(mut self, spec: impl Into<CollectionSpec>) -> Self {
        let spec = spec.into();
        assert!(self.collections.iter().all(|c| c.name != spec.name), "collection {:?} declared twice", spec.name);
        self.collections.push(spec);
        self
    }

    /// Deliver events of `kind` to `on_event`; a trailing `*` matches a prefix
    /// (`service.*`, `appstore.*`).
    pub fn subscribe(mut self, kind: impl Into<String>) -> Self {
        self.subscriptions.push(kind.into());
        self
    }

    /// A scheduled task: the host calls `run_task(name)` on the 5-field UTC `cron` schedule.
    pub fn schedule(mut self, name: impl Into<String>, cron: impl Into<String>, summary: impl Into<String>) -> Self {
        let (name, cron) = (name.into(), cron.into());
        assert!(cron.split_whitespace().count() == 5, "schedule {name:?}: cron {cron:?} must have 5 fields");
        self.schedules.push((name, cron, summary.into()));
        self
    }

    /// Run a reconcile pass every `period` (and sooner when hinted or requeued).
    pub fn reconcile_every(mut self, period: Duration) -> Self {
        self.reconcile_period = Some(period);
        self
    }

    /// How many live nodes run reconcile and tasks (1 for a single writer), and the labels such
    /// a node must carry.
    pub fn placement<K: Into<String>, V: Into<String>>(mut self, replicas: u32, selector: impl IntoIterator<Item = (K, V)>) -> Self {
        self.replicas = replicas;
        self.selector = selector.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        self
    }

    /// A setting operators change with `settings.update` as `<pluginId>.<key>` (`key` is
    /// camelCase), read with [`crate::settings::get`]. Its values must match the JSON Schema of
    /// `T`; `default` is its value while none is set. Never a credential: use
    /// [`crate::secrets`].
    pub fn setting<T: Serialize + JsonSchema>(mut self, key: &str, summary: &str, default: Option<T>) -> Self {
        assert!(valid_method_name(key), "setting key {key:?} must be camelCase ([a-z][A-Za-z0-9]*, at most 64)");
        assert!(self.settings.iter().all(|s| s.key != key), "setting {key:?} declared twice");
        let default = default.map(|d| serde_json::to_string(&d).expect("a setting's default encodes as JSON"));
        self.settings.push(Setting { key: key.into(), summary: summary.into(), schema: schema_of::<T>, default });
        self
    }

    /// A dashboard page (see [`Page`]); its `source` and forms must be methods declared here.
    pub fn page(mut self, page: Page) -> Self {
        assert!(self.pages.iter().all(|p| p.path != page.path), "page {:?} declared twice", page.path);
        self.pages.push(page);
        self
    }

    /// The record this plugin keeps on every entity of `kind` (`Organization`, `Cluster` or
    /// `Service`): the entity's `facets.<pluginId>`, written with
    /// [`crate::inventory::set_facet`] and judged by the JSON Schema of `T`. Anyone reading
    /// the entity reads it; only this plugin writes it. Never a secret.
    pub fn facet<T: JsonSchema>(mut self, kind: EntityKind, summary: &str) -> Self {
        assert!(self.facets.iter().all(|f| f.kind != kind), "a facet on {kind:?} declared twice");
        self.facets.push(Facet { kind, summary: summary.into(), schema: schema_of::<T> });
        self
    }

    /// A panel titled `title` on the dashboard page of every entity of `kind`, rendered from
    /// the bundle's template `pages/<name>.html` with `entity` (as `get` answers it) and
    /// `facet` (this plugin's facet of it, or none).
    pub fn panel(mut self, kind: EntityKind, title: &str, template: &str) -> Self {
        self.panels.push((kind, title.into(), format!("pages/{template}.html")));
        self
    }

    /// The plugin's own section in the dashboard navigation, opening its first page; `icon`
    /// is one of the dashboard's line icons: `envelope`, `database`, `globe`, `box`,
    /// `shield`, `chart`, `key`, `bell`.
    pub fn nav(mut self, title: &str, icon: &str) -> Self {
        self.nav = Some((title.into(), icon.into()));
        self
    }

    /// A refusal code this plugin's methods answer, with the HTTP status the API gives it (a
    /// code not declared answers 400, or 503 when retryable).
    pub fn refusal(mut self, code: &str, status: u16, summary: &str) -> Self {
        assert!(self.refusals.iter().all(|r| r.0 != code), "refusal {code:?} declared twice");
        self.refusals.push((code.into(), status, summary.into()));
        self
    }

    /// The declared method names, in declaration order.
    pub fn method_names(&self) -> impl Iterator<Item = &str> {
        self.methods.iter().map(|m| m.name.as_str())
    }

    /// Route one call: decode `body` into the method's input type, run its handler, encode the
    /// answer. An unknown method is refused `method-unknown`; a body that does not decode is
    /// refused `invalid-request` naming the field (`data.field`).
    pub fn handle(&self, ctx: &Context, method: &str, body: &str) -> Result<String> {
        let Some(m) = self.methods.iter().find(|m| m.name == method) else {
            return Err(
                Refusal::new("method-unknown", format!("The plugin has no method {method:?}.")).with_data(json!({ "method": method }))
            );
        };
        (m.handler)(ctx, body)
    }

    /// The descriptor as `describe` answers it (this is where the schemas are generated).
    pub fn to_wit(&self) -> wit::Descriptor {
        wit::Descriptor {
            methods: self
                .methods
                .iter()
                .map(|m| wit::MethodSpec {
                    name: m.name.clone(),
                    summary: m.summary.clone(),
                    role: m.role.as_str().into(),
                    input_schema: {
                        let mut schema = (m.input_schema)();
                        if m.read_only {
                            schema[READ_ONLY] = Value::Bool(true);
                        }
                        schema.to_string()
                    },
                    output_schema: (m.output_schema)().to_string(),
                })
                .collect(),
            collections: self
                .collections
                .iter()
                .map(|c| wit::CollectionSpec {
                    name: c.name.clone(),
                    indexes: c
                        .indexes
                        .iter()
                        .map(|(name, fields, unique)| wit::IndexSpec { name: name.clone(), fields: fields.clone(), unique: *unique })
                        .collect(),
                })
                .collect(),
            subscriptions: self.subscriptions.clone(),
            schedules: self
                .schedules
                .iter()
                .map(|(name, cron, summary)| wit::Schedule { name: name.clone(), cron: cron.clone(), summary: summary.clone() })
                .collect(),
            reconcile_period_ms: self.reconcile_period.map(|p| u64::try_from(p.as_millis()).unwrap_or(u64::MAX)),
            placement: wit::Placement { replicas: self.replicas, selector: self.selector.clone() },
            settings: self
                .settings
                .iter()
                .map(|s| wit::SettingSpec {
                    key: s.key.clone(),
                    summary: s.summary.clone(),
                    schema: (s.schema)().to_string(),
                    default: s.default.clone(),
                })
                .collect(),
            pages: self
                .pages
                .iter()
                .map(|p| wit::PageSpec {
                    path: p.path.clone(),
                    title: p.title.clone(),
                    source: p.source.clone(),
                    template: p.template.clone(),
                    forms: p.forms.clone(),
                    navigation: p.navigation,
                })
                .collect(),
            facets: self
                .facets
                .iter()
                .map(|f| wit::FacetSpec { kind: f.kind, summary: f.summary.clone(), schema: (f.schema)().to_string() })
                .collect(),
            panels: self
                .panels
                .iter()
                .map(|(kind, title, template)| wit::PanelSpec { kind: *kind, title: title.clone(), template: template.clone() })
                .collect(),
            nav: self.nav.as_ref().map(|(title, icon)| wit::NavSection { title: title.clone(), icon: icon.clone() }),
            refusals: self
                .refusals
                .iter()
                .map(|(code, status, summary)| wit::RefusalSpec { code: code.clone(), status: *status, summary: summary.clone() })
                .collect(),
        }
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("methods", &self.methods.iter().map(|m| (&m.name, m.role)).collect::<Vec<_>>())
            .field("collections", &self.collections)
            .field("subscriptions", &self.subscriptions)
            .field("schedules", &self.schedules)
            .field("reconcile_period", &self.reconcile_period)
            .field("replicas", &self.replicas)
            .field("selector", &self.selector)
            .field("settings", &self.settings.iter().map(|s| &s.key).collect::<Vec<_>>())
            .field("pages", &self.pages)
            .finish()
    }
}

/// The input-schema annotation that declares a method a read (an annotation: validators
/// ignore it, and a host that does not know it audits the method as before).
pub const READ_ONLY: &str = "x-capstan-read-only";

fn schema_of<T: JsonSchema>() -> Value {
    schemars::schema_for!(T).to_value()
}

/// camelCase: `[a-z][A-Za-z0-9]*`, at most 64 characters.
fn valid_method_name(name: &str) -> bool {
    name.len() <= 64 && name.starts_with(|c: char| c.is_ascii_lowercase()) && name.chars().all(|c| c.is_ascii_alphanumeric())
}

/// `[a-z][a-z0-9]{0,19}`, as the host requires.
fn valid_collection_name(name: &str) -> bool {
    (1..=20).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::test_context;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct PutNote {
        id: String,
        text: String,
        expected_revision: Option<u64>,
        #[serde(default)]
        tags: Vec<Tag>,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Tag {
        label: String,
        weight: u8,
    }

    #[derive(Debug, Serialize, JsonSchema)]
    struct Saved {
        id: String,
        revision: u64,
        tags: usize,
    }

    fn put(_ctx: &Context, input: PutNote) -> Result<Saved> {
        if input.text.is_empty() {
            return Err(Refusal::invalid_request("text must not be empty").with_data(json!({"field": "text"})));
        }
        Ok(Saved { id: input.id, revision: input.expected_revision.unwrap_or(0) + 1, tags: input.tags.len() })
    }

    fn descriptor() -> Descriptor {
        Descriptor::new()
            .method("putNote", "Store a note.", Role::Member, put)
            .method::<Empty, Value>("ping", "Answer pong.", Role::Public, |ctx, Empty {}| Ok(json!({"pong": ctx.request_id()})))
            .collection(CollectionSpec::new("notes").index("byText", &["text"]).unique_index("bySlug", &["meta.slug"]))
            .collection("counters")
            .subscribe("service.*")
            .schedule("tidy", "0 * * * *", "Tidy up.")
            .reconcile_every(Duration::from_secs(60))
            .placement(2, [("zone", "a")])
    }

    #[test]
    fn to_wit_carries_everything_declared() {
        let d = descriptor().to_wit();
        assert_eq!(
            d.methods.iter().map(|m| (m.name.as_str(), m.role.as_str())).collect::<Vec<_>>(),
            [("putNote", "member"), ("ping", "public")]
        );
        assert_eq!(d.collections.len(), 2);
        assert_eq!(d.collections[0].indexes.len(), 2);
        assert!(d.collections[0].indexes[1].unique);
        assert_eq!(d.collections[0].indexes[1].fields, ["meta.slug"]);
        assert!(d.collections[1].indexes.is_empty());
        assert_eq!(d.subscriptions, ["service.*"]);
        assert_eq!(d.schedules[0].cron, "0 * * * *");
        assert_eq!(d.reconcile_period_ms, Some(60_000));
        assert_eq!(d.placement.replicas, 2);
        assert_eq!(d.placement.selector, [("zone".to_string(), "a".to_string())]);
        let bare = Descriptor::new().to_wit();
        assert_eq!((bare.reconcile_period_ms, bare.placement.replicas), (None, 1));
    }

    #[test]
    fn schemas_are_valid_and_describe_the_types() {
        let d = descriptor().to_wit();
        let input: Value = serde_json::from_str(&d.methods[0].input_schema).unwrap();
        let output: Value = serde_json::from_str(&d.methods[0].output_schema).unwrap();
        for schema in [&input, &output] {
            assert!(jsonschema::meta::is_valid(schema), "{schema}");
        }
        let validator = jsonschema::validator_for(&input).unwrap();
        assert!(validator.is_valid(&json!({"id": "n1", "text": "hi"})));
        assert!(validator.is_valid(&json!({"id": "n1", "text": "hi", "expectedRevision": 3, "tags": [{"label": "x", "weight": 2}]})));
        assert!(!validator.is_valid(&json!({"id": "n1"})), "text is required");
        assert!(!validator.is_valid(&json!({"id": "n1", "text": "hi", "extra": 1})), "unknown fields are refused");
        assert!(!validator.is_valid(&json!({"id": "n1", "text": "hi", "tags": [{"label": "x", "weight": 300}]})), "u8 is bounded");
        let validator = jsonschema::validator_for(&output).unwrap();
        assert!(validator.is_valid(&json!({"id": "n1", "revision": 1, "tags": 0})));
        assert!(!validator.is_valid(&json!({"id": "n1", "revision": -1, "tags": 0})));

        let empty: Value = serde_json::from_str(&d.methods[1].input_schema).unwrap();
        let validator = jsonschema::validator_for(&empty).unwrap();
        assert!(validator.is_valid(&json!({})));
        assert!(!validator.is_valid(&json!({"x": 1})));
        let anything: Value = serde_json::from_str(&d.methods[1].output_schema).unwrap();
        assert!(jsonschema::meta::is_valid(&anything));
    }

    #[test]
    fn routes_typed_calls() {
        let d = descriptor();
        let ctx = test_context();
        let out = d.handle(&ctx, "putNote", r#"{"id": "n1", "text": "hi", "expectedRevision": 4}"#).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json!({"id": "n1", "revision": 5, "tags": 0}));
        let out = d.handle(&ctx, "ping", "{}").unwrap();
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), json!({"pong": "req-1"}));
        let err = d.handle(&ctx, "putNote", r#"{"id": "n1", "text": ""}"#).unwrap_err();
        assert_eq!((err.code(), err.data()), ("invalid-request", Some(&json!({"field": "text"}))));
        let err = d.handle(&ctx, "nope", "{}").unwrap_err();
        assert_eq!((err.code(), err.data()), ("method-unknown", Some(&json!({"method": "nope"}))));
    }

    fn field_of(body: &str) -> (String, Option<Value>) {
        let err = descriptor().handle(&test_context(), "putNote", body).unwrap_err();
        assert_eq!(err.code(), "invalid-request", "{err}");
        (err.message().to_string(), err.data().map(|d| d["field"].clone()))
    }

    #[test]
    fn decoding_errors_name_the_field() {
        assert_eq!(field_of(r#"{"id": 5, "text": "x"}"#).1, Some(json!("id")));
        assert_eq!(field_of(r#"{"id": "a", "text": "x", "extra": true}"#).1, Some(json!("extra")));
        assert_eq!(field_of(r#"{"text": "x"}"#).1, Some(json!("id")));
        assert_eq!(field_of(r#"{"id": "a", "text": "x", "tags": [{"label": "l", "weight": 999}]}"#).1, Some(json!("tags[0].weight")));
        assert_eq!(field_of(r#"{"id": "a", "text": "x", "tags": [{"label": "l"}]}"#).1, Some(json!("tags[0].weight")));
        assert_eq!(field_of(r#"{"id": "a", "text": "x", "tags": [{"label": "l", "weight": 1, "x": 0}]}"#).1, Some(json!("tags[0].x")));
        let (message, field) = field_of(r#"{"id": "a", "text": "x", "expectedRevision": "3"}"#);
        assert_eq!(field, Some(json!("expectedRevision")));
        assert!(message.contains("expectedRevision") && !message.contains("line"), "{message}");
        let (message, field) = field_of(r#""just text""#);
        assert_eq!(field, None);
        assert!(message.starts_with("invalid request body"), "{message}");
        assert_eq!(field_of("{not json").1, None);
        assert_eq!(field_of(r#"{"id": "a", "text": "x"} trailing"#).1, None);
    }

    #[test]
    #[should_panic(expected = "camelCase")]
    fn method_names_are_camel_case() {
        let _ = Descriptor::new().method::<Empty, Empty>("put-note", "", Role::Admin, |_, e| Ok(e));
    }

    #[test]
    #[should_panic(expected = "declared twice")]
    fn method_names_are_unique() {
        let _ = Descriptor::new().method::<Empty, Empty>("a", "", Role::Admin, |_, e| Ok(e)).method::<Empty, Empty>(
            "a",
            "",
            Role::Admin,
            |_, e| Ok(e),
        );
    }

    #[test]
    #[should_panic(expected = "collection name")]
    fn collection_names_follow_the_host_rule() {
        let _ = CollectionSpec::new("my_notes");
    }

    #[test]
    #[should_panic(expected = "5 fields")]
    fn cron_has_five_fields() {
        let _ = Descriptor::new().schedule("tidy", "* * *", "");
    }
}
