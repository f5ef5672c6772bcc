//! Commands a plugin adds to the `capstan` command line, declared as data in its manifest
//! (`[[commands]]` of `capstan-plugin.toml`), so a new manager brings its own commands without a
//! change to the host or the CLI. The CLI reads them from `plugins.listCommands`, builds each one's
//! arguments and `--help`, turns names into ids through its one resolver, calls the method and
//! prints the answer as the typed commands do (a table, or `-o json|yaml`).
//!
//! ```toml
//! [[commands]]
//! name = "backups create"              # the words after `capstan`, 1–3 of a-z 0-9 -
//! about = "Back up a service's volumes now"
//! method = "create"                    # a verb of this plugin: backups.create
//! columns = ["id", "serviceName", "state"]   # members of the answer shown, dotted for depth
//! rows = "backups"                     # optional: the member holding a list, one row each
//! args = [
//!   { name = "service", field = "serviceId", kind = "service", positional = true, help = "The service (name or id)" },
//!   { name = "org", field = "organizationId", kind = "organization", help = "Its organization (default: the service's)" },
//! ]
//! ```

use crate::refusal::{Refusal, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeSet;

/// The most commands one plugin declares.
pub const MAX_COMMANDS: usize = 32;
/// The most arguments one command takes.
const MAX_ARGS: usize = 16;
/// The most columns one command shows.
const MAX_COLUMNS: usize = 12;
/// The most characters of an `about` or a `help`.
const MAX_HELP_CHARS: usize = 200;

/// One command of a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandDecl {
    /// The words after `capstan` (`backups create`): 1–3 words of a-z 0-9 -, each starting with a
    /// letter. The host's own commands come first: a plugin's command of the same words is never
    /// reached.
    pub name: String,
    /// One line for `--help`.
    pub about: String,
    /// The verb of this plugin the command calls (`create` for `backups.create`).
    pub method: String,
    /// Its arguments, in the order `--help` shows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<ArgDecl>,
    /// The members of the answer (or of each row) shown as columns, dotted for depth
    /// (`reason.code`); none: the answer is printed as indented JSON.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<String>,
    /// The member of the answer holding a list whose items are the rows; none: the answer is
    /// the one row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<String>,
}

/// One argument of a command: a positional word or a `--name VALUE` option, set as a top-level
/// field of the method's input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArgDecl {
    /// a-z 0-9 -, starting with a letter: `--<name>`, or the placeholder of a positional one.
    pub name: String,
    /// The input field it sets (camelCase letters and digits).
    pub field: String,
    /// What it holds, and so how the CLI reads it.
    #[serde(default)]
    pub kind: ArgKind,
    /// A word in order rather than `--name VALUE`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub positional: bool,
    /// The command is refused without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
    /// One line for `--help`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub help: String,
}

/// What an argument holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ArgKind {
    /// A string, passed as it is.
    #[default]
    Text,
    /// A number.
    Number,
    /// `--name` alone sets `true` (never positional).
    Flag,
    /// `--name VALUE`, repeatable: a list of strings (never positional).
    List,
    /// An organization's name or id, sent as its id.
    Organization,
    /// A cluster's name or id, sent as its id.
    Cluster,
    /// A service's name or id, sent as its id (looked up within the command's organization
    /// argument when one is given). A command with an organization argument left out gets the
    /// service's organization there.
    Service,
    /// A node's name, hostname or id, sent as its id (looked up within the command's cluster
    /// argument when one is given).
    Node,
    /// Never typed: a fresh mutation id the CLI draws for the call (`cli-` and 32 hex digits).
    MutationId,
    /// Never typed: the revision of the command's service argument, read just before the call
    /// (an `expectedRevision` a person should not have to look up).
    ServiceRevision,
}

impl ArgKind {
    /// Whether the CLI fills it itself (no option, no word).
    pub fn generated(self) -> bool {
        matches!(self, ArgKind::MutationId | ArgKind::ServiceRevision)
    }
}

fn invalid(at: &str, message: impl Into<String>) -> Refusal {
    Refusal::new("manifest-invalid", format!("{at}: {}", message.into())).with_data(json!({ "key": "commands" }))
}

