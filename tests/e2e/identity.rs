//! Identity end to end: the keyring commands, the keyring at start, the first administrator,
//! sessions and machine tokens over HTTP, and that no secret reaches a log line.

use crate::support::*;
use serde_json::{Value, json};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

fn private_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn keyring(args: &[&str], path: &Path) -> Exited {
    let mut cmd = capstan();
    cmd.arg("keyring").args(args).arg(path);
    run_to_exit(cmd)
}

#[test]
fn keyring_generate_writes_a_private_file_once_and_check_shows_no_key() {
    let dir = private_dir();
    let path = dir.path().join("keyring.json");
    let made = keyring(&["generate", "--json", "--out"], &path);
    assert!(made.status.success(), "{made:?}");
    assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let file: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let kek_id = file["activeKekId"].as_str().unwrap();
    let kek = file["keks"][kek_id].as_str().unwrap();
    let private = file["ingress"]["privateKey"].as_str().unwrap();
    let report: Value = serde_json::from_str(made.stdout.trim()).unwrap();
    assert_eq!(report["keyring"]["activeKekId"], kek_id);

    let again = keyring(&["generate", "--out"], &path);
    again.assert_refused(1, "output-exists");
    assert_eq!(serde_json::from_slice::<Value>(&fs::read(&path).unwrap()).unwrap(), file, "never clobbered");

    let mut check = capstan();
    check.args(["keyring", "check"]).env("CAPSTAN_KEYRING_PATH", &path);
    let checked = run_to_exit(check);
    assert!(checked.status.success(), "{checked:?}");
    assert!(checked.stdout.contains(kek_id) && checked.stdout.contains("sha256:"));
    for secret in [kek, private] {
        assert!(!checked.stdout.contains(secret) && !checked.stderr.contains(secret), "key material printed");
        assert!(!made.stdout.contains(secret) && !made.stderr.contains(secret), "key material printed");
    }
}

#[test]
fn keyring_commands_refuse_unsafe_files_by_name() {
    let dir = private_dir();
    let path = dir.path().join("keyring.json");
    assert!(keyring(&["generate", "--out"], &path).status.success());

    let link = dir.path().join("link.json");
    symlink(&path, &link).unwrap();
    keyring(&["check", "--path"], &link).assert_refused(1, "input-symlink");
    keyring(&["generate", "--out"], &link).assert_refused(1, "output-exists");

    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    keyring(&["check", "--path"], &path).assert_refused(1, "input-permissions");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();

    fs::hard_link(&path, dir.path().join("second")).unwrap();
    keyring(&["check", "--path"], &path).assert_refused(1, "input-hard-links");

    let shared = tempfile::tempdir().unwrap();
    fs::set_permissions(shared.path(), fs::Permissions::from_mode(0o777)).unwrap();
    keyring(&["generate", "--out"], &shared.path().join("k.json")).assert_refused(1, "output-directory-not-private");

    let broken = dir.path().join("broken.json");
    fs::write(&broken, b"{\"version\":1}").unwrap();
    fs::set_permissions(&broken, fs::Permissions::from_mode(0o600)).unwrap();
    keyring(&["check", "--path"], &broken).assert_refused(1, "keyring-invalid");
}

#[test]
fn serve_refuses_a_missing_or_invalid_keyring() {
    let dir = private_dir();
    let prod = ProdConfig::under(dir.path());
    // a valid keyring that group or others may read is refused, naming the fix
    let private = fs::read(&prod.keyring_path).unwrap();
    fs::set_permissions(&prod.keyring_path, fs::Permissions::from_mode(0o640)).unwrap();
    let shared = run_to_exit(prod.command());
    assert!(shared.assert_refused(1, "keyring-invalid").contains("chmod 600"), "{}", shared.stderr);
    let keyring: Value = serde_json::from_slice(&private).unwrap();
    for kek in keyring["keks"].as_object().unwrap().values() {
        assert!(!shared.stderr.contains(kek.as_str().unwrap()), "no key is printed");
    }
    fs::remove_file(&prod.keyring_path).unwrap();
    run_to_exit(prod.command()).assert_refused(1, "keyring-invalid");
    fs::write(&prod.keyring_path, b"{\"version\":1,\"activeKekId\":\"k\",\"keks\":{},\"ingress\":{}}").unwrap();
    fs::set_permissions(&prod.keyring_path, fs::Permissions::from_mode(0o600)).unwrap();
    let refused = run_to_exit(prod.command());
    refused.assert_refused(1, "keyring-invalid");
    assert!(!refused.stderr.contains("chmod"), "refused for its content, not its mode: {}", refused.stderr);
    assert!(!prod.database.exists(), "the store is not opened before the keyring is valid");
}

