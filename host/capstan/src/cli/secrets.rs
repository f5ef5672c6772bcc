//! `capstan secrets set | set-system | generate | list | get | revoke | rewrap`: clients of the
//! `secrets.*` API methods of a running host.
//!
//! A value enters from standard input only — never from an argument (argv is visible to every
//! user through `ps`) nor from the environment. A terminal on standard input is refused
//! `input-terminal` unless `--prompt` asks for the value without echo. The CLI seals the value
//! to the server's ingress recipient for the very request it sends (`secrets.create`, or
//! `secrets.rotate` against the current version when the secret exists), so the value never
//! travels in the clear, not even inside TLS. Nothing here prints or logs a value: every answer
//! is metadata.

use super::client::{Client, finish, items, print_json, print_table, text, utc};
use super::confirm::{Confirm, ask, can_confirm};
use super::resolve;
use crate::refusal::{Refusal, Result};
use crate::secrets::ingress;
use crate::secrets::methods::MAX_VALUE_BYTES;
use base64::Engine;
use clap::Subcommand;
use serde_json::{Map, Value, json};
use std::io::{IsTerminal, Read};
use std::process::ExitCode;
use zeroize::Zeroizing;

pub use super::client::Common;

/// Whose secret: a service's, or a SecretSet's shared by the services it is attached to
/// (exactly one).
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
pub struct OwnerArgs {
    /// The service that owns the secret: its name (when no other organization you see has
    /// one so named) or its id (`svc_…`)
    #[arg(long, value_name = "NAME|ID")]
    service: Option<String>,
    /// The organization's SecretSet that holds the secret (`sset_…`)
    #[arg(long, value_name = "ID")]
    secret_set: Option<String>,
}

impl OwnerArgs {
    fn owner(&self, client: &Client) -> Result<Value> {
        match (&self.service, &self.secret_set) {
            (Some(service), _) => Ok(json!({ "kind": "service", "serviceId": resolve::service(client, service, None)? })),
            (None, Some(id)) => set_owner(client, id),
            (None, None) => unreachable!("clap requires one owner"),
        }
    }
}

/// The owner of a SecretSet's members: the set's organization and the set.
fn set_owner(client: &Client, secret_set_id: &str) -> Result<Value> {
    let set = client.call("secrets.getSecretSet", &json!({ "id": secret_set_id }))?;
    Ok(json!({ "kind": "organization", "organizationId": text(&set, "organizationId"), "secretSetId": secret_set_id }))
}

#[derive(clap::Args)]
pub struct Placement {
    /// Which environment the secret is for
    #[arg(long, value_name = "NAME", default_value = "production")]
    environment: String,
    /// The management scope that owns the secret (e.g. `mail:<serviceId>`); a secret managed
    /// from a scope is written only with that scope
    #[arg(long = "scope", value_name = "SCOPE")]
    scope: Option<String>,
}

#[derive(clap::Args)]
pub struct ValueInput {
    /// Ask for the value on the terminal without echo (otherwise it is read from standard input,
    /// which must not be a terminal)
    #[arg(long)]
    prompt: bool,
}

