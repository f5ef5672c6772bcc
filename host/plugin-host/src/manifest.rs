//! The plugin manifest, `capstan-plugin.toml`: who the plugin is, which WIT world it targets, the
//! capabilities it requests and the limits it runs under.
//!
//! Parsing is strict: an unknown key, a wrong type, an id outside the grammar or a capability the
//! host does not know is refused by name, so what an operator approves is exactly what runs.
//!
//! ```toml
//! [plugin]
//! id = "example"
//! name = "Example"
//! version = "0.1.0"
//! wit = "capstan:plugin@0.3.6"
//! description = "What it manages"
//! publisher = "Example Corp"          # optional display name
//!
//! [capabilities]
//! requested = ["store", "log", "http:https://catalog.example.com"]
//!
//! [limits]                            # optional
//! memory-mib = 64                     # per instance; default 64, at most 1024
//! concurrency = 16                    # concurrent instances; default 16, at most 256
//! reuse-instances = "reads"           # default "never"; see `InstanceReuse`
//!
//! [[commands]]                        # optional: commands of the CLI (`crate::commands`)
//! name = "example greet"
//! about = "Greet someone"
//! method = "greet"
//! args = [{ name = "who", field = "name", positional = true, required = true }]
//! ```

use crate::refusal::{Refusal, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::json;
use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// The contract `capstan plugin new` and the SDK target (`wit/0.3.6`); it also serves plugins
/// built for 0.3.0 to 0.3.5 (a patch adds to the contract, so the older names resolve to it).
pub const CURRENT_WIT: &str = capstan_core::build::PLUGIN_CONTRACT;
/// The 0.2 contract (`wit/0.2.4`), served through its adapter; plugins built for 0.2.0 to
/// 0.2.3 run on it too (a patch adds to the contract, so the older names resolve to it).
pub const WIT_0_2: &str = "capstan:plugin@0.2.4";
/// The first contract (`wit/0.1.0`), still served through its adapter.
pub const WIT_0_1: &str = "capstan:plugin@0.1.0";
/// Every contract this host serves, newest first.
pub const SUPPORTED_WITS: &[&str] = &[CURRENT_WIT, WIT_0_2, WIT_0_1];

/// The file name of the manifest, in a plugin crate and inside a bundle.
pub const MANIFEST_FILE: &str = "capstan-plugin.toml";

/// Ids a plugin may not take: the host's own API namespaces and pages, and the areas of the
/// host's events. A plugin's methods are `<id>.<verb>` and its events `<id>.<name>`, so a
/// plugin under one of these could pass its methods or events off as the host's.
pub const RESERVED_IDS: &[&str] = &[
    "capstan",
    "system",
    "host",
    "auth",
    "admin",
    "api",
    "dashboard",
    "plugin",
    "plugins",
    "fleet",
    "node",
    "nodes",
    "secret",
    "secrets",
    "secretset",
    "organization",
    "organizations",
    "cluster",
    "clusters",
    "service",
    "services",
    "settings",
    "task",
    "tasks",
    "event",
    "events",
    "inventory",
    "deployer",
    "deployers",
    "migration",
    "migrations",
    "user",
    "users",
    "registry",
    "agent",
    "agents",
];

/// The word an operator may approve instead of listing every requested capability.
pub const ALL_REQUESTED: &str = "all-requested";

/// Linear memory per instance when `limits.memory-mib` is not set, MiB.
pub const DEFAULT_MEMORY_MIB: u32 = 64;
/// The most `limits.memory-mib` may ask for, MiB.
pub const MAX_MEMORY_MIB: u32 = 1024;
/// Instances running at once when `limits.concurrency` is not set.
pub const DEFAULT_CONCURRENCY: u32 = 16;
/// The most `limits.concurrency` may ask for.
pub const MAX_CONCURRENCY: u32 = 256;

const MAX_NAME_CHARS: usize = 64;
const MAX_DESCRIPTION_CHARS: usize = 2048;
const MAX_PUBLISHER_CHARS: usize = 128;
const MAX_CAPABILITY_CHARS: usize = 300;

/// A parsed, validated manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The plugin's id: it prefixes the plugin's methods, collections and blobs.
    pub id: String,
    /// The display name.
    pub name: String,
    /// The plugin's semantic version; upgrades must raise it.
    #[serde(serialize_with = "serialize_display")]
    pub version: semver::Version,
    /// The WIT world the plugin targets, like `capstan:plugin@0.1.0`.
    pub wit: String,
    /// What the plugin does; empty when the manifest has none.
    pub description: String,
    /// The publisher's display name, unverified (the bundle's signer is what counts).
    pub publisher: Option<String>,
    /// The requested capabilities, sorted (canonical order) and without duplicates.
    pub capabilities: Vec<Capability>,
    /// The `[limits]` table, with defaults for what it leaves out.
    pub limits: Limits,
    /// The commands it adds to the `capstan` command line (`[[commands]]`, [`crate::commands`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<crate::commands::CommandDecl>,
}

/// Per-plugin resource limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Linear memory per instance, MiB.
    pub memory_mib: u32,
    /// Instances of this plugin running at once.
    pub concurrency: u32,
    /// Whether an instance may serve more than one call.
    #[serde(default)]
    pub reuse_instances: InstanceReuse,
}

/// `limits.reuse-instances`: whether the host may keep an instance for the next call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceReuse {
    /// Every call runs in a fresh instance (the default).
    #[default]
    Never,
    /// An instance that answered a method declared read-only, without trapping or printing, may
    /// serve the next read-only call of the same authenticated caller (same user, kind and
    /// roles), so what the plugin keeps in memory can survive between that caller's reads and
    /// never reaches another caller. Writes, events, passes, tasks, migrations and anonymous
    /// calls still get a fresh instance each.
    Reads,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { memory_mib: DEFAULT_MEMORY_MIB, concurrency: DEFAULT_CONCURRENCY, reuse_instances: InstanceReuse::Never }
    }
}

impl Limits {
    /// The most memory the plugin's instances can take together: memory × concurrency, MiB.
    pub fn memory_ceiling_mib(&self) -> u64 {
        u64::from(self.memory_mib) * u64::from(self.concurrency)
    }

    /// What an operator approves, in one line: per instance, instances, and the ceiling
    /// (the host holds at most as much again for the instances' calls).
    pub fn summary(&self) -> String {
        let reuse = match self.reuse_instances {
            InstanceReuse::Never => "",
            InstanceReuse::Reads => "; an instance may serve several read-only calls of one caller",
        };
        format!(
            "{} MiB memory per instance × {} concurrent instances: up to {} MiB, and the host holds at most as much again for their calls{reuse}",
            self.memory_mib,
            self.concurrency,
            self.memory_ceiling_mib()
        )
    }
}

fn serialize_display<T: fmt::Display, S: Serializer>(value: &T, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(value)
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::new("manifest-invalid", message)
}

fn invalid_key(key: &str, message: impl Into<String>) -> Refusal {
    invalid(message).with_data(json!({ "key": key }))
}

