//! `capstan deploy SERVICE --tag TAG [--image REF]`: a release, from push to route, as a
//! deployment machine user (docs/registry.md, "Deploying"). It reserves the release tag
//! (`deployments.reserve`), pushes REF there with skopeo under the caller's own token — or,
//! without `--image`, prints where to push and waits for that push — promotes it
//! (`deployments.promote`, against the service revision it reads), waits until every replica
//! the service's runtime specs want runs exactly the release's digest, ready
//! (`deployments.getStatus`), and promotes the reserved routes (`deployments.promoteRoute`).
//! `--rollback TAG` pins a kept release again (`deployments.rollback`) and waits the same way.
//!
//! A rollout that fails (a replica's container exited, say) ends the command with
//! `rollout-failed` naming each replica and why; one still short at `--timeout` with
//! `rollout-timeout`. Either leaves the release promoted and its routes as they were.

use super::client::{Client, Common, print_json, text};
use super::progress::Progress;
use super::resolve;
use crate::refusal::{Refusal, Result};
use serde_json::{Value, json};
use std::io::Write;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// How often the operation is read again while waiting.
const POLL_EVERY: Duration = Duration::from_secs(2);

#[derive(clap::Args)]
pub struct DeployArgs {
    /// The service's name or id (`svc_…`)
    pub service: String,
    /// The organization (name or id) to look the service's name up in
    #[arg(long, visible_alias = "org", value_name = "NAME|ID")]
    pub organization: Option<String>,
    /// The release tag to reserve and push (a new version each time, never `latest`)
    #[arg(long, value_name = "TAG", required_unless_present = "rollback")]
    pub tag: Option<String>,
    /// The image to push, as skopeo names a source (`oci-archive:app.tar`,
    /// `docker://registry.example/app:1.2`, `containers-storage:localhost/app:1.2`); without
    /// it the command prints where to push and waits for your push
    #[arg(long, value_name = "REF", conflicts_with = "rollback")]
    pub image: Option<String>,
    /// A route the release answers on once it runs: HOSTNAME or HOSTNAME/READINESS-PATH
    /// (checked over HTTPS, 200 expected); repeatable
    #[arg(long = "route", value_name = "HOST[/PATH]", conflicts_with = "rollback")]
    pub routes: Vec<String>,
    /// Roll back to this kept release instead (a tag the service ran before)
    #[arg(long, value_name = "TAG", conflicts_with = "tag")]
    pub rollback: Option<String>,
    /// How long to wait for the push and for the rollout (`90s`, `10m`)
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub common: Common,
}

fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration such as 90s or 10m: {e}"))
}

/// `HOST` or `HOST/PATH` as a route of `deployments.reserve`.
fn route(text: &str) -> Value {
    let (hostname, path) = match text.split_once('/') {
        Some((host, path)) => (host, format!("/{path}")),
        None => (text, "/".to_string()),
    };
    json!({ "hostname": hostname, "readinessPath": path, "expectedStatus": 200 })
}

/// What a deployment machine user's token starts with.
const MACHINE_TOKEN_PREFIX: &str = "capstan_mt_";

