//! Secrets end to end, through the real binary: a planted value set through the CLI from
//! standard input (created, then rotated), a system secret, a generated one, list / get /
//! revoke, every `secrets.*` method over HTTP with each refusal by name, a keyring rotation
//! with `capstan keyring rotate` and a restart, then `capstan secrets rewrap` moving every
//! version onto the new KEK. Throughout, the planted value appears in no HTTP answer, no CLI
//! output and no line the server wrote.

use crate::support::*;
use capstan::secrets::ingress;
use capstan::secrets::methods::MAX_VALUE_BYTES;
use serde_json::{Value, json};
use std::cell::RefCell;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

const PLANTED: &str = "hunter2-planted-e2e-5c1f0a";
const PLANTED_ROTATED: &str = "hunter2-planted-e2e-rotated-77e2";
const PLANTED_SYSTEM: &str = "hunter2-planted-e2e-system-09bd";

fn planted(text: &str) -> bool {
    [PLANTED, PLANTED_ROTATED, PLANTED_SYSTEM].iter().any(|p| text.contains(p))
}

/// Everything a client saw (HTTP bodies, CLI output), to search for the planted values at the end.
#[derive(Default)]
struct Seen(RefCell<Vec<String>>);

impl Seen {
    fn keep(&self, text: &str) {
        self.0.borrow_mut().push(text.to_string());
    }
}

struct Cli<'a> {
    dir: PathBuf,
    config: PathBuf,
    url: String,
    seen: &'a Seen,
}

impl Cli<'_> {
    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = capstan();
        cmd.args(args).env("XDG_CONFIG_HOME", &self.config).env("CAPSTAN_URL", &self.url);
        cmd
    }

    fn finish(&self, exited: Exited) -> Exited {
        self.seen.keep(&exited.stdout);
        self.seen.keep(&exited.stderr);
        exited
    }

    /// Run with `stdin` (bytes written to a file first) as standard input.
    fn run_with(&self, args: &[&str], stdin: &[u8]) -> Exited {
        let file = self.dir.join(format!("stdin-{:016x}", rand::random::<u64>()));
        std::fs::write(&file, stdin).unwrap();
        let mut cmd = self.command(args);
        cmd.stdin(std::fs::File::open(&file).unwrap());
        let exited = run_to_exit(cmd);
        std::fs::remove_file(&file).unwrap();
        self.finish(exited)
    }

    fn run(&self, args: &[&str]) -> Exited {
        self.finish(run_to_exit(self.command(args)))
    }

    fn login(&self, password: &str) {
        let exited = self.run_with(&["login", "--username", "admin", "--password-stdin"], format!("{password}\n").as_bytes());
        assert!(exited.status.success(), "capstan login: {exited:?}");
    }

    /// `--json` appended; success and one line of JSON.
    fn json_with(&self, args: &[&str], stdin: &[u8]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let exited = self.run_with(&all, stdin);
        assert!(exited.status.success(), "capstan {}: {exited:?}", all.join(" "));
        assert_eq!(exited.stdout.lines().count(), 1, "--json prints one line: {:?}", exited.stdout);
        serde_json::from_str(&exited.stdout).unwrap_or_else(|e| panic!("capstan {}: no JSON ({e}): {}", all.join(" "), exited.stdout))
    }

    fn json(&self, args: &[&str]) -> Value {
        self.json_with(args, b"")
    }

    fn text(&self, args: &[&str]) -> String {
        let exited = self.run(args);
        assert!(exited.status.success(), "capstan {}: {exited:?}", args.join(" "));
        exited.stdout
    }

    fn refused_with(&self, args: &[&str], stdin: &[u8], code: &str) -> Exited {
        let exited = self.run_with(args, stdin);
        assert_eq!(exited.status.code(), Some(1), "capstan {} should be refused {code}: {exited:?}", args.join(" "));
        let line = format!("capstan: refused ({code}): ");
        assert!(exited.stderr.lines().any(|l| l.starts_with(&line)), "capstan {}: expected {line:?}: {exited:?}", args.join(" "));
        exited
    }
}

struct Http<'a> {
    server: &'a Capstan,
    seen: &'a Seen,
}

