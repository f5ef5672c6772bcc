//! Commands the running plugins add (`capstan backups create website`, `capstan apps install
//! gitea --org acme`): a word the host's own commands do not know is looked up in
//! `plugins.listCommands`, and the declaration found becomes a command like the typed ones — its
//! `--help`, its arguments, names turned into ids by the one resolver ([`super::resolve`]), the
//! answer printed as a table of its declared columns or as `-o json|yaml` (docs/plugins.md,
//! "Commands").

use super::client::{Client, Connection, DEFAULT_URL, print_table};
use super::output::{self, Format};
use super::resolve;
use crate::refusal::{Refusal, Result};
use clap::{Arg, ArgAction, ArgMatches};
use serde_json::{Map, Value, json};
use std::ffi::OsString;
use std::process::ExitCode;

/// Exit status of a command line no command matches (as clap's usage errors).
const EXIT_USAGE: u8 = 2;
/// Exit status of a refusal.
const EXIT_REFUSED: u8 = 1;

/// Run `capstan WORDS…` for words the host's commands do not know; `host` names those commands
/// (a near miss of one is suggested, as clap would).
pub fn run(args: Vec<OsString>, host: &[String]) -> ExitCode {
    let args: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let first = args.first().map(String::as_str).unwrap_or_default();
    // a plugin's command of these words wins; failing one, a near miss of the host's is a typo
    let typo = || {
        let near = host.iter().find(|name| near_miss(first, name))?;
        eprintln!("capstan: no command `{first}`; did you mean `capstan {near}`? (`capstan --help` lists every command)");
        Some(ExitCode::from(EXIT_USAGE))
    };
    let connection = Connection { url: url_in(&args) };
    let listed = Client::new(&connection).and_then(|client| Ok((client.call("plugins.listCommands", &json!({}))?, client)));
    let (listing, client) = match listed {
        Ok(found) => found,
        Err(refusal) => {
            if let Some(exit) = typo() {
                return exit;
            }
            eprintln!(
                "capstan: no command `{}` among the host's; the commands plugins add could not be read from {} either ({}: {})",
                args.first().map(String::as_str).unwrap_or_default(),
                connection.url,
                refusal.code,
                refusal.message
            );
            eprintln!("  `capstan --help` lists the host's commands; log in (`capstan login`) to use a plugin's");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let commands = listing["commands"].as_array().cloned().unwrap_or_default();
    let Some((command, taken)) = matching(&commands, &args) else {
        if let Some(exit) = typo() {
            return exit;
        }
        eprintln!("capstan: no command `{}`", args.iter().take(3).cloned().collect::<Vec<_>>().join(" "));
        if commands.is_empty() {
            eprintln!("  `capstan --help` lists the host's commands; the running plugins add none");
        } else {
            eprintln!("  `capstan --help` lists the host's commands; the running plugins add:");
            for command in &commands {
                eprintln!("    capstan {:<28} {}", text(command, "name"), text(command, "about"));
            }
        }
        return ExitCode::from(EXIT_USAGE);
    };
    let matches = match clap_command(command).try_get_matches_from(args[taken..].iter().cloned().map(OsString::from).collect::<Vec<_>>()) {
        Ok(matches) => matches,
        // a program name leads what clap parses: the command's own words
        Err(e) => e.exit(),
    };
    let format = match (matches.get_one::<Format>("output").copied(), matches.get_flag("json")) {
        (Some(Format::Table), true) => {
            eprintln!("capstan: --output table and --json ask for different outputs");
            return ExitCode::from(EXIT_USAGE);
        }
        (Some(format), _) => format,
        (None, true) => Format::Json,
        (None, false) => output::chosen(),
    };
    let outcome = body(&client, command, &matches).and_then(|body| client.call(text(command, "method"), &body));
    match outcome {
        Ok(answer) => {
            match format {
                Format::Table => print_for_people(command, &answer),
                other => print!("{}", output::render_as(other, &answer)),
            }
            ExitCode::SUCCESS
        }
        Err(refusal) if format != Format::Table => {
            print!("{}", output::render_as(format, &json!({ "ok": false, "error": refusal })));
            ExitCode::from(super::exit_status(&refusal, EXIT_REFUSED))
        }
        Err(refusal) => super::refuse(&refusal, EXIT_REFUSED),
    }
}

/// Whether `typed` is one edit (a letter added, dropped or changed) or one swap of neighbours
/// away from `name`: a typo of a host command rather than a plugin's.
fn near_miss(typed: &str, name: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (typed.chars().collect(), name.chars().collect());
    if a == b || a.len().abs_diff(b.len()) > 1 || a.len() < 3 {
        return false;
    }
    let (short, long) = if a.len() <= b.len() { (&a, &b) } else { (&b, &a) };
    let first = short.iter().zip(long.iter()).position(|(x, y)| x != y).unwrap_or(short.len());
    if short.len() == long.len() {
        // one changed letter, or two neighbours swapped
        let changed = short[first + 1..] == long[first + 1..];
        let swapped = first + 1 < short.len()
            && short[first] == long[first + 1]
            && short[first + 1] == long[first]
            && short[first + 2..] == long[first + 2..];
        changed || swapped
    } else {
        short[first..] == long[first + 1..]
    }
}

/// The server URL the command line names (`--url U` or `--url=U`), else CAPSTAN_URL, else the
/// default: the commands are read from the host before the command line can be parsed.
fn url_in(args: &[String]) -> String {
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if word == "--" {
            break;
        }
        if word == "--url" {
            if let Some(url) = words.next() {
                return url.clone();
            }
        } else if let Some(url) = word.strip_prefix("--url=") {
            return url.to_string();
        }
    }
    std::env::var("CAPSTAN_URL").ok().filter(|u| !u.trim().is_empty()).unwrap_or_else(|| DEFAULT_URL.to_string())
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or_default()
}

/// The command whose name is the longest run of leading words, and how many words it took.
fn matching<'a>(commands: &'a [Value], args: &[String]) -> Option<(&'a Value, usize)> {
    (1..=args.len().min(3)).rev().find_map(|n| {
        let words = args[..n].join(" ");
        commands.iter().find(|c| text(c, "name") == words).map(|c| (c, n))
    })
}

