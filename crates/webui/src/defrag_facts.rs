//! What the defrag planner is told about the live cluster the UI watches (issue 32 item 2
//! in the What-if page): the scheduler's state built from the watched nodes and pods, and
//! per pod holding slices what it asks and the facts that decide whether it may move —
//! the rule of `hami defrag plan` (`crates/hami/src/defrag_facts.rs`), with the
//! PodDisruptionBudgets the UI listed for the request (none when it may not list them: the
//! page then says so, and the commands it shows check them). Pure.

use std::collections::{BTreeMap, HashMap};

use hami_defrag_core::{Cluster, Owner, Pdb, PodRequest, Safety};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::GpuPolicy;
use hami_scheduler_core::preemption::{CRITICAL_CLASSES, CRITICAL_PRIORITY, selector_matches};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// Labels and annotations that make a pod a gang member (Volcano's and the
/// scheduler-plugins' coscheduling pod groups), as `hami defrag plan` reads them.
const GANG_KEYS: [&str; 3] = [
    "scheduling.k8s.io/group-name",
    "scheduling.x-k8s.io/pod-group",
    "pod-group.scheduling.sigs.k8s.io",
];

fn controller(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// The budget covering `pod`: with several, the tightest (the Eviction API refuses a pod
/// under more than one).
fn pdb(pod: &Pod, labels: &BTreeMap<String, String>, pdbs: &[PodDisruptionBudget]) -> Option<Pdb> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
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

/// The facts of `pod` at `now` (unix seconds); `siblings`: pods per controller uid.
fn safety(
    pod: &Pod,
    siblings: &HashMap<String, u32>,
    pdbs: &[PodDisruptionBudget],
    now: i64,
) -> Safety {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let labels = meta.labels.clone().unwrap_or_default();
    let annotations = meta.annotations.clone().unwrap_or_default();
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
    let age_seconds = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(meta.creation_timestamp.as_ref())
        .map_or(u64::MAX, |t| {
            u64::try_from(now - t.0.as_second()).unwrap_or(0)
        });
    Safety {
        pdb: pdb(pod, &labels, pdbs),
        owner,
        gang_member,
        static_pod,
        critical,
        age_seconds,
    }
}

/// What `pod` asks, as the scheduler's filter reads it (default settings and policy).
pub(crate) fn request(pod: &Pod) -> Result<PodRequest, String> {
    PodRequest::from_pod(pod, &RequestDefaults::default(), GpuPolicy::default())
}

/// The planner's cluster from `state`, `pods` and `pdbs`: candidates are the pods holding
/// slices whose request reads as the scheduler reads it; the defrag reservations in force
/// at `now` count as taken, except those of `pending`'s owner.
pub(crate) fn cluster(
    state: &ClusterState,
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
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
        Some((request(pod).ok()?, safety(pod, &siblings, pdbs, now)))
    });
    cluster.count_reservations(state, pending, now);
    cluster
}

/// The pods holding slices the policy keeps in place: `namespace/name` and why.
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
