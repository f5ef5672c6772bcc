//! `capstan keyring export-relay-authorization` end to end: the real `capstan` binary as a client
//! of `capstan serve --dev`. A credential minted over the API is exported to a new mode 0600 file
//! whose bytes are the bearer the host holds; an existing output is refused `output-exists` and
//! left untouched unless --force; a stale --expected-generation is refused by name; the bearer
//! shows on standard output only with --stdout, and never in the server's log.

use crate::support::{Capstan, Exited, TEST_ADMIN, client, dev_command, run_to_exit, succeeded, with_test_admin};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn export(server: &Capstan, token: &str, config: &Path, args: &[&str]) -> Exited {
    let mut cmd = client(server, token, config);
    cmd.args(["keyring", "export-relay-authorization"]).args(args);
    run_to_exit(cmd)
}

#[test]
fn the_relay_authorization_export_writes_a_private_file_never_clobbers_and_prints_the_bearer_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let config = dir.path().join("config");
    let out_dir = dir.path().join("export");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::set_permissions(&out_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let created = server.call_as(&admin, "clusters.create", &json!({"name": "edge"})).expect_json(200);
    let cluster = created["cluster"]["id"].as_str().unwrap().to_string();
    let output = out_dir.join("relay-authorization");
    let output_arg = output.to_str().unwrap();

    // nothing to export before a credential exists
    export(&server, &admin, &config, &["--cluster", &cluster, "--out", output_arg]).assert_refused(1, "relay-credential-absent");
    assert!(!output.exists());

    let minted = server
        .call_as(&admin, "relays.mutateCredential", &json!({"clusterId": cluster, "action": "ensure", "mutationId": "e2e-mint"}))
        .expect_json(200);
    assert_eq!(minted["generation"], 1);

    let exited = export(&server, &admin, &config, &["--cluster", &cluster, "--out", output_arg, "--json"]);
    let report: Value = serde_json::from_str(succeeded(&exited).trim()).unwrap();
    let bearer = std::fs::read_to_string(&output).unwrap();
    assert_eq!(bearer.len(), 43, "the bearer byte for byte, no newline");
    assert_eq!(std::fs::metadata(&output).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!((report["ok"].clone(), report["generation"].clone(), report["byteLength"].clone()), (json!(true), json!(1), json!(43)));
    assert!(!exited.stdout.contains(&bearer) && !exited.stderr.contains(&bearer), "never printed without --stdout");

    // the file holds what the host's export answers for that generation
    let answered =
        server.call_as(&admin, "relays.exportAuthorization", &json!({"clusterId": cluster, "expectedGeneration": 1})).expect_json(200);
    assert_eq!(answered["authorization"].as_str().unwrap(), bearer);

    // no clobber: refused by name and left untouched
    std::fs::write(&output, b"kept").unwrap();
    export(&server, &admin, &config, &["--cluster", &cluster, "--out", output_arg]).assert_refused(1, "output-exists");
    assert_eq!(std::fs::read(&output).unwrap(), b"kept");

    // a rotation, then the old generation is refused and --force replaces the file with the new bearer
    server
        .call_as(
            &admin,
            "relays.mutateCredential",
            &json!({"clusterId": cluster, "action": "rotate", "expectedGeneration": 1, "mutationId": "e2e-rotate"}),
        )
        .expect_json(200);
    export(&server, &admin, &config, &["--cluster", &cluster, "--out", output_arg, "--expected-generation", "1", "--force"])
        .assert_refused(1, "relay-credential-generation-mismatch");
    let exited = export(&server, &admin, &config, &["--cluster", &cluster, "--out", output_arg, "--force"]);
    succeeded(&exited);
    let rotated = std::fs::read_to_string(&output).unwrap();
    assert_ne!(rotated, bearer);
    assert_eq!(rotated.len(), 43);
    assert_eq!(std::fs::metadata(&output).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(!exited.stdout.contains(&rotated) && !exited.stderr.contains(&rotated));

    // --stdout prints the bearer alone
    let exited = export(&server, &admin, &config, &["--cluster", &cluster, "--stdout"]);
    assert_eq!(succeeded(&exited), rotated);

    let log = format!("{}{}", server.stdout(), server.stderr());
    assert!(!log.contains(&bearer) && !log.contains(&rotated), "no bearer in the server's log");
}

/// `capstan relays …`: a cluster's relay from the operator's side in a few commands — the zone
/// refused by name with what to set, then enable (origin, credential, next steps), export by the
/// cluster's name, rotate, and disable behind a confirmation.
#[test]
fn capstan_relays_enables_exports_rotates_and_disables_a_relay_by_the_cluster_s_name() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::start(with_test_admin(dev_command(&dir.path().join("data"))));
    let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
    let config = dir.path().join("config");
    let relays = |args: &[&str]| {
        let mut cmd = client(&server, &admin, &config);
        cmd.arg("relays").args(args);
        run_to_exit(cmd)
    };
    server.call_as(&admin, "clusters.create", &json!({"name": "edge"})).expect_json(200);

    let unset = relays(&["enable", "edge"]);
    let stderr = unset.assert_refused(1, "relay-zone-unset");
    assert!(stderr.contains("capstan settings set clusterRelayZone="), "the refusal says what to set: {stderr}");
    let settings = server.call_as(&admin, "settings.get", &json!({})).expect_json(200);
    server
        .call_as(
            &admin,
            "settings.update",
            &json!({ "expectedRevision": settings["revision"], "set": { "clusterRelayZone": "relays.e2e.example" } }),
        )
        .expect_json(200);

    let enabled = succeeded(&relays(&["enable", "edge"])).to_string();
    assert!(enabled.contains("relay of edge") && enabled.contains("relays.e2e.example:8443"), "{enabled}");
    assert!(enabled.contains("credential: generation 1") && enabled.contains("capstan relays export edge --out"), "{enabled}");
    // again: nothing changes
    let again: Value = serde_json::from_str(succeeded(&relays(&["enable", "edge", "--json"])).trim()).unwrap();
    assert_eq!((again["relay"]["enabled"].as_bool(), again["credential"]["generation"].as_u64()), (Some(true), Some(1)), "{again}");

    let out_dir = dir.path().join("export");
    std::fs::create_dir(&out_dir).unwrap();
    std::fs::set_permissions(&out_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let output = out_dir.join("relay-authorization");
    succeeded(&relays(&["export", "edge", "--out", output.to_str().unwrap()]));
    assert_eq!(std::fs::metadata(&output).unwrap().permissions().mode() & 0o777, 0o600);
    relays(&["export", "nowhere", "--out", output.to_str().unwrap()]).assert_refused(1, "cluster-not-found");

    let rotated = succeeded(&relays(&["rotate", "edge"])).to_string();
    assert!(rotated.contains("generation 1 → 2"), "{rotated}");
    assert!(succeeded(&relays(&["list"])).contains("No relay registered yet"));

    relays(&["disable", "edge"]).assert_refused(1, "confirmation-required");
    succeeded(&relays(&["disable", "edge", "--yes"]));
    let clusters = server.call_as(&admin, "clusters.list", &json!({})).expect_json(200);
    assert_eq!(clusters["items"][0]["relay"]["enabled"], false, "{clusters}");
    assert!(!server.stderr().contains(&std::fs::read_to_string(&output).unwrap()), "the bearer is never logged");
}
