//! Capstan's OCI registry: the distribution API (pull, push, content discovery, management)
//! under `/v2` on the blob store, with the Docker token flow over Capstan's own sessions
//! (docs/registry.md).
//!
//! A repository maps to a service (`workloads/<service-name>-<12 hex of its id>`), and who may
//! pull, push or delete is judged on every request from the caller's roles and grants as they
//! are now. Administrators may also use repositories that map to no service. A node's agent
//! pulls with a short-lived pull credential scoped to one repository ([`pulls`]).

pub mod access;
pub mod deployments;
pub mod errors;
pub mod manifests;
pub mod methods;
pub mod names;
pub mod pulls;
pub mod retention;
pub mod rollback;
pub mod rollout;
pub mod route_check;
mod routes;
pub mod storage;
mod token;

use capstan_auth::Auth;
use capstan_blobs::Blobs;
use capstan_core::refusal::Result;
use capstan_store::Store;
use std::sync::Arc;

pub use routes::routes;

/// What the registry's routes reach.
#[derive(Clone)]
pub struct Registry {
    /// Where the registry keeps its facts and bytes.
    pub storage: storage::Storage,
    /// Turns a bearer into an identity; opens sessions at `/v2/token`.
    pub auth: Arc<Auth>,
    /// This Capstan's public origin: the token realm, and the host in image references.
    pub public_origin: String,
    /// How a deployment's routes are checked before they are declared promoted.
    pub route_check: route_check::RouteCheck,
    /// What the runtime says of a promoted release.
    pub rollouts: Arc<dyn rollout::Rollouts>,
}

impl Registry {
    /// The registry over `store` and `blobs`.
    pub fn new(
        store: Store,
        blobs: Blobs,
        auth: Arc<Auth>,
        public_origin: &str,
        route_check: route_check::RouteCheck,
        rollouts: Arc<dyn rollout::Rollouts>,
    ) -> Arc<Registry> {
        Arc::new(Registry {
            storage: storage::Storage { store, blobs },
            auth,
            public_origin: public_origin.trim_end_matches('/').to_string(),
            route_check,
            rollouts,
        })
    }

    /// The host part of image references (`capstan.example.com`, `127.0.0.1:8080`).
    pub fn host(&self) -> &str {
        registry_host(&self.public_origin)
    }
}

/// The host an image reference names for `public_origin` (its scheme left off).
pub fn registry_host(public_origin: &str) -> &str {
    public_origin.split_once("://").map_or(public_origin, |(_, rest)| rest).trim_end_matches('/')
}

/// Declare the registry's collections.
pub async fn declare(store: &Store) -> Result<()> {
    let specs = [storage::collections(), retention::collections(), deployments::collections(), pulls::collections()];
    for spec in specs.into_iter().flatten() {
        store.declare(spec).await?;
    }
    Ok(())
}

/// Text a client sent, shortened for an answer or a log line.
pub(crate) fn text(s: &str) -> String {
    capstan_core::text::truncate(s, 120)
}
