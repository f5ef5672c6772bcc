//! The Secrets view at `/secrets`: an organization's services, each with its secrets
//! (`/secrets/services/{id}`), and its SecretSets (`/secrets/sets/{id}`: shared secrets its
//! services attach), all through the `secrets.*` methods as the logged-in person
//! (administrators; everyone else sees the methods' own refusal). Secrets are created,
//! rotated and revoked; SecretSets created, renamed and retired (confirmed), attached to and
//! detached from a service (stating its `secretsRevision`), and the service's page previews
//! what resolves from where, conflicts named (`secrets.previewResolution`, value-free).
//!
//! Values are write-only everywhere: no page renders one, and none reaches this server in the
//! clear. A value is typed, or generated in the browser (shown once, in its still-unsaved form,
//! so it can be copied); on submit `dashboard/static/seal.js` seals it to the keyring's ingress
//! recipient for the very request (`secrets.create` or `secrets.rotate`, the owner reference,
//! the key: [`capstan_server::secrets::ingress`]) and sends only the sealed JSON, in the `sealed` field.
//! The plain fields have no `name`, so a browser never sends them. The method opens it; a
//! refusal (`sealed-input-invalid`, `input-empty`, `exists`, `conflict`, …) is a banner with
//! its code, and nothing typed is ever shown again.
//!
//! A rotation states the version the page read (`expectedVersionId`); a revocation is
//! confirmed on a page of its own by typing the key. The list re-fetches itself when a
//! `secret.*` event commits (see [`super::live`]).

use super::forms::{
    ErrorView, Flash, FormData, PAGE, Signed, call, encode, number, post, query_of, redirect, shown_name, status_of, str_of, u64_of, when,
};
use super::services::organizations;
use super::{live, nav, render, user_view};
use crate::Host;
use crate::Viewer;
use crate::refusal::{Refusal, Result};
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use capstan_server::secrets::methods::Owner;
use minijinja::context;
use minijinja::value::Serde;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const AREAS: &[&str] = &["secret", "secretSet", "service", "organization"];
/// The largest form a create or a rotation sends: a 64 KiB value sealed, base64 and
/// %-encoded, with room to spare (every other dashboard form is held to 16 KiB).
pub(super) const SEALED_FORM_LIMIT: usize = 512 * 1024;
/// What a form sent without a sealed value is refused with (no script ran, or an old page).
const NOT_SEALED: &str = "input-not-sealed";

// ---------------------------------------------------------------------------------------
// Views

/// A secret's metadata as the lists show it (there is nothing else to show).
#[derive(Serialize)]
struct SecretRow {
    id: String,
    key: String,
    environment: String,
    state: String,
    active: bool,
    versions: u64,
    current_version_id: String,
    management_scope: Option<String>,
    updated_at: String,
    updated_iso: String,
    rotate_href: String,
    revoke_href: String,
}

fn secret_row(value: &Value) -> SecretRow {
    let id = str_of(value, "id").to_string();
    let (updated_at, updated_iso) = when(u64_of(value, "updatedAt"));
    let state = str_of(value, "state").to_string();
    SecretRow {
        rotate_href: format!("/secrets/{}/rotate", encode(&id)),
        revoke_href: format!("/secrets/{}/revoke", encode(&id)),
        id,
        key: str_of(value, "key").into(),
        environment: str_of(value, "environment").into(),
        active: state == "active",
        state,
        versions: u64_of(value, "versions"),
        current_version_id: str_of(value, "currentVersionId").into(),
        management_scope: value.get("managementScope").and_then(Value::as_str).map(str::to_string),
        updated_at,
        updated_iso,
    }
}

fn secret_rows(items: Option<&Value>) -> Vec<SecretRow> {
    let mut rows: Vec<SecretRow> = items.and_then(Value::as_array).into_iter().flatten().map(secret_row).collect();
    rows.sort_by(|a, b| (&a.key, &a.environment).cmp(&(&b.key, &b.environment)));
    rows
}

/// What a sealing form needs: the ingress recipient and the target's method and owner.
#[derive(Serialize)]
struct SealView {
    recipient_id: String,
    public_key: String,
    method: &'static str,
    owner: String,
}

/// An owner's reference (`service:<id>`, `organization:<id>/secretSet:<id>`), as the server
/// binds it into a sealed value's target: from the owner's JSON form, by the server's own rule.
fn owner_ref(owner: &Value) -> Result<String> {
    let owner: Owner =
        serde_json::from_value(owner.clone()).map_err(|e| Refusal::internal(format!("an owner the dashboard built: {e}")))?;
    Ok(owner.reference())
}

/// The recipient a form seals to, for `method` and the owner reference `owner`.
async fn seal_view(state: &Host, identity: &Viewer, method: &'static str, owner: Result<String>) -> Result<SealView> {
    let owner = owner?;
    let recipient = call(state, identity, "secrets.getIngressRecipient", json!({})).await?;
    Ok(SealView {
        recipient_id: str_of(&recipient, "recipientId").into(),
        public_key: str_of(&recipient, "publicKey").into(),
        method,
        owner,
    })
}

/// What the create form shows after a refusal: the key and environment typed (never a value).
#[derive(Serialize, Default)]
struct Typed {
    key: String,
    environment: String,
}

impl Typed {
    fn of(form: &FormData) -> Typed {
        Typed { key: form.text("key").chars().take(200).collect(), environment: form.text("environment").chars().take(100).collect() }
    }
}

