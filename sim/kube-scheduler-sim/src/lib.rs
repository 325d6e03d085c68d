//! A simulated kube-scheduler for tests and the demo: it watches pending pods that name our
//! scheduler, calls the extender's `/filter` with `nodenames` (nodeCacheCapable) and `/bind`
//! exactly as kube-scheduler's HTTP extender client does, retries unschedulable pods with
//! kube-scheduler's backoff (1 s doubling to 10 s), and records the events kube-scheduler
//! records (`Scheduled`, `FailedScheduling`). Like kube-scheduler, it runs one scheduling
//! cycle (filter) at a time and binds asynchronously.
//!
//! With [`SimKubeScheduler::with_dra`] (or [`SimKubeScheduler::dra_only`]), pods with
//! `spec.resourceClaims` take the DRA path instead of the extender (and, with no extender,
//! pods asking for an extended resource a DeviceClass maps: KEP-5004,
//! `extended_resources.rs`): the resourceclaim
//! controller's part (`claim_controller.rs`: claims from templates, freeing when pods go),
//! and the `DynamicResources` plugin's (`dra.rs` and `dra/`, the shell: informers and assume
//! cache, scheduling cycle, binding cycle; `dra_placement.rs`, the pure choice of node and
//! allocations). Their module docs name what they do not model.
//!
//! Idle, it sleeps until something can change a decision: an informer event (pods, nodes,
//! and the DRA kinds), the end of a bind or claim task, a freed claim, or the next backoff
//! expiry (with a 1 s fallback), instead of sorting every pod again every few milliseconds.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{Mutex, Notify};
use tracing::{debug, warn};

use hami_scheduler::extender::{ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult};
use hami_scheduler::extender_client::ExtenderClient;

pub mod claim_controller;
pub mod dra;
pub mod dra_placement;
pub mod extended_resources;
pub mod front;
pub mod preemption;

use dra::{Decision, DraOptions, DraState};
use preemption::{Outcome, PreemptMode};

const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The longest idle sleep without a wake-up (a change nothing announced).
const IDLE_FALLBACK: Duration = Duration::from_secs(1);

/// The simulated kube-scheduler of one scheduler name (see the module doc).
pub struct SimKubeScheduler {
    client: Client,
    scheduler_name: String,
    extender: Option<ExtenderClient>,
    dra: Option<DraOptions>,
    recorder: Recorder,
    /// Rung by the informers and the bind and claim tasks: the scheduling loop looks again.
    wake: Arc<Notify>,
    /// Which kube-scheduler's preemption runs when the extender refuses every node.
    preempt: PreemptMode,
}

/// The body of an extender `/filter` call with `nodenames` (nodeCacheCapable).
#[derive(serde::Serialize)]
struct FilterArgs<'a> {
    pod: &'a Pod,
    nodenames: &'a [String],
}

/// The schedulable nodes' names as last built, and the node-informer generation they were
/// built at.
#[derive(Default)]
struct NodeSnapshot {
    generation: u64,
    names: Arc<[String]>,
}

impl NodeSnapshot {
    /// The names of the nodes not marked unschedulable, rebuilt when the node set or a
    /// node's schedulability moved since the last build.
    fn names(&mut self, nodes: &Store<Node>, generation: &AtomicU64) -> Arc<[String]> {
        // Read before the store: an event applied after this read bumps it past `now`.
        let now = generation.load(Ordering::Acquire);
        if now != self.generation {
            self.names = nodes
                .state()
                .iter()
                .filter(|n| node_schedulable(n))
                .map(|n| n.name_any())
                .collect();
            self.generation = now;
        }
        self.names.clone()
    }
}

