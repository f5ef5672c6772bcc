//! The catalog a publisher signs: apps, their published versions, each version's service
//! template. JSON field names are camelCase and unknown fields are refused everywhere (a new
//! field is a new contract version).
//!
//! A template is shaped like the part of the inventory's `services.create` body a catalog can
//! know in advance (`image`, `ports`, `environment`, `volumes`, with the same names and shapes);
//! the installing operator supplies the rest (name, organization, domains, scale, mail
//! addresses). The model checks what makes a catalog well-formed as data — counts, sizes,
//! identifiers, uniqueness, no control characters. The inventory's own field rules (OCI
//! reference syntax, environment names, credential-looking values, port collisions, mount paths)
//! stay the inventory's (`capstan-field-rules`): they run when the service is created, and
//! `capstan-catalog sign` runs them at signing so a publisher learns early.

use semver::Version;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Most apps in one catalog.
pub const MAX_APPS: usize = 1024;
/// Most versions of one app (withdrawn ones included: a published version stays forever).
pub const MAX_VERSIONS: usize = 1024;
/// Most ports in a template (the inventory's limit).
pub const MAX_PORTS: usize = 32;
/// Most environment variables in a template (the inventory's limit).
pub const MAX_ENVIRONMENT: usize = 256;
/// Most volumes in a template (the inventory's limit).
pub const MAX_VOLUMES: usize = 32;
/// Most required capabilities of a template.
pub const MAX_CAPABILITIES: usize = 32;
/// Most categories of an app.
pub const MAX_CATEGORIES: usize = 16;
/// Largest template, in bytes of its canonical JSON; a [`Snapshot`] of it then always fits the
/// inventory's 64 KiB bound for a service's template snapshot.
pub const MAX_TEMPLATE_BYTES: usize = 32 * 1024;
/// Longest app name, in characters.
pub const MAX_NAME_CHARS: usize = 100;
/// Longest description, release notes and withdrawal reason, in bytes.
pub const MAX_TEXT_BYTES: usize = 4096;

/// A catalog: the payload of a signed envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Catalog {
    /// In the publisher's order; ids are unique.
    pub apps: Vec<App>,
}

/// One app and every version it was ever published with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct App {
    /// 1–63 of a-z 0-9 -, starting with a letter, not ending with - (a DNS label, like a
    /// service name); unique in the catalog and stable forever.
    pub id: String,
    /// The display name: 1–100 characters, no control characters.
    pub name: String,
    /// At most 4096 bytes; newlines and tabs are the only control characters allowed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// An `https://` URL, at most 2048 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub homepage: Option<String>,
    /// Labels for browsing (DNS-label syntax), unique, at most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    /// Every version ever published, withdrawn ones included; at least one, unique.
    pub versions: Vec<AppVersion>,
}

/// A published version of an app.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AppVersion {
    /// Semantic version without build metadata (pre-releases allowed).
    pub version: Version,
    /// Release notes (at most 4096 bytes). Not part of what succession keeps immutable.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub notes: String,
    /// Set once the publisher withdrew the version: it is no longer offered for installs or
    /// upgrades, but stays in the catalog (with its template) forever, and may never be
    /// offered again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdrawn: Option<Withdrawal>,
    /// What a service of this version runs; immutable once published.
    pub template: Template,
}

/// Why a version was withdrawn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Withdrawal {
    /// 1–4096 bytes, shown to operators running the version.
    pub reason: String,
}

/// A version's service template: the inventory's `services.create` fields a catalog knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Template {
    /// An OCI image reference (`registry/path:tag[@sha256:…]`).
    pub image: String,
    /// The ports the service exposes; at most [`MAX_PORTS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    /// Plain configuration only; anything credential-like belongs in secrets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    /// The volumes the service mounts; at most [`MAX_VOLUMES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// What the app needs from the platform beyond a container (e.g. `mail`, `platform-oidc`),
    /// DNS-label syntax, unique. The App Store plugin decides which it can provide and refuses
    /// to install a version requiring one it does not know.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// How the app signs its users in through Capstan as its OpenID provider: present exactly
    /// when `capabilities` lists `platform-oidc`. Omitted when absent, so the templates published
    /// before it existed keep their digests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_oidc: Option<PlatformOidc>,
}

/// The capability a template declares when it carries [`Template::platform_oidc`].
pub const PLATFORM_OIDC: &str = "platform-oidc";
/// Most roles a [`PlatformOidc`] declares.
pub const MAX_OIDC_ROLES: usize = 16;
/// Longest [`PlatformOidc::redirect_path`], in bytes.
pub const MAX_REDIRECT_PATH_BYTES: usize = 200;

