//! The host state: every part the host is made of (the store, the blobs, the keyring, the
//! registry of methods, the plugin host, the fleet, the socket hub, …), assembled once from its
//! [`Parts`] ([`AppState::build`]), which registers every area's methods with the context that
//! area needs. `serve` builds it, a test builds it with [`test_state`].
//!
//! No handler takes the whole state: each takes the part it needs as axum's `State<Part>`,
//! through the [`FromRef`] impls here (a field: the registry, the store, the blobs, auth, the
//! relays, the nodes area; or a small view: [`System`], [`Scrape`], [`PublicOrigin`],
//! [`BodyLimit`]), or through one beside a view defined above this module (the socket's
//! `SocketState`, the dashboard's pages').

use crate::auth::Auth;
use crate::blobs::Blobs;
use crate::keyring::Keyring;
use crate::metrics::{Metrics, Scrape};
use crate::migrate::Chain;
use crate::plugins::host::PluginHost;
use crate::relays::Relays;
use crate::sessions::{Hub, Limits};
use crate::store::Store;
use crate::system::{self, System};
use axum::extract::FromRef;
use capstan_rpc::Registry;
use std::sync::Arc;

/// Every part of the host. Handlers take the parts they need ([`FromRef`]); methods reach only
/// the context their area registered them with (see [`AppState::build`]).
#[derive(Clone)]
pub struct AppState {
    /// The document store (SQLite or MongoDB).
    pub store: Store,
    /// The object storage (a local directory or an S3 bucket).
    pub blobs: Blobs,
    /// The keyring: the KEKs that seal secrets and the ingress recipient.
    pub keyring: Arc<Keyring>,
    /// Authentication: turns a bearer token into the caller's identity.
    pub auth: Arc<Auth>,
    /// The host's migration chain, which `/status` judges readiness against.
    pub chain: Arc<Chain>,
    /// Every API method, the host's and loaded plugins', resolved by name on each call.
    pub methods: Arc<Registry>,
    /// Largest API request body accepted, in bytes (`CAPSTAN_MAX_BODY_BYTES`).
    pub max_body_bytes: usize,
    /// The externally reachable origin of this Capstan, without a trailing slash.
    pub public_origin: String,
    /// The plugin host: the plugins loaded on this node.
    pub plugins: Arc<PluginHost>,
    /// The scheduler running host and plugin tasks.
    pub scheduler: Arc<crate::scheduler::Scheduler>,
    /// This node's place in the fleet (a test host's is registered in its own bucket).
    pub fleet: Arc<crate::fleet::runtime::Fleet>,
    /// The nodes area: what the `/jump` and `/agent/v1` routes reach (its clock is the one the
    /// `nodes.*` methods read).
    pub nodes: crate::nodes::Context,
    /// The open `/api/v1/socket` sessions, and how host code pushes to them.
    pub sockets: Arc<Hub>,
    /// The cluster relays this node holds, and the election that reaches any relay of the fleet.
    pub relays: Arc<Relays>,
    /// The runtime: specs, the producer, the node sessions this node carries.
    pub runtime: capstan_runtime::Context,
    /// What `GET /metrics` serves, and to whom.
    pub metrics: Arc<Metrics>,
    /// The OCI registry under `/v2`.
    pub registry: Arc<capstan_registry::Registry>,
    /// Capstan's enrollment at the external gateway.
    pub gateway: capstan_gateway::Context,
    /// The platform login through an identity provider, when configured.
    pub federation: Option<Arc<capstan_federation::Federation>>,
    /// The OpenID provider of hosted apps (`serve` always starts it; host tests may leave it out).
    pub hosted_oidc: Option<Arc<capstan_hosted_oidc::HostedOidc>>,
}

