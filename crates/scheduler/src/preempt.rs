//! The extender's preempt verb (issue 30 item 2), the shell around
//! [`hami_scheduler_core::preemption::decide_preemption`]: reads kube-scheduler's
//! `ExtenderPreemptionArgs`, gathers each proposed node's GPUs and the pods the decision may
//! name, the PodDisruptionBudgets, and answers `NodeNameToMetaVictims`.
//!
//! - The pods holding slices come from the state
//!   ([`hami_scheduler_core::victim_facts`]); a proposed
//!   victim that holds no slice on its node is read by listing that node's pods (one
//!   request per such node, a few at a time, bounded), so plain pods cost the scheduler
//!   nothing until kube-scheduler names one. A pod still unknown is dropped, not an error.
//! - Each node's GPUs are charged, as in Filter, with the slices of pods nominated there
//!   and with the defrag reservations in force of owners other than the preemptor's.
//! - PodDisruptionBudgets come from a reflector started with the scheduler; a call waits
//!   (bounded) for its first list and otherwise fails naming why: counting violations
//!   against budgets not read would lie to kube-scheduler.
//! - Go's `ExtenderPreemptionResult` has no error field, so a call that cannot be decided
//!   is answered with an HTTP status (400 malformed, 413 too large, 503 not ready) and a
//!   JSON `error`, which kube-scheduler logs before it tries the cycle again.
//! - When every proposed node is vetoed, a Warning Event `PreemptionVetoed` on the
//!   preemptor says why per node ([`PreemptionDecision::all_vetoed_message`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::Response;
use futures::StreamExt;
use hami_plugin_core::node_lock_client::unix_now;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::json;
use tracing::{info, warn};

use crate::extender::EventNote;
use crate::runtime::Scheduler;
use crate::snapshot::NodeSnapshot;
use hami_scheduler_core::nominated::charged_snapshots;
use hami_scheduler_core::preemption::{
    HeldCandidate, NodePods, PdbFacts, PreemptionDecision, Preemptor, decide_preemption_held,
    decode_args, proposals,
};
use hami_scheduler_core::victim_facts::{node_pods, unknown_proposals, with_listed};

/// How long a call waits for the first list of PodDisruptionBudgets.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(3);

/// How long listing one node's pods may take.
const NODE_LIST_WAIT: Duration = Duration::from_secs(5);

/// Nodes whose pods are listed at once.
const NODE_LISTS_AT_ONCE: usize = 8;

/// The Event reason on a preemptor no proposed node can make room for.
pub const VETOED_REASON: &str = "PreemptionVetoed";

/// The `result` labels of `hami_scheduler_preemption_total`: `victims` (at least one node
/// kept, with victims), `vetoed` (every proposed node dropped), `no_gpu` (the preemptor
/// asks for no GPU: passed through), `error` (not decided: bad request, not ready).
pub const RESULTS: [&str; 4] = ["victims", "vetoed", "no_gpu", "error"];

/// The preempt verb's metrics, registered by [`crate::metrics::Metrics`].
#[derive(Debug, Clone)]
pub struct PreemptMetrics {
    calls: Family<Vec<(String, String)>, Counter>,
    victims: Histogram,
}

impl Default for PreemptMetrics {
    fn default() -> Self {
        let calls = Family::default();
        // Every result from the start: a dashboard's rate() sees 0, not a missing series.
        for result in RESULTS {
            let _ = calls.get_or_create(&vec![("result".to_owned(), result.to_owned())]);
        }
        Self {
            calls,
            // 1 .. 512 victims named per call.
            victims: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                1.0, 2.0, 10,
            )),
        }
    }
}

impl PreemptMetrics {
    /// Counts one call by its result (one of [`RESULTS`]); `victims` when nodes were kept.
    pub fn observe(&self, result: &str, victims: Option<usize>) {
        self.calls
            .get_or_create(&vec![("result".to_owned(), result.to_owned())])
            .inc();
        if let Some(n) = victims {
            self.victims.observe(n as f64);
        }
    }

    /// Adds both families to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "hami_scheduler_preemption",
            "Extender preempt calls, by result: victims (at least one node kept, with the pods to evict), vetoed (no proposed node can make room for the pod's GPUs; an Event on the pod says why), no_gpu (the pod asks for no GPU: kube-scheduler's proposal passed through), error (the call was not decided)",
            self.calls.clone(),
        );
        registry.register(
            "hami_scheduler_preemption_victims",
            "Pods named for eviction by one preempt call, over every node kept",
            self.victims.clone(),
        );
    }
}

