//! The node credential authority (`node_credentials`), kept apart from the node records: a
//! node's token is 32 random bytes the node drew itself; Capstan keeps only its SHA-256, a
//! generation every change advances, and a session epoch. `nodes.getCredential` answers
//! metadata only; `nodes.rotateCredential` accepts the SHA-256 of new material with the exact
//! generation read and a `mutationId` whose exact replay answers the recorded answer;
//! `nodes.revokeCredential` ends it for good.

use super::{CLUSTER_NODES, Context, NODE_CREDENTIALS, emit, is_node_id, is_sha256_hex, node_missing, same, sha256_hex};
use crate::records::{Node, NodeState, require_node, write_node};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::{Entity, parse, to_value};
use capstan_rpc::{Access, Call, Registry};
use capstan_store::Tx;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The most recorded mutation answers a credential keeps (the oldest go first).
pub const MAX_RECORDED_MUTATIONS: usize = 32;

/// A node's credential as stored (never answered: it carries the token's hash).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credential {
    /// Advances with every rotation and the revocation.
    pub generation: u64,
    /// Advances with every new token (and the revocation).
    pub session_epoch: u64,
    /// SHA-256 of the current token, lowercase hex.
    pub token_sha256: String,
    /// `active` or `revoked`.
    pub state: CredentialState,
    /// When the current token took effect (milliseconds since the epoch).
    pub rotated_at: u64,
    /// When it was revoked (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<u64>,
    /// The answers of the mutations made with a `mutationId`, by id:
    /// `{requestSha256, answer, at}`.
    #[serde(default)]
    pub mutations: Map<String, Value>,
}

/// A credential's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum CredentialState {
    /// It authenticates its node.
    Active,
    /// It authenticates nothing, for good.
    Revoked,
}

/// A credential's metadata, as every method answers it (never the hash).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialView {
    /// The node it authenticates.
    pub node_id: String,
    /// Its generation.
    pub generation: u64,
    /// Its session epoch.
    pub session_epoch: u64,
    /// `active` or `revoked`.
    pub state: CredentialState,
    /// When the current token took effect (milliseconds since the epoch).
    pub rotated_at: u64,
    /// When it was revoked (milliseconds since the epoch); null while active.
    pub revoked_at: Option<u64>,
}

impl Credential {
    /// A new credential (generation 1) for the token whose SHA-256 is `token_sha256`.
    pub fn new(token_sha256: &str, now: u64) -> Credential {
        Credential {
            generation: 1,
            session_epoch: 1,
            token_sha256: token_sha256.to_string(),
            state: CredentialState::Active,
            rotated_at: now,
            revoked_at: None,
            mutations: Map::new(),
        }
    }

    /// Its metadata.
    pub fn view(&self, node_id: &str) -> CredentialView {
        CredentialView {
            node_id: node_id.to_string(),
            generation: self.generation,
            session_epoch: self.session_epoch,
            state: self.state,
            rotated_at: self.rotated_at,
            revoked_at: self.revoked_at,
        }
    }
}

/// The one answer for an unknown node, a wrong token and a revoked credential (HTTP 401).
pub fn unauthorized() -> Refusal {
    Refusal::new("node-unauthorized", "the node id and token do not authenticate a node")
}

/// A node the agent's bearer token authenticated, at the credential generation read.
#[derive(Debug, Clone)]
pub struct Authenticated {
    /// The node.
    pub node_id: String,
    /// The credential generation the token was checked against.
    pub generation: u64,
}

/// Check `node_id` and the bearer `token` (64 lowercase hex characters) against the
/// credential store: `node-unauthorized` for anything but an active credential whose hash the
/// token's SHA-256 is.
pub async fn authenticate(cx: &Context, node_id: Option<&str>, token: Option<&str>) -> Result<Authenticated> {
    let (Some(node_id), Some(token)) = (node_id, token) else { return Err(unauthorized()) };
    if !is_node_id(node_id) || !is_sha256_hex(token) {
        return Err(unauthorized());
    }
    let presented = sha256_hex(token.as_bytes());
    let found = cx.store.transact(|tx| async move { tx.get(NODE_CREDENTIALS, node_id).await }).await?;
    let credential: Credential = match found {
        Some(doc) => parse::<Credential>(&doc)?.data,
        None => return Err(unauthorized()),
    };
    if credential.state != CredentialState::Active || !same(&credential.token_sha256, &presented) {
        return Err(unauthorized());
    }
    Ok(Authenticated { node_id: node_id.to_string(), generation: credential.generation })
}

