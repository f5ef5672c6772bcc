//! Organizations and their memberships (`organizations.*`).

use super::Context;
use super::access::{self, OrgRole, membership_id};
use super::{Entity, Listing, MEMBERS, ORGANIZATIONS, PageInput, SERVICES, check_revision, emit, parse, require, to_value, validate};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::Tx;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// An organization: it owns services and has members with roles.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Organization {
    /// 1–63 of a-z 0-9 -, starting with a letter; unique.
    pub name: String,
    /// When it was created (milliseconds since the epoch).
    pub created_at: u64,
    /// When it was last changed (milliseconds since the epoch).
    pub updated_at: u64,
    /// The administrator who created it.
    pub created_by: String,
    /// The records managers keep on it, by plugin id (`inventory.set-facet`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub facets: crate::facets::Facets,
    /// The organization of the platform's identity provider it stands for: people the provider
    /// names as members of that organization are its members while the provider says so
    /// (docs/identity.md). Set by an administrator only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_provider_organization: Option<String>,
}

/// A user's role in one organization, as stored.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Membership {
    /// The organization's id.
    pub organization_id: String,
    /// The member's user id.
    pub user_id: String,
    /// The member's role.
    pub role: OrgRole,
    /// When the role was last set (milliseconds since the epoch).
    pub updated_at: u64,
    /// `identity-provider` for a membership the platform's identity provider grants (kept in
    /// step with it at every login and owner write); absent for one an owner or administrator set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// [`Membership::source`] of a membership the identity provider grants.
pub const FROM_IDENTITY_PROVIDER: &str = "identity-provider";

/// Input of `organizations.create`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[serde(rename_all = "camelCase")]
pub struct CreateInput {
    /// 1–63 of a-z 0-9 -, starting with a letter; unique.
    pub name: String,
    /// The identity provider's organization it stands for (its id in the provider's
    /// organizations claim); see [`Organization::identity_provider_organization`].
    pub identity_provider_organization: Option<String>,
}

/// Input of `organizations.linkIdentityProvider`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LinkInput {
    /// The organization's id.
    pub id: String,
    /// The revision the caller read; any other current revision is refused `conflict`.
    pub expected_revision: u64,
    /// The identity provider's organization id, or `null` to unlink (its provider-granted
    /// memberships go with the link).
    pub identity_provider_organization: Option<String>,
}

/// Input of `organizations.update`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpdateInput {
    /// The organization's id.
    pub id: String,
    /// The revision the caller read; any other current revision is refused `conflict`.
    pub expected_revision: u64,
    /// The new name: 1–63 of a-z 0-9 -, starting with a letter; unique. Absent keeps the name.
    pub name: Option<String>,
}

/// Input of `organizations.delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeleteInput {
    /// The organization's id.
    pub id: String,
    /// The revision the caller read; any other current revision is refused `conflict`.
    pub expected_revision: u64,
}

/// Input of `organizations.setMember`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SetMemberInput {
    /// The organization's id.
    pub organization_id: String,
    /// The user whose role changes; a cluster's machine user or a deployer is never a member.
    pub user_id: String,
    /// The new role, or `null` to remove the membership.
    pub role: Option<OrgRole>,
}

/// Input of `organizations.listMembers`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MembersInput {
    /// The organization's id.
    pub organization_id: String,
    /// Where to continue: the `nextCursor` of the previous page; absent for the first page.
    pub cursor: Option<String>,
    /// At most 200 (default 50).
    pub limit: Option<usize>,
}

/// One member as `organizations.listMembers` answers it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    /// The member's user id.
    pub user_id: String,
    /// The member's username; empty when the user no longer exists.
    pub username: String,
    /// The member's role.
    pub role: OrgRole,
}

/// Answer of `organizations.setMember`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetMemberAnswer {
    /// The organization's id.
    pub organization_id: String,
    /// The user whose role was set.
    pub user_id: String,
    /// The role now held; absent when the membership was removed.
    pub role: Option<OrgRole>,
}

