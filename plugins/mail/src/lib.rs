//! The mail manager: a service's mail addresses bound at the mail gateway (docs/mail.md, the
//! protocol in docs/gateway-protocol.md), reached through the host's `gateway` import under
//! Capstan's enrolled client credential, which the manager never sees (`capstan gateway
//! bootstrap`; not enrolled: `gateway-unconfigured`).
//!
//! Per address of a service's `mailAddresses`, the reconcile loop makes the gateway hold an
//! SMTP credential allowed to send as that address (outbound) and, when the service publishes
//! an SMTP port, a forward target relaying the address's inbound mail to it. The password the
//! gateway issues once becomes the service's secrets `MAIL_<TOKEN>_SMTP_HOST/PORT/USER/PASSWORD/TLS`
//! (scope `mail:<serviceId>`), and the default sender's (the first bound address) also
//! `SMTP_*`, so the service's resolved manifest carries them. Only public metadata (username,
//! credential version, forward target) is kept — here, and on the service record as its `mail`,
//! written with the revision read at the start of the pass — never a password.
//!
//! Order and durability: a binding is recorded (`pending`) before the gateway is asked for
//! anything, and removed only after the gateway forgot it, so a pass that dies anywhere leaves a
//! record the next pass finishes from and nothing at the gateway that Capstan does not know of.
//! Removals go first (an address removed, the service deleting): forward target, credential,
//! then the secrets. The plugin holds a service while it has bindings, so a deleting service
//! waits until the gateway holds nothing of it. A gateway that does not answer stops the pass
//! with everything as it was (`gateway-unreachable`) and the pass is retried soon.
//!
//! CoreMail (docs/coremail.md): the CoreMail manager asks a service's mail path for a step in
//! the service's `coreMail.want`, and this manager, which owns the gateway, takes it: from
//! `inbound-cutover` on, each address's forward target names the gateway's CoreMail peer
//! (`targetType: coremail`) instead of the service's port; at `coremail-only` the address's
//! gateway credential is deleted and its `MAIL_<TOKEN>_SMTP_*` and `SMTP_*` revoked (the binding
//! stays, `retired`, so a lower step issues it again). The CoreMail peer itself — its id and the
//! verifiers of the credential CoreMail connects with — arrives as the event
//! `coremail.gatewayPeer` and is registered at the gateway before any target names it.

use capstan_plugin_smtp::SmtpTls;
use capstan_sdk::gateway;
use capstan_sdk::inventory::{self, EntityKind};
use capstan_sdk::now_ms;
use capstan_sdk::runtime;
use capstan_sdk::secrets::{self, Owner};
use capstan_sdk::settings::PortNumber;
use capstan_sdk::store::{self, Doc};
use capstan_sdk::{
    CollectionSpec, Context, Descriptor, Empty, Event, JsonSchema, Manager, Page, ReconcileOutcome, ReconcileTrigger, Refusal, Result,
    Role, Value, json, settings,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const BINDINGS: &str = "bindings";
/// Per service: which address its `SMTP_*` group was last written for.
const SENDERS: &str = "senders";
/// The CoreMail peer as the CoreMail manager last published it (one document, [`PEER_ID`]).
const PEERS: &str = "peers";
const PEER_ID: &str = "coremail";
/// The event the CoreMail manager publishes its gateway peer with.
const PEER_EVENT: &str = "coremail.gatewayPeer";
/// The one document holding what the last pass found.
const STATUS: &str = "status";
const STATUS_ID: &str = "last-pass";
/// The protocol version of docs/gateway-protocol.md this manager speaks.
const PROTOCOL: u64 = 1;
/// How soon a pass the gateway failed is tried again.
const RETRY: Duration = Duration::from_secs(5);
/// How soon a pass its configuration stopped is tried again.
const UNCONFIGURED_RETRY: Duration = Duration::from_secs(15);
/// The container ports a service receives SMTP on; the first one it publishes is the target.
const SMTP_PORTS: [u16; 2] = [25, 2525];
/// The most alternates a forward target carries (docs/gateway-protocol.md).
const MAX_ALTERNATES: usize = 16;

struct Mail;

impl Manager for Mail {
    fn describe() -> Descriptor {
        Descriptor::new()
            .method(
                "listServiceTargets",
                "Every service with mail addresses: each address's state, SMTP username and inbound forward target.",
                Role::Admin,
                list_service_targets,
            )
            .read_only()
            .method("getServiceMail", "One service's mail addresses with their state.", Role::Member, get_service_mail)
            .read_only()
            .method(
                "checkServiceMail",
                "Check that the SMTP password the service holds is the one the gateway accepts (by the gateway's verifier).",
                Role::Owner,
                check_service_mail,
            )
            .read_only()
            .setting::<Option<Host>>("submissionHost", "The host services submit mail to (the gateway's SMTP submission listener)", None)
            .setting("submissionPort", "The port of the submission listener, 1–65535", Some(PortNumber(587)))
            .setting("submissionTls", "How services connect to it: starttls, tls or none", Some(SmtpTls::Starttls))
            .setting::<Option<Host>>(
                "forwardTargetHost",
                "The host the gateway forwards a service's inbound mail to (where its published SMTP port answers); null: no inbound",
                None,
            )
            .facet::<MailFacet>(
                EntityKind::Service,
                "The addresses bound at the mail gateway: SMTP usernames and inbound targets, never a password",
            )
            .panel(EntityKind::Service, "Mail", "service-panel")
            .nav("Mail", "envelope")
            // /p/mail: every service's addresses, the gateway's state
            .page(Page::new("", "Mail", "listServiceTargets").template("overview"))
            .collection(CollectionSpec::new(BINDINGS).index("by_service", &["serviceId"]).index("by_org", &["organizationId"]))
            .collection(SENDERS)
            .collection(PEERS)
            .collection(STATUS)
            .subscribe(PEER_EVENT)
            .subscribe("service.created")
            .subscribe("service.updated")
            .subscribe("service.deleting")
            .reconcile_every(Duration::from_secs(60))
    }

    /// The CoreMail peer kept as published (the newest wins: events of one subject arrive in
    /// order); a service event needs nothing here, its delivery already hints the reconcile loop.
    fn on_event(_ctx: &Context, event: Event) -> Result<()> {
        if event.kind != PEER_EVENT {
            return Ok(());
        }
        let peer: Peer = serde_json::from_value(event.data)
            .map_err(|e| Refusal::new("peer-event-invalid", format!("the {PEER_EVENT} event is not a peer: {e}")))?;
        let current = store::get::<Peer>(PEERS, PEER_ID)?;
        if current.as_ref().map(|d| &d.data) != Some(&peer) {
            store::Batch::new().put(PEERS, PEER_ID, current.map(|d| d.revision), &peer).commit()?;
        }
        Ok(())
    }

    fn reconcile(_ctx: &Context, _trigger: ReconcileTrigger) -> Result<ReconcileOutcome> {
        let outcome = pass();
        record_status(&outcome)?;
        Ok(ReconcileOutcome::of_pass(&outcome, RETRY, UNCONFIGURED_RETRY))
    }
}

capstan_sdk::manager!(Mail);

// ---------------------------------------------------------------------------------------------
// Records

/// Where a binding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
enum State {
    /// Recorded; the gateway is being asked (or will be, on the next pass).
    Pending,
    /// The gateway holds the credential (and target); the service holds the secrets.
    Active,
    /// The address cannot be bound as things are (`reason` says why); retried every pass.
    Blocked,
    /// Being withdrawn from the gateway; the record goes once the gateway forgot it.
    Removing,
    /// CoreMail only: the gateway holds no credential of it and the service no direct-path
    /// secrets; its inbound goes to CoreMail. A lower step issues the credential again.
    Retired,
}

/// Where the gateway forwards an address's inbound mail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
enum TargetType {
    /// To the service's published SMTP port (`inbound`).
    #[default]
    Direct,
    /// To the gateway's CoreMail peer.
    Coremail,
}

/// The gateway peer CoreMail connects as, as the CoreMail manager publishes it: public halves
/// only. `withdrawn` when CoreMail is off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Peer {
    #[serde(default)]
    peer_id: Option<String>,
    #[serde(default)]
    verifiers: Vec<Value>,
    #[serde(default)]
    withdrawn: bool,
}

