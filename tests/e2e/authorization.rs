//! The authorization matrix: every method `GET /api/v1/methods` lists (the host's and the
//! first-party plugins') against every kind of caller, each cell's answer declared once below.
//! A method listed without a row, or a row naming a method no longer listed, fails the test.
//!
//! Bodies name the fixture's entities (see [`Identities`]) and are chosen so that no cell
//! changes what another cell sees: mutations state a revision nobody holds (`conflict`), create
//! what already exists (`exists`), or name things that do not exist.

use crate::support::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// What one caller gets from one method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    /// 200: the method ran.
    Ran,
    /// Past authorization, refused by the method's own rules with this code.
    Past(&'static str),
    /// 403 `forbidden`.
    Denied,
    /// 404 with this code, as if the entity did not exist: the caller may not know it does.
    Hidden(&'static str),
    /// 401 `unauthenticated`: this method needs a token.
    Anon,
}

use Cell::*;

/// One answer per kind, in [`Kind::ALL`] order: administrator, owner, member, stranger, cluster
/// machine, deployer, anonymous.
type Cells = [Cell; 7];

/// A human administrator's method: anyone else is denied.
const fn admin(answer: Cell) -> Cells {
    [answer, Denied, Denied, Denied, Denied, Denied, Anon]
}

/// An owner of the fixture's organization (or an administrator): its members and everyone else
/// are denied.
const fn owner(answer: Cell) -> Cells {
    [answer, answer, Denied, Denied, Denied, Denied, Anon]
}

/// A member of the fixture's organization (or an administrator).
const fn member(answer: Cell) -> Cells {
    [answer, answer, answer, Denied, Denied, Denied, Anon]
}

/// Any caller with a token.
const fn signed_in(answer: Cell) -> Cells {
    [answer, answer, answer, answer, answer, answer, Anon]
}

/// A person (administrator, owner, member, stranger); a machine is refused as one.
const fn person(answer: Cell) -> Cells {
    let machine = Past("hosted-oidc-human-required");
    [answer, answer, answer, answer, machine, machine, Anon]
}

/// Anyone, with a token or without.
const fn anyone(answer: Cell) -> Cells {
    [answer; 7]
}

// Placeholders a body names the fixture by (see `fill`).
const ORG: &str = "$organization";
const SERVICE: &str = "$service";
const CLUSTER: &str = "$cluster";
const MEMBER: &str = "$member";
const MEMBER_PASSWORD: &str = "$member-password";
const DEPLOYER: &str = "$deployer";
const DEPLOYER_TOKEN: &str = "$deployer-token";

/// How a read's name begins (`backups.overview`, `appstore.listApps`, `secrets.preview`).
const READ_VERBS: [&str; 6] = ["get", "list", "overview", "preview", "check", "count"];

/// A revision or generation nobody holds: a mutation stating it changes nothing.
const STALE: u64 = 999;

/// The matrix: method, body, and what each kind of caller gets.
fn rows() -> Vec<(&'static str, Value, Cells)> {
    // the member may read the service and the deployer holds deployment:status on it: a write
    // refuses them `forbidden`; a caller that may not read it learns nothing (`Hidden`)
    let hidden_service = Hidden("service-not-found");
    vec![
        // ---- auth: public and signed-in ----
        ("auth.login", json!({ "username": "member", "password": MEMBER_PASSWORD }), anyone(Ran)),
        ("auth.exchangeToken", json!({ "token": DEPLOYER_TOKEN }), anyone(Ran)),
        ("auth.whoami", json!({}), signed_in(Ran)),
        // the platform login: this host has no identity provider configured
        ("federation.getStatus", json!({}), anyone(Ran)),
        ("federation.completeLogin", json!({ "handoff": "0", "verifier": "v" }), anyone(Past("platform-oidc-off"))),
        // a valid body would end the caller's session for the cells after it; an unknown field
        // is refused once the caller is authenticated, before the handler runs
        ("auth.logout", json!({ "matrix": true }), signed_in(Past("invalid-request"))),
        // ---- hosted apps' single sign-on (the fixture's service declares none) ----
        ("apps.getAccess", json!({ "serviceId": SERVICE }), admin(Ran)),
        ("apps.setOidc", json!({ "serviceId": SERVICE, "enabled": true }), admin(Past("hosted-app-oidc-undeclared"))),
        ("apps.assignRole", json!({ "serviceId": SERVICE, "userId": MEMBER, "role": "x" }), admin(Past("hosted-oidc-client-unknown"))),
        ("hostedOidc.rotateSigningKey", json!({}), admin(Ran)),
        ("hostedOidc.getAuthorization", json!({ "requestId": "req-missing" }), person(Past("hosted-oidc-request-unknown"))),
        ("hostedOidc.completeAuthorization", json!({ "requestId": "req-missing" }), person(Past("hosted-oidc-request-unknown"))),
        ("hostedOidc.cancelAuthorization", json!({ "requestId": "req-missing" }), person(Past("hosted-oidc-request-unknown"))),
        // ---- administrators' accounts ----
        ("admin.createMachineUser", json!({ "username": "deployer" }), admin(Past("exists"))),
        ("admin.createUser", json!({ "username": "member" }), admin(Past("exists"))),
        ("admin.getHumanCredential", json!({ "userId": MEMBER }), admin(Ran)),
        ("admin.listMachineUsers", json!({}), admin(Ran)),
        (
            "admin.mutateHumanCredential",
            json!({ "userId": MEMBER, "expectedGeneration": STALE, "mutationId": "matrix", "operation": { "revokeSessions": {} } }),
            admin(Past("conflict")),
        ),
        ("admin.revokeMachineTokens", json!({ "userId": "machine_missing" }), admin(Past("not-found"))),
        ("admin.rotateMachineToken", json!({ "userId": "machine_missing" }), admin(Past("not-found"))),
        // ---- people ----
        ("users.list", json!({}), admin(Ran)),
        ("users.resetPassword", json!({ "userId": MEMBER, "expectedGeneration": STALE }), admin(Past("conflict"))),
        ("users.revokeSessions", json!({ "userId": MEMBER, "expectedGeneration": STALE }), admin(Past("conflict"))),
        ("users.setDisabled", json!({ "userId": MEMBER, "disabled": true, "expectedGeneration": STALE }), admin(Past("conflict"))),
        // ---- clusters ----
        ("clusters.create", json!({ "name": "fixture" }), admin(Past("exists"))),
        ("clusters.delete", json!({ "id": CLUSTER, "expectedRevision": STALE }), admin(Past("conflict"))),
        ("clusters.disableRelay", json!({ "id": CLUSTER, "expectedRevision": STALE }), admin(Past("conflict"))),
        ("clusters.enableRelay", json!({ "id": CLUSTER, "expectedRevision": STALE }), admin(Past("conflict"))),
        ("clusters.get", json!({ "id": CLUSTER }), admin(Ran)),
        ("clusters.getRuntime", json!({ "id": CLUSTER }), admin(Ran)),
        ("clusters.list", json!({}), admin(Ran)),
        ("clusters.setRuntimePhase", json!({ "id": CLUSTER, "phase": "pallet", "expectedGeneration": STALE }), admin(Past("conflict"))),
        ("clusters.update", json!({ "id": CLUSTER, "expectedRevision": STALE, "name": "renamed" }), admin(Past("conflict"))),
        // ---- cluster relays ----
        (
            "relays.exportAuthorization",
            json!({ "clusterId": "cluster_missing", "expectedGeneration": 1 }),
            admin(Past("cluster-not-found")),
        ),
        ("relays.getCredential", json!({ "clusterId": "cluster_missing" }), admin(Past("cluster-not-found"))),
        ("relays.list", json!({ "clusterIds": ["cluster_missing"] }), admin(Ran)),
        ("relays.ping", json!({ "clusterId": "cluster_missing" }), admin(Past("relay-not-connected"))),
        // a registration belongs to a relay's socket: over HTTP every caller with a token is told so
        ("relays.register", json!({ "nodeId": "node_missing", "sequence": 1, "version": "1" }), signed_in(Past("socket-required"))),
        (
            "relays.mutateCredential",
            json!({ "clusterId": "cluster_missing", "action": "ensure", "mutationId": "matrix-relay-ensure" }),
            admin(Past("cluster-not-found")),
        ),
        // ---- deployers ----
        // only a deployer granted deployment:reserve reserves (the fixture's holds deployment:status)
        (
            "deployments.reserve",
            json!({ "serviceId": SERVICE, "tag": "9.9.9", "mutationId": "matrix" }),
            [
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Denied,
                Anon,
            ],
        ),
        (
            "deployments.promote",
            json!({ "operationId": "dop_missing", "expectedRevision": 1, "expectedServiceRevision": 1 }),
            [
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Hidden("deployment-operation-not-found"),
                Anon,
            ],
        ),
        (
            "deployments.promoteRoute",
            json!({ "operationId": "dop_missing", "expectedRevision": 1 }),
            [
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Hidden("deployment-operation-not-found"),
                Anon,
            ],
        ),
        (
            "deployments.retry",
            json!({ "operationId": "dop_missing", "expectedRevision": 1 }),
            [
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Past("deployment-identity-required"),
                Hidden("deployment-operation-not-found"),
                Anon,
            ],
        ),
        ("deployments.getPreflight", json!({ "phase": "promote", "operationId": "dop_missing" }), signed_in(Ran)),
        ("deployments.getStatus", json!({ "operationId": "dop_missing" }), signed_in(Hidden("deployment-operation-not-found"))),
        // a service's operations: whoever may read the service (the fixture's deployer holds deployment:status)
        ("deployments.list", json!({ "serviceId": SERVICE }), [Ran, Ran, Ran, hidden_service, hidden_service, Ran, Anon]),
        // a rollback: deployers granted deployment:promote and administrators; the fixture keeps no release
        (
            "deployments.rollback",
            json!({ "serviceId": SERVICE, "release": "9.9.9", "expectedServiceRevision": 1 }),
            [Past("release-not-kept"), Denied, Denied, hidden_service, hidden_service, Denied, Anon],
        ),
        (
            "deployments.cleanup",
            json!({ "operationId": "dop_missing", "expectedRevision": 1 }),
            signed_in(Hidden("deployment-operation-not-found")),
        ),
        ("deployers.create", json!({ "username": "deployer" }), admin(Past("exists"))),
        // the grant the fixture already holds: granting it again changes nothing
        ("deployers.grant", json!({ "serviceId": SERVICE, "userId": DEPLOYER, "capabilities": ["deployment:status"] }), admin(Ran)),
        ("deployers.list", json!({}), admin(Ran)),
        ("deployers.revoke", json!({ "serviceId": SERVICE, "userId": "machine_missing" }), admin(Ran)),
        ("deployers.revokeToken", json!({ "userId": "machine_missing" }), admin(Past("deployment-machine-user-invalid"))),
        ("deployers.rotateToken", json!({ "userId": "machine_missing" }), admin(Past("deployment-machine-user-invalid"))),
        // ---- the audit log ----
        ("audit.list", json!({}), admin(Ran)),
        // ---- events, fleet, migrations, system ----
        ("events.head", json!({}), signed_in(Ran)),
        ("events.watch", json!({ "after": 0, "areas": ["service"], "waitMs": 0 }), signed_in(Ran)),
        ("fleet.freeze", json!({"reason": ""}), admin(Past("invalid-request"))),
        ("fleet.listNodes", json!({}), admin(Ran)),
        ("fleet.rebalance", json!({}), admin(Ran)),
        ("fleet.unfreeze", json!({}), admin(Ran)),
        (
            "gateway.bootstrapCredential",
            json!({
                "expectedGatewayUrl": "https://gateway.example", "expectedGatewayClientId": "capstan",
                "sealedAdminToken": {
                    "profile": "capstan-sealed-input-v1", "recipientId": "r", "ephemeralPublicKey": "AA==", "nonce": "AA==", "ciphertext": "AA==",
                },
            }),
            admin(Past("gateway-unconfigured")),
        ),
        ("gateway.getEnrollmentState", json!({}), admin(Ran)),
        ("migrations.getStatus", json!({}), anyone(Ran)),
        // a snapshot of the fixture's host into its bucket: nothing another cell reads changes
        ("system.createSnapshot", json!({}), admin(Ran)),
        ("system.getStatus", json!({}), anyone(Ran)),
        ("system.getVersion", json!({}), anyone(Ran)),
        // ---- nodes (a node nobody enrolled: nothing changes) ----
        ("nodes.createJumpCommand", json!({ "clusterId": "cls_missing" }), admin(Past("cluster-not-found"))),
        ("nodes.delete", json!({ "id": "node_missing", "expectedRevision": STALE }), admin(Past("node-missing"))),
        ("nodes.get", json!({ "id": "node_missing" }), admin(Past("node-missing"))),
        ("nodes.getCredential", json!({ "nodeId": "node_missing" }), admin(Past("node-missing"))),
        ("nodes.getDeletionImpact", json!({ "id": "node_missing" }), admin(Past("node-missing"))),
        ("nodes.list", json!({ "clusterId": CLUSTER }), admin(Ran)),
        ("nodes.resetHostname", json!({ "nodeId": "node_missing", "expectedGeneration": STALE }), admin(Past("node-missing"))),
        ("nodes.retire", json!({ "id": "node_missing", "expectedRevision": STALE }), admin(Past("node-missing"))),
        (
            "nodes.revokeCredential",
            json!({ "nodeId": "node_missing", "expectedGeneration": STALE, "mutationId": "mut_matrix" }),
            admin(Past("node-missing")),
        ),
        (
            "nodes.rotateCredential",
            json!({ "nodeId": "node_missing", "tokenSha256": "0".repeat(64), "expectedGeneration": STALE, "mutationId": "mut_matrix" }),
            admin(Past("node-missing")),
        ),
        (
            "nodes.setHostname",
            json!({ "nodeId": "node_missing", "expectedGeneration": STALE, "hostname": "matrix" }),
            admin(Past("node-missing")),
        ),
        // ---- organizations ----
        ("organizations.create", json!({ "name": "fixture" }), admin(Past("exists"))),
        ("organizations.delete", json!({ "id": ORG, "expectedRevision": STALE }), admin(Past("conflict"))),
        ("organizations.get", json!({ "id": ORG }), [Ran, Ran, Ran, Denied, Denied, Denied, Anon]),
        ("organizations.list", json!({}), signed_in(Ran)),
        (
            "organizations.linkIdentityProvider",
            json!({ "id": ORG, "expectedRevision": STALE, "identityProviderOrganization": "org-matrix" }),
            admin(Past("conflict")),
        ),
        ("organizations.listMembers", json!({ "organizationId": ORG }), [Ran, Ran, Ran, Denied, Denied, Denied, Anon]),
        // the role the member already holds
        (
            "organizations.setMember",
            json!({ "organizationId": ORG, "userId": MEMBER, "role": "member" }),
            [Ran, Ran, Denied, Denied, Denied, Denied, Anon],
        ),
        (
            "organizations.update",
            json!({ "id": ORG, "expectedRevision": STALE, "name": "renamed" }),
            [Past("conflict"), Past("conflict"), Denied, Denied, Denied, Denied, Anon],
        ),
        // ---- plugins ----
        ("plugins.addTrustedPublisher", json!({ "publicKey": "not-a-key", "name": "matrix" }), admin(Past("publisher-key-invalid"))),
        ("plugins.disable", json!({ "id": "missing" }), admin(Past("not-found"))),
        ("plugins.discardUpload", json!({ "upload": "missing" }), admin(Past("invalid-request"))),
        ("plugins.enable", json!({ "id": "missing" }), admin(Past("not-found"))),
        ("plugins.get", json!({ "id": "appstore" }), admin(Ran)),
        ("plugins.inspectUpload", json!({ "upload": "missing" }), admin(Past("invalid-request"))),
        ("plugins.install", json!({ "upload": "missing", "approve": [] }), admin(Past("invalid-request"))),
        ("plugins.list", json!({}), admin(Ran)),
        ("plugins.listCommands", json!({}), signed_in(Ran)),
        ("plugins.listTrustedPublishers", json!({}), admin(Ran)),
        ("plugins.rebindPublisher", json!({ "id": "missing", "publicKey": "not-a-key" }), admin(Past("publisher-key-invalid"))),
        ("plugins.removeTrustedPublisher", json!({ "publicKey": "not-a-key" }), admin(Past("publisher-key-invalid"))),
        ("plugins.rollback", json!({ "id": "missing" }), admin(Past("not-found"))),
        ("plugins.uninstall", json!({ "id": "missing" }), admin(Past("not-found"))),
        ("plugins.upgrade", json!({ "upload": "missing", "approve": [] }), admin(Past("invalid-request"))),
        // ---- secrets ----
        (
            "secrets.attachSecretSet",
            json!({ "serviceId": SERVICE, "secretSetId": "set_missing", "expectedSecretsRevision": STALE }),
            admin(Past("conflict")),
        ),
        (
            "secrets.create",
            json!({ "owner": { "kind": "service", "serviceId": "svc_missing" }, "key": "MATRIX",
                    "value": { "generate": { "length": 32, "alphabet": "hex" } } }),
            admin(Past("service-not-found")),
        ),
        ("secrets.createSecretSet", json!({ "organizationId": "org_missing", "name": "matrix" }), admin(Past("organization-not-found"))),
        (
            "secrets.detachSecretSet",
            json!({ "serviceId": SERVICE, "secretSetId": "set_missing", "expectedSecretsRevision": STALE }),
            admin(Past("conflict")),
        ),
        ("secrets.get", json!({ "id": "secret_missing" }), admin(Past("secret-not-found"))),
        ("secrets.getIngressRecipient", json!({}), signed_in(Ran)),
        ("secrets.getManifest", json!({ "serviceId": SERVICE }), admin(Ran)),
        ("secrets.getSecretSet", json!({ "id": "set_missing" }), admin(Past("secret-set-not-found"))),
        ("secrets.getServiceConfiguration", json!({ "serviceId": SERVICE }), admin(Ran)),
        ("secrets.list", json!({}), admin(Ran)),
        ("secrets.listSecretSets", json!({}), admin(Ran)),
        ("secrets.previewResolution", json!({ "serviceId": SERVICE }), admin(Ran)),
        ("secrets.preview", json!({ "serviceId": SERVICE }), admin(Ran)),
        ("secrets.retireSecretSet", json!({ "id": "set_missing", "expectedRevision": STALE }), admin(Past("secret-set-not-found"))),
        ("secrets.revoke", json!({ "id": "secret_missing" }), admin(Past("secret-not-found"))),
        ("secrets.rewrap", json!({ "limit": 1 }), admin(Ran)),
        (
            "secrets.rotate",
            json!({ "id": "secret_missing", "expectedVersionId": "version_missing",
                    "value": { "generate": { "length": 32, "alphabet": "hex" } } }),
            admin(Past("secret-not-found")),
        ),
        ("secrets.updateSecretSet", json!({ "id": "set_missing", "expectedRevision": STALE }), admin(Past("secret-set-not-found"))),
        // ---- services ----
        (
            "services.create",
            json!({ "name": "web", "organizationId": ORG, "image": "nginx:1.27" }),
            [Past("exists"), Past("exists"), Denied, Denied, Denied, Denied, Anon],
        ),
        (
            "services.delete",
            json!({ "id": SERVICE, "expectedRevision": STALE }),
            [Past("conflict"), Past("conflict"), Denied, hidden_service, hidden_service, Denied, Anon],
        ),
        // the service's repository, to whoever may read the service
        ("registry.getServiceTarget", json!({ "serviceId": SERVICE }), [Ran, Ran, Ran, hidden_service, hidden_service, Ran, Anon]),
        ("services.get", json!({ "id": SERVICE }), [Ran, Ran, Ran, hidden_service, hidden_service, Ran, Anon]),
        ("services.list", json!({ "organizationId": ORG }), [Ran, Ran, Ran, Denied, Denied, Denied, Anon]),
        (
            "services.update",
            json!({ "id": SERVICE, "expectedRevision": STALE, "scale": 1 }),
            [Past("conflict"), Past("conflict"), Denied, hidden_service, hidden_service, Denied, Anon],
        ),
        // ---- the runtime: where services run ----
        (
            "runtime.setServiceSpec",
            json!({ "serviceId": SERVICE, "clusterId": CLUSTER, "expectedRevision": STALE, "placement": { "everyNode": true }, "replicasPerNode": 1 }),
            [Past("conflict"), Past("conflict"), Denied, hidden_service, hidden_service, Denied, Anon],
        ),
        ("runtime.getServiceSpec", json!({ "serviceId": SERVICE }), [Ran, Ran, Ran, hidden_service, hidden_service, Ran, Anon]),
        (
            "runtime.deleteServiceSpec",
            json!({ "serviceId": SERVICE, "clusterId": CLUSTER, "expectedRevision": STALE }),
            [Past("spec-not-found"), Past("spec-not-found"), Denied, hidden_service, hidden_service, Denied, Anon],
        ),
        ("runtime.getServiceStatus", json!({ "serviceId": SERVICE }), [Ran, Ran, Ran, hidden_service, hidden_service, Ran, Anon]),
        ("runtime.getLogAttempts", json!({ "serviceId": SERVICE }), [Ran, Ran, Ran, hidden_service, hidden_service, Ran, Anon]),
        // a follow is a socket session's: over HTTP it is refused before anything is read
        ("runtime.followLogs", json!({ "serviceId": SERVICE, "assignmentId": "asg_missing" }), signed_in(Past("socket-required"))),
        ("runtime.unfollowLogs", json!({ "followId": "flw_missing" }), signed_in(Past("socket-required"))),
        ("runtime.getServiceEvents", json!({ "serviceId": SERVICE }), [Ran, Ran, Ran, hidden_service, hidden_service, Ran, Anon]),
        (
            "runtime.getLogs",
            json!({ "serviceId": SERVICE, "assignmentId": "asg_missing" }),
            [
                Past("attempt-not-found"),
                Past("attempt-not-found"),
                Past("attempt-not-found"),
                hidden_service,
                hidden_service,
                Past("attempt-not-found"),
                Anon,
            ],
        ),
        ("runtime.getServiceAssignments", json!({ "serviceId": SERVICE }), [Ran, Ran, Ran, hidden_service, hidden_service, Ran, Anon]),
        ("runtime.getClusterAssignments", json!({ "clusterId": CLUSTER }), admin(Ran)),
        // a node's runtime methods are answered over its socket session only
        ("runtime.registerSession", json!({}), signed_in(Past("socket-required"))),
        ("runtime.enrollRecipient", json!({}), signed_in(Past("socket-required"))),
        ("runtime.proveRecipient", json!({}), signed_in(Past("socket-required"))),
        ("runtime.reportObservation", json!({}), signed_in(Past("socket-required"))),
        ("runtime.reportReceipt", json!({}), signed_in(Past("socket-required"))),
        ("runtime.reportLogs", json!({}), signed_in(Past("socket-required"))),
        // ---- settings ----
        ("settings.get", json!({}), signed_in(Ran)),
        ("settings.update", json!({ "expectedRevision": STALE }), admin(Past("conflict"))),
        // ---- tasks ----
        ("tasks.cancel", json!({ "executionId": "missing" }), admin(Past("execution-not-found"))),
        ("tasks.get", json!({ "id": "host.cleanup" }), admin(Ran)),
        ("tasks.getExecution", json!({ "id": "missing" }), admin(Past("execution-not-found"))),
        ("tasks.list", json!({}), admin(Ran)),
        ("tasks.listExecutions", json!({ "taskId": "host.cleanup" }), admin(Ran)),
        // the state the task is already in
        ("tasks.setEnabled", json!({ "id": "host.cleanup", "enabled": true }), admin(Ran)),
        ("tasks.trigger", json!({ "id": "missing.task" }), admin(Past("task-not-found"))),
        // ---- the backups plugin (the fixture's service has no volumes, its cluster no node) ----
        ("backups.create", json!({ "organizationId": ORG, "serviceId": "svc_missing" }), owner(Past("service-not-found"))),
        ("backups.get", json!({ "organizationId": ORG, "backupId": "bkp_missing" }), member(Past("backup-not-found"))),
        ("backups.getRestore", json!({ "organizationId": ORG, "restoreId": "rst_missing" }), member(Past("restore-not-found"))),
        ("backups.list", json!({ "organizationId": ORG }), member(Ran)),
        ("backups.overview", json!({}), admin(Ran)),
        ("backups.replicate", json!({ "organizationId": ORG, "backupId": "bkp_missing" }), owner(Past("backup-not-found"))),
        ("backups.restore", json!({ "organizationId": ORG, "backupId": "bkp_missing" }), owner(Past("backup-not-found"))),
        ("backups.runAll", json!({}), admin(Ran)),
        // ---- the mail plugin (no gateway configured) ----
        ("mail.checkServiceMail", json!({ "organizationId": ORG, "serviceId": "svc_missing" }), owner(Past("service-not-found"))),
        ("mail.getServiceMail", json!({ "organizationId": ORG, "serviceId": SERVICE }), member(Ran)),
        ("mail.listServiceTargets", json!({}), admin(Ran)),
        // ---- the CoreMail plugin (off) ----
        ("coremail.getControlStatus", json!({}), admin(Ran)),
        ("coremail.getServiceMailStatistics", json!({}), admin(Past("coremail-disabled"))),
        // ---- domains (no gateway enrolled) ----
        ("domains.list", json!({}), admin(Ran)),
        ("domains.register", json!({ "name": "Not A Domain" }), admin(Past("domain-invalid"))),
        ("domains.unregister", json!({ "name": "missing.example" }), admin(Ran)),
        ("domains.sync", json!({}), admin(Past("gateway-not-enrolled"))),
        ("domains.listRelayNames", json!({}), admin(Ran)),
        ("domains.publishRelayNames", json!({}), admin(Past("gateway-not-enrolled"))),
        // listed for any caller: a relay name is also its cluster's relay's; any other name an administrator's
        ("domains.fetchCertificate", json!({ "name": "www.acme.example" }), admin(Past("gateway-not-enrolled"))),
        ("nodes.setStorageEndpoint", json!({ "nodeId": "node_missing", "expectedRevision": null }), admin(Past("node-missing"))),
        ("nodes.getStorageEndpoint", json!({ "nodeId": "node_missing" }), admin(Past("node-missing"))),
        // ---- the bindings plugin (its refusals come before any provider is asked) ----
        (
            "bindings.create",
            json!({ "organizationId": ORG, "serviceId": SERVICE, "kind": "database", "engine": "mongodb", "name": "main" }),
            owner(Past("binding-engine-unsupported")),
        ),
        ("bindings.get", json!({ "organizationId": ORG, "bindingId": "bnd_missing" }), member(Past("binding-not-found"))),
        ("bindings.list", json!({ "organizationId": ORG }), member(Ran)),
        ("bindings.delete", json!({ "organizationId": ORG, "bindingId": "bnd_missing", "data": "keep" }), owner(Past("binding-not-found"))),
        // ---- the ingress plugin (nothing designated; the fixture's cluster has no relay) ----
        (
            "ingress.designate",
            json!({ "clusterId": "cluster_missing", "serviceId": "svc_missing", "expectedRevision": 1, "mutationId": "m1" }),
            admin(Past("cluster-not-found")),
        ),
        ("ingress.getDesignation", json!({ "clusterId": "cluster_missing" }), admin(Past("cluster-not-found"))),
        ("ingress.exportBearer", json!({ "clusterId": CLUSTER }), admin(Past("ingress-not-designated"))),
        (
            "ingress.attachService",
            json!({ "clusterId": "cluster_missing", "serviceId": "svc_missing", "address": "127.0.0.1" }),
            admin(Past("cluster-not-found")),
        ),
        ("ingress.detachService", json!({ "serviceId": "svc_missing" }), admin(Ran)),
        ("ingress.listAttachments", json!({ "clusterId": "cluster_missing" }), admin(Past("cluster-not-found"))),
        ("ingress.overview", json!({}), admin(Ran)),
        // only the cluster's relay (its machine user) may register, and no relay is connected
        (
            "ingress.register",
            json!({ "clusterId": CLUSTER, "nodeId": "node_x", "bearer": "b", "version": "1", "relayVersion": "0.1.0" }),
            signed_in(Past("relay-not-connected")),
        ),
        // administrators and the cluster's own machine user read its ingress's environment and table
        (
            "ingress.getEnvironment",
            json!({ "clusterId": CLUSTER, "nodeId": "node_x" }),
            [Past("ingress-not-designated"), Denied, Denied, Denied, Past("ingress-not-designated"), Denied, Anon],
        ),
        ("ingress.getRouteTable", json!({ "clusterId": CLUSTER }), [Ran, Denied, Denied, Denied, Ran, Denied, Anon]),
        // ---- the App Store plugin (no catalog imported: its catalog readers are unavailable) ----
        ("appstore.getAppConfig", json!({ "appId": "missing" }), signed_in(Past("appstore-catalog-unavailable"))),
        ("appstore.getCatalogStatus", json!({}), signed_in(Ran)),
        // the fixture's service is not from the catalog: its status says so
        (
            "appstore.getServiceUpgradeStatus",
            json!({ "organizationId": ORG, "serviceId": SERVICE }),
            [Ran, Ran, Ran, Denied, Denied, Denied, Anon],
        ),
        (
            "appstore.getUpgradePreview",
            json!({ "organizationId": ORG, "serviceId": SERVICE }),
            [
                Past("appstore-catalog-unavailable"),
                Past("appstore-catalog-unavailable"),
                Past("appstore-catalog-unavailable"),
                Denied,
                Denied,
                Denied,
                Anon,
            ],
        ),
        ("appstore.importCatalog", json!({ "envelope": "not an envelope" }), admin(Past("catalog-malformed"))),
        // a body its schema refuses: the demo is not installed on the matrix's host
        ("appstore.installDemo", json!({ "organizationId": 5 }), admin(Past("invalid-request"))),
        (
            "appstore.install",
            json!({ "organizationId": ORG, "appId": "missing", "name": "matrix" }),
            [Past("appstore-catalog-unavailable"), Past("appstore-catalog-unavailable"), Denied, Denied, Denied, Denied, Anon],
        ),
        ("appstore.listApps", json!({}), signed_in(Ran)),
        (
            "appstore.listUpgradeable",
            json!({ "organizationId": ORG }),
            [
                Past("appstore-catalog-unavailable"),
                Past("appstore-catalog-unavailable"),
                Past("appstore-catalog-unavailable"),
                Denied,
                Denied,
                Denied,
                Anon,
            ],
        ),
        ("appstore.refreshCatalog", json!({}), admin(Ran)),
        // the fixture's service was never upgraded: there is nothing to roll back
        (
            "appstore.rollbackUpgrade",
            json!({ "organizationId": ORG, "serviceId": SERVICE, "expectedRevision": 1 }),
            [Past("appstore-rollback-unavailable"), Past("appstore-rollback-unavailable"), Denied, Denied, Denied, Denied, Anon],
        ),
        // without the expectedRevision an upgrade must state
        (
            "appstore.startServiceUpgrade",
            json!({ "organizationId": ORG, "serviceId": SERVICE }),
            [Past("invalid-request"), Past("invalid-request"), Denied, Denied, Denied, Denied, Anon],
        ),
        // without the expectedRevision an upgrade must state
        (
            "appstore.upgrade",
            json!({ "organizationId": ORG, "serviceId": SERVICE }),
            [Past("invalid-request"), Past("invalid-request"), Denied, Denied, Denied, Denied, Anon],
        ),
    ]
}

/// `body` with its placeholders replaced: the fixture's ids, or with `missing` ids of the same
/// shape that name nothing.
fn fill(body: &Value, fixture: &Identities, missing: bool) -> Value {
    match body {
        Value::String(s) => {
            let real = match s.as_str() {
                ORG => &fixture.organization_id,
                SERVICE => &fixture.service_id,
                CLUSTER => &fixture.cluster_id,
                MEMBER => &fixture.member_id,
                MEMBER_PASSWORD => &fixture.member_password,
                DEPLOYER => &fixture.deployer_id,
                DEPLOYER_TOKEN => &fixture.deployer_token,
                _ => return body.clone(),
            };
            match real.split_once('_') {
                Some((prefix, _)) if missing => json!(format!("{prefix}_00000000000000000000000000000000")),
                _ => json!(real),
            }
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| fill(v, fixture, missing)).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), fill(v, fixture, missing))).collect()),
        other => other.clone(),
    }
}

