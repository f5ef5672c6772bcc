//! Configuration of `capstan serve`: command-line flags, `CAPSTAN_*` environment variables and
//! an optional TOML file, in that order of precedence, over built-in defaults.
//!
//! Without `--dev` nothing is invented: a start missing a required value is refused
//! `config-missing`, naming every missing variable at once, before anything is opened.
//! With `--dev` the missing values get defaults under the data directory, and each default
//! chosen is reported so nothing is decided silently.

use crate::refusal::{Refusal, Result};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One configuration variable: its environment name, whether it is required, its default and
/// its help (its key in the `--config` file is [`Var::file_key`]).
pub struct Var {
    /// The environment variable's name, `CAPSTAN_…`.
    pub env: &'static str,
    /// Whether a start without `--dev` is refused `config-missing` when it has no value.
    pub required: bool,
    /// The default as `--help` shows it (`--dev:` marks one only dev mode chooses).
    pub default: &'static str,
    /// The one-line description `--help` shows.
    pub help: &'static str,
}

impl Var {
    /// The key in the `--config` file: the variable without `CAPSTAN_`, lower-cased.
    pub fn file_key(&self) -> String {
        self.env.trim_start_matches("CAPSTAN_").to_ascii_lowercase()
    }
}

/// Externally reachable origin of this Capstan; required without `--dev`.
pub const PUBLIC_ORIGIN: &str = "CAPSTAN_PUBLIC_ORIGIN";
/// Path to the private keyring file; required without `--dev`.
pub const KEYRING_PATH: &str = "CAPSTAN_KEYRING_PATH";
/// The document store, `sqlite:<path>` or `mongodb://…`; required without `--dev`.
pub const DATABASE_URL: &str = "CAPSTAN_DATABASE_URL";
/// The object storage, `file:<dir>` or `s3://<bucket>[/<prefix>]`; required without `--dev`.
pub const BLOB_URL: &str = "CAPSTAN_BLOB_URL";
/// MongoDB database name; by default the one the URL names, else `capstan`.
pub const DATABASE_NAME: &str = "CAPSTAN_DATABASE_NAME";
/// First-start administrator as `username:password`; never changes an existing user.
pub const ADMIN_ACCOUNT: &str = "CAPSTAN_ADMIN_ACCOUNT";
/// The bearer token `GET /metrics` answers to; without it `/metrics` is off.
pub const METRICS_TOKEN: &str = "CAPSTAN_METRICS_TOKEN";
/// This node's state directory (`--state-dir`); required without `--dev`.
pub const STATE_DIR: &str = "CAPSTAN_STATE_DIR";
/// Pins this node's id (`--node-id`); generated on first boot otherwise.
pub const NODE_ID: &str = "CAPSTAN_NODE_ID";
/// Node labels as `k=v,k2=v2` (`--node-labels`); replaces the file's `[node] labels`.
pub const NODE_LABELS: &str = "CAPSTAN_NODE_LABELS";
/// Comma-separated plugin publisher keys trusted by configuration.
pub const TRUSTED_PUBLISHERS: &str = "CAPSTAN_TRUSTED_PUBLISHERS";
/// Proxies whose `X-Forwarded-For` names a request's client: addresses and networks,
/// comma-separated (default none: the connection's peer is the client).
pub const TRUSTED_PROXIES: &str = "CAPSTAN_TRUSTED_PROXIES";
/// PEM file of extra root certificates for plugins' outbound HTTPS (`--plugin-http-ca-file`).
pub const PLUGIN_HTTP_CA_FILE: &str = "CAPSTAN_PLUGIN_HTTP_CA_FILE";
/// Networks plugins' outbound HTTP may reach although they are loopback, link-local or metadata.
pub const PLUGIN_HTTP_ALLOW: &str = "CAPSTAN_PLUGIN_HTTP_ALLOW";
/// PEM file of extra root certificates a deployment's route check trusts.
pub const ROUTE_CHECK_CA_FILE: &str = "CAPSTAN_ROUTE_CHECK_CA_FILE";
/// `host=address:port` pins for deployments' route checks, comma-separated.
pub const ROUTE_CHECK_RESOLVE: &str = "CAPSTAN_ROUTE_CHECK_RESOLVE";
/// With `--dev --demo`: the container engine the dev host's own node runs the demo on.
pub const DEV_ENGINE: &str = "CAPSTAN_DEV_ENGINE";
/// `registry=origin` pairs, comma-separated: image tags of that registry are resolved there.
pub const IMAGE_MIRRORS: &str = "CAPSTAN_IMAGE_MIRRORS";
/// The identity provider people sign in through (its issuer URL); unset: password login only.
pub const PLATFORM_OIDC_ISSUER: &str = "CAPSTAN_PLATFORM_OIDC_ISSUER";
/// Capstan's client id at that identity provider.
pub const PLATFORM_OIDC_CLIENT_ID: &str = "CAPSTAN_PLATFORM_OIDC_CLIENT_ID";
/// Capstan's client secret at that identity provider (never shown).
pub const PLATFORM_OIDC_CLIENT_SECRET: &str = "CAPSTAN_PLATFORM_OIDC_CLIENT_SECRET";
/// The scopes a platform login asks for, space-separated.
pub const PLATFORM_OIDC_SCOPES: &str = "CAPSTAN_PLATFORM_OIDC_SCOPES";
/// The claim naming a person's organizations.
pub const PLATFORM_OIDC_ORGANIZATION_CLAIM: &str = "CAPSTAN_PLATFORM_OIDC_ORGANIZATION_CLAIM";
/// The claim naming a person's application roles (`admin`: infrastructure administrator).
pub const PLATFORM_OIDC_ROLES_CLAIM: &str = "CAPSTAN_PLATFORM_OIDC_ROLES_CLAIM";
/// The name the dashboard's "Sign in with …" button shows.
pub const PLATFORM_OIDC_NAME: &str = "CAPSTAN_PLATFORM_OIDC_NAME";
/// `lan`, `wireguard` or `public` (`--network`); required when an address reaches beyond loopback.
pub const NETWORK: &str = "CAPSTAN_NETWORK";
/// `host:port` other nodes dial this one on; by default the listen address.
pub const ADVERTISE_ADDRESS: &str = "CAPSTAN_ADVERTISE_ADDRESS";
/// How often each node re-reads the fleet's records, in ms (default 30000, at least 100).
pub const NODE_REFRESH_MS: &str = "CAPSTAN_NODE_REFRESH_MS";
/// How often this node writes its heartbeat, in ms (default 30000, at least 100).
pub const HEARTBEAT_MS: &str = "CAPSTAN_HEARTBEAT_MS";
/// How recently a node must have been heard from to count as answering, in ms (default 90000).
pub const LIVENESS_WINDOW_MS: &str = "CAPSTAN_LIVENESS_WINDOW_MS";
/// Coordinator lease lifetime in ms (default 90000); no longer than the liveness window.
pub const LEASE_TTL_MS: &str = "CAPSTAN_LEASE_TTL_MS";
/// Address the HTTP API binds to (`--listen`, default `127.0.0.1:8080`).
pub const LISTEN: &str = "CAPSTAN_LISTEN";
/// `--dev` only: directory of the embedded store, blobs and keyring (default `./capstan-data`).
pub const DATA_DIR: &str = "CAPSTAN_DATA_DIR";
/// Log filter in tracing env-filter syntax (default `info`).
pub const LOG: &str = "CAPSTAN_LOG";
/// Log format, `human` or `json` (`--log-format`, default `human`).
pub const LOG_FORMAT: &str = "CAPSTAN_LOG_FORMAT";
/// Largest API request body accepted, in bytes (default 1048576, at least 1024).
pub const MAX_BODY_BYTES: &str = "CAPSTAN_MAX_BODY_BYTES";
/// Connections the listener keeps open at once (default 1024, at least 1); more wait for a
/// free one in the kernel's queue.
pub const MAX_CONNECTIONS: &str = "CAPSTAN_MAX_CONNECTIONS";
/// Bytes of request bodies held at once across every connection (default 67108864, at least
/// the largest body, `CAPSTAN_MAX_BODY_BYTES`); a body beyond it is refused `server-busy`.
pub const MAX_INFLIGHT_BODY_BYTES: &str = "CAPSTAN_MAX_INFLIGHT_BODY_BYTES";
/// Time a store transaction may spend retrying transient contention, in ms (default 5000).
pub const REQUEST_BUDGET_MS: &str = "CAPSTAN_REQUEST_BUDGET_MS";
/// How long a start waits for another process's migration lock, in ms (default 30000).
pub const MIGRATION_LOCK_WAIT_MS: &str = "CAPSTAN_MIGRATION_LOCK_WAIT_MS";
/// How often a gateway credential awaiting finalization is retried, in ms (default 30000, at
/// least 100).
pub const GATEWAY_RETRY_MS: &str = "CAPSTAN_GATEWAY_RETRY_MS";
/// How long a migration lock lives unless renewed, in ms (default 600000, at least 1000).
pub const MIGRATION_LOCK_TTL_MS: &str = "CAPSTAN_MIGRATION_LOCK_TTL_MS";

