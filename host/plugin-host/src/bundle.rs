//! Plugin bundles: one file (a tar archive) holding the manifest, the component and, once signed,
//! an Ed25519 signature over the bundle's canonical digest.
//!
//! The archive has exactly these regular-file entries, in this order:
//! `capstan-plugin.toml`, `plugin.wasm`, the page templates `pages/<name>.html` (none or more,
//! in name order), and optionally `signature.json`
//! (`{"publisher": "capstan-ed25519:…", "signature": "<base64 of 64 bytes>"}`).
//!
//! The canonical digest is SHA-256 over the UTF-8 text
//! `capstan-plugin-bundle-v1\n{id}\n{version}\n{hex sha256(manifest)}\n{hex sha256(component)}\n`;
//! a bundle with page templates uses the domain `capstan-plugin-bundle-v2` and adds a line
//! `{name} {hex sha256(template)}\n` per template. A changed byte anywhere changes what the
//! signature covers, and a template cannot be added or removed without it.

use super::manifest::{Capability, Limits, MANIFEST_FILE, Manifest};
use crate::refusal::{Refusal, Result};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::{Signature, Signer, SigningKey};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// The largest bundle accepted, in bytes.
pub const MAX_BUNDLE_BYTES: usize = 64 * 1024 * 1024;
/// The largest manifest accepted inside a bundle, in bytes.
pub const MAX_MANIFEST_BYTES: usize = 64 * 1024;
/// The largest `signature.json` accepted, in bytes.
const MAX_SIGNATURE_BYTES: usize = 4096;

/// The component's entry name inside a bundle.
pub const COMPONENT_FILE: &str = "plugin.wasm";
/// The signature's entry name inside a bundle.
pub const SIGNATURE_FILE: &str = "signature.json";
/// The file extension `capstan plugin build` writes.
pub const BUNDLE_EXTENSION: &str = "capstan-plugin";

pub use capstan_publisher_key::PUBLIC_KEY_PREFIX;

const DIGEST_DOMAIN: &str = "capstan-plugin-bundle-v1";
/// The digest's domain for a bundle with page templates.
const DIGEST_DOMAIN_PAGES: &str = "capstan-plugin-bundle-v2";
/// The most page templates a bundle carries.
pub const MAX_PAGE_TEMPLATES: usize = 32;
/// The largest page template, in bytes.
pub const MAX_PAGE_TEMPLATE_BYTES: usize = 64 * 1024;
const WASM_MAGIC: &[u8; 4] = b"\0asm";
const COMPONENT_VERSION: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];
const CORE_MODULE_VERSION: [u8; 4] = [0x01, 0x00, 0x00, 0x00];

fn malformed(message: impl Into<String>) -> Refusal {
    Refusal::new("bundle-malformed", message)
}

/// A publisher's Ed25519 public key, `capstan-ed25519:<43 base64url characters>`: one type for
/// plugin publishers and catalog keys alike (`capstan-publisher-key`).
pub use capstan_publisher_key::PublisherKey;
/// Publisher private key files: generated, written and read under the private-file rules.
pub use capstan_publisher_key::files::{generate_key, read_key_file, write_key_file};

/// A publisher key that does not parse, refused under its own code (`publisher-key-invalid`).
pub fn key_refusal(e: capstan_publisher_key::KeyError) -> Refusal {
    Refusal::from(e)
}

/// Who signed a bundle, and the signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSignature {
    /// The key that signed the bundle.
    pub publisher: PublisherKey,
    /// The Ed25519 signature over the bundle's canonical digest.
    pub signature: [u8; 64],
}

/// `signature.json` as stored.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignatureFile {
    publisher: String,
    signature: String,
}

/// A parsed bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// The parsed, validated manifest.
    pub manifest: Manifest,
    /// The manifest exactly as stored, which the digest covers.
    pub manifest_text: String,
    /// The WebAssembly component's bytes.
    pub component: Vec<u8>,
    /// The dashboard page templates, by entry name (`pages/<name>.html`).
    pub pages: BTreeMap<String, String>,
    /// The signature, or `None` for an unsigned bundle.
    pub signature: Option<BundleSignature>,
}

/// What `capstan plugin inspect` shows about a bundle.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    /// The plugin's id.
    pub id: String,
    /// The plugin's display name.
    pub name: String,
    /// The plugin's version.
    pub version: String,
    /// The WIT world the plugin targets, like `capstan:plugin@0.1.0`.
    pub wit: String,
    /// What the plugin says it does.
    pub description: String,
    /// The manifest's publisher display name (not verified; the signer is).
    pub publisher: Option<String>,
    /// The capabilities the manifest requests, in canonical order.
    pub capabilities: Vec<Capability>,
    /// The memory and concurrency limits the plugin runs under.
    pub limits: Limits,
    /// The canonical digest the signature covers, hex.
    pub digest: String,
    /// SHA-256 of the manifest text, hex.
    pub manifest_sha256: String,
    /// SHA-256 of the component, hex.
    pub component_sha256: String,
    /// The component's size in bytes.
    pub component_bytes: usize,
    /// The signer's public key, when signed (whether it verifies is `verify`'s question).
    pub signed_by: Option<String>,
    /// The signer's fingerprint, when signed.
    pub fingerprint: Option<String>,
}

impl Bundle {
    /// A new unsigned bundle from a manifest text and a component, both validated like `parse`.
    pub fn new(manifest_text: String, component: Vec<u8>) -> Result<Bundle> {
        if manifest_text.len() > MAX_MANIFEST_BYTES {
            return Err(malformed(format!("{MANIFEST_FILE} is larger than {} KiB", MAX_MANIFEST_BYTES / 1024)));
        }
        let manifest = Manifest::parse(&manifest_text)?;
        check_component(&component)?;
        let bundle = Bundle { manifest, manifest_text, component, pages: BTreeMap::new(), signature: None };
        if bundle.encoded_len() > MAX_BUNDLE_BYTES {
            return Err(too_large(bundle.encoded_len()));
        }
        Ok(bundle)
    }

    /// This bundle carrying the page templates `pages` (entry name → text), each checked as
    /// `parse` checks them.
    pub fn with_pages(mut self, pages: BTreeMap<String, String>) -> Result<Bundle> {
        if pages.len() > MAX_PAGE_TEMPLATES {
            return Err(malformed(format!("a bundle carries at most {MAX_PAGE_TEMPLATES} page templates")));
        }
        for (name, text) in &pages {
            check_page_template(name, text)?;
        }
        self.pages = pages;
        self.signature = None;
        if self.encoded_len() > MAX_BUNDLE_BYTES {
            return Err(too_large(self.encoded_len()));
        }
        Ok(self)
    }

