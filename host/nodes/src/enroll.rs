//! Enrollment: the agent presents a jump code, its hostname and the SHA-256 of a token it drew
//! itself; one transaction consumes the unexpired code, creates the node, its credential
//! (generation 1) and the cluster's snapshot entry, and records the answer on the code, so the
//! same request again answers the same answer and creates nothing.

use super::{CLUSTER_NODES, Context, NODE_CREDENTIALS, NODE_JUMP_CODES, check_hostname, emit, is_sha256_hex, new_node_id};
use super::{propose_name, sha256_hex};
use crate::credentials::Credential;
use crate::hostnames::hostname_in_use;
use crate::jump::{find, in_use, invalid_code};
use crate::records::{Node, NodeState, snapshot};
use capstan_core::refusal::{Refusal, Result};
use capstan_inventory::to_value;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The enrollment request (the agent's `POST /agent/v1/enroll` body).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnrollRequest {
    /// `capstan-agent/1`.
    pub protocol: String,
    /// The 16-character jump code.
    pub code: String,
    /// The machine's hostname (`hostname -s`); lowercased, it must be one DNS label.
    pub hostname: String,
    /// SHA-256 (64 lowercase hex characters) of the token the agent drew and keeps.
    pub token_sha256: String,
    /// The agent's version.
    pub agent_version: String,
}

/// What an enrollment answers (without `protocol`, which the wire adds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Enrolled {
    /// The new node's id.
    pub node_id: String,
    /// Its cluster.
    pub cluster_id: String,
    /// The hostname it is recorded with.
    pub hostname: String,
    /// Its credential's generation (1).
    pub credential_generation: u64,
}

/// Enroll: judge the body (`invalid-request` naming the member, `hostname-invalid`), then one
/// transaction (`jump-code-invalid`, `hostname-in-use`).
pub async fn enroll(cx: &Context, request: &EnrollRequest) -> Result<Enrolled> {
    let agent_hostname = request.hostname.to_ascii_lowercase();
    check_hostname("hostname", &agent_hostname)?;
    if !is_sha256_hex(&request.token_sha256) {
        return Err(Refusal::invalid_field("tokenSha256", "tokenSha256 is the SHA-256 of the agent's token: 64 lowercase hex characters"));
    }
    let version = &request.agent_version;
    if version.is_empty() || version.len() > 64 || version.chars().any(char::is_control) {
        return Err(Refusal::invalid_field("agentVersion", "agentVersion is 1–64 bytes of text"));
    }
    // what makes a replay exact: the same code, hostname and token hash
    let digest = sha256_hex(json!({ "hostname": agent_hostname, "tokenSha256": request.token_sha256 }).to_string().as_bytes());
    let now = cx.clock.now_ms();
    let (digest, agent_hostname) = (&digest, &agent_hostname);
    let (enrolled, replayed) = cx
        .store
        .transact(|tx| async move {
            let code = find(&tx, &request.code).await?.ok_or_else(invalid_code)?;
            if code.data.used_at.is_some() {
                let recorded = code.data.enrollment.as_ref().filter(|e| e["requestSha256"].as_str() == Some(digest.as_str()));
                return match recorded {
                    Some(e) => Ok((
                        serde_json::from_value::<Enrolled>(e["answer"].clone()).map_err(capstan_core::refusal::Refusal::internal)?,
                        true,
                    )),
                    None => Err(invalid_code()),
                };
            }
            if now >= code.data.expires_at {
                return Err(invalid_code());
            }
            let cluster_id = code.data.cluster_id.clone();
            if tx.get(capstan_inventory::CLUSTERS, &cluster_id).await?.is_none() {
                return Err(invalid_code());
            }
            // the command's name is kept; the hostname is the one the script set, else the machine's own
            let name = code.data.node_name.clone().unwrap_or_else(|| propose_name(agent_hostname));
            let hostname = code.data.hostname().unwrap_or_else(|| agent_hostname.clone());
            if hostname_in_use(&tx, &cluster_id, &hostname, None, Some(&code.id), now).await? {
                return Err(in_use(&hostname, "hostname"));
            }
            let node_id = new_node_id();
            let node = Node {
                cluster_id: cluster_id.clone(),
                name,
                hostname: hostname.clone(),
                hostname_intent: None,
                state: NodeState::Active,
                enrolled_at: now,
                retired_at: None,
                last_report_at: None,
                report: None,
                credential_generation: 1,
            };
            let enrolled = Enrolled { node_id: node_id.clone(), cluster_id: cluster_id.clone(), hostname, credential_generation: 1 };
            tx.insert(CLUSTER_NODES, &node_id, to_value(&node)?).await?;
            tx.insert(NODE_CREDENTIALS, &node_id, to_value(&Credential::new(&request.token_sha256, now))?).await?;
            snapshot(&tx, &cluster_id, &node_id, Some(&node)).await?;
            let mut used = code.data.clone();
            used.used_at = Some(now);
            used.enrollment = Some(json!({ "requestSha256": digest, "answer": to_value(&enrolled)? }));
            tx.replace(NODE_JUMP_CODES, &code.id, code.revision, to_value(&used)?).await?;
            emit(
                &tx,
                "node.enrolled",
                &node_id,
                json!({ "id": node_id, "clusterId": cluster_id, "hostname": enrolled.hostname, "agentVersion": request.agent_version }),
            )
            .await?;
            Ok((enrolled, false))
        })
        .await?;
    if !replayed {
        tracing::info!(node = %enrolled.node_id, cluster = %enrolled.cluster_id, hostname = %enrolled.hostname, "node enrolled");
    }
    Ok(enrolled)
}