/// Read an organization or refuse `organization-not-found`.
pub async fn require_organization(tx: &Tx, id: &str) -> Result<Entity<Organization>> {
    require(tx, ORGANIZATIONS, "organization", id).await
}

async fn name_taken(tx: &Tx, name: &str) -> Result<bool> {
    Ok(!tx.find(ORGANIZATIONS, "by_name", &[json!(name)], None, 1).await?.documents.is_empty())
}

fn name_exists(name: &str) -> Refusal {
    Refusal::new("exists", format!("an organization named {name} exists")).with_data(json!({ "field": "name" }))
}

async fn create(cx: Context, call: Call, input: CreateInput) -> Result<Entity<Organization>> {
    let identity = call.identity()?.clone();
    access::require_admin(&identity)?;
    validate::name("name", &input.name)?;
    let id = capstan_core::ids::new_id("org");
    let org = Organization {
        name: input.name.clone(),
        created_at: now_ms(),
        updated_at: now_ms(),
        created_by: identity.user_id.clone(),
        facets: Default::default(),
        identity_provider_organization: input.identity_provider_organization.clone(),
    };
    if let Some(link) = &org.identity_provider_organization {
        validate_link(link)?;
    }
    let (id_ref, org_ref) = (&id, &org);
    let doc = cx
        .store
        .transact(|tx| async move {
            if name_taken(&tx, &org_ref.name).await? {
                return Err(name_exists(&org_ref.name));
            }
            if let Some(link) = &org_ref.identity_provider_organization {
                link_free(&tx, link, id_ref).await?;
            }
            let doc = tx.insert(ORGANIZATIONS, id_ref, to_value(org_ref)?).await?;
            emit(&tx, "organization.created", id_ref, json!({ "id": id_ref, "name": org_ref.name })).await?;
            Ok(doc)
        })
        .await?;
    tracing::info!(organization = %id, name = %org.name, "organization created");
    parse(&doc)
}

async fn list(cx: Context, call: Call, input: PageInput) -> Result<Listing<Entity<Organization>>> {
    let identity = call.identity()?.clone();
    let limit = input.limit();
    let cursor = input.cursor.as_deref();
    let identity = &identity;
    cx.store
        .transact(|tx| async move {
            if identity.is_human_admin() {
                let page = tx.scan(ORGANIZATIONS, cursor, limit).await?;
                let items = page.documents.iter().map(parse).collect::<Result<_>>()?;
                return Ok(Listing { items, next_cursor: page.next_cursor });
            }
            // everyone else sees the organizations it belongs to
            let page = tx.find(MEMBERS, "by_user", &[json!(identity.user_id)], cursor, limit).await?;
            let mut items = Vec::new();
            for membership in &page.documents {
                let org_id = membership.data["organizationId"].as_str().unwrap_or_default();
                if let Some(doc) = tx.get(ORGANIZATIONS, org_id).await? {
                    items.push(parse(&doc)?);
                }
            }
            Ok(Listing { items, next_cursor: page.next_cursor })
        })
        .await
}

async fn get(cx: Context, call: Call, input: super::ById) -> Result<Entity<Organization>> {
    let identity = call.identity()?.clone();
    let (identity, id) = (&identity, input.id.as_str());
    cx.store
        .transact(|tx| async move {
            access::require_org(&tx, identity, id, OrgRole::Member).await?;
            require_organization(&tx, id).await
        })
        .await
}

