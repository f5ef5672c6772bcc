//! The engine driver's pure parts: endpoints, image references, names and labels, the create
//! body, and an `Observed` from the engine's inspection of a container.

use super::{ContainerSpec, LABEL_ASSIGNMENT, LABEL_MANAGED, LABEL_SERVICE, LABEL_SLOT, Observed, Phase};
use bollard::BollardRequest;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerStateStatusEnum, HostConfig, PortBinding, RestartPolicy, RestartPolicyNameEnum,
    SystemVersion,
};
use capstan_core::Refusal;
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Where the engine listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// A unix socket's path.
    Unix(String),
    /// `host:port` over plain http.
    Http(String),
}

/// `unix:///path`, a bare absolute path, `http://host:port` or `tcp://host:port`; anything else
/// (https included: the driver speaks no TLS) is `engine-endpoint-invalid`.
pub(super) fn parse_endpoint(endpoint: &str) -> Result<Endpoint, Refusal> {
    let invalid = |why: &str| {
        Refusal::new("engine-endpoint-invalid", format!("the container engine endpoint {endpoint:?} is not usable: {why}"))
            .with_data(serde_json::json!({ "endpoint": endpoint }))
    };
    if let Some(path) = endpoint.strip_prefix("unix://").or_else(|| endpoint.starts_with('/').then_some(endpoint)) {
        if !path.starts_with('/') || path.len() < 2 || path.ends_with('/') {
            return Err(invalid("a unix socket is named by its absolute path (unix:///run/docker.sock)"));
        }
        return Ok(Endpoint::Unix(path.to_string()));
    }
    let rest = endpoint.strip_prefix("http://").or_else(|| endpoint.strip_prefix("tcp://"));
    let Some(rest) = rest else {
        return Err(invalid(
            "expected unix:///path/to/socket or http://host:port (no TLS: use a unix socket, or plain http on a trusted network)",
        ));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let parsed = url::Url::parse(&format!("http://{rest}")).map_err(|e| invalid(&e.to_string()))?;
    let plain = parsed.path() == "/" && parsed.query().is_none() && parsed.username().is_empty() && parsed.password().is_none();
    match (parsed.host_str(), parsed.port_or_known_default()) {
        (Some(host), Some(port)) if plain && !host.is_empty() => Ok(Endpoint::Http(format!("{host}:{port}"))),
        _ => Err(invalid("expected http://host:port, without a path, query or credentials")),
    }
}

/// bollard's request modifier: X-Registry-Auth re-encoded in base64url (the alphabets differ in
/// two characters, the padding is the same), as Docker and Podman decode it.
pub(super) fn registry_auth_url_safe(mut request: BollardRequest) -> BollardRequest {
    if let Some(value) = request.headers().get("x-registry-auth") {
        let url_safe: Vec<u8> = value
            .as_bytes()
            .iter()
            .map(|b| match b {
                b'+' => b'-',
                b'/' => b'_',
                other => *other,
            })
            .collect();
        if let Ok(value) = reqwest::header::HeaderValue::from_bytes(&url_safe) {
            request.headers_mut().insert("x-registry-auth", value);
        }
    }
    request
}

/// `podman 4.3.1 (API 1.41)`, `docker 27.3.1 (API 1.47)`.
pub(super) fn describe_version(version: &SystemVersion, negotiated: &str) -> String {
    let names = version.components.iter().flatten().map(|c| c.name.to_ascii_lowercase());
    let platform = version.platform.as_ref().map(|p| p.name.to_ascii_lowercase()).unwrap_or_default();
    let names: Vec<String> = names.collect();
    let kind = if names.iter().any(|n| n.contains("podman")) || platform.contains("podman") {
        "podman"
    } else if platform.contains("docker") || names.iter().any(|n| n == "engine") {
        "docker"
    } else {
        "engine"
    };
    let number = version.version.as_deref().filter(|v| !v.is_empty()).unwrap_or("(version unknown)");
    let api = version.api_version.as_deref().filter(|v| !v.is_empty()).unwrap_or(negotiated);
    format!("{kind} {number} (API {api})")
}

/// An image reference split the way the pull API takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ImageReference {
    /// Registry and repository (`127.0.0.1:8080/acme/web`).
    pub name: String,
    /// The tag, when one is named.
    pub tag: Option<String>,
    /// `sha256:…`, when one is named.
    pub digest: Option<String>,
}

