//! The CoreMail control plane (docs/coremail.md; the protocol in docs/coremail-protocol.md).
//!
//! CoreMail is a mail workload Capstan runs as one of its services; this manager is its control
//! client. Everything is off unless the setting `coremail.coreMailEnabled` is true. When on,
//! every reconcile pass:
//!
//! 1. keeps the four system secrets (`COREMAIL_CONTROL_CREDENTIAL_SECRET` and
//!    `COREMAIL_GATEWAY_CREDENTIAL_SECRET` minted here; the SMTP listener's TLS PEMs supplied by
//!    the operator) and, for the two credentials, the public half this manager emitted (a salted
//!    verifier) in its own record — recomputing a salted verifier would change it on every pass;
//!    a rotated credential keeps the previous verifier `retiring` for 15 minutes (`acceptUntil`);
//! 2. delivers the CoreMail service's environment (its control bootstrap with the verifiers
//!    only, the gateway credential in plaintext, the endpoints, the TLS material when present)
//!    as secrets of that service, written only where a value differs;
//! 3. prepares CoreMail's desired state at an epoch that strictly exceeds every epoch sent
//!    before and the one CoreMail applied: the epoch is recorded before it is sent, so a pass
//!    that dies never reuses one, and it is never a setting (nothing from the wire sets it).
//!
//! Then each service with mail addresses moves onto CoreMail in three reversible phases, at most
//! one step per pass (see [`next_step`]): dual-write (its binding and CoreMail environment beside
//! the direct path), inbound cutover (the mail manager points the gateway's forward targets at
//! CoreMail), CoreMail only (the mail manager retires the direct credential and environment, and
//! this manager delivers `SMTP_*` pointing at CoreMail's submission listener). The phase is
//! derived on every read from durable evidence: the service's `coreMail`, whether its CoreMail
//! environment is delivered, and its `mail` record's `targetType` and `retired`, which the mail
//! manager writes once it has acted.
//!
//! The gateway credential's public half goes to the mail manager (which owns the gateway) as the
//! event `coremail.gatewayPeer`, published when it changes.
//!
//! An unchanged pass reads (the settings, the secrets, CoreMail's status) and writes nothing.

use capstan_plugin_smtp::SmtpTls;
use capstan_sdk::events;
use capstan_sdk::http::Request;
use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::now_ms;
use capstan_sdk::secrets::{self, Generate, Owner, SecretInfo};
use capstan_sdk::settings::PortNumber;
use capstan_sdk::store::{self, Doc};
use capstan_sdk::{
    Context, Descriptor, Empty, JsonSchema, Manager, Page, ReconcileOutcome, ReconcileTrigger, Refusal, Result, Role, Value, json, settings,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// The management scope of the control plane's secrets: the system secrets and the CoreMail
/// service's environment.
const SCOPE: &str = "coremail:control";
/// The system id owning the system secrets.
const SYSTEM_ID: &str = "coremail";
const CONTROL_SECRET: &str = "COREMAIL_CONTROL_CREDENTIAL_SECRET";
const GATEWAY_SECRET: &str = "COREMAIL_GATEWAY_CREDENTIAL_SECRET";
const TLS_CERTIFICATE: &str = "COREMAIL_SMTP_TLS_CERTIFICATE_PEM";
const TLS_PRIVATE_KEY: &str = "COREMAIL_SMTP_TLS_PRIVATE_KEY_PEM";
/// The gateway credential's identity (CoreMail presents it to the mail gateway).
const GATEWAY_CREDENTIAL_ID: &str = "coremail-gateway";
/// How long a rotated credential's previous verifier is still accepted.
const OVERLAP_MS: u64 = 15 * 60 * 1000;
/// The control protocol version of docs/coremail-protocol.md.
const PROTOCOL: u64 = 1;
/// The published ceilings of the per-binding quotas: a larger setting is clamped to them.
const MAX_MESSAGES_PER_MINUTE: u32 = 600;
const MAX_MESSAGES_PER_DAY: u32 = 50_000;
const MAX_PENDING_INBOUND: u32 = 10_000;
/// How soon a pass CoreMail failed (or did not answer) is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// How soon a pass its configuration stopped is tried again.
const UNCONFIGURED_RETRY: Duration = Duration::from_secs(15);

const CREDENTIALS: &str = "credentials";
const CONTROL: &str = "control";
const DESIRED_ID: &str = "desired";
const STATUS: &str = "status";
const STATUS_ID: &str = "last-pass";
/// The gateway peer as last published (in [`CONTROL`]).
const PEER_ID: &str = "gateway-peer";
const PEER_EVENT: &str = "coremail.gatewayPeer";

struct CoreMail;

impl Manager for CoreMail {
    fn describe() -> Descriptor {
        Descriptor::new()
            .method(
                "getControlStatus",
                "The control plane: the epoch and digest prepared, what CoreMail reported applying, the last error; {enabled: false} alone when CoreMail is off.",
                Role::Admin,
                get_control_status,
            )
            .read_only()
            .method(
                "getServiceMailStatistics",
                "Per service and UTC day, what CoreMail counted (delivered, acknowledged, rejected, received), as CoreMail reports it now.",
                Role::Admin,
                get_service_mail_statistics,
            )
            .read_only()
            .setting("coreMailEnabled", "The cluster switch: false keeps every service on the mail gateway's direct path", Some(false))
            .setting::<Option<ServiceId>>("coreMailServiceId", "The Capstan service running CoreMail (svc_…)", None)
            .setting::<Option<ControlEndpoint>>(
                "coreMailControlEndpointUrl",
                "CoreMail's control socket, https://host[:port]/path (no trailing slash; http only to loopback)",
                None,
            )
            .setting::<Option<TransferOrigin>>(
                "coreMailTransferOrigin",
                "CoreMail's transfer origin, a bare origin https://host[:port] with no slash (http only to loopback)",
                None,
            )
            .setting::<Option<GatewayEndpoint>>(
                "coreMailGatewayEndpointUrl",
                "The mail gateway's endpoint CoreMail connects to, a bare origin with a trailing slash: wss://host[:port]/ (ws only to loopback)",
                None,
            )
            .setting("coreMailControlCredentialId", "The name CoreMail knows Capstan's control credential by", Some(CredentialName("capstan-control".into())))
            .setting(
                "coreMailControlCredentialVersion",
                "The control credential's version: raise it to rotate the credential (the previous one is accepted 15 more minutes)",
                Some(Version(1)),
            )
            .setting::<Option<Host>>("coreMailSmtpHost", "CoreMail's submission listener the services' SMTP_* point at", None)
            .setting("coreMailSmtpPort", "Its port, 1–65535", Some(PortNumber(587)))
            .setting("coreMailSmtpTlsMode", "How services connect to it: starttls, tls or none", Some(SmtpTls::Starttls))
            .setting(
                "coreMailDefaultMessagesPerMinute",
                &format!("Per binding: messages sent per minute (at most {MAX_MESSAGES_PER_MINUTE}: a larger value is clamped)"),
                Some(Quota(60)),
            )
            .setting(
                "coreMailDefaultMessagesPerDay",
                &format!("Per binding: messages sent per UTC day (at most {MAX_MESSAGES_PER_DAY}: a larger value is clamped)"),
                Some(Quota(2_000)),
            )
            .setting(
                "coreMailDefaultMaxPendingInbound",
                &format!("Per binding: inbound messages held undelivered (at most {MAX_PENDING_INBOUND}: a larger value is clamped)"),
                Some(Quota(1_000)),
            )
            // /p/coremail: the control plane's status and the statistics
            .facet::<CoreMailRecord>(EntityKind::Service, "CoreMail's binding of the service and the step it asks the mail path for")
            .nav("CoreMail", "envelope")
            .page(Page::new("", "CoreMail", "getControlStatus").template("overview"))
            // /p/coremail/statistics: what CoreMail counted, per service and UTC day
            .page(Page::new("statistics", "Mail statistics", "getServiceMailStatistics"))
            .collection(CREDENTIALS)
            .collection(CONTROL)
            .collection(STATUS)
            .subscribe("service.updated")
            .reconcile_every(Duration::from_secs(10))
    }

    // on_event: the default (nothing); a service event's delivery already hints the reconcile
    // loop

    fn reconcile(_ctx: &Context, _trigger: ReconcileTrigger) -> Result<ReconcileOutcome> {
        let outcome = pass();
        record_status(&outcome)?;
        Ok(ReconcileOutcome::of_pass(&outcome, RETRY, UNCONFIGURED_RETRY))
    }
}

capstan_sdk::manager!(CoreMail);

// ---------------------------------------------------------------------------------------------
// Settings

capstan_sdk::shaped_text!(ServiceId, r"^svc_[A-Za-z0-9_\-]{1,64}$", "A Capstan service id (svc_…).");
capstan_sdk::shaped_text!(
    ControlEndpoint,
    r"^(https://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)(:[0-9]{1,5})?|http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?)(/[A-Za-z0-9._~\-]+)+$",
    "A control socket URL: https://host[:port]/path, no trailing slash, no query (http only to 127.0.0.1, localhost or [::1])."
);
capstan_sdk::shaped_text!(
    TransferOrigin,
    r"^(https://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)(:[0-9]{1,5})?|http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?)$",
    "A bare origin: https://host[:port] with no path and no trailing slash (http only to 127.0.0.1, localhost or [::1])."
);
capstan_sdk::shaped_text!(
    GatewayEndpoint,
    r"^(wss://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+)(:[0-9]{1,5})?|ws://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?)/$",
    "A bare origin with a trailing slash: wss://host[:port]/ (ws only to 127.0.0.1, localhost or [::1])."
);
capstan_sdk::shaped_text!(Host, r"^[A-Za-z0-9.\-\[\]:]{1,253}$", "A host name or address.");
capstan_sdk::shaped_text!(CredentialName, r"^[A-Za-z0-9_\-]{1,64}$", "A credential name: 1–64 of A-Z a-z 0-9 _ -.");

/// A quota setting: at least 1.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
struct Quota(u32);

impl JsonSchema for Quota {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quota".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut capstan_sdk::schemars::SchemaGenerator) -> capstan_sdk::schemars::Schema {
        capstan_sdk::schemars::json_schema!({ "type": "integer", "minimum": 1, "maximum": 4_294_967_295u64 })
    }
}

