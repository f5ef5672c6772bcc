//! The container engine driver: the node agent runs its workloads through the Docker Engine API
//! (bollard), on a unix socket or plain http. Real hosts run Docker; tests and CI run Podman's
//! Docker-compatible service (`.ci/engine.sh`, docs/nodes.md "The container engine").
//!
//! Every container Capstan starts carries the labels `capstan.managed=true`, `capstan.service`,
//! `capstan.slot` and `capstan.assignment`, is named `capstan-<slot>-<assignment prefix>`, and has
//! no restart policy in the engine: Capstan decides restarts. Failures are named refusals
//! (`engine-unreachable`, `image-pull-failed`, `container-create-failed`, …); a registry password
//! never appears in one, nor in a log line.

mod logs;
mod observe;
mod probe;
#[cfg(test)]
pub(crate) mod tests;

// the run loop probes its containers' health (wired in by the runtime session)
#[allow(unused_imports)]
pub use probe::{Probe, probe};

pub use logs::{LogEntry, LogFault, LogStream, Mark};

use bollard::Docker;
use bollard::auth::DockerCredentials;
use bollard::errors::Error as EngineError;
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, ListContainersOptions, RemoveContainerOptions, StopContainerOptions,
};
use capstan_core::Refusal;
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `true` on every container Capstan starts.
pub const LABEL_MANAGED: &str = "capstan.managed";
/// The service's id.
pub const LABEL_SERVICE: &str = "capstan.service";
/// The slot, `<nodeId>.<index>`.
pub const LABEL_SLOT: &str = "capstan.slot";
/// The assignment the container carries out: `list` finds Capstan's containers by it.
pub const LABEL_ASSIGNMENT: &str = "capstan.assignment";

/// How long connecting (ping, version) may take before the engine counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// bollard's per-request timeout (until the answer's head arrives; a pull's progress streams after).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A connection to a container engine speaking the Docker Engine API.
#[derive(Clone)]
pub struct Engine {
    docker: Docker,
    endpoint: String,
    description: String,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine").field("endpoint", &self.endpoint).field("description", &self.description).finish()
    }
}

/// Credentials for pulling from a registry. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct PullAuth {
    /// The registry user.
    pub username: String,
    /// The registry password or token: never logged, never in a refusal.
    pub password: String,
    /// The registry's address as the image reference names it (`127.0.0.1:8080`).
    pub server: String,
}

impl fmt::Debug for PullAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PullAuth").field("username", &self.username).field("password", &"<redacted>").field("server", &self.server).finish()
    }
}

/// A port's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    /// The engine's spelling (`tcp`, `udp`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// A container port published on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// The port inside the container.
    pub container_port: u16,
    /// Its protocol.
    pub protocol: Protocol,
    /// The host port; `None`: one the engine picks (`Observed::published` tells which).
    pub host_port: Option<u16>,
    /// The host address it is bound to; `None`: every address.
    pub host_ip: Option<IpAddr>,
}

/// What to run: one slot of one service, for one assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// The service's id (label `capstan.service`).
    pub service_id: String,
    /// `<nodeId>.<index>` (label `capstan.slot`).
    pub slot: String,
    /// The assignment this container carries out (label `capstan.assignment`).
    pub assignment_id: String,
    /// The image, by digest (`127.0.0.1:8080/acme/web@sha256:…`).
    pub image: String,
    /// The container's environment.
    pub environment: BTreeMap<String, String>,
    /// Ports published on the host.
    pub ports: Vec<PortSpec>,
    /// Host directories (created 0700 when missing) and where they are mounted in the container.
    pub volumes: Vec<(PathBuf, String)>,
    /// Arguments replacing the image's command (`Cmd`; the image's entry point stays); `None`:
    /// the image's own.
    pub command: Option<Vec<String>>,
    /// A host directory of secret files, bound read-only at `/run/secrets`.
    pub secrets_dir: Option<PathBuf>,
}

/// A container's state as the engine reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Created, not started (or its start failed).
    Created,
    /// Running.
    Running,
    /// Exited (`exit_code` and `cause` say how).
    Exited,
    /// The engine gave up on it (a failed removal, …).
    Dead,
    /// Paused, restarting, being removed, or a state this driver does not know.
    Unknown,
}

