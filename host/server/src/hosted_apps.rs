//! Single sign-on for hosted apps (`apps.*`): an administrator enables Capstan's OpenID provider
//! ([`capstan_hosted_oidc`]) for a service whose template snapshot declares the `platform-oidc`
//! capability, and assigns the roles the app declares to people.
//!
//! Enabling registers the app's client — its redirect URIs are the service's HTTPS domains with
//! the declared redirect path — and publishes the issuer, the client id and the generated client
//! secret as the service's own secrets under the variables the declaration names (management
//! scope `hosted-oidc`), so the secrets path delivers them to the app's replicas like any other.
//! No answer carries the secret. Disabling removes the client and revokes the three secrets;
//! deleting the service removes the client too (`capstan_links::HostDependents`).

use crate::secrets::managed::{self, ManagedOwner};
use crate::secrets::methods::{Context as Secrets, Owner, State};
use capstan_core::refusal::{Refusal, Result};
use capstan_hosted_oidc::{ClientSpec, HostedOidc};
use capstan_rpc::{Access, Call, Registry};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use zeroize::Zeroizing;

/// The management scope of the secrets enabling publishes.
pub const SCOPE: &str = "hosted-oidc";
/// The capability a template declares for single sign-on.
pub const CAPABILITY: &str = "platform-oidc";

/// What the `apps.*` methods reach.
#[derive(Clone)]
pub struct Context {
    /// The OpenID provider of hosted apps.
    pub oidc: Arc<HostedOidc>,
    /// The secrets the client's credentials are published as.
    pub secrets: Secrets,
}

/// A template's `platformOidc` declaration (docs/appstore.md, "Single sign-on").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Declaration {
    /// The app's roles people are assigned.
    pub roles: Vec<String>,
    /// The path of the app's redirect endpoint on its HTTPS domains.
    pub redirect_path: String,
    /// The variable the app reads the issuer URL from.
    pub issuer_variable: String,
    /// The variable the app reads its client id from.
    pub client_id_variable: String,
    /// The variable the app reads its client secret from.
    pub client_secret_variable: String,
}

/// Input naming a service.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceInput {
    /// The service's id.
    pub service_id: String,
}

/// Input of `apps.setOidc`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SetOidcInput {
    /// The service's id.
    pub service_id: String,
    /// On: register the client and publish its credentials; off: remove both.
    pub enabled: bool,
}

/// Input of `apps.assignRole`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AssignInput {
    /// The service's id.
    pub service_id: String,
    /// The person's user id.
    pub user_id: String,
    /// One of the roles the app declares, or `null` to take the person's role away.
    pub role: Option<String>,
}

/// One person's role in the app.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Assigned {
    /// The person's user id.
    pub user_id: String,
    /// Their username (empty when the user is gone).
    pub username: String,
    /// Their role in the app.
    pub role: String,
}

/// Answer of `apps.getAccess` and `apps.setOidc`: value-free.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppAccess {
    /// The service's id.
    pub service_id: String,
    /// What its template snapshot declares; absent when it declares no single sign-on.
    pub declared: Option<Declaration>,
    /// Why it cannot be enabled, when it cannot (no declaration, no domain).
    pub blocker: Option<String>,
    /// Whether its client is registered.
    pub enabled: bool,
    /// The provider's issuer URL.
    pub issuer: String,
    /// The client id, when enabled.
    pub client_id: Option<String>,
    /// The registered redirect URIs, when enabled.
    pub redirect_uris: Vec<String>,
    /// Who holds which role.
    pub assignments: Vec<Assigned>,
}

