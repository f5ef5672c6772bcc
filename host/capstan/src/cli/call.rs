//! `capstan call`: any method of a running host — the host's own and every plugin's — driven by
//! what the host lists at `GET /api/v1/methods`, so a plugin's methods need no CLI change.
//!
//! The body is JSON given as an argument, read from a file (`-f FILE`, `-` for standard input),
//! or built from `--set key=value` pairs (dotted keys nest; a value that parses as JSON is that
//! JSON, else it is a string), which also apply on top of a given body. `--set-file key=FILE`
//! sets a field to a file's UTF-8 text, as a JSON string (`-` for standard input), after the
//! `--set`s: for a method that takes a document as text, such as the App Store's
//! `appstore.importCatalog --set-file envelope=catalog-8.json`.

use super::client::{Client, Connection, finish, print_json, print_table};
use crate::refusal::{Refusal, Result};
use serde_json::{Map, Value, json};
use std::io::Read;
use std::process::ExitCode;

/// The largest body read from a file or standard input.
const MAX_BODY_BYTES: u64 = 16 << 20;

#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub struct CallArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The method, e.g. `services.list` or `appstore.listApps`
    #[arg(value_name = "METHOD")]
    pub method: Option<String>,
    /// The request body as JSON (default `{}`)
    #[arg(value_name = "JSON", conflicts_with = "file")]
    pub body: Option<String>,
    /// Read the body from FILE (`-` for standard input)
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<String>,
    /// Set one field: key=value; dotted keys nest (spec.replicas=2); JSON values are kept as JSON
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Set one field to the text of FILE (UTF-8, as a JSON string; `-` for standard input), after
    /// the --set ones; dotted keys nest
    #[arg(long = "set-file", value_name = "KEY=FILE")]
    pub set_file: Vec<String>,
    /// List every method the host serves: name, who may call it, what it does
    #[arg(long, conflicts_with_all = ["method", "body", "file", "set", "set_file"])]
    pub list: bool,
    /// Print exact JSON instead of text
    #[arg(long)]
    pub json: bool,
    /// With a METHOD: its summary, access and input fields, from the host; else this help
    #[arg(short = 'h', long = "help")]
    pub help: bool,
}

pub fn run(args: CallArgs) -> ExitCode {
    let json = args.json;
    finish(call(args), json)
}

fn call(args: CallArgs) -> Result<()> {
    let client = Client::new(&args.connection)?;
    match (&args.method, args.list, args.help) {
        (_, true, _) => list(&client, args.json),
        (Some(method), _, true) => describe(&client, method, args.json),
        (None, _, _) => {
            use clap::CommandFactory;
            let mut help = super::Cli::command();
            let _ = help.find_subcommand_mut("call").map(|c| c.print_long_help());
            if args.help { Ok(()) } else { Err(Refusal::invalid_request("name a method (capstan call --list shows them)")) }
        }
        (Some(method), _, false) => {
            let body = body(args.body.as_deref(), args.file.as_deref(), &args.set, &args.set_file)?;
            let waiting = super::progress::Progress::spinner(format!("{method}: waiting for the host"));
            let answer = client.call(method, &body);
            drop(waiting);
            let answer = match answer {
                // name the methods of that area, as `--help` would
                Err(e) if e.is("method-unknown") => return Err(find(&methods(&client)?, method).err().unwrap_or(e)),
                other => other?,
            };
            if args.json {
                print_json(&answer)
            } else {
                print_answer(&answer)
            }
            Ok(())
        }
    }
}

/// The methods the host serves, as `GET /api/v1/methods` lists them.
fn methods(client: &Client) -> Result<Vec<Value>> {
    let listing = client.get("/api/v1/methods")?;
    Ok(listing["methods"].as_array().cloned().unwrap_or_default())
}

