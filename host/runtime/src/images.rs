//! Image plans: a service whose image names a tag (`docker.io/library/nginx:1.27`) runs the
//! digest that tag named when the runtime first planned it. The producer asks the image's
//! registry once (the OCI distribution API, anonymously, through a configured mirror where one
//! is set) and keeps the answer per service; every replica on every cluster then runs that one
//! digest, and a tag moved on its registry later changes nothing that runs until the service's
//! image is written again. An image already pinned (`…@sha256:…`) needs no plan.
//!
//! A failed resolution is kept with its reason and tried again with a growing pause (the
//! target stays `refused image-plan-missing` meanwhile, the plan's `error` saying why).

use capstan_core::clock::now_ms;
use capstan_core::refusal::Result;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Image plans, one per service whose image names a tag: id `<serviceId>`.
pub const RUNTIME_IMAGE_PLANS: &str = "runtime_image_plans";

/// The first pause after a failed resolution; it doubles up to [`RETRY_MAX_MS`].
const RETRY_FIRST_MS: u64 = 5_000;
const RETRY_MAX_MS: u64 = 600_000;

/// A service's image plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagePlan {
    /// The service.
    pub service_id: String,
    /// The service's image as it was when resolved (a plan for another image is stale).
    pub image: String,
    /// The digest (`sha256:…`) the tag named, once resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// When it was resolved (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<u64>,
    /// Why the last resolution failed (none once resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Failed resolutions in a row.
    #[serde(default)]
    pub failures: u32,
    /// When a failed plan is tried again (milliseconds).
    #[serde(default)]
    pub retry_at: u64,
}

impl ImagePlan {
    /// What a replica of a service whose image is `image` runs: `<name>@<digest>` when this
    /// plan is for that image and resolved.
    pub fn pinned(&self, image: &str) -> Option<String> {
        let digest = self.digest.as_ref().filter(|_| self.image == image)?;
        Some(format!("{}@{digest}", without_tag(image)))
    }
}

/// Whether `image` is pinned by a sha256 digest.
pub fn is_pinned(image: &str) -> bool {
    image.rsplit_once("@sha256:").is_some_and(|(_, hex)| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `image` without its tag (a colon in the last path segment; one before a slash is a port).
fn without_tag(image: &str) -> &str {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => image,
    }
}

/// Whether the service's `image` needs `plan` (re)made now: unpinned, and no plan, a plan for
/// another image, or a failed one whose pause is over.
pub fn due(image: &str, plan: Option<&ImagePlan>, now: u64) -> bool {
    if is_pinned(image) {
        return false;
    }
    match plan {
        None => true,
        Some(plan) if plan.image != image => true,
        Some(plan) => plan.digest.is_none() && now >= plan.retry_at,
    }
}

/// One registry mirror: images of `registry` are asked of `host` instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The registry as images name it (`docker.io`, `ghcr.io`, `registry.example:5000`).
    pub registry: String,
    /// The mirror's `host[:port]`.
    pub host: String,
    /// Spoken over plain HTTP (`http://` given).
    pub plain_http: bool,
}

/// Parse `registry=origin,…` (`docker.io=https://mirror.example,ghcr.io=http://127.0.0.1:5000`).
pub fn parse_mirrors(text: &str) -> std::result::Result<Vec<Mirror>, String> {
    let mut mirrors = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((registry, origin)) = entry.split_once('=') else {
            return Err(format!("{entry:?} is not registry=origin (e.g. docker.io=https://mirror.example)"));
        };
        let (plain_http, host) = match (origin.trim().strip_prefix("http://"), origin.trim().strip_prefix("https://")) {
            (Some(host), _) => (true, host),
            (_, Some(host)) => (false, host),
            _ => return Err(format!("the mirror of {registry:?} must start with http:// or https://")),
        };
        let host = host.trim_end_matches('/');
        let registry = registry.trim();
        let fits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
        if !fits(registry) || !fits(host) {
            return Err(format!("{entry:?}: a registry and a mirror are host[:port], without a path"));
        }
        if mirrors.iter().any(|m: &Mirror| m.registry == registry) {
            return Err(format!("{registry} has two mirrors"));
        }
        mirrors.push(Mirror { registry: registry.to_string(), host: host.to_string(), plain_http });
    }
    Ok(mirrors)
}

