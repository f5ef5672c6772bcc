//! Capstan's OCI registry (`/v2` on the server's own port, OCI Distribution 1.1) end to end:
//! images are built in-process as OCI image layouts (real gzipped tarballs, configs with their
//! diff_ids), pushed and pulled with skopeo as a client would, and the protocol is driven over
//! raw HTTP (the Docker token flow, chunked and monolithic uploads, mounts, ranges, manifests,
//! tags, referrers, deletes) with the distribution error bodies and Capstan's `detail.reason`.
//!
//! The skopeo tests skip, saying so, when `skopeo` is not on PATH, unless
//! `CAPSTAN_TEST_REQUIRE_SKOPEO=1` (`.ci/peers.sh` installs it and sets it); the raw HTTP tests
//! always run.

use crate::plugins::{assert_ok, run};
use crate::support::{Capstan, Exited, HttpsTarget, TEST_ADMIN, TargetReply, dev_command, is_kebab_case, with_test_admin};
use base64::Engine as _;
use rand::RngCore as _;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// What a client accepts when it reads a manifest.
const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";

const REQUIRE_SKOPEO: &str = "CAPSTAN_TEST_REQUIRE_SKOPEO";
/// A copy of a 5 MB image through a debug build on a loaded machine.
const SKOPEO_TIMEOUT: Duration = Duration::from_secs(180);

// ---------------------------------------------------------------------------------------------
// skopeo

/// Whether skopeo is on PATH; when it is not, the caller skips (saying so) unless
/// `CAPSTAN_TEST_REQUIRE_SKOPEO=1`, which makes it a failure.
fn skopeo_available() -> bool {
    let found = Command::new("skopeo").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        let why = "skopeo is not on PATH (apt-get install skopeo; .ci/peers.sh installs it)";
        assert!(std::env::var(REQUIRE_SKOPEO).as_deref() != Ok("1"), "{REQUIRE_SKOPEO}=1 but {why}");
        eprintln!("skipped: {why}; {REQUIRE_SKOPEO}=1 makes this a failure");
    }
    found
}

/// `skopeo --insecure-policy ARGS` to its end (the policy file of the machine plays no part).
fn skopeo(args: &[&str]) -> Exited {
    let mut cmd = Command::new("skopeo");
    cmd.arg("--insecure-policy").args(args);
    run(cmd, b"", SKOPEO_TIMEOUT)
}

fn skopeo_ok(args: &[&str]) -> Exited {
    let exited = skopeo(args);
    assert_ok(&format!("skopeo {}", args.join(" ")), &exited);
    exited
}

/// Assert skopeo failed and its stderr names one of `needles` (lower case); returns stderr.
fn skopeo_refused(args: &[&str], needles: &[&str]) -> String {
    let exited = skopeo(args);
    assert!(!exited.status.success(), "skopeo {} should fail; stdout:\n{}\nstderr:\n{}", args.join(" "), exited.stdout, exited.stderr);
    let lower = exited.stderr.to_lowercase();
    assert!(
        needles.iter().any(|n| lower.contains(n)),
        "skopeo {}: stderr should name one of {needles:?}:\n{}",
        args.join(" "),
        exited.stderr
    );
    exited.stderr
}

/// The flag copying every image of an index (`--multi-arch all` where skopeo has it).
fn copy_all_flag() -> Vec<&'static str> {
    let help = skopeo(&["copy", "--help"]);
    if help.stdout.contains("--multi-arch") { vec!["--multi-arch", "all"] } else { vec!["--all"] }
}

// ---------------------------------------------------------------------------------------------
// content: blobs, images, indexes, OCI image layouts

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

/// Content-addressed bytes with their media type.
#[derive(Clone, Debug)]
struct Blob {
    media_type: &'static str,
    bytes: Vec<u8>,
}

impl Blob {
    /// `value` as indented JSON (so a registry that re-serialized it would be caught).
    fn json(media_type: &'static str, value: &Value) -> Blob {
        Blob { media_type, bytes: serde_json::to_vec_pretty(value).unwrap() }
    }

    fn digest(&self) -> String {
        digest_of(&self.bytes)
    }

    fn descriptor(&self) -> Value {
        json!({ "mediaType": self.media_type, "digest": self.digest(), "size": self.bytes.len() })
    }
}

/// A gzipped tarball of `files` and its diff_id (the digest of the uncompressed tar).
fn layer(files: &[(&str, &[u8])]) -> (Blob, String) {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        tar.append_data(&mut header, path, *data).unwrap();
    }
    let tar = tar.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    (Blob { media_type: OCI_LAYER, bytes: gz.finish().unwrap() }, digest_of(&tar))
}

/// A linux/<arch> image: its config, its layers and its OCI image manifest.
struct Image {
    arch: &'static str,
    config: Blob,
    layers: Vec<Blob>,
    manifest: Blob,
}

impl Image {
    /// One layer per entry of `layers`, each a tarball of its files.
    fn new(arch: &'static str, layers: &[&[(&str, &[u8])]]) -> Image {
        let (layers, diff_ids): (Vec<Blob>, Vec<String>) = layers.iter().map(|files| layer(files)).unzip();
        let config = Blob::json(
            OCI_CONFIG,
            &json!({
                "architecture": arch, "os": "linux",
                "config": { "Cmd": ["/app/run.sh"] },
                "rootfs": { "type": "layers", "diff_ids": diff_ids },
            }),
        );
        let manifest = Blob::json(
            OCI_MANIFEST,
            &json!({
                "schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": config.descriptor(),
                "layers": layers.iter().map(Blob::descriptor).collect::<Vec<_>>(),
            }),
        );
        Image { arch, config, layers, manifest }
    }

    /// A small one-layer image; `marker` makes its content its own.
    fn small(arch: &'static str, marker: &str) -> Image {
        Image::new(arch, &[&[("etc/marker", marker.as_bytes())]])
    }

    /// Three layers, the second ~5 MB of random bytes (so an upload is streamed in pieces).
    fn three_layers(arch: &'static str) -> Image {
        let big = random_bytes(5 * 1024 * 1024 + 4321);
        let run = format!("#!/bin/sh\necho {arch}\n");
        Image::new(
            arch,
            &[
                &[("etc/motd", &b"capstan registry e2e\n"[..]), ("etc/arch", arch.as_bytes())],
                &[("app/big.bin", big.as_slice())],
                &[("app/run.sh", run.as_bytes())],
            ],
        )
    }

    /// Config, layers and manifest.
    fn blobs(&self) -> Vec<&Blob> {
        let mut blobs = vec![&self.config];
        blobs.extend(&self.layers);
        blobs.push(&self.manifest);
        blobs
    }
}