impl Manifest {
    /// Parse and validate `capstan-plugin.toml`.
    ///
    /// Refuses `manifest-invalid` (not TOML, an unknown key — named —, a missing or mistyped field,
    /// a bad version, limits out of range, a duplicated capability), `plugin-id-invalid` and
    /// `capability-unknown`.
    pub fn parse(text: &str) -> Result<Manifest> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let at = e.span().map(|span| format!(" (line {})", text[..span.start.min(text.len())].matches('\n').count() + 1));
            invalid(format!("{MANIFEST_FILE} is not valid TOML{}: {}", at.unwrap_or_default(), e.message().trim()))
        })?;
        let mut top = Section { prefix: "", table };
        let plugin = top.take_table("plugin")?.ok_or_else(|| invalid_key("plugin", format!("{MANIFEST_FILE} has no [plugin] table")))?;
        let capabilities = top.take_table("capabilities")?;
        let limits = top.take_table("limits")?;
        let commands = top.table.remove("commands").map(crate::commands::parse).transpose()?.unwrap_or_default();
        top.finish()?;

        let mut plugin = Section { prefix: "plugin.", table: plugin };
        let id = plugin.required_str("id")?;
        let name = plugin.required_str("name")?;
        let version = plugin.required_str("version")?;
        let wit = plugin.required_str("wit")?;
        let description = plugin.take_str("description")?.unwrap_or_default();
        let publisher = plugin.take_str("publisher")?;
        plugin.finish()?;

        check_plugin_id(&id)?;
        check_text("plugin.name", &name, MAX_NAME_CHARS, false)?;
        if name.trim().is_empty() {
            return Err(invalid_key("plugin.name", "plugin.name must not be empty"));
        }
        check_text("plugin.description", &description, MAX_DESCRIPTION_CHARS, true)?;
        if let Some(publisher) = &publisher {
            check_text("plugin.publisher", publisher, MAX_PUBLISHER_CHARS, false)?;
            if publisher.trim().is_empty() {
                return Err(invalid_key("plugin.publisher", "plugin.publisher must not be empty when present"));
            }
        }
        let version = semver::Version::parse(&version)
            .map_err(|e| invalid_key("plugin.version", format!("plugin.version {version:?} is not a semantic version like 0.1.0: {e}")))?;
        parse_wit(&wit)?;

        let mut requested = Vec::new();
        if let Some(table) = capabilities {
            let mut section = Section { prefix: "capabilities.", table };
            requested = section.take_str_array("requested")?.unwrap_or_default();
            section.finish()?;
        }
        let mut set = BTreeSet::new();
        for text in &requested {
            let capability: Capability = text.parse()?;
            if !set.insert(capability) {
                return Err(invalid_key("capabilities.requested", format!("capabilities.requested lists {text:?} more than once"))
                    .with_data(json!({ "key": "capabilities.requested", "capability": text })));
            }
        }

        let mut parsed_limits = Limits::default();
        if let Some(table) = limits {
            let mut section = Section { prefix: "limits.", table };
            if let Some(v) = section.take_int("memory-mib")? {
                parsed_limits.memory_mib = in_range("limits.memory-mib", v, MAX_MEMORY_MIB, "MiB")?;
            }
            if let Some(v) = section.take_int("concurrency")? {
                parsed_limits.concurrency = in_range("limits.concurrency", v, MAX_CONCURRENCY, "instances")?;
            }
            if let Some(v) = section.take_str("reuse-instances")? {
                parsed_limits.reuse_instances = match v.as_str() {
                    "never" => InstanceReuse::Never,
                    "reads" => InstanceReuse::Reads,
                    _ => {
                        return Err(invalid_key(
                            "limits.reuse-instances",
                            format!(
                                "limits.reuse-instances must be \"never\" or \"reads\"; it is {:?}",
                                v.chars().take(40).collect::<String>()
                            ),
                        ));
                    }
                };
            }
            section.finish()?;
        }

        Ok(Manifest {
            id,
            name,
            version,
            wit,
            description,
            publisher,
            capabilities: set.into_iter().collect(),
            limits: parsed_limits,
            commands,
        })
    }

    /// The version of the WIT world the plugin targets (`0.1.0` in `capstan:plugin@0.1.0`).
    pub fn wit_version(&self) -> semver::Version {
        // `parse` validated it; a hand-built manifest with a bad `wit` reads as 0.0.0, which no
        // host serves
        parse_wit(&self.wit).map(|(_, v)| v).unwrap_or_else(|_| semver::Version::new(0, 0, 0))
    }

    /// Refuse `wit-version-unsupported` unless this host serves the world the plugin targets.
    pub fn check_wit_supported(&self) -> Result<()> {
        served_wit(&self.wit).map(|_| ())
    }

    /// The requested capabilities in canonical text form, sorted.
    pub fn requested_set(&self) -> BTreeSet<String> {
        self.capabilities.iter().map(Capability::to_string).collect()
    }

    /// The requested capabilities as a set (what [`check_approval`] takes).
    pub fn capability_set(&self) -> BTreeSet<Capability> {
        self.capabilities.iter().cloned().collect()
    }
}

/// Refuse `plugin-id-invalid` unless `id` matches `^[a-z][a-z0-9-]{1,38}[a-z0-9]$`, and
/// `plugin-id-reserved` when it is one of [`RESERVED_IDS`].
pub fn check_plugin_id(id: &str) -> Result<()> {
    let refuse = |why: &str| {
        Refusal::new("plugin-id-invalid", format!("plugin id {id:?} {why}"))
            .with_data(json!({ "id": id.chars().take(64).collect::<String>() }))
    };
    let bytes = id.as_bytes();
    if !(3..=40).contains(&bytes.len()) {
        return Err(refuse("must be 3 to 40 characters"));
    }
    if !bytes[0].is_ascii_lowercase() {
        return Err(refuse("must start with a lower-case letter"));
    }
    if !bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-') {
        return Err(refuse("may contain only lower-case letters, digits and '-'"));
    }
    if bytes[bytes.len() - 1] == b'-' {
        return Err(refuse("must not end with '-'"));
    }
    if RESERVED_IDS.contains(&id) {
        return Err(Refusal::new("plugin-id-reserved", format!("plugin id {id:?} is reserved for the host's own methods and events"))
            .with_data(json!({ "id": id })));
    }
    Ok(())
}

