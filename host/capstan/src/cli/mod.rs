//! The `capstan` command line. `serve` runs the host; later subcommands are clients of the API.

mod admin;
mod apps;
mod audit;
mod call;
mod client;
mod completions;
mod confirm;
mod deploy;
mod fleet;
mod gateway;
mod inventory;
mod keyring;
mod nodes;
mod oidc_login;
mod output;
mod plugin;
mod plugin_commands;
mod plugin_dev;
mod plugin_new;
mod plugin_online;
mod progress;
mod publishers;
mod relays;
mod resolve;
mod secret_sets;
mod secrets;
mod service_events;
mod service_logs;
mod service_runtime;
mod snapshot;
mod tasks;
mod users;

use crate::config::{self, Flags};
use crate::refusal::Refusal;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "capstan",
    version,
    about = "Capstan: a self-hosted infrastructure control plane",
    after_help = "Running plugins add commands of their own: a command not listed above is looked up among them on the\nserver; `capstan <command> --help` explains one, and a word no command knows lists them."
)]
struct Cli {
    /// How client commands print their answer: table (for people), json (the API's answer
    /// exactly, one line; --json is the same) or yaml
    #[arg(long, short = 'o', global = true, value_enum, value_name = "FORMAT")]
    output: Option<output::Format>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the Capstan host: the API, the store, the blobs, the migrations.
    ///
    /// Without --dev every required variable must be set (see below); with --dev, missing
    /// values get embedded defaults under the data directory and each one chosen is printed.
    Serve(ServeArgs),
    /// Create, inspect and rotate the private keyring file (KEKs and the ingress recipient).
    #[command(subcommand)]
    Keyring(keyring::KeyringCommand),
    /// The fleet as the bucket records it: nodes, versions, the coordinator, deploy freezes.
    #[command(subcommand)]
    Fleet(fleet::FleetCommand),
    /// WireGuard transport: create this node's key pair in its state directory.
    #[command(subcommand)]
    Wg(fleet::WgCommand),
    /// Plugins: author (new, dev, keygen, build, sign, verify, inspect) and operate on a running
    /// host (install, upgrade, rollback, list, get, disable, enable, uninstall, trust).
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Tasks on a running host: list, inspect, run now, cancel, enable or disable them, and
    /// read their executions with the log each one kept.
    #[command(subcommand)]
    Tasks(tasks::TasksCommand),
    /// Log in to a Capstan server and keep the session token for the other commands.
    ///
    /// Asks for the password on the terminal without echo, or reads it from standard input
    /// with --password-stdin. The token goes to $XDG_CONFIG_HOME/capstan/credentials.json
    /// (else ~/.config/capstan/credentials.json), mode 0600, keyed by the server URL; it is
    /// never printed. Client commands use CAPSTAN_TOKEN instead when it is set.
    Login(client::LoginArgs),
    /// End the session at the server and forget its stored token.
    Logout(client::LogoutArgs),
    /// Organizations and their members: list, get, create, rename, delete, members, set-member.
    #[command(subcommand)]
    Organizations(inventory::OrganizationsCommand),
    /// Clusters with their machine user and runtime phase: list, get, create, update, delete,
    /// runtime, set-phase.
    #[command(subcommand)]
    Clusters(inventory::ClustersCommand),
    /// An organization's services: list, get, create, update, delete (in two phases); and
    /// where they run: run, stop, status.
    #[command(subcommand)]
    Services(inventory::ServicesCommand),
    /// Deploy a release of a service as its deployment machine user: reserve the tag, push the
    /// image (with skopeo), promote it, wait until every replica runs its digest, promote its
    /// routes. --rollback TAG rolls back to a kept release the same way.
    ///
    /// Exits non-zero with rollout-failed (a replica of the release failed, each named with
    /// why) or rollout-timeout; the release then stays promoted and the routes as they were.
    Deploy(deploy::DeployArgs),
    /// Nodes of clusters: list them with their liveness, get one, create a jump command for a
    /// new machine, read or rotate or revoke a node credential, set or reset a hostname
    /// intent, retire, read the deletion impact, delete (administrators; docs/nodes.md).
    #[command(subcommand)]
    Nodes(nodes::NodesCommand),
    /// The public settings document: get, set, unset (an allowlist; credentials are refused).
    #[command(subcommand)]
    Settings(inventory::SettingsCommand),
    /// People's accounts: list, create (a generated password, shown once), disable, enable,
    /// reset-password, revoke-sessions.
    #[command(subcommand)]
    Users(users::UsersCommand),
    /// Cluster relays: enable (origin and credential, then what to run), export the bearer,
    /// list the registered relays, rotate, disable (docs/relays.md).
    #[command(subcommand)]
    Relays(relays::RelaysCommand),
    /// Publisher keys plugin bundles may be signed by: list (with their names), add, remove.
    #[command(subcommand)]
    Publishers(publishers::PublishersCommand),
    /// The audit log of state-changing calls: list, filtered by method, actor, outcome, target
    /// and time (administrators).
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Offline recovery on a host you operate (needs its store and keyring):
    /// reset-password for a lost administrator password.
    #[command(subcommand)]
    Admin(admin::AdminCommand),
    /// Snapshots of Capstan itself: create one (to a file, or by the host into its bucket),
    /// verify a file, restore one into an empty store (docs/backups.md).
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Secrets: set one from standard input (sealed to the server), generate, list, get,
    /// revoke, and re-wrap every version under the active KEK. No value is ever printed.
    #[command(subcommand)]
    Secrets(secrets::SecretsCommand),
    /// The external gateway: enroll Capstan with an admin token read from standard input
    /// (sealed to the server), and show the enrollment.
    #[command(subcommand)]
    Gateway(gateway::GatewayCommand),
    /// Call any method of a running host, its plugins' included, as `GET /api/v1/methods` lists
    /// them.
    #[command(verbatim_doc_comment)]
    ///
    /// capstan call --list                            every method, who may call it, what it does
    /// capstan call METHOD --help                     its summary, access and input fields
    /// capstan call METHOD ['{"json":1}' | -f FILE | --set key=value ...] [--json]
    /// capstan call METHOD --set-file key=FILE ...    a field set to a file's text
    ///
    /// Dotted --set keys nest (spec.replicas=2); a value that parses as JSON is that JSON, else a
    /// string. --set-file sets a field to a file's text, as a string (`-`: standard input), e.g.
    /// capstan call appstore.importCatalog --set-file envelope=catalog-8.json
    /// A list answer prints as a table, anything else as indented JSON; --json prints the exact
    /// answer.
    Call(call::CallArgs),
    /// Print the shell completion script for bash, zsh or fish on standard output.
    ///
    /// bash: source <(capstan completions bash); zsh: capstan completions zsh > "${fpath[1]}/_capstan";
    /// fish: capstan completions fish > ~/.config/fish/completions/capstan.fish
    Completions(completions::CompletionsArgs),
    /// A command a running plugin adds (`capstan backups create website`): read from the host's
    /// `plugins.listCommands`, each with its own --help.
    #[command(external_subcommand)]
    Added(Vec<OsString>),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Development mode: embedded SQLite store and local blobs under --data-dir, created on
    /// first start and reused after.
    #[arg(long)]
    dev: bool,
    /// --dev only: where the embedded data lives [env: CAPSTAN_DATA_DIR] [default: ./capstan-data]
    #[arg(long, value_name = "DIR", requires = "dev")]
    data_dir: Option<PathBuf>,
    /// Address to bind, e.g. 127.0.0.1:8080 [env: CAPSTAN_LISTEN]
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// A TOML file with any of the variables below (keys lower-case, without CAPSTAN_)
    /// [env: CAPSTAN_CONFIG]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format [env: CAPSTAN_LOG_FORMAT] [default: human]
    #[arg(long, value_name = "FORMAT", value_parser = ["human", "json"])]
    log_format: Option<String>,
    /// This node's state directory (identity) [env: CAPSTAN_STATE_DIR] [--dev: the data dir]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Pin this node's id [env: CAPSTAN_NODE_ID]
    #[arg(long, value_name = "ID")]
    node_id: Option<String>,
    /// A node label key=value; repeat for more [env: CAPSTAN_NODE_LABELS as k=v,k2=v2]
    #[arg(long = "node-labels", value_name = "K=V")]
    node_labels: Vec<String>,
    /// The network a bind or advertised address beyond loopback is on [env: CAPSTAN_NETWORK]
    #[arg(long, value_name = "NETWORK", value_parser = ["lan", "wireguard", "public"])]
    network: Option<String>,
    /// The origin people and machines reach this Capstan at, e.g. https://capstan.example.com;
    /// with --dev, a plain http LAN origin serves jump commands a second machine can run
    /// [env: CAPSTAN_PUBLIC_ORIGIN] [--dev: http://<listen address>]
    #[arg(long, value_name = "ORIGIN")]
    public_origin: Option<String>,
    /// A PEM file of root certificates plugins' outbound HTTPS trusts besides the platform's
    /// (a private CA) [env: CAPSTAN_PLUGIN_HTTP_CA_FILE]
    #[arg(long, value_name = "FILE")]
    plugin_http_ca_file: Option<PathBuf>,
    /// With --dev: install demo data — an organization, a cluster, a service and each plugin's
    /// demo (the App Store's: a catalog of self-hosted apps signed by a key trusted here only)
    #[arg(long)]
    demo: bool,
    /// With --dev --demo: the container engine the dev host's own node runs the demo's app on,
    /// unix:///path/to/socket or http://host:port [env: CAPSTAN_DEV_ENGINE] [default: DOCKER_HOST,
    /// else the first of the usual Docker and Podman sockets that exists]
    #[arg(long, value_name = "ENDPOINT", requires = "demo")]
    engine: Option<String>,
}