/// Where the gateway forwards an address's inbound mail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Inbound {
    /// A host name or address.
    #[schemars(length(min = 1, max = 253))]
    host: String,
    /// The service's published port it reaches.
    port: u16,
    /// Where the gateway relays in order when `host` does not take the mail: the other nodes
    /// with a ready replica (none for a gateway that does not advertise alternates). Absent in
    /// records written before there were alternates.
    #[serde(default)]
    #[schemars(length(max = 16))]
    alternates: Vec<Alternate>,
}

/// One more place a forward target's mail may go (docs/gateway-protocol.md, "Inbound forwarding").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Alternate {
    #[schemars(length(min = 1, max = 253))]
    host: String,
    port: u16,
}

/// One address of one service at the gateway. Public metadata only.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Binding {
    service_id: String,
    organization_id: String,
    address: String,
    /// The address as a variable-name part: `web@acme.example` → `WEB_ACME_EXAMPLE`.
    token: String,
    /// The gateway's id of its credential and forward target: `capstan.<serviceId>.<token>`.
    gateway_id: String,
    state: State,
    /// The SMTP username, once the gateway issued the credential.
    #[serde(default)]
    username: Option<String>,
    /// The credential version whose password the service's secrets hold.
    #[serde(default)]
    credential_version: Option<u64>,
    /// The direct forward target the gateway holds, if any.
    #[serde(default)]
    inbound: Option<Inbound>,
    /// Whether the gateway's target for it names CoreMail rather than `inbound`.
    #[serde(default)]
    target_type: TargetType,
    /// Why there is no inbound forwarding, when there is none.
    #[serde(default)]
    inbound_note: Option<String>,
    /// Why it is blocked, or what the last attempt ran into (`gateway-unreachable`, …).
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
    updated_at: u64,
}

/// Which address a service's `SMTP_*` group holds: the version of that address's password
/// secret it copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Sender {
    address: String,
    password_version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct PassError {
    code: String,
    message: String,
}

/// What the last reconcile pass found.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct PassStatus {
    summary: String,
    /// Why the pass stopped, if it did (`gateway-unconfigured`, `gateway-unreachable`, …).
    error: Option<PassError>,
    at: u64,
}

fn record_status(outcome: &Result<String>) -> Result<()> {
    let (summary, error) = match outcome {
        Ok(summary) => (summary.clone(), None),
        Err(r) => (format!("{}: {}", r.code(), r.message()), Some(PassError { code: r.code().into(), message: r.message().into() })),
    };
    let current = store::get::<PassStatus>(STATUS, STATUS_ID)?;
    let status = PassStatus { summary, error, at: now_ms() };
    store::Batch::new().put(STATUS, STATUS_ID, current.map(|d| d.revision), &status).commit()?;
    Ok(())
}

/// The part of a service this manager reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Service {
    name: String,
    organization_id: String,
    #[serde(default)]
    ports: Vec<Port>,
    #[serde(default)]
    mail_addresses: Vec<String>,
    /// The managers' records of it: this manager's and CoreMail's.
    #[serde(default)]
    facets: Facets,
    state: String,
}

/// The records of a service this manager reads.
#[derive(Debug, Clone, Default, Deserialize)]
struct Facets {
    /// This manager's record of what it bound, as it last wrote it.
    #[serde(default)]
    mail: Option<MailFacet>,
    /// The CoreMail manager's binding of the service: the step its mail is at.
    #[serde(default)]
    coremail: Option<CoreMailRecord>,
}

/// This manager's facet of a service (`facets.mail`): the public record of its bound
/// addresses, never a password.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct MailFacet {
    /// One entry per address bound, each an address the service lists.
    #[schemars(length(max = 32))]
    bindings: Vec<MailRecord>,
}

/// The part of CoreMail's facet of a service (`facets.coremail`) this manager reads.
#[derive(Debug, Clone, Deserialize)]
struct CoreMailRecord {
    want: Step,
}

/// The step of the move onto CoreMail a service's `coreMail.want` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Step {
    DualWrite,
    InboundCutover,
    CoremailOnly,
}

impl Service {
    /// The step asked of this service's mail path; `None`: the direct path alone.
    fn step(&self) -> Option<Step> {
        self.facets.coremail.as_ref().map(|c| c.want)
    }
}

/// One address of a service as this manager bound it: public metadata only, never a password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MailRecord {
    /// One of the service's `mailAddresses`.
    #[schemars(length(min = 3, max = 254))]
    address: String,
    /// The SMTP username the gateway issued for it.
    #[schemars(length(max = 256))]
    smtp_username: String,
    /// The credential version whose password the service's secrets hold.
    credential_version: u64,
    /// Where the gateway forwards the address's inbound mail, if anywhere (a `direct` target).
    inbound: Option<Inbound>,
    /// Where its inbound mail goes: the service (`direct`) or CoreMail (`coremail`).
    #[serde(default)]
    target_type: TargetType,
    /// The direct path's credential and environment retired (CoreMail only).
    #[serde(default)]
    retired: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Port {
    port: u16,
    protocol: String,
    #[serde(default)]
    public_port: Option<u16>,
}

/// `web@acme.example` → `WEB_ACME_EXAMPLE`: an address as the part of its variables' names.
fn token(address: &str) -> String {
    secrets::key_part(address)
}

impl Binding {
    /// An address of a service as recorded before the gateway is asked for anything.
    fn pending(service_id: &str, organization_id: &str, address: &str) -> Binding {
        let token = token(address);
        Binding {
            service_id: service_id.into(),
            organization_id: organization_id.into(),
            address: address.into(),
            gateway_id: format!("capstan.{service_id}.{token}"),
            token,
            state: State::Pending,
            username: None,
            credential_version: None,
            inbound: None,
            target_type: TargetType::Direct,
            inbound_note: None,
            reason: None,
            message: None,
            updated_at: now_ms(),
        }
    }
}

fn binding_id(service_id: &str, token: &str) -> String {
    format!("{service_id}.{token}")
}

fn service_scope(service_id: &str) -> String {
    format!("mail:{service_id}")
}