struct Running {
    pdbs: Store<PodDisruptionBudget>,
    last_error: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

/// The preempt verb's watch of PodDisruptionBudgets, one per scheduler replica.
pub struct PreemptFront {
    client: Client,
    running: OnceLock<Running>,
}

impl Drop for PreemptFront {
    fn drop(&mut self) {
        if let Some(r) = self.running.get() {
            r.task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PreemptFront {
    /// Nothing runs until [`PreemptFront::start`] or the first call.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            running: OnceLock::new(),
        }
    }

    /// Starts the PodDisruptionBudget reflector (once; later calls do nothing).
    pub fn start(&self) {
        self.running();
    }

    /// A front whose reflector is started: the first preempt call finds it listed.
    pub fn started(client: Client) -> Self {
        let front = Self::new(client);
        front.start();
        front
    }

    fn running(&self) -> &Running {
        self.running.get_or_init(|| {
            let (store, writer) = reflector::store::<PodDisruptionBudget>();
            let last_error: Arc<Mutex<Option<String>>> = Arc::default();
            let errors = last_error.clone();
            let stream = reflector::reflector(
                writer,
                watcher(
                    Api::<PodDisruptionBudget>::all(self.client.clone()),
                    watcher::Config::default(),
                )
                .default_backoff(),
            );
            let task = tokio::spawn(stream.for_each(move |event| {
                crate::watch_errors::note(&errors, "PodDisruptionBudget", &event);
                async {}
            }));
            Running {
                pdbs: store,
                last_error,
                task,
            }
        })
    }

    /// Every PodDisruptionBudget now; waits (bounded) for the first list. Err says why
    /// they cannot be read.
    pub async fn pdbs(&self) -> Result<Vec<PdbFacts>, String> {
        let running = self.running();
        let ready = tokio::time::timeout(FIRST_LIST_WAIT, running.pdbs.wait_until_ready())
            .await
            .is_ok_and(|r| r.is_ok());
        if !ready {
            let why = lock(&running.last_error)
                .clone()
                .unwrap_or_else(|| format!("not listed within {}s", FIRST_LIST_WAIT.as_secs()));
            return Err(format!("cannot read PodDisruptionBudgets: {why}"));
        }
        Ok(running
            .pdbs
            .state()
            .iter()
            .map(|p| PdbFacts::from_object(p))
            .collect())
    }
}

/// A call not decided: the HTTP status and the error.
type Refused = (StatusCode, String);

/// `POST /preempt`.
pub(crate) async fn preempt(
    State(s): State<Arc<Scheduler>>,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let answered = match crate::http::body(raw) {
        Ok(bytes) => s.preempt_call(&bytes).await,
        Err(refused) => Err(refused),
    };
    match answered {
        Ok((decision, asks_for_gpus)) => {
            let result = if !asks_for_gpus {
                "no_gpu"
            } else if decision.result.node_name_to_meta_victims.is_empty() {
                "vetoed"
            } else {
                "victims"
            };
            let kept = (result == "victims").then(|| decision.victim_count());
            s.metrics.preempt.observe(result, kept);
            info!(
                nodes = decision.result.node_name_to_meta_victims.len(),
                vetoed = decision.vetoed.len(),
                unknown_pods = decision.unknown_pods.len(),
                took_ms = started.elapsed().as_millis() as u64,
                "preempt answered"
            );
            crate::http::json_response(StatusCode::OK, &decision.result)
        }
        Err((status, error)) => {
            s.metrics.preempt.observe("error", None);
            crate::http::json_response(status, &json!({ "error": error }))
        }
    }
}

impl Scheduler {
    /// Decides one preempt call from its body; with it, whether the preemptor asks for GPUs.
    async fn preempt_call(
        self: &Arc<Self>,
        bytes: &[u8],
    ) -> Result<(PreemptionDecision, bool), Refused> {
        let args = decode_args(bytes).map_err(|e| {
            let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
            (status, e.to_string())
        })?;
        let pod = args.pod.clone().ok_or_else(|| {
            (
                StatusCode::BAD_REQUEST,
                "preempt request carries no Pod".to_owned(),
            )
        })?;
        if !self.leader.is_leader() {
            return Err((StatusCode::SERVICE_UNAVAILABLE, self.not_leader()));
        }
        if let Some(problem) = self.view_problem().or_else(|| self.catching_up()) {
            return Err((StatusCode::SERVICE_UNAVAILABLE, problem));
        }
        let filter = &self.settings.filter;
        let preemptor = Preemptor::from_pod(
            &pod,
            &filter.defaults,
            filter.gpu_policy,
            filter.node_policy,
        )
        .map_err(|e| (StatusCode::BAD_REQUEST, e))?;
        let proposed = proposals(&args);
        let asks_for_gpus = preemptor.asks_for_gpus();
        let pdbs = if asks_for_gpus {
            self.preempt
                .pdbs()
                .await
                .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e))?
        } else {
            Vec::new()
        };
        // Proposed victims that hold no slice on their node: read by listing the node.
        let to_list: Vec<String> = {
            let state = self.state();
            proposed
                .iter()
                .filter(|(node, uids)| {
                    state.node(node).is_some() && !unknown_proposals(&state, node, uids).is_empty()
                })
                .map(|(node, _)| node.clone())
                .collect()
        };
        let listed = self.list_node_pods(to_list).await;
        // Under the state's lock, per proposed node: its snapshot (a few GPUs' usage) and
        // the state's list of its pods, shared (`node_pods`, kept up to date by the
        // informers' updates). No pod's facts are copied: about 1 ms at 1,000 nodes.
        let nodes: HashMap<String, (NodeSnapshot, Arc<NodePods>)> = {
            let state = self.state();
            // As in Filter, pods nominated there with a priority ≥ the preemptor's hold their
            // slices (kube-scheduler's dry run counts them too): evicting for a slice one of
            // them will take would free nothing for this pod.
            let names: Vec<String> = proposed.keys().cloned().collect();
            let mut nominated = charged_snapshots(&state, &pod, &names, filter);
            // As in Filter, others' defrag reservations in force hold their cards (issue
            // 32, D-34): evicting for room one holds frees nothing for this pod. The
            // reserving owner's pod sees its reservation free.
            let mut reserved = hami_scheduler_core::reservations::for_filter(
                &state,
                &pod,
                &names,
                |name| nominated.get(name).or_else(|| state.node(name)),
                unix_now(),
            )
            .charged;
            proposed
                .keys()
                .filter_map(|name| {
                    let snapshot = match reserved.remove(name).or_else(|| nominated.remove(name)) {
                        Some(charged) => charged,
                        None => state.node(name)?.clone(),
                    };
                    Some((name.clone(), (snapshot, node_pods(&state, name)?)))
                })
                .collect()
        };
        // Up to tens of milliseconds of CPU on a large window: off the async workers.
        let decision = tokio::task::spawn_blocking(move || {
            // The pods listed for proposed victims that hold no slice, joined to a copy of
            // their node's list (outside the lock; few nodes, if any).
            let joined: HashMap<&str, NodePods> = listed
                .iter()
                .filter_map(|(name, pods)| {
                    let (_, held) = nodes.get(name)?;
                    Some((name.as_str(), with_listed(held, pods)))
                })
                .collect();
            decide_preemption_held(
                &preemptor,
                &proposed,
                |name| {
                    let (snapshot, held) = nodes.get(name)?;
                    Some(HeldCandidate {
                        snapshot,
                        pods: joined.get(name).unwrap_or(held),
                    })
                },
                &pdbs,
            )
        })
        .await
        .map_err(|e| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the preemption decision failed: {e}"),
            )
        })?;
        for (node, uid) in &decision.unknown_pods {
            info!(node = %node, uid = %uid, "preempt: proposed victim unknown; dropped");
        }
        if let Some(message) = decision.all_vetoed_message() {
            self.publish(
                &pod,
                EventNote {
                    reason: VETOED_REASON,
                    warning: true,
                    message,
                },
            );
        }
        Ok((decision, asks_for_gpus))
    }

    /// The pods of each node in `nodes`, listed a few nodes at a time; a node whose list
    /// fails is left out (its unknown victims are dropped) with a warning.
    async fn list_node_pods(&self, nodes: Vec<String>) -> BTreeMap<String, Vec<Pod>> {
        let api: Api<Pod> = Api::all(self.client.clone());
        futures::stream::iter(nodes)
            .map(|node| {
                let api = api.clone();
                async move {
                    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
                    let listed = tokio::time::timeout(NODE_LIST_WAIT, api.list(&params)).await;
                    match listed {
                        Ok(Ok(list)) => Some((node, list.items)),
                        Ok(Err(e)) => {
                            warn!(node = %node, error = %crate::kube_error::text(&e), "preempt: cannot list the node's pods; its unknown victims are dropped");
                            None
                        }
                        Err(_) => {
                            warn!(node = %node, "preempt: listing the node's pods timed out; its unknown victims are dropped");
                            None
                        }
                    }
                }
            })
            .buffer_unordered(NODE_LISTS_AT_ONCE)
            .filter_map(|x| async move { x })
            .collect()
            .await
    }
}

/// `POST /preempt` on the extender listener: a follower forwards it to the leader, as it
/// does filter and bind.
pub(crate) async fn extender_preempt(
    State(s): State<Arc<Scheduler>>,
    axum::Extension(ctx): axum::Extension<Arc<crate::http::ForwardContext>>,
    headers: axum::http::HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Response {
    let routed = crate::http::extender_call(s.clone(), &ctx, &headers, raw, "preempt", |s, b| {
        preempt(State(s), Ok(b))
    });
    match routed.await {
        Ok(response) => response,
        Err(error) => {
            s.metrics.preempt.observe("error", None);
            crate::http::json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({ "error": error }))
        }
    }
}