fn list(client: &Client, json: bool) -> Result<()> {
    let methods = methods(client)?;
    if json {
        print_json(&Value::Array(methods));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = methods
        .iter()
        .map(|m| vec![text(&m["name"]), text(&m["access"]), text(&m["summary"]).lines().next().unwrap_or_default().to_string()])
        .collect();
    print_table(&["METHOD", "ACCESS", "SUMMARY"], &rows);
    Ok(())
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or("-").to_string()
}

/// `method`'s entry in the listing, or `method-unknown` naming close ones.
fn find(methods: &[Value], method: &str) -> Result<Value> {
    if let Some(found) = methods.iter().find(|m| m["name"] == method) {
        return Ok(found.clone());
    }
    let area = method.split('.').next().unwrap_or(method);
    let near: Vec<&str> = methods.iter().filter_map(|m| m["name"].as_str()).filter(|n| n.starts_with(&format!("{area}."))).collect();
    let hint = if near.is_empty() {
        "capstan call --list shows every method".to_string()
    } else {
        format!("did you mean one of {}?", near.join(", "))
    };
    Err(Refusal::new("method-unknown", format!("the host serves no method {method:?}: {hint}")).with_data(json!({ "method": method })))
}

fn describe(client: &Client, method: &str, json: bool) -> Result<()> {
    let entry = find(&methods(client)?, method)?;
    if json {
        print_json(&entry);
        return Ok(());
    }
    println!("{}  ({})", text(&entry["name"]), text(&entry["access"]));
    println!("{}", text(&entry["summary"]));
    if entry["coordinatorOnly"] == true {
        println!("Answered by the fleet's coordinator (any node forwards it).");
    }
    let schema = &entry["input"];
    let fields = fields(schema, schema);
    if fields.is_empty() {
        println!("\nBody: {{}} (no fields)");
    } else {
        println!("\nFields:");
        let rows: Vec<Vec<String>> = fields.into_iter().map(|(name, kind, required, about)| vec![name, kind, required, about]).collect();
        print_table(
            &["  FIELD", "TYPE", "", "ABOUT"],
            &rows
                .into_iter()
                .map(|mut r| {
                    r[0] = format!("  {}", r[0]);
                    r
                })
                .collect::<Vec<_>>(),
        );
    }
    println!("\nExample: capstan call {method} --set field=value   (or a JSON body, or -f FILE)");
    Ok(())
}

/// `schema` with a local `$ref` followed (against `root`'s `$defs`).
fn resolved<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/$defs/")) {
        Some(name) => &root["$defs"][name],
        None => schema,
    }
}

/// A schema's type for people: `string`, `integer`, `array of string`, `one of a|b`, `object`.
fn type_name(root: &Value, schema: &Value) -> String {
    let schema = resolved(root, schema);
    if let Some(values) = schema["enum"].as_array() {
        return format!(
            "one of {}",
            values.iter().map(|v| v.as_str().map(str::to_string).unwrap_or(v.to_string())).collect::<Vec<_>>().join("|")
        );
    }
    if let Some(options) = schema["oneOf"].as_array().or(schema["anyOf"].as_array()) {
        let consts: Vec<String> = options.iter().filter_map(|o| resolved(root, o)["const"].as_str().map(str::to_string)).collect();
        if consts.len() == options.len() {
            return format!("one of {}", consts.join("|"));
        }
        let kinds: Vec<String> = options.iter().map(|o| type_name(root, o)).collect();
        return kinds.join(" or ");
    }
    match &schema["type"] {
        Value::String(t) if t == "array" => format!("array of {}", type_name(root, &schema["items"])),
        Value::String(t) => t.clone(),
        Value::Array(types) => types.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" or "),
        _ if schema.get("const").is_some() => schema["const"].to_string(),
        _ => "any".into(),
    }
}

/// The top-level fields of an input schema: name, type, `required` or empty, first line of the
/// description.
fn fields(root: &Value, schema: &Value) -> Vec<(String, String, String, String)> {
    let schema = resolved(root, schema);
    let required: Vec<&str> = schema["required"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    let Some(properties) = schema["properties"].as_object() else { return Vec::new() };
    properties
        .iter()
        .map(|(name, field)| {
            let about = resolved(root, field)["description"].as_str().or(field["description"].as_str()).unwrap_or_default();
            let about = about.lines().next().unwrap_or_default().to_string();
            let needed = if required.contains(&name.as_str()) { "required" } else { "" };
            (name.clone(), type_name(root, field), needed.to_string(), about)
        })
        .collect()
}

/// The request body: the JSON given or read, then each `--set` on top, then each `--set-file`.
fn body(given: Option<&str>, file: Option<&str>, sets: &[String], set_files: &[String]) -> Result<Value> {
    let set_file_paths = set_files.iter().filter_map(|p| p.split_once('=').map(|(_, path)| path));
    if file.into_iter().chain(set_file_paths).filter(|p| *p == "-").count() > 1 {
        return Err(Refusal::new("set-invalid", "standard input (-) is read once: name it for one of -f and --set-file"));
    }
    let text = match (given, file) {
        (Some(text), _) => Some(text.to_string()),
        (None, Some(path)) => Some(read_body(path)?),
        (None, None) => None,
    };
    let mut body = match text {
        Some(text) => serde_json::from_str(&text).map_err(|e| {
            Refusal::new("body-invalid", format!("the body is not JSON: {e}")).with_data(json!({ "line": e.line(), "column": e.column() }))
        })?,
        None => Value::Object(Map::new()),
    };
    for pair in sets {
        let (key, value) = split("--set", pair)?;
        set(&mut body, "--set", pair, key, serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string())))?;
    }
    for pair in set_files {
        let (key, path) = split("--set-file", pair)?;
        set(&mut body, "--set-file", pair, key, Value::String(read_body(path)?))?;
    }
    Ok(body)
}

