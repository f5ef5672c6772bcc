//! Jump codes (`node_jump_codes`): `nodes.createJumpCommand` mints a single-use code of 16
//! characters from `[A-Za-z0-9]` (the OS generator) and keeps only its SHA-256; the script
//! `/jump/<code>` serves installs the agent and enrolls it with the code on stdin only.

use super::{Context, NODE_JUMP_CODES, check_name, emit, sha256_hex, worker_hostname};
use crate::hostnames::hostname_in_use;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::{Entity, parse, to_value};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::Tx;
use rand::TryRngCore;
use rand::distr::{Alphanumeric, Distribution};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Characters in a jump code.
pub const CODE_LENGTH: usize = 16;
/// Minutes a code lives when the request names none.
pub const DEFAULT_TTL_MINUTES: u64 = 30;
/// The longest a code may live (24 hours).
pub const MAX_TTL_MINUTES: u64 = 1440;
/// The line before the enrollment step of the script.
pub const ENROLL_BEGIN: &str = "# -- enroll --";
/// The line after it.
pub const ENROLL_END: &str = "# -- end enroll --";
/// The line before the script's download step (fetch, verify, install the agent).
pub const DOWNLOAD_BEGIN: &str = "# -- download --";
/// The line after it.
pub const DOWNLOAD_END: &str = "# -- end download --";
/// The response header the agent binary's SHA-256 (lowercase hex) travels in; the script checks
/// its download against it before installing.
pub const BINARY_SHA256_HEADER: &str = "x-capstan-sha256";

/// A jump code as stored: never the code, only its hash (the document's id).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JumpCode {
    /// The cluster the machine joins.
    pub cluster_id: String,
    /// The node's name when the command names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Whether the script renames the machine `worker-<name>` (asked for with the name only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub set_hostname: bool,
    /// When it stops working (milliseconds since the epoch).
    pub expires_at: u64,
    /// The administrator who created it.
    pub created_by: String,
    /// When (milliseconds since the epoch).
    pub created_at: u64,
    /// When an enrollment used it (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_at: Option<u64>,
    /// The enrollment it made: `{requestSha256, answer}`, for an exact replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrollment: Option<Value>,
}

impl JumpCode {
    /// Unused and not expired at `now`.
    pub fn usable(&self, now: u64) -> bool {
        self.used_at.is_none() && now < self.expires_at
    }

    /// The hostname the script gives the machine, when the command asked for one.
    pub fn hostname(&self) -> Option<String> {
        self.node_name.as_deref().filter(|_| self.set_hostname).map(worker_hostname)
    }
}

/// Input of `nodes.createJumpCommand`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateInput {
    /// The cluster the machine joins.
    pub cluster_id: String,
    /// The node's name (1–48 of a-z 0-9 -); without it the node is named after the machine's
    /// hostname.
    pub node_name: Option<String>,
    /// Rename the machine `worker-<nodeName>` in the script (default false: the machine keeps its
    /// hostname). Needs `nodeName`.
    #[serde(default)]
    pub set_hostname: bool,
    /// How long the code works: 1–1440 minutes (default 30).
    pub ttl_minutes: Option<u64>,
}

/// Answer of `nodes.createJumpCommand`: the code, shown this once.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    /// The 16-character code; Capstan keeps only its SHA-256.
    pub code: String,
    /// The command to run on the new machine: `curl -fsSL '<url>' | sudo bash`.
    pub command: String,
    /// `<origin>/jump/<code>`: a landing page for a browser, the script for curl.
    pub url: String,
    /// `<origin>/jump/<code>/setup.sh`: always the script.
    pub script_url: String,
    /// When the code stops working (milliseconds since the epoch).
    pub expires_at: u64,
}

/// A new code: 16 characters of `[A-Za-z0-9]` from the OS generator.
pub fn new_code() -> String {
    let mut rng = rand::rngs::OsRng.unwrap_err();
    Alphanumeric.sample_iter(&mut rng).take(CODE_LENGTH).map(char::from).collect()
}

