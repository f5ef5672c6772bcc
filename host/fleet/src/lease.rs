//! The coordinator lease: one holder among the fleet, taken and renewed by conditional writes
//! on one object. Every acquisition raises the fence; work decided as coordinator carries the
//! fence it was decided under and is refused `fence-stale` once the lease has moved.
//!
//! The holder renews every third of the TTL: one renewal may fail or come late and the lease
//! still holds; a second miss inside the TTL loses it (locally the holder stops acting as
//! coordinator when its last successful renewal is a TTL old; the others take the lease once
//! its recorded expiry has passed).

use capstan_blobs::{Blobs, PutMode};
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bucket key of the coordinator lease.
pub const LEASE_KEY: &str = "_capstan/coordinator/lease.json";

/// The coordinator lease as stored in the bucket.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRecord {
    /// The id of the node holding it.
    pub holder: String,
    /// Raised by one on every acquisition; decisions made as coordinator carry it.
    pub fence: u64,
    /// When the holder acquired it, in milliseconds since the Unix epoch.
    pub acquired_at: u64,
    /// When the holder last renewed it, in milliseconds since the Unix epoch.
    pub renewed_at: u64,
    /// When it expires unless renewed, in milliseconds since the Unix epoch.
    pub expires_at: u64,
}

/// This node's part in the coordinator lease.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// This node holds the lease.
    Holder {
        /// The fence it holds the lease under.
        fence: u64,
    },
    /// This node does not hold the lease.
    Candidate {
        /// The other node holding an unexpired lease, when known.
        holder: Option<String>,
        /// The lease's fence as last seen (0 when not known).
        fence: u64,
    },
}

struct Held {
    fence: u64,
    etag: String,
    valid_until: Instant,
}

/// This node's side of the coordinator lease: takes, renews and releases it.
pub struct Coordinator {
    blobs: Blobs,
    node_id: String,
    ttl: Duration,
    held: Mutex<Option<Held>>,
    /// Set when this node leaves: it never takes the lease again.
    leaving: std::sync::atomic::AtomicBool,
}

impl Coordinator {
    /// A coordinator for `node_id` over the lease in `blobs`, with a lease time-to-live of
    /// `ttl`. It holds nothing until a [`tick`](Self::tick) takes the lease.
    pub fn new(blobs: Blobs, node_id: &str, ttl: Duration) -> Self {
        Coordinator { blobs, node_id: node_id.into(), ttl, held: Mutex::new(None), leaving: Default::default() }
    }

    /// How often `tick` should run.
    pub fn interval(&self) -> Duration {
        self.ttl / 3
    }

    /// The fence this node holds the lease under, if it still does.
    pub fn fence(&self) -> Option<u64> {
        let held = self.held.lock().expect("lease lock");
        held.as_ref().filter(|h| h.valid_until > Instant::now()).map(|h| h.fence)
    }

    fn record(&self, fence: u64, acquired_at: u64) -> LeaseRecord {
        let now = now_ms();
        LeaseRecord { holder: self.node_id.clone(), fence, acquired_at, renewed_at: now, expires_at: now + self.ttl.as_millis() as u64 }
    }

    fn set(&self, held: Option<Held>) {
        *self.held.lock().expect("lease lock") = held;
    }

    async fn write(&self, record: &LeaseRecord, mode: PutMode) -> Result<String> {
        let bytes = serde_json::to_vec(record).map_err(Refusal::internal)?;
        Ok(self.blobs.put_bytes(LEASE_KEY, bytes, mode).await?.etag)
    }

    fn local_role(&self, holder: Option<String>, fence: u64) -> Role {
        match self.fence() {
            Some(fence) => Role::Holder { fence },
            None => Role::Candidate { holder, fence },
        }
    }

    /// One iteration: take the lease when free or expired, renew it when held. Never fails:
    /// an unreachable bucket leaves the role as it was until the local validity runs out.
    pub async fn tick(&self) -> Role {
        match self.try_tick().await {
            Ok(role) => role,
            Err(e) => {
                tracing::warn!(code = %e.code, "coordinator lease not renewed this time: {}", e.message);
                self.local_role(None, 0)
            }
        }
    }

