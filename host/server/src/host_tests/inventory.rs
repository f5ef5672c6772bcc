//! The inventory's methods driven through the registry, as the API dispatcher calls them.

use crate::api::Call;
use crate::auth::Identity;
use crate::refusal::Refusal;
use crate::state::{AppState, test_state};
use serde_json::{Value, json};

const PASSWORD: &str = "a-long-enough-admin-password";

/// A host on a fresh embedded store with a logged-in administrator (shared by other
/// subsystems' tests).
pub(crate) struct World {
    _dir: tempfile::TempDir,
    pub(crate) state: AppState,
    pub(crate) admin: Identity,
}

impl World {
    pub(crate) async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let state = test_state(dir.path()).await;
        crate::auth::bootstrap_admin(&state.store, &state.blobs, "admin", PASSWORD).await.unwrap();
        let answer = state.auth.login("admin", PASSWORD, None).await.unwrap();
        let admin = state.auth.authenticate(&answer.token).await.unwrap();
        World { _dir: dir, state, admin }
    }

    pub(crate) async fn call(&self, who: &Identity, method: &str, body: Value) -> Result<Value, Refusal> {
        let m = self.state.methods.get(method).unwrap_or_else(|| panic!("{method} is registered"));
        m.call(Call::by(who), body).await
    }

    async fn ok(&self, who: &Identity, method: &str, body: Value) -> Value {
        self.call(who, method, body.clone()).await.unwrap_or_else(|e| panic!("{method} {body}: {e}"))
    }

    async fn refused(&self, who: &Identity, method: &str, body: Value, code: &str) -> Refusal {
        let err = self.call(who, method, body.clone()).await.expect_err(&format!("{method} {body} should be refused {code}"));
        assert_eq!(err.code, code, "{method} {body}: {err}");
        err
    }

    /// A person with a login, not an administrator.
    async fn person(&self, username: &str) -> Identity {
        let created = self.ok(&self.admin, "admin.createUser", json!({ "username": username })).await;
        let answer = self.state.auth.login(username, created["password"].as_str().unwrap(), None).await.unwrap();
        self.state.auth.authenticate(&answer.token).await.unwrap()
    }

    async fn events(&self) -> Vec<(String, String)> {
        crate::events::read_after(&self.state.store, 0, 1000).await.unwrap().into_iter().map(|e| (e.kind, e.subject)).collect()
    }

    async fn org(&self, name: &str) -> String {
        self.ok(&self.admin, "organizations.create", json!({ "name": name })).await["id"].as_str().unwrap().to_string()
    }
}

#[tokio::test]
async fn every_moment_answered_is_milliseconds_since_the_epoch() {
    let w = World::new().await;
    let before = capstan_core::clock::now_ms();
    let org = w.ok(&w.admin, "organizations.create", json!({ "name": "acme" })).await;
    let cluster = w.ok(&w.admin, "clusters.create", json!({ "name": "eu-1" })).await;
    let service = w.ok(&w.admin, "services.create", json!({"name": "web", "organizationId": org["id"], "image": "nginx:1.27"})).await;
    let whoami = w.ok(&w.admin, "auth.whoami", json!({})).await;
    let after = capstan_core::clock::now_ms();
    for (what, at) in [
        ("organization", &org["createdAt"]),
        ("organization", &org["updatedAt"]),
        ("cluster", &cluster["cluster"]["createdAt"]),
        ("service", &service["createdAt"]),
        ("service", &service["updatedAt"]),
    ] {
        let at = at.as_u64().unwrap_or_else(|| panic!("{what}: {org} {cluster} {service}"));
        assert!((before..=after).contains(&at), "{what}: {at} is not between {before} and {after}");
    }
    let session_ends = whoami["expiresAt"].as_u64().unwrap();
    assert!(session_ends > after + 11 * 3600 * 1000, "a 12-hour session, in milliseconds: {whoami}");
    assert!(whoami["authenticatedAt"].as_u64().unwrap() > capstan_core::clock::SECONDS_BELOW, "{whoami}");
}

