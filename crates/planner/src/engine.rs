//! The plan itself, pure: the live scheduler's filter decision (`decide_filter` over a
//! `ClusterState`) applied to every pod in order, once per policy pair. Nothing here is a
//! re-implementation of fitting; what the planner says is what the scheduler would do
//! when the pods arrive in this order and each is bound where filter put it.

use hami_protocol::selection::{GpuPolicy, NodePolicy};
use hami_scheduler_core::extender::{FilterConfig, decide_filter};
use hami_scheduler_core::state::ClusterState;
use hami_scheduler_core::usage::DeviceCharge;
use k8s_openapi::api::core::v1::{Node, Pod};

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
    for planned in pods {
        if stop() {
            return None;
        }
        let decision = decide_filter(&mut state, &planned.pod, &names, &config, 0);
        let uid = planned.pod.metadata.uid.as_deref().unwrap_or_default();
        let outcome = if !decision.result.error.is_empty() {
            PodOutcome::Unplaceable {
                reason: decision.result.error,
            }
        } else if decision.patch.is_some() {
            match state.holding(uid) {
                Some(holding) => PodOutcome::Placed {
                    node: holding.node.clone(),
                    charges: holding.charges.clone(),
                },
                // decide_filter reserves before it returns a patch; not reachable unless
                // the scheduler's contract changes, and then the plan must say so.
                None => PodOutcome::Unplaceable {
                    reason: "scheduler chose a node but recorded no reservation".into(),
                },
            }
        } else if decision.event.is_none() {
            PodOutcome::NoGpu
        } else {
            PodOutcome::Unplaceable {
                reason: decision.event.map(|e| e.message).unwrap_or_default(),
            }
        };
        outcomes.push(outcome);
    }
    Some(PolicyRun {
        gpu_policy,
        node_policy,
        outcomes,
        state,
    })
}
