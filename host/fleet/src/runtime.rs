//! The node's background loops: heartbeat, fleet refresh and the coordinator (lease +
//! placement). What runs on the placed workloads is the scheduler's and the plugins' business.

use super::lease::{Coordinator, Role};
use super::placement::{self, Workload};
use super::{Node, NodeRecord, read_nodes};
use capstan_blobs::PutMode;
use capstan_core::clock::now_ms;
use capstan_core::refusal::{Refusal, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Bucket key of the coordinator's latest placement decision ([`Assignments`]).
pub const ASSIGNMENTS_KEY: &str = "_capstan/coordinator/assignments.json";

/// Where the coordinator placed each workload, stamped with the fence it decided under.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Assignments {
    /// The coordinator lease's fence the decision was made under.
    pub fence: u64,
    /// The fingerprint of the inputs it was decided from ([`placement::fingerprint`]).
    pub fingerprint: String,
    /// When it was decided, in milliseconds since the Unix epoch.
    pub decided_at: u64,
    /// Workload id → the ids of the nodes it runs on.
    pub placements: BTreeMap<String, Vec<String>>,
}

/// This node's part in the fleet at run time: its record, its side of the coordinator lease,
/// its view of the fleet's records, and the workloads it places as coordinator.
pub struct Fleet {
    /// This process as a member of the fleet.
    pub node: Arc<Node>,
    /// This node's side of the coordinator lease.
    pub coordinator: Arc<Coordinator>,
    view: Mutex<Vec<NodeRecord>>,
    last_fingerprint: Mutex<Option<(u64, String)>>,
    /// Where the workloads to place come from, asked on every coordinator pass (the
    /// scheduler's host tasks, the loaded plugins).
    workload_sources: Mutex<Vec<WorkloadSource>>,
    /// One placement pass at a time: the loop's and an operator's `fleet.rebalance`.
    placing: tokio::sync::Mutex<()>,
    /// Carries coordinator-only requests to the holder (`forward`).
    pub http: reqwest::Client,
}

/// Gives workloads to place; asked on every coordinator pass.
pub type WorkloadSource = Arc<dyn Fn() -> Vec<Workload> + Send + Sync>;

