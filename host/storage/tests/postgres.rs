//! Database bindings against a real PostgreSQL server: `CAPSTAN_TEST_POSTGRES_URL`, the URL of
//! its admin role (CREATEROLE and CREATEDB, not a superuser; `.ci/peers.sh` starts one,
//! docs/postgres-peer.md). Unset, the tests print why and pass — unless
//! `CAPSTAN_TEST_REQUIRE_POSTGRES` is set, then they fail.

use capstan_storage::postgres::{self, Admin, Presence};
use std::time::Duration;
use tokio_postgres::{Client, Config, NoTls};
use zeroize::Zeroizing;

/// The admin credential of the test server, or `None` (the test skips) when there is none.
fn admin() -> Option<Admin> {
    let Ok(url) = std::env::var("CAPSTAN_TEST_POSTGRES_URL") else {
        let reason = "CAPSTAN_TEST_POSTGRES_URL is not set";
        if std::env::var_os("CAPSTAN_TEST_REQUIRE_POSTGRES").is_some() {
            panic!("CAPSTAN_TEST_REQUIRE_POSTGRES is set but {reason}");
        }
        eprintln!("skipped: {reason} (.ci/peers.sh starts a server; docs/postgres-peer.md)");
        return None;
    };
    Some(parse(&url))
}

/// `postgres://user:password@host:port/db` (user and password percent-decoded).
fn parse(url: &str) -> Admin {
    let rest = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")).expect("a postgres:// URL");
    let (credentials, rest) = rest.rsplit_once('@').expect("user:password@ in the URL");
    let (user, password) = credentials.split_once(':').expect("user:password in the URL");
    let authority = rest.split('/').next().unwrap();
    let (host, port) = authority.rsplit_once(':').expect("host:port in the URL");
    Admin {
        host: host.trim_start_matches('[').trim_end_matches(']').to_owned(),
        port: port.parse().expect("a port"),
        user: decode(user),
        password: Zeroizing::new(decode(password)),
    }
}

fn decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&value[i + 1..i + 3], 16).expect("percent-encoding"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// A binding name of its own for each use: `capstan_t<random>_<what>`.
fn unique(what: &str) -> String {
    postgres::binding_name(&format!("t{:016x}_{what}", rand::random::<u64>())).unwrap()
}

fn password() -> String {
    use rand::Rng;
    rand::rng().sample_iter(rand::distr::Alphanumeric).take(32).map(char::from).collect()
}

/// Drops the bindings it names when the test ends, passed or failed.
struct Cleanup {
    admin: Admin,
    names: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (admin, names) = (self.admin.clone(), std::mem::take(&mut self.names));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            for name in names {
                if let Err(refusal) = runtime.block_on(postgres::drop(&admin, &name)) {
                    eprintln!("cleaning up {name}: {refusal:?}");
                }
            }
        })
        .join()
        .unwrap();
    }
}

/// Log in as `user` to `database` over TCP, the way a binding's service does.
async fn login(admin: &Admin, user: &str, password: &str, database: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = Config::new()
        .host(&admin.host)
        .port(admin.port)
        .user(user)
        .password(password)
        .dbname(database)
        .connect_timeout(Duration::from_secs(10))
        .connect(NoTls)
        .await?;
    tokio::spawn(connection);
    Ok(client)
}

fn sqlstate(err: &tokio_postgres::Error) -> String {
    err.code().map(|c| c.code().to_owned()).unwrap_or_else(|| format!("none ({err})"))
}

/// A connection as the admin itself, to look at and to disturb the server's state.
async fn as_admin(admin: &Admin) -> Client {
    login(admin, &admin.user, &admin.password, "postgres").await.expect("the admin logs in")
}