/// An app's single sign-on contract with Capstan as its OpenID provider (capability
/// `platform-oidc`): the roles an administrator assigns people, where the app receives the
/// authorization response, and the environment variables the app reads its client from. The
/// host reads it from the service's snapshot when an administrator enables single sign-on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PlatformOidc {
    /// The app's own roles an administrator assigns people (1–16, each 1–64 of A-Z a-z 0-9 _ - .,
    /// unique).
    pub roles: Vec<String>,
    /// The path of the app's OpenID Connect redirect endpoint on its HTTPS domain, e.g.
    /// `/login/generic_oauth` (starts with `/`, no `//`, no query or fragment, at most 200 bytes,
    /// printable ASCII).
    pub redirect_path: String,
    /// The environment variable the app reads the issuer URL from.
    pub issuer_variable: String,
    /// The environment variable the app reads its client id from.
    pub client_id_variable: String,
    /// The environment variable the app reads its client secret from.
    pub client_secret_variable: String,
}

/// A port, exactly as the inventory's `services.create` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Port {
    /// The port the container listens on.
    pub port: u16,
    /// The protocol spoken on the port.
    pub protocol: Protocol,
    /// A port published on the node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_port: Option<u16>,
}

/// A port's protocol, as the inventory's `services.create` takes it (`tcp`, `udp`, `http`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Protocol {
    /// `tcp`: plain TCP.
    Tcp,
    /// `udp`: UDP.
    Udp,
    /// `http`: HTTP.
    Http,
}

/// A volume, exactly as the inventory's `services.create` takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Volume {
    /// The volume's name: 1–256 bytes, no control characters.
    pub name: String,
    /// Where the volume is mounted in the container: 1–256 bytes, no control characters.
    pub mount_path: String,
}

/// The template snapshot a service created or upgraded from the catalog carries (the
/// inventory's `template` field): which version of which app, the template and its digest, and
/// the catalog revision it was taken from. Always within the inventory's 64 KiB bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Snapshot {
    /// The app's id.
    pub app_id: String,
    /// The app version the template belongs to.
    pub version: Version,
    /// [`Template::digest_hex`] of `template`.
    pub template_digest: String,
    /// The revision of the catalog the snapshot was taken from.
    pub catalog_revision: u64,
    /// The version's template, as published.
    pub template: Template,
}

/// A broken model rule: the field (a path like `apps[2].versions[0].template.image`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The path of the offending field (empty when the rule is about the whole item).
    pub field: String,
    /// Why the field breaks the rule.
    pub message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl Invalid {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid { field: field.into(), message: message.into() }
    }

    /// The same rule, its field path under `prefix`.
    pub(crate) fn within(self, prefix: &str) -> Self {
        let field = if self.field.is_empty() { prefix.to_string() } else { format!("{prefix}.{}", self.field) };
        Invalid { field, message: self.message }
    }
}

type Checked = Result<(), Invalid>;

impl Catalog {
    /// The app with this id.
    pub fn app(&self, id: &str) -> Option<&App> {
        self.apps.iter().find(|app| app.id == id)
    }

    /// Check every model rule; the first broken one is named by its field.
    pub fn validate(&self) -> Checked {
        if self.apps.len() > MAX_APPS {
            return Err(Invalid::new("apps", format!("a catalog holds at most {MAX_APPS} apps")));
        }
        let mut ids = BTreeSet::new();
        for (i, app) in self.apps.iter().enumerate() {
            app.validate().map_err(|e| e.within(&format!("apps[{i}]")))?;
            if !ids.insert(app.id.as_str()) {
                return Err(Invalid::new(format!("apps[{i}].id"), format!("the app id {} is listed twice", app.id)));
            }
        }
        Ok(())
    }
}

impl App {
    /// This app's version `version`, withdrawn or not.
    pub fn version(&self, version: &Version) -> Option<&AppVersion> {
        self.versions.iter().find(|v| v.version == *version)
    }

    /// The versions offered for installs and upgrades (not withdrawn), newest first.
    pub fn offered(&self) -> Vec<&AppVersion> {
        let mut offered: Vec<_> = self.versions.iter().filter(|v| !v.is_withdrawn()).collect();
        offered.sort_by(|a, b| b.version.cmp(&a.version));
        offered
    }

    /// The version a new install gets: the greatest offered release; when the app has offered
    /// only pre-releases, the greatest of those. `None` when every version is withdrawn.
    pub fn newest(&self) -> Option<&AppVersion> {
        let offered = self.offered();
        offered.iter().find(|v| v.version.pre.is_empty()).or(offered.first()).copied()
    }

