//! Starts against a database whose migration ledger this build cannot carry forward.

use crate::support::{
    Capstan, ProdConfig, TEST_ADMIN, capstan, cli, eventually, free_port, insert_doc, ok, read_ledger, run_to_exit, succeeded,
    with_test_admin,
};
use capstan::store::Document;
use serde_json::{Value, json};

/// A production config under a fresh temp dir whose store holds a ledger at `version`.
fn database_at(version: &str) -> (tempfile::TempDir, ProdConfig, Document) {
    let dir = tempfile::tempdir().unwrap();
    let prod = ProdConfig::under(dir.path());
    std::fs::create_dir_all(prod.database.parent().unwrap()).unwrap();
    let ledger = json!({"dataVersion": version, "lock": null, "running": null, "history": []});
    let doc = insert_doc(&prod.database, capstan::migrate::LEDGER_COLLECTION, "capstan", ledger);
    (dir, prod, doc)
}

fn refused_start(version: &str, code: &str) {
    let (_dir, prod, before) = database_at(version);
    let exited = run_to_exit(prod.command());
    let stderr = exited.assert_refused(1, code);
    assert!(stderr.contains(version), "the refusal should name the data version {version}; stderr:\n{stderr}");
    let after = read_ledger(&prod.database);
    assert_eq!(after.as_ref(), Some(&before), "a refused start must leave the ledger untouched (revision and data)");
}

#[test]
fn a_data_version_ahead_of_this_build_is_refused() {
    refused_start("99.0.0", "data-version-ahead");
}

#[test]
fn a_ledger_below_the_oldest_supported_version_is_refused_untouched() {
    let floor = capstan::migrate::host_chain().oldest_supported;
    assert_eq!(floor.to_string(), "0.1.0", "this test assumes the host floor is 0.1.0; pick a version below the new floor");
    refused_start("0.0.1", "ledger-below-oldest-supported-version");
}

#[test]
fn a_ledger_that_is_not_semver_is_refused() {
    refused_start("not-a-version", "ledger-invalid");
}

/// `tests/e2e/data/data-0.1.0/documents.json`: the migration ledger and the documents a
/// Capstan at data version 0.1.0 wrote — an organization, a service whose two addresses the
/// mail manager had bound at the test gateway (its `mail` record as that release kept it on the
/// service), and the manager's hold — read out of its store as they were; beside them a second
/// service `api` in the middle of its move onto CoreMail, its `coreMail` record in that release's
/// shape (`CoreMailBinding {bindingId, want}`, as `inventory::services` defined it). Its moments
/// are seconds since the epoch, as every release before data version 0.3.0 wrote them.
const DATA_0_1_0: &str = include_str!("data/data-0.1.0/documents.json");

#[test]
fn a_store_the_previous_release_wrote_is_carried_forward_its_managers_records_into_facets_its_moments_into_milliseconds() {
    let fixture: Value = serde_json::from_str(DATA_0_1_0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let db = data.join("capstan.sqlite");
    insert_doc(&db, capstan::migrate::LEDGER_COLLECTION, "capstan", fixture["ledger"].clone());
    let (mut service_before, mut moving_before) = (Value::Null, Value::Null);
    for doc in fixture["documents"].as_array().unwrap() {
        let (collection, id) = (doc["collection"].as_str().unwrap(), doc["id"].as_str().unwrap());
        insert_doc(&db, collection, id, doc["data"].clone());
        match (collection, doc["data"]["name"].as_str()) {
            ("services", Some("web")) => service_before = json!({ "id": id, "data": doc["data"] }),
            ("services", Some("api")) => moving_before = json!({ "id": id, "data": doc["data"] }),
            _ => {}
        }
    }
    let bindings = service_before["data"]["mail"].clone();
    assert_eq!(bindings.as_array().map(Vec::len), Some(2), "the fixture holds the mail manager's record: {service_before}");

    let mut cmd = with_test_admin(capstan());
    cmd.args(["serve", "--dev", "--data-dir"]).arg(&data).args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    let server = Capstan::start(cmd);
    server.ready_status();
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let status = ok(&server, &admin, "migrations.getStatus", json!({}));
    assert_eq!(status["dataVersion"], capstan::migrate::host_chain().target().to_string(), "{status}");

    let id = service_before["id"].as_str().unwrap();
    let service = ok(&server, &admin, "services.get", json!({ "id": id }));
    let record = &service;
    assert_eq!(record["facets"]["mail"]["bindings"], bindings, "the mail manager's record is its facet now: {service}");
    assert!(record.get("mail").is_none() && record.get("coreMail").is_none(), "no manager's record is a field of the service: {service}");
    assert_eq!(record["mailAddresses"], service_before["data"]["mailAddresses"], "the rest of the service is as it was: {service}");
    // its moments, written in seconds, read in milliseconds now (0.2.0 → 0.3.0)
    let in_ms = |secs: &Value| json!(secs.as_u64().unwrap() * 1000);
    assert_eq!(record["createdAt"], in_ms(&service_before["data"]["createdAt"]), "{service}");
    assert_eq!(record["updatedAt"], in_ms(&service_before["data"]["updatedAt"]), "{service}");
    let organization = ok(&server, &admin, "organizations.get", json!({ "id": record["organizationId"] }));
    assert_eq!(organization["createdAt"], json!(1_796_545_399_000u64), "{organization}");
    // CoreMail's record is CoreMail's facet, as it was
    let moving = ok(&server, &admin, "services.get", json!({ "id": moving_before["id"] }));
    assert_eq!(moving["facets"]["coremail"], moving_before["data"]["coreMail"], "CoreMail's record is its facet now: {moving}");
    assert!(moving.get("coreMail").is_none() && moving["facets"].get("mail").is_none(), "{moving}");
    assert_eq!(moving["mailAddresses"], json!(["api@acme.example"]), "{moving}");
    // the hold counts again once the mail manager is installed (in the background at start)
    eventually("the mail manager's hold counted", std::time::Duration::from_secs(180), || {
        let service = ok(&server, &admin, "services.get", json!({ "id": id }));
        if service["holds"] == json!(["plugin:mail"]) { Ok(()) } else { Err(service.to_string()) }
    });

    // the CLI prints each manager's facet as it is, knowing none of them
    let printed = cli(&server, &admin, &dir.path().join("config"), &["services", "get", id]);
    let printed = succeeded(&printed);
    assert!(printed.contains("facet mail:"), "{printed}");
    assert!(printed.contains("bindings[0].address: web@acme.example"), "{printed}");
    assert!(printed.contains("bindings[1].inbound.port: 30025"), "{printed}");

    // an operator's change keeps the facet, and cannot write one
    let revision = record["revision"].clone();
    let updated = ok(&server, &admin, "services.update", json!({ "id": id, "expectedRevision": revision, "scale": 2 }));
    assert_eq!(updated["facets"]["mail"]["bindings"], bindings, "{updated}");
    let reply =
        server.call_as(&admin, "services.update", &json!({ "id": id, "expectedRevision": updated["revision"], "facets": { "mail": {} } }));
    reply.expect_error(400, "invalid-request");
}
