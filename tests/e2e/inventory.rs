//! The inventory end to end, through the real binary: an organization, a cluster and a service
//! created, read, edited, listed and deleted over HTTP and through the CLI (`--json` parsed);
//! every write path's bad input refused by name with its HTTP status; the cluster machine
//! user's token shown in the create answer only; no refusal carrying a planted secret.

use crate::support::*;
use serde_json::{Value, json};
use std::cell::RefCell;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Looks like a GitHub token: the server refuses it as an environment value.
const PLANTED: &str = "ghp_PlantedInventorySecret0123456789abcdef";
/// A plain value under a credential-like name: refused too.
const PLANTED_PASSWORD: &str = "planted-inventory-password-hunter2";

/// A dev server with its administrator logged in over HTTP, recording every refusal body.
struct World {
    dir: tempfile::TempDir,
    server: Capstan,
    admin_password: String,
    admin: String,
    refusals: RefCell<Vec<String>>,
}

impl World {
    fn start() -> World {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let server = Capstan::dev(&dir.path().join("data"));
        let admin_password = server.printed_admin_password().expect("the first dev start prints the admin password");
        let admin = server.login("admin", &admin_password);
        World { dir, server, admin_password, admin, refusals: RefCell::new(Vec::new()) }
    }

    fn call(&self, token: &str, method: &str, body: Value) -> Reply {
        let auth = format!("Bearer {token}");
        self.server.request(
            "POST",
            &format!("/api/v1/{method}"),
            &[("content-type", "application/json"), ("authorization", &auth)],
            Some(body.to_string().as_bytes()),
        )
    }

    fn ok(&self, token: &str, method: &str, body: Value) -> Value {
        self.call(token, method, body).expect_json(200)
    }

    /// Assert the refusal `code` with HTTP `status`; returns the error object.
    fn refused(&self, token: &str, method: &str, body: Value, status: u16, code: &str) -> Value {
        let reply = self.call(token, method, body.clone());
        self.refusals.borrow_mut().push(reply.body.clone());
        let error = reply.expect_error(status, code);
        assert!(!error["message"].as_str().unwrap_or_default().is_empty(), "{method} {body}: a refusal explains itself");
        error
    }

    /// A person (not an administrator) created with `admin.createUser` and logged in with the
    /// password it printed once: `(user id, session token)`.
    fn person(&self, username: &str) -> (String, String) {
        let created = self.ok(&self.admin, "admin.createUser", json!({ "username": username }));
        assert_eq!((created["username"].as_str(), created["admin"].as_bool()), (Some(username), Some(false)));
        let password = created["password"].as_str().expect("the generated password, shown once");
        (created["userId"].as_str().unwrap().to_string(), self.server.login(username, password))
    }
}

fn id(value: &Value) -> String {
    value["id"].as_str().unwrap_or_else(|| panic!("an id in {value}")).to_string()
}