impl Http<'_> {
    fn call(&self, token: &str, method: &str, body: Value) -> Reply {
        let reply = self.server.call_as(token, method, &body);
        self.seen.keep(&reply.body);
        reply
    }

    fn ok(&self, token: &str, method: &str, body: Value) -> Value {
        self.call(token, method, body).expect_json(200)
    }

    fn refused(&self, token: &str, method: &str, body: Value, status: u16, code: &str) -> Value {
        self.call(token, method, body).expect_error(status, code)
    }
}

/// A value sealed to the server's ingress recipient for `method` on `owner`/`key`, as a client does.
pub(crate) fn seal(recipient: &Value, method: &str, owner_ref: &str, key: &str, value: &[u8]) -> Value {
    use base64::Engine;
    let public: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(recipient["publicKey"].as_str().unwrap())
        .unwrap()
        .try_into()
        .expect("a 32-byte X25519 key");
    let id = recipient["recipientId"].as_str().unwrap();
    let sealed = ingress::seal_to(id, &x25519_dalek::PublicKey::from(public), &ingress::target(method, owner_ref, key), value);
    json!({ "sealed": sealed })
}

/// Run `cmd` with a pseudo-terminal as standard input (so `isatty(0)` holds).
fn run_on_terminal(mut cmd: std::process::Command) -> Exited {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two new descriptors into the given integers; the name, termios
    // and winsize pointers may be null.
    let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(rc, 0, "openpty failed");
    // SAFETY: both descriptors were just opened by openpty and are owned here alone.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    cmd.stdin(Stdio::from(slave));
    let exited = run_to_exit(cmd);
    drop(master);
    exited
}

