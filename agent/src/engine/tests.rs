//! The engine driver's tests: the pure parts by hand, then the driver against a real engine (a
//! Podman service, `.ci/engine.sh`) when `CAPSTAN_TEST_ENGINE_SOCKET` and
//! `CAPSTAN_TEST_ENGINE_IMAGE` name one; skipped otherwise, unless `CAPSTAN_TEST_REQUIRE_ENGINE=1`.

use super::observe::{self, Endpoint, ImageReference};
use super::*;
use bollard::models::{ContainerInspectResponse, SystemVersion};
use futures::FutureExt;
use std::os::unix::fs::PermissionsExt;
use std::panic::AssertUnwindSafe;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn spec(slot: &str, assignment: &str, image: &str) -> ContainerSpec {
    ContainerSpec {
        service_id: "svc_web".into(),
        slot: slot.into(),
        assignment_id: assignment.into(),
        image: image.into(),
        environment: BTreeMap::new(),
        ports: Vec::new(),
        volumes: Vec::new(),
        secrets_dir: None,
        command: None,
    }
}

#[test]
fn names_are_the_slot_and_the_assignment_prefix_within_the_engines_rules() {
    assert_eq!(observe::container_name("node_7f3a.0", "asg_0123456789abcdef"), "capstan-node_7f3a.0-asg_01234567");
    assert_eq!(observe::container_name("nöde/1 x", "a:b c"), "capstan-n-de-1-x-a-b-c");
    assert_eq!(observe::container_name("n.1", "short"), "capstan-n.1-short");
    // twelve characters, not bytes
    assert_eq!(observe::container_name("n.1", "ééééééééééééé"), "capstan-n.1-------------");
}

#[test]
fn every_container_carries_capstans_labels_and_no_restart_policy() {
    let mut spec = spec("node_1.2", "asg_1", &format!("127.0.0.1:8080/acme/web@{DIGEST}"));
    spec.environment.insert("GREETING".into(), "hello=world".into());
    spec.ports.push(PortSpec {
        container_port: 8080,
        protocol: Protocol::Tcp,
        host_port: None,
        host_ip: Some("127.0.0.1".parse().unwrap()),
    });
    spec.ports.push(PortSpec { container_port: 8080, protocol: Protocol::Tcp, host_port: Some(9090), host_ip: None });
    spec.ports.push(PortSpec { container_port: 53, protocol: Protocol::Udp, host_port: Some(5353), host_ip: None });
    spec.volumes.push((PathBuf::from("/srv/capstan/volumes/svc_web/data"), "/data".into()));
    spec.command = Some(vec!["-v".into()]);
    let body = observe::create_body(&spec).unwrap();
    let labels = body.labels.unwrap();
    assert_eq!(labels[LABEL_MANAGED], "true");
    assert_eq!(labels[LABEL_SERVICE], "svc_web");
    assert_eq!(labels[LABEL_SLOT], "node_1.2");
    assert_eq!(labels[LABEL_ASSIGNMENT], "asg_1");
    assert_eq!(body.env.unwrap(), vec!["GREETING=hello=world".to_string()]);
    assert_eq!(body.cmd.unwrap(), vec!["-v".to_string()]);
    assert_eq!(body.exposed_ports.unwrap(), vec!["8080/tcp".to_string(), "53/udp".to_string()]);
    let host = body.host_config.unwrap();
    assert_eq!(host.restart_policy.unwrap().name, Some(bollard::models::RestartPolicyNameEnum::NO));
    assert_eq!(host.binds.unwrap(), vec!["/srv/capstan/volumes/svc_web/data:/data".to_string()]);
    let mut with_files = spec.clone();
    with_files.secrets_dir = Some(PathBuf::from("/dev/shm/capstan-agent/asg_1"));
    let binds = observe::create_body(&with_files).unwrap().host_config.unwrap().binds.unwrap();
    assert_eq!(binds[1], "/dev/shm/capstan-agent/asg_1:/run/secrets:ro", "secret files are bound read-only");
    let bindings = host.port_bindings.unwrap();
    let web = bindings["8080/tcp"].as_ref().unwrap();
    assert_eq!(web.len(), 2);
    assert_eq!((web[0].host_ip.as_deref(), web[0].host_port.as_deref()), (Some("127.0.0.1"), Some("")));
    assert_eq!((web[1].host_ip.as_deref(), web[1].host_port.as_deref()), (Some(""), Some("9090")));
    assert_eq!(bindings["53/udp"].as_ref().unwrap()[0].host_port.as_deref(), Some("5353"));
    // the engine's JSON: ExposedPorts as an object, RestartPolicy "no"
    let json = serde_json::to_value(observe::create_body(&spec).unwrap()).unwrap();
    assert_eq!(json["ExposedPorts"]["8080/tcp"], serde_json::json!({}));
    assert_eq!(json["HostConfig"]["RestartPolicy"]["Name"], "no");
}

#[test]
fn specs_no_engine_could_run_are_refused_by_name() {
    let good = spec("n.0", "asg_1", "localhost/web:1");
    let mut cases = Vec::new();
    let mut empty_image = good.clone();
    empty_image.image = " ".into();
    cases.push(empty_image);
    let mut bad_env = good.clone();
    bad_env.environment.insert("A=B".into(), "c".into());
    cases.push(bad_env);
    let mut port_zero = good.clone();
    port_zero.ports.push(PortSpec { container_port: 0, protocol: Protocol::Tcp, host_port: None, host_ip: None });
    cases.push(port_zero);
    let mut relative = good.clone();
    relative.volumes.push((PathBuf::from("data"), "/data".into()));
    cases.push(relative);
    let mut colon = good.clone();
    colon.volumes.push((PathBuf::from("/srv/a:b"), "/data".into()));
    cases.push(colon);
    let mut mount = good.clone();
    mount.volumes.push((PathBuf::from("/srv/a"), "data".into()));
    cases.push(mount);
    for case in cases {
        let refusal = observe::create_body(&case).unwrap_err();
        assert_eq!(refusal.code, "container-spec-invalid", "{case:?}: {refusal:?}");
    }
    assert!(observe::create_body(&good).is_ok());
}