impl Phase {
    /// The lower-case name (`running`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Created => "created",
            Phase::Running => "running",
            Phase::Exited => "exited",
            Phase::Dead => "dead",
            Phase::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One container Capstan started, as the engine sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The engine's container id.
    pub container_id: String,
    /// Label `capstan.service` (empty on a container without it).
    pub service_id: String,
    /// Label `capstan.slot`.
    pub slot: String,
    /// Label `capstan.assignment`.
    pub assignment_id: String,
    /// Its state.
    pub phase: Phase,
    /// The exit status, once exited (or dead).
    pub exit_code: Option<i64>,
    /// When it last started (RFC 3339, the engine's text), if it ever did.
    pub started_at: Option<String>,
    /// When it last stopped, if it did.
    pub finished_at: Option<String>,
    /// The `sha256:…` digest of the image it runs.
    pub image_digest: Option<String>,
    /// Its address on its network, for health probes.
    pub address: Option<IpAddr>,
    /// Published ports: (container port, host port), sorted.
    pub published: Vec<(u16, u16)>,
    /// The engine's words for why it stopped or failed.
    pub cause: Option<String>,
}

impl Engine {
    /// Connect to the engine at `endpoint` (`unix:///run/docker.sock`, `http://127.0.0.1:2375`; a
    /// bare absolute path is a unix socket), ping it and read its version. The API version is
    /// negotiated down to the engine's (Podman 4.3 speaks 1.41).
    pub async fn connect(endpoint: &str) -> Result<Engine, Refusal> {
        let unreachable = |why: &dyn fmt::Display| {
            Refusal::new("engine-unreachable", format!("the container engine at {endpoint} could not be reached: {why}"))
                .retryable()
                .with_data(serde_json::json!({ "endpoint": endpoint }))
        };
        let docker = match observe::parse_endpoint(endpoint)? {
            observe::Endpoint::Unix(path) => Docker::connect_with_unix(&path, REQUEST_TIMEOUT.as_secs(), bollard::API_DEFAULT_VERSION),
            observe::Endpoint::Http(address) => {
                Docker::connect_with_http(&address, REQUEST_TIMEOUT.as_secs(), bollard::API_DEFAULT_VERSION)
            }
        }
        .map_err(|e| unreachable(&e))?
        // bollard encodes X-Registry-Auth with the standard base64 alphabet; Docker and Podman
        // decode it as base64url, so a credential whose encoding holds `+` or `/` would be refused
        .with_request_modifier(observe::registry_auth_url_safe);
        let talk = async {
            docker.ping().await?;
            let docker = docker.negotiate_version().await?;
            let version = docker.version().await?;
            Ok::<_, EngineError>((docker, version))
        };
        let (docker, version) = match tokio::time::timeout(CONNECT_TIMEOUT, talk).await {
            Err(_) => return Err(unreachable(&format_args!("no answer within {} s", CONNECT_TIMEOUT.as_secs()))),
            Ok(Err(e)) => return Err(unreachable(&e)),
            Ok(Ok(answer)) => answer,
        };
        let description = observe::describe_version(&version, &docker.client_version().to_string());
        Ok(Engine { docker, endpoint: endpoint.to_string(), description })
    }

    /// What the engine is, for logs: `podman 4.3.1 (API 1.41)`.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// Pull `reference` (`host:port/repo@sha256:…`, or a tag), with `auth` when the registry
    /// wants credentials. An image already present by that digest is not pulled again.
    pub async fn pull(&self, reference: &str, auth: Option<&PullAuth>) -> Result<(), Refusal> {
        let parsed = observe::ImageReference::parse(reference)?;
        if let Some(digest) = &parsed.digest
            && self.has_image_digest(reference, digest).await?
        {
            tracing::debug!(reference, "image present by its digest; not pulled");
            return Ok(());
        }
        let scrub = |text: String| observe::scrub(text, auth.map(|a| a.password.as_str()));
        let failed = |why: String| {
            Refusal::new("image-pull-failed", scrub(format!("pulling {reference} failed: {why}")))
                .with_data(serde_json::json!({ "image": reference }))
        };
        let options = CreateImageOptions {
            from_image: Some(parsed.name.clone()),
            tag: Some(parsed.digest.clone().or(parsed.tag.clone()).unwrap_or_else(|| "latest".into())),
            ..Default::default()
        };
        let credentials = auth.map(|a| DockerCredentials {
            username: Some(a.username.clone()),
            password: Some(a.password.clone()),
            serveraddress: Some(a.server.clone()),
            ..Default::default()
        });
        let mut progress = self.docker.create_image(Some(options), None, credentials);
        while let Some(step) = progress.next().await {
            if let Err(e) = step {
                return Err(match self.unreachable(&e) {
                    Some(refusal) => refusal,
                    None => failed(engine_words(&e)),
                });
            }
        }
        // an engine that ends the stream without the image has not pulled it
        match self.docker.inspect_image(reference).await {
            Ok(_) => Ok(()),
            Err(e) => Err(self
                .unreachable(&e)
                .unwrap_or_else(|| failed(format!("the engine reports no such image after the pull ({})", engine_words(&e))))),
        }
    }

