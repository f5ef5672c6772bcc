//! Storage endpoints of nodes and the providers behind them (docs/bindings.md): where a node's
//! PostgreSQL server is, its admin credential as a system secret, and the provider work a
//! binding needs — a role and a database per PostgreSQL binding — idempotent and resumable.
//! Managers reach it through the plugin host's `storage` import, which the server answers here.

pub mod bindings;
pub mod endpoints;
pub mod postgres;
pub mod s3;

use capstan_core::refusal::Result;
use capstan_rpc::Registry;
use capstan_store::Store;

/// What storage reaches: the store and the secrets (the admin credentials, the bindings'
/// credentials).
#[derive(Clone)]
pub struct Context {
    /// The secrets' context (its store is Capstan's store).
    pub secrets: capstan_secrets::methods::Context,
}

impl Context {
    /// Over the secrets' context.
    pub fn new(secrets: capstan_secrets::methods::Context) -> Context {
        Context { secrets }
    }

    /// Capstan's store.
    pub fn store(&self) -> &Store {
        &self.secrets.store
    }
}

/// Declare the endpoints' collection.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(endpoints::collection()).await
}

/// Register `nodes.setStorageEndpoint` and `nodes.getStorageEndpoint`.
pub fn register(registry: &mut Registry, cx: Context) {
    endpoints::register(registry, cx);
}