impl Fleet {
    /// The fleet runtime for `node`, with a coordinator using the node's lease TTL. Nothing runs
    /// until [`spawn`](Self::spawn).
    pub fn new(node: Arc<Node>) -> Arc<Self> {
        let coordinator = Arc::new(Coordinator::new(node.blobs.clone(), &node.identity.id, node.timing.lease_ttl));
        Arc::new(Fleet {
            node,
            coordinator,
            view: Mutex::new(Vec::new()),
            last_fingerprint: Mutex::new(None),
            workload_sources: Mutex::new(Vec::new()),
            placing: tokio::sync::Mutex::new(()),
            http: reqwest::Client::builder()
                .timeout(super::forward::FORWARD_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .build()
                .unwrap_or_default(),
        })
    }

    /// Place these workloads too (the scheduler and the plugins plug in here).
    pub fn add_workload_source(&self, source: WorkloadSource) {
        self.workload_sources.lock().expect("workload sources").push(source);
    }

    /// Whether the coordinator's last placement put `workload` on this node.
    pub async fn assigned_here(&self, workload: &str) -> bool {
        self.my_tasks().await.iter().any(|w| w == workload)
    }

    /// The fleet's records as last read.
    pub fn view(&self) -> Vec<NodeRecord> {
        self.view.lock().expect("fleet view").clone()
    }

    async fn refresh(&self) -> Result<()> {
        let nodes = read_nodes(&self.node.blobs).await?;
        *self.view.lock().expect("fleet view") = nodes;
        Ok(())
    }

    /// One coordinator iteration: lease, then (as holder) placement unless nothing moved.
    async fn coordinate(&self) -> Result<()> {
        let Role::Holder { fence } = self.coordinator.tick().await else {
            *self.last_fingerprint.lock().expect("fingerprint") = None;
            return Ok(());
        };
        self.place(fence, false).await.map(|_| ())
    }

    /// Decide placements now, as the holder (`fleet.rebalance`): the pass runs even if
    /// nothing moved, and answers the placements in force with the fence they carry.
    pub async fn rebalance(&self) -> Result<Assignments> {
        let fence = self
            .coordinator
            .fence()
            .ok_or_else(|| Refusal::new("coordinator-unavailable", "this node no longer holds the coordinator lease; retry").retryable())?;
        self.place(fence, true).await
    }

    /// Place every workload on the live nodes under `fence` and write the decision, stamped.
    /// Without `force`, a pass whose inputs have not moved since the last one under the
    /// same fence writes nothing.
    async fn place(&self, fence: u64, force: bool) -> Result<Assignments> {
        let _one_at_a_time = self.placing.lock().await;
        let now = now_ms();
        let live: Vec<NodeRecord> = self.view().into_iter().filter(|n| n.live(now, &self.node.timing)).collect();
        let sources = self.workload_sources.lock().expect("workload sources").clone();
        let mut workloads: Vec<Workload> = sources.iter().flat_map(|source| source()).collect();
        workloads.sort_by(|a, b| a.id.cmp(&b.id));
        let fingerprint = placement::fingerprint(&workloads, &live);
        let decided =
            Assignments { fence, fingerprint: fingerprint.clone(), decided_at: now, placements: placement::place(&workloads, &live) };
        // a new holder compares against nothing: the previous one may have decided unseen things
        let unmoved = self.last_fingerprint.lock().expect("fingerprint").as_ref() == Some(&(fence, fingerprint.clone()));
        if unmoved && !force {
            return Ok(decided);
        }
        let blobs = &self.node.blobs;
        let mode = match blobs.get_bytes(ASSIGNMENTS_KEY).await? {
            Some((meta, bytes)) => {
                let current: Option<Assignments> = serde_json::from_slice(&bytes).ok();
                if let Some(current) = current {
                    if current.fence > fence {
                        return Err(Refusal::new("fence-stale", "a newer coordinator has already decided placements").retryable());
                    }
                    if current.placements == decided.placements && current.fence == fence {
                        *self.last_fingerprint.lock().expect("fingerprint") = Some((fence, fingerprint));
                        return Ok(current);
                    }
                }
                PutMode::IfMatch(meta.etag)
            }
            None => PutMode::CreateOnly,
        };
        // stamped: applied only while this fence still holds the lease
        super::lease::check_fence(blobs, fence).await?;
        blobs.put_bytes(ASSIGNMENTS_KEY, serde_json::to_vec_pretty(&decided).map_err(Refusal::internal)?, mode).await?;
        tracing::info!(fence, workloads = workloads.len(), live = live.len(), "placements decided");
        *self.last_fingerprint.lock().expect("fingerprint") = Some((fence, fingerprint));
        Ok(decided)
    }

    async fn my_tasks(&self) -> Vec<String> {
        match self.node.blobs.get_bytes(ASSIGNMENTS_KEY).await {
            Ok(Some((_, bytes))) => serde_json::from_slice::<Assignments>(&bytes)
                .map(|a| a.placements.into_iter().filter(|(_, nodes)| nodes.contains(&self.node.identity.id)).map(|(w, _)| w).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// Start the loops; they stop when `stop` turns true.
    pub fn spawn(self: &Arc<Self>, stop: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let timing = self.node.timing;
        let mut handles = Vec::new();
        let me = self.clone();
        handles.push(every(timing.heartbeat, stop.clone(), move || {
            let me = me.clone();
            async move {
                if let Err(e) = me.node.beat().await {
                    tracing::warn!(code = %e.code, "heartbeat not written: {}", e.message);
                }
            }
        }));
        let me = self.clone();
        handles.push(every(timing.refresh, stop.clone(), move || {
            let me = me.clone();
            async move {
                if let Err(e) = me.refresh().await {
                    tracing::warn!(code = %e.code, "fleet records not read: {}", e.message);
                }
            }
        }));
        let me = self.clone();
        handles.push(every(self.coordinator.interval(), stop.clone(), move || {
            let me = me.clone();
            async move {
                if let Err(e) = me.coordinate().await {
                    tracing::warn!(code = %e.code, "coordinator pass did not finish: {}", e.message);
                }
            }
        }));
        handles
    }

    /// Leaving: mark draining first, then give the lease up.
    pub async fn drain(&self) {
        self.node.drain().await;
        self.coordinator.release().await;
    }
}

/// Run `work` now and then every `period` until `stop` turns true.
pub fn every<F, Fut>(period: Duration, mut stop: watch::Receiver<bool>, work: F) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => work().await,
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
        }
    })
}
