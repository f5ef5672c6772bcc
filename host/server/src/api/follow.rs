//! A live tail of an attempt's logs over a socket session (`runtime.followLogs`,
//! docs/runtime.md): the first page is the call's answer, then every new page is pushed as
//! `runtime.logs {followId, page}` until the session ends or `runtime.unfollowLogs` stops it.
//!
//! Each page is read through the one door as the session's caller, exactly as `runtime.getLogs`
//! with `waitMs` reads it: the same authorization on every page (a revoked caller's follow ends
//! with `runtime.logsEnded` and the refusal), the same bounds. A follow belongs to its session:
//! its task ends with it.

use super::socket::SocketState;
use crate::refusal::Refusal;
use capstan_rpc::{Body, Caller, Identity, Invocation, Invoked};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Follows one session may hold at once.
pub const MAX_FOLLOWS: usize = 8;
/// How long one read waits for new lines before it looks again (the session may have ended).
const WAIT_MS: u64 = 10_000;

/// The follows of one session: each one's stop switch. Dropped with the session, which stops
/// every follow it held.
#[derive(Default)]
pub struct Follows {
    running: Mutex<HashMap<String, watch::Sender<()>>>,
}

/// Who a session's calls are made as: its verified identity, or its bearer judged at each call.
#[derive(Clone)]
pub struct Asker {
    pub verified: Option<Identity>,
    pub token: Option<Arc<str>>,
    pub request_id: String,
}

impl Asker {
    async fn read(&self, state: &SocketState, body: Value) -> Result<Value, Refusal> {
        let caller = match &self.verified {
            Some(identity) => Caller::Verified { identity: identity.clone(), bearer: self.token.as_deref() },
            None => Caller::Bearer(self.token.as_deref()),
        };
        let invocation = Invocation {
            method: "runtime.getLogs",
            caller,
            source: None,
            request_id: &self.request_id,
            forwarded: false,
            body: Body::Value(body),
        };
        match state.methods.invoke(invocation).await? {
            Invoked::Here { answer, .. } => answer.into_value(),
            Invoked::There(forwarded) => forwarded.into_answer()?.into_value(),
        }
    }
}

/// `runtime.followLogs`: read the first page (refused as `runtime.getLogs` refuses), then follow.
pub async fn follow(state: &SocketState, session_id: &str, follows: &Arc<Follows>, asker: Asker, body: Value) -> Result<Value, Refusal> {
    let mut input = match body {
        Value::Object(input) => input,
        _ => return Err(Refusal::new("invalid-request", "runtime.followLogs takes an object {serviceId, assignmentId, cursor?}")),
    };
    if let Some(unknown) = input.keys().find(|k| !["serviceId", "assignmentId", "cursor"].contains(&k.as_str())) {
        let shown = capstan_core::text::truncate(unknown, 100);
        return Err(Refusal::new("invalid-request", format!("unknown field {shown:?}: a follow takes serviceId, assignmentId, cursor")));
    }
    if follows.running.lock().expect("the follows are never poisoned").len() >= MAX_FOLLOWS {
        return Err(Refusal::new(
            "too-many-follows",
            format!("a session follows at most {MAX_FOLLOWS} attempts at once; unfollow one first"),
        )
        .with_data(json!({ "limit": MAX_FOLLOWS })));
    }
    let page = asker.read(state, Value::Object(input.clone())).await?;
    let follow_id = format!("flw_{}", uuid::Uuid::new_v4().simple());
    let (stop, mut stopped) = watch::channel(());
    follows.running.lock().expect("the follows are never poisoned").insert(follow_id.clone(), stop);
    input.insert("cursor".into(), page["nextCursor"].clone());
    input.insert("waitMs".into(), json!(WAIT_MS));
    let (state, session_id, id) = (state.clone(), session_id.to_string(), follow_id.clone());
    tokio::spawn(async move {
        loop {
            let read = tokio::select! {
                _ = stopped.changed() => break,
                read = asker.read(&state, Value::Object(input.clone())) => read,
            };
            let push = match read {
                Ok(page) => {
                    input.insert("cursor".into(), page["nextCursor"].clone());
                    if page["records"].as_array().is_none_or(Vec::is_empty) {
                        continue;
                    }
                    json!({ "type": "push", "topic": "runtime.logs", "body": { "followId": id, "page": page } })
                }
                Err(refusal) => {
                    let ended = json!({ "type": "push", "topic": "runtime.logsEnded", "body": { "followId": id, "error": refusal } });
                    state.hub.send(&session_id, ended.to_string());
                    break;
                }
            };
            if !state.hub.send(&session_id, push.to_string()) {
                break;
            }
        }
    });
    Ok(json!({ "followId": follow_id, "page": page }))
}

/// `runtime.unfollowLogs {followId}`: stop one of this session's follows.
pub fn unfollow(follows: &Follows, body: &Value) -> Result<Value, Refusal> {
    let id = body
        .get("followId")
        .and_then(Value::as_str)
        .ok_or_else(|| Refusal::new("invalid-request", "runtime.unfollowLogs takes {followId}"))?;
    match follows.running.lock().expect("the follows are never poisoned").remove(id) {
        Some(_) => Ok(json!({ "followId": id, "stopped": true })),
        None => Err(Refusal::new("follow-not-found", "this session has no follow by that id")),
    }
}
