//! The CLI as a client of the API: where the server is (`--url`, `CAPSTAN_URL`), which token to
//! send (`CAPSTAN_TOKEN`, else the one `capstan login` stored), one call, and `login` / `logout`.
//!
//! The token is never a flag (argv is visible to every user through `ps`) and never printed.
//! Stored tokens live in `$XDG_CONFIG_HOME/capstan/credentials.json` (else
//! `~/.config/capstan/credentials.json`), mode 0600 in a 0700 directory, as `{ "<url>": "<token>" }`.

use super::refuse;
use crate::refusal::{Refusal, Result};
use capstan_core::private_file;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::{Value, json};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::DirBuilder;
use std::io::{BufRead, IsTerminal, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use zeroize::Zeroizing;

/// Where the CLI looks for Capstan when neither `--url` nor `CAPSTAN_URL` says.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";
/// The environment variable holding a token (a session JWT).
pub const TOKEN_ENV: &str = "CAPSTAN_TOKEN";
const CREDENTIALS_FILE: &str = "credentials.json";
/// The largest answer the client reads.
const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;
/// The largest password read from standard input.
const MAX_PASSWORD_BYTES: u64 = 4096;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle connection is kept for the next call: under the host's head timeout.
const POOL_IDLE: Duration = Duration::from_secs(20);
/// A whole call, upload included (an install compiles the component on the server).
const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// Exit status for a refusal.
const EXIT_REFUSED: u8 = 1;

/// Which server a client command talks to.
#[derive(clap::Args, Debug, Clone)]
pub struct Connection {
    /// The Capstan server's URL. The token comes from CAPSTAN_TOKEN, else from `capstan login`
    #[arg(long, value_name = "URL", env = "CAPSTAN_URL", default_value = DEFAULT_URL)]
    pub url: String,
}

/// What every client command takes: the server, and whether to print the API's answer exactly.
#[derive(clap::Args)]
pub struct Common {
    #[command(flatten)]
    pub connection: Connection,
    /// Print the API's answer exactly, as one line of JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct LoginArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// The user to log in as (asked on the terminal when absent)
    #[arg(long, value_name = "NAME")]
    pub username: Option<String>,
    /// Read the password from standard input (needed when standard input is not a terminal)
    #[arg(long, conflicts_with = "oidc")]
    pub password_stdin: bool,
    /// Sign in through the identity provider the server is configured with, in a browser: the
    /// command listens on a loopback port for the browser to come back (docs/identity.md)
    #[arg(long, conflicts_with = "username")]
    pub oidc: bool,
    /// With --oidc: print the sign-in address instead of opening a browser
    #[arg(long, requires = "oidc")]
    pub no_browser: bool,
    /// Print exact JSON instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct LogoutArgs {
    #[command(flatten)]
    pub connection: Connection,
    /// Print exact JSON instead of text
    #[arg(long)]
    pub json: bool,
}

/// Print a client command's outcome: exit 0, or the refusal (as `{ok:false,error}` with --json).
pub fn finish(result: Result<()>, json: bool) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(refusal) if json => {
            print_json(&json!({ "ok": false, "error": refusal }));
            ExitCode::from(super::exit_status(&refusal, EXIT_REFUSED))
        }
        Err(refusal) => refuse(&refusal, EXIT_REFUSED),
    }
}

/// Print a machine answer: `value` as JSON on one line, or as `--output` chose.
pub fn print_json(value: &Value) {
    super::output::print(value);
}