/// A credential version setting: at least 1.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
struct Version(u64);

impl JsonSchema for Version {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Version".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut capstan_sdk::schemars::SchemaGenerator) -> capstan_sdk::schemars::Schema {
        capstan_sdk::schemars::json_schema!({ "type": "integer", "minimum": 1, "maximum": 1_000_000_000u64 })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Settings {
    core_mail_enabled: bool,
    core_mail_service_id: Option<String>,
    core_mail_control_endpoint_url: Option<String>,
    core_mail_transfer_origin: Option<String>,
    core_mail_gateway_endpoint_url: Option<String>,
    core_mail_control_credential_id: String,
    core_mail_control_credential_version: u64,
    core_mail_smtp_host: Option<String>,
    core_mail_smtp_port: u16,
    core_mail_smtp_tls_mode: SmtpTls,
    core_mail_default_messages_per_minute: u32,
    core_mail_default_messages_per_day: u32,
    core_mail_default_max_pending_inbound: u32,
}

/// What an enabled control plane needs, every part present.
#[derive(Debug, Clone)]
struct Config {
    service_id: String,
    control_url: String,
    transfer_origin: String,
    gateway_url: String,
    credential_id: String,
    credential_version: u64,
    smtp: Option<(String, u16, SmtpTls)>,
    quotas: Quotas,
}

/// The per-binding quotas, clamped to the published ceilings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Quotas {
    messages_per_minute: u32,
    messages_per_day: u32,
    max_pending_inbound: u32,
}

fn unconfigured(message: impl Into<String>) -> Refusal {
    Refusal::new("coremail-unconfigured", message)
}

impl Config {
    /// The configuration when CoreMail is on (`None` when off), or `coremail-unconfigured`
    /// naming every setting it lacks.
    fn read() -> Result<Option<Config>> {
        let s: Settings = settings::get()?;
        if !s.core_mail_enabled {
            return Ok(None);
        }
        let missing: Vec<&str> = [
            ("coremail.coreMailServiceId", s.core_mail_service_id.is_none()),
            ("coremail.coreMailControlEndpointUrl", s.core_mail_control_endpoint_url.is_none()),
            ("coremail.coreMailTransferOrigin", s.core_mail_transfer_origin.is_none()),
            ("coremail.coreMailGatewayEndpointUrl", s.core_mail_gateway_endpoint_url.is_none()),
        ]
        .into_iter()
        .filter_map(|(key, absent)| absent.then_some(key))
        .collect();
        if !missing.is_empty() {
            return Err(unconfigured(format!("CoreMail is enabled but these settings are unset: {}", missing.join(", ")))
                .with_data(json!({ "missing": missing })));
        }
        Ok(Some(Config {
            service_id: s.core_mail_service_id.unwrap_or_default(),
            control_url: s.core_mail_control_endpoint_url.unwrap_or_default(),
            transfer_origin: s.core_mail_transfer_origin.unwrap_or_default(),
            gateway_url: s.core_mail_gateway_endpoint_url.unwrap_or_default(),
            credential_id: s.core_mail_control_credential_id,
            credential_version: s.core_mail_control_credential_version,
            smtp: s.core_mail_smtp_host.map(|host| (host, s.core_mail_smtp_port, s.core_mail_smtp_tls_mode)),
            quotas: Quotas {
                messages_per_minute: s.core_mail_default_messages_per_minute.clamp(1, MAX_MESSAGES_PER_MINUTE),
                messages_per_day: s.core_mail_default_messages_per_day.clamp(1, MAX_MESSAGES_PER_DAY),
                max_pending_inbound: s.core_mail_default_max_pending_inbound.clamp(1, MAX_PENDING_INBOUND),
            },
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// Credentials: the secret is a system secret; its public half (a salted verifier) is recorded
// here as it was emitted.

/// A previous credential still accepted until `accept_until` (ms since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Retiring {
    version: u64,
    verifier: String,
    accept_until: u64,
}

/// A credential's public half as emitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Credential {
    credential_id: String,
    version: u64,
    /// The secret version the verifier was computed from.
    secret_version: String,
    verifier: String,
    #[serde(default)]
    retiring: Vec<Retiring>,
}

/// `coremail-v1$<salt>$<hex SHA-256 of salt and secret>`, with a new random salt.
fn verifier(secret: &[u8]) -> String {
    let salt: [u8; 16] = rand::random();
    verifier_with(&salt, secret)
}

fn verifier_with(salt: &[u8], secret: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(salt);
    hash.update(secret);
    format!("coremail-v1${}${}", hex(salt), hex(&hash.finalize()))
}

/// Where a credential's secret lives: its scope, owner and key.
struct SecretAt<'a> {
    scope: &'a str,
    owner: Owner,
    key: &'a str,
}

impl SecretAt<'_> {
    /// A system secret of the control plane.
    fn system(key: &str) -> SecretAt<'_> {
        SecretAt { scope: SCOPE, owner: Owner::System(SYSTEM_ID.into()), key }
    }
}

