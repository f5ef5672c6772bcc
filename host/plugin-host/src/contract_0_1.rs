//! `capstan:plugin@0.1.0`, served through the current contract: plugins built against 0.1.0 keep
//! installing and running. Its imports are the current ones under the 0.1.0 names (each call
//! converted and passed to the current import), and its exports are called and their answers
//! converted to the current shapes. What 0.1.0 cannot express it does without: no settings, no
//! pages, and an organization-owned secret is refused `secret-owner-unsupported`.

use crate::imports::CallData;
use crate::runtime::{capstan as current, exports::capstan::plugin::guest as current_guest};
use wasmtime::Store;
use wasmtime::component::Resource;

/// The bindings of the 0.1.0 world, generated from `wit/0.1.0`.
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        world: "manager",
        path: "../../wit/0.1.0",
        imports: { default: async },
        exports: { default: async },
        with: {
            "capstan:plugin/blobs.blob-reader": crate::imports::BlobReaderState,
            "capstan:plugin/blobs.blob-writer": crate::imports::BlobWriterState,
        },
    });
}

use bindings::capstan::plugin::{agents, blobs, events, http, inventory, log, secrets, sign, store, types};
use bindings::exports::capstan::plugin::guest;
pub use bindings::{Manager, ManagerPre};

/// One shape into the same shape of the other contract version.
trait Adapt<T> {
    fn adapt(self) -> T;
}

macro_rules! same {
    ($($t:ty),*) => { $(impl Adapt<$t> for $t { fn adapt(self) -> $t { self } })* };
}
same!(String, bool, u8, u16, u32, u64, Resource<crate::imports::BlobReaderState>);

impl<A: Adapt<B>, B> Adapt<Vec<B>> for Vec<A> {
    fn adapt(self) -> Vec<B> {
        self.into_iter().map(Adapt::adapt).collect()
    }
}

impl<A: Adapt<B>, B> Adapt<Option<B>> for Option<A> {
    fn adapt(self) -> Option<B> {
        self.map(Adapt::adapt)
    }
}

impl<A: Adapt<C>, B: Adapt<D>, C, D> Adapt<(C, D)> for (A, B) {
    fn adapt(self) -> (C, D) {
        (self.0.adapt(), self.1.adapt())
    }
}

impl<A: Adapt<C>, B: Adapt<D>, C, D> Adapt<Result<C, D>> for Result<A, B> {
    fn adapt(self) -> Result<C, D> {
        self.map(Adapt::adapt).map_err(Adapt::adapt)
    }
}

/// Records with the same fields in both versions, converted both ways.
macro_rules! records {
    ($($old:path = $new:path { $($field:ident),* };)*) => {$(
        impl Adapt<$new> for $old {
            fn adapt(self) -> $new { $new { $($field: self.$field.adapt()),* } }
        }
        impl Adapt<$old> for $new {
            fn adapt(self) -> $old { $old { $($field: self.$field.adapt()),* } }
        }
    )*};
}

/// Enums with the same cases in both versions, converted both ways.
macro_rules! enums {
    ($($old:ident = $new:ident { $($case:ident),* };)*) => {$(
        impl Adapt<$new> for $old {
            fn adapt(self) -> $new { match self { $($old::$case => $new::$case),* } }
        }
        impl Adapt<$old> for $new {
            fn adapt(self) -> $old { match self { $($new::$case => $old::$case),* } }
        }
    )*};
}

use current::plugin::{
    agents as c_agents, blobs as c_blobs, events as c_events, http as c_http, inventory as c_inventory, log as c_log, secrets as c_secrets,
    sign as c_sign, store as c_store, types as c_types,
};

