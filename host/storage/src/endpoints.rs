//! The storage endpoints nodes state (`storage_endpoints`, id = node id): where a workload on
//! the node reaches its PostgreSQL server and its S3 endpoint, and as whom Capstan administers
//! them — the admin password and secret key kept as system secrets (`storage:<nodeId>`),
//! entered sealed, never shown.
//! `nodes.setStorageEndpoint` checks the credential against the server before anything is
//! written, so a wrong one is refused and the endpoint stays as it was.

use super::{Context, postgres, s3};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_nodes::records::{NodeState, require_node};
use capstan_rpc::{Access, Call, Identity, Registry};
use capstan_secrets::ingress::{self, SealedInput};
use capstan_secrets::managed::{self, ManagedOwner};
use capstan_store::{CollectionSpec, Store, Tx};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};
use zeroize::Zeroizing;

/// The endpoints, by node id.
pub const STORAGE_ENDPOINTS: &str = "storage_endpoints";
/// The management scope of the providers' admin credentials.
pub const ADMIN_SCOPE: &str = "storage";
/// The key of a node's PostgreSQL admin password.
pub const POSTGRES_ADMIN_KEY: &str = "POSTGRES_ADMIN_PASSWORD";
/// The key of a node's S3 admin secret key.
pub const S3_ADMIN_KEY: &str = "S3_ADMIN_SECRET_ACCESS_KEY";
const SET_METHOD: &str = "nodes.setStorageEndpoint";

/// The endpoints' collection.
pub fn collection() -> CollectionSpec {
    CollectionSpec::new(STORAGE_ENDPOINTS).index("by_cluster", &["clusterId"])
}

/// A node's PostgreSQL server, as stored (value-free).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseEndpoint {
    /// `postgresql`.
    pub engine: String,
    /// Where a workload on the node reaches it, and Capstan too: an IPv4 or IPv6 literal or a
    /// lowercase DNS name.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// The admin role Capstan provisions as (CREATEROLE and CREATEDB; a superuser is not needed).
    pub user: String,
    /// The system secret holding its password.
    pub secret_id: String,
}

/// A node's S3 endpoint, as stored (value-free).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStorageEndpoint {
    /// The origin workloads on the node (and Capstan) reach it at: `http(s)://host[:port]`.
    pub endpoint: String,
    /// Its region (lowercase).
    pub region: String,
    /// The admin key pair's id (S3 and IAM rights).
    pub access_key_id: String,
    /// The system secret holding the admin secret key.
    pub secret_id: String,
}

/// What a node states (`storage_endpoints`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoints {
    /// The node.
    pub node_id: String,
    /// Its cluster.
    pub cluster_id: String,
    /// Its PostgreSQL server, if it states one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<DatabaseEndpoint>,
    /// Its S3 endpoint, if it states one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_storage: Option<ObjectStorageEndpoint>,
    /// When it last changed (milliseconds).
    pub updated_at: u64,
    /// Who changed it.
    pub updated_by: String,
}

/// What `nodes.getStorageEndpoint` and the `storage` import answer: never the credential.
pub fn view(node_id: &str, cluster_id: &str, stored: Option<(u64, &Endpoints)>) -> Value {
    let mut out = json!({ "nodeId": node_id, "clusterId": cluster_id, "revision": stored.map(|(r, _)| r) });
    if let Some(db) = stored.and_then(|(_, e)| e.database.as_ref()) {
        out["database"] = json!({ "engine": db.engine, "host": db.host, "port": db.port, "user": db.user });
    }
    if let Some(o) = stored.and_then(|(_, e)| e.object_storage.as_ref()) {
        out["objectStorage"] = json!({ "endpoint": o.endpoint, "region": o.region, "accessKeyId": o.access_key_id });
    }
    out
}

/// The node's endpoints as stored, with their revision.
pub async fn read(tx: &Tx, node_id: &str) -> Result<Option<(u64, Endpoints)>> {
    match tx.get(STORAGE_ENDPOINTS, node_id).await? {
        Some(doc) => Ok(Some((doc.revision, serde_json::from_value(doc.data).map_err(Refusal::internal)?))),
        None => Ok(None),
    }
}

/// Input of `nodes.setStorageEndpoint`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SetInput {
    /// The node.
    pub node_id: String,
    /// The endpoints' revision as read (`nodes.getStorageEndpoint`), `null` for none yet.
    pub expected_revision: Option<u64>,
    /// The node's PostgreSQL server; `null` clears it (bindings placed there are then refused
    /// `database-endpoint-missing`); absent keeps it.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Option<DatabaseInput>")]
    pub database: Option<Option<DatabaseInput>>,
    /// The node's S3 endpoint; `null` clears it; absent keeps it.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Option<ObjectStorageInput>")]
    pub object_storage: Option<Option<ObjectStorageInput>>,
}