/// The declaration in a service's template snapshot: `template.template.platformOidc` with the
/// capability declared beside it. `Err` says why there is none.
pub fn declaration(service: &Value) -> std::result::Result<Declaration, String> {
    let template = &service["template"]["template"];
    let declares = template["capabilities"].as_array().is_some_and(|c| c.iter().any(|c| c == CAPABILITY));
    if !declares {
        return Err("its template does not declare the platform-oidc capability".into());
    }
    let declaration: Declaration = serde_json::from_value(template["platformOidc"].clone())
        .map_err(|_| "its template's platformOidc declaration is not readable".to_string())?;
    // the catalog checked all of it when it was published; a snapshot written some other way is
    // held to what this host relies on: variable names (the inventory's rule) and a path
    let variables = [&declaration.issuer_variable, &declaration.client_id_variable, &declaration.client_secret_variable];
    if !variables.iter().all(|v| capstan_inventory::validate::env_key("variable", v).is_ok())
        || variables[0] == variables[1]
        || variables[1] == variables[2]
        || variables[0] == variables[2]
    {
        return Err("its template's platformOidc names invalid or repeated variables".into());
    }
    let path = &declaration.redirect_path;
    if !path.starts_with('/')
        || path.starts_with("//")
        || path.len() > 200
        || path.contains(['?', '#'])
        || !path.chars().all(|c| c.is_ascii_graphic())
    {
        return Err("its template's platformOidc redirect path is not a path".into());
    }
    Ok(declaration)
}

/// The redirect URIs of `service`: `https://<domain><path>` for each of its domains.
fn redirect_uris(service: &Value, declaration: &Declaration) -> Vec<String> {
    let domains = service["domains"].as_array().cloned().unwrap_or_default();
    domains.iter().filter_map(Value::as_str).map(|d| format!("https://{d}{}", declaration.redirect_path)).collect()
}

async fn read_service(cx: &Context, service_id: &str) -> Result<Value> {
    let service =
        cx.secrets.store.transact(|tx| async move { capstan_inventory::services::require_service(&tx, service_id).await }).await?;
    serde_json::to_value(&service).map_err(Refusal::internal)
}

async fn access(cx: &Context, service_id: &str) -> Result<AppAccess> {
    let service = read_service(cx, service_id).await?;
    let (declared, mut blocker) = match declaration(&service) {
        Ok(d) => (Some(d), None),
        Err(why) => (None, Some(why)),
    };
    if let Some(d) = &declared
        && redirect_uris(&service, d).is_empty()
    {
        blocker = Some("the service has no domain: single sign-on needs the app reached over HTTPS".into());
    }
    let client = cx.oidc.client(service_id).await?;
    let mut assignments = Vec::new();
    for assigned in cx.oidc.assignments(service_id).await? {
        let user = assigned.user_id.clone();
        let username = cx
            .secrets
            .store
            .transact(|tx| {
                let user = user.clone();
                async move { tx.get(capstan_auth::USERS, &user).await }
            })
            .await?
            .and_then(|d| d.data["username"].as_str().map(str::to_string))
            .unwrap_or_default();
        assignments.push(Assigned { user_id: assigned.user_id, username, role: assigned.role });
    }
    Ok(AppAccess {
        service_id: service_id.to_string(),
        declared,
        blocker,
        enabled: client.is_some(),
        issuer: cx.oidc.issuer().to_string(),
        client_id: client.as_ref().map(|c| c.client_id.clone()),
        redirect_uris: client.map(|c| c.redirect_uris).unwrap_or_default(),
        assignments,
    })
}

async fn get_access(cx: Context, call: Call, input: ServiceInput) -> Result<AppAccess> {
    call.identity()?;
    access(&cx, &input.service_id).await
}

async fn set_oidc(cx: Context, call: Call, input: SetOidcInput) -> Result<AppAccess> {
    let actor = call.identity()?.clone();
    let service = read_service(&cx, &input.service_id).await?;
    let owner = || ManagedOwner::Service(input.service_id.clone());
    if input.enabled {
        let declared = declaration(&service).map_err(|why| {
            Refusal::new("hosted-app-oidc-undeclared", format!("single sign-on cannot be enabled for this service: {why}"))
        })?;
        let redirect_uris = redirect_uris(&service, &declared);
        if redirect_uris.is_empty() {
            return Err(Refusal::new(
                "hosted-app-domain-required",
                "single sign-on needs the app reached over HTTPS: give the service a domain first",
            ));
        }
        let name = service["name"].as_str().map(str::to_string);
        let spec = ClientSpec { service_id: input.service_id.clone(), name, redirect_uris, roles: declared.roles.clone() };
        let client = cx.oidc.enable_client(spec).await?;
        let values = [
            (&declared.issuer_variable, client.issuer.clone()),
            (&declared.client_id_variable, client.client_id.clone()),
            (&declared.client_secret_variable, client.client_secret.clone()),
        ];
        for (key, value) in values {
            managed::put(&cx.secrets, &actor, SCOPE, owner(), key, Zeroizing::new(value.into_bytes())).await?;
        }
        tracing::info!(service = %input.service_id, "single sign-on enabled for a hosted app");
    } else {
        cx.oidc.disable_client(&input.service_id).await?;
        for secret in managed::list(&cx.secrets.store, SCOPE).await? {
            let mine = matches!(&secret.secret.owner, Owner::Service { service_id } if *service_id == input.service_id);
            if mine && secret.secret.state == State::Active {
                managed::revoke(&cx.secrets, &actor, SCOPE, &secret.id).await?;
            }
        }
        tracing::info!(service = %input.service_id, "single sign-on disabled for a hosted app");
    }
    access(&cx, &input.service_id).await
}

