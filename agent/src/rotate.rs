//! `capstan-agent rotate`: replace the node token with fresh material.
//!
//! The new material is kept durably as `pendingToken` (with its `mutationId`) before Capstan is
//! asked, so a lost answer can be asked for again with the same material and id: the host then
//! replays the answer it recorded. If the rotation did commit, the old bearer no longer
//! authenticates; the retry then presents the pending token itself, which does. Only after
//! Capstan confirms does the pending token become the token. A refusal (nothing committed)
//! drops the pending material.

use crate::state::{Credential, StateDir};
use crate::token::Token;
use crate::wire::{Client, CredentialAnswer, PROTOCOL, Retry, RotateRequest, WireError};
use capstan_core::Refusal;

/// Rotate; answers the credential now in use.
pub async fn rotate(state: &StateDir, retry: Retry) -> Result<Credential, Refusal> {
    let (credential, pending, mutation_id) = {
        let lock = state.lock()?;
        let mut credential = state.read_credential()?;
        match (&credential.pending_token, &credential.pending_mutation_id) {
            (Some(pending), Some(id)) => {
                tracing::info!(mutation_id = %id, "finishing the rotation asked for before");
                let (pending, id) = (pending.clone(), id.clone());
                (credential, pending, id)
            }
            _ => {
                let pending = Token::draw()?;
                let id = capstan_core::ids::new_id("rot");
                credential.pending_token = Some(pending.clone());
                credential.pending_mutation_id = Some(id.clone());
                state.replace_credential(&credential, &lock)?;
                (credential, pending, id)
            }
        }
    };
    let client = Client::new(&credential.origin)?;
    let request = RotateRequest {
        protocol: PROTOCOL,
        node_id: &credential.node_id,
        token_sha256: pending.sha256_hex(),
        expected_generation: credential.credential_generation,
        mutation_id: &mutation_id,
    };
    let mut answer = client.post_retrying::<_, CredentialAnswer>("/agent/v1/rotate", &request, Some(&credential.token), retry).await;
    if matches!(&answer, Err(e) if e.code() == Some("node-unauthorized")) {
        // the rotation may have committed with its answer lost: the pending token is then the
        // credential, and the same request under it replays the recorded answer
        answer = client.post_retrying("/agent/v1/rotate", &request, Some(&pending), retry).await;
    }
    let lock = state.lock()?;
    let mut now = state.read_credential()?;
    match answer {
        Ok(answer) => {
            if now.token == pending {
                // a running agent finished it meanwhile
                return Ok(now);
            }
            if now.pending_token.as_ref() != Some(&pending) {
                return Err(Refusal::new("state-changed", "the credential file changed while rotating; run capstan-agent rotate again"));
            }
            now.token = pending;
            now.credential_generation = answer.generation;
            now.pending_token = None;
            now.pending_mutation_id = None;
            state.replace_credential(&now, &lock)?;
            Ok(now)
        }
        Err(WireError::Unreachable(why)) => Err(Refusal::new(
            "capstan-unreachable",
            format!("Capstan could not be reached ({why}); the new material is kept: run capstan-agent rotate again to finish"),
        )
        .retryable()),
        Err(refused) => {
            // refused, so nothing committed: the pending material is dropped
            if now.pending_token.as_ref() == Some(&pending) {
                now.pending_token = None;
                now.pending_mutation_id = None;
                state.replace_credential(&now, &lock)?;
            }
            Err(refused.into_refusal())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::{Mock, enrolled};
    use serde_json::json;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    const RETRY: Retry = Retry { attempts: 3, first_pause: Duration::from_millis(10) };

    fn metadata(generation: u64) -> serde_json::Value {
        json!({"protocol": PROTOCOL, "nodeId": "node_1", "generation": generation, "sessionEpoch": 1, "state": "active", "rotatedAt": 1})
    }

    #[tokio::test]
    async fn rotates_to_fresh_material_under_the_current_bearer() {
        let mock = Mock::start(|_, _| Some((200, metadata(2)))).await;
        let (_root, dir, before) = enrolled(&mock.origin);
        let after = rotate(&dir, RETRY).await.unwrap();
        assert_ne!(after.token, before.token);
        assert_eq!((after.credential_generation, after.pending_token.is_none()), (2, true));
        assert_eq!(dir.read_credential().unwrap(), after);
        let sent = &mock.requests()[0];
        assert_eq!(sent.path, "/agent/v1/rotate");
        assert_eq!(sent.headers["authorization"], before.token.bearer().as_str());
        assert_eq!(sent.body["tokenSha256"], after.token.sha256_hex());
        assert_eq!(sent.body["expectedGeneration"], 1);
        assert!(sent.body["mutationId"].as_str().unwrap().starts_with("rot_"));
    }

    #[tokio::test]
    async fn a_lost_answer_is_finished_with_the_same_material_and_id() {
        // the first rotation commits but its answer is lost (every attempt), so the old bearer
        // stops working; the next `rotate` reuses the pending material and mutationId
        let committed: Arc<Mutex<Option<String>>> = Arc::default();
        let seen = committed.clone();
        let mock = Mock::start(move |request, _| {
            let mut committed = seen.lock().unwrap();
            let bearer = request.headers.get("authorization").cloned().unwrap_or_default();
            match committed.as_ref() {
                None => {
                    *committed = Some(request.body["tokenSha256"].as_str().unwrap().to_string());
                    None // committed, answer lost
                }
                Some(hash) if bearer.len() > 7 && crate::token::Token::parse(&bearer[7..]).unwrap().sha256_hex() == *hash => {
                    Some((200, metadata(2))) // the replay under the new token
                }
                Some(_) => Some((401, json!({"error": {"code": "node-unauthorized", "message": "node credential refused"}}))),
            }
        })
        .await;
        let (_root, dir, before) = enrolled(&mock.origin);
        let first = rotate(&dir, Retry { attempts: 1, ..RETRY }).await.unwrap_err();
        assert_eq!(first.code, "capstan-unreachable");
        let kept = dir.read_credential().unwrap();
        assert_eq!(kept.token, before.token, "not switched before Capstan confirms");
        let pending = kept.pending_token.clone().unwrap();

        let after = rotate(&dir, RETRY).await.unwrap();
        assert_eq!(after.token, pending);
        assert_eq!(after.credential_generation, 2);
        let bodies: Vec<_> = mock.requests().into_iter().map(|r| r.body).collect();
        assert!(bodies.len() >= 3);
        assert!(bodies.iter().all(|b| *b == bodies[0]), "the same request each time: {bodies:?}");
    }

    #[tokio::test]
    async fn a_refusal_drops_the_pending_material_and_names_the_code() {
        let mock = Mock::start(|_, _| Some((409, json!({"error": {"code": "conflict", "message": "the generation moved"}})))).await;
        let (_root, dir, before) = enrolled(&mock.origin);
        let err = rotate(&dir, RETRY).await.unwrap_err();
        assert_eq!(err.code, "conflict");
        let now = dir.read_credential().unwrap();
        assert_eq!(now, before, "the token is kept and nothing is pending");
    }
}
