//! No manager lives in the host: the host's crates, the dashboard and the SDK name none of the
//! first-party managers (mail, CoreMail, ingress, backups, the App Store) except in comments,
//! tests, the first-party embedding list, and the few places below that say why. A manager's
//! records are its facets, its faces its bundle's, its refusal codes its own declaration
//! (docs/plugins.md), so adding or changing one never needs a host release.

use std::process::Command;

/// What the search looks for, case-insensitively.
const MANAGERS: &str = "mail|coremail|ingress|backup|appstore";

/// Where the host may name a manager, and why.
const ALLOWED_FILES: &[(&str, &str)] = &[
    ("host/server/Cargo.toml", "the first-party embedding list: the bundles this build embeds"),
    ("host/server/src/migrate.rs", "the migration that carried the managers' former service fields into their facets"),
    // the keyring's ingress recipient is the key sealed input is sealed to (docs/secrets.md), a
    // host concept older than the ingress manager and unrelated to it
    ("host/keyring/src/lib.rs", "the keyring's ingress recipient (sealed input)"),
    ("host/keyring/Cargo.toml", "the keyring's ingress recipient (sealed input)"),
    ("host/secrets/src/ingress.rs", "sealed input to the ingress recipient"),
    ("dashboard/static/seal.js", "sealing in the browser to the ingress recipient"),
];

/// Single lines of the host that use a manager's word for the host's own thing: (file, the
/// line's code trimmed, why).
const ALLOWED_LINES: &[(&str, &str, &str)] = &[
    ("host/capstan/src/cli/inventory.rs", "Mail,", "`--clear mail`: a service's mail addresses"),
    ("host/capstan/src/cli/inventory.rs", "ClearArg::Mail => \"mail\",", "`--clear mail`: a service's mail addresses"),
];

/// The host's own words that contain a manager's name: a service's mail addresses (its own
/// field, which the operator writes), a person's e-mail address (an identity provider's claim),
/// and sealed input to the keyring's ingress recipient.
const HOST_WORDS: &[&str] = &[
    "mail_addresses",
    "mailaddresses",
    "mail addresses",
    "mail-address-invalid",
    "mail_address",
    "max_mail",
    "service-mail", // the service form's mail addresses field
    "--mail",
    "clear_arg::mail",
    "cleararg::mail",
    "email", // a person's e-mail address, as an identity provider's claims carry it
    "secrets::ingress",
    "ingress::",
    "ingressrecipient",
    "ingress recipient",
    "ingress key",
    "getingressrecipient",
    "ingress_id",
    "ingress_public",
    "report.ingress",
    "ingress_recipient",
    "pub mod ingress",
];

struct Hit {
    file: String,
    line: usize,
    text: String,
}

fn grep() -> Vec<Hit> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let output = Command::new("git")
        .args(["grep", "-n", "-i", "-I", "-E", MANAGERS, "--", "host", "dashboard", "sdk"])
        .current_dir(root)
        .output()
        .expect("git runs");
    // 1: nothing found
    assert!(output.status.code().is_some_and(|c| c <= 1), "git grep failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| {
            let (file, rest) = l.split_once(':')?;
            let (line, text) = rest.split_once(':')?;
            Some(Hit { file: file.into(), line: line.parse().ok()?, text: text.into() })
        })
        .collect()
}

/// A file of tests, or of test-only helpers.
fn test_file(file: &str) -> bool {
    file.contains("/tests/")
        || file.contains("/host_tests/")
        || file.contains("/benches/")
        || file.ends_with("/tests.rs")
        || file.ends_with("_tests.rs")
        || file.ends_with("/conformance.rs")
        || file.ends_with("/testing.rs")
        || file.ends_with("/test_host.rs")
}

/// The line from which a Rust file's tests begin (its first `#[cfg(test)]`), if it has any.
fn tests_start(root: &str, file: &str) -> Option<usize> {
    if !file.ends_with(".rs") {
        return None;
    }
    let text = std::fs::read_to_string(format!("{root}/{file}")).ok()?;
    text.lines().position(|l| l.trim_start().starts_with("#[cfg(test)]")).map(|i| i + 1)
}

/// The lines of a template inside its `{# … #}` comments.
fn template_comment_lines(root: &str, file: &str) -> Vec<usize> {
    let Ok(text) = std::fs::read_to_string(format!("{root}/{file}")) else { return Vec::new() };
    let mut inside = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let opens = line.contains("{#");
        if inside || opens {
            lines.push(i + 1);
        }
        if opens {
            inside = true;
        }
        if line.contains("#}") {
            inside = false;
        }
    }
    lines
}

/// The part of a line that is code: a `//` comment (not inside a string) cut off.
fn code_of(text: &str) -> &str {
    let mut in_string = false;
    let bytes = text.as_bytes();
    for i in 0..bytes.len() {
        match bytes[i] {
            b'"' if i == 0 || bytes[i - 1] != b'\\' => in_string = !in_string,
            b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => return &text[..i],
            _ => {}
        }
    }
    text
}

fn names_a_manager(code: &str) -> bool {
    let mut lower = code.to_ascii_lowercase();
    for word in HOST_WORDS {
        lower = lower.replace(word, "");
    }
    ["mail", "ingress", "backup", "appstore"].iter().any(|m| lower.contains(m))
}

#[test]
fn the_host_the_dashboard_and_the_sdk_name_no_manager() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let hits = grep();
    assert!(!hits.is_empty(), "the search ran: the embedding list at least names the managers");
    let mut offending = Vec::new();
    for hit in hits {
        if test_file(&hit.file) || ALLOWED_FILES.iter().any(|(f, _)| *f == hit.file) {
            continue;
        }
        if tests_start(root, &hit.file).is_some_and(|start| hit.line >= start) {
            continue;
        }
        let trimmed = hit.text.trim_start();
        let comment = ["//", "#", "{#", "*", "<!--", "-#}", "#}"].iter().any(|c| trimmed.starts_with(c));
        if comment || (hit.file.ends_with(".html") && template_comment_lines(root, &hit.file).contains(&hit.line)) {
            continue;
        }
        let code = code_of(&hit.text);
        if ALLOWED_LINES.iter().any(|(file, line, _)| *file == hit.file && *line == code.trim()) {
            continue;
        }
        if names_a_manager(code) {
            offending.push(format!("{}:{}: {}", hit.file, hit.line, hit.text.trim()));
        }
    }
    assert!(
        offending.is_empty(),
        "the host names a manager outside comments, tests and the allowed places (a manager's records are its facets, \
         its faces and refusal codes its own declaration):\n  {}",
        offending.join("\n  ")
    );
}

#[test]
fn the_scan_tells_code_from_comments_and_host_words() {
    assert!(names_a_manager(code_of(r#"    ("Mail", "mail", None),"#)));
    assert!(names_a_manager(code_of(r#"let url = "https://mail.example"; // a manager"#)));
    assert!(!names_a_manager(code_of(r#"let n = service.mail_addresses.len(); // the mail manager"#)));
    assert!(!names_a_manager(code_of("use capstan_secrets::ingress::{self, SealedInput};")));
    assert!(names_a_manager(code_of(r#"if code == "ingress-not-designated" {"#)));
}