impl ImageReference {
    /// Split `reference`; `image-reference-invalid` when it is none.
    pub fn parse(reference: &str) -> Result<ImageReference, Refusal> {
        let invalid = |why: &str| {
            Refusal::new("image-reference-invalid", format!("{reference:?} is not an image reference: {why}"))
                .with_data(serde_json::json!({ "image": reference }))
        };
        if reference.is_empty() || reference.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("empty, or holding spaces"));
        }
        let (named, digest) = match reference.split_once('@') {
            Some((named, digest)) => {
                if !is_sha256_digest(digest) {
                    return Err(invalid("the digest is not sha256: and 64 hex digits"));
                }
                (named, Some(digest.to_string()))
            }
            None => (reference, None),
        };
        // a tag is a colon in the last path segment (a colon before a slash is a registry's port)
        let (name, tag) = match named.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name, Some(tag.to_string())),
            _ => (named, None),
        };
        if name.is_empty() || name.ends_with('/') || tag.as_deref() == Some("") {
            return Err(invalid("no repository name"));
        }
        Ok(ImageReference { name: name.to_string(), tag, digest })
    }

    /// The `sha256:…` digest `reference` names, if any.
    pub fn digest_of(reference: &str) -> Option<&str> {
        reference.rsplit_once('@').map(|(_, digest)| digest).filter(|d| is_sha256_digest(d))
    }
}

fn is_sha256_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `text` without `secret` in it (an engine's message might quote what it was given).
pub(super) fn scrub(text: String, secret: Option<&str>) -> String {
    match secret {
        Some(secret) if !secret.is_empty() && text.contains(secret) => text.replace(secret, "<redacted>"),
        _ => text,
    }
}

/// `capstan-<slot>-<first 12 characters of the assignment>`, within the engine's name rules
/// (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`): any other character becomes `-`.
pub fn container_name(slot: &str, assignment_id: &str) -> String {
    let assignment: String = assignment_id.chars().take(12).collect();
    format!("capstan-{slot}-{assignment}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') { c } else { '-' })
        .collect()
}

/// The labels every container Capstan starts carries.
pub fn labels(spec: &ContainerSpec) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_SERVICE.to_string(), spec.service_id.clone()),
        (LABEL_SLOT.to_string(), spec.slot.clone()),
        (LABEL_ASSIGNMENT.to_string(), spec.assignment_id.clone()),
    ])
}

