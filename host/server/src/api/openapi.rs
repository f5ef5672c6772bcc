//! `GET /api/v1/openapi.json`: an OpenAPI 3.1 document of every method the registry serves now,
//! built from the same entries (and so the same JSON Schemas) as `GET /api/v1/methods`. It is
//! generated on each request, so a plugin installed, upgraded, disabled or removed shows at once.
//!
//! Each method is one operation, `POST /api/v1/<method>`: its input schema is the request body,
//! its output schema the 200 answer, and every refusal the error envelope. A method's schemas
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
    for (status, codes) in refusals(method) {
        let listed = codes.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ");
        responses.insert(
            status.into(),
            json!({
                "description": format!("Refused: {listed}"),
                "content": { "application/json": { "schema": schema_ref(ERROR_ENVELOPE) } }
            }),
        );
    }
    responses.insert(
        "default".into(),
        json!({
            "description": "Any other refusal, by its code (the method's own refusals, a conflict, store-busy, …)",
            "content": { "application/json": { "schema": schema_ref(ERROR_ENVELOPE) } }
        }),
    );
    let mut operation = json!({
        "operationId": method.name,
        "summary": method.summary,
        "tags": [tag(method)],
        "requestBody": {
            "description": "The method's input; an empty body is {}",
            "required": false,
            "content": { "application/json": { "schema": schema_ref(input) } }
        },
        "responses": responses,
        "x-capstan-access": method.access.as_str(),
        "x-capstan-refusals": refusals(method).into_iter().flat_map(|(_, codes)| codes).collect::<Vec<_>>(),
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

/// The refusals every call of `method` may answer before (or around) its own work, by status:
/// what the dispatcher, the body reader and the method's access judge. Its own refusals are
/// the `default` answer.
fn refusals(method: &Method) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut by_status = vec![("400", vec!["invalid-request"]), ("413", vec!["request-too-large"]), ("415", vec!["unsupported-media-type"])];
    if method.access != Access::Public {
        by_status.push(("401", vec!["unauthenticated"]));
        by_status.push(("403", vec!["forbidden"]));
    }
    let mut unavailable = vec!["store-busy"];
    if method.plugin.is_some() {
        by_status.push(("409", vec!["plugin-disabled"]));
        unavailable.extend(["plugin-unavailable", "plugin-busy"]);
    }
    if method.coordinator_only {
        unavailable.push("coordinator-unavailable");
    }
    by_status.push(("503", unavailable));
    by_status
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
