//! The rules single values meet: names, images, environment names and values, mail addresses,
//! domains, mount paths, URLs. Each refusal names the field (in `data.field`) and never echoes a
//! value that might be secret.

use capstan_core::refusal::{Refusal, Result};
use serde_json::json;

pub(crate) fn invalid(code: &'static str, field: &str, message: impl Into<String>) -> Refusal {
    Refusal::new(code, message).with_data(json!({ "field": field }))
}

/// A name that can become a DNS label: 1–63 of a-z 0-9 -, starting with a letter, not ending
/// with a hyphen. Organizations, clusters, services and volumes are named this way.
pub fn name(field: &str, value: &str) -> Result<()> {
    if is_label(value) && value.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Ok(());
    }
    Err(invalid("name-invalid", field, format!("{field} must be 1 to 63 of a-z 0-9 -, start with a letter and not end with -")))
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A fully qualified host name: labels joined by dots, at least two, at most 253 bytes.
pub fn is_hostname(s: &str) -> bool {
    s.len() <= 253 && s.split('.').count() >= 2 && s.split('.').all(is_label)
}

/// An OCI image reference: `[registry[:port]/]path[:tag][@sha256:<64 hex>]`.
pub fn image(value: &str) -> Result<()> {
    let bad = |why: &str| {
        invalid("image-invalid", "image", format!("image is not an OCI reference ({why}), e.g. registry.example.com/team/app:1.2"))
    };
    if value.is_empty() || value.len() > 512 {
        return Err(bad("1 to 512 bytes"));
    }
    let (rest, digest) = match value.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (value, None),
    };
    if let Some(digest) = digest {
        let hex = digest.strip_prefix("sha256:").ok_or_else(|| bad("a digest is sha256:<64 hex>"))?;
        if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
            return Err(bad("a digest is sha256:<64 lowercase hex>"));
        }
    }
    // a tag follows the last colon after the last slash
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (path, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && tag.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            && tag.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !ok {
            return Err(bad("a tag is 1 to 128 of A-Z a-z 0-9 _ . -"));
        }
    }
    let mut parts: Vec<&str> = path.split('/').collect();
    // a first part with a dot, a colon or `localhost` is a registry host
    if parts.len() > 1 && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost") {
        let registry = parts.remove(0);
        let (host, port) = registry.split_once(':').map_or((registry, None), |(h, p)| (h, Some(p)));
        if !(host == "localhost" || is_hostname(host)) || port.is_some_and(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
            return Err(bad("the registry is host[:port]"));
        }
    }
    let component_ok = |c: &str| {
        !c.is_empty()
            && c.starts_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
            && c.ends_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
            && c.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch))
    };
    if parts.is_empty() || !parts.iter().all(|c| component_ok(c)) {
        return Err(bad("path components are lowercase a-z 0-9 with . _ - inside"));
    }
    Ok(())
}

/// An environment variable name: `[A-Z_][A-Z0-9_]*`, at most 128 bytes.
pub fn env_key(field: &str, key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.len() <= 128
        && key.starts_with(|c: char| c.is_ascii_uppercase() || c == '_')
        && key.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if ok { Ok(()) } else { Err(invalid("environment-key-invalid", field, format!("{field} must match [A-Z_][A-Z0-9_]* (at most 128)"))) }
}

/// Key names that say "credential": such a variable belongs in secrets.
const SECRET_NAME_PARTS: &[&str] =
    &["PASSWORD", "PASSWD", "SECRET", "TOKEN", "PRIVATE_KEY", "API_KEY", "APIKEY", "CREDENTIAL", "ACCESS_KEY"];
/// Prefixes of well-known credential formats.
const SECRET_VALUE_PREFIXES: &[&str] = &[
    "-----BEGIN",
    "AKIA",
    "ASIA",
    "ghp_",
    "gho_",
    "ghs_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "sk_live_",
    "sk-",
    "capstan_mt_",
    "eyJ",
];