async fn update(cx: Context, call: Call, input: UpdateInput) -> Result<Entity<Organization>> {
    let identity = call.identity()?.clone();
    if let Some(name) = &input.name {
        validate::name("name", name)?;
    }
    let (identity, input) = (&identity, &input);
    cx.store
        .transact(|tx| async move {
            access::require_org(&tx, identity, &input.id, OrgRole::Owner).await?;
            let mut org = require_organization(&tx, &input.id).await?;
            check_revision("organization", &input.id, input.expected_revision, org.revision)?;
            match &input.name {
                Some(name) if *name != org.data.name => {
                    if name_taken(&tx, name).await? {
                        return Err(name_exists(name));
                    }
                    org.data.name = name.clone();
                }
                // nothing changes: answer what is stored, write nothing
                _ => return Ok(org),
            }
            org.data.updated_at = now_ms();
            let doc = tx.replace(ORGANIZATIONS, &input.id, org.revision, to_value(&org.data)?).await?;
            emit(&tx, "organization.updated", &input.id, json!({ "id": input.id, "name": org.data.name })).await?;
            parse(&doc)
        })
        .await
}

async fn delete(cx: Context, call: Call, input: DeleteInput) -> Result<Deleted> {
    let identity = call.identity()?.clone();
    access::require_admin(&identity)?;
    let (input, dependents) = (&input, &*cx.dependents);
    cx.store
        .transact(|tx| async move {
            let org = require_organization(&tx, &input.id).await?;
            check_revision("organization", &input.id, input.expected_revision, org.revision)?;
            let services = tx.find(SERVICES, "by_organization", &[json!(input.id)], None, 1).await?;
            if !services.documents.is_empty() {
                return Err(Refusal::new(
                    "organization-has-services",
                    format!("the organization {} still has services: delete them first", org.data.name),
                ));
            }
            if let Some(refusal) = dependents.organization_blocker(&tx, &input.id, &org.data.name).await? {
                return Err(refusal);
            }
            // memberships go with it, page by page inside this one transaction
            loop {
                let page = tx.find(MEMBERS, "by_organization", &[json!(input.id)], None, 100).await?;
                for doc in &page.documents {
                    tx.delete(MEMBERS, &doc.id, doc.revision).await?;
                }
                if page.next_cursor.is_none() {
                    break;
                }
            }
            tx.delete(ORGANIZATIONS, &input.id, org.revision).await?;
            emit(&tx, "organization.deleted", &input.id, json!({ "id": input.id, "name": org.data.name })).await?;
            Ok(Deleted { id: input.id.clone(), deleted: true })
        })
        .await
}

/// Answer of `organizations.delete`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deleted {
    /// The deleted organization's id.
    pub id: String,
    /// Always true: the organization and its memberships are gone.
    pub deleted: bool,
}

async fn set_member(cx: Context, call: Call, input: SetMemberInput) -> Result<SetMemberAnswer> {
    let identity = call.identity()?.clone();
    let (identity, input) = (&identity, &input);
    cx.store
        .transact(|tx| async move {
            access::require_org(&tx, identity, &input.organization_id, OrgRole::Owner).await?;
            require_organization(&tx, &input.organization_id).await?;
            let id = membership_id(&input.organization_id, &input.user_id);
            let current = match capstan_store::validate_id(&id) {
                Ok(()) => tx.get(MEMBERS, &id).await?,
                Err(_) => None,
            };
            let current_role = current.as_ref().and_then(|d| serde_json::from_value::<OrgRole>(d.data["role"].clone()).ok());
            if current_role == input.role {
                // removing a non-member, or giving a member the role it holds: nothing to say
                // about the user either way
                return Ok(SetMemberAnswer {
                    organization_id: input.organization_id.clone(),
                    user_id: input.user_id.clone(),
                    role: input.role,
                });
            }
            // a membership is removed whether or not its user still exists
            let user = match &current {
                Some(_) if input.role.is_none() => tx.get(capstan_auth::USERS, &input.user_id).await?,
                _ => Some(member_candidate(&tx, &input.user_id).await?),
            };
            let username = user.as_ref().and_then(|u| u.data["username"].as_str()).unwrap_or_default().to_string();
            if current_role == Some(OrgRole::Owner) && !identity.is_human_admin() && owners(&tx, &input.organization_id).await? <= 1 {
                // an owner may not leave an organization nobody but an administrator can run
                return Err(Refusal::new("organization-last-owner", "this is the organization's last owner: make another owner first"));
            }
            match (input.role, current) {
                (Some(role), Some(doc)) => {
                    let membership = Membership {
                        organization_id: input.organization_id.clone(),
                        user_id: input.user_id.clone(),
                        role,
                        updated_at: now_ms(),
                        source: None,
                    };
                    tx.replace(MEMBERS, &id, doc.revision, to_value(&membership)?).await?;
                }
                (Some(role), None) => {
                    let membership = Membership {
                        organization_id: input.organization_id.clone(),
                        user_id: input.user_id.clone(),
                        role,
                        updated_at: now_ms(),
                        source: None,
                    };
                    tx.insert(MEMBERS, &id, to_value(&membership)?).await?;
                }
                (None, Some(doc)) => tx.delete(MEMBERS, &id, doc.revision).await?,
                (None, None) => {}
            }
            emit(
                &tx,
                "organization.memberChanged",
                &input.organization_id,
                json!({ "organizationId": input.organization_id, "userId": input.user_id, "username": username, "role": input.role }),
            )
            .await?;
            Ok(SetMemberAnswer { organization_id: input.organization_id.clone(), user_id: input.user_id.clone(), role: input.role })
        })
        .await
}

