//! What a plugin shows operators besides its methods: the settings it declares (set with
//! `settings.update` as `<pluginId>.<key>`, read back through the `settings` import) and the
//! dashboard pages it contributes. Both come from `describe`, are checked here, and are recorded
//! with the installed version, so any node answers for them without loading the plugin.

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

/// Check the settings and pages of a descriptor (`plugin-descriptor-invalid` naming what is
/// wrong); `methods` are the verbs it declares.
pub fn from_wit(
    plugin: &str,
    settings: Vec<wit_guest::SettingSpec>,
    pages: Vec<wit_guest::PageSpec>,
    methods: &[&str],
) -> Result<(Vec<SettingDecl>, Vec<PageDecl>)> {
    let invalid = |m: String| Refusal::new("plugin-descriptor-invalid", format!("plugin {plugin}: {m}"));
    if settings.len() > MAX_DECLARED || pages.len() > MAX_DECLARED {
        return Err(invalid(format!("at most {MAX_DECLARED} settings and {MAX_DECLARED} pages")));
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
    Ok((decls, page_decls))
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

    fn code(settings: Vec<wit_guest::SettingSpec>, pages: Vec<wit_guest::PageSpec>) -> String {
        from_wit("p", settings, pages, &["listApps", "install"]).unwrap_err().code.to_string()
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
        let (settings, pages) = from_wit(
            "p",
            vec![setting("keepDays", json!({"type": "integer", "minimum": 0}), Some(json!(7)))],
            vec![page("", "listApps"), page("apps/by-name", "listApps")],
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
}