/// Refuse a plain environment value that looks like a credential; secrets hold those. The
/// refusal names the key and why, never the value.
pub fn env_value(key: &str, value: &str) -> Result<()> {
    let refuse = |why: &str| {
        Refusal::new(
            "environment-value-is-secret",
            format!("environment {key} {why}: store it with secrets (capstan secrets set --service …), not in the service"),
        )
        .with_data(json!({ "field": format!("environment.{key}"), "key": key }))
    };
    if value.len() > 4096 {
        return Err(invalid(
            "environment-value-invalid",
            &format!("environment.{key}"),
            format!("environment {key} is longer than 4096 bytes"),
        ));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(invalid(
            "environment-value-invalid",
            &format!("environment.{key}"),
            format!("environment {key} holds control characters"),
        ));
    }
    if !value.is_empty() && SECRET_NAME_PARTS.iter().any(|part| key.contains(part)) {
        return Err(refuse("is named like a credential"));
    }
    if SECRET_VALUE_PREFIXES.iter().any(|p| value.starts_with(p) && value.len() >= p.len() + 8) {
        return Err(refuse("looks like a key or token"));
    }
    if looks_random(value) {
        return Err(refuse("looks like a generated secret"));
    }
    Ok(())
}

/// A long single word with the character mix and spread of a generated token.
fn looks_random(value: &str) -> bool {
    if value.len() < 24 || value.contains(char::is_whitespace) || value.contains("://") || value.contains('/') {
        return false;
    }
    let classes = [
        value.chars().any(|c| c.is_ascii_lowercase()),
        value.chars().any(|c| c.is_ascii_uppercase()),
        value.chars().any(|c| c.is_ascii_digit()),
    ];
    let hex = value.len() >= 32 && value.chars().all(|c| c.is_ascii_hexdigit());
    hex || (classes.iter().filter(|c| **c).count() == 3 && entropy_bits_per_char(value) >= 4.0)
}

fn entropy_bits_per_char(value: &str) -> f64 {
    let mut counts = std::collections::HashMap::new();
    for c in value.chars() {
        *counts.entry(c).or_insert(0usize) += 1;
    }
    let n = value.chars().count() as f64;
    counts.values().map(|&k| -(k as f64 / n) * (k as f64 / n).log2()).sum()
}

/// `local@domain` with a host-name domain; the local part is kept simple and lowercase.
pub fn mail_address(field: &str, value: &str) -> Result<()> {
    let ok = value.len() <= 254
        && value.split_once('@').is_some_and(|(local, domain)| {
            !local.is_empty()
                && local.len() <= 64
                && local.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._+-".contains(c))
                && !local.starts_with('.')
                && !local.ends_with('.')
                && is_hostname(domain)
        });
    if ok {
        Ok(())
    } else {
        Err(invalid("mail-address-invalid", field, format!("{field} must be a lowercase address like app@example.com")))
    }
}

/// A domain a service answers on: a host name, or a `*.` wildcard over one.
pub fn domain(field: &str, value: &str) -> Result<()> {
    let host = value.strip_prefix("*.").unwrap_or(value);
    if is_hostname(host) {
        Ok(())
    } else {
        Err(invalid("domain-invalid", field, format!("{field} must be a lowercase host name like app.example.com")))
    }
}

/// An absolute container path without `..`, at most 256 bytes.
pub fn mount_path(field: &str, value: &str) -> Result<()> {
    let ok = value.starts_with('/')
        && value.len() <= 256
        && value != "/"
        && !value.split('/').any(|c| c == ".." || c == ".")
        && !value.chars().any(|c| c.is_control());
    if ok {
        Ok(())
    } else {
        Err(invalid("volume-invalid", field, format!("{field} must be an absolute path other than / without . or ..")))
    }
}

