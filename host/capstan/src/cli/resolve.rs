//! Names or ids: every argument that names an organization, cluster, service, user, plugin or
//! task takes its name (within its scope) or its id, and this is the one place that turns
//! either into the id the API wants — through the API's own list methods, as any client would.
//!
//! - An id (`org_…`, `cluster_…`, `svc_…`, `user_…`, `machine_…`, `node_…` and 32 hex digits)
//!   is used as it is: the method it goes to answers `<entity>-not-found` itself. A name never
//!   looks like one (names are a-z 0-9 -; a username that does is still found by name when no
//!   id matches).
//! - A name is looked up in the listing of its scope: a service within its organization
//!   (`--organization NAME|ID`), or among every service the caller can see when none is given.
//! - No match is `<entity>-not-found` naming what was looked for; more than one is
//!   `<entity>-ambiguous` listing each with its id (and, for a service, its organization), so
//!   the operator can give the id or the scope.
//!
//! [`Names`] is the other direction, for list outputs: the names of the organizations and
//! clusters a listing shows by id.

use super::client::{Client, text};
use crate::refusal::{Refusal, Result};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The largest page asked for while looking a name up.
const PAGE: usize = 100;
/// At most this many pages are read looking for a name (then the lookup stops, as not found).
const MAX_PAGES: usize = 100;

/// What an argument names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `org_…`
    Organization,
    /// `cluster_…`
    Cluster,
    /// `svc_…`
    Service,
    /// `user_…` (a person) or `machine_…`
    User,
    /// A plugin's id (`appstore`) or its name (`App Store`).
    Plugin,
    /// A task's id (`host.cleanup`) or its title.
    Task,
    /// `node_…`, or a node's name or hostname within its cluster.
    Node,
}

impl Kind {
    /// The entity's word in refusal codes and messages.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Organization => "organization",
            Kind::Cluster => "cluster",
            Kind::Service => "service",
            Kind::User => "user",
            Kind::Plugin => "plugin",
            Kind::Task => "task",
            Kind::Node => "node",
        }
    }

    fn id_prefixes(self) -> &'static [&'static str] {
        match self {
            Kind::Organization => &["org_"],
            Kind::Cluster => &["cluster_"],
            Kind::Service => &["svc_"],
            Kind::User => &["user_", "machine_"],
            Kind::Node => &["node_"],
            Kind::Plugin | Kind::Task => &[],
        }
    }

    /// Whether `text` has the shape of this entity's ids.
    pub fn is_id(self, text: &str) -> bool {
        self.id_prefixes()
            .iter()
            .filter_map(|prefix| text.strip_prefix(prefix))
            .any(|rest| rest.len() == 32 && rest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    }
}

/// One thing a name may stand for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Its id.
    pub id: String,
    /// The names it answers to (a plugin's id and name, a task's id and title).
    pub names: Vec<String>,
    /// How a refusal shows it: `web in acme (svc_…)`.
    pub shown: String,
}

fn shorten(text: &str) -> String {
    let mut shown: String = text.chars().take(100).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

/// The one candidate `text` names among `candidates`: its id, else its name. `scope` says where
/// it was looked for (`in organization acme`), for the refusals.
pub fn pick(kind: Kind, text: &str, scope: &str, candidates: &[Candidate]) -> Result<String> {
    if let Some(exact) = candidates.iter().find(|c| c.id == text) {
        return Ok(exact.id.clone());
    }
    let matches: Vec<&Candidate> = candidates.iter().filter(|c| c.names.iter().any(|n| n == text)).collect();
    let word = kind.word();
    let shown = shorten(text);
    let data = json!({ "looked": shown, "kind": word });
    match matches.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => {
            let scope = if scope.is_empty() { String::new() } else { format!(" {scope}") };
            Err(Refusal::new(format!("{word}-not-found"), format!("no {word} has the name or id {shown:?}{scope}")).with_data(data))
        }
        many => {
            let listed: Vec<&str> = many.iter().map(|c| c.shown.as_str()).collect();
            let hint = if kind == Kind::Service { "give its id, or its organization with --organization" } else { "give its id" };
            Err(Refusal::new(
                format!("{word}-ambiguous"),
                format!("{} {word}s are named {shown:?}: {}; {hint}", many.len(), listed.join(", ")),
            )
            .with_data(json!({ "looked": shown, "kind": word, "matches": many.iter().map(|c| c.id.as_str()).collect::<Vec<_>>() })))
        }
    }
}