fn printed_password(stdout: &str) -> Option<String> {
    stdout.lines().find_map(|l| l.trim().strip_prefix("password:").map(|p| p.trim().to_string()))
}

fn login(server: &Capstan, username: &str, password: &str) -> Reply {
    server.call("auth.login", &json!({"username": username, "password": password}).to_string())
}

#[test]
fn dev_mode_prints_the_admin_password_once_and_it_logs_in() {
    let dir = tempfile::tempdir().unwrap();
    let server = Capstan::dev(dir.path());
    let password = printed_password(&server.stdout()).expect("the first start prints the password");
    assert!(password.len() >= 20);
    assert!(!server.stderr().contains(&password), "the password is never logged");

    let answer = login(&server, "admin", &password).expect_json(200);
    let token = answer["token"].as_str().unwrap().to_string();
    let me = server.call_as(&token, "auth.whoami", &json!({})).expect_json(200);
    assert_eq!((me["username"].as_str(), me["admin"].as_bool()), (Some("admin"), Some(true)));
    server.stop();

    let again = Capstan::dev(dir.path());
    assert!(printed_password(&again.stdout()).is_none(), "never printed again");
    login(&again, "admin", &password).expect_json(200);
}

#[test]
fn sessions_and_machine_tokens_over_http_and_no_secret_in_any_log() {
    let dir = tempfile::tempdir().unwrap();
    let admin_password = "planted-admin-password-0123456789";
    let mut cmd = dev_command(dir.path());
    cmd.env("CAPSTAN_ADMIN_ACCOUNT", format!("root:{admin_password}")).env("CAPSTAN_LOG", "debug");
    let server = Capstan::start(cmd);
    assert!(printed_password(&server.stdout()).is_none(), "an explicit account prints nothing");

    // one uniform denial
    let wrong_password = login(&server, "root", "definitely-not-the-password").expect_error(401, "unauthenticated");
    let wrong_user = login(&server, "nobody", admin_password).expect_error(401, "unauthenticated");
    assert_eq!(wrong_password, wrong_user, "the same denial for a wrong username and a wrong password");
    server.call("auth.whoami", "{}").expect_error(401, "unauthenticated");
    server.call_as("not-a-jwt", "auth.whoami", &json!({})).expect_error(401, "unauthenticated");

    let jwt = login(&server, "root", admin_password).expect_json(200)["token"].as_str().unwrap().to_string();
    let created = server.call_as(&jwt, "admin.createMachineUser", &json!({"username": "deployer"})).expect_json(200);
    let machine_token = created["token"].as_str().unwrap().to_string();
    let machine_id = created["userId"].as_str().unwrap().to_string();

    let machine_jwt = server.call("auth.exchangeToken", &json!({"token": machine_token}).to_string()).expect_json(200)["token"]
        .as_str()
        .unwrap()
        .to_string();
    let me = server.call_as(&machine_jwt, "auth.whoami", &json!({})).expect_json(200);
    assert_eq!(me["kind"], "machine");
    server.call_as(&machine_jwt, "admin.listMachineUsers", &json!({})).expect_error(403, "forbidden");

    let rotated = server.call_as(&jwt, "admin.rotateMachineToken", &json!({"userId": machine_id})).expect_json(200);
    let rotated_token = rotated["token"].as_str().unwrap().to_string();
    server.call_as(&machine_jwt, "auth.whoami", &json!({})).expect_error(401, "unauthenticated");

    let me = server.call_as(&jwt, "auth.whoami", &json!({})).expect_json(200);
    let new_password = "planted-rotated-password-abcdefghij";
    let mutation = json!({
        "userId": me["userId"], "expectedGeneration": 1, "mutationId": "rotate-1",
        "operation": {"rotatePassword": {"newPassword": new_password}}
    });
    let changed = server.call_as(&jwt, "admin.mutateHumanCredential", &mutation).expect_json(200);
    assert_eq!((changed["generation"].as_u64(), changed["replayed"].as_bool()), (Some(2), Some(false)));
    server.call_as(&jwt, "auth.whoami", &json!({})).expect_error(401, "unauthenticated");
    let jwt2 = login(&server, "root", new_password).expect_json(200)["token"].as_str().unwrap().to_string();
    let replay = server.call_as(&jwt2, "admin.mutateHumanCredential", &mutation).expect_json(200);
    assert_eq!(replay["replayed"], true);
    let mut reused = json!({
        "userId": me["userId"], "expectedGeneration": 2, "mutationId": "rotate-1",
        "operation": {"revokeSessions": {}}
    });
    server.call_as(&jwt2, "admin.mutateHumanCredential", &reused).expect_error(409, "mutation-reused");
    reused["operation"] = json!({"revokeSessions": {}, "extra": 1});
    server.call_as(&jwt2, "admin.mutateHumanCredential", &reused).expect_error(400, "invalid-request");

    server.call_as(&jwt2, "auth.logout", &json!({})).expect_json(200);
    server.call_as(&jwt2, "auth.whoami", &json!({})).expect_error(401, "unauthenticated");

    let logs = server.stderr() + &server.stdout();
    for secret in [admin_password, new_password, &machine_token, &rotated_token, &machine_jwt, &jwt, &jwt2] {
        assert!(!logs.contains(secret), "a planted secret reached the output: {}…", &secret[..8]);
    }
}