/// Every variable `capstan serve` reads. `--help` and README.md are checked against this list.
pub const VARS: &[Var] = &[
    Var {
        env: PUBLIC_ORIGIN,
        required: true,
        default: "--dev: http://<listen address>",
        help: "Externally reachable origin of this Capstan (scheme, host, optional port; no path), e.g. https://capstan.example.com",
    },
    Var {
        env: KEYRING_PATH,
        required: true,
        default: "--dev: <data dir>/keyring.json",
        help: "Path to the private keyring file (KEKs and the ingress recipient)",
    },
    Var {
        env: DATABASE_URL,
        required: true,
        default: "--dev: sqlite:<data dir>/capstan.sqlite",
        help: "Document store: sqlite:<path> (embedded) or mongodb://… (production)",
    },
    Var {
        env: BLOB_URL,
        required: true,
        default: "--dev: file:<data dir>/blobs",
        help: "Object storage: file:<dir> (embedded) or s3://<bucket>[/<prefix>] (production)",
    },
    Var {
        env: STATE_DIR,
        required: true,
        default: "--dev: the data dir",
        help: "This node's state directory (its identity, node.json); keep it across restarts and upgrades (--state-dir)",
    },
    Var { env: DATABASE_NAME, required: false, default: "the database the URL names, else capstan", help: "MongoDB database name" },
    Var {
        env: S3_ENDPOINT,
        required: false,
        default: "AWS S3",
        help: "S3-compatible endpoint URL, e.g. http://127.0.0.1:9000 (MinIO, Ceph, moto)",
    },
    Var { env: S3_REGION, required: false, default: "us-east-1", help: "S3 region" },
    Var { env: S3_ACCESS_KEY, required: false, default: "required with s3://", help: "S3 access key id" },
    Var { env: S3_SECRET_KEY, required: false, default: "required with s3://", help: "S3 secret access key (never logged or shown)" },
    Var {
        env: S3_FORCE_PATH_STYLE,
        required: false,
        default: "false",
        help: "true for path-style bucket addressing (most self-hosted S3 servers)",
    },
    Var {
        env: ADMIN_ACCOUNT,
        required: false,
        default: "none; --dev generates a password on first start",
        help: "First-start administrator as username:password (password at least 20 characters); never changes an existing user",
    },
    Var {
        env: METRICS_TOKEN,
        required: false,
        default: "none: GET /metrics is off",
        help: "Bearer token (at least 24 characters) a Prometheus scraper sends to GET /metrics; never logged or shown",
    },
    Var {
        env: NODE_ID,
        required: false,
        default: "generated on first boot",
        help: "Pin this node's id; a different id than the stored one gets a new key pair (--node-id)",
    },
    Var {
        env: NODE_LABELS,
        required: false,
        default: "none",
        help: "Node labels as k=v,k2=v2 (--node-labels k=v, repeatable); replaces the file's [node] labels",
    },
    Var {
        env: TRUSTED_PUBLISHERS,
        required: false,
        default: "none",
        help: "Plugin publisher keys trusted by configuration, comma-separated, as `capstan plugin keygen` prints them",
    },
    Var {
        env: TRUSTED_PROXIES,
        required: false,
        default: "none",
        help: "Reverse proxies whose X-Forwarded-For names the client (for login limits and logs): addresses or networks, comma-separated",
    },
    Var {
        env: DEV_ENGINE,
        required: false,
        default: "the first of DOCKER_HOST and the usual Docker and Podman sockets that exists",
        help: "With --dev --demo: the container engine (Docker Engine API, unix:// or http://) the dev host's own node runs the demo's app on (--engine)",
    },
    Var {
        env: IMAGE_MIRRORS,
        required: false,
        default: "none (each image's own registry)",
        help: "Registry mirrors the runtime asks what an image tag names, as registry=origin pairs, comma-separated (docker.io=https://mirror.example)",
    },
    Var {
        env: PLATFORM_OIDC_ISSUER,
        required: false,
        default: "none (password login only)",
        help: "Issuer URL of the OpenID Connect identity provider people sign in through (docs/identity.md); checked at start, failing closed",
    },
    Var {
        env: PLATFORM_OIDC_CLIENT_ID,
        required: false,
        default: "none (required with the issuer)",
        help: "Capstan's client id at the identity provider; register <public origin>/auth/oidc/callback as its redirect URI",
    },
    Var {
        env: PLATFORM_OIDC_CLIENT_SECRET,
        required: false,
        default: "none (required with the issuer)",
        help: "Capstan's client secret at the identity provider (never shown or logged)",
    },
    Var {
        env: PLATFORM_OIDC_SCOPES,
        required: false,
        default: "openid profile organizations roles",
        help: "The scopes a platform login asks for, space-separated; the issuer must advertise each",
    },
    Var {
        env: PLATFORM_OIDC_ORGANIZATION_CLAIM,
        required: false,
        default: "organizations",
        help: "The userinfo claim naming a person's organizations at the identity provider (and their owner role)",
    },
    Var {
        env: PLATFORM_OIDC_ROLES_CLAIM,
        required: false,
        default: "roles",
        help: "The userinfo claim naming a person's application roles; admin makes an infrastructure administrator",
    },
    Var {
        env: PLATFORM_OIDC_NAME,
        required: false,
        default: "the issuer's host",
        help: "The name the dashboard's \"Sign in with …\" button shows",
    },
    Var {
        env: PLUGIN_HTTP_CA_FILE,
        required: false,
        default: "none (the platform's roots only)",
        help: "PEM file of extra root certificates for plugins' outbound HTTPS, e.g. a private CA (--plugin-http-ca-file)",
    },
    Var {
        env: PLUGIN_HTTP_ALLOW,
        required: false,
        default: "none (--dev: 127.0.0.0/8, ::1)",
        help: "Loopback, link-local or metadata networks plugins' outbound HTTP may reach anyway, comma-separated (refused by default: a granted name could point there)",
    },
    Var {
        env: ROUTE_CHECK_CA_FILE,
        required: false,
        default: "none (the platform's roots only)",
        help: "PEM file of extra root certificates a deployment's route check trusts (deployments.promoteRoute), e.g. an internal CA",
    },
    Var {
        env: ROUTE_CHECK_RESOLVE,
        required: false,
        default: "none (DNS, public addresses only)",
        help: "host=address:port pins a deployment's route check dials instead of resolving the host, comma-separated (split-horizon DNS, a staging gateway)",
    },
    Var {
        env: NETWORK,
        required: false,
        default: "none (loopback only)",
        help: "lan, wireguard or public: required when the listen or advertised address reaches beyond loopback (--network)",
    },
    Var {
        env: ADVERTISE_ADDRESS,
        required: false,
        default: "the listen address (127.0.0.1 for a wildcard bind)",
        help: "host:port other nodes dial this one on",
    },
    Var { env: HEARTBEAT_MS, required: false, default: "30000", help: "How often this node beats its heartbeat" },
    Var {
        env: LIVENESS_WINDOW_MS,
        required: false,
        default: "90000",
        help: "A node heard from within this window is answering (live unless draining)",
    },
    Var { env: LEASE_TTL_MS, required: false, default: "90000", help: "Coordinator lease lifetime; at most the liveness window" },
    Var { env: NODE_REFRESH_MS, required: false, default: "30000", help: "How often each node re-reads the fleet's records" },
    Var {
        env: LISTEN,
        required: false,
        default: "127.0.0.1:8080",
        help: "Address the HTTP API binds to (use 0.0.0.0:8080 in a container)",
    },
    Var {
        env: DATA_DIR,
        required: false,
        default: "./capstan-data",
        help: "--dev only: directory holding the embedded store, blobs and keyring",
    },
    Var { env: LOG, required: false, default: "info", help: "Log filter (tracing env-filter syntax, e.g. info,capstan=debug)" },
    Var { env: LOG_FORMAT, required: false, default: "human", help: "Log format: human or json" },
    Var { env: MAX_BODY_BYTES, required: false, default: "1048576", help: "Largest API request body accepted, in bytes" },
    Var {
        env: MAX_CONNECTIONS,
        required: false,
        default: "1024",
        help: "Connections served at once; more wait for a free one (a slow client cannot hold them all)",
    },
    Var {
        env: MAX_INFLIGHT_BODY_BYTES,
        required: false,
        default: "67108864",
        help: "Bytes of request bodies held at once across all connections; beyond it a body is refused server-busy (retryable)",
    },
    Var {
        env: REQUEST_BUDGET_MS,
        required: false,
        default: "5000",
        help: "Time a store transaction may spend retrying transient contention, in milliseconds",
    },
    Var {
        env: MIGRATION_LOCK_WAIT_MS,
        required: false,
        default: "30000",
        help: "How long a start waits for another process's migration lock before refusing lock-timeout",
    },
    Var {
        env: GATEWAY_RETRY_MS,
        required: false,
        default: "30000",
        help: "How often a gateway credential the gateway issued but did not finalize is retried, in milliseconds",
    },
    Var {
        env: MIGRATION_LOCK_TTL_MS,
        required: false,
        default: "600000",
        help: "How long a migration lock lives unless renewed (a crashed holder blocks starts until then)",
    },
];