    /// Parse a bundle file's bytes.
    ///
    /// Refuses `bundle-too-large`, `bundle-malformed` (not a tar archive; a missing, extra,
    /// duplicate, misordered or non-regular entry; an oversized entry; a manifest that is not
    /// UTF-8; a component that is not a WebAssembly component; a malformed `signature.json`; data
    /// after the archive), and passes the manifest's refusals through (`manifest-invalid`,
    /// `plugin-id-invalid`, `capability-unknown`). It does not check the signature: see `verify`.
    pub fn parse(bytes: &[u8]) -> Result<Bundle> {
        if bytes.len() > MAX_BUNDLE_BYTES {
            return Err(too_large(bytes.len()));
        }
        let mut archive = tar::Archive::new(bytes);
        let entries = archive.entries().map_err(|e| malformed(format!("the bundle is not a tar archive: {e}")))?.raw(true);
        let (mut manifest_bytes, mut component, mut signature_raw) = (None, None, None);
        let mut pages: BTreeMap<String, String> = BTreeMap::new();
        let mut end = 0u64;
        for entry in entries {
            let mut entry = entry.map_err(|e| malformed(format!("the bundle is not a valid tar archive: {e}")))?;
            let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let is_page = path.starts_with("pages/");
            // the order: manifest, component, templates in name order, signature; nothing after
            let (limit, expected) = match (&manifest_bytes, &component, &signature_raw) {
                (None, _, _) => (MAX_MANIFEST_BYTES, path == MANIFEST_FILE),
                (Some(_), None, _) => (MAX_BUNDLE_BYTES, path == COMPONENT_FILE),
                (Some(_), Some(_), None) if is_page => {
                    (MAX_PAGE_TEMPLATE_BYTES, pages.keys().next_back().is_none_or(|last| last.as_str() < path.as_str()))
                }
                (Some(_), Some(_), None) => (MAX_SIGNATURE_BYTES, path == SIGNATURE_FILE),
                (Some(_), Some(_), Some(_)) => (0, false),
            };
            if !expected {
                let seen = path == MANIFEST_FILE && manifest_bytes.is_some()
                    || path == COMPONENT_FILE && component.is_some()
                    || path == SIGNATURE_FILE && signature_raw.is_some()
                    || pages.contains_key(&path);
                return Err(if seen {
                    malformed(format!("the entry {path:?} appears twice"))
                } else if signature_raw.is_some() {
                    malformed(format!(
                        "unexpected entry {path:?} after {SIGNATURE_FILE}; a bundle holds only {MANIFEST_FILE}, {COMPONENT_FILE}, pages/<name>.html and {SIGNATURE_FILE}"
                    ))
                } else if is_page && component.is_some() {
                    malformed(format!("the page template {path:?} is out of name order"))
                } else if component.is_some() {
                    malformed(format!(
                        "unexpected entry {path:?}; after {COMPONENT_FILE} only pages/<name>.html and {SIGNATURE_FILE} may follow"
                    ))
                } else {
                    let want = if manifest_bytes.is_none() { MANIFEST_FILE } else { COMPONENT_FILE };
                    let position = if manifest_bytes.is_none() { 1 } else { 2 };
                    malformed(format!("expected the entry {want:?} at position {position}, found {path:?}"))
                });
            }
            if entry.header().entry_type() != tar::EntryType::Regular {
                return Err(malformed(format!("the entry {path:?} is not a regular file")));
            }
            let size = entry.size();
            if size > limit as u64 {
                return Err(malformed(format!("the entry {path:?} is larger than its limit of {limit} bytes")));
            }
            let mut data = Vec::with_capacity(size as usize);
            Read::by_ref(&mut entry)
                .take(size)
                .read_to_end(&mut data)
                .map_err(|e| malformed(format!("reading the entry {path:?} failed: {e}")))?;
            if data.len() as u64 != size {
                return Err(malformed(format!("the entry {path:?} is truncated")));
            }
            end = entry.raw_file_position() + size.div_ceil(512) * 512;
            if manifest_bytes.is_none() {
                manifest_bytes = Some(data);
            } else if component.is_none() {
                component = Some(data);
            } else if is_page && signature_raw.is_none() {
                if pages.len() == MAX_PAGE_TEMPLATES {
                    return Err(malformed(format!("a bundle carries at most {MAX_PAGE_TEMPLATES} page templates")));
                }
                let text = String::from_utf8(data).map_err(|_| malformed(format!("the page template {path:?} is not UTF-8 text")))?;
                check_page_template(&path, &text)?;
                pages.insert(path, text);
            } else {
                signature_raw = Some(data);
            }
        }
        let (Some(manifest_bytes), Some(component)) = (manifest_bytes.clone(), component) else {
            let missing = if manifest_bytes.is_none() { MANIFEST_FILE } else { COMPONENT_FILE };
            return Err(malformed(format!("the bundle has no {missing} entry")));
        };
        match bytes.get(end as usize..) {
            Some(rest) if rest.iter().all(|b| *b == 0) => {}
            _ => return Err(malformed("the bundle has data after the archive's end")),
        }
        let signature = signature_raw.map(|raw| parse_signature_file(&raw)).transpose()?;
        let manifest_text = String::from_utf8(manifest_bytes).map_err(|_| malformed(format!("{MANIFEST_FILE} is not UTF-8 text")))?;
        let manifest = Manifest::parse(&manifest_text)?;
        check_component(&component)?;
        Ok(Bundle { manifest, manifest_text, component, pages, signature })
    }

