//! `GET /api/v1/openapi.json`: an OpenAPI 3.1 document of every method the registry serves now,
//! built from the same entries (and so the same JSON Schemas) as `GET /api/v1/methods`. It is
//! generated on each request, so a plugin installed, upgraded, disabled or removed shows at once.
//!
//! Each method is one operation, `POST /api/v1/<method>`: its input schema is the request body,
//! its output schema the 200 answer, and every refusal the error envelope. The refusal codes it
//! may answer are listed under the HTTP status each answers (`capstan_core::refusal::code_status`,
//! the table the API's answers use) and in `x-capstan-refusals`: those any call may answer and,
//! for a host method, those it declares where it is registered (`Method::refuses`). A debug
//! build logs `capstan_rpc::UNDECLARED_REFUSAL` when a host method answers a code it does not
//! declare, and the e2e suite fails the test whose server logged it. A plugin declares its
//! codes with their status in its descriptor (`Method::declared_refusals`): they are listed
//! under those statuses, and anything else it answers is the `default` answer. A method's schemas
//! become two components (`<method>.input`, `<method>.output`) kept whole, `$defs` included: a
//! reference inside one (`#/$defs/X`, or `#` itself) is rewritten to point into its component,
//! so it resolves in the document exactly as it did in the schema alone.

use capstan_rpc::{Access, Method};
use serde_json::{Map, Value, json};

/// The component every refusal's answer has: `{"error":{"code","message","retryable","data"?}}`.
pub const ERROR_ENVELOPE: &str = "ErrorEnvelope";

/// The OpenAPI 3.1 document for `methods`, served from `origin`.
pub fn document(methods: &[std::sync::Arc<Method>], origin: &str) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    schemas.insert(ERROR_ENVELOPE.into(), error_envelope());
    for method in methods {
        let input = format!("{}.input", method.name);
        let output = format!("{}.output", method.name);
        schemas.insert(input.clone(), rebased(&method.input_schema, &input));
        schemas.insert(output.clone(), rebased(&method.output_schema, &output));
        paths.insert(format!("/api/v1/{}", method.name), json!({ "post": operation(method, &input, &output) }));
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Capstan API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Every method of this Capstan, host and plugin alike: POST /api/v1/<method> with a JSON body. \
                The same methods, with their JSON Schemas, are listed at GET /api/v1/methods and callable over \
                the /api/v1/socket WebSocket. Every refusal answers the error envelope with a stable kebab-case code."
        },
        "servers": [{ "url": origin }],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": "The token auth.login answers (or a machine user's JWT)"
                }
            }
        },
        "tags": tags(methods),
    })
}

/// One method as an operation.
fn operation(method: &Method, input: &str, output: &str) -> Value {
    let schema_ref = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
    let mut responses = Map::new();
    responses.insert(
        "200".into(),
        json!({ "description": "The method's answer", "content": { "application/json": { "schema": schema_ref(output) } } }),
    );
    let refusals = refusals(method);
    for (status, codes) in by_status(&refusals, &method.declared_refusals) {
        let listed = codes.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ");
        responses.insert(
            status.to_string(),
            json!({
                "description": format!("Refused: {listed}"),
                "content": { "application/json": { "schema": schema_ref(ERROR_ENVELOPE) } }
            }),
        );
    }
    let default = match (&method.plugin, method.passes_on) {
        (Some(_), _) => "Any other refusal, by its code: those the plugin answers without declaring them".to_string(),
        (None, Some(whom)) => format!("Any other refusal, by its code: those of {whom}, passed on as they come"),
        (None, None) => {
            "Any other refusal, by its code (none is expected: every refusal this method answers is listed by its status)".into()
        }
    };
    responses.insert(
        "default".into(),
        json!({ "description": default, "content": { "application/json": { "schema": schema_ref(ERROR_ENVELOPE) } } }),
    );
    let mut description = String::from("Refusal codes by HTTP status below; all of them in `x-capstan-refusals`.");
    if method.plugin.is_some() {
        description.push_str(
            " Listed: the refusals the host answers for any plugin method, and those the plugin declares with their status; \
             any other it answers comes under `default`.",
        );
    }
    let mut operation = json!({
        "operationId": method.name,
        "summary": method.summary,
        "description": description,
        "tags": [tag(method)],
        "requestBody": {
            "description": "The method's input; an empty body is {}",
            "required": false,
            "content": { "application/json": { "schema": schema_ref(input) } }
        },
        "responses": responses,
        "x-capstan-access": method.access.as_str(),
        "x-capstan-refusals": refusals,
    });
    // a public method needs no token (a token only says who asks); any other needs the bearer
    operation["security"] = if method.access == Access::Public { json!([{}, { "bearer": [] }]) } else { json!([{ "bearer": [] }]) };
    if method.coordinator_only {
        operation["x-capstan-coordinator-only"] = json!(true);
    }
    if method.read_only {
        operation["x-capstan-read-only"] = json!(true);
    }
    if let Some(plugin) = &method.plugin {
        operation["x-capstan-plugin"] = json!(plugin);
    }
    operation
}

