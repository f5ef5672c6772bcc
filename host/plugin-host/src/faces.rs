//! What a plugin shows operators besides its methods: the settings it declares (set with
//! `settings.update` as `<pluginId>.<key>`, read back through the `settings` import), the
//! dashboard pages it contributes, the facets it keeps on entities (written through
//! `inventory.set-facet`), the panels it adds to entities' pages, its navigation section and
//! the refusal codes its methods answer. All come from `describe`, are checked here, and are
//! recorded with the installed version, so any node answers for them without loading the
//! plugin.

use crate::refusal::{Refusal, Result};
use crate::runtime::wit_guest;
use capstan_core::text::names_a_credential as is_secret_key;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The most settings and pages one plugin declares.
const MAX_DECLARED: usize = 64;
/// The largest schema of a setting.
const MAX_SETTING_SCHEMA_BYTES: usize = 64 << 10;
/// The largest value of a setting (a whole settings document stays small).
pub const MAX_SETTING_VALUE_BYTES: usize = 16 << 10;

/// A setting a plugin declares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SettingDecl {
    /// The key within the plugin (camelCase); operators write `<pluginId>.<key>`.
    pub key: String,
    /// What the setting is for.
    pub summary: String,
    /// The JSON Schema its value must match.
    pub schema: Value,
    /// Its value while none is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

impl SettingDecl {
    /// Whether its values name URLs (a string, possibly null, or a list of strings): only such
    /// a setting of the plugin's own may be named in an `http-setting:<pluginId>.<key>` grant.
    pub fn lists_urls(&self) -> bool {
        let string = |schema: &Value| schema.get("type").and_then(Value::as_str) == Some("string");
        let nullable_string = |schema: &Value| {
            let types: Option<Vec<&str>> =
                schema.get("type").and_then(Value::as_array).map(|t| t.iter().filter_map(Value::as_str).collect());
            types.is_some_and(|t| t.contains(&"string") && t.iter().all(|t| matches!(*t, "string" | "null")))
        };
        string(&self.schema)
            || nullable_string(&self.schema)
            || (self.schema.get("type").and_then(Value::as_str) == Some("array") && self.schema.get("items").is_some_and(string))
    }
}

/// A dashboard page a plugin contributes, at `/p/<pluginId>/<path>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PageDecl {
    /// Lowercase words joined by `-` and `/`; empty for the plugin's first page.
    pub path: String,
    /// Its heading and its name in the navigation.
    pub title: String,
    /// The plugin's method whose output the page shows.
    pub source: String,
    /// The bundle's template that renders it (`pages/<name>.html`); none: generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The plugin's methods offered as forms on the page.
    #[serde(default)]
    pub forms: Vec<String>,
    /// Whether the navigation lists it.
    pub navigation: bool,
}

/// The entity kinds a plugin may keep a facet on or add a panel to.
pub const FACET_KINDS: &[&str] = &["organization", "cluster", "service"];
/// The largest schema of a facet.
const MAX_FACET_SCHEMA_BYTES: usize = 64 << 10;
/// The largest facet value (it rides in the entity's document).
pub const MAX_FACET_VALUE_BYTES: usize = 64 << 10;
/// The dashboard's line icons a navigation section may name.
pub const NAV_ICONS: &[&str] = &["envelope", "database", "globe", "box", "shield", "chart", "key", "bell"];

/// A record a plugin keeps on every entity of a kind (`facets.<pluginId>` of the entity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FacetDecl {
    /// `organization`, `cluster` or `service`.
    pub kind: String,
    /// What the record says.
    pub summary: String,
    /// The JSON Schema its value must match.
    pub schema: Value,
}

/// A panel a plugin adds to the dashboard page of an entity of `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PanelDecl {
    /// `organization`, `cluster` or `service`.
    pub kind: String,
    /// Its heading.
    pub title: String,
    /// The bundle's template that renders it (`pages/<name>.html`).
    pub template: String,
}

/// A plugin's own section in the dashboard navigation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NavDecl {
    /// The section's name.
    pub title: String,
    /// One of [`NAV_ICONS`].
    pub icon: String,
}

/// A refusal code a plugin's methods answer, with its HTTP status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefusalDecl {
    /// Kebab-case.
    pub code: String,
    /// 400–599.
    pub status: u16,
    /// When it is answered.
    pub summary: String,
}