#[test]
fn volume_directories_are_made_private_when_missing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("svc").join("data");
    observe::ensure_private_dir(&path).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o700);
    // one already there is left as it is
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750)).unwrap();
    observe::ensure_private_dir(&path).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o750);
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    assert_eq!(observe::ensure_private_dir(&file).unwrap_err().code, "container-create-failed");
}

#[test]
fn endpoints_are_a_unix_socket_or_plain_http() {
    assert_eq!(observe::parse_endpoint("unix:///run/docker.sock").unwrap(), Endpoint::Unix("/run/docker.sock".into()));
    assert_eq!(observe::parse_endpoint("/run/podman/podman.sock").unwrap(), Endpoint::Unix("/run/podman/podman.sock".into()));
    assert_eq!(observe::parse_endpoint("http://127.0.0.1:2375").unwrap(), Endpoint::Http("127.0.0.1:2375".into()));
    assert_eq!(observe::parse_endpoint("tcp://10.0.0.5:2375/").unwrap(), Endpoint::Http("10.0.0.5:2375".into()));
    assert_eq!(observe::parse_endpoint("http://[::1]:2375").unwrap(), Endpoint::Http("[::1]:2375".into()));
    for bad in [
        "",
        "unix://",
        "unix://run/docker.sock",
        "https://10.0.0.5:2376",
        "ftp://x",
        "http://",
        "http://h:1/v1.41",
        "http://u:p@h:1",
        "docker.sock",
    ] {
        let refusal = observe::parse_endpoint(bad).unwrap_err();
        assert_eq!(refusal.code, "engine-endpoint-invalid", "{bad:?}");
    }
}

#[tokio::test]
async fn an_engine_that_is_not_there_is_unreachable_by_name() {
    let refusal = Engine::connect("unix:///nonexistent/capstan-engine.sock").await.unwrap_err();
    assert_eq!(refusal.code, "engine-unreachable");
    assert!(refusal.retryable);
    assert!(refusal.message.contains("unix:///nonexistent/capstan-engine.sock"), "{}", refusal.message);
    // a port nobody listens on
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let refusal = Engine::connect(&endpoint).await.unwrap_err();
    assert_eq!(refusal.code, "engine-unreachable");
    assert!(refusal.message.contains(&endpoint), "{}", refusal.message);
    // something that is not an engine at all answers, but not as one
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(serve_fixed(listener, "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"));
    let refusal = Engine::connect(&format!("http://127.0.0.1:{port}")).await.unwrap_err();
    assert_eq!(refusal.code, "engine-unreachable");
    assert_eq!(Engine::connect("https://127.0.0.1:2376").await.unwrap_err().code, "engine-endpoint-invalid");
}

#[test]
fn image_references_split_as_the_pull_api_takes_them() {
    let by_digest = ImageReference::parse(&format!("127.0.0.1:8080/acme/web@{DIGEST}")).unwrap();
    assert_eq!(by_digest, ImageReference { name: "127.0.0.1:8080/acme/web".into(), tag: None, digest: Some(DIGEST.into()) });
    let both = ImageReference::parse(&format!("127.0.0.1:8080/acme/web:1.2@{DIGEST}")).unwrap();
    assert_eq!((both.name.as_str(), both.tag.as_deref()), ("127.0.0.1:8080/acme/web", Some("1.2")));
    let tagged = ImageReference::parse("localhost/capstan-test-httpd:1").unwrap();
    assert_eq!((tagged.name.as_str(), tagged.tag.as_deref(), tagged.digest), ("localhost/capstan-test-httpd", Some("1"), None));
    let port_only = ImageReference::parse("127.0.0.1:8080/acme/web").unwrap();
    assert_eq!((port_only.name.as_str(), port_only.tag), ("127.0.0.1:8080/acme/web", None));
    for bad in ["", "web@sha256:abc", "web@md5:0123", "a b", "web:", "127.0.0.1:8080/"] {
        assert_eq!(ImageReference::parse(bad).unwrap_err().code, "image-reference-invalid", "{bad:?}");
    }
    assert_eq!(ImageReference::digest_of(&format!("r/w@{DIGEST}")), Some(DIGEST));
    assert_eq!(ImageReference::digest_of("r/w:1"), None);
}

#[test]
fn pull_auth_debug_hides_the_password() {
    let auth = PullAuth { username: "node-7".into(), password: "hunter2-secret".into(), server: "127.0.0.1:8080".into() };
    let shown = format!("{auth:?} {auth:#?}");
    assert!(!shown.contains("hunter2-secret"), "{shown}");
    assert!(shown.contains("node-7") && shown.contains("127.0.0.1:8080") && shown.contains("<redacted>"), "{shown}");
    assert_eq!(observe::scrub("denied for hunter2-secret".into(), Some("hunter2-secret")), "denied for <redacted>");
    assert_eq!(observe::scrub("denied".into(), Some("")), "denied");
}

#[test]
fn the_registry_auth_header_goes_out_in_base64url() {
    let request = axum::http::Request::builder()
        .header("x-registry-auth", "eyJ1c2VybmFtZSI6Ij8/Pz4+PiJ9+/==")
        .header("content-type", "application/json")
        .body(bollard::body_full(axum::body::Bytes::new()))
        .unwrap();
    let request = observe::registry_auth_url_safe(request);
    assert_eq!(request.headers()["x-registry-auth"], "eyJ1c2VybmFtZSI6Ij8_Pz4-PiJ9-_==");
    assert_eq!(request.headers()["content-type"], "application/json");
}