/// The secret at `at` (minted when absent) and its record `kind` brought in line: a rotated
/// secret (or a `wanted_version` above the recorded one, which rotates it) gets a new version
/// and verifier, the previous one `retiring` for [`OVERLAP_MS`]; a retiring verifier past its
/// deadline goes. Nothing is written when nothing changed. The record and the secret.
fn credential(at: &SecretAt, kind: &str, credential_id: &str, wanted_version: u64) -> Result<(Credential, Vec<u8>)> {
    let (scope, owner, key) = (at.scope, &at.owner, at.key);
    let mut info = secrets::ensure(scope, owner, key, &Generate::base64url(43))?;
    let current = store::get::<Credential>(CREDENTIALS, kind)?;
    if let Some(doc) = &current
        && wanted_version > doc.data.version
        && doc.data.secret_version == info.active_version
    {
        info = secrets::rotate(scope, &info.id)?;
        capstan_sdk::info!("coremail: {key} rotated for version {wanted_version}");
    }
    let secret = secrets::reveal(scope, &info.id)?;
    let now = now_ms();
    let next = match &current {
        None => Credential {
            credential_id: credential_id.into(),
            version: wanted_version,
            secret_version: info.active_version.clone(),
            verifier: verifier(&secret),
            retiring: Vec::new(),
        },
        Some(doc) => {
            let mut next = doc.data.clone();
            if next.credential_id != credential_id {
                // a new identity: nothing of the old one is accepted under it
                next = Credential {
                    credential_id: credential_id.into(),
                    version: wanted_version,
                    secret_version: info.active_version.clone(),
                    verifier: verifier(&secret),
                    retiring: Vec::new(),
                };
            } else if next.secret_version != info.active_version {
                next.retiring.push(Retiring { version: next.version, verifier: next.verifier.clone(), accept_until: now + OVERLAP_MS });
                next.version = wanted_version.max(next.version + 1);
                next.secret_version = info.active_version.clone();
                next.verifier = verifier(&secret);
            }
            next.retiring.retain(|r| r.accept_until > now);
            next
        }
    };
    if current.as_ref().map(|d| &d.data) != Some(&next) {
        store::Batch::new().put(CREDENTIALS, kind, current.map(|d| d.revision), &next).commit()?;
    }
    Ok((next, secret))
}

/// The control bootstrap CoreMail reads from its environment: verifiers only, never a secret.
fn bootstrap(control: &Credential) -> Value {
    let mut verifiers = vec![json!({ "version": control.version, "verifier": control.verifier })];
    verifiers
        .extend(control.retiring.iter().map(|r| json!({ "version": r.version, "verifier": r.verifier, "acceptUntil": r.accept_until })));
    json!({ "protocol": PROTOCOL, "credentialId": control.credential_id, "verifiers": verifiers })
}

/// The operator's TLS material for the submission listener, when both PEMs are there.
fn tls_material() -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    let listed = secrets::list(SCOPE)?;
    let find = |key: &str| -> Option<SecretInfo> {
        listed.iter().find(|s| s.key == key && s.state == "active" && matches!(&s.owner, Owner::System(id) if id == SYSTEM_ID)).cloned()
    };
    match (find(TLS_CERTIFICATE), find(TLS_PRIVATE_KEY)) {
        (Some(certificate), Some(key)) => Ok(Some((secrets::reveal(SCOPE, &certificate.id)?, secrets::reveal(SCOPE, &key.id)?))),
        _ => Ok(None),
    }
}

