//! `capstan serve`: open the store and blobs, migrate, then serve the API until a signal.

use crate::api;
use crate::auth::{self, Auth, Bootstrap};
use crate::blobs::Blobs;
use crate::config::Network;
use crate::config::{LogFormat, ServeConfig};
use crate::fleet::identity::{Loaded, NodeIdentity};
use crate::fleet::runtime::Fleet;
use crate::fleet::{Addresses, Node};
use crate::keyring::Keyring;
use crate::migrate::{self, LockOptions};
use crate::plugins::bundle::PublisherKey;
use crate::plugins::host::PluginHost;
use crate::plugins::imports::{PluginHttp, Services};
use crate::plugins::runtime::Runtime;
use crate::refusal::{Refusal, Result};
use crate::scheduler::{HostTask, Scheduler};
use crate::state::{AppState, Parts};
use crate::store::{Store, StoreOptions};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::sync::Arc;

/// How long requests in flight may take to finish once a node is leaving.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the background loops, then any leftover background work, may take to stop once
/// the requests are done.
pub const SHUTDOWN_LEFTOVERS: std::time::Duration = std::time::Duration::from_secs(5);

/// Start this node (storage, migrations, fleet, plugins, scheduler) and serve the API and
/// `pages` until SIGTERM or SIGINT, then drain and stop.
pub async fn run(mut config: ServeConfig, pages: api::Pages) -> Result<()> {
    init_logging(&config);
    if let Some(dir) = &config.data_dir {
        announce_dev(&config);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Refusal::new("data-dir-unusable", format!("cannot create the data directory {}: {}", dir.display(), e.kind())))?;
    }

    let state_dir = &config.node.state_dir;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(state_dir).map_err(|e| {
        Refusal::new("state-dir-unusable", format!("cannot create the state directory {}: {}", state_dir.display(), e.kind()))
    })?;
    let (identity, loaded) = NodeIdentity::load_or_create(state_dir, config.node.node_id.as_deref())?;
    match loaded {
        Loaded::Created => tracing::info!(node = %identity.id, "new node identity created"),
        Loaded::Reused => tracing::info!(node = %identity.id, "node identity loaded"),
        Loaded::Replaced { previous } => {
            tracing::warn!(node = %identity.id, %previous, "pinned node id differs from the stored one: new key pair")
        }
    }
    if config.node.network == Some(Network::Wireguard) && !state_dir.join(crate::fleet::WIREGUARD_FILE).exists() {
        return Err(Refusal::new(
            "wireguard-key-missing",
            "--network wireguard needs a key pair: run `capstan wg init` with this state directory first",
        ));
    }

    let keyring = open_keyring(&config)?;
    let report = keyring.report();
    tracing::info!(active_kek = %report.active_kek_id, ingress_recipient = %report.ingress.id, "keyring loaded");

    let store_options = StoreOptions { database_name: config.database_name.clone(), budget: config.request_budget };
    let store = Store::open(&config.database_url, &store_options).await?;
    store.ping().await?;
    let blobs = Blobs::open(&config.blob_url, &config.s3).await?;
    blobs.probe().await?;
    tracing::info!(store = %store.describe(), blobs = %blobs.describe(), "storage ready");

    let chain = migrate::host_chain();
    let mut lock = LockOptions::for_this_process();
    lock.wait = config.migration_lock_wait;
    lock.ttl = config.migration_lock_ttl;
    let outcome = migrate::run(&store, &chain, &lock).await?;
    if outcome.stamped {
        tracing::info!(version = %outcome.to, "new database stamped at data version {}", outcome.to);
    } else if !outcome.applied.is_empty() {
        tracing::info!(steps = ?outcome.applied, "migrated data to version {}", outcome.to);
    }

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| Refusal::new("listen-failed", format!("cannot listen on {}: {}", config.listen, e.kind())))?;
    let bound = listener.local_addr().map_err(Refusal::internal)?;
    if config.listen.port() == 0 && config.dev_defaults.iter().any(|(var, _)| *var == crate::config::PUBLIC_ORIGIN) {
        // the dev default origin follows the port the system actually gave us
        config.public_origin = format!("http://{bound}");
    }
    let auth = Auth::new(store.clone(), &keyring, &config.public_origin).await?;
    crate::inventory::declare(&store).await?;
    crate::secrets::methods::declare(&store).await?;
    crate::relays::declare(&store).await?;
    capstan_runtime::declare(&store).await?;
    crate::nodes::declare(&store).await?;
    capstan_registry::declare(&store).await?;
    capstan_rpc::audit::declare(&store).await?;
    capstan_gateway::declare(&store).await?;
    capstan_storage::declare(&store).await?;
    for spec in capstan_federation::collections() {
        store.declare(spec).await?;
    }
    bootstrap_admin(&config, &store, &blobs).await?;
    let fleet = join_fleet(&config, &blobs, identity, bound).await?;
    let keyring = Arc::new(keyring);
    let plugins = start_plugins(&config, &store, &blobs, &keyring, &fleet).await?;
    let scheduler = start_scheduler(&store, &blobs, &fleet, &plugins).await?;
    let hosted_oidc = capstan_hosted_oidc::HostedOidc::new(store.clone(), keyring.clone(), &config.public_origin).await?;
    let federation = match config.platform_oidc.clone() {
        Some(settings) => {
            Some(capstan_federation::Federation::start(settings, store.clone(), blobs.clone(), keyring.clone(), auth.clone()).await?)
        }
        None => None,
    };
    let first_retention = scheduler.clone();
    tokio::spawn(async move {
        // the registry's first retention pass after a start (then hourly checks: docs/registry.md)
        tokio::time::sleep(std::time::Duration::from_millis(capstan_registry::retention::FIRST_PASS_AFTER)).await;
        if let Err(e) = first_retention.trigger(RETENTION_TASK, "capstan").await {
            tracing::info!(code = %e.code, "the registry's first retention pass did not start here: {}", e.message);
        }
    });
    let state = AppState::build(Parts {
        store,
        blobs,
        keyring,
        auth,
        chain,
        max_body_bytes: config.max_body_bytes,
        public_origin: config.public_origin.clone(),
        dev: config.dev,
        plugins: plugins.clone(),
        scheduler: scheduler.clone(),
        fleet: fleet.clone(),
        metrics_token: config.metrics_token.clone(),
        route_check: config.route_check.clone(),
        image_mirrors: config.image_mirrors.clone(),
        federation,
        hosted_oidc: Some(hosted_oidc),
    });
    let logs_runtime = state.runtime.clone();
    scheduler.register(
        HostTask::new("host.sweep-workload-logs", "Sweep workload logs", "*/10 * * * *", move |log| {
            let cx = logs_runtime.clone();
            async move {
                let swept = capstan_runtime::logs::segments::sweep(&cx).await?;
                let pruned = capstan_runtime::history::prune(&cx).await?;
                log.line(format!(
                    "{} attempts released, {} dropped whole, {} batches past the retention dropped, {} segments removed; {pruned} runtime events pruned",
                    swept.released, swept.attempts, swept.batches, swept.segments
                ));
                Ok(())
            }
        })
        .description("Lets workload logs go past runtimeLogRetentionDays (30 days unless set) and beyond a slot's newest 8 attempts, removes segments nothing names, and keeps each service's newest 500 runtime events (docs/runtime.md)."),
    )?;
    if config.demo {
        let setup = crate::demo::NodeSetup {
            data_dir: config.data_dir.clone().unwrap_or_default(),
            agent_binary: state.nodes.agent_binary.clone(),
            engine: config.demo_engine.clone(),
            origin: config.public_origin.clone(),
        };
        tokio::spawn(crate::demo::install(state.methods.clone(), state.plugins.clone(), setup));
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut loops = fleet.spawn(stopped.clone());
    loops.push(crate::plugins::work::spawn(plugins, Some(fleet.clone()), stopped.clone()));
    loops.extend(state.relays.spawn(stopped.clone()).await?);
    // the runtime's producer runs where the fleet places it; delivery runs on every node
    let placed = fleet.clone();
    fleet.add_workload_source(Arc::new(|| {
        vec![crate::fleet::placement::Workload { id: capstan_runtime::PRODUCER_WORKLOAD.into(), replicas: 1, selector: Default::default() }]
    }));
    loops.extend(capstan_runtime::spawn(
        state.runtime.clone(),
        move || {
            let placed = placed.clone();
            async move { placed.assigned_here(capstan_runtime::PRODUCER_WORKLOAD).await }
        },
        stopped.clone(),
    ));
    loops.push(capstan_gateway::spawn_finalizer(state.gateway.clone(), config.gateway_retry, stopped.clone()));
    loops.push(scheduler.spawn(stopped));
    let signalled = shutdown_signal()?;
    println!("Capstan serving on http://{bound} (public origin {}) as node {}", config.public_origin, fleet.node.identity.id);
    tracing::info!(address = %bound, "serving");

    let leaving = fleet.clone();
    let (draining_tx, mut draining) = tokio::sync::watch::channel(false);
    let proxies = config.trusted_proxies.clone();
    // the budget holds at least one body of the largest size a caller may send
    let bounds = crate::listener::Bounds::new(config.max_connections, config.max_inflight_body_bytes.max(config.max_body_bytes));
    let sockets = state.sockets.clone();
    let server = crate::listener::serve(listener, api::router(state, pages), bounds, proxies, async move {
        signalled.await;
        // first tell the fleet this node is leaving, then finish what is in flight
        leaving.drain().await;
        // socket sessions are not requests the listener drains: tell them to reconnect
        sockets.close_all().await;
        let _ = draining_tx.send(true);
    });
    // Requests in flight get a bounded time to finish: a client that never completes its
    // request must not keep a leaving node up.
    let deadline = async {
        let _ = draining.wait_for(|d| *d).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        _ = server => {}
        _ = deadline => tracing::warn!("requests still in flight after {} s; stopping anyway", SHUTDOWN_GRACE.as_secs()),
    }
    let _ = stop.send(true);
    // the loops stop together, within one bound
    if tokio::time::timeout(SHUTDOWN_LEFTOVERS, futures::future::join_all(loops)).await.is_err() {
        tracing::warn!("background work still running after {} s; stopping anyway", SHUTDOWN_LEFTOVERS.as_secs());
    }
    tracing::info!("stopped");
    Ok(())
}

