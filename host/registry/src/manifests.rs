//! Manifests and indexes as pushed: which kind, what they reference, what the referrers API
//! shows of them. Capstan keeps the bytes exactly as pushed and judges only what it needs.

use crate::errors::OciError;
use crate::names::{Digest, client_digest};
use serde::Deserialize;
use serde_json::Value;

/// Largest manifest accepted (the spec's suggested minimum a registry takes).
pub const MAX_MANIFEST: usize = 4 * 1024 * 1024;

/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker image manifest, schema 2.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list.
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: Option<String>,
    digest: String,
    size: Option<i64>,
    #[serde(default)]
    urls: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Body {
    schema_version: Option<i64>,
    media_type: Option<String>,
    artifact_type: Option<String>,
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
    #[serde(default)]
    manifests: Vec<Descriptor>,
    subject: Option<Descriptor>,
    annotations: Option<Value>,
}

/// What Capstan reads of a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// The media type it is served with.
    pub media_type: String,
    /// Blobs and child manifests that must be in the repository.
    pub references: Vec<String>,
    /// Its subject, for referrers.
    pub subject: Option<String>,
    /// Its artifact type: `artifactType`, else the config's media type (the referrers rule).
    pub artifact_type: Option<String>,
    /// Its annotations.
    pub annotations: Option<Value>,
}

/// Judge a pushed manifest against the `Content-Type` it came with.
pub fn judge(bytes: &[u8], content_type: Option<&str>) -> Result<Judged, OciError> {
    let body: Body = serde_json::from_slice(bytes)
        .map_err(|e| OciError::manifest_invalid(format!("the manifest is not valid JSON of a known form: {e}")))?;
    if body.schema_version != Some(2) {
        return Err(OciError::manifest_invalid("only schemaVersion 2 manifests and indexes are supported (Docker schema 1 is not)"));
    }
    let content_type = content_type.map(|c| c.split(';').next().unwrap_or("").trim()).filter(|c| !c.is_empty());
    let media_type = match (content_type, body.media_type.as_deref()) {
        (Some(header), Some(field)) if header != field => {
            return Err(OciError::manifest_invalid(format!("Content-Type {header} does not match the manifest's mediaType {field}")));
        }
        (Some(t), _) | (None, Some(t)) => t.to_string(),
        (None, None) if !body.manifests.is_empty() => OCI_INDEX.to_string(),
        (None, None) => OCI_MANIFEST.to_string(),
    };
    let mut references = Vec::new();
    let mut add = |d: &Descriptor| -> Result<(), OciError> {
        let digest = client_digest(&d.digest)
            .map_err(|_| OciError::manifest_invalid(format!("descriptor digest {:?} is not a sha256 digest", crate::text(&d.digest))))?;
        if d.size.is_none_or(|s| s < 0) {
            return Err(OciError::manifest_invalid("every descriptor needs a size"));
        }
        if !references.contains(&digest.as_str().to_string()) {
            references.push(digest.as_str().to_string());
        }
        Ok(())
    };
    match media_type.as_str() {
        OCI_MANIFEST | DOCKER_MANIFEST => {
            let config = body.config.as_ref().ok_or_else(|| OciError::manifest_invalid("an image manifest needs a config"))?;
            add(config)?;
            for layer in &body.layers {
                // a foreign (non-distributable) layer is fetched from its URLs, never from here
                let foreign = !layer.urls.is_empty()
                    && layer.media_type.as_deref().is_some_and(|t| t.contains("nondistributable") || t.contains("foreign"));
                if !foreign {
                    add(layer)?;
                }
            }
        }
        OCI_INDEX | DOCKER_LIST => {
            for manifest in &body.manifests {
                add(manifest)?;
            }
        }
        other => return Err(OciError::manifest_invalid(format!("media type {} is not a manifest Capstan stores", crate::text(other)))),
    }
    let subject = match &body.subject {
        Some(s) => Some(
            client_digest(&s.digest)
                .map_err(|_| OciError::manifest_invalid("the subject's digest is not a sha256 digest"))?
                .as_str()
                .to_string(),
        ),
        None => None,
    };
    let artifact_type = body.artifact_type.clone().or_else(|| body.config.as_ref().and_then(|c| c.media_type.clone()));
    Ok(Judged { media_type, references, subject, artifact_type, annotations: body.annotations })
}

/// The digest a manifest is stored under.
pub fn digest_of(bytes: &[u8]) -> Digest {
    Digest::of(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn d(n: char) -> String {
        format!("sha256:{}", n.to_string().repeat(64))
    }

    #[test]
    fn an_image_manifest_references_its_config_and_layers() {
        let m = json!({ "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": d('a'), "size": 2 },
            "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d('b'), "size": 3 },
                       { "mediaType": "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip", "digest": d('c'), "size": 3, "urls": ["https://x"] }],
            "subject": { "mediaType": OCI_MANIFEST, "digest": d('e'), "size": 9 } });
        let judged = judge(m.to_string().as_bytes(), Some(OCI_MANIFEST)).unwrap();
        assert_eq!(judged.references, vec![d('a'), d('b')]);
        assert_eq!(judged.subject, Some(d('e')));
        assert_eq!(judged.artifact_type.as_deref(), Some("application/vnd.oci.image.config.v1+json"));
    }

    #[test]
    fn an_index_references_its_manifests_and_its_type_comes_from_the_header_or_body() {
        let m = json!({ "schemaVersion": 2, "manifests": [{ "mediaType": OCI_MANIFEST, "digest": d('1'), "size": 5 }] });
        assert_eq!(judge(m.to_string().as_bytes(), None).unwrap().media_type, OCI_INDEX);
        assert_eq!(judge(m.to_string().as_bytes(), Some(DOCKER_LIST)).unwrap().references, vec![d('1')]);
    }

    #[test]
    fn malformed_manifests_are_refused() {
        let cases = [
            (json!({ "schemaVersion": 1 }), Some(OCI_MANIFEST)),
            (json!({ "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [] }), Some(OCI_MANIFEST)),
            (json!({ "schemaVersion": 2 }), Some(OCI_MANIFEST)),
            (json!({ "schemaVersion": 2, "config": { "digest": "md5:x", "size": 1 } }), Some(OCI_MANIFEST)),
            (json!({ "schemaVersion": 2, "config": { "digest": d('a') } }), Some(OCI_MANIFEST)),
            (json!({ "schemaVersion": 2, "config": { "digest": d('a'), "size": 1 } }), Some("text/plain")),
        ];
        for (m, ct) in cases {
            assert_eq!(judge(m.to_string().as_bytes(), ct).unwrap_err().code, "MANIFEST_INVALID", "{m}");
        }
        assert_eq!(judge(b"not json", None).unwrap_err().code, "MANIFEST_INVALID");
    }
}