// ---------------------------------------------------------------------------------------------
// Settings and the gateway

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Settings {
    submission_host: Option<String>,
    submission_port: u16,
    submission_tls: SmtpTls,
    forward_target_host: Option<String>,
}

capstan_sdk::shaped_text!(Host, r"^[A-Za-z0-9.\-\[\]:]{1,253}$", "A host name or address.");

/// The gateway's answer as the status and its JSON (`null` for none): a 5xx is
/// `gateway-unreachable`; a success other than 204 without a JSON body `gateway-answer-invalid`
/// (both retryable), so a page of a proxy in front of the gateway is never read as an empty list.
fn answered(method: &str, path: &str, response: gateway::Response) -> Result<(u16, Value)> {
    let status = response.status;
    if status >= 500 {
        return Err(unreachable(method, path, &format!("HTTP {status}")));
    }
    match response.body {
        Some(body) => Ok((status, body)),
        None if (200..300).contains(&status) && status != 204 => Err(Refusal::new(
            "gateway-answer-invalid",
            format!("the mail gateway answered {method} {path} with HTTP {status} but no JSON body"),
        )
        .retryable()),
        None => Ok((status, Value::Null)),
    }
}

/// The verified domains of a `GET /v1/domains` answer, lowercased; `gateway-answer-invalid`
/// when it lists none at all (no `domains` array).
fn verified_domains(answer: &Value) -> Result<BTreeSet<String>> {
    let Some(listed) = answer["domains"].as_array() else {
        return Err(Refusal::new("gateway-answer-invalid", "the mail gateway's domain list has no domains array").retryable());
    };
    Ok(listed.iter().filter(|d| d["verified"] == json!(true)).filter_map(|d| d["name"].as_str().map(str::to_ascii_lowercase)).collect())
}

/// `gateway-unreachable` (retryable): no answer to `method` `path`, or a 5xx, for `why`.
fn unreachable(method: &str, path: &str, why: &str) -> Refusal {
    Refusal::new("gateway-unreachable", format!("the mail gateway did not answer {method} {path}: {why}")).retryable()
}

fn unconfigured(message: impl Into<String>) -> Refusal {
    Refusal::new("gateway-unconfigured", message)
}

/// The gateway as configured: reached through the host under Capstan's enrolled client
/// credential (the `gateway` import; the manager never sees it), its submission listener, where
/// inbound mail goes.
struct Gateway {
    submission_host: String,
    submission_port: u16,
    submission_tls: String,
    forward_host: Option<String>,
    /// Whether the gateway takes alternates on a forward target (`smtpForwardAlternates` in its
    /// status); one that does not is sent the primary alone.
    alternates: bool,
}

impl Gateway {
    /// The gateway's submission listener and forward host as the settings name them, or
    /// `gateway-unconfigured` naming what is missing. Whether Capstan is enrolled at the gateway
    /// shows with the first request ([`Gateway::call`]).
    fn configured() -> Result<Gateway> {
        let s: Settings = settings::get()?;
        let submission_host = s.submission_host.ok_or_else(|| unconfigured("the setting mail.submissionHost names no submission host"))?;
        Ok(Gateway {
            submission_host,
            submission_port: s.submission_port,
            submission_tls: s.submission_tls.as_str().to_string(),
            forward_host: s.forward_target_host.filter(|h| !h.is_empty()),
            alternates: false,
        })
    }

    /// One request under Capstan's enrolled client credential (`gateway:smtp:write`,
    /// `gateway:peers:write`, `gateway:domains:read`; `GET /v1/status` with any): the status and
    /// the JSON answer (`null` for none). No answer or a 5xx is `gateway-unreachable`
    /// (retryable); a success other than 204 without a JSON body `gateway-answer-invalid`
    /// (retryable: a proxy's page is never read as an empty list); Capstan not enrolled at the gateway
    /// `gateway-unconfigured`; a credential the gateway refuses `gateway-credential-refused`;
    /// the host's other refusals pass through by name.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let response = match gateway::request(method, path, body) {
            Ok(r) => r,
            Err(r) if r.is("gateway-unreachable") => return Err(unreachable(method, path, r.message())),
            Err(r) if r.is("gateway-not-enrolled") => {
                return Err(unconfigured(
                    "Capstan is not enrolled at the mail gateway: an administrator enrolls it with capstan gateway bootstrap \
                     (the settings gatewayUrl and gatewayClientId, docs/gateway-protocol.md \"Client enrollment\")",
                ));
            }
            Err(r) => return Err(r),
        };
        answered(method, path, response)
    }

    /// A 2xx answer, or the gateway's refusal by name (`gateway-refused`).
    fn expect(&self, method: &str, path: &str, body: Option<&Value>, ok: &[u16]) -> Result<(u16, Value)> {
        let (status, value) = self.call(method, path, body)?;
        if ok.contains(&status) {
            return Ok((status, value));
        }
        let code = value["error"]["code"].as_str().unwrap_or("unknown").to_string();
        let message = value["error"]["message"].as_str().unwrap_or_default().to_string();
        Err(Refusal::new("gateway-refused", format!("the mail gateway refused {method} {path} (HTTP {status} {code}): {message}"))
            .with_data(json!({ "status": status, "gatewayCode": code })))
    }

    /// The gateway's protocol, and whether it takes alternates on a forward target.
    fn check_protocol(&mut self) -> Result<()> {
        let (_, status) = self.expect("GET", "/v1/status", None, &[200])?;
        self.alternates = status["smtpForwardAlternates"] == json!(true);
        match status["protocol"].as_u64() {
            Some(PROTOCOL) => Ok(()),
            other => Err(Refusal::new(
                "gateway-protocol-unsupported",
                format!("the mail gateway speaks protocol {other:?}; Capstan speaks {PROTOCOL} (docs/gateway-protocol.md)"),
            )),
        }
    }

    /// The verified domains the gateway serves.
    fn domains(&self) -> Result<BTreeSet<String>> {
        verified_domains(&self.expect("GET", "/v1/domains", None, &[200])?.1)
    }

    /// A new credential for `binding`, or a new password for the one the gateway already holds
    /// under its id (a create whose answer was lost): `(username, version, password)`.
    fn issue(&self, binding: &Binding) -> Result<(String, u64, String)> {
        let body = json!({ "id": binding.gateway_id, "username": binding.gateway_id, "allowedFrom": [binding.address] });
        let (status, answer) = self.expect("POST", "/v1/smtp-credentials", Some(&body), &[201, 409])?;
        let answer = if status == 409 {
            self.expect("POST", &format!("/v1/smtp-credentials/{}/rotate", binding.gateway_id), Some(&json!({})), &[200])?.1
        } else {
            answer
        };
        let username = answer["username"].as_str().map(str::to_string);
        let version = answer["version"].as_u64();
        let password = answer["password"].as_str().filter(|p| !p.is_empty()).map(str::to_string);
        match (username, version, password) {
            (Some(u), Some(v), Some(p)) => Ok((u, v, p)),
            _ => {
                Err(Refusal::new("gateway-answer-invalid", "the mail gateway's credential answer lacks its username, version or password"))
            }
        }
    }

    /// The CoreMail peer registered as published, put only where the gateway holds another (or
    /// none). Its id, when there is a peer to forward to.
    fn register_peer(&self, peer: &Peer) -> Result<Option<String>> {
        let Some(id) = peer.peer_id.as_deref().filter(|_| !peer.withdrawn) else { return Ok(None) };
        let path = format!("/v1/peers/{id}");
        let (status, held) = self.expect("GET", &path, None, &[200, 404])?;
        if status != 200 || held["verifiers"] != json!(peer.verifiers) {
            self.expect("PUT", &path, Some(&json!({ "kind": "coremail", "verifiers": peer.verifiers })), &[200])?;
            capstan_sdk::info!("mail: the CoreMail peer {id} registered at the gateway");
        }
        Ok(Some(id.to_string()))
    }

    /// A withdrawn peer forgotten by the gateway; `false` while targets still name it (they move
    /// back to the services first).
    fn forget_peer(&self, peer: &Peer) -> Result<bool> {
        let Some(id) = &peer.peer_id else { return Ok(true) };
        let (status, _) = self.expect("DELETE", &format!("/v1/peers/{id}"), None, &[204, 404, 409])?;
        Ok(status != 409)
    }

    /// The gateway's record of a credential (`None`: it holds none).
    fn credential(&self, id: &str) -> Result<Option<Value>> {
        let (status, answer) = self.expect("GET", &format!("/v1/smtp-credentials/{id}"), None, &[200, 404])?;
        Ok((status == 200).then_some(answer))
    }
}

