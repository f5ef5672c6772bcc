//! `capstan organizations | clusters | services | settings | users`: the inventory's commands,
//! clients of the `organizations.*`, `clusters.*`, `services.*`, `settings.*` and
//! `admin.createUser` API methods of a running host.
//!
//! With `--json` each prints the API's answer exactly (one line); a refusal prints
//! `{"ok":false,"error":{…}}` on standard output and exits 1. Without it, output is for people
//! and a refusal is one `capstan: refused (<code>): <message>` line on standard error, exit 1.
//! A write that needs an expected revision and was not given one reads the entity first and
//! states the revision it read, so a change in between is still refused `conflict`.
//!
//! A secret shown once (a cluster's machine token, a new person's password) goes to standard
//! output only, with a note that it is not shown again; nothing here logs it.

use super::client::{Client, finish, items, print_json, print_table, text, utc};
use super::confirm::{Confirm, ask, can_confirm};
use super::resolve::{self, Names};
use crate::refusal::{Refusal, Result};
use capstan_field_rules::port;
use clap::{Subcommand, ValueEnum};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::process::ExitCode;

// ---- arguments shared by every command ----

pub use super::client::Common;

#[derive(clap::Args)]
pub struct Page {
    /// Continue a listing after this cursor (a page that has more prints its next cursor)
    #[arg(long, value_name = "CURSOR")]
    cursor: Option<String>,
    /// At most this many items (1–200; default 50)
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
}

impl Page {
    fn body(&self) -> Map<String, Value> {
        let mut body = Map::new();
        insert(&mut body, "cursor", self.cursor.clone());
        insert(&mut body, "limit", self.limit);
        body
    }
}

#[derive(clap::Args)]
pub struct Expected {
    /// The revision you read. Without it the CLI reads the current revision first and writes
    /// against that; a change between that read and the write is still refused `conflict`
    #[arg(long, value_name = "N")]
    expected_revision: Option<u64>,
}

// ---- organizations ----