/// Exit status for a refused configuration (nothing was opened).
const EXIT_CONFIG: u8 = 2;
/// Exit status for a refusal after configuration (store, blobs, migrations, bind).
const EXIT_REFUSED: u8 = 1;

/// Run `network` with SIGPIPE blocked on this thread. A client command restores SIGPIPE's default
/// for stdout's sake, but a peer that closes a socket mid-write (a host refusing an oversized
/// upload) must surface as that write's EPIPE error — a refusal by name — not as the signal that
/// would end the command without a word. The pending signal is taken before unblocking.
fn without_sigpipe<T>(network: impl FnOnce() -> T) -> T {
    struct Restore(libc::sigset_t, libc::sigset_t);
    impl Drop for Restore {
        fn drop(&mut self) {
            let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: sigtimedwait and pthread_sigmask on sets built by sigemptyset/sigaddset.
            unsafe {
                while libc::sigtimedwait(&self.0, std::ptr::null_mut(), &zero) == libc::SIGPIPE {}
                libc::pthread_sigmask(libc::SIG_SETMASK, &self.1, std::ptr::null_mut());
            }
        }
    }
    // SAFETY: the sets are initialized by sigemptyset before use; the mask is this thread's own.
    let _restore = unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut previous);
        Restore(pipe, previous)
    };
    network()
}