/// The create request for `spec`; `container-spec-invalid` for a spec no engine could run.
pub(super) fn create_body(spec: &ContainerSpec) -> Result<ContainerCreateBody, Refusal> {
    let invalid = |why: String| {
        Refusal::new("container-spec-invalid", format!("the container for slot {} cannot be made: {why}", spec.slot))
            .with_data(serde_json::json!({ "slot": spec.slot, "assignmentId": spec.assignment_id }))
    };
    for (what, value) in
        [("service id", &spec.service_id), ("slot", &spec.slot), ("assignment id", &spec.assignment_id), ("image", &spec.image)]
    {
        if value.trim().is_empty() {
            return Err(invalid(format!("the {what} is empty")));
        }
    }
    let mut env = Vec::with_capacity(spec.environment.len());
    for (key, value) in &spec.environment {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(invalid(format!("the environment variable {key:?} has no usable name or value")));
        }
        env.push(format!("{key}={value}"));
    }
    let mut exposed = Vec::new();
    let mut bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
    for port in &spec.ports {
        if port.container_port == 0 {
            return Err(invalid("a published container port is 0".into()));
        }
        let key = format!("{}/{}", port.container_port, port.protocol.as_str());
        if !exposed.contains(&key) {
            exposed.push(key.clone());
        }
        let binding = PortBinding {
            host_ip: Some(port.host_ip.map(|ip| ip.to_string()).unwrap_or_default()),
            host_port: Some(port.host_port.map(|p| p.to_string()).unwrap_or_default()),
        };
        bindings.entry(key).or_insert_with(|| Some(Vec::new())).get_or_insert_with(Vec::new).push(binding);
    }
    let mut binds = Vec::with_capacity(spec.volumes.len());
    for (host, mount) in &spec.volumes {
        let host_text = host.to_str().filter(|h| host.is_absolute() && !h.contains(':'));
        let Some(host_text) = host_text else {
            return Err(invalid(format!("the volume directory {} is not an absolute path without ':'", host.display())));
        };
        if !mount.starts_with('/') || mount.contains(':') {
            return Err(invalid(format!("the mount path {mount:?} is not an absolute path without ':'")));
        }
        binds.push(format!("{host_text}:{mount}"));
    }
    if let Some(dir) = &spec.secrets_dir {
        let Some(dir_text) = dir.to_str().filter(|d| dir.is_absolute() && !d.contains(':')) else {
            return Err(invalid(format!("the secrets directory {} is not an absolute path without ':'", dir.display())));
        };
        binds.push(format!("{dir_text}:/run/secrets:ro"));
    }
    Ok(ContainerCreateBody {
        image: Some(spec.image.clone()),
        env: Some(env),
        cmd: spec.command.clone(),
        labels: Some(labels(spec)),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        host_config: Some(HostConfig {
            binds: (!binds.is_empty()).then_some(binds),
            port_bindings: (!bindings.is_empty()).then_some(bindings),
            // Capstan decides restarts, not the engine
            restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::NO), maximum_retry_count: None }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The host directory of a volume: created 0700 (with its missing parents) when missing.
pub(super) fn ensure_private_dir(path: &Path) -> Result<(), Refusal> {
    let failed = |why: String| {
        Refusal::new("container-create-failed", format!("the volume directory {} is not usable: {why}", path.display()))
            .with_data(serde_json::json!({ "path": path.display().to_string() }))
    };
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(failed("it is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(|e| failed(e.to_string()))
        }
        Err(e) => Err(failed(e.to_string())),
    }
}

/// The phase of an engine's `State.Status`.
pub(super) fn phase_of(status: Option<ContainerStateStatusEnum>) -> Phase {
    match status {
        Some(ContainerStateStatusEnum::CREATED) => Phase::Created,
        Some(ContainerStateStatusEnum::RUNNING) => Phase::Running,
        Some(ContainerStateStatusEnum::EXITED) => Phase::Exited,
        Some(ContainerStateStatusEnum::DEAD) => Phase::Dead,
        _ => Phase::Unknown,
    }
}

/// Docker's name for a container state Podman names its own way (`stopped`: the process has
/// exited, the cleanup is still to come; `configured`: created); "" for one neither knows.
fn docker_state(state: &str) -> &'static str {
    match state {
        "created" | "configured" | "initialized" => "created",
        "running" => "running",
        "paused" => "paused",
        "restarting" => "restarting",
        "removing" => "removing",
        "exited" | "stopped" => "exited",
        "dead" => "dead",
        "stopping" => "stopping",
        _ => "",
    }
}

/// An inspection bollard's models refused, read with its `State.Status` mapped to Docker's.
pub(super) fn lenient_inspection(mut answer: serde_json::Value) -> Option<ContainerInspectResponse> {
    if let Some(status) = answer.pointer_mut("/State/Status") {
        *status = docker_state(status.as_str().unwrap_or_default()).into();
    }
    serde_json::from_value(answer).ok()
}

/// The container ids of a list answer bollard's models refused.
pub(super) fn listed_ids(answer: &serde_json::Value) -> Option<Vec<String>> {
    let listed = answer.as_array()?;
    Some(listed.iter().filter_map(|c| c.get("Id").and_then(|id| id.as_str()).map(str::to_string)).collect())
}

/// Why a container stopped or failed, in words: the out-of-memory killer, the engine's error,
/// else its exit status; `None` while it runs or waits to.
pub fn cause(phase: Phase, exit_code: Option<i64>, oom_killed: bool, error: Option<&str>) -> Option<String> {
    if oom_killed {
        return Some("out of memory".into());
    }
    if let Some(error) = error.map(str::trim).filter(|e| !e.is_empty()) {
        return Some(error.to_string());
    }
    match (phase, exit_code) {
        (Phase::Exited | Phase::Dead, Some(code)) => Some(format!("exited with status {code}")),
        (Phase::Dead, None) => Some("the engine marked the container dead".into()),
        _ => None,
    }
}

/// An engine's time, or `None` for its "never" (`0001-01-01T00:00:00Z`) and empty.
fn engine_time(time: Option<&String>) -> Option<String> {
    time.filter(|t| !t.is_empty() && !t.starts_with("0001-01-01")).cloned()
}

/// `Observed` from the engine's inspection of a container; `repo_digests` are its image's
/// RepoDigests, for a container created by tag.
pub(super) fn observed_from(inspected: &ContainerInspectResponse, repo_digests: Option<&[String]>) -> Observed {
    let config = inspected.config.as_ref();
    let label = |name: &str| config.and_then(|c| c.labels.as_ref()).and_then(|l| l.get(name)).cloned().unwrap_or_default();
    let state = inspected.state.as_ref();
    let phase = phase_of(state.and_then(|s| s.status));
    let exit_code = state.and_then(|s| s.exit_code).filter(|_| matches!(phase, Phase::Exited | Phase::Dead));
    let oom_killed = state.and_then(|s| s.oom_killed).unwrap_or(false);
    let cause = cause(phase, exit_code, oom_killed, state.and_then(|s| s.error.as_deref()));

    let created_with = config.and_then(|c| c.image.as_deref()).unwrap_or_default();
    let image_digest = match ImageReference::digest_of(created_with) {
        Some(digest) => Some(digest.to_string()),
        None => {
            let repository = ImageReference::parse(created_with).map(|r| r.name).unwrap_or_default();
            let digests: Vec<(&str, &str)> = repo_digests
                .unwrap_or_default()
                .iter()
                .filter_map(|entry| entry.rsplit_once('@'))
                .filter(|(_, digest)| is_sha256_digest(digest))
                .collect();
            digests.iter().find(|(repo, _)| *repo == repository).or(digests.first()).map(|(_, digest)| digest.to_string())
        }
    };

    let settings = inspected.network_settings.as_ref();
    let mut networks: Vec<_> = settings.and_then(|s| s.networks.as_ref()).map(|n| n.iter().collect()).unwrap_or_default();
    networks.sort_by(|a, b| a.0.cmp(b.0));
    let address = networks.iter().find_map(|(_, endpoint)| {
        [endpoint.ip_address.as_deref(), endpoint.global_ipv6_address.as_deref()]
            .into_iter()
            .flatten()
            .find_map(|ip| ip.parse::<IpAddr>().ok())
    });
    let mut published: Vec<(u16, u16)> = Vec::new();
    for (key, bindings) in settings.and_then(|s| s.ports.as_ref()).into_iter().flatten() {
        let Some(container_port) = key.split('/').next().and_then(|p| p.parse::<u16>().ok()) else { continue };
        for binding in bindings.iter().flatten() {
            if let Some(host_port) = binding.host_port.as_deref().and_then(|p| p.parse::<u16>().ok()).filter(|p| *p != 0) {
                published.push((container_port, host_port));
            }
        }
    }
    published.sort_unstable();
    published.dedup();

    Observed {
        container_id: inspected.id.clone().unwrap_or_default(),
        service_id: label(LABEL_SERVICE),
        slot: label(LABEL_SLOT),
        assignment_id: label(LABEL_ASSIGNMENT),
        phase,
        exit_code,
        started_at: engine_time(state.and_then(|s| s.started_at.as_ref())),
        finished_at: engine_time(state.and_then(|s| s.finished_at.as_ref())),
        image_digest,
        address,
        published,
        cause,
    }
}
