//! Lists of IP networks an operator configures (trusted proxies, what plugins' outbound HTTP
//! may reach despite its guard), the address ranges outbound requests are kept from, and the
//! URLs a setting names.

pub use ipnet::IpNet;
use std::net::IpAddr;

/// Parse a comma-separated list of addresses and networks (`10.0.0.0/8, 192.0.2.10, ::1`); an
/// address stands for itself alone. The entry that is neither is named in the error.
pub fn parse_networks(text: &str) -> Result<Vec<IpNet>, String> {
    let mut nets = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let net = match entry.parse::<IpNet>() {
            Ok(net) => net,
            Err(_) => entry.parse::<std::net::IpAddr>().map(IpNet::from).map_err(|_| {
                format!("{:?} is neither an IP address nor a network (address/prefix)", entry.chars().take(60).collect::<String>())
            })?,
        };
        nets.push(net);
    }
    Ok(nets)
}

/// The URLs a setting value names: the text of a string, or of each string in a list (other
/// members are ignored).
pub fn urls_in(value: &serde_json::Value) -> Vec<String> {
    match value {
        serde_json::Value::String(url) => vec![url.clone()],
        serde_json::Value::Array(items) => items.iter().filter_map(serde_json::Value::as_str).map(str::to_string).collect(),
        _ => Vec::new(),
    }
}

/// Addresses that are metadata services outside the link-local range.
const METADATA: [IpAddr; 2] =
    [IpAddr::V4(std::net::Ipv4Addr::new(100, 100, 100, 200)), IpAddr::V6(std::net::Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254))];

/// Why plugins may not reach `ip` by default: the range it is in, or `None` when it is fine.
pub fn refused_range(ip: IpAddr) -> Option<&'static str> {
    // an IPv4 address written as IPv6 is the IPv4 address
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    if METADATA.contains(&ip) {
        return Some("metadata");
    }
    match ip {
        IpAddr::V4(v4) if v4.is_loopback() => Some("loopback"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
        IpAddr::V4(v4) if v4.is_unspecified() || v4.octets()[0] == 0 => Some("unspecified"),
        IpAddr::V4(v4) if v4.is_multicast() || v4.is_broadcast() => Some("multicast"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("loopback"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("link-local"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("unspecified"),
        IpAddr::V6(v6) if v6.is_multicast() => Some("multicast"),
        _ => None,
    }
}

/// Why `ip` is not a public internet address: the range [`refused_range`] names, or `private`
/// (RFC 1918), `shared` (RFC 6598 carrier-grade NAT), `unique-local` (fc00::/7),
/// `documentation`; `None` for a public address.
pub fn non_public_range(ip: IpAddr) -> Option<&'static str> {
    if let Some(range) = refused_range(ip) {
        return Some(range);
    }
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) if v4.is_private() => Some("private"),
        IpAddr::V4(v4) if v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64 => Some("shared"),
        IpAddr::V4(v4) if v4.is_documentation() => Some("documentation"),
        IpAddr::V6(v6) if (v6.segments()[0] & 0xfe00) == 0xfc00 => Some("unique-local"),
        IpAddr::V6(v6) if v6.segments()[0] == 0x2001 && v6.segments()[1] == 0x0db8 => Some("documentation"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_names_urls_as_text_or_a_list() {
        assert_eq!(urls_in(&serde_json::json!("https://a.example/")), ["https://a.example/"]);
        let list = serde_json::json!(["https://a.example/", 5, "https://b.example/"]);
        assert_eq!(urls_in(&list), ["https://a.example/", "https://b.example/"]);
        assert!(urls_in(&serde_json::json!({"url": "https://a.example/"})).is_empty());
    }

    #[test]
    fn addresses_and_networks_parse_and_the_bad_entry_is_named() {
        let nets = parse_networks(" 10.0.0.0/8, 192.0.2.10 ,::1,").unwrap();
        assert_eq!(nets.len(), 3);
        assert!(nets[0].contains(&"10.1.2.3".parse::<std::net::IpAddr>().unwrap()));
        assert_eq!(nets[1].prefix_len(), 32);
        assert!(parse_networks("").unwrap().is_empty());
        let error = parse_networks("10.0.0.0/8, example.com").unwrap_err();
        assert!(error.contains("\"example.com\""), "{error}");
    }

    #[test]
    fn ranges_are_named_and_only_public_addresses_are_public() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // (address, what plugins are kept from, what a public check refuses)
        for (address, refused, non_public) in [
            ("127.0.0.1", Some("loopback"), Some("loopback")),
            ("127.9.9.9", Some("loopback"), Some("loopback")),
            ("::1", Some("loopback"), Some("loopback")),
            ("169.254.169.254", Some("link-local"), Some("link-local")),
            ("::ffff:169.254.169.254", Some("link-local"), Some("link-local")),
            ("fe80::1", Some("link-local"), Some("link-local")),
            ("fd00:ec2::254", Some("metadata"), Some("metadata")),
            ("100.100.100.200", Some("metadata"), Some("metadata")),
            ("0.0.0.0", Some("unspecified"), Some("unspecified")),
            ("::", Some("unspecified"), Some("unspecified")),
            ("224.0.0.1", Some("multicast"), Some("multicast")),
            ("255.255.255.255", Some("multicast"), Some("multicast")),
            ("10.1.2.3", None, Some("private")),
            ("172.16.0.1", None, Some("private")),
            ("192.168.1.1", None, Some("private")),
            ("::ffff:192.168.1.1", None, Some("private")),
            ("100.64.0.1", None, Some("shared")),
            ("100.127.255.254", None, Some("shared")),
            ("100.128.0.1", None, None),
            ("192.0.2.7", None, Some("documentation")),
            ("fd12::1", None, Some("unique-local")),
            ("2001:db8::1", None, Some("documentation")),
            ("93.184.216.34", None, None),
            ("2606:2800:220:1::1", None, None),
        ] {
            assert_eq!(refused_range(ip(address)), refused, "{address}");
            assert_eq!(non_public_range(ip(address)), non_public, "{address}");
        }
    }
}