/// The refusals the host answers for any plugin method, besides the plugin's own: it is
/// disabled, not loaded, busy, or its call failed, ran out of time or memory, or answered
/// something its schema refuses.
const PLUGIN_REFUSALS: &[&str] = &[
    "plugin-disabled",
    "plugin-unavailable",
    "plugin-busy",
    "plugin-failed",
    "plugin-deadline-exceeded",
    "plugin-resource-exhausted",
    "plugin-output-invalid",
];

/// Every refusal code `method` may answer ([`Method::refusal_codes`]), and for a plugin's
/// method those the plugin host answers for it and those the plugin declares.
fn refusals(method: &Method) -> Vec<String> {
    let mut codes: Vec<String> = method.refusal_codes().into_iter().map(str::to_string).collect();
    if method.plugin.is_some() {
        codes.extend(PLUGIN_REFUSALS.iter().map(|c| c.to_string()));
        codes.extend(method.declared_refusals.iter().map(|(code, _)| code.clone()));
        codes.sort_unstable();
        codes.dedup();
    }
    codes
}

/// `codes` grouped by the HTTP status each answers (the one table's, else the status its
/// plugin `declared`), statuses ascending.
fn by_status<'a>(codes: &'a [String], declared: &[(String, u16)]) -> std::collections::BTreeMap<u16, Vec<&'a str>> {
    let mut grouped = std::collections::BTreeMap::<u16, Vec<&'a str>>::new();
    for code in codes {
        let declared = declared.iter().find(|(c, _)| c == code).map(|(_, status)| *status);
        let status = capstan_core::refusal::code_status(code).or(declared).unwrap_or_else(|| capstan_rpc::documented_status(code));
        grouped.entry(status).or_default().push(code);
    }
    grouped
}

/// The tag an operation is grouped under: its plugin, or the host area (`auth`, `services`, …).
fn tag(method: &Method) -> String {
    method.plugin.clone().unwrap_or_else(|| method.name.split('.').next().unwrap_or_default().to_string())
}

fn tags(methods: &[std::sync::Arc<Method>]) -> Value {
    let mut names: Vec<String> = methods.iter().map(|m| tag(m)).collect();
    names.sort();
    names.dedup();
    Value::Array(names.into_iter().map(|name| json!({ "name": name })).collect())
}

/// `schema` as the component `name`: every local reference (`#…`) made to point into it.
fn rebased(schema: &Value, name: &str) -> Value {
    let base = format!("#/components/schemas/{name}");
    let mut schema = schema.clone();
    rebase(&mut schema, &base);
    schema
}

