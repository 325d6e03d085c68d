//! What `hami defrag plan` tells the planner about the cluster (pure: the shell lists
//! nodes, pods and PodDisruptionBudgets, this decides): the scheduler's state built the way
//! `hami status` builds it, and per pod holding slices what it asks for and the facts that
//! decide whether it may be moved.

use std::collections::{BTreeMap, HashMap};

use hami_defrag_core::{Cluster, Owner, Pdb, PodRequest, Safety};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::GpuPolicy;
use hami_scheduler_core::preemption::{CRITICAL_CLASSES, CRITICAL_PRIORITY, selector_matches};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::input::InputError;

/// Labels and annotations that make a pod a gang member (Volcano's and the
/// scheduler-plugins' coscheduling pod groups).
const GANG_KEYS: [&str; 3] = [
    "scheduling.k8s.io/group-name",
    "scheduling.x-k8s.io/pod-group",
    "pod-group.scheduling.sigs.k8s.io",
];

/// The controller of `pod` (its `controller: true` owner reference), if any.
fn controller(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// The facts of `pod` at `now` (seconds since the epoch). `siblings`: pods per controller
/// uid, which stands for the owner's replicas (no extra API call, and what runs is what an
/// eviction leaves). `pdbs`: the budget covering it; with several, the tightest (the
/// Eviction API refuses a pod under more than one).
pub(crate) fn safety(
    pod: &Pod,
    siblings: &HashMap<String, u32>,
    pdbs: &[PodDisruptionBudget],
    now: i64,
) -> Safety {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let labels = meta.labels.clone().unwrap_or_default();
    let annotations = meta.annotations.clone().unwrap_or_default();
    let namespace = meta.namespace.as_deref().unwrap_or("default");
    let pdb = pdbs
        .iter()
        .filter(|b| b.metadata.namespace.as_deref().unwrap_or("default") == namespace)
        .filter(|b| {
            b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|s| selector_matches(s, &labels))
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
        .min_by_key(|b| b.disruptions_allowed);
    let owner = controller(pod).map(|o| Owner {
        kind: o.kind.clone(),
        name: o.name.clone(),
        replicas: siblings.get(&o.uid).copied().unwrap_or(1),
    });
    let class = spec.and_then(|s| s.priority_class_name.as_deref());
    let critical = spec.and_then(|s| s.priority).unwrap_or(0) >= CRITICAL_PRIORITY
        || class.is_some_and(|c| CRITICAL_CLASSES.contains(&c));
    let static_pod = annotations.contains_key("kubernetes.io/config.mirror")
        || meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Node");
    let gang_member = GANG_KEYS
        .iter()
        .any(|k| labels.contains_key(*k) || annotations.contains_key(*k));
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
        pdb,
        owner,
        gang_member,
        static_pod,
        critical,
        age_seconds,
    }
}

/// The planner's cluster: the scheduler's state of `state`, and as candidates the pods
/// holding slices that still read as the scheduler reads them (a pod whose request does
/// not parse keeps its slices counted and is never moved). The defrag reservations in
/// force at `now` (the nodes' annotations, read into `state`) count as taken, except
/// those held for the owner of `pending`, the pod the plan makes room for
/// ([`Cluster::count_reservations`]).
pub(crate) fn cluster(
    state: &ClusterState,
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    gpu_policy: GpuPolicy,
    now: i64,
    pending: Option<&Pod>,
) -> Cluster {
    let by_uid: HashMap<&str, &Pod> = pods
        .iter()
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect();
    let mut siblings: HashMap<String, u32> = HashMap::new();
    for pod in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        if let Some(o) = controller(pod) {
            *siblings.entry(o.uid.clone()).or_default() += 1;
        }
    }
    let mut cluster = Cluster::from_state(state, |uid, _| {
        let pod = by_uid.get(uid)?;
        let request = request(pod, gpu_policy).ok()?;
        Some((request, safety(pod, &siblings, pdbs, now)))
    });
    cluster.count_reservations(state, pending, now);
    cluster
}

/// What `pod` asks for, as the scheduler's filter reads it with the default request
/// settings and `gpu_policy` for a pod without its own.
pub(crate) fn request(pod: &Pod, gpu_policy: GpuPolicy) -> Result<PodRequest, InputError> {
    PodRequest::from_pod(pod, &RequestDefaults::default(), gpu_policy).map_err(InputError)
}

/// A scenario's pod of workload number `index`: controlled by the workload (kind
/// `Workload`, its template's name), unless its template names a controller itself.
pub(crate) fn owned_by_workload(
    mut pod: Pod,
    workload: &hami_planner::scenario::Workload,
    index: usize,
) -> Pod {
    if controller(&pod).is_none() {
        pod.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "hami.io/v1".into(),
            kind: "Workload".into(),
            name: workload.name().to_owned(),
            uid: format!("workload-{index}"),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
    }
    pod
}

/// The pending pod `ns/name` of `pods` and what it asks for; an unknown pod or one already
/// placed is the user's to fix (one asking no GPU, the core refuses).
pub(crate) fn pending_pod<'a>(
    wanted: &str,
    pods: &'a [Pod],
    state: &ClusterState,
    gpu_policy: GpuPolicy,
) -> Result<(&'a Pod, PodRequest), InputError> {
    let (namespace, name) = wanted.split_once('/').ok_or_else(|| {
        InputError(format!(
            "--pending-pod {wanted}: name the pod as NAMESPACE/NAME"
        ))
    })?;
    let pod = pods
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref().unwrap_or("default") == namespace
                && p.metadata.name.as_deref() == Some(name)
        })
        .ok_or_else(|| {
            InputError(format!(
                "--pending-pod {wanted}: no such pod in the cluster (kubectl get pod -n {namespace} {name})"
            ))
        })?;
    let holds = pod
        .metadata
        .uid
        .as_deref()
        .and_then(|uid| state.holdings().find(|(u, _)| u.as_str() == uid));
    if let Some((_, holding)) = holds {
        return Err(InputError(format!(
            "--pending-pod {wanted}: the pod already holds GPU slices on node {}; name a pod that waits",
            holding.node
        )));
    }
    Ok((pod, request(pod, gpu_policy)?))
}

/// The pods holding slices that the policy keeps in place, `namespace/name` and why, sorted.
pub(crate) fn protected(
    cluster: &Cluster,
    policy: &hami_defrag_core::Policy,
) -> BTreeMap<String, String> {
    cluster
        .pods
        .iter()
        .filter_map(|p| {
            let why = hami_defrag_core::protection(&p.safety, policy)?;
            Some((p.shown(), why.to_string()))
        })
        .collect()
}
