//! A service served through its cluster's ingress from its running replicas, end to end, on the
//! two-node setup of the runtime test (tests/e2e/runtime.rs): the first node's relay runs the
//! reference ingress, the service is designated as the cluster's ingress (so its registration
//! is judged by where its replicas run) and routed by its domain to the nodes where a replica is
//! ready. A load driver sends requests through the ingress during `capstan deploy` of v2 (done
//! once both replicas run v2), during a release that exits at once and its
//! rollback, and counts every failed one; the ingress then follows the replica moved from node
//! to node; an app installed from a signed catalog onto the cluster starts on the node named and
//! answers through the ingress; an every-node service's volumes are backed up as parts of one
//! backup (each node's agent taking its own) and restored byte for byte with the replicas
//! stopped and started around the restore. Skips as the runtime test does.

use crate::ingress::through_at;
use crate::runtime::{CONVERGE, Images, Node, World, skipped};
use crate::support::eventually;
use capstan_catalog::{Catalog, PublisherKey, SigningKey, sign};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

const HOSTNAME: &str = "web.example.com";
const PAGES: &str = "pages.example.com";

/// What the load driver saw.
#[derive(Debug, Default)]
struct Tally {
    answered: BTreeMap<String, u64>,
    failed: u64,
    failures: Vec<String>,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total: u64 = self.answered.values().sum::<u64>() + self.failed;
        write!(f, "{total} requests, {} failed, answered {:?}", self.failed, self.answered)?;
        if !self.failures.is_empty() {
            write!(f, "; first failures: {:?}", self.failures)?;
        }
        Ok(())
    }
}

