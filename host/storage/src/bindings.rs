//! The provider work of one binding, as the `storage` import asks it (docs/bindings.md). A
//! PostgreSQL binding is a role and a database named after the binding on its node's server; an
//! object-storage binding a bucket, an IAM user limited to it and its one key pair on the node's
//! S3 endpoint. Their credentials become the service's own secrets under the management scope
//! `storage:<bindingId>`, which reach the service's replicas as every secret does.
//!
//! Provisioning is idempotent and resumable: the password is the one the service's `PGPASSWORD`
//! already holds (a fresh one when there is none), set on the role before any secret is
//! written, and `PGPASSWORD` is written first; the key pair is the one the service's
//! `S3_ACCESS_KEY_ID` names while the provider still has it (a new one, every other deleted,
//! when not), and `S3_SECRET_ACCESS_KEY` is written first. A crash anywhere leaves one role or
//! one key pair, and the next run converges on one credential and one set of secrets.

use super::{Context, endpoints, postgres, s3};
use capstan_core::refusal::{Refusal, Result};
use capstan_rpc::Identity;
use capstan_secrets::managed::{self, ManagedOwner};
use rand::Rng;
use serde_json::json;
use zeroize::Zeroizing;

pub use capstan_core::bindings::{BindingKind as Kind, Provisioned, StorageBinding as Binding};

/// The keys a PostgreSQL binding publishes, `PGPASSWORD` first (the others are derived from it).
pub const POSTGRES_KEYS: &[&str] = &["PGPASSWORD", "DATABASE_URL", "PGHOST", "PGPORT", "PGDATABASE", "PGUSER"];
/// The keys an object-storage binding publishes, the secret key first, then its id.
pub const S3_KEYS: &[&str] = &["S3_SECRET_ACCESS_KEY", "S3_ACCESS_KEY_ID", "S3_ENDPOINT", "S3_BUCKET", "S3_REGION"];

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
        (Kind::ObjectStorage, "s3") => Ok(()),
        (Kind::ObjectStorage, engine) => Err(Refusal::new(
            "binding-engine-unsupported",
            format!("object storage engine {engine:?}: Capstan provides s3 (any S3 endpoint with users and policies)"),
        )
        .with_data(json!({ "engine": engine, "supported": ["s3"] }))),
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

/// The value of the service's secret `key` of the binding, if it holds one.
async fn held_value(cx: &Context, binding: &Binding, key: &str) -> Result<Option<Zeroizing<String>>> {
    let Some(id) = held(cx, binding, key).await? else { return Ok(None) };
    let value = managed::reveal(&cx.secrets, &endpoints::host_identity(), "host:storage", &scope(&binding.binding_id), &id).await?;
    Ok(Some(Zeroizing::new(String::from_utf8(value.to_vec()).map_err(|_| Refusal::internal("a binding's secret is not UTF-8"))?)))
}

