//! The assignment producer: one pass makes every (service, cluster) target true. It reads a
//! target in one transaction that writes nothing, decides every slot with the pure transition
//! ([`plan`]), commits each acting slot in a transaction of its own that decides that slot
//! again, and writes the target's verdict only when it changed. A steady fleet's pass writes
//! nothing.

use super::images::{self, ImagePlan, RUNTIME_IMAGE_PLANS, is_pinned};
use super::slots::{self, Assignment, PinnedSecret, Slot, Work, WorkPort, WorkSecrets, WorkVolume, slot_id, slot_name};
use super::spec::{self, Spec};
use super::transition::{self, Around, Case, Intent, SlotState, Step};
use super::{Context, RUNTIME_SLOTS, RUNTIME_SPECS, RUNTIME_STATUS};
use capstan_core::clock::now_ms;
use capstan_core::refusal::Result;
use capstan_inventory::clusters::Phase;
use capstan_inventory::services::{Protocol, Service, ServiceState};
use capstan_inventory::{CLUSTER_NODES, Entity, SERVICES, emit, parse, to_value};
use capstan_nodes::records::{Node, NodeState};
use capstan_store::Tx;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// A target's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// `converged`, `converging`, `waiting` or `refused`.
    pub state: String,
    /// Why it waits or is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Verdict {
    fn new(state: &str, reason: Option<&str>) -> Verdict {
        Verdict { state: state.into(), reason: reason.map(str::to_string) }
    }
}

/// The stored verdict of a (service, cluster) target (`runtime_status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The service.
    pub service_id: String,
    /// The cluster.
    pub cluster_id: String,
    /// The verdict.
    pub verdict: Verdict,
    /// When it last changed (milliseconds).
    pub since: u64,
}

/// Everything one target's decision reads, read in one transaction.
#[derive(Debug, Clone)]
pub struct Target {
    /// The spec.
    pub spec: Entity<Spec>,
    /// The service (absent once removed).
    pub service: Option<Entity<Service>>,
    /// Its cluster, as this pass read it.
    pub cluster: Arc<ClusterView>,
    /// The verdict stored for it.
    pub status: Option<Entity<Status>>,
    /// The target's slots.
    pub slots: Vec<Entity<Slot>>,
    /// The secrets its replicas get, as the service's newest manifest resolves them for the
    /// spec's environment (absent when none).
    pub secrets: Option<WorkSecrets>,
    /// Capstan's registry host (`host[:port]`): an image there is pulled with a credential.
    pub registry_host: String,
    /// The organization whose service owns the repository the image names in Capstan's
    /// registry (none: the image is elsewhere, or no service owns the repository).
    pub image_organization: Option<String>,
    /// The service's image plan, when its image names a tag (`images`).
    pub image_plan: Option<ImagePlan>,
    /// Why a manager's gate holds the service's replicas (`gates`), if one does.
    pub gate: Option<String>,
}

/// One acting step of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The slot's name.
    pub slot: String,
    /// Its node.
    pub node_id: String,
    /// The case decided.
    pub case: Case,
    /// What it was decided with.
    pub desired: Option<String>,
    /// The backoff had elapsed.
    pub backoff_elapsed: bool,
    /// Another slot was replacing.
    pub other_replacing: bool,
}

/// A target's decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// What a run admits, when the desire could be built.
    pub work: Option<Work>,
    /// The acting steps.
    pub steps: Vec<Planned>,
    /// The verdict.
    pub verdict: Verdict,
}

/// The image's repository in Capstan's registry, if it is pinned there by digest (a
/// deploy-on-push service's image names its tag too: `<repository>:<tag>@<digest>`).
pub fn registry_repository(image: &str, registry_host: &str) -> Option<String> {
    let rest = image.strip_prefix(registry_host)?.strip_prefix('/')?;
    let (named, _) = rest.split_once('@')?;
    let repository = match named.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => named,
    };
    Some(repository.to_string())
}

fn build_work(target: &Target, service: &Service) -> std::result::Result<Work, &'static str> {
    // a tag runs the digest its plan resolved: every replica the same, whatever the tag does later
    let image = match (is_pinned(&service.image), &target.image_plan) {
        (true, _) => service.image.clone(),
        (false, Some(plan)) => plan.pinned(&service.image).ok_or("image-plan-missing")?,
        (false, None) => return Err("image-plan-missing"),
    };
    // the node pulls with a credential Capstan issues: only from a repository of the service's
    // own organization, as its members could pull it themselves
    if registry_repository(&image, &target.registry_host).is_some()
        && target.image_organization.as_deref() != Some(service.organization_id.as_str())
    {
        return Err("image-repository-foreign");
    }
    let spec = &target.spec.data;
    let ports = service
        .ports
        .iter()
        .map(|p| WorkPort {
            port: p.port,
            protocol: if p.protocol == Protocol::Udp { "udp" } else { "tcp" }.into(),
            public_port: p.public_port,
        })
        .collect();
    let volumes = service.volumes.iter().map(|v| WorkVolume { name: v.name.clone(), mount_path: v.mount_path.clone() }).collect();
    Ok(Work {
        image,
        environment: service.environment.clone(),
        ports,
        volumes,
        health: spec.health.clone(),
        restart: spec.restart,
        secrets: target.secrets.clone(),
    })
}

/// The slots a spec wants, by name, with their node: its replicas on each placed active node
/// it does not hold (a node keeps its slots while offline); none while the whole spec is held.
pub fn wanted_slots(spec: &Spec, cluster: &ClusterView) -> BTreeMap<String, String> {
    let mut wanted = BTreeMap::new();
    if spec.hold {
        return wanted;
    }
    for (node, _) in cluster.placed(&spec.placement) {
        if node.data.state == NodeState::Active && spec.held_nodes.binary_search(&node.id).is_err() {
            for index in 0..spec.replicas_per_node {
                wanted.insert(slot_name(&node.id, index), node.id.clone());
            }
        }
    }
    wanted
}

