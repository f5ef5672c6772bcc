//! A service's fields as wholes: how many of each, what may not repeat, how large a template
//! snapshot may be — each value checked by [`validate`](crate::validate). `services.create` and
//! `services.update` check every field they set with these, and so does `capstan-catalog sign`
//! for every App Store template.

use crate::validate::{self, invalid};
use capstan_core::refusal::{Refusal, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Most ports a service lists.
pub const MAX_PORTS: usize = 32;
/// Most domains a service answers on.
pub const MAX_DOMAINS: usize = 32;
/// Most environment variables a service sets.
pub const MAX_ENVIRONMENT: usize = 256;
/// Most volumes a service mounts.
pub const MAX_VOLUMES: usize = 32;
/// Most mail addresses a service has.
pub const MAX_MAIL: usize = 32;
/// The largest scale (replicas).
pub const MAX_SCALE: u32 = 64;
/// The largest template snapshot, in bytes of JSON: a snapshot is a description, not a payload.
pub const MAX_TEMPLATE_BYTES: usize = 64 * 1024;

/// A port as the rules see it: the container port, whether it is UDP (TCP and HTTP share a
/// port space), and the port published on the node, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRule {
    /// The port the container listens on.
    pub port: u16,
    /// Whether it speaks UDP.
    pub udp: bool,
    /// The port published on the node, if any.
    pub public_port: Option<u16>,
}

fn too_many(field: &str, max: usize) -> Refusal {
    invalid("too-many-items", field, format!("{field} holds at most {max} items"))
}

fn has_duplicates<T: Ord>(items: &[T]) -> bool {
    let mut seen = BTreeSet::new();
    !items.iter().all(|item| seen.insert(item))
}

/// At most [`MAX_PORTS`], each 1–65535; a port is listed, and a public port published, at most
/// once for UDP and once for TCP or HTTP (`port-invalid`, `port-duplicate`).
pub fn ports(ports: &[PortRule]) -> Result<()> {
    if ports.len() > MAX_PORTS {
        return Err(too_many("ports", MAX_PORTS));
    }
    let mut seen = BTreeSet::new();
    let mut published = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let field = format!("ports[{i}]");
        if port.port == 0 || port.public_port == Some(0) {
            return Err(invalid("port-invalid", &field, format!("{field}: ports are 1–65535")));
        }
        if !seen.insert((port.port, port.udp)) {
            return Err(invalid("port-duplicate", &field, format!("{field}: port {} is listed twice", port.port)));
        }
        if let Some(public) = port.public_port
            && !published.insert((public, port.udp))
        {
            return Err(invalid("port-duplicate", &field, format!("{field}: public port {public} is published twice")));
        }
    }
    Ok(())
}

/// At most [`MAX_DOMAINS`] host names (or `*.` wildcards over one), none twice.
pub fn domains(domains: &[String]) -> Result<()> {
    if domains.len() > MAX_DOMAINS {
        return Err(too_many("domains", MAX_DOMAINS));
    }
    for (i, domain) in domains.iter().enumerate() {
        validate::domain(&format!("domains[{i}]"), domain)?;
    }
    if has_duplicates(domains) {
        return Err(invalid("domain-duplicate", "domains", "a domain is listed twice"));
    }
    Ok(())
}

/// At most [`MAX_ENVIRONMENT`] plain variables: valid names, and values that are not
/// credentials (`environment-value-is-secret`: secrets hold those).
pub fn environment(environment: &BTreeMap<String, String>) -> Result<()> {
    if environment.len() > MAX_ENVIRONMENT {
        return Err(too_many("environment", MAX_ENVIRONMENT));
    }
    for (key, value) in environment {
        validate::env_key("environment", key)?;
        validate::env_value(key, value)?;
    }
    Ok(())
}

/// Replicas, 0–[`MAX_SCALE`].
pub fn scale(scale: u32) -> Result<()> {
    if scale > MAX_SCALE {
        return Err(invalid("scale-invalid", "scale", format!("scale is 0–{MAX_SCALE}")));
    }
    Ok(())
}

/// At most [`MAX_VOLUMES`] volumes, each `(name, mount path)`, no name or mount path twice
/// (`volume-invalid`).
pub fn volumes(volumes: &[(&str, &str)]) -> Result<()> {
    if volumes.len() > MAX_VOLUMES {
        return Err(too_many("volumes", MAX_VOLUMES));
    }
    for (i, (name, mount_path)) in volumes.iter().enumerate() {
        validate::name(&format!("volumes[{i}].name"), name).map_err(|e| Refusal { code: "volume-invalid".into(), ..e })?;
        validate::mount_path(&format!("volumes[{i}].mountPath"), mount_path)?;
    }
    let names: Vec<_> = volumes.iter().map(|(name, _)| name).collect();
    let paths: Vec<_> = volumes.iter().map(|(_, path)| path).collect();
    if has_duplicates(&names) || has_duplicates(&paths) {
        return Err(invalid("volume-invalid", "volumes", "a volume name or mount path is listed twice"));
    }
    Ok(())
}

/// The longest path of a database inside its volume, in bytes.
pub const MAX_DATABASE_PATH: usize = 256;

