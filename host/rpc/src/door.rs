//! The one door into the method path. HTTP, the socket, the dashboard, MCP and the demo call
//! methods through [`Registry::invoke`]: it resolves the method, establishes the caller as the
//! method's access needs, decodes the body, forwards a coordinator-only method to the node that
//! holds the coordinator lease when this one does not, and runs it here through the audit. A
//! caller can therefore not skip forwarding, authorization or the audit by coming in elsewhere.
//!
//! What needs the network or the keys lives above this crate and is handed in once at
//! assembly: an [`Authenticator`] (bearer tokens) and a [`Coordination`] (the fleet's lease and
//! the HTTP hop to its holder). Without them a bearer is refused and a coordinator-only method
//! runs here (a single host, a unit test).

use crate::{Access, Answer, Call, Identity, Method, Registry, denied};
use capstan_core::refusal::{Refusal, Result};
use serde_json::{Value, json};
use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

/// The counter of method calls through the door, by method and outcome (`answered` here,
/// `forwarded` to the coordinator, `refused`): HTTP, socket, dashboard, MCP and demo calls alike.
pub const CALLS_METRIC: &str = "capstan_method_calls_total";

/// Who is calling, as the door learns it.
pub enum Caller<'a> {
    /// The bearer token presented, if any: authenticated here as the method's access needs
    /// (a public method serves anyone; a valid token only tells it who is asking).
    Bearer(Option<&'a str>),
    /// A caller verified otherwise: a relay session by its relay bearer, a dashboard session,
    /// the host itself (the demo). `bearer` is what a forwarded call carries to the coordinator,
    /// which authenticates it again; without one a forwarded call is answered as anonymous.
    Verified {
        /// Who it is.
        identity: Identity,
        /// The token it stands on, when it has one.
        bearer: Option<&'a str>,
    },
    /// A caller the door already admitted ([`Registry::admit`]): HTTP establishes who is calling
    /// before it reads a byte of the body, so an anonymous client cannot make the host buffer
    /// one for a method it may not call.
    Admitted(Admitted, Option<&'a str>),
}

/// A method resolved and its caller established as the method's access needs
/// ([`Registry::admit`]); handed back to [`Registry::invoke`] as [`Caller::Admitted`].
pub struct Admitted {
    method: Arc<Method>,
    identity: Option<Identity>,
}

impl Admitted {
    /// Whether the caller is nobody (a public method called without a token that authenticates).
    pub fn is_anonymous(&self) -> bool {
        self.identity.is_none()
    }
}

/// The body of a call.
pub enum Body<'a> {
    /// The bytes as the client sent them, read by `decode` once the caller is known (a refusal
    /// of the body is then an audited refusal of a known caller). They are forwarded as they
    /// came, and a plugin's method receives their text unchanged.
    Raw {
        /// The bytes.
        bytes: &'a [u8],
        /// How they become the method's body (HTTP checks its content type here).
        decode: &'a (dyn Fn(&[u8]) -> Result<Value> + Send + Sync),
    },
    /// A body already parsed (the socket's frame, an in-process caller's).
    Value(Value),
}

/// One call as it reaches the door.
pub struct Invocation<'a> {
    /// The method's name.
    pub method: &'a str,
    /// Who is calling.
    pub caller: Caller<'a>,
    /// The client's address, when the call came over the network.
    pub source: Option<IpAddr>,
    /// The request's id (logged, passed on when forwarded); empty outside a request.
    pub request_id: &'a str,
    /// The call came from another fleet node forwarding it here: it is not forwarded again.
    pub forwarded: bool,
    /// The body.
    pub body: Body<'a>,
}

impl<'a> Invocation<'a> {
    /// A call from inside the host by a caller it already knows (the dashboard, MCP, the demo).
    pub fn verified(method: &'a str, identity: &Identity, bearer: Option<&'a str>, body: Value) -> Invocation<'a> {
        Invocation {
            method,
            caller: Caller::Verified { identity: identity.clone(), bearer },
            source: None,
            request_id: "",
            forwarded: false,
            body: Body::Value(body),
        }
    }

    /// The same call under the request id `request_id`.
    pub fn with_request_id(mut self, request_id: &'a str) -> Invocation<'a> {
        self.request_id = request_id;
        self
    }
}

/// How a call was answered.
#[derive(Debug)]
pub enum Invoked {
    /// By this node; `answered_by` names it for a coordinator-only method.
    Here {
        /// The method's answer.
        answer: Answer,
        /// This node's id, for a coordinator-only method.
        answered_by: Option<String>,
    },
    /// By the coordinator, whose HTTP answer is passed on as it came.
    There(Forwarded),
}