    /// The bundle file's bytes: a deterministic tar (mtime 0, mode 0644, uid/gid 0, no names).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::with_capacity(self.encoded_len()));
        let mut append = |name: &str, data: &[u8]| {
            let mut header = tar::Header::new_ustar();
            // names are fixed ASCII well under 100 bytes; neither call can fail
            let _ = header.set_path(name);
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_cksum();
            // writing into a Vec cannot fail
            let _ = builder.append(&header, data);
        };
        append(MANIFEST_FILE, self.manifest_text.as_bytes());
        append(COMPONENT_FILE, &self.component);
        for (name, text) in &self.pages {
            append(name, text.as_bytes());
        }
        if let Some(signature) = &self.signature {
            let file = SignatureFile { publisher: signature.publisher.to_string(), signature: B64.encode(signature.signature) };
            let json = serde_json::to_vec(&file).unwrap_or_default();
            append(SIGNATURE_FILE, &json);
        }
        builder.into_inner().unwrap_or_default()
    }

    /// The size `to_bytes` produces.
    fn encoded_len(&self) -> usize {
        let entry = |n: usize| 512 + n.div_ceil(512) * 512;
        entry(self.manifest_text.len())
            + entry(self.component.len())
            + self.pages.values().map(|t| entry(t.len())).sum::<usize>()
            + if self.signature.is_some() { entry(200) } else { 0 }
            + 1024
    }

    /// The canonical digest the signature covers.
    pub fn digest(&self) -> [u8; 32] {
        let domain = if self.pages.is_empty() { DIGEST_DOMAIN } else { DIGEST_DOMAIN_PAGES };
        let mut text = format!(
            "{domain}\n{}\n{}\n{}\n{}\n",
            self.manifest.id,
            self.manifest.version,
            self.manifest_sha256_hex(),
            self.component_sha256_hex()
        );
        for (name, template) in &self.pages {
            text.push_str(&format!("{name} {}\n", hex::encode(Sha256::digest(template.as_bytes()))));
        }
        Sha256::digest(text.as_bytes()).into()
    }

    /// The canonical digest as lowercase hex, as inspect output and the registry record show it.
    pub fn digest_hex(&self) -> String {
        hex::encode(self.digest())
    }

    /// SHA-256 of the manifest text as lowercase hex (one input to the digest).
    pub fn manifest_sha256_hex(&self) -> String {
        hex::encode(Sha256::digest(self.manifest_text.as_bytes()))
    }

    /// SHA-256 of the component as lowercase hex (one input to the digest).
    pub fn component_sha256_hex(&self) -> String {
        hex::encode(Sha256::digest(&self.component))
    }

    /// Sign the canonical digest, replacing any previous signature.
    pub fn sign(&mut self, key: &SigningKey) {
        let signature = key.sign(&self.digest());
        self.signature = Some(BundleSignature { publisher: PublisherKey::from(key), signature: signature.to_bytes() });
    }

    /// Check the signature, then the signer's trust; returns the signer.
    ///
    /// Refuses `bundle-signature-invalid` (unsigned, or the signature does not verify — any changed
    /// byte of the manifest or component reads this way) and `publisher-untrusted` (it verifies,
    /// but the key is not in `trusted`; data carries the key and its fingerprint).
    pub fn verify(&self, trusted: &[PublisherKey]) -> Result<PublisherKey> {
        let signature = self.verify_signature()?;
        if !trusted.contains(&signature.publisher) {
            return Err(Refusal::new(
                "publisher-untrusted",
                format!(
                    "the bundle is signed by {} (fingerprint {}), which is not a trusted publisher",
                    signature.publisher,
                    signature.publisher.fingerprint()
                ),
            )
            .with_data(json!({ "publicKey": signature.publisher.to_string(), "fingerprint": signature.publisher.fingerprint() })));
        }
        Ok(signature.publisher.clone())
    }

    /// Check only that the bundle is signed and the signature verifies (no trust decision).
    pub fn verify_signature(&self) -> Result<&BundleSignature> {
        let Some(signature) = &self.signature else {
            return Err(Refusal::new("bundle-signature-invalid", "bundle is unsigned"));
        };
        signature.publisher.verifying_key().verify_strict(&self.digest(), &Signature::from_bytes(&signature.signature)).map_err(|_| {
            Refusal::new(
                "bundle-signature-invalid",
                format!("the signature does not verify for {}: the bundle was changed after signing", signature.publisher),
            )
            .with_data(json!({ "publicKey": signature.publisher.to_string(), "fingerprint": signature.publisher.fingerprint() }))
        })?;
        Ok(signature)
    }

    /// What `capstan plugin inspect` shows: the manifest, hashes and signer, without verifying.
    pub fn inspect(&self) -> Inspection {
        let m = &self.manifest;
        Inspection {
            id: m.id.clone(),
            name: m.name.clone(),
            version: m.version.to_string(),
            wit: m.wit.clone(),
            description: m.description.clone(),
            publisher: m.publisher.clone(),
            capabilities: m.capabilities.clone(),
            limits: m.limits,
            digest: self.digest_hex(),
            manifest_sha256: self.manifest_sha256_hex(),
            component_sha256: self.component_sha256_hex(),
            component_bytes: self.component.len(),
            signed_by: self.signature.as_ref().map(|s| s.publisher.to_string()),
            fingerprint: self.signature.as_ref().map(|s| s.publisher.fingerprint()),
        }
    }

    /// The file name `capstan plugin build` gives this bundle: `<id>-<version>.capstan-plugin`.
    pub fn file_name(&self) -> String {
        format!("{}-{}.{BUNDLE_EXTENSION}", self.manifest.id, self.manifest.version)
    }
}

fn too_large(len: usize) -> Refusal {
    Refusal::new("bundle-too-large", format!("the bundle is {len} bytes; the limit is {MAX_BUNDLE_BYTES} bytes (64 MiB)"))
        .with_data(json!({ "bytes": len, "limit": MAX_BUNDLE_BYTES }))
}

/// The page templates of a plugin crate: every file of `<dir>/pages` (none when there is no
/// such directory), each `<name>.html`, checked as a bundle's are (`bundle-malformed` naming the
/// file otherwise).
pub fn read_page_templates(dir: &Path) -> Result<BTreeMap<String, String>> {
    let pages_dir = dir.join("pages");
    let mut pages = BTreeMap::new();
    let entries = match std::fs::read_dir(&pages_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(pages),
        Err(e) => return Err(malformed(format!("cannot read {}: {}", pages_dir.display(), e.kind()))),
    };
    for entry in entries {
        let entry = entry.map_err(|e| malformed(format!("cannot read {}: {}", pages_dir.display(), e.kind())))?;
        let name = format!("pages/{}", entry.file_name().to_string_lossy());
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            return Err(malformed(format!("{name} is not a regular file; pages/ holds only <name>.html templates")));
        }
        let text =
            std::fs::read_to_string(entry.path()).map_err(|e| malformed(format!("cannot read {name} as UTF-8 text: {}", e.kind())))?;
        check_page_template(&name, &text)?;
        pages.insert(name, text);
    }
    Ok(pages)
}

/// Refuse `bundle-malformed` unless `name` is `pages/<name>.html` and `text` carries no script:
/// plugin pages render under the dashboard's policy, and a plugin ships no script to it.
pub fn check_page_template(name: &str, text: &str) -> Result<()> {
    if !crate::faces::valid_template_name(name) {
        return Err(malformed(format!("the entry {name:?} is not a page template name (pages/<name>.html, <name> of a-z 0-9 - _)")));
    }
    if text.len() > MAX_PAGE_TEMPLATE_BYTES {
        return Err(malformed(format!("the page template {name:?} is larger than {MAX_PAGE_TEMPLATE_BYTES} bytes")));
    }
    // as written, and as the browser gets it once the template's own constructs are gone
    // (`<scr{{ "" }}ipt>` is a script too)
    let folded = text.to_ascii_lowercase();
    let markup = without_template_constructs(&folded);
    for folded in [&folded, &markup] {
        if folded.contains("<script") || folded.contains("javascript:") {
            return Err(malformed(format!("the page template {name:?} carries a script; plugin pages run no plugin script")));
        }
        // nothing that re-points the page's links or navigates it away by itself
        if folded.contains("<base") || folded.contains("http-equiv") {
            return Err(malformed(format!("the page template {name:?} carries <base> or http-equiv; a plugin page keeps the dashboard's")));
        }
    }
    if let Some(found) = script_capable(&markup) {
        return Err(malformed(format!("the page template {name:?} carries {found}")));
    }
    Ok(())
}

/// Elements that run or frame other content: a plugin page embeds none.
const EMBEDDING_ELEMENTS: &[&str] = &["iframe", "frame", "frameset", "object", "embed", "applet", "portal"];

/// `text` with its template constructs (`{{ … }}`, `{% … %}`, `{# … #}`) taken out, so markup
/// split around one (`on{{ "" }}click=`) reads as it will render.
fn without_template_constructs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let close = match rest.as_bytes().get(open + 1) {
            Some(b'{') => "}}",
            Some(b'%') => "%}",
            Some(b'#') => "#}",
            _ => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
                continue;
            }
        };
        out.push_str(&rest[..open]);
        // an unterminated construct is the template engine's to refuse: nothing after it renders
        rest = rest[open + 2..].find(close).map_or("", |end| &rest[open + 2 + end + 2..]);
    }
    out.push_str(rest);
    out
}

