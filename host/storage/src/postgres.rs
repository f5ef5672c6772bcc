//! PostgreSQL provisioning for database bindings: one service, its own role and its own
//! database on a node's PostgreSQL server, least privilege.
//!
//! Capstan connects as the server's admin credential ([`Admin`]): a role with `CREATEROLE` and
//! `CREATEDB`, which need not be a superuser (and should not be: docs/postgres-peer.md). For a
//! binding it keeps a role and a database, both named [`binding_name`]:
//!
//! - the role: `LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT`, its password set by
//!   [`ensure`]; the admin grants itself membership in it (a `CREATEROLE` role needs it from
//!   PostgreSQL 15 on to create a database owned by it, drop that database and end its sessions);
//! - the database: owned by the role, `CONNECT` revoked from `PUBLIC` and granted to the role
//!   alone, so no other binding's role can connect to it; its `public` schema owned by the role
//!   (PostgreSQL 15 gives it to `pg_database_owner`, out of a `NOINHERIT` role's reach).
//!
//! Every step checks what is there first, so [`ensure`], [`revoke`] and [`drop`] are idempotent
//! and resume wherever an earlier call stopped (a crash between any two statements included).
//!
//! **TLS to the provider is not yet supported**: Capstan connects without TLS (`NoTls`, which
//! uses TLS never). A server that accepts only TLS connections (`hostssl` lines in its
//! `pg_hba.conf`) refuses the connection: `database-admin-rejected` carrying the server's
//! reason ("no pg_hba.conf entry for host …, no encryption").
//!
//! Refusals: `binding-name-invalid`, `invalid-request` (an empty password), and for the server's
//! answers `database-endpoint-unreachable` (connecting or talking failed; retryable),
//! `database-admin-rejected` (SQLSTATE 28P01, 28000), `database-admin-insufficient` (42501, or
//! [`check`] finding `CREATEROLE`/`CREATEDB` missing: `data.missing`) and
//! `database-provider-failed` (anything else: `data.sqlstate`; retryable for the transient
//! ones: too many connections, shutting down, a lock or statement timeout, a deadlock).
//!
//! Passwords: PostgreSQL takes no bind parameters in utility statements, so `CREATE ROLE`/`ALTER
//! ROLE … PASSWORD` get a string literal: the password's SCRAM-SHA-256 verifier, computed here
//! with a fresh salt, so the password itself never reaches the server (nor its log, which
//! holds the statements that fail and, with `log_statement`, all of them). PostgreSQL stores
//! a verifier as it is, whatever its `password_encryption`. Only a password with a character
//! beyond ASCII (which PostgreSQL would SASLprep first) goes as itself, an escaped literal
//! (Capstan generates alphanumeric ones). A password is never in a refusal, a log line of
//! Capstan's or a `Debug` output.

use capstan_core::refusal::{Refusal, Result};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::json;
use std::fmt;
use std::time::Duration;
use tokio_postgres::{Client, Config, NoTls};
use zeroize::Zeroizing;

/// How long Capstan waits for a PostgreSQL server to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The prefix of every binding's role and database name.
pub const NAME_PREFIX: &str = "capstan_";

/// PostgreSQL's identifier limit (NAMEDATALEN - 1).
const MAX_NAME: usize = 63;

/// The oldest server accepted: `DROP DATABASE … WITH (FORCE)` is PostgreSQL 13's.
const MIN_SERVER_VERSION: i32 = 130000;

/// How long [`revoke`] keeps ending the role's sessions until none is left.
const TERMINATE_WAIT: Duration = Duration::from_secs(5);

/// Where and as whom Capstan reaches a PostgreSQL server.
///
/// `Debug` shows everything but the password.
#[derive(Clone)]
pub struct Admin {
    /// Host name or IP address (an IPv6 address with or without brackets), or the absolute path
    /// of a directory holding the server's Unix socket.
    pub host: String,
    /// TCP port (the socket's number for a Unix socket directory).
    pub port: u16,
    /// The admin role: `CREATEROLE` and `CREATEDB` (see [`check`]).
    pub user: String,
    /// The admin role's password.
    pub password: Zeroizing<String>,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// What [`check`] found out about a server and its admin credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerInfo {
    /// `server_version`, e.g. `15.18 (Debian 15.18-0+deb12u1)`.
    pub version: String,
    /// `server_version_num`, e.g. `150018`.
    pub version_num: i32,
    /// The admin role is a superuser (it works; Capstan does not need it).
    pub superuser: bool,
    /// The admin role has `CREATEROLE`.
    pub create_role: bool,
    /// The admin role has `CREATEDB`.
    pub create_db: bool,
}