/// How log lines are written to stderr (`CAPSTAN_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Readable text lines, coloured on a terminal (the default).
    Human,
    /// One JSON object per line, with the current span's fields.
    Json,
}

/// What the command line said (flags win over everything else).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--dev`: embedded store and blobs, with missing values defaulted under the data directory.
    pub dev: bool,
    /// `--data-dir DIR`: where dev mode keeps its data; read only with `--dev`.
    pub data_dir: Option<PathBuf>,
    /// `--listen ADDR`: the address the HTTP API binds to.
    pub listen: Option<String>,
    /// `--config FILE`: the TOML file to read (else `CAPSTAN_CONFIG`).
    pub config_file: Option<PathBuf>,
    /// `--log-format FORMAT`: `human` or `json`.
    pub log_format: Option<String>,
    /// `--state-dir DIR`: this node's state directory.
    pub state_dir: Option<PathBuf>,
    /// `--node-id ID`: pins this node's id.
    pub node_id: Option<String>,
    /// `--node-labels k=v`, repeatable; replaces the environment's and the file's set.
    pub node_labels: Vec<String>,
    /// `--network NETWORK`: `lan`, `wireguard` or `public`.
    pub network: Option<String>,
    /// `--public-origin ORIGIN`: the origin people and machines reach this Capstan at.
    pub public_origin: Option<String>,
    /// `--plugin-http-ca-file FILE`
    pub plugin_http_ca_file: Option<PathBuf>,
    /// `--demo`: install demo data (with `--dev` only).
    pub demo: bool,
    /// `--engine ENDPOINT`: the engine the demo's node runs on (with `--demo` only).
    pub engine: Option<String>,
}

/// Which network a node beyond loopback is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// A local network.
    Lan,
    /// A WireGuard network; needs the key pair `capstan wg init` writes in the state directory.
    Wireguard,
    /// The public internet.
    Public,
}

impl Network {
    /// The name as configured and as this node registers it in the fleet.
    pub fn as_str(&self) -> &'static str {
        match self {
            Network::Lan => "lan",
            Network::Wireguard => "wireguard",
            Network::Public => "public",
        }
    }
}

/// Fleet membership settings.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// This node's state directory: its identity, WireGuard key pair and plugin cache.
    pub state_dir: PathBuf,
    /// The pinned node id (`CAPSTAN_NODE_ID`); without it the stored or a generated one is used.
    pub node_id: Option<String>,
    /// The node's labels, whole from one source: the flag, else the variable, else the file.
    pub labels: BTreeMap<String, String>,
    /// The network this node is on (`CAPSTAN_NETWORK`); required beyond loopback.
    pub network: Option<Network>,
    /// host:port other nodes dial
    pub advertise: Option<String>,
    /// Heartbeat, liveness window, lease lifetime and refresh interval.
    pub timing: crate::fleet::Timing,
}

/// The resolved configuration `capstan serve` runs with.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Dev mode: a missing keyring and first administrator are generated at start.
    pub dev: bool,
    /// `--dev --demo`: demo data installed once the host serves (see `crate::demo`).
    pub demo: bool,
    /// With `--demo`: the engine its node runs on, as given (`CAPSTAN_DEV_ENGINE`, `--engine`);
    /// `None`: found where engines usually listen.
    pub demo_engine: Option<String>,
    /// The dev-mode data directory (`CAPSTAN_DATA_DIR`); `None` without `--dev`.
    pub data_dir: Option<PathBuf>,
    /// Address the HTTP API binds to (`CAPSTAN_LISTEN`, default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// Externally reachable origin, without a trailing slash (`CAPSTAN_PUBLIC_ORIGIN`).
    pub public_origin: String,
    /// The private keyring file (`CAPSTAN_KEYRING_PATH`).
    pub keyring_path: PathBuf,
    /// The document store's URL (`CAPSTAN_DATABASE_URL`).
    pub database_url: String,
    /// The object storage's URL (`CAPSTAN_BLOB_URL`).
    pub blob_url: String,
    /// MongoDB database name (`CAPSTAN_DATABASE_NAME`), when set.
    pub database_name: Option<String>,
    /// S3 endpoint, region, credentials and addressing style (`CAPSTAN_S3_*`).
    pub s3: S3Settings,
    /// First administrator as `username:password` (`CAPSTAN_ADMIN_ACCOUNT`), never shown.
    pub admin_account: Option<SecretString>,
    /// The bearer token `GET /metrics` answers to (`CAPSTAN_METRICS_TOKEN`); `None`: it is off.
    pub metrics_token: Option<SecretString>,
    /// Fleet membership settings.
    pub node: NodeSettings,
    /// Log filter (`CAPSTAN_LOG`, default `info`).
    pub log_filter: String,
    /// Log format (`CAPSTAN_LOG_FORMAT`, default human).
    pub log_format: LogFormat,
    /// Largest API request body accepted, in bytes (`CAPSTAN_MAX_BODY_BYTES`, default 1 MiB).
    pub max_body_bytes: usize,
    /// Connections served at once (`CAPSTAN_MAX_CONNECTIONS`, default 1024).
    pub max_connections: usize,
    /// Request bodies held at once, in bytes (`CAPSTAN_MAX_INFLIGHT_BODY_BYTES`, default 64 MiB).
    pub max_inflight_body_bytes: usize,
    /// Time a store transaction may spend retrying contention (`CAPSTAN_REQUEST_BUDGET_MS`, default 5 s).
    pub request_budget: Duration,
    /// How long a start waits for another migration lock (`CAPSTAN_MIGRATION_LOCK_WAIT_MS`, default 30 s).
    pub migration_lock_wait: Duration,
    /// How long a migration lock lives unless renewed (`CAPSTAN_MIGRATION_LOCK_TTL_MS`, default 10 min).
    pub migration_lock_ttl: Duration,
    /// How often a pending gateway finalization is retried (`CAPSTAN_GATEWAY_RETRY_MS`, default 30 s).
    pub gateway_retry: Duration,
    /// Plugin publisher keys trusted by configuration, as given (checked at start).
    pub trusted_publishers: Vec<String>,
    /// Proxies whose `X-Forwarded-For` is believed (`CAPSTAN_TRUSTED_PROXIES`).
    pub trusted_proxies: crate::listener::TrustedProxies,
    /// Root certificates plugins' outbound HTTPS trusts besides the platform's.
    pub plugin_http_ca: Option<CaFile>,
    /// The platform login through an identity provider (`CAPSTAN_PLATFORM_OIDC_*`), when set.
    pub platform_oidc: Option<capstan_federation::Settings>,
    /// Registry mirrors image tags are resolved at (`CAPSTAN_IMAGE_MIRRORS`).
    pub image_mirrors: Vec<capstan_runtime::images::Mirror>,
    /// Networks plugins' outbound HTTP may reach despite the address guard
    /// (`CAPSTAN_PLUGIN_HTTP_ALLOW`).
    pub plugin_http_allow: Vec<capstan_core::net::IpNet>,
    /// How deployments' routes are checked (`CAPSTAN_ROUTE_CHECK_CA_FILE`, `…_RESOLVE`).
    pub route_check: capstan_registry::route_check::RouteCheck,
    /// `(variable, value)` for every default dev mode chose, to be reported at start.
    pub dev_defaults: Vec<(&'static str, String)>,
}