/// The plugin runtime: the engine (compiled components cached in the state directory), the
/// trusted publishers, every enabled plugin loaded from the registry, and the first-party
/// plugins installed or upgraded in the background.
async fn start_plugins(
    config: &ServeConfig,
    store: &Store,
    blobs: &Blobs,
    keyring: &Arc<Keyring>,
    fleet: &Arc<Fleet>,
) -> Result<Arc<PluginHost>> {
    let publishers = config
        .trusted_publishers
        .iter()
        .map(|k| k.parse::<PublisherKey>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Refusal::new("config-invalid", format!("{}: {e}", crate::config::TRUSTED_PUBLISHERS)))?;
    let runtime = Runtime::new(Some(config.node.state_dir.join("plugin-cache")))?;
    let roots = config.plugin_http_ca.as_ref().map(|ca| ca.certificates.as_slice()).unwrap_or_default();
    let http = PluginHttp::new(roots, &config.plugin_http_allow)
        .map_err(|e| {
            Refusal::new("config-invalid", format!("{}: the plugin HTTP client cannot be built: {e}", crate::config::PLUGIN_HTTP_CA_FILE))
        })?
        .with_extra_roots_pem(config.plugin_http_ca.as_ref().map(|ca| ca.pem.clone()));
    if let Some(ca) = &config.plugin_http_ca {
        let (file, certificates) = (ca.path.display(), ca.certificates.len());
        tracing::info!(%file, certificates, "plugin outbound HTTPS also trusts the roots in {}", crate::config::PLUGIN_HTTP_CA_FILE);
    }
    let audit = capstan_rpc::audit::AuditLog::new(store.clone());
    let platform =
        capstan_links::InventoryPlatform::audited(store.clone(), keyring.clone(), Arc::new(capstan_links::HostDependents), audit);
    let services = Services::with_http(store.clone(), blobs.clone(), keyring.clone(), fleet.node.identity.id.clone(), platform, http);
    let plugins = PluginHost::new(runtime, services, publishers, crate::plugins::first_party::bundles()?).await?;
    plugins.sync().await?;
    // Installing or upgrading the embedded plugins compiles them: done in the background, so
    // a first start serves at once and the plugins arrive seconds later.
    let installing = plugins.clone();
    tokio::spawn(async move {
        if let Err(e) = installing.install_first_party().await {
            tracing::warn!(refusal = %e, "first-party plugins not installed; the next start tries again");
        }
    });
    let source = plugins.clone();
    fleet.add_workload_source(Arc::new(move || source.loaded().iter().map(|a| a.described.placement.clone()).collect()));
    let loaded = plugins.loaded();
    tracing::info!(plugins = loaded.len(), "plugin runtime ready");
    Ok(plugins)
}