/// What of a binding is on the server ([`exists`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Presence {
    /// The role exists.
    pub role: bool,
    /// The database exists.
    pub database: bool,
    /// The role exists and may log in (false once [`revoke`]d).
    pub login: bool,
}

/// A binding's names on the server, its role's and its database's: `capstan_` and the binding's
/// id lowercased with `-` as `_`, within `[a-z][a-z0-9_]{0,62}`.
///
/// Ids with other characters, empty ones and ones too long for a PostgreSQL identifier are
/// refused `binding-name-invalid` (never truncated: two bindings would share a name). Capstan's
/// ids (`<prefix>_<32 hex digits>`) always fit; ids differing only in case or in `-` against
/// `_` would share a name.
pub fn binding_name(binding_id: &str) -> Result<String> {
    let invalid = |why: &str| {
        Refusal::new("binding-name-invalid", format!("no PostgreSQL name can be made of the binding id: {why}"))
            .with_data(json!({ "bindingId": binding_id }))
    };
    if binding_id.is_empty() {
        return Err(invalid("it is empty"));
    }
    let mut name = String::with_capacity(NAME_PREFIX.len() + binding_id.len());
    name.push_str(NAME_PREFIX);
    for c in binding_id.chars() {
        match c {
            'a'..='z' | '0'..='9' | '_' => name.push(c),
            'A'..='Z' => name.push(c.to_ascii_lowercase()),
            '-' => name.push('_'),
            _ => return Err(invalid("it may hold only letters, digits, '-' and '_'")),
        }
    }
    if name.len() > MAX_NAME {
        return Err(invalid(&format!("it is longer than {} characters", MAX_NAME - NAME_PREFIX.len())));
    }
    Ok(name)
}

/// Whether `name` is one [`binding_name`] can make: `[a-z][a-z0-9_]{0,62}`.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z')) && name.len() <= MAX_NAME && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

/// `name` checked and double-quoted for SQL. Only names [`valid_name`] accepts get here; the
/// quoting is what keeps one that were a keyword an identifier.
fn ident(name: &str) -> Result<String> {
    if !valid_name(name) {
        return Err(Refusal::new("binding-name-invalid", "a binding's PostgreSQL name must match [a-z][a-z0-9_]{0,62}")
            .with_data(json!({ "name": name })));
    }
    Ok(format!("\"{name}\""))
}