/// Inside the transaction that writes what an authenticated request carries: the credential
/// must still be active at the generation authentication read, else `conflict` (a rotation or
/// revocation raced the request) and nothing is written. The credential document is written
/// back (its revision advances), so a racing rotation conflicts with this write on every store.
pub async fn fence(tx: &Tx, who: &Authenticated) -> Result<Credential> {
    let doc = tx.get(NODE_CREDENTIALS, &who.node_id).await?.ok_or_else(unauthorized)?;
    let credential: Entity<Credential> = parse(&doc)?;
    if credential.data.state != CredentialState::Active || credential.data.generation != who.generation {
        return Err(Refusal::new("conflict", "the node's credential changed while this request ran; nothing was written")
            .with_data(json!({ "nodeId": who.node_id })));
    }
    tx.replace(NODE_CREDENTIALS, &who.node_id, credential.revision, to_value(&credential.data)?).await?;
    Ok(credential.data)
}

/// Input of `nodes.getCredential`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeIdInput {
    /// The node's id.
    pub node_id: String,
}

/// Input of `nodes.rotateCredential` (and the body of the agent's `rotate`, with `protocol`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RotateInput {
    /// The node's id.
    pub node_id: String,
    /// SHA-256 (64 lowercase hex characters) of the new token the node drew and keeps.
    pub token_sha256: String,
    /// The generation read; any other is refused `conflict`.
    pub expected_generation: u64,
    /// 1–128 of A-Z a-z 0-9 - _ . : ; the same id with the same request answers the recorded
    /// answer, with another request `mutation-reused`.
    pub mutation_id: String,
}

/// Input of `nodes.revokeCredential`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RevokeInput {
    /// The node's id.
    pub node_id: String,
    /// The generation read; any other is refused `conflict`.
    pub expected_generation: u64,
    /// 1–128 of A-Z a-z 0-9 - _ . : ; replays as for a rotation.
    pub mutation_id: String,
}

async fn require_credential(tx: &Tx, node_id: &str) -> Result<Entity<Credential>> {
    if !is_node_id(node_id) {
        return Err(node_missing(node_id));
    }
    match tx.get(NODE_CREDENTIALS, node_id).await? {
        Some(doc) => parse(&doc),
        None => Err(node_missing(node_id)),
    }
}

fn revoked(node_id: &str) -> Refusal {
    Refusal::new("credential-revoked", format!("the credential of node {node_id} is revoked for good"))
        .with_data(json!({ "nodeId": node_id }))
}

fn generation_conflict(node_id: &str, expected: u64, actual: u64) -> Refusal {
    Refusal::new("conflict", format!("the credential of node {node_id} is at generation {actual}, not {expected}: read it again"))
        .with_data(json!({ "nodeId": node_id, "expectedGeneration": expected, "generation": actual }))
}

/// The recorded answer of `mutation_id` if this exact request (`digest`) made it;
/// `mutation-reused` if another did.
fn replay(credential: &Credential, mutation_id: &str, digest: &str) -> Result<Option<CredentialView>> {
    let Some(recorded) = credential.mutations.get(mutation_id) else { return Ok(None) };
    if recorded["requestSha256"].as_str() != Some(digest) {
        return Err(Refusal::new("mutation-reused", "this mutationId was used for a different request")
            .with_data(json!({ "mutationId": mutation_id })));
    }
    serde_json::from_value(recorded["answer"].clone()).map(Some).map_err(Refusal::internal)
}

fn record(credential: &mut Credential, mutation_id: &str, digest: &str, answer: &CredentialView, now: u64) -> Result<()> {
    record_with(credential, mutation_id, digest, answer, now, None)
}

fn record_with(
    credential: &mut Credential,
    mutation_id: &str,
    digest: &str,
    answer: &CredentialView,
    now: u64,
    bearer_sha256: Option<&str>,
) -> Result<()> {
    while credential.mutations.len() >= MAX_RECORDED_MUTATIONS {
        let oldest = credential.mutations.iter().min_by_key(|(_, v)| v["at"].as_u64().unwrap_or(0)).map(|(k, _)| k.clone());
        match oldest {
            Some(key) => credential.mutations.remove(&key),
            None => break,
        };
    }
    let mut entry = json!({ "requestSha256": digest, "answer": to_value(answer)?, "at": now });
    if let Some(bearer) = bearer_sha256 {
        entry["bearerSha256"] = json!(bearer);
    }
    credential.mutations.insert(mutation_id.to_string(), entry);
    Ok(())
}