/// A node not marked `spec.unschedulable`.
fn node_schedulable(n: &Node) -> bool {
    !n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

#[derive(Default)]
struct Backoff {
    next_try: HashMap<String, (Instant, Duration)>,
}

impl SimKubeScheduler {
    /// Places pods whose `schedulerName` is `scheduler_name` through `extender`, recording events
    /// as `default-scheduler`.
    pub fn new(
        client: Client,
        scheduler_name: impl Into<String>,
        extender: ExtenderClient,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "default-scheduler".into(),
                instance: None,
            },
        );
        Self {
            client,
            scheduler_name: scheduler_name.into(),
            extender: Some(extender),
            dra: None,
            recorder,
            wake: Arc::default(),
            preempt: PreemptMode::Off,
        }
    }

    /// Preempts as kube-scheduler of `mode`'s version does when the extender refuses every
    /// node (`preemption`): the extender's `preemptVerb` chooses the victims.
    pub fn with_preemption(mut self, mode: PreemptMode) -> Self {
        self.preempt = mode;
        self
    }

    /// Pods with ResourceClaims take the DRA path (see the module doc); others still go
    /// through the extender.
    pub fn with_dra(mut self, options: DraOptions) -> Self {
        self.dra = Some(options);
        self
    }

    /// A scheduler with no extender: it places only pods with ResourceClaims (the DRA path)
    /// and leaves every other pod alone.
    pub fn dra_only(
        client: Client,
        scheduler_name: impl Into<String>,
        options: DraOptions,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "default-scheduler".into(),
                instance: None,
            },
        );
        Self {
            client,
            scheduler_name: scheduler_name.into(),
            extender: None,
            dra: Some(options),
            recorder,
            wake: Arc::default(),
            preempt: PreemptMode::Off,
        }
    }

    fn wants(&self, pod: &Pod) -> bool {
        let spec = pod.spec.as_ref();
        spec.and_then(|s| s.scheduler_name.as_deref()) == Some(self.scheduler_name.as_str())
            && spec
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("")
                .is_empty()
            && pod.metadata.deletion_timestamp.is_none()
            && matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                None | Some("Pending")
            )
    }

    /// Runs until the task is dropped.
    pub async fn run(self) {
        let this = Arc::new(self);
        let (nodes, node_writer) = reflector::store::<Node>();
        let node_api: Api<Node> = Api::all(this.client.clone());
        let wake = this.wake.clone();
        // Bumped after a node event the reflector applied that adds or removes a node or
        // flips its `spec.unschedulable`: the node-name list the extender is sent is rebuilt
        // only then (kube-scheduler updates its cache snapshot incrementally each cycle; it
        // does not rebuild it from every node per pod). Annotation and status writes (the
        // node lock, device registrations) leave the list as it is.
        let node_generation = Arc::new(AtomicU64::new(1));
        let bump = node_generation.clone();
        let mut schedulable_of: HashMap<String, bool> = HashMap::new();
        tokio::spawn(
            reflector::reflector(
                node_writer,
                watcher(node_api, watcher::Config::default()).default_backoff(),
            )
            .for_each(move |event| {
                let moved = match &event {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        let flag = node_schedulable(n);
                        schedulable_of.insert(n.name_any(), flag) != Some(flag)
                    }
                    Ok(watcher::Event::Delete(n)) => schedulable_of.remove(&n.name_any()).is_some(),
                    Ok(watcher::Event::Init) => {
                        schedulable_of.clear();
                        true
                    }
                    Ok(watcher::Event::InitDone) => true,
                    Err(_) => false,
                };
                if moved {
                    bump.fetch_add(1, Ordering::Release);
                }
                wake.notify_one();
                async {}
            }),
        );
        let mut snapshot = NodeSnapshot::default();
        let (pods, pod_writer) = reflector::store::<Pod>();
        let pod_api: Api<Pod> = Api::all(this.client.clone());
        let wake = this.wake.clone();
        tokio::spawn(
            reflector::reflector(
                pod_writer,
                watcher(pod_api, watcher::Config::default()).default_backoff(),
            )
            .for_each(move |_| {
                wake.notify_one();
                async {}
            }),
        );
        let _ = nodes.wait_until_ready().await;
        let _ = pods.wait_until_ready().await;
        let backoff = Arc::new(Mutex::new(Backoff::default()));
        let binding: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
        let creating: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
        let dra = match this.dra {
            Some(options) => {
                let state = Arc::new(
                    DraState::start_waking(&this.client, options, this.wake.clone()).await,
                );
                tokio::spawn(freeing(
                    this.client.clone(),
                    state.clone(),
                    pods.clone(),
                    backoff.clone(),
                    this.wake.clone(),
                ));
                Some(state)
            }
            None => None,
        };
        loop {
            let mut queue: Vec<Arc<Pod>> =
                pods.state().into_iter().filter(|p| this.wants(p)).collect();
            // Oldest first, like the scheduling queue's default ordering.
            queue.sort_by_cached_key(|p| {
                (
                    p.metadata.creation_timestamp.clone().map(|t| t.0),
                    p.name_any(),
                )
            });
            let mut worked = false;
            // Once per pass, not per pod: the DRA cycle's node set.
            let schedulable: std::collections::HashSet<String> = if dra.is_some() {
                nodes
                    .state()
                    .iter()
                    .filter(|n| {
                        !n.spec
                            .as_ref()
                            .and_then(|s| s.unschedulable)
                            .unwrap_or(false)
                    })
                    .map(|n| n.name_any())
                    .collect()
            } else {
                Default::default()
            };
            for pod in queue {
                let uid = pod.uid().unwrap_or_default();
                if binding.lock().await.contains(&uid) {
                    continue;
                }
                if let Some((at, _)) = backoff.lock().await.next_try.get(&uid)
                    && Instant::now() < *at
                {
                    continue;
                }
                // KEP-5004: a pod asking for a class-mapped extended resource takes the DRA
                // path too (with an extender, such pods without claims stay its; module doc
                // of `dra`).
                if let Some(dra) = dra.as_ref().filter(|d| {
                    dra::has_claims(&pod)
                        || (this.extender.is_none() && !dra::mapped_extended(d, &pod).is_empty())
                }) {
                    worked |= this
                        .schedule_dra(
                            &pod,
                            dra,
                            &dra::Nodes {
                                schedulable: &schedulable,
                                objects: &nodes,
                            },
                            &backoff,
                            &binding,
                            &creating,
                        )
                        .await;
                    continue;
                }
                let Some(extender) = &this.extender else {
                    continue;
                };
                worked = true;
                let names = snapshot.names(&nodes, &node_generation);
                this.schedule_one(
                    extender,
                    &pod,
                    (&names[..], &pods),
                    backoff.clone(),
                    binding.clone(),
                )
                .await;
            }
            if !worked {
                // Nothing to do until a wake-up or the next backoff expiry (a wake-up rung
                // during this pass is kept by the Notify, so none is lost).
                let now = Instant::now();
                let due = backoff
                    .lock()
                    .await
                    .next_try
                    .values()
                    .map(|(at, _)| *at)
                    .filter(|at| *at > now)
                    .min();
                let wait = due.map_or(IDLE_FALLBACK, |at| (at - now).min(IDLE_FALLBACK));
                tokio::select! {
                    () = this.wake.notified() => {}
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }

    /// One DRA pod's scheduling cycle (claims first, then placement), binding spawned.
    /// Returns false when it only waits (for the claim controller or the informer).
    async fn schedule_dra(
        self: &Arc<Self>,
        pod: &Arc<Pod>,
        dra: &Arc<DraState>,
        nodes: &dra::Nodes<'_>,
        backoff: &Arc<Mutex<Backoff>>,
        binding: &Arc<Mutex<std::collections::HashSet<String>>>,
        creating: &Arc<Mutex<std::collections::HashSet<String>>>,
    ) -> bool {
        let uid = pod.uid().unwrap_or_default();
        if !claim_controller::missing(dra, pod).is_empty() {
            if !creating.lock().await.insert(uid.clone()) {
                return false;
            }
            let (this, dra, pod, backoff, creating) = (
                self.clone(),
                dra.clone(),
                pod.clone(),
                backoff.clone(),
                creating.clone(),
            );
            tokio::spawn(async move {
                if let Err(e) = claim_controller::ensure_claims(&this.client, &dra, &pod).await {
                    this.failed(&pod, &uid, &e, &backoff).await;
                }
                creating.lock().await.remove(&uid);
                this.wake.notify_one();
            });
            return true;
        }
        let (node, claims, extended) = match dra::decide(dra, pod, nodes) {
            Decision::Waiting => return false,
            Decision::Unschedulable(message) => {
                self.failed(pod, &uid, &message, backoff).await;
                self.unschedulable_condition(pod, &message).await;
                return true;
            }
            Decision::Place {
                node,
                claims,
                extended,
            } => (node, claims, extended),
        };
        binding.lock().await.insert(uid.clone());
        let (this, dra, pod, backoff, binding) = (
            self.clone(),
            dra.clone(),
            pod.clone(),
            backoff.clone(),
            binding.clone(),
        );
        tokio::spawn(async move {
            match dra::bind(
                &this.client,
                &dra,
                &pod,
                &node,
                &claims,
                extended.as_deref(),
            )
            .await
            {
                Ok(()) => {
                    backoff.lock().await.next_try.remove(&uid);
                    let note = format!(
                        "Successfully assigned {}/{} to {node}",
                        pod.namespace().unwrap_or_default(),
                        pod.name_any()
                    );
                    this.event(&pod, EventType::Normal, "Scheduled", note).await;
                }
                Err(e) => {
                    this.failed(&pod, &uid, &e, &backoff).await;
                    binding.lock().await.remove(&uid);
                }
            }
            this.wake.notify_one();
        });
        true
    }

    /// `PodScheduled=False`, reason `Unschedulable`, as kube-scheduler writes it.
    async fn unschedulable_condition(&self, pod: &Pod, message: &str) {
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            &pod.namespace().unwrap_or_else(|| "default".into()),
        );
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now()
                .round(k8s_openapi::jiff::Unit::Second)
                .map(|t| t.to_string())
                .unwrap_or_default(),
        }]}});
        if let Err(e) = api
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await
        {
            debug!(pod = %pod.name_any(), "cannot write the PodScheduled condition: {e}");
        }
    }

    async fn schedule_one(
        self: &Arc<Self>,
        extender: &ExtenderClient,
        pod: &Arc<Pod>,
        (names, pods): (&[String], &Store<Pod>),
        backoff: Arc<Mutex<Backoff>>,
        binding: Arc<Mutex<std::collections::HashSet<String>>>,
    ) {
        let uid = pod.uid().unwrap_or_default();
        // The extender's FailedNodes: the only nodes preemption may consider.
        let mut candidates: Vec<String> = Vec::new();
        // Serialised straight from the pod and the snapshot (the same JSON body as a
        // `json!` tree of them, without building the tree first).
        let args = FilterArgs {
            pod: pod.as_ref(),
            nodenames: names,
        };
        let filtered: Result<ExtenderFilterResult, String> = extender.call("filter", &args).await;
        let node = match filtered {
            Ok(result) if !result.error.is_empty() => Err(result.error),
            Ok(result) => match result.nodenames.and_then(|n| n.into_iter().next()) {
                Some(node) => Ok(node),
                None => {
                    candidates = result.failed_nodes.keys().cloned().collect();
                    // Both maps, as kube-scheduler reports Unschedulable and
                    // UnschedulableAndUnresolvable nodes in one message.
                    let reasons: Vec<String> = result
                        .failed_nodes
                        .iter()
                        .chain(&result.failed_and_unresolvable_nodes)
                        .map(|(n, r)| format!("{n}: {r}"))
                        .collect();
                    Err(format!(
                        "0/{} nodes are available: {}",
                        names.len(),
                        reasons.join("; ")
                    ))
                }
            },
            Err(e) => Err(e),
        };
        let node = match node {
            Ok(node) => node,
            Err(mut message) => {
                if !candidates.is_empty() && self.preempt != PreemptMode::Off {
                    let outcome = preemption::post_filter(
                        &self.client,
                        extender,
                        self.preempt,
                        pod,
                        candidates,
                        pods,
                    )
                    .await;
                    message = match outcome {
                        Ok(Outcome::Nominated { node, victims }) => format!(
                            "{message}; preemption: nominated {node}, evicting {}",
                            victims.join(", ")
                        ),
                        Ok(Outcome::Nothing(why)) => format!("{message}; preemption: {why}"),
                        Err(e) => format!("{message}; preemption failed: {e}"),
                    };
                }
                self.failed(pod, &uid, &message, &backoff).await;
                return;
            }
        };
        binding.lock().await.insert(uid.clone());
        let this = self.clone();
        let pod = pod.clone();
        let extender = extender.clone();
        tokio::spawn(async move {
            let args = ExtenderBindingArgs {
                pod_name: pod.name_any(),
                pod_namespace: pod.namespace().unwrap_or_else(|| "default".into()),
                pod_uid: uid.clone(),
                node: node.clone(),
            };
            let result: Result<ExtenderBindingResult, String> = extender.call("bind", &args).await;
            let bound = matches!(&result, Ok(r) if r.error.is_empty());
            match result {
                Ok(r) if r.error.is_empty() => {
                    backoff.lock().await.next_try.remove(&uid);
                    this.event(
                        &pod,
                        EventType::Normal,
                        "Scheduled",
                        format!(
                            "Successfully assigned {}/{} to {node}",
                            args.pod_namespace, args.pod_name
                        ),
                    )
                    .await;
                }
                Ok(r) => {
                    this.failed(
                        &pod,
                        &uid,
                        &format!("binding rejected: {}", r.error),
                        &backoff,
                    )
                    .await
                }
                Err(e) => {
                    this.failed(&pod, &uid, &format!("binding rejected: {e}"), &backoff)
                        .await
                }
            }
            // A bound pod stays out of the queue until the informer shows its nodeName
            // (the main loop forgets it then); a failed one waits for its backoff.
            if !bound {
                binding.lock().await.remove(&uid);
            }
            this.wake.notify_one();
        });
    }

    async fn failed(&self, pod: &Pod, uid: &str, message: &str, backoff: &Mutex<Backoff>) {
        debug!(pod = %pod.name_any(), %message, "unschedulable");
        {
            let mut b = backoff.lock().await;
            let delay = b
                .next_try
                .get(uid)
                .map(|(_, d)| (*d * 2).min(MAX_BACKOFF))
                .unwrap_or(INITIAL_BACKOFF);
            b.next_try
                .insert(uid.to_owned(), (Instant::now() + delay, delay));
        }
        self.event(
            pod,
            EventType::Warning,
            "FailedScheduling",
            message.to_owned(),
        )
        .await;
    }

    async fn event(&self, pod: &Pod, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Scheduling".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &pod.object_ref(&())).await {
            warn!(error = %e, "cannot record event");
        }
    }
}

/// The claim controller's freeing side, every 100 ms; when it changed a claim (capacity may
/// be free), pods that waited for DRA capacity are retried at once, as kube-scheduler's
/// queueing hints move them on a claim event (`wake` rings the scheduling loop).
async fn freeing(
    client: Client,
    dra: Arc<DraState>,
    pods: Store<Pod>,
    backoff: Arc<Mutex<Backoff>>,
    wake: Arc<Notify>,
) {
    loop {
        if claim_controller::free(&client, &dra, &pods).await > 0 {
            let waiting: std::collections::HashSet<String> = pods
                .state()
                .iter()
                .filter(|p| dra::has_claims(p) || !dra::mapped_extended(&dra, p).is_empty())
                .filter_map(|p| p.uid())
                .collect();
            backoff
                .lock()
                .await
                .next_try
                .retain(|uid, _| !waiting.contains(uid));
            wake.notify_one();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