/// Everything the host state is made of, assembled by `serve` (or a test) before the state.
pub struct Parts {
    /// The opened document store.
    pub store: Store,
    /// The opened object storage.
    pub blobs: Blobs,
    /// The loaded keyring.
    pub keyring: Arc<Keyring>,
    /// Authentication over the store and keyring.
    pub auth: Arc<Auth>,
    /// The host's migration chain (shared once the state is built).
    pub chain: Chain,
    /// Largest API request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// The externally reachable origin of this Capstan.
    pub public_origin: String,
    /// Dev mode (`serve --dev`): a jump script may be rendered for an `http` origin.
    pub dev: bool,
    /// The started plugin host; its methods join the registry.
    pub plugins: Arc<PluginHost>,
    /// The started scheduler, with the host's tasks registered.
    pub scheduler: Arc<crate::scheduler::Scheduler>,
    /// This node's place in the fleet.
    pub fleet: Arc<crate::fleet::runtime::Fleet>,
    /// The token `GET /metrics` answers to (`CAPSTAN_METRICS_TOKEN`); `None`: it is off.
    pub metrics_token: Option<capstan_core::text::SecretString>,
    /// How deployments' routes are checked (`CAPSTAN_ROUTE_CHECK_*`).
    pub route_check: capstan_registry::route_check::RouteCheck,
    /// Where image tags are resolved instead of their registries (`CAPSTAN_IMAGE_MIRRORS`).
    pub image_mirrors: Vec<capstan_runtime::images::Mirror>,
    /// The platform login through an identity provider, when configured.
    pub federation: Option<Arc<capstan_federation::Federation>>,
    /// The OpenID provider of hosted apps (`serve` always starts it; host tests may leave it out).
    pub hosted_oidc: Option<Arc<capstan_hosted_oidc::HostedOidc>>,
}

impl AppState {
    /// The host state, with every area's methods registered with the context it needs.
    pub fn build(parts: Parts) -> Self {
        let Parts {
            store,
            blobs,
            keyring,
            auth,
            chain,
            max_body_bytes,
            public_origin,
            dev,
            plugins,
            scheduler,
            fleet,
            metrics_token,
            route_check,
            image_mirrors,
            federation,
            hosted_oidc,
        } = parts;
        let chain = Arc::new(chain);
        let mut registry = Registry::default();
        system::register(
            &mut registry,
            System { store: store.clone(), blobs: blobs.clone(), chain: chain.clone(), plugins: plugins.clone(), dev },
        );
        crate::auth::methods::register(
            &mut registry,
            crate::auth::methods::Context { auth: auth.clone(), store: store.clone(), blobs: blobs.clone() },
        );
        crate::fleet::methods::register(&mut registry, fleet.clone());
        crate::snapshot::register(&mut registry, crate::snapshot::Context { store: store.clone(), blobs: blobs.clone() });
        crate::events::methods::register(&mut registry, store.clone());
        crate::plugins::methods::register(&mut registry, crate::plugins::methods::Context { host: plugins.clone(), blobs: blobs.clone() });
        crate::scheduler::methods::register(&mut registry, scheduler.clone());
        registry.add_source(plugins.clone());
        crate::inventory::register(
            &mut registry,
            crate::inventory::Context {
                store: store.clone(),
                blobs: blobs.clone(),
                dependents: Arc::new(capstan_links::HostDependents),
                receipts: auth.receipt_keys().clone(),
            },
        );
        let secrets = crate::secrets::methods::Context { store: store.clone(), keyring: keyring.clone() };
        crate::secrets::methods::register(&mut registry, secrets.clone());
        let gateway = capstan_gateway::Context::new(secrets.clone());
        capstan_gateway::register(&mut registry, gateway.clone());
        let storage = capstan_storage::Context::new(secrets.clone());
        capstan_storage::register(&mut registry, storage.clone());
        let nodes = crate::nodes::Context::new(store.clone(), public_origin.clone(), dev);
        crate::nodes::register(&mut registry, nodes.clone());
        let sockets = Arc::new(Hub::new(Limits::for_bodies(max_body_bytes)));
        let peers = crate::relays::forward::Peers::new(fleet.clone());
        let relays = Relays::new(store.clone(), sockets.clone(), fleet.node.identity.id.clone(), peers);
        crate::relays::register(&mut registry, secrets.clone(), relays.clone());
        let runtime = capstan_runtime::Context::new(
            store.clone(),
            Arc::new(capstan_links::HostDependents),
            nodes.clone(),
            sockets.clone(),
            keyring.clone(),
            blobs.clone(),
        )
        .with_image_mirrors(image_mirrors);
        capstan_runtime::register(&mut registry, runtime.clone());
        // node sessions registered here are recorded as held by this fleet node, and node calls
        // other fleet nodes carry here are answered by them
        runtime.place(&fleet.node.identity.id);
        relays.set_node_calls(Arc::new(crate::plugins::agents::NodeCallsHere(runtime.clone())));
        let oci = capstan_registry::Registry::new(
            store.clone(),
            blobs.clone(),
            auth.clone(),
            &public_origin,
            route_check,
            Arc::new(capstan_runtime::rollout::Evidence),
        );
        capstan_registry::methods::register(&mut registry, oci.clone());
        capstan_registry::deployments::register(&mut registry, oci.clone());
        capstan_registry::rollback::register(&mut registry, oci.clone());
        capstan_rpc::audit::register(&mut registry, capstan_rpc::audit::AuditLog::new(store.clone()));
        registry.set_audit(capstan_rpc::audit::AuditLog::new(store.clone()));
        registry.set_authenticator(auth.clone());
        registry.set_coordination(fleet.clone());
        capstan_federation::methods::register(&mut registry, federation.clone());
        if let Some(oidc) = &hosted_oidc {
            crate::hosted_apps::register(&mut registry, crate::hosted_apps::Context { oidc: oidc.clone(), secrets: secrets.clone() });
        }
        if let Some(federation) = &federation {
            registry.set_live_authority(federation.clone());
        }
        plugins.set_agent_dispatch(Arc::new(crate::plugins::agents::AgentCalls { relays: relays.clone(), runtime: runtime.clone() }));
        plugins.set_gateway_dispatch(Arc::new(crate::plugins::gateway::GatewayCalls(gateway.clone())));
        plugins.set_storage_dispatch(Arc::new(crate::plugins::storage::StorageCalls(storage)));
        plugins.set_public_origin(&public_origin);
        AppState {
            store,
            blobs,
            keyring,
            auth,
            chain,
            methods: Arc::new(registry),
            max_body_bytes,
            public_origin,
            plugins,
            scheduler,
            fleet,
            nodes,
            sockets,
            relays,
            runtime,
            metrics: Metrics::new(metrics_token.as_ref()),
            registry: oci,
            gateway,
            federation,
            hosted_oidc,
        }
    }
}

