//! Who may be moved, read from the Kubernetes objects a shell listed: per pod holding
//! slices its [`Safety`] (controller and replicas, the PodDisruptionBudget covering it,
//! gang, static, critical, age), and the planner's [`Cluster`] built from the scheduler's
//! state with them. One rule for `hami defrag plan` and the web UI's defrag preview; pure
//! (the shells list the pods and budgets).

use std::collections::{BTreeMap, HashMap};

use hami_scheduler_core::preemption::{CRITICAL_CLASSES, CRITICAL_PRIORITY, selector_matches};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::{Cluster, Owner, Pdb, PodRequest, Policy, Safety, protection};

/// Labels and annotations that make a pod a gang member (Volcano's and the
/// scheduler-plugins' coscheduling pod groups).
pub const GANG_KEYS: [&str; 3] = [
    "scheduling.k8s.io/group-name",
    "scheduling.x-k8s.io/pod-group",
    "pod-group.scheduling.sigs.k8s.io",
];

/// The controller of `pod` (its `controller: true` owner reference), if any.
pub fn controller(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// Pods per controller uid among `pods` not being deleted: they stand for the owner's
/// replicas (no extra API call, and what runs is what an eviction leaves).
pub fn replicas_by_controller(pods: &[Pod]) -> HashMap<String, u32> {
    let mut replicas: HashMap<String, u32> = HashMap::new();
    for pod in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        if let Some(o) = controller(pod) {
            *replicas.entry(o.uid.clone()).or_default() += 1;
        }
    }
    replicas
}

/// The budget of `pdbs` covering `pod` (same namespace, its selector matches the pod's
/// labels; a budget without a selector covers nothing): with several, the tightest (the
/// Eviction API refuses a pod under more than one). No status yet: it allows none.
pub fn covering_pdb(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> Option<Pdb> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    pdbs.iter()
        .filter(|b| b.metadata.namespace.as_deref().unwrap_or("default") == namespace)
        .filter(|b| {
            b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|s| selector_matches(s, labels))
        })
        .map(|b| Pdb {
            name: format!(
                "{namespace}/{}",
                b.metadata.name.as_deref().unwrap_or_default()
            ),
            disruptions_allowed: b
                .status
                .as_ref()
                .and_then(|s| u32::try_from(s.disruptions_allowed?).ok())
                .unwrap_or(0),
        })
        .min_by_key(|b| b.disruptions_allowed)
}

/// The facts of `pod` at `now` (seconds since the epoch). `replicas`: pods per controller
/// uid ([`replicas_by_controller`]); `pdbs`: every budget listed.
pub fn safety(
    pod: &Pod,
    replicas: &HashMap<String, u32>,
    pdbs: &[PodDisruptionBudget],
    now: i64,
) -> Safety {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let has = |k: &str| {
        meta.labels.as_ref().is_some_and(|l| l.contains_key(k))
            || meta.annotations.as_ref().is_some_and(|a| a.contains_key(k))
    };
    let owner = controller(pod).map(|o| Owner {
        kind: o.kind.clone(),
        name: o.name.clone(),
        replicas: replicas.get(&o.uid).copied().unwrap_or(1),
    });
    let class = spec.and_then(|s| s.priority_class_name.as_deref());
    let critical = spec.and_then(|s| s.priority).unwrap_or(0) >= CRITICAL_PRIORITY
        || class.is_some_and(|c| CRITICAL_CLASSES.contains(&c));
    let static_pod = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
        || meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Node");
    let gang_member = GANG_KEYS.iter().any(|k| has(k));
    // The API server stamps every pod; a scenario's pods carry no time: old enough.
    let age_seconds = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(meta.creation_timestamp.as_ref())
        .map_or(u64::MAX, |t| {
            u64::try_from(now - t.0.as_second()).unwrap_or(0)
        });
    Safety {
        pdb: covering_pdb(pod, pdbs),
        owner,
        gang_member,
        static_pod,
        critical,
        age_seconds,
    }
}

/// The planner's cluster: the scheduler's state of `state`, and as candidates the pods of
/// `pods` holding slices for which `request` reads what they ask (a pod whose request does
/// not read keeps its slices counted and is never moved), each with its [`safety`]. The
/// defrag reservations in force at `now` count as taken, except those held for the owner
/// of `pending`, the pod the plan makes room for ([`Cluster::count_reservations`]).
pub fn cluster_from_pods(
    state: &ClusterState,
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    now: i64,
    pending: Option<&Pod>,
    request: impl Fn(&Pod) -> Option<PodRequest>,
) -> Cluster {
    let by_uid: HashMap<&str, &Pod> = pods
        .iter()
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect();
    let replicas = replicas_by_controller(pods);
    let mut cluster = Cluster::from_state(state, |uid, _| {
        let pod = by_uid.get(uid)?;
        Some((request(pod)?, safety(pod, &replicas, pdbs, now)))
    });
    cluster.count_reservations(state, pending, now);
    cluster
}

/// The pods of `cluster` that `policy` keeps in place: `namespace/name` and why, sorted.
pub fn protected(cluster: &Cluster, policy: &Policy) -> BTreeMap<String, String> {
    cluster
        .pods
        .iter()
        .filter_map(|p| {
            let why = protection(&p.safety, policy)?;
            Some((p.shown(), why.to_string()))
        })
        .collect()
}

#[cfg(test)]
#[path = "pod_safety_tests.rs"]
mod tests;
