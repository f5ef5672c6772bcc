//! Capstan's enrollment at the external gateway (docs/gateway-protocol.md, "Client
//! enrollment"): the one way a gateway credential enters Capstan is an administrator's gateway
//! admin token, sealed to the ingress recipient for the exact target the settings name
//! (`gateway.bootstrapCredential`). Capstan opens it, asks the gateway whether it is an admin
//! token, provisions its own least-privilege client credential with it, finalizes that and
//! keeps it as a system secret; the admin token serves that one call and is never stored,
//! logged or answered.
//!
//! What the enrollment is (`gateway.getEnrollmentState`) is derived on every read from the
//! settings and the record of the credential held, so a settings change the held credential
//! cannot carry reads as staged (the running credential keeps its own target) until the next
//! bootstrap.

pub mod certificates;
pub mod client;
pub mod domains;
pub mod relay_names;

use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::settings::{self, GATEWAY_CLIENT_ID, GATEWAY_DNS_RECORD_ADDRESSES, GATEWAY_URL};
use capstan_rpc::{Access, Call, Identity, Registry};
use capstan_secrets::ingress::{self, SealedInput};
use capstan_secrets::managed::{self, ManagedOwner};
use capstan_store::{CollectionSpec, Store};
use client::{Failure, GatewayClient, Policy};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

/// The record of the credential Capstan holds at the gateway (one document).
pub const ENROLLMENT: &str = "gateway_enrollment";
const CURRENT: &str = "current";
/// The system id the gateway client's secrets belong to.
pub const SYSTEM_ID: &str = "gateway";
/// Their management scope: only this subsystem writes them.
pub const SCOPE: &str = "gateway:client";
/// The secret holding the running client credential.
pub const TOKEN_KEY: &str = "GATEWAY_CLIENT_TOKEN";
/// The secret holding a credential issued and not yet finalized.
pub const CANDIDATE_KEY: &str = "GATEWAY_CLIENT_CANDIDATE_TOKEN";
/// What Capstan's client credential may do at the gateway, and nothing more (the one table,
/// [`capstan_core::gateway_scopes`], which also says what plugins granted a scope may reach).
pub const SCOPES: &[&str] = &capstan_core::gateway_scopes::NAMES;
/// How often a pending finalization is retried while none is given.
pub const DEFAULT_FINALIZE_RETRY: Duration = Duration::from_secs(30);
/// The method a bootstrap token is sealed for (the owner of its target is the gateway URL, the
/// key the client id).
pub const BOOTSTRAP_METHOD: &str = "gateway.bootstrapCredential";
/// The longest reason an enrollment state gives.
const MAX_REASON: usize = 4096;
/// Who reads the credential's secrets back (recorded with every first read).
const READER: &str = "host:gateway";

/// What the gateway methods reach.
#[derive(Clone)]
pub struct Context {
    /// The secrets (and through them the store and the keyring's ingress recipient).
    pub secrets: capstan_secrets::methods::Context,
    /// The gateway's HTTP client.
    pub client: GatewayClient,
    /// One bootstrap at a time on this node (the record's revision guards the fleet).
    bootstrap: Arc<tokio::sync::Mutex<()>>,
    /// One domains sync at a time on this node: a background sync that read the gateway before
    /// it went down must not record its success over a later sync's failure.
    syncing: Arc<tokio::sync::Mutex<()>>,
}

impl Context {
    /// The gateway subsystem over the secrets' context.
    pub fn new(secrets: capstan_secrets::methods::Context) -> Context {
        Context { secrets, client: GatewayClient::default(), bootstrap: Arc::default(), syncing: Arc::default() }
    }

    fn store(&self) -> &Store {
        &self.secrets.store
    }
}

/// Declare the enrollment record's collection.
pub async fn declare(store: &Store) -> Result<()> {
    store.declare(CollectionSpec::new(ENROLLMENT)).await?;
    domains::declare(store).await
}