/// The CoreMail service's environment, each value written only where it differs; the same
/// scope's secrets of any other service (CoreMail moved) revoked.
fn deliver_environment(
    config: &Config,
    control: &Credential,
    gateway: &(Credential, Vec<u8>),
    tls: Option<&(Vec<u8>, Vec<u8>)>,
) -> Result<()> {
    let owner = Owner::Service(config.service_id.clone());
    let mut values: Vec<(&str, Vec<u8>)> = vec![
        ("COREMAIL_CONTROL_BOOTSTRAP", canonical(&bootstrap(control)).into_bytes()),
        ("COREMAIL_GATEWAY_ENDPOINT_URL", config.gateway_url.clone().into_bytes()),
        ("COREMAIL_GATEWAY_CREDENTIAL_ID", GATEWAY_CREDENTIAL_ID.as_bytes().to_vec()),
        ("COREMAIL_GATEWAY_CREDENTIAL_VERSION", gateway.0.version.to_string().into_bytes()),
        (GATEWAY_SECRET, gateway.1.clone()),
        ("COREMAIL_TRANSFER_ORIGIN", config.transfer_origin.clone().into_bytes()),
    ];
    if let Some((certificate, key)) = tls {
        values.push((TLS_CERTIFICATE, certificate.clone()));
        values.push((TLS_PRIVATE_KEY, key.clone()));
    }
    for (key, value) in &values {
        secrets::put(SCOPE, &owner, key, value)?;
    }
    for secret in secrets::list(SCOPE)? {
        let stale = match &secret.owner {
            Owner::Service(id) => *id != config.service_id || (secret.key.contains("_TLS_") && tls.is_none()),
            _ => false,
        };
        if stale && secret.state == "active" {
            secrets::revoke(SCOPE, &secret.id)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Per-service bindings (phase 1, dual-write: CoreMail's binding and environment beside the
// direct path, which stays as it is)

/// The part of a service this manager reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Service {
    #[serde(default)]
    name: String,
    #[serde(default)]
    mail_addresses: Vec<String>,
    /// The managers' records of it: the mail manager's and this one's.
    #[serde(default)]
    facets: Facets,
    state: String,
}

/// The records of a service read here.
#[derive(Debug, Clone, Default, Deserialize)]
struct Facets {
    /// What the mail manager did at the gateway, per address: the evidence of its steps.
    #[serde(default)]
    mail: Option<MailFacet>,
    /// CoreMail's binding of it, as this manager last wrote it.
    #[serde(default)]
    coremail: Option<CoreMailRecord>,
}

impl Service {
    /// The mail manager's record of each address it bound.
    fn mail(&self) -> &[MailEntry] {
        self.facets.mail.as_ref().map_or(&[][..], |f| &f.bindings[..])
    }

    /// CoreMail's binding of it, as this manager last wrote it.
    fn core_mail(&self) -> Option<&CoreMailRecord> {
        self.facets.coremail.as_ref()
    }
}

/// The part of the mail manager's facet of a service (`facets.mail`) read here.
#[derive(Debug, Clone, Default, Deserialize)]
struct MailFacet {
    #[serde(default)]
    bindings: Vec<MailEntry>,
}

/// The part of an entry of the mail manager's record read here.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MailEntry {
    address: String,
    #[serde(default)]
    target_type: String,
    #[serde(default)]
    retired: bool,
}

/// This manager's facet of a service (`facets.coremail`): the binding's id and the step it
/// asks the mail path for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CoreMailRecord {
    /// CoreMail's id of the binding: 1–128 of A-Z a-z 0-9 . _ -.
    #[schemars(regex(pattern = r"^[A-Za-z0-9._-]{1,128}$"))]
    binding_id: String,
    /// The step asked of the mail path.
    want: Phase,
}

/// Where a service's mail stands (or the step asked of it), in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
enum Phase {
    /// The mail gateway's direct path alone.
    Direct,
    /// CoreMail's binding and environment beside the direct path.
    DualWrite,
    /// Inbound mail routed at CoreMail; both environments remain.
    InboundCutover,
    /// The direct path's environment and credential retired.
    CoremailOnly,
}

impl Phase {
    fn lower(self) -> Phase {
        match self {
            Phase::Direct | Phase::DualWrite => Phase::Direct,
            Phase::InboundCutover => Phase::DualWrite,
            Phase::CoremailOnly => Phase::InboundCutover,
        }
    }
}

/// The step to ask of a service standing at `phase` (derived) while `want` is asked: one step
/// up when CoreMail reports its binding `active` and the mail path has taken the step asked
/// (the third also waits for traffic CoreMail reported), one step down from where it stands
/// while the binding is not active, else `want` as it is. Never below dual-write: the direct
/// path alone is CoreMail's withdrawal, not a step.
fn next_step(phase: Phase, want: Phase, active: bool, traffic: bool) -> Phase {
    let next = if !active {
        if phase >= Phase::InboundCutover { phase.lower() } else { want.min(phase) }
    } else if phase == want {
        match phase {
            Phase::Direct | Phase::DualWrite => Phase::InboundCutover,
            Phase::InboundCutover if traffic => Phase::CoremailOnly,
            other => other,
        }
    } else {
        want
    };
    next.max(Phase::DualWrite)
}

/// Every service with the revision read, in id order.
fn services_read() -> Result<Vec<(String, u64, Service)>> {
    Ok(inventory::list_all::<Service>(EntityKind::Service)?.into_iter().map(|e| (e.id, e.revision, e.data)).collect())
}

/// The management scope of a service's CoreMail material: distinct from the direct path's
/// `mail:<serviceId>`, so neither manager can overwrite the other's while both sets coexist.
fn service_scope(service_id: &str) -> String {
    format!("coremail:{service_id}")
}

/// CoreMail's id of a service's binding; its credential goes by the same id.
fn binding_id(service_id: &str) -> String {
    format!("capstan.{service_id}")
}

/// `web@acme.example` → `WEB_ACME_EXAMPLE`: an address as the part of its variables' names.
fn token(address: &str) -> String {
    secrets::key_part(address)
}

/// The record of a service's binding credential in [`CREDENTIALS`].
fn binding_kind(service_id: &str) -> String {
    format!("binding:{service_id}")
}

const BINDING_SECRET: &str = "MAIL_COREMAIL_CREDENTIAL_SECRET";

/// The CoreMail variables of a service, all but the credential's secret: the unscoped group for
/// the default sender (the first address) and a complete scoped group per address, names as
/// @serve.zone/platformclient reads them. (`SMTP_*` and `MAIL_<TOKEN>_SMTP_*` stay the direct
/// path's until the third phase; see docs/coremail.md.)
fn service_values(config: &Config, binding: &Credential, addresses: &[String]) -> Vec<(String, String)> {
    let coremail = |prefix: &str| {
        vec![
            (format!("{prefix}COREMAIL_URL"), config.transfer_origin.clone()),
            (format!("{prefix}COREMAIL_BINDING_ID"), binding.credential_id.clone()),
            (format!("{prefix}COREMAIL_CREDENTIAL_ID"), binding.credential_id.clone()),
            (format!("{prefix}COREMAIL_CREDENTIAL_VERSION"), binding.version.to_string()),
        ]
    };
    let mut values = coremail("MAIL_");
    values.push(("MAIL_FROM".into(), addresses[0].clone()));
    for address in addresses {
        let prefix = format!("MAIL_{}_", token(address));
        values.push((format!("{prefix}FROM"), address.clone()));
        values.extend(coremail(&prefix));
    }
    values
}

/// The `SMTP_*` values pointing at CoreMail's submission listener, with the binding id as the
/// user and its credential's secret as the password (CoreMail only).
fn smtp_values(prefix: &str, smtp: &(String, u16, SmtpTls), user: &str, secret: &[u8]) -> Vec<(String, Vec<u8>)> {
    let (host, port, tls) = smtp;
    [
        ("HOST", host.clone().into_bytes()),
        ("PORT", port.to_string().into_bytes()),
        ("USER", user.as_bytes().to_vec()),
        ("PASSWORD", secret.to_vec()),
        ("TLS", tls.as_str().as_bytes().to_vec()),
    ]
    .into_iter()
    .map(|(field, value)| (format!("{prefix}SMTP_{field}"), value))
    .collect()
}

/// What CoreMail reported on the last pass that reached it (durable: recorded by [`record_coremail`]).
fn last_report() -> Result<Option<CoreMailStatus>> {
    Ok(store::get::<CoreMailStatus>(STATUS, COREMAIL_ID)?.map(|d| d.data))
}

/// Each active service with mail addresses (CoreMail's own excepted) bound: its binding
/// credential (the secret `MAIL_COREMAIL_CREDENTIAL_SECRET`, its verifier kept), its CoreMail
/// environment in `coremail:<serviceId>` (with `SMTP_*` at CoreMail only), then its `coreMail`
/// record with the step asked next (compare-and-swap on the revision read; a service changed
/// since is left to the next pass). Every other service withdrawn. Each value is written only
/// where it differs; what a step down takes away is revoked before the step is asked. The
/// bindings for the desired state.
fn bind_services(config: &Config, client: &Control, read: &[(String, u64, Service)]) -> Result<Vec<Value>> {
    let report = last_report()?;
    let mut traffic: Option<Vec<Day>> = None;
    let mut bindings = Vec::new();
    for (service_id, revision, service) in read {
        let wanted = service.state == "active" && !service.mail_addresses.is_empty() && *service_id != config.service_id;
        if !wanted {
            withdraw(service_id, *revision, service)?;
            continue;
        }
        let scope = service_scope(service_id);
        let owner = Owner::Service(service_id.clone());
        let id = binding_id(service_id);
        let at = SecretAt { scope: &scope, owner: owner.clone(), key: BINDING_SECRET };
        let (credential, secret) = credential(&at, &binding_kind(service_id), &id, 1)?;

        let phase = phase(service_id, service)?;
        let want = service.core_mail().map_or(Phase::DualWrite, |r| r.want);
        let active = report.as_ref().and_then(|r| r.bindings.iter().find(|b| b.binding_id == id)).is_some_and(|b| b.status == "active");
        let needs_traffic = active && phase == Phase::InboundCutover && want == Phase::InboundCutover;
        if needs_traffic && traffic.is_none() {
            traffic = Some(statistics(client)?);
        }
        let carried = traffic.iter().flatten().any(|d| d.binding_id == id && d.delivered + d.acknowledged > 0);
        let next = next_step(phase, want, active, carried);

        let mut values: Vec<(String, Vec<u8>)> =
            service_values(config, &credential, &service.mail_addresses).into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
        values.extend(service.mail_addresses.iter().map(|a| (format!("MAIL_{}_COREMAIL_CREDENTIAL_SECRET", token(a)), secret.clone())));
        // SMTP_* is CoreMail's once the mail manager retired its own (the phase says so)
        if let Some(smtp) = config.smtp.as_ref().filter(|_| phase == Phase::CoremailOnly && next == Phase::CoremailOnly) {
            values.extend(smtp_values("", smtp, &id, &secret));
            for address in &service.mail_addresses {
                values.extend(smtp_values(&format!("MAIL_{}_", token(address)), smtp, &id, &secret));
            }
        }
        for (key, value) in &values {
            secrets::put(&scope, &owner, key, value)?;
        }
        // a removed address's group goes, and SMTP_* when the step is lowered
        for stale in secrets::list(&scope)? {
            let kept = stale.key == BINDING_SECRET || values.iter().any(|(k, _)| *k == stale.key);
            if !kept && stale.state == "active" && matches!(&stale.owner, Owner::Service(id) if id == service_id) {
                secrets::revoke(&scope, &stale.id)?;
            }
        }
        let record = CoreMailRecord { binding_id: id.clone(), want: next };
        if service.core_mail() != Some(&record) {
            if next != want {
                capstan_sdk::info!("coremail: {service_id} at {phase:?}, asking {next:?} (was {want:?})");
            }
            write_record(service_id, *revision, Some(&record))?;
        }
        bindings.push(json!({
            "bindingId": id,
            "serviceId": service_id,
            "addresses": service.mail_addresses,
            "credential": {
                "id": credential.credential_id,
                "version": credential.version,
                "verifier": credential.verifier,
                "retiring": credential.retiring.iter().map(|r| json!({ "version": r.version, "verifier": r.verifier, "acceptUntil": r.accept_until })).collect::<Vec<_>>(),
            },
        }));
    }
    Ok(bindings)
}

/// Write (or with `None` remove) a service's `facets.coremail`, stating the revision read; a
/// service changed or gone since is left to the next pass.
fn write_record(service_id: &str, revision: u64, record: Option<&CoreMailRecord>) -> Result<()> {
    let written = match record {
        Some(record) => inventory::set_facet::<Value>(EntityKind::Service, service_id, record, Some(revision)),
        None => inventory::clear_facet::<Value>(EntityKind::Service, service_id, Some(revision)),
    };
    match written {
        Ok(_) => Ok(()),
        Err(r) if r.is("conflict") || r.is("service-deleting") || r.is("service-not-found") => Ok(()),
        Err(r) => Err(r),
    }
}

/// A service back on the direct path alone: its CoreMail material revoked, its `coreMail`
/// removed, its binding credential's record dropped. Nothing is written for a service that has
/// none of them. Whether there was anything.
fn withdraw(service_id: &str, revision: u64, service: &Service) -> Result<bool> {
    let scope = service_scope(service_id);
    let mut any = false;
    for secret in secrets::list(&scope)? {
        if secret.state == "active" {
            match secrets::revoke(&scope, &secret.id) {
                // a service being deleted has every secret revoked by its deletion
                Err(r) if r.is("service-deleting") => {}
                other => drop(other?),
            }
            any = true;
        }
    }
    if service.core_mail().is_some() && service.state == "active" {
        write_record(service_id, revision, None)?;
        any = true;
    }
    if let Some(doc) = store::get::<Credential>(CREDENTIALS, &binding_kind(service_id))? {
        store::Batch::new().delete(CREDENTIALS, &doc.id, doc.revision).commit()?;
        any = true;
    }
    Ok(any)
}

/// CoreMail switched off: every service that has anything of CoreMail withdrawn in this pass.
/// How many.
fn withdraw_all() -> Result<usize> {
    let mut returned = 0;
    for (service_id, revision, service) in services_read()? {
        if withdraw(&service_id, revision, &service)? {
            returned += 1;
        }
    }
    Ok(returned)
}

/// Where a service stands, derived from durable evidence only, never from memory: its
/// `coreMail` record, whether its CoreMail environment is delivered, and what the mail manager
/// recorded of each address (its forward target's `targetType`, its direct credential
/// `retired`), which it writes only once it has acted.
fn phase(service_id: &str, service: &Service) -> Result<Phase> {
    if service.core_mail().is_none() {
        return Ok(Phase::Direct);
    }
    let delivered = secrets::list(&service_scope(service_id))?.iter().any(|s| s.key == "MAIL_COREMAIL_BINDING_ID" && s.state == "active");
    if !delivered {
        return Ok(Phase::Direct);
    }
    let entries: Vec<&MailEntry> = service.mail_addresses.iter().filter_map(|a| service.mail().iter().find(|e| &e.address == a)).collect();
    if entries.len() < service.mail_addresses.len() || entries.iter().any(|e| e.target_type != "coremail") {
        return Ok(Phase::DualWrite);
    }
    Ok(if entries.iter().all(|e| e.retired) { Phase::CoremailOnly } else { Phase::InboundCutover })
}

/// The gateway credential's public half published for the mail manager, which registers it at
/// the gateway as CoreMail's peer (`withdrawn` once CoreMail is off); published only when it
/// differs from what was published last.
fn publish_peer(gateway: Option<&Credential>) -> Result<()> {
    let peer = match gateway {
        Some(g) => {
            let mut verifiers = vec![json!({ "version": g.version, "verifier": g.verifier })];
            verifiers
                .extend(g.retiring.iter().map(|r| json!({ "version": r.version, "verifier": r.verifier, "acceptUntil": r.accept_until })));
            json!({ "peerId": GATEWAY_CREDENTIAL_ID, "verifiers": verifiers, "withdrawn": false })
        }
        None => json!({ "peerId": GATEWAY_CREDENTIAL_ID, "verifiers": [], "withdrawn": true }),
    };
    let published = store::get::<Value>(CONTROL, PEER_ID)?;
    let unchanged = match &published {
        Some(doc) => doc.data == peer,
        // nothing was ever published: nothing to withdraw
        None => gateway.is_none(),
    };
    if !unchanged {
        events::publish(PEER_EVENT, "gateway-peer", &peer)?;
        store::Batch::new().put(CONTROL, PEER_ID, published.map(|d| d.revision), &peer).commit()?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The desired state and the control socket

/// CoreMail's desired state, without its epoch (the digest is taken over this).
fn desired_state(config: &Config, control: &Credential, gateway: &Credential, tls_provisioned: bool, bindings: &[Value]) -> Value {
    let submission = config
        .smtp
        .as_ref()
        .map(|(host, port, tls)| json!({ "host": host, "port": port, "tlsMode": tls.as_str(), "tlsProvisioned": tls_provisioned }));
    json!({
        "protocol": PROTOCOL,
        "controlCredential": { "id": control.credential_id, "version": control.version },
        "gateway": { "endpointUrl": config.gateway_url, "credentialId": GATEWAY_CREDENTIAL_ID, "credentialVersion": gateway.version },
        "transferOrigin": config.transfer_origin,
        "submission": submission,
        "quotas": config.quotas,
        "bindings": bindings,
    })
}

/// `value` with its keys sorted and no whitespace: what a digest is taken over (the same bytes
/// whichever order a map kept its keys in).
fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn digest(desired: &Value) -> String {
    format!("sha256:{}", hex(&Sha256::digest(canonical(desired).as_bytes())))
}

/// What was last prepared: recorded before it is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Prepared {
    epoch: u64,
    digest: String,
}

/// CoreMail's status answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct CoreMailStatus {
    applied_epoch: u64,
    digest: Option<String>,
    /// `waiting` (nothing applied yet), `applied` or `failed`.
    state: String,
    last_error: Option<Value>,
    /// What CoreMail's own reconciliation made of each binding it was given.
    #[serde(default)]
    bindings: Vec<BindingStatus>,
}

/// A binding as CoreMail reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct BindingStatus {
    binding_id: String,
    /// `pending`, `active` or `failed`.
    status: String,
}

