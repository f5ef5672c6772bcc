//! `registry.*` methods.

use crate::Registry;
use crate::names::{is_tag, service_repository};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::access::ServiceNeed;
use capstan_rpc::{Access, Call, Registry as Methods};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Input of `registry.getServiceTarget`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TargetInput {
    /// The service.
    pub service_id: String,
    /// A tag to name in the reference.
    pub tag: Option<String>,
}

/// Where a service's images go.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceTarget {
    /// The registry's host (`docker login <host>`).
    pub host: String,
    /// The service's repository.
    pub repository: String,
    /// `<host>/<repository>[:<tag>]`, what `docker push` / `skopeo copy` take.
    pub reference: String,
}

/// Register the `registry.*` methods.
pub fn register(methods: &mut Methods, registry: Arc<Registry>) {
    methods
        .with(registry)
        .add(
            "registry.getServiceTarget",
            "The registry repository a service's images go to, and the reference to push or pull with (members of its organization, deployers it granted)",
            Access::Authenticated,
            service_target,
        )
        .refuses(&["service-not-found", "registry-tag-invalid"])
        .read_only();
}

async fn service_target(registry: Arc<Registry>, call: Call, input: TargetInput) -> Result<ServiceTarget> {
    let identity = call.identity()?;
    if let Some(tag) = &input.tag
        && !is_tag(tag)
    {
        return Err(Refusal::new("registry-tag-invalid", "a tag is 1 to 128 of A-Z a-z 0-9 _ . -, not starting with . or -"));
    }
    let id = input.service_id.as_str();
    let service = registry
        .storage
        .store
        .transact(|tx| async move { capstan_inventory::services::visible_service(&tx, identity, id, ServiceNeed::Read).await })
        .await?;
    let repository = service_repository(&service.data.name, &service.id);
    let host = registry.host().to_string();
    let reference = match &input.tag {
        Some(tag) => format!("{host}/{repository}:{tag}"),
        None => format!("{host}/{repository}"),
    };
    Ok(ServiceTarget { host, repository, reference })
}
