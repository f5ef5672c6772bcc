//! Text that must not leak: a configuration value that is never printed, and bounded echoes of
//! what a client sent (a refusal may name the input, never at any length).

/// A configuration value that must never be printed: `Debug` shows `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// Wrap a value read from the environment or a file.
    pub fn new(value: String) -> Self {
        SecretString(value)
    }

    /// The value itself, for the one place that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The ids of a JSON list (`["node_a", …]`) as people read them: each by its name in `names`
/// where known, else as it is; nothing for what is not a list.
pub fn named_ids(ids: &serde_json::Value, names: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    ids.as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str)
        .map(|id| names.get(id).cloned().unwrap_or_else(|| id.to_string()))
        .collect()
}

/// At most `max` bytes of `s` (on a character boundary), marked `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// `s` with every control character (newlines, carriage returns, escape sequences) written as
/// its Rust escape, so untrusted text (a plugin's log message) stays on one log line and cannot
/// forge another or drive a terminal.
pub fn escape_control(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect())
}

/// Words that mark a name as credential-bearing, compared without case or separators.
const CREDENTIAL_WORDS: &[&str] = &["token", "secret", "password", "passwd", "credential", "apikey", "privatekey", "accesskey"];

/// Whether a key or field name names a credential (`apiToken`, `SMTP_PASSWORD`, `s3SecretKey`):
/// such a value is a secret, never a setting. A name ending in a credential's identity or version
/// (`coreMailControlCredentialId`, `…CredentialVersion`) names public metadata of one, not it.
pub fn names_a_credential(name: &str) -> bool {
    let folded: String = name.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    let named = ["credentialid", "credentialversion"].iter().find_map(|tail| folded.strip_suffix(tail)).unwrap_or(&folded);
    CREDENTIAL_WORDS.iter().any(|w| named.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_names_are_recognized_whatever_their_spelling() {
        for name in ["apiToken", "SMTP_PASSWORD", "s3SecretKey", "private-key", "ACCESS_KEY_ID", "dcrouterGatewayToken"] {
            assert!(names_a_credential(name), "{name}");
        }
        for name in ["secretCredentialId", "tokenCredentialVersion"] {
            assert!(names_a_credential(name), "{name}");
        }
        for name in
            ["catalogSources", "welcome", "keepDays", "submissionHost", "coreMailControlCredentialId", "coreMailControlCredentialVersion"]
        {
            assert!(!names_a_credential(name), "{name}");
        }
    }

    #[test]
    fn truncation_keeps_characters_whole() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdef", 3), "abc…");
        assert_eq!(truncate("ääää", 3), "ä…");
    }

    #[test]
    fn secrets_do_not_print() {
        let s = SecretString::new("hunter2".into());
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn control_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escape_control("plain, ünïcode"), "plain, ünïcode");
        assert_eq!(escape_control("ok\n2026-12-01T00:00:00Z INFO forged"), "ok\\n2026-12-01T00:00:00Z INFO forged");
        assert_eq!(escape_control("\r\u{1b}[31mred\t"), "\\r\\u{1b}[31mred\\t");
    }

    #[test]
    fn ids_read_by_name_where_known() {
        let names = std::collections::BTreeMap::from([("node_a".to_string(), "web-1".to_string())]);
        assert_eq!(named_ids(&serde_json::json!(["node_a", "node_b"]), &names), ["web-1", "node_b"]);
        assert!(named_ids(&serde_json::json!(null), &names).is_empty());
    }
}
