//! Nominated pods hold their slice (issue 30 item 2). After a preemption kube-scheduler
//! writes the preemptor's `status.nominatedNodeName` and retries the pod once its victims
//! are gone; meanwhile its own filters count the pod on that node (`addNominatedPods`:
//! each pod nominated there with a priority ≥ the filtered pod's is added to the node's
//! state for that filter run only). With every HAMi resource `ignoredByScheduler` that
//! counts none of its GPUs, so without this a lower-priority pod filtered in the window
//! takes the slice the eviction freed, and the preemptor preempts again.
//!
//! The state keeps only pods that are nominated, unbound and ask this scheduler for GPUs
//! ([`Nominations`]: few, so plain pods still cost nothing); [`charged_snapshots`] decides
//! per filter (or preempt) call which of them apply and where their slices go, on copies
//! of the node snapshots.

use std::collections::{BTreeMap, HashMap, HashSet};

use hami_protocol::placement::placed_by_scheduler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::extender::FilterConfig;
use crate::fit::fit_node;
use crate::preemption::{Preemptor, priority};
use crate::snapshot::NodeSnapshot;
use crate::state::ClusterState;
use crate::usage::collapse;

/// A pod kube-scheduler nominated to a node and has not bound yet.
#[derive(Debug, Clone)]
pub struct Nominee {
    /// `status.nominatedNodeName`.
    pub node: String,
    /// Its priority.
    pub priority: i32,
    /// The pod cut down to what Filter reads (spec, annotations): its requests are read
    /// per call, with the scheduler's request defaults, which the state does not know.
    pod: Pod,
}

/// The nominated pods, by UID.
#[derive(Debug, Clone, Default)]
pub struct Nominations {
    by_uid: HashMap<String, Nominee>,
}

/// `pod` as a nominee, if it is one: nominated, not bound (kube-scheduler drops the
/// nomination when it binds, and a placed pod is charged as its holding), not finished or
/// being deleted (it will never take the slice), and asking `scheduler_name` for GPUs.
fn nominee(pod: &Pod, scheduler_name: &str) -> Option<Nominee> {
    let status = pod.status.as_ref()?;
    let node = status
        .nominated_node_name
        .as_deref()
        .filter(|n| !n.is_empty())?;
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
    if bound
        || finished
        || pod.metadata.deletion_timestamp.is_some()
        || !placed_by_scheduler(pod, scheduler_name)
    {
        return None;
    }
    let meta = &pod.metadata;
    Some(Nominee {
        node: node.to_owned(),
        priority: priority(pod),
        pod: Pod {
            metadata: ObjectMeta {
                uid: meta.uid.clone(),
                name: meta.name.clone(),
                namespace: meta.namespace.clone(),
                annotations: meta.annotations.clone(),
                ..Default::default()
            },
            spec: pod.spec.clone(),
            status: None,
        },
    })
}

impl Nominations {
    /// Records `pod` when it is a nominee of `scheduler_name`; forgets it otherwise (bound,
    /// nomination cleared, finished, being deleted).
    pub fn upsert(&mut self, pod: &Pod, scheduler_name: &str) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        match nominee(pod, scheduler_name) {
            Some(n) => {
                self.by_uid.insert(uid.to_owned(), n);
            }
            None => {
                self.by_uid.remove(uid);
            }
        }
    }

    /// Forgets the pod (deleted).
    pub fn remove(&mut self, uid: &str) {
        self.by_uid.remove(uid);
    }

    /// The nominee with this UID, if kept.
    pub fn get(&self, uid: &str) -> Option<&Nominee> {
        self.by_uid.get(uid)
    }

    /// The UIDs kept (a relist forgets those it no longer shows).
    pub fn uids(&self) -> impl Iterator<Item = &String> {
        self.by_uid.keys()
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

/// The snapshots of the nodes of `names` on which pods nominated there hold slices for
/// `pod`'s call, with those slices charged; a node where none applies is left out (the
/// caller uses the state's own). Copies for this call only: the state is not changed.
///
/// A nominee applies when it is not `pod`, its priority is at least `pod`'s (as
/// kube-scheduler's `addNominatedPods`), and it has no filter decision yet (that one is
/// charged as its holding already). Its slice is where Filter would place it on the node
/// once the pods being deleted there are gone (the GPUs its preemption frees): so a
/// lower-priority pod cannot take the rest of a card whose victims are still terminating
/// either. Higher priorities are placed first; a nominee that would not fit even then
/// holds nothing (Filter would not place it there).
pub fn charged_snapshots(
    state: &ClusterState,
    pod: &Pod,
    names: &[String],
    config: &FilterConfig,
) -> HashMap<String, NodeSnapshot> {
    let mut out = HashMap::new();
    let nominations = state.nominations();
    if nominations.is_empty() {
        return out;
    }
    let own = pod.metadata.uid.as_deref();
    let floor = priority(pod);
    let mut by_node: BTreeMap<&str, Vec<(&String, &Nominee)>> = BTreeMap::new();
    for (uid, n) in &nominations.by_uid {
        if Some(uid.as_str()) != own && n.priority >= floor && state.holding(uid).is_none() {
            by_node.entry(n.node.as_str()).or_default().push((uid, n));
        }
    }
    for nominees in by_node.values_mut() {
        nominees.sort_by(|a, b| b.1.priority.cmp(&a.1.priority).then(a.0.cmp(b.0)));
    }
    for name in names {
        let (Some(nominees), Some(current)) = (by_node.get(name.as_str()), state.node(name)) else {
            continue;
        };
        if out.contains_key(name) {
            continue;
        }
        let mut charged = current.clone();
        let mut after = after_deletions(state, name, current);
        let mut any = false;
        for (_, n) in nominees {
            let Ok(req) = Preemptor::from_pod(
                &n.pod,
                &config.defaults,
                config.gpu_policy,
                config.node_policy,
            ) else {
                continue;
            };
            let Ok(placement) = fit_node(&after, &req.fit_request()) else {
                continue;
            };
            let kinds: Vec<_> = req.containers.iter().map(|c| c.kind).collect();
            for runs in placement.runs.values() {
                let charges = collapse(&kinds, runs);
                after.charge(&charges);
                charged.charge(&charges);
                any = true;
            }
        }
        if any {
            out.insert(name.clone(), charged);
        }
    }
    out
}

/// `current` without the slices of the pods being deleted on `node` (still charged: a
/// victim's slice frees when its containers are gone), as a nominee will find the node.
fn after_deletions(state: &ClusterState, node: &str, current: &NodeSnapshot) -> NodeSnapshot {
    let facts = state.victim_facts();
    let leaving: HashSet<&String> = state
        .holdings_on(node)
        .map(|(uid, _)| uid)
        .filter(|uid| facts.is_terminating(uid))
        .collect();
    if leaving.is_empty() {
        return current.clone();
    }
    let mut s = NodeSnapshot::idle(current.devices.clone());
    for (uid, holding) in state.holdings_on(node) {
        if !leaving.contains(uid) {
            s.charge(&holding.charges);
        }
    }
    for (_, whole) in state.whole_card_holdings() {
        if whole.node == node {
            s.hold_whole(&whole.cards);
        }
    }
    s
}

#[cfg(test)]
#[path = "nominated_tests.rs"]
mod tests;
