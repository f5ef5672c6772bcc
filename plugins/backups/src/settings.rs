//! The operator's settings (`backups.*`) and the external target they name.

use capstan_sdk::{JsonSchema, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Settings {
    #[serde(default)]
    pub(crate) backup_cron: Option<String>,
    pub(crate) backup_keep_last: u32,
    pub(crate) backup_max_bytes: u64,
    #[serde(default)]
    backup_target_endpoint: Option<String>,
    #[serde(default)]
    backup_target_bucket: Option<String>,
    backup_target_prefix: String,
    backup_target_region: String,
}

impl Settings {
    /// The external target, when one is set (endpoint and bucket); credentials are not here.
    pub(crate) fn target(&self) -> Option<Target> {
        let endpoint = self.backup_target_endpoint.as_deref().map(str::trim).filter(|e| !e.is_empty())?;
        let bucket = self.backup_target_bucket.as_deref().map(str::trim).filter(|b| !b.is_empty())?;
        Some(Target {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            bucket: bucket.to_string(),
            prefix: self.backup_target_prefix.trim_matches('/').to_string(),
            region: self.backup_target_region.trim().to_string(),
        })
    }
}

/// The external target the settings name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Target {
    pub(crate) endpoint: String,
    pub(crate) bucket: String,
    pub(crate) prefix: String,
    pub(crate) region: String,
}

impl Target {
    /// How a backup's replica names where it went.
    pub(crate) fn name(&self) -> String {
        match self.prefix.as_str() {
            "" => format!("{}/{}", self.endpoint, self.bucket),
            prefix => format!("{}/{}/{prefix}", self.endpoint, self.bucket),
        }
    }
}

pub(crate) fn settings() -> Result<Settings> {
    capstan_sdk::settings::get::<Settings>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_needs_an_endpoint_and_a_bucket_and_is_named_by_where_copies_go() {
        let settings = |endpoint: Option<&str>, bucket: Option<&str>, prefix: &str| Settings {
            backup_cron: None,
            backup_keep_last: 24,
            backup_max_bytes: 1,
            backup_target_endpoint: endpoint.map(str::to_string),
            backup_target_bucket: bucket.map(str::to_string),
            backup_target_prefix: prefix.to_string(),
            backup_target_region: " us-east-1 ".to_string(),
        };
        assert_eq!(settings(None, Some("b"), "p").target(), None);
        assert_eq!(settings(Some("https://s3.example.com"), None, "p").target(), None);
        assert_eq!(settings(Some("  "), Some("b"), "p").target(), None);
        let target = settings(Some("https://s3.example.com/"), Some("offsite"), "/capstan/").target().unwrap();
        assert_eq!(
            (target.endpoint.as_str(), target.prefix.as_str(), target.region.as_str()),
            ("https://s3.example.com", "capstan", "us-east-1")
        );
        assert_eq!(target.name(), "https://s3.example.com/offsite/capstan");
        assert_eq!(settings(Some("http://h:9000"), Some("b"), "").target().unwrap().name(), "http://h:9000/b");
    }
}