/// A new mutation id for a call a person makes: `cli-` and 32 hex characters from the OS
/// generator (a retry of the same call sends the same one).
pub fn new_mutation_id() -> String {
    let bytes: [u8; 16] = rand::random();
    format!("cli-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// A string field of an answer for people; `-` when it is absent.
pub fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or("-")
}

/// The `items` of a list answer (none when it has none).
pub fn items(answer: &Value) -> &[Value] {
    answer["items"].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// Print `rows` under `header` for people: columns padded to their widest cell, the last one
/// left as it is.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    print!("{}", table(header, rows));
}

/// [`print_table`]'s text: one line per row, each ending in a newline.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            let width = widths.get(i).copied().unwrap_or(0);
            out.push_str(&format!("{cell:<width$}  "));
        }
        text.push_str(out.trim_end());
        text.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    text
}

/// A moment (milliseconds since the epoch, as every moment the API answers) as UTC text; `?`
/// when absent.
pub fn utc(at: Option<u64>) -> String {
    let Some(at) = at else { return "?".into() };
    i64::try_from(at)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| at.to_string())
}

// ---- the server's URL ----

/// The canonical form of a server URL (`http(s)://host[:port][/prefix]`, no trailing slash): the
/// key of the stored credentials and the base of every call.
pub fn normalize_url(text: &str) -> Result<String> {
    let invalid = |why: &str| {
        Refusal::new("url-invalid", format!("the server URL {text:?} {why} (--url or CAPSTAN_URL, e.g. {DEFAULT_URL})"))
            .with_data(json!({ "url": text.chars().take(200).collect::<String>() }))
    };
    let url = reqwest::Url::parse(text.trim()).map_err(|_| invalid("is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("must start with http:// or https://"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("must not carry credentials"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("must not have a query or a fragment"));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

// ---- stored credentials ----

/// `$XDG_CONFIG_HOME/capstan/credentials.json`, else `$HOME/.config/capstan/credentials.json`.
pub fn credentials_path() -> Result<PathBuf> {
    let absolute = |var: &str| std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_absolute());
    let config = absolute("XDG_CONFIG_HOME").or_else(|| absolute("HOME").map(|home| home.join(".config"))).ok_or_else(|| {
        Refusal::new(
            "config-dir-unknown",
            "neither XDG_CONFIG_HOME nor HOME is set to an absolute path, so there is nowhere to keep credentials; set CAPSTAN_TOKEN instead",
        )
    })?;
    Ok(config.join("capstan").join(CREDENTIALS_FILE))
}

/// The tokens `capstan login` stored, one per server URL.
#[derive(Debug, Default)]
pub struct Credentials {
    path: PathBuf,
    tokens: BTreeMap<String, String>,
}

impl Drop for Credentials {
    fn drop(&mut self) {
        for token in self.tokens.values_mut() {
            zeroize::Zeroize::zeroize(token);
        }
    }
}

impl Credentials {
    /// Read the file at `path` under the private-file rules (a missing file is empty).
    pub fn load(path: &Path) -> Result<Credentials> {
        let mut credentials = Credentials { path: path.to_path_buf(), tokens: BTreeMap::new() };
        let bytes = match private_file::read_strict(path) {
            Ok(bytes) => Zeroizing::new(bytes),
            Err(refusal) if refusal.is("input-missing") => return Ok(credentials),
            Err(refusal) => return Err(refusal),
        };
        let invalid = || {
            Refusal::new(
                "credentials-invalid",
                format!("{} is not a JSON object of server URLs to tokens; delete it and log in again", path.display()),
            )
            .with_data(json!({ "path": path.display().to_string() }))
        };
        let value: Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
        let Value::Object(entries) = value else { return Err(invalid()) };
        for (url, token) in entries {
            let Value::String(token) = token else { return Err(invalid()) };
            credentials.tokens.insert(url, token);
        }
        Ok(credentials)
    }

    pub fn get(&self, url: &str) -> Option<&str> {
        self.tokens.get(url).map(String::as_str)
    }

    pub fn set(&mut self, url: &str, token: &str) {
        if let Some(mut old) = self.tokens.insert(url.to_string(), token.to_string()) {
            zeroize::Zeroize::zeroize(&mut old);
        }
    }

    /// Forget the token for `url`; whether there was one.
    pub fn remove(&mut self, url: &str) -> bool {
        match self.tokens.remove(url) {
            Some(mut old) => {
                zeroize::Zeroize::zeroize(&mut old);
                true
            }
            None => false,
        }
    }

    /// Write the file atomically (a new same-directory file, mode 0600, renamed into place),
    /// creating its directory (mode 0700) when missing.
    pub fn save(&self) -> Result<()> {
        let failed = |what: &str, e: std::io::Error| {
            Refusal::new("credentials-write-failed", format!("{what} {} failed: {}", self.path.display(), e.kind()))
                .with_data(json!({ "path": self.path.display().to_string() }))
        };
        let dir = self.path.parent().ok_or_else(|| failed("finding the directory of", std::io::ErrorKind::NotFound.into()))?;
        DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| failed("creating the directory of", e))?;
        let text = Zeroizing::new(serde_json::to_vec_pretty(&self.tokens).map_err(Refusal::internal)?);
        let mut bytes = text.to_vec();
        bytes.push(b'\n');
        let bytes = Zeroizing::new(bytes);
        private_file::replace_atomically(&self.path, &bytes, 0o600).map_err(|e| failed("replacing", e))
    }
}

// ---- the client ----

/// Where a client's token came from (to say what to do when it is refused).
#[derive(Debug, Clone, PartialEq)]
enum TokenSource {
    None,
    Env,
    File(PathBuf),
}

/// A client of one Capstan server: blocking calls over an async HTTP client on a private
/// single-threaded runtime.
pub struct Client {
    url: String,
    token: Option<Zeroizing<String>>,
    source: TokenSource,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    /// A client with the token from CAPSTAN_TOKEN, else the stored one for this URL (if any).
    pub fn new(connection: &Connection) -> Result<Client> {
        let mut client = Client::anonymous(connection)?;
        if let Some(token) = std::env::var(TOKEN_ENV).ok().map(Zeroizing::new).filter(|t| !t.trim().is_empty()) {
            client.token = Some(Zeroizing::new(token.trim().to_string()));
            client.source = TokenSource::Env;
        } else {
            let path = credentials_path()?;
            let credentials = Credentials::load(&path)?;
            if let Some(token) = credentials.get(&client.url) {
                client.token = Some(Zeroizing::new(token.to_string()));
                client.source = TokenSource::File(path);
            }
        }
        Ok(client)
    }

    /// A client without a token (for `auth.login`).
    pub fn anonymous(connection: &Connection) -> Result<Client> {
        let url = normalize_url(&connection.url)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Refusal::internal(format!("starting the async runtime: {e}")))?;
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            // the host closes a connection idle for its 30 s head timeout; one idle past this is
            // not reused, so a call after a long pause (a plugin build) never writes into a
            // closed socket (an upload's body cannot be sent again)
            .pool_idle_timeout(POOL_IDLE)
            .user_agent(concat!("capstan-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Refusal::internal(format!("building the HTTP client: {e}")))?;
        Ok(Client { url, token: None, source: TokenSource::None, http, runtime })
    }

    /// The server's normalized URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The token sent, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_ref().map(|t| t.as_str())
    }

    /// Send `token` (a session opened with the machine token given) from now on.
    pub fn use_session(&mut self, token: &str) {
        self.token = Some(Zeroizing::new(token.to_string()));
    }

    /// Whether a token will be sent.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether the token comes from CAPSTAN_TOKEN (which a new `capstan login` would not replace).
    pub fn token_from_env(&self) -> bool {
        self.source == TokenSource::Env
    }

    /// `POST /api/v1/<method>` with `body`; the answer, or the server's refusal as a Refusal.
    pub fn call(&self, method: &str, body: &Value) -> Result<Value> {
        let body = serde_json::to_vec(body).map_err(Refusal::internal)?;
        self.call_raw(method, body)
    }

    /// The revision (or generation) a compare-and-swap write states: `given` when the caller
    /// named one, else the number `field` of what `method` answers for `body` now. Reading
    /// first does not weaken the check: a change between the read and the write is still
    /// refused `conflict` by the server.
    pub fn expected_or_current(&self, given: Option<u64>, method: &str, body: &Value, field: &str) -> Result<u64> {
        if let Some(given) = given {
            return Ok(given);
        }
        let current = self.call(method, body)?;
        current[field].as_u64().ok_or_else(|| {
            Refusal::new("response-invalid", format!("the answer of {method} holds no {field}"))
                .with_data(json!({ "method": method, "field": field }))
        })
    }

    /// `GET <path>` on the server (such as `/api/v1/methods`): the JSON answer.
    pub fn get(&self, path: &str) -> Result<Value> {
        self.send(self.http.get(format!("{}{path}", self.url)))
    }

    /// [`Client::call`] with an already encoded JSON body.
    pub fn call_raw(&self, method: &str, body: Vec<u8>) -> Result<Value> {
        let request = self.http.post(format!("{}/api/v1/{method}", self.url)).header(CONTENT_TYPE, "application/json");
        self.send(request.body(body))
    }

    /// `POST /api/v1/uploads/plugin-bundle` with the bundle's bytes: `{upload, bundle}`.
    pub fn upload_bundle(&self, bytes: Vec<u8>) -> Result<Value> {
        let request = self.http.post(format!("{}/api/v1/uploads/plugin-bundle", self.url)).header(CONTENT_TYPE, "application/octet-stream");
        self.send(request.body(bytes))
    }

    fn send(&self, mut request: reqwest::RequestBuilder) -> Result<Value> {
        if let Some(token) = &self.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", token.as_str()))
                .map_err(|_| Refusal::new("token-invalid", "the token has characters no HTTP header may carry"))?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
        }
        let url = self.url.clone();
        let answer = super::without_sigpipe(|| {
            self.runtime.block_on(async move {
                let response = request.send().await.map_err(|e| transport_refusal(&url, &e))?;
                let status = response.status().as_u16();
                let request_id = response.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_string);
                let body = read_limited(response).await.map_err(|e| transport_refusal(&url, &e))?;
                Ok::<_, Refusal>((status, request_id, body))
            })
        });
        let (status, request_id, body) = answer?;
        match decode_answer(status, &body) {
            Ok(value) => Ok(value),
            Err(mut refusal) => {
                if let Some(id) = request_id {
                    refusal.detail = Some(format!("request id {id}"));
                }
                if refusal.is("unauthenticated") {
                    refusal.message = format!("{} ({})", refusal.message, self.login_hint());
                }
                Err(refusal)
            }
        }
    }

    /// What to do when the server does not accept this client's token.
    fn login_hint(&self) -> String {
        match &self.source {
            TokenSource::None => format!("not logged in to {}: run `capstan login --url {}` or set {TOKEN_ENV}", self.url, self.url),
            TokenSource::Env => format!("the token in {TOKEN_ENV} was not accepted; it may have expired"),
            TokenSource::File(path) => format!(
                "the session stored in {} for {} has ended or is not valid; run `capstan login --url {}` again",
                path.display(),
                self.url,
                self.url
            ),
        }
    }
}

