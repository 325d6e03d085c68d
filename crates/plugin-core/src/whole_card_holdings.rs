//! Whole-card fallback holdings on one node (issue 26 item 1), the same for both vendors
//! (pure): which cards pods HAMi did not place hold (`hami_protocol::whole_cards`), which
//! cards HAMi slices use, which pod a whole-card Allocate belongs to, and the refusals when
//! kubelet's ids name a card someone else holds.
//!
//! Why: kubelet picks ids of a pod HAMi did not place from its own bookkeeping, which knows
//! share ids, not cards; without a record, a second plain pod was handed the first one's
//! card and the scheduler placed slices on it. The plugin steers kubelet away from these
//! cards (GetPreferredAllocation's avoided keys), refuses when kubelet insists, and records
//! each hand-over on the pod so every consumer counts it.

use std::collections::{BTreeMap, BTreeSet};

use hami_protocol::device_list::decode_pod_devices;
use hami_protocol::names::{Vendor, pod as pod_keys};
use hami_protocol::node_lock::PodRef;
use hami_protocol::placement::placed_by_scheduler;
use hami_protocol::whole_cards::{self, held_cards, requested_count};
use k8s_openapi::api::core::v1::Pod;

use crate::pod_choice::{annotation, pod_ref};

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn bound_to(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// The whole-card holdings of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHoldings {
    /// Card id → the pod holding it whole.
    pub by_card: BTreeMap<String, PodRef>,
    /// Pods whose value does not decode (counted for nothing; the shell logs), and why.
    pub problems: Vec<(PodRef, String)>,
}

impl NodeHoldings {
    /// The cards held by pods other than `me` (a pod's own cards are not busy for it: an
    /// app container may be given its init container's card again).
    pub fn held_by_others(&self, me: Option<&PodRef>) -> BTreeMap<String, PodRef> {
        self.by_card
            .iter()
            .filter(|(_, p)| Some(*p) != me)
            .map(|(c, p)| (c.clone(), p.clone()))
            .collect()
    }
}

/// The counted whole-card holdings of `vendor` on `node` (`whole_cards::held_cards` over
/// the pods bound there; `scheduler_name` is the scheduler whose pods hold by device list).
pub fn node_holdings(
    pods: &[Pod],
    node: &str,
    vendor: Vendor,
    scheduler_name: &str,
) -> NodeHoldings {
    let mut out = NodeHoldings::default();
    for pod in pods {
        match held_cards(pod, vendor, scheduler_name) {
            Ok(Some(held)) if held.node == node => {
                for card in held.cards {
                    out.by_card.entry(card).or_insert_with(|| pod_ref(pod));
                }
            }
            Ok(_) => {}
            Err(e) => out.problems.push((pod_ref(pod), e.to_string())),
        }
    }
    out
}

/// Cards HAMi slices use or will use on `node`: those named in `vendor`'s device lists
/// (allocated, and runs still to allocate) of live pods bound there that the scheduler
/// placed. A whole-card hand-over must not take them.
pub fn slice_cards(
    pods: &[Pod],
    node: &str,
    vendor: Vendor,
    scheduler_name: &str,
) -> BTreeSet<String> {
    let names = vendor.names();
    let mut out = BTreeSet::new();
    for pod in pods {
        if terminal(pod) || !placed_by_scheduler(pod, scheduler_name) {
            continue;
        }
        let here = bound_to(pod, node) || annotation(pod, pod_keys::VGPU_NODE) == Some(node);
        if !here {
            continue;
        }
        for key in [names.devices_allocated, names.devices_to_allocate] {
            if let Some(runs) = annotation(pod, key).and_then(|t| decode_pod_devices(t).ok()) {
                out.extend(runs.into_iter().flatten().map(|d| d.uuid));
            }
        }
    }
    out
}