#[test]
fn the_engine_is_described_by_kind_version_and_api() {
    let podman: SystemVersion = serde_json::from_value(serde_json::json!({
        "Platform": { "Name": "linux/amd64/debian-12" },
        "Components": [{ "Name": "Podman Engine", "Version": "4.3.1", "Details": { "APIVersion": "4.3.1" } }],
        "Version": "4.3.1", "ApiVersion": "1.41", "MinAPIVersion": "1.24", "Os": "linux", "Arch": "amd64"
    }))
    .unwrap();
    assert_eq!(observe::describe_version(&podman, "1.41"), "podman 4.3.1 (API 1.41)");
    let docker: SystemVersion = serde_json::from_value(serde_json::json!({
        "Platform": { "Name": "Docker Engine - Community" },
        "Components": [{ "Name": "Engine", "Version": "27.3.1" }],
        "Version": "27.3.1", "ApiVersion": "1.47"
    }))
    .unwrap();
    assert_eq!(observe::describe_version(&docker, "1.47"), "docker 27.3.1 (API 1.47)");
}

#[test]
fn causes_are_said_in_words() {
    assert_eq!(observe::cause(Phase::Exited, Some(137), true, None).as_deref(), Some("out of memory"));
    assert_eq!(observe::cause(Phase::Exited, Some(1), false, Some("")).as_deref(), Some("exited with status 1"));
    assert_eq!(observe::cause(Phase::Exited, Some(0), false, None).as_deref(), Some("exited with status 0"));
    let error = "runc create failed: unable to start container process: exec: \"/app\": no such file";
    assert_eq!(observe::cause(Phase::Created, None, false, Some(error)).as_deref(), Some(error));
    assert_eq!(observe::cause(Phase::Dead, None, false, None).as_deref(), Some("the engine marked the container dead"));
    assert_eq!(observe::cause(Phase::Running, None, false, Some("  ")), None);
    assert_eq!(observe::cause(Phase::Created, None, false, None), None);
    assert_eq!(format!("{} {}", Phase::Running, Phase::Exited), "running exited");
}

/// An inspection as Podman 4.3 answers it through the Docker API (trimmed).
fn inspected(status: &str, exit_code: i64, image: &str) -> ContainerInspectResponse {
    serde_json::from_value(serde_json::json!({
        "Id": "a2f087b3c569566413d43cd23d920853d8b016af18910fcaeb1aa763fb4f8e39",
        "Created": "2026-12-06T14:54:01.123456789Z",
        "Path": "/bin/busybox",
        "Args": ["httpd", "-f", "-p", "8080", "-h", "/www"],
        "State": {
            "Status": status, "Running": status == "running", "Paused": false, "Restarting": false,
            "OOMKilled": false, "Dead": false, "Pid": 4242, "ExitCode": exit_code, "Error": "",
            "StartedAt": "2026-12-06T14:54:01.5Z", "FinishedAt": if status == "running" { "0001-01-01T00:00:00Z" } else { "2026-12-06T14:55:00Z" },
            "Health": { "Status": "", "FailingStreak": 0, "Log": null }
        },
        "Image": "sha256:a0e92f7824f654f35fe5611ea63888e0d5f6a2d27f04cb97de101edc8360c712",
        "Name": "/capstan-node_1.0-asg_01234567",
        "RestartCount": 0,
        "Config": {
            "Hostname": "a2f087b3c569", "Image": image, "Env": ["GREETING=hello"],
            "Labels": { "capstan.managed": "true", "capstan.service": "svc_web", "capstan.slot": "node_1.0", "capstan.assignment": "asg_0123456789abcdef" },
            "ExposedPorts": { "8080/tcp": {} }
        },
        "NetworkSettings": {
            "Bridge": "", "SandboxID": "", "HairpinMode": false,
            "Ports": {
                "8080/tcp": [{ "HostIp": "127.0.0.1", "HostPort": "43957" }, { "HostIp": "::1", "HostPort": "43957" }],
                "9000/tcp": null
            },
            "SandboxKey": "/run/netns/netns-1", "Gateway": "10.88.0.1", "IPAddress": "10.88.0.2", "IPPrefixLen": 16,
            "Networks": {
                "podman": { "NetworkID": "podman", "Gateway": "10.88.0.1", "IPAddress": "10.88.0.2", "IPPrefixLen": 16, "GlobalIPv6Address": "", "MacAddress": "ee:d3:6e:d8:13:dd" }
            }
        }
    }))
    .unwrap()
}

