//! The plan itself, pure: the live scheduler's filter decision (`decide_filter` over a
//! `ClusterState`) applied to every pod in order, once per policy pair. Nothing here is a
//! re-implementation of fitting; what the planner says is what the scheduler would do
//! when the pods arrive in this order and each is bound where filter put it.
//!
//! A pod that fits nowhere while lower-priority pods hold slices preempts as the cluster
//! would (`preempt`: the preempt verb's victims, kube-scheduler's choice of node); its
//! victims are evicted, it is placed on that node, and each victim is placed again once.

use hami_protocol::selection::{GpuPolicy, NodePolicy};
use hami_scheduler_core::extender::{FilterConfig, decide_filter};
use hami_scheduler_core::preemption::priority;
use hami_scheduler_core::state::ClusterState;
use hami_scheduler_core::usage::DeviceCharge;
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::preempt::{self, Eviction, Ledger, Preemption};
use crate::scenario::Workload;

/// A pod to plan and the workload it came from.
#[derive(Debug, Clone)]
pub struct PlannedPod {
    /// Index of its workload in the scenario.
    pub workload: usize,
    /// The pod, named and ready for filter.
    pub pod: Pod,
}

/// What became of one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum PodOutcome {
    /// Filter chose `node`; `charges` is what the pod holds there, read back from the
    /// cluster state.
    Placed {
        /// The node filter chose.
        node: String,
        /// What the pod holds there.
        charges: Vec<DeviceCharge>,
    },
    /// The pod asks for no GPU: the extender passes every node on, kube-scheduler decides.
    NoGpu,
    /// No node fits, or the request was refused; `reason` is the scheduler's text
    /// (the FilteringFailed event message, or the extender error).
    Unplaceable {
        /// The scheduler's text.
        reason: String,
    },
    /// Placed, then evicted by a higher-priority pod, and no node took it again.
    Evicted {
        /// The preemptor, `namespace/name`.
        by: String,
        /// The node it was evicted from.
        node: String,
        /// The scheduler's text when it was placed again.
        reason: String,
    },
}

/// One policy pair's run.
#[derive(Debug)]
pub struct PolicyRun {
    /// The GPU policy of this run.
    pub gpu_policy: GpuPolicy,
    /// The node policy of this run.
    pub node_policy: NodePolicy,
    /// Same order as the pods given.
    pub outcomes: Vec<PodOutcome>,
    /// Every preemption, in the order it happened.
    pub preemptions: Vec<Preemption>,
    /// The cluster after every pod was placed.
    pub state: ClusterState,
}

/// The pods of the workloads, in file order: `<template>-0`, `<template>-1`, ... with
/// unique uids (the scheduler keys reservations by uid).
pub fn expand_workloads(workloads: &[Workload]) -> Vec<PlannedPod> {
    let mut pods = Vec::with_capacity(workloads.iter().map(|w| w.count as usize).sum());
    for (w, workload) in workloads.iter().enumerate() {
        for n in 0..workload.count {
            let mut pod = workload.pod.clone();
            let meta = &mut pod.metadata;
            meta.name = Some(format!("{}-{n}", workload.name()));
            meta.namespace.get_or_insert_with(|| "default".to_owned());
            meta.uid = Some(format!("plan-{w}-{n}"));
            pods.push(PlannedPod { workload: w, pod });
        }
    }
    pods
}

/// Places every pod, in order, with the scheduler's filter decision under one policy
/// pair (pods' own policy annotations still win, as in the live scheduler).
pub fn run_policy(
    nodes: &[Node],
    pods: &[PlannedPod],
    gpu_policy: GpuPolicy,
    node_policy: NodePolicy,
) -> PolicyRun {
    run_policy_until(nodes, pods, gpu_policy, node_policy, &|| false)
        .unwrap_or_else(|| unreachable!("a run never asked to stop stopped"))
}

/// [`run_policy`], asking `stop` before each pod: `None` once it says stop (the web UI's
/// deadline, or its client gone), so a shared server never plans for nobody.
pub fn run_policy_until(
    nodes: &[Node],
    pods: &[PlannedPod],
    gpu_policy: GpuPolicy,
    node_policy: NodePolicy,
    stop: &dyn Fn() -> bool,
) -> Option<PolicyRun> {
    let mut state = ClusterState::new();
    for node in nodes {
        state.upsert_node(node);
    }
    let names: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let config = FilterConfig {
        gpu_policy,
        node_policy,
        ..FilterConfig::default()
    };
    let mut outcomes = Vec::with_capacity(pods.len());
    let mut preemptions = Vec::new();
    let mut ledger = Ledger::default();
    for (index, planned) in pods.iter().enumerate() {
        if stop() {
            return None;
        }
        let (outcome, candidates) = place(&mut state, &planned.pod, &names, &config);
        let outcome = match outcome {
            PodOutcome::Unplaceable { reason } => {
                match preempt::choose(&state, pods, &ledger, &planned.pod, &candidates, &config) {
                    Some(choice) => {
                        let (outcome, record) = preempt_on(
                            &mut state,
                            pods,
                            &mut ledger,
                            &mut outcomes,
                            index,
                            &choice,
                            (&names, &config),
                        );
                        preemptions.push(record);
                        outcome
                    }
                    None => PodOutcome::Unplaceable { reason },
                }
            }
            other => other,
        };
        if matches!(outcome, PodOutcome::Placed { .. }) {
            let uid = planned.pod.metadata.uid.as_deref().unwrap_or_default();
            ledger.place(uid, index, priority(&planned.pod));
        }
        outcomes.push(outcome);
    }
    Some(PolicyRun {
        gpu_policy,
        node_policy,
        outcomes,
        preemptions,
        state,
    })
}