    /// The offered versions a service running `current` may upgrade to, oldest first: greater
    /// than `current`, and releases only unless `current` is itself a pre-release.
    pub fn upgrades_from(&self, current: &Version) -> Vec<&AppVersion> {
        let mut newer: Vec<_> = self
            .versions
            .iter()
            .filter(|v| !v.is_withdrawn() && v.version > *current && (v.version.pre.is_empty() || !current.pre.is_empty()))
            .collect();
        newer.sort_by(|a, b| a.version.cmp(&b.version));
        newer
    }

    /// Check this app's model rules; field paths are relative to the app.
    pub fn validate(&self) -> Checked {
        label("id", &self.id)?;
        let name_chars = self.name.chars().count();
        if self.name.trim().is_empty() || name_chars > MAX_NAME_CHARS || self.name.chars().any(char::is_control) {
            return Err(Invalid::new("name", format!("the name is 1 to {MAX_NAME_CHARS} characters without control characters")));
        }
        text("description", &self.description, false)?;
        if let Some(homepage) = &self.homepage {
            let ok = homepage.len() <= 2048
                && homepage.strip_prefix("https://").is_some_and(|rest| !rest.is_empty())
                && !homepage.chars().any(|c| c.is_control() || c.is_whitespace());
            if !ok {
                return Err(Invalid::new("homepage", "the homepage is an https:// URL of at most 2048 bytes without spaces"));
            }
        }
        if self.categories.len() > MAX_CATEGORIES {
            return Err(Invalid::new("categories", format!("an app has at most {MAX_CATEGORIES} categories")));
        }
        let mut categories = BTreeSet::new();
        for (i, category) in self.categories.iter().enumerate() {
            label(&format!("categories[{i}]"), category)?;
            if !categories.insert(category) {
                return Err(Invalid::new(format!("categories[{i}]"), format!("the category {category} is listed twice")));
            }
        }
        if self.versions.is_empty() || self.versions.len() > MAX_VERSIONS {
            return Err(Invalid::new("versions", format!("an app has 1 to {MAX_VERSIONS} versions")));
        }
        let mut versions = BTreeSet::new();
        for (i, version) in self.versions.iter().enumerate() {
            version.validate().map_err(|e| e.within(&format!("versions[{i}]")))?;
            if !versions.insert(&version.version) {
                return Err(Invalid::new(format!("versions[{i}].version"), format!("{} {} is listed twice", self.id, version.version)));
            }
        }
        Ok(())
    }
}

impl AppVersion {
    /// Whether the publisher withdrew this version.
    pub fn is_withdrawn(&self) -> bool {
        self.withdrawn.is_some()
    }

    /// Check this version's model rules; field paths are relative to the version.
    pub fn validate(&self) -> Checked {
        if !self.version.build.is_empty() {
            return Err(Invalid::new(
                "version",
                format!("{}: build metadata (+…) is not allowed; two versions differing only in it would be ambiguous", self.version),
            ));
        }
        text("notes", &self.notes, false)?;
        if let Some(withdrawal) = &self.withdrawn {
            text("withdrawn.reason", &withdrawal.reason, true)?;
        }
        self.template.validate().map_err(|e| e.within("template"))
    }
}

impl Template {
    /// The canonical bytes: compact JSON, fields in declaration order (image, ports,
    /// environment, volumes, capabilities, platformOidc), empty lists and maps and an absent
    /// `publicPort` or `platformOidc` omitted, environment keys in byte order.
    pub fn canonical_json(&self) -> Vec<u8> {
        // serializing plain structs, strings and integers cannot fail
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// SHA-256 of [`canonical_json`](Template::canonical_json): what succession compares to
    /// tell an unchanged published version from a rewritten one.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.canonical_json()).into()
    }

    /// [`digest`](Template::digest) as lowercase hex.
    pub fn digest_hex(&self) -> String {
        hex::encode(self.digest())
    }