    /// Whether the image `reference` is present and is `digest`.
    async fn has_image_digest(&self, reference: &str, digest: &str) -> Result<bool, Refusal> {
        match self.docker.inspect_image(reference).await {
            Ok(image) => Ok(image.id.as_deref() == Some(digest)
                || image.repo_digests.iter().flatten().any(|d| d.rsplit_once('@').is_some_and(|(_, d)| d == digest))),
            Err(e) if status_of(&e) == Some(404) => Ok(false),
            Err(e) => Err(self.unreachable(&e).unwrap_or_else(|| {
                Refusal::new("image-pull-failed", format!("looking up {reference} failed: {}", engine_words(&e)))
                    .with_data(serde_json::json!({ "image": reference }))
            })),
        }
    }

    /// Create and start a container for `spec`; its id. A container whose start failed is
    /// removed again (its host directories stay).
    pub async fn start(&self, spec: &ContainerSpec) -> Result<String, Refusal> {
        let body = observe::create_body(spec)?;
        for (host, _) in &spec.volumes {
            observe::ensure_private_dir(host)?;
        }
        let name = observe::container_name(&spec.slot, &spec.assignment_id);
        let options = CreateContainerOptions { name: Some(name.clone()), ..Default::default() };
        let created = self.docker.create_container(Some(options), body).await.map_err(|e| {
            self.unreachable(&e).unwrap_or_else(|| {
                Refusal::new(
                    "container-create-failed",
                    format!("creating container {name} from {} failed: {}", spec.image, engine_words(&e)),
                )
                .with_data(serde_json::json!({ "name": name, "image": spec.image, "status": status_of(&e) }))
            })
        })?;
        for warning in created.warnings.iter().filter(|w| !w.is_empty()) {
            tracing::warn!(container = %name, warning = %warning, "the engine warned creating the container");
        }
        let id = created.id;
        if let Err(e) = self.docker.start_container(&id, None).await {
            let refusal = self.unreachable(&e).unwrap_or_else(|| {
                Refusal::new("container-start-failed", format!("starting container {name} failed: {}", engine_words(&e)))
                    .with_data(serde_json::json!({ "name": name, "image": spec.image, "status": status_of(&e) }))
            });
            let remove = RemoveContainerOptions { force: true, v: true, ..Default::default() };
            if let Err(e) = self.docker.remove_container(&id, Some(remove)).await
                && status_of(&e) != Some(404)
            {
                tracing::warn!(container = %name, error = %engine_words(&e), "removing the container whose start failed failed");
            }
            return Err(refusal);
        }
        Ok(id)
    }

    /// Every container carrying the label `capstan.assignment`, in any state.
    pub async fn list(&self) -> Result<Vec<Observed>, Refusal> {
        let filters = HashMap::from([("label".to_string(), vec![LABEL_ASSIGNMENT.to_string()])]);
        let options = ListContainersOptions { all: true, filters: Some(filters), ..Default::default() };
        let ids: Vec<String> = match self.docker.list_containers(Some(options)).await {
            Ok(summaries) => summaries.into_iter().filter_map(|s| s.id).collect(),
            // a state bollard's models do not know (Podman's "stopped"): the ids are all it takes
            Err(e) => match unread_answer(&e).and_then(|answer| observe::listed_ids(&answer)) {
                Some(ids) => ids,
                None => {
                    return Err(self.unreachable(&e).unwrap_or_else(|| {
                        Refusal::new("container-list-failed", format!("listing containers failed: {}", engine_words(&e)))
                    }));
                }
            },
        };
        let mut observed = Vec::with_capacity(ids.len());
        for id in ids {
            // one removed between the list and its inspection is simply gone
            if let Some(one) = self.observe(&id).await? {
                observed.push(one);
            }
        }
        observed.sort_by(|a, b| (&a.slot, &a.assignment_id, &a.container_id).cmp(&(&b.slot, &b.assignment_id, &b.container_id)));
        Ok(observed)
    }

