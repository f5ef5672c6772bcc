//! `capstan-agent`: the reference node agent of Capstan.
//!
//! A machine joins a cluster with a single-use jump code (`enroll`), then reports to Capstan
//! with its node credential (`run`): heartbeats carrying the host's facts, and the hostname
//! Capstan intends for it, applied. The wire is `/agent/v1/…` (docs/nodes.md). The credential
//! lives in one private file of the state directory; the token never appears in a log line,
//! an error or any output.

mod applier;
mod backoff;
mod backups;
mod carrier;
mod closure;
mod engine;
mod enroll;
mod handler;
mod ingress;
mod logs;
#[cfg(test)]
mod mock;
mod origin;
mod relay;
mod report;
mod rotate;
mod run;
mod state;
mod status;
mod token;
mod wire;
mod workloads;

use capstan_core::Refusal;
use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const AFTER_HELP: &str = "\
Joining a machine (the Capstan dashboard shows the command with its code):
  curl -fsSL 'https://capstan.example.com/jump/CODE' | sudo bash
which installs this binary, then runs:
  printf '%s\\n' 'CODE' | capstan-agent enroll 'https://capstan.example.com'
and starts the capstan-agent.service unit (capstan-agent run).

Errors are printed as `error: <code>: <message>`; the code is stable.
Exit status: 0 success, 1 refused or failed (the code says why), 2 usage.";

const RELAY_HELP: &str = "\
Example:
  capstan-agent relay --authorization-file /etc/capstan-agent/relay-authorization \\
    --listen 10.0.0.5:8443 [--volumes-dir /srv/capstan/volumes]

The relay uses this machine's enrollment (the node id and Capstan's origin in the state
directory) and opens ws(s)://<origin>/api/v1/socket (https -> wss, http -> ws). It offers the
bearer from --authorization-file (kind relay), and once welcomed registers this node with
relays.register (sequence 1 on each new socket; its version; --listen when given).

What it keeps and answers:
  - relay.config pushes are kept in relay-config.json in the state directory ({digest, config,
    receivedAt}; mode 0600, replaced atomically); a push whose digest is the one kept is skipped.
    `capstan-agent status` shows the digest and when it was received.
  - requests are answered concurrently: agent.ping ({pong, nodeId, at}), agent.describe
    ({nodeId, clusterId, version, methods, configDigest}); any other method is refused
    agent-method-unknown (data.methods lists what is answered). A request still running at its
    deadlineMs is abandoned.
  - backups.archive and backups.restore: a service's volumes as a tar.gz, uploaded to Capstan
    with the single-use transfer ticket the request carries, or downloaded, verified (size,
    SHA-256) and swapped in whole. Volume NAME of service ID is DIR/ID/NAME under --volumes-dir
    (default: <state dir>/volumes); archives in flight are private files in DIR/.capstan-tmp.
    A ticket whose URL is not at the origin this node enrolled with is refused
    transfer-origin-foreign: a service's data goes nowhere else.
  - it answers the host's pings and pings the host when it falls silent.
  - with --nodes-listen it carries the cluster's node runtime sessions: nodes running
    `capstan-agent run --relay ws://ADDR:PORT` open theirs here, and the relay forwards each on
    its one socket (Capstan still judges every node by its own credential).
  - with --ingress-listen and --ingress-bearer-file it runs the cluster ingress: after each
    accepted relays.register it calls ingress.register (refusals are retried after their
    retryAfterMs) and reads ingress.getRouteTable; ingress.applyRouteTable pushes replace the
    table whole (an older revision is refused route-table-stale). The proxy picks the route by
    the request's Host, answers 404 for a hostname without one, 403 to a source outside a
    route's sourceAllowList, 502 when the target does not answer. The registration states
    where the external gateway reaches the proxy (--ingress-advertise, by default the listen
    address when it is a specific one), so Capstan routes the table's hostnames there.

Reconnecting (never exits but on SIGTERM or ctrl-c):
  - going-away (close 1001: the host is stopping): reconnects at once;
  - relay-credential-generation-stale (close 4011) or unauthenticated (4003): the bearer is not
    the current one; logged, and retried with backoff (at most a minute apart, at once when the
    file changes). The file is read again on every attempt, so a rotated bearer delivered to it
    is taken without a restart;
  - a refused registration (relay-node-foreign, relay-node-unknown, relay-cluster-not-enabled,
    ...) is logged by its code and sent again on the same socket after a backoff;
  - anything else (unreachable, dropped, closed): backoff from 1 s doubling to 5 min.

The bearer is never logged or printed. A file that is missing, a symbolic link, not a regular
file, not yours, or open to group or others is refused by name (authorization-file-missing,
-symlink, -not-regular, -not-owned, -permissions, ...): at the start the relay exits with it;
later, it is logged and retried.";