/// The scheduler with the host's tasks; the coordinator places them.
/// The registry's retention pass (a host task; docs/registry.md).
const RETENTION_TASK: &str = "host.registry-retention";

async fn start_scheduler(store: &Store, blobs: &Blobs, fleet: &Arc<Fleet>, plugins: &Arc<PluginHost>) -> Result<Arc<Scheduler>> {
    let scheduler = Scheduler::new(store.clone(), fleet.node.identity.id.clone(), Some(fleet.clone()), Some(plugins.clone())).await?;
    let reaper_store = store.clone();
    scheduler.register(
        HostTask::new("host.reap-expired-sessions", "Remove expired sessions", "*/5 * * * *", move |log| {
            let store = reaper_store.clone();
            async move {
                let reaped = auth::reap_expired_sessions(&store).await?;
                log.line(format!("removed {reaped} expired sessions"));
                let forgotten = auth::attempts::reap(&store).await?;
                log.line(format!("forgot {forgotten} counts of failed logins past their window"));
                let federated = capstan_federation::reap_expired(&store).await?;
                log.line(format!("removed {federated} expired identity-provider logins, handoffs and sessions"));
                Ok(())
            }
        })
        .description(
            "Deletes sessions whose expiry has passed, counts of failed logins past their window, and identity-provider logins, handoffs and sessions past theirs.",
        ),
    )?;
    let registry_storage = capstan_registry::storage::Storage { store: store.clone(), blobs: blobs.clone() };
    scheduler.register(
        HostTask::new("host.expire-registry-uploads", "Expire abandoned registry uploads", "17 * * * *", move |log| {
            let storage = registry_storage.clone();
            async move {
                let expired = storage.expire_uploads(capstan_core::clock::now_ms()).await?;
                log.line(format!("removed {expired} registry uploads untouched for a day"));
                Ok(())
            }
        })
        .description("Removes registry blob uploads nobody touched for 24 hours, with the parts they stored."),
    )?;
    let retention_storage = capstan_registry::storage::Storage { store: store.clone(), blobs: blobs.clone() };
    let started = std::time::Instant::now();
    let first_pass = Arc::new(std::sync::atomic::AtomicBool::new(true));
    scheduler.register(
        HostTask::new(RETENTION_TASK, "Registry retention", "41 * * * *", move |log| {
            let (storage, first_pass) = (retention_storage.clone(), first_pass.clone());
            async move {
                use capstan_registry::retention;
                let (now, uptime) = (capstan_core::clock::now_ms(), capstan_core::clock::millis(started.elapsed()));
                // a pass 3 minutes after start, then daily (hourly while one left work)
                let first = uptime >= retention::FIRST_PASS_AFTER && first_pass.swap(false, std::sync::atomic::Ordering::SeqCst);
                if !first && !retention::due(&storage, now).await? {
                    log.line("no pass due: the last one left nothing to do and ran less than a day ago");
                    return Ok(());
                }
                let summary = retention::pass(&storage, now, uptime, &retention::Limits::default()).await?;
                tracing::info!("{summary}");
                log.line(summary.to_string());
                Ok(())
            }
        })
        .description("Deletes what nothing reaches any more from the registry: untagged manifests a day after their last use, then blobs no manifest names (docs/registry.md, \"Retention\")."),
    )?;
    let finalizer_store = store.clone();
    scheduler.register(
        HostTask::new("host.finalize-deleted-services", "Finish service deletions", "* * * * *", move |log| {
            let store = finalizer_store.clone();
            async move {
                let (finished, waiting) = crate::inventory::services::finalize_deleting(&store, &capstan_links::HostDependents).await?;
                log.line(format!("finished {finished} deletions; {waiting} still wait for managers to release them"));
                Ok(())
            }
        })
        .description("Deletes every service marked for deletion that no manager holds any more, so an interrupted deletion is finished, never stranded."),
    )?;
    let audit_store = store.clone();
    scheduler.register(
        HostTask::new("host.prune-audit-records", "Prune the audit log", "23 3 * * *", move |log| {
            let store = audit_store.clone();
            async move {
                let days = crate::inventory::settings::audit_retention_days(&store).await?;
                let pruned = capstan_rpc::audit::AuditLog::new(store).prune(capstan_core::clock::now_ms(), days).await?;
                log.line(format!("deleted {pruned} audit records older than {days} days"));
                Ok(())
            }
        })
        .description("Deletes audit records older than the setting auditRetentionDays (90 days unless set)."),
    )?;
    let (snapshot_store, snapshot_blobs) = (store.clone(), blobs.clone());
    scheduler.register(
        HostTask::new("host.snapshot", "Snapshot Capstan", "41 2 * * *", move |log| {
            let (store, blobs) = (snapshot_store.clone(), snapshot_blobs.clone());
            async move {
                let keep = crate::inventory::settings::snapshot_keep_last(&store).await?;
                let (key, written) = crate::snapshot::write_to_bucket(&store, &blobs).await?;
                let manifest = &written.manifest;
                log.line(format!(
                    "wrote {key}: {} bytes, {} documents, {} blobs (the keyring is not in it)",
                    written.bytes, manifest.documents, manifest.blobs
                ));
                let pruned = crate::snapshot::prune_bucket(&blobs, keep).await?;
                log.line(format!("kept the newest {keep}; deleted {} older: {}", pruned.len(), pruned.join(", ")));
                Ok(())
            }
        })
        .description(
            "Writes a snapshot of Capstan (every collection and the plugins' blobs, never the keyring) under _capstan/snapshots/ in the blob store, then keeps the newest snapshotKeepLast (7 unless set), deleting the oldest first. Off until an administrator enables it.",
        )
        .disabled_by_default()
        .max_duration(std::time::Duration::from_secs(3600)),
    )?;
    let source = scheduler.clone();
    fleet.add_workload_source(Arc::new(move || source.workloads()));
    Ok(scheduler)
}