/// The first script-capable thing in `markup` (lowercase, template constructs taken out), said
/// for a person: an element that frames or embeds other content, an event-handler attribute
/// (`on…`, and htmx's `hx-on…`), a URL with a script scheme, a form sent away from the
/// dashboard (an `action` or `formaction` that is an absolute URL, `http:`, `https:`, `//`…).
fn script_capable(markup: &str) -> Option<String> {
    let shown = |s: &str| capstan_core::text::truncate(s, 60);
    let mut at = 0;
    while let Some(open) = markup[at..].find('<') {
        let start = at + open + 1;
        let tag_len = markup[start..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(markup.len() - start);
        let tag = &markup[start..start + tag_len];
        if !tag.starts_with(|c: char| c.is_ascii_alphabetic()) {
            at = start;
            continue;
        }
        if EMBEDDING_ELEMENTS.contains(&tag) {
            return Some(format!("a <{tag}> element; a plugin page frames or embeds no other content"));
        }
        let (attributes, end) = attributes(markup, start + tag_len);
        for (attribute, value) in attributes {
            if (attribute.starts_with("on") && attribute.len() > 2) || attribute.starts_with("hx-on") || attribute.starts_with("data-hx-on")
            {
                return Some(format!("the event-handler attribute {}; plugin pages run no plugin script", shown(attribute)));
            }
            let url = decode_entities(value);
            let scheme = url_scheme(&url);
            if matches!(scheme.as_deref(), Some("javascript" | "vbscript")) {
                return Some(format!("a script URL in {}; plugin pages run no plugin script", shown(attribute)));
            }
            let sends = (tag == "form" && attribute == "action") || attribute == "formaction";
            if sends && (scheme.is_some() || leaves_the_origin(&url)) {
                return Some(format!(
                    "a form sent to {} ({attribute}); a plugin page's forms go to the dashboard (a path such as /p/<pluginId>/-/call/<method>)",
                    shown(&url)
                ));
            }
        }
        at = end;
    }
    None
}

/// The attributes of the tag whose name ends at `from` in `markup`, as (name, value), and where
/// the tag ends. Values are read as a browser reads them: quoted, or up to whitespace or `>`.
fn attributes(markup: &str, from: usize) -> (Vec<(&str, &str)>, usize) {
    let bytes = markup.as_bytes();
    let (mut found, mut at) = (Vec::new(), from);
    let skip = |at: &mut usize, what: fn(u8) -> bool| {
        while *at < bytes.len() && what(bytes[*at]) {
            *at += 1;
        }
    };
    loop {
        skip(&mut at, |b| b.is_ascii_whitespace() || b == b'/');
        if at >= bytes.len() || bytes[at] == b'>' {
            return (found, (at + 1).min(bytes.len()));
        }
        let name_start = at;
        // a name is anything up to whitespace, `/`, `>` or `=` (a leading `=` is part of it)
        at += 1;
        skip(&mut at, |b| !(b.is_ascii_whitespace() || matches!(b, b'/' | b'>' | b'=')));
        let name = &markup[name_start..at];
        skip(&mut at, |b| b.is_ascii_whitespace());
        let mut value = "";
        if at < bytes.len() && bytes[at] == b'=' {
            at += 1;
            skip(&mut at, |b| b.is_ascii_whitespace());
            match bytes.get(at) {
                Some(&quote) if quote == b'"' || quote == b'\'' => {
                    let end = markup[at + 1..].find(quote as char).map_or(bytes.len(), |end| at + 1 + end);
                    value = &markup[at + 1..end];
                    at = (end + 1).min(bytes.len());
                }
                _ => {
                    let start = at;
                    skip(&mut at, |b| !(b.is_ascii_whitespace() || b == b'>'));
                    value = &markup[start..at];
                }
            }
        }
        found.push((name, value));
    }
}

/// An attribute value with the character references a browser resolves in it that could spell
/// a scheme or a slash (`&#104;ttps:`, `&colon;`, `&sol;&sol;`).
fn decode_entities(value: &str) -> String {
    if !value.contains('&') {
        return value.to_string();
    }
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let reference = rest[1..].find(';').map(|end| &rest[1..1 + end]).filter(|r| r.len() <= 10);
        let decoded = reference.and_then(|r| match r {
            "colon" => Some(':'),
            "sol" => Some('/'),
            "bsol" => Some('\\'),
            "tab" | "newline" => Some(' '),
            _ => {
                let number = r.strip_prefix('#')?;
                let code = match number.strip_prefix(['x', 'X']) {
                    Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                    None => number.parse().ok()?,
                };
                char::from_u32(code)
            }
        });
        match (reference, decoded) {
            (Some(r), Some(c)) => {
                out.push(c);
                rest = &rest[r.len() + 2..];
            }
            _ => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A URL as a browser reads it: tabs and line breaks anywhere dropped, leading spaces and
/// controls trimmed.
fn url_text(url: &str) -> String {
    url.chars().filter(|c| !matches!(c, '\t' | '\n' | '\r')).collect::<String>().trim_start_matches(|c: char| c <= ' ').to_string()
}

/// The scheme `url` names (`https`, `javascript`), if it names one.
fn url_scheme(url: &str) -> Option<String> {
    let url = url_text(url);
    let (scheme, _) = url.split_once(':')?;
    let valid =
        scheme.starts_with(|c: char| c.is_ascii_alphabetic()) && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    valid.then(|| scheme.to_ascii_lowercase())
}

/// Whether `url` (without a scheme) is network-path relative (`//host`, `\\host`, `/\host`):
/// another origin.
fn leaves_the_origin(url: &str) -> bool {
    let url = url_text(url);
    let mut leading = url.chars().take(2);
    matches!((leading.next(), leading.next()), (Some('/' | '\\'), Some('/' | '\\')))
}

/// Refuse `bundle-malformed` unless `bytes` starts like a WebAssembly component.
pub fn check_component(bytes: &[u8]) -> Result<()> {
    if bytes.len() < 8 || &bytes[..4] != WASM_MAGIC {
        return Err(malformed(format!("{COMPONENT_FILE} is not WebAssembly")));
    }
    match <[u8; 4]>::try_from(&bytes[4..8]) {
        Ok(COMPONENT_VERSION) => Ok(()),
        Ok(CORE_MODULE_VERSION) => Err(malformed(format!("{COMPONENT_FILE} is a core module, not a component"))),
        _ => Err(malformed(format!("{COMPONENT_FILE} has an unsupported WebAssembly version or layer"))),
    }
}

fn parse_signature_file(raw: &[u8]) -> Result<BundleSignature> {
    let file: SignatureFile =
        serde_json::from_slice(raw).map_err(|e| malformed(format!("{SIGNATURE_FILE} is not {{\"publisher\", \"signature\"}}: {e}")))?;
    let publisher: PublisherKey =
        file.publisher.parse().map_err(|e: capstan_publisher_key::KeyError| malformed(format!("{SIGNATURE_FILE}: {e}")))?;
    let bytes = B64.decode(&file.signature).map_err(|_| malformed(format!("{SIGNATURE_FILE}: the signature is not base64")))?;
    let signature: [u8; 64] = bytes.try_into().map_err(|_| malformed(format!("{SIGNATURE_FILE}: the signature is not 64 bytes")))?;
    Ok(BundleSignature { publisher, signature })
}

/// Read a bundle file's bytes, refusing `bundle-too-large` before reading more than the limit and
/// `bundle-unreadable` when it is missing, not a regular file, or cannot be read.
pub fn read_bundle_file(path: &Path) -> Result<Vec<u8>> {
    let unreadable = |why: String| {
        Refusal::new("bundle-unreadable", format!("cannot read the bundle {}: {why}", path.display()))
            .with_data(json!({ "path": path.display().to_string() }))
    };
    let file = std::fs::File::open(path).map_err(|e| unreadable(e.kind().to_string()))?;
    let meta = file.metadata().map_err(|e| unreadable(e.kind().to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    if meta.len() > MAX_BUNDLE_BYTES as u64 {
        return Err(too_large(usize::try_from(meta.len()).unwrap_or(usize::MAX)));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_BUNDLE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|e| unreadable(e.kind().to_string()))?;
    if bytes.len() > MAX_BUNDLE_BYTES {
        return Err(too_large(bytes.len()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const MANIFEST: &str = r#"[plugin]
id = "example"
name = "Example"
version = "1.2.3"
wit = "capstan:plugin@0.1.0"

[capabilities]
requested = ["store", "log"]
"#;

    pub(super) fn component() -> Vec<u8> {
        let mut c = b"\0asm\x0d\x00\x01\x00".to_vec();
        c.extend((0..1000u32).map(|i| (i * 7 % 251) as u8));
        c
    }

    pub(super) fn bundle() -> Bundle {
        Bundle::new(MANIFEST.to_string(), component()).unwrap()
    }

    pub(super) fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn code(bytes: &[u8]) -> String {
        Bundle::parse(bytes).unwrap_err().code.to_string()
    }

    /// A raw tar with the given entries (bypassing `to_bytes`' fixed layout), their names
    /// written byte for byte (`set_path` would turn `./x` or `x/` into `x`).
    pub(super) fn tar_of(entries: &[(&str, &[u8], tar::EntryType)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, data, kind) in entries {
            let mut header = tar::Header::new_ustar();
            header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(*kind);
            header.set_cksum();
            builder.append(&header, *data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn round_trips_and_is_deterministic() {
        let b = bundle();
        let bytes = b.to_bytes();
        assert_eq!(Bundle::parse(&bytes).unwrap(), b);
        assert_eq!(bytes, bundle().to_bytes(), "same input, same bytes");
        assert_eq!(bytes.len(), b.encoded_len());

        let mut signed = bundle();
        signed.sign(&key(1));
        let bytes = signed.to_bytes();
        let parsed = Bundle::parse(&bytes).unwrap();
        assert_eq!(parsed, signed);
        assert_eq!(parsed.to_bytes(), bytes);
        let mut again = bundle();
        again.sign(&key(1));
        assert_eq!(again.to_bytes(), bytes, "Ed25519 is deterministic, so a signed bundle is too");
        assert!(signed.encoded_len() >= bytes.len());

        let mut archive = tar::Archive::new(&bytes[..]);
        let names: Vec<String> = archive.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
        assert_eq!(names, [MANIFEST_FILE, COMPONENT_FILE, SIGNATURE_FILE]);
        let mut archive = tar::Archive::new(&bytes[..]);
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let h = entry.header();
            assert_eq!((h.mode().unwrap(), h.uid().unwrap(), h.gid().unwrap(), h.mtime().unwrap()), (0o644, 0, 0, 0));
            assert_eq!(h.username().unwrap(), Some(""));
        }
    }

    #[test]
    fn digest_is_the_documented_text() {
        let b = bundle();
        let text = format!(
            "capstan-plugin-bundle-v1\nexample\n1.2.3\n{}\n{}\n",
            hex::encode(Sha256::digest(MANIFEST.as_bytes())),
            hex::encode(Sha256::digest(component()))
        );
        assert_eq!(b.digest(), <[u8; 32]>::from(Sha256::digest(text.as_bytes())));
        assert_eq!(b.digest_hex(), hex::encode(b.digest()));
    }

    #[test]
    fn signs_and_verifies() {
        let mut b = bundle();
        let k = key(1);
        let publisher = PublisherKey::from(&k);
        b.sign(&k);
        let parsed = Bundle::parse(&b.to_bytes()).unwrap();
        assert_eq!(parsed.verify(std::slice::from_ref(&publisher)).unwrap(), publisher);
        assert_eq!(parsed.verify(&[PublisherKey::from(&key(2)), publisher.clone()]).unwrap(), publisher);

        let err = parsed.verify(&[PublisherKey::from(&key(2))]).unwrap_err();
        assert_eq!(err.code, "publisher-untrusted");
        assert_eq!(err.data.unwrap()["fingerprint"], publisher.fingerprint());
        assert_eq!(parsed.verify(&[]).unwrap_err().code, "publisher-untrusted");

        let err = bundle().verify(std::slice::from_ref(&publisher)).unwrap_err();
        assert_eq!(err.code, "bundle-signature-invalid");
        assert_eq!(err.message, "bundle is unsigned");
        let unsigned = Bundle::parse(&bundle().to_bytes()).unwrap();
        assert_eq!(unsigned.verify(&[publisher]).unwrap_err().code, "bundle-signature-invalid");
    }

    #[test]
    fn a_signature_by_another_key_does_not_verify() {
        let mut b = bundle();
        b.sign(&key(1));
        let mut sig = b.signature.clone().unwrap();
        sig.publisher = PublisherKey::from(&key(2));
        b.signature = Some(sig);
        assert_eq!(b.verify(&[PublisherKey::from(&key(2))]).unwrap_err().code, "bundle-signature-invalid");
    }

    #[test]
    fn one_changed_byte_breaks_the_signature() {
        let k = key(3);
        let trusted = [PublisherKey::from(&k)];
        let mut b = bundle();
        b.sign(&k);
        let bytes = b.to_bytes();
        // locate the two payloads inside the archive and flip every byte of each in turn
        let manifest_at = bytes.windows(MANIFEST.len()).position(|w| w == MANIFEST.as_bytes()).unwrap();
        let component_at = bytes.windows(component().len()).position(|w| w == component()).unwrap();
        let mut checked = 0;
        for offset in (manifest_at..manifest_at + MANIFEST.len()).chain(component_at..component_at + component().len()) {
            let mut changed = bytes.clone();
            changed[offset] ^= 0x01;
            match Bundle::parse(&changed) {
                // still a well-formed bundle: the signature must catch it
                Ok(parsed) => {
                    assert_eq!(parsed.verify(&trusted).unwrap_err().code, "bundle-signature-invalid", "byte {offset}");
                    checked += 1;
                }
                // a change the parser already refuses (a TOML syntax break, the wasm header) is
                // refused by name too
                Err(err) => assert!(
                    ["bundle-malformed", "manifest-invalid", "plugin-id-invalid", "plugin-id-reserved", "capability-unknown"]
                        .contains(&err.code.as_ref()),
                    "byte {offset}: {err}"
                ),
            }
        }
        assert!(checked > 1000, "most flips reach the signature check ({checked})");
    }

    #[test]
    fn refuses_oversized_bundles() {
        let big = vec![0u8; MAX_BUNDLE_BYTES + 1];
        assert_eq!(code(&big), "bundle-too-large");
        let mut huge = component();
        huge.resize(MAX_BUNDLE_BYTES, 0);
        assert_eq!(Bundle::new(MANIFEST.into(), huge).unwrap_err().code, "bundle-too-large");
    }

    #[test]
    fn refuses_garbage() {
        assert_eq!(code(b""), "bundle-malformed");
        assert_eq!(code(b"hello, this is not a tar archive"), "bundle-malformed");
        assert_eq!(code(&[0x5a; 4096]), "bundle-malformed");
        let mut truncated = bundle().to_bytes();
        truncated.truncate(700);
        assert_eq!(code(&truncated), "bundle-malformed");
        let mut trailing = bundle().to_bytes();
        trailing.extend_from_slice(b"appended");
        assert_eq!(code(&trailing), "bundle-malformed");
        let mut header_flip = bundle().to_bytes();
        header_flip[140] ^= 0x04; // inside the first header's fields: the checksum catches it
        assert_eq!(code(&header_flip), "bundle-malformed");
    }

    #[test]
    fn refuses_a_core_module_and_non_wasm() {
        let core = b"\0asm\x01\x00\x00\x00rest".to_vec();
        let bytes =
            tar_of(&[(MANIFEST_FILE, MANIFEST.as_bytes(), tar::EntryType::Regular), (COMPONENT_FILE, &core, tar::EntryType::Regular)]);
        let err = Bundle::parse(&bytes).unwrap_err();
        assert_eq!(err.code, "bundle-malformed");
        assert!(err.message.contains("core module, not a component"), "{}", err.message);
        for bad in [&b"\0asm"[..], b"\0asm\x0e\x00\x01\x00", b"ELF\0\x0d\x00\x01\x00", b""] {
            let bytes =
                tar_of(&[(MANIFEST_FILE, MANIFEST.as_bytes(), tar::EntryType::Regular), (COMPONENT_FILE, bad, tar::EntryType::Regular)]);
            assert_eq!(code(&bytes), "bundle-malformed");
        }
        assert_eq!(Bundle::new(MANIFEST.into(), core).unwrap_err().code, "bundle-malformed");
    }

    #[test]
    fn refuses_missing_extra_duplicate_and_odd_entries() {
        let m = MANIFEST.as_bytes();
        let c = component();
        let r = tar::EntryType::Regular;
        let mut signed = bundle();
        signed.sign(&key(1));
        let sig = serde_json::to_vec(&SignatureFile {
            publisher: PublisherKey::from(&key(1)).to_string(),
            signature: B64.encode(signed.signature.unwrap().signature),
        })
        .unwrap();
        // the hand-built good case parses
        Bundle::parse(&tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), (SIGNATURE_FILE, &sig, r)])).unwrap();

        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("missing component", tar_of(&[(MANIFEST_FILE, m, r)])),
            ("missing manifest", tar_of(&[(COMPONENT_FILE, &c, r)])),
            ("empty archive", tar_of(&[])),
            ("wrong order", tar_of(&[(COMPONENT_FILE, &c, r), (MANIFEST_FILE, m, r)])),
            ("extra entry", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), ("README", b"hi", r)])),
            ("extra after signature", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), (SIGNATURE_FILE, &sig, r), ("x", b"", r)])),
            ("duplicate manifest", tar_of(&[(MANIFEST_FILE, m, r), (MANIFEST_FILE, m, r)])),
            ("duplicate component", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), (COMPONENT_FILE, &c, r)])),
            ("directory", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, tar::EntryType::Directory)])),
            ("symlink", tar_of(&[(MANIFEST_FILE, m, tar::EntryType::Symlink), (COMPONENT_FILE, &c, r)])),
            ("in a directory", tar_of(&[("plugin/capstan-plugin.toml", m, r), (COMPONENT_FILE, &c, r)])),
            ("not utf-8", tar_of(&[(MANIFEST_FILE, b"\xff\xfe[plugin]", r), (COMPONENT_FILE, &c, r)])),
            ("big manifest", tar_of(&[(MANIFEST_FILE, &vec![b'#'; MAX_MANIFEST_BYTES + 1], r), (COMPONENT_FILE, &c, r)])),
            ("bad signature json", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), (SIGNATURE_FILE, b"{}", r)])),
            (
                "short signature",
                tar_of(&[
                    (MANIFEST_FILE, m, r),
                    (COMPONENT_FILE, &c, r),
                    (SIGNATURE_FILE, format!(r#"{{"publisher":"{}","signature":"AAAA"}}"#, PublisherKey::from(&key(1))).as_bytes(), r),
                ]),
            ),
            (
                "bad publisher",
                tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), (SIGNATURE_FILE, br#"{"publisher":"x","signature":"AAAA"}"#, r)]),
            ),
        ];
        for (what, bytes) in cases {
            let Err(err) = Bundle::parse(&bytes) else { panic!("{what}: parsed") };
            assert_eq!(err.code, "bundle-malformed", "{what}: {err}");
        }
    }

    #[test]
    fn page_templates_travel_signed_in_name_order_and_carry_no_script() {
        let pages: BTreeMap<String, String> =
            [("pages/a.html", "<p>{{ output.welcome }}</p>"), ("pages/b.html", "<ul></ul>")].map(|(k, v)| (k.into(), v.into())).into();
        let plain = bundle();
        let mut with_pages = bundle().with_pages(pages.clone()).unwrap();
        assert_ne!(plain.digest(), with_pages.digest(), "templates are covered by the digest");
        with_pages.sign(&key(1));
        let parsed = Bundle::parse(&with_pages.to_bytes()).unwrap();
        assert_eq!(parsed.pages, pages);
        parsed.verify(&[PublisherKey::from(&key(1))]).unwrap();

        // a changed template no longer verifies; neither does one taken away
        let mut changed = parsed.clone();
        changed.pages.insert("pages/b.html".into(), "<ul><li>x</li></ul>".into());
        assert_eq!(changed.verify(&[PublisherKey::from(&key(1))]).unwrap_err().code, "bundle-signature-invalid");
        let mut fewer = parsed.clone();
        fewer.pages.remove("pages/a.html");
        assert_eq!(fewer.verify(&[PublisherKey::from(&key(1))]).unwrap_err().code, "bundle-signature-invalid");

        let (m, c, r) = (MANIFEST.as_bytes(), component(), tar::EntryType::Regular);
        let refused = [
            ("out of order", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), ("pages/b.html", b"", r), ("pages/a.html", b"", r)])),
            ("twice", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), ("pages/a.html", b"", r), ("pages/a.html", b"", r)])),
            ("a script", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), ("pages/a.html", b"<SCRIPT>x()</SCRIPT>", r)])),
            ("a base", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), ("pages/a.html", b"<base href=\"https://x\">", r)])),
            ("a refresh", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), ("pages/a.html", b"<meta HTTP-EQUIV=refresh>", r)])),
            ("a bad name", tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), ("pages/../a.html", b"", r)])),
            ("before the component", tar_of(&[(MANIFEST_FILE, m, r), ("pages/a.html", b"", r), (COMPONENT_FILE, &c, r)])),
            (
                "too big",
                tar_of(&[(MANIFEST_FILE, m, r), (COMPONENT_FILE, &c, r), ("pages/a.html", &vec![b' '; MAX_PAGE_TEMPLATE_BYTES + 1], r)]),
            ),
        ];
        for (what, bytes) in refused {
            assert_eq!(Bundle::parse(&bytes).unwrap_err().code, "bundle-malformed", "{what}");
        }
        let script: BTreeMap<String, String> = [("pages/a.html".to_string(), "<a href=\"javascript:x()\">".to_string())].into();
        assert_eq!(bundle().with_pages(script).unwrap_err().code, "bundle-malformed");
    }

    #[test]
    fn page_templates_carry_no_script_capable_markup() {
        let refused = [
            ("<button onclick=\"x()\">go</button>", "onclick"),
            ("<img src=x ONERROR = x()>", "onerror"),
            ("<div\nonMouseOver='x()'>", "onmouseover"),
            ("<a href=/x on{{ '' }}focus=x()>", "onfocus"),
            ("<div hx-on:click=\"x()\">", "hx-on:click"),
            ("<iframe src=\"/p/x\"></iframe>", "<iframe>"),
            ("<OBJECT data=x.swf>", "<object>"),
            ("<embed src=x>", "<embed>"),
            ("<form method=post action=\"https://evil.example/steal\">", "https://evil.example/steal"),
            ("<form action='http://evil.example'>", "http://evil.example"),
            ("<form action=//evil.example/x>", "//evil.example/x"),
            ("<form action=\" \\\\evil.example\">", "\\\\evil.example"),
            ("<form action=\"&#104;ttps&colon;//evil.example\">", "https://evil.example"),
            ("<button formaction=\"https://evil.example\">send</button>", "formaction"),
            ("<a href=\"jav&#97;script:x()\">", "a script URL"),
            ("<scr{{ '' }}ipt>x()</script>", "a script"),
        ];
        for (markup, named) in refused {
            let refusal = check_page_template("pages/a.html", markup).expect_err(markup);
            assert_eq!(refusal.code, "bundle-malformed", "{markup}");
            assert!(refusal.message.contains("\"pages/a.html\"") && refusal.message.contains(named), "{markup}: {}", refusal.message);
        }
        let allowed = [
            "<form method=\"post\" action=\"/p/backups/-/call/create\"><input name=\"organizationId\" value=\"{{ org }}\"></form>",
            "<form action=\"{{ base }}/call\"><select><option value=a>one</option></select></form>",
            "<p>Mail is on: 3 < 4, {% if online == true %}online{% endif %} <a href=\"?page=2&amp;on=1\">next</a></p>",
            "<span title=\"note: {{ x }}\" data-on=\"1\">x</span>",
        ];
        for markup in allowed {
            check_page_template("pages/a.html", markup).unwrap_or_else(|e| panic!("{markup}: {e}"));
        }
    }

    #[test]
    fn the_first_party_plugins_page_templates_pass() {
        let plugins = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../plugins");
        let mut checked = 0;
        for entry in std::fs::read_dir(&plugins).unwrap() {
            let dir = entry.unwrap().path();
            if !dir.is_dir() {
                continue;
            }
            let pages = read_page_templates(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            checked += pages.len();
        }
        assert!(checked >= 10, "the plugins' templates were read ({checked})");
    }

    #[test]
    fn manifest_refusals_pass_through() {
        let c = component();
        let r = tar::EntryType::Regular;
        for (manifest, want) in [
            (MANIFEST.replace("name = \"Example\"", "name = \"Example\"\nextra = 1"), "manifest-invalid"),
            (MANIFEST.replace("\"example\"", "\"api\""), "plugin-id-reserved"),
            (MANIFEST.replace("\"log\"", "\"logs\""), "capability-unknown"),
        ] {
            assert_eq!(code(&tar_of(&[(MANIFEST_FILE, manifest.as_bytes(), r), (COMPONENT_FILE, &c, r)])), want);
        }
    }

    #[test]
    fn inspection() {
        let mut b = bundle();
        let unsigned = b.inspect();
        assert_eq!(unsigned.signed_by, None);
        assert_eq!(unsigned.fingerprint, None);
        b.sign(&key(4));
        let i = b.inspect();
        assert_eq!(i.id, "example");
        assert_eq!(i.version, "1.2.3");
        assert_eq!(i.component_bytes, component().len());
        assert_eq!(i.signed_by, Some(PublisherKey::from(&key(4)).to_string()));
        let json = serde_json::to_value(&i).unwrap();
        for key in ["digest", "manifestSha256", "componentSha256", "componentBytes", "signedBy", "fingerprint", "capabilities", "limits"] {
            assert!(json.get(key).is_some(), "{key} in {json}");
        }
        assert_eq!(json["capabilities"], json!(["log", "store"]));
        assert_eq!(b.file_name(), "example-1.2.3.capstan-plugin");
    }
}