impl Invoked {
    /// The answer as an in-process caller reads it: the coordinator's answer parsed back, its
    /// error envelope back into the refusal it carried.
    pub fn into_answer(self) -> Result<Answer> {
        match self {
            Invoked::Here { answer, .. } => Ok(answer),
            Invoked::There(forwarded) => forwarded.into_answer(),
        }
    }

    /// [`Invoked::into_answer`] as a JSON tree.
    pub fn into_value(self) -> Result<Value> {
        self.into_answer()?.into_value()
    }
}

/// A coordinator-only call as it is passed to the coordinator.
pub struct Forward<'a> {
    /// The method's name.
    pub method: &'a str,
    /// The caller's token, carried over (the coordinator authenticates it again).
    pub bearer: Option<&'a str>,
    /// The request's id.
    pub request_id: &'a str,
    /// The body's bytes.
    pub body: &'a [u8],
}

/// The coordinator's HTTP answer to a forwarded call.
#[derive(Debug, Clone)]
pub struct Forwarded {
    /// Its HTTP status.
    pub status: u16,
    /// The node that answered (its `x-capstan-answered-by`).
    pub answered_by: Option<String>,
    /// Its body: the method's answer, or the error envelope.
    pub body: Vec<u8>,
}

impl Forwarded {
    /// The answer it carries, or the refusal its error envelope names.
    pub fn into_answer(self) -> Result<Answer> {
        let holder = self.answered_by.as_deref().unwrap_or("the coordinator");
        let value: Value = serde_json::from_slice(&self.body).map_err(|e| {
            Refusal::new("coordinator-unavailable", format!("{holder} answered with something other than JSON")).retryable().detail(e)
        })?;
        if (200..300).contains(&self.status) {
            return Ok(Answer::Tree(value));
        }
        Err(refusal_of(&value["error"]).unwrap_or_else(|| {
            Refusal::new("coordinator-unavailable", format!("{holder} answered {} without naming why", self.status)).retryable()
        }))
    }
}

/// The refusal an error envelope's `error` names.
fn refusal_of(error: &Value) -> Option<Refusal> {
    let code = error["code"].as_str().filter(|c| !c.is_empty())?;
    let mut refusal = Refusal::new(code.to_string(), error["message"].as_str().unwrap_or_default());
    refusal.retryable = error["retryable"].as_bool().unwrap_or(false);
    if let Some(data) = error.get("data").filter(|d| !d.is_null()) {
        refusal = refusal.with_data(data.clone());
    }
    Some(refusal)
}

/// Turns a bearer token into the caller it stands for (uniformly `unauthenticated` otherwise).
#[async_trait::async_trait]
pub trait Authenticator: Send + Sync {
    /// The identity `bearer` stands for.
    async fn authenticate(&self, bearer: &str) -> Result<Identity>;
}

/// Where coordinator-only calls are answered: the fleet's lease and the hop to its holder.
#[async_trait::async_trait]
pub trait Coordination: Send + Sync {
    /// This node's id (an answer given here names it).
    fn node_id(&self) -> &str;

    /// `Ok(None)` when this node holds the lease and answers the call itself; otherwise the
    /// holder's answer to `call`, or why it cannot be had (`coordinator-unavailable`, …).
    /// `forwarded`: the call already came from another node, so it is not passed on again.
    async fn forward(&self, call: Forward<'_>, forwarded: bool) -> Result<Option<Forwarded>>;
}

/// Asked before every owner method a caller runs here: whether an authority that lives outside
/// Capstan (the platform's identity provider) still stands behind the caller. It may bring the
/// caller's memberships in step first, so the method's own role check reads them as they are.
#[async_trait::async_trait]
pub trait LiveAuthority: Send + Sync {
    /// `Ok` to go on; a refusal stops the call.
    async fn confirm(&self, identity: &Identity) -> Result<()>;
}

/// What the door is handed at assembly.
#[derive(Default, Clone)]
pub(crate) struct Keepers {
    pub authenticator: Option<Arc<dyn Authenticator>>,
    pub coordination: Option<Arc<dyn Coordination>>,
    pub live_authority: Option<Arc<dyn LiveAuthority>>,
}

impl Registry {
    /// Authenticate bearer tokens with `authenticator`.
    pub fn set_authenticator(&mut self, authenticator: Arc<dyn Authenticator>) {
        self.keepers.authenticator = Some(authenticator);
    }

    /// Ask `authority` before every owner method (see [`LiveAuthority`]).
    pub fn set_live_authority(&mut self, authority: Arc<dyn LiveAuthority>) {
        self.keepers.live_authority = Some(authority);
    }