/// A database declared in `volume` (one of `volumes`, `database-volume-unknown`) at `path`: names
/// joined by `/`, none empty, `.` or `..`, no control character, at most
/// [`MAX_DATABASE_PATH`] bytes (`database-path-invalid`).
pub fn database(volume: &str, path: &str, volumes: &[&str]) -> Result<()> {
    if !volumes.contains(&volume) {
        return Err(invalid(
            "database-volume-unknown",
            "database.volume",
            format!("the service has no volume {volume:?} to hold its database"),
        ));
    }
    let plain = |part: &str| !part.is_empty() && part != "." && part != ".." && !part.chars().any(char::is_control);
    if path.len() > MAX_DATABASE_PATH || !path.split('/').all(plain) {
        return Err(invalid(
            "database-path-invalid",
            "database.path",
            format!("the database path is a file inside the volume: names joined by /, no . or .., at most {MAX_DATABASE_PATH} bytes"),
        ));
    }
    Ok(())
}

/// At most [`MAX_MAIL`] lowercase addresses, none twice.
pub fn mail_addresses(addresses: &[String]) -> Result<()> {
    if addresses.len() > MAX_MAIL {
        return Err(too_many("mailAddresses", MAX_MAIL));
    }
    for (i, address) in addresses.iter().enumerate() {
        validate::mail_address(&format!("mailAddresses[{i}]"), address)?;
    }
    if has_duplicates(addresses) {
        return Err(invalid("mail-address-invalid", "mailAddresses", "an address is listed twice"));
    }
    Ok(())
}

/// A template snapshot: a JSON object of at most [`MAX_TEMPLATE_BYTES`] (`template-invalid`).
pub fn template(template: &Value) -> Result<()> {
    let size = template.to_string().len();
    if !template.is_object() || size > MAX_TEMPLATE_BYTES {
        return Err(invalid("template-invalid", "template", format!("template is a JSON object of at most {MAX_TEMPLATE_BYTES} bytes")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(e: &Refusal) -> (&str, &str) {
        (e.code.as_ref(), e.data.as_ref().and_then(|d| d["field"].as_str()).unwrap_or_default())
    }

    #[test]
    fn ports_are_in_range_and_listed_once_per_protocol_space() {
        let port = |port, udp, public_port| PortRule { port, udp, public_port };
        ports(&[port(53, false, Some(53)), port(53, true, Some(53)), port(80, false, None)]).unwrap();
        assert_eq!(field(&ports(&[port(0, false, None)]).unwrap_err()), ("port-invalid", "ports[0]"));
        assert_eq!(field(&ports(&[port(80, false, Some(0))]).unwrap_err()), ("port-invalid", "ports[0]"));
        assert_eq!(field(&ports(&[port(80, false, None), port(80, false, None)]).unwrap_err()), ("port-duplicate", "ports[1]"));
        let published_twice = ports(&[port(80, false, Some(8080)), port(81, false, Some(8080))]).unwrap_err();
        assert_eq!(field(&published_twice), ("port-duplicate", "ports[1]"));
        assert_eq!(field(&ports(&vec![port(1, false, None); MAX_PORTS + 1]).unwrap_err()), ("too-many-items", "ports"));
    }

    #[test]
    fn a_database_lies_in_a_volume_at_a_plain_relative_path() {
        database("data", "app.db", &["data"]).unwrap();
        database("data", "db/app.sqlite", &["logs", "data"]).unwrap();
        assert_eq!(field(&database("other", "app.db", &["data"]).unwrap_err()), ("database-volume-unknown", "database.volume"));
        for path in ["", "/app.db", "db/", "../app.db", "db/../app.db", "./app.db", "a\nb", &"x".repeat(MAX_DATABASE_PATH + 1)] {
            assert_eq!(field(&database("data", path, &["data"]).unwrap_err()), ("database-path-invalid", "database.path"), "{path:?}");
        }
    }

    #[test]
    fn volumes_domains_and_mail_are_named_once() {
        volumes(&[("data", "/var/lib/data"), ("logs", "/var/log/app")]).unwrap();
        assert_eq!(field(&volumes(&[("Data", "/data")]).unwrap_err()), ("volume-invalid", "volumes[0].name"));
        assert_eq!(field(&volumes(&[("data", "relative")]).unwrap_err()), ("volume-invalid", "volumes[0].mountPath"));
        assert_eq!(field(&volumes(&[("a", "/data"), ("b", "/data")]).unwrap_err()), ("volume-invalid", "volumes"));
        let twice = ["app.example.com".to_string(), "app.example.com".to_string()];
        assert_eq!(field(&domains(&twice).unwrap_err()), ("domain-duplicate", "domains"));
        assert_eq!(field(&domains(&["nope".to_string()]).unwrap_err()), ("domain-invalid", "domains[0]"));
        let twice = ["a@example.com".to_string(), "a@example.com".to_string()];
        assert_eq!(field(&mail_addresses(&twice).unwrap_err()), ("mail-address-invalid", "mailAddresses"));
    }

    #[test]
    fn environment_scale_and_template() {
        environment(&BTreeMap::from([("LOG_LEVEL".to_string(), "info".to_string())])).unwrap();
        let secret = environment(&BTreeMap::from([("DB_PASSWORD".to_string(), "hunter2".to_string())])).unwrap_err();
        assert_eq!(field(&secret), ("environment-value-is-secret", "environment.DB_PASSWORD"));
        scale(MAX_SCALE).unwrap();
        assert_eq!(field(&scale(MAX_SCALE + 1).unwrap_err()), ("scale-invalid", "scale"));
        template(&json!({ "appId": "wiki" })).unwrap();
        assert_eq!(field(&template(&json!([])).unwrap_err()), ("template-invalid", "template"));
        let large = json!({ "notes": "x".repeat(MAX_TEMPLATE_BYTES) });
        assert_eq!(field(&template(&large).unwrap_err()), ("template-invalid", "template"));
    }
}