#[tokio::test]
async fn organizations_keep_admins_and_owners_apart() {
    let w = World::new().await;
    let (owner, member, stranger) = (w.person("olga").await, w.person("max").await, w.person("sam").await);
    let acme = w.org("acme").await;
    let other = w.org("other").await;
    w.refused(&owner, "organizations.create", json!({"name": "mine"}), "forbidden").await;
    w.refused(&w.admin, "organizations.create", json!({"name": "acme"}), "exists").await;
    w.refused(&w.admin, "organizations.create", json!({"name": "Bad Name"}), "name-invalid").await;
    w.refused(&w.admin, "organizations.create", json!({"name": "x", "extra": 1}), "invalid-request").await;

    w.ok(&w.admin, "organizations.setMember", json!({"organizationId": acme, "userId": owner.user_id, "role": "owner"})).await;
    w.ok(&owner, "organizations.setMember", json!({"organizationId": acme, "userId": member.user_id, "role": "member"})).await;
    w.refused(
        &member,
        "organizations.setMember",
        json!({"organizationId": acme, "userId": stranger.user_id, "role": "member"}),
        "forbidden",
    )
    .await;
    w.refused(&owner, "organizations.setMember", json!({"organizationId": other, "userId": member.user_id, "role": "member"}), "forbidden")
        .await;
    w.refused(
        &w.admin,
        "organizations.setMember",
        json!({"organizationId": acme, "userId": "user_nobody", "role": "member"}),
        "member-user-invalid",
    )
    .await;
    // the last owner cannot walk out and leave the organization to administrators alone
    w.refused(
        &owner,
        "organizations.setMember",
        json!({"organizationId": acme, "userId": owner.user_id, "role": null}),
        "organization-last-owner",
    )
    .await;

    // an administrator is not listed as an owner; each caller sees what it belongs to
    let members = w.ok(&member, "organizations.listMembers", json!({"organizationId": acme})).await;
    let roles: Vec<(String, String)> = members["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["username"].as_str().unwrap().into(), m["role"].as_str().unwrap().into()))
        .collect();
    assert_eq!(roles.len(), 2, "{members}");
    assert!(roles.contains(&("olga".into(), "owner".into())) && roles.contains(&("max".into(), "member".into())));
    let mine = w.ok(&member, "organizations.list", json!({})).await;
    assert_eq!(mine["items"].as_array().unwrap().len(), 1);
    assert_eq!(w.ok(&w.admin, "organizations.list", json!({})).await["items"].as_array().unwrap().len(), 2);
    assert!(w.ok(&stranger, "organizations.list", json!({})).await["items"].as_array().unwrap().is_empty());
    w.refused(&stranger, "organizations.get", json!({"id": acme}), "forbidden").await;
    w.refused(&w.admin, "organizations.get", json!({"id": "org_missing"}), "organization-not-found").await;
    assert_eq!(w.refused(&w.admin, "organizations.get", json!({"id": "org_missing"}), "organization-not-found").await.http_status(), 404);

    // renames: owner only, with the revision it read
    let got = w.ok(&member, "organizations.get", json!({"id": acme})).await;
    w.refused(&member, "organizations.update", json!({"id": acme, "expectedRevision": got["revision"], "name": "acme-2"}), "forbidden")
        .await;
    w.refused(&owner, "organizations.update", json!({"id": acme, "expectedRevision": 99, "name": "acme-2"}), "conflict").await;
    w.refused(&owner, "organizations.update", json!({"id": acme, "expectedRevision": got["revision"], "name": "other"}), "exists").await;
    let renamed = w.ok(&owner, "organizations.update", json!({"id": acme, "expectedRevision": got["revision"], "name": "acme-2"})).await;
    assert_eq!(renamed["name"], "acme-2");

    // deletion: administrator only, refused while services remain
    w.ok(&owner, "services.create", json!({"name": "web", "organizationId": acme, "image": "nginx:1.27"})).await;
    w.refused(&owner, "organizations.delete", json!({"id": acme, "expectedRevision": renamed["revision"]}), "forbidden").await;
    w.refused(&w.admin, "organizations.delete", json!({"id": acme, "expectedRevision": renamed["revision"]}), "organization-has-services")
        .await;
    let o = w.ok(&w.admin, "organizations.get", json!({"id": other})).await;
    w.ok(&w.admin, "organizations.delete", json!({"id": other, "expectedRevision": o["revision"]})).await;

    let kinds: Vec<String> = w.events().await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        kinds,
        [
            "organization.created",
            "organization.created",
            "organization.memberChanged",
            "organization.memberChanged",
            "organization.updated",
            "service.created",
            "organization.deleted"
        ],
        "every change wrote its event, in commit order; refusals wrote none"
    );
}