/// Asks registries what a tag names.
pub struct Resolver {
    client: Client,
    mirrors: Vec<Mirror>,
    /// Capstan's own registry: its tags are pinned by deployments, never resolved here.
    own_registry: String,
}

impl Resolver {
    /// A resolver asking through `mirrors`; images of `own_registry` are not resolved.
    pub fn new(mirrors: Vec<Mirror>, own_registry: &str) -> Resolver {
        let plain: Vec<String> = mirrors.iter().filter(|m| m.plain_http).map(|m| m.host.clone()).collect();
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(plain),
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(30)),
            ..ClientConfig::default()
        };
        Resolver { client: Client::new(config), mirrors, own_registry: own_registry.to_string() }
    }

    /// The digest `image`'s tag names now; the reason when it cannot be learned.
    pub async fn resolve(&self, image: &str) -> std::result::Result<String, String> {
        if image.starts_with(&format!("{}/", self.own_registry)) {
            return Err("an image in Capstan's registry runs pinned by digest: promote a release (deployments.promote) or \
                        turn on deploy-on-push"
                .into());
        }
        let mut reference: Reference = image.parse().map_err(|e| format!("{image:?} is not an image reference: {e}"))?;
        if let Some(mirror) = self.mirrors.iter().find(|m| m.registry == reference.registry()) {
            reference.set_mirror_registry(mirror.host.clone());
        }
        let asked = reference.resolve_registry().to_string();
        let digest = self
            .client
            .fetch_manifest_digest(&reference, &RegistryAuth::Anonymous)
            .await
            .map_err(|e| format!("asking {asked} for {image}: {}", capstan_core::text::truncate(&e.to_string(), 300)))?;
        if !is_pinned(&format!("x@{digest}")) {
            return Err(format!("{asked} answered {image} with a digest that is not sha256: {digest:?}"));
        }
        Ok(digest)
    }
}

