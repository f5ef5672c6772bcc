//! Catalogs from npm registries (setting `appstore.catalogRegistries`): the catalog is an npm
//! package (setting `appstore.catalogPackage`, `name` or `name@version|tag`) whose tarball holds
//! the signed envelope as `catalog.json` at the package root. A pass reads the packument
//! (`GET <registry>/<name>`), picks the version (the `latest` dist-tag unless pinned), downloads
//! its tarball from the registry's own origin, checks it against `dist.integrity` (sha512) or
//! else `dist.shasum` (sha1), and takes the envelope out of the `.tgz`; the envelope is then
//! verified and activated exactly as one an HTTPS source answered.
//!
//! Everything here but [`fetch`] is pure, so the refusals are tested natively.

use base64::Engine;
use capstan_sdk::http::Request;
use capstan_sdk::{Refusal, Result, Value, json};
use sha1::Sha1;
use sha2::{Digest, Sha512};
use std::io::Read;
use std::time::Duration;

const FETCH_TIMEOUT: Duration = Duration::from_secs(20);
/// The file in the package that holds the envelope (npm puts the package under `package/`).
pub const ENVELOPE_FILE: &str = "catalog.json";
/// The most a package may unpack to: the envelope's own bound and room for a README.
const MAX_UNPACKED_BYTES: u64 = 2 * capstan_catalog::MAX_ENVELOPE_BYTES as u64;

/// A package as the setting names it: `name` or `name@selector` (a version or a dist-tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageSpec {
    pub name: String,
    pub selector: Option<String>,
}

impl PackageSpec {
    /// `name`, `@scope/name`, either with `@version` or `@tag` after it.
    pub fn parse(text: &str) -> Result<PackageSpec> {
        let invalid =
            || Refusal::new("catalog-package-invalid", format!("{text:?} is not an npm package name (with an optional @version or @tag)"));
        let (scope, rest) = match text.strip_prefix('@') {
            Some(rest) => ("@", rest),
            None => ("", text),
        };
        let (name, selector) = match rest.split_once('@') {
            Some((name, selector)) if !selector.is_empty() => (format!("{scope}{name}"), Some(selector.to_string())),
            Some(_) => return Err(invalid()),
            None => (format!("{scope}{rest}"), None),
        };
        let part_ok = |p: &str| {
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._~".contains(&b)) && !p.starts_with('.')
        };
        let well_formed = match name.strip_prefix('@') {
            Some(scoped) => scoped.split_once('/').is_some_and(|(s, n)| part_ok(s) && part_ok(n)),
            None => part_ok(&name),
        };
        if !well_formed || name.len() > 214 || selector.as_deref().is_some_and(|s| !s.bytes().all(|b| b.is_ascii_graphic())) {
            return Err(invalid());
        }
        Ok(PackageSpec { name, selector })
    }

    /// `<registry>/<name>`, a scope's slash escaped as npm clients send it.
    pub fn packument_url(&self, registry: &str) -> String {
        format!("{}/{}", registry.trim_end_matches('/'), self.name.replace('/', "%2f"))
    }
}

/// The chosen version's name and its `dist` (tarball, integrity, shasum).
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    pub version: String,
    pub tarball: String,
    pub integrity: Option<String>,
    pub shasum: Option<String>,
}

fn packument_invalid(why: &str) -> Refusal {
    Refusal::new("catalog-packument-invalid", format!("the registry's package document is unusable: {why}"))
}

/// The version the selector names in `packument`: an exact version, a dist-tag, or `latest`.
pub fn choose(packument: &Value, spec: &PackageSpec) -> Result<Chosen> {
    let versions = packument.get("versions").and_then(Value::as_object).ok_or_else(|| packument_invalid("no versions"))?;
    let tag_or_version = spec.selector.as_deref().unwrap_or("latest");
    let version = if versions.contains_key(tag_or_version) {
        tag_or_version.to_string()
    } else {
        packument.get("dist-tags").and_then(|tags| tags.get(tag_or_version)).and_then(Value::as_str).map(String::from).ok_or_else(|| {
            Refusal::new("catalog-package-version-not-found", format!("{} has no version or dist-tag {tag_or_version:?}", spec.name))
                .with_data(json!({ "package": spec.name, "selector": tag_or_version }))
        })?
    };
    let dist = versions.get(&version).and_then(|v| v.get("dist")).ok_or_else(|| packument_invalid("the version has no dist"))?;
    let text = |key: &str| dist.get(key).and_then(Value::as_str).map(String::from);
    Ok(Chosen {
        version,
        tarball: text("tarball").ok_or_else(|| packument_invalid("the version's dist names no tarball"))?,
        integrity: text("integrity"),
        shasum: text("shasum"),
    })
}