// ---------------------------------------------------------------------------------------------
// The pass

/// Every service with the revision read, in id order.
fn services_read() -> Result<Vec<(String, u64, Service)>> {
    Ok(inventory::list_all::<Service>(EntityKind::Service)?.into_iter().map(|e| (e.id, e.revision, e.data)).collect())
}

/// Every service, in id order.
fn services() -> Result<Vec<(String, Service)>> {
    Ok(services_read()?.into_iter().map(|(id, _, service)| (id, service)).collect())
}

fn all_bindings() -> Result<Vec<Doc<Binding>>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store::scan::<Binding>(BINDINGS, cursor.as_deref(), 500)?;
        out.extend(page.documents);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(out),
        }
    }
}

/// The addresses each active service wants bound: binding id → (service id, service, address).
/// Two addresses of one service with the same token keep only the first.
fn desired(services: &[(String, Service)]) -> BTreeMap<String, (String, Service, String)> {
    let mut out = BTreeMap::new();
    for (id, service) in services.iter().filter(|(_, s)| s.state == "active") {
        for address in &service.mail_addresses {
            out.entry(binding_id(id, &token(address))).or_insert_with(|| (id.clone(), service.clone(), address.clone()));
        }
    }
    out
}

/// Where `service`'s inbound mail goes, or why nowhere: its published SMTP port on a node where
/// a replica of it is ready (`reach`: the one `held` names while it stays ready, so a target
/// does not move for nothing; the one held while none is ready, the gateway's delivery waiting
/// for it), every other ready node (sorted) an alternate the gateway fails over to when the
/// gateway takes alternates, or — for a service Capstan does not run (no replica anywhere) — on
/// `mail.forwardTargetHost`, without alternates.
fn inbound_of(
    gateway: &Gateway,
    service: &Service,
    reach: Option<&runtime::Reach>,
    held: Option<&Inbound>,
) -> std::result::Result<Inbound, String> {
    let published = SMTP_PORTS
        .iter()
        .find_map(|smtp| service.ports.iter().find(|p| p.port == *smtp && p.protocol == "tcp").and_then(|p| p.public_port));
    let Some(port) = published else {
        return Err("the service publishes no tcp port 25 or 2525: no inbound mail".into());
    };
    let held = held.filter(|h| h.port == port);
    let Some(reach) = reach else {
        return match &gateway.forward_host {
            Some(host) => Ok(Inbound { host: host.clone(), port, alternates: Vec::new() }),
            None => Err("the setting mail.forwardTargetHost names no host for a service Capstan does not run: inbound mail is off".into()),
        };
    };
    // the other ready nodes, sorted so that an unchanged set never re-puts the target
    let alternates = |primary: &str| -> Vec<Alternate> {
        if !gateway.alternates {
            return Vec::new();
        }
        let others: BTreeSet<&String> = reach.ready.iter().filter(|h| h.as_str() != primary).collect();
        others.into_iter().take(MAX_ALTERNATES).map(|host| Alternate { host: host.clone(), port }).collect()
    };
    match (held, reach.ready.first()) {
        (Some(held), _) if reach.ready.contains(&held.host) => {
            Ok(Inbound { host: held.host.clone(), port, alternates: alternates(&held.host) })
        }
        (_, Some(host)) => Ok(Inbound { host: host.clone(), port, alternates: alternates(host) }),
        // none ready: the target stays as it was (alternates only where the gateway takes them)
        (Some(held), None) => {
            let mut held = held.clone();
            if !gateway.alternates {
                held.alternates.clear();
            }
            Ok(held)
        }
        (None, None) if !reach.unaddressed.is_empty() => Err(format!(
            "the nodes of its ready replicas state no address ({}): start their agents with --advertise-address",
            reach.unaddressed.join(", ")
        )),
        (None, None) => Err("no replica of the service is ready to take its inbound mail yet".into()),
    }
}

fn pass() -> Result<String> {
    let mut gateway = Gateway::configured()?;
    gateway.check_protocol()?;
    let read = services_read()?;
    let services: Vec<(String, Service)> = read.iter().map(|(id, _, service)| (id.clone(), service.clone())).collect();
    let wanted = desired(&services);
    let existing = all_bindings()?;
    let mut summary = Vec::new();

    // withdraw first: what no active service wants any more
    let mut withdrawn = BTreeSet::new();
    for doc in existing.iter().filter(|d| !wanted.contains_key(&d.id) || d.data.state == State::Removing) {
        remove(&gateway, doc.clone())?;
        withdrawn.insert(doc.data.service_id.clone());
    }
    if !withdrawn.is_empty() {
        summary.push(format!("addresses of {} services withdrawn", withdrawn.len()));
    }

    // the CoreMail peer registered before any target names it
    let peer = store::get::<Peer>(PEERS, PEER_ID)?;
    let peer_id = match &peer {
        Some(doc) => gateway.register_peer(&doc.data)?,
        None => None,
    };
    let domains = gateway.domains()?;
    let known: BTreeMap<&str, &Doc<Binding>> = existing.iter().map(|d| (d.id.as_str(), d)).collect();
    let (mut bound, mut blocked) = (0, 0);
    for (id, (service_id, service, address)) in &wanted {
        let doc = match known.get(id.as_str()) {
            Some(doc) if doc.data.state != State::Removing => Some((*doc).clone()),
            _ => None,
        };
        match bind(&gateway, peer_id.as_deref(), &domains, id, service_id, service, address, doc)? {
            State::Active | State::Retired => bound += 1,
            _ => blocked += 1,
        }
    }
    summary.push(format!("{bound} addresses bound"));
    if blocked > 0 {
        summary.push(format!("{blocked} blocked"));
    }

    senders(&gateway, &services)?;
    release_unbound(&services, &withdrawn)?;
    // a withdrawn peer goes once no target names it any more
    if let Some(doc) = peer.filter(|d| d.data.withdrawn)
        && gateway.forget_peer(&doc.data)?
    {
        store::Batch::new().delete(PEERS, PEER_ID, doc.revision).commit()?;
    }
    let recorded = record_on_services(&read)?;
    if recorded > 0 {
        summary.push(format!("{recorded} service records updated"));
    }
    Ok(summary.join(", "))
}