/// A credential Capstan holds (or was issued), with the target and policy it was issued for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Held {
    credential_id: String,
    gateway_url: String,
    client_id: String,
    dns_record_addresses: Vec<String>,
    /// The secret holding its token.
    secret_id: String,
    issued_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    finalized_at: Option<u64>,
}

/// The enrollment record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// The credential the gateway legs use.
    #[serde(default)]
    running: Option<Held>,
    /// One issued and not yet finalized.
    #[serde(default)]
    candidate: Option<Held>,
    /// What the last finalization attempt came to, when it did not succeed (value-free).
    #[serde(default)]
    note: Option<String>,
}

/// The gateway settings as they stand (staged ones included).
#[derive(Debug, Clone, Default, PartialEq)]
struct Target {
    gateway_url: Option<String>,
    client_id: Option<String>,
    dns_record_addresses: Vec<String>,
}

impl Target {
    fn from_settings(settings: &serde_json::Map<String, Value>) -> Target {
        let text = |key: &str| settings.get(key).and_then(Value::as_str).map(str::to_string);
        let prefixes = settings.get(GATEWAY_DNS_RECORD_ADDRESSES).and_then(Value::as_array);
        Target {
            gateway_url: text(GATEWAY_URL),
            client_id: text(GATEWAY_CLIENT_ID),
            dns_record_addresses: prefixes.map(|l| l.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default(),
        }
    }
}

/// Where the enrollment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// The held credential is Capstan's gateway authority and carries the settings.
    Ready,
    /// A credential was issued and awaits finalization; Capstan retries it.
    Degraded,
    /// An administrator must hand in a gateway admin token (`reason` says why).
    AdminBootstrapRequired,
}

/// One gateway setting that differs from what the held credential was issued for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StagedChange {
    /// The setting's key.
    pub key: String,
    /// What the held credential carries ("" for unset).
    pub from: String,
    /// What the settings say now ("" for unset).
    pub to: String,
}

/// The answer of `gateway.getEnrollmentState` and `gateway.bootstrapCredential`.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnrollmentState {
    /// `ready`, `degraded` or `admin-bootstrap-required`.
    pub state: Phase,
    /// Whether an issued credential awaits finalization.
    pub finalization_pending: bool,
    /// Why the state is not `ready` (at most 4096 characters; names the request to use).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The gateway the running credential serves at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway_url: Option<String>,
    /// The client it enrolls Capstan as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The gateway's id of the running credential.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_id: Option<String>,
    /// When it was finalized (milliseconds since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finalized_at: Option<u64>,
    /// Gateway settings the held credential does not carry, applied by the next bootstrap.
    pub staged: Vec<StagedChange>,
}

const HOW: &str = "hand in a gateway admin token with gateway.bootstrapCredential (capstan gateway bootstrap)";

/// The settings the running credential does not carry.
fn staged(running: &Held, target: &Target) -> Vec<StagedChange> {
    let mut changes = Vec::new();
    let mut differ = |key: &str, from: String, to: String| {
        if from != to {
            changes.push(StagedChange { key: key.into(), from, to });
        }
    };
    differ(GATEWAY_URL, running.gateway_url.clone(), target.gateway_url.clone().unwrap_or_default());
    differ(GATEWAY_CLIENT_ID, running.client_id.clone(), target.client_id.clone().unwrap_or_default());
    differ(GATEWAY_DNS_RECORD_ADDRESSES, running.dns_record_addresses.join(","), target.dns_record_addresses.join(","));
    changes
}