async fn assign_role(cx: Context, call: Call, input: AssignInput) -> Result<AppAccess> {
    call.identity()?;
    let user = input.user_id.as_str();
    let person = match capstan_store::validate_id(user) {
        Ok(()) => cx.secrets.store.transact(|tx| async move { tx.get(capstan_auth::USERS, user).await }).await?,
        Err(_) => None,
    };
    if !person.is_some_and(|p| p.data["kind"] == "human") {
        return Err(Refusal::new("user-not-found", "no person has this id").with_data(json!({ "field": "userId" })));
    }
    cx.oidc.assign_role(&input.service_id, user, input.role.as_deref()).await?;
    access(&cx, &input.service_id).await
}

/// Register `apps.*` and the provider's own `hostedOidc.*`.
pub fn register(registry: &mut Registry, cx: Context) {
    capstan_hosted_oidc::register(registry, cx.oidc.clone());
    let mut registry = registry.with(cx);
    registry
        .add(
            "apps.getAccess",
            "A hosted app's single sign-on: its declaration, whether it is on, who holds which role (administrator)",
            Access::Admin,
            get_access,
        )
        .refuses(&["service-not-found"])
        .read_only();
    registry
        .add(
            "apps.setOidc",
            "Turn single sign-on through Capstan on or off for a hosted app that declares it (administrator)",
            Access::Admin,
            set_oidc,
        )
        .refuses(&["service-not-found", "hosted-app-oidc-undeclared", "hosted-app-domain-required", "hosted-oidc-redirect-invalid"]);
    registry
        .add("apps.assignRole", "Give a person one of a hosted app's roles, or take it away (administrator)", Access::Admin, assign_role)
        .refuses(&["service-not-found", "user-not-found", "hosted-oidc-client-unknown", "hosted-oidc-role-undeclared"]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(capabilities: Value, declaration: Value) -> Value {
        json!({ "domains": ["grafana.acme.example"], "template": { "template": { "capabilities": capabilities, "platformOidc": declaration } } })
    }

    fn grafana() -> Value {
        json!({
            "roles": ["Admin", "Editor", "Viewer"],
            "redirectPath": "/login/generic_oauth",
            "issuerVariable": "GF_AUTH_GENERIC_OAUTH_ISSUER",
            "clientIdVariable": "GF_AUTH_GENERIC_OAUTH_CLIENT_ID",
            "clientSecretVariable": "GF_AUTH_GENERIC_OAUTH_CLIENT_SECRET",
        })
    }

    #[test]
    fn a_declaration_is_read_from_the_template_snapshot_with_its_capability() {
        let s = service(json!(["platform-oidc"]), grafana());
        let d = declaration(&s).unwrap();
        assert_eq!(d.roles, ["Admin", "Editor", "Viewer"]);
        assert_eq!(redirect_uris(&s, &d), ["https://grafana.acme.example/login/generic_oauth"]);
        assert!(declaration(&service(json!([]), grafana())).unwrap_err().contains("does not declare"));
        assert!(declaration(&json!({})).is_err());
        let mut repeated = grafana();
        repeated["clientIdVariable"] = json!("GF_AUTH_GENERIC_OAUTH_ISSUER");
        assert!(declaration(&service(json!(["platform-oidc"]), repeated)).unwrap_err().contains("variables"));
        let mut elsewhere = grafana();
        elsewhere["redirectPath"] = json!("//evil.example/x");
        assert!(declaration(&service(json!(["platform-oidc"]), elsewhere)).unwrap_err().contains("path"));
    }
}