records! {
    types::Refusal = c_types::Refusal { code, message, retryable, data };
    types::Caller = c_types::Caller { kind, id, roles };
    types::CallContext = c_types::CallContext { request_id, caller, node_id, plugin_version, deadline_ms };
    store::Document = c_store::Document { id, revision, data };
    store::Page = c_store::Page { documents, next_cursor };
    store::Replacement = c_store::Replacement { expected_revision, data };
    store::Write = c_store::Write { collection, id, op };
    store::Expectation = c_store::Expectation { collection, id, revision };
    inventory::Entity = c_inventory::Entity { kind, id, revision, data };
    inventory::EntityPage = c_inventory::EntityPage { entities, next_cursor };
    secrets::Generate = c_secrets::Generate { length, alphabet };
    secrets::SecretInfo = c_secrets::SecretInfo { id, owner, key, management_scope, active_version, state, created_at_ms, rotated_at_ms };
    blobs::BlobInfo = c_blobs::BlobInfo { key, size, etag };
    blobs::BlobPage = c_blobs::BlobPage { items, next_cursor };
    http::Request = c_http::Request { method, url, headers, body, timeout_ms };
    http::Response = c_http::Response { status, headers, body };
    guest::Event = current_guest::Event { sequence, kind, subject, data, at_ms };
    guest::ReconcileTrigger = current_guest::ReconcileTrigger { periodic, hints };
    guest::ReconcileOutcome = current_guest::ReconcileOutcome { requeue_after_ms, summary };
    guest::MethodSpec = current_guest::MethodSpec { name, summary, role, input_schema, output_schema };
    guest::IndexSpec = current_guest::IndexSpec { name, fields, unique };
    guest::CollectionSpec = current_guest::CollectionSpec { name, indexes };
    guest::Schedule = current_guest::Schedule { name, cron, summary };
    guest::Placement = current_guest::Placement { replicas, selector };
}

use c_inventory::EntityKind as CurrentEntityKind;
use c_log::Level as CurrentLevel;
use c_types::CallerKind as CurrentCallerKind;
use inventory::EntityKind;
use log::Level;
use types::CallerKind;
enums! {
    CallerKind = CurrentCallerKind { Human, Machine, Host };
    Level = CurrentLevel { Trace, Debug, Info, Warn, Error };
}

// 0.1.0's `node` is a Capstan process of the fleet, which 0.2.0 calls `fleet-node`; 0.1.0 has
// no word for a node of a cluster, so nothing of 0.1.0 asks for one.
impl Adapt<CurrentEntityKind> for EntityKind {
    fn adapt(self) -> CurrentEntityKind {
        match self {
            EntityKind::Organization => CurrentEntityKind::Organization,
            EntityKind::Cluster => CurrentEntityKind::Cluster,
            EntityKind::Service => CurrentEntityKind::Service,
            EntityKind::Node => CurrentEntityKind::FleetNode,
        }
    }
}

impl Adapt<EntityKind> for CurrentEntityKind {
    fn adapt(self) -> EntityKind {
        match self {
            CurrentEntityKind::Organization => EntityKind::Organization,
            CurrentEntityKind::Cluster => EntityKind::Cluster,
            CurrentEntityKind::Service => EntityKind::Service,
            CurrentEntityKind::FleetNode => EntityKind::Node,
            // never answered to 0.1.0: every kind it names adapts to another
            CurrentEntityKind::Node => EntityKind::Node,
        }
    }
}

impl Adapt<c_store::WriteOp> for store::WriteOp {
    fn adapt(self) -> c_store::WriteOp {
        match self {
            store::WriteOp::Insert(data) => c_store::WriteOp::Insert(data),
            store::WriteOp::Replace(r) => c_store::WriteOp::Replace(r.adapt()),
            store::WriteOp::Delete(revision) => c_store::WriteOp::Delete(revision),
        }
    }
}

impl Adapt<store::WriteOp> for c_store::WriteOp {
    fn adapt(self) -> store::WriteOp {
        match self {
            c_store::WriteOp::Insert(data) => store::WriteOp::Insert(data),
            c_store::WriteOp::Replace(r) => store::WriteOp::Replace(r.adapt()),
            c_store::WriteOp::Delete(revision) => store::WriteOp::Delete(revision),
        }
    }
}

