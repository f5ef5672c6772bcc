//! The method registry: every typed API method with its JSON Schemas, who may call it, and
//! strict decoding of request bodies against the method's input type. No HTTP here: the
//! server, the dashboard and the tests all call methods through [`Method::call`].
//!
//! A method's handler gets the [`Call`] (who is calling, from where, under which request id)
//! and the context its area registered it with ([`Registry::with`]): a subsystem reaches the
//! services it was given, never the whole host.

pub mod identity;
pub mod organizations;
pub mod receipts;

pub use capstan_core::refusal;
pub use identity::{ADMIN_FRESHNESS, Identity, denied};
pub use organizations::{OrgRole, OrganizationAuthority};

use capstan_core::refusal::{Refusal, Result};
use futures::future::BoxFuture;
use schemars::{JsonSchema, schema_for};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

type Handler = Arc<dyn Fn(Call, Value) -> BoxFuture<'static, Result<Value>> + Send + Sync>;

/// Who may call a method, host or plugin. Checked by the dispatcher before the body is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Access {
    /// Anyone (login, probes).
    Public,
    /// Any authenticated user or machine.
    Authenticated,
    /// A member of the organization the request names (or an administrator); checked by
    /// `inventory::access` once the organization is known.
    Member,
    /// An owner of the organization the request names (or an administrator).
    Owner,
    /// A human administrator.
    Admin,
}

impl Access {
    /// The name a descriptor or a listing uses (`public`, `authenticated`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Public => "public",
            Access::Authenticated => "authenticated",
            Access::Member => "member",
            Access::Owner => "owner",
            Access::Admin => "admin",
        }
    }
}

impl FromStr for Access {
    type Err = Refusal;
    /// A plugin descriptor's role; anything else is refused `plugin-descriptor-invalid`.
    fn from_str(s: &str) -> Result<Access> {
        Ok(match s {
            "public" => Access::Public,
            "authenticated" => Access::Authenticated,
            "member" => Access::Member,
            "owner" => Access::Owner,
            "admin" => Access::Admin,
            other => {
                return Err(Refusal::new(
                    "plugin-descriptor-invalid",
                    format!("role {other:?} is not one of public, authenticated, member, owner, admin"),
                ));
            }
        })
    }
}

/// One call: the caller as established for this request, its address, the request's id.
#[derive(Debug, Clone, Default)]
pub struct Call {
    /// The authenticated caller; `None` only for public methods.
    pub identity: Option<Identity>,
    /// The client's address, when the call came over the network.
    pub source: Option<IpAddr>,
    /// The id every log line of the request carries (empty outside a request).
    pub request_id: String,
}

impl Call {
    /// A call made by `identity` from inside the host (the dashboard, a test).
    pub fn by(identity: &Identity) -> Call {
        Call { identity: Some(identity.clone()), ..Call::default() }
    }

    /// The authenticated caller (the dispatcher guarantees one for non-public methods).
    pub fn identity(&self) -> Result<&Identity> {
        self.identity.as_ref().ok_or_else(denied)
    }
}

/// One registered method: its name, schemas, access and handler.
pub struct Method {
    /// `<area>.<verb>`.
    pub name: String,
    /// One line for the listing and `--help`.
    pub summary: String,
    /// Who may call it.
    pub access: Access,
    /// The JSON Schema of the body.
    pub input_schema: Value,
    /// The JSON Schema of the answer.
    pub output_schema: Value,
    /// Only the coordinator lease's holder answers: another node forwards the request to it.
    pub coordinator_only: bool,
    handler: Handler,
}

/// Every method the host serves, by name.
#[derive(Default)]
pub struct Registry {
    methods: BTreeMap<String, Method>,
}

/// Registration of one area's methods, each handed a clone of the area's context per call.
pub struct Scope<'r, C> {
    registry: &'r mut Registry,
    context: C,
}

impl<C: Clone + Send + Sync + 'static> Scope<'_, C> {
    /// Register a method whose handler takes the area's context, the call and the decoded body.
    pub fn add<In, Out, F, Fut>(&mut self, name: &str, summary: &str, access: Access, handler: F) -> &mut Method
    where
        In: DeserializeOwned + JsonSchema + Send + 'static,
        Out: Serialize + JsonSchema + 'static,
        F: Fn(C, Call, In) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Out>> + Send + 'static,
    {
        let context = self.context.clone();
        self.registry.add(name, summary, access, move |call, input| handler(context.clone(), call, input))
    }
}

impl Registry {
    /// Register an area's methods with the context their handlers need.
    pub fn with<C: Clone + Send + Sync + 'static>(&mut self, context: C) -> Scope<'_, C> {
        Scope { registry: self, context }
    }