/// Register this node in the fleet and prepare its loops.
async fn join_fleet(config: &ServeConfig, blobs: &Blobs, identity: NodeIdentity, bound: SocketAddr) -> Result<Arc<Fleet>> {
    let internal = match &config.node.advertise {
        Some(address) => address.rsplit_once(':').map(|(host, _)| host.to_string()).unwrap_or_else(|| address.clone()),
        // a wildcard bind is dialled locally on 127.0.0.1; a specific one as bound
        None if bound.ip().is_unspecified() => "127.0.0.1".into(),
        None => bound.ip().to_string(),
    };
    let port = config.node.advertise.as_deref().and_then(|a| a.rsplit_once(':')).and_then(|(_, p)| p.parse().ok()).unwrap_or(bound.port());
    let network = config.node.network.map(|n| n.as_str().to_string());
    let node = Arc::new(Node::new(blobs.clone(), identity, config.node.timing, network));
    node.register(Addresses { internal, api_port: port }, config.node.labels.clone(), vec!["api".into(), "dashboard".into()]).await?;
    Ok(Fleet::new(node))
}

/// The first administrator: from CAPSTAN_ADMIN_ACCOUNT, or in dev mode on a store without
/// users, with a generated password printed here once (never logged, never shown again).
async fn bootstrap_admin(config: &ServeConfig, store: &Store, blobs: &Blobs) -> Result<()> {
    if let Some(account) = &config.admin_account {
        let Some((username, password)) = account.expose().split_once(':') else {
            return Err(Refusal::new("config-invalid", "CAPSTAN_ADMIN_ACCOUNT must be username:password"));
        };
        match auth::bootstrap_admin(store, blobs, username, password).await? {
            Bootstrap::Created { username } => tracing::info!(%username, "administrator created from CAPSTAN_ADMIN_ACCOUNT"),
            Bootstrap::AlreadyExists { username } => {
                tracing::info!(%username, "administrator exists; CAPSTAN_ADMIN_ACCOUNT does not change an existing user's password")
            }
        }
        return Ok(());
    }
    if config.dev && !auth::any_user(store).await? {
        let password = auth::password::generate();
        if let Bootstrap::Created { username } = auth::bootstrap_admin(store, blobs, "admin", &password).await? {
            println!("  administrator: {username}");
            println!("  password:      {password}");
            println!("  (shown this once; Capstan keeps only a scrypt verifier of it)");
            tracing::info!(%username, "dev mode created the first administrator; its password was printed once on stdout");
        }
    }
    Ok(())
}