fn rebase(value: &mut Value, base: &str) {
    match value {
        Value::Object(fields) => {
            for (key, child) in fields.iter_mut() {
                match child {
                    Value::String(target) if (key == "$ref" || key == "$dynamicRef") && target.starts_with('#') => {
                        *target = format!("{base}{}", &target[1..]);
                    }
                    _ => rebase(child, base),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rebase(item, base)),
        _ => {}
    }
}

fn error_envelope() -> Value {
    json!({
        "type": "object",
        "description": "How every refusal is answered",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "retryable"],
                "properties": {
                    "code": { "type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$", "description": "Stable kebab-case code clients match on" },
                    "message": { "type": "string", "description": "What a person reads" },
                    "retryable": { "type": "boolean", "description": "Whether asking again may succeed" },
                    "data": { "description": "Structured detail of the refusal, when it has any" }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_rpc::{Call, Registry, documented_status};
    use std::sync::Arc;

    /// The codes the response for `status` names in its description.
    fn listed(operation: &Value, status: u16) -> Vec<String> {
        let description = operation["responses"][status.to_string()]["description"].as_str().unwrap_or_default();
        description.split('`').skip(1).step_by(2).map(str::to_string).collect()
    }

    fn operation<'d>(document: &'d Value, method: &str) -> &'d Value {
        &document["paths"][format!("/api/v1/{method}")]["post"]
    }

    #[test]
    fn a_host_methods_own_refusals_are_listed_under_the_status_each_answers() {
        let mut registry = Registry::default();
        registry.add("widgets.create", "Create a widget", Access::Owner, |_: Call, _: Value| async move { Ok(json!({})) }).refuses(&[
            "exists",
            "conflict",
            "widget-not-found",
            "quota-exceeded",
            "relay-not-connected",
        ]);
        registry.add("widgets.ping", "Anyone may ask", Access::Public, |_: Call, _: Value| async move { Ok(json!({})) });
        let document = document(&registry.list(), "https://capstan.example");
        let create = operation(&document, "widgets.create");
        assert_eq!(listed(create, 409), ["conflict", "exists"]);
        assert_eq!(listed(create, 404), ["widget-not-found"]);
        assert_eq!(listed(create, 503), ["relay-not-connected", "store-busy", "store-unavailable"]);
        assert!(listed(create, 400).contains(&"quota-exceeded".to_string()), "a code the table does not name is a 400");
        assert!(listed(create, 400).contains(&"invalid-request".to_string()));
        assert_eq!(listed(create, 401), ["unauthenticated"]);
        assert_eq!(listed(create, 500), ["internal"]);
        let all: Vec<&str> = create["x-capstan-refusals"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        for code in ["exists", "conflict", "widget-not-found", "quota-exceeded", "forbidden", "store-busy"] {
            assert!(all.contains(&code), "{code} in {all:?}");
            assert!(listed(create, documented_status(code)).iter().any(|c| c == code), "{code} under its status");
        }
        assert!(!all.contains(&"coordinator-unavailable"), "only a coordinator-only method is refused so");
        let ping = operation(&document, "widgets.ping");
        assert!(ping["responses"].get("401").is_none() && ping["responses"].get("403").is_none(), "a public method needs no caller");
        assert!(ping["responses"].get("409").is_none(), "no refusal it does not declare");
        assert!(ping["responses"]["default"]["description"].as_str().unwrap().contains("none is expected"));
    }

    #[test]
    fn every_listed_code_is_listed_once_under_the_status_its_refusal_answers() {
        let mut registry = Registry::default();
        registry
            .add("area.change", "changes", Access::Admin, |_: Call, _: Value| async move { Ok(json!({})) })
            .refuses(&["conflict", "mutation-reused", "task-running", "rate-limited", "node-missing", "bundle-too-large"])
            .coordinator_only();
        let document = document(&registry.list(), "https://capstan.example");
        let change = operation(&document, "area.change");
        let mut seen = Vec::new();
        for (status, response) in change["responses"].as_object().unwrap() {
            let Some(status) = status.parse::<u16>().ok().filter(|s| *s != 200) else { continue };
            assert_eq!(response["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorEnvelope", "{status}");
            for code in listed(change, status) {
                let answered = capstan_core::refusal::Refusal::new(code.clone(), "x").http_status();
                assert_eq!(answered, status, "{code} is answered {answered}, listed under {status}");
                seen.push(code);
            }
        }
        let mut declared: Vec<String> =
            change["x-capstan-refusals"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
        seen.sort();
        declared.sort();
        assert_eq!(seen, declared, "each code under exactly one status");
        assert!(declared.contains(&"coordinator-unavailable".to_string()));
    }

    #[test]
    fn a_plugins_method_lists_what_the_host_answers_for_it_and_leaves_its_own_to_default() {
        let handler: capstan_rpc::RawHandler = Arc::new(|_, _| Box::pin(async move { Ok(json!({}).into()) }));
        let method =
            Method::served_by("hello", "hello.greet".into(), "Greet".into(), Access::Authenticated, (json!({}), json!({})), handler);
        let document = document(&[Arc::new(method)], "https://capstan.example");
        let greet = operation(&document, "hello.greet");
        assert_eq!(listed(greet, 409), ["plugin-disabled"]);
        assert!(listed(greet, 503).contains(&"plugin-busy".to_string()));
        assert!(listed(greet, 400).contains(&"plugin-failed".to_string()));
        assert!(greet["responses"]["default"]["description"].as_str().unwrap().contains("without declaring them"));
        assert!(greet["description"].as_str().unwrap().contains("any other it answers comes under `default`"));
    }

    #[test]
    fn a_plugins_declared_refusals_are_listed_under_their_status() {
        let handler: capstan_rpc::RawHandler = Arc::new(|_, _| Box::pin(async move { Ok(json!({}).into()) }));
        let mut method =
            Method::served_by("hello", "hello.greet".into(), "Greet".into(), Access::Authenticated, (json!({}), json!({})), handler);
        // a code of the host's table keeps the table's status whatever the plugin says
        method.declared_refusals = vec![("greeting-taken".into(), 409), ("greeter-asleep".into(), 503), ("conflict".into(), 422)];
        let document = document(&[Arc::new(method)], "https://capstan.example");
        let greet = operation(&document, "hello.greet");
        assert_eq!(listed(greet, 409), ["conflict", "greeting-taken", "plugin-disabled"]);
        assert!(listed(greet, 503).contains(&"greeter-asleep".to_string()));
        assert!(greet["responses"].get("422").is_none(), "{greet}");
        let all: Vec<&str> = greet["x-capstan-refusals"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        assert!(all.contains(&"greeting-taken") && all.contains(&"greeter-asleep"), "{all:?}");
    }

    #[test]
    fn a_method_that_passes_on_anothers_refusals_says_whose() {
        let mut registry = Registry::default();
        registry
            .add("relays.echo", "echo", Access::Admin, |_: Call, _: Value| async move { Ok(json!({})) })
            .refuses(&["relay-timeout"])
            .passes_on("the relay's agent");
        let document = document(&registry.list(), "https://capstan.example");
        let echo = operation(&document, "relays.echo");
        assert_eq!(listed(echo, 503), ["relay-timeout", "store-busy", "store-unavailable"]);
        assert!(echo["responses"]["default"]["description"].as_str().unwrap().contains("the relay's agent"));
    }

    /// Every host method of a full host: its own codes are kebab-case, none of them generic, and
    /// each is in the document under the status its refusal answers.
    #[tokio::test]
    async fn the_hosts_methods_declare_their_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let state = crate::state::test_state(dir.path()).await;
        let methods = state.methods.list();
        let document = document(&methods, "https://capstan.example");
        let kebab = |c: &str| {
            !c.is_empty() && c.split('-').all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
        };
        let mut declaring = 0;
        for method in methods.iter().filter(|m| m.plugin.is_none()) {
            for code in &method.refuses {
                assert!(kebab(code), "{}: {code:?} is not kebab-case", method.name);
                // (a public method answers no caller-less refusal of its own accord: it declares one it does answer)
                let generic = capstan_rpc::GENERIC_REFUSALS.contains(code)
                    && !(method.access == Access::Public && matches!(*code, "unauthenticated" | "forbidden"));
                assert!(!generic, "{}: {code} is answered by any method", method.name);
                let operation = operation(&document, &method.name);
                assert!(listed(operation, documented_status(code)).iter().any(|c| c == code), "{}: {code}", method.name);
            }
            declaring += usize::from(!method.refuses.is_empty());
        }
        // most host methods can refuse something of their own: a registration that forgot to
        // say so shows here (and in the e2e suite, once a test makes it answer one)
        let host = methods.iter().filter(|m| m.plugin.is_none()).count();
        assert!(declaring * 2 >= host, "{declaring} of {host} host methods declare refusal codes");
        for (name, code) in [("services.create", "exists"), ("nodes.get", "node-missing"), ("tasks.trigger", "task-running")] {
            let method = methods.iter().find(|m| m.name == name).unwrap();
            assert!(method.refuses.contains(&code), "{name} declares {code}");
        }
    }

    #[test]
    fn local_references_point_into_their_component() {
        let schema = json!({
            "$defs": { "Port": { "type": "integer" }, "Node": { "properties": { "next": { "$ref": "#" } } } },
            "properties": { "port": { "$ref": "#/$defs/Port" }, "other": { "$ref": "https://example.invalid/x" },
                "$ref": { "type": "string" } }
        });
        let rebased = rebased(&schema, "a.b.input");
        assert_eq!(rebased["properties"]["port"]["$ref"], "#/components/schemas/a.b.input/$defs/Port");
        assert_eq!(rebased["$defs"]["Node"]["properties"]["next"]["$ref"], "#/components/schemas/a.b.input");
        assert_eq!(rebased["properties"]["other"]["$ref"], "https://example.invalid/x", "only local references move");
        assert_eq!(rebased["properties"]["$ref"], json!({ "type": "string" }), "a property named $ref is a property");
    }
}
