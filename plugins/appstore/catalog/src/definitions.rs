//! App definitions on disk (feature `fs`): a directory with one TOML file per app, named
//! `<app id>.toml`, each holding exactly an [`App`] in the catalog's field names.
//!
//! Files whose name does not end in `.toml`, hidden files (`.…`) and subdirectories are
//! ignored; every `*.toml` file must be a regular file (symbolic links are followed) of at most
//! 1 MiB of UTF-8. Apps are ordered by file name. Errors name the file and the field.

use crate::model::{App, Catalog, MAX_APPS};
use serde_json::{Value, json};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The extension of an app definition file.
pub const DEFINITION_EXTENSION: &str = "toml";
/// The largest app definition file read, in bytes.
pub const MAX_DEFINITION_BYTES: u64 = 1024 * 1024;

/// Why a directory of app definitions could not become a catalog.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    /// `app-definitions-unreadable`: the directory or a file could not be read.
    #[error("cannot read {}: {reason}", path.display())]
    Unreadable {
        /// The directory or file that could not be read.
        path: PathBuf,
        /// The kind of I/O error the read failed with.
        reason: String,
    },
    /// `app-definition-invalid`: a file (or the directory as a whole) breaks a rule; `field`
    /// is the path inside the app (`versions[1].template.image`) when one is known.
    #[error("{}: {}{message}", file.display(), field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
    Invalid {
        /// The definition file, or the directory when the rule concerns it as a whole.
        file: PathBuf,
        /// The path of the offending field inside the app, when one is known.
        field: Option<String>,
        /// What rule is broken.
        message: String,
    },
}

impl DefinitionError {
    /// The stable refusal code.
    pub fn code(&self) -> &'static str {
        match self {
            DefinitionError::Unreadable { .. } => "app-definitions-unreadable",
            DefinitionError::Invalid { .. } => "app-definition-invalid",
        }
    }

    /// The refusal's structured data: `path` or `file` and `field`.
    pub fn data(&self) -> Value {
        match self {
            DefinitionError::Unreadable { path, .. } => json!({ "path": path.display().to_string() }),
            DefinitionError::Invalid { file, field, .. } => json!({ "file": file.display().to_string(), "field": field }),
        }
    }
}

fn invalid(file: &Path, field: Option<String>, message: impl Into<String>) -> DefinitionError {
    DefinitionError::Invalid { file: file.to_path_buf(), field, message: message.into() }
}

/// Parse one app definition file's text; `file` names it in errors and its stem must be the
/// app's id.
pub fn parse_definition(file: &Path, text: &str) -> Result<App, DefinitionError> {
    let app: App = toml::from_str(text).map_err(|e| {
        let message = match e.span() {
            Some(span) => {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let source = text.lines().nth(line - 1).unwrap_or_default().trim();
                let source = match source.char_indices().nth(120) {
                    Some((end, _)) => format!("{}…", &source[..end]),
                    None => source.to_string(),
                };
                match source.as_str() {
                    "" => format!("line {line}: {}", e.message().trim()),
                    source => format!("line {line} ({source}): {}", e.message().trim()),
                }
            }
            None => e.message().trim().to_string(),
        };
        invalid(file, None, message)
    })?;
    app.validate().map_err(|e| invalid(file, Some(e.field), e.message))?;
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    if stem != app.id {
        return Err(invalid(file, Some("id".into()), format!("the app {} must be defined in {}.{DEFINITION_EXTENSION}", app.id, app.id)));
    }
    Ok(app)
}

