//! `capstan:plugin@0.2.x`, served through the current contract: plugins built against 0.2.0 to
//! 0.2.4 keep installing and running. Every import interface of 0.2.4 has the shapes of the
//! current one (0.3.0 only adds `inventory.set-facet`), so the current host implementations
//! are linked a second time under the 0.2.4 names ([`add_to_linker`]); wasmtime resolves a
//! 0.2.0–0.2.3 component's names to them. Only the export differs: a 0.2 descriptor declares no
//! facets, panels, navigation section or refusal codes ([`Exports`]).

use crate::imports::CallData;
use crate::runtime::{capstan as current, exports::capstan::plugin::guest as current_guest};
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

/// The bindings of the 0.2.4 world, generated from `wit/0.2.4`, its imports' shapes taken
/// from the current bindings (they are the same).
#[allow(missing_docs)]
mod bindings {
    wasmtime::component::bindgen!({
        world: "manager",
        path: "../../wit/0.2.4",
        imports: { default: async },
        exports: { default: async },
        with: {
            "capstan:plugin/types": crate::runtime::capstan::plugin::types,
            "capstan:plugin/store": crate::runtime::capstan::plugin::store,
            "capstan:plugin/inventory": crate::runtime::capstan::plugin::inventory,
            "capstan:plugin/secrets": crate::runtime::capstan::plugin::secrets,
            "capstan:plugin/settings": crate::runtime::capstan::plugin::settings,
            "capstan:plugin/blobs": crate::runtime::capstan::plugin::blobs,
            "capstan:plugin/transfers": crate::runtime::capstan::plugin::transfers,
            "capstan:plugin/http": crate::runtime::capstan::plugin::http,
            "capstan:plugin/agents": crate::runtime::capstan::plugin::agents,
            "capstan:plugin/gateway": crate::runtime::capstan::plugin::gateway,
            "capstan:plugin/events": crate::runtime::capstan::plugin::events,
            "capstan:plugin/sign": crate::runtime::capstan::plugin::sign,
            "capstan:plugin/log": crate::runtime::capstan::plugin::log,
        },
    });
}

use bindings::exports::capstan::plugin::guest;
pub use bindings::{Manager, ManagerPre};

/// The contract version whose names the imports are linked under.
const VERSION: &str = "0.2.4";

/// Link the current imports under the 0.2.4 names.
pub fn add_to_linker(linker: &mut Linker<CallData>) -> wasmtime::Result<()> {
    use current::plugin::*;
    fn host(data: &mut CallData) -> &mut CallData {
        data
    }
    macro_rules! link {
        ($($interface:ident),*) => {$(
            $interface::add_to_linker_instance::<CallData, HasSelf<CallData>>(
                &mut linker.instance(&format!("capstan:plugin/{}@{VERSION}", stringify!($interface)))?,
                host,
            )?;
        )*};
    }
    link!(store, inventory, secrets, settings, blobs, transfers, http, agents, gateway, events, sign, log);
    Ok(())
}

/// A 0.2 descriptor: none of 0.3.0's faces.
fn descriptor(d: guest::Descriptor) -> current_guest::Descriptor {
    current_guest::Descriptor {
        methods: d
            .methods
            .into_iter()
            .map(|m| current_guest::MethodSpec {
                name: m.name,
                summary: m.summary,
                role: m.role,
                input_schema: m.input_schema,
                output_schema: m.output_schema,
            })
            .collect(),
        collections: d
            .collections
            .into_iter()
            .map(|c| current_guest::CollectionSpec {
                name: c.name,
                indexes: c
                    .indexes
                    .into_iter()
                    .map(|i| current_guest::IndexSpec { name: i.name, fields: i.fields, unique: i.unique })
                    .collect(),
            })
            .collect(),
        subscriptions: d.subscriptions,
        schedules: d.schedules.into_iter().map(|s| current_guest::Schedule { name: s.name, cron: s.cron, summary: s.summary }).collect(),
        reconcile_period_ms: d.reconcile_period_ms,
        placement: current_guest::Placement { replicas: d.placement.replicas, selector: d.placement.selector },
        settings: d
            .settings
            .into_iter()
            .map(|s| current_guest::SettingSpec { key: s.key, summary: s.summary, schema: s.schema, default: s.default })
            .collect(),
        pages: d
            .pages
            .into_iter()
            .map(|p| current_guest::PageSpec {
                path: p.path,
                title: p.title,
                source: p.source,
                template: p.template,
                forms: p.forms,
                navigation: p.navigation,
            })
            .collect(),
        facets: Vec::new(),
        panels: Vec::new(),
        nav: None,
        refusals: Vec::new(),
    }
}

/// The current shapes of a call, for a 0.2 instance.
pub(crate) struct Exports<'a>(pub(crate) &'a guest::Guest);

type Answer<T> = wasmtime::Result<Result<T, current::plugin::types::Refusal>>;
type CallContext = current::plugin::types::CallContext;

impl Exports<'_> {
    pub(crate) async fn describe(&self, store: &mut Store<CallData>) -> wasmtime::Result<current_guest::Descriptor> {
        Ok(descriptor(self.0.call_describe(store).await?))
    }

    #[allow(clippy::ptr_arg)] // the bindings take `&String`
    pub(crate) async fn handle(&self, store: &mut Store<CallData>, ctx: &CallContext, method: &String, body: &String) -> Answer<String> {
        self.0.call_handle(store, ctx, method, body).await
    }

    pub(crate) async fn on_event(&self, store: &mut Store<CallData>, ctx: &CallContext, event: &current_guest::Event) -> Answer<()> {
        let current_guest::Event { sequence, kind, subject, data, at_ms } = event.clone();
        self.0.call_on_event(store, ctx, &guest::Event { sequence, kind, subject, data, at_ms }).await
    }

    pub(crate) async fn reconcile(
        &self,
        store: &mut Store<CallData>,
        ctx: &CallContext,
        trigger: &current_guest::ReconcileTrigger,
    ) -> Answer<current_guest::ReconcileOutcome> {
        let trigger = guest::ReconcileTrigger { periodic: trigger.periodic, hints: trigger.hints.clone() };
        let outcome = self.0.call_reconcile(store, ctx, &trigger).await?;
        Ok(outcome.map(|o| current_guest::ReconcileOutcome { requeue_after_ms: o.requeue_after_ms, summary: o.summary }))
    }

    pub(crate) async fn run_task(&self, store: &mut Store<CallData>, ctx: &CallContext, name: &str) -> Answer<String> {
        self.0.call_run_task(store, ctx, name).await
    }

    pub(crate) async fn migrate(&self, store: &mut Store<CallData>, ctx: &CallContext, from: Option<&str>, to: &str) -> Answer<()> {
        self.0.call_migrate(store, ctx, from, to).await
    }
}