/// Which pod a whole-card Allocate of `requested` devices belongs to: kubelet names no pod,
/// so the plugin takes the oldest (creation time, then namespace/name) live pod bound to
/// `node` that the scheduler did not place, asks for at least `requested` of `vendor`'s
/// count resource, and has fewer cards recorded than it asks for. Kubelet admits one pod at
/// a time, so the pod being admitted is among them; with two such pods admitted at once
/// the record may name the other one, but every card handed over is recorded on some live
/// pod, which is what keeps it from being handed over again. No such pod: refused, so no
/// card is ever handed over unrecorded.
pub fn fallback_target(
    pods: &[Pod],
    node: &str,
    vendor: Vendor,
    scheduler_name: &str,
    requested: usize,
) -> Result<PodRef, String> {
    let key = whole_cards::key(vendor);
    let mut candidates: Vec<(String, PodRef)> = pods
        .iter()
        .filter(|p| bound_to(p, node) && !terminal(p))
        .filter(|p| !placed_by_scheduler(p, scheduler_name))
        .filter(|p| {
            let asked = requested_count(p, vendor);
            let recorded = annotation(p, key)
                .map(|t| whole_cards::decode(t).map_or(u64::MAX, |c| c.len() as u64))
                .unwrap_or(0);
            asked >= requested as u64 && recorded < asked
        })
        .map(|p| {
            let created = p
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            (created, pod_ref(p))
        })
        .collect();
    candidates.sort();
    candidates.into_iter().next().map(|(_, p)| p).ok_or_else(|| {
        format!(
            "no pod bound to node {node} that HAMi did not place asks for {requested} {resource} without its cards recorded in {key}; a whole card is never handed over unrecorded (kubelet retries the admission)",
            resource = vendor.names().resource_count,
        )
    })
}

/// Refuses a whole-card hand-over naming a card that another pod holds whole or that HAMi
/// slices use. `chosen` is each kubelet id with the card it is a share of.
pub fn check_free(
    chosen: &[(String, String)],
    held: &BTreeMap<String, PodRef>,
    slices: &BTreeSet<String>,
    vendor: Vendor,
) -> Result<(), String> {
    let cards: BTreeSet<&String> = chosen.iter().map(|(_, c)| c).collect();
    if cards.len() != chosen.len() {
        let ids: Vec<&str> = chosen.iter().map(|(i, _)| i.as_str()).collect();
        return Err(format!(
            "kubelet chose {}: {} device(s) asked, but they are shares of only {} card(s); a pod HAMi did not place gets one whole card per {}, so retry (the plugin's preferred allocation spreads over cards) or ask HAMi for slices",
            ids.join(","),
            chosen.len(),
            cards.len(),
            vendor.names().resource_count,
        ));
    }
    for (id, card) in chosen {
        if let Some(owner) = held.get(card) {
            return Err(format!(
                "kubelet chose {id}, a share of card {card}, which pod {owner} holds whole ({}); a pod HAMi did not place gets only cards nobody holds: wait for {owner} to end, or ask HAMi for a slice ({}/{})",
                whole_cards::key(vendor),
                vendor.names().resource_cores,
                vendor.names().resource_memory,
            ));
        }
        if slices.contains(card) {
            return Err(format!(
                "kubelet chose {id}, a share of card {card}, which holds slices of HAMi pods: a pod HAMi did not place gets only cards nobody holds; schedule it with HAMi ({}/{}) or free the card",
                vendor.names().resource_cores,
                vendor.names().resource_memory,
            ));
        }
    }
    Ok(())
}

/// Refuses to allocate `pod` (placed by the scheduler) when a card of its `vendor` device
/// lists is held whole on `node` by a pod HAMi did not place (the scheduler decided before
/// it saw the holding): both plugins' Allocate, before any plan.
pub fn check_pod_not_on_held_cards(
    pod: &Pod,
    pods: &[Pod],
    node: &str,
    vendor: Vendor,
    scheduler_name: &str,
) -> Result<(), String> {
    let run_cards = annotation(pod, vendor.names().devices_to_allocate)
        .and_then(|t| decode_pod_devices(t).ok())
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| d.uuid);
    check_run_not_held(
        run_cards,
        &node_holdings(pods, node, vendor, scheduler_name).held_by_others(None),
        vendor,
    )
}

