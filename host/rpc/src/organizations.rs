//! Who holds which role in an organization: the one answer every `member` and `owner` method is
//! judged by, host or plugin. The inventory implements [`OrganizationAuthority`]; the plugin
//! host and the methods reach memberships only through it.

use crate::Identity;
use capstan_core::refusal::Result;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A role within one organization. `Owner` includes everything a `Member` may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OrgRole {
    /// May read the organization, its members and its services.
    Member,
    /// May also rename the organization, set its members' roles and change its services.
    Owner,
}

impl OrgRole {
    /// The role as stored and shown: `member` or `owner`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrgRole::Member => "member",
            OrgRole::Owner => "owner",
        }
    }
}

/// Judges organization roles.
#[async_trait::async_trait]
pub trait OrganizationAuthority: Send + Sync {
    /// Refuse `forbidden` unless `identity` may act as `need` in `organization` (an
    /// administrator may; nothing tells whether the organization exists); the role it holds
    /// there, if it holds one.
    async fn require(&self, identity: &Identity, organization: &str, need: OrgRole) -> Result<Option<OrgRole>>;
}