impl AppState {
    /// What readiness is judged on.
    pub fn system(&self) -> System {
        System {
            store: self.store.clone(),
            blobs: self.blobs.clone(),
            chain: self.chain.clone(),
            plugins: self.plugins.clone(),
            dev: self.nodes.dev,
        }
    }
}

#[cfg(test)]
impl AppState {
    /// The same host with another keyring (as `capstan keyring rotate` and a restart give).
    pub fn with_keyring(self, keyring: Arc<Keyring>) -> AppState {
        let AppState {
            store,
            blobs,
            auth,
            chain,
            max_body_bytes,
            public_origin,
            plugins,
            scheduler,
            fleet,
            nodes,
            registry,
            federation,
            hosted_oidc,
            ..
        } = self;
        let route_check = registry.route_check.clone();
        let chain = Arc::try_unwrap(chain).unwrap_or_else(|shared| (*shared).clone());
        let dev = nodes.dev;
        let metrics_token = None;
        AppState::build(Parts {
            store,
            blobs,
            keyring,
            auth,
            chain,
            max_body_bytes,
            public_origin,
            dev,
            plugins,
            scheduler,
            fleet,
            metrics_token,
            route_check,
            image_mirrors: Vec::new(),
            federation,
            hosted_oidc,
        })
    }
}

/// A complete host state on an embedded store in `dir`, for tests (here and, through the
/// `testing` feature, the dashboard's).
#[cfg(any(test, feature = "testing"))]
pub async fn test_state(dir: &std::path::Path) -> AppState {
    test_state_at(dir, "http://capstan.test", false).await
}

/// [`test_state`] with another public origin, in dev mode or not.
#[cfg(any(test, feature = "testing"))]
pub async fn test_state_at(dir: &std::path::Path, public_origin: &str, dev: bool) -> AppState {
    let store = Store::new(crate::store::sqlite::SqliteStore::open(dir.join("capstan.sqlite")).unwrap(), crate::store::DEFAULT_BUDGET);
    test_state_on(dir, store, public_origin, dev).await
}