#[test]
fn a_planted_value_goes_in_sealed_and_never_comes_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = dir.path().join("data");
    let seen = Seen::default();
    let server = Capstan::dev(&data);
    let password = server.printed_admin_password().expect("the first dev start prints the admin password");
    let admin = server.login("admin", &password);
    let http = Http { server: &server, seen: &seen };
    let cli = Cli { dir: dir.path().to_path_buf(), config: dir.path().join("config"), url: server.url(""), seen: &seen };
    cli.login(&password);

    let org = http.ok(&admin, "organizations.create", json!({ "name": "acme" }));
    let org_id = org["id"].as_str().unwrap().to_string();
    let svc = http.ok(&admin, "services.create", json!({ "name": "web", "organizationId": org_id, "image": "nginx" }));
    let svc_id = svc["id"].as_str().unwrap().to_string();
    let owner_ref = format!("service:{svc_id}");

    // ---- the CLI: set from standard input (create, then rotate), set-system, generate ----
    let created = cli.json_with(&["secrets", "set", "--service", &svc_id, "DB_PASSWORD"], format!("{PLANTED}\n").as_bytes());
    let db_id = created["id"].as_str().unwrap().to_string();
    assert_eq!(
        (created["versions"].as_u64(), created["ownerRef"].as_str(), created["environment"].as_str()),
        (Some(1), Some(owner_ref.as_str()), Some("production"))
    );
    let again = cli.run_with(&["secrets", "set", "--service", &svc_id, "DB_PASSWORD"], PLANTED_ROTATED.as_bytes());
    assert!(again.status.success(), "{again:?}");
    assert!(again.stdout.contains(&format!("rotated secret {db_id}")) && again.stdout.contains("2 versions"), "{}", again.stdout);
    let system = cli.json_with(&["secrets", "set-system", "GATEWAY_TOKEN"], PLANTED_SYSTEM.as_bytes());
    assert_eq!((system["ownerRef"].as_str(), system["organizationId"].as_str()), (Some("system:capstan"), Some("")));
    let set = cli.json(&["secrets", "sets", "create", "--organization", &org_id, "shared", "--description", "smtp relay"]);
    let set_id = set["id"].as_str().unwrap().to_string();
    let shared = cli.json_with(&["secrets", "set", "--secret-set", &set_id, "SHARED_KEY", "--environment", "staging"], PLANTED.as_bytes());
    assert_eq!(
        (shared["ownerRef"].as_str(), shared["environment"].as_str()),
        (Some(format!("organization:{org_id}/secretSet:{set_id}").as_str()), Some("staging"))
    );
    // attached, the set's key resolves for the service (the CLI reads the secrets revision itself)
    let attached = cli.json(&["secrets", "attach", "--service", &svc_id, "--secret-set", &set_id]);
    assert_eq!(attached["secretsRevision"], 1);
    let preview = cli.json(&["secrets", "preview", "--service", &svc_id]);
    let entry = preview["entries"].as_array().unwrap().iter().find(|e| e["key"] == "SHARED_KEY").cloned().unwrap();
    assert_eq!((entry["environment"].as_str(), entry["from"]["secretSetId"].as_str()), (Some("staging"), Some(set_id.as_str())));
    assert!(cli.text(&["secrets", "preview", "--service", &svc_id]).contains(&format!("SecretSet {set_id}")));
    // named by its name, the service is shown by it, its id beside it
    let by_name = cli.text(&["secrets", "preview", "--service", "web"]);
    assert!(by_name.starts_with(&format!("service web ({svc_id}): secrets revision 1")), "{by_name}");
    cli.refused_with(&["secrets", "attach", "--service", &svc_id, "--secret-set", &set_id], b"", "secret-set-already-attached");
    let shown = cli.text(&["secrets", "sets", "show", &set_id]);
    assert!(shown.contains("SHARED_KEY") && shown.contains(&svc_id), "{shown}");
    let generated = cli.json(&["secrets", "generate", "--service", &svc_id, "API_TOKEN", "--length", "48", "--alphabet", "hex"]);
    let api_id = generated["id"].as_str().unwrap().to_string();
    assert_eq!(generated["versions"], 1);

    // the values are really there, sealed (read through the library, as the host would)
    let opened = open_current(&data, &[db_id.as_str(), api_id.as_str()]);
    assert_eq!(opened[0], PLANTED_ROTATED.as_bytes(), "the second set rotated to the new value, without its newline");
    assert!(opened[1].len() == 48 && opened[1].iter().all(u8::is_ascii_hexdigit));

    // ---- the CLI's own refusals on the value ----
    let set = ["secrets", "set", "--service", svc_id.as_str(), "OTHER_KEY"];
    cli.refused_with(&set, b"", "input-empty");
    cli.refused_with(&set, b"\n", "input-empty");
    let mut big = PLANTED.as_bytes().to_vec();
    big.resize(MAX_VALUE_BYTES + 1, b'x');
    cli.refused_with(&set, &big, "input-oversized");
    let on_terminal = cli.finish(run_on_terminal(cli.command(&set)));
    assert_eq!(on_terminal.status.code(), Some(1), "{on_terminal:?}");
    assert!(on_terminal.stderr.starts_with("capstan: refused (input-terminal): "), "{on_terminal:?}");
    // a value is never an argument
    // (clap's refusal quotes the stray argument back, which was the caller's own argv: not recorded)
    let as_argument = run_to_exit(cli.command(&["secrets", "set", "--service", &svc_id, "OTHER_KEY", PLANTED]));
    assert_eq!(as_argument.status.code(), Some(2), "clap refuses an extra argument: {as_argument:?}");

    // ---- list / get / revoke through the CLI ----
    let listed = cli.json(&["secrets", "list", "--service", &svc_id]);
    let mut keys: Vec<&str> = listed["items"].as_array().unwrap().iter().map(|s| s["key"].as_str().unwrap()).collect();
    keys.sort();
    assert_eq!(keys, ["API_TOKEN", "DB_PASSWORD"]);
    assert_eq!(cli.json(&["secrets", "list", "--system", "capstan"])["items"].as_array().unwrap().len(), 1);
    assert_eq!(cli.json(&["secrets", "list"])["items"].as_array().unwrap().len(), 4);
    let table = cli.text(&["secrets", "list"]);
    assert!(table.starts_with("ID") && table.contains("GATEWAY_TOKEN"), "{table}");
    let detail = cli.json(&["secrets", "get", &db_id]);
    assert_eq!(detail["versionHistory"].as_array().unwrap().len(), 2);
    assert!(cli.text(&["secrets", "get", &db_id]).contains("VERSION"));
    let revoked = cli.json(&["secrets", "revoke", &api_id, "--yes"]);
    assert_eq!(revoked["state"], "revoked");
    cli.refused_with(&["secrets", "generate", "--service", &svc_id, "API_TOKEN"], b"", "secret-revoked");
    cli.refused_with(&["secrets", "get", "sec_missing"], b"", "secret-not-found");

    // ---- every method over HTTP, with its refusals ----
    let recipient = http.ok(&admin, "secrets.getIngressRecipient", json!({}));
    assert_eq!(recipient["profile"], ingress::PROFILE);
    let owner = json!({ "kind": "service", "serviceId": svc_id });
    let elsewhere = seal(&recipient, "secrets.create", &owner_ref, "ANOTHER_KEY", PLANTED.as_bytes());
    http.refused(&admin, "secrets.create", json!({ "owner": owner, "key": "HTTP_KEY", "value": elsewhere }), 400, "sealed-input-invalid");
    let for_rotate = seal(&recipient, "secrets.rotate", &owner_ref, "HTTP_KEY", PLANTED.as_bytes());
    http.refused(&admin, "secrets.create", json!({ "owner": owner, "key": "HTTP_KEY", "value": for_rotate }), 400, "sealed-input-invalid");
    let empty = seal(&recipient, "secrets.create", &owner_ref, "HTTP_KEY", b"");
    http.refused(&admin, "secrets.create", json!({ "owner": owner, "key": "HTTP_KEY", "value": empty }), 400, "input-empty");
    let oversized = seal(&recipient, "secrets.create", &owner_ref, "HTTP_KEY", &big);
    http.refused(&admin, "secrets.create", json!({ "owner": owner, "key": "HTTP_KEY", "value": oversized }), 400, "input-oversized");
    let good = seal(&recipient, "secrets.create", &owner_ref, "HTTP_KEY", PLANTED.as_bytes());
    for body in [
        json!({ "owner": owner, "key": "HTTP_KEY", "value": good, "note": PLANTED }),
        json!({ "owner": owner, "key": "HTTP_KEY", "value": { "plain": PLANTED } }),
        json!({ "owner": owner, "key": "HTTP_KEY", "value": PLANTED }),
    ] {
        http.refused(&admin, "secrets.create", body, 400, "invalid-request");
    }
    let scope = format!("mail:{svc_id}");
    let http_secret =
        http.ok(&admin, "secrets.create", json!({ "owner": owner, "key": "HTTP_KEY", "managementScope": scope, "value": good }));
    let http_id = http_secret["id"].as_str().unwrap().to_string();
    let again = seal(&recipient, "secrets.create", &owner_ref, "HTTP_KEY", PLANTED.as_bytes());
    http.refused(&admin, "secrets.create", json!({ "owner": owner, "key": "HTTP_KEY", "value": again }), 409, "exists");
    let first_version = http_secret["currentVersionId"].clone();
    let rotate_value = seal(&recipient, "secrets.rotate", &owner_ref, "HTTP_KEY", PLANTED_ROTATED.as_bytes());
    http.refused(
        &admin,
        "secrets.rotate",
        json!({ "id": http_id, "expectedVersionId": first_version, "value": rotate_value }),
        400,
        "management-scope-mismatch",
    );
    let rotated = http.ok(
        &admin,
        "secrets.rotate",
        json!({ "id": http_id, "expectedVersionId": first_version, "managementScope": scope, "value": rotate_value }),
    );
    assert_eq!(rotated["versions"], 2);
    http.refused(
        &admin,
        "secrets.rotate",
        json!({ "id": http_id, "expectedVersionId": first_version, "managementScope": scope, "value": { "generate": { "length": 16, "alphabet": "hex" } } }),
        409,
        "conflict",
    );
    http.refused(&admin, "secrets.revoke", json!({ "id": http_id }), 400, "management-scope-mismatch");
    http.ok(&admin, "secrets.revoke", json!({ "id": http_id, "managementScope": scope }));
    http.refused(
        &admin,
        "secrets.rotate",
        json!({ "id": http_id, "expectedVersionId": rotated["currentVersionId"], "managementScope": scope, "value": { "generate": { "length": 16, "alphabet": "hex" } } }),
        400,
        "secret-revoked",
    );
    http.refused(&admin, "secrets.get", json!({ "id": "sec_missing" }), 404, "secret-not-found");
    http.refused(&admin, "secrets.revoke", json!({ "id": "sec_missing" }), 404, "secret-not-found");
    let listed = http.ok(&admin, "secrets.list", json!({ "owner": owner }));
    assert_eq!(listed["items"].as_array().unwrap().len(), 3);
    let got = http.ok(&admin, "secrets.get", json!({ "id": http_id }));
    assert!(!got.to_string().contains("ciphertext") && !got.to_string().contains("wrappedDek"), "{got}");
    http.refused(&admin, "secrets.rewrap", json!({ "limit": 501 }), 400, "invalid-request");
    http.refused(&admin, "secrets.rewrap", json!({ "cursor": null, "extra": PLANTED }), 400, "invalid-request");

    // the set and the service's configuration read back; a rename states the revision
    let configuration = http.ok(&admin, "secrets.getServiceConfiguration", json!({ "serviceId": svc_id }));
    assert_eq!(
        (configuration["secretsRevision"].as_u64(), configuration["attachments"][0]["secretSetId"].as_str()),
        (Some(1), Some(set_id.as_str()))
    );
    let sets = http.ok(&admin, "secrets.listSecretSets", json!({ "organizationId": org_id }));
    assert_eq!(sets["items"].as_array().unwrap().len(), 1);
    http.refused(&admin, "secrets.updateSecretSet", json!({ "id": set_id, "expectedRevision": 9, "name": "relay" }), 409, "conflict");
    let renamed = http.ok(&admin, "secrets.updateSecretSet", json!({ "id": set_id, "expectedRevision": 1, "name": "relay" }));
    assert_eq!(renamed["name"], "relay");

    // retiring the SecretSet detaches it from the service in the same transaction
    http.refused(&admin, "secrets.retireSecretSet", json!({ "id": set_id, "expectedRevision": 7 }), 409, "conflict");
    let retire = json!({ "id": set_id, "expectedRevision": 2, "mutationId": "retire-shared-1" });
    let retired = http.ok(&admin, "secrets.retireSecretSet", retire.clone());
    assert_eq!((retired["secretSet"]["state"].as_str(), retired["detachedServiceIds"].clone()), (Some("retired"), json!([svc_id])));
    assert_eq!(http.ok(&admin, "secrets.retireSecretSet", retire), retired, "an exact replay answers the first answer");
    let preview = http.ok(&admin, "secrets.previewResolution", json!({ "serviceId": svc_id }));
    assert!(preview["entries"].as_array().unwrap().iter().all(|e| e["key"] != "SHARED_KEY"), "{preview}");
    let attach = json!({ "serviceId": svc_id, "secretSetId": set_id, "expectedSecretsRevision": preview["secretsRevision"] });
    http.refused(&admin, "secrets.attachSecretSet", attach.clone(), 409, "secret-set-retired");
    http.refused(&admin, "secrets.detachSecretSet", attach, 409, "secret-set-not-attached");
    http.refused(&admin, "secrets.getSecretSet", json!({ "id": "sset_missing" }), 404, "secret-set-not-found");

    // a person who is not an administrator reaches none of it (the recipient is public knowledge)
    let person = http.ok(&admin, "admin.createUser", json!({ "username": "olga" }));
    let olga = server.login("olga", person["password"].as_str().unwrap());
    http.ok(&olga, "secrets.getIngressRecipient", json!({}));
    let generate = json!({ "generate": { "length": 16, "alphabet": "hex" } });
    for (method, body) in [
        (
            "secrets.create",
            json!({ "owner": owner, "key": "OLGA_KEY", "value": seal(&recipient, "secrets.create", &owner_ref, "OLGA_KEY", PLANTED.as_bytes()) }),
        ),
        ("secrets.rotate", json!({ "id": db_id, "expectedVersionId": detail["currentVersionId"], "value": generate })),
        ("secrets.revoke", json!({ "id": db_id })),
        ("secrets.list", json!({})),
        ("secrets.get", json!({ "id": db_id })),
        ("secrets.rewrap", json!({})),
        ("secrets.createSecretSet", json!({ "organizationId": org_id, "name": "olgas" })),
        ("secrets.listSecretSets", json!({})),
        ("secrets.previewResolution", json!({ "serviceId": svc_id })),
    ] {
        http.refused(&olga, method, body, 403, "forbidden");
    }

    // nothing to move while one KEK is all there is
    let idle = cli.json(&["secrets", "rewrap"]);
    assert_eq!((idle["rewrapped"].as_u64(), idle["alreadyCurrent"].as_u64()), (Some(0), Some(7)), "{idle}");
    let first_run = server.stop();
    seen.keep(&first_run.stdout);
    seen.keep(&first_run.stderr);

    // ---- keyring rotation, a restart, and a rewrap in chunks ----
    let keyring = data.join("keyring.json");
    let rotate = cli.run(&["keyring", "rotate", "--keyring", keyring.to_str().unwrap(), "--kek-id", "kek-e2e-second"]);
    assert!(rotate.status.success(), "{rotate:?}");
    assert!(rotate.stdout.contains("kek-e2e-second") && rotate.stdout.contains("sha256:"), "{}", rotate.stdout);
    assert_eq!(std::fs::metadata(&keyring).unwrap().permissions().mode() & 0o777, 0o600);
    let file: Value = serde_json::from_slice(&std::fs::read(&keyring).unwrap()).unwrap();
    for kek in file["keks"].as_object().unwrap().values() {
        assert!(!rotate.stdout.contains(kek.as_str().unwrap()), "rotate printed a key");
    }
    let help = cli.run(&["keyring", "rotate", "--help"]);
    assert!(help.stdout.contains("restart") && help.stdout.contains("keeps opening"), "{}", help.stdout);

    let server = Capstan::dev(&data);
    let http = Http { server: &server, seen: &seen };
    let cli = Cli { url: server.url(""), ..cli };
    // a new port is a new server URL to the CLI's stored credentials
    cli.login(&password);
    let admin = server.login("admin", &password);
    let chunks = cli.run(&["secrets", "rewrap", "--limit", "3"]);
    assert!(chunks.status.success(), "{chunks:?}");
    assert!(chunks.stdout.contains("chunk 3:") && chunks.stdout.contains("done: 7 version(s) re-wrapped"), "{}", chunks.stdout);
    let done = cli.json(&["secrets", "rewrap"]);
    assert_eq!(
        (done["rewrapped"].as_u64(), done["alreadyCurrent"].as_u64(), done["activeKekId"].as_str()),
        (Some(0), Some(7), Some("kek-e2e-second"))
    );
    let history = http.ok(&admin, "secrets.get", json!({ "id": db_id }));
    assert!(history["versionHistory"].as_array().unwrap().iter().all(|v| v["kekId"] == "kek-e2e-second"), "{history}");
    // a version sealed under the first KEK still opens after it moved (the rotated value is current)
    assert_eq!(open_current(&data, &[db_id.as_str()])[0], PLANTED_ROTATED.as_bytes());
    // a new value after the rotation is sealed under the new KEK
    let after = cli.json_with(&["secrets", "set-system", "GATEWAY_TOKEN"], PLANTED.as_bytes());
    assert_eq!(after["versions"], 2);

    // ---- no planted value anywhere a client or the log could see ----
    let second_run = server.stop();
    seen.keep(&second_run.stdout);
    seen.keep(&second_run.stderr);
    let seen = seen.0.borrow();
    assert!(seen.len() > 60, "the matrix ran ({} outputs)", seen.len());
    for text in seen.iter() {
        assert!(!planted(text), "a planted value was shown: {text}");
    }
}

/// The current plaintext of each secret, opened with the data directory's keyring.
fn open_current(data: &Path, ids: &[&str]) -> Vec<Vec<u8>> {
    let keyring = capstan::keyring::Keyring::load(&data.join("keyring.json")).unwrap();
    let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    with_store(&data.join("capstan.sqlite"), &[], |store| async move {
        capstan::secrets::methods::declare(&store).await.unwrap();
        let mut out = Vec::new();
        for id in &ids {
            out.push(capstan::secrets::methods::open_current(&store, &keyring, id).await.unwrap().to_vec());
        }
        out
    })
}