/// The enrollment as `target` and `record` make it.
fn derive(target: &Target, record: &Record) -> EnrollmentState {
    let running = record.running.as_ref();
    let staged = running.map(|r| staged(r, target)).unwrap_or_default();
    let (state, reason) = if let Some(candidate) = &record.candidate {
        let last = record.note.as_deref().map(|n| format!(" The last attempt: {n}")).unwrap_or_default();
        (
            Phase::Degraded,
            Some(format!(
                "The gateway issued credential {} and it awaits finalization; Capstan retries it.{last}",
                candidate.credential_id
            )),
        )
    } else if target.gateway_url.is_none() || target.client_id.is_none() {
        (
            Phase::AdminBootstrapRequired,
            Some(format!(
                "The external gateway is not configured: set {GATEWAY_URL} and {GATEWAY_CLIENT_ID} with settings.update, then {HOW}."
            )),
        )
    } else if running.is_none() {
        let last = record.note.as_deref().map(|n| format!(" {n}")).unwrap_or_default();
        (Phase::AdminBootstrapRequired, Some(format!("Capstan holds no gateway credential: {HOW}.{last}")))
    } else if !staged.is_empty() {
        let changes: Vec<String> =
            staged.iter().map(|c| format!("Staged gateway settings change {} {:?} -> {:?}.", c.key, c.from, c.to)).collect();
        (Phase::AdminBootstrapRequired, Some(format!("{} To apply it, {HOW}, naming the staged target.", changes.join(" "))))
    } else {
        (Phase::Ready, None)
    };
    let reason = reason.map(|r| if r.chars().count() > MAX_REASON { r.chars().take(MAX_REASON - 1).chain(['…']).collect() } else { r });
    EnrollmentState {
        state,
        finalization_pending: record.candidate.is_some(),
        reason,
        gateway_url: running.map(|r| r.gateway_url.clone()),
        client_id: running.map(|r| r.client_id.clone()),
        credential_id: running.map(|r| r.credential_id.clone()),
        finalized_at: running.and_then(|r| r.finalized_at),
        staged,
    }
}

/// The gateway settings and the record with its revision (`None`: never written).
async fn read(store: &Store) -> Result<(Target, Option<u64>, Record)> {
    store
        .transact(|tx| async move {
            let target = Target::from_settings(&settings::current(&tx).await?);
            let doc = tx.get(ENROLLMENT, CURRENT).await?;
            let record = match &doc {
                Some(doc) => serde_json::from_value(doc.data.clone()).map_err(Refusal::internal)?,
                None => Record::default(),
            };
            Ok((target, doc.map(|d| d.revision), record))
        })
        .await
}

/// Write `record` over the revision read (`conflict` when another write came between).
async fn write(store: &Store, revision: Option<u64>, record: &Record) -> Result<()> {
    let data = serde_json::to_value(record).map_err(Refusal::internal)?;
    store
        .transact(|tx| {
            let data = data.clone();
            async move { tx.put(ENROLLMENT, CURRENT, revision, data).await.map(drop) }
        })
        .await
}

/// The enrollment as it stands.
pub async fn state(cx: &Context) -> Result<EnrollmentState> {
    let (target, _, record) = read(cx.store()).await?;
    Ok(derive(&target, &record))
}

/// Input of `gateway.bootstrapCredential`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BootstrapInput {
    /// The gateway URL the token is meant for, as `settings.get` answers `gatewayUrl`.
    pub expected_gateway_url: String,
    /// The client id it is meant for, as `settings.get` answers `gatewayClientId`.
    pub expected_gateway_client_id: String,
    /// The gateway admin token, sealed to the ingress recipient for
    /// `{"method":"gateway.bootstrapCredential","owner":<url>,"key":<client id>}`.
    pub sealed_admin_token: SealedInput,
}

fn refused(code: &'static str, message: impl Into<String>) -> Refusal {
    let message = message.into();
    let mut chars = message.chars();
    let sentence: String = chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default();
    Refusal::new(code, format!("External gateway bootstrap refused: {code}. {sentence}"))
}

/// Every refusal of `gateway.bootstrapCredential` of its own.
pub const BOOTSTRAP_REFUSALS: &[&str] = &[
    "gateway-unconfigured",
    "gateway-target-mismatch",
    "bootstrap-token-invalid",
    "bootstrap-token-rejected",
    "bootstrap-token-not-admin",
    "bootstrap-candidate-pending",
    "gateway-unreachable",
    "bootstrap-provisioning-refused",
    "admin-not-fresh",
    "conflict",
];

