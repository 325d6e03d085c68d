//! Defrag reservations in force (issue 32: written by `hami defrag apply` on a move's
//! target node before it evicts) are taken capacity for the planner, as for the
//! scheduler's Filter: no move targets them, a measure counts them used, a stored plan's
//! move onto them is stale; only the pending pod of the reserving owner may use them.

use std::collections::HashMap;

use hami_defrag_core::{
    Cluster, Move, Place, Plan, PodRequest, Policy, Target, apply, measure, plan,
};
use hami_protocol::requests::RequestDefaults;
use hami_protocol::selection::GpuPolicy;
use hami_scheduler_core::extender::{FilterConfig, decide_filter};
use hami_scheduler_core::state::ClusterState;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

use crate::fixtures::movable;

/// The owner (a ReplicaSet's uid) the reservation on node `b` holds its card for.
const OWNER: &str = "rs-evicted";
/// When the planner looks (unix seconds): the reservation runs from 100 to 10,000.
const NOW: i64 = 1_000;

/// A node with one MI210 (`<name>-0`), and on `b` a reservation of its whole card.
fn node(name: &str, reserved: Option<i64>) -> Node {
    let card = json!([{"id": format!("{name}-0"), "count": 10, "devmem": 65536,
        "devcore": 104, "type": "AMD Instinct MI210", "health": true}]);
    let mut annotations = json!({"hami.io/node-amd-register": card.to_string()});
    if let Some(expires_at) = reserved {
        annotations["reservation.defrag.hami.io/evicted-uid"] = json!(
            json!({"owner_uid": OWNER, "owner": "ReplicaSet/web-1", "cards": [[format!("{name}-0"), 65536, 104]],
                "reserved_at": 100, "expires_at": expires_at})
            .to_string()
        );
    }
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}})).unwrap()
}

fn pod(name: &str, mem: u64, cores: u32, owner: Option<&str>) -> Pod {
    let mut value = json!({"metadata": {"name": name, "namespace": "ns",
        "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {
            "amd.com/gpu": "1", "amd.com/gpumem": mem.to_string(),
            "amd.com/gpucores": cores.to_string()}}}]}});
    if let Some(uid) = owner {
        value["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
            "kind": "ReplicaSet", "name": "web-1", "uid": uid, "controller": true}]);
    }
    serde_json::from_value(value).unwrap()
}

/// a: quarter pod `s`; b: idle, its card reserved until `expires_at`; c: quarter pod `t`.
fn cluster(expires_at: i64, pending: Option<&Pod>) -> Cluster {
    let mut state = ClusterState::new();
    for (name, reserved) in [("a", None), ("b", Some(expires_at)), ("c", None)] {
        state.upsert_node(&node(name, reserved));
    }
    assert!(!state.reservations.is_empty());
    let mut pods = HashMap::new();
    for (name, on) in [("s", "a"), ("t", "c")] {
        let p = pod(name, 16_384, 25, None);
        let decision = decide_filter(
            &mut state,
            &p,
            &[on.to_owned()],
            &FilterConfig::default(),
            NOW,
        );
        assert!(decision.patch.is_some(), "{:?}", decision.result);
        pods.insert(p.metadata.uid.clone().unwrap(), p);
    }
    let mut cluster = Cluster::from_state(&state, |uid, _| {
        let p = pods.get(uid)?;
        let request = PodRequest::from_pod(p, &RequestDefaults::default(), GpuPolicy::default());
        Some((request.ok()?, movable()))
    });
    cluster.count_reservations(&state, pending, NOW);
    cluster
}

fn fit(p: &Pod) -> Target {
    let request =
        PodRequest::from_pod(p, &RequestDefaults::default(), GpuPolicy::default()).unwrap();
    Target::FitPod {
        pod: "ns/big".into(),
        request: Box::new(request),
    }
}

#[test]
fn a_plan_never_targets_reserved_capacity() {
    let big = pod("big", 57_344, 87, Some("rs-other"));
    let c = cluster(10_000, Some(&big));
    assert_eq!(
        measure(&c.nodes).amd.idle_cards,
        0,
        "the reserved card is taken"
    );
    let p = plan(&c, &fit(&big), &Policy::default()).unwrap();
    // Not on b (reserved): s moves from a to c, and the big pod fits a.
    assert!(p.reached, "{p:?}");
    assert_eq!(p.pod_fits_on.as_deref(), Some("a"), "{p:?}");
    assert_eq!(p.moves.len(), 1, "{p:?}");
    assert_eq!(p.moves[0].to.node, "c", "{p:?}");
    // Every card target sees it too: b is not free.
    let free = Target::FreeWholeCards {
        device_type: "MI210".into(),
        count: 1,
    };
    let p = plan(&c, &free, &Policy::default()).unwrap();
    assert!(p.moves.iter().all(|m| m.to.node != "b"), "{p:?}");
}

#[test]
fn the_reserving_owners_pending_pod_may_use_it() {
    let replacement = pod("big", 57_344, 87, Some(OWNER));
    let c = cluster(10_000, Some(&replacement));
    assert_eq!(measure(&c.nodes).amd.idle_cards, 1);
    let p = plan(&c, &fit(&replacement), &Policy::default()).unwrap();
    assert!(p.reached && p.moves.is_empty(), "{p:?}");
    assert_eq!(p.pod_fits_on.as_deref(), Some("b"));
}

#[test]
fn an_expired_reservation_holds_nothing() {
    let big = pod("big", 57_344, 87, Some("rs-other"));
    let c = cluster(NOW - 1, Some(&big));
    assert_eq!(measure(&c.nodes).amd.idle_cards, 1);
    let p = plan(&c, &fit(&big), &Policy::default()).unwrap();
    assert_eq!(p.pod_fits_on.as_deref(), Some("b"), "{p:?}");
}

#[test]
fn a_stored_move_onto_reserved_capacity_is_stale() {
    let c = cluster(10_000, None);
    let s = c.pods.iter().find(|p| p.name == "s").unwrap();
    let onto_b = Move {
        step: 0,
        pod: s.shown(),
        uid: s.uid.clone(),
        from: Place {
            node: "a".into(),
            cards: vec![hami_defrag_core::CardSlice {
                card: "a-0".into(),
                mem_mib: 16_384,
                cores: 26,
                slots: 1,
            }],
        },
        to: Place {
            node: "b".into(),
            cards: vec![hami_defrag_core::CardSlice {
                card: "b-0".into(),
                mem_mib: 16_384,
                cores: 26,
                slots: 1,
            }],
        },
        why: String::new(),
        pdb: String::new(),
        gain: String::new(),
        shortfall_after: 0,
    };
    let stored = Plan {
        target: String::new(),
        shortfall_before: 1,
        shortfall_after: 0,
        reached: true,
        moves: vec![onto_b],
        pod_fits_on: None,
        blocked: Vec::new(),
        blockers_left_out: 0,
    };
    let (_, skipped) = apply(&c, &stored);
    assert_eq!(
        skipped.len(),
        1,
        "the move onto the reserved card was applied"
    );
    assert!(skipped[0].reason.contains("no longer fits"), "{skipped:?}");
    // Once the reservation expired, the same move applies.
    let (_, skipped) = apply(&cluster(NOW - 1, None), &stored);
    assert!(skipped.is_empty(), "{skipped:?}");
}