/// What a plugin declares of its own on the platform (contract 0.3.0 on), checked: its facets,
/// panels, navigation section and refusal codes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Faces {
    /// The records it keeps on entities.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub facets: Vec<FacetDecl>,
    /// The panels it adds to entities' pages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub panels: Vec<PanelDecl>,
    /// Its navigation section, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nav: Option<NavDecl>,
    /// The refusal codes its methods answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<RefusalDecl>,
}

impl Faces {
    /// The facet it declares on `kind`, if any.
    pub fn facet(&self, kind: &str) -> Option<&FacetDecl> {
        self.facets.iter().find(|f| f.kind == kind)
    }

    /// The HTTP status it declares for `code`, if any.
    pub fn refusal_status(&self, code: &str) -> Option<u16> {
        self.refusals.iter().find(|r| r.code == code).map(|r| r.status)
    }
}

fn entity_kind(kind: wit_guest::EntityKind) -> Option<&'static str> {
    use wit_guest::EntityKind as K;
    match kind {
        K::Organization => Some("organization"),
        K::Cluster => Some("cluster"),
        K::Service => Some("service"),
        K::Node | K::FleetNode => None,
    }
}

/// The first member name inside `value` (at any depth) that names a credential, as a dotted path.
pub fn secret_member(value: &Value) -> Option<String> {
    match value {
        Value::Object(map) => map
            .iter()
            .find_map(|(k, v)| if is_secret_key(k) { Some(k.clone()) } else { secret_member(v).map(|inner| format!("{k}.{inner}")) }),
        Value::Array(items) => items.iter().find_map(secret_member),
        _ => None,
    }
}

fn valid_key(key: &str) -> bool {
    key.len() <= 64 && key.starts_with(|c: char| c.is_ascii_lowercase()) && key.chars().all(|c| c.is_ascii_alphanumeric())
}

fn valid_page_path(path: &str) -> bool {
    path.is_empty()
        || (path.len() <= 128
            && path.split('/').all(|segment| {
                !segment.is_empty()
                    && segment.split('-').all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
            }))
}

/// What of a descriptor [`from_wit`] checks: everything but its methods and background work.
pub struct Declared {
    /// `settings`.
    pub settings: Vec<wit_guest::SettingSpec>,
    /// `pages`.
    pub pages: Vec<wit_guest::PageSpec>,
    /// `facets`.
    pub facets: Vec<wit_guest::FacetSpec>,
    /// `panels`.
    pub panels: Vec<wit_guest::PanelSpec>,
    /// `nav`.
    pub nav: Option<wit_guest::NavSection>,
    /// `refusals`.
    pub refusals: Vec<wit_guest::RefusalSpec>,
}

impl Declared {
    /// The parts of `d` [`from_wit`] checks.
    pub fn of(d: &mut wit_guest::Descriptor) -> Declared {
        Declared {
            settings: std::mem::take(&mut d.settings),
            pages: std::mem::take(&mut d.pages),
            facets: std::mem::take(&mut d.facets),
            panels: std::mem::take(&mut d.panels),
            nav: d.nav.take(),
            refusals: std::mem::take(&mut d.refusals),
        }
    }
}

