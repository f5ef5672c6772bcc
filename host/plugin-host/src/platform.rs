//! What plugins reach of the platform model beyond their own collections and blobs: the
//! inventory's services and settings, and organization roles. The server implements
//! [`Platform`] over the inventory, so this crate depends on no domain crate for it.

use crate::refusal::Result;
use crate::store::Document;
use capstan_rpc::{Identity, OrganizationAuthority};
use serde_json::Value;

/// The platform as the WIT imports and method dispatch reach it.
#[async_trait::async_trait]
pub trait Platform: OrganizationAuthority {
    /// Whether the public setting `key` lists URLs: only such a setting may be named in an
    /// `http-setting:<key>` grant.
    fn setting_lists_urls(&self, key: &str) -> bool;

    /// The URLs the public setting `key` lists now (none when it is unset).
    async fn setting_urls(&self, key: &str) -> Result<Vec<String>>;

    /// The identity a plugin acts with outside any caller's request (events, reconcile, tasks):
    /// the authority the operator approved for it at install.
    fn plugin_identity(&self, plugin: &str) -> Identity;

    /// Create a service from `body` (the `services.create` input) as `actor`.
    async fn create_service(&self, actor: &Identity, body: Value) -> Result<Document>;

    /// Update a service from `body` (the `services.update` input) as `actor`.
    async fn update_service(&self, actor: &Identity, body: Value) -> Result<Document>;

    /// Record `holder` as a manager holding the service (its deletion waits for the release).
    async fn hold_service(&self, service_id: &str, holder: &str) -> Result<()>;

    /// Release `holder`'s hold; a service marked for deletion goes once nobody holds it.
    async fn release_service(&self, service_id: &str, holder: &str) -> Result<()>;
}