/// One pod through the scheduler's filter decision over `names`: what became of it, and
/// the nodes it failed on that an eviction might cure (kube-scheduler's preemption
/// candidates: `failedNodes`, not `failedAndUnresolvableNodes`).
fn place(
    state: &mut ClusterState,
    pod: &Pod,
    names: &[String],
    config: &FilterConfig,
) -> (PodOutcome, Vec<String>) {
    let decision = decide_filter(state, pod, names, config, 0);
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if !decision.result.error.is_empty() {
        let reason = decision.result.error;
        return (PodOutcome::Unplaceable { reason }, Vec::new());
    }
    if decision.patch.is_some() {
        let outcome = match state.holding(uid) {
            Some(holding) => PodOutcome::Placed {
                node: holding.node.clone(),
                charges: holding.charges.clone(),
            },
            // decide_filter reserves before it returns a patch; not reachable unless
            // the scheduler's contract changes, and then the plan must say so.
            None => PodOutcome::Unplaceable {
                reason: "scheduler chose a node but recorded no reservation".into(),
            },
        };
        return (outcome, Vec::new());
    }
    let Some(event) = decision.event else {
        return (PodOutcome::NoGpu, Vec::new());
    };
    let unresolvable = &decision.result.failed_and_unresolvable_nodes;
    let candidates = decision
        .result
        .failed_nodes
        .into_keys()
        .filter(|n| !unresolvable.contains_key(n))
        .collect();
    let reason = event.message;
    (PodOutcome::Unplaceable { reason }, candidates)
}

/// `namespace/name` of a planned pod.
fn shown(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Carries out a preemption the cluster would make: `victims` (uids) evicted on `node`,
/// pod `index` placed there (kube-scheduler nominates the node and the retry takes it),
/// then each victim placed again once, highest priority first (the order of
/// kube-scheduler's queue), its outcome in `outcomes` replaced.
///
/// A victim is placed again because its controller recreates it at once, and where another
/// node has room it runs there; leaving it unplaced would report capacity lost that is not.
/// It is placed only once and without preempting in turn: a recreated pod preempting
/// lower ones would chain evictions through the whole plan, and the scheduler's queue
/// would interleave those with pods still arriving, which a plan in file order cannot
/// model honestly; a victim that finds no room is reported unplaceable after preemption.
fn preempt_on(
    state: &mut ClusterState,
    pods: &[PlannedPod],
    ledger: &mut Ledger,
    outcomes: &mut [PodOutcome],
    index: usize,
    (node, victims): &(String, Vec<String>),
    (names, config): (&[String], &FilterConfig),
) -> (PodOutcome, Preemption) {
    let pod = &pods[index].pod;
    let mut evicted: Vec<(i32, u64, usize, &str)> = Vec::new();
    for uid in victims {
        if let Some((at, seq)) = ledger.get(uid) {
            let p = priority(&pods[at].pod);
            evicted.push((p, seq, at, uid));
            ledger.evict(uid, p);
        }
        state.release(uid);
    }
    evicted.sort_by_key(|(p, seq, ..)| (std::cmp::Reverse(*p), *seq));
    let (outcome, _) = place(state, pod, std::slice::from_ref(node), config);
    // The verb decided that the pod fits there by Filter's rule; should filter disagree,
    // the plan says so rather than hide the evictions.
    let outcome = match outcome {
        PodOutcome::Unplaceable { reason } => PodOutcome::Unplaceable {
            reason: format!(
                "preempted {} pod(s) on {node}, then: {reason}",
                victims.len()
            ),
        },
        other => other,
    };
    if matches!(outcome, PodOutcome::Placed { .. }) {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        ledger.place(uid, index, priority(pod));
    }
    let by = shown(pod);
    let mut record = Preemption {
        pod: by.clone(),
        node: node.clone(),
        priority: priority(pod),
        victims: Vec::with_capacity(evicted.len()),
    };
    for (p, _, at, uid) in evicted {
        let (again, _) = place(state, &pods[at].pod, names, config);
        let replaced_on = match &again {
            PodOutcome::Placed { node, .. } => {
                ledger.place(uid, at, p);
                Some(node.clone())
            }
            _ => None,
        };
        outcomes[at] = match again {
            PodOutcome::Unplaceable { reason } => PodOutcome::Evicted {
                by: by.clone(),
                node: node.clone(),
                reason,
            },
            other => other,
        };
        record.victims.push(Eviction {
            pod: shown(&pods[at].pod),
            priority: p,
            replaced_on,
        });
    }
    (outcome, record)
}