/// Write each active service's `facets.mail` — the public record of its bound addresses —
/// where it differs, fenced by the revision read at the start of the pass: a service changed
/// since is left to the next pass (its change woke one), so a record never describes addresses
/// the service no longer asks for. How many were written.
fn record_on_services(read: &[(String, u64, Service)]) -> Result<usize> {
    let mut written = 0;
    for (service_id, revision, service) in read.iter().filter(|(_, _, s)| s.state == "active") {
        let bound = bindings_of(service_id)?;
        let wanted: Vec<MailRecord> = service
            .mail_addresses
            .iter()
            .filter_map(|address| {
                bound.iter().find(|b| &b.data.address == address && matches!(b.data.state, State::Active | State::Retired))
            })
            .map(|b| MailRecord {
                address: b.data.address.clone(),
                smtp_username: b.data.username.clone().unwrap_or_default(),
                credential_version: b.data.credential_version.unwrap_or_default(),
                inbound: b.data.inbound.clone(),
                target_type: b.data.target_type,
                retired: b.data.state == State::Retired,
            })
            .collect();
        let recorded = service.facets.mail.as_ref().map_or(&[][..], |f| &f.bindings[..]);
        if wanted == recorded {
            continue;
        }
        let outcome = if wanted.is_empty() {
            inventory::clear_facet::<Value>(EntityKind::Service, service_id, Some(*revision))
        } else {
            inventory::set_facet::<Value>(EntityKind::Service, service_id, &MailFacet { bindings: wanted }, Some(*revision))
        };
        match outcome {
            Ok(_) => written += 1,
            Err(r) if r.is("conflict") || r.is("service-deleting") || r.is("service-not-found") => {}
            Err(r) => return Err(r),
        }
    }
    Ok(written)
}

/// Bring one wanted address to `active` (or `blocked`, with the reason): record it, hold the
/// service, have the gateway issue the credential and put its password into the service's
/// secrets, keep the secrets and the forward target in line with the settings.
#[allow(clippy::too_many_arguments)]
fn bind(
    gateway: &Gateway,
    peer: Option<&str>,
    domains: &BTreeSet<String>,
    id: &str,
    service_id: &str,
    service: &Service,
    address: &str,
    doc: Option<Doc<Binding>>,
) -> Result<State> {
    let mut doc = match doc {
        Some(doc) => doc,
        None => {
            // the service first: a deleting one is not bound at all
            if let Err(r) = inventory::hold_service(service_id) {
                if r.is("service-deleting") {
                    return Ok(State::Blocked);
                }
                return Err(r);
            }
            let binding = Binding::pending(service_id, &service.organization_id, address);
            let written = store::Batch::new().insert(BINDINGS, id, &binding).commit()?;
            Doc { id: id.into(), revision: written[0].revision, data: binding }
        }
    };
    let domain = address.rsplit_once('@').map(|(_, d)| d.to_ascii_lowercase()).unwrap_or_default();
    if !domains.contains(&domain) {
        let message = format!("the mail gateway does not list {domain} as a verified domain");
        return block(doc, "mail-domain-unverified", message);
    }
    match settle(gateway, peer, service, &mut doc) {
        Ok(state) => Ok(state),
        Err(r) => {
            // what happened is kept on the record; the state stays as it was
            note(doc, r.code(), r.message())?;
            Err(r)
        }
    }
}

/// The gateway's side and the secrets of an address, made to match the step its service is at;
/// `doc` is committed at the end as `active`, or `retired` at CoreMail only.
fn settle(gateway: &Gateway, peer: Option<&str>, service: &Service, doc: &mut Doc<Binding>) -> Result<State> {
    let scope = service_scope(&doc.data.service_id);
    let owner = Owner::Service(doc.data.service_id.clone());
    let token = doc.data.token.clone();
    let group = |field: &str| format!("MAIL_{token}_SMTP_{field}");

    // inbound: to the service's port, or from the inbound cutover on to the CoreMail peer
    let cutover = service.step() >= Some(Step::InboundCutover);
    let reach = runtime::reach(&doc.data.service_id, None, &mut runtime::NodeAddresses::default())?;
    let direct = inbound_of(gateway, service, reach.as_ref(), doc.data.inbound.as_ref());
    let (target_type, wanted, inbound_note) = match peer.filter(|_| cutover) {
        Some(_) => (TargetType::Coremail, None, None),
        None if cutover => (
            TargetType::Direct,
            direct.ok(),
            Some(format!("the inbound cutover waits for CoreMail's gateway peer (the event {PEER_EVENT})")),
        ),
        None => (TargetType::Direct, direct.as_ref().ok().cloned(), direct.err()),
    };
    if target_type != doc.data.target_type || wanted != doc.data.inbound {
        let path = format!("/v1/smtp-forward-targets/{}", doc.data.gateway_id);
        match (&wanted, peer) {
            (_, Some(peer)) if target_type == TargetType::Coremail => {
                let body = json!({ "address": doc.data.address, "targetType": "coremail", "peerId": peer });
                gateway.expect("PUT", &path, Some(&body), &[200])?;
            }
            (Some(target), _) => {
                let mut body = json!({ "address": doc.data.address, "host": target.host, "port": target.port });
                // a gateway that does not advertise alternates is sent none (it would refuse them)
                if gateway.alternates {
                    body["alternates"] = json!(target.alternates);
                }
                gateway.expect("PUT", &path, Some(&body), &[200])?;
            }
            (None, _) => drop(gateway.expect("DELETE", &path, None, &[204, 404])?),
        }
    }

    // outbound: the address's credential and group, retired at CoreMail only (once inbound is
    // CoreMail's), issued again by a lower step
    let retire = service.step() == Some(Step::CoremailOnly) && target_type == TargetType::Coremail;
    if retire {
        if doc.data.state != State::Retired {
            gateway.expect("DELETE", &format!("/v1/smtp-credentials/{}", doc.data.gateway_id), None, &[204, 404])?;
            let prefix = group("");
            revoke_keys(&doc.data.service_id, |key| key.starts_with(&prefix))?;
            capstan_sdk::info!("mail: the direct credential of {} retired (CoreMail only)", doc.data.address);
        }
    } else {
        // a credential the gateway lost (or never issued, or retired) is issued again
        let held = match doc.data.credential_version {
            Some(_) => gateway.credential(&doc.data.gateway_id)?.is_some(),
            None => false,
        };
        if !held {
            let (username, version, password) = gateway.issue(&doc.data)?;
            secrets::put(&scope, &owner, &group("PASSWORD"), password.as_bytes())?;
            doc.data.username = Some(username);
            doc.data.credential_version = Some(version);
            commit(doc)?;
        }
        let username = doc.data.username.clone().unwrap_or_default();
        for (field, value) in public_values(gateway, &username) {
            secrets::put(&scope, &owner, &group(field), value.as_bytes())?;
        }
    }
    let state = if retire { State::Retired } else { State::Active };
    let changed = doc.data.state != state
        || doc.data.inbound != wanted
        || doc.data.target_type != target_type
        || doc.data.reason.is_some()
        || doc.data.inbound_note != inbound_note;
    if changed {
        (doc.data.inbound, doc.data.target_type, doc.data.inbound_note) = (wanted, target_type, inbound_note);
        doc.data.state = state;
        (doc.data.reason, doc.data.message) = (None, None);
        commit(doc)?;
    }
    Ok(state)
}