/// `connections` threads sending GET / for `host` to `ingress` back to back until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(ingress: &str, host: &str, connections: usize) -> Load {
        let (stop, tally) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Tally::default())));
        let threads = (0..connections)
            .map(|_| {
                let (stop, tally, ingress, host) = (stop.clone(), tally.clone(), ingress.to_string(), host.to_string());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let answer = through_at(&ingress, &host);
                        let mut tally = tally.lock().unwrap();
                        match answer {
                            Ok((200, body)) => *tally.answered.entry(body.trim().to_string()).or_default() += 1,
                            other => {
                                tally.failed += 1;
                                if tally.failures.len() < 5 {
                                    tally.failures.push(format!("{other:?}"));
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        Load { stop, tally, threads }
    }

    fn finish(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().unwrap();
        }
        std::mem::take(&mut *self.tally.lock().unwrap())
    }
}

/// The route table's targets for [`HOSTNAME`] once the relay applied the table that holds them.
fn targets(w: &World, cluster: &str) -> Result<Vec<String>, String> {
    let t = w.ok("ingress.getRouteTable", json!({ "clusterId": cluster }));
    let route = t["table"]["routes"].as_array().into_iter().flatten().find(|r| r["hostname"] == HOSTNAME).cloned();
    match route {
        Some(route) if t["appliedRevision"] == t["table"]["revision"] => {
            Ok(route["targets"].as_array().unwrap().iter().map(|t| format!("{}:{}", t["address"].as_str().unwrap(), t["port"])).collect())
        }
        _ => Err(t.to_string()),
    }
}

fn follows(w: &World, cluster: &str, what: &str, nodes: &[&Node]) {
    let mut want: Vec<String> = nodes.iter().map(|n| format!("{}:18080", n.address())).collect();
    want.sort();
    eventually(what, CONVERGE, || match targets(w, cluster) {
        Ok(got) if got == want => Ok(()),
        Ok(got) => Err(format!("targets {got:?}, want {want:?}")),
        Err(table) => Err(table),
    });
}

#[test]
fn a_service_is_served_through_the_cluster_ingress_from_its_ready_replicas_without_a_failed_request() {
    if skipped() {
        return;
    }
    // the host routes between the nodes' links, as a network between machines would
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let images = Images::build(dir.path(), &["v1", "v2", "crash"]);
    let w = World::start(&dir.path().join("data"), images);

    let org = w.ok("organizations.create", json!({ "name": "acme" }))["id"].as_str().unwrap().to_string();
    let cluster = w.ok("clusters.create", json!({ "name": "edge" }))["cluster"]["id"].as_str().unwrap().to_string();
    let (web, deployer, _) = w.published_service(&org, "web");
    let held = w.ok("services.get", json!({ "id": web }));
    w.ok("services.update", json!({ "id": web, "expectedRevision": held["revision"], "domains": [HOSTNAME] }));
    w.release(&web, &deployer, "1.0.0", "v1");
    let mut nodes = w.two_nodes(dir.path(), &cluster, 6);
    for node in &nodes {
        node.route_to_other_nodes();
    }
    let spec = w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": web, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true },
                "replicasPerNode": 1, "health": { "kind": "http", "port": 8080, "path": "/", "intervalMs": 1000, "threshold": 2 } }),
    );
    w.converged(&web, "web runs on both nodes", |t| t["slots"].as_array().is_some_and(|s| s.len() == 2));

    // ---- web is the cluster's ingress too: the relay's proxy registers from the node it runs on ----
    eventually("the ingress plugin running", CONVERGE, || {
        let reply = w.server.call_as(&w.admin, "plugins.get", &json!({ "id": "ingress" }));
        if reply.status == 200 && reply.json()["status"] == "running" { Ok(()) } else { Err(reply.body.clone()) }
    });
    w.at_revision("ingress.designate", &web, |revision| {
        json!({ "clusterId": cluster, "serviceId": web, "expectedRevision": revision, "mutationId": format!("e2e-ingress-{revision}") })
    });
    let bearer = w.ok("ingress.exportBearer", json!({ "clusterId": cluster }))["bearer"].as_str().unwrap().to_string();
    let ingress = nodes[0].start_ingress(&bearer);
    eventually("the ingress registered from the relay's node", CONVERGE, || {
        let read = w.ok("ingress.getDesignation", json!({ "clusterId": cluster }));
        let node = read["designation"]["registration"]["nodeId"].clone();
        if node == nodes[0].id() { Ok(()) } else { Err(format!("{read}\n{}", nodes[0].relay_log())) }
    });
    // the designation's secrets reached web's replicas: both were replaced, one at a time
    w.converged(&web, "web runs with the ingress environment", |t| t["slots"].as_array().is_some_and(|s| s.len() == 2));
    follows(&w, &cluster, "the route to both ready replicas", &[&nodes[0], &nodes[1]]);
    assert_eq!(through_at(&ingress, HOSTNAME), Ok((200, "v1\n".to_string())));
    assert_eq!(through_at(&ingress, "nowhere.example.com").map(|(status, _)| status), Ok(404));

    // ---- v2 by `capstan deploy`, done once both replicas run it; no request fails ----
    let config = dir.path().join("deployer-config");
    let load = Load::start(&ingress, HOSTNAME, 4);
    let mut cmd = crate::support::client(&w.server, &deployer.1, &config);
    let archive = w.images.archive("v2");
    cmd.args(["deploy", &web, "--tag", "2.0.0", "--image", &archive, "--timeout", "3m", "--json"]);
    let out = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "capstan deploy of v2: {printed}\n{}", String::from_utf8_lossy(&out.stderr));
    let deployed: Value = serde_json::from_str(printed.trim()).unwrap();
    assert_eq!((deployed["state"].as_str(), deployed["rollout"]["state"].as_str()), (Some("promoted"), Some("healthy")), "{deployed}");
    follows(&w, &cluster, "the route to both v2 replicas", &[&nodes[0], &nodes[1]]);
    let tally = load.finish();
    eprintln!("through the ingress during the v1 -> v2 rollout: {tally}");
    assert_eq!(tally.failed, 0, "no request failed during the rollout: {tally}");
    assert!(tally.answered.keys().all(|b| b == "v1" || b == "v2") && tally.answered.contains_key("v2"), "{tally}");
    assert_eq!(through_at(&ingress, HOSTNAME), Ok((200, "v2\n".to_string())));

    // ---- a release whose container exits at once fails, is rolled back; v2 answers throughout ----
    let load = Load::start(&ingress, HOSTNAME, 4);
    let archive = w.images.archive("crash");
    let mut cmd = crate::support::client(&w.server, &deployer.1, &config);
    cmd.args(["deploy", &web, "--tag", "3.0.0", "--image", &archive, "--timeout", "3m", "--json"]);
    let out = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "a release that exits fails its deploy: {printed}");
    let refused: Value = serde_json::from_str(printed.trim()).unwrap_or_else(|e| panic!("{e}: {printed}"));
    assert_eq!(refused["error"]["code"], "rollout-failed", "{refused}");
    let exited = crate::support::cli(&w.server, &deployer.1, &config, &["deploy", &web, "--rollback", "2.0.0", "--timeout", "3m"]);
    assert!(exited.status.success(), "{}\n{}", exited.stdout, exited.stderr);
    follows(&w, &cluster, "the route back on both replicas", &[&nodes[0], &nodes[1]]);
    let tally = load.finish();
    eprintln!("through the ingress during the failed 3.0.0 and the rollback to 2.0.0: {tally}");
    assert_eq!(tally.failed, 0, "no request failed while a replica crashed and was rolled back: {tally}");
    assert_eq!(tally.answered.keys().collect::<Vec<_>>(), ["v2"], "v2 answered throughout: {tally}");

    // ---- the replica moved from node to node: the ingress follows it ----
    let moved = w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": web, "clusterId": cluster, "expectedRevision": spec["revision"], "placement": { "nodes": [nodes[1].id()] },
                "replicasPerNode": 1, "health": { "kind": "http", "port": 8080, "path": "/", "intervalMs": 1000, "threshold": 2 } }),
    );
    follows(&w, &cluster, "the route to the second node alone", &[&nodes[1]]);
    assert_eq!(through_at(&ingress, HOSTNAME), Ok((200, "v2\n".to_string())), "the first node's ingress sends it to the second");
    let load = Load::start(&ingress, HOSTNAME, 2);
    w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": web, "clusterId": cluster, "expectedRevision": moved["revision"], "placement": { "nodes": [nodes[0].id()] },
                "replicasPerNode": 1, "health": { "kind": "http", "port": 8080, "path": "/", "intervalMs": 1000, "threshold": 2 } }),
    );
    follows(&w, &cluster, "the route to the first node alone", &[&nodes[0]]);
    let tally = load.finish();
    // a move stops the replica and starts another elsewhere: a moment may have none ready (printed)
    eprintln!("through the ingress while the replica moved back: {tally}");
    assert_eq!(through_at(&ingress, HOSTNAME), Ok((200, "v2\n".to_string())));
    assert!(nodes[1].containers(&web).is_empty() || nodes[1].containers(&web).iter().all(|c| c["State"] != "running"));

    // ---- an app from the catalog, installed onto the cluster, starts and is served through the ingress ----
    crate::appstore::wait_for_appstore(&w.server, &w.admin);
    let publisher = SigningKey::from_bytes(&[42; 32]);
    let settings = w.ok("settings.get", json!({}));
    let trust = json!({ "appstore.trustedCatalogKeys": [PublisherKey::from(&publisher).to_string()] });
    w.ok("settings.update", json!({ "expectedRevision": settings["revision"], "set": trust }));
    // its image: v2 as web's repository holds it (the organization's own)
    let image = format!("127.0.0.1:{}/{}:2.0.0@{}", w.port, deployed["repository"].as_str().unwrap(), deployed["digest"].as_str().unwrap());
    let catalog: Catalog = serde_json::from_value(json!({ "apps": [{ "id": "pages", "name": "Pages", "versions": [{ "version": "1.0.0",
        "template": { "image": image, "ports": [{ "port": 8080, "protocol": "http", "publicPort": 18081 }] } }] }] }))
    .unwrap();
    let envelope = sign(&catalog, 1, &publisher).unwrap().to_json();
    assert_eq!(w.ok("appstore.importCatalog", json!({ "envelope": envelope }))["outcome"], "activated");
    let config = w.ok("appstore.getAppConfig", json!({ "appId": "pages" }));
    let offered: Vec<&str> = config["clusters"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(offered, ["edge"], "the install form offers the cluster: {config}");
    let installed = w.ok(
        "appstore.install",
        json!({ "organizationId": org, "appId": "pages", "name": "pages", "domains": [PAGES], "clusterId": cluster, "nodeId": nodes[1].id() }),
    );
    assert_eq!((installed["clusterId"].as_str(), installed["specRevision"].as_u64()), (Some(cluster.as_str()), Some(1)), "{installed}");
    let pages = installed["id"].as_str().unwrap().to_string();
    w.converged(&pages, "the app runs on the node named", |t| {
        t["slots"].as_array().is_some_and(|s| s.len() == 1 && s[0]["nodeId"] == nodes[1].id())
    });
    eventually("the app answers through the ingress", CONVERGE, || match through_at(&ingress, PAGES) {
        Ok((200, body)) if body == "v2\n" => Ok(()),
        other => Err(format!("{other:?}")),
    });

    // ---- an every-node service's volumes backed up as one backup, a part from each node (each
    // taken by its own node's agent over its runtime session, one of them carried by the relay),
    // and restored byte for byte, one node at a time, its replica stopped and started around it ----
    let image = format!("127.0.0.1:{}/{}@{}", w.port, deployed["repository"].as_str().unwrap(), deployed["digest"].as_str().unwrap());
    let notes = w.ok(
        "services.create",
        json!({ "organizationId": org, "name": "notes", "image": image, "ports": [{ "port": 8080, "protocol": "http", "publicPort": 18082 }],
                "volumes": [{ "name": "data", "mountPath": "/www/data" }] }),
    )["id"]
        .as_str()
        .unwrap()
        .to_string();
    w.ok(
        "runtime.setServiceSpec",
        json!({ "serviceId": notes, "clusterId": cluster, "expectedRevision": null, "placement": { "everyNode": true },
                "replicasPerNode": 1, "health": { "kind": "http", "port": 8080, "path": "/", "intervalMs": 1000, "threshold": 2 } }),
    );
    let first = w.converged(&notes, "notes runs on both nodes", |t| t["slots"].as_array().is_some_and(|s| s.len() == 2));
    let volume = |node: &Node| node.volumes_dir().join(&notes).join("data");
    let note = |node: &Node| node.fetch_at(18082, "/data/note.txt", 5);
    let mut ids: Vec<&str> = nodes.iter().map(|n| n.id()).collect();
    ids.sort();
    for (i, node) in nodes.iter().enumerate() {
        std::fs::write(volume(node).join("note.txt"), format!("first on {i}\n")).unwrap();
        assert_eq!(note(node), Some(format!("first on {i}")), "each node's container serves its own volume");
    }
    let backup = w.ok("backups.create", json!({ "organizationId": org, "serviceId": notes }));
    let settle = |method: &str, body: Value| {
        eventually(&format!("{method} settling"), CONVERGE, || {
            let record = w.ok(method, body.clone());
            match record["state"].as_str() {
                Some("pending" | "stopping" | "running") => Err(record.to_string()),
                _ => Ok(record),
            }
        })
    };
    let backup = settle("backups.get", json!({ "organizationId": org, "backupId": backup["id"] }));
    assert_eq!(backup["state"], "complete", "{backup}\n{}", nodes[0].relay_log());
    assert_eq!(backup["nodes"], json!(ids), "one backup, a part from each node: {backup}");
    let parts: Vec<&str> = backup["objects"].as_array().unwrap().iter().filter_map(|o| o["nodeId"].as_str()).collect();
    assert_eq!(parts, ids, "each part's archive names its node: {backup}");
    for (i, node) in nodes.iter().enumerate() {
        std::fs::write(volume(node).join("note.txt"), format!("second on {i}\n")).unwrap();
        assert_eq!(note(node), Some(format!("second on {i}")));
    }
    let restore = w.ok("backups.restore", json!({ "organizationId": org, "backupId": backup["id"] }));
    let held = eventually("the restore holds the spec", CONVERGE, || {
        let record = w.ok("backups.getRestore", json!({ "organizationId": org, "restoreId": restore["id"] }));
        if record["held"].is_object() || record["state"] == "complete" { Ok(record) } else { Err(record.to_string()) }
    });
    let restored = settle("backups.getRestore", json!({ "organizationId": org, "restoreId": restore["id"] }));
    assert_eq!(restored["state"], "complete", "{restored}\n{}", nodes[0].relay_log());
    assert_eq!(restored["nodes"], json!(ids), "each part lands on its own node: {restored}");
    let before: Vec<&Value> = first["slots"].as_array().unwrap().iter().map(|s| &s["assignmentId"]).collect();
    let started = w.converged(&notes, "notes runs again on both nodes after the restore", |t| {
        t["slots"].as_array().is_some_and(|s| s.len() == 2 && s.iter().all(|slot| !before.contains(&&slot["assignmentId"])))
    });
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(note(node), Some(format!("first on {i}")), "node {i}'s part restored byte for byte onto it, and served");
    }
    let spec = w.ok("runtime.getServiceSpec", json!({ "serviceId": notes, "clusterId": cluster }));
    assert_eq!(spec["items"][0]["hold"], false, "the hold is released: {spec}");
    // the manager held and released the spec on its own account, in a pass: both recorded
    let audited = w.ok("audit.list", json!({ "method": "runtime.setServiceSpec", "limit": 50 }));
    let by_backups: Vec<&Value> =
        audited["records"].as_array().unwrap().iter().filter(|r| r["actor"]["username"] == "plugin:backups").collect();
    assert_eq!(by_backups.len(), 2 * ids.len(), "each part's hold of its node and its release are audited: {audited}");
    assert!(
        by_backups
            .iter()
            .all(|r| r["plugin"] == "backups" && r["outcome"] == "ok" && r["targets"].as_array().unwrap().contains(&json!(notes)))
    );
    eprintln!("restore: held {} (spec revision), replicas {before:?} replaced by {}", held["held"], started["slots"]);

    // ---- a restore onto one node stops only that node's replica: the other keeps serving ----
    let (one, other) = (&nodes[0], &nodes[1]);
    let single = w.ok("backups.create", json!({ "organizationId": org, "serviceId": notes, "nodeId": one.id() }));
    let single = settle("backups.get", json!({ "organizationId": org, "backupId": single["id"] }));
    assert_eq!((single["state"].as_str(), single["nodeId"].as_str()), (Some("complete"), Some(one.id())), "{single}");
    std::fs::write(volume(one).join("note.txt"), "third on 0\n").unwrap();
    let other_slot =
        |target: &Value| target["slots"].as_array().unwrap().iter().find(|s| s["nodeId"] == other.id()).map(|s| s["assignmentId"].clone());
    let other_before = other_slot(&started);
    let restore = w.ok("backups.restore", json!({ "organizationId": org, "backupId": single["id"] }));
    let held_nodes = eventually("the restore holds its node only", CONVERGE, || {
        let spec = w.ok("runtime.getServiceSpec", json!({ "serviceId": notes, "clusterId": cluster }));
        let held = spec["items"][0]["heldNodes"].clone();
        if held.as_array().is_some_and(|h| !h.is_empty()) { Ok((spec, held)) } else { Err(spec.to_string()) }
    });
    assert_eq!((held_nodes.0["items"][0]["hold"].as_bool(), held_nodes.1.clone()), (Some(false), json!([one.id()])), "{}", held_nodes.0);
    let restored = settle("backups.getRestore", json!({ "organizationId": org, "restoreId": restore["id"] }));
    assert_eq!((restored["state"].as_str(), restored["restored"].clone()), (Some("complete"), json!([one.id()])), "{restored}");
    let after = w.converged(&notes, "notes runs again on both nodes after the one-node restore", |t| {
        t["slots"].as_array().is_some_and(|s| s.len() == 2)
    });
    assert_eq!(other_slot(&after), other_before, "the other node's replica ran on through the restore: {after}");
    assert_eq!(note(other), Some("first on 1".to_string()), "the other node's volume is untouched");
    assert_eq!(note(one), Some("first on 0".to_string()), "the restored node serves its backup's data");
    let spec = w.ok("runtime.getServiceSpec", json!({ "serviceId": notes, "clusterId": cluster }));
    assert_eq!(spec["items"][0]["heldNodes"], json!([]), "the node is released: {spec}");

    for node in &mut nodes {
        node.stop_agent(false);
    }
}