/// Load the keyring; in dev mode, generate it on first start. Refuses `keyring-invalid`.
fn open_keyring(config: &ServeConfig) -> Result<Keyring> {
    let path = &config.keyring_path;
    if config.dev && std::fs::symlink_metadata(path).is_err() {
        Keyring::generate(None, None)?.write_new(path)?;
        println!("  generated a new keyring at {} (mode 0600); keep it with the data", path.display());
    }
    refuse_shared_keyring(path)?;
    Keyring::load(path)
}

/// A keyring that group or others may read or write is refused `keyring-invalid`: its keys
/// unseal every secret, so a start must not go on with them exposed.
fn refuse_shared_keyring(path: &std::path::Path) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else { return Ok(()) }; // Keyring::load names a missing file
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Refusal::new(
            "keyring-invalid",
            format!("the keyring {} has mode {mode:04o}: group or others may read or write it; chmod 600 it", path.display()),
        )
        .with_data(serde_json::json!({ "reason": "permissions", "mode": format!("{mode:04o}"), "path": path.display().to_string() })));
    }
    Ok(())
}

fn announce_dev(config: &ServeConfig) {
    println!("Capstan dev mode: embedded store and blobs, for one machine and for trying things out.");
    for (var, value) in &config.dev_defaults {
        println!("  {var} = {value}  (dev default)");
    }
    if config.dev_defaults.is_empty() {
        println!("  every value was given explicitly; no defaults chosen");
    }
}

fn init_logging(config: &ServeConfig) {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_filter).unwrap_or_else(|_| {
        eprintln!("capstan: CAPSTAN_LOG {:?} is not a valid filter; using info", config.log_filter);
        tracing_subscriber::EnvFilter::new("info")
    });
    // the MCP SDK logs every stateless /mcp request's start and end at info: only its warnings,
    // unless the filter names it
    let filter = match "rmcp=warn".parse() {
        Ok(quiet) if !config.log_filter.contains("rmcp") => filter.add_directive(quiet),
        _ => filter,
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match config.log_format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).with_span_list(false).try_init(),
    };
}

/// Listen for SIGTERM and SIGINT from now on (so a signal arriving right after the serving
/// line still drains); the returned future completes on the first of them.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| Refusal::internal(format!("installing the SIGTERM handler: {e}")))?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| Refusal::internal(format!("installing the SIGINT handler: {e}")))?;
    Ok(async move {
        tokio::select! { _ = terminate.recv() => {}, _ = interrupt.recv() => {} }
        tracing::info!("shutting down: finishing requests in flight");
    })
}