/// `scheme://host[:port]` of a URL, lowercased; `None` when it has none.
fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    (!authority.is_empty() && !authority.contains('@'))
        .then(|| format!("{}://{}", scheme.to_ascii_lowercase(), authority.to_ascii_lowercase()))
}

/// The tarball must be served by the registry itself: that is the origin the operator granted.
pub fn check_tarball_origin(registry: &str, tarball: &str) -> Result<()> {
    match (origin(registry), origin(tarball)) {
        (Some(r), Some(t)) if r == t => Ok(()),
        _ => Err(Refusal::new(
            "catalog-tarball-foreign",
            format!("the package's tarball {tarball} is not on the registry's origin {registry}"),
        )
        .with_data(json!({ "tarball": tarball }))),
    }
}

fn mismatch(which: &str) -> Refusal {
    Refusal::new("catalog-integrity-mismatch", format!("the downloaded tarball does not match the registry's {which}"))
        .with_data(json!({ "check": which }))
}

/// The tarball against `dist.integrity` (every sha512 entry listed; other algorithms are not
/// trusted) or, without one, `dist.shasum` (sha1 hex).
pub fn check_integrity(tarball: &[u8], chosen: &Chosen) -> Result<()> {
    if let Some(integrity) = &chosen.integrity {
        let expected: Vec<&str> = integrity.split_whitespace().filter_map(|e| e.strip_prefix("sha512-")).collect();
        if !expected.is_empty() {
            let actual = base64::engine::general_purpose::STANDARD.encode(Sha512::digest(tarball));
            // an entry may carry options after `?`
            return match expected.iter().any(|e| e.split('?').next() == Some(actual.as_str())) {
                true => Ok(()),
                false => Err(mismatch("integrity")),
            };
        }
    }
    match &chosen.shasum {
        Some(shasum) if hex::encode(Sha1::digest(tarball)).eq_ignore_ascii_case(shasum.trim()) => Ok(()),
        Some(_) => Err(mismatch("shasum")),
        None => Err(Refusal::new(
            "catalog-integrity-missing",
            "the registry states neither a sha512 integrity nor a shasum for the package's tarball",
        )),
    }
}

fn package_malformed(why: impl std::fmt::Display) -> Refusal {
    Refusal::new("catalog-package-malformed", format!("the package's tarball cannot be read: {why}"))
}

/// The envelope file of a gzipped npm tarball: `catalog.json` in the package's top directory.
pub fn extract_envelope(tgz: &[u8]) -> Result<Vec<u8>> {
    let gunzip = flate2::read::GzDecoder::new(tgz).take(MAX_UNPACKED_BYTES + 1);
    let mut archive = tar::Archive::new(gunzip);
    for entry in archive.entries().map_err(package_malformed)? {
        let mut entry = entry.map_err(package_malformed)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path().map_err(package_malformed)?.to_string_lossy().into_owned();
        let mut parts = path.split('/');
        let (Some(_top), Some(file), None) = (parts.next(), parts.next(), parts.next()) else { continue };
        if file != ENVELOPE_FILE {
            continue;
        }
        if entry.size() > capstan_catalog::MAX_ENVELOPE_BYTES as u64 {
            return Err(Refusal::new("catalog-malformed", "the package's catalog.json is larger than a catalog may be"));
        }
        let mut envelope = Vec::new();
        entry.read_to_end(&mut envelope).map_err(package_malformed)?;
        return Ok(envelope);
    }
    Err(Refusal::new("catalog-package-envelope-missing", format!("the package holds no {ENVELOPE_FILE} at its top")))
}

/// What one registry gave: the envelope, and where it came from (`<registry> <name>@<version>`).
pub struct Fetched {
    pub envelope: Vec<u8>,
    pub source: String,
}