/// Check the faces of a descriptor (`plugin-descriptor-invalid` naming what is wrong):
/// its settings, its pages and the rest; `methods` are the verbs it declares.
pub fn from_wit(plugin: &str, declared: Declared, methods: &[&str]) -> Result<(Vec<SettingDecl>, Vec<PageDecl>, Faces)> {
    let Declared { settings, pages, facets, panels, nav, refusals } = declared;
    let invalid = |m: String| Refusal::new("plugin-descriptor-invalid", format!("plugin {plugin}: {m}"));
    if [settings.len(), pages.len(), facets.len(), panels.len(), refusals.len()].iter().any(|n| *n > MAX_DECLARED) {
        return Err(invalid(format!("at most {MAX_DECLARED} settings, pages, facets, panels and refusals each")));
    }
    let mut decls: Vec<SettingDecl> = Vec::new();
    for s in settings {
        let what = format!("setting {:?}", s.key);
        if !valid_key(&s.key) {
            return Err(invalid(format!("{what}: a key is camelCase letters and digits, at most 64")));
        }
        if is_secret_key(&s.key) {
            return Err(invalid(format!("{what} names a credential; credentials are secrets, never settings")));
        }
        if decls.iter().any(|d| d.key == s.key) {
            return Err(invalid(format!("{what} is declared twice")));
        }
        if s.schema.len() > MAX_SETTING_SCHEMA_BYTES {
            return Err(invalid(format!("{what}: the schema is larger than {MAX_SETTING_SCHEMA_BYTES} bytes")));
        }
        let schema: Value = serde_json::from_str(&s.schema).map_err(|e| invalid(format!("{what}: schema: {e}")))?;
        let validator = validator(&schema).map_err(|e| invalid(format!("{what}: schema: {e}")))?;
        let default = match s.default {
            None => None,
            Some(text) => {
                let value: Value = serde_json::from_str(&text).map_err(|e| invalid(format!("{what}: default: {e}")))?;
                if let Some(e) = validator.iter_errors(&value).next() {
                    return Err(invalid(format!("{what}: the default does not match the schema: {e}")));
                }
                Some(value)
            }
        };
        decls.push(SettingDecl { key: s.key, summary: s.summary, schema, default });
    }
    let mut page_decls: Vec<PageDecl> = Vec::new();
    for p in pages {
        let what = format!("page {:?}", p.path);
        if !valid_page_path(&p.path) {
            return Err(invalid(format!("{what}: a path is lowercase words joined by '-' and '/'")));
        }
        if page_decls.iter().any(|d| d.path == p.path) {
            return Err(invalid(format!("{what} is declared twice")));
        }
        if p.title.trim().is_empty() || p.title.chars().count() > 80 {
            return Err(invalid(format!("{what}: a title is 1 to 80 characters")));
        }
        for method in std::iter::once(&p.source).chain(&p.forms) {
            if !methods.contains(&method.as_str()) {
                return Err(invalid(format!("{what} names method {method:?}, which the plugin does not declare")));
            }
        }
        if let Some(template) = &p.template
            && !valid_template_name(template)
        {
            return Err(invalid(format!("{what}: template {template:?} must be pages/<name>.html")));
        }
        page_decls.push(PageDecl {
            path: p.path,
            title: p.title,
            source: p.source,
            template: p.template,
            forms: p.forms,
            navigation: p.navigation,
        });
    }
    let mut facet_decls: Vec<FacetDecl> = Vec::new();
    for f in facets {
        let Some(kind) = entity_kind(f.kind) else {
            return Err(invalid(format!("a facet is kept on an organization, a cluster or a service ({})", FACET_KINDS.join(", "))));
        };
        let what = format!("the facet on {kind}");
        if facet_decls.iter().any(|d| d.kind == kind) {
            return Err(invalid(format!("{what} is declared twice")));
        }
        if f.schema.len() > MAX_FACET_SCHEMA_BYTES {
            return Err(invalid(format!("{what}: the schema is larger than {MAX_FACET_SCHEMA_BYTES} bytes")));
        }
        let schema: Value = serde_json::from_str(&f.schema).map_err(|e| invalid(format!("{what}: schema: {e}")))?;
        validator(&schema).map_err(|e| invalid(format!("{what}: schema: {e}")))?;
        facet_decls.push(FacetDecl { kind: kind.into(), summary: f.summary, schema });
    }
    let mut panel_decls: Vec<PanelDecl> = Vec::new();
    for p in panels {
        let Some(kind) = entity_kind(p.kind) else {
            return Err(invalid(format!("a panel is shown on an organization, a cluster or a service ({})", FACET_KINDS.join(", "))));
        };
        let what = format!("the panel {:?}", p.title);
        if p.title.trim().is_empty() || p.title.chars().count() > 80 {
            return Err(invalid(format!("{what}: a title is 1 to 80 characters")));
        }
        if !valid_template_name(&p.template) {
            return Err(invalid(format!("{what}: template {:?} must be pages/<name>.html", p.template)));
        }
        panel_decls.push(PanelDecl { kind: kind.into(), title: p.title, template: p.template });
    }
    let nav = match nav {
        None => None,
        Some(n) => {
            if n.title.trim().is_empty() || n.title.chars().count() > 40 {
                return Err(invalid("the navigation section's title is 1 to 40 characters".into()));
            }
            let icon = if NAV_ICONS.contains(&n.icon.as_str()) { n.icon } else { "box".into() };
            Some(NavDecl { title: n.title, icon })
        }
    };
    let mut refusal_decls: Vec<RefusalDecl> = Vec::new();
    for r in refusals {
        let kebab = !r.code.is_empty()
            && r.code.len() <= 64
            && r.code.split('-').all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        if !kebab {
            return Err(invalid(format!("refusal code {:?} must be kebab-case, at most 64 bytes", r.code)));
        }
        if !(400..=599).contains(&r.status) {
            return Err(invalid(format!("refusal {}: status {} is not 400–599", r.code, r.status)));
        }
        if refusal_decls.iter().any(|d| d.code == r.code) {
            return Err(invalid(format!("refusal {} is declared twice", r.code)));
        }
        refusal_decls.push(RefusalDecl { code: r.code, status: r.status, summary: r.summary });
    }
    Ok((decls, page_decls, Faces { facets: facet_decls, panels: panel_decls, nav, refusals: refusal_decls }))
}

