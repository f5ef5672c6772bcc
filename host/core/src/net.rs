//! Lists of IP networks an operator configures (trusted proxies, what plugins' outbound HTTP
//! may reach despite its guard).

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

#[cfg(test)]
mod tests {
    use super::*;

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