/// Run the command line: parse, dispatch, and answer an exit status.
pub fn main() -> ExitCode {
    let command = Cli::command().mut_subcommand("serve", |serve| serve.after_long_help(config::vars_help()));
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = command.clone().try_get_matches_from(args.clone()).and_then(|matches| output::settle(&command, matches, args));
    let cli = match matches.and_then(|matches| Cli::from_arg_matches(&matches)) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if !matches!(cli.command, Command::Serve(_)) {
        // a client command whose reader went away (`capstan call --list | head`) ends quietly,
        // as other Unix tools do, instead of panicking on the write; `serve` keeps SIGPIPE
        // ignored, so a peer closing a socket never ends the host
        // SAFETY: restoring a signal's default disposition at start, before any thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.command {
        Command::Keyring(command) => keyring::run(command),
        Command::Fleet(command) => fleet::run(command),
        Command::Wg(command) => fleet::run_wg(command),
        Command::Plugin(command) => plugin::run(command),
        Command::Tasks(command) => tasks::run(command),
        Command::Login(args) if args.oidc => oidc_login::login(args),
        Command::Login(args) => client::login(args),
        Command::Logout(args) => client::logout(args),
        Command::Organizations(command) => inventory::organizations(command),
        Command::Clusters(command) => inventory::clusters(command),
        Command::Services(command) => inventory::services(command),
        Command::Deploy(args) => client::finish(deploy::deploy(&args), args.common.json),
        Command::Nodes(command) => nodes::run(command),
        Command::Settings(command) => inventory::settings(command),
        Command::Users(command) => users::run(command),
        Command::Publishers(command) => publishers::run(command),
        Command::Relays(command) => relays::run(command),
        Command::Audit(command) => audit::run(command),
        Command::Admin(command) => admin::run(command),
        Command::Secrets(command) => secrets::run(command),
        Command::Gateway(command) => gateway::run(command),
        Command::Snapshot(command) => snapshot::run(command),
        Command::Call(args) => call::run(args),
        // `capstan apps access …` is the host's, beside the App Store's `apps` commands
        Command::Added(args) if apps::is_access(&args) => apps::run_from(args),
        Command::Added(args) => {
            let host: Vec<String> = Cli::command().get_subcommands().map(|c| c.get_name().to_string()).collect();
            plugin_commands::run(args, &host)
        }
        Command::Completions(args) => completions::run(args, Cli::command()),
        Command::Serve(args) => {
            let flags = Flags {
                dev: args.dev,
                data_dir: args.data_dir,
                listen: args.listen,
                config_file: args.config,
                log_format: args.log_format,
                state_dir: args.state_dir,
                node_id: args.node_id,
                node_labels: args.node_labels,
                network: args.network,
                public_origin: args.public_origin,
                plugin_http_ca_file: args.plugin_http_ca_file,
                demo: args.demo,
                engine: args.engine,
            };
            let env = std::env::vars().filter(|(k, _)| k.starts_with("CAPSTAN_")).collect();
            let config = match config::resolve(&flags, &env) {
                Ok(config) => config,
                Err(refusal) => return refuse(&refusal, EXIT_CONFIG),
            };
            // before the runtime's threads allocate anything
            capstan_server::listener::bound_allocator_arenas();
            let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return refuse(&Refusal::internal(format!("starting the async runtime: {e}")), EXIT_REFUSED),
            };
            let served = runtime.block_on(capstan_server::serve::run(config, capstan_dashboard::pages()));
            // Background work still running (a component compiling on a blocking thread, say)
            // must not keep a stopping node up: it is safe to cut, every piece resumes at the
            // next start.
            runtime.shutdown_timeout(capstan_server::serve::SHUTDOWN_LEFTOVERS);
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(refusal) => {
                    tracing::error!(code = %refusal.code, detail = refusal.detail.as_deref().unwrap_or(""), "start refused: {}", refusal.message);
                    refuse(&refusal, EXIT_REFUSED)
                }
            }
        }
    }
}

/// Exit status when the host could not be reached (or did not answer in time): a script can
/// retry this one, unlike a refusal (1) or a usage or configuration mistake (2).
pub(crate) const EXIT_UNREACHABLE: u8 = 3;

/// The exit status a refusal ends a command with: [`EXIT_UNREACHABLE`] for a host that could not
/// be reached, [`EXIT_CONFIG`] for a server URL that is not one, else `status`
/// (docs/operating.md lists them).
pub(crate) fn exit_status(refusal: &Refusal, status: u8) -> u8 {
    match refusal.code.as_ref() {
        "host-unreachable" | "host-timeout" => EXIT_UNREACHABLE,
        "url-invalid" => EXIT_CONFIG,
        _ => status,
    }
}

/// Print a refusal for the operator: the code first, so scripts can match it.
pub(crate) fn refuse(refusal: &Refusal, status: u8) -> ExitCode {
    let status = exit_status(refusal, status);
    eprintln!("capstan: refused ({}): {}", refusal.code, refusal.message);
    if let Some(detail) = &refusal.detail {
        eprintln!("  detail: {detail}");
    }
    ExitCode::from(status)
}