#[tokio::test]
async fn clusters_mint_their_machine_user_and_guard_their_pointer_and_phase() {
    let w = World::new().await;
    let created = w.ok(&w.admin, "clusters.create", json!({"name": "eu-1", "labels": {"region": "eu"}})).await;
    let id = created["cluster"]["id"].as_str().unwrap().to_string();
    let token = created["machineUser"]["token"].as_str().unwrap().to_string();
    let user_id = created["machineUser"]["userId"].as_str().unwrap().to_string();
    assert_eq!(created["runtime"]["phase"], "pallet");
    assert_eq!(created["cluster"]["machineUserId"], user_id);
    // the token opens a session as the cluster's machine identity, and no read shows it again
    let session = w.state.auth.exchange_token(&token, None).await.unwrap();
    let machine = w.state.auth.authenticate(&session.token).await.unwrap();
    assert_eq!((machine.kind.as_str(), machine.username.as_str()), ("machine", "cluster-eu-1"));
    let got = w.ok(&w.admin, "clusters.get", json!({"id": id})).await;
    let listed = w.ok(&w.admin, "clusters.list", json!({})).await;
    assert!(!got.to_string().contains(&token) && !listed.to_string().contains(&token));
    w.refused(&machine, "clusters.list", json!({}), "forbidden").await;
    w.refused(&w.admin, "clusters.create", json!({"name": "eu-1"}), "exists").await;
    w.refused(&w.admin, "clusters.get", json!({"id": "cluster_nope"}), "cluster-not-found").await;

    let rev = got["revision"].clone();
    // echoing the pointer is accepted and changes nothing; another value and the phase are refused
    let same = w.ok(&w.admin, "clusters.update", json!({"id": id, "expectedRevision": rev, "machineUserId": user_id})).await;
    assert_eq!(same["revision"], rev);
    w.refused(
        &w.admin,
        "clusters.update",
        json!({"id": id, "expectedRevision": rev, "machineUserId": w.admin.user_id}),
        "cluster-user-immutable",
    )
    .await;
    w.refused(&w.admin, "clusters.update", json!({"id": id, "expectedRevision": rev, "phase": "swarm"}), "cluster-phase-not-writable")
        .await;
    w.refused(&w.admin, "clusters.update", json!({"id": id, "expectedRevision": 0, "description": "x"}), "conflict").await;
    let updated = w.ok(&w.admin, "clusters.update", json!({"id": id, "expectedRevision": rev, "description": "Frankfurt"})).await;
    assert_eq!((updated["description"].as_str(), updated["labels"]["region"].as_str()), (Some("Frankfurt"), Some("eu")));

    // phases move with the generation the caller read
    let runtime = w.ok(&w.admin, "clusters.getRuntime", json!({"id": id})).await;
    assert_eq!((runtime["phase"].as_str(), runtime["generation"].as_u64()), (Some("pallet"), Some(1)));
    w.refused(&w.admin, "clusters.setRuntimePhase", json!({"id": id, "phase": "draining", "expectedGeneration": 0}), "conflict").await;
    w.refused(&w.admin, "clusters.setRuntimePhase", json!({"id": id, "phase": "sideways", "expectedGeneration": 1}), "invalid-request")
        .await;
    let moved = w.ok(&w.admin, "clusters.setRuntimePhase", json!({"id": id, "phase": "draining", "expectedGeneration": 1})).await;
    assert_eq!((moved["phase"].as_str(), moved["generation"].as_u64()), (Some("draining"), Some(2)));

    // nodes block a deletion
    let node_store = w.state.store.clone();
    let cid = id.clone();
    node_store
        .transact(|tx| {
            let cid = cid.clone();
            async move { tx.insert(crate::inventory::CLUSTER_NODES, "node-1", json!({ "clusterId": cid })).await }
        })
        .await
        .unwrap();
    let current = w.ok(&w.admin, "clusters.get", json!({"id": id})).await;
    w.refused(&w.admin, "clusters.delete", json!({"id": id, "expectedRevision": current["revision"]}), "cluster-has-nodes").await;
    node_store.transact(|tx| async move { tx.delete(crate::inventory::CLUSTER_NODES, "node-1", 1).await }).await.unwrap();

    // a pointer naming anyone but the minted machine user refuses the whole deletion
    let admin_id = w.admin.user_id.clone();
    let (cid, doc_rev) = (id.clone(), current["revision"].as_u64().unwrap());
    let tampered = node_store
        .transact(|tx| {
            let (cid, admin_id) = (cid.clone(), admin_id.clone());
            async move {
                let mut doc = tx.require(crate::inventory::CLUSTERS, &cid).await?;
                doc.data["machineUserId"] = json!(admin_id);
                tx.replace(crate::inventory::CLUSTERS, &cid, doc_rev, doc.data).await
            }
        })
        .await
        .unwrap();
    w.refused(&w.admin, "clusters.delete", json!({"id": id, "expectedRevision": tampered.revision}), "cluster-user-not-machine").await;
    assert!(
        w.state.auth.authenticate(&w.state.auth.login("admin", PASSWORD, None).await.unwrap().token).await.is_ok(),
        "the admin survives"
    );
    let restored = node_store
        .transact(|tx| {
            let (cid, user_id) = (id.clone(), user_id.clone());
            async move {
                let mut doc = tx.require(crate::inventory::CLUSTERS, &cid).await?;
                doc.data["machineUserId"] = json!(user_id);
                tx.replace(crate::inventory::CLUSTERS, &cid, doc.revision, doc.data).await
            }
        })
        .await
        .unwrap();
    let deleted = w.ok(&w.admin, "clusters.delete", json!({"id": restored.id, "expectedRevision": restored.revision})).await;
    assert_eq!(deleted["machineUserId"], user_id);
    assert_eq!(w.state.auth.authenticate(&session.token).await.unwrap_err().code, "unauthenticated", "its sessions end with it");
    assert_eq!(w.state.auth.exchange_token(&token, None).await.unwrap_err().code, "unauthenticated");
    w.refused(&w.admin, "clusters.getRuntime", json!({"id": restored.id}), "cluster-not-found").await;
    let kinds: Vec<String> = w.events().await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, ["cluster.created", "cluster.updated", "cluster.runtimePhaseChanged", "cluster.deleted"]);
}