/// The Capstan node agent: enrolls this machine with a jump code, then reports its host facts
/// to Capstan and applies the hostname Capstan intends for it.
#[derive(Parser, Debug)]
#[command(name = "capstan-agent", version, after_help = AFTER_HELP)]
struct Cli {
    /// Where the node credential (credential.json), the last beat's status and the relay's
    /// configuration (relay-config.json) are kept: mode
    /// 0700, owned by the agent's user; looser permissions are refused.
    #[arg(long, global = true, env = "CAPSTAN_AGENT_STATE_DIR", default_value = state::DEFAULT_STATE_DIR, value_name = "DIR")]
    state_dir: PathBuf,

    /// Log filter (tracing's syntax: info, debug, capstan_agent=debug, …).
    #[arg(long, global = true, env = "CAPSTAN_AGENT_LOG", default_value = "capstan_agent=info,warn", value_name = "FILTER")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Enroll this machine: reads the jump code from standard input (one line), draws the node
    /// token, sends Capstan only its SHA-256 and keeps the credential in the state directory.
    #[command(after_help = "Example:\n  printf '%s\\n' 'CODE' | capstan-agent enroll 'https://capstan.example.com'\n\n\
The code is read from standard input only, never from an argument or the environment.\n\
ORIGIN must be https; http is accepted to a loopback address, and to any address with\n\
--dev-host (the jump command of a `capstan serve --dev` host says it; never in production).\n\
This machine's short hostname, lowercased, is offered as the node's hostname (or --hostname);\n\
it must be one DNS label, and no other node of the cluster may carry it.")]
    Enroll {
        /// Capstan's origin, e.g. https://capstan.example.com
        origin: String,
        /// The hostname to enroll this machine under instead of its own (a container's
        /// generated name, say); its short form, lowercased, must be one DNS label.
        #[arg(long, value_name = "NAME")]
        hostname: Option<String>,
        /// Capstan is a dev host (`serve --dev`) reached over plain http on a local network, as
        /// its jump command says: accept an http ORIGIN beyond loopback. The node token then
        /// crosses the network unencrypted; the agent says so at enrollment and every start.
        #[arg(long)]
        dev_host: bool,
    },
    /// Run: heartbeat with this host's facts (every 30 s, jittered; backing off up to 5 min while
    /// Capstan cannot be reached) and apply the hostname intent. Stops on SIGTERM or ctrl-c.
    Run {
        /// Time between beats (e.g. 30s, 2s).
        #[arg(long, default_value = "30s", value_parser = parse_interval, value_name = "DURATION")]
        interval: Duration,
        /// Apply the hostname intent by writing it to this file instead of `hostnamectl
        /// set-hostname` (which needs root).
        #[arg(long, env = "CAPSTAN_AGENT_HOSTNAME_FILE", value_name = "PATH")]
        hostname_file: Option<PathBuf>,
        /// The container engine the node's workloads run on: the Docker Engine API at a unix
        /// socket (Docker's, or Podman's `podman system service`) or an http address.
        #[arg(long, env = "CAPSTAN_AGENT_ENGINE", default_value = "unix:///run/docker.sock", value_name = "ENDPOINT")]
        engine: String,
        /// Where services' volumes live: volume NAME of service ID is DIR/ID/NAME (the place
        /// backups read). Default: the state directory's volumes/.
        #[arg(long, env = "CAPSTAN_AGENT_VOLUMES_DIR", value_name = "DIR")]
        volumes_dir: Option<PathBuf>,
        /// Only beat and apply the hostname: run no workloads (no runtime session).
        #[arg(long)]
        no_workloads: bool,
        /// Where secret files live while their container runs (DIR/<assignment>/<KEY>, bound
        /// read-only at /run/secrets): keep it on a memory-backed tmpfs.
        #[arg(long, env = "CAPSTAN_AGENT_SECRETS_DIR", default_value = "/dev/shm/capstan-agent", value_name = "DIR")]
        secrets_dir: PathBuf,
        /// Open the runtime session through the cluster's relay (its --nodes-listen address,
        /// e.g. ws://10.0.0.5:8444) instead of on Capstan's socket directly.
        #[arg(long, env = "CAPSTAN_AGENT_RELAY", value_name = "WS_URL", conflicts_with = "no_workloads", value_parser = parse_relay_url)]
        relay: Option<String>,
        /// The IP address other machines reach this node's published ports at (where a
        /// cluster's ingress sends a service's traffic). Default: the node's only non-loopback
        /// address, when it has exactly one; a node with several states it.
        #[arg(long, env = "CAPSTAN_AGENT_ADVERTISE_ADDRESS", value_name = "IP", value_parser = parse_advertise_address)]
        advertise_address: Option<std::net::IpAddr>,
    },
    /// Show what this machine is enrolled as and how its last beat went (no request is made).
    Status {
        /// Print exact JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the cluster's relay on this enrolled node: keep a session on Capstan's socket, register
    /// the node as the relay, keep the configuration Capstan pushes and answer its requests.
    /// Stops on SIGTERM or ctrl-c.
    #[command(after_help = RELAY_HELP)]
    Relay {
        /// The file holding the relay bearer (capstan keyring export-relay-authorization): a
        /// regular file owned by this user, not readable or writable by group or others. Read
        /// again before every connection attempt.
        #[arg(long, env = "CAPSTAN_RELAY_AUTHORIZATION_FILE", value_name = "FILE")]
        authorization_file: PathBuf,
        /// Where the relay's own listener is bound (reported to Capstan as listenAddress and
        /// listenPort), e.g. 10.0.0.5:8443.
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<SocketAddr>,
        /// Where services' volumes live (backups.archive, backups.restore): volume NAME of service
        /// ID is DIR/ID/NAME. Default: the state directory's volumes/.
        #[arg(long, value_name = "DIR")]
        volumes_dir: Option<PathBuf>,
        /// Run the cluster ingress here: a reverse proxy on ADDR:PORT serving the route table
        /// the ingress manager pushes (needs --ingress-bearer-file).
        #[arg(long, value_name = "ADDR:PORT", requires = "ingress_bearer_file")]
        ingress_listen: Option<SocketAddr>,
        /// The cluster ingress's bearer (the designated service's CAPSTAN_CLUSTER_INGRESS_BEARER),
        /// under the same file rules as --authorization-file; read before every registration.
        #[arg(long, env = "CAPSTAN_CLUSTER_INGRESS_BEARER_FILE", value_name = "FILE", requires = "ingress_listen")]
        ingress_bearer_file: Option<PathBuf>,
        /// Where the external gateway reaches this ingress (HOST:PORT, e.g. 192.0.2.10:80),
        /// stated in the registration so public routes are forwarded here. Default: the
        /// --ingress-listen address, unless it is unspecified (0.0.0.0, [::]).
        #[arg(long, value_name = "HOST:PORT", requires = "ingress_listen", value_parser = ingress::parse_advertised)]
        ingress_advertise: Option<ingress::Advertised>,
        /// Carry the cluster's node runtime sessions: nodes that run `capstan-agent run --relay
        /// ws://ADDR:PORT` open them here, and they ride this relay's one socket to Capstan
        /// (each node still authenticated by its own credential). Bind a private address.
        #[arg(long, env = "CAPSTAN_RELAY_NODES_LISTEN", value_name = "ADDR:PORT")]
        nodes_listen: Option<SocketAddr>,
    },
    /// Replace the node token with fresh material. The new material is kept as pending before
    /// Capstan is asked; if the answer is lost, running rotate again finishes the same rotation.
    Rotate,
}

/// A relay's nodes address: `ws://HOST:PORT` (the relay's listener speaks plain WebSocket on the
/// cluster's private network).
fn parse_relay_url(text: &str) -> Result<String, String> {
    let rest = text.strip_prefix("ws://").ok_or("the relay is reached at ws://HOST:PORT (its --nodes-listen address)")?;
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err("the relay is reached at ws://HOST:PORT, with no path".into());
    }
    Ok(format!("ws://{authority}/"))
}

