//! The external gateway's client scopes (docs/gateway-protocol.md, "Client enrollment"): the
//! one table of what Capstan's enrolled client credential is provisioned with and which requests
//! each scope covers. `capstan-gateway` provisions the credential with [`NAMES`]; the plugin
//! host lets a plugin granted `gateway:<scope>` make the requests that scope covers under that
//! credential, and no others. No scope covers `/v1/whoami`, `/v1/status`, `/v1/clients…` or
//! `/v1/client/finalize`: enrollment is the host's alone. One request is open to any grant
//! instead ([`open_to_any_scope`]): `GET /v1/status`, which the gateway answers to any token with
//! its protocol number, may be made by a plugin granted at least one `gateway:<scope>`.

/// The methods a gateway request may use.
pub const METHODS: &[&str] = &["GET", "PUT", "POST", "DELETE"];

/// A `*:read` scope reads.
const READ: &[&str] = &["GET"];

/// A `*:write` scope reads and writes.
const WRITE: &[&str] = METHODS;

/// Which paths a scope covers (the part of a request's path before any `?`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathRule {
    /// Exactly this path (`/v1/domains`).
    Exact(&'static str),
    /// This path, `/` and one non-empty segment (`/v1/routes/<name>`).
    Item(&'static str),
    /// This path or anything below it (`/v1/smtp-credentials`, `/v1/smtp-credentials/<id>/rotate`).
    Tree(&'static str),
}

impl PathRule {
    /// Whether `path` (without its query) is one this rule names.
    pub fn matches(&self, path: &str) -> bool {
        match *self {
            PathRule::Exact(exact) => path == exact,
            PathRule::Item(base) => {
                path.strip_prefix(base).and_then(|rest| rest.strip_prefix('/')).is_some_and(|item| !item.is_empty() && !item.contains('/'))
            }
            PathRule::Tree(base) => {
                path.strip_prefix(base).is_some_and(|rest| rest.is_empty() || rest.strip_prefix('/').is_some_and(|r| !r.is_empty()))
            }
        }
    }
}

/// One scope a gateway client credential may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// Its name at the gateway (`routes:write`).
    pub name: &'static str,
    /// The methods it allows on its paths.
    pub methods: &'static [&'static str],
    /// The paths it covers.
    pub paths: &'static [PathRule],
}

impl Scope {
    /// Whether this scope covers `method` on `path` (a query after `?` is not looked at). The
    /// path's shape (no dot segments, no `//`, the characters allowed) is the caller's to check
    /// first.
    pub fn covers(&self, method: &str, path: &str) -> bool {
        let path = path.split_once('?').map_or(path, |(path, _)| path);
        self.methods.contains(&method) && self.paths.iter().any(|rule| rule.matches(path))
    }
}

/// Every scope, in the order the gateway protocol lists them.
pub const TABLE: [Scope; 6] = [
    Scope { name: "domains:read", methods: READ, paths: &[PathRule::Exact("/v1/domains")] },
    Scope { name: "routes:write", methods: WRITE, paths: &[PathRule::Exact("/v1/routes"), PathRule::Item("/v1/routes")] },
    Scope { name: "certificates:read", methods: READ, paths: &[PathRule::Item("/v1/certificates")] },
    Scope { name: "dns-records:write", methods: WRITE, paths: &[PathRule::Exact("/v1/dns-records"), PathRule::Item("/v1/dns-records")] },
    Scope {
        name: "smtp:write",
        methods: WRITE,
        paths: &[PathRule::Tree("/v1/smtp-credentials"), PathRule::Tree("/v1/smtp-forward-targets")],
    },
    Scope { name: "peers:write", methods: WRITE, paths: &[PathRule::Item("/v1/peers")] },
];

/// The scopes' names, in [`TABLE`]'s order: what Capstan's client credential is provisioned
/// with.
pub const NAMES: [&str; TABLE.len()] = {
    let mut names = [""; TABLE.len()];
    let mut i = 0;
    while i < TABLE.len() {
        names[i] = TABLE[i].name;
        i += 1;
    }
    names
};

/// The request any client credential may make whatever its scopes (the gateway answers it to
/// any token it knows), so one a plugin granted at least one scope may make too: exactly `GET
/// /v1/status` (no query), the gateway's protocol number. Covered by no scope.
pub const OPEN_TO_ANY_SCOPE: (&str, &str) = ("GET", "/v1/status");