async fn read_limited(mut response: reqwest::Response) -> reqwest::Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
            // keep what fits: the decoder then refuses it as not JSON, naming the limit
            body.extend_from_slice(&chunk[..MAX_RESPONSE_BYTES - body.len()]);
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn transport_refusal(url: &str, e: &reqwest::Error) -> Refusal {
    let why = if e.is_timeout() {
        "it did not answer in time".to_string()
    } else if e.is_connect() {
        "the connection failed (is `capstan serve` running there?)".to_string()
    } else {
        "the request failed on the way".to_string()
    };
    let mut cause = String::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(err) = source {
        cause = err.to_string();
        source = err.source();
    }
    let code = if e.is_timeout() { "host-timeout" } else { "host-unreachable" };
    let mut refusal = Refusal::new(code, format!("cannot reach Capstan at {url}: {why}")).retryable().with_data(json!({ "url": url }));
    if !cause.is_empty() {
        refusal.detail = Some(cause);
    }
    refusal
}

/// A server answer: a 2xx JSON body as the value, or the error envelope as the same refusal.
pub fn decode_answer(status: u16, body: &[u8]) -> Result<Value> {
    if (200..300).contains(&status) {
        return serde_json::from_slice(body).map_err(|_| {
            Refusal::new("response-invalid", format!("the server answered HTTP {status} with a body that is not JSON"))
                .with_data(json!({ "status": status }))
        });
    }
    Err(refusal_from_envelope(status, body))
}