    /// Check this template's model rules; field paths are relative to the template.
    pub fn validate(&self) -> Checked {
        if self.image.is_empty() || self.image.len() > 512 || self.image.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(Invalid::new("image", "the image is an OCI reference of 1 to 512 bytes without spaces"));
        }
        if self.ports.len() > MAX_PORTS {
            return Err(Invalid::new("ports", format!("a template has at most {MAX_PORTS} ports")));
        }
        if self.environment.len() > MAX_ENVIRONMENT {
            return Err(Invalid::new("environment", format!("a template has at most {MAX_ENVIRONMENT} environment variables")));
        }
        for (key, value) in &self.environment {
            if key.is_empty() || key.len() > 128 || key.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(Invalid::new("environment", "an environment name is 1 to 128 bytes without spaces"));
            }
            if value.len() > MAX_TEXT_BYTES || value.chars().any(|c| c.is_control() && c != '\t') {
                return Err(Invalid::new(
                    format!("environment.{key}"),
                    format!("the value is at most {MAX_TEXT_BYTES} bytes without control characters"),
                ));
            }
        }
        if self.volumes.len() > MAX_VOLUMES {
            return Err(Invalid::new("volumes", format!("a template has at most {MAX_VOLUMES} volumes")));
        }
        for (i, volume) in self.volumes.iter().enumerate() {
            for (field, value) in [("name", &volume.name), ("mountPath", &volume.mount_path)] {
                if value.is_empty() || value.len() > 256 || value.chars().any(char::is_control) {
                    return Err(Invalid::new(format!("volumes[{i}].{field}"), "1 to 256 bytes without control characters"));
                }
            }
        }
        if self.capabilities.len() > MAX_CAPABILITIES {
            return Err(Invalid::new("capabilities", format!("a template requires at most {MAX_CAPABILITIES} capabilities")));
        }
        let mut capabilities = BTreeSet::new();
        for (i, capability) in self.capabilities.iter().enumerate() {
            label(&format!("capabilities[{i}]"), capability)?;
            if !capabilities.insert(capability) {
                return Err(Invalid::new(format!("capabilities[{i}]"), format!("the capability {capability} is listed twice")));
            }
        }
        match (&self.platform_oidc, self.capabilities.iter().any(|c| c == PLATFORM_OIDC)) {
            (Some(oidc), true) => oidc.validate(&self.environment).map_err(|e| e.within("platformOidc"))?,
            (None, false) => {}
            (None, true) => {
                return Err(Invalid::new(
                    "platformOidc",
                    format!("a template requiring {PLATFORM_OIDC} declares how the app signs in (platformOidc)"),
                ));
            }
            (Some(_), false) => {
                return Err(Invalid::new(
                    "capabilities",
                    format!("a template declaring platformOidc requires the capability {PLATFORM_OIDC}"),
                ));
            }
        }
        let size = self.canonical_json().len();
        if size > MAX_TEMPLATE_BYTES {
            return Err(Invalid::new("", format!("the template is {size} bytes of JSON; the limit is {MAX_TEMPLATE_BYTES}")));
        }
        Ok(())
    }
}