fn word(text: &str) -> bool {
    (1..=40).contains(&text.len())
        && text.starts_with(|c: char| c.is_ascii_lowercase())
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn camel(text: &str) -> bool {
    (1..=64).contains(&text.len()) && text.starts_with(|c: char| c.is_ascii_lowercase()) && text.chars().all(|c| c.is_ascii_alphanumeric())
}

fn one_line(at: &str, what: &str, text: &str, required: bool) -> Result<()> {
    if required && text.trim().is_empty() {
        return Err(invalid(at, format!("{what} must not be empty")));
    }
    if text.chars().count() > MAX_HELP_CHARS || text.chars().any(char::is_control) {
        return Err(invalid(at, format!("{what} is one line of at most {MAX_HELP_CHARS} characters")));
    }
    Ok(())
}

/// Read and check the manifest's `commands` array (`manifest-invalid` naming the command and
/// what is wrong).
pub fn parse(value: toml::Value) -> Result<Vec<CommandDecl>> {
    let commands: Vec<CommandDecl> = value.try_into().map_err(|e: toml::de::Error| invalid("commands", e.message().trim().to_string()))?;
    if commands.len() > MAX_COMMANDS {
        return Err(invalid("commands", format!("a plugin declares at most {MAX_COMMANDS} commands")));
    }
    let mut names = BTreeSet::new();
    for command in &commands {
        check(command)?;
        if !names.insert(command.name.as_str()) {
            return Err(invalid(&format!("command {:?}", command.name), "declared twice"));
        }
    }
    Ok(commands)
}

fn check(command: &CommandDecl) -> Result<()> {
    let at = format!("command {:?}", command.name.chars().take(100).collect::<String>());
    let words: Vec<&str> = command.name.split(' ').collect();
    if !(1..=3).contains(&words.len()) || !words.iter().all(|w| word(w)) {
        return Err(invalid(&at, "a name is 1–3 words of a-z 0-9 - (each starting with a letter) separated by one space"));
    }
    one_line(&at, "about", &command.about, true)?;
    if !camel(&command.method) {
        return Err(invalid(&at, "method is a verb of this plugin (camelCase letters and digits), like create"));
    }
    if command.args.len() > MAX_ARGS || command.columns.len() > MAX_COLUMNS {
        return Err(invalid(&at, format!("at most {MAX_ARGS} args and {MAX_COLUMNS} columns")));
    }
    let (mut names, mut fields) = (BTreeSet::new(), BTreeSet::new());
    let mut optional_positional = false;
    for arg in &command.args {
        let at = format!("{at}, arg {:?}", arg.name.chars().take(40).collect::<String>());
        if !word(&arg.name) || ["help", "url", "json", "output"].contains(&arg.name.as_str()) {
            return Err(invalid(&at, "a name is a-z 0-9 - starting with a letter, and not help, url, json or output"));
        }
        if !camel(&arg.field) {
            return Err(invalid(&at, "field is a top-level input field (camelCase letters and digits)"));
        }
        if !names.insert(arg.name.as_str()) || !fields.insert(arg.field.as_str()) {
            return Err(invalid(&at, "another arg has the same name or field"));
        }
        one_line(&at, "help", &arg.help, false)?;
        if arg.kind.generated() && (arg.positional || arg.required) {
            return Err(invalid(&at, "a generated arg is filled by the CLI: never positional or required"));
        }
        if arg.kind == ArgKind::ServiceRevision && !command.args.iter().any(|a| a.kind == ArgKind::Service) {
            return Err(invalid(&at, "a service-revision arg reads the revision of the command's service arg: declare one"));
        }
        if arg.positional {
            if matches!(arg.kind, ArgKind::Flag | ArgKind::List) {
                return Err(invalid(&at, "a flag or a list is never positional"));
            }
            if optional_positional {
                return Err(invalid(&at, "a positional arg after an optional one could never be told apart"));
            }
            optional_positional = !arg.required;
        }
    }
    for column in &command.columns {
        if !column.split('.').all(camel) {
            return Err(invalid(&at, format!("column {column:?} is a member of the answer, dotted for depth (reason.code)")));
        }
    }
    if command.rows.as_deref().is_some_and(|rows| !camel(rows)) {
        return Err(invalid(&at, "rows names the member of the answer holding the list (camelCase)"));
    }
    Ok(())
}

/// Refuse `plugin-descriptor-invalid` when a command calls a verb the plugin does not declare.
pub fn check_methods(plugin: &str, commands: &[CommandDecl], verbs: &[&str]) -> Result<()> {
    match commands.iter().find(|c| !verbs.contains(&c.method.as_str())) {
        Some(command) => Err(Refusal::new(
            "plugin-descriptor-invalid",
            format!("plugin {plugin}: the command {:?} calls {plugin}.{}, which the plugin does not declare", command.name, command.method),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Vec<CommandDecl>> {
        let table: toml::Table = text.parse().unwrap();
        parse(table["commands"].clone())
    }

    #[test]
    fn commands_read_as_declared() {
        let commands = parsed(
            r#"
[[commands]]
name = "backups create"
about = "Back up a service now"
method = "create"
columns = ["id", "reason.code"]
rows = "backups"
args = [
  { name = "service", field = "serviceId", kind = "service", positional = true, required = true, help = "The service" },
  { name = "org", field = "organizationId", kind = "organization" },
  { name = "all", field = "everyNode", kind = "flag" },
]
"#,
        )
        .unwrap();
        assert_eq!(commands.len(), 1);
        let command = &commands[0];
        assert_eq!(
            (command.name.as_str(), command.method.as_str(), command.rows.as_deref()),
            ("backups create", "create", Some("backups"))
        );
        assert_eq!(command.args[0].kind, ArgKind::Service);
        assert!(command.args[0].positional && command.args[0].required);
        assert_eq!((command.args[1].kind, command.args[2].kind), (ArgKind::Organization, ArgKind::Flag));
        assert_eq!(check_methods("backups", &commands, &["create"]), Ok(()));
        assert_eq!(check_methods("backups", &commands, &["list"]).unwrap_err().code, "plugin-descriptor-invalid");
    }

    #[test]
    fn a_malformed_command_is_refused_naming_it() {
        let one = |body: &str| parsed(&format!("[[commands]]\n{body}")).unwrap_err();
        let base = "about = \"x\"\nmethod = \"create\"\n";
        for (body, says) in [
            (format!("name = \"Backups\"\n{base}"), "1–3 words"),
            (format!("name = \"a b c d\"\n{base}"), "1–3 words"),
            (format!("name = \"a  b\"\n{base}"), "1–3 words"),
            ("name = \"a\"\nabout = \"\"\nmethod = \"create\"\n".to_string(), "about must not be empty"),
            ("name = \"a\"\nabout = \"x\"\nmethod = \"backups.create\"\n".to_string(), "a verb of this plugin"),
            (format!("name = \"a\"\n{base}args = [{{ name = \"help\", field = \"x\" }}]\n"), "not help"),
            (
                format!("name = \"a\"\n{base}args = [{{ name = \"a\", field = \"x\" }}, {{ name = \"b\", field = \"x\" }}]\n"),
                "same name or field",
            ),
            (
                format!("name = \"a\"\n{base}args = [{{ name = \"a\", field = \"x\", kind = \"flag\", positional = true }}]\n"),
                "never positional",
            ),
            (
                format!(
                    "name = \"a\"\n{base}args = [{{ name = \"a\", field = \"x\", positional = true }}, {{ name = \"b\", field = \"y\", positional = true }}]\n"
                ),
                "after an optional one",
            ),
            (format!("name = \"a\"\n{base}columns = [\"a..b\"]\n"), "dotted for depth"),
            (
                format!("name = \"a\"\n{base}args = [{{ name = \"m\", field = \"m\", kind = \"mutation-id\", required = true }}]\n"),
                "never positional or required",
            ),
            (format!("name = \"a\"\n{base}args = [{{ name = \"r\", field = \"r\", kind = \"service-revision\" }}]\n"), "declare one"),
            (format!("name = \"a\"\n{base}surprise = 1\n"), "unknown field"),
            (format!("name = \"a\"\n{base}args = [{{ name = \"a\", field = \"x\", kind = \"colour\" }}]\n"), "unknown variant"),
        ] {
            let err = one(&body);
            assert_eq!(err.code, "manifest-invalid", "{body}");
            assert!(err.message.contains(says), "{body}: {}", err.message);
        }
        let twice = parsed(
            "[[commands]]\nname = \"a\"\nabout = \"x\"\nmethod = \"m\"\n[[commands]]\nname = \"a\"\nabout = \"y\"\nmethod = \"n\"\n",
        );
        assert!(twice.unwrap_err().message.contains("declared twice"));
    }
}