fn get(url: &str, accept: &str) -> Result<capstan_sdk::http::Response> {
    Request::get(url).timeout(FETCH_TIMEOUT).header("accept", accept).send()
}

/// Read the packument, pick the version, download and check the tarball, take the envelope.
pub fn fetch(registry: &str, spec: &PackageSpec) -> Result<Fetched> {
    let url = spec.packument_url(registry);
    let response = get(&url, "application/json")?;
    if response.status == 404 {
        return Err(Refusal::new("catalog-package-not-found", format!("{registry} has no package {}", spec.name))
            .with_data(json!({ "package": spec.name })));
    }
    if !response.is_success() {
        return Err(Refusal::new("catalog-source-failed", format!("{url} answered HTTP {}", response.status))
            .with_data(json!({ "status": response.status })));
    }
    let packument: Value = serde_json::from_slice(&response.body).map_err(|_| packument_invalid("not JSON"))?;
    let chosen = choose(&packument, spec)?;
    check_tarball_origin(registry, &chosen.tarball)?;
    let tarball = get(&chosen.tarball, "application/octet-stream")?;
    if !tarball.is_success() {
        return Err(Refusal::new("catalog-source-failed", format!("{} answered HTTP {}", chosen.tarball, tarball.status))
            .with_data(json!({ "status": tarball.status })));
    }
    check_integrity(&tarball.body, &chosen)?;
    Ok(Fetched { envelope: extract_envelope(&tarball.body)?, source: format!("{registry} {}@{}", spec.name, chosen.version) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tgz(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, data) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, path, *data).unwrap();
        }
        let tar = builder.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        gz.finish().unwrap()
    }

    fn integrity(bytes: &[u8]) -> String {
        format!("sha512-{}", base64::engine::general_purpose::STANDARD.encode(Sha512::digest(bytes)))
    }

    fn packument() -> Value {
        json!({
            "name": "@acme/catalog",
            "dist-tags": { "latest": "1.1.0", "beta": "2.0.0-beta.1" },
            "versions": {
                "1.0.0": { "dist": { "tarball": "https://npm.example.com/@acme/catalog/-/catalog-1.0.0.tgz", "shasum": "aa" } },
                "1.1.0": { "dist": { "tarball": "https://npm.example.com/@acme/catalog/-/catalog-1.1.0.tgz", "integrity": "sha512-x" } },
                "2.0.0-beta.1": { "dist": { "tarball": "https://npm.example.com/@acme/catalog/-/catalog-2.0.0-beta.1.tgz" } }
            }
        })
    }

    #[test]
    fn package_specs_name_a_package_and_maybe_a_version_or_tag() {
        let spec = PackageSpec::parse("@acme/catalog@1.0.0").unwrap();
        assert_eq!((spec.name.as_str(), spec.selector.as_deref()), ("@acme/catalog", Some("1.0.0")));
        assert_eq!(spec.packument_url("https://npm.example.com/"), "https://npm.example.com/@acme%2fcatalog");
        assert_eq!(PackageSpec::parse("catalog").unwrap(), PackageSpec { name: "catalog".into(), selector: None });
        assert_eq!(PackageSpec::parse("catalog@beta").unwrap().selector.as_deref(), Some("beta"));
        for bad in ["", "@acme", "@/x", "Catalog", "cat alog", "catalog@", ".hidden", "@acme/catalog@1 2", "../x"] {
            assert_eq!(PackageSpec::parse(bad).unwrap_err().code(), "catalog-package-invalid", "{bad:?}");
        }
    }

    #[test]
    fn the_latest_tag_unless_pinned_by_version_or_tag() {
        let chosen =
            |sel: Option<&str>| choose(&packument(), &PackageSpec { name: "@acme/catalog".into(), selector: sel.map(String::from) });
        assert_eq!(chosen(None).unwrap().version, "1.1.0");
        assert_eq!(chosen(None).unwrap().integrity.as_deref(), Some("sha512-x"));
        assert_eq!(chosen(Some("1.0.0")).unwrap().shasum.as_deref(), Some("aa"));
        assert_eq!(chosen(Some("beta")).unwrap().version, "2.0.0-beta.1");
        assert_eq!(chosen(Some("9.9.9")).unwrap_err().code(), "catalog-package-version-not-found");
        let spec = PackageSpec::parse("x").unwrap();
        assert_eq!(choose(&json!({ "name": "x" }), &spec).unwrap_err().code(), "catalog-packument-invalid");
        assert_eq!(
            choose(&json!({ "versions": { "1.0.0": {} }, "dist-tags": { "latest": "1.0.0" } }), &spec).unwrap_err().code(),
            "catalog-packument-invalid"
        );
        // a tag naming a version the document does not hold
        assert_eq!(
            choose(&json!({ "versions": {}, "dist-tags": { "latest": "1.0.0" } }), &spec).unwrap_err().code(),
            "catalog-packument-invalid"
        );
    }

    #[test]
    fn a_tarball_off_the_registrys_origin_is_refused() {
        check_tarball_origin("http://127.0.0.1:4873/", "http://127.0.0.1:4873/x/-/x-1.0.0.tgz").unwrap();
        check_tarball_origin("https://NPM.example.com", "https://npm.example.com/x/-/x-1.0.0.tgz").unwrap();
        for foreign in [
            "https://evil.example.com/x.tgz",
            "http://npm.example.com/x.tgz",
            "https://npm.example.com:8443/x.tgz",
            "https://user@npm.example.com/x.tgz",
            "x.tgz",
        ] {
            assert_eq!(
                check_tarball_origin("https://npm.example.com", foreign).unwrap_err().code(),
                "catalog-tarball-foreign",
                "{foreign}"
            );
        }
    }

    #[test]
    fn integrity_is_checked_by_sha512_else_by_shasum() {
        let bytes = tgz(&[("package/catalog.json", b"{}")]);
        let with = |integrity: Option<String>, shasum: Option<String>| Chosen {
            version: "1.0.0".into(),
            tarball: String::new(),
            integrity,
            shasum,
        };
        check_integrity(&bytes, &with(Some(integrity(&bytes)), None)).unwrap();
        check_integrity(&bytes, &with(Some(format!("sha1-abc {}", integrity(&bytes))), None)).unwrap();
        check_integrity(&bytes, &with(None, Some(hex::encode(Sha1::digest(&bytes))))).unwrap();
        let refused = |c: Chosen| check_integrity(&bytes, &c).unwrap_err();
        let wrong = refused(with(Some(integrity(b"other")), Some(hex::encode(Sha1::digest(&bytes)))));
        assert_eq!((wrong.code(), wrong.data().unwrap()["check"].as_str()), ("catalog-integrity-mismatch", Some("integrity")));
        let wrong = refused(with(None, Some(hex::encode(Sha1::digest(b"other")))));
        assert_eq!((wrong.code(), wrong.data().unwrap()["check"].as_str()), ("catalog-integrity-mismatch", Some("shasum")));
        // a weaker algorithm alone is not an integrity: the shasum decides, and without one nothing does
        assert_eq!(refused(with(Some("sha1-abc".into()), None)).code(), "catalog-integrity-missing");
        assert_eq!(refused(with(None, None)).code(), "catalog-integrity-missing");
    }

    #[test]
    fn the_envelope_is_catalog_json_at_the_packages_top() {
        let bytes = tgz(&[
            ("package/package.json", b"{\"name\":\"x\"}"),
            ("package/docs/catalog.json", b"no"),
            ("package/catalog.json", b"{\"format\":1}"),
        ]);
        assert_eq!(extract_envelope(&bytes).unwrap(), b"{\"format\":1}");
        let missing = tgz(&[("package/package.json", b"{}"), ("package/docs/catalog.json", b"no")]);
        assert_eq!(extract_envelope(&missing).unwrap_err().code(), "catalog-package-envelope-missing");
        assert_eq!(extract_envelope(b"not a gzip stream").unwrap_err().code(), "catalog-package-malformed");
        let mut truncated = bytes.clone();
        truncated.truncate(bytes.len() / 2);
        assert!(matches!(
            extract_envelope(&truncated).unwrap_err().code(),
            "catalog-package-malformed" | "catalog-package-envelope-missing"
        ));
    }
}