/// An OCI index of `images`, each with its platform.
fn index_of(images: &[&Image]) -> Blob {
    let manifests: Vec<Value> = images
        .iter()
        .map(|image| {
            let mut descriptor = image.manifest.descriptor();
            descriptor["platform"] = json!({ "architecture": image.arch, "os": "linux" });
            descriptor
        })
        .collect();
    Blob::json(OCI_INDEX, &json!({ "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests }))
}

/// Write an OCI image layout at `dir`: `oci-layout`, `index.json` naming each `(tag, root)`, and
/// every blob under `blobs/sha256/`.
fn write_layout(dir: &Path, tagged: &[(&str, &Blob)], blobs: &[&Blob]) {
    let store = dir.join("blobs").join("sha256");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    for blob in blobs.iter().copied().chain(tagged.iter().map(|(_, root)| *root)) {
        std::fs::write(store.join(blob.digest().trim_start_matches("sha256:")), &blob.bytes).unwrap();
    }
    let manifests: Vec<Value> = tagged
        .iter()
        .map(|(tag, root)| {
            let mut descriptor = root.descriptor();
            descriptor["annotations"] = json!({ "org.opencontainers.image.ref.name": tag });
            descriptor
        })
        .collect();
    std::fs::write(dir.join("index.json"), json!({ "schemaVersion": 2, "manifests": manifests }).to_string()).unwrap();
}

/// Assert the OCI layout at `dir` names `root` as `tag` and holds every one of `blobs` byte for
/// byte, and that every blob it holds matches its name.
fn assert_layout_holds(dir: &Path, tag: &str, root: &Blob, blobs: &[&Blob]) {
    let index: Value = serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let entry = index["manifests"]
        .as_array()
        .and_then(|m| m.iter().find(|d| d["annotations"]["org.opencontainers.image.ref.name"] == tag))
        .unwrap_or_else(|| panic!("{}/index.json should name {tag}: {index}", dir.display()));
    assert_eq!(entry["digest"], root.digest(), "the pulled {tag} should be the pushed root, digest for digest: {entry}");
    assert_eq!(entry["mediaType"], root.media_type, "{entry}");
    let store = dir.join("blobs").join("sha256");
    for file in std::fs::read_dir(&store).unwrap() {
        let file = file.unwrap();
        let bytes = std::fs::read(file.path()).unwrap();
        assert_eq!(
            digest_of(&bytes),
            format!("sha256:{}", file.file_name().to_string_lossy()),
            "{} is not what its name says",
            file.path().display()
        );
    }
    for blob in blobs.iter().copied().chain([root]) {
        let path = store.join(blob.digest().trim_start_matches("sha256:"));
        let pulled =
            std::fs::read(&path).unwrap_or_else(|e| panic!("the pulled layout should hold {} ({}): {e}", blob.digest(), blob.media_type));
        assert!(pulled == blob.bytes, "{} differs from what was pushed", blob.digest());
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// One HTTP answer, headers and bytes included.
struct Answer {
    what: String,
    status: u16,
    /// Lower-cased names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body =
            if self.body.len() > 2000 { format!("<{} bytes>", self.body.len()) } else { String::from_utf8_lossy(&self.body).into_owned() };
        write!(f, "{} → {} {:?} {}", self.what, self.status, self.headers, body)
    }
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The header `name`, asserted present.
    fn must(&self, name: &str) -> &str {
        self.header(name).unwrap_or_else(|| panic!("expected a {name} header: {self:?}"))
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("expected a JSON body ({e}): {self:?}"))
    }

    fn expect(&self, status: u16) -> &Answer {
        assert_eq!(self.status, status, "expected HTTP {status}: {self:?}");
        self
    }

    /// Assert `status` with the distribution error body `{"errors":[{code,message,detail}]}`
    /// naming `code`, and a kebab-case `detail.reason`; returns the reason.
    fn expect_error(&self, status: u16, code: &str) -> String {
        self.expect(status);
        let body = self.json();
        let errors = body["errors"].as_array().unwrap_or_else(|| panic!("an error body is {{\"errors\":[…]}}: {self:?}"));
        let error = errors.iter().find(|e| e["code"] == code).unwrap_or_else(|| panic!("expected the error code {code}: {self:?}"));
        assert!(error["message"].as_str().is_some_and(|m| !m.trim().is_empty()), "an error has a message: {self:?}");
        let reason = error["detail"]["reason"].as_str().unwrap_or_else(|| panic!("an error's detail.reason is Capstan's code: {self:?}"));
        assert!(is_kebab_case(reason), "detail.reason should be kebab-case: {self:?}");
        reason.to_string()
    }

    /// [`Answer::expect_error`] and the reason `reason`.
    fn expect_refusal(&self, status: u16, code: &str, reason: &str) {
        let got = self.expect_error(status, code);
        assert_eq!(got, reason, "expected detail.reason {reason}: {self:?}");
    }
}

/// `url` with `query` appended (a Location may carry a query of its own).
fn with_query(url: &str, query: &str) -> String {
    format!("{url}{}{query}", if url.contains('?') { '&' } else { '?' })
}

/// Milliseconds since the epoch, the unit of every moment the API takes and answers.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

// ---------------------------------------------------------------------------------------------
// the server and its callers

/// A service's repository, as `registry.getServiceTarget` answers it.
struct Target {
    service_id: String,
    host: String,
    repository: String,
}

/// A dev server started with the test administrator, its data in a directory of its own.
struct Registry {
    server: Capstan,
    dir: tempfile::TempDir,
    /// The administrator's API session.
    admin: String,
    agent: ureq::Agent,
}

impl Registry {
    fn start() -> Registry {
        Registry::start_with(|_| {})
    }

    /// [`Registry::start`] with `adjust` applied to the command (another blob store, say).
    fn start_with(adjust: impl FnOnce(&mut std::process::Command)) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let mut command = with_test_admin(dev_command(&dir.path().join("data")));
        adjust(&mut command);
        let server = Capstan::start(command);
        let admin = server.login(TEST_ADMIN.0, TEST_ADMIN.1);
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            // the registry's own answers, never a redirect followed
            .max_redirects(0)
            .max_redirects_will_error(false)
            .max_idle_connections(0)
            .build();
        Registry { server, dir, admin, agent: config.into() }
    }

    /// `method` as the administrator, expected to succeed.
    fn ok(&self, method: &str, body: Value) -> Value {
        self.server.call_as(&self.admin, method, &body).expect_json(200)
    }

    fn organization(&self, name: &str) -> String {
        self.ok("organizations.create", json!({ "name": name }))["id"].as_str().unwrap().to_string()
    }

    /// A new person, with `role` in `organization` when one is named; their password.
    fn person(&self, username: &str, organization: Option<(&str, &str)>) -> String {
        let created = self.ok("admin.createUser", json!({ "username": username }));
        if let Some((organization_id, role)) = organization {
            self.ok("organizations.setMember", json!({ "organizationId": organization_id, "userId": created["userId"], "role": role }));
        }
        created["password"].as_str().unwrap().to_string()
    }

    /// A service `name` in `organization_id` and its repository.
    fn service(&self, organization_id: &str, name: &str) -> Target {
        let service = json!({ "name": name, "organizationId": organization_id, "image": "nginx:1.27" });
        let service_id = self.ok("services.create", service)["id"].as_str().unwrap().to_string();
        let target = self.ok("registry.getServiceTarget", json!({ "serviceId": service_id, "tag": "v1" }));
        let (host, repository) = (target["host"].as_str().unwrap().to_string(), target["repository"].as_str().unwrap().to_string());
        assert_eq!(host, self.server.addr, "the registry is served on the server's own port: {target}");
        let hex = &service_id.strip_prefix("svc_").unwrap_or_else(|| panic!("a service id starts svc_: {service_id}"))[..12];
        assert_eq!(repository, format!("workloads/{name}-{hex}"), "{target}");
        assert_eq!(target["reference"], format!("{host}/{repository}:v1"), "{target}");
        Target { service_id, host, repository }
    }

    /// A deployer granted `capabilities` on `service_id`, its token expiring at `expires_at`
    /// (a year ahead when `None`): its username and token.
    fn deployer(&self, username: &str, service_id: &str, capabilities: &[&str], expires_at: Option<u64>) -> (String, String) {
        let mut body = json!({ "username": username });
        if let Some(at) = expires_at {
            body["expiresAt"] = json!(at);
        }
        let created = self.ok("deployers.create", body);
        self.ok("deployers.grant", json!({ "serviceId": service_id, "userId": created["userId"], "capabilities": capabilities }));
        (created["username"].as_str().unwrap().to_string(), created["token"].as_str().unwrap().to_string())
    }

    /// `method url` (a path on the server, or an absolute URL) with `headers` and `body`.
    fn http(&self, method: &str, url: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Answer {
        let url = if url.starts_with("http://") || url.starts_with("https://") { url.to_string() } else { self.server.url(url) };
        let what = format!("{method} {url}");
        let mut builder = ureq::http::Request::builder().method(method).uri(&url);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let sent = match body {
            Some(bytes) => self.agent.run(builder.body(bytes.to_vec()).unwrap()),
            None => self.agent.run(builder.body(()).unwrap()),
        };
        let mut response = sent.unwrap_or_else(|e| panic!("{what}: no HTTP answer ({e}); server stderr:\n{}", self.server.stderr()));
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let body = if method == "HEAD" {
            Vec::new()
        } else {
            response.body_mut().with_config().limit(64 << 20).read_to_vec().unwrap_or_else(|e| panic!("{what}: reading the body: {e}"))
        };
        Answer { what, status: response.status().as_u16(), headers, body }
    }

    /// `/v2/token` with HTTP Basic `username:secret`, for `scope` when one is given.
    fn token_answer(&self, username: &str, secret: &str, scope: Option<&str>) -> Answer {
        let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{username}:{secret}")));
        let url = match scope {
            Some(scope) => format!("/v2/token?service=capstan&scope={scope}"),
            None => "/v2/token?service=capstan".to_string(),
        };
        self.http("GET", &url, &[("authorization", &basic)], None)
    }

    /// A bearer for `actions` (`pull`, `pull,push`, …) on `repository`.
    fn token(&self, username: &str, secret: &str, repository: &str, actions: &str) -> String {
        let answer = self.token_answer(username, secret, Some(&format!("repository:{repository}:{actions}")));
        answer.expect(200);
        answer.json()["token"].as_str().unwrap_or_else(|| panic!("a token answer holds `token`: {answer:?}")).to_string()
    }

    /// The administrator's bearer for `repository`.
    fn admin_token(&self, repository: &str) -> String {
        self.token(TEST_ADMIN.0, TEST_ADMIN.1, repository, "pull,push")
    }

    /// A /v2 request with `bearer`.
    fn v2(&self, bearer: &str, method: &str, url: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Answer {
        let auth = format!("Bearer {bearer}");
        let mut all = vec![("authorization", auth.as_str())];
        all.extend_from_slice(headers);
        self.http(method, url, &all, body)
    }

    /// Open an upload session in `repository`: its Location (asserted 202, `Range: 0-0`, an
    /// upload UUID).
    fn start_upload(&self, bearer: &str, repository: &str) -> String {
        let answer = self.v2(bearer, "POST", &format!("/v2/{repository}/blobs/uploads/"), &[], Some(b""));
        answer.expect(202);
        assert!(!answer.must("docker-upload-uuid").is_empty(), "{answer:?}");
        assert_eq!(answer.must("range"), "0-0", "{answer:?}");
        answer.must("location").to_string()
    }

    /// Push `blob` to `repository` in one request (`POST …?digest=`), asserted 201.
    fn push_blob(&self, bearer: &str, repository: &str, blob: &Blob) {
        let url = format!("/v2/{repository}/blobs/uploads/?digest={}", blob.digest());
        let answer = self.v2(bearer, "POST", &url, &[("content-type", "application/octet-stream")], Some(&blob.bytes));
        answer.expect(201);
        assert_eq!(answer.must("docker-content-digest"), blob.digest(), "{answer:?}");
        assert!(!answer.must("location").is_empty());
    }

    fn put_manifest(&self, bearer: &str, repository: &str, reference: &str, manifest: &Blob) -> Answer {
        let url = format!("/v2/{repository}/manifests/{reference}");
        self.v2(bearer, "PUT", &url, &[("content-type", manifest.media_type)], Some(&manifest.bytes))
    }

    /// Push `manifest` as `reference`, asserted 201 with its digest.
    fn push_manifest(&self, bearer: &str, repository: &str, reference: &str, manifest: &Blob) -> Answer {
        let answer = self.put_manifest(bearer, repository, reference, manifest);
        answer.expect(201);
        assert_eq!(answer.must("docker-content-digest"), manifest.digest(), "{answer:?}");
        assert!(!answer.must("location").is_empty());
        answer
    }

    /// Push `image`'s blobs and its manifest as `tag`.
    fn push_image(&self, bearer: &str, repository: &str, tag: &str, image: &Image) {
        for blob in std::iter::once(&image.config).chain(&image.layers) {
            self.push_blob(bearer, repository, blob);
        }
        self.push_manifest(bearer, repository, tag, &image.manifest);
    }

    fn get_manifest(&self, bearer: &str, repository: &str, reference: &str) -> Answer {
        self.v2(bearer, "GET", &format!("/v2/{repository}/manifests/{reference}"), &[("accept", ACCEPT)], None)
    }

    /// `tags/list` with `query` (`n=2&last=b`, or empty), asserted 200: the tags and the Link.
    fn tags(&self, bearer: &str, repository: &str, query: &str) -> (Vec<String>, Option<String>) {
        let url = if query.is_empty() { format!("/v2/{repository}/tags/list") } else { format!("/v2/{repository}/tags/list?{query}") };
        let answer = self.v2(bearer, "GET", &url, &[], None);
        answer.expect(200);
        let body = answer.json();
        assert_eq!(body["name"], repository, "{answer:?}");
        let tags = body["tags"].as_array().unwrap_or_else(|| panic!("`tags` is an array: {answer:?}"));
        (tags.iter().map(|t| t.as_str().unwrap().to_string()).collect(), answer.header("link").map(str::to_string))
    }
}

/// `docker://HOST/REPOSITORY:TAG`.
fn docker_ref(target: &Target, tag: &str) -> String {
    format!("docker://{}/{}:{tag}", target.host, target.repository)
}

fn creds(username: &str, secret: &str) -> String {
    format!("{username}:{secret}")
}

fn admin_creds() -> String {
    creds(TEST_ADMIN.0, TEST_ADMIN.1)
}

// ---------------------------------------------------------------------------------------------
// skopeo: in and out, byte for byte

#[test]
fn skopeo_pushes_and_pulls_a_three_layer_image_byte_identical() {
    if !skopeo_available() {
        return;
    }
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let image = Image::three_layers("amd64");
    let layout = registry.dir.path().join("layout");
    write_layout(&layout, &[("v1", &image.manifest)], &image.blobs());
    let source = format!("oci:{}:v1", layout.display());
    let dest = docker_ref(&target, "v1");
    let admin = admin_creds();
    skopeo_ok(&["copy", "--preserve-digests", "--dest-tls-verify=false", "--dest-creds", &admin, &source, &dest]);

    // the manifest as skopeo reads it back, byte for byte
    let raw = skopeo_ok(&["inspect", "--raw", "--tls-verify=false", "--creds", &admin, &dest]);
    assert_eq!(
        digest_of(raw.stdout.as_bytes()),
        image.manifest.digest(),
        "the registry should serve the manifest as pushed:\n{}",
        raw.stdout
    );

    // and over HTTP: the tag names the digest, every blob is there with its bytes
    let bearer = registry.admin_token(&target.repository);
    let answer = registry.get_manifest(&bearer, &target.repository, "v1");
    answer.expect(200);
    assert_eq!(answer.must("docker-content-digest"), image.manifest.digest(), "{answer:?}");
    assert_eq!(answer.must("content-type"), OCI_MANIFEST, "{answer:?}");
    assert!(answer.body == image.manifest.bytes, "GET by tag should answer the bytes pushed: {answer:?}");
    for blob in std::iter::once(&image.config).chain(&image.layers) {
        let url = format!("/v2/{}/blobs/{}", target.repository, blob.digest());
        let head = registry.v2(&bearer, "HEAD", &url, &[], None);
        head.expect(200);
        assert_eq!(head.must("content-length"), blob.bytes.len().to_string(), "{head:?}");
        let get = registry.v2(&bearer, "GET", &url, &[], None);
        get.expect(200);
        assert_eq!(digest_of(&get.body), blob.digest(), "{get:?}");
    }

    // out again into a fresh layout
    let out = registry.dir.path().join("pulled");
    let pulled = format!("oci:{}:v1", out.display());
    skopeo_ok(&["copy", "--preserve-digests", "--src-tls-verify=false", "--src-creds", &admin, &dest, &pulled]);
    assert_layout_holds(&out, "v1", &image.manifest, &image.blobs());
}

/// The registry on the production blob store: skopeo's push lands in the S3 bucket (moto in CI),
/// and comes back out byte for byte.
#[test]
fn on_s3_an_image_goes_into_the_bucket_and_comes_back_whole() {
    if !skopeo_available() {
        return;
    }
    let Some(endpoint) = crate::s3::endpoint() else { return };
    let bucket = crate::s3::fresh_bucket_name();
    crate::s3::create_bucket(&endpoint, &bucket);
    let registry = Registry::start_with(|cmd| {
        cmd.env("CAPSTAN_BLOB_URL", format!("s3://{bucket}/capstan"))
            .env("CAPSTAN_S3_ENDPOINT", &endpoint)
            .env("CAPSTAN_S3_ACCESS_KEY", crate::s3::ACCESS_KEY)
            .env("CAPSTAN_S3_SECRET_KEY", crate::s3::SECRET_KEY)
            .env("CAPSTAN_S3_FORCE_PATH_STYLE", "true");
    });
    let target = registry.service(&registry.organization("acme"), "web");
    let image = Image::three_layers("amd64");
    let layout = registry.dir.path().join("layout");
    write_layout(&layout, &[("v1", &image.manifest)], &image.blobs());
    let dest = docker_ref(&target, "v1");
    let admin = admin_creds();
    let source = format!("oci:{}:v1", layout.display());
    skopeo_ok(&["copy", "--preserve-digests", "--dest-tls-verify=false", "--dest-creds", &admin, &source, &dest]);
    let out = registry.dir.path().join("pulled");
    let pulled = format!("oci:{}:v1", out.display());
    skopeo_ok(&["copy", "--preserve-digests", "--src-tls-verify=false", "--src-creds", &admin, &dest, &pulled]);
    assert_layout_holds(&out, "v1", &image.manifest, &image.blobs());
    assert!(!registry.dir.path().join("data/blobs/registry").exists(), "nothing of the registry is kept on local disk");
    let status = registry.server.admin_status();
    assert_eq!(status["blobs"]["backend"].as_str().map(|b| b.starts_with(&format!("s3://{bucket}"))), Some(true), "{status}");
}

#[test]
fn skopeo_pushes_and_pulls_a_multi_platform_index_with_every_image() {
    if !skopeo_available() {
        return;
    }
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let (amd64, arm64) = (Image::three_layers("amd64"), Image::small("arm64", "arm64 image"));
    let index = index_of(&[&amd64, &arm64]);
    let blobs: Vec<&Blob> = amd64.blobs().into_iter().chain(arm64.blobs()).collect();
    let layout = registry.dir.path().join("layout");
    write_layout(&layout, &[("multi", &index)], &blobs);
    let all = copy_all_flag();
    let admin = admin_creds();
    let source = format!("oci:{}:multi", layout.display());
    let dest = docker_ref(&target, "multi");
    let mut push = vec!["copy", "--preserve-digests", "--dest-tls-verify=false", "--dest-creds", &admin];
    push.extend(&all);
    push.extend([source.as_str(), dest.as_str()]);
    skopeo_ok(&push);

    let raw = skopeo_ok(&["inspect", "--raw", "--tls-verify=false", "--creds", &admin, &dest]);
    assert_eq!(digest_of(raw.stdout.as_bytes()), index.digest(), "the index should be served as pushed:\n{}", raw.stdout);
    let bearer = registry.admin_token(&target.repository);
    let answer = registry.get_manifest(&bearer, &target.repository, "multi");
    answer.expect(200);
    assert_eq!(answer.must("content-type"), OCI_INDEX, "{answer:?}");
    assert_eq!(answer.must("docker-content-digest"), index.digest(), "{answer:?}");
    for image in [&amd64, &arm64] {
        let child = registry.get_manifest(&bearer, &target.repository, &image.manifest.digest());
        child.expect(200);
        assert!(child.body == image.manifest.bytes, "the {} manifest by digest: {child:?}", image.arch);
    }

    let out = registry.dir.path().join("pulled");
    let pulled = format!("oci:{}:multi", out.display());
    let mut pull = vec!["copy", "--preserve-digests", "--src-tls-verify=false", "--src-creds", &admin];
    pull.extend(&all);
    pull.extend([dest.as_str(), pulled.as_str()]);
    skopeo_ok(&pull);
    assert_layout_holds(&out, "multi", &index, &blobs);
}

// ---------------------------------------------------------------------------------------------
// refusals

#[test]
fn a_wrong_password_is_refused_at_the_token_endpoint() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let scope = format!("repository:{}:pull,push", target.repository);
    registry.token_answer(TEST_ADMIN.0, "not-the-password", Some(&scope)).expect_error(401, "UNAUTHORIZED");
    registry.token_answer("nobody-here", "not-the-password", Some(&scope)).expect_error(401, "UNAUTHORIZED");
    // a session token is no password
    registry.token_answer(TEST_ADMIN.0, &registry.admin, Some(&scope)).expect_error(401, "UNAUTHORIZED");

    if skopeo_available() {
        let wrong = creds(TEST_ADMIN.0, "not-the-password");
        skopeo_refused(
            &["inspect", "--raw", "--tls-verify=false", "--creds", &wrong, &docker_ref(&target, "v1")],
            &["unauthorized", "invalid username/password"],
        );
    }
}

#[test]
fn an_expired_deployer_token_is_refused_and_its_bearer_stops_working() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let image = Image::small("amd64", "expiry");
    registry.push_image(&registry.admin_token(&target.repository), &target.repository, "v1", &image);
    let expires_at = now_ms() + 10_000;
    let (username, token) = registry.deployer("ci-pull", &target.service_id, &["registry:pull"], Some(expires_at));

    // before the expiry: a bearer, and it reads
    let bearer = registry.token(&username, &token, &target.repository, "pull");
    registry.get_manifest(&bearer, &target.repository, "v1").expect(200);
    let skopeo = skopeo_available();
    let (deployer_creds, reference) = (creds(&username, &token), docker_ref(&target, "v1"));
    let inspect = ["inspect", "--raw", "--tls-verify=false", "--creds", &deployer_creds, &reference];
    if skopeo && now_ms() + 3000 < expires_at {
        skopeo_ok(&inspect);
    }

    while now_ms() <= expires_at {
        std::thread::sleep(Duration::from_millis(200));
    }
    let scope = format!("repository:{}:pull", target.repository);
    registry.token_answer(&username, &token, Some(&scope)).expect_error(401, "UNAUTHORIZED");
    // the bearer obtained before stops working at once
    let answer = registry.get_manifest(&bearer, &target.repository, "v1");
    answer.expect_error(401, "UNAUTHORIZED");
    assert!(answer.must("www-authenticate").starts_with("Bearer realm="), "{answer:?}");
    if skopeo {
        skopeo_refused(&inspect, &["unauthorized", "invalid username/password"]);
    }
}

#[test]
fn a_person_of_another_organization_is_denied_the_services_repository() {
    let registry = Registry::start();
    let acme = registry.organization("acme");
    let globex = registry.organization("globex");
    let target = registry.service(&acme, "web");
    let owner = registry.person("owner", Some((&acme, "owner")));
    let member = registry.person("member", Some((&acme, "member")));
    let outsider = registry.person("outsider", Some((&globex, "owner")));
    let repo = target.repository.as_str();
    registry.push_image(&registry.admin_token(repo), repo, "v1", &Image::small("amd64", "acme"));
    let uploads = format!("/v2/{repo}/blobs/uploads/");

    // the owner pushes and pulls
    let owner_bearer = registry.token("owner", &owner, repo, "pull,push");
    registry.push_image(&owner_bearer, repo, "v2", &Image::small("amd64", "by the owner"));
    registry.get_manifest(&owner_bearer, repo, "v1").expect(200);
    // a member pulls only
    let member_bearer = registry.token("member", &member, repo, "pull,push");
    registry.get_manifest(&member_bearer, repo, "v2").expect(200);
    registry.v2(&member_bearer, "POST", &uploads, &[], Some(b"")).expect_error(403, "DENIED");

    // a person of another organization: the token is theirs, the repository is not
    let outsider_bearer = registry.token("outsider", &outsider, repo, "pull,push");
    registry.get_manifest(&outsider_bearer, repo, "v1").expect_refusal(403, "DENIED", "registry-access-denied");
    registry.v2(&outsider_bearer, "HEAD", &format!("/v2/{repo}/manifests/v1"), &[], None).expect(403);
    registry.v2(&outsider_bearer, "GET", &format!("/v2/{repo}/tags/list"), &[], None).expect_refusal(
        403,
        "DENIED",
        "registry-access-denied",
    );
    registry.v2(&outsider_bearer, "POST", &uploads, &[], Some(b"")).expect_refusal(403, "DENIED", "registry-access-denied");
    let blob = Blob { media_type: OCI_LAYER, bytes: b"outsider".to_vec() };
    let monolithic = format!("{uploads}?digest={}", blob.digest());
    registry.v2(&outsider_bearer, "POST", &monolithic, &[], Some(&blob.bytes)).expect_refusal(403, "DENIED", "registry-access-denied");
    registry.v2(&outsider_bearer, "DELETE", &format!("/v2/{repo}/manifests/v1"), &[], None).expect_refusal(
        403,
        "DENIED",
        "registry-access-denied",
    );
    // deleting is the owner's: not a member's
    registry.v2(&member_bearer, "DELETE", &format!("/v2/{repo}/manifests/v2"), &[], None).expect_error(403, "DENIED");
    registry.v2(&owner_bearer, "DELETE", &format!("/v2/{repo}/manifests/v2"), &[], None).expect(202);
    registry.get_manifest(&member_bearer, repo, "v2").expect_error(404, "MANIFEST_UNKNOWN");
    // a repository that maps to no service: administrators only
    let orphan = "workloads/nothing-000000000000";
    registry.v2(&owner_bearer, "GET", &format!("/v2/{orphan}/tags/list"), &[], None).expect_refusal(
        403,
        "DENIED",
        "registry-access-denied",
    );

    if skopeo_available() {
        let outsider_creds = creds("outsider", &outsider);
        skopeo_refused(&["inspect", "--raw", "--tls-verify=false", "--creds", &outsider_creds, &docker_ref(&target, "v1")], &["denied"]);
        let image = Image::small("amd64", "outsider push");
        let layout = registry.dir.path().join("layout");
        write_layout(&layout, &[("v9", &image.manifest)], &image.blobs());
        let source = format!("oci:{}:v9", layout.display());
        let dest = docker_ref(&target, "v9");
        // skopeo first asks whether the blobs are there (a HEAD: a status, no body to quote)
        skopeo_refused(
            &["copy", "--dest-tls-verify=false", "--dest-creds", &outsider_creds, &source, &dest],
            &["denied", "403 (forbidden)"],
        );
    }
}

#[test]
fn a_deployer_with_registry_push_uploads_blobs_but_its_manifest_put_is_refused() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let repo = target.repository.as_str();
    registry.push_image(&registry.admin_token(repo), repo, "v1", &Image::small("amd64", "by the administrator"));
    let (username, token) = registry.deployer("ci-push", &target.service_id, &["registry:push"], None);
    let bearer = registry.token(&username, &token, repo, "pull,push");
    // push implies pull
    registry.get_manifest(&bearer, repo, "v1").expect(200);

    let image = Image::small("amd64", "by the deployer");
    for blob in std::iter::once(&image.config).chain(&image.layers) {
        registry.push_blob(&bearer, repo, blob);
    }
    registry.put_manifest(&bearer, repo, "v2", &image.manifest).expect_refusal(403, "DENIED", "deployment-operation-required");
    registry.put_manifest(&bearer, repo, &image.manifest.digest(), &image.manifest).expect_refusal(
        403,
        "DENIED",
        "deployment-operation-required",
    );
    registry.get_manifest(&bearer, repo, "v2").expect_error(404, "MANIFEST_UNKNOWN");

    if skopeo_available() {
        let image = Image::small("amd64", "by the deployer through skopeo");
        let layout = registry.dir.path().join("layout");
        write_layout(&layout, &[("v3", &image.manifest)], &image.blobs());
        let source = format!("oci:{}:v3", layout.display());
        let deployer_creds = creds(&username, &token);
        skopeo_refused(
            &["copy", "--dest-tls-verify=false", "--dest-creds", &deployer_creds, &source, &docker_ref(&target, "v3")],
            &["denied"],
        );
    }
}

/// A deployer reserves one release tag and pushes a multi-platform index there with skopeo; the
/// operation records the digest; nobody else may push that tag, and a version is reserved once.
#[test]
fn a_reserved_release_tag_takes_only_its_deployers_push_and_records_the_digest() {
    if !skopeo_available() {
        return;
    }
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let repo = target.repository.as_str();
    let capabilities = ["deployment:reserve", "deployment:promote", "deployment:status", "registry:push"];
    let (username, token) = registry.deployer("ci-release", &target.service_id, &capabilities, None);
    let session = registry.server.call("auth.exchangeToken", &json!({ "token": token }).to_string()).expect_json(200);
    let machine = session["token"].as_str().unwrap().to_string();
    let reserve = json!({ "serviceId": target.service_id, "tag": "1.4.0", "mutationId": "release-1.4.0" });

    // only a deployer reserves, and never `latest`
    registry.server.call_as(&registry.admin, "deployments.reserve", &reserve).expect_error(403, "deployment-identity-required");
    let latest = json!({ "serviceId": target.service_id, "tag": "latest", "mutationId": "release-latest" });
    registry.server.call_as(&machine, "deployments.reserve", &latest).expect_error(400, "release-tag-invalid");
    let operation = registry.server.call_as(&machine, "deployments.reserve", &reserve).expect_json(200);
    assert_eq!((operation["state"].clone(), operation["replayed"].clone()), (json!("awaiting-image"), json!(false)), "{operation}");
    assert_eq!(operation["reference"], format!("{}/{repo}:1.4.0", target.host), "{operation}");
    let again = registry.server.call_as(&machine, "deployments.reserve", &reserve).expect_json(200);
    assert_eq!(
        (again["id"].clone(), again["replayed"].clone()),
        (operation["id"].clone(), json!(true)),
        "the same request is the same operation"
    );
    let reused = json!({ "serviceId": target.service_id, "tag": "1.5.0", "mutationId": "release-1.4.0" });
    registry.server.call_as(&machine, "deployments.reserve", &reused).expect_error(409, "mutation-reused");
    let twice = json!({ "serviceId": target.service_id, "tag": "1.4.0", "mutationId": "release-1.4.0-again" });
    registry.server.call_as(&machine, "deployments.reserve", &twice).expect_error(409, "version-collision");

    // an administrator's push to the reserved tag is refused, naming the operation
    let image_of_admin = Image::small("amd64", "the administrator's");
    let admin_bearer = registry.admin_token(repo);
    for blob in image_of_admin.blobs() {
        registry.push_blob(&admin_bearer, repo, blob);
    }
    let refused = registry.put_manifest(&admin_bearer, repo, "1.4.0", &image_of_admin.manifest);
    refused.expect_refusal(409, "DENIED", "release-tag-reserved");
    // a tag the registry holds cannot be reserved
    registry.put_manifest(&admin_bearer, repo, "1.3.0", &image_of_admin.manifest).expect(201);
    let occupied = json!({ "serviceId": target.service_id, "tag": "1.3.0", "mutationId": "release-1.3.0" });
    registry.server.call_as(&machine, "deployments.reserve", &occupied).expect_error(409, "release-tag-occupied");

    // the deployer pushes its multi-platform index to exactly that tag
    let (amd64, arm64) = (Image::three_layers("amd64"), Image::small("arm64", "arm64 release"));
    let index = index_of(&[&amd64, &arm64]);
    let blobs: Vec<&Blob> = amd64.blobs().into_iter().chain(arm64.blobs()).collect();
    let layout = registry.dir.path().join("release");
    write_layout(&layout, &[("1.4.0", &index), ("1.5.0", &index)], &blobs);
    let deployer = creds(&username, &token);
    let copy = |tag: &str| {
        let mut args = vec![
            "copy".to_string(),
            "--preserve-digests".into(),
            "--dest-tls-verify=false".into(),
            "--dest-creds".into(),
            deployer.clone(),
        ];
        args.extend(copy_all_flag().iter().map(|a| a.to_string()));
        args.push(format!("oci:{}:{tag}", layout.display()));
        args.push(docker_ref(&target, tag));
        args
    };
    let pushed = copy("1.4.0");
    skopeo_ok(&pushed.iter().map(String::as_str).collect::<Vec<_>>());
    let status = registry.server.call_as(&machine, "deployments.getStatus", &json!({ "operationId": operation["id"] })).expect_json(200);
    assert_eq!((status["state"].clone(), status["digest"].clone()), (json!("image-pushed"), json!(index.digest())), "{status}");
    assert_eq!(status["mediaType"], OCI_INDEX, "{status}");
    // a tag no operation of its own holds takes no push of the deployer's
    let unreserved = copy("1.5.0");
    skopeo_refused(&unreserved.iter().map(String::as_str).collect::<Vec<_>>(), &["denied"]);
    // and the reserved tag, once pushed, takes no other push
    let bearer = registry.token(&username, &token, repo, "pull,push");
    registry.put_manifest(&bearer, repo, "1.4.0", &amd64.manifest).expect_refusal(409, "DENIED", "release-tag-reserved");
    registry.get_manifest(&admin_bearer, repo, "1.4.0").expect(200);
    assert_eq!(registry.get_manifest(&admin_bearer, repo, "1.4.0").must("docker-content-digest"), index.digest());

    // others see the operation only if they may read the service
    let stranger_org = registry.organization("elsewhere");
    let stranger_password = registry.person("stranger", Some((&stranger_org, "owner")));
    let stranger = registry.server.login("stranger", &stranger_password);
    let status_of = json!({ "operationId": operation["id"] });
    registry.server.call_as(&stranger, "deployments.getStatus", &status_of).expect_error(404, "deployment-operation-not-found");

    // promotion: judged first, fenced by the service's revision, then the service runs the digest
    let preflight = json!({ "phase": "promote", "operationId": operation["id"] });
    let ready = registry.server.call_as(&machine, "deployments.getPreflight", &preflight).expect_json(200);
    assert_eq!((ready["ready"].clone(), ready["blockers"].clone()), (json!(true), json!([])), "{ready}");
    let service = registry.ok("services.get", json!({ "id": target.service_id }));
    let promote = |service_revision: &Value| json!({ "operationId": operation["id"], "expectedRevision": status["revision"], "expectedServiceRevision": service_revision });
    registry.server.call_as(&machine, "deployments.promote", &promote(&json!(0))).expect_error(409, "conflict");
    let promoted = registry.server.call_as(&machine, "deployments.promote", &promote(&service["revision"])).expect_json(200);
    assert_eq!(promoted["state"], "promoted", "{promoted}");
    assert_eq!(promoted["previousImage"], "nginx:1.27", "{promoted}");
    let pinned = registry.ok("services.get", json!({ "id": target.service_id }));
    assert_eq!(pinned["image"], format!("{}/{repo}@{}", target.host, index.digest()), "{pinned}");
    assert_eq!(pinned["release"]["digest"], json!(index.digest()), "{pinned}");
    assert_eq!(promoted["rolloutGeneration"], pinned["revision"], "the promotion's generation is the service revision it wrote");
    let again =
        json!({ "operationId": operation["id"], "expectedRevision": promoted["revision"], "expectedServiceRevision": pinned["revision"] });
    registry.server.call_as(&machine, "deployments.promote", &again).expect_error(409, "deployment-state-invalid");
    let blocked = registry.server.call_as(&machine, "deployments.getPreflight", &preflight).expect_json(200);
    assert_eq!(
        (blocked["ready"].clone(), blocked["blockers"][0]["code"].clone()),
        (json!(false), json!("deployment-state-invalid")),
        "{blocked}"
    );
    let reserve_taken = json!({ "phase": "reserve", "serviceId": target.service_id, "tag": "1.4.0" });
    let taken = registry.server.call_as(&machine, "deployments.getPreflight", &reserve_taken).expect_json(200);
    assert_eq!(taken["blockers"][0]["code"], "version-collision", "{taken}");
    let as_admin = registry.server.call_as(&registry.admin, "deployments.getPreflight", &reserve_taken).expect_json(200);
    assert_eq!(as_admin["blockers"][0]["code"], "deployment-identity-required", "{as_admin}");
    let promoted_cleanup = json!({ "operationId": operation["id"], "expectedRevision": promoted["revision"] });
    registry.server.call_as(&machine, "deployments.cleanup", &promoted_cleanup).expect_error(409, "deployment-state-invalid");

    // an operation never pushed is cleaned up (fenced); its claim on the tag stays
    let next = json!({ "serviceId": target.service_id, "tag": "1.6.0", "mutationId": "release-1.6.0" });
    let waiting = registry.server.call_as(&machine, "deployments.reserve", &next).expect_json(200);
    let stale = json!({ "operationId": waiting["id"], "expectedRevision": 7 });
    registry.server.call_as(&machine, "deployments.cleanup", &stale).expect_error(409, "conflict");
    let fenced = json!({ "operationId": waiting["id"], "expectedRevision": waiting["revision"] });
    let cleaned = registry.server.call_as(&machine, "deployments.cleanup", &fenced).expect_json(200);
    assert_eq!(cleaned["state"], "cleaned-up", "{cleaned}");
    let once_more = json!({ "serviceId": target.service_id, "tag": "1.6.0", "mutationId": "release-1.6.0-again" });
    registry.server.call_as(&machine, "deployments.reserve", &once_more).expect_error(409, "version-collision");
}

/// The legacy switch: with `deployOnPush` on, a push of the tag a service's image names pins
/// the image to the pushed digest; another tag, or the switch off, only records the push. A
/// service on the switch takes no deployment operation.
#[test]
fn deploy_on_push_pins_the_tag_the_service_runs_and_keeps_deployment_operations_out() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "legacy");
    let repo = target.repository.as_str();
    let base = format!("{}/{repo}", target.host);
    let service = registry.ok("services.get", json!({ "id": target.service_id }));
    assert_eq!(service["deployOnPush"], false, "the switch is off by default: {service}");
    let update = json!({ "id": target.service_id, "expectedRevision": service["revision"], "image": format!("{base}:stable"), "deployOnPush": true });
    registry.ok("services.update", update);
    let admin_bearer = registry.admin_token(repo);
    let image = || registry.ok("services.get", json!({ "id": target.service_id }))["image"].as_str().unwrap().to_string();

    let first = Image::small("amd64", "stable one");
    registry.push_image(&admin_bearer, repo, "stable", &first);
    assert_eq!(image(), format!("{base}:stable@{}", first.manifest.digest()), "the push of the tag it runs deploys");
    let other = Image::small("amd64", "a branch build");
    registry.push_image(&admin_bearer, repo, "branch", &other);
    assert_eq!(image(), format!("{base}:stable@{}", first.manifest.digest()), "another tag deploys nothing");
    let pushed = registry.ok("services.get", json!({ "id": target.service_id }))["registryPush"].clone();
    assert_eq!((pushed["tag"].clone(), pushed["digest"].clone()), (json!("branch"), json!(other.manifest.digest())), "{pushed}");
    let second = Image::small("amd64", "stable two");
    registry.push_image(&admin_bearer, repo, "stable", &second);
    assert_eq!(image(), format!("{base}:stable@{}", second.manifest.digest()), "the pinned tag moves with its next push");

    // a deployment operation needs the switch off
    let capabilities = ["deployment:reserve", "deployment:promote", "registry:push"];
    let (_, token) = registry.deployer("ci-legacy", &target.service_id, &capabilities, None);
    let session = registry.server.call("auth.exchangeToken", &json!({ "token": token }).to_string()).expect_json(200);
    let machine = session["token"].as_str().unwrap().to_string();
    let reserve = json!({ "serviceId": target.service_id, "tag": "3.0.0", "mutationId": "legacy-3.0.0" });
    registry.server.call_as(&machine, "deployments.reserve", &reserve).expect_error(409, "deploy-on-push-enabled");
    let preflight = json!({ "phase": "reserve", "serviceId": target.service_id, "tag": "3.0.0" });
    let blocked = registry.server.call_as(&machine, "deployments.getPreflight", &preflight).expect_json(200);
    assert_eq!(blocked["blockers"][0]["code"], "deploy-on-push-enabled", "{blocked}");

    // switched off, a push of the tag it runs is recorded and deploys nothing
    let service = registry.ok("services.get", json!({ "id": target.service_id }));
    registry.ok("services.update", json!({ "id": target.service_id, "expectedRevision": service["revision"], "deployOnPush": false }));
    let third = Image::small("amd64", "stable three");
    registry.push_image(&admin_bearer, repo, "stable", &third);
    assert_eq!(image(), format!("{base}:stable@{}", second.manifest.digest()));
    registry.server.call_as(&machine, "deployments.reserve", &reserve).expect_json(200);
}