/// An `https://` (or, for loopback only, `http://`) URL.
pub fn url(field: &str, value: &str, https_only: bool) -> Result<()> {
    let parsed = url::Url::parse(value).ok();
    let ok = parsed.as_ref().is_some_and(|u| {
        let loopback = matches!(u.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
        u.has_host()
            && u.username().is_empty()
            && u.password().is_none()
            && (u.scheme() == "https" || (u.scheme() == "http" && (!https_only || loopback)))
    });
    if ok {
        Ok(())
    } else {
        let scheme = if https_only { "https" } else { "http or https" };
        Err(invalid("setting-invalid", field, format!("{field} must be an {scheme} URL without user info")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for ok in ["a", "web", "my-app-2", &"a".repeat(63)] {
            assert!(name("name", ok).is_ok(), "{ok}");
        }
        for bad in ["", "2web", "Web", "web-", "-web", "we_b", "we.b", &"a".repeat(64)] {
            let err = name("name", bad).unwrap_err();
            assert_eq!((err.code.as_ref(), err.data.unwrap()["field"].as_str()), ("name-invalid", Some("name")), "{bad}");
        }
    }

    #[test]
    fn image_references() {
        for ok in [
            "nginx",
            "nginx:1.27",
            "library/nginx:latest",
            "ghcr.io/acme/app:v1.2.3",
            "localhost:5000/app",
            "registry.example.com:8443/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert!(image(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Nginx", "nginx:", "nginx:-x", "ghcr.io//app", "app@sha256:abc", "app@md5:00", "bad host:1/app", "a/b/", "exa mple"]
        {
            assert_eq!(image(bad).unwrap_err().code, "image-invalid", "{bad}");
        }
    }

    #[test]
    fn secret_looking_environment_is_refused_without_the_value() {
        for (key, value) in [
            ("DB_PASSWORD", "hunter2"),
            ("GITHUB_TOKEN", "x"),
            ("CONFIG", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
            ("KEY", "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
            ("SESSION", "Zq8xV2mN4pL7rT1yB6cW9sK3dF5gH0jA"),
            ("HASH", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
        ] {
            let err = env_value(key, value).unwrap_err();
            assert_eq!(err.code, "environment-value-is-secret", "{key}");
            assert!(!err.message.contains(value) && !err.data.as_ref().unwrap().to_string().contains(value), "{err:?}");
        }
        for (key, value) in [
            ("LOG_LEVEL", "debug"),
            ("DATABASE_URL", "postgres://db.internal:5432/app"),
            ("GREETING", "Hello there, this is a long sentence"),
            ("PASSWORD_MIN_LENGTH", ""),
            ("FEATURE_FLAGS", "alpha,beta,gamma,delta,epsilon"),
        ] {
            assert!(env_value(key, value).is_ok(), "{key}={value}");
        }
        assert_eq!(env_key("environment", "lower").unwrap_err().code, "environment-key-invalid");
        assert!(env_key("environment", "_OK_1").is_ok());
    }

    #[test]
    fn domains_mail_paths_and_urls() {
        assert!(domain("d", "app.example.com").is_ok() && domain("d", "*.example.com").is_ok());
        assert!(domain("d", "localhost").is_err() && domain("d", "App.example.com").is_err());
        assert!(mail_address("m", "app+x@example.com").is_ok());
        for bad in ["app", "@example.com", "app@localhost", ".a@example.com", "A@example.com"] {
            assert_eq!(mail_address("m", bad).unwrap_err().code, "mail-address-invalid", "{bad}");
        }
        assert!(mount_path("v", "/var/lib/data").is_ok());
        for bad in ["/", "relative", "/a/../b", "/a/./b"] {
            assert_eq!(mount_path("v", bad).unwrap_err().code, "volume-invalid", "{bad}");
        }
        assert!(url("u", "https://catalog.example.com/c.json", true).is_ok());
        assert!(url("u", "http://127.0.0.1:8080/c.json", true).is_ok());
        assert!(url("u", "http://catalog.example.com/c.json", true).is_err());
        assert!(url("u", "https://user:pw@example.com/", true).is_err());
    }
}