async fn bootstrap(cx: Context, call: Call, input: BootstrapInput) -> Result<EnrollmentState> {
    let actor = call.identity()?.clone();
    actor.require_fresh()?;
    let _one = cx.bootstrap.lock().await;
    let (target, revision, mut record) = read(cx.store()).await?;
    let (Some(url), Some(client_id)) = (target.gateway_url.clone(), target.client_id.clone()) else {
        return Err(refused("gateway-unconfigured", format!("set {GATEWAY_URL} and {GATEWAY_CLIENT_ID} with settings.update first")));
    };
    if input.expected_gateway_url != url || input.expected_gateway_client_id != client_id {
        let settings = format!("the settings name {GATEWAY_URL} {url:?} and {GATEWAY_CLIENT_ID} {client_id:?}");
        return Err(refused(
            "gateway-target-mismatch",
            format!("{settings}; the request names another target: name theirs and seal again"),
        )
        .with_data(json!({ "gatewayUrl": url, "gatewayClientId": client_id })));
    }
    let opened = ingress::open(&cx.secrets.keyring, &ingress::target(BOOTSTRAP_METHOD, &url, &client_id), &input.sealed_admin_token)
        .map_err(|e| {
            refused("bootstrap-token-invalid", "the sealed token does not open for this recipient and target")
                .with_data(json!({ "reason": e.code }))
        })?;
    let Some(admin_token) = std::str::from_utf8(&opened).ok().filter(|t| client::is_token(t)) else {
        return Err(refused("bootstrap-token-invalid", "the token must be 1 to 1024 bytes of visible ASCII"));
    };
    if let Some(candidate) = &record.candidate {
        return Err(refused(
            "bootstrap-candidate-pending",
            "a credential from an earlier bootstrap awaits finalization; Capstan retries it, then bootstrap again if still needed",
        )
        .with_data(json!({ "credentialId": candidate.credential_id }))
        .retryable());
    }
    match cx.client.whoami(&url, admin_token).await {
        Ok(me) if me.role == "admin" => {}
        Ok(_) => return Err(refused("bootstrap-token-not-admin", "the gateway accepts the token, but not as an admin token")),
        Err(Failure::Unauthorized | Failure::Refused { .. }) => {
            return Err(refused("bootstrap-token-rejected", "the gateway does not accept the token"));
        }
        Err(e) => return Err(refused("gateway-unreachable", format!("{e}; nothing was provisioned, repeat the call")).retryable()),
    }
    let policy = Policy {
        scopes: SCOPES.iter().map(|s| s.to_string()).collect(),
        allowed_dns_record_addresses: target.dns_record_addresses.clone(),
    };
    let issued = match cx.client.provision(&url, admin_token, &client_id, &policy).await {
        Ok(issued) => issued,
        Err(Failure::Unreachable { sent: false, reason }) => {
            return Err(refused("gateway-unreachable", format!("{reason}; nothing was provisioned, repeat the call")).retryable());
        }
        Err(e) => return Err(refused("bootstrap-provisioning-refused", e.to_string())),
    };
    // the admin token has served its one call
    drop(opened);
    // the candidate is kept before it is finalized, so a finalization that fails is retried
    let secret = managed::put(
        &cx.secrets,
        &actor,
        SCOPE,
        ManagedOwner::System(SYSTEM_ID.into()),
        CANDIDATE_KEY,
        Zeroizing::new(issued.token.as_bytes().to_vec()),
    )
    .await?;
    record.candidate = Some(Held {
        credential_id: issued.credential_id.clone(),
        gateway_url: url,
        client_id,
        dns_record_addresses: target.dns_record_addresses,
        secret_id: secret.id,
        issued_at: now_ms(),
        finalized_at: None,
    });
    record.note = None;
    write(cx.store(), revision, &record).await?;
    tracing::info!(credential = %issued.credential_id, "gateway credential issued");
    finalize_pending(&cx, &actor).await?;
    state(&cx).await
}