/// Whether `method` on `path` is [`OPEN_TO_ANY_SCOPE`]: allowed to a holder of any one scope.
pub fn open_to_any_scope(method: &str, path: &str) -> bool {
    (method, path) == OPEN_TO_ANY_SCOPE
}

/// The scope named `name`.
pub fn scope(name: &str) -> Option<&'static Scope> {
    TABLE.iter().find(|s| s.name == name)
}

/// The scope that covers `method` on `path`, if any does (no two cover the same request).
pub fn covering(method: &str, path: &str) -> Option<&'static Scope> {
    TABLE.iter().find(|s| s.covers(method, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_are_the_tables() {
        assert_eq!(NAMES, ["domains:read", "routes:write", "certificates:read", "dns-records:write", "smtp:write", "peers:write"]);
        for name in NAMES {
            assert_eq!(scope(name).unwrap().name, name);
        }
        assert!(scope("routes:read").is_none());
        assert!(scope("").is_none());
    }

    #[test]
    fn each_path_is_covered_by_its_scope_and_the_methods_it_allows() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("GET", "/v1/domains", Some("domains:read")),
            ("GET", "/v1/domains?verified=true", Some("domains:read")),
            ("PUT", "/v1/domains", None),
            ("GET", "/v1/domains/acme.example", None),
            ("GET", "/v1/routes", Some("routes:write")),
            ("PUT", "/v1/routes/www.acme.example", Some("routes:write")),
            ("DELETE", "/v1/routes/www.acme.example", Some("routes:write")),
            ("POST", "/v1/routes", Some("routes:write")),
            ("PUT", "/v1/routes/", None),
            ("PUT", "/v1/routes/a/b", None),
            ("PUT", "/v1/routesx", None),
            ("GET", "/v1/certificates/www.acme.example", Some("certificates:read")),
            ("GET", "/v1/certificates", None),
            ("DELETE", "/v1/certificates/www.acme.example", None),
            ("GET", "/v1/dns-records", Some("dns-records:write")),
            ("PUT", "/v1/dns-records/node1.acme.example", Some("dns-records:write")),
            ("DELETE", "/v1/dns-records/node1.acme.example", Some("dns-records:write")),
            ("POST", "/v1/smtp-credentials", Some("smtp:write")),
            ("GET", "/v1/smtp-credentials?prefix=capstan.", Some("smtp:write")),
            ("POST", "/v1/smtp-credentials/c1/rotate", Some("smtp:write")),
            ("DELETE", "/v1/smtp-credentials/c1", Some("smtp:write")),
            ("PUT", "/v1/smtp-forward-targets/t1", Some("smtp:write")),
            ("GET", "/v1/smtp-forward-targets?prefix=p", Some("smtp:write")),
            ("GET", "/v1/smtp-credentialsx", None),
            ("PUT", "/v1/peers/p1", Some("peers:write")),
            ("GET", "/v1/peers/p1", Some("peers:write")),
            ("GET", "/v1/peers", None),
            // enrollment is the host's alone
            ("GET", "/v1/whoami", None),
            ("GET", "/v1/status", None),
            ("POST", "/v1/clients/capstan/credentials", None),
            ("POST", "/v1/client/finalize", None),
            ("PATCH", "/v1/routes/a", None),
            ("get", "/v1/domains", None),
        ];
        for (method, path, scope) in cases {
            assert_eq!(covering(method, path).map(|s| s.name), *scope, "{method} {path}");
            // no two scopes cover one request
            assert!(TABLE.iter().filter(|s| s.covers(method, path)).count() <= 1, "{method} {path}");
        }
    }

    #[test]
    fn only_get_of_the_status_itself_is_open_to_any_scope() {
        assert!(open_to_any_scope("GET", "/v1/status"));
        for (method, path) in [
            ("PUT", "/v1/status"),
            ("POST", "/v1/status"),
            ("DELETE", "/v1/status"),
            ("get", "/v1/status"),
            ("GET", "/v1/status?x=1"),
            ("GET", "/v1/status/"),
            ("GET", "/v1/statusx"),
            ("GET", "/v1/whoami"),
            ("GET", "/v1/domains"),
        ] {
            assert!(!open_to_any_scope(method, path), "{method} {path}");
        }
        // it stays covered by no scope: a scope grants it no more than any other does
        assert!(covering("GET", "/v1/status").is_none());
    }
}