/// Property tests: `Bundle::parse` is fed bytes from anywhere (an upload, a file), so whatever
/// it is given it answers a bundle or a refusal by one of its documented names, never a panic.
#[cfg(test)]
mod proptests {
    use super::tests::{MANIFEST, bundle, component, key, tar_of};
    use super::*;
    use crate::manifest::RESERVED_IDS;
    use capstan_core::testing::{apply, mutation};
    use proptest::prelude::*;
    use proptest::sample::Index;

    /// Every refusal `Bundle::parse` documents (its own and the manifest's it passes through).
    const CODES: &[&str] =
        &["bundle-too-large", "bundle-malformed", "manifest-invalid", "plugin-id-invalid", "plugin-id-reserved", "capability-unknown"];

    fn kebab(code: &str) -> bool {
        !code.is_empty()
            && !code.starts_with('-')
            && !code.ends_with('-')
            && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    }

    /// Parse `bytes`; a refusal must carry a documented kebab-case code and a message.
    fn parse(bytes: &[u8]) -> std::result::Result<Option<Bundle>, TestCaseError> {
        match Bundle::parse(bytes) {
            Ok(parsed) => Ok(Some(parsed)),
            Err(err) => {
                prop_assert!(kebab(&err.code), "code {:?} is not kebab-case", err.code);
                prop_assert!(CODES.contains(&err.code.as_ref()), "undocumented code {:?}: {}", err.code, err.message);
                prop_assert!(!err.message.is_empty(), "{:?} without a message", err.code);
                Ok(None)
            }
        }
    }