/// Every item of a paged listing (`items` or `field`, `nextCursor`).
pub fn list_all(client: &Client, method: &str, body: Value, field: &str) -> Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut body = body.clone();
        body["limit"] = json!(PAGE);
        if let Some(cursor) = &cursor {
            body["cursor"] = json!(cursor);
        }
        let answer = client.call(method, &body)?;
        all.extend(answer[field].as_array().cloned().unwrap_or_default());
        match answer["nextCursor"].as_str() {
            Some(next) if Some(next) != cursor.as_deref() => cursor = Some(next.to_string()),
            _ => break,
        }
    }
    Ok(all)
}

fn named(items: Vec<Value>, id: &str, name: &str, kind: Kind) -> Vec<Candidate> {
    items
        .iter()
        .filter_map(|item| {
            let id = item[id].as_str()?.to_string();
            let name = item[name].as_str().unwrap_or_default().to_string();
            Some(Candidate { shown: format!("{} {name} ({id})", kind.word()), names: vec![name], id })
        })
        .collect()
}

/// An organization's id from its name or id.
pub fn organization(client: &Client, text: &str) -> Result<String> {
    if Kind::Organization.is_id(text) {
        return Ok(text.to_string());
    }
    let candidates = named(list_all(client, "organizations.list", json!({}), "items")?, "id", "name", Kind::Organization);
    pick(Kind::Organization, text, "", &candidates)
}

/// An organization given or not (`--organization`), as its id.
pub fn organization_opt(client: &Client, text: Option<&str>) -> Result<Option<String>> {
    text.map(|text| organization(client, text)).transpose()
}

/// A cluster's id from its name or id.
pub fn cluster(client: &Client, text: &str) -> Result<String> {
    if Kind::Cluster.is_id(text) {
        return Ok(text.to_string());
    }
    let candidates = named(list_all(client, "clusters.list", json!({}), "items")?, "id", "name", Kind::Cluster);
    pick(Kind::Cluster, text, "", &candidates)
}

/// A node's id from its name, hostname or id: within `cluster` (a name or id) when given, else
/// among the nodes of every cluster (listing nodes is for administrators).
pub fn node(client: &Client, text: &str, cluster: Option<&str>) -> Result<String> {
    if Kind::Node.is_id(text) {
        return Ok(text.to_string());
    }
    let body = match cluster {
        Some(cluster) => json!({ "clusterId": self::cluster(client, cluster)? }),
        None => json!({}),
    };
    let candidates: Vec<Candidate> = list_all(client, "nodes.list", body, "items")?
        .iter()
        .filter(|n| n["state"] != "retired")
        .filter_map(|n| {
            let id = n["id"].as_str()?.to_string();
            let (name, hostname) = (text_of(n, "name"), text_of(n, "hostname"));
            Some(Candidate { shown: format!("node {name} ({hostname}, {id})"), names: vec![name, hostname], id })
        })
        .collect();
    let scope = cluster.map(|c| format!("in cluster {}", shorten(c))).unwrap_or_default();
    pick(Kind::Node, text, &scope, &candidates)
}