/// Make the plan of a service whose image is `image` (after `previous`, if any): resolved, or
/// failed with its reason and the time to try again. Network first, then one write.
pub async fn settle(cx: &crate::Context, service_id: &str, image: &str, previous: Option<&ImagePlan>) -> Result<ImagePlan> {
    let failures = previous.filter(|p| p.image == image).map_or(0, |p| p.failures);
    let now = now_ms();
    let plan = match cx.images.resolve(image).await {
        Ok(digest) => {
            tracing::info!(service = %service_id, %image, %digest, "image tag resolved");
            ImagePlan {
                service_id: service_id.to_string(),
                image: image.to_string(),
                digest: Some(digest),
                resolved_at: Some(now),
                error: None,
                failures: 0,
                retry_at: 0,
            }
        }
        Err(error) => {
            let pause = RETRY_FIRST_MS.saturating_mul(1 << failures.min(10)).min(RETRY_MAX_MS);
            tracing::warn!(service = %service_id, %image, retry_in_ms = pause, "an image tag was not resolved: {error}");
            ImagePlan {
                service_id: service_id.to_string(),
                image: image.to_string(),
                digest: None,
                resolved_at: None,
                error: Some(error),
                failures: failures + 1,
                retry_at: now + pause,
            }
        }
    };
    let data = serde_json::to_value(&plan).map_err(capstan_core::refusal::Refusal::internal)?;
    let id = service_id.to_string();
    let write = cx.store.transact(|tx| {
        let (id, data) = (id.clone(), data.clone());
        async move {
            let revision = tx.get(RUNTIME_IMAGE_PLANS, &id).await?.map(|doc| doc.revision);
            tx.put(RUNTIME_IMAGE_PLANS, &id, revision, data).await
        }
    });
    write.await?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn plan(image: &str, digest: Option<&str>, retry_at: u64) -> ImagePlan {
        ImagePlan {
            service_id: "svc_1".into(),
            image: image.into(),
            digest: digest.map(String::from),
            resolved_at: digest.map(|_| 1),
            error: digest.is_none().then(|| "unreachable".into()),
            failures: u32::from(digest.is_none()),
            retry_at,
        }
    }

    #[test]
    fn a_resolved_plan_pins_its_own_image_only() {
        let p = plan("docker.io/louislam/uptime-kuma:1.23.16", Some(DIGEST), 0);
        assert_eq!(p.pinned("docker.io/louislam/uptime-kuma:1.23.16"), Some(format!("docker.io/louislam/uptime-kuma@{DIGEST}")));
        assert_eq!(p.pinned("docker.io/louislam/uptime-kuma:2.0.0"), None, "a plan for another image pins nothing");
        let port = plan("registry.example:5000/web:1", Some(DIGEST), 0);
        assert_eq!(port.pinned("registry.example:5000/web:1"), Some(format!("registry.example:5000/web@{DIGEST}")));
        let untagged = plan("registry.example:5000/web", Some(DIGEST), 0);
        assert_eq!(untagged.pinned("registry.example:5000/web"), Some(format!("registry.example:5000/web@{DIGEST}")));
        assert_eq!(plan("nginx:1.27", None, 0).pinned("nginx:1.27"), None);
    }

    #[test]
    fn a_plan_is_due_when_missing_stale_or_failed_and_its_pause_is_over() {
        let image = "nginx:1.27";
        assert!(!due(&format!("nginx@{DIGEST}"), None, 0), "a pinned image needs no plan");
        assert!(due(image, None, 0));
        assert!(!due(image, Some(&plan(image, Some(DIGEST), 0)), 10), "a resolved plan stands");
        assert!(due("nginx:1.28", Some(&plan(image, Some(DIGEST), 0)), 10), "a new image is planned again");
        assert!(!due(image, Some(&plan(image, None, 100)), 99), "a failure waits its pause");
        assert!(due(image, Some(&plan(image, None, 100)), 100));
    }

    #[test]
    fn mirrors_are_read_or_refused_by_what_is_wrong() {
        let mirrors = parse_mirrors(" docker.io=http://127.0.0.1:5000/ , ghcr.io=https://mirror.example").unwrap();
        assert_eq!(
            mirrors,
            vec![
                Mirror { registry: "docker.io".into(), host: "127.0.0.1:5000".into(), plain_http: true },
                Mirror { registry: "ghcr.io".into(), host: "mirror.example".into(), plain_http: false },
            ]
        );
        assert_eq!(parse_mirrors("").unwrap(), vec![]);
        assert!(parse_mirrors("docker.io").unwrap_err().contains("registry=origin"));
        assert!(parse_mirrors("docker.io=mirror.example").unwrap_err().contains("http://"));
        assert!(parse_mirrors("docker.io=https://mirror.example/v2").unwrap_err().contains("without a path"));
        assert!(parse_mirrors("docker.io=https://a.example,docker.io=https://b.example").unwrap_err().contains("two mirrors"));
    }

    #[tokio::test]
    async fn capstan_s_own_images_and_malformed_references_are_not_asked_of_anyone() {
        let resolver = Resolver::new(Vec::new(), "capstan.example:8443");
        let own = resolver.resolve("capstan.example:8443/acme/web:1.0").await.unwrap_err();
        assert!(own.contains("deployments.promote"), "{own}");
        let bad = resolver.resolve("UPPER/Case:tag").await.unwrap_err();
        assert!(bad.contains("not an image reference"), "{bad}");
    }

    #[tokio::test]
    async fn a_registry_with_a_mirror_is_asked_at_the_mirror_and_its_silence_is_said() {
        // nothing listens on the port a bound-then-dropped listener had
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let mirrors = parse_mirrors(&format!("docker.io=http://{closed}")).unwrap();
        let resolver = Resolver::new(mirrors, "capstan.example:8443");
        let why = resolver.resolve("nginx:1.27").await.unwrap_err();
        assert!(why.starts_with(&format!("asking {closed} for nginx:1.27: ")), "{why}");
    }
}
