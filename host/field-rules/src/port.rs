//! The one way a port is written, wherever an operator reads or types one (the CLI's `--port`
//! and `services get`, the dashboard's Ports field and service page):
//! `[PUBLISHED:]TARGET[/PROTOCOL]`, as Docker writes `published:target` — `443:8080/http` is
//! the container's port 8080 speaking HTTP, published on the node's port 443; `53/udp` is
//! not published; `9000` is TCP. The protocol is `tcp` (the default), `udp` or `http`, in any
//! case. docs/inventory.md ("Ports") says it for people.
//!
//! The CLI's former order, `TARGET/PROTOCOL:PUBLISHED` (`8080/http:443`), is refused by name
//! (`port-syntax-old`) with the same port written the one way, so nobody publishes the wrong
//! port by habit.

use crate::validate::invalid;
use capstan_core::refusal::Result;
use serde_json::{Value, json};

/// The syntax, for help texts and refusals.
pub const SYNTAX: &str = "[PUBLISHED:]TARGET[/PROTOCOL]";
/// An example of it.
pub const EXAMPLE: &str = "443:8080/http";
/// The protocols a port speaks.
pub const PROTOCOLS: [&str; 3] = ["tcp", "udp", "http"];

/// A port as an operator writes it, and as the API's port object holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// The port the container listens on.
    pub port: u16,
    /// `tcp`, `udp` or `http`.
    pub protocol: String,
    /// The port published on the node, if any.
    pub public_port: Option<u16>,
}

impl PortSpec {
    /// The API's port object: `{"port", "protocol"[, "publicPort"]}`.
    pub fn to_json(&self) -> Value {
        let mut value = json!({ "port": self.port, "protocol": self.protocol });
        if let Some(public) = self.public_port {
            value["publicPort"] = json!(public);
        }
        value
    }
}

impl std::fmt::Display for PortSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(public) = self.public_port {
            write!(f, "{public}:")?;
        }
        write!(f, "{}/{}", self.port, self.protocol)
    }
}

fn number(field: &str, text: &str, what: &str) -> Result<u16> {
    match text.trim().parse::<u16>() {
        Ok(n) if n > 0 => Ok(n),
        _ => {
            let shown: String = text.trim().chars().take(16).collect();
            Err(invalid(
                "port-invalid",
                field,
                format!("{field}: the {what} port {shown:?} is not a port (1–65535); write {SYNTAX}, e.g. {EXAMPLE}"),
            ))
        }
    }
}

/// Read `text` written [`SYNTAX`]. Refusals name `field`: `port-invalid` for anything that is
/// not the syntax, `port-syntax-old` for the former `TARGET/PROTOCOL:PUBLISHED` order (its
/// message holds the port written the one way).
pub fn parse(field: &str, text: &str) -> Result<PortSpec> {
    let text = text.trim();
    if let Some((before, published)) = text.split_once(':')
        && let Some((target, protocol)) = before.split_once('/')
    {
        // `8080/http:443`: the protocol before the colon is the former order
        let hint = match (target.trim().parse::<u16>(), published.trim().parse::<u16>()) {
            (Ok(target), Ok(published)) => format!(": write {published}:{target}/{}", protocol.trim().to_ascii_lowercase()),
            _ => String::new(),
        };
        let shown: String = text.chars().take(32).collect();
        return Err(invalid(
            "port-syntax-old",
            field,
            format!("{field}: {shown:?} is the former TARGET/PROTOCOL:PUBLISHED order; ports are written {SYNTAX}, published first{hint}"),
        ));
    }
    let (spec, protocol) = match text.split_once('/') {
        Some((spec, protocol)) => (spec, protocol.trim().to_ascii_lowercase()),
        None => (text, "tcp".to_string()),
    };
    if !PROTOCOLS.contains(&protocol.as_str()) {
        let shown: String = protocol.chars().take(16).collect();
        return Err(invalid(
            "port-invalid",
            field,
            format!("{field}: {shown:?} is not a protocol: tcp, udp or http ({SYNTAX}, e.g. {EXAMPLE})"),
        ));
    }
    let (public_port, port) = match spec.split_once(':') {
        Some((public, port)) => (Some(number(field, public, "published")?), number(field, port, "target")?),
        None => (None, number(field, spec, "target")?),
    };
    Ok(PortSpec { port, protocol, public_port })
}

/// The API's port object written [`SYNTAX`] (`443:8080/http`); a value that is not a port
/// object shows what it holds with `?` for what is missing.
pub fn format(port: &Value) -> String {
    let target = port["port"].as_u64().map_or_else(|| "?".to_string(), |n| n.to_string());
    let protocol = port["protocol"].as_str().unwrap_or("?");
    match port["publicPort"].as_u64() {
        Some(public) => format!("{public}:{target}/{protocol}"),
        None => format!("{target}/{protocol}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(text: &str) -> String {
        let e = parse("ports[0]", text).unwrap_err();
        assert_eq!(e.data.as_ref().unwrap()["field"], "ports[0]", "{text}: {e}");
        e.code.to_string()
    }

    #[test]
    fn published_target_protocol_reads_and_writes_back_the_same() {
        let spec = parse("port", "443:8080/http").unwrap();
        assert_eq!(spec, PortSpec { port: 8080, protocol: "http".into(), public_port: Some(443) });
        assert_eq!(spec.to_json(), json!({"port": 8080, "protocol": "http", "publicPort": 443}));
        assert_eq!(spec.to_string(), "443:8080/http");
        assert_eq!(format(&spec.to_json()), "443:8080/http");
        assert_eq!(parse("port", " 53/UDP ").unwrap().to_json(), json!({"port": 53, "protocol": "udp"}));
        assert_eq!(parse("port", "9000").unwrap().to_json(), json!({"port": 9000, "protocol": "tcp"}));
        assert_eq!(parse("port", "2525:25").unwrap().to_json(), json!({"port": 25, "protocol": "tcp", "publicPort": 2525}));
        for text in ["443:8080/http", "53/udp", "9000/tcp", "2525:25/tcp"] {
            assert_eq!(parse("port", text).unwrap().to_string(), text, "round trip");
        }
        assert_eq!(format(&json!({"port": 53, "protocol": "udp"})), "53/udp");
        assert_eq!(format(&json!({})), "?/?");
    }

    #[test]
    fn anything_else_is_refused_by_name() {
        for bad in ["", "http", "abc/tcp", "80/sctp", "70000/tcp", "0", ":80", "80:", "x:80/tcp", "443:0/http", "1:2:3"] {
            assert_eq!(code(bad), "port-invalid", "{bad}");
        }
    }

    #[test]
    fn the_former_order_is_refused_with_the_new_form() {
        assert_eq!(code("8080/http:443"), "port-syntax-old");
        let e = parse("--port", "8080/http:443").unwrap_err();
        assert!(e.message.contains("write 443:8080/http"), "{e}");
        assert_eq!(code("80/tcp:x"), "port-syntax-old");
    }
}