/// `reply` as an outsider reads it: its status and body, the fixture's ids and the missing ids
/// of their shape both written `$id`, its request id left out.
fn as_told(reply: &Reply, fixture: &Identities) -> String {
    fn without_request_ids(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("requestId");
                map.values_mut().for_each(without_request_ids);
            }
            Value::Array(items) => items.iter_mut().for_each(without_request_ids),
            _ => {}
        }
    }
    let mut body = serde_json::from_str(&reply.body).unwrap_or_else(|_| Value::String(reply.body.clone()));
    without_request_ids(&mut body);
    let mut text = body.to_string();
    let ids = [&fixture.organization_id, &fixture.service_id, &fixture.cluster_id, &fixture.member_id, &fixture.deployer_id];
    for id in ids {
        text = text.replace(id.as_str(), "$id");
        if let Some((prefix, _)) = id.split_once('_') {
            text = text.replace(&format!("{prefix}_00000000000000000000000000000000"), "$id");
        }
    }
    format!("{} {text}", reply.status)
}

/// What is wrong with `reply` as the answer `cell` declares, if anything.
fn mismatch(cell: Cell, reply: &Reply) -> Option<String> {
    let got = if reply.status == 200 {
        "200".to_string()
    } else {
        match envelope_error(&reply.json()) {
            Ok(error) => format!("{} {}", reply.status, error["code"].as_str().unwrap_or_default()),
            Err(problem) => return Some(format!("HTTP {}: {problem}", reply.status)),
        }
    };
    let expected = match cell {
        Ran => "200".to_string(),
        Denied => "403 forbidden".to_string(),
        Anon => "401 unauthenticated".to_string(),
        Hidden(code) => format!("404 {code}"),
        // a method's own refusal: any client error, or unavailable (503) if it says so
        Past(code) => match got.split_once(' ') {
            Some((status, got_code)) if got_code == code && (status.starts_with('4') || status == "503") => got.clone(),
            _ => format!("4xx {code}"),
        },
    };
    (got != expected).then(|| format!("expected {expected}, got {got}: {}", reply.body))
}

