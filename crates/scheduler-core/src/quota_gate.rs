//! Where namespace quotas (issue 30, [`crate::quota`]) stop a pod: at admission, against
//! the smallest GPU of the cluster the pod could get ([`admission_refusal`]), and after
//! Filter has chosen its GPUs, against what they really cost ([`filter_within_quota`]).
//! Both read the [`QuotaBook`](crate::quota_book::QuotaBook) in [`ClusterState`]; the
//! filter gate runs under the same lock as the decision it checks.
//!
//! What a pod costs depends on the GPUs it gets (a memory percentage, an omitted memory, an
//! AMD share), so a pod over its quota on the node Filter preferred may fit it on a node
//! with smaller GPUs, or on a smaller GPU of the same node: Filter is asked again without
//! the nodes that cannot hold it within the quota and without the cards that alone cost
//! more than the quota has left, until a decision fits or no node is left.

use std::collections::BTreeMap;

use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::requests::{ContainerRequest, pod_ref, pod_requests};
use k8s_openapi::api::core::v1::Pod;

use crate::admission::WebhookConfig;
use crate::extender::{
    EventNote, ExtenderFilterResult, FilterConfig, FilterDecision, decide_filter,
};
use crate::quota::{GpuShape, QUOTA_EXCEEDED_REASON, QuotaRefusal, admission_ask};
use crate::state::ClusterState;

/// How many of Filter's choices the quota may refuse before the nodes not yet tried are
/// refused untried. A node's lower bound (its cheapest cards) rules out every node that
/// cannot hold the pod within the quota, and cards that alone cost too much are left out
/// of the choice; a choice is still refused only where several cards or containers
/// together cost too much.
pub const QUOTA_ATTEMPTS: usize = 8;

/// Filter's decision for `pod` among `names` ([`decide_filter`]) that fits the pod's
/// namespace quotas, charged. Every node refused for the quota is answered unresolvable with
/// the quota's numbers (evicting pods frees no quota kube-scheduler's preemption could count
/// on), and so, when no node is left, is every node the pod did not fit. Runs under the
/// state's lock: two pods racing for the last of a quota never both pass.
pub fn filter_within_quota(
    state: &mut ClusterState,
    pod: &Pod,
    names: &[String],
    config: &FilterConfig,
    now: i64,
) -> FilterDecision {
    let first = decide_filter(state, pod, names, config, now);
    let (node, refusal) = match charge(state, pod, &first) {
        Gate::Passed => return first,
        Gate::Unreadable(message) => return refused(names, first, message),
        Gate::Over(node, refusal) => (node, refusal),
    };
    let message = refusal.to_string();
    let mut over = BTreeMap::from([(node.clone(), message.clone())]);
    // Nodes the pod does not fit stay refused as they were: they are not asked again.
    let fails = |n: &String| {
        first.result.failed_nodes.contains_key(n)
            || first.result.failed_and_unresolvable_nodes.contains_key(n)
    };
    let asks = pod_requests(pod, &config.defaults).unwrap_or_default();
    let namespace = pod_ref(pod).namespace;
    let mut left = Vec::new();
    // What costs the same on every GPU (MiB, NVIDIA cores, slices) already over the quota:
    // no node can hold the pod, and none need be looked at.
    let anywhere = state.quota.check(&namespace, &admission_ask(&asks, &[]));
    if let Err(refusal) = anywhere {
        // One text for every node: formatting it per node was most of a refusal's cost at
        // 5,000 nodes (filter p99 over 5 ms with the quota exhausted).
        let text = refusal.to_string();
        let mut all: BTreeMap<String, String> = names
            .iter()
            .filter(|n| **n != node && !fails(n))
            .map(|n| (n.clone(), text.clone()))
            .collect();
        all.extend(over);
        return over_everywhere(first, all, message);
    }
    for name in names.iter().filter(|n| **n != node && !fails(n)) {
        match lower_bound_refusal(state, &namespace, &asks, name) {
            Some(r) => {
                over.insert(name.clone(), r.to_string());
            }
            None => left.push(name.clone()),
        }
    }
    // Filter's choice of cards on a node ignores the quota: cards that alone cost more than
    // the quota has left are taken out of the choice, and the first node, refused on one
    // of them, is tried again on the others.
    let costly = costly_cards(state, &namespace, &asks, left.iter().chain([&node]));
    let retry_pod = if costly.is_empty() {
        None
    } else {
        let cheaper = lower_bound_refusal(state, &namespace, &asks, &node).is_none();
        let on_node = cheaper
            && state.node(&node).is_some_and(|n| {
                n.devices.gpus.iter().any(|g| {
                    costly
                        .get(&g.vendor)
                        .is_some_and(|ids| ids.contains(&g.info.id))
                })
            });
        if on_node {
            over.remove(&node);
            left.insert(0, node.clone());
        }
        Some(kept_off(pod, &costly))
    };
    let asked = retry_pod.as_ref().unwrap_or(pod);
    for _ in 1..QUOTA_ATTEMPTS {
        if left.is_empty() {
            break;
        }
        let decision = decide_filter(state, asked, &left, config, now);
        if decision.patch.is_none() {
            // Only cards over the quota could take the pod on the nodes left.
            let failed = decision.result.failed_nodes.into_iter();
            for (name, why) in failed.chain(decision.result.failed_and_unresolvable_nodes) {
                over.insert(
                    name,
                    format!("no card here keeps the pod within the quota ({message}): {why}"),
                );
            }
            left.clear();
            break;
        }
        match charge(state, pod, &decision) {
            Gate::Passed => return merged(first, decision, over),
            Gate::Unreadable(m) => return refused(names, decision, m),
            Gate::Over(node, refusal) => {
                left.retain(|n| *n != node);
                over.insert(node, refusal.to_string());
            }
        }
    }
    for name in left {
        over.insert(
            name,
            format!("not tried after {QUOTA_ATTEMPTS} nodes over the quota: {message}"),
        );
    }
    over_everywhere(first, over, message)
}