fn digest(kind: &str, request: &Value) -> String {
    sha256_hex(json!({ "kind": kind, "request": request }).to_string().as_bytes())
}

async fn set_node_generation(tx: &Tx, node_id: &str, generation: u64) -> Result<()> {
    if let Some(doc) = tx.get(CLUSTER_NODES, node_id).await? {
        let node: Entity<Node> = parse(&doc)?;
        let mut next = node.data.clone();
        next.credential_generation = generation;
        write_node(tx, node_id, node.revision, &next).await?;
    }
    Ok(())
}

fn rotate_digest(input: &RotateInput) -> String {
    digest("rotate", &json!({ "tokenSha256": input.token_sha256, "expectedGeneration": input.expected_generation }))
}

/// The answer a node's rotation recorded, for an exact replay of it presenting the token that
/// was current when it was made (the agent whose answer was lost asks again with that token,
/// which the rotation replaced): `None` when there is none to replay.
pub async fn replay_for_previous_bearer(cx: &Context, input: &RotateInput, token: &str) -> Result<Option<CredentialView>> {
    if !is_node_id(&input.node_id) || !is_sha256_hex(token) {
        return Ok(None);
    }
    let presented = sha256_hex(token.as_bytes());
    let Some(doc) = cx.store.transact(|tx| async move { tx.get(NODE_CREDENTIALS, &input.node_id).await }).await? else {
        return Ok(None);
    };
    let credential: Credential = parse::<Credential>(&doc)?.data;
    if credential.state != CredentialState::Active {
        return Ok(None);
    }
    let Some(recorded) = credential.mutations.get(&input.mutation_id) else { return Ok(None) };
    let bearer_matches = recorded["bearerSha256"].as_str().is_some_and(|b| same(b, &presented));
    if !bearer_matches || recorded["requestSha256"].as_str() != Some(rotate_digest(input).as_str()) {
        return Ok(None);
    }
    serde_json::from_value(recorded["answer"].clone()).map(Some).map_err(Refusal::internal)
}

/// Rotate in one transaction (the administrator's method and the agent's route alike):
/// replay, then the node, the credential's state and generation, then the new hash. The
/// agent's route names the SHA-256 of the bearer it presented (`bearer_sha256`), recorded so an
/// exact replay with that token still answers once the rotation replaced it.
pub async fn rotate(cx: &Context, input: &RotateInput, by: &str, bearer_sha256: Option<&str>) -> Result<CredentialView> {
    capstan_rpc::receipts::check_mutation_id(&input.mutation_id)?;
    if !is_sha256_hex(&input.token_sha256) {
        return Err(Refusal::invalid_field("tokenSha256", "tokenSha256 is the SHA-256 of the new token: 64 lowercase hex characters"));
    }
    let digest = rotate_digest(input);
    let now = cx.clock.now_ms();
    let (digest, by) = (&digest, by);
    let (answer, replayed) = cx
        .store
        .transact(|tx| async move {
            let current = require_credential(&tx, &input.node_id).await?;
            if let Some(answer) = replay(&current.data, &input.mutation_id, digest)? {
                return Ok((answer, true));
            }
            let node = require_node(&tx, &input.node_id).await?;
            if node.data.state == NodeState::Retired {
                return Err(Refusal::new("node-retired", format!("the node {} is retired", input.node_id)));
            }
            if current.data.state == CredentialState::Revoked {
                return Err(revoked(&input.node_id));
            }
            if current.data.generation != input.expected_generation {
                return Err(generation_conflict(&input.node_id, input.expected_generation, current.data.generation));
            }
            if same(&current.data.token_sha256, &input.token_sha256) {
                return Err(Refusal::invalid_field("tokenSha256", "a rotation needs new token material, not the current token"));
            }
            let mut next = current.data.clone();
            next.generation += 1;
            next.session_epoch += 1;
            next.token_sha256 = input.token_sha256.clone();
            next.rotated_at = now;
            let answer = next.view(&input.node_id);
            record_with(&mut next, &input.mutation_id, digest, &answer, now, bearer_sha256)?;
            tx.replace(NODE_CREDENTIALS, &input.node_id, current.revision, to_value(&next)?).await?;
            set_node_generation(&tx, &input.node_id, next.generation).await?;
            emit(
                &tx,
                "node.credentialRotated",
                &input.node_id,
                json!({ "nodeId": input.node_id, "generation": next.generation, "by": by }),
            )
            .await?;
            Ok((answer, false))
        })
        .await?;
    if !replayed {
        tracing::info!(node = %input.node_id, generation = answer.generation, "node credential rotated");
    }
    Ok(answer)
}