/// A key from a link (`?key=`) shown in a banner: only what a secret key may be.
fn shown_key(key: Option<&str>) -> Option<String> {
    key.filter(|k| !k.is_empty() && k.len() <= 128 && k.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'))
        .map(str::to_string)
}

#[derive(Deserialize, Default)]
pub(super) struct DoneQuery {
    done: Option<String>,
    key: Option<String>,
    /// A SecretSet's name (attach, detach, create, rename).
    name: Option<String>,
    /// How many services a retirement detached the set from.
    detached: Option<u64>,
    cursor: Option<String>,
}

fn done_flash(query: &DoneQuery) -> Option<Flash> {
    let named = |done: &str| match shown_key(query.key.as_deref()) {
        Some(key) => format!("Secret {key} {done}"),
        None => format!("Secret {done}"),
    };
    match query.done.as_deref()? {
        "created" => Some(Flash::done(named("created"), "Its first version is stored, sealed; no page shows its value.")),
        "rotated" => Some(Flash::done(named("rotated"), "Its new version is current; earlier versions stay as history.")),
        "revoked" => Some(Flash::done(named("revoked"), "It takes no new version; its versions stay as history.")),
        done => set_flash(done, shown_name(query.name.as_deref()), query.detached),
    }
}

fn set_flash(done: &str, name: Option<String>, detached: Option<u64>) -> Option<Flash> {
    let named = |what: &str| match &name {
        Some(name) => format!("SecretSet {name} {what}"),
        None => format!("SecretSet {what}"),
    };
    match done {
        "set-created" => Some(Flash::done(named("created"), "Add its shared secrets below, then attach it to services.")),
        "set-updated" => Some(Flash::done(named("updated"), "Its new name and description are stored.")),
        "set-retired" => {
            let detached = detached.unwrap_or(0);
            let services = if detached == 1 { "1 service".to_string() } else { format!("{detached} services") };
            Some(Flash::done(named("retired"), format!("It was detached from {services} in the same change; it takes no new attachment.")))
        }
        "attached" => Some(Flash::done(named("attached"), "Its keys resolve for this service where the service has no key of its own.")),
        "detached" => Some(Flash::done(named("detached"), "Its keys no longer resolve for this service.")),
        _ => None,
    }
}

/// The sealed value a form sent, as the method's `value`; refused by name when the form came
/// without one (no script ran) or with something that is not JSON. Never echoed.
fn sealed_value(form: &FormData) -> Result<Value> {
    let sealed = form.text("sealed");
    if sealed.is_empty() {
        return Err(Refusal::new(
            NOT_SEALED,
            "the value did not arrive sealed: this page seals it in the browser, which needs JavaScript and a secure page (https or localhost)",
        ));
    }
    let sealed: Value = serde_json::from_str(sealed)
        .map_err(|_| Refusal::new("sealed-input-invalid", "the sealed value could not be read: seal it again for this target"))?;
    Ok(json!({ "sealed": sealed }))
}

/// What to do after a refused write, by its code.
fn after_refusal(refusal: &Refusal) -> &'static str {
    match refusal.code.as_ref() {
        "exists" => "Nothing was stored: that key already exists in this environment; rotate it instead.",
        "conflict" => {
            "Nothing was stored: someone rotated it since this page read it. The page shows it as it is now; enter the value again to replace that version."
        }
        "secret-revoked" => "Nothing was stored: a revoked secret takes no new version; create a new one.",
        "management-scope-mismatch" => "Nothing was changed: a manager owns this secret, so only it may change it.",
        "sealed-input-invalid" | "sealed-input-recipient-unknown" => "Nothing was stored. Reload the page and enter the value again.",
        "secret-set-retired" => "Nothing was stored: a retired SecretSet takes no new secret.",
        _ => "Nothing was stored; enter the value again.",
    }
}

/// What to do after a refused SecretSet change (create, rename, retire, attach, detach).
fn after_set_refusal(refusal: &Refusal) -> &'static str {
    match refusal.code.as_ref() {
        "conflict" => "Nothing was changed: it changed since this page read it. The page shows it as it is now; try again.",
        "exists" => "Nothing was changed: the organization already has a SecretSet of that name.",
        "secret-set-retired" => "Nothing was changed: a retired SecretSet takes no new attachment or change.",
        "secret-set-organization-mismatch" => "Nothing was changed: a service attaches only its own organization's SecretSets.",
        "secret-set-already-attached" | "secret-set-not-attached" => "Nothing was changed; the page shows the attachments as they are now.",
        _ => "Nothing was changed.",
    }
}

// ---------------------------------------------------------------------------------------
// The index: an organization's services and SecretSets

#[derive(Deserialize, Default)]
pub(super) struct IndexQuery {
    org: Option<String>,
}

#[derive(Serialize)]
struct ServiceLink {
    name: String,
    href: String,
    state: String,
}

/// A SecretSet as the pages show it.
#[derive(Serialize, Clone)]
struct SetView {
    id: String,
    href: String,
    name: String,
    description: String,
    state: String,
    active: bool,
    organization_id: String,
    revision: u64,
    updated_at: String,
    updated_iso: String,
    retired_at: Option<String>,
}

fn set_view(value: &Value) -> SetView {
    let id = str_of(value, "id").to_string();
    let (updated_at, updated_iso) = when(u64_of(value, "updatedAt"));
    let state = str_of(value, "state").to_string();
    SetView {
        href: format!("/secrets/sets/{}", encode(&id)),
        id,
        name: str_of(value, "name").into(),
        description: str_of(value, "description").into(),
        active: state == "active",
        state,
        organization_id: str_of(value, "organizationId").into(),
        revision: u64_of(value, "revision"),
        updated_at,
        updated_iso,
        retired_at: value.get("retiredAt").and_then(Value::as_u64).map(|at| when(at).0),
    }
}