/// Run `capstan deploy`.
pub fn deploy(args: &DeployArgs) -> Result<()> {
    let mut client = Client::new(&args.common.connection)?;
    // a deployer's machine token (CAPSTAN_TOKEN in CI) opens a session for the calls and
    // stays the registry password for the push
    let machine_token = client.token().filter(|t| t.starts_with(MACHINE_TOKEN_PREFIX)).map(|t| Zeroizing::new(t.to_string()));
    if let Some(token) = &machine_token {
        let session = client.call("auth.exchangeToken", &json!({ "token": token.as_str() }))?;
        client.use_session(text(&session, "token"));
    }
    let service = resolve::service(&client, &args.service, args.organization.as_deref())?;
    let progress = Progress::spinner("deploying");
    let say = |line: String| {
        if !args.common.json {
            progress.println(line);
        }
    };
    let deadline = Instant::now() + args.timeout;
    let operation = match &args.rollback {
        Some(release) => {
            let current = client.call("services.get", &json!({ "id": service }))?;
            let answer = client.call(
                "deployments.rollback",
                &json!({ "serviceId": service, "release": release, "expectedServiceRevision": current["revision"] }),
            )?;
            say(format!("rolling {} back to {release} ({})", args.service, text(&answer, "digest")));
            answer
        }
        None => {
            let tag = args.tag.as_deref().unwrap_or_default();
            let routes: Vec<Value> = args.routes.iter().map(|r| route(r)).collect();
            let reserved = client.call(
                "deployments.reserve",
                &json!({ "serviceId": service, "tag": tag, "mutationId": super::client::new_mutation_id(), "routes": routes }),
            )?;
            let (id, reference) = (text(&reserved, "id").to_string(), text(&reserved, "reference").to_string());
            say(format!("reserved {reference} (operation {id})"));
            match &args.image {
                Some(image) => {
                    progress.set_message(format!("pushing {image}"));
                    push(&client, machine_token.as_deref().map(String::as_str), image, &reference)?;
                    say(format!("pushed {image}"));
                }
                None => {
                    say(format!("push the release to {reference}, logged in as this deployer, e.g.:"));
                    say(format!("  skopeo copy --dest-creds USER:TOKEN oci-archive:app.tar docker://{reference}"));
                    progress.set_message(format!("waiting for the push to {reference}"));
                }
            }
            let pushed = wait(&client, &id, deadline, &progress, |op| op["state"] != "awaiting-image", "push-timeout", "the push")?;
            say(format!("the push recorded {}", text(&pushed, "digest")));
            let current = client.call("services.get", &json!({ "id": service }))?;
            let promoted = client.call(
                "deployments.promote",
                &json!({ "operationId": id, "expectedRevision": pushed["revision"], "expectedServiceRevision": current["revision"] }),
            )?;
            say(format!("promoted {tag}: rolling out"));
            promoted
        }
    };
    let id = text(&operation, "id").to_string();
    let mut last = String::new();
    let rolled = wait(
        &client,
        &id,
        deadline,
        &progress,
        |op| {
            let state = op["rollout"]["state"].as_str().unwrap_or("starting");
            let line = describe(&op["rollout"]);
            if line != last && !args.common.json {
                progress.println(format!("rollout {line}"));
                last = line;
            }
            state != "starting" && state != "unhealthy"
        },
        "rollout-timeout",
        "the rollout",
    )?;
    match rolled["rollout"]["state"].as_str() {
        Some("healthy") | Some("unplaced") => {}
        state => {
            return Err(Refusal::new(
                "rollout-failed",
                format!("the rollout of {} is {}: {}", text(&rolled, "tag"), state.unwrap_or("?"), describe(&rolled["rollout"])),
            )
            .with_data(json!({ "operationId": id, "rollout": rolled["rollout"] })));
        }
    }
    let has_routes = rolled["routes"].as_array().is_some_and(|r| !r.is_empty());
    let finished = if has_routes && rolled["state"] == "promoted" {
        progress.set_message("checking the routes");
        let answer = client.call("deployments.promoteRoute", &json!({ "operationId": id, "expectedRevision": rolled["revision"] }))?;
        say(format!(
            "routes promoted: {}",
            answer["routes"].as_array().into_iter().flatten().map(|r| text(r, "hostname")).collect::<Vec<_>>().join(", ")
        ));
        answer
    } else {
        rolled
    };
    drop(progress);
    if args.common.json {
        print_json(&finished);
    } else {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{} runs {} ({})", args.service, text(&finished, "tag"), text(&finished, "digest"));
    }
    Ok(())
}

/// Read the operation until `done` says so; `code` when `deadline` passes first.
fn wait(
    client: &Client,
    id: &str,
    deadline: Instant,
    progress: &Progress,
    mut done: impl FnMut(&Value) -> bool,
    code: &'static str,
    what: &str,
) -> Result<Value> {
    loop {
        let operation = client.call("deployments.getStatus", &json!({ "operationId": id }))?;
        if done(&operation) {
            return Ok(operation);
        }
        if Instant::now() >= deadline {
            let mut refusal =
                Refusal::new(code, format!("{what} did not finish in time (--timeout)")).with_data(json!({ "operationId": id }));
            if let Some(rollout) = operation.get("rollout") {
                refusal.message = format!("{what} did not finish in time (--timeout): {}", describe(rollout));
            }
            return Err(refusal);
        }
        progress.set_message(format!("waiting for {what}"));
        std::thread::sleep(POLL_EVERY);
    }
}

