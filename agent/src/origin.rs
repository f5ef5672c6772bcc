//! What the agent checks before it sends anything: the origin it talks to, the jump code it
//! was given and the hostname it offers.

use capstan_core::Refusal;
use serde_json::json;
use std::net::IpAddr;
use url::{Host, Url};

/// Length of a jump code.
pub const JUMP_CODE_LEN: usize = 16;

/// Check a Capstan origin: `https://host[:port]`, or `http://` only to a loopback address or,
/// when the jump command said so (`dev_host`), to a dev host (`serve --dev`) on any address. No
/// user, path, query or fragment. Answers it normalized, without a trailing slash.
pub fn check_origin(text: &str, dev_host: bool) -> Result<String, Refusal> {
    let invalid = |why: &str| {
        Refusal::new("origin-invalid", format!("the origin {:?} is not usable: {why}", capstan_core::text::truncate(text, 200)))
            .with_data(json!({ "origin": capstan_core::text::truncate(text, 200) }))
    };
    let url = Url::parse(text.trim()).map_err(|e| invalid(&e.to_string()))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("it carries credentials"));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("an origin is scheme, host and port only (no path, query or fragment)"));
    }
    let host = url.host().ok_or_else(|| invalid("it names no host"))?;
    match url.scheme() {
        "https" => {}
        "http" if dev_host || is_loopback(&host) => {}
        "http" => {
            return Err(Refusal::new(
                "origin-not-https",
                "the origin must be https (plain http is accepted only to a loopback address, or to a dev host with --dev-host as its jump command says)",
            )
            .with_data(json!({ "origin": url.origin().ascii_serialization() })));
        }
        _ => return Err(invalid("the scheme must be https")),
    }
    Ok(url.origin().ascii_serialization())
}

fn is_loopback(host: &Host<&str>) -> bool {
    match host {
        Host::Ipv4(ip) => IpAddr::V4(*ip).is_loopback(),
        Host::Ipv6(ip) => IpAddr::V6(*ip).is_loopback(),
        Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
    }
}

/// Check a jump code as read from standard input: 16 characters from `[A-Za-z0-9]`.
pub fn check_jump_code(line: &str) -> Result<String, Refusal> {
    let code = line.trim();
    if code.is_empty() {
        return Err(Refusal::new(
            "jump-code-missing",
            "no jump code on standard input; pipe it in: printf '%s\\n' CODE | capstan-agent enroll ORIGIN",
        ));
    }
    if code.len() != JUMP_CODE_LEN || !code.bytes().all(|b| b.is_ascii_alphanumeric()) {
        // never echoed: a mistyped code is still most of a code
        return Err(Refusal::new("jump-code-malformed", "a jump code is 16 letters and digits"));
    }
    Ok(code.to_string())
}

/// Whether `name` is one lowercase RFC 1123 label of at most 63 characters.
pub fn is_hostname_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// The machine's short hostname (as `hostname -s`: the node name up to its first dot),
/// lowercased, refused by name when it is not one DNS label.
pub fn short_hostname(node_name: &str) -> Result<String, Refusal> {
    let short = node_name.split('.').next().unwrap_or_default().to_ascii_lowercase();
    if !is_hostname_label(&short) {
        return Err(Refusal::new(
            "hostname-invalid",
            format!(
                "this machine's hostname {:?} is not one DNS label (lowercase letters, digits and '-', at most 63); set one first (hostnamectl set-hostname NAME)",
                capstan_core::text::escape_control(&capstan_core::text::truncate(node_name, 80))
            ),
        ));
    }
    Ok(short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_https_or_loopback_http() {
        assert_eq!(check_origin("https://capstan.example.com", false).unwrap(), "https://capstan.example.com");
        assert_eq!(check_origin("https://capstan.example.com:8443/", false).unwrap(), "https://capstan.example.com:8443");
        assert_eq!(check_origin("http://127.0.0.1:8080", false).unwrap(), "http://127.0.0.1:8080");
        assert_eq!(check_origin("http://127.8.0.1:1", false).unwrap(), "http://127.8.0.1:1");
        assert_eq!(check_origin("http://[::1]:9", false).unwrap(), "http://[::1]:9");
        assert_eq!(check_origin("http://localhost:9", false).unwrap(), "http://localhost:9");
        assert_eq!(check_origin("http://capstan.example.com", false).unwrap_err().code, "origin-not-https");
        assert_eq!(check_origin("http://10.0.0.1", false).unwrap_err().code, "origin-not-https");
        assert_eq!(check_origin("http://localhost.evil.example", false).unwrap_err().code, "origin-not-https");
        // a dev host's jump command lets plain http reach beyond loopback, nothing else
        assert_eq!(check_origin("http://10.0.0.1:8080", true).unwrap(), "http://10.0.0.1:8080");
        assert_eq!(check_origin("https://capstan.example.com", true).unwrap(), "https://capstan.example.com");
        assert_eq!(check_origin("ftp://x", true).unwrap_err().code, "origin-invalid");
        for bad in ["ftp://x", "https://u:p@x", "https://x/path", "https://x/?q", "https://x/#f", "capstan.example", ""] {
            assert_eq!(check_origin(bad, false).unwrap_err().code, "origin-invalid", "{bad}");
        }
    }

    #[test]
    fn jump_codes_are_sixteen_alphanumerics_never_echoed() {
        assert_eq!(check_jump_code("AbCd1234EfGh5678\n").unwrap(), "AbCd1234EfGh5678");
        assert_eq!(check_jump_code("").unwrap_err().code, "jump-code-missing");
        assert_eq!(check_jump_code("  \n").unwrap_err().code, "jump-code-missing");
        let err = check_jump_code("AbCd1234EfGh567!").unwrap_err();
        assert_eq!(err.code, "jump-code-malformed");
        assert!(!err.to_string().contains("AbCd1234"));
        assert_eq!(check_jump_code("AbCd1234EfGh56789").unwrap_err().code, "jump-code-malformed");
    }

    #[test]
    fn hostnames_are_one_lowercase_label() {
        assert_eq!(short_hostname("Web-01.example.com").unwrap(), "web-01");
        assert_eq!(short_hostname("vm").unwrap(), "vm");
        assert_eq!(short_hostname(&"a".repeat(63)).unwrap().len(), 63);
        for bad in ["", "-web", "web-", "web_01", "wéb", &"a".repeat(64), ".example"] {
            assert_eq!(short_hostname(bad).unwrap_err().code, "hostname-invalid", "{bad:?}");
        }
        assert!(is_hostname_label("worker-7"));
        assert!(!is_hostname_label("Worker-7"));
    }
}