/// Extra roots of outbound HTTPS (`CAPSTAN_PLUGIN_HTTP_CA_FILE`, `CAPSTAN_ROUTE_CHECK_CA_FILE`),
/// read at start.
#[derive(Debug, Clone)]
pub struct CaFile {
    /// The PEM file the certificates were read from.
    pub path: PathBuf,
    /// At least one.
    pub certificates: Vec<reqwest::Certificate>,
    /// The file as read (checked above): what clients other than reqwest's are given.
    pub pem: Vec<u8>,
}

/// Largest CA file read (a full public bundle is about 200 KiB).
const MAX_CA_FILE_BYTES: u64 = 4 << 20;

/// Read a PEM file of root certificates named by `variable`. Refused `config-invalid`, naming
/// the variable and the file, when it cannot be read, is too large, is not PEM, holds no
/// certificate or holds one TLS cannot use as a root (`data.cause` says which).
pub fn read_ca_file(variable: &str, path: &Path) -> Result<CaFile> {
    let refuse = |cause: &str, why: String| {
        Refusal::new("config-invalid", format!("{variable}: {} {why}", path.display()))
            .with_data(json!({ "variable": variable, "cause": cause }))
    };
    let unreadable = |e: std::io::Error| refuse("ca-file-unreadable", format!("cannot be read: {}", e.kind()));
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_CA_FILE_BYTES + 1), &mut bytes).map_err(unreadable)?;
    if bytes.len() as u64 > MAX_CA_FILE_BYTES {
        return Err(refuse("ca-file-too-large", format!("is larger than {MAX_CA_FILE_BYTES} bytes")));
    }
    let certificates = reqwest::Certificate::from_pem_bundle(&bytes)
        .map_err(|_| refuse("ca-file-invalid", "is not a PEM file of certificates (a block does not decode)".into()))?;
    if certificates.is_empty() {
        return Err(refuse("ca-file-no-certificate", "holds no certificate (no -----BEGIN CERTIFICATE----- block)".into()));
    }
    // every certificate must be usable as a trust anchor, or the client could not be built
    reqwest::Client::builder()
        .tls_certs_only(certificates.iter().cloned())
        .build()
        .map_err(|_| refuse("ca-file-invalid", "holds a certificate that cannot be used as a root (not X.509 DER)".into()))?;
    Ok(CaFile { path: path.to_path_buf(), certificates, pem: bytes })
}

pub use capstan_blobs::{S3_ACCESS_KEY, S3_ENDPOINT, S3_FORCE_PATH_STYLE, S3_REGION, S3_SECRET_KEY, S3Settings};
pub use capstan_core::text::SecretString;

/// Read the `--config` TOML file into variable values, refusing unknown keys by name.
pub fn read_file(path: &Path) -> Result<BTreeMap<&'static str, String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Refusal::new("config-invalid", format!("cannot read the config file {}: {}", path.display(), e.kind())))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        Refusal::new("config-invalid", format!("config file {} is not valid TOML: {}", path.display(), e.message()))
    })?;
    let mut values = BTreeMap::new();
    let mut table = table;
    // `[node] labels = { k = "v" }` is the file's spelling of CAPSTAN_NODE_LABELS
    if let Some(toml::Value::Table(mut node)) = table.remove("node") {
        if let Some(labels) = node.remove("labels") {
            table.insert("node_labels".into(), labels);
        }
        if let Some((key, _)) = node.into_iter().next() {
            return Err(Refusal::new("config-invalid", format!("config file {}: unknown key node.{key}", path.display()))
                .with_data(json!({"key": format!("node.{key}")})));
        }
    }
    for (key, value) in table {
        let Some(var) = VARS.iter().find(|v| v.file_key() == key) else {
            let known: Vec<String> = VARS.iter().map(Var::file_key).collect();
            return Err(Refusal::new(
                "config-invalid",
                format!("config file {}: unknown key {key:?} (known: {})", path.display(), known.join(", ")),
            )
            .with_data(json!({"key": key})));
        };
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Table(t) if var.env == NODE_LABELS => {
                let mut pairs = Vec::new();
                for (k, v) in t {
                    let toml::Value::String(v) = v else {
                        return Err(Refusal::new(
                            "config-invalid",
                            format!("config file {}: node label {k} must be a string", path.display()),
                        ));
                    };
                    pairs.push(format!("{k}={v}"));
                }
                pairs.join(",")
            }
            toml::Value::Integer(i) => i.to_string(),
            other => {
                return Err(Refusal::new(
                    "config-invalid",
                    format!("config file {}: {key} must be a string or an integer, not {}", path.display(), other.type_str()),
                )
                .with_data(json!({"key": key})));
            }
        };
        values.insert(var.env, text);
    }
    Ok(values)
}