/// `value` as an SQL string literal in the escape syntax (`E'…'`, quotes and backslashes
/// doubled), which reads the same whatever `standard_conforming_strings` is.
fn literal(value: &str) -> Zeroizing<String> {
    let mut out = Zeroizing::new(String::with_capacity(value.len() + 3));
    out.push_str("E'");
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The number of PBKDF2 iterations in a SCRAM verifier (PostgreSQL's `scram_iterations`
/// default).
const SCRAM_ITERATIONS: u32 = 4096;

/// SHA-256 of `data`.
fn sha256(data: &[u8]) -> [u8; 32] {
    let hex = capstan_nodes::sha256_hex(data);
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("sha256_hex is hex");
    }
    out
}

/// HMAC-SHA-256 (RFC 2104).
fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = Zeroizing::new([0u8; 64]);
    if key.len() > 64 {
        block[..32].copy_from_slice(&sha256(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Zeroizing::new(Vec::with_capacity(64 + message.len()));
    inner.extend(block.iter().map(|b| b ^ 0x36));
    inner.extend_from_slice(message);
    let inner_hash = sha256(&inner);
    let mut outer = Zeroizing::new(Vec::with_capacity(96));
    outer.extend(block.iter().map(|b| b ^ 0x5c));
    outer.extend_from_slice(&inner_hash);
    sha256(&outer)
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = (u32::from(chunk[0]) << 16) | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8) | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The SCRAM-SHA-256 verifier PostgreSQL stores for `password` (RFC 5802, RFC 7677):
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`. `password` is ASCII (SASLprep
/// leaves it as it is).
fn scram_verifier(password: &str, salt: &[u8]) -> Zeroizing<String> {
    // PBKDF2-HMAC-SHA-256, one block of 32 bytes
    let mut first = Vec::with_capacity(salt.len() + 4);
    first.extend_from_slice(salt);
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut u = Zeroizing::new(hmac(password.as_bytes(), &first));
    let mut salted = Zeroizing::new(*u);
    for _ in 1..SCRAM_ITERATIONS {
        *u = hmac(password.as_bytes(), &*u);
        for (s, b) in salted.iter_mut().zip(u.iter()) {
            *s ^= b;
        }
    }
    let client_key = Zeroizing::new(hmac(&*salted, b"Client Key"));
    let stored_key = sha256(&*client_key);
    let server_key = hmac(&*salted, b"Server Key");
    Zeroizing::new(format!("SCRAM-SHA-256${SCRAM_ITERATIONS}:{}${}:{}", base64(salt), base64(&stored_key), base64(&server_key)))
}

/// What `PASSWORD` gets for `password`: its SCRAM verifier with a fresh salt when it is ASCII,
/// else the password itself (PostgreSQL SASLprep's it, as a client does).
fn password_literal(password: &str) -> Zeroizing<String> {
    if password.is_ascii() { literal(&scram_verifier(password, &rand::random::<[u8; 16]>())) } else { literal(password) }
}

/// A binding password PostgreSQL can take: not empty (an empty password is no password), no NUL.
fn check_password(password: &str) -> Result<()> {
    if password.is_empty() || password.contains('\0') {
        return Err(Refusal::invalid_field("password", "a database binding's password must not be empty nor hold a NUL character"));
    }
    Ok(())
}

/// The connection URL a binding's service uses: `postgres://name:password@host:port/name`,
/// user and password percent-encoded, an IPv6 address in brackets.
pub fn connection_url(host: &str, port: u16, name: &str, password: &str) -> String {
    format!("postgres://{}:{}@{}:{port}/{}", percent_encode(name), percent_encode(password), url_host(host), percent_encode(name))
}

/// The environment a binding's service gets: `DATABASE_URL` ([`connection_url`]) and libpq's
/// `PGHOST`, `PGPORT`, `PGDATABASE`, `PGUSER`, `PGPASSWORD`.
pub fn environment(host: &str, port: u16, name: &str, password: &str) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", connection_url(host, port, name, password)),
        ("PGHOST", bare_host(host).to_owned()),
        ("PGPORT", port.to_string()),
        ("PGDATABASE", name.to_owned()),
        ("PGUSER", name.to_owned()),
        ("PGPASSWORD", password.to_owned()),
    ]
}

/// `host` without the brackets of an IPv6 address written `[::1]`.
fn bare_host(host: &str) -> &str {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// `host` as a URL's authority has it: an IPv6 address in brackets.
fn url_host(host: &str) -> String {
    let host = bare_host(host);
    if host.contains(':') { format!("[{host}]") } else { host.to_owned() }
}

/// Every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The refusal for a failure talking to the server at `admin`'s endpoint: by SQLSTATE for the
/// server's errors, `database-endpoint-unreachable` for connection and I/O failures. Messages
/// carry the server's message, never a statement (one may hold a password).
fn refusal(admin: &Admin, doing: &str, err: tokio_postgres::Error) -> Refusal {
    let endpoint = format!("{}:{}", url_host(&admin.host), admin.port);
    if let Some(db) = err.as_db_error() {
        let code = db.code().code();
        let data = json!({ "endpoint": endpoint, "sqlstate": code });
        return match code {
            // invalid_password, invalid_authorization_specification (no pg_hba.conf entry,
            // a role that may not log in, a server that wants TLS)
            "28P01" | "28000" => Refusal::new(
                "database-admin-rejected",
                format!("the PostgreSQL server at {endpoint} refused the admin credential ({}): {}", admin.user, db.message()),
            )
            .with_data(data),
            "42501" => Refusal::new(
                "database-admin-insufficient",
                format!("the admin role {} may not {doing} on the PostgreSQL server at {endpoint}: {}", admin.user, db.message()),
            )
            .with_data(data),
            // too many connections, the server starting up or shutting down, a lock or a
            // statement timing out, a serialization failure: asking again may pass
            "53300" | "57P03" | "57P01" | "57P02" | "55P03" | "57014" | "40001" | "40P01" => {
                provider_failed(&endpoint, doing, db.message(), data).retryable()
            }
            _ => provider_failed(&endpoint, doing, db.message(), data),
        };
    }
    let mut reason = err.to_string();
    let mut source = std::error::Error::source(&err);
    let mut io = false;
    while let Some(cause) = source {
        io |= cause.is::<std::io::Error>();
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        source = cause.source();
    }
    if io || err.is_closed() || reason.starts_with("timeout") {
        return Refusal::new(
            "database-endpoint-unreachable",
            format!("cannot {doing}: the PostgreSQL server at {endpoint} cannot be reached ({reason})"),
        )
        .with_data(json!({ "endpoint": endpoint }))
        .retryable();
    }
    provider_failed(&endpoint, doing, &reason, json!({ "endpoint": endpoint, "sqlstate": null }))
}

fn provider_failed(endpoint: &str, doing: &str, reason: &str, data: serde_json::Value) -> Refusal {
    Refusal::new("database-provider-failed", format!("the PostgreSQL server at {endpoint} failed to {doing}: {reason}")).with_data(data)
}

/// A connection to the `postgres` database as the admin. The connection's task ends when the
/// client is dropped.
async fn connect(admin: &Admin) -> Result<Client> {
    connect_to(admin, "postgres").await
}

/// A connection to `database` as the admin.
async fn connect_to(admin: &Admin, database: &str) -> Result<Client> {
    let mut config = Config::new();
    config
        .host(bare_host(&admin.host))
        .port(admin.port)
        .user(&admin.user)
        .password(admin.password.as_bytes())
        .dbname(database)
        .application_name("capstan")
        // no statement of Capstan's waits forever on a lock or a busy server
        .options("-c lock_timeout=30s -c statement_timeout=120s")
        .connect_timeout(CONNECT_TIMEOUT);
    let (client, connection) = config.connect(NoTls).await.map_err(|err| refusal(admin, "connect", err))?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %err, "PostgreSQL admin connection ended with an error");
        }
    });
    Ok(client)
}