#[test]
fn every_method_answers_every_kind_of_caller_as_declared() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let listed = server.listed_methods();
    let fixture = Identities::create(&server);
    let rows = rows();

    // the matrix covers exactly what is listed
    let names: BTreeSet<&str> = listed.iter().map(|m| m["name"].as_str().expect("a method name")).collect();
    let declared: BTreeSet<&str> = rows.iter().map(|(name, _, _)| *name).collect();
    assert_eq!(declared.len(), rows.len(), "a method has two rows");
    let unlisted: Vec<_> = declared.difference(&names).collect();
    let undeclared: Vec<_> = names.difference(&declared).collect();
    assert!(
        unlisted.is_empty() && undeclared.is_empty(),
        "the authorization matrix and GET /api/v1/methods disagree:\n  listed without a row (declare who may call them): \
         {undeclared:?}\n  rows for methods no longer listed (remove them): {unlisted:?}"
    );

    // the access each method is listed with agrees with its row
    for method in &listed {
        let name = method["name"].as_str().unwrap();
        let access = method["access"].as_str().unwrap_or_default();
        let cells = rows.iter().find(|(n, _, _)| *n == name).unwrap().2;
        let anonymous_refused = cells[6] == Anon;
        assert_eq!(anonymous_refused, access != "public", "{name} is listed {access}, but its row says anonymous gets {:?}", cells[6]);
        if access == "admin" {
            assert_eq!(cells[1..], admin(Ran)[1..], "{name} is listed admin, but its row lets someone else past");
        }
    }

    let read_only: BTreeSet<&str> = listed.iter().filter(|m| m["readOnly"] == true).filter_map(|m| m["name"].as_str()).collect();
    // a method named as a read is declared read-only, host's and plugins' alike: its calls leave
    // no audit record, and the host refuses it any change (the audit log records what changed)
    let undeclared: Vec<&&str> = names
        .iter()
        .filter(|name| {
            let verb = name.rsplit('.').next().unwrap_or_default();
            READ_VERBS.iter().any(|read| verb.starts_with(read)) && !read_only.contains(*name)
        })
        .collect();
    assert!(
        undeclared.is_empty(),
        "methods named as reads but not declared read-only (declare them, or name them for what they change): {undeclared:?}"
    );
    let mut wrong = Vec::new();
    for (name, body, cells) in &rows {
        for (kind, cell) in Kind::ALL.into_iter().zip(cells) {
            let reply = fixture.call(&server, kind, name, fill(body, &fixture, false).to_string().as_bytes());
            if let Some(problem) = mismatch(*cell, &reply) {
                wrong.push(format!("{name} as {}: {problem}", kind.name()));
            }
        }
        // a caller who holds nothing in the fixture's organization gets the same refusal for
        // an entity that does not exist: a refusal tells nothing about what exists
        let outsiders = [Kind::Stranger, Kind::ClusterMachine, Kind::Anonymous];
        for (kind, cell) in Kind::ALL.into_iter().zip(cells).filter(|(k, _)| outsiders.contains(k)) {
            if matches!(cell, Ran | Past(_)) {
                continue;
            }
            let reply = fixture.call(&server, kind, name, fill(body, &fixture, true).to_string().as_bytes());
            if let Some(problem) = mismatch(*cell, &reply) {
                wrong.push(format!("{name} as {} naming what does not exist: {problem}", kind.name()));
            }
        }
        // a read a person of another organization may make answers the fixture's ids exactly as
        // ids that name nothing: what it says must not tell that they exist (a deployment
        // preflight once listed a foreign service's state and tags). The cluster's machine is
        // no outsider to its own cluster, whose reads it may make.
        if read_only.contains(name) {
            for (kind, _) in Kind::ALL.into_iter().zip(cells).filter(|(k, c)| *k == Kind::Stranger && matches!(c, Ran | Past(_))) {
                let real = fixture.call(&server, kind, name, fill(body, &fixture, false).to_string().as_bytes());
                let missing = fixture.call(&server, kind, name, fill(body, &fixture, true).to_string().as_bytes());
                let (real, missing) = (as_told(&real, &fixture), as_told(&missing, &fixture));
                if real != missing {
                    wrong.push(format!(
                        "{name} as {} tells the fixture's ids from ids that name nothing:\n    {real}\n    {missing}",
                        kind.name()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{} cells of the authorization matrix answer otherwise:\n{}", wrong.len(), wrong.join("\n"));
    let log = server.stop().stderr;
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
}