/// Resolve the configuration from flags, the environment and the file. Pure: opens nothing
/// except the config file and the CA file it names (`CAPSTAN_PLUGIN_HTTP_CA_FILE`), writes
/// nothing.
pub fn resolve(flags: &Flags, env: &BTreeMap<String, String>) -> Result<ServeConfig> {
    if flags.demo && !flags.dev {
        return Err(Refusal::new(
            "demo-requires-dev",
            "--demo installs demo data and a catalog key trusted on this host only: it runs only with --dev",
        ));
    }
    let file_path = flags.config_file.clone().or_else(|| env.get("CAPSTAN_CONFIG").filter(|v| !v.is_empty()).map(PathBuf::from));
    let file = match &file_path {
        Some(path) => read_file(path)?,
        None => BTreeMap::new(),
    };
    let lookup =
        |name: &str| -> Option<String> { env.get(name).filter(|v| !v.trim().is_empty()).cloned().or_else(|| file.get(name).cloned()) };
    let mut dev_defaults = Vec::new();
    let demo_engine = flags.engine.clone().or_else(|| lookup(DEV_ENGINE)).map(|e| e.trim().to_string());
    if let Some(engine) = &demo_engine {
        if !flags.demo {
            return Err(Refusal::new(
                "config-invalid",
                format!("{DEV_ENGINE} (--engine) is the engine of the demo's node: it needs --dev --demo"),
            ));
        }
        if !(engine.starts_with("unix:///") || engine.starts_with("http://")) {
            return Err(Refusal::new("config-invalid", format!("{DEV_ENGINE} (--engine) is unix:///path/to/socket or http://host:port")));
        }
    }

    let listen_text = flags.listen.clone().or_else(|| lookup(LISTEN)).unwrap_or_else(|| "127.0.0.1:8080".into());
    let listen: SocketAddr = listen_text
        .parse()
        .map_err(|_| Refusal::new("config-invalid", format!("{LISTEN} must be an address like 127.0.0.1:8080, not {listen_text:?}")))?;

    let data_dir = if flags.dev {
        let dir = match flags.data_dir.clone().or_else(|| lookup(DATA_DIR).map(PathBuf::from)) {
            Some(dir) => dir,
            None => {
                dev_defaults.push((DATA_DIR, "./capstan-data".to_string()));
                PathBuf::from("./capstan-data")
            }
        };
        Some(dir)
    } else {
        None
    };

    // Required values: from the sources, or (dev only) a default under the data dir.
    let mut missing = Vec::new();
    let mut required = |name: &'static str, dev_default: &dyn Fn(&Path) -> String| -> String {
        if let Some(value) = lookup(name) {
            return value;
        }
        match &data_dir {
            Some(dir) => {
                let value = dev_default(dir);
                dev_defaults.push((name, value.clone()));
                value
            }
            None => {
                missing.push(name);
                String::new()
            }
        }
    };
    let state_dir = match flags.state_dir.clone() {
        Some(dir) => dir.display().to_string(),
        None => required(STATE_DIR, &|d| d.display().to_string()),
    };
    // a wildcard bind is reached on loopback unless the operator names the address others use
    let reached = match listen.ip().is_unspecified() {
        true => SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), listen.port()),
        false => listen,
    };
    let public_origin = match flags.public_origin.clone() {
        Some(origin) => origin,
        None => required(PUBLIC_ORIGIN, &|_| format!("http://{reached}")),
    };
    let keyring_path = required(KEYRING_PATH, &|d| d.join("keyring.json").display().to_string());
    let database_url = required(DATABASE_URL, &|d| format!("sqlite:{}", d.join("capstan.sqlite").display()));
    let blob_url = required(BLOB_URL, &|d| format!("file:{}", d.join("blobs").display()));
    let s3 = S3Settings {
        endpoint: lookup(S3_ENDPOINT),
        region: lookup(S3_REGION).unwrap_or_else(|| "us-east-1".into()),
        access_key: lookup(S3_ACCESS_KEY),
        secret_key: lookup(S3_SECRET_KEY).map(SecretString::new),
        force_path_style: false,
    };
    if blob_url.starts_with("s3://") {
        if s3.access_key.is_none() {
            missing.push(S3_ACCESS_KEY);
        }
        if s3.secret_key.is_none() {
            missing.push(S3_SECRET_KEY);
        }
    }
    let platform_oidc = lookup(PLATFORM_OIDC_ISSUER).filter(|v| !v.trim().is_empty()).map(|issuer| {
        let client_id = lookup(PLATFORM_OIDC_CLIENT_ID).unwrap_or_default();
        let client_secret = lookup(PLATFORM_OIDC_CLIENT_SECRET).unwrap_or_default();
        if client_id.is_empty() {
            missing.push(PLATFORM_OIDC_CLIENT_ID);
        }
        if client_secret.is_empty() {
            missing.push(PLATFORM_OIDC_CLIENT_SECRET);
        }
        let host = url::Url::parse(&issuer).ok().and_then(|u| u.host_str().map(str::to_string)).unwrap_or_else(|| issuer.clone());
        capstan_federation::Settings {
            issuer: issuer.trim().to_string(),
            client_id,
            client_secret: SecretString::new(client_secret),
            scopes: lookup(PLATFORM_OIDC_SCOPES)
                .map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                .unwrap_or_else(|| capstan_federation::DEFAULT_SCOPES.iter().map(|s| s.to_string()).collect()),
            organization_claim: lookup(PLATFORM_OIDC_ORGANIZATION_CLAIM).unwrap_or_else(|| "organizations".into()),
            roles_claim: lookup(PLATFORM_OIDC_ROLES_CLAIM).unwrap_or_else(|| "roles".into()),
            display_name: lookup(PLATFORM_OIDC_NAME).unwrap_or(host),
            public_origin: public_origin.trim_end_matches('/').to_string(),
        }
    });
    if platform_oidc.as_ref().is_some_and(|s| !s.scopes.iter().any(|s| s == "openid")) {
        return Err(Refusal::new("config-invalid", format!("{PLATFORM_OIDC_SCOPES} must include openid")));
    }
    if !missing.is_empty() {
        return Err(Refusal::new(
            "config-missing",
            format!(
                "missing required configuration: {} (set them in the environment or the --config file, or run `capstan serve --dev` for embedded defaults)",
                missing.join(", ")
            ),
        )
        .with_data(json!({ "missing": missing })));
    }
    validate_origin(&public_origin)?;

    let log_format = match flags.log_format.clone().or_else(|| lookup(LOG_FORMAT)).as_deref().unwrap_or("human") {
        "human" => LogFormat::Human,
        "json" => LogFormat::Json,
        other => return Err(Refusal::new("config-invalid", format!("{LOG_FORMAT} must be human or json, not {other:?}"))),
    };
    let number = |name: &str, default: u64, min: u64| -> Result<u64> {
        match lookup(name) {
            None => Ok(default),
            Some(text) => match text.trim().parse::<u64>() {
                Ok(n) if n >= min => Ok(n),
                _ => Err(Refusal::new("config-invalid", format!("{name} must be a whole number of at least {min}, not {text:?}"))),
            },
        }
    };
    let force_path_style = match lookup(S3_FORCE_PATH_STYLE).as_deref().map(str::trim) {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(other) => return Err(Refusal::new("config-invalid", format!("{S3_FORCE_PATH_STYLE} must be true or false, not {other:?}"))),
    };
    let timing = crate::fleet::Timing {
        heartbeat: Duration::from_millis(number(HEARTBEAT_MS, 30_000, 100)?),
        liveness_window: Duration::from_millis(number(LIVENESS_WINDOW_MS, 90_000, 300)?),
        lease_ttl: Duration::from_millis(number(LEASE_TTL_MS, 90_000, 300)?),
        refresh: Duration::from_millis(number(NODE_REFRESH_MS, 30_000, 100)?),
    };
    if timing.lease_ttl > timing.liveness_window {
        return Err(Refusal::new(
            "config-invalid",
            format!("{LEASE_TTL_MS} may not be longer than {LIVENESS_WINDOW_MS}: a longer lease buys no failover time"),
        ));
    }
    let node = node_settings(flags, &lookup, listen, PathBuf::from(state_dir), timing)?;
    // dev mode serves one machine, where a catalog or gateway on loopback is the usual test
    let plugin_http_allow = match (lookup(PLUGIN_HTTP_ALLOW), flags.dev) {
        (Some(text), _) => text,
        (None, true) => {
            dev_defaults.push((PLUGIN_HTTP_ALLOW, "127.0.0.0/8, ::1".to_string()));
            "127.0.0.0/8, ::1".to_string()
        }
        (None, false) => String::new(),
    };
    let plugin_http_allow = capstan_core::net::parse_networks(&plugin_http_allow)
        .map_err(|e| Refusal::new("config-invalid", format!("{PLUGIN_HTTP_ALLOW}: {e}")))?;
    let plugin_http_ca = match flags.plugin_http_ca_file.clone().or_else(|| lookup(PLUGIN_HTTP_CA_FILE).map(PathBuf::from)) {
        Some(path) => Some(read_ca_file(PLUGIN_HTTP_CA_FILE, &path)?),
        None => None,
    };
    let route_check = capstan_registry::route_check::RouteCheck {
        extra_roots: match lookup(ROUTE_CHECK_CA_FILE) {
            Some(path) => read_ca_file(ROUTE_CHECK_CA_FILE, Path::new(&path))?.certificates,
            None => Vec::new(),
        },
        pinned: capstan_registry::route_check::parse_pins(&lookup(ROUTE_CHECK_RESOLVE).unwrap_or_default())
            .map_err(|e| Refusal::new("config-invalid", format!("{ROUTE_CHECK_RESOLVE}: {e}")))?,
    };
    Ok(ServeConfig {
        dev: flags.dev,
        demo: flags.demo,
        demo_engine,
        data_dir,
        listen,
        public_origin: public_origin.trim_end_matches('/').to_string(),
        keyring_path: PathBuf::from(keyring_path),
        database_url,
        blob_url,
        database_name: lookup(DATABASE_NAME),
        s3: S3Settings { force_path_style, ..s3 },
        admin_account: lookup(ADMIN_ACCOUNT).map(SecretString::new),
        metrics_token: metrics_token(lookup(METRICS_TOKEN))?,
        node,
        log_filter: lookup(LOG).unwrap_or_else(|| "info".into()),
        log_format,
        max_body_bytes: number(MAX_BODY_BYTES, 1024 * 1024, 1024)? as usize,
        max_connections: number(MAX_CONNECTIONS, 1024, 1)?.min(1 << 20) as usize,
        max_inflight_body_bytes: number(MAX_INFLIGHT_BODY_BYTES, 64 << 20, 1024)?.min(u32::MAX as u64) as usize,
        request_budget: Duration::from_millis(number(REQUEST_BUDGET_MS, 5000, 1)?),
        migration_lock_wait: Duration::from_millis(number(MIGRATION_LOCK_WAIT_MS, 30_000, 0)?),
        migration_lock_ttl: Duration::from_millis(number(MIGRATION_LOCK_TTL_MS, 600_000, 1000)?),
        gateway_retry: Duration::from_millis(number(GATEWAY_RETRY_MS, 30_000, 100)?),
        trusted_proxies: crate::listener::TrustedProxies::parse(&lookup(TRUSTED_PROXIES).unwrap_or_default())
            .map_err(|e| Refusal::new("config-invalid", format!("{TRUSTED_PROXIES}: {e}")))?,
        trusted_publishers: lookup(TRUSTED_PUBLISHERS)
            .map(|v| v.split(',').map(|k| k.trim().to_string()).filter(|k| !k.is_empty()).collect())
            .unwrap_or_default(),
        plugin_http_ca,
        platform_oidc,
        image_mirrors: capstan_runtime::images::parse_mirrors(&lookup(IMAGE_MIRRORS).unwrap_or_default())
            .map_err(|e| Refusal::new("config-invalid", format!("{IMAGE_MIRRORS}: {e}")))?,
        plugin_http_allow,
        route_check,
        dev_defaults,
    })
}