    /// Send coordinator-only calls where `coordination` says.
    pub fn set_coordination(&mut self, coordination: Arc<dyn Coordination>) {
        self.keepers.coordination = Some(coordination);
    }

    /// The one door: resolve the method, establish the caller, decode the body, forward a
    /// coordinator-only method where the lease is, or answer here through the audit.
    pub async fn invoke(&self, invocation: Invocation<'_>) -> Result<Invoked> {
        let Invocation { method: name, caller, source, request_id, forwarded, body } = invocation;
        let (method, identity, bearer) = match caller {
            Caller::Verified { identity, bearer } => (self.resolve(name).await?, Some(identity), bearer),
            Caller::Bearer(bearer) => {
                let Admitted { method, identity } = self.admit(name, bearer).await?;
                (method, identity, bearer)
            }
            Caller::Admitted(Admitted { method, identity }, bearer) => (method, identity, bearer),
        };
        let invoked = self.invoke_admitted(method.clone(), identity, bearer, source, request_id, forwarded, body).await;
        // every call of a registered method, by whichever door it came, answered here or not
        let outcome = match &invoked {
            Ok(Invoked::There(_)) => "forwarded",
            Ok(Invoked::Here { .. }) => "answered",
            Err(_) => "refused",
        };
        metrics::counter!(CALLS_METRIC, "method" => method.name.clone(), "outcome" => outcome).increment(1);
        invoked
    }

    /// [`Registry::invoke`] once the method is resolved and its caller established.
    #[allow(clippy::too_many_arguments)]
    async fn invoke_admitted(
        &self,
        method: Arc<Method>,
        identity: Option<Identity>,
        bearer: Option<&str>,
        source: Option<IpAddr>,
        request_id: &str,
        forwarded: bool,
        body: Body<'_>,
    ) -> Result<Invoked> {
        let name = method.name.as_str();
        let request_id = request_id.to_string();
        let (input, raw) = match body {
            Body::Raw { bytes, decode } => (decode(bytes), Some(bytes)),
            Body::Value(value) => (Ok(value), None),
        };
        let input = match input {
            Ok(input) => input,
            Err(refusal) => {
                // the caller is known: a body that could not be read is a refused call
                let call = Call { identity, source, request_id, body_text: None };
                self.refused(&method, &call, &refusal).await;
                return Err(refusal);
            }
        };
        // the JSON text the input was parsed from, for a plugin to hand over unchanged
        let body_text = raw
            .filter(|raw| method.plugin.is_some() && !raw.iter().all(u8::is_ascii_whitespace))
            .and_then(|raw| std::str::from_utf8(raw).ok())
            .map(str::to_string);
        let coordination = self.keepers.coordination.as_ref().filter(|_| method.coordinator_only);
        let answered_by = match coordination {
            None => None,
            Some(coordination) => {
                let bytes: Cow<'_, [u8]> = match raw {
                    Some(raw) => Cow::Borrowed(raw),
                    None => Cow::Owned(serde_json::to_vec(&input).map_err(Refusal::internal)?),
                };
                let call = Forward { method: name, bearer, request_id: &request_id, body: &bytes };
                if let Some(answer) = coordination.forward(call, forwarded).await? {
                    return Ok(Invoked::There(answer));
                }
                Some(coordination.node_id().to_string())
            }
        };
        let call = Call { identity, source, request_id, body_text };
        if let (Access::Owner, Some(authority), Some(identity)) = (method.access, &self.keepers.live_authority, &call.identity)
            && let Err(refusal) = authority.confirm(identity).await
        {
            self.refused(&method, &call, &refusal).await;
            return Err(refusal);
        }
        Ok(Invoked::Here { answer: self.answer(&method, call, input).await?, answered_by })
    }

    /// Resolve the method called `name` (host and plugin methods alike: a plugin's are registry
    /// entries while it is loaded here) and establish who `bearer` stands for, as its access
    /// needs: the first two steps of [`Registry::invoke`], for a caller that must know them
    /// before it reads the body.
    pub async fn admit(&self, name: &str, bearer: Option<&str>) -> Result<Admitted> {
        let method = self.resolve(name).await?;
        let identity = self.caller(&method, bearer).await?;
        Ok(Admitted { method, identity })
    }