/// A node's S3 endpoint as an administrator states it.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectStorageInput {
    /// A canonical `http:` or `https:` origin: no path, query, userinfo or trailing slash.
    pub endpoint: String,
    /// Its region, lowercase (`us-east-1`).
    pub region: String,
    /// The admin key pair's id: S3 and IAM rights (a bucket, a user and a key pair per binding).
    pub access_key_id: String,
    /// Its secret key, sealed to the ingress recipient for `{"method":"nodes.setStorageEndpoint",
    /// "owner":<nodeId>,"key":"objectStorage"}`; absent keeps the one held (same key id).
    #[serde(default)]
    pub sealed_secret_access_key: Option<SealedInput>,
}

fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> std::result::Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A node's PostgreSQL server as an administrator states it.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DatabaseInput {
    /// `postgresql` (MongoDB is not provided yet: `binding-engine-unsupported`).
    pub engine: String,
    /// An IPv4 or IPv6 literal (no brackets) or a lowercase DNS name.
    pub host: String,
    /// 1–65535.
    pub port: u16,
    /// The admin role.
    pub user: String,
    /// Its password, sealed to the ingress recipient for `{"method":"nodes.setStorageEndpoint",
    /// "owner":<nodeId>,"key":"database"}`; absent keeps the one held (same user).
    #[serde(default)]
    pub sealed_password: Option<SealedInput>,
}

/// Input of `nodes.getStorageEndpoint`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GetInput {
    /// The node.
    pub node_id: String,
}

/// `host-invalid` unless `host` is an IP literal or a lowercase DNS name.
pub fn check_host(host: &str) -> Result<()> {
    let dns = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if dns || host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    Err(Refusal::new("host-invalid", "a database host is an IPv4 or IPv6 literal (no brackets) or a lowercase DNS name"))
}

/// `invalid-request` unless `user` is a plain role name: 1–63 of a-z, A-Z, 0-9 and `_`, not
/// starting with a digit.
fn check_user(user: &str) -> Result<()> {
    let ok = (1..=63).contains(&user.len())
        && !user.starts_with(|c: char| c.is_ascii_digit())
        && user.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok { Ok(()) } else { Err(Refusal::invalid_request("the admin role is 1–63 of a-z A-Z 0-9 _, not starting with a digit")) }
}

fn system_id(node_id: &str) -> String {
    format!("storage:{node_id}")
}

/// The identity Capstan provisions as (the admin credentials are the host's own).
pub fn host_identity() -> Identity {
    Identity {
        user_id: "host:storage".into(),
        username: "storage".into(),
        kind: "host".into(),
        admin: false,
        session_id: String::new(),
        authenticated_at: now_ms(),
        expires_at: u64::MAX,
    }
}

/// The admin of the node's PostgreSQL server, its password opened: `database-endpoint-missing`
/// when the node states none.
pub async fn postgres_admin(cx: &Context, node_id: &str) -> Result<(DatabaseEndpoint, postgres::Admin)> {
    let stored = cx.store().transact(|tx| async move { read(&tx, node_id).await }).await?;
    let Some(db) = stored.and_then(|(_, e)| e.database) else {
        return Err(Refusal::new(
            "database-endpoint-missing",
            format!("node {node_id} states no database endpoint (nodes.setStorageEndpoint)"),
        )
        .with_data(json!({ "nodeId": node_id })));
    };
    let password = managed::reveal(&cx.secrets, &host_identity(), "host:storage", ADMIN_SCOPE, &db.secret_id).await?;
    let password = Zeroizing::new(String::from_utf8(password.to_vec()).map_err(|_| Refusal::internal("the admin password is not UTF-8"))?);
    let admin = postgres::Admin { host: db.host.clone(), port: db.port, user: db.user.clone(), password };
    Ok((db, admin))
}