fn parse_advertise_address(text: &str) -> Result<std::net::IpAddr, String> {
    let ip: std::net::IpAddr = text.parse().map_err(|_| format!("{text}: not an IP address (192.0.2.10, 2001:db8::10)"))?;
    if ip.is_unspecified() || ip.is_multicast() {
        return Err(format!("{text}: an unspecified or multicast address reaches no node"));
    }
    Ok(ip)
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if interval < Duration::from_millis(10) || interval > Duration::from_secs(3600) {
        return Err("the interval must be between 10ms and 1h".into());
    }
    Ok(interval)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut filter = tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // the WebSocket library traces whole frames, the relay's offer (its bearer) included: never
    // below warn, whatever the filter asks
    for quiet in ["tungstenite=warn", "tokio_tungstenite=warn"] {
        if let Ok(directive) = quiet.parse() {
            filter = filter.add_directive(directive);
        }
    }
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal()).init();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(Refusal::internal(format!("starting the async runtime: {e}"))),
    };
    match runtime.block_on(command(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(refusal) => fail(refusal),
    }
}

fn fail(refusal: Refusal) -> ExitCode {
    let mut text = format!("error: {}: {}", refusal.code, refusal.message);
    if let Some(detail) = &refusal.detail {
        text.push_str(&format!(" ({detail})"));
    }
    eprintln!("{text}");
    ExitCode::FAILURE
}