/// Read every app definition in `dir` into a catalog (apps in file-name order), checked against
/// the model.
pub fn read_dir(dir: &Path) -> Result<Catalog, DefinitionError> {
    let unreadable =
        |path: &Path, e: std::io::Error| DefinitionError::Unreadable { path: path.to_path_buf(), reason: e.kind().to_string() };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))? {
        let entry = entry.map_err(|e| unreadable(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(&format!(".{DEFINITION_EXTENSION}")) {
            continue;
        }
        let path = entry.path();
        let meta = std::fs::metadata(&path).map_err(|e| unreadable(&path, e))?;
        if meta.is_dir() {
            continue;
        }
        if !meta.is_file() {
            return Err(invalid(&path, None, "not a regular file"));
        }
        files.push((name, path, meta.len()));
        if files.len() > MAX_APPS {
            return Err(invalid(dir, None, format!("more than {MAX_APPS} app definitions; a catalog holds at most {MAX_APPS} apps")));
        }
    }
    if files.is_empty() {
        return Err(invalid(dir, None, format!("no app definitions (*.{DEFINITION_EXTENSION}) in the directory")));
    }
    files.sort();
    let mut catalog = Catalog::default();
    for (_, path, len) in files {
        let too_large = || invalid(&path, None, format!("larger than {MAX_DEFINITION_BYTES} bytes"));
        if len > MAX_DEFINITION_BYTES {
            return Err(too_large());
        }
        let file = std::fs::File::open(&path).map_err(|e| unreadable(&path, e))?;
        let mut bytes = Vec::new();
        file.take(MAX_DEFINITION_BYTES + 1).read_to_end(&mut bytes).map_err(|e| unreadable(&path, e))?;
        if bytes.len() as u64 > MAX_DEFINITION_BYTES {
            return Err(too_large());
        }
        let text = String::from_utf8(bytes).map_err(|_| invalid(&path, None, "not UTF-8 text"))?;
        catalog.apps.push(parse_definition(&path, &text)?);
    }
    catalog.validate().map_err(|e| invalid(dir, Some(e.field), e.message))?;
    Ok(catalog)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    pub(super) const WIKI: &str = r#"
id = "wiki"
name = "Wiki"
description = """
A small wiki.
"""
homepage = "https://wiki.example.com"
categories = ["docs"]

[[versions]]
version = "1.0.0"
withdrawn = { reason = "data loss on upgrade; use 1.0.1" }
[versions.template]
image = "registry.example.com/wiki:1.0.0"

[[versions]]
version = "1.0.1"
notes = "Fixes the upgrade."
[versions.template]
image = "registry.example.com/wiki:1.0.1"
capabilities = ["mail"]
ports = [{ port = 8080, protocol = "http" }, { port = 25, protocol = "tcp", publicPort = 2525 }]
volumes = [{ name = "data", mountPath = "/var/lib/wiki" }]
[versions.template.environment]
LOG_LEVEL = "info"
"#;

    #[test]
    fn a_directory_becomes_a_catalog() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("wiki.toml"), WIKI).unwrap();
        fs::write(dir.path().join("chat.toml"), WIKI.replace("\"wiki\"", "\"chat\"")).unwrap();
        fs::write(dir.path().join("README.md"), "ignored").unwrap();
        fs::write(dir.path().join(".wiki.toml.swp"), "ignored").unwrap();
        fs::create_dir(dir.path().join("drafts.toml")).unwrap();
        let catalog = read_dir(dir.path()).unwrap();
        let ids: Vec<_> = catalog.apps.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, ["chat", "wiki"]);
        let wiki = catalog.app("wiki").unwrap();
        assert_eq!(wiki.description, "A small wiki.\n");
        assert!(wiki.versions[0].is_withdrawn());
        assert_eq!(wiki.newest().unwrap().version.to_string(), "1.0.1");
        let template = &wiki.versions[1].template;
        assert_eq!(template.ports[1].public_port, Some(2525));
        assert_eq!(template.volumes[0].mount_path, "/var/lib/wiki");
        assert_eq!(template.environment["LOG_LEVEL"], "info");
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let file = Path::new("/defs/wiki.toml");
        let err = |text: &str| parse_definition(file, text).unwrap_err();

        let e = err(&WIKI.replace("capabilities = [\"mail\"]", "capabilities = [\"mail\"]\nprivileged = true"));
        assert_eq!(e.code(), "app-definition-invalid");
        let text = e.to_string();
        assert!(text.starts_with("/defs/wiki.toml: line ") && text.contains("privileged"), "{text}");

        let e = err(&WIKI.replace("port = 8080", "port = \"http\""));
        assert!(e.to_string().contains("port = \"http\""), "{e}");

        let e = err(&WIKI.replace("version = \"1.0.1\"", "version = \"1.0\""));
        assert!(e.to_string().contains("version = \"1.0\""), "{e}");

        let e = err(&WIKI.replace("capabilities = [\"mail\"]", "capabilities = [\"Mail\"]"));
        assert_eq!(e.data()["field"], "versions[1].template.capabilities[0]");
        assert!(e.to_string().starts_with("/defs/wiki.toml: versions[1].template.capabilities[0]: "), "{e}");

        let e = parse_definition(Path::new("/defs/blog.toml"), WIKI).unwrap_err();
        assert_eq!(e.data()["field"], "id");
        assert!(e.to_string().contains("wiki.toml"), "{e}");

        assert!(err("").to_string().contains("missing field"), "{}", err(""));
    }

    #[test]
    fn a_definition_declares_single_sign_on_in_toml() {
        let file = Path::new("/defs/wiki.toml");
        let oidc = r#"capabilities = ["platform-oidc"]
ports = [{ port = 8080, protocol = "http" }]
[versions.template.platformOidc]
roles = ["Admin", "Viewer"]
redirectPath = "/login/generic_oauth"
issuerVariable = "OIDC_ISSUER"
clientIdVariable = "OIDC_CLIENT_ID"
clientSecretVariable = "OIDC_CLIENT_SECRET"
[versions.template.environment]"#;
        let text = WIKI.replace("capabilities = [\"mail\"]\nports = [{ port = 8080, protocol = \"http\" }, { port = 25, protocol = \"tcp\", publicPort = 2525 }]", "")
            .replace("[versions.template.environment]", oidc);
        let app = parse_definition(file, &text).unwrap();
        let declared = app.versions[1].template.platform_oidc.as_ref().unwrap();
        assert_eq!((declared.roles.len(), declared.redirect_path.as_str()), (2, "/login/generic_oauth"));
        let e = parse_definition(file, &text.replace("\"OIDC_CLIENT_ID\"", "\"LOG_LEVEL\"")).unwrap_err();
        assert_eq!(e.data()["field"], "versions[1].template.platformOidc.clientIdVariable");
    }

    #[test]
    fn a_directory_without_definitions_or_unreadable_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_dir(dir.path()).unwrap_err();
        assert_eq!(e.code(), "app-definition-invalid");
        assert!(e.to_string().contains("no app definitions"), "{e}");
        let e = read_dir(&dir.path().join("missing")).unwrap_err();
        assert_eq!(e.code(), "app-definitions-unreadable");
        fs::write(dir.path().join("wiki.toml"), [0xff, 0xfe]).unwrap();
        assert!(read_dir(dir.path()).unwrap_err().to_string().contains("not UTF-8"));
        fs::write(dir.path().join("wiki.toml"), vec![b'#'; MAX_DEFINITION_BYTES as usize + 1]).unwrap();
        assert!(read_dir(dir.path()).unwrap_err().to_string().contains("larger than"));
        fs::remove_file(dir.path().join("wiki.toml")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join("wiki.toml")).unwrap();
        assert_eq!(read_dir(dir.path()).unwrap_err().code(), "app-definitions-unreadable");
    }
}

