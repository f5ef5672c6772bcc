//! `capstan secrets sets list | create | show | rename | retire`, `capstan secrets attach |
//! detach | preview`: SecretSets (an organization's shared secrets) and which services they
//! are attached to. Their member secrets are set like any other: `capstan secrets set
//! --secret-set <id> <KEY>`. Every answer is metadata.

use super::client::{Client, finish, items, print_json, print_table, text, utc};
use super::confirm::{Confirm, ask, can_confirm};
use super::resolve::{self, Names};
use super::secrets::Common;
use crate::refusal::Result;
use clap::Subcommand;
use serde_json::{Map, Value, json};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum SetsCommand {
    /// SecretSets, all or one organization's (`secrets.listSecretSets`).
    List {
        /// Only this organization's sets (its name or id)
        #[arg(long, value_name = "NAME|ID")]
        organization: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Create a SecretSet in an organization (`secrets.createSecretSet`).
    Create {
        /// The organization (its name or id)
        #[arg(long, value_name = "NAME|ID")]
        organization: String,
        /// 1–63 of a-z 0-9 -, starting with a letter; unique within the organization
        name: String,
        #[arg(long, value_name = "TEXT")]
        description: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// A SecretSet, its member secrets (metadata) and the services it is attached to.
    Show {
        /// The SecretSet (`sset_…`)
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Rename or describe a SecretSet (`secrets.updateSecretSet`).
    Rename {
        /// The SecretSet (`sset_…`)
        id: String,
        /// The new name
        name: String,
        /// The revision you read (default: the current one)
        #[arg(long, value_name = "N")]
        expected_revision: Option<u64>,
        #[command(flatten)]
        common: Common,
    },
    /// Retire a SecretSet: it is detached from every service (each service's manifest is
    /// published) in one transaction and takes no new secret (`secrets.retireSecretSet`).
    ///
    /// Asks on a terminal ([y/N]); refused `confirmation-required` without --yes when standard
    /// input is not a terminal.
    Retire {
        /// The SecretSet (`sset_…`)
        id: String,
        /// The revision you read (default: the current one)
        #[arg(long, value_name = "N")]
        expected_revision: Option<u64>,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(clap::Args)]
pub struct AttachmentArgs {
    /// The service (its name or id)
    #[arg(long, value_name = "NAME|ID")]
    service: String,
    /// The SecretSet (`sset_…`)
    #[arg(long, value_name = "ID")]
    secret_set: String,
    /// The service's secrets revision you read (default: the current one)
    #[arg(long, value_name = "N")]
    expected_secrets_revision: Option<u64>,
}

pub fn run(command: SetsCommand) -> ExitCode {
    let (result, json) = match command {
        SetsCommand::List { organization, common } => (list(organization, &common), common.json),
        SetsCommand::Create { organization, name, description, common } => {
            let mut body = Map::new();
            body.insert("name".into(), json!(name));
            if let Some(description) = description {
                body.insert("description".into(), json!(description));
            }
            (create(&organization, body, &common), common.json)
        }
        SetsCommand::Show { id, common } => (show(&id, &common), common.json),
        SetsCommand::Rename { id, name, expected_revision, common } => (
            Client::new(&common.connection).and_then(|client| {
                let revision = client.expected_or_current(expected_revision, "secrets.getSecretSet", &json!({ "id": id }), "revision")?;
                report_set(
                    &client.call("secrets.updateSecretSet", &json!({ "id": id, "expectedRevision": revision, "name": name }))?,
                    "renamed",
                    &common,
                );
                Ok(())
            }),
            common.json,
        ),
        SetsCommand::Retire { id, expected_revision, confirm, common } => (retire(&id, expected_revision, &confirm, &common), common.json),
    };
    finish(result, json)
}

fn create(organization: &str, mut body: Map<String, Value>, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    body.insert("organizationId".into(), json!(resolve::organization(&client, organization)?));
    report_set(&client.call("secrets.createSecretSet", &Value::Object(body))?, "created", common);
    Ok(())
}

fn report_set(set: &Value, done: &str, common: &Common) {
    if common.json {
        print_json(set);
    } else {
        println!("{done} SecretSet {} ({}), revision {}", text(set, "name"), text(set, "id"), set["revision"]);
    }
}

fn list(organization: Option<String>, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let organization = resolve::organization_opt(&client, organization.as_deref())?;
    let organizations = Names::organizations(&client);
    let mut cursor = Value::Null;
    let mut rows = Vec::new();
    let mut all = Vec::new();
    loop {
        let page = client.call("secrets.listSecretSets", &json!({ "organizationId": organization, "cursor": cursor, "limit": 200 }))?;
        for set in items(&page) {
            rows.push(vec![
                text(set, "id").into(),
                organizations.show(text(set, "organizationId")),
                text(set, "name").into(),
                text(set, "state").into(),
                utc(set["updatedAt"].as_u64()),
            ]);
            all.push(set.clone());
        }
        cursor = page["nextCursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    if common.json {
        print_json(&json!({ "items": all }));
    } else if rows.is_empty() {
        println!("no SecretSets");
    } else {
        print_table(&["ID", "ORGANIZATION", "NAME", "STATE", "UPDATED"], &rows);
    }
    Ok(())
}

fn show(id: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let set = client.call("secrets.getSecretSet", &json!({ "id": id }))?;
    if common.json {
        print_json(&set);
        return Ok(());
    }
    println!("SecretSet:    {} ({})", text(&set, "name"), text(&set, "id"));
    println!("organization: {}", text(&set, "organizationId"));
    println!("state:        {}", text(&set, "state"));
    println!("revision:     {}", set["revision"]);
    if !text(&set, "description").is_empty() {
        println!("description:  {}", text(&set, "description"));
    }
    let attached: Vec<&str> =
        set["attachedServiceIds"].as_array().map(Vec::as_slice).unwrap_or_default().iter().filter_map(Value::as_str).collect();
    println!("attached to:  {}", if attached.is_empty() { "no service".to_string() } else { attached.join(", ") });
    let rows: Vec<Vec<String>> = set["secrets"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| {
            vec![
                text(s, "id").into(),
                text(s, "key").into(),
                text(s, "environment").into(),
                text(s, "state").into(),
                s["versions"].as_u64().map(|n| n.to_string()).unwrap_or_default(),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("no secrets yet: capstan secrets set --secret-set {id} <KEY> < value-file");
    } else {
        print_table(&["ID", "KEY", "ENVIRONMENT", "STATE", "VERSIONS"], &rows);
    }
    Ok(())
}

fn retire(id: &str, expected: Option<u64>, confirm: &Confirm, common: &Common) -> Result<()> {
    can_confirm(confirm)?;
    let client = Client::new(&common.connection)?;
    ask(confirm, || {
        let set = client.call("secrets.getSecretSet", &json!({ "id": id }))?;
        Ok(format!("Retire SecretSet {} ({id})? It is detached from every service it is attached to.", text(&set, "name")))
    })?;
    let revision = client.expected_or_current(expected, "secrets.getSecretSet", &json!({ "id": id }), "revision")?;
    let answer = client.call("secrets.retireSecretSet", &json!({ "id": id, "expectedRevision": revision }))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let detached = answer["detachedServiceIds"].as_array().map(Vec::len).unwrap_or(0);
    println!("retired SecretSet {} ({}); detached from {detached} service(s)", text(&answer["secretSet"], "name"), id);
    Ok(())
}

/// Attach (`attach`) or detach a set, stating the service's secrets revision.
pub fn attach(args: &AttachmentArgs, attach: bool, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let service = &resolve::service(&client, &args.service, None)?;
    let revision = client.expected_or_current(
        args.expected_secrets_revision,
        "secrets.getServiceConfiguration",
        &json!({ "serviceId": service }),
        "secretsRevision",
    )?;
    let method = if attach { "secrets.attachSecretSet" } else { "secrets.detachSecretSet" };
    let body = json!({ "serviceId": service, "secretSetId": args.secret_set, "expectedSecretsRevision": revision });
    let answer = client.call(method, &body)?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let done = if attach { "attached" } else { "detached" };
    println!(
        "{done} SecretSet {} {} service {}; secrets revision {}",
        args.secret_set,
        if attach { "to" } else { "from" },
        resolve::shown(&args.service, service),
        answer["secretsRevision"]
    );
    let order: Vec<&str> = items_of(&answer["attachments"]).iter().map(|a| text(a, "secretSetId")).collect();
    if !order.is_empty() {
        println!("resolution order: the service's own secrets, then {}", order.join(", "));
    }
    Ok(())
}

fn items_of(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

fn source(from: &Value) -> String {
    match from["kind"].as_str() {
        Some("secretSet") => format!("SecretSet {}", text(from, "secretSetId")),
        _ => "service".into(),
    }
}

pub fn preview(given: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let service = &resolve::service(&client, given, None)?;
    let mut answer = client.call("secrets.previewResolution", &json!({ "serviceId": service }))?;
    // what each replica was handed, beside what would resolve now
    answer["replicas"] = client.call("secrets.preview", &json!({ "serviceId": service }))?["replicas"].take();
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let shown = resolve::shown(given, service);
    println!("service {shown}: secrets revision {}, newest manifest {}", answer["secretsRevision"], answer["manifestNumber"]);
    let rows: Vec<Vec<String>> = items_of(&answer["entries"])
        .iter()
        .map(|e| {
            vec![
                text(e, "environment").into(),
                text(e, "key").into(),
                source(&e["from"]),
                text(e, "secretId").into(),
                text(e, "versionId").into(),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("nothing resolves: the service has no active secret and no attached SecretSet holds one");
    } else {
        print_table(&["ENVIRONMENT", "KEY", "FROM", "SECRET", "VERSION"], &rows);
    }
    let replicas: Vec<Vec<String>> = items_of(&answer["replicas"])
        .iter()
        .map(|r| {
            let names = |field: &str| items_of(&r[field]).iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",");
            vec![
                text(r, "slot").into(),
                text(r, "phase").into(),
                r["manifest"].to_string(),
                text(r, "environment").into(),
                names("variables"),
                names("files"),
                if r["received"] == true { "yes" } else { "not yet" }.into(),
            ]
        })
        .collect();
    if !replicas.is_empty() {
        println!();
        print_table(&["REPLICA", "PHASE", "MANIFEST", "ENVIRONMENT", "VARIABLES", "FILES", "RECEIVED"], &replicas);
    }
    for conflict in items_of(&answer["conflicts"]) {
        let shadowed: Vec<String> = items_of(&conflict["shadowed"]).iter().map(source).collect();
        println!(
            "conflict: {} ({}) resolves from {}; shadowed: {}",
            text(conflict, "key"),
            text(conflict, "environment"),
            source(&conflict["resolvedFrom"]),
            shadowed.join(", ")
        );
    }
    Ok(())
}