    /// A bundle signed by `key(1)`, and its bytes.
    fn signed() -> (Bundle, Vec<u8>) {
        let mut b = bundle();
        b.sign(&key(1));
        let bytes = b.to_bytes();
        (b, bytes)
    }

    /// The parts a hand-made archive is built from.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Part {
        Manifest,
        Component,
        Signature,
        Other(&'static str),
    }

    fn part() -> impl Strategy<Value = (Part, tar::EntryType)> {
        let part = prop_oneof![
            3 => Just(Part::Manifest),
            3 => Just(Part::Component),
            2 => Just(Part::Signature),
            1 => prop::sample::select(vec![
                "README",
                "./capstan-plugin.toml",
                "./plugin.wasm",
                "plugin/plugin.wasm",
                "capstan-plugin.TOML",
                "plugin.wasm.sig",
                "signature.json/",
            ])
            .prop_map(Part::Other),
        ];
        let kind = prop_oneof![
            6 => Just(tar::EntryType::Regular),
            1 => prop::sample::select(vec![
                tar::EntryType::Directory,
                tar::EntryType::Symlink,
                tar::EntryType::Link,
                tar::EntryType::Fifo,
                tar::EntryType::GNULongName,
                tar::EntryType::XHeader,
                tar::EntryType::Continuous,
            ]),
        ];
        (part, kind)
    }