/// [`test_state_at`] on the given store (a MongoDB one, say); the rest is kept in `dir`.
#[cfg(any(test, feature = "testing"))]
pub async fn test_state_on(dir: &std::path::Path, store: Store, public_origin: &str, dev: bool) -> AppState {
    let blobs = Blobs::new(crate::blobs::local::LocalBlobs::open(dir.join("blobs").to_str().unwrap()).await.unwrap());
    let keyring = Arc::new(Keyring::generate(None, None).unwrap());
    let auth = Auth::new(store.clone(), &keyring, "http://capstan.test").await.unwrap();
    crate::inventory::declare(&store).await.unwrap();
    crate::secrets::methods::declare(&store).await.unwrap();
    crate::relays::declare(&store).await.unwrap();
    capstan_runtime::declare(&store).await.unwrap();
    crate::nodes::declare(&store).await.unwrap();
    capstan_registry::declare(&store).await.unwrap();
    capstan_rpc::audit::declare(&store).await.unwrap();
    capstan_gateway::declare(&store).await.unwrap();
    capstan_storage::declare(&store).await.unwrap();
    let audit = capstan_rpc::audit::AuditLog::new(store.clone());
    let platform =
        capstan_links::InventoryPlatform::audited(store.clone(), keyring.clone(), Arc::new(capstan_links::HostDependents), audit);
    // plugins may reach 127.0.0.0/8 (the tests' servers), and no other internal address
    let http = crate::plugins::imports::PluginHttp::new(&[], &["127.0.0.0/8".parse().unwrap()]).unwrap();
    let services =
        crate::plugins::imports::Services::with_http(store.clone(), blobs.clone(), keyring.clone(), "test-node".into(), platform, http);
    let runtime = crate::plugins::runtime::Runtime::new(Some(dir.join("plugin-cache"))).unwrap();
    let first_party = crate::plugins::first_party::bundles().unwrap();
    let plugins = PluginHost::new(runtime, services, vec![], first_party).await.unwrap();
    let scheduler = crate::scheduler::Scheduler::new(store.clone(), "test-node".into(), None, Some(plugins.clone())).await.unwrap();
    // a node identity of its own; it neither registers in the bucket nor runs the fleet's loops,
    // so the bucket holds only what a test puts there and no coordinator lease is taken
    let (identity, _) = crate::fleet::identity::NodeIdentity::load_or_create(&dir.join("state"), Some("test-node")).unwrap();
    let fleet = crate::fleet::runtime::Fleet::new(Arc::new(crate::fleet::Node::new(blobs.clone(), identity, Default::default(), None)));
    AppState::build(Parts {
        store,
        blobs,
        keyring,
        auth,
        chain: crate::migrate::host_chain(),
        max_body_bytes: 1 << 20,
        public_origin: public_origin.into(),
        dev,
        plugins,
        scheduler,
        fleet,
        metrics_token: None,
        route_check: Default::default(),
        image_mirrors: Vec::new(),
        federation: None,
        hosted_oidc: None,
    })
}

/// The parts a handler takes whole, each as `State<Part>`.
macro_rules! parts {
    ($($field:ident: $part:ty),* $(,)?) => {
        $(
            impl FromRef<AppState> for $part {
                fn from_ref(state: &AppState) -> $part {
                    state.$field.clone()
                }
            }
        )*
    };
}

parts! {
    store: Store,
    blobs: Blobs,
    auth: Arc<Auth>,
    methods: Arc<Registry>,
    nodes: crate::nodes::Context,
    relays: Arc<Relays>,
}

impl FromRef<AppState> for System {
    fn from_ref(state: &AppState) -> System {
        state.system()
    }
}

impl FromRef<AppState> for Scrape {
    fn from_ref(state: &AppState) -> Scrape {
        Scrape {
            metrics: state.metrics.clone(),
            sockets: state.sockets.clone(),
            relays: state.relays.clone(),
            fleet: state.fleet.clone(),
            plugins: state.plugins.clone(),
            store: state.store.clone(),
        }
    }
}

/// The externally reachable origin of this Capstan, without a trailing slash
/// ([`AppState::public_origin`]).
#[derive(Debug, Clone)]
pub struct PublicOrigin(pub String);

impl FromRef<AppState> for PublicOrigin {
    fn from_ref(state: &AppState) -> PublicOrigin {
        PublicOrigin(state.public_origin.clone())
    }
}

/// The largest API request body accepted, in bytes ([`AppState::max_body_bytes`]).
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

impl FromRef<AppState> for BodyLimit {
    fn from_ref(state: &AppState) -> BodyLimit {
        BodyLimit(state.max_body_bytes)
    }
}