async fn command(cli: Cli) -> Result<(), Refusal> {
    let state = state::StateDir::new(cli.state_dir);
    match cli.command {
        Command::Enroll { origin, hostname, dev_host } => {
            let stdin = std::io::stdin();
            let interactive = stdin.is_terminal();
            let node_name = hostname.unwrap_or_else(|| rustix::system::uname().nodename().to_string_lossy().into_owned());
            let inputs = enroll::Inputs { stdin: stdin.lock(), interactive, node_name, retry: wire::Retry::default(), dev_host };
            let credential = enroll::enroll(&origin, &state, inputs).await?;
            println!(
                "enrolled: node {} in cluster {} ({}); credential kept in {}",
                credential.node_id,
                credential.cluster_id,
                credential.origin,
                state.credential_path().display()
            );
            Ok(())
        }
        Command::Run { interval, hostname_file, engine, volumes_dir, no_workloads, relay, secrets_dir, advertise_address } => {
            let is_root = rustix::process::geteuid().is_root();
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let workloads = if no_workloads {
                None
            } else {
                let volumes_dir = volumes_dir.unwrap_or_else(|| state.path().join("volumes"));
                // the node answers for its own volumes over its runtime session, as a relay does
                let mut methods = handler::Registry::with_builtins();
                backups::register(&mut methods, state.clone(), volumes_dir.clone())?;
                let options = workloads::Options { state: state.clone(), engine, volumes_dir, relay, secrets_dir, methods };
                Some(tokio::spawn(workloads::run(options, stopped)))
            };
            let options = run::Options { state, interval, applier: applier::choose(hostname_file, is_root), advertised: advertise_address };
            let shutdown = async move {
                let why = shutdown_signal().await;
                let _ = stop.send(true);
                why
            };
            let ran = run::run(options, shutdown).await;
            if let Some(workloads) = workloads {
                let _ = workloads.await;
            }
            ran
        }
        Command::Status { json } => {
            if json {
                let value = status::status_json(&state)?;
                println!("{}", serde_json::to_string_pretty(&value).map_err(Refusal::internal)?);
            } else {
                print!("{}", status::status_text(&state)?);
            }
            Ok(())
        }
        Command::Relay {
            authorization_file,
            listen,
            volumes_dir,
            ingress_listen,
            ingress_bearer_file,
            ingress_advertise,
            nodes_listen,
        } => {
            let volumes_dir = volumes_dir.unwrap_or_else(|| state.path().join("volumes"));
            let mut registry = handler::Registry::with_builtins();
            backups::register(&mut registry, state.clone(), volumes_dir)?;
            let ingress = match (ingress_listen, ingress_bearer_file) {
                (Some(listen), Some(file)) => {
                    let ingress = ingress::Ingress::new(listen, ingress_advertise, file)?;
                    ingress.bearer()?;
                    registry.add(std::sync::Arc::new(ingress::Apply(ingress.clone())))?;
                    Some(ingress)
                }
                _ => None,
            };
            let options = relay::Options {
                state,
                authorization_file,
                listen,
                registry,
                retry_base: Duration::from_secs(1),
                ingress: ingress.clone(),
                nodes_listen,
            };
            match ingress {
                None => relay::relay(options, shutdown_signal()).await,
                Some(ingress) => tokio::select! {
                    ended = relay::relay(options, shutdown_signal()) => ended,
                    failed = ingress.serve() => failed,
                },
            }
        }
        Command::Rotate => {
            let credential = rotate::rotate(&state, wire::Retry::default()).await?;
            println!("rotated: node {} now holds credential generation {}", credential.node_id, credential.credential_generation);
            Ok(())
        }
    }
}

/// Completes on SIGTERM or ctrl-c, naming which.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "interrupt",
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            "interrupt"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn an_advertised_address_is_one_other_machines_can_reach() {
        assert_eq!(parse_advertise_address("192.0.2.10").unwrap().to_string(), "192.0.2.10");
        assert_eq!(parse_advertise_address("2001:db8::10").unwrap().to_string(), "2001:db8::10");
        for bad in ["0.0.0.0", "::", "224.0.0.1", "node-1.example", "192.0.2.10:80", ""] {
            assert!(parse_advertise_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn intervals_are_bounded() {
        assert_eq!(parse_interval("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_interval("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("2h").is_err());
        assert!(parse_interval("soon").is_err());
    }
}