/// Decide a target: pure over what [`Target`] holds and `now` (milliseconds).
pub fn plan(target: &Target, now: u64) -> Plan {
    let spec = &target.spec.data;
    let service = target.service.as_ref().map(|s| &s.data);
    let cluster = &*target.cluster;
    let running_phase = matches!(cluster.phase, Ok(Phase::Pallet));
    let deleting = service.is_none_or(|s| s.state == ServiceState::Deleting);
    let wants = !spec.hold && !deleting && running_phase;
    let desired = if wants { wanted_slots(spec, cluster) } else { BTreeMap::new() };
    let built = match service {
        Some(service) if wants => Some(build_work(target, service)),
        _ => None,
    };
    let work = built.as_ref().and_then(|b| b.as_ref().ok()).cloned();
    let key = work.as_ref().map(Work::key);
    let refused: Option<&str> = match (&cluster.phase, &built) {
        (Err(reason), _) => Some(reason.as_str()),
        (_, Some(Err(reason))) => Some(reason),
        _ if wants && desired.is_empty() && spec.replicas_per_node > 0 => Some("no-eligible-node"),
        _ => None,
    };
    // a gated target decides nothing: no replica starts and none running stops (a refusal
    // outranks the wait)
    if let (None, true, Some(gate)) = (refused, wants, &target.gate) {
        return Plan { work: None, steps: Vec::new(), verdict: Verdict::new("waiting", Some(gate)) };
    }
    let by_name: BTreeMap<&str, &Entity<Slot>> = target.slots.iter().map(|s| (s.data.slot.as_str(), s)).collect();
    let names: BTreeSet<&str> = desired.keys().map(String::as_str).chain(by_name.keys().copied()).collect();
    let desire_of = |name: &str| desired.contains_key(name).then_some(key.as_deref()).flatten();
    let mut replacing = target.slots.iter().filter(|s| s.data.replacing(desire_of(&s.data.slot), now)).count();
    let mut steps = Vec::new();
    let mut waits: BTreeSet<&'static str> = BTreeSet::new();
    for name in names {
        let slot = by_name.get(name);
        // a desire that could not be built decides no run and no stop of a desired slot
        if desired.contains_key(name) && key.is_none() {
            if let Some(slot) = slot {
                let case = transition::decide(
                    &slot.data.state(),
                    Around { desired: None, backoff_elapsed: false, restarts: true, other_replacing: false },
                );
                if matches!(case, Case::Remove | Case::Settled) {
                    steps.push(planned(name, &slot.data.node_id, case, None, false, false));
                }
            }
            continue;
        }
        let state = slot.map(|s| s.data.state()).unwrap_or(SlotState::Absent);
        let this_replacing = slot.is_some_and(|s| s.data.replacing(desire_of(name), now));
        let other_replacing = replacing > usize::from(this_replacing);
        let backoff_elapsed = slot.is_some_and(|s| {
            let accepted = s.data.assignment.observation.as_ref().map_or(0, |o| o.accepted_at);
            now >= accepted.saturating_add(transition::backoff(s.data.failures).as_millis() as u64)
        });
        let restarts = spec.restart == spec::Restart::OnFailure;
        let desired_key = desire_of(name);
        let case = transition::decide(&state, Around { desired: desired_key, backoff_elapsed, restarts, other_replacing });
        match case {
            Case::Drift => replacing += 1,
            Case::FailedWaiting => {
                waits.insert("failure-backoff");
            }
            Case::FailedKept => {
                waits.insert("restart-never");
            }
            Case::ReplacementInFlight => {
                waits.insert("replacement-in-flight");
            }
            _ => {}
        }
        let node_id = slot.map(|s| s.data.node_id.clone()).or_else(|| desired.get(name).cloned()).unwrap_or_default();
        if !matches!(case.step(), Step::Wait | Step::Nothing) {
            steps.push(planned(name, &node_id, case, desired_key.map(str::to_string), backoff_elapsed, other_replacing));
        }
    }
    let verdict = if let Some(reason) = refused {
        Verdict::new("refused", Some(reason))
    } else {
        let all_ready =
            desired.keys().all(|name| by_name.get(name.as_str()).is_some_and(|s| key.as_deref().is_some_and(|k| s.data.ready_at(k))));
        // a slot this pass releases is gone once its step commits
        let released: BTreeSet<&str> = steps.iter().filter(|s| s.case == Case::Settled).map(|s| s.slot.as_str()).collect();
        let extra = by_name.keys().any(|name| !desired.contains_key(*name) && !released.contains(name));
        let waiting_offline = desired.iter().any(|(name, node)| {
            !cluster.live(node) && !by_name.get(name.as_str()).is_some_and(|s| key.as_deref().is_some_and(|k| s.data.ready_at(k)))
        });
        if all_ready && !extra {
            Verdict::new("converged", None)
        } else if let Some(wait) = waits.iter().find(|w| **w != "replacement-in-flight") {
            Verdict::new("waiting", Some(wait))
        } else if waiting_offline {
            Verdict::new("waiting", Some("node-offline"))
        } else if !running_phase && cluster.phase.is_ok() {
            Verdict::new("waiting", Some("cluster-not-running"))
        } else {
            Verdict::new("converging", None)
        }
    };
    Plan { work, steps, verdict }
}

