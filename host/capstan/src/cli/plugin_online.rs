//! `capstan plugin install | upgrade | rollback | list | get | disable | enable | uninstall |
//! trust`: the operator's plugin commands, clients of the `plugins.*` API of a running host.
//!
//! With `--json` each prints the API's answer exactly (one line); refusals print
//! `{"ok":false,"error":{…}}` and exit 1, as the offline commands do.

use super::client::{Client, Connection, print_json, print_table, text, utc};
use super::confirm::{Confirm, ask, can_confirm};
use super::progress::Progress;
use super::resolve;
use crate::plugins::bundle::{self, Bundle};
use crate::plugins::manifest::ALL_REQUESTED;
use crate::refusal::{Refusal, Result};
use clap::Subcommand;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum OnlineCommand {
    /// Install a bundle on a running host, approving the capabilities it requests.
    ///
    /// Uploads the bundle (administrators only), shows what it is and what it requests, then
    /// calls `plugins.install`. The host verifies the signature against its trusted publishers
    /// and refuses by name (`bundle-signature-invalid`, `publisher-untrusted`,
    /// `capabilities-not-approved`, `plugin-exists`, …).
    Install(InstallArgs),
    /// Upgrade an installed plugin to the higher version in a bundle (`plugins.upgrade`).
    ///
    /// New capabilities need approval; the plugin's data migrations run, then calls move to the
    /// new version without failing any.
    Upgrade(InstallArgs),
    /// Go back to the version before the last upgrade (`plugins.rollback`).
    Rollback(IdArgs),
    /// Installed plugins: id, version, status, grants (`plugins.list`).
    List(ListArgs),
    /// One plugin: status, version, publisher, grants, methods, last error (`plugins.get`).
    Get(IdArgs),
    /// Stop serving a plugin; its data stays (`plugins.disable`).
    Disable(IdArgs),
    /// Serve a disabled plugin again (`plugins.enable`).
    Enable(IdArgs),
    /// Remove a plugin; its data stays unless --purge (`plugins.uninstall`). Asks on a
    /// terminal; refused `confirmation-required` without --yes when standard input is not one.
    Uninstall(UninstallArgs),
    /// Trust a publisher key on the host (`plugins.addTrustedPublisher`).
    ///
    /// Needs a login from the last 5 minutes (else `admin-not-fresh`: run `capstan login`
    /// again). The key is the line `capstan plugin keygen` printed (`capstan-ed25519:…`).
    Trust(TrustArgs),
    /// Let another trusted publisher key sign a plugin's next upgrade (`plugins.rebindPublisher`).
    ///
    /// An upgrade must otherwise be signed by the key the installed version came from
    /// (`publisher-mismatch`). Needs a login from the last 5 minutes (`admin-not-fresh`); the
    /// key must be trusted now (`publisher-untrusted`).
    Rebind(RebindArgs),
}