/// Whether `code` has the shape of a code (anything else is never looked up).
pub fn is_code(code: &str) -> bool {
    code.len() == CODE_LENGTH && code.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The one refusal for an unknown, expired or used code (HTTP 404), whatever the reason.
pub fn invalid_code() -> Refusal {
    Refusal::new("jump-code-invalid", "this jump code is unknown, expired or already used")
}

/// `public-origin-not-https` unless the public origin may carry a script: `https`, or any in dev
/// mode.
pub fn check_origin(cx: &Context) -> Result<()> {
    let origin = cx.public_origin.as_str();
    // the origin is pasted into the script between single quotes
    let quotable = !origin.is_empty() && origin.bytes().all(|b| b.is_ascii_graphic() && b != b'\'' && b != b'\\');
    if (cx.dev || origin.starts_with("https://")) && quotable {
        return Ok(());
    }
    Err(Refusal::new(
        "public-origin-not-https",
        "a machine fetches its setup script and agent from the public origin: set CAPSTAN_PUBLIC_ORIGIN to an https origin",
    ))
}

/// Read a code in `tx`: its stored record, when `code` has the shape of one and exists.
pub async fn find(tx: &Tx, code: &str) -> Result<Option<Entity<JumpCode>>> {
    if !is_code(code) {
        return Ok(None);
    }
    match tx.get(NODE_JUMP_CODES, &sha256_hex(code.as_bytes())).await? {
        Some(doc) => parse(&doc).map(Some),
        None => Ok(None),
    }
}

/// What the jump pages show: the cluster's name and the code's node name.
#[derive(Debug, Clone)]
pub struct Usable {
    /// The cluster's name.
    pub cluster_name: String,
    /// The node name the code carries.
    pub node_name: Option<String>,
    /// The hostname the script gives the machine, when the command asked for one.
    pub hostname: Option<String>,
}

/// The code, if it can be used now (and its cluster still exists); else `jump-code-invalid`.
pub async fn usable(cx: &Context, code: &str) -> Result<Usable> {
    let now = cx.clock.now_ms();
    cx.store
        .transact(|tx| async move {
            let found = find(&tx, code).await?.filter(|c| c.data.usable(now)).ok_or_else(invalid_code)?;
            let cluster = tx.get(capstan_inventory::CLUSTERS, &found.data.cluster_id).await?.ok_or_else(invalid_code)?;
            let cluster_name = cluster.data["name"].as_str().unwrap_or_default().to_string();
            let hostname = found.data.hostname();
            Ok(Usable { cluster_name, node_name: found.data.node_name, hostname })
        })
        .await
}

/// The command a person runs on the new machine.
pub fn command(origin: &str, code: &str) -> String {
    format!("curl -fsSL '{origin}/jump/{code}' | sudo bash")
}

/// The setup script for `code` (already judged usable), for the public origin.
pub fn script(cx: &Context, code: &str, usable: &Usable) -> String {
    let origin = &cx.public_origin;
    let mut out = String::new();
    out.push_str("#!/usr/bin/env bash\n");
    out.push_str(&format!("# Capstan: set this machine up as a node of the cluster {}.\n", usable.cluster_name));
    if dev_host(cx) {
        out.push_str(&format!("# DEV MODE: Capstan runs `serve --dev` and this script talks to it over plain http ({origin}).\n"));
    }
    out.push_str(
        r#"set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "capstan: run this as root (curl ... | sudo bash)" >&2
  exit 1
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64 | Linux-amd64) platform=linux-x86_64 ;;
  Linux-aarch64 | Linux-arm64) platform=linux-aarch64 ;;
  *)
    echo "capstan: no capstan-agent for $(uname -s) $(uname -m)" >&2
    exit 1
    ;;
esac