/// The control socket, authenticated with the control credential.
struct Control {
    url: String,
    authorization: String,
}

impl Control {
    fn new(config: &Config, control: &Credential, secret: &[u8]) -> Control {
        let secret = String::from_utf8_lossy(secret);
        Control { url: config.control_url.clone(), authorization: format!("Bearer {}:{}:{secret}", control.credential_id, control.version) }
    }

    /// One request: the status and the JSON answer. No answer, a 5xx or a body that is not JSON
    /// is `coremail-unreachable` (retryable); a refused credential `coremail-credential-refused`.
    fn call(&self, method: &str, op: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let mut request = Request::new(method, &format!("{}/{op}", self.url)).header("authorization", &self.authorization);
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(canonical(body).into_bytes());
        }
        let unreachable =
            |why: String| Refusal::new("coremail-unreachable", format!("CoreMail did not answer {method} {op}: {why}")).retryable();
        let response = match request.timeout(Duration::from_secs(10)).send() {
            Ok(r) => r,
            Err(r) if ["http-failed", "http-timeout"].contains(&r.code()) => return Err(unreachable(r.message().to_string())),
            Err(r) => return Err(r),
        };
        if response.status >= 500 {
            return Err(unreachable(format!("HTTP {}", response.status)));
        }
        let value: Value = if response.body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&response.body)
                .map_err(|_| unreachable(format!("HTTP {} with a body that is not JSON", response.status)))?
        };
        if response.status == 401 || response.status == 403 {
            let code = value["error"]["code"].as_str().unwrap_or("unauthorized").to_string();
            // retryable: CoreMail reads a new bootstrap when its environment is delivered again
            return Err(Refusal::new(
                "coremail-credential-refused",
                format!("CoreMail refused the control credential ({code}): its COREMAIL_CONTROL_BOOTSTRAP may not be delivered yet"),
            )
            .retryable());
        }
        Ok((response.status, value))
    }

    fn status(&self) -> Result<CoreMailStatus> {
        let (status, value) = self.call("GET", "status", None)?;
        if status != 200 || value["protocol"].as_u64() != Some(PROTOCOL) {
            return Err(Refusal::new(
                "coremail-protocol-unsupported",
                format!("CoreMail's status answer (HTTP {status}) is not protocol {PROTOCOL} of docs/coremail-protocol.md"),
            ));
        }
        serde_json::from_value(value).map_err(|e| Refusal::new("coremail-answer-invalid", format!("CoreMail's status answer: {e}")))
    }
}