#[derive(clap::Args)]
pub struct RebindArgs {
    /// The plugin: its id or its name
    id: String,
    /// The trusted publisher key (`capstan-ed25519:…`) that may sign its next upgrade
    #[arg(long = "publisher", value_name = "KEY")]
    public_key: String,
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct InstallArgs {
    /// The bundle file (`<id>-<version>.capstan-plugin`)
    bundle: PathBuf,
    /// The capabilities approved: exactly those the bundle requests, comma-separated, or
    /// `all-requested`
    #[arg(long, value_name = "CAPABILITY,…|all-requested")]
    approve: Option<String>,
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct IdArgs {
    /// The plugin: its id or its name
    id: String,
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct UninstallArgs {
    /// The plugin: its id or its name
    id: String,
    /// Also delete the plugin's documents, blobs, signing keys and stored bundles
    #[arg(long)]
    purge: bool,
    #[command(flatten)]
    confirm: Confirm,
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct TrustArgs {
    /// The publisher's public key exactly as `capstan plugin keygen` printed it
    public_key: String,
    /// Who the key belongs to, for people reading the list
    #[arg(long, value_name = "NAME")]
    name: String,
    #[command(flatten)]
    connection: Connection,
    /// Print the API's answer as JSON
    #[arg(long)]
    json: bool,
}

/// Run one online command: its outcome and whether it asked for JSON.
pub fn run(command: OnlineCommand) -> (Result<()>, bool) {
    match command {
        OnlineCommand::Install(args) => (install(&args, "plugins.install"), args.json),
        OnlineCommand::Upgrade(args) => (install(&args, "plugins.upgrade"), args.json),
        OnlineCommand::Rollback(args) => (lifecycle(&args, "plugins.rollback"), args.json),
        OnlineCommand::List(args) => (list(&args), args.json),
        OnlineCommand::Get(args) => (get(&args), args.json),
        OnlineCommand::Disable(args) => (lifecycle(&args, "plugins.disable"), args.json),
        OnlineCommand::Enable(args) => (lifecycle(&args, "plugins.enable"), args.json),
        OnlineCommand::Uninstall(args) => (uninstall(&args), args.json),
        OnlineCommand::Trust(args) => (trust(&args), args.json),
        OnlineCommand::Rebind(args) => (rebind(&args), args.json),
    }
}

/// `--approve` as the API takes it: `["all-requested"]` or the listed capabilities.
fn approval(text: &str) -> Vec<String> {
    let items: Vec<String> = text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect();
    if items.iter().any(|i| i == ALL_REQUESTED) && items.len() == 1 { vec![ALL_REQUESTED.to_string()] } else { items }
}

fn list_text(items: &[String]) -> String {
    if items.is_empty() { "none".into() } else { items.join(", ") }
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default()
}

/// Refuse a missing `--approve`, naming what the bundle requests (read locally: nothing is
/// uploaded for a command that cannot go on).
fn approval_required(path: &Path, command: &str) -> Refusal {
    let parsed = match bundle::read_bundle_file(path).and_then(|bytes| Bundle::parse(&bytes)) {
        Ok(parsed) => parsed,
        Err(refusal) => return refusal,
    };
    let requested: Vec<String> = parsed.manifest.requested_set().into_iter().collect();
    let m = &parsed.manifest;
    Refusal::new(
        "approval-required",
        format!(
            "{} {} requests these capabilities: {}. Approve them with --approve {} (exactly that set) or --approve {ALL_REQUESTED}, \
             e.g. `capstan plugin {command} {} --approve {ALL_REQUESTED}`",
            m.id,
            m.version,
            list_text(&requested),
            if requested.is_empty() { "\"\"".to_string() } else { requested.join(",") },
            path.display(),
        ),
    )
    .with_data(json!({ "id": m.id, "version": m.version.to_string(), "requested": requested }))
}

fn install(args: &InstallArgs, method: &str) -> Result<()> {
    let command = if method == "plugins.upgrade" { "upgrade" } else { "install" };
    let Some(approve) = args.approve.as_deref() else {
        return Err(approval_required(&args.bundle, command));
    };
    let approve = approval(approve);
    let bytes = bundle::read_bundle_file(&args.bundle)?;
    let client = Client::new(&args.connection)?;
    let progress = Progress::spinner(format!("uploading {} ({} bytes)", args.bundle.display(), bytes.len()));
    let uploaded = client.upload_bundle(bytes)?;
    let upload =
        uploaded["upload"].as_str().ok_or_else(|| Refusal::new("response-invalid", "the upload answer names no upload id"))?.to_string();
    let b = &uploaded["bundle"];
    let requested = strings(&b["capabilities"]);
    // shown before the call, so the operator sees what is being approved (stderr keeps
    // --json's standard output exact)
    progress.println(format!("bundle:     {} {} ({})", text(b, "id"), text(b, "version"), text(b, "name")));
    match (b["signedBy"].as_str(), b["fingerprint"].as_str()) {
        (Some(key), Some(fingerprint)) => progress.println(format!("signed by:  {key} ({fingerprint})")),
        _ => progress.println("signed by:  nobody (unsigned: the host will refuse it)"),
    }
    progress.println(format!("requests:   {}", list_text(&requested)));
    progress.println(format!("approving:  {}", list_text(&approve)));
    progress.set_message(format!("{command}ing {} {}: the host verifies and compiles it", text(b, "id"), text(b, "version")));
    let answer = client.call(method, &json!({ "upload": upload, "approve": approve }));
    drop(progress);
    let answer = answer?;
    if args.json {
        print_json(&answer);
        return Ok(());
    }
    let (id, version) = (text(&answer, "id"), text(&answer, "version"));
    match (command, answer["previousVersion"].as_str()) {
        ("upgrade", Some(previous)) => println!("upgraded {id} from {previous} to {version}: {}", text(&answer, "status")),
        _ => println!("installed {id} {version}: {}", text(&answer, "status")),
    }
    println!("  grants:  {}", list_text(&strings(&answer["grants"])));
    println!("  methods: {}", list_text(&strings(&answer["methods"])));
    Ok(())
}

fn lifecycle(args: &IdArgs, method: &str) -> Result<()> {
    let client = Client::new(&args.connection)?;
    let answer = client.call(method, &json!({ "id": resolve::plugin(&client, &args.id)? }))?;
    if args.json {
        print_json(&answer);
        return Ok(());
    }
    let (id, version, status) = (text(&answer, "id"), text(&answer, "version"), text(&answer, "status"));
    match method {
        "plugins.rollback" => println!("rolled {id} back to {version}: {status}"),
        "plugins.disable" => println!("disabled {id} {version}: {status}"),
        _ => println!("enabled {id} {version}: {status}"),
    }
    print_last_error(&answer);
    Ok(())
}

fn print_last_error(view: &Value) {
    if let Some(error) = view["lastError"].as_object() {
        let code = error.get("code").and_then(Value::as_str).unwrap_or("?");
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        println!("  last error: {code}: {message}");
    }
}

fn list(args: &ListArgs) -> Result<()> {
    let client = Client::new(&args.connection)?;
    let answer = client.call("plugins.list", &json!({}))?;
    if args.json {
        print_json(&answer);
        return Ok(());
    }
    let plugins = answer["plugins"].as_array().cloned().unwrap_or_default();
    if plugins.is_empty() {
        println!("no plugins installed");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = plugins
        .iter()
        .map(|p| {
            vec![
                text(p, "id").to_string(),
                text(p, "version").to_string(),
                text(p, "status").to_string(),
                p["previousVersion"].as_str().unwrap_or("-").to_string(),
                list_text(&strings(&p["grants"])),
            ]
        })
        .collect();
    print_table(&["ID", "VERSION", "STATUS", "PREVIOUS", "GRANTS"], &rows);
    for p in &plugins {
        if let Some(error) = p["lastError"].as_object() {
            let code = error.get("code").and_then(Value::as_str).unwrap_or("?");
            println!("{}: last error {code}: {}", text(p, "id"), error.get("message").and_then(Value::as_str).unwrap_or(""));
        }
    }
    Ok(())
}

fn get(args: &IdArgs) -> Result<()> {
    let client = Client::new(&args.connection)?;
    let p = client.call("plugins.get", &json!({ "id": resolve::plugin(&client, &args.id)? }))?;
    if args.json {
        print_json(&p);
        return Ok(());
    }
    println!("plugin:      {} ({})", text(&p, "id"), text(&p, "name"));
    println!("status:      {}", text(&p, "status"));
    println!("version:     {}", text(&p, "version"));
    println!("previous:    {}", p["previousVersion"].as_str().unwrap_or("none"));
    println!("publisher:   {}", text(&p, "publisher"));
    println!("grants:      {}", list_text(&strings(&p["grants"])));
    println!("methods:     {}", list_text(&strings(&p["methods"])));
    let pages: Vec<String> = p["pages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|page| {
            let path = page["path"].as_str().filter(|s| !s.is_empty()).map(|s| format!("/{s}")).unwrap_or_default();
            format!("/p/{}{path} ({})", text(&p, "id"), text(page, "title"))
        })
        .collect();
    println!("pages:       {}", list_text(&pages));
    println!("digest:      {}", text(&p, "digest"));
    println!("installed:   by {} at {}", text(&p, "installedBy"), utc(p["installedAt"].as_u64()));
    print_last_error(&p);
    Ok(())
}

fn uninstall(args: &UninstallArgs) -> Result<()> {
    can_confirm(&args.confirm)?;
    let client = Client::new(&args.connection)?;
    let id = resolve::plugin(&client, &args.id)?;
    ask(&args.confirm, || {
        let data = if args.purge { "and delete its documents, blobs, signing keys and stored bundles" } else { "(its data stays)" };
        Ok(format!("Uninstall plugin {id} {data}?"))
    })?;
    let answer = client.call("plugins.uninstall", &json!({ "id": id, "purge": args.purge }))?;
    if args.json {
        print_json(&answer);
        return Ok(());
    }
    if args.purge {
        println!("uninstalled {id} and purged its data");
    } else {
        println!("uninstalled {id}; its data stays (uninstall --purge deletes it)");
    }
    Ok(())
}

/// A refusal for a change that needs a fresh login, saying how to get one.
fn with_login_hint(client: &Client) -> impl Fn(crate::refusal::Refusal) -> crate::refusal::Refusal + '_ {
    move |mut refusal| {
        if refusal.is("admin-not-fresh") {
            refusal.message = format!("{} (run `capstan login --url {}` and try again)", refusal.message, client.url());
        }
        refusal
    }
}

fn trust(args: &TrustArgs) -> Result<()> {
    let client = Client::new(&args.connection)?;
    let body = json!({ "publicKey": args.public_key.trim(), "name": args.name });
    let answer = client.call("plugins.addTrustedPublisher", &body).map_err(with_login_hint(&client))?;
    if args.json {
        print_json(&answer);
        return Ok(());
    }
    let fingerprint = answer["fingerprint"].as_str().unwrap_or("");
    println!("trusting {} as {:?} ({fingerprint})", text(&answer, "publicKey"), args.name);
    Ok(())
}

fn rebind(args: &RebindArgs) -> Result<()> {
    let client = Client::new(&args.connection)?;
    let body = json!({ "id": resolve::plugin(&client, &args.id)?, "publicKey": args.public_key.trim() });
    let answer = client.call("plugins.rebindPublisher", &body).map_err(with_login_hint(&client))?;
    if args.json {
        print_json(&answer);
        return Ok(());
    }
    println!("the next upgrade of {} may be signed by {}", args.id, text(&answer, "reboundPublisher"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approvals_are_lists_or_all_requested() {
        assert_eq!(approval("all-requested"), vec!["all-requested"]);
        assert_eq!(approval(" store , log,"), vec!["store", "log"]);
        assert_eq!(approval(""), Vec::<String>::new());
        // mixing is passed on as written, for the host to refuse by name
        assert_eq!(approval("all-requested,log"), vec!["all-requested", "log"]);
    }

    #[test]
    fn a_missing_approval_names_the_requested_set() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = "[plugin]\nid = \"hello\"\nname = \"Hello\"\nversion = \"0.1.0\"\nwit = \"capstan:plugin@0.1.0\"\n\n\
                        [capabilities]\nrequested = [\"store\", \"log\"]\n";
        // the smallest component: the preamble of a component-model binary
        let component = b"\0asm\x0d\x00\x01\x00".to_vec();
        let built = Bundle::new(manifest.into(), component).unwrap();
        let path = dir.path().join(built.file_name());
        std::fs::write(&path, built.to_bytes()).unwrap();
        let refusal = approval_required(&path, "install");
        assert_eq!(refusal.code, "approval-required");
        assert!(refusal.message.contains("log, store"), "{}", refusal.message);
        assert!(refusal.message.contains("--approve log,store"), "{}", refusal.message);
        assert_eq!(refusal.data.as_deref().unwrap()["requested"], json!(["log", "store"]));
        assert_eq!(approval_required(&dir.path().join("missing"), "install").code, "bundle-unreadable");
    }
}
