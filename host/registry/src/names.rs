//! Repository names, references and digests as the distribution spec writes them, and the
//! repository a service's images live in (`workloads/<service-name>-<12 hex of its id>`).

use crate::errors::OciError;

/// Longest repository name Capstan takes: short enough that `<name>:<tag>` (tag ≤ 128) and
/// `<name>@sha256:<hex>` stay within a document id (256 bytes).
pub const MAX_NAME: usize = 127;
/// Longest tag (the spec's grammar).
pub const MAX_TAG: usize = 128;
/// Where services' repositories live.
pub const WORKLOADS: &str = "workloads/";
/// How many hex digits of the service id a repository name carries.
const ID_PREFIX: usize = 12;

/// Refuse `NAME_INVALID` unless `name` follows the spec's grammar:
/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*`, at most [`MAX_NAME`].
pub fn check_name(name: &str) -> Result<(), OciError> {
    let invalid = || OciError::name_invalid(name);
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(invalid());
    }
    for component in name.split('/') {
        if !component_ok(component) {
            return Err(invalid());
        }
    }
    Ok(())
}

fn component_ok(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // a separator: ".", "_", "__" or one or more "-", always between alphanumerics
        let start = i;
        match bytes[i] {
            b'.' => i += 1,
            b'_' => i += if bytes.get(i + 1) == Some(&b'_') { 2 } else { 1 },
            b'-' => {
                while bytes.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return false,
        }
        if start == 0 || !bytes.get(i).is_some_and(|b| alnum(*b)) {
            return false;
        }
    }
    true
}

/// Whether `tag` follows `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn is_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    tag.len() <= MAX_TAG
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// A digest Capstan stores: `sha256:` and 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// Parse a digest; `None` unless it is a well-formed `sha256:` digest.
    pub fn parse(text: &str) -> Option<Digest> {
        let hex = text.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))).then(|| Digest(text.to_string()))
    }

    /// The digest of a SHA-256 given in hex.
    pub fn from_hex(hex: &str) -> Digest {
        Digest(format!("sha256:{hex}"))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest::from_hex(&hex::encode(sha2::Sha256::digest(bytes)))
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hex part.
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parse a digest a client sent: a well-formed one of another algorithm is `UNSUPPORTED`,
/// anything else `DIGEST_INVALID`.
pub fn client_digest(text: &str) -> Result<Digest, OciError> {
    if let Some(digest) = Digest::parse(text) {
        return Ok(digest);
    }
    match text.split_once(':') {
        Some((algorithm, encoded))
            if !algorithm.is_empty()
                && !encoded.is_empty()
                && algorithm.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+._-".contains(c))
                && algorithm != "sha256" =>
        {
            Err(OciError::unsupported_digest(algorithm))
        }
        _ => Err(OciError::digest_invalid("the digest is not sha256:<64 lowercase hex digits>")),
    }
}

/// A manifest reference: a tag or a digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// A tag.
    Tag(String),
    /// A digest.
    Digest(Digest),
}

impl Reference {
    /// Parse a reference from a path: anything with `:` is a digest, else a tag.
    pub fn parse(text: &str) -> Result<Reference, OciError> {
        if text.contains(':') {
            return client_digest(text).map(Reference::Digest);
        }
        if is_tag(text) { Ok(Reference::Tag(text.to_string())) } else { Err(OciError::tag_invalid(text)) }
    }
}

/// The repository a service's images live in.
pub fn service_repository(service_name: &str, service_id: &str) -> String {
    let hex = service_id.strip_prefix("svc_").unwrap_or(service_id);
    let prefix: String = hex.chars().take(ID_PREFIX).collect();
    format!("{WORKLOADS}{service_name}-{prefix}")
}

/// The service name and id prefix a workloads repository names, if it is one.
pub fn parse_service_repository(repository: &str) -> Option<(&str, &str)> {
    let rest = repository.strip_prefix(WORKLOADS)?;
    let (name, prefix) = rest.rsplit_once('-')?;
    (prefix.len() == ID_PREFIX && prefix.bytes().all(|b| b.is_ascii_hexdigit()) && !name.is_empty()).then_some((name, prefix))
}

/// The id prefix (`svc_` and 12 hex) a workloads repository's service id starts with.
pub fn service_id_prefix(prefix_hex: &str) -> String {
    format!("svc_{prefix_hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_spec_grammar() {
        for ok in ["a", "library/ubuntu", "a.b_c__d-e--f/g0", "workloads/web-0123456789ab", "x/y/z"] {
            check_name(ok).unwrap_or_else(|_| panic!("{ok} should be valid"));
        }
        for bad in ["", "A", "a/", "/a", "a//b", "-a", "a-", "a___b", "a..b", "a_.b", "a b", "ä", &"a".repeat(128)] {
            assert!(check_name(bad).is_err(), "{bad:?} should be invalid");
        }
    }

    #[test]
    fn tags_and_digests() {
        assert!(is_tag("v1.0_rc-2") && is_tag("_x") && is_tag("A"));
        assert!(!is_tag("") && !is_tag(".x") && !is_tag("-x") && !is_tag("a/b") && !is_tag(&"a".repeat(129)));
        let hex = "a".repeat(64);
        assert_eq!(Digest::parse(&format!("sha256:{hex}")).unwrap().hex(), hex);
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_none());
        assert!(Digest::parse("sha256:abc").is_none());
        assert_eq!(client_digest("sha512:abcd").unwrap_err().code, "UNSUPPORTED");
        assert_eq!(client_digest("sha256:abcd").unwrap_err().code, "DIGEST_INVALID");
        assert_eq!(client_digest("nonsense").unwrap_err().code, "DIGEST_INVALID");
        assert_eq!(Digest::of(b"abc").hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert!(matches!(Reference::parse("latest").unwrap(), Reference::Tag(_)));
        assert!(matches!(Reference::parse(&format!("sha256:{hex}")).unwrap(), Reference::Digest(_)));
    }

    #[test]
    fn service_repositories_round_trip() {
        let id = "svc_0123456789abcdef0123456789abcdef";
        let repo = service_repository("web-api", id);
        assert_eq!(repo, "workloads/web-api-0123456789ab");
        check_name(&repo).unwrap();
        let (name, prefix) = parse_service_repository(&repo).unwrap();
        assert_eq!((name, prefix), ("web-api", "0123456789ab"));
        assert!(id.starts_with(&service_id_prefix(prefix)));
        assert!(parse_service_repository("library/web-0123456789ab").is_none());
        assert!(parse_service_repository("workloads/web-xyz").is_none());
    }
}