fn planned(slot: &str, node_id: &str, case: Case, desired: Option<String>, backoff_elapsed: bool, other_replacing: bool) -> Planned {
    Planned { slot: slot.into(), node_id: node_id.into(), case, desired, backoff_elapsed, other_replacing }
}

/// A cluster as every target on it reads it in one pass: its phase and its nodes with their
/// liveness (read once per cluster and pass, not once per service).
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// The cluster's phase, or why none serves.
    pub phase: std::result::Result<Phase, String>,
    /// Its nodes, each with whether it is live.
    pub nodes: Vec<(Entity<Node>, bool)>,
    /// Where each node is in `nodes`.
    index: HashMap<String, usize>,
}

impl ClusterView {
    /// The view of a cluster in `phase` with `nodes`.
    pub fn new(phase: std::result::Result<Phase, String>, nodes: Vec<(Entity<Node>, bool)>) -> ClusterView {
        let index = nodes.iter().enumerate().map(|(i, (n, _))| (n.id.clone(), i)).collect();
        ClusterView { phase, nodes, index }
    }

    fn node(&self, id: &str) -> Option<&(Entity<Node>, bool)> {
        self.index.get(id).and_then(|&i| self.nodes.get(i)).filter(|(n, _)| n.id == id)
    }

    /// The nodes a placement names (every node, or the pinned ones the cluster holds).
    pub fn placed<'a>(&'a self, placement: &'a crate::spec::Placement) -> Box<dyn Iterator<Item = &'a (Entity<Node>, bool)> + 'a> {
        match (&placement.nodes, placement.every_node) {
            (_, true) => Box::new(self.nodes.iter()),
            (Some(pinned), false) => Box::new(pinned.iter().filter_map(|id| self.node(id))),
            (None, false) => Box::new(std::iter::empty()),
        }
    }

    /// Whether the node is live (an unknown node is not).
    pub fn live(&self, id: &str) -> bool {
        self.node(id).is_some_and(|(_, live)| *live)
    }
}

/// Read a cluster's view.
pub async fn read_cluster(tx: &Tx, cluster_id: &str) -> Result<ClusterView> {
    let phase = match spec::serving_phase(tx, cluster_id).await {
        Ok(phase) => Ok(phase),
        Err(refusal) if refusal.is("cluster-runtime-missing") || refusal.is("cluster-runtime-phase-refused") => {
            Err(refusal.code.to_string())
        }
        Err(refusal) => return Err(refusal),
    };
    let freshness = capstan_nodes::freshness_ms(tx).await?;
    let now = now_ms();
    let mut nodes = Vec::new();
    for doc in tx.find_all(CLUSTER_NODES, "by_cluster", &[json!(cluster_id)]).await? {
        let node: Entity<Node> = parse(&doc)?;
        let live = capstan_nodes::records::view(node.clone(), now, freshness).live;
        nodes.push((node, live));
    }
    Ok(ClusterView::new(phase, nodes))
}

/// Read one target in a transaction that writes nothing, on its cluster's view.
pub async fn read_target(tx: &Tx, spec: Entity<Spec>, cluster: &Arc<ClusterView>, registry_host: &str) -> Result<Target> {
    let service = match tx.get(SERVICES, &spec.data.service_id).await? {
        Some(doc) => Some(parse::<Service>(&doc)?),
        None => None,
    };
    let slots = slots::of_service_in(tx, &spec.data.service_id, &spec.data.cluster_id).await?;
    let secrets = match &service {
        Some(s) => pinned_secrets(tx, &s.id, &spec.data.secrets).await?,
        None => None,
    };
    let status = tx.get(RUNTIME_STATUS, &spec.id).await?.as_ref().map(parse).transpose()?;
    let gate = crate::gates::waiting(tx, &spec.data.service_id).await?;
    let image_plan = match service.as_ref().filter(|s| !is_pinned(&s.data.image)) {
        Some(s) => tx.get(RUNTIME_IMAGE_PLANS, &s.id).await?.as_ref().map(|doc| parse::<ImagePlan>(doc).map(|e| e.data)).transpose()?,
        None => None,
    };
    let image_organization = match service.as_ref().and_then(|s| registry_repository(&s.data.image, registry_host)) {
        Some(repository) => capstan_registry::access::service_of_in(tx, &repository).await?.map(|(_, s)| s.organization_id),
        None => None,
    };
    Ok(Target {
        spec,
        service,
        cluster: cluster.clone(),
        status,
        slots,
        secrets,
        registry_host: registry_host.to_string(),
        image_organization,
        image_plan,
        gate,
    })
}