/// Every service the caller may see, in `organization` (an id) or in every organization: an
/// administrator lists them at once, anyone else organization by organization.
fn services_in(client: &Client, organization: Option<&str>) -> Result<Vec<Value>> {
    if let Some(organization) = organization {
        return list_all(client, "services.list", json!({ "organizationId": organization }), "items");
    }
    match list_all(client, "services.list", json!({}), "items") {
        Err(refusal) if refusal.is("invalid-request") || refusal.is("forbidden") => {
            let mut all = Vec::new();
            for org in list_all(client, "organizations.list", json!({}), "items")? {
                if let Some(id) = org["id"].as_str() {
                    all.extend(list_all(client, "services.list", json!({ "organizationId": id }), "items")?);
                }
            }
            Ok(all)
        }
        other => other,
    }
}

/// What a confirmation line calls an entity: the name the operator gave with its id beside it,
/// or the id alone when that is what they gave.
pub fn shown(given: &str, id: &str) -> String {
    if given == id { id.to_string() } else { format!("{given} ({id})") }
}

/// A service's id from its name or id; a name is looked up within `organization` (a name or
/// an id) when given, else among every service the caller may see.
pub fn service(client: &Client, text: &str, organization: Option<&str>) -> Result<String> {
    if Kind::Service.is_id(text) {
        return Ok(text.to_string());
    }
    let organization_id = organization_opt(client, organization)?;
    let services = services_in(client, organization_id.as_deref())?;
    let names = Names::organizations(client);
    let candidates: Vec<Candidate> = services
        .iter()
        .filter_map(|s| {
            let id = s["id"].as_str()?.to_string();
            let name = text_of(s, "name");
            let shown = format!("{name} in {} ({id})", names.show(s["organizationId"].as_str().unwrap_or("-")));
            Some(Candidate { id, names: vec![name], shown })
        })
        .collect();
    let scope = organization.map(|o| format!("in organization {}", shorten(o))).unwrap_or_default();
    pick(Kind::Service, text, &scope, &candidates)
}

/// A person's id from their username or id: among everyone (`users.list`, administrators),
/// or — for an organization's owner, who may not list everyone — among `organization`'s
/// members when one is given.
pub fn user(client: &Client, text: &str, organization: Option<&str>) -> Result<String> {
    if Kind::User.is_id(text) {
        return Ok(text.to_string());
    }
    let users = match (list_all(client, "users.list", json!({}), "users"), organization) {
        (Err(refusal), Some(organization)) if refusal.is("forbidden") => {
            let members = list_all(client, "organizations.listMembers", json!({ "organizationId": organization }), "items")?;
            let scope = format!("among the members of {}", shorten(organization));
            return pick(Kind::User, text, &scope, &named(members, "userId", "username", Kind::User));
        }
        (listed, _) => listed,
    };
    user_among(
        &users.map_err(|refusal| {
            if refusal.is("method-unknown") || refusal.is("method-not-found") {
                Refusal::new(
                    "user-not-found",
                    format!(
                        "this host cannot list people, so {:?} cannot be looked up by name: give the user's id (user_…)",
                        shorten(text)
                    ),
                )
            } else {
                refusal
            }
        })?,
        text,
    )
}

/// The id of the person `text` names (a username or an id) among `people` as `users.list`
/// answers them.
pub fn user_among(people: &[Value], text: &str) -> Result<String> {
    pick(Kind::User, text, "", &named(people.to_vec(), "userId", "username", Kind::User))
}

/// A plugin's id from its id or name (`plugins.list`).
pub fn plugin(client: &Client, text: &str) -> Result<String> {
    let answer = client.call("plugins.list", &json!({}))?;
    let candidates: Vec<Candidate> = answer["plugins"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| {
            let id = p["id"].as_str()?.to_string();
            let name = text_of(p, "name");
            Some(Candidate { shown: format!("plugin {name} ({id})"), names: vec![name], id })
        })
        .collect();
    pick(Kind::Plugin, text, "", &candidates)
}