fn arg_kind(arg: &Value) -> &str {
    arg["kind"].as_str().unwrap_or("text")
}

/// The declared command as clap's, so its `--help` and its mistakes read as the host's own.
fn clap_command(command: &Value) -> clap::Command {
    let name = format!("capstan {}", text(command, "name"));
    let plugin = text(command, "plugin");
    let mut cmd = clap::Command::new(name)
        .about(text(command, "about").to_string())
        .after_help(format!("Added by the plugin {plugin}; it calls {}.", text(command, "method")))
        .no_binary_name(true);
    for arg in command["args"].as_array().into_iter().flatten().filter(|a| !generated(a)) {
        let (name, kind) = (text(arg, "name").to_string(), arg_kind(arg));
        let mut help = text(arg, "help").to_string();
        if ["organization", "cluster", "service", "node"].contains(&kind) && help.is_empty() {
            help = format!("The {kind} (its name or id)");
        }
        let mut clap_arg = Arg::new(name.clone()).help(help).required(arg["required"] == true);
        clap_arg = if kind == "flag" {
            clap_arg.long(name).action(ArgAction::SetTrue).required(false)
        } else if kind == "list" {
            clap_arg.long(name).value_name("VALUE").action(ArgAction::Append)
        } else if arg["positional"] == true {
            clap_arg.value_name(name.to_uppercase())
        } else {
            clap_arg.long(name).value_name(value_name(kind))
        };
        cmd = cmd.arg(clap_arg);
    }
    cmd.arg(
        Arg::new("url")
            .long("url")
            .value_name("URL")
            .help("The Capstan server's URL [env: CAPSTAN_URL] (the token comes from CAPSTAN_TOKEN, else from `capstan login`)"),
    )
    .arg(Arg::new("json").long("json").action(ArgAction::SetTrue).help("Print the API's answer exactly, as one line of JSON"))
    .arg(
        Arg::new("output")
            .long("output")
            .short('o')
            .value_name("FORMAT")
            .value_parser(clap::builder::EnumValueParser::<Format>::new())
            .help("table (for people), json (the answer exactly, one line) or yaml"),
    )
}

/// A number as the method's schema reads it: a whole number stays one (a `u32` field refuses
/// `5.0`), anything else finite is a float.
fn number(text: &str) -> Option<Value> {
    let text = text.trim();
    text.parse::<i64>().map(Value::from).ok().or_else(|| text.parse::<f64>().ok().filter(|n| n.is_finite()).map(Value::from))
}

/// Filled by the CLI itself: a mutation id, a revision read before the call.
fn generated(arg: &Value) -> bool {
    ["mutation-id", "service-revision"].contains(&arg_kind(arg))
}

fn value_name(kind: &str) -> &'static str {
    match kind {
        "number" => "N",
        "organization" | "cluster" | "service" | "node" => "NAME|ID",
        _ => "VALUE",
    }
}

