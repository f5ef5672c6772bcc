//! `runtime` (`runtime:read`, contract 0.3.1 on): where a service's replicas run and whether
//! they are ready, read through the server's [`Platform`] from the runtime's replica slots
//! (docs/runtime.md). Read-only: a method declared read-only may call it. Every service is
//! visible, as `inventory.get` reads them; what a replica runs with (its environment, its pull
//! credential) never crosses.

use super::{CallData, Services, WitResult, to_wit};
use crate::manifest::Capability;
use crate::platform::{Platform, Replica, ReplicaIntent};
use crate::runtime::capstan::plugin::runtime;
use std::sync::Arc;

/// The `runtime:read` provider.
#[derive(Clone)]
pub(super) struct Reader {
    platform: Arc<dyn Platform>,
}

impl Reader {
    pub(super) fn new(services: &Arc<Services>) -> Self {
        Reader { platform: services.platform.clone() }
    }
}

impl runtime::Host for CallData {
    async fn service_replicas(&mut self, service_id: String) -> WitResult<Vec<runtime::Replica>> {
        let reader = self.granted(&self.grant.runtime, Capability::RuntimeRead)?;
        let replicas = reader.platform.service_replicas(&service_id).await.map_err(to_wit)?;
        Ok(replicas.into_iter().map(replica).collect())
    }
}

fn replica(r: Replica) -> runtime::Replica {
    runtime::Replica {
        cluster_id: r.cluster_id,
        node_id: r.node_id,
        slot: r.slot,
        assignment_id: r.assignment_id,
        intent: match r.intent {
            ReplicaIntent::Run => runtime::Intent::Run,
            ReplicaIntent::Stop => runtime::Intent::Stop,
            ReplicaIntent::Remove => runtime::Intent::Remove,
        },
        phase: r.phase,
        ready: r.ready,
        image_digest: r.image_digest,
    }
}