#[tokio::test]
async fn a_binding_is_created_used_revoked_and_dropped() {
    let Some(admin) = admin() else { return };
    let info = postgres::check(&admin).await.expect("the admin passes the check");
    assert!(!info.superuser, "the test admin should not be a superuser: {info:?}");
    assert!(info.create_role && info.create_db, "{info:?}");
    assert!(info.version_num >= 130000, "{info:?}");

    let name = unique("life");
    let _cleanup = Cleanup { admin: admin.clone(), names: vec![name.clone()] };
    assert_eq!(postgres::exists(&admin, &name).await.unwrap(), Presence { role: false, database: false, login: false });
    let first = password();
    postgres::ensure(&admin, &name, &first).await.expect("ensure");
    postgres::ensure(&admin, &name, &first).await.expect("ensure again");
    assert_eq!(postgres::exists(&admin, &name).await.unwrap(), Presence { role: true, database: true, login: true });

    // least privilege
    let row = as_admin(&admin)
        .await
        .query_one(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolinherit, rolcanlogin, rolreplication, rolbypassrls \
             FROM pg_roles WHERE rolname = $1",
            &[&name],
        )
        .await
        .unwrap();
    let attributes: Vec<bool> = (0..7).map(|i| row.get(i)).collect();
    assert_eq!(attributes, [false, false, false, false, true, false, false]);

    // the service uses its database
    let service = login(&admin, &name, &first, &name).await.expect("the binding's role logs in to its database");
    service
        .batch_execute("CREATE TABLE notes (id int PRIMARY KEY, body text); INSERT INTO notes VALUES (1, 'hello')")
        .await
        .expect("the role creates and fills a table");
    let body: String = service.query_one("SELECT body FROM notes WHERE id = 1", &[]).await.unwrap().get(0);
    assert_eq!(body, "hello");
    drop(service);

    // a new password replaces the old one at once
    let second = password();
    postgres::ensure(&admin, &name, &second).await.expect("ensure with a new password");
    let err = login(&admin, &name, &first, &name).await.expect_err("the old password is refused");
    assert_eq!(sqlstate(&err), "28P01");
    let service = login(&admin, &name, &second, &name).await.expect("the new password works");
    let count: i64 = service.query_one("SELECT count(*) FROM notes", &[]).await.unwrap().get(0);
    assert_eq!(count, 1, "the data stays");

    // revoked: the open session ends and no new one starts
    postgres::revoke(&admin, &name).await.expect("revoke");
    let err = service.simple_query("SELECT 1").await.expect_err("the open session is ended");
    assert!(err.is_closed() || sqlstate(&err) == "57P01", "{err:?}");
    let err = login(&admin, &name, &second, &name).await.expect_err("no login after revoke");
    assert_eq!(sqlstate(&err), "28000", "{err}");
    assert_eq!(postgres::exists(&admin, &name).await.unwrap(), Presence { role: true, database: true, login: false });
    postgres::revoke(&admin, &name).await.expect("revoke again");

    // dropped: gone, and dropping again is fine
    postgres::drop(&admin, &name).await.expect("drop");
    assert_eq!(postgres::exists(&admin, &name).await.unwrap(), Presence { role: false, database: false, login: false });
    postgres::drop(&admin, &name).await.expect("drop again");
    postgres::revoke(&admin, &name).await.expect("revoke of a binding that is not there");
}

#[tokio::test]
async fn a_bindings_role_cannot_reach_another_bindings_database() {
    let Some(admin) = admin() else { return };
    let (a, b) = (unique("a"), unique("b"));
    let _cleanup = Cleanup { admin: admin.clone(), names: vec![a.clone(), b.clone()] };
    let (pa, pb) = (password(), password());
    postgres::ensure(&admin, &a, &pa).await.unwrap();
    postgres::ensure(&admin, &b, &pb).await.unwrap();

    let err = login(&admin, &a, &pa, &b).await.expect_err("A may not connect to B's database");
    assert_eq!(sqlstate(&err), "42501", "{err}");
    assert!(err.as_db_error().unwrap().message().contains("permission denied for database"), "{err}");
    login(&admin, &b, &pb, &b).await.expect("B connects to its own");

    // an ACL someone widened is narrowed again by the next ensure
    as_admin(&admin).await.batch_execute(&format!("GRANT CONNECT ON DATABASE \"{b}\" TO PUBLIC")).await.unwrap();
    login(&admin, &a, &pa, &b).await.expect("widened: A gets in");
    postgres::ensure(&admin, &b, &pb).await.unwrap();
    let err = login(&admin, &a, &pa, &b).await.expect_err("narrowed again");
    assert_eq!(sqlstate(&err), "42501", "{err}");
}