/// The text of `path` (`-`: standard input), UTF-8, at most [`MAX_BODY_BYTES`]: a body, or a
/// `--set-file` value.
fn read_body(path: &str) -> Result<String> {
    let mut text = String::new();
    let read = if path == "-" {
        std::io::stdin().take(MAX_BODY_BYTES + 1).read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_BODY_BYTES + 1).read_to_string(&mut text))
    };
    read.map_err(|e| Refusal::new("body-unreadable", format!("cannot read {path}: {}", e.kind())).with_data(json!({ "path": path })))?;
    if text.len() as u64 > MAX_BODY_BYTES {
        return Err(Refusal::new("body-too-large", format!("{path} holds more than {MAX_BODY_BYTES} bytes, the most read"))
            .with_data(json!({ "path": path })));
    }
    Ok(text)
}

fn set_invalid(flag: &str, pair: &str, why: &str) -> Refusal {
    Refusal::new("set-invalid", format!("{flag} {pair:?}: {why}")).with_data(json!({ "set": pair }))
}

/// The key and the value of `flag`'s `key=value`, the key made of non-empty dotted parts.
fn split<'a>(flag: &str, pair: &'a str) -> Result<(&'a str, &'a str)> {
    let (key, value) = pair.split_once('=').ok_or_else(|| set_invalid(flag, pair, "expected key=value"))?;
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(set_invalid(flag, pair, "the key is empty or has an empty part"));
    }
    Ok((key, value))
}

/// Set `key` of `body` to `value` (given as `flag`'s `pair`): dotted keys nest through objects
/// (created when missing).
fn set(body: &mut Value, flag: &str, pair: &str, key: &str, value: Value) -> Result<()> {
    let refuse = |why: &str| set_invalid(flag, pair, why);
    let mut at = body;
    let parts: Vec<&str> = key.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let object = at.as_object_mut().ok_or_else(|| refuse("a part of the key is not an object in the body"))?;
        if i == parts.len() - 1 {
            object.insert(part.to_string(), value);
            return Ok(());
        }
        at = object.entry(part.to_string()).or_insert_with(|| Value::Object(Map::new()));
    }
    Ok(())
}

/// An answer for people: a table when it is a list of objects (`items`, or an array), else
/// indented JSON.
fn print_answer(answer: &Value) {
    let rows = answer["items"].as_array().or(answer.as_array());
    match rows {
        Some(rows) if !rows.is_empty() && rows.iter().all(Value::is_object) => {
            let columns = columns(rows);
            let cells: Vec<Vec<String>> = rows.iter().map(|row| columns.iter().map(|c| cell(c, &row[c.as_str()])).collect()).collect();
            let header: Vec<String> = columns.iter().map(|c| c.to_uppercase()).collect();
            print_table(&header.iter().map(String::as_str).collect::<Vec<_>>(), &cells);
            if let Some(cursor) = answer["nextCursor"].as_str() {
                println!("(more: --set cursor={cursor})");
            }
        }
        Some(rows) if rows.is_empty() => println!("(none)"),
        _ => println!("{}", serde_json::to_string_pretty(answer).unwrap_or_else(|_| answer.to_string())),
    }
}

/// The columns of a table: the keys of the rows whose values are scalars, `id` and `name`
/// first, at most eight.
fn columns(rows: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for row in rows {
        for (key, value) in row.as_object().into_iter().flatten() {
            if !value.is_object() && !value.is_array() && !out.contains(key) {
                out.push(key.clone());
            }
        }
    }
    out.sort_by_key(|k| match k.as_str() {
        "id" => 0,
        "name" => 1,
        _ => 2,
    });
    out.truncate(8);
    out
}