/// Property tests: an app definition file is text an operator (or whoever prepared it) wrote, so
/// [`parse_definition`] answers a valid app or `app-definition-invalid`, never a panic — also when
/// a parse error falls on a multi-byte character, whose position the message quotes.
#[cfg(test)]
mod proptests {
    use super::tests::WIKI;
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::{Index, select};

    fn check(text: &str) -> Result<(), TestCaseError> {
        match parse_definition(Path::new("/defs/wiki.toml"), text) {
            Ok(app) => {
                prop_assert_eq!(&app.id, "wiki");
                prop_assert!(app.validate().is_ok());
            }
            Err(err) => {
                prop_assert_eq!(err.code(), "app-definition-invalid");
                prop_assert!(!err.to_string().is_empty());
            }
        }
        Ok(())
    }

    /// A character to put in a definition: any, or one that matters to TOML or is multi-byte.
    fn edit_char() -> impl Strategy<Value = char> {
        prop_oneof![any::<char>(), select(vec!['"', '[', ']', '=', '\n', '{', '}', ',', 'é', '€', '😀'])]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary text.
        #[test]
        fn arbitrary_text_is_an_app_or_invalid(text in prop_oneof![any::<String>(), "\\PC{0,400}"]) {
            check(&text)?;
        }

        /// A valid definition with characters inserted, deleted or replaced anywhere.
        #[test]
        fn an_edited_definition_is_an_app_or_invalid(
            edits in prop::collection::vec(
                (any::<Index>(), prop::option::of(edit_char()), any::<bool>()),
                1..4,
            ),
        ) {
            let mut chars: Vec<char> = WIKI.chars().collect();
            for (at, ch, replace) in &edits {
                match ch {
                    Some(c) if *replace && !chars.is_empty() => {
                        let at = at.index(chars.len());
                        chars[at] = *c;
                    }
                    Some(c) => chars.insert(at.index(chars.len() + 1), *c),
                    None if !chars.is_empty() => {
                        chars.remove(at.index(chars.len()));
                    }
                    None => {}
                }
            }
            check(&chars.into_iter().collect::<String>())?;
        }
    }
}