async fn set(cx: Context, call: Call, input: SetInput) -> Result<Value> {
    let actor = call.identity()?.clone();
    actor.require_fresh()?;
    let node_id = input.node_id.clone();
    let (stored, cluster_id) = cx
        .store()
        .transact(|tx| {
            let node_id = node_id.clone();
            async move {
                let node = require_node(&tx, &node_id).await?;
                Ok((read(&tx, &node_id).await?, node.data.cluster_id))
            }
        })
        .await?;
    let held = stored.as_ref().map(|(r, _)| *r);
    if input.expected_revision != held {
        return Err(Refusal::new("conflict", format!("the storage endpoints of node {node_id} are at revision {held:?}"))
            .with_data(json!({ "revision": held })));
    }
    let mut next = stored.map(|(_, e)| e).unwrap_or(Endpoints {
        node_id: node_id.clone(),
        cluster_id: cluster_id.clone(),
        database: None,
        object_storage: None,
        updated_at: 0,
        updated_by: String::new(),
    });
    match input.database {
        None => {}
        Some(None) => next.database = None,
        Some(Some(db)) => next.database = Some(database(&cx, &node_id, next.database.as_ref(), db).await?),
    }
    match input.object_storage {
        None => {}
        Some(None) => next.object_storage = None,
        Some(Some(o)) => next.object_storage = Some(object_storage(&cx, &node_id, next.object_storage.as_ref(), o).await?),
    }
    next.cluster_id = cluster_id.clone();
    next.updated_at = now_ms();
    next.updated_by = actor.user_id.clone();
    let data = serde_json::to_value(&next).map_err(Refusal::internal)?;
    let revision = cx
        .store()
        .transact(|tx| {
            let (node_id, data) = (node_id.clone(), data.clone());
            async move {
                // the node must still be there: a node deleted meanwhile leaves no endpoint behind
                require_node(&tx, &node_id).await?;
                let revision = tx.put(STORAGE_ENDPOINTS, &node_id, held, data).await?;
                capstan_inventory::emit(&tx, "node.storageEndpointChanged", &node_id, json!({ "nodeId": node_id })).await?;
                Ok(revision)
            }
        })
        .await?;
    tracing::info!(node = %node_id, by = %actor.user_id, "storage endpoints of the node changed");
    Ok(view(&node_id, &cluster_id, Some((revision.revision, &next))))
}

/// Check the stated server with its admin credential, keep the password as the node's system
/// secret, and answer what is stored.
async fn database(cx: &Context, node_id: &str, held: Option<&DatabaseEndpoint>, db: DatabaseInput) -> Result<DatabaseEndpoint> {
    if db.engine != "postgresql" {
        return Err(Refusal::new("binding-engine-unsupported", format!("database engine {:?}: Capstan provides postgresql", db.engine))
            .with_data(json!({ "engine": db.engine, "supported": ["postgresql"] })));
    }
    check_host(&db.host)?;
    if db.port == 0 {
        return Err(Refusal::invalid_request("a port is 1 to 65535"));
    }
    check_user(&db.user)?;
    let password = match (&db.sealed_password, held) {
        (Some(sealed), _) => {
            let opened = ingress::open(&cx.secrets.keyring, &ingress::target(SET_METHOD, node_id, "database"), sealed)?;
            Zeroizing::new(String::from_utf8(opened.to_vec()).map_err(|_| Refusal::invalid_request("the password must be UTF-8"))?)
        }
        (None, Some(held)) if held.user == db.user => {
            let (_, admin) = postgres_admin(cx, node_id).await?;
            admin.password
        }
        (None, _) => return Err(Refusal::invalid_request("a new admin role needs its password (sealedPassword)")),
    };
    let admin = postgres::Admin { host: db.host.clone(), port: db.port, user: db.user.clone(), password };
    // a credential that does not work is refused before anything is kept
    postgres::check(&admin).await?;
    let secret = managed::put(
        &cx.secrets,
        &host_identity(),
        ADMIN_SCOPE,
        ManagedOwner::System(system_id(node_id)),
        POSTGRES_ADMIN_KEY,
        Zeroizing::new(admin.password.as_bytes().to_vec()),
    )
    .await?;
    Ok(DatabaseEndpoint { engine: db.engine, host: db.host, port: db.port, user: db.user, secret_id: secret.id })
}

