//! `runtime` (`runtime:read`, contract 0.3.1 on): where a service's replicas run and whether
//! they are ready, read through the server's [`Platform`] from the runtime's replica slots
//! (docs/runtime.md). Read-only: a method declared read-only may call it. Every service is
//! visible, as `inventory.get` reads them; what a replica runs with (its environment, its pull
//! credential) never crosses.
//!
//! `service-rollout` (`runtime:read`, contract 0.3.4 on) answers where one release (an image
//! digest) of a service stands on the runtime, as the deployment path judges a promoted one;
//! `service-image-digest` (`runtime:read`, 0.3.5 on) the digest its image runs as (pinned, or
//! its tag as the runtime resolved it).
//!
//! `set-service-spec` (`runtime:write`, contract 0.3.2 on) writes a service's runtime spec as
//! `runtime.setServiceSpec` does, as the acting identity (the caller, or the plugin's own
//! authority outside a call), so a plugin sets specs only where that identity may.
//! `set-service-gate` (`runtime:write`, 0.3.6 on) holds a service's replicas from starting
//! while the plugin's gate names why (docs/runtime.md, "Gates").

use super::{CallData, Services, WitResult, parse_object, to_wit};
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

    async fn service_specs(&mut self, service_id: String) -> WitResult<Vec<String>> {
        let reader = self.granted(&self.grant.runtime, Capability::RuntimeRead)?;
        let specs = reader.platform.service_specs(&service_id).await.map_err(to_wit)?;
        Ok(specs.into_iter().map(spec_json).collect())
    }

    async fn service_rollout(&mut self, service_id: String, digest: String) -> WitResult<String> {
        let reader = self.granted(&self.grant.runtime, Capability::RuntimeRead)?;
        let rollout = reader.platform.service_rollout(&service_id, &digest).await.map_err(to_wit)?;
        Ok(rollout.to_string())
    }

    async fn service_image_digest(&mut self, service_id: String) -> WitResult<Option<String>> {
        let reader = self.granted(&self.grant.runtime, Capability::RuntimeRead)?;
        reader.platform.service_image_digest(&service_id).await.map_err(to_wit)
    }

    async fn set_service_spec(&mut self, body: String) -> WitResult<String> {
        self.changing()?;
        // a spec is a service write: the same writer, acting as the caller (or the plugin)
        let writer = self.granted(&self.grant.runtime_write, Capability::RuntimeWrite)?;
        let actor = self.actor(&writer)?;
        let body = parse_object(&body, "the runtime spec")?;
        let written = writer.platform.set_service_spec(&actor, body).await.map_err(to_wit)?;
        Ok(spec_json(written))
    }

    async fn set_service_gate(&mut self, service_id: String, waiting: Option<String>) -> WitResult<()> {
        self.changing()?;
        let writer = self.granted(&self.grant.runtime_write, Capability::RuntimeWrite)?;
        writer.platform.set_service_gate(&writer.plugin, &service_id, waiting.as_deref()).await.map_err(to_wit)
    }
}

/// A spec as the import answers it: `{id, revision, data}`.
fn spec_json(d: crate::store::Document) -> String {
    serde_json::json!({ "id": d.id, "revision": d.revision, "data": d.data }).to_string()
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