/// An organization's SecretSets (up to one page of the most the API lists), by name.
async fn organization_sets(state: &Host, identity: &Viewer, organization_id: &str) -> Result<Vec<SetView>> {
    let body = json!({ "organizationId": organization_id, "limit": crate::inventory::MAX_PAGE });
    let listing = call(state, identity, "secrets.listSecretSets", body).await?;
    let mut sets: Vec<SetView> = listing["items"].as_array().into_iter().flatten().map(set_view).collect();
    sets.sort_by(|a, b| (!a.active, &a.name).cmp(&(!b.active, &b.name)));
    Ok(sets)
}

/// What the SecretSet forms show after a refusal: the name and description typed.
#[derive(Serialize, Default)]
struct SetTyped {
    name: String,
    description: String,
    expected_revision: String,
}

impl SetTyped {
    fn of(form: &FormData) -> SetTyped {
        SetTyped {
            name: form.text("name").chars().take(200).collect(),
            description: form.raw("description").chars().take(600).collect(),
            expected_revision: form.text("expectedRevision").chars().take(40).collect(),
        }
    }
}

async fn index_page(
    state: &Host,
    identity: &Viewer,
    status: StatusCode,
    org: Option<&str>,
    flash: Option<Flash>,
    set_form: SetTyped,
) -> Response {
    let (options, selected, orgs_error) = match organizations(state, identity, org).await {
        Ok((options, selected)) => (options, selected, None),
        Err(refusal) => (Vec::new(), None, Some(ErrorView::from(&refusal))),
    };
    let (mut services, mut services_error, mut sets, mut sets_error) = (None, None, None, None);
    if let Some(org) = &selected {
        match call(state, identity, "services.list", json!({ "organizationId": org.id, "limit": crate::inventory::MAX_PAGE })).await {
            Ok(listing) => {
                let mut links: Vec<ServiceLink> = listing["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| ServiceLink {
                        name: str_of(s, "name").into(),
                        href: format!("/secrets/services/{}", encode(str_of(s, "id"))),
                        state: str_of(s, "state").into(),
                    })
                    .collect();
                links.sort_by(|a, b| a.name.cmp(&b.name));
                services = Some(links);
            }
            Err(refusal) => services_error = Some(ErrorView::from(&refusal)),
        }
        match organization_sets(state, identity, &org.id).await {
            Ok(found) => sets = Some(found),
            Err(refusal) => sets_error = Some(ErrorView::from(&refusal)),
        }
    }
    let ctx = context! {
        page => "Secrets",
        nav => Serde(nav(state, "secrets")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        organizations => Serde(options),
        organizations_error => Serde(orgs_error),
        org => Serde(selected),
        services => Serde(services),
        services_error => Serde(services_error),
        sets => Serde(sets),
        sets_error => Serde(sets_error),
        set_form => Serde(set_form),
    };
    render(status, "secrets.html", ctx)
}

/// `GET /secrets?org=<id>`: the organization picker, its services (each a link to its
/// secrets) and its SecretSets.
pub(super) async fn page(State(state): State<Host>, Signed(identity): Signed, uri: Uri) -> Response {
    let query: IndexQuery = query_of(&uri).unwrap_or_default();
    index_page(&state, &identity, StatusCode::OK, query.org.as_deref(), None, SetTyped::default()).await
}

// ---------------------------------------------------------------------------------------
// A service's secrets

fn service_owner(id: &str) -> Value {
    json!({ "kind": "service", "serviceId": id })
}

/// The list panel's context: one page of an owner's secrets (shown on the page at `base`),
/// or the refusal.
async fn list_context(state: &Host, identity: &Viewer, owner: Value, base: &str, cursor: Option<&str>) -> minijinja::Value {
    let mut body = json!({ "owner": owner, "limit": PAGE });
    let mut panel_href = format!("{base}/panel");
    if let Some(cursor) = cursor {
        body["cursor"] = json!(cursor);
        panel_href.push_str(&format!("?cursor={}", encode(cursor)));
    }
    match call(state, identity, "secrets.list", body).await {
        Ok(listing) => {
            let next = listing["nextCursor"].as_str().map(|c| format!("{base}?cursor={}", encode(c)));
            context! { secrets => Serde(Some(secret_rows(listing.get("items")))), error => Serde(None::<ErrorView>), next, panel_href }
        }
        Err(refusal) => {
            context! { secrets => Serde(None::<Vec<SecretRow>>), error => Serde(Some(ErrorView::from(&refusal))), panel_href }
        }
    }
}

/// A SecretSet attached to the service, in resolution order.
#[derive(Serialize)]
struct AttachmentView {
    secret_set_id: String,
    name: String,
    href: String,
    attached_at: String,
    attached_iso: String,
}

/// One key of the resolution preview: where it resolves from, never its value.
#[derive(Serialize)]
struct ResolvedRow {
    environment: String,
    key: String,
    from: SourceView,
    secret_id: String,
    version_id: String,
    conflicted: bool,
}

#[derive(Serialize)]
struct SourceView {
    /// `service` or `secretSet`.
    kind: String,
    label: String,
    href: Option<String>,
}

#[derive(Serialize)]
struct ConflictRow {
    environment: String,
    key: String,
    resolved_from: SourceView,
    shadowed: Vec<SourceView>,
}

/// A `from` of the preview, named: the service itself, or the SecretSet by name.
fn source_view(from: &Value, sets: &[SetView]) -> SourceView {
    match str_of(from, "kind") {
        "secretSet" => {
            let id = str_of(from, "secretSetId");
            let name = sets.iter().find(|s| s.id == id).map(|s| s.name.clone()).unwrap_or_else(|| id.to_string());
            SourceView { kind: "secretSet".into(), label: name, href: Some(format!("/secrets/sets/{}", encode(id))) }
        }
        kind => SourceView { kind: kind.into(), label: "this service".into(), href: None },
    }
}

