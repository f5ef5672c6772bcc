//! The agent's wire (`/agent/v1/…`), judged in the order `docs/nodes.md` states: the bounded
//! read (the server's), the protocol offer (`protocol-unsupported`), the node id and token
//! (`node-unauthorized`), the body (`invalid-request` naming the member), then the credential
//! store. Every answer carries `"protocol": "capstan-agent/1"`; a credential is never echoed.

use super::Context;
use crate::credentials::{self, Authenticated, RotateInput, unauthorized};
use crate::enroll::EnrollRequest;
use capstan_core::refusal::{Refusal, Result};
use capstan_core::wire::heartbeat::Report;
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The one protocol served.
pub const PROTOCOL: &str = "capstan-agent/1";
/// `POST /agent/v1/enroll` reads at most this many bytes.
pub const ENROLL_LIMIT: usize = 4 * 1024;
/// `POST /agent/v1/heartbeat` reads at most this many bytes.
pub const HEARTBEAT_LIMIT: usize = 16 * 1024;
/// `POST /agent/v1/host` reads at most this many bytes.
pub const HOST_LIMIT: usize = 1024;
/// `POST /agent/v1/rotate` reads at most this many bytes.
pub const ROTATE_LIMIT: usize = 1024;

/// The body as a JSON object whose `protocol` is one served; `protocol-unsupported` (HTTP 422)
/// naming the served ones otherwise.
pub fn offer(bytes: &[u8]) -> Result<Map<String, Value>> {
    let value: Value = serde_json::from_slice(bytes).map_err(|_| Refusal::invalid_request("the body is not valid JSON"))?;
    let Value::Object(body) = value else { return Err(Refusal::invalid_request("the body is a JSON object")) };
    if body.get("protocol").and_then(Value::as_str) != Some(PROTOCOL) {
        return Err(Refusal::new("protocol-unsupported", format!("this Capstan speaks {PROTOCOL}"))
            .with_data(json!({ "field": "protocol", "served": [PROTOCOL] })));
    }
    Ok(body)
}

fn answer(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        map.insert("protocol".into(), json!(PROTOCOL));
    }
    value
}

fn to_value(value: &impl serde::Serialize) -> Result<Value> {
    serde_json::to_value(value).map_err(Refusal::internal)
}

async fn authenticate(cx: &Context, body: &Map<String, Value>, bearer: Option<&str>) -> Result<Authenticated> {
    credentials::authenticate(cx, body.get("nodeId").and_then(Value::as_str), bearer).await
}

/// `POST /agent/v1/enroll`: `{protocol, code, hostname, tokenSha256, agentVersion}`.
pub async fn enroll(cx: &Context, bytes: &[u8]) -> Result<Value> {
    let body = offer(bytes)?;
    let request: EnrollRequest = capstan_rpc::decode(Value::Object(body))?;
    let enrolled = crate::enroll::enroll(cx, &request).await?;
    Ok(answer(to_value(&enrolled)?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HeartbeatBody {
    #[allow(dead_code)]
    protocol: String,
    #[allow(dead_code)]
    node_id: String,
    report: Report,
}

/// `POST /agent/v1/heartbeat`: `{protocol, nodeId, report}` with the bearer token.
pub async fn heartbeat(cx: &Context, bytes: &[u8], bearer: Option<&str>) -> Result<Value> {
    let body = offer(bytes)?;
    let who = authenticate(cx, &body, bearer).await?;
    let parsed: HeartbeatBody = capstan_rpc::decode(Value::Object(body))?;
    parsed.report.check()?;
    let accepted = crate::heartbeat::accept(cx, &who, &parsed.report).await?;
    Ok(answer(to_value(&accepted)?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HostBody {
    #[allow(dead_code)]
    protocol: String,
    #[allow(dead_code)]
    node_id: String,
}

/// `POST /agent/v1/host`: `{protocol, nodeId}` with the bearer token; answers
/// `{protocol, hostname: string | null, generation}`.
pub async fn host(cx: &Context, bytes: &[u8], bearer: Option<&str>) -> Result<Value> {
    let body = offer(bytes)?;
    let who = authenticate(cx, &body, bearer).await?;
    let _: HostBody = capstan_rpc::decode(Value::Object(body))?;
    let desired = crate::hostnames::desired(cx, &who.node_id).await.map_err(|_| unauthorized())?;
    Ok(answer(to_value(&desired)?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RotateBody {
    #[allow(dead_code)]
    protocol: String,
    node_id: String,
    token_sha256: String,
    expected_generation: u64,
    mutation_id: String,
}

/// `POST /agent/v1/rotate`: `{protocol, nodeId, tokenSha256, expectedGeneration, mutationId}`
/// with the current bearer; answers the credential metadata. An exact replay answers the
/// recorded answer, also when it presents the token that rotation replaced.
pub async fn rotate(cx: &Context, bytes: &[u8], bearer: Option<&str>) -> Result<Value> {
    let body = offer(bytes)?;
    let who = match authenticate(cx, &body, bearer).await {
        Ok(who) => who,
        Err(refusal) => {
            // the rotation this exact request made replaced the token it presents
            let replayed = match (serde_json::from_value::<RotateBody>(Value::Object(body)), bearer) {
                (Ok(parsed), Some(token)) => credentials::replay_for_previous_bearer(cx, &rotate_input(parsed), token).await?,
                _ => None,
            };
            return match replayed {
                Some(view) => Ok(answer(to_value(&view)?)),
                None => Err(refusal),
            };
        }
    };
    let parsed: RotateBody = capstan_rpc::decode(Value::Object(body))?;
    let input = rotate_input(parsed);
    if input.node_id != who.node_id {
        return Err(unauthorized());
    }
    let bearer_sha256 = bearer.map(|t| crate::sha256_hex(t.as_bytes()));
    let by = format!("node:{}", who.node_id);
    let view = credentials::rotate(cx, &input, &by, bearer_sha256.as_deref()).await?;
    Ok(answer(to_value(&view)?))
}

fn rotate_input(body: RotateBody) -> RotateInput {
    RotateInput {
        node_id: body.node_id,
        token_sha256: body.token_sha256,
        expected_generation: body.expected_generation,
        mutation_id: body.mutation_id,
    }
}