download="$(mktemp)"
headers="$(mktemp)"
trap 'rm -f "$download" "$headers"' EXIT
"#,
    );
    out.push_str(DOWNLOAD_BEGIN);
    out.push('\n');
    out.push_str(&download_step(origin));
    out.push_str(DOWNLOAD_END);
    out.push_str("\n\n");
    // the machine keeps its name unless the command asked for one
    if let Some(hostname) = &usable.hostname {
        out.push_str(&format!("hostnamectl set-hostname '{hostname}'\n\n"));
    }
    out.push_str("# the code travels on stdin only (printf is a builtin): never an argument, the environment or a file\n");
    out.push_str(ENROLL_BEGIN);
    out.push('\n');
    // only a dev host's script lets the agent talk plain http beyond loopback, and says so
    let dev_flag = if dev_host(cx) { "--dev-host " } else { "" };
    out.push_str(&format!("printf '%s\\n' '{code}' | capstan-agent enroll {dev_flag}'{origin}'\n"));
    out.push_str(ENROLL_END);
    out.push('\n');
    out.push_str(
        r#"
if [ ! -d /run/systemd/system ]; then
  echo "capstan: this machine is enrolled, but systemd does not run here: keep 'capstan-agent run' running as root yourself" >&2
  exit 1
fi

cat > /etc/systemd/system/capstan-agent.service <<'UNIT'
[Unit]
Description=Capstan node agent
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=/usr/local/bin/capstan-agent run
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now capstan-agent.service
echo "capstan: this machine is enrolled and capstan-agent.service runs"
"#,
    );
    out
}

/// Whether this host is a dev host serving over plain http (`serve --dev` without https).
pub fn dev_host(cx: &Context) -> bool {
    cx.dev && !cx.public_origin.starts_with("https://")
}