#[test]
fn observed_is_read_from_the_engines_inspection() {
    let running = observe::observed_from(&inspected("running", 0, &format!("127.0.0.1:8080/acme/web@{DIGEST}")), None);
    assert_eq!(
        running,
        Observed {
            container_id: "a2f087b3c569566413d43cd23d920853d8b016af18910fcaeb1aa763fb4f8e39".into(),
            service_id: "svc_web".into(),
            slot: "node_1.0".into(),
            assignment_id: "asg_0123456789abcdef".into(),
            phase: Phase::Running,
            exit_code: None,
            started_at: Some("2026-12-06T14:54:01.5Z".into()),
            finished_at: None,
            image_digest: Some(DIGEST.into()),
            address: Some("10.88.0.2".parse().unwrap()),
            published: vec![(8080, 43957)],
            cause: None,
        }
    );
    // created by tag: the digest comes from the image's RepoDigests, this repository's first
    let other = "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
    let repo_digests = vec![format!("localhost/other@{other}"), format!("localhost/capstan-test-httpd@{DIGEST}")];
    let exited = observe::observed_from(&inspected("exited", 3, "localhost/capstan-test-httpd:1"), Some(&repo_digests));
    assert_eq!(exited.phase, Phase::Exited);
    assert_eq!(exited.exit_code, Some(3));
    assert_eq!(exited.cause.as_deref(), Some("exited with status 3"));
    assert_eq!(exited.finished_at.as_deref(), Some("2026-12-06T14:55:00Z"));
    assert_eq!(exited.image_digest.as_deref(), Some(DIGEST));
    assert_eq!(observe::observed_from(&inspected("exited", 3, "localhost/capstan-test-httpd:1"), None).image_digest, None);
    // the engine's other states
    assert_eq!(observe::observed_from(&inspected("created", 0, "x:1"), None).phase, Phase::Created);
    assert_eq!(observe::observed_from(&inspected("paused", 0, "x:1"), None).phase, Phase::Unknown);
    let dead = observe::observed_from(&inspected("dead", 0, "x:1"), None);
    assert_eq!((dead.phase, dead.exit_code, dead.cause.as_deref()), (Phase::Dead, Some(0), Some("exited with status 0")));
    // the out-of-memory killer and the engine's own error
    let mut oom = inspected("exited", 137, "x:1");
    oom.state.as_mut().unwrap().oom_killed = Some(true);
    assert_eq!(observe::observed_from(&oom, None).cause.as_deref(), Some("out of memory"));
    let mut failed = inspected("created", 0, "x:1");
    failed.state.as_mut().unwrap().error = Some("crun: executable file `/app` not found".into());
    failed.state.as_mut().unwrap().started_at = Some("0001-01-01T00:00:00Z".into());
    let failed = observe::observed_from(&failed, None);
    assert_eq!(
        (failed.exit_code, failed.started_at, failed.cause.as_deref()),
        (None, None, Some("crun: executable file `/app` not found"))
    );
    // without networks or labels: nothing invented
    let bare: ContainerInspectResponse =
        serde_json::from_value(serde_json::json!({ "Id": "abc", "State": { "Status": "exited", "ExitCode": 0 } })).unwrap();
    let bare = observe::observed_from(&bare, None);
    assert_eq!((bare.slot.as_str(), bare.address, bare.published.len(), bare.image_digest), ("", None, 0, None));
}

#[test]
fn podmans_own_states_are_read_as_dockers() {
    // Podman 4.3 answers "stopped" between a process's exit and its cleanup: bollard refuses it
    let mut answer = serde_json::to_value(inspected("exited", 1, "x:1")).unwrap();
    answer["State"]["Status"] = "stopped".into();
    assert!(serde_json::from_value::<ContainerInspectResponse>(answer.clone()).is_err());
    let stopped = observe::observed_from(&observe::lenient_inspection(answer.clone()).unwrap(), None);
    assert_eq!((stopped.phase, stopped.exit_code, stopped.cause.as_deref()), (Phase::Exited, Some(1), Some("exited with status 1")));
    answer["State"]["Status"] = "configured".into();
    assert_eq!(observe::observed_from(&observe::lenient_inspection(answer.clone()).unwrap(), None).phase, Phase::Created);
    answer["State"]["Status"] = "something-new".into();
    assert_eq!(observe::observed_from(&observe::lenient_inspection(answer).unwrap(), None).phase, Phase::Unknown);
    assert!(observe::lenient_inspection(serde_json::json!("not an inspection")).is_none());
    let listed = serde_json::json!([{ "Id": "abc", "State": "stopped" }, { "Id": "def", "State": "running" }, { "Names": ["/x"] }]);
    assert_eq!(observe::listed_ids(&listed).unwrap(), vec!["abc".to_string(), "def".to_string()]);
    assert_eq!(observe::listed_ids(&serde_json::json!({})), None);
}