/// `{"error":{"code","message","retryable","data"?}}` back into the Refusal it was made from;
/// anything else is `response-invalid` naming the HTTP status.
pub fn refusal_from_envelope(status: u16, body: &[u8]) -> Refusal {
    let not_envelope = || {
        Refusal::new(
            "response-invalid",
            format!("the server answered HTTP {status} without Capstan's error envelope (is the URL a Capstan server?)"),
        )
        .with_data(json!({ "status": status }))
    };
    let Ok(Value::Object(mut top)) = serde_json::from_slice::<Value>(body) else { return not_envelope() };
    let Some(Value::Object(mut error)) = top.remove("error") else { return not_envelope() };
    let code = match error.remove("code") {
        Some(Value::String(code)) if is_code(&code) => code,
        _ => return not_envelope(),
    };
    let message = match error.remove("message") {
        Some(Value::String(message)) => message,
        _ => return not_envelope(),
    };
    let retryable = matches!(error.remove("retryable"), Some(Value::Bool(true)));
    let data = error.remove("data").filter(|d| !d.is_null()).map(Box::new);
    Refusal { code: Cow::Owned(code), message, retryable, data, detail: None, status: None }
}

fn is_code(code: &str) -> bool {
    code.len() <= 100
        && !code.is_empty()
        && code.split('-').all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
}