/// The user who may be given a role: one that exists and is not one Capstan minted for a purpose
/// of its own (a cluster's machine user, a deployer, which act through their own grants). Any
/// other id is refused `member-user-invalid`, one answer whether or not a user has it: an owner
/// learns from this method only what its own organization holds, never which user ids exist.
async fn member_candidate(tx: &Tx, user: &str) -> Result<capstan_store::Document> {
    let found = match capstan_store::validate_id(user) {
        Ok(()) => tx.get(capstan_auth::USERS, user).await?,
        Err(_) => None,
    };
    match found {
        Some(doc) if !is_minted_identity(tx, user).await? => Ok(doc),
        _ => Err(Refusal::new(
            "member-user-invalid",
            "no person with this id can be a member: give the id of an existing person (a cluster's machine user or a deployer acts through its own grants)",
        )
        .with_data(json!({ "field": "userId" }))),
    }
}

/// Whether the user is one Capstan minted for a purpose of its own (a cluster, a deployer).
async fn is_minted_identity(tx: &Tx, user: &str) -> Result<bool> {
    let cluster = !tx.find(super::CLUSTER_IDENTITIES, "by_user", &[json!(user)], None, 1).await?.documents.is_empty();
    Ok(cluster || tx.get(super::grants::DEPLOYERS, user).await?.is_some())
}

async fn owners(tx: &Tx, organization: &str) -> Result<usize> {
    let (mut owners, mut cursor) = (0, None::<String>);
    loop {
        let page = tx.find(MEMBERS, "by_organization", &[json!(organization)], cursor.as_deref(), capstan_store::MAX_PAGE).await?;
        owners += page.documents.iter().filter(|d| d.data["role"] == "owner").count();
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(owners),
        }
    }
}

async fn members(cx: Context, call: Call, input: MembersInput) -> Result<Listing<MemberView>> {
    let identity = call.identity()?.clone();
    let limit = super::page_limit(input.limit);
    let (identity, input) = (&identity, &input);
    cx.store
        .transact(|tx| async move {
            access::require_org(&tx, identity, &input.organization_id, OrgRole::Member).await?;
            require_organization(&tx, &input.organization_id).await?;
            let page = tx.find(MEMBERS, "by_organization", &[json!(input.organization_id)], input.cursor.as_deref(), limit).await?;
            let mut items = Vec::new();
            for doc in &page.documents {
                let membership: Membership = parse(doc)?.data;
                let username = match tx.get(capstan_auth::USERS, &membership.user_id).await? {
                    Some(user) => user.data["username"].as_str().unwrap_or_default().to_string(),
                    None => String::new(),
                };
                items.push(MemberView { user_id: membership.user_id, username, role: membership.role });
            }
            Ok(Listing { items, next_cursor: page.next_cursor })
        })
        .await
}

