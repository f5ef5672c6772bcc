//! The provider work of one binding, as the `storage` import asks it (docs/bindings.md). A
//! PostgreSQL binding is a role and a database named after the binding on its node's server;
//! its credentials become the service's own secrets under the management scope
//! `storage:<bindingId>`, which reach the service's replicas as every secret does.
//!
//! Provisioning is idempotent and resumable: the password is the one the service's `PGPASSWORD`
//! already holds (a fresh one when there is none), set on the role before any secret is
//! written, and `PGPASSWORD` is written first. A crash anywhere leaves one role, and the next
//! run converges on one password and one set of secrets.

use super::{Context, endpoints, postgres};
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::Identity;
use capstan_secrets::managed::{self, ManagedOwner};
use rand::Rng;
use serde_json::json;
use zeroize::Zeroizing;

/// What a binding gives a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A PostgreSQL role and its database.
    Database,
    /// A bucket and a key pair limited to it.
    ObjectStorage,
}

/// One binding, as a manager names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Its id: the provider's names derive from it.
    pub binding_id: String,
    /// The service whose secrets receive its credentials.
    pub service_id: String,
    /// The node whose storage endpoint provides it.
    pub node_id: String,
    /// What it gives.
    pub kind: Kind,
    /// `postgresql` or `s3`.
    pub engine: String,
}

/// A provisioned binding, value-free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provisioned {
    /// Where the workload reaches it.
    pub endpoint: String,
    /// The database (= its role).
    pub name: String,
    /// The service's secrets holding its credentials.
    pub secret_keys: Vec<String>,
}

/// The keys a PostgreSQL binding publishes, `PGPASSWORD` first (the others are derived from it).
pub const POSTGRES_KEYS: &[&str] = &["PGPASSWORD", "DATABASE_URL", "PGHOST", "PGPORT", "PGDATABASE", "PGUSER"];

/// The management scope of a binding's secrets.
pub fn scope(binding_id: &str) -> String {
    format!("storage:{binding_id}")
}

/// `binding-invalid` unless the id is 1–40 of a-z, 0-9 and `_`, starting with a letter.
fn check(binding: &Binding) -> Result<()> {
    let id = &binding.binding_id;
    let ok = (1..=40).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !ok {
        return Err(Refusal::new("binding-invalid", "a binding id is 1–40 of a-z 0-9 _, starting with a letter"));
    }
    match (binding.kind, binding.engine.as_str()) {
        (Kind::Database, "postgresql") => Ok(()),
        (Kind::Database, engine) => Err(Refusal::new(
            "binding-engine-unsupported",
            format!("database engine {engine:?}: Capstan provides postgresql (MongoDB needs a real server to be reachable and is not provided yet)"),
        )
        .with_data(json!({ "engine": engine, "supported": ["postgresql"] }))),
        (Kind::ObjectStorage, engine) => Err(Refusal::new(
            "binding-engine-unsupported",
            format!("object storage ({engine:?}) bindings are not provided yet: Capstan provides database bindings on PostgreSQL"),
        )
        .with_data(json!({ "engine": engine, "supported": [] }))),
    }
}

/// The service must exist and not be on its way out; the node active.
async fn require_placement(cx: &Context, binding: &Binding) -> Result<()> {
    let (service_id, node_id) = (binding.service_id.clone(), binding.node_id.clone());
    cx.store()
        .transact(|tx| {
            let (service_id, node_id) = (service_id.clone(), node_id.clone());
            async move {
                capstan_inventory::services::require_service(&tx, &service_id).await?;
                endpoints::require_active_node(&tx, &node_id).await.map(drop)
            }
        })
        .await
}

/// A fresh password: 32 of A-Z a-z 0-9.
fn fresh_password() -> Zeroizing<String> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    Zeroizing::new((0..32).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect())
}

/// The active secret of the service for `key` in the binding's scope, if there is one.
async fn held(cx: &Context, binding: &Binding, key: &str) -> Result<Option<String>> {
    let scope = scope(&binding.binding_id);
    let owner = format!("service:{}", binding.service_id);
    let active = managed::list(cx.store(), &scope).await?.into_iter().find(|s| mine(s, &owner) && s.secret.key == key);
    Ok(active.map(|s| s.id))
}

/// An active secret of `owner`'s.
fn mine(secret: &capstan_secrets::methods::SecretView, owner: &str) -> bool {
    secret.secret.owner_ref == owner && secret.secret.state == capstan_secrets::methods::State::Active
}