impl Adapt<c_blobs::PutMode> for blobs::PutMode {
    fn adapt(self) -> c_blobs::PutMode {
        match self {
            blobs::PutMode::Overwrite => c_blobs::PutMode::Overwrite,
            blobs::PutMode::CreateOnly => c_blobs::PutMode::CreateOnly,
            blobs::PutMode::IfMatch(etag) => c_blobs::PutMode::IfMatch(etag),
        }
    }
}

/// 0.1.0's `organization` names no organization; the current owner's id is dropped.
impl Adapt<secrets::Owner> for c_secrets::Owner {
    fn adapt(self) -> secrets::Owner {
        match self {
            c_secrets::Owner::Service(id) => secrets::Owner::Service(id),
            c_secrets::Owner::Organization(_) => secrets::Owner::Organization,
            c_secrets::Owner::System(name) => secrets::Owner::System(name),
        }
    }
}

impl Adapt<c_secrets::Owner> for secrets::Owner {
    fn adapt(self) -> c_secrets::Owner {
        match self {
            secrets::Owner::Service(id) => c_secrets::Owner::Service(id),
            // never reaches the current import: `ensure` refuses it first
            secrets::Owner::Organization => c_secrets::Owner::Organization(String::new()),
            secrets::Owner::System(name) => c_secrets::Owner::System(name),
        }
    }
}

/// A 0.1.0 descriptor: no settings, no pages, nothing of 0.3.0's faces.
impl Adapt<current_guest::Descriptor> for guest::Descriptor {
    fn adapt(self) -> current_guest::Descriptor {
        current_guest::Descriptor {
            methods: self.methods.adapt(),
            collections: self.collections.adapt(),
            subscriptions: self.subscriptions,
            schedules: self.schedules.adapt(),
            reconcile_period_ms: self.reconcile_period_ms,
            placement: self.placement.adapt(),
            settings: Vec::new(),
            pages: Vec::new(),
            facets: Vec::new(),
            panels: Vec::new(),
            nav: None,
            refusals: Vec::new(),
        }
    }
}

type Wit<T> = Result<T, types::Refusal>;

impl types::Host for CallData {}

impl store::Host for CallData {
    async fn get(&mut self, collection: String, id: String) -> Wit<Option<store::Document>> {
        c_store::Host::get(self, collection, id).await.adapt()
    }

    async fn find(&mut self, collection: String, index: String, key: Vec<String>, cursor: Option<String>, limit: u32) -> Wit<store::Page> {
        c_store::Host::find(self, collection, index, key, cursor, limit).await.adapt()
    }

    async fn scan(&mut self, collection: String, cursor: Option<String>, limit: u32) -> Wit<store::Page> {
        c_store::Host::scan(self, collection, cursor, limit).await.adapt()
    }

    async fn commit(&mut self, expectations: Vec<store::Expectation>, writes: Vec<store::Write>) -> Wit<Vec<store::Document>> {
        c_store::Host::commit(self, expectations.adapt(), writes.adapt()).await.adapt()
    }
}

impl inventory::Host for CallData {
    async fn get(&mut self, kind: EntityKind, id: String) -> Wit<Option<inventory::Entity>> {
        c_inventory::Host::get(self, kind.adapt(), id).await.adapt()
    }

    async fn list(&mut self, kind: EntityKind, cursor: Option<String>, limit: u32) -> Wit<inventory::EntityPage> {
        c_inventory::Host::list(self, kind.adapt(), cursor, limit).await.adapt()
    }

    async fn settings(&mut self) -> Wit<inventory::Entity> {
        c_inventory::Host::settings(self).await.adapt()
    }

    async fn create_service(&mut self, body: String) -> Wit<inventory::Entity> {
        c_inventory::Host::create_service(self, body).await.adapt()
    }

    async fn update_service(&mut self, body: String) -> Wit<inventory::Entity> {
        c_inventory::Host::update_service(self, body).await.adapt()
    }

    async fn hold_service(&mut self, service_id: String) -> Wit<()> {
        c_inventory::Host::hold_service(self, service_id).await.map_err(Adapt::adapt)
    }