    /// The caller a bearer stands for, as `method`'s access needs it.
    async fn caller(&self, method: &Method, bearer: Option<&str>) -> Result<Option<Identity>> {
        let authenticate = |bearer: &str| {
            let authenticator = self.keepers.authenticator.clone();
            let bearer = bearer.to_string();
            async move {
                match authenticator {
                    Some(authenticator) => authenticator.authenticate(&bearer).await,
                    // fail closed: nobody can be established without an authenticator
                    None => Err(denied()),
                }
            }
        };
        Ok(match method.access {
            Access::Public => match bearer {
                Some(bearer) => authenticate(bearer).await.ok(),
                None => None,
            },
            Access::Authenticated | Access::Member | Access::Owner | Access::Admin => Some(authenticate(bearer.ok_or_else(denied)?).await?),
        })
    }
}

/// A refusal as the error envelope of an answer carries it (what [`Forwarded::into_answer`]
/// reads back).
pub fn envelope(refusal: &Refusal) -> Value {
    json!({ "error": refusal })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::person;
    use std::sync::Mutex;

    struct Tokens;

    #[async_trait::async_trait]
    impl Authenticator for Tokens {
        async fn authenticate(&self, bearer: &str) -> Result<Identity> {
            match bearer {
                "admin-token" => Ok(person(true)),
                "user-token" => Ok(person(false)),
                _ => Err(denied()),
            }
        }
    }

    /// What was forwarded: the method, the bearer, the body, whether it came forwarded.
    type Seen = (String, Option<String>, Vec<u8>, bool);

    /// A node that does not hold the lease: every call is answered with `answer`, and what was
    /// forwarded is kept.
    struct Elsewhere {
        answer: Forwarded,
        seen: Mutex<Vec<Seen>>,
    }

    #[async_trait::async_trait]
    impl Coordination for Elsewhere {
        fn node_id(&self) -> &str {
            "node-b"
        }
        async fn forward(&self, call: Forward<'_>, forwarded: bool) -> Result<Option<Forwarded>> {
            let seen = (call.method.to_string(), call.bearer.map(str::to_string), call.body.to_vec(), forwarded);
            self.seen.lock().unwrap().push(seen);
            Ok(Some(self.answer.clone()))
        }
    }

    struct Holder;

    #[async_trait::async_trait]
    impl Coordination for Holder {
        fn node_id(&self) -> &str {
            "node-a"
        }
        async fn forward(&self, _: Forward<'_>, _: bool) -> Result<Option<Forwarded>> {
            Ok(None)
        }
    }

    fn registry() -> Registry {
        let mut registry = Registry::default();
        registry.add("area.whoami", "who", Access::Authenticated, |call: Call, _: Value| async move {
            Ok(json!({ "by": call.identity()?.username }))
        });
        registry.add("area.open", "anyone", Access::Public, |call: Call, _: Value| async move {
            Ok(json!({ "known": call.identity.is_some() }))
        });
        registry
            .add("area.lead", "the coordinator's", Access::Admin, |_: Call, body: Value| async move { Ok(json!({ "ran": body })) })
            .coordinator_only();
        registry.set_authenticator(Arc::new(Tokens));
        registry
    }

    fn invoke(registry: &Registry, invocation: Invocation<'_>) -> Result<Invoked> {
        futures::executor::block_on(registry.invoke(invocation))
    }

    fn by_bearer<'a>(method: &'a str, bearer: Option<&'a str>, body: Value) -> Invocation<'a> {
        Invocation { method, caller: Caller::Bearer(bearer), source: None, request_id: "r1", forwarded: false, body: Body::Value(body) }
    }

    #[test]
    fn a_caller_is_admitted_before_the_body_and_the_admission_is_what_the_call_runs_as() {
        let registry = registry();
        let admit = |name: &str, bearer: Option<&str>| futures::executor::block_on(registry.admit(name, bearer));
        assert_eq!(admit("nobody.home", Some("user-token")).err().unwrap().code, "method-unknown");
        assert_eq!(admit("area.whoami", None).err().unwrap().code, "unauthenticated");
        assert_eq!(admit("area.whoami", Some("forged")).err().unwrap().code, "unauthenticated");
        assert!(admit("area.open", None).unwrap().is_anonymous());
        assert!(admit("area.open", Some("forged")).unwrap().is_anonymous(), "a token that fails is nobody");
        let admitted = admit("area.whoami", Some("user-token")).unwrap();
        assert!(!admitted.is_anonymous());
        let invocation = Invocation { caller: Caller::Admitted(admitted, Some("user-token")), ..by_bearer("area.whoami", None, json!({})) };
        assert_eq!(invoke(&registry, invocation).unwrap().into_value().unwrap()["by"], "ann");
    }

    #[test]
    fn a_bearer_is_authenticated_as_the_methods_access_needs() {
        let registry = registry();
        let answer = invoke(&registry, by_bearer("area.whoami", Some("user-token"), json!({}))).unwrap().into_value().unwrap();
        assert_eq!(answer["by"], "ann");
        for bearer in [None, Some("forged")] {
            let refused = invoke(&registry, by_bearer("area.whoami", bearer, json!({}))).unwrap_err();
            assert_eq!(refused.code, "unauthenticated");
        }
        let open = invoke(&registry, by_bearer("area.open", Some("forged"), json!({}))).unwrap().into_value().unwrap();
        assert_eq!(open["known"], false, "a public method serves a caller whose token fails, as anyone");
        assert_eq!(invoke(&registry, by_bearer("nobody.home", None, json!({}))).unwrap_err().code, "method-unknown");
        let mut bare = Registry::default();
        bare.add("area.whoami", "who", Access::Authenticated, |_: Call, _: Value| async move { Ok(json!({})) });
        let refused = invoke(&bare, by_bearer("area.whoami", Some("user-token"), json!({}))).unwrap_err();
        assert_eq!(refused.code, "unauthenticated", "without an authenticator nobody is established");
    }

    #[test]
    fn a_raw_body_is_decoded_once_the_caller_is_known() {
        let registry = registry();
        let decode = |bytes: &[u8]| serde_json::from_slice::<Value>(bytes).map_err(|_| Refusal::invalid_request("not JSON"));
        let raw = |bytes: &'static [u8], bearer| Invocation {
            method: "area.whoami",
            caller: Caller::Bearer(bearer),
            source: None,
            request_id: "",
            forwarded: false,
            body: Body::Raw { bytes, decode: &decode },
        };
        assert_eq!(invoke(&registry, raw(b"{", None)).unwrap_err().code, "unauthenticated", "the caller first");
        assert_eq!(invoke(&registry, raw(b"{", Some("user-token"))).unwrap_err().code, "invalid-request");
        assert!(invoke(&registry, raw(b"{}", Some("user-token"))).is_ok());
    }

    #[test]
    fn a_coordinator_only_method_goes_to_the_holder_from_every_caller() {
        let mut registry = registry();
        let envelope = envelope(&Refusal::new("fence-stale", "stale").retryable().with_data(json!({ "fence": 3 })));
        let elsewhere = Arc::new(Elsewhere {
            answer: Forwarded { status: 409, answered_by: Some("node-a".into()), body: envelope.to_string().into_bytes() },
            seen: Mutex::default(),
        });
        registry.set_coordination(elsewhere.clone());
        let verified = Invocation::verified("area.lead", &person(true), Some("session-jwt"), json!({ "n": 1 }));
        let refused = invoke(&registry, verified).unwrap().into_answer().unwrap_err();
        assert_eq!((refused.code.as_ref(), refused.retryable), ("fence-stale", true));
        assert_eq!(refused.data.as_deref(), Some(&json!({ "fence": 3 })));
        let seen = elsewhere.seen.lock().unwrap().clone();
        assert_eq!(seen, [("area.lead".to_string(), Some("session-jwt".to_string()), br#"{"n":1}"#.to_vec(), false)]);
        // a method that is not the coordinator's is answered here
        let here = invoke(&registry, by_bearer("area.whoami", Some("user-token"), json!({}))).unwrap();
        assert!(matches!(here, Invoked::Here { answered_by: None, .. }));
        assert_eq!(elsewhere.seen.lock().unwrap().len(), 1);

        registry.set_coordination(Arc::new(Holder));
        let here = invoke(&registry, by_bearer("area.lead", Some("admin-token"), json!({ "n": 2 }))).unwrap();
        let Invoked::Here { answer, answered_by } = here else { panic!("answered elsewhere") };
        assert_eq!((answer.into_value().unwrap(), answered_by.as_deref()), (json!({ "ran": { "n": 2 } }), Some("node-a")));
        let refused = invoke(&registry, by_bearer("area.lead", Some("user-token"), json!({}))).unwrap_err();
        assert_eq!(refused.code, "forbidden", "the holder authorizes as any node does");
    }

    #[test]
    fn a_forwarded_answer_that_is_not_an_envelope_is_refused_by_name() {
        let answer = |status, body: &str| Forwarded { status, answered_by: None, body: body.as_bytes().to_vec() }.into_answer();
        assert_eq!(answer(200, "{\"ok\":true}").unwrap().into_value().unwrap(), json!({ "ok": true }));
        assert_eq!(answer(502, "<html>").unwrap_err().code, "coordinator-unavailable");
        assert_eq!(answer(500, "{}").unwrap_err().code, "coordinator-unavailable");
    }
}