/// Bring CoreMail to `desired`: nothing when it applied exactly this digest at the epoch
/// recorded; the same epoch again when it has not applied it yet; else a new epoch above every
/// one recorded and the one CoreMail applied, recorded first. The summary, and whether it sent.
fn prepare(control: &Control, status: &CoreMailStatus, desired: &Value) -> Result<(String, bool)> {
    let digest = digest(desired);
    let recorded = store::get::<Prepared>(CONTROL, DESIRED_ID)?;
    let epoch = match &recorded {
        Some(doc) if doc.data.digest == digest && status.applied_epoch == doc.data.epoch && status.digest.as_deref() == Some(&digest) => {
            return Ok((at_epoch(doc.data.epoch), false));
        }
        Some(doc) if doc.data.digest == digest && status.applied_epoch < doc.data.epoch => doc.data.epoch,
        _ => {
            let epoch = recorded.as_ref().map_or(0, |d| d.data.epoch).max(status.applied_epoch) + 1;
            let next = Prepared { epoch, digest: digest.clone() };
            store::Batch::new().put(CONTROL, DESIRED_ID, recorded.map(|d| d.revision), &next).commit()?;
            epoch
        }
    };
    let (code, answer) = control.call("POST", "prepare", Some(&json!({ "epoch": epoch, "digest": digest, "desired": desired })))?;
    match code {
        200 => {
            capstan_sdk::info!("coremail: desired state prepared at epoch {epoch} ({digest})");
            Ok((at_epoch(epoch), true))
        }
        409 => Err(Refusal::new(
            "coremail-epoch-refused",
            format!(
                "CoreMail refused epoch {epoch}: it applied {} already; the next pass prepares a later one",
                answer["error"]["appliedEpoch"].as_u64().unwrap_or_default()
            ),
        )
        .retryable()),
        _ => Err(Refusal::new(
            "coremail-prepare-refused",
            format!("CoreMail refused the desired state (HTTP {code} {})", answer["error"]["code"].as_str().unwrap_or("unknown")),
        )
        .with_data(json!({ "status": code, "coreMailCode": answer["error"]["code"] }))),
    }
}

/// A pass's summary once CoreMail took `epoch`: the same whether this pass sent it or found it
/// applied, so the pass after a preparation has nothing to record.
fn at_epoch(epoch: u64) -> String {
    format!("CoreMail's desired state is epoch {epoch}")
}

/// One pass: what it did, or why it stopped.
fn pass() -> Result<String> {
    let Some(config) = Config::read()? else {
        // off: every service back on the direct path at once, then the peer withdrawn
        let returned = withdraw_all()?;
        publish_peer(None)?;
        return Ok(if returned == 0 {
            "CoreMail is off".into()
        } else {
            format!("CoreMail is off: {returned} services returned to the direct path")
        });
    };
    if inventory::get::<Value>(EntityKind::Service, &config.service_id)?.is_none() {
        return Err(Refusal::new(
            "coremail-service-not-found",
            format!("coremail.coreMailServiceId names {}, which is no service", config.service_id),
        ));
    }
    let (control, control_secret) =
        credential(&SecretAt::system(CONTROL_SECRET), "control", &config.credential_id, config.credential_version)?;
    let gateway = credential(&SecretAt::system(GATEWAY_SECRET), "gateway", GATEWAY_CREDENTIAL_ID, 1)?;
    let tls = tls_material()?;
    deliver_environment(&config, &control, &gateway, tls.as_ref())?;
    publish_peer(Some(&gateway.0))?;
    let client = Control::new(&config, &control, &control_secret);
    let read = services_read()?;
    let bindings = bind_services(&config, &client, &read)?;
    let desired = desired_state(&config, &control, &gateway.0, tls.is_some(), &bindings);
    let status = client.status()?;
    let (done, sent) = prepare(&client, &status, &desired)?;
    // what CoreMail reports after taking a new desired state, rather than before it
    record_coremail(&if sent { client.status()? } else { status })?;
    Ok(done)
}