/// Check the stated S3 endpoint with its admin key pair, keep the secret key as the node's
/// system secret, and answer what is stored.
async fn object_storage(
    cx: &Context,
    node_id: &str,
    held: Option<&ObjectStorageEndpoint>,
    o: ObjectStorageInput,
) -> Result<ObjectStorageEndpoint> {
    s3::check_endpoint(&o.endpoint, &o.region)?;
    if o.access_key_id.is_empty() || o.access_key_id.len() > 128 || !o.access_key_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(Refusal::invalid_request("an access key id is 1–128 letters and digits"));
    }
    let secret = match (&o.sealed_secret_access_key, held) {
        (Some(sealed), _) => {
            let opened = ingress::open(&cx.secrets.keyring, &ingress::target(SET_METHOD, node_id, "objectStorage"), sealed)?;
            Zeroizing::new(String::from_utf8(opened.to_vec()).map_err(|_| Refusal::invalid_request("the secret key must be UTF-8"))?)
        }
        (None, Some(held)) if held.access_key_id == o.access_key_id => s3_admin(cx, node_id).await?.1.secret_access_key,
        (None, _) => return Err(Refusal::invalid_request("a new admin key pair needs its secret key (sealedSecretAccessKey)")),
    };
    let admin = s3::Admin {
        endpoint: o.endpoint.clone(),
        region: o.region.clone(),
        access_key_id: o.access_key_id.clone(),
        secret_access_key: secret,
    };
    // a key pair that does not work, or an endpoint without users and policies, is refused
    // before anything is kept
    s3::check(&admin).await?;
    let kept = managed::put(
        &cx.secrets,
        &host_identity(),
        ADMIN_SCOPE,
        ManagedOwner::System(system_id(node_id)),
        S3_ADMIN_KEY,
        Zeroizing::new(admin.secret_access_key.as_bytes().to_vec()),
    )
    .await?;
    Ok(ObjectStorageEndpoint { endpoint: o.endpoint, region: o.region, access_key_id: o.access_key_id, secret_id: kept.id })
}

/// The admin of the node's S3 endpoint, its secret key opened: `objectstorage-endpoint-missing`
/// when the node states none.
pub async fn s3_admin(cx: &Context, node_id: &str) -> Result<(ObjectStorageEndpoint, s3::Admin)> {
    let stored = cx.store().transact(|tx| async move { read(&tx, node_id).await }).await?;
    let Some(o) = stored.and_then(|(_, e)| e.object_storage) else {
        return Err(Refusal::new(
            "objectstorage-endpoint-missing",
            format!("node {node_id} states no object-storage endpoint (nodes.setStorageEndpoint)"),
        )
        .with_data(json!({ "nodeId": node_id })));
    };
    let secret = managed::reveal(&cx.secrets, &host_identity(), "host:storage", ADMIN_SCOPE, &o.secret_id).await?;
    let secret = Zeroizing::new(String::from_utf8(secret.to_vec()).map_err(|_| Refusal::internal("the admin secret key is not UTF-8"))?);
    let admin = s3::Admin {
        endpoint: o.endpoint.clone(),
        region: o.region.clone(),
        access_key_id: o.access_key_id.clone(),
        secret_access_key: secret,
    };
    Ok((o, admin))
}

async fn get(cx: Context, _call: Call, input: GetInput) -> Result<Value> {
    endpoints_view(cx.store(), &input.node_id).await
}

/// What a node states, value-free (`nodes.getStorageEndpoint`, the `storage` import).
pub async fn endpoints_view(store: &Store, node_id: &str) -> Result<Value> {
    store
        .transact(|tx| async move {
            let node = require_node(&tx, node_id).await?;
            let stored = read(&tx, node_id).await?;
            Ok(view(node_id, &node.data.cluster_id, stored.as_ref().map(|(r, e)| (*r, e))))
        })
        .await
}

/// The node, required active (`node-retired` otherwise), and its cluster.
pub async fn require_active_node(tx: &Tx, node_id: &str) -> Result<String> {
    let node = require_node(tx, node_id).await?;
    if node.data.state != NodeState::Active {
        return Err(Refusal::new("node-retired", format!("node {node_id} is retired")).with_data(json!({ "nodeId": node_id })));
    }
    Ok(node.data.cluster_id)
}

/// Every refusal of `nodes.setStorageEndpoint` of its own.
pub const SET_REFUSALS: &[&str] = &[
    "admin-not-fresh",
    "conflict",
    "node-missing",
    "host-invalid",
    "binding-engine-unsupported",
    "database-endpoint-unreachable",
    "database-admin-rejected",
    "database-admin-insufficient",
    "database-provider-failed",
    "objectstorage-endpoint-invalid",
    "objectstorage-endpoint-unreachable",
    "objectstorage-admin-rejected",
    "objectstorage-users-unsupported",
    "objectstorage-provider-failed",
    "sealed-input-recipient-unknown",
    "sealed-input-invalid",
];

/// Register `nodes.setStorageEndpoint` and `nodes.getStorageEndpoint`.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            SET_METHOD,
            "State where a node's PostgreSQL server and S3 endpoint are, with their admin credentials (sealed, checked against the provider, kept as system secrets, never shown); null clears one (administrator)",
            Access::Admin,
            set,
        )
        .refuses(SET_REFUSALS);
    registry
        .add("nodes.getStorageEndpoint", "The storage endpoints a node states, without any credential (administrator)", Access::Admin, get)
        .refuses(&["node-missing"])
        .read_only();
}
