//! Coordinator-only requests: a method marked `coordinator_only` is answered by the node
//! holding the coordinator lease. Any other node forwards the request there unchanged (the
//! caller's own credentials; the holder authenticates and authorizes it again) and relays
//! the answer, so a client may call any node.
//!
//! The forwarded request carries the caller's token, so where it goes is checked first: the
//! holder's record must carry a valid signature by the key its id was claimed with (a record
//! someone rewrote to point elsewhere is not followed), and forwarding goes over plain HTTP,
//! so it happens only on a private network (`lan`, `wireguard`). When this node or the holder
//! is on `public`, the request is refused `coordinator-elsewhere` (421) naming the holder, and
//! the client calls it directly: nodes have no TLS between them (mutual TLS on the node keys
//! would need every node to serve a second, node-only listener; until then the fleet's own
//! traffic stays on private networks).

use super::runtime::Fleet;
use super::{claimed_key, lease, node_key, signed};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use serde_json::json;
use std::time::Duration;

/// Set on a forwarded request: the node that forwarded it. A node receiving it that does
/// not hold the lease refuses rather than forwarding again (the lease moved meanwhile).
pub const FORWARDED_BY: &str = "x-capstan-forwarded-by";
/// Set on every answer of a coordinator-only method: the node that answered.
pub const ANSWERED_BY: &str = "x-capstan-answered-by";

/// How long a forwarded request may take end to end.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a coordinator-only request goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// This node holds the lease: answer here.
    Here,
    /// Forward to this node at this base URL.
    Holder {
        /// The lease holder's node id.
        node_id: String,
        /// The holder's API base URL, e.g. `http://10.0.0.7:8080`.
        base_url: String,
    },
}

fn unavailable(message: impl Into<String>) -> Refusal {
    Refusal::new("coordinator-unavailable", message).retryable()
}

/// Decide where a coordinator-only request is answered. `forwarded` is set when the request
/// already came from another node.
pub async fn route(fleet: &Fleet, forwarded: bool) -> Result<Route> {
    if fleet.coordinator.fence().is_some() {
        return Ok(Route::Here);
    }
    if forwarded {
        return Err(unavailable("the coordinator lease moved while the request was forwarded; retry"));
    }
    let blobs = &fleet.node.blobs;
    let lease = lease::read_lease(blobs).await?.filter(|l| l.expires_at > now_ms());
    let Some(lease) = lease else {
        return Err(unavailable("no node holds the coordinator lease right now; retry shortly"));
    };
    if lease.holder == fleet.node.identity.id {
        // a record this node no longer stands behind (a previous process, a lost renewal)
        return Err(unavailable("the coordinator lease is changing hands; retry shortly"));
    }
    let holder = lease.holder.as_str();
    match peer(fleet, holder).await? {
        Ok(base_url) => Ok(Route::Holder { node_id: lease.holder.clone(), base_url }),
        Err(Unfollowable::NotAnswering) => Err(unavailable(format!(
            "the coordinator {holder} is not answering; retry once the lease has moved"
        ))
        .with_data(json!({ "holder": holder }))),
        Err(Unfollowable::Untrusted(why)) => {
            tracing::warn!(holder = %holder, code = %why.code, "not forwarding to the coordinator: {}", why.message);
            Err(unavailable(format!("the coordinator {holder}'s record cannot be trusted ({}); retry once the lease has moved", why.code))
                .with_data(json!({ "holder": holder, "cause": why.code })))
        }
        Err(Unfollowable::Public { address }) => Err(Refusal::new(
            "coordinator-elsewhere",
            format!(
                "this request is answered by the coordinator {holder} ({address}); nodes on a public network do not forward a caller's credentials over plain HTTP: call it there"
            ),
        )
        .with_data(json!({ "holder": holder, "address": address }))),
    }
}

/// Why another fleet node cannot be reached with a request.
#[derive(Debug)]
pub enum Unfollowable {
    /// It has no record, or its record says it is not answering.
    NotAnswering,
    /// Its record is not signed by the key its id was claimed with.
    Untrusted(Refusal),
    /// It or this node is on a public network: nothing is forwarded over plain HTTP there.
    Public {
        /// Where the node says it answers.
        address: String,
    },
}

