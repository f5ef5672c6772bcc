//! The heartbeat's report: real facts of the host, read from the operating system.
//!
//! - `os`: `PRETTY_NAME` of `/etc/os-release` (else `NAME VERSION_ID`, else the kernel's name);
//! - `kernel`, `arch`: `uname` (rustix);
//! - `cpus`: the online CPUs (`/sys/devices/system/cpu/online`, else the parallelism available);
//! - `memoryBytes`: `MemTotal` of `/proc/meminfo` (else `sysinfo`);
//! - `diskBytes`, `diskFreeBytes`: `statvfs("/")` (free: what an unprivileged user may use);
//! - `uptimeSeconds`: `/proc/uptime` (else `sysinfo`);
//! - `addresses`: the interfaces' addresses, loopback left out, at most 64 (`if-addrs`).
//!
//! The report itself is the agent wire's shared body ([`Report`], from `capstan_core::wire`),
//! the type the host reads and judges. The parsers are pure functions over the files' text,
//! tested beside them.

use crate::wire::AGENT_VERSION;
use capstan_core::wire::heartbeat::{HostApply, MAX_ADDRESSES, Report};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// Read the host's facts now; `advertised` is the address the operator stated for the node's
/// published ports.
pub fn gather(hostname: String, host_apply: Option<HostApply>, advertised: Option<IpAddr>) -> Report {
    let uname = rustix::system::uname();
    let kernel = uname.release().to_string_lossy().into_owned();
    let sysname = uname.sysname().to_string_lossy().into_owned();
    let arch = uname.machine().to_string_lossy().into_owned();
    let sysinfo = rustix::system::sysinfo();
    let os = std::fs::read_to_string("/etc/os-release")
        .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
        .ok()
        .and_then(|text| os_name(&text))
        .unwrap_or(sysname);
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|text| count_cpu_list(&text))
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get() as u32))
        .unwrap_or(1);
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total_bytes(&text))
        .unwrap_or((sysinfo.totalram as u64).saturating_mul(u64::from(sysinfo.mem_unit.max(1))));
    let (disk_bytes, disk_free_bytes) =
        rustix::fs::statvfs("/").map(|s| (s.f_blocks.saturating_mul(s.f_frsize), s.f_bavail.saturating_mul(s.f_frsize))).unwrap_or((0, 0));
    let uptime_seconds =
        std::fs::read_to_string("/proc/uptime").ok().and_then(|text| uptime_seconds(&text)).unwrap_or(sysinfo.uptime.max(0) as u64);
    let addresses = if_addrs::get_if_addrs().map(|list| list.into_iter().map(|i| i.ip()).collect::<Vec<_>>()).unwrap_or_default();
    let report =
        build(Facts { hostname, os, kernel, arch, cpus, memory_bytes, disk_bytes, disk_free_bytes, uptime_seconds, addresses }, host_apply);
    Report { advertised_address: advertised, ..report }
}

/// What the operating system said, before it is shaped into a report.
#[derive(Debug, Clone)]
pub struct Facts {
    /// The current hostname.
    pub hostname: String,
    /// The OS name.
    pub os: String,
    /// The kernel release.
    pub kernel: String,
    /// The architecture.
    pub arch: String,
    /// Online CPUs.
    pub cpus: u32,
    /// Total memory.
    pub memory_bytes: u64,
    /// Root filesystem size.
    pub disk_bytes: u64,
    /// Root filesystem space available.
    pub disk_free_bytes: u64,
    /// Seconds since boot.
    pub uptime_seconds: u64,
    /// Every interface address.
    pub addresses: Vec<IpAddr>,
}

/// Shape facts into a report: loopback addresses left out, the rest sorted, deduplicated and
/// bounded; text members bounded.
pub fn build(facts: Facts, host_apply: Option<HostApply>) -> Report {
    let addresses: BTreeSet<IpAddr> = facts.addresses.into_iter().filter(|ip| !ip.is_loopback() && !ip.is_unspecified()).collect();
    // the host takes 1–256 bytes of text without control characters
    let bounded = |s: String| {
        let text = capstan_core::text::truncate(&capstan_core::text::escape_control(s.trim()), 200);
        if text.is_empty() { "unknown".to_string() } else { text }
    };
    Report {
        hostname: bounded(facts.hostname),
        os: bounded(facts.os),
        kernel: bounded(facts.kernel),
        arch: bounded(facts.arch),
        cpus: facts.cpus.max(1),
        memory_bytes: facts.memory_bytes,
        disk_bytes: facts.disk_bytes,
        disk_free_bytes: facts.disk_free_bytes.min(facts.disk_bytes),
        agent_version: AGENT_VERSION.to_string(),
        uptime_seconds: facts.uptime_seconds,
        addresses: addresses.into_iter().take(MAX_ADDRESSES).collect(),
        advertised_address: None,
        host_apply,
    }
}