/// A login from the client `forwarded` names in X-Forwarded-For.
fn login_from(server: &Capstan, forwarded: &str, username: &str, password: &str) -> Reply {
    let body = json!({"username": username, "password": password}).to_string();
    server.request(
        "POST",
        "/api/v1/auth.login",
        &[("content-type", "application/json"), ("x-forwarded-for", forwarded)],
        Some(body.as_bytes()),
    )
}

#[test]
fn failed_logins_slow_down_their_client_over_http() {
    let dir = tempfile::tempdir().unwrap();
    // without trusted proxies X-Forwarded-For is ignored: every guess here comes from one peer
    let server = Capstan::dev(dir.path());
    for i in 0..5 {
        login_from(&server, &format!("198.51.100.{i}"), "admin", "wrong-password-wrong-password").expect_error(401, "unauthenticated");
    }
    let limited = login_from(&server, "198.51.100.99", "admin", "wrong-password-wrong-password").expect_error(429, "rate-limited");
    assert!(limited["retryable"].as_bool().unwrap());
    assert!(limited["data"]["retryAfterMs"].as_u64().unwrap() > 0);
}

#[test]
fn behind_a_trusted_proxy_a_strangers_guesses_do_not_lock_the_user_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = dev_command(&dir.path().join("data"));
    cmd.env("CAPSTAN_TRUSTED_PROXIES", "127.0.0.0/8");
    let server = Capstan::start(cmd);
    let password = server.printed_admin_password().expect("the dev administrator's password");
    for _ in 0..5 {
        login_from(&server, "198.51.100.7", "admin", "wrong-password-wrong-password").expect_error(401, "unauthenticated");
    }
    login_from(&server, "198.51.100.7", "admin", &password).expect_error(429, "rate-limited");
    // the user, behind the same proxy from another address, logs in
    let answer = login_from(&server, "203.0.113.9", "admin", &password).expect_json(200);
    assert!(answer["token"].as_str().is_some_and(|t| !t.is_empty()), "{answer}");
}
