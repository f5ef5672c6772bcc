//! `--output table|json|yaml` (`-o`), one option for every command that prints an answer:
//! `table` is for people (the default), `json` the API's answer exactly on one line (what each
//! command's `--json` has always printed, kept as its alias), `yaml` the same answer as a YAML
//! document. A command that prints no answer (`serve`, `completions`) refuses json and yaml.

use clap::error::ErrorKind;
use clap::{ArgMatches, Command};
use serde_json::Value;
use std::ffi::OsString;
use std::sync::OnceLock;

/// How a client command prints its answer.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Text and tables for people
    Table,
    /// The answer exactly, as one line of JSON (the same as --json)
    Json,
    /// The answer as a YAML document
    Yaml,
}

static CHOSEN: OnceLock<Format> = OnceLock::new();

/// The argument id of the global option (`Cli::output`).
const OUTPUT: &str = "output";
/// The argument id of each command's own machine-output flag.
const JSON: &str = "json";

/// Settle the parse against `--output`: with json or yaml the command's own `--json` is set (by
/// parsing `args` again with it), so every command keeps one machine-output path; the format is
/// remembered for [`print`].
pub fn settle(command: &Command, matches: ArgMatches, args: Vec<OsString>) -> Result<ArgMatches, clap::Error> {
    let format = matches.get_one::<Format>(OUTPUT).copied();
    // a plugin's command (a word the host's commands do not know) reads the format itself
    if matches.subcommand().is_some_and(|(name, _)| command.find_subcommand(name).is_none()) {
        let _ = CHOSEN.set(format.unwrap_or(Format::Table));
        return Ok(matches);
    }
    let (leaf, leaf_matches) = leaf(command, &matches);
    let has_json = leaf.get_arguments().any(|a| a.get_id() == JSON);
    let json_given = has_json && leaf_matches.get_flag(JSON);
    let conflict = |message: &str| Err(command.clone().error(ErrorKind::ArgumentConflict, message));
    let settled = match format {
        None | Some(Format::Table) if !json_given => matches,
        None => matches,
        Some(Format::Table) => return conflict("--output table and --json ask for different outputs"),
        Some(_) if !has_json => {
            return conflict(&format!(
                "`{}` prints no answer to format: --output json|yaml apply to commands that print one",
                leaf.get_name()
            ));
        }
        Some(_) if json_given => matches,
        Some(_) => command.clone().try_get_matches_from(args.into_iter().chain([OsString::from("--json")]))?,
    };
    let _ = CHOSEN.set(match format {
        Some(format) => format,
        None if json_given => Format::Json,
        None => Format::Table,
    });
    Ok(settled)
}

/// The subcommand that was chosen, with its matches.
fn leaf<'a>(command: &'a Command, matches: &'a ArgMatches) -> (&'a Command, &'a ArgMatches) {
    let (mut command, mut matches) = (command, matches);
    while let Some((name, sub)) = matches.subcommand() {
        match command.find_subcommand(name) {
            Some(found) => (command, matches) = (found, sub),
            None => break,
        }
    }
    (command, matches)
}

/// Print a machine answer as `--output` chose: one line of JSON, or a YAML document.
pub fn print(value: &Value) {
    print!("{}", render(value));
}

/// A machine answer as `--output` chose, ending in a newline.
pub fn render(value: &Value) -> String {
    render_as(chosen(), value)
}

/// The format `--output` chose (table when none was).
pub fn chosen() -> Format {
    CHOSEN.get().copied().unwrap_or(Format::Table)
}

/// A machine answer in `format` (yaml, else one line of JSON), ending in a newline.
pub fn render_as(format: Format, value: &Value) -> String {
    match format {
        Format::Yaml => yaml(value),
        _ => format!("{value}\n"),
    }
}

fn yaml(value: &Value) -> String {
    // a serde_json::Value always serializes; JSON is the fallback all the same
    serde_yaml_ng::to_string(value).unwrap_or_else(|_| format!("{value}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser, Subcommand};
    use serde_json::json;

    #[derive(Parser)]
    struct Cli {
        #[arg(long, short = 'o', global = true, value_enum)]
        output: Option<Format>,
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(Subcommand)]
    enum Sub {
        List {
            #[arg(long)]
            json: bool,
        },
        Serve,
    }

    fn settled(args: &[&str]) -> Result<bool, ErrorKind> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let command = Cli::command();
        let matches = command.clone().try_get_matches_from(args.clone()).map_err(|e| e.kind())?;
        let matches = settle(&command, matches, args).map_err(|e| e.kind())?;
        Ok(matches!(Cli::from_arg_matches(&matches).unwrap().command, Sub::List { json: true }))
    }

    use clap::FromArgMatches;

    #[test]
    fn output_json_and_yaml_set_the_commands_json_flag() {
        assert_eq!(settled(&["capstan", "list"]), Ok(false));
        assert_eq!(settled(&["capstan", "list", "--json"]), Ok(true));
        assert_eq!(settled(&["capstan", "list", "--output", "json"]), Ok(true));
        assert_eq!(settled(&["capstan", "-o", "yaml", "list"]), Ok(true));
        assert_eq!(settled(&["capstan", "list", "-o", "json", "--json"]), Ok(true));
        assert_eq!(settled(&["capstan", "list", "-o", "table"]), Ok(false));
        assert_eq!(settled(&["capstan", "list", "-o", "table", "--json"]), Err(ErrorKind::ArgumentConflict));
        assert_eq!(settled(&["capstan", "serve", "-o", "json"]), Err(ErrorKind::ArgumentConflict));
        assert_eq!(settled(&["capstan", "serve", "-o", "table"]), Ok(false));
        assert_eq!(settled(&["capstan", "list", "-o", "xml"]), Err(ErrorKind::InvalidValue));
    }

    #[test]
    fn yaml_is_the_same_answer() {
        let answer = json!({ "items": [{ "name": "acme", "ports": ["443:8080/http"] }], "next": null });
        let text = yaml(&answer);
        assert_eq!(serde_yaml_ng::from_str::<Value>(&text).unwrap(), answer, "{text}");
        assert!(text.contains("name: acme"), "{text}");
    }
}