    /// Register a method. `In` is decoded strictly (unknown fields refused) before `handler` runs.
    pub fn add<In, Out, F, Fut>(&mut self, name: &str, summary: &str, access: Access, handler: F) -> &mut Method
    where
        In: DeserializeOwned + JsonSchema + Send + 'static,
        Out: Serialize + JsonSchema + 'static,
        F: Fn(Call, In) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Out>> + Send + 'static,
    {
        assert!(valid_method_name(name), "method name {name} must be <area>.<verb> in camelCase");
        assert!(!self.methods.contains_key(name), "method {name} registered twice");
        let handler = Arc::new(handler);
        let method = Method {
            name: name.into(),
            summary: summary.into(),
            access,
            input_schema: serde_json::to_value(schema_for!(In)).expect("schema serializes"),
            output_schema: serde_json::to_value(schema_for!(Out)).expect("schema serializes"),
            coordinator_only: false,
            handler: Arc::new(move |call, body| {
                let handler = handler.clone();
                Box::pin(async move {
                    let input: In = decode(body)?;
                    let output = handler(call, input).await?;
                    serde_json::to_value(output).map_err(Refusal::internal)
                })
            }),
        };
        self.methods.entry(name.into()).or_insert(method)
    }

    /// The method called `name`.
    pub fn get(&self, name: &str) -> Option<&Method> {
        self.methods.get(name)
    }

    /// Every method, by name.
    pub fn list(&self) -> impl Iterator<Item = &Method> {
        self.methods.values()
    }

    /// The machine-readable listing served at `GET /api/v1/methods`.
    pub fn describe(&self) -> Value {
        let methods: Vec<Value> = self
            .list()
            .map(|m| {
                json!({"name": m.name, "summary": m.summary, "access": m.access, "coordinatorOnly": m.coordinator_only,
                    "input": m.input_schema, "output": m.output_schema})
            })
            .collect();
        json!({ "methods": methods })
    }
}

impl Method {
    /// Mark the method as answered by the coordinator only (`fleet::forward` takes it there).
    pub fn coordinator_only(&mut self) -> &mut Self {
        self.coordinator_only = true;
        self
    }

    /// Run the method for `call`. An administrator-only method refuses anyone else here, before
    /// the body is decoded; organization roles are checked by the handler once it knows the
    /// organization (`inventory::access`).
    pub async fn call(&self, call: Call, body: Value) -> Result<Value> {
        if self.access == Access::Admin && !call.identity.as_ref().is_some_and(|i| i.is_human_admin()) {
            return Err(Refusal::new("forbidden", format!("{} needs an administrator", self.name)));
        }
        (self.handler)(call, body).await
    }
}

/// `<area>.<verb>`: lowercase-initial camelCase words joined by one dot.
pub fn valid_method_name(name: &str) -> bool {
    let Some((area, verb)) = name.split_once('.') else { return false };
    let word = |w: &str| w.starts_with(|c: char| c.is_ascii_lowercase()) && w.chars().all(|c| c.is_ascii_alphanumeric()) && w.len() <= 64;
    word(area) && word(verb)
}

/// What a decoding error says without the value it quotes (serde writes `invalid type:
/// string "…", expected a map`): the value may be a secret put in the wrong field.
fn value_free(inner: &str) -> String {
    if inner.starts_with("missing field") {
        return inner.to_string();
    }
    match inner.split_once(", expected ") {
        Some((_, expected)) => format!("expected {expected}"),
        None => "not a value this field accepts".to_string(),
    }
}