/// A task's id from its id, its title, or the last part of its id (`cleanup` for
/// `host.cleanup`) (`tasks.list`).
pub fn task(client: &Client, text: &str) -> Result<String> {
    let answer = client.call("tasks.list", &json!({}))?;
    let candidates: Vec<Candidate> = answer["tasks"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|t| {
            let id = t["id"].as_str()?.to_string();
            let short = id.rsplit_once('.').map(|(_, short)| short.to_string()).unwrap_or_else(|| id.clone());
            let title = text_of(t, "title");
            Some(Candidate { shown: format!("task {id} ({title})"), names: vec![short, title], id })
        })
        .collect();
    pick(Kind::Task, text, "", &candidates)
}

fn text_of(value: &Value, key: &str) -> String {
    text(value, key).to_string()
}

/// Names by id, for list outputs that show a related entity: best effort — an id the caller
/// may not read the name of is shown as the id.
#[derive(Debug, Default)]
pub struct Names(BTreeMap<String, String>);

impl Names {
    /// The organizations the caller can see.
    pub fn organizations(client: &Client) -> Names {
        Names::of(client, "organizations.list")
    }

    /// The clusters the caller can see (administrators).
    pub fn clusters(client: &Client) -> Names {
        Names::of(client, "clusters.list")
    }

    fn of(client: &Client, method: &str) -> Names {
        let listed = list_all(client, method, json!({}), "items").unwrap_or_default();
        Names(listed.iter().filter_map(|o| Some((o["id"].as_str()?.to_string(), o["name"].as_str()?.to_string()))).collect())
    }

    /// The name of `id`, or `id` when it is unknown.
    pub fn show(&self, id: &str) -> String {
        self.0.get(id).cloned().unwrap_or_else(|| id.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_shown_with_its_id() {
        assert_eq!(shown("website", "svc_0123"), "website (svc_0123)");
        assert_eq!(shown("svc_0123", "svc_0123"), "svc_0123");
    }

    fn candidate(id: &str, name: &str, shown: &str) -> Candidate {
        Candidate { id: id.into(), names: vec![name.into()], shown: shown.into() }
    }

    #[test]
    fn ids_have_their_prefix_and_32_hex_digits() {
        assert!(Kind::Organization.is_id("org_0123456789abcdef0123456789abcdef"));
        assert!(!Kind::Organization.is_id("org_missing"));
        assert!(!Kind::Organization.is_id("acme"));
        assert!(!Kind::Service.is_id("org_0123456789abcdef0123456789abcdef"));
        assert!(!Kind::Plugin.is_id("appstore"));
        assert!(Kind::User.is_id("user_0123456789abcdef0123456789abcdef") && Kind::User.is_id("machine_0123456789abcdef0123456789abcdef"));
        assert!(Kind::Node.is_id("node_0123456789abcdef0123456789abcdef") && !Kind::Node.is_id("alpha"));
    }

    #[test]
    fn a_name_is_one_match_or_refused_by_name() {
        let list = [
            candidate("svc_a", "web", "web in acme (svc_a)"),
            candidate("svc_b", "web", "web in beta (svc_b)"),
            candidate("svc_c", "api", "api in acme (svc_c)"),
        ];
        assert_eq!(pick(Kind::Service, "api", "", &list).unwrap(), "svc_c");
        assert_eq!(pick(Kind::Service, "svc_b", "", &list).unwrap(), "svc_b", "an id matches as itself");
        let many = pick(Kind::Service, "web", "", &list).unwrap_err();
        assert_eq!(many.code, "service-ambiguous");
        assert!(many.message.contains("web in acme (svc_a)") && many.message.contains("web in beta (svc_b)"), "{many}");
        assert!(many.message.contains("--organization"), "{many}");
        let none = pick(Kind::Service, "db", "in organization acme", &list).unwrap_err();
        assert_eq!(none.code, "service-not-found");
        assert!(none.message.contains("\"db\"") && none.message.contains("in organization acme"), "{none}");
        assert_eq!(pick(Kind::Organization, "x", "", &[]).unwrap_err().code, "organization-not-found");
        let long = "x".repeat(500);
        assert!(pick(Kind::Cluster, &long, "", &[]).unwrap_err().message.len() < 300, "a long argument is shortened");
    }
}
