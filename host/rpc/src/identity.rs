//! Who is calling: the identity authentication established for a request, and the one denial
//! every authentication failure gets.

use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use serde::Serialize;
use std::time::Duration;

/// How recent a login a sensitive mutation needs.
pub const ADMIN_FRESHNESS: Duration = Duration::from_secs(5 * 60);

/// Who is calling, as established from durable state on this request (`auth.whoami`).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// The user's id (`plugin:<id>` for a plugin acting on its own account).
    pub user_id: String,
    /// The user's name.
    pub username: String,
    /// `human`, `machine`, `plugin`.
    pub kind: String,
    /// Whether the user is an administrator.
    pub admin: bool,
    /// The session the token belongs to.
    pub session_id: String,
    /// When the user last proved who they are (milliseconds since the epoch).
    pub authenticated_at: u64,
    /// When the session ends (milliseconds since the epoch).
    pub expires_at: u64,
}

impl Identity {
    /// A person who is an administrator (a machine user never is one).
    pub fn is_human_admin(&self) -> bool {
        self.admin && self.kind == "human"
    }

    /// Sensitive mutations need a recent login.
    pub fn require_fresh(&self) -> Result<()> {
        if now_ms().saturating_sub(self.authenticated_at) > capstan_core::clock::millis(ADMIN_FRESHNESS) {
            return Err(Refusal::new("admin-not-fresh", "log in again: this change needs a login from the last 5 minutes"));
        }
        Ok(())
    }
}

/// The one denial every authentication failure gets, so nothing can be probed.
pub fn denied() -> Refusal {
    Refusal::new("unauthenticated", "authentication failed")
}