#[tokio::test]
async fn services_are_validated_strictly_and_written_with_their_revision() {
    let w = World::new().await;
    let (owner, member) = (w.person("olga").await, w.person("max").await);
    let acme = w.org("acme").await;
    w.ok(&w.admin, "organizations.setMember", json!({"organizationId": acme, "userId": owner.user_id, "role": "owner"})).await;
    w.ok(&w.admin, "organizations.setMember", json!({"organizationId": acme, "userId": member.user_id, "role": "member"})).await;
    let base = json!({"name": "web", "organizationId": acme, "image": "ghcr.io/acme/web:1.0"});
    let with = |patch: Value| {
        let mut body = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    for (patch, code) in [
        (json!({"name": "Web"}), "name-invalid"),
        (json!({"image": "not an image"}), "image-invalid"),
        (json!({"ports": [{"port": 0, "protocol": "tcp"}]}), "port-invalid"),
        (json!({"ports": [{"port": 80, "protocol": "tcp"}, {"port": 80, "protocol": "tcp"}]}), "port-duplicate"),
        (json!({"ports": [{"port": 80, "protocol": "sctp"}]}), "invalid-request"),
        (json!({"domains": ["not a domain"]}), "domain-invalid"),
        (json!({"environment": {"lower": "x"}}), "environment-key-invalid"),
        (json!({"environment": {"DB_PASSWORD": "hunter2-hunter2"}}), "environment-value-is-secret"),
        (json!({"scale": 1000}), "scale-invalid"),
        (json!({"volumes": [{"name": "data", "mountPath": "relative"}]}), "volume-invalid"),
        (json!({"mailAddresses": ["nobody"]}), "mail-address-invalid"),
        (json!({"database": {"engine": "sqlite", "volume": "data", "path": "app.db"}}), "database-volume-unknown"),
        (
            json!({"volumes": [{"name": "data", "mountPath": "/data"}], "database": {"engine": "sqlite", "volume": "data", "path": "../x.db"}}),
            "database-path-invalid",
        ),
        (
            json!({"volumes": [{"name": "data", "mountPath": "/data"}], "database": {"engine": "postgres", "volume": "data", "path": "x"}}),
            "invalid-request",
        ),
        (json!({"template": "a string"}), "template-invalid"),
        (json!({"organizationId": "org_missing"}), "forbidden"),
        (json!({"unknown": true}), "invalid-request"),
    ] {
        let err = w.refused(&owner, "services.create", with(patch.clone()), code).await;
        assert!(!err.message.contains("hunter2") && !err.data.map(|d| d.to_string()).unwrap_or_default().contains("hunter2"));
    }
    w.refused(&w.admin, "services.create", with(json!({"organizationId": "org_missing"})), "organization-not-found").await;
    w.refused(&member, "services.create", base.clone(), "forbidden").await;

    let created = w
        .ok(
            &owner,
            "services.create",
            with(json!({
                "ports": [{"port": 8080, "protocol": "http", "publicPort": 443}],
                "domains": ["web.acme.example"],
                "environment": {"LOG_LEVEL": "info"},
                "volumes": [{"name": "data", "mountPath": "/var/lib/web"}],
                "mailAddresses": ["web@acme.example"],
            })),
        )
        .await;
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!((created["scale"].as_u64(), created["state"].as_str()), (Some(1), Some("active")));
    w.refused(&owner, "services.create", base.clone(), "exists").await;

    // a stranger cannot tell an existing service from a missing one, reading or writing
    let stranger = w.person("nora").await;
    let hidden = w.refused(&stranger, "services.get", json!({"id": id}), "service-not-found").await;
    let missing = w.refused(&stranger, "services.get", json!({"id": "svc_missing"}), "service-not-found").await;
    assert_eq!(hidden.message.replace(id.as_str(), "ID"), missing.message.replace("svc_missing", "ID"));
    for method in ["services.update", "services.delete"] {
        w.refused(&stranger, method, json!({"id": id, "expectedRevision": 1}), "service-not-found").await;
    }

    // members read, owners write, each write states the revision it read
    let got = w.ok(&member, "services.get", json!({"id": id})).await;
    assert_eq!(got["holds"], json!([]));
    w.refused(&member, "services.update", json!({"id": id, "expectedRevision": got["revision"], "scale": 2}), "forbidden").await;
    w.refused(&owner, "services.update", json!({"id": id, "expectedRevision": 0, "scale": 2}), "conflict").await;
    w.refused(
        &owner,
        "services.update",
        json!({"id": id, "expectedRevision": got["revision"], "organizationId": "org_else"}),
        "service-organization-immutable",
    )
    .await;
    w.refused(&owner, "services.update", json!({"id": "svc_missing", "expectedRevision": 1, "scale": 2}), "service-not-found").await;
    let updated = w
        .ok(&owner, "services.update", json!({"id": id, "expectedRevision": got["revision"], "scale": 3, "image": "ghcr.io/acme/web:1.1"}))
        .await;
    assert_eq!((updated["scale"].as_u64(), updated["domains"][0].as_str()), (Some(3), Some("web.acme.example")), "absent fields stay");

    // a database is declared in one of the service's volumes, stays while it is, and null removes it
    let db = json!({"engine": "sqlite", "volume": "data", "path": "db/app.sqlite"});
    let declared = w.ok(&owner, "services.update", json!({"id": id, "expectedRevision": updated["revision"], "database": db})).await;
    assert_eq!(declared["database"], db);
    let kept = w.ok(&owner, "services.update", json!({"id": id, "expectedRevision": declared["revision"], "scale": 2})).await;
    assert_eq!(kept["database"], db, "absent, the declaration stays");
    let without_volume = json!({"id": id, "expectedRevision": kept["revision"], "volumes": []});
    w.refused(&owner, "services.update", without_volume, "database-volume-unknown").await;
    let removed = w.ok(&owner, "services.update", json!({"id": id, "expectedRevision": kept["revision"], "database": null})).await;
    assert!(removed.get("database").is_none(), "{removed}");

    let listed = w.ok(&member, "services.list", json!({"organizationId": acme})).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);
    w.refused(&member, "services.list", json!({}), "invalid-request").await;
    assert_eq!(w.ok(&w.admin, "services.list", json!({"limit": 1})).await["items"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn deletion_waits_for_every_hold_and_a_deleting_service_takes_no_new_work() {
    let w = World::new().await;
    let acme = w.org("acme").await;
    let store = w.state.store.clone();
    let create = |name: &str| json!({"name": name, "organizationId": acme, "image": "nginx"});
    // nothing holds it: the request finishes it at once
    let quick = w.ok(&w.admin, "services.create", create("quick")).await;
    let answer = w.ok(&w.admin, "services.delete", json!({"id": quick["id"], "expectedRevision": quick["revision"]})).await;
    assert_eq!((answer["state"].as_str(), answer["waitingFor"].clone()), (Some("deleted"), json!([])));
    w.refused(&w.admin, "services.get", json!({"id": quick["id"]}), "service-not-found").await;

    // a manager's hold keeps it deleting; the last release finishes it
    let held = w.ok(&w.admin, "services.create", create("held")).await;
    let id = held["id"].as_str().unwrap().to_string();
    // a holder counts only while its plugin is installed
    store.transact(|tx| async move { tx.insert(crate::plugins::host::PLUGINS, "mail", json!({"id": "mail"})).await }).await.unwrap();
    crate::inventory::services::hold(&store, &id, "plugin:mail").await.unwrap();
    crate::inventory::services::hold(&store, &id, "plugin:gone").await.unwrap();
    let answer = w.ok(&w.admin, "services.delete", json!({"id": id, "expectedRevision": held["revision"]})).await;
    assert_eq!((answer["state"].as_str(), answer["waitingFor"].clone()), (Some("deleting"), json!(["plugin:mail"])));
    let deleting = w.ok(&w.admin, "services.get", json!({"id": id})).await;
    assert_eq!(deleting["state"], "deleting");
    w.refused(&w.admin, "services.update", json!({"id": id, "expectedRevision": deleting["revision"], "scale": 2}), "service-deleting")
        .await;
    assert_eq!(crate::inventory::services::hold(&store, &id, "plugin:backups").await.unwrap_err().code, "service-deleting");
    // the sweep is level-triggered: it finishes nothing while the hold stands, and asking again changes nothing
    assert_eq!(crate::inventory::services::finalize_deleting(&store, &capstan_links::HostDependents).await.unwrap(), (0, 1));
    w.ok(&w.admin, "services.delete", json!({"id": id, "expectedRevision": deleting["revision"]})).await;
    crate::inventory::services::release(&store, &capstan_links::HostDependents, &id, "plugin:mail").await.unwrap();
    w.refused(&w.admin, "services.get", json!({"id": id}), "service-not-found").await;
    assert_eq!(crate::inventory::services::finalize_deleting(&store, &capstan_links::HostDependents).await.unwrap(), (0, 0));

    // a deletion interrupted after its first phase is finished by the next pass
    let stranded = w.ok(&w.admin, "services.create", create("stranded")).await;
    let sid = stranded["id"].as_str().unwrap().to_string();
    crate::inventory::services::hold(&store, &sid, "plugin:mail").await.unwrap();
    w.ok(&w.admin, "services.delete", json!({"id": sid, "expectedRevision": stranded["revision"]})).await;
    store.transact(|tx| async move { tx.delete(crate::plugins::host::PLUGINS, "mail", 1).await }).await.unwrap();
    assert_eq!(
        crate::inventory::services::finalize_deleting(&store, &capstan_links::HostDependents).await.unwrap(),
        (1, 0),
        "an uninstalled plugin's hold no longer blocks"
    );

    let kinds: Vec<String> = w.events().await.into_iter().map(|(k, _)| k).filter(|k| k.starts_with("service.")).collect();
    assert_eq!(
        kinds,
        [
            "service.created",
            "service.deleting",
            "service.deleted",
            "service.created",
            "service.deleting",
            "service.deleted",
            "service.created",
            "service.deleting",
            "service.deleted"
        ]
    );
}

#[tokio::test]
async fn deployers_hold_grants_per_service_and_nobody_else_can() {
    let w = World::new().await;
    let acme = w.org("acme").await;
    let service = w.ok(&w.admin, "services.create", json!({"name": "web", "organizationId": acme, "image": "nginx"})).await;
    let other = w.ok(&w.admin, "services.create", json!({"name": "api", "organizationId": acme, "image": "nginx"})).await;
    let deployer = w.ok(&w.admin, "deployers.create", json!({"username": "ci-deploy"})).await;
    let uid = deployer["userId"].as_str().unwrap().to_string();
    w.refused(&w.admin, "deployers.create", json!({"username": "CI:bad"}), "deployment-machine-user-invalid").await;
    w.refused(&w.admin, "deployers.create", json!({"username": "pallet-registry-x"}), "username-reserved").await;
    w.refused(&w.admin, "admin.createUser", json!({"username": "cluster-eu-1"}), "username-reserved").await;
    w.refused(&w.admin, "organizations.setMember", json!({"organizationId": acme, "userId": uid, "role": "member"}), "member-user-invalid")
        .await;
    let person = w.person("olga").await;
    for user in [&person.user_id, &w.admin.user_id] {
        w.refused(
            &w.admin,
            "deployers.grant",
            json!({"serviceId": service["id"], "userId": user, "capabilities": ["deployment:status"]}),
            "deployment-machine-user-invalid",
        )
        .await;
    }
    w.refused(
        &w.admin,
        "deployers.grant",
        json!({"serviceId": service["id"], "userId": uid, "capabilities": ["root"]}),
        "deployment-capability-unknown",
    )
    .await;
    w.refused(
        &w.admin,
        "deployers.grant",
        json!({"serviceId": "svc_missing", "userId": uid, "capabilities": ["deployment:status"]}),
        "service-not-found",
    )
    .await;
    w.ok(
        &w.admin,
        "deployers.grant",
        json!({"serviceId": service["id"], "userId": uid, "capabilities": ["deployment:status", "registry:push"]}),
    )
    .await;

    let session = w.state.auth.exchange_token(deployer["token"].as_str().unwrap(), None).await.unwrap();
    let machine = w.state.auth.authenticate(&session.token).await.unwrap();
    w.ok(&machine, "services.get", json!({"id": service["id"]})).await;
    w.refused(&machine, "services.get", json!({"id": other["id"]}), "service-not-found").await;
    w.refused(&machine, "services.update", json!({"id": service["id"], "expectedRevision": service["revision"], "scale": 2}), "forbidden")
        .await;

    let listed = w.ok(&w.admin, "deployers.list", json!({})).await;
    assert_eq!(listed["items"][0]["grants"][0]["capabilities"], json!(["deployment:status", "registry:push"]));
    assert!(!listed.to_string().contains(deployer["token"].as_str().unwrap()));
    let year = 365 * 24 * 3600 * 1000;
    assert!(listed["items"][0]["tokenExpiresAt"].as_u64().unwrap() > capstan_core::clock::now_ms() + year - 60_000, "a year by default");
    // a moment in seconds reads as 1970 and is refused
    w.refused(
        &w.admin,
        "deployers.create",
        json!({"username": "secs", "expiresAt": capstan_core::clock::now_secs() + 3600}),
        "expiry-invalid",
    )
    .await;
    w.refused(&w.admin, "deployers.create", json!({"username": "old", "expiresAt": 1}), "expiry-invalid").await;
    w.refused(
        &w.admin,
        "deployers.rotateToken",
        json!({"userId": uid, "expiresAt": capstan_core::clock::now_ms() + 2 * year}),
        "expiry-invalid",
    )
    .await;
    w.refused(&w.admin, "deployers.rotateToken", json!({"userId": w.admin.user_id}), "deployment-machine-user-invalid").await;

    // an expired token opens nothing, and its sessions end
    let short =
        w.ok(&w.admin, "deployers.create", json!({"username": "short-lived", "expiresAt": capstan_core::clock::now_ms() + 60_000})).await;
    let short_session = w.state.auth.exchange_token(short["token"].as_str().unwrap(), None).await.unwrap();
    let short_id = short["userId"].as_str().unwrap().to_string();
    let store = w.state.store.clone();
    store
        .transact(|tx| {
            let short_id = short_id.clone();
            async move {
                let doc = tx.require(crate::auth::CREDENTIALS, &short_id).await?;
                let mut data = doc.data.clone();
                data["tokenExpiresAt"] = json!(capstan_core::clock::now_ms() - 1);
                tx.replace(crate::auth::CREDENTIALS, &short_id, doc.revision, data).await
            }
        })
        .await
        .unwrap();
    assert_eq!(w.state.auth.authenticate(&short_session.token).await.unwrap_err().code, "unauthenticated");
    assert_eq!(w.state.auth.exchange_token(short["token"].as_str().unwrap(), None).await.unwrap_err().code, "unauthenticated");

    // rotation replaces the token; revocation removes it and keeps the grants
    let rotated = w.ok(&w.admin, "deployers.rotateToken", json!({"userId": uid})).await;
    assert_eq!(w.state.auth.authenticate(&session.token).await.unwrap_err().code, "unauthenticated", "the old token's sessions end");
    let session = w.state.auth.exchange_token(rotated["token"].as_str().unwrap(), None).await.unwrap();
    let machine = w.state.auth.authenticate(&session.token).await.unwrap();
    w.ok(&machine, "services.get", json!({"id": service["id"]})).await;
    w.ok(&w.admin, "deployers.revokeToken", json!({"userId": uid})).await;
    assert_eq!(w.state.auth.authenticate(&session.token).await.unwrap_err().code, "unauthenticated");
    let listed = w.ok(&w.admin, "deployers.list", json!({})).await;
    let revoked = listed["items"].as_array().unwrap().iter().find(|d| d["userId"] == uid.as_str()).unwrap().clone();
    assert_eq!((revoked["tokenActive"].as_bool(), revoked["grants"].as_array().map(Vec::len)), (Some(false), Some(1)), "{revoked}");
    let session = w.state.auth.exchange_token(rotated["token"].as_str().unwrap(), None).await;
    assert!(session.is_err());
    let rotated = w.ok(&w.admin, "deployers.rotateToken", json!({"userId": uid})).await;
    let session = w.state.auth.exchange_token(rotated["token"].as_str().unwrap(), None).await.unwrap();
    let machine = w.state.auth.authenticate(&session.token).await.unwrap();
    w.ok(&w.admin, "deployers.revoke", json!({"serviceId": service["id"], "userId": uid})).await;
    w.refused(&machine, "services.get", json!({"id": service["id"]}), "service-not-found").await;
}

#[tokio::test]
async fn settings_are_an_allowlist_without_credentials() {
    let w = World::new().await;
    let person = w.person("olga").await;
    let empty = w.ok(&person, "settings.get", json!({})).await;
    assert_eq!((empty["revision"].as_u64(), empty["settings"].clone()), (Some(0), json!({})));
    w.refused(&person, "settings.update", json!({"expectedRevision": 0, "set": {"deploymentArchiveRetentionDays": 443}}), "forbidden")
        .await;
    w.refused(&w.admin, "settings.update", json!({"expectedRevision": 0, "set": {"colour": "blue"}}), "setting-unknown").await;
    let err = w
        .refused(
            &w.admin,
            "settings.update",
            json!({"expectedRevision": 0, "set": {"dcrouterGatewayToken": "hunter2-token"}}),
            "setting-is-secret",
        )
        .await;
    assert!(!err.message.contains("hunter2"));
    w.refused(
        &w.admin,
        "settings.update",
        json!({"expectedRevision": 0, "set": {"deploymentArchiveRetentionDays": "https"}}),
        "setting-invalid",
    )
    .await;
    let set = w
        .ok(
            &w.admin,
            "settings.update",
            json!({"expectedRevision": 0, "set": {"deploymentArchiveRetentionDays": 30, "corebuildWorkerUrls": ["https://c.example.com/a.json"]}}),
        )
        .await;
    let revision = set["revision"].as_u64().unwrap();
    w.refused(&w.admin, "settings.update", json!({"expectedRevision": 0, "set": {"deploymentArchiveRetentionDays": 31}}), "conflict").await;
    let unset = w.ok(&w.admin, "settings.update", json!({"expectedRevision": revision, "unset": ["deploymentArchiveRetentionDays"]})).await;
    assert_eq!(unset["settings"], json!({"corebuildWorkerUrls": ["https://c.example.com/a.json"]}));
    // a write that changes nothing is no change
    let same = w
        .ok(&w.admin, "settings.update", json!({"expectedRevision": unset["revision"], "unset": ["deploymentArchiveRetentionDays"]}))
        .await;
    assert_eq!(same["revision"], unset["revision"]);
    let kinds: Vec<String> = w.events().await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, ["settings.updated", "settings.updated"]);
}

#[tokio::test]
async fn deployer_mutations_replay_by_mutation_id_without_the_token() {
    let w = World::new().await;
    let create = json!({"username": "ci-replay", "mutationId": "create-1"});
    let first = w.ok(&w.admin, "deployers.create", create.clone()).await;
    let token = first["token"].as_str().unwrap().to_string();
    assert_eq!(first["replayed"], false);
    let again = w.ok(&w.admin, "deployers.create", create).await;
    assert_eq!(
        (again["userId"].clone(), again["generation"].clone(), again["replayed"].clone()),
        (first["userId"].clone(), json!(1), json!(true))
    );
    assert_eq!(again["token"], Value::Null, "a replay never shows the token again");
    w.refused(&w.admin, "deployers.create", json!({"username": "ci-other", "mutationId": "create-1"}), "mutation-reused").await;
    let uid = first["userId"].as_str().unwrap().to_string();

    let rotate = json!({"userId": uid, "mutationId": "rotate-1"});
    let rotated = w.ok(&w.admin, "deployers.rotateToken", rotate.clone()).await;
    let rotated_again = w.ok(&w.admin, "deployers.rotateToken", rotate).await;
    assert_eq!(rotated_again["generation"], rotated["generation"], "the replay rotated nothing: {rotated_again}");
    assert_eq!((rotated_again["token"].clone(), rotated_again["replayed"].clone()), (Value::Null, json!(true)));
    // the token the first rotation answered is the one that works
    assert!(w.state.auth.exchange_token(&token, None).await.is_err());
    w.state.auth.exchange_token(rotated["token"].as_str().unwrap(), None).await.unwrap();

    let revoke = json!({"userId": uid, "mutationId": "revoke-1"});
    assert_eq!(w.ok(&w.admin, "deployers.revokeToken", revoke.clone()).await["replayed"], false);
    assert_eq!(w.ok(&w.admin, "deployers.revokeToken", revoke).await["replayed"], true);
    w.refused(&w.admin, "deployers.revokeToken", json!({"userId": uid, "mutationId": "rotate-1"}), "mutation-reused").await;
    w.refused(&w.admin, "deployers.revokeToken", json!({"userId": uid, "mutationId": "no spaces"}), "invalid-request").await;
    // the receipts keep answers without tokens
    let receipts = w.state.store.transact(|tx| async move { tx.scan(crate::auth::RECEIPTS, None, 100).await }).await.unwrap();
    let text = serde_json::to_string(&receipts.documents.iter().map(|d| &d.data).collect::<Vec<_>>()).unwrap();
    assert!(receipts.documents.len() >= 3 && !text.contains(&token) && !text.contains(rotated["token"].as_str().unwrap()), "{text}");
}