fn cell(column: &str, value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        // `createdAt`, `expiresAt`, …: moments (milliseconds since the epoch), read as UTC
        Value::Number(n) if column.ends_with("At") && n.is_u64() => super::client::utc(n.as_u64()),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_come_from_json_and_sets_nest_on_top() {
        assert_eq!(body(None, None, &[], &[]).unwrap(), json!({}));
        let sets = ["name=web".to_string(), "spec.replicas=2".to_string(), "spec.public=true".to_string(), "tags=[\"a\"]".to_string()];
        let made = body(Some(r#"{"organizationId":"org_1","spec":{"image":"nginx"}}"#), None, &sets, &[]).unwrap();
        assert_eq!(
            made,
            json!({ "organizationId": "org_1", "name": "web", "spec": { "image": "nginx", "replicas": 2, "public": true }, "tags": ["a"] })
        );
        assert_eq!(body(None, None, &["note=two words".to_string()], &[]).unwrap(), json!({ "note": "two words" }));
        assert_eq!(body(None, None, &["id=\"007\"".to_string()], &[]).unwrap(), json!({ "id": "007" }), "quoted JSON stays a string");
        assert_eq!(body(Some("{nope"), None, &[], &[]).unwrap_err().code, "body-invalid");
        assert_eq!(body(None, None, &["novalue".to_string()], &[]).unwrap_err().code, "set-invalid");
        assert_eq!(body(None, None, &["a..b=1".to_string()], &[]).unwrap_err().code, "set-invalid");
        assert_eq!(body(Some("[1]"), None, &["a=1".to_string()], &[]).unwrap_err().code, "set-invalid", "a body that is no object");
        assert_eq!(body(None, Some("/nonexistent/body.json"), &[], &[]).unwrap_err().code, "body-unreadable");
    }

    #[test]
    fn set_file_sets_a_field_to_a_file_s_text() {
        let dir = tempfile::tempdir().unwrap();
        let envelope = dir.path().join("catalog-8.json");
        // the text as it is, a JSON string even when it is JSON itself
        std::fs::write(&envelope, "{\"format\":\"capstan-catalog\"}\n").unwrap();
        let path = envelope.to_str().unwrap();
        let made = body(None, None, &["envelope=1".to_string()], &[format!("envelope={path}"), format!("spec.notes={path}")]).unwrap();
        let text = "{\"format\":\"capstan-catalog\"}\n";
        assert_eq!(made, json!({ "envelope": text, "spec": { "notes": text } }), "after the --set ones, nested");
        let missing = body(None, None, &[], &["envelope=/nonexistent/catalog.json".to_string()]).unwrap_err();
        assert_eq!((missing.code.as_ref(), missing.data.unwrap()["path"].as_str()), ("body-unreadable", Some("/nonexistent/catalog.json")));
        std::fs::write(&envelope, [0xff, 0xfe]).unwrap();
        assert_eq!(body(None, None, &[], &[format!("envelope={path}")]).unwrap_err().code, "body-unreadable", "not UTF-8");
        assert_eq!(body(None, None, &[], &[path.to_string()]).unwrap_err().code, "set-invalid", "no key");
        assert_eq!(body(None, None, &[], &[format!(".x={path}")]).unwrap_err().code, "set-invalid");
        let twice = body(None, Some("-"), &[], &["envelope=-".to_string()]).unwrap_err();
        assert_eq!(twice.code, "set-invalid", "standard input is read once");
        assert_eq!(body(None, None, &[], &["a=-".to_string(), "b=-".to_string()]).unwrap_err().code, "set-invalid");
    }

    #[test]
    fn schemas_read_as_fields_with_types() {
        let schema = json!({
            "type": "object",
            "required": ["organizationId"],
            "properties": {
                "organizationId": { "type": "string", "description": "The organization's id.\nMore." },
                "role": { "anyOf": [{ "$ref": "#/$defs/Role" }, { "type": "null" }] },
                "tags": { "type": "array", "items": { "type": "string" } },
                "limit": { "type": ["integer", "null"] }
            },
            "$defs": { "Role": { "oneOf": [{ "const": "member" }, { "const": "owner" }] } }
        });
        let fields = fields(&schema, &schema);
        let find = |n: &str| fields.iter().find(|f| f.0 == n).unwrap().clone();
        assert_eq!(find("organizationId"), ("organizationId".into(), "string".into(), "required".into(), "The organization's id.".into()));
        assert_eq!(find("role").1, "one of member|owner or null");
        assert_eq!(find("tags").1, "array of string");
        assert_eq!(find("limit").1, "integer or null");
    }

    #[test]
    fn unknown_methods_are_refused_with_the_area_s_methods() {
        let listed = vec![json!({ "name": "services.list" }), json!({ "name": "services.get" }), json!({ "name": "auth.login" })];
        let refused = find(&listed, "services.lst").unwrap_err();
        assert_eq!(refused.code, "method-unknown");
        assert!(refused.message.contains("services.list, services.get"), "{}", refused.message);
        assert!(find(&listed, "nope.x").unwrap_err().message.contains("--list"));
    }

    #[test]
    fn times_read_as_utc_and_absent_values_as_a_dash() {
        assert_eq!(cell("createdAt", &json!(1_700_000_000_000u64)), "2023-11-14 22:13:20 UTC");
        assert_eq!(cell("revision", &json!(3)), "3");
        assert_eq!(cell("note", &Value::Null), "-");
    }

    #[test]
    fn tables_take_scalar_columns_id_and_name_first() {
        let rows = vec![json!({ "revision": 1, "name": "web", "id": "svc_1", "spec": {} }), json!({ "id": "svc_2", "state": "active" })];
        assert_eq!(columns(&rows), vec!["id", "name", "revision", "state"]);
    }
}