/// A release's routes move only after their HTTPS check against the target (SNI, a private CA
/// the host was told to trust, no redirect, the readiness status): a failed check withdraws
/// what was published and says why, and `deployments.retry` runs it again.
#[test]
fn a_release_s_routes_are_promoted_only_after_their_https_check_and_a_failure_restores_them() {
    let redirect =
        TargetReply { status: 302, headers: vec![("location".into(), "https://elsewhere.capstan.test/".into())], body: String::new() };
    let https = HttpsTarget::start(&["app.capstan.test"], redirect);
    let certs = tempfile::tempdir().unwrap();
    let ca_file = certs.path().join("route-ca.pem");
    std::fs::write(&ca_file, &https.ca_pem).unwrap();
    // both names dial the target; its certificate names only the first
    let pins = format!("app.capstan.test={0},other.capstan.test={0}", https.addr);
    let registry = Registry::start_with(|cmd| {
        cmd.env("CAPSTAN_ROUTE_CHECK_CA_FILE", &ca_file).env("CAPSTAN_ROUTE_CHECK_RESOLVE", &pins);
    });
    let organization = registry.organization("acme");
    let target = registry.service(&organization, "web");
    let other = registry.service(&organization, "api");
    let repo = target.repository.as_str();
    let service = registry.ok("services.get", json!({ "id": target.service_id }));
    let update = json!({ "id": target.service_id, "expectedRevision": service["revision"], "domains": ["www.capstan.test"] });
    registry.ok("services.update", update);
    let capabilities = ["deployment:reserve", "deployment:promote", "deployment:status", "registry:push"];
    let session = |token: &str| {
        let answer = registry.server.call("auth.exchangeToken", &json!({ "token": token }).to_string()).expect_json(200);
        answer["token"].as_str().unwrap().to_string()
    };
    let (username, token) = registry.deployer("ci-web", &target.service_id, &capabilities, None);
    let machine = session(&token);
    let (_, other_token) = registry.deployer("ci-api", &other.service_id, &capabilities, None);
    let other_machine = session(&other_token);
    let call = |who: &str, method: &str, body: Value| registry.server.call_as(who, method, &body);

    // routes are hostnames with a readiness path and a 2xx status, reserved against other services
    let wildcard = json!({ "serviceId": target.service_id, "tag": "2.0.0", "mutationId": "web-2.0.0-wild", "routes": [{ "hostname": "*.capstan.test" }] });
    call(&machine, "deployments.reserve", wildcard).expect_error(400, "route-invalid");
    let bad_path = json!({ "serviceId": target.service_id, "tag": "2.0.0", "mutationId": "web-2.0.0-path", "routes": [{ "hostname": "app.capstan.test", "readinessPath": "healthz" }] });
    call(&machine, "deployments.reserve", bad_path).expect_error(400, "route-invalid");
    let routes = json!([{ "hostname": "app.capstan.test", "readinessPath": "/healthz" }]);
    let reserve = json!({ "serviceId": target.service_id, "tag": "2.0.0", "mutationId": "web-2.0.0", "routes": routes });
    let operation = call(&machine, "deployments.reserve", reserve).expect_json(200);
    assert_eq!(operation["routes"], json!([{ "hostname": "app.capstan.test", "readinessPath": "/healthz", "expectedStatus": 200 }]));
    let theirs =
        json!({ "serviceId": other.service_id, "tag": "1.0.0", "mutationId": "api-1.0.0", "routes": [{ "hostname": "app.capstan.test" }] });
    let taken = call(&other_machine, "deployments.reserve", theirs).expect_error(409, "route-unavailable").to_string();
    assert!(taken.contains("app.capstan.test"), "{taken}");
    let id = operation["id"].clone();

    // no route moves before the release is promoted
    let early = json!({ "operationId": id, "expectedRevision": operation["revision"] });
    call(&machine, "deployments.promoteRoute", early).expect_error(409, "deployment-state-invalid");
    let bearer = registry.token(&username, &token, repo, "pull,push");
    registry.push_image(&bearer, repo, "2.0.0", &Image::small("amd64", "routed release"));
    let pushed = call(&machine, "deployments.getStatus", json!({ "operationId": id })).expect_json(200);
    let service = registry.ok("services.get", json!({ "id": target.service_id }));
    let promote = json!({ "operationId": id, "expectedRevision": pushed["revision"], "expectedServiceRevision": service["revision"] });
    let promoted = call(&machine, "deployments.promote", promote).expect_json(200);
    assert_eq!(promoted["state"], "promoted", "{promoted}");
    let preflight = call(&machine, "deployments.getPreflight", json!({ "phase": "route", "operationId": id })).expect_json(200);
    assert_eq!((preflight["ready"].clone(), preflight["blockers"].clone()), (json!(true), json!([])), "{preflight}");

    // a redirect fails the check: the route is withdrawn, the previous routes stand
    let route_step = |method: &str, revision: &Value| call(&machine, method, json!({ "operationId": id, "expectedRevision": revision }));
    let failed =
        route_step("deployments.promoteRoute", &promoted["revision"]).expect_error(409, "deployment-route-check-failed").to_string();
    assert!(failed.contains("route-redirect-refused"), "{failed}");
    let domains = || registry.ok("services.get", json!({ "id": target.service_id }))["domains"].clone();
    assert_eq!(domains(), json!(["www.capstan.test"]), "a failed check restores the previous routes");
    let status = call(&machine, "deployments.getStatus", json!({ "operationId": id })).expect_json(200);
    assert_eq!(status["state"], "route-failed", "{status}");
    let diagnostic = &status["routeDiagnostic"];
    assert_eq!(
        (diagnostic["stage"].clone(), diagnostic["code"].clone(), diagnostic["status"].clone(), diagnostic["retryable"].clone()),
        (json!("http"), json!("route-redirect-refused"), json!(302), json!(true)),
        "{status}"
    );
    let request = https.seen.lock().unwrap().last().cloned().expect("the target was asked");
    assert_eq!(request.sni.as_deref(), Some("app.capstan.test"), "the check names the route in SNI");
    assert!(request.head.starts_with("GET /healthz HTTP/1.1\r\n"), "{}", request.head);
    assert!(request.head.to_ascii_lowercase().contains("\r\nhost: app.capstan.test\r\n"), "{}", request.head);
    assert_eq!(https.seen.lock().unwrap().len(), 1, "the redirect was not followed");
    route_step("deployments.promoteRoute", &status["revision"]).expect_error(409, "deployment-state-invalid");

    // another status than the readiness one fails too; once the target is ready, retry promotes
    https.answer(TargetReply::new(503, "starting"));
    let failed = route_step("deployments.retry", &status["revision"]).expect_error(409, "deployment-route-check-failed").to_string();
    assert!(failed.contains("route-status-unexpected"), "{failed}");
    assert_eq!(domains(), json!(["www.capstan.test"]));
    https.answer(TargetReply::new(200, "ready"));
    route_step("deployments.retry", &status["revision"]).expect_error(409, "conflict");
    let status = call(&machine, "deployments.getStatus", json!({ "operationId": id })).expect_json(200);
    let routed = route_step("deployments.retry", &status["revision"]).expect_json(200);
    assert_eq!(routed["state"], "route-promoted", "{routed}");
    let evidence = &routed["routeEvidence"][0];
    assert_eq!(
        (evidence["hostname"].clone(), evidence["status"].clone(), evidence["subjectAltNames"].clone()),
        (json!("app.capstan.test"), json!(200), json!(["app.capstan.test"])),
        "{routed}"
    );
    assert_eq!(evidence["addresses"], json!([https.addr.to_string()]), "{routed}");
    assert!(routed.get("routeDiagnostic").is_none(), "{routed}");
    assert_eq!(domains(), json!(["www.capstan.test", "app.capstan.test"]));
    route_step("deployments.retry", &routed["revision"]).expect_error(409, "deployment-state-invalid");

    // a certificate that does not name the route fails at the tls stage; the routes stay as they were
    let next = json!({ "serviceId": target.service_id, "tag": "2.1.0", "mutationId": "web-2.1.0", "routes": [{ "hostname": "other.capstan.test" }] });
    let second = call(&machine, "deployments.reserve", next).expect_json(200);
    registry.push_image(&bearer, repo, "2.1.0", &Image::small("amd64", "second release"));
    let pushed = call(&machine, "deployments.getStatus", json!({ "operationId": second["id"] })).expect_json(200);
    let service = registry.ok("services.get", json!({ "id": target.service_id }));
    let promote =
        json!({ "operationId": second["id"], "expectedRevision": pushed["revision"], "expectedServiceRevision": service["revision"] });
    let promoted = call(&machine, "deployments.promote", promote).expect_json(200);
    // the first operation's release is no longer the service's: its routes are not its to move
    let superseded = call(&machine, "deployments.getPreflight", json!({ "phase": "route", "operationId": id })).expect_json(200);
    assert_eq!(superseded["ready"], false, "{superseded}");
    let step = json!({ "operationId": second["id"], "expectedRevision": promoted["revision"] });
    let failed = call(&machine, "deployments.promoteRoute", step).expect_error(409, "deployment-route-check-failed").to_string();
    assert!(failed.contains("route-tls-failed") && failed.contains("certificate-name-mismatch"), "{failed}");
    let status = call(&machine, "deployments.getStatus", json!({ "operationId": second["id"] })).expect_json(200);
    assert_eq!((status["routeDiagnostic"]["stage"].clone(), status["state"].clone()), (json!("tls"), json!("route-failed")), "{status}");
    assert_eq!(domains(), json!(["www.capstan.test", "app.capstan.test"]));
}