/// Revoke `credential` of `node_id` in `tx` (generation and session epoch advance), recording
/// the answer under `mutation` (`(mutationId, request digest)`) when one is named; the node
/// record is the caller's to write.
pub(crate) async fn revoke_in(
    tx: &Tx,
    node_id: &str,
    credential: Entity<Credential>,
    now: u64,
    mutation: Option<(&str, &str)>,
) -> Result<Credential> {
    let mut next = credential.data.clone();
    if next.state == CredentialState::Revoked {
        return Ok(next);
    }
    next.state = CredentialState::Revoked;
    next.generation += 1;
    next.session_epoch += 1;
    next.revoked_at = Some(now);
    if let Some((mutation_id, digest)) = mutation {
        let answer = next.view(node_id);
        record(&mut next, mutation_id, digest, &answer, now)?;
    }
    tx.replace(NODE_CREDENTIALS, node_id, credential.revision, to_value(&next)?).await?;
    Ok(next)
}

async fn revoke(cx: Context, call: Call, input: RevokeInput) -> Result<CredentialView> {
    let by = call.identity()?.user_id.clone();
    capstan_rpc::receipts::check_mutation_id(&input.mutation_id)?;
    let digest = digest("revoke", &json!({ "expectedGeneration": input.expected_generation }));
    let now = cx.clock.now_ms();
    let (input, digest, by) = (&input, &digest, &by);
    let (answer, replayed) = cx
        .store
        .transact(|tx| async move {
            let current = require_credential(&tx, &input.node_id).await?;
            if let Some(answer) = replay(&current.data, &input.mutation_id, digest)? {
                return Ok((answer, true));
            }
            if current.data.state == CredentialState::Revoked {
                return Err(revoked(&input.node_id));
            }
            if current.data.generation != input.expected_generation {
                return Err(generation_conflict(&input.node_id, input.expected_generation, current.data.generation));
            }
            let next = revoke_in(&tx, &input.node_id, current, now, Some((&input.mutation_id, digest))).await?;
            let answer = next.view(&input.node_id);
            set_node_generation(&tx, &input.node_id, next.generation).await?;
            emit(
                &tx,
                "node.credentialRevoked",
                &input.node_id,
                json!({ "nodeId": input.node_id, "generation": next.generation, "by": by }),
            )
            .await?;
            Ok((answer, false))
        })
        .await?;
    if !replayed {
        tracing::info!(node = %input.node_id, generation = answer.generation, "node credential revoked");
    }
    Ok(answer)
}

async fn get_credential(cx: Context, _: Call, input: NodeIdInput) -> Result<CredentialView> {
    let id = input.node_id.as_str();
    cx.store.transact(|tx| async move { Ok(require_credential(&tx, id).await?.data.view(id)) }).await
}

async fn rotate_method(cx: Context, call: Call, input: RotateInput) -> Result<CredentialView> {
    let by = call.identity()?.user_id.clone();
    rotate(&cx, &input, &by, None).await
}

/// Register `nodes.getCredential`, `nodes.rotateCredential`, `nodes.revokeCredential`.
pub fn register(registry: &mut Registry, cx: Context) {
    let mut registry = registry.with(cx);
    registry
        .add(
            "nodes.getCredential",
            "A node credential's metadata: generation, session epoch, state (never its hash)",
            Access::Admin,
            get_credential,
        )
        .refuses(&["node-missing"])
        .read_only();
    registry
        .add(
            "nodes.rotateCredential",
            "Activate new node-drawn token material by its SHA-256, with the exact generation read and a mutationId that replays",
            Access::Admin,
            rotate_method,
        )
        .refuses(&["node-missing", "mutation-reused", "node-retired", "credential-revoked", "conflict"]);
    registry
        .add(
            "nodes.revokeCredential",
            "Revoke a node's credential for good, with the exact generation read and a mutationId that replays",
            Access::Admin,
            revoke,
        )
        .refuses(&["node-missing", "mutation-reused", "credential-revoked", "conflict"]);
}