/// `CAPSTAN_METRICS_TOKEN`: a bearer secret, so a short or blank one is refused `config-invalid`
/// (without echoing it).
fn metrics_token(value: Option<String>) -> Result<Option<SecretString>> {
    let Some(value) = value else { return Ok(None) };
    let min = crate::metrics::MIN_TOKEN_CHARS;
    if value.trim() != value || value.chars().count() < min || value.chars().any(|c| c.is_control() || c == ' ') {
        return Err(Refusal::new(
            "config-invalid",
            format!("{METRICS_TOKEN} must be at least {min} characters without spaces (a scrape bearer token)"),
        ));
    }
    Ok(Some(SecretString::new(value)))
}

/// What `capstan fleet …` needs, reading the bucket directly: the bucket, and the liveness
/// window to judge nodes by.
pub struct BucketConfig {
    /// The blob URL (`CAPSTAN_BLOB_URL`; with `--dev`, `file:` under the data directory).
    pub url: String,
    /// S3 endpoint, region, credentials and addressing style, for an `s3://` URL.
    pub s3: S3Settings,
    /// How recently a node must have been heard from to count as answering (`CAPSTAN_LIVENESS_WINDOW_MS`).
    pub liveness_window: Duration,
}

/// Resolve only the bucket settings from flags, the environment and the file.
pub fn resolve_blobs(flags: &Flags, env: &BTreeMap<String, String>) -> Result<BucketConfig> {
    let file_path = flags.config_file.clone().or_else(|| env.get("CAPSTAN_CONFIG").filter(|v| !v.is_empty()).map(PathBuf::from));
    let file = match &file_path {
        Some(path) => read_file(path)?,
        None => BTreeMap::new(),
    };
    let lookup =
        |name: &str| -> Option<String> { env.get(name).filter(|v| !v.trim().is_empty()).cloned().or_else(|| file.get(name).cloned()) };
    let blob_url = match lookup(BLOB_URL) {
        Some(url) => url,
        None if flags.dev => {
            let dir =
                flags.data_dir.clone().or_else(|| lookup(DATA_DIR).map(PathBuf::from)).unwrap_or_else(|| PathBuf::from("./capstan-data"));
            format!("file:{}", dir.join("blobs").display())
        }
        None => {
            return Err(Refusal::new("config-missing", format!("missing required configuration: {BLOB_URL} (or --dev --data-dir DIR)"))
                .with_data(json!({ "missing": [BLOB_URL] })));
        }
    };
    let force_path_style = matches!(lookup(S3_FORCE_PATH_STYLE).as_deref().map(str::trim), Some("true" | "1"));
    let s3 = S3Settings {
        endpoint: lookup(S3_ENDPOINT),
        region: lookup(S3_REGION).unwrap_or_else(|| "us-east-1".into()),
        access_key: lookup(S3_ACCESS_KEY),
        secret_key: lookup(S3_SECRET_KEY).map(SecretString::new),
        force_path_style,
    };
    let liveness_window = match lookup(LIVENESS_WINDOW_MS) {
        None => crate::fleet::Timing::default().liveness_window,
        Some(text) => match text.trim().parse::<u64>() {
            Ok(ms) if ms >= 300 => Duration::from_millis(ms),
            _ => {
                return Err(Refusal::new(
                    "config-invalid",
                    format!("{LIVENESS_WINDOW_MS} must be a whole number of at least 300, not {text:?}"),
                ));
            }
        },
    };
    Ok(BucketConfig { url: blob_url, s3, liveness_window })
}

/// Parse `k=v` pairs: keys and values of letters, digits, `-`, `_`, `.`, `/`.
pub fn parse_labels<'a>(pairs: impl IntoIterator<Item = &'a str>) -> Result<BTreeMap<String, String>> {
    let ok = |s: &str| !s.is_empty() && s.len() <= 63 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    let mut labels = BTreeMap::new();
    for pair in pairs.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((k, v)) if ok(k) && ok(v) => {
                labels.insert(k.to_string(), v.to_string());
            }
            _ => {
                return Err(Refusal::new("invalid-input", format!("node label {pair:?} must be key=value (letters, digits, - _ . /)"))
                    .with_data(json!({ "field": "nodeLabels" })));
            }
        }
    }
    Ok(labels)
}

fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn node_settings(
    flags: &Flags,
    lookup: &dyn Fn(&str) -> Option<String>,
    listen: SocketAddr,
    state_dir: PathBuf,
    timing: crate::fleet::Timing,
) -> Result<NodeSettings> {
    let labels = if !flags.node_labels.is_empty() {
        parse_labels(flags.node_labels.iter().map(String::as_str))?
    } else {
        parse_labels(lookup(NODE_LABELS).unwrap_or_default().split(','))?
    };
    let network = match flags.network.clone().or_else(|| lookup(NETWORK)).as_deref().map(str::trim) {
        None => None,
        Some("lan") => Some(Network::Lan),
        Some("wireguard") => Some(Network::Wireguard),
        Some("public") => Some(Network::Public),
        Some(other) => {
            return Err(Refusal::new("invalid-input", format!("{NETWORK} must be lan, wireguard or public, not {other:?}"))
                .with_data(json!({"field": "network"})));
        }
    };
    let advertise = lookup(ADVERTISE_ADDRESS);
    // Reaching beyond loopback is a decision the operator states, never a default.
    let mut beyond = Vec::new();
    if !listen.ip().is_loopback() {
        beyond.push("listen");
    }
    if let Some(addr) = &advertise {
        let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr);
        if !is_loopback_host(host) {
            beyond.push("advertiseAddress");
        }
    }
    if network.is_none() && !beyond.is_empty() {
        return Err(Refusal::new(
            "invalid-input",
            format!("{} reach beyond loopback: state the network with --network lan|wireguard|public ({NETWORK})", beyond.join(" and ")),
        )
        .with_data(json!({ "fields": beyond })));
    }
    let node_id = flags.node_id.clone().or_else(|| lookup(NODE_ID));
    Ok(NodeSettings { state_dir, node_id, labels, network, advertise, timing })
}

fn validate_origin(origin: &str) -> Result<()> {
    let refuse = || {
        Err(Refusal::new(
            "config-invalid",
            format!(
                "{PUBLIC_ORIGIN} must be an origin like https://capstan.example.com or http://127.0.0.1:8080 (no path, query or credentials)"
            ),
        ))
    };
    let Some(rest) = origin.strip_prefix("https://").or_else(|| origin.strip_prefix("http://")) else {
        return refuse();
    };
    let host = rest.trim_end_matches('/');
    if host.is_empty() || host.contains(['/', '?', '#', '@', ' ']) {
        return refuse();
    }
    Ok(())
}