impl PlatformOidc {
    /// The variables, each with its field name, in declaration order.
    fn variables(&self) -> [(&'static str, &str); 3] {
        [
            ("issuerVariable", &self.issuer_variable),
            ("clientIdVariable", &self.client_id_variable),
            ("clientSecretVariable", &self.client_secret_variable),
        ]
    }

    /// Check the declaration's rules against the template's `environment`; field paths are
    /// relative to the declaration.
    pub fn validate(&self, environment: &BTreeMap<String, String>) -> Checked {
        if self.roles.is_empty() || self.roles.len() > MAX_OIDC_ROLES {
            return Err(Invalid::new("roles", format!("an app declares 1 to {MAX_OIDC_ROLES} roles")));
        }
        let mut roles = BTreeSet::new();
        for (i, role) in self.roles.iter().enumerate() {
            let ok =
                !role.is_empty() && role.len() <= 64 && role.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !ok {
                return Err(Invalid::new(format!("roles[{i}]"), format!("{role:?} must be 1 to 64 of A-Z a-z 0-9 _ - .")));
            }
            if !roles.insert(role) {
                return Err(Invalid::new(format!("roles[{i}]"), format!("the role {role} is listed twice")));
            }
        }
        let path = &self.redirect_path;
        let ok = path.starts_with('/')
            && path.len() <= MAX_REDIRECT_PATH_BYTES
            && !path.contains("//")
            && path.chars().all(|c| c.is_ascii_graphic() && c != '?' && c != '#');
        if !ok {
            return Err(Invalid::new(
                "redirectPath",
                format!(
                    "{path:?} must be a path starting with / of at most {MAX_REDIRECT_PATH_BYTES} bytes of printable ASCII, without //, a query or a fragment"
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for (field, name) in self.variables() {
            let ok = name.len() <= 64
                && name.starts_with(|c: char| c.is_ascii_uppercase() || c == '_')
                && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if !ok {
                return Err(Invalid::new(
                    field,
                    format!("{name:?} must be an environment variable name: [A-Z_][A-Z0-9_]*, at most 64 bytes"),
                ));
            }
            if !seen.insert(name) {
                return Err(Invalid::new(field, format!("{name} is named for two of the issuer, client id and client secret")));
            }
            if environment.contains_key(name) {
                return Err(Invalid::new(
                    field,
                    format!("{name} is also set by the template's environment; Capstan sets it when single sign-on is enabled"),
                ));
            }
        }
        Ok(())
    }
}

impl Snapshot {
    /// The snapshot of `app`'s version `version` from a catalog at `catalog_revision`.
    pub fn of(app: &App, version: &AppVersion, catalog_revision: u64) -> Snapshot {
        Snapshot {
            app_id: app.id.clone(),
            version: version.version.clone(),
            template_digest: version.template.digest_hex(),
            catalog_revision,
            template: version.template.clone(),
        }
    }

    /// As the inventory's `template` value (a JSON object).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Whether `template_digest` is the digest of `template` (a snapshot read back from a
    /// service is data like any other).
    pub fn is_consistent(&self) -> bool {
        self.template.digest_hex() == self.template_digest
    }
}

/// A DNS label starting with a letter: 1–63 of a-z 0-9 -, not ending with -.
fn label(field: &str, value: &str) -> Checked {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value.starts_with(|c: char| c.is_ascii_lowercase())
        && !value.ends_with('-')
        && value.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(field, format!("{value:?} must be 1 to 63 of a-z 0-9 -, start with a letter and not end with -")))
    }
}

/// Free text: at most [`MAX_TEXT_BYTES`], newlines and tabs the only control characters.
fn text(field: &str, value: &str, required: bool) -> Checked {
    if (required && value.trim().is_empty())
        || value.len() > MAX_TEXT_BYTES
        || value.chars().any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        let least = if required { 1 } else { 0 };
        return Err(Invalid::new(
            field,
            format!("{least} to {MAX_TEXT_BYTES} bytes; newlines and tabs are the only control characters allowed"),
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub fn version(v: &str, image: &str) -> AppVersion {
        AppVersion {
            version: v.parse().unwrap(),
            notes: String::new(),
            withdrawn: None,
            template: Template {
                image: image.into(),
                ports: vec![Port { port: 8080, protocol: Protocol::Http, public_port: None }],
                environment: BTreeMap::from([("LOG_LEVEL".into(), "info".into())]),
                volumes: vec![Volume { name: "data".into(), mount_path: "/var/lib/app".into() }],
                capabilities: vec![],
                platform_oidc: None,
            },
        }
    }

    pub fn app(id: &str, versions: &[&str]) -> App {
        App {
            id: id.into(),
            name: format!("The {id}"),
            description: String::new(),
            homepage: None,
            categories: vec![],
            versions: versions.iter().map(|v| version(v, &format!("registry.example.com/{id}:{v}"))).collect(),
        }
    }

    pub fn catalog() -> Catalog {
        Catalog { apps: vec![app("wiki", &["1.0.0", "1.1.0"]), app("chat", &["2.0.0"])] }
    }

    #[test]
    fn json_names_are_camel_case_and_omit_empties() {
        let mut v = version("1.2.3", "nginx:1.27");
        v.template.ports[0].public_port = Some(80);
        v.withdrawn = Some(Withdrawal { reason: "CVE-2099-1".into() });
        let value = serde_json::to_value(&v).unwrap();
        assert_eq!(
            value,
            json!({
                "version": "1.2.3",
                "withdrawn": { "reason": "CVE-2099-1" },
                "template": {
                    "image": "nginx:1.27",
                    "ports": [{ "port": 8080, "protocol": "http", "publicPort": 80 }],
                    "environment": { "LOG_LEVEL": "info" },
                    "volumes": [{ "name": "data", "mountPath": "/var/lib/app" }],
                },
            })
        );
        assert_eq!(serde_json::from_value::<AppVersion>(value).unwrap(), v);
        let unknown = json!({ "version": "1.0.0", "template": { "image": "nginx", "privileged": true } });
        assert!(serde_json::from_value::<AppVersion>(unknown).is_err(), "unknown fields are refused");
    }

    #[test]
    fn the_template_digest_ignores_how_empties_were_spelled_but_nothing_else() {
        let a: Template = serde_json::from_value(json!({ "image": "nginx", "ports": [], "environment": {} })).unwrap();
        let b: Template = serde_json::from_value(json!({ "image": "nginx" })).unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_eq!(b.canonical_json(), br#"{"image":"nginx"}"#);
        let c: Template = serde_json::from_value(json!({ "image": "nginx", "environment": { "B": "2", "A": "1" } })).unwrap();
        assert_eq!(c.canonical_json(), br#"{"image":"nginx","environment":{"A":"1","B":"2"}}"#);
        let d: Template = serde_json::from_value(json!({ "image": "nginx", "environment": { "A": "1", "B": "3" } })).unwrap();
        assert_ne!(c.digest(), d.digest());
        assert_eq!(c.digest_hex(), hex::encode(Sha256::digest(br#"{"image":"nginx","environment":{"A":"1","B":"2"}}"#)));
    }

    #[test]
    fn a_valid_catalog_passes_and_every_rule_names_its_field() {
        assert_eq!(catalog().validate(), Ok(()));
        let field = |edit: &dyn Fn(&mut Catalog)| {
            let mut c = catalog();
            edit(&mut c);
            c.validate().unwrap_err().field
        };
        assert_eq!(field(&|c| c.apps[1].id = "wiki".into()), "apps[1].id");
        assert_eq!(field(&|c| c.apps[0].id = "Wiki".into()), "apps[0].id");
        assert_eq!(field(&|c| c.apps[0].id = "wiki-".into()), "apps[0].id");
        assert_eq!(field(&|c| c.apps[0].name = " ".into()), "apps[0].name");
        assert_eq!(field(&|c| c.apps[0].name = "a\u{7}".into()), "apps[0].name");
        assert_eq!(field(&|c| c.apps[0].description = "x".repeat(MAX_TEXT_BYTES + 1)), "apps[0].description");
        assert_eq!(field(&|c| c.apps[0].homepage = Some("http://example.com".into())), "apps[0].homepage");
        assert_eq!(field(&|c| c.apps[0].categories = vec!["docs".into(), "docs".into()]), "apps[0].categories[1]");
        assert_eq!(field(&|c| c.apps[0].versions.clear()), "apps[0].versions");
        assert_eq!(field(&|c| c.apps[0].versions[1].version = "1.0.0".parse().unwrap()), "apps[0].versions[1].version");
        assert_eq!(field(&|c| c.apps[0].versions[1].version = "1.2.0+build.5".parse().unwrap()), "apps[0].versions[1].version");
        assert_eq!(field(&|c| c.apps[0].versions[0].notes = "\u{0}".into()), "apps[0].versions[0].notes");
        assert_eq!(
            field(&|c| c.apps[0].versions[0].withdrawn = Some(Withdrawal { reason: String::new() })),
            "apps[0].versions[0].withdrawn.reason"
        );
        assert_eq!(field(&|c| c.apps[0].versions[0].template.image = "a b".into()), "apps[0].versions[0].template.image");
        assert_eq!(
            field(&|c| c.apps[0].versions[0].template.ports = vec![c.apps[0].versions[0].template.ports[0]; MAX_PORTS + 1]),
            "apps[0].versions[0].template.ports"
        );
        assert_eq!(
            field(&|c| {
                c.apps[0].versions[0].template.environment.insert("X".into(), "a\nb".into());
            }),
            "apps[0].versions[0].template.environment.X"
        );
        assert_eq!(
            field(&|c| c.apps[0].versions[0].template.volumes[0].mount_path.clear()),
            "apps[0].versions[0].template.volumes[0].mountPath"
        );
        assert_eq!(
            field(&|c| c.apps[0].versions[0].template.capabilities = vec!["mail".into(), "Mail".into()]),
            "apps[0].versions[0].template.capabilities[1]"
        );
        assert_eq!(
            field(&|c| {
                let env = &mut c.apps[0].versions[0].template.environment;
                for i in 0..20 {
                    env.insert(format!("K{i}"), "v".repeat(2000));
                }
            }),
            "apps[0].versions[0].template"
        );
        let too_many = Catalog { apps: (0..=MAX_APPS).map(|i| app(&format!("a{i}"), &["1.0.0"])).collect() };
        assert_eq!(too_many.validate().unwrap_err().field, "apps");
    }

    /// A Grafana-like declaration on `wiki` 1.0.0 of [`catalog`].
    fn with_oidc() -> Catalog {
        let mut c = catalog();
        let template = &mut c.apps[0].versions[0].template;
        template.capabilities = vec![PLATFORM_OIDC.into()];
        template.platform_oidc = Some(PlatformOidc {
            roles: vec!["Admin".into(), "Editor".into(), "Viewer".into()],
            redirect_path: "/login/generic_oauth".into(),
            issuer_variable: "GF_AUTH_GENERIC_OAUTH_ISSUER".into(),
            client_id_variable: "GF_AUTH_GENERIC_OAUTH_CLIENT_ID".into(),
            client_secret_variable: "GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET".into(),
        });
        c
    }

    #[test]
    fn a_template_without_platform_oidc_keeps_its_canonical_json_and_digest() {
        let mut template = version("1.0.0", "registry.example.com/wiki:1.0.0").template;
        template.capabilities = vec!["mail".into()];
        let published = r#"{"image":"registry.example.com/wiki:1.0.0","ports":[{"port":8080,"protocol":"http"}],"environment":{"LOG_LEVEL":"info"},"volumes":[{"name":"data","mountPath":"/var/lib/app"}],"capabilities":["mail"]}"#;
        assert_eq!(String::from_utf8(template.canonical_json()).unwrap(), published);
        // the digest this template had before `platformOidc` existed
        assert_eq!(template.digest_hex(), "38015c587091b0f80f695ce3d1350e6286f5a1dc0ccc4e343093bf500b52cac7");
        let read: Template = serde_json::from_str(published).unwrap();
        assert_eq!((read.platform_oidc.as_ref(), read.digest_hex()), (None, template.digest_hex()));
    }

    #[test]
    fn platform_oidc_is_camel_case_after_the_capabilities_and_refuses_unknown_fields() {
        let c = with_oidc();
        let template = &c.apps[0].versions[0].template;
        let value = serde_json::to_value(template).unwrap();
        assert_eq!(
            value["platformOidc"],
            json!({
                "roles": ["Admin", "Editor", "Viewer"],
                "redirectPath": "/login/generic_oauth",
                "issuerVariable": "GF_AUTH_GENERIC_OAUTH_ISSUER",
                "clientIdVariable": "GF_AUTH_GENERIC_OAUTH_CLIENT_ID",
                "clientSecretVariable": "GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET",
            })
        );
        let canonical = String::from_utf8(template.canonical_json()).unwrap();
        assert!(canonical.ends_with(r#""capabilities":["platform-oidc"],"platformOidc":{"roles":["Admin","Editor","Viewer"],"redirectPath":"/login/generic_oauth","issuerVariable":"GF_AUTH_GENERIC_OAUTH_ISSUER","clientIdVariable":"GF_AUTH_GENERIC_OAUTH_CLIENT_ID","clientSecretVariable":"GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET"}}"#), "{canonical}");
        assert_eq!(serde_json::from_value::<Template>(value.clone()).unwrap(), *template);
        let mut unknown = value;
        unknown["platformOidc"]["scopes"] = json!(["openid"]);
        assert!(serde_json::from_value::<Template>(unknown).is_err(), "unknown fields are refused");
        // a snapshot carries the declaration
        let snapshot = Snapshot::of(&c.apps[0], &c.apps[0].versions[0], 3);
        assert_eq!(snapshot.to_value()["template"]["platformOidc"]["redirectPath"], "/login/generic_oauth");
        assert!(snapshot.is_consistent());
    }

    #[test]
    fn platform_oidc_rules_name_their_field() {
        assert_eq!(with_oidc().validate(), Ok(()));
        let field = |edit: &dyn Fn(&mut Template)| {
            let mut c = with_oidc();
            edit(&mut c.apps[0].versions[0].template);
            c.validate().unwrap_err().field
        };
        fn oidc(t: &mut Template) -> &mut PlatformOidc {
            t.platform_oidc.as_mut().unwrap()
        }
        const AT: &str = "apps[0].versions[0].template";
        // the capability and the declaration go together
        assert_eq!(field(&|t| t.platform_oidc = None), format!("{AT}.platformOidc"));
        assert_eq!(field(&|t| t.capabilities = vec!["mail".into()]), format!("{AT}.capabilities"));
        assert_eq!(field(&|t| t.capabilities.clear()), format!("{AT}.capabilities"));
        let mut both = with_oidc();
        both.apps[0].versions[0].template.capabilities.insert(0, "mail".into());
        assert_eq!(both.validate(), Ok(()), "beside other capabilities");
        // roles: 1 to 16, each 1 to 64 of A-Z a-z 0-9 _ - ., unique
        assert_eq!(field(&|t| oidc(t).roles.clear()), format!("{AT}.platformOidc.roles"));
        assert_eq!(field(&|t| oidc(t).roles = (0..=MAX_OIDC_ROLES).map(|i| format!("r{i}")).collect()), format!("{AT}.platformOidc.roles"));
        assert_eq!(field(&|t| oidc(t).roles[1] = "Admin".into()), format!("{AT}.platformOidc.roles[1]"));
        for bad in ["", "Power User", "admin:all", "é", &"r".repeat(65)] {
            assert_eq!(field(&|t| oidc(t).roles[2] = bad.into()), format!("{AT}.platformOidc.roles[2]"), "{bad:?}");
        }
        let mut roles = with_oidc();
        oidc(&mut roles.apps[0].versions[0].template).roles = vec!["a.b_c-D9".into(), "r".repeat(64)];
        assert_eq!(roles.validate(), Ok(()));
        // the redirect path
        for bad in ["", "login", "//evil.example/cb", "/a//b", "/cb?next=1", "/cb#x", "/a b", "/\u{e9}", "/\t"] {
            assert_eq!(field(&|t| oidc(t).redirect_path = bad.into()), format!("{AT}.platformOidc.redirectPath"), "{bad:?}");
        }
        assert_eq!(
            field(&|t| oidc(t).redirect_path = format!("/{}", "a".repeat(MAX_REDIRECT_PATH_BYTES))),
            format!("{AT}.platformOidc.redirectPath")
        );
        let mut path = with_oidc();
        oidc(&mut path.apps[0].versions[0].template).redirect_path = format!("/{}", "a".repeat(MAX_REDIRECT_PATH_BYTES - 1));
        assert_eq!(path.validate(), Ok(()), "200 bytes");
        oidc(&mut path.apps[0].versions[0].template).redirect_path = "/".into();
        assert_eq!(path.validate(), Ok(()));
        // the variables: names, distinct, not the template's own
        for bad in ["", "issuer", "1ISSUER", "OIDC-ISSUER", "OIDC ISSUER", &"A".repeat(65)] {
            assert_eq!(field(&|t| oidc(t).issuer_variable = bad.into()), format!("{AT}.platformOidc.issuerVariable"), "{bad:?}");
        }
        assert_eq!(field(&|t| oidc(t).client_id_variable = "x".into()), format!("{AT}.platformOidc.clientIdVariable"));
        assert_eq!(field(&|t| oidc(t).client_secret_variable = "".into()), format!("{AT}.platformOidc.clientSecretVariable"));
        assert_eq!(
            field(&|t| oidc(t).client_secret_variable = "GF_AUTH_GENERIC_OAUTH_CLIENT_ID".into()),
            format!("{AT}.platformOidc.clientSecretVariable")
        );
        assert_eq!(
            field(&|t| oidc(t).client_id_variable = "GF_AUTH_GENERIC_OAUTH_ISSUER".into()),
            format!("{AT}.platformOidc.clientIdVariable")
        );
        assert_eq!(
            field(&|t| {
                t.environment.insert("GF_AUTH_GENERIC_OAUTH_CLIENT_ID".into(), "grafana".into());
            }),
            format!("{AT}.platformOidc.clientIdVariable")
        );
        let mut names = with_oidc();
        let o = oidc(&mut names.apps[0].versions[0].template);
        (o.issuer_variable, o.client_id_variable, o.client_secret_variable) = ("_I".into(), "A".repeat(64), "S9_".into());
        assert_eq!(names.validate(), Ok(()));
    }

    #[test]
    fn newest_and_upgrades_skip_withdrawn_and_prereleases() {
        let mut a = app("wiki", &["1.0.0", "1.2.0", "1.1.0", "2.0.0-rc.1", "1.3.0"]);
        a.versions[4].withdrawn = Some(Withdrawal { reason: "broken".into() });
        let v = |s: &str| s.parse::<Version>().unwrap();
        let names = |vs: Vec<&AppVersion>| vs.iter().map(|v| v.version.to_string()).collect::<Vec<_>>();
        assert_eq!(a.newest().unwrap().version, v("1.2.0"));
        assert_eq!(names(a.upgrades_from(&v("1.0.0"))), ["1.1.0", "1.2.0"]);
        assert_eq!(names(a.upgrades_from(&v("1.2.0"))), Vec::<String>::new());
        assert_eq!(names(a.upgrades_from(&v("1.3.0"))), Vec::<String>::new(), "a withdrawn version's service has nothing newer offered");
        assert_eq!(names(a.upgrades_from(&v("2.0.0-beta.1"))), ["2.0.0-rc.1"]);
        assert_eq!(names(a.offered()), ["2.0.0-rc.1", "1.2.0", "1.1.0", "1.0.0"]);
        assert!(a.version(&v("1.3.0")).unwrap().is_withdrawn(), "a withdrawn version is still there");
        let pre = app("beta", &["0.1.0-alpha.1", "0.1.0-alpha.2"]);
        assert_eq!(pre.newest().unwrap().version, v("0.1.0-alpha.2"));
        let mut gone = app("gone", &["1.0.0"]);
        gone.versions[0].withdrawn = Some(Withdrawal { reason: "x".into() });
        assert!(gone.newest().is_none());
    }

    #[test]
    fn a_snapshot_fits_the_inventory_bound_and_checks_its_digest() {
        let a = app("wiki", &["1.0.0"]);
        let snapshot = Snapshot::of(&a, &a.versions[0], 7);
        assert!(snapshot.is_consistent());
        let value = snapshot.to_value();
        assert_eq!(value["appId"], "wiki");
        assert_eq!(value["version"], "1.0.0");
        assert_eq!(value["catalogRevision"], 7);
        assert_eq!(serde_json::from_value::<Snapshot>(value).unwrap(), snapshot);
        let mut edited = snapshot.clone();
        edited.template.image = "evil".into();
        assert!(!edited.is_consistent());
        // the largest template still fits 64 KiB as a snapshot
        let mut big = a.clone();
        let mut i = 0;
        while big.versions[0].template.canonical_json().len() < MAX_TEMPLATE_BYTES - 200 {
            big.versions[0].template.environment.insert(format!("K{i}"), "\t".repeat(100));
            i += 1;
        }
        let snapshot = Snapshot::of(&big, &big.versions[0], u64::MAX);
        assert!(snapshot.to_value().to_string().len() <= 64 * 1024);
    }
}