    async fn release_service(&mut self, service_id: String) -> Wit<()> {
        c_inventory::Host::release_service(self, service_id).await.map_err(Adapt::adapt)
    }
}

impl secrets::Host for CallData {
    async fn ensure(&mut self, scope: String, owner: secrets::Owner, key: String, generate: secrets::Generate) -> Wit<secrets::SecretInfo> {
        let owner = match owner {
            secrets::Owner::Service(id) => c_secrets::Owner::Service(id),
            secrets::Owner::System(name) => c_secrets::Owner::System(name),
            secrets::Owner::Organization => {
                return Err(types::Refusal {
                    code: "secret-owner-unsupported".into(),
                    message: "a capstan:plugin@0.1.0 plugin cannot name an organization; organization secrets need 0.2.0".into(),
                    retryable: false,
                    data: None,
                });
            }
        };
        c_secrets::Host::ensure(self, scope, owner, key, generate.adapt()).await.adapt()
    }

    async fn rotate(&mut self, scope: String, secret_id: String) -> Wit<secrets::SecretInfo> {
        c_secrets::Host::rotate(self, scope, secret_id).await.adapt()
    }

    async fn revoke(&mut self, scope: String, secret_id: String) -> Wit<secrets::SecretInfo> {
        c_secrets::Host::revoke(self, scope, secret_id).await.adapt()
    }

    async fn list(&mut self, scope: String) -> Wit<Vec<secrets::SecretInfo>> {
        c_secrets::Host::list(self, scope).await.adapt()
    }

    async fn reveal(&mut self, scope: String, secret_id: String) -> Wit<Vec<u8>> {
        c_secrets::Host::reveal(self, scope, secret_id).await.adapt()
    }
}

impl blobs::HostBlobReader for CallData {
    async fn read(&mut self, reader: Resource<crate::imports::BlobReaderState>, max: u32) -> Wit<Vec<u8>> {
        c_blobs::HostBlobReader::read(self, reader, max).await.adapt()
    }

    async fn drop(&mut self, reader: Resource<crate::imports::BlobReaderState>) -> wasmtime::Result<()> {
        c_blobs::HostBlobReader::drop(self, reader).await
    }
}

impl blobs::HostBlobWriter for CallData {
    async fn new(&mut self, key: String, mode: blobs::PutMode) -> Resource<crate::imports::BlobWriterState> {
        c_blobs::HostBlobWriter::new(self, key, mode.adapt()).await
    }

    async fn write(&mut self, writer: Resource<crate::imports::BlobWriterState>, chunk: Vec<u8>) -> Wit<()> {
        c_blobs::HostBlobWriter::write(self, writer, chunk).await.map_err(Adapt::adapt)
    }

    async fn finish(&mut self, writer: Resource<crate::imports::BlobWriterState>) -> Wit<blobs::BlobInfo> {
        c_blobs::HostBlobWriter::finish(self, writer).await.adapt()
    }

    async fn drop(&mut self, writer: Resource<crate::imports::BlobWriterState>) -> wasmtime::Result<()> {
        c_blobs::HostBlobWriter::drop(self, writer).await
    }
}

impl blobs::Host for CallData {
    async fn open(&mut self, key: String) -> Wit<Option<(blobs::BlobInfo, Resource<crate::imports::BlobReaderState>)>> {
        c_blobs::Host::open(self, key).await.adapt()
    }

    async fn head(&mut self, key: String) -> Wit<Option<blobs::BlobInfo>> {
        c_blobs::Host::head(self, key).await.adapt()
    }

    async fn list(&mut self, prefix: String, cursor: Option<String>, limit: u32) -> Wit<blobs::BlobPage> {
        c_blobs::Host::list(self, prefix, cursor, limit).await.adapt()
    }

    async fn delete(&mut self, key: String) -> Wit<bool> {
        c_blobs::Host::delete(self, key).await.adapt()
    }
}