// ---------------------------------------------------------------------------------------------
// the protocol over raw HTTP

#[test]
fn the_base_endpoint_challenges_without_a_bearer_and_answers_with_one() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let challenge = format!("Bearer realm=\"{}/v2/token\",service=\"capstan\"", registry.server.url(""));

    let answer = registry.http("GET", "/v2/", &[], None);
    answer.expect_error(401, "UNAUTHORIZED");
    assert_eq!(answer.must("www-authenticate"), challenge, "{answer:?}");
    registry.v2("not-a-token", "GET", "/v2/", &[], None).expect_error(401, "UNAUTHORIZED");
    // a repository request without a bearer is challenged the same way (a scope may follow)
    let answer = registry.http("GET", &format!("/v2/{}/tags/list", target.repository), &[], None);
    answer.expect_error(401, "UNAUTHORIZED");
    assert!(answer.must("www-authenticate").starts_with(&challenge), "{answer:?}");

    // `docker login` asks for a token with no scope
    let answer = registry.token_answer(TEST_ADMIN.0, TEST_ADMIN.1, None);
    answer.expect(200);
    let token = answer.json();
    let bearer = token["token"].as_str().unwrap_or_else(|| panic!("{answer:?}")).to_string();
    assert_eq!(token["access_token"], token["token"], "{answer:?}");
    assert!(token["expires_in"].as_u64().is_some_and(|s| s > 0), "{answer:?}");
    assert!(token["issued_at"].is_string(), "{answer:?}");

    let answer = registry.v2(&bearer, "GET", "/v2/", &[], None);
    answer.expect(200);
    assert_eq!(answer.json(), json!({}), "{answer:?}");
    assert_eq!(answer.must("docker-distribution-api-version"), "registry/2.0", "{answer:?}");
    // and with a scoped token too
    let scoped = registry.admin_token(&target.repository);
    registry.v2(&scoped, "GET", "/v2/", &[], None).expect(200);
}