/// The method's input: each argument given, names resolved to ids; an organization argument
/// left out is the resolved service's organization.
fn body(client: &Client, command: &Value, matches: &ArgMatches) -> Result<Value> {
    let args: Vec<&Value> = command["args"].as_array().into_iter().flatten().collect();
    let given =
        |kind: &str| args.iter().find(|a| arg_kind(a) == kind).and_then(|a| matches.get_one::<String>(text(a, "name"))).map(String::as_str);
    let (organization_text, cluster_text) = (given("organization"), given("cluster"));
    let mut body = Map::new();
    let mut service_org = None;
    for arg in &args {
        let (name, field, kind) = (text(arg, "name"), text(arg, "field").to_string(), arg_kind(arg));
        if kind == "mutation-id" {
            body.insert(field, json!(super::client::new_mutation_id()));
            continue;
        }
        if generated(arg) {
            continue;
        }
        if kind == "flag" {
            if matches.get_flag(name) {
                body.insert(field, json!(true));
            }
            continue;
        }
        if kind == "list" {
            if let Some(values) = matches.get_many::<String>(name) {
                body.insert(field, json!(values.collect::<Vec<_>>()));
            }
            continue;
        }
        let Some(value) = matches.get_one::<String>(name) else { continue };
        let sent = match kind {
            "number" => number(value).ok_or_else(|| {
                Refusal::invalid_field(&field, format!("--{name} is a number, not {:?}", value.chars().take(40).collect::<String>()))
            })?,
            "organization" => json!(resolve::organization(client, value)?),
            "cluster" => json!(resolve::cluster(client, value)?),
            "service" => {
                let id = resolve::service(client, value, organization_text)?;
                service_org = Some(id.clone());
                json!(id)
            }
            "node" => json!(resolve::node(client, value, cluster_text)?),
            _ => json!(value),
        };
        body.insert(field, sent);
    }
    // a service named alone brings its organization where the method asks for both, and its
    // revision where the method asks for the one read
    let org_arg = args.iter().find(|a| arg_kind(a) == "organization").filter(|a| !body.contains_key(text(a, "field")));
    let revision_arg = args.iter().find(|a| arg_kind(a) == "service-revision");
    if let Some(service) = service_org.filter(|_| org_arg.is_some() || revision_arg.is_some()) {
        let found = client.call("services.get", &json!({ "id": service }))?;
        if let (Some(arg), Some(org)) = (org_arg, found["organizationId"].as_str()) {
            body.insert(text(arg, "field").to_string(), json!(org));
        }
        if let (Some(arg), Some(revision)) = (revision_arg, found["revision"].as_u64()) {
            body.insert(text(arg, "field").to_string(), json!(revision));
        }
    }
    Ok(Value::Object(body))
}

/// The answer for people: its rows under the declared columns, or indented JSON when the
/// command declares none.
fn print_for_people(command: &Value, answer: &Value) {
    let columns: Vec<&str> = command["columns"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if columns.is_empty() {
        println!("{}", serde_json::to_string_pretty(answer).unwrap_or_else(|_| answer.to_string()));
        return;
    }
    let rows: Vec<&Value> = match command["rows"].as_str() {
        Some(member) => answer[member].as_array().into_iter().flatten().collect(),
        None => vec![answer],
    };
    if rows.is_empty() {
        println!("(none)");
        return;
    }
    let header: Vec<String> = columns.iter().map(|c| header(c)).collect();
    let cells: Vec<Vec<String>> = rows.iter().map(|row| columns.iter().map(|c| cell(c, at(row, c))).collect()).collect();
    print_table(&header.iter().map(String::as_str).collect::<Vec<_>>(), &cells);
    if let Some(cursor) = answer["nextCursor"].as_str() {
        println!("(more: capstan call {} --set cursor={cursor})", text(command, "method"));
    }
}

/// `serviceName` → `SERVICE NAME`, `reason.code` → `REASON CODE`, `createdAtMs` → `CREATED AT`
/// (its cells are times).
fn header(column: &str) -> String {
    let column = column.strip_suffix("Ms").filter(|c| c.ends_with("At")).unwrap_or(column);
    let mut out = String::new();
    for c in column.chars() {
        if c.is_ascii_uppercase() || c == '.' {
            out.push(' ');
        }
        if c != '.' {
            out.push(c.to_ascii_uppercase());
        }
    }
    out
}

/// The member at a dotted path.
fn at<'a>(row: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(row, |value, key| &value[key])
}