/// Write the binding's secrets in `keys`' order, each from `values` (a key without a value is
/// left as it is): `binding-environment-conflict` when another manager keeps one of them.
async fn publish(cx: &Context, actor: &Identity, binding: &Binding, keys: &[&str], values: &[(&str, String)]) -> Result<()> {
    let scope = scope(&binding.binding_id);
    for key in keys {
        let Some((_, value)) = values.iter().find(|(k, _)| k == key) else { continue };
        let owner = ManagedOwner::Service(binding.service_id.clone());
        match managed::put(&cx.secrets, actor, &scope, owner, key, Zeroizing::new(value.as_bytes().to_vec())).await {
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
    Ok(())
}

/// Make the binding true and its credentials the service's secrets, as `actor`.
pub async fn provision(cx: &Context, actor: &Identity, binding: &Binding) -> Result<Provisioned> {
    check(binding)?;
    require_placement(cx, binding).await?;
    if binding.kind == Kind::ObjectStorage {
        return provision_bucket(cx, actor, binding).await;
    }
    let (db, admin) = endpoints::postgres_admin(cx, &binding.node_id).await?;
    let name = postgres::binding_name(&binding.binding_id)?;
    // the password the service already holds, else a fresh one: a rerun changes nothing
    let password = match held_value(cx, binding, "PGPASSWORD").await? {
        Some(password) => password,
        None => fresh_password(),
    };
    postgres::ensure(&admin, &name, &password).await?;
    // crash point `storage-provision:role-ready`: the role and database exist, no secret yet
    capstan_core::crash_point("storage-provision:role-ready");
    let values = postgres::environment(&db.host, db.port, &name, &password);
    publish(cx, actor, binding, POSTGRES_KEYS, &values).await?;
    tracing::info!(binding = %binding.binding_id, service = %binding.service_id, node = %binding.node_id, "database binding provisioned");
    Ok(Provisioned {
        endpoint: format!("{}:{}", db.host, db.port),
        name,
        secret_keys: POSTGRES_KEYS.iter().map(|k| k.to_string()).collect(),
    })
}

/// A bucket, its user and one key pair; the secret key written before its id.
async fn provision_bucket(cx: &Context, actor: &Identity, binding: &Binding) -> Result<Provisioned> {
    let (endpoint, admin) = endpoints::s3_admin(cx, &binding.node_id).await?;
    // the key pair the service holds whole (its id and its secret), else a new one
    let held = match held(cx, binding, "S3_SECRET_ACCESS_KEY").await? {
        Some(_) => held_value(cx, binding, "S3_ACCESS_KEY_ID").await?,
        None => None,
    };
    let granted = s3::ensure(&admin, &binding.binding_id, held.as_deref().map(|s| s.as_str())).await?;
    // crash point `storage-provision:key-ready`: the bucket, user and key pair exist, no secret
    // holds the new key yet
    capstan_core::crash_point("storage-provision:key-ready");
    let mut values = s3::environment(&endpoint.endpoint, &endpoint.region, &granted);
    // a held key pair comes back without its secret: the service keeps the one it holds
    if granted.secret_access_key.is_empty() {
        values.retain(|(k, _)| *k != "S3_SECRET_ACCESS_KEY");
    }
    publish(cx, actor, binding, S3_KEYS, &values).await?;
    tracing::info!(binding = %binding.binding_id, service = %binding.service_id, node = %binding.node_id, "object-storage binding provisioned");
    Ok(Provisioned {
        endpoint: endpoint.endpoint,
        name: granted.bucket.clone(),
        secret_keys: S3_KEYS.iter().map(|k| k.to_string()).collect(),
    })
}

/// The binding's credentials stop working at once: its secrets revoked, its role's login
/// disabled and its sessions ended (its key pairs deleted). The data stays.
pub async fn revoke(cx: &Context, actor: &Identity, binding: &Binding) -> Result<()> {
    check(binding)?;
    let scope = scope(&binding.binding_id);
    let owner = format!("service:{}", binding.service_id);
    for secret in managed::list(cx.store(), &scope).await? {
        if mine(&secret, &owner) {
            managed::revoke(&cx.secrets, actor, &scope, &secret.id).await?;
        }
    }
    match binding.kind {
        Kind::Database => {
            let (_, admin) = endpoints::postgres_admin(cx, &binding.node_id).await?;
            postgres::revoke(&admin, &postgres::binding_name(&binding.binding_id)?).await?;
        }
        Kind::ObjectStorage => s3::revoke(&endpoints::s3_admin(cx, &binding.node_id).await?.1, &binding.binding_id).await?,
    }
    tracing::info!(binding = %binding.binding_id, service = %binding.service_id, "binding revoked");
    Ok(())
}

/// The binding's data goes: revoked first, then its database and role dropped.
pub async fn destroy(cx: &Context, actor: &Identity, binding: &Binding) -> Result<()> {
    revoke(cx, actor, binding).await?;
    match binding.kind {
        Kind::Database => {
            let (_, admin) = endpoints::postgres_admin(cx, &binding.node_id).await?;
            postgres::drop(&admin, &postgres::binding_name(&binding.binding_id)?).await?;
        }
        Kind::ObjectStorage => s3::drop(&endpoints::s3_admin(cx, &binding.node_id).await?.1, &binding.binding_id).await?,
    }
    tracing::info!(binding = %binding.binding_id, service = %binding.service_id, "binding dropped with its data");
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
        assert!(check(&binding("bnd_1", Kind::ObjectStorage, "s3")).is_ok());
        assert_eq!(check(&binding("bnd_1", Kind::ObjectStorage, "minio")).unwrap_err().code, "binding-engine-unsupported");
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
    fn the_credential_is_written_first() {
        assert_eq!(POSTGRES_KEYS[0], "PGPASSWORD");
        assert_eq!(S3_KEYS[..2], ["S3_SECRET_ACCESS_KEY", "S3_ACCESS_KEY_ID"]);
    }
}