#[test]
fn a_blob_uploads_in_ordered_chunks_or_at_once_and_reads_back_whole_or_by_range() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let repo = target.repository.as_str();
    let bearer = registry.admin_token(repo);
    let data = random_bytes(200_000);
    let digest = digest_of(&data);
    let (first, second) = data.split_at(70_000);
    let octets = ("content-type", "application/octet-stream");

    let location = registry.start_upload(&bearer, repo);
    let answer = registry.v2(&bearer, "PATCH", &location, &[octets, ("content-range", "0-69999")], Some(first));
    answer.expect(202);
    assert_eq!(answer.must("range"), "0-69999", "{answer:?}");
    let location = answer.must("location").to_string();
    // a chunk that does not start at the current end
    for range in ["70100-70199", "0-99"] {
        let answer = registry.v2(&bearer, "PATCH", &location, &[octets, ("content-range", range)], Some(&[7u8; 100]));
        answer.expect_error(416, "BLOB_UPLOAD_INVALID");
    }
    let answer = registry.v2(&bearer, "GET", &location, &[], None);
    answer.expect(204);
    assert_eq!(answer.must("range"), "0-69999", "the refused chunks added nothing: {answer:?}");
    let answer = registry.v2(&bearer, "PATCH", &location, &[octets, ("content-range", "70000-199999")], Some(second));
    answer.expect(202);
    assert_eq!(answer.must("range"), "0-199999", "{answer:?}");
    let location = answer.must("location").to_string();
    let answer = registry.v2(&bearer, "PUT", &with_query(&location, &format!("digest={digest}")), &[octets], Some(b""));
    answer.expect(201);
    assert_eq!(answer.must("docker-content-digest"), digest, "{answer:?}");
    assert!(answer.must("location").ends_with(&format!("/v2/{repo}/blobs/{digest}")), "{answer:?}");
    // the session is over
    registry.v2(&bearer, "GET", &location, &[], None).expect_error(404, "BLOB_UPLOAD_UNKNOWN");

    let blob_url = format!("/v2/{repo}/blobs/{digest}");
    let head = registry.v2(&bearer, "HEAD", &blob_url, &[], None);
    head.expect(200);
    assert_eq!(head.must("content-length"), "200000", "{head:?}");
    assert_eq!(head.must("docker-content-digest"), digest, "{head:?}");
    let get = registry.v2(&bearer, "GET", &blob_url, &[], None);
    get.expect(200);
    assert!(get.body == data, "GET should answer the bytes uploaded: {get:?}");
    let ranged = registry.v2(&bearer, "GET", &blob_url, &[("range", "bytes=69990-70009")], None);
    ranged.expect(206);
    assert!(ranged.body == data[69_990..70_010], "a Range GET answers those bytes: {ranged:?}");
    assert_eq!(ranged.must("content-range"), "bytes 69990-70009/200000", "{ranged:?}");

    // monolithic: one POST with the digest, then one with the wrong one
    let whole = Blob { media_type: OCI_LAYER, bytes: random_bytes(10_000) };
    registry.push_blob(&bearer, repo, &whole);
    registry.v2(&bearer, "GET", &format!("/v2/{repo}/blobs/{}", whole.digest()), &[], None).expect(200);
    let other = random_bytes(1_000);
    let wrong = format!("/v2/{repo}/blobs/uploads/?digest={}", digest_of(b"something else"));
    registry.v2(&bearer, "POST", &wrong, &[octets], Some(&other)).expect_error(400, "DIGEST_INVALID");
    registry.v2(&bearer, "HEAD", &format!("/v2/{repo}/blobs/{}", digest_of(&other)), &[], None).expect(404);
    registry.v2(&bearer, "HEAD", &format!("/v2/{repo}/blobs/{}", digest_of(b"something else")), &[], None).expect(404);
    // a session closed with the wrong digest, its final chunk in the PUT
    let location = registry.start_upload(&bearer, repo);
    let put = with_query(&location, &format!("digest={}", digest_of(b"something else")));
    registry.v2(&bearer, "PUT", &put, &[octets], Some(&other)).expect_error(400, "DIGEST_INVALID");

    // a blob deleted is gone from the repository
    let whole_url = format!("/v2/{repo}/blobs/{}", whole.digest());
    registry.v2(&bearer, "DELETE", &whole_url, &[], None).expect(202);
    registry.v2(&bearer, "HEAD", &whole_url, &[], None).expect(404);

    // a cancelled session is gone, an unknown one never was
    let location = registry.start_upload(&bearer, repo);
    registry.v2(&bearer, "DELETE", &location, &[], None).expect(204);
    registry.v2(&bearer, "GET", &location, &[], None).expect_error(404, "BLOB_UPLOAD_UNKNOWN");
    let unknown = format!("/v2/{repo}/blobs/uploads/00000000-0000-4000-8000-000000000000");
    registry.v2(&bearer, "PATCH", &unknown, &[octets, ("content-range", "0-2")], Some(b"abc")).expect_error(404, "BLOB_UPLOAD_UNKNOWN");
    registry.v2(&bearer, "GET", &format!("/v2/{repo}/blobs/{}", digest_of(b"never pushed")), &[], None).expect_error(404, "BLOB_UNKNOWN");
}