fn names(listing: &Value) -> Vec<String> {
    listing["items"]
        .as_array()
        .unwrap_or_else(|| panic!("items in {listing}"))
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_organization_a_cluster_and_a_service_live_and_die_over_http() {
    let w = World::start();
    let admin = &w.admin;
    let (olga_id, olga) = w.person("olga");

    // ---- the organization ----
    let org = w.ok(admin, "organizations.create", json!({ "name": "acme" }));
    let org_id = id(&org);
    assert_eq!((org["name"].as_str(), org["revision"].as_u64()), (Some("acme"), Some(1)));
    assert_eq!(w.ok(admin, "organizations.get", json!({ "id": org_id })), org);
    w.ok(admin, "organizations.setMember", json!({ "organizationId": org_id, "userId": olga_id, "role": "owner" }));
    let renamed = w.ok(&olga, "organizations.update", json!({ "id": org_id, "expectedRevision": 1, "name": "acme-eu" }));
    assert_eq!((renamed["name"].as_str(), renamed["revision"].as_u64()), (Some("acme-eu"), Some(2)));
    assert_eq!(names(&w.ok(&olga, "organizations.list", json!({}))), ["acme-eu"], "an owner lists the organizations it belongs to");
    assert_eq!(names(&w.ok(admin, "organizations.list", json!({}))), ["acme-eu"]);
    let members = w.ok(&olga, "organizations.listMembers", json!({ "organizationId": org_id }));
    assert_eq!(members["items"], json!([{ "userId": olga_id, "username": "olga", "role": "owner" }]));

    // ---- the cluster, its machine user and its phase ----
    let created = w.ok(admin, "clusters.create", json!({ "name": "eu-1", "description": "Frankfurt", "labels": { "region": "eu" } }));
    let cluster = &created["cluster"];
    let cluster_id = id(cluster);
    let token = created["machineUser"]["token"].as_str().expect("the machine user's token, shown once").to_string();
    assert_eq!(created["machineUser"]["username"], "cluster-eu-1");
    assert_eq!(cluster["machineUserId"], created["machineUser"]["userId"]);
    assert_eq!((created["runtime"]["phase"].as_str(), created["runtime"]["generation"].as_u64()), (Some("pallet"), Some(1)));
    // the token opens a machine session; no read ever shows it again
    let exchanged = w.server.call("auth.exchangeToken", &json!({ "token": token }).to_string()).expect_json(200);
    let machine = exchanged["token"].as_str().unwrap().to_string();
    assert_eq!(w.ok(&machine, "auth.whoami", json!({}))["username"], "cluster-eu-1");
    let got = w.ok(admin, "clusters.get", json!({ "id": cluster_id }));
    assert_eq!(&got, cluster);
    let listed = w.ok(admin, "clusters.list", json!({}));
    assert_eq!(names(&listed), ["eu-1"]);
    let runtime = w.ok(admin, "clusters.getRuntime", json!({ "id": cluster_id }));
    for read in [&got, &listed, &runtime] {
        assert!(!read.to_string().contains(&token), "a read shows the machine token: {read}");
    }
    let updated =
        w.ok(admin, "clusters.update", json!({ "id": cluster_id, "expectedRevision": 1, "name": "eu-central", "labels": { "zone": "a" } }));
    assert_eq!(
        (updated["name"].as_str(), updated["description"].as_str(), updated["labels"].clone(), updated["revision"].as_u64()),
        (Some("eu-central"), Some("Frankfurt"), json!({ "zone": "a" }), Some(2)),
        "absent fields stay; labels are replaced whole"
    );
    assert_eq!(names(&w.ok(admin, "clusters.list", json!({}))), ["eu-central"]);
    let moved = w.ok(admin, "clusters.setRuntimePhase", json!({ "id": cluster_id, "phase": "draining", "expectedGeneration": 1 }));
    assert_eq!((moved["phase"].as_str(), moved["generation"].as_u64()), (Some("draining"), Some(2)));

    // ---- the service ----
    let service = w.ok(
        &olga,
        "services.create",
        json!({
            "name": "web",
            "organizationId": org_id,
            "image": "ghcr.io/acme/web:1.0",
            "ports": [{ "port": 8080, "protocol": "http", "publicPort": 443 }],
            "domains": ["web.acme.example"],
            "environment": { "LOG_LEVEL": "info" },
            "volumes": [{ "name": "data", "mountPath": "/var/lib/web" }],
            "mailAddresses": ["web@acme.example"],
        }),
    );
    let service_id = id(&service);
    assert_eq!((service["state"].as_str(), service["scale"].as_u64(), service["revision"].as_u64()), (Some("active"), Some(1), Some(1)));
    let got = w.ok(&olga, "services.get", json!({ "id": service_id }));
    assert_eq!((got["name"].as_str(), got["holds"].clone()), (Some("web"), json!([])));
    let updated =
        w.ok(&olga, "services.update", json!({ "id": service_id, "expectedRevision": 1, "scale": 3, "image": "ghcr.io/acme/web:1.1" }));
    assert_eq!(
        (updated["scale"].as_u64(), updated["image"].as_str(), updated["domains"].clone(), updated["revision"].as_u64()),
        (Some(3), Some("ghcr.io/acme/web:1.1"), json!(["web.acme.example"]), Some(2)),
        "absent fields stay"
    );
    assert_eq!(names(&w.ok(&olga, "services.list", json!({ "organizationId": org_id }))), ["web"]);
    assert_eq!(names(&w.ok(admin, "services.list", json!({}))), ["web"], "an administrator lists every service");
    w.refused(admin, "organizations.delete", json!({ "id": org_id, "expectedRevision": 2 }), 400, "organization-has-services");

    // nothing holds it: both phases finish in the one request
    let deleted = w.ok(&olga, "services.delete", json!({ "id": service_id, "expectedRevision": 2 }));
    assert_eq!(deleted, json!({ "id": service_id, "state": "deleted", "waitingFor": [] }));
    w.refused(&olga, "services.get", json!({ "id": service_id }), 404, "service-not-found");
    assert!(names(&w.ok(&olga, "services.list", json!({ "organizationId": org_id }))).is_empty());

    // ---- deletions ----
    let gone = w.ok(admin, "clusters.delete", json!({ "id": cluster_id, "expectedRevision": 2 }));
    assert_eq!((gone["deleted"].as_bool(), gone["machineUserId"].clone()), (Some(true), created["machineUser"]["userId"].clone()));
    w.refused(admin, "clusters.get", json!({ "id": cluster_id }), 404, "cluster-not-found");
    w.refused(admin, "clusters.getRuntime", json!({ "id": cluster_id }), 404, "cluster-not-found");
    w.refused(&machine, "auth.whoami", json!({}), 401, "unauthenticated");
    w.server.call("auth.exchangeToken", &json!({ "token": token }).to_string()).expect_error(401, "unauthenticated");
    assert!(names(&w.ok(admin, "clusters.list", json!({}))).is_empty());

    let deleted = w.ok(admin, "organizations.delete", json!({ "id": org_id, "expectedRevision": 2 }));
    assert_eq!(deleted, json!({ "id": org_id, "deleted": true }));
    w.refused(admin, "organizations.get", json!({ "id": org_id }), 404, "organization-not-found");
    assert!(names(&w.ok(&olga, "organizations.list", json!({}))).is_empty(), "its memberships went with it");

    let logs = w.server.stdout() + &w.server.stderr();
    assert!(!logs.contains(&token), "the machine token reached the server's output");
}

#[test]
fn every_write_path_refuses_bad_input_by_name_over_http() {
    let w = World::start();
    let admin = &w.admin;
    let (olga_id, owner) = w.person("olga");
    let (max_id, member) = w.person("max");
    let (_, stranger) = w.person("sam");
    let org_id = id(&w.ok(admin, "organizations.create", json!({ "name": "acme" })));
    let other_id = id(&w.ok(admin, "organizations.create", json!({ "name": "other" })));
    w.ok(admin, "organizations.setMember", json!({ "organizationId": org_id, "userId": olga_id, "role": "owner" }));
    w.ok(&owner, "organizations.setMember", json!({ "organizationId": org_id, "userId": max_id, "role": "member" }));
    let cluster_id = id(&w.ok(admin, "clusters.create", json!({ "name": "eu-1" }))["cluster"]);
    let service_id = id(&w.ok(&owner, "services.create", json!({ "name": "web", "organizationId": org_id, "image": "nginx:1.27" })));
    let settings_revision =
        w.ok(admin, "settings.update", json!({ "expectedRevision": 0, "set": { "deploymentArchiveRetentionDays": 30 } }))["revision"]
            .as_u64()
            .unwrap();
    assert_eq!(settings_revision, 1);

    // ---- organizations.create ----
    let m = "organizations.create";
    w.refused(admin, m, json!({ "name": "x", "owner": "me" }), 400, "invalid-request");
    w.refused(admin, m, json!({ "name": "Not A Name" }), 400, "name-invalid");
    w.refused(admin, m, json!({ "name": "acme" }), 409, "exists");
    w.refused(&owner, m, json!({ "name": "mine" }), 403, "forbidden");

    // ---- organizations.update ----
    let m = "organizations.update";
    w.refused(&owner, m, json!({ "id": org_id, "expectedRevision": 7, "name": "acme-2" }), 409, "conflict");
    w.refused(&owner, m, json!({ "id": org_id, "expectedRevision": 1, "name": "acme-2", "color": "red" }), 400, "invalid-request");
    w.refused(&owner, m, json!({ "id": org_id, "expectedRevision": 1, "name": "-acme" }), 400, "name-invalid");
    w.refused(&owner, m, json!({ "id": org_id, "expectedRevision": 1, "name": "other" }), 409, "exists");
    w.refused(admin, m, json!({ "id": "org_missing", "expectedRevision": 1, "name": "acme-2" }), 404, "organization-not-found");
    w.refused(&member, m, json!({ "id": org_id, "expectedRevision": 1, "name": "acme-2" }), 403, "forbidden");
    w.refused(&stranger, m, json!({ "id": org_id, "expectedRevision": 1, "name": "acme-2" }), 403, "forbidden");
    w.refused(&owner, m, json!({ "id": other_id, "expectedRevision": 1, "name": "mine" }), 403, "forbidden");

    // ---- organizations.setMember ----
    let m = "organizations.setMember";
    w.refused(&owner, m, json!({ "organizationId": org_id, "userId": max_id, "role": "member", "since": 1 }), 400, "invalid-request");
    w.refused(&owner, m, json!({ "organizationId": org_id, "userId": max_id, "role": "boss" }), 400, "invalid-request");
    w.refused(admin, m, json!({ "organizationId": "org_missing", "userId": max_id, "role": "member" }), 404, "organization-not-found");
    w.refused(&owner, m, json!({ "organizationId": org_id, "userId": "user_missing", "role": "member" }), 400, "member-user-invalid");
    w.refused(&member, m, json!({ "organizationId": org_id, "userId": max_id, "role": "owner" }), 403, "forbidden");
    w.refused(&owner, m, json!({ "organizationId": other_id, "userId": olga_id, "role": "owner" }), 403, "forbidden");
    w.refused(&owner, m, json!({ "organizationId": org_id, "userId": olga_id, "role": null }), 400, "organization-last-owner");

    // ---- organizations.delete ----
    let m = "organizations.delete";
    w.refused(admin, m, json!({ "id": other_id, "expectedRevision": 9 }), 409, "conflict");
    w.refused(admin, m, json!({ "id": other_id, "expectedRevision": 1, "force": true }), 400, "invalid-request");
    w.refused(admin, m, json!({ "id": "org_missing", "expectedRevision": 1 }), 404, "organization-not-found");
    w.refused(&owner, m, json!({ "id": org_id, "expectedRevision": 1 }), 403, "forbidden");

    // ---- clusters.create ----
    let m = "clusters.create";
    w.refused(admin, m, json!({ "name": "eu-2", "region": "eu" }), 400, "invalid-request");
    w.refused(admin, m, json!({ "name": "EU_2" }), 400, "name-invalid");
    w.refused(admin, m, json!({ "name": "eu-1" }), 409, "exists");
    w.refused(admin, m, json!({ "name": "eu-2", "labels": { "bad key!": "x" } }), 400, "labels-invalid");
    w.refused(&owner, m, json!({ "name": "eu-2" }), 403, "forbidden");

    // ---- clusters.update ----
    let m = "clusters.update";
    w.refused(admin, m, json!({ "id": cluster_id, "expectedRevision": 5, "description": "x" }), 409, "conflict");
    w.refused(admin, m, json!({ "id": cluster_id, "expectedRevision": 1, "owner": "x" }), 400, "invalid-request");
    w.refused(admin, m, json!({ "id": cluster_id, "expectedRevision": 1, "name": "eu 1" }), 400, "name-invalid");
    w.refused(admin, m, json!({ "id": "cluster_missing", "expectedRevision": 1, "description": "x" }), 404, "cluster-not-found");
    w.refused(admin, m, json!({ "id": cluster_id, "expectedRevision": 1, "phase": "swarm" }), 400, "cluster-phase-not-writable");
    w.refused(admin, m, json!({ "id": cluster_id, "expectedRevision": 1, "machineUserId": olga_id }), 400, "cluster-user-immutable");
    w.refused(&owner, m, json!({ "id": cluster_id, "expectedRevision": 1, "description": "x" }), 403, "forbidden");

    // ---- clusters.setRuntimePhase ----
    let m = "clusters.setRuntimePhase";
    w.refused(admin, m, json!({ "id": cluster_id, "phase": "swarm", "expectedGeneration": 0 }), 409, "conflict");
    w.refused(admin, m, json!({ "id": cluster_id, "phase": "swarm", "expectedGeneration": 1, "force": true }), 400, "invalid-request");
    w.refused(admin, m, json!({ "id": cluster_id, "phase": "sideways", "expectedGeneration": 1 }), 400, "invalid-request");
    w.refused(admin, m, json!({ "id": "cluster_missing", "phase": "swarm", "expectedGeneration": 1 }), 404, "cluster-not-found");
    w.refused(&owner, m, json!({ "id": cluster_id, "phase": "swarm", "expectedGeneration": 1 }), 403, "forbidden");

    // ---- clusters.delete ----
    let m = "clusters.delete";
    w.refused(admin, m, json!({ "id": cluster_id, "expectedRevision": 3 }), 409, "conflict");
    w.refused(admin, m, json!({ "id": cluster_id, "expectedRevision": 1, "cascade": true }), 400, "invalid-request");
    w.refused(admin, m, json!({ "id": "cluster_missing", "expectedRevision": 1 }), 404, "cluster-not-found");
    w.refused(&owner, m, json!({ "id": cluster_id, "expectedRevision": 1 }), 403, "forbidden");

    // ---- services.create ----
    let m = "services.create";
    let service = |patch: Value| {
        let mut body = json!({ "name": "api", "organizationId": org_id, "image": "ghcr.io/acme/api:1.0" });
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    w.refused(&owner, m, service(json!({ "replicas": 2 })), 400, "invalid-request");
    w.refused(&owner, m, service(json!({ "name": "API" })), 400, "name-invalid");
    w.refused(&owner, m, service(json!({ "name": "web" })), 409, "exists");
    w.refused(admin, m, service(json!({ "organizationId": "org_missing" })), 404, "organization-not-found");
    // a caller who is no owner cannot tell a missing organization from another's
    w.refused(&owner, m, service(json!({ "organizationId": "org_missing" })), 403, "forbidden");
    w.refused(&member, m, service(json!({})), 403, "forbidden");
    w.refused(&stranger, m, service(json!({})), 403, "forbidden");
    w.refused(&owner, m, service(json!({ "organizationId": other_id })), 403, "forbidden");
    w.refused(&owner, m, service(json!({ "image": "Not An Image" })), 400, "image-invalid");
    w.refused(&owner, m, service(json!({ "environment": { "DB_PASSWORD": PLANTED_PASSWORD } })), 400, "environment-value-is-secret");
    w.refused(&owner, m, service(json!({ "environment": { "CONFIG": PLANTED } })), 400, "environment-value-is-secret");
    w.refused(&owner, m, service(json!({ "environment": { "CONFIG": PLANTED }, "secret": true })), 400, "invalid-request");

    // ---- services.update ----
    let m = "services.update";
    w.refused(&owner, m, json!({ "id": service_id, "expectedRevision": 4, "scale": 2 }), 409, "conflict");
    w.refused(&owner, m, json!({ "id": service_id, "expectedRevision": 1, "replicas": 2 }), 400, "invalid-request");
    w.refused(&owner, m, json!({ "id": service_id, "expectedRevision": 1, "name": "web_2" }), 400, "name-invalid");
    w.refused(&owner, m, json!({ "id": "svc_missing", "expectedRevision": 1, "scale": 2 }), 404, "service-not-found");
    w.refused(&member, m, json!({ "id": service_id, "expectedRevision": 1, "scale": 2 }), 403, "forbidden");
    w.refused(&stranger, m, json!({ "id": service_id, "expectedRevision": 1, "scale": 2 }), 404, "service-not-found");
    w.refused(
        &owner,
        m,
        json!({ "id": service_id, "expectedRevision": 1, "organizationId": other_id }),
        400,
        "service-organization-immutable",
    );
    let secret_env =
        json!({ "id": service_id, "expectedRevision": 1, "environment": { "API_TOKEN": PLANTED_PASSWORD, "CONFIG": PLANTED } });
    w.refused(&owner, m, secret_env, 400, "environment-value-is-secret");
    let secret_env = json!({ "id": service_id, "expectedRevision": 1, "environment": { "CONFIG": PLANTED } });
    w.refused(&owner, m, secret_env, 400, "environment-value-is-secret");

    // ---- services.delete ----
    let m = "services.delete";
    w.refused(&owner, m, json!({ "id": service_id, "expectedRevision": 8 }), 409, "conflict");
    w.refused(&owner, m, json!({ "id": service_id, "expectedRevision": 1, "now": true }), 400, "invalid-request");
    w.refused(&owner, m, json!({ "id": "svc_missing", "expectedRevision": 1 }), 404, "service-not-found");
    w.refused(&member, m, json!({ "id": service_id, "expectedRevision": 1 }), 403, "forbidden");
    w.refused(&stranger, m, json!({ "id": service_id, "expectedRevision": 1 }), 404, "service-not-found");

    // ---- settings.update ----
    let m = "settings.update";
    w.refused(admin, m, json!({ "expectedRevision": 0, "set": { "deploymentArchiveRetentionDays": 31 } }), 409, "conflict");
    w.refused(admin, m, json!({ "expectedRevision": 1, "set": {}, "merge": true }), 400, "invalid-request");
    w.refused(admin, m, json!({ "expectedRevision": 1, "set": { "colour": "blue" } }), 400, "setting-unknown");
    w.refused(admin, m, json!({ "expectedRevision": 1, "set": { "dcrouterGatewayToken": PLANTED } }), 400, "setting-is-secret");
    w.refused(admin, m, json!({ "expectedRevision": 1, "set": { "backups.externalTargetSecretKey": PLANTED } }), 400, "setting-is-secret");
    w.refused(admin, m, json!({ "expectedRevision": 1, "set": { "deploymentArchiveRetentionDays": "https" } }), 400, "setting-invalid");
    w.refused(&owner, m, json!({ "expectedRevision": 1, "set": { "deploymentArchiveRetentionDays": 31 } }), 403, "forbidden");

    // ---- admin.createUser ----
    let m = "admin.createUser";
    w.refused(admin, m, json!({ "username": "ann", "password": PLANTED_PASSWORD }), 400, "invalid-request");
    w.refused(admin, m, json!({ "username": "no spaces" }), 400, "invalid-request");
    w.refused(admin, m, json!({ "username": "olga" }), 409, "exists");
    w.refused(&owner, m, json!({ "username": "ann", "admin": true }), 403, "forbidden");

    // nothing refused changed anything
    let org = w.ok(admin, "organizations.get", json!({ "id": org_id }));
    assert_eq!((org["name"].as_str(), org["revision"].as_u64()), (Some("acme"), Some(1)));
    let cluster = w.ok(admin, "clusters.get", json!({ "id": cluster_id }));
    assert_eq!((cluster["name"].as_str(), cluster["revision"].as_u64()), (Some("eu-1"), Some(1)));
    assert_eq!(w.ok(admin, "clusters.getRuntime", json!({ "id": cluster_id }))["generation"], 1);
    let service = w.ok(&member, "services.get", json!({ "id": service_id }));
    assert_eq!(
        (service["revision"].as_u64(), service["environment"].clone(), service["state"].as_str()),
        (Some(1), json!({}), Some("active"))
    );
    let settings = w.ok(&member, "settings.get", json!({}));
    assert_eq!((settings["revision"].as_u64(), settings["settings"].clone()), (Some(1), json!({ "deploymentArchiveRetentionDays": 30 })));
    assert_eq!(names(&w.ok(admin, "organizations.list", json!({}))).len(), 2);

    // the right caller with the right revision succeeds where the others were refused
    w.ok(&owner, "organizations.update", json!({ "id": org_id, "expectedRevision": 1, "name": "acme-2" }));
    w.ok(&owner, "services.update", json!({ "id": service_id, "expectedRevision": 1, "environment": { "LOG_LEVEL": "debug" } }));

    // no refusal, and no line the server wrote, carries a planted secret
    let refusals = w.refusals.borrow();
    assert!(refusals.len() > 60, "the matrix ran ({} refusals)", refusals.len());
    for body in refusals.iter() {
        assert!(!body.contains(PLANTED) && !body.contains(PLANTED_PASSWORD), "a refusal echoed a planted secret: {body}");
    }
    let logs = w.server.stdout() + &w.server.stderr();
    assert!(!logs.contains(PLANTED) && !logs.contains(PLANTED_PASSWORD), "the server's output carries a planted secret");
}

// ---- the CLI ----

/// The CLI as one person on one machine: its own config directory (where `capstan login` keeps
/// the token) and `CAPSTAN_URL` pointing at the server.
struct Cli {
    config: PathBuf,
    url: String,
}

impl Cli {
    fn new(dir: &Path, name: &str, url: &str) -> Cli {
        Cli { config: dir.join(format!("config-{name}")), url: url.to_string() }
    }

    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = capstan();
        // not a terminal: a deleting command without --yes is refused confirmation-required
        cmd.args(args).env("XDG_CONFIG_HOME", &self.config).env("CAPSTAN_URL", &self.url).stdin(std::process::Stdio::null());
        cmd
    }

    /// `capstan login --password-stdin` with the password on standard input.
    fn login(&self, dir: &Path, username: &str, password: &str) {
        let file = dir.join(format!("password-{username}"));
        std::fs::write(&file, format!("{password}\n")).unwrap();
        let mut cmd = self.command(&["login", "--url", &self.url, "--username", username, "--password-stdin"]);
        cmd.stdin(std::fs::File::open(&file).unwrap());
        let exited = run_to_exit(cmd);
        assert!(exited.status.success(), "capstan login as {username}: {exited:?}");
        assert!(exited.stdout.contains(&format!("logged in to {} as {username}", self.url)), "{}", exited.stdout);
    }

    fn run(&self, args: &[&str]) -> Exited {
        run_to_exit(self.command(args))
    }

    /// Run with `--json`; assert success and parse the one line of JSON it printed.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let exited = self.run(&all);
        assert!(exited.status.success(), "capstan {}: {exited:?}", all.join(" "));
        assert_eq!(exited.stdout.lines().count(), 1, "--json prints one line: {:?}", exited.stdout);
        serde_json::from_str(&exited.stdout)
            .unwrap_or_else(|e| panic!("capstan {} printed no JSON ({e}): {}", all.join(" "), exited.stdout))
    }

    /// Run for people and assert success; returns standard output.
    fn text(&self, args: &[&str]) -> String {
        let exited = self.run(args);
        assert!(exited.status.success(), "capstan {}: {exited:?}", args.join(" "));
        exited.stdout
    }

    /// Assert a refusal for people: exit 1 and `capstan: refused (<code>): …` on standard error.
    fn refused(&self, args: &[&str], code: &str) -> Exited {
        let exited = self.run(args);
        assert_eq!(exited.status.code(), Some(1), "capstan {} should be refused {code}: {exited:?}", args.join(" "));
        let line = format!("capstan: refused ({code}): ");
        assert!(exited.stderr.lines().any(|l| l.starts_with(&line)), "capstan {}: expected {line:?} in stderr: {exited:?}", args.join(" "));
        exited
    }

    /// Assert a refusal with `--json`: exit 1 and `{"ok":false,"error":{…}}` on standard output.
    fn refused_json(&self, args: &[&str], code: &str) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let exited = self.run(&all);
        assert_eq!(exited.status.code(), Some(1), "capstan {} should be refused {code}: {exited:?}", all.join(" "));
        let answer: Value = serde_json::from_str(&exited.stdout).unwrap_or_else(|e| panic!("no JSON refusal ({e}): {exited:?}"));
        assert_eq!((answer["ok"].as_bool(), answer["error"]["code"].as_str()), (Some(false), Some(code)), "{answer}");
        check_envelope("the CLI's refusal", &json!({ "error": answer["error"] }));
        answer["error"].clone()
    }
}