// ---- login / logout ----

pub fn login(args: LoginArgs) -> ExitCode {
    let json = args.json;
    finish(run_login(args), json)
}

fn run_login(args: LoginArgs) -> Result<()> {
    let client = Client::anonymous(&args.connection)?;
    let path = credentials_path()?;
    // a broken credentials file is found before asking anything
    let mut credentials = Credentials::load(&path)?;
    let stdin = std::io::stdin();
    let (username, password) = if args.password_stdin {
        let username = args.username.clone().ok_or_else(|| {
            Refusal::new("username-required", "with --password-stdin, name the user with --username (standard input carries the password)")
        })?;
        (username, read_password_stdin(&mut stdin.lock())?)
    } else {
        ask_on_terminal(&client, args.username.clone())?
    };
    let answer = log_in(&client, &mut credentials, &username, &password)?;
    report_login(&args, &client, &path, &answer, &username)
}

/// What a login prints: who, until when, where the token went.
pub fn report_login(args: &LoginArgs, client: &Client, path: &std::path::Path, answer: &Value, username: &str) -> Result<()> {
    let who = answer["username"].as_str().unwrap_or(username).to_string();
    let admin = answer["admin"].as_bool().unwrap_or(false);
    let expires_at = answer["expiresAt"].as_u64();
    if args.json {
        print_json(&json!({
            "ok": true,
            "url": client.url(),
            "username": who,
            "userId": answer["userId"],
            "admin": admin,
            "expiresAt": expires_at,
            "credentials": path.display().to_string(),
        }));
    } else {
        let role = if admin { " (administrator)" } else { "" };
        println!("logged in to {} as {who}{role}", client.url());
        if expires_at.is_some() {
            println!("  session until {}", utc(expires_at));
        }
        println!("  token stored in {} (mode 0600)", path.display());
    }
    Ok(())
}