impl http::Host for CallData {
    async fn fetch(&mut self, request: http::Request) -> Wit<http::Response> {
        c_http::Host::fetch(self, request.adapt()).await.adapt()
    }
}

impl agents::Host for CallData {
    async fn call(&mut self, cluster_id: String, method: String, body: String) -> Wit<String> {
        c_agents::Host::call(self, cluster_id, method, body).await.adapt()
    }
}

impl events::Host for CallData {
    async fn publish(&mut self, kind: String, subject: String, data: String) -> Wit<()> {
        c_events::Host::publish(self, kind, subject, data).await.map_err(Adapt::adapt)
    }
}

impl sign::Host for CallData {
    async fn sign(&mut self, key_name: String, message: Vec<u8>) -> Wit<Vec<u8>> {
        c_sign::Host::sign(self, key_name, message).await.adapt()
    }

    async fn public_key(&mut self, key_name: String) -> Wit<Vec<u8>> {
        c_sign::Host::public_key(self, key_name).await.adapt()
    }
}

impl log::Host for CallData {
    async fn log(&mut self, level: Level, message: String, fields: Vec<(String, String)>) {
        c_log::Host::log(self, level.adapt(), message, fields).await
    }
}

/// The current shapes of a call, for a 0.1.0 instance.
pub(crate) struct Exports<'a>(pub(crate) &'a guest::Guest);

type Answer<T> = wasmtime::Result<Result<T, c_types::Refusal>>;

impl Exports<'_> {
    pub(crate) async fn describe(&self, store: &mut Store<CallData>) -> wasmtime::Result<current_guest::Descriptor> {
        Ok(self.0.call_describe(store).await?.adapt())
    }

    #[allow(clippy::ptr_arg)] // the bindings take `&String`
    pub(crate) async fn handle(
        &self,
        store: &mut Store<CallData>,
        ctx: &c_types::CallContext,
        method: &String,
        body: &String,
    ) -> Answer<String> {
        Ok(self.0.call_handle(store, &ctx.clone().adapt(), method, body).await?.adapt())
    }

    pub(crate) async fn on_event(
        &self,
        store: &mut Store<CallData>,
        ctx: &c_types::CallContext,
        event: &current_guest::Event,
    ) -> Answer<()> {
        Ok(self.0.call_on_event(store, &ctx.clone().adapt(), &event.clone().adapt()).await?.map_err(Adapt::adapt))
    }

    pub(crate) async fn reconcile(
        &self,
        store: &mut Store<CallData>,
        ctx: &c_types::CallContext,
        trigger: &current_guest::ReconcileTrigger,
    ) -> Answer<current_guest::ReconcileOutcome> {
        Ok(self.0.call_reconcile(store, &ctx.clone().adapt(), &trigger.clone().adapt()).await?.adapt())
    }

    pub(crate) async fn run_task(&self, store: &mut Store<CallData>, ctx: &c_types::CallContext, name: &str) -> Answer<String> {
        Ok(self.0.call_run_task(store, &ctx.clone().adapt(), name).await?.adapt())
    }

    pub(crate) async fn migrate(
        &self,
        store: &mut Store<CallData>,
        ctx: &c_types::CallContext,
        from: Option<&str>,
        to: &str,
    ) -> Answer<()> {
        Ok(self.0.call_migrate(store, &ctx.clone().adapt(), from, to).await?.map_err(Adapt::adapt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_0_1_node_reads_the_fleet_and_no_0_1_kind_reads_the_nodes_of_clusters() {
        assert_eq!(EntityKind::Node.adapt(), CurrentEntityKind::FleetNode);
        for kind in [EntityKind::Organization, EntityKind::Cluster, EntityKind::Service, EntityKind::Node] {
            let current: CurrentEntityKind = kind.adapt();
            assert_ne!(current, CurrentEntityKind::Node, "{kind:?} must not read the nodes of clusters");
            let back: EntityKind = current.adapt();
            assert_eq!(back, kind, "{kind:?} answers as itself");
        }
    }
}