#[test]
fn the_cli_runs_the_same_lifecycle_and_prints_exact_json() {
    let w = World::start();
    let dir = w.dir.path();
    let url = w.server.url("");
    let admin = Cli::new(dir, "admin", &url);
    // a wrong password says so, and stores nothing
    let file = dir.join("password-wrong");
    std::fs::write(&file, "not-the-admin-password\n").unwrap();
    let mut wrong = admin.command(&["login", "--url", &url, "--username", "admin", "--password-stdin"]);
    wrong.stdin(std::fs::File::open(&file).unwrap());
    let wrong = run_to_exit(wrong);
    assert!(!wrong.status.success(), "{wrong:?}");
    assert!(wrong.stderr.contains("login failed: the username \"admin\" and this password are not accepted"), "{}", wrong.stderr);
    admin.login(dir, "admin", &w.admin_password);
    // every command's output after the cluster was created, to check its token never shows again
    let mut later_output = String::new();

    // ---- people ----
    let olga = admin.json(&["users", "create", "olga"]);
    let (olga_id, olga_password) = (olga["userId"].as_str().unwrap().to_string(), olga["password"].as_str().unwrap().to_string());
    let text = admin.text(&["users", "create", "max"]);
    assert!(text.contains("shown this once"), "{text}");
    let max_password = text.lines().find_map(|l| l.strip_prefix("password: ")).expect("the password line").trim().to_string();
    let max_id =
        text.lines().find_map(|l| l.strip_prefix("created user max (")).expect("the created line").trim_end_matches(')').to_string();
    admin.refused(&["users", "create", "olga"], "exists");
    let owner = Cli::new(dir, "olga", &url);
    owner.login(dir, "olga", &olga_password);
    let member = Cli::new(dir, "max", &url);
    member.login(dir, "max", &max_password);

    // ---- an organization ----
    let org = admin.json(&["organizations", "create", "acme"]);
    let org_id = id(&org);
    assert_eq!(admin.json(&["organizations", "get", &org_id]), org);
    // a name answers as its id does, wherever an organization is named
    assert_eq!(admin.json(&["organizations", "get", "acme"]), org);
    let unknown = admin.refused_json(&["organizations", "get", "nope"], "organization-not-found");
    assert!(unknown["message"].as_str().unwrap().contains("\"nope\""), "the refusal names what was looked for: {unknown}");
    admin.refused(&["organizations", "create", "Bad Name"], "name-invalid");
    owner.refused(&["organizations", "create", "mine"], "forbidden");
    let set = admin.json(&["organizations", "set-member", "acme", "olga", "--role", "owner"]);
    assert_eq!(set, json!({ "organizationId": org_id, "userId": olga_id, "role": "owner" }));
    owner.json(&["organizations", "set-member", &org_id, &max_id, "--role", "member"]);
    // for people, the confirmation names what the operator named, the id beside a name
    let said = admin.text(&["organizations", "set-member", "acme", "olga", "--role", "owner"]);
    assert_eq!(said.trim(), format!("olga ({olga_id}) is an owner of acme ({org_id})"));
    let members = member.json(&["organizations", "members", &org_id]);
    assert_eq!(members["items"].as_array().unwrap().len(), 2, "{members}");
    // without --expected-revision the CLI reads the revision first
    let renamed = owner.json(&["organizations", "rename", &org_id, "acme-eu"]);
    assert_eq!((renamed["name"].as_str(), renamed["revision"].as_u64()), (Some("acme-eu"), Some(2)));
    let stale = owner.refused(&["organizations", "rename", &org_id, "acme-2", "--expected-revision", "1"], "conflict");
    assert!(stale.stdout.is_empty(), "a refusal for people goes to standard error: {stale:?}");
    let error = owner.refused_json(&["organizations", "rename", &org_id, "acme-2", "--expected-revision", "1"], "conflict");
    assert_eq!((error["data"]["expectedRevision"].as_u64(), error["data"]["revision"].as_u64()), (Some(1), Some(2)));
    member.refused(&["organizations", "rename", &org_id, "acme-2"], "forbidden");
    assert_eq!(names(&member.json(&["organizations", "list"])), ["acme-eu"]);
    assert!(admin.text(&["organizations", "list"]).lines().any(|l| l.starts_with(&org_id) && l.contains("acme-eu")));

    // ---- a cluster ----
    let created = admin.json(&["clusters", "create", "eu-1", "--description", "Frankfurt", "--label", "region=eu"]);
    let cluster_id = id(&created["cluster"]);
    let token = created["machineUser"]["token"].as_str().expect("the token in the create answer").to_string();
    assert_eq!((created["cluster"]["labels"].clone(), created["runtime"]["phase"].as_str()), (json!({ "region": "eu" }), Some("pallet")));
    let text = admin.text(&["clusters", "create", "eu-2"]);
    let second_token = text.lines().find_map(|l| l.trim().strip_prefix("token:")).expect("the token line").trim().to_string();
    assert!(second_token.starts_with("capstan_mt_") && text.contains("shown this once"), "{text}");
    let got = admin.json(&["clusters", "get", &cluster_id]);
    assert_eq!(got, created["cluster"]);
    assert_eq!(admin.json(&["clusters", "get", "eu-1"]), got, "a cluster by its name");
    admin.refused(&["clusters", "runtime", "eu-9"], "cluster-not-found");
    let listed = admin.json(&["clusters", "list"]);
    let mut listed_names = names(&listed);
    listed_names.sort();
    assert_eq!(listed_names, ["eu-1", "eu-2"]);
    later_output.push_str(&got.to_string());
    later_output.push_str(&listed.to_string());
    later_output.push_str(&admin.text(&["clusters", "get", &cluster_id]));
    later_output.push_str(&admin.text(&["clusters", "list"]));
    let updated = admin.json(&["clusters", "update", &cluster_id, "--name", "eu-central", "--label", "zone=a"]);
    assert_eq!(
        (updated["name"].as_str(), updated["labels"].clone(), updated["description"].as_str(), updated["revision"].as_u64()),
        (Some("eu-central"), json!({ "zone": "a" }), Some("Frankfurt"), Some(2))
    );
    admin.refused(&["clusters", "update", &cluster_id, "--description", "x", "--expected-revision", "1"], "conflict");
    admin.refused(&["clusters", "update", &cluster_id], "nothing-to-change");
    owner.refused(&["clusters", "list"], "forbidden");
    let runtime = admin.json(&["clusters", "runtime", &cluster_id]);
    assert_eq!((runtime["phase"].as_str(), runtime["generation"].as_u64()), (Some("pallet"), Some(1)));
    let moved = admin.json(&["clusters", "set-phase", &cluster_id, "draining"]);
    assert_eq!((moved["phase"].as_str(), moved["generation"].as_u64()), (Some("draining"), Some(2)));
    admin.refused(&["clusters", "set-phase", &cluster_id, "swarm", "--expected-generation", "1"], "conflict");
    later_output.push_str(&runtime.to_string());

    // ---- a service ----
    let service = owner.json(&[
        "services",
        "create",
        "--organization",
        &org_id,
        "--name",
        "web",
        "--image",
        "ghcr.io/acme/web:1.0",
        "--port",
        "443:8080/http",
        "--port",
        "53/udp",
        "--domain",
        "web.acme.example",
        "--env",
        "LOG_LEVEL=info",
        "--env",
        "DATABASE_URL=postgres://db.internal:5432/app",
        "--volume",
        "data:/var/lib/web",
        "--mail",
        "web@acme.example",
    ]);
    let service_id = id(&service);
    assert_eq!(
        service["ports"],
        json!([{ "port": 8080, "protocol": "http", "publicPort": 443 }, { "port": 53, "protocol": "udp", "publicPort": null }])
    );
    assert_eq!(service["environment"], json!({ "LOG_LEVEL": "info", "DATABASE_URL": "postgres://db.internal:5432/app" }));
    assert_eq!(service["volumes"], json!([{ "name": "data", "mountPath": "/var/lib/web" }]));
    assert_eq!((service["scale"].as_u64(), service["mailAddresses"].clone()), (Some(1), json!(["web@acme.example"])));
    // a secret-looking value is refused by the server, by name, and never printed back
    let create = ["services", "create", "--organization", &org_id, "--name", "api", "--image", "nginx"];
    for env in [format!("CONFIG={PLANTED}"), format!("DB_PASSWORD={PLANTED_PASSWORD}")] {
        let mut args = create.to_vec();
        args.extend(["--env", &env]);
        let refused = owner.refused(&args, "environment-value-is-secret");
        let error = owner.refused_json(&args, "environment-value-is-secret");
        let printed = format!("{}{}{error}", refused.stdout, refused.stderr);
        assert!(!printed.contains(PLANTED) && !printed.contains(PLANTED_PASSWORD), "the CLI printed a planted secret: {printed}");
    }
    member.refused(&["services", "create", "--organization", &org_id, "--name", "api", "--image", "nginx"], "forbidden");
    let bad_port = owner.run(&["services", "create", "--organization", &org_id, "--name", "api", "--image", "nginx", "--port", "80/sctp"]);
    assert_eq!(bad_port.status.code(), Some(2), "a malformed flag is a usage error: {bad_port:?}");
    assert!(bad_port.stderr.contains("tcp, udp or http") && bad_port.stderr.contains("(port-invalid)"), "{}", bad_port.stderr);
    // the former TARGET/PROTOCOL:PUBLISHED order is refused by name, with the one way to write it
    let old =
        owner.run(&["services", "create", "--organization", "acme-eu", "--name", "api", "--image", "nginx", "--port", "8080/http:443"]);
    assert_eq!(old.status.code(), Some(2), "{old:?}");
    assert!(old.stderr.contains("(port-syntax-old)") && old.stderr.contains("write 443:8080/http"), "{}", old.stderr);
    // the port reads back as it was written, and as the dashboard shows it
    let shown = member.text(&["services", "get", &service_id]);
    assert!(shown.lines().any(|l| l == "ports:        443:8080/http, 53/udp"), "{shown}");
    assert!(shown.contains("organization: acme-eu ("), "the organization by its name: {shown}");

    // ---- names: a service by its name, within its organization or wherever it is alone ----
    assert_eq!(id(&member.json(&["services", "get", "web", "--organization", "acme-eu"])), service_id);
    assert_eq!(id(&member.json(&["services", "get", "web"])), service_id);
    assert_eq!(id(&admin.json(&["services", "get", "web"])), service_id);
    member.refused(&["services", "get", "nope"], "service-not-found");
    let listed = admin.text(&["services", "list"]);
    let row = listed.lines().find(|l| l.starts_with(&service_id)).expect("the service's row");
    assert!(row.contains(" acme-eu ") && !row.contains(&org_id), "ORGANIZATION shows the name: {listed}");
    // a second organization with a service of the same name: the bare name is ambiguous
    let beta = admin.json(&["organizations", "create", "beta"]);
    let beta_web = admin.json(&["services", "create", "--organization", "beta", "--name", "web", "--image", "nginx"]);
    assert_eq!(beta_web["organizationId"], beta["id"], "--organization by name");
    let ambiguous = admin.refused_json(&["services", "get", "web"], "service-ambiguous");
    let message = ambiguous["message"].as_str().unwrap();
    for expected in [format!("web in acme-eu ({service_id})"), format!("web in beta ({})", id(&beta_web))] {
        assert!(message.contains(&expected), "the refusal lists {expected}: {message}");
    }
    assert_eq!(id(&admin.json(&["services", "get", "web", "--organization", "beta"])), id(&beta_web));
    assert_eq!(id(&member.json(&["services", "get", "web"])), service_id, "max sees only acme-eu's web");
    // a delete asks: refused without a terminal unless --yes; on a terminal, only y goes on
    admin.refused(&["services", "delete", "web", "--organization", "beta"], "confirmation-required");
    admin.refused_json(&["services", "delete", "web", "--organization", "beta"], "confirmation-required");
    let declined = run_on_terminal(admin.command(&["services", "delete", "web", "--organization", "beta"]), "n\n");
    assert_eq!(declined.status.code(), Some(1), "{declined:?}");
    assert!(declined.stderr.contains("Delete service web of beta") && declined.stderr.contains("[y/N]"), "{declined:?}");
    assert!(declined.stderr.contains("refused (not-confirmed)"), "{declined:?}");
    assert_eq!(admin.json(&["services", "get", &id(&beta_web)])["state"], "active", "nothing was deleted");
    let confirmed = run_on_terminal(admin.command(&["services", "delete", "web", "--organization", "beta"]), "y\n");
    assert!(confirmed.status.success() && confirmed.stdout.contains("deleted service"), "{confirmed:?}");
    admin.json(&["organizations", "delete", "beta", "--yes"]);

    let got = member.json(&["services", "get", &service_id]);
    assert_eq!((got["holds"].clone(), got["state"].as_str()), (json!([]), Some("active")));
    let updated = owner.json(&["services", "update", &service_id, "--scale", "3", "--port", "8080/http", "--clear", "mail"]);
    assert_eq!(
        (updated["scale"].as_u64(), updated["ports"].clone(), updated["mailAddresses"].clone(), updated["domains"].clone()),
        (Some(3), json!([{ "port": 8080, "protocol": "http", "publicPort": null }]), json!([]), json!(["web.acme.example"])),
        "given lists are replaced, cleared ones emptied, absent ones kept"
    );
    owner.refused(&["services", "update", &service_id, "--scale", "1", "--expected-revision", "1"], "conflict");
    member.refused(&["services", "update", &service_id, "--scale", "1"], "forbidden");
    owner.refused(&["services", "update", "svc_missing", "--scale", "1"], "service-not-found");
    assert_eq!(names(&member.json(&["services", "list", "--organization", &org_id])), ["web"]);
    member.refused(&["services", "list"], "invalid-request");
    assert!(member.text(&["services", "get", &service_id]).contains("LOG_LEVEL=info"));
    admin.refused(&["organizations", "delete", &org_id, "--yes"], "organization-has-services");

    let deleted = owner.json(&["services", "delete", &service_id, "--yes"]);
    assert_eq!(deleted, json!({ "id": service_id, "state": "deleted", "waitingFor": [] }));
    owner.refused(&["services", "get", &service_id], "service-not-found");
    owner.refused_json(&["services", "get", &service_id], "service-not-found");
    assert!(names(&owner.json(&["services", "list", "--organization", &org_id])).is_empty());
    let again = owner.json(&["services", "create", "--organization", &org_id, "--name", "web", "--image", "nginx"]);
    assert!(owner.text(&["services", "delete", &id(&again), "--yes"]).contains("deleted service"));

    // ---- settings ----
    let set = admin.json(&["settings", "set", "deploymentArchiveRetentionDays=30", "corebuildWorkerUrl=https://w.example.com/"]);
    assert_eq!(set["settings"], json!({ "deploymentArchiveRetentionDays": 30, "corebuildWorkerUrl": "https://w.example.com/" }));
    admin.refused(&["settings", "set", "deploymentArchiveRetentionDays=31", "--expected-revision", "0"], "conflict");
    admin.refused(&["settings", "set", &format!("dcrouterGatewayToken={PLANTED}")], "setting-is-secret");
    owner.refused(&["settings", "set", "deploymentArchiveRetentionDays=31"], "forbidden");
    let unset = admin.json(&["settings", "unset", "deploymentArchiveRetentionDays"]);
    assert_eq!(unset["settings"], json!({ "corebuildWorkerUrl": "https://w.example.com/" }));
    assert_eq!(member.json(&["settings", "get"])["settings"], unset["settings"]);

    // ---- deletions ----
    member.refused(&["organizations", "delete", &org_id, "--yes"], "forbidden");
    admin.refused(&["organizations", "delete", &org_id], "confirmation-required");
    assert_eq!(admin.json(&["organizations", "delete", "acme-eu", "--yes"]), json!({ "id": org_id, "deleted": true }));
    admin.refused(&["organizations", "get", &org_id], "organization-not-found");
    admin.refused(&["clusters", "delete", "eu-central"], "confirmation-required");
    let gone = admin.json(&["clusters", "delete", "eu-central", "--yes"]);
    assert_eq!((gone["deleted"].as_bool(), gone["machineUserId"].clone()), (Some(true), created["machineUser"]["userId"].clone()));
    admin.refused(&["clusters", "get", &cluster_id], "cluster-not-found");
    assert_eq!(names(&admin.json(&["clusters", "list"])), ["eu-2"]);

    assert!(!later_output.contains(&token), "a read after the create printed the machine token");
    let logs = w.server.stdout() + &w.server.stderr();
    for secret in [&token, &second_token, &olga_password, &max_password] {
        assert!(!logs.contains(secret.as_str()), "the server's output carries a secret shown once");
    }
    assert!(!logs.contains(PLANTED) && !logs.contains(PLANTED_PASSWORD));
}