/// Ask on the terminal for the username (unless given) and, without echo, the password;
/// refused `input-not-terminal` when standard input is not a terminal.
pub fn ask_on_terminal(client: &Client, username: Option<String>) -> Result<(String, Zeroizing<String>)> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Refusal::new(
            "input-not-terminal",
            "standard input is not a terminal, so the password cannot be asked for without echo; pipe it with --password-stdin (and --username)",
        ));
    }
    let username = match username {
        Some(name) => name,
        None => {
            eprint!("username: ");
            let _ = std::io::stderr().flush();
            let mut line = String::new();
            stdin
                .lock()
                .read_line(&mut line)
                .map_err(|e| Refusal::new("input-unreadable", format!("reading the username failed: {}", e.kind())))?;
            line.trim().to_string()
        }
    };
    let password = rpassword::prompt_password(format!("password for {username} at {}: ", client.url()))
        .map_err(|e| Refusal::new("input-unreadable", format!("reading the password from the terminal failed: {}", e.kind())))?;
    Ok((username, Zeroizing::new(password)))
}

/// `auth.login` at `client`'s server, keeping the session token in `credentials` (saved): the
/// login's answer, token included (never printed).
pub fn log_in(client: &Client, credentials: &mut Credentials, username: &str, password: &str) -> Result<Value> {
    if username.is_empty() {
        return Err(Refusal::new("username-required", "the username is empty"));
    }
    if password.is_empty() {
        return Err(Refusal::new("password-required", "the password is empty"));
    }
    #[derive(serde::Serialize)]
    struct LoginBody<'a> {
        username: &'a str,
        password: &'a str,
    }
    let body = serde_json::to_vec(&LoginBody { username, password }).map_err(Refusal::internal)?;
    let answer = client.call_raw("auth.login", body).map_err(|refusal| login_refusal(refusal, username, client.url()))?;
    let token = Zeroizing::new(
        answer["token"].as_str().ok_or_else(|| Refusal::new("response-invalid", "the login answer holds no token"))?.to_string(),
    );
    credentials.set(client.url(), &token);
    credentials.save()?;
    Ok(answer)
}

/// A refused login in words a person acts on: a wrong username or password says so, and too
/// many failed logins say how long to wait (the codes and data stay the host's).
fn login_refusal(refusal: Refusal, username: &str, url: &str) -> Refusal {
    let message = match refusal.code.as_ref() {
        "unauthenticated" => {
            format!("login failed: the username {username:?} and this password are not accepted at {url}; nothing was stored")
        }
        "rate-limited" => {
            let wait_ms = refusal.data.as_ref().and_then(|d| d["retryAfterMs"].as_u64()).unwrap_or(1000);
            let seconds = wait_ms.div_ceil(1000).max(1);
            let unit = if seconds == 1 { "second" } else { "seconds" };
            format!("too many failed logins for {username:?}: wait {seconds} {unit} before trying again")
        }
        _ => return refusal,
    };
    Refusal { message, ..refusal }
}