#[test]
fn a_blob_mounts_from_a_repository_the_caller_can_read_and_otherwise_opens_an_upload() {
    let registry = Registry::start();
    let acme = registry.organization("acme");
    let globex = registry.organization("globex");
    let web = registry.service(&acme, "web");
    let api = registry.service(&globex, "api");
    let globex_owner = registry.person("globex-owner", Some((&globex, "owner")));
    let admin_web = registry.admin_token(&web.repository);
    let (shared, private) =
        (Blob { media_type: OCI_LAYER, bytes: random_bytes(4_096) }, Blob { media_type: OCI_LAYER, bytes: random_bytes(4_096) });
    registry.push_blob(&admin_web, &web.repository, &shared);
    registry.push_blob(&admin_web, &web.repository, &private);
    let mount = |blob: &Blob| format!("/v2/{}/blobs/uploads/?mount={}&from={}", api.repository, blob.digest(), web.repository);

    // the administrator reads web: mounted at once
    let admin_api = registry.admin_token(&api.repository);
    let answer = registry.v2(&admin_api, "POST", &mount(&shared), &[], Some(b""));
    answer.expect(201);
    assert_eq!(answer.must("docker-content-digest"), shared.digest(), "{answer:?}");
    assert!(answer.must("location").ends_with(&format!("/v2/{}/blobs/{}", api.repository, shared.digest())), "{answer:?}");
    registry.v2(&admin_api, "HEAD", &format!("/v2/{}/blobs/{}", api.repository, shared.digest()), &[], None).expect(200);

    // globex's owner may push to api but not read web: a plain upload session instead
    let owner_api = registry.token("globex-owner", &globex_owner, &api.repository, "pull,push");
    let answer = registry.v2(&owner_api, "POST", &mount(&private), &[], Some(b""));
    answer.expect(202);
    let location = answer.must("location").to_string();
    assert!(answer.header("docker-upload-uuid").is_some(), "{answer:?}");
    registry.v2(&owner_api, "HEAD", &format!("/v2/{}/blobs/{}", api.repository, private.digest()), &[], None).expect(404);
    // which takes the blob like any other
    let put = with_query(&location, &format!("digest={}", private.digest()));
    registry.v2(&owner_api, "PUT", &put, &[("content-type", "application/octet-stream")], Some(&private.bytes)).expect(201);
    registry.v2(&owner_api, "HEAD", &format!("/v2/{}/blobs/{}", api.repository, private.digest()), &[], None).expect(200);
    // a mount of a blob the source does not hold is an upload session too
    let absent = Blob { media_type: OCI_LAYER, bytes: b"nowhere".to_vec() };
    registry.v2(&admin_api, "POST", &mount(&absent), &[], Some(b"")).expect(202);
}