/// The service's SecretSets (attached, attachable) and what resolves from where.
async fn resolution_context(state: &Host, identity: &Viewer, service: &super::logs::ServiceHead) -> minijinja::Value {
    let sets = organization_sets(state, identity, &service.organization_id).await.unwrap_or_default();
    let configuration = call(state, identity, "secrets.getServiceConfiguration", json!({ "serviceId": service.id })).await;
    let (attachments, attachable, secrets_revision, configuration_error) = match &configuration {
        Ok(configuration) => {
            let attachments: Vec<AttachmentView> = configuration["attachments"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| {
                    let id = str_of(a, "secretSetId");
                    let (attached_at, attached_iso) = when(u64_of(a, "attachedAt"));
                    AttachmentView {
                        secret_set_id: id.into(),
                        name: sets.iter().find(|s| s.id == id).map(|s| s.name.clone()).unwrap_or_else(|| id.to_string()),
                        href: format!("/secrets/sets/{}", encode(id)),
                        attached_at,
                        attached_iso,
                    }
                })
                .collect();
            let attachable: Vec<SetView> =
                sets.iter().filter(|s| s.active && !attachments.iter().any(|a| a.secret_set_id == s.id)).cloned().collect();
            (Some(attachments), attachable, u64_of(configuration, "secretsRevision"), None)
        }
        Err(refusal) => (None, Vec::new(), 0, Some(ErrorView::from(refusal))),
    };
    let (resolved, conflicts, preview_error) =
        match call(state, identity, "secrets.previewResolution", json!({ "serviceId": service.id })).await {
            Ok(preview) => {
                let conflicts: Vec<ConflictRow> = preview["conflicts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| ConflictRow {
                        environment: str_of(c, "environment").into(),
                        key: str_of(c, "key").into(),
                        resolved_from: source_view(&c["resolvedFrom"], &sets),
                        shadowed: c["shadowed"].as_array().into_iter().flatten().map(|f| source_view(f, &sets)).collect(),
                    })
                    .collect();
                let mut resolved: Vec<ResolvedRow> = preview["entries"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| ResolvedRow {
                        environment: str_of(e, "environment").into(),
                        key: str_of(e, "key").into(),
                        from: source_view(&e["from"], &sets),
                        secret_id: str_of(e, "secretId").into(),
                        version_id: str_of(e, "versionId").into(),
                        conflicted: conflicts.iter().any(|c| c.environment == str_of(e, "environment") && c.key == str_of(e, "key")),
                    })
                    .collect();
                resolved.sort_by(|a, b| (&a.environment, &a.key).cmp(&(&b.environment, &b.key)));
                (Some(resolved), conflicts, None)
            }
            Err(refusal) => (None, Vec::new(), Some(ErrorView::from(&refusal))),
        };
    // what each replica was handed; the page stands without it
    let handed = call(state, identity, "secrets.preview", json!({ "serviceId": service.id })).await.ok();
    let replicas = handed.as_ref().map(|h| h["replicas"].clone()).unwrap_or_default();
    let manifest_number = handed.as_ref().map(|h| u64_of(h, "manifestNumber")).unwrap_or_default();
    context! {
        replicas => Serde(replicas),
        manifest_number,
        attachments => Serde(attachments),
        attachable => Serde(attachable),
        secrets_revision,
        configuration_error => Serde(configuration_error),
        resolved => Serde(resolved),
        conflicts => Serde(conflicts),
        preview_error => Serde(preview_error),
    }
}