/// An identity provider's organization id: 1 to 200 printable ASCII characters.
fn validate_link(link: &str) -> Result<()> {
    if link.is_empty() || link.len() > 200 || !link.chars().all(|c| c.is_ascii_graphic()) {
        return Err(Refusal::invalid_request(
            "an identity provider's organization id is 1 to 200 printable ASCII characters without spaces",
        )
        .with_data(json!({ "field": "identityProviderOrganization" })));
    }
    Ok(())
}

/// Refuse `identity-provider-organization-linked` when another organization stands for `link`.
async fn link_free(tx: &Tx, link: &str, organization: &str) -> Result<()> {
    let found = tx.find(ORGANIZATIONS, "by_identity_provider_organization", &[json!(link)], None, 2).await?;
    match found.documents.iter().find(|d| d.id != organization) {
        Some(other) => Err(Refusal::new(
            "identity-provider-organization-linked",
            format!(
                "the organization {} already stands for this identity provider organization",
                other.data["name"].as_str().unwrap_or_default()
            ),
        )
        .with_data(json!({ "field": "identityProviderOrganization" }))),
        None => Ok(()),
    }
}

async fn link_identity_provider(cx: Context, call: Call, input: LinkInput) -> Result<Entity<Organization>> {
    let identity = call.identity()?.clone();
    access::require_admin(&identity)?;
    if let Some(link) = &input.identity_provider_organization {
        validate_link(link)?;
    }
    let input = &input;
    cx.store
        .transact(|tx| async move {
            let mut org = require_organization(&tx, &input.id).await?;
            check_revision("organization", &input.id, input.expected_revision, org.revision)?;
            if org.data.identity_provider_organization == input.identity_provider_organization {
                return Ok(org);
            }
            if let Some(link) = &input.identity_provider_organization {
                link_free(&tx, link, &input.id).await?;
            }
            // the memberships the old link granted were the provider's word about that link
            drop_provider_memberships(&tx, &input.id).await?;
            org.data.identity_provider_organization = input.identity_provider_organization.clone();
            org.data.updated_at = now_ms();
            let doc = tx.replace(ORGANIZATIONS, &input.id, org.revision, to_value(&org.data)?).await?;
            emit(
                &tx,
                "organization.updated",
                &input.id,
                json!({ "id": input.id, "name": org.data.name, "identityProviderOrganization": org.data.identity_provider_organization }),
            )
            .await?;
            parse(&doc)
        })
        .await
}

async fn drop_provider_memberships(tx: &Tx, organization: &str) -> Result<()> {
    let mut cursor = None::<String>;
    loop {
        let page = tx.find(MEMBERS, "by_organization", &[json!(organization)], cursor.as_deref(), capstan_store::MAX_PAGE).await?;
        for doc in page.documents.iter().filter(|d| d.data["source"] == FROM_IDENTITY_PROVIDER) {
            tx.delete(MEMBERS, &doc.id, doc.revision).await?;
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(()),
        }
    }
}