/// Fetch the agent for `$platform`, and install it only when it matches the SHA-256 the host
/// sent with it (a truncated or tampered download, or a host that sent no digest, stops here).
/// `-D` keeps the response headers; after redirects, the last response's value counts.
fn download_step(origin: &str) -> String {
    let mut out = format!("if ! curl -fsSL -D \"$headers\" '{origin}/agent/v1/binary/'\"$platform\" -o \"$download\"; then\n");
    out.push_str(&format!(
        "  echo \"capstan: {origin} hands out no capstan-agent for $platform: build it beside capstan on the Capstan host \
         (cargo build --release -p capstan-agent) or set CAPSTAN_AGENT_BINARY there\" >&2\n  exit 1\nfi\n"
    ));
    out.push_str(&format!(
        "expected=\"$(tr -d '\\r' < \"$headers\" | awk -F': *' 'tolower($1) == \"{BINARY_SHA256_HEADER}\" {{ v = tolower($2) }} END {{ print v }}')\"\n"
    ));
    out.push_str(&format!(
        r#"if [ "${{#expected}}" -ne 64 ] || [ -n "${{expected//[0-9a-f]/}}" ]; then
  echo "capstan: {origin} sent no {BINARY_SHA256_HEADER} header with capstan-agent, so the download cannot be verified: not installing it" >&2
  exit 1
fi
actual="$(sha256sum "$download" | cut -d' ' -f1)"
if [ "$actual" != "$expected" ]; then
  echo "capstan: the downloaded capstan-agent does not match the SHA-256 {origin} sent (got $actual, expected $expected): not installing it" >&2
  exit 1
fi
install -m 0755 "$download" /usr/local/bin/capstan-agent
"#
    ));
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// The landing page a browser gets at `/jump/<code>`.
pub fn landing_page(cx: &Context, code: &str, usable: &Usable) -> String {
    let dev = if dev_host(cx) {
        "<p><strong>Dev host:</strong> this Capstan runs <code>serve --dev</code>; the script and the agent talk to it over \
plain http (<code>capstan-agent enroll --dev-host</code>). Use it for trying Capstan out, never for machines that matter.</p>"
    } else {
        ""
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Join the cluster {cluster}</title>\
<meta name=\"referrer\" content=\"no-referrer\"></head><body><main>\
<h1>Join the cluster {cluster}</h1>{dev}\
<p>Run this on the new machine, as a user who may use sudo. The code works once.</p>\
<pre><code>{command}</code></pre></main></body></html>\n",
        cluster = escape(&usable.cluster_name),
        command = escape(&command(&cx.public_origin, code)),
    )
}

async fn create(cx: Context, call: Call, input: CreateInput) -> Result<Created> {
    let by = call.identity()?.user_id.clone();
    check_origin(&cx)?;
    let ttl = input.ttl_minutes.unwrap_or(DEFAULT_TTL_MINUTES);
    if !(1..=MAX_TTL_MINUTES).contains(&ttl) {
        return Err(Refusal::invalid_field("ttlMinutes", format!("ttlMinutes is 1–{MAX_TTL_MINUTES}")));
    }
    if let Some(name) = &input.node_name {
        check_name("nodeName", name)?;
    }
    if input.set_hostname && input.node_name.is_none() {
        return Err(Refusal::invalid_field("setHostname", "setHostname renames the machine worker-<nodeName>: name the node too"));
    }
    let code = new_code();
    let hash = sha256_hex(code.as_bytes());
    let now = cx.clock.now_ms();
    let record = JumpCode {
        cluster_id: input.cluster_id.clone(),
        node_name: input.node_name.clone(),
        set_hostname: input.set_hostname,
        expires_at: now + ttl * 60_000,
        created_by: by,
        created_at: now,
        used_at: None,
        enrollment: None,
    };
    let (record_ref, hash_ref) = (&record, &hash);
    cx.store
        .transact(|tx| async move {
            capstan_inventory::clusters::require_cluster(&tx, &record_ref.cluster_id).await?;
            if let Some(hostname) = record_ref.hostname()
                && hostname_in_use(&tx, &record_ref.cluster_id, &hostname, None, None, now).await?
            {
                return Err(in_use(&hostname, "nodeName"));
            }
            tx.insert(NODE_JUMP_CODES, hash_ref, to_value(record_ref)?).await?;
            emit(
                &tx,
                "node.jumpCodeCreated",
                &record_ref.cluster_id,
                json!({ "clusterId": record_ref.cluster_id, "nodeName": record_ref.node_name, "expiresAt": record_ref.expires_at }),
            )
            .await
        })
        .await?;
    tracing::info!(cluster = %record.cluster_id, expires_at = record.expires_at, "jump command created");
    let url = format!("{}/jump/{code}", cx.public_origin);
    Ok(Created {
        command: command(&cx.public_origin, &code),
        script_url: format!("{url}/setup.sh"),
        url,
        code,
        expires_at: record.expires_at,
    })
}

/// `hostname-in-use` naming the hostname and the field that asked for it.
pub fn in_use(hostname: &str, field: &str) -> Refusal {
    Refusal::new("hostname-in-use", format!("another node of the cluster carries or is meant to carry {hostname}"))
        .with_data(json!({ "hostname": hostname, "field": field }))
}

/// Register `nodes.createJumpCommand`.
pub fn register(registry: &mut Registry, cx: Context) {
    registry
        .with(cx)
        .add(
            "nodes.createJumpCommand",
            "A single-use jump code (shown once) and the command that makes a machine a node of the cluster",
            Access::Admin,
            create,
        )
        .refuses(&["public-origin-not-https", "name-invalid", "cluster-not-found", "hostname-in-use"]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_sixteen_alphanumerics_and_distinct() {
        let codes: std::collections::BTreeSet<String> = (0..200).map(|_| new_code()).collect();
        assert_eq!(codes.len(), 200);
        assert!(codes.iter().all(|c| is_code(c)));
        assert!(!is_code("short") && !is_code("aaaaaaaaaaaaaaa-") && !is_code(&"a".repeat(17)));
    }

    #[tokio::test]
    async fn the_script_enrolls_with_the_code_on_stdin_only() {
        let dir = tempfile::tempdir().unwrap();
        let cx = crate::testing::context(dir.path(), "https://capstan.example", false).await;
        let usable = Usable { cluster_name: "prod".into(), node_name: Some("gras".into()), hostname: Some("worker-gras".into()) };
        let script = script(&cx, "AbCdEfGh12345678", &usable);
        assert!(script.starts_with("#!/usr/bin/env bash\n"));
        assert!(script.contains("\nset -euo pipefail\n"));
        assert!(script.contains("hostnamectl set-hostname 'worker-gras'"));
        let step: Vec<&str> = script.lines().skip_while(|l| *l != ENROLL_BEGIN).skip(1).take_while(|l| *l != ENROLL_END).collect();
        assert_eq!(step, vec!["printf '%s\\n' 'AbCdEfGh12345678' | capstan-agent enroll 'https://capstan.example'"]);
        assert_eq!(script.matches("AbCdEfGh12345678").count(), 1, "the code appears in the printf alone");
        assert!(!script.contains("DEV MODE"));
        assert!(script.contains("capstan-agent run") && script.contains("systemctl enable --now capstan-agent.service"));
        assert!(script.contains("curl -fsSL -D \"$headers\" 'https://capstan.example/agent/v1/binary/'\"$platform\""));
        let download = lines_between(&script, DOWNLOAD_BEGIN, DOWNLOAD_END);
        let verified = download.find("sha256sum").unwrap();
        assert!(download.find("install -m 0755").unwrap() > verified, "the download is checked before it is installed");

        let page = landing_page(&cx, "AbCdEfGh12345678", &usable);
        assert!(
            page.contains("Join the cluster prod")
                && page.contains("curl -fsSL &#39;https://capstan.example/jump/AbCdEfGh12345678&#39; | sudo bash")
        );
    }

    #[tokio::test]
    async fn a_dev_host_script_says_so_and_a_named_node_keeps_the_machine_s_hostname() {
        let dir = tempfile::tempdir().unwrap();
        let cx = crate::testing::context(dir.path(), "http://192.168.1.20:8080", true).await;
        let usable = Usable { cluster_name: "lab".into(), node_name: Some("lan-1".into()), hostname: None };
        let dev = script(&cx, "AbCdEfGh12345678", &usable);
        assert!(dev.contains("# DEV MODE"));
        assert!(!dev.contains("hostnamectl"), "a name alone never renames the machine");
        let step = lines_between(&dev, ENROLL_BEGIN, ENROLL_END);
        assert_eq!(step, "printf '%s\\n' 'AbCdEfGh12345678' | capstan-agent enroll --dev-host 'http://192.168.1.20:8080'\n");
        assert!(landing_page(&cx, "AbCdEfGh12345678", &usable).contains("Dev host:"));

        // an https dev host is no dev host to the agent
        let other = tempfile::tempdir().unwrap();
        let cx = crate::testing::context(other.path(), "https://capstan.example", true).await;
        assert!(!lines_between(&script(&cx, "AbCdEfGh12345678", &usable), ENROLL_BEGIN, ENROLL_END).contains("--dev-host"));
    }

    /// The lines between `begin` and `end`.
    fn lines_between(script: &str, begin: &str, end: &str) -> String {
        let lines: Vec<&str> = script.lines().skip_while(|l| *l != begin).skip(1).take_while(|l| *l != end).collect();
        assert!(!lines.is_empty(), "the script has a step between {begin:?} and {end:?}");
        lines.join("\n") + "\n"
    }

    /// What the script's download step did, run by bash with `curl` answering `headers` and
    /// `body` and `install` recording what it would install.
    #[cfg(target_os = "linux")]
    struct Ran {
        ok: bool,
        stderr: String,
        installed: Option<Vec<u8>>,
    }

    #[cfg(target_os = "linux")]
    fn run_download(download: &str, headers: &str, body: &[u8]) -> Ran {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("served-headers"), headers).unwrap();
        std::fs::write(dir.path().join("served-body"), body).unwrap();
        // the stand-ins write where the step's -D and -o say, so those flags are what is tested
        let program = format!(
            r#"set -euo pipefail
platform=linux-x86_64
download="$DIR/download"
headers="$DIR/headers"
curl() {{
  while [ $# -gt 0 ]; do
    case "$1" in
      -D) cp "$DIR/served-headers" "$2"; shift ;;
      -o) cp "$DIR/served-body" "$2"; shift ;;
    esac
    shift
  done
}}
install() {{ cp "$3" "$DIR/installed"; }}
{download}"#
        );
        let out = std::process::Command::new("bash").arg("-c").arg(program).env("DIR", dir.path()).output().expect("bash runs");
        Ran {
            ok: out.status.success(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            installed: std::fs::read(dir.path().join("installed")).ok(),
        }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_script_installs_the_agent_only_when_its_sha256_matches_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let cx = crate::testing::context(dir.path(), "https://capstan.example", false).await;
        let script = script(&cx, "AbCdEfGh12345678", &Usable { cluster_name: "prod".into(), node_name: None, hostname: None });
        let download = lines_between(&script, DOWNLOAD_BEGIN, DOWNLOAD_END);
        let body = b"\x7fELF the agent".as_slice();
        let digest = sha256_hex(body);

        // HTTP/1 header lines end in CRLF, names in any case; after a redirect, the last answer counts
        let served = format!(
            "HTTP/1.1 302 Found\r\nX-Capstan-Sha256: {}\r\nlocation: /x\r\n\r\nHTTP/1.1 200 OK\r\nX-Capstan-SHA256: {}\r\n\r\n",
            "0".repeat(64),
            digest.to_uppercase()
        );
        let ran = run_download(&download, &served, body);
        assert!(ran.ok, "{}", ran.stderr);
        assert_eq!(ran.installed.as_deref(), Some(body), "the verified download is installed");

        let other = sha256_hex(b"another file");
        let ran = run_download(&download, &format!("HTTP/2 200\r\n{BINARY_SHA256_HEADER}: {other}\r\n\r\n"), body);
        assert!(!ran.ok && ran.installed.is_none(), "a mismatch installs nothing");
        assert!(ran.stderr.contains("does not match the SHA-256 https://capstan.example sent"), "{}", ran.stderr);

        for headers in
            ["HTTP/2 200\r\ncontent-length: 16\r\n\r\n", &format!("HTTP/2 200\r\n{BINARY_SHA256_HEADER}: {}\r\n\r\n", &digest[1..])]
        {
            let ran = run_download(&download, headers, body);
            assert!(!ran.ok && ran.installed.is_none(), "no usable digest installs nothing: {headers:?}");
            assert!(ran.stderr.contains("sent no x-capstan-sha256 header"), "{}", ran.stderr);
        }
    }

    #[tokio::test]
    async fn only_https_origins_carry_a_script_outside_dev_mode() {
        let dir = tempfile::tempdir().unwrap();
        let mut cx = crate::testing::context(dir.path(), "http://capstan.example", false).await;
        assert_eq!(check_origin(&cx).unwrap_err().code, "public-origin-not-https");
        cx.dev = true;
        check_origin(&cx).unwrap();
        cx.public_origin = "http://127.0.0.1:8080".into();
        let script = script(&cx, "AbCdEfGh12345678", &Usable { cluster_name: "prod".into(), node_name: None, hostname: None });
        assert!(script.contains("# DEV MODE") && !script.contains("hostnamectl"));
        cx.public_origin = "https://x.example/'; rm -rf /".into();
        assert_eq!(check_origin(&cx).unwrap_err().code, "public-origin-not-https");
    }
}