/// The `--help` text listing every variable with its default.
pub fn vars_help() -> String {
    let mut out = String::from("Configuration (flags > environment > --config file > defaults):\n");
    for var in VARS {
        let required = if var.required { "required without --dev; " } else { "" };
        out.push_str(&format!(
            "  {}\n      {}\n      [{}default: {}] [file key: {}]\n",
            var.env,
            var.help,
            required,
            var.default,
            var.file_key()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn full() -> BTreeMap<String, String> {
        env(&[
            (PUBLIC_ORIGIN, "https://capstan.example.com"),
            (KEYRING_PATH, "/etc/capstan/keyring.json"),
            (DATABASE_URL, "sqlite:/var/lib/capstan/db.sqlite"),
            (BLOB_URL, "file:/var/lib/capstan/blobs"),
            (STATE_DIR, "/var/lib/capstan/state"),
        ])
    }

    #[test]
    fn missing_required_values_are_all_named_at_once() {
        let err = resolve(&Flags::default(), &env(&[(KEYRING_PATH, "/k")])).unwrap_err();
        assert_eq!(err.code, "config-missing");
        for name in [PUBLIC_ORIGIN, DATABASE_URL, BLOB_URL, STATE_DIR] {
            assert!(err.message.contains(name), "{name} named in {}", err.message);
        }
        assert!(!err.message.contains(KEYRING_PATH));
        assert_eq!(err.data.unwrap()["missing"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn s3_blobs_need_credentials_and_never_show_the_secret() {
        let mut e = full();
        e.insert(BLOB_URL.into(), "s3://bucket".into());
        let err = resolve(&Flags::default(), &e).unwrap_err();
        assert_eq!(err.code, "config-missing");
        assert!(err.message.contains(S3_ACCESS_KEY) && err.message.contains(S3_SECRET_KEY));
        e.insert(S3_ACCESS_KEY.into(), "AKIA".into());
        e.insert(S3_SECRET_KEY.into(), "very-secret-value".into());
        e.insert(S3_FORCE_PATH_STYLE.into(), "true".into());
        let config = resolve(&Flags::default(), &e).unwrap();
        assert!(config.s3.force_path_style);
        assert_eq!(config.s3.region, "us-east-1");
        assert!(!format!("{config:?}").contains("very-secret-value"));
        e.insert(S3_FORCE_PATH_STYLE.into(), "maybe".into());
        assert_eq!(resolve(&Flags::default(), &e).unwrap_err().code, "config-invalid");
    }

    #[test]
    fn empty_values_count_as_missing() {
        let mut e = full();
        e.insert(BLOB_URL.into(), "  ".into());
        assert_eq!(resolve(&Flags::default(), &e).unwrap_err().code, "config-missing");
    }

    #[test]
    fn production_config_invents_nothing() {
        let config = resolve(&Flags::default(), &full()).unwrap();
        assert!(config.dev_defaults.is_empty());
        assert!(config.plugin_http_allow.is_empty(), "plugins reach no internal address unless allowed");
        assert!(config.data_dir.is_none());
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.log_format, LogFormat::Human);
    }

    #[test]
    fn dev_mode_reports_every_default_it_chose() {
        let flags = Flags { dev: true, listen: Some("127.0.0.1:9000".into()), ..Flags::default() };
        let config = resolve(&flags, &env(&[(BLOB_URL, "file:/elsewhere")])).unwrap();
        let chosen: Vec<&str> = config.dev_defaults.iter().map(|(k, _)| *k).collect();
        assert_eq!(chosen, vec![DATA_DIR, STATE_DIR, PUBLIC_ORIGIN, KEYRING_PATH, DATABASE_URL, PLUGIN_HTTP_ALLOW]);
        assert_eq!(config.public_origin, "http://127.0.0.1:9000");
        assert_eq!(config.plugin_http_allow.len(), 2, "dev mode lets plugins reach loopback");
        assert_eq!(config.blob_url, "file:/elsewhere", "an explicit value wins in dev mode too");
        assert!(config.database_url.starts_with("sqlite:") && config.database_url.ends_with("capstan.sqlite"));
    }

    #[test]
    fn flags_beat_environment_which_beats_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("capstan.toml");
        std::fs::write(&file, "listen = \"127.0.0.1:1\"\nlog_format = \"json\"\npublic_origin = \"http://file\"\nmax_body_bytes = 2048\n")
            .unwrap();
        let mut e = full();
        e.insert(LISTEN.into(), "127.0.0.1:2".into());
        let flags = Flags { config_file: Some(file.clone()), ..Flags::default() };
        let config = resolve(&flags, &e).unwrap();
        assert_eq!(config.listen.port(), 2, "environment beats file");
        assert_eq!(config.public_origin, "https://capstan.example.com");
        assert_eq!(config.log_format, LogFormat::Json, "file beats default");
        assert_eq!(config.max_body_bytes, 2048);
        let flags =
            Flags { config_file: Some(file), listen: Some("127.0.0.1:3".into()), log_format: Some("human".into()), ..Flags::default() };
        let config = resolve(&flags, &e).unwrap();
        assert_eq!(config.listen.port(), 3, "flag beats environment");
        assert_eq!(config.log_format, LogFormat::Human);
    }

    #[test]
    fn the_file_supplies_required_values_and_refuses_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("capstan.toml");
        std::fs::write(
            &file,
            "public_origin = \"http://x\"\nkeyring_path = \"/k\"\ndatabase_url = \"sqlite:/d\"\nblob_url = \"file:/b\"\nstate_dir = \"/s\"\n",
        )
        .unwrap();
        let flags = Flags { config_file: Some(file.clone()), ..Flags::default() };
        resolve(&flags, &BTreeMap::new()).unwrap();

        std::fs::write(&file, "databse_url = \"sqlite:/d\"\n").unwrap();
        let err = resolve(&flags, &BTreeMap::new()).unwrap_err();
        assert_eq!(err.code, "config-invalid");
        assert!(err.message.contains("databse_url"));

        std::fs::write(&file, "listen = [1]\n").unwrap();
        assert_eq!(resolve(&flags, &BTreeMap::new()).unwrap_err().code, "config-invalid");
        std::fs::write(&file, "not toml").unwrap();
        assert_eq!(resolve(&flags, &BTreeMap::new()).unwrap_err().code, "config-invalid");
        let flags = Flags { config_file: Some(dir.path().join("absent.toml")), ..Flags::default() };
        assert_eq!(resolve(&flags, &BTreeMap::new()).unwrap_err().code, "config-invalid");
    }

    #[test]
    fn malformed_values_are_refused_by_name() {
        for (name, value) in [
            (LISTEN, "localhost"),
            (PUBLIC_ORIGIN, "capstan.example.com"),
            (PUBLIC_ORIGIN, "https://user:pw@x"),
            (PUBLIC_ORIGIN, "https://x/path"),
            (LOG_FORMAT, "xml"),
            (MAX_BODY_BYTES, "lots"),
            (MAX_BODY_BYTES, "10"),
        ] {
            let mut e = full();
            e.insert(name.into(), value.into());
            let err = resolve(&Flags::default(), &e).unwrap_err();
            assert_eq!(err.code, "config-invalid", "{name}={value}");
            assert!(!err.message.contains("pw"), "a refused origin is not echoed: it may carry credentials");
        }
    }

    #[test]
    fn node_labels_come_from_one_source_wholesale() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("capstan.toml");
        std::fs::write(&file, "[node]\nlabels = { tier = \"fast\", zone = \"a\" }\n").unwrap();
        let flags = Flags { config_file: Some(file.clone()), ..Flags::default() };
        let config = resolve(&flags, &full()).unwrap();
        assert_eq!(config.node.labels.len(), 2);
        let mut e = full();
        e.insert(NODE_LABELS.into(), "region=eu-west-1".into());
        let config = resolve(&flags, &e).unwrap();
        assert_eq!(
            config.node.labels,
            BTreeMap::from([("region".to_string(), "eu-west-1".to_string())]),
            "the variable replaces the file's set"
        );
        let flags = Flags { config_file: Some(file), node_labels: vec!["tier=slow".into()], ..Flags::default() };
        let config = resolve(&flags, &e).unwrap();
        assert_eq!(config.node.labels, BTreeMap::from([("tier".to_string(), "slow".to_string())]), "the flag replaces both");
        e.insert(NODE_LABELS.into(), "novalue".into());
        assert_eq!(resolve(&Flags::default(), &e).unwrap_err().code, "invalid-input");
    }

    #[test]
    fn a_dev_host_on_the_lan_states_its_origin_with_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let dev = |public_origin: Option<&str>| Flags {
            dev: true,
            data_dir: Some(dir.path().to_path_buf()),
            listen: Some("0.0.0.0:8080".into()),
            network: Some("lan".into()),
            public_origin: public_origin.map(String::from),
            ..Flags::default()
        };
        let config = resolve(&dev(Some("http://192.168.1.20:8080")), &env(&[])).unwrap();
        assert_eq!(config.public_origin, "http://192.168.1.20:8080");
        assert!(config.dev_defaults.iter().all(|(k, _)| *k != PUBLIC_ORIGIN), "the flag is no default");
        // a wildcard bind with no origin stated is reached on loopback
        assert_eq!(resolve(&dev(None), &env(&[])).unwrap().public_origin, "http://127.0.0.1:8080");
        // the flag wins over the variable
        let config = resolve(&dev(Some("http://10.0.0.9:8080")), &env(&[(PUBLIC_ORIGIN, "http://10.0.0.1:1")])).unwrap();
        assert_eq!(config.public_origin, "http://10.0.0.9:8080");
    }

    #[test]
    fn reaching_beyond_loopback_needs_a_stated_network() {
        let flags = Flags { listen: Some("0.0.0.0:8080".into()), ..Flags::default() };
        let err = resolve(&flags, &full()).unwrap_err();
        assert_eq!(err.code, "invalid-input");
        assert_eq!(err.data.unwrap()["fields"], json!(["listen"]));
        let mut e = full();
        e.insert(ADVERTISE_ADDRESS.into(), "10.0.0.5:8080".into());
        let err = resolve(&Flags::default(), &e).unwrap_err();
        assert_eq!(err.data.unwrap()["fields"], json!(["advertiseAddress"]));
        let flags = Flags { listen: Some("0.0.0.0:8080".into()), network: Some("lan".into()), ..Flags::default() };
        assert_eq!(resolve(&flags, &e).unwrap().node.network, Some(Network::Lan));
        let flags = Flags { network: Some("internet".into()), ..Flags::default() };
        assert_eq!(resolve(&flags, &full()).unwrap_err().code, "invalid-input");
        e.insert(LEASE_TTL_MS.into(), "100000".into());
        assert_eq!(resolve(&Flags { network: Some("lan".into()), ..Flags::default() }, &e).unwrap_err().code, "config-invalid");
    }

    #[test]
    fn a_plugin_http_ca_file_is_read_at_start_or_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        let bundle = dir.path().join("ca.pem");
        std::fs::write(&bundle, format!("# a private CA\n{}{}", ca.pem(), ca.pem())).unwrap();

        assert!(resolve(&Flags::default(), &full()).unwrap().plugin_http_ca.is_none(), "none unless configured");
        let mut e = full();
        e.insert(PLUGIN_HTTP_CA_FILE.into(), bundle.display().to_string());
        let config = resolve(&Flags::default(), &e).unwrap();
        let ca = config.plugin_http_ca.unwrap();
        assert_eq!((ca.path.as_path(), ca.certificates.len()), (bundle.as_path(), 2));
        crate::plugins::imports::PluginHttp::new(&ca.certificates, &[]).expect("a client trusting them builds");

        // the flag wins over the environment, and the file's key is the variable's
        let flags = Flags { plugin_http_ca_file: Some(dir.path().join("absent.pem")), ..Flags::default() };
        let err = resolve(&flags, &e).unwrap_err();
        assert_eq!((err.code.as_ref(), err.data.as_ref().unwrap()["cause"].as_str()), ("config-invalid", Some("ca-file-unreadable")));
        assert!(err.message.contains(PLUGIN_HTTP_CA_FILE) && err.message.contains("absent.pem"), "{}", err.message);
        let file = dir.path().join("capstan.toml");
        std::fs::write(&file, format!("plugin_http_ca_file = {:?}\n", bundle.display().to_string())).unwrap();
        let config = resolve(&Flags { config_file: Some(file), ..Flags::default() }, &full()).unwrap();
        assert_eq!(config.plugin_http_ca.unwrap().certificates.len(), 2);

        for (content, cause) in [
            ("".to_string(), "ca-file-no-certificate"),
            ("not a certificate\n".to_string(), "ca-file-no-certificate"),
            (key.serialize_pem(), "ca-file-no-certificate"),
            ("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".to_string(), "ca-file-invalid"),
            ("-----BEGIN CERTIFICATE-----\nAAECAwQ=\n-----END CERTIFICATE-----\n".to_string(), "ca-file-invalid"),
        ] {
            std::fs::write(&bundle, &content).unwrap();
            let err = resolve(&Flags::default(), &e).unwrap_err();
            assert_eq!(err.code, "config-invalid", "{content:?}");
            assert_eq!(err.data.as_ref().unwrap()["cause"], cause, "{content:?}: {}", err.message);
            assert!(err.message.contains(PLUGIN_HTTP_CA_FILE), "{}", err.message);
            assert!(!err.message.contains("PRIVATE KEY"), "the file's content is never echoed");
        }
        std::fs::write(&bundle, vec![b'#'; MAX_CA_FILE_BYTES as usize + 1]).unwrap();
        assert_eq!(resolve(&Flags::default(), &e).unwrap_err().data.unwrap()["cause"], "ca-file-too-large");
    }

    #[test]
    fn help_documents_every_variable_and_default() {
        let help = vars_help();
        for var in VARS {
            assert!(help.contains(var.env) && help.contains(var.default), "{}", var.env);
        }
    }

    #[test]
    fn the_operators_docs_document_every_variable() {
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operating.md")).unwrap();
        for var in VARS {
            assert!(docs.contains(&format!("| `{}` |", var.env)), "docs/operating.md's configuration table lacks {}", var.env);
        }
    }
}