/// Decode a body strictly. A mistake names the field: unknown fields by their path, type
/// errors by the path where they occurred; the offending value is never quoted.
pub fn decode<T: DeserializeOwned>(body: Value) -> Result<T> {
    serde_path_to_error::deserialize(body).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.inner().to_string();
        let (field, message) = match inner.strip_prefix("unknown field `").and_then(|rest| rest.split_once('`')) {
            Some((name, _)) => {
                // the path already ends at the unknown field
                let field = if path == "." || path.is_empty() { name.to_string() } else { path.clone() };
                (field.clone(), format!("unknown field {field:?}"))
            }
            None if path == "." || path.is_empty() => (String::new(), format!("invalid request body: {}", value_free(&inner))),
            None => (path.clone(), format!("invalid field {path:?}: {}", value_free(&inner))),
        };
        let refusal = Refusal::invalid_request(message);
        if field.is_empty() { refusal } else { refusal.with_data(json!({ "field": field })) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Input {
        name: String,
        nested: Option<Nested>,
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Nested {
        count: u32,
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = decode::<Input>(json!({"name": "x", "extra": 1})).unwrap_err();
        assert_eq!(err.code, "invalid-request");
        assert_eq!(err.data.unwrap()["field"], "extra");
        let err = decode::<Input>(json!({"name": "x", "nested": {"count": 1, "deep": 2}})).unwrap_err();
        assert_eq!(err.data.unwrap()["field"], "nested.deep");
    }

    #[test]
    fn type_errors_and_missing_fields_are_refused() {
        let err = decode::<Input>(json!({"name": 5})).unwrap_err();
        assert_eq!(err.data.unwrap()["field"], "name");
        let err = decode::<Input>(json!({"name": "x", "nested": {"count": -1}})).unwrap_err();
        assert_eq!(err.data.unwrap()["field"], "nested.count");
        let err = decode::<Input>(json!({})).unwrap_err();
        assert_eq!(err.code, "invalid-request");
        assert!(err.message.contains("name"), "{}", err.message);
        assert_eq!(decode::<Input>(json!([])).unwrap_err().code, "invalid-request");
    }

    #[test]
    fn refusals_never_quote_the_value() {
        let err = decode::<Input>(json!({"name": {"secret": "hunter2"}})).unwrap_err();
        assert!(!err.message.contains("hunter2"), "{}", err.message);
        let err = decode::<Input>(json!({"name": "x", "nested": {"count": "hunter2-planted"}})).unwrap_err();
        assert!(!err.message.contains("hunter2") && err.message.contains("expected"), "{}", err.message);
        assert!(decode::<Input>(json!({})).unwrap_err().message.contains("missing field `name`"));
    }

    #[test]
    fn method_names_are_area_dot_verb() {
        for ok in ["auth.login", "services.create", "appstore.getCatalogStatus"] {
            assert!(valid_method_name(ok), "{ok}");
        }
        for bad in ["login", "Auth.login", "a.b.c", "a.", ".b", "a.get-x"] {
            assert!(!valid_method_name(bad), "{bad}");
        }
    }

    fn person(admin: bool) -> Identity {
        Identity {
            user_id: "usr_1".into(),
            username: "ann".into(),
            kind: "human".into(),
            admin,
            session_id: "s".into(),
            authenticated_at: 0,
            expires_at: 0,
        }
    }

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Named {
        name: String,
    }

    #[test]
    fn a_scoped_handler_gets_its_areas_context_and_admin_methods_refuse_anyone_else() {
        let mut registry = Registry::default();
        let mut scope = registry.with(String::from("the area's context"));
        scope.add("area.echo", "echo", Access::Authenticated, |context: String, call: Call, input: Named| async move {
            Ok(json!({ "context": context, "name": input.name, "by": call.identity()?.username }))
        });
        scope.add("area.secret", "admins only", Access::Admin, |_: String, _: Call, _: Named| async move { Ok(json!("ran")) });
        let run = |name: &str, call: Call, body: Value| {
            let method = registry.get(name).expect("registered");
            futures::executor::block_on(method.call(call, body))
        };
        let answer = run("area.echo", Call::by(&person(false)), json!({"name": "x"})).unwrap();
        assert_eq!(answer, json!({"context": "the area's context", "name": "x", "by": "ann"}));
        assert_eq!(run("area.echo", Call::by(&person(false)), json!({"name": "x", "extra": 1})).unwrap_err().code, "invalid-request");
        assert_eq!(run("area.echo", Call::default(), json!({"name": "x"})).unwrap_err().code, "unauthenticated");
        assert_eq!(run("area.secret", Call::by(&person(false)), json!({"name": "x"})).unwrap_err().code, "forbidden");
        assert_eq!(run("area.secret", Call::default(), json!({"name": "x"})).unwrap_err().code, "forbidden");
        assert_eq!(run("area.secret", Call::by(&person(true)), json!({"name": "x"})).unwrap(), json!("ran"));
        let listed: Vec<&str> = registry.list().map(|m| m.name.as_str()).collect();
        assert_eq!(listed, ["area.echo", "area.secret"]);
    }

    #[test]
    fn access_names_round_trip_and_unknown_roles_are_refused() {
        for access in [Access::Public, Access::Authenticated, Access::Member, Access::Owner, Access::Admin] {
            assert_eq!(access.as_str().parse::<Access>().unwrap(), access);
            assert_eq!(serde_json::to_value(access).unwrap(), json!(access.as_str()));
        }
        assert_eq!("root".parse::<Access>().unwrap_err().code, "plugin-descriptor-invalid");
    }
}