/// The secrets of the service's newest manifest in `using`'s environment (none: `None`).
async fn pinned_secrets(tx: &Tx, service_id: &str, using: &crate::spec::SecretsUse) -> Result<Option<WorkSecrets>> {
    let number = capstan_secrets::manifests::head(tx, service_id).await?;
    if number == 0 {
        return Ok(None);
    }
    let Some(manifest) = capstan_secrets::manifests::read(tx, service_id, number).await? else { return Ok(None) };
    let Some(entries) = manifest.entries.get(&using.environment).filter(|e| !e.is_empty()) else { return Ok(None) };
    let keys: BTreeMap<String, PinnedSecret> = entries
        .iter()
        .map(|(key, r)| (key.clone(), PinnedSecret { secret_id: r.secret_id.clone(), version_id: r.version_id.clone() }))
        .collect();
    let files = using.files.iter().filter(|f| keys.contains_key(*f)).cloned().collect();
    Ok(Some(WorkSecrets { manifest: number, environment: using.environment.clone(), keys, files }))
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PassReport {
    /// Targets decided.
    pub targets: usize,
    /// Documents written (slots admitted, moved or released; verdicts changed).
    pub writes: usize,
    /// Steps that found their slot moved and were left to the next pass.
    pub conflicts: usize,
}

/// Decide and act on every target (the coordinator's pass).
pub async fn pass(cx: &Context) -> Result<PassReport> {
    let mut report = PassReport::default();
    let mut cursor: Option<String> = None;
    let mut clusters: BTreeMap<String, Arc<ClusterView>> = BTreeMap::new();
    loop {
        let page = cx.store.transact(|tx| {
            let cursor = cursor.clone();
            async move { tx.scan(RUNTIME_SPECS, cursor.as_deref(), 256).await }
        });
        let page = page.await?;
        for doc in &page.documents {
            let spec: Entity<Spec> = parse(doc)?;
            let cluster_id = spec.data.cluster_id.clone();
            if !clusters.contains_key(&cluster_id) {
                let view = cx.store.transact(|tx| {
                    let cluster_id = cluster_id.clone();
                    async move { read_cluster(&tx, &cluster_id).await }
                });
                clusters.insert(cluster_id.clone(), Arc::new(view.await?));
            }
            match target_pass(cx, spec, &clusters[&cluster_id]).await {
                Ok(done) => {
                    report.targets += 1;
                    report.writes += done.writes;
                    report.conflicts += done.conflicts;
                }
                Err(refusal) => {
                    tracing::warn!(spec = %doc.id, code = %refusal.code, "runtime pass of a target failed: {}", refusal.message)
                }
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(report),
        }
    }
}

/// Decide and act on one target.
pub async fn target_pass(cx: &Context, spec: Entity<Spec>, cluster: &Arc<ClusterView>) -> Result<PassReport> {
    let host = cx.registry_host.clone();
    let mut target = cx.store.transact(|tx| read_target_tx(tx, spec.clone(), cluster.clone(), host.clone())).await?;
    // a service on its way out asks no registry anything
    let planning = target.service.as_ref().filter(|s| s.data.state != ServiceState::Deleting);
    if let Some(service) = planning.filter(|s| images::due(&s.data.image, target.image_plan.as_ref(), now_ms())) {
        target.image_plan = Some(images::settle(cx, &service.id, &service.data.image, target.image_plan.as_ref()).await?);
    }
    let plan = plan(&target, now_ms());
    let mut report = PassReport { targets: 1, ..PassReport::default() };
    for step in &plan.steps {
        match commit(cx, &target, plan.work.as_ref(), step).await {
            Ok(true) => report.writes += 1,
            Ok(false) => report.conflicts += 1,
            Err(refusal) => {
                tracing::warn!(slot = %step.slot, case = step.case.name(), code = %refusal.code, "a runtime step failed: {}", refusal.message)
            }
        }
    }
    if !plan.steps.is_empty() {
        cx.delivery_wake.notify_one();
    }
    if write_verdict(cx, &target.spec.data, target.status.as_ref(), &plan.verdict).await? {
        report.writes += 1;
    }
    if target.service.as_ref().is_none_or(|s| s.data.state == ServiceState::Deleting) && target.slots.is_empty() && plan.steps.is_empty() {
        report.writes += finish_deleted(cx, &target.spec).await?;
    }
    Ok(report)
}

async fn read_target_tx(tx: Tx, spec: Entity<Spec>, cluster: Arc<ClusterView>, host: String) -> Result<Target> {
    read_target(&tx, spec, &cluster, &host).await
}

/// Commit one step after deciding its slot again on what is stored now; `false` when the slot,
/// the spec or the service moved under the pass (the next pass decides again).
async fn commit(cx: &Context, target: &Target, work: Option<&Work>, step: &Planned) -> Result<bool> {
    let spec = &target.spec;
    let id = slot_id(&spec.data.service_id, &step.slot);
    let repository = work.and_then(|w| registry_repository(&w.image, &target.registry_host));
    let service_revision = target.service.as_ref().map(|s| s.revision);
    let committed = cx
        .store
        .transact(|tx| {
            let (id, repository) = (id.clone(), repository.clone());
            async move {
                // the spec and the service the plan read must still stand
                let spec_now = tx.get(RUNTIME_SPECS, &spec.id).await?.map(|d| d.revision);
                let service_now = tx.get(SERVICES, &spec.data.service_id).await?.map(|d| d.revision);
                if spec_now != Some(spec.revision) || service_now != service_revision {
                    return Ok(None);
                }
                let stored: Option<Entity<Slot>> = tx.get(RUNTIME_SLOTS, &id).await?.as_ref().map(parse).transpose()?;
                let state = stored.as_ref().map(|s| s.data.state()).unwrap_or(SlotState::Absent);
                let around = Around {
                    desired: step.desired.as_deref(),
                    backoff_elapsed: step.backoff_elapsed,
                    restarts: spec.data.restart == spec::Restart::OnFailure,
                    other_replacing: step.other_replacing,
                };
                if transition::decide(&state, around) != step.case {
                    return Ok(None);
                }
                let now = now_ms();
                let (written, failures, successor) = match (step.case.step(), stored) {
                    (Step::Run, previous) => {
                        let Some(work) = work else { return Ok(None) };
                        let key = work.key();
                        let (failures, attempts, revision, successor, last_cause) = match &previous {
                            Some(p) => {
                                let a = &p.data.assignment;
                                let failed_again = a.stop_cause.as_deref() == Some("failed-elapsed") && a.key == key;
                                (
                                    if failed_again { p.data.failures } else { 0 },
                                    p.data.attempts + 1,
                                    a.revision + 1,
                                    a.stop_cause.as_deref() == Some("drift"),
                                    p.data.last_cause.clone(),
                                )
                            }
                            None => (0, 1, 1, false, None),
                        };
                        let assignment_id = capstan_core::ids::new_id("asg");
                        let slot = Slot {
                            service_id: spec.data.service_id.clone(),
                            cluster_id: spec.data.cluster_id.clone(),
                            node_id: step.node_id.clone(),
                            slot: step.slot.clone(),
                            assignment_id: assignment_id.clone(),
                            assignment: Assignment {
                                key,
                                intent: Intent::Run,
                                revision,
                                work: work.clone(),
                                repository,
                                successor,
                                admitted_at: now,
                                observation: None,
                                stopped_at: None,
                                removed_at: None,
                                stop_cause: None,
                            },
                            failures,
                            attempts,
                            last_cause,
                        };
                        tx.put(RUNTIME_SLOTS, &id, previous.map(|p| p.revision), to_value(&slot)?).await?;
                        (json!({ "slot": step.slot, "case": step.case.name(), "assignmentId": assignment_id }), failures, successor)
                    }
                    (Step::Stop | Step::Remove, Some(mut slot)) => {
                        let a = &mut slot.data.assignment;
                        a.revision += 1;
                        if step.case.step() == Step::Stop {
                            a.intent = Intent::Stop;
                            a.stop_cause = Some(step.case.name().into());
                            if step.case == Case::FailedElapsed {
                                slot.data.failures += 1;
                            }
                        } else {
                            a.intent = Intent::Remove;
                        }
                        tx.replace(RUNTIME_SLOTS, &id, slot.revision, to_value(&slot.data)?).await?;
                        (
                            json!({ "slot": step.slot, "case": step.case.name(), "assignmentId": slot.data.assignment_id }),
                            slot.data.failures,
                            false,
                        )
                    }
                    (Step::Release, Some(slot)) => {
                        tx.delete(RUNTIME_SLOTS, &id, slot.revision).await?;
                        (
                            json!({ "slot": step.slot, "case": step.case.name(), "assignmentId": slot.data.assignment_id }),
                            slot.data.failures,
                            false,
                        )
                    }
                    _ => return Ok(None),
                };
                emit(&tx, "runtime.slot-changed", &spec.data.service_id, written.clone()).await?;
                // the node by the name an operator gave it
                let node = target.cluster.node(&step.node_id).map_or(step.node_id.as_str(), |(n, _)| n.data.name.as_str());
                let (kind, words) = crate::history::step_words(step.case, node, failures, successor);
                let assignment = written["assignmentId"].as_str().unwrap_or_default();
                let event = crate::history::RuntimeEvent::now(&spec.data.service_id, &step.slot, &step.node_id, assignment, kind, words);
                crate::history::record(&tx, &event).await?;
                Ok(Some(written))
            }
        })
        .await?;
    match committed {
        Some(written) => {
            tracing::info!(service = %spec.data.service_id, slot = %step.slot, case = step.case.name(), "runtime step committed");
            if matches!(step.case.step(), Step::Stop | Step::Release)
                && let Some(assignment) = written["assignmentId"].as_str()
            {
                capstan_registry::pulls::revoke(&cx.store, assignment).await?;
            }
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Write the verdict when it changed; `true` when written.
async fn write_verdict(cx: &Context, spec: &Spec, stored: Option<&Entity<Status>>, verdict: &Verdict) -> Result<bool> {
    let id = super::spec_id(&spec.service_id, &spec.cluster_id);
    if stored.is_some_and(|s| &s.data.verdict == verdict) {
        return Ok(false);
    }
    let status =
        Status { service_id: spec.service_id.clone(), cluster_id: spec.cluster_id.clone(), verdict: verdict.clone(), since: now_ms() };
    let revision = stored.map(|s| s.revision);
    cx.store
        .transact(|tx| {
            let (id, status) = (id.clone(), &status);
            async move {
                tx.put(RUNTIME_STATUS, &id, revision, to_value(status)?).await?;
                emit(
                    &tx,
                    "runtime.verdict-changed",
                    &status.service_id,
                    json!({ "clusterId": status.cluster_id, "verdict": status.verdict }),
                )
                .await
            }
        })
        .await?;
    tracing::info!(service = %spec.service_id, cluster = %spec.cluster_id, state = %verdict.state, reason = verdict.reason.as_deref().unwrap_or("-"), "runtime verdict");
    Ok(true)
}

/// A deleted (or deleting) service whose slots are all gone: its spec and verdict go, and the
/// runtime's hold on the service is released so its deletion finishes.
async fn finish_deleted(cx: &Context, spec: &Entity<Spec>) -> Result<usize> {
    let (id, service_id) = (spec.id.clone(), spec.data.service_id.clone());
    let removed = cx
        .store
        .transact(|tx| {
            let (id, service_id) = (id.clone(), service_id.clone());
            async move {
                if spec::has_slots(&tx, &service_id).await? {
                    return Ok(0);
                }
                let mut removed = 0;
                if let Some(doc) = tx.get(RUNTIME_SPECS, &id).await? {
                    tx.delete(RUNTIME_SPECS, &id, doc.revision).await?;
                    removed += 1;
                }
                if let Some(doc) = tx.get(RUNTIME_STATUS, &id).await? {
                    tx.delete(RUNTIME_STATUS, &id, doc.revision).await?;
                    removed += 1;
                }
                // the last spec of the service takes its image plan and its gates along
                if spec::of_service(&tx, &service_id).await?.iter().all(|s| s.id == id) {
                    if let Some(doc) = tx.get(RUNTIME_IMAGE_PLANS, &service_id).await? {
                        tx.delete(RUNTIME_IMAGE_PLANS, &service_id, doc.revision).await?;
                        removed += 1;
                    }
                    crate::gates::remove_service(&tx, &service_id).await?;
                }
                Ok(removed)
            }
        })
        .await?;
    let left = cx.store.transact(|tx| {
        let service_id = service_id.clone();
        async move { spec::of_service(&tx, &service_id).await }
    });
    if left.await?.is_empty() {
        tracing::info!(service = %service_id, "the runtime released a deleted service: nothing of it runs");
        capstan_inventory::services::release(&cx.store, cx.dependents.as_ref(), &service_id, super::HOLDER).await?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Placement;

    const DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const OTHER: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn entity<T: serde::de::DeserializeOwned>(id: &str, value: serde_json::Value) -> Entity<T> {
        Entity { id: id.into(), revision: 1, data: serde_json::from_value(value).unwrap() }
    }

    fn service(image: &str, state: &str) -> Entity<Service> {
        entity(
            "svc_1",
            json!({ "name": "web", "organizationId": "org_1", "image": image, "scale": 1, "state": state,
                    "ports": [{ "port": 8080, "protocol": "http", "publicPort": null }], "createdAt": 0, "updatedAt": 0 }),
        )
    }

    fn node(id: &str) -> Entity<Node> {
        entity(
            id,
            json!({ "clusterId": "cl_1", "name": id, "hostname": id, "hostnameIntent": null, "state": "active", "enrolledAt": 0, "credentialGeneration": 1 }),
        )
    }

    fn spec(placement: Placement, replicas: u32, hold: bool) -> Entity<Spec> {
        Entity { id: "svc_1@cl_1".into(), revision: 1, data: crate::testing::spec(placement, replicas, hold) }
    }

    fn every() -> Placement {
        Placement { every_node: true, nodes: None }
    }

    fn target(spec: Entity<Spec>, image: &str, slots: Vec<Slot>) -> Target {
        Target {
            spec,
            service: Some(service(&format!("reg.example/workloads/web-1@{image}"), "active")),
            cluster: Arc::new(ClusterView::new(Ok(Phase::Pallet), vec![(node("node_a"), true), (node("node_b"), true)])),
            status: None,
            slots: slots.into_iter().map(|s| Entity { id: slot_id("svc_1", &s.slot), revision: 1, data: s }).collect(),
            secrets: None,
            registry_host: "reg.example".into(),
            image_organization: Some("org_1".into()),
            image_plan: None,
            gate: None,
        }
    }

    /// A slot running `target`'s work as it would be admitted, observed as `phase`.
    fn running(t: &Target, slot: &str, phase: &str, ready: bool) -> Slot {
        let work = plan(t, 0).work.or_else(|| build_work(t, &t.service.as_ref().unwrap().data).ok()).unwrap();
        let mut running = crate::testing::running_slot("svc_1", slot, &format!("asg_{slot}"), 0, 1);
        running.node_id = slot.rsplit_once('.').unwrap().0.to_string();
        running.assignment.key = work.key();
        running.assignment.work = work;
        running.assignment.repository = Some("workloads/web-1".into());
        running.assignment.observation = Some(crate::testing::observed(phase, ready, None, 1_000));
        running
    }

    fn cases(plan: &Plan) -> Vec<(String, &'static str)> {
        plan.steps.iter().map(|s| (s.slot.clone(), s.case.name())).collect()
    }

    #[test]
    fn the_registry_repository_leaves_a_deploy_on_push_tag_out() {
        let pinned = format!("reg.example:5000/workloads/web-1@{DIGEST}");
        assert_eq!(registry_repository(&pinned, "reg.example:5000").as_deref(), Some("workloads/web-1"));
        let tagged = format!("reg.example:5000/workloads/web-1:latest@{DIGEST}");
        assert_eq!(registry_repository(&tagged, "reg.example:5000").as_deref(), Some("workloads/web-1"));
        assert_eq!(registry_repository(&format!("docker.io/library/nginx@{DIGEST}"), "reg.example:5000"), None);
    }

    #[test]
    fn every_node_places_replicas_on_each_node_and_pinned_only_on_the_pinned() {
        let t = target(spec(every(), 2, false), DIGEST, vec![]);
        let p = plan(&t, 0);
        assert_eq!(
            cases(&p),
            vec![
                ("node_a.0".into(), "admit-run-first"),
                ("node_a.1".into(), "admit-run-first"),
                ("node_b.0".into(), "admit-run-first"),
                ("node_b.1".into(), "admit-run-first")
            ]
        );
        assert_eq!(p.verdict, Verdict::new("converging", None));
        assert_eq!(p.work.unwrap().image, format!("reg.example/workloads/web-1@{DIGEST}"));
        let pinned = Placement { every_node: false, nodes: Some(vec!["node_b".into()]) };
        let p = plan(&target(spec(pinned, 1, false), DIGEST, vec![]), 0);
        assert_eq!(cases(&p), vec![("node_b.0".into(), "admit-run-first")]);
        assert_eq!(
            registry_repository(&format!("reg.example/workloads/web-1@{DIGEST}"), "reg.example").as_deref(),
            Some("workloads/web-1")
        );
        assert_eq!(registry_repository("docker.io/library/nginx@sha256:1", "reg.example"), None);
    }

    #[test]
    fn a_steady_target_decides_nothing_and_reads_converged() {
        let mut t = target(spec(every(), 1, false), DIGEST, vec![]);
        let slots = vec![running(&t, "node_a.0", "running", true), running(&t, "node_b.0", "running", true)];
        t.slots = slots.into_iter().map(|s| Entity { id: slot_id("svc_1", &s.slot), revision: 1, data: s }).collect();
        let p = plan(&t, 10_000_000);
        assert!(p.steps.is_empty(), "{:?}", p.steps);
        assert_eq!(p.verdict, Verdict::new("converged", None));
    }

    #[test]
    fn a_gated_target_waits_and_decides_nothing_keeping_what_runs() {
        let mut t = target(spec(every(), 1, false), DIGEST, vec![]);
        t.gate = Some("bindings-pending".into());
        let p = plan(&t, 0);
        assert!(p.steps.is_empty(), "nothing starts: {:?}", p.steps);
        assert_eq!(p.verdict, Verdict::new("waiting", Some("bindings-pending")));
        // a replica already running keeps running while its target reports why
        let slots = vec![running(&target(spec(every(), 1, false), DIGEST, vec![]), "node_a.0", "running", true)];
        t.slots = slots.into_iter().map(|s| Entity { id: slot_id("svc_1", &s.slot), revision: 1, data: s }).collect();
        let p = plan(&t, 10_000_000);
        assert!(p.steps.is_empty(), "nothing stops: {:?}", p.steps);
        // a refusal outranks the wait
        t.image_organization = Some("org_other".into());
        assert_eq!(plan(&t, 0).verdict, Verdict::new("refused", Some("image-repository-foreign")));
    }

    #[test]
    fn a_new_image_replaces_one_slot_at_a_time() {
        let old = target(spec(every(), 1, false), DIGEST, vec![]);
        let slots = vec![running(&old, "node_a.0", "running", true), running(&old, "node_b.0", "running", true)];
        let mut t = target(spec(every(), 1, false), OTHER, slots);
        let p = plan(&t, 0);
        assert_eq!(cases(&p), vec![("node_a.0".into(), "drift")], "only the first drifted slot stops");
        // once node_a.0 is stopped for the drift, node_b.0 keeps waiting for its successor's readiness
        t.slots[0].data.assignment.intent = Intent::Stop;
        t.slots[0].data.assignment.stop_cause = Some("drift".into());
        let p = plan(&t, 0);
        assert!(cases(&p).is_empty(), "{:?}", cases(&p));
        assert_eq!(p.verdict, Verdict::new("converging", None));
        // the successor runs and is ready (accepted at 1 000): once it has settled, the next slot drifts
        let successor = running(&t, "node_a.0", "running", true);
        t.slots[0].data = Slot { assignment: Assignment { successor: true, ..successor.assignment }, ..successor };
        assert!(plan(&t, 1_000 + crate::slots::SETTLE_MS - 1).steps.is_empty(), "ready, not settled: the next one waits");
        let p = plan(&t, 1_000 + crate::slots::SETTLE_MS);
        assert_eq!(cases(&p), vec![("node_b.0".into(), "drift")]);
        // not ready yet: the next one waits
        t.slots[0].data.assignment.observation.as_mut().unwrap().ready = false;
        assert!(plan(&t, 0).steps.is_empty());
        // both replaced and ready: the next image starts a new rollout (a slot that replaced
        // an earlier one holds nothing back once it is ready)
        let mut both = target(spec(every(), 1, false), OTHER, vec![]);
        let replaced: Vec<Slot> = ["node_a.0", "node_b.0"]
            .iter()
            .map(|name| {
                let slot = running(&both, name, "running", true);
                Slot { assignment: Assignment { successor: true, ..slot.assignment.clone() }, ..slot }
            })
            .collect();
        both.slots = replaced.into_iter().map(|s| Entity { id: slot_id("svc_1", &s.slot), revision: 1, data: s }).collect();
        assert_eq!(plan(&both, 0).verdict, Verdict::new("converged", None));
        let next = Target { service: Some(service(&format!("reg.example/workloads/web-1@{DIGEST}"), "active")), ..both };
        assert_eq!(cases(&plan(&next, 1_000 + crate::slots::SETTLE_MS)), vec![("node_a.0".into(), "drift")]);
    }

    #[test]
    fn a_hold_stops_every_slot_at_once_and_a_failure_backs_off() {
        let base = target(spec(every(), 1, false), DIGEST, vec![]);
        let slots = vec![running(&base, "node_a.0", "running", true), running(&base, "node_b.0", "exited", false)];
        let t = target(spec(every(), 1, true), DIGEST, slots.clone());
        assert_eq!(cases(&plan(&t, 0)), vec![("node_a.0".into(), "undesired"), ("node_b.0".into(), "undesired")]);
        let t = target(spec(every(), 1, false), DIGEST, slots);
        // accepted at 1 s: the backoff (10 s) runs until 11 s
        let p = plan(&t, 5_000);
        assert!(p.steps.is_empty());
        assert_eq!(p.verdict, Verdict::new("waiting", Some("failure-backoff")));
        assert_eq!(cases(&plan(&t, 11_000)), vec![("node_b.0".into(), "failed-elapsed")]);
    }

    #[test]
    fn a_held_node_stops_its_replicas_while_the_others_run() {
        let base = target(spec(every(), 1, false), DIGEST, vec![]);
        let slots = vec![running(&base, "node_a.0", "running", true), running(&base, "node_b.0", "running", true)];
        let mut held = spec(every(), 1, false);
        held.data.held_nodes = vec!["node_b".into()];
        let t = target(held.clone(), DIGEST, slots);
        assert_eq!(cases(&plan(&t, 0)), vec![("node_b.0".into(), "undesired")]);
        assert_eq!(wanted_slots(&held.data, &t.cluster).into_keys().collect::<Vec<_>>(), vec!["node_a.0".to_string()]);
        held.data.held_nodes = vec!["node_a".into(), "node_b".into()];
        assert!(wanted_slots(&held.data, &t.cluster).is_empty());
    }

    #[test]
    fn refusals_name_why_and_never_stop_what_runs() {
        let base = target(spec(every(), 1, false), DIGEST, vec![]);
        let slots = vec![running(&base, "node_a.0", "running", true)];
        let mut t = target(spec(every(), 1, false), DIGEST, slots);
        t.service = Some(service("nginx:1.25", "active"));
        let p = plan(&t, 0);
        assert!(p.steps.is_empty(), "a refused desire stops nothing: {:?}", p.steps);
        assert_eq!(p.verdict, Verdict::new("refused", Some("image-plan-missing")));
        // a tag runs the digest its plan resolved, and only a plan of that very image
        let resolved = |image: &str, digest: Option<&str>| ImagePlan {
            service_id: "svc_1".into(),
            image: image.into(),
            digest: digest.map(String::from),
            resolved_at: Some(1),
            error: digest.is_none().then(|| "unreachable".into()),
            failures: 0,
            retry_at: 0,
        };
        t.image_plan = Some(resolved("nginx:1.25", None));
        assert_eq!(plan(&t, 0).verdict, Verdict::new("refused", Some("image-plan-missing")), "a failed plan runs nothing");
        t.image_plan = Some(resolved("nginx:1.24", Some(DIGEST)));
        assert_eq!(plan(&t, 0).verdict, Verdict::new("refused", Some("image-plan-missing")), "a stale plan runs nothing");
        t.image_plan = Some(resolved("nginx:1.25", Some(DIGEST)));
        let p = plan(&t, 0);
        assert_eq!(p.work.map(|w| w.image), Some(format!("nginx@{DIGEST}")));
        assert_ne!(p.verdict.state, "refused", "{:?}", p.verdict);
        t.image_plan = None;
        // a repository of Capstan's registry that another organization's service owns, or none
        t.service = Some(service(&format!("reg.example/workloads/web-1@{DIGEST}"), "active"));
        for owner in [Some("org_2"), None] {
            t.image_organization = owner.map(str::to_string);
            let p = plan(&t, 0);
            assert!(p.steps.is_empty(), "{owner:?}: {:?}", p.steps);
            assert_eq!(p.verdict, Verdict::new("refused", Some("image-repository-foreign")), "{owner:?}");
        }
        t.image_organization = Some("org_1".into());
        // a new manifest that leaves the environment's keys as they were replaces no replica
        let pinned = |manifest: u64, version: &str| WorkSecrets {
            manifest,
            environment: "production".into(),
            keys: [("DB_PASSWORD".to_string(), PinnedSecret { secret_id: "sec_1".into(), version_id: version.into() })].into(),
            files: vec![],
        };
        t.secrets = Some(pinned(1, "ver_1"));
        let first = plan(&t, 0).work.unwrap();
        t.secrets = Some(pinned(2, "ver_1"));
        assert_eq!(plan(&t, 0).work.unwrap().key(), first.key(), "the manifest number is not part of the key");
        t.secrets = Some(pinned(3, "ver_2"));
        assert_ne!(plan(&t, 0).work.unwrap().key(), first.key(), "a rotated version is a new desire");
        t.secrets = None;
        Arc::make_mut(&mut t.cluster).phase = Err("cluster-runtime-missing".into());
        assert_eq!(plan(&t, 0).verdict, Verdict::new("refused", Some("cluster-runtime-missing")));
        let pinned = Placement { every_node: false, nodes: Some(vec!["node_gone".into()]) };
        assert_eq!(plan(&target(spec(pinned, 1, false), DIGEST, vec![]), 0).verdict, Verdict::new("refused", Some("no-eligible-node")));
    }

    #[test]
    fn an_offline_node_keeps_its_slot_and_the_target_waits_for_it() {
        let mut t = target(spec(every(), 1, false), DIGEST, vec![]);
        Arc::make_mut(&mut t.cluster).nodes[1].1 = false;
        let slots = vec![running(&t, "node_a.0", "running", true)];
        t.slots = slots.into_iter().map(|s| Entity { id: slot_id("svc_1", &s.slot), revision: 1, data: s }).collect();
        let p = plan(&t, 0);
        // the offline node's slot is still admitted (its agent runs it when it is back)
        assert_eq!(cases(&p), vec![("node_b.0".into(), "admit-run-first")]);
        assert_eq!(p.verdict, Verdict::new("waiting", Some("node-offline")));
    }

    #[test]
    fn a_deleted_service_walks_its_slots_to_release() {
        let base = target(spec(every(), 1, false), DIGEST, vec![]);
        let mut slot = running(&base, "node_a.0", "running", true);
        let mut t = target(spec(every(), 1, false), DIGEST, vec![slot.clone()]);
        t.service = Some(service(&format!("reg.example/workloads/web-1@{DIGEST}"), "deleting"));
        t.cluster = Arc::new(ClusterView::new(Ok(Phase::Pallet), vec![(node("node_a"), true)]));
        assert_eq!(cases(&plan(&t, 0)), vec![("node_a.0".into(), "undesired")]);
        slot.assignment.intent = Intent::Stop;
        slot.assignment.stopped_at = Some(1);
        t.slots[0].data = slot.clone();
        assert_eq!(cases(&plan(&t, 0)), vec![("node_a.0".into(), "remove")]);
        slot.assignment.intent = Intent::Remove;
        slot.assignment.removed_at = Some(2);
        t.slots[0].data = slot;
        assert_eq!(cases(&plan(&t, 0)), vec![("node_a.0".into(), "settled")]);
    }
}