/// The group's values that are not the password, from the settings.
fn public_values(gateway: &Gateway, username: &str) -> [(&'static str, String); 4] {
    [
        ("HOST", gateway.submission_host.clone()),
        ("PORT", gateway.submission_port.to_string()),
        ("USER", username.to_string()),
        ("TLS", gateway.submission_tls.clone()),
    ]
}

fn commit(doc: &mut Doc<Binding>) -> Result<()> {
    doc.data.updated_at = now_ms();
    let written = store::Batch::new().replace(BINDINGS, &doc.id, doc.revision, &doc.data).commit()?;
    doc.revision = written[0].revision;
    Ok(())
}

fn block(mut doc: Doc<Binding>, code: &str, message: String) -> Result<State> {
    if doc.data.state != State::Blocked || doc.data.reason.as_deref() != Some(code) || doc.data.message.as_deref() != Some(&message) {
        doc.data.state = State::Blocked;
        (doc.data.reason, doc.data.message) = (Some(code.into()), Some(message));
        commit(&mut doc)?;
    }
    Ok(State::Blocked)
}

fn note(mut doc: Doc<Binding>, code: &str, message: &str) -> Result<()> {
    (doc.data.reason, doc.data.message) = (Some(code.into()), Some(message.into()));
    // a conflict means another pass moved it on: its record wins
    match commit(&mut doc) {
        Err(r) if r.is("conflict") || r.is("not-found") => Ok(()),
        other => other,
    }
}

/// Withdraw an address: marked `removing`, its forward target and credential deleted at the
/// gateway, its secrets revoked, then the record deleted.
fn remove(gateway: &Gateway, mut doc: Doc<Binding>) -> Result<()> {
    if doc.data.state != State::Removing {
        doc.data.state = State::Removing;
        commit(&mut doc)?;
    }
    let id = &doc.data.gateway_id;
    gateway.expect("DELETE", &format!("/v1/smtp-forward-targets/{id}"), None, &[204, 404])?;
    gateway.expect("DELETE", &format!("/v1/smtp-credentials/{id}"), None, &[204, 404])?;
    let prefix = format!("MAIL_{}_SMTP_", doc.data.token);
    revoke_keys(&doc.data.service_id, |key| key.starts_with(&prefix))?;
    store::Batch::new().delete(BINDINGS, &doc.id, doc.revision).commit()?;
    capstan_sdk::info!("mail address {} of {} withdrawn from the gateway", doc.data.address, doc.data.service_id);
    Ok(())
}

/// Revoke the active secrets of the service's mail scope whose key `matches`. A service being
/// deleted refuses (`service-deleting`): its deletion revokes every secret it owns.
fn revoke_keys(service_id: &str, matches: impl Fn(&str) -> bool) -> Result<()> {
    let scope = service_scope(service_id);
    for secret in secrets::list(&scope)? {
        if secret.state == "active" && matches(&secret.key) {
            match secrets::revoke(&scope, &secret.id) {
                Err(r) if r.is("service-deleting") => return Ok(()),
                other => drop(other?),
            }
        }
    }
    Ok(())
}

/// Each service's `SMTP_*` group: the values of its default sender, the first of its
/// addresses that is bound; revoked when none is.
fn senders(gateway: &Gateway, services: &[(String, Service)]) -> Result<()> {
    for (service_id, service) in services {
        let bound = bindings_of(service_id)?;
        let default = service
            .mail_addresses
            .iter()
            .filter(|_| service.state == "active")
            .find_map(|a| bound.iter().find(|b| &b.data.address == a && b.data.state == State::Active));
        let current = store::get::<Sender>(SENDERS, service_id)?;
        let Some(binding) = default else {
            if let Some(current) = current {
                revoke_keys(service_id, |key| key.starts_with("SMTP_"))?;
                store::Batch::new().delete(SENDERS, service_id, current.revision).commit()?;
            }
            continue;
        };
        let (scope, owner) = (service_scope(service_id), Owner::Service(service_id.clone()));
        let username = binding.data.username.clone().unwrap_or_default();
        for (field, value) in public_values(gateway, &username) {
            secrets::put(&scope, &owner, &format!("SMTP_{field}"), value.as_bytes())?;
        }
        let key = format!("MAIL_{}_SMTP_PASSWORD", binding.data.token);
        let listed = secrets::list(&scope)?;
        let Some(secret) = listed.iter().find(|s| s.key == key && s.state == "active") else { continue };
        let wanted = Sender { address: binding.data.address.clone(), password_version: secret.active_version.clone() };
        if current.as_ref().map(|c| &c.data) != Some(&wanted) {
            // the password is copied from the address's own group: the gateway shows it only once
            let password = secrets::reveal(&scope, &secret.id)?;
            secrets::put(&scope, &owner, "SMTP_PASSWORD", &password)?;
            store::Batch::new().put(SENDERS, service_id, current.map(|c| c.revision), &wanted).commit()?;
        }
    }
    Ok(())
}

fn bindings_of(service_id: &str) -> Result<Vec<Doc<Binding>>> {
    Ok(store::find::<Binding>(BINDINGS, "by_service", &[json!(service_id)], None, 500)?.documents)
}

/// Release the hold on the services this manager has nothing of any more: those it withdrew
/// addresses of in this pass, and every deleting one (a pass that died before its release is
/// finished here). Idempotent; the last release of a deleting service lets its deletion finish.
fn release_unbound(services: &[(String, Service)], withdrawn: &BTreeSet<String>) -> Result<()> {
    for (service_id, service) in services {
        if service.state == "active" && !withdrawn.contains(service_id) {
            continue;
        }
        if bindings_of(service_id)?.is_empty() && store::get::<Sender>(SENDERS, service_id)?.is_none() {
            inventory::release_service(service_id)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Methods

/// An address as the methods answer it.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct AddressView {
    address: String,
    state: State,
    /// The variables the service receives for it: `MAIL_<token>_SMTP_*`.
    token: String,
    username: Option<String>,
    credential_version: Option<u64>,
    inbound: Option<Inbound>,
    /// Where the gateway forwards its inbound mail: `direct` (to `inbound`) or `coremail`.
    target_type: TargetType,
    inbound_note: Option<String>,
    reason: Option<String>,
    message: Option<String>,
    /// Whether its `SMTP_*` group is this address's (the default sender).
    default_sender: bool,
    /// How its mail flows: `direct` (through the gateway), or the CoreMail step asked of the
    /// service (`dual-write`, `inbound-cutover`, `coremail-only`; docs/coremail.md).
    path: String,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ServiceMail {
    service_id: String,
    service_name: String,
    organization_id: String,
    addresses: Vec<AddressView>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Targets {
    /// What the last pass found (none before the first).
    gateway: Option<PassStatus>,
    services: Vec<ServiceMail>,
}

/// A service's addresses in the order it lists them; one not recorded yet is `pending`.
fn service_mail(service_id: &str, service: &Service) -> Result<ServiceMail> {
    let bound = bindings_of(service_id)?;
    let sender = store::get::<Sender>(SENDERS, service_id)?.map(|d| d.data.address);
    let path = match service.step() {
        None => "direct",
        Some(Step::DualWrite) => "dual-write",
        Some(Step::InboundCutover) => "inbound-cutover",
        Some(Step::CoremailOnly) => "coremail-only",
    }
    .to_string();
    let mut addresses: Vec<AddressView> = service
        .mail_addresses
        .iter()
        .map(|address| {
            let found = bound.iter().find(|b| &b.data.address == address).map(|b| b.data.clone());
            view(found.unwrap_or_else(|| Binding::pending(service_id, &service.organization_id, address)), sender.as_deref(), &path)
        })
        .collect();
    // being withdrawn: listed until the gateway forgot them
    for b in bound.iter().filter(|b| !service.mail_addresses.contains(&b.data.address)) {
        addresses.push(view(b.data.clone(), sender.as_deref(), &path));
    }
    Ok(ServiceMail {
        service_id: service_id.into(),
        service_name: service.name.clone(),
        organization_id: service.organization_id.clone(),
        addresses,
    })
}

fn view(b: Binding, sender: Option<&str>, path: &str) -> AddressView {
    AddressView {
        default_sender: sender == Some(b.address.as_str()),
        address: b.address,
        state: b.state,
        token: b.token,
        username: b.username,
        credential_version: b.credential_version,
        inbound: b.inbound,
        target_type: b.target_type,
        inbound_note: b.inbound_note,
        reason: b.reason,
        message: b.message,
        path: path.to_string(),
    }
}

fn list_service_targets(_ctx: &Context, _input: Empty) -> Result<Targets> {
    let mut out = Vec::new();
    let listed = services()?;
    let with_bindings: BTreeSet<String> = all_bindings()?.into_iter().map(|b| b.data.service_id).collect();
    for (id, service) in &listed {
        if !service.mail_addresses.is_empty() || with_bindings.contains(id) {
            out.push(service_mail(id, service)?);
        }
    }
    Ok(Targets { gateway: store::get::<PassStatus>(STATUS, STATUS_ID)?.map(|d| d.data), services: out })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ServiceInput {
    organization_id: String,
    service_id: String,
}

/// The service, when it is one of the organization's (`service-not-found` otherwise, so no
/// other organization's services can be probed).
fn service_in(input: &ServiceInput) -> Result<Service> {
    let found = inventory::get::<Service>(EntityKind::Service, &input.service_id)?;
    match found {
        Some(e) if e.data.organization_id == input.organization_id => Ok(e.data),
        _ => Err(Refusal::new("service-not-found", format!("no service {} in this organization", input.service_id))
            .with_data(json!({ "serviceId": input.service_id }))),
    }
}

fn get_service_mail(_ctx: &Context, input: ServiceInput) -> Result<ServiceMail> {
    let service = service_in(&input)?;
    service_mail(&input.service_id, &service)
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Check {
    address: String,
    /// `match`: the service holds the password the gateway accepts; `mismatch`: it does not
    /// (the next pass does not repair it: rotate by removing and re-adding the address);
    /// `missing`: the gateway or the service holds none; `unbound`: not active yet.
    credential: &'static str,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Checked {
    service_id: String,
    addresses: Vec<Check>,
}

fn check_service_mail(_ctx: &Context, input: ServiceInput) -> Result<Checked> {
    let service = service_in(&input)?;
    let gateway = Gateway::configured()?;
    let scope = service_scope(&input.service_id);
    let listed = secrets::list(&scope)?;
    let bound = bindings_of(&input.service_id)?;
    let mut addresses = Vec::new();
    for address in &service.mail_addresses {
        let Some(b) = bound.iter().find(|b| &b.data.address == address && b.data.state == State::Active) else {
            addresses.push(Check { address: address.clone(), credential: "unbound" });
            continue;
        };
        let key = format!("MAIL_{}_SMTP_PASSWORD", b.data.token);
        let held = listed.iter().find(|s| s.key == key && s.state == "active");
        let verifier = gateway.credential(&b.data.gateway_id)?.and_then(|c| c["verifier"].as_str().map(str::to_string));
        let credential = match (held, verifier) {
            (Some(secret), Some(verifier)) => {
                let password = secrets::reveal(&scope, &secret.id)?;
                if verifier == format!("sha256:{}", hex(&Sha256::digest(&password))) { "match" } else { "mismatch" }
            }
            _ => "missing",
        };
        addresses.push(Check { address: address.clone(), credential });
    }
    Ok(Checked { service_id: input.service_id, addresses })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(ports: Vec<(u16, &str, Option<u16>)>, addresses: &[&str], state: &str) -> Service {
        Service {
            name: "web".into(),
            organization_id: "org_1".into(),
            ports: ports.into_iter().map(|(port, protocol, public_port)| Port { port, protocol: protocol.into(), public_port }).collect(),
            mail_addresses: addresses.iter().map(|a| a.to_string()).collect(),
            facets: Facets::default(),
            state: state.into(),
        }
    }

    fn gateway(forward: Option<&str>) -> Gateway {
        Gateway {
            submission_host: "smtp.example".into(),
            submission_port: 587,
            submission_tls: "starttls".into(),
            forward_host: forward.map(str::to_string),
            alternates: false,
        }
    }

    /// A gateway advertising `smtpForwardAlternates`.
    fn alternating() -> Gateway {
        Gateway { alternates: true, ..gateway(None) }
    }

    #[test]
    fn an_address_becomes_a_variable_name_part() {
        assert_eq!(token("web@acme.example"), "WEB_ACME_EXAMPLE");
        assert_eq!(token("no-reply+x@mail.acme.example"), "NO_REPLY_X_MAIL_ACME_EXAMPLE");
    }

    #[test]
    fn only_active_services_want_their_addresses_and_a_token_is_bound_once() {
        let services = vec![
            ("svc_a".to_string(), service(vec![], &["a.b@x.example", "a_b@x.example", "c@x.example"], "active")),
            ("svc_b".to_string(), service(vec![], &["d@x.example"], "deleting")),
        ];
        let wanted = desired(&services);
        let ids: Vec<&str> = wanted.keys().map(String::as_str).collect();
        assert_eq!(ids, ["svc_a.A_B_X_EXAMPLE", "svc_a.C_X_EXAMPLE"]);
        assert_eq!(wanted["svc_a.A_B_X_EXAMPLE"].2, "a.b@x.example", "the first of two addresses with one token");
    }

    #[test]
    fn inbound_goes_to_the_published_smtp_port_on_the_forward_host() {
        let published = service(vec![(8080, "http", Some(80)), (2525, "tcp", Some(30025))], &[], "active");
        let outside = |g: &Gateway, s: &Service| inbound_of(g, s, None, None);
        assert_eq!(
            outside(&gateway(Some("10.0.0.5")), &published),
            Ok(Inbound { host: "10.0.0.5".into(), port: 30025, alternates: vec![] })
        );
        let port_25_first = service(vec![(2525, "tcp", Some(30025)), (25, "tcp", Some(30024))], &[], "active");
        assert_eq!(outside(&gateway(Some("h")), &port_25_first).unwrap().port, 30024);
        assert!(outside(&gateway(None), &published).unwrap_err().contains("forwardTargetHost"));
        let forwarded = Gateway { alternates: true, ..gateway(Some("10.0.0.5")) };
        assert_eq!(outside(&forwarded, &published).unwrap().alternates, [], "no alternates outside Capstan");
        let unpublished = service(vec![(25, "tcp", None), (25, "udp", Some(25))], &[], "active");
        assert!(outside(&gateway(Some("h")), &unpublished).unwrap_err().contains("publishes no tcp port"));
    }

    #[test]
    fn inbound_of_a_service_capstan_runs_goes_to_a_node_where_a_replica_is_ready_and_stays_there() {
        let published = service(vec![(25, "tcp", Some(30025))], &[], "active");
        let reach = |ready: &[&str], unaddressed: &[&str]| runtime::Reach {
            ready: ready.iter().map(|a| a.to_string()).collect(),
            unaddressed: unaddressed.iter().map(|n| n.to_string()).collect(),
        };
        let at = |host: &str| Inbound { host: host.into(), port: 30025, alternates: vec![] };
        // the forward host is for services Capstan does not run
        let both = reach(&["10.0.0.7", "10.0.0.8"], &[]);
        assert_eq!(inbound_of(&gateway(Some("h")), &published, Some(&both), None), Ok(at("10.0.0.7")));
        assert_eq!(inbound_of(&gateway(None), &published, Some(&both), Some(&at("10.0.0.8"))), Ok(at("10.0.0.8")), "kept while ready");
        let moved = reach(&["10.0.0.9"], &[]);
        assert_eq!(inbound_of(&gateway(None), &published, Some(&moved), Some(&at("10.0.0.8"))), Ok(at("10.0.0.9")), "follows the replica");
        let none = reach(&[], &[]);
        assert_eq!(
            inbound_of(&gateway(None), &published, Some(&none), Some(&at("10.0.0.8"))),
            Ok(at("10.0.0.8")),
            "held while none is ready"
        );
        assert!(inbound_of(&gateway(None), &published, Some(&none), None).unwrap_err().contains("no replica"));
        let unaddressed = reach(&[], &["node_a"]);
        assert!(inbound_of(&gateway(None), &published, Some(&unaddressed), None).unwrap_err().contains("--advertise-address"));
    }

    #[test]
    fn inbound_of_a_service_capstan_runs_fails_over_to_every_other_ready_node() {
        let published = service(vec![(25, "tcp", Some(30025))], &[], "active");
        let reach = |ready: &[&str]| runtime::Reach { ready: ready.iter().map(|a| a.to_string()).collect(), unaddressed: vec![] };
        let at = |host: &str, alternates: &[&str]| Inbound {
            host: host.into(),
            port: 30025,
            alternates: alternates.iter().map(|h| Alternate { host: h.to_string(), port: 30025 }).collect(),
        };
        let two = reach(&["10.0.0.7", "10.0.0.8"]);
        assert_eq!(inbound_of(&alternating(), &published, Some(&two), None), Ok(at("10.0.0.7", &["10.0.0.8"])));
        let three = reach(&["10.0.0.9", "10.0.0.7", "10.0.0.8"]);
        assert_eq!(
            inbound_of(&alternating(), &published, Some(&three), None),
            Ok(at("10.0.0.9", &["10.0.0.7", "10.0.0.8"])),
            "the first ready node, the others sorted"
        );
        let held = at("10.0.0.8", &[]);
        assert_eq!(
            inbound_of(&alternating(), &published, Some(&three), Some(&held)),
            Ok(at("10.0.0.8", &["10.0.0.7", "10.0.0.9"])),
            "the held primary stays primary, a record without alternates gains them"
        );
        let grown = at("10.0.0.8", &["10.0.0.7"]);
        assert_ne!(inbound_of(&alternating(), &published, Some(&three), Some(&grown)), Ok(grown.clone()), "a new ready node re-puts");
        let one = reach(&["10.0.0.8"]);
        assert_eq!(inbound_of(&alternating(), &published, Some(&one), Some(&grown)), Ok(at("10.0.0.8", &[])), "a node gone is dropped");
        let none = reach(&[]);
        assert_eq!(inbound_of(&alternating(), &published, Some(&none), Some(&grown)), Ok(grown.clone()), "held while none is ready");
        // a gateway that does not advertise alternates is given the one target, as before
        assert_eq!(inbound_of(&gateway(None), &published, Some(&three), Some(&held)), Ok(at("10.0.0.8", &[])));
        assert_eq!(inbound_of(&gateway(None), &published, Some(&none), Some(&grown)), Ok(at("10.0.0.8", &[])));
    }

    #[test]
    fn a_record_written_before_alternates_reads_as_none() {
        let old: Inbound = serde_json::from_value(json!({ "host": "10.0.0.7", "port": 30025 })).unwrap();
        assert_eq!(old.alternates, []);
    }

    #[test]
    fn a_success_without_json_is_invalid_and_a_5xx_unreachable() {
        let response = |status, body| gateway::Response { status, body };
        let code = |r: Result<(u16, Value)>| r.map_err(|e| (e.code().to_string(), e.is_retryable())).map(|(s, _)| s);
        let page = answered("GET", "/v1/domains", response(200, None)).unwrap_err();
        assert_eq!((page.code(), page.is_retryable()), ("gateway-answer-invalid", true));
        assert!(page.message().contains("GET /v1/domains") && page.message().contains("HTTP 200"), "{}", page.message());
        assert_eq!(code(answered("DELETE", "/v1/peers/p", response(204, None))), Ok(204));
        assert_eq!(answered("GET", "/v1/status", response(404, None)).unwrap(), (404, Value::Null));
        assert_eq!(code(answered("GET", "/v1/status", response(502, Some(json!({}))))), Err(("gateway-unreachable".into(), true)));
        assert_eq!(answered("GET", "/v1/status", response(200, Some(json!({ "protocol": 1 })))).unwrap().1["protocol"], 1);
    }

    #[test]
    fn verified_domains_need_the_list_and_keep_only_verified_names() {
        let listed = json!({ "domains": [{ "name": "Acme.Example", "verified": true }, { "name": "b.example", "verified": false }] });
        assert_eq!(verified_domains(&listed).unwrap(), BTreeSet::from(["acme.example".to_string()]));
        assert_eq!(verified_domains(&json!({ "domains": [] })).unwrap(), BTreeSet::new());
        assert_eq!(verified_domains(&json!({})).unwrap_err().code(), "gateway-answer-invalid");
        assert_eq!(verified_domains(&Value::Null).unwrap_err().code(), "gateway-answer-invalid");
    }

    #[test]
    fn a_group_holds_the_settings_and_the_username() {
        let values = public_values(&gateway(None), "capstan.svc.WEB");
        assert_eq!(values.map(|(k, v)| format!("{k}={v}")), ["HOST=smtp.example", "PORT=587", "USER=capstan.svc.WEB", "TLS=starttls"]);
    }
}