/// Split `namespace:package@version`, checking the syntax only (`manifest-invalid`).
fn parse_wit(wit: &str) -> Result<(&str, semver::Version)> {
    let bad = || invalid_key("plugin.wit", format!("plugin.wit {wit:?} must look like {CURRENT_WIT:?}"));
    let (package, version) = wit.split_once('@').ok_or_else(bad)?;
    let (namespace, name) = package.split_once(':').ok_or_else(bad)?;
    let word = |s: &str| {
        s.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if !word(namespace) || !word(name) {
        return Err(bad());
    }
    let version = semver::Version::parse(version).map_err(|_| bad())?;
    Ok((package, version))
}

/// Refuse `wit-version-unsupported` unless this host serves `wit`.
pub fn check_wit_supported(wit: &str) -> Result<()> {
    served_wit(wit).map(|_| ())
}

/// The contract of [`SUPPORTED_WITS`] that serves a plugin targeting `wit`: one of the same
/// package, the same major (and, before 1.0, the same minor) and a patch no older than the
/// plugin's. Pre-release worlds must match exactly. Else `wit-version-unsupported`.
pub fn served_wit(wit: &str) -> Result<&'static str> {
    let refuse = |why: &str| {
        Refusal::new("wit-version-unsupported", format!("the plugin targets {wit}, {why}; this host serves {}", SUPPORTED_WITS.join(", ")))
            .with_data(json!({ "wit": wit, "supported": SUPPORTED_WITS }))
    };
    if let Some(exact) = SUPPORTED_WITS.iter().find(|served| **served == wit) {
        return Ok(exact);
    }
    let (package, version) = parse_wit(wit).map_err(|_| refuse("which is not a WIT world name"))?;
    if !version.pre.is_empty() || !version.build.is_empty() {
        return Err(refuse("a pre-release world this host does not serve"));
    }
    let serves = |served: &&&str| {
        let Ok((host_package, host)) = parse_wit(served) else { return false };
        host_package == package
            && version.major == host.major
            && if host.major == 0 {
                version.minor == host.minor && version.patch <= host.patch
            } else {
                version.minor <= host.minor && (version.minor < host.minor || version.patch <= host.patch)
            }
    };
    match SUPPORTED_WITS.iter().find(serves) {
        Some(served) => Ok(served),
        None if SUPPORTED_WITS.iter().all(|served| parse_wit(served).is_ok_and(|(p, _)| p != package)) => {
            Err(refuse("a different WIT package"))
        }
        None => Err(refuse("a version this host does not serve")),
    }
}

fn check_text(key: &str, value: &str, max_chars: usize, allow_newlines: bool) -> Result<()> {
    if value.chars().count() > max_chars {
        return Err(invalid_key(key, format!("{key} is longer than {max_chars} characters")));
    }
    if value.chars().any(|c| c.is_control() && !(allow_newlines && c == '\n')) {
        return Err(invalid_key(key, format!("{key} must not contain control characters")));
    }
    Ok(())
}

fn in_range(key: &str, value: i64, max: u32, unit: &str) -> Result<u32> {
    match u32::try_from(value) {
        Ok(v) if (1..=max).contains(&v) => Ok(v),
        _ => Err(invalid_key(key, format!("{key} must be between 1 and {max} ({unit}); it is {value}"))),
    }
}

/// One TOML table being consumed key by key; what is left at `finish` is unknown.
struct Section {
    prefix: &'static str,
    table: toml::Table,
}

impl Section {
    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn take_table(&mut self, key: &str) -> Result<Option<toml::Table>> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Table(t)) => Ok(Some(t)),
            Some(_) => Err(invalid_key(key, format!("[{key}] must be a table"))),
        }
    }

    fn take_str(&mut self, key: &str) -> Result<Option<String>> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(invalid_key(&self.key(key), format!("{} must be a string", self.key(key)))),
        }
    }

    fn required_str(&mut self, key: &str) -> Result<String> {
        self.take_str(key)?.ok_or_else(|| invalid_key(&self.key(key), format!("{} is required", self.key(key))))
    }

    fn take_int(&mut self, key: &str) -> Result<Option<i64>> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Integer(i)) => Ok(Some(i)),
            Some(_) => Err(invalid_key(&self.key(key), format!("{} must be an integer", self.key(key)))),
        }
    }

    fn take_str_array(&mut self, key: &str) -> Result<Option<Vec<String>>> {
        let full = self.key(key);
        let not_strings = || invalid_key(&full, format!("{full} must be an array of strings"));
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Array(items)) => items
                .into_iter()
                .map(|v| match v {
                    toml::Value::String(s) => Ok(s),
                    _ => Err(not_strings()),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(not_strings()),
        }
    }

    fn finish(self) -> Result<()> {
        match self.table.keys().next() {
            None => Ok(()),
            Some(key) => {
                let full = self.key(key);
                Err(invalid_key(&full, format!("unknown key {full:?} in {MANIFEST_FILE}")))
            }
        }
    }
}

/// A capability a plugin may request and an operator may approve. Its text form (`Display` /
/// `FromStr`, and serde) is canonical: parsing accepts only the form `Display` prints.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Capability {
    /// `store`: the plugin's own collections.
    Store,
    /// `inventory:read`: read the platform model.
    InventoryRead,
    /// `inventory:write-services`: the narrow write the service managers need.
    InventoryWriteServices,
    /// `secrets:<scope>`: write and use secrets within a management scope.
    Secrets(String),
    /// `secrets-reveal:<scope>`: read secret values within a management scope.
    SecretsReveal(String),
    /// `blobs`: the plugin's own blob prefix.
    Blobs,
    /// `http:<origin>`: outbound HTTP to one origin (`https://host[:port]`).
    Http(String),
    /// `http-setting:<key>`: outbound HTTP to the origins of the URLs the operator lists in
    /// the public setting `<key>` (for sources only the operator knows, such as
    /// `appStoreCatalogSources`), as they stand at each request.
    HttpSetting(String),
    /// `agents`: call named methods on connected cluster relays.
    Agents,
    /// `runtime:read`: where services' replicas run and whether they are ready (contract
    /// 0.3.1 on).
    RuntimeRead,
    /// `runtime:write`: set the runtime spec of a service the acting identity may write
    /// (contract 0.3.2 on).
    RuntimeWrite,
    /// `gateway:<scope>` (`gateway:routes:write`): requests to the external gateway under
    /// Capstan's enrolled client credential, on the paths that gateway scope covers
    /// ([`capstan_core::gateway_scopes`]); the scope is one of the six the credential holds.
    Gateway(String),
    /// `storage`: databases and buckets for services on their nodes' storage endpoints,
    /// provisioned by the host with credentials the plugin never sees (contract 0.3.6 on).
    Storage,
    /// `events:publish`.
    EventsPublish,
    /// `sign`: the host signs with a key the plugin never sees.
    Sign,
    /// `log`.
    Log,
}

impl Capability {
    /// The origin of an `http:` capability.
    pub fn http_origin(&self) -> Option<&str> {
        match self {
            Capability::Http(origin) => Some(origin),
            _ => None,
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capability::Store => f.write_str("store"),
            Capability::InventoryRead => f.write_str("inventory:read"),
            Capability::InventoryWriteServices => f.write_str("inventory:write-services"),
            Capability::Secrets(scope) => write!(f, "secrets:{scope}"),
            Capability::SecretsReveal(scope) => write!(f, "secrets-reveal:{scope}"),
            Capability::Blobs => f.write_str("blobs"),
            Capability::Http(origin) => write!(f, "http:{origin}"),
            Capability::HttpSetting(key) => write!(f, "http-setting:{key}"),
            Capability::Agents => f.write_str("agents"),
            Capability::RuntimeRead => f.write_str("runtime:read"),
            Capability::RuntimeWrite => f.write_str("runtime:write"),
            Capability::Gateway(scope) => write!(f, "gateway:{scope}"),
            Capability::Storage => f.write_str("storage"),
            Capability::EventsPublish => f.write_str("events:publish"),
            Capability::Sign => f.write_str("sign"),
            Capability::Log => f.write_str("log"),
        }
    }
}