/// The smallest a pod can cost on `node` (its cheapest GPUs, as admission counts on the
/// cluster's) refused by `namespace`'s quotas: no choice of GPUs there can pass.
fn lower_bound_refusal(
    state: &ClusterState,
    namespace: &str,
    asks: &[ContainerRequest],
    node: &str,
) -> Option<QuotaRefusal> {
    let shapes: Vec<GpuShape> = state
        .node(node)?
        .devices
        .gpus
        .iter()
        .map(GpuShape::of)
        .collect();
    state
        .quota
        .check(namespace, &admission_ask(asks, &shapes))
        .err()
}

/// Per vendor, the cards of `nodes` that alone cost more than `namespace`'s quotas have left
/// for every container of `asks` asking that vendor (one card of it, on that card's shape):
/// no decision within the quota uses one.
fn costly_cards<'a>(
    state: &ClusterState,
    namespace: &str,
    asks: &[ContainerRequest],
    nodes: impl Iterator<Item = &'a String>,
) -> BTreeMap<Vendor, Vec<String>> {
    let mut costly: BTreeMap<Vendor, Vec<String>> = BTreeMap::new();
    for snapshot in nodes.filter_map(|n| state.node(n)) {
        for gpu in &snapshot.devices.gpus {
            let shape = [GpuShape::of(gpu)];
            let mut wanted = asks
                .iter()
                .filter_map(|c| one_card(c, gpu.vendor))
                .peekable();
            if wanted.peek().is_none() {
                continue;
            }
            let over = wanted.all(|one| {
                let cost = admission_ask(std::slice::from_ref(&one), &shape);
                state.quota.check(namespace, &cost).is_err()
            });
            if over {
                costly
                    .entry(gpu.vendor)
                    .or_default()
                    .push(gpu.info.id.clone());
            }
        }
    }
    costly
}

/// `container`'s request for one card of `vendor`, nothing else.
fn one_card(container: &ContainerRequest, vendor: Vendor) -> Option<ContainerRequest> {
    let mut request = container.get(vendor)?.clone();
    request.count = 1;
    let (amd, nvidia) = match vendor {
        Vendor::Amd => (Some(request), None),
        Vendor::Nvidia => (None, Some(request)),
    };
    Some(ContainerRequest {
        name: container.name.clone(),
        kind: container.kind,
        amd,
        nvidia,
    })
}

/// `pod` as Filter is asked again: the `costly` cards added to its `nouse-gpuuuid` lists
/// (this copy only; nothing is written to the pod).
fn kept_off(pod: &Pod, costly: &BTreeMap<Vendor, Vec<String>>) -> Pod {
    let mut copy = pod.clone();
    let annotations = copy
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    for (vendor, ids) in costly {
        let key = vendor.names().nouse_gpuuuid;
        let mut list: Vec<String> = annotations
            .get(key)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        list.extend(ids.iter().cloned());
        annotations.insert(key.to_owned(), list.join(","));
    }
    copy
}