fn cell(column: &str, value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.iter().all(|i| i.is_string()) => items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","),
        // `createdAtMs`, `expiresAt`, …: times, read as UTC
        Value::Number(n) if (column.ends_with("At") || column.ends_with("AtMs")) && n.is_u64() => super::client::utc(n.as_u64()),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declared() -> Value {
        json!([
            { "plugin": "backups", "name": "backups create", "about": "Back up now", "method": "backups.create",
              "args": [{ "name": "service", "field": "serviceId", "kind": "service", "positional": true, "required": true },
                       { "name": "org", "field": "organizationId", "kind": "organization" },
                       { "name": "tag", "field": "tags", "kind": "list" }],
              "columns": ["id", "serviceName", "state"] },
            { "plugin": "backups", "name": "backups", "about": "Overview", "method": "backups.overview" },
        ])
    }

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_longest_declared_name_wins() {
        let commands = declared();
        let commands = commands.as_array().unwrap();
        let (found, taken) = matching(commands, &words("backups create website --org acme")).unwrap();
        assert_eq!((text(found, "method"), taken), ("backups.create", 2));
        let (found, taken) = matching(commands, &words("backups --json")).unwrap();
        assert_eq!((text(found, "method"), taken), ("backups.overview", 1));
        assert!(matching(commands, &words("backup create")).is_none());
    }

    #[test]
    fn the_declaration_becomes_a_command_with_help_and_checked_arguments() {
        let commands = declared();
        let command = clap_command(&commands[0]);
        let help = command.clone().render_help().to_string();
        assert!(help.contains("Back up now") && help.contains("<SERVICE>") && help.contains("--org <NAME|ID>"), "{help}");
        assert!(help.contains("The organization (its name or id)"), "{help}");
        let matches =
            command.clone().try_get_matches_from(["website", "--org", "acme", "-o", "yaml", "--tag", "a", "--tag", "b=c"]).unwrap();
        assert_eq!(matches.get_one::<String>("service").unwrap(), "website");
        assert_eq!(matches.get_many::<String>("tag").unwrap().collect::<Vec<_>>(), ["a", "b=c"], "a list option repeats");
        assert_eq!(matches.get_one::<Format>("output"), Some(&Format::Yaml));
        let missing = command.clone().try_get_matches_from(Vec::<String>::new()).unwrap_err();
        assert_eq!(missing.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        let unknown = command.try_get_matches_from(["website", "--colour", "red"]).unwrap_err();
        assert_eq!(unknown.kind(), clap::error::ErrorKind::UnknownArgument);
    }

    #[test]
    fn the_url_is_read_before_the_command_line_is_parsed() {
        assert_eq!(url_in(&words("backups create web --url http://h:1")), "http://h:1");
        assert_eq!(url_in(&words("backups --url=http://h:2 create")), "http://h:2");
        assert!(!url_in(&words("backups -- --url=http://h:3")).contains("h:3"), "after -- a word is a value");
    }

    #[test]
    fn a_typo_of_a_host_command_is_told_apart_from_a_plugin_s() {
        assert!(near_miss("nodess", "nodes") && near_miss("ndoes", "nodes") && near_miss("nodse", "nodes") && near_miss("nodez", "nodes"));
        assert!(near_miss("node", "nodes") && near_miss("servics", "services"));
        assert!(!near_miss("nodes", "nodes") && !near_miss("backups", "nodes") && !near_miss("apps", "tasks") && !near_miss("ap", "api"));
    }

    #[test]
    fn a_whole_number_is_sent_as_one() {
        assert_eq!(number("5"), Some(json!(5)));
        assert_eq!(number("-2"), Some(json!(-2)));
        assert_eq!(number("0.5"), Some(json!(0.5)));
        assert_eq!((number("five"), number("NaN"), number("inf")), (None, None, None));
    }

    #[test]
    fn columns_read_dotted_members_and_times() {
        assert_eq!(header("serviceName"), "SERVICE NAME");
        assert_eq!(header("reason.code"), "REASON CODE");
        assert_eq!((header("createdAtMs"), header("items")), ("CREATED AT".to_string(), "ITEMS".to_string()));
        let row = json!({ "reason": { "code": "x" }, "nodes": ["a", "b"], "createdAtMs": 0 });
        assert_eq!(cell("reason.code", at(&row, "reason.code")), "x");
        assert_eq!(cell("nodes", at(&row, "nodes")), "a,b");
        assert_eq!(cell("missing", at(&row, "missing")), "-");
    }
}