#[tokio::test]
async fn ensure_resumes_after_a_crash_between_its_steps() {
    let Some(admin) = admin() else { return };
    let name = unique("resume");
    let _cleanup = Cleanup { admin: admin.clone(), names: vec![name.clone()] };
    // as if an earlier ensure had stopped right after creating the role: no login, no
    // password, no membership of the admin's, no database
    as_admin(&admin).await.batch_execute(&format!("CREATE ROLE \"{name}\"")).await.unwrap();
    assert_eq!(postgres::exists(&admin, &name).await.unwrap(), Presence { role: true, database: false, login: false });
    let pw = password();
    postgres::ensure(&admin, &name, &pw).await.expect("ensure completes the binding");
    assert_eq!(postgres::exists(&admin, &name).await.unwrap(), Presence { role: true, database: true, login: true });
    login(&admin, &name, &pw, &name).await.expect("the role logs in");

    // and drop resumes after one that stopped between the database and the role
    as_admin(&admin).await.batch_execute(&format!("DROP DATABASE \"{name}\" WITH (FORCE)")).await.unwrap();
    postgres::drop(&admin, &name).await.expect("drop with the database already gone");
    assert_eq!(postgres::exists(&admin, &name).await.unwrap(), Presence { role: false, database: false, login: false });
}

#[tokio::test]
async fn a_wrong_admin_password_or_an_unreachable_server_is_refused_by_name() {
    let Some(admin) = admin() else { return };
    let wrong = Admin { password: Zeroizing::new("not-the-password-Zq9".into()), ..admin.clone() };
    let refusal = postgres::check(&wrong).await.unwrap_err();
    assert!(refusal.is("database-admin-rejected"), "{refusal:?}");
    assert!(!refusal.retryable);
    let shown = format!("{refusal:?} {}", serde_json::to_string(&refusal).unwrap());
    assert!(!shown.contains("not-the-password") && !shown.contains(admin.password.as_str()), "{shown}");
    let refusal = postgres::ensure(&wrong, &unique("never"), "Abc123").await.unwrap_err();
    assert!(refusal.is("database-admin-rejected"), "{refusal:?}");
    assert!(!format!("{refusal:?}").contains("Abc123"));

    // a port nothing listens on
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let closed = Admin { host: "127.0.0.1".into(), port, ..admin.clone() };
    let refusal = postgres::check(&closed).await.unwrap_err();
    assert!(refusal.is("database-endpoint-unreachable"), "{refusal:?}");
    assert!(refusal.retryable);
    assert!(!format!("{refusal:?}").contains(admin.password.as_str()));
    let refusal = postgres::exists(&closed, "capstan_x").await.unwrap_err();
    assert!(refusal.is("database-endpoint-unreachable"), "{refusal:?}");
}

#[tokio::test]
async fn an_admin_without_createrole_is_insufficient() {
    let Some(admin) = admin() else { return };
    // a role the admin makes: LOGIN and CREATEDB but no CREATEROLE
    let name = unique("weak");
    let _cleanup = Cleanup { admin: admin.clone(), names: vec![name.clone()] };
    let pw = password();
    as_admin(&admin).await.batch_execute(&format!("CREATE ROLE \"{name}\" WITH LOGIN CREATEDB PASSWORD '{pw}'")).await.unwrap();
    let weak = Admin { user: name.clone(), password: Zeroizing::new(pw.clone()), ..admin.clone() };
    let refusal = postgres::check(&weak).await.unwrap_err();
    assert!(refusal.is("database-admin-insufficient"), "{refusal:?}");
    assert_eq!(refusal.data.as_deref().unwrap()["missing"], serde_json::json!(["CREATEROLE"]));
    // and what it tries anyway is refused by the server's SQLSTATE 42501
    let refusal = postgres::ensure(&weak, &unique("nope"), "Abc123").await.unwrap_err();
    assert!(refusal.is("database-admin-insufficient"), "{refusal:?}");
    assert_eq!(refusal.data.as_deref().unwrap()["sqlstate"], "42501");
}

#[tokio::test]
async fn drop_ends_the_roles_sessions_in_every_database() {
    let Some(admin) = admin() else { return };
    let name = unique("sessions");
    let _cleanup = Cleanup { admin: admin.clone(), names: vec![name.clone()] };
    let pw = password();
    postgres::ensure(&admin, &name, &pw).await.unwrap();
    let own = login(&admin, &name, &pw, &name).await.unwrap();
    // PostgreSQL lets every role connect to `postgres` by default
    let elsewhere = login(&admin, &name, &pw, "postgres").await.unwrap();
    postgres::drop(&admin, &name).await.expect("drop with sessions open");
    own.simple_query("SELECT 1").await.expect_err("the session in its database is ended");
    elsewhere.simple_query("SELECT 1").await.expect_err("the session in postgres is ended");
    assert_eq!(postgres::exists(&admin, &name).await.unwrap(), Presence { role: false, database: false, login: false });
}