/// A setting key a grant may name: a host key (`[A-Za-z][A-Za-z0-9]*`) or `<pluginId>.<key>`.
fn valid_setting_ref(text: &str) -> bool {
    let word = |w: &str| w.starts_with(|c: char| c.is_ascii_alphabetic()) && w.chars().all(|c| c.is_ascii_alphanumeric());
    match text.split_once('.') {
        None => word(text),
        Some((plugin, key)) => check_plugin_id(plugin).is_ok() && word(key),
    }
}

/// `capability-unknown`: `http-setting:<key>` names a key that is not a setting listing URLs.
pub fn not_a_url_setting(key: &str) -> Refusal {
    let shown: String = format!("http-setting:{key}").chars().take(MAX_CAPABILITY_CHARS).collect();
    Refusal::new("capability-unknown", format!("capability {shown:?}: {key:?} is not a setting that lists URLs"))
        .with_data(json!({ "capability": shown }))
}

impl FromStr for Capability {
    type Err = Refusal;

    /// Refuses `capability-unknown`, naming the text and what is wrong with it.
    fn from_str(s: &str) -> Result<Capability> {
        let shown: String = s.chars().take(MAX_CAPABILITY_CHARS).collect();
        let refuse = |why: String| Refusal::new("capability-unknown", why).with_data(json!({ "capability": shown }));
        if s.len() > MAX_CAPABILITY_CHARS {
            return Err(refuse(format!("capability {shown:?}… is longer than {MAX_CAPABILITY_CHARS} characters")));
        }
        let simple = match s {
            "store" => Some(Capability::Store),
            "inventory:read" => Some(Capability::InventoryRead),
            "inventory:write-services" => Some(Capability::InventoryWriteServices),
            "blobs" => Some(Capability::Blobs),
            "agents" => Some(Capability::Agents),
            "runtime:read" => Some(Capability::RuntimeRead),
            "runtime:write" => Some(Capability::RuntimeWrite),
            "storage" => Some(Capability::Storage),
            "events:publish" => Some(Capability::EventsPublish),
            "sign" => Some(Capability::Sign),
            "log" => Some(Capability::Log),
            _ => None,
        };
        if let Some(capability) = simple {
            return Ok(capability);
        }
        let Some((kind, arg)) = s.split_once(':') else {
            return Err(refuse(format!("unknown capability {s:?}")));
        };
        match kind {
            "secrets" | "secrets-reveal" => {
                if !valid_scope(arg) {
                    return Err(refuse(format!(
                        "capability {s:?}: the scope must be a lower-case letter then up to 31 lower-case letters, digits or '-'"
                    )));
                }
                Ok(if kind == "secrets" { Capability::Secrets(arg.to_string()) } else { Capability::SecretsReveal(arg.to_string()) })
            }
            "http" => match check_origin(arg) {
                Ok(()) => Ok(Capability::Http(arg.to_string())),
                Err(why) => Err(refuse(format!("capability {s:?}: the origin {why}"))),
            },
            // a host setting or `<pluginId>.<key>`; which list URLs is known once the plugin is
            // prepared (the platform's, or what the plugin's `describe` declares)
            "http-setting" if valid_setting_ref(arg) => Ok(Capability::HttpSetting(arg.to_string())),
            "http-setting" => Err(not_a_url_setting(arg)),
            "gateway" => match capstan_core::gateway_scopes::scope(arg) {
                Some(scope) => Ok(Capability::Gateway(scope.name.to_string())),
                None => Err(refuse(format!(
                    "capability {s:?}: the gateway scope must be one of {}",
                    capstan_core::gateway_scopes::NAMES.join(", ")
                ))),
            },
            _ => Err(refuse(format!("unknown capability {s:?}"))),
        }
    }
}

impl PartialOrd for Capability {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Ordered by the canonical text, so a set of capabilities sorts as its strings do.
impl Ord for Capability {
    fn cmp(&self, other: &Self) -> Ordering {
        self.to_string().cmp(&other.to_string())
    }
}

impl Serialize for Capability {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Capability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|r: Refusal| serde::de::Error::custom(r.message))
    }
}

fn valid_scope(scope: &str) -> bool {
    let b = scope.as_bytes();
    (1..=32).contains(&b.len()) && b[0].is_ascii_lowercase() && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// Accept only a canonical origin: `http` or `https`, a lower-case host name, IPv4 address or
/// bracketed IPv6 address, and an optional non-default port; nothing after it.
fn check_origin(origin: &str) -> std::result::Result<(), String> {
    let (rest, default_port) = if let Some(rest) = origin.strip_prefix("https://") {
        (rest, 443)
    } else if let Some(rest) = origin.strip_prefix("http://") {
        (rest, 80)
    } else {
        return Err("must start with https:// or http:// (lower-case)".into());
    };
    if rest.is_empty() {
        return Err("has no host".into());
    }
    if rest.ends_with('/') {
        return Err("must not end with '/'".into());
    }
    if let Some(c) = rest.chars().find(|c| matches!(c, '/' | '?' | '#' | '@' | '\\')) {
        return Err(format!("must be scheme, host and port only (found {c:?})"));
    }
    let (host, port) = if let Some(after_bracket) = rest.strip_prefix('[') {
        let (inner, after) = after_bracket.split_once(']').ok_or("has an unclosed '['")?;
        let addr: Ipv6Addr = inner.parse().map_err(|_| format!("has an invalid IPv6 address {inner:?}"))?;
        if addr.to_string() != inner {
            return Err(format!("must write the IPv6 address in its canonical form [{addr}]"));
        }
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or("has text after the IPv6 address")?),
        };
        (None, port)
    } else {
        match rest.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(rest), None),
        }
    };
    if let Some(host) = host {
        check_host(host)?;
    }
    if let Some(port) = port {
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.starts_with('0') || port.len() > 5 {
            return Err(format!("has an invalid port {port:?}"));
        }
        let n: u32 = port.parse().map_err(|_| format!("has an invalid port {port:?}"))?;
        if n > 65535 {
            return Err(format!("has an invalid port {port:?}"));
        }
        if n == default_port {
            return Err(format!("must omit the scheme's default port {n}"));
        }
    }
    Ok(())
}

fn check_host(host: &str) -> std::result::Result<(), String> {
    if host.is_empty() {
        return Err("has no host".into());
    }
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err("must be lower-case".into());
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let addr: Ipv4Addr = host.parse().map_err(|_| format!("has an invalid IPv4 address {host:?}"))?;
        if addr.to_string() != host {
            return Err(format!("must write the IPv4 address in its canonical form {addr}"));
        }
        return Ok(());
    }
    if host.len() > 253 {
        return Err("has a host name longer than 253 characters".into());
    }
    for label in host.split('.') {
        let ok = (1..=63).contains(&label.len())
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!("has an invalid host name {host:?}"));
        }
    }
    Ok(())
}