/// Connect as the admin and read the server's version and the admin's attributes. Refuses
/// `database-admin-insufficient` naming what the admin lacks (`CREATEROLE`, `CREATEDB`; a
/// superuser lacks nothing) and `database-provider-failed` for a server older than PostgreSQL 13.
pub async fn check(admin: &Admin) -> Result<ServerInfo> {
    let client = connect(admin).await?;
    let row = client
        .query_one(
            "SELECT current_setting('server_version'), current_setting('server_version_num')::int, \
                    r.rolsuper, r.rolcreaterole, r.rolcreatedb \
             FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(|err| refusal(admin, "read its version and the admin's attributes", err))?;
    let info =
        ServerInfo { version: row.get(0), version_num: row.get(1), superuser: row.get(2), create_role: row.get(3), create_db: row.get(4) };
    if info.version_num < MIN_SERVER_VERSION {
        return Err(Refusal::new("database-provider-failed", format!("PostgreSQL {} is too old: Capstan needs 13 or later", info.version))
            .with_data(json!({ "version": info.version, "sqlstate": null })));
    }
    let mut missing = Vec::new();
    if !info.superuser && !info.create_role {
        missing.push("CREATEROLE");
    }
    if !info.superuser && !info.create_db {
        missing.push("CREATEDB");
    }
    if !missing.is_empty() {
        return Err(Refusal::new(
            "database-admin-insufficient",
            format!("the admin role {} lacks {} on the PostgreSQL server", admin.user, missing.join(" and ")),
        )
        .with_data(json!({ "missing": missing })));
    }
    Ok(info)
}

/// Run one statement as the admin; `doing` names it in a refusal.
async fn run(client: &Client, admin: &Admin, doing: &str, statement: &str) -> Result<()> {
    client.batch_execute(statement).await.map_err(|err| refusal(admin, doing, err))
}

/// The role `name`'s attributes Capstan cares about, when it exists: (superuser, replication or
/// bypassrls, can log in).
async fn role(client: &Client, admin: &Admin, name: &str) -> Result<Option<(bool, bool)>> {
    let row = client
        .query_opt("SELECT rolsuper OR rolreplication OR rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = $1", &[&name])
        .await
        .map_err(|err| refusal(admin, "read its roles", err))?;
    Ok(row.map(|row| (row.get(0), row.get(1))))
}

/// Make the admin a member of the role (PostgreSQL 15 and later want it of a `CREATEROLE` role
/// before it creates a database owned by the role, drops one or ends the role's sessions). A
/// membership it already has is a notice, not an error.
async fn grant_to_admin(client: &Client, admin: &Admin, quoted: &str) -> Result<()> {
    run(client, admin, "grant the admin membership in a binding's role", &format!("GRANT {quoted} TO CURRENT_USER")).await
}

/// Make sure the binding `name` is on the server: its role `LOGIN NOSUPERUSER NOCREATEDB
/// NOCREATEROLE NOINHERIT` with `password` (set again when the role exists: a new password
/// replaces the old at once), its database `name` owned by it, `CONNECT` on it for the role
/// alone. Idempotent; resumes wherever an earlier call stopped.
///
/// A role of that name that is a superuser or has `REPLICATION` or `BYPASSRLS` is not one
/// Capstan made: refused `database-provider-failed` and left alone.
pub async fn ensure(admin: &Admin, name: &str, password: &str) -> Result<()> {
    let quoted = ident(name)?;
    check_password(password)?;
    let client = connect(admin).await?;
    let attributes = "LOGIN NOCREATEDB NOCREATEROLE NOINHERIT";
    match role(&client, admin, name).await? {
        Some((true, _)) => {
            return Err(Refusal::new(
                "database-provider-failed",
                format!("the role {name} on the PostgreSQL server is privileged (superuser, replication or bypassrls): it is not a binding's role"),
            )
            .with_data(json!({ "name": name, "sqlstate": null })));
        }
        Some((false, _)) => {
            // NOSUPERUSER (and NOREPLICATION, NOBYPASSRLS) may be named in ALTER ROLE only by a
            // superuser; the role has none of them (checked above)
            let statement = Zeroizing::new(format!("ALTER ROLE {quoted} WITH {attributes} PASSWORD {}", *password_literal(password)));
            run(&client, admin, "set a binding role's attributes and password", &statement).await?;
        }
        None => {
            let statement = Zeroizing::new(format!(
                "CREATE ROLE {quoted} WITH {attributes} NOSUPERUSER NOREPLICATION NOBYPASSRLS PASSWORD {}",
                *password_literal(password)
            ));
            match client.batch_execute(&statement).await {
                Ok(()) => {}
                // created meanwhile by a concurrent call: set its password as for one that was there
                Err(err) if err.code().is_some_and(|c| c.code() == "42710") => {
                    let statement =
                        Zeroizing::new(format!("ALTER ROLE {quoted} WITH {attributes} PASSWORD {}", *password_literal(password)));
                    run(&client, admin, "set a binding role's attributes and password", &statement).await?;
                }
                Err(err) => return Err(refusal(admin, "create a binding's role", err)),
            }
        }
    }
    grant_to_admin(&client, admin, &quoted).await?;

    let owner: Option<String> = client
        .query_opt("SELECT pg_get_userbyid(datdba)::text FROM pg_database WHERE datname = $1", &[&name])
        .await
        .map_err(|err| refusal(admin, "read its databases", err))?
        .map(|row| row.get(0));
    match owner {
        // CREATE DATABASE cannot run in a transaction (batch_execute sends one simple query)
        None => match client.batch_execute(&format!("CREATE DATABASE {quoted} OWNER {quoted}")).await {
            Ok(()) => {}
            // created meanwhile by a concurrent call
            Err(err) if err.code().is_some_and(|c| c.code() == "42P04") => {}
            Err(err) => return Err(refusal(admin, "create a binding's database", err)),
        },
        Some(owner) if owner == name => {}
        Some(_) => {
            run(&client, admin, "give a binding's database to its role", &format!("ALTER DATABASE {quoted} OWNER TO {quoted}")).await?
        }
    }
    run(
        &client,
        admin,
        "restrict who may connect to a binding's database",
        &format!("REVOKE ALL ON DATABASE {quoted} FROM PUBLIC; GRANT CONNECT ON DATABASE {quoted} TO {quoted}"),
    )
    .await?;
    own_public_schema(&client, admin, name, &quoted).await?;
    tracing::info!(name, "PostgreSQL binding ensured: role and database");
    Ok(())
}

/// Give the binding's role its database's `public` schema. From PostgreSQL 15 on the schema
/// belongs to `pg_database_owner`, whose privileges the database's owner has by inheritance
/// only: a `NOINHERIT` role could not create a table in it. The admin makes the role the
/// schema's owner, the role inheriting for that one statement (an admin that is not a superuser
/// reaches `pg_database_owner` only through it). A crash in between leaves a role that inherits
/// and has no roles to inherit from; the next [`ensure`] sets `NOINHERIT` first. Before 15 the
/// schema belongs to the bootstrap superuser and `PUBLIC` may create in it: left as it is.
async fn own_public_schema(client: &Client, admin: &Admin, name: &str, quoted: &str) -> Result<()> {
    let database = connect_to(admin, name).await?;
    let owner: Option<String> = database
        .query_opt("SELECT pg_get_userbyid(nspowner)::text FROM pg_namespace WHERE nspname = 'public'", &[])
        .await
        .map_err(|err| refusal(admin, "read a binding database's schemas", err))?
        .map(|row| row.get(0));
    if owner.as_deref() != Some("pg_database_owner") {
        return Ok(());
    }
    run(client, admin, "let a binding's role inherit for a moment", &format!("ALTER ROLE {quoted} WITH INHERIT")).await?;
    let given = database
        .batch_execute(&format!("ALTER SCHEMA public OWNER TO {quoted}"))
        .await
        .map_err(|err| refusal(admin, "give a binding's role its public schema", err));
    run(client, admin, "stop a binding's role inheriting", &format!("ALTER ROLE {quoted} WITH NOINHERIT")).await?;
    given
}

/// `NOLOGIN` for the role and its sessions ended, again until none is left (for up to 5 s).
async fn stop_sessions(client: &Client, admin: &Admin, name: &str, quoted: &str) -> Result<()> {
    // a role the admin is not a member of (its grant lost with a crash) cannot be signalled
    grant_to_admin(client, admin, quoted).await?;
    run(client, admin, "stop a binding role's logins", &format!("ALTER ROLE {quoted} WITH NOLOGIN")).await?;
    let deadline = tokio::time::Instant::now() + TERMINATE_WAIT;
    loop {
        let rows = client
            .query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1 AND pid <> pg_backend_pid()", &[&name])
            .await
            .map_err(|err| refusal(admin, "end a binding role's sessions", err))?;
        if rows.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Refusal::new(
                "database-provider-failed",
                format!("sessions of the role {name} were still open {} s after being ended", TERMINATE_WAIT.as_secs()),
            )
            .with_data(json!({ "name": name, "sessions": rows.len(), "sqlstate": null }))
            .retryable());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Stop the binding's credentials at once: its role may no longer log in (`NOLOGIN`) and every
/// session of it is ended (`pg_terminate_backend`, again until none is left, for up to 5 s).
/// The role and the database stay ([`drop`] removes them). A role that is not there is fine.
pub async fn revoke(admin: &Admin, name: &str) -> Result<()> {
    let quoted = ident(name)?;
    let client = connect(admin).await?;
    if role(&client, admin, name).await?.is_none() {
        return Ok(());
    }
    stop_sessions(&client, admin, name, &quoted).await?;
    tracing::info!(name, "PostgreSQL binding revoked: no logins, sessions ended");
    Ok(())
}

/// Remove the binding's database and its role, the role's sessions ended first.
/// Idempotent: what is not there is fine.
pub async fn drop(admin: &Admin, name: &str) -> Result<()> {
    let quoted = ident(name)?;
    let client = connect(admin).await?;
    let present = role(&client, admin, name).await?.is_some();
    if present {
        // its sessions in other databases (`postgres`) too: none outlives its role
        stop_sessions(&client, admin, name, &quoted).await?;
    }
    run(&client, admin, "drop a binding's database", &format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")).await?;
    if present && let Err(err) = client.batch_execute(&format!("DROP ROLE IF EXISTS {quoted}")).await {
        // dependent_objects_still_exist: what it owns or was granted here (in the postgres
        // database) goes first; other databases are the operator's
        if err.code().is_some_and(|c| c.code() == "2BP01") {
            run(&client, admin, "drop what a binding's role owns", &format!("DROP OWNED BY {quoted}")).await?;
            run(&client, admin, "drop a binding's role", &format!("DROP ROLE IF EXISTS {quoted}")).await?;
        } else {
            return Err(refusal(admin, "drop a binding's role", err));
        }
    }
    tracing::info!(name, "PostgreSQL binding dropped: database and role");
    Ok(())
}

/// What of the binding `name` is on the server.
pub async fn exists(admin: &Admin, name: &str) -> Result<Presence> {
    ident(name)?;
    let client = connect(admin).await?;
    let row = client
        .query_one(
            "SELECT (SELECT rolcanlogin FROM pg_roles WHERE rolname = $1), \
                    EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)",
            &[&name],
        )
        .await
        .map_err(|err| refusal(admin, "read its roles and databases", err))?;
    let login: Option<bool> = row.get(0);
    Ok(Presence { role: login.is_some(), database: row.get(1), login: login.unwrap_or(false) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_names_are_safe_identifiers() {
        let id = "bnd_0123456789abcdef0123456789abcdef";
        assert_eq!(binding_name(id).unwrap(), format!("capstan_{id}"));
        assert_eq!(binding_name("Web-DB").unwrap(), "capstan_web_db");
        assert!(valid_name(&binding_name(id).unwrap()));
        for bad in ["", "a b", "a\"b", "a;b", "é", "x'y", &"a".repeat(56)] {
            let refusal = binding_name(bad).unwrap_err();
            assert!(refusal.is("binding-name-invalid"), "{bad}: {refusal:?}");
        }
        assert_eq!(binding_name(&"a".repeat(55)).unwrap().len(), 63);
    }

    #[test]
    fn identifiers_are_checked_then_quoted() {
        assert_eq!(ident("capstan_x").unwrap(), "\"capstan_x\"");
        assert_eq!(ident("select").unwrap(), "\"select\"");
        for bad in ["", "Capstan", "1abc", "a-b", "a\"b", &"a".repeat(64)] {
            assert!(ident(bad).unwrap_err().is("binding-name-invalid"), "{bad}");
        }
    }

    #[test]
    fn literals_are_escaped() {
        assert_eq!(*literal("abc123"), "E'abc123'");
        assert_eq!(*literal("it's"), "E'it''s'");
        assert_eq!(*literal(r"a\'; DROP ROLE x; --"), r"E'a\\''; DROP ROLE x; --'");
        assert!(check_password("").is_err());
        assert!(check_password("a\0b").is_err());
        assert!(check_password("Abc123").is_ok());
    }

    #[test]
    fn scram_verifiers_are_postgresqls() {
        // computed with Python's hashlib (pbkdf2_hmac, hmac, sha256) for this password and salt
        assert_eq!(
            *scram_verifier("Abc123", b"0123456789abcdef"),
            "SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$l6KmDpaZ33vJXx64X6SfxjzYvoOlmPMb4Kz67wkX30w=:\
             126DgoAqctRGKvAc18Ww2iXzQdyggP1ySG6Y5EqqCAQ="
        );
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        // a key longer than a block is hashed first (RFC 4231, test case 6)
        let key = [0xaau8; 131];
        let mac = hmac(&key, b"Test Using Larger Than Block-Size Key - Hash Key First");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
        let literal = password_literal("Abc123");
        assert!(literal.starts_with("E'SCRAM-SHA-256$4096:") && !literal.contains("Abc123"), "{}", *literal);
        assert_eq!(*password_literal("pässword"), "E'pässword'");
    }

    #[test]
    fn urls_encode_credentials_and_bracket_ipv6() {
        assert_eq!(connection_url("db.example", 5432, "capstan_x", "Abc123"), "postgres://capstan_x:Abc123@db.example:5432/capstan_x");
        assert_eq!(
            connection_url("::1", 5433, "capstan_x", "p@ss:w/rd%?#"),
            "postgres://capstan_x:p%40ss%3Aw%2Frd%25%3F%23@[::1]:5433/capstan_x"
        );
        assert_eq!(connection_url("[fd00::2]", 5432, "n", "p"), "postgres://n:p@[fd00::2]:5432/n");
    }

    #[test]
    fn environment_names_everything_libpq_reads() {
        let env = environment("[::1]", 5432, "capstan_x", "Abc123");
        let get = |key: &str| env.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str()).unwrap();
        assert_eq!(get("DATABASE_URL"), "postgres://capstan_x:Abc123@[::1]:5432/capstan_x");
        assert_eq!(get("PGHOST"), "::1");
        assert_eq!(get("PGPORT"), "5432");
        assert_eq!(get("PGDATABASE"), "capstan_x");
        assert_eq!(get("PGUSER"), "capstan_x");
        assert_eq!(get("PGPASSWORD"), "Abc123");
        assert_eq!(env.len(), 6);
    }

    #[test]
    fn admin_debug_redacts_the_password() {
        let admin =
            Admin { host: "127.0.0.1".into(), port: 5432, user: "capstan_admin".into(), password: Zeroizing::new("hunter2-secret".into()) };
        let shown = format!("{admin:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("capstan_admin") && shown.contains("<redacted>"), "{shown}");
    }
}