#[test]
fn manifests_are_refused_for_missing_blobs_wrong_digests_bad_bodies_and_bad_names() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let repo = target.repository.as_str();
    let bearer = registry.admin_token(repo);
    let image = Image::small("amd64", "manifests");
    for blob in std::iter::once(&image.config).chain(&image.layers) {
        registry.push_blob(&bearer, repo, blob);
    }

    // a layer the repository does not hold
    let (missing, _) = layer(&[("etc/missing", &b"never pushed"[..])]);
    let broken = Blob::json(
        OCI_MANIFEST,
        &json!({ "schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": image.config.descriptor(), "layers": [missing.descriptor()] }),
    );
    registry.put_manifest(&bearer, repo, "broken", &broken).expect_error(400, "MANIFEST_BLOB_UNKNOWN");
    // an index naming a manifest the repository does not hold
    let orphan_index = index_of(&[&image]);
    registry.put_manifest(&bearer, repo, "multi", &orphan_index).expect_error(400, "MANIFEST_BLOB_UNKNOWN");
    // a body that is not what the digest reference names
    let elsewhere = digest_of(b"another manifest");
    registry.put_manifest(&bearer, repo, &elsewhere, &image.manifest).expect_error(400, "DIGEST_INVALID");
    // not a manifest at all
    let malformed = Blob { media_type: OCI_MANIFEST, bytes: b"{\"schemaVersion\": 2, \"layers\": ".to_vec() };
    registry.put_manifest(&bearer, repo, "malformed", &malformed).expect_error(400, "MANIFEST_INVALID");
    for tag in ["broken", "multi", "malformed"] {
        registry.get_manifest(&bearer, repo, tag).expect_error(404, "MANIFEST_UNKNOWN");
    }

    // the manifest by tag, then by digest, then read back exactly
    let answer = registry.push_manifest(&bearer, repo, "v1", &image.manifest);
    assert!(answer.must("location").ends_with(&format!("/v2/{repo}/manifests/{}", image.manifest.digest())), "{answer:?}");
    registry.push_manifest(&bearer, repo, &image.manifest.digest(), &image.manifest);
    for reference in ["v1".to_string(), image.manifest.digest()] {
        let answer = registry.get_manifest(&bearer, repo, &reference);
        answer.expect(200);
        assert!(answer.body == image.manifest.bytes, "{answer:?}");
        assert_eq!(answer.must("content-type"), OCI_MANIFEST, "{answer:?}");
        assert_eq!(answer.must("docker-content-digest"), image.manifest.digest(), "{answer:?}");
        let head = registry.v2(&bearer, "HEAD", &format!("/v2/{repo}/manifests/{reference}"), &[("accept", ACCEPT)], None);
        head.expect(200);
        assert_eq!(head.must("docker-content-digest"), image.manifest.digest(), "{head:?}");
        assert_eq!(head.must("content-length"), image.manifest.bytes.len().to_string(), "{head:?}");
    }
    // now that the child is there, the index goes in
    registry.push_manifest(&bearer, repo, "multi", &orphan_index);

    // a Docker v2 schema 2 manifest of the same blobs, typed as one
    let docker = Blob::json(
        DOCKER_MANIFEST,
        &json!({
            "schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
            "config": { "mediaType": DOCKER_CONFIG, "digest": image.config.digest(), "size": image.config.bytes.len() },
            "layers": image.layers.iter().map(|l| json!({ "mediaType": DOCKER_LAYER, "digest": l.digest(), "size": l.bytes.len() })).collect::<Vec<_>>(),
        }),
    );
    registry.push_manifest(&bearer, repo, "docker", &docker);
    let answer = registry.get_manifest(&bearer, repo, "docker");
    answer.expect(200);
    assert_eq!(answer.must("content-type"), DOCKER_MANIFEST, "{answer:?}");
    assert!(answer.body == docker.bytes, "{answer:?}");

    // over 4 MiB
    let mut huge = json!({ "schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": image.config.descriptor(), "layers": [] });
    huge["annotations"] = json!({ "padding": "x".repeat(4 * 1024 * 1024) });
    let huge = Blob::json(OCI_MANIFEST, &huge);
    registry.put_manifest(&bearer, repo, "huge", &huge).expect(413);

    // unknown references
    registry.get_manifest(&bearer, repo, "v404").expect_error(404, "MANIFEST_UNKNOWN");
    registry.get_manifest(&bearer, repo, &digest_of(b"no such manifest")).expect_error(404, "MANIFEST_UNKNOWN");
    registry.v2(&bearer, "HEAD", &format!("/v2/{repo}/manifests/v404"), &[], None).expect(404);

    // names outside the grammar
    for name in ["workloads/Web", "workloads/web-", "workloads/-web", "workloads/web..x", "Workloads/web"] {
        registry.get_manifest(&bearer, name, "v1").expect_refusal(400, "NAME_INVALID", "registry-name-invalid");
    }
}