/// Refuse `value` as `plugin`'s facet declared as `decl` on the entity `id`: `facet-invalid`
/// when a member names a credential, when it is too large, or when it does not match the
/// schema (naming where, never the value).
pub fn check_facet(plugin: &str, id: &str, decl: &FacetDecl, value: &Value) -> Result<()> {
    let shown = format!("facets.{plugin}");
    let refuse = |field: String, message: String| {
        Refusal::new("facet-invalid", message).with_data(json!({ "plugin": plugin, "kind": decl.kind, "id": id, "field": field }))
    };
    if let Some(member) = secret_member(value) {
        return Err(refuse(format!("{shown}.{member}"), format!("{shown}.{member} names a credential: a facet is never a secret")));
    }
    if value.to_string().len() > MAX_FACET_VALUE_BYTES {
        return Err(refuse(shown.clone(), format!("{shown} is larger than {MAX_FACET_VALUE_BYTES} bytes")));
    }
    let validator =
        validator(&decl.schema).map_err(|e| Refusal::internal(format!("the recorded schema of {shown} no longer compiles: {e}")))?;
    if let Some(error) = validator.iter_errors(value).next() {
        let pointer = error.instance_path().to_string();
        let field = if pointer.is_empty() { shown.clone() } else { format!("{shown}{}", pointer.replace('/', ".")) };
        let rule = error.kind().keyword();
        return Err(refuse(field.clone(), format!("{field} does not match the facet's schema ({rule}): {}", decl.summary)));
    }
    Ok(())
}

/// A page template's name inside a bundle: `pages/<name>.html`, `<name>` of `[a-z0-9_-]`.
pub fn valid_template_name(name: &str) -> bool {
    name.strip_prefix("pages/").and_then(|rest| rest.strip_suffix(".html")).is_some_and(|stem| {
        !stem.is_empty() && stem.len() <= 64 && stem.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    })
}

fn validator(schema: &Value) -> std::result::Result<jsonschema::Validator, String> {
    let patterns = jsonschema::PatternOptions::regex().size_limit(1 << 20).dfa_size_limit(1 << 20);
    jsonschema::options().with_pattern_options(patterns).build(schema).map_err(|e| e.to_string())
}

