//! Who may do what with the inventory — the one place these checks live.
//!
//! Two authorities stay apart: an infrastructure administrator may manage all inventory but is
//! not an organization owner, and an owner acts within its organization but is not an
//! administrator. A deployment machine user reaches only the services it holds a grant on.

use super::{MEMBERS, SERVICE_GRANTS};
use capstan_auth::Identity;
use capstan_core::refusal::{Refusal, Result};
use capstan_store::Tx;

pub use capstan_rpc::OrgRole;

/// The membership document id of `user` in `organization`.
pub fn membership_id(organization: &str, user: &str) -> String {
    format!("{organization}~{user}")
}

/// The caller's role in `organization`, if it has one.
pub async fn role_in(tx: &Tx, organization: &str, user: &str) -> Result<Option<OrgRole>> {
    let id = membership_id(organization, user);
    if capstan_store::validate_id(&id).is_err() {
        return Ok(None);
    }
    let Some(doc) = tx.get(MEMBERS, &id).await? else { return Ok(None) };
    serde_json::from_value(doc.data["role"].clone()).map(Some).map_err(|e| Refusal::internal(format!("membership {id}: {e}")))
}

/// The identity a plugin acts with outside any caller's request (events, reconcile, tasks):
/// the authority the operator approved for it at install (`inventory:write-services`).
pub fn plugin_identity(plugin: &str) -> Identity {
    Identity {
        user_id: format!("plugin:{plugin}"),
        username: format!("plugin:{plugin}"),
        kind: PLUGIN_KIND.into(),
        admin: false,
        session_id: String::new(),
        authenticated_at: 0,
        expires_at: 0,
    }
}

const PLUGIN_KIND: &str = "plugin";

/// Whether the identity is the inventory-wide authority an approved capability gives: an
/// administrator, or a plugin acting on its own account.
fn manages_all(identity: &Identity) -> bool {
    identity.is_human_admin() || identity.kind == PLUGIN_KIND
}

/// Allow only a human administrator; anyone else is refused `forbidden`.
pub fn require_admin(identity: &Identity) -> Result<()> {
    if identity.is_human_admin() { Ok(()) } else { Err(forbidden("an administrator")) }
}

/// Allow an administrator, or a caller holding at least `need` in `organization`. Anyone else
/// is refused `forbidden` whether or not the organization exists, so nothing can be probed.
pub async fn require_org(tx: &Tx, identity: &Identity, organization: &str, need: OrgRole) -> Result<()> {
    if manages_all(identity) {
        return Ok(());
    }
    match role_in(tx, organization, &identity.user_id).await? {
        Some(role) if role >= need => Ok(()),
        _ => Err(forbidden(match need {
            OrgRole::Member => "a member of the organization",
            OrgRole::Owner => "an owner of the organization",
        })),
    }
}

/// What a caller wants to do with one service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceNeed {
    /// Read it: members, administrators, and deployers granted `deployment:status`.
    Read,
    /// Change or delete it: owners and administrators.
    Write,
}

/// Allow `need` on a service of `organization`.
pub async fn require_service(tx: &Tx, identity: &Identity, service_id: &str, organization: &str, need: ServiceNeed) -> Result<()> {
    if manages_all(identity) {
        return Ok(());
    }
    let role = role_in(tx, organization, &identity.user_id).await?;
    let allowed = match need {
        ServiceNeed::Read => role.is_some() || has_grant(tx, service_id, &identity.user_id, "deployment:status").await?,
        ServiceNeed::Write => role == Some(OrgRole::Owner),
    };
    if allowed {
        Ok(())
    } else {
        Err(forbidden(match need {
            ServiceNeed::Read => "a member of the service's organization or a deployer granted deployment:status",
            ServiceNeed::Write => "an owner of the service's organization",
        }))
    }
}

/// Whether `user` holds `capability` on the service.
pub async fn has_grant(tx: &Tx, service_id: &str, user: &str, capability: &str) -> Result<bool> {
    let id = super::grants::grant_id(service_id, user);
    let Some(doc) = tx.get(SERVICE_GRANTS, &id).await? else { return Ok(false) };
    Ok(doc.data["capabilities"].as_array().is_some_and(|caps| caps.iter().any(|c| c == capability)))
}

fn forbidden(who: &str) -> Refusal {
    Refusal::new("forbidden", format!("this needs {who}"))
}

/// The inventory's answer to [`capstan_rpc::OrganizationAuthority`], read from its memberships.
pub struct Authority(pub capstan_store::Store);

#[async_trait::async_trait]
impl capstan_rpc::OrganizationAuthority for Authority {
    async fn require(&self, identity: &Identity, organization: &str, need: OrgRole) -> Result<Option<OrgRole>> {
        self.0
            .transact(|tx| async move {
                require_org(&tx, identity, organization, need).await?;
                role_in(&tx, organization, &identity.user_id).await
            })
            .await
    }
}