#[test]
fn the_tag_list_is_sorted_and_pages_with_n_and_last_and_a_link_header() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let repo = target.repository.as_str();
    let bearer = registry.admin_token(repo);
    let image = Image::small("amd64", "tags");
    // pushed out of order
    let tags = ["c3", "a1", "e5", "b2", "d4"];
    registry.push_image(&bearer, repo, tags[0], &image);
    for tag in &tags[1..] {
        registry.push_manifest(&bearer, repo, tag, &image.manifest);
    }
    let sorted = ["a1", "b2", "c3", "d4", "e5"];
    let (all, link) = registry.tags(&bearer, repo, "");
    assert_eq!(all, sorted, "every tag, sorted");
    assert_eq!(link, None, "no Link without n");

    // pages of two, following each Link
    let next = |link: Option<String>| -> String {
        let link = link.expect("a Link header while more tags remain");
        let url = link.strip_prefix('<').and_then(|l| l.strip_suffix(">; rel=\"next\"")).unwrap_or_else(|| panic!("Link: {link}"));
        let (path, query) = url.split_once('?').unwrap_or_else(|| panic!("Link: {link}"));
        assert_eq!(path, format!("/v2/{repo}/tags/list"), "Link: {link}");
        assert!(query.split('&').filter(|p| p.starts_with("n=")).eq(["n=2"]), "the Link keeps n=2: {link}");
        query.to_string()
    };
    let (page, link) = registry.tags(&bearer, repo, "n=2");
    assert_eq!(page, ["a1", "b2"]);
    let query = next(link);
    assert!(query.split('&').any(|p| p == "last=b2"), "{query}");
    let (page, link) = registry.tags(&bearer, repo, &query);
    assert_eq!(page, ["c3", "d4"]);
    let query = next(link);
    assert!(query.split('&').any(|p| p == "last=d4"), "{query}");
    let (page, link) = registry.tags(&bearer, repo, &query);
    assert_eq!(page, ["e5"]);
    assert_eq!(link, None, "the last page has no Link");

    // exactly as many as remain: no Link; `last` alone: everything after it
    let (page, link) = registry.tags(&bearer, repo, "n=5");
    assert_eq!(page, sorted);
    assert_eq!(link, None, "n covering every tag leaves no next page");
    let (page, _) = registry.tags(&bearer, repo, "last=c3");
    assert_eq!(page, ["d4", "e5"]);

    // a repository holding nothing (the administrator may name any)
    let unknown = "workloads/nothing-000000000000";
    registry.v2(&bearer, "GET", &format!("/v2/{unknown}/tags/list"), &[], None).expect_error(404, "NAME_UNKNOWN");
}

#[test]
fn referrers_list_the_manifests_naming_a_subject_and_filter_by_artifact_type() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let repo = target.repository.as_str();
    let bearer = registry.admin_token(repo);
    let image = Image::small("amd64", "subject");
    registry.push_image(&bearer, repo, "v1", &image);
    let empty = Blob { media_type: OCI_EMPTY, bytes: b"{}".to_vec() };
    registry.push_blob(&bearer, repo, &empty);

    let artifact = |artifact_type: &str, content: &[u8]| -> Blob {
        let payload = Blob { media_type: "application/json", bytes: content.to_vec() };
        registry.push_blob(&bearer, repo, &payload);
        Blob::json(
            OCI_MANIFEST,
            &json!({
                "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                "config": empty.descriptor(), "layers": [payload.descriptor()],
                "subject": image.manifest.descriptor(),
                "annotations": { "org.opencontainers.image.created": "2025-01-01T00:00:00Z" },
            }),
        )
    };
    let sbom = artifact("application/vnd.example.sbom.v1+json", br#"{"packages":[]}"#);
    let signature = artifact("application/vnd.example.signature.v1+json", br#"{"signature":"abc"}"#);
    for manifest in [&sbom, &signature] {
        let answer = registry.push_manifest(&bearer, repo, &manifest.digest(), manifest);
        assert_eq!(answer.must("oci-subject"), image.manifest.digest(), "{answer:?}");
    }
    // a manifest with no subject answers no OCI-Subject
    let answer = registry.push_manifest(&bearer, repo, "v1", &image.manifest);
    assert_eq!(answer.header("oci-subject"), None, "{answer:?}");

    let referrers = |query: &str| -> Answer {
        let answer = registry.v2(&bearer, "GET", &format!("/v2/{repo}/referrers/{}{query}", image.manifest.digest()), &[], None);
        answer.expect(200);
        assert!(answer.must("content-type").starts_with(OCI_INDEX), "{answer:?}");
        let index = answer.json();
        assert_eq!(index["schemaVersion"], 2, "{answer:?}");
        assert_eq!(index["mediaType"], OCI_INDEX, "{answer:?}");
        answer
    };
    let listed = |answer: &Answer| -> BTreeSet<String> {
        let index = answer.json();
        let manifests = index["manifests"].as_array().unwrap_or_else(|| panic!("{answer:?}")).clone();
        for descriptor in &manifests {
            let which =
                [&sbom, &signature].into_iter().find(|m| descriptor["digest"] == m.digest()).unwrap_or_else(|| panic!("{answer:?}"));
            assert_eq!(descriptor["mediaType"], OCI_MANIFEST, "{answer:?}");
            assert_eq!(descriptor["size"], which.bytes.len(), "{answer:?}");
            let artifact_type = serde_json::from_slice::<Value>(&which.bytes).unwrap()["artifactType"].clone();
            assert_eq!(descriptor["artifactType"], artifact_type, "{answer:?}");
        }
        manifests.iter().map(|d| d["digest"].as_str().unwrap().to_string()).collect()
    };

    let answer = referrers("");
    assert_eq!(listed(&answer), BTreeSet::from([sbom.digest(), signature.digest()]));
    assert_eq!(answer.header("oci-filters-applied"), None, "{answer:?}");
    let answer = referrers("?artifactType=application/vnd.example.sbom.v1%2Bjson");
    assert_eq!(listed(&answer), BTreeSet::from([sbom.digest()]));
    assert_eq!(answer.must("oci-filters-applied"), "artifactType", "{answer:?}");

    // a digest nothing names: an empty index
    let answer = registry.v2(&bearer, "GET", &format!("/v2/{repo}/referrers/{}", digest_of(b"nothing refers")), &[], None);
    answer.expect(200);
    assert_eq!(answer.json()["manifests"], json!([]), "{answer:?}");
}

#[test]
fn deleting_a_manifest_by_digest_removes_its_tags_and_by_tag_only_the_tag() {
    let registry = Registry::start();
    let target = registry.service(&registry.organization("acme"), "web");
    let repo = target.repository.as_str();
    let bearer = registry.admin_token(repo);
    let (doomed, kept) = (Image::small("amd64", "doomed"), Image::small("amd64", "kept"));
    registry.push_image(&bearer, repo, "x", &doomed);
    registry.push_manifest(&bearer, repo, "y", &doomed.manifest);
    registry.push_image(&bearer, repo, "keep", &kept);
    registry.push_manifest(&bearer, repo, "p", &kept.manifest);

    registry.v2(&bearer, "DELETE", &format!("/v2/{repo}/manifests/{}", doomed.manifest.digest()), &[], None).expect(202);
    for reference in ["x".to_string(), "y".to_string(), doomed.manifest.digest()] {
        registry.get_manifest(&bearer, repo, &reference).expect_error(404, "MANIFEST_UNKNOWN");
    }
    assert_eq!(registry.tags(&bearer, repo, "").0, ["keep", "p"], "the digest's tags went with it");

    registry.v2(&bearer, "DELETE", &format!("/v2/{repo}/manifests/p"), &[], None).expect(202);
    registry.get_manifest(&bearer, repo, "p").expect_error(404, "MANIFEST_UNKNOWN");
    registry.get_manifest(&bearer, repo, "keep").expect(200);
    registry.get_manifest(&bearer, repo, &kept.manifest.digest()).expect(200);
    assert_eq!(registry.tags(&bearer, repo, "").0, ["keep"], "a tag deleted alone");
    registry
        .v2(&bearer, "DELETE", &format!("/v2/{repo}/manifests/{}", digest_of(b"never")), &[], None)
        .expect_error(404, "MANIFEST_UNKNOWN");
}
