//! How to reach an S3-compatible bucket: the settings the configuration reads and the S3
//! backend opens with. Owned here so the configuration depends on the blobs, never the reverse.

use capstan_core::text::SecretString;

/// The endpoint of an S3-compatible server (absent: AWS itself).
pub const S3_ENDPOINT: &str = "CAPSTAN_S3_ENDPOINT";
/// The bucket's region.
pub const S3_REGION: &str = "CAPSTAN_S3_REGION";
/// The access key id.
pub const S3_ACCESS_KEY: &str = "CAPSTAN_S3_ACCESS_KEY";
/// The secret access key (never logged or shown).
pub const S3_SECRET_KEY: &str = "CAPSTAN_S3_SECRET_KEY";
/// Path-style addressing (`endpoint/bucket/key`), which most self-hosted servers need.
pub const S3_FORCE_PATH_STYLE: &str = "CAPSTAN_S3_FORCE_PATH_STYLE";

/// How to reach an S3-compatible bucket (used when `CAPSTAN_BLOB_URL` is `s3://…`).
#[derive(Debug, Clone, Default)]
pub struct S3Settings {
    /// `CAPSTAN_S3_ENDPOINT`.
    pub endpoint: Option<String>,
    /// `CAPSTAN_S3_REGION`.
    pub region: String,
    /// `CAPSTAN_S3_ACCESS_KEY`.
    pub access_key: Option<String>,
    /// `CAPSTAN_S3_SECRET_KEY`.
    pub secret_key: Option<SecretString>,
    /// `CAPSTAN_S3_FORCE_PATH_STYLE`.
    pub force_path_style: bool,
}