/// Refuses a HAMi pod's run on a card a pod HAMi did not place holds whole (the scheduler
/// decided before it saw the holding).
pub fn check_run_not_held(
    run_cards: impl IntoIterator<Item = String>,
    held: &BTreeMap<String, PodRef>,
    vendor: Vendor,
) -> Result<(), String> {
    for card in run_cards {
        if let Some(owner) = held.get(&card) {
            return Err(format!(
                "card {card} of the scheduler's decision is held whole by pod {owner} ({}), which HAMi did not place; delete this pod so the scheduler places it again",
                whole_cards::key(vendor)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, created: &str, extra: serde_json::Value) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                "labels": {"hami.io/webhook": "ignore"}, "annotations": {}},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}});
        json_merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    const V: Vendor = Vendor::Nvidia;
    const S: &str = "hami-scheduler";

    #[test]
    fn holdings_count_live_unplaced_pods_of_this_node() {
        let pods = vec![
            pod(
                "a",
                "2026-01-01T00:00:00Z",
                json!({"metadata": {"annotations": {"hami.io/nvidia-whole-cards": "G1"}}}),
            ),
            pod(
                "done",
                "2026-01-01T00:00:00Z",
                json!({"metadata": {"annotations": {"hami.io/nvidia-whole-cards": "G2"}},
                    "status": {"phase": "Succeeded"}}),
            ),
            pod(
                "elsewhere",
                "2026-01-01T00:00:00Z",
                json!({"metadata": {"annotations": {"hami.io/nvidia-whole-cards": "G3"}},
                    "spec": {"nodeName": "n2"}}),
            ),
            pod(
                "bad",
                "2026-01-01T00:00:00Z",
                json!({"metadata": {"annotations": {"hami.io/nvidia-whole-cards": "G4,,"}}}),
            ),
        ];
        let h = node_holdings(&pods, "n1", V, S);
        assert_eq!(
            h.by_card.into_iter().collect::<Vec<_>>(),
            vec![("G1".to_owned(), PodRef::new("ns", "a"))]
        );
        assert_eq!(h.problems.len(), 1);
        assert_eq!(h.problems[0].0, PodRef::new("ns", "bad"));
        let h = node_holdings(&pods, "n1", V, S);
        assert!(h.held_by_others(Some(&PodRef::new("ns", "a"))).is_empty());
        assert_eq!(h.held_by_others(None).len(), 1);
    }

    #[test]
    fn the_oldest_unrecorded_plain_pod_is_the_target_and_none_is_refused() {
        let old = pod("old", "2026-01-01T00:00:00Z", json!({}));
        let new = pod("new", "2026-01-02T00:00:00Z", json!({}));
        let recorded = pod(
            "recorded",
            "2025-01-01T00:00:00Z",
            json!({"metadata": {"annotations": {"hami.io/nvidia-whole-cards": "G1"}}}),
        );
        let placed = pod(
            "placed",
            "2024-01-01T00:00:00Z",
            json!({"metadata": {"labels": {"hami.io/webhook": "no"}},
                "spec": {"schedulerName": "hami-scheduler"}}),
        );
        let pods = vec![new.clone(), recorded, placed, old];
        assert_eq!(
            fallback_target(&pods, "n1", V, S, 1),
            Ok(PodRef::new("ns", "old"))
        );
        // Asking for more than any pod asks for, or another node: refused, naming why.
        let e = fallback_target(&pods, "n1", V, S, 2).unwrap_err();
        assert!(
            e.contains("nvidia.com/gpu") && e.contains("unrecorded"),
            "{e}"
        );
        assert!(fallback_target(&pods, "n2", V, S, 1).is_err());
        assert_eq!(
            fallback_target(&[new], "n1", V, S, 1),
            Ok(PodRef::new("ns", "new"))
        );
    }

    #[test]
    fn held_cards_and_slices_are_refused_with_the_holder_named() {
        let held: BTreeMap<String, PodRef> = [("G1".to_owned(), PodRef::new("ns", "a"))]
            .into_iter()
            .collect();
        let slices: BTreeSet<String> = ["G2".to_owned()].into_iter().collect();
        let ask = |card: &str| vec![(format!("{card}#3"), card.to_owned())];
        let e = check_free(&ask("G1"), &held, &slices, V).unwrap_err();
        assert!(
            e.contains("G1#3") && e.contains("ns/a") && e.contains("hami.io/nvidia-whole-cards"),
            "{e}"
        );
        let e = check_free(&ask("G2"), &held, &slices, V).unwrap_err();
        assert!(e.contains("slices"), "{e}");
        assert_eq!(check_free(&ask("G3"), &held, &slices, V), Ok(()));
        let two = vec![
            ("G3#0".to_owned(), "G3".to_owned()),
            ("G3#1".to_owned(), "G3".to_owned()),
        ];
        let e = check_free(&two, &held, &slices, V).unwrap_err();
        assert!(e.contains("only 1 card"), "{e}");
        let e = check_run_not_held(["G3".to_owned(), "G1".to_owned()], &held, V).unwrap_err();
        assert!(e.contains("G1") && e.contains("ns/a"), "{e}");
        assert_eq!(check_run_not_held(["G3".to_owned()], &held, V), Ok(()));
    }

    #[test]
    fn slice_cards_are_those_of_placed_live_pods_here() {
        let slice = |name: &str, node: &str, phase: &str| {
            pod(
                name,
                "2026-01-01T00:00:00Z",
                json!({"metadata": {"labels": {"hami.io/webhook": "no"}, "annotations": {
                    "hami.io/vgpu-devices-allocated": "G5,NVIDIA-A100,1000,20:;",
                    "hami.io/vgpu-devices-to-allocate": ";"}},
                    "spec": {"schedulerName": "hami-scheduler", "nodeName": node},
                    "status": {"phase": phase}}),
            )
        };
        let forged = pod(
            "forged",
            "2026-01-01T00:00:00Z",
            json!({"metadata": {"annotations": {
                "hami.io/vgpu-devices-allocated": "G6,NVIDIA-A100,1000,20:;"}}}),
        );
        let pods = vec![
            slice("s", "n1", "Running"),
            slice("gone", "n1", "Failed"),
            slice("other", "n2", "Running"),
            forged,
        ];
        assert_eq!(
            slice_cards(&pods, "n1", V, S)
                .into_iter()
                .collect::<Vec<_>>(),
            vec!["G5".to_owned()]
        );
    }

    /// The busy rule for a whole-card hand-over, once for both vendors: slices of live pods
    /// the scheduler placed here, and the node lock's owner reserved here (vgpu-node) but
    /// not bound yet; not a forged list, not another vendor's.
    #[test]
    fn slice_cards_count_the_unbound_reserved_owner_for_both_vendors() {
        for vendor in [Vendor::Amd, Vendor::Nvidia] {
            let names = vendor.names();
            let (resource, other) = match vendor {
                Vendor::Amd => ("amd.com/gpu", Vendor::Nvidia),
                Vendor::Nvidia => ("nvidia.com/gpu", Vendor::Amd),
            };
            let placed = |name: &str, key: &str, card: &str, node: serde_json::Value| {
                pod(
                    name,
                    "2026-01-01T00:00:00Z",
                    json!({"metadata": {"labels": {"hami.io/webhook": "no"}, "annotations": {
                        key: format!("{card},X,1000,20:;"), "hami.io/vgpu-node": "n1"}},
                        "spec": {"schedulerName": S, "nodeName": node, "containers": [
                            {"name": "c", "resources": {"limits": {resource: "1"}}}]}}),
                )
            };
            let pods = vec![
                placed("running", names.devices_allocated, "C1", json!("n1")),
                placed("owner", names.devices_to_allocate, "C2", json!(null)),
                placed(
                    "other-vendor",
                    other.names().devices_to_allocate,
                    "C3",
                    json!("n1"),
                ),
                pod(
                    "forged",
                    "2026-01-01T00:00:00Z",
                    json!({"metadata": {"annotations": {
                        names.devices_allocated: "C4,X,1000,20:;"}}}),
                ),
            ];
            assert_eq!(
                slice_cards(&pods, "n1", vendor, S)
                    .into_iter()
                    .collect::<Vec<_>>(),
                vec!["C1".to_owned(), "C2".to_owned()],
                "{vendor:?}"
            );
        }
    }
}