async fn service_page(
    state: &Host,
    identity: &Viewer,
    id: &str,
    status: StatusCode,
    flash: Option<Flash>,
    typed: Typed,
    cursor: Option<&str>,
) -> Response {
    let head = live::head(state, identity).await;
    let (service, error) = match super::logs::service_head(state, identity, id, "secrets").await {
        Ok(service) => (Some(service), None),
        Err(refusal) => (None, Some(refusal)),
    };
    let status = match (&error, status) {
        (Some(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let owner = service_owner(id);
    let base = format!("/secrets/services/{}", encode(id));
    let (seal, seal_error, list, resolution) = match &service {
        Some(service) => {
            let (seal, seal_error) = match seal_view(state, identity, "secrets.create", owner_ref(&owner)).await {
                Ok(seal) => (Some(seal), None),
                Err(refusal) => (None, Some(ErrorView::from(&refusal))),
            };
            let list = list_context(state, identity, owner, &base, cursor).await;
            (seal, seal_error, list, resolution_context(state, identity, service).await)
        }
        None => (None, None, context! { secrets => Serde(None::<Vec<SecretRow>>), panel_href => "" }, context! {}),
    };
    let ctx = context! {
        page => service.as_ref().map(|s| format!("Secrets of {}", s.name)).unwrap_or_else(|| "Secrets".into()),
        nav => Serde(nav(state, "secrets")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        service => Serde(service),
        service_error => Serde(error.as_ref().map(ErrorView::from)),
        owner_label => "this service",
        seal => Serde(seal),
        seal_error => Serde(seal_error),
        typed => Serde(typed),
        action => base,
        ..context! { ..live::element(head, AREAS), ..context! { ..list, ..resolution } }
    };
    render(status, "secrets_service.html", ctx)
}

/// `GET /secrets/services/{id}`: the service's secrets and the create form.
pub(super) async fn service(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let query: DoneQuery = query_of(&uri).unwrap_or_default();
    service_page(&state, &identity, &id, StatusCode::OK, done_flash(&query), Typed::default(), query.cursor.as_deref()).await
}

/// `GET /secrets/services/{id}/panel?cursor=`: the list alone, for htmx.
pub(super) async fn service_panel(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let query: DoneQuery = query_of(&uri).unwrap_or_default();
    let base = format!("/secrets/services/{}", encode(&id));
    let ctx = list_context(&state, &identity, service_owner(&id), &base, query.cursor.as_deref()).await;
    render(StatusCode::OK, "secrets_list.html", context! { owner_label => "this service", ..ctx })
}

/// `POST /secrets/services/{id}/create` (`key`, `environment`, `sealed`).
pub(super) async fn create(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let result = match sealed_value(&form) {
        Ok(value) => {
            let mut body = json!({ "owner": service_owner(&id), "key": form.text("key"), "value": value });
            if !form.text("environment").is_empty() {
                body["environment"] = json!(form.text("environment"));
            }
            call(&state, &identity, "secrets.create", body).await
        }
        Err(refusal) => Err(refusal),
    };
    match result {
        Ok(created) => redirect(&format!("{}?done=created&key={}", owner_view(&created).href, encode(str_of(&created, "key")))),
        Err(refusal) => {
            let flash = Flash::refused("The secret was not created", &refusal, after_refusal(&refusal));
            service_page(&state, &identity, &id, status_of(&refusal), Some(flash), Typed::of(&form), None).await
        }
    }
}

/// `POST /secrets/services/{id}/attach` and `…/detach` (`secretSetId`,
/// `expectedSecretsRevision`).
async fn change_attachment(state: Host, id: String, request: Request, attach: bool) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let (method, done, title) = if attach {
        ("secrets.attachSecretSet", "attached", "The SecretSet was not attached")
    } else {
        ("secrets.detachSecretSet", "detached", "The SecretSet was not detached")
    };
    let set_id = form.text("secretSetId");
    let body = json!({ "serviceId": id, "secretSetId": set_id, "expectedSecretsRevision": number(form.text("expectedSecretsRevision")) });
    match call(&state, &identity, method, body).await {
        Ok(_) => {
            let name = call(&state, &identity, "secrets.getSecretSet", json!({ "id": set_id }))
                .await
                .map(|set| str_of(&set, "name").to_string())
                .unwrap_or_default();
            redirect(&format!("/secrets/services/{}?done={done}&name={}", encode(&id), encode(&name)))
        }
        Err(refusal) => {
            let flash = Flash::refused(title, &refusal, after_set_refusal(&refusal));
            service_page(&state, &identity, &id, status_of(&refusal), Some(flash), Typed::default(), None).await
        }
    }
}

pub(super) async fn attach(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    change_attachment(state, id, request, true).await
}

pub(super) async fn detach(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    change_attachment(state, id, request, false).await
}

// ---------------------------------------------------------------------------------------
// A SecretSet: its member secrets, rename, retirement

fn set_owner(set: &SetView) -> Value {
    json!({ "kind": "organization", "organizationId": set.organization_id, "secretSetId": set.id })
}

/// A SecretSet, the services it is attached to (by name, with links), its organization's name.
async fn read_set(state: &Host, identity: &Viewer, id: &str) -> Result<(SetView, Vec<ServiceLink>, String)> {
    let detail = call(state, identity, "secrets.getSecretSet", json!({ "id": id })).await?;
    let set = set_view(&detail);
    let ids: Vec<&str> = detail["attachedServiceIds"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    // names are a courtesy: an id stands in for a service that cannot be read
    let names =
        call(state, identity, "services.list", json!({ "organizationId": set.organization_id, "limit": crate::inventory::MAX_PAGE }))
            .await
            .unwrap_or_default();
    let mut services: Vec<ServiceLink> = ids
        .iter()
        .map(|sid| {
            let found = names["items"].as_array().into_iter().flatten().find(|s| str_of(s, "id") == *sid);
            ServiceLink {
                name: found.map(|s| str_of(s, "name").to_string()).unwrap_or_else(|| sid.to_string()),
                href: format!("/secrets/services/{}", encode(sid)),
                state: found.map(|s| str_of(s, "state").to_string()).unwrap_or_default(),
            }
        })
        .collect();
    services.sort_by(|a, b| a.name.cmp(&b.name));
    let organization = match call(state, identity, "organizations.get", json!({ "id": set.organization_id })).await {
        Ok(org) => str_of(&org, "name").to_string(),
        Err(_) => set.organization_id.clone(),
    };
    Ok((set, services, organization))
}

#[allow(clippy::too_many_arguments)]
async fn set_page(
    state: &Host,
    identity: &Viewer,
    id: &str,
    status: StatusCode,
    flash: Option<Flash>,
    typed: Typed,
    set_form: Option<SetTyped>,
    cursor: Option<&str>,
) -> Response {
    let head = live::head(state, identity).await;
    let read = read_set(state, identity, id).await;
    let status = match (&read, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let base = format!("/secrets/sets/{}", encode(id));
    let (set, services, organization, error) = match read {
        Ok((set, services, organization)) => (Some(set), services, organization, None),
        Err(refusal) => (None, Vec::new(), String::new(), Some(ErrorView::from(&refusal))),
    };
    let (seal, seal_error, list) = match &set {
        Some(set) => {
            let owner = set_owner(set);
            let (seal, seal_error) = match seal_view(state, identity, "secrets.create", owner_ref(&owner)).await {
                Ok(seal) => (Some(seal), None),
                Err(refusal) => (None, Some(ErrorView::from(&refusal))),
            };
            (seal, seal_error, list_context(state, identity, owner, &base, cursor).await)
        }
        None => (None, None, context! { secrets => Serde(None::<Vec<SecretRow>>), panel_href => "" }),
    };
    let set_form = set_form.or_else(|| {
        set.as_ref().map(|s| SetTyped {
            name: s.name.clone(),
            description: s.description.clone(),
            expected_revision: s.revision.to_string(),
        })
    });
    let ctx = context! {
        page => set.as_ref().map(|s| format!("SecretSet {}", s.name)).unwrap_or_else(|| "SecretSet".into()),
        nav => Serde(nav(state, "secrets")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(error),
        organization,
        organization_href => set.as_ref().map(|s| format!("/secrets?org={}", encode(&s.organization_id))),
        set => Serde(set),
        services => Serde(services),
        owner_label => "this SecretSet",
        seal => Serde(seal),
        seal_error => Serde(seal_error),
        typed => Serde(typed),
        set_form => Serde(set_form),
        action => base,
        ..context! { ..live::element(head, AREAS), ..list }
    };
    render(status, "secrets_set.html", ctx)
}

/// `GET /secrets/sets/{id}`: the SecretSet, its member secrets, its forms.
pub(super) async fn set(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let query: DoneQuery = query_of(&uri).unwrap_or_default();
    set_page(&state, &identity, &id, StatusCode::OK, done_flash(&query), Typed::default(), None, query.cursor.as_deref()).await
}

/// `GET /secrets/sets/{id}/panel?cursor=`: the member list alone, for htmx.
pub(super) async fn set_panel(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>, uri: Uri) -> Response {
    let query: DoneQuery = query_of(&uri).unwrap_or_default();
    let base = format!("/secrets/sets/{}", encode(&id));
    let ctx = match call(&state, &identity, "secrets.getSecretSet", json!({ "id": id })).await {
        Ok(detail) => list_context(&state, &identity, set_owner(&set_view(&detail)), &base, query.cursor.as_deref()).await,
        Err(refusal) => {
            context! { secrets => Serde(None::<Vec<SecretRow>>), error => Serde(Some(ErrorView::from(&refusal))), panel_href => "" }
        }
    };
    render(StatusCode::OK, "secrets_list.html", context! { owner_label => "this SecretSet", ..ctx })
}

/// `POST /secrets/sets/create` (`organizationId`, `name`, `description`).
pub(super) async fn create_set(State(state): State<Host>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let org = form.text("organizationId").to_string();
    let mut body = json!({ "organizationId": org, "name": form.text("name") });
    if !form.text("description").is_empty() {
        body["description"] = json!(form.text("description"));
    }
    match call(&state, &identity, "secrets.createSecretSet", body).await {
        Ok(created) => redirect(&format!(
            "/secrets/sets/{}?done=set-created&name={}",
            encode(str_of(&created, "id")),
            encode(str_of(&created, "name"))
        )),
        Err(refusal) => {
            let flash = Flash::refused("The SecretSet was not created", &refusal, after_set_refusal(&refusal));
            index_page(&state, &identity, status_of(&refusal), Some(&org), Some(flash), SetTyped::of(&form)).await
        }
    }
}

/// `POST /secrets/sets/{id}/create` (`key`, `environment`, `sealed`): a member secret.
pub(super) async fn create_member(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let result = match (sealed_value(&form), call(&state, &identity, "secrets.getSecretSet", json!({ "id": id })).await) {
        (Ok(value), Ok(detail)) => {
            let mut body = json!({ "owner": set_owner(&set_view(&detail)), "key": form.text("key"), "value": value });
            if !form.text("environment").is_empty() {
                body["environment"] = json!(form.text("environment"));
            }
            call(&state, &identity, "secrets.create", body).await
        }
        (Err(refusal), _) | (_, Err(refusal)) => Err(refusal),
    };
    match result {
        Ok(created) => redirect(&format!("/secrets/sets/{}?done=created&key={}", encode(&id), encode(str_of(&created, "key")))),
        Err(refusal) => {
            let flash = Flash::refused("The secret was not created", &refusal, after_refusal(&refusal));
            set_page(&state, &identity, &id, status_of(&refusal), Some(flash), Typed::of(&form), None, None).await
        }
    }
}

/// `POST /secrets/sets/{id}/update` (`expectedRevision`, `name`, `description`).
pub(super) async fn update_set(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let body = json!({
        "id": id,
        "expectedRevision": number(form.text("expectedRevision")),
        "name": form.text("name"),
        "description": form.raw("description").trim(),
    });
    match call(&state, &identity, "secrets.updateSecretSet", body).await {
        Ok(updated) => redirect(&format!("/secrets/sets/{}?done=set-updated&name={}", encode(&id), encode(str_of(&updated, "name")))),
        Err(refusal) => {
            let mut typed = SetTyped::of(&form);
            if refusal.is("conflict")
                && let Some(revision) = refusal.data.as_ref().and_then(|d| d.get("revision")).and_then(Value::as_u64)
            {
                typed.expected_revision = revision.to_string();
            }
            let flash = Flash::refused("The SecretSet was not changed", &refusal, after_set_refusal(&refusal));
            set_page(&state, &identity, &id, status_of(&refusal), Some(flash), Typed::default(), Some(typed), None).await
        }
    }
}

async fn retire_page(state: &Host, identity: &Viewer, id: &str, status: StatusCode, flash: Option<Flash>, typed: &str) -> Response {
    let read = read_set(state, identity, id).await;
    let status = match (&read, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let (set, services, error) = match read {
        Ok((set, services, _)) => (Some(set), services, None),
        Err(refusal) => (None, Vec::new(), Some(ErrorView::from(&refusal))),
    };
    let ctx = context! {
        page => set.as_ref().map(|s| format!("Retire SecretSet {}", s.name)).unwrap_or_else(|| "Retire a SecretSet".into()),
        nav => Serde(nav(state, "secrets")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(error),
        back => set.as_ref().map(|s| s.href.clone()).unwrap_or_else(|| "/secrets".into()),
        action => format!("/secrets/sets/{}/retire", encode(id)),
        set => Serde(set),
        services => Serde(services),
        typed => typed.chars().take(200).collect::<String>(),
    };
    render(status, "secrets_set_retire.html", ctx)
}

/// `GET /secrets/sets/{id}/retire`: the confirmation step.
pub(super) async fn confirm_retire(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>) -> Response {
    retire_page(&state, &identity, &id, StatusCode::OK, None, "").await
}

/// `POST /secrets/sets/{id}/retire` (`expectedRevision`, `confirm`: the set's name).
pub(super) async fn retire(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let title = "The SecretSet was not retired";
    let typed = form.text("confirm");
    let current = match call(&state, &identity, "secrets.getSecretSet", json!({ "id": id })).await {
        Ok(current) => current,
        Err(refusal) => {
            let flash = Flash::refused(title, &refusal, "");
            return retire_page(&state, &identity, &id, status_of(&refusal), Some(flash), typed).await;
        }
    };
    let name = str_of(&current, "name");
    if typed != name {
        let refusal = Refusal::new("confirmation-mismatch", format!("type the SecretSet's name, {name}, to confirm its retirement"))
            .with_data(json!({ "field": "confirm" }));
        let flash = Flash::refused(title, &refusal, "Nothing was retired.");
        return retire_page(&state, &identity, &id, StatusCode::BAD_REQUEST, Some(flash), typed).await;
    }
    let body = json!({ "id": id, "expectedRevision": number(form.text("expectedRevision")) });
    match call(&state, &identity, "secrets.retireSecretSet", body).await {
        Ok(retired) => {
            let detached = retired["detachedServiceIds"].as_array().map_or(0, Vec::len);
            redirect(&format!("/secrets/sets/{}?done=set-retired&name={}&detached={detached}", encode(&id), encode(name)))
        }
        Err(refusal) => {
            let flash = Flash::refused(title, &refusal, after_set_refusal(&refusal));
            retire_page(&state, &identity, &id, status_of(&refusal), Some(flash), typed).await
        }
    }
}

// ---------------------------------------------------------------------------------------
// One secret: rotation and revocation

/// Where a secret's owner is shown: its page and its name there.
#[derive(Serialize)]
struct OwnerView {
    kind: String,
    label: String,
    href: String,
}

fn owner_view(secret: &Value) -> OwnerView {
    let owner = &secret["owner"];
    match str_of(owner, "kind") {
        "service" => OwnerView {
            kind: "service".into(),
            label: format!("service {}", str_of(owner, "serviceId")),
            href: format!("/secrets/services/{}", encode(str_of(owner, "serviceId"))),
        },
        "organization" if owner.get("secretSetId").is_some() => OwnerView {
            kind: "secretSet".into(),
            label: format!("SecretSet {}", str_of(owner, "secretSetId")),
            href: format!("/secrets/sets/{}", encode(str_of(owner, "secretSetId"))),
        },
        kind => OwnerView { kind: kind.into(), label: str_of(secret, "ownerRef").into(), href: "/secrets".into() },
    }
}

#[derive(Serialize)]
struct VersionRow {
    id: String,
    number: u64,
    source: String,
    created_at: String,
    created_iso: String,
    created_by: String,
    current: bool,
}

/// A secret's page context: its metadata, its owner, its version history.
struct SecretRead {
    row: SecretRow,
    owner: OwnerView,
    owner_ref: String,
    history: Vec<VersionRow>,
}

async fn read_secret(state: &Host, identity: &Viewer, id: &str) -> Result<SecretRead> {
    let detail = call(state, identity, "secrets.get", json!({ "id": id })).await?;
    let row = secret_row(&detail);
    let history = detail["versionHistory"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let (created_at, created_iso) = when(u64_of(v, "createdAt"));
            VersionRow {
                id: str_of(v, "id").into(),
                number: u64_of(v, "number"),
                source: str_of(v, "source").into(),
                created_at,
                created_iso,
                created_by: str_of(v, "createdBy").into(),
                current: str_of(v, "id") == row.current_version_id,
            }
        })
        .collect();
    // the owner by name where it can be read (its id stands in otherwise)
    let mut owner = owner_view(&detail);
    let named = match owner.kind.as_str() {
        "service" => call(state, identity, "services.get", json!({ "id": detail["owner"]["serviceId"] })).await.ok(),
        "secretSet" => call(state, identity, "secrets.getSecretSet", json!({ "id": detail["owner"]["secretSetId"] })).await.ok(),
        _ => None,
    };
    if let Some(name) = named.as_ref().map(|n| str_of(n, "name")).filter(|n| !n.is_empty()) {
        owner.label = if owner.kind == "service" { format!("service {name}") } else { format!("SecretSet {name}") };
    }
    Ok(SecretRead { owner, owner_ref: str_of(&detail, "ownerRef").into(), row, history })
}

#[allow(clippy::too_many_arguments)]
async fn secret_page(
    state: &Host,
    identity: &Viewer,
    id: &str,
    template: &str,
    status: StatusCode,
    flash: Option<Flash>,
    expected_version: Option<String>,
    typed_key: &str,
) -> Response {
    let read = read_secret(state, identity, id).await;
    let status = match (&read, status) {
        (Err(refusal), StatusCode::OK) => status_of(refusal),
        _ => status,
    };
    let (secret, error) = match read {
        Ok(read) => (Some(read), None),
        Err(refusal) => (None, Some(ErrorView::from(&refusal))),
    };
    let (seal, seal_error) = match &secret {
        Some(read) if template == "secrets_rotate.html" => {
            match seal_view(state, identity, "secrets.rotate", Ok(read.owner_ref.clone())).await {
                Ok(seal) => (Some(seal), None),
                Err(refusal) => (None, Some(ErrorView::from(&refusal))),
            }
        }
        _ => (None, None),
    };
    let verb = if template == "secrets_rotate.html" { "Rotate" } else { "Revoke" };
    let ctx = context! {
        page => secret.as_ref().map(|s| format!("{verb} {}", s.row.key)).unwrap_or_else(|| format!("{verb} a secret")),
        nav => Serde(nav(state, "secrets")),
        user => Serde(user_view(identity)),
        flash => Serde(flash),
        error => Serde(error),
        expected_version => expected_version.or_else(|| secret.as_ref().map(|s| s.row.current_version_id.clone())),
        back => secret.as_ref().map(|s| s.owner.href.clone()).unwrap_or_else(|| "/secrets".into()),
        owner => Serde(secret.as_ref().map(|s| &s.owner)),
        history => Serde(secret.as_ref().map(|s| &s.history)),
        secret => Serde(secret.as_ref().map(|s| &s.row)),
        seal => Serde(seal),
        seal_error => Serde(seal_error),
        typed_key => typed_key.chars().take(200).collect::<String>(),
        action => format!("/secrets/{}/{}", encode(id), verb.to_ascii_lowercase()),
    };
    render(status, template, ctx)
}

/// `GET /secrets/{id}/rotate`: the secret's facts and a form for its next version.
pub(super) async fn rotate_page(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>) -> Response {
    secret_page(&state, &identity, &id, "secrets_rotate.html", StatusCode::OK, None, None, "").await
}

/// `POST /secrets/{id}/rotate` (`expectedVersionId`, `sealed`).
pub(super) async fn rotate(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let expected = form.text("expectedVersionId").chars().take(100).collect::<String>();
    let result = match sealed_value(&form) {
        Ok(value) => call(&state, &identity, "secrets.rotate", json!({ "id": id, "expectedVersionId": expected, "value": value })).await,
        Err(refusal) => Err(refusal),
    };
    match result {
        Ok(rotated) => redirect(&format!("{}?done=rotated&key={}", owner_view(&rotated).href, encode(str_of(&rotated, "key")))),
        Err(refusal) => {
            let flash = Flash::refused("The secret was not rotated", &refusal, after_refusal(&refusal));
            // after a conflict the form states the version read now; otherwise the one sent
            let expected = if refusal.is("conflict") { None } else { Some(expected) };
            secret_page(&state, &identity, &id, "secrets_rotate.html", status_of(&refusal), Some(flash), expected, "").await
        }
    }
}

/// `GET /secrets/{id}/revoke`: the confirmation step.
pub(super) async fn revoke_page(State(state): State<Host>, Signed(identity): Signed, Path(id): Path<String>) -> Response {
    secret_page(&state, &identity, &id, "secrets_revoke.html", StatusCode::OK, None, None, "").await
}

/// `POST /secrets/{id}/revoke` (`confirm`: the secret's key).
pub(super) async fn revoke(State(state): State<Host>, Path(id): Path<String>, request: Request) -> Response {
    let (identity, form) = match post(&state, request).await {
        Ok(posted) => posted,
        Err(response) => return response,
    };
    let title = "The secret was not revoked";
    let typed = form.text("confirm");
    let refused = |status: StatusCode, refusal: &Refusal, after: &str| {
        let flash = Flash::refused(title, refusal, after);
        secret_page(&state, &identity, &id, "secrets_revoke.html", status, Some(flash), None, typed)
    };
    let current = match call(&state, &identity, "secrets.get", json!({ "id": id })).await {
        Ok(current) => current,
        Err(refusal) => return refused(status_of(&refusal), &refusal, "").await,
    };
    let key = str_of(&current, "key");
    if typed != key {
        let refusal = Refusal::new("confirmation-mismatch", format!("type the secret's key, {key}, to confirm its revocation"))
            .with_data(json!({ "field": "confirm" }));
        return refused(StatusCode::BAD_REQUEST, &refusal, "Nothing was revoked.").await;
    }
    match call(&state, &identity, "secrets.revoke", json!({ "id": id })).await {
        Ok(revoked) => redirect(&format!("{}?done=revoked&key={}", owner_view(&revoked).href, encode(str_of(&revoked, "key")))),
        Err(refusal) => refused(status_of(&refusal), &refusal, after_refusal(&refusal)).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_server::secrets::ingress;

    /// seal.js builds the target and the AAD with `JSON.stringify` of objects whose keys are
    /// in this order; the server's canonical forms must be exactly these bytes.
    #[test]
    fn the_target_and_aad_are_the_bytes_the_browser_builds() {
        assert_eq!(
            ingress::target("secrets.create", "service:svc_1", "DB_PASSWORD"),
            r#"{"method":"secrets.create","owner":"service:svc_1","key":"DB_PASSWORD"}"#
        );
        let script =
            std::str::from_utf8(super::super::assets::ASSETS.iter().find(|a| a.path == "seal.js").expect("seal.js is embedded").bytes)
                .unwrap();
        assert!(script.contains("JSON.stringify({ method: method, owner: owner, key: key })"), "seal.js builds the target in order");
        assert!(script.contains("JSON.stringify({ profile: PROFILE, recipientId: recipientId, target: target })"));
        assert!(
            script.contains(r#"var PROFILE = "capstan-sealed-input-v1";"#) && script.contains(r#"var INFO = "capstan sealed input v1";"#)
        );
    }

    #[test]
    fn keys_from_links_are_plain() {
        assert_eq!(shown_key(Some("DB_PASSWORD")).as_deref(), Some("DB_PASSWORD"));
        assert_eq!(shown_key(Some("<b>")), None);
        assert_eq!(shown_key(Some("")), None);
        let form = FormData(vec![("sealed".into(), "  ".into())]);
        assert_eq!(sealed_value(&form).unwrap_err().code, NOT_SEALED);
        let form = FormData(vec![("sealed".into(), "not json".into())]);
        assert_eq!(sealed_value(&form).unwrap_err().code, "sealed-input-invalid");
        let form = FormData(vec![("sealed".into(), r#"{"profile":"x"}"#.into())]);
        assert_eq!(sealed_value(&form).unwrap(), json!({"sealed": {"profile": "x"}}));
    }
}