/// The OS's name from `os-release` text: `PRETTY_NAME`, else `NAME VERSION_ID`.
pub fn os_name(text: &str) -> Option<String> {
    let value = |key: &str| {
        text.lines().find_map(|line| {
            let (k, v) = line.trim().split_once('=')?;
            (k == key).then(|| unquote(v)).filter(|v| !v.is_empty())
        })
    };
    value("PRETTY_NAME").or_else(|| {
        let name = value("NAME")?;
        Some(match value("VERSION_ID") {
            Some(version) => format!("{name} {version}"),
            None => name,
        })
    })
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    let inner = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .or_else(|| v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
        .unwrap_or(v);
    inner.replace("\\\"", "\"").replace("\\$", "$").replace("\\`", "`").replace("\\\\", "\\")
}

/// The number of CPUs in a kernel CPU list (`0-3,6,8-9`).
pub fn count_cpu_list(text: &str) -> Option<u32> {
    let mut count = 0u32;
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        count += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.parse::<u32>().ok()?;
                1
            }
        };
    }
    (count > 0).then_some(count)
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
pub fn mem_total_bytes(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// Whole seconds since boot from `/proc/uptime`.
pub fn uptime_seconds(text: &str) -> Option<u64> {
    let first = text.split_whitespace().next()?;
    let whole = first.split('.').next()?;
    whole.parse().ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use capstan_core::wire::heartbeat::ApplyOutcome;
    use serde_json::json;

    fn sample_facts() -> Facts {
        Facts {
            hostname: "web-1".into(),
            os: "Debian".into(),
            kernel: "6.12.0".into(),
            arch: "x86_64".into(),
            cpus: 4,
            memory_bytes: 1,
            disk_bytes: 2,
            disk_free_bytes: 1,
            uptime_seconds: 3,
            addresses: vec![],
        }
    }

    pub(crate) fn sample() -> Report {
        build(
            Facts {
                hostname: "web-1".into(),
                os: "Debian GNU/Linux 13 (trixie)".into(),
                kernel: "6.12.0".into(),
                arch: "x86_64".into(),
                cpus: 4,
                memory_bytes: 8 << 30,
                disk_bytes: 100 << 30,
                disk_free_bytes: 40 << 30,
                uptime_seconds: 3600,
                addresses: vec![
                    "10.0.0.5".parse().unwrap(),
                    "127.0.0.1".parse().unwrap(),
                    "::1".parse().unwrap(),
                    "fd00::5".parse().unwrap(),
                ],
            },
            None,
        )
    }

    #[test]
    fn a_report_has_exactly_the_documented_members() {
        let value = serde_json::to_value(sample()).unwrap();
        let mut keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "addresses",
                "agentVersion",
                "arch",
                "cpus",
                "diskBytes",
                "diskFreeBytes",
                "hostname",
                "kernel",
                "memoryBytes",
                "os",
                "uptimeSeconds"
            ]
        );
        assert_eq!(value["addresses"], json!(["10.0.0.5", "fd00::5"]), "loopback left out");
        assert_eq!(value["agentVersion"], AGENT_VERSION);

        let mut with_apply = sample();
        with_apply.host_apply =
            Some(HostApply { generation: 3, hostname: "db-1".into(), outcome: ApplyOutcome::Failed, reason: Some("no".into()) });
        let value = serde_json::to_value(with_apply).unwrap();
        assert_eq!(value["hostApply"], json!({"generation": 3, "hostname": "db-1", "outcome": "failed", "reason": "no"}));
    }

    #[test]
    fn addresses_are_bounded_and_deduplicated() {
        let mut facts = Facts {
            hostname: "h".into(),
            os: String::new(),
            kernel: String::new(),
            arch: String::new(),
            cpus: 0,
            memory_bytes: 0,
            disk_bytes: 10,
            disk_free_bytes: 20,
            uptime_seconds: 0,
            addresses: (0..100u8).map(|i| IpAddr::from([10, 0, 0, i])).collect(),
        };
        facts.addresses.push(IpAddr::from([10, 0, 0, 1]));
        let report = build(facts, None);
        assert_eq!(report.addresses.len(), MAX_ADDRESSES);
        assert_eq!(report.cpus, 1);
        assert_eq!(report.disk_free_bytes, 10, "never more free than there is");
        assert_eq!(report.os, "unknown", "never empty");
        let long = build(Facts { kernel: "x\n".repeat(300), ..sample_facts() }, None);
        assert!(long.kernel.len() <= 256 && !long.kernel.chars().any(char::is_control), "{}", long.kernel);
    }

    #[test]
    fn os_release_is_read_as_the_shell_would() {
        let debian = "PRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"13\"\n";
        assert_eq!(os_name(debian).unwrap(), "Debian GNU/Linux 13 (trixie)");
        assert_eq!(os_name("NAME=Alpine\nVERSION_ID=3.20.1\n").unwrap(), "Alpine 3.20.1");
        assert_eq!(os_name("NAME='Arch Linux'\n").unwrap(), "Arch Linux");
        assert_eq!(os_name("# nothing\n"), None);
    }

    #[test]
    fn proc_files_are_parsed() {
        assert_eq!(count_cpu_list("0-3\n"), Some(4));
        assert_eq!(count_cpu_list("0-3,6,8-9"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("x"), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(mem_total_bytes("MemTotal:       16318508 kB\nMemFree: 1 kB\n"), Some(16318508 * 1024));
        assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
        assert_eq!(uptime_seconds("350735.47 234388.90\n"), Some(350735));
    }

    #[test]
    fn the_real_host_reads_sensibly() {
        let report = gather("probe".into(), None, None);
        assert!(report.cpus >= 1);
        assert!(report.memory_bytes > 1 << 20, "{report:?}");
        assert!(report.disk_bytes > 0 && report.disk_free_bytes <= report.disk_bytes, "{report:?}");
        assert!(!report.kernel.is_empty() && !report.arch.is_empty() && !report.os.is_empty(), "{report:?}");
        assert!(report.addresses.len() <= MAX_ADDRESSES);
    }
}