/// Make the binding true and its credentials the service's secrets, as `actor`.
pub async fn provision(cx: &Context, actor: &Identity, binding: &Binding) -> Result<Provisioned> {
    check(binding)?;
    require_placement(cx, binding).await?;
    let (db, admin) = endpoints::postgres_admin(cx, &binding.node_id).await?;
    let name = postgres::binding_name(&binding.binding_id)?;
    let scope = scope(&binding.binding_id);
    // the password the service already holds, else a fresh one: a rerun changes nothing
    let password = match held(cx, binding, "PGPASSWORD").await? {
        Some(id) => {
            let value = managed::reveal(&cx.secrets, &endpoints::host_identity(), "host:storage", &scope, &id).await?;
            Zeroizing::new(String::from_utf8(value.to_vec()).map_err(|_| Refusal::internal("a binding's password is not UTF-8"))?)
        }
        None => fresh_password(),
    };
    postgres::ensure(&admin, &name, &password).await?;
    // crash point `storage-provision:role-ready`: the role and database exist, no secret yet
    capstan_core::crash_point("storage-provision:role-ready");
    let values = postgres::environment(&db.host, db.port, &name, &password);
    for key in POSTGRES_KEYS {
        let Some((_, value)) = values.iter().find(|(k, _)| k == key) else { continue };
        let put = managed::put(
            &cx.secrets,
            actor,
            &scope,
            ManagedOwner::Service(binding.service_id.clone()),
            key,
            Zeroizing::new(value.as_bytes().to_vec()),
        )
        .await;
        match put {
            Err(e) if e.is("management-scope-mismatch") => {
                return Err(Refusal::new(
                    "binding-environment-conflict",
                    format!("the service already has a {key} secret that another binding or manager keeps"),
                )
                .with_data(json!({ "key": key, "serviceId": binding.service_id })));
            }
            other => drop(other?),
        }
    }
    tracing::info!(binding = %binding.binding_id, service = %binding.service_id, node = %binding.node_id, "database binding provisioned");
    Ok(Provisioned {
        endpoint: format!("{}:{}", db.host, db.port),
        name,
        secret_keys: POSTGRES_KEYS.iter().map(|k| k.to_string()).collect(),
    })
}

/// The binding's credentials stop working at once: its secrets revoked, its role's login
/// disabled and its sessions ended. The data stays.
pub async fn revoke(cx: &Context, actor: &Identity, binding: &Binding) -> Result<()> {
    check(binding)?;
    let scope = scope(&binding.binding_id);
    let owner = format!("service:{}", binding.service_id);
    for secret in managed::list(cx.store(), &scope).await? {
        if mine(&secret, &owner) {
            managed::revoke(&cx.secrets, actor, &scope, &secret.id).await?;
        }
    }
    let (_, admin) = endpoints::postgres_admin(cx, &binding.node_id).await?;
    postgres::revoke(&admin, &postgres::binding_name(&binding.binding_id)?).await?;
    tracing::info!(binding = %binding.binding_id, service = %binding.service_id, "database binding revoked");
    Ok(())
}

/// The binding's data goes: revoked first, then its database and role dropped.
pub async fn destroy(cx: &Context, actor: &Identity, binding: &Binding) -> Result<()> {
    revoke(cx, actor, binding).await?;
    let (_, admin) = endpoints::postgres_admin(cx, &binding.node_id).await?;
    postgres::drop(&admin, &postgres::binding_name(&binding.binding_id)?).await?;
    tracing::info!(binding = %binding.binding_id, service = %binding.service_id, "database binding dropped with its data");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(id: &str, kind: Kind, engine: &str) -> Binding {
        Binding { binding_id: id.into(), service_id: "svc".into(), node_id: "node".into(), kind, engine: engine.into() }
    }

    #[test]
    fn a_binding_names_a_provided_engine_and_a_plain_id() {
        assert!(check(&binding("bnd_1", Kind::Database, "postgresql")).is_ok());
        assert_eq!(check(&binding("bnd_1", Kind::Database, "mongodb")).unwrap_err().code, "binding-engine-unsupported");
        assert_eq!(check(&binding("bnd_1", Kind::ObjectStorage, "s3")).unwrap_err().code, "binding-engine-unsupported");
        for bad in ["", "1bnd", "Bnd", "bnd-1", "bnd 1", &"b".repeat(41)] {
            assert_eq!(check(&binding(bad, Kind::Database, "postgresql")).unwrap_err().code, "binding-invalid", "{bad}");
        }
    }

    #[test]
    fn a_fresh_password_is_long_and_plain() {
        let a = fresh_password();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(*a, *fresh_password());
    }

    #[test]
    fn the_password_is_written_first() {
        assert_eq!(POSTGRES_KEYS[0], "PGPASSWORD");
    }
}