/// What the quota says of one decision.
enum Gate {
    /// Nothing to charge (no GPU asked, no node fits), or charged.
    Passed,
    /// The decision's own device list does not read back (the reservation is released).
    Unreadable(String),
    /// Over the quota on this node (the reservation is released).
    Over(String, QuotaRefusal),
}

/// Checks Filter's decision against the pod's namespace quotas and charges it; a decision
/// over a quota is undone (the state's reservation released).
fn charge(state: &mut ClusterState, pod: &Pod, decision: &FilterDecision) -> Gate {
    let Some(patch) = &decision.patch else {
        return Gate::Passed;
    };
    let Some(node) = patch.annotations.get(pod_keys::VGPU_NODE) else {
        return Gate::Passed;
    };
    let Some(devices) = state.node(node).map(|n| n.devices.clone()) else {
        return Gate::Passed;
    };
    let mut runs = Vec::new();
    for vendor in Vendor::ALL {
        if let Some(text) = patch.annotations.get(vendor.names().devices_allocated) {
            // Encoded by this filter a moment ago: it decodes.
            match decode_pod_devices(text) {
                Ok(r) => runs.push((vendor, r)),
                Err(e) => {
                    state.release(&patch.uid);
                    return Gate::Unreadable(format!("cannot read back the decision: {e}"));
                }
            }
        }
    }
    match state
        .quota
        .check_and_charge_decision(&patch.uid, pod, runs, &devices)
    {
        Ok(()) => Gate::Passed,
        Err(refusal) => {
            state.release(&patch.uid);
            Gate::Over(node.clone(), refusal)
        }
    }
}

/// The decision that passed on a node tried after `first`'s: the nodes `first` refused, and
/// those `over` the quota, answered with it.
fn merged(
    first: FilterDecision,
    mut decision: FilterDecision,
    over: BTreeMap<String, String>,
) -> FilterDecision {
    let result = &mut decision.result;
    // Every node asked again fitted the pod before its costly cards were left out: where it
    // no longer fits, the quota keeps it off, which no eviction cures.
    let kept_off = std::mem::take(&mut result.failed_nodes);
    result.failed_and_unresolvable_nodes.extend(kept_off);
    result.failed_nodes.extend(first.result.failed_nodes);
    result
        .failed_and_unresolvable_nodes
        .extend(first.result.failed_and_unresolvable_nodes);
    result.failed_and_unresolvable_nodes.extend(over);
    decision.refusals = first.refusals;
    decision
}

/// No node holds the pod within its quota: the nodes over it with their numbers, the others
/// with why the pod does not fit them, every one unresolvable.
fn over_everywhere(
    first: FilterDecision,
    over: BTreeMap<String, String>,
    message: String,
) -> FilterDecision {
    // `over` wins where a node is in both; it is the large map: the others go into it.
    let mut unresolvable = over;
    let failed = first.result.failed_and_unresolvable_nodes;
    for (name, why) in failed.into_iter().chain(first.result.failed_nodes) {
        unresolvable.entry(name).or_insert(why);
    }
    quota_refusal(unresolvable, first.refusals, message)
}

fn refused(names: &[String], decision: FilterDecision, message: String) -> FilterDecision {
    let nodes = names.iter().map(|n| (n.clone(), message.clone())).collect();
    quota_refusal(nodes, decision.refusals, message)
}

fn quota_refusal(
    unresolvable: BTreeMap<String, String>,
    refusals: BTreeMap<&'static str, u64>,
    message: String,
) -> FilterDecision {
    FilterDecision {
        result: ExtenderFilterResult {
            failed_and_unresolvable_nodes: unresolvable,
            ..Default::default()
        },
        patch: None,
        event: Some(EventNote {
            reason: QUOTA_EXCEEDED_REASON,
            warning: true,
            message,
        }),
        refusals,
    }
}

/// The quota refusal of a pod's CREATE review, if its namespace's quotas cannot hold it
/// even on the smallest GPU of the cluster it could be given (nothing charged; DRA-mode
/// claims sized without device shapes: the webhook uses [`crate::quota_admission::admit`]).
/// A body that is no pod CREATE passes: the codec answers it.
pub fn admission_refusal(
    body: &[u8],
    config: &WebhookConfig,
    state: &ClusterState,
) -> Option<QuotaRefusal> {
    let ask = crate::quota_admission::admission_ask_of(body, config, state, &[])?;
    state.quota.check(&ask.namespace, &ask.total).err()
}

#[cfg(test)]
#[path = "quota_gate_tests.rs"]
mod tests;