// ---------------------------------------------------------------------------------------------
// Status

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct PassError {
    code: String,
    message: String,
}

/// What the last pass found, rewritten only when that changes (an unchanged pass writes
/// nothing); `since` is when it last changed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct PassStatus {
    summary: String,
    error: Option<PassError>,
    since: u64,
}

const COREMAIL_ID: &str = "coremail-reported";

fn record_status(outcome: &Result<String>) -> Result<()> {
    let (summary, error) = match outcome {
        Ok(summary) => (summary.clone(), None),
        Err(r) => (format!("{}: {}", r.code(), r.message()), Some(PassError { code: r.code().into(), message: r.message().into() })),
    };
    let current = store::get::<PassStatus>(STATUS, STATUS_ID)?;
    if current.as_ref().is_some_and(|d| d.data.summary == summary && d.data.error == error) {
        return Ok(());
    }
    let status = PassStatus { summary, error, since: now_ms() };
    store::Batch::new().put(STATUS, STATUS_ID, current.map(|d| d.revision), &status).commit()?;
    Ok(())
}

/// What CoreMail last reported, where it changed.
fn record_coremail(status: &CoreMailStatus) -> Result<()> {
    let current = store::get::<CoreMailStatus>(STATUS, COREMAIL_ID)?;
    if current.as_ref().map(|d| &d.data) != Some(status) {
        store::Batch::new().put(STATUS, COREMAIL_ID, current.map(|d| d.revision), status).commit()?;
    }
    Ok(())
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct CredentialView {
    credential_id: String,
    version: u64,
    /// The salted verifier emitted for it (public: what CoreMail or the gateway checks with).
    verifier: String,
    /// Previous versions still accepted, with their deadline.
    retiring: Vec<RetiringView>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct RetiringView {
    version: u64,
    accept_until: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ControlStatus {
    enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_id: Option<String>,
    /// The epoch last prepared (recorded before it was sent).
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
    /// What CoreMail reported on the last pass that reached it.
    #[serde(skip_serializing_if = "Option::is_none")]
    core_mail: Option<CoreMailStatus>,
    /// Why the last pass stopped, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<PassError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_pass: Option<PassStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    control_credential: Option<CredentialView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway_credential: Option<CredentialView>,
    /// The CoreMail service's `COREMAIL_CONTROL_BOOTSTRAP` (verifiers only: public), for a
    /// CoreMail whose environment is not delivered by Capstan's agents.
    #[serde(skip_serializing_if = "Option::is_none")]
    bootstrap: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quotas: Option<Quotas>,
    /// Every service with mail addresses: its binding and phase (derived from durable evidence
    /// on every read) and what CoreMail reports of the binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    services: Option<Vec<ServicePhase>>,
    /// The store revision of the prepared record: it moves only when something is prepared.
    #[serde(skip_serializing_if = "Option::is_none")]
    prepared_revision: Option<u64>,
}

/// A service's place on the way to CoreMail.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ServicePhase {
    service_id: String,
    service_name: String,
    addresses: Vec<String>,
    binding_id: Option<String>,
    /// Where it stands, derived from durable evidence.
    phase: Phase,
    /// The step asked of its mail path (ahead of `phase` while the mail manager takes it).
    want: Option<Phase>,
    /// What CoreMail last reported of the binding (`pending`, `active`, `failed`), if anything.
    core_mail_status: Option<String>,
}

fn service_phases(reported: Option<&CoreMailStatus>) -> Result<Vec<ServicePhase>> {
    let mut out = Vec::new();
    for (service_id, _, service) in services_read()? {
        if service.mail_addresses.is_empty() && service.core_mail().is_none() {
            continue;
        }
        let binding_id = service.core_mail().map(|r| r.binding_id.clone());
        let core_mail_status = binding_id
            .as_ref()
            .and_then(|id| reported.and_then(|r| r.bindings.iter().find(|b| &b.binding_id == id)).map(|b| b.status.clone()));
        out.push(ServicePhase {
            phase: phase(&service_id, &service)?,
            want: service.core_mail().map(|r| r.want),
            service_name: service.name,
            service_id,
            addresses: service.mail_addresses,
            binding_id,
            core_mail_status,
        });
    }
    Ok(out)
}

fn credential_view(kind: &str) -> Result<Option<CredentialView>> {
    Ok(store::get::<Credential>(CREDENTIALS, kind)?.map(|d| CredentialView {
        credential_id: d.data.credential_id,
        version: d.data.version,
        verifier: d.data.verifier,
        retiring: d.data.retiring.iter().map(|r| RetiringView { version: r.version, accept_until: r.accept_until }).collect(),
    }))
}

fn get_control_status(_ctx: &Context, _input: Empty) -> Result<ControlStatus> {
    let s: Settings = settings::get()?;
    if !s.core_mail_enabled || s.core_mail_service_id.is_none() {
        return Ok(ControlStatus {
            enabled: false,
            service_id: None,
            epoch: None,
            digest: None,
            core_mail: None,
            last_error: None,
            last_pass: None,
            control_credential: None,
            gateway_credential: None,
            bootstrap: None,
            quotas: None,
            services: None,
            prepared_revision: None,
        });
    }
    let prepared: Option<Doc<Prepared>> = store::get(CONTROL, DESIRED_ID)?;
    let core_mail = store::get::<CoreMailStatus>(STATUS, COREMAIL_ID)?.map(|d| d.data);
    let last_pass = store::get::<PassStatus>(STATUS, STATUS_ID)?.map(|d| d.data);
    let quotas = Config::read().ok().flatten().map(|c| c.quotas);
    Ok(ControlStatus {
        enabled: true,
        service_id: s.core_mail_service_id,
        epoch: prepared.as_ref().map(|d| d.data.epoch),
        digest: prepared.as_ref().map(|d| d.data.digest.clone()),
        core_mail: core_mail.clone(),
        last_error: last_pass.as_ref().and_then(|p| p.error.clone()),
        last_pass,
        control_credential: credential_view("control")?,
        gateway_credential: credential_view("gateway")?,
        bootstrap: store::get::<Credential>(CREDENTIALS, "control")?.map(|d| canonical(&bootstrap(&d.data))),
        quotas,
        services: Some(service_phases(core_mail.as_ref())?),
        prepared_revision: prepared.map(|d| d.revision),
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StatisticsInput {
    /// Only this service's days.
    #[serde(default)]
    service_id: Option<String>,
}

/// One service's counters of one UTC day.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Day {
    /// The service the binding is of (`null`: a binding CoreMail knows of no service for).
    service_id: Option<String>,
    binding_id: String,
    /// `YYYY-MM-DD`, UTC.
    day: String,
    #[serde(default)]
    delivered: u64,
    #[serde(default)]
    acknowledged: u64,
    #[serde(default)]
    rejected: u64,
    #[serde(default)]
    received: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Statistics {
    days: Vec<Day>,
}

fn get_service_mail_statistics(_ctx: &Context, input: StatisticsInput) -> Result<Statistics> {
    let Some(config) = Config::read()? else {
        return Err(Refusal::new("coremail-disabled", "CoreMail is off (coremail.coreMailEnabled is false): it has no statistics")
            .with_data(json!({ "setting": "coremail.coreMailEnabled" })));
    };
    let Some(control) = store::get::<Credential>(CREDENTIALS, "control")? else {
        return Err(Refusal::new("coremail-not-ready", "no control credential yet: the first reconcile pass mints it").retryable());
    };
    let secret = secrets::list(SCOPE)?
        .into_iter()
        .find(|s| s.key == CONTROL_SECRET && s.state == "active")
        .ok_or_else(|| Refusal::new("coremail-not-ready", "the control credential's secret is not there").retryable())?;
    let client = Control::new(&config, &control.data, &secrets::reveal(SCOPE, &secret.id)?);
    let mut days = statistics(&client)?;
    if let Some(wanted) = &input.service_id {
        days.retain(|d| d.service_id.as_ref() == Some(wanted));
    }
    days.sort_by(|a, b| (&a.service_id, &a.day, &a.binding_id).cmp(&(&b.service_id, &b.day, &b.binding_id)));
    Ok(Statistics { days })
}

/// CoreMail's per-service, per-UTC-day counters.
fn statistics(client: &Control) -> Result<Vec<Day>> {
    let (status, answer) = client.call("GET", "statistics", None)?;
    if status != 200 {
        return Err(Refusal::new("coremail-statistics-refused", format!("CoreMail answered HTTP {status} for its statistics")));
    }
    serde_json::from_value(answer["days"].clone())
        .map_err(|e| Refusal::new("coremail-answer-invalid", format!("CoreMail's statistics answer: {e}")))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verifier_is_salted_and_checks_the_secret() {
        let (a, b) = (verifier(b"s3cret"), verifier(b"s3cret"));
        assert_ne!(a, b, "a new salt every time: the emitted verifier has to be kept");
        let salt = [7u8; 16];
        let v = verifier_with(&salt, b"s3cret");
        let hash = {
            let mut h = Sha256::new();
            h.update(salt);
            h.update(b"s3cret");
            hex(&h.finalize())
        };
        assert_eq!(v, format!("coremail-v1${}${hash}", "07".repeat(16)));
    }

    #[test]
    fn the_canonical_form_sorts_keys_at_every_depth() {
        let value = json!({ "b": 1, "a": { "d": [ { "z": 1, "y": "é/\n" } ], "c": null } });
        assert_eq!(canonical(&value), r#"{"a":{"c":null,"d":[{"y":"é/\n","z":1}]},"b":1}"#);
        assert_eq!(digest(&value), digest(&json!({ "a": { "c": null, "d": [ { "y": "é/\n", "z": 1 } ] }, "b": 1 })));
    }

    fn matches(pattern: &str, text: &str) -> bool {
        jsonschema::is_valid(&json!({ "type": "string", "pattern": pattern }), &json!(text))
    }

    fn pattern_of<T: JsonSchema>() -> String {
        let schema = capstan_sdk::schemars::schema_for!(T);
        schema.as_value()["pattern"].as_str().unwrap().to_string()
    }

    #[test]
    fn the_url_shapes_are_told_apart() {
        let control = pattern_of::<ControlEndpoint>();
        let origin = pattern_of::<TransferOrigin>();
        let gateway = pattern_of::<GatewayEndpoint>();
        for good in ["https://coremail.example/socket", "https://cm.example:8443/control/socket", "http://127.0.0.1:4100/socket"] {
            assert!(matches(&control, good), "{good}");
        }
        for bad in [
            "https://coremail.example",
            "https://coremail.example/",
            "https://coremail.example/socket/",
            "http://coremail.example/socket",
            "https://x/socket?a=1",
        ] {
            assert!(!matches(&control, bad), "{bad}");
        }
        for good in ["https://transfer.example", "https://transfer.example:8443", "http://localhost:9000"] {
            assert!(matches(&origin, good), "{good}");
        }
        for bad in ["https://transfer.example/", "https://transfer.example/x", "http://transfer.example", "ftp://x"] {
            assert!(!matches(&origin, bad), "{bad}");
        }
        for good in ["wss://gateway.example/", "wss://gateway.example:443/", "ws://127.0.0.1:7000/"] {
            assert!(matches(&gateway, good), "{good}");
        }
        for bad in ["wss://gateway.example", "wss://gateway.example/peer", "https://gateway.example/", "ws://gateway.example/"] {
            assert!(!matches(&gateway, bad), "{bad}");
        }
    }

    #[test]
    fn a_service_moves_one_step_at_a_time_and_walks_back_while_its_binding_is_not_active() {
        use Phase::*;
        // forward: only once the mail path took the step asked, and the third after traffic
        assert_eq!(next_step(DualWrite, DualWrite, true, false), InboundCutover);
        assert_eq!(next_step(DualWrite, InboundCutover, true, false), InboundCutover, "waits for the mail manager");
        assert_eq!(next_step(InboundCutover, InboundCutover, true, false), InboundCutover, "waits for traffic");
        assert_eq!(next_step(InboundCutover, InboundCutover, true, true), CoremailOnly);
        assert_eq!(next_step(CoremailOnly, CoremailOnly, true, true), CoremailOnly);
        // a first pass asks dual-write, whatever CoreMail says
        assert_eq!(next_step(Direct, DualWrite, false, false), DualWrite);
        assert_eq!(next_step(Direct, DualWrite, true, false), DualWrite, "the environment is delivered first");
        // back: one phase below where it stands, never below dual-write
        assert_eq!(next_step(CoremailOnly, CoremailOnly, false, true), InboundCutover);
        assert_eq!(next_step(InboundCutover, InboundCutover, false, true), DualWrite);
        assert_eq!(next_step(InboundCutover, CoremailOnly, false, true), DualWrite);
        assert_eq!(next_step(DualWrite, InboundCutover, false, false), DualWrite, "a step not taken yet is taken back");
        assert_eq!(next_step(DualWrite, DualWrite, false, false), DualWrite);
    }

    #[test]
    fn the_bootstrap_carries_verifiers_only() {
        let control = Credential {
            credential_id: "capstan-control".into(),
            version: 2,
            secret_version: "v2".into(),
            verifier: "coremail-v1$aa$bb".into(),
            retiring: vec![Retiring { version: 1, verifier: "coremail-v1$cc$dd".into(), accept_until: 42 }],
        };
        assert_eq!(
            bootstrap(&control),
            json!({ "protocol": 1, "credentialId": "capstan-control", "verifiers": [
                { "version": 2, "verifier": "coremail-v1$aa$bb" },
                { "version": 1, "verifier": "coremail-v1$cc$dd", "acceptUntil": 42 },
            ] })
        );
    }
}