    async fn try_tick(&self) -> Result<Role> {
        if self.leaving.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(Role::Candidate { holder: None, fence: 0 });
        }
        // validity is counted from before the write, as the recorded expiry is
        let started = Instant::now();
        let current = self.blobs.get_bytes(LEASE_KEY).await?;
        let Some((meta, bytes)) = current else {
            let record = self.record(1, now_ms());
            return match self.write(&record, PutMode::CreateOnly).await {
                Ok(etag) => Ok(self.acquired(record, etag, started)),
                Err(e) if e.is("exists") => Ok(self.local_role(None, 0)),
                Err(e) => Err(e),
            };
        };
        let lease: LeaseRecord = serde_json::from_slice(&bytes)
            .map_err(|e| Refusal::new("fleet-record-invalid", "the coordinator lease is not a valid record").detail(e))?;
        let held_fence = self.held.lock().expect("lease lock").as_ref().map(|h| (h.fence, h.etag.clone()));
        if lease.holder == self.node_id && held_fence.as_ref().is_some_and(|(f, etag)| *f == lease.fence && *etag == meta.etag) {
            let record = self.record(lease.fence, lease.acquired_at);
            return match self.write(&record, PutMode::IfMatch(meta.etag)).await {
                Ok(etag) => {
                    self.set(Some(Held { fence: record.fence, etag, valid_until: started + self.ttl }));
                    Ok(Role::Holder { fence: record.fence })
                }
                Err(e) if e.is("conflict") => {
                    self.set(None);
                    tracing::warn!(fence = lease.fence, "lost the coordinator lease");
                    Ok(Role::Candidate { holder: None, fence: lease.fence })
                }
                Err(e) => Err(e),
            };
        }
        // Someone else's record: take it only once expired. Our own record from a previous
        // process is re-acquired at once, under a new fence, so nothing the old process
        // decided can be applied as this one's.
        let expired = lease.expires_at <= now_ms();
        if !expired && lease.holder != self.node_id {
            self.set(None);
            return Ok(Role::Candidate { holder: Some(lease.holder), fence: lease.fence });
        }
        let record = self.record(lease.fence + 1, now_ms());
        match self.write(&record, PutMode::IfMatch(meta.etag)).await {
            Ok(etag) => Ok(self.acquired(record, etag, started)),
            Err(e) if e.is("conflict") => {
                self.set(None);
                Ok(Role::Candidate { holder: None, fence: lease.fence })
            }
            Err(e) => Err(e),
        }
    }

    fn acquired(&self, record: LeaseRecord, etag: String, started: Instant) -> Role {
        // Crash point `lease:taken`: the bucket names this node holder under the new fence,
        // and the node dies before it acts on it.
        capstan_core::crash_point("lease:taken");
        tracing::info!(fence = record.fence, "took the coordinator lease");
        self.set(Some(Held { fence: record.fence, etag, valid_until: started + self.ttl }));
        Role::Holder { fence: record.fence }
    }

    /// Give the lease up (on draining), so another node need not wait for it to expire.
    pub async fn release(&self) {
        self.leaving.store(true, std::sync::atomic::Ordering::SeqCst);
        let held = self.held.lock().expect("lease lock").take();
        let Some(held) = held else { return };
        match self.blobs.get_bytes(LEASE_KEY).await {
            Ok(Some((meta, bytes))) if meta.etag == held.etag => {
                if let Ok(mut lease) = serde_json::from_slice::<LeaseRecord>(&bytes) {
                    lease.expires_at = now_ms();
                    let _ = self.write(&lease, PutMode::IfMatch(meta.etag)).await;
                }
            }
            _ => {}
        }
    }
}

/// Refuse to apply a decision stamped with `fence` unless that fence still holds the lease.
pub async fn check_fence(blobs: &Blobs, fence: u64) -> Result<()> {
    let current = match blobs.get_bytes(LEASE_KEY).await? {
        Some((_, bytes)) => serde_json::from_slice::<LeaseRecord>(&bytes).ok(),
        None => None,
    };
    match current {
        Some(lease) if lease.fence == fence && lease.expires_at > now_ms() => Ok(()),
        // retryable: asked again, the request reaches the lease's new holder
        other => Err(Refusal::new("fence-stale", "this decision was made under a coordinator lease that has since moved")
            .retryable()
            .with_data(json!({ "fence": fence, "currentFence": other.map(|l| l.fence) }))),
    }
}

/// The coordinator lease as recorded, expired or not; `None` when absent or unreadable.
pub async fn read_lease(blobs: &Blobs) -> Result<Option<LeaseRecord>> {
    match blobs.get_bytes(LEASE_KEY).await? {
        Some((_, bytes)) => Ok(serde_json::from_slice(&bytes).ok()),
        None => Ok(None),
    }
}