/// The API base URL of the fleet node `node_id`, when a request may be carried there: its
/// record must be signed by the key its id was claimed with (a record someone rewrote to point
/// elsewhere is not followed), it must be answering, and both nodes must be on a private
/// network (`lan`, `wireguard`).
pub async fn peer(fleet: &Fleet, node_id: &str) -> Result<std::result::Result<String, Unfollowable>> {
    let blobs = &fleet.node.blobs;
    let key = node_key(node_id);
    let Some((_, bytes)) = blobs.get_bytes(&key).await? else { return Ok(Err(Unfollowable::NotAnswering)) };
    let record = match signed::verify(&key, &bytes) {
        Ok(record) => record,
        Err(why) => return Ok(Err(Unfollowable::Untrusted(why))),
    };
    if claimed_key(blobs, &record.node_id).await?.as_deref() != Some(record.public_key.as_str()) || record.node_id != node_id {
        let why = Refusal::new("fleet-record-signature-invalid", "the record's key is not the one its id was claimed with");
        return Ok(Err(Unfollowable::Untrusted(why)));
    }
    if !record.answering(now_ms(), &fleet.node.timing) {
        return Ok(Err(Unfollowable::NotAnswering));
    }
    let address = base_url(&record.addresses.internal, record.addresses.api_port);
    if fleet.node.network.as_deref() == Some("public") || record.network.as_deref() == Some("public") {
        return Ok(Err(Unfollowable::Public { address }));
    }
    Ok(Ok(address))
}

fn base_url(host: &str, port: u16) -> String {
    if host.contains(':') { format!("http://[{host}]:{port}") } else { format!("http://{host}:{port}") }
}

/// The header that carries a request's id (the same on every node's log lines).
pub const REQUEST_ID: &str = "x-request-id";

/// The fleet decides where the registry's coordinator-only calls are answered, and carries them
/// to the lease holder over HTTP with the caller's own bearer (`capstan_rpc::door`).
#[async_trait::async_trait]
impl capstan_rpc::door::Coordination for Fleet {
    fn node_id(&self) -> &str {
        &self.node.identity.id
    }

    async fn forward(&self, call: capstan_rpc::door::Forward<'_>, forwarded: bool) -> Result<Option<capstan_rpc::door::Forwarded>> {
        let (node_id, base_url) = match route(self, forwarded).await? {
            Route::Here => return Ok(None),
            Route::Holder { node_id, base_url } => (node_id, base_url),
        };
        let mut outgoing = self
            .http
            .post(format!("{base_url}/api/v1/{}", call.method))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(REQUEST_ID, call.request_id)
            .header(FORWARDED_BY, &self.node.identity.id)
            .body(call.body.to_vec());
        if let Some(bearer) = call.bearer {
            outgoing = outgoing.header(reqwest::header::AUTHORIZATION, format!("Bearer {bearer}"));
        }
        tracing::info!(method = %call.method, holder = %node_id, "forwarding a coordinator-only request");
        let reply = outgoing.send().await.map_err(|e| unreachable(&node_id, e))?;
        let status = reply.status().as_u16();
        let answered_by = reply.headers().get(ANSWERED_BY).and_then(|v| v.to_str().ok()).map(str::to_string);
        let body = reply.bytes().await.map_err(|e| unreachable(&node_id, e))?.to_vec();
        Ok(Some(capstan_rpc::door::Forwarded { status, answered_by, body }))
    }
}

/// The refusal for a holder that could not be reached or answered with something unreadable.
pub fn unreachable(holder: &str, error: impl std::fmt::Display) -> Refusal {
    unavailable(format!("the coordinator {holder} could not be reached; retry shortly"))
        .with_data(json!({ "holder": holder }))
        .detail(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_are_dialled_by_address_and_port() {
        assert_eq!(base_url("127.0.0.1", 8080), "http://127.0.0.1:8080");
        assert_eq!(base_url("10.0.0.7", 443), "http://10.0.0.7:443");
        assert_eq!(base_url("fd00::7", 8080), "http://[fd00::7]:8080");
    }
}