#[derive(Subcommand)]
pub enum OrganizationsCommand {
    /// Organizations: every one for an administrator, your own for anyone else (`organizations.list`).
    List {
        #[command(flatten)]
        page: Page,
        #[command(flatten)]
        common: Common,
    },
    /// One organization (`organizations.get`; its members and administrators).
    Get {
        /// The organization's name or id (`org_…`)
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Create an organization (`organizations.create`; administrators).
    ///
    /// The name is 1–63 of a-z 0-9 -, starts with a letter and is unique; otherwise the
    /// refusal is `name-invalid` or `exists`. An administrator is not made its owner: give the
    /// owner role with `set-member`.
    Create {
        /// The new organization's name
        name: String,
        #[command(flatten)]
        common: Common,
    },
    /// Rename an organization (`organizations.update`; its owners and administrators).
    Rename {
        /// The organization's name or id
        id: String,
        /// The new name (1–63 of a-z 0-9 -, starting with a letter)
        name: String,
        #[command(flatten)]
        expected: Expected,
        #[command(flatten)]
        common: Common,
    },
    /// Delete an organization with its memberships (`organizations.delete`; administrators).
    ///
    /// Refused `organization-has-services` while any service (even one being deleted) is left.
    ///
    /// Asks on a terminal ([y/N]); refused `confirmation-required` without --yes when standard
    /// input is not a terminal.
    Delete {
        /// The organization's name or id
        id: String,
        #[command(flatten)]
        expected: Expected,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
    /// An organization's members and their roles (`organizations.listMembers`; its members).
    Members {
        /// The organization's name or id
        id: String,
        #[command(flatten)]
        page: Page,
        #[command(flatten)]
        common: Common,
    },
    /// Give a user a role in an organization, or take it away with `--role none`
    /// (`organizations.setMember`; its owners and administrators).
    ///
    /// An owner may not remove or demote the organization's last owner
    /// (`organization-last-owner`). The user id is the one `capstan users create` printed.
    SetMember {
        /// The organization's name or id
        organization: String,
        /// The user's username or id (`user_…`)
        user_id: String,
        /// The role to hold from now on
        #[arg(long, value_enum)]
        role: RoleArg,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum RoleArg {
    /// May change the organization and its services, and its members
    Owner,
    /// May read the organization and its services
    Member,
    /// No role: removes the membership
    None,
}

pub fn organizations(command: OrganizationsCommand) -> ExitCode {
    let (result, json) = match command {
        OrganizationsCommand::List { page, common } => (organization_list(&page, &common), common.json),
        OrganizationsCommand::Get { id, common } => (organization_get(&id, &common), common.json),
        OrganizationsCommand::Create { name, common } => (organization_create(&name, &common), common.json),
        OrganizationsCommand::Rename { id, name, expected, common } => (organization_rename(&id, &name, &expected, &common), common.json),
        OrganizationsCommand::Delete { id, expected, confirm, common } => {
            (organization_delete(&id, &expected, &confirm, &common), common.json)
        }
        OrganizationsCommand::Members { id, page, common } => (organization_members(&id, &page, &common), common.json),
        OrganizationsCommand::SetMember { organization, user_id, role, common } => {
            (organization_set_member(&organization, &user_id, role, &common), common.json)
        }
    };
    finish(result, json)
}

fn organization_list(page: &Page, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let answer = client.call("organizations.list", &Value::Object(page.body()))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = items(&answer)
        .iter()
        .map(|o| vec![text(o, "id").into(), text(o, "name").into(), number(o, "revision"), utc(o["createdAt"].as_u64())])
        .collect();
    if rows.is_empty() {
        println!("no organizations (an administrator sees every one; anyone else the ones they belong to)");
    } else {
        print_table(&["ID", "NAME", "REVISION", "CREATED"], &rows);
    }
    print_more(&answer);
    Ok(())
}

fn organization_get(id: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let id = &resolve::organization(&client, id)?;
    let o = client.call("organizations.get", &json!({ "id": id }))?;
    if common.json {
        print_json(&o);
        return Ok(());
    }
    println!("organization: {} ({})", text(&o, "name"), text(&o, "id"));
    println!("revision:     {}", number(&o, "revision"));
    println!("created:      {} by {}", utc(o["createdAt"].as_u64()), text(&o, "createdBy"));
    println!("updated:      {}", utc(o["updatedAt"].as_u64()));
    print_facets(&o);
    Ok(())
}

fn organization_create(name: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let o = client.call("organizations.create", &json!({ "name": name }))?;
    if common.json {
        print_json(&o);
        return Ok(());
    }
    println!("created organization {} ({}), revision {}", text(&o, "name"), text(&o, "id"), number(&o, "revision"));
    println!("  give it an owner: capstan organizations set-member {} USER_ID --role owner", text(&o, "id"));
    Ok(())
}

fn organization_rename(id: &str, name: &str, expected: &Expected, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let id = &resolve::organization(&client, id)?;
    let revision = client.expected_or_current(expected.expected_revision, "organizations.get", &json!({ "id": id }), "revision")?;
    let o = client.call("organizations.update", &json!({ "id": id, "expectedRevision": revision, "name": name }))?;
    if common.json {
        print_json(&o);
        return Ok(());
    }
    if o["revision"].as_u64() == Some(revision) {
        println!("organization {} is already named {}; nothing changed (revision {revision})", text(&o, "id"), text(&o, "name"));
    } else {
        println!("renamed organization {} to {}, revision {}", text(&o, "id"), text(&o, "name"), number(&o, "revision"));
    }
    Ok(())
}

fn organization_delete(id: &str, expected: &Expected, confirm: &Confirm, common: &Common) -> Result<()> {
    can_confirm(confirm)?;
    let client = Client::new(&common.connection)?;
    let id = &resolve::organization(&client, id)?;
    ask(confirm, || {
        let o = client.call("organizations.get", &json!({ "id": id }))?;
        Ok(format!("Delete organization {} ({id}) and its memberships for good?", text(&o, "name")))
    })?;
    let revision = client.expected_or_current(expected.expected_revision, "organizations.get", &json!({ "id": id }), "revision")?;
    let answer = client.call("organizations.delete", &json!({ "id": id, "expectedRevision": revision }))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    println!("deleted organization {} and its memberships", text(&answer, "id"));
    Ok(())
}

fn organization_members(id: &str, page: &Page, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let id = &resolve::organization(&client, id)?;
    let mut body = page.body();
    body.insert("organizationId".into(), json!(id));
    let answer = client.call("organizations.listMembers", &Value::Object(body))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let rows: Vec<Vec<String>> =
        items(&answer).iter().map(|m| vec![text(m, "userId").into(), text(m, "username").into(), text(m, "role").into()]).collect();
    if rows.is_empty() {
        println!("{id} has no members (administrators manage it without a role)");
    } else {
        print_table(&["USER ID", "USERNAME", "ROLE"], &rows);
    }
    print_more(&answer);
    Ok(())
}

fn organization_set_member(organization: &str, user_id: &str, role: RoleArg, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let (organization_given, user_given) = (organization, user_id);
    let organization = &resolve::organization(&client, organization)?;
    let user_id = &resolve::user(&client, user_id, Some(organization))?;
    let role = match role {
        RoleArg::Owner => json!("owner"),
        RoleArg::Member => json!("member"),
        RoleArg::None => Value::Null,
    };
    let answer = client.call("organizations.setMember", &json!({ "organizationId": organization, "userId": user_id, "role": role }))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    // named as the operator named them, the ids beside names
    let user = resolve::shown(user_given, user_id);
    let organization = resolve::shown(organization_given, organization);
    match answer["role"].as_str() {
        Some(role) => println!("{user} is {} {role} of {organization}", if role == "owner" { "an" } else { "a" }),
        None => println!("{user} holds no role in {organization}"),
    }
    Ok(())
}

// ---- clusters ----

#[derive(Subcommand)]
pub enum ClustersCommand {
    /// Clusters, paged (`clusters.list`; administrators).
    List {
        #[command(flatten)]
        page: Page,
        #[command(flatten)]
        common: Common,
    },
    /// One cluster (`clusters.get`). Its machine user's token is never shown again.
    Get {
        /// The cluster's name or id (`cluster_…`)
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Create a cluster with its machine user and the runtime phase `pallet` (`clusters.create`).
    ///
    /// Prints the machine user's token once, on standard output: Capstan keeps only its
    /// SHA-256, so store it now for the cluster's agents (they exchange it for a session with
    /// `auth.exchangeToken`). With --json the token is in the answer's `machineUser.token`.
    Create {
        /// The cluster's name (1–63 of a-z 0-9 -, starting with a letter; unique). Its
        /// machine user is named `cluster-<name>`
        name: String,
        /// What the cluster is (at most 1024 bytes)
        #[arg(long, value_name = "TEXT")]
        description: Option<String>,
        /// A label KEY=VALUE; repeat for more (keys 1–63 of A-Z a-z 0-9 - _ . /)
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_pair)]
        labels: Vec<(String, String)>,
        #[command(flatten)]
        common: Common,
    },
    /// Change a cluster's name, description or labels (`clusters.update`).
    ///
    /// Labels are replaced whole: the --label flags given become every label the cluster has
    /// (--clear-labels removes them all); without either, labels stay. The machine user and the
    /// runtime phase never change here (see `set-phase`).
    Update {
        /// The cluster's name or id
        id: String,
        /// A new name
        #[arg(long)]
        name: Option<String>,
        /// A new description ("" clears it)
        #[arg(long, value_name = "TEXT")]
        description: Option<String>,
        /// A label KEY=VALUE; repeat for more. Replaces every label
        #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_pair)]
        labels: Vec<(String, String)>,
        /// Remove every label
        #[arg(long, conflicts_with = "labels")]
        clear_labels: bool,
        #[command(flatten)]
        expected: Expected,
        #[command(flatten)]
        common: Common,
    },
    /// Delete a cluster with its machine user and runtime phase (`clusters.delete`).
    ///
    /// Refused `cluster-has-nodes` while nodes belong to it. The machine user's sessions end.
    ///
    /// Asks on a terminal ([y/N]); refused `confirmation-required` without --yes when standard
    /// input is not a terminal.
    Delete {
        /// The cluster's name or id
        id: String,
        #[command(flatten)]
        expected: Expected,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
    /// A cluster's runtime phase and its generation (`clusters.getRuntime`).
    Runtime {
        /// The cluster's name or id
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Move a cluster's runtime phase (`clusters.setRuntimePhase`).
    ///
    /// swarm: the Swarm-era runtime owns it; draining: every service stopped, volumes kept;
    /// switching: nodes join the new runtime network; pallet: the node runtime alone owns it.
    SetPhase {
        /// The cluster's name or id
        id: String,
        /// The phase to move to
        #[arg(value_enum)]
        phase: PhaseArg,
        /// The generation you read (`capstan clusters runtime`). Without it the CLI reads the
        /// current generation first; a move between that read and the write is still refused
        /// `conflict`
        #[arg(long, value_name = "N")]
        expected_generation: Option<u64>,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum PhaseArg {
    Swarm,
    Draining,
    Switching,
    Pallet,
}

impl PhaseArg {
    fn as_str(self) -> &'static str {
        match self {
            PhaseArg::Swarm => "swarm",
            PhaseArg::Draining => "draining",
            PhaseArg::Switching => "switching",
            PhaseArg::Pallet => "pallet",
        }
    }
}

pub fn clusters(command: ClustersCommand) -> ExitCode {
    let (result, json) = match command {
        ClustersCommand::List { page, common } => (cluster_list(&page, &common), common.json),
        ClustersCommand::Get { id, common } => (cluster_get(&id, &common), common.json),
        ClustersCommand::Create { name, description, labels, common } => {
            (cluster_create(&name, description, &labels, &common), common.json)
        }
        ClustersCommand::Update { id, name, description, labels, clear_labels, expected, common } => {
            let labels = if clear_labels { Some(Vec::new()) } else { (!labels.is_empty()).then_some(labels) };
            (cluster_update(&id, name, description, labels, &expected, &common), common.json)
        }
        ClustersCommand::Delete { id, expected, confirm, common } => (cluster_delete(&id, &expected, &confirm, &common), common.json),
        ClustersCommand::Runtime { id, common } => (cluster_runtime(&id, &common), common.json),
        ClustersCommand::SetPhase { id, phase, expected_generation, common } => {
            (cluster_set_phase(&id, phase, expected_generation, &common), common.json)
        }
    };
    finish(result, json)
}

fn labels_text(value: &Value) -> String {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            map.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(",")
        }
        _ => "-".into(),
    }
}

fn cluster_list(page: &Page, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let answer = client.call("clusters.list", &Value::Object(page.body()))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = items(&answer)
        .iter()
        .map(|c| {
            vec![
                text(c, "id").into(),
                text(c, "name").into(),
                number(c, "revision"),
                labels_text(&c["labels"]),
                text(c, "description").into(),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("no clusters");
    } else {
        print_table(&["ID", "NAME", "REVISION", "LABELS", "DESCRIPTION"], &rows);
    }
    print_more(&answer);
    Ok(())
}

fn print_cluster(c: &Value) {
    println!("cluster:      {} ({})", text(c, "name"), text(c, "id"));
    println!("revision:     {}", number(c, "revision"));
    println!("machine user: {}", text(c, "machineUserId"));
    if let Some(description) = c["description"].as_str().filter(|d| !d.is_empty()) {
        println!("description:  {}", description.replace('\n', "\n              "));
    }
    println!("labels:       {}", labels_text(&c["labels"]));
    println!("created:      {}", utc(c["createdAt"].as_u64()));
    println!("updated:      {}", utc(c["updatedAt"].as_u64()));
    print_facets(c);
}

fn cluster_get(id: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let id = &resolve::cluster(&client, id)?;
    let c = client.call("clusters.get", &json!({ "id": id }))?;
    if common.json {
        print_json(&c);
        return Ok(());
    }
    print_cluster(&c);
    Ok(())
}

fn cluster_create(name: &str, description: Option<String>, labels: &[(String, String)], common: &Common) -> Result<()> {
    let mut body = Map::new();
    body.insert("name".into(), json!(name));
    insert(&mut body, "description", description);
    if !labels.is_empty() {
        body.insert("labels".into(), pairs_object("--label", labels)?);
    }
    let client = Client::new(&common.connection)?;
    let answer = client.call("clusters.create", &Value::Object(body))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let (c, runtime, machine) = (&answer["cluster"], &answer["runtime"], &answer["machineUser"]);
    println!("created cluster {} ({}), revision {}", text(c, "name"), text(c, "id"), number(c, "revision"));
    println!("  runtime phase: {} (generation {})", text(runtime, "phase"), number(runtime, "generation"));
    println!("  machine user:  {} ({})", text(machine, "username"), text(machine, "userId"));
    println!("  token:         {}", text(machine, "token"));
    println!("The token is shown this once: Capstan keeps only its SHA-256. Store it now for the cluster's agents.");
    Ok(())
}

fn cluster_update(
    id: &str,
    name: Option<String>,
    description: Option<String>,
    labels: Option<Vec<(String, String)>>,
    expected: &Expected,
    common: &Common,
) -> Result<()> {
    if name.is_none() && description.is_none() && labels.is_none() {
        return Err(nothing_to_change("--name, --description, --label or --clear-labels"));
    }
    let mut body = Map::new();
    insert(&mut body, "name", name);
    insert(&mut body, "description", description);
    if let Some(labels) = &labels {
        body.insert("labels".into(), pairs_object("--label", labels)?);
    }
    let client = Client::new(&common.connection)?;
    let id = &resolve::cluster(&client, id)?;
    let revision = client.expected_or_current(expected.expected_revision, "clusters.get", &json!({ "id": id }), "revision")?;
    body.insert("id".into(), json!(id));
    body.insert("expectedRevision".into(), json!(revision));
    let c = client.call("clusters.update", &Value::Object(body))?;
    if common.json {
        print_json(&c);
        return Ok(());
    }
    print_written("cluster", &c, revision);
    Ok(())
}

fn cluster_delete(id: &str, expected: &Expected, confirm: &Confirm, common: &Common) -> Result<()> {
    can_confirm(confirm)?;
    let client = Client::new(&common.connection)?;
    let id = &resolve::cluster(&client, id)?;
    ask(confirm, || {
        let c = client.call("clusters.get", &json!({ "id": id }))?;
        Ok(format!("Delete cluster {} ({id}) with its machine user and runtime phase for good?", text(&c, "name")))
    })?;
    let revision = client.expected_or_current(expected.expected_revision, "clusters.get", &json!({ "id": id }), "revision")?;
    let answer = client.call("clusters.delete", &json!({ "id": id, "expectedRevision": revision }))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    println!("deleted cluster {} with its machine user {} and runtime phase", text(&answer, "id"), text(&answer, "machineUserId"));
    Ok(())
}

fn print_runtime(r: &Value) {
    println!(
        "cluster {}: phase {}, generation {} (set {} by {})",
        text(r, "clusterId"),
        text(r, "phase"),
        number(r, "generation"),
        utc(r["updatedAt"].as_u64()),
        text(r, "updatedBy")
    );
}

fn cluster_runtime(id: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let id = &resolve::cluster(&client, id)?;
    let r = client.call("clusters.getRuntime", &json!({ "id": id }))?;
    if common.json {
        print_json(&r);
        return Ok(());
    }
    print_runtime(&r);
    Ok(())
}

fn cluster_set_phase(id: &str, phase: PhaseArg, expected: Option<u64>, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let id = &resolve::cluster(&client, id)?;
    let generation = client.expected_or_current(expected, "clusters.getRuntime", &json!({ "id": id }), "generation")?;
    let r = client.call("clusters.setRuntimePhase", &json!({ "id": id, "phase": phase.as_str(), "expectedGeneration": generation }))?;
    if common.json {
        print_json(&r);
        return Ok(());
    }
    if r["generation"].as_u64() == Some(generation) {
        println!("cluster {id} is already in phase {}; nothing changed (generation {generation})", text(&r, "phase"));
    } else {
        print_runtime(&r);
    }
    Ok(())
}

// ---- services ----

/// The fields `services create` and `services update` share.
#[derive(clap::Args)]
pub struct ServiceFields {
    /// A port, [PUBLISHED:]TARGET[/PROTOCOL]: the container's TARGET port speaking PROTOCOL
    /// (tcp, udp or http; default tcp), published on the node's PUBLISHED port if given, e.g.
    /// 443:8080/http (docs/inventory.md, "Ports"); repeat for more
    #[arg(long = "port", value_name = "[PUBLISHED:]TARGET[/PROTOCOL]", value_parser = parse_port)]
    ports: Vec<Value>,
    /// A domain the service answers on (app.example.com or *.example.com); repeat for more
    #[arg(long = "domain", value_name = "DOMAIN")]
    domains: Vec<String>,
    /// An environment variable KEY=VALUE, passed as given; repeat for more. Plain
    /// configuration only: a credential-like name or value is refused
    /// `environment-value-is-secret` (secrets hold those)
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_pair)]
    environment: Vec<(String, String)>,
    /// Replicas, 0–64 (create: default 1)
    #[arg(long, value_name = "N")]
    scale: Option<u32>,
    /// A volume NAME:/MOUNT/PATH; repeat for more
    #[arg(long = "volume", value_name = "NAME:/PATH", value_parser = parse_volume)]
    volumes: Vec<Value>,
    /// The database the service keeps in one of its volumes, ENGINE:VOLUME/PATH (sqlite only),
    /// e.g. sqlite:data/db/app.sqlite: its backups carry it as a consistent copy (docs/backups.md)
    #[arg(long, value_name = "sqlite:VOLUME/PATH", value_parser = parse_database)]
    database: Option<Value>,
    /// A mail address of the service (app@example.com); repeat for more
    #[arg(long = "mail", value_name = "ADDRESS")]
    mail_addresses: Vec<String>,
}

impl ServiceFields {
    /// The fields given, as the API names them; `clear` empties lists and maps.
    fn into_body(self, body: &mut Map<String, Value>, clear: &[ClearArg]) -> Result<()> {
        let given: [(ClearArg, &str, bool); 6] = [
            (ClearArg::Ports, "--port", !self.ports.is_empty()),
            (ClearArg::Domains, "--domain", !self.domains.is_empty()),
            (ClearArg::Env, "--env", !self.environment.is_empty()),
            (ClearArg::Volumes, "--volume", !self.volumes.is_empty()),
            (ClearArg::Mail, "--mail", !self.mail_addresses.is_empty()),
            (ClearArg::Database, "--database", self.database.is_some()),
        ];
        for (field, flag, present) in given {
            if present && clear.contains(&field) {
                return Err(Refusal::new("argument-invalid", format!("{flag} and --clear {} contradict each other", field.name())));
            }
        }
        for field in clear {
            let empty = match field {
                ClearArg::Env => json!({}),
                ClearArg::Database => Value::Null,
                _ => json!([]),
            };
            body.insert(field.api_name().into(), empty);
        }
        if !self.ports.is_empty() {
            body.insert("ports".into(), Value::Array(self.ports));
        }
        if !self.domains.is_empty() {
            body.insert("domains".into(), json!(self.domains));
        }
        if !self.environment.is_empty() {
            body.insert("environment".into(), pairs_object("--env", &self.environment)?);
        }
        insert(body, "scale", self.scale);
        if !self.volumes.is_empty() {
            body.insert("volumes".into(), Value::Array(self.volumes));
        }
        if !self.mail_addresses.is_empty() {
            body.insert("mailAddresses".into(), json!(self.mail_addresses));
        }
        if let Some(database) = self.database {
            body.insert("database".into(), database);
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClearArg {
    Ports,
    Domains,
    Env,
    Volumes,
    Mail,
    Database,
}

impl ClearArg {
    fn name(self) -> &'static str {
        match self {
            ClearArg::Ports => "ports",
            ClearArg::Domains => "domains",
            ClearArg::Env => "env",
            ClearArg::Volumes => "volumes",
            ClearArg::Mail => "mail",
            ClearArg::Database => "database",
        }
    }

    fn api_name(self) -> &'static str {
        match self {
            ClearArg::Env => "environment",
            ClearArg::Mail => "mailAddresses",
            other => other.name(),
        }
    }
}

#[derive(Subcommand)]
pub enum ServicesCommand {
    /// Services, paged (`services.list`). Name the organization with --organization (its
    /// members); an administrator may leave it out to list every service.
    List {
        /// The organization whose services to list
        #[arg(long, value_name = "NAME|ID")]
        organization: Option<String>,
        #[command(flatten)]
        page: Page,
        #[command(flatten)]
        common: Common,
    },
    /// One service with what still holds it (`services.get`).
    Get {
        /// The service's name or id (`svc_…`)
        id: String,
        /// The organization (name or id) to look a service name up in; without it the name is
        /// looked up among every service you can see, and refused `service-ambiguous` when two
        /// organizations have one so named
        #[arg(long, value_name = "NAME|ID")]
        organization: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Create a service in an organization (`services.create`; its owners and administrators).
    ///
    /// Every field is checked and a mistake is refused by name (`name-invalid`,
    /// `image-invalid`, `port-invalid`, `domain-invalid`, `environment-value-is-secret`, …).
    /// Example: capstan services create --organization org_… --name web --image
    /// ghcr.io/acme/web:1.0 --port 443:8080/http --domain web.acme.example --env LOG_LEVEL=info
    Create {
        /// The organization the service belongs to
        #[arg(long, value_name = "NAME|ID")]
        organization: String,
        /// The service's name (1–63 of a-z 0-9 -, starting with a letter; unique in the organization)
        #[arg(long)]
        name: String,
        /// The image, an OCI reference such as ghcr.io/acme/web:1.0
        #[arg(long)]
        image: String,
        #[command(flatten)]
        fields: ServiceFields,
        #[command(flatten)]
        common: Common,
    },
    /// Change a service (`services.update`; its owners and administrators).
    ///
    /// Only the fields given change. A list or map given is replaced whole, as the API does:
    /// --port, --domain, --env, --volume and --mail flags become the service's complete list
    /// (give every one to keep), and --clear FIELD empties one. A service being deleted is
    /// refused `service-deleting`.
    Update {
        /// The service's name or id
        id: String,
        /// The organization (name or id) to look a service name up in; without it the name is
        /// looked up among every service you can see, and refused `service-ambiguous` when two
        /// organizations have one so named
        #[arg(long, value_name = "NAME|ID")]
        organization: Option<String>,
        /// A new name
        #[arg(long)]
        name: Option<String>,
        /// A new image
        #[arg(long)]
        image: Option<String>,
        #[command(flatten)]
        fields: ServiceFields,
        /// Empty this list (or the environment); repeat for more
        #[arg(long, value_enum, value_name = "FIELD")]
        clear: Vec<ClearArg>,
        #[command(flatten)]
        expected: Expected,
        #[command(flatten)]
        common: Common,
    },
    /// Delete a service (`services.delete`; its owners and administrators).
    ///
    /// Deletion has two phases: the service is marked `deleting` at once (it takes no new work)
    /// and is removed when no manager holds it any more. The answer says `deleted`, or
    /// `deleting` with the managers it waits for; `capstan services get` shows them until then.
    ///
    /// Asks on a terminal ([y/N]); refused `confirmation-required` without --yes when standard
    /// input is not a terminal.
    Delete {
        /// The service's name or id
        id: String,
        /// The organization (name or id) to look a service name up in; without it the name is
        /// looked up among every service you can see, and refused `service-ambiguous` when two
        /// organizations have one so named
        #[arg(long, value_name = "NAME|ID")]
        organization: Option<String>,
        #[command(flatten)]
        expected: Expected,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
    /// Run a service on a cluster: write its runtime spec there (`runtime.setServiceSpec`; its
    /// owners and administrators; docs/runtime.md).
    ///
    /// Reads the spec the service has on the cluster and writes against its revision (none:
    /// a first spec), so you never type a revision; a change in between is refused `conflict`.
    /// The flags state the whole spec: one left out takes its default (every active node, 1
    /// replica per node, restart on-failure, no health check), not what was stored, and what
    /// it replaced is printed. Cluster and node names are looked up by administrators; anyone
    /// else gives ids (cluster_…, node_…).
    ///
    /// Refusals: `cluster-runtime-missing`, `cluster-runtime-phase-refused` (a swarm cluster),
    /// `node-not-in-cluster`, `replica-limit`, `health-port-undeclared`,
    /// `service-deleting`, `conflict`. An image named by tag runs as the digest its registry
    /// names when the runtime first plans it; until that is known, `capstan services status`
    /// says `refused (image-plan-missing)` and why.
    ///
    /// Example: capstan services run web --cluster eu-1 --node alpha --node beta --replicas 2
    /// --health http:8080/healthz
    Run(super::service_runtime::RunArgs),
    /// Stop a service on a cluster, keeping its spec: the spec is written held (`hold: true`),
    /// every replica stops (`runtime.setServiceSpec`; its owners and administrators).
    ///
    /// Reads the spec and writes it back held against the revision read; a spec already held
    /// is left as it is. `capstan services run` runs it again.
    ///
    /// Example: capstan services stop web --cluster eu-1
    Stop(super::service_runtime::StopArgs),
    /// Where a service runs (`runtime.getServiceStatus`; its members): per cluster its spec,
    /// the verdict — converged, converging, waiting (reason) or refused (reason) — and each
    /// replica slot's node, phase, readiness, image digest, restarts and last cause in the
    /// node's words.
    ///
    /// The verdict is decided by the runtime every few seconds; a spec just written shows none
    /// until then. --watch reads it again every 2 seconds until interrupted; -o json|yaml
    /// prints the method's answer as it is.
    ///
    /// Example: capstan services status web --org acme --watch
    Status(super::service_runtime::StatusArgs),
    /// A service's replica logs, interleaved and prefixed with their replica
    /// (`runtime.getLogAttempts`, `runtime.getLogs`; members of its organization).
    ///
    /// Each replica's newest attempt, every loss stated in its place. Examples: capstan
    /// services logs web --tail 100; capstan services logs web -f --replica node_….0
    Logs(super::service_logs::LogsArgs),
    /// What the runtime decided for a service and what its nodes said, in order and in words
    /// (`runtime.getServiceEvents`): scheduled, pulling, ready, health failing, restarted after
    /// its backoff, replaced by a rollout, stopped, removed. `-f` follows.
    Events(super::service_events::EventsArgs),
}

pub fn services(command: ServicesCommand) -> ExitCode {
    let (result, json) = match command {
        ServicesCommand::List { organization, page, common } => (service_list(organization, &page, &common), common.json),
        ServicesCommand::Get { id, organization, common } => (service_get(&id, organization.as_deref(), &common), common.json),
        ServicesCommand::Create { organization, name, image, fields, common } => {
            let json = common.json;
            (service_create(organization, name, image, fields, &common), json)
        }
        ServicesCommand::Update { id, organization, name, image, fields, clear, expected, common } => {
            let json = common.json;
            let service = (id.as_str(), organization.as_deref());
            (service_update(service, name, image, fields, &clear, &expected, &common), json)
        }
        ServicesCommand::Delete { id, organization, expected, confirm, common } => {
            (service_delete((&id, organization.as_deref()), &expected, &confirm, &common), common.json)
        }
        ServicesCommand::Run(args) => (super::service_runtime::run(&args), args.common.json),
        ServicesCommand::Stop(args) => (super::service_runtime::stop(&args), args.common.json),
        ServicesCommand::Status(args) => (super::service_runtime::status(&args), args.common.json),
        ServicesCommand::Logs(args) => (super::service_logs::logs(&args), args.common.json),
        ServicesCommand::Events(args) => (super::service_events::events(&args), args.common.json),
    };
    finish(result, json)
}

fn service_list(organization: Option<String>, page: &Page, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let mut body = page.body();
    insert(&mut body, "organizationId", resolve::organization_opt(&client, organization.as_deref())?);
    let answer = client.call("services.list", &Value::Object(body))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let organizations = Names::organizations(&client);
    let rows: Vec<Vec<String>> = items(&answer)
        .iter()
        .map(|s| {
            vec![
                text(s, "id").into(),
                text(s, "name").into(),
                organizations.show(text(s, "organizationId")),
                text(s, "state").into(),
                number(s, "scale"),
                text(s, "image").into(),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("no services");
    } else {
        print_table(&["ID", "NAME", "ORGANIZATION", "STATE", "SCALE", "IMAGE"], &rows);
    }
    print_more(&answer);
    Ok(())
}

fn print_service(s: &Value, organizations: &Names) {
    let list = |key: &str, show: &dyn Fn(&Value) -> String| {
        let shown: Vec<String> = s[key].as_array().map(|a| a.iter().map(show).collect()).unwrap_or_default();
        if shown.is_empty() { "-".to_string() } else { shown.join(", ") }
    };
    println!("service:      {} ({})", text(s, "name"), text(s, "id"));
    let organization = text(s, "organizationId");
    match organizations.show(organization) {
        name if name != organization => println!("organization: {name} ({organization})"),
        _ => println!("organization: {organization}"),
    }
    println!("state:        {}", text(s, "state"));
    println!("revision:     {}", number(s, "revision"));
    println!("image:        {}", text(s, "image"));
    if s["release"].is_object() {
        let release = &s["release"];
        println!("  release:    {} {} (operation {})", text(release, "tag"), text(release, "digest"), text(release, "operationId"));
    }
    if s["registryPush"].is_object() {
        let pushed = &s["registryPush"];
        println!("  pushed:     {} {}", text(pushed, "tag"), text(pushed, "digest"));
    }
    println!("scale:        {}", number(s, "scale"));
    println!("ports:        {}", list("ports", &port::format));
    println!("domains:      {}", list("domains", &|d| d.as_str().unwrap_or("?").to_string()));
    println!("volumes:      {}", list("volumes", &|v| format!("{}:{}", text(v, "name"), text(v, "mountPath"))));
    println!("mail addresses: {}", list("mailAddresses", &|m| m.as_str().unwrap_or("?").to_string()));
    if s["database"].is_object() {
        let db = &s["database"];
        println!("database:     {} {}/{}", text(db, "engine"), text(db, "volume"), text(db, "path"));
    }
    print_facets(s);
    match s["environment"].as_object() {
        Some(env) if !env.is_empty() => {
            println!("environment:");
            for (key, value) in env {
                println!("  {key}={}", value.as_str().unwrap_or_default());
            }
        }
        _ => println!("environment:  -"),
    }
    if s["template"].is_object() {
        println!("template:     {}", s["template"]);
    }
    if let Some(holds) = s["holds"].as_array().filter(|h| !h.is_empty()) {
        let holds: Vec<&str> = holds.iter().filter_map(Value::as_str).collect();
        println!("held by:      {}", holds.join(", "));
    }
    println!("created:      {}", utc(s["createdAt"].as_u64()));
    println!("updated:      {}", utc(s["updatedAt"].as_u64()));
}

fn service_get(id: &str, organization: Option<&str>, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let id = resolve::service(&client, id, organization)?;
    let s = client.call("services.get", &json!({ "id": id }))?;
    if common.json {
        print_json(&s);
        return Ok(());
    }
    print_service(&s, &Names::organizations(&client));
    Ok(())
}

fn service_create(organization: String, name: String, image: String, fields: ServiceFields, common: &Common) -> Result<()> {
    let mut body = Map::new();
    body.insert("name".into(), json!(name));
    body.insert("image".into(), json!(image));
    fields.into_body(&mut body, &[])?;
    let client = Client::new(&common.connection)?;
    let organization_id = resolve::organization(&client, &organization)?;
    body.insert("organizationId".into(), json!(organization_id));
    let s = client.call("services.create", &Value::Object(body))?;
    if common.json {
        print_json(&s);
        return Ok(());
    }
    println!(
        "created service {} ({}) in {}, revision {}",
        text(&s, "name"),
        text(&s, "id"),
        Names::organizations(&client).show(text(&s, "organizationId")),
        number(&s, "revision")
    );
    Ok(())
}

fn service_update(
    (id, organization): (&str, Option<&str>),
    name: Option<String>,
    image: Option<String>,
    fields: ServiceFields,
    clear: &[ClearArg],
    expected: &Expected,
    common: &Common,
) -> Result<()> {
    let mut body = Map::new();
    insert(&mut body, "name", name);
    insert(&mut body, "image", image);
    fields.into_body(&mut body, clear)?;
    if body.is_empty() {
        return Err(nothing_to_change("--name, --image, --port, --domain, --env, --scale, --volume, --mail or --clear"));
    }
    let client = Client::new(&common.connection)?;
    let id = &resolve::service(&client, id, organization)?;
    let revision = client.expected_or_current(expected.expected_revision, "services.get", &json!({ "id": id }), "revision")?;
    body.insert("id".into(), json!(id));
    body.insert("expectedRevision".into(), json!(revision));
    let s = client.call("services.update", &Value::Object(body))?;
    if common.json {
        print_json(&s);
        return Ok(());
    }
    print_written("service", &s, revision);
    Ok(())
}

fn service_delete((id, organization): (&str, Option<&str>), expected: &Expected, confirm: &Confirm, common: &Common) -> Result<()> {
    can_confirm(confirm)?;
    let client = Client::new(&common.connection)?;
    let id = &resolve::service(&client, id, organization)?;
    ask(confirm, || {
        let s = client.call("services.get", &json!({ "id": id }))?;
        let organization = Names::organizations(&client).show(text(&s, "organizationId"));
        Ok(format!("Delete service {} of {organization} ({id})? It takes no new work from now on.", text(&s, "name")))
    })?;
    let revision = client.expected_or_current(expected.expected_revision, "services.get", &json!({ "id": id }), "revision")?;
    let answer = client.call("services.delete", &json!({ "id": id, "expectedRevision": revision }))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let waiting: Vec<&str> = answer["waitingFor"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    match answer["state"].as_str() {
        Some("deleted") => println!("deleted service {}", text(&answer, "id")),
        _ => {
            println!(
                "service {} is deleting: it takes no new work and is removed once every manager holding it lets go",
                text(&answer, "id")
            );
            println!("  waiting for: {}", if waiting.is_empty() { "-".to_string() } else { waiting.join(", ") });
        }
    }
    Ok(())
}

// ---- settings ----

#[derive(Subcommand)]
pub enum SettingsCommand {
    /// The public settings, their revision and every key Capstan accepts (`settings.get`).
    Get {
        #[command(flatten)]
        common: Common,
    },
    /// Set public settings (`settings.update`; administrators).
    ///
    /// Each VALUE is JSON (443, true, ["https://a.example/c.json"], {"bucket":"b"}); a VALUE
    /// that is not JSON is taken as a string, so mail.submissionHost=smtp.example.com works
    /// unquoted. Only known keys are accepted (`setting-unknown`; `capstan settings get` lists
    /// them) and a credential is refused `setting-is-secret`: those are system secrets.
    Set {
        /// KEY=VALUE; give several to set them in one write
        #[arg(value_name = "KEY=VALUE", required = true, value_parser = parse_setting)]
        pairs: Vec<(String, Value)>,
        #[command(flatten)]
        expected: Expected,
        #[command(flatten)]
        common: Common,
    },
    /// Remove public settings (`settings.update`; administrators).
    Unset {
        /// The keys to remove
        #[arg(value_name = "KEY", required = true)]
        keys: Vec<String>,
        #[command(flatten)]
        expected: Expected,
        #[command(flatten)]
        common: Common,
    },
}

pub fn settings(command: SettingsCommand) -> ExitCode {
    let (result, json) = match command {
        SettingsCommand::Get { common } => (settings_get(&common), common.json),
        SettingsCommand::Set { pairs, expected, common } => {
            let set = pairs.into_iter().collect::<Map<String, Value>>();
            (settings_update(json!({ "set": set }), &expected, &common), common.json)
        }
        SettingsCommand::Unset { keys, expected, common } => (settings_update(json!({ "unset": keys }), &expected, &common), common.json),
    };
    finish(result, json)
}

fn print_settings(view: &Value) {
    println!("revision: {}", number(view, "revision"));
    match view["settings"].as_object() {
        Some(settings) if !settings.is_empty() => {
            for (key, value) in settings {
                println!("  {key} = {value}");
            }
        }
        _ => println!("  (nothing set)"),
    }
}

fn settings_get(common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let view = client.call("settings.get", &json!({}))?;
    if common.json {
        print_json(&view);
        return Ok(());
    }
    print_settings(&view);
    println!("known settings:");
    let known: Vec<&Value> = view["known"].as_array().into_iter().flatten().collect();
    let width = known.iter().map(|k| text(k, "key").chars().count()).max().unwrap_or(0);
    for k in known {
        println!("  {:<width$}  {}", text(k, "key"), text(k, "summary"));
    }
    Ok(())
}

fn settings_update(mut body: Value, expected: &Expected, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let revision = client.expected_or_current(expected.expected_revision, "settings.get", &json!({}), "revision")?;
    body["expectedRevision"] = json!(revision);
    let view = client.call("settings.update", &body)?;
    if common.json {
        print_json(&view);
        return Ok(());
    }
    if view["revision"].as_u64() == Some(revision) {
        println!("nothing changed");
    }
    print_settings(&view);
    Ok(())
}

// ---- users ----

#[derive(Subcommand)]
pub enum UsersCommand {
    /// Create a person's account with a generated password (`admin.createUser`; administrators
    /// with a login from the last 5 minutes).
    ///
    /// The password is printed once, on standard output; Capstan keeps only a verifier, so it
    /// cannot be shown again. The person logs in with `capstan login --username NAME`.
    /// --admin makes an infrastructure administrator; organization roles are given with
    /// `capstan organizations set-member`.
    Create {
        /// The username (1–64 of A-Z a-z 0-9 - _ . @, starting with a letter or digit)
        username: String,
        /// Make the person an infrastructure administrator
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        common: Common,
    },
}

pub fn users(command: UsersCommand) -> ExitCode {
    let UsersCommand::Create { username, admin, common } = command;
    finish(user_create(&username, admin, &common), common.json)
}

fn user_create(username: &str, admin: bool, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let answer = client.call("admin.createUser", &json!({ "username": username, "admin": admin })).map_err(|mut refusal| {
        if refusal.is("admin-not-fresh") {
            refusal.message = format!("{} (run `capstan login --url {}` and try again)", refusal.message, client.url());
        }
        refusal
    })?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let role = if answer["admin"].as_bool() == Some(true) { " (administrator)" } else { "" };
    println!("created user {}{role} ({})", text(&answer, "username"), text(&answer, "userId"));
    println!("password: {}", text(&answer, "password"));
    println!("The password is shown this once: Capstan keeps only a verifier. Hand it over privately.");
    Ok(())
}

// ---- helpers ----

/// Insert `value` under `key` when it is given.
fn insert<T: serde::Serialize>(body: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(value) = value {
        body.insert(key.into(), json!(value));
    }
}

fn number(value: &Value, key: &str) -> String {
    value[key].as_u64().map_or_else(|| "?".into(), |n| n.to_string())
}

/// Under a page that has more, the cursor of the next one.
fn print_more(answer: &Value) {
    if let Some(cursor) = answer["nextCursor"].as_str() {
        println!("more: --cursor {cursor}");
    }
}

/// The answer to an update for people: what changed, or that nothing did.
fn print_written(kind: &str, entity: &Value, read: u64) {
    if entity["revision"].as_u64() == Some(read) {
        println!("{kind} {} ({}) already was so; nothing changed (revision {read})", text(entity, "name"), text(entity, "id"));
    } else {
        println!("updated {kind} {} ({}), revision {}", text(entity, "name"), text(entity, "id"), number(entity, "revision"));
    }
}

fn nothing_to_change(flags: &str) -> Refusal {
    Refusal::new("nothing-to-change", format!("name what to change: {flags} (see --help)"))
}

/// KEY=VALUE pairs as a JSON object, refusing a key given twice.
fn pairs_object(flag: &str, pairs: &[(String, String)]) -> Result<Value> {
    let mut map = BTreeMap::new();
    for (key, value) in pairs {
        if map.insert(key.clone(), value.clone()).is_some() {
            let shown: String = key.chars().take(64).collect();
            return Err(Refusal::new("argument-invalid", format!("{flag} {shown} is given twice")));
        }
    }
    Ok(json!(map))
}

/// `KEY=VALUE` (the value may be empty and may hold `=`).
fn parse_pair(text: &str) -> std::result::Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err("expected KEY=VALUE".into()),
    }
}

/// `KEY=VALUE` with VALUE as JSON, or as a string when it is not JSON.
fn parse_setting(text: &str) -> std::result::Result<(String, Value), String> {
    let (key, value) = text.split_once('=').filter(|(k, _)| !k.is_empty()).ok_or("expected KEY=VALUE")?;
    let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()));
    Ok((key.to_string(), value))
}

/// A `--port` written the one way (`443:8080/http`, docs/inventory.md "Ports") as the API's port
/// object; the former `8080/http:443` order is refused `port-syntax-old` naming the new form.
fn parse_port(text: &str) -> std::result::Result<Value, String> {
    port::parse("--port", text).map(|spec| spec.to_json()).map_err(|refusal| format!("{} ({})", refusal.message, refusal.code))
}

/// `NAME:/MOUNT/PATH` as the API's volume object.
fn parse_volume(text: &str) -> std::result::Result<Value, String> {
    match text.split_once(':') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok(json!({ "name": name, "mountPath": path })),
        _ => Err("expected NAME:/MOUNT/PATH".into()),
    }
}

fn parse_database(text: &str) -> std::result::Result<Value, String> {
    let expected = || "expected ENGINE:VOLUME/PATH, e.g. sqlite:data/db/app.sqlite".to_string();
    let (engine, rest) = text.split_once(':').ok_or_else(expected)?;
    match rest.split_once('/') {
        Some((volume, path)) if !engine.is_empty() && !volume.is_empty() && !path.is_empty() => {
            Ok(json!({ "engine": engine, "volume": volume, "path": path }))
        }
        _ => Err(expected()),
    }
}

/// The records managers keep on an entity (`facets`), each under its plugin's id, one line per
/// value: `  <plugin>  <path>: <value>`. What a record means is its plugin's to say; this
/// prints any.
fn print_facets(entity: &Value) {
    for (plugin, facet) in entity["facets"].as_object().into_iter().flatten() {
        let mut lines = Vec::new();
        facet_lines(facet, "", &mut lines);
        println!("facet {plugin}:");
        for line in lines {
            println!("  {line}");
        }
    }
}

/// `value`'s leaves as `path: value` lines (`bindings[0].address: web@acme.example`).
fn facet_lines(value: &Value, path: &str, out: &mut Vec<String>) {
    let at = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match value {
        Value::Object(map) if !map.is_empty() => map.iter().for_each(|(k, v)| facet_lines(v, &at(k), out)),
        Value::Array(items) if !items.is_empty() => {
            items.iter().enumerate().for_each(|(i, v)| facet_lines(v, &format!("{path}[{i}]"), out))
        }
        Value::String(text) => out.push(format!("{path}: {text}")),
        other => out.push(format!("{path}: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_reads_as_the_api_takes_it() {
        assert_eq!(
            parse_database("sqlite:data/db/app.sqlite").unwrap(),
            json!({"engine": "sqlite", "volume": "data", "path": "db/app.sqlite"})
        );
        for bad in ["", "sqlite", "sqlite:data", "sqlite:data/", ":data/app.db", "sqlite:/app.db"] {
            assert!(parse_database(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ports_read_as_the_api_takes_them() {
        assert_eq!(parse_port("443:8080/http").unwrap(), json!({"port": 8080, "protocol": "http", "publicPort": 443}));
        assert_eq!(parse_port("53/udp").unwrap(), json!({"port": 53, "protocol": "udp"}));
        assert_eq!(parse_port("5432").unwrap(), json!({"port": 5432, "protocol": "tcp"}));
        assert_eq!(parse_port("2525:25").unwrap(), json!({"port": 25, "protocol": "tcp", "publicPort": 2525}));
        for bad in ["", "http", "80/sctp", "70000/tcp"] {
            assert!(parse_port(bad).unwrap_err().contains("(port-invalid)"), "{bad}");
        }
        let old = parse_port("8080/http:443").unwrap_err();
        assert!(old.contains("(port-syntax-old)") && old.contains("write 443:8080/http"), "{old}");
    }

    #[test]
    fn pairs_volumes_and_settings() {
        assert_eq!(parse_pair("URL=postgres://db/x?a=b").unwrap(), ("URL".into(), "postgres://db/x?a=b".into()));
        assert_eq!(parse_pair("EMPTY=").unwrap(), ("EMPTY".into(), String::new()));
        assert!(parse_pair("=x").is_err() && parse_pair("novalue").is_err());
        assert_eq!(parse_volume("data:/var/lib/app").unwrap(), json!({"name": "data", "mountPath": "/var/lib/app"}));
        assert!(parse_volume("data").is_err() && parse_volume(":/x").is_err());
        assert_eq!(parse_setting("deploymentArchiveRetentionDays=30").unwrap(), ("deploymentArchiveRetentionDays".into(), json!(30)));
        assert_eq!(parse_setting("mail.submissionHost=smtp.example.com").unwrap().1, json!("smtp.example.com"));
        assert_eq!(
            parse_setting(r#"appstore.catalogSources=["https://c.example/a.json"]"#).unwrap().1,
            json!(["https://c.example/a.json"])
        );
        let twice = pairs_object("--env", &[("A".into(), "1".into()), ("A".into(), "2".into())]).unwrap_err();
        assert_eq!(twice.code, "argument-invalid");
    }

    #[test]
    fn update_fields_replace_or_clear() {
        let fields = ServiceFields {
            ports: vec![json!({"port": 80, "protocol": "http"})],
            domains: vec![],
            environment: vec![("LOG_LEVEL".into(), "debug".into())],
            scale: Some(2),
            volumes: vec![],
            database: None,
            mail_addresses: vec![],
        };
        let mut body = Map::new();
        fields.into_body(&mut body, &[ClearArg::Domains, ClearArg::Mail, ClearArg::Database]).unwrap();
        assert_eq!(
            Value::Object(body),
            json!({
                "ports": [{"port": 80, "protocol": "http"}],
                "domains": [],
                "mailAddresses": [],
                "database": null,
                "environment": {"LOG_LEVEL": "debug"},
                "scale": 2,
            })
        );
        let fields = ServiceFields {
            ports: vec![],
            domains: vec![],
            environment: vec![("A".into(), "1".into())],
            scale: None,
            volumes: vec![],
            database: None,
            mail_addresses: vec![],
        };
        assert_eq!(fields.into_body(&mut Map::new(), &[ClearArg::Env]).unwrap_err().code, "argument-invalid");
    }

    #[test]
    fn a_facet_prints_as_one_line_per_value() {
        let facet = json!({ "bindings": [{ "address": "web@acme.example", "inbound": { "port": 30025 }, "retired": false }], "note": "" });
        let mut lines = Vec::new();
        super::facet_lines(&facet, "", &mut lines);
        assert_eq!(
            lines,
            ["bindings[0].address: web@acme.example", "bindings[0].inbound.port: 30025", "bindings[0].retired: false", "note: "]
        );
    }
}
