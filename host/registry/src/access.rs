//! Who may pull, push or delete in a repository, judged on every request from the caller's
//! roles and grants as they are now.
//!
//! - pull: an administrator; a member of the service's organization; a deployer granted
//!   `registry:pull` or `registry:push` on the service;
//! - push: an administrator or an owner; a deployer granted `registry:push` uploads blobs, but
//!   its manifests are accepted only for a deployment operation (`deployment-operation-required`);
//! - delete: an administrator or an owner.
//!
//! A repository that maps to no service is an administrator's. Anyone else meets one answer,
//! `registry-access-denied`, whether the repository or the service exists or not.

use crate::errors::OciError;
use crate::names::{parse_service_repository, service_id_prefix};
use capstan_auth::Identity;
use capstan_core::refusal::Result;
use capstan_inventory::access::{OrgRole, has_grant, role_in};
use capstan_inventory::services::{Service, ServiceState};
use capstan_store::Store;
use serde_json::json;

/// What a request does in a repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Read blobs, manifests, tags, referrers.
    Pull,
    /// Upload blobs, push manifests.
    Push,
    /// Delete blobs, manifests, tags.
    Delete,
}

impl Action {
    /// The action as a token scope names it.
    pub fn scope(self) -> &'static str {
        match self {
            Action::Pull => "pull",
            Action::Push => "pull,push",
            Action::Delete => "delete",
        }
    }
}

/// What the caller was allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The service the repository maps to, if any.
    pub service_id: Option<String>,
    /// A deployer's push: blobs only until a deployment operation holds the tag.
    pub blobs_only: bool,
}

/// The active service a workloads repository names, if one does.
pub async fn service_of(store: &Store, repository: &str) -> Result<Option<(String, Service)>> {
    store.transact(|tx| async move { service_of_in(&tx, repository).await }).await
}

/// [`service_of`] within `tx`.
pub async fn service_of_in(tx: &capstan_store::Tx, repository: &str) -> Result<Option<(String, Service)>> {
    let Some((name, prefix)) = parse_service_repository(repository) else { return Ok(None) };
    let id_prefix = service_id_prefix(&prefix.to_ascii_lowercase());
    for doc in tx.find_all(capstan_inventory::SERVICES, "by_name", &[json!(name)]).await? {
        if doc.id.starts_with(&id_prefix) {
            let service: Service = serde_json::from_value(doc.data.clone())
                .map_err(|e| capstan_core::refusal::Refusal::internal(format!("service {}: {e}", doc.id)))?;
            return Ok(Some((doc.id, service)));
        }
    }
    Ok(None)
}

/// The one answer to anyone not allowed: `403 DENIED` `registry-access-denied`.
pub(crate) fn denied() -> OciError {
    OciError::denied("registry-access-denied", "requested access to the resource is denied")
}

/// Allow `action` in `repository` for `identity`, or refuse by name.
pub async fn authorize(store: &Store, identity: &Identity, repository: &str, action: Action) -> std::result::Result<Allowed, OciError> {
    let service = service_of(store, repository).await?;
    if identity.is_human_admin() {
        return Ok(Allowed { service_id: service.map(|(id, _)| id), blobs_only: false });
    }
    let Some((service_id, service)) = service else { return Err(denied()) };
    if service.state != ServiceState::Active && action != Action::Pull {
        return Err(OciError::denied("service-deleting", "the service is being deleted"));
    }
    let (user, organization) = (identity.user_id.as_str(), service.organization_id.as_str());
    let sid = service_id.as_str();
    let (role, pull, push) = store
        .transact(|tx| async move {
            Ok((
                role_in(&tx, organization, user).await?,
                has_grant(&tx, sid, user, "registry:pull").await?,
                has_grant(&tx, sid, user, "registry:push").await?,
            ))
        })
        .await?;
    let owner = role == Some(OrgRole::Owner);
    let allowed = |blobs_only| Ok(Allowed { service_id: Some(service_id.clone()), blobs_only });
    match action {
        Action::Pull if role.is_some() || pull || push => allowed(false),
        Action::Push if owner => allowed(false),
        Action::Push if push => allowed(true),
        Action::Delete if owner => allowed(false),
        _ => Err(denied()),
    }
}