/// Finalize the credential awaiting finalization, if there is one: the gateway makes it the
/// client's active credential, Capstan keeps it as the running one. A gateway that will not
/// finalize it drops it (a new bootstrap is needed); one that cannot be reached leaves it for
/// the next attempt. Writes only when something changes.
pub async fn finalize_pending(cx: &Context, actor: &Identity) -> Result<()> {
    let (_, revision, mut record) = read(cx.store()).await?;
    let Some(candidate) = record.candidate.clone() else { return Ok(()) };
    let token = managed::reveal(&cx.secrets, actor, READER, SCOPE, &candidate.secret_id).await?;
    let text = std::str::from_utf8(&token).map_err(Refusal::internal)?;
    match cx.client.finalize(&candidate.gateway_url, text, &candidate.credential_id).await {
        Ok(()) => {
            let running = managed::put(&cx.secrets, actor, SCOPE, ManagedOwner::System(SYSTEM_ID.into()), TOKEN_KEY, token.clone()).await?;
            record.running = Some(Held { secret_id: running.id, finalized_at: Some(now_ms()), ..candidate.clone() });
            record.candidate = None;
            record.note = None;
            if !recorded(write(cx.store(), revision, &record).await)? {
                return Ok(());
            }
            tracing::info!(credential = %candidate.credential_id, "gateway credential finalized: it is Capstan's gateway authority now");
        }
        Err(e @ (Failure::Unauthorized | Failure::Refused { .. })) => {
            record.candidate = None;
            record.note = Some(format!("The gateway would not finalize credential {} ({e}).", candidate.credential_id));
            if !recorded(write(cx.store(), revision, &record).await)? {
                return Ok(());
            }
            tracing::warn!(credential = %candidate.credential_id, "gateway credential not finalized and dropped: {e}");
        }
        Err(e) => {
            let note = Some(e.to_string());
            if record.note != note {
                record.note = note;
                recorded(write(cx.store(), revision, &record).await)?;
            }
            tracing::warn!(credential = %candidate.credential_id, "gateway credential finalization failed, to be retried: {e}");
            return Ok(());
        }
    }
    // the candidate's secret has served; a later bootstrap puts the key anew
    match managed::revoke(&cx.secrets, actor, SCOPE, &candidate.secret_id).await {
        Err(e) if !e.is("secret-revoked") => Err(e),
        _ => Ok(()),
    }
}

/// Whether a finalization's write landed: `false` when another writer (another node's retry, a
/// bootstrap here) changed the record since it was read, which the next pass reads afresh.
fn recorded(written: Result<()>) -> Result<bool> {
    match written {
        Ok(()) => Ok(true),
        Err(e) if e.is("conflict") || e.is("exists") => Ok(false),
        Err(e) => Err(e),
    }
}

/// The running credential's gateway URL and token, for the legs that act at the gateway as
/// Capstan's client (domains, relay names); `gateway-not-enrolled` while none is finalized.
async fn enrolled(cx: &Context) -> Result<(String, Zeroizing<String>)> {
    let (_, _, record) = read(cx.store()).await?;
    let Some(running) = record.running else {
        return Err(Refusal::new(
            "gateway-not-enrolled",
            "Capstan holds no gateway credential yet; bootstrap one (capstan gateway bootstrap)",
        ));
    };
    let token = managed::reveal(&cx.secrets, &host_identity(), READER, SCOPE, &running.secret_id).await?;
    let token = String::from_utf8(token.to_vec()).map_err(Refusal::internal)?;
    Ok((running.gateway_url, Zeroizing::new(token)))
}