/// Check an operator's approval against the requested set. `approved` is either exactly
/// `["all-requested"]` or the requested capabilities exactly (any order); anything else is
/// refused `capabilities-not-approved` with `{ requested, approved, missing, extra }`.
pub fn check_approval(requested: &BTreeSet<Capability>, approved: &[String]) -> Result<BTreeSet<Capability>> {
    if approved.len() == 1 && approved[0] == ALL_REQUESTED {
        return Ok(requested.clone());
    }
    let requested_text: BTreeSet<String> = requested.iter().map(Capability::to_string).collect();
    let mut approved_set = BTreeSet::new();
    let mut extra = BTreeSet::new();
    for text in approved {
        match text.parse::<Capability>() {
            Ok(capability) if requested.contains(&capability) => {
                approved_set.insert(capability);
            }
            _ => {
                extra.insert(text.clone());
            }
        }
    }
    let missing: Vec<String> = requested.iter().filter(|c| !approved_set.contains(*c)).map(Capability::to_string).collect();
    if missing.is_empty() && extra.is_empty() {
        return Ok(approved_set);
    }
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("not approved: {}", missing.join(", ")));
    }
    if !extra.is_empty() {
        parts.push(format!("approved but not requested: {}", extra.iter().cloned().collect::<Vec<_>>().join(", ")));
    }
    Err(Refusal::new(
        "capabilities-not-approved",
        format!("the approval must be exactly the requested capabilities (or {ALL_REQUESTED}); {}", parts.join("; ")),
    )
    .with_data(json!({
        "requested": requested_text,
        "approved": approved,
        "missing": missing,
        "extra": extra,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const GOOD: &str = r#"
[plugin]
id = "example"
name = "Example"
version = "0.1.0"
wit = "capstan:plugin@0.1.0"
description = "An example"
publisher = "Example Corp"

[capabilities]
requested = ["store", "log", "events:publish", "http:https://catalog.example.com"]

[limits]
memory-mib = 128
concurrency = 4
"#;

    fn code(text: &str) -> String {
        Manifest::parse(text).unwrap_err().code.to_string()
    }

    fn with_plugin(extra: &str) -> String {
        format!("[plugin]\nid = \"example\"\nname = \"Example\"\nversion = \"0.1.0\"\nwit = \"capstan:plugin@0.1.0\"\n{extra}")
    }

    #[test]
    fn parses_a_good_manifest() {
        let m = Manifest::parse(GOOD).unwrap();
        assert_eq!(m.id, "example");
        assert_eq!(m.name, "Example");
        assert_eq!(m.version, semver::Version::new(0, 1, 0));
        assert_eq!(m.wit_version(), semver::Version::new(0, 1, 0));
        assert_eq!(m.publisher.as_deref(), Some("Example Corp"));
        assert_eq!(m.limits, Limits { memory_mib: 128, concurrency: 4, reuse_instances: InstanceReuse::Never });
        assert_eq!(m.limits.memory_ceiling_mib(), 512);
        assert!(
            m.limits.summary().starts_with("128 MiB memory per instance × 4 concurrent instances: up to 512 MiB"),
            "{}",
            m.limits.summary()
        );
        let texts: Vec<String> = m.capabilities.iter().map(|c| c.to_string()).collect();
        assert_eq!(texts, ["events:publish", "http:https://catalog.example.com", "log", "store"], "sorted canonically");
        assert_eq!(m.requested_set().into_iter().collect::<Vec<_>>(), texts);
        m.check_wit_supported().unwrap();
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["version"], "0.1.0");
        assert_eq!(json["limits"]["memoryMib"], 128);
        assert_eq!(json["capabilities"][1], "http:https://catalog.example.com");
    }

    #[test]
    fn minimal_manifest_gets_defaults() {
        let m = Manifest::parse(&with_plugin("")).unwrap();
        assert_eq!(m.limits, Limits { memory_mib: 64, concurrency: 16, reuse_instances: InstanceReuse::Never });
        assert!(m.capabilities.is_empty());
        assert_eq!(m.description, "");
        assert_eq!(m.publisher, None);
    }

    #[test]
    fn reuse_instances_is_never_unless_reads_is_asked_for() {
        let m = Manifest::parse(&format!("{}\n[limits]\nreuse-instances = \"reads\"\n", with_plugin(""))).unwrap();
        assert_eq!(m.limits.reuse_instances, InstanceReuse::Reads);
        assert!(m.limits.summary().ends_with("an instance may serve several read-only calls of one caller"), "{}", m.limits.summary());
        assert_eq!(serde_json::to_value(m.limits).unwrap()["reuseInstances"], "reads");
        let never = Manifest::parse(&format!("{}\n[limits]\nreuse-instances = \"never\"\n", with_plugin(""))).unwrap();
        assert_eq!(never.limits, Limits::default());
        // a limits record stored before the key existed reads as never
        let stored: Limits = serde_json::from_value(json!({ "memoryMib": 64, "concurrency": 16 })).unwrap();
        assert_eq!(stored.reuse_instances, InstanceReuse::Never);
        for bad in ["\"always\"", "true", "\"Reads\""] {
            let err = Manifest::parse(&format!("{}\n[limits]\nreuse-instances = {bad}\n", with_plugin(""))).unwrap_err();
            assert_eq!(err.code, "manifest-invalid", "{bad}");
            assert_eq!(err.data.as_ref().unwrap()["key"], "limits.reuse-instances", "{bad}");
        }
    }

    #[test]
    fn refuses_unknown_keys_by_name() {
        for (text, key) in [
            (with_plugin("colour = \"red\""), "plugin.colour"),
            (format!("{}\n[extra]\n", with_plugin("")), "extra"),
            (format!("{}\n[capabilities]\nrequsted = []\n", with_plugin("")), "capabilities.requsted"),
            (format!("{}\n[limits]\nmemory_mib = 3\n", with_plugin("")), "limits.memory_mib"),
        ] {
            let err = Manifest::parse(&text).unwrap_err();
            assert_eq!(err.code, "manifest-invalid", "{text}");
            assert!(err.message.contains(key), "{} should name {key}", err.message);
            assert_eq!(err.data.as_ref().unwrap()["key"], key);
        }
    }

    #[test]
    fn refuses_bad_fields() {
        assert_eq!(code("not toml ["), "manifest-invalid");
        assert_eq!(code(""), "manifest-invalid");
        assert_eq!(code("plugin = 3"), "manifest-invalid");
        for missing in ["id", "name", "version", "wit"] {
            let text: String = with_plugin("").lines().filter(|l| !l.starts_with(&format!("{missing} ="))).collect::<Vec<_>>().join("\n");
            let err = Manifest::parse(&text).unwrap_err();
            assert_eq!(err.code, "manifest-invalid");
            assert!(err.message.contains(missing), "{}", err.message);
        }
        let replace = |from: &str, to: &str| with_plugin("").replace(from, to);
        assert_eq!(code(&replace("version = \"0.1.0\"", "version = \"1.0\"")), "manifest-invalid");
        assert_eq!(code(&replace("version = \"0.1.0\"", "version = 1")), "manifest-invalid");
        assert_eq!(code(&replace("name = \"Example\"", "name = \"  \"")), "manifest-invalid");
        assert_eq!(code(&replace("name = \"Example\"", "name = \"a\\u0007b\"")), "manifest-invalid");
        assert_eq!(code(&replace("wit = \"capstan:plugin@0.1.0\"", "wit = \"0.1.0\"")), "manifest-invalid");
        assert_eq!(code(&replace("wit = \"capstan:plugin@0.1.0\"", "wit = \"capstan:plugin@x\"")), "manifest-invalid");
        assert_eq!(code(&with_plugin("publisher = \"\"")), "manifest-invalid");
        assert_eq!(code(&with_plugin(&format!("description = \"{}\"", "x".repeat(3000)))), "manifest-invalid");
        assert_eq!(code(&format!("{}\n[capabilities]\nrequested = \"store\"\n", with_plugin(""))), "manifest-invalid");
        assert_eq!(code(&format!("{}\n[capabilities]\nrequested = [1]\n", with_plugin(""))), "manifest-invalid");
        assert_eq!(
            code(&format!("{}\n[capabilities]\nrequested = [\"store\", \"log\", \"store\"]\n", with_plugin(""))),
            "manifest-invalid"
        );
        assert_eq!(code(&format!("{}\n[capabilities]\nrequested = [\"stor\"]\n", with_plugin(""))), "capability-unknown");
        for limits in
            ["memory-mib = 0", "memory-mib = 1025", "memory-mib = -1", "concurrency = 0", "concurrency = 257", "concurrency = \"2\""]
        {
            assert_eq!(code(&format!("{}\n[limits]\n{limits}\n", with_plugin(""))), "manifest-invalid", "{limits}");
        }
        let m = Manifest::parse(&format!("{}\n[limits]\nmemory-mib = 1024\nconcurrency = 256\n", with_plugin(""))).unwrap();
        assert_eq!(m.limits, Limits { memory_mib: 1024, concurrency: 256, reuse_instances: InstanceReuse::Never });
    }

    #[test]
    fn plugin_ids() {
        for good in ["abc", "mail", "app-store", "a1b", &format!("a{}", "b".repeat(39))] {
            check_plugin_id(good).unwrap();
        }
        for bad in ["", "ab", "1abc", "-abc", "abc-", "Abc", "ab_c", "ab.c", "abç", &format!("a{}", "b".repeat(40))] {
            assert_eq!(check_plugin_id(bad).unwrap_err().code, "plugin-id-invalid", "{bad}");
        }
        for reserved in RESERVED_IDS.iter().chain(&["capstan", "api", "dashboard", "service", "cluster", "node", "settings"]) {
            assert_eq!(check_plugin_id(reserved).unwrap_err().code, "plugin-id-reserved", "{reserved}");
        }
        let text = with_plugin("").replace("id = \"example\"", "id = \"admin\"");
        assert_eq!(code(&text), "plugin-id-reserved");
    }

    #[test]
    fn wit_versions() {
        for served in SUPPORTED_WITS {
            assert_eq!(served_wit(served).unwrap(), *served);
        }
        // a plugin of an earlier patch is served by the later one
        for earlier in ["0.2.0", "0.2.1", "0.2.2", "0.2.3"] {
            assert_eq!(served_wit(&format!("capstan:plugin@{earlier}")).unwrap(), WIT_0_2, "{earlier}");
        }
        assert_eq!(served_wit("capstan:plugin@0.3.0").unwrap(), CURRENT_WIT);
        assert_eq!(served_wit("capstan:plugin@0.3.1").unwrap(), CURRENT_WIT);
        assert_eq!(served_wit("capstan:plugin@0.3.2").unwrap(), CURRENT_WIT);
        assert_eq!(served_wit("capstan:plugin@0.3.3").unwrap(), CURRENT_WIT);
        assert_eq!(served_wit("capstan:plugin@0.3.4").unwrap(), CURRENT_WIT);
        assert_eq!(CURRENT_WIT, "capstan:plugin@0.3.6", "the contract the SDK and `capstan plugin new` target");
        for bad in [
            "capstan:plugin@0.1.1",
            "capstan:plugin@0.2.5",
            "capstan:plugin@0.3.7",
            "capstan:plugin@0.4.0",
            "capstan:plugin@0.0.9",
            "capstan:plugin@1.1.0",
            "capstan:plugin@0.1.0-rc.1",
            "capstan:other@0.1.0",
            "other:plugin@0.1.0",
            "nonsense",
        ] {
            assert_eq!(check_wit_supported(bad).unwrap_err().code, "wit-version-unsupported", "{bad}");
        }
        let m = Manifest::parse(&with_plugin("").replace("@0.1.0", "@0.4.0")).unwrap();
        assert_eq!(m.wit_version(), semver::Version::new(0, 4, 0));
        assert_eq!(m.check_wit_supported().unwrap_err().code, "wit-version-unsupported");
    }

    #[test]
    fn capabilities_round_trip() {
        for text in [
            "store",
            "inventory:read",
            "inventory:write-services",
            "secrets:mail",
            "secrets:a",
            "secrets-reveal:mail-relay-2",
            "blobs",
            "http:https://catalog.example.com",
            "http:http://localhost:8080",
            "http:https://10.0.0.1:8443",
            "http:https://[::1]:9000",
            "http:https://[2001:db8::1]",
            "agents",
            "runtime:read",
            "runtime:write",
            "gateway:domains:read",
            "gateway:routes:write",
            "gateway:certificates:read",
            "gateway:dns-records:write",
            "gateway:smtp:write",
            "gateway:peers:write",
            "events:publish",
            "sign",
            "log",
        ] {
            let c: Capability = text.parse().unwrap();
            assert_eq!(c.to_string(), text);
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<Capability>(&json).unwrap(), c);
        }
        assert_eq!("http:https://a.example".parse::<Capability>().unwrap().http_origin(), Some("https://a.example"));
        assert!(serde_json::from_str::<Capability>("\"stor\"").is_err());
    }

    #[test]
    fn capabilities_refused() {
        for text in [
            "",
            "stor",
            "Store",
            "store:x",
            "events",
            "events:subscribe",
            "inventory",
            "inventory:write",
            "secrets",
            "secrets:",
            "secrets:Mail",
            "secrets:1mail",
            "secrets:mail:x",
            "secrets:mail_x",
            &format!("secrets:a{}", "b".repeat(32)),
            "secrets-reveal:",
            "http:",
            "http:example.com",
            "http:ftp://example.com",
            "http:HTTPS://example.com",
            "http:https://Example.com",
            "http:https://example.com/",
            "http:https://example.com/path",
            "http:https://example.com?q",
            "http:https://example.com#f",
            "http:https://user@example.com",
            "http:https://",
            "http:https://:8080",
            "http:https://example.com:",
            "http:https://example.com:0",
            "http:https://example.com:08080",
            "http:https://example.com:65536",
            "http:https://example.com:443",
            "http:http://example.com:80",
            "http:https://example.com:8080:1",
            "http:https://-bad.example.com",
            "http:https://bad..example.com",
            "http:https://example.com.",
            "http:https://under_score.example",
            "http:https://256.1.1.1",
            "http:https://01.1.1.1",
            "http:https://[::1",
            "http:https://[::0:1]",
            "http:https://[::1]x",
            "http:https://[nonsense]",
            &format!("http:https://{}.example", "a".repeat(300)),
            "gateway",
            "gateway:",
            "gateway:routes",
            "gateway:routes:read",
            "gateway:Routes:write",
            "gateway:routes:write:x",
            "gateway:whoami",
            "gateway:clients:write",
            "gateway:*",
            "runtime",
            "runtime:",
            "runtime:delete",
            "runtime:read:x",
            "Runtime:read",
        ] {
            let err = text.parse::<Capability>().unwrap_err();
            assert_eq!(err.code, "capability-unknown", "{text}");
        }
    }

    #[test]
    fn capability_order_is_text_order() {
        let set: BTreeSet<Capability> =
            ["store", "log", "agents", "secrets:b", "secrets:a", "secrets-reveal:a"].iter().map(|s| s.parse().unwrap()).collect();
        let texts: Vec<String> = set.iter().map(|c| c.to_string()).collect();
        let mut sorted = texts.clone();
        sorted.sort();
        assert_eq!(texts, sorted);
    }

    fn set(items: &[&str]) -> BTreeSet<Capability> {
        items.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn approval_exact_and_all_requested() {
        let requested = set(&["store", "log", "http:https://a.example"]);
        assert_eq!(check_approval(&requested, &strings(&["log", "http:https://a.example", "store"])).unwrap(), requested);
        assert_eq!(check_approval(&requested, &strings(&["all-requested"])).unwrap(), requested);
        assert_eq!(check_approval(&BTreeSet::new(), &[]).unwrap(), BTreeSet::new());
        assert_eq!(check_approval(&BTreeSet::new(), &strings(&["all-requested"])).unwrap(), BTreeSet::new());
    }

    #[test]
    fn approval_missing_and_extra() {
        let requested = set(&["store", "log"]);
        let err = check_approval(&requested, &strings(&["store"])).unwrap_err();
        assert_eq!(err.code, "capabilities-not-approved");
        let data = err.data.unwrap();
        assert_eq!(data["missing"], json!(["log"]));
        assert_eq!(data["extra"], json!([]));
        assert_eq!(data["requested"], json!(["log", "store"]));
        assert_eq!(data["approved"], json!(["store"]));

        let err = check_approval(&requested, &strings(&["store", "log", "sign", "nonsense"])).unwrap_err();
        assert_eq!(err.code, "capabilities-not-approved");
        let data = err.data.unwrap();
        assert_eq!(data["missing"], json!([]));
        assert_eq!(data["extra"], json!(["nonsense", "sign"]));

        let err = check_approval(&requested, &[]).unwrap_err();
        assert_eq!(err.data.unwrap()["missing"], json!(["log", "store"]));
        let err = check_approval(&requested, &strings(&["all-requested", "store"])).unwrap_err();
        assert_eq!(err.data.unwrap()["extra"], json!(["all-requested"]));
    }
}

/// Property tests: `Manifest::parse` reads text a plugin's author wrote (inside an uploaded
/// bundle), so whatever it is given it answers a valid manifest or a refusal by one of its
/// documented names, never a panic.
#[cfg(test)]
mod proptests {
    use super::tests::GOOD;
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::{Index, select};

    /// Every refusal `Manifest::parse` documents.
    const CODES: &[&str] = &["manifest-invalid", "plugin-id-invalid", "plugin-id-reserved", "capability-unknown"];

    fn kebab(code: &str) -> bool {
        !code.is_empty()
            && !code.starts_with('-')
            && !code.ends_with('-')
            && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    /// Parse `text`: a refusal carries a documented code; a manifest keeps every rule.
    fn parse(text: &str) -> std::result::Result<Option<Manifest>, TestCaseError> {
        match Manifest::parse(text) {
            Ok(m) => {
                prop_assert!(check_plugin_id(&m.id).is_ok(), "id {:?}", m.id);
                prop_assert!(!m.name.trim().is_empty() && m.name.chars().count() <= MAX_NAME_CHARS);
                prop_assert!(!m.name.chars().any(char::is_control));
                prop_assert!(m.description.chars().count() <= MAX_DESCRIPTION_CHARS);
                prop_assert!(parse_wit(&m.wit).is_ok(), "wit {:?}", m.wit);
                prop_assert!(m.capabilities.windows(2).all(|w| w[0] < w[1]), "sorted, no duplicates: {:?}", m.capabilities);
                prop_assert!((1..=MAX_MEMORY_MIB).contains(&m.limits.memory_mib));
                prop_assert!((1..=MAX_CONCURRENCY).contains(&m.limits.concurrency));
                prop_assert_eq!(Manifest::parse(text).ok(), Some(m.clone()), "parsing is deterministic");
                Ok(Some(m))
            }
            Err(err) => {
                prop_assert!(kebab(&err.code), "code {:?} is not kebab-case", err.code);
                prop_assert!(CODES.contains(&err.code.as_ref()), "undocumented code {:?}: {}", err.code, err.message);
                prop_assert!(!err.message.is_empty());
                Ok(None)
            }
        }
    }

    /// A TOML value, well-formed or not, of the kinds a manifest holds.
    fn toml_value() -> impl Strategy<Value = String> {
        prop_oneof![
            "\\PC{0,24}".prop_map(|s| toml::Value::String(s).to_string()),
            any::<i64>().prop_map(|i| i.to_string()),
            select(vec![
                "\"example\"",
                "\"0.1.0\"",
                "\"1.2.3-rc.1+build\"",
                "\"capstan:plugin@0.1.0\"",
                "\"capstan:plugin@9.9.9\"",
                "[\"store\", \"log\"]",
                "[\"store\", \"store\"]",
                "[\"http:https://a.example:8443\", \"secrets:mail\"]",
                "[\"stor\"]",
                "[1, 2]",
                "{ a = 1 }",
                "[]",
                "true",
                "1.5",
                "nan",
                "1979-05-27T07:32:00Z",
                "-1",
                "0",
                "1024",
                "257",
                "\"\"",
                "\"api\"",
                "'''\nmulti\n'''",
            ])
            .prop_map(String::from),
            "[ -~]{0,16}",
        ]
    }

    /// A line of a manifest-like TOML document.
    fn toml_line() -> impl Strategy<Value = String> {
        prop_oneof![
            2 => select(vec!["[plugin]", "[capabilities]", "[limits]", "[[plugin]]", "[plugin.extra]", "[extra]", "", "# comment"])
                .prop_map(String::from),
            6 => (
                select(vec![
                    "id", "name", "version", "wit", "description", "publisher", "requested", "memory-mib", "concurrency", "reuse-instances", "colour",
                    "plugin", "\"id\"", "limits", "plugin.id",
                ]),
                toml_value(),
            )
                .prop_map(|(key, value)| format!("{key} = {value}")),
            1 => "\\PC{0,40}",
        ]
    }

    /// One edit of a text, at a character position.
    #[derive(Debug, Clone)]
    enum Edit {
        Insert(Index, char),
        Delete(Index),
        Replace(Index, char),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        let ch = prop_oneof![
            any::<char>(),
            select(vec!['"', '\'', '[', ']', '=', '\n', '#', ',', '\\', '{', '}', '.', ' ', '\0', '\u{7f}', 'é', '€', '😀']),
        ];
        prop_oneof![
            (any::<Index>(), ch.clone()).prop_map(|(at, c)| Edit::Insert(at, c)),
            any::<Index>().prop_map(Edit::Delete),
            (any::<Index>(), ch).prop_map(|(at, c)| Edit::Replace(at, c)),
        ]
    }

    fn apply(text: &str, edit: &Edit) -> String {
        let mut chars: Vec<char> = text.chars().collect();
        match edit {
            Edit::Insert(at, c) => chars.insert(at.index(chars.len() + 1), *c),
            Edit::Delete(at) if !chars.is_empty() => {
                chars.remove(at.index(chars.len()));
            }
            Edit::Replace(at, c) if !chars.is_empty() => {
                let at = at.index(chars.len());
                chars[at] = *c;
            }
            _ => {}
        }
        chars.into_iter().collect()
    }

    /// A capability text the parser accepts, in its canonical form.
    fn capability() -> impl Strategy<Value = String> {
        let host = prop_oneof![
            "[a-z]([a-z0-9-]{0,8}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?){0,3}",
            any::<Ipv4Addr>().prop_map(|a| a.to_string()),
            any::<Ipv6Addr>().prop_map(|a| format!("[{a}]")),
        ];
        let origin = (any::<bool>(), host, prop::option::of(1u16..)).prop_map(|(tls, host, port)| {
            let (scheme, default) = if tls { ("https", 443) } else { ("http", 80) };
            match port.filter(|p| *p != default) {
                Some(port) => format!("http:{scheme}://{host}:{port}"),
                None => format!("http:{scheme}://{host}"),
            }
        });
        prop_oneof![
            select(vec![
                "store",
                "inventory:read",
                "inventory:write-services",
                "blobs",
                "agents",
                "runtime:read",
                "runtime:write",
                "events:publish",
                "sign",
                "log"
            ])
            .prop_map(String::from),
            "[a-z][a-z0-9-]{0,31}".prop_map(|scope| format!("secrets:{scope}")),
            "[a-z][a-z0-9-]{0,31}".prop_map(|scope| format!("secrets-reveal:{scope}")),
            origin,
            "[A-Za-z][A-Za-z0-9]{0,20}".prop_map(|key| format!("http-setting:{key}")),
            select(capstan_core::gateway_scopes::NAMES.to_vec()).prop_map(|scope| format!("gateway:{scope}")),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary text is refused by name (or, should it happen to be one, is a valid manifest).
        #[test]
        fn arbitrary_text_is_refused_by_name(text in prop_oneof![any::<String>(), "\\PC{0,400}"]) {
            parse(&text)?;
        }

        /// Documents of manifest-like lines in any order: a valid manifest or a named refusal.
        #[test]
        fn manifest_like_documents_are_valid_or_refused_by_name(lines in prop::collection::vec(toml_line(), 0..16)) {
            parse(&lines.join("\n"))?;
        }

        /// A valid manifest with a few characters inserted, deleted or replaced anywhere (multi-byte
        /// ones too, where a parse error's position is reported): a valid manifest or a named
        /// refusal.
        #[test]
        fn an_edited_manifest_is_valid_or_refused_by_name(edits in prop::collection::vec(edit(), 1..4)) {
            let text = edits.iter().fold(GOOD.to_string(), |text, e| apply(&text, e));
            parse(&text)?;
        }

        /// A capability's text parses to the capability that prints as that very text, or is
        /// refused `capability-unknown`.
        #[test]
        fn capability_text_is_canonical_or_unknown(
            text in prop_oneof![
                "\\PC{0,40}",
                ("(secrets|secrets-reveal|http|http-setting|inventory|events|store|gateway|runtime)", "[ -~]{0,40}").prop_map(|(k, v)| format!("{k}:{v}")),
                capability(),
            ],
        ) {
            match text.parse::<Capability>() {
                Ok(capability) => prop_assert_eq!(capability.to_string(), text),
                Err(err) => prop_assert_eq!(err.code.as_ref(), "capability-unknown"),
            }
        }

        /// Any valid manifest, written out as TOML, parses to exactly its fields, capabilities
        /// sorted.
        #[test]
        fn valid_manifests_parse_to_their_fields(
            id in "[a-z][a-z0-9-]{1,38}[a-z0-9]".prop_filter("not reserved", |id| !RESERVED_IDS.contains(&id.as_str())),
            name in "\\PC{1,64}".prop_filter("not blank", |n| !n.trim().is_empty()),
            version in (any::<u64>(), any::<u64>(), any::<u64>()),
            description in "(\\PC|\n){0,200}",
            publisher in prop::option::of("\\PC{1,128}".prop_filter("not blank", |p| !p.trim().is_empty())),
            capabilities in prop::collection::btree_set(capability(), 0..8)
                .prop_map(|set| set.into_iter().collect::<Vec<_>>())
                .prop_shuffle(),
            memory in prop::option::of(1..=MAX_MEMORY_MIB),
            concurrency in prop::option::of(1..=MAX_CONCURRENCY),
            reuse in prop::option::of(any::<bool>()),
        ) {
            let mut plugin = toml::Table::new();
            plugin.insert("id".into(), id.clone().into());
            plugin.insert("name".into(), name.clone().into());
            plugin.insert("version".into(), format!("{}.{}.{}", version.0, version.1, version.2).into());
            plugin.insert("wit".into(), CURRENT_WIT.into());
            plugin.insert("description".into(), description.clone().into());
            if let Some(p) = &publisher {
                plugin.insert("publisher".into(), p.clone().into());
            }
            let mut root = toml::Table::new();
            root.insert("plugin".into(), plugin.into());
            let mut requested = toml::Table::new();
            requested.insert("requested".into(), capabilities.clone().into());
            root.insert("capabilities".into(), requested.into());
            let mut limits = toml::Table::new();
            if let Some(m) = memory {
                limits.insert("memory-mib".into(), i64::from(m).into());
            }
            if let Some(c) = concurrency {
                limits.insert("concurrency".into(), i64::from(c).into());
            }
            if let Some(reads) = reuse {
                limits.insert("reuse-instances".into(), if reads { "reads" } else { "never" }.into());
            }
            root.insert("limits".into(), limits.into());
            let text = toml::to_string(&root).unwrap();

            let m = Manifest::parse(&text).unwrap();
            let mut sorted = capabilities.clone();
            sorted.sort();
            prop_assert_eq!(&m.id, &id);
            prop_assert_eq!(&m.name, &name);
            prop_assert_eq!(&m.version, &semver::Version::new(version.0, version.1, version.2));
            prop_assert_eq!(&m.wit, CURRENT_WIT);
            prop_assert_eq!(&m.description, &description);
            prop_assert_eq!(&m.publisher, &publisher);
            prop_assert_eq!(m.capabilities.iter().map(Capability::to_string).collect::<Vec<_>>(), sorted);
            prop_assert_eq!(
                m.limits,
                Limits {
                    memory_mib: memory.unwrap_or(DEFAULT_MEMORY_MIB),
                    concurrency: concurrency.unwrap_or(DEFAULT_CONCURRENCY),
                    reuse_instances: if reuse == Some(true) { InstanceReuse::Reads } else { InstanceReuse::Never },
                }
            );
        }
    }
}