/// The password from standard input: everything up to the first line end (at most 4 KiB).
fn read_password_stdin(input: &mut impl Read) -> Result<Zeroizing<String>> {
    let mut raw = Zeroizing::new(Vec::new());
    input
        .take(MAX_PASSWORD_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(|e| Refusal::new("input-unreadable", format!("reading the password from standard input failed: {}", e.kind())))?;
    if raw.len() as u64 > MAX_PASSWORD_BYTES {
        return Err(Refusal::new("password-too-long", format!("the password on standard input is longer than {MAX_PASSWORD_BYTES} bytes")));
    }
    let end = raw.iter().position(|b| *b == b'\n').unwrap_or(raw.len());
    let line = raw[..end].strip_suffix(b"\r").unwrap_or(&raw[..end]);
    let text = std::str::from_utf8(line).map_err(|_| Refusal::new("password-invalid", "the password on standard input is not UTF-8"))?;
    Ok(Zeroizing::new(text.to_string()))
}

pub fn logout(args: LogoutArgs) -> ExitCode {
    let json = args.json;
    finish(run_logout(args), json)
}

fn run_logout(args: LogoutArgs) -> Result<()> {
    let client = Client::new(&args.connection)?;
    let ended = if client.has_token() {
        match client.call("auth.logout", &json!({})) {
            Ok(_) => Ok(true),
            // the session had already ended: forgetting it is all that is left
            Err(refusal) if refusal.is("unauthenticated") => Ok(false),
            Err(refusal) => Err(refusal),
        }
    } else {
        Ok(false)
    };
    let path = credentials_path()?;
    let mut credentials = Credentials::load(&path)?;
    let forgot = credentials.remove(client.url());
    if forgot {
        credentials.save()?;
    }
    let ended = ended?;
    if args.json {
        print_json(&json!({ "ok": true, "url": client.url(), "sessionEnded": ended, "forgotten": forgot }));
    } else {
        match (ended, forgot) {
            (true, _) => println!("logged out of {}", client.url()),
            (false, true) => println!("the session at {} had already ended; forgot its token", client.url()),
            (false, false) => println!("not logged in to {}", client.url()),
        }
        if std::env::var_os(TOKEN_ENV).is_some() {
            eprintln!("note: {TOKEN_ENV} is set in this environment; unset it too");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_login_says_what_to_do_and_keeps_the_code() {
        let wrong = login_refusal(Refusal::new("unauthenticated", "not authenticated"), "admin", "http://127.0.0.1:8080");
        assert_eq!(wrong.code, "unauthenticated");
        assert!(wrong.message.starts_with("login failed: the username \"admin\" and this password are not accepted"), "{}", wrong.message);
        let limited = Refusal::new("rate-limited", "slow down").with_data(serde_json::json!({ "retryAfterMs": 2500 })).retryable();
        let limited = login_refusal(limited, "admin", "http://127.0.0.1:8080");
        assert_eq!((limited.code.as_ref(), limited.retryable), ("rate-limited", true));
        assert_eq!(limited.message, "too many failed logins for \"admin\": wait 3 seconds before trying again");
        let other = login_refusal(Refusal::new("store-busy", "busy"), "admin", "http://x");
        assert_eq!(other.message, "busy", "other refusals pass as they are");
    }
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn times_read_as_utc() {
        assert_eq!(utc(Some(0)), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(Some(1_700_000_000_000)), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(Some(1_700_000_000_999)), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(Some(u64::MAX)), u64::MAX.to_string(), "beyond any date: the number as it is");
        assert_eq!(utc(None), "?");
    }

    #[test]
    fn credentials_round_trip_privately() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config").join("capstan").join(CREDENTIALS_FILE);
        let empty = Credentials::load(&path).unwrap();
        assert_eq!(empty.get("http://127.0.0.1:8080"), None, "a missing file holds nothing");

        let mut credentials = Credentials::load(&path).unwrap();
        credentials.set("http://127.0.0.1:8080", "token-one");
        credentials.set("https://capstan.example", "token-two");
        credentials.save().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let file: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(file, json!({ "http://127.0.0.1:8080": "token-one", "https://capstan.example": "token-two" }));

        let mut again = Credentials::load(&path).unwrap();
        assert_eq!(again.get("http://127.0.0.1:8080"), Some("token-one"));
        assert!(again.remove("http://127.0.0.1:8080"));
        assert!(!again.remove("http://127.0.0.1:8080"));
        again.set("https://capstan.example", "token-three");
        again.save().unwrap();
        let last = Credentials::load(&path).unwrap();
        assert_eq!(last.get("http://127.0.0.1:8080"), None);
        assert_eq!(last.get("https://capstan.example"), Some("token-three"));
        assert_eq!(mode(&path), 0o600);
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1, "no temporary file left");

        // a file others can read is refused, not used
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(Credentials::load(&path).unwrap_err().code, "input-permissions");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, b"[1,2]").unwrap();
        assert_eq!(Credentials::load(&path).unwrap_err().code, "credentials-invalid");
    }

    #[test]
    fn error_envelopes_become_the_same_refusal() {
        let body = json!({ "error": {
            "code": "capabilities-not-approved",
            "message": "the approval must be exactly the requested capabilities",
            "retryable": false,
            "data": { "missing": ["log"] },
        }});
        let refusal = decode_answer(400, body.to_string().as_bytes()).unwrap_err();
        assert_eq!(refusal.code, "capabilities-not-approved");
        assert_eq!(refusal.message, "the approval must be exactly the requested capabilities");
        assert!(!refusal.retryable);
        assert_eq!(refusal.data.as_deref(), Some(&json!({ "missing": ["log"] })));

        let busy = json!({ "error": { "code": "store-busy", "message": "try again", "retryable": true } });
        let refusal = refusal_from_envelope(503, busy.to_string().as_bytes());
        assert_eq!((refusal.code.as_ref(), refusal.retryable, refusal.data), ("store-busy", true, None));

        for (status, body) in [
            (502, &b"<html>bad gateway</html>"[..]),
            (400, br#"{"error":"nope"}"#),
            (400, br#"{"error":{"code":"Not Kebab","message":"x","retryable":false}}"#),
            (400, br#"{"error":{"code":"x-y","retryable":false}}"#),
        ] {
            let refusal = refusal_from_envelope(status, body);
            assert_eq!(refusal.code, "response-invalid", "{}", String::from_utf8_lossy(body));
            assert!(refusal.message.contains(&status.to_string()));
        }

        assert_eq!(decode_answer(200, br#"{"plugins":[]}"#).unwrap(), json!({ "plugins": [] }));
        assert_eq!(decode_answer(200, b"not json").unwrap_err().code, "response-invalid");
    }

    #[test]
    fn urls_are_normalized_and_checked() {
        assert_eq!(normalize_url("http://127.0.0.1:8080").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(normalize_url("http://127.0.0.1:8080/").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(normalize_url("HTTPS://Capstan.Example:443/").unwrap(), "https://capstan.example");
        assert_eq!(normalize_url("https://example.com/capstan/").unwrap(), "https://example.com/capstan");
        for bad in ["127.0.0.1:8080", "ftp://x", "http://u:p@x", "http://x/?a=1", ""] {
            assert_eq!(normalize_url(bad).unwrap_err().code, "url-invalid", "{bad}");
        }
    }

    #[test]
    fn a_password_on_stdin_ends_at_the_line_end() {
        let read = |bytes: &[u8]| read_password_stdin(&mut &bytes[..]).map(|p| p.to_string());
        assert_eq!(read(b"correct horse\n").unwrap(), "correct horse");
        assert_eq!(read(b"pw\r\nignored").unwrap(), "pw");
        assert_eq!(read(b"no newline").unwrap(), "no newline");
        assert_eq!(read(&[b'x'; 5000]).unwrap_err().code, "password-too-long");
        assert_eq!(read(&[0xff, 0xfe]).unwrap_err().code, "password-invalid");
    }

    #[test]
    fn an_unreachable_host_is_named() {
        // a port nothing listens on: bind one, then free it
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let connection = Connection { url: format!("http://127.0.0.1:{port}") };
        let client = Client::anonymous(&connection).unwrap();
        let refusal = client.call("auth.whoami", &json!({})).unwrap_err();
        assert_eq!(refusal.code, "host-unreachable");
        assert!(refusal.message.contains(&format!("http://127.0.0.1:{port}")), "{}", refusal.message);
        assert!(refusal.retryable);
    }
}