/// Refuse a value for the plugin setting `shown` (`<pluginId>.<key>`) declared as `decl`:
/// `setting-is-secret` when a member names a credential, `setting-invalid` when it does not
/// match the schema (naming where, never the value).
pub fn check_value(shown: &str, decl: &SettingDecl, value: &Value) -> Result<()> {
    if let Some(member) = secret_member(value) {
        return Err(Refusal::new(
            "setting-is-secret",
            format!("{shown}.{member} is a credential: store it as a secret, never in settings"),
        )
        .with_data(json!({ "key": shown, "field": format!("{shown}.{member}") })));
    }
    if value.to_string().len() > MAX_SETTING_VALUE_BYTES {
        return Err(Refusal::new("setting-invalid", format!("{shown} is larger than {MAX_SETTING_VALUE_BYTES} bytes"))
            .with_data(json!({ "key": shown, "field": shown })));
    }
    let validator =
        validator(&decl.schema).map_err(|e| Refusal::internal(format!("the recorded schema of {shown} no longer compiles: {e}")))?;
    if let Some(error) = validator.iter_errors(value).next() {
        let pointer = error.instance_path().to_string();
        let field = if pointer.is_empty() { shown.to_string() } else { format!("{shown}{}", pointer.replace('/', ".")) };
        let rule = error.kind().keyword();
        return Err(Refusal::new("setting-invalid", format!("{field} does not match the setting's schema ({rule}): {}", decl.summary))
            .with_data(json!({ "key": shown, "field": field, "schema": decl.schema })));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting(key: &str, schema: Value, default: Option<Value>) -> wit_guest::SettingSpec {
        wit_guest::SettingSpec { key: key.into(), summary: "s".into(), schema: schema.to_string(), default: default.map(|d| d.to_string()) }
    }

    fn page(path: &str, source: &str) -> wit_guest::PageSpec {
        wit_guest::PageSpec { path: path.into(), title: "T".into(), source: source.into(), template: None, forms: vec![], navigation: true }
    }

    fn declared(settings: Vec<wit_guest::SettingSpec>, pages: Vec<wit_guest::PageSpec>) -> Declared {
        Declared { settings, pages, facets: vec![], panels: vec![], nav: None, refusals: vec![] }
    }

    fn code(settings: Vec<wit_guest::SettingSpec>, pages: Vec<wit_guest::PageSpec>) -> String {
        refused(declared(settings, pages))
    }

    fn refused(declared: Declared) -> String {
        from_wit("p", declared, &["listApps", "install"]).unwrap_err().code.to_string()
    }

    #[test]
    fn settings_that_list_urls_are_strings_nullable_strings_or_lists_of_strings() {
        let decl = |schema: Value| SettingDecl { key: "k".into(), summary: "s".into(), schema, default: None };
        // what the SDK declares for String, Option<String> and Vec<String>
        for schema in [schemars::schema_for!(String), schemars::schema_for!(Option<String>), schemars::schema_for!(Vec<String>)] {
            let schema = serde_json::to_value(schema).unwrap();
            assert!(decl(schema.clone()).lists_urls(), "{schema}");
        }
        for schema in [json!({"type": "integer"}), json!({"type": ["string", "integer"]}), json!({"type": "object"}), json!({})] {
            assert!(!decl(schema.clone()).lists_urls(), "{schema}");
        }
    }

    #[test]
    fn declarations_are_checked_by_name() {
        let (settings, pages, _) = from_wit(
            "p",
            declared(
                vec![setting("keepDays", json!({"type": "integer", "minimum": 0}), Some(json!(7)))],
                vec![page("", "listApps"), page("apps/by-name", "listApps")],
            ),
            &["listApps"],
        )
        .unwrap();
        assert_eq!(settings[0].default, Some(json!(7)));
        assert_eq!(pages.len(), 2);
        let bad = "plugin-descriptor-invalid";
        assert_eq!(code(vec![setting("Keep", json!({}), None)], vec![]), bad);
        assert_eq!(code(vec![setting("apiToken", json!({}), None)], vec![]), bad, "a credential is no setting");
        assert_eq!(code(vec![setting("a", json!({}), None), setting("a", json!({}), None)], vec![]), bad);
        assert_eq!(code(vec![setting("a", json!({"type": 5}), None)], vec![]), bad, "a schema that does not compile");
        assert_eq!(code(vec![setting("a", json!({"type": "integer"}), Some(json!("x")))], vec![]), bad, "a default off its schema");
        assert_eq!(code(vec![], vec![page("Apps", "listApps")]), bad);
        assert_eq!(code(vec![], vec![page("apps//x", "listApps")]), bad);
        assert_eq!(code(vec![], vec![page("apps", "missing")]), bad, "the source must be a declared method");
        let mut templated = page("apps", "listApps");
        templated.template = Some("../etc/passwd".into());
        assert_eq!(code(vec![], vec![templated]), bad);
    }

    #[test]
    fn values_are_judged_by_the_schema_and_credentials_refused() {
        let decl = SettingDecl {
            key: "sources".into(),
            summary: "Where to look".into(),
            schema: json!({"type": "array", "items": {"type": "string", "format": "uri"}}),
            default: None,
        };
        check_value("p.sources", &decl, &json!(["https://a.example/c.json"])).unwrap();
        let refused = check_value("p.sources", &decl, &json!(["https://a.example", 5])).unwrap_err();
        assert_eq!((refused.code.as_ref(), refused.data.as_ref().unwrap()["field"].as_str()), ("setting-invalid", Some("p.sources.1")));
        let open = SettingDecl { schema: json!({"type": "object"}), ..decl };
        let refused = check_value("p.sources", &open, &json!({"bucket": "b", "secretKey": "hunter2"})).unwrap_err();
        assert_eq!(refused.code, "setting-is-secret");
        assert!(!refused.message.contains("hunter2"));
    }

    fn facet(kind: wit_guest::EntityKind, schema: Value) -> wit_guest::FacetSpec {
        wit_guest::FacetSpec { kind, summary: "What the plugin bound".into(), schema: schema.to_string() }
    }

    #[test]
    fn facets_panels_navigation_and_refusals_are_checked_by_name() {
        use wit_guest::EntityKind as K;
        let schema =
            json!({"type": "object", "properties": {"bindings": {"type": "array", "items": {"type": "string"}}}, "required": ["bindings"]});
        let whole = Declared {
            settings: vec![],
            pages: vec![],
            facets: vec![facet(K::Service, schema.clone()), facet(K::Cluster, json!({}))],
            panels: vec![wit_guest::PanelSpec { kind: K::Service, title: "Mail".into(), template: "pages/panel.html".into() }],
            nav: Some(wit_guest::NavSection { title: "Mail".into(), icon: "no-such-icon".into() }),
            refusals: vec![wit_guest::RefusalSpec { code: "mail-domain-unverified".into(), status: 409, summary: "s".into() }],
        };
        let (_, _, faces) = from_wit("p", whole, &[]).unwrap();
        assert_eq!(faces.facet("service").map(|f| &f.schema), Some(&schema));
        assert_eq!(faces.facet("organization"), None);
        assert_eq!(faces.nav.as_ref().map(|n| n.icon.as_str()), Some("box"), "an unknown icon shows the box");
        assert_eq!(faces.refusal_status("mail-domain-unverified"), Some(409));
        let bad = "plugin-descriptor-invalid";
        let with = |f: &dyn Fn(&mut Declared)| {
            let mut d = declared(vec![], vec![]);
            f(&mut d);
            refused(d)
        };
        assert_eq!(with(&|d| d.facets = vec![facet(K::Node, json!({}))]), bad, "no facet on a node");
        assert_eq!(with(&|d| d.facets = vec![facet(K::Service, json!({})), facet(K::Service, json!({}))]), bad);
        assert_eq!(with(&|d| d.facets = vec![facet(K::Service, json!({"type": 5}))]), bad);
        assert_eq!(with(&|d| d.panels = vec![wit_guest::PanelSpec { kind: K::Service, title: "T".into(), template: "../x".into() }]), bad);
        assert_eq!(with(&|d| d.nav = Some(wit_guest::NavSection { title: " ".into(), icon: "box".into() })), bad);
        for (code, status) in [("Not-Kebab", 409), ("fine", 200), ("fine", 600)] {
            let spec = wit_guest::RefusalSpec { code: code.into(), status, summary: "s".into() };
            assert_eq!(with(&|d| d.refusals = vec![spec.clone()]), bad, "{code} {status}");
        }
    }

    #[test]
    fn a_facet_is_judged_by_its_schema_never_quoting_a_value() {
        let decl = FacetDecl {
            kind: "service".into(),
            summary: "What the plugin bound".into(),
            schema: json!({"type": "object", "properties": {"bindings": {"type": "array", "items": {"type": "string"}}}, "additionalProperties": false}),
        };
        check_facet("mail", "svc_1", &decl, &json!({"bindings": ["a@b.example"]})).unwrap();
        let refused = check_facet("mail", "svc_1", &decl, &json!({"bindings": ["a@b.example", 5]})).unwrap_err();
        assert_eq!(refused.code, "facet-invalid");
        assert_eq!(refused.data.as_ref().unwrap()["field"], "facets.mail.bindings.1");
        let refused = check_facet("mail", "svc_1", &decl, &json!({"password": "hunter2"})).unwrap_err();
        assert_eq!(refused.code, "facet-invalid");
        assert!(!refused.message.contains("hunter2") && !refused.data.as_ref().unwrap().to_string().contains("hunter2"));
    }
}