    /// Capabilities a generated manifest may request.
    const SIMPLE_CAPABILITIES: [&str; 7] = ["store", "log", "blobs", "sign", "agents", "events:publish", "inventory:read"];

    /// A manifest the parser accepts, with the id, version and capabilities given.
    fn manifest_text(id: &str, version: &(u64, u64, u64), capabilities: &[&str]) -> String {
        let requested: Vec<String> = capabilities.iter().map(|c| format!("{c:?}")).collect();
        format!(
            "[plugin]\nid = {id:?}\nname = \"Generated\"\nversion = \"{}.{}.{}\"\nwit = \"capstan:plugin@0.1.0\"\n\n\
             [capabilities]\nrequested = [{}]\n",
            version.0,
            version.1,
            version.2,
            requested.join(", ")
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary bytes, and arbitrary bytes behind a valid bundle's first header, are refused
        /// by name.
        #[test]
        fn arbitrary_bytes_are_refused_by_name(
            bytes in prop::collection::vec(any::<u8>(), 0..4096),
            behind_a_header in any::<bool>(),
        ) {
            let input = if behind_a_header {
                let mut input = bundle().to_bytes()[..512].to_vec();
                input.extend_from_slice(&bytes);
                input
            } else {
                bytes
            };
            parse(&input)?;
        }

        /// Any few changes to a signed bundle are refused by name, or still parse; what parses is
        /// stable under `to_bytes`, and verifies only when the manifest and component are the
        /// signed ones.
        #[test]
        fn a_changed_bundle_is_refused_or_still_verified(mutations in prop::collection::vec(mutation(), 1..4)) {
            let (original, mut bytes) = signed();
            for m in &mutations {
                apply(&mut bytes, m);
            }
            if let Some(parsed) = parse(&bytes)? {
                prop_assert_eq!(Bundle::parse(&parsed.to_bytes()).ok(), Some(parsed.clone()), "what parses is stable");
                match parsed.verify(&[PublisherKey::from(&key(1))]) {
                    Ok(_) => {
                        prop_assert_eq!(&parsed.manifest_text, &original.manifest_text);
                        prop_assert_eq!(&parsed.component, &original.component);
                    }
                    Err(err) => prop_assert!(
                        ["bundle-signature-invalid", "publisher-untrusted"].contains(&err.code.as_ref()),
                        "{}",
                        err
                    ),
                }
            }
        }

        /// A bundle cut short anywhere is refused by name, except where only the archive's end
        /// blocks are lost (the same bundle) or the whole signature entry (the same bundle,
        /// unsigned, which does not verify).
        #[test]
        fn a_truncated_bundle_is_refused_or_whole(at in any::<Index>(), signed_bundle in any::<bool>()) {
            let (original, bytes) = if signed_bundle { signed() } else { let b = bundle(); let bytes = b.to_bytes(); (b, bytes) };
            let cut = at.index(bytes.len());
            if let Some(parsed) = parse(&bytes[..cut])? {
                prop_assert_eq!(&parsed.manifest_text, &original.manifest_text);
                prop_assert_eq!(&parsed.component, &original.component);
                if parsed.signature == original.signature {
                    prop_assert!(cut >= bytes.len() - 1024, "only the end blocks may go ({} of {})", cut, bytes.len());
                } else {
                    prop_assert!(parsed.signature.is_none());
                    let err = parsed.verify(&[PublisherKey::from(&key(1))]).unwrap_err();
                    prop_assert_eq!(err.code.as_ref(), "bundle-signature-invalid");
                }
            }
        }

        /// Bytes after the archive: zeros are padding, anything else is refused `bundle-malformed`.
        #[test]
        fn data_after_the_archive_is_refused(more in prop::collection::vec(any::<u8>(), 1..2048), zeros in any::<bool>()) {
            let (original, mut bytes) = signed();
            let more = if zeros { vec![0; more.len()] } else { more };
            bytes.extend_from_slice(&more);
            match Bundle::parse(&bytes) {
                Ok(parsed) => {
                    prop_assert!(more.iter().all(|b| *b == 0));
                    prop_assert_eq!(parsed, original);
                }
                Err(err) => {
                    prop_assert!(more.iter().any(|b| *b != 0));
                    prop_assert_eq!(err.code.as_ref(), "bundle-malformed");
                }
            }
        }

        /// Archives of any entries in any order, duplicated or of any type: only the manifest
        /// then the component, then optionally the signature, all regular files, is a bundle;
        /// everything else is `bundle-malformed`.
        #[test]
        fn only_the_documented_layout_parses(parts in prop::collection::vec(part(), 0..5)) {
            let (signed_bundle, _) = signed();
            let signature = signed_bundle.signature.clone().unwrap();
            let signature_json = serde_json::to_vec(&SignatureFile {
                publisher: signature.publisher.to_string(),
                signature: B64.encode(signature.signature),
            })
            .unwrap();
            let component = component();
            let entries: Vec<(&str, &[u8], tar::EntryType)> = parts
                .iter()
                .map(|(part, kind)| match part {
                    Part::Manifest => (MANIFEST_FILE, MANIFEST.as_bytes(), *kind),
                    Part::Component => (COMPONENT_FILE, &component[..], *kind),
                    Part::Signature => (SIGNATURE_FILE, &signature_json[..], *kind),
                    Part::Other(name) => (*name, &b"other"[..], *kind),
                })
                .collect();
            let layout: Vec<Part> = parts.iter().map(|(part, _)| *part).collect();
            let documented = (layout == [Part::Manifest, Part::Component] || layout == [Part::Manifest, Part::Component, Part::Signature])
                && parts.iter().all(|(_, kind)| *kind == tar::EntryType::Regular);
            match Bundle::parse(&tar_of(&entries)) {
                Ok(parsed) => {
                    prop_assert!(documented, "{:?} parsed", parts);
                    prop_assert_eq!(parsed.signature.is_some(), layout.len() == 3);
                    prop_assert_eq!(parsed.component, component);
                }
                Err(err) => {
                    prop_assert!(!documented, "{:?}: {}", parts, err);
                    prop_assert_eq!(err.code.as_ref(), "bundle-malformed", "{:?}: {}", parts, err);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A bundle made by `Bundle::new` (and signed, or not) reads back as itself through
        /// `to_bytes` and `parse`: the same id, version, manifest, component and signer.
        #[test]
        fn built_bundles_round_trip(
            id in "[a-z][a-z0-9-]{1,38}[a-z0-9]".prop_filter("not reserved", |id| !RESERVED_IDS.contains(&id.as_str())),
            version in (0u64..1000, 0u64..1000, 0u64..1000),
            capabilities in prop::sample::subsequence(SIMPLE_CAPABILITIES.to_vec(), 0..=SIMPLE_CAPABILITIES.len()),
            tail in prop::collection::vec(any::<u8>(), 0..4096),
            signer in prop::option::of(any::<u8>()),
        ) {
            let mut wasm = b"\0asm\x0d\x00\x01\x00".to_vec();
            wasm.extend_from_slice(&tail);
            let mut built = Bundle::new(manifest_text(&id, &version, &capabilities), wasm.clone()).unwrap();
            if let Some(seed) = signer {
                built.sign(&key(seed));
            }
            let bytes = built.to_bytes();
            prop_assert!(bytes.len() <= built.encoded_len());
            let parsed = Bundle::parse(&bytes).unwrap();
            prop_assert_eq!(&parsed, &built);
            prop_assert_eq!(&parsed.manifest.id, &id);
            prop_assert_eq!(&parsed.manifest.version, &semver::Version::new(version.0, version.1, version.2));
            prop_assert_eq!(&parsed.component, &wasm);
            prop_assert_eq!(parsed.manifest.capabilities.len(), capabilities.len());
            prop_assert_eq!(parsed.to_bytes(), bytes, "deterministic");
            match signer {
                Some(seed) => prop_assert_eq!(parsed.verify(&[PublisherKey::from(&key(seed))]).unwrap(), PublisherKey::from(&key(seed))),
                None => {
                    let err = parsed.verify(&[]).unwrap_err();
                    prop_assert_eq!(err.code.as_ref(), "bundle-signature-invalid");
                }
            }
        }
    }
}