/// One plugin's request to the gateway (`gateway.request`, already checked by the plugin host:
/// a method, a path a granted scope covers, a JSON body) under the running client credential,
/// read from its secret for this request alone: whatever status the gateway answers, with its
/// body when that is JSON, at most `max_answer` bytes of it, within `timeout`. Refused
/// `gateway-not-enrolled` while Capstan holds no finalized credential, `gateway-unreachable`
/// (retryable) when no answer came, `gateway-credential-refused` when the gateway answered 401,
/// `gateway-reply-too-large`. The token reaches no answer, refusal or log line.
pub async fn plugin_request(
    cx: &Context,
    method: &str,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
    max_answer: usize,
) -> Result<(u16, Option<Value>)> {
    let (gateway_url, token) = enrolled(cx).await?;
    let request = client::Exchange { method, path, body, timeout, max_answer };
    match cx.client.exchange(&gateway_url, &token, &request).await {
        Ok(answer) => Ok(answer),
        Err(Failure::Unauthorized) => Err(Refusal::new(
            "gateway-credential-refused",
            "The gateway does not accept Capstan's client credential; an administrator bootstraps a new one (capstan gateway bootstrap)",
        )),
        Err(Failure::Unreachable { sent, reason }) => {
            Err(Refusal::new("gateway-unreachable", format!("The gateway could not be reached: {reason}"))
                .retryable()
                .with_data(json!({ "sent": sent })))
        }
        Err(Failure::TooLarge { limit }) => Err(Refusal::new(
            "gateway-reply-too-large",
            format!("The gateway's answer is longer than the {limit} bytes a plugin is passed"),
        )
        .with_data(json!({ "limitBytes": limit }))),
        Err(e) => Err(Refusal::internal(format!("a plugin's gateway request could not be sent: {e}"))),
    }
}

/// Who the background finalization acts as.
pub fn host_identity() -> Identity {
    Identity {
        user_id: READER.into(),
        username: "gateway".into(),
        kind: "host".into(),
        admin: false,
        session_id: String::new(),
        authenticated_at: capstan_core::clock::now_ms(),
        expires_at: u64::MAX,
    }
}

/// Retry a pending finalization every `period`, and sync the gateway's domains in while a
/// credential is held, until `stopped` turns true.
pub fn spawn_finalizer(cx: Context, period: Duration, mut stopped: tokio::sync::watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let actor = host_identity();
        let mut last_failure: Option<String> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stopped.wait_for(|s| *s) => return,
            }
            let _one = cx.bootstrap.lock().await;
            if let Err(e) = finalize_pending(&cx, &actor).await {
                tracing::warn!(code = %e.code, "gateway credential finalization: {e}");
            }
            // said once per distinct failure, not every period
            let synced = match domains::sync(&cx).await {
                Ok(_) => relay_names::publish(&cx).await.map(drop),
                Err(e) => Err(e),
            };
            let failure = match synced {
                Ok(()) => None,
                Err(e) if e.is("gateway-not-enrolled") => None,
                Err(e) => Some(e),
            };
            let text = failure.as_ref().map(|e| e.to_string());
            if let Some(e) = &failure
                && text != last_failure
            {
                tracing::warn!(code = %e.code, "gateway sync (domains, relay names): {e}");
            }
            last_failure = text;
        }
    })
}

async fn get_state(cx: Context, _: Call, _: capstan_secrets::methods::Empty) -> Result<EnrollmentState> {
    state(&cx).await
}

/// Register the `gateway.*` methods.
pub fn register(registry: &mut Registry, cx: Context) {
    domains::register(registry, cx.clone());
    relay_names::register(registry, cx.clone());
    certificates::register(registry, cx.clone());
    let mut registry = registry.with(cx);
    registry
        .add(
            "gateway.bootstrapCredential",
            "Enroll Capstan at the external gateway with an admin token sealed for the configured target (administrator); the token serves this one call",
            Access::Admin,
            bootstrap,
        )
        .refuses(BOOTSTRAP_REFUSALS);
    registry
        .add(
            "gateway.getEnrollmentState",
            "Whether Capstan's gateway credential is ready, awaits finalization, or needs an administrator's bootstrap, and why",
            Access::Admin,
            get_state,
        )
        .read_only();
}

#[cfg(test)]
mod tests;