/// A rollout in one line: each cluster's healthy replicas of those wanted and why the others
/// are not.
fn describe(rollout: &Value) -> String {
    let clusters: Vec<String> = rollout["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let short: Vec<String> =
                c["shortfall"].as_array().into_iter().flatten().map(|s| format!("{} {}", text(s, "slot"), text(s, "reason"))).collect();
            let mut line = format!("{}: {} of {} healthy", text(c, "clusterId"), c["healthy"], c["wanted"]);
            if let Some(reason) = c["reason"].as_str() {
                line.push_str(&format!(" ({reason})"));
            }
            if !short.is_empty() {
                line.push_str(&format!(" — {}", short.join(", ")));
            }
            line
        })
        .collect();
    match rollout["state"].as_str() {
        Some("unplaced") => "unplaced: no runtime spec places the service".into(),
        Some(state) if clusters.is_empty() => state.into(),
        Some(state) => format!("{state}: {}", clusters.join("; ")),
        None => "starting".into(),
    }
}

/// Push `image` to `reference` with skopeo, as the caller: their username and machine token go
/// in an auth file only this user can read, removed afterwards (never on a command line).
fn push(client: &Client, token: Option<&str>, image: &str, reference: &str) -> Result<()> {
    use base64::Engine;
    let token = token.ok_or_else(|| {
        Refusal::new(
            "machine-token-required",
            "the push logs in to the registry with the deployer's machine token: set CAPSTAN_TOKEN to it (capstan_mt_…)",
        )
    })?;
    let plain_http = client.url().starts_with("http://");
    let who = client.call("auth.whoami", &json!({}))?;
    let username = text(&who, "username").to_string();
    let host = reference.split('/').next().unwrap_or_default();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{token}"));
    let dir = std::env::temp_dir().join(format!("capstan-deploy-{}-{:016x}", std::process::id(), rand::random::<u64>()));
    std::fs::create_dir(&dir).map_err(|e| Refusal::internal(format!("creating {}: {e}", dir.display())))?;
    let file = dir.join("auth.json");
    let written = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)
            .and_then(|mut f| f.write_all(json!({ "auths": { host: { "auth": auth } } }).to_string().as_bytes()))
    };
    let ran = written.map_err(|e| Refusal::internal(format!("writing {}: {e}", file.display()))).and_then(|()| {
        let mut command = std::process::Command::new("skopeo");
        command.args(["copy", "--quiet", "--dest-authfile"]).arg(&file);
        if plain_http {
            command.arg("--dest-tls-verify=false");
        }
        command.arg(image).arg(format!("docker://{reference}"));
        command.output().map_err(|e| {
            Refusal::new("skopeo-missing", format!("skopeo could not be run ({e}): install it, or push {image} to {reference} yourself"))
        })
    });
    let _ = std::fs::remove_dir_all(&dir);
    let out = ran?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).replace(token, "<redacted>");
        return Err(Refusal::new("image-push-failed", format!("pushing {image} to {reference} failed: {}", why.trim())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_takes_its_readiness_path_or_the_root() {
        assert_eq!(route("web.example.com"), json!({ "hostname": "web.example.com", "readinessPath": "/", "expectedStatus": 200 }));
        assert_eq!(route("web.example.com/healthz")["readinessPath"], "/healthz");
    }

    #[test]
    fn a_rollout_reads_as_one_line_per_cluster_with_its_shortfall() {
        let rollout = json!({ "state": "starting", "clusters": [{
            "clusterId": "cluster_1", "state": "starting", "wanted": 2, "healthy": 1,
            "shortfall": [{ "slot": "node_b.0", "nodeId": "node_b", "state": "starting", "reason": "pulling" }]
        }] });
        assert_eq!(describe(&rollout), "starting: cluster_1: 1 of 2 healthy — node_b.0 pulling");
        assert_eq!(describe(&json!({ "state": "unplaced", "clusters": [] })), "unplaced: no runtime spec places the service");
    }
}