/// Answer every connection with `response`.
async fn serve_fixed(listener: tokio::net::TcpListener, response: &'static str) {
    while let Ok((mut socket, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut buffer = [0u8; 4096];
            let _ = socket.read(&mut buffer).await;
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

#[tokio::test]
async fn probes_connect_or_get_within_two_seconds() {
    let local: IpAddr = "127.0.0.1".parse().unwrap();
    let ok = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ok_port = ok.local_addr().unwrap().port();
    tokio::spawn(serve_fixed(ok, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"));
    let moved = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let moved_port = moved.local_addr().unwrap().port();
    tokio::spawn(serve_fixed(moved, "HTTP/1.1 302 Found\r\nlocation: http://192.0.2.1/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"));
    let broken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let broken_port = broken.local_addr().unwrap().port();
    tokio::spawn(serve_fixed(broken, "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"));
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();

    probe(&Probe::Tcp { port: ok_port }, local).await.unwrap();
    let why = probe(&Probe::Tcp { port: closed }, local).await.unwrap_err();
    assert!(why.contains(&format!("127.0.0.1:{closed}")) && why.contains("refused"), "{why}");
    probe(&Probe::Http { port: ok_port, path: "/healthz".into() }, local).await.unwrap();
    probe(&Probe::Http { port: ok_port, path: "healthz".into() }, local).await.unwrap();
    // a redirect counts as an answer and is not followed
    probe(&Probe::Http { port: moved_port, path: "/".into() }, local).await.unwrap();
    let why = probe(&Probe::Http { port: broken_port, path: "/healthz".into() }, local).await.unwrap_err();
    assert!(why.contains("503") && why.contains(&format!("http://127.0.0.1:{broken_port}/healthz")), "{why}");
    let started = std::time::Instant::now();
    let why = probe(&Probe::Http { port: silent_port, path: "/".into() }, local).await.unwrap_err();
    assert!(why.contains("within 2 s"), "{why}");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    let why = probe(&Probe::Http { port: closed, path: "/".into() }, local).await.unwrap_err();
    assert!(why.contains("failed"), "{why}");
    drop(silent);
}

// ---- against a real engine ----

/// The engine's socket and the test image, or `None` (the reason printed) where none is set up.
pub(crate) fn engine_under_test() -> Option<(String, String)> {
    let socket = std::env::var("CAPSTAN_TEST_ENGINE_SOCKET").ok().filter(|s| !s.is_empty());
    let image = std::env::var("CAPSTAN_TEST_ENGINE_IMAGE").ok().filter(|s| !s.is_empty());
    match (socket, image) {
        (Some(socket), Some(image)) => Some((socket, image)),
        _ => {
            let why = "no container engine: CAPSTAN_TEST_ENGINE_SOCKET and CAPSTAN_TEST_ENGINE_IMAGE are not set (.ci/engine.sh starts a Podman service and builds the image)";
            assert!(std::env::var("CAPSTAN_TEST_REQUIRE_ENGINE").as_deref() != Ok("1"), "{why}");
            eprintln!("skipped: {why}");
            None
        }
    }
}

pub(crate) fn unique_assignment() -> String {
    format!("asg_{:016x}", rand::random::<u64>())
}

/// Run `test`, then remove every container of `assignments` whatever happened, then pass its
/// panic on.
pub(crate) async fn with_cleanup<F: Future<Output = ()>>(engine: &Engine, assignments: &[&str], test: F) {
    let outcome = AssertUnwindSafe(test).catch_unwind().await;
    if let Ok(all) = engine.list().await {
        for observed in all.iter().filter(|o| assignments.contains(&o.assignment_id.as_str())) {
            let _ = engine.stop_and_remove(&observed.container_id, Duration::ZERO).await;
        }
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Observe `id` until `done` says so (10 s at most).
async fn observe_until(engine: &Engine, id: &str, done: impl Fn(&Observed) -> bool) -> Observed {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let observed = engine.observe(id).await.unwrap().expect("the container is there");
        if done(&observed) || std::time::Instant::now() > deadline {
            return observed;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The test image by its digest: `localhost/capstan-test-httpd@sha256:…`, and the digest.
async fn image_by_digest(engine: &Engine, image: &str) -> (String, String) {
    let inspected = engine.docker.inspect_image(image).await.unwrap_or_else(|e| panic!("the engine has no {image}: {e}"));
    let repository = ImageReference::parse(image).unwrap().name;
    let by_digest = inspected
        .repo_digests
        .unwrap_or_default()
        .into_iter()
        .find(|d| d.starts_with(&format!("{repository}@")))
        .unwrap_or_else(|| panic!("{image} has no RepoDigest"));
    let digest = ImageReference::digest_of(&by_digest).unwrap().to_string();
    (by_digest, digest)
}

#[tokio::test]
async fn a_container_runs_answers_its_probe_is_listed_and_is_removed() {
    let Some((socket, image)) = engine_under_test() else { return };
    let engine = Engine::connect(&format!("unix://{socket}")).await.unwrap();
    assert!(engine.describe().starts_with("podman ") && engine.describe().contains("(API 1.41)"), "{}", engine.describe());
    let (by_digest, digest) = image_by_digest(&engine, &image).await;
    // present by that digest: nothing is pulled (nothing could be: there is no registry)
    engine.pull(&by_digest, None).await.unwrap();

    let assignment = unique_assignment();
    let volumes = tempfile::tempdir().unwrap();
    let data = volumes.path().join("svc_web").join("data");
    let mut spec = spec("node_test.0", &assignment, &by_digest);
    spec.environment.insert("GREETING".into(), "hello".into());
    spec.ports.push(PortSpec {
        container_port: 8080,
        protocol: Protocol::Tcp,
        host_port: None,
        host_ip: Some("127.0.0.1".parse().unwrap()),
    });
    spec.volumes.push((data.clone(), "/data".into()));

    with_cleanup(&engine, &[&assignment], async {
        let id = engine.start(&spec).await.unwrap();
        assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o700);

        let observed = observe_until(&engine, &id, |o| o.phase == Phase::Running && o.address.is_some()).await;
        assert_eq!(observed.phase, Phase::Running, "{observed:?}");
        assert_eq!(observed.container_id, id);
        assert_eq!((observed.service_id.as_str(), observed.slot.as_str()), ("svc_web", "node_test.0"));
        assert_eq!(observed.assignment_id, assignment);
        assert_eq!(observed.image_digest.as_deref(), Some(digest.as_str()));
        assert!(observed.started_at.is_some() && observed.exit_code.is_none() && observed.cause.is_none(), "{observed:?}");
        let address = observed.address.expect("an address on its network");
        let &(_, host_port) = observed.published.iter().find(|(c, _)| *c == 8080).expect("8080 published");

        // the probes at the container's address (httpd may take a moment to listen)
        let check = Probe::Http { port: 8080, path: "/".into() };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while let Err(why) = probe(&check, address).await {
            assert!(std::time::Instant::now() < deadline, "the HTTP probe never passed: {why}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        probe(&Probe::Tcp { port: 8080 }, address).await.unwrap();
        let why = probe(&Probe::Http { port: 8080, path: "/missing".into() }, address).await.unwrap_err();
        assert!(why.contains("404"), "{why}");
        assert!(probe(&Probe::Tcp { port: 9 }, address).await.is_err());
        // and the published port on the host
        let body = reqwest::get(format!("http://127.0.0.1:{host_port}/")).await.unwrap().text().await.unwrap();
        assert_eq!(body.trim(), "capstan test httpd");

        // what the engine was asked for
        let inspected = engine.docker.inspect_container(&id, None).await.unwrap();
        assert_eq!(inspected.name.as_deref(), Some(format!("/{}", observe::container_name("node_test.0", &assignment)).as_str()));
        let host = inspected.host_config.unwrap();
        assert_eq!(host.restart_policy.and_then(|p| p.name), Some(bollard::models::RestartPolicyNameEnum::NO));
        let config = inspected.config.unwrap();
        assert!(config.env.unwrap_or_default().contains(&"GREETING=hello".to_string()));
        assert_eq!(config.labels.unwrap_or_default().get(LABEL_MANAGED).map(String::as_str), Some("true"));
        let mounts = inspected.mounts.unwrap_or_default();
        assert!(mounts.iter().any(|m| m.destination.as_deref() == Some("/data") && m.source.as_deref() == data.to_str()), "{mounts:?}");

        let listed = engine.list().await.unwrap();
        let mine: Vec<_> = listed.iter().filter(|o| o.assignment_id == assignment).collect();
        assert_eq!(mine.len(), 1, "{listed:?}");
        assert_eq!(mine[0].container_id, id);
        assert_eq!(mine[0].phase, Phase::Running);

        engine.stop_and_remove(&id, Duration::from_secs(2)).await.unwrap();
        assert_eq!(engine.observe(&id).await.unwrap(), None);
        // gone already is fine
        engine.stop_and_remove(&id, Duration::from_secs(2)).await.unwrap();
        assert!(engine.list().await.unwrap().iter().all(|o| o.assignment_id != assignment));
        // the volume's data stays
        assert!(data.is_dir());
    })
    .await;
}

#[tokio::test]
async fn a_bad_image_and_an_unreachable_registry_are_refused_by_name() {
    let Some((socket, _)) = engine_under_test() else { return };
    let engine = Engine::connect(&socket).await.unwrap();
    let assignment = unique_assignment();
    with_cleanup(&engine, &[&assignment], async {
        let missing = format!("localhost/capstan-no-such-image@{DIGEST}");
        let refusal = engine.start(&spec("node_test.1", &assignment, &missing)).await.unwrap_err();
        assert_eq!(refusal.code, "container-create-failed", "{refusal:?}");
        assert!(refusal.message.contains("capstan-no-such-image"), "{}", refusal.message);
        assert!(engine.list().await.unwrap().iter().all(|o| o.assignment_id != assignment));

        // a registry nobody serves, with credentials whose standard base64 holds `+` and `/`
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let password = "pa??????ss>>>>>>word-never-shown";
        let auth = PullAuth { username: "node-test".into(), password: password.into(), server: format!("127.0.0.1:{port}") };
        let reference = format!("127.0.0.1:{port}/acme/web@{DIGEST}");
        let refusal = engine.pull(&reference, Some(&auth)).await.unwrap_err();
        assert_eq!(refusal.code, "image-pull-failed", "{refusal:?}");
        assert!(refusal.message.contains(&reference), "{}", refusal.message);
        let everything = format!("{refusal:?} {}", serde_json::to_string(&refusal).unwrap());
        assert!(!everything.contains(password) && !everything.contains("never-shown"), "{everything}");
        // the engine read the credentials (an undecodable X-Registry-Auth is refused before any pull)
        assert!(!refusal.message.to_ascii_lowercase().contains("x-registry-auth"), "{}", refusal.message);
        assert_eq!(engine.pull("not a reference", None).await.unwrap_err().code, "image-reference-invalid");
    })
    .await;
}

#[tokio::test]
async fn a_container_that_exits_says_how_and_a_failed_start_leaves_nothing() {
    let Some((socket, image)) = engine_under_test() else { return };
    let engine = Engine::connect(&format!("unix://{socket}")).await.unwrap();
    let exits = unique_assignment();
    let blocked = unique_assignment();
    with_cleanup(&engine, &[&exits, &blocked], async {
        // httpd cannot change to a directory that is not there: it exits 1 at once
        let mut spec_exits = spec("node_test.2", &exits, &image);
        spec_exits.command = Some(vec!["-h".into(), "/no-such-dir".into()]);
        let id = engine.start(&spec_exits).await.unwrap();
        let observed = observe_until(&engine, &id, |o| o.phase == Phase::Exited).await;
        assert_eq!(observed.phase, Phase::Exited, "{observed:?}");
        assert_eq!(observed.exit_code, Some(1), "{observed:?}");
        assert_eq!(observed.cause.as_deref(), Some("exited with status 1"));
        assert!(observed.finished_at.is_some() && observed.started_at.is_some(), "{observed:?}");
        assert!(observed.image_digest.as_deref().is_some_and(|d| d.starts_with("sha256:")), "{observed:?}");
        // the engine does not restart it: Capstan decides
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(engine.observe(&id).await.unwrap().unwrap().phase, Phase::Exited);
        engine.stop_and_remove(&id, Duration::from_secs(1)).await.unwrap();
        assert_eq!(engine.observe(&id).await.unwrap(), None);

        // a host port already taken: the start fails, and the created container goes again
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let mut spec_blocked = spec("node_test.3", &blocked, &image);
        spec_blocked.ports.push(PortSpec {
            container_port: 8080,
            protocol: Protocol::Tcp,
            host_port: Some(port),
            host_ip: Some("127.0.0.1".parse().unwrap()),
        });
        let refusal = engine.start(&spec_blocked).await.unwrap_err();
        assert_eq!(refusal.code, "container-start-failed", "{refusal:?}");
        assert!(engine.list().await.unwrap().iter().all(|o| o.assignment_id != blocked));
        let name = observe::container_name("node_test.3", &blocked);
        assert!(engine.observe(&name).await.unwrap().is_none());
        drop(taken);
    })
    .await;
}

// ---- container logs ----

fn log_entry(ts: &str, stream: LogStream, line: &str) -> LogEntry {
    let ts_nanos = {
        let parsed = chrono::DateTime::parse_from_rfc3339(ts).unwrap();
        i128::from(parsed.timestamp()) * 1_000_000_000 + i128::from(parsed.timestamp_subsec_nanos())
    };
    LogEntry { ts: ts.into(), ts_nanos, stream, line: line.into() }
}

#[test]
fn log_records_are_read_with_their_timestamps_and_streams() {
    use super::logs::records;
    // one message, several records; the trailing newline is no part of a line
    let message = b"2026-12-06T22:40:01.123456789Z listening on :8080\n2026-12-06T22:40:01.5Z  two spaces \n";
    assert_eq!(
        records(LogStream::Stdout, message),
        vec![
            Ok(log_entry("2026-12-06T22:40:01.123456789Z", LogStream::Stdout, "listening on :8080")),
            Ok(log_entry("2026-12-06T22:40:01.5Z", LogStream::Stdout, " two spaces ")),
        ]
    );
    let [Ok(first), Ok(second)] = &records(LogStream::Stdout, message)[..] else { panic!() };
    assert_eq!(first.ts_nanos, 1_796_596_801_123_456_789);
    assert_eq!(second.ts_nanos - first.ts_nanos, 376_543_211, "times of any precision compare");
    // stderr; a record without its newline (the engine splits long lines); an empty line
    assert_eq!(
        records(LogStream::Stderr, b"2026-12-06T22:40:02Z oops\n2026-12-06T22:40:03Z \n2026-12-06T22:40:04Z\n2026-12-06T22:40:05Z part"),
        vec![
            Ok(log_entry("2026-12-06T22:40:02Z", LogStream::Stderr, "oops")),
            Ok(log_entry("2026-12-06T22:40:03Z", LogStream::Stderr, "")),
            Ok(log_entry("2026-12-06T22:40:04Z", LogStream::Stderr, "")),
            Ok(log_entry("2026-12-06T22:40:05Z", LogStream::Stderr, "part")),
        ]
    );
    // bytes that are no UTF-8 are replaced; a carriage return stays the line's
    let [Ok(bytes)] = &records(LogStream::Stdout, b"2026-12-06T22:40:01Z a\xffb\r\n")[..] else { panic!() };
    assert_eq!(bytes.line, "a\u{fffd}b\r");
    // another offset is said in UTC
    let [Ok(offset)] = &records(LogStream::Stdout, b"2026-12-06T23:40:01.25+01:00 x\n")[..] else { panic!() };
    assert_eq!((offset.ts.as_str(), offset.ts_nanos), ("2026-12-06T22:40:01.250Z", 1_796_596_801_250_000_000));
    // a record without a readable time is counted as unreadable, the others are kept
    assert_eq!(
        records(LogStream::Stdout, b"yesterday x\n2026-12-06T22:40:01Z y\n"),
        vec![Err(LogFault::Unreadable), Ok(log_entry("2026-12-06T22:40:01Z", LogStream::Stdout, "y"))]
    );
    assert_eq!(records(LogStream::Stdout, b""), vec![]);
}

#[test]
fn a_line_the_engine_split_is_joined_per_stream_and_keeps_its_first_time() {
    let mut joiner = super::logs::Joiner::default();
    // "burst 12345" cut across two reads, a stderr line between the parts
    assert_eq!(
        joiner.push(LogStream::Stdout, b"2026-12-06T22:40:01Z burst 12344\n2026-12-06T22:40:01Z burs"),
        vec![Ok(log_entry("2026-12-06T22:40:01Z", LogStream::Stdout, "burst 12344"))]
    );
    assert_eq!(
        joiner.push(LogStream::Stderr, b"2026-12-06T22:40:02Z oops\n"),
        vec![Ok(log_entry("2026-12-06T22:40:02Z", LogStream::Stderr, "oops"))]
    );
    assert_eq!(joiner.push(LogStream::Stdout, b"2026-12-06T22:40:02Z t 1"), vec![]);
    assert_eq!(
        joiner.push(LogStream::Stdout, b"2026-12-06T22:40:02Z 2345\n2026-12-06T22:40:02Z burst 12346\n"),
        vec![
            Ok(log_entry("2026-12-06T22:40:01Z", LogStream::Stdout, "burst 12345")),
            Ok(log_entry("2026-12-06T22:40:02Z", LogStream::Stdout, "burst 12346")),
        ]
    );
    // a last line without its newline comes out when the stream ends
    assert_eq!(joiner.push(LogStream::Stdout, b"2026-12-06T22:40:03Z bye"), vec![]);
    assert_eq!(joiner.flush(), vec![Ok(log_entry("2026-12-06T22:40:03Z", LogStream::Stdout, "bye"))]);
    assert_eq!(joiner.flush(), vec![]);
}

#[test]
fn a_mark_skips_what_was_read_even_among_entries_of_one_time() {
    let log = [
        log_entry("2026-12-06T22:40:00.9Z", LogStream::Stdout, "a"),
        log_entry("2026-12-06T22:40:01Z", LogStream::Stdout, "b"),
        log_entry("2026-12-06T22:40:01Z", LogStream::Stderr, "c"),
        log_entry("2026-12-06T22:40:01.000Z", LogStream::Stdout, "d"),
        log_entry("2026-12-06T22:40:02Z", LogStream::Stdout, "e"),
        // older than e: kept once an entry past the mark was (the log is in the engine's order)
        log_entry("2026-12-06T22:40:01Z", LogStream::Stderr, "f"),
    ];
    let kept = |mark: Mark| -> Vec<String> {
        let mut past_mark = mark.filter();
        let records = log.iter().cloned().flat_map(|e| past_mark(Ok(e)));
        records.map(|r| r.map_or_else(|fault| format!("{fault:?}"), |e| e.line)).collect()
    };
    assert_eq!(kept(Mark::default()), ["a", "b", "c", "d", "e", "f"]);
    assert_eq!(kept(Mark::at("2026-12-06T22:40:01Z", 0).unwrap()), ["b", "c", "d", "e", "f"]);
    assert_eq!(kept(Mark::at("2026-12-06T22:40:01Z", 2).unwrap()), ["d", "e", "f"]);
    assert_eq!(kept(Mark::at("2026-12-06T22:40:01Z", 3).unwrap()), ["e", "f"]);
    assert!(kept(Mark::at("2026-12-06T22:40:02Z", 1).unwrap()).is_empty(), "nothing past the mark yet: f is before it");
    // the log no longer holds the 4 entries read at the mark: it was rotated past them
    assert_eq!(kept(Mark::at("2026-12-06T22:40:01Z", 4).unwrap()), ["Rotated", "e", "f"]);
    assert_eq!(kept(Mark::at("2026-12-06T22:40:00.5Z", 1).unwrap()), ["Rotated", "a", "b", "c", "d", "e", "f"]);
    assert_eq!(Mark::at("not a time", 1), None);

    // a capture's own mark: the newest time read and how many at it
    let mut mark = Mark::default();
    assert_eq!(mark.since(), 0, "from the start");
    for entry in &log[..4] {
        mark.advance(entry);
    }
    assert_eq!(mark, Mark::at("2026-12-06T22:40:01Z", 3).unwrap());
    assert_eq!(mark.since(), 1_796_596_801, "the engine's since is the mark's second");
    mark.advance(&log[0]);
    assert_eq!(mark, Mark::at("2026-12-06T22:40:01Z", 3).unwrap(), "an older entry leaves it");
    mark.advance(&log[4]);
    assert_eq!(mark, Mark::at("2026-12-06T22:40:02Z", 1).unwrap());
}

/// Start a container of `assignment` running `script` in the test image's busybox shell (its
/// entry point is httpd); its id.
pub(crate) async fn start_script(engine: &Engine, image: &str, slot: &str, assignment: &str, script: &str) -> String {
    let mut body = observe::create_body(&spec(slot, assignment, image)).unwrap();
    body.entrypoint = Some(vec!["/bin/busybox".into(), "sh".into(), "-c".into(), script.into()]);
    let options = CreateContainerOptions { name: Some(observe::container_name(slot, assignment)), ..Default::default() };
    let id = engine.docker.create_container(Some(options), body).await.unwrap().id;
    engine.docker.start_container(&id, None).await.unwrap();
    id
}

/// Every entry of the log of `id` after `from`, until the stream ends (10 s at most).
async fn read_log(engine: &Engine, id: &str, from: Mark) -> Vec<LogEntry> {
    let read = engine.logs(id, from).map(|record| record.expect("a readable record")).collect::<Vec<_>>();
    tokio::time::timeout(Duration::from_secs(10), read).await.expect("the log ends once the container stopped")
}

#[tokio::test]
async fn a_containers_log_is_read_in_order_with_its_times_and_from_a_mark() {
    let Some((socket, image)) = engine_under_test() else { return };
    let engine = Engine::connect(&format!("unix://{socket}")).await.unwrap();
    let assignment = unique_assignment();
    with_cleanup(&engine, &[&assignment], async {
        let script =
            "echo first; sleep 0.3; echo second >&2; sleep 0.3; echo third; echo fourth; sleep 1.2; echo fifth >&2; sleep 0.3; echo sixth";
        let id = start_script(&engine, &image, "node_test.4", &assignment, script).await;

        // followed while it runs, to its end when it exits
        let entries = read_log(&engine, &id, Mark::default()).await;
        let seen: Vec<(&str, LogStream)> = entries.iter().map(|e| (e.line.as_str(), e.stream)).collect();
        assert_eq!(
            seen,
            [
                ("first", LogStream::Stdout),
                ("second", LogStream::Stderr),
                ("third", LogStream::Stdout),
                ("fourth", LogStream::Stdout),
                ("fifth", LogStream::Stderr),
                ("sixth", LogStream::Stdout)
            ]
        );
        assert!(entries.windows(2).all(|w| w[0].ts_nanos <= w[1].ts_nanos), "{entries:?}");
        assert!(entries[4].ts_nanos - entries[3].ts_nanos >= 1_000_000_000, "{entries:?}");
        for entry in &entries {
            assert_eq!(Mark::at(&entry.ts, 0).map(|_| ()), Some(()), "{entry:?}");
            assert!(entry.ts.ends_with('Z'), "{entry:?}");
        }
        assert_eq!(observe_until(&engine, &id, |o| o.phase == Phase::Exited).await.phase, Phase::Exited);

        // read again from where a reader stopped, at each point: nothing twice, nothing lost
        for read in 0..entries.len() {
            let mut mark = Mark::default();
            entries[..read].iter().for_each(|e| mark.advance(e));
            assert_eq!(read_log(&engine, &id, mark).await, entries[read..], "after {read}");
            // and as Capstan says it: the newest kept time, and how many kept entries carry it
            if let Some(newest) = entries[..read].last() {
                let at_newest = entries[..read].iter().filter(|e| e.ts_nanos == newest.ts_nanos).count() as u64;
                assert_eq!(read_log(&engine, &id, Mark::at(&newest.ts, at_newest).unwrap()).await, entries[read..], "after {read}");
            }
        }

        // stopping an exited container is no failure
        engine.stop(&id, Duration::from_secs(1)).await.unwrap();
        engine.remove(&id).await.unwrap();
        assert_eq!(engine.observe(&id).await.unwrap(), None);
    })
    .await;
}
