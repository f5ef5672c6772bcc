//! Lists of IP networks an operator configures (trusted proxies, what plugins' outbound HTTP
//! may reach despite its guard), and the URLs a setting names.

pub use ipnet::IpNet;

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
}