#[derive(Subcommand)]
pub enum SecretsCommand {
    /// Set a service's or a SecretSet's secret from standard input (`secrets.create`, or
    /// `secrets.rotate` when it exists).
    ///
    /// The value is read from standard input only (one trailing newline is dropped), at most
    /// 64 KiB: pipe it in (`capstan secrets set --service svc_… DB_PASSWORD < file`), or pass
    /// --prompt to type it without echo. A terminal on standard input without --prompt is refused
    /// `input-terminal`, an empty value `input-empty`, a longer one `input-oversized`. The value
    /// is sealed to the server's ingress recipient for this request and never printed.
    Set {
        #[command(flatten)]
        owner: OwnerArgs,
        /// The environment variable name (`[A-Z_][A-Z0-9_]*`)
        key: String,
        #[command(flatten)]
        placement: Placement,
        #[command(flatten)]
        input: ValueInput,
        #[command(flatten)]
        common: Common,
    },
    /// Set a system secret (the host's own integrations) from standard input, like `set`.
    SetSystem {
        /// The secret's name (`[A-Z_][A-Z0-9_]*`)
        key: String,
        /// Which system integration owns it
        #[arg(long, value_name = "ID", default_value = "capstan")]
        system_id: String,
        #[command(flatten)]
        placement: Placement,
        #[command(flatten)]
        input: ValueInput,
        #[command(flatten)]
        common: Common,
    },
    /// Have the server generate a service's or a SecretSet's secret (create, or rotate when it
    /// exists). The value is never shown.
    Generate {
        #[command(flatten)]
        owner: OwnerArgs,
        /// The environment variable name (`[A-Z_][A-Z0-9_]*`)
        key: String,
        /// How many characters (16–512)
        #[arg(long, value_name = "N", default_value_t = 32)]
        length: usize,
        /// Which characters: alphanumeric, hex, base64url or printable
        #[arg(long, value_name = "ALPHABET", default_value = "alphanumeric")]
        alphabet: String,
        #[command(flatten)]
        placement: Placement,
        #[command(flatten)]
        common: Common,
    },
    /// Secrets' metadata: every one, or one owner's (`secrets.list`).
    List {
        /// Only this service's secrets (its name or id)
        #[arg(long, value_name = "NAME|ID", conflicts_with_all = ["secret_set", "system"])]
        service: Option<String>,
        /// Only this SecretSet's secrets
        #[arg(long, value_name = "ID", conflicts_with = "system")]
        secret_set: Option<String>,
        /// Only this system integration's secrets
        #[arg(long, value_name = "ID")]
        system: Option<String>,
        /// Continue a listing after this cursor
        #[arg(long, value_name = "CURSOR")]
        cursor: Option<String>,
        /// At most this many items (1–200; default 50)
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        #[command(flatten)]
        common: Common,
    },
    /// One secret's metadata and version history (`secrets.get`; never a value).
    Get {
        /// The secret's id (`sec_…`)
        id: String,
        #[command(flatten)]
        common: Common,
    },
    /// Revoke a secret (`secrets.revoke`); its versions stay as history.
    ///
    /// Asks on a terminal ([y/N]); refused `confirmation-required` without --yes when standard
    /// input is not a terminal.
    Revoke {
        /// The secret's id (`sec_…`)
        id: String,
        /// The management scope the secret is managed from, if any
        #[arg(long = "scope", value_name = "SCOPE")]
        scope: Option<String>,
        #[command(flatten)]
        confirm: Confirm,
        #[command(flatten)]
        common: Common,
    },
    /// Re-wrap every version's data key under the server's active KEK (`secrets.rewrap`), in
    /// chunks, until done.
    ///
    /// Run it after `capstan keyring rotate` and a restart of the servers. No value is
    /// decrypted; each version is rewritten in its own transaction, so an interrupted run is
    /// simply started again (versions already under the active KEK are skipped).
    Rewrap {
        /// Versions per chunk (1–500)
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
        /// Start after this version id (a chunk's cursor)
        #[arg(long, value_name = "CURSOR")]
        cursor: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// SecretSets: an organization's shared secrets (list, create, show, rename, retire).
    #[command(subcommand)]
    Sets(super::secret_sets::SetsCommand),
    /// Attach a SecretSet to a service (`secrets.attachSecretSet`); keys the service does not
    /// set itself resolve from it, earlier attachments first.
    Attach {
        #[command(flatten)]
        attachment: super::secret_sets::AttachmentArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Detach a SecretSet from a service (`secrets.detachSecretSet`).
    Detach {
        #[command(flatten)]
        attachment: super::secret_sets::AttachmentArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Which key of a service resolves from where, every conflict, and which names each
    /// replica was handed at which manifest (`secrets.previewResolution`, `secrets.preview`;
    /// value-free).
    Preview {
        /// The service (its name or id)
        #[arg(long, value_name = "NAME|ID")]
        service: String,
        #[command(flatten)]
        common: Common,
    },
}

pub fn run(command: SecretsCommand) -> ExitCode {
    let (result, json) = match command {
        SecretsCommand::Set { owner, key, placement, input, common } => {
            (set(|client| owner.owner(client), &key, &placement, &input, &common), common.json)
        }
        SecretsCommand::SetSystem { key, system_id, placement, input, common } => {
            (set(|_| Ok(json!({ "kind": "system", "systemId": system_id })), &key, &placement, &input, &common), common.json)
        }
        SecretsCommand::Generate { owner, key, length, alphabet, placement, common } => {
            let value = json!({ "generate": { "length": length, "alphabet": alphabet } });
            (generate(&owner, &key, value, &placement, &common), common.json)
        }
        SecretsCommand::List { service, secret_set, system, cursor, limit, common } => {
            (list(service, secret_set, system, cursor, limit, &common), common.json)
        }
        SecretsCommand::Sets(command) => return super::secret_sets::run(command),
        SecretsCommand::Attach { attachment, common } => (super::secret_sets::attach(&attachment, true, &common), common.json),
        SecretsCommand::Detach { attachment, common } => (super::secret_sets::attach(&attachment, false, &common), common.json),
        SecretsCommand::Preview { service, common } => (super::secret_sets::preview(&service, &common), common.json),
        SecretsCommand::Get { id, common } => (get(&id, &common), common.json),
        SecretsCommand::Revoke { id, scope, confirm, common } => (revoke(&id, scope, &confirm, &common), common.json),
        SecretsCommand::Rewrap { limit, cursor, common } => (rewrap(limit, cursor, &common), common.json),
    };
    finish(result, json)
}

// ---- reading the value ----

/// Where a value is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Standard input (a pipe or a file).
    Stdin,
    /// The terminal, without echo.
    Prompt,
}

/// Where to read the value, given whether standard input is a terminal and `--prompt`: a
/// terminal is never read with echo, so without `--prompt` it is refused `input-terminal`.
pub(crate) fn value_source(stdin_is_terminal: bool, prompt: bool) -> Result<Source> {
    match (prompt, stdin_is_terminal) {
        (true, _) => Ok(Source::Prompt),
        (false, true) => Err(Refusal::new(
            "input-terminal",
            "standard input is a terminal: pipe the value in (e.g. `< file`), or pass --prompt to type it without echo",
        )),
        (false, false) => Ok(Source::Stdin),
    }
}

fn oversized() -> Refusal {
    Refusal::new("input-oversized", format!("a value is at most {MAX_VALUE_BYTES} bytes"))
        .with_data(json!({ "limitBytes": MAX_VALUE_BYTES }))
}

/// The value as given: one trailing newline (`\n` or `\r\n`) dropped; empty refused
/// `input-empty`, more than [`MAX_VALUE_BYTES`] refused `input-oversized`.
fn checked(mut raw: Zeroizing<Vec<u8>>) -> Result<Zeroizing<Vec<u8>>> {
    if raw.last() == Some(&b'\n') {
        raw.pop();
        if raw.last() == Some(&b'\r') {
            raw.pop();
        }
    }
    if raw.is_empty() {
        return Err(Refusal::new("input-empty", "the value is empty"));
    }
    if raw.len() > MAX_VALUE_BYTES {
        return Err(oversized());
    }
    Ok(raw)
}

/// Read the value from `input`, never more than the limit plus a line end and one byte.
pub(crate) fn read_value(input: &mut impl Read) -> Result<Zeroizing<Vec<u8>>> {
    let bound = MAX_VALUE_BYTES + 2;
    let mut raw = Zeroizing::new(Vec::with_capacity(4096));
    input
        .take(bound as u64 + 1)
        .read_to_end(&mut raw)
        .map_err(|e| Refusal::new("input-unreadable", format!("reading the value from standard input failed: {}", e.kind())))?;
    if raw.len() > bound {
        return Err(oversized());
    }
    checked(raw)
}

pub(crate) fn read_input(input: &ValueInput, key: &str) -> Result<Zeroizing<Vec<u8>>> {
    let stdin = std::io::stdin();
    match value_source(stdin.is_terminal(), input.prompt)? {
        Source::Stdin => read_value(&mut stdin.lock()),
        Source::Prompt => {
            let typed = Zeroizing::new(
                rpassword::prompt_password(format!("value for {key} (not echoed): "))
                    .map_err(|e| Refusal::new("input-unreadable", format!("reading the value from the terminal failed: {}", e.kind())))?,
            );
            checked(Zeroizing::new(typed.as_bytes().to_vec()))
        }
    }
}

// ---- set / generate ----

/// What a sealed value for `owner` is bound to.
fn owner_ref(owner: &Value) -> Result<String> {
    let owner: crate::secrets::methods::Owner = serde_json::from_value(owner.clone()).map_err(Refusal::internal)?;
    Ok(owner.reference())
}

/// The existing secret with this owner, key and environment (revoked ones included), if any.
fn find_existing(client: &Client, owner: &Value, key: &str, environment: &str) -> Result<Option<Value>> {
    let mut cursor = Value::Null;
    loop {
        let page = client.call("secrets.list", &json!({ "owner": owner, "cursor": cursor, "limit": 200 }))?;
        let found = items(&page).iter().find(|s| s["key"].as_str() == Some(key) && s["environment"].as_str() == Some(environment)).cloned();
        if found.is_some() {
            return Ok(found);
        }
        cursor = page["nextCursor"].clone();
        if cursor.is_null() {
            return Ok(None);
        }
    }
}

/// The server's ingress recipient: its id and X25519 public key.
pub(crate) fn recipient(client: &Client) -> Result<(String, x25519_dalek::PublicKey)> {
    let answer = client.call("secrets.getIngressRecipient", &json!({}))?;
    let invalid = |what: &str| Refusal::new("response-invalid", format!("the ingress recipient's {what} is not usable"));
    if answer["profile"].as_str() != Some(ingress::PROFILE) {
        return Err(invalid("profile").with_data(json!({ "expected": ingress::PROFILE })));
    }
    let id = answer["recipientId"].as_str().ok_or_else(|| invalid("id"))?.to_string();
    let key: [u8; 32] = answer["publicKey"]
        .as_str()
        .and_then(|k| base64::engine::general_purpose::STANDARD.decode(k).ok())
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| invalid("public key"))?;
    Ok((id, x25519_dalek::PublicKey::from(key)))
}

/// Create the secret, or add a version to the existing one; `value` is made for the method
/// chosen (a sealed value is bound to it).
fn write(
    client: &Client,
    owner: Value,
    key: &str,
    placement: &Placement,
    value: impl Fn(&str, &str) -> Result<Value>,
) -> Result<(Value, &'static str)> {
    let reference = owner_ref(&owner)?;
    match find_existing(client, &owner, key, &placement.environment)? {
        None => {
            let mut body = Map::new();
            body.insert("owner".into(), owner);
            body.insert("key".into(), json!(key));
            body.insert("environment".into(), json!(placement.environment));
            if let Some(scope) = &placement.scope {
                body.insert("managementScope".into(), json!(scope));
            }
            body.insert("value".into(), value("secrets.create", &reference)?);
            Ok((client.call("secrets.create", &Value::Object(body))?, "created"))
        }
        Some(existing) => {
            let mut body = Map::new();
            body.insert("id".into(), existing["id"].clone());
            body.insert("expectedVersionId".into(), existing["currentVersionId"].clone());
            if let Some(scope) = &placement.scope {
                body.insert("managementScope".into(), json!(scope));
            }
            body.insert("value".into(), value("secrets.rotate", &reference)?);
            Ok((client.call("secrets.rotate", &Value::Object(body))?, "rotated"))
        }
    }
}

fn report(answer: &Value, done: &str, common: &Common) {
    if common.json {
        print_json(answer);
        return;
    }
    let versions = answer["versions"].as_u64().unwrap_or(0);
    println!(
        "{done} secret {} ({} for {}, {}): {versions} version{}",
        text(answer, "id"),
        text(answer, "key"),
        text(answer, "ownerRef"),
        text(answer, "environment"),
        if versions == 1 { "" } else { "s" }
    );
    println!("  current version: {}", text(answer, "currentVersionId"));
}

fn set(owner: impl FnOnce(&Client) -> Result<Value>, key: &str, placement: &Placement, input: &ValueInput, common: &Common) -> Result<()> {
    // the value is read (and refused when empty or oversized) before anything is sent
    let plaintext = read_input(input, key)?;
    let client = Client::new(&common.connection)?;
    let owner = owner(&client)?;
    let (recipient_id, public) = recipient(&client)?;
    let (answer, done) = write(&client, owner, key, placement, |method, reference| {
        let sealed = ingress::seal_to(&recipient_id, &public, &ingress::target(method, reference, key), &plaintext);
        Ok(json!({ "sealed": serde_json::to_value(sealed).map_err(Refusal::internal)? }))
    })?;
    drop(plaintext);
    report(&answer, done, common);
    Ok(())
}

fn generate(owner: &OwnerArgs, key: &str, value: Value, placement: &Placement, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let owner = owner.owner(&client)?;
    let (answer, done) = write(&client, owner, key, placement, |_, _| Ok(value.clone()))?;
    report(&answer, &format!("{done} (generated)"), common);
    Ok(())
}

// ---- reads and the rest ----

fn list(
    service: Option<String>,
    secret_set: Option<String>,
    system: Option<String>,
    cursor: Option<String>,
    limit: Option<usize>,
    common: &Common,
) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let owner = match (service, secret_set, system) {
        (Some(service), _, _) => Some(json!({ "kind": "service", "serviceId": resolve::service(&client, &service, None)? })),
        (_, Some(id), _) => Some(set_owner(&client, &id)?),
        (_, _, Some(id)) => Some(json!({ "kind": "system", "systemId": id })),
        _ => None,
    };
    let mut body = Map::new();
    if let Some(owner) = owner {
        body.insert("owner".into(), owner);
    }
    if let Some(cursor) = cursor {
        body.insert("cursor".into(), json!(cursor));
    }
    if let Some(limit) = limit {
        body.insert("limit".into(), json!(limit));
    }
    let answer = client.call("secrets.list", &Value::Object(body))?;
    if common.json {
        print_json(&answer);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = items(&answer)
        .iter()
        .map(|s| {
            vec![
                text(s, "id").into(),
                text(s, "ownerRef").into(),
                text(s, "key").into(),
                text(s, "environment").into(),
                text(s, "state").into(),
                s["versions"].as_u64().map(|n| n.to_string()).unwrap_or_default(),
                utc(s["updatedAt"].as_u64()),
            ]
        })
        .collect();
    if rows.is_empty() {
        println!("no secrets");
    } else {
        print_table(&["ID", "OWNER", "KEY", "ENVIRONMENT", "STATE", "VERSIONS", "UPDATED"], &rows);
    }
    if let Some(next) = answer["nextCursor"].as_str() {
        println!("more: --cursor {next}");
    }
    Ok(())
}

fn get(id: &str, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let s = client.call("secrets.get", &json!({ "id": id }))?;
    if common.json {
        print_json(&s);
        return Ok(());
    }
    println!("secret:      {} ({})", text(&s, "key"), text(&s, "id"));
    println!("owner:       {}", text(&s, "ownerRef"));
    println!("environment: {}", text(&s, "environment"));
    println!("state:       {}", text(&s, "state"));
    if let Some(scope) = s["managementScope"].as_str() {
        println!("managed by:  {scope}");
    }
    println!("created:     {}", utc(s["createdAt"].as_u64()));
    println!("updated:     {}", utc(s["updatedAt"].as_u64()));
    let rows: Vec<Vec<String>> = s["versionHistory"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|v| {
            vec![
                v["number"].as_u64().map(|n| n.to_string()).unwrap_or_default(),
                text(v, "id").into(),
                text(v, "source").into(),
                text(v, "kekId").into(),
                utc(v["createdAt"].as_u64()),
            ]
        })
        .collect();
    print_table(&["VERSION", "ID", "SOURCE", "KEK", "CREATED"], &rows);
    Ok(())
}

fn revoke(id: &str, scope: Option<String>, confirm: &Confirm, common: &Common) -> Result<()> {
    can_confirm(confirm)?;
    let client = Client::new(&common.connection)?;
    ask(confirm, || {
        let s = client.call("secrets.get", &json!({ "id": id }))?;
        Ok(format!("Revoke secret {} of {} ({id})? Its versions stay as history.", text(&s, "key"), text(&s, "ownerRef")))
    })?;
    let mut body = Map::new();
    body.insert("id".into(), json!(id));
    if let Some(scope) = scope {
        body.insert("managementScope".into(), json!(scope));
    }
    let s = client.call("secrets.revoke", &Value::Object(body))?;
    if common.json {
        print_json(&s);
    } else {
        println!("revoked secret {} ({} for {}); its versions stay as history", text(&s, "id"), text(&s, "key"), text(&s, "ownerRef"));
    }
    Ok(())
}

fn rewrap(limit: usize, cursor: Option<String>, common: &Common) -> Result<()> {
    let client = Client::new(&common.connection)?;
    let (mut rewrapped, mut current, mut chunks) = (0u64, 0u64, 0u64);
    let mut cursor = cursor.map(Value::String).unwrap_or(Value::Null);
    let mut kek: String;
    let progress = super::progress::Progress::spinner("re-wrapping the first chunk");
    loop {
        let page = client.call("secrets.rewrap", &json!({ "cursor": cursor, "limit": limit }))?;
        let (moved, already) = (page["rewrapped"].as_u64().unwrap_or(0), page["alreadyCurrent"].as_u64().unwrap_or(0));
        rewrapped += moved;
        current += already;
        chunks += 1;
        kek = text(&page, "activeKekId").to_string();
        cursor = page["nextCursor"].clone();
        if !common.json {
            let next = cursor.as_str().map(|c| format!(" (next: --cursor {c})")).unwrap_or_default();
            progress.suspend(|| println!("chunk {chunks}: re-wrapped {moved}, {already} already under {kek}{next}"));
        }
        if cursor.is_null() {
            break;
        }
        progress.set_message(format!("re-wrapping: {rewrapped} moved, {current} already under {kek}, chunk {}", chunks + 1));
    }
    drop(progress);
    if common.json {
        print_json(&json!({ "ok": true, "rewrapped": rewrapped, "alreadyCurrent": current, "activeKekId": kek, "chunks": chunks }));
    } else {
        println!("done: {rewrapped} version(s) re-wrapped, {current} already under the active KEK {kek}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_is_read_only_without_echo() {
        assert_eq!(value_source(true, false).unwrap_err().code, "input-terminal");
        assert_eq!(value_source(true, true).unwrap(), Source::Prompt);
        assert_eq!(value_source(false, true).unwrap(), Source::Prompt);
        assert_eq!(value_source(false, false).unwrap(), Source::Stdin);
    }

    #[test]
    fn a_value_drops_one_line_end_and_is_bounded() {
        let read = |bytes: &[u8]| read_value(&mut &bytes[..]).map(|v| v.to_vec());
        assert_eq!(read(b"hunter2\n").unwrap(), b"hunter2");
        assert_eq!(read(b"hunter2\r\n").unwrap(), b"hunter2");
        assert_eq!(read(b"two\n\n").unwrap(), b"two\n", "only one line end is dropped");
        assert_eq!(read(b"no newline").unwrap(), b"no newline");
        assert_eq!(read(b"").unwrap_err().code, "input-empty");
        assert_eq!(read(b"\n").unwrap_err().code, "input-empty");
        let mut exact = vec![b'x'; MAX_VALUE_BYTES];
        assert_eq!(read(&exact).unwrap().len(), MAX_VALUE_BYTES);
        exact.push(b'\n');
        assert_eq!(read(&exact).unwrap().len(), MAX_VALUE_BYTES);
        assert_eq!(read(&vec![b'x'; MAX_VALUE_BYTES + 1]).unwrap_err().code, "input-oversized");
        // a line end past the limit does not hide what follows it
        let mut long = vec![b'x'; MAX_VALUE_BYTES];
        long.extend_from_slice(b"\r\nmore");
        assert_eq!(read(&long).unwrap_err().code, "input-oversized");
        // an endless input is not read to its end
        assert_eq!(read_value(&mut std::io::repeat(b'x')).unwrap_err().code, "input-oversized");
    }
}
