//! Facts about the current call.

use crate::bindings::capstan::plugin::types;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What kind of principal made the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallerKind {
    /// A person (dashboard, CLI).
    Human,
    /// A machine user (a cluster, a deployment pipeline).
    Machine,
    /// The host itself (reconcile, events, tasks, migrations).
    Host,
}

/// The authenticated caller of the current call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    kind: CallerKind,
    id: String,
    roles: Vec<String>,
}

impl Caller {
    /// What kind of principal the caller is.
    pub fn kind(&self) -> CallerKind {
        self.kind
    }

    /// The user id (for [`CallerKind::Host`], the host's own principal).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Roles the host established (`admin`, `member`, …). The host already enforced the role
    /// the method declares; these let a plugin narrow further.
    pub fn roles(&self) -> &[String] {
        &self.roles
    }

    /// Whether the caller has `role`.
    pub fn has_role(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r == role)
    }
}

/// The context of one call: request id, caller, node, the plugin's own version, deadline.
///
/// The host runs a fresh instance for every call, so this is all a call knows about the world
/// besides what it reads through the imports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    request_id: String,
    caller: Caller,
    node_id: String,
    plugin_version: String,
    deadline_ms: u64,
}

impl Context {
    /// The request id that also appears on the host's log lines and response headers.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Who made the call.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// The fleet node running this instance.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The plugin's own version as installed.
    pub fn plugin_version(&self) -> &str {
        &self.plugin_version
    }

    /// Milliseconds since the Unix epoch when the host stops this call.
    pub fn deadline_ms(&self) -> u64 {
        self.deadline_ms
    }

    /// When the host stops this call.
    pub fn deadline(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.deadline_ms)
    }

    /// Time left before the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline().duration_since(SystemTime::now()).unwrap_or_default()
    }
}

impl From<types::CallContext> for Context {
    fn from(c: types::CallContext) -> Self {
        let kind = match c.caller.kind {
            types::CallerKind::Human => CallerKind::Human,
            types::CallerKind::Machine => CallerKind::Machine,
            types::CallerKind::Host => CallerKind::Host,
        };
        Context {
            request_id: c.request_id,
            caller: Caller { kind, id: c.caller.id, roles: c.caller.roles },
            node_id: c.node_id,
            plugin_version: c.plugin_version,
            deadline_ms: c.deadline_ms,
        }
    }
}

impl From<Context> for types::CallContext {
    fn from(c: Context) -> Self {
        let kind = match c.caller.kind {
            CallerKind::Human => types::CallerKind::Human,
            CallerKind::Machine => types::CallerKind::Machine,
            CallerKind::Host => types::CallerKind::Host,
        };
        types::CallContext {
            request_id: c.request_id,
            caller: types::Caller { kind, id: c.caller.id, roles: c.caller.roles },
            node_id: c.node_id,
            plugin_version: c.plugin_version,
            deadline_ms: c.deadline_ms,
        }
    }
}

#[cfg(test)]
pub(crate) fn test_context() -> Context {
    Context::from(types::CallContext {
        request_id: "req-1".into(),
        caller: types::Caller { kind: types::CallerKind::Human, id: "user-1".into(), roles: vec!["member".into()] },
        node_id: "node-a".into(),
        plugin_version: "1.2.3".into(),
        deadline_ms: 4_000_000_000_000,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_the_call_context() {
        let ctx = test_context();
        assert_eq!(ctx.request_id(), "req-1");
        assert_eq!(ctx.caller().kind(), CallerKind::Human);
        assert_eq!(ctx.caller().id(), "user-1");
        assert!(ctx.caller().has_role("member"));
        assert!(!ctx.caller().has_role("admin"));
        assert_eq!(ctx.node_id(), "node-a");
        assert_eq!(ctx.plugin_version(), "1.2.3");
        assert_eq!(ctx.deadline(), UNIX_EPOCH + Duration::from_secs(4_000_000_000));
        assert!(ctx.remaining() > Duration::ZERO);
        let back: types::CallContext = ctx.clone().into();
        assert_eq!(Context::from(back), ctx);
    }
}