/// Bring `user`'s provider-granted memberships in step with what the identity provider says now:
/// `granted` pairs a provider organization id with the role it gives. Organizations linked to one
/// of them get (or keep, or change to) that role; provider-granted memberships elsewhere go. A
/// membership an owner or administrator set is never touched. Answers the organizations (ids)
/// the user is a member of through the provider afterwards.
pub async fn sync_provider_memberships(tx: &Tx, user: &str, granted: &[(String, OrgRole)]) -> Result<Vec<(String, OrgRole)>> {
    let mut wanted: Vec<(String, OrgRole)> = Vec::new();
    for (link, role) in granted {
        let found = tx.find(ORGANIZATIONS, "by_identity_provider_organization", &[json!(link)], None, 1).await?;
        if let Some(org) = found.documents.first()
            && !wanted.iter().any(|(id, _)| *id == org.id)
        {
            wanted.push((org.id.clone(), *role));
        }
    }
    let mut held = Vec::new();
    let current = tx.find(MEMBERS, "by_user", &[json!(user)], None, capstan_store::MAX_PAGE).await?;
    for doc in &current.documents {
        let membership: Membership = parse(doc)?.data;
        if membership.source.as_deref() != Some(FROM_IDENTITY_PROVIDER) {
            continue;
        }
        match wanted.iter().find(|(id, _)| *id == membership.organization_id) {
            Some((_, role)) if *role == membership.role => {}
            Some((_, role)) => {
                let changed = Membership { role: *role, updated_at: now_ms(), ..membership.clone() };
                tx.replace(MEMBERS, &doc.id, doc.revision, to_value(&changed)?).await?;
                member_changed(tx, &membership.organization_id, user, Some(*role)).await?;
            }
            None => {
                tx.delete(MEMBERS, &doc.id, doc.revision).await?;
                member_changed(tx, &membership.organization_id, user, None).await?;
            }
        }
    }
    for (organization, role) in &wanted {
        let id = membership_id(organization, user);
        match tx.get(MEMBERS, &id).await? {
            Some(doc) if doc.data["source"] != FROM_IDENTITY_PROVIDER => continue, // set by a person: theirs
            Some(_) => {}
            None => {
                let membership = Membership {
                    organization_id: organization.clone(),
                    user_id: user.to_string(),
                    role: *role,
                    updated_at: now_ms(),
                    source: Some(FROM_IDENTITY_PROVIDER.into()),
                };
                tx.insert(MEMBERS, &id, to_value(&membership)?).await?;
                member_changed(tx, organization, user, Some(*role)).await?;
            }
        }
        held.push((organization.clone(), *role));
    }
    Ok(held)
}

async fn member_changed(tx: &Tx, organization: &str, user: &str, role: Option<OrgRole>) -> Result<()> {
    let username =
        tx.get(capstan_auth::USERS, user).await?.and_then(|u| u.data["username"].as_str().map(str::to_string)).unwrap_or_default();
    emit(
        tx,
        "organization.memberChanged",
        organization,
        json!({ "organizationId": organization, "userId": user, "username": username, "role": role, "source": FROM_IDENTITY_PROVIDER }),
    )
    .await
}

/// Register the `organizations.*` methods.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry.add("organizations.create", "Create an organization (administrator)", Access::Admin, create).refuses(&[
        "name-invalid",
        "exists",
        "identity-provider-organization-linked",
    ]);
    registry
        .add(
            "organizations.linkIdentityProvider",
            "Link an organization to an organization of the platform's identity provider, or unlink it (administrator)",
            Access::Admin,
            link_identity_provider,
        )
        .refuses(&["organization-not-found", "conflict", "identity-provider-organization-linked"]);
    registry
        .add("organizations.list", "Organizations: all for an administrator, the caller's own for anyone else", Access::Authenticated, list)
        .read_only();
    registry.add("organizations.get", "One organization (member)", Access::Member, get).refuses(&["organization-not-found"]).read_only();
    registry.add("organizations.update", "Rename an organization with its expected revision (owner)", Access::Owner, update).refuses(&[
        "name-invalid",
        "organization-not-found",
        "conflict",
        "exists",
    ]);
    registry
        .add(
            "organizations.delete",
            "Delete an organization that has no services, with its memberships (administrator)",
            Access::Admin,
            delete,
        )
        .refuses(&["organization-not-found", "conflict", "organization-has-services", "organization-has-secret-sets"]);
    registry
        .add(
            "organizations.setMember",
            "Give a user the owner or member role in an organization, or remove it with role null (owner)",
            Access::Owner,
            set_member,
        )
        .refuses(&["organization-not-found", "member-user-invalid", "organization-last-owner"]);
    registry
        .add("organizations.listMembers", "An organization's members and their roles (member)", Access::Member, members)
        .refuses(&["organization-not-found"])
        .read_only();
}