    /// The container `container_id` now; `None` when it is gone.
    pub async fn observe(&self, container_id: &str) -> Result<Option<Observed>, Refusal> {
        let inspected = match self.docker.inspect_container(container_id, None).await {
            Ok(inspected) => inspected,
            Err(e) if status_of(&e) == Some(404) => return Ok(None),
            // Podman's states beyond Docker's ("stopped" between a process's exit and its
            // cleanup) fail bollard's models: the answer is read again with them mapped
            Err(e) => match unread_answer(&e).and_then(observe::lenient_inspection) {
                Some(inspected) => inspected,
                None => {
                    return Err(self.unreachable(&e).unwrap_or_else(|| {
                        Refusal::new(
                            "container-inspect-failed",
                            format!("inspecting container {container_id} failed: {}", engine_words(&e)),
                        )
                    }));
                }
            },
        };
        // the digest from the reference it was created with, else from its image's RepoDigests
        let created_with = inspected.config.as_ref().and_then(|c| c.image.clone()).unwrap_or_default();
        let repo_digests = if observe::ImageReference::digest_of(&created_with).is_some() {
            None
        } else {
            match inspected.image.as_deref() {
                Some(image_id) if !image_id.is_empty() => self.docker.inspect_image(image_id).await.ok().and_then(|i| i.repo_digests),
                _ => None,
            }
        };
        Ok(Some(observe::observed_from(&inspected, repo_digests.as_deref())))
    }

    /// Stop the container: SIGTERM, then SIGKILL after `grace`. One already stopped or gone is
    /// fine.
    pub async fn stop(&self, container_id: &str, grace: Duration) -> Result<(), Refusal> {
        let seconds = grace.as_secs_f64().ceil().min(i32::MAX as f64) as i32;
        // the stop answers only once the container is down: the request may take the whole grace
        let docker = self.docker.clone().with_timeout(REQUEST_TIMEOUT + grace);
        match docker.stop_container(container_id, Some(StopContainerOptions { t: Some(seconds), ..Default::default() })).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.unreachable(&e).unwrap_or_else(|| {
                Refusal::new("container-stop-failed", format!("stopping container {container_id} failed: {}", engine_words(&e)))
            })),
        }
    }

    /// Remove the container, by force, with its anonymous volumes. One already gone is fine.
    pub async fn remove(&self, container_id: &str) -> Result<(), Refusal> {
        let remove = RemoveContainerOptions { force: true, v: true, ..Default::default() };
        match self.docker.remove_container(container_id, Some(remove)).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.unreachable(&e).unwrap_or_else(|| {
                Refusal::new("container-remove-failed", format!("removing container {container_id} failed: {}", engine_words(&e)))
                    .retryable()
            })),
        }
    }

    /// Stop the container (`stop`) and remove it (`remove`). A container that cannot be stopped
    /// politely (paused, half-started) is removed by force.
    pub async fn stop_and_remove(&self, container_id: &str, grace: Duration) -> Result<(), Refusal> {
        match self.stop(container_id, grace).await {
            Ok(()) => {}
            Err(refusal) if refusal.code == "engine-unreachable" => return Err(refusal),
            Err(refusal) => tracing::warn!(container = container_id, "{}; removing it by force", refusal.message),
        }
        self.remove(container_id).await
    }

    /// `engine-unreachable` when `e` says the engine could not be talked to at all.
    fn unreachable(&self, e: &EngineError) -> Option<Refusal> {
        let transport = matches!(
            e,
            EngineError::HyperLegacyError { .. }
                | EngineError::IOError { .. }
                | EngineError::RequestTimeoutError
                | EngineError::SocketNotFoundError(_)
                | EngineError::HyperResponseError { .. }
        );
        transport.then(|| {
            Refusal::new("engine-unreachable", format!("the container engine at {} could not be reached: {e}", self.endpoint))
                .retryable()
                .with_data(serde_json::json!({ "endpoint": self.endpoint }))
        })
    }
}

/// The HTTP status the engine answered `e` with.
fn status_of(e: &EngineError) -> Option<u16> {
    match e {
        EngineError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The answer bollard could not read into its models, as JSON.
fn unread_answer(e: &EngineError) -> Option<serde_json::Value> {
    match e {
        EngineError::JsonDataError { contents, .. } => serde_json::from_str(contents).ok(),
        _ => None,
    }
}

/// The engine's own words for `e` (its message, without bollard's framing).
fn engine_words(e: &EngineError) -> String {
    match e {
        EngineError::DockerResponseServerError { message, .. } => message.trim().to_string(),
        EngineError::DockerStreamError { error } => error.trim().to_string(),
        other => other.to_string(),
    }
}
